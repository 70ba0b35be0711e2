/*
 * gpu/cpu_fast.c — the CPU backend's fast paths (use_ref off): what the
 * daemon runs where no GPU is present.
 *
 *   - matmul: one kernel per (stored type x activation mode), mm_table: the
 *     weights read as stored by GEMVs (fp32, F16C fp16, and for the
 *     block-quantized types x rounded per block to int16, or to int8 with
 *     act_int8, see xq8), a few rows of x per weight row read; with int8 x
 *     on AVX-512 VNNI an int8 GEMM for 12 rows and more, in the GEMV's exact
 *     order. Column slices are split into tasks on 16-column boundaries.
 *   - attention on fp16 pools: blocked over KV blocks (prefill: a task per
 *     row block and KV head; decode: a task per KV head and share of its
 *     query heads), with an online softmax whose steps are fixed by absolute
 *     key position. 8-bit pools take the reference's row-by-row kernel.
 *   - the block codecs 8 values at a time (KVT_HAVE_CODEC8), giving the
 *     reference's bytes.
 *
 * Invariants: results agree with cpu_ref.c within test_dev_parity's
 * tolerances (the codecs bitwise). The order rule of dev_impl.h: a row's
 * matmul and attention results are bitwise the same whatever else shares
 * the call, the thread count, the chunk, and prefill or decode (tasks own
 * whole outputs; no sum is split by the thread count or the batch;
 * test_cpu_invariant and test_model_invariant check it).
 */
#include "cpu_int.h"

/*
 * Rows of x a GEMV kernel call multiplies by one weight row (more rows take
 * several calls; each row's result is the same in any of them).
 */
#define GEMV_MAX_ROWS 4
/*
 * How far ahead of the row being read the GEMV asks for weight bytes. A
 * decode streams every weight once per token; the hardware prefetcher alone
 * left a 1B-shaped Q8_0 decode waiting on its loads (7.3 tok/s on one thread,
 * 12.8 with 4 KiB of software prefetch and huge pages). 4 KiB is the best of
 * 0.5-16 KiB there.
 */
#define GEMV_PREFETCH_BYTES 4096

/*
 * Ask for the line GEMV_PREFETCH_BYTES past p. The kernels call it once per
 * 64 bytes or so of weights they read, so the requests keep pace with the
 * loads (a burst of a whole row's lines at once measured slower: 8.1 tok/s).
 * A prefetch past the weights' end does not fault.
 */
static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *p)
{
	__builtin_prefetch(p + GEMV_PREFETCH_BYTES, 0, 3);
}

static void f16_to_f32_row(const uint16_t *src, float *dst, size_t n)
{
	size_t i = 0;
#ifdef KVT_HAVE_F16C
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
	for (; i < n; i++)
		dst[i] = kvt_f16_to_f32(src[i]);
}

#ifdef KVT_HAVE_F16C
/* Block b of a quantized row as four vectors of 8 floats, in registers. */
static inline __attribute__((always_inline)) void unpack_block_v(int dtype, const uint8_t *row, size_t b, __m256 w[4])
{
	const __m128i low4 = _mm_set1_epi8(0x0f);
	__m128i c[4];
	__m256 vd, vm;

	if (dtype == KVT_DTYPE_Q8_0) {
		const uint8_t *blk = row + b * 34;
		vd = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)blk));
		for (int i = 0; i < 4; i++)
			w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
						     _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * i)))), vd);
		return;
	}
	const bool q41 = dtype == KVT_DTYPE_Q4_1;
	const uint8_t *blk = row + b * (q41 ? 20 : 18);
	__m128i raw = _mm_loadu_si128((const __m128i *)(blk + (q41 ? 4 : 2)));
	__m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
	c[0] = lo, c[1] = _mm_srli_si128(lo, 8), c[2] = hi, c[3] = _mm_srli_si128(hi, 8);
	vd = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)blk));
	if (q41) {
		vm = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(blk + 2)));
		for (int i = 0; i < 4; i++)
			w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c[i])), vd, vm);
	} else {
		const __m256i eight = _mm256_set1_epi32(8);
		for (int i = 0; i < 4; i++)
			w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(c[i]), eight)), vd);
	}
}
#endif

#ifndef KVT_HAVE_F16C
/* Block b of a quantized row as 32 floats. */
static void unpack_block(int dtype, const uint8_t *row, size_t b, float *out)
{
	uint16_t d16, m16 = 0;
	float d, m = 0;
	const uint8_t *q;
	int q8[KVT_QBLOCK];

	if (dtype == KVT_DTYPE_Q8_0) {
		row += b * 34;
		memcpy(&d16, row, 2);
		for (int j = 0; j < KVT_QBLOCK; j++)
			q8[j] = (int8_t)row[2 + j];
	} else {
		row += b * (dtype == KVT_DTYPE_Q4_0 ? 18 : 20);
		memcpy(&d16, row, 2);
		if (dtype == KVT_DTYPE_Q4_1)
			memcpy(&m16, row + 2, 2);
		q = row + (dtype == KVT_DTYPE_Q4_0 ? 2 : 4);
		for (int j = 0; j < 16; j++) {
			q8[j] = q[j] & 15;
			q8[j + 16] = q[j] >> 4;
		}
		if (dtype == KVT_DTYPE_Q4_0)
			for (int j = 0; j < KVT_QBLOCK; j++)
				q8[j] -= 8;
	}
	d = kvt_f16_to_f32(d16);
	m = kvt_f16_to_f32(m16);
	/* NOTE: q * d (+ m only for Q4_1), so a zero keeps its sign as in kvt_cpu_row_elem */
#ifdef KVT_HAVE_F16C
	__m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
	for (int j = 0; j < KVT_QBLOCK; j += 8) {
		__m256 vq = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(q8 + j)));
		__m256 v = dtype == KVT_DTYPE_Q4_1 ? _mm256_fmadd_ps(vq, vd, vm) : _mm256_mul_ps(vq, vd);
		_mm256_storeu_ps(out + j, v);
	}
#else
	for (int j = 0; j < KVT_QBLOCK; j++)
		out[j] = dtype == KVT_DTYPE_Q4_1 ? (float)q8[j] * d + m : (float)q8[j] * d;
#endif
}

#endif

#ifndef KVT_HAVE_F16C
/*
 * Block b of a Q5_0 row (32 floats) or of a K-quant row (a 256-element
 * superblock), the same arithmetic as kvt_cpu_row_elem, in plain loops (the AVX2
 * build has unpack_block_new_v instead).
 */
static void unpack_block_new(int dtype, const uint8_t *row, size_t b, float *out)
{
	uint16_t d16, m16;
	int sc, mn;

	if (dtype == KVT_DTYPE_Q5_0) {
		uint32_t qh;
		row += b * 22;
		memcpy(&d16, row, 2);
		memcpy(&qh, row + 2, 4);
		const float d = kvt_f16_to_f32(d16);
		for (int j = 0; j < 16; j++) {
			out[j] = d * (float)(((row[6 + j] & 15) | (int)((qh >> j) & 1) << 4) - 16);
			out[j + 16] = d * (float)(((row[6 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - 16);
		}
		return;
	}
	if (dtype == KVT_DTYPE_Q6_K) {
		const uint8_t *blk = row + b * 210;
		memcpy(&d16, blk + 208, 2);
		const float d = kvt_f16_to_f32(d16);
		for (int half = 0; half < 2; half++) {
			const uint8_t *ql = blk + 64 * half, *qh = blk + 128 + 32 * half;
			const int8_t *scl = (const int8_t *)(blk + 192 + 8 * half);
			float *o = out + 128 * half;
			for (int i = 0; i < 4; i++)
				for (int l = 0; l < 32; l++) {
					const uint8_t v = ql[l + 32 * (i & 1)];
					int q = ((i < 2 ? v & 15 : v >> 4) | ((qh[l] >> (2 * i)) & 3) << 4) - 32;
					o[32 * i + l] = d * (float)scl[2 * i + l / 16] * (float)q;
				}
		}
		return;
	}
	const bool q5 = dtype == KVT_DTYPE_Q5_K;
	const uint8_t *blk = row + b * (q5 ? 176 : 144);
	const uint8_t *qs = blk + (q5 ? 48 : 16), *qh = blk + 16;
	memcpy(&d16, blk, 2);
	memcpy(&m16, blk + 2, 2);
	const float d = kvt_f16_to_f32(d16), dmin = kvt_f16_to_f32(m16);
	for (int sub = 0; sub < 8; sub++) {
		kq_scale_min(sub, blk + 4, &sc, &mn);
		const float ds = d * (float)sc, ms = dmin * (float)mn;
		const uint8_t *q = qs + 32 * (sub / 2);
		for (int l = 0; l < 32; l++) {
			int v = sub & 1 ? q[l] >> 4 : q[l] & 15;
			if (q5)
				v |= ((qh[l] >> sub) & 1) << 4;
			out[32 * sub + l] = fmaf(ds, (float)v, -ms); /* as kquant_elem */
		}
	}
}
#endif

static inline bool is_new_quant(int dtype)
{
	return dtype >= KVT_DTYPE_Q5_0;
}

/* The K-quants: 256-element superblocks. */
static inline bool is_kquant(int dtype)
{
	return dtype >= KVT_DTYPE_Q4_K;
}

#ifdef KVT_HAVE_F16C
static void unpack_block_new_v(int dtype, const uint8_t *row, size_t b, float *out); /* below, by the GEMV */
#endif

/* A whole row of n elements of any dtype, widened to fp32. */
void kvt_cpu_widen_row(int dtype, const void *row, float *dst, size_t n)
{
	if (dtype == KVT_DTYPE_F32)
		memcpy(dst, row, n * sizeof(float));
	else if (dtype == KVT_DTYPE_F16)
		f16_to_f32_row(row, dst, n);
	else if (is_new_quant(dtype)) {
		const size_t be = kvt_dtype_block_elems(dtype);
		for (size_t b = 0; b < n / be; b++)
#ifdef KVT_HAVE_F16C
			unpack_block_new_v(dtype, row, b, dst + b * be);
#else
			unpack_block_new(dtype, row, b, dst + b * be);
#endif
	} else
		for (size_t b = 0; b < n / KVT_QBLOCK; b++) {
#ifdef KVT_HAVE_F16C
			__m256 w[4];
			unpack_block_v(dtype, row, b, w);
			for (int i = 0; i < 4; i++)
				_mm256_storeu_ps(dst + b * KVT_QBLOCK + 8 * i, w[i]);
#else
			unpack_block(dtype, row, b, dst + b * KVT_QBLOCK);
#endif
		}
}

/*
 * The quantized GEMV (any number of rows of x). Converting every weight
 * to fp32 costs more than reading it, so x is quantized instead — to int16,
 * one scale per 32-element block — and each block is a pair of integer
 * multiply-adds (madd_epi16) against the unpacked weights, scaled once:
 *   sum_j w_j x_j = d * xs * sum_j q_j xq_j + m' * sum_j x_j
 * with m' = m (Q4_1), -8d (Q4_0) or 0 (Q8_0). int16 keeps x to 1 part in
 * 65534 of its block's largest value, ~1e-10 NMSE on a dot product, far below
 * the weights' own rounding (llama.cpp quantizes x to 8 bits here).
 */
typedef struct xq16 {
	int16_t *q;     /* [M][K] quantized x */
	float *scale;   /* [M][K/32] per-block scale (x = scale * q) */
	float *sum;     /* [M][K/32] per-block sum of the fp32 x */
} xq16;

static inline size_t xq16_bytes(uint32_t M, uint32_t K)
{
	return (((size_t)M * K * sizeof(int16_t) + 63) & ~(size_t)63) + 2 * (size_t)M * (K / KVT_QBLOCK) * sizeof(float);
}

static inline void xq16_init(xq16 *xq, void *ws, uint32_t M, uint32_t K)
{
	xq->q = ws;
	xq->scale = (float *)((char *)ws + (((size_t)M * K * sizeof(int16_t) + 63) & ~(size_t)63));
	xq->sum = xq->scale + (size_t)M * (K / KVT_QBLOCK);
}

/* One block of x: its int16 levels into qb, its scale and its sum (summed in element order). */
static inline void xq16_block_scalar(const float *xb, int16_t *qb, float *scale, float *sum)
{
	float amax = 0, s = 0;
	for (int j = 0; j < KVT_QBLOCK; j++) {
		amax = fmaxf(amax, fabsf(xb[j]));
		s += xb[j];
	}
	float inv = amax > 0 ? 32767.0f / amax : 0;
	for (int j = 0; j < KVT_QBLOCK; j++)
		qb[j] = (int16_t)lrintf(xb[j] * inv);
	*scale = amax / 32767.0f;
	*sum = s;
}

#ifdef KVT_HAVE_F16C
/*
 * The same block with vectors: bit for bit what xq16_block_scalar writes.
 * The largest |x| is exact in any order, x * inv is the same product, and
 * cvtps rounds to nearest even as lrintf does (|x inv| <= 32767 + a few ulps,
 * so the int16 pack never saturates); the sum stays one add per element in
 * element order. A block holding a NaN or an infinity, or one so small that
 * 32767 / amax overflows, takes the scalar code: its conversions of infinite
 * and NaN products differ from cvtps and the pack's.
 */
static inline void xq16_block(const float *xb, int16_t *qb, float *scale, float *sum)
{
	const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
	const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
	const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
	const __m256 a0 = _mm256_and_ps(v0, absm), a1 = _mm256_and_ps(v1, absm);
	const __m256 a2 = _mm256_and_ps(v2, absm), a3 = _mm256_and_ps(v3, absm);
	/* NOTE: ordered-less-than is false for a NaN, so a NaN anywhere shows as a lane not below inf */
	const __m256 fin = _mm256_and_ps(_mm256_and_ps(_mm256_cmp_ps(a0, inf, _CMP_LT_OQ), _mm256_cmp_ps(a1, inf, _CMP_LT_OQ)),
					 _mm256_and_ps(_mm256_cmp_ps(a2, inf, _CMP_LT_OQ), _mm256_cmp_ps(a3, inf, _CMP_LT_OQ)));
	if (_mm256_movemask_ps(fin) != 0xff) {
		xq16_block_scalar(xb, qb, scale, sum);
		return;
	}
	const __m256 a = _mm256_max_ps(_mm256_max_ps(a0, a1), _mm256_max_ps(a2, a3));
	__m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
	h = _mm_max_ps(h, _mm_movehl_ps(h, h));
	h = _mm_max_ss(h, _mm_movehdup_ps(h));
	const float amax = _mm_cvtss_f32(h), inv = amax > 0 ? 32767.0f / amax : 0;
	if (!(inv < INFINITY)) { /* amax under ~1e-34: x * inv is infinite or NaN */
		xq16_block_scalar(xb, qb, scale, sum);
		return;
	}
	const __m256 iv = _mm256_set1_ps(inv);
	const __m256i q01 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v0, iv)), _mm256_cvtps_epi32(_mm256_mul_ps(v1, iv)));
	const __m256i q23 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v2, iv)), _mm256_cvtps_epi32(_mm256_mul_ps(v3, iv)));
	/* packs interleaves the 128-bit lanes: 0-3 8-11 4-7 12-15 back into order */
	_mm256_storeu_si256((__m256i *)qb, _mm256_permute4x64_epi64(q01, 0xd8));
	_mm256_storeu_si256((__m256i *)(qb + 16), _mm256_permute4x64_epi64(q23, 0xd8));
	float s = 0;
	for (int j = 0; j < KVT_QBLOCK; j++)
		s += xb[j];
	*scale = amax / 32767.0f;
	*sum = s;
}
#else
#define xq16_block xq16_block_scalar
#endif

