/* ctest-labels: parity gpu invariant */
/*
 * tests/test_gpu_invariant.c — the order rule of gpu/dev_impl.h on the CUDA
 * backend: a row's result is the same bits whatever else shares the call.
 *
 *   - matmul, every stored type (f32, f16 and the seven block-quantized
 *     ones): each of 67 rows of x multiplied alone (the GEMV) is the
 *     reference; every call of 1 to 65 rows (from row 0 for an even count,
 *     row 1 for an odd one) must give each of its rows exactly that,
 *     overwriting y and accumulating into it, and so must a call whose x is
 *     not 16-byte aligned (a few counts). x holds outliers, so a reordered
 *     sum shows. 37 output columns leave the last CTA partial.
 *   - the fused ops (norm_matmul, matmul_swiglu with and without the norm;
 *     fp16 weights run the fused kernel, Q4_K composes the plain ops): the
 *     same sweep.
 *   - attention, fp16 and int8 pools, with and without a sliding window that
 *     is not block-aligned: over a context of 520 positions (blocks of 16,
 *     crossing two 256-position chunk boundaries), every query row computed as a
 *     decode step (one row) is the reference; the same rows computed in
 *     prompt chunks of 256, 32 and 7 rows must equal it bit for bit, and so
 *     must a decode launched as a graph launches it (the position read from
 *     device memory, the grid sized for the longest context).
 *
 * Run on a GPU (bench/device_check.sh) and, as test_gpu_invariant_emu, on
 * the CPU emulator (tests/cuemu). Exits 77 where there is no CUDA backend.
 */
#include "check.h"
#include "dev.h"
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_X 67   /* rows of x */
#define MAX_M 65 /* the largest call */
#define N_OUT 37 /* weight rows: four CTAs of 8 columns and a partial one */

static kvt_dev *gpu;
static check_rng rng = { 0x5eed1234 };

static void *up(const void *h, size_t n)
{
	void *p = NULL;
	if (kvt_dev_alloc(gpu, n, &p) || kvt_dev_copy_h2d(gpu, p, h, n))
		abort();
	return p;
}

static void down(void *h, const void *p, size_t n)
{
	if (kvt_dev_sync(gpu) || kvt_dev_copy_d2h(gpu, h, p, n))
		abort();
}

static void *dws(size_t n)
{
	void *p = NULL;
	if (n && kvt_dev_alloc(gpu, n, &p))
		abort();
	return p;
}

/* Weights of dtype dt from floats, as the loader would store them. */
static void *make_weights(int dt, const float *wf, size_t n)
{
	static const uint32_t ggml[] = { KVT_GGML_F32, KVT_GGML_F16, KVT_GGML_Q8_0, KVT_GGML_Q4_0, KVT_GGML_Q4_1,
					 KVT_GGML_Q5_0, KVT_GGML_Q4_K, KVT_GGML_Q5_K, KVT_GGML_Q6_K };
	void *w = malloc(kvt_dtype_row_bytes(dt, n));
	KVT_ASSERT(kvt_ggml_quantize(ggml[dt], wf, w, n) == KVT_OK);
	return w;
}

/* Which op a matmul case runs. */
enum { OP_MATMUL, OP_NORM, OP_SWIGLU, OP_NORM_SWIGLU, OP_COUNT };
static const char *const op_names[] = { "matmul", "norm_matmul", "matmul_swiglu", "rmsnorm+matmul_swiglu" };

/* One matmul problem on the device: weights (two for SwiGLU), x's rows, y's initial rows. */
typedef struct mm_case {
	int dt, op;
	uint32_t K;
	void *w, *w2;  /* device */
	float *nw;     /* device, [K] */
	float *x;      /* device, [N_X + 1][K]: row 0 from x + 1 float as well (unaligned) */
	float *y0;     /* host, [N_X][N_OUT]: what y holds before an accumulating call */
} mm_case;

