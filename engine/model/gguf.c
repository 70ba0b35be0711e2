/*
 * engine/model/gguf.c — the GGUF reader (v2, v3), ggml block (de)quantization and
 * the GGUF writer.
 *
 * Reading is two passes over the read-only mapping. The first pass walks the
 * header, every key/value and every tensor info with bounds checks and counts
 * what must be allocated; nothing is allocated from a count the file states,
 * only from what the first pass actually found. The second pass walks the same
 * bytes again and fills the arrays; it cannot fail except for ENOMEM. Then the
 * semantic checks run over the filled arrays: duplicate keys and tensor names
 * (hash indexes, so they stay linear in the number of names),
 * general.alignment, tensor offsets (aligned, inside the file) and overlap.
 *
 * Invariants after a successful kvt_gguf_open() or kvt_gguf_open_mem():
 *  - every kvt_gguf_str, numeric array and tensor data range lies inside the
 *    mapping;
 *  - every tensor has a known ggml type, 1..4 dims, ne[0] a multiple of the
 *    type's block, n_elems and n_bytes without overflow, an offset that is a
 *    multiple of the alignment, and no two tensors' bytes overlap;
 *  - keys are non-empty and unique, tensor names are non-empty and unique.
 *
 * Decision on ne == 0: accepted (llama.cpp accepts empty tensors). Such a
 * tensor has n_elems == 0 and n_bytes == 0, overlaps nothing, and
 * kvt_gguf_tensor_to_f32() writes nothing. Its offset must still be aligned
 * and inside the data section.
 *
 * Nested arrays are allowed by the GGUF spec but used by no writer we know of;
 * they are reported as KVT_EUNSUPPORTED. Tensor type numbers ggml does not
 * define (or no longer sizes, like 4 and 5) are corrupt; every type ggml
 * sizes opens, and only kvt_gguf_tensor_to_f32() refuses the ones without a
 * dequantizer here (Q5_1, Q2_K, Q3_K, IQ*, ...).
 *
 * The quantizers follow ggml's reference ("_ref") quantizers' arithmetic
 * operation for operation, so a tensor quantized here has the bytes llama.cpp
 * would write for the same floats (the K-quants with no importance matrix).
 * NOTE: that takes every fp32 product rounded on its own: this file is built
 * with -ffp-contract=off (CMakeLists.txt), since a fused multiply-add in the
 * K-quants' least-squares fits moves a few scales by one step. The file format and the block layouts are
 * little-endian; so is every host we build for (checked below).
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian GGUF files in place and needs a little-endian host"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_HEADER_BYTES 24 /* magic, version, n_tensors, n_kv */
/* Smallest encodings, used to bound counts by the bytes that remain. */
#define GGUF_MIN_KV_BYTES 14 /* key length 8 + key byte 1 + type 4 + 1-byte value */
#define GGUF_MIN_TI_BYTES 32 /* name length 8 + n_dims 4 + ne 8 + type 4 + offset 8 */
#define NAME_SHOW_MAX 64     /* bytes of a key or tensor name quoted in a log line */

/* ------------------------------------------------------------------------ */
/* ggml types                                                                */

typedef void (*dequant_fn)(const uint8_t *src, float *dst, uint64_t n_blocks);
typedef void (*quant_fn)(const float *src, uint8_t *dst, uint64_t n_blocks);

typedef struct ggml_type_info {
	const char *name;     /* "Q4_1"; NULL: no such type number */
	uint32_t block_elems; /* elements per block */
	uint32_t block_bytes; /* bytes per block */
	dequant_fn dequant;   /* NULL: cannot be loaded */
	quant_fn quant;       /* NULL: cannot be written from floats */
} ggml_type_info;

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
static const ggml_type_info ggml_types[] = {
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

static const ggml_type_info *ggml_type(uint32_t type)
{
	if (type >= N_GGML_TYPES || !ggml_types[type].name)
		return NULL;
	return &ggml_types[type];
}

const char *kvt_ggml_type_name(uint32_t type)
{
	/* NOTE: unknown numbers are formatted into a per-thread buffer that the next call reuses. */
	static _Thread_local char buf[24];
	const ggml_type_info *ti = ggml_type(type);

	if (ti)
		return ti->name;
	snprintf(buf, sizeof(buf), "type%u", type);
	return buf;
}

const char *kvt_gguf_type_name(uint32_t type)
{
	static const char *const names[KVT_GGUF_N_TYPES] = {
		"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
		"BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64",
	};
	static _Thread_local char buf[24];

	if (type < KVT_GGUF_N_TYPES)
		return names[type];
	snprintf(buf, sizeof(buf), "type%u", type);
	return buf;
}

bool kvt_ggml_type_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes)
{
	const ggml_type_info *ti = ggml_type(type);

	if (!ti)
		return false;
	*block_elems = ti->block_elems;
	*block_bytes = ti->block_bytes;
	return true;
}

bool kvt_ggml_type_supported(uint32_t type)
{
	const ggml_type_info *ti = ggml_type(type);

	return ti && ti->dequant;
}

/* Dequantize n_blocks whole blocks of a supported type. */
static void dequant_blocks(const ggml_type_info *ti, const uint8_t *src, float *dst, uint64_t n_blocks)
{
	ti->dequant(src, dst, n_blocks);
}

int kvt_ggml_dequantize(uint32_t type, const void *src, float *dst, uint64_t n)
{
	const ggml_type_info *ti = ggml_type(type);

	if (!ti || !ti->dequant) {
		KVT_LOGE("dequantize: type %s is not supported", kvt_ggml_type_name(type));
		return KVT_EUNSUPPORTED;
	}
	if (n % ti->block_elems) {
		KVT_LOGE("dequantize: %llu elements is not a multiple of the %s block size %u",
			 (unsigned long long)n, ti->name, ti->block_elems);
		return KVT_EINVAL;
	}
	dequant_blocks(ti, src, dst, n / ti->block_elems);
	return KVT_OK;
}

