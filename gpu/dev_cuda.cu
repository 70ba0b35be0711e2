/*
 * gpu/dev_cuda.cu — the CUDA backend: the product. Every op of dev.h on the
 * GPU, tested op by op against the CPU reference (tests/test_gpu_parity.c).
 *
 * Streams. Every op runs on the device's compute stream, in issue order;
 * kvt_dev_sync waits for it. Streams made by kvt_dev_stream_create are
 * non-blocking streams of their own (the tiering manager's copy and codec
 * queues); work on them is ordered against the compute stream only by
 * events, never by timing. Copies to or from host memory that the caller
 * may reuse at once (copy_h2d, copy_d2h from pageable memory) wait for the
 * compute stream before returning; copy_async does not wait.
 *
 * Memory. cudaMalloc for device memory, cudaHostAlloc for pinned host
 * memory; no managed memory. The engine allocates its buffers once at load,
 * so a caching pool would buy nothing on the hot path.
 *
 * Errors. Out of memory returns KVT_ENOMEM (recoverable). Errors that leave
 * the context unusable ("sticky": illegal address, launch failure, ...)
 * abort the process with the CUDA error string, since nothing computed on
 * that device afterwards can be trusted. Other errors return KVT_EDEVICE.
 *
 * Kernels:
 *   - matmul: cuBLAS GemmEx (fp16 inputs, fp32 accumulation) when more than
 *     GEMV_MAX_ROWS rows multiply a weight; fewer rows (decode) use a GEMV
 *     that reads fp16 weights once with 16-byte loads and keeps the
 *     activations in fp32. fp32 weights go through cublasSgemm.
 *   - matmul with Q5_0/Q4_K/Q5_K/Q6_K weights kept as stored: <= GEMV_MAX_ROWS
 *     rows, a GEMV with one warp per output column whose lanes widen 8
 *     weights at a time with the CPU reference's arithmetic (x stays fp32);
 *     more rows widen a tile of weight rows to fp16 in the workspace and run
 *     cuBLAS GemmEx on it. Q8_0/Q4_0/Q4_1 have no kernels (loaded as fp16).
 *   - attention, decode (one query row): flash-decoding. The keys of each KV
 *     head are split into chunks across CTAs; within a CTA each group of
 *     lanes owns one key at a time (head_dim / 8 lanes, 16-byte loads) and
 *     keeps its own online softmax for every query head of the GQA group, so
 *     K and V are read once per KV head. A second kernel merges the chunks.
 *   - attention, prefill: a CTA takes a tile of query rows of one KV head,
 *     stages 32 keys at a time in shared memory and runs an online softmax
 *     per query vector (one warp per vector, a lane per key), skipping key
 *     tiles past the tile's last position (causal).
 *   - codecs: one warp (or, vectorised, head_dim / 8 lanes) per (layer, K/V,
 *     head, token) vector: the amax of each scale group (kv_codec.h,
 *     kvt_codec_group_dims: 32 dims for INT8, the whole head for FP8) by
 *     warp reduction, then the shared scalar arithmetic of kv_codec.h, so
 *     codes and scales match the CPU bit for bit.
 */
extern "C" {
#include "dev_impl.h"
}
#include "kv_codec.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#define GEMV_MAX_ROWS 8
#define MAX_HEAD_DIM 256
#define MAX_GROUP 16 /* query heads per KV head the decode kernel keeps in registers */
#define DECODE_TICKETS 1024 /* KV heads the fused combine counts CTAs for (more: the combine kernel) */
#define STAGE_BYTES 8192 /* shared memory a staged decode CTA takes for table entries and scales */

struct kvt_stream {
	cudaStream_t s;
};
struct kvt_event {
	cudaEvent_t e;
};
/* An instantiated graph and what one replay of it does, for the counters. */
struct kvt_graph {
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	uint64_t n_kernels, n_copies, h2d, d2h, d2d;
};

typedef struct cuda_dev {
	kvt_dev base;          /* common head; must be first */
	int device;            /* CUDA ordinal */
	int n_sm;              /* multiprocessors */
	cudaStream_t stream;   /* compute stream */
	cublasHandle_t blas;   /* bound to stream */
	int32_t *d_flag;       /* one int the embedding kernel reports a bad id through */
	int decode_version;    /* 1, 2 or 3: which decode-attention kernel (KVT_CUDA_DECODE); 0: decode_choices' */
	uint32_t qtile_elems;  /* quantized weights widened to fp16 per GEMM tile (KVT_CUDA_QTILE; tests) */
	int decode2_occ[3][6][3]; /* CTAs per SM of each attn_decode2_kernel, 0 until asked */
	bool capturing;        /* between capture_begin and capture_end (compute stream) */
	bool capture_bad;      /* an op refused to run while capturing: the capture fails */
	kvt_graph cap;         /* counts of the capture in progress */
	int decode_combine;    /* 1: combine fused into the last CTA of each head, 0: its own kernel
	                          (KVT_CUDA_COMBINE=fused|separate); -1: decode_choices' */
	int decode_stage;      /* 1/0: kernel 2/3 with/without table entries and 8-bit scales staged in
	                          shared memory (KVT_CUDA_STAGE=1|0); -1: decode_choices' */
	uint32_t stage_blocks; /* blocks staged per round (KVT_CUDA_STAGE_BLOCKS, tests); 0: from the budget */
	uint32_t *d_tickets;   /* [DECODE_TICKETS] the fused combine's CTA count per KV head, device; zero
	                          between launches (the last CTA of a head resets its own) */
} cuda_dev;

static cuda_dev *C(kvt_dev *d) { return (cuda_dev *)d; }
static cudaStream_t S(kvt_dev *d, kvt_stream *s) { return s ? s->s : C(d)->stream; }

static bool is_sticky(cudaError_t e)
{
	switch (e) {
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchFailure:
	case cudaErrorHardwareStackError:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorAssert:
	case cudaErrorECCUncorrectable:
	case cudaErrorLaunchTimeout:
		return true;
	default:
		return false;
	}
}

/* Map a CUDA result to ours; abort on an error that poisons the context. */
static int cu_check(cudaError_t e, const char *what, const char *file, int line)
{
	if (e == cudaSuccess)
		return KVT_OK;
	if (is_sticky(e)) {
		fprintf(stderr, "kvtier: fatal CUDA error in %s (%s:%d): %s (%s); the GPU context is unusable\n",
			what, file, line, cudaGetErrorString(e), cudaGetErrorName(e));
		abort();
	}
	if (e == cudaErrorMemoryAllocation) {
		(void)cudaGetLastError(); /* clear the non-sticky error */
		KVT_LOGE("cuda: %s: out of device memory", what);
		return KVT_ENOMEM;
	}
	(void)cudaGetLastError();
	KVT_LOGE("cuda: %s: %s", what, cudaGetErrorString(e));
	return KVT_EDEVICE;
}
#define CU(call) cu_check((call), #call, __FILE__, __LINE__)

/* Count a launch on the compute stream: into the graph being captured, or as launched now. */
static void count_launch(kvt_dev *d)
{
	cuda_dev *c = (cuda_dev *)d;
	if (c->capturing)
		c->cap.n_kernels++;
	else
		KVT_DEV_COUNT(d, kernel_launches, 1);
}

static int launched(kvt_dev *d, const char *what, const char *file, int line)
{
	count_launch(d);
	return cu_check(cudaGetLastError(), what, file, line);
}
#define LAUNCHED(what) launched(d, what, __FILE__, __LINE__)

/* An op that waits on the host cannot be captured: refuse it and fail the capture. */
static int no_wait_in_capture(kvt_dev *d, const char *op)
{
	cuda_dev *c = (cuda_dev *)d;
	if (!c->capturing)
		return KVT_OK;
	c->capture_bad = true;
	KVT_LOGE("dev.%s: waits on the host, which a graph capture cannot hold", op);
	return KVT_EINVAL;
}

static int host_wait(kvt_dev *d, cudaStream_t st)
{
	KVT_DEV_COUNT(d, host_syncs, 1);
	return CU(cudaStreamSynchronize(st));
}

/* Count a copy of n bytes in direction dir (enum kvt_copy_dir) on stream st. */
static void count_copy(kvt_dev *d, cudaStream_t st, int dir, size_t n)
{
	cuda_dev *c = (cuda_dev *)d;
	if (c->capturing && st == c->stream) {
		c->cap.n_copies++;
		(dir == KVT_COPY_H2D ? c->cap.h2d : dir == KVT_COPY_D2H ? c->cap.d2h : c->cap.d2d) += n;
		return;
	}
	KVT_DEV_COUNT(d, copies, 1);
	if (dir == KVT_COPY_H2D)
		KVT_DEV_COUNT(d, h2d_bytes, n);
	else if (dir == KVT_COPY_D2H)
		KVT_DEV_COUNT(d, d2h_bytes, n);
	else
		KVT_DEV_COUNT(d, d2d_bytes, n);
}

static int blas_check(cublasStatus_t st, const char *what)
{
	if (st == CUBLAS_STATUS_SUCCESS)
		return KVT_OK;
	if (st == CUBLAS_STATUS_ALLOC_FAILED) {
		KVT_LOGE("cuda: %s: cuBLAS out of memory", what);
		return KVT_ENOMEM;
	}
	KVT_LOGE("cuda: %s: cuBLAS status %d", what, (int)st);
	/* An execution failure may hide a sticky error: let cu_check decide. */
	int rc = CU(cudaPeekAtLastError());
	return rc ? rc : KVT_EDEVICE;
}

static unsigned div_up(uint64_t a, uint64_t b) { return (unsigned)((a + b - 1) / b); }

/* ---- memory, copies, streams, events ---- */

static void cuda_destroy(kvt_dev *d)
{
	cuda_dev *c = C(d);
	if (c->blas)
		cublasDestroy(c->blas);
	if (c->d_flag)
		cudaFree(c->d_flag);
	if (c->d_tickets)
		cudaFree(c->d_tickets);
	if (c->stream) {
		cudaStreamSynchronize(c->stream);
		cudaStreamDestroy(c->stream);
	}
	free(c);
}

/* The block-quantized dtypes this backend multiplies as stored. */
__host__ __device__ static inline bool is_kept_quant(int dtype)
{
	return dtype >= KVT_DTYPE_Q8_0 && dtype <= KVT_DTYPE_Q6_K;
}

/* kvt_dtype_row_bytes for those, callable from kernels. */
__host__ __device__ static inline size_t q_row_bytes(int dtype, uint32_t n)
{
	switch (dtype) {
	case KVT_DTYPE_Q8_0: return (size_t)(n / 32) * 34;
	case KVT_DTYPE_Q4_0: return (size_t)(n / 32) * 18;
	case KVT_DTYPE_Q4_1: return (size_t)(n / 32) * 20;
	case KVT_DTYPE_Q5_0: return (size_t)(n / 32) * 22;
	case KVT_DTYPE_Q4_K: return (size_t)(n / 256) * 144;
	case KVT_DTYPE_Q5_K: return (size_t)(n / 256) * 176;
	default: return (size_t)(n / 256) * 210; /* Q6_K */
	}
}

static bool cuda_supports_dtype(const kvt_dev *d, int dtype)
{
	return dtype == KVT_DTYPE_F32 || dtype == KVT_DTYPE_F16 || is_kept_quant(dtype);
}

static int cuda_alloc(kvt_dev *d, size_t n, void **out)
{
	int rc = CU(cudaMalloc(out, n));
	if (rc == KVT_ENOMEM)
		KVT_LOGE("cuda: cannot allocate %zu bytes of device memory", n);
	return rc;
}

static void cuda_free(kvt_dev *d, void *p) { CU(cudaFree(p)); }

static int cuda_copy_sync(kvt_dev *d, void *dst, const void *src, size_t n, int dir)
{
	int rc = no_wait_in_capture(d, dir == KVT_COPY_H2D ? "copy_h2d" : "copy_d2h");
	if (rc)
		return rc;
	count_copy(d, C(d)->stream, dir, n);
	rc = CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, C(d)->stream));
	return rc ? rc : host_wait(d, C(d)->stream);
}

static int cuda_copy_h2d(kvt_dev *d, void *dst, const void *src, size_t n)
{
	return cuda_copy_sync(d, dst, src, n, KVT_COPY_H2D);
}

static int cuda_copy_d2h(kvt_dev *d, void *dst, const void *src, size_t n)
{
	return cuda_copy_sync(d, dst, src, n, KVT_COPY_D2H);
}

static int cuda_copy_d2d(kvt_dev *d, void *dst, const void *src, size_t n)
{
	count_copy(d, C(d)->stream, KVT_COPY_D2D, n);
	return CU(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, C(d)->stream));
}

static int cuda_sync(kvt_dev *d)
{
	int rc = no_wait_in_capture(d, "sync");
	return rc ? rc : host_wait(d, C(d)->stream);
}

static int cuda_host_alloc(kvt_dev *d, size_t n, void **out)
{
	int rc = CU(cudaHostAlloc(out, n, cudaHostAllocPortable));
	if (rc == KVT_ENOMEM)
		KVT_LOGE("cuda: cannot allocate %zu bytes of pinned host memory", n);
	return rc;
}

static void cuda_host_free(kvt_dev *d, void *p) { CU(cudaFreeHost(p)); }

static int cuda_stream_create(kvt_dev *d, kvt_stream **out)
{
	kvt_stream *s = (kvt_stream *)calloc(1, sizeof *s);
	if (!s)
		return KVT_ENOMEM;
	int rc = CU(cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking));
	if (rc) {
		free(s);
		return rc;
	}
	*out = s;
	return KVT_OK;
}

static void cuda_stream_destroy(kvt_dev *d, kvt_stream *s)
{
	host_wait(d, s->s);
	CU(cudaStreamDestroy(s->s));
	free(s);
}

static int cuda_stream_sync(kvt_dev *d, kvt_stream *s)
{
	int rc = s ? KVT_OK : no_wait_in_capture(d, "stream_sync");
	return rc ? rc : host_wait(d, S(d, s));
}

