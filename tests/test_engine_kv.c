/* ctest-labels: unit integration invariant */
/*
 * tests/test_engine_kv.c — DESIGN §8 invariant 1 and the paged-KV engine on
 * a tiny synthetic Llama (random weights, written by the test).
 *
 *  - greedy tokens with the KV cache equal greedy tokens recomputed without
 *    it, step by step, and the logits are bitwise equal (the order rule,
 *    gpu/dev_impl.h: a decode step's row equals that row of a prompt);
 *  - the stored K/V of earlier positions do not change as the context grows
 *    (bitwise);
 *  - prefill on top of a cached prefix, chunked prefill and a prefix shared
 *    by reference all give the logits of one full prefill, bit for bit;
 *  - the reference and fast CPU kernels give the same greedy tokens;
 *  - a full pool is an error that leaves the sequence as it was.
 */
#include "check.h"
#include "gguf.h"
#include "model.h"
#include "sampler.h"
#include "synth_model.h"

#include <unistd.h>

/*
 * Logit tolerance between the reference kernels and the fast ones (an
 * accuracy check: different kernels). Two computations of the same position
 * on one backend must agree bit for bit, with fp32, fp16 or quantized
 * weights and int16 or int8 activations (the order rule, gpu/dev_impl.h).
 */
#define LOGIT_TOL 1e-3f
#define BT 16

static char model_path[256];

typedef struct rig {
	kvt_dev *dev;        /* backend */
	kvt_model *m;        /* model on it */
	kvt_t0_pool *pool;   /* KV blocks */
	uint32_t V;          /* vocabulary */
} rig;

/* A rig on the GGUF at path; act_int8: the CPU's int8 activations (cpu_fast.c's GEMV and GEMM). */
static int rig_open_at(rig *r, const char *path, bool use_ref, bool act_int8, int wdt, uint32_t max_batch,
		       uint32_t n_slots)
{
	kvt_gguf *g;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .use_ref = use_ref, .n_threads = 2, .act_int8 = act_int8 };
	kvt_model_config mc;
	kvt_kv_layout shape;

	memset(r, 0, sizeof(*r));
	kvt_model_config_default(&mc);
	mc.weight_dtype = wdt;
	mc.max_batch = max_batch;
	if (kvt_gguf_open(path, &g))
		return 1;
	int rc = kvt_dev_create(&dc, &r->dev);
	if (!rc)
		rc = kvt_model_load(r->dev, g, &mc, &r->m);
	kvt_gguf_close(g);
	if (rc)
		return rc;
	kvt_model_kv_shape(r->m, BT, &shape);
	r->V = kvt_model_hparams_get(r->m)->n_vocab;
	return kvt_t0_create(r->dev, &shape, n_slots, &r->pool);
}

static int rig_open(rig *r, bool use_ref, int wdt, uint32_t max_batch, uint32_t n_slots)
{
	return rig_open_at(r, model_path, use_ref, false, wdt, max_batch, n_slots);
}

static void rig_close(rig *r)
{
	kvt_t0_destroy(r->pool);
	kvt_model_destroy(r->m);
	kvt_dev_destroy(r->dev);
}

/* Whether two logit rows are bitwise equal. */
static bool same_bits(const float *a, const float *b, size_t n)
{
	return !memcmp(a, b, n * sizeof(float));
}

static float max_abs_diff(const float *a, const float *b, size_t n)
{
	float w = 0;
	for (size_t i = 0; i < n; i++)
		w = fmaxf(w, fabsf(a[i] - b[i]));
	return w;
}

