/*
 * bench/bench_gpu.c — the CUDA backend's benchmarks, each a ratio against a
 * baseline measured in the same run on the same GPU (issue: CUDA backend):
 *
 *   1. paged decode attention, KV bytes read per second, against a
 *      device-to-device copy (bytes read + written per second: both are the
 *      memory traffic of the op), at batch 1 x 4K and 1 x 64K context;
 *   2. decode attention over an FP8 pool against an fp16 pool, 16K-64K context;
 *   3. kv_pack / kv_unpack (FP8 and INT8) against a d2d copy of the same fp16 bytes;
 *   4. batched block page-out (one async copy per block into scattered
 *      pinned slots) and page-in, against one large pinned cudaMemcpyAsync of
 *      the same bytes; also page-out through FP8 (pack + D2H of the packed bytes);
 *   5. end-to-end greedy decode tokens/s of a Llama-1B-shaped synthetic model
 *      (random fp16 weights, written here with the project's GGUF writer),
 *      with the weight bytes read per second against the copy's bandwidth;
 *   6. decode steps of the same model, the device counters per token
 *      (kernel launches, graph launches, host waits, bytes each way): one
 *      token at a time through kvt_model_forward and a host argmax, then
 *      kvt_model_decode (one graph a step, greedy on the device) at batch 1,
 *      8 and 32, tokens/s and the weight bytes streamed per second against
 *      the copy (at batch 1 the weight-streaming limit: target >= 0.7).
 *
 *   7. resume TTFT from T1 (`bench_gpu DIR --resume-ttft`, its own run; see
 *      resume_ttft below): a history of 4K/16K/32K tokens in T1, a new turn
 *      of 256 tokens, sequential (promote, then prefill) against pipelined
 *      (kvt_tm_promote_layered + the gated prefill), with the copy and the
 *      compute alone, so the summary can give pipelined / sequential and
 *      pipelined / max(copy, compute).
 *   8. `bench_gpu DIR --batch-sweep` (alone, time-bounded): decode tokens/s
 *      at batch 1, 8, 32, 64 and 128 on a Llama-3.2-1B-shaped and a
 *      Llama-3-8B-shaped model with random weights made on the device
 *      (kvt_model_create_random), each fp16 and Q4_K as stored, 512 tokens of
 *      context per sequence (copied from one prefilled sequence, so attention
 *      reads distinct blocks but stays a small share: kv_bytes_per_step is
 *      printed beside the weight bytes); per batch the weight bytes streamed
 *      per second against the copy (target at batch 1: >= 0.7); then at batch
 *      64 each of the model's GEMM shapes (q, k, v, o, gate+up, down, output),
 *      timed through the same kvt_dev ops the model calls, against cuBLAS's
 *      best for the shape (bench/cublas_ref.cu, fp16 in, fp32 accumulate;
 *      Q4_K against cuBLAS fp16 on the widened shape): target >= 0.6 overall.
 *      `--tiny` runs a 2-layer model of the same structure (a run that
 *      proves the mode works, not a figure), `--cpu` on the CPU backend.
 *
 * Decode attention runs on each decode kernel (KVT_CUDA_DECODE=1, 2 and 3;
 * the "kernel" field), then (1c, decode_variants) on every selectable variant
 * (kernel x separate/fused combine x staging) per batch x context class and
 * codec, with the 8-bit speed-up over fp16 per variant ("decode_variant",
 * "decode_8bit_ratio" lines; bench/device_summary.py picks the fastest). `bench_gpu DIR --attention` stops after it: the quick
 * loop while tuning a kernel on a GPU whose time is short. `bench_gpu --synth
 * PATH` only writes the small synthetic model bench/gpu_daemon_smoke.py serves,
 * `bench_gpu --synth-1b PATH [q8_0|f16]` the Llama-1B-shaped one of bench/bench_startup.py;
 * `bench_gpu DIR --variants` runs the copy and the decode variants only.
 *
 * Times are host wall-clock over many back-to-back launches ending in one
 * sync (launch overheads included, as the engine pays them). Prints one JSON
 * object per line; bench/gpu_sdpa.py reads these lines and times PyTorch's
 * scaled_dot_product_attention on the same shapes.
 */
#include "dev.h"
#include "generate.h"
#include "gguf.h"
#include "index.h"
#include "manager.h"
#include "model.h"
#include "synth_model.h"
#include "tiers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static kvt_dev *dev;

static void die(const char *what)
{
	fprintf(stderr, "bench_gpu: %s failed\n", what);
	exit(1);
}

static void *dalloc(size_t n)
{
	void *p = NULL;
	if (kvt_dev_alloc(dev, n, &p))
		die("alloc");
	return p;
}

/* Seconds per iteration of fn over iters runs after a warm-up. */
typedef void (*bench_fn)(void *ctx);
static double time_it(bench_fn fn, void *ctx, int iters)
{
	fn(ctx);
	kvt_dev_sync(dev);
	double t0 = kvt_now_s();
	for (int i = 0; i < iters; i++)
		fn(ctx);
	kvt_dev_sync(dev);
	return (kvt_now_s() - t0) / iters;
}

typedef struct copy_job {
	void *dst;
	const void *src;
	size_t n;
} copy_job;
static void do_copy(void *ctx)
{
	copy_job *j = ctx;
	kvt_dev_copy_d2d(dev, j->dst, j->src, j->n);
}

/* bytes/s of a d2d copy counting read + write */
static double copy_bw(size_t n)
{
	copy_job j = { dalloc(n), dalloc(n), n };
	kvt_dev_copy_d2d(dev, j.dst, j.src, n); /* touch */
	double t = time_it(do_copy, &j, 50);
	kvt_dev_free(dev, j.dst);
	kvt_dev_free(dev, (void *)j.src);
	return 2.0 * n / t;
}

typedef struct attn_job {
	kvt_attention_args a;
	void *ws;
} attn_job;
static void do_attn(void *ctx)
{
	attn_job *j = ctx;
	if (kvt_dev_attention(dev, &j->a, j->ws))
		die("attention");
}

/* Seconds per decode attention call at n_ctx on a pool of this codec; *bytes = KV bytes read. */
static double attn_time(uint32_t kvh, uint32_t G, uint32_t hd, uint32_t n_ctx, int codec, double *bytes)
{
	const uint32_t bt = 16, nb = (n_ctx + bt - 1) / bt;
	kvt_kv_layout l = { .n_layers = 1, .n_kv_heads = kvh, .head_dim = hd, .block_tokens = bt, .n_slots = nb,
			    .codec = codec };
	size_t pool_bytes = kvt_kv_block_bytes(&l) * nb;
	l.pool = dalloc(pool_bytes);
	/* contents: pack random fp16 K/V into the pool's codec, via an fp16 staging pool */
	{
		kvt_kv_layout f = l;
		f.codec = KVT_KV_CODEC_F16;
		f.n_slots = 1;
		size_t fb = kvt_kv_block_bytes(&f);
		uint16_t *h = malloc(fb);
		uint64_t s = 88172645463325252ULL;
		for (size_t i = 0; i < fb / 2; i++) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			h[i] = kvt_f32_to_f16(((float)(s % 2001) - 1000.0f) / 500.0f);
		}
		f.pool = dalloc(fb);
		kvt_dev_copy_h2d(dev, f.pool, h, fb);
		int32_t zero = 0;
		size_t pb = kvt_kv_packed_bytes(&f, codec);
		void *stage = dalloc(pb);
		kvt_kv_pack_args pa = { .kv = &f, .codec = codec, .n_blocks = 1, .h_slots = &zero, .dst = stage };
		if (kvt_dev_kv_pack(dev, NULL, &pa))
			die("pack");
		for (uint32_t b = 0; b < nb; b++)
			kvt_dev_copy_d2d(dev, (char *)l.pool + (size_t)b * pb, stage, pb);
		kvt_dev_sync(dev);
		kvt_dev_free(dev, stage);
		kvt_dev_free(dev, f.pool);
		free(h);
	}
	int32_t *table = malloc(nb * 4);
	for (uint32_t i = 0; i < nb; i++)
		table[i] = (int32_t)((i * 7919u) % nb); /* scattered blocks */
	int32_t *d_table = dalloc(nb * 4);
	kvt_dev_copy_h2d(dev, d_table, table, nb * 4);
	float *hq = malloc((size_t)kvh * G * hd * 4);
	for (size_t i = 0; i < (size_t)kvh * G * hd; i++)
		hq[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
	attn_job j = { .a = { .kv = &l, .layer = 0, .block_table = d_table, .pos0 = n_ctx - 1, .n_rows = 1,
			      .n_heads = kvh * G, .scale = 0.088f } };
	j.a.q = dalloc((size_t)kvh * G * hd * 4);
	j.a.out = dalloc((size_t)kvh * G * hd * 4);
	kvt_dev_copy_h2d(dev, (void *)j.a.q, hq, (size_t)kvh * G * hd * 4);
	size_t wsb = kvt_dev_attention_workspace_bytes(dev, &j.a);
	j.ws = wsb ? dalloc(wsb) : NULL;
	int iters = n_ctx >= 16384 ? 200 : 1000;
	double t = time_it(do_attn, &j, iters);
	*bytes = (double)n_ctx * kvh * 2 * (codec == KVT_KV_CODEC_F16 ? hd * 2.0 : hd + 4.0);
	kvt_dev_free(dev, j.ws);
	kvt_dev_free(dev, (void *)j.a.q);
	kvt_dev_free(dev, j.a.out);
	kvt_dev_free(dev, d_table);
	kvt_dev_free(dev, l.pool);
	free(table);
	free(hq);
	return t;
}

