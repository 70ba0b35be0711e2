/*
 * gpu/dev_impl.h — the backend ops table. Backends only; engine/ and tiers/
 * use dev.h.
 *
 * dev.c owns argument validation: an op here receives arguments that already
 * passed it, so a backend checks nothing twice. Each op completes in order on
 * the backend's compute queue; none allocates.
 */
#ifndef KVT_DEV_IMPL_H
#define KVT_DEV_IMPL_H

#include "dev.h"

/*
 * THE ORDER RULE (DESIGN.md §8.1), which every op of a backend keeps:
 *
 *   A row's result is a pure function of that row's inputs and the model:
 *   bitwise independent of how many rows are in the call, which other rows
 *   they are, the thread count, the prompt chunk size ([model] batch), and
 *   whether the row is computed in a prompt (prefill) or a decode step.
 *
 * So a cached prompt's reply equals the cold one's bit for bit, alone or
 * batched, on any thread count. Concretely:
 *   - matmul: each output's float operations are fixed by (stored type,
 *     activation mode, K): one accumulation order (the same partial-sum lanes
 *     and combining order) in the GEMV and in any GEMM tile, so a GEMM row
 *     equals the GEMV of that row. Integer partial sums are exact and may be
 *     grouped freely. No split-K set by the thread count or the batch, and no
 *     kernel chosen by row count unless it keeps the order (a faster tile is
 *     fine; a BLAS call whose order varies with the shape is not). The CPU's
 *     table of kernels and their order: cpu_fast.c, mm_table.
 *   - attention: each query sums its keys in steps fixed by absolute key
 *     position (KV blocks aligned to positions, the same online-softmax
 *     steps), in prefill and decode alike, whatever the chunk boundaries; work
 *     is split across threads by query heads and rows, never across keys
 *     (cpu_fast.c, attend_blocks).
 *   - norms, rope, softmax, sampling: per row; no reduction across rows.
 *   - x's rounding for quantized matmuls (int16, int8) is per row and block.
 * Tests labelled `invariant` check it (ctest -L invariant): kernel sweeps
 * (test_cpu_invariant, every stored type at 1-65 rows, each CPU kernel set;
 * test_gpu_invariant_emu, the CUDA kernels) and the real models.
 * Both backends keep it. The CUDA backend (cuda_matmul.cu, cuda_attn.cu):
 *   - matmul: one kernel for every row count and stored type, no cuBLAS; a
 *     warp owns an output column, lane l sums elements 8l .. 8l+7 of every
 *     256 with explicit fmaf in k order, the lanes combine by one butterfly,
 *     and a call of M rows runs the rows in passes of up to 8 that repeat a
 *     one-row pass's steps exactly. The fused norm_matmul / matmul_swiglu
 *     are that kernel with the RMSNorm / SwiGLU of the plain ops (the same
 *     bits as composing them, which more than 8 rows do).
 *   - attention: keys in tiles of 32 inside chunks of ATTN_CHUNK (256)
 *     absolute positions, an online softmax per chunk and the chunks merged
 *     in position order by one merge function; a prompt's rows merge inside
 *     the CTA, a decode step runs a CTA per chunk and a fold kernel merges
 *     with the same function in the same order. The split decode kernels
 *     1-3 (their splits follow the SM count) break the rule and run only
 *     when KVT_CUDA_DECODE names one (bench comparisons).
 *   test_gpu_invariant checks it (on a GPU, and as test_gpu_invariant_emu on
 *   the CPU emulator).
 */
