/* ctest-labels: unit parity */
/*
 * tests/test_dev_parity.c — every device op of a backend under test against
 * the CPU reference kernels, on the same seeded inputs, over a grid of
 * shapes: 1 token, a partial block, several GQA ratios, head_dim 64 and 128,
 * a long context. Copies and KV stores must match bitwise; arithmetic gets a
 * per-op NMSE tolerance. Every output buffer is fenced by sentinel bytes that
 * must survive.
 *
 * Without a GPU, the backend under test is the CPU fast path (OpenBLAS and
 * OpenMP); with the CUDA backend built and a GPU present, the CUDA parity
 * test covers it the same way.
 */
#include "check.h"
#include "dev.h"
#include "gguf.h"

#include <stdint.h>

#define FENCE 64 /* sentinel bytes before and after each output */
#define SENTINEL 0xA5

static kvt_dev *ref, *dut, *dut8; /* dut8: the fast path with act_int8 (x rounded to int8 in the GEMV) */
static double worst_nmse[KVT_DTYPE_COUNT]; /* matmul, per weight dtype, for the log */
static double worst_nmse8[KVT_DTYPE_COUNT]; /* ... on dut8, x of any values */
static double worst_exact8[KVT_DTYPE_COUNT]; /* ... on dut8, x that int8 holds exactly */
static check_rng rng = { 0x1234567ull };

/* A buffer in one device with fences; returns the usable pointer. */
typedef struct fbuf {
	kvt_dev *d;          /* owner */
	unsigned char *base; /* allocation */
	size_t n;            /* usable bytes */
} fbuf;

static void *fb_alloc(fbuf *b, kvt_dev *d, size_t n)
{
	void *p;
	KVT_ASSERT(kvt_dev_alloc(d, n + 2 * FENCE, &p) == KVT_OK);
	b->d = d;
	b->base = p;
	b->n = n;
	memset(b->base, SENTINEL, n + 2 * FENCE); /* CPU: host-addressable */
	return b->base + FENCE;
}

static bool fb_fences_ok(const fbuf *b)
{
	for (size_t i = 0; i < FENCE; i++)
		if (b->base[i] != SENTINEL || b->base[FENCE + b->n + i] != SENTINEL)
			return false;
	return true;
}

static void fb_free(fbuf *b)
{
	kvt_dev_free(b->d, b->base);
}

static void fill_f32(float *x, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		x[i] = check_rng_f32(&rng) * scale;
}

/* Normalised mean squared error of b against reference a. */
static double nmse(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double d = (double)a[i] - b[i];
		num += d * d;
		den += (double)a[i] * a[i];
	}
	return den > 0 ? num / den : num;
}

/* Copy host data into a fenced buffer on device d. */
static void *upload(fbuf *b, kvt_dev *d, const void *h, size_t n)
{
	void *p = fb_alloc(b, d, n);
	KVT_ASSERT(kvt_dev_copy_h2d(d, p, h, n) == KVT_OK);
	return p;
}

/* Weights of dtype wdt from floats, as the loader would store them. */
static void *make_weights(int wdt, const float *wf, size_t n, size_t *bytes)
{
	static const uint32_t ggml[] = { KVT_GGML_F32, KVT_GGML_F16, KVT_GGML_Q8_0, KVT_GGML_Q4_0, KVT_GGML_Q4_1,
					 KVT_GGML_Q5_0, KVT_GGML_Q4_K, KVT_GGML_Q5_K, KVT_GGML_Q6_K };
	*bytes = kvt_dtype_row_bytes(wdt, n);
	void *w = malloc(*bytes);
	KVT_ASSERT(kvt_ggml_quantize(ggml[wdt], wf, w, n) == KVT_OK);
	return w;
}

/*
 * Whether dut8 takes int8 x for this op: every block-quantized type at any
 * row count (cpu_fast.c's mm_table: the int8 GEMV, or the GEMM in its order).
 */
static bool x8_op(int wdt, uint32_t M)
{
	(void)M;
	return wdt >= KVT_DTYPE_Q8_0;
}

/*
 * x whose every group of `group` elements (a 32-element block; 256 for the
 * K-quants, which round x with one scale per superblock) int8 holds
 * exactly: integers k (|k| <= 127, one of them +-127) times a power of two
 * per group, so the group's scale (amax / 127) and levels (x 127 / amax)
 * come out exact and the int8 GEMV owes the reference nothing but fp32
 * rounding.
 */
static void fill_int8_exact(float *x, size_t n, size_t group)
{
	for (size_t g = 0; g < n / group; g++) {
		const float step = ldexpf(1.0f, -(int)(3 + g % 7));
		const size_t peak = (uint32_t)(check_rng_u64(&rng) >> 32) % group;
		for (size_t j = 0; j < group; j++) {
			int k = (int)((uint32_t)(check_rng_u64(&rng) >> 32) % 255) - 127;
			if (j == peak)
				k = (uint32_t)(check_rng_u64(&rng) >> 32) % 2 ? 127 : -127;
			x[g * group + j] = (float)k * step;
		}
	}
}

/* mode 0: dut, any x; 1: dut8, any x; 2: dut8, x int8 holds exactly */
static void test_matmul_on(uint32_t M, uint32_t K, uint32_t N, int wdt, bool acc, int mode)
{
	size_t wn = (size_t)N * K, wbytes;
	float *wf = malloc(wn * 4), *x = malloc((size_t)M * K * 4), *y0 = malloc((size_t)M * N * 4);
	float *out[2];
	fill_f32(wf, wn, 0.5f);
	if (mode == 2)
		fill_int8_exact(x, (size_t)M * K, wdt >= KVT_DTYPE_Q4_K ? 256 : 32);
	else
		fill_f32(x, (size_t)M * K, 1.0f);
	fill_f32(y0, (size_t)M * N, 1.0f);
	void *wq = make_weights(wdt, wf, wn, &wbytes);
	kvt_dev *devs[2] = { ref, mode ? dut8 : dut };
	for (int i = 0; i < 2; i++) {
		fbuf bw, bx, by, bws;
		kvt_matmul_args a = { .n_rows = M, .n_in = K, .n_out = N, .w_dtype = wdt, .accumulate = acc };
		a.w = upload(&bw, devs[i], wq, wbytes);
		a.x = upload(&bx, devs[i], x, (size_t)M * K * 4);
		a.y = upload(&by, devs[i], y0, (size_t)M * N * 4);
		size_t wsb = kvt_dev_matmul_workspace_bytes(devs[i], &a);
		void *ws = wsb ? fb_alloc(&bws, devs[i], wsb) : NULL;
		CHECK(kvt_dev_matmul(devs[i], &a, ws) == KVT_OK);
		out[i] = malloc((size_t)M * N * 4);
		kvt_dev_copy_d2h(devs[i], out[i], a.y, (size_t)M * N * 4);
		CHECKF(fb_fences_ok(&by), "matmul %ux%ux%u fence", M, K, N);
		if (ws) {
			CHECK(fb_fences_ok(&bws));
			fb_free(&bws);
		}
		fb_free(&bw), fb_free(&bx), fb_free(&by);
	}
	/* The fast GEMV for block-quantized weights (any M, 4 rows at a time) rounds x
	 * to int16 per 32-block (documented in cpu_fast.c): ~1e-10 NMSE; all else is
	 * fp32 rounding. */
	double e = nmse(out[0], out[1], (size_t)M * N), tol = wdt >= KVT_DTYPE_Q8_0 ? 1e-8 : 1e-10;
	/* int8 x (act_int8): one part in 254 of each block's largest value, ~1e-4 NMSE
	 * measured; exact x leaves only fp32 rounding */
	if (mode == 1 && x8_op(wdt, M))
		tol = 1e-3;
	CHECKF(e < tol, "matmul M%u K%u N%u %s acc %d mode %d: nmse %g", M, K, N, kvt_dtype_name(wdt), acc, mode, e);
	double *worst = mode == 0 ? worst_nmse : mode == 1 ? worst_nmse8 : worst_exact8;
	worst[wdt] = fmax(worst[wdt], e);
	free(out[0]), free(out[1]), free(wf), free(wq), free(x), free(y0);
}