/*
 * 1c: the decode-attention variants (gpu/cuda/cuda_attn.cu, decode_choices):
 * every selectable kernel (1, 2, 3) x combine (its own kernel, or fused
 * into the last CTA of each head) x staging (kernel 2/3: table entries and
 * 8-bit scales in shared memory), a device each (KVT_CUDA_DECODE,
 * KVT_CUDA_COMBINE, KVT_CUDA_STAGE), per batch x context class and codec,
 * on the Llama-3-8B KV shape (8 KV heads, group 4, head_dim 128). A batch is
 * B sequences of that context, one attention call each, back to back (as
 * the engine issues them). Each figure is the median of 3 timings, KV bytes
 * read per second against the copy; 8-bit classes of >= 16K context also
 * get their speed-up over fp16 on the same variant (item 3 of the GPU
 * issue). Bounded: KVT_BENCH_VARIANTS_S seconds (default 60), after which
 * the classes left are named as skipped. KVT_BENCH_VARIANTS_SMALL=N divides
 * the contexts by N and times one call once (a dry run of the harness: the
 * emulator's test bench_gpu_variants_emu; its times mean nothing); each
 * line's "class_context" is the class's context before that division.
 */
typedef struct decode_variant {
	int version;      /* decode kernel */
	bool fused;       /* combine in the last CTA */
	bool staged;      /* kernel 2/3 staging */
	const char *name; /* the "variant" field */
} decode_variant;
static const decode_variant variants[] = {
	{ 1, false, false, "k1" },        { 1, true, false, "k1+fused" },       { 2, false, false, "k2" },
	{ 2, true, false, "k2+fused" },   { 2, false, true, "k2+staged" },      { 2, true, true, "k2+fused+staged" },
	{ 3, false, false, "k3" },        { 3, true, false, "k3+fused" },       { 3, false, true, "k3+staged" },
	{ 3, true, true, "k3+fused+staged" },
};
enum { N_VARIANTS = sizeof variants / sizeof variants[0] };

typedef struct batch_job {
	kvt_dev *d;
	uint32_t n;              /* sequences */
	kvt_attention_args a[32]; /* one per sequence */
	void *ws;
} batch_job;
static void do_batch(void *ctx)
{
	batch_job *j = ctx;
	for (uint32_t i = 0; i < j->n; i++)
		if (kvt_dev_attention(j->d, &j->a[i], j->ws))
			die("attention (variant)");
}

/* Median of 3 timings of fn on device d (time_it times on the global dev). */
static double median3(kvt_dev *d, bench_fn fn, void *ctx, int iters)
{
	kvt_dev *keep = dev;
	dev = d;
	double t[3];
	for (int i = 0; i < 3; i++)
		t[i] = time_it(fn, ctx, iters);
	dev = keep;
	double lo = t[0] < t[1] ? t[0] : t[1], hi = t[0] < t[1] ? t[1] : t[0];
	return t[2] < lo ? lo : t[2] > hi ? hi : t[2];
}

/* A pool of n_blocks blocks of this codec with random fp16 K/V packed into it (as attn_time's). */
static void *variant_pool(kvt_kv_layout *l, int codec)
{
	kvt_kv_layout f = *l;
	f.codec = KVT_KV_CODEC_F16;
	f.n_slots = 1;
	const size_t fb = kvt_kv_block_bytes(&f), pb = kvt_kv_packed_bytes(&f, codec);
	l->codec = codec;
	void *pool = dalloc(kvt_kv_block_bytes(l) * l->n_slots);
	uint16_t *h = malloc(fb);
	uint64_t s = 0x9e3779b97f4a7c15ULL;
	for (size_t i = 0; i < fb / 2; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		h[i] = kvt_f32_to_f16(((float)(s % 2001) - 1000.0f) / 500.0f);
	}
	f.pool = dalloc(fb);
	kvt_dev_copy_h2d(dev, f.pool, h, fb);
	int32_t zero = 0;
	void *stage = dalloc(pb);
	kvt_kv_pack_args pa = { .kv = &f, .codec = codec, .n_blocks = 1, .h_slots = &zero, .dst = stage };
	if (kvt_dev_kv_pack(dev, NULL, &pa))
		die("pack");
	for (uint32_t b = 0; b < l->n_slots; b++)
		kvt_dev_copy_d2d(dev, (char *)pool + (size_t)b * pb, stage, pb);
	kvt_dev_sync(dev);
	kvt_dev_free(dev, stage);
	kvt_dev_free(dev, f.pool);
	free(h);
	return pool;
}

