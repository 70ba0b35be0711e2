/* ctest-labels: unit invariant */
/*
 * tests/test_cpu_invariant.c — the CPU matmul's order rule (gpu/dev_impl.h):
 * a row's result is a pure function of that row and the weights, bit for
 * bit, whatever else shares the call. For every stored type (f32, f16 and
 * the seven block-quantized ones), both activation modes (int16, int8) and
 * 1 and 2 threads: each of 67 rows of x multiplied alone (the GEMV) is the
 * reference, and then every call of 1 to 65 rows, starting at rows 0, 1 and
 * 2, must give each of its rows exactly that (with AVX-512 VNNI, 12 rows
 * and up take the int8 GEMM). x holds outliers, so int8 rounding is
 * coarse and a reordered sum would show. Row lengths end in a partial group
 * of 8 blocks (and for the K-quants run past 8 superblocks), so every
 * accumulation lane and tail case is crossed.
 *
 * Built from gpu/cpu_fast.c itself, so a second build of this file with
 * narrower -march flags (test_cpu_invariant_avx2, CMakeLists.txt) runs the
 * AVX2 kernels on an AVX-512 machine through the same device code.
 */
#include "../gpu/cpu_fast.c"

#include "check.h"
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_X 67    /* rows of x */
#define MAX_M 65  /* the largest call */
#define N_OUT 40  /* weight rows: two 16-column slices and a partial one */

static check_rng rng = { 0x1234567 };

/* Weights of dtype dt from floats, as the loader would store them. */
static void *make_weights(int dt, const float *wf, size_t n)
{
	static const uint32_t ggml[] = { KVT_GGML_F32, KVT_GGML_F16, KVT_GGML_Q8_0, KVT_GGML_Q4_0, KVT_GGML_Q4_1,
					 KVT_GGML_Q5_0, KVT_GGML_Q4_K, KVT_GGML_Q5_K, KVT_GGML_Q6_K };
	void *w = malloc(kvt_dtype_row_bytes(dt, n));
	KVT_ASSERT(kvt_ggml_quantize(ggml[dt], wf, w, n) == KVT_OK);
	return w;
}

/* y = x[m0 .. m0 + M) . w on d. */
static void run_matmul(kvt_dev *d, int dt, const void *w, uint32_t K, const float *x, uint32_t m0, uint32_t M, float *y)
{
	kvt_matmul_args a = { .n_rows = M, .n_in = K, .n_out = N_OUT, .w_dtype = dt, .w = w,
			      .x = x + (size_t)m0 * K, .y = y };
	size_t wsb = kvt_dev_matmul_workspace_bytes(d, &a);
	void *ws = wsb ? aligned_alloc(64, (wsb + 63) & ~(size_t)63) : NULL;
	CHECK(kvt_dev_matmul(d, &a, ws) == KVT_OK);
	free(ws);
}

/* Every call of 1..MAX_M rows from rows 0, 1, 2 against the rows alone (ref: [N_X][N_OUT]). */
static void check_calls(kvt_dev *d, int dt, const void *w, uint32_t K, const float *x, const float *ref,
			const char *what)
{
	float *y = malloc((size_t)MAX_M * N_OUT * sizeof(float));
	int bad = 0;
	for (uint32_t M = 1; M <= MAX_M; M++)
		for (uint32_t m0 = 0; m0 < 3; m0++) {
			run_matmul(d, dt, w, K, x, m0, M, y);
			for (uint32_t m = 0; m < M && bad < 3; m++)
				if (memcmp(y + (size_t)m * N_OUT, ref + (size_t)(m0 + m) * N_OUT, N_OUT * sizeof(float))) {
					CHECKF(0, "%s %s K %u: row %u of a %u-row call from row %u differs from its GEMV",
					       what, kvt_dtype_name(dt), K, m0 + m, M, m0);
					bad++;
				}
		}
	free(y);
}

