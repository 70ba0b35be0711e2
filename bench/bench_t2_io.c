/*
 * bench/bench_t2_io.c — T2 store throughput: sequential and random block
 * writes and reads through kvt_t2_write_batch / kvt_t2_read_batch, one JSON
 * line per pattern. bench/t2_vs_fio.sh runs it and fio on the same file,
 * block size and queue depth and prints the ratios.
 *
 *   bench_t2_io --file F [--file-mib M] [--bs BYTES] [--qd Q] [--batch N]
 *               [--mode auto|uring|threads] [--reps R] [--sync-every K]
 *
 * Records are sized so that one record's extent is exactly --bs bytes (the
 * 1280-byte header plus bs - 1280 payload bytes), incompressible, compression
 * off: one record = one bs-sized O_DIRECT I/O, as fio's blocks are. Every
 * write batch of N records ends in one fdatasync (fio: --fdatasync=N); every
 * read is verified (checksum, hash) and copied out to the caller's buffer.
 *   seqwrite  fill the file front to back (the allocator's next-fit order);
 *   seqread   read every record in offset order;
 *   randread  read every record in a random order;
 *   randwrite free N random records, write N new ones (they land in the
 *             freed extents: exact-size reuse), for the whole file.
 * Each pattern runs R times after one untimed fill of the fresh
 * (fallocated) file, so the timed runs, like fio after them, write over
 * extents already written once; seqwrite reopens the store before each run
 * (an empty free map, filled front to back). The median MB/s is reported
 * (bytes = extents = records x bs), with cpu_pct: the process's CPU time
 * (user + system, all threads) over the wall time of the timed runs, to tell
 * a CPU-bound store (verify, copy, pack on the calling thread) from a
 * device-bound one.
 */
#include "t2_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec * 1e-6;
}

static uint64_t rng_s = 88172645463325252ull;
static uint64_t rnd(void)
{
	rng_s ^= rng_s << 13;
	rng_s ^= rng_s >> 7;
	rng_s ^= rng_s << 17;
	return rng_s;
}

static void shuffle(uint32_t *v, uint32_t n)
{
	for (uint32_t i = n - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(rnd() % (i + 1));
		uint32_t t = v[i];
		v[i] = v[j];
		v[j] = t;
	}
}