static void decode_variants(double cbw)
{
	static const uint32_t classes[][2] = { /* batch, context */
		{ 1, 4096 }, { 1, 16384 }, { 1, 65536 }, { 4, 16384 }, { 8, 8192 }, { 32, 2048 },
	};
	const uint32_t kvh = 8, G = 4, hd = 128, bt = 16;
	const char *bs = getenv("KVT_BENCH_VARIANTS_S"), *sm = getenv("KVT_BENCH_VARIANTS_SMALL");
	const double budget = bs && atof(bs) > 0 ? atof(bs) : 60.0;
	const uint32_t shrink = sm && atoi(sm) > 1 ? (uint32_t)atoi(sm) : 1;
	kvt_dev *vd[N_VARIANTS];
	kvt_dev_config dc = { .kind = KVT_DEV_CUDA };
	for (int v = 0; v < N_VARIANTS; v++) {
		char ver[2] = { (char)('0' + variants[v].version), 0 };
		setenv("KVT_CUDA_DECODE", ver, 1);
		setenv("KVT_CUDA_COMBINE", variants[v].fused ? "fused" : "separate", 1);
		setenv("KVT_CUDA_STAGE", variants[v].staged ? "1" : "0", 1);
		if (kvt_dev_create(&dc, &vd[v]))
			die("device for a decode variant");
	}
	unsetenv("KVT_CUDA_DECODE");
	unsetenv("KVT_CUDA_COMBINE");
	unsetenv("KVT_CUDA_STAGE");
	const double t0 = kvt_now_s();
	size_t ci = 0;
	for (; ci < sizeof classes / sizeof classes[0] && kvt_now_s() - t0 < budget; ci++) {
		const uint32_t B = classes[ci][0], ctx = classes[ci][1] / shrink, nb = (ctx + bt - 1) / bt;
		double f16_us[N_VARIANTS] = { 0 };
		for (int codec = KVT_KV_CODEC_F16; codec < KVT_KV_POOL_CODEC_COUNT; codec++) {
			kvt_kv_layout l = { .n_layers = 1, .n_kv_heads = kvh, .head_dim = hd, .block_tokens = bt,
					    .n_slots = B * nb };
			l.pool = variant_pool(&l, codec);
			int32_t *table = malloc((size_t)B * nb * 4);
			for (uint32_t i = 0; i < B * nb; i++)
				table[i] = (int32_t)(((uint64_t)i * 7919u) % (B * nb)); /* scattered blocks */
			int32_t *d_table = dalloc((size_t)B * nb * 4);
			kvt_dev_copy_h2d(dev, d_table, table, (size_t)B * nb * 4);
			const size_t qn = (size_t)kvh * G * hd;
			float *hq = malloc(qn * B * 4);
			for (size_t i = 0; i < qn * B; i++)
				hq[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
			float *d_q = dalloc(qn * B * 4), *d_o = dalloc(qn * B * 4);
			kvt_dev_copy_h2d(dev, d_q, hq, qn * B * 4);
			kvt_dev_sync(dev);
			batch_job j = { .n = B };
			for (uint32_t i = 0; i < B; i++)
				j.a[i] = (kvt_attention_args){ .kv = &l, .layer = 0, .block_table = d_table + (size_t)i * nb,
							       .pos0 = ctx - 1, .n_rows = 1, .n_heads = kvh * G,
							       .scale = 0.088f, .q = d_q + qn * i, .out = d_o + qn * i };
			const double gd = codec == KVT_KV_CODEC_F16 ? hd : (double)kvt_kv_group_dims(codec, hd);
			const double bytes = (double)B * ctx * kvh * 2 *
					     (codec == KVT_KV_CODEC_F16 ? hd * 2.0 : hd + 4.0 * hd / gd);
			int iters = bytes * 1000 < 2e10 ? 1000 : bytes * 20 > 2e10 ? 20 : (int)(2e10 / bytes);
			if (shrink > 1)
				iters = 1;
			for (int v = 0; v < N_VARIANTS; v++) {
				if (variants[v].version == 3 && codec == KVT_KV_CODEC_F16)
					continue; /* 3 differs from 2 on 8-bit pools only */
				j.d = vd[v];
				size_t wsb = kvt_dev_attention_workspace_bytes(j.d, &j.a[0]);
				j.ws = wsb ? dalloc(wsb) : NULL;
				double t;
				if (shrink > 1) { /* a dry run: one timing */
					kvt_dev *keep = dev;
					dev = j.d;
					t = time_it(do_batch, &j, iters);
					dev = keep;
				} else {
					t = median3(j.d, do_batch, &j, iters);
				}
				kvt_dev_free(dev, j.ws);
				printf("{\"bench\":\"decode_variant\",\"variant\":\"%s\",\"kernel\":%d,\"combine\":\"%s\","
				       "\"staged\":%s,\"codec\":\"%s\",\"batch\":%u,\"context\":%u,\"class_context\":%u,"
				       "\"kv_heads\":%u,\"group\":%u,\"head_dim\":%u,\"us\":%.2f,\"bytes_per_s\":%.4g,"
				       "\"vs_copy\":%.3f}\n",
				       variants[v].name, variants[v].version, variants[v].fused ? "fused" : "separate",
				       variants[v].staged ? "true" : "false", kvt_kv_codec_name(codec), B, ctx, classes[ci][1],
				       kvh, G, hd, t * 1e6, bytes / t, bytes / t / cbw);
				if (codec == KVT_KV_CODEC_F16) {
					f16_us[v] = t * 1e6;
					if (variants[v].version == 2) /* kernel 3 on fp16 is kernel 2 */
						f16_us[v + 4] = t * 1e6;
				} else if (classes[ci][1] >= 16384 && f16_us[v] > 0) {
					printf("{\"bench\":\"decode_8bit_ratio\",\"variant\":\"%s\",\"kernel\":%d,\"codec\":\"%s\","
					       "\"batch\":%u,\"context\":%u,\"class_context\":%u,\"f16_us\":%.2f,\"q8_us\":%.2f,"
					       "\"speedup\":%.3f}\n",
					       variants[v].name, variants[v].version, kvt_kv_codec_name(codec), B, ctx,
					       classes[ci][1], f16_us[v], t * 1e6, f16_us[v] / (t * 1e6));
				}
				fflush(stdout);
			}
			kvt_dev_free(dev, d_q);
			kvt_dev_free(dev, d_o);
			kvt_dev_free(dev, d_table);
			kvt_dev_free(dev, l.pool);
			free(table);
			free(hq);
		}
	}
	for (size_t k = ci; k < sizeof classes / sizeof classes[0]; k++)
		printf("{\"bench\":\"decode_variant\",\"skipped\":true,\"batch\":%u,\"context\":%u,\"budget_s\":%.0f}\n",
		       classes[k][0], classes[k][1] / shrink, budget);
	printf("{\"bench\":\"decode_variants_time\",\"seconds\":%.1f,\"classes\":%zu,\"variants\":%d}\n",
	       kvt_now_s() - t0, ci, N_VARIANTS);
	fflush(stdout);
	for (int v = 0; v < N_VARIANTS; v++)
		kvt_dev_destroy(vd[v]);
}

typedef struct codec_job {
	kvt_kv_pack_args p;
	kvt_kv_unpack_args u;
	bool unpack;
} codec_job;
static void do_codec(void *ctx)
{
	codec_job *j = ctx;
	if (j->unpack ? kvt_dev_kv_unpack(dev, NULL, &j->u) : kvt_dev_kv_pack(dev, NULL, &j->p))
		die("codec");
}

typedef struct page_job {
	kvt_stream *s;
	void *dev_pool, *host;
	size_t block_bytes;
	uint32_t n;
	int mode; /* 0: per-block D2H, 1: per-block H2D, 2: one D2H, 3: FP8 pack + one D2H per block */
	kvt_kv_pack_args pack;
	size_t packed;
} page_job;
static void do_page(void *ctx)
{
	page_job *j = ctx;
	if (j->mode == 2) {
		kvt_dev_copy_async(dev, j->s, j->host, j->dev_pool, j->block_bytes * j->n, KVT_COPY_D2H);
	} else if (j->mode == 3) {
		kvt_dev_kv_pack(dev, j->s, &j->pack);
		for (uint32_t b = 0; b < j->n; b++) /* scattered T1 slots, in reverse */
			kvt_dev_copy_async(dev, j->s, (char *)j->host + (size_t)(j->n - 1 - b) * j->packed,
					   (char *)j->pack.dst + (size_t)b * j->packed, j->packed, KVT_COPY_D2H);
	} else {
		for (uint32_t b = 0; b < j->n; b++) {
			char *hp = (char *)j->host + (size_t)(j->n - 1 - b) * j->block_bytes;
			char *dp = (char *)j->dev_pool + (size_t)b * j->block_bytes;
			if (j->mode == 0)
				kvt_dev_copy_async(dev, j->s, hp, dp, j->block_bytes, KVT_COPY_D2H);
			else
				kvt_dev_copy_async(dev, j->s, dp, hp, j->block_bytes, KVT_COPY_H2D);
		}
	}
	kvt_dev_stream_sync(dev, j->s);
}

static double page_time(page_job *j, int mode, int iters)
{
	j->mode = mode;
	return time_it(do_page, j, iters);
}

static void counters_json(const kvt_dev_counters *c, double per, char *buf, size_t cap)
{
	snprintf(buf, cap,
		 "\"kernels_per_token\":%.2f,\"graph_launches_per_token\":%.2f,\"graph_kernels_per_token\":%.2f,"
		 "\"host_syncs_per_token\":%.2f,\"copies_per_token\":%.2f,\"h2d_bytes_per_token\":%.1f,"
		 "\"d2h_bytes_per_token\":%.1f",
		 c->kernel_launches / per, c->graph_launches / per, c->graph_kernels / per, c->host_syncs / per,
		 c->copies / per, c->h2d_bytes / per, c->d2h_bytes / per);
}

static int32_t argmax_host(const float *x, uint32_t n)
{
	uint32_t b = 0;
	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return (int32_t)b;
}

/* 6: decode steps, classic and as graphs, with the counters per token. */
static void decode_steps(kvt_model *m, kvt_t0_pool *pool, double copy_bps, double wbytes)
{
	enum { P = 64, N = 64, BMAX = 32 };
	const uint32_t V = kvt_model_hparams_get(m)->n_vocab;
	float *logits = malloc((size_t)V * sizeof(float));
	static kvt_seq s[BMAX];
	kvt_seq *sp[BMAX];
	int32_t prompt[P], tok[BMAX], next[BMAX];
	char cj[512];
	for (int i = 0; i < P; i++)
		prompt[i] = 3 + (i * 13) % 290;
	for (int i = 0; i < BMAX; i++) {
		if (kvt_seq_init(&s[i], dev, pool, P + N + 1))
			die("seq");
		sp[i] = &s[i];
	}
	/* one token at a time through kvt_model_forward, the host picking */
	if (kvt_model_forward(m, &s[0], prompt, P, logits, 1))
		die("prefill");
	tok[0] = argmax_host(logits, V);
	kvt_dev_counters c;
	kvt_dev_counters_reset(dev);
	double t0 = kvt_now_s();
	for (int t = 0; t < N; t++) {
		if (kvt_model_forward(m, &s[0], &tok[0], 1, logits, 1))
			die("forward");
		tok[0] = argmax_host(logits, V);
	}
	double dt = kvt_now_s() - t0;
	kvt_dev_counters_get(dev, &c);
	counters_json(&c, N, cj, sizeof cj);
	printf("{\"bench\":\"decode_step\",\"path\":\"forward+host argmax\",\"batch\":1,\"tok_s\":%.1f,"
	       "\"weights_vs_copy\":%.3f,%s}\n", N / dt, wbytes * N / dt / copy_bps, cj);
	fflush(stdout);
	static const uint32_t batches[] = { 1, 8, 32 };
	for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
		const uint32_t B = batches[bi];
		for (uint32_t i = 0; i < B; i++) {
			kvt_seq_reset(&s[i]);
			if (kvt_model_forward(m, &s[i], prompt, P, logits, 1))
				die("prefill");
			tok[i] = argmax_host(logits, V);
		}
		int rc = kvt_model_decode(m, B, sp, tok, NULL, NULL, next); /* the capture, not timed */
		memcpy(tok, next, B * sizeof *tok);
		kvt_dev_counters_reset(dev);
		t0 = kvt_now_s();
		for (int t = 1; t < N && !rc; t++) {
			rc = kvt_model_decode(m, B, sp, tok, NULL, NULL, next);
			memcpy(tok, next, B * sizeof *tok);
		}
		if (rc) { /* a finding for the device run to report, not a reason to lose the other figures */
			printf("{\"bench\":\"decode_step\",\"batch\":%u,\"error\":%d}\n", B, rc);
			fflush(stdout);
			continue;
		}
		dt = kvt_now_s() - t0;
		kvt_dev_counters_get(dev, &c);
		counters_json(&c, (double)(N - 1) * B, cj, sizeof cj);
		printf("{\"bench\":\"decode_step\",\"path\":\"%s\",\"batch\":%u,\"steps_s\":%.1f,\"tok_s\":%.1f,"
		       "\"weights_vs_copy\":%.3f,%s}\n",
		       kvt_dev_graphs_supported(dev) ? "graph" : "decode (no graphs)", B, (N - 1) / dt, (N - 1) * B / dt,
		       wbytes * (N - 1) / dt / copy_bps, cj);
		fflush(stdout);
	}
	for (int i = 0; i < BMAX; i++)
		kvt_seq_deinit(&s[i]);
	free(logits);
}

