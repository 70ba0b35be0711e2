/*
 * bench/bench_quant.c — matmul speed of weights kept in their block-quantized
 * type against the same matrix widened to fp16, in the same run.
 *
 *   bench_quant [--device cpu|cuda] [--threads N] [--n-out 8192] [--n-in 2048]
 *               [--rows 1,4,64] [--reps 7] [--types q8_0,q4_1,q5_0,q4_k,q5_k,q6_k]
 *               [--activations int16|int8|both] [--clock wall|cpu]
 *
 * For each type: one random N x K matrix (uniform +-0.1), quantized with
 * gguf_quant.c's quantizers (llama.cpp's bytes), and its dequantized values rounded
 * to fp16 — what the loader keeps when it widens. For each row count M (M = 1
 * is a decode step's GEMV, larger M a prefill chunk) it times kvt_dev_matmul
 * on both, one warm-up then the median of --reps calls, and prints rows/s
 * ("tokens/s": each row of x is one token through this matrix) and the ratio
 * kept / fp16 (--activations both: also the kept matrix with x rounded to
 * int8, interleaved with the rest, and int8 / int16). The default shape is a 2048-wide FFN-sized matrix, 32 MiB as
 * fp16, so neither form fits the caches and a decode step is bound by the
 * bytes read.
 *
 *   bench_quant --requant IN.gguf OUT.gguf
 *       writes a Q4_K_M-style copy of a Q8_0/Q4_x llama model: every
 *       block-quantized 2-D weight re-quantized (from its dequantized values)
 *       to Q4_K, attn_v and ffn_down to Q6_K on the layers llama.cpp's Q4_K_M
 *       gives more bits, and where a row is not whole 256-element
 *       superblocks to Q5_0 as llama.cpp falls back; token_embd and the rest
 *       copied as they are.
 *   bench_quant --model M.gguf [--threads N]
 *       loads M twice, kept as stored and widened to fp16, and prints the
 *       loader's resident weight bytes (kvt_model_weight_bytes) against the
 *       file size, and decode tokens/s of 32 greedy steps for each.
 */
#include "dev.h"
#include "gguf.h"
#include "model.h"
#include "sampler.h"
#include "tiers.h"

#include <sys/stat.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * --clock cpu: the calling thread's CPU time instead of the wall clock, for a
 * machine other work shares (meaningful with --threads 1, where the caller
 * runs every task; a descheduled thread's waits then do not count).
 */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(bench_clock, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median seconds of one matmul over reps calls, after one warm-up. */
static double time_matmul(kvt_dev *d, kvt_matmul_args *a, void *ws, int reps)
{
	double t[101];
	for (int r = -1; r < reps; r++) {
		double t0 = now_s();
		if (kvt_dev_matmul(d, a, ws) || kvt_dev_sync(d)) {
			fprintf(stderr, "bench_quant: matmul failed\n");
			exit(1);
		}
		if (r >= 0)
			t[r] = now_s() - t0;
	}
	qsort(t, (size_t)reps, sizeof(double), cmp_d);
	return t[reps / 2];
}

static void cpu_model(char *buf, size_t cap)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];
	snprintf(buf, cap, "unknown CPU");
	while (f && fgets(line, sizeof line, f)) {
		char *c = strchr(line, ':');
		if (!strncmp(line, "model name", 10) && c) {
			snprintf(buf, cap, "%s", c + 2);
			buf[strcspn(buf, "\n")] = 0;
			break;
		}
	}
	if (f)
		fclose(f);
}

/* Copy one metadata value into the writer (kvt_gguf_writer_copy_kv). */
static int copy_kv(kvt_gguf_writer *w, const kvt_gguf_kv *kv)
{
	char key[256];
	snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
	return kvt_gguf_writer_copy_kv(w, key, kv);
}