static int cuda_event_create(kvt_dev *d, kvt_event **out)
{
	kvt_event *e = (kvt_event *)calloc(1, sizeof *e);
	if (!e)
		return KVT_ENOMEM;
	int rc = CU(cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming));
	if (rc) {
		free(e);
		return rc;
	}
	*out = e;
	return KVT_OK;
}

static void cuda_event_destroy(kvt_dev *d, kvt_event *e)
{
	CU(cudaEventDestroy(e->e));
	free(e);
}

static int cuda_event_record(kvt_dev *d, kvt_event *e, kvt_stream *s) { return CU(cudaEventRecord(e->e, S(d, s))); }
static int cuda_stream_wait_event(kvt_dev *d, kvt_stream *s, kvt_event *e)
{
	KVT_DEV_COUNT(d, event_waits, 1);
	return CU(cudaStreamWaitEvent(S(d, s), e->e, 0));
}
static int cuda_event_sync(kvt_dev *d, kvt_event *e)
{
	KVT_DEV_COUNT(d, host_syncs, 1);
	return CU(cudaEventSynchronize(e->e));
}

static bool cuda_event_done(kvt_dev *d, kvt_event *e)
{
	cudaError_t r = cudaEventQuery(e->e);
	if (r == cudaErrorNotReady)
		return false;
	return CU(r) == KVT_OK;
}

static int cuda_copy_async(kvt_dev *d, kvt_stream *s, void *dst, const void *src, size_t n, int dir)
{
	static const cudaMemcpyKind kinds[] = { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
						cudaMemcpyDeviceToDevice };
	count_copy(d, S(d, s), dir, n);
	return CU(cudaMemcpyAsync(dst, src, n, kinds[dir], S(d, s)));
}

static int cuda_copy_2d_async(kvt_dev *d, kvt_stream *s, void *dst, size_t dst_pitch, const void *src,
			      size_t src_pitch, size_t row_bytes, size_t n_rows, int dir)
{
	static const cudaMemcpyKind kinds[] = { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
						cudaMemcpyDeviceToDevice };
	count_copy(d, S(d, s), dir, row_bytes * n_rows);
	return CU(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, n_rows, kinds[dir], S(d, s)));
}

/* ---- reductions ---- */

__device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* Sum (or MAX: maximum) over a CTA of up to 1024 threads (blockDim.x a multiple of 32). */
template <bool MAX>
__device__ float block_reduce(float v, float *sh)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = MAX ? warp_max(v) : warp_sum(v);
	__syncthreads();
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : (MAX ? -INFINITY : 0.0f);
	return MAX ? warp_max(v) : warp_sum(v);
}

__device__ float block_sum(float v, float *sh) { return block_reduce<false>(v, sh); }
__device__ float block_max(float v, float *sh) { return block_reduce<true>(v, sh); }

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

/* Weight elements widened to fp16 per GEMM tile by default (bounds the workspace to 32 MiB). */
#define QTILE_ELEMS (16u << 20)

/* Rows of a weight tile widened per GEMM call: all of N if they fit, else a multiple of 64. */
static uint32_t qtile_rows(const kvt_dev *d, const kvt_matmul_args *a)
{
	uint32_t r = ((const cuda_dev *)d)->qtile_elems / a->n_in;
	r = r < 64 ? 64 : r & ~63u;
	return r < a->n_out ? r : a->n_out;
}

__device__ __forceinline__ float ld_half(const uint8_t *p)
{
	__half_raw r;
	r.x = (unsigned short)(p[0] | p[1] << 8);
	return __half2float(__half(r));
}

/* Q4_K/Q5_K sub-block s's 6-bit scale and min (dev_cpu.c's kq_scale_min). */
__device__ __forceinline__ void kq_scale_min(int s, const uint8_t *sc, int *scale, int *min)
{
	if (s < 4) {
		*scale = sc[s] & 63;
		*min = sc[s + 4] & 63;
	} else {
		*scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
		*min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
	}
}

/*
 * Elements k0 .. k0+7 of a row (k0 a multiple of 8, so they share one
 * sub-block), with the CPU reference's arithmetic: d * q for Q8_0,
 * d * (q - 8) for Q4_0, fmaf(d, q, m) for Q4_1, d * (q - 16) for Q5_0,
 * fmaf(d * sc, q, -(dmin * mn)) for Q4_K/Q5_K, d * scale * (q - 32) for
 * Q6_K, so a weight widens to the same float on both backends.
 */
__device__ __forceinline__ void dq8(int dtype, const uint8_t *__restrict__ row, uint32_t k0, float w[8])
{
	if (dtype == KVT_DTYPE_Q8_0) {
		const uint8_t *b = row + (size_t)(k0 / 32) * 34;
		const uint8_t *c = b + 2 + k0 % 32; /* blocks of 34 bytes: only 2-byte aligned */
		const float d = ld_half(b);
#pragma unroll
		for (int i = 0; i < 8; i++)
			w[i] = d * (float)(int8_t)c[i];
		return;
	}
	if (dtype == KVT_DTYPE_Q4_0 || dtype == KVT_DTYPE_Q4_1) {
		const bool q41 = dtype == KVT_DTYPE_Q4_1;
		const uint8_t *b = row + (size_t)(k0 / 32) * (q41 ? 20 : 18), *qs = b + (q41 ? 4 : 2);
		const uint32_t j0 = k0 % 32;
		const float d = ld_half(b), m = q41 ? ld_half(b + 2) : 0.0f;
#pragma unroll
		for (int i = 0; i < 8; i++) {
			const uint32_t j = j0 + i;
			const int q = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
			w[i] = q41 ? fmaf(d, (float)q, m) : d * (float)(q - 8); /* as dev_cpu.c (built with FMA contraction) */
		}
		return;
	}
	if (dtype == KVT_DTYPE_Q5_0) {
		const uint8_t *b = row + (size_t)(k0 / 32) * 22;
		const uint32_t j0 = k0 % 32, qh = b[2] | b[3] << 8 | b[4] << 16 | (uint32_t)b[5] << 24;
		const float d = ld_half(b);
#pragma unroll
		for (int i = 0; i < 8; i++) {
			const uint32_t j = j0 + i;
			const int q = (j < 16 ? b[6 + j] & 15 : b[6 + j - 16] >> 4) | (int)((qh >> j) & 1) << 4;
			w[i] = d * (float)(q - 16);
		}
		return;
	}
	const uint32_t j0 = k0 % 256;
	if (dtype == KVT_DTYPE_Q6_K) {
		const uint8_t *b = row + (size_t)(k0 / 256) * 210;
		const uint32_t half = j0 / 128, i4 = j0 % 128 / 32, l0 = j0 % 32;
		const uint8_t *ql = b + 64 * half + l0 + 32 * (i4 & 1), *qh = b + 128 + 32 * half + l0;
		const float ds = ld_half(b + 208) * (float)(int8_t)b[192 + j0 / 16];
#pragma unroll
		for (int i = 0; i < 8; i++) {
			const int q = ((i4 < 2 ? ql[i] & 15 : ql[i] >> 4) | ((qh[i] >> (2 * i4)) & 3) << 4) - 32;
			w[i] = ds * (float)q;
		}
		return;
	}
	const bool q5 = dtype == KVT_DTYPE_Q5_K;
	const uint8_t *b = row + (size_t)(k0 / 256) * (q5 ? 176 : 144);
	const uint32_t sub = j0 / 32, l0 = j0 % 32;
	const uint8_t *q = b + (q5 ? 48 : 16) + 32 * (sub / 2) + l0, *qh = b + 16 + l0;
	int sc, mn;
	kq_scale_min((int)sub, b + 4, &sc, &mn);
	const float ds = ld_half(b) * (float)sc, ms = ld_half(b + 2) * (float)mn;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		int v = sub & 1 ? q[i] >> 4 : q[i] & 15;
		if (q5)
			v |= ((qh[i] >> sub) & 1) << 4;
		w[i] = fmaf(ds, (float)v, -ms);
	}
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

static size_t cuda_matmul_workspace(const kvt_dev *d, const kvt_matmul_args *a)
{
	if (a->w_dtype == KVT_DTYPE_F16 && a->n_rows > GEMV_MAX_ROWS)
		return (size_t)a->n_rows * a->n_in * sizeof(__half);
	if (is_kept_quant(a->w_dtype) && a->n_rows > GEMV_MAX_ROWS)
		return ((((size_t)a->n_rows * a->n_in + 127) & ~(size_t)127) + (size_t)qtile_rows(d, a) * a->n_in) *
		       sizeof(__half);
	return 0;
}

static int cuda_matmul(kvt_dev *d, const kvt_matmul_args *a, void *ws)
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

/* ---- elementwise and row ops ---- */

__global__ void rmsnorm_kernel(const float *x, const float *w, float *y, uint32_t n, float eps)
{
	__shared__ float sh[32];
	const float *xr = x + (size_t)blockIdx.x * n;
	float *yr = y + (size_t)blockIdx.x * n;
	float ss = 0.0f;
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		ss += xr[i] * xr[i];
	ss = block_sum(ss, sh);
	float r = 1.0f / sqrtf(ss / (float)n + eps);
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		yr[i] = xr[i] * r * w[i];
}

static int cuda_rmsnorm(kvt_dev *d, const kvt_rmsnorm_args *a)
{
	rmsnorm_kernel<<<a->n_rows, 256, 0, C(d)->stream>>>(a->x, a->w, a->y, a->n_dim, a->eps);
	return LAUNCHED("rmsnorm");
}

/* One thread per (row, rotated pair); theta advances as the CPU's does. */
__global__ void rope_kernel(kvt_rope_args a, float theta_scale)
{
	uint32_t pairs = a.n_rot / 2;
	uint64_t idx = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
	if (idx >= (uint64_t)a.n_rows * pairs)
		return;
	uint32_t m = (uint32_t)(idx / pairs), i = (uint32_t)(idx % pairs);
	float theta = (float)a.pos[m];
	for (uint32_t j = 0; j < i; j++)
		theta *= theta_scale;
	if (a.freq_factors)
		theta /= a.freq_factors[i];
	float c, s;
	sincosf(theta, &s, &c);
	/* the pair's dims: adjacent, or half the rotated width apart (NEOX) */
	const uint32_t i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + pairs : 2 * i + 1;
	for (uint32_t h = 0; h < a.n_heads; h++) {
		float *x = a.x + ((size_t)m * a.n_heads + h) * a.head_dim;
		float x0 = x[i0], x1 = x[i1];
		x[i0] = x0 * c - x1 * s;
		x[i1] = x0 * s + x1 * c;
	}
}

static int cuda_rope(kvt_dev *d, const kvt_rope_args *a)
{
	const float theta_scale = powf(a->freq_base, -2.0f / (float)a->n_rot);
	uint64_t n = (uint64_t)a->n_rows * (a->n_rot / 2);
	rope_kernel<<<div_up(n, 128), 128, 0, C(d)->stream>>>(*a, theta_scale);
	return LAUNCHED("rope");
}

__global__ void swiglu_kernel(const float *g, const float *u, float *y, uint64_t n, int act)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
		float v = g[i];
		if (act == KVT_ACT_GELU_TANH) /* sqrt(2 / pi) */
			y[i] = 0.5f * v * (1.0f + tanhf(0.79788456080286535587989211986876f * v * (1.0f + 0.044715f * v * v))) * u[i];
		else
			y[i] = v / (1.0f + expf(-v)) * u[i];
	}
}

static unsigned grid_for(uint64_t n) { return div_up(n, 256) < 8192 ? div_up(n, 256) : 8192; }

static int cuda_swiglu(kvt_dev *d, const kvt_swiglu_args *a)
{
	swiglu_kernel<<<grid_for(a->n), 256, 0, C(d)->stream>>>(a->gate, a->up, a->y, a->n, a->act);
	return LAUNCHED("swiglu");
}

/* n_x = 0: y += x; else x is a row of n_x broadcast over y's rows (a bias). */
__global__ void add_kernel(const float *x, float *y, uint64_t n, uint64_t n_x)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		y[i] += x[n_x ? i % n_x : i];
}

static int cuda_add(kvt_dev *d, const kvt_add_args *a)
{
	add_kernel<<<grid_for(a->n), 256, 0, C(d)->stream>>>(a->x, a->y, a->n, a->n_x);
	return LAUNCHED("add");
}

__global__ void scale_kernel(float *y, uint64_t n, float s)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
		y[i] *= s;
}

/* Out-of-range ids are reported through *bad (the first one seen) and leave their row 0. */
__global__ void embed_kernel(kvt_embed_args a, int32_t *bad)
{
	uint32_t m = blockIdx.x;
	int32_t id = a.ids[m];
	float *y = a.y + (size_t)m * a.n_dim;
	if (id < 0 || (uint32_t)id >= a.n_vocab) {
		if (threadIdx.x == 0)
			atomicCAS(bad, INT32_MIN, id);
		for (uint32_t k = threadIdx.x; k < a.n_dim; k += blockDim.x)
			y[k] = 0.0f;
		return;
	}
	if (a.table_dtype == KVT_DTYPE_F32) {
		const float *row = (const float *)a.table + (size_t)id * a.n_dim;
		for (uint32_t k = threadIdx.x; k < a.n_dim; k += blockDim.x)
			y[k] = row[k];
	} else if (a.table_dtype == KVT_DTYPE_F16) {
		const __half *row = (const __half *)a.table + (size_t)id * a.n_dim;
		for (uint32_t k = threadIdx.x; k < a.n_dim; k += blockDim.x)
			y[k] = __half2float(row[k]);
	} else { /* a kept quantized type: a thread per 8 elements */
		const uint8_t *row = (const uint8_t *)a.table + (size_t)id * q_row_bytes(a.table_dtype, a.n_dim);
		for (uint32_t k = threadIdx.x * 8; k < a.n_dim; k += blockDim.x * 8) {
			float wf[8];
			dq8(a.table_dtype, row, k, wf);
			for (int i = 0; i < 8; i++)
				y[k + i] = wf[i];
		}
	}
}

