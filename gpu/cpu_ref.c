/*
 * gpu/cpu_ref.c — the CPU backend's reference loops: the oracle that every
 * other path and backend is tested against (tests/test_dev_parity.c,
 * tests/test_gpu_parity.c), written to be read.
 *
 * matmul reads every weight through row_elem, one element at a time, in any
 * dtype; attention takes one (query row, head) pair at a time over every
 * visible key; the codecs code one group of a vector at a time. The ops
 * that have one path on this backend are these loops too: rmsnorm, rope,
 * swiglu and add as tasks that the fast path only runs on the worker pool
 * (par_run), so both paths give the same bits; kv_store, argmax and sample
 * on the calling thread, whichever path.
 *
 * Invariant: nothing here allocates; scratch comes from the caller's
 * workspace (attention: attn_job.ws, sample: ws).
 */
#include "cpu_int.h"

/* y[i] += p * b[i] over n elements, b fp16. */
static void axpy_f16(float *y, float p, const uint16_t *b, size_t n)
{
	size_t i = 0;
#ifdef KVT_HAVE_F16C
	__m256 vp = _mm256_set1_ps(p);
	for (; i + 8 <= n; i += 8) {
		__m256 vb = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, vb, _mm256_loadu_ps(y + i)));
	}
#endif
	for (; i < n; i++)
		y[i] += p * kvt_f16_to_f32(b[i]);
}

/* Element k of a Q4_K, Q5_K or Q6_K row (layouts in dev.h). */
static float kquant_elem(int dtype, const uint8_t *row, size_t k)
{
	const size_t j = k % KVT_QK_BLOCK;
	uint16_t d16, m16;
	int sc, mn, q;

	if (dtype == KVT_DTYPE_Q6_K) {
		const uint8_t *b = row + k / KVT_QK_BLOCK * 210;
		const size_t half = j / 128, l = j % 32, i = j % 128 / 32;
		const uint8_t ql = b[64 * half + l + 32 * (i & 1)], qh = b[128 + 32 * half + l];
		q = ((i < 2 ? ql & 15 : ql >> 4) | ((qh >> (2 * i)) & 3) << 4) - 32;
		memcpy(&d16, b + 208, 2);
		return kvt_f16_to_f32(d16) * (float)(int8_t)b[192 + j / 16] * (float)q;
	}
	const bool q5 = dtype == KVT_DTYPE_Q5_K;
	const uint8_t *b = row + k / KVT_QK_BLOCK * (q5 ? 176 : 144);
	const size_t sub = j / 32, l = j % 32;
	const uint8_t nib = b[(q5 ? 48 : 16) + 32 * (sub / 2) + l];
	q = sub & 1 ? nib >> 4 : nib & 15;
	if (q5)
		q |= ((b[16 + l] >> sub) & 1) << 4;
	kq_scale_min((int)sub, b + 4, &sc, &mn);
	memcpy(&d16, b, 2);
	memcpy(&m16, b + 2, 2);
	/* NOTE: one explicit fma, so every backend (and the compiler's contraction
	 * choices) rounds the same way: the CUDA kernels write the same expression */
	return fmaf(kvt_f16_to_f32(d16) * (float)sc, (float)q, -(kvt_f16_to_f32(m16) * (float)mn));
}

/* One weight element of a row in any dtype; the reference path's only reader. */
float kvt_cpu_row_elem(int dtype, const void *row, size_t k)
{
	const uint8_t *b = (const uint8_t *)row;
	const size_t blk = k / KVT_QBLOCK, j = k % KVT_QBLOCK;
	uint16_t d16, m16;

	switch (dtype) {
	case KVT_DTYPE_F32:
		return ((const float *)row)[k];
	case KVT_DTYPE_F16:
		return kvt_f16_to_f32(((const uint16_t *)row)[k]);
	case KVT_DTYPE_Q8_0:
		b += blk * 34;
		memcpy(&d16, b, 2);
		return kvt_f16_to_f32(d16) * (float)(int8_t)b[2 + j];
	case KVT_DTYPE_Q4_0:
		b += blk * 18;
		memcpy(&d16, b, 2);
		return kvt_f16_to_f32(d16) * (float)((j < 16 ? b[2 + j] & 15 : b[2 + j - 16] >> 4) - 8);
	case KVT_DTYPE_Q4_1:
		b += blk * 20;
		memcpy(&d16, b, 2);
		memcpy(&m16, b + 2, 2);
		return kvt_f16_to_f32(d16) * (float)(j < 16 ? b[4 + j] & 15 : b[4 + j - 16] >> 4) + kvt_f16_to_f32(m16);
	case KVT_DTYPE_Q5_0: {
		uint32_t qh;
		b += blk * 22;
		memcpy(&d16, b, 2);
		memcpy(&qh, b + 2, 4);
		int q = (j < 16 ? b[6 + j] & 15 : b[6 + j - 16] >> 4) | (int)((qh >> j) & 1) << 4;
		return kvt_f16_to_f32(d16) * (float)(q - 16);
	}
	default:
		return kquant_elem(dtype, b, k);
	}
}

