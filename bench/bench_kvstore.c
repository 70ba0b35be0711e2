/*
 * bench/bench_kvstore.c — the key-value store's GET from NVMe (tiers/kvstore.h)
 * against the device's own read bandwidth, measured in the same run.
 *
 *   bench_kvstore DIR [--size MiB] [--values N] [--threads T] [--rounds R]
 *
 * Writes N values of SIZE MiB into a store in DIR (its NVMe file sized to
 * hold them), closes it, and per round: reopens it (RAM empty) and times T
 * threads GETting every value (each read from NVMe, verified); then times
 * plain O_DIRECT preads of the same number of bytes of the store's file in 4
 * MiB requests, T threads, queue depth 1 each (what `dd iflag=direct bs=4M`
 * does per thread). Prints one JSON line per round and the median ratio.
 * DIR is deleted at the end.
 */
#define _GNU_SOURCE
#include "kvstore.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
	kvt_kvs *s;
	const char *path;
	int id, n_threads, n_values;
	size_t size;
	uint64_t bytes;
	int bad;
} job;

static void *get_main(void *a)
{
	job *j = a;
	for (int i = j->id; i < j->n_values; i += j->n_threads) {
		char k[32];
		snprintf(k, sizeof(k), "v%d", i);
		kvt_kvs_val *v = NULL;
		if (kvt_kvs_get(j->s, "bench", k, strlen(k), &v) != KVT_OK || v->len != j->size || v->data[7] != (uint8_t)i)
			j->bad++;
		else
			j->bytes += v->len;
		kvt_kvs_val_unref(v);
	}
	return NULL;
}

static void *dev_main(void *a)
{
	job *j = a;
	int fd = open(j->path, O_RDONLY | O_DIRECT);
	void *buf = NULL;
	if (fd < 0 || posix_memalign(&buf, 4096, 4u << 20)) {
		j->bad++;
		return NULL;
	}
	uint64_t total = (uint64_t)j->n_values * j->size, per = 4u << 20;
	for (uint64_t off = (uint64_t)j->id * per; off < total; off += per * (uint64_t)j->n_threads) {
		ssize_t r = pread(fd, buf, per, (off_t)(off + 8192));
		if (r <= 0)
			break;
		j->bytes += (uint64_t)r;
	}
	free(buf);
	close(fd);
	return NULL;
}

static double run(void *(*fn)(void *), job *proto, int n, uint64_t *bytes, int *bad)
{
	pthread_t th[64];
	job j[64];
	double t0 = now();
	for (int i = 0; i < n; i++) {
		j[i] = *proto;
		j[i].id = i;
		pthread_create(&th[i], NULL, fn, &j[i]);
	}
	*bytes = 0;
	*bad = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		*bytes += j[i].bytes;
		*bad += j[i].bad;
	}
	return now() - t0;
}

static kvt_kvs *open_store(const char *dir, uint64_t nvme)
{
	kvt_kvs_config c;
	kvt_kvs_config_default(&c);
	c.dir = dir;
	c.ram_bytes = 64u << 20;
	c.nvme_bytes = nvme;
	kvt_kvs *s = NULL;
	if (kvt_kvs_open(&c, &s)) {
		fprintf(stderr, "bench_kvstore: cannot open the store in %s\n", dir);
		exit(1);
	}
	return s;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: bench_kvstore DIR [--size MiB] [--values N] [--threads T] [--rounds R]\n");
		return 2;
	}
	const char *dir = argv[1];
	size_t size_mib = 16;
	int n_values = 32, n_threads = 4, rounds = 3;
	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--size"))
			size_mib = (size_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--values"))
			n_values = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads"))
			n_threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--rounds"))
			rounds = atoi(argv[i + 1]);
	}
	if (n_threads < 1 || n_threads > 64 || n_values < 1 || size_mib < 1 || rounds < 1)
		return 2;
	size_t size = size_mib << 20;
	uint64_t nvme = (uint64_t)n_values * (size + (size >> 6) + (1u << 20)) + (64u << 20);
	kvt_log_set_level(KVT_LOG_WARN);
	kvt_kvs *s = open_store(dir, nvme);
	for (int i = 0; i < n_values; i++) {
		kvt_kvs_val *v = kvt_kvs_val_new(size);
		memset(v->data, i, size);
		v->len = size;
		char k[32];
		snprintf(k, sizeof(k), "v%d", i);
		kvt_kvs_ticket t;
		kvt_kvs_set(s, "bench", k, strlen(k), v, 0, &t);
		kvt_kvs_wait(s, t);
	}
	kvt_kvs_close(s);
	char path[4200];
	snprintf(path, sizeof(path), "%s/store.t2", dir);
	double ratio[64];
	for (int r = 0; r < rounds && r < 64; r++) {
		s = open_store(dir, nvme);
		job p = { .s = s, .path = path, .n_threads = n_threads, .n_values = n_values, .size = size };
		uint64_t gb, db;
		int gbad, dbad;
		double tg = run(get_main, &p, n_threads, &gb, &gbad);
		kvt_kvs_close(s);
		double td = run(dev_main, &p, n_threads, &db, &dbad);
		ratio[r] = (gb / tg) / (db / td);
		printf("{\"round\": %d, \"get_MBps\": %.0f, \"device_MBps\": %.0f, \"ratio\": %.3f, \"bad\": %d}\n", r,
		       gb / tg / 1e6, db / td / 1e6, ratio[r], gbad + dbad);
	}
	qsort(ratio, (size_t)(rounds < 64 ? rounds : 64), sizeof(double), cmp_d);
	printf("{\"bench\": \"kvstore_nvme_get\", \"size_mib\": %zu, \"values\": %d, \"threads\": %d, \"median_ratio\": %.3f}\n",
	       size_mib, n_values, n_threads, ratio[rounds / 2]);
	char cmd[4300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) ? 1 : 0;
}
