/*
 * tiers/t2_record.c — the T2 on-disk record (format in t2_store.h): packing a
 * block (optional compression), sealing the header with its checksum, and
 * verifying what a read brought back.
 *
 * Invariants: the checksum (XXH3-64) covers the whole extent — header (its
 * own field read as zero), stored payload and zero padding — and is seeded with the record's file
 * offset and generation, so the same bytes at another offset, or an older
 * generation's record at the right offset, never verify. Every length is
 * checked against the bytes actually read before it is used. Nothing is
 * decompressed before the checksum matched, and decompression is
 * LZ4_decompress_safe with the exact raw size as the bound.
 */
#include "t2_int.h"

#include <lz4.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

/* Field offsets of the version-1 header. */
enum {
	H_MAGIC = 0, H_VERSION = 8, H_HDR_BYTES = 10, H_FLAGS = 12, H_MODEL = 16, H_HASH = 48, H_PARENT = 80,
	H_GEN = 112, H_OFF = 120, H_RAW = 128, H_STORED = 132, H_EXTENT = 136, H_NTOK = 140, H_DTYPE = 144,
	H_CODEC = 145, H_SCALE = 146, H_COMP = 147, H_ZERO = 148, H_CSUM = 152, H_TOKENS = 160,
};

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

uint64_t kvt_t2_seed(uint64_t off, uint64_t generation)
{
	uint8_t b[16];
	put64(b, off);
	put64(b + 8, generation);
	return XXH3_64bits_withSeed(b, sizeof(b), 0x6b76743254324b56ull /* "VK2T2tvk" */);
}

/*
 * Checksum of the whole extent: header (csum field as zero), payload, padding.
 * Only the first have bytes are in rec (have >= H_CSUM + 8); the rest of the
 * extent is taken as zeros (a T3 record travels without its padding).
 */
static uint64_t record_checksum_have(const uint8_t *rec, size_t have, uint32_t extent_bytes, uint64_t seed)
{
	static const uint8_t zeros[4096];
	XXH3_state_t st;
	memset(&st, 0, sizeof(st)); /* NOTE: gcc 12 cannot see that reset fills it */
	XXH3_64bits_reset_withSeed(&st, seed);
	XXH3_64bits_update(&st, rec, H_CSUM);
	XXH3_64bits_update(&st, zeros, 8);
	if (have > extent_bytes)
		have = extent_bytes;
	XXH3_64bits_update(&st, rec + H_CSUM + 8, have - H_CSUM - 8);
	for (size_t left = extent_bytes - have; left;) {
		size_t k = left < sizeof(zeros) ? left : sizeof(zeros);
		XXH3_64bits_update(&st, zeros, k);
		left -= k;
	}
	return XXH3_64bits_digest(&st);
}

static uint64_t record_checksum(const uint8_t *rec, uint32_t extent_bytes, uint64_t seed)
{
	return record_checksum_have(rec, extent_bytes, extent_bytes, seed);
}

void kvt_t2_shuffle2(const uint8_t *src, uint8_t *dst, size_t n)
{
	size_t half = n / 2;
	for (size_t i = 0; i < half; i++) {
		dst[i] = src[2 * i];
		dst[half + i] = src[2 * i + 1];
	}
	if (n & 1)
		dst[n - 1] = src[n - 1];
}

void kvt_t2_unshuffle2(const uint8_t *src, uint8_t *dst, size_t n)
{
	size_t half = n / 2;
	for (size_t i = 0; i < half; i++) {
		dst[2 * i] = src[i];
		dst[2 * i + 1] = src[half + i];
	}
	if (n & 1)
		dst[n - 1] = src[n - 1];
}

void kvt_t2_record_pack(const kvt_t2_block_meta *meta, const void *payload, uint8_t comp, void *scratch,
			uint8_t *rec, size_t rec_cap, kvt_t2_sized *out)
{
	uint32_t raw = meta->raw_bytes;
	uint8_t *dst = rec + KVT_T2_HEADER_BYTES;
	uint64_t ext_raw = kvt_t2_round_up((uint64_t)KVT_T2_HEADER_BYTES + raw, KVT_T2_UNIT_BYTES);

	KVT_ASSERT(ext_raw <= rec_cap);
	if (comp != KVT_T2_COMP_NONE) {
		/* Keep compression only if it saves >= 15% and at least one unit:
		 * the LZ4 destination bound enforces the first (0 = did not fit). */
		int limit = (int)(raw - raw * 15ull / 100);
		const char *src = payload;
		if (comp == KVT_T2_COMP_SHUF2_LZ4) {
			kvt_t2_shuffle2(payload, scratch, raw);
			src = scratch;
		}
		int c = LZ4_compress_default(src, (char *)dst, (int)raw, limit);
		if (c > 0 && kvt_t2_round_up((uint64_t)KVT_T2_HEADER_BYTES + (uint64_t)c, KVT_T2_UNIT_BYTES) < ext_raw) {
			out->stored_bytes = (uint32_t)c;
			out->extent_bytes = (uint32_t)kvt_t2_round_up((uint64_t)KVT_T2_HEADER_BYTES + (uint64_t)c,
								      KVT_T2_UNIT_BYTES);
			out->comp = comp;
			return;
		}
	}
	memcpy(dst, payload, raw);
	out->stored_bytes = raw;
	out->extent_bytes = (uint32_t)ext_raw;
	out->comp = KVT_T2_COMP_NONE;
}