static int cuda_embed(kvt_dev *d, const kvt_embed_args *a)
{
	/* The CPU backend rejects an out-of-range id with KVT_EINVAL; so does this one,
	 * at the cost of one small read-back (ids come from the host anyway). */
	cuda_dev *c = C(d);
	if (a->trusted_ids) {
		embed_kernel<<<a->n_rows, 128, 0, c->stream>>>(*a, c->d_flag);
		return LAUNCHED("embed");
	}
	int rc = no_wait_in_capture(d, "embed (ids not trusted)");
	if (rc)
		return rc;
	int32_t h_bad = INT32_MIN;
	rc = CU(cudaMemcpyAsync(c->d_flag, &h_bad, sizeof h_bad, cudaMemcpyHostToDevice, c->stream));
	if (!rc) {
		embed_kernel<<<a->n_rows, 128, 0, c->stream>>>(*a, c->d_flag);
		rc = LAUNCHED("embed");
		if (!rc && a->scale != 0 && a->scale != 1) {
			const uint64_t n = (uint64_t)a->n_rows * a->n_dim;
			scale_kernel<<<grid_for(n), 256, 0, c->stream>>>(a->y, n, a->scale);
			rc = LAUNCHED("embed scale");
		}
		if (!rc)
			rc = CU(cudaMemcpyAsync(&h_bad, c->d_flag, sizeof h_bad, cudaMemcpyDeviceToHost, c->stream));
	}
	if (!rc) {
		count_copy(d, c->stream, KVT_COPY_H2D, sizeof h_bad);
		count_copy(d, c->stream, KVT_COPY_D2H, sizeof h_bad);
		rc = host_wait(d, c->stream);
	}
	if (!rc && h_bad != INT32_MIN) {
		KVT_LOGE("dev.embed: token id %d out of range (vocab %u)", h_bad, a->n_vocab);
		return KVT_EINVAL;
	}
	return rc;
}

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

static int cuda_argmax(kvt_dev *d, const kvt_argmax_args *a)
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

static size_t cuda_sample_workspace(const kvt_dev *d, const kvt_sample_args *a) { return 0; }

static int cuda_sample(kvt_dev *d, const kvt_sample_args *a, void *ws)
{
	sample_kernel<<<a->n_rows, SAMPLE_THREADS, 0, C(d)->stream>>>(*a);
	return LAUNCHED("sample");
}

/* ---- paged KV ---- */

/* The first row's position: from device memory when the op was given one (a graph replays at new positions). */
__device__ __forceinline__ uint32_t pos0_of(const int32_t *d_pos0, uint32_t pos0)
{
	return d_pos0 ? (uint32_t)*d_pos0 : pos0;
}

/* Element offset of (slot, layer, K/V, head, token, 0) in an fp16 pool. */
__device__ __forceinline__ size_t kv_off(const kvt_kv_layout &l, int32_t slot, uint32_t layer, uint32_t kv,
					 uint32_t head, uint32_t t)
{
	size_t off = (size_t)slot * l.n_layers;
	off = ((off + layer) * 2 + kv) * l.n_kv_heads + head;
	return (off * l.block_tokens + t) * l.head_dim;
}

__global__ void kv_store_kernel(kvt_kv_layout l, kvt_kv_store_args a)
{
	uint32_t m = blockIdx.x, h = blockIdx.y;
	uint32_t pos = pos0_of(a.d_pos0, a.pos0) + m;
	int32_t slot = a.block_table[pos / l.block_tokens];
	__half *pool = (__half *)l.pool;
	size_t ko = kv_off(l, slot, a.layer, 0, h, pos % l.block_tokens);
	size_t vo = kv_off(l, slot, a.layer, 1, h, pos % l.block_tokens);
	size_t src = ((size_t)m * l.n_kv_heads + h) * l.head_dim;
	for (uint32_t i = threadIdx.x; i < l.head_dim; i += blockDim.x) {
		pool[ko + i] = __float2half_rn(a.k[src + i]);
		pool[vo + i] = __float2half_rn(a.v[src + i]);
	}
}

/*
 * 8-bit pools: a block is the packed format (dev.h). Vector
 * vi = ((layer * 2 + kv) * n_kv_heads + head) * block_tokens + t has its codes
 * at byte vi * head_dim of the block; dim i's fp32 scale is that of its group,
 * at n_vec * head_dim + (vi * ng + i / gd) * 4 (gd = kvt_codec_group_dims
 * values per group, ng = head_dim / gd groups per vector: 1 for FP8).
 */
__device__ __forceinline__ size_t q_nvec(const kvt_kv_layout &l)
{
	return (size_t)l.n_layers * 2 * l.n_kv_heads * l.block_tokens;
}

__device__ __forceinline__ const uint8_t *q_block(const kvt_kv_layout &l, int32_t slot)
{
	const uint32_t ng = l.head_dim / kvt_codec_group_dims(l.codec, l.head_dim);
	return (const uint8_t *)l.pool + (size_t)slot * q_nvec(l) * (l.head_dim + 4 * ng);
}

/* Byte offset in a block of the scale of vector vi's dim i. */
__device__ __forceinline__ size_t q_scale_off(const kvt_kv_layout &l, size_t vi, uint32_t i)
{
	const uint32_t gd = kvt_codec_group_dims(l.codec, l.head_dim);
	return q_nvec(l) * l.head_dim + (vi * (l.head_dim / gd) + i / gd) * 4;
}

__device__ __forceinline__ size_t q_vi(const kvt_kv_layout &l, uint32_t layer, uint32_t kv, uint32_t head, uint32_t t)
{
	return (((size_t)layer * 2 + kv) * l.n_kv_heads + head) * l.block_tokens + t;
}

__device__ __forceinline__ float q_decode(int codec, uint8_t c)
{
	return codec == KVT_KV_CODEC_FP8 ? kvt_fp8_e4m3_decode(c) : (float)(int8_t)c;
}

/*
 * One warp per (row, head, K/V), one scale group after another: round to
 * fp16, amax, codes, scale — as kv_pack does. Loop bounds are uniform over
 * the warp (every lane reaches warp_max).
 */
__global__ void kv_store_q_kernel(kvt_kv_layout l, kvt_kv_store_args a)
{
	const uint32_t m = blockIdx.x, h = blockIdx.y, kv = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const uint32_t pos = pos0_of(a.d_pos0, a.pos0) + m, t = pos % l.block_tokens, D = l.head_dim;
	const uint32_t gd = kvt_codec_group_dims(l.codec, D);
	const int32_t slot = a.block_table[pos / l.block_tokens];
	const float *x = (kv ? a.v : a.k) + ((size_t)m * l.n_kv_heads + h) * D;
	uint8_t *base = (uint8_t *)q_block(l, slot);
	const size_t vi = q_vi(l, a.layer, kv, h, t);
	for (uint32_t g0 = 0; g0 < D; g0 += gd) {
		float amax = 0.0f;
		for (uint32_t i = g0 + lane; i < g0 + gd; i += 32)
			amax = fmaxf(amax, fabsf(__half2float(__float2half_rn(x[i]))));
		amax = warp_max(amax);
		float sc, inv;
		kvt_codec_scales(amax, l.codec == KVT_KV_CODEC_FP8 ? KVT_FP8_MAX : KVT_INT8_MAX, &sc, &inv);
		for (uint32_t i = g0 + lane; i < g0 + gd; i += 32) {
			float v = __half2float(__float2half_rn(x[i])) * inv;
			base[vi * D + i] = l.codec == KVT_KV_CODEC_FP8 ? kvt_fp8_e4m3_encode(v) : (uint8_t)kvt_int8_encode(v);
		}
		if (lane == 0)
			*(float *)(base + q_scale_off(l, vi, g0)) = sc;
	}
}

static int cuda_kv_store(kvt_dev *d, const kvt_kv_store_args *a)
{
	if (a->kv->codec != KVT_KV_CODEC_F16)
		kv_store_q_kernel<<<dim3(a->n_rows, a->kv->n_kv_heads), 64, 0, C(d)->stream>>>(*a->kv, *a);
	else
		kv_store_kernel<<<dim3(a->n_rows, a->kv->n_kv_heads), 64, 0, C(d)->stream>>>(*a->kv, *a);
	return LAUNCHED("kv_store");
}

/*
 * Decode attention, split-K. Grid (n_kv_heads, n_splits); 4 warps. A key is
 * read by LPK = head_dim / 8 lanes, 8 elements each (one 16-byte load of
 * fp16, or 8 bytes of 8-bit codes plus the scale of their group: a lane's 8
 * dims never straddle two groups, which are 32 dims or the whole head); a warp covers
 * GPW = 32 / LPK keys per step and each lane group takes U keys per loop
 * trip, all loads issued before any arithmetic, so enough bytes are in
 * flight to stream the pool at memory speed. Every lane keeps 8 dims of q
 * and of the accumulators for each query head of the GQA group (K and V are
 * read once per KV head) and an online softmax per head in log2 units
 * (exp2). Partials go to ws as [split][query head] { max, sum, acc[head_dim] }.
 */
/* The first position a query at pos sees: pos - window + 1 under a sliding window, else 0. */
__host__ __device__ static inline uint32_t attn_first_key(const kvt_attention_args &a, uint32_t pos)
{
	return a.window && pos + 1 > a.window ? pos + 1 - a.window : 0;
}

template <int D, bool Q8>
__device__ __forceinline__ void load_key(const kvt_kv_layout &l, uint32_t layer, uint32_t kh, int32_t slot,
					 uint32_t t, int sub, float *kf, float *vf)
{
	if constexpr (Q8) {
		const uint8_t *blk = q_block(l, slot);
		const size_t vk = q_vi(l, layer, 0, kh, t), vv = q_vi(l, layer, 1, kh, t);
		uint2 kr = __ldg((const uint2 *)(blk + vk * D + sub * 8));
		uint2 vr = __ldg((const uint2 *)(blk + vv * D + sub * 8));
		float ks = __ldg((const float *)(blk + q_scale_off(l, vk, sub * 8)));
		float vs = __ldg((const float *)(blk + q_scale_off(l, vv, sub * 8)));
		const uint8_t *kc = (const uint8_t *)&kr, *vc = (const uint8_t *)&vr;
		if (l.codec == KVT_KV_CODEC_FP8) {
#pragma unroll
			for (int i = 0; i < 8; i += 2) {
				__half2 kh2 = __half2(__nv_cvt_fp8x2_to_halfraw2(
					(__nv_fp8x2_storage_t)(kc[i] | (kc[i + 1] << 8)), __NV_E4M3));
				__half2 vh2 = __half2(__nv_cvt_fp8x2_to_halfraw2(
					(__nv_fp8x2_storage_t)(vc[i] | (vc[i + 1] << 8)), __NV_E4M3));
				float2 a = __half22float2(kh2), b = __half22float2(vh2);
				kf[i] = a.x * ks;
				kf[i + 1] = a.y * ks;
				vf[i] = b.x * vs;
				vf[i + 1] = b.y * vs;
			}
		} else {
#pragma unroll
			for (int i = 0; i < 8; i++) {
				kf[i] = (float)(int8_t)kc[i] * ks;
				vf[i] = (float)(int8_t)vc[i] * vs;
			}
		}
	} else {
		const __half *pool = (const __half *)l.pool;
		uint4 kr = __ldg((const uint4 *)(pool + kv_off(l, slot, layer, 0, kh, t) + sub * 8));
		uint4 vr = __ldg((const uint4 *)(pool + kv_off(l, slot, layer, 1, kh, t) + sub * 8));
		const __half2 *k2 = (const __half2 *)&kr, *v2 = (const __half2 *)&vr;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			float2 f = __half22float2(k2[i]);
			kf[2 * i] = f.x;
			kf[2 * i + 1] = f.y;
			f = __half22float2(v2[i]);
			vf[2 * i] = f.x;
			vf[2 * i + 1] = f.y;
		}
	}
}

/*
 * The end of a decode CTA (128 threads): merge the online softmaxes of its
 * GROUPS lane groups (head_dim / DPL lanes each, a lane holding DPL dims of
 * the accumulators of GMAX query heads, the first G of them real) through
 * shared memory, one query head at a time, into the split's partial
 * { max, sum, acc[D] } in ws ([split][query head], maxima in log2 units).
 */
template <int D, int GROUPS, int DPL, int GMAX>
__device__ __forceinline__ void decode_merge(const float (&mx)[GMAX], const float (&sum)[GMAX],
					     const float (&acc)[GMAX][DPL], uint32_t G, uint32_t kh, uint32_t split,
					     uint32_t n_heads, float *ws)
{
	constexpr int LPK = D / DPL;
	const int tid = threadIdx.x, sub = tid % LPK, grp = tid / LPK;
	__shared__ float sm[GROUPS], ssum[GROUPS];
	__shared__ float sacc[GROUPS][D];
#pragma unroll
	for (int g = 0; g < GMAX; g++) {
		if (g >= (int)G)
			break; /* uniform over the CTA */
		if (sub == 0) {
			sm[grp] = mx[g];
			ssum[grp] = sum[g];
		}
#pragma unroll
		for (int i = 0; i < DPL; i++)
			sacc[grp][sub * DPL + i] = acc[g][i];
		__syncthreads();
		float M = -INFINITY;
		for (int j = 0; j < GROUPS; j++)
			M = fmaxf(M, sm[j]);
		float *out = ws + ((size_t)split * n_heads + kh * G + g) * (D + 2);
		for (int dd = tid; dd < D; dd += 128) {
			float v = 0.0f;
			for (int j = 0; j < GROUPS; j++)
				if (sm[j] != -INFINITY)
					v += sacc[j][dd] * exp2f(sm[j] - M);
			out[2 + dd] = v;
		}
		if (tid == 0) {
			float L = 0.0f;
			for (int j = 0; j < GROUPS; j++)
				if (sm[j] != -INFINITY)
					L += ssum[j] * exp2f(sm[j] - M);
			out[0] = M;
			out[1] = L;
		}
		__syncthreads();
	}
}

