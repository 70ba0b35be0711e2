/*
 * gpu/cpu_int.h — the CPU backend's shared internals (gpu/ only): the device
 * object, the task helpers (par_run, split, task_range), the small vector
 * helpers that the reference loops and the fast paths both call, the job
 * structs the dispatcher hands to either, and the functions each file
 * exports to the others. The backend is three files:
 *
 *   dev_cpu.c   the ops table and kvt_dev_cpu_create, memory, copies,
 *               streams and events, and the dispatch: use_ref (set at
 *               create) picks the reference or the fast path of each op
 *   cpu_ref.c   the reference: plain loops, as readable as llama2.c, the
 *               oracle the parity tests trust; the ops with a single path
 *               are these loops too (rmsnorm, rope, swiglu and add as tasks
 *               the fast path runs on the worker pool; kv_store and sample
 *               on the calling thread; argmax's fast path is core's
 *               kvt_argmax_f32, on the calling thread too)
 *   cpu_fast.c  the fast paths: the matmul kernel table (F16C/AVX2 GEMVs,
 *               the AVX-512 int8 GEMM), blocked attention, the 8-wide
 *               codecs
 *
 * NOTE: the helpers here (dot_f32, dot_f32_f16, scale_axpy_f32) take their
 * F16C/FMA path wherever the build has one, in the reference attention too,
 * as they always have: the reference's plainness is its loop structure, one
 * (row, head) at a time over every visible key.
 *
 * Invariant: the reference and the fast path of an op see the same
 * arguments and write the same outputs; their results agree within the
 * tolerances of tests/test_dev_parity.c, and bitwise where it says so.
 */
#ifndef KVT_CPU_INT_H
#define KVT_CPU_INT_H

#include "cpu_pool.h"
#include "dev_impl.h"
#include "kv_codec.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define KVT_HAVE_F16C 1
#endif
#if defined(KVT_HAVE_F16C) && defined(__AVX2__)
#define KVT_HAVE_CODEC8 1 /* the codecs' 8-wide fast path */
#endif
/* 256-bit integer dot products (vpdpwssd, vpdpbusd): AVX512-VNNI with VL (Zen 4, Ice Lake on), or AVX-VNNI */
#if defined(KVT_HAVE_F16C) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KVT_HAVE_VNNI 1
#define kvt_dpwssd256 _mm256_dpwssd_epi32
#define kvt_dpbusd256 _mm256_dpbusd_epi32
#elif defined(KVT_HAVE_F16C) && defined(__AVXVNNI__)
#define KVT_HAVE_VNNI 1
#define kvt_dpwssd256 _mm256_dpwssd_avx_epi32
#define kvt_dpbusd256 _mm256_dpbusd_avx_epi32
#endif

typedef struct cpu_dev {
	kvt_dev base;        /* common head; must be first */
	kvt_cpu_pool *pool;  /* workers (fast path only) */
} cpu_dev;

static inline int cpu_n_threads(const kvt_dev *d)
{
	return d->use_ref ? 1 : d->n_threads;
}

/* Run tasks on the pool, or in order on this thread for the reference path. */
static inline void par_run(kvt_dev *d, uint32_t n_tasks, kvt_cpu_task_fn fn, void *ctx)
{
	cpu_dev *c = (cpu_dev *)d;
	if (d->use_ref) {
		for (uint32_t t = 0; t < n_tasks; t++)
			fn(ctx, t, 0);
		return;
	}
	kvt_cpu_pool_run(c->pool, n_tasks, fn, ctx);
}

/* Split n items into tasks of at least min_per items, a few per thread. */
static inline uint32_t split(const kvt_dev *d, uint64_t n, uint64_t min_per)
{
	uint64_t t = (uint64_t)cpu_n_threads(d) * 4;
	if (t > n / min_per)
		t = n / min_per;
	return t ? (uint32_t)t : 1;
}

/* [lo, hi) of task t of n_tasks over n items. */
static inline void task_range(uint64_t n, uint32_t n_tasks, uint32_t t, uint64_t *lo, uint64_t *hi)
{
	*lo = n * t / n_tasks;
	*hi = n * (t + 1) / n_tasks;
}

