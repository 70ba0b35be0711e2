/*
 * tests/test_kvstore.c — the key-value store behind the Redis-protocol
 * listener (tiers/kvstore.h), on real files: a real T2 file under io_uring (or
 * its thread pool), a real SQLite index.
 *
 * Cases: RAM-only set/get/exists/del and namespaces apart; expiry; values of
 * 1 byte to 9 MiB (chunk edges) back whole after close and reopen; RAM copies
 * leaving RAM and coming back from NVMe; a full NVMe file evicting the least
 * recently used values while every SET is taken, and the EXISTS lease keeping
 * one; a flipped byte on disk served as a miss, never as wrong bytes; not
 * durable mode persisted at close; a kill -9 of a writing child, after which
 * every acknowledged value is back whole; threads at once (for TSan).
 */
#include "check.h"
#include "kvstore.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 12345u;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)(x >> 16);
	}
}

static kvt_kvs_val *val_of(size_t n, uint32_t seed)
{
	kvt_kvs_val *v = kvt_kvs_val_new(n);
	fill(v->data, n, seed);
	v->len = n;
	return v;
}

/* Whether (ns, key) holds exactly the n bytes fill(seed) makes. */
static bool holds(kvt_kvs *s, const char *ns, const char *key, size_t n, uint32_t seed)
{
	kvt_kvs_val *v = NULL;
	if (kvt_kvs_get(s, ns, key, strlen(key), &v) != KVT_OK)
		return false;
	uint8_t *want = malloc(n ? n : 1);
	fill(want, n, seed);
	bool ok = v->len == n && !memcmp(v->data, want, n);
	free(want);
	kvt_kvs_val_unref(v);
	return ok;
}

static int set_wait(kvt_kvs *s, const char *ns, const char *key, size_t n, uint32_t seed, uint64_t ttl_ms)
{
	kvt_kvs_ticket t;
	int rc = kvt_kvs_set(s, ns, key, strlen(key), val_of(n, seed), ttl_ms, &t);
	return rc ? rc : kvt_kvs_wait(s, t);
}

static kvt_kvs *open_store(uint64_t ram, uint64_t nvme, bool durable)
{
	kvt_kvs_config c;
	kvt_kvs_config_default(&c);
	c.dir = dir;
	c.ram_bytes = ram;
	c.nvme_bytes = nvme;
	c.durable = durable;
	c.exists_lease_s = 30;
	kvt_kvs *s = NULL;
	int rc = kvt_kvs_open(&c, &s);
	CHECKF(rc == KVT_OK, "open: %s", kvt_strerror(rc));
	return s;
}

static void wipe(void)
{
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
}

static void test_ram_only(void)
{
	kvt_kvs *s = open_store(8u << 20, 0, true);
	CHECK_EQ_INT(set_wait(s, "a", "k", 100, 1, 0), KVT_OK);
	CHECK_EQ_INT(set_wait(s, "b", "k", 200, 2, 0), KVT_OK);
	CHECK(holds(s, "a", "k", 100, 1));
	CHECK(holds(s, "b", "k", 200, 2));
	CHECK_EQ_INT(kvt_kvs_exists(s, "a", "k", 1), 1);
	CHECK_EQ_INT(kvt_kvs_exists(s, "c", "k", 1), 0);
	CHECK_EQ_INT(kvt_kvs_del(s, "a", "k", 1, NULL), 1);
	CHECK_EQ_INT(kvt_kvs_del(s, "a", "k", 1, NULL), 0);
	CHECK(!holds(s, "a", "k", 100, 1));
	CHECK(holds(s, "b", "k", 200, 2));
	/* overwrite, empty value, bad arguments */
	CHECK_EQ_INT(set_wait(s, "b", "k", 0, 3, 0), KVT_OK);
	CHECK(holds(s, "b", "k", 0, 3));
	CHECK_EQ_INT(kvt_kvs_set(s, "", "k", 1, val_of(1, 1), 0, NULL), KVT_EINVAL);
	CHECK_EQ_INT(kvt_kvs_set(s, "a", "", 0, val_of(1, 1), 0, NULL), KVT_EINVAL);
	/* expiry */
	CHECK_EQ_INT(set_wait(s, "a", "ttl", 10, 4, 50), KVT_OK);
	CHECK(holds(s, "a", "ttl", 10, 4));
	usleep(120 * 1000);
	CHECK(!holds(s, "a", "ttl", 10, 4));
	/* RAM only: past the budget the least recently used go */
	for (int i = 0; i < 12; i++) {
		char k[32];
		snprintf(k, sizeof(k), "big%d", i);
		CHECK_EQ_INT(set_wait(s, "a", k, 1u << 20, (uint32_t)i, 0), KVT_OK);
	}
	CHECK(!holds(s, "a", "big0", 1u << 20, 0));
	CHECK(holds(s, "a", "big11", 1u << 20, 11));
	kvt_kvs_stats st;
	kvt_kvs_stats_get(s, &st);
	CHECK(st.total.evicted >= 4);
	CHECK(st.total.ram_bytes <= 8u << 20);
	CHECK_EQ_INT(st.n_tenants, 2);
	kvt_kvs_close(s);
	wipe();
}

