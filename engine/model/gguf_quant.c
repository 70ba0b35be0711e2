/*
 * engine/model/gguf_quant.c — the ggml type table and its block quantizers
 * and dequantizers (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K).
 *
 * One table, indexed by ggml type number, gives every type ggml sizes its
 * block geometry and, where this file has them, its dequantizer and its
 * quantizer. The reader (gguf.c) and the writer (gguf_writer.c) size and
 * check tensors with it (gguf_int.h), so a type that opens, a type that
 * loads and a type that can be written are all decided here.
 *
 * The quantizers follow ggml's reference ("_ref") quantizers' arithmetic
 * operation for operation, so a tensor quantized here has the bytes llama.cpp
 * would write for the same floats (the K-quants with no importance matrix).
 * NOTE: that takes every fp32 product rounded on its own: this file, and only
 * this file, is built with -ffp-contract=off (CMakeLists.txt). With -march=native
 * GCC would fuse multiply-adds in the Q4_0, Q4_1 and Q5_0 quantizers
 * (x * id + 0.5), the K-quants' least-squares fits (where a fused one moves a
 * few scales by one step) and the Q4_1, Q4_K and Q5_K dequantizers
 * (q * d + m); the reader and the writer have no such expression.
 * The block layouts are little-endian, and so is every host we build for
 * (checked in gguf_int.h).
 *
 * Invariants: every function here works on whole blocks and writes exactly
 * n_blocks * block_bytes (quantize) or n_blocks * block_elems (dequantize);
 * kvt_ggml_quantize() refuses non-finite input to a block type before any
 * quantizer sees it, so the quantizers need no Inf/NaN paths of their own.
 */
#include "gguf_int.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static inline float ld_f16(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return kvt_f16_to_f32(h);
}

static inline void st_f16(uint8_t *p, float f)
{
	uint16_t h = kvt_f32_to_f16(f);
	memcpy(p, &h, 2);
}

/* float -> bf16 as ggml does it: round to nearest even, NaN kept quiet. */
static inline uint16_t f32_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 64);
	return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

/*
 * ggml's quantizers cast a float to int8_t. For the values they produce that
 * truncates toward zero; this does the same but cannot hit undefined
 * behaviour when a tiny scale makes the reciprocal infinite.
 */
static inline int trunc_clamp(float v, int lo, int hi)
{
	if (!(v > (float)lo)) /* also NaN */
		return lo;
	if (v >= (float)hi)
		return hi;
	return (int)v;
}

static void dq_f32(const uint8_t *src, float *dst, uint64_t n_blocks)
{
	memcpy(dst, src, n_blocks * 4);
}

static void dq_f16(const uint8_t *src, float *dst, uint64_t n_blocks)
{
	for (uint64_t i = 0; i < n_blocks; i++)
		dst[i] = ld_f16(src + 2 * i);
}

static void dq_bf16(const uint8_t *src, float *dst, uint64_t n_blocks)
{
	for (uint64_t i = 0; i < n_blocks; i++) {
		uint16_t h;
		memcpy(&h, src + 2 * i, 2);
		dst[i] = kvt_bf16_to_f32(h);
	}
}

/* Q8_0, 34 bytes: f16 d, int8 q[32]; x = q * d. */
static void dq_q8_0(const uint8_t *src, float *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += 34, dst += 32) {
		float d = ld_f16(src);
		const int8_t *q = (const int8_t *)(src + 2);
		for (int j = 0; j < 32; j++)
			dst[j] = (float)q[j] * d;
	}
}

/* Q4_0, 18 bytes: f16 d, 16 bytes; element j is qs[j] & 15, j+16 is qs[j] >> 4; x = (q - 8) * d. */
static void dq_q4_0(const uint8_t *src, float *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += 18, dst += 32) {
		float d = ld_f16(src);
		const uint8_t *qs = src + 2;
		for (int j = 0; j < 16; j++) {
			dst[j] = (float)((qs[j] & 0xf) - 8) * d;
			dst[j + 16] = (float)((qs[j] >> 4) - 8) * d;
		}
	}
}

