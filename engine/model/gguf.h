/*
 * engine/model/gguf.h — a bounds-checked GGUF reader (v2 and v3) and a small writer.
 *
 * The reader maps the file read-only and parses the header, every metadata
 * key/value and every tensor info before anything else uses it. Every count,
 * length and offset read from the file is checked against the bytes that remain
 * and against overflow before it is used or allocated for (the llama.cpp GGUF
 * CVEs were all integer overflows from file counts). A file that fails gets
 * one error in the log naming what is wrong, e.g.
 *   "m.gguf: blk.7.attn_q.weight: type Q5_K is not supported"
 *   "m.gguf: truncated: tensor info 12 needs 40 bytes at offset 9123, file has 9130",
 * and kvt_gguf_open() returns KVT_ECORRUPT (malformed, truncated) or
 * KVT_EUNSUPPORTED (well formed but a version or type we do not handle).
 *
 * Strings in a GGUF are not NUL-terminated; kvt_gguf_str points into the
 * mapping and carries its length. Everything returned by the reader is
 * borrowed from the kvt_gguf and must not outlive it.
 *
 * The writer builds GGUF v3 files for tests and benchmarks (the synthetic
 * Llama models), with the same alignment rules.
 *
 * Files: the reader is gguf.c, the writer gguf_writer.c, and the ggml types
 * with their quantizers and dequantizers gguf_quant.c (internals shared
 * between them: gguf_int.h).
 */
#ifndef KVT_GGUF_H
#define KVT_GGUF_H

#include "kvt.h"

/* Metadata value types, as numbered by the GGUF spec. */
enum kvt_gguf_type {
	KVT_GGUF_UINT8 = 0,
	KVT_GGUF_INT8 = 1,
	KVT_GGUF_UINT16 = 2,
	KVT_GGUF_INT16 = 3,
	KVT_GGUF_UINT32 = 4,
	KVT_GGUF_INT32 = 5,
	KVT_GGUF_FLOAT32 = 6,
	KVT_GGUF_BOOL = 7,
	KVT_GGUF_STRING = 8,
	KVT_GGUF_ARRAY = 9,
	KVT_GGUF_UINT64 = 10,
	KVT_GGUF_INT64 = 11,
	KVT_GGUF_FLOAT64 = 12,
	KVT_GGUF_N_TYPES
};

/* Tensor types, as numbered by ggml. Only some are supported for loading. */
enum kvt_ggml_type {
	KVT_GGML_F32 = 0,
	KVT_GGML_F16 = 1,
	KVT_GGML_Q4_0 = 2,
	KVT_GGML_Q4_1 = 3,
	KVT_GGML_Q5_0 = 6,
	KVT_GGML_Q5_1 = 7,
	KVT_GGML_Q8_0 = 8,
	KVT_GGML_Q8_1 = 9,
	KVT_GGML_Q2_K = 10,
	KVT_GGML_Q3_K = 11,
	KVT_GGML_Q4_K = 12,
	KVT_GGML_Q5_K = 13,
	KVT_GGML_Q6_K = 14,
	KVT_GGML_Q8_K = 15,
	KVT_GGML_BF16 = 30,
};

#define KVT_GGUF_MAX_DIMS 4
#define KVT_GGUF_DEFAULT_ALIGNMENT 32

typedef struct kvt_gguf_str {
	const char *ptr; /* borrowed, NOT NUL-terminated */
	uint64_t len;    /* bytes */
} kvt_gguf_str;

typedef struct kvt_gguf_kv {
	kvt_gguf_str key;  /* borrowed */
	uint32_t type;     /* enum kvt_gguf_type */
	uint32_t arr_type; /* element type when type == ARRAY (never ARRAY itself) */
	uint64_t n;        /* array length (1 for scalars) */
	union {
		uint64_t u64;     /* UINT8..UINT64 widened */
		int64_t i64;      /* INT8..INT64 widened */
		double f64;       /* FLOAT32/FLOAT64 widened */
		bool b;           /* BOOL */
		kvt_gguf_str str; /* STRING */
		struct {
			const void *data;   /* numeric arrays: packed little-endian elements in the mapping */
			kvt_gguf_str *strs; /* string arrays: n entries, owned by the kvt_gguf */
		} arr;
	} v;
} kvt_gguf_kv;

typedef struct kvt_gguf_tensor {
	kvt_gguf_str name;                /* borrowed */
	uint32_t n_dims;                  /* 1..KVT_GGUF_MAX_DIMS */
	uint64_t ne[KVT_GGUF_MAX_DIMS];   /* elements per dim, ne[0] fastest; unused dims are 1 */
	uint32_t type;                    /* enum kvt_ggml_type */
	uint64_t off_data;                /* offset from the start of the data section */
	uint64_t n_elems;                 /* product of ne */
	uint64_t n_bytes;                 /* bytes of the stored data */
	const void *data;                 /* borrowed: inside the mapping, bounds-checked */
} kvt_gguf_tensor;