int kvt_ggml_quantize(uint32_t type, const float *src, void *dst, uint64_t n)
{
	const ggml_type_info *ti = ggml_type(type);

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

/* ------------------------------------------------------------------------ */
/* the reader                                                                */

struct kvt_gguf {
	char *path;                 /* owned copy, for messages */
	const uint8_t *map;         /* the whole file: read-only mapping, or the caller's buffer; NULL when empty */
	bool owns_map;              /* map is our mmap (kvt_gguf_open), not borrowed (kvt_gguf_open_mem) */
	uint64_t size;              /* file bytes */
	uint32_t version;           /* 2 or 3 */
	uint64_t alignment;         /* general.alignment or 32; a power of two */
	uint64_t off_data;          /* file offset of the data section (aligned) */
	uint64_t n_kv;              /* entries in kvs */
	kvt_gguf_kv *kvs;           /* [n_kv], in file order */
	uint64_t n_tensors;         /* entries in tensors */
	kvt_gguf_tensor *tensors;   /* [n_tensors], in file order */
	kvt_gguf_str *strs;         /* every string-array element, carved into kvs[i].v.arr.strs */
	uint64_t *kv_slots;         /* key hash index: kv index + 1, 0 empty; kv_mask + 1 slots */
	uint64_t kv_mask;           /* slots - 1 (a power of two minus one) */
	uint64_t *t_slots;          /* tensor name hash index, as kv_slots */
	uint64_t t_mask;            /* slots - 1 */
};

enum parse_sect { SECT_HEADER, SECT_KV, SECT_TI };

typedef struct parser {
	const char *path;     /* for messages */
	const uint8_t *base;  /* the mapping */
	uint64_t size;        /* file bytes */
	uint64_t pos;         /* cursor: next byte to read */
	kvt_gguf *g;          /* NULL in the validating pass; the arrays to fill in the second */
	int sect;             /* enum parse_sect: where the cursor is, for messages */
	uint64_t idx;         /* kv or tensor info index within sect */
	kvt_gguf_str name;    /* key or tensor name once read (len 0 before) */
	uint64_t n_strs;      /* string-array elements seen so far */
	uint32_t version;     /* from the header */
} parser;

/* Quote up to NAME_SHOW_MAX bytes of a name, replacing control bytes, into buf. */
static const char *show_name(char *buf, size_t cap, const char *s, uint64_t len)
{
	size_t n = len < NAME_SHOW_MAX ? (size_t)len : NAME_SHOW_MAX;
	size_t o = 0;

	for (size_t i = 0; i < n && o + 1 < cap; i++) {
		unsigned char c = (unsigned char)s[i];
		buf[o++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	if (n < len && o + 4 < cap) {
		memcpy(buf + o, "...", 3);
		o += 3;
	}
	buf[o] = '\0';
	return buf;
}

/* "kv 3 (general.name)", "tensor info 12 (blk.0.attn_q.weight)" or "header". */
static const char *where(const parser *p, char *buf, size_t cap)
{
	char name[NAME_SHOW_MAX + 8];
	const char *sect = p->sect == SECT_KV ? "kv" : "tensor info";

	if (p->sect == SECT_HEADER)
		snprintf(buf, cap, "header");
	else if (p->name.len)
		snprintf(buf, cap, "%s %llu (%s)", sect, (unsigned long long)p->idx,
			 show_name(name, sizeof(name), p->name.ptr, p->name.len));
	else
		snprintf(buf, cap, "%s %llu", sect, (unsigned long long)p->idx);
	return buf;
}

#define NO_IDX UINT64_MAX

/* "what" or "what 17": the field being read, with an element index when one applies. */
static const char *field(char *buf, size_t cap, const char *what, uint64_t idx)
{
	if (idx == NO_IDX)
		snprintf(buf, cap, "%s", what);
	else
		snprintf(buf, cap, "%s %llu", what, (unsigned long long)idx);
	return buf;
}

/* Check that n bytes remain at the cursor; log a truncation naming the field if not. */
static int need_i(parser *p, uint64_t n, const char *what, uint64_t idx)
{
	char w[128], f[64];

	if (p->size - p->pos >= n)
		return KVT_OK;
	KVT_LOGE("%s: truncated: %s: %s needs %llu bytes at offset %llu, file has %llu bytes",
		 p->path, where(p, w, sizeof(w)), field(f, sizeof(f), what, idx), (unsigned long long)n,
		 (unsigned long long)p->pos, (unsigned long long)p->size);
	return KVT_ECORRUPT;
}

static int need(parser *p, uint64_t n, const char *what)
{
	return need_i(p, n, what, NO_IDX);
}

static int rd_u32(parser *p, uint32_t *v, const char *what)
{
	int rc = need(p, 4, what);

	if (rc == KVT_OK) {
		memcpy(v, p->base + p->pos, 4);
		p->pos += 4;
	}
	return rc;
}

static int rd_u64(parser *p, uint64_t *v, const char *what)
{
	int rc = need(p, 8, what);

	if (rc == KVT_OK) {
		memcpy(v, p->base + p->pos, 8);
		p->pos += 8;
	}
	return rc;
}

/* A gguf string (u64 length + bytes, the bytes inside the file); idx names an array element. */
static int rd_str(parser *p, kvt_gguf_str *s, const char *what, uint64_t idx)
{
	char w[128], f[64];
	uint64_t len, at = p->pos;
	int rc = need_i(p, 8, what, idx);

	if (rc)
		return rc;
	memcpy(&len, p->base + p->pos, 8);
	p->pos += 8;
	if (len > p->size - p->pos) {
		KVT_LOGE("%s: truncated: %s: %s length %llu at offset %llu exceeds the %llu bytes left in the file",
			 p->path, where(p, w, sizeof(w)), field(f, sizeof(f), what, idx), (unsigned long long)len,
			 (unsigned long long)at, (unsigned long long)(p->size - p->pos));
		return KVT_ECORRUPT;
	}
	s->ptr = (const char *)p->base + p->pos;
	s->len = len;
	p->pos += len;
	return KVT_OK;
}

static uint32_t gguf_scalar_bytes(uint32_t type)
{
	switch (type) {
	case KVT_GGUF_UINT8: case KVT_GGUF_INT8: case KVT_GGUF_BOOL: return 1;
	case KVT_GGUF_UINT16: case KVT_GGUF_INT16: return 2;
	case KVT_GGUF_UINT32: case KVT_GGUF_INT32: case KVT_GGUF_FLOAT32: return 4;
	case KVT_GGUF_UINT64: case KVT_GGUF_INT64: case KVT_GGUF_FLOAT64: return 8;
	}
	return 0; /* STRING, ARRAY: variable */
}

static bool gguf_type_is_int(uint32_t type)
{
	switch (type) {
	case KVT_GGUF_UINT8: case KVT_GGUF_INT8: case KVT_GGUF_UINT16: case KVT_GGUF_INT16:
	case KVT_GGUF_UINT32: case KVT_GGUF_INT32: case KVT_GGUF_UINT64: case KVT_GGUF_INT64:
		return true;
	}
	return false;
}

static bool gguf_type_is_signed(uint32_t type)
{
	return type == KVT_GGUF_INT8 || type == KVT_GGUF_INT16 || type == KVT_GGUF_INT32 ||
	       type == KVT_GGUF_INT64;
}

/* Widen one little-endian scalar of a fixed-size type into the kv union. */
static void load_scalar(kvt_gguf_kv *kv, uint32_t type, const uint8_t *p)
{
	switch (type) {
	case KVT_GGUF_UINT8: kv->v.u64 = p[0]; break;
	case KVT_GGUF_INT8: kv->v.i64 = (int8_t)p[0]; break;
	case KVT_GGUF_BOOL: kv->v.b = p[0] != 0; break;
	case KVT_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u64 = x; break; }
	case KVT_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i64 = x; break; }
	case KVT_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u64 = x; break; }
	case KVT_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i64 = x; break; }
	case KVT_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f64 = x; break; }
	case KVT_GGUF_UINT64: memcpy(&kv->v.u64, p, 8); break;
	case KVT_GGUF_INT64: memcpy(&kv->v.i64, p, 8); break;
	case KVT_GGUF_FLOAT64: memcpy(&kv->v.f64, p, 8); break;
	}
}

static int check_bools(parser *p, const uint8_t *v, uint64_t n, uint64_t at)
{
	char w[128];

	for (uint64_t i = 0; i < n; i++) {
		if (v[i] > 1) {
			KVT_LOGE("%s: %s: bool value %u at offset %llu (expected 0 or 1)", p->path,
				 where(p, w, sizeof(w)), v[i], (unsigned long long)(at + i));
			return KVT_ECORRUPT;
		}
	}
	return KVT_OK;
}

