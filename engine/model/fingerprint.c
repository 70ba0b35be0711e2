/*
 * engine/model/fingerprint.c — the model fingerprint (see fingerprint.h) and its
 * cache.
 *
 * Byte format fed to SHA-256 (every integer little-endian, F(x) = u32 length
 * then bytes):
 *   F("kvtier-model-v1")
 *   per selected metadata key, in file order: F(key) u32 type u32 arr_type
 *     u64 n, then the value: integers/bools as u64/i64 (widened), floats as
 *     the f64 bit pattern, strings F(bytes), numeric arrays their packed
 *     elements, string arrays F(each)
 *   u64 n_tensors, then per tensor in file order: F(name) u32 type u32 n_dims
 *     u64 ne[4] u64 n_bytes, then the n_bytes of data
 * Selected keys: general.architecture and every key beginning with
 * "<architecture>.". The tensor data dominates the cost.
 *
 * Cache file: text, one line per model file:
 *   "kvtfp1 <dev> <ino> <size> <mtime_s> <mtime_ns> <ctime_s> <ctime_ns> <hex fp> <path>\n"
 * A line is used only if every field matches the file's stat now; a malformed
 * line is ignored (and dropped on the next rewrite).
 */
#include "fingerprint.h"
#include "index.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
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

int kvt_model_fingerprint_gguf(const kvt_gguf *g, uint8_t out[32])
{
	static const char tag[] = "kvtier-model-v1";
	kvt_gguf_str arch = { "", 0 };
	unsigned n_out = 0;
	int ok;

	kvt_gguf_get_str(g, "general.architecture", &arch); /* absent: only tensors count */
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	if (!c)
		return KVT_ENOMEM;
	ok = EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 && upd_field(c, tag, sizeof(tag) - 1);
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
		ok = ok && upd_u64(c, t->n_bytes) && upd(c, t->data, (size_t)t->n_bytes);
	}
	ok = ok && EVP_DigestFinal_ex(c, out, &n_out) == 1 && n_out == 32;
	EVP_MD_CTX_free(c);
	if (!ok) {
		KVT_LOGE("%s: libcrypto SHA-256 failed while fingerprinting the model", kvt_gguf_path(g));
		return KVT_EIO;
	}
	return KVT_OK;
}

/* The identity line prefix (everything but fp and path) of a file's stat. */
static void ident_of(const struct stat *sb, char *buf, size_t cap)
{
	snprintf(buf, cap, "kvtfp1 %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRId64 " %ld %" PRId64 " %ld",
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

/* Rewrite the cache: other paths' well-formed lines kept, path's line replaced. */
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
	size_t pl = strlen(path);
	while (in && fgets(line, sizeof(line), in)) {
		size_t n = strlen(line);
		if (strncmp(line, "kvtfp1 ", 7) != 0 || n == 0 || line[n - 1] != '\n')
			continue;
		/* drop any line for this path */
		if (n > pl + 1 && strncmp(line + n - 1 - pl, path, pl) == 0 && line[n - 2 - pl] == ' ')
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

int kvt_model_fingerprint(const char *path, const char *cache_path, uint8_t out[32], bool *from_cache)
{
	struct stat sb;
	char ident[256] = "", after[256] = "";
	kvt_gguf *g = NULL;
	int rc;

	if (cache_path && stat(path, &sb) == 0) {
		ident_of(&sb, ident, sizeof(ident));
		if (cache_lookup(cache_path, path, ident, out)) {
			if (from_cache)
				*from_cache = true;
			return KVT_OK;
		}
	}
	rc = kvt_gguf_open(path, &g);
	if (rc)
		return rc;
	rc = kvt_model_fingerprint_gguf(g, out);
	kvt_gguf_close(g);
	if (rc)
		return rc;
	/* Cache only if the file did not change while it was hashed. */
	if (cache_path && ident[0] && stat(path, &sb) == 0) {
		ident_of(&sb, after, sizeof(after));
		if (strcmp(ident, after) == 0)
			cache_store(cache_path, path, ident, out);
	}
	if (from_cache)
		*from_cache = false;
	return KVT_OK;
}
