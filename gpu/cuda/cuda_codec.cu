/*
 * gpu/cuda/cuda_codec.cu — the block codecs on the CUDA backend: kv_pack
 * (T0 fp16 blocks to the packed FP8/INT8 or fp16 record, on a stream of the
 * tiering manager's) and kv_unpack (back into T0 slots).
 *
 * Grid: one warp (or, vectorised, head_dim / 8 lanes) per (layer, K/V,
 * head, token) vector: the amax of each scale group (kv_codec.h,
 * kvt_codec_group_dims: 32 dims for INT8, the whole head for FP8) by warp
 * reduction, then the shared scalar arithmetic of kv_codec.h, so codes and
 * scales match the CPU bit for bit. INT8KV and INT8KV1 (K per channel over
 * the block) take one thread per K channel or V group instead. Slots travel by value
 * in the kernel's parameters, CODEC_SLOTS a launch.
 */
#include "cuda_int.cuh"

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

/*
 * INT8KV and INT8KV1 (dev.h, kv_codec.h): one thread per K channel (layer,
 * head, dim: its min and max over the block's tokens, then its codes) or per
 * V group (layer, head, token, group). Grid (items / 256, blocks), 256
 * threads. Every parameter is stored first and the stored value used, with
 * the CPU's rounding (cpu_ref.c), so the two agree bit for bit.
 */
__device__ static float par_f16(const uint8_t *par, size_t at)
{
	__half h;
	memcpy(&h, par + at, 2);
	return __half2float(h);
}

__device__ static float scale_put(int codec, uint8_t *par, size_t at, float x)
{
	if (codec == KVT_KV_CODEC_INT8KV) {
		par[at] = kvt_e5m3_encode_up(x);
		return kvt_e5m3_decode(par[at]);
	}
	__half h = __float2half_rn(x);
	memcpy(par + at, &h, 2);
	return __half2float(h);
}

__device__ static float scale_get(int codec, const uint8_t *par, size_t at)
{
	return codec == KVT_KV_CODEC_INT8KV ? kvt_e5m3_decode(par[at]) : par_f16(par, at);
}

__device__ static float kmin_put(int codec, uint8_t *par, size_t at, float mn)
{
	__half h = __float2half_rn(mn);
	uint16_t bits;
	memcpy(&bits, &h, 2);
	if (codec == KVT_KV_CODEC_INT8KV && __half2float(h) > mn)
		bits = kvt_f16_bits_down(bits);
	memcpy(par + at, &bits, 2);
	return par_f16(par, at);
}

__global__ void int8kv_pack_kernel(kvt_kv_layout l, int codec, codec_slots sl, uint8_t *dst, size_t packed,
				   uint32_t n_vec)
{
	const uint32_t H = l.n_kv_heads, T = l.block_tokens, D = l.head_dim, ng = kvt_int8kv_ng(codec, D), gd = D / ng;
	const uint32_t nk = l.n_layers * H * D, nv = l.n_layers * H * T * ng;
	const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
	if (i >= nk + nv)
		return;
	const __half *src = (const __half *)l.pool + (size_t)sl.slot[b] * n_vec * D;
	uint8_t *out = dst + b * packed, *par = out + (size_t)n_vec * D;
	if (i < nk) {
		const uint32_t layer = i / (H * D), h = i / D % H, d = i % D;
		const size_t base = ((size_t)(layer * 2 + 0) * H + h) * T * D + d;
		float mn = INFINITY, mx = -INFINITY;
		for (uint32_t t = 0; t < T; t++) {
			float x = __half2float(src[base + (size_t)t * D]);
			mn = x < mn ? x : mn;
			mx = x > mx ? x : mx;
		}
		const float m = kmin_put(codec, par, kvt_int8kv_kmin_at(codec, H, T, D, layer, h, d), mn);
		const float inv = kvt_int8kv_inv(
			scale_put(codec, par, kvt_int8kv_kscale_at(codec, H, T, D, layer, h, d), (mx - m) / KVT_KVK_QMAX));
		for (uint32_t t = 0; t < T; t++)
			out[base + (size_t)t * D] = kvt_int8kv_k_encode(__half2float(src[base + (size_t)t * D]), m, inv);
		return;
	}
	const uint32_t j = i - nk, layer = j / (H * T * ng), h = j / (T * ng) % H, t = j / ng % T, g = j % ng;
	const size_t base = (((size_t)(layer * 2 + 1) * H + h) * T + t) * D + g * gd;
	float amax = 0.0f;
	for (uint32_t k = 0; k < gd; k++)
		amax = fmaxf(amax, fabsf(__half2float(src[base + k])));
	const float inv = kvt_int8kv_inv(
		scale_put(codec, par, kvt_int8kv_vscale_at(codec, H, T, D, layer, h, t, g), amax / KVT_INT8_MAX));
	for (uint32_t k = 0; k < gd; k++)
		out[base + k] = (uint8_t)kvt_int8_encode(__half2float(src[base + k]) * inv);
}

