/*
 * gpu/dev.h — the device interface: everything that touches device memory.
 *
 * engine/ and tiers/ call only these functions; nothing above gpu/ knows
 * which backend runs. Two backends implement the ops table in dev_impl.h:
 *   - CPU (dev_cpu.c, cpu_ref.c, cpu_fast.c): plain C, the reference; a
 *     fast path (BLAS GEMMs, SIMD kernels, the backend's own worker threads)
 *     sits behind use_ref = false, and the plain path stays available as the
 *     oracle (use_ref = true).
 *   - CUDA (gpu/cuda/, one file per op family): the product.
 *
 * Conventions:
 *   - Ops take one argument struct, never allocate, and run on caller
 *     buffers in device memory ("d_" pointers). Scratch space comes from a
 *     caller workspace sized by kvt_dev_*_workspace_bytes().
 *   - Activations are fp32, row-major [token][feature]. Weights are [out][in]
 *     row-major (a GGUF tensor with ne = {in, out}), in fp32, fp16 or one of
 *     the block-quantized dtypes below.
 *   - Paged KV: a block holds block_tokens tokens of K and V for all layers,
 *     one contiguous record laid out [layer][K,V][kv_head][token][dim] in
 *     fp16. A sequence addresses its blocks through a block table (slot
 *     numbers into a pool of equal-sized blocks); token p of the sequence is
 *     token p % block_tokens of slot table[p / block_tokens].
 *   - Every wrapper validates its arguments once (KVT_EINVAL, logged naming
 *     the op and the bad field) and then dispatches. On the CPU backend ops
 *     complete before returning; on a GPU backend they are ordered on the
 *     device's compute stream, and kvt_dev_sync() waits for them.
 *   - Thread rules: one kvt_dev is driven by one thread at a time.
 */
#ifndef KVT_DEV_H
#define KVT_DEV_H

#include "kvt.h"

enum kvt_dev_kind {
	KVT_DEV_AUTO = 0, /* CUDA when a GPU is present, else CPU */
	KVT_DEV_CPU = 1,
	KVT_DEV_CUDA = 2,
};

/*
 * Element types of device buffers. The block-quantized weight types keep a
 * GGUF tensor's bytes as stored (ggml's layouts, 32 elements per block,
 * blocks packed along a row; element j < 16 of a 4-bit block is the low
 * nibble of qs[j], element j + 16 the high nibble):
 *   Q8_0: { fp16 d; int8 qs[32] }        x = d * q                34 bytes
 *   Q4_0: { fp16 d; uint8 qs[16] }       x = d * (q - 8)          18 bytes
 *   Q4_1: { fp16 d; fp16 m; uint8 qs[16] } x = d * q + m          20 bytes
 *   Q5_0: { fp16 d; uint32 qh; uint8 qs[16] } x = d * (q - 16)     22 bytes
 *         (q's fifth bit, element j, is bit j of the little-endian qh)
 * and the K-quants, 256-element superblocks (KVT_QK_BLOCK) of sub-blocks:
 *   Q4_K: { fp16 d, dmin; uint8 scales[12]; uint8 qs[128] }        144 bytes
 *         8 sub-blocks of 32, 6-bit (sc, mn) pairs packed in scales;
 *         x = d * sc * q - dmin * mn; each 64 elements take 32 bytes of
 *         qs, the low nibbles the first sub-block, the high the second
 *   Q5_K: { fp16 d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128] }
 *         as Q4_K, with bit s of qh[l] the fifth bit of element l of
 *         sub-block s                                             176 bytes
 *   Q6_K: { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d }  210 bytes
 *         16 sub-blocks of 16, x = d * scale * (q - 32); per 128-element
 *         half, element l + 32i (l < 32) takes the low (i even) or high
 *         nibble of ql[l + 32 (i & 1)] and bits 2i..2i+1 of qh[l]
 * They are valid for matmul weights and embedding tables whose rows are a
 * multiple of the dtype's block (kvt_dtype_block_elems: 32, or 256 for the
 * K-quants). kvt_dev_supports_dtype() says whether a backend multiplies one
 * directly; if not, load them dequantized to fp16.
 */
