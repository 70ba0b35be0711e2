/*
 * bench/bench_engine.c — kvtier's side of the engine speed comparison.
 *
 *   bench_engine --model M --prompt-ids-file F [--decode-ids-file D] [--threads N]
 *                [--gen-tokens 64] [--reps 3] [--weights native|f16|f32] [--fixed-threads 1]
 *                [--map-weights 1] [--activations int16|int8]
 *
 * prefill: the ids in F (one forward pass over all of them, a fresh
 *          sequence each rep); tokens/s = n / time.
 * decode:  the ids in D (default: the first 8 of F) as the prompt, then
 *          --gen-tokens greedy steps (argmax included); tokens/s over the
 *          steps alone.
 * --map-weights 1 (the default) reads the weights kept as stored from the
 * GGUF's mapping, as kvtierd and kvtier do; 0 copies them into the device's
 * own memory (what the model library does by default). --activations int8
 * has the CPU GEMV round x to int8 (kvtierd's [model] activations).
 * One warm-up rep, then the median of --reps. Prints one JSON object.
 * Not a test: bench/compare_llamacpp.py runs it beside llama.cpp and prints
 * the ratios.
 */
#include "gguf.h"
#include "model.h"
#include "sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Read up to cap whitespace-separated ids; returns the count or -1. */
static int read_ids(const char *path, int32_t *ids, int cap)
{
	FILE *f = fopen(path, "r");
	int n = 0;
	if (!f) {
		perror(path);
		return -1;
	}
	while (n < cap && fscanf(f, "%d", &ids[n]) == 1)
		n++;
	fclose(f);
	return n;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	const char *model = NULL, *ids_file = NULL, *dec_file = NULL;
	int threads = 0, n_gen = 64, n_dprompt = 8, reps = 3, wdt = KVT_DTYPE_F16, fixed = 0, map = 1;
	bool keep = true, x8 = false;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--model")) model = argv[i + 1];
		else if (!strcmp(argv[i], "--prompt-ids-file")) ids_file = argv[i + 1];
		else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--fixed-threads")) fixed = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--map-weights")) map = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--gen-tokens")) n_gen = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--decode-ids-file")) dec_file = argv[i + 1];
		else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--activations") && (!strcmp(argv[i + 1], "int8") || !strcmp(argv[i + 1], "int16")))
			x8 = !strcmp(argv[i + 1], "int8");
		else if (!strcmp(argv[i], "--weights")) {
			keep = !strcmp(argv[i + 1], "native");
			wdt = strcmp(argv[i + 1], "f32") ? KVT_DTYPE_F16 : KVT_DTYPE_F32;
		}
		else {
			fprintf(stderr, "bench_engine: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (!model || !ids_file || reps < 1 || reps > 100 || n_gen < 1) {
		fprintf(stderr, "usage: bench_engine --model M --prompt-ids-file F [--decode-ids-file D] [--threads N] "
				"[--gen-tokens N] [--reps N] [--weights native|f16|f32] [--fixed-threads 0|1] "
				"[--map-weights 0|1] [--activations int16|int8]\n");
		return 2;
	}
	static int32_t ids[8192], dec[256];
	int n_ids = read_ids(ids_file, ids, 8192);
	if (dec_file)
		n_dprompt = read_ids(dec_file, dec, 256);
	else
		memcpy(dec, ids, sizeof(int32_t) * (size_t)(n_dprompt = n_ids < 8 ? n_ids : 8));
	if (n_ids < 1 || n_dprompt < 1) {
		fprintf(stderr, "bench_engine: no prompt ids\n");
		return 1;
	}

	kvt_gguf *g;
	kvt_dev *dev;
	kvt_model *m;
	kvt_t0_pool *pool;
	kvt_kv_layout shape;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = threads, .fixed_threads = fixed != 0, .act_int8 = x8 };
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.weight_dtype = wdt;
	mc.keep_quantized = keep;
	mc.map_weights = map != 0; /* g stays open until the model is destroyed */
	mc.max_batch = (uint32_t)n_ids;
	mc.max_ctx = (uint32_t)(n_ids > n_dprompt + n_gen ? n_ids : n_dprompt + n_gen);
	if (kvt_gguf_open(model, &g) || kvt_dev_create(&dc, &dev) || kvt_model_load(dev, g, &mc, &m))
		return 1;
	kvt_model_kv_shape(m, 16, &shape);
	if (kvt_t0_create(dev, &shape, (mc.max_ctx + 15) / 16 + 1, &pool))
		return 1;
	const uint32_t V = kvt_model_hparams_get(m)->n_vocab;
	float *logits = malloc(V * sizeof(float));
	double t_pre[101], t_dec[101];
	kvt_seq s;
	kvt_seq_init(&s, dev, pool, mc.max_ctx);

	for (int r = 0; r <= reps; r++) { /* rep 0 is the warm-up */
		kvt_seq_reset(&s);
		double t0 = kvt_now_s();
		if (kvt_model_forward(m, &s, ids, (uint32_t)n_ids, logits, 1))
			return 1;
		t_pre[r] = kvt_now_s() - t0;

		kvt_seq_reset(&s);
		if (kvt_model_forward(m, &s, dec, (uint32_t)n_dprompt, logits, 1))
			return 1;
		t0 = kvt_now_s();
		for (int i = 0; i < n_gen; i++) {
			int32_t next = kvt_argmax(logits, V);
			if (kvt_model_forward(m, &s, &next, 1, logits, 1))
				return 1;
		}
		t_dec[r] = kvt_now_s() - t0;
	}
	double pre = median(t_pre + 1, reps), dcd = median(t_dec + 1, reps);
	printf("{\"engine\": \"kvtier\", \"device\": \"%s\", \"weights\": \"%s\", \"threads\": %d, "
	       "\"map_weights\": %s, \"n_prompt\": %d, \"n_gen\": %d, \"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f}\n",
	       kvt_dev_name(dev), keep ? "native" : wdt == KVT_DTYPE_F16 ? "f16" : "f32", kvt_dev_n_threads(dev), map ? "true" : "false", n_ids, n_gen,
	       n_ids / pre, n_gen / dcd);
	kvt_seq_deinit(&s);
	free(logits);
	kvt_t0_destroy(pool);
	kvt_model_destroy(m);
	kvt_gguf_close(g);
	kvt_dev_destroy(dev);
	return 0;
}