int kvt_cpu_matmul_ref(const kvt_matmul_args *a)
{
	const size_t row_bytes = kvt_dtype_row_bytes(a->w_dtype, a->n_in);
	for (uint32_t m = 0; m < a->n_rows; m++) {
		const float *x = a->x + (size_t)m * a->n_in;
		for (uint32_t n = 0; n < a->n_out; n++) {
			const void *w = (const uint8_t *)a->w + n * row_bytes;
			float s = 0;
			for (uint32_t k = 0; k < a->n_in; k++)
				s += x[k] * kvt_cpu_row_elem(a->w_dtype, w, k);
			float *y = &a->y[(size_t)m * a->n_out + n];
			*y = a->accumulate ? *y + s : s;
		}
	}
	return KVT_OK;
}

/* ---- elementwise and row ops: tasks for par_run (one row, or a range of elements) ---- */

void kvt_cpu_rmsnorm_task(void *ctx, uint32_t m, uint32_t worker)
{
	const kvt_rmsnorm_args *a = ctx;
	const float *x = a->x + (size_t)m * a->n_dim;
	float *y = a->y + (size_t)m * a->n_dim;
	double ss = 0; /* double: the mean square of up to 64K features, summed once */
	for (uint32_t i = 0; i < a->n_dim; i++)
		ss += (double)x[i] * x[i];
	float r = 1.0f / sqrtf((float)(ss / a->n_dim) + a->eps);
	for (uint32_t i = 0; i < a->n_dim; i++)
		y[i] = x[i] * r * a->w[i];
}

void kvt_cpu_rope_task(void *ctx, uint32_t m, uint32_t worker)
{
	/* NOTE: theta advances by repeated fp32 multiplication, as ggml's rope
	 * cache does, so angles round the same way as llama.cpp's. */
	const kvt_rope_args *a = ctx;
	const float theta_scale = powf(a->freq_base, -2.0f / (float)a->n_rot);
	const uint32_t half = a->n_rot / 2;
	float theta = (float)a->pos[m];
	for (uint32_t i = 0; i < half; i++) {
		const float th = a->freq_factors ? theta / a->freq_factors[i] : theta;
		const float c = cosf(th), s = sinf(th);
		/* the pair's two dims: adjacent, or half the rotated width apart (NEOX) */
		const uint32_t i0 = a->neox ? i : 2 * i, i1 = a->neox ? i + half : 2 * i + 1;
		for (uint32_t h = 0; h < a->n_heads; h++) {
			float *x = a->x + ((size_t)m * a->n_heads + h) * a->head_dim;
			float x0 = x[i0], x1 = x[i1];
			x[i0] = x0 * c - x1 * s;
			x[i1] = x0 * s + x1 * c;
		}
		theta *= theta_scale;
	}
}

/* GELU, tanh form, in fp32 as ggml computes it. */
static inline float gelu_tanh(float x)
{
	const float k = 0.79788456080286535587989211986876f; /* sqrt(2 / pi) */
	return 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
}

void kvt_cpu_swiglu_task(void *ctx, uint32_t t, uint32_t worker)
{
	const elem_job *j = ctx;
	const kvt_swiglu_args *a = j->args;
	uint64_t lo, hi;
	task_range(j->n, j->n_tasks, t, &lo, &hi);
	if (a->act == KVT_ACT_GELU_TANH) {
		for (uint64_t i = lo; i < hi; i++)
			a->y[i] = gelu_tanh(a->gate[i]) * a->up[i];
		return;
	}
	for (uint64_t i = lo; i < hi; i++) {
		float g = a->gate[i];
		a->y[i] = g / (1.0f + expf(-g)) * a->up[i];
	}
}