static void test_dtype(kvt_dev *devs[2][2], int dt)
{
	/* 18 blocks (8 + 8 + 2), Q5_0 Gemma 3's 640 (20), K-quants 9 superblocks (8 + 1) */
	const uint32_t K = dt >= KVT_DTYPE_Q4_K ? 2304 : dt == KVT_DTYPE_Q5_0 ? 640 : 576;
	float *wf = malloc((size_t)N_OUT * K * sizeof(float)), *x = malloc((size_t)N_X * K * sizeof(float));
	for (size_t i = 0; i < (size_t)N_OUT * K; i++)
		wf[i] = check_rng_f32(&rng) * 0.5f;
	for (size_t i = 0; i < (size_t)N_X * K; i++)
		x[i] = check_rng_f32(&rng) * (i % 97 == 5 ? 40.0f : 1.0f); /* outliers, as a prompt's activations */
	void *w = make_weights(dt, wf, (size_t)N_OUT * K);
	float *ref = malloc((size_t)N_X * N_OUT * sizeof(float)), *ref2 = malloc((size_t)N_X * N_OUT * sizeof(float));
	for (int mode = 0; mode < 2; mode++) {
		for (uint32_t m = 0; m < N_X; m++) {
			run_matmul(devs[mode][0], dt, w, K, x, m, 1, ref + (size_t)m * N_OUT);
			run_matmul(devs[mode][1], dt, w, K, x, m, 1, ref2 + (size_t)m * N_OUT);
		}
		CHECKF(!memcmp(ref, ref2, (size_t)N_X * N_OUT * sizeof(float)), "%s %s: 1 and 2 threads differ",
		       mode ? "int8" : "int16", kvt_dtype_name(dt));
		for (int t = 0; t < 2; t++)
			check_calls(devs[mode][t], dt, w, K, x, ref, mode ? (t ? "int8 2 threads" : "int8 1 thread")
									  : (t ? "int16 2 threads" : "int16 1 thread"));
	}
	free(wf), free(x), free(w), free(ref), free(ref2);
}

/*
 * The gated FFN's activations (SiLU, GELU-tanh) are per element: a call over
 * n elements on 1 or 2 threads (tasks split at different places), and a call
 * over a stretch starting at an odd offset (its vectors of 8 and its padded
 * tail fall elsewhere), give each element the same bits.
 */
static void test_activations(kvt_dev *devs[2][2])
{
	const size_t n = 50021, off = 3, len = 4101;
	float *g = malloc(n * 4), *u = malloc(n * 4), *y[2] = { malloc(n * 4), malloc(n * 4) }, *ys = malloc(len * 4);
	for (size_t i = 0; i < n; i++) {
		g[i] = 20.0f * check_rng_f32(&rng); /* -20 .. 20 */
		u[i] = 4.0f * check_rng_f32(&rng);
	}
	for (int act = 0; act < 2; act++) {
		const int kind = act ? KVT_ACT_GELU_TANH : KVT_ACT_SILU;
		for (int t = 0; t < 2; t++) {
			kvt_swiglu_args a = { .n = n, .gate = g, .up = u, .y = y[t], .act = kind };
			CHECK(kvt_dev_swiglu(devs[1][t], &a) == KVT_OK);
		}
		CHECKF(!memcmp(y[0], y[1], n * 4), "activation %d: 1 and 2 threads differ", act);
		kvt_swiglu_args s = { .n = len, .gate = g + off, .up = u + off, .y = ys, .act = kind };
		CHECK(kvt_dev_swiglu(devs[1][1], &s) == KVT_OK);
		CHECKF(!memcmp(ys, y[0] + off, len * 4), "activation %d: a stretch at offset %zu differs", act, off);
	}
	free(g), free(u), free(y[0]), free(y[1]), free(ys);
}

int main(void)
{
	kvt_dev *devs[2][2]; /* [act_int8][threads - 1] */
#ifdef __AVX2__
	/* the AVX2 build on a CPU without it (test_cpu_invariant_avx2 where CI lacks AVX2): skip */
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
		return 77;
#endif
	for (int mode = 0; mode < 2; mode++)
		for (int t = 0; t < 2; t++) {
			kvt_dev_config c = { .kind = KVT_DEV_CPU, .n_threads = t + 1, .fixed_threads = true, .act_int8 = mode };
			if (kvt_dev_create(&c, &devs[mode][t]))
				return 1;
		}
	printf("kernels: %s%s%s\n",
#ifdef KVT_HAVE_F16C
	       "AVX2 F16C FMA",
#else
	       "portable",
#endif
#ifdef KVT_HAVE_VNNI
	       " VNNI",
#else
	       "",
#endif
#ifdef KVT_HAVE_GEMM8
	       " + AVX-512 int8 GEMM"
#else
	       ""
#endif
	);
	for (int dt = 0; dt < KVT_DTYPE_COUNT; dt++)
		test_dtype(devs, dt);
	test_activations(devs);
	for (int mode = 0; mode < 2; mode++)
		for (int t = 0; t < 2; t++)
			kvt_dev_destroy(devs[mode][t]);
	return check_done("test_cpu_invariant");
}
