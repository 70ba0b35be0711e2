/*
 * bench/bench_int8_paths.c — how far a cached turn and a recomputed one drift
 * apart with int16 and with int8 activations (the question behind making
 * int8 the CPU default, issue 31), and where the drift comes from.
 *
 * 1. For each prompt of tests/ref/gemma3_greedy_ref.txt longer than a block:
 *    a cold prefill of the whole prompt, and one continued from the cold
 *    sequence's first block (shared) with a prefill of the rest, as
 *    test_gemma3_model's cache-against-cold check does. Printed: the largest
 *    |logit difference| after the prompt, and whether 8 greedy tokens agree.
 *    A cold prompt of 12 or more rows takes the int8 GEMM, the rest of a
 *    shared one (fewer rows) the GEMV.
 * 2. For every quantized matrix of the model, with int8 activations: the same
 *    rows of x through one call of ROWS rows (the GEMM from 12 rows) and one
 *    row at a time (the GEMV). Printed: the largest difference relative to
 *    the matrix's largest output, and the matrix it came from.
 *
 *   bench_int8_paths [--model PATH] [--refs PATH] [--threads N] [--rows N]
 *   (default: models/gemma-3-270m-q4_k_m.gguf, its reference prompts, 2, 19)
 */
#include "dev.h"
#include "gguf.h"
#include "model.h"
#include "ref_read.h"
#include "tiers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CASES 8
#define N_GREEDY 8

typedef struct prompt {
	int32_t ids[256]; /* the I line */
	uint32_t n_ids;   /* count */
} prompt;

static int read_prompts(const char *path, prompt *ps)
{
	static char line[65536];
	FILE *f = fopen(path, "r");
	int n = 0;
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f) && n < MAX_CASES)
		if (line[0] == 'I') {
			int k = ref_parse_ids(line + 1, ps[n].ids, 256, NULL);
			ps[n].n_ids = k > 0 ? (uint32_t)k : 0;
			n++;
		}
	fclose(f);
	return n;
}

static int32_t argmax(const float *x, uint32_t n)
{
	uint32_t b = 0;
	for (uint32_t i = 1; i < n; i++)
		b = x[i] > x[b] ? i : b;
	return (int32_t)b;
}

static void greedy(kvt_model *m, kvt_seq *s, float *lg, uint32_t V, int32_t *out)
{
	for (int i = 0; i < N_GREEDY; i++) {
		out[i] = argmax(lg, V);
		if (kvt_model_forward(m, s, &out[i], 1, lg, 1))
			out[i] = -1;
	}
}

/* Part 1 on one device. */
static int cached_against_cold(kvt_dev *d, kvt_gguf *g, const prompt *ps, int n_ps, const char *what)
{
	kvt_model *m;
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_ctx = 1024;
	if (kvt_model_load(d, g, &mc, &m))
		return 1;
	const uint32_t V = kvt_model_hparams_get(m)->n_vocab;
	kvt_kv_layout lay;
	kvt_model_kv_shape(m, 16, &lay);
	kvt_t0_pool *pool;
	if (kvt_t0_create(d, &lay, 160, &pool))
		return 1;
	float *cold_lg = malloc((size_t)V * 4), *lg = malloc((size_t)V * 4);
	for (int c = 0; c < n_ps; c++) {
		if (ps[c].n_ids <= 16)
			continue;
		kvt_seq cold, warm;
		int32_t a[N_GREEDY], b[N_GREEDY];
		kvt_seq_init(&cold, d, pool, 1024);
		kvt_seq_init(&warm, d, pool, 1024);
		kvt_model_forward(m, &cold, ps[c].ids, ps[c].n_ids, cold_lg, 1);
		memcpy(lg, cold_lg, (size_t)V * 4);
		greedy(m, &cold, lg, V, a);
		kvt_seq_share_prefix(&warm, &cold, 1);
		kvt_model_forward(m, &warm, ps[c].ids + 16, ps[c].n_ids - 16, lg, 1);
		float worst = 0;
		for (uint32_t i = 0; i < V; i++)
			worst = fmaxf(worst, fabsf(lg[i] - cold_lg[i]));
		greedy(m, &warm, lg, V, b);
		printf("%s: prompt %d (%u ids): max |logit diff| after the prompt %.4f; %d greedy tokens %s\n", what, c,
		       ps[c].n_ids, worst, N_GREEDY, memcmp(a, b, sizeof(a)) ? "DIFFER" : "agree");
		kvt_seq_deinit(&cold);
		kvt_seq_deinit(&warm);
	}
	free(cold_lg);
	free(lg);
	kvt_t0_destroy(pool);
	kvt_model_destroy(m);
	return 0;
}