void kvt_cpu_add_task(void *ctx, uint32_t t, uint32_t worker)
{
	const elem_job *j = ctx;
	const kvt_add_args *a = j->args;
	uint64_t lo, hi;
	task_range(j->n, j->n_tasks, t, &lo, &hi);
	if (a->n_x) { /* a row broadcast over the rows of y */
		for (uint64_t i = lo; i < hi; i++)
			a->y[i] += a->x[i % a->n_x];
		return;
	}
	for (uint64_t i = lo; i < hi; i++)
		a->y[i] += a->x[i];
}

/* ---- block codecs ---- */

/*
 * Block codecs. Plain loops on the calling thread: these run on the tiering
 * manager's threads, beside the compute thread that owns the worker pool.
 * One vector is the head_dim values of one (layer, K/V, head, token); it is
 * coded as kvt_codec_group_dims-sized groups, each with its own scale
 * (kvt_cpu_pack_group / kvt_cpu_unpack_group code one group of n values).
 */
void kvt_cpu_pack_group(int codec, const uint16_t *x, uint32_t n, uint8_t *codes, float *scale)
{
	float amax = 0.0f, s, inv;
	for (uint32_t i = 0; i < n; i++) {
		float a = fabsf(kvt_f16_to_f32(x[i]));
		amax = a > amax ? a : amax;
	}
	kvt_codec_scales(amax, codec == KVT_KV_CODEC_FP8 ? KVT_FP8_MAX : KVT_INT8_MAX, &s, &inv);
	for (uint32_t i = 0; i < n; i++) {
		float v = kvt_f16_to_f32(x[i]) * inv;
		codes[i] = codec == KVT_KV_CODEC_FP8 ? kvt_fp8_e4m3_encode(v) : (uint8_t)kvt_int8_encode(v);
	}
	*scale = s;
}

void kvt_cpu_unpack_group(int codec, const uint8_t *codes, float s, uint32_t n, uint16_t *x)
{
	for (uint32_t i = 0; i < n; i++) {
		float c = codec == KVT_KV_CODEC_FP8 ? kvt_fp8_e4m3_decode(codes[i]) : (float)(int8_t)codes[i];
		x[i] = kvt_f32_to_f16(c * s);
	}
}

/* One vector of hd values, group after group; scales (fp32) need not be aligned. */
void kvt_cpu_pack_vec(pack_group_fn pack, int codec, const uint16_t *x, uint32_t hd, uint8_t *codes, uint8_t *scales)
{
	const uint32_t gd = kvt_codec_group_dims(codec, hd);
	for (uint32_t g = 0; g < hd / gd; g++) {
		float sc;
		pack(codec, x + g * gd, gd, codes + g * gd, &sc);
		memcpy(scales + g * sizeof(float), &sc, sizeof(float));
	}
}

void kvt_cpu_unpack_vec(unpack_group_fn unpack, int codec, const uint8_t *codes, const uint8_t *scales, uint32_t hd,
		       uint16_t *x)
{
	const uint32_t gd = kvt_codec_group_dims(codec, hd);
	for (uint32_t g = 0; g < hd / gd; g++) {
		float sc;
		memcpy(&sc, scales + g * sizeof(float), sizeof(float));
		unpack(codec, codes + g * gd, sc, gd, x + g * gd);
	}
}

/*
 * INT8KV and INT8KV1, one block: K channel by channel over the block's
 * tokens, V token by token in groups (kv_codec.h has the offsets and the
 * arithmetic). Each parameter is stored first and the stored value is the one
 * used, so pack and unpack agree bit for bit.
 */
static float par_f16(const uint8_t *par, size_t at)
{
	uint16_t h;
	memcpy(&h, par + at, 2);
	return kvt_f16_to_f32(h);
}

/* A scale at byte at: INT8KV an E5M3 byte (rounded up), INT8KV1 fp16 (nearest). Returns the stored value. */
static float scale_put(int codec, uint8_t *par, size_t at, float x)
{
	if (codec == KVT_KV_CODEC_INT8KV) {
		par[at] = kvt_e5m3_encode_up(x);
		return kvt_e5m3_decode(par[at]);
	}
	uint16_t h = kvt_f32_to_f16(x);
	memcpy(par + at, &h, 2);
	return kvt_f16_to_f32(h);
}