enum kvt_dtype {
	KVT_DTYPE_F32 = 0,
	KVT_DTYPE_F16 = 1,
	KVT_DTYPE_Q8_0 = 2,
	KVT_DTYPE_Q4_0 = 3,
	KVT_DTYPE_Q4_1 = 4,
	KVT_DTYPE_Q5_0 = 5,
	KVT_DTYPE_Q4_K = 6,
	KVT_DTYPE_Q5_K = 7,
	KVT_DTYPE_Q6_K = 8,
	KVT_DTYPE_COUNT
};
#define KVT_QBLOCK 32     /* elements per quantized block (Q8_0, Q4_0, Q4_1, Q5_0) */
#define KVT_QK_BLOCK 256  /* elements per K-quant superblock (Q4_K, Q5_K, Q6_K) */

/* Elements per block of a dtype: 1 (f32, f16), KVT_QBLOCK or KVT_QK_BLOCK; 0 if unknown. */
uint32_t kvt_dtype_block_elems(int dtype);
/* Bytes of a row of n elements (n a multiple of the dtype's block). */
size_t kvt_dtype_row_bytes(int dtype, size_t n);
const char *kvt_dtype_name(int dtype);

/*
 * The CPUs this process may use: the affinity mask (sched_getaffinity, as
 * taskset sets it) and the cgroup CPU quota (v2 cpu.max, v1
 * cpu.cfs_quota_us / cpu.cfs_period_us; the smallest along the cgroup's
 * path). n_auto, what threads = 0 means: the smaller of the mask's count and
 * the quota rounded up, at least 1.
 */
typedef struct kvt_cpu_budget {
	int n_online;          /* sysconf(_SC_NPROCESSORS_ONLN) */
	int n_affinity;        /* CPUs in the affinity mask (n_online if it cannot be read) */
	double quota_cpus;     /* cgroup quota in CPUs; 0: none */
	char quota_source[96]; /* the file the quota came from ("" = none) */
	int n_auto;            /* the thread count for threads = 0 */
} kvt_cpu_budget;

/* Reads /proc/self/cgroup and /sys/fs/cgroup. Never fails (unknowns fall back as above). */
void kvt_cpu_budget_get(kvt_cpu_budget *b);
/*
 * The quota part alone, from a /proc/self/cgroup text and a cgroup mount
 * root (tests give a temporary tree). *cpus = 0 when there is none; source
 * (may be NULL) gets the file it came from.
 */
void kvt_cpu_quota_read(const char *proc_cgroup_path, const char *cgroup_root, double *cpus, char *source,
			size_t source_cap);

typedef struct kvt_dev_config {
	int kind;      /* enum kvt_dev_kind */
	int n_threads; /* CPU worker threads; 0: auto (kvt_cpu_budget_get's n_auto) */
	bool use_ref;  /* CPU: plain single-threaded reference kernels */
	bool fixed_threads; /* CPU: always use all n_threads (no adapting to busy cores; a benchmark baseline) */
	/*
	 * CPU: matmuls with block-quantized weights round x to int8 (as
	 * llama.cpp does: one scale per 32 elements, per 256 for the K-quants):
	 * the GEMV for every type instead of int16, and, where the CPU has
	 * AVX-512 VNNI, an int8 GEMM in the GEMV's order for 12 rows of x and more
	 * (prompts). ~2e-5 NMSE per product against ~1e-9, and faster. Off: the
	 * int16 GEMV at every row count. kvtierd's default is on.
	 */
	bool act_int8;
} kvt_dev_config;

typedef struct kvt_dev kvt_dev;

/* KVT_EDEVICE when the requested kind is not available (logged). */
int kvt_dev_create(const kvt_dev_config *cfg, kvt_dev **out);
void kvt_dev_destroy(kvt_dev *d); /* NULL is a no-op */
int kvt_dev_kind(const kvt_dev *d);
const char *kvt_dev_name(const kvt_dev *d); /* "cpu (2 threads, openblas SkylakeX)": backend, threads, BLAS kernels */
int kvt_dev_n_threads(const kvt_dev *d);
/* Whether matmul and embed take weights of this dtype on this backend. */
bool kvt_dev_supports_dtype(const kvt_dev *d, int dtype);

/*
 * Whether device memory is host memory (the CPU backend): a host buffer that
 * outlives its use may then be passed to an op as a device buffer directly,
 * without kvt_dev_alloc and a copy (the model's weights, read from the
 * GGUF's mapping).
 */
bool kvt_dev_host_is_device(const kvt_dev *d);

