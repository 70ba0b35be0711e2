/* ctest-labels: unit */
/*
 * tests/test_model_blend.c — chunk reuse in the engine (model.h:
 * kvt_model_kv_move, kvt_model_forward_blend) on tiny synthetic models of
 * four RoPE variants: Llama (adjacent pairs), Llama with Llama 3 scaling
 * factors, Qwen2 (NEOX pairs) and Gemma 3 (NEOX, Q/K norms, local layers
 * with their own base and a sliding window).
 *
 *  - a move by 0 copies K and V bitwise; a move by d then by -d gives K back
 *    within fp16 rounding and V bitwise;
 *  - RoPE composes: layer 0's K/V depend on the token and its position only,
 *    so a span's layer-0 K/V computed at positions 0.. and moved by p match
 *    the same tokens computed at p.. after other tokens (within fp16
 *    rounding; a wrong pairing, base or direction is off by O(1));
 *  - a blend at recompute 1 gives the logits of a plain prefill bitwise
 *    (the same rows through the same kernels), whatever was placed;
 *  - a blend at recompute 0 / 0.5 / 0.15 recomputes no / half / 15% (rounded
 *    up) of the placed rows (with chunk-start rows asked for, still 15%),
 *    always runs the rows not placed and the last row, and its
 *    logits are finite; a placement taken from the same context (what a
 *    plain prefill stored) gives the plain logits at any recompute;
 *  - bad parameters are refused and leave the sequence as it was.
 */
#include "check.h"
#include "gguf.h"
#include "model.h"
#include "synth_model.h"

#include <unistd.h>

#define BT 16

typedef struct rig {
	kvt_dev *dev;
	kvt_model *m;
	kvt_t0_pool *pool;
	uint32_t V, L, KVD;
} rig;

static int rig_open(rig *r, const char *path, uint32_t max_batch)
{
	kvt_gguf *g;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = 2 };
	kvt_model_config mc;
	kvt_kv_layout shape;

	memset(r, 0, sizeof(*r));
	kvt_model_config_default(&mc);
	mc.weight_dtype = KVT_DTYPE_F32;
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
	const kvt_model_hparams *hp = kvt_model_hparams_get(r->m);
	r->V = hp->n_vocab;
	r->L = hp->n_layer;
	r->KVD = hp->n_head_kv * hp->head_dim;
	return kvt_t0_create(r->dev, &shape, 256, &r->pool);
}

static void rig_close(rig *r)
{
	kvt_t0_destroy(r->pool);
	kvt_model_destroy(r->m);
	kvt_dev_destroy(r->dev);
}

/* K (kv 0) or V (kv 1) rows [pos, pos + n) of layer l of s, as fp32 ([n][KVD]). */
static void read_kv(rig *r, const kvt_seq *s, uint32_t l, uint32_t pos, uint32_t n, float *k, float *v)
{
	kvt_kv_load_args a = { .kv = kvt_t0_layout(r->pool), .layer = l, .block_table = s->d_blocks, .pos0 = pos,
			       .n_rows = n, .k = k, .v = v };
	CHECK(kvt_dev_kv_load(r->dev, &a) == KVT_OK);
}

/* Relative squared error of b against a. */
static double nmse(const float *a, const float *b, size_t n)
{
	double e = 0, s = 1e-30;
	for (size_t i = 0; i < n; i++) {
		e += (double)(a[i] - b[i]) * (a[i] - b[i]);
		s += (double)a[i] * a[i];
	}
	return e / s;
}

static void toks_fill(int32_t *t, uint32_t n, uint32_t V, uint32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		t[i] = (int32_t)((i * 37 + seed * 101 + 5) % V);
}