static void test_matmul(uint32_t M, uint32_t K, uint32_t N, int wdt, bool acc)
{
	test_matmul_on(M, K, N, wdt, acc, 0);
}

static void test_rows(uint32_t M, uint32_t D)
{
	size_t n = (size_t)M * D;
	float *x = malloc(n * 4), *w = malloc(D * 4), *u = malloc(n * 4), *o[2][5];
	fill_f32(x, n, 3.0f);
	fill_f32(w, D, 1.0f);
	fill_f32(u, n, 2.0f);
	kvt_dev *devs[2] = { ref, dut };
	for (int i = 0; i < 2; i++) {
		fbuf bx, bw, bu, by, bz;
		float *dx = upload(&bx, devs[i], x, n * 4), *dw = upload(&bw, devs[i], w, D * 4);
		float *du = upload(&bu, devs[i], u, n * 4), *dy = fb_alloc(&by, devs[i], n * 4);
		float *dz = upload(&bz, devs[i], u, n * 4);
		kvt_rmsnorm_args rn = { .n_rows = M, .n_dim = D, .eps = 1e-5f, .w = dw, .x = dx, .y = dy };
		kvt_swiglu_args sw = { .n = n, .gate = dx, .up = du, .y = du };
		kvt_add_args ad = { .n = n, .x = dx, .y = dz };
		CHECK(kvt_dev_rmsnorm(devs[i], &rn) == KVT_OK);
		CHECK(kvt_dev_swiglu(devs[i], &sw) == KVT_OK);
		CHECK(kvt_dev_add(devs[i], &ad) == KVT_OK);
		for (int j = 0; j < 5; j++)
			o[i][j] = malloc(n * 4);
		kvt_dev_copy_d2h(devs[i], o[i][0], dy, n * 4);
		kvt_dev_copy_d2h(devs[i], o[i][1], du, n * 4);
		kvt_dev_copy_d2h(devs[i], o[i][2], dz, n * 4);
		/* Gemma's GELU-tanh gate, and a bias row added to every row (Qwen2) */
		kvt_swiglu_args ge = { .n = n, .gate = dx, .up = dz, .y = dy, .act = KVT_ACT_GELU_TANH };
		kvt_add_args bias = { .n = n, .x = dw, .y = dz, .n_x = D };
		CHECK(kvt_dev_swiglu(devs[i], &ge) == KVT_OK);
		CHECK(kvt_dev_add(devs[i], &bias) == KVT_OK);
		kvt_dev_copy_d2h(devs[i], o[i][3], dy, n * 4);
		kvt_dev_copy_d2h(devs[i], o[i][4], dz, n * 4);
		kvt_add_args bad = bias;
		bad.n_x = D + 1;
		CHECK(n % (D + 1) == 0 || kvt_dev_add(devs[i], &bad) == KVT_EINVAL);
		CHECK(fb_fences_ok(&by) && fb_fences_ok(&bu) && fb_fences_ok(&bz));
		fb_free(&bx), fb_free(&bw), fb_free(&bu), fb_free(&by), fb_free(&bz);
	}
	CHECKF(nmse(o[0][3], o[1][3], n) < 1e-12, "gelu-tanh gate M%u D%u", M, D);
	CHECKF(!memcmp(o[0][4], o[1][4], n * 4), "bias add M%u D%u", M, D);
	for (size_t i = 0; i < n; i++) { /* against the formulas, in double */
		double g = x[i], up = o[0][2][i];
		double want = 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * up;
		CHECKF(fabs(o[0][3][i] - want) <= 1e-5 * (1 + fabs(want)), "gelu-tanh element %zu: %g vs %g", i,
		       o[0][3][i], want);
		CHECKF(o[0][4][i] == (float)(o[0][2][i] + w[i % D]), "bias element %zu", i);
	}
	CHECKF(nmse(o[0][0], o[1][0], n) < 1e-12, "rmsnorm M%u D%u", M, D);
	CHECKF(nmse(o[0][1], o[1][1], n) < 1e-12, "swiglu M%u D%u", M, D);
	CHECKF(!memcmp(o[0][2], o[1][2], n * 4), "add M%u D%u", M, D);
	/* rmsnorm against the formula, in double */
	for (uint32_t m = 0; m < M; m++) {
		double ss = 0;
		for (uint32_t k = 0; k < D; k++)
			ss += (double)x[m * D + k] * x[m * D + k];
		double r = 1.0 / sqrt(ss / D + 1e-5);
		double worst = 0;
		for (uint32_t k = 0; k < D; k++)
			worst = fmax(worst, fabs(o[0][0][m * D + k] - x[m * D + k] * r * w[k]));
		CHECKF(worst < 1e-5, "rmsnorm formula row %u: %g", m, worst);
	}
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 5; j++)
			free(o[i][j]);
	free(x), free(w), free(u);
}

static void test_rope(uint32_t M, uint32_t H, uint32_t hd, uint32_t n_rot, float base, uint32_t pos0)
{
	size_t n = (size_t)M * H * hd;
	float *x = malloc(n * 4), *o[2];
	int32_t *pos = malloc(M * 4);
	fill_f32(x, n, 1.0f);
	for (uint32_t m = 0; m < M; m++)
		pos[m] = (int32_t)(pos0 + m);
	kvt_dev *devs[2] = { ref, dut };
	for (int i = 0; i < 2; i++) {
		fbuf bx, bp;
		kvt_rope_args a = { .n_rows = M, .n_heads = H, .head_dim = hd, .n_rot = n_rot, .freq_base = base };
		a.x = upload(&bx, devs[i], x, n * 4);
		a.pos = upload(&bp, devs[i], pos, M * 4);
		CHECK(kvt_dev_rope(devs[i], &a) == KVT_OK);
		o[i] = malloc(n * 4);
		kvt_dev_copy_d2h(devs[i], o[i], a.x, n * 4);
		CHECK(fb_fences_ok(&bx));
		fb_free(&bx), fb_free(&bp);
	}
	CHECKF(nmse(o[0], o[1], n) < 1e-12, "rope M%u H%u hd%u", M, H, hd);
	/* against the closed form in double: pair i rotates by pos * base^(-2i/n_rot) */
	double worst = 0;
	for (uint32_t m = 0; m < M; m++)
		for (uint32_t h = 0; h < H; h++)
			for (uint32_t i = 0; i < hd; i += 2) {
				const float *xi = x + ((size_t)m * H + h) * hd + i;
				const float *oi = o[0] + ((size_t)m * H + h) * hd + i;
				double e0 = xi[0], e1 = xi[1];
				if (i < n_rot) {
					double th = pos[m] * pow(base, -(double)i / n_rot);
					e0 = xi[0] * cos(th) - xi[1] * sin(th);
					e1 = xi[0] * sin(th) + xi[1] * cos(th);
				}
				worst = fmax(worst, fmax(fabs(e0 - oi[0]), fabs(e1 - oi[1])));
			}
	/* fp32 angle accumulation at position ~4K loses a few ulps of a radian */
	CHECKF(worst < 2e-3, "rope closed form M%u pos0 %u: %g", M, pos0, worst);
	free(o[0]), free(o[1]), free(x), free(pos);
}

