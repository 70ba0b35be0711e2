/*
 * index/blockhash.c — salted, chained SHA-256 block hashes, tenant salts and
 * name validation (DESIGN.md §2).
 *
 * Every field that enters a digest is length-prefixed (u32 LE length, then the
 * bytes), so no two different field lists can feed SHA-256 the same byte
 * string. Token ids are serialized as little-endian int32 regardless of the
 * host, so a hash is the same on every machine, in every process, after every
 * restart. The root carries a domain tag ("kvtier-root-v1"), the model
 * fingerprint, the KV layout version, block_tokens and the tenant salt: KV of
 * another model, layout, block size or tenant can never be looked up.
 *
 * libcrypto: EVP (OpenSSL 3) for SHA-256, HMAC via EVP_MAC is avoided in
 * favour of the one-shot HMAC(), which OpenSSL 3 still provides un-deprecated.
 */
#include "index_int.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <string.h>

static const char root_tag[] = "kvtier-root-v1";

/*
 * SHA-256, fetched from the default provider once: OpenSSL 3 otherwise looks
 * the implementation up on every EVP_DigestInit_ex(EVP_sha256()), which
 * costs as much as hashing a block. NULL (fetch failed) falls back to
 * EVP_sha256().
 */
static EVP_MD *g_sha256;
static pthread_once_t g_sha256_once = PTHREAD_ONCE_INIT;