/*
 * Q5_0, 22 bytes: f16 d, a 32-bit little-endian word qh of fifth bits, 16
 * bytes of nibbles as Q4_0; element j's fifth bit is bit j of qh;
 * x = (q - 16) * d.
 */
static void dq_q5_0(const uint8_t *src, float *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += 22, dst += 32) {
		float d = ld_f16(src);
		uint32_t qh;
		memcpy(&qh, src + 2, 4);
		const uint8_t *qs = src + 6;
		for (int j = 0; j < 16; j++) {
			int lo = (qs[j] & 0xf) | (int)(((qh >> j) & 1) << 4);
			int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
			dst[j] = (float)(lo - 16) * d;
			dst[j + 16] = (float)(hi - 16) * d;
		}
	}
}

/* Q4_1, 20 bytes: f16 d, f16 m, 16 bytes (nibbles as Q4_0); x = q * d + m. */
static void dq_q4_1(const uint8_t *src, float *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += 20, dst += 32) {
		float d = ld_f16(src), m = ld_f16(src + 2);
		const uint8_t *qs = src + 4;
		for (int j = 0; j < 16; j++) {
			dst[j] = (float)(qs[j] & 0xf) * d + m;
			dst[j + 16] = (float)(qs[j] >> 4) * d + m;
		}
	}
}

/*
 * Q4_K's 12 scale bytes hold 8 (scale, min) pairs of 6 bits: pairs 0..3 are
 * the low 6 bits of bytes 0..3 (scales) and 4..7 (mins); pairs 4..7 take their
 * low 4 bits from bytes 8..11 and their top 2 bits from the top of bytes 0..7.
 */
static inline void q4_k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *mn)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*mn = s[j + 4] & 63;
	} else {
		*sc = (uint8_t)((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4));
		*mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
	}
}

/*
 * Q4_K, 144 bytes per 256: f16 d, f16 dmin, 12 scale bytes, 128 bytes of
 * nibbles. Each 64 elements use 32 bytes: the low nibbles are sub-block 2i,
 * the high nibbles sub-block 2i+1; x = d*sc*q - dmin*mn.
 * Q5_K (q5), 176 bytes per 256: the same with qh[32] of fifth bits before the
 * nibbles; sub-block s takes its fifth bit from bit s of qh[l].
 * NOTE: static inline with a constant q5 at both callers, so each gets its own
 * branch-free loop, as the two copies this replaced.
 */
static inline void dq_k_4_5(const uint8_t *src, float *dst, uint64_t n_blocks, bool q5)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += q5 ? 176 : 144) {
		float d = ld_f16(src), dmin = ld_f16(src + 2);
		const uint8_t *scales = src + 4, *qh = src + 16;
		const uint8_t *q = src + (q5 ? 48 : 16);
		for (int sub = 0; sub < 8; sub += 2, q += 32) {
			uint8_t sc, mn;
			q4_k_scale_min(sub, scales, &sc, &mn);
			float d1 = d * sc, m1 = dmin * mn;
			q4_k_scale_min(sub + 1, scales, &sc, &mn);
			float d2 = d * sc, m2 = dmin * mn;
			for (int l = 0; l < 32; l++)
				*dst++ = d1 * (float)((q[l] & 0xf) | (q5 ? ((qh[l] >> sub) & 1) << 4 : 0)) - m1;
			for (int l = 0; l < 32; l++)
				*dst++ = d2 * (float)((q[l] >> 4) | (q5 ? ((qh[l] >> (sub + 1)) & 1) << 4 : 0)) - m2;
		}
	}
}

static void dq_q4_k(const uint8_t *src, float *dst, uint64_t n_blocks)
{
	dq_k_4_5(src, dst, n_blocks, false);
}

static void dq_q5_k(const uint8_t *src, float *dst, uint64_t n_blocks)
{
	dq_k_4_5(src, dst, n_blocks, true);
}