struct kvt_dev_ops {
	const char *name;                                    /* backend name, e.g. "cpu" */
	void (*destroy)(kvt_dev *d);                         /* free backend state */
	bool (*supports_dtype)(const kvt_dev *d, int dtype); /* weight dtypes matmul/embed take */
	int (*alloc)(kvt_dev *d, size_t n, void **out);      /* device memory */
	void (*free)(kvt_dev *d, void *p);                   /* release device memory */
	int (*copy_h2d)(kvt_dev *d, void *dst, const void *src, size_t n); /* host -> device */
	int (*copy_d2h)(kvt_dev *d, void *dst, const void *src, size_t n); /* device -> host */
	int (*copy_d2d)(kvt_dev *d, void *dst, const void *src, size_t n); /* device -> device */
	int (*sync)(kvt_dev *d);                             /* wait for issued work */
	size_t (*matmul_workspace)(const kvt_dev *d, const kvt_matmul_args *a); /* scratch bytes */
	int (*matmul)(kvt_dev *d, const kvt_matmul_args *a, void *ws);          /* GEMM */
	int (*rmsnorm)(kvt_dev *d, const kvt_rmsnorm_args *a);                 /* RMSNorm */
	int (*rope)(kvt_dev *d, const kvt_rope_args *a);                       /* rotary, normal mode */
	int (*swiglu)(kvt_dev *d, const kvt_swiglu_args *a);                   /* silu(g)*u */
	int (*add)(kvt_dev *d, const kvt_add_args *a);                         /* y += x */
	int (*embed)(kvt_dev *d, const kvt_embed_args *a);                     /* row gather */
	int (*kv_store)(kvt_dev *d, const kvt_kv_store_args *a);               /* K/V into blocks */
	size_t (*attention_workspace)(const kvt_dev *d, const kvt_attention_args *a); /* scratch bytes */
	int (*attention)(kvt_dev *d, const kvt_attention_args *a, void *ws);   /* paged causal GQA */
	int (*argmax)(kvt_dev *d, const kvt_argmax_args *a);                   /* row argmax */
	int (*host_alloc)(kvt_dev *d, size_t n, void **out);                   /* pinned host memory */
	void (*host_free)(kvt_dev *d, void *p);                                /* release it */
	int (*stream_create)(kvt_dev *d, kvt_stream **out);                    /* a copy/codec stream */
	void (*stream_destroy)(kvt_dev *d, kvt_stream *s);                     /* after its work */
	int (*stream_sync)(kvt_dev *d, kvt_stream *s);                         /* NULL: compute stream */
	int (*event_create)(kvt_dev *d, kvt_event **out);                      /* an event */
	void (*event_destroy)(kvt_dev *d, kvt_event *e);                       /* release it */
	int (*event_record)(kvt_dev *d, kvt_event *e, kvt_stream *s);          /* mark s's order */
	int (*stream_wait_event)(kvt_dev *d, kvt_stream *s, kvt_event *e);     /* s waits for e */
	int (*event_sync)(kvt_dev *d, kvt_event *e);                           /* host waits for e */
	bool (*event_done)(kvt_dev *d, kvt_event *e);                          /* poll e */
	int (*copy_async)(kvt_dev *d, kvt_stream *s, void *dst, const void *src, size_t n, int dir);
	int (*kv_pack)(kvt_dev *d, kvt_stream *s, const kvt_kv_pack_args *a);     /* T0 -> packed */
	int (*kv_unpack)(kvt_dev *d, kvt_stream *s, const kvt_kv_unpack_args *a); /* packed -> T0 */
	size_t (*sample_workspace)(const kvt_dev *d, const kvt_sample_args *a);  /* scratch bytes */
	int (*sample)(kvt_dev *d, const kvt_sample_args *a, void *ws);          /* top-k/top-p draw */
	int (*capture_begin)(kvt_dev *d);                  /* NULL: no graphs */
	int (*capture_end)(kvt_dev *d, kvt_graph **out);   /* instantiate what was captured */
	int (*graph_launch)(kvt_dev *d, kvt_graph *g);     /* replay on the compute stream */
	void (*graph_destroy)(kvt_dev *d, kvt_graph *g);   /* release it */
	/* Fused ops (NULL: dev.c composes the plain ops). They return KVT_DEV_COMPOSE for a case they
	 * have no fused kernel for, before issuing anything; their workspace is dev.c's (the composition's). */
	int (*norm_matmul)(kvt_dev *d, const kvt_norm_matmul_args *a, void *ws);
	int (*matmul_swiglu)(kvt_dev *d, const kvt_matmul_swiglu_args *a, void *ws);
	int (*rope_store)(kvt_dev *d, const kvt_rope_store_args *a);
	/* (optional) strided copy on s (kvt_dev_copy_2d_async); NULL: dev.c issues one copy_async per row */
	int (*copy_2d_async)(kvt_dev *d, kvt_stream *s, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
			     size_t row_bytes, size_t n_rows, int dir);
	int (*kv_load)(kvt_dev *d, const kvt_kv_load_args *a); /* blocks -> K/V rows (fp32), kv_store's inverse */
};

/*
 * Every op of struct kvt_dev_ops, in the struct's order (the `name` field is
 * not an op). dev.c checks at compile time that this list and the struct
 * agree field for field (offsets and size), so a field added to the struct
 * without an entry here fails the build; tests/test_dev_ops_checklist.c
 * fails while an op listed here has no parity case named for it.
 */
#define KVT_DEV_OPS(X)                                                                               \
	X(destroy) X(supports_dtype) X(alloc) X(free) X(copy_h2d) X(copy_d2h) X(copy_d2d) X(sync)     \
	X(matmul_workspace) X(matmul) X(rmsnorm) X(rope) X(swiglu) X(add) X(embed) X(kv_store)        \
	X(attention_workspace) X(attention) X(argmax) X(host_alloc) X(host_free) X(stream_create)     \
	X(stream_destroy) X(stream_sync) X(event_create) X(event_destroy) X(event_record)             \
	X(stream_wait_event) X(event_sync) X(event_done) X(copy_async) X(kv_pack) X(kv_unpack)        \
	X(sample_workspace) X(sample) X(capture_begin) X(capture_end) X(graph_launch)                 \
	X(graph_destroy) X(norm_matmul) X(matmul_swiglu) X(rope_store) X(copy_2d_async) X(kv_load)

/* KVT_DEV_OP_<op>: an op's index in KVT_DEV_OPS; KVT_DEV_N_OPS of them. */
#define KVT_DEV_OP_ENUM(op) KVT_DEV_OP_##op,
enum kvt_dev_op { KVT_DEV_OPS(KVT_DEV_OP_ENUM) KVT_DEV_N_OPS };
#undef KVT_DEV_OP_ENUM

/* The common head of every backend's device object. */
struct kvt_dev {
	const struct kvt_dev_ops *ops; /* the backend's table */
	int kind;                      /* enum kvt_dev_kind actually in use */
	int n_threads;                 /* worker threads (CPU) */
	bool use_ref;                  /* CPU: plain reference kernels */
	bool act_int8;                 /* CPU: the quantized GEMV rounds x to int8 (kvt_dev_config) */
	char name[96];                 /* human-readable description */
	kvt_dev_counters ctr;          /* dev.h's counters, updated atomically by the backend */
};

#define KVT_DEV_COMPOSE 1 /* a fused op's "no kernel for this case: compose the plain ops" */

/* Add n to a counter of dev.h's (relaxed: streams on other threads count too). */
#define KVT_DEV_COUNT(d, field, n) __atomic_fetch_add(&(d)->ctr.field, (uint64_t)(n), __ATOMIC_RELAXED)

/* Backend constructors: fill a zeroed, backend-sized object. */
int kvt_dev_cpu_create(const kvt_dev_config *cfg, kvt_dev **out);
#ifdef KVT_HAVE_CUDA
int kvt_dev_cuda_create(const kvt_dev_config *cfg, kvt_dev **out);
#endif

#endif
