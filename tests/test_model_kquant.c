/* ctest-labels: unit */
/*
 * tests/test_model_kquant.c — synthetic Llama models whose matrices are
 * Q5_0, Q4_K, Q5_K, Q6_K or a Q4_K_M-style mix (Q4_K with attn_v and ffn_down
 * in Q6_K), loaded with the weights kept as stored, against the same file
 * loaded with every matrix widened to fp32.
 *
 * The two loads multiply the same dequantized values: the kept model's only
 * extra rounding is the fast CPU GEMV's int16 activations (decode, and
 * prefill rows <= 4; cpu_fast.c documents ~1e-9 NMSE per matmul), so logits
 * must agree within LOGIT_TOL and greedy tokens must be the same unless the
 * widened model's own top two are within LOGIT_TIE. Also:
 *  - the resident weight bytes of a kept Q4_K model (kvt_model_weight_bytes,
 *    the loader's own accounting) are at most 1.1x its GGUF file size, and
 *    the widened model's are what fp32 costs;
 *  - each matrix is kept (no "widened" log line) or, with keep_quantized
 *    off, named in a log line with its type;
 *  - the model fingerprint differs between weight types of the same seed;
 *  - the plain reference kernels decode the kept Q4_K_M mix to the same
 *    tokens.
 */
#include "check.h"
#include "fingerprint.h"
#include "gguf.h"
#include "model.h"
#include "sampler.h"
#include "synth_model.h"

#include <sys/stat.h>
#include <unistd.h>

/* Largest logit difference kept vs fp32 measured here: 7.1e-4 (Q4_K, fast path;
 * 8.8e-5 with the reference kernels); logits are O(1). */
#define LOGIT_TOL 2e-3f
#define LOGIT_TIE 1e-2f
#define N_PROMPT 9
#define N_GEN 24
#define BT 16

static char dir[64];

typedef struct run {
	int32_t toks[N_GEN];    /* greedy tokens */
	float *logits;          /* [N_GEN][V] the logits each was taken from */
	size_t weight_bytes;    /* kvt_model_weight_bytes */
} run;

/* Greedy decode N_GEN tokens after a fixed prompt; logits of every step kept. */
static int decode(const char *path, bool use_ref, bool keep, run *out)
{
	kvt_gguf *g = NULL;
	kvt_dev *dev = NULL;
	kvt_model *m = NULL;
	kvt_t0_pool *pool = NULL;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .use_ref = use_ref, .n_threads = 2 };
	kvt_model_config mc;
	kvt_kv_layout shape;
	kvt_seq s;
	int rc;

	kvt_model_config_default(&mc);
	mc.keep_quantized = keep;
	mc.weight_dtype = KVT_DTYPE_F32;
	mc.max_ctx = 256;
	if ((rc = kvt_gguf_open(path, &g)) || (rc = kvt_dev_create(&dc, &dev)) || (rc = kvt_model_load(dev, g, &mc, &m)))
		goto done;
	const uint32_t V = kvt_model_hparams_get(m)->n_vocab;
	kvt_model_kv_shape(m, BT, &shape);
	if ((rc = kvt_t0_create(dev, &shape, 8, &pool)) || (rc = kvt_seq_init(&s, dev, pool, 256)))
		goto done;
	out->weight_bytes = kvt_model_weight_bytes(m);
	out->logits = malloc((size_t)N_GEN * V * sizeof(float));
	int32_t prompt[N_PROMPT];
	for (int i = 0; i < N_PROMPT; i++)
		prompt[i] = (int32_t)((i * 53 + 7) % V);
	rc = kvt_model_forward(m, &s, prompt, N_PROMPT, out->logits, 1);
	for (int t = 0; !rc && t < N_GEN; t++) {
		out->toks[t] = kvt_argmax(out->logits + (size_t)t * V, V);
		if (t + 1 < N_GEN)
			rc = kvt_model_forward(m, &s, &out->toks[t], 1, out->logits + (size_t)(t + 1) * V, 1);
	}
	kvt_seq_deinit(&s);
done:
	kvt_t0_destroy(pool);
	kvt_model_destroy(m);
	kvt_dev_destroy(dev);
	kvt_gguf_close(g);
	return rc;
}

/* The widened run's margin between its top two logits at step t. */
static float top2_gap(const float *l, uint32_t V)
{
	float a = -INFINITY, b = -INFINITY;
	for (uint32_t i = 0; i < V; i++) {
		if (l[i] > a)
			b = a, a = l[i];
		else if (l[i] > b)
			b = l[i];
	}
	return a - b;
}

/* Kept vs widened; returns whether the kept model matched. */
static void compare(const char *what, const run *kept, const run *wide, uint32_t V)
{
	float worst = 0;
	int first_diff = -1;
	for (int t = 0; t < N_GEN; t++) {
		const float *a = kept->logits + (size_t)t * V, *b = wide->logits + (size_t)t * V;
		for (uint32_t i = 0; i < V; i++)
			worst = fmaxf(worst, fabsf(a[i] - b[i]));
		if (kept->toks[t] != wide->toks[t]) {
			CHECKF(top2_gap(b, V) < LOGIT_TIE, "%s: step %d token %d vs %d (fp32) without a near tie", what, t,
			       kept->toks[t], wide->toks[t]);
			first_diff = t;
			break; /* the contexts differ from here on */
		}
	}
	CHECKF(worst <= LOGIT_TOL, "%s: logits differ by %g from the fp32 load", what, worst);
	int n_distinct = 0;
	for (int t = 0; t < N_GEN; t++) {
		int seen = 0;
		for (int u = 0; u < t; u++)
			seen |= wide->toks[u] == wide->toks[t];
		n_distinct += !seen;
	}
	CHECKF(n_distinct >= 4, "%s: greedy output is degenerate (%d distinct tokens)", what, n_distinct);
	printf("%-10s kept vs fp32: max |dlogit| %.3g, tokens %s, weights %zu vs %zu bytes\n", what, worst,
	       first_diff < 0 ? "identical" : "diverge at a near tie", kept->weight_bytes, wide->weight_bytes);
}