/*
 * Decode variants (decode_choices, below the launchers): what a decode
 * kernel does besides its key loop, passed by value with every launch.
 *
 * Fused combine (tickets set). Each CTA writes its split's partial as
 * always, then fences it and takes a ticket from its KV head's counter;
 * the CTA that takes the last ticket (n_splits - 1) merges the head's
 * partials, G query heads one after another, with the arithmetic of the
 * combine kernel of its version and in the same order, so the output is
 * bit-identical to the separate combine; it then resets its counter to 0,
 * so the next launch (a graph's replay included) finds it zero with no
 * memset. The partials of other CTAs are read through L2 (__ldcg): this
 * CTA's L1 never held them. NOTE: the counters belong to the device and
 * every decode runs on its compute stream, so no two launches overlap on
 * them.
 */
struct decode_opts {
	uint32_t *tickets;     /* NULL: partials only, a combine kernel merges them; else [n_kv_heads] counters */
	uint32_t stage_blocks; /* kernel 2/3 staged: blocks per round, a multiple of 4 */
};

/* attn_combine_kernel's merge of query head h, by this CTA's threads. */
__device__ __forceinline__ void combine1_head(const float *ws, float *out, uint32_t h, uint32_t n_heads, uint32_t D,
					      uint32_t n_splits)
{
	float M = -INFINITY;
	for (uint32_t s = 0; s < n_splits; s++)
		M = fmaxf(M, __ldcg(ws + ((size_t)s * n_heads + h) * (D + 2)));
	float L = 0.0f;
	for (uint32_t s = 0; s < n_splits; s++) {
		const float *p = ws + ((size_t)s * n_heads + h) * (D + 2);
		if (__ldcg(p) != -INFINITY)
			L += __ldcg(p + 1) * exp2f(__ldcg(p) - M);
	}
	for (uint32_t dd = threadIdx.x; dd < D; dd += blockDim.x) {
		float v = 0.0f;
		for (uint32_t s = 0; s < n_splits; s++) {
			const float *p = ws + ((size_t)s * n_heads + h) * (D + 2);
			if (__ldcg(p) != -INFINITY)
				v += __ldcg(p + 2 + dd) * exp2f(__ldcg(p) - M);
		}
		out[(size_t)h * D + dd] = v / L;
	}
}

/* attn_combine2_kernel's merge of query head h (128 threads, as that kernel's); cw: n_splits floats of shared memory. */
__device__ __forceinline__ void combine2_head(const float *ws, float *out, uint32_t h, uint32_t n_heads, uint32_t D,
					      uint32_t n_splits, float *cw)
{
	__shared__ float red2[32];
	const size_t stride = (size_t)n_heads * (D + 2);
	const float *p = ws + (size_t)h * (D + 2);
	float m = -INFINITY;
	for (uint32_t s = threadIdx.x; s < n_splits; s += blockDim.x) {
		cw[s] = __ldcg(p + s * stride);
		m = fmaxf(m, cw[s]);
	}
	const float M = block_max(m, red2);
	float L = 0.0f;
	for (uint32_t s = threadIdx.x; s < n_splits; s += blockDim.x) {
		const float w = cw[s] == -INFINITY ? 0.0f : exp2f(cw[s] - M);
		cw[s] = w;
		L += __ldcg(p + s * stride + 1) * w;
	}
	L = block_sum(L, red2); /* its barriers also publish cw */
	for (uint32_t dd = threadIdx.x; dd < D; dd += blockDim.x) {
		float v = 0.0f;
#pragma unroll 8
		for (uint32_t s = 0; s < n_splits; s++)
			v += cw[s] * __ldcg(p + s * stride + 2 + dd);
		out[(size_t)h * D + dd] = v / L;
	}
	__syncthreads(); /* cw is the next head's */
}

/* After decode_merge: the last CTA of KV head kh (grid y: the splits) merges its G query heads into a.out. */
template <bool V2>
__device__ __forceinline__ void decode_combine_last(const float *ws, const kvt_attention_args &a, uint32_t kh,
						    uint32_t G, uint32_t D, uint32_t *tickets, float *cw)
{
	__shared__ uint32_t ticket;
	const uint32_t n_splits = gridDim.y;
	__threadfence(); /* this thread's share of the partial, visible to every CTA before the ticket */
	__syncthreads();
	if (threadIdx.x == 0)
		ticket = atomicAdd(tickets + kh, 1u);
	__syncthreads();
	if (ticket != n_splits - 1)
		return; /* uniform over the CTA */
	__threadfence();
	for (uint32_t g = 0; g < G; g++) {
		if constexpr (V2)
			combine2_head(ws, a.out, kh * G + g, a.n_heads, D, n_splits, cw);
		else
			combine1_head(ws, a.out, kh * G + g, a.n_heads, D, n_splits);
	}
	if (threadIdx.x == 0)
		tickets[kh] = 0; /* every CTA of this launch has counted: ready for the next */
}

/*
 * Staging (kernel 2/3, STAGE): before each round of a split's key loop the
 * CTA loads the round's n_sb block-table entries (from block sb0) into
 * s_slot and, for 8-bit pools, those blocks' scales of KV head kh (K then V,
 * [block][K/V][token][group]) into s_scale, each in one cooperative pass,
 * so the key loop reads neither from global memory. Rounds are whole
 * multiples of 4 blocks, so warp w still takes chunks w, w + 4, ... and the
 * result is bit-identical to the kernel without staging.
 */
template <bool Q8>
__device__ __forceinline__ void decode2_stage(const kvt_kv_layout &l, const kvt_attention_args &a, uint32_t kh,
					      uint32_t sb0, uint32_t n_sb, int32_t *s_slot, float *s_scale)
{
	__syncthreads(); /* the last round's readers are done */
	for (uint32_t i = threadIdx.x; i < n_sb; i += blockDim.x)
		s_slot[i] = __ldg(a.block_table + sb0 + i);
	if constexpr (Q8) {
		__syncthreads();
		const uint32_t per = l.block_tokens * (l.head_dim / kvt_codec_group_dims(l.codec, l.head_dim));
		for (uint32_t i = threadIdx.x; i < n_sb * 2 * per; i += blockDim.x) {
			const uint32_t b = i / (2 * per), kv = i / per % 2, j = i % per;
			const uint8_t *bp = q_block(l, s_slot[b]);
			s_scale[i] = __ldg((const float *)(bp + q_scale_off(l, q_vi(l, a.layer, kv, kh, 0), 0)) + j);
		}
	}
	__syncthreads();
}

/*
 * keys_per_split: the split size; with a.d_pos0 (a graph's launch, the grid
 * sized for the bound in a.pos0) the number of splits wanted instead, from
 * which each CTA sizes the splits for the real length as decode_splits does,
 * and splits past it write empty partials.
 */
template <int D, int G, bool Q8>
__global__ void __launch_bounds__(128) attn_decode_kernel(kvt_kv_layout l, kvt_attention_args a,
							  uint32_t keys_per_split, float *ws, decode_opts o)
{
	const uint32_t pos0 = pos0_of(a.d_pos0, a.pos0);
	if (a.d_pos0)
		keys_per_split = max((pos0 + keys_per_split) / keys_per_split, 64u); /* div_up(pos0 + 1, want) */
	constexpr int LPK = D / 8;      /* lanes per key */
	constexpr int GPW = 32 / LPK;   /* keys per warp step */
	constexpr int GROUPS = 4 * GPW; /* lane groups in the CTA */
	constexpr int U = Q8 ? 4 : 2;   /* keys per lane group per trip */
	const uint32_t kh = blockIdx.x, split = blockIdx.y;
	const uint32_t k0 = attn_first_key(a, pos0) + split * keys_per_split; /* splits cover the window */
	const uint32_t k1 = min(pos0 + 1, k0 + keys_per_split);
	const int tid = threadIdx.x, grp = tid / LPK, sub = tid % LPK, gi = grp % GPW;
	const uint32_t bt = l.block_tokens;
	const float qs = a.scale * 1.4426950408889634f; /* scores in log2 units */

	float q[G][8], acc[G][8], mx[G], sum[G];
#pragma unroll
	for (int g = 0; g < G; g++) {
		const float *qp = a.q + ((size_t)kh * G + g) * D + sub * 8;
#pragma unroll
		for (int i = 0; i < 8; i++) {
			q[g][i] = qp[i] * qs;
			acc[g][i] = 0.0f;
		}
		mx[g] = -INFINITY;
		sum[g] = 0.0f;
	}
	/* Trip counts are uniform per warp (every lane shuffles); keys past k1 are masked. */
	for (uint32_t base = k0 + (tid >> 5) * GPW; base < k1; base += U * GROUPS) {
		float kf[U][8], vf[U][8];
		bool valid[U];
#pragma unroll
		for (int u = 0; u < U; u++) {
			const uint32_t p = base + u * GROUPS + gi;
			valid[u] = p < k1;
			const uint32_t pp = valid[u] ? p : k0;
			load_key<D, Q8>(l, a.layer, kh, a.block_table[pp / bt], pp % bt, sub, kf[u], vf[u]);
		}
#pragma unroll
		for (int g = 0; g < G; g++) {
			float s[U], nm = mx[g];
#pragma unroll
			for (int u = 0; u < U; u++) {
				float d = 0.0f;
#pragma unroll
				for (int i = 0; i < 8; i++)
					d += q[g][i] * kf[u][i];
#pragma unroll
				for (int o = LPK / 2; o > 0; o >>= 1)
					d += __shfl_xor_sync(0xffffffffu, d, o, LPK);
				s[u] = valid[u] ? d : -INFINITY;
				nm = fmaxf(nm, s[u]);
			}
			if (nm == -INFINITY)
				continue; /* nothing visible yet for this lane group */
			const float c = exp2f(mx[g] - nm);
			float pw[U], ps = 0.0f;
#pragma unroll
			for (int u = 0; u < U; u++) {
				pw[u] = exp2f(s[u] - nm);
				ps += pw[u];
			}
			sum[g] = sum[g] * c + ps;
#pragma unroll
			for (int i = 0; i < 8; i++) {
				float v = acc[g][i] * c;
#pragma unroll
				for (int u = 0; u < U; u++)
					v += pw[u] * vf[u][i];
				acc[g][i] = v;
			}
			mx[g] = nm;
		}
	}
	decode_merge<D, GROUPS, 8, G>(mx, sum, acc, G, kh, split, a.n_heads, ws);
	if (o.tickets)
		decode_combine_last<false>(ws, a, kh, G, D, o.tickets, nullptr);
}

/* Merge n_splits partials per query head into out (maxima in log2 units). Grid n_heads. */
__global__ void attn_combine_kernel(const float *ws, float *out, uint32_t n_heads, uint32_t D, uint32_t n_splits)
{
	uint32_t h = blockIdx.x;
	float M = -INFINITY;
	for (uint32_t s = 0; s < n_splits; s++)
		M = fmaxf(M, ws[((size_t)s * n_heads + h) * (D + 2)]);
	float L = 0.0f;
	for (uint32_t s = 0; s < n_splits; s++) {
		const float *p = ws + ((size_t)s * n_heads + h) * (D + 2);
		if (p[0] != -INFINITY)
			L += p[1] * exp2f(p[0] - M);
	}
	for (uint32_t dd = threadIdx.x; dd < D; dd += blockDim.x) {
		float v = 0.0f;
		for (uint32_t s = 0; s < n_splits; s++) {
			const float *p = ws + ((size_t)s * n_heads + h) * (D + 2);
			if (p[0] != -INFINITY)
				v += p[2 + dd] * exp2f(p[0] - M);
		}
		out[(size_t)h * D + dd] = v / L;
	}
}

/*
 * Decode attention, version 2 (KVT_CUDA_DECODE=2, or 3 for its other 8-bit
 * variant, below; version 1 above stays the default until a GPU run has
 * measured them). Work is cut along the pool's
 * own layout instead of key by key:
 *   - a split is a run of whole blocks; splits are sized so that one wave of
 *     CTAs (the kernel's occupancy times the multiprocessors) covers the
 *     context;
 *   - a warp takes a chunk of TPT consecutive tokens of one block per trip.
 *     For one KV head those tokens' K codes are one contiguous run (and so
 *     are their V codes), read by every lane with U loads of 16 bytes (fp16
 *     at 8 dims a lane, 8-bit at 16 dims a lane) or 8 bytes (8-bit at 8
 *     dims a lane, for large GQA groups), all issued before any arithmetic;
 *   - the next chunk's block-table entry is loaded one trip ahead, so no trip
 *     waits on a dependent load;
 *   - 8-bit scales are applied once per key and query head (to a lane's
 *     partial dot before the lane reduction, whose dims lie in one scale
 *     group, and to the softmax weight of V), not once per dim;
 *   - codes are converted to fp32 one key at a time, so the raw loads and
 *     not U * DPL floats are what stays in registers across the trip.
 * Groups of up to 4 query heads have a kernel each (GMAX = G); larger ones
 * share one per bound (GMAX 8 or 16, G a runtime count under it). Partials go
 * to ws as in version 1, and attn_combine2_kernel merges them.
 */
template <int DPL, bool Q8>
struct decode2_raw {
	using type = typename std::conditional<(Q8 ? DPL : 2 * DPL) == 16, uint4, uint2>::type;
};

/* A lane's DPL values of one key, unscaled (8-bit codes as their code values). */
template <int DPL, bool Q8, typename R>
__device__ __forceinline__ void decode2_unpack(const R &r, int codec, float *f)
{
	if constexpr (!Q8) {
		const __half2 *h2 = (const __half2 *)&r;
#pragma unroll
		for (int i = 0; i < DPL / 2; i++) {
			float2 v = __half22float2(h2[i]);
			f[2 * i] = v.x;
			f[2 * i + 1] = v.y;
		}
	} else {
		const uint8_t *c = (const uint8_t *)&r;
		if (codec == KVT_KV_CODEC_FP8) {
#pragma unroll
			for (int i = 0; i < DPL; i += 2) {
				float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
					(__nv_fp8x2_storage_t)(c[i] | (c[i + 1] << 8)), __NV_E4M3)));
				f[i] = v.x;
				f[i + 1] = v.y;
			}
		} else {
#pragma unroll
			for (int i = 0; i < DPL; i++)
				f[i] = (float)(int8_t)c[i];
		}
	}
}