static int requant(const char *in, const char *out)
{
	kvt_gguf *g;
	kvt_gguf_writer *w;
	int rc, n_k4 = 0, n_k6 = 0, n_q5 = 0;
	if ((rc = kvt_gguf_open(in, &g)) || (rc = kvt_gguf_writer_create(&w)))
		return rc;
	for (uint64_t i = 0; i < kvt_gguf_n_kv(g) && !rc; i++)
		rc = copy_kv(w, kvt_gguf_kv_at(g, i));
	for (uint64_t i = 0; i < kvt_gguf_n_tensors(g) && !rc; i++) {
		const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
		char name[128];
		uint32_t be, bb;
		snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
		kvt_ggml_type_block(t->type, &be, &bb);
		if (t->n_dims != 2 || be == 1 || !strncmp(name, "token_embd", 10)) {
			rc = kvt_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
			continue;
		}
		/* llama.cpp's Q4_K_M gives attn_v and ffn_down more bits on the first and last
		 * eighth of the layers and every third one between ("use_more_bits") */
		uint32_t n_layer = 0, il = 0;
		kvt_gguf_get_u32(g, "llama.block_count", &n_layer);
		sscanf(name, "blk.%u.", &il);
		const bool more = il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
		const bool hi = (strstr(name, "attn_v") || strstr(name, "ffn_down")) && more;
		const uint32_t type = t->ne[0] % 256 ? KVT_GGML_Q5_0 : hi ? KVT_GGML_Q6_K : KVT_GGML_Q4_K;
		n_q5 += type == KVT_GGML_Q5_0, n_k4 += type == KVT_GGML_Q4_K, n_k6 += type == KVT_GGML_Q6_K;
		float *f = malloc(t->n_elems * sizeof(float));
		if (!f)
			rc = KVT_ENOMEM;
		if (!rc)
			rc = kvt_gguf_tensor_to_f32(g, t, f);
		if (!rc)
			rc = kvt_gguf_writer_add_tensor_f32(w, name, type, t->n_dims, t->ne, f);
		free(f);
	}
	if (!rc)
		rc = kvt_gguf_writer_write(w, out);
	printf("bench_quant: %s -> %s: %d matrices Q4_K, %d Q6_K, %d Q5_0 (rows not whole superblocks): %s\n", in, out,
	       n_k4, n_k6, n_q5, rc ? "failed" : "written");
	kvt_gguf_writer_destroy(w);
	kvt_gguf_close(g);
	return rc;
}

/* Load m kept or widened; resident weight bytes and decode tokens/s of n_gen greedy steps. */
static int model_run(const char *path, bool keep, int threads, int n_gen, int32_t *toks, size_t *bytes, double *tps)
{
	kvt_gguf *g = NULL;
	kvt_dev *d = NULL;
	kvt_model *m = NULL;
	kvt_t0_pool *pool = NULL;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = threads, .fixed_threads = true };
	kvt_model_config mc;
	kvt_kv_layout shape;
	kvt_seq s;
	int rc;

	kvt_model_config_default(&mc);
	mc.keep_quantized = keep;
	mc.max_ctx = 512;
	mc.max_batch = 64;
	if ((rc = kvt_gguf_open(path, &g)) || (rc = kvt_dev_create(&dc, &d)) || (rc = kvt_model_load(d, g, &mc, &m)))
		goto done;
	*bytes = kvt_model_weight_bytes(m);
	const uint32_t V = kvt_model_hparams_get(m)->n_vocab;
	float *logits = malloc((size_t)V * 4);
	kvt_model_kv_shape(m, 16, &shape);
	if ((rc = kvt_t0_create(d, &shape, 40, &pool)) || (rc = kvt_seq_init(&s, d, pool, 512)))
		goto done;
	int32_t prompt[16];
	for (int i = 0; i < 16; i++)
		prompt[i] = (int32_t)((i * 977 + 13) % V);
	rc = kvt_model_forward(m, &s, prompt, 16, logits, 1);
	double t0 = now_s();
	for (int i = 0; !rc && i < n_gen; i++) {
		toks[i] = kvt_argmax(logits, V);
		rc = kvt_model_forward(m, &s, &toks[i], 1, logits, 1);
	}
	*tps = n_gen / (now_s() - t0);
	kvt_seq_deinit(&s);
	free(logits);
done:
	kvt_t0_destroy(pool);
	kvt_model_destroy(m);
	kvt_dev_destroy(d);
	kvt_gguf_close(g);
	return rc;
}