/* One metadata key/value at the cursor; fills *kv when kv is not NULL. */
static int parse_kv(parser *p, kvt_gguf_kv *kv)
{
	char w[128];
	kvt_gguf_str key;
	uint32_t type;
	uint64_t at;
	int rc;

	p->name.len = 0;
	at = p->pos;
	if ((rc = rd_str(p, &key, "key", NO_IDX)))
		return rc;
	if (key.len == 0) {
		KVT_LOGE("%s: %s: empty key at offset %llu", p->path, where(p, w, sizeof(w)),
			 (unsigned long long)at);
		return KVT_ECORRUPT;
	}
	p->name = key;
	at = p->pos;
	if ((rc = rd_u32(p, &type, "value type")))
		return rc;
	if (type >= KVT_GGUF_N_TYPES) {
		KVT_LOGE("%s: %s: bad value type %u at offset %llu (expected 0..%d)", p->path,
			 where(p, w, sizeof(w)), type, (unsigned long long)at, KVT_GGUF_N_TYPES - 1);
		return KVT_ECORRUPT;
	}
	if (kv) {
		memset(kv, 0, sizeof(*kv));
		kv->key = key;
		kv->type = type;
		kv->n = 1;
	}
	if (type == KVT_GGUF_STRING) {
		kvt_gguf_str s;
		if ((rc = rd_str(p, &s, "string value", NO_IDX)))
			return rc;
		if (kv)
			kv->v.str = s;
		return KVT_OK;
	}
	if (type != KVT_GGUF_ARRAY) {
		uint32_t nb = gguf_scalar_bytes(type);
		if ((rc = need(p, nb, kvt_gguf_type_name(type))))
			return rc;
		if (type == KVT_GGUF_BOOL && (rc = check_bools(p, p->base + p->pos, 1, p->pos)))
			return rc;
		if (kv)
			load_scalar(kv, type, p->base + p->pos);
		p->pos += nb;
		return KVT_OK;
	}

	uint32_t elem;
	uint64_t n;
	at = p->pos;
	if ((rc = rd_u32(p, &elem, "array element type")))
		return rc;
	if (elem >= KVT_GGUF_N_TYPES) {
		KVT_LOGE("%s: %s: bad array element type %u at offset %llu (expected 0..%d)", p->path,
			 where(p, w, sizeof(w)), elem, (unsigned long long)at, KVT_GGUF_N_TYPES - 1);
		return KVT_ECORRUPT;
	}
	if (elem == KVT_GGUF_ARRAY) {
		KVT_LOGE("%s: %s: array of arrays at offset %llu is not supported", p->path,
			 where(p, w, sizeof(w)), (unsigned long long)at);
		return KVT_EUNSUPPORTED;
	}
	at = p->pos;
	if ((rc = rd_u64(p, &n, "array count")))
		return rc;
	/* Every string element takes at least its 8-byte length. */
	uint64_t min_elem = elem == KVT_GGUF_STRING ? 8 : gguf_scalar_bytes(elem);
	uint64_t left = p->size - p->pos;
	if (n > left / min_elem) {
		KVT_LOGE("%s: %s: array count %llu at offset %llu is more than the %llu bytes left can hold "
			 "(%s elements of at least %llu bytes)", p->path, where(p, w, sizeof(w)),
			 (unsigned long long)n, (unsigned long long)at, (unsigned long long)left,
			 kvt_gguf_type_name(elem), (unsigned long long)min_elem);
		return KVT_ECORRUPT;
	}
	if (kv) {
		kv->arr_type = elem;
		kv->n = n;
	}
	if (elem != KVT_GGUF_STRING) {
		if (elem == KVT_GGUF_BOOL && (rc = check_bools(p, p->base + p->pos, n, p->pos)))
			return rc;
		if (kv)
			kv->v.arr.data = p->base + p->pos;
		p->pos += n * min_elem;
		return KVT_OK;
	}
	if (kv)
		kv->v.arr.strs = n ? p->g->strs + p->n_strs : NULL;
	for (uint64_t i = 0; i < n; i++) {
		kvt_gguf_str s;
		if ((rc = rd_str(p, &s, "array string", i)))
			return rc;
		if (kv)
			kv->v.arr.strs[i] = s;
	}
	p->n_strs += n;
	return KVT_OK;
}

/* One tensor info at the cursor; fills *t (without data/offset checks) when t is not NULL. */
static int parse_tensor_info(parser *p, kvt_gguf_tensor *t)
{
	char w[128];
	kvt_gguf_str name;
	uint32_t n_dims, type;
	uint64_t ne[KVT_GGUF_MAX_DIMS] = { 1, 1, 1, 1 };
	uint64_t off, at, n_elems = 1, n_bytes;
	int rc;

	p->name.len = 0;
	at = p->pos;
	if ((rc = rd_str(p, &name, "name", NO_IDX)))
		return rc;
	if (name.len == 0) {
		KVT_LOGE("%s: %s: empty tensor name at offset %llu", p->path, where(p, w, sizeof(w)),
			 (unsigned long long)at);
		return KVT_ECORRUPT;
	}
	p->name = name;
	at = p->pos;
	if ((rc = rd_u32(p, &n_dims, "n_dims")))
		return rc;
	if (n_dims < 1 || n_dims > KVT_GGUF_MAX_DIMS) {
		KVT_LOGE("%s: %s: n_dims %u at offset %llu (expected 1..%d)", p->path,
			 where(p, w, sizeof(w)), n_dims, (unsigned long long)at, KVT_GGUF_MAX_DIMS);
		return KVT_ECORRUPT;
	}
	for (uint32_t d = 0; d < n_dims; d++) {
		at = p->pos;
		if ((rc = need_i(p, 8, "ne", d)))
			return rc;
		memcpy(&ne[d], p->base + p->pos, 8);
		p->pos += 8;
		/* ggml keeps ne as int64_t. */
		if (ne[d] > (uint64_t)INT64_MAX) {
			KVT_LOGE("%s: %s: ne[%u] = %llu at offset %llu exceeds INT64_MAX", p->path,
				 where(p, w, sizeof(w)), d, (unsigned long long)ne[d], (unsigned long long)at);
			return KVT_ECORRUPT;
		}
	}
	for (uint32_t d = 0; d < n_dims; d++) {
		if (!kvt_mul_u64(n_elems, ne[d], &n_elems) || n_elems > (uint64_t)INT64_MAX) {
			KVT_LOGE("%s: %s: element count overflows (ne = [%llu, %llu, %llu, %llu])", p->path,
				 where(p, w, sizeof(w)), (unsigned long long)ne[0], (unsigned long long)ne[1],
				 (unsigned long long)ne[2], (unsigned long long)ne[3]);
			return KVT_ECORRUPT;
		}
	}
	at = p->pos;
	if ((rc = rd_u32(p, &type, "type")))
		return rc;
	const ggml_type_info *ti = ggml_type(type);
	if (!ti) {
		KVT_LOGE("%s: %s: unknown ggml type %u at offset %llu", p->path, where(p, w, sizeof(w)),
			 type, (unsigned long long)at);
		return KVT_ECORRUPT;
	}
	if (ne[0] % ti->block_elems) {
		KVT_LOGE("%s: %s: ne[0] = %llu is not a multiple of the %s block size %u", p->path,
			 where(p, w, sizeof(w)), (unsigned long long)ne[0], ti->name, ti->block_elems);
		return KVT_ECORRUPT;
	}
	if (!kvt_mul_u64(n_elems / ti->block_elems, ti->block_bytes, &n_bytes)) {
		KVT_LOGE("%s: %s: byte size overflows (%llu elements of %s)", p->path,
			 where(p, w, sizeof(w)), (unsigned long long)n_elems, ti->name);
		return KVT_ECORRUPT;
	}
	if ((rc = rd_u64(p, &off, "offset")))
		return rc;
	if (t) {
		memset(t, 0, sizeof(*t));
		t->name = name;
		t->n_dims = n_dims;
		memcpy(t->ne, ne, sizeof(ne));
		t->type = type;
		t->off_data = off;
		t->n_elems = n_elems;
		t->n_bytes = n_bytes;
	}
	return KVT_OK;
}