static float scale_get(int codec, const uint8_t *par, size_t at)
{
	return codec == KVT_KV_CODEC_INT8KV ? kvt_e5m3_decode(par[at]) : par_f16(par, at);
}

/* A K minimum at byte at, fp16: INT8KV rounds it down (never above the channel's minimum), INT8KV1 to nearest. */
static float kmin_put(int codec, uint8_t *par, size_t at, float mn)
{
	uint16_t h = kvt_f32_to_f16(mn);
	if (codec == KVT_KV_CODEC_INT8KV && kvt_f16_to_f32(h) > mn)
		h = kvt_f16_bits_down(h);
	memcpy(par + at, &h, 2);
	return kvt_f16_to_f32(h);
}

static void int8kv_pack_k(int codec, const kvt_kv_layout *l, const uint16_t *k, uint8_t *codes, uint8_t *par,
			  uint32_t layer, uint32_t head)
{
	const uint32_t T = l->block_tokens, D = l->head_dim, H = l->n_kv_heads;
	for (uint32_t d = 0; d < D; d++) {
		float mn = INFINITY, mx = -INFINITY;
		for (uint32_t t = 0; t < T; t++) {
			float x = kvt_f16_to_f32(k[(size_t)t * D + d]);
			mn = x < mn ? x : mn;
			mx = x > mx ? x : mx;
		}
		const float m = kmin_put(codec, par, kvt_int8kv_kmin_at(codec, H, T, D, layer, head, d), mn);
		const float s = scale_put(codec, par, kvt_int8kv_kscale_at(codec, H, T, D, layer, head, d), (mx - m) / KVT_KVK_QMAX);
		const float inv = kvt_int8kv_inv(s);
		for (uint32_t t = 0; t < T; t++)
			codes[(size_t)t * D + d] = kvt_int8kv_k_encode(kvt_f16_to_f32(k[(size_t)t * D + d]), m, inv);
	}
}

static void int8kv_pack_v(int codec, const kvt_kv_layout *l, const uint16_t *v, uint8_t *codes, uint8_t *par,
			  uint32_t layer, uint32_t head)
{
	const uint32_t T = l->block_tokens, D = l->head_dim, H = l->n_kv_heads, ng = kvt_int8kv_ng(codec, D), gd = D / ng;
	for (uint32_t t = 0; t < T; t++)
		for (uint32_t g = 0; g < ng; g++) {
			const uint16_t *x = v + (size_t)t * D + g * gd;
			float amax = 0.0f;
			for (uint32_t i = 0; i < gd; i++) {
				float a = fabsf(kvt_f16_to_f32(x[i]));
				amax = a > amax ? a : amax;
			}
			const size_t at = kvt_int8kv_vscale_at(codec, H, T, D, layer, head, t, g);
			const float inv = kvt_int8kv_inv(scale_put(codec, par, at, amax / KVT_INT8_MAX));
			for (uint32_t i = 0; i < gd; i++)
				codes[(size_t)t * D + g * gd + i] = (uint8_t)kvt_int8_encode(kvt_f16_to_f32(x[i]) * inv);
		}
}

void kvt_cpu_pack_int8kv(int codec, const kvt_kv_layout *l, const uint16_t *src, uint8_t *dst)
{
	const uint32_t T = l->block_tokens, D = l->head_dim, H = l->n_kv_heads;
	const size_t n_vec = (size_t)l->n_layers * 2 * H * T, seg = (size_t)T * D;
	uint8_t *par = dst + n_vec * D;
	for (uint32_t layer = 0; layer < l->n_layers; layer++)
		for (uint32_t h = 0; h < H; h++) {
			const size_t ko = (((size_t)layer * 2 + 0) * H + h) * seg, vo = (((size_t)layer * 2 + 1) * H + h) * seg;
			int8kv_pack_k(codec, l, src + ko, dst + ko, par, layer, h);
			int8kv_pack_v(codec, l, src + vo, dst + vo, par, layer, h);
		}
}