int main(int argc, char **argv)
{
	const char *file = NULL, *mode_s = "auto";
	uint64_t file_mib = 512, bs = 128 << 10;
	uint32_t qd = 32, batch = 0;
	long sync_every = 0;
	int reps = 3;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--file")) file = argv[i + 1];
		else if (!strcmp(argv[i], "--file-mib")) file_mib = strtoull(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--bs")) bs = strtoull(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--qd")) qd = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--batch")) batch = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--mode")) mode_s = argv[i + 1];
		else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--sync-every")) sync_every = atol(argv[i + 1]);
		else file = NULL, i = argc;
	}
	int mode = !strcmp(mode_s, "uring") ? KVT_T2_IO_URING : !strcmp(mode_s, "threads") ? KVT_T2_IO_THREADS : KVT_T2_IO_AUTO;
	if (!batch)
		batch = 4 * qd;
	if (!file || bs < 8192 || bs % 4096 || bs > (8u << 20) || !qd || qd > 1024 || reps < 1 || reps > 50 ||
	    file_mib * (1 << 20) / bs < batch) {
		fprintf(stderr, "usage: bench_t2_io --file F [--file-mib M] [--bs BYTES (multiple of 4096, 8 KiB..8 MiB)] "
				"[--qd Q] [--batch N] [--mode auto|uring|threads] [--reps R] [--sync-every K (background fdatasync every K writes; 0: none)]\n");
		return 2;
	}
	uint32_t n_rec = (uint32_t)(file_mib * (1 << 20) / bs);
	uint32_t raw = (uint32_t)(bs - KVT_T2_HEADER_BYTES);
	kvt_t2_config cfg = { .path = file, .capacity_bytes = (uint64_t)n_rec * bs + KVT_T2_UNIT_BYTES,
			      .queue_depth = qd, .io_mode = mode, .reset = true, .max_raw_bytes = raw, .n_io_ctx = 1,
			      .sync_every = sync_every > 0 ? (uint32_t)sync_every : 0,
			      .staging_cap_bytes = 2ull * qd * bs /* the whole queue depth, as fio gets */ };
	memcpy(cfg.model_fp, "bench_t2_io", 11);
	kvt_t2_store *s;
	if (kvt_t2_open(&cfg, &s)) {
		fprintf(stderr, "bench_t2_io: cannot open %s\n", file);
		return 1;
	}
	kvt_t2_stats st;
	kvt_t2_get_stats(s, &st);

	/* batch payloads: random bytes (incompressible), distinct hashes per record */
	uint8_t **pay = malloc(batch * sizeof(*pay));
	kvt_t2_block_meta *meta = calloc(batch, sizeof(*meta));
	kvt_t2_write_req *req = malloc(batch * sizeof(*req));
	for (uint32_t i = 0; i < batch; i++) {
		pay[i] = malloc(raw);
		for (uint32_t b = 0; b < raw; b += 8) {
			uint64_t r = rnd();
			memcpy(pay[i] + b, &r, raw - b < 8 ? raw - b : 8);
		}
		meta[i].n_tokens = 16;
		meta[i].raw_bytes = raw;
		req[i] = (kvt_t2_write_req){ &meta[i], pay[i] };
	}
	kvt_t2_loc *loc = malloc(n_rec * sizeof(*loc));
	uint8_t(*hash)[32] = calloc(n_rec, 32);
	kvt_t2_loc *bl = malloc(batch * sizeof(*bl));
	uint8_t(*bh)[32] = malloc(batch * 32);
	int *res = malloc(batch * sizeof(int));
	uint32_t *perm = malloc(n_rec * sizeof(*perm));
	double *t = calloc((size_t)reps, sizeof(double));
	const char *names[4] = { "seqwrite", "seqread", "randread", "randwrite" };
	uint64_t serial = 0;

	/* r == -1: a first fill, untimed: it turns the fallocated (unwritten)
	 * extents into written ones, so every timed pattern (and fio after us)
	 * runs on the same file state */
	for (int pat = 0; pat < 4; pat++) {
		double cpu_sum = 0, wall_sum = 0;
		for (int r = pat == 0 ? -1 : 0; r < reps; r++) {
			for (uint32_t i = 0; i < n_rec; i++)
				perm[i] = i;
			if (pat >= 2)
				shuffle(perm, n_rec);
			if (pat == 0 && r >= 0) { /* refill from an empty map, front to back */
				kvt_t2_close(s);
				cfg.reset = false;
				if (kvt_t2_open(&cfg, &s)) {
					fprintf(stderr, "bench_t2_io: cannot reopen %s\n", file);
					return 1;
				}
			}
			double t0 = kvt_now_s(), c0 = cpu_s();
			for (uint32_t b0 = 0; b0 < n_rec; b0 += batch) {
				uint32_t n = n_rec - b0 < batch ? n_rec - b0 : batch;
				if (pat == 0 || pat == 3) {
					if (pat == 3) {
						double tf = kvt_now_s(), cf = cpu_s();
						for (uint32_t i = 0; i < n; i++)
							kvt_t2_free(s, &loc[perm[b0 + i]]);
						t0 += kvt_now_s() - tf; /* not timed */
						c0 += cpu_s() - cf;
					}
					for (uint32_t i = 0; i < n; i++) {
						serial++;
						memcpy(meta[i].hash, &serial, 8);
					}
					if (kvt_t2_write_batch(s, n, req, bl, res)) {
						fprintf(stderr, "bench_t2_io: write failed\n");
						return 1;
					}
					for (uint32_t i = 0; i < n; i++) {
						uint32_t k = pat == 0 ? b0 + i : perm[b0 + i];
						loc[k] = bl[i];
						memcpy(hash[k], meta[i].hash, 32);
					}
				} else {
					for (uint32_t i = 0; i < n; i++) {
						bl[i] = loc[perm[b0 + i]];
						memcpy(bh[i], hash[perm[b0 + i]], 32);
					}
					if (kvt_t2_read_batch(s, n, bl, (const uint8_t(*)[32])bh, NULL, (void *const *)pay, raw,
							      res)) {
						fprintf(stderr, "bench_t2_io: read failed\n");
						return 1;
					}
				}
			}
			if (r >= 0) {
				t[r] = kvt_now_s() - t0;
				cpu_sum += cpu_s() - c0;
				wall_sum += t[r];
			}
		}
		qsort(t, (size_t)reps, sizeof(double), cmp_d);
		double med = t[reps / 2];
		double bytes = (double)n_rec * (double)bs;
		printf("{\"engine\":\"t2\",\"pattern\":\"%s\",\"bs\":%llu,\"qd\":%u,\"batch\":%u,\"records\":%u,\"MBps\":%.1f,"
		       "\"payload_MBps\":%.1f,\"iops\":%.0f,\"cpu_pct\":%.0f,\"uring\":%s,\"direct\":%s,\"sync_every\":%ld}\n",
		       names[pat], (unsigned long long)bs, qd, batch, n_rec, bytes / med / 1e6,
		       (double)n_rec * raw / med / 1e6, n_rec / med, 100 * cpu_sum / wall_sum, st.using_uring ? "true" : "false",
		       st.direct_io ? "true" : "false", sync_every);
		fflush(stdout);
	}
	kvt_t2_get_stats(s, &st);
	if (st.n_corrupt) {
		fprintf(stderr, "bench_t2_io: %llu corrupt reads\n", (unsigned long long)st.n_corrupt);
		return 1;
	}
	kvt_t2_close(s);
	for (uint32_t i = 0; i < batch; i++)
		free(pay[i]);
	free(pay);
	free(meta);
	free(req);
	free(loc);
	free(hash);
	free(bl);
	free(bh);
	free(res);
	free(perm);
	free(t);
	return 0;
}