/* Walk header, kvs and tensor infos; the first pass (p->g == NULL) validates and counts. */
static int parse(parser *p, uint64_t *n_tensors, uint64_t *n_kv)
{
	uint32_t version;
	int rc;

	p->pos = 0;
	p->sect = SECT_HEADER;
	p->name.len = 0;
	p->n_strs = 0;
	if ((rc = need(p, 4, "magic")))
		return rc;
	if (memcmp(p->base, GGUF_MAGIC, 4) != 0) {
		char m[8];
		KVT_LOGE("%s: bad magic \"%s\" (%02x %02x %02x %02x) at offset 0 (expected \"GGUF\"): not a GGUF file",
			 p->path, show_name(m, sizeof(m), (const char *)p->base, 4), p->base[0], p->base[1],
			 p->base[2], p->base[3]);
		return KVT_ECORRUPT;
	}
	p->pos = 4;
	if ((rc = rd_u32(p, &version, "version")))
		return rc;
	p->version = version;
	if (version != 2 && version != 3) {
		if (__builtin_bswap32(version) >= 1 && __builtin_bswap32(version) <= 3)
			KVT_LOGE("%s: version %u at offset 4 is a big-endian GGUF (v%u), which is not supported",
				 p->path, version, __builtin_bswap32(version));
		else
			KVT_LOGE("%s: version %u at offset 4 is not supported (expected 2 or 3)", p->path, version);
		return KVT_EUNSUPPORTED;
	}
	if ((rc = rd_u64(p, n_tensors, "n_tensors")) || (rc = rd_u64(p, n_kv, "n_kv")))
		return rc;
	uint64_t left = p->size - p->pos;
	if (*n_tensors > left / GGUF_MIN_TI_BYTES) {
		KVT_LOGE("%s: n_tensors %llu at offset 8 is more than the %llu bytes left can hold "
			 "(each tensor info needs at least %d bytes)", p->path, (unsigned long long)*n_tensors,
			 (unsigned long long)left, GGUF_MIN_TI_BYTES);
		return KVT_ECORRUPT;
	}
	if (*n_kv > left / GGUF_MIN_KV_BYTES) {
		KVT_LOGE("%s: n_kv %llu at offset 16 is more than the %llu bytes left can hold "
			 "(each kv needs at least %d bytes)", p->path, (unsigned long long)*n_kv,
			 (unsigned long long)left, GGUF_MIN_KV_BYTES);
		return KVT_ECORRUPT;
	}
	p->sect = SECT_KV;
	for (uint64_t i = 0; i < *n_kv; i++) {
		p->idx = i;
		if ((rc = parse_kv(p, p->g ? &p->g->kvs[i] : NULL)))
			return rc;
	}
	p->sect = SECT_TI;
	for (uint64_t i = 0; i < *n_tensors; i++) {
		p->idx = i;
		if ((rc = parse_tensor_info(p, p->g ? &p->g->tensors[i] : NULL)))
			return rc;
	}
	return KVT_OK;
}

/* FNV-1a over a name's bytes. */
static uint64_t hash_name(const char *s, uint64_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (uint64_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
	return h;
}

static bool str_eq(kvt_gguf_str a, const char *b, uint64_t b_len)
{
	return a.len == b_len && memcmp(a.ptr, b, b_len) == 0;
}

/* Slots for n names: a power of two at least 2n (load factor <= 1/2). */
static int index_alloc(uint64_t n, uint64_t **slots, uint64_t *mask)
{
	uint64_t cap = 8;

	while (cap < 2 * n)
		cap *= 2;
	*slots = calloc(cap, sizeof(**slots));
	if (!*slots)
		return KVT_ENOMEM;
	*mask = cap - 1;
	return KVT_OK;
}

/*
 * Insert name i, unless an equal name is there: then return its index + 1
 * (0 when inserted). names(j) is the j-th name.
 */
static uint64_t index_insert(uint64_t *slots, uint64_t mask, uint64_t i, kvt_gguf_str name,
			     const kvt_gguf_str *(*names)(const kvt_gguf *, uint64_t), const kvt_gguf *g)
{
	for (uint64_t s = hash_name(name.ptr, name.len) & mask;; s = (s + 1) & mask) {
		if (!slots[s]) {
			slots[s] = i + 1;
			return 0;
		}
		if (str_eq(*names(g, slots[s] - 1), name.ptr, name.len))
			return slots[s];
	}
}

static uint64_t index_find(const uint64_t *slots, uint64_t mask, const char *name, uint64_t len,
			   const kvt_gguf_str *(*names)(const kvt_gguf *, uint64_t), const kvt_gguf *g)
{
	if (!slots)
		return 0;
	for (uint64_t s = hash_name(name, len) & mask; slots[s]; s = (s + 1) & mask) {
		if (str_eq(*names(g, slots[s] - 1), name, len))
			return slots[s];
	}
	return 0;
}

static const kvt_gguf_str *kv_key(const kvt_gguf *g, uint64_t i)
{
	return &g->kvs[i].key;
}

static const kvt_gguf_str *tensor_name(const kvt_gguf *g, uint64_t i)
{
	return &g->tensors[i].name;
}

typedef struct tensor_span {
	uint64_t off;  /* offset in the data section */
	uint64_t end;  /* off + n_bytes */
	uint64_t idx;  /* tensor index */
} tensor_span;

static int span_cmp(const void *a, const void *b)
{
	const tensor_span *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off ? 1 : 0;
}

/* Duplicates, alignment, tensor ranges and overlap, over the filled arrays. */
static int check_semantics(kvt_gguf *g, uint64_t off_infos_end)
{
	char a[NAME_SHOW_MAX + 8], b[NAME_SHOW_MAX + 8];
	int rc;

	if ((rc = index_alloc(g->n_kv, &g->kv_slots, &g->kv_mask)))
		return rc;
	for (uint64_t i = 0; i < g->n_kv; i++) {
		uint64_t dup = index_insert(g->kv_slots, g->kv_mask, i, g->kvs[i].key, kv_key, g);
		if (dup) {
			KVT_LOGE("%s: duplicate key '%s' (kv %llu and kv %llu)", g->path,
				 show_name(a, sizeof(a), g->kvs[i].key.ptr, g->kvs[i].key.len),
				 (unsigned long long)(dup - 1), (unsigned long long)i);
			return KVT_ECORRUPT;
		}
	}

	g->alignment = KVT_GGUF_DEFAULT_ALIGNMENT;
	const kvt_gguf_kv *al = kvt_gguf_find_kv(g, "general.alignment");
	if (al) {
		if (al->type != KVT_GGUF_UINT32) {
			KVT_LOGE("%s: general.alignment has type %s (expected UINT32)", g->path,
				 kvt_gguf_type_name(al->type));
			return KVT_ECORRUPT;
		}
		if (al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1))) {
			KVT_LOGE("%s: general.alignment %llu is not a nonzero power of two", g->path,
				 (unsigned long long)al->v.u64);
			return KVT_ECORRUPT;
		}
		g->alignment = al->v.u64;
	}
	/* off_infos_end <= size and alignment <= 2^31, so this cannot overflow. */
	g->off_data = (off_infos_end + g->alignment - 1) & ~(g->alignment - 1);

	if ((rc = index_alloc(g->n_tensors, &g->t_slots, &g->t_mask)))
		return rc;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		uint64_t dup = index_insert(g->t_slots, g->t_mask, i, g->tensors[i].name, tensor_name, g);
		if (dup) {
			KVT_LOGE("%s: duplicate tensor name '%s' (tensor infos %llu and %llu)", g->path,
				 show_name(a, sizeof(a), g->tensors[i].name.ptr, g->tensors[i].name.len),
				 (unsigned long long)(dup - 1), (unsigned long long)i);
			return KVT_ECORRUPT;
		}
	}
	if (g->n_tensors == 0)
		return KVT_OK;

	tensor_span *spans = malloc(g->n_tensors * sizeof(*spans));
	uint64_t n_spans = 0;
	if (!spans)
		return KVT_ENOMEM;
	rc = KVT_ECORRUPT;
	uint64_t data_bytes = g->off_data <= g->size ? g->size - g->off_data : 0;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		kvt_gguf_tensor *t = &g->tensors[i];
		const char *tn = show_name(a, sizeof(a), t->name.ptr, t->name.len);
		if (t->off_data % g->alignment) {
			KVT_LOGE("%s: tensor '%s': offset %llu is not a multiple of the alignment %llu", g->path,
				 tn, (unsigned long long)t->off_data, (unsigned long long)g->alignment);
			goto out;
		}
		if (g->off_data > g->size || t->off_data > data_bytes || t->n_bytes > data_bytes - t->off_data) {
			KVT_LOGE("%s: truncated: tensor '%s': %llu bytes of %s at data offset %llu (the data section "
				 "starts at file offset %llu) run past the end of the file (%llu bytes)", g->path, tn,
				 (unsigned long long)t->n_bytes, kvt_ggml_type_name(t->type),
				 (unsigned long long)t->off_data, (unsigned long long)g->off_data,
				 (unsigned long long)g->size);
			goto out;
		}
		t->data = g->map + g->off_data + t->off_data;
		if (t->n_bytes)
			spans[n_spans++] = (tensor_span){ t->off_data, t->off_data + t->n_bytes, i };
	}
	qsort(spans, n_spans, sizeof(*spans), span_cmp);
	for (uint64_t i = 1; i < n_spans; i++) {
		if (spans[i].off < spans[i - 1].end) {
			const kvt_gguf_tensor *x = &g->tensors[spans[i - 1].idx], *y = &g->tensors[spans[i].idx];
			KVT_LOGE("%s: tensors '%s' (data offset %llu, %llu bytes) and '%s' (data offset %llu, "
				 "%llu bytes) overlap", g->path, show_name(a, sizeof(a), x->name.ptr, x->name.len),
				 (unsigned long long)x->off_data, (unsigned long long)x->n_bytes,
				 show_name(b, sizeof(b), y->name.ptr, y->name.len),
				 (unsigned long long)y->off_data, (unsigned long long)y->n_bytes);
			goto out;
		}
	}
	rc = KVT_OK;