typedef struct kvt_gguf kvt_gguf;

/*
 * Open and fully validate a GGUF file. Returns KVT_OK and *out, or:
 * KVT_ENOTFOUND / KVT_EIO (cannot open/map), KVT_ECORRUPT (bad magic, truncation,
 * bad counts, overlapping or out-of-file tensors, duplicate keys or tensor
 * names, bad type numbers), KVT_EUNSUPPORTED (version other than 2 or 3,
 * big-endian files, arrays of arrays), KVT_ENOMEM.
 * Tensor *types* are validated for size (a known ggml type) but whether one
 * can be loaded is checked by kvt_gguf_tensor_to_f32(). A dimension of 0 is
 * accepted (as llama.cpp does): such a tensor has n_elems == n_bytes == 0.
 * Logs once on failure. The file must not be truncated while it is open
 * (reads of the mapping would fault).
 */
int kvt_gguf_open(const char *path, kvt_gguf **out);
/*
 * The same over n_bytes in memory (borrowed; must outlive the kvt_gguf and
 * stay unchanged). name stands for the path in messages and kvt_gguf_path().
 * For fuzzing and for files that are already in memory.
 */
int kvt_gguf_open_mem(const void *data, uint64_t n_bytes, const char *name, kvt_gguf **out);
void kvt_gguf_close(kvt_gguf *g); /* NULL is a no-op */

const char *kvt_gguf_path(const kvt_gguf *g);
uint32_t kvt_gguf_version(const kvt_gguf *g);
uint64_t kvt_gguf_alignment(const kvt_gguf *g);
uint64_t kvt_gguf_n_kv(const kvt_gguf *g);
const kvt_gguf_kv *kvt_gguf_kv_at(const kvt_gguf *g, uint64_t i);
/* NULL when absent. */
const kvt_gguf_kv *kvt_gguf_find_kv(const kvt_gguf *g, const char *key);

/*
 * Typed getters. KVT_OK and *out; KVT_ENOTFOUND when the key is absent (not
 * logged: callers decide whether it is optional); KVT_EINVAL when the value has
 * the wrong type or does not fit (logged, naming the key and both types).
 * get_u32/get_u64/get_i64 accept any integer type whose value fits;
 * get_f32 accepts FLOAT32, FLOAT64 and integers.
 */
int kvt_gguf_get_u32(const kvt_gguf *g, const char *key, uint32_t *out);
int kvt_gguf_get_u64(const kvt_gguf *g, const char *key, uint64_t *out);
int kvt_gguf_get_i64(const kvt_gguf *g, const char *key, int64_t *out);
int kvt_gguf_get_f32(const kvt_gguf *g, const char *key, float *out);
int kvt_gguf_get_bool(const kvt_gguf *g, const char *key, bool *out);
int kvt_gguf_get_str(const kvt_gguf *g, const char *key, kvt_gguf_str *out);
/* An array whose element type is elem_type; *out is its kv. */
int kvt_gguf_get_arr(const kvt_gguf *g, const char *key, uint32_t elem_type, const kvt_gguf_kv **out);
/*
 * Element i of a numeric array, widened; i must be < kv->n (asserted).
 * arr_i64 needs an integer or BOOL array (asserted; UINT64 values above
 * INT64_MAX wrap); arr_f64 takes any numeric or BOOL array.
 */
int64_t kvt_gguf_arr_i64(const kvt_gguf_kv *kv, uint64_t i);
double kvt_gguf_arr_f64(const kvt_gguf_kv *kv, uint64_t i);

uint64_t kvt_gguf_n_tensors(const kvt_gguf *g);
const kvt_gguf_tensor *kvt_gguf_tensor_at(const kvt_gguf *g, uint64_t i);
/* NULL when absent. */
const kvt_gguf_tensor *kvt_gguf_find_tensor(const kvt_gguf *g, const char *name);

/* "F32", "Q4_1", ...; "type<N>" for unknown numbers (a per-thread buffer, reused by the next call). */
const char *kvt_ggml_type_name(uint32_t type);
const char *kvt_gguf_type_name(uint32_t type);
/* Elements per block and bytes per block of a ggml type; false if unknown. */
bool kvt_ggml_type_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);
/* Whether kvt_gguf_tensor_to_f32 can dequantize this type. */
bool kvt_ggml_type_supported(uint32_t type);

/*
 * Dequantize a whole tensor into dst (t->n_elems floats, caller-owned).
 * Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1 (and Q4_K, Q6_K where listed
 * by kvt_ggml_type_supported). Others: KVT_EUNSUPPORTED, logged as
 * "<file>: <tensor>: type <T> is not supported".
 */
