/*
 * bench/bench_t1_codec.c — T1 quantize + dequantize throughput against memcpy
 * of the same bytes, measured in the same run.
 *
 *   bench_t1_codec [--device cpu|cuda|auto] [--threads N] [--blocks 64] [--batch 16] [--reps 7]
 *                  [--layers 30 --kv-heads 3 --head-dim 64 --block-tokens 16]
 *
 * The block shape defaults to SmolLM2-135M's (368,640 fp16 bytes a block).
 * For each codec, a round trip of --blocks blocks goes through the mover the
 * tiering manager uses (tiers.h: kv_pack into device staging + D2H into T1
 * slots, then H2D + kv_unpack into other T0 slots), --batch blocks a call.
 * The baseline moves the same fp16 bytes with plain copies (D2H into pinned
 * host buffers, then H2D back: memcpy on the CPU backend). Each rep times the
 * baseline and every codec back to back (so a loaded machine slows them
 * alike); rep 0 is a warm-up, then the median of --reps. Throughput counts fp16 bytes (what the engine holds),
 * so a codec that is faster than the copy shows a ratio above 1.
 * On the CPU backend the codecs run on the calling thread (the manager's I/O
 * thread), not on the device's worker pool.
 */
#include "tiers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void cpu_model(char *out, size_t cap)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];
	snprintf(out, cap, "unknown CPU");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "model name", 10)) {
			char *p = strchr(line, ':');
			if (p) {
				p += 2;
				p[strcspn(p, "\n")] = 0;
				snprintf(out, cap, "%s", p);
			}
			break;
		}
	}
	fclose(f);
}