static int model_report(const char *path, int threads)
{
	enum { N_GEN = 32 };
	int32_t tk[N_GEN], th[N_GEN];
	size_t bk, bh;
	double sk, sh;
	struct stat st;
	if (stat(path, &st)) {
		perror(path);
		return 1;
	}
	if (model_run(path, true, threads, N_GEN, tk, &bk, &sk) || model_run(path, false, threads, N_GEN, th, &bh, &sh))
		return 1;
	int agree = 0;
	while (agree < N_GEN && tk[agree] == th[agree])
		agree++;
	printf("bench_quant: %s (%lld bytes), %d threads\n", path, (long long)st.st_size, threads);
	printf("  kept as stored: resident weights %zu bytes = %.3fx the file; decode %.1f tok/s\n", bk,
	       (double)bk / (double)st.st_size, sk);
	printf("  widened to f16: resident weights %zu bytes = %.3fx the file; decode %.1f tok/s\n", bh,
	       (double)bh / (double)st.st_size, sh);
	printf("  decode kept / f16: %.2fx; greedy tokens agree for %d of %d steps\n", sk / sh, agree, N_GEN);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct { const char *name; int dt; uint32_t ggml; } all[] = {
		{ "q8_0", KVT_DTYPE_Q8_0, KVT_GGML_Q8_0 }, { "q4_1", KVT_DTYPE_Q4_1, KVT_GGML_Q4_1 },
		{ "q5_0", KVT_DTYPE_Q5_0, KVT_GGML_Q5_0 }, { "q4_k", KVT_DTYPE_Q4_K, KVT_GGML_Q4_K },
		{ "q5_k", KVT_DTYPE_Q5_K, KVT_GGML_Q5_K }, { "q6_k", KVT_DTYPE_Q6_K, KVT_GGML_Q6_K } };
	const char *types = "q8_0,q4_1,q5_0,q4_k,q5_k,q6_k", *rows_s = "1,4,64";
	uint32_t N = 8192, K = 2048;
	int threads = 2, reps = 7, kind = KVT_DEV_CPU;
	bool x8 = false; /* --activations int8: the CPU GEMV rounds x to int8 (kvt_dev_config.act_int8) */
	bool both = false; /* --activations both: int16 and int8 in the same run, interleaved */

	const char *model = NULL;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--requant") && i + 2 < argc)
			return requant(argv[i + 1], argv[i + 2]) ? 1 : 0;
		if (!strcmp(argv[i], "--model")) model = argv[i + 1];
		else if (!strcmp(argv[i], "--device")) kind = !strcmp(argv[i + 1], "cuda") ? KVT_DEV_CUDA : KVT_DEV_CPU;
		else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--n-out")) N = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--n-in")) K = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--rows")) rows_s = argv[i + 1];
		else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--types")) types = argv[i + 1];
		else if (!strcmp(argv[i], "--clock")) bench_clock = strcmp(argv[i + 1], "cpu") ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID;
		else if (!strcmp(argv[i], "--activations") && (!strcmp(argv[i + 1], "int8") || !strcmp(argv[i + 1], "int16") ||
								!strcmp(argv[i + 1], "both"))) {
			x8 = !strcmp(argv[i + 1], "int8");
			both = !strcmp(argv[i + 1], "both");
		} else {
			fprintf(stderr, "bench_quant: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (model)
		return model_report(model, threads);
	if (reps < 1 || reps > 100 || !N || !K || K % 256) {
		fprintf(stderr, "bench_quant: --reps 1..100, --n-in a multiple of 256\n");
		return 2;
	}
	uint32_t rows[16], n_rows = 0, max_m = 0;
	for (const char *p = rows_s; *p && n_rows < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : "") {
		rows[n_rows] = (uint32_t)atoi(p);
		if (!rows[n_rows] || rows[n_rows] > 4096) {
			fprintf(stderr, "bench_quant: --rows takes counts in 1..4096\n");
			return 2;
		}
		max_m = rows[n_rows] > max_m ? rows[n_rows] : max_m;
		n_rows++;
	}
	kvt_dev_config dc = { .kind = kind, .n_threads = threads, .fixed_threads = true, .act_int8 = x8 };
	kvt_dev *d, *d8 = NULL;
	if (kvt_dev_create(&dc, &d))
		return 1;
	kvt_dev_config dc8 = dc;
	dc8.act_int8 = true;
	if (both && (kind != KVT_DEV_CPU || kvt_dev_create(&dc8, &d8))) {
		fprintf(stderr, "bench_quant: --activations both needs the CPU backend\n");
		return 1;
	}
	char cpu[256];
	cpu_model(cpu, sizeof cpu);
	printf("bench_quant: device %s; host %s; matrix %u x %u; median of %d after a warm-up\n", kvt_dev_name(d),
	       cpu, N, K, reps);
	printf("%-5s %5s %14s %14s %12s %12s %7s%s\n", "type", "rows", "kept tok/s", "fp16 tok/s", "kept MiB", "fp16 MiB",
	       "ratio", both ? "     int8 tok/s int8/int16" : "");

	const size_t nw = (size_t)N * K;
	float *wf = malloc(nw * 4), *x = malloc((size_t)max_m * K * 4);
	uint16_t *wh = malloc(nw * 2);
	uint64_t s = 0x2545F4914F6CDD1Dull;
	for (size_t i = 0; i < nw; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		wf[i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * 0.2f;
	}
	for (size_t i = 0; i < (size_t)max_m * K; i++)
		x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
	void *dx, *dy, *dwf16;
	if (kvt_dev_alloc(d, (size_t)max_m * K * 4, &dx) || kvt_dev_alloc(d, (size_t)max_m * N * 4, &dy) ||
	    kvt_dev_alloc(d, nw * 2, &dwf16) || kvt_dev_copy_h2d(d, dx, x, (size_t)max_m * K * 4))
		return 1;

	for (size_t t = 0; t < sizeof(all) / sizeof(*all); t++) {
		if (!strstr(types, all[t].name))
			continue;
		if (!kvt_dev_supports_dtype(d, all[t].dt)) {
			printf("%-5s: not kept on this backend\n", all[t].name);
			continue;
		}
		const size_t qb = kvt_dtype_row_bytes(all[t].dt, K) * N;
		void *wq = malloc(qb), *dwq;
		float *wd = malloc(nw * 4);
		if (kvt_ggml_quantize(all[t].ggml, wf, wq, nw) || kvt_ggml_dequantize(all[t].ggml, wq, wd, nw))
			return 1;
		for (size_t i = 0; i < nw; i++)
			wh[i] = kvt_f32_to_f16(wd[i]);
		if (kvt_dev_alloc(d, qb, &dwq) || kvt_dev_copy_h2d(d, dwq, wq, qb) || kvt_dev_copy_h2d(d, dwf16, wh, nw * 2))
			return 1;
		for (uint32_t r = 0; r < n_rows; r++) {
			kvt_matmul_args aq = { .n_rows = rows[r], .n_in = K, .n_out = N, .w_dtype = all[t].dt, .w = dwq,
					       .x = dx, .y = dy };
			kvt_matmul_args ah = aq;
			ah.w_dtype = KVT_DTYPE_F16;
			ah.w = dwf16;
			size_t wsb = kvt_dev_matmul_workspace_bytes(d, &aq), wsh = kvt_dev_matmul_workspace_bytes(d, &ah);
			if (d8 && kvt_dev_matmul_workspace_bytes(d8, &aq) > wsb)
				wsb = kvt_dev_matmul_workspace_bytes(d8, &aq);
			void *ws = NULL;
			if ((wsb > wsh ? wsb : wsh) && kvt_dev_alloc(d, wsb > wsh ? wsb : wsh, &ws))
				return 1;
			/* interleaved so a change in machine load hits all alike (d8: host memory, as d's) */
			double tq = time_matmul(d, &aq, ws, reps), th = time_matmul(d, &ah, ws, reps);
			double t8 = d8 ? time_matmul(d8, &aq, ws, reps) : 0;
			tq = (tq + time_matmul(d, &aq, ws, reps)) / 2;
			th = (th + time_matmul(d, &ah, ws, reps)) / 2;
			if (d8)
				t8 = (t8 + time_matmul(d8, &aq, ws, reps)) / 2;
			printf("%-5s %5u %14.1f %14.1f %12.2f %12.2f %6.2fx", all[t].name, rows[r], rows[r] / tq,
			       rows[r] / th, qb / 1048576.0, nw * 2 / 1048576.0, th / tq);
			if (d8)
				printf(" %14.1f %9.2fx", rows[r] / t8, tq / t8);
			printf("\n");
			kvt_dev_free(d, ws);
		}
		kvt_dev_free(d, dwq);
		free(wq);
		free(wd);
	}
	kvt_dev_free(d, dx);
	kvt_dev_free(d, dy);
	kvt_dev_free(d, dwf16);
	kvt_dev_destroy(d);
	kvt_dev_destroy(d8);
	free(wf), free(x), free(wh);
	return 0;
}