/* NEOX pairing (x[i], x[i + n_rot/2]) with per-pair angle divisors, against the closed form. */
static void test_rope_neox(uint32_t M, uint32_t H, uint32_t hd, uint32_t n_rot, float base, uint32_t pos0)
{
	size_t n = (size_t)M * H * hd;
	const uint32_t half = n_rot / 2;
	float *x = malloc(n * 4), *ff = malloc(half * 4), *o[2];
	int32_t *pos = malloc(M * 4);
	fill_f32(x, n, 1.0f);
	for (uint32_t i = 0; i < half; i++)
		ff[i] = 1.0f + (float)(i % 5); /* Llama 3 factors lie in [1, factor] */
	for (uint32_t m = 0; m < M; m++)
		pos[m] = (int32_t)(pos0 + m);
	kvt_dev *devs[2] = { ref, dut };
	for (int i = 0; i < 2; i++) {
		fbuf bx, bp, bf;
		kvt_rope_args a = { .n_rows = M, .n_heads = H, .head_dim = hd, .n_rot = n_rot, .freq_base = base,
				    .neox = true };
		a.x = upload(&bx, devs[i], x, n * 4);
		a.pos = upload(&bp, devs[i], pos, M * 4);
		a.freq_factors = upload(&bf, devs[i], ff, half * 4);
		CHECK(kvt_dev_rope(devs[i], &a) == KVT_OK);
		o[i] = malloc(n * 4);
		kvt_dev_copy_d2h(devs[i], o[i], a.x, n * 4);
		CHECK(fb_fences_ok(&bx));
		fb_free(&bx), fb_free(&bp), fb_free(&bf);
	}
	CHECKF(!memcmp(o[0], o[1], n * 4), "rope neox M%u H%u hd%u", M, H, hd);
	double worst = 0;
	for (uint32_t m = 0; m < M; m++)
		for (uint32_t h = 0; h < H; h++) {
			const float *xi = x + ((size_t)m * H + h) * hd, *oi = o[0] + ((size_t)m * H + h) * hd;
			for (uint32_t i = 0; i < half; i++) {
				double th = pos[m] * pow(base, -2.0 * i / n_rot) / ff[i];
				double e0 = xi[i] * cos(th) - xi[i + half] * sin(th);
				double e1 = xi[i] * sin(th) + xi[i + half] * cos(th);
				worst = fmax(worst, fmax(fabs(e0 - oi[i]), fabs(e1 - oi[i + half])));
			}
			for (uint32_t i = n_rot; i < hd; i++) /* dims past n_rot are left */
				worst = fmax(worst, fabs(xi[i] - oi[i]));
		}
	CHECKF(worst < 2e-3, "rope neox closed form M%u pos0 %u: %g", M, pos0, worst);
	free(o[0]), free(o[1]), free(x), free(ff), free(pos);
}

static void test_embed(uint32_t V, uint32_t D, int dt)
{
	const uint32_t M = 7;
	size_t tn = (size_t)V * D, tbytes;
	float *tf = malloc(tn * 4);
	int32_t ids[7] = { 0, 1, (int32_t)V - 1, 3 % V, 0, (int32_t)(V / 2), 2 % V };
	float *o[2];
	fill_f32(tf, tn, 1.0f);
	void *tq = make_weights(dt, tf, tn, &tbytes);
	kvt_dev *devs[2] = { ref, dut };
	for (int i = 0; i < 2; i++) {
		fbuf bt, bi, by;
		kvt_embed_args a = { .n_rows = M, .n_dim = D, .n_vocab = V, .table_dtype = dt };
		a.table = upload(&bt, devs[i], tq, tbytes);
		a.ids = upload(&bi, devs[i], ids, sizeof(ids));
		a.y = fb_alloc(&by, devs[i], (size_t)M * D * 4);
		CHECK(kvt_dev_embed(devs[i], &a) == KVT_OK);
		o[i] = malloc((size_t)M * D * 4);
		kvt_dev_copy_d2h(devs[i], o[i], a.y, (size_t)M * D * 4);
		CHECK(fb_fences_ok(&by));
		/* a scaled embedding (Gemma): each element times the scale, nothing else */
		float *sc = malloc((size_t)M * D * 4);
		a.scale = 8.0f;
		CHECK(kvt_dev_embed(devs[i], &a) == KVT_OK);
		kvt_dev_copy_d2h(devs[i], sc, a.y, (size_t)M * D * 4);
		for (size_t k = 0; k < (size_t)M * D; k++)
			CHECKF(sc[k] == o[i][k] * 8.0f, "embed scale element %zu", k);
		free(sc);
		a.scale = 0;
		kvt_dev_copy_h2d(devs[i], a.y, o[i], (size_t)M * D * 4);
		/* an id outside the vocabulary is refused, not read */
		int32_t bad = (int32_t)V;
		kvt_dev_copy_h2d(devs[i], (void *)a.ids, &bad, 4);
		CHECK(kvt_dev_embed(devs[i], &a) == KVT_EINVAL);
		fb_free(&bt), fb_free(&bi), fb_free(&by);
	}
	CHECKF(!memcmp(o[0], o[1], (size_t)M * D * 4), "embed V%u D%u %s", V, D, kvt_dtype_name(dt));
	/* and the rows are the dequantized weights, within the dtype's rounding */
	float worst = 0;
	for (uint32_t m = 0; m < M; m++)
		for (uint32_t k = 0; k < D; k++)
			worst = fmaxf(worst, fabsf(o[0][m * D + k] - tf[(size_t)ids[m] * D + k]));
	static const float tol[] = { 0, 1e-3f, 1.0f / 127, 1.0f / 7, 2.0f / 15, 1.0f / 15, 2.0f / 15, 1.0f / 15, 1.0f / 31 };
	CHECKF(worst <= tol[dt], "embed %s: max error %g", kvt_dtype_name(dt), worst);
	free(o[0]), free(o[1]), free(tf), free(tq);
}

/*
 * Paged attention (decode: one row; prefill: the blocked online-softmax
 * kernel of the fast path): n_ctx tokens already stored (written in two kv_store
 * calls, the second a partial block), then n_rows queries at the end.
 * The block table is a shuffled permutation of the pool's slots so paging is
 * really exercised. Compared: the K/V pool bytes (bitwise) and the outputs
 * (NMSE), and both against a dense attention computed here in double.
 */
static uint32_t attn_window; /* sliding window of the test_attention calls (0: none) */

