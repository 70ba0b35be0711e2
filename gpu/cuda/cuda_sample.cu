/*
 * gpu/cuda/cuda_sample.cu — picking tokens on the CUDA backend: argmax (one
 * CTA of 256 threads per row, the lowest index winning ties, as on the CPU)
 * and sampling (dev.h's definition: temperature, top-k, top-p, one uniform
 * draw per row; one CTA of SAMPLE_THREADS per row, no workspace).
 */
#include "cuda_int.cuh"

__global__ void argmax_kernel(const float *x, int32_t *out, uint32_t n)
{
	__shared__ float sv[32];
	__shared__ uint32_t si[32];
	const float *r = x + (size_t)blockIdx.x * n;
	float best = -INFINITY;
	uint32_t bi = UINT32_MAX;
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		if (bi == UINT32_MAX || r[i] > best) { /* increasing i: strict > keeps the lowest index */
			best = r[i];
			bi = i;
		}
	/* lowest index wins ties */
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, best, o);
		uint32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
		if (ov > best || (ov == best && oi < bi)) {
			best = ov;
			bi = oi;
		}
	}
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	if (lane == 0) {
		sv[w] = best;
		si[w] = bi;
	}
	__syncthreads();
	if (w == 0) {
		int nw = blockDim.x >> 5;
		best = lane < nw ? sv[lane] : -INFINITY;
		bi = lane < nw ? si[lane] : UINT32_MAX;
		for (int o = 16; o > 0; o >>= 1) {
			float ov = __shfl_xor_sync(0xffffffffu, best, o);
			uint32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
			if (ov > best || (ov == best && oi < bi)) {
				best = ov;
				bi = oi;
			}
		}
		if (lane == 0)
			out[blockIdx.x] = (int32_t)bi;
	}
}

int kvt_cuda_argmax(kvt_dev *d, const kvt_argmax_args *a)
{
	argmax_kernel<<<a->n_rows, 256, 0, C(d)->stream>>>(a->x, a->out, a->n_cols);
	return LAUNCHED("argmax");
}

/*
 * Sampling (dev.h's definition), one CTA of 1024 threads per row. The top-k
 * value and the top-p cut are found by bisection over the bit patterns of
 * the weights (all in [0, 1], where float order is integer order): ~31
 * counting or summing passes over the row, no sort and no workspace. The
 * draw is a block-wide inclusive scan in index order, chunk by chunk.
 */
#define SAMPLE_THREADS 1024

__device__ double block_sum_d(double v, double *sh)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	__syncthreads();
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0;
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ float sample_w(float x, float m, float temp)
{
	return x == x ? expf((x - m) / temp) : -1.0f;
}

/* count (as double) or weight sum of the w >= t */
__device__ double row_stat(const float *x, uint32_t n, float m, float temp, float t, bool count, double *sh)
{
	double acc = 0.0;
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
		float w = sample_w(x[i], m, temp);
		if (w >= t)
			acc += count ? 1.0 : (double)w;
	}
	return block_sum_d(acc, sh);
}

__global__ void __launch_bounds__(SAMPLE_THREADS) sample_kernel(kvt_sample_args a)
{
	__shared__ double sh[32];
	__shared__ float shf[32];
	__shared__ int found;
	const float *x = a.x + (size_t)blockIdx.x * a.n_cols;
	const uint32_t n = a.n_cols;
	float m = -INFINITY;
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		if (x[i] == x[i])
			m = fmaxf(m, x[i]);
	m = warp_max(m);
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		shf[threadIdx.x >> 5] = m;
	__syncthreads();
	m = (threadIdx.x & 31) < (blockDim.x >> 5) ? shf[threadIdx.x & 31] : -INFINITY;
	m = warp_max(m);
	if (m == -INFINITY) {
		if (threadIdx.x == 0)
			a.out[blockIdx.x] = -1;
		return;
	}
	const float T = a.temperature;
	const double nv = row_stat(x, n, m, T, 0.0f, true, sh);
	float tk = 0.0f;
	if (a.top_k && (double)a.top_k < nv) { /* the largest t with count(w >= t) >= top_k */
		uint32_t lo = 0, hi = 0x3F800000u;
		while (lo < hi) {
			uint32_t mid = lo + (hi - lo + 1) / 2;
			if (row_stat(x, n, m, T, __uint_as_float(mid), true, sh) >= (double)a.top_k)
				lo = mid;
			else
				hi = mid - 1;
		}
		tk = __uint_as_float(lo);
	}
	float tp = 0.0f;
	if (a.top_p < 1.0f) { /* the largest t >= tk with sum(w >= t) >= top_p * sum(w >= tk) */
		const double target = (double)a.top_p * row_stat(x, n, m, T, tk, false, sh);
		uint32_t lo = __float_as_uint(tk), hi = 0x3F800000u;
		while (lo < hi) {
			uint32_t mid = lo + (hi - lo + 1) / 2;
			if (row_stat(x, n, m, T, __uint_as_float(mid), false, sh) >= target)
				lo = mid;
			else
				hi = mid - 1;
		}
		tp = __uint_as_float(lo);
	}
	const float thr = fmaxf(tk, tp);
	const double target = (double)a.u[blockIdx.x] * row_stat(x, n, m, T, thr, false, sh);
	/* inclusive scan of candidate weights in index order, a chunk of blockDim at a time */
	if (threadIdx.x == 0)
		found = INT32_MAX;
	double base = 0.0;
	int last = -1;
	__syncthreads();
	for (uint32_t c0 = 0; c0 < n; c0 += blockDim.x) {
		const uint32_t i = c0 + threadIdx.x;
		float w = i < n ? sample_w(x[i], m, T) : -1.0f;
		double v = w >= thr ? (double)w : 0.0;
		double incl = v;
		int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
		for (int o = 1; o < 32; o <<= 1) {
			double t = __shfl_up_sync(0xffffffffu, incl, o);
			if (lane >= o)
				incl += t;
		}
		__syncthreads();
		if (lane == 31)
			sh[wp] = incl;
		__syncthreads();
		double before = 0.0, total = 0.0;
		for (int j = 0; j < (int)(blockDim.x >> 5); j++) {
			if (j < wp)
				before += sh[j];
			total += sh[j];
		}
		if (w >= thr && i < n) {
			if (base + before + incl > target)
				atomicMin(&found, (int)i);
		}
		/* the last candidate so far, for a draw that rounding carried past the end */
		int cand = (w >= thr && i < n) ? (int)i : -1;
		for (int o = 16; o > 0; o >>= 1)
			cand = max(cand, __shfl_xor_sync(0xffffffffu, cand, o));
		__syncthreads();
		if (lane == 0)
			sh[wp] = (double)cand;
		__syncthreads();
		for (int j = 0; j < (int)(blockDim.x >> 5); j++)
			last = max(last, (int)sh[j]);
		base += total;
		__syncthreads();
		if (found != INT32_MAX)
			break;
	}
	if (threadIdx.x == 0)
		a.out[blockIdx.x] = found != INT32_MAX ? found : last;
}

size_t kvt_cuda_sample_workspace(const kvt_dev *d, const kvt_sample_args *a) { return 0; }

int kvt_cuda_sample(kvt_dev *d, const kvt_sample_args *a, void *ws)
{
	sample_kernel<<<a->n_rows, SAMPLE_THREADS, 0, C(d)->stream>>>(*a);
	return LAUNCHED("sample");
}
