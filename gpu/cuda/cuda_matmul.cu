/*
 * gpu/cuda/cuda_matmul.cu — matmul on the CUDA backend: one batch-invariant
 * kernel for every row count, every stored type (fp32, fp16, and
 * Q8_0/Q4_0/Q4_1/Q5_0/Q4_K/Q5_K/Q6_K kept as stored) and the fused ops.
 *
 * Order rule (dev_impl.h): y[m][n]'s float operations depend on the stored
 * type and K only, never on M, on which rows share the call or on
 * alignment, so a row of a prompt's GEMM equals its decode GEMV bit for bit:
 *   - lane l of the warp that owns column n takes the 8 consecutive
 *     elements 8l .. 8l+7 of every 256 (the weights widened to fp32 by w8:
 *     dq8's arithmetic for the quantized types, so a weight widens to the
 *     same float as on the CPU), and accumulates x[m][k] * w[n][k] into its
 *     own partial with one explicit fmaf per element, k increasing (explicit
 *     so that no compiler contraction choice can differ between calls);
 *   - the 32 partials are combined in warp_sum's butterfly order (xor 16,
 *     8, 4, 2, 1), by one lane from shared memory (lane_tree).
 *   A call of M rows runs the rows in passes of up to MT (template, <= 8)
 *   rows kept in registers; each pass repeats exactly the per-row steps of
 *   a pass of one row. Vector loads (16 bytes) are taken where the pointers
 *   allow; they change how bytes arrive, not the order of the sums. No
 *   cuBLAS: its kernel (and so its order) changed with the shape.
 *   - fused (norm_matmul, matmul_swiglu; fp16 weights, up to
 *     FUSED_MAX_ROWS rows): the same kernel with the RMSNorm of its input
 *     rows (every CTA reduces each row's sum of squares with rms_inv, as
 *     rmsnorm_kernel does) and/or the up weights' column and SwiGLU, in one
 *     kernel, bit for bit what the plain ops it replaces write. Other stored
 *     types and more rows compose the plain ops (dev.c), with the same bits.
 *
 * Grid mapping: CTAs of 256 threads (8 warps); warp w of CTA b computes
 * output column b * 8 + w (gemv_column), all M rows of it.
 */
#include "cuda_int.cuh"

#define MM_WARPS 8 /* warps (output columns) per CTA; 256 threads, as rmsnorm_kernel */

/* How a kernel reads its weights: fp16, fp32, or block-quantized as stored. */
enum { WK_F16 = 0, WK_F32 = 1, WK_Q = 2 };

/* The kernels' grid mapping: warp w of block b computes output column b * warps + w. */
__device__ __forceinline__ uint32_t gemv_column()
{
	return blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}

/* The eight fp16 weights of one 16-byte load, widened to fp32. */
__device__ __forceinline__ void h8_to_f32(const uint4 &raw, float w[8])
{
	const __half2 *h2 = (const __half2 *)&raw;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float2 f = __half22float2(h2[i]);
		w[2 * i] = f.x;
		w[2 * i + 1] = f.y;
	}
}

/* Floats k .. k+7 of a row of K (0 past K); vec: one pair of 16-byte loads (aligned, K % 8 == 0). */
__device__ __forceinline__ void f8(const float *p, uint32_t k, uint32_t K, bool vec, float v[8])
{
	if (vec) {
		const float4 a = ((const float4 *)(p + k))[0], b = ((const float4 *)(p + k))[1];
		v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
		return;
	}
#pragma unroll
	for (int i = 0; i < 8; i++)
		v[i] = k + i < K ? p[k + i] : 0.0f;
}

/* Weights k .. k+7 of a row widened to fp32 (0 past K); row: the row's first byte. */
template <int WK>
__device__ __forceinline__ void w8(int dtype, const uint8_t *__restrict__ row, uint32_t k, uint32_t K, bool vec,
				   float w[8])
{
	if constexpr (WK == WK_Q) {
		dq8(dtype, row, k, w);
	} else if constexpr (WK == WK_F32) {
		if (vec) {
			const float4 a = __ldg((const float4 *)row + k / 4), b = __ldg((const float4 *)row + k / 4 + 1);
			w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
		} else {
			f8((const float *)row, k, K, false, w);
		}
	} else {
		const __half *h = (const __half *)row;
		if (vec) {
			h8_to_f32(__ldg((const uint4 *)(h + k)), w);
		} else {
#pragma unroll
			for (int i = 0; i < 8; i++)
				w[i] = k + i < K ? __half2float(h[k + i]) : 0.0f;
		}
	}
}