/* Device memory. KVT_ENOMEM (logged with the size) when it cannot be had. */
int kvt_dev_alloc(kvt_dev *d, size_t n_bytes, void **out);
void kvt_dev_free(kvt_dev *d, void *p); /* NULL is a no-op */
/* Copies between host and device memory, and within the device. */
int kvt_dev_copy_h2d(kvt_dev *d, void *d_dst, const void *h_src, size_t n_bytes);
int kvt_dev_copy_d2h(kvt_dev *d, void *h_dst, const void *d_src, size_t n_bytes);
int kvt_dev_copy_d2d(kvt_dev *d, void *d_dst, const void *d_src, size_t n_bytes);
/* Wait until every op issued so far on the compute stream has completed. */
int kvt_dev_sync(kvt_dev *d);

/*
 * Counters of what a backend asked of the device since creation (or the
 * last reset), for benchmarks and tests that check how a step is issued.
 * The CUDA backend fills them; the CPU backend has no launches or host
 * waits to count and reports zeros. Work inside a graph counts when the
 * graph is launched (its kernels and copies, once per launch), not when it
 * is captured. Updated atomically: streams on other threads count too.
 */
typedef struct kvt_dev_counters {
	uint64_t kernel_launches; /* kernels (a cuBLAS call counts as one) launched one by one */
	uint64_t graph_launches;  /* graphs launched */
	uint64_t graph_kernels;   /* kernels run inside the graphs launched */
	uint64_t host_syncs;      /* times the host waited for the device (stream, event or copy) */
	uint64_t copies;          /* copies issued (a graph's copy nodes included) */
	uint64_t h2d_bytes;       /* bytes copied host -> device */
	uint64_t d2h_bytes;       /* device -> host */
	uint64_t d2d_bytes;       /* device -> device */
	uint64_t event_waits;     /* kvt_dev_stream_wait_event calls (a stream made to wait on the device) */
} kvt_dev_counters;
void kvt_dev_counters_get(const kvt_dev *d, kvt_dev_counters *out);
void kvt_dev_counters_reset(kvt_dev *d);

/*
 * Graphs: record the ops issued on the compute stream between
 * kvt_dev_capture_begin and kvt_dev_capture_end (nothing runs then), and
 * replay them with one kvt_dev_graph_launch. A replay reads the same
 * buffers with the same arguments as at capture: what changes per replay
 * must live in device memory (or pinned host memory a captured copy reads).
 * While capturing, an op that would wait on the host (kvt_dev_sync, the
 * blocking copies, embed without trusted ids) fails with KVT_EINVAL, and so
 * does the end of the capture. KVT_EUNSUPPORTED where the backend has no
 * graphs (the CPU backend: its ops run as they are issued).
 */
typedef struct kvt_graph kvt_graph;
bool kvt_dev_graphs_supported(const kvt_dev *d);
int kvt_dev_capture_begin(kvt_dev *d);
int kvt_dev_capture_end(kvt_dev *d, kvt_graph **out); /* *out NULL on failure */
int kvt_dev_graph_launch(kvt_dev *d, kvt_graph *g);
void kvt_dev_graph_destroy(kvt_dev *d, kvt_graph *g); /* NULL is a no-op */

/*
 * Pinned host memory ("h_" pointers): page-locked on CUDA (cudaHostAlloc),
 * so async copies to and from it run at full bus speed; on the CPU backend
 * 4 KiB-aligned memory that the backend tries to mlock (a refused mlock is
 * not an error). KVT_ENOMEM (logged with the size) when it cannot be had.
 */
int kvt_dev_host_alloc(kvt_dev *d, size_t n_bytes, void **out);
void kvt_dev_host_free(kvt_dev *d, void *h); /* NULL is a no-op */

/*
 * Streams and events. A stream is an ordered queue beside the compute stream
 * (the one every op above runs on): the tiering manager moves blocks on its
 * own streams while the engine computes. An event marks a point in a
 * stream's order; kvt_dev_stream_wait_event() makes later work on a stream
 * wait for it, on the device, without blocking the host. Ordering between
 * streams is only ever by events. A NULL stream means the compute stream.
 *
 * Thread rules: each stream is driven by one thread at a time, and streams
 * may be driven concurrently with each other and with the compute stream.
 * Events may be recorded on one thread and waited on by another once the
 * record call has returned. On the CPU backend every op completes before it
 * returns, so events are always complete.
 */
