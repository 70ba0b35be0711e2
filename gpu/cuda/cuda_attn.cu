/*
 * gpu/cuda/cuda_attn.cu — paged causal GQA attention on the CUDA backend.
 *
 *   - every call by default (prefill and decode): the order-invariant
 *     chunked kernel (attn_prefill_kernel, attention_chunked). A CTA takes a
 *     tile of query rows of one KV head, stages 32 keys at a time in shared
 *     memory and runs an online softmax per query vector (one warp per
 *     vector, a lane per key) over each chunk of ATTN_CHUNK absolute
 *     positions, merging the chunks in position order. A decode (one row)
 *     runs a CTA per chunk and attn_fold_kernel merges their partials in the
 *     same order with the same arithmetic.
 *   - decode kernels 1-3 (KVT_CUDA_DECODE=1|2|3 only: bench comparisons):
 *     flash-decoding. The keys of each KV head are split into chunks across
 *     CTAs, as many as the SMs (and the kernel's occupancy) suggest; within a
 *     CTA each group of lanes owns one key at a time (head_dim / 8 lanes,
 *     16-byte loads) and keeps its own online softmax for every query head of
 *     the GQA group, so K and V are read once per KV head. A second kernel
 *     merges the chunks, or the last CTA of each head does (the fused
 *     combine, counted by d_tickets). Kernel 1 splits by keys; kernels 2 and
 *     3 by whole blocks, optionally staging table entries and 8-bit scales in
 *     shared memory.
 *
 * Invariants. The order rule of dev_impl.h holds on the default path: a
 * query row's keys are summed in steps fixed by absolute position (tiles of
 * 32 inside chunks of ATTN_CHUNK, chunks merged in order), so the row's
 * output is the same bits in a prompt of any chunk size, alone or with
 * other rows, and in a decode step, on any GPU (test_gpu_invariant). Kernels
 * 1-3 do not keep it (their splits follow the SM count). Among those, every
 * variant of a call gives the same result bit for bit when the plan changes
 * only the combine or the staging (the splits are the same), which
 * tests/test_gpu_parity.c checks per variant.
 */
#include "cuda_int.cuh"

#define MAX_HEAD_DIM 256
#define MAX_GROUP 16 /* query heads per KV head the decode kernel keeps in registers */
#define STAGE_BYTES 8192 /* shared memory a staged decode CTA takes for table entries and scales */

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
 * The order-invariant attention (every prefill, and decode unless
 * KVT_CUDA_DECODE forces one of the split kernels above). Grid (n_kv_heads,
 * row tiles, chunks); 4 warps. The CTA's query vectors are QT rows x G heads
 * (at most 32), staged in shared memory; key tiles of 32 are staged as fp32.
 * Warp w owns query vectors w, w + 4, ...; within a warp lane j scores key j
 * of the tile, then lanes split the dimensions for the weighted sum of V.
 *
 * Order rule (dev_impl.h): a query vector's keys are cut into chunks of
 * ATTN_CHUNK absolute positions (chunk c: [c * ATTN_CHUNK, (c + 1) *
 * ATTN_CHUNK)) and each chunk into tiles of PF_KEYS positions, both aligned
 * to absolute positions. Each chunk is an online softmax of its own over its
 * tiles in position order (pf_tile_step, which skips a tile with no key
 * the vector sees), and the chunks' partials { max, sum, acc } are merged in
 * chunk order by pf_fold. Prefill (SPLIT false) runs a tile of rows through
 * every chunk in one CTA and merges as it goes; decode (SPLIT, one row) runs
 * one chunk a CTA (grid z), writes each partial to ws ([chunk][query head]
 * { max, sum, acc[D] }), and attn_fold_kernel merges them with the same
 * pf_fold in the same order. Nothing depends on the other rows of the call,
 * the row tile, the chunk of the prompt or the number of SMs, so a row gives
 * the same bits in a prompt of any chunk size and in a decode step. Sums use
 * explicit fmaf, so no compiler contraction choice differs between the
 * instantiations.
 */