/* One kernel's arguments (by value). */
struct mm_args {
	const uint8_t *w;  /* [N] rows of row_bytes, device */
	const uint8_t *w2; /* SWIGLU: the up weights, the same shape; else NULL */
	size_t row_bytes;  /* bytes per weight row */
	const float *x;    /* [M][K] */
	float *y;          /* [M][N] */
	const float *nw;   /* NULL, or [K]: RMSNorm x's rows first (weight) */
	float eps;         /* its epsilon */
	uint32_t M, K, N;  /* rows, inputs, outputs */
	int dtype;         /* stored type (WK_Q) */
	bool acc;          /* y += (not with SWIGLU) */
	bool wvec, xvec;   /* 16-byte loads of weights (and w2), of x (and nw) */
};

/* x's row m (K floats) normalised as rmsnorm_kernel writes it, or as is: elements k .. k+7. */
__device__ __forceinline__ void x8(const mm_args &a, uint32_t m, uint32_t k, float r, float v[8])
{
	f8(a.x + (size_t)m * a.K, k, a.K, a.xvec, v);
	if (a.nw) {
		float nv[8];
		f8(a.nw, k, a.K, a.xvec, nv);
#pragma unroll
		for (int i = 0; i < 8; i++)
			v[i] = v[i] * r * nv[i];
	}
}

/*
 * The sum of a warp's 32 partials p[0..31] as warp_sum's butterfly (xor 16,
 * 8, 4, 2, 1) leaves it in lane 0, operation for operation: at step o,
 * partial l < o becomes p[l] + p[l + o] (l ^ o = l + o there). One lane
 * computes it from shared memory, so a pass of MT rows costs the warp one
 * barrier instead of 5 MT shuffles (the CPU emulator's cost is its fiber
 * switches), with the shuffles' bits.
 */
__device__ __forceinline__ float lane_tree(const float *p)
{
	float t[32];
#pragma unroll
	for (int i = 0; i < 32; i++)
		t[i] = p[i];
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
#pragma unroll
		for (int l = 0; l < o; l++)
			t[l] = t[l] + t[l + o];
	return t[0];
}

/*
 * y[m][n] (+)= x[m] . w[n] for all M rows, MT rows a pass (the order rule
 * above); with SWIGLU y[m][n] = silu(x[m] . w[n]) * (x[m] . w2[n]). Each
 * pass ends with the lanes' partials in shared memory and lane m of the
 * column's warp summing row m's (lane_tree). Every thread of the CTA takes
 * part in the barriers and the RMSNorm reductions, so warps past N idle
 * through the passes.
 */
template <int MT, int WK, bool SWIGLU>
__global__ void __launch_bounds__(256) mm_kernel(mm_args a)
{
	__shared__ float sh[32];
	__shared__ float part[MM_WARPS][SWIGLU ? 2 : 1][MT][33]; /* [warp][gate/up][row][lane], padded */
	const uint32_t n = gemv_column(), K = a.K;
	const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
	const bool live = n < a.N;
	const uint8_t *row = a.w + (size_t)(live ? n : 0) * a.row_bytes;
	const uint8_t *row2 = SWIGLU ? a.w2 + (size_t)(live ? n : 0) * a.row_bytes : NULL;
	for (uint32_t m0 = 0; m0 < a.M; m0 += MT) {
		const uint32_t rows = a.M - m0 < MT ? a.M - m0 : MT;
		float r[MT], s[MT], s2[MT];
#pragma unroll
		for (int m = 0; m < MT; m++) {
			r[m] = a.nw && m < (int)rows ? rms_inv(a.x + (size_t)(m0 + m) * K, K, a.eps, sh) : 1.0f;
			s[m] = s2[m] = 0.0f;
		}
		for (uint32_t k = lane * 8; live && k < K; k += 256) {
			float wf[8], wf2[8];
			w8<WK>(a.dtype, row, k, K, a.wvec, wf);
			if (SWIGLU)
				w8<WK>(a.dtype, row2, k, K, a.wvec, wf2);
#pragma unroll
			for (int m = 0; m < MT; m++) {
				if (m >= (int)rows)
					break;
				float xv[8];
				x8(a, m0 + m, k, r[m], xv);
#pragma unroll
				for (int i = 0; i < 8; i++) {
					s[m] = fmaf(wf[i], xv[i], s[m]);
					if (SWIGLU)
						s2[m] = fmaf(wf2[i], xv[i], s2[m]);
				}
			}
		}
#pragma unroll
		for (int m = 0; m < MT; m++) {
			part[wi][0][m][lane] = s[m];
			if (SWIGLU)
				part[wi][SWIGLU][m][lane] = s2[m];
		}
		__syncthreads();
		if (live && lane < (int)rows) {
			const float v = lane_tree(part[wi][0][lane]), u = SWIGLU ? lane_tree(part[wi][SWIGLU][lane]) : 0.0f;
			float *o = a.y + (size_t)(m0 + lane) * a.N + n;
			if (SWIGLU)
				*o = v / (1.0f + expf(-v)) * u; /* swiglu_kernel's silu */
			else
				*o = a.acc ? *o + v : v;
		}
		__syncthreads(); /* part is the next pass's */
	}
}