/*
 * Q6_K, 210 bytes per 256: ql[128] (low 4 bits), qh[64] (high 2 bits),
 * int8 scales[16] (one per 16 elements), f16 d; x = d * scale * (q - 32).
 * Each half of 128 elements uses 64 ql bytes and 32 qh bytes: element l+32k
 * (k = 0..3) takes the low or high nibble of ql[l] / ql[l+32] and bits 2k..2k+1
 * of qh[l].
 */
static void dq_q6_k(const uint8_t *src, float *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += 210) {
		const uint8_t *ql = src, *qh = src + 128;
		const int8_t *sc = (const int8_t *)(src + 192);
		float d = ld_f16(src + 208);
		for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, dst += 128) {
			for (int l = 0; l < 32; l++) {
				int is = l / 16;
				int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
				int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
				int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
				int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
				dst[l] = d * sc[is] * (float)q1;
				dst[l + 32] = d * sc[is + 2] * (float)q2;
				dst[l + 64] = d * sc[is + 4] * (float)q3;
				dst[l + 96] = d * sc[is + 6] * (float)q4;
			}
		}
	}
}

static void q_f32(const float *src, uint8_t *dst, uint64_t n_blocks)
{
	memcpy(dst, src, n_blocks * 4);
}

static void q_f16(const float *src, uint8_t *dst, uint64_t n_blocks)
{
	for (uint64_t i = 0; i < n_blocks; i++)
		st_f16(dst + 2 * i, src[i]);
}

static void q_bf16(const float *src, uint8_t *dst, uint64_t n_blocks)
{
	for (uint64_t i = 0; i < n_blocks; i++) {
		uint16_t h = f32_to_bf16(src[i]);
		memcpy(dst + 2 * i, &h, 2);
	}
}

/* ggml quantize_row_q8_0_ref: d = amax / 127, q = round(x / d). */
static void q_q8_0(const float *src, uint8_t *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += 32, dst += 34) {
		float amax = 0.0f;
		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(src[j]));
		float d = amax / 127;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		st_f16(dst, d);
		for (int j = 0; j < 32; j++) {
			float r = roundf(src[j] * id);
			dst[2 + j] = (uint8_t)(int8_t)trunc_clamp(r, -128, 127);
		}
	}
}

/* The value of largest magnitude among x[0..n) (the first on ties; 0 when all are 0). */
static float largest_magnitude(const float *x, int n)
{
	float amax = 0.0f, max = 0.0f;
	for (int j = 0; j < n; j++) {
		if (amax < fabsf(x[j])) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	}
	return max;
}

/* ggml quantize_row_q4_0_ref: d = (value of largest magnitude) / -8, q = trunc(x/d + 8.5) <= 15. */
static void q_q4_0(const float *src, uint8_t *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += 32, dst += 18) {
		float max = largest_magnitude(src, 32);
		float d = max / -8;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		st_f16(dst, d);
		for (int j = 0; j < 16; j++) {
			int x0 = trunc_clamp(src[j] * id + 8.5f, 0, 15);
			int x1 = trunc_clamp(src[j + 16] * id + 8.5f, 0, 15);
			dst[2 + j] = (uint8_t)(x0 | (x1 << 4));
		}
	}
}

/* ggml quantize_row_q4_1_ref: d = (max - min) / 15, m = min, q = trunc((x - min)/d + 0.5) <= 15. */
static void q_q4_1(const float *src, uint8_t *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += 32, dst += 20) {
		float min = FLT_MAX, max = -FLT_MAX;
		for (int j = 0; j < 32; j++) {
			if (src[j] < min)
				min = src[j];
			if (src[j] > max)
				max = src[j];
		}
		float d = (max - min) / 15;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		st_f16(dst, d);
		st_f16(dst + 2, min);
		for (int j = 0; j < 16; j++) {
			int x0 = trunc_clamp((src[j] - min) * id + 0.5f, 0, 15);
			int x1 = trunc_clamp((src[j + 16] - min) * id + 0.5f, 0, 15);
			dst[4 + j] = (uint8_t)(x0 | (x1 << 4));
		}
	}
}