static void test_move(rig *r, const char *what)
{
	enum { N = 40, P = 27 };
	int32_t t[N + P], w[P];
	kvt_seq a, b, c, d;
	float *ka = malloc(N * r->KVD * 4), *va = malloc(N * r->KVD * 4), *kb = malloc(N * r->KVD * 4),
	      *vb = malloc(N * r->KVD * 4);
	toks_fill(t, N, r->V, 1);
	toks_fill(w, P, r->V, 2);
	CHECK(kvt_seq_init(&a, r->dev, r->pool, 512) == KVT_OK && kvt_seq_init(&b, r->dev, r->pool, 512) == KVT_OK &&
	      kvt_seq_init(&c, r->dev, r->pool, 512) == KVT_OK && kvt_seq_init(&d, r->dev, r->pool, 512) == KVT_OK);
	CHECK(kvt_model_forward(r->m, &a, t, N, NULL, 0) == KVT_OK);

	/* by 0: bitwise; by 13 and back: V bitwise, K within fp16 rounding */
	CHECK(kvt_model_kv_move(r->m, &a, 3, &b, 5, 30, 0) == KVT_OK);
	CHECK(b.n_tokens == 0 && b.n_blocks == 3);
	b.n_tokens = 35;
	CHECK(kvt_model_kv_move(r->m, &a, 3, &c, 0, 30, 13) == KVT_OK);
	c.n_tokens = 30;
	CHECK(kvt_model_kv_move(r->m, &c, 0, &d, 0, 30, -13) == KVT_OK);
	d.n_tokens = 30;
	double worst_back = 0;
	for (uint32_t l = 0; l < r->L; l++) {
		read_kv(r, &a, l, 3, 30, ka, va);
		read_kv(r, &b, l, 5, 30, kb, vb);
		CHECKF(!memcmp(ka, kb, 30 * r->KVD * 4) && !memcmp(va, vb, 30 * r->KVD * 4), "%s: move by 0 layer %u", what, l);
		read_kv(r, &d, l, 0, 30, kb, vb);
		CHECKF(!memcmp(va, vb, 30 * r->KVD * 4), "%s: V after a move there and back, layer %u", what, l);
		double e = nmse(ka, kb, 30 * r->KVD);
		worst_back = e > worst_back ? e : worst_back;
	}
	CHECKF(worst_back < 1e-5, "%s: K moved by 13 and back: NMSE %.3g", what, worst_back);

	/* composition: t's layer-0 K/V at 0.. moved by P equal t computed at P.. after w */
	kvt_seq_reset(&b);
	kvt_seq_reset(&c);
	int32_t wt[P + N];
	memcpy(wt, w, sizeof(w));
	memcpy(wt + P, t, N * sizeof(int32_t));
	CHECK(kvt_model_forward(r->m, &b, wt, P + N, NULL, 0) == KVT_OK);
	CHECK(kvt_model_kv_move(r->m, &a, 0, &c, P, N, P) == KVT_OK);
	c.n_tokens = P + N;
	read_kv(r, &b, 0, P, N, ka, va);
	read_kv(r, &c, 0, P, N, kb, vb);
	double ek = nmse(ka, kb, N * r->KVD), ev = nmse(va, vb, N * r->KVD);
	/* and a move by the wrong delta is far off: the check can tell */
	kvt_seq_reset(&c);
	CHECK(kvt_model_kv_move(r->m, &a, 0, &c, P, N, P + 3) == KVT_OK);
	c.n_tokens = P + N;
	read_kv(r, &c, 0, P, N, kb, vb);
	double ewrong = nmse(ka, kb, N * r->KVD);
	printf("%s: layer-0 K moved by %d vs computed there: NMSE %.3g (V %.3g); moved by %d: %.3g; there and back %.3g\n",
	       what, P, ek, ev, P + 3, ewrong, worst_back);
	CHECKF(ek < 1e-5 && ev < 1e-6, "%s: moved layer-0 K/V differ from those computed in place: K %.3g V %.3g", what, ek,
	       ev);
	CHECKF(ewrong > 1e-3, "%s: a wrong delta went unnoticed (%.3g)", what, ewrong);

	/* bad ranges */
	CHECK(kvt_model_kv_move(r->m, &a, 30, &c, 0, 20, 0) == KVT_EINVAL);
	CHECK(kvt_model_kv_move(r->m, &a, 0, &a, 10, 20, 0) == KVT_EINVAL);
	kvt_seq_deinit(&a);
	kvt_seq_deinit(&b);
	kvt_seq_deinit(&c);
	kvt_seq_deinit(&d);
	free(ka);
	free(va);
	free(kb);
	free(vb);
}

