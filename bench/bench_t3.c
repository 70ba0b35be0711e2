/*
 * bench/bench_t3.c — T3 read throughput against plain pipelined GETs of the
 * same value size, in the same run, on the same cluster.
 *
 * Needs a Redis Cluster: run it under tests/remote/redis_cluster.py, e.g.
 *   python3 tests/remote/redis_cluster.py --masters 3 -- build/bench_t3 [blocks] [rounds]
 * It writes `blocks` block records (the default model's f16 block: 368,640
 * payload bytes, 369,920 on the wire) through kvt_t3_put_blocks, then alternates:
 *   t3     kvt_t3_get_blocks of all of them (slot routing, one pipelined round
 *          per node, every record verified: XXH3, model, hash, tokens);
 *   raw    the same keys read with hiredis directly, one connection per master,
 *          all GETs appended then read back (what redis-benchmark -P does),
 *          no verification, no copy;
 * each `rounds` times after a warm-up, and prints the medians and the ratio
 * t3 / raw (target >= 0.8), as one JSON line at the end; and, to say where
 * the difference goes, the verification and payload copy of the same records
 * timed alone (verify_copy_ms).
 */
#include "t2_int.h"
#include "t3_remote.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	const char *seeds = getenv("KVT_TEST_REDIS_CLUSTER"), *ports_s = getenv("KVT_TEST_REDIS_PORTS");
	int n = argc > 1 ? atoi(argv[1]) : 64, rounds = argc > 2 ? atoi(argv[2]) : 7;
	enum { RAW = 368640, BT = 16 };
	if (!seeds || !ports_s) {
		fprintf(stderr, "bench_t3: run under tests/remote/redis_cluster.py (needs KVT_TEST_REDIS_CLUSTER)\n");
		return 2;
	}
	if (n < 1 || rounds < 1)
		return 2;
	uint8_t fp[KVT_HASH_BYTES], root[KVT_HASH_BYTES];
	for (int i = 0; i < KVT_HASH_BYTES; i++)
		fp[i] = (uint8_t)(3 * i), root[i] = (uint8_t)(7 * i + 1);
	kvt_t3_config cfg;
	kvt_t3_config_default(&cfg);
	cfg.rc.seeds = seeds;
	cfg.rc.command_timeout_ms = 10000;
	cfg.prefix = "bench:";
	kvt_t3 *t;
	if (kvt_t3_create(&cfg, fp, &t))
		return 1;
	kvt_t2_block_meta *m = calloc((size_t)n, sizeof(*m));
	uint8_t(*h)[KVT_HASH_BYTES] = calloc((size_t)n, KVT_HASH_BYTES);
	uint8_t *pay = malloc((size_t)n * RAW);
	const void **pp = calloc((size_t)n, sizeof(*pp));
	void **bp = calloc((size_t)n, sizeof(*bp));
	int *res = calloc((size_t)n, sizeof(*res));
	uint8_t *back = malloc((size_t)n * RAW);
	for (size_t i = 0; i < (size_t)n * RAW; i++)
		pay[i] = (uint8_t)(i * 2654435761u >> 13);
	for (int i = 0; i < n; i++) {
		m[i].n_tokens = BT;
		for (int j = 0; j < BT; j++)
			m[i].tokens[j] = 100 * i + j;
		memcpy(m[i].parent, i ? h[i - 1] : root, KVT_HASH_BYTES);
		kvt_hash_block(m[i].parent, m[i].tokens, BT, h[i]);
		memcpy(m[i].hash, h[i], KVT_HASH_BYTES);
		m[i].raw_bytes = RAW;
		pp[i] = pay + (size_t)i * RAW;
		bp[i] = back + (size_t)i * RAW;
	}
	if (kvt_t3_put_blocks(t, (uint32_t)n, m, pp, res))
		return 1;
	for (int i = 0; i < n; i++)
		if (res[i]) {
			fprintf(stderr, "bench_t3: write %d failed: %s\n", i, kvt_strerror(res[i]));
			return 1;
		}
	/* raw: one connection per master, each key read from its owner */
	int ports[16], n_ports = 0;
	for (const char *p = ports_s; *p && n_ports < 16;) {
		ports[n_ports++] = atoi(p);
		const char *c = strchr(p, ',');
		if (!c)
			break;
		p = c + 1;
	}
	redisContext *rc[16];
	for (int i = 0; i < n_ports; i++)
		rc[i] = redisConnect("127.0.0.1", ports[i]);
	int *owner = calloc((size_t)n, sizeof(*owner));
	char (*keys)[96] = calloc((size_t)n, sizeof(*keys));
	for (int i = 0; i < n; i++) {
		kvt_t3_block_key(t, h[i], keys[i], sizeof(keys[i]));
		owner[i] = -1;
		for (int k = 0; k < n_ports && owner[i] < 0; k++) {
			redisReply *r = redisCommand(rc[k], "EXISTS %s", keys[i]);
			if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1)
				owner[i] = k;
			freeReplyObject(r);
		}
		if (owner[i] < 0) {
			fprintf(stderr, "bench_t3: key %s on no master\n", keys[i]);
			return 1;
		}
	}
	double *t3s = calloc((size_t)rounds, sizeof(double)), *raws = calloc((size_t)rounds, sizeof(double));
	uint64_t bytes = 0;
	for (int r = -1; r < rounds; r++) { /* round -1: warm-up */
		double t0 = kvt_now_s();
		kvt_t3_get_blocks(t, (uint32_t)n, (const uint8_t(*)[KVT_HASH_BYTES])h, false, m, bp, RAW, res);
		double dt3 = kvt_now_s() - t0;
		for (int i = 0; i < n; i++)
			if (res[i] || memcmp(bp[i], pp[i], RAW)) {
				fprintf(stderr, "bench_t3: block %d came back wrong (%s)\n", i, kvt_strerror(res[i]));
				return 1;
			}
		t0 = kvt_now_s();
		for (int i = 0; i < n; i++)
			redisAppendCommand(rc[owner[i]], "GET %s", keys[i]);
		uint64_t got = 0;
		for (int i = 0; i < n; i++) {
			void *rep = NULL;
			if (redisGetReply(rc[owner[i]], &rep) != REDIS_OK)
				return 1;
			got += ((redisReply *)rep)->len;
			freeReplyObject(rep);
		}
		double draw = kvt_now_s() - t0;
		bytes = got;
		if (r >= 0) {
			t3s[r] = dt3;
			raws[r] = draw;
			printf("round %d: t3 %.1f ms (%.0f MB/s), raw GET %.1f ms (%.0f MB/s)\n", r, dt3 * 1e3,
			       bytes / dt3 / 1e6, draw * 1e3, bytes / draw / 1e6);
		}
	}
	/* What T3 adds on the CPU: verifying each record (XXH3 over it) and copying its payload out, timed alone. */
	uint8_t **recs = calloc((size_t)n, sizeof(*recs));
	size_t *rec_n = calloc((size_t)n, sizeof(*rec_n));
	for (int i = 0; i < n; i++) {
		redisReply *rep = redisCommand(rc[owner[i]], "GET %s", keys[i]);
		recs[i] = malloc(rep->len);
		memcpy(recs[i], rep->str, rep->len);
		rec_n[i] = rep->len;
		freeReplyObject(rep);
	}
	double *vs = calloc((size_t)rounds, sizeof(double));
	for (int r = 0; r < rounds; r++) {
		double t0 = kvt_now_s();
		for (int i = 0; i < n; i++) {
			const char *why;
			if (kvt_t2_record_verify_unpadded(recs[i], rec_n[i], 1u << 26, 0, fp, h[i], &m[i], bp[i], RAW, NULL,
							  &why) != KVT_OK)
				return 1;
		}
		vs[r] = kvt_now_s() - t0;
	}
	double mv = median(vs, rounds);
	printf("verify + copy out alone: %.1f ms for %d records\n", mv * 1e3, n);
	double mt3 = median(t3s, rounds), mraw = median(raws, rounds);
	printf("{\"blocks\": %d, \"value_bytes\": %llu, \"rounds\": %d, \"t3_ms\": %.2f, \"t3_mb_s\": %.1f, "
	       "\"raw_get_ms\": %.2f, \"raw_get_mb_s\": %.1f, \"verify_copy_ms\": %.2f, \"ratio\": %.3f}\n",
	       n, (unsigned long long)(bytes / (uint64_t)n), rounds, mt3 * 1e3, bytes / mt3 / 1e6, mraw * 1e3,
	       bytes / mraw / 1e6, mv * 1e3, mraw / mt3);
	for (int i = 0; i < n_ports; i++)
		redisFree(rc[i]);
	kvt_t3_destroy(t);
	return 0;
}