void kvt_cpu_unpack_int8kv(int codec, const kvt_kv_layout *l, const uint8_t *src, uint16_t *dst)
{
	const uint32_t T = l->block_tokens, D = l->head_dim, H = l->n_kv_heads, ng = kvt_int8kv_ng(codec, D), gd = D / ng;
	const size_t n_vec = (size_t)l->n_layers * 2 * H * T, seg = (size_t)T * D;
	const uint8_t *par = src + n_vec * D;
	for (uint32_t layer = 0; layer < l->n_layers; layer++)
		for (uint32_t h = 0; h < H; h++) {
			const size_t ko = (((size_t)layer * 2 + 0) * H + h) * seg, vo = (((size_t)layer * 2 + 1) * H + h) * seg;
			for (uint32_t d = 0; d < D; d++) {
				const float s = scale_get(codec, par, kvt_int8kv_kscale_at(codec, H, T, D, layer, h, d));
				const float m = par_f16(par, kvt_int8kv_kmin_at(codec, H, T, D, layer, h, d));
				for (uint32_t t = 0; t < T; t++)
					dst[ko + (size_t)t * D + d] = kvt_f32_to_f16(kvt_int8kv_k_decode(src[ko + (size_t)t * D + d], m, s));
			}
			for (uint32_t t = 0; t < T; t++)
				for (uint32_t g = 0; g < ng; g++) {
					const float s = scale_get(codec, par, kvt_int8kv_vscale_at(codec, H, T, D, layer, h, t, g));
					for (uint32_t i = t * D + g * gd; i < t * D + (g + 1) * gd; i++)
						dst[vo + i] = kvt_f32_to_f16((float)(int8_t)src[vo + i] * s);
				}
		}
}

/* ---- paged KV ---- */

/*
 * 8-bit pools (codec FP8 or INT8): a block is the packed format of dev.h,
 * codes of vector vi = ((layer * 2 + kv) * n_kv_heads + head) * block_tokens + t
 * at vi * head_dim, the fp32 scale of its group g (ng = head_dim /
 * kvt_codec_group_dims groups: 1 for FP8) at n_vec * head_dim + (vi * ng + g) * 4.
 */
static size_t q_vec(const kvt_kv_layout *l, uint32_t layer, uint32_t kv, uint32_t head, uint32_t t)
{
	return (((size_t)layer * 2 + kv) * l->n_kv_heads + head) * l->block_tokens + t;
}

/* K or V of one token and head as fp32, from a pool of any codec. */
static void kv_vec(const kvt_kv_layout *l, int32_t slot, uint32_t layer, uint32_t kv, uint32_t head, uint32_t t,
		   float *out)
{
	const uint32_t hd = l->head_dim;
	if (l->codec == KVT_KV_CODEC_F16) {
		const uint16_t *r = kv_row(l, slot, layer, kv, head, t);
		for (uint32_t i = 0; i < hd; i++)
			out[i] = kvt_f16_to_f32(r[i]);
		return;
	}
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < l->n_slots);
	const uint8_t *base = (const uint8_t *)l->pool + (size_t)slot * kvt_kv_block_bytes(l);
	const size_t n_vec = (size_t)l->n_layers * 2 * l->n_kv_heads * l->block_tokens, vi = q_vec(l, layer, kv, head, t);
	const uint32_t gd = kvt_codec_group_dims(l->codec, hd), ng = hd / gd;
	for (uint32_t g = 0; g < ng; g++) {
		float sc;
		memcpy(&sc, base + n_vec * hd + (vi * ng + g) * 4, 4);
		for (uint32_t i = g * gd; i < (g + 1) * gd; i++) {
			uint8_t c = base[vi * hd + i];
			out[i] = (l->codec == KVT_KV_CODEC_FP8 ? kvt_fp8_e4m3_decode(c) : (float)(int8_t)c) * sc;
		}
	}
}

/* Quantize one new token's K or V (rounded to fp16 first, as kv_pack sees it). */
static void kv_store_q(const kvt_kv_layout *l, int32_t slot, uint32_t layer, uint32_t kv, uint32_t head, uint32_t t,
		       const float *x)
{
	const uint32_t hd = l->head_dim;
	uint16_t h16[1024];
	KVT_ASSERT(hd <= 1024 && slot >= 0 && (uint32_t)slot < l->n_slots);
	for (uint32_t i = 0; i < hd; i++)
		h16[i] = kvt_f32_to_f16(x[i]);
	uint8_t *base = (uint8_t *)l->pool + (size_t)slot * kvt_kv_block_bytes(l);
	const size_t n_vec = (size_t)l->n_layers * 2 * l->n_kv_heads * l->block_tokens, vi = q_vec(l, layer, kv, head, t);
	const uint32_t ng = hd / kvt_codec_group_dims(l->codec, hd);
	kvt_cpu_pack_vec(kvt_cpu_pack_group, l->codec, h16, hd, base + vi * hd, base + n_vec * hd + vi * ng * 4);
}