/*
 * A prefix of P tokens, then a tail of N tokens whose rows [c0, c0 + nc) are
 * a chunk placed from another context: the chunk's tokens computed alone at
 * 0.., moved to P + c0. The tail runs through kvt_model_forward_blend.
 */
static void test_blend(rig *r, const char *what, uint32_t max_batch)
{
	enum { P = 9, N = 70, C0 = 6, NC = 48 };
	int32_t pre[P], tail[N];
	uint8_t placed[N] = { 0 };
	float *lp = malloc(r->V * 4), *lb = malloc(r->V * 4);
	kvt_seq plain, ch, s;
	kvt_blend_result res;
	toks_fill(pre, P, r->V, 3);
	toks_fill(tail, N, r->V, 4);
	for (uint32_t i = C0; i < C0 + NC; i++)
		placed[i] = 1;
	CHECK(kvt_seq_init(&plain, r->dev, r->pool, 512) == KVT_OK && kvt_seq_init(&ch, r->dev, r->pool, 512) == KVT_OK &&
	      kvt_seq_init(&s, r->dev, r->pool, 512) == KVT_OK);
	CHECK(kvt_model_forward(r->m, &plain, pre, P, NULL, 0) == KVT_OK);
	CHECK(kvt_model_forward(r->m, &plain, tail, N, lp, 1) == KVT_OK);
	CHECK(kvt_model_forward(r->m, &ch, tail + C0, NC, NULL, 0) == KVT_OK);

	const float fractions[] = { 1.0f, 0.0f, 0.5f, 0.15f, 0.15f };
	for (size_t f = 0; f < sizeof(fractions) / sizeof(fractions[0]); f++) {
		const uint32_t sink = f == 4 ? 3 : 0; /* the last: a chunk's first rows taken first, within the fraction */
		kvt_seq_reset(&s);
		CHECK(kvt_model_forward(r->m, &s, pre, P, NULL, 0) == KVT_OK);
		CHECK(kvt_model_kv_move(r->m, &ch, 0, &s, P + C0, NC, (int32_t)(P + C0)) == KVT_OK);
		kvt_blend_params bp = { .recompute = fractions[f], .check_layer = 1, .n_sink = sink };
		CHECK(kvt_model_forward_blend(r->m, &s, tail, N, placed, &bp, lb, 1, &res) == KVT_OK);
		CHECK(s.n_tokens == P + N && res.n_placed == NC);
		bool finite = true;
		for (uint32_t i = 0; i < r->V; i++)
			finite = finite && isfinite(lb[i]);
		CHECKF(finite, "%s: blend logits not finite at recompute %g", what, fractions[f]);
		/* per forward chunk of max_batch rows: ceil(fraction x placed rows there) */
		uint32_t want = 0;
		for (uint32_t c0 = 0; c0 < N; c0 += max_batch) {
			uint32_t np = 0;
			for (uint32_t i = c0; i < N && i < c0 + max_batch; i++)
				np += placed[i];
			want += (uint32_t)ceilf(fractions[f] * (float)np - 1e-4f);
		}
		double kl = 0;
		if (fractions[f] == 1.0f) {
			CHECKF(!memcmp(lp, lb, r->V * 4), "%s: blend at recompute 1 differs from a plain prefill", what);
		} else {
			double zp = 0, zb = 0, mp = -1e30, mb = -1e30;
			for (uint32_t i = 0; i < r->V; i++) {
				mp = lp[i] > mp ? lp[i] : mp;
				mb = lb[i] > mb ? lb[i] : mb;
			}
			for (uint32_t i = 0; i < r->V; i++) {
				zp += exp(lp[i] - mp);
				zb += exp(lb[i] - mb);
			}
			for (uint32_t i = 0; i < r->V; i++) {
				double pp = exp(lp[i] - mp) / zp, pb = exp(lb[i] - mb) / zb;
				kl += pp * log((pp + 1e-30) / (pb + 1e-30));
			}
		}
		printf("%s (batch %u): recompute %.2f: %u of %u placed rows recomputed, KL to plain %.3g\n", what, max_batch,
		       fractions[f], res.n_recomputed, res.n_placed, kl);
		CHECKF(res.n_recomputed == want, "%s: recompute %g: %u rows recomputed, want %u", what, fractions[f],
		       res.n_recomputed, want);
	}

	/* placed from the same context (the plain prefill's own K/V): the plain logits at recompute 0 */
	kvt_seq_reset(&s);
	CHECK(kvt_model_forward(r->m, &s, pre, P, NULL, 0) == KVT_OK);
	CHECK(kvt_model_kv_move(r->m, &plain, P + C0, &s, P + C0, NC, 0) == KVT_OK);
	kvt_blend_params b0 = { .recompute = 0.0f, .check_layer = 1 };
	CHECK(kvt_model_forward_blend(r->m, &s, tail, N, placed, &b0, lb, 1, &res) == KVT_OK);
	float worst = 0;
	for (uint32_t i = 0; i < r->V; i++)
		worst = fmaxf(worst, fabsf(lp[i] - lb[i]));
	CHECKF(worst < 2e-3f, "%s: exact placement blended at 0 differs from plain by %g", what, worst);

	/* bad parameters: nothing appended */
	uint32_t had = s.n_tokens;
	kvt_blend_params bad = { .recompute = 1.5f, .check_layer = 1 };
	CHECK(kvt_model_forward_blend(r->m, &s, tail, 4, placed, &bad, NULL, 0, NULL) == KVT_EINVAL);
	bad = (kvt_blend_params){ .recompute = 0.5f, .check_layer = 0 };
	CHECK(kvt_model_forward_blend(r->m, &s, tail, 4, placed, &bad, NULL, 0, NULL) == KVT_EINVAL);
	CHECK(s.n_tokens == had);
	kvt_seq_deinit(&plain);
	kvt_seq_deinit(&ch);
	kvt_seq_deinit(&s);
	free(lp);
	free(lb);
}