out:
	free(spans);
	return rc;
}

/* Parse and validate g->map (g->size bytes); g->path is set. Logs once on failure. */
static int parse_all(kvt_gguf *g)
{
	/* An empty file has no mapping; point at a zero byte so the parser's base is valid. */
	static const uint8_t empty[1];
	parser p = { .path = g->path, .base = g->map ? g->map : empty, .size = g->size };
	uint64_t n_tensors, n_kv;
	int rc;

	if ((rc = parse(&p, &n_tensors, &n_kv)))
		return rc;
	uint64_t off_infos_end = p.pos;
	/* Counts below are bounded by what the first pass found in the file. */
	g->kvs = calloc(n_kv ? n_kv : 1, sizeof(*g->kvs));
	g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(*g->tensors));
	g->strs = calloc(p.n_strs ? p.n_strs : 1, sizeof(*g->strs));
	if (!g->kvs || !g->tensors || !g->strs) {
		KVT_LOGE("%s: out of memory for %llu kvs, %llu tensors, %llu strings", g->path,
			 (unsigned long long)n_kv, (unsigned long long)n_tensors, (unsigned long long)p.n_strs);
		return KVT_ENOMEM;
	}
	p.g = g;
	if ((rc = parse(&p, &g->n_tensors, &g->n_kv)))
		return rc; /* NOTE: the bytes passed the first pass; only a bug gets here */
	g->version = p.version;
	rc = check_semantics(g, off_infos_end);
	if (rc == KVT_ENOMEM)
		KVT_LOGE("%s: out of memory for the name indexes", g->path);
	return rc;
}

static kvt_gguf *gguf_alloc(const char *path)
{
	kvt_gguf *g = calloc(1, sizeof(*g));

	if (!g || !(g->path = strdup(path))) {
		KVT_LOGE("%s: out of memory", path);
		free(g);
		return NULL;
	}
	return g;
}

int kvt_gguf_open(const char *path, kvt_gguf **out)
{
	struct stat st;
	kvt_gguf *g;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		KVT_LOGE("%s: cannot open: %s", path, strerror(e));
		return e == ENOENT ? KVT_ENOTFOUND : KVT_EIO;
	}
	if (fstat(fd, &st) != 0) {
		KVT_LOGE("%s: cannot stat: %s", path, strerror(errno));
		close(fd);
		return KVT_EIO;
	}
	if (!S_ISREG(st.st_mode)) {
		KVT_LOGE("%s: cannot open: not a regular file", path);
		close(fd);
		return KVT_EIO;
	}
	if (!(g = gguf_alloc(path))) {
		close(fd);
		return KVT_ENOMEM;
	}
	g->size = (uint64_t)st.st_size;
	if (g->size) {
		void *m = mmap(NULL, (size_t)g->size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m == MAP_FAILED) {
			KVT_LOGE("%s: cannot map %llu bytes: %s", path, (unsigned long long)g->size, strerror(errno));
			close(fd);
			kvt_gguf_close(g);
			return KVT_EIO;
		}
		g->map = m;
		g->owns_map = true;
	}
	close(fd);
	if ((rc = parse_all(g))) {
		kvt_gguf_close(g);
		return rc;
	}
	*out = g;
	return KVT_OK;
}

int kvt_gguf_open_mem(const void *data, uint64_t n_bytes, const char *name, kvt_gguf **out)
{
	kvt_gguf *g = gguf_alloc(name);
	int rc;

	if (!g)
		return KVT_ENOMEM;
	g->map = n_bytes ? data : NULL;
	g->size = n_bytes;
	if ((rc = parse_all(g))) {
		kvt_gguf_close(g);
		return rc;
	}
	*out = g;
	return KVT_OK;
}

void kvt_gguf_close(kvt_gguf *g)
{
	if (!g)
		return;
	if (g->owns_map)
		munmap((void *)g->map, (size_t)g->size);
	free(g->kv_slots);
	free(g->t_slots);
	free(g->strs);
	free(g->tensors);
	free(g->kvs);
	free(g->path);
	free(g);
}

const char *kvt_gguf_path(const kvt_gguf *g)
{
	return g->path;
}

uint32_t kvt_gguf_version(const kvt_gguf *g)
{
	return g->version;
}

uint64_t kvt_gguf_alignment(const kvt_gguf *g)
{
	return g->alignment;
}

uint64_t kvt_gguf_n_kv(const kvt_gguf *g)
{
	return g->n_kv;
}

const kvt_gguf_kv *kvt_gguf_kv_at(const kvt_gguf *g, uint64_t i)
{
	return i < g->n_kv ? &g->kvs[i] : NULL;
}

const kvt_gguf_kv *kvt_gguf_find_kv(const kvt_gguf *g, const char *key)
{
	uint64_t i = index_find(g->kv_slots, g->kv_mask, key, strlen(key), kv_key, g);

	return i ? &g->kvs[i - 1] : NULL;
}

uint64_t kvt_gguf_n_tensors(const kvt_gguf *g)
{
	return g->n_tensors;
}