#define PF_KEYS 32
#define PF_VECS 32
#define ATTN_CHUNK 256 /* positions per chunk (a multiple of PF_KEYS) */

/* Stage key tile [t0, t0 + PF_KEYS) of KV head kh as fp32: K in sk ([key][D + 1]), V in sv; keys past last are 0. */
__device__ __forceinline__ void pf_load_tile(const kvt_kv_layout &l, const kvt_attention_args &a, uint32_t kh,
					     uint32_t t0, uint32_t last, float *sk, float *sv)
{
	const uint32_t D = l.head_dim, bt = l.block_tokens;
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
}

/*
 * One query vector (qv, at position pos, first visible key first) over the
 * staged tile from t0: the online-softmax step of the order rule (whole warp;
 * lane j scores key t0 + j, lane l keeps dims l, l + 32, ... of acc).
 */
template <int DPL>
__device__ __forceinline__ void pf_tile_step(const float *qv, const float *sk, const float *sv, uint32_t D,
					     uint32_t t0, uint32_t pos, uint32_t first, int lane, float &mx, float &sum,
					     float (&acc)[DPL])
{
	const uint32_t p = t0 + lane;
	float s = -INFINITY;
	if (p <= pos && p >= first) {
		s = 0.0f;
		const float *kv = sk + lane * (D + 1);
		for (uint32_t dd = 0; dd < D; dd++)
			s = fmaf(qv[dd], kv[dd], s);
	}
	const float tm = warp_max(s);
	if (tm == -INFINITY)
		return; /* no visible key in this tile for this vector (uniform over the warp) */
	const float nm = fmaxf(mx, tm);
	const float pw = s == -INFINITY ? 0.0f : expf(s - nm);
	const float c = expf(mx - nm);
	sum = fmaf(sum, c, warp_sum(pw));
#pragma unroll
	for (int e = 0; e < DPL; e++)
		acc[e] *= c;
	for (int kk = 0; kk < PF_KEYS; kk++) {
		const float pk = __shfl_sync(0xffffffffu, pw, kk);
		if (pk == 0.0f)
			continue;
#pragma unroll
		for (int e = 0; e < DPL; e++) {
			const uint32_t dd = lane + 32 * e;
			if (dd < D)
				acc[e] = fmaf(pk, sv[kk * D + dd], acc[e]);
		}
	}
	mx = nm;
}

/*
 * Merge a chunk's partial (max m, sum l) into the running (M, L): the
 * weights of the running values (*cM) and of the chunk's (*cm); false when
 * the chunk saw no key (m = -inf: nothing to merge). Then every value v of
 * the running state R becomes pf_merge(R, cM, v, cm). Prefill and
 * attn_fold_kernel both merge with these two, chunk by chunk in order.
 */
__device__ __forceinline__ bool pf_fold(float &M, float &L, float m, float l, float *cM, float *cm)
{
	if (m == -INFINITY)
		return false;
	const float nM = fmaxf(M, m);
	*cM = expf(M - nM); /* 0 for the first chunk (M = -inf) */
	*cm = expf(m - nM);
	L = fmaf(L, *cM, l * *cm);
	M = nM;
	return true;
}

__device__ __forceinline__ float pf_merge(float r, float cr, float v, float cv) { return fmaf(r, cr, v * cv); }

/* The chunks [*c0, *c1) a tile of rows from r0 (last: its last position) visits; SPLIT: chunk blockIdx.z of them only. */
template <bool SPLIT>
__device__ __forceinline__ bool pf_chunks(const kvt_attention_args &a, uint32_t first_pos, uint32_t last,
					  uint32_t *c0, uint32_t *c1)
{
	*c0 = attn_first_key(a, first_pos) / ATTN_CHUNK;
	*c1 = last / ATTN_CHUNK + 1;
	if (SPLIT) {
		*c0 += blockIdx.z;
		if (*c0 >= *c1)
			return false; /* a graph's launch sized for a longer context */
		*c1 = *c0 + 1;
	}
	return true;
}