typedef struct kvt_stream kvt_stream;
typedef struct kvt_event kvt_event;
int kvt_dev_stream_create(kvt_dev *d, kvt_stream **out);
void kvt_dev_stream_destroy(kvt_dev *d, kvt_stream *s); /* NULL is a no-op; waits for it first */
int kvt_dev_stream_sync(kvt_dev *d, kvt_stream *s);     /* wait for work issued on s */
int kvt_dev_event_create(kvt_dev *d, kvt_event **out);
void kvt_dev_event_destroy(kvt_dev *d, kvt_event *e);   /* NULL is a no-op */
int kvt_dev_event_record(kvt_dev *d, kvt_event *e, kvt_stream *s);
int kvt_dev_stream_wait_event(kvt_dev *d, kvt_stream *s, kvt_event *e);
int kvt_dev_event_sync(kvt_dev *d, kvt_event *e);       /* block the host until e completes */
bool kvt_dev_event_done(kvt_dev *d, kvt_event *e);      /* poll */

enum kvt_copy_dir {
	KVT_COPY_H2D = 0, /* pinned host -> device */
	KVT_COPY_D2H = 1, /* device -> pinned host */
	KVT_COPY_D2D = 2, /* device -> device */
};
/* Copy n bytes on stream s, asynchronously where the backend can. */
int kvt_dev_copy_async(kvt_dev *d, kvt_stream *s, void *dst, const void *src, size_t n_bytes, int dir);
/*
 * Copy n_rows rows of row_bytes on stream s: row r from src + r * src_pitch
 * to dst + r * dst_pitch (pitches >= row_bytes; rows must not overlap). One
 * strided copy on CUDA (cudaMemcpy2DAsync: one call, one DMA, however many
 * rows); n_rows copies of kvt_dev_copy_async where the backend has no such
 * op. Counted as one copy of n_rows * row_bytes bytes.
 */
int kvt_dev_copy_2d_async(kvt_dev *d, kvt_stream *s, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
			  size_t row_bytes, size_t n_rows, int dir);

/* y[m][n] = sum_k x[m][k] * w[n][k]  (+ y[m][n] when accumulate) */
typedef struct kvt_matmul_args {
	uint32_t n_rows;  /* M: tokens */
	uint32_t n_in;    /* K */
	uint32_t n_out;   /* N */
	int w_dtype;      /* enum kvt_dtype of w (n_in a multiple of its block) */
	const void *w;    /* [n_out] rows of n_in elements, device */
	const float *x;   /* [n_rows][n_in], device */
	float *y;         /* [n_rows][n_out], device; must not alias x */
	bool accumulate;  /* add into y instead of overwriting */
} kvt_matmul_args;
size_t kvt_dev_matmul_workspace_bytes(const kvt_dev *d, const kvt_matmul_args *a);
int kvt_dev_matmul(kvt_dev *d, const kvt_matmul_args *a, void *d_workspace);

/* y[m] = x[m] / sqrt(mean(x[m]^2) + eps) * w   (y may equal x) */
typedef struct kvt_rmsnorm_args {
	uint32_t n_rows;  /* tokens */
	uint32_t n_dim;   /* features */
	float eps;        /* added to the mean square */
	const float *w;   /* [n_dim], device */
	const float *x;   /* [n_rows][n_dim], device */
	float *y;         /* [n_rows][n_dim], device */
} kvt_rmsnorm_args;
int kvt_dev_rmsnorm(kvt_dev *d, const kvt_rmsnorm_args *a);

/*
 * Rotary embedding. Pair i (i < n_rot / 2) of each head rotates by
 * theta_i = pos * base^(-2i/n_rot) / f_i (f_i = freq_factors[i], or 1):
 * in GGUF's "normal" mode the pair is (x[2i], x[2i+1]) (Llama: the converter
 * permuted Q/K for it); in NEOX mode it is (x[i], x[i + n_rot/2]) (Qwen2/3,
 * Gemma 3). Dims >= n_rot are left. In place on x.
 */
typedef struct kvt_rope_args {
	uint32_t n_rows;    /* tokens */
	uint32_t n_heads;   /* heads per token */
	uint32_t head_dim;  /* dims per head */
	uint32_t n_rot;     /* rotated dims per head (even, <= head_dim) */
	float freq_base;    /* theta base */
	const int32_t *pos; /* [n_rows] absolute positions, device */
	float *x;           /* [n_rows][n_heads][head_dim], device, in place */
	bool neox;          /* NEOX pairing (x[i], x[i + n_rot/2]) instead of adjacent pairs */
	const float *freq_factors; /* [n_rot / 2] divisors of each pair's angle (Llama 3 rope
	                              scaling), device; NULL: none */
} kvt_rope_args;
int kvt_dev_rope(kvt_dev *d, const kvt_rope_args *a);

