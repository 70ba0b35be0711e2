/*
 * tests/test_gguf_corrupt.c — one handcrafted bad GGUF per failure category,
 * truncation at every byte, seeded random mutations, and the fuzzer's
 * regression inputs (tests/data/gguf_regress/, when present).
 *
 * Each bad file must give the right result code and exactly one error line
 * that contains the words naming the problem. Files are built byte by byte
 * with the small builder below (not with the library's writer) so that every
 * field can be made wrong on purpose.
 */
/* ctest-labels: unit fuzz */
#include "check.h"
#include "gguf.h"
#include "gguf_walk.h"

#include <dirent.h>
#include <stdint.h>
#include <unistd.h>

static char tmp_dir[256];
static char tmp_file[512];

/* ---- byte builder ---- */

typedef struct buf {
	uint8_t *p;  /* bytes */
	size_t n;    /* used */
	size_t cap;  /* allocated */
} buf;

static void b_put(buf *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->n + n)
			cap *= 2;
		b->p = realloc(b->p, cap);
		if (!b->p)
			abort();
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, p, n);
	b->n += n;
}

static void b_u32(buf *b, uint32_t v) { b_put(b, &v, 4); }
static void b_u64(buf *b, uint64_t v) { b_put(b, &v, 8); }
static void b_u8(buf *b, uint8_t v) { b_put(b, &v, 1); }

static void b_str(buf *b, const char *s)
{
	b_u64(b, strlen(s));
	b_put(b, s, strlen(s));
}

static void b_zeros(buf *b, size_t n)
{
	static const uint8_t z[4096];
	while (n) {
		size_t k = n < sizeof(z) ? n : sizeof(z);
		b_put(b, z, k);
		n -= k;
	}
}

static void b_pad(buf *b, size_t align)
{
	b_zeros(b, (align - b->n % align) % align);
}

static void hdr(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	b->n = 0;
	b_put(b, "GGUF", 4);
	b_u32(b, version);
	b_u64(b, n_tensors);
	b_u64(b, n_kv);
}

static void kv_u32(buf *b, const char *key, uint32_t v)
{
	b_str(b, key);
	b_u32(b, KVT_GGUF_UINT32);
	b_u32(b, v);
}

static void kv_str(buf *b, const char *key, const char *v)
{
	b_str(b, key);
	b_u32(b, KVT_GGUF_STRING);
	b_str(b, v);
}

/* A tensor info with n_dims dims from ne. */
static void ti(buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off)
{
	b_str(b, name);
	b_u32(b, n_dims);
	for (uint32_t d = 0; d < n_dims; d++)
		b_u64(b, ne[d]);
	b_u32(b, type);
	b_u64(b, off);
}

static void write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
		perror(path);
		abort();
	}
}

/*
 * Open b's bytes; expect rc and one error line containing every word in
 * words (NULL-terminated).
 */
#define EXPECT(b, rc, ...) expect_at(__LINE__, (b), (rc), (const char *[]){ __VA_ARGS__, NULL })

static void expect_at(int line, const buf *b, int want_rc, const char **words)
{
	kvt_gguf *g = NULL;
	int rc;

	write_file(tmp_file, b->p, b->n);
	check_log_reset();
	rc = kvt_gguf_open(tmp_file, &g);
	CHECKF(rc == want_rc, "line %d: rc %s, expected %s (log: %s)", line, kvt_strerror(rc),
	       kvt_strerror(want_rc), check_log_text);
	CHECKF(check_log_n_errors == 1, "line %d: %d error lines: %s", line, check_log_n_errors, check_log_text);
	CHECKF(strstr(check_log_text, tmp_file) != NULL, "line %d: log does not name the file: %s", line, check_log_text);
	for (const char **w = words; *w; w++)
		CHECKF(strstr(check_log_text, *w) != NULL, "line %d: log lacks \"%s\": %s", line, *w, check_log_text);
	if (rc == KVT_OK)
		kvt_gguf_close(g);
	else
		CHECK(g == NULL);
}

/* ---- one file per failure category ---- */

