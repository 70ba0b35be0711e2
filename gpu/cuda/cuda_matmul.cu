/*
 * gpu/cuda/cuda_matmul.cu — matmul on the CUDA backend: cuBLAS GEMMs, the
 * GEMVs of decode (fp16 and kept quantized weights) and the fused GEMVs.
 *
 *   - fp16 weights: cuBLAS GemmEx (fp16 inputs, fp32 accumulation) when more
 *     than GEMV_MAX_ROWS rows multiply a weight; fewer rows (decode) use a
 *     GEMV that reads fp16 weights once with 16-byte loads and keeps the
 *     activations in fp32. fp32 weights go through cublasSgemm.
 *   - Q8_0/Q4_0/Q4_1/Q5_0/Q4_K/Q5_K/Q6_K weights kept as stored: <=
 *     GEMV_MAX_ROWS rows, a GEMV with one warp per output column whose lanes
 *     widen 8 weights at a time with the CPU reference's arithmetic (dq8 in
 *     cuda_int.cuh; x stays fp32); more rows widen a tile of weight rows to
 *     fp16 in the workspace and run cuBLAS GemmEx on it.
 *   - fused (norm_matmul, matmul_swiglu): the fp16 GEMV with the RMSNorm of
 *     its input, or the gate and up GEMVs and SwiGLU, in one kernel, bit for
 *     bit what the plain ops it replaces write; more rows: RMSNorm to fp16,
 *     then GemmEx.
 *
 * Grid mapping of every GEMV: warp w of CTA b computes output column
 * b * warps + w (gemv_column), all M rows of it, M a template argument so
 * the sums stay in registers.
 */
#include "cuda_int.cuh"

/* ---- matmul ---- */

__global__ void f32_to_f16_kernel(const float *x, __half *y, uint64_t n)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		y[i] = __float2half_rn(x[i]);
}

/* The GEMVs' grid mapping: warp w of block b computes output column b * warps + w. */
__device__ __forceinline__ uint32_t gemv_column()
{
	return blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}

/* The GEMVs' epilogue: lane 0 writes (or adds) the warp's sum of each row's s[m] into y[m][n]. */
template <int M>
__device__ __forceinline__ void gemv_store(const float *s, float *__restrict__ y, uint32_t n, uint32_t N, int lane,
					   bool acc)
{
#pragma unroll
	for (int m = 0; m < M; m++) {
		float v = warp_sum(s[m]);
		if (lane == 0) {
			float *o = y + (size_t)m * N + n;
			*o = acc ? *o + v : v;
		}
	}
}

/*
 * y[m][n] (+)= x[m] . w[n] for M <= GEMV_MAX_ROWS rows: one warp per output
 * column n, lanes strided over k by 8 fp16 weights (one 16-byte load).
 */
/* The eight fp16 weights of one 16-byte load, widened to fp32 (the fp16 GEMVs' inner step). */
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

template <int M>
__global__ void gemv_f16_kernel(const __half *__restrict__ w, const float *__restrict__ x, float *__restrict__ y,
				uint32_t K, uint32_t N, bool acc, bool vec)
{
	uint32_t n = gemv_column();
	int lane = threadIdx.x & 31;
	if (n >= N)
		return;
	const __half *row = w + (size_t)n * K;
	float s[M] = {};
	if (vec) {
#pragma unroll 4
		for (uint32_t k = lane * 8; k < K; k += 256) {
			float wf[8];
			h8_to_f32(__ldg((const uint4 *)(row + k)), wf);
#pragma unroll
			for (int m = 0; m < M; m++) {
				const float4 *xv = (const float4 *)(x + (size_t)m * K + k);
				float4 a = xv[0], b = xv[1];
				s[m] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w +
					wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
			}
		}
	} else {
		for (uint32_t k = lane; k < K; k += 32) {
			float wf = __half2float(row[k]);
#pragma unroll
			for (int m = 0; m < M; m++)
				s[m] += wf * x[(size_t)m * K + k];
		}
	}
	gemv_store<M>(s, y, n, N, lane, acc);
}

template <int M>
static void launch_gemv(cudaStream_t st, const kvt_matmul_args *a, bool vec)
{
	const int warps = 8;
	gemv_f16_kernel<M><<<div_up(a->n_out, warps), warps * 32, 0, st>>>(
		(const __half *)a->w, a->x, a->y, a->n_in, a->n_out, a->accumulate, vec);
}