/* Activations of the gated FFN op. */
enum kvt_act {
	KVT_ACT_SILU = 0,      /* x / (1 + e^-x) (Llama, Qwen) */
	KVT_ACT_GELU_TANH = 1, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Gemma) */
	KVT_ACT_COUNT
};

/* y = act(gate) * up, elementwise over n floats (y may equal gate or up). */
typedef struct kvt_swiglu_args {
	uint64_t n;          /* elements */
	const float *gate;   /* device */
	const float *up;     /* device */
	float *y;            /* device */
	int act;             /* enum kvt_act; 0 (SiLU) by default */
} kvt_swiglu_args;
int kvt_dev_swiglu(kvt_dev *d, const kvt_swiglu_args *a);

/* y[i] += x[i] over n floats; with n_x set, y[i] += x[i % n_x] (a bias row
 * added to each of n / n_x rows). */
typedef struct kvt_add_args {
	uint64_t n;       /* elements */
	const float *x;   /* [n] (or [n_x]), device */
	float *y;         /* [n], device, in place */
	uint64_t n_x;     /* 0: x has n elements; else its length, dividing n */
} kvt_add_args;
int kvt_dev_add(kvt_dev *d, const kvt_add_args *a);

/* y[m] = table[ids[m]] * scale (rows of n_dim), ids checked against n_vocab. */
typedef struct kvt_embed_args {
	uint32_t n_rows;      /* tokens */
	uint32_t n_dim;       /* row width */
	uint32_t n_vocab;     /* rows in the table */
	int table_dtype;      /* enum kvt_dtype (n_dim a multiple of its block) */
	const void *table;    /* [n_vocab] rows of n_dim elements, device */
	const int32_t *ids;   /* [n_rows], device */
	float *y;             /* [n_rows][n_dim], device */
	float scale;          /* multiplies every element (Gemma: sqrt(n_dim)); NOTE: 0 means 1,
	                         so a zero-initialised struct embeds unscaled */
	bool trusted_ids;     /* the caller checked ids (or a device op made them): no read-back, so
	                         no host wait; an out-of-range id then gives a row of zeros */
} kvt_embed_args;
int kvt_dev_embed(kvt_dev *d, const kvt_embed_args *a);

/* The shape of a paged KV pool; shared by kv_store and attention. */
typedef struct kvt_kv_layout {
	uint32_t n_layers;     /* layers in a block */
	uint32_t n_kv_heads;   /* K/V heads */
	uint32_t head_dim;     /* dims per head */
	uint32_t block_tokens; /* tokens per block */
	uint32_t n_slots;      /* blocks in the pool */
	void *pool;            /* [n_slots] block records, device */
	int codec;             /* enum kvt_kv_codec of the records: F16 (0, the default) or, for a
	                          pool that keeps KV in 8 bits, FP8/INT8 packed blocks (below);
	                          kv_store quantizes each new token, attention dequantizes */
} kvt_kv_layout;
/* Bytes of one block record for a layout (kvt_kv_packed_bytes of its codec). */
size_t kvt_kv_block_bytes(const kvt_kv_layout *l);