static void test_categories(void)
{
	buf b = { 0 };
	uint64_t ne1[1] = { 16 }, ne2[2] = { 32, 2 };

	/* Magic and version. */
	hdr(&b, 3, 0, 0);
	memcpy(b.p, "GGUX", 4);
	EXPECT(&b, KVT_ECORRUPT, "bad magic", "GGUX", "offset 0");
	hdr(&b, 1, 0, 0);
	EXPECT(&b, KVT_EUNSUPPORTED, "version 1 ", "not supported");
	hdr(&b, 99, 0, 0);
	EXPECT(&b, KVT_EUNSUPPORTED, "version 99 ", "not supported");
	hdr(&b, 0x03000000, 0, 0);
	EXPECT(&b, KVT_EUNSUPPORTED, "big-endian");

	/* Truncated header, and an empty file. */
	hdr(&b, 3, 0, 0);
	b.n = 12;
	EXPECT(&b, KVT_ECORRUPT, "truncated", "n_tensors", "needs 8 bytes at offset 8", "file has 12 bytes");
	b.n = 0;
	EXPECT(&b, KVT_ECORRUPT, "truncated", "magic", "file has 0 bytes");
	b.n = 2;
	EXPECT(&b, KVT_ECORRUPT, "truncated", "magic");

	/* Counts that the remaining bytes cannot hold. */
	hdr(&b, 3, 0, (uint64_t)1 << 62);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "n_kv 4611686018427387904", "offset 16");
	hdr(&b, 3, (uint64_t)1 << 62, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "n_tensors 4611686018427387904", "offset 8");
	hdr(&b, 3, 0, 2); /* claims 2 kvs, holds 1 and half a key length */
	kv_str(&b, "a.b", "a string long enough to pass the count bound");
	b_u32(&b, 7);
	EXPECT(&b, KVT_ECORRUPT, "truncated", "kv 1: key needs 8 bytes");

	/* Strings. */
	hdr(&b, 3, 0, 1);
	b_u64(&b, (uint64_t)1 << 63);
	b_put(&b, "abc", 3);
	b_zeros(&b, 16);
	EXPECT(&b, KVT_ECORRUPT, "kv 0", "key length 9223372036854775808", "offset 24", "exceeds");
	hdr(&b, 3, 0, 1);
	b_str(&b, "s");
	b_u32(&b, KVT_GGUF_STRING);
	b_u64(&b, 100); /* past EOF */
	b_put(&b, "short", 5);
	EXPECT(&b, KVT_ECORRUPT, "kv 0 (s)", "string value length 100", "exceeds the 5 bytes left");
	hdr(&b, 3, 0, 1);
	b_u64(&b, 0);
	b_u32(&b, KVT_GGUF_UINT32);
	b_u32(&b, 1);
	b_zeros(&b, 8);
	EXPECT(&b, KVT_ECORRUPT, "empty key", "offset 24");

	/* Metadata types. */
	hdr(&b, 3, 0, 1);
	b_str(&b, "t");
	b_u32(&b, 13);
	b_zeros(&b, 8);
	EXPECT(&b, KVT_ECORRUPT, "kv 0 (t)", "bad value type 13", "offset 33");
	hdr(&b, 3, 0, 1);
	b_str(&b, "t");
	b_u32(&b, KVT_GGUF_BOOL);
	b_u8(&b, 2);
	b_zeros(&b, 8);
	EXPECT(&b, KVT_ECORRUPT, "bool value 2");
	hdr(&b, 3, 0, 1);
	b_str(&b, "arr");
	b_u32(&b, KVT_GGUF_ARRAY);
	b_u32(&b, KVT_GGUF_ARRAY);
	b_u64(&b, 1);
	b_zeros(&b, 16);
	EXPECT(&b, KVT_EUNSUPPORTED, "kv 0 (arr)", "array of arrays", "not supported");
	hdr(&b, 3, 0, 1);
	b_str(&b, "arr");
	b_u32(&b, KVT_GGUF_ARRAY);
	b_u32(&b, 200);
	b_u64(&b, 1);
	b_zeros(&b, 16);
	EXPECT(&b, KVT_ECORRUPT, "bad array element type 200");
	hdr(&b, 3, 0, 1);
	b_str(&b, "arr");
	b_u32(&b, KVT_GGUF_ARRAY);
	b_u32(&b, KVT_GGUF_UINT64);
	b_u64(&b, (uint64_t)1 << 61); /* * 8 bytes overflows 64 bits if multiplied */
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "array count 2305843009213693952", "more than the 64 bytes left");
	hdr(&b, 3, 0, 1);
	b_str(&b, "arr");
	b_u32(&b, KVT_GGUF_ARRAY);
	b_u32(&b, KVT_GGUF_STRING);
	b_u64(&b, 3);
	b_str(&b, "x");
	b_u64(&b, 1000);
	b_zeros(&b, 16);
	EXPECT(&b, KVT_ECORRUPT, "kv 0 (arr)", "array string 1 length 1000");
	hdr(&b, 3, 0, 1);
	b_str(&b, "n");
	b_u32(&b, KVT_GGUF_UINT64);
	b_u32(&b, 7); /* 4 of the 8 bytes */
	EXPECT(&b, KVT_ECORRUPT, "truncated", "kv 0 (n)", "UINT64 needs 8 bytes");

	/* Duplicate keys. */
	hdr(&b, 3, 0, 3);
	kv_u32(&b, "a.b", 1);
	kv_str(&b, "c", "x");
	kv_u32(&b, "a.b", 2);
	EXPECT(&b, KVT_ECORRUPT, "duplicate key 'a.b'", "kv 0 and kv 2");

	/* Alignment. */
	hdr(&b, 3, 0, 1);
	kv_u32(&b, "general.alignment", 0);
	EXPECT(&b, KVT_ECORRUPT, "general.alignment 0 is not a nonzero power of two");
	hdr(&b, 3, 0, 1);
	kv_u32(&b, "general.alignment", 3);
	EXPECT(&b, KVT_ECORRUPT, "general.alignment 3 is not a nonzero power of two");
	hdr(&b, 3, 0, 1);
	kv_str(&b, "general.alignment", "32");
	EXPECT(&b, KVT_ECORRUPT, "general.alignment has type STRING", "expected UINT32");

	/* Tensor infos. */
	hdr(&b, 3, 2, 0);
	ti(&b, "w", 1, ne1, KVT_GGML_F32, 0);
	ti(&b, "w", 1, ne1, KVT_GGML_F32, 64);
	b_pad(&b, 32);
	b_zeros(&b, 128);
	EXPECT(&b, KVT_ECORRUPT, "duplicate tensor name 'w'", "tensor infos 0 and 1");
	hdr(&b, 3, 1, 0);
	ti(&b, "w", 0, ne1, KVT_GGML_F32, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "tensor info 0 (w)", "n_dims 0", "expected 1..4");
	hdr(&b, 3, 1, 0);
	ti(&b, "w", 5, (uint64_t[]){ 1, 1, 1, 1, 1 }, KVT_GGML_F32, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "tensor info 0 (w)", "n_dims 5");
	hdr(&b, 3, 1, 0);
	ti(&b, "w", 2, (uint64_t[]){ (uint64_t)1 << 32, (uint64_t)1 << 32 }, KVT_GGML_F32, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "tensor info 0 (w)", "element count overflows");
	hdr(&b, 3, 1, 0);
	ti(&b, "w", 3, (uint64_t[]){ (uint64_t)1 << 31, (uint64_t)1 << 31, 2 }, KVT_GGML_F32, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "element count overflows"); /* 2^63 > INT64_MAX */
	hdr(&b, 3, 1, 0);
	ti(&b, "w", 1, (uint64_t[]){ (uint64_t)1 << 63 }, KVT_GGML_F32, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "ne[0] = 9223372036854775808", "exceeds INT64_MAX");
	hdr(&b, 3, 1, 0);
	ti(&b, "w", 1, (uint64_t[]){ (uint64_t)1 << 60 }, KVT_GGML_F32, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "truncated", "tensor 'w'", "past the end of the file");
	hdr(&b, 3, 1, 0);
	ti(&b, "w", 1, (uint64_t[]){ (uint64_t)1 << 62 }, KVT_GGML_F32, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "tensor info 0 (w)", "byte size overflows");
	hdr(&b, 3, 1, 0);
	ti(&b, "q", 2, (uint64_t[]){ 33, 1 }, KVT_GGML_Q8_0, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "tensor info 0 (q)", "ne[0] = 33 is not a multiple of the Q8_0 block size 32");
	hdr(&b, 3, 1, 0);
	ti(&b, "u", 1, ne1, 99, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "tensor info 0 (u)", "unknown ggml type 99");
	hdr(&b, 3, 1, 0);
	ti(&b, "u", 1, ne1, 4, 0); /* Q4_2: removed from ggml, no size */
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "unknown ggml type 4");
	hdr(&b, 3, 1, 0);
	ti(&b, "", 1, ne1, KVT_GGML_F32, 0);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "tensor info 0", "empty tensor name");
	hdr(&b, 3, 1, 0);
	ti(&b, "long.name", 1, ne1, KVT_GGML_F32, 0);
	b.n -= 4; /* offset cut short */
	EXPECT(&b, KVT_ECORRUPT, "truncated", "tensor info 0 (long.name)", "offset needs 8 bytes");

	/* Offsets and ranges. */
	hdr(&b, 3, 1, 0);
	ti(&b, "w", 1, ne1, KVT_GGML_F32, 4);
	b_pad(&b, 32);
	b_zeros(&b, 128);
	EXPECT(&b, KVT_ECORRUPT, "tensor 'w'", "offset 4 is not a multiple of the alignment 32");
	hdr(&b, 3, 1, 1);
	kv_u32(&b, "general.alignment", 64);
	ti(&b, "w", 1, ne1, KVT_GGML_F32, 32);
	b_pad(&b, 64);
	b_zeros(&b, 128);
	EXPECT(&b, KVT_ECORRUPT, "offset 32 is not a multiple of the alignment 64");
	hdr(&b, 3, 1, 0);
	ti(&b, "w", 2, ne2, KVT_GGML_F32, 0); /* 256 bytes */
	b_pad(&b, 32);
	b_zeros(&b, 255);
	EXPECT(&b, KVT_ECORRUPT, "truncated", "tensor 'w'", "256 bytes of F32", "past the end of the file");
	hdr(&b, 3, 1, 0);
	ti(&b, "w", 1, ne1, KVT_GGML_F32, (uint64_t)-32); /* offset + size wraps */
	b_pad(&b, 32);
	b_zeros(&b, 64);
	EXPECT(&b, KVT_ECORRUPT, "tensor 'w'", "past the end of the file");
	hdr(&b, 3, 3, 0);
	ti(&b, "a", 1, ne1, KVT_GGML_F32, 0);  /* [0, 64) */
	ti(&b, "b", 1, ne1, KVT_GGML_F32, 96); /* [96, 160) */
	ti(&b, "c", 1, ne1, KVT_GGML_F32, 32); /* [32, 96): overlaps a */
	b_pad(&b, 32);
	b_zeros(&b, 192);
	EXPECT(&b, KVT_ECORRUPT, "tensors 'a'", "'c'", "overlap");

	/* Valid edge cases open: zero tensors without a padded data section, an empty tensor at the end. */
	hdr(&b, 3, 0, 1);
	kv_str(&b, "k", "v");
	write_file(tmp_file, b.p, b.n);
	kvt_gguf *g = NULL;
	check_log_reset();
	CHECK(kvt_gguf_open(tmp_file, &g) == KVT_OK && check_log_n_errors == 0);
	kvt_gguf_close(g);
	hdr(&b, 3, 2, 0);
	ti(&b, "w", 1, ne1, KVT_GGML_F32, 0);
	ti(&b, "e", 2, (uint64_t[]){ 0, 3 }, KVT_GGML_Q4_0, 64);
	b_pad(&b, 32);
	b_zeros(&b, 64);
	write_file(tmp_file, b.p, b.n);
	g = NULL;
	CHECK(kvt_gguf_open(tmp_file, &g) == KVT_OK && check_log_n_errors == 0);
	if (g) {
		const kvt_gguf_tensor *e = kvt_gguf_find_tensor(g, "e");
		CHECK(e && e->n_elems == 0 && e->n_bytes == 0);
		(void)gguf_walk(g);
		kvt_gguf_close(g);
	}
	free(b.p);
}