int main(int argc, char **argv)
{
	int kind = KVT_DEV_CPU, threads = 0, reps = 7;
	uint32_t n_blocks = 64, batch = 16;
	kvt_kv_layout shape = { .n_layers = 30, .n_kv_heads = 3, .head_dim = 64, .block_tokens = 16 };

	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];
		if (!strcmp(k, "--device"))
			kind = !strcmp(v, "cuda") ? KVT_DEV_CUDA : !strcmp(v, "auto") ? KVT_DEV_AUTO : KVT_DEV_CPU;
		else if (!strcmp(k, "--threads")) threads = atoi(v);
		else if (!strcmp(k, "--blocks")) n_blocks = (uint32_t)atoi(v);
		else if (!strcmp(k, "--batch")) batch = (uint32_t)atoi(v);
		else if (!strcmp(k, "--reps")) reps = atoi(v);
		else if (!strcmp(k, "--layers")) shape.n_layers = (uint32_t)atoi(v);
		else if (!strcmp(k, "--kv-heads")) shape.n_kv_heads = (uint32_t)atoi(v);
		else if (!strcmp(k, "--head-dim")) shape.head_dim = (uint32_t)atoi(v);
		else if (!strcmp(k, "--block-tokens")) shape.block_tokens = (uint32_t)atoi(v);
		else {
			fprintf(stderr, "bench_t1_codec: unknown option %s\n", k);
			return 2;
		}
	}
	if (!n_blocks || !batch || batch > n_blocks || reps < 1 || reps > 101 || !shape.n_layers ||
	    !shape.n_kv_heads || !shape.head_dim || !shape.block_tokens) {
		fprintf(stderr, "usage: bench_t1_codec [--device cpu|cuda|auto] [--threads N] [--blocks N] [--batch N<=blocks] "
				"[--reps N] [--layers N --kv-heads N --head-dim N --block-tokens N]\n");
		return 2;
	}

	kvt_dev *dev;
	kvt_dev_config dc = { .kind = kind, .n_threads = threads };
	if (kvt_dev_create(&dc, &dev))
		return 1;
	kvt_t0_pool *t0;
	if (kvt_t0_create(dev, &shape, 2 * n_blocks, &t0))
		return 1;
	const size_t bb = kvt_t0_block_bytes(t0), n_el = bb / 2;
	const uint32_t per = shape.block_tokens * shape.head_dim;

	/* KV-like contents: each (layer, K/V, head) vector group has its own magnitude */
	uint16_t *h_init = malloc(bb);
	unsigned long long s = 88172645463325252ULL;
	int32_t *src = malloc(n_blocks * sizeof(*src)), *dst = malloc(n_blocks * sizeof(*dst));
	for (uint32_t b = 0; b < n_blocks; b++) {
		for (size_t v = 0; v < n_el / per; v++) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			float mag = (float)(1u << (s % 6)) * 0.05f;
			for (uint32_t i = 0; i < per; i++) {
				s ^= s << 13, s ^= s >> 7, s ^= s << 17;
				h_init[v * per + i] = kvt_f32_to_f16(((float)(s >> 40) / 16777216.0f * 2 - 1) * mag);
			}
		}
		if (kvt_t0_alloc(t0, &src[b]) || kvt_t0_alloc(t0, &dst[b]))
			return 1;
		kvt_dev_copy_h2d(dev, (char *)kvt_t0_layout(t0)->pool + (size_t)src[b] * bb, h_init, bb);
	}
	free(h_init);

	char cpu[256];
	cpu_model(cpu, sizeof(cpu));
	printf("bench_t1_codec: %s; device %s\n", cpu, kvt_dev_name(dev));
	printf("block %u layers x %u kv heads x %u dims x %u tokens = %zu fp16 bytes; %u blocks, %u per call, median of %d\n",
	       shape.n_layers, shape.n_kv_heads, shape.head_dim, shape.block_tokens, bb, n_blocks, batch, reps);

	/* baseline: the fp16 bytes down and back up with plain copies */
	void *h_copy;
	if (kvt_dev_host_alloc(dev, bb * n_blocks, &h_copy))
		return 1;
	kvt_stream *st;
	if (kvt_dev_stream_create(dev, &st))
		return 1;
	kvt_t1_pool *t1[KVT_KV_CODEC_COUNT];
	kvt_t1_mover *mv[KVT_KV_CODEC_COUNT];
	void **hp[KVT_KV_CODEC_COUNT];
	for (int codec = 0; codec < KVT_KV_CODEC_COUNT; codec++) {
		if (kvt_t1_create(dev, &shape, codec, n_blocks, &t1[codec]) ||
		    kvt_t1_mover_create(dev, t0, codec, batch, &mv[codec]))
			return 1;
		hp[codec] = malloc(n_blocks * sizeof(void *));
		for (uint32_t b = 0; b < n_blocks; b++) {
			int32_t sl;
			kvt_t1_alloc(t1[codec], &sl);
			hp[codec][b] = kvt_t1_slot_ptr(t1[codec], sl);
		}
	}
	/* Interleaved: each rep times the copy and then every codec, so load on a shared machine hits all alike. */
	double *t_copy = malloc((size_t)reps * sizeof(double));
	double *tp[KVT_KV_CODEC_COUNT], *tu[KVT_KV_CODEC_COUNT], *tt[KVT_KV_CODEC_COUNT];
	for (int codec = 0; codec < KVT_KV_CODEC_COUNT; codec++) {
		tp[codec] = malloc((size_t)reps * sizeof(double));
		tu[codec] = malloc((size_t)reps * sizeof(double));
		tt[codec] = malloc((size_t)reps * sizeof(double));
	}
	for (int r = 0; r <= reps; r++) {
		double t_start = kvt_now_s();
		for (uint32_t b = 0; b < n_blocks; b++)
			kvt_dev_copy_async(dev, st, (char *)h_copy + (size_t)b * bb,
					   (char *)kvt_t0_layout(t0)->pool + (size_t)src[b] * bb, bb, KVT_COPY_D2H);
		for (uint32_t b = 0; b < n_blocks; b++)
			kvt_dev_copy_async(dev, st, (char *)kvt_t0_layout(t0)->pool + (size_t)dst[b] * bb,
					   (char *)h_copy + (size_t)b * bb, bb, KVT_COPY_H2D);
		kvt_dev_stream_sync(dev, st);
		if (r)
			t_copy[r - 1] = kvt_now_s() - t_start;
		for (int codec = 0; codec < KVT_KV_CODEC_COUNT; codec++) {
			double a = kvt_now_s();
			for (uint32_t b = 0; b < n_blocks; b += batch)
				kvt_t1_mover_pack(mv[codec], n_blocks - b < batch ? n_blocks - b : batch, src + b,
						  hp[codec] + b);
			double m = kvt_now_s();
			for (uint32_t b = 0; b < n_blocks; b += batch)
				kvt_t1_mover_unpack(mv[codec], n_blocks - b < batch ? n_blocks - b : batch,
						    (const void *const *)(hp[codec] + b), dst + b);
			double e = kvt_now_s();
			if (r) { /* rep 0 is the warm-up */
				tp[codec][r - 1] = m - a;
				tu[codec][r - 1] = e - m;
				tt[codec][r - 1] = e - a;
			}
		}
	}
	double mc = median(t_copy, reps);
	double gb = (double)bb * n_blocks / 1e9;
	printf("\n%-6s %10s %12s %12s %14s %10s\n", "codec", "T1 bytes", "pack GB/s", "unpack GB/s", "round trip GB/s",
	       "vs copy");
	printf("%-6s %10zu %12s %12s %14.2f %10s\n", "copy", bb, "-", "-", 2 * gb / mc, "1.00x");
	for (int codec = 0; codec < KVT_KV_CODEC_COUNT; codec++) {
		double mp = median(tp[codec], reps), mu = median(tu[codec], reps), mt = median(tt[codec], reps);
		printf("%-6s %10zu %12.2f %12.2f %14.2f %9.2fx\n", kvt_kv_codec_name(codec), kvt_t1_slot_bytes(t1[codec]),
		       gb / mp, gb / mu, 2 * gb / mt, mc / mt);
		free(tp[codec]);
		free(tu[codec]);
		free(tt[codec]);
		free(hp[codec]);
		kvt_t1_mover_destroy(mv[codec]);
		kvt_t1_destroy(t1[codec]);
	}
	free(t_copy);
	printf("\n(GB/s of fp16 bytes; 'vs copy' = time of the plain fp16 round trip / time of the codec round trip)\n");
	kvt_dev_stream_destroy(dev, st);
	kvt_dev_host_free(dev, h_copy);
	for (uint32_t b = 0; b < n_blocks; b++) {
		kvt_t0_unref(t0, src[b]);
		kvt_t0_unref(t0, dst[b]);
	}
	free(src);
	free(dst);
	kvt_t0_destroy(t0);
	kvt_dev_destroy(dev);
	return 0;
}