template <int DPL, bool SPLIT> /* dims per lane: head_dim / 32, rounded up; SPLIT: one row, one chunk a CTA */
__global__ void __launch_bounds__(128) attn_prefill_kernel(kvt_kv_layout l, kvt_attention_args a, uint32_t qt,
							   float *ws)
{
	constexpr int VPW = PF_VECS / 4; /* query vectors per warp, at most */
	extern __shared__ float shm[];
	const uint32_t D = l.head_dim, G = a.n_heads / l.n_kv_heads;
	const uint32_t kh = blockIdx.x, r0 = blockIdx.y * qt;
	const uint32_t rows = min(qt, a.n_rows - r0), nv = rows * G;
	const uint32_t pos0 = pos0_of(a.d_pos0, a.pos0);
	const uint32_t last = pos0 + r0 + rows - 1; /* the tile's last visible key */
	uint32_t c0, c1;
	if (!pf_chunks<SPLIT>(a, pos0 + r0, last, &c0, &c1))
		return; /* uniform over the CTA */
	float *sq = shm;                     /* [PF_VECS][D] */
	float *sk = sq + PF_VECS * D;        /* [PF_KEYS][D + 1] */
	float *sv = sk + PF_KEYS * (D + 1);  /* [PF_KEYS][D] */
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;

	for (uint32_t i = threadIdx.x; i < nv * D; i += blockDim.x) {
		uint32_t v = i / D, dd = i % D, r = v / G, g = v % G;
		sq[i] = a.q[((size_t)(r0 + r) * a.n_heads + kh * G + g) * D + dd] * a.scale;
	}
	float RM[VPW], RL[VPW], RA[VPW][DPL]; /* the running merge of the chunks so far */
#pragma unroll
	for (int j = 0; j < VPW; j++) {
		RM[j] = -INFINITY;
		RL[j] = 0.0f;
#pragma unroll
		for (int e = 0; e < DPL; e++)
			RA[j][e] = 0.0f;
	}
	/* the tile's first visible key (its first row's window start), rounded down to a key tile */
	const uint32_t t_first = attn_first_key(a, pos0 + r0) / PF_KEYS * PF_KEYS;
	for (uint32_t c = c0; c < c1; c++) {
		float mx[VPW], sum[VPW], acc[VPW][DPL];
#pragma unroll
		for (int j = 0; j < VPW; j++) {
			mx[j] = -INFINITY;
			sum[j] = 0.0f;
#pragma unroll
			for (int e = 0; e < DPL; e++)
				acc[j][e] = 0.0f;
		}
		const uint32_t t_end = min((c + 1) * ATTN_CHUNK - 1, last);
		for (uint32_t t0 = max(c * ATTN_CHUNK, t_first); t0 <= t_end; t0 += PF_KEYS) {
			__syncthreads(); /* the last tile's readers (and the q staging) are done */
			pf_load_tile(l, a, kh, t0, last, sk, sv);
			__syncthreads();
#pragma unroll
			for (int j = 0; j < VPW; j++) {
				const uint32_t v = w + 4 * j, pos = pos0 + r0 + v / G;
				if (v >= nv)
					break;
				pf_tile_step<DPL>(sq + v * D, sk, sv, D, t0, pos, attn_first_key(a, pos), lane, mx[j], sum[j],
						  acc[j]);
			}
		}
#pragma unroll
		for (int j = 0; j < VPW; j++) {
			const uint32_t v = w + 4 * j;
			if (v >= nv)
				break;
			if (SPLIT) { /* one row: v is the query head's index in the KV head's group */
				float *p = ws + ((size_t)blockIdx.z * a.n_heads + kh * G + v) * (D + 2);
				if (lane == 0)
					p[0] = mx[j], p[1] = sum[j];
#pragma unroll
				for (int e = 0; e < DPL; e++)
					if (lane + 32 * e < (int)D)
						p[2 + lane + 32 * e] = acc[j][e];
				continue;
			}
			float cM, cm;
			if (pf_fold(RM[j], RL[j], mx[j], sum[j], &cM, &cm))
#pragma unroll
				for (int e = 0; e < DPL; e++)
					RA[j][e] = pf_merge(RA[j][e], cM, acc[j][e], cm);
		}
	}
#pragma unroll
	for (int j = 0; j < VPW; j++) {
		const uint32_t v = w + 4 * j;
		if (SPLIT || v >= nv)
			break;
		const uint32_t r = v / G, g = v % G;
		float *o = a.out + ((size_t)(r0 + r) * a.n_heads + kh * G + g) * D;
#pragma unroll
		for (int e = 0; e < DPL; e++) {
			const uint32_t dd = lane + 32 * e;
			if (dd < D)
				o[dd] = RA[j][e] / RL[j];
		}
	}
}