/*
 * Block codecs: how a block leaves T0 for the host tier. A packed block is
 *   F16:  the block record itself, bit for bit (lossless);
 *   FP8:  codes[layer][K,V][kv_head][token][dim] as FP8 E4M3 (OCP "FN":
 *         no infinities, saturating at +-448), then
 *         scales[layer][K,V][kv_head][token] as fp32: one scale per token
 *         and KV head;
 *   INT8: codes of the same shape in [-127, 127], then
 *         scales[layer][K,V][kv_head][token][group] as fp32: one scale per
 *         group of KVT_KV_INT8_GROUP (32) consecutive dims of a token and KV
 *         head (group g covers dims 32g .. 32g+31). NOTE: when head_dim is
 *         not a multiple of 32 the whole head is one group (one scale per
 *         token and KV head, as FP8).
 *   INT8KV (KIVI-style, a T1/T2 format only: never a pool's codec): codes
 *         [layer][K,V][kv_head][token][dim] as for INT8, except that K codes
 *         are unsigned (0..255, asymmetric); then per layer:
 *         kmin[kv_head][dim] fp16, kscale[kv_head][dim] E5M3 (one byte) (one
 *         minimum and scale per K channel over the block's tokens: keys have
 *         outlier channels and per-channel offsets) and
 *         vscale[kv_head][token][group] E5M3 (V: one scale per token and group
 *         of KVT_KVV_GROUP (16) dims; the whole head when head_dim is not a
 *         multiple of 16). E5M3 (kv_codec.h) is a positive 8-bit float, the
 *         fp16 bits 14..7; a scale is rounded UP to it and the K minimum DOWN
 *         to fp16, so every value of a group stays inside its codes' range.
 *         K: s = e5m3_up((max - m) / 255), code = clamp(rint((x - m) / s), 0,
 *         255), x' = fp16(fma(code, s, m)); V: s = e5m3_up(amax / 127), code =
 *         clamp(rint(x / s)), x' = fp16(code * s) (1/s is 0 when s is 0).
 *         Bytes per token: as INT8 on every shape whose head_dim is a
 *         multiple of 32 (the parameters: 3 bytes per K channel per block of
 *         16 tokens, 1 per 16 V values).
 *   INT8KV1 (read only: records written by the first INT8KV, issue 50):
 *         the same codes; then per layer, fp16 values kparams[kv_head][scale,
 *         min][dim] (minimum rounded to nearest) and vscales[kv_head][token]
 *         [group] with INT8's groups of 32. A manager never writes it; it
 *         reads its records back (tiers/manager.h, "Versioning").
 *         gpu/kv_codec.h writes the offsets and the arithmetic of both once.
 * kvt_kv_group_dims() gives the values per scale. A group's scale is
 * s = amax / qmax over the group's values (qmax 448 for FP8, 127 for INT8;
 * see tiers/README.md for the measurements that chose these), with
 * inv = qmax / amax (both 0 when amax is 0). Encoding:
 * code = round_nearest_even(x * inv) (saturated); decoding x' = code * s,
 * rounded to fp16. Backends are bit-identical: the same fp32 operations in
 * the same order.
 */
enum kvt_kv_codec {
	KVT_KV_CODEC_F16 = 0,
	KVT_KV_CODEC_FP8 = 1,
	KVT_KV_CODEC_INT8 = 2,
	KVT_KV_CODEC_INT8KV1 = 3, /* records of the first INT8KV only (read back, never written by a manager) */
	KVT_KV_CODEC_INT8KV = 4,  /* packed records only (T1, T2, T3); a pool is F16, FP8 or INT8 */
	KVT_KV_CODEC_COUNT
};
#define KVT_KV_POOL_CODEC_COUNT 3 /* the codecs a pool (kvt_kv_layout.codec) may have: 0 .. 2 */
const char *kvt_kv_codec_name(int codec); /* "f16", "fp8", "int8", "int8kv1", "int8kv" */
#define KVT_KV_INT8_GROUP 32 /* dims per INT8 scale when head_dim is a multiple of it */
/* Values per fp32 scale of a packed vector: head_dim for FP8; KVT_KV_INT8_GROUP
 * for INT8, or head_dim when head_dim is not a multiple of it; 0 for F16 and
 * for INT8KV and INT8KV1 (their scales are not per vector: see above). */
uint32_t kvt_kv_group_dims(int codec, uint32_t head_dim);
/* Bytes of one packed block of this layout and codec. */
size_t kvt_kv_packed_bytes(const kvt_kv_layout *l, int codec);

/*
 * Pack n_blocks pool slots into dst (packed blocks back to back). An fp16
 * pool packs to any codec; a pool that is already 8-bit packs only to its
 * own codec (a copy). Unpacking follows the same rule.
 */
typedef struct kvt_kv_pack_args {
	const kvt_kv_layout *kv; /* borrowed; the pool the slots index */
	int codec;               /* enum kvt_kv_codec */
	uint32_t n_blocks;       /* blocks */
	const int32_t *h_slots;  /* [n_blocks] slots, HOST memory (read before the call returns) */
	void *dst;               /* [n_blocks] packed blocks, device memory */
} kvt_kv_pack_args;
int kvt_dev_kv_pack(kvt_dev *d, kvt_stream *s, const kvt_kv_pack_args *a);

/* Unpack n_blocks packed blocks from src into pool slots. */
typedef struct kvt_kv_unpack_args {
	const kvt_kv_layout *kv; /* borrowed */
	int codec;               /* enum kvt_kv_codec */
	uint32_t n_blocks;       /* blocks */
	const int32_t *h_slots;  /* [n_blocks] destination slots, HOST memory */
	const void *src;         /* [n_blocks] packed blocks, device memory */
} kvt_kv_unpack_args;
int kvt_dev_kv_unpack(kvt_dev *d, kvt_stream *s, const kvt_kv_unpack_args *a);

