/*
 * gpu/cuda/cuda_int.cuh — the CUDA backend's shared internals: the device
 * object, error mapping (CU, LAUNCHED), launch and copy counters, the
 * reductions, the decoding of quantized weights and of the paged KV layout
 * that more than one op family uses, and the backend's ops (kvt_cuda_*),
 * one file per family:
 *
 *   cuda_mem.cu     memory, copies, streams, events, graphs
 *   cuda_matmul.cu  matmul (fp32, fp16 and kept quantized weights) in one
 *                   batch-invariant kernel, the fused RMSNorm+matmul and
 *                   gate+up+SwiGLU
 *   cuda_rows.cu    RMSNorm, RoPE, SwiGLU, add, embedding
 *   cuda_kv.cu      K/V stores into the paged pool and loads out of it,
 *                   fused RoPE + store
 *   cuda_attn.cu    paged attention: prefill, the decode kernels, combines,
 *                   decode_choices
 *   cuda_codec.cu   block codecs: pack/unpack between T0 and FP8/INT8
 *   cuda_sample.cu  argmax and top-k/top-p sampling
 *   cuda_ops.cu     the ops table and kvt_dev_cuda_create
 *
 * The backend is the product: every op of dev.h on the GPU, tested op by op
 * against the CPU reference (tests/test_gpu_parity.c, on a GPU and on the
 * CPU emulator, tests/cuemu).
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
 * Linkage. Each .cu is its own translation unit, compiled without
 * relocatable device code: what two files share is here, as inline or
 * static inline functions and templates (a kernel is defined in the one
 * file that launches it). Only the kvt_cuda_* ops cross files.
 *
 * NOTE: the emulator build (tests/cuemu) rewrites this header as it does
 * the .cu files (launches, shared-memory declarations), so what it may hold
 * is the same; a comment must not name the shared-memory qualifier either.
 */
#ifndef KVT_CUDA_INT_CUH
#define KVT_CUDA_INT_CUH
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

#define DECODE_TICKETS 1024 /* KV heads the fused combine counts CTAs for (more: the combine kernel) */

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

static inline cuda_dev *C(kvt_dev *d) { return (cuda_dev *)d; }
static inline cudaStream_t S(kvt_dev *d, kvt_stream *s) { return s ? s->s : C(d)->stream; }

static inline bool is_sticky(cudaError_t e)
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
static inline int cu_check(cudaError_t e, const char *what, const char *file, int line)
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
static inline void count_launch(kvt_dev *d)
{
	cuda_dev *c = (cuda_dev *)d;
	if (c->capturing)
		c->cap.n_kernels++;
	else
		KVT_DEV_COUNT(d, kernel_launches, 1);
}

static inline int launched(kvt_dev *d, const char *what, const char *file, int line)
{
	count_launch(d);
	return cu_check(cudaGetLastError(), what, file, line);
}
#define LAUNCHED(what) launched(d, what, __FILE__, __LINE__)

/* An op that waits on the host cannot be captured: refuse it and fail the capture. */
static inline int no_wait_in_capture(kvt_dev *d, const char *op)
{
	cuda_dev *c = (cuda_dev *)d;
	if (!c->capturing)
		return KVT_OK;
	c->capture_bad = true;
	KVT_LOGE("dev.%s: waits on the host, which a graph capture cannot hold", op);
	return KVT_EINVAL;
}

static inline int host_wait(kvt_dev *d, cudaStream_t st)
{
	KVT_DEV_COUNT(d, host_syncs, 1);
	return CU(cudaStreamSynchronize(st));
}

/* Count a copy of n bytes in direction dir (enum kvt_copy_dir) on stream st. */
static inline void count_copy(kvt_dev *d, cudaStream_t st, int dir, size_t n)
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

static inline int blas_check(cublasStatus_t st, const char *what)
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

static inline unsigned div_up(uint64_t a, uint64_t b) { return (unsigned)((a + b - 1) / b); }

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

__device__ inline float block_sum(float v, float *sh) { return block_reduce<false>(v, sh); }
__device__ inline float block_max(float v, float *sh) { return block_reduce<true>(v, sh); }

/*
 * 1 / sqrt(mean(x^2) + eps) over a row of n floats, reduced by the whole CTA
 * (every thread calls it; sh: 32 floats of shared memory) in one order fixed
 * by n and the CTA size: rmsnorm_kernel's and the fused matmuls' (256
 * threads both), so a fused RMSNorm gives the plain op's bits.
 */
__device__ __forceinline__ float rms_inv(const float *xr, uint32_t n, float eps, float *sh)
{
	float ss = 0.0f;
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		ss = fmaf(xr[i], xr[i], ss);
	ss = block_sum(ss, sh);
	return 1.0f / sqrtf(ss / (float)n + eps);
}

/* ---- block-quantized weights: Q5_0 and the K-quants (layouts in dev.h) ---- */