static inline void xq16_quantize(xq16 *xq, const float *x, uint32_t M, uint32_t K)
{
	const uint32_t nb = K / KVT_QBLOCK;
	for (uint32_t m = 0; m < M; m++)
		for (uint32_t b = 0; b < nb; b++)
			xq16_block(x + (size_t)m * K + (size_t)b * KVT_QBLOCK, xq->q + (size_t)m * K + (size_t)b * KVT_QBLOCK,
				   &xq->scale[(size_t)m * nb + b], &xq->sum[(size_t)m * nb + b]);
}

/*
 * x rounded to int8 instead (kvt_dev_config.act_int8, "activations = int8"),
 * as llama.cpp rounds it: one scale (amax / 127) per 32-element block for
 * Q4_0/Q4_1/Q5_0/Q8_0 weights, one per 256 for the K-quants (its Q8_K), whose
 * sub-block scales are then applied in the integers and a superblock takes
 * one convert and one FMA (dot_qk8). The
 * weights' levels multiply it as unsigned bytes (maddubs_epi16, or
 * vpdpbusd with VNNI; Q8_0's signed levels through their magnitudes, see
 * dot_block8): no widening of each weight to 16 bits, half the
 * multiply-adds. ~1e-4 NMSE on a dot product against ~1e-9 with int16
 * (test_dev_parity measures both), so it is an opt-in; every quantized type
 * has an int8 kernel.
 */
typedef struct xq8 {
	int8_t *q;     /* [M][K] quantized x */
	float *scale;  /* [M][K/32] per-block scale (x = scale * q; the same for the 8 blocks of a K-quant group) */
	float *sum;    /* [M][K/32] per-block sum of x as rounded: scale x the sum of its 32 levels */
	int16_t *lsum; /* [M][K/16] the sum of each 16 levels (|sum| <= 2032): the weights' offsets in the integers */
} xq8;

static inline size_t xq8_bytes(uint32_t M, uint32_t K)
{
	return (((size_t)M * K + 63) & ~(size_t)63) + 2 * (size_t)M * (K / KVT_QBLOCK) * sizeof(float) +
	       (size_t)M * (K / 16) * sizeof(int16_t);
}

static inline void xq8_init(xq8 *xq, void *ws, uint32_t M, uint32_t K)
{
	xq->q = ws;
	xq->scale = (float *)((char *)ws + (((size_t)M * K + 63) & ~(size_t)63));
	xq->sum = xq->scale + (size_t)M * (K / KVT_QBLOCK);
	xq->lsum = (int16_t *)(xq->sum + (size_t)M * (K / KVT_QBLOCK));
}

/*
 * A block's scale (its group's amax / 127) and the sum of x as rounded,
 * from its levels qb: scale times an exact integer sum. The mins (Q4_1's,
 * Q4_K/Q5_K's) multiply these sums, so every term of a product sees the same
 * rounded x, and the GEMV and the GEMM read the same sums.
 */
static inline void xq8_block_sums(const int8_t *qb, float amax, float *scale, float *sum)
{
	int s = 0;
	for (int j = 0; j < KVT_QBLOCK; j++)
		s += qb[j];
	*scale = amax / 127.0f;
	*sum = *scale * (float)s;
}

/*
 * One group of nblk 32-element blocks of x (1, or 8 for the K-quants: one
 * scale per 256 as llama.cpp's Q8_K) as int8 levels with the group's scale
 * amax / 127, written to each block's scale; each block's sum and half sums
 * (xq8_block_sums).
 */
static inline void xq8_group_scalar(const float *xg, int nblk, int8_t *qg, float *scale, float *sum)
{
	float amax = 0;
	for (int j = 0; j < KVT_QBLOCK * nblk; j++)
		amax = fmaxf(amax, fabsf(xg[j]));
	const float inv = amax > 0 ? 127.0f / amax : 0;
	for (int b = 0; b < nblk; b++) {
		const float *xb = xg + b * KVT_QBLOCK;
		for (int j = 0; j < KVT_QBLOCK; j++)
			qg[b * KVT_QBLOCK + j] = (int8_t)lrintf(xb[j] * inv);
		xq8_block_sums(qg + b * KVT_QBLOCK, amax, &scale[b], &sum[b]);
	}
}

#ifdef KVT_HAVE_F16C
/*
 * The same with vectors, bit for bit (the argument of xq16_block: the same
 * largest |x| in any order, the same products, cvtps rounding to even); a
 * group holding a NaN or an infinity, or too small for 127 / amax, takes the
 * scalar code.
 */
static inline void xq8_group(const float *xg, int nblk, int8_t *qg, float *scale, float *sum)
{
	const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
	__m256 a = _mm256_setzero_ps(), fin = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
	for (int i = 0; i < KVT_QBLOCK * nblk; i += 8) {
		const __m256 ai = _mm256_and_ps(_mm256_loadu_ps(xg + i), absm);
		/* NOTE: ordered-less-than is false for a NaN, so a NaN anywhere shows as a lane not below inf */
		fin = _mm256_and_ps(fin, _mm256_cmp_ps(ai, inf, _CMP_LT_OQ));
		a = _mm256_max_ps(a, ai);
	}
	if (_mm256_movemask_ps(fin) != 0xff) {
		xq8_group_scalar(xg, nblk, qg, scale, sum);
		return;
	}
	__m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
	h = _mm_max_ps(h, _mm_movehl_ps(h, h));
	h = _mm_max_ss(h, _mm_movehdup_ps(h));
	const float amax = _mm_cvtss_f32(h), inv = amax > 0 ? 127.0f / amax : 0;
	if (!(inv < INFINITY)) {
		xq8_group_scalar(xg, nblk, qg, scale, sum);
		return;
	}
	const __m256 iv = _mm256_set1_ps(inv);
	for (int b = 0; b < nblk; b++) {
		const float *xb = xg + b * KVT_QBLOCK;
		const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
		const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
		const __m256i q01 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v0, iv)), _mm256_cvtps_epi32(_mm256_mul_ps(v1, iv)));
		const __m256i q23 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v2, iv)), _mm256_cvtps_epi32(_mm256_mul_ps(v3, iv)));
		/* two packs interleave the lanes twice: dwords 0 4 1 5 2 6 3 7 back into order */
		const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q01, q23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
		_mm256_storeu_si256((__m256i *)(qg + b * KVT_QBLOCK), q8);
		xq8_block_sums(qg + b * KVT_QBLOCK, amax, &scale[b], &sum[b]);
	}
}
#else
#define xq8_group xq8_group_scalar
#endif

/* x's M rows in groups of nblk blocks (1, or 8 for K-quant weights: xq8_group). */
static inline void xq8_quantize(xq8 *xq, const float *x, uint32_t M, uint32_t K, int nblk)
{
	const uint32_t nb = K / KVT_QBLOCK;
	for (uint32_t m = 0; m < M; m++) {
		for (uint32_t b = 0; b < nb; b += (uint32_t)nblk)
			xq8_group(x + (size_t)m * K + (size_t)b * KVT_QBLOCK, nblk, xq->q + (size_t)m * K + (size_t)b * KVT_QBLOCK,
				  &xq->scale[(size_t)m * nb + b], &xq->sum[(size_t)m * nb + b]);
		for (uint32_t k = 0; k < K; k += 16) {
			int t = 0;
			for (uint32_t j = 0; j < 16; j++)
				t += xq->q[(size_t)m * K + k + j];
			xq->lsum[((size_t)m * K + k) / 16] = (int16_t)t;
		}
	}
}

#ifdef KVT_HAVE_F16C
/* 32 bits as 32 bytes: byte j is 0x10 where bit j of bits is set (Q5_0's fifth bits). */
static inline __m256i fifth_bits(const uint8_t *qh)
{
	uint32_t bits;
	memcpy(&bits, qh, 4); /* NOTE: 2-byte aligned only (22-byte blocks) */
	const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
						2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
	const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
	/* byte j gets byte j / 8 of bits (the shuffle stays in each 128-bit lane,
	 * and both lanes hold all four bytes), then tests bit j % 8 of it */
	__m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
	v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
	return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* A Q8_0 / Q5_0 / Q4_0 / Q4_1 block's 32 levels as two halves of int16 (its scales: dot_q16). */
static inline __attribute__((always_inline)) void q16_block(const int dtype, const uint8_t *blk, __m256i *qa, __m256i *qb)
{
	const __m128i low4 = _mm_set1_epi8(0x0f);
	if (dtype == KVT_DTYPE_Q8_0) {
		*qa = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 2)));
		*qb = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 18)));
	} else if (dtype == KVT_DTYPE_Q5_0) {
		__m128i raw = _mm_loadu_si128((const __m128i *)(blk + 6));
		__m256i q = _mm256_or_si256(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4),
							     _mm_and_si128(raw, low4)),
					    fifth_bits(blk + 2));
		*qa = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q));
		*qb = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1));
	} else {
		/* each byte widened once to a 16-bit lane: its low nibble is element i, its high one i + 16 */
		__m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + (dtype == KVT_DTYPE_Q4_1 ? 4 : 2))));
		*qa = _mm256_and_si256(w, _mm256_set1_epi16(0x0f));
		*qb = _mm256_srli_epi16(w, 4);
	}
}

/*
 * One 32-element block: sum_j q_j xq_j as 8 int32 lanes (q in two int16 halves, xb x's quantized block).
 * Where the CPU has VNNI (AVX512-VNNI with VL, or AVX-VNNI), the second
 * multiply-add and the add are one vpdpwssd: the same int32 lanes (a lane
 * holds at most 4 x 127 x 32767, far from overflow), one instruction fewer
 * per block and row.
 */
static inline __attribute__((always_inline)) __m256i madd_block16(__m256i qa, __m256i qb, const int16_t *xb)
{
	const __m256i pa = _mm256_madd_epi16(qa, _mm256_loadu_si256((const __m256i *)xb));
#ifdef KVT_HAVE_VNNI
	return kvt_dpwssd256(pa, qb, _mm256_loadu_si256((const __m256i *)(xb + 16)));
#else
	return _mm256_add_epi32(pa, _mm256_madd_epi16(qb, _mm256_loadu_si256((const __m256i *)(xb + 16))));
#endif
}

/*
 * The fp16 at p + l bs for l < g (1 <= g <= 8), the lanes from g on zero:
 * 16-bit inserts, not a gather. NOTE: vpgatherdd is microcoded on AMD Zen; a
 * gather of the 8 blocks' scales held ~20% of a Q8_0 GEMV's samples on an
 * EPYC. A short group is inserted too: its halves stored to a small array
 * and loaded as one vector stalled on the failed store forwarding (7% of a
 * Gemma 3 decode, whose 640-wide rows end in a group of 4).
 */
static inline __attribute__((always_inline)) __m128i block_halves(const uint8_t *p, size_t bs, int g)
{
	__m128i v = _mm_setzero_si128();
#define HALF_AT(l) v = _mm_insert_epi16(v, *(const uint16_t *)(p + (l) * bs), l)
	switch (g) {
	default: HALF_AT(7); __attribute__((fallthrough));
	case 7: HALF_AT(6); __attribute__((fallthrough));
	case 6: HALF_AT(5); __attribute__((fallthrough));
	case 5: HALF_AT(4); __attribute__((fallthrough));
	case 4: HALF_AT(3); __attribute__((fallthrough));
	case 3: HALF_AT(2); __attribute__((fallthrough));
	case 2: HALF_AT(1); __attribute__((fallthrough));
	case 1: HALF_AT(0);
	}
#undef HALF_AT
	return v;
}

/*
 * dot_q32's and dot_q8's group of g <= 8 blocks from b0 (returned): their d
 * (and Q4_1's m) in one vector (block_halves) times x's block scales, stored
 * to sv so that each block's scale is a broadcast load, not a shuffle (port 5
 * was the bound); the offset terms m' sum_j x_j added to mvec per lane.
 */
static inline __attribute__((always_inline)) int block_group(const int dtype, const int M, const bool x8,
							      const uint8_t *row, size_t bs, size_t nb, size_t b0,
							      const float *xscale, const float *xsum, float sv[][8], __m256 *mvec)
{
	/* int8 x: Q4_0's, Q5_0's and Q8_0's offsets are in the integers (offset_sums8), only Q4_1's min is not */
	const bool offset = x8 ? dtype == KVT_DTYPE_Q4_1 : dtype != KVT_DTYPE_Q8_0;
	const int g = nb - b0 < 8 ? (int)(nb - b0) : 8;
	const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(g), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	const uint8_t *g0 = row + b0 * bs;
	const __m256 dv = _mm256_cvtph_ps(block_halves(g0, bs, g));
	__m256 mv = _mm256_setzero_ps();
	if (dtype == KVT_DTYPE_Q4_1)
		mv = _mm256_cvtph_ps(block_halves(g0 + 2, bs, g));
	else if (dtype == KVT_DTYPE_Q5_0)
		mv = _mm256_mul_ps(dv, _mm256_set1_ps(-16.0f));
	else if (dtype == KVT_DTYPE_Q4_0)
		mv = _mm256_mul_ps(dv, _mm256_set1_ps(-8.0f));
	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
		_mm256_store_ps(sv[m], _mm256_mul_ps(dv, _mm256_maskload_ps(xscale + (size_t)m * nb + b0, live)));
		if (offset)
			mvec[m] = _mm256_fmadd_ps(mv, _mm256_maskload_ps(xsum + (size_t)m * nb + b0, live), mvec[m]);
	}
	return g;
}

/* The 32 levels (0..15, or 0..31 for Q5_K) of Q4_K/Q5_K sub-block sub, as bytes. */
static inline __attribute__((always_inline)) __m256i kq45_levels(const uint8_t *qs, __m256i qh, bool q5, int sub)
{
	const __m256i low4 = _mm256_set1_epi8(0x0f);
	__m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * (sub / 2)));
	__m256i v = _mm256_and_si256(sub & 1 ? _mm256_srli_epi16(raw, 4) : raw, low4);
	if (q5) {
		const __m256i bit = _mm256_set1_epi8((char)(1 << sub));
		v = _mm256_or_si256(v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
							 _mm256_set1_epi8(16)));
	}
	return v;
}