/* y (device, [M][N_OUT], set to y0's rows m0.. first) = op(x rows m0 .. m0 + M), x from xbase. */
static void run_op(const mm_case *c, const float *xbase, uint32_t m0, uint32_t M, bool acc, float *y)
{
	CHECK(kvt_dev_copy_h2d(gpu, y, c->y0 + (size_t)m0 * N_OUT, (size_t)M * N_OUT * 4) == KVT_OK);
	const float *x = xbase + (size_t)m0 * c->K;
	kvt_matmul_args mm = { .n_rows = M, .n_in = c->K, .n_out = N_OUT, .w_dtype = c->dt, .w = c->w, .x = x,
			       .y = y, .accumulate = acc };
	void *ws = NULL;
	if (c->op == OP_MATMUL) {
		ws = dws(kvt_dev_matmul_workspace_bytes(gpu, &mm));
		CHECK(kvt_dev_matmul(gpu, &mm, ws) == KVT_OK);
	} else if (c->op == OP_NORM) {
		kvt_norm_matmul_args a = { .mm = mm, .norm_w = c->nw, .eps = 1e-5f };
		ws = dws(kvt_dev_norm_matmul_workspace_bytes(gpu, &a));
		CHECK(kvt_dev_norm_matmul(gpu, &a, ws) == KVT_OK);
	} else {
		kvt_matmul_swiglu_args a = { .n_rows = M, .n_in = c->K, .n_out = N_OUT, .w_dtype = c->dt,
					     .w_gate = c->w, .w_up = c->w2, .x = x, .y = y,
					     .norm_w = c->op == OP_NORM_SWIGLU ? c->nw : NULL, .eps = 1e-5f };
		ws = dws(kvt_dev_matmul_swiglu_workspace_bytes(gpu, &a));
		CHECK(kvt_dev_matmul_swiglu(gpu, &a, ws) == KVT_OK);
	}
	kvt_dev_free(gpu, ws);
}

/* Every call of 1..MAX_M rows from rows 0 and 1 (and from an unaligned x) against the rows alone. */
static void sweep(const mm_case *c, bool acc)
{
	const bool swiglu = c->op >= OP_SWIGLU;
	if (swiglu && acc)
		return; /* matmul_swiglu overwrites */
	const size_t row = (size_t)N_OUT * 4;
	float *ref = malloc(N_X * row), *got = malloc(MAX_M * row), *y = dws(MAX_M * row);
	for (uint32_t m = 0; m < N_X; m++) {
		run_op(c, c->x, m, 1, acc, y);
		down(ref + (size_t)m * N_OUT, y, row);
	}
	int bad = 0;
	for (uint32_t M = 1; M <= MAX_M; M++)
		for (int from = 0; from < 3; from++) {
			/* from 0, 1: x rows 0.. (even M) and 1.. (odd M); 2: rows 0.. of the copy one float
			 * off 16-byte alignment, for a few row counts */
			const uint32_t m0 = from == 1;
			if ((from < 2 && (int)(M % 2) != from) || (from == 2 && M % 8 != 1 && M != MAX_M))
				continue;
			run_op(c, from == 2 ? c->x + (size_t)(N_X + 1) * c->K + 1 : c->x, m0, M, acc, y);
			down(got, y, (size_t)M * row);
			for (uint32_t m = 0; m < M && bad < 3; m++)
				if (memcmp(got + (size_t)m * N_OUT, ref + (size_t)(m0 + m) * N_OUT, row)) {
					CHECKF(0, "%s %s K %u%s: row %u of a %u-row call%s differs from the row alone",
					       op_names[c->op], kvt_dtype_name(c->dt), c->K, acc ? " accumulating" : "", m0 + m,
					       M, from == 2 ? " (x unaligned)" : "");
					bad++;
				}
		}
	check_n_pass += !bad;
	free(ref), free(got);
	kvt_dev_free(gpu, y);
}

static void test_matmul_dtype(int dt, int op)
{
	/* 18 blocks of 32 (a partial round of 256 per lane group), Q5_0 Gemma 3's 640, K-quants 9 superblocks */
	const uint32_t K = dt >= KVT_DTYPE_Q4_K ? 2304 : dt == KVT_DTYPE_Q5_0 ? 640 : 576;
	const size_t nw = (size_t)N_OUT * K, nx = (size_t)N_X * K;
	float *wf = malloc(nw * 4), *wf2 = malloc(nw * 4), *x = malloc((2 * nx + 2 * K + 1) * 4);
	float *y0 = malloc((size_t)N_X * N_OUT * 4), *nwh = malloc(K * 4);
	for (size_t i = 0; i < nw; i++) {
		wf[i] = check_rng_f32(&rng) * 0.5f;
		wf2[i] = check_rng_f32(&rng) * 0.5f;
	}
	for (size_t i = 0; i < nx; i++)
		x[i] = check_rng_f32(&rng) * (i % 97 == 5 ? 40.0f : 1.0f); /* outliers, as a prompt's activations */
	/* after N_X rows and one spare row: the same rows again, one float further on */
	memcpy(x + nx + K + 1, x, nx * 4);
	for (size_t i = 0; i < (size_t)N_X * N_OUT; i++)
		y0[i] = check_rng_f32(&rng);
	for (uint32_t i = 0; i < K; i++)
		nwh[i] = 1.0f + 0.5f * check_rng_f32(&rng);
	void *wq = make_weights(dt, wf, nw), *wq2 = make_weights(dt, wf2, nw);
	mm_case c = { .dt = dt, .op = op, .K = K, .y0 = y0 };
	c.w = up(wq, kvt_dtype_row_bytes(dt, nw));
	c.w2 = up(wq2, kvt_dtype_row_bytes(dt, nw));
	c.nw = up(nwh, K * 4);
	c.x = up(x, (2 * nx + 2 * K + 1) * 4);
	sweep(&c, false);
	sweep(&c, true);
	printf("%s %s K %u: rows of 1..%d-row calls equal the rows alone: %s\n", op_names[op], kvt_dtype_name(dt), K,
	       MAX_M, check_n_fail ? "NO (failures so far)" : "yes");
	kvt_dev_free(gpu, c.w), kvt_dev_free(gpu, c.w2), kvt_dev_free(gpu, c.nw), kvt_dev_free(gpu, c.x);
	free(wf), free(wf2), free(x), free(y0), free(nwh), free(wq), free(wq2);
}