/* KVT_KVS_MAX_TENANTS namespaces each keep their own "k"; a SET in one more is refused, nothing shared. */
static void test_namespaces(void)
{
	kvt_kvs *s = open_store(8u << 20, 0, true);
	char ns[32];
	for (uint32_t i = 0; i < KVT_KVS_MAX_TENANTS; i++) {
		snprintf(ns, sizeof(ns), "tenant%u", i);
		CHECK_EQ_INT(set_wait(s, ns, "k", 64 + i, i, 0), KVT_OK);
	}
	CHECK_EQ_INT(set_wait(s, "one-more", "k", 10, 99, 0), KVT_EFULL);
	CHECK(!holds(s, "one-more", "k", 10, 99));
	CHECK_EQ_INT(kvt_kvs_exists(s, "one-more", "k", 1), 0);
	for (uint32_t i = 0; i < KVT_KVS_MAX_TENANTS; i++) {
		snprintf(ns, sizeof(ns), "tenant%u", i);
		CHECKF(holds(s, ns, "k", 64 + i, i), "namespace %s keeps its own value", ns);
	}
	kvt_kvs_stats st;
	kvt_kvs_stats_get(s, &st);
	CHECK_EQ_INT(st.n_tenants, KVT_KVS_MAX_TENANTS);
	kvt_kvs_close(s);
	wipe();
}

static const size_t sizes[] = { 1, 4095, 4096, (4u << 20) - 1, 4u << 20, (4u << 20) + 1, 9u << 20 };
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

static uint64_t extents_of(uint64_t len)
{
	uint64_t n = 0;
	for (uint64_t off = 0; off < len; off += KVT_KVS_CHUNK_BYTES) {
		uint64_t c = len - off < KVT_KVS_CHUNK_BYTES ? len - off : KVT_KVS_CHUNK_BYTES;
		n += (1280 + c + 4095) / 4096 * 4096;
	}
	return n;
}

static void test_reopen(void)
{
	kvt_kvs *s = open_store(64u << 20, 128u << 20, true);
	for (size_t i = 0; i < N_SIZES; i++) {
		char k[32];
		snprintf(k, sizeof(k), "v%zu", i);
		CHECK_EQ_INT(set_wait(s, "t", k, sizes[i], (uint32_t)i, 0), KVT_OK);
	}
	CHECK_EQ_INT(set_wait(s, "t", "v0", 77, 99, 0), KVT_OK); /* replaced: the old extents freed */
	CHECK_EQ_INT(set_wait(s, "t", "gone", 5000, 5, 0), KVT_OK);
	kvt_kvs_ticket t;
	CHECK_EQ_INT(kvt_kvs_del(s, "t", "gone", 4, &t), 1);
	CHECK_EQ_INT(kvt_kvs_wait(s, t), KVT_OK);
	kvt_kvs_stats st;
	kvt_kvs_close(s);
	uint64_t used = extents_of(77); /* what the rows name: nothing leaked, nothing freed twice */
	for (size_t i = 1; i < N_SIZES; i++)
		used += extents_of(sizes[i]);

	s = open_store(64u << 20, 128u << 20, true);
	kvt_kvs_stats_get(s, &st);
	CHECK_EQ_INT(st.recovered, N_SIZES);
	CHECK_EQ_INT(st.nvme_used, used);
	CHECK_EQ_INT(st.total.ram_bytes, 0);
	CHECK(holds(s, "t", "v0", 77, 99));
	for (size_t i = 1; i < N_SIZES; i++) {
		char k[32];
		snprintf(k, sizeof(k), "v%zu", i);
		CHECKF(holds(s, "t", k, sizes[i], (uint32_t)i), "value %zu (%zu bytes)", i, sizes[i]);
	}
	CHECK(!holds(s, "t", "gone", 5000, 5));
	kvt_kvs_stats_get(s, &st);
	CHECK_EQ_INT(st.total.hits_nvme, N_SIZES);
	CHECK(holds(s, "t", "v1", sizes[1], 1)); /* now from RAM */
	kvt_kvs_stats_get(s, &st);
	CHECK_EQ_INT(st.total.hits_ram, 1);
	kvt_kvs_close(s);
	wipe();
}