/*
 * A Q4_K/Q5_K superblock's 8 six-bit sub-block scales (bytes 0-7) and mins
 * (bytes 8-15), from its 12 packed bytes u0 u1 u2 (dwords at blk + 4):
 *   sc 0-3 = u0 & 0x3f, sc 4-7 = (u2 & 0x0f) | (u0 >> 6) << 4,
 *   m 0-3  = u1 & 0x3f, m 4-7  = (u2 >> 4) | (u1 >> 6) << 4,
 * as one vector (two shuffles, two shifts, masks): the scalar unpack was ~30
 * of the ~95 instructions of the int8 Q4_K GEMV's superblock. The 16-byte
 * load ends at blk + 20, inside the block.
 */
static inline __attribute__((always_inline)) __m128i kq45_scale_bytes(const uint8_t *blk)
{
	const __m128i v = _mm_loadu_si128((const __m128i *)(blk + 4));
	/* dwords u0 u2 u1 u2, and 0 u0 0 u1 */
	const __m128i a = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
	const __m128i b = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
	/* 32-bit shifts carry bits across bytes; the masks keep each byte's own */
	const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
					 _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
	return _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi32(b, 2), _mm_set1_epi32(0x30303030)));
}

/* Elements 32i .. 32i+31 (i = 0..3) of Q6_K half `half` as signed bytes q - 32 (centered) or as q. */
static inline __attribute__((always_inline)) void q6k_levels(const uint8_t *blk, int half, __m256i q[4], bool centered)
{
	const __m256i low4 = _mm256_set1_epi8(0x0f), m32 = _mm256_set1_epi8(32);
	__m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * half));
	__m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * half + 32));
	__m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * half));
	/*
	 * Each level's bits 4-5 are two bits of qh moved into place and masked:
	 * qh bits 0-1 by << 4, 2-3 by << 2, 4-5 where they are, 6-7 by >> 2 (16-bit
	 * shifts carry bits across bytes, which the masks drop).
	 */
	const __m256i hi2 = _mm256_set1_epi8(0x30);
	q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2));
	q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2));
	q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, hi2));
	q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
			       _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2));
	for (int i = 0; i < 4 && centered; i++)
		q[i] = _mm256_sub_epi8(q[i], m32);
}

/* Q5_0 block b's 32 levels (0..31) as bytes. */
static inline __attribute__((always_inline)) __m256i q50_levels(const uint8_t *blk)
{
	const __m128i low4 = _mm_set1_epi8(0x0f);
	__m128i raw = _mm_loadu_si128((const __m128i *)(blk + 6));
	return _mm256_or_si256(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(raw, low4)),
			       fifth_bits(blk + 2));
}

/*
 * Block b of a Q5_0 row or superblock b of a K-quant row widened to floats
 * with AVX2, bit for bit what unpack_block_new (and kvt_cpu_row_elem) give: the same
 * products, and the Q4_K/Q5_K fma done by one vfmadd.
 */
static void unpack_block_new_v(int dtype, const uint8_t *row, size_t b, float *out)
{
	uint8_t lv[32];
	if (dtype == KVT_DTYPE_Q5_0) {
		const uint8_t *blk = row + b * 22;
		const __m256 d = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)blk));
		_mm256_storeu_si256((__m256i *)lv, _mm256_sub_epi8(q50_levels(blk), _mm256_set1_epi8(16)));
		for (int j = 0; j < 32; j += 8)
			_mm256_storeu_ps(out + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
									   _mm_loadl_epi64((const __m128i *)(lv + j))))));
		return;
	}
	if (dtype == KVT_DTYPE_Q6_K) {
		const uint8_t *blk = row + b * 210;
		const int8_t *scl = (const int8_t *)(blk + 192);
		const float d = _cvtsh_ss(*(const uint16_t *)(blk + 208));
		for (int half = 0; half < 2; half++) {
			__m256i q[4];
			q6k_levels(blk, half, q, true);
			for (int i = 0; i < 4; i++) {
				_mm256_storeu_si256((__m256i *)lv, q[i]);
				for (int j = 0; j < 32; j += 8) {
					const __m256 ds = _mm256_set1_ps(d * (float)scl[8 * half + 2 * i + j / 16]);
					_mm256_storeu_ps(out + 128 * half + 32 * i + j,
							 _mm256_mul_ps(ds, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
										   _mm_loadl_epi64((const __m128i *)(lv + j))))));
				}
			}
		}
		return;
	}
	const bool q5 = dtype == KVT_DTYPE_Q5_K;
	const uint8_t *blk = row + b * (q5 ? 176 : 144);
	const float d = _cvtsh_ss(*(const uint16_t *)blk), dmin = _cvtsh_ss(*(const uint16_t *)(blk + 2));
	const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
	for (int sub = 0; sub < 8; sub++) {
		int sc, mn;
		kq_scale_min(sub, blk + 4, &sc, &mn);
		const __m256 ds = _mm256_set1_ps(d * (float)sc), nms = _mm256_set1_ps(-(dmin * (float)mn));
		_mm256_storeu_si256((__m256i *)lv, kq45_levels(blk + (q5 ? 48 : 16), qh, q5, sub));
		for (int j = 0; j < 32; j += 8)
			_mm256_storeu_ps(out + 32 * sub + j,
					 _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
								     _mm_loadl_epi64((const __m128i *)(lv + j)))),
							 nms));
	}
}

/* dot_qk16's Q6_K superblock sb (x blocks from b0): into the rows' two chains acc, acc2. */
static inline __attribute__((always_inline)) void qk16_q6k(const int M, const uint8_t *row, const xq16 *xq, size_t K,
							    size_t sb, size_t b0, __m256 *acc, __m256 *acc2)
{
	const size_t nb = K / KVT_QBLOCK;
	const uint8_t *blk = row + sb * 210;
	const __m256 d = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(blk + 208)));
	for (int l = 0; l < 210; l += 64)
		prefetch_ahead(blk + l);
	/*
	 * The 16 scales times d, then times the scale of the x block each
	 * 16-element sub-block falls in (scale k: x block k / 2), as
	 * vectors once a superblock, stored for broadcast loads: the same
	 * products (d sc) xs as one scalar each, a quarter of the
	 * instructions (the scalar converts and multiplies per
	 * sub-block held a Q6_K GEMV to 3.2 GB/s on an EPYC, a third
	 * of Q4_K's rate).
	 */
	const __m128i s16 = _mm_loadu_si128((const __m128i *)(blk + 192));
	const __m256 ds0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s16)));
	const __m256 ds1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s16, 8))));
	const __m256i pair0 = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), pair1 = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
	float dsx[GEMV_MAX_ROWS][16] __attribute__((aligned(32)));
	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
		const __m256 xs = _mm256_loadu_ps(xq->scale + (size_t)m * nb + b0);
		_mm256_store_ps(dsx[m], _mm256_mul_ps(ds0, _mm256_permutevar8x32_ps(xs, pair0)));
		_mm256_store_ps(dsx[m] + 8, _mm256_mul_ps(ds1, _mm256_permutevar8x32_ps(xs, pair1)));
	}
	for (int half = 0; half < 2; half++) {
		__m256i q[4];
		q6k_levels(blk, half, q, true);
		for (int i = 0; i < 4; i++) {
			__m256i qa = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q[i]));
			__m256i qb = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q[i], 1));
			const int k = 8 * half + 2 * i;
			const size_t b = b0 + 4 * (size_t)half + (size_t)i;
			_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
				const int16_t *xb = xq->q + (size_t)m * K + b * KVT_QBLOCK;
				__m256 pa = _mm256_cvtepi32_ps(
					_mm256_madd_epi16(qa, _mm256_loadu_si256((const __m256i *)xb)));
				__m256 pb = _mm256_cvtepi32_ps(
					_mm256_madd_epi16(qb, _mm256_loadu_si256((const __m256i *)(xb + 16))));
				acc[m] = _mm256_fmadd_ps(pa, _mm256_broadcast_ss(&dsx[m][k]), acc[m]);
				acc2[m] = _mm256_fmadd_ps(pb, _mm256_broadcast_ss(&dsx[m][k + 1]), acc2[m]);
			}
		}
	}
}

/*
 * The same int16 GEMV over K-quant superblocks. x's 32-element blocks line
 * up with the sub-blocks: a Q4_K/Q5_K sub-block of 32 is one x block,
 *   sum_j w_j x_j = d sc xs sum_j q_j xq_j - dmin mn sum_j x_j,
 * and a Q6_K sub-block of 16 is half of one, whose (q - 32) is signed and
 * needs no min term:
 *   sum_j w_j x_j = d scale xs sum_j (q_j - 32) xq_j.
 */
static inline __attribute__((always_inline)) void dot_qk16(const int dtype, const int M, const uint8_t *row,
							    const xq16 *xq, size_t K, float *out)
{
	const size_t nb = K / KVT_QBLOCK;
	/* two FMA chains per row (acc, acc2), as dot_q16; mvec: the Q4_K/Q5_K min terms, per sub-block lane */
	__m256 acc[GEMV_MAX_ROWS], acc2[GEMV_MAX_ROWS], acc3[GEMV_MAX_ROWS], acc4[GEMV_MAX_ROWS], mvec[GEMV_MAX_ROWS];

	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
		acc[m] = acc2[m] = acc3[m] = acc4[m] = mvec[m] = _mm256_setzero_ps();
	for (size_t sb = 0; sb < K / KVT_QK_BLOCK; sb++) {
		const size_t b0 = sb * (KVT_QK_BLOCK / KVT_QBLOCK); /* first x block of the superblock */
		if (dtype == KVT_DTYPE_Q6_K) {
			qk16_q6k(M, row, xq, K, sb, b0, acc, acc2);
			continue;
		}
		const bool q5 = dtype == KVT_DTYPE_Q5_K;
		const uint8_t *blk = row + sb * (q5 ? 176 : 144);
		const float d = _cvtsh_ss(*(const uint16_t *)blk), dmin = _cvtsh_ss(*(const uint16_t *)(blk + 2));
		const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
		const uint8_t *qs = blk + (q5 ? 48 : 16);
		for (int l = 0; l < (q5 ? 176 : 144); l += 64)
			prefetch_ahead(blk + l);
		/*
		 * The 8 sub-block scales times d times x's block scales, and the
		 * min terms, as vectors once a superblock: per sub-block only a
		 * lane is broadcast (the scalar unpack, converts and multiplies
		 * per sub-block were a third of a Q4_K decode's instructions).
		 * The products are the scalar ones, (d sc) xs, so acc is unchanged.
		 */
		const __m128i sm = kq45_scale_bytes(blk);
		const __m256 dsv = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)));
		const __m256 msv = _mm256_mul_ps(_mm256_set1_ps(dmin),
						 _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))));
		float dsx[GEMV_MAX_ROWS][8] __attribute__((aligned(32))); /* broadcast loads per sub-block, as dot_q32 */
		_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
			_mm256_store_ps(dsx[m], _mm256_mul_ps(dsv, _mm256_loadu_ps(xq->scale + (size_t)m * nb + b0)));
			mvec[m] = _mm256_fnmadd_ps(msv, _mm256_loadu_ps(xq->sum + (size_t)m * nb + b0), mvec[m]);
		}
		if (!q5) {
			/*
			 * Q4_K: sub-blocks 2i and 2i+1 are the low and high nibbles of the
			 * same 32 bytes; each byte widened once to a 16-bit lane gives both
			 * (two widenings per pair of sub-blocks instead of four).
			 */
			const __m256i low4 = _mm256_set1_epi16(0x0f);
			for (int sub = 0; sub < 8; sub += 2) {
				const uint8_t *q = qs + 16 * sub;
				const __m256i w0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)q));
				const __m256i w1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q + 16)));
				const __m256i qa = _mm256_and_si256(w0, low4), qb = _mm256_and_si256(w1, low4);
				const __m256i qa1 = _mm256_srli_epi16(w0, 4), qb1 = _mm256_srli_epi16(w1, 4);
				const size_t b = b0 + (size_t)sub;
				/* NOTE: by sub-block, never by M: each row's chains are the same in a call of any size */
				const bool odd = sub & 2;
				_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
					const int16_t *xb = xq->q + (size_t)m * K + b * KVT_QBLOCK;
					__m256i p = madd_block16(qa, qb, xb), p1 = madd_block16(qa1, qb1, xb + KVT_QBLOCK);
					__m256 *a = odd ? &acc3[m] : &acc[m], *a2 = odd ? &acc4[m] : &acc2[m];
					*a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&dsx[m][sub]), *a);
					*a2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_broadcast_ss(&dsx[m][sub + 1]), *a2);
				}
			}
			continue;
		}
		for (int sub = 0; sub < 8; sub++) {
			__m256i v = kq45_levels(qs, qh, q5, sub);
			__m256i qa = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v));
			__m256i qb = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1));
			const size_t b = b0 + (size_t)sub;
			_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
				__m256i p = madd_block16(qa, qb, xq->q + (size_t)m * K + b * KVT_QBLOCK);
				__m256 *a = sub & 1 ? &acc2[m] : &acc[m];
				*a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&dsx[m][sub]), *a);
			}
		}
	}
	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
		out[m] = hsum8(_mm256_add_ps(_mm256_add_ps(acc[m], acc2[m]), _mm256_add_ps(acc3[m], acc4[m]))) +
			 hsum8(mvec[m]);
}

/* p sc + p1 sc1 as int32 lanes (pairs of int16 lanes multiplied and added; one vpdpwssd for the second with VNNI). */
static inline __attribute__((always_inline)) __m256i scale_pairs(__m256i p, __m256i sc, __m256i p1, __m256i sc1)
{
#ifdef KVT_HAVE_VNNI
	return kvt_dpwssd256(_mm256_madd_epi16(p, sc), p1, sc1);
#else
	return _mm256_add_epi32(_mm256_madd_epi16(p, sc), _mm256_madd_epi16(p1, sc1));
#endif
}

/*
 * Eight vectors' lane sums as one vector: lane i is the sum of p[i]'s lanes.
 * Integer adds, so any grouping gives the same (exact) sums.
 */
static inline __attribute__((always_inline)) __m256i sum_lanes8(const __m256i p[8])
{
	const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
	const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
	/* h0: p0..p3's low-half sums, then their high-half sums; h1 the same for p4..p7 */
	return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}

/* One block's sum_j q_j xq_j as 8 int32 lanes: q unsigned bytes (at most 63), xb x's int8 block. */
static inline __attribute__((always_inline)) __m256i maddubs_block(__m256i q, const int8_t *xb)
{
#ifdef KVT_HAVE_VNNI
	/* one vpdpbusd: the four products of each lane summed in 32 bits, the sums below */
	return kvt_dpbusd256(_mm256_setzero_si256(), q, _mm256_loadu_si256((const __m256i *)xb));
#else
	/* NOTE: maddubs saturates a pair at 32767: 2 x 63 x 127 = 16002 cannot */
	return _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)xb)), _mm256_set1_epi16(1));
#endif
}