/* A known-but-unloadable type opens; only dequantizing it fails. */
static void test_unsupported_type(void)
{
	buf b = { 0 };
	kvt_gguf *g = NULL;
	float out[256];
	char want[600];

	hdr(&b, 3, 2, 1);
	kv_str(&b, "general.architecture", "llama");
	ti(&b, "blk.7.attn_q.weight", 2, (uint64_t[]){ 256, 2 }, KVT_GGML_Q3_K, 0);
	ti(&b, "blk.7.attn_k.weight", 1, (uint64_t[]){ 32 }, KVT_GGML_Q8_0, 224);
	b_pad(&b, 32);
	b_zeros(&b, 224 + 34);
	write_file(tmp_file, b.p, b.n);
	check_log_reset();
	CHECK(kvt_gguf_open(tmp_file, &g) == KVT_OK && check_log_n_errors == 0);
	if (g) {
		const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, "blk.7.attn_q.weight");
		CHECK(t && t->type == KVT_GGML_Q3_K && t->n_bytes == 220);
		CHECK(kvt_gguf_tensor_to_f32(g, t, out) == KVT_EUNSUPPORTED);
		snprintf(want, sizeof(want), "%s: blk.7.attn_q.weight: type Q3_K is not supported", tmp_file);
		CHECKF(check_log_n_errors == 1 && strstr(check_log_text, want), "log: %s", check_log_text);
		t = kvt_gguf_find_tensor(g, "blk.7.attn_k.weight");
		CHECK(t && kvt_gguf_tensor_to_f32(g, t, out) == KVT_OK && out[0] == 0.0f);
		kvt_gguf_close(g);
	}
	free(b.p);
}