/* ---- block-quantized weights: Q5_0 and the K-quants (layouts in dev.h) ---- */

/* Rows of a weight tile widened per GEMM call: all of N if they fit, else a multiple of 64. */
static uint32_t qtile_rows(const kvt_dev *d, const kvt_matmul_args *a)
{
	uint32_t r = ((const cuda_dev *)d)->qtile_elems / a->n_in;
	r = r < 64 ? 64 : r & ~63u;
	return r < a->n_out ? r : a->n_out;
}

/*
 * The quantized GEMV for M <= GEMV_MAX_ROWS rows: one warp per output column
 * n, each lane widening 8 consecutive weights at a time (lane l takes
 * elements 8l .. 8l+7 of every 256), so the warp reads each 256-element
 * stretch of the row once, contiguously, and x stays fp32.
 */
template <int M>
__global__ void gemv_q_kernel(int dtype, const uint8_t *__restrict__ w, size_t row_bytes, const float *__restrict__ x,
			      float *__restrict__ y, uint32_t K, uint32_t N, bool acc)
{
	uint32_t n = gemv_column();
	int lane = threadIdx.x & 31;
	if (n >= N)
		return;
	const uint8_t *row = w + (size_t)n * row_bytes;
	float s[M] = {};
	for (uint32_t k = lane * 8; k < K; k += 256) {
		float wf[8];
		dq8(dtype, row, k, wf);
#pragma unroll
		for (int m = 0; m < M; m++) {
			const float *xm = x + (size_t)m * K + k;
#pragma unroll
			for (int i = 0; i < 8; i++)
				s[m] += wf[i] * xm[i];
		}
	}
	gemv_store<M>(s, y, n, N, lane, acc);
}

template <int M>
static void launch_gemv_q(cudaStream_t st, const kvt_matmul_args *a)
{
	const int warps = 8;
	gemv_q_kernel<M><<<div_up(a->n_out, warps), warps * 32, 0, st>>>(
		a->w_dtype, (const uint8_t *)a->w, q_row_bytes(a->w_dtype, a->n_in), a->x, a->y, a->n_in,
		a->n_out, a->accumulate);
}

/* One GEMV launch for M rows: the quantized kernel (quant) or the fp16 one (vec: its 16-byte loads). */
template <int M>
static void launch_gemv_m(cudaStream_t st, const kvt_matmul_args *a, bool quant, bool vec)
{
	if (quant)
		launch_gemv_q<M>(st, a);
	else
		launch_gemv<M>(st, a, vec);
}

/* The GEMV for a->n_rows <= GEMV_MAX_ROWS rows, M a template argument so s[] stays in registers. */
static void launch_gemv_rows(cudaStream_t st, const kvt_matmul_args *a, bool quant, bool vec)
{
	switch (a->n_rows) {
	case 1: launch_gemv_m<1>(st, a, quant, vec); break;
	case 2: launch_gemv_m<2>(st, a, quant, vec); break;
	case 3: launch_gemv_m<3>(st, a, quant, vec); break;
	case 4: launch_gemv_m<4>(st, a, quant, vec); break;
	case 5: launch_gemv_m<5>(st, a, quant, vec); break;
	case 6: launch_gemv_m<6>(st, a, quant, vec); break;
	case 7: launch_gemv_m<7>(st, a, quant, vec); break;
	default: launch_gemv_m<8>(st, a, quant, vec); break;
	}
}

/* Rows n0 .. n0+n_rows-1 of a quantized weight widened to fp16, [n_rows][K]; a thread per 8 elements. */
__global__ void dequant_f16_kernel(int dtype, const uint8_t *__restrict__ w, size_t row_bytes, uint32_t K,
				   uint32_t n0, uint32_t n_rows, __half *__restrict__ out)
{
	const uint64_t n8 = (uint64_t)n_rows * (K / 8);
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n8; i += (uint64_t)gridDim.x * blockDim.x) {
		const uint32_t r = (uint32_t)(i / (K / 8)), k = (uint32_t)(i % (K / 8)) * 8;
		float wf[8];
		dq8(dtype, w + (size_t)(n0 + r) * row_bytes, k, wf);
#pragma unroll
		for (int j = 0; j < 8; j++)
			out[(size_t)r * K + k + j] = __float2half_rn(wf[j]);
	}
}

/*
 * More rows: x to fp16, then per tile of weight rows widen them to fp16 in
 * the workspace and run one cuBLAS GemmEx (fp32 accumulation), as the fp16
 * path does with its stored weights.
 */