/* blocks_per_split: with a.d_pos0, the splits per head of one wave instead (as attn_decode_kernel's). */
/* STAGE: table entries and 8-bit scales staged in shared memory (decode2_stage), o.stage_blocks a round. */
template <int D, int GMAX, bool Q8, int DPL, bool STAGE = false>
__global__ void __launch_bounds__(128) attn_decode2_kernel(kvt_kv_layout l, kvt_attention_args a,
							   uint32_t blocks_per_split, float *ws, decode_opts o)
{
	extern __shared__ float d2_dyn[]; /* staged: [stage_blocks] slots, then scales; fused: the combine's weights */
	using raw_t = typename decode2_raw<DPL, Q8>::type;
	constexpr int LPK = D / DPL;    /* lanes per key */
	constexpr int GPW = 32 / LPK;   /* keys per warp load */
	constexpr int UMAX = GMAX * DPL <= 32 ? 8 : 4;
	constexpr int U = 16 / GPW < 1 ? 1 : (16 / GPW > UMAX ? UMAX : 16 / GPW); /* loads per lane per trip */
	constexpr int TPT = GPW * U;    /* tokens per warp trip */
	constexpr int GROUPS = 4 * GPW; /* lane groups in the CTA */
	static_assert(LPK >= 1 && LPK <= 32 && 32 % LPK == 0, "head_dim / DPL lanes must divide a warp");
	/* groups up to 4 have a kernel each, so their loops over G unroll without a guard */
	const uint32_t G = GMAX <= 4 ? GMAX : a.n_heads / l.n_kv_heads;
	const uint32_t bt = l.block_tokens, n_ctx = pos0_of(a.d_pos0, a.pos0) + 1, nb = (n_ctx + bt - 1) / bt;
	if (a.d_pos0)
		blocks_per_split = (nb + blocks_per_split - 1) / blocks_per_split; /* as decode2_splits */
	const uint32_t kh = blockIdx.x, split = blockIdx.y, lo = attn_first_key(a, n_ctx - 1);
	const uint32_t b0 = lo / bt + split * blocks_per_split; /* splits cover the window's blocks */
	const uint32_t b1 = min(b0 + blocks_per_split, nb);
	const uint32_t cpb = (bt + TPT - 1) / TPT; /* chunks per block */
	/* Every chunk starts at a visible token: the last block has only as many as it needs. */
	const uint32_t last_tokens = b1 > b0 ? min(bt, n_ctx - (b1 - 1) * bt) : 0;
	const uint32_t n_chunks = b1 > b0 ? (b1 - b0 - 1) * cpb + (last_tokens + TPT - 1) / TPT : 0; /* 0: past the end */
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int sub = lane % LPK, gi = lane / LPK;
	const float qs = a.scale * 1.4426950408889634f; /* scores in log2 units */

	float q[GMAX][DPL], acc[GMAX][DPL], mx[GMAX], sum[GMAX];
#pragma unroll
	for (int g = 0; g < GMAX; g++) {
		const float *qp = a.q + ((size_t)kh * G + (g < (int)G ? g : 0)) * D + sub * DPL;
#pragma unroll
		for (int i = 0; i < DPL; i++) {
			q[g][i] = g < (int)G ? qp[i] * qs : 0.0f;
			acc[g][i] = 0.0f;
		}
		mx[g] = -INFINITY;
		sum[g] = 0.0f;
	}

	/* Chunk c of the split: block b0 + c / cpb, tokens from (c % cpb) * TPT. Trip counts are uniform per warp. */
	int32_t next_slot = !STAGE && (uint32_t)warp < n_chunks ? __ldg(a.block_table + b0 + warp / cpb) : 0;
	int32_t *const s_slot = (int32_t *)d2_dyn;
	float *const s_scale = d2_dyn + o.stage_blocks;
	const uint32_t gd = Q8 ? kvt_codec_group_dims(l.codec, D) : D, ng = D / gd;
	(void)s_scale, (void)ng; /* 8-bit staged only */
	/* STAGE: rounds of o.stage_blocks blocks, each staged first; else one round of every chunk */
	const uint32_t round_chunks = STAGE ? o.stage_blocks * cpb : n_chunks;
	for (uint32_t r0 = 0; r0 < n_chunks; r0 += round_chunks) {
	const uint32_t r1 = min(n_chunks, r0 + round_chunks), sb0 = b0 + r0 / cpb;
	if constexpr (STAGE)
		decode2_stage<Q8>(l, a, kh, sb0, (r1 - 1) / cpb - r0 / cpb + 1, s_slot, s_scale);
	for (uint32_t c = r0 + warp; c < r1; c += 4) {
		int32_t slot;
		if constexpr (STAGE) {
			slot = s_slot[c / cpb - r0 / cpb];
		} else {
			slot = next_slot;
			if (c + 4 < n_chunks)
				next_slot = __ldg(a.block_table + b0 + (c + 4) / cpb);
		}
		const uint32_t blk = b0 + c / cpb, t0 = (c % cpb) * TPT;
		raw_t kr[U], vr[U];
		float ks[U], vs[U];
		bool valid[U];
#pragma unroll
		for (int u = 0; u < U; u++) {
			const uint32_t t = t0 + u * GPW + gi;
			valid[u] = t < bt && blk * bt + t < n_ctx && blk * bt + t >= lo;
			const uint32_t tl = valid[u] ? t : t0; /* a masked key loads a visible one */
			if constexpr (Q8) {
				const uint8_t *bp = q_block(l, slot);
				const size_t vk = q_vi(l, a.layer, 0, kh, tl), vv = q_vi(l, a.layer, 1, kh, tl);
				kr[u] = __ldg((const raw_t *)(bp + vk * D + sub * DPL));
				vr[u] = __ldg((const raw_t *)(bp + vv * D + sub * DPL));
				if constexpr (STAGE) { /* [block][K/V][token][group] */
					const float *sc = s_scale + (size_t)(blk - sb0) * 2 * bt * ng + tl * ng + sub * DPL / gd;
					ks[u] = sc[0];
					vs[u] = sc[bt * ng];
				} else {
					ks[u] = __ldg((const float *)(bp + q_scale_off(l, vk, sub * DPL)));
					vs[u] = __ldg((const float *)(bp + q_scale_off(l, vv, sub * DPL)));
				}
			} else {
				const __half *pool = (const __half *)l.pool;
				kr[u] = __ldg((const raw_t *)(pool + kv_off(l, slot, a.layer, 0, kh, tl) + sub * DPL));
				vr[u] = __ldg((const raw_t *)(pool + kv_off(l, slot, a.layer, 1, kh, tl) + sub * DPL));
				ks[u] = vs[u] = 1.0f;
			}
		}
		/* scores, one key at a time */
		float s[GMAX][U];
#pragma unroll
		for (int u = 0; u < U; u++) {
			float kf[DPL];
			decode2_unpack<DPL, Q8>(kr[u], l.codec, kf);
#pragma unroll
			for (int g = 0; g < GMAX; g++) {
				if (g >= (int)G)
					break; /* G is uniform, so every lane still shuffles alike */
				float d = 0.0f;
#pragma unroll
				for (int i = 0; i < DPL; i++)
					d += q[g][i] * kf[i];
				if constexpr (Q8)
					d *= ks[u];
#pragma unroll
				for (int o = LPK / 2; o > 0; o >>= 1)
					d += __shfl_xor_sync(0xffffffffu, d, o, LPK);
				s[g][u] = valid[u] ? d : -INFINITY;
			}
		}
		/* online softmax: s becomes the weight of each key's V (scale included) */
#pragma unroll
		for (int g = 0; g < GMAX; g++) {
			if (g >= (int)G)
				break;
			float nm = mx[g];
#pragma unroll
			for (int u = 0; u < U; u++)
				nm = fmaxf(nm, s[g][u]);
			const float cf = nm == -INFINITY ? 1.0f : exp2f(mx[g] - nm);
			float ps = 0.0f;
#pragma unroll
			for (int u = 0; u < U; u++) {
				const float pw = s[g][u] == -INFINITY ? 0.0f : exp2f(s[g][u] - nm);
				ps += pw;
				s[g][u] = pw * vs[u];
			}
			sum[g] = sum[g] * cf + ps;
			mx[g] = nm;
#pragma unroll
			for (int i = 0; i < DPL; i++)
				acc[g][i] *= cf;
		}
#pragma unroll
		for (int u = 0; u < U; u++) {
			float vf[DPL];
			decode2_unpack<DPL, Q8>(vr[u], l.codec, vf);
#pragma unroll
			for (int g = 0; g < GMAX; g++) {
				if (g >= (int)G)
					break;
#pragma unroll
				for (int i = 0; i < DPL; i++)
					acc[g][i] += s[g][u] * vf[i];
			}
		}
	}
	} /* rounds */
	decode_merge<D, GROUPS, DPL, GMAX>(mx, sum, acc, G, kh, split, a.n_heads, ws);
	if (o.tickets)
		decode_combine_last<true>(ws, a, kh, G, D, o.tickets, d2_dyn);
}

/*
 * Merge n_splits partials per query head (grid n_heads, 128 threads). Every
 * split's weight exp2(max_s - M) is computed once into shared memory (the
 * dynamic n_splits floats), then each thread sums its dims over the splits
 * with independent loads.
 */
__global__ void attn_combine2_kernel(const float *ws, float *out, uint32_t n_heads, uint32_t D, uint32_t n_splits)
{
	extern __shared__ float cw[];
	__shared__ float red[32];
	const size_t stride = (size_t)n_heads * (D + 2);
	const float *p = ws + (size_t)blockIdx.x * (D + 2);
	float m = -INFINITY;
	for (uint32_t s = threadIdx.x; s < n_splits; s += blockDim.x) {
		cw[s] = p[s * stride];
		m = fmaxf(m, cw[s]);
	}
	const float M = block_max(m, red);
	float L = 0.0f;
	for (uint32_t s = threadIdx.x; s < n_splits; s += blockDim.x) {
		const float w = cw[s] == -INFINITY ? 0.0f : exp2f(cw[s] - M);
		cw[s] = w;
		L += p[s * stride + 1] * w;
	}
	L = block_sum(L, red); /* its barriers also publish cw */
	for (uint32_t dd = threadIdx.x; dd < D; dd += blockDim.x) {
		float v = 0.0f;
#pragma unroll 8
		for (uint32_t s = 0; s < n_splits; s++)
			v += cw[s] * p[s * stride + 2 + dd];
		out[(size_t)blockIdx.x * D + dd] = v / L;
	}
}

/*
 * Prefill attention. Grid (n_kv_heads, row tiles); 4 warps. The CTA's query
 * vectors are QT rows x G heads (at most 32), staged in shared memory; key
 * tiles of 32 are staged as fp32. Warp w owns query vectors w, w + 4, ...;
 * within a warp lane j scores key j of the tile, then lanes split the
 * dimensions for the weighted sum of V.
 */
#define PF_KEYS 32
#define PF_VECS 32
template <int DPL> /* dims per lane: head_dim / 32, rounded up */
__global__ void __launch_bounds__(128) attn_prefill_kernel(kvt_kv_layout l, kvt_attention_args a, uint32_t qt)
{
	constexpr int VPW = PF_VECS / 4; /* query vectors per warp, at most */
	extern __shared__ float shm[];
	const uint32_t D = l.head_dim, G = a.n_heads / l.n_kv_heads, bt = l.block_tokens;
	const uint32_t kh = blockIdx.x, r0 = blockIdx.y * qt;
	const uint32_t rows = min(qt, a.n_rows - r0), nv = rows * G;
	const uint32_t pos0 = pos0_of(a.d_pos0, a.pos0);
	float *sq = shm;                     /* [PF_VECS][D] */
	float *sk = sq + PF_VECS * D;        /* [PF_KEYS][D + 1] */
	float *sv = sk + PF_KEYS * (D + 1);  /* [PF_KEYS][D] */
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;

	for (uint32_t i = threadIdx.x; i < nv * D; i += blockDim.x) {
		uint32_t v = i / D, dd = i % D, r = v / G, g = v % G;
		sq[i] = a.q[((size_t)(r0 + r) * a.n_heads + kh * G + g) * D + dd] * a.scale;
	}
	float mx[VPW], sum[VPW], acc[VPW][DPL];
#pragma unroll
	for (int j = 0; j < VPW; j++) {
		mx[j] = -INFINITY;
		sum[j] = 0.0f;
#pragma unroll
		for (int e = 0; e < DPL; e++)
			acc[j][e] = 0.0f;
	}
	const uint32_t last = pos0 + r0 + rows - 1; /* the tile's last visible key */
	/* the tile's first visible key (its first row's window start), rounded down to a key tile */
	for (uint32_t t0 = attn_first_key(a, pos0 + r0) / PF_KEYS * PF_KEYS; t0 <= last; t0 += PF_KEYS) {
		__syncthreads();
		for (uint32_t i = threadIdx.x; i < PF_KEYS * D; i += blockDim.x) {
			uint32_t kk = i / D, dd = i % D, p = t0 + kk;
			float kvk = 0.0f, kvv = 0.0f;
			if (p <= last) {
				int32_t slot = a.block_table[p / bt];
				if (l.codec != KVT_KV_CODEC_F16) {
					const uint8_t *blk = q_block(l, slot);
					const size_t vk = q_vi(l, a.layer, 0, kh, p % bt);
					const size_t vv = q_vi(l, a.layer, 1, kh, p % bt);
					kvk = q_decode(l.codec, blk[vk * D + dd]) * *(const float *)(blk + q_scale_off(l, vk, dd));
					kvv = q_decode(l.codec, blk[vv * D + dd]) * *(const float *)(blk + q_scale_off(l, vv, dd));
				} else {
					const __half *pool = (const __half *)l.pool;
					kvk = __half2float(pool[kv_off(l, slot, a.layer, 0, kh, p % bt) + dd]);
					kvv = __half2float(pool[kv_off(l, slot, a.layer, 1, kh, p % bt) + dd]);
				}
			}
			sk[kk * (D + 1) + dd] = kvk;
			sv[kk * D + dd] = kvv;
		}
		__syncthreads();
#pragma unroll
		for (int j = 0; j < VPW; j++) {
			uint32_t v = w + 4 * j;
			if (v >= nv)
				break;
			uint32_t pos = pos0 + r0 + v / G;
			uint32_t p = t0 + lane;
			float s = -INFINITY;
			if (p <= pos && p >= attn_first_key(a, pos)) {
				s = 0.0f;
				const float *qv = sq + v * D, *kv = sk + lane * (D + 1);
				for (uint32_t dd = 0; dd < D; dd++)
					s += qv[dd] * kv[dd];
			}
			float tm = warp_max(s);
			if (tm == -INFINITY)
				continue; /* no visible key in this tile for this row */
			float nm = fmaxf(mx[j], tm);
			float pw = s == -INFINITY ? 0.0f : expf(s - nm);
			float c = expf(mx[j] - nm);
			sum[j] = sum[j] * c + warp_sum(pw);
#pragma unroll
			for (int e = 0; e < DPL; e++)
				acc[j][e] *= c;
			for (int kk = 0; kk < PF_KEYS; kk++) {
				float pk = __shfl_sync(0xffffffffu, pw, kk);
				if (pk == 0.0f)
					continue;
#pragma unroll
				for (int e = 0; e < DPL; e++) {
					uint32_t dd = lane + 32 * e;
					if (dd < D)
						acc[j][e] += pk * sv[kk * D + dd];
				}
			}
			mx[j] = nm;
		}
	}
#pragma unroll
	for (int j = 0; j < VPW; j++) {
		uint32_t v = w + 4 * j;
		if (v >= nv)
			break;
		uint32_t r = v / G, g = v % G;
		float *o = a.out + ((size_t)(r0 + r) * a.n_heads + kh * G + g) * D;
#pragma unroll
		for (int e = 0; e < DPL; e++) {
			uint32_t dd = lane + 32 * e;
			if (dd < D)
				o[dd] = acc[j][e] / sum[j];
		}
	}
}

