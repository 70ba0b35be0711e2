/*
 * engine/model/fingerprint.h — the model fingerprint: a SHA-256 digest of a GGUF's
 * architecture metadata and tensor data. It names the model in the root of
 * every block hash chain, in the index namespaces and in T2 record headers, so
 * KV made by another model (other weights, other hyperparameters) can never be
 * looked up.
 *
 * What is hashed (engine/model/fingerprint.c has the byte format):
 *   "kvtier-model-v1"; general.architecture and every metadata key that starts
 *   with "<architecture>." (hyperparameters), in file order, key, type and
 *   value; then every tensor in file order: name, ggml type, dims, data bytes.
 * The file path, the tokenizer and the free-form general.* keys (name,
 * license, ...) are not hashed: they do not change the KV a model computes.
 *
 * Hashing ~100 MB costs tens to hundreds of milliseconds, so the result is
 * cached in a small text file (one line per model file) keyed by the file's
 * device, inode, size, mtime and ctime (ctime cannot be set back by a user);
 * any change to the file misses the cache and rehashes.
 */
#ifndef KVT_FINGERPRINT_H
#define KVT_FINGERPRINT_H

#include "gguf.h"

#include <stdbool.h>
#include <stdint.h>

/* Fingerprint an open GGUF (no cache). KVT_EIO if libcrypto fails. */
int kvt_model_fingerprint_gguf(const kvt_gguf *g, uint8_t out[32]);

/*
 * Fingerprint the GGUF at path, using cache_path (may be NULL: no cache) when
 * its entry for this path matches the file's identity; otherwise open, hash,
 * and rewrite the cache (atomically: temp file + rename; a cache that cannot
 * be written is logged as a warning, not an error). *from_cache (may be NULL)
 * says which happened. Errors are kvt_gguf_open's (logged).
 */
int kvt_model_fingerprint(const char *path, const char *cache_path, uint8_t out[32], bool *from_cache);

#endif