/* dot_qk8's superblock sb: each row's exact integer sum into isum, the min terms into mvec; returns d. */
static inline __attribute__((always_inline)) float qk8_superblock(const int dtype, const int M, const uint8_t *row,
								  const xq8 *xq, size_t K, size_t sb, __m256i *isum,
								  __m256 *mvec)
{
	const size_t nb = K / KVT_QBLOCK;
	const size_t b0 = sb * (KVT_QK_BLOCK / KVT_QBLOCK);
	float d;
	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
		isum[m] = _mm256_setzero_si256();
	if (dtype == KVT_DTYPE_Q6_K) {
		const uint8_t *blk = row + sb * 210;
		for (int l = 0; l < 210; l += 64)
			prefetch_ahead(blk + l);
		d = _cvtsh_ss(*(const uint16_t *)(blk + 208));
		const __m128i s8 = _mm_loadu_si128((const __m128i *)(blk + 192));
		/*
		 * Scales as int16 pairs in dwords: lo holds 0-3 and 8-11, hi 4-7 and
		 * 12-15 (unpack works within 128-bit lanes); x block b's two
		 * scales (2b, 2b+1) are then one dword permute away.
		 */
		const __m256i s16 = _mm256_cvtepi8_epi16(s8);
		const __m256i lo = _mm256_unpacklo_epi16(s16, s16), hi = _mm256_unpackhi_epi16(s16, s16);
		_Pragma("GCC unroll 2") for (int half = 0; half < 2; half++) {
			__m256i q[4];
			q6k_levels(blk, half, q, false);
			_Pragma("GCC unroll 2") for (int i = 0; i < 4; i += 2) {
				/*
				 * q[i] is x block b = 4 half + i: scales 2b and 2b+1, dwords
				 * k and k+1 of lo or hi; q[i + 1] the next block's, the
				 * next two dwords
				 */
				const int b = 4 * half + i, k = 4 * half;
				const __m256i src = i ? hi : lo;
				const __m256i sc = _mm256_permutevar8x32_epi32(
					src, _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1));
				const __m256i sc1 = _mm256_permutevar8x32_epi32(
					src, _mm256_setr_epi32(k + 2, k + 2, k + 2, k + 2, k + 3, k + 3, k + 3, k + 3));
				_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
					const int8_t *xb = xq->q + (size_t)m * K + (b0 + (size_t)b) * KVT_QBLOCK;
					__m256i p = _mm256_maddubs_epi16(q[i], _mm256_loadu_si256((const __m256i *)xb));
					__m256i p1 = _mm256_maddubs_epi16(q[i + 1], _mm256_loadu_si256((const __m256i *)(xb + 32)));
					isum[m] = _mm256_add_epi32(isum[m], scale_pairs(p, sc, p1, sc1));
				}
			}
		}
		/* the offset of 32 in the integers: 32 sum_s sc_s (x's levels summed over sub-block s) */
		_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
			const __m256i ls = _mm256_loadu_si256((const __m256i *)(xq->lsum + (size_t)m * (K / 16) + 16 * sb));
			isum[m] = _mm256_sub_epi32(isum[m], _mm256_slli_epi32(_mm256_madd_epi16(ls, s16), 5));
		}
	} else {
		const bool q5 = dtype == KVT_DTYPE_Q5_K;
		const uint8_t *blk = row + sb * (q5 ? 176 : 144);
		d = _cvtsh_ss(*(const uint16_t *)blk);
		const float dmin = _cvtsh_ss(*(const uint16_t *)(blk + 2));
		const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
		const uint8_t *qs = blk + (q5 ? 48 : 16);
		for (int l = 0; l < (q5 ? 176 : 144); l += 64)
			prefetch_ahead(blk + l);
		const __m128i sm = kq45_scale_bytes(blk);
		const __m256 msv = _mm256_mul_ps(_mm256_set1_ps(dmin),
						 _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))));
		_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
			mvec[m] = _mm256_fnmadd_ps(msv, _mm256_loadu_ps(xq->sum + (size_t)m * nb + b0), mvec[m]);
		/* the 8 sub-block scales as int16 in both lanes; sub-block k's is broadcast by a byte shuffle */
		const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
		_Pragma("GCC unroll 4") for (int sub = 0; sub < 8; sub += 2) {
			/* sub-blocks sub and sub + 1: the low and high nibbles of the same 32 bytes (and bits of qh) */
			__m256i v, v1;
			if (q5) {
				v = kq45_levels(qs, qh, true, sub);
				v1 = kq45_levels(qs, qh, true, sub + 1);
			} else {
				const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 16 * sub)),
					      low4 = _mm256_set1_epi8(0x0f);
				v = _mm256_and_si256(raw, low4);
				v1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
			}
			const __m256i sc = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((2 * sub + 1) << 8 | 2 * sub)));
			const __m256i sc1 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)((2 * sub + 3) << 8 | (2 * sub + 2))));
			_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
				const int8_t *xb = xq->q + (size_t)m * K + (b0 + (size_t)sub) * KVT_QBLOCK;
				__m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const __m256i *)xb));
				__m256i p1 = _mm256_maddubs_epi16(v1, _mm256_loadu_si256((const __m256i *)(xb + KVT_QBLOCK)));
				isum[m] = _mm256_add_epi32(isum[m], scale_pairs(p, sc, p1, sc1));
			}
		}
	}
	return d;
}

/*
 * The int8 GEMV over K-quant superblocks, x rounded with one scale xs per
 * superblock (xq8_quantize's groups of 8 blocks, llama.cpp's Q8_K): each
 * sub-block's sum_j q_j xq_j is multiplied by its integer scale in the
 * integers and added up in int32 lanes, and the superblock then takes one
 * convert and one FMA by d xs. (A convert and an FMA per 32 elements, with x
 * scaled per 32, held the K-quant GEMV to ~28G weights/s on a Zen 4 core;
 * without them it ran 1.65x as fast.) The levels go in unsigned; Q6_K's
 * offset of 32 comes off in the integers (32 sc times x's 16-level sums,
 * xq8.lsum), Q4_K/Q5_K's mins go on the fp32 sums of x. Eight superblocks'
 * integer sums are summed across their lanes at once (sum_lanes8), then one
 * convert and one FMA for the eight. The order every int8 kernel
 * keeps (the GEMM's too, gemm8_kernel):
 *   P_sb = sum_sub sc_sub sum_j (q_j - off) xq_j   the superblock's exact int32
 *   A_l  = fma(P_sb, d_sb xs_sb, A_l)              for sb = l, l + 8, ...
 *   N_l  = fnma(dmin_sb m_sb,l, xsum_sb,l, N_l)    sub-block l of each sb (Q4_K/Q5_K)
 *   y    = hsum8(A) (+ hsum8(N))
 * Bounds: a maddubs pair is at most 2 x 63 x 127 = 16002 (short of its
 * saturation); an int32 lane gathers 32 products times their scale, at most
 * 32 x 63 x 127 x 128 < 2^25, and P_sb 8 lanes of those.
 */
static inline __attribute__((always_inline)) void dot_qk8(const int dtype, const int M, const uint8_t *row,
							   const xq8 *xq, size_t K, float *out)
{
	const size_t nb = K / KVT_QBLOCK, nsb = K / KVT_QK_BLOCK;
	__m256 acc[GEMV_MAX_ROWS], mvec[GEMV_MAX_ROWS];

	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
		acc[m] = mvec[m] = _mm256_setzero_ps();
	/* 8 superblocks' integer sums (lane l: superblock sb0 + l; past the row's end 0 x 0, which fma adds as +0) */
	for (size_t sb0 = 0; sb0 < nsb; sb0 += 8) {
		__m256i pend[GEMV_MAX_ROWS][8];
		float dxs[GEMV_MAX_ROWS][8] __attribute__((aligned(32)));
		_Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) {
			__m256i isum[GEMV_MAX_ROWS];
			if (sb0 + (size_t)l >= nsb) {
				_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
					pend[m][l] = _mm256_setzero_si256();
					dxs[m][l] = 0;
				}
				continue;
			}
			const float d = qk8_superblock(dtype, M, row, xq, K, sb0 + (size_t)l, isum, mvec);
			_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
				pend[m][l] = isum[m];
				dxs[m][l] = d * xq->scale[(size_t)m * nb + (sb0 + (size_t)l) * (KVT_QK_BLOCK / KVT_QBLOCK)];
			}
		}
		_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
			acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lanes8(pend[m])), _mm256_load_ps(dxs[m]), acc[m]);
	}
	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
		out[m] = dtype == KVT_DTYPE_Q6_K ? hsum8(acc[m]) : hsum8(acc[m]) + hsum8(mvec[m]);
}

/*
 * A 32-element block's levels as 32 bytes in element order: Q5_0's 0..31,
 * Q4_0's and Q4_1's 0..15 (unsigned), Q8_0's as stored (signed).
 */
static inline __attribute__((always_inline)) __m256i q32_levels8(const int dtype, const uint8_t *blk)
{
	if (dtype == KVT_DTYPE_Q8_0)
		return _mm256_loadu_si256((const __m256i *)(blk + 2));
	if (dtype == KVT_DTYPE_Q5_0)
		return q50_levels(blk);
	const __m128i low4 = _mm_set1_epi8(0x0f);
	const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (dtype == KVT_DTYPE_Q4_1 ? 4 : 2)));
	return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(raw, low4));
}

/*
 * Signed levels v (|v| <= 128) against x's int8 block xb, as 8 int32 lanes.
 * The byte multiply takes one unsigned operand: v goes in as |v| with v's
 * sign moved onto x (sign_epi8), exact for every byte (|-128| is 128
 * unsigned; x's levels stay within +-127, so negating one cannot overflow;
 * without VNNI a maddubs pair is at most 2 x 128 x 127 = 32512, short of its
 * saturation).
 */
static inline __attribute__((always_inline)) __m256i dot_signed8(__m256i v, __m256i x)
{
	const __m256i xs = _mm256_sign_epi8(x, v), av = _mm256_abs_epi8(v);
#ifdef KVT_HAVE_VNNI
	return kvt_dpbusd256(_mm256_setzero_si256(), av, xs);
#else
	return _mm256_madd_epi16(_mm256_maddubs_epi16(av, xs), _mm256_set1_epi16(1));
#endif
}

/* One block of levels v (q32_levels8) against x's int8 block xb: Q8_0's signed, the rest unsigned. */
static inline __attribute__((always_inline)) __m256i dot_block8(const int dtype, __m256i v, const int8_t *xb)
{
	if (dtype != KVT_DTYPE_Q8_0)
		return maddubs_block(v, xb);
	return dot_signed8(v, _mm256_loadu_si256((const __m256i *)xb));
}

/*
 * Q4_0's and Q5_0's offsets (8, 16) in the integers: off times the sums of
 * x's levels over the blocks b0 .. b0 + 7 (lane j: block b0 + j; lanes from
 * g on 0), from x's 16-level sums (xq8.lsum, one int32 load per block).
 */
static inline __attribute__((always_inline)) __m256i offset_sums8(const int dtype, const int16_t *lsum, int g)
{
	const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(g), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	const __m256i s = _mm256_madd_epi16(_mm256_maskload_epi32((const int *)lsum, live), _mm256_set1_epi16(1));
	return _mm256_slli_epi32(s, dtype == KVT_DTYPE_Q5_0 ? 4 : 3);
}

/*
 * The 32-element block types' int16 GEMV (dot_q16):
 *   sum_j w_j x_j = d xs sum_j q_j xq_j + m' sum_j x_j
 * eight blocks at a time (block_group; the products are the scalar ones,
 * d xs), the offset terms m' (Q4_1's m, Q4_0's -8 d, Q5_0's -16 d) on x's
 * sums per lane.
 * NOTE: two accumulators per row (even and odd blocks): one FMA chain per row
 * would make each block wait for the last one's FMA (4 cycles), which is what
 * bounded a Q8_0 decode. Q8_0 has no offset term (m' = 0): it is skipped.
 * Each row's float operations are the same whatever M is (the order rule).
 */
static inline __attribute__((always_inline)) void dot_q32(const int dtype, const int M, const uint8_t *row,
							   const int16_t *q, const float *xscale, const float *xsum, size_t K,
							   float *out)
{
	const size_t nb = K / KVT_QBLOCK;
	const size_t bs = dtype == KVT_DTYPE_Q8_0 ? 34 : dtype == KVT_DTYPE_Q5_0 ? 22 : dtype == KVT_DTYPE_Q4_1 ? 20 : 18;
	__m256 acc[GEMV_MAX_ROWS], acc2[GEMV_MAX_ROWS], mvec[GEMV_MAX_ROWS];

	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
		acc[m] = acc2[m] = mvec[m] = _mm256_setzero_ps();
	for (size_t b0 = 0; b0 < nb; b0 += 8) {
		float sv[GEMV_MAX_ROWS][8] __attribute__((aligned(32)));
		const int g = block_group(dtype, M, false, row, bs, nb, b0, xscale, xsum, sv, mvec);
		for (int j = 0; j < g; j++) {
			const size_t b = b0 + (size_t)j;
			const uint8_t *blk = row + b * bs;
			__m256i qa, qb;
			if (!(j & 1))
				prefetch_ahead(blk);
			q16_block(dtype, blk, &qa, &qb);
			_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
				const __m256 p = _mm256_cvtepi32_ps(madd_block16(qa, qb, q + (size_t)m * K + b * KVT_QBLOCK));
				if (j & 1)
					acc2[m] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(&sv[m][j]), acc2[m]);
				else
					acc[m] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(&sv[m][j]), acc[m]);
			}
		}
	}
	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
		out[m] = hsum8(_mm256_add_ps(acc[m], acc2[m])) + (dtype != KVT_DTYPE_Q8_0 ? hsum8(mvec[m]) : 0.0f);
}

static inline __attribute__((always_inline)) void dot_q16(const int dtype, const int M, const uint8_t *row,
							   const xq16 *xq, size_t K, float *out)
{
	dot_q32(dtype, M, row, xq->q, xq->scale, xq->sum, K, out);
}

/*
 * The 32-element block types' int8 GEMV, in the order every int8 kernel
 * keeps (the GEMM's too, gemm8_kernel), so a row's result is the same
 * whatever other rows share the call:
 *   P_b = sum_j (q_j - off) xq_j           block b's exact int32 (offset_sums8)
 *   A_l = fma(P_b, d_b xs_b, A_l)          for b = l, l + 8, ... (lane l = b mod 8)
 *   N_l = fma(m_b, xsum_b, N_l)            the same lanes, Q4_1 only
 *   y   = hsum8(A) (+ hsum8(N) for Q4_1)
 * Eight blocks' integer products are summed across their lanes (sum_lanes8)
 * into one vector whose lane l is block b0 + l's P, then one convert and one
 * FMA for the eight.
 */
