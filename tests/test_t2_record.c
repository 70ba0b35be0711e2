/* ctest-labels: unit fuzz */
/*
 * tests/test_t2_record.c — the T2 record parser (t2_record.c) on untrusted
 * bytes, without a disk: one handcrafted corrupt record per failure category
 * (each rejected with its own reason), the checksum recomputed here from the
 * format documented in t2_store.h (so the documentation is checked too), the
 * header flags (a chunk block's) written, read back and under the checksum, and
 * a seeded mutation run: random byte changes anywhere in random records are
 * always rejected; with the checksum re-sealed over the mutated bytes (so the
 * deeper checks and LZ4_decompress_safe see hostile input) nothing crashes or
 * overruns (ASan build) and whatever is accepted is self-consistent.
 */
#include "check.h"
#include "t2_int.h"

#include <lz4.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

static const uint8_t FP[32] = { 'f', 'p' };
enum { OFF = 7 * 4096, CAP = 64 << 10 };

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}
static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)get64(p) & 0xffffffffu; /* NOTE: reads 8 bytes: never at the record's last 4 */
}
static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* The checksum as t2_store.h documents it, computed independently of t2_record.c. */
static uint64_t doc_checksum(const uint8_t *rec, uint32_t extent, uint64_t off, uint64_t gen)
{
	uint8_t b[16], *tmp = malloc(extent);
	put64(b, off);
	put64(b + 8, gen);
	uint64_t seed = XXH3_64bits_withSeed(b, 16, 0x6b76743254324b56ull);
	memcpy(tmp, rec, extent);
	memset(tmp + 152, 0, 8);
	uint64_t c = XXH3_64bits_withSeed(tmp, extent, seed);
	free(tmp);
	return c;
}

/* Re-seal the checksum over whatever the record now holds (extent from its header, clamped). */
static void reseal(uint8_t *rec, uint32_t n)
{
	uint32_t ext = (uint32_t)rec[136] | (uint32_t)rec[137] << 8 | (uint32_t)rec[138] << 16 | (uint32_t)rec[139] << 24;
	if (ext > n || ext < 160)
		ext = n;
	put64(rec + 152, doc_checksum(rec, ext, get64(rec + 120), get64(rec + 112)));
}

static void make(check_rng *r, uint8_t comp, uint32_t raw, uint8_t *payload, kvt_t2_block_meta *m, uint8_t *rec,
		 kvt_t2_loc *loc, void *scratch)
{
	memset(m, 0, sizeof(*m));
	for (int i = 0; i < 32; i++)
		m->hash[i] = (uint8_t)check_rng_u64(r);
	m->n_tokens = 16;
	for (int i = 0; i < 16; i++)
		m->tokens[i] = (int32_t)(check_rng_u64(r) % 50000);
	m->raw_bytes = raw;
	for (uint32_t i = 0; i < raw; i++) /* compressible when comp asks for it */
		payload[i] = comp ? (uint8_t)(i % 37 + (check_rng_u64(r) % 8 == 0)) : (uint8_t)check_rng_u64(r);
	kvt_t2_sized sz;
	kvt_t2_record_pack(m, payload, comp, scratch, rec, CAP, &sz);
	kvt_t2_record_seal(m, FP, &sz, OFF, 42, rec, loc);
}

static int verify(const uint8_t *rec, uint32_t n, const kvt_t2_loc *want, const uint8_t *hash, uint8_t *out,
		  void *scratch, const char **why)
{
	kvt_t2_block_meta m;
	return kvt_t2_record_verify(rec, n, OFF, want, FP, hash, &m, out, CAP, scratch, NULL, why);
}

