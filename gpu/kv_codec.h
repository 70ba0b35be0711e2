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
 * INT8KV and INT8KV1 (dev.h, "Block codecs"): K per channel, asymmetric; V
 * per token and group, symmetric. Codes first, then per layer a parameter
 * area; the functions below take the codec (KVT_KV_CODEC_INT8KV or
 * KVT_KV_CODEC_INT8KV1) and give byte offsets within a block's parameter
 * area (L layers, H KV heads, T tokens, D dims, ng V groups per token):
 *   INT8KV:  per layer kmin[H][D] fp16, kscale[H][D] E5M3, vscale[H][T][ng] E5M3;
 *   INT8KV1: per layer kscale/kmin [H][2][D] fp16, vscale[H][T][ng] fp16.
 */
#define KVT_KVK_QMAX 255.0f
#define KVT_KVV_GROUP 16 /* INT8KV's V dims per scale when head_dim is a multiple of it */

/* V dims per scale. */
static inline KVT_HD uint32_t kvt_int8kv_vgd(int codec, uint32_t head_dim)
{
	if (codec == KVT_KV_CODEC_INT8KV1)
		return kvt_codec_group_dims(KVT_KV_CODEC_INT8, head_dim);
	return head_dim % KVT_KVV_GROUP == 0 ? KVT_KVV_GROUP : head_dim;
}

static inline KVT_HD uint32_t kvt_int8kv_ng(int codec, uint32_t head_dim)
{
	return head_dim / kvt_int8kv_vgd(codec, head_dim);
}

/* Bytes of one layer's parameters. */
static inline KVT_HD size_t kvt_int8kv_layer_bytes(int codec, uint32_t H, uint32_t T, uint32_t D)
{
	const size_t vs = (size_t)H * T * kvt_int8kv_ng(codec, D);
	return codec == KVT_KV_CODEC_INT8KV1 ? 2 * ((size_t)H * 2 * D + vs) : (size_t)H * 3 * D + vs;
}

/* Byte offset of K channel d's minimum (fp16) in (layer, head). */
static inline KVT_HD size_t kvt_int8kv_kmin_at(int codec, uint32_t H, uint32_t T, uint32_t D, uint32_t layer,
					       uint32_t head, uint32_t d)
{
	const size_t base = layer * kvt_int8kv_layer_bytes(codec, H, T, D);
	return codec == KVT_KV_CODEC_INT8KV1 ? base + 2 * ((size_t)head * 2 * D + D + d) : base + 2 * ((size_t)head * D + d);
}

/* Byte offset of K channel d's scale (INT8KV: one E5M3 byte; INT8KV1: fp16). */
static inline KVT_HD size_t kvt_int8kv_kscale_at(int codec, uint32_t H, uint32_t T, uint32_t D, uint32_t layer,
						 uint32_t head, uint32_t d)
{
	const size_t base = layer * kvt_int8kv_layer_bytes(codec, H, T, D);
	return codec == KVT_KV_CODEC_INT8KV1 ? base + 2 * ((size_t)head * 2 * D + d) : base + 2 * (size_t)H * D + (size_t)head * D + d;
}

/* Byte offset of V (layer, head, token t) group g's scale (INT8KV: E5M3; INT8KV1: fp16). */
static inline KVT_HD size_t kvt_int8kv_vscale_at(int codec, uint32_t H, uint32_t T, uint32_t D, uint32_t layer,
						 uint32_t head, uint32_t t, uint32_t g)
{
	const size_t base = layer * kvt_int8kv_layer_bytes(codec, H, T, D), vi = ((size_t)head * T + t) * kvt_int8kv_ng(codec, D) + g;
	return codec == KVT_KV_CODEC_INT8KV1 ? base + 2 * ((size_t)H * 2 * D + vi) : base + 3 * (size_t)H * D + vi;
}

/* The fp16 value just below h (bits; h finite and not the most negative). */
static inline KVT_HD uint16_t kvt_f16_bits_down(uint16_t h)
{
	if ((h & 0x7FFFu) == 0)
		return 0x8001u; /* +-0 -> the smallest negative subnormal */
	return (h & 0x8000u) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
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

/*
 * An 8-bit unsigned scale ("E5M3": the fp16 bits 14..7 of a positive value, so
 * 5 exponent bits of bias 15 and 3 mantissa bits, subnormals m * 2^-17). Codes
 * 0 .. KVT_E5M3_MAX_CODE; the largest is 1.875 * 2^15 = 61440. A scale is
 * always rounded UP to a code (the smallest code >= s), so no value of its
 * group falls outside the codes' range; s above the largest code saturates.
 * Steps between codes are 6.7-12.5%: on average a scale grows by ~4.5%.
 */
#define KVT_E5M3_MAX_CODE 0xF7u

static inline KVT_HD float kvt_e5m3_decode(uint8_t c)
{
	uint32_t e = (uint32_t)c >> 3, m = (uint32_t)c & 7;
	return e ? ldexpf(1.0f + (float)m * 0.125f, (int)e - 15) : (float)m * (1.0f / 131072.0f);
}

static inline KVT_HD uint8_t kvt_e5m3_encode_up(float s)
{
	if (!(s > 0.0f))
		return 0;
	uint32_t b;
	memcpy(&b, &s, 4);
	int e = (int)(b >> 23) - 127 + 15;
	if (e > 30)
		return (uint8_t)KVT_E5M3_MAX_CODE;
	if (e < 1) {
		/* subnormal: s * 2^17 is exact for s < 2^-14 in fp32 (>= 2^-149 * 2^17) */
		float q = ceilf(s * 131072.0f);
		return (uint8_t)q; /* 1 .. 8; 8 is the smallest normal code */
	}
	uint32_t mant = b & 0x7FFFFFu, m = mant >> 20;
	if (mant & 0xFFFFFu)
		m++;
	uint32_t code = ((uint32_t)e << 3) + m; /* m == 8 carries into the exponent */
	return (uint8_t)(code > KVT_E5M3_MAX_CODE ? KVT_E5M3_MAX_CODE : code);
}

#endif