/* Launch mm_kernel for a.M rows: MT = M up to 8 (decode), else passes of 8. */
template <int WK, bool SWIGLU>
static void launch_mm(cudaStream_t st, const mm_args &a)
{
	const dim3 grid(div_up(a.N, MM_WARPS)), block(MM_WARPS * 32);
	switch (a.M < 8 ? a.M : 8) {
	case 1: mm_kernel<1, WK, SWIGLU><<<grid, block, 0, st>>>(a); break;
	case 2: mm_kernel<2, WK, SWIGLU><<<grid, block, 0, st>>>(a); break;
	case 3: mm_kernel<3, WK, SWIGLU><<<grid, block, 0, st>>>(a); break;
	case 4: mm_kernel<4, WK, SWIGLU><<<grid, block, 0, st>>>(a); break;
	case 5: mm_kernel<5, WK, SWIGLU><<<grid, block, 0, st>>>(a); break;
	case 6: mm_kernel<6, WK, SWIGLU><<<grid, block, 0, st>>>(a); break;
	case 7: mm_kernel<7, WK, SWIGLU><<<grid, block, 0, st>>>(a); break;
	default: mm_kernel<8, WK, SWIGLU><<<grid, block, 0, st>>>(a); break;
	}
}

static bool al16(const void *p) { return ((uintptr_t)p % 16) == 0; }

/* The kernel arguments of a plain matmul (w2, nw: the fused ops' extras, or NULL). */
static mm_args mm_of(const kvt_matmul_args *m, const void *w2, const float *nw, float eps)
{
	mm_args a = {};
	const bool q = is_kept_quant(m->w_dtype);
	a.w = (const uint8_t *)m->w, a.w2 = (const uint8_t *)w2, a.x = m->x, a.y = m->y, a.nw = nw, a.eps = eps;
	a.M = m->n_rows, a.K = m->n_in, a.N = m->n_out, a.dtype = m->w_dtype, a.acc = m->accumulate;
	a.row_bytes = q ? q_row_bytes(m->w_dtype, m->n_in)
			: (size_t)m->n_in * (m->w_dtype == KVT_DTYPE_F32 ? sizeof(float) : sizeof(__half));
	a.wvec = !q && a.K % 8 == 0 && al16(a.w) && (!w2 || al16(w2));
	a.xvec = a.K % 8 == 0 && al16(a.x) && (!nw || al16(nw));
	return a;
}

size_t kvt_cuda_matmul_workspace(const kvt_dev *d, const kvt_matmul_args *a)
{
	return 0; /* the kernel reads weights and x as they are */
}

int kvt_cuda_matmul(kvt_dev *d, const kvt_matmul_args *m, void *ws)
{
	const mm_args a = mm_of(m, NULL, NULL, 0.0f);
	const cudaStream_t st = C(d)->stream;
	if (is_kept_quant(m->w_dtype))
		launch_mm<WK_Q, false>(st, a);
	else if (m->w_dtype == KVT_DTYPE_F32)
		launch_mm<WK_F32, false>(st, a);
	else
		launch_mm<WK_F16, false>(st, a);
	return LAUNCHED("matmul");
}

/* ---- fused ops (dev.h: each bit-identical to this backend's plain ops it replaces) ---- */

/*
 * Rows up to which the fused ops run fused. Each CTA of the fused kernel
 * reduces every row's RMSNorm itself, which pays at decode's few rows; more
 * rows compose the plain ops (dev.c: rmsnorm_kernel once per row, then this
 * file's matmul), whose bits are the fused kernel's, so a row's result does
 * not depend on which side of this bound its call falls.
 */
#define FUSED_MAX_ROWS 8

int kvt_cuda_norm_matmul(kvt_dev *d, const kvt_norm_matmul_args *a, void *ws)
{
	if (a->mm.w_dtype != KVT_DTYPE_F16 || a->mm.n_rows > FUSED_MAX_ROWS)
		return KVT_DEV_COMPOSE;
	launch_mm<WK_F16, false>(C(d)->stream, mm_of(&a->mm, NULL, a->norm_w, a->eps));
	return LAUNCHED("matmul (rmsnorm fused)");
}

int kvt_cuda_matmul_swiglu(kvt_dev *d, const kvt_matmul_swiglu_args *a, void *ws)
{
	if (a->w_dtype != KVT_DTYPE_F16 || a->n_rows > FUSED_MAX_ROWS)
		return KVT_DEV_COMPOSE;
	kvt_matmul_args m = {};
	m.n_rows = a->n_rows, m.n_in = a->n_in, m.n_out = a->n_out, m.w_dtype = a->w_dtype;
	m.w = a->w_gate, m.x = a->x, m.y = a->y;
	launch_mm<WK_F16, true>(C(d)->stream, mm_of(&m, a->w_up, a->norm_w, a->eps));
	return LAUNCHED("matmul gate+up (swiglu fused)");
}