static void matmul(kvt_dev *d, const kvt_matmul_args *a)
{
	void *ws = malloc(kvt_dev_matmul_workspace_bytes(d, a) + 64);
	kvt_dev_matmul(d, a, ws);
	free(ws);
}

/* Part 2: one call of `rows` rows against one row at a time, on every quantized matrix, int8 x. */
static void gemm_against_gemv(kvt_dev *d, kvt_gguf *g, uint32_t rows)
{
	double worst = 0;
	char where[128] = "-";
	int n_mat = 0;
	srand(1);
	for (uint64_t ti = 0; ti < kvt_gguf_n_tensors(g); ti++) {
		const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, ti);
		const int dt = kvt_model_stored_dtype(t->type);
		if (t->n_dims != 2 || dt < 0)
			continue;
		const uint32_t K = (uint32_t)t->ne[0], N = (uint32_t)t->ne[1];
		float *x = malloc(sizeof(float) * rows * K), *y1 = malloc(sizeof(float) * rows * N),
		      *y2 = malloc(sizeof(float) * rows * N);
		for (size_t i = 0; i < (size_t)rows * K; i++) /* an outlier every 613 values, as activations have */
			x[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * (i % 613 == 0 ? 300.0f : 1.0f);
		kvt_matmul_args a = { .n_rows = rows, .n_in = K, .n_out = N, .w_dtype = dt, .w = t->data, .x = x, .y = y1 };
		matmul(d, &a);
		for (uint32_t r = 0; r < rows; r++) {
			kvt_matmul_args b = a;
			b.n_rows = 1;
			b.x = x + (size_t)r * K;
			b.y = y2 + (size_t)r * N;
			matmul(d, &b);
		}
		double diff = 0, top = 0;
		for (size_t i = 0; i < (size_t)rows * N; i++) {
			diff = fmax(diff, fabs((double)y1[i] - y2[i]));
			top = fmax(top, fabs((double)y2[i]));
		}
		if (top > 0 && diff / top > worst) {
			worst = diff / top;
			snprintf(where, sizeof(where), "%.*s", (int)t->name.len, t->name.ptr);
		}
		n_mat++;
		free(x);
		free(y1);
		free(y2);
	}
	printf("int8 x, %d matrices: %u rows in one call against one at a time: largest difference %.3g of the "
	       "matrix's largest output (%s)\n", n_mat, rows, worst, where);
}

int main(int argc, char **argv)
{
	const char *path = "models/gemma-3-270m-q4_k_m.gguf", *refs = "tests/ref/gemma3_greedy_ref.txt";
	int threads = 2;
	uint32_t rows = 19;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--model"))
			path = argv[i + 1];
		else if (!strcmp(argv[i], "--refs"))
			refs = argv[i + 1];
		else if (!strcmp(argv[i], "--threads"))
			threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--rows"))
			rows = (uint32_t)atoi(argv[i + 1]);
	}
	static prompt ps[MAX_CASES];
	const int n_ps = read_prompts(refs, ps);
	kvt_gguf *g;
	if (n_ps <= 0 || kvt_gguf_open(path, &g)) {
		fprintf(stderr, "bench_int8_paths: cannot read %s or %s\n", refs, path);
		return 1;
	}
	for (int int8 = 0; int8 < 2; int8++) {
		kvt_dev *d;
		kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = threads, .act_int8 = int8 };
		if (kvt_dev_create(&dc, &d) || cached_against_cold(d, g, ps, n_ps, int8 ? "int8" : "int16"))
			return 1;
		if (int8)
			gemm_against_gemv(d, g, rows);
		kvt_dev_destroy(d);
	}
	kvt_gguf_close(g);
	return 0;
}