int main(void)
{
	char dir[] = "/tmp/kvt_blend_XXXXXX", path[256];
	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/synth.gguf", dir);
	static const struct {
		const char *arch;
		uint32_t llama3_rope;
		const char *name;
	} variants[] = {
		{ "llama", 0, "llama" },
		{ "llama", 1, "llama3-scaled" },
		{ "qwen2", 0, "qwen2 (neox)" },
		{ "gemma3", 0, "gemma3 (neox, local layers)" },
	};
	for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
		kvt_synth_llama cfg;
		kvt_synth_llama_default(&cfg);
		cfg.arch = variants[v].arch;
		cfg.llama3_rope = variants[v].llama3_rope;
		cfg.n_layer = 4;
		cfg.n_embd = 96;
		cfg.n_head = 6;
		cfg.n_head_kv = 2;
		cfg.n_ff = 160;
		cfg.seed = 11;
		cfg.tied_embeddings = false;
		if (!strcmp(cfg.arch, "gemma3"))
			cfg.sliding_window = 24; /* shorter than the tail: the local layers' window matters */
		CHECK(kvt_synth_llama_write(&cfg, path) == KVT_OK);
		const uint32_t batches[] = { 512, 32 };
		for (size_t b = 0; b < 2; b++) {
			rig r;
			CHECK(rig_open(&r, path, batches[b]) == KVT_OK);
			if (b == 0)
				test_move(&r, variants[v].name);
			test_blend(&r, variants[v].name, batches[b]);
			rig_close(&r);
		}
	}
	unlink(path);
	rmdir(dir);
	return check_done("test_model_blend");
}