/* Invariant 1: cached vs recomputed greedy decoding. */
static void test_cache_vs_recompute(rig *r, const char *what)
{
	enum { N_PROMPT = 11, N_GEN = 40 };
	int32_t toks[N_PROMPT + N_GEN];
	float *la = malloc(r->V * 4), *lb = malloc(r->V * 4);
	kvt_seq a, b;
	float worst = 0;
	int diverged = -1, n_differ = 0;

	for (int i = 0; i < N_PROMPT; i++)
		toks[i] = (int32_t)((i * 37 + 5) % r->V);
	CHECK(kvt_seq_init(&a, r->dev, r->pool, 512) == KVT_OK);
	CHECK(kvt_seq_init(&b, r->dev, r->pool, 512) == KVT_OK);
	CHECK(kvt_model_forward(r->m, &a, toks, N_PROMPT, la, 1) == KVT_OK);

	/* snapshot the pool after the prompt: its positions must never change */
	const kvt_kv_layout *kv = kvt_t0_layout(r->pool);
	const size_t pool_bytes = kvt_t0_block_bytes(r->pool) * kv->n_slots;
	unsigned char *snap = malloc(pool_bytes), *now = malloc(pool_bytes);
	kvt_dev_copy_d2h(r->dev, snap, kv->pool, pool_bytes);
	int32_t prompt_blocks[4];
	memcpy(prompt_blocks, a.blocks, sizeof(prompt_blocks[0]) * a.n_blocks);

	int n_distinct = 0;
	for (int s = 0; s < N_GEN; s++) {
		kvt_seq_reset(&b);
		CHECK(kvt_model_forward(r->m, &b, toks, N_PROMPT + s, lb, 1) == KVT_OK);
		worst = fmaxf(worst, max_abs_diff(la, lb, r->V));
		n_differ += !same_bits(la, lb, r->V);
		int32_t ta = kvt_argmax(la, r->V), tb = kvt_argmax(lb, r->V);
		if (ta != tb && diverged < 0)
			diverged = s;
		for (int j = 0; j < s; j++)
			if (toks[N_PROMPT + j] == ta)
				goto seen;
		n_distinct++;
seen:
		toks[N_PROMPT + s] = ta;
		if (s + 1 < N_GEN)
			CHECK(kvt_model_forward(r->m, &a, &toks[N_PROMPT + s], 1, la, 1) == KVT_OK);
	}
	printf("%s: %d greedy steps, %d distinct tokens, max |logit diff| cached vs recomputed = %.3g, "
	       "%d steps not bitwise equal\n", what, N_GEN, n_distinct, worst, n_differ);
	CHECKF(diverged < 0, "%s: greedy tokens diverge at step %d", what, diverged);
	CHECKF(n_differ == 0, "%s: %d of %d steps' logits differ (by up to %g)", what, n_differ, N_GEN, worst);
	CHECKF(n_distinct > 3, "%s: degenerate model output (%d distinct tokens)", what, n_distinct);

	/* earlier positions: every byte of the prompt's K/V is as it was */
	kvt_dev_copy_d2h(r->dev, now, kv->pool, pool_bytes);
	const uint32_t L = kv->n_layers, H = kv->n_kv_heads, hd = kv->head_dim;
	size_t changed = 0;
	for (uint32_t p = 0; p < N_PROMPT; p++)
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t kvi = 0; kvi < 2; kvi++)
				for (uint32_t h = 0; h < H; h++) {
					size_t off = ((((size_t)prompt_blocks[p / BT] * L + l) * 2 + kvi) * H + h) * BT + p % BT;
					off *= hd * 2;
					changed += memcmp(snap + off, now + off, hd * 2) != 0;
				}
	CHECKF(changed == 0, "%s: %zu K/V rows of earlier positions changed", what, changed);
	kvt_seq_deinit(&a);
	kvt_seq_deinit(&b);
	CHECK_EQ_INT(kvt_t0_n_free(r->pool), kvt_t0_n_slots(r->pool));
	free(snap), free(now), free(la), free(lb);
}