const kvt_gguf_tensor *kvt_gguf_tensor_at(const kvt_gguf *g, uint64_t i)
{
	return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kvt_gguf_tensor *kvt_gguf_find_tensor(const kvt_gguf *g, const char *name)
{
	uint64_t i = index_find(g->t_slots, g->t_mask, name, strlen(name), tensor_name, g);

	return i ? &g->tensors[i - 1] : NULL;
}

/* ---- typed getters ---- */

/* Log a getter type mismatch: "m.gguf: key 'x' has type STRING, expected UINT32". */
static int wrong_type(const kvt_gguf *g, const kvt_gguf_kv *kv, const char *expected)
{
	char k[NAME_SHOW_MAX + 8];

	if (kv->type == KVT_GGUF_ARRAY)
		KVT_LOGE("%s: key '%s' has type ARRAY of %s, expected %s", g->path,
			 show_name(k, sizeof(k), kv->key.ptr, kv->key.len), kvt_gguf_type_name(kv->arr_type), expected);
	else
		KVT_LOGE("%s: key '%s' has type %s, expected %s", g->path,
			 show_name(k, sizeof(k), kv->key.ptr, kv->key.len), kvt_gguf_type_name(kv->type), expected);
	return KVT_EINVAL;
}

static int does_not_fit(const kvt_gguf *g, const kvt_gguf_kv *kv, const char *expected)
{
	char k[NAME_SHOW_MAX + 8];

	if (gguf_type_is_signed(kv->type))
		KVT_LOGE("%s: key '%s': %s value %lld does not fit %s", g->path,
			 show_name(k, sizeof(k), kv->key.ptr, kv->key.len), kvt_gguf_type_name(kv->type),
			 (long long)kv->v.i64, expected);
	else if (gguf_type_is_int(kv->type))
		KVT_LOGE("%s: key '%s': %s value %llu does not fit %s", g->path,
			 show_name(k, sizeof(k), kv->key.ptr, kv->key.len), kvt_gguf_type_name(kv->type),
			 (unsigned long long)kv->v.u64, expected);
	else
		KVT_LOGE("%s: key '%s': %s value %g does not fit %s", g->path,
			 show_name(k, sizeof(k), kv->key.ptr, kv->key.len), kvt_gguf_type_name(kv->type),
			 kv->v.f64, expected);
	return KVT_EINVAL;
}

int kvt_gguf_get_u64(const kvt_gguf *g, const char *key, uint64_t *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (!gguf_type_is_int(kv->type))
		return wrong_type(g, kv, "UINT64");
	if (gguf_type_is_signed(kv->type) && kv->v.i64 < 0)
		return does_not_fit(g, kv, "UINT64");
	*out = kv->v.u64;
	return KVT_OK;
}

int kvt_gguf_get_u32(const kvt_gguf *g, const char *key, uint32_t *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (!gguf_type_is_int(kv->type))
		return wrong_type(g, kv, "UINT32");
	if ((gguf_type_is_signed(kv->type) && kv->v.i64 < 0) || kv->v.u64 > UINT32_MAX)
		return does_not_fit(g, kv, "UINT32");
	*out = (uint32_t)kv->v.u64;
	return KVT_OK;
}

int kvt_gguf_get_i64(const kvt_gguf *g, const char *key, int64_t *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (!gguf_type_is_int(kv->type))
		return wrong_type(g, kv, "INT64");
	if (!gguf_type_is_signed(kv->type) && kv->v.u64 > (uint64_t)INT64_MAX)
		return does_not_fit(g, kv, "INT64");
	*out = kv->v.i64;
	return KVT_OK;
}

int kvt_gguf_get_f32(const kvt_gguf *g, const char *key, float *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (kv->type == KVT_GGUF_FLOAT32 || kv->type == KVT_GGUF_FLOAT64) {
		if (isfinite(kv->v.f64) && fabs(kv->v.f64) > FLT_MAX)
			return does_not_fit(g, kv, "FLOAT32");
		*out = (float)kv->v.f64;
	} else if (gguf_type_is_signed(kv->type)) {
		*out = (float)kv->v.i64;
	} else if (gguf_type_is_int(kv->type)) {
		*out = (float)kv->v.u64;
	} else {
		return wrong_type(g, kv, "FLOAT32");
	}
	return KVT_OK;
}

int kvt_gguf_get_bool(const kvt_gguf *g, const char *key, bool *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (kv->type != KVT_GGUF_BOOL)
		return wrong_type(g, kv, "BOOL");
	*out = kv->v.b;
	return KVT_OK;
}

int kvt_gguf_get_str(const kvt_gguf *g, const char *key, kvt_gguf_str *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (kv->type != KVT_GGUF_STRING)
		return wrong_type(g, kv, "STRING");
	*out = kv->v.str;
	return KVT_OK;
}

int kvt_gguf_get_arr(const kvt_gguf *g, const char *key, uint32_t elem_type, const kvt_gguf_kv **out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);
	char want[48];

	if (!kv)
		return KVT_ENOTFOUND;
	if (kv->type != KVT_GGUF_ARRAY || kv->arr_type != elem_type) {
		snprintf(want, sizeof(want), "ARRAY of %s", kvt_gguf_type_name(elem_type));
		return wrong_type(g, kv, want);
	}
	*out = kv;
	return KVT_OK;
}

int64_t kvt_gguf_arr_i64(const kvt_gguf_kv *kv, uint64_t i)
{
	kvt_gguf_kv x;

	KVT_ASSERT(kv->type == KVT_GGUF_ARRAY && i < kv->n);
	KVT_ASSERT(gguf_type_is_int(kv->arr_type) || kv->arr_type == KVT_GGUF_BOOL);
	uint32_t nb = gguf_scalar_bytes(kv->arr_type);
	load_scalar(&x, kv->arr_type, (const uint8_t *)kv->v.arr.data + i * nb);
	if (kv->arr_type == KVT_GGUF_BOOL)
		return x.v.b;
	return x.v.i64; /* NOTE: UINT64 elements above INT64_MAX wrap negative */
}

double kvt_gguf_arr_f64(const kvt_gguf_kv *kv, uint64_t i)
{
	kvt_gguf_kv x;

	KVT_ASSERT(kv->type == KVT_GGUF_ARRAY && i < kv->n);
	uint32_t nb = gguf_scalar_bytes(kv->arr_type);
	KVT_ASSERT(nb != 0);
	load_scalar(&x, kv->arr_type, (const uint8_t *)kv->v.arr.data + i * nb);
	switch (kv->arr_type) {
	case KVT_GGUF_FLOAT32: case KVT_GGUF_FLOAT64: return x.v.f64;
	case KVT_GGUF_BOOL: return x.v.b;
	}
	return gguf_type_is_signed(kv->arr_type) ? (double)x.v.i64 : (double)x.v.u64;
}

int kvt_gguf_tensor_to_f32(const kvt_gguf *g, const kvt_gguf_tensor *t, float *dst)
{
	char n[NAME_SHOW_MAX + 8];
	const ggml_type_info *ti = ggml_type(t->type);

	KVT_ASSERT(t >= g->tensors && t < g->tensors + g->n_tensors);
	if (!ti->dequant) {
		KVT_LOGE("%s: %s: type %s is not supported", g->path,
			 show_name(n, sizeof(n), t->name.ptr, t->name.len), ti->name);
		return KVT_EUNSUPPORTED;
	}
	dequant_blocks(ti, t->data, dst, t->n_elems / ti->block_elems);
	return KVT_OK;
}

/* ------------------------------------------------------------------------ */
/* the writer                                                                */

typedef struct wtensor {
	char *name;                   /* owned */
	uint32_t type;                /* enum kvt_ggml_type */
	uint32_t n_dims;              /* 1..4 */
	uint64_t ne[KVT_GGUF_MAX_DIMS]; /* unused dims 1 */
	uint8_t *data;                /* owned, n_bytes */
	uint64_t n_bytes;             /* encoded size */
	uint64_t off_data;            /* offset in the data section, set by write */
} wtensor;

struct kvt_gguf_writer {
	uint8_t *kv_buf;     /* every key/value, encoded as in the file, in add order */
	size_t kv_len;       /* bytes used in kv_buf */
	size_t kv_cap;       /* bytes allocated */
	char **keys;         /* [n_kv] owned copies, for duplicate checks */
	uint64_t n_kv;       /* keys added */
	uint64_t cap_kv;     /* keys allocated */
	wtensor *tensors;    /* [n_tensors] in add order = file order */
	uint64_t n_tensors;  /* tensors added */
	uint64_t cap_tensors; /* tensors allocated */
	uint32_t alignment;  /* from add_u32("general.alignment"), else 32 */
};