int kvt_gguf_tensor_to_f32(const kvt_gguf *g, const kvt_gguf_tensor *t, float *dst);
/*
 * Whether every value of t is finite, read from the stored bytes without
 * dequantizing: each element of F32, F16 and BF16, the fp16 scales of every
 * block of Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K and Q6_K (a block's values are
 * finite exactly when its scales are). KVT_OK; KVT_ECORRUPT with *bad_elem the
 * first element that is not finite (of a block type: the first of its block),
 * not logged; KVT_EUNSUPPORTED for another type.
 */
int kvt_gguf_tensor_check_finite(const kvt_gguf *g, const kvt_gguf_tensor *t, uint64_t *bad_elem);
/*
 * Dequantize n elements (a multiple of the type's block) from raw blocks.
 * KVT_EUNSUPPORTED for a type kvt_ggml_type_supported() rejects, KVT_EINVAL
 * for a partial block; both logged. Runs OpenMP threads over large inputs.
 */
int kvt_ggml_dequantize(uint32_t type, const void *src, float *dst, uint64_t n);
/*
 * Quantize n floats (a multiple of the block) to F32/F16/BF16/Q8_0/Q4_0/Q4_1/
 * Q5_0/Q4_K/Q5_K/Q6_K with ggml's reference quantizers' arithmetic
 * (byte-identical to llama.cpp's ggml with no importance matrix, and to
 * gguf-py where it quantizes the type). KVT_EUNSUPPORTED for other types, KVT_EINVAL for a partial
 * block or a non-finite input to a block type; both logged.
 */
int kvt_ggml_quantize(uint32_t type, const float *src, void *dst, uint64_t n);

/* ---- writer (tests, benchmarks, synthetic models) ---- */

typedef struct kvt_gguf_writer kvt_gguf_writer;

int kvt_gguf_writer_create(kvt_gguf_writer **out);
void kvt_gguf_writer_destroy(kvt_gguf_writer *w); /* NULL is a no-op */
/* Each add copies its arguments. A repeated key or tensor name is KVT_EINVAL. */
int kvt_gguf_writer_add_u32(kvt_gguf_writer *w, const char *key, uint32_t v);
int kvt_gguf_writer_add_i32(kvt_gguf_writer *w, const char *key, int32_t v);
int kvt_gguf_writer_add_u64(kvt_gguf_writer *w, const char *key, uint64_t v);
int kvt_gguf_writer_add_f32(kvt_gguf_writer *w, const char *key, float v);
int kvt_gguf_writer_add_bool(kvt_gguf_writer *w, const char *key, bool v);
int kvt_gguf_writer_add_str(kvt_gguf_writer *w, const char *key, const char *v);
int kvt_gguf_writer_add_arr_str(kvt_gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int kvt_gguf_writer_add_arr_i32(kvt_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
int kvt_gguf_writer_add_arr_f32(kvt_gguf_writer *w, const char *key, const float *v, uint64_t n);
/*
 * Copy one metadata value of an opened file under key (the caller's C string,
 * so it can match on it first): the types real models use (u32, i32, u64, f32,
 * bool, string, arrays of strings, i32 and f32). KVT_OK, the writer's error,
 * or KVT_EINVAL (logged, naming the key) for a type it does not copy.
 */
int kvt_gguf_writer_copy_kv(kvt_gguf_writer *w, const char *key, const kvt_gguf_kv *kv);
/*
 * Raw metadata of any type: bytes are the value's encoding (for corrupt-file
 * tests). It never changes the writer's own layout alignment, so a bad
 * general.alignment can be written this way.
 */
int kvt_gguf_writer_add_raw(kvt_gguf_writer *w, const char *key, uint32_t type, const void *bytes, uint64_t n_bytes);
/* A tensor with already-encoded data (n_bytes must match type and ne). */
int kvt_gguf_writer_add_tensor(kvt_gguf_writer *w, const char *name, uint32_t type,
			       uint32_t n_dims, const uint64_t *ne, const void *data, uint64_t n_bytes);
/* A tensor given as floats, quantized to type with kvt_ggml_quantize. */
int kvt_gguf_writer_add_tensor_f32(kvt_gguf_writer *w, const char *name, uint32_t type,
				   uint32_t n_dims, const uint64_t *ne, const float *data);
/*
 * Write the file (v3, general.alignment honoured if added as u32, else 32;
 * add_u32 rejects an alignment that is not a power of two). Each tensor's data
 * starts aligned, padding is zeros, and the file ends padded to the alignment.
 */
int kvt_gguf_writer_write(kvt_gguf_writer *w, const char *path);

#endif