/* ---- shared helpers (the reference and the fast path both call them) ---- */

#ifdef KVT_HAVE_F16C
/* Sum of the 8 lanes. */
static inline float hsum8(__m256 v)
{
	__m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	h = _mm_add_ps(h, _mm_movehl_ps(h, h));
	h = _mm_add_ss(h, _mm_movehdup_ps(h));
	return _mm_cvtss_f32(h);
}
#endif

/* Dot product of fp32 a with fp16 b over n elements. */
static inline float dot_f32_f16(const float *a, const uint16_t *b, size_t n)
{
	size_t i = 0;
	float s = 0;
#ifdef KVT_HAVE_F16C
	__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
	for (; i + 16 <= n; i += 16) {
		__m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
		__m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i + 8)));
		acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, acc0);
		acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b1, acc1);
	}
	acc0 = _mm256_add_ps(acc0, acc1);
	s = hsum8(acc0);
#endif
	for (; i < n; i++)
		s += a[i] * kvt_f16_to_f32(b[i]);
	return s;
}

/*
 * A K-quant superblock's 12 scale bytes hold 8 (scale, min) pairs of 6 bits:
 * pairs 0..3 are the low 6 bits of bytes 0..3 (scales) and 4..7 (mins);
 * pairs 4..7 take their low 4 bits from bytes 8..11 and their top 2 bits from
 * the top of bytes 0..7 (Q4_K and Q5_K).
 */
static inline void kq_scale_min(int s, const uint8_t *sc, int *scale, int *min)
{
	if (s < 4) {
		*scale = sc[s] & 63;
		*min = sc[s + 4] & 63;
	} else {
		*scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
		*min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
	}
}

static inline bool is_quantized(int dtype)
{
	return dtype >= KVT_DTYPE_Q8_0;
}

/* fp16 K (kv = 0) or V (kv = 1) row of one token and head inside a block. */
static inline uint16_t *kv_row(const kvt_kv_layout *l, int32_t slot, uint32_t layer, uint32_t kv, uint32_t head,
			       uint32_t t)
{
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < l->n_slots);
	size_t off = (size_t)slot * l->n_layers;
	off = ((off + layer) * 2 + kv) * l->n_kv_heads + head;
	off = (off * l->block_tokens + t) * l->head_dim;
	return (uint16_t *)l->pool + off;
}

/* The first position a query at pos sees: pos - window + 1 under a sliding window, else 0. */
static inline uint32_t attn_first_key(const kvt_attention_args *a, uint32_t pos)
{
	return a->window && pos + 1 > a->window ? pos + 1 - a->window : 0;
}

/* Query rows per task of the blocked (prefill) attention kernel. */
#define ATTN_ROWS 8

typedef struct elem_job {
	const void *args;   /* kvt_swiglu_args or kvt_add_args */
	uint64_t n;         /* elements */
	uint32_t n_tasks;   /* chunks */
} elem_job;

typedef struct attn_job {
	const kvt_attention_args *a; /* the op */
	float *ws;                   /* per-worker scratch */
	size_t ws_floats;            /* floats of scratch per worker */
	uint32_t n_row_blocks;       /* prefill: ceil(n_rows / ATTN_ROWS) */
	uint32_t n_shares;           /* decode: tasks per KV head, each a share of its query heads */
} attn_job;

static inline float dot_f32(const float *a, const float *b, size_t n)
{
	size_t i = 0;
	float s = 0;
#ifdef KVT_HAVE_F16C
	__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
	for (; i + 16 <= n; i += 16) {
		acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
		acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
	}
	acc0 = _mm256_add_ps(acc0, acc1);
	s = hsum8(acc0);
#endif
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* y = y * c + p * b over n elements. */
static inline void scale_axpy_f32(float *y, float c, float p, const float *b, size_t n)
{
	size_t i = 0;
#ifdef KVT_HAVE_F16C
	__m256 vc = _mm256_set1_ps(c), vp = _mm256_set1_ps(p);
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(b + i), _mm256_mul_ps(vc, _mm256_loadu_ps(y + i))));
#endif
	for (; i < n; i++)
		y[i] = y[i] * c + p * b[i];
}