/* A small valid file with a bit of everything, built by hand. */
static void build_small_valid(buf *b, uint64_t *end_of_data)
{
	uint64_t ne1[1] = { 32 }, ne2[2] = { 32, 2 };

	hdr(b, 3, 3, 4);
	kv_u32(b, "general.alignment", 32);
	kv_str(b, "general.name", "tiny");
	b_str(b, "tok");
	b_u32(b, KVT_GGUF_ARRAY);
	b_u32(b, KVT_GGUF_STRING);
	b_u64(b, 3);
	b_str(b, "a");
	b_str(b, "");
	b_str(b, "bc");
	b_str(b, "f");
	b_u32(b, KVT_GGUF_ARRAY);
	b_u32(b, KVT_GGUF_FLOAT32);
	b_u64(b, 2);
	b_u32(b, 0x3f800000);
	b_u32(b, 0x40000000);
	ti(b, "w.f32", 1, ne1, KVT_GGML_F32, 0);    /* 128 bytes */
	ti(b, "w.q8", 2, ne2, KVT_GGML_Q8_0, 128);  /* 68 bytes */
	ti(b, "w.q41", 1, ne1, KVT_GGML_Q4_1, 224); /* 20 bytes */
	b_pad(b, 32);
	for (int i = 0; i < 32; i++) {
		float f = (float)i;
		b_put(b, &f, 4);
	}
	for (int k = 0; k < 2; k++) {
		uint16_t d = 0x3c00;
		b_put(b, &d, 2);
		for (int j = 0; j < 32; j++)
			b_u8(b, (uint8_t)(j * 7));
	}
	b_zeros(b, 224 - 196);
	uint16_t dm[2] = { 0x3400, 0xbc00 };
	b_put(b, dm, 4);
	for (int j = 0; j < 16; j++)
		b_u8(b, (uint8_t)(j * 17));
	*end_of_data = b->n;
	b_pad(b, 32);
}