static int e2e(double copy_bps, const char *dir, int layers)
{
	char path[512];
	snprintf(path, sizeof path, "%s/llama1b_synth.gguf", dir);
	kvt_synth_llama c;
	kvt_synth_llama_default(&c);
	c.n_layer = (uint32_t)layers; /* Llama-3.2-1B: 16 layers, 2048 wide, 32/8 heads, 8192 ff */
	c.n_embd = 2048;
	c.n_head = 32;
	c.n_head_kv = 8;
	c.n_ff = 8192;
	c.n_ctx = 4096;
	c.weight_type = 1; /* F16 */
	c.tied_embeddings = false;
	c.rope_base = 500000.0f;
	double t0 = kvt_now_s();
	if (kvt_synth_llama_write(&c, path))
		die("synth write");
	double t_write = kvt_now_s() - t0;
	kvt_gguf *g;
	kvt_model *m;
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_ctx = 4096;
	if (kvt_gguf_open(path, &g) || kvt_model_load(dev, g, &mc, &m))
		die("load 1B");
	kvt_gguf_close(g);
	kvt_kv_layout shape;
	kvt_model_kv_shape(m, 16, &shape);
	kvt_t0_pool *pool;
	kvt_seq s;
	if (kvt_t0_create(dev, &shape, 600, &pool) || kvt_seq_init(&s, dev, pool, 4096))
		die("pool");
	enum { P = 512, N = 128 };
	int32_t prompt[P];
	for (int i = 0; i < P; i++)
		prompt[i] = 3 + (i * 13) % 290;
	/* decode_tok_s: every step from the host (as on 2026-11-30); device_decode_tok_s: kvt_generate's default */
	kvt_gen_params gp = { .n_predict = N, .host_decode = true };
	kvt_gen_stats st, sd;
	/* warm-up run, then the measured one, each way */
	if (kvt_generate(m, &s, NULL, prompt, P, &gp, NULL, NULL, &st))
		die("generate");
	kvt_seq_reset(&s);
	if (kvt_generate(m, &s, NULL, prompt, P, &gp, NULL, NULL, &st))
		die("generate");
	gp.host_decode = false;
	for (int rep = 0; rep < 2; rep++) {
		kvt_seq_reset(&s);
		if (kvt_generate(m, &s, NULL, prompt, P, &gp, NULL, NULL, &sd))
			die("generate (device decode)");
	}
	kvt_seq_reset(&s);
	double tps = (st.n_gen - 1) / st.decode_s, dtps = (sd.n_gen - 1) / sd.decode_s;
	double wbytes = (double)kvt_model_weight_bytes(m);
	decode_steps(m, pool, copy_bps, wbytes);
	printf("{\"bench\":\"e2e_decode\",\"model\":\"synthetic llama-1B shape (%d layers, fp16)\",\"weight_bytes\":%.0f,"
	       "\"prompt\":%d,\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.1f,\"weight_bytes_per_s\":%.4g,"
	       "\"vs_copy\":%.3f,\"device_decode_tok_s\":%.1f,\"device_vs_copy\":%.3f,\"gguf_write_s\":%.1f}\n",
	       layers, wbytes, P, P / st.prefill_s, tps, wbytes * tps, wbytes * tps / copy_bps, dtps,
	       wbytes * dtps / copy_bps, t_write);
	kvt_seq_deinit(&s);
	kvt_t0_destroy(pool);
	kvt_model_destroy(m);
	unlink(path);
	return 0;
}

/* ---- 7: resume TTFT from T1, sequential vs layer-wise pipelined (bench_gpu DIR --resume-ttft) ---- */

/*
 * The Llama-1B shape of e2e (16 layers, 2048 wide, 8 KV heads of 64, fp16
 * weights), with a context of 32K + the turn. The history's K/V is not
 * computed (a 32K prefill would take most of the device check): T0 slots are
 * filled with a fixed pattern of fp16 values, registered with a real
 * manager as a chain, and demoted to T1 by the manager itself
 * (kvt_tm_reserve_t0). The values do not change what is timed. Per T1 codec
 * (f16, fp8) and history (4K, 16K, 32K tokens: the first blocks of one
 * chain), REPS times, medians:
 *   sequential: kvt_tm_promote (the I/O threads, batch by batch), then the
 *               prefill of the turn (kvt_model_forward, 1 logit row);
 *   pipelined:  kvt_tm_promote_layered (RT_GROUPS groups), the gated prefill,
 *               kvt_tm_layered_finish;
 *   copy:       kvt_tm_promote_layered + finish alone (the layered copy);
 *   compute:    the prefill alone over the prefix already in T0.
 * TTFT here is promote + prefill to the first token's logits on the host
 * (tokenizing, the lookup and sampling are the same either way). Between
 * runs the prefix goes back to T1 only (its T0 copies are dropped: T1 keeps
 * them). One untimed round at the smallest history warms up first. `--tiny` runs a 4-layer, 256-wide model at 256/512-token histories
 * and `--cpu` the CPU backend: only to prove the mode runs where there is no
 * GPU; those are not GPU figures.
 */
#define RT_NEW 256   /* tokens of the new turn */
#define RT_GROUPS 4  /* layer groups of the pipelined promotion */
#define RT_REPS 3    /* runs per figure (median) */
/* the mode stops starting new configurations past this (KVT_RESUME_BUDGET_S; device check: 8 min in all) */
static double rt_budget_s(void)
{
	const char *e = getenv("KVT_RESUME_BUDGET_S");
	return e && atof(e) > 0 ? atof(e) : 150.0;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_dbl);
	return v[n / 2];
}

typedef struct rt_ctx {
	kvt_model *m;
	kvt_t0_pool *pool;
	kvt_btable *bt;
	kvt_tm *tm;
	uint8_t (*h)[KVT_HASH_BYTES]; /* the history's chain */
	int32_t *slots;               /* [blocks] promoted slots */
	int32_t turn[RT_NEW];         /* the new turn's tokens */
	uint32_t n_new;               /* tokens of the turn used */
	float *logits;                /* [n_vocab] */
} rt_ctx;

/* The prefix back in T1 only (T0 copies dropped). */
static void rt_to_t1(rt_ctx *c)
{
	if (kvt_tm_reserve_t0(c->tm, kvt_t0_n_slots(c->pool)))
		die("resume: back to T1");
}

/* Prefill the turn over nb promoted blocks (slots with the caller's refs, dropped here); returns seconds. */
static double rt_prefill(rt_ctx *c, uint32_t nb, const kvt_model_gate *gate)
{
	kvt_seq s;
	if (kvt_seq_init(&s, dev, c->pool, nb * 16 + c->n_new + 1))
		die("resume: seq");
	memcpy(s.blocks, c->slots, nb * sizeof(int32_t));
	s.n_blocks = nb;
	s.n_tokens = nb * 16;
	s.n_synced = 0;
	double t0 = kvt_now_s();
	if (kvt_model_forward_gated(c->m, &s, c->turn, c->n_new, c->logits, 1, gate))
		die("resume: prefill");
	double dt = kvt_now_s() - t0;
	kvt_seq_deinit(&s);
	return dt;
}

static void rt_run(rt_ctx *c, uint32_t hist, double *seq_s, double *pipe_s, double *copy_s,
		   double *compute_s, double *promote_s, uint32_t *lpg_out)
{
	const uint32_t nb = hist / 16;
	int *res = malloc(nb * sizeof(int));
	double vs[RT_REPS], vp[RT_REPS], vc[RT_REPS], vk[RT_REPS], vpr[RT_REPS];
	for (int r = 0; r < RT_REPS; r++) {
		/* sequential: promote, then the prefill; then the prefill alone over the prefix in T0 */
		rt_to_t1(c);
		double t0 = kvt_now_s();
		if (kvt_tm_promote(c->tm, nb, (const uint8_t(*)[KVT_HASH_BYTES])c->h, c->slots, res))
			die("resume: promote");
		double t1 = kvt_now_s();
		rt_prefill(c, nb, NULL);
		vs[r] = kvt_now_s() - t0;
		vpr[r] = t1 - t0;
		int rc = kvt_tm_promote(c->tm, nb, (const uint8_t(*)[KVT_HASH_BYTES])c->h, c->slots, res); /* in T0: refs */
		if (rc)
			die("resume: take the prefix in T0");
		vk[r] = rt_prefill(c, nb, NULL);
		/* pipelined */
		rt_to_t1(c);
		kvt_tm_layered *lp;
		t0 = kvt_now_s();
		if (kvt_tm_promote_layered(c->tm, nb, (const uint8_t(*)[KVT_HASH_BYTES])c->h, RT_GROUPS, c->slots, &lp))
			die("resume: layered promote");
		kvt_event *const *ev;
		kvt_model_gate g = { 0 };
		kvt_tm_layered_groups(lp, &ev, &g.n_groups, &g.layers_per_group);
		g.events = ev;
		*lpg_out = g.layers_per_group;
		kvt_seq s;
		if (kvt_seq_init(&s, dev, c->pool, nb * 16 + c->n_new + 1))
			die("resume: seq");
		memcpy(s.blocks, c->slots, nb * sizeof(int32_t));
		s.n_blocks = nb;
		s.n_tokens = nb * 16;
		s.n_synced = 0;
		if (kvt_model_forward_gated(c->m, &s, c->turn, c->n_new, c->logits, 1, &g))
			die("resume: gated prefill");
		if (kvt_tm_layered_finish(c->tm, lp))
			die("resume: layered finish");
		vp[r] = kvt_now_s() - t0;
		kvt_seq_deinit(&s);
		/* the layered copy alone */
		rt_to_t1(c);
		t0 = kvt_now_s();
		if (kvt_tm_promote_layered(c->tm, nb, (const uint8_t(*)[KVT_HASH_BYTES])c->h, RT_GROUPS, c->slots, &lp) ||
		    kvt_tm_layered_finish(c->tm, lp))
			die("resume: layered copy");
		vc[r] = kvt_now_s() - t0;
		for (uint32_t i = 0; i < nb; i++)
			kvt_t0_unref(c->pool, c->slots[i]);
	}
	*seq_s = median(vs, RT_REPS);
	*pipe_s = median(vp, RT_REPS);
	*copy_s = median(vc, RT_REPS);
	*compute_s = median(vk, RT_REPS);
	*promote_s = median(vpr, RT_REPS);
	free(res);
}