/* ggml quantize_row_q5_0_ref: d = (value of largest magnitude) / -16, q = trunc(x/d + 16.5) <= 31. */
static void q_q5_0(const float *src, uint8_t *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += 32, dst += 22) {
		float max = largest_magnitude(src, 32);
		float d = max / -16;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		uint32_t qh = 0;
		st_f16(dst, d);
		for (int j = 0; j < 16; j++) {
			int x0 = trunc_clamp(src[j] * id + 16.5f, 0, 31);
			int x1 = trunc_clamp(src[j + 16] * id + 16.5f, 0, 31);
			dst[6 + j] = (uint8_t)((x0 & 15) | ((x1 & 15) << 4));
			qh |= (uint32_t)(x0 >> 4) << j | (uint32_t)(x1 >> 4) << (j + 16);
		}
		memcpy(dst + 2, &qh, 4);
	}
}

/* ggml's nearest_int: round half to even in fp32 (the default rounding mode). */
static inline int near_int(float v)
{
	return (int)lrintf(v);
}

static inline int clampi(int v, int lo, int hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/*
 * ggml make_qkx2_quants: n values to levels 0..nmax with a scale and a min
 * (x ~ scale * L - the_min), weighted least squares over nstep + 1 trial
 * reciprocal scales around nmax / (max - min). Returns the scale.
 */
static float qkx2_levels(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
			 float rmin, float rdelta, int nstep)
{
	uint8_t aux[32];
	float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
	for (int i = 1; i < n; i++) {
		min = x[i] < min ? x[i] : min;
		max = x[i] > max ? x[i] : max;
		sum_w += w[i];
		sum_x += w[i] * x[i];
	}
	if (min > 0)
		min = 0;
	if (max == min) {
		memset(L, 0, (size_t)n);
		*the_min = -min;
		return 0.0f;
	}
	float iscale = nmax / (max - min), scale = 1 / iscale, best = 0;
	for (int i = 0; i < n; i++) {
		L[i] = (uint8_t)clampi(near_int(iscale * (x[i] - min)), 0, nmax);
		float diff = scale * L[i] + min - x[i];
		best += w[i] * diff * diff;
	}
	for (int is = 0; is <= nstep; is++) {
		iscale = (rmin + rdelta * is + nmax) / (max - min);
		float sum_l = 0, sum_l2 = 0, sum_xl = 0;
		for (int i = 0; i < n; i++) {
			int l = clampi(near_int(iscale * (x[i] - min)), 0, nmax);
			aux[i] = (uint8_t)l;
			sum_l += w[i] * l;
			sum_l2 += w[i] * l * l;
			sum_xl += w[i] * l * x[i];
		}
		float D = sum_w * sum_l2 - sum_l * sum_l;
		if (D > 0) {
			float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
			float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
			if (this_min > 0) {
				this_min = 0;
				this_scale = sum_xl / sum_l2;
			}
			float err = 0;
			for (int i = 0; i < n; i++) {
				float diff = this_scale * aux[i] + this_min - x[i];
				err += w[i] * diff * diff;
			}
			if (err < best) {
				memcpy(L, aux, (size_t)n);
				best = err;
				scale = this_scale;
				min = this_min;
			}
		}
	}
	*the_min = -min;
	return scale;
}

/*
 * ggml quantize_row_q4_K_ref / q5_K_ref: per 32-element sub-block a weighted
 * (scale, min) fit (weights sqrt(mean x^2) + |x|), both quantized to 6 bits
 * against the superblock's largest (d = max scale / 63, dmin = max min / 63),
 * then each value re-quantized with its rounded scale and min.
 */
static void q_k_4_5(const float *src, uint8_t *dst, int nmax, float rmin, int nstep)
{
	const bool q5 = nmax == 31;
	float scales[8], mins[8], w[32], max_scale = 0, max_min = 0;
	uint8_t L[256], *sc = dst + 4;

	for (int j = 0; j < 8; j++) {
		const float *x = src + 32 * j;
		float sum_x2 = 0;
		for (int l = 0; l < 32; l++)
			sum_x2 += x[l] * x[l];
		float av_x = sqrtf(sum_x2 / 32);
		for (int l = 0; l < 32; l++)
			w[l] = av_x + fabsf(x[l]);
		scales[j] = qkx2_levels(32, nmax, x, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep);
		max_scale = scales[j] > max_scale ? scales[j] : max_scale;
		max_min = mins[j] > max_min ? mins[j] : max_min;
	}
	float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
	memset(sc, 0, 12);
	for (int j = 0; j < 8; j++) {
		int ls = near_int(inv_scale * scales[j]), lm = near_int(inv_min * mins[j]);
		ls = ls > 63 ? 63 : ls;
		lm = lm > 63 ? 63 : lm;
		if (j < 4) {
			sc[j] = (uint8_t)ls;
			sc[j + 4] = (uint8_t)lm;
		} else {
			sc[j + 4] = (uint8_t)((ls & 15) | ((lm & 15) << 4));
			sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
			sc[j] |= (uint8_t)((lm >> 4) << 6);
		}
	}
	st_f16(dst, max_scale / 63.f);
	st_f16(dst + 2, max_min / 63.f);
	const float d = ld_f16(dst), dmin = ld_f16(dst + 2);
	for (int j = 0; j < 8; j++) {
		uint8_t s6, m6;
		q4_k_scale_min(j, sc, &s6, &m6);
		const float dj = d * s6;
		if (dj == 0.0f)
			continue; /* NOTE: keeps the levels of the fit, as ggml does */
		const float dm = dmin * m6;
		for (int l = 0; l < 32; l++)
			L[32 * j + l] = (uint8_t)clampi(near_int((src[32 * j + l] + dm) / dj), 0, nmax);
	}
	uint8_t *qh = dst + 16, *qs = dst + (q5 ? 48 : 16);
	if (q5)
		memset(qh, 0, 32);
	for (int c = 0; c < 4; c++, qs += 32)
		for (int l = 0; l < 32; l++) {
			int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
			if (q5) {
				qh[l] |= (uint8_t)((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
				lo &= 15, hi &= 15;
			}
			qs[l] = (uint8_t)(lo | hi << 4);
		}
}

static void q_q4_k(const float *src, uint8_t *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++)
		q_k_4_5(src + 256 * b, dst + 144 * b, 15, -1.0f, 20);
}

static void q_q5_k(const float *src, uint8_t *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++)
		q_k_4_5(src + 256 * b, dst + 176 * b, 31, -0.5f, 15);
}

#define GROUP_MAX_EPS 1e-15f /* ggml: a group whose largest |x| is below this quantizes to zeros */

/*
 * ggml make_qx_quants with rmse_type 1 (weights x^2): n values to signed
 * levels -nmax..nmax-1 (stored + nmax), trying 19 reciprocal scales around
 * -nmax / max and keeping the best weighted fit. Returns the scale.
 */
static float qx_levels(int n, int nmax, const float *x, uint8_t *L)
{
	float max = largest_magnitude(x, n);
	if (fabsf(max) < GROUP_MAX_EPS) {
		memset(L, 0, (size_t)n);
		return 0.0f;
	}
	float iscale = -nmax / max, sumlx = 0, suml2 = 0;
	for (int i = 0; i < n; i++) {
		int l = clampi(near_int(iscale * x[i]), -nmax, nmax - 1);
		L[i] = (uint8_t)(l + nmax);
		float w = x[i] * x[i];
		sumlx += w * x[i] * l;
		suml2 += w * l * l;
	}
	float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
	for (int is = -9; is <= 9; is++) {
		if (is == 0)
			continue;
		iscale = -(nmax + 0.1f * is) / max;
		sumlx = suml2 = 0;
		for (int i = 0; i < n; i++) {
			int l = clampi(near_int(iscale * x[i]), -nmax, nmax - 1);
			float w = x[i] * x[i];
			sumlx += w * x[i] * l;
			suml2 += w * l * l;
		}
		if (suml2 > 0 && sumlx * sumlx > best * suml2) {
			for (int i = 0; i < n; i++)
				L[i] = (uint8_t)(nmax + clampi(near_int(iscale * x[i]), -nmax, nmax - 1));
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
	return scale;
}

/*
 * ggml quantize_row_q6_K_ref: 16 sub-blocks of 16 fitted by qx_levels, their
 * scales to int8 against the one of largest magnitude (d = max / -128), then
 * each value re-quantized with its rounded scale.
 */
static void q_q6_k(const float *src, uint8_t *dst, uint64_t n_blocks)
{
	for (uint64_t b = 0; b < n_blocks; b++, src += 256, dst += 210) {
		float scales[16];
		uint8_t L[256];
		int8_t *sc = (int8_t *)(dst + 192);
		for (int ib = 0; ib < 16; ib++)
			scales[ib] = qx_levels(16, 32, src + 16 * ib, L + 16 * ib);
		const float max_scale = largest_magnitude(scales, 16);
		if (fabsf(max_scale) < GROUP_MAX_EPS) {
			memset(dst, 0, 210);
			continue;
		}
		float iscale = -128.0f / max_scale;
		st_f16(dst + 208, 1 / iscale);
		for (int ib = 0; ib < 16; ib++) {
			int v = near_int(iscale * scales[ib]);
			sc[ib] = (int8_t)(v > 127 ? 127 : v);
		}
		const float d0 = ld_f16(dst + 208);
		for (int j = 0; j < 16; j++) {
			const float d = d0 * sc[j];
			if (d == 0.0f)
				continue;
			for (int i = 0; i < 16; i++)
				L[16 * j + i] = (uint8_t)(32 + clampi(near_int(src[16 * j + i] / d), -32, 31));
		}
		uint8_t *ql = dst, *qh = dst + 128;
		for (int half = 0; half < 2; half++, ql += 64, qh += 32) {
			const uint8_t *Lh = L + 128 * half;
			for (int l = 0; l < 32; l++) {
				ql[l] = (uint8_t)((Lh[l] & 15) | (Lh[l + 64] & 15) << 4);
				ql[l + 32] = (uint8_t)((Lh[l + 32] & 15) | (Lh[l + 96] & 15) << 4);
				qh[l] = (uint8_t)(Lh[l] >> 4 | (Lh[l + 32] >> 4) << 2 | (Lh[l + 64] >> 4) << 4 |
						  (Lh[l + 96] >> 4) << 6);
			}
		}
	}
}

/* Indexed by ggml type number; block sizes as in ggml's type traits. */
static const kvt_ggml_traits ggml_types[] = {
	[KVT_GGML_F32] = { "F32", 1, 4, dq_f32, q_f32 },
	[KVT_GGML_F16] = { "F16", 1, 2, dq_f16, q_f16 },
	[KVT_GGML_Q4_0] = { "Q4_0", 32, 18, dq_q4_0, q_q4_0 },
	[KVT_GGML_Q4_1] = { "Q4_1", 32, 20, dq_q4_1, q_q4_1 },
	[KVT_GGML_Q5_0] = { "Q5_0", 32, 22, dq_q5_0, q_q5_0 },
	[KVT_GGML_Q5_1] = { "Q5_1", 32, 24, NULL, NULL },
	[KVT_GGML_Q8_0] = { "Q8_0", 32, 34, dq_q8_0, q_q8_0 },
	[KVT_GGML_Q8_1] = { "Q8_1", 32, 36, NULL, NULL },
	[KVT_GGML_Q2_K] = { "Q2_K", 256, 84, NULL, NULL },
	[KVT_GGML_Q3_K] = { "Q3_K", 256, 110, NULL, NULL },
	[KVT_GGML_Q4_K] = { "Q4_K", 256, 144, dq_q4_k, q_q4_k },
	[KVT_GGML_Q5_K] = { "Q5_K", 256, 176, dq_q5_k, q_q5_k },
	[KVT_GGML_Q6_K] = { "Q6_K", 256, 210, dq_q6_k, q_q6_k },
	[KVT_GGML_Q8_K] = { "Q8_K", 256, 292, NULL, NULL },
	[16] = { "IQ2_XXS", 256, 66, NULL, NULL },
	[17] = { "IQ2_XS", 256, 74, NULL, NULL },
	[18] = { "IQ3_XXS", 256, 98, NULL, NULL },
	[19] = { "IQ1_S", 256, 50, NULL, NULL },
	[20] = { "IQ4_NL", 32, 18, NULL, NULL },
	[21] = { "IQ3_S", 256, 110, NULL, NULL },
	[22] = { "IQ2_S", 256, 82, NULL, NULL },
	[23] = { "IQ4_XS", 256, 136, NULL, NULL },
	[24] = { "I8", 1, 1, NULL, NULL },
	[25] = { "I16", 1, 2, NULL, NULL },
	[26] = { "I32", 1, 4, NULL, NULL },
	[27] = { "I64", 1, 8, NULL, NULL },
	[28] = { "F64", 1, 8, NULL, NULL },
	[29] = { "IQ1_M", 256, 56, NULL, NULL },
	[KVT_GGML_BF16] = { "BF16", 1, 2, dq_bf16, q_bf16 },
	[34] = { "TQ1_0", 256, 54, NULL, NULL },
	[35] = { "TQ2_0", 256, 66, NULL, NULL },
	[39] = { "MXFP4", 32, 17, NULL, NULL },
};
#define N_GGML_TYPES (sizeof(ggml_types) / sizeof(ggml_types[0]))

const kvt_ggml_traits *kvt_ggml_traits_of(uint32_t type)
{
	if (type >= N_GGML_TYPES || !ggml_types[type].name)
		return NULL;
	return &ggml_types[type];
}

const char *kvt_ggml_type_name(uint32_t type)
{
	/* NOTE: unknown numbers are formatted into a per-thread buffer that the next call reuses. */
	static _Thread_local char buf[24];
	const kvt_ggml_traits *ti = kvt_ggml_traits_of(type);

	if (ti)
		return ti->name;
	snprintf(buf, sizeof(buf), "type%u", type);
	return buf;
}

bool kvt_ggml_type_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes)
{
	const kvt_ggml_traits *ti = kvt_ggml_traits_of(type);

	if (!ti)
		return false;
	*block_elems = ti->block_elems;
	*block_bytes = ti->block_bytes;
	return true;
}

bool kvt_ggml_type_supported(uint32_t type)
{
	const kvt_ggml_traits *ti = kvt_ggml_traits_of(type);

	return ti && ti->dequant;
}

int kvt_ggml_dequantize(uint32_t type, const void *src, float *dst, uint64_t n)
{
	const kvt_ggml_traits *ti = kvt_ggml_traits_of(type);

	if (!ti || !ti->dequant) {
		KVT_LOGE("dequantize: type %s is not supported", kvt_ggml_type_name(type));
		return KVT_EUNSUPPORTED;
	}
	if (n % ti->block_elems) {
		KVT_LOGE("dequantize: %llu elements is not a multiple of the %s block size %u",
			 (unsigned long long)n, ti->name, ti->block_elems);
		return KVT_EINVAL;
	}
	ti->dequant(src, dst, n / ti->block_elems);
	return KVT_OK;
}

int kvt_ggml_quantize(uint32_t type, const float *src, void *dst, uint64_t n)
{
	const kvt_ggml_traits *ti = kvt_ggml_traits_of(type);

	if (!ti || !ti->quant) {
		KVT_LOGE("quantize: type %s is not supported", kvt_ggml_type_name(type));
		return KVT_EUNSUPPORTED;
	}
	if (n % ti->block_elems) {
		KVT_LOGE("quantize: %llu elements is not a multiple of the %s block size %u",
			 (unsigned long long)n, ti->name, ti->block_elems);
		return KVT_EINVAL;
	}
	/* Block formats have no encoding for Inf/NaN; plain float formats keep them. */
	if (ti->block_elems > 1) {
		for (uint64_t i = 0; i < n; i++) {
			if (!isfinite(src[i])) {
				KVT_LOGE("quantize: element %llu is not finite (%g); %s cannot encode it",
					 (unsigned long long)i, (double)src[i], ti->name);
				return KVT_EINVAL;
			}
		}
	}
	ti->quant(src, dst, n / ti->block_elems);
	return KVT_OK;
}