/*
 * Keys per decode split: enough CTAs for about 8 per multiprocessor (the
 * kernel is bound by memory, and needs many bytes in flight), at least 64
 * keys each.
 */
static uint32_t decode_want(const cuda_dev *c, const kvt_attention_args *a)
{
	return div_up(8u * (uint32_t)c->n_sm, a->kv->n_kv_heads);
}

static uint32_t decode_splits(const cuda_dev *c, const kvt_attention_args *a, uint32_t *keys_per_split)
{
	uint32_t n_ctx = a->pos0 + 1 - attn_first_key(*a, a->pos0); /* keys in the window */
	uint32_t kps = div_up(n_ctx, decode_want(c, a));
	if (kps < 64)
		kps = 64;
	*keys_per_split = kps;
	return div_up(n_ctx, kps);
}

static bool decode_ok(const kvt_attention_args *a)
{
	uint32_t D = a->kv->head_dim, G = a->n_heads / a->kv->n_kv_heads;
	return a->n_rows == 1 && (D == 64 || D == 128 || D == 256) && G <= MAX_GROUP &&
	       ((uintptr_t)a->kv->pool % 16) == 0;
}

/*
 * The decode variant for each shape class, in one place: which kernel
 * (1, 2, 3), whether the combine is its own kernel or fused into the last
 * CTA of each head, and (kernel 2/3) whether a CTA stages its split's table
 * entries and 8-bit scales in shared memory. A call takes the last row for
 * its pool's kind (fp16 or 8-bit) whose min_ctx its context reaches (keys
 * in the window; under a graph, the bound the launch is sized for). The
 * attention op sees one sequence, so batch is not a key: bench_gpu times
 * every variant per batch x context class and bench/device_summary.py
 * prints the rows a GPU run says to write here. Until one has, every row is
 * the default measured on 2026-11-30 (kernel 1, separate combine).
 * KVT_CUDA_DECODE=1|2|3, KVT_CUDA_COMBINE=separate|fused and
 * KVT_CUDA_STAGE=0|1 override the table for every call (read at create).
 */
struct decode_choice {
	bool q8;          /* the row is for 8-bit pools (fp8, int8); else fp16 */
	uint32_t min_ctx; /* from this context up (rows of a kind in increasing order) */
	int version;      /* decode kernel 1, 2 or 3 */
	bool fused;       /* combine in the last CTA of each head; else attn_combine*_kernel */
	bool staged;      /* kernel 2/3: decode2_stage before each round of the key loop */
};
static const decode_choice decode_choices[] = {
	/* q8     from ctx  kernel fused  staged */
	{ false, 0, 1, false, false },
	{ false, 8192, 1, false, false },
	{ false, 32768, 1, false, false },
	{ true, 0, 1, false, false },
	{ true, 8192, 1, false, false },
	{ true, 32768, 1, false, false },
};

/* The variant of a decode call: decode_choices' row, then what the environment forces. */
static decode_choice decode_plan(const cuda_dev *c, const kvt_attention_args *a)
{
	const bool q8 = a->kv->codec != KVT_KV_CODEC_F16;
	const uint32_t n_ctx = a->pos0 + 1 - attn_first_key(*a, a->pos0);
	decode_choice p = { q8, 0, 1, false, false };
	for (const decode_choice &r : decode_choices)
		if (r.q8 == q8 && r.min_ctx <= n_ctx)
			p = r;
	if (c->decode_version)
		p.version = c->decode_version;
	if (c->decode_combine >= 0)
		p.fused = c->decode_combine == 1;
	if (c->decode_stage >= 0)
		p.staged = c->decode_stage == 1;
	if (a->kv->n_kv_heads > DECODE_TICKETS || !c->d_tickets)
		p.fused = false;
	return p;
}

/* Whether a decode call on a pool of a's kind can run on decode version v (the workspace is sized for each). */
static bool decode_may_use(const cuda_dev *c, const kvt_attention_args *a, int v)
{
	if (c->decode_version)
		return c->decode_version == v;
	for (const decode_choice &r : decode_choices)
		if (r.q8 == (a->kv->codec != KVT_KV_CODEC_F16) && r.version == v)
			return true;
	return false;
}

/*
 * Blocks a staged round takes (kernel 2/3): as many as STAGE_BYTES hold (a
 * block is one table entry, plus on 8-bit pools its K and V scales of one
 * KV head), no more than a split can take (most_bps), a multiple of 4; the
 * shared memory in *smem. 0: not staged (a block's scales too large).
 */
static uint32_t decode_stage_blocks(const cuda_dev *c, const kvt_attention_args *a, uint32_t most_bps, size_t *smem)
{
	const kvt_kv_layout *l = a->kv;
	const size_t per = 4 + (l->codec != KVT_KV_CODEC_F16
					? (size_t)8 * l->block_tokens * (l->head_dim / kvt_codec_group_dims(l->codec, l->head_dim))
					: 0);
	uint32_t sb = c->stage_blocks ? c->stage_blocks : (uint32_t)(STAGE_BYTES / per);
	const uint32_t cap = (most_bps + 3) / 4 * 4;
	sb = (sb < cap ? sb : cap) / 4 * 4;
	if (sb < 4 || sb * per > 48 * 1024)
		return 0;
	*smem = sb * per;
	return sb;
}

/*
 * Version 2's kernels by [head_dim 64/128/256][GMAX 1/2/3/4/8/16][variant]:
 * fp16 pools; 8-bit pools at 16 dims a lane up to a group of 4 query heads
 * (8 beyond, where 16 would not fit the accumulators in registers); 8-bit
 * pools at 8 dims a lane always. KVT_CUDA_DECODE=3 is version 2 with the
 * last variant for 8-bit pools: more lanes per key and fewer registers
 * (more CTAs per SM) against more shuffles per key; which wins is for a GPU
 * run to say (bench_gpu times both).
 */
typedef void (*decode2_fn)(kvt_kv_layout, kvt_attention_args, uint32_t, float *, decode_opts);
#define D2K(D, GM, Q8, DPL) attn_decode2_kernel<D, GM, Q8, DPL>
#define D2ROW(D)                                                                                              \
	{ { D2K(D, 1, false, 8), D2K(D, 1, true, 16), D2K(D, 1, true, 8) },                                  \
	  { D2K(D, 2, false, 8), D2K(D, 2, true, 16), D2K(D, 2, true, 8) },                                  \
	  { D2K(D, 3, false, 8), D2K(D, 3, true, 16), D2K(D, 3, true, 8) },                                  \
	  { D2K(D, 4, false, 8), D2K(D, 4, true, 16), D2K(D, 4, true, 8) },                                  \
	  { D2K(D, 8, false, 8), D2K(D, 8, true, 8), D2K(D, 8, true, 8) },                                   \
	  { D2K(D, 16, false, 8), D2K(D, 16, true, 8), D2K(D, 16, true, 8) } }
static const decode2_fn decode2_table[3][6][3] = { D2ROW(64), D2ROW(128), D2ROW(256) };
#undef D2K
/* the same kernels staging table entries and scales in shared memory (KVT_CUDA_STAGE=1, decode_choices) */
#define D2K(D, GM, Q8, DPL) attn_decode2_kernel<D, GM, Q8, DPL, true>
static const decode2_fn decode2s_table[3][6][3] = { D2ROW(64), D2ROW(128), D2ROW(256) };
#undef D2ROW
#undef D2K

/*
 * The kernel for a decode call (decode_ok) on decode version 2 or 3, staged
 * or not, and its CTAs per SM in *occ (asked once, then kept): the staged
 * kernel's splits are those of the unstaged one (its STAGE_BYTES do not bind
 * occupancy at 128 threads, 16 CTAs an SM at most), so the two agree bit for bit.
 */
static decode2_fn decode2_pick(cuda_dev *c, const kvt_attention_args *a, int version, bool staged, int *occ)
{
	const uint32_t D = a->kv->head_dim, G = a->n_heads / a->kv->n_kv_heads;
	const int di = D == 64 ? 0 : D == 128 ? 1 : 2;
	const int gi = G <= 4 ? (int)G - 1 : G <= 8 ? 4 : 5;
	/* 16 dims a lane of 8-bit codes is a 16-byte load: blocks must then be 16-byte multiples
	 * (not so when layers x KV heads x block tokens is odd); 8 dims need 8, which they always are */
	int qi = 0;
	if (a->kv->codec != KVT_KV_CODEC_F16)
		qi = version == 3 || kvt_kv_block_bytes(a->kv) % 16 ? 2 : 1;
	decode2_fn fn = decode2_table[di][gi][qi];
	int *slot = &c->decode2_occ[di][gi][qi];
	int o = __atomic_load_n(slot, __ATOMIC_RELAXED);
	if (!o) {
		if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, fn, 128, 0) != cudaSuccess || o < 1) {
			(void)cudaGetLastError();
			o = 1;
		}
		__atomic_store_n(slot, o, __ATOMIC_RELAXED);
	}
	*occ = o;
	return staged ? decode2s_table[di][gi][qi] : fn;
}

/* Version 2's splits: runs of whole blocks, as many as one wave of CTAs holds for each KV head. */
static uint32_t decode2_splits(cuda_dev *c, const kvt_attention_args *a, int version, uint32_t *blocks_per_split)
{
	int occ;
	decode2_pick(c, a, version, false, &occ);
	const uint32_t nb = div_up(a->pos0 + 1, a->kv->block_tokens) - attn_first_key(*a, a->pos0) / a->kv->block_tokens;
	const uint32_t per_head = div_up((uint64_t)occ * c->n_sm, a->kv->n_kv_heads);
	*blocks_per_split = div_up(nb, per_head);
	return div_up(nb, *blocks_per_split);
}

/* Sized for the most splits any context can take, so one workspace serves every length. */
static size_t cuda_attention_workspace(const kvt_dev *d, const kvt_attention_args *a)
{
	kvt_attention_args one = *a;
	one.n_rows = 1;
	if (!decode_ok(&one))
		return 0;
	uint32_t most = decode_may_use((const cuda_dev *)d, a, 1) ? decode_want((const cuda_dev *)d, a) : 0;
	for (int v = 2; v <= 3; v++)
		if (decode_may_use((const cuda_dev *)d, a, v)) {
			int occ;
			decode2_pick((cuda_dev *)d, &one, v, false, &occ);
			const uint32_t n = div_up((uint64_t)occ * ((const cuda_dev *)d)->n_sm, a->kv->n_kv_heads);
			most = n > most ? n : most;
		}
	return (size_t)most * a->n_heads * (a->kv->head_dim + 2) * sizeof(float);
}

template <int D, int G>
static void launch_decode(cudaStream_t st, const kvt_attention_args *a, uint32_t n_splits, uint32_t kps, float *ws,
			  decode_opts o)
{
	dim3 grid(a->kv->n_kv_heads, n_splits);
	if (a->kv->codec != KVT_KV_CODEC_F16)
		attn_decode_kernel<D, G, true><<<grid, 128, 0, st>>>(*a->kv, *a, kps, ws, o);
	else
		attn_decode_kernel<D, G, false><<<grid, 128, 0, st>>>(*a->kv, *a, kps, ws, o);
}

template <int D>
static bool launch_decode_g(cudaStream_t st, const kvt_attention_args *a, uint32_t n_splits, uint32_t kps, float *ws,
			    decode_opts o)
{
	switch (a->n_heads / a->kv->n_kv_heads) {
	case 1: launch_decode<D, 1>(st, a, n_splits, kps, ws, o); return true;
	case 2: launch_decode<D, 2>(st, a, n_splits, kps, ws, o); return true;
	case 3: launch_decode<D, 3>(st, a, n_splits, kps, ws, o); return true;
	case 4: launch_decode<D, 4>(st, a, n_splits, kps, ws, o); return true;
	case 5: launch_decode<D, 5>(st, a, n_splits, kps, ws, o); return true;
	case 6: launch_decode<D, 6>(st, a, n_splits, kps, ws, o); return true;
	case 7: launch_decode<D, 7>(st, a, n_splits, kps, ws, o); return true;
	case 8: launch_decode<D, 8>(st, a, n_splits, kps, ws, o); return true;
	case 16: launch_decode<D, 16>(st, a, n_splits, kps, ws, o); return true;
	}
	return false;
}