/*
 * Decode's merge of the chunk partials of attn_prefill_kernel<SPLIT> (grid
 * n_heads, a thread per dim): pf_fold over the chunks in order, as the
 * prefill kernel merges them, then acc / sum.
 */
__global__ void attn_fold_kernel(const float *ws, kvt_attention_args a, uint32_t D)
{
	const uint32_t h = blockIdx.x, pos = pos0_of(a.d_pos0, a.pos0);
	const uint32_t n_chunks = pos / ATTN_CHUNK + 1 - attn_first_key(a, pos) / ATTN_CHUNK;
	for (uint32_t dd = threadIdx.x; dd < D; dd += blockDim.x) {
		float M = -INFINITY, L = 0.0f, A = 0.0f, cM, cm;
		for (uint32_t z = 0; z < n_chunks; z++) {
			const float *p = ws + ((size_t)z * a.n_heads + h) * (D + 2);
			if (pf_fold(M, L, p[0], p[1], &cM, &cm))
				A = pf_merge(A, cM, p[2 + dd], cm);
		}
		a.out[(size_t)h * D + dd] = A / L;
	}
}

/* Chunks a decode at positions up to pos_max takes at most (the workspace's and a graph launch's bound). */
static uint32_t attn_max_chunks(uint32_t pos_max) { return pos_max / ATTN_CHUNK + 1; }