/* ---- attention ---- */

#define CTX 520 /* positions: blocks of 16, three chunks of 256 (the last partial) */

/* A pool of CTX positions with random contents (8-bit: random codes, sane scales), a shuffled table. */
static void *make_pool(kvt_kv_layout *l, int32_t **d_table)
{
	const uint32_t n_blocks = (CTX + l->block_tokens - 1) / l->block_tokens;
	l->n_slots = n_blocks + 3;
	const size_t bytes = kvt_kv_block_bytes(l) * l->n_slots;
	uint16_t *h = malloc(bytes);
	for (size_t i = 0; i < bytes / 2; i++)
		h[i] = kvt_f32_to_f16(check_rng_f32(&rng) * 2.0f);
	if (l->codec != KVT_KV_CODEC_F16) {
		const size_t n_vec = (size_t)l->n_layers * 2 * l->n_kv_heads * l->block_tokens;
		const size_t n_sc = n_vec * (l->head_dim / kvt_kv_group_dims(l->codec, l->head_dim));
		for (size_t i = 0; i < bytes; i++) /* no NaN codes */
			if ((((uint8_t *)h)[i] & 0x7f) == 0x7f)
				((uint8_t *)h)[i] = 0x11;
		for (uint32_t sl = 0; sl < l->n_slots; sl++)
			for (size_t v = 0; v < n_sc; v++) {
				const float sc = 0.01f + 0.001f * (float)(v % 7);
				memcpy((uint8_t *)h + sl * kvt_kv_block_bytes(l) + n_vec * l->head_dim + v * 4, &sc, 4);
			}
	}
	void *pool = up(h, bytes);
	free(h);
	int32_t *table = malloc(n_blocks * 4);
	for (uint32_t i = 0; i < n_blocks; i++)
		table[i] = (int32_t)(n_blocks - 1 - i) ^ 1; /* not in order, not contiguous */
	for (uint32_t i = 0; i < n_blocks; i++)
		if ((uint32_t)table[i] >= n_blocks)
			table[i] = (int32_t)n_blocks + 1;
	*d_table = up(table, n_blocks * 4);
	free(table);
	return pool;
}

/* out rows [r0, r0 + n) of the attention over the pool at positions r0 .. (d_pos: as a graph launches it). */
static void attend(const kvt_kv_layout *l, const int32_t *table, uint32_t n_heads, uint32_t win, const float *q,
		   float *out, uint32_t r0, uint32_t n, const int32_t *d_pos)
{
	const size_t qrow = (size_t)n_heads * l->head_dim;
	kvt_attention_args a = { .kv = l, .layer = 1, .block_table = table, .pos0 = d_pos ? CTX - 1 : r0,
				 .n_rows = n, .n_heads = n_heads, .scale = 1.0f / sqrtf((float)l->head_dim),
				 .q = q + r0 * qrow, .out = out + r0 * qrow, .window = win, .d_pos0 = d_pos };
	void *ws = dws(kvt_dev_attention_workspace_bytes(gpu, &a));
	CHECK(kvt_dev_attention(gpu, &a, ws) == KVT_OK);
	kvt_dev_free(gpu, ws);
}