static void fetch_sha256(void)
{
	g_sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *sha256(void)
{
	pthread_once(&g_sha256_once, fetch_sha256);
	return g_sha256 ? g_sha256 : EVP_sha256();
}

static void put_u32le(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

/* Feed one length-prefixed field. */
static int feed(EVP_MD_CTX *ctx, const void *p, uint32_t n)
{
	uint8_t len[4];
	put_u32le(len, n);
	if (EVP_DigestUpdate(ctx, len, 4) != 1)
		return 0;
	return n ? EVP_DigestUpdate(ctx, p, n) : 1;
}

/* Feed n token ids as one field of 4n bytes, little-endian int32. */
static int feed_tokens(EVP_MD_CTX *ctx, const int32_t *tokens, uint32_t n)
{
	uint8_t buf[4 * KVT_BLOCK_MAX_TOKENS];
	for (uint32_t i = 0; i < n; i++)
		put_u32le(buf + 4 * i, (uint32_t)tokens[i]);
	return feed(ctx, buf, 4 * n);
}

int kvt_hash_root(const uint8_t model_fp[KVT_HASH_BYTES], uint32_t layout_version,
		  uint32_t block_tokens, const uint8_t salt[KVT_HASH_BYTES],
		  uint8_t out[KVT_HASH_BYTES])
{
	uint8_t u[4], v[4];
	unsigned n = 0;
	int ok;

	if (block_tokens < 1 || block_tokens > KVT_BLOCK_MAX_TOKENS) {
		KVT_LOGE("hash: block_tokens %u out of range 1..%u", block_tokens, KVT_BLOCK_MAX_TOKENS);
		return KVT_EINVAL;
	}
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (!ctx)
		return KVT_ENOMEM;
	put_u32le(u, layout_version);
	put_u32le(v, block_tokens);
	ok = EVP_DigestInit_ex(ctx, sha256(), NULL) == 1 &&
	     feed(ctx, root_tag, (uint32_t)strlen(root_tag)) && feed(ctx, model_fp, KVT_HASH_BYTES) &&
	     feed(ctx, u, 4) && feed(ctx, v, 4) && feed(ctx, salt, KVT_HASH_BYTES) &&
	     EVP_DigestFinal_ex(ctx, out, &n) == 1 && n == KVT_HASH_BYTES;
	EVP_MD_CTX_free(ctx);
	if (!ok) {
		KVT_LOGE("hash: libcrypto SHA-256 failed computing a chain root");
		return KVT_EIO;
	}
	return KVT_OK;
}

/* One chain step on a caller's context (reused across a chain). */
static int step(EVP_MD_CTX *ctx, const uint8_t parent[KVT_HASH_BYTES], const int32_t *tokens,
		uint32_t n_tokens, uint8_t out[KVT_HASH_BYTES])
{
	unsigned n = 0;
	int ok = EVP_DigestInit_ex(ctx, sha256(), NULL) == 1 && feed(ctx, parent, KVT_HASH_BYTES) &&
		 feed_tokens(ctx, tokens, n_tokens) && EVP_DigestFinal_ex(ctx, out, &n) == 1 &&
		 n == KVT_HASH_BYTES;
	if (!ok) {
		KVT_LOGE("hash: libcrypto SHA-256 failed computing a block hash");
		return KVT_EIO;
	}
	return KVT_OK;
}

int kvt_hash_block(const uint8_t parent[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n_tokens,
		   uint8_t out[KVT_HASH_BYTES])
{
	if (n_tokens < 1 || n_tokens > KVT_BLOCK_MAX_TOKENS) {
		KVT_LOGE("hash: block of %u tokens, expected 1..%u", n_tokens, KVT_BLOCK_MAX_TOKENS);
		return KVT_EINVAL;
	}
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (!ctx)
		return KVT_ENOMEM;
	int rc = step(ctx, parent, tokens, n_tokens, out);
	EVP_MD_CTX_free(ctx);
	return rc;
}

int kvt_hash_chain(const uint8_t root[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n_tokens,
		   uint32_t block_tokens, uint8_t (*out)[KVT_HASH_BYTES], uint32_t cap,
		   uint32_t *n_out)
{
	uint32_t n_blocks;
	int rc = KVT_OK;

	if (block_tokens < 1 || block_tokens > KVT_BLOCK_MAX_TOKENS) {
		KVT_LOGE("hash: block_tokens %u out of range 1..%u", block_tokens, KVT_BLOCK_MAX_TOKENS);
		return KVT_EINVAL;
	}
	n_blocks = n_tokens / block_tokens;
	if (n_blocks > cap)
		n_blocks = cap;
	if (n_blocks == 0) {
		*n_out = 0;
		return KVT_OK;
	}
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (!ctx)
		return KVT_ENOMEM;
	for (uint32_t i = 0; i < n_blocks && rc == KVT_OK; i++)
		rc = step(ctx, i ? out[i - 1] : root, tokens + (size_t)i * block_tokens, block_tokens, out[i]);
	EVP_MD_CTX_free(ctx);
	if (rc == KVT_OK)
		*n_out = n_blocks;
	return rc;
}

int kvt_hash_chain_strided(const uint8_t root[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n_blocks,
			   uint32_t block_tokens, uint8_t *out, size_t stride_bytes)
{
	int rc = KVT_OK;
	if (n_blocks == 0)
		return KVT_OK;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (!ctx)
		return KVT_ENOMEM;
	for (uint32_t i = 0; i < n_blocks && rc == KVT_OK; i++)
		rc = step(ctx, i ? out + (i - 1) * stride_bytes : root, tokens + (size_t)i * block_tokens,
			  block_tokens, out + i * stride_bytes);
	EVP_MD_CTX_free(ctx);
	return rc;
}

int kvt_tenant_salt(const uint8_t *secret, size_t secret_bytes, const char *tenant,
		    uint8_t out[KVT_HASH_BYTES])
{
	unsigned n = 0;
	int rc = kvt_name_check("tenant", tenant);
	if (rc)
		return rc;
	if (!secret || secret_bytes < 16 || secret_bytes > INT32_MAX) {
		KVT_LOGE("tenant salt: server secret of %zu bytes, need at least 16", secret ? secret_bytes : 0);
		return KVT_EINVAL;
	}
	if (!HMAC(EVP_sha256(), secret, (int)secret_bytes, (const unsigned char *)tenant, strlen(tenant),
		  out, &n) ||
	    n != KVT_HASH_BYTES) {
		KVT_LOGE("tenant salt: libcrypto HMAC-SHA256 failed for tenant \"%s\"", tenant);
		return KVT_EIO;
	}
	return KVT_OK;
}

static const char *name_problem(const char *name)
{
	size_t n;
	if (!name)
		return "missing";
	n = strlen(name);
	if (n == 0)
		return "empty";
	if (n > KVT_NAME_MAX)
		return "longer than 128 bytes";
	if (name[0] == '.')
		return "starts with '.'";
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		      c == '_' || c == '-'))
			return "has a character outside [A-Za-z0-9._-]";
	}
	return NULL;
}

bool kvt_name_valid(const char *name)
{
	return name_problem(name) == NULL;
}

int kvt_name_check(const char *what, const char *name)
{
	const char *why = name_problem(name);
	if (!why)
		return KVT_OK;
	/* Print at most 64 bytes of the rejected name, with non-printables escaped as '?'. */
	char shown[65];
	size_t i = 0;
	for (; name && name[i] && i < 64; i++)
		shown[i] = (name[i] >= 0x20 && name[i] < 0x7f) ? name[i] : '?';
	shown[i] = '\0';
	KVT_LOGE("%s \"%s%s\": %s", what ? what : "name", shown, (name && name[i]) ? "..." : "", why);
	return KVT_EINVAL;
}

void kvt_hash_hex(const uint8_t h[KVT_HASH_BYTES], char out[2 * KVT_HASH_BYTES + 1])
{
	static const char hexd[] = "0123456789abcdef";
	for (int i = 0; i < KVT_HASH_BYTES; i++) {
		out[2 * i] = hexd[h[i] >> 4];
		out[2 * i + 1] = hexd[h[i] & 15];
	}
	out[2 * KVT_HASH_BYTES] = '\0';
}