static void test_evict(void)
{
	kvt_kvs *s = open_store(4u << 20, 64u << 20, true);
	CHECK_EQ_INT(set_wait(s, "t", "leased", 2u << 20, 1000, 0), KVT_OK);
	CHECK_EQ_INT(kvt_kvs_exists(s, "t", "leased", 6), 1);
	int n = 96; /* 3x the file in 2 MiB values */
	for (int i = 0; i < n; i++) {
		char k[32];
		snprintf(k, sizeof(k), "e%d", i);
		CHECK_EQ_INT(set_wait(s, "t", k, 2u << 20, (uint32_t)i, 0), KVT_OK);
	}
	CHECK(!holds(s, "t", "e0", 2u << 20, 0));
	CHECK(holds(s, "t", "e95", 2u << 20, 95));
	CHECK(holds(s, "t", "e94", 2u << 20, 94));
	CHECK(holds(s, "t", "leased", 2u << 20, 1000));
	kvt_kvs_stats st;
	kvt_kvs_stats_get(s, &st);
	CHECKF(st.total.evicted >= 60, "evicted %llu", (unsigned long long)st.total.evicted);
	CHECK(st.nvme_used <= st.nvme_capacity);
	CHECK(st.total.evicted_ram > 0);
	uint64_t keys = st.total.keys;
	kvt_kvs_close(s);
	s = open_store(4u << 20, 64u << 20, true);
	kvt_kvs_stats_get(s, &st);
	CHECK_EQ_INT(st.total.keys, keys);
	int back = 0;
	for (int i = 0; i < n; i++) {
		char k[32];
		snprintf(k, sizeof(k), "e%d", i);
		kvt_kvs_val *v = NULL;
		if (kvt_kvs_get(s, "t", k, strlen(k), &v) == KVT_OK) {
			kvt_kvs_val_unref(v);
			CHECKF(holds(s, "t", k, 2u << 20, (uint32_t)i), "%s", k);
			back++;
		}
	}
	CHECK_EQ_INT(back + 1, keys);
	kvt_kvs_close(s);
	wipe();
}

static void test_corrupt(void)
{
	kvt_kvs *s = open_store(4u << 20, 32u << 20, true);
	CHECK_EQ_INT(set_wait(s, "t", "a", 1u << 20, 1, 0), KVT_OK);
	kvt_kvs_close(s);
	char path[300];
	snprintf(path, sizeof(path), "%s/store.t2", dir);
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	uint8_t b;
	off_t at = 2 * 4096 + 1280 + 5000; /* the first record's payload */
	CHECK(pread(fd, &b, 1, at) == 1);
	b ^= 0x40;
	CHECK(pwrite(fd, &b, 1, at) == 1);
	close(fd);
	s = open_store(4u << 20, 32u << 20, true);
	kvt_kvs_val *v = NULL;
	CHECK_EQ_INT(kvt_kvs_get(s, "t", "a", 1, &v), KVT_ENOTFOUND);
	CHECK(v == NULL);
	kvt_kvs_stats st;
	kvt_kvs_stats_get(s, &st);
	CHECK_EQ_INT(st.corrupt, 1);
	CHECK_EQ_INT(kvt_kvs_exists(s, "t", "a", 1), 0);
	kvt_kvs_close(s);
	wipe();
}

static void test_not_durable(void)
{
	kvt_kvs *s = open_store(32u << 20, 64u << 20, false);
	for (int i = 0; i < 20; i++) {
		char k[32];
		snprintf(k, sizeof(k), "n%d", i);
		kvt_kvs_ticket t = 1;
		CHECK_EQ_INT(kvt_kvs_set(s, "t", k, strlen(k), val_of(300000, (uint32_t)i), 0, &t), KVT_OK);
		CHECK_EQ_INT(t, 0);
	}
	kvt_kvs_close(s);
	s = open_store(32u << 20, 64u << 20, false);
	for (int i = 0; i < 20; i++) {
		char k[32];
		snprintf(k, sizeof(k), "n%d", i);
		CHECKF(holds(s, "t", k, 300000, (uint32_t)i), "%s", k);
	}
	kvt_kvs_close(s);
	wipe();
}