static void test_attention(uint32_t n_kv, uint32_t group, uint32_t hd, uint32_t bt, uint32_t n_prev, uint32_t n_rows)
{
	const uint32_t L = 2, layer = 1, H = n_kv * group, n_ctx = n_prev + n_rows;
	const uint32_t n_blocks = (n_ctx + bt - 1) / bt, n_slots = n_blocks + 3;
	int32_t *table = malloc(n_blocks * 4);
	int32_t *perm = malloc(n_slots * 4);
	for (uint32_t i = 0; i < n_slots; i++)
		perm[i] = (int32_t)i;
	for (uint32_t i = n_slots - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(check_rng_u64(&rng) % (i + 1));
		int32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	memcpy(table, perm, n_blocks * 4);
	size_t kvn = (size_t)n_ctx * n_kv * hd, qn = (size_t)n_rows * H * hd;
	float *k = malloc(kvn * 4), *v = malloc(kvn * 4), *q = malloc(qn * 4), *o[2];
	fill_f32(k, kvn, 2.0f);
	fill_f32(v, kvn, 1.0f);
	fill_f32(q, qn, 2.0f);
	kvt_kv_layout lay = { .n_layers = L, .n_kv_heads = n_kv, .head_dim = hd, .block_tokens = bt, .n_slots = n_slots };
	size_t pool_bytes = kvt_kv_block_bytes(&lay) * n_slots;
	unsigned char *pools[2];
	kvt_dev *devs[2] = { ref, dut };
	for (int i = 0; i < 2; i++) {
		fbuf bp, bt_, bk, bv, bq, bo, bws;
		kvt_kv_layout l = lay;
		l.pool = fb_alloc(&bp, devs[i], pool_bytes);
		int32_t *dtab = upload(&bt_, devs[i], table, n_blocks * 4);
		float *dk = upload(&bk, devs[i], k, kvn * 4), *dv = upload(&bv, devs[i], v, kvn * 4);
		float *dq = upload(&bq, devs[i], q, qn * 4), *dout = fb_alloc(&bo, devs[i], qn * 4);
		/* store in two pieces: positions [0, n_prev) and [n_prev, n_ctx) */
		uint32_t cut[3] = { 0, n_prev, n_ctx };
		for (int s = 0; s < 2; s++) {
			if (cut[s + 1] == cut[s])
				continue;
			size_t off = (size_t)cut[s] * n_kv * hd;
			kvt_kv_store_args st = { .kv = &l, .layer = layer, .block_table = dtab, .pos0 = cut[s],
						 .n_rows = cut[s + 1] - cut[s], .k = dk + off, .v = dv + off };
			CHECK(kvt_dev_kv_store(devs[i], &st) == KVT_OK);
		}
		kvt_attention_args at = { .kv = &l, .layer = layer, .block_table = dtab, .pos0 = n_prev, .n_rows = n_rows,
					  .n_heads = H, .scale = 1.0f / sqrtf((float)hd), .q = dq, .out = dout,
					  .window = attn_window };
		size_t wsb = kvt_dev_attention_workspace_bytes(devs[i], &at);
		void *ws = wsb ? fb_alloc(&bws, devs[i], wsb) : NULL;
		CHECK(kvt_dev_attention(devs[i], &at, ws) == KVT_OK);
		o[i] = malloc(qn * 4);
		pools[i] = malloc(pool_bytes);
		kvt_dev_copy_d2h(devs[i], o[i], dout, qn * 4);
		kvt_dev_copy_d2h(devs[i], pools[i], l.pool, pool_bytes);
		CHECK(fb_fences_ok(&bp) && fb_fences_ok(&bo));
		if (ws) {
			CHECK(fb_fences_ok(&bws));
			fb_free(&bws);
		}
		fb_free(&bp), fb_free(&bt_), fb_free(&bk), fb_free(&bv), fb_free(&bq), fb_free(&bo);
	}
	CHECKF(!memcmp(pools[0], pools[1], pool_bytes), "kv_store bytes kv%u hd%u bt%u ctx%u", n_kv, hd, bt, n_ctx);
	double e = nmse(o[0], o[1], qn);
	CHECKF(e < 1e-10, "attention kv%u g%u hd%u bt%u prev%u rows%u window %u: nmse %g", n_kv, group, hd, bt, n_prev,
	       n_rows, attn_window, e);

	/* dense reference in double, with K/V rounded to fp16 as stored */
	double num = 0, den = 0;
	double *sc = malloc(n_ctx * sizeof(double));
	for (uint32_t m = 0; m < n_rows; m++)
		for (uint32_t h = 0; h < H; h++) {
			uint32_t kh = h / group, vis = n_prev + m + 1;
			uint32_t first = attn_window && vis > attn_window ? vis - attn_window : 0; /* the window */
			const float *qq = q + ((size_t)m * H + h) * hd;
			double mx = -1e300, sum = 0;
			for (uint32_t p = first; p < vis; p++) {
				double s = 0;
				for (uint32_t j = 0; j < hd; j++)
					s += qq[j] * (double)kvt_f16_to_f32(kvt_f32_to_f16(k[((size_t)p * n_kv + kh) * hd + j]));
				sc[p] = s / sqrt((double)hd);
				mx = fmax(mx, sc[p]);
			}
			for (uint32_t p = first; p < vis; p++)
				sum += (sc[p] = exp(sc[p] - mx));
			for (uint32_t j = 0; j < hd; j++) {
				double acc = 0;
				for (uint32_t p = first; p < vis; p++)
					acc += sc[p] / sum * kvt_f16_to_f32(kvt_f32_to_f16(v[((size_t)p * n_kv + kh) * hd + j]));
				double got = o[0][((size_t)m * H + h) * hd + j];
				num += (acc - got) * (acc - got);
				den += acc * acc;
			}
		}
	CHECKF(num / den < 1e-10, "attention vs dense kv%u g%u hd%u window %u: nmse %g", n_kv, group, hd, attn_window,
	       num / den);
	free(sc), free(o[0]), free(o[1]), free(pools[0]), free(pools[1]);
	free(k), free(v), free(q), free(table), free(perm);
}

/* An FP8 E4M3 ("FN") code as dev.h defines it, decoded here on its own: 4
 * exponent bits (bias 7), 3 mantissa bits, subnormals m * 2^-9. */
static float fp8_value(uint8_t c)
{
	const int e = (c >> 3) & 15, m = c & 7;
	const float v = e ? ldexpf(1.0f + (float)m / 8, e - 7) : ldexpf((float)m, -9);
	return c & 0x80 ? -v : v;
}

/*
 * kv_load, kv_store's inverse: n_rows tokens of random K/V stored at pos0 (not
 * block-aligned, so the first and last blocks are partial) in one layer of a
 * pool paged through a shuffled block table, then loaded back on both paths
 * into fenced rows. The paths must agree bitwise. An fp16 pool gives back the
 * inputs rounded to fp16, bit for bit, and a kv_store of what was loaded, into
 * a second pool, writes the same bytes as the first store. An 8-bit pool gives
 * each code times its group's scale, read here from the pool bytes as dev.h
 * lays them out, exactly, and within the codec's rounding of the inputs.
 */
static void test_kv_load(int codec, uint32_t n_kv, uint32_t hd, uint32_t bt, uint32_t pos0, uint32_t n_rows)
{
	const uint32_t L = 2, layer = 1, n_ctx = pos0 + n_rows;
	const uint32_t n_blocks = (n_ctx + bt - 1) / bt, n_slots = n_blocks + 2;
	int32_t *table = malloc(n_slots * 4);
	for (uint32_t i = 0; i < n_slots; i++)
		table[i] = (int32_t)i;
	for (uint32_t i = n_slots - 1; i > 0; i--) { /* the table: a shuffled slice of the slots */
		uint32_t j = (uint32_t)(check_rng_u64(&rng) % (i + 1));
		int32_t t = table[i];
		table[i] = table[j];
		table[j] = t;
	}
	const size_t kvn = (size_t)n_rows * n_kv * hd;
	float *k = malloc(kvn * 4), *v = malloc(kvn * 4), *o[2][2];
	fill_f32(k, kvn, 2.0f);
	fill_f32(v, kvn, 3.0f);
	k[0] = 0.0f; /* a zero, and for 8-bit pools a vector with a group of zeros (both scales 0) */
	if (codec != KVT_KV_CODEC_F16)
		memset(v + kvn - hd, 0, kvt_kv_group_dims(codec, hd) * 4);
	kvt_kv_layout lay = { .n_layers = L, .n_kv_heads = n_kv, .head_dim = hd, .block_tokens = bt,
			      .n_slots = n_slots, .codec = codec };
	const size_t pool_bytes = kvt_kv_block_bytes(&lay) * n_slots;
	unsigned char *pools[2];
	kvt_dev *devs[2] = { ref, dut };
	for (int i = 0; i < 2; i++) {
		fbuf bp, bp2, bt_, bk, bv, bok, bov;
		kvt_kv_layout l = lay, l2 = lay;
		l.pool = fb_alloc(&bp, devs[i], pool_bytes);
		int32_t *dtab = upload(&bt_, devs[i], table, n_blocks * 4);
		float *dk = upload(&bk, devs[i], k, kvn * 4), *dv = upload(&bv, devs[i], v, kvn * 4);
		kvt_kv_store_args st = { .kv = &l, .layer = layer, .block_table = dtab, .pos0 = pos0, .n_rows = n_rows,
					 .k = dk, .v = dv };
		CHECK(kvt_dev_kv_store(devs[i], &st) == KVT_OK);
		kvt_kv_load_args ld = { .kv = &l, .layer = layer, .block_table = dtab, .pos0 = pos0, .n_rows = n_rows };
		ld.k = fb_alloc(&bok, devs[i], kvn * 4);
		ld.v = fb_alloc(&bov, devs[i], kvn * 4);
		CHECK(kvt_dev_kv_load(devs[i], &ld) == KVT_OK);
		for (int j = 0; j < 2; j++)
			o[i][j] = malloc(kvn * 4);
		kvt_dev_copy_d2h(devs[i], o[i][0], ld.k, kvn * 4);
		kvt_dev_copy_d2h(devs[i], o[i][1], ld.v, kvn * 4);
		pools[i] = malloc(pool_bytes);
		kvt_dev_copy_d2h(devs[i], pools[i], l.pool, pool_bytes);
		CHECKF(fb_fences_ok(&bp) && fb_fences_ok(&bok) && fb_fences_ok(&bov), "kv_load %s fences on %s",
		       kvt_kv_codec_name(codec), kvt_dev_name(devs[i]));
		if (codec == KVT_KV_CODEC_F16) { /* store what was loaded into a second pool: the same bytes */
			unsigned char *again = malloc(pool_bytes);
			l2.pool = fb_alloc(&bp2, devs[i], pool_bytes);
			st.kv = &l2, st.k = ld.k, st.v = ld.v;
			CHECK(kvt_dev_kv_store(devs[i], &st) == KVT_OK);
			kvt_dev_copy_d2h(devs[i], again, l2.pool, pool_bytes);
			CHECKF(!memcmp(again, pools[i], pool_bytes),
			       "kv_store(kv_load) kv%u hd%u bt%u pos0 %u rows %u on %s: pool bytes differ", n_kv, hd, bt,
			       pos0, n_rows, kvt_dev_name(devs[i]));
			CHECK(fb_fences_ok(&bp2));
			fb_free(&bp2);
			free(again);
		}
		/* no rows, and a layer past the pool's, are refused, each with one error line */
		kvt_kv_load_args bad = ld;
		bad.n_rows = 0;
		check_log_capture();
		CHECK(kvt_dev_kv_load(devs[i], &bad) == KVT_EINVAL);
		bad = ld;
		bad.layer = L;
		CHECK(kvt_dev_kv_load(devs[i], &bad) == KVT_EINVAL);
		CHECK(check_log_n_errors == 2 && strstr(check_log_text, "dev.kv_load: layer 2 of 2") != NULL);
		kvt_log_set_sink(NULL, NULL);
		fb_free(&bp), fb_free(&bt_), fb_free(&bk), fb_free(&bv), fb_free(&bok), fb_free(&bov);
	}
	CHECKF(!memcmp(pools[0], pools[1], pool_bytes), "kv_store bytes %s kv%u hd%u", kvt_kv_codec_name(codec), n_kv,
	       hd);
	CHECKF(!memcmp(o[0][0], o[1][0], kvn * 4) && !memcmp(o[0][1], o[1][1], kvn * 4),
	       "kv_load %s kv%u hd%u bt%u pos0 %u rows %u: paths differ", kvt_kv_codec_name(codec), n_kv, hd, bt, pos0,
	       n_rows);

	/* against the inputs (fp16: exact) and the pool's bytes (8-bit: exact) */
	const uint32_t gd = kvt_kv_group_dims(codec, hd), ng = gd ? hd / gd : 0;
	const size_t n_vec = (size_t)L * 2 * n_kv * bt, blk_bytes = kvt_kv_block_bytes(&lay);
	int bad_exact = 0, bad_bound = 0;
	for (uint32_t m = 0; m < n_rows; m++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < n_kv; h++) {
				const size_t row = ((size_t)m * n_kv + h) * hd;
				const float *x = (kv ? v : k) + row, *got = o[0][kv] + row;
				if (codec == KVT_KV_CODEC_F16) {
					for (uint32_t i = 0; i < hd; i++) {
						float want = kvt_f16_to_f32(kvt_f32_to_f16(x[i]));
						bad_exact += memcmp(&want, &got[i], 4) != 0;
					}
					continue;
				}
				const uint32_t pos = pos0 + m, t = pos % bt;
				const uint8_t *blk = pools[0] + (size_t)table[pos / bt] * blk_bytes;
				const size_t vi = (((size_t)layer * 2 + kv) * n_kv + h) * bt + t;
				for (uint32_t g = 0; g < ng; g++) {
					float sc, amax = 0;
					memcpy(&sc, blk + n_vec * hd + (vi * ng + g) * 4, 4);
					for (uint32_t i = g * gd; i < (g + 1) * gd; i++)
						amax = fmaxf(amax, fabsf(kvt_f16_to_f32(kvt_f32_to_f16(x[i]))));
					for (uint32_t i = g * gd; i < (g + 1) * gd; i++) {
						const uint8_t c = blk[vi * hd + i];
						const bool fp8 = codec == KVT_KV_CODEC_FP8;
						const float want = (fp8 ? fp8_value(c) : (float)(int8_t)c) * sc;
						bad_exact += memcmp(&want, &got[i], 4) != 0;
						/* of the fp16-rounded input: INT8 half a step of amax / 127; FP8 half
						 * a step of 3 mantissa bits (a 16th), or of a subnormal's 2^-9 */
						const float x16 = kvt_f16_to_f32(kvt_f32_to_f16(x[i]));
						const float tol = fp8 ? fabsf(x16) / 16 + amax / 448 / 1024 : amax / 127 / 2;
						bad_bound += fabsf(got[i] - x16) > tol * 1.0001f;
					}
				}
			}
	CHECKF(bad_exact == 0, "kv_load %s kv%u hd%u bt%u pos0 %u rows %u: %d values not exact",
	       kvt_kv_codec_name(codec), n_kv, hd, bt, pos0, n_rows, bad_exact);
	CHECKF(bad_bound == 0, "kv_load %s kv%u hd%u: %d values outside the codec's rounding", kvt_kv_codec_name(codec),
	       n_kv, hd, bad_bound);
	for (int i = 0; i < 2; i++)
		free(o[i][0]), free(o[i][1]), free(pools[i]);
	free(k), free(v), free(table);
}

static void test_argmax(void)
{
	const uint32_t R = 3, C = 1000;
	float x[3000];
	fill_f32(x, R * C, 1.0f);
	x[17] = 5, x[1000 + 999] = 5, x[2000 + 3] = 5, x[2000 + 4] = 5; /* tie: lowest index wins */
	kvt_dev *devs[2] = { ref, dut };
	for (int i = 0; i < 2; i++) {
		fbuf bx, bo;
		kvt_argmax_args a = { .n_rows = R, .n_cols = C };
		a.x = upload(&bx, devs[i], x, sizeof(x));
		a.out = fb_alloc(&bo, devs[i], R * 4);
		CHECK(kvt_dev_argmax(devs[i], &a) == KVT_OK);
		int32_t got[3];
		kvt_dev_copy_d2h(devs[i], got, a.out, sizeof(got));
		CHECK(got[0] == 17 && got[1] == 999 && got[2] == 3);
		CHECK(fb_fences_ok(&bo));
		fb_free(&bx), fb_free(&bo);
	}
	/* the fast path (eight running maxima) against the reference's loop: rows of 1..300 values
	 * from few levels (ties), with NaNs (one row starting with one), both zeros and infinities */
	enum { RR = 64, CC = 300 };
	static float y[RR * CC];
	const float lv[] = { 1.0f, 2.0f, 2.0f, 0.0f, -0.0f, INFINITY, -INFINITY, NAN };
	uint32_t seed = 7;
	for (int i = 0; i < RR * CC; i++) {
		seed = seed * 1664525u + 1013904223u;
		y[i] = lv[(seed >> 9) % 8] - (float)((seed >> 20) % 3);
	}
	y[5 * CC] = NAN;
	for (uint32_t cols = 1; cols <= CC; cols += 13) {
		int32_t got[2][RR];
		for (int i = 0; i < 2; i++) {
			fbuf bx, bo;
			kvt_argmax_args a = { .n_rows = RR, .n_cols = cols };
			float *rows = malloc(sizeof(float) * RR * cols);
			for (int r = 0; r < RR; r++)
				memcpy(rows + (size_t)r * cols, y + (size_t)r * CC, cols * sizeof(float));
			a.x = upload(&bx, devs[i], rows, sizeof(float) * RR * cols);
			a.out = fb_alloc(&bo, devs[i], RR * 4);
			CHECK(kvt_dev_argmax(devs[i], &a) == KVT_OK);
			kvt_dev_copy_d2h(devs[i], got[i], a.out, sizeof(got[i]));
			fb_free(&bx), fb_free(&bo);
			free(rows);
		}
		for (int r = 0; r < RR; r++)
			CHECKF(got[0][r] == got[1][r], "argmax row %d of %u: reference %d, fast %d", r, cols, got[0][r],
			       got[1][r]);
	}
}

/*
 * Handcrafted blocks, decoded through matmul with unit vectors x = e_k on
 * both paths: every element must come out exactly as the layout in dev.h
 * says (d = 0.5, m = -1, q = j mod 16 or j - 16).
 */
static void test_quant_layouts(void)
{
	uint8_t q80[34], q40[18], q41[20];
	uint16_t half = kvt_f32_to_f16(0.5f), minus1 = kvt_f32_to_f16(-1.0f);
	memcpy(q80, &half, 2), memcpy(q40, &half, 2), memcpy(q41, &half, 2), memcpy(q41 + 2, &minus1, 2);
	for (int j = 0; j < 32; j++)
		q80[2 + j] = (uint8_t)(int8_t)(j - 16);
	for (int j = 0; j < 16; j++)
		q40[2 + j] = q41[4 + j] = (uint8_t)((j & 15) | ((15 - j) << 4));
	const struct { int dt; const void *blk; size_t n; } cases[] = {
		{ KVT_DTYPE_Q8_0, q80, 34 }, { KVT_DTYPE_Q4_0, q40, 18 }, { KVT_DTYPE_Q4_1, q41, 20 } };
	kvt_dev *devs[2] = { ref, dut };
	for (size_t c = 0; c < 3; c++)
		for (int i = 0; i < 2; i++) {
			fbuf bw, bx, by;
			float x[32 * 32] = { 0 }, y[32];
			for (int k = 0; k < 32; k++)
				x[k * 32 + k] = 1; /* row k of x is e_k */
			kvt_matmul_args a = { .n_rows = 32, .n_in = 32, .n_out = 1, .w_dtype = cases[c].dt };
			a.w = upload(&bw, devs[i], cases[c].blk, cases[c].n);
			a.x = upload(&bx, devs[i], x, sizeof(x));
			a.y = fb_alloc(&by, devs[i], sizeof(y));
			fbuf bws;
			size_t wsb = kvt_dev_matmul_workspace_bytes(devs[i], &a);
			void *ws = wsb ? fb_alloc(&bws, devs[i], wsb) : NULL;
			CHECK(kvt_dev_matmul(devs[i], &a, ws) == KVT_OK);
			kvt_dev_copy_d2h(devs[i], y, a.y, sizeof(y));
			int bad = 0;
			for (int j = 0; j < 32; j++) {
				int q = j < 16 ? j : 15 - (j - 16);
				float want = cases[c].dt == KVT_DTYPE_Q8_0 ? 0.5f * (j - 16)
					     : cases[c].dt == KVT_DTYPE_Q4_0 ? 0.5f * (q - 8) : 0.5f * q - 1.0f;
				bad += y[j] != want;
			}
			CHECKF(bad == 0, "%s layout on %s: %d elements wrong", kvt_dtype_name(cases[c].dt),
			       kvt_dev_name(devs[i]), bad);
			if (ws)
				fb_free(&bws);
			fb_free(&bw), fb_free(&bx), fb_free(&by);
		}
}

/*
 * Q8_0 levels over the whole byte range, -128 included (llama.cpp's quantizer
 * writes +-127 only, but a file may hold any byte), through the int8 GEMV:
 * its byte multiply takes |q| with q's sign moved onto x, so -128 must come
 * out as 128 times -x. x int8 holds exactly, so only fp32 rounding is owed.
 */
static void test_q8_0_full_range(void)
{
	enum { K = 256, N = 5 };
	uint8_t w[N * (K / 32) * 34];
	uint16_t d = kvt_f32_to_f16(0.0078125f);
	for (int n = 0; n < N; n++)
		for (int b = 0; b < K / 32; b++) {
			uint8_t *blk = w + ((size_t)n * (K / 32) + b) * 34;
			memcpy(blk, &d, 2);
			for (int j = 0; j < 32; j++)
				blk[2 + j] = (uint8_t)((b * 32 + j) * 37 + n * 11); /* every byte value, -128 too */
		}
	for (uint32_t M = 1; M <= 3; M += 2) {
		float x[3 * K], y[2][3 * N];
		fill_int8_exact(x, (size_t)M * K, 32);
		kvt_dev *devs[2] = { ref, dut8 };
		for (int i = 0; i < 2; i++) {
			fbuf bw, bx, by, bws;
			kvt_matmul_args a = { .n_rows = M, .n_in = K, .n_out = N, .w_dtype = KVT_DTYPE_Q8_0 };
			a.w = upload(&bw, devs[i], w, sizeof(w));
			a.x = upload(&bx, devs[i], x, (size_t)M * K * 4);
			a.y = fb_alloc(&by, devs[i], (size_t)M * N * 4);
			size_t wsb = kvt_dev_matmul_workspace_bytes(devs[i], &a);
			void *ws = wsb ? fb_alloc(&bws, devs[i], wsb) : NULL;
			CHECK(kvt_dev_matmul(devs[i], &a, ws) == KVT_OK);
			kvt_dev_copy_d2h(devs[i], y[i], a.y, (size_t)M * N * 4);
			if (ws)
				fb_free(&bws);
			fb_free(&bw), fb_free(&bx), fb_free(&by);
		}
		double e = nmse(y[0], y[1], (size_t)M * N);
		CHECKF(e < 1e-10, "q8_0 full byte range, int8 x, M %u: nmse %g", M, e);
	}
}

/*
 * The new layouts element by element: every element of a row of random
 * blocks (random bytes, finite scales) read through the matmul of both
 * backends against e_k rows, and through embed, equals gguf_quant.c's dequantizer
 * (written separately and checked against gguf-py) on the same bytes.
 */
static void test_kquant_layouts(void)
{
	static const struct { int dt; uint32_t ggml, elems, bytes; } cases[] = {
		{ KVT_DTYPE_Q5_0, KVT_GGML_Q5_0, 32, 22 },   { KVT_DTYPE_Q4_K, KVT_GGML_Q4_K, 256, 144 },
		{ KVT_DTYPE_Q5_K, KVT_GGML_Q5_K, 256, 176 }, { KVT_DTYPE_Q6_K, KVT_GGML_Q6_K, 256, 210 } };
	const uint32_t K = 512; /* two superblocks, 16 Q5_0 blocks */
	float *x = calloc((size_t)K * K, 4), *want = malloc(K * 4), *y = malloc(K * 4);
	uint8_t *row = malloc(K / 32 * 22 > K / 256 * 210 ? K / 32 * 22 : K / 256 * 210);
	for (uint32_t k = 0; k < K; k++)
		x[(size_t)k * K + k] = 1; /* row k of x is e_k */
	for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
		const size_t nbytes = K / cases[c].elems * cases[c].bytes;
		for (size_t i = 0; i < nbytes; i++)
			row[i] = (uint8_t)(check_rng_u64(&rng) >> 56);
		for (size_t b = 0; b < K / cases[c].elems; b++) { /* scales: small finite halves */
			uint8_t *blk = row + b * cases[c].bytes;
			uint16_t h0 = kvt_f32_to_f16(0.01f * (1 + (float)b)), h1 = kvt_f32_to_f16(0.003f * (2 + (float)b));
			if (cases[c].dt == KVT_DTYPE_Q6_K)
				memcpy(blk + 208, &h0, 2);
			else
				memcpy(blk, &h0, 2);
			if (cases[c].dt == KVT_DTYPE_Q4_K || cases[c].dt == KVT_DTYPE_Q5_K)
				memcpy(blk + 2, &h1, 2);
		}
		CHECK(kvt_ggml_dequantize(cases[c].ggml, row, want, K) == KVT_OK);
		kvt_dev *devs[2] = { ref, dut };
		for (int i = 0; i < 2; i++) {
			/* M = 4 takes the fast path's quantized GEMV, so also run rows 0..3 alone */
			for (uint32_t M = K; M >= 4; M = M == K ? 4 : 0) {
				fbuf bw, bx, by, bws;
				kvt_matmul_args a = { .n_rows = M, .n_in = K, .n_out = 1, .w_dtype = cases[c].dt };
				a.w = upload(&bw, devs[i], row, nbytes);
				a.x = upload(&bx, devs[i], x, (size_t)M * K * 4);
				a.y = fb_alloc(&by, devs[i], M * 4);
				size_t wsb = kvt_dev_matmul_workspace_bytes(devs[i], &a);
				void *ws = wsb ? fb_alloc(&bws, devs[i], wsb) : NULL;
				CHECK(kvt_dev_matmul(devs[i], &a, ws) == KVT_OK);
				kvt_dev_copy_d2h(devs[i], y, a.y, M * 4);
				int bad = 0;
				for (uint32_t k = 0; k < M; k++)
					bad += fabsf(y[k] - want[k]) > 1e-6f * (1 + fabsf(want[k]));
				CHECKF(bad == 0, "%s layout (matmul, %u rows) on %s: %d elements wrong",
				       kvt_dtype_name(cases[c].dt), M, kvt_dev_name(devs[i]), bad);
				if (ws)
					fb_free(&bws);
				fb_free(&bw), fb_free(&bx), fb_free(&by);
			}
			fbuf bt, bi, bo;
			int32_t id = 0;
			kvt_embed_args e = { .n_rows = 1, .n_dim = K, .n_vocab = 1, .table_dtype = cases[c].dt };
			e.table = upload(&bt, devs[i], row, nbytes);
			e.ids = upload(&bi, devs[i], &id, 4);
			e.y = fb_alloc(&bo, devs[i], K * 4);
			CHECK(kvt_dev_embed(devs[i], &e) == KVT_OK);
			kvt_dev_copy_d2h(devs[i], y, e.y, K * 4);
			/* NOTE: not bitwise: gnu11 lets the compiler fuse d * sc * q - dmin * mn
			 * into an FMA in one file and not in the other */
			int bad = 0;
			for (uint32_t k = 0; k < K; k++)
				bad += fabsf(y[k] - want[k]) > 1e-6f * (1 + fabsf(want[k]));
			CHECKF(bad == 0, "%s layout (embed) on %s: %d elements wrong", kvt_dtype_name(cases[c].dt),
			       kvt_dev_name(devs[i]), bad);
			fb_free(&bt), fb_free(&bi), fb_free(&bo);
		}
	}
	free(x), free(want), free(y), free(row);
}