static int cuda_attention(kvt_dev *d, const kvt_attention_args *a, void *ws)
{
	cuda_dev *c = C(d);
	const uint32_t D = a->kv->head_dim, G = a->n_heads / a->kv->n_kv_heads;
	if (D > MAX_HEAD_DIM) {
		KVT_LOGE("cuda attention: head_dim %u over %d", D, MAX_HEAD_DIM);
		return KVT_EUNSUPPORTED;
	}
	const decode_choice p = decode_ok(a) ? decode_plan(c, a) : decode_choice{};
	if (decode_ok(a) && p.version >= 2) {
		int occ;
		uint32_t bps, n = decode2_splits(c, a, p.version, &bps);
		decode2_fn fn = decode2_pick(c, a, p.version, false, &occ);
		uint32_t most_bps = bps; /* blocks a split can take */
		if (a->d_pos0) { /* a graph: a wave's splits (or one per block of the bound), sized in the kernel */
			bps = div_up((uint64_t)occ * c->n_sm, a->kv->n_kv_heads);
			const uint32_t nb = div_up(a->pos0 + 1, a->kv->block_tokens);
			n = bps < nb ? bps : nb;
			most_bps = div_up(nb, bps);
		}
		decode_opts o = { p.fused ? c->d_tickets : NULL, 0 };
		size_t smem = 0;
		if (p.staged && (o.stage_blocks = decode_stage_blocks(c, a, most_bps, &smem)))
			fn = decode2_pick(c, a, p.version, true, &occ);
		if (o.tickets && n * sizeof(float) > smem)
			smem = n * sizeof(float); /* the combine's weights reuse the staging area */
		fn<<<dim3(a->kv->n_kv_heads, n), 128, smem, c->stream>>>(*a->kv, *a, bps, (float *)ws, o);
		int rc = LAUNCHED("attention decode (2/3)");
		if (rc || o.tickets)
			return rc;
		attn_combine2_kernel<<<a->n_heads, 128, n * sizeof(float), c->stream>>>((const float *)ws, a->out,
											 a->n_heads, D, n);
		return LAUNCHED("attention combine (2)");
	}
	if (decode_ok(a)) {
		uint32_t kps, n = decode_splits(c, a, &kps);
		if (a->d_pos0) { /* a graph: the most splits any length up to the bound takes, sized in the kernel */
			kps = decode_want(c, a);
			const uint32_t most = div_up(a->pos0 + 1, 64);
			n = kps < most ? kps : most;
		}
		const decode_opts o = { p.fused ? c->d_tickets : NULL, 0 };
		bool ok = D == 64 ? launch_decode_g<64>(c->stream, a, n, kps, (float *)ws, o)
			  : D == 128 ? launch_decode_g<128>(c->stream, a, n, kps, (float *)ws, o)
				     : launch_decode_g<256>(c->stream, a, n, kps, (float *)ws, o);
		if (ok) {
			int rc = LAUNCHED("attention decode");
			if (rc || o.tickets)
				return rc;
			attn_combine_kernel<<<a->n_heads, D < 128 ? 64 : 128, 0, c->stream>>>((const float *)ws, a->out,
											  a->n_heads, D, n);
			return LAUNCHED("attention combine");
		}
	}
	uint32_t qt = G >= PF_VECS ? 1 : PF_VECS / G;
	if (G > PF_VECS) {
		KVT_LOGE("cuda attention: %u query heads per KV head (at most %d)", G, PF_VECS);
		return KVT_EUNSUPPORTED;
	}
	size_t shm = ((size_t)PF_VECS * D + (size_t)PF_KEYS * (D + 1) + (size_t)PF_KEYS * D) * sizeof(float);
	dim3 grid(a->kv->n_kv_heads, div_up(a->n_rows, qt));
#define PF(DPL)                                                                                              \
	do {                                                                                                 \
		cudaFuncSetAttribute(attn_prefill_kernel<DPL>, cudaFuncAttributeMaxDynamicSharedMemorySize,   \
				     (int)shm);                                                              \
		attn_prefill_kernel<DPL><<<grid, 128, shm, c->stream>>>(*a->kv, *a, qt);                     \
	} while (0)
	if (D <= 32)
		PF(1);
	else if (D <= 64)
		PF(2);
	else if (D <= 128)
		PF(4);
	else
		PF(8);
#undef PF
	return LAUNCHED("attention prefill");
}

/* ---- block codecs ---- */

/* Slots of one launch travel by value in the kernel's parameters. */
#define CODEC_SLOTS 64
struct codec_slots {
	int32_t slot[CODEC_SLOTS];
};

/*
 * One warp per vector of head_dim values, one scale group after another.
 * Grid (vectors / 8, blocks); 8 warps. The packed block: codes[n_vec][D],
 * then fp32 scales[n_vec][ng] (ng = D / gd groups of gd values).
 */
__global__ void kv_pack_kernel(kvt_kv_layout l, int codec, codec_slots sl, uint8_t *dst, size_t packed,
			       uint32_t n_vec)
{
	uint32_t v = blockIdx.x * 8 + (threadIdx.x >> 5), b = blockIdx.y;
	int lane = threadIdx.x & 31;
	if (v >= n_vec)
		return; /* the whole warp: v is per warp */
	const uint32_t D = l.head_dim, gd = kvt_codec_group_dims(codec, D), ng = D / gd;
	const __half *src = (const __half *)l.pool + (size_t)sl.slot[b] * n_vec * D + (size_t)v * D;
	uint8_t *out = dst + b * packed;
	for (uint32_t g = 0; g < ng; g++) {
		float amax = 0.0f;
		for (uint32_t i = g * gd + lane; i < (g + 1) * gd; i += 32)
			amax = fmaxf(amax, fabsf(__half2float(src[i])));
		amax = warp_max(amax);
		float s, inv;
		kvt_codec_scales(amax, codec == KVT_KV_CODEC_FP8 ? KVT_FP8_MAX : KVT_INT8_MAX, &s, &inv);
		for (uint32_t i = g * gd + lane; i < (g + 1) * gd; i += 32) {
			float x = __half2float(src[i]) * inv;
			out[(size_t)v * D + i] = codec == KVT_KV_CODEC_FP8 ? kvt_fp8_e4m3_encode(x) : (uint8_t)kvt_int8_encode(x);
		}
		if (lane == 0)
			memcpy(out + (size_t)n_vec * D + ((size_t)v * ng + g) * 4, &s, 4);
	}
}

__global__ void kv_unpack_kernel(kvt_kv_layout l, int codec, codec_slots sl, const uint8_t *src, size_t packed,
				 uint32_t n_vec)
{
	uint32_t v = blockIdx.x * 8 + (threadIdx.x >> 5), b = blockIdx.y;
	int lane = threadIdx.x & 31;
	if (v >= n_vec)
		return;
	const uint32_t D = l.head_dim, gd = kvt_codec_group_dims(codec, D), ng = D / gd;
	__half *dst = (__half *)l.pool + (size_t)sl.slot[b] * n_vec * D + (size_t)v * D;
	const uint8_t *in = src + b * packed;
	for (uint32_t i = lane; i < D; i += 32) {
		float s;
		memcpy(&s, in + (size_t)n_vec * D + ((size_t)v * ng + i / gd) * 4, 4);
		uint8_t c = in[(size_t)v * D + i];
		float x = codec == KVT_KV_CODEC_FP8 ? kvt_fp8_e4m3_decode(c) : (float)(int8_t)c;
		dst[i] = __float2half_rn(x * s);
	}
}

/*
 * The vectorised codecs, for head_dim / 8 lanes per vector dividing a warp:
 * a thread converts 8 consecutive values (a 16-byte fp16 load, an 8-byte
 * code store), the lanes of a scale group (gd / 8 of them, aligned, a power
 * of two: 4 for INT8's 32 dims, all LPV for FP8) share amax by shuffles, and FP8 goes
 * through the hardware conversion (round to nearest even, saturating), which
 * gives the same bytes as kv_codec.h's software encoder. Threads past the
 * end still shuffle (masked stores), so every lane takes part.
 */
template <int LPV>
__global__ void kv_pack_fast(kvt_kv_layout l, int codec, codec_slots sl, uint8_t *dst, size_t packed,
			     uint32_t n_vec, uint32_t n_blocks)
{
	const uint32_t D = LPV * 8, gd = kvt_codec_group_dims(codec, D), lpg = gd / 8, ng = D / gd;
	const uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
	const uint64_t total = (uint64_t)n_blocks * n_vec * LPV;
	const bool live = t < total;
	const uint64_t tt = live ? t : 0;
	const uint32_t sub = (uint32_t)(tt % LPV);
	const uint64_t v = tt / LPV;
	const uint32_t b = (uint32_t)(v / n_vec), vi = (uint32_t)(v % n_vec);
	const __half *src = (const __half *)l.pool + ((size_t)sl.slot[b] * n_vec + vi) * D + sub * 8;
	uint4 raw = *(const uint4 *)src;
	const __half2 *h2 = (const __half2 *)&raw;
	float x[8], amax = 0.0f;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float2 f = __half22float2(h2[i]);
		x[2 * i] = f.x;
		x[2 * i + 1] = f.y;
		amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
	}
	/* xor offsets below lpg stay within the group's aligned run of lanes */
	for (uint32_t o = lpg / 2; o > 0; o >>= 1)
		amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, (int)o, LPV));
	float sc, inv;
	kvt_codec_scales(amax, codec == KVT_KV_CODEC_FP8 ? KVT_FP8_MAX : KVT_INT8_MAX, &sc, &inv);
	uint8_t c[8];
	if (codec == KVT_KV_CODEC_FP8) {
#pragma unroll
		for (int i = 0; i < 8; i += 2) {
			__nv_fp8x2_storage_t p2 = __nv_cvt_float2_to_fp8x2(make_float2(x[i] * inv, x[i + 1] * inv),
									   __NV_SATFINITE, __NV_E4M3);
			c[i] = (uint8_t)(p2 & 0xff);
			c[i + 1] = (uint8_t)(p2 >> 8);
		}
	} else {
#pragma unroll
		for (int i = 0; i < 8; i++) {
			int r = __float2int_rn(x[i] * inv);
			c[i] = (uint8_t)(int8_t)(r > 127 ? 127 : (r < -127 ? -127 : r));
		}
	}
	if (!live)
		return;
	uint8_t *out = dst + (size_t)b * packed;
	*(uint2 *)(out + (size_t)vi * D + sub * 8) = *(const uint2 *)c;
	if (sub % lpg == 0)
		memcpy(out + (size_t)n_vec * D + ((size_t)vi * ng + sub / lpg) * 4, &sc, 4);
}

template <int LPV>
__global__ void kv_unpack_fast(kvt_kv_layout l, int codec, codec_slots sl, const uint8_t *src, size_t packed,
			       uint32_t n_vec, uint32_t n_blocks)
{
	const uint32_t D = LPV * 8, gd = kvt_codec_group_dims(codec, D), ng = D / gd;
	const uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
	if (t >= (uint64_t)n_blocks * n_vec * LPV)
		return;
	const uint32_t sub = (uint32_t)(t % LPV);
	const uint64_t v = t / LPV;
	const uint32_t b = (uint32_t)(v / n_vec), vi = (uint32_t)(v % n_vec);
	const uint8_t *in = src + (size_t)b * packed;
	uint2 raw = *(const uint2 *)(in + (size_t)vi * D + sub * 8);
	float sc;
	memcpy(&sc, in + (size_t)n_vec * D + ((size_t)vi * ng + sub * 8 / gd) * 4, 4);
	const uint8_t *c = (const uint8_t *)&raw;
	__half2 o[4];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float2 f;
		if (codec == KVT_KV_CODEC_FP8)
			f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
				(__nv_fp8x2_storage_t)(c[2 * i] | (c[2 * i + 1] << 8)), __NV_E4M3)));
		else
			f = make_float2((float)(int8_t)c[2 * i], (float)(int8_t)c[2 * i + 1]);
		o[i] = __floats2half2_rn(f.x * sc, f.y * sc);
	}
	__half *dstp = (__half *)l.pool + ((size_t)sl.slot[b] * n_vec + vi) * D + sub * 8;
	*(uint4 *)dstp = *(const uint4 *)o;
}