int kvt_gguf_writer_create(kvt_gguf_writer **out)
{
	kvt_gguf_writer *w = calloc(1, sizeof(*w));

	if (!w) {
		KVT_LOGE("gguf writer: out of memory");
		return KVT_ENOMEM;
	}
	w->alignment = KVT_GGUF_DEFAULT_ALIGNMENT;
	*out = w;
	return KVT_OK;
}

void kvt_gguf_writer_destroy(kvt_gguf_writer *w)
{
	if (!w)
		return;
	for (uint64_t i = 0; i < w->n_kv; i++)
		free(w->keys[i]);
	for (uint64_t i = 0; i < w->n_tensors; i++) {
		free(w->tensors[i].name);
		free(w->tensors[i].data);
	}
	free(w->keys);
	free(w->tensors);
	free(w->kv_buf);
	free(w);
}

static int wbuf_put(kvt_gguf_writer *w, const void *p, size_t n)
{
	if (w->kv_cap - w->kv_len < n) {
		size_t cap = w->kv_cap ? w->kv_cap : 4096;
		while (cap - w->kv_len < n) {
			if (cap > SIZE_MAX / 2)
				return KVT_ENOMEM;
			cap *= 2;
		}
		uint8_t *nb = realloc(w->kv_buf, cap);
		if (!nb)
			return KVT_ENOMEM;
		w->kv_buf = nb;
		w->kv_cap = cap;
	}
	memcpy(w->kv_buf + w->kv_len, p, n);
	w->kv_len += n;
	return KVT_OK;
}

static int wbuf_u32(kvt_gguf_writer *w, uint32_t v)
{
	return wbuf_put(w, &v, 4);
}

static int wbuf_u64(kvt_gguf_writer *w, uint64_t v)
{
	return wbuf_put(w, &v, 8);
}

static int wbuf_str(kvt_gguf_writer *w, const char *s)
{
	size_t n = strlen(s);
	int rc = wbuf_u64(w, n);

	return rc ? rc : wbuf_put(w, s, n);
}

/*
 * Start a kv: check the key, remember it, write key and type. On failure the
 * buffer is rolled back by the caller through kv_end(w, mark, rc).
 */
static int kv_begin(kvt_gguf_writer *w, const char *key, uint32_t type, size_t *mark)
{
	int rc;

	if (!key || !*key) {
		KVT_LOGE("gguf writer: empty key");
		return KVT_EINVAL;
	}
	for (uint64_t i = 0; i < w->n_kv; i++) {
		if (strcmp(w->keys[i], key) == 0) {
			KVT_LOGE("gguf writer: duplicate key '%s'", key);
			return KVT_EINVAL;
		}
	}
	if (w->n_kv == w->cap_kv) {
		uint64_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
		char **nk = realloc(w->keys, cap * sizeof(*nk));
		if (!nk)
			goto nomem;
		w->keys = nk;
		w->cap_kv = cap;
	}
	*mark = w->kv_len;
	if ((rc = wbuf_str(w, key)) || (rc = wbuf_u32(w, type)))
		goto nomem;
	return KVT_OK;
nomem:
	KVT_LOGE("gguf writer: out of memory adding key '%s'", key);
	return KVT_ENOMEM;
}

/* Finish a kv begun with kv_begin: keep it (rc == OK) or roll the buffer back. */
static int kv_end(kvt_gguf_writer *w, const char *key, size_t mark, int rc)
{
	char *k;

	if (rc == KVT_OK && (k = strdup(key))) {
		w->keys[w->n_kv++] = k;
		return KVT_OK;
	}
	w->kv_len = mark;
	if (rc == KVT_OK || rc == KVT_ENOMEM) {
		KVT_LOGE("gguf writer: out of memory adding key '%s'", key);
		return KVT_ENOMEM;
	}
	return rc;
}

static int add_scalar(kvt_gguf_writer *w, const char *key, uint32_t type, const void *v, size_t n)
{
	size_t mark;
	int rc = kv_begin(w, key, type, &mark);

	if (rc)
		return rc;
	return kv_end(w, key, mark, wbuf_put(w, v, n));
}

int kvt_gguf_writer_add_u32(kvt_gguf_writer *w, const char *key, uint32_t v)
{
	bool is_align = key && strcmp(key, "general.alignment") == 0;

	if (is_align && (v == 0 || (v & (v - 1)))) {
		KVT_LOGE("gguf writer: general.alignment %u is not a nonzero power of two", v);
		return KVT_EINVAL;
	}
	int rc = add_scalar(w, key, KVT_GGUF_UINT32, &v, 4);
	if (rc == KVT_OK && is_align)
		w->alignment = v;
	return rc;
}

int kvt_gguf_writer_add_i32(kvt_gguf_writer *w, const char *key, int32_t v)
{
	return add_scalar(w, key, KVT_GGUF_INT32, &v, 4);
}

int kvt_gguf_writer_add_u64(kvt_gguf_writer *w, const char *key, uint64_t v)
{
	return add_scalar(w, key, KVT_GGUF_UINT64, &v, 8);
}

int kvt_gguf_writer_add_f32(kvt_gguf_writer *w, const char *key, float v)
{
	return add_scalar(w, key, KVT_GGUF_FLOAT32, &v, 4);
}

int kvt_gguf_writer_add_bool(kvt_gguf_writer *w, const char *key, bool v)
{
	uint8_t b = v ? 1 : 0;

	return add_scalar(w, key, KVT_GGUF_BOOL, &b, 1);
}

int kvt_gguf_writer_add_str(kvt_gguf_writer *w, const char *key, const char *v)
{
	size_t mark;
	int rc = kv_begin(w, key, KVT_GGUF_STRING, &mark);

	if (rc)
		return rc;
	return kv_end(w, key, mark, wbuf_str(w, v));
}

/* Array header (element type, count) then n elements of elem_bytes each. */
static int add_arr(kvt_gguf_writer *w, const char *key, uint32_t elem, const void *v, uint64_t n,
		   size_t elem_bytes)
{
	size_t mark;
	int rc = kv_begin(w, key, KVT_GGUF_ARRAY, &mark);

	if (rc)
		return rc;
	if (n > SIZE_MAX / elem_bytes)
		return kv_end(w, key, mark, KVT_ENOMEM);
	if (!(rc = wbuf_u32(w, elem)) && !(rc = wbuf_u64(w, n)))
		rc = wbuf_put(w, v, (size_t)n * elem_bytes);
	return kv_end(w, key, mark, rc);
}

int kvt_gguf_writer_add_arr_i32(kvt_gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
	return add_arr(w, key, KVT_GGUF_INT32, v, n, 4);
}

int kvt_gguf_writer_add_arr_f32(kvt_gguf_writer *w, const char *key, const float *v, uint64_t n)
{
	return add_arr(w, key, KVT_GGUF_FLOAT32, v, n, 4);
}

int kvt_gguf_writer_add_arr_str(kvt_gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
	size_t mark;
	int rc = kv_begin(w, key, KVT_GGUF_ARRAY, &mark);

	if (rc)
		return rc;
	if (!(rc = wbuf_u32(w, KVT_GGUF_STRING)))
		rc = wbuf_u64(w, n);
	for (uint64_t i = 0; i < n && rc == KVT_OK; i++)
		rc = wbuf_str(w, v[i]);
	return kv_end(w, key, mark, rc);
}

int kvt_gguf_writer_add_raw(kvt_gguf_writer *w, const char *key, uint32_t type, const void *bytes,
			    uint64_t n_bytes)
{
	size_t mark;
	int rc = kv_begin(w, key, type, &mark);

	if (rc)
		return rc;
	return kv_end(w, key, mark, n_bytes > SIZE_MAX ? KVT_ENOMEM : wbuf_put(w, bytes, (size_t)n_bytes));
}