static int matmul_q_gemm(cuda_dev *c, const kvt_matmul_args *a, void *ws)
{
	kvt_dev *d = &c->base; /* for LAUNCHED's counters */
	const float alpha = 1.0f, beta = a->accumulate ? 1.0f : 0.0f;
	const int M = (int)a->n_rows, K = (int)a->n_in;
	const size_t row_bytes = q_row_bytes(a->w_dtype, a->n_in);
	__half *xh = (__half *)ws, *wh = xh + (((size_t)M * K + 127) & ~(size_t)127);
	uint64_t n = (uint64_t)M * K;
	f32_to_f16_kernel<<<div_up(n, 256) < 4096 ? div_up(n, 256) : 4096, 256, 0, c->stream>>>(a->x, xh, n);
	int rc = LAUNCHED("f32_to_f16");
	const uint32_t tile = qtile_rows(&c->base, a);
	for (uint32_t n0 = 0; !rc && n0 < a->n_out; n0 += tile) {
		const uint32_t nt = a->n_out - n0 < tile ? a->n_out - n0 : tile;
		const uint64_t n8 = (uint64_t)nt * (K / 8);
		dequant_f16_kernel<<<div_up(n8, 256) < 8192 ? div_up(n8, 256) : 8192, 256, 0, c->stream>>>(
			a->w_dtype, (const uint8_t *)a->w, row_bytes, a->n_in, n0, nt, wh);
		if ((rc = LAUNCHED("dequant_f16")))
			break;
		rc = blas_check(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nt, M, K, &alpha, wh, CUDA_R_16F, K, xh,
					     CUDA_R_16F, K, &beta, a->y + n0, CUDA_R_32F, (int)a->n_out,
					     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
				"gemm q->f16");
	}
	return rc;
}

size_t kvt_cuda_matmul_workspace(const kvt_dev *d, const kvt_matmul_args *a)
{
	if (a->w_dtype == KVT_DTYPE_F16 && a->n_rows > GEMV_MAX_ROWS)
		return (size_t)a->n_rows * a->n_in * sizeof(__half);
	if (is_kept_quant(a->w_dtype) && a->n_rows > GEMV_MAX_ROWS)
		return ((((size_t)a->n_rows * a->n_in + 127) & ~(size_t)127) + (size_t)qtile_rows(d, a) * a->n_in) *
		       sizeof(__half);
	return 0;
}

int kvt_cuda_matmul(kvt_dev *d, const kvt_matmul_args *a, void *ws)
{
	cuda_dev *c = C(d);
	const float alpha = 1.0f, beta = a->accumulate ? 1.0f : 0.0f;
	int M = (int)a->n_rows, K = (int)a->n_in, N = (int)a->n_out;

	if (a->w_dtype == KVT_DTYPE_F32) {
		/* column-major view: y^T (N x M) = W (N x K, stored as K x N) ^T . x^T (K x M) */
		count_launch(d);
		return blas_check(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, (const float *)a->w,
					      K, a->x, K, &beta, a->y, N),
				  "sgemm");
	}
	if (is_kept_quant(a->w_dtype)) {
		if (a->n_rows > GEMV_MAX_ROWS)
			return matmul_q_gemm(c, a, ws);
		launch_gemv_rows(c->stream, a, true, false);
		return LAUNCHED("gemv_q");
	}
	if (a->n_rows <= GEMV_MAX_ROWS) {
		bool vec = K % 8 == 0 && ((uintptr_t)a->w % 16) == 0 && ((uintptr_t)a->x % 16) == 0;
		launch_gemv_rows(c->stream, a, false, vec);
		return LAUNCHED("gemv");
	}
	uint64_t n = (uint64_t)a->n_rows * a->n_in;
	f32_to_f16_kernel<<<div_up(n, 256) < 4096 ? div_up(n, 256) : 4096, 256, 0, c->stream>>>(a->x, (__half *)ws, n);
	int rc = LAUNCHED("f32_to_f16");
	if (rc)
		return rc;
	count_launch(d);
	return blas_check(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, a->w, CUDA_R_16F, K, ws,
				       CUDA_R_16F, K, &beta, a->y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
				       CUBLAS_GEMM_DEFAULT),
			  "gemm f16");
}

/* ---- fused ops (dev.h: each bit-identical to this backend's plain ops it replaces) ---- */

