/*
 * gpu/kv_codec.h — the scalar arithmetic of the block codecs (dev.h,
 * enum kvt_kv_codec), shared by the CPU reference and the CUDA kernels so
 * that both round the same way. Backends only.
 *
 * FP8 here is E4M3 in its "FN" form (OCP 8-bit floating point): 1 sign bit,
 * 4 exponent bits (bias 7), 3 mantissa bits, no infinities, 0x7F/0xFF NaN,
 * largest finite 448, subnormals m * 2^-9. Encoding rounds to nearest even
 * and saturates to +-448 (as cuda_fp8.h's __NV_SATFINITE does), so the CUDA
 * backend may use the hardware conversion and still match bit for bit.
 *
 * Scale groups (dev.h, "Block codecs"): FP8 keeps one scale per (token, KV
 * head) vector; INT8 one per KVT_KV_INT8_GROUP consecutive values of it, or one
 * for the whole vector when head_dim is not a multiple of KVT_KV_INT8_GROUP.
 * kvt_codec_group_dims() is the one place that rule is written.
 */
#ifndef KVT_KV_CODEC_H
#define KVT_KV_CODEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dev.h" /* enum kvt_kv_codec; NOTE: C++ includers include it first, inside extern "C" */

#ifdef __CUDACC__
#define KVT_HD __host__ __device__
#else
#define KVT_HD
#endif

#define KVT_FP8_MAX 448.0f
#define KVT_INT8_MAX 127.0f

static inline KVT_HD uint8_t kvt_fp8_e4m3_encode(float x)
{
	uint32_t b;
	memcpy(&b, &x, 4);
	uint8_t sign = (uint8_t)((b >> 24) & 0x80);
	b &= 0x7FFFFFFFu;
	if (b > 0x7F800000u)
		return 0x7F; /* NaN */
	float a;
	memcpy(&a, &b, 4);
	if (a >= KVT_FP8_MAX)
		return sign | 0x7E;
	int e = (int)(b >> 23) - 127;
	if (e < -6) {
		/* Subnormal (or zero): a * 2^9 is exact; rint rounds half to even. */
		return sign | (uint8_t)rintf(a * 512.0f); /* 8 is the smallest normal */
	}
	uint32_t mant = b & 0x7FFFFFu;
	uint32_t m3 = mant >> 20, rem = mant & 0xFFFFFu;
	if (rem > 0x80000u || (rem == 0x80000u && (m3 & 1)))
		m3++;
	if (m3 == 8) {
		m3 = 0;
		e++;
	}
	uint32_t code = ((uint32_t)(e + 7) << 3) | m3;
	return sign | (uint8_t)(code > 0x7E ? 0x7E : code);
}

static inline KVT_HD float kvt_fp8_e4m3_decode(uint8_t c)
{
	int ef = (c >> 3) & 0xF, m = c & 7;
	float v = ef ? ldexpf(1.0f + (float)m * 0.125f, ef - 7) : (float)m * (1.0f / 512.0f);
	return (c & 0x80) ? -v : v;
}

static inline KVT_HD int8_t kvt_int8_encode(float x)
{
	float r = rintf(x);
	r = r > KVT_INT8_MAX ? KVT_INT8_MAX : (r < -KVT_INT8_MAX ? -KVT_INT8_MAX : r);
	return (int8_t)r;
}

/* scale and its inverse from a vector's largest magnitude. */
static inline KVT_HD void kvt_codec_scales(float amax, float qmax, float *s, float *inv)
{
	if (amax > 0.0f) {
		*s = amax / qmax;
		*inv = qmax / amax;
	} else {
		*s = 0.0f;
		*inv = 0.0f;
	}
}

/*
 * Values per scale in a packed vector of head_dim values: KVT_KV_INT8_GROUP for
 * INT8 when it divides head_dim, else (INT8 otherwise, FP8 always) the whole
 * vector. codec is an enum kvt_kv_codec (dev.h) other than F16.
 */
static inline KVT_HD uint32_t kvt_codec_group_dims(int codec, uint32_t head_dim)
{
	return codec == KVT_KV_CODEC_INT8 && head_dim % KVT_KV_INT8_GROUP == 0 ? KVT_KV_INT8_GROUP : head_dim;
}

/*
 * INT8KV (dev.h, "Block codecs"): K per channel, asymmetric; V per token and
 * group, symmetric; every scale (and K minimum) stored as fp16, so the fp32
 * values used below are those of the stored fp16 (the backend rounds them).
 * Offsets within one packed block of L layers, H KV heads, T tokens, D dims
 * (ng V groups per token): codes first, then per layer P fp16 values.
 */
#define KVT_KVK_QMAX 255.0f

static inline KVT_HD uint32_t kvt_int8kv_ng(uint32_t head_dim)
{
	return head_dim / kvt_codec_group_dims(KVT_KV_CODEC_INT8, head_dim);
}

/* fp16 values of one layer's parameters: 2 per K channel and head, ng per V token and head. */
static inline KVT_HD size_t kvt_int8kv_layer_params(uint32_t H, uint32_t T, uint32_t D)
{
	return (size_t)H * (2 * D + (size_t)T * kvt_int8kv_ng(D));
}

/* Index (in fp16 values from the parameter area's start) of K channel d's scale (+ D: its minimum). */
static inline KVT_HD size_t kvt_int8kv_kparam(uint32_t H, uint32_t T, uint32_t D, uint32_t layer, uint32_t head,
					      uint32_t d)
{
	return layer * kvt_int8kv_layer_params(H, T, D) + (size_t)head * 2 * D + d;
}

/* Index of V (layer, head, token t) group g's scale. */
static inline KVT_HD size_t kvt_int8kv_vscale(uint32_t H, uint32_t T, uint32_t D, uint32_t layer, uint32_t head,
					      uint32_t t, uint32_t g)
{
	return layer * kvt_int8kv_layer_params(H, T, D) + (size_t)H * 2 * D +
	       ((size_t)head * T + t) * kvt_int8kv_ng(D) + g;
}

/* 1/s, or 0 for a zero scale (then every code is 0). */
static inline KVT_HD float kvt_int8kv_inv(float s)
{
	return s > 0.0f ? 1.0f / s : 0.0f;
}

static inline KVT_HD uint8_t kvt_int8kv_k_encode(float x, float m, float inv)
{
	float c = rintf((x - m) * inv);
	c = c < 0.0f ? 0.0f : (c > KVT_KVK_QMAX ? KVT_KVK_QMAX : c);
	return (uint8_t)c;
}

/* fma: one rounding, so a backend that contracts a*b+c gives the same value as one that does not. */
static inline KVT_HD float kvt_int8kv_k_decode(uint8_t c, float m, float s)
{
	return fmaf((float)c, s, m);
}

#endif