void kvt_t2_record_seal(const kvt_t2_block_meta *meta, const uint8_t model_fp[32], const kvt_t2_sized *sz,
			uint64_t off, uint64_t generation, uint8_t *rec, kvt_t2_loc *loc)
{
	memset(rec, 0, KVT_T2_HEADER_BYTES);
	memcpy(rec + H_MAGIC, KVT_T2_REC_MAGIC, 8);
	put16(rec + H_VERSION, KVT_T2_FORMAT_VERSION);
	put16(rec + H_HDR_BYTES, KVT_T2_HEADER_BYTES);
	put32(rec + H_FLAGS, meta->flags);
	memcpy(rec + H_MODEL, model_fp, 32);
	memcpy(rec + H_HASH, meta->hash, 32);
	memcpy(rec + H_PARENT, meta->parent, 32);
	put64(rec + H_GEN, generation);
	put64(rec + H_OFF, off);
	put32(rec + H_RAW, meta->raw_bytes);
	put32(rec + H_STORED, sz->stored_bytes);
	put32(rec + H_EXTENT, sz->extent_bytes);
	put32(rec + H_NTOK, meta->n_tokens);
	rec[H_DTYPE] = meta->kv_dtype;
	rec[H_CODEC] = meta->codec;
	rec[H_SCALE] = meta->scale_layout;
	rec[H_COMP] = sz->comp;
	for (uint32_t i = 0; i < meta->n_tokens; i++)
		put32(rec + H_TOKENS + 4 * i, (uint32_t)meta->tokens[i]);
	memset(rec + KVT_T2_HEADER_BYTES + sz->stored_bytes, 0,
	       sz->extent_bytes - KVT_T2_HEADER_BYTES - sz->stored_bytes);
	uint64_t csum = record_checksum(rec, sz->extent_bytes, kvt_t2_seed(off, generation));
	put64(rec + H_CSUM, csum);
	loc->off = off;
	loc->extent_bytes = sz->extent_bytes;
	loc->stored_bytes = sz->stored_bytes;
	loc->generation = generation;
	loc->checksum = csum;
	loc->compressed = sz->comp;
}

/* The structural checks shared by peek and verify; *why on failure. */
static bool header_sane(const uint8_t *rec, uint64_t off, uint64_t limit_bytes, const char **why)
{
	uint32_t hdr = get16(rec + H_HDR_BYTES);
	uint32_t raw = get32(rec + H_RAW), stored = get32(rec + H_STORED), ext = get32(rec + H_EXTENT);
	uint8_t comp = rec[H_COMP];

	if (memcmp(rec + H_MAGIC, KVT_T2_REC_MAGIC, 8) != 0)
		return *why = "bad magic", false;
	if (get16(rec + H_VERSION) != KVT_T2_FORMAT_VERSION)
		return *why = "unknown format version", false;
	if (hdr != KVT_T2_HEADER_BYTES)
		return *why = "bad header length", false;
	if (get64(rec + H_OFF) != off)
		return *why = "record belongs to another offset (misdirected write)", false;
	if (ext % KVT_T2_UNIT_BYTES || ext == 0 || (uint64_t)hdr + stored > ext || ext > limit_bytes)
		return *why = "bad extent length", false;
	if (raw == 0 || raw > KVT_T2_MAX_RAW_BYTES || get32(rec + H_NTOK) > KVT_T2_MAX_TOKENS)
		return *why = "bad raw length or token count", false;
	if (comp > KVT_T2_COMP_SHUF2_LZ4 || (comp == KVT_T2_COMP_NONE && stored != raw) ||
	    (comp != KVT_T2_COMP_NONE && (stored == 0 || stored >= raw)))
		return *why = "bad compression field", false;
	return true;
}

bool kvt_t2_record_peek(const uint8_t *rec, uint64_t off, uint64_t file_bytes, uint32_t *extent_bytes)
{
	const char *why;
	if (off >= file_bytes || !header_sane(rec, off, file_bytes - off, &why))
		return false;
	*extent_bytes = get32(rec + H_EXTENT);
	return true;
}

