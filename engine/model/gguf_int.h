/*
 * engine/model/gguf_int.h — internals shared by the GGUF files (not part of
 * the public API):
 *   gguf.c         the reader: parse, validate and map a GGUF file;
 *   gguf_writer.c  the writer (synthetic models, tests, benchmarks);
 *   gguf_quant.c   the ggml type table and its block quantizers and dequantizers.
 *
 * The type table is the one place that knows a ggml type's block geometry and
 * its (de)quantizer; the reader and the writer size and check tensors with it,
 * so both agree with the quantizers on every type.
 */
#ifndef KVT_GGUF_INT_H
#define KVT_GGUF_INT_H

#include "gguf.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF files read and write little-endian data in place and need a little-endian host"
#endif

#define KVT_GGUF_MAGIC "GGUF"
#define KVT_GGUF_HEADER_BYTES 24 /* magic, version, n_tensors, n_kv */

/* n_blocks whole blocks of one ggml type to floats, and back. */
typedef void (*kvt_ggml_dequant_fn)(const uint8_t *src, float *dst, uint64_t n_blocks);
typedef void (*kvt_ggml_quant_fn)(const float *src, uint8_t *dst, uint64_t n_blocks);

/* One ggml type as ggml's type traits size it. */
typedef struct kvt_ggml_traits {
	const char *name;            /* "Q4_1"; NULL: no such type number */
	uint32_t block_elems;        /* elements per block */
	uint32_t block_bytes;        /* bytes per block */
	kvt_ggml_dequant_fn dequant; /* NULL: cannot be loaded */
	kvt_ggml_quant_fn quant;     /* NULL: cannot be written from floats */
} kvt_ggml_traits;

/* The traits of a ggml type number; NULL for a number ggml does not size (gguf_quant.c). */
const kvt_ggml_traits *kvt_ggml_traits_of(uint32_t type);

#endif