static int codec_run(kvt_dev *d, kvt_stream *st, const kvt_kv_layout *l, int codec, uint32_t n_blocks,
		     const int32_t *slots, void *dst, const void *src, bool pack)
{
	cudaStream_t s = S(d, st);
	const size_t block_bytes = kvt_kv_block_bytes(l), packed = kvt_kv_packed_bytes(l, codec);
	const uint32_t n_vec = l->n_layers * 2 * l->n_kv_heads * l->block_tokens;
	if (codec == l->codec) { /* the records as they are */
		for (uint32_t b = 0; b < n_blocks; b++) {
			char *pool = (char *)l->pool + (size_t)slots[b] * block_bytes;
			int rc = pack ? CU(cudaMemcpyAsync((char *)dst + b * packed, pool, block_bytes,
							   cudaMemcpyDeviceToDevice, s))
				      : CU(cudaMemcpyAsync(pool, (const char *)src + b * packed, block_bytes,
							   cudaMemcpyDeviceToDevice, s));
			if (rc)
				return rc;
		}
		return KVT_OK;
	}
	for (uint32_t b0 = 0; b0 < n_blocks; b0 += CODEC_SLOTS) {
		uint32_t nb = n_blocks - b0 < CODEC_SLOTS ? n_blocks - b0 : CODEC_SLOTS;
		codec_slots sl;
		memcpy(sl.slot, slots + b0, nb * sizeof(int32_t));
		uint8_t *d8 = (uint8_t *)dst + b0 * packed;
		const uint8_t *s8 = (const uint8_t *)src + b0 * packed;
		const uint32_t lpv = l->head_dim / 8;
		const unsigned g = div_up((uint64_t)nb * n_vec * lpv, 256);
		const bool aligned = ((uintptr_t)l->pool % 16) == 0 && ((uintptr_t)(pack ? (const void *)d8 : s8) % 8) == 0 &&
				     packed % 8 == 0;
#define FAST(LPV)                                                                                        \
	do {                                                                                             \
		if (pack)                                                                                \
			kv_pack_fast<LPV><<<g, 256, 0, s>>>(*l, codec, sl, d8, packed, n_vec, nb);       \
		else                                                                                     \
			kv_unpack_fast<LPV><<<g, 256, 0, s>>>(*l, codec, sl, s8, packed, n_vec, nb);     \
	} while (0)
		if (aligned && l->head_dim == 64)
			FAST(8);
		else if (aligned && l->head_dim == 128)
			FAST(16);
		else if (aligned && l->head_dim == 256)
			FAST(32);
		else if (pack)
			kv_pack_kernel<<<dim3(div_up(n_vec, 8), nb), 256, 0, s>>>(*l, codec, sl, d8, packed, n_vec);
		else
			kv_unpack_kernel<<<dim3(div_up(n_vec, 8), nb), 256, 0, s>>>(*l, codec, sl, s8, packed, n_vec);
#undef FAST
		int rc = LAUNCHED(pack ? "kv_pack" : "kv_unpack");
		if (rc)
			return rc;
	}
	return KVT_OK;
}

static int cuda_kv_pack(kvt_dev *d, kvt_stream *s, const kvt_kv_pack_args *a)
{
	return codec_run(d, s, a->kv, a->codec, a->n_blocks, a->h_slots, a->dst, NULL, true);
}

static int cuda_kv_unpack(kvt_dev *d, kvt_stream *s, const kvt_kv_unpack_args *a)
{
	return codec_run(d, s, a->kv, a->codec, a->n_blocks, a->h_slots, NULL, a->src, false);
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

static int cuda_norm_matmul(kvt_dev *d, const kvt_norm_matmul_args *a, void *ws)
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

static int cuda_matmul_swiglu(kvt_dev *d, const kvt_matmul_swiglu_args *a, void *ws)
{
	if (a->w_dtype != KVT_DTYPE_F16 || a->n_rows > GEMV_MAX_ROWS)
		return KVT_DEV_COMPOSE;
	gemv_fused<true>(C(d)->stream, a->n_rows, (const __half *)a->w_gate, (const __half *)a->w_up, a->x, a->y,
			 a->norm_w, a->eps, a->n_in, a->n_out, false);
	return LAUNCHED("gemv gate+up (swiglu fused)");
}

/*
 * rope_kernel and kv_store_kernel in one: grid (rows, query heads + KV
 * heads). A query head's CTA rotates it; a KV head's rotates K, writes it
 * back (as rope leaves it) and stores K and V in the fp16 pool.
 */
__global__ void rope_store_kernel(kvt_kv_layout l, kvt_rope_store_args a, float theta_scale)
{
	const uint32_t m = blockIdx.x, nq = a.q ? a.n_heads : 0, D = l.head_dim, pairs = a.n_rot / 2;
	const bool is_q = blockIdx.y < nq;
	const uint32_t h = is_q ? blockIdx.y : blockIdx.y - nq;
	float *x = is_q ? a.q + ((size_t)m * a.n_heads + h) * D : a.k + ((size_t)m * l.n_kv_heads + h) * D;
	__half *pool = (__half *)l.pool;
	size_t ko = 0, vo = 0;
	if (!is_q) {
		const uint32_t pos = pos0_of(a.st.d_pos0, a.st.pos0) + m;
		const int32_t slot = a.st.block_table[pos / l.block_tokens];
		ko = kv_off(l, slot, a.st.layer, 0, h, pos % l.block_tokens);
		vo = kv_off(l, slot, a.st.layer, 1, h, pos % l.block_tokens);
	}
	for (uint32_t i = threadIdx.x; i < pairs; i += blockDim.x) {
		float theta = (float)a.pos[m];
		for (uint32_t j = 0; j < i; j++)
			theta *= theta_scale;
		float c, s;
		sincosf(theta, &s, &c);
		const float x0 = x[2 * i], x1 = x[2 * i + 1];
		const float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
		x[2 * i] = r0;
		x[2 * i + 1] = r1;
		if (!is_q) {
			pool[ko + 2 * i] = __float2half_rn(r0);
			pool[ko + 2 * i + 1] = __float2half_rn(r1);
		}
	}
	if (is_q)
		return;
	const float *v = a.st.v + ((size_t)m * l.n_kv_heads + h) * D;
	for (uint32_t i = a.n_rot + threadIdx.x; i < D; i += blockDim.x)
		pool[ko + i] = __float2half_rn(x[i]);
	for (uint32_t i = threadIdx.x; i < D; i += blockDim.x)
		pool[vo + i] = __float2half_rn(v[i]);
}

static int cuda_rope_store(kvt_dev *d, const kvt_rope_store_args *a)
{
	const kvt_kv_layout *l = a->st.kv;
	if (l->codec != KVT_KV_CODEC_F16)
		return KVT_DEV_COMPOSE; /* 8-bit pools: rope, rope, kv_store (the store's amax is per vector) */
	const float theta_scale = powf(a->freq_base, -2.0f / (float)a->n_rot);
	dim3 grid(a->st.n_rows, (a->q ? a->n_heads : 0) + l->n_kv_heads);
	rope_store_kernel<<<grid, 64, 0, C(d)->stream>>>(*l, *a, theta_scale);
	return LAUNCHED("rope + kv_store");
}

/* ---- graphs ---- */

static int cuda_capture_begin(kvt_dev *d)
{
	cuda_dev *c = C(d);
	if (c->capturing) {
		KVT_LOGE("dev.capture_begin: a capture is already in progress");
		return KVT_EINVAL;
	}
	/* thread-local: other threads may go on allocating and copying on their own streams */
	int rc = CU(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
	if (rc)
		return rc;
	memset(&c->cap, 0, sizeof c->cap);
	c->capturing = true;
	c->capture_bad = false;
	return KVT_OK;
}

static int cuda_capture_end(kvt_dev *d, kvt_graph **out)
{
	cuda_dev *c = C(d);
	if (!c->capturing) {
		KVT_LOGE("dev.capture_end: no capture in progress");
		return KVT_EINVAL;
	}
	c->capturing = false;
	cudaGraph_t graph = NULL;
	int rc = CU(cudaStreamEndCapture(c->stream, &graph));
	if (!rc && c->capture_bad) {
		KVT_LOGE("dev.capture_end: an op refused during the capture (above); no graph");
		rc = KVT_EINVAL;
	}
	kvt_graph *g = NULL;
	if (!rc && !(g = (kvt_graph *)calloc(1, sizeof *g)))
		rc = KVT_ENOMEM;
	if (!rc) {
		*g = c->cap;
		g->graph = graph;
		rc = CU(cudaGraphInstantiate(&g->exec, graph, 0));
	}
	if (rc) {
		if (graph)
			cudaGraphDestroy(graph);
		free(g);
		return rc;
	}
	*out = g;
	return KVT_OK;
}

static int cuda_graph_launch(kvt_dev *d, kvt_graph *g)
{
	cuda_dev *c = C(d);
	if (c->capturing) {
		KVT_LOGE("dev.graph_launch: not while capturing");
		return KVT_EINVAL;
	}
	KVT_DEV_COUNT(d, graph_launches, 1);
	KVT_DEV_COUNT(d, graph_kernels, g->n_kernels);
	KVT_DEV_COUNT(d, copies, g->n_copies);
	KVT_DEV_COUNT(d, h2d_bytes, g->h2d);
	KVT_DEV_COUNT(d, d2h_bytes, g->d2h);
	KVT_DEV_COUNT(d, d2d_bytes, g->d2d);
	return CU(cudaGraphLaunch(g->exec, c->stream));
}

static void cuda_graph_destroy(kvt_dev *d, kvt_graph *g)
{
	CU(cudaGraphExecDestroy(g->exec));
	CU(cudaGraphDestroy(g->graph));
	free(g);
}

static const struct kvt_dev_ops cuda_ops = {
	.name = "cuda",
	.destroy = cuda_destroy,
	.supports_dtype = cuda_supports_dtype,
	.alloc = cuda_alloc,
	.free = cuda_free,
	.copy_h2d = cuda_copy_h2d,
	.copy_d2h = cuda_copy_d2h,
	.copy_d2d = cuda_copy_d2d,
	.sync = cuda_sync,
	.matmul_workspace = cuda_matmul_workspace,
	.matmul = cuda_matmul,
	.rmsnorm = cuda_rmsnorm,
	.rope = cuda_rope,
	.swiglu = cuda_swiglu,
	.add = cuda_add,
	.embed = cuda_embed,
	.kv_store = cuda_kv_store,
	.attention_workspace = cuda_attention_workspace,
	.attention = cuda_attention,
	.argmax = cuda_argmax,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.stream_create = cuda_stream_create,
	.stream_destroy = cuda_stream_destroy,
	.stream_sync = cuda_stream_sync,
	.event_create = cuda_event_create,
	.event_destroy = cuda_event_destroy,
	.event_record = cuda_event_record,
	.stream_wait_event = cuda_stream_wait_event,
	.event_sync = cuda_event_sync,
	.event_done = cuda_event_done,
	.copy_async = cuda_copy_async,
	.kv_pack = cuda_kv_pack,
	.kv_unpack = cuda_kv_unpack,
	.sample_workspace = cuda_sample_workspace,
	.sample = cuda_sample,
	.capture_begin = cuda_capture_begin,
	.capture_end = cuda_capture_end,
	.graph_launch = cuda_graph_launch,
	.graph_destroy = cuda_graph_destroy,
	.norm_matmul = cuda_norm_matmul,
	.matmul_swiglu = cuda_matmul_swiglu,
	.rope_store = cuda_rope_store,
	.copy_2d_async = cuda_copy_2d_async,
};

extern "C" int kvt_dev_cuda_create(const kvt_dev_config *cfg, kvt_dev **out)
{
	const bool asked = cfg->kind == KVT_DEV_CUDA; /* auto falls back quietly */
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		(void)cudaGetLastError();
		if (asked)
			KVT_LOGE("device cuda: no usable GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		return KVT_EDEVICE;
	}
	cuda_dev *c = (cuda_dev *)calloc(1, sizeof *c);
	if (!c)
		return KVT_ENOMEM;
	c->base.ops = &cuda_ops;
	c->base.kind = KVT_DEV_CUDA;
	c->base.n_threads = 1;
	c->device = 0;
	cudaDeviceProp prop;
	int rc = CU(cudaSetDevice(c->device));
	if (!rc)
		rc = CU(cudaGetDeviceProperties(&prop, c->device));
	if (!rc)
		rc = CU(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
	if (!rc && cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
		KVT_LOGE("device cuda: cuBLAS did not initialise");
		rc = KVT_EDEVICE;
	}
	if (!rc && cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS)
		rc = KVT_EDEVICE;
	if (!rc)
		cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH); /* no TF32 for the fp32 path */
	if (!rc)
		rc = CU(cudaMalloc((void **)&c->d_flag, sizeof(int32_t)));
	if (!rc)
		rc = CU(cudaMalloc((void **)&c->d_tickets, DECODE_TICKETS * sizeof(uint32_t)));
	if (!rc)
		rc = CU(cudaMemset(c->d_tickets, 0, DECODE_TICKETS * sizeof(uint32_t)));
	if (!rc)
		rc = CU(cudaDeviceSynchronize()); /* the counters are zero before any decode reads them */
	if (rc) {
		cuda_destroy(&c->base);
		return rc;
	}
	c->n_sm = prop.multiProcessorCount;
	const char *dv = getenv("KVT_CUDA_DECODE");
	c->decode_version = 0; /* decode_choices' */
	if (dv && (strcmp(dv, "1") == 0 || strcmp(dv, "2") == 0 || strcmp(dv, "3") == 0))
		c->decode_version = dv[0] - '0';
	else if (dv && *dv)
		KVT_LOGW("KVT_CUDA_DECODE=%s: not 1, 2 or 3; using the table's decode kernels", dv);
	const char *dc = getenv("KVT_CUDA_COMBINE");
	c->decode_combine = -1;
	if (dc && (strcmp(dc, "fused") == 0 || strcmp(dc, "separate") == 0))
		c->decode_combine = dc[0] == 'f';
	else if (dc && *dc)
		KVT_LOGW("KVT_CUDA_COMBINE=%s: not fused or separate; using the table's", dc);
	const char *ds = getenv("KVT_CUDA_STAGE");
	c->decode_stage = -1;
	if (ds && (strcmp(ds, "0") == 0 || strcmp(ds, "1") == 0))
		c->decode_stage = ds[0] == '1';
	else if (ds && *ds)
		KVT_LOGW("KVT_CUDA_STAGE=%s: not 0 or 1; using the table's", ds);
	const char *sbk = getenv("KVT_CUDA_STAGE_BLOCKS"); /* tests: small rounds to cover the rounds */
	c->stage_blocks = sbk && atol(sbk) > 0 ? (uint32_t)atol(sbk) : 0;
	const char *qt = getenv("KVT_CUDA_QTILE"); /* tests: small tiles to cover the tiling */
	c->qtile_elems = qt && atol(qt) > 0 ? (uint32_t)atol(qt) : QTILE_ELEMS;
	snprintf(c->base.name, sizeof c->base.name, "cuda (%.48s, sm_%d%d, %.0f GiB)", prop.name, prop.major,
		 prop.minor, (double)prop.totalGlobalMem / (1u << 30));
	*out = &c->base;
	return KVT_OK;
}