static void test_attention_case(uint32_t hd, uint32_t H, uint32_t G, int codec, uint32_t win)
{
	kvt_kv_layout l = { .n_layers = 2, .n_kv_heads = H, .head_dim = hd, .block_tokens = 16, .codec = codec };
	int32_t *table;
	l.pool = make_pool(&l, &table);
	const size_t qn = (size_t)CTX * H * G * hd;
	float *qh = malloc(qn * 4), *ref = malloc(qn * 4), *got = malloc(qn * 4);
	for (size_t i = 0; i < qn; i++)
		qh[i] = check_rng_f32(&rng);
	float *q = up(qh, qn * 4), *out = dws(qn * 4);
	for (uint32_t p = 0; p < CTX; p++) /* the reference: every row as a decode step */
		attend(&l, table, H * G, win, q, out, p, 1, NULL);
	down(ref, out, qn * 4);
	static const uint32_t chunks[] = { 256, 32, 7 };
	for (int ci = 0; ci < 4; ci++) {
		memset(got, 0xff, qn * 4); /* NaN: a row left unwritten fails */
		CHECK(kvt_dev_copy_h2d(gpu, out, got, qn * 4) == KVT_OK);
		if (ci < 3) {
			for (uint32_t r0 = 0; r0 < CTX; r0 += chunks[ci])
				attend(&l, table, H * G, win, q, out, r0, CTX - r0 < chunks[ci] ? CTX - r0 : chunks[ci], NULL);
		} else { /* decode as a graph launches it, at a few positions across the chunks */
			static const uint32_t at[] = { 0, 15, 16, 255, 256, 300, 511, 512, CTX - 1 };
			_Static_assert(CTX > 513, "the positions above lie in the context");
			memcpy(got, ref, qn * 4);
			CHECK(kvt_dev_copy_h2d(gpu, out, got, qn * 4) == KVT_OK);
			for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
				int32_t pos = (int32_t)at[i], *d_pos = up(&pos, 4);
				CHECK(kvt_dev_copy_h2d(gpu, out + (size_t)at[i] * H * G * hd, got, (size_t)H * G * hd * 4) ==
				      KVT_OK); /* row p: poisoned with another row's output */
				attend(&l, table, H * G, win, q, out, at[i], 1, d_pos);
				CHECK(kvt_dev_sync(gpu) == KVT_OK);
				kvt_dev_free(gpu, d_pos);
			}
		}
		down(got, out, qn * 4);
		uint32_t first_bad = CTX;
		for (uint32_t p = 0; p < CTX && first_bad == CTX; p++)
			if (memcmp(got + (size_t)p * H * G * hd, ref + (size_t)p * H * G * hd, (size_t)H * G * hd * 4))
				first_bad = p;
		CHECKF(first_bad == CTX, "attention %s hd%u kvh%u G%u window %u, %s: row %u differs from its decode step",
		       kvt_kv_codec_name(codec), hd, H, G, win, ci < 3 ? "prompt chunks" : "graph decode", first_bad);
		char how[32] = "graph decode";
		if (ci < 3)
			snprintf(how, sizeof how, "prompt chunks of %u", chunks[ci]);
		printf("attention %s hd%u kvh%u G%u window %u, %s: %s\n", kvt_kv_codec_name(codec), hd, H, G, win, how,
		       first_bad == CTX ? "every row equals its decode step" : "DIFFERS");
	}
	kvt_dev_free(gpu, q), kvt_dev_free(gpu, out), kvt_dev_free(gpu, table), kvt_dev_free(gpu, l.pool);
	free(qh), free(ref), free(got);
}

int main(void)
{
	kvt_dev_config gc = { .kind = KVT_DEV_CUDA };
	setvbuf(stdout, NULL, _IONBF, 0);
	check_log_capture(); /* quiet: "no usable GPU" is expected where there is none */
	unsetenv("KVT_CUDA_DECODE"); /* the default path: the one that must keep the rule */
	int rc = kvt_dev_create(&gc, &gpu);
	kvt_log_set_sink(NULL, NULL);
	if (rc)
		return check_skip("test_gpu_invariant", "no CUDA device (or a build without the CUDA backend)");
	printf("gpu: %s\n", kvt_dev_name(gpu));
	for (int dt = 0; dt < KVT_DTYPE_COUNT; dt++)
		test_matmul_dtype(dt, OP_MATMUL);
	static const int fused_dt[] = { KVT_DTYPE_F16, KVT_DTYPE_Q4_K };
	for (int op = OP_NORM; op < OP_COUNT; op++)
		for (size_t i = 0; i < sizeof fused_dt / sizeof fused_dt[0]; i++)
			test_matmul_dtype(fused_dt[i], op);
	/* {head_dim, kv heads, group}: GQA groups of 1, 4 (vectors of several rows a CTA) and 8;
	 * fp16 pools with and without a window, int8 pools one each */
	static const uint32_t shapes[][3] = { { 64, 2, 4 }, { 128, 1, 8 }, { 64, 3, 1 } };
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		for (int w = 0; w < 2; w++)
			test_attention_case(shapes[s][0], shapes[s][1], shapes[s][2], KVT_KV_CODEC_F16, w ? 300 : 0);
	test_attention_case(64, 2, 4, KVT_KV_CODEC_INT8, 0);
	test_attention_case(128, 1, 8, KVT_KV_CODEC_INT8, 300);
	kvt_dev_destroy(gpu);
	return check_done("test_gpu_invariant");
}