/*
 * The GEMV of gemv_f16_kernel (one warp per output column, 8 fp16 weights a
 * lane a load) with, optionally, the RMSNorm of its input rows fused in:
 * every CTA (256 threads, as rmsnorm_kernel) reduces each row's sum of
 * squares in rmsnorm_kernel's order, so the normalised values are those
 * rmsnorm would have written, computed in registers as they are used. With
 * SWIGLU the warp also reads column n of w2 and writes
 * silu(x . w[n]) * (x . w2[n]) as swiglu_kernel would.
 */
template <int M, bool SWIGLU>
__global__ void __launch_bounds__(256) gemv_fused_kernel(const __half *__restrict__ w, const __half *__restrict__ w2,
							  const float *__restrict__ x, float *__restrict__ y,
							  const float *__restrict__ nw, float eps, uint32_t K, uint32_t N,
							  bool acc, bool vec)
{
	__shared__ float sh[32];
	float r[M];
#pragma unroll
	for (int m = 0; m < M; m++) {
		r[m] = 1.0f;
		if (nw) { /* uniform: every thread reduces */
			const float *xr = x + (size_t)m * K;
			float ss = 0.0f;
			for (uint32_t i = threadIdx.x; i < K; i += blockDim.x)
				ss += xr[i] * xr[i];
			ss = block_sum(ss, sh);
			r[m] = 1.0f / sqrtf(ss / (float)K + eps);
		}
	}
	const uint32_t n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	const int lane = threadIdx.x & 31;
	if (n >= N)
		return;
	const __half *row = w + (size_t)n * K, *row2 = SWIGLU ? w2 + (size_t)n * K : NULL;
	float s[M], s2[M];
#pragma unroll
	for (int m = 0; m < M; m++)
		s[m] = s2[m] = 0.0f;
	if (vec) {
#pragma unroll 4
		for (uint32_t k = lane * 8; k < K; k += 256) {
			float wf[8], wf2[8];
			h8_to_f32(__ldg((const uint4 *)(row + k)), wf);
			if (SWIGLU)
				h8_to_f32(__ldg((const uint4 *)(row2 + k)), wf2);
#pragma unroll
			for (int m = 0; m < M; m++) {
				const float4 *xv = (const float4 *)(x + (size_t)m * K + k);
				float4 a = xv[0], b = xv[1];
				if (nw) {
					const float4 *nv = (const float4 *)(nw + k);
					const float4 na = nv[0], nb = nv[1];
					a.x = a.x * r[m] * na.x;
					a.y = a.y * r[m] * na.y;
					a.z = a.z * r[m] * na.z;
					a.w = a.w * r[m] * na.w;
					b.x = b.x * r[m] * nb.x;
					b.y = b.y * r[m] * nb.y;
					b.z = b.z * r[m] * nb.z;
					b.w = b.w * r[m] * nb.w;
				}
				s[m] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w +
					wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
				if (SWIGLU)
					s2[m] += wf2[0] * a.x + wf2[1] * a.y + wf2[2] * a.z + wf2[3] * a.w +
						 wf2[4] * b.x + wf2[5] * b.y + wf2[6] * b.z + wf2[7] * b.w;
			}
		}
	} else {
		for (uint32_t k = lane; k < K; k += 32) {
			const float wf = __half2float(row[k]), wf2 = SWIGLU ? __half2float(row2[k]) : 0.0f;
#pragma unroll
			for (int m = 0; m < M; m++) {
				float xv = x[(size_t)m * K + k];
				if (nw)
					xv = xv * r[m] * nw[k];
				s[m] += wf * xv;
				if (SWIGLU)
					s2[m] += wf2 * xv;
			}
		}
	}
#pragma unroll
	for (int m = 0; m < M; m++) {
		const float v = warp_sum(s[m]);
		const float u = SWIGLU ? warp_sum(s2[m]) : 0.0f;
		if (lane == 0) {
			float *o = y + (size_t)m * N + n;
			if (SWIGLU)
				*o = v / (1.0f + expf(-v)) * u;
			else
				*o = acc ? *o + v : v;
		}
	}
}

template <int M, bool SWIGLU>
static void launch_gemv_fused(cudaStream_t st, const __half *w, const __half *w2, const float *x, float *y,
			      const float *nw, float eps, uint32_t K, uint32_t N, bool acc, bool vec)
{
	gemv_fused_kernel<M, SWIGLU><<<div_up(N, 8), 256, 0, st>>>(w, w2, x, y, nw, eps, K, N, acc, vec);
}