typedef void (*pack_group_fn)(int codec, const uint16_t *x, uint32_t n, uint8_t *codes, float *scale);
typedef void (*unpack_group_fn)(int codec, const uint8_t *codes, float s, uint32_t n, uint16_t *x);

/* ---- cpu_ref.c ---- */
float kvt_cpu_row_elem(int dtype, const void *row, size_t k); /* element k of a row of any dtype */
int kvt_cpu_matmul_ref(const kvt_matmul_args *a);
void kvt_cpu_rmsnorm_task(void *ctx, uint32_t m, uint32_t worker); /* ctx: kvt_rmsnorm_args; row m */
void kvt_cpu_rmsnorm_fast_task(void *ctx, uint32_t m, uint32_t worker); /* the same, vectorised (cpu_fast.c) */
void kvt_cpu_rope_task(void *ctx, uint32_t m, uint32_t worker);    /* ctx: kvt_rope_args; row m */
void kvt_cpu_swiglu_task(void *ctx, uint32_t t, uint32_t worker);  /* ctx: elem_job; chunk t */
void kvt_cpu_swiglu_fast_task(void *ctx, uint32_t t, uint32_t worker); /* the same, vectorised (cpu_fast.c) */
void kvt_cpu_add_task(void *ctx, uint32_t t, uint32_t worker);     /* ctx: elem_job; chunk t */
void kvt_cpu_pack_group(int codec, const uint16_t *x, uint32_t n, uint8_t *codes, float *scale);
void kvt_cpu_unpack_group(int codec, const uint8_t *codes, float s, uint32_t n, uint16_t *x);
/* INT8KV or INT8KV1 (codec; dev.h): one fp16 block of layout l (codec F16) to its packed record, and back. */
void kvt_cpu_pack_int8kv(int codec, const kvt_kv_layout *l, const uint16_t *src, uint8_t *dst);
void kvt_cpu_unpack_int8kv(int codec, const kvt_kv_layout *l, const uint8_t *src, uint16_t *dst);
void kvt_cpu_pack_vec(pack_group_fn pack, int codec, const uint16_t *x, uint32_t hd, uint8_t *codes, uint8_t *scales);
void kvt_cpu_unpack_vec(unpack_group_fn unpack, int codec, const uint8_t *codes, const uint8_t *scales, uint32_t hd,
			uint16_t *x);
int kvt_cpu_kv_store(kvt_dev *d, const kvt_kv_store_args *a);
int kvt_cpu_kv_load(kvt_dev *d, const kvt_kv_load_args *a);
void kvt_cpu_attention_task(void *ctx, uint32_t w, uint32_t worker); /* ctx: attn_job; (row, head) w */
int kvt_cpu_argmax(kvt_dev *d, const kvt_argmax_args *a);
size_t kvt_cpu_sample_workspace(const kvt_dev *d, const kvt_sample_args *a);
int kvt_cpu_sample(kvt_dev *d, const kvt_sample_args *a, void *ws);

/* ---- cpu_fast.c ---- */
void kvt_cpu_widen_row(int dtype, const void *row, float *dst, size_t n); /* a row of any dtype as fp32 */
size_t kvt_cpu_matmul_workspace(const kvt_dev *d, const kvt_matmul_args *a); /* 0 on the reference path */
int kvt_cpu_matmul_fast(kvt_dev *d, const kvt_matmul_args *a, void *ws);
void kvt_cpu_attention_prefill_task(void *ctx, uint32_t t, uint32_t worker); /* ctx: attn_job */
void kvt_cpu_attention_decode_task(void *ctx, uint32_t t, uint32_t worker);  /* ctx: attn_job */
#ifdef KVT_HAVE_CODEC8
void kvt_cpu_pack_group8(int codec, const uint16_t *x, uint32_t n, uint8_t *codes, float *scale);
void kvt_cpu_unpack_group8(int codec, const uint8_t *codes, float s, uint32_t n, uint16_t *x);
void kvt_cpu_codec8_init(void); /* before kvt_cpu_unpack_group8: its FP8 table, once per process */
#endif

#endif