static inline __attribute__((always_inline)) void dot_q8(const int dtype, const int M, const uint8_t *row,
							  const xq8 *xq, size_t K, float *out)
{
	const size_t nb = K / KVT_QBLOCK;
	const size_t bs = dtype == KVT_DTYPE_Q8_0 ? 34 : dtype == KVT_DTYPE_Q5_0 ? 22 : dtype == KVT_DTYPE_Q4_1 ? 20 : 18;
	__m256 acc[GEMV_MAX_ROWS], mvec[GEMV_MAX_ROWS];

	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
		acc[m] = mvec[m] = _mm256_setzero_ps();
	for (size_t b0 = 0; b0 < nb; b0 += 8) {
		float sv[GEMV_MAX_ROWS][8] __attribute__((aligned(32)));
		const int g = block_group(dtype, M, true, row, bs, nb, b0, xq->scale, xq->sum, sv, mvec);
		/* the 8 blocks' levels decoded once, then row by row (p for all rows at once spilled) */
		__m256i v[8];
		_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
			const uint8_t *blk = row + (b0 + (size_t)j) * bs;
			if (j < g && !(j & 1))
				prefetch_ahead(blk);
			v[j] = j < g ? q32_levels8(dtype, blk) : _mm256_setzero_si256();
		}
		_Pragma("GCC unroll 4") for (int m = 0; m < M; m++) {
			__m256i p[8];
			_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) /* the row's last group: lanes past its end are 0 */
				p[j] = j < g ? dot_block8(dtype, v[j], xq->q + (size_t)m * K + (b0 + (size_t)j) * KVT_QBLOCK)
					     : _mm256_setzero_si256();
			__m256i pm = sum_lanes8(p);
			if (dtype == KVT_DTYPE_Q4_0 || dtype == KVT_DTYPE_Q5_0)
				pm = _mm256_sub_epi32(pm, offset_sums8(dtype, xq->lsum + (size_t)m * (K / 16) + 2 * b0, g));
			acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pm), _mm256_load_ps(sv[m]), acc[m]);
		}
	}
	_Pragma("GCC unroll 4") for (int m = 0; m < M; m++)
		out[m] = dtype == KVT_DTYPE_Q4_1 ? hsum8(acc[m]) + hsum8(mvec[m]) : hsum8(acc[m]);
}

/* Constant dtype and row count for each instance, so loops unroll into registers. */
#define DOT_Q16_ROWS(FN, DT)                                               \
	switch (M) {                                                       \
	case 1: FN(DT, 1, row, xq, K, out); return;                        \
	case 2: FN(DT, 2, row, xq, K, out); return;                        \
	case 3: FN(DT, 3, row, xq, K, out); return;                        \
	default: FN(DT, GEMV_MAX_ROWS, row, xq, K, out); return;           \
	}

static void dot_rows_q(int dtype, const uint8_t *row, const xq16 *xq, int M, size_t K, float *out)
{
	switch (dtype) {
	case KVT_DTYPE_Q8_0: DOT_Q16_ROWS(dot_q16, KVT_DTYPE_Q8_0)
	case KVT_DTYPE_Q4_0: DOT_Q16_ROWS(dot_q16, KVT_DTYPE_Q4_0)
	case KVT_DTYPE_Q4_1: DOT_Q16_ROWS(dot_q16, KVT_DTYPE_Q4_1)
	case KVT_DTYPE_Q5_0: DOT_Q16_ROWS(dot_q16, KVT_DTYPE_Q5_0)
	case KVT_DTYPE_Q4_K: DOT_Q16_ROWS(dot_qk16, KVT_DTYPE_Q4_K)
	case KVT_DTYPE_Q5_K: DOT_Q16_ROWS(dot_qk16, KVT_DTYPE_Q5_K)
	default: DOT_Q16_ROWS(dot_qk16, KVT_DTYPE_Q6_K)
	}
}

/* The int8 GEMV's instances, one per quantized type. */
static void dot_rows_q8(int dtype, const uint8_t *row, const xq8 *xq, int M, size_t K, float *out)
{
	switch (dtype) {
	case KVT_DTYPE_Q8_0: DOT_Q16_ROWS(dot_q8, KVT_DTYPE_Q8_0)
	case KVT_DTYPE_Q4_0: DOT_Q16_ROWS(dot_q8, KVT_DTYPE_Q4_0)
	case KVT_DTYPE_Q4_1: DOT_Q16_ROWS(dot_q8, KVT_DTYPE_Q4_1)
	case KVT_DTYPE_Q5_0: DOT_Q16_ROWS(dot_q8, KVT_DTYPE_Q5_0)
	case KVT_DTYPE_Q4_K: DOT_Q16_ROWS(dot_qk8, KVT_DTYPE_Q4_K)
	case KVT_DTYPE_Q5_K: DOT_Q16_ROWS(dot_qk8, KVT_DTYPE_Q5_K)
	default: DOT_Q16_ROWS(dot_qk8, KVT_DTYPE_Q6_K)
	}
}
#undef DOT_Q16_ROWS

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
/*
 * The int8 GEMM (act_int8, more rows of x than the GEMV takes; AVX-512 with
 * VNNI). The GEMV multiplies one weight row by a few rows of x at a time and
 * spends, per 32 products, a byte multiply, a widening add and a convert
 * and FMA or a scale multiply: on a Zen 4 core ~16 products a cycle, short
 * of sgemm's at a prompt's row counts. Here the 16 lanes of a vector are 16
 * rows of x, their int8 levels interleaved by 4 bytes (gemm8_x), and each
 * vpdpbusd takes 4 bytes of one weight row broadcast: 64 products, with the
 * x vector reused by GEMM8_R weight rows and the weight bytes decoded once
 * per call into a tile (gemm8_w) reused by every group of 16 rows of x. The
 * float work is once per block (a 32-element type's scale) or per
 * superblock (a K-quant's; its sub-block scales multiply the int32 sums).
 *
 * vpdpbusd multiplies unsigned by signed bytes: the weights' levels go in
 * unsigned (Q8_0's plus 128) and their offsets (Q8_0's 128, Q4_0's 8,
 * Q5_0's 16, Q6_K's 32) come off in the integers, as that many times the
 * sum of x's levels over each block (gemm8_x.corr, the sums' start value);
 * Q4_1's and Q4_K/Q5_K's mins go on in fp32 with x's sums, as in the GEMV.
 * Bounds: a lane's sum over a block is at most 32 x 255 x 127 (Q8_0's) and
 * a K-quant superblock's, times its scales, 256 x 63 x 127 x 128 < 2^29.
 * The integer sums are exact, x's sums are those of its levels
 * (xq8_block_sums), and gemm8_kernel makes the GEMV's float operations in
 * the GEMV's order, so a row's result is the GEMV's bit for bit
 * (test_cpu_invariant).
 */
#define KVT_HAVE_GEMM8 1
#define GEMM8_LANES 16 /* rows of x in a vector */
#define GEMM8_R 8      /* weight rows a kernel call multiplies (8 measured 1.45x 4, and 16 slower than 8) */
#define GEMM8_TILE 16  /* weight rows decoded at once (a multiple of GEMM8_R) */
_Static_assert(GEMM8_TILE % GEMM8_R == 0, "the tile holds whole kernel calls");
/*
 * Fewer rows of x take the GEMV: below this, a decoded weight tile is
 * reused too little to pay for its decode and its padding of x to 16 rows.
 * On a Zen 4 core (bench_quant --threads 1 --activations int8, an 8192 x
 * 2048 matrix, rows/s GEMV -> GEMM): 8 rows Q8_0 2,691 -> 2,541, Q4_K
 * 4,035 -> 2,710; 12 rows Q8_0 2,481 -> 3,759, Q4_K 3,877 -> 3,935, Q6_K
 * 3,006 -> 3,564; 256 rows ~9,000 (sgemm on widened tiles: ~2,500).
 */
#define GEMM8_MIN_ROWS 12

/* x for the GEMM, G = ceil(M / 16) groups of 16 rows (rows past M zero). */
typedef struct gemm8_x {
	uint8_t *q;    /* [G][K/4][16][4]: row l's levels k..k+3 at [k/4][l] */
	float *scale;  /* [G][K/32][16] each block's scale */
	float *sum;    /* [G][K/32][16] each block's fp32 sum (xq8.sum) */
	int32_t *corr; /* [G][K/S][16] -offset x the levels' sum over each S (16 for Q6_K, else 32) elements */
} gemm8_x;

/* GEMM8_TILE weight rows decoded, each row's arrays at a stride of its length. */
typedef struct gemm8_w {
	uint8_t *lv; /* [TILE][K] the levels as unsigned bytes */
	float *d;    /* [TILE][K/32] a block's scale, or at [sb] a superblock's */
	float *m;    /* [TILE][K/32] Q4_1's min per block; Q4_K/Q5_K's dmin x min per sub-block */
	int32_t *sc; /* [TILE][K/16] a K-quant's sub-block scales (Q4_K/Q5_K: per 32, Q6_K: per 16) */
} gemm8_w;

static inline int gemm8_offset(int dtype)
{
	return dtype == KVT_DTYPE_Q8_0 ? 128 : dtype == KVT_DTYPE_Q4_0 ? 8 : dtype == KVT_DTYPE_Q5_0 ? 16
	       : dtype == KVT_DTYPE_Q6_K ? 32 : 0;
}

/* Elements per entry of gemm8_x.corr and gemm8_w.sc. */
static inline size_t gemm8_sub(int dtype)
{
	return dtype == KVT_DTYPE_Q6_K ? 16 : 32;
}