/* Validate a tensor's name, shape and type; *n_bytes is its encoded size. */
static int tensor_check(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
			const uint64_t *ne, uint64_t *n_bytes, uint64_t *n_elems)
{
	const ggml_type_info *ti = ggml_type(type);
	uint64_t n = 1;

	if (!name || !*name) {
		KVT_LOGE("gguf writer: empty tensor name");
		return KVT_EINVAL;
	}
	for (uint64_t i = 0; i < w->n_tensors; i++) {
		if (strcmp(w->tensors[i].name, name) == 0) {
			KVT_LOGE("gguf writer: duplicate tensor name '%s'", name);
			return KVT_EINVAL;
		}
	}
	if (!ti) {
		KVT_LOGE("gguf writer: tensor '%s': unknown ggml type %u", name, type);
		return KVT_EINVAL;
	}
	if (n_dims < 1 || n_dims > KVT_GGUF_MAX_DIMS) {
		KVT_LOGE("gguf writer: tensor '%s': n_dims %u (expected 1..%d)", name, n_dims, KVT_GGUF_MAX_DIMS);
		return KVT_EINVAL;
	}
	for (uint32_t d = 0; d < n_dims; d++) {
		if (!kvt_mul_u64(n, ne[d], &n) || n > (uint64_t)INT64_MAX) {
			KVT_LOGE("gguf writer: tensor '%s': element count overflows", name);
			return KVT_EINVAL;
		}
	}
	if (ne[0] % ti->block_elems) {
		KVT_LOGE("gguf writer: tensor '%s': ne[0] = %llu is not a multiple of the %s block size %u",
			 name, (unsigned long long)ne[0], ti->name, ti->block_elems);
		return KVT_EINVAL;
	}
	if (!kvt_mul_u64(n / ti->block_elems, ti->block_bytes, n_bytes) || *n_bytes > SIZE_MAX) {
		KVT_LOGE("gguf writer: tensor '%s': byte size overflows", name);
		return KVT_EINVAL;
	}
	*n_elems = n;
	return KVT_OK;
}

/* Append a tensor whose data buffer (malloc'd, n_bytes) the writer takes over. */
static int tensor_push(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
		       const uint64_t *ne, uint8_t *data, uint64_t n_bytes)
{
	wtensor *t;
	char *nm = strdup(name);

	if (!nm)
		goto nomem;
	if (w->n_tensors == w->cap_tensors) {
		uint64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
		wtensor *nt = realloc(w->tensors, cap * sizeof(*nt));
		if (!nt)
			goto nomem;
		w->tensors = nt;
		w->cap_tensors = cap;
	}
	t = &w->tensors[w->n_tensors++];
	memset(t, 0, sizeof(*t));
	t->name = nm;
	t->type = type;
	t->n_dims = n_dims;
	for (uint32_t d = 0; d < KVT_GGUF_MAX_DIMS; d++)
		t->ne[d] = d < n_dims ? ne[d] : 1;
	t->data = data;
	t->n_bytes = n_bytes;
	return KVT_OK;
nomem:
	KVT_LOGE("gguf writer: out of memory adding tensor '%s'", name);
	free(nm);
	free(data);
	return KVT_ENOMEM;
}

int kvt_gguf_writer_add_tensor(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
			       const uint64_t *ne, const void *data, uint64_t n_bytes)
{
	uint64_t want, n_elems;
	int rc = tensor_check(w, name, type, n_dims, ne, &want, &n_elems);

	if (rc)
		return rc;
	if (n_bytes != want) {
		KVT_LOGE("gguf writer: tensor '%s': %llu bytes given, %s with %llu elements needs %llu",
			 name, (unsigned long long)n_bytes, kvt_ggml_type_name(type),
			 (unsigned long long)n_elems, (unsigned long long)want);
		return KVT_EINVAL;
	}
	uint8_t *copy = malloc(n_bytes ? (size_t)n_bytes : 1);
	if (!copy) {
		KVT_LOGE("gguf writer: out of memory for %llu bytes of tensor '%s'", (unsigned long long)n_bytes, name);
		return KVT_ENOMEM;
	}
	if (n_bytes)
		memcpy(copy, data, (size_t)n_bytes);
	return tensor_push(w, name, type, n_dims, ne, copy, n_bytes);
}

int kvt_gguf_writer_add_tensor_f32(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
				   const uint64_t *ne, const float *data)
{
	uint64_t n_bytes, n_elems;
	int rc = tensor_check(w, name, type, n_dims, ne, &n_bytes, &n_elems);

	if (rc)
		return rc;
	uint8_t *q = malloc(n_bytes ? (size_t)n_bytes : 1);
	if (!q) {
		KVT_LOGE("gguf writer: out of memory for %llu bytes of tensor '%s'", (unsigned long long)n_bytes, name);
		return KVT_ENOMEM;
	}
	if ((rc = kvt_ggml_quantize(type, data, q, n_elems))) {
		free(q);
		return rc;
	}
	return tensor_push(w, name, type, n_dims, ne, q, n_bytes);
}

/* Write n zero bytes. */
static bool put_zeros(FILE *f, uint64_t n)
{
	static const uint8_t zeros[256];

	while (n) {
		size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
		if (fwrite(zeros, 1, k, f) != k)
			return false;
		n -= k;
	}
	return true;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) & ~(a - 1);
}

int kvt_gguf_writer_write(kvt_gguf_writer *w, const char *path)
{
	uint64_t a = w->alignment, off = 0, pos;
	uint32_t version = 3;
	bool ok;
	FILE *f;

	/* Offsets first: each tensor starts aligned within the data section. */
	for (uint64_t i = 0; i < w->n_tensors; i++) {
		off = align_up(off, a);
		w->tensors[i].off_data = off;
		off += w->tensors[i].n_bytes;
	}
	f = fopen(path, "wb");
	if (!f) {
		KVT_LOGE("%s: cannot create: %s", path, strerror(errno));
		return KVT_EIO;
	}
	ok = fwrite(GGUF_MAGIC, 1, 4, f) == 4 && fwrite(&version, 4, 1, f) == 1 &&
	     fwrite(&w->n_tensors, 8, 1, f) == 1 && fwrite(&w->n_kv, 8, 1, f) == 1 &&
	     (w->kv_len == 0 || fwrite(w->kv_buf, 1, w->kv_len, f) == w->kv_len);
	pos = GGUF_HEADER_BYTES + w->kv_len;
	for (uint64_t i = 0; i < w->n_tensors && ok; i++) {
		const wtensor *t = &w->tensors[i];
		uint64_t len = strlen(t->name);
		ok = fwrite(&len, 8, 1, f) == 1 && fwrite(t->name, 1, len, f) == len &&
		     fwrite(&t->n_dims, 4, 1, f) == 1 && fwrite(t->ne, 8, t->n_dims, f) == t->n_dims &&
		     fwrite(&t->type, 4, 1, f) == 1 && fwrite(&t->off_data, 8, 1, f) == 1;
		pos += 8 + len + 4 + 8ull * t->n_dims + 4 + 8;
	}
	/* Data section: aligned start, each tensor aligned, zero padding, trailing pad too (as gguf-py). */
	ok = ok && put_zeros(f, align_up(pos, a) - pos);
	off = 0;
	for (uint64_t i = 0; i < w->n_tensors && ok; i++) {
		const wtensor *t = &w->tensors[i];
		ok = put_zeros(f, t->off_data - off) &&
		     (t->n_bytes == 0 || fwrite(t->data, 1, (size_t)t->n_bytes, f) == t->n_bytes);
		off = t->off_data + t->n_bytes;
	}
	ok = ok && put_zeros(f, align_up(off, a) - off);
	if (!ok || fflush(f) != 0) {
		KVT_LOGE("%s: write failed: %s", path, strerror(errno));
		fclose(f);
		return KVT_EIO;
	}
	if (fclose(f) != 0) {
		KVT_LOGE("%s: close failed: %s", path, strerror(errno));
		return KVT_EIO;
	}
	return KVT_OK;
}