__global__ void int8kv_unpack_kernel(kvt_kv_layout l, int codec, codec_slots sl, const uint8_t *src, size_t packed,
				     uint32_t n_vec)
{
	const uint32_t H = l.n_kv_heads, T = l.block_tokens, D = l.head_dim, ng = kvt_int8kv_ng(codec, D), gd = D / ng;
	const uint32_t nk = l.n_layers * H * D, nv = l.n_layers * H * T * ng;
	const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
	if (i >= nk + nv)
		return;
	__half *dst = (__half *)l.pool + (size_t)sl.slot[b] * n_vec * D;
	const uint8_t *in = src + b * packed, *par = in + (size_t)n_vec * D;
	if (i < nk) {
		const uint32_t layer = i / (H * D), h = i / D % H, d = i % D;
		const size_t base = ((size_t)(layer * 2 + 0) * H + h) * T * D + d;
		const float s = scale_get(codec, par, kvt_int8kv_kscale_at(codec, H, T, D, layer, h, d));
		const float m = par_f16(par, kvt_int8kv_kmin_at(codec, H, T, D, layer, h, d));
		for (uint32_t t = 0; t < T; t++)
			dst[base + (size_t)t * D] = __float2half_rn(kvt_int8kv_k_decode(in[base + (size_t)t * D], m, s));
		return;
	}
	const uint32_t j = i - nk, layer = j / (H * T * ng), h = j / (T * ng) % H, t = j / ng % T, g = j % ng;
	const size_t base = (((size_t)(layer * 2 + 1) * H + h) * T + t) * D + g * gd;
	const float s = scale_get(codec, par, kvt_int8kv_vscale_at(codec, H, T, D, layer, h, t, g));
	for (uint32_t k = 0; k < gd; k++)
		dst[base + k] = __float2half_rn((float)(int8_t)in[base + k] * s);
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
		if (codec == KVT_KV_CODEC_INT8KV || codec == KVT_KV_CODEC_INT8KV1) {
			const uint32_t items =
				l->n_layers * l->n_kv_heads * (l->head_dim + l->block_tokens * kvt_int8kv_ng(codec, l->head_dim));
			if (pack)
				int8kv_pack_kernel<<<dim3(div_up(items, 256), nb), 256, 0, s>>>(*l, codec, sl, d8, packed, n_vec);
			else
				int8kv_unpack_kernel<<<dim3(div_up(items, 256), nb), 256, 0, s>>>(*l, codec, sl, s8, packed, n_vec);
			int rc = LAUNCHED(pack ? "kv_pack int8kv" : "kv_unpack int8kv");
			if (rc)
				return rc;
			continue;
		}
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

int kvt_cuda_kv_pack(kvt_dev *d, kvt_stream *s, const kvt_kv_pack_args *a)
{
	return codec_run(d, s, a->kv, a->codec, a->n_blocks, a->h_slots, a->dst, NULL, true);
}

int kvt_cuda_kv_unpack(kvt_dev *d, kvt_stream *s, const kvt_kv_unpack_args *a)
{
	return codec_run(d, s, a->kv, a->codec, a->n_blocks, a->h_slots, NULL, a->src, false);
}