static inline size_t gemm8_align(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

static inline size_t gemm8_x_bytes(uint32_t M, uint32_t K)
{
	const size_t mp = (M + GEMM8_LANES - 1) / GEMM8_LANES * GEMM8_LANES;
	return gemm8_align(mp * K) + 2 * gemm8_align(mp * (K / KVT_QBLOCK) * sizeof(float)) +
	       gemm8_align(mp * (K / 16) * sizeof(int32_t));
}

static inline size_t gemm8_w_bytes(uint32_t K)
{
	return gemm8_align((size_t)GEMM8_TILE * K) + 2 * gemm8_align((size_t)GEMM8_TILE * (K / KVT_QBLOCK) * sizeof(float)) +
	       gemm8_align((size_t)GEMM8_TILE * (K / 16) * sizeof(int32_t));
}

static inline void gemm8_w_init(gemm8_w *w, void *ws, uint32_t K)
{
	char *p = ws;
	w->lv = (uint8_t *)p;
	p += gemm8_align((size_t)GEMM8_TILE * K);
	w->d = (float *)p;
	p += gemm8_align((size_t)GEMM8_TILE * (K / KVT_QBLOCK) * sizeof(float));
	w->m = (float *)p;
	p += gemm8_align((size_t)GEMM8_TILE * (K / KVT_QBLOCK) * sizeof(float));
	w->sc = (int32_t *)p;
}

/* gemm8_x's arrays in ws (gemm8_x_bytes) for M rows of K. */
static void gemm8_x_init(gemm8_x *gx, void *ws, uint32_t M, uint32_t K)
{
	const size_t mp = (M + GEMM8_LANES - 1) / GEMM8_LANES * GEMM8_LANES, nb = K / KVT_QBLOCK;
	char *p = ws;
	gx->q = (uint8_t *)p;
	p += gemm8_align(mp * K);
	gx->scale = (float *)p;
	p += gemm8_align(mp * nb * sizeof(float));
	gx->sum = (float *)p;
	p += gemm8_align(mp * nb * sizeof(float));
	gx->corr = (int32_t *)p;
}

/* Group g of gx from xq's M rows: the levels interleaved, scales, sums and the offset sums for dtype. */
static void gemm8_x_group(gemm8_x *gx, const xq8 *xq, uint32_t M, uint32_t K, int dtype, size_t g)
{
	const size_t nb = K / KVT_QBLOCK, S = gemm8_sub(dtype), ns = K / S;
	const int32_t off = gemm8_offset(dtype);
	if ((g + 1) * GEMM8_LANES > M) { /* the last group: its lanes past M multiply zeros */
		memset(gx->q + g * K * GEMM8_LANES, 0, (size_t)K * GEMM8_LANES);
		memset(gx->scale + g * nb * GEMM8_LANES, 0, nb * GEMM8_LANES * sizeof(float));
		memset(gx->sum + g * nb * GEMM8_LANES, 0, nb * GEMM8_LANES * sizeof(float));
		memset(gx->corr + g * ns * GEMM8_LANES, 0, ns * GEMM8_LANES * sizeof(int32_t));
	}
	for (size_t l = 0, m = g * GEMM8_LANES; l < GEMM8_LANES && m < M; l++, m++) {
		const int8_t *row = xq->q + m * K;
		uint8_t *q = gx->q + g * K * GEMM8_LANES + 4 * l;
		for (size_t k = 0; k < K; k += 4, q += 4 * GEMM8_LANES)
			memcpy(q, row + k, 4);
		for (size_t b = 0; b < nb; b++) {
			gx->scale[(g * nb + b) * GEMM8_LANES + l] = xq->scale[m * nb + b];
			gx->sum[(g * nb + b) * GEMM8_LANES + l] = xq->sum[m * nb + b];
		}
		for (size_t s = 0; s < ns; s++) {
			int32_t t = 0;
			for (size_t j = 0; j < S; j++)
				t += row[s * S + j];
			gx->corr[(g * ns + s) * GEMM8_LANES + l] = -off * t;
		}
	}
}

/* Weight row `row` of dtype into slot r of the tile: levels as unsigned bytes, scales, mins. */
static void gemm8_decode_row(int dtype, const uint8_t *row, uint32_t K, gemm8_w *w, int r)
{
	const size_t nb = K / KVT_QBLOCK;
	uint8_t *lv = w->lv + (size_t)r * K;
	float *d = w->d + (size_t)r * nb, *mn = w->m + (size_t)r * nb;
	int32_t *sc = w->sc + (size_t)r * (K / 16);
	/* bytes per block, or per superblock */
	const size_t bs = kvt_dtype_row_bytes(dtype, is_kquant(dtype) ? KVT_QK_BLOCK : KVT_QBLOCK);
	if (!is_kquant(dtype)) {
		for (size_t b = 0; b < nb; b++) {
			const uint8_t *blk = row + b * bs;
			__m256i v = q32_levels8(dtype, blk);
			if (dtype == KVT_DTYPE_Q8_0)
				v = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
			_mm256_storeu_si256((__m256i *)(lv + b * KVT_QBLOCK), v);
			d[b] = _cvtsh_ss(*(const uint16_t *)blk);
			if (dtype == KVT_DTYPE_Q4_1)
				mn[b] = _cvtsh_ss(*(const uint16_t *)(blk + 2));
		}
		return;
	}
	for (size_t sb = 0; sb < K / KVT_QK_BLOCK; sb++) {
		uint8_t *l = lv + sb * KVT_QK_BLOCK;
		const uint8_t *blk = row + sb * bs;
		if (dtype == KVT_DTYPE_Q6_K) {
			for (int half = 0; half < 2; half++) {
				__m256i q[4];
				q6k_levels(blk, half, q, false);
				for (int i = 0; i < 4; i++)
					_mm256_storeu_si256((__m256i *)(l + 128 * half + 32 * i), q[i]);
			}
			for (int i = 0; i < 16; i++)
				sc[16 * sb + (size_t)i] = (int8_t)blk[192 + i];
			d[sb] = _cvtsh_ss(*(const uint16_t *)(blk + 208));
			continue;
		}
		const bool q5 = dtype == KVT_DTYPE_Q5_K;
		const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
		uint8_t s[16];
		_mm_storeu_si128((__m128i *)s, kq45_scale_bytes(blk));
		const float dmin = _cvtsh_ss(*(const uint16_t *)(blk + 2));
		d[sb] = _cvtsh_ss(*(const uint16_t *)blk);
		for (int sub = 0; sub < 8; sub++) {
			_mm256_storeu_si256((__m256i *)(l + 32 * sub), kq45_levels(blk + (q5 ? 48 : 16), qh, q5, sub));
			sc[8 * sb + (size_t)sub] = s[sub];
			mn[8 * sb + (size_t)sub] = dmin * (float)s[8 + sub];
		}
	}
}

/* Slot r of the tile as a row of zeros. */
static void gemm8_w_zero(gemm8_w *w, int r, uint32_t K)
{
	memset(w->lv + (size_t)r * K, 0, K);
	memset(w->d + (size_t)r * (K / KVT_QBLOCK), 0, K / KVT_QBLOCK * sizeof(float));
	memset(w->m + (size_t)r * (K / KVT_QBLOCK), 0, K / KVT_QBLOCK * sizeof(float));
	memset(w->sc + (size_t)r * (K / 16), 0, K / 16 * sizeof(int32_t));
}

static inline int32_t gemm8_ld32(const uint8_t *p)
{
	int32_t v;
	memcpy(&v, p, sizeof v);
	return v;
}

/* The 8 chains' sum in hsum8's order: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)). */
static inline __attribute__((always_inline)) __m512 gemm8_tree(const __m512 v[8])
{
	const __m512 t0 = _mm512_add_ps(v[0], v[4]), t1 = _mm512_add_ps(v[1], v[5]);
	const __m512 t2 = _mm512_add_ps(v[2], v[6]), t3 = _mm512_add_ps(v[3], v[7]);
	return _mm512_add_ps(_mm512_add_ps(t0, t2), _mm512_add_ps(t1, t3));
}

/*
 * Block b's (a 32-element type's) or sub-block s's integer products for R
 * weight rows against 16 rows of x: the offset sums (c) plus S bytes of
 * levels at lv[r] + off, by vpdpbusd, 4 bytes a step.
 */
static inline __attribute__((always_inline)) void gemm8_block(const int R, const size_t S, __m512i c, const uint8_t *const *lv,
							       size_t off, const uint8_t *xq, __m512i *a)
{
	_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
		a[r] = c;
	_Pragma("GCC unroll 8") for (size_t k = 0; k < S / 4; k++) {
		const __m512i xv = _mm512_loadu_si512(xq + k * 4 * GEMM8_LANES);
		_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
			a[r] = _mm512_dpbusd_epi32(a[r], _mm512_set1_epi32(gemm8_ld32(lv[r] + off + 4 * k)), xv);
	}
}

/*
 * R decoded weight rows (from slot r0 of w) times one group of 16 rows of x
 * (gx's group g): out[r] holds the 16 rows' results for weight row r0 + r.
 * Each lane (a row of x) follows the GEMV's order exactly (dot_q8, dot_qk8):
 * the same exact integer per block or superblock, its float FMA into chain
 * l = b mod 8 (sb mod 8), the mins into their own 8 chains, the chains summed
 * as hsum8 sums its lanes. The loops run chain by chain (blocks l, l + 8,
 * ...), so each chain is one register per weight row.
 */
static inline __attribute__((always_inline)) void gemm8_kernel(const int dtype, const int R, const gemm8_w *w, int r0,
								const gemm8_x *gx, size_t g, uint32_t K, __m512 *out)
{
	const size_t nb = K / KVT_QBLOCK, S = gemm8_sub(dtype), ns = K / S;
	const bool off = gemm8_offset(dtype) != 0, kq = is_kquant(dtype);
	const bool mins = dtype == KVT_DTYPE_Q4_1 || dtype == KVT_DTYPE_Q4_K || dtype == KVT_DTYPE_Q5_K;
	const uint8_t *xq = gx->q + g * K * GEMM8_LANES;
	const float *xs = gx->scale + g * nb * GEMM8_LANES, *xsum = gx->sum + g * nb * GEMM8_LANES;
	const int32_t *xc = gx->corr + g * ns * GEMM8_LANES;
	const uint8_t *lv[GEMM8_R];
	const float *wd[GEMM8_R], *wm[GEMM8_R];
	const int32_t *wsc[GEMM8_R];
	__m512 chain[GEMM8_R][8], nchain[GEMM8_R][8]; /* A_l and N_l per weight row */

	_Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
		lv[r] = w->lv + (size_t)(r0 + r) * K;
		wd[r] = w->d + (size_t)(r0 + r) * nb;
		wm[r] = w->m + (size_t)(r0 + r) * nb;
		wsc[r] = w->sc + (size_t)(r0 + r) * (K / 16);
	}
	/* blocks (32-element types) or superblocks (K-quants): a chain's are l, l + 8, ... */
	const size_t n_units = kq ? K / KVT_QK_BLOCK : nb, per_sb = KVT_QK_BLOCK / S;
	for (size_t l = 0; l < 8; l++) {
		__m512 acc[GEMM8_R], mv[GEMM8_R];
		_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
			acc[r] = mv[r] = _mm512_setzero_ps();
		for (size_t u = l; u < n_units; u += 8) {
			__m512i isum[GEMM8_R];
			if (!kq) {
				const __m512i c = off ? _mm512_loadu_si512(xc + u * GEMM8_LANES) : _mm512_setzero_si512();
				gemm8_block(R, KVT_QBLOCK, c, lv, u * KVT_QBLOCK, xq + u * KVT_QBLOCK * GEMM8_LANES, isum);
			} else {
				_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
					isum[r] = _mm512_setzero_si512();
				for (size_t sub = 0; sub < per_sb; sub++) {
					const size_t s = u * per_sb + sub;
					const __m512i c = off ? _mm512_loadu_si512(xc + s * GEMM8_LANES) : _mm512_setzero_si512();
					__m512i a[GEMM8_R];
					gemm8_block(R, S, c, lv, s * S, xq + s * S * GEMM8_LANES, a);
					_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
						isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(a[r], _mm512_set1_epi32(wsc[r][s])));
				}
			}
			/* x's scale: per block, or the superblock's (that of its first block) */
			const __m512 dx = _mm512_loadu_ps(xs + (kq ? u * (KVT_QK_BLOCK / KVT_QBLOCK) : u) * GEMM8_LANES);
			_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
				acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(_mm512_set1_ps(wd[r][u]), dx), acc[r]);
			if (mins && !kq) { /* Q4_1's min chain l runs over the same blocks, in the same order */
				const __m512 sx = _mm512_loadu_ps(xsum + u * GEMM8_LANES);
				_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
					mv[r] = _mm512_fmadd_ps(_mm512_set1_ps(wm[r][u]), sx, mv[r]);
			}
		}
		_Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
			chain[r][l] = acc[r];
			nchain[r][l] = mv[r];
		}
	}
	if (!mins) {
		_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
			out[r] = gemm8_tree(chain[r]);
		return;
	}
	/* the mins: Q4_1's chain l over blocks l, l + 8, ... (summed above); Q4_K/Q5_K's over sub-block l of every superblock */
	for (size_t l = 0; kq && l < 8; l++) {
		__m512 mv[GEMM8_R];
		_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
			mv[r] = _mm512_setzero_ps();
		for (size_t s = l; s < nb; s += 8) {
			const __m512 sx = _mm512_loadu_ps(xsum + s * GEMM8_LANES);
			_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
				mv[r] = _mm512_fnmadd_ps(_mm512_set1_ps(wm[r][s]), sx, mv[r]);
		}
		_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
			nchain[r][l] = mv[r];
	}
	_Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
		out[r] = _mm512_add_ps(gemm8_tree(chain[r]), gemm8_tree(nchain[r]));
}

#define GEMM8_TYPE(DT) gemm8_kernel(DT, GEMM8_R, w, r0, gx, g, K, out); return;

/* gemm8_kernel's instances: constant dtype and row count, so the loops unroll into registers. */
static void gemm8_rows(int dtype, const gemm8_w *w, int r0, const gemm8_x *gx, size_t g, uint32_t K, __m512 *out)
{
	switch (dtype) {
	case KVT_DTYPE_Q8_0: GEMM8_TYPE(KVT_DTYPE_Q8_0)
	case KVT_DTYPE_Q4_0: GEMM8_TYPE(KVT_DTYPE_Q4_0)
	case KVT_DTYPE_Q4_1: GEMM8_TYPE(KVT_DTYPE_Q4_1)
	case KVT_DTYPE_Q5_0: GEMM8_TYPE(KVT_DTYPE_Q5_0)
	case KVT_DTYPE_Q4_K: GEMM8_TYPE(KVT_DTYPE_Q4_K)
	case KVT_DTYPE_Q5_K: GEMM8_TYPE(KVT_DTYPE_Q5_K)
	default: GEMM8_TYPE(KVT_DTYPE_Q6_K)
	}
}
#undef GEMM8_TYPE
#endif
#else
/* Portable path: unpack each block to floats once, use it for every row of x. */
static void dot_rows_q(int dtype, const uint8_t *row, const float *x, int M, size_t K, float *out)
{
	float blk[KVT_QK_BLOCK];
	const size_t be = kvt_dtype_block_elems(dtype);
	for (int m = 0; m < M; m++)
		out[m] = 0;
	for (size_t b = 0; b < K / be; b++) {
		if (is_new_quant(dtype))
			unpack_block_new(dtype, row, b, blk);
		else
			unpack_block(dtype, row, b, blk);
		for (int m = 0; m < M; m++)
			for (size_t j = 0; j < be; j++)
				out[m] += blk[j] * x[m * K + b * be + j];
	}
}
#endif

/*
 * The matmul's kernels, by (stored type x activation mode): the one place a
 * path is chosen, once per call (mm_plan), and where the order rule of
 * dev_impl.h holds. Every kernel here computes each output from its row of
 * x and its weight row alone, in float operations fixed by the stored type,
 * the activation mode and K: never by the number of rows, which rows they
 * are, or the thread count (a task owns whole output columns, so no sum is
 * ever split). A GEMM row therefore equals its GEMV, bit for bit:
 *
 *   stored type      int16 x (act_int8 off)     int8 x (act_int8, the default)
 *   f32              dot_f32 per row             dot_f32 per row
 *   f16              dot_f32_f16 per row         dot_f32_f16 per row
 *   Q8_0 Q4_0 Q4_1   dot_q16, 4 rows a pass      dot_q8, 4 rows a pass; with
 *   Q5_0                                         AVX-512 VNNI and 12+ rows the
 *   Q4_K Q5_K Q6_K   dot_qk16                    GEMM (gemm8_kernel) in the
 *                                                same order (dot_qk8 for K-quants)
 *
 * (Builds without F16C/FMA, the portable package: dot_rows_q on fp32 x for
 * every quantized type, per row as well.) The GEMM is the only choice made
 * by row count, and it keeps dot_q8's and dot_qk8's order exactly; no
 * threshold picks sgemm, whose order varies with the shape.
 */
typedef enum mm_kernel {
	MM_F32,     /* fp32 weights: dot_f32 */
	MM_F16,     /* fp16 weights: dot_f32_f16 */
	MM_Q16,     /* quantized, x as int16 (xq16): dot_rows_q; or fp32 x in a portable build */
	MM_Q8,      /* quantized, x as int8 (xq8): dot_rows_q8 */
	MM_Q8_GEMM, /* MM_Q8's order, 16 rows of x a vector (AVX-512 VNNI builds) */
} mm_kernel;

/* The table: [act_int8][weight class: 0 f32, 1 f16, 2 block-quantized]. */
static const mm_kernel mm_table[2][3] = {
	{ MM_F32, MM_F16, MM_Q16 },
#ifdef KVT_HAVE_F16C
	{ MM_F32, MM_F16, MM_Q8 },
#else
	{ MM_F32, MM_F16, MM_Q16 }, /* no int8 kernels without AVX2 */
#endif
};

/* The kernel for this op on this device. */
static mm_kernel mm_plan(const kvt_dev *d, const kvt_matmul_args *a)
{
	const int cls = a->w_dtype == KVT_DTYPE_F32 ? 0 : a->w_dtype == KVT_DTYPE_F16 ? 1 : 2;
	const mm_kernel k = mm_table[d->act_int8][cls];
#ifdef KVT_HAVE_GEMM8
	if (k == MM_Q8 && a->n_rows >= GEMM8_MIN_ROWS)
		return MM_Q8_GEMM; /* a faster tile, the same order */
#endif
	return k;
}

size_t kvt_cpu_matmul_workspace(const kvt_dev *d, const kvt_matmul_args *a)
{
	if (d->use_ref)
		return 0;
	switch (mm_plan(d, a)) {
#ifdef KVT_HAVE_GEMM8
	case MM_Q8_GEMM:
		return gemm8_align(xq8_bytes(a->n_rows, a->n_in)) + gemm8_x_bytes(a->n_rows, a->n_in) +
		       (size_t)d->n_threads * gemm8_w_bytes(a->n_in);
#endif
#ifdef KVT_HAVE_F16C
	case MM_Q8:
		return xq8_bytes(a->n_rows, a->n_in);
	case MM_Q16:
		return xq16_bytes(a->n_rows, a->n_in);
#endif
	default:
		return 0;
	}
}

typedef struct matmul_job {
	const kvt_matmul_args *a; /* the op */
	mm_kernel k;              /* its kernel (mm_plan) */
	uint32_t n_slices;        /* column slices */
	xq16 xq;                  /* quantized x (MM_Q16) */
	xq8 xq8;                  /* ... as int8 (MM_Q8, MM_Q8_GEMM) */
#ifdef KVT_HAVE_GEMM8
	gemm8_x gx;               /* MM_Q8_GEMM's x */
	char *g8_tiles;           /* ... its per-worker weight tiles, gemm8_w_bytes apart */
#endif
} matmul_job;

#ifdef KVT_HAVE_GEMM8
/* Task g of the int8 GEMM's preparation: rows 16g.. of x rounded to int8 (xq8) and interleaved (gemm8_x). */
static void gemm8_prep_task(void *ctx, uint32_t g, uint32_t worker)
{
	matmul_job *j = ctx;
	const kvt_matmul_args *a = j->a;
	const uint32_t M = a->n_rows, K = a->n_in, m0 = g * GEMM8_LANES, nb = K / KVT_QBLOCK;
	const uint32_t rows = M - m0 < GEMM8_LANES ? M - m0 : GEMM8_LANES;
	xq8 part = { j->xq8.q + (size_t)m0 * K, j->xq8.scale + (size_t)m0 * nb, j->xq8.sum + (size_t)m0 * nb,
		     j->xq8.lsum + (size_t)m0 * (K / 16) };
	(void)worker;
	xq8_quantize(&part, a->x + (size_t)m0 * K, rows, K, is_kquant(a->w_dtype) ? KVT_QK_BLOCK / KVT_QBLOCK : 1);
	gemm8_x_group(&j->gx, &j->xq8, M, K, a->w_dtype, g);
}