static void test_truncation(void)
{
	buf b = { 0 };
	uint64_t end;
	kvt_gguf *g = NULL;

	build_small_valid(&b, &end);
	write_file(tmp_file, b.p, b.n);
	check_log_reset();
	CHECK(kvt_gguf_open(tmp_file, &g) == KVT_OK && check_log_n_errors == 0);
	if (g) {
		(void)gguf_walk(g);
		kvt_gguf_close(g);
	}
	/*
	 * Every cut before the end of the last tensor's bytes is an error, logged
	 * once, as a truncation or as a count the bytes left cannot hold.
	 */
	int bad = 0;
	for (uint64_t n = 0; n < end; n++) {
		write_file(tmp_file, b.p, n);
		check_log_reset();
		g = NULL;
		int rc = kvt_gguf_open(tmp_file, &g);
		if (rc != KVT_ECORRUPT || check_log_n_errors != 1 ||
		    (!strstr(check_log_text, "truncated") && !strstr(check_log_text, "bytes left can hold"))) {
			if (bad++ < 5)
				CHECKF(false, "cut at %llu: rc %s, %d errors: %s", (unsigned long long)n,
				       kvt_strerror(rc), check_log_n_errors, check_log_text);
			if (rc == KVT_OK)
				kvt_gguf_close(g);
		}
	}
	CHECKF(bad == 0, "%d truncations misreported", bad);
	/* The trailing padding after the last tensor is optional. */
	write_file(tmp_file, b.p, end);
	CHECK(kvt_gguf_open(tmp_file, &g) == KVT_OK);
	kvt_gguf_close(g);
	free(b.p);
}