static int resume_ttft_main(int argc, char **argv)
{
	const char *dir = argv[1];
	bool tiny = false, cpu = false;
	for (int i = 3; i < argc; i++) {
		if (!strcmp(argv[i], "--tiny"))
			tiny = true;
		else if (!strcmp(argv[i], "--cpu"))
			cpu = true;
		else {
			fprintf(stderr, "bench_gpu --resume-ttft: unknown option %s (--tiny, --cpu)\n", argv[i]);
			return 2;
		}
	}
	const double t_begin = kvt_now_s();
	kvt_dev_config dc = { .kind = cpu ? KVT_DEV_CPU : KVT_DEV_CUDA };
	if (kvt_dev_create(&dc, &dev)) {
		fprintf(stderr, "bench_gpu: no %s device\n", cpu ? "CPU" : "CUDA");
		return 77;
	}
	static const uint32_t hists_full[] = { 4096, 16384, 32768 }, hists_tiny[] = { 256, 512 };
	const uint32_t *hists = tiny ? hists_tiny : hists_full;
	const uint32_t n_hists = tiny ? 2 : 3, max_hist = hists[n_hists - 1];
	printf("{\"bench\":\"device\",\"name\":\"%s\",\"mode\":\"resume_ttft%s\"}\n", kvt_dev_name(dev),
	       tiny ? " tiny" : "");
	fflush(stdout);

	char path[512];
	snprintf(path, sizeof path, "%s/resume_synth.gguf", dir);
	kvt_synth_llama sc;
	kvt_synth_llama_default(&sc);
	if (tiny) {
		sc.n_layer = 4, sc.n_embd = 256, sc.n_head = 4, sc.n_head_kv = 2, sc.n_ff = 512;
	} else { /* e2e's Llama-1B shape */
		sc.n_layer = 16, sc.n_embd = 2048, sc.n_head = 32, sc.n_head_kv = 8, sc.n_ff = 8192;
	}
	sc.n_ctx = max_hist + RT_NEW + 16;
	sc.weight_type = 1; /* F16 */
	sc.tied_embeddings = false;
	sc.rope_base = 500000.0f;
	if (kvt_synth_llama_write(&sc, path))
		die("resume: synth write");
	rt_ctx c = { 0 };
	c.n_new = tiny ? 32 : RT_NEW;
	kvt_gguf *g;
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_ctx = sc.n_ctx;
	if (kvt_gguf_open(path, &g) || kvt_model_load(dev, g, &mc, &c.m))
		die("resume: load");
	kvt_gguf_close(g);
	unlink(path);
	const uint32_t V = kvt_model_hparams_get(c.m)->n_vocab, nb_max = max_hist / 16;
	kvt_kv_layout shape;
	kvt_model_kv_shape(c.m, 16, &shape);
	if (kvt_t0_create(dev, &shape, nb_max + c.n_new / 16 + 8, &c.pool) || kvt_btable_create(16, 0, &c.bt))
		die("resume: pool");
	c.logits = malloc((size_t)V * sizeof(float));
	c.slots = malloc(nb_max * sizeof(int32_t));
	c.h = malloc((size_t)nb_max * KVT_HASH_BYTES);
	int32_t *toks = malloc((size_t)max_hist * sizeof(int32_t));
	for (uint32_t i = 0; i < max_hist; i++)
		toks[i] = 3 + (int32_t)((i * 13) % 290);
	for (uint32_t i = 0; i < c.n_new; i++)
		c.turn[i] = 5 + (int32_t)((i * 7) % 280);
	uint8_t fp[32] = { 1 }, salt[32] = { 0 }, root[32];
	uint32_t n_h;
	if (kvt_hash_root(fp, KVT_KV_LAYOUT_VERSION, 16, salt, root) ||
	    kvt_hash_chain(root, toks, max_hist, 16, c.h, nb_max, &n_h) || n_h != nb_max)
		die("resume: hashes");
	/* one block of fp16 values in [-2, 2] */
	const size_t bb = kvt_t0_block_bytes(c.pool);
	uint16_t *hb = malloc(bb);
	uint64_t x = 88172645463325252ULL;
	for (size_t i = 0; i < bb / 2; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		hb[i] = kvt_f32_to_f16(((float)(x % 2001) - 1000.0f) / 500.0f);
	}
	double total_seq = 0, total_pipe = 0;
	for (int codec = KVT_KV_CODEC_F16; codec <= KVT_KV_CODEC_FP8; codec++) {
		kvt_tm_config tc;
		kvt_tm_config_default(&tc);
		tc.dev = dev;
		tc.t0 = c.pool;
		tc.bt = c.bt;
		tc.t1_slots = nb_max + 8;
		tc.t1_codec = codec;
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			tc.high[t] = 1.0f, tc.low[t] = 0.99f; /* no eviction but the bench's own */
		if (kvt_tm_create(&tc, &c.tm))
			die("resume: manager");
		/* the history: registered from T0 slots, then demoted to T1 by the manager */
		double t_fill = kvt_now_s();
		for (uint32_t i = 0; i < nb_max; i++) {
			int32_t s;
			if (kvt_t0_alloc(c.pool, &s) ||
			    kvt_dev_copy_h2d(dev, (char *)kvt_t0_layout(c.pool)->pool + (size_t)s * bb, hb, bb) ||
			    kvt_tm_register(c.tm, c.h[i], i ? c.h[i - 1] : root, toks + (size_t)i * 16, s))
				die("resume: history");
			kvt_t0_unref(c.pool, s);
		}
		kvt_dev_sync(dev);
		rt_to_t1(&c);
		t_fill = kvt_now_s() - t_fill;
		{ /* warm-up, not reported: first launches, the layered stream, events and staging */
			double w[5];
			uint32_t wl;
			rt_run(&c, hists[0], &w[0], &w[1], &w[2], &w[3], &w[4], &wl);
		}
		for (uint32_t hi = 0; hi < n_hists; hi++) {
			if (kvt_now_s() - t_begin > rt_budget_s()) {
				printf("{\"bench\":\"resume_ttft\",\"t1_codec\":\"%s\",\"history\":%u,\"skipped\":\"time budget "
				       "of %.0f s spent\"}\n", kvt_kv_codec_name(codec), hists[hi], rt_budget_s());
				continue;
			}
			double sq, pp, cp, cm, pr;
			uint32_t lpg = 0;
			rt_run(&c, hists[hi], &sq, &pp, &cp, &cm, &pr, &lpg);
			const double mx = cp > cm ? cp : cm;
			total_seq += sq;
			total_pipe += pp;
			printf("{\"bench\":\"resume_ttft\",\"model\":\"synthetic llama%s (%u layers, fp16)\",\"t1_codec\":\"%s\","
			       "\"history\":%u,\"new_tokens\":%u,\"groups\":%u,\"layers_per_group\":%u,\"seq_ttft_ms\":%.2f,"
			       "\"seq_promote_ms\":%.2f,\"pipe_ttft_ms\":%.2f,\"copy_ms\":%.2f,\"compute_ms\":%.2f,"
			       "\"pipe_vs_seq\":%.3f,\"pipe_vs_max\":%.3f,\"sum_vs_max\":%.3f,\"t1_bytes\":%zu,"
			       "\"fill_s\":%.1f,\"reps\":%d}\n",
			       tiny ? " tiny" : "-1B shape", sc.n_layer, kvt_kv_codec_name(codec), hists[hi], c.n_new,
			       sc.n_layer / lpg, lpg, sq * 1e3, pr * 1e3, pp * 1e3, cp * 1e3, cm * 1e3, pp / sq, pp / mx,
			       (cp + cm) / mx, kvt_t1_slot_bytes(kvt_tm_t1(c.tm)) * (hists[hi] / 16), t_fill, RT_REPS);
			fflush(stdout);
		}
		if (kvt_tm_check(c.tm))
			die("resume: manager invariants");
		kvt_tm_destroy(c.tm);
		c.tm = NULL;
	}
	printf("{\"bench\":\"resume_ttft_done\",\"wall_s\":%.1f,\"seq_total_ms\":%.1f,\"pipe_total_ms\":%.1f}\n",
	       kvt_now_s() - t_begin, total_seq * 1e3, total_pipe * 1e3);
	free(hb);
	free(toks);
	free(c.h);
	free(c.slots);
	free(c.logits);
	kvt_btable_destroy(c.bt);
	kvt_t0_destroy(c.pool);
	kvt_model_destroy(c.m);
	kvt_dev_destroy(dev);
	return 0;
}

/* ---- 8: the batch sweep ---- */

#ifdef KVT_BENCH_CUBLAS
int bench_cublas_best(int M, int N, int K, double *best_s, int *n_tried); /* bench/cublas_ref.cu */
#endif

typedef struct sweep_model {
	const char *name;        /* shape name in the JSON lines */
	kvt_model_hparams hp;    /* what kvt_model_create_random takes */
} sweep_model;