/* y[:, n0:n1] by the int8 GEMM: GEMM8_TILE weight rows decoded at a time, then every group of x. */
static void gemm8_slice(const matmul_job *j, int n0, int n1, void *tile_ws)
{
	const kvt_matmul_args *a = j->a;
	const uint32_t M = a->n_rows, K = a->n_in, N = a->n_out;
	const size_t row_bytes = kvt_dtype_row_bytes(a->w_dtype, K), G = (M + GEMM8_LANES - 1) / GEMM8_LANES;
	const uint8_t *wq = a->w;
	float tmp[GEMM8_TILE][GEMM8_LANES] __attribute__((aligned(64)));
	/* a column of tmp: offsets r * GEMM8_LANES, one vector for a whole tile */
	_Static_assert(GEMM8_TILE == 16, "a tile's column is one 16-float gather");
	const __m512i col = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
					       _mm512_set1_epi32(GEMM8_LANES));
	gemm8_w w;

	gemm8_w_init(&w, tile_ws, K);
	for (int t0 = n0; t0 < n1; t0 += GEMM8_TILE) {
		const int nt = n1 - t0 < GEMM8_TILE ? n1 - t0 : GEMM8_TILE;
		for (int r = 0; r < nt; r++)
			gemm8_decode_row(a->w_dtype, wq + (size_t)(t0 + r) * row_bytes, K, &w, r);
		/* a slice's last tile: the kernel's rows past nt multiply zeros */
		for (int r = nt; r % GEMM8_R; r++)
			gemm8_w_zero(&w, r, K);
		for (size_t g = 0; g < G; g++) {
			for (int r0 = 0; r0 < nt; r0 += GEMM8_R) {
				__m512 out[GEMM8_R];
				gemm8_rows(a->w_dtype, &w, r0, &j->gx, g, K, out);
				for (int r = 0; r < GEMM8_R; r++)
					_mm512_store_ps(tmp[r0 + r], out[r]);
			}
			/* the lanes are rows of y: each takes nt consecutive columns */
			const size_t ml = M - g * GEMM8_LANES < GEMM8_LANES ? M - g * GEMM8_LANES : GEMM8_LANES;
			for (size_t l = 0; l < ml; l++) {
				float *y = a->y + (g * GEMM8_LANES + l) * N + (size_t)t0;
				if (nt == GEMM8_TILE) { /* column l of tmp, 16 floats by one gather */
					__m512 v = _mm512_i32gather_ps(col, &tmp[0][l], 4);
					if (a->accumulate)
						v = _mm512_add_ps(_mm512_loadu_ps(y), v);
					_mm512_storeu_ps(y, v);
					continue;
				}
				for (int r = 0; r < nt; r++)
					y[r] = a->accumulate ? y[r] + tmp[r][l] : tmp[r][l];
			}
		}
	}
}
#endif

/* One weight row against rows m0 .. m0 + mg - 1 of x (mg <= GEMV_MAX_ROWS), into out[0 .. mg). */
static void matmul_rows(const matmul_job *j, const uint8_t *row, int m0, int mg, float *out)
{
	const kvt_matmul_args *a = j->a;
	const int K = (int)a->n_in;
	if (j->k == MM_F32 || j->k == MM_F16) {
		for (int m = 0; m < mg; m++) {
			const float *x = a->x + (size_t)(m0 + m) * K;
			out[m] = j->k == MM_F32 ? dot_f32(x, (const float *)row, K) : dot_f32_f16(x, (const uint16_t *)row, K);
		}
		return;
	}
#ifdef KVT_HAVE_F16C
	const size_t nb = (size_t)K / KVT_QBLOCK;
	if (j->k == MM_Q8) {
		const xq8 g = { j->xq8.q + (size_t)m0 * K, j->xq8.scale + (size_t)m0 * nb, j->xq8.sum + (size_t)m0 * nb,
				j->xq8.lsum + (size_t)m0 * (K / 16) };
		dot_rows_q8(a->w_dtype, row, &g, mg, K, out);
	} else {
		const xq16 g = { j->xq.q + (size_t)m0 * K, j->xq.scale + (size_t)m0 * nb, j->xq.sum + (size_t)m0 * nb };
		dot_rows_q(a->w_dtype, row, &g, mg, K, out);
	}
#else
	dot_rows_q(a->w_dtype, row, a->x + (size_t)m0 * K, mg, K, out);
#endif
}

/*
 * y[:, n0:n1], one task's slice of output columns: MATMUL_TILE weight rows
 * at a time (they stay in L1/L2) against every group of GEMV_MAX_ROWS rows of
 * x. With one group (decode) each weight row is read once.
 */
#define MATMUL_TILE 16
static void matmul_slice(const matmul_job *j, int n0, int n1)
{
	const kvt_matmul_args *a = j->a;
	const int M = (int)a->n_rows, N = (int)a->n_out;
	const size_t row_bytes = kvt_dtype_row_bytes(a->w_dtype, a->n_in);
	float out[GEMV_MAX_ROWS];
	for (int t0 = n0; t0 < n1; t0 += MATMUL_TILE) {
		const int t1 = n1 - t0 < MATMUL_TILE ? n1 : t0 + MATMUL_TILE;
		for (int m0 = 0; m0 < M; m0 += GEMV_MAX_ROWS) {
			const int mg = M - m0 < GEMV_MAX_ROWS ? M - m0 : GEMV_MAX_ROWS;
			for (int n = t0; n < t1; n++) {
				matmul_rows(j, (const uint8_t *)a->w + (size_t)n * row_bytes, m0, mg, out);
				for (int m = 0; m < mg; m++) {
					float *y = &a->y[(size_t)(m0 + m) * N + n];
					*y = a->accumulate ? *y + out[m] : out[m];
				}
			}
		}
	}
}

static void matmul_task(void *ctx, uint32_t t, uint32_t worker)
{
	const matmul_job *j = ctx;
	const uint32_t N = j->a->n_out;
	/* slice edges on 16-column boundaries */
	uint32_t n0 = (uint32_t)((uint64_t)N * t / j->n_slices) & ~15u;
	uint32_t n1 = t + 1 == j->n_slices ? N : (uint32_t)((uint64_t)N * (t + 1) / j->n_slices) & ~15u;
	if (n0 >= n1)
		return;
#ifdef KVT_HAVE_GEMM8
	if (j->k == MM_Q8_GEMM) {
		gemm8_slice(j, (int)n0, (int)n1, j->g8_tiles + (size_t)worker * gemm8_w_bytes(j->a->n_in));
		return;
	}
#endif
	(void)worker;
	matmul_slice(j, (int)n0, (int)n1);
}

int kvt_cpu_matmul_fast(kvt_dev *d, const kvt_matmul_args *a, void *ws)
{
	matmul_job j = { .a = a, .k = mm_plan(d, a), .n_slices = split(d, a->n_out, 64) };
	switch (j.k) {
#ifdef KVT_HAVE_GEMM8
	case MM_Q8_GEMM: {
		xq8_init(&j.xq8, ws, a->n_rows, a->n_in);
		char *gws = (char *)ws + gemm8_align(xq8_bytes(a->n_rows, a->n_in));
		gemm8_x_init(&j.gx, gws, a->n_rows, a->n_in);
		j.g8_tiles = gws + gemm8_x_bytes(a->n_rows, a->n_in);
		par_run(d, (a->n_rows + GEMM8_LANES - 1) / GEMM8_LANES, gemm8_prep_task, &j);
		break;
	}
#endif
#ifdef KVT_HAVE_F16C
	case MM_Q8:
		xq8_init(&j.xq8, ws, a->n_rows, a->n_in);
		xq8_quantize(&j.xq8, a->x, a->n_rows, a->n_in, is_kquant(a->w_dtype) ? KVT_QK_BLOCK / KVT_QBLOCK : 1);
		break;
	case MM_Q16:
		xq16_init(&j.xq, ws, a->n_rows, a->n_in);
		xq16_quantize(&j.xq, a->x, a->n_rows, a->n_in);
		break;
#endif
	default:
		break;
	}
	par_run(d, j.n_slices, matmul_task, &j);
	return KVT_OK;
}

#ifdef KVT_HAVE_F16C
/*
 * e^x for 8 floats: x = n ln2 + r with |r| <= ln2/2, e^r by its degree-6
 * Taylor polynomial (error < 1.3e-7 relative, about one ulp), times 2^n built
 * in the exponent bits. Inputs below -87 give 0 (as expf's do, near enough
 * for softmax weights); the attention kernel only feeds values <= 0.
 */
static inline __m256 exp8(__m256 x)
{
	const __m256 lo = _mm256_set1_ps(-87.0f);
	__m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
	x = _mm256_max_ps(x, lo);
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
				   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
	__m256 p = _mm256_set1_ps(1.0f / 720);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* Scores of q against 4 consecutive rows of k (row stride hd): 4 independent FMA chains. */
static inline __m128 dot4_f32(const float *q, const float *k, size_t hd)
{
	__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
	for (size_t i = 0; i < hd; i += 8) {
		__m256 qv = _mm256_loadu_ps(q + i);
		a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + i), a0);
		a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + hd + i), a1);
		a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 2 * hd + i), a2);
		a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 3 * hd + i), a3);
	}
	__m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
	return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}
#endif

/*
 * The gated FFN's activation, 8 elements a vector: gate -> act(gate) * up.
 * GELU (tanh form) is x * sigmoid(2z), z = sqrt(2/pi) x (1 + 0.044715 x^2),
 * as 0.5 (1 + tanh z) = sigmoid(2z); SiLU is x * sigmoid(x). sigmoid(v) from
 * t = e^-|v| (exp8, an input <= 0): 1 / (1 + t) for v >= 0, t / (1 + t)
 * below. A chunk's last partial vector goes through the same function on a
 * padded copy, so an element's bits never depend on where a task's range
 * starts or ends (glibc's tanhf and expf per element were a fifth of Gemma
 * 3's prefill).
 */
#ifdef KVT_HAVE_F16C
static inline __m256 act8(__m256 g, bool gelu)
{
	__m256 v = g;
	if (gelu) {
		const __m256 z = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.79788456080286535588f), g),
					       _mm256_fmadd_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(0.044715f), _mm256_set1_ps(1.0f)));
		v = _mm256_add_ps(z, z);
	}
	const __m256 neg = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);
	const __m256 t = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v)));
	const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(_mm256_set1_ps(1.0f), t, neg), _mm256_add_ps(_mm256_set1_ps(1.0f), t));
	return _mm256_mul_ps(g, sig);
}

void kvt_cpu_swiglu_fast_task(void *ctx, uint32_t t, uint32_t worker)
{
	const elem_job *j = ctx;
	const kvt_swiglu_args *a = j->args;
	const bool gelu = a->act == KVT_ACT_GELU_TANH;
	uint64_t lo, hi, i;
	(void)worker;
	task_range(j->n, j->n_tasks, t, &lo, &hi);
	for (i = lo; i + 8 <= hi; i += 8)
		_mm256_storeu_ps(a->y + i, _mm256_mul_ps(act8(_mm256_loadu_ps(a->gate + i), gelu), _mm256_loadu_ps(a->up + i)));
	if (i < hi) {
		float g[8] = { 0 }, u[8] = { 0 }, y[8];
		memcpy(g, a->gate + i, (hi - i) * sizeof(float));
		memcpy(u, a->up + i, (hi - i) * sizeof(float));
		_mm256_storeu_ps(y, _mm256_mul_ps(act8(_mm256_loadu_ps(g), gelu), _mm256_loadu_ps(u)));
		memcpy(a->y + i, y, (hi - i) * sizeof(float));
	}
}
#else
void kvt_cpu_swiglu_fast_task(void *ctx, uint32_t t, uint32_t worker)
{
	kvt_cpu_swiglu_task(ctx, t, worker);
}
#endif

/*
 * RMS norm of row m, the reference's arithmetic but for the order of the
 * mean square's double sum: 8 lanes (two chains of 4), combined in a fixed
 * order, then the tail, all fixed by n_dim. Each square is exact in double,
 * so only the sum's order differs from the reference's, at ~1e-16; the
 * scaling is the reference's per element (x r w, in float).
 */
#ifdef KVT_HAVE_F16C
void kvt_cpu_rmsnorm_fast_task(void *ctx, uint32_t m, uint32_t worker)
{
	const kvt_rmsnorm_args *a = ctx;
	const float *x = a->x + (size_t)m * a->n_dim;
	float *y = a->y + (size_t)m * a->n_dim;
	const uint32_t n = a->n_dim;
	__m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
	uint32_t i = 0;
	(void)worker;
	for (; i + 8 <= n; i += 8) {
		const __m256 v = _mm256_loadu_ps(x + i);
		const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
		s0 = _mm256_fmadd_pd(lo, lo, s0);
		s1 = _mm256_fmadd_pd(hi, hi, s1);
	}
	double part[4];
	_mm256_storeu_pd(part, _mm256_add_pd(s0, s1));
	double ss = (part[0] + part[2]) + (part[1] + part[3]);
	for (; i < n; i++)
		ss += (double)x[i] * x[i];
	const float r = 1.0f / sqrtf((float)(ss / n) + a->eps);
	const __m256 vr = _mm256_set1_ps(r);
	for (i = 0; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vr), _mm256_loadu_ps(a->w + i)));
	for (; i < n; i++)
		y[i] = x[i] * r * a->w[i];
}
#else
void kvt_cpu_rmsnorm_fast_task(void *ctx, uint32_t m, uint32_t worker)
{
	kvt_cpu_rmsnorm_task(ctx, m, worker);
}
#endif

#ifdef __AVX512F__
/*
 * Scores of q against 8 consecutive rows of k (hd a multiple of 16): 8
 * independent chains of 16 lanes (dot4_f32's 4 chains of 8 waited on the
 * FMA's latency), each folded to 8 lanes and the 8 summed by hadd trees.
 */
static inline __m256 dot8_f32(const float *q, const float *k, size_t hd)
{
	__m512 a[8];
	_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
		a[j] = _mm512_setzero_ps();
	for (size_t i = 0; i < hd; i += 16) {
		const __m512 qv = _mm512_loadu_ps(q + i);
		_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
			a[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + (size_t)j * hd + i), a[j]);
	}
	__m256 h[8];
	_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
		h[j] = _mm256_add_ps(_mm512_castps512_ps256(a[j]),
				     _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[j]), 1)));
	const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
	const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(h[4], h[5]), _mm256_hadd_ps(h[6], h[7]));
	return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}
#endif