/* Rows that are not whole blocks are refused, naming the dtype. */
static void test_block_rows(void)
{
	float x[4 * 288] = { 0 }, y[4];
	uint8_t w[2 * 210] = { 0 };
	for (int dt = KVT_DTYPE_Q4_K; dt < KVT_DTYPE_COUNT; dt++) {
		/* 288 = 9 x 32: whole 32-blocks but not whole superblocks */
		kvt_matmul_args a = { .n_rows = 1, .n_in = 288, .n_out = 1, .w_dtype = dt, .w = w, .x = x, .y = y };
		CHECKF(kvt_dev_matmul(ref, &a, NULL) == KVT_EINVAL, "%s with 288-element rows accepted",
		       kvt_dtype_name(dt));
		int32_t id = 0;
		kvt_embed_args e = { .n_rows = 1, .n_dim = 288, .n_vocab = 1, .table_dtype = dt, .table = w,
				     .ids = &id, .y = x };
		CHECK(kvt_dev_embed(dut, &e) == KVT_EINVAL);
	}
	kvt_matmul_args a = { .n_rows = 1, .n_in = 48, .n_out = 1, .w_dtype = KVT_DTYPE_Q5_0, .w = w, .x = x, .y = y };
	CHECK(kvt_dev_matmul(ref, &a, NULL) == KVT_EINVAL);
	CHECK(kvt_dtype_row_bytes(KVT_DTYPE_Q5_0, 64) == 44 && kvt_dtype_row_bytes(KVT_DTYPE_Q4_K, 512) == 288);
	CHECK(kvt_dtype_row_bytes(KVT_DTYPE_Q5_K, 256) == 176 && kvt_dtype_row_bytes(KVT_DTYPE_Q6_K, 768) == 630);
	CHECK(kvt_dtype_block_elems(KVT_DTYPE_Q6_K) == 256 && kvt_dtype_block_elems(KVT_DTYPE_Q5_0) == 32);
	CHECK(!strcmp(kvt_dtype_name(KVT_DTYPE_Q4_K), "q4_k") && !strcmp(kvt_dtype_name(KVT_DTYPE_Q6_K), "q6_k"));
	for (int dt = 0; dt < KVT_DTYPE_COUNT; dt++)
		CHECK(kvt_dev_supports_dtype(ref, dt) && kvt_dev_supports_dtype(dut, dt));
	CHECK(!kvt_dev_supports_dtype(ref, KVT_DTYPE_COUNT));
}