/* A child writes values (durable), telling the parent each acknowledged one; the parent kills it. */
static void test_kill9(void)
{
	for (int trial = 0; trial < 3; trial++) {
		int p[2];
		CHECK(pipe(p) == 0);
		pid_t pid = fork();
		if (pid == 0) {
			close(p[0]);
			kvt_kvs *s = open_store(8u << 20, 96u << 20, true);
			for (uint32_t i = 0;; i++) {
				char k[32];
				snprintf(k, sizeof(k), "k%u", i);
				if (set_wait(s, "t", k, (size_t)(i % 7 + 1) << 19, i, 0) == KVT_OK &&
				    write(p[1], &i, sizeof(i)) != sizeof(i))
					_exit(1);
			}
		}
		close(p[1]);
		uint32_t acked = 0, x;
		bool any = false;
		for (int got = 0; got < 20 + trial * 25 && read(p[0], &x, sizeof(x)) == sizeof(x); got++) {
			acked = x;
			any = true;
		}
		kill(pid, SIGKILL);
		while (read(p[0], &x, sizeof(x)) == sizeof(x)) {
			acked = x;
			any = true;
		}
		close(p[0]);
		waitpid(pid, NULL, 0);
		CHECK(any);
		kvt_kvs *s = open_store(8u << 20, 96u << 20, true);
		int bad = 0, present = 0;
		for (uint32_t i = 0; i <= acked + 2; i++) {
			char k[32];
			snprintf(k, sizeof(k), "k%u", i);
			bool h = holds(s, "t", k, (size_t)(i % 7 + 1) << 19, i);
			kvt_kvs_val *v = NULL;
			bool there = kvt_kvs_get(s, "t", k, strlen(k), &v) == KVT_OK;
			kvt_kvs_val_unref(v);
			present += there;
			if (there != h || (i <= acked && !there && i + 16 > acked)) /* recent acked ones must be there */
				bad++;
		}
		CHECKF(bad == 0, "trial %d: %d bad of %u acknowledged (%d present)", trial, bad, acked + 1, present);
		kvt_kvs_close(s);
		wipe();
	}
}

typedef struct {
	kvt_kvs *s;
	int id;
	int bad;
} thr_arg;

static void *thr(void *a)
{
	thr_arg *t = a;
	for (int i = 0; i < 200; i++) {
		char k[32];
		snprintf(k, sizeof(k), "k%d", i % 17);
		uint32_t seed = (uint32_t)(t->id * 1000 + i);
		if (i % 3 == 0) {
			set_wait(t->s, t->id % 2 ? "x" : "y", k, 70000 + (size_t)(i % 5) * 100000, seed, 0);
		} else if (i % 7 == 0) {
			kvt_kvs_del(t->s, "x", k, strlen(k), NULL);
		} else {
			kvt_kvs_val *v = NULL;
			if (kvt_kvs_get(t->s, t->id % 2 ? "x" : "y", k, strlen(k), &v) == KVT_OK) {
				t->bad += v->len < 70000;
				kvt_kvs_val_unref(v);
			}
			kvt_kvs_exists(t->s, "y", k, strlen(k));
		}
	}
	return NULL;
}

static void test_threads(void)
{
	kvt_kvs *s = open_store(2u << 20, 32u << 20, true);
	pthread_t th[6];
	thr_arg a[6];
	for (int i = 0; i < 6; i++) {
		a[i] = (thr_arg){ s, i, 0 };
		pthread_create(&th[i], NULL, thr, &a[i]);
	}
	int bad = 0;
	for (int i = 0; i < 6; i++) {
		pthread_join(th[i], NULL);
		bad += a[i].bad;
	}
	CHECK_EQ_INT(bad, 0);
	kvt_kvs_stats st;
	kvt_kvs_stats_get(s, &st);
	CHECK_EQ_INT(st.corrupt, 0);
	CHECK_EQ_INT(st.write_errors, 0);
	kvt_kvs_close(s);
	wipe();
}

int main(void)
{
	kvt_log_set_level(KVT_LOG_WARN);
	snprintf(dir, sizeof(dir), "%s/kvt_kvstore_%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
	test_ram_only();
	test_namespaces();
	test_reopen();
	test_evict();
	test_corrupt();
	test_not_durable();
	test_kill9();
	test_threads();
	return check_done("test_kvstore");
}