/* dst (empty) holds its own copy of src's blocks, so attention reads distinct KV per sequence. */
static void clone_context(kvt_t0_pool *pool, kvt_seq *dst, const kvt_seq *src)
{
	const size_t bb = kvt_t0_block_bytes(pool);
	uint8_t *base = kvt_t0_layout(pool)->pool;
	kvt_seq_reset(dst);
	for (uint32_t b = 0; b < src->n_blocks; b++) {
		if (kvt_t0_alloc(pool, &dst->blocks[b]))
			die("pool (clone)");
		dst->n_blocks = b + 1;
		kvt_dev_copy_d2d(dev, base + (size_t)dst->blocks[b] * bb, base + (size_t)src->blocks[b] * bb, bb);
	}
	dst->n_tokens = src->n_tokens;
}

/* Device bytes of dtype for n_rows x n_in, filled with a pattern that is valid for the dtype. */
static void *pattern_weights(int dtype, uint32_t n_rows, uint32_t n_in)
{
	const size_t bytes = kvt_dtype_row_bytes(dtype, n_in) * n_rows, unit = dtype == KVT_DTYPE_Q4_K ? 144 : 2;
	const size_t chunk = ((size_t)16 << 20) / unit * unit;
	uint8_t *h = malloc(chunk), *d = dalloc(bytes);
	uint64_t r = 0x9e3779b97f4a7c15ULL;
	for (size_t i = 0; i < chunk; i += unit) {
		r ^= r << 13, r ^= r >> 7, r ^= r << 17;
		if (dtype == KVT_DTYPE_Q4_K) {
			for (size_t j = 4; j < 144; j++)
				h[i + j] = (uint8_t)(r >> (j % 8 * 8)) ^ (uint8_t)j;
			uint16_t dd = kvt_f32_to_f16(1e-4f), dm = kvt_f32_to_f16(7.5e-4f);
			memcpy(h + i, &dd, 2);
			memcpy(h + i + 2, &dm, 2);
		} else {
			uint16_t v = kvt_f32_to_f16((float)(r >> 40) / (float)(1 << 24) * 0.04f - 0.02f);
			memcpy(h + i, &v, 2);
		}
	}
	void *staged = dalloc(chunk);
	kvt_dev_copy_h2d(dev, staged, h, chunk);
	for (size_t done = 0; done < bytes; done += chunk)
		kvt_dev_copy_d2d(dev, d + done, staged, bytes - done < chunk ? bytes - done : chunk);
	kvt_dev_sync(dev);
	kvt_dev_free(dev, staged);
	free(h);
	return d;
}

typedef struct gemm_job {
	int kind;              /* 0 norm_matmul, 1 matmul (accumulate), 2 matmul_swiglu */
	kvt_norm_matmul_args nm;
	kvt_matmul_args mm;
	kvt_matmul_swiglu_args sw;
	void *ws;
} gemm_job;
static void do_gemm(void *ctx)
{
	gemm_job *j = ctx;
	int rc = j->kind == 0 ? kvt_dev_norm_matmul(dev, &j->nm, j->ws)
		 : j->kind == 1 ? kvt_dev_matmul(dev, &j->mm, j->ws)
				: kvt_dev_matmul_swiglu(dev, &j->sw, j->ws);
	if (rc)
		die("gemm");
}

/*
 * The batch-64 GEMMs of a model shape through the ops the model calls for
 * them (norm fused into q, k, v and output; o and down accumulate into the
 * residual; gate + up with SwiGLU in one op), against cuBLAS's best.
 */
static void gemm_vs_cublas(const sweep_model *sm, int dtype, uint32_t M, int iters)
{
	const kvt_model_hparams *hp = &sm->hp;
	const uint32_t E = hp->n_embd, Q = hp->n_head * hp->head_dim, KV = hp->n_head_kv * hp->head_dim;
	const uint32_t F = hp->n_ff, V = hp->n_vocab;
	const struct { const char *name; int kind; uint32_t n_in, n_out, per_step, n_gemms; } shapes[] = {
		{ "q", 0, E, Q, hp->n_layer, 1 },       { "k", 0, E, KV, hp->n_layer, 1 },
		{ "v", 0, E, KV, hp->n_layer, 1 },      { "o", 1, Q, E, hp->n_layer, 1 },
		{ "gate_up", 2, E, F, hp->n_layer, 2 }, { "down", 1, F, E, hp->n_layer, 1 },
		{ "output", 0, E, V, 1, 1 },
	};
	const uint32_t widest = F > E ? (F > Q ? F : Q) : (E > Q ? E : Q);
	float *hx = malloc((size_t)M * widest * sizeof(float)), *ones = malloc(widest * sizeof(float));
	for (size_t i = 0; i < (size_t)M * widest; i++)
		hx[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
	for (uint32_t i = 0; i < widest; i++)
		ones[i] = 1.0f;
	float *x = dalloc((size_t)M * widest * sizeof(float)), *nw = dalloc(widest * sizeof(float));
	float *y = dalloc((size_t)M * (V > F ? V : F) * sizeof(float)), *y2 = dalloc((size_t)M * F * sizeof(float));
	kvt_dev_copy_h2d(dev, x, hx, (size_t)M * widest * sizeof(float));
	kvt_dev_copy_h2d(dev, nw, ones, widest * sizeof(float));
	kvt_dev_copy_h2d(dev, y, hx, (size_t)M * E * sizeof(float)); /* a residual to accumulate into */
	double sum_ours = 0, sum_ref = 0;
	bool all_ref = true;
	for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
		void *w = pattern_weights(dtype, shapes[i].n_out, shapes[i].n_in);
		void *w2 = shapes[i].kind == 2 ? pattern_weights(dtype, shapes[i].n_out, shapes[i].n_in) : NULL;
		gemm_job j = { .kind = shapes[i].kind };
		kvt_matmul_args mm = { .n_rows = M, .n_in = shapes[i].n_in, .n_out = shapes[i].n_out, .w_dtype = dtype,
				       .w = w, .x = x, .y = y, .accumulate = shapes[i].kind == 1 };
		size_t wsb;
		if (j.kind == 0) {
			j.nm = (kvt_norm_matmul_args){ .mm = mm, .norm_w = nw, .eps = 1e-5f };
			wsb = kvt_dev_norm_matmul_workspace_bytes(dev, &j.nm);
		} else if (j.kind == 1) {
			j.mm = mm;
			wsb = kvt_dev_matmul_workspace_bytes(dev, &j.mm);
		} else {
			j.sw = (kvt_matmul_swiglu_args){ .n_rows = M, .n_in = E, .n_out = F, .w_dtype = dtype, .w_gate = w,
							 .w_up = w2, .x = x, .y = y2, .norm_w = nw, .eps = 1e-5f };
			wsb = kvt_dev_matmul_swiglu_workspace_bytes(dev, &j.sw);
		}
		j.ws = wsb ? dalloc(wsb) : NULL;
		double t = time_it(do_gemm, &j, iters);
		double t_ref = -1;
		int n_tried = 0;
#ifdef KVT_BENCH_CUBLAS
		double best;
		if (kvt_dev_kind(dev) == KVT_DEV_CUDA &&
		    bench_cublas_best((int)M, (int)shapes[i].n_out, (int)shapes[i].n_in, &best, &n_tried) == 0)
			t_ref = best * shapes[i].n_gemms;
#endif
		const double flops = 2.0 * M * shapes[i].n_in * shapes[i].n_out * shapes[i].n_gemms;
		char ref[160] = "\"cublas_us\":null,\"vs_cublas\":null";
		if (t_ref > 0)
			snprintf(ref, sizeof ref, "\"cublas_us\":%.2f,\"cublas_algos\":%d,\"vs_cublas\":%.3f", t_ref * 1e6,
				 n_tried, t_ref / t);
		printf("{\"bench\":\"gemm_vs_cublas\",\"model\":\"%s\",\"dtype\":\"%s\",\"rows\":%u,\"shape\":\"%s\","
		       "\"n_in\":%u,\"n_out\":%u,\"gemms\":%u,\"per_step\":%u,\"us\":%.2f,\"tflops\":%.2f,%s%s}\n",
		       sm->name, kvt_dtype_name(dtype), M, shapes[i].name, shapes[i].n_in, shapes[i].n_out, shapes[i].n_gemms,
		       shapes[i].per_step, t * 1e6, flops / t / 1e12, ref,
		       dtype != KVT_DTYPE_F16 ? ",\"reference\":\"cuBLAS fp16 on the widened shape\"" : "");
		fflush(stdout);
		sum_ours += t * shapes[i].per_step;
		sum_ref += t_ref * shapes[i].per_step;
		all_ref = all_ref && t_ref > 0;
		kvt_dev_free(dev, j.ws);
		kvt_dev_free(dev, w);
		kvt_dev_free(dev, w2);
	}
	if (all_ref)
		printf("{\"bench\":\"gemm_vs_cublas_step\",\"model\":\"%s\",\"dtype\":\"%s\",\"rows\":%u,\"us\":%.1f,"
		       "\"cublas_us\":%.1f,\"vs_cublas\":%.3f}\n",
		       sm->name, kvt_dtype_name(dtype), M, sum_ours * 1e6, sum_ref * 1e6, sum_ref / sum_ours);
	else
		printf("{\"bench\":\"gemm_vs_cublas_step\",\"model\":\"%s\",\"dtype\":\"%s\",\"rows\":%u,\"us\":%.1f,"
		       "\"cublas_us\":null,\"vs_cublas\":null,\"why\":\"no cuBLAS reference in this build or on this device\"}\n",
		       sm->name, kvt_dtype_name(dtype), M, sum_ours * 1e6);
	fflush(stdout);
	kvt_dev_free(dev, x);
	kvt_dev_free(dev, nw);
	kvt_dev_free(dev, y);
	kvt_dev_free(dev, y2);
	free(hx);
	free(ones);
}

