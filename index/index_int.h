/*
 * index/index_int.h — internals shared by the index module's files (not part
 * of the public API).
 */
#ifndef KVT_INDEX_INT_H
#define KVT_INDEX_INT_H

#include "index.h"

/*
 * Hash n_blocks full blocks of tokens under root, writing block i's hash to
 * out + i * stride_bytes (so it can fill the hash field of an array of
 * structs). Same results as kvt_hash_chain.
 */
int kvt_hash_chain_strided(const uint8_t root[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n_blocks,
			   uint32_t block_tokens, uint8_t *out, size_t stride_bytes);

#endif
