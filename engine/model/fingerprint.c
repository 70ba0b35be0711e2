/*
 * engine/model/fingerprint.c — the model fingerprint (see fingerprint.h) and its
 * cache.
 *
 * Byte format fed to SHA-256 (every integer little-endian, F(x) = u32 length
 * then bytes), version 1:
 *   F("kvtier-model-v1")
 *   per selected metadata key, in file order: F(key) u32 type u32 arr_type
 *     u64 n, then the value: integers/bools as u64/i64 (widened), floats as
 *     the f64 bit pattern, strings F(bytes), numeric arrays their packed
 *     elements, string arrays F(each)
 *   u64 n_tensors, then per tensor in file order: F(name) u32 type u32 n_dims
 *     u64 ne[4] u64 n_bytes, then the n_bytes of data
 * Version 2 is the same stream with F("kvtier-model-v2") and u64 leaf_bytes
 * (LEAF_BYTES) after it, and each tensor's data replaced by the BLAKE3
 * digests (core/blake3.c) of its leaves: bytes [k * leaf_bytes,
 * (k + 1) * leaf_bytes) of the data, the last one shorter, none for an empty
 * tensor. The stream itself still goes through SHA-256. The leaves are
 * hashed by worker threads taking them in file order; the stream's shape
 * (every tensor's n_bytes, so its leaf count) is fixed by what precedes the
 * digests, so no two files share a stream without sharing every hashed byte.
 * Selected keys: general.architecture and every key beginning with
 * "<architecture>.". The tensor data dominates the cost: one SHA-256 stream
 * runs at ~1.8 GB/s on a Zen 4 core's SHA instructions, so version 1 took
 * ~0.6 s for a 1B model at Q8_0 and ~4.4 s for an 8B one whatever the cores;
 * version 2's BLAKE3 runs faster on one core (AVX2: eight 1 KiB chunks at
 * once) and on every core at once.
 *
 * Cache file: text, one line per model file and version:
 *   "kvtfp<version> <dev> <ino> <size> <mtime_s> <mtime_ns> <ctime_s> <ctime_ns> <hex fp> <path>\n"
 * A line is used only if every field matches the file's stat now; a malformed
 * line is ignored (and dropped on the next rewrite). Builds before version 2
 * kept only "kvtfp1" lines and drop others when they rewrite the file.
 */
#include "fingerprint.h"
#include "blake3.h"
#include "dev.h"
#include "index.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int upd(EVP_MD_CTX *c, const void *p, size_t n)
{
	return n == 0 || EVP_DigestUpdate(c, p, n) == 1;
}