/* sc[k] = q . kb[k] * scale for k < n; returns the largest. */
static float block_scores(const float *q, const float *kb, uint32_t n, size_t hd, float scale, float *sc)
{
	uint32_t k = 0;
	float bmax = -INFINITY;
#ifdef __AVX512F__
	if (hd % 16 == 0)
		for (; k + 8 <= n; k += 8)
			_mm256_storeu_ps(sc + k, _mm256_mul_ps(dot8_f32(q, kb + (size_t)k * hd, hd), _mm256_set1_ps(scale)));
#endif
#ifdef KVT_HAVE_F16C
	if (hd % 8 == 0)
		for (; k + 4 <= n; k += 4)
			_mm_storeu_ps(sc + k, _mm_mul_ps(dot4_f32(q, kb + (size_t)k * hd, hd), _mm_set1_ps(scale)));
#endif
	for (; k < n; k++)
		sc[k] = dot_f32(q, kb + (size_t)k * hd, hd) * scale;
	for (k = 0; k < n; k++)
		bmax = sc[k] > bmax ? sc[k] : bmax;
	return bmax;
}

/* sc[k] = exp(sc[k] - m) for k < n; returns their sum. */
static float block_exp(float *sc, uint32_t n, float m)
{
	uint32_t k = 0;
	float sum = 0;
#ifdef KVT_HAVE_F16C
	__m256 vm = _mm256_set1_ps(m), vs = _mm256_setzero_ps();
	for (; k + 8 <= n; k += 8) {
		__m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + k), vm));
		_mm256_storeu_ps(sc + k, e);
		vs = _mm256_add_ps(vs, e);
	}
	float part[8];
	_mm256_storeu_ps(part, vs);
	for (int i = 0; i < 8; i++)
		sum += part[i];
#endif
	for (; k < n; k++)
		sum += sc[k] = expf(sc[k] - m);
	return sum;
}

/*
 * pv_block's columns [i, i + LANES W) of y, held in W registers across the n
 * rows: NAME for one vector type (VEC of LANES floats, its intrinsics by
 * prefix P). Each element's operations are the same at any width, so are
 * its bits.
 */
#define PV_COLS(NAME, VEC, LANES, P)                                                                          \
	static inline __attribute__((always_inline)) void NAME(float *y, VEC vc, const float *sc, const float *v,   \
								uint32_t n, size_t hd, size_t i, const int W)       \
	{                                                                                                     \
		VEC acc[8];                                                                                   \
		_Pragma("GCC unroll 8") for (int j = 0; j < W; j++)                                           \
			acc[j] = P##_mul_ps(vc, P##_loadu_ps(y + i + LANES * j));                             \
		for (uint32_t k = 0; k < n; k++) {                                                            \
			const VEC p = P##_set1_ps(sc[k]);                                                     \
			const float *vk = v + (size_t)k * hd + i;                                             \
			_Pragma("GCC unroll 8") for (int j = 0; j < W; j++)                                   \
				acc[j] = P##_fmadd_ps(p, P##_loadu_ps(vk + LANES * j), acc[j]);               \
		}                                                                                             \
		_Pragma("GCC unroll 8") for (int j = 0; j < W; j++)                                           \
			P##_storeu_ps(y + i + LANES * j, acc[j]);                                             \
	}                                                                                                     \
	/* columns from i on, 8 then 4 registers at a time; returns the first column left */                 \
	static size_t NAME##_span(float *y, float c, const float *sc, const float *v, uint32_t n, size_t hd, size_t i) \
	{                                                                                                     \
		const VEC vc = P##_set1_ps(c);                                                                \
		for (; i + 8 * LANES <= hd; i += 8 * LANES)                                                   \
			NAME(y, vc, sc, v, n, hd, i, 8);                                                      \
		for (; i + 4 * LANES <= hd; i += 4 * LANES)                                                   \
			NAME(y, vc, sc, v, n, hd, i, 4);                                                      \
		return i;                                                                                     \
	}
#ifdef KVT_HAVE_F16C
PV_COLS(pv_cols, __m256, 8, _mm256)
#endif
#ifdef __AVX512F__
PV_COLS(pv_cols16, __m512, 16, _mm512)
#endif
#undef PV_COLS

/*
 * y = c y + sum_k sc[k] v[k] over n rows v[k] of hd floats: per element the
 * operations of one scale_axpy_f32 by (c, sc[0]) and then one by (1, sc[k])
 * per row, in that order (the same bits), with 64 (or 32) columns of y held
 * in registers across the rows instead of loaded and stored for each.
 */
static void pv_block(float *y, float c, const float *sc, const float *v, uint32_t n, size_t hd)
{
	size_t i = 0;
#ifdef __AVX512F__
	i = pv_cols16_span(y, c, sc, v, n, hd, i); /* 128 and 64 columns at a time */
#endif
#ifdef KVT_HAVE_F16C
	i = pv_cols_span(y, c, sc, v, n, hd, i); /* 64 and 32 */
#endif
	if (i < hd) {
		scale_axpy_f32(y + i, c, sc[0], v + i, hd - i);
		for (uint32_t k = 1; k < n; k++)
			scale_axpy_f32(y + i, 1.0f, sc[k], v + (size_t)k * hd + i, hd - i);
	}
}

/*
 * Blocked causal attention, the fast path's kernel. One call covers nr query
 * rows from r0 and the ng query heads h0.. (all sharing one KV head), over
 * the KV blocks [blk0, blk1). Each KV block is widened to fp32 once and used
 * by all those queries, with an online softmax (running max and sum per
 * query, the accumulator rescaled as each block arrives), scores four keys at
 * a time and a vectorised exp.
 * Order rule (dev_impl.h): a query's steps are one per KV block, blocks
 * aligned to absolute positions (block_tokens), in position order, over the
 * keys its position sees; nothing depends on the other rows or heads of the
 * call, so a prompt's row and a decode step at the same position give the
 * same bits, whatever the chunk, the batch or the thread count.
 */
static void attend_blocks(const attn_job *j, uint32_t r0, uint32_t nr, uint32_t h0, uint32_t ng, uint32_t blk0,
			  uint32_t blk1, uint32_t worker)
{
	const kvt_attention_args *a = j->a;
	const kvt_kv_layout *l = a->kv;
	const uint32_t hd = l->head_dim, bt = l->block_tokens, G = ng, kh = h0 / (a->n_heads / l->n_kv_heads);
	const uint32_t nq = nr * G, n_vis_max = a->pos0 + r0 + nr;
	float *acc = j->ws + (size_t)worker * j->ws_floats; /* [nq][hd] */
	float *mx = acc + (size_t)ATTN_ROWS * G * hd;        /* [nq] running max */
	float *sum = mx + (size_t)ATTN_ROWS * G;             /* [nq] running sum of exp */
	float *kb = sum + (size_t)ATTN_ROWS * G;             /* [bt][hd] */
	float *vb = kb + (size_t)bt * hd;                    /* [bt][hd] */
	float *sc = vb + (size_t)bt * hd;                    /* [bt] */

	memset(acc, 0, (size_t)nq * hd * sizeof(float));
	for (uint32_t i = 0; i < nq; i++) {
		mx[i] = -INFINITY;
		sum[i] = 0;
	}
	for (uint32_t blk = blk0; blk < blk1; blk++) {
		const uint32_t p0 = blk * bt;
		const uint32_t nk = n_vis_max - p0 < bt ? n_vis_max - p0 : bt;
		const int32_t slot = a->block_table[blk];
		/* a head's K (and V) rows for consecutive tokens are contiguous in a block */
		f16_to_f32_row(kv_row(l, slot, a->layer, 0, kh, 0), kb, (size_t)nk * hd);
		f16_to_f32_row(kv_row(l, slot, a->layer, 1, kh, 0), vb, (size_t)nk * hd);
		for (uint32_t r = 0; r < nr; r++) {
			const uint32_t n_vis = a->pos0 + r0 + r + 1; /* causal: positions 0..pos0+r0+r */
			const uint32_t first = attn_first_key(a, n_vis - 1);
			if (n_vis <= p0 || first >= p0 + nk)
				continue;
			/* this row's keys in the block: [k0, kmax) */
			const uint32_t kmax = n_vis - p0 < nk ? n_vis - p0 : nk, k0 = first > p0 ? first - p0 : 0;
			const float *kr = kb + (size_t)k0 * hd, *vr = vb + (size_t)k0 * hd;
			const uint32_t n_k = kmax - k0;
			for (uint32_t g = 0; g < G; g++) {
				const uint32_t qi = r * G + g;
				const float *q = a->q + ((size_t)(r0 + r) * a->n_heads + h0 + g) * hd;
				const float bmax = block_scores(q, kr, n_k, hd, a->scale, sc);
				const float m_new = bmax > mx[qi] ? bmax : mx[qi];
				/* 0 for the first block (mx is -inf); 1 while the max holds, without the call */
				const float c = m_new == mx[qi] ? 1.0f : expf(mx[qi] - m_new);
				float *y = acc + (size_t)qi * hd;
				sum[qi] = sum[qi] * c + block_exp(sc, n_k, m_new);
				pv_block(y, c, sc, vr, n_k, hd);
				mx[qi] = m_new;
			}
		}
	}
	for (uint32_t qi = 0; qi < nq; qi++) {
		const uint32_t r = qi / G, g = qi % G;
		float *out = a->out + ((size_t)(r0 + r) * a->n_heads + h0 + g) * hd;
		const float inv = 1.0f / sum[qi];
		for (uint32_t i = 0; i < hd; i++)
			out[i] = acc[(size_t)qi * hd + i] * inv;
	}
}

/* Prefill: task = (row block, KV head); late row blocks see the most keys, so they go first. */
void kvt_cpu_attention_prefill_task(void *ctx, uint32_t t, uint32_t worker)
{
	const attn_job *j = ctx;
	const kvt_attention_args *a = j->a;
	const uint32_t n_kv = a->kv->n_kv_heads, G = a->n_heads / n_kv, bt = a->kv->block_tokens;
	const uint32_t rb = j->n_row_blocks - 1 - t / n_kv, r0 = rb * ATTN_ROWS;
	const uint32_t nr = a->n_rows - r0 < ATTN_ROWS ? a->n_rows - r0 : ATTN_ROWS;
	attend_blocks(j, r0, nr, (t % n_kv) * G, G, attn_first_key(a, a->pos0 + r0) / bt, (a->pos0 + r0 + nr + bt - 1) / bt,
		      worker);
}

/*
 * Decode (one row): task = (KV head, a share of its query heads), so a model
 * with few KV heads still keeps the threads busy. NOTE: the keys are never
 * split across tasks (a split-K merge sums in an order set by the split, which
 * followed the thread count): each query runs attend_blocks's steps, as its
 * row of a prompt would.
 */
void kvt_cpu_attention_decode_task(void *ctx, uint32_t t, uint32_t worker)
{
	const attn_job *j = ctx;
	const kvt_attention_args *a = j->a;
	const uint32_t G = a->n_heads / a->kv->n_kv_heads, bt = a->kv->block_tokens;
	const uint32_t kh = t / j->n_shares, sh = t % j->n_shares;
	const uint32_t g0 = G * sh / j->n_shares, g1 = G * (sh + 1) / j->n_shares;
	if (g0 < g1)
		attend_blocks(j, 0, 1, kh * G + g0, g1 - g0, attn_first_key(a, a->pos0) / bt, (a->pos0 + bt) / bt, worker);
}

#ifdef KVT_HAVE_CODEC8
/*
 * The fast path of the codecs, 8 values at a time, giving the reference's
 * bytes: F16C conversions (round to nearest even, as kvt_f32_to_f16), the
 * integer conversions in the default rounding mode (nearest even, as rintf),
 * and FP8 encoding by integer arithmetic on the float's bits: adding
 * 0x7FFFF plus the kept mantissa's lowest bit rounds the mantissa to 3 bits,
 * nearest even, with the carry running into the exponent.
 */
static inline __m256i fp8_encode8(__m256 v)
{
	const __m256i b = _mm256_castps_si256(v);
	const __m256i ab = _mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF));
	const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(b, 24), _mm256_set1_epi32(0x80));
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(ab, 20), _mm256_set1_epi32(1));
	__m256i r = _mm256_add_epi32(ab, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF), lsb));
	__m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(r, 20), _mm256_set1_epi32(120 << 3));
	normal = _mm256_min_epi32(normal, _mm256_set1_epi32(0x7E)); /* saturate at 448 */
	__m256i sub = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(ab), _mm256_set1_ps(512.0f)));
	__m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3C800000), ab); /* |v| < 2^-6 */
	__m256i code = _mm256_or_si256(_mm256_blendv_epi8(normal, sub, is_sub), sign);
	__m256i is_nan = _mm256_cmpgt_epi32(ab, _mm256_set1_epi32(0x7F800000));
	return _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F), is_nan);
}

void kvt_cpu_pack_group8(int codec, const uint16_t *x, uint32_t n, uint8_t *codes, float *scale)
{
	const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
	__m256 mx = _mm256_setzero_ps();
	for (uint32_t i = 0; i < n; i += 8)
		mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), absm));
	__m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
	h = _mm_max_ps(h, _mm_movehl_ps(h, h));
	h = _mm_max_ss(h, _mm_movehdup_ps(h));
	float s, inv;
	kvt_codec_scales(_mm_cvtss_f32(h), codec == KVT_KV_CODEC_FP8 ? KVT_FP8_MAX : KVT_INT8_MAX, &s, &inv);
	const __m256 vinv = _mm256_set1_ps(inv);
	for (uint32_t i = 0; i < n; i += 8) {
		__m256 v = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))), vinv);
		__m256i c = codec == KVT_KV_CODEC_FP8 ? fp8_encode8(v)
						       : _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(v),
											   _mm256_set1_epi32(127)),
									  _mm256_set1_epi32(-127));
		/* 8 x int32 -> 8 bytes (low byte of each lane) */
		__m128i lo = _mm256_castsi256_si128(c), hi = _mm256_extracti128_si256(c, 1);
		__m128i w16 = _mm_packs_epi32(_mm_and_si128(lo, _mm_set1_epi32(0xFF)), _mm_and_si128(hi, _mm_set1_epi32(0xFF)));
		__m128i w8 = _mm_packus_epi16(w16, w16);
		_mm_storel_epi64((__m128i *)(codes + i), w8);
	}
	*scale = s;
}

static float fp8_lut[256];
static pthread_once_t fp8_lut_once = PTHREAD_ONCE_INIT;
static void fp8_lut_init(void)
{
	for (int c = 0; c < 256; c++)
		fp8_lut[c] = kvt_fp8_e4m3_decode((uint8_t)c);
}

void kvt_cpu_codec8_init(void)
{
	pthread_once(&fp8_lut_once, fp8_lut_init);
}

void kvt_cpu_unpack_group8(int codec, const uint8_t *codes, float s, uint32_t n, uint16_t *x)
{
	const __m256 vs = _mm256_set1_ps(s);
	for (uint32_t i = 0; i < n; i += 8) {
		__m128i c8 = _mm_loadl_epi64((const __m128i *)(codes + i));
		__m256 c = codec == KVT_KV_CODEC_FP8 ? _mm256_i32gather_ps(fp8_lut, _mm256_cvtepu8_epi32(c8), 4)
						      : _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c8));
		_mm_storeu_si128((__m128i *)(x + i),
				 _mm256_cvtps_ph(_mm256_mul_ps(c, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	}
}
#endif