/* Store K and V of n_rows new tokens at positions pos0.. of one layer. */
typedef struct kvt_kv_store_args {
	const kvt_kv_layout *kv;    /* borrowed */
	uint32_t layer;             /* layer index */
	const int32_t *block_table; /* slots covering positions 0..pos0+n_rows-1, device */
	uint32_t pos0;              /* position of the first row */
	uint32_t n_rows;            /* tokens */
	const float *k;             /* [n_rows][n_kv_heads][head_dim], device */
	const float *v;             /* same shape */
	const int32_t *d_pos0;      /* NULL, or the position of the first row in device memory (read
	                               there instead of pos0: a graph replays with new positions) */
} kvt_kv_store_args;
int kvt_dev_kv_store(kvt_dev *d, const kvt_kv_store_args *a);

/*
 * The inverse of kv_store: read K and V of n_rows stored tokens at positions
 * pos0.. of one layer out of the blocks, as fp32 rows (an 8-bit pool's codes
 * times their scales; an fp16 pool's values exactly, so a kv_store of what
 * kv_load read writes the same bytes back into an fp16 pool). Chunk reuse
 * (engine/model: kvt_model_kv_move) moves a span's K/V between sequences
 * with it, re-rotating K by the position delta in between.
 */
typedef struct kvt_kv_load_args {
	const kvt_kv_layout *kv;    /* borrowed */
	uint32_t layer;             /* layer index */
	const int32_t *block_table; /* slots covering positions 0..pos0+n_rows-1, device */
	uint32_t pos0;              /* position of the first row */
	uint32_t n_rows;            /* tokens */
	float *k;                   /* [n_rows][n_kv_heads][head_dim] out, device */
	float *v;                   /* same shape */
} kvt_kv_load_args;
int kvt_dev_kv_load(kvt_dev *d, const kvt_kv_load_args *a);

/*
 * Causal GQA attention over paged KV. Query row m sits at position pos0 + m
 * and attends to positions 0..pos0+m of the sequence (their K/V already
 * stored); with a sliding window W, only to positions pos0+m-W+1..pos0+m
 * (keys older than that are skipped, and their blocks need not be read). Query head h reads KV head h / (n_heads / n_kv_heads).
 * One op serves prefill (n_rows > 1, over a cached prefix plus the new
 * tokens) and decode (n_rows = 1).
 */
typedef struct kvt_attention_args {
	const kvt_kv_layout *kv;    /* borrowed */
	uint32_t layer;             /* layer index */
	const int32_t *block_table; /* device */
	uint32_t pos0;              /* position of query row 0 */
	uint32_t n_rows;            /* query tokens */
	uint32_t n_heads;           /* query heads (a multiple of n_kv_heads) */
	float scale;                /* usually 1/sqrt(head_dim) */
	const float *q;             /* [n_rows][n_heads][head_dim], device */
	float *out;                 /* [n_rows][n_heads][head_dim], device */
	uint32_t window;            /* sliding window in tokens; 0: full causal */
	const int32_t *d_pos0;      /* NULL, or the position of query row 0 in device memory, read
	                               there instead of pos0, which is then its upper bound (launch
	                               shapes are sized for it): a graph replays at new positions */
} kvt_attention_args;
size_t kvt_dev_attention_workspace_bytes(const kvt_dev *d, const kvt_attention_args *a);
int kvt_dev_attention(kvt_dev *d, const kvt_attention_args *a, void *d_workspace);

/*
 * Fused ops: each is defined as the plain ops it replaces, in order, and a
 * backend without a fused kernel for a case runs exactly those (dev.c
 * composes them; that is the CPU backend's reference). The CUDA backend's
 * fused kernels give bit-identical results to its own unfused ops.
 *
 * norm_matmul: y = matmul(rmsnorm(x; norm_w, eps), w) (+ y when
 * mm.accumulate): RMSNorm fused into the GEMM that reads it (on CUDA, fp16
 * weights, up to 8 rows: the matmul kernel recomputes the row norm per CTA).
 * mm.x is the un-normalised input.
 */
typedef struct kvt_norm_matmul_args {
	kvt_matmul_args mm;  /* the GEMM; mm.x not yet normalised, y must not alias it */
	const float *norm_w; /* [n_in] RMSNorm weight, device */
	float eps;           /* RMSNorm epsilon */
} kvt_norm_matmul_args;
size_t kvt_dev_norm_matmul_workspace_bytes(const kvt_dev *d, const kvt_norm_matmul_args *a);
int kvt_dev_norm_matmul(kvt_dev *d, const kvt_norm_matmul_args *a, void *d_workspace);