/* Prefill on a cached prefix, chunked prefill and shared prefixes. */
static void test_prefix_paths(rig *r, rig *chunked)
{
	enum { N = 53, CUT = 32 }; /* CUT is a block boundary */
	int32_t toks[N];
	float *full = malloc(r->V * 4 * 3), *l2 = malloc(r->V * 4), *l3 = malloc(r->V * 4);
	kvt_seq a, b, c;

	for (int i = 0; i < N; i++)
		toks[i] = (int32_t)((i * 101 + 7) % r->V);
	kvt_seq_init(&a, r->dev, r->pool, 512);
	kvt_seq_init(&b, r->dev, r->pool, 512);
	kvt_seq_init(&c, r->dev, r->pool, 512);
	/* the last 3 rows of one full prefill */
	CHECK(kvt_model_forward(r->m, &a, toks, N, full, 3) == KVT_OK);
	/* the same tokens as prefix + rest */
	CHECK(kvt_model_forward(r->m, &b, toks, 29, NULL, 0) == KVT_OK);
	CHECK(kvt_model_forward(r->m, &b, toks + 29, N - 29, l2, 1) == KVT_OK);
	float d1 = max_abs_diff(full + 2 * r->V, l2, r->V);
	CHECKF(same_bits(full + 2 * r->V, l2, r->V), "prefill on a cached prefix differs by %g", d1);
	/* share a's first two full blocks by reference, compute only the rest */
	CHECK(kvt_seq_share_prefix(&c, &a, CUT / BT) == KVT_OK);
	CHECK_EQ_INT(c.n_tokens, CUT);
	CHECK_EQ_INT(kvt_t0_refcount(r->pool, a.blocks[0]), 2);
	CHECK(kvt_model_forward(r->m, &c, toks + CUT, N - CUT, l3, 1) == KVT_OK);
	float d2 = max_abs_diff(full + 2 * r->V, l3, r->V);
	CHECKF(same_bits(full + 2 * r->V, l3, r->V), "shared prefix differs by %g", d2);
	CHECK(a.blocks[0] == c.blocks[0] && a.blocks[2] != c.blocks[2]);
	/* sharing more than the source holds is refused */
	kvt_seq d;
	kvt_seq_init(&d, r->dev, r->pool, 512);
	CHECK(kvt_seq_share_prefix(&d, &a, 4) == KVT_EINVAL);
	kvt_seq_deinit(&d);
	printf("prefix paths: cached-prefix %.3g, shared-prefix %.3g\n", d1, d2);

	/* chunked prefill (max_batch 7) against one chunk */
	kvt_seq e;
	kvt_seq_init(&e, chunked->dev, chunked->pool, 512);
	CHECK(kvt_model_forward(chunked->m, &e, toks, N, l2, 1) == KVT_OK);
	float d3 = max_abs_diff(full + 2 * r->V, l2, r->V);
	CHECKF(same_bits(full + 2 * r->V, l2, r->V), "chunked prefill differs by %g", d3);
	/* and all logit rows of a multi-row request land in order across chunks */
	kvt_seq_reset(&e);
	CHECK(kvt_model_forward(chunked->m, &e, toks, N, l3, 1) == KVT_OK);
	float *rows = malloc(r->V * 4 * 3);
	kvt_seq_reset(&e);
	CHECK(kvt_model_forward(chunked->m, &e, toks, N, rows, 3) == KVT_OK);
	float d4 = max_abs_diff(rows, full, 3 * r->V);
	CHECKF(same_bits(rows, full, 3 * r->V), "chunked multi-row logits differ by %g", d4);
	CHECK(same_bits(rows + 2 * r->V, l3, r->V));
	kvt_seq_deinit(&e);
	free(rows);

	kvt_seq_deinit(&a);
	kvt_seq_deinit(&b);
	CHECK_EQ_INT(kvt_t0_refcount(r->pool, c.blocks[0]), 1);
	kvt_seq_deinit(&c);
	CHECK_EQ_INT(kvt_t0_n_free(r->pool), kvt_t0_n_slots(r->pool));
	free(full), free(l2), free(l3);
}

/* Same greedy tokens from the reference kernels and the fast path. */
static void test_ref_vs_fast(rig *fast, rig *ref)
{
	enum { N_PROMPT = 9, N_GEN = 12 };
	int32_t ta[N_PROMPT + N_GEN], tb[N_PROMPT + N_GEN];
	float *la = malloc(fast->V * 4), *lb = malloc(fast->V * 4), worst = 0;
	kvt_seq a, b;
	for (int i = 0; i < N_PROMPT; i++)
		ta[i] = tb[i] = (int32_t)((i * 53 + 11) % fast->V);
	kvt_seq_init(&a, fast->dev, fast->pool, 512);
	kvt_seq_init(&b, ref->dev, ref->pool, 512);
	CHECK(kvt_model_forward(fast->m, &a, ta, N_PROMPT, la, 1) == KVT_OK);
	CHECK(kvt_model_forward(ref->m, &b, tb, N_PROMPT, lb, 1) == KVT_OK);
	for (int s = 0; s < N_GEN; s++) {
		worst = fmaxf(worst, max_abs_diff(la, lb, fast->V));
		ta[N_PROMPT + s] = kvt_argmax(la, fast->V);
		tb[N_PROMPT + s] = kvt_argmax(lb, fast->V);
		CHECK(kvt_model_forward(fast->m, &a, &ta[N_PROMPT + s], 1, la, 1) == KVT_OK);
		CHECK(kvt_model_forward(ref->m, &b, &tb[N_PROMPT + s], 1, lb, 1) == KVT_OK);
	}
	CHECK(!memcmp(ta, tb, sizeof(ta)));
	CHECKF(worst < LOGIT_TOL, "reference vs fast logits differ by %g", worst);
	printf("reference vs fast kernels: max |logit diff| %.3g\n", worst);
	kvt_seq_deinit(&a);
	kvt_seq_deinit(&b);
	free(la), free(lb);
}