__device__ __forceinline__ float ld_half(const uint8_t *p)
{
	__half_raw r;
	r.x = (unsigned short)(p[0] | p[1] << 8);
	return __half2float(__half(r));
}

/* Q4_K/Q5_K sub-block s's 6-bit scale and min (cpu_int.h's kq_scale_min). */
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
			w[i] = q41 ? fmaf(d, (float)q, m) : d * (float)(q - 8); /* as cpu_ref.c (built with FMA contraction) */
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

/* ---- the ops (dev_impl.h's table, filled in cuda_ops.cu), by file ---- */

/* cuda_mem.cu */
void kvt_cuda_destroy(kvt_dev *d);
bool kvt_cuda_supports_dtype(const kvt_dev *d, int dtype);
int kvt_cuda_alloc(kvt_dev *d, size_t n, void **out);
void kvt_cuda_free(kvt_dev *d, void *p);
int kvt_cuda_copy_h2d(kvt_dev *d, void *dst, const void *src, size_t n);
int kvt_cuda_copy_d2h(kvt_dev *d, void *dst, const void *src, size_t n);
int kvt_cuda_copy_d2d(kvt_dev *d, void *dst, const void *src, size_t n);
int kvt_cuda_sync(kvt_dev *d);
int kvt_cuda_host_alloc(kvt_dev *d, size_t n, void **out);
void kvt_cuda_host_free(kvt_dev *d, void *p);
int kvt_cuda_stream_create(kvt_dev *d, kvt_stream **out);
void kvt_cuda_stream_destroy(kvt_dev *d, kvt_stream *s);
int kvt_cuda_stream_sync(kvt_dev *d, kvt_stream *s);
int kvt_cuda_event_create(kvt_dev *d, kvt_event **out);
void kvt_cuda_event_destroy(kvt_dev *d, kvt_event *e);
int kvt_cuda_event_record(kvt_dev *d, kvt_event *e, kvt_stream *s);
int kvt_cuda_stream_wait_event(kvt_dev *d, kvt_stream *s, kvt_event *e);
int kvt_cuda_event_sync(kvt_dev *d, kvt_event *e);
bool kvt_cuda_event_done(kvt_dev *d, kvt_event *e);
int kvt_cuda_copy_async(kvt_dev *d, kvt_stream *s, void *dst, const void *src, size_t n, int dir);
int kvt_cuda_copy_2d_async(kvt_dev *d, kvt_stream *s, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
			   size_t row_bytes, size_t n_rows, int dir);
int kvt_cuda_capture_begin(kvt_dev *d);
int kvt_cuda_capture_end(kvt_dev *d, kvt_graph **out);
int kvt_cuda_graph_launch(kvt_dev *d, kvt_graph *g);
void kvt_cuda_graph_destroy(kvt_dev *d, kvt_graph *g);

/* cuda_matmul.cu */
size_t kvt_cuda_matmul_workspace(const kvt_dev *d, const kvt_matmul_args *a);
int kvt_cuda_matmul(kvt_dev *d, const kvt_matmul_args *a, void *ws);
int kvt_cuda_norm_matmul(kvt_dev *d, const kvt_norm_matmul_args *a, void *ws);
int kvt_cuda_matmul_swiglu(kvt_dev *d, const kvt_matmul_swiglu_args *a, void *ws);

/* cuda_rows.cu */
int kvt_cuda_rmsnorm(kvt_dev *d, const kvt_rmsnorm_args *a);
int kvt_cuda_rope(kvt_dev *d, const kvt_rope_args *a);
int kvt_cuda_swiglu(kvt_dev *d, const kvt_swiglu_args *a);
int kvt_cuda_add(kvt_dev *d, const kvt_add_args *a);
int kvt_cuda_embed(kvt_dev *d, const kvt_embed_args *a);

/* cuda_kv.cu */
int kvt_cuda_kv_store(kvt_dev *d, const kvt_kv_store_args *a);
int kvt_cuda_kv_load(kvt_dev *d, const kvt_kv_load_args *a);
int kvt_cuda_rope_store(kvt_dev *d, const kvt_rope_store_args *a);

/* cuda_attn.cu */
size_t kvt_cuda_attention_workspace(const kvt_dev *d, const kvt_attention_args *a);
int kvt_cuda_attention(kvt_dev *d, const kvt_attention_args *a, void *ws);

/* cuda_codec.cu */
int kvt_cuda_kv_pack(kvt_dev *d, kvt_stream *s, const kvt_kv_pack_args *a);
int kvt_cuda_kv_unpack(kvt_dev *d, kvt_stream *s, const kvt_kv_unpack_args *a);

/* cuda_sample.cu */
int kvt_cuda_argmax(kvt_dev *d, const kvt_argmax_args *a);
size_t kvt_cuda_sample_workspace(const kvt_dev *d, const kvt_sample_args *a);
int kvt_cuda_sample(kvt_dev *d, const kvt_sample_args *a, void *ws);

#endif