/*
 * matmul_swiglu: y = swiglu(gate = xn . w_gate, up = xn . w_up) with xn =
 * rmsnorm(x; norm_w, eps), or x itself when norm_w is NULL: the FFN's two
 * input GEMMs and their activation in one (on CUDA, at up to 8 rows with
 * fp16 weights: one kernel reading both weight rows of an output).
 */
typedef struct kvt_matmul_swiglu_args {
	uint32_t n_rows;      /* M */
	uint32_t n_in;        /* K */
	uint32_t n_out;       /* N: the FFN width */
	int w_dtype;          /* of both matrices */
	const void *w_gate;   /* [n_out][n_in], device */
	const void *w_up;     /* [n_out][n_in], device */
	const float *x;       /* [n_rows][n_in], device */
	float *y;             /* [n_rows][n_out], device; must not alias x */
	const float *norm_w;  /* NULL, or [n_in]: RMSNorm x first */
	float eps;            /* its epsilon */
} kvt_matmul_swiglu_args;
size_t kvt_dev_matmul_swiglu_workspace_bytes(const kvt_dev *d, const kvt_matmul_swiglu_args *a);
int kvt_dev_matmul_swiglu(kvt_dev *d, const kvt_matmul_swiglu_args *a, void *d_workspace);

/*
 * rope_store: rope(q) (when q is set), rope(k), then kv_store(k, v): the
 * rotation of the new rows fused with the store of their K/V (q and k are
 * rotated in place, as the plain ops leave them). Positions: pos[] for the
 * rotation, pos0 / d_pos0 for the store, as the plain ops take them.
 */
typedef struct kvt_rope_store_args {
	kvt_kv_store_args st; /* the store; st.k is the k below */
	uint32_t n_heads;     /* query heads of q */
	uint32_t n_rot;       /* rotated dims per head */
	float freq_base;      /* theta base */
	const int32_t *pos;   /* [st.n_rows] positions, device */
	float *q;             /* [n_rows][n_heads][head_dim], device, rotated in place; NULL: none */
	float *k;             /* [n_rows][n_kv_heads][head_dim], device, rotated in place */
} kvt_rope_store_args;
int kvt_dev_rope_store(kvt_dev *d, const kvt_rope_store_args *a);

/* out[m] = index of the largest x[m][*] (lowest index on ties). */
typedef struct kvt_argmax_args {
	uint32_t n_rows;  /* rows */
	uint32_t n_cols;  /* columns */
	const float *x;   /* [n_rows][n_cols], device */
	int32_t *out;     /* [n_rows], device */
} kvt_argmax_args;
int kvt_dev_argmax(kvt_dev *d, const kvt_argmax_args *a);

/*
 * Sample one token per row from softmax(x / temperature), restricted by
 * top_k and top_p, with the caller's uniform draw u[m] in [0, 1). Defined by
 * thresholds so that every backend picks the same token:
 *   w_i = exp((x_i - max x) / temperature);
 *   tk  = the top_k-th largest w (0 when top_k is 0 or >= n_cols);
 *   tp  = the largest w_j such that the w's >= w_j (among those >= tk) sum
 *         to at least top_p of the w's >= tk (0 when top_p >= 1);
 *   the candidates are the i with w_i >= max(tk, tp) (ties all kept); the
 *   token is the first candidate, in index order, at which the running sum
 *   of candidate weights exceeds u * (their total).
 * Sums are taken in fp64. NaN logits are never candidates; a row with no
 * logit above -inf gives -1.
 */
typedef struct kvt_sample_args {
	uint32_t n_rows;   /* rows */
	uint32_t n_cols;   /* vocabulary */
	const float *x;    /* [n_rows][n_cols] logits, device */
	float temperature; /* > 0 */
	uint32_t top_k;    /* 0: no limit */
	float top_p;       /* in (0, 1]; 1: no limit */
	const float *u;    /* [n_rows] uniform draws in [0, 1), device */
	int32_t *out;      /* [n_rows] token ids, device */
} kvt_sample_args;
size_t kvt_dev_sample_workspace_bytes(const kvt_dev *d, const kvt_sample_args *a);
int kvt_dev_sample(kvt_dev *d, const kvt_sample_args *a, void *d_workspace);

#endif