template <bool SWIGLU>
static void gemv_fused(cudaStream_t st, uint32_t M, const __half *w, const __half *w2, const float *x, float *y,
		       const float *nw, float eps, uint32_t K, uint32_t N, bool acc)
{
	const bool vec = K % 8 == 0 && ((uintptr_t)w % 16) == 0 && (!w2 || ((uintptr_t)w2 % 16) == 0) &&
			 ((uintptr_t)x % 16) == 0 && (!nw || ((uintptr_t)nw % 16) == 0);
	switch (M) {
	case 1: launch_gemv_fused<1, SWIGLU>(st, w, w2, x, y, nw, eps, K, N, acc, vec); break;
	case 2: launch_gemv_fused<2, SWIGLU>(st, w, w2, x, y, nw, eps, K, N, acc, vec); break;
	case 3: launch_gemv_fused<3, SWIGLU>(st, w, w2, x, y, nw, eps, K, N, acc, vec); break;
	case 4: launch_gemv_fused<4, SWIGLU>(st, w, w2, x, y, nw, eps, K, N, acc, vec); break;
	case 5: launch_gemv_fused<5, SWIGLU>(st, w, w2, x, y, nw, eps, K, N, acc, vec); break;
	case 6: launch_gemv_fused<6, SWIGLU>(st, w, w2, x, y, nw, eps, K, N, acc, vec); break;
	case 7: launch_gemv_fused<7, SWIGLU>(st, w, w2, x, y, nw, eps, K, N, acc, vec); break;
	default: launch_gemv_fused<8, SWIGLU>(st, w, w2, x, y, nw, eps, K, N, acc, vec); break;
	}
}

/* rmsnorm_kernel writing fp16: the norm fused with the tensor-core path's input cast. */
__global__ void rmsnorm_f16_kernel(const float *x, const float *w, __half *y, uint32_t n, float eps)
{
	__shared__ float sh[32];
	const float *xr = x + (size_t)blockIdx.x * n;
	__half *yr = y + (size_t)blockIdx.x * n;
	float ss = 0.0f;
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		ss += xr[i] * xr[i];
	ss = block_sum(ss, sh);
	float r = 1.0f / sqrtf(ss / (float)n + eps);
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = __float2half_rn(xr[i] * r * w[i]);
}

int kvt_cuda_norm_matmul(kvt_dev *d, const kvt_norm_matmul_args *a, void *ws)
{
	const kvt_matmul_args *mm = &a->mm;
	cudaStream_t st = C(d)->stream;
	if (mm->w_dtype != KVT_DTYPE_F16)
		return KVT_DEV_COMPOSE;
	if (mm->n_rows <= GEMV_MAX_ROWS) {
		gemv_fused<false>(st, mm->n_rows, (const __half *)mm->w, NULL, mm->x, mm->y, a->norm_w, a->eps, mm->n_in,
				  mm->n_out, mm->accumulate);
		return LAUNCHED("gemv (rmsnorm fused)");
	}
	rmsnorm_f16_kernel<<<mm->n_rows, 256, 0, st>>>(mm->x, a->norm_w, (__half *)ws, mm->n_in, a->eps);
	int rc = LAUNCHED("rmsnorm to f16");
	if (rc)
		return rc;
	const float alpha = 1.0f, beta = mm->accumulate ? 1.0f : 0.0f;
	count_launch(d);
	return blas_check(cublasGemmEx(C(d)->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)mm->n_out, (int)mm->n_rows,
				       (int)mm->n_in, &alpha, mm->w, CUDA_R_16F, (int)mm->n_in, ws, CUDA_R_16F,
				       (int)mm->n_in, &beta, mm->y, CUDA_R_32F, (int)mm->n_out, CUBLAS_COMPUTE_32F,
				       CUBLAS_GEMM_DEFAULT),
			  "gemm f16 (rmsnorm fused)");
}

int kvt_cuda_matmul_swiglu(kvt_dev *d, const kvt_matmul_swiglu_args *a, void *ws)
{
	if (a->w_dtype != KVT_DTYPE_F16 || a->n_rows > GEMV_MAX_ROWS)
		return KVT_DEV_COMPOSE;
	gemv_fused<true>(C(d)->stream, a->n_rows, (const __half *)a->w_gate, (const __half *)a->w_up, a->x, a->y,
			 a->norm_w, a->eps, a->n_in, a->n_out, false);
	return LAUNCHED("gemv gate+up (swiglu fused)");
}