int main(void)
{
	check_rng r = { 77 };
	uint8_t *rec = aligned_alloc(4096, CAP), *bad = aligned_alloc(4096, CAP), *payload = malloc(CAP),
		*out = malloc(CAP), *scratch = malloc(CAP);
	kvt_t2_block_meta m;
	kvt_t2_loc loc;
	const char *why = "";

	/* a good record verifies, and its checksum is the documented one */
	make(&r, KVT_T2_COMP_LZ4, 30000, payload, &m, rec, &loc, scratch);
	CHECK(loc.compressed == KVT_T2_COMP_LZ4);
	CHECK_EQ_INT(verify(rec, loc.extent_bytes, &loc, m.hash, out, scratch, &why), KVT_OK);
	CHECK(memcmp(out, payload, 30000) == 0);
	CHECK(doc_checksum(rec, loc.extent_bytes, OFF, 42) == loc.checksum);

	/* one corrupt input per failure category, each named */
	struct { const char *what; int field, width; uint64_t value; bool reseal; const char *why; } cases[] = {
		{ "magic", 0, 1, 'X', true, "bad magic" },
		{ "version", 8, 2, 2, true, "unknown format version" },
		{ "header length", 10, 2, 4096, true, "bad header length" },
		{ "offset", 120, 8, OFF + 4096, true, "another offset" },
		{ "extent", 136, 4, 3000, true, "bad extent length" },
		{ "extent past the bytes read", 136, 4, 1u << 20, true, "bad extent length" },
		{ "raw length", 128, 4, 0, true, "bad raw length" },
		{ "token count", 140, 4, 257, true, "token count" },
		{ "compression kind", 147, 1, 9, true, "bad compression field" },
		{ "stored > raw", 132, 4, 40000, true, "bad extent length" },
		{ "generation", 112, 8, 41, true, "stale or foreign generation" },
		{ "checksum", 152, 1, 0x5a, false, "differs from its index entry" },
		{ "payload bit", 2000, 1, 0x77, false, "checksum mismatch" },
		{ "padding bit", 0, 0, 0, false, "checksum mismatch" }, /* last byte of the extent */
		{ "model", 16, 1, 'Q', true, "another model" },
		{ "hash", 48, 1, 0, true, "block hash differs" },
		{ "token past n_tokens", 160 + 4 * 200, 4, 5, true, "past the token list" },
		{ "LZ4 stream", 1280 + 40, 4, 0xffffffff, true, "does not decompress" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memcpy(bad, rec, loc.extent_bytes);
		if (cases[i].width == 0) {
			bad[loc.extent_bytes - 1] ^= 1;
		} else {
			uint64_t v = cases[i].value;
			if (cases[i].field == 16 || cases[i].field == 48)
				v = bad[cases[i].field] ^ 0xff;
			for (int b = 0; b < cases[i].width; b++)
				bad[cases[i].field + b] = cases[i].width == 1 && cases[i].field == 152
								  ? bad[152] ^ (uint8_t)v
								  : (uint8_t)(v >> (8 * b));
			if (cases[i].field == 2000)
				bad[2000] = rec[2000] ^ 0x77;
		}
		if (cases[i].reseal)
			reseal(bad, loc.extent_bytes);
		kvt_t2_loc want = loc;
		if (cases[i].reseal) /* the index row follows the record, except for what is tested */
			want.checksum = get64(bad + 152);
		if (cases[i].field == 112)
			want.generation = 42;
		why = "";
		int rc = verify(bad, loc.extent_bytes, &want, m.hash, out, scratch, &why);
		CHECKF(rc == KVT_ECORRUPT && strstr(why, cases[i].why), "%s: rc %d, why \"%s\" (want \"%s\")",
		       cases[i].what, rc, why, cases[i].why);
	}
	/* a short read */
	CHECK_EQ_INT(verify(rec, 100, &loc, m.hash, out, scratch, &why), KVT_ECORRUPT);
	CHECK_EQ_INT(verify(rec, loc.extent_bytes - 4096, &loc, m.hash, out, scratch, &why), KVT_ECORRUPT);

	/* seeded mutations over random records of every kind */
	int n_rejected = 0, n_plain = 0, n_resealed_ok = 0;
	for (int it = 0; it < 4000; it++) {
		uint8_t comp = (uint8_t)(check_rng_u64(&r) % 3);
		uint32_t raw = 1 + (uint32_t)(check_rng_u64(&r) % 40000);
		make(&r, comp, raw, payload, &m, rec, &loc, scratch);
		memcpy(bad, rec, loc.extent_bytes);
		int n_mut = 1 + (int)(check_rng_u64(&r) % 8);
		bool in_header = check_rng_u64(&r) % 2;
		for (int k = 0; k < n_mut; k++) {
			uint32_t at = (uint32_t)(check_rng_u64(&r) % (in_header ? 1280 : loc.extent_bytes));
			bad[at] ^= (uint8_t)(1 + check_rng_u64(&r) % 255);
		}
		if (memcmp(bad, rec, loc.extent_bytes) == 0)
			continue; /* the changes cancelled out */
		bool do_reseal = check_rng_u64(&r) % 2;
		if (!do_reseal) {
			n_plain++;
			int rc = verify(bad, loc.extent_bytes, &loc, m.hash, out, scratch, &why);
			n_rejected += rc == KVT_ECORRUPT;
			continue;
		}
		reseal(bad, loc.extent_bytes);
		kvt_t2_block_meta got;
		kvt_t2_loc gl;
		int rc = kvt_t2_record_verify(bad, loc.extent_bytes, OFF, NULL, FP, NULL, &got, out, CAP, scratch, &gl, &why);
		if (rc == KVT_OK) {
			n_resealed_ok++;
			CHECK(got.raw_bytes <= KVT_T2_MAX_RAW_BYTES && got.n_tokens <= KVT_T2_MAX_TOKENS);
			CHECK(gl.extent_bytes <= loc.extent_bytes && gl.stored_bytes + 1280 <= gl.extent_bytes);
		} else {
			CHECK(rc == KVT_ECORRUPT || rc == KVT_EFULL);
		}
	}
	CHECKF(n_rejected == n_plain, "%d of %d mutated records rejected", n_rejected, n_plain);
	printf("test_t2_record: %d mutated records all rejected; %d re-sealed mutants accepted as valid records\n",
	       n_plain, n_resealed_ok);

	/* the header flags (offset 12): written as given, read back; a record without them reads as 0 */
	make(&r, 0, 5000, payload, &m, rec, &loc, scratch);
	kvt_t2_block_meta got;
	CHECK(kvt_t2_record_verify(rec, loc.extent_bytes, OFF, &loc, FP, m.hash, &got, NULL, 0, NULL, NULL, &why) ==
	      KVT_OK && got.flags == 0 && get32(rec + 12) == 0);
	m.flags = KVT_T2_FLAG_CHUNK;
	kvt_t2_sized sz = { .stored_bytes = loc.stored_bytes, .extent_bytes = loc.extent_bytes, .comp = 0 };
	kvt_t2_record_seal(&m, FP, &sz, OFF, 43, rec, &loc);
	CHECK_EQ_INT(get32(rec + 12), KVT_T2_FLAG_CHUNK);
	CHECK(doc_checksum(rec, loc.extent_bytes, OFF, 43) == loc.checksum); /* the flags are under the checksum */
	CHECK(kvt_t2_record_verify(rec, loc.extent_bytes, OFF, &loc, FP, m.hash, &got, NULL, 0, NULL, NULL, &why) ==
	      KVT_OK && got.flags == KVT_T2_FLAG_CHUNK);
	rec[12] ^= 2; /* a flag changed after the seal */
	CHECK_EQ_INT(kvt_t2_record_verify(rec, loc.extent_bytes, OFF, &loc, FP, m.hash, &got, NULL, 0, NULL, NULL, &why),
		     KVT_ECORRUPT);

	/* the header peek used by scan: sane headers only */
	make(&r, 0, 5000, payload, &m, rec, &loc, scratch);
	uint32_t ext = 0;
	CHECK(kvt_t2_record_peek(rec, OFF, OFF + loc.extent_bytes, &ext) && ext == loc.extent_bytes);
	CHECK(!kvt_t2_record_peek(rec, OFF, OFF + loc.extent_bytes - 4096, &ext)); /* runs past the file */
	CHECK(!kvt_t2_record_peek(rec, OFF + 4096, 1 << 30, &ext));                /* another offset */

	/* shuffle round trip, odd length */
	for (uint32_t i = 0; i < 1001; i++)
		payload[i] = (uint8_t)(i * 7);
	kvt_t2_shuffle2(payload, scratch, 1001);
	kvt_t2_unshuffle2(scratch, out, 1001);
	CHECK(memcmp(out, payload, 1001) == 0);
	CHECK(((uint8_t *)scratch)[1] == payload[2] && ((uint8_t *)scratch)[500] == payload[1]);

	free(rec);
	free(bad);
	free(payload);
	free(out);
	free(scratch);
	return check_done("test_t2_record");
}