/* Seeded random mutations: any result is fine, crashing or leaking is not. */
static void test_mutations(void)
{
	buf b = { 0 };
	uint64_t end;
	check_rng r = { 0x6775676675ull };
	int n_ok = 0;

	build_small_valid(&b, &end);
	uint8_t *m = malloc(b.n);
	int level = kvt_log_get_level();
	for (int it = 0; it < 2000; it++) {
		memcpy(m, b.p, b.n);
		int n_edits = 1 + (int)(check_rng_u64(&r) % 4);
		for (int e = 0; e < n_edits; e++) {
			uint64_t pos = check_rng_u64(&r) % b.n;
			switch (check_rng_u64(&r) % 4) {
			case 0: m[pos] ^= (uint8_t)(1u << (check_rng_u64(&r) % 8)); break;
			case 1: m[pos] = (uint8_t)check_rng_u64(&r); break;
			case 2: m[pos] = (uint8_t)(m[pos] + 1); break;
			default: m[pos] = (uint8_t)(check_rng_u64(&r) % 2 ? 0xff : 0x00); break;
			}
		}
		write_file(tmp_file, m, b.n);
		check_log_reset();
		kvt_gguf *g = NULL;
		int rc = kvt_gguf_open(tmp_file, &g);
		if (rc == KVT_OK) {
			n_ok++;
			(void)gguf_walk(g);
			kvt_gguf_close(g);
		} else {
			CHECK(g == NULL && check_log_n_errors == 1);
		}
	}
	kvt_log_set_level(level);
	printf("mutations: %d of 2000 still opened\n", n_ok);
	free(m);
	free(b.p);
}

/* Inputs that once crashed the fuzzer (tests/data/gguf_regress/): must open or fail cleanly. */
static void test_regressions(void)
{
#ifdef KVT_SOURCE_DIR
	char dir[1024], path[2048];
	DIR *d;
	struct dirent *e;
	int n = 0;

	snprintf(dir, sizeof(dir), "%s/tests/data/gguf_regress", KVT_SOURCE_DIR);
	d = opendir(dir);
	if (!d)
		return;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		check_log_reset();
		kvt_gguf *g = NULL;
		int rc = kvt_gguf_open(path, &g);
		if (rc == KVT_OK) {
			(void)gguf_walk(g);
			kvt_gguf_close(g);
		} else {
			CHECKF(check_log_n_errors == 1, "%s: %d error lines", e->d_name, check_log_n_errors);
		}
		n++;
	}
	closedir(d);
	printf("regression inputs: %d\n", n);
#endif
}

int main(void)
{
	const char *base = getenv("TMPDIR");

	snprintf(tmp_dir, sizeof(tmp_dir), "%s/kvt_gguf_corrupt_XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(tmp_dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(tmp_file, sizeof(tmp_file), "%s/bad.gguf", tmp_dir);
	kvt_log_set_sink(check_log_sink, NULL);
	test_categories();
	test_unsupported_type();
	test_truncation();
	test_mutations();
	test_regressions();
	kvt_log_set_sink(NULL, NULL);
	unlink(tmp_file);
	rmdir(tmp_dir);
	return check_done("test_gguf_corrupt");
}
