/*
 * gpu/cuda/cuda_kv.cu — K and V between fp32 rows and the paged T0 pool on
 * the CUDA backend: kv_store (fp16 pools, and 8-bit pools in the packed
 * format of dev.h, quantized as kv_pack does), its inverse kv_load (fp16
 * values widened exactly; 8-bit codes times their group's scale, the one fp32
 * multiply of the CPU reference's kv_vec, so both give the same bits) and
 * rope_store, RoPE and the fp16 store in one kernel. Positions come from the
 * host or, under a graph, from device memory (pos0_of); the layout helpers
 * are cuda_int.cuh's.
 *
 * Grids: kv_store (rows, KV heads), 64 threads (8-bit: one warp for K, one
 * for V); kv_load (rows, KV heads), 64 threads striding the head's dims of K
 * and V; rope_store (rows, query heads + KV heads), 64 threads.
 */
#include "cuda_int.cuh"

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

int kvt_cuda_kv_store(kvt_dev *d, const kvt_kv_store_args *a)
{
	if (a->kv->codec != KVT_KV_CODEC_F16)
		kv_store_q_kernel<<<dim3(a->n_rows, a->kv->n_kv_heads), 64, 0, C(d)->stream>>>(*a->kv, *a);
	else
		kv_store_kernel<<<dim3(a->n_rows, a->kv->n_kv_heads), 64, 0, C(d)->stream>>>(*a->kv, *a);
	return LAUNCHED("kv_store");
}

/*
 * kv_store's inverse, one CTA per (row, KV head): thread i reads dims i,
 * i + 64, ... of the token's K and V vectors. An fp16 pool's halves widen
 * exactly; an 8-bit pool's code is decoded and multiplied by the fp32 scale
 * of its group (no rounding to fp16, as kv_vec in cpu_ref.c).
 */
__global__ void kv_load_kernel(kvt_kv_layout l, kvt_kv_load_args a)
{
	const uint32_t m = blockIdx.x, h = blockIdx.y, pos = a.pos0 + m, t = pos % l.block_tokens, D = l.head_dim;
	const int32_t slot = a.block_table[pos / l.block_tokens];
	const size_t dst = ((size_t)m * l.n_kv_heads + h) * D;
	if (l.codec == KVT_KV_CODEC_F16) {
		const __half *pool = (const __half *)l.pool;
		const size_t ko = kv_off(l, slot, a.layer, 0, h, t), vo = kv_off(l, slot, a.layer, 1, h, t);
		for (uint32_t i = threadIdx.x; i < D; i += blockDim.x) {
			a.k[dst + i] = __half2float(pool[ko + i]);
			a.v[dst + i] = __half2float(pool[vo + i]);
		}
		return;
	}
	const uint8_t *base = q_block(l, slot);
	const size_t ki = q_vi(l, a.layer, 0, h, t), vi = q_vi(l, a.layer, 1, h, t);
	for (uint32_t i = threadIdx.x; i < D; i += blockDim.x) {
		const float ks = *(const float *)(base + q_scale_off(l, ki, i));
		const float vs = *(const float *)(base + q_scale_off(l, vi, i));
		a.k[dst + i] = q_decode(l.codec, base[ki * D + i]) * ks;
		a.v[dst + i] = q_decode(l.codec, base[vi * D + i]) * vs;
	}
}

int kvt_cuda_kv_load(kvt_dev *d, const kvt_kv_load_args *a)
{
	kv_load_kernel<<<dim3(a->n_rows, a->kv->n_kv_heads), 64, 0, C(d)->stream>>>(*a->kv, *a);
	return LAUNCHED("kv_load");
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

int kvt_cuda_rope_store(kvt_dev *d, const kvt_rope_store_args *a)
{
	const kvt_kv_layout *l = a->st.kv;
	if (l->codec != KVT_KV_CODEC_F16)
		return KVT_DEV_COMPOSE; /* 8-bit pools: rope, rope, kv_store (the store's amax is per vector) */
	const float theta_scale = powf(a->freq_base, -2.0f / (float)a->n_rot);
	dim3 grid(a->st.n_rows, (a->q ? a->n_heads : 0) + l->n_kv_heads);
	rope_store_kernel<<<grid, 64, 0, C(d)->stream>>>(*l, *a, theta_scale);
	return LAUNCHED("rope + kv_store");
}