static int upd_u32(EVP_MD_CTX *c, uint32_t v)
{
	uint8_t b[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
	return upd(c, b, 4);
}

static int upd_u64(EVP_MD_CTX *c, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	return upd(c, b, 8);
}

static int upd_field(EVP_MD_CTX *c, const void *p, uint64_t n)
{
	return upd_u32(c, (uint32_t)n) && upd(c, p, (size_t)n);
}

/* Bytes per element of a numeric GGUF metadata type; 0 for strings/arrays. */
static size_t elem_bytes(uint32_t t)
{
	switch (t) {
	case KVT_GGUF_UINT8: case KVT_GGUF_INT8: case KVT_GGUF_BOOL: return 1;
	case KVT_GGUF_UINT16: case KVT_GGUF_INT16: return 2;
	case KVT_GGUF_UINT32: case KVT_GGUF_INT32: case KVT_GGUF_FLOAT32: return 4;
	case KVT_GGUF_UINT64: case KVT_GGUF_INT64: case KVT_GGUF_FLOAT64: return 8;
	default: return 0;
	}
}

static int upd_kv(EVP_MD_CTX *c, const kvt_gguf_kv *kv)
{
	if (!upd_field(c, kv->key.ptr, kv->key.len) || !upd_u32(c, kv->type) || !upd_u32(c, kv->arr_type) ||
	    !upd_u64(c, kv->n))
		return 0;
	switch (kv->type) {
	case KVT_GGUF_STRING:
		return upd_field(c, kv->v.str.ptr, kv->v.str.len);
	case KVT_GGUF_ARRAY:
		if (kv->arr_type == KVT_GGUF_STRING) {
			for (uint64_t i = 0; i < kv->n; i++)
				if (!upd_field(c, kv->v.arr.strs[i].ptr, kv->v.arr.strs[i].len))
					return 0;
			return 1;
		}
		return upd(c, kv->v.arr.data, (size_t)(kv->n * elem_bytes(kv->arr_type)));
	case KVT_GGUF_FLOAT32:
	case KVT_GGUF_FLOAT64: {
		uint64_t bits;
		memcpy(&bits, &kv->v.f64, 8);
		return upd_u64(c, bits);
	}
	case KVT_GGUF_BOOL:
		return upd_u64(c, kv->v.b);
	case KVT_GGUF_INT8: case KVT_GGUF_INT16: case KVT_GGUF_INT32: case KVT_GGUF_INT64:
		return upd_u64(c, (uint64_t)kv->v.i64);
	default:
		return upd_u64(c, kv->v.u64);
	}
}

#define LEAF_BYTES ((uint64_t)8 << 20) /* version 2's leaf: a few ms of BLAKE3; ~140 leaves in a 1B Q8_0 model */
#define MAX_LEAF_THREADS 64u

/* One leaf of version 2: a stretch of a tensor's data in the mapping and its digest. */
typedef struct fp_leaf {
	const uint8_t *data; /* borrowed: in the GGUF's mapping */
	uint64_t n_bytes;    /* 1..LEAF_BYTES */
	uint8_t digest[32];  /* BLAKE3 of the bytes, once hashed */
} fp_leaf;

/* The leaves of one file, handed to workers in file order (so reads stay near each other). */
typedef struct fp_leaf_set {
	fp_leaf *leaves;     /* [n_leaves], file order */
	size_t n_leaves;     /* count */
	atomic_size_t next;  /* the next leaf a worker takes */
} fp_leaf_set;

static void *leaf_worker(void *arg)
{
	fp_leaf_set *s = arg;
	for (size_t i; (i = atomic_fetch_add(&s->next, 1)) < s->n_leaves;) {
		fp_leaf *l = &s->leaves[i];
		kvt_blake3(l->data, (size_t)l->n_bytes, l->digest);
	}
	return NULL;
}

/* Version 2's leaves of every tensor of g, hashed on up to n_threads threads (0: one per usable CPU). */
static int hash_leaves(const kvt_gguf *g, uint32_t n_threads, fp_leaf_set *s)
{
	size_t n = 0, k = 0;
	for (uint64_t i = 0; i < kvt_gguf_n_tensors(g); i++)
		n += (size_t)((kvt_gguf_tensor_at(g, i)->n_bytes + LEAF_BYTES - 1) / LEAF_BYTES);
	s->n_leaves = n;
	s->leaves = calloc(n ? n : 1, sizeof(*s->leaves));
	atomic_init(&s->next, 0);
	if (!s->leaves)
		return KVT_ENOMEM;
	for (uint64_t i = 0; i < kvt_gguf_n_tensors(g); i++) {
		const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
		for (uint64_t off = 0; off < t->n_bytes; off += LEAF_BYTES, k++) {
			s->leaves[k].data = (const uint8_t *)t->data + off;
			s->leaves[k].n_bytes = t->n_bytes - off < LEAF_BYTES ? t->n_bytes - off : LEAF_BYTES;
		}
	}
	if (!n_threads) {
		kvt_cpu_budget cpus; /* affinity and cgroup quota: a container's limit counts */
		kvt_cpu_budget_get(&cpus);
		n_threads = (uint32_t)cpus.n_auto;
	}
	if (n_threads > MAX_LEAF_THREADS)
		n_threads = MAX_LEAF_THREADS;
	if (n_threads > n)
		n_threads = n ? (uint32_t)n : 1;
	pthread_t th[MAX_LEAF_THREADS];
	uint32_t n_started = 0;
	while (n_started + 1 < n_threads && pthread_create(&th[n_started], NULL, leaf_worker, s) == 0)
		n_started++; /* a thread that cannot start leaves its share to the others */
	leaf_worker(s);
	for (uint32_t i = 0; i < n_started; i++)
		pthread_join(th[i], NULL);
	return KVT_OK;
}

int kvt_model_fingerprint_gguf(const kvt_gguf *g, int version, uint32_t n_threads, uint8_t out[32])
{
	static const char tag1[] = "kvtier-model-v1", tag2[] = "kvtier-model-v2";
	kvt_gguf_str arch = { "", 0 };
	fp_leaf_set leaves = { 0 };
	unsigned n_out = 0;
	size_t k = 0;
	int ok, rc;

	if (version != KVT_FP_V1 && version != KVT_FP_V2)
		return KVT_EINVAL;
	if (version == KVT_FP_V2 && (rc = hash_leaves(g, n_threads, &leaves)))
		return rc;
	kvt_gguf_get_str(g, "general.architecture", &arch); /* absent: only tensors count */
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	if (!c) {
		free(leaves.leaves);
		return KVT_ENOMEM;
	}
	ok = EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 &&
	     (version == KVT_FP_V1 ? upd_field(c, tag1, sizeof(tag1) - 1)
				   : upd_field(c, tag2, sizeof(tag2) - 1) && upd_u64(c, LEAF_BYTES));
	for (uint64_t i = 0; ok && i < kvt_gguf_n_kv(g); i++) {
		const kvt_gguf_kv *kv = kvt_gguf_kv_at(g, i);
		bool pick = (kv->key.len == 20 && memcmp(kv->key.ptr, "general.architecture", 20) == 0) ||
			    (arch.len && kv->key.len > arch.len && memcmp(kv->key.ptr, arch.ptr, arch.len) == 0 &&
			     kv->key.ptr[arch.len] == '.');
		if (pick)
			ok = upd_kv(c, kv);
	}
	ok = ok && upd_u64(c, kvt_gguf_n_tensors(g));
	for (uint64_t i = 0; ok && i < kvt_gguf_n_tensors(g); i++) {
		const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
		ok = upd_field(c, t->name.ptr, t->name.len) && upd_u32(c, t->type) && upd_u32(c, t->n_dims);
		for (int d = 0; ok && d < KVT_GGUF_MAX_DIMS; d++)
			ok = upd_u64(c, t->ne[d]);
		ok = ok && upd_u64(c, t->n_bytes);
		if (version == KVT_FP_V1)
			ok = ok && upd(c, t->data, (size_t)t->n_bytes);
		for (uint64_t off = 0; ok && version == KVT_FP_V2 && off < t->n_bytes; off += LEAF_BYTES)
			ok = upd(c, leaves.leaves[k++].digest, 32);
	}
	ok = ok && EVP_DigestFinal_ex(c, out, &n_out) == 1 && n_out == 32;
	EVP_MD_CTX_free(c);
	free(leaves.leaves);
	if (!ok) {
		KVT_LOGE("%s: libcrypto SHA-256 failed while fingerprinting the model", kvt_gguf_path(g));
		return KVT_EIO;
	}
	return KVT_OK;
}

/* The identity line prefix (everything but fp and path) of a file's stat, for one version. */
static void ident_of(const struct stat *sb, int version, char *buf, size_t cap)
{
	snprintf(buf, cap, "kvtfp%d %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRId64 " %ld %" PRId64 " %ld", version,
		 (uint64_t)sb->st_dev, (uint64_t)sb->st_ino, (uint64_t)sb->st_size, (int64_t)sb->st_mtim.tv_sec,
		 sb->st_mtim.tv_nsec, (int64_t)sb->st_ctim.tv_sec, sb->st_ctim.tv_nsec);
}

/* Find path's line in the cache; true and *fp if its identity matches. */
static bool cache_lookup(const char *cache_path, const char *path, const char *ident, uint8_t fp[32])
{
	FILE *f = fopen(cache_path, "r");
	char line[8192];
	bool found = false;
	if (!f)
		return false;
	size_t il = strlen(ident), pl = strlen(path);
	while (!found && fgets(line, sizeof(line), f)) {
		size_t n = strlen(line);
		if (n && line[n - 1] == '\n')
			line[--n] = '\0';
		/* ident ' ' 64 hex ' ' path */
		if (n != il + 1 + 64 + 1 + pl || strncmp(line, ident, il) != 0 || line[il] != ' ' ||
		    line[il + 65] != ' ' || strcmp(line + il + 66, path) != 0)
			continue;
		bool ok = true;
		for (int i = 0; i < 32 && ok; i++) {
			int hi = kvt_hexval(line[il + 1 + 2 * i]), lo = kvt_hexval(line[il + 2 + 2 * i]);
			ok = hi >= 0 && lo >= 0;
			if (ok)
				fp[i] = (uint8_t)(hi << 4 | lo);
		}
		found = ok;
	}
	fclose(f);
	return found;
}

/* The length of a line's "kvtfp<digits> " tag, or 0 if it has none. */
static size_t line_tag_len(const char *line)
{
	size_t i = 5;
	if (strncmp(line, "kvtfp", 5) != 0)
		return 0;
	while (line[i] >= '0' && line[i] <= '9')
		i++;
	return i > 5 && line[i] == ' ' ? i + 1 : 0;
}

/* Rewrite the cache: other lines (other paths, other versions) kept if well formed, path's line of this
 * version replaced. */
static void cache_store(const char *cache_path, const char *path, const char *ident, const uint8_t fp[32])
{
	char tmp[4096], hex[65], line[8192];
	FILE *in, *out;
	if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", cache_path, (long)getpid()) >= (int)sizeof(tmp))
		return;
	out = fopen(tmp, "w");
	if (!out) {
		KVT_LOGW("model fingerprint cache %s: cannot write (%s); start-up will rehash the model", cache_path,
			 strerror(errno));
		return;
	}
	in = fopen(cache_path, "r");
	size_t pl = strlen(path), tl = strchr(ident, ' ') - ident + 1;
	while (in && fgets(line, sizeof(line), in)) {
		size_t n = strlen(line);
		if (line_tag_len(line) == 0 || n == 0 || line[n - 1] != '\n')
			continue;
		/* drop this version's line for this path */
		if (strncmp(line, ident, tl) == 0 && n > pl + 1 && strncmp(line + n - 1 - pl, path, pl) == 0 &&
		    line[n - 2 - pl] == ' ')
			continue;
		fputs(line, out);
	}
	if (in)
		fclose(in);
	kvt_hash_hex(fp, hex);
	fprintf(out, "%s %s %s\n", ident, hex, path);
	if (fclose(out) != 0 || rename(tmp, cache_path) != 0) {
		KVT_LOGW("model fingerprint cache %s: cannot write (%s)", cache_path, strerror(errno));
		unlink(tmp);
	}
}

/*
 * The cache's value of one version for path as the file is now, without hashing; false if none. ident (may
 * be NULL) gets the file's identity line prefix, "" when there is no cache or no file.
 */
static bool cache_peek(const char *path, const char *cache_path, int version, uint8_t out[32], char ident[256])
{
	struct stat sb;
	char own[256];
	if (!ident)
		ident = own;
	ident[0] = '\0';
	if (!cache_path || stat(path, &sb) != 0)
		return false;
	ident_of(&sb, version, ident, 256);
	return cache_lookup(cache_path, path, ident, out);
}

int kvt_model_fingerprint(const char *path, const char *cache_path, int version, uint8_t out[32], bool *from_cache)
{
	struct stat sb;
	char ident[256], after[256];
	kvt_gguf *g = NULL;
	int rc;

	if (version != KVT_FP_V1 && version != KVT_FP_V2)
		return KVT_EINVAL;
	if (cache_peek(path, cache_path, version, out, ident)) {
		if (from_cache)
			*from_cache = true;
		return KVT_OK;
	}
	rc = kvt_gguf_open(path, &g);
	if (rc)
		return rc;
	rc = kvt_model_fingerprint_gguf(g, version, 0, out);
	kvt_gguf_close(g);
	if (rc)
		return rc;
	/* Cache only if the file did not change while it was hashed. */
	if (ident[0] && stat(path, &sb) == 0) {
		ident_of(&sb, version, after, sizeof(after));
		if (strcmp(ident, after) == 0)
			cache_store(cache_path, path, ident, out);
	}
	if (from_cache)
		*from_cache = false;
	return KVT_OK;
}

static bool all_zero32(const uint8_t *p)
{
	uint8_t acc = 0;
	for (int i = 0; i < 32; i++)
		acc |= p[i];
	return acc == 0;
}

int kvt_model_fingerprint_for(const char *path, const char *cache_path, const uint8_t *stored, uint8_t out[32],
			      int *version)
{
	uint8_t fp[32], old[32];
	int rc;

	if (stored && all_zero32(stored))
		stored = NULL;
	/* a version the cache already has for this file, if it is the one stored: no hashing */
	for (int v = KVT_FP_CURRENT; stored && v >= KVT_FP_V1; v--)
		if (cache_peek(path, cache_path, v, fp, NULL) && memcmp(fp, stored, 32) == 0) {
			memcpy(out, fp, 32);
			*version = v;
			return KVT_OK;
		}
	if ((rc = kvt_model_fingerprint(path, cache_path, KVT_FP_CURRENT, fp, NULL)))
		return rc;
	if (stored && memcmp(fp, stored, 32) != 0) {
		/* made before version 2, or for another model: version 1 tells which */
		if ((rc = kvt_model_fingerprint(path, cache_path, KVT_FP_V1, old, NULL)))
			return rc;
		if (memcmp(old, stored, 32) == 0) {
			KVT_LOGI("model fingerprint: this data directory names %s by its version 1 fingerprint (stored "
				 "before version 2); kept, so its stored KV stays found",
				 path);
			memcpy(out, old, 32);
			*version = KVT_FP_V1;
			return KVT_OK;
		}
	}
	memcpy(out, fp, 32);
	*version = KVT_FP_CURRENT;
	return KVT_OK;
}