/* A pool without room: KVT_EFULL, and the sequence is untouched. */
static void test_pool_full(void)
{
	rig r;
	CHECK(rig_open(&r, false, KVT_DTYPE_F32, 64, 2) == KVT_OK);
	int32_t toks[40] = { 0 };
	float *l = malloc(r.V * 4);
	kvt_seq s;
	kvt_seq_init(&s, r.dev, r.pool, 512);
	CHECK(kvt_model_forward(r.m, &s, toks, 20, l, 1) == KVT_OK); /* 2 blocks */
	CHECK(kvt_model_forward(r.m, &s, toks, 13, l, 1) == KVT_EFULL); /* would need a third */
	CHECK_EQ_INT(s.n_tokens, 20);
	CHECK_EQ_INT(s.n_blocks, 2);
	CHECK(kvt_model_forward(r.m, &s, toks, 12, l, 1) == KVT_OK); /* still fits block 2 */
	/* out-of-vocabulary ids and too-long sequences are refused */
	int32_t bad = (int32_t)r.V;
	CHECK(kvt_model_forward(r.m, &s, &bad, 1, l, 1) == KVT_EINVAL);
	kvt_seq_deinit(&s);
	free(l);
	rig_close(&r);
}

int main(void)
{
	char dir[] = "/tmp/kvt_engine_XXXXXX";
	if (!mkdtemp(dir))
		return 1;
	snprintf(model_path, sizeof(model_path), "%s/synth.gguf", dir);
	kvt_synth_llama cfg;
	kvt_synth_llama_default(&cfg);
	cfg.n_layer = 3;
	cfg.n_embd = 96;
	cfg.n_head = 6;
	cfg.n_head_kv = 2;
	cfg.n_ff = 160;
	cfg.seed = 7;
	cfg.tied_embeddings = false; /* tied random embeddings make greedy decoding repeat its input */
	if (kvt_synth_llama_write(&cfg, model_path))
		return 1;

	rig fast, fast16, ref, chunked;
	CHECK(rig_open(&fast, false, KVT_DTYPE_F32, 512, 64) == KVT_OK);
	CHECK(rig_open(&fast16, false, KVT_DTYPE_F16, 512, 64) == KVT_OK);
	CHECK(rig_open(&ref, true, KVT_DTYPE_F32, 512, 64) == KVT_OK);
	CHECK(rig_open(&chunked, false, KVT_DTYPE_F32, 7, 64) == KVT_OK);

	test_cache_vs_recompute(&fast, "fp32 weights");
	test_cache_vs_recompute(&fast16, "fp16 weights");
	test_cache_vs_recompute(&ref, "reference kernels");
	test_prefix_paths(&fast, &chunked);
	test_ref_vs_fast(&fast, &ref);
	test_pool_full();

	/*
	 * Invariant 1 with int8 activations, weights kept quantized: the cached
	 * decode's single rows take the int8 GEMV, the recomputation's 12 rows
	 * and more (and the 53-token prefills) the int8 GEMM where the build has
	 * one, and the 7-token chunks the GEMV again; all in one order per
	 * output, so bitwise equal. Q8_0 on the same shapes, and a Q4_K_M mix
	 * (Q4_K, Q6_K) on rows of 256.
	 */
	char q8_path[sizeof(model_path) + 8], qk_path[sizeof(model_path) + 8];
	snprintf(q8_path, sizeof(q8_path), "%s/q8.gguf", dir);
	snprintf(qk_path, sizeof(qk_path), "%s/qk.gguf", dir);
	cfg.weight_type = KVT_GGML_Q8_0;
	CHECK(kvt_synth_llama_write(&cfg, q8_path) == 0);
	cfg.weight_type = KVT_GGML_Q4_K;
	cfg.q4_k_m_mix = true;
	cfg.n_embd = 256;
	cfg.n_head = 4;
	cfg.n_ff = 512;
	CHECK(kvt_synth_llama_write(&cfg, qk_path) == 0);
	const char *paths[2] = { q8_path, qk_path }, *names[2] = { "int8 activations, q8_0", "int8 activations, q4_k_m" };
	for (int i = 0; i < 2; i++) {
		rig x8, x8c;
		CHECK(rig_open_at(&x8, paths[i], false, true, KVT_DTYPE_F16, 512, 64) == KVT_OK);
		CHECK(rig_open_at(&x8c, paths[i], false, true, KVT_DTYPE_F16, 7, 64) == KVT_OK);
		test_cache_vs_recompute(&x8, names[i]);
		test_prefix_paths(&x8, &x8c);
		rig_close(&x8);
		rig_close(&x8c);
		unlink(paths[i]);
	}

	rig_close(&fast);
	rig_close(&fast16);
	rig_close(&ref);
	rig_close(&chunked);
	unlink(model_path);
	rmdir(dir);
	return check_done("test_engine_kv");
}