/* Decode tokens/s of one model at each batch size, its weights' streaming fraction per batch. */
static void sweep_one(const sweep_model *sm, int dtype, double cbw, uint32_t ctx, int steps, int gemm_iters)
{
	static const uint32_t batches[] = { 1, 8, 32, 64, 128 };
	enum { BMAX = 128 };
	const kvt_model_hparams *hp = &sm->hp;
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_ctx = ctx + (uint32_t)steps + 16 < BMAX ? BMAX : ctx + (uint32_t)steps + 16; /* max_batch <= max_ctx */
	mc.max_batch = BMAX;
	kvt_model *m;
	double t0 = kvt_now_s();
	int rc = kvt_model_create_random(dev, hp, dtype, 42, &mc, &m);
	if (rc) {
		printf("{\"bench\":\"batch_sweep\",\"model\":\"%s\",\"dtype\":\"%s\",\"error\":%d}\n", sm->name,
		       kvt_dtype_name(dtype), rc);
		fflush(stdout);
		return;
	}
	kvt_dev_sync(dev);
	const double t_make = kvt_now_s() - t0, wbytes = (double)kvt_model_weight_bytes(m);
	kvt_kv_layout shape;
	kvt_model_kv_shape(m, 16, &shape);
	const uint32_t per_seq = (mc.max_ctx + 15) / 16;
	kvt_t0_pool *pool;
	if (kvt_t0_create(dev, &shape, (BMAX + 1) * per_seq, &pool))
		die("pool (sweep)");
	static kvt_seq s[BMAX + 1];
	kvt_seq *sp[BMAX];
	int32_t tok[BMAX], next[BMAX];
	for (int i = 0; i <= BMAX; i++) {
		if (kvt_seq_init(&s[i], dev, pool, mc.max_ctx))
			die("seq (sweep)");
		if (i < BMAX)
			sp[i] = &s[i];
	}
	int32_t *prompt = malloc(ctx * sizeof(int32_t));
	for (uint32_t i = 0; i < ctx; i++)
		prompt[i] = (int32_t)(3 + (i * 13) % (hp->n_vocab - 3));
	if (kvt_model_forward(m, &s[BMAX], prompt, ctx, NULL, 0)) /* the context every sequence starts from */
		die("prefill (sweep)");
	const double kv_per_tok = (double)hp->n_layer * 2 * hp->n_head_kv * hp->head_dim * 2; /* fp16 K + V */
	for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++) {
		const uint32_t B = batches[bi];
		for (uint32_t i = 0; i < B; i++) {
			clone_context(pool, &s[i], &s[BMAX]);
			tok[i] = (int32_t)(3 + i);
		}
		kvt_dev_sync(dev);
		rc = kvt_model_decode(m, B, sp, tok, NULL, NULL, next); /* the capture, not timed */
		memcpy(tok, next, B * sizeof *tok);
		kvt_dev_counters c;
		kvt_dev_counters_reset(dev);
		double ts = kvt_now_s();
		for (int t = 0; t < steps && !rc; t++) {
			rc = kvt_model_decode(m, B, sp, tok, NULL, NULL, next);
			memcpy(tok, next, B * sizeof *tok);
		}
		const double dt = kvt_now_s() - ts;
		kvt_dev_counters_get(dev, &c);
		if (rc) {
			printf("{\"bench\":\"batch_sweep\",\"model\":\"%s\",\"dtype\":\"%s\",\"batch\":%u,\"error\":%d}\n",
			       sm->name, kvt_dtype_name(dtype), B, rc);
			fflush(stdout);
			continue;
		}
		char cj[512];
		counters_json(&c, (double)steps * B, cj, sizeof cj);
		const double steps_s = steps / dt;
		printf("{\"bench\":\"batch_sweep\",\"model\":\"%s\",\"dtype\":\"%s\",\"path\":\"%s\",\"batch\":%u,"
		       "\"context\":%u,\"steps\":%d,\"step_ms\":%.3f,\"tok_s\":%.1f,\"weight_bytes\":%.0f,"
		       "\"kv_bytes_per_step\":%.0f,\"copy_bytes_per_s\":%.4g,\"limit_steps_s\":%.1f,\"weights_vs_copy\":%.3f,"
		       "\"make_s\":%.2f,%s}\n",
		       sm->name, kvt_dtype_name(dtype), kvt_dev_graphs_supported(dev) ? "graph" : "decode (no graphs)", B, ctx,
		       steps, dt / steps * 1e3, steps_s * B, wbytes, kv_per_tok * (ctx + steps / 2.0) * B, cbw, cbw / wbytes,
		       steps_s * wbytes / cbw, t_make, cj);
		fflush(stdout);
	}
	for (int i = 0; i <= BMAX; i++)
		kvt_seq_deinit(&s[i]);
	free(prompt);
	kvt_t0_destroy(pool);
	kvt_model_destroy(m);
	gemm_vs_cublas(sm, dtype, 64, gemm_iters);
}

/*
 * The sweep, bounded by budget_s: a model whose turn comes after the budget
 * is spent gets a "skipped" line instead (the device check has 8 minutes for
 * everything).
 */