/* n bytes of rec are present; unpadded: the extent may reach up to limit, its bytes past n being zeros. */
static int verify_impl(const uint8_t *rec, size_t n, bool unpadded, uint64_t limit, uint64_t off,
		       const kvt_t2_loc *want, const uint8_t model_fp[32], const uint8_t *expect_hash, kvt_t2_block_meta *meta_out,
		       void *payload_out, size_t payload_cap, void *scratch, kvt_t2_loc *loc_out, const char **why)
{
	if (n < KVT_T2_HEADER_BYTES)
		return *why = "short record", KVT_ECORRUPT;
	if (!header_sane(rec, off, limit, why))
		return KVT_ECORRUPT;
	uint64_t gen = get64(rec + H_GEN), csum = get64(rec + H_CSUM);
	uint32_t raw = get32(rec + H_RAW), stored = get32(rec + H_STORED), ext = get32(rec + H_EXTENT);
	uint8_t comp = rec[H_COMP];
	if (n < (size_t)KVT_T2_HEADER_BYTES + stored)
		return *why = "short record", KVT_ECORRUPT;
	if (unpadded && n > ext) /* a T3 value is the record, nothing after it */
		return *why = "record longer than its extent", KVT_ECORRUPT;
	if (want) {
		if (gen != want->generation)
			return *why = "stale or foreign generation", KVT_ECORRUPT;
		if (csum != want->checksum || ext != want->extent_bytes || stored != want->stored_bytes ||
		    comp != want->compressed)
			return *why = "record differs from its index entry", KVT_ECORRUPT;
	}
	if (record_checksum_have(rec, n, ext, kvt_t2_seed(off, gen)) != csum)
		return *why = "checksum mismatch", KVT_ECORRUPT;
	if (memcmp(rec + H_MODEL, model_fp, 32) != 0)
		return *why = "record of another model", KVT_ECORRUPT;
	if (expect_hash && memcmp(rec + H_HASH, expect_hash, 32) != 0)
		return *why = "block hash differs from the expected one", KVT_ECORRUPT;
	for (uint32_t i = get32(rec + H_NTOK); i < KVT_T2_MAX_TOKENS; i++)
		if (get32(rec + H_TOKENS + 4 * i) != 0)
			return *why = "nonzero bytes past the token list", KVT_ECORRUPT;
	if (payload_out && raw > payload_cap)
		return *why = "payload buffer too small", KVT_EFULL;

	if (payload_out) {
		const char *src = (const char *)rec + KVT_T2_HEADER_BYTES;
		if (comp == KVT_T2_COMP_NONE) {
			memcpy(payload_out, src, raw);
		} else {
			char *dst = comp == KVT_T2_COMP_SHUF2_LZ4 ? scratch : payload_out;
			if (LZ4_decompress_safe(src, dst, (int)stored, (int)raw) != (int)raw)
				return *why = "LZ4 payload does not decompress to its raw length", KVT_ECORRUPT;
			if (comp == KVT_T2_COMP_SHUF2_LZ4)
				kvt_t2_unshuffle2(scratch, payload_out, raw);
		}
	}
	if (meta_out) {
		memcpy(meta_out->hash, rec + H_HASH, 32);
		memcpy(meta_out->parent, rec + H_PARENT, 32);
		meta_out->n_tokens = get32(rec + H_NTOK);
		memset(meta_out->tokens, 0, sizeof(meta_out->tokens));
		for (uint32_t i = 0; i < meta_out->n_tokens; i++)
			meta_out->tokens[i] = (int32_t)get32(rec + H_TOKENS + 4 * i);
		meta_out->kv_dtype = rec[H_DTYPE];
		meta_out->codec = rec[H_CODEC];
		meta_out->scale_layout = rec[H_SCALE];
		meta_out->raw_bytes = raw;
		meta_out->flags = get32(rec + H_FLAGS); /* unknown bits too: the caller tests the ones it knows */
	}
	if (loc_out) {
		loc_out->off = off;
		loc_out->extent_bytes = ext;
		loc_out->stored_bytes = stored;
		loc_out->generation = gen;
		loc_out->checksum = csum;
		loc_out->compressed = comp;
	}
	return KVT_OK;
}

int kvt_t2_record_verify(const uint8_t *rec, size_t n, uint64_t off, const kvt_t2_loc *want,
			 const uint8_t model_fp[32], const uint8_t *expect_hash, kvt_t2_block_meta *meta_out,
			 void *payload_out, size_t payload_cap, void *scratch, kvt_t2_loc *loc_out, const char **why)
{
	return verify_impl(rec, n, false, n, off, want, model_fp, expect_hash, meta_out, payload_out, payload_cap, scratch,
			   loc_out, why);
}

int kvt_t2_record_verify_unpadded(const uint8_t *rec, size_t n, uint64_t limit, uint64_t off,
				  const uint8_t model_fp[32], const uint8_t *expect_hash, kvt_t2_block_meta *meta_out,
				  void *payload_out, size_t payload_cap, void *scratch, const char **why)
{
	return verify_impl(rec, n, true, limit, off, NULL, model_fp, expect_hash, meta_out, payload_out, payload_cap,
			   scratch, NULL, why);
}