int kvt_cpu_kv_load(kvt_dev *d, const kvt_kv_load_args *a)
{
	(void)d;
	const kvt_kv_layout *l = a->kv;
	const uint32_t hd = l->head_dim;
	for (uint32_t m = 0; m < a->n_rows; m++) {
		uint32_t pos = a->pos0 + m;
		int32_t slot = a->block_table[pos / l->block_tokens];
		for (uint32_t h = 0; h < l->n_kv_heads; h++) {
			const size_t dst = ((size_t)m * l->n_kv_heads + h) * hd;
			kv_vec(l, slot, a->layer, 0, h, pos % l->block_tokens, a->k + dst);
			kv_vec(l, slot, a->layer, 1, h, pos % l->block_tokens, a->v + dst);
		}
	}
	return KVT_OK;
}

int kvt_cpu_kv_store(kvt_dev *d, const kvt_kv_store_args *a)
{
	kvt_kv_store_args at_pos;
	if (a->d_pos0) { /* the position lives in (host-addressable) device memory */
		at_pos = *a;
		at_pos.pos0 = (uint32_t)*a->d_pos0;
		at_pos.d_pos0 = NULL;
		a = &at_pos;
	}
	const kvt_kv_layout *l = a->kv;
	const uint32_t hd = l->head_dim;

	if (l->codec != KVT_KV_CODEC_F16) {
		for (uint32_t m = 0; m < a->n_rows; m++) {
			uint32_t pos = a->pos0 + m, t = pos % l->block_tokens;
			int32_t slot = a->block_table[pos / l->block_tokens];
			for (uint32_t h = 0; h < l->n_kv_heads; h++) {
				const size_t src = ((size_t)m * l->n_kv_heads + h) * hd;
				kv_store_q(l, slot, a->layer, 0, h, t, a->k + src);
				kv_store_q(l, slot, a->layer, 1, h, t, a->v + src);
			}
		}
		return KVT_OK;
	}

	for (uint32_t m = 0; m < a->n_rows; m++) {
		uint32_t pos = a->pos0 + m;
		int32_t slot = a->block_table[pos / l->block_tokens];
		for (uint32_t h = 0; h < l->n_kv_heads; h++) {
			const size_t src = ((size_t)m * l->n_kv_heads + h) * hd;
			uint16_t *k = kv_row(l, slot, a->layer, 0, h, pos % l->block_tokens);
			uint16_t *v = kv_row(l, slot, a->layer, 1, h, pos % l->block_tokens);
			for (uint32_t i = 0; i < hd; i++) {
				k[i] = kvt_f32_to_f16(a->k[src + i]);
				v[i] = kvt_f32_to_f16(a->v[src + i]);
			}
		}
	}
	return KVT_OK;
}

/* One (query row, head) pair: softmax(q K^T * scale) V over the visible positions.
 * The reference kernel. */