static size_t file_bytes(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

static int write_model(const char *name, uint32_t type, bool mix, char *path, size_t cap)
{
	kvt_synth_llama c;
	kvt_synth_llama_default(&c);
	c.n_embd = 256;
	c.n_head = 4;
	c.n_head_kv = 2;
	c.n_ff = 512;
	c.tied_embeddings = false;
	c.weight_type = type;
	c.q4_k_m_mix = mix;
	c.seed = 7;
	snprintf(path, cap, "%s/%s.gguf", dir, name);
	return kvt_synth_llama_write(&c, path);
}

int main(void)
{
	static const struct { const char *name; uint32_t type; bool mix; } types[] = {
		{ "q5_0", KVT_GGML_Q5_0, false }, { "q4_k", KVT_GGML_Q4_K, false }, { "q5_k", KVT_GGML_Q5_K, false },
		{ "q6_k", KVT_GGML_Q6_K, false }, { "q4_k_m", KVT_GGML_Q4_K, true } };
	char paths[5][128];
	uint8_t fps[5][32];
	const uint32_t V = kvt_synth_llama_n_vocab();

	snprintf(dir, sizeof(dir), "/tmp/kvt_kquant_XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	kvt_log_set_level(KVT_LOG_DEBUG);
	for (size_t i = 0; i < 5; i++) {
		run kept = { 0 }, wide = { 0 };
		CHECK(write_model(types[i].name, types[i].type, types[i].mix, paths[i], sizeof(paths[i])) == KVT_OK);
		kvt_log_set_sink(check_log_sink, NULL);
		check_log_reset();
		CHECK(decode(paths[i], false, true, &kept) == KVT_OK);
		CHECKF(!strstr(check_log_text, "widened"), "%s: a matrix was widened: %s", types[i].name, check_log_text);
		check_log_reset();
		CHECK(decode(paths[i], false, false, &wide) == KVT_OK);
		/* every widened matrix named with its type; debug level, since the config asked for it */
		char want[160];
		snprintf(want, sizeof(want), "blk.1.ffn_up.weight: %s widened to f32 (quantized weights not kept)",
			 kvt_ggml_type_name(types[i].type));
		CHECKF(strstr(check_log_text, want) != NULL, "%s: no line \"%s\"", types[i].name, want);
		kvt_log_set_sink(NULL, NULL);
		if (kept.logits && wide.logits)
			compare(types[i].name, &kept, &wide, V);

		/* resident bytes: kept is about the file; fp32 is 4 bytes a weight */
		const size_t fb = file_bytes(paths[i]);
		CHECKF(kept.weight_bytes <= fb * 1.1, "%s: %zu resident weight bytes for a %zu-byte file", types[i].name,
		       kept.weight_bytes, fb);
		CHECKF(wide.weight_bytes > 3 * kept.weight_bytes, "%s: fp32 load %zu bytes vs kept %zu", types[i].name,
		       wide.weight_bytes, kept.weight_bytes);
		printf("%-10s resident %zu bytes / file %zu bytes = %.3f\n", types[i].name, kept.weight_bytes, fb,
		       (double)kept.weight_bytes / (double)fb);
		if (types[i].mix) {
			/* the reference kernels read the same kept bytes to the same tokens */
			run r = { 0 };
			CHECK(decode(paths[i], true, true, &r) == KVT_OK);
			if (r.logits)
				compare("q4_k_m ref", &r, &wide, V);
			free(r.logits);
		}
		CHECK(kvt_model_fingerprint(paths[i], NULL, KVT_FP_CURRENT, fps[i], NULL) == KVT_OK);
		free(kept.logits);
		free(wide.logits);
	}
	/* same seed, same floats, another stored type: another model */
	for (size_t i = 0; i < 5; i++)
		for (size_t j = i + 1; j < 5; j++)
			CHECKF(memcmp(fps[i], fps[j], 32) != 0, "%s and %s share a fingerprint", types[i].name, types[j].name);

	/* the synthetic writer refuses K-quant rows that are not whole superblocks */
	kvt_synth_llama c;
	kvt_synth_llama_default(&c); /* n_embd 64 */
	c.weight_type = KVT_GGML_Q4_K;
	char bad[128];
	snprintf(bad, sizeof(bad), "%s/bad.gguf", dir);
	kvt_log_set_sink(check_log_sink, NULL);
	check_log_reset();
	CHECK(kvt_synth_llama_write(&c, bad) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "Q4_K needs n_embd (64) and n_ff (128) divisible by 256") != NULL);
	kvt_log_set_sink(NULL, NULL);
	for (size_t i = 0; i < 5; i++)
		unlink(paths[i]);
	unlink(bad);
	rmdir(dir);
	return check_done("test_model_kquant");
}