static int batch_sweep(double cbw, bool tiny, double budget_s)
{
	const kvt_model_hparams l1b = { .n_layer = 16, .n_embd = 2048, .n_head = 32, .n_head_kv = 8, .head_dim = 64,
					.n_ff = 8192, .n_vocab = 128256, .n_ctx_train = 131072, .rope_base = 500000.0f,
					.rms_eps = 1e-5f, .tied_embeddings = true };
	const kvt_model_hparams l8b = { .n_layer = 32, .n_embd = 4096, .n_head = 32, .n_head_kv = 8, .head_dim = 128,
					.n_ff = 14336, .n_vocab = 128256, .n_ctx_train = 8192, .rope_base = 500000.0f,
					.rms_eps = 1e-5f, .tied_embeddings = false };
	const kvt_model_hparams tin = { .n_layer = 2, .n_embd = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
					.n_ff = 512, .n_vocab = 1024, .n_ctx_train = 1024, .rope_base = 10000.0f,
					.rms_eps = 1e-5f, .tied_embeddings = false };
	const sweep_model full[] = { { "llama-3.2-1B shape", l1b }, { "llama-3-8B shape", l8b } };
	const sweep_model small[] = { { "tiny (2 layers, 256 wide; not a figure)", tin } };
	const sweep_model *list = tiny ? small : full;
	const size_t n = tiny ? 1 : 2;
	static const int dtypes[] = { KVT_DTYPE_F16, KVT_DTYPE_Q4_K };
	const double t0 = kvt_now_s();
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < 2; k++) {
			if (kvt_now_s() - t0 > budget_s) {
				printf("{\"bench\":\"batch_sweep\",\"model\":\"%s\",\"dtype\":\"%s\",\"skipped\":"
				       "\"the sweep's %.0f s budget was spent\"}\n", list[i].name, kvt_dtype_name(dtypes[k]), budget_s);
				continue;
			}
			sweep_one(&list[i], dtypes[k], cbw, tiny ? 64 : 512, tiny ? 3 : 16, tiny ? 2 : 20);
		}
	printf("{\"bench\":\"batch_sweep_time\",\"seconds\":%.1f,\"budget_s\":%.0f}\n", kvt_now_s() - t0, budget_s);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 2 && strcmp(argv[2], "--batch-sweep") == 0) {
		bool tiny = false, cpu = false;
		double budget = 180;
		for (int i = 3; i < argc; i++) {
			if (!strcmp(argv[i], "--tiny"))
				tiny = true;
			else if (!strcmp(argv[i], "--cpu"))
				cpu = true;
			else if (!strncmp(argv[i], "--budget=", 9))
				budget = atof(argv[i] + 9);
			else {
				fprintf(stderr, "bench_gpu: --batch-sweep takes --tiny, --cpu, --budget=SECONDS, not %s\n",
					argv[i]);
				return 2;
			}
		}
		kvt_dev_config sc = { .kind = cpu ? KVT_DEV_CPU : KVT_DEV_CUDA };
		if (kvt_dev_create(&sc, &dev)) {
			fprintf(stderr, "bench_gpu: no %s device\n", cpu ? "cpu" : "CUDA");
			return 77;
		}
		printf("{\"bench\":\"device\",\"name\":\"%s\"}\n", kvt_dev_name(dev));
		const size_t cb = tiny ? (size_t)64 << 20 : (size_t)1 << 30;
		const double cbw = copy_bw(cb);
		printf("{\"bench\":\"d2d_copy\",\"bytes\":%zu,\"bytes_per_s\":%.4g}\n", cb, cbw);
		int rc = batch_sweep(cbw, tiny, budget);
		kvt_dev_destroy(dev);
		return rc;
	}
	if (argc == 3 && strcmp(argv[1], "--synth") == 0) {
		/* The model of bench/gpu_daemon_smoke.py: 4 layers, 512 wide, 8 heads of 64 over 2 KV
		 * heads (decode attention's kernels, not the fallback), fp16, 2048 context. */
		kvt_synth_llama c;
		kvt_synth_llama_default(&c);
		c.n_layer = 4;
		c.n_embd = 512;
		c.n_head = 8;
		c.n_head_kv = 2;
		c.n_ff = 1024;
		c.n_ctx = 2048;
		c.weight_type = 1; /* F16 */
		c.tied_embeddings = false; /* tied random embeddings make greedy decoding repeat one token */
		c.seed = 7;
		return kvt_synth_llama_write(&c, argv[2]) ? 1 : 0;
	}
	if ((argc == 3 || argc == 4) && strcmp(argv[1], "--synth-1b") == 0) {
		/* The Llama-3.2-1B shape (16 layers, 2048 wide, 32/8 heads, 8192 ff; the synthetic
		 * vocabulary) bench/bench_startup.py serves, in q8_0 (default) or f16. */
		kvt_synth_llama c;
		kvt_synth_llama_default(&c);
		c.n_layer = 16;
		c.n_embd = 2048;
		c.n_head = 32;
		c.n_head_kv = 8;
		c.n_ff = 8192;
		c.n_ctx = 4096;
		c.rope_base = 500000.0f;
		c.tied_embeddings = false;
		const char *type = argc == 4 ? argv[3] : "q8_0";
		if (strcmp(type, "q8_0") && strcmp(type, "f16")) {
			fprintf(stderr, "bench_gpu --synth-1b: type '%s' is not q8_0 or f16\n", type);
			return 2;
		}
		c.weight_type = strcmp(type, "f16") ? KVT_GGML_Q8_0 : KVT_GGML_F16;
		return kvt_synth_llama_write(&c, argv[2]) ? 1 : 0;
	}
	if (argc > 2 && strcmp(argv[2], "--resume-ttft") == 0)
		return resume_ttft_main(argc, argv);
	kvt_dev_config dc = { .kind = KVT_DEV_CUDA };
	if (kvt_dev_create(&dc, &dev)) {
		fprintf(stderr, "bench_gpu: no CUDA device\n");
		return 77;
	}
	const char *dir = argc > 1 ? argv[1] : "/tmp";
	printf("{\"bench\":\"device\",\"name\":\"%s\"}\n", kvt_dev_name(dev));
	fflush(stdout);

	const bool variants_only = argc > 2 && strcmp(argv[2], "--variants") == 0;
	const size_t copy_bytes = variants_only && getenv("KVT_BENCH_VARIANTS_SMALL") ? (size_t)1 << 24 : (size_t)1 << 30;
	const double cbw = copy_bw(copy_bytes);
	printf("{\"bench\":\"d2d_copy\",\"bytes\":%zu,\"bytes_per_s\":%.4g}\n", copy_bytes, cbw);
	if (variants_only) { /* `bench_gpu DIR --variants`: the copy, then 1c only */
		decode_variants(cbw);
		kvt_dev_destroy(dev);
		return 0;
	}

	/*
	 * 1 + 2: decode attention (Llama-3-8B KV shape: 8 KV heads, group 4, head_dim 128; then
	 * SmolLM2-135M's: 3 KV heads, group 3, head_dim 64), on each decode kernel (KVT_CUDA_DECODE
	 * 1, 2 and 3: a device each; 3 differs from 2 on 8-bit pools only), every figure against
	 * the copy measured above.
	 */
	kvt_dev *ver[3] = { NULL, NULL, NULL };
	for (int v = 0; v < 3; v++) {
		const char name[2] = { (char)('1' + v), 0 };
		setenv("KVT_CUDA_DECODE", name, 1);
		if (kvt_dev_create(&dc, &ver[v]))
			die("device for a decode kernel");
	}
	unsetenv("KVT_CUDA_DECODE");
	kvt_dev *keep = dev;
	static const uint32_t shapes[][4] = { /* kv heads, group, head_dim, context */
		{ 8, 4, 128, 4096 }, { 8, 4, 128, 16384 }, { 8, 4, 128, 32768 }, { 8, 4, 128, 65536 }, { 3, 3, 64, 65536 },
	};
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		const uint32_t kvh = shapes[i][0], G = shapes[i][1], hd = shapes[i][2], ctx = shapes[i][3];
		for (int v = 0; v < 3; v++) {
			double b16, b8;
			dev = ver[v];
			double t16 = attn_time(kvh, G, hd, ctx, KVT_KV_CODEC_F16, &b16);
			double t8 = attn_time(kvh, G, hd, ctx, KVT_KV_CODEC_FP8, &b8);
			printf("{\"bench\":\"decode_attention\",\"kernel\":%d,\"batch\":1,\"context\":%u,\"kv_heads\":%u,"
			       "\"group\":%u,\"head_dim\":%u,\"f16_us\":%.2f,\"f16_bytes_per_s\":%.4g,\"f16_vs_copy\":%.3f,"
			       "\"fp8_us\":%.2f,\"fp8_bytes_per_s\":%.4g,\"fp8_speedup\":%.3f}\n",
			       v + 1, ctx, kvh, G, hd, t16 * 1e6, b16 / t16, b16 / t16 / cbw, t8 * 1e6, b8 / t8, t16 / t8);
			fflush(stdout);
		}
	}
	dev = keep;
	for (int v = 0; v < 3; v++)
		kvt_dev_destroy(ver[v]);
	decode_variants(cbw); /* 1c */
	if (argc > 2 && strcmp(argv[2], "--attention") == 0) {
		kvt_dev_destroy(dev);
		return 0;
	}

	/* 3: codecs on 512 blocks of the Llama-3-8B shape (2 MiB each, 32 layers) */
	{
		const uint32_t nb = 256;
		kvt_kv_layout l = { .n_layers = 32, .n_kv_heads = 8, .head_dim = 128, .block_tokens = 16, .n_slots = nb };
		size_t bb = kvt_kv_block_bytes(&l);
		l.pool = dalloc(bb * nb);
		{ /* fill with fp16 values from a small pattern (pack of garbage NaNs would be meaningless) */
			uint16_t *h = malloc(bb);
			for (size_t i = 0; i < bb / 2; i++)
				h[i] = kvt_f32_to_f16((float)((int)(i * 2654435761u % 2001) - 1000) / 250.0f);
			for (uint32_t b = 0; b < nb; b++)
				kvt_dev_copy_h2d(dev, (char *)l.pool + (size_t)b * bb, h, bb);
			free(h);
		}
		int32_t *slots = malloc(nb * 4);
		for (uint32_t i = 0; i < nb; i++)
			slots[i] = (int32_t)(nb - 1 - i);
		copy_job cj = { dalloc(bb * nb), l.pool, bb * nb };
		double tc = time_it(do_copy, &cj, 20);
		kvt_dev_free(dev, cj.dst);
		for (int codec = KVT_KV_CODEC_FP8; codec <= KVT_KV_CODEC_INT8; codec++) {
			size_t pb = kvt_kv_packed_bytes(&l, codec);
			codec_job j = { .p = { .kv = &l, .codec = codec, .n_blocks = nb, .h_slots = slots },
					.u = { .kv = &l, .codec = codec, .n_blocks = nb, .h_slots = slots } };
			j.p.dst = dalloc(pb * nb);
			j.u.src = j.p.dst;
			double tp = time_it(do_codec, &j, 20);
			j.unpack = true;
			double tu = time_it(do_codec, &j, 20);
			printf("{\"bench\":\"codec\",\"codec\":\"%s\",\"blocks\":%u,\"block_bytes\":%zu,\"copy_us\":%.1f,"
			       "\"pack_us\":%.1f,\"unpack_us\":%.1f,\"pack_vs_copy\":%.3f,\"unpack_vs_copy\":%.3f}\n",
			       kvt_kv_codec_name(codec), nb, bb, tc * 1e6, tp * 1e6, tu * 1e6, tc / tp, tc / tu);
			kvt_dev_free(dev, j.p.dst);
		}

		/* 4: page-out / page-in of the same 256 blocks (512 MiB) */
		page_job pj = { .dev_pool = l.pool, .block_bytes = bb, .n = nb };
		if (kvt_dev_stream_create(dev, &pj.s) || kvt_dev_host_alloc(dev, bb * nb, &pj.host))
			die("pinned");
		memset(pj.host, 0, bb * nb);
		double t_one = page_time(&pj, 2, 5), t_out = page_time(&pj, 0, 5), t_in = page_time(&pj, 1, 5);
		pj.packed = kvt_kv_packed_bytes(&l, KVT_KV_CODEC_FP8);
		pj.pack = (kvt_kv_pack_args){ .kv = &l, .codec = KVT_KV_CODEC_FP8, .n_blocks = nb, .h_slots = slots,
					      .dst = dalloc(pj.packed * nb) };
		double t_fp8 = page_time(&pj, 3, 5);
		printf("{\"bench\":\"page\",\"blocks\":%u,\"block_bytes\":%zu,\"one_copy_us\":%.0f,\"one_copy_bytes_per_s\":%.4g,"
		       "\"page_out_us\":%.0f,\"page_out_vs_one\":%.3f,\"page_in_us\":%.0f,\"page_in_vs_one\":%.3f,"
		       "\"page_out_fp8_us\":%.0f,\"page_out_fp8_vs_one_f16\":%.3f}\n",
		       nb, bb, t_one * 1e6, bb * nb / t_one, t_out * 1e6, t_one / t_out, t_in * 1e6, t_one / t_in,
		       t_fp8 * 1e6, t_one / t_fp8);
		kvt_dev_free(dev, pj.pack.dst);
		kvt_dev_host_free(dev, pj.host);
		kvt_dev_stream_destroy(dev, pj.s);
		kvt_dev_free(dev, l.pool);
		free(slots);
	}
	fflush(stdout);

	/* 5: end to end */
	e2e(cbw, dir, 16);
	kvt_dev_destroy(dev);
	return 0;
}