void kvt_cpu_attention_task(void *ctx, uint32_t w, uint32_t worker)
{
	const attn_job *j = ctx;
	const kvt_attention_args *a = j->a;
	const kvt_kv_layout *l = a->kv;
	const uint32_t hd = l->head_dim, bt = l->block_tokens;
	const uint32_t group = a->n_heads / l->n_kv_heads;
	const size_t n_ctx = (size_t)a->pos0 + a->n_rows;
	const uint32_t m = w / a->n_heads, h = w % a->n_heads, kh = h / group;
	const uint32_t n_vis = a->pos0 + m + 1; /* causal: positions 0..pos0+m */
	const uint32_t first = attn_first_key(a, a->pos0 + m); /* the sliding window's start */
	float *scores = j->ws + (size_t)worker * j->ws_floats;
	float *acc = scores + n_ctx;
	const float *q = a->q + ((size_t)m * a->n_heads + h) * hd;
	float mx = -INFINITY;

	float *row = acc + hd; /* one K or V row of an 8-bit pool, dequantized */
	const bool q8 = l->codec != KVT_KV_CODEC_F16;

	for (uint32_t p = first; p < n_vis; p++) {
		float s;
		if (q8) {
			kv_vec(l, a->block_table[p / bt], a->layer, 0, kh, p % bt, row);
			s = dot_f32(q, row, hd) * a->scale;
		} else {
			s = dot_f32_f16(q, kv_row(l, a->block_table[p / bt], a->layer, 0, kh, p % bt), hd) * a->scale;
		}
		scores[p] = s;
		mx = s > mx ? s : mx;
	}
	float sum = 0;
	for (uint32_t p = first; p < n_vis; p++) {
		scores[p] = expf(scores[p] - mx);
		sum += scores[p];
	}
	memset(acc, 0, hd * sizeof(float));
	for (uint32_t p = first; p < n_vis; p++) {
		if (q8) {
			kv_vec(l, a->block_table[p / bt], a->layer, 1, kh, p % bt, row);
			scale_axpy_f32(acc, 1.0f, scores[p] / sum, row, hd);
		} else {
			axpy_f16(acc, scores[p] / sum, kv_row(l, a->block_table[p / bt], a->layer, 1, kh, p % bt), hd);
		}
	}
	memcpy(a->out + ((size_t)m * a->n_heads + h) * hd, acc, hd * sizeof(float));
}

int kvt_cpu_argmax(kvt_dev *d, const kvt_argmax_args *a)
{
	for (uint32_t m = 0; m < a->n_rows; m++) {
		const float *x = a->x + (size_t)m * a->n_cols;
		uint32_t best = 0;
		for (uint32_t i = 1; i < a->n_cols; i++)
			if (x[i] > x[best])
				best = i;
		a->out[m] = (int32_t)best;
	}
	return KVT_OK;
}

/*
 * Sampling, plainly: weights, a sorted copy for the top-k value and the
 * top-p cut, then a walk in index order (the definition in dev.h).
 * NaN logits get weight -1, below every threshold.
 */
size_t kvt_cpu_sample_workspace(const kvt_dev *d, const kvt_sample_args *a)
{
	return (size_t)a->n_cols * 2 * sizeof(float);
}

static int cmp_desc(const void *pa, const void *pb)
{
	float x = *(const float *)pa, y = *(const float *)pb;
	return x < y ? 1 : (x > y ? -1 : 0);
}

int kvt_cpu_sample(kvt_dev *d, const kvt_sample_args *a, void *ws)
{
	const uint32_t n = a->n_cols;
	float *w = ws, *srt = w + n;
	for (uint32_t r = 0; r < a->n_rows; r++) {
		const float *x = a->x + (size_t)r * n;
		float m = -INFINITY;
		uint32_t nv = 0;
		for (uint32_t i = 0; i < n; i++)
			if (x[i] == x[i]) {
				m = x[i] > m ? x[i] : m;
				nv++;
			}
		if (!nv || m == -INFINITY) {
			a->out[r] = -1; /* nothing to draw from */
			continue;
		}
		for (uint32_t i = 0; i < n; i++)
			w[i] = x[i] == x[i] ? expf((x[i] - m) / a->temperature) : -1.0f;
		memcpy(srt, w, n * sizeof(float));
		qsort(srt, n, sizeof(float), cmp_desc);
		float tk = a->top_k && a->top_k < nv ? srt[a->top_k - 1] : 0.0f, tp = 0.0f;
		if (a->top_p < 1.0f) {
			double zk = 0, acc = 0;
			for (uint32_t i = 0; i < n; i++)
				if (w[i] >= tk)
					zk += w[i];
			const double target = (double)a->top_p * zk;
			for (uint32_t j = 0; j < nv && srt[j] >= tk;) {
				float v = srt[j];
				while (j < nv && srt[j] == v)
					acc += srt[j++];
				if (acc >= target) {
					tp = v;
					break;
				}
			}
		}
		const float thr = tk > tp ? tk : tp;
		double z = 0, c = 0;
		for (uint32_t i = 0; i < n; i++)
			if (w[i] >= thr)
				z += w[i];
		const double target = (double)a->u[r] * z;
		int32_t pick = -1;
		for (uint32_t i = 0; i < n; i++) {
			if (w[i] < thr)
				continue;
			pick = (int32_t)i;
			c += w[i];
			if (c > target)
				break;
		}
		a->out[r] = pick;
	}
	return KVT_OK;
}