/* The order-invariant path (attn_prefill_kernel): any rows; one row splits over chunks, then attn_fold_kernel. */
static int attention_chunked(kvt_dev *d, const kvt_attention_args *a, float *ws)
{
	cuda_dev *c = C(d);
	const uint32_t D = a->kv->head_dim, G = a->n_heads / a->kv->n_kv_heads;
	if (G > PF_VECS) {
		KVT_LOGE("cuda attention: %u query heads per KV head (at most %d)", G, PF_VECS);
		return KVT_EUNSUPPORTED;
	}
	const uint32_t qt = G >= PF_VECS ? 1 : PF_VECS / G;
	const bool split = a->n_rows == 1 && ws;
	/* one row: a CTA per chunk of the window (a graph: of the bound, from position 0) */
	const uint32_t nz = !split ? 1
			    : a->d_pos0 ? attn_max_chunks(a->pos0)
					: a->pos0 / ATTN_CHUNK + 1 - attn_first_key(*a, a->pos0) / ATTN_CHUNK;
	const size_t shm = ((size_t)PF_VECS * D + (size_t)PF_KEYS * (D + 1) + (size_t)PF_KEYS * D) * sizeof(float);
	const dim3 grid(a->kv->n_kv_heads, div_up(a->n_rows, qt), nz);
#define PF(DPL)                                                                                              \
	do {                                                                                                 \
		if (split) {                                                                                 \
			cudaFuncSetAttribute(attn_prefill_kernel<DPL, true>,                                 \
					     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);         \
			attn_prefill_kernel<DPL, true><<<grid, 128, shm, c->stream>>>(*a->kv, *a, qt, ws);   \
		} else {                                                                             \
			cudaFuncSetAttribute(attn_prefill_kernel<DPL, false>,                                \
					     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);         \
			attn_prefill_kernel<DPL, false><<<grid, 128, shm, c->stream>>>(*a->kv, *a, qt, ws);  \
		}                                                                                            \
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
	int rc = LAUNCHED("attention (chunked)");
	if (rc || !split)
		return rc;
	attn_fold_kernel<<<a->n_heads, D < 128 ? 64 : 128, 0, c->stream>>>(ws, *a, D);
	return LAUNCHED("attention fold");
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
 * prints the rows a GPU run says to write here. Every row is
 * kernel 0: the order-invariant chunked path (attention_chunked), the
 * only one that keeps dev_impl.h's order rule. Kernels 1-3 split the keys
 * by the SM count and their occupancy, so a decode's bits differ from the
 * same row's in a prompt and between GPUs: they stay for bench_gpu's
 * comparisons, and a row naming one here would break the rule (a GPU run's
 * device_summary.py rows must not be pasted in until they keep it).
 * KVT_CUDA_DECODE=1|2|3, KVT_CUDA_COMBINE=separate|fused and
 * KVT_CUDA_STAGE=0|1 override the table for every call (read at create).
 */
struct decode_choice {
	bool q8;          /* the row is for 8-bit pools (fp8, int8); else fp16 */
	uint32_t min_ctx; /* from this context up (rows of a kind in increasing order) */
	int version;      /* 0: the chunked kernel (order-invariant); split kernel 1, 2 or 3 */
	bool fused;       /* combine in the last CTA of each head; else attn_combine*_kernel */
	bool staged;      /* kernel 2/3: decode2_stage before each round of the key loop */
};
static const decode_choice decode_choices[] = {
	/* q8     from ctx  kernel fused  staged */
	{ false, 0, 0, false, false },
	{ false, 8192, 0, false, false },
	{ false, 32768, 0, false, false },
	{ true, 0, 0, false, false },
	{ true, 8192, 0, false, false },
	{ true, 32768, 0, false, false },
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
size_t kvt_cuda_attention_workspace(const kvt_dev *d, const kvt_attention_args *a)
{
	kvt_attention_args one = *a;
	one.n_rows = 1;
	/* the chunked path's partials: one per chunk up to the last row's position */
	const uint32_t chunks = attn_max_chunks(a->pos0 + (a->n_rows ? a->n_rows - 1 : 0));
	const size_t chunked = (size_t)chunks * a->n_heads * (a->kv->head_dim + 2) * sizeof(float);
	if (!decode_ok(&one))
		return chunked;
	uint32_t most = decode_may_use((const cuda_dev *)d, a, 1) ? decode_want((const cuda_dev *)d, a) : 0;
	for (int v = 2; v <= 3; v++)
		if (decode_may_use((const cuda_dev *)d, a, v)) {
			int occ;
			decode2_pick((cuda_dev *)d, &one, v, false, &occ);
			const uint32_t n = div_up((uint64_t)occ * ((const cuda_dev *)d)->n_sm, a->kv->n_kv_heads);
			most = n > most ? n : most;
		}
	const size_t split = (size_t)most * a->n_heads * (a->kv->head_dim + 2) * sizeof(float);
	return split > chunked ? split : chunked;
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

int kvt_cuda_attention(kvt_dev *d, const kvt_attention_args *a, void *ws)
{
	cuda_dev *c = C(d);
	const uint32_t D = a->kv->head_dim;
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
	if (decode_ok(a) && p.version == 1) {
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
	return attention_chunked(d, a, (float *)ws);
}