static void test_f16_exhaustive(void)
{
	/* every finite half survives half -> float -> half exactly */
	int bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		if ((h & 0x7c00) == 0x7c00)
			continue;
		bad += kvt_f32_to_f16(kvt_f16_to_f32((uint16_t)h)) != h;
	}
	CHECK_EQ_INT(bad, 0);
	/* round to nearest even at a tie, overflow, underflow, subnormals */
	CHECK(kvt_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00);        /* tie -> even (down) */
	CHECK(kvt_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02);        /* tie -> even (up) */
	CHECK(kvt_f32_to_f16(65520.0f) == 0x7c00);                  /* rounds to inf */
	CHECK(kvt_f32_to_f16(65504.0f) == 0x7bff);
	CHECK(kvt_f32_to_f16(5.9604645e-8f) == 0x0001);              /* smallest subnormal */
	CHECK(kvt_f32_to_f16(2.0e-8f) == 0x0000);
	CHECK(kvt_f16_to_f32(0x0001) == 5.9604645e-8f);
	CHECK(isnan(kvt_f16_to_f32(kvt_f32_to_f16(NAN))));
}

int main(void)
{
	kvt_dev_config rc = { .kind = KVT_DEV_CPU, .use_ref = true };
	kvt_dev_config fc = { .kind = KVT_DEV_CPU, .use_ref = false, .n_threads = 2 };
	kvt_dev_config fc8 = { .kind = KVT_DEV_CPU, .use_ref = false, .n_threads = 2, .act_int8 = true };
	if (kvt_dev_create(&rc, &ref) || kvt_dev_create(&fc, &dut) || kvt_dev_create(&fc8, &dut8))
		return 1;
	printf("reference: %s\nunder test: %s\n", kvt_dev_name(ref), kvt_dev_name(dut));

	test_f16_exhaustive();
	/*
	 * 1-4 rows: one GEMV group; more: groups of 4 (5, 9, 17, 33, 65 end in a
	 * group of 1). With the int8 GEMM (12 rows and up): 12 pads its group of
	 * 16, 17, 33 and 65 end in a group of 1, 130 in 2.
	 */
	static const uint32_t rows[] = { 1, 3, 4, 5, 8, 9, 12, 17, 33, 64, 65, 130 };
	for (size_t i = 0; i < sizeof(rows) / sizeof(*rows); i++) {
		test_matmul(rows[i], 64, 96, KVT_DTYPE_F32, false);
		test_matmul(rows[i], 96, 300, KVT_DTYPE_F16, i % 2);
		test_matmul(rows[i], 100, 33, KVT_DTYPE_F32, true);
	}
	test_matmul(9, 576, 600, KVT_DTYPE_F16, false); /* several column tiles a task */
	for (int dt = KVT_DTYPE_Q8_0; dt <= KVT_DTYPE_Q4_1; dt++)
		for (size_t i = 0; i < sizeof(rows) / sizeof(*rows); i++)
			test_matmul(rows[i], i % 2 ? 576 : 64, i % 2 ? 300 : 49, dt, i % 3 == 0);
	/* K-quants: rows of whole 256-element superblocks, one and several */
	for (int dt = KVT_DTYPE_Q5_0; dt < KVT_DTYPE_COUNT; dt++)
		for (size_t i = 0; i < sizeof(rows) / sizeof(*rows); i++)
			test_matmul(rows[i], i % 2 ? 768 : 256, i % 2 ? 300 : 49, dt, i % 3 == 0);
	/*
	 * act_int8: every quantized type on dut8 (those without an int8 kernel
	 * keep int16's tolerance), on x of any values and on x int8 holds
	 * exactly (the int8 kernels then owe the reference fp32 rounding only);
	 * Gemma 3's 640-wide rows end Q5_0 in a group of 4 blocks.
	 */
	for (int dt = KVT_DTYPE_Q8_0; dt < KVT_DTYPE_COUNT; dt++)
		for (size_t i = 0; i < sizeof(rows) / sizeof(*rows); i++)
			for (int mode = 1; mode <= 2; mode++) {
				uint32_t K = dt == KVT_DTYPE_Q5_0 ? (i % 2 ? 640 : 96) : dt < KVT_DTYPE_Q5_0 ? (i % 2 ? 576 : 64)
									    : (i % 2 ? 768 : 256);
				test_matmul_on(rows[i], K, i % 2 ? 300 : 49, dt, i % 3 == 0, mode);
			}
	test_quant_layouts();
	test_q8_0_full_range();
	test_kquant_layouts();
	test_block_rows();
	for (int dt = 0; dt < KVT_DTYPE_COUNT; dt++)
		printf("matmul %s: worst NMSE fast vs reference %.3g; int8 activations %.3g, on x int8 holds %.3g\n",
		       kvt_dtype_name(dt), worst_nmse[dt], worst_nmse8[dt], worst_exact8[dt]);
	test_rows(1, 64);
	test_rows(13, 576);
	test_rope(1, 9, 64, 64, 100000.0f, 0);
	test_rope(5, 4, 128, 128, 10000.0f, 4093);
	test_rope(3, 2, 64, 32, 10000.0f, 7); /* partial rotary dims */
	test_rope_neox(4, 4, 256, 256, 1000000.0f, 1000); /* Gemma 3's heads */
	test_rope_neox(3, 2, 64, 32, 10000.0f, 7);        /* partial rotary dims */
	test_embed(50, 64, KVT_DTYPE_F32);
	test_embed(50, 72, KVT_DTYPE_F16);
	for (int dt = KVT_DTYPE_Q8_0; dt <= KVT_DTYPE_Q5_0; dt++)
		test_embed(40, 96, dt);
	for (int dt = KVT_DTYPE_Q4_K; dt < KVT_DTYPE_COUNT; dt++)
		test_embed(40, 512, dt);
	/* n_kv, group, head_dim, block_tokens, previous tokens, new rows */
	test_attention(1, 1, 64, 16, 0, 1);     /* one token */
	test_attention(3, 3, 64, 16, 0, 21);    /* prefill, partial block, SmolLM2's GQA */
	test_attention(2, 4, 128, 16, 37, 1);   /* decode after a partial block */
	test_attention(4, 1, 128, 8, 40, 9);    /* MHA, prefill on a cached prefix */
	test_attention(2, 2, 64, 16, 4096, 1);  /* long context: decode keys split in two */
	test_attention(1, 4, 64, 16, 1000, 1);  /* one KV head: decode keys split in four */
	test_attention(3, 3, 64, 16, 200, 100); /* long prefill on a prefix: many row blocks */
	test_attention(2, 4, 128, 16, 5, 13);   /* a partial row block, GQA 4 */
	test_attention(1, 2, 64, 16, 0, 300);   /* a long prompt from nothing */
	test_attention(1, 4, 256, 16, 0, 5);    /* Gemma 3's head_dim 256, one KV head */
	attn_window = 37; /* sliding windows, checked against the dense reference's window too */
	test_attention(1, 4, 256, 16, 500, 1);  /* decode far past the window */
	test_attention(2, 2, 64, 16, 100, 60);  /* prefill rows straddling the window edge */
	test_attention(1, 2, 64, 16, 0, 300);   /* a long prompt from nothing */
	test_attention(2, 4, 128, 16, 4096, 1); /* long context: the split covers only the window */
	attn_window = 512;
	test_attention(3, 3, 64, 16, 200, 100); /* a window wider than the context */
	attn_window = 0;
	/* codec, n_kv, head_dim, block_tokens, pos0, rows */
	for (int codec = 0; codec < KVT_KV_POOL_CODEC_COUNT; codec++) {
		test_kv_load(codec, 1, 64, 16, 0, 1);    /* one token */
		test_kv_load(codec, 3, 64, 16, 5, 21);   /* pos0 mid-block, partial blocks at both ends */
		test_kv_load(codec, 2, 128, 8, 37, 9);   /* small blocks, a block boundary crossed */
		test_kv_load(codec, 2, 40, 16, 3, 30);   /* INT8: one group (40 is not a multiple of 32) */
		test_kv_load(codec, 1, 96, 15, 17, 40);  /* INT8: three groups; blocks of 15 tokens */
		test_kv_load(codec, 4, 256, 16, 250, 7); /* Gemma 3's head_dim */
	}
	test_argmax();

	kvt_dev_destroy(ref);
	kvt_dev_destroy(dut);
	kvt_dev_destroy(dut8);
	return check_done("test_dev_parity");
}
