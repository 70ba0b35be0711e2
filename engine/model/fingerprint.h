/*
 * engine/model/fingerprint.h — the model fingerprint: a SHA-256 digest of a GGUF's
 * architecture metadata and tensor data. It names the model in the root of
 * every block hash chain, in the index namespaces and in T2 record headers, so
 * KV made by another model (other weights, other hyperparameters) can never be
 * looked up.
 *
 * What is hashed (engine/model/fingerprint.c has the byte format):
 *   a version tag; general.architecture and every metadata key that starts
 *   with "<architecture>." (hyperparameters), in file order, key, type and
 *   value; then every tensor in file order: name, ggml type, dims, and its
 *   data bytes (version 1: the bytes themselves, in one SHA-256 stream;
 *   version 2: the BLAKE3 digest of each 8 MiB of them, hashed on every
 *   usable CPU at once).
 * The file path, the tokenizer and the free-form general.* keys (name,
 * license, ...) are not hashed: they do not change the KV a model computes.
 *
 * Versions: a data directory keeps the version its stored KV was made under
 * (kvt_model_fingerprint_for): one made before version 2 keeps version 1, a
 * new one takes version 2. Nodes sharing a remote tier find each other's
 * blocks only under the same fingerprint, so the same version.
 *
 * Hashing a model costs ~0.5 s per GB on one core in version 1 (less in
 * version 2, divided by the cores), so the result is cached in
 * a small text file (one line per model file and version) keyed by the file's
 * device, inode, size, mtime and ctime (ctime cannot be set back by a user);
 * any change to the file misses the cache and rehashes.
 */
#ifndef KVT_FINGERPRINT_H
#define KVT_FINGERPRINT_H

#include "gguf.h"

#include <stdbool.h>
#include <stdint.h>

#define KVT_FP_V1 1      /* one SHA-256 stream over metadata and tensor data */
#define KVT_FP_V2 2      /* SHA-256 over metadata and the BLAKE3 digests of 8 MiB leaves */
#define KVT_FP_CURRENT 2 /* what a new data directory uses */

/*
 * Fingerprint an open GGUF (no cache) in the given version. Version 2 hashes
 * its leaves on n_threads threads (0: one per CPU this process may use); the
 * value does not depend on n_threads. KVT_EINVAL for an unknown version,
 * KVT_ENOMEM, KVT_EIO if libcrypto fails (logged).
 */
int kvt_model_fingerprint_gguf(const kvt_gguf *g, int version, uint32_t n_threads, uint8_t out[32]);

/*
 * Fingerprint the GGUF at path in the given version, using cache_path (may be
 * NULL: no cache) when its entry for this path and version matches the file's
 * identity; otherwise open, hash, and rewrite the cache (atomically: temp
 * file + rename; a cache that cannot be written is logged as a warning, not an
 * error). *from_cache (may be NULL) says which happened. Errors are
 * kvt_gguf_open's (logged), or kvt_model_fingerprint_gguf's.
 */
int kvt_model_fingerprint(const char *path, const char *cache_path, int version, uint8_t out[32], bool *from_cache);

/*
 * The fingerprint a data directory knows the model at path by. stored is the
 * fingerprint its stored KV carries (the NVMe tier's superblock), or NULL (or
 * zeros) for a directory holding none. With none stored: KVT_FP_CURRENT.
 * Otherwise the version whose value equals stored — from the cache if it has
 * it, else hashed (version 1 only when version 2 differs: a directory made by
 * an older kvtier, or one made for another model). When neither matches (the
 * directory's KV belongs to another model), KVT_FP_CURRENT's value: the
 * caller's store says so when it opens. *version gets the version used.
 * Errors as kvt_model_fingerprint's.
 */
int kvt_model_fingerprint_for(const char *path, const char *cache_path, const uint8_t *stored, uint8_t out[32],
			      int *version);

#endif
