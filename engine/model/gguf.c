/*
 * engine/model/gguf.c — the GGUF reader (v2, v3): parse, validate and map a
 * file, the typed getters, and a tensor's dequantization to floats.
 *
 * Reading is two passes over the read-only mapping. The first pass walks the
 * header, every key/value and every tensor info with bounds checks and counts
 * what must be allocated; nothing is allocated from a count the file states,
 * only from what the first pass actually found. The second pass walks the same
 * bytes again and fills the arrays; it cannot fail except for ENOMEM. Then the
 * semantic checks run over the filled arrays: duplicate keys and tensor names
 * (hash indexes, so they stay linear in the number of names),
 * general.alignment, tensor offsets (aligned, inside the file) and overlap.
 *
 * Invariants after a successful kvt_gguf_open() or kvt_gguf_open_mem():
 *  - every kvt_gguf_str, numeric array and tensor data range lies inside the
 *    mapping;
 *  - every tensor has a known ggml type, 1..4 dims, ne[0] a multiple of the
 *    type's block, n_elems and n_bytes without overflow, an offset that is a
 *    multiple of the alignment, and no two tensors' bytes overlap;
 *  - keys are non-empty and unique, tensor names are non-empty and unique.
 *
 * Decision on ne == 0: accepted (llama.cpp accepts empty tensors). Such a
 * tensor has n_elems == 0 and n_bytes == 0, overlaps nothing, and
 * kvt_gguf_tensor_to_f32() writes nothing. Its offset must still be aligned
 * and inside the data section.
 *
 * Nested arrays are allowed by the GGUF spec but used by no writer we know of;
 * they are reported as KVT_EUNSUPPORTED. Tensor type numbers ggml does not
 * define (or no longer sizes, like 4 and 5) are corrupt; every type ggml
 * sizes opens, and only kvt_gguf_tensor_to_f32() refuses the ones without a
 * dequantizer (Q5_1, Q2_K, Q3_K, IQ*, ...). Types, block sizes and the
 * dequantizers themselves live in gguf_quant.c (gguf_int.h); the writer is
 * gguf_writer.c. The file format is little-endian; so is every host we build
 * for (checked in gguf_int.h).
 */
#include "gguf_int.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Smallest encodings, used to bound counts by the bytes that remain. */
#define GGUF_MIN_KV_BYTES 14 /* key length 8 + key byte 1 + type 4 + 1-byte value */
#define GGUF_MIN_TI_BYTES 32 /* name length 8 + n_dims 4 + ne 8 + type 4 + offset 8 */
#define NAME_SHOW_MAX 64     /* bytes of a key or tensor name quoted in a log line */

/* ------------------------------------------------------------------------ */
/* the reader                                                                */

const char *kvt_gguf_type_name(uint32_t type)
{
	static const char *const names[KVT_GGUF_N_TYPES] = {
		"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
		"BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64",
	};
	static _Thread_local char buf[24];

	if (type < KVT_GGUF_N_TYPES)
		return names[type];
	snprintf(buf, sizeof(buf), "type%u", type);
	return buf;
}

struct kvt_gguf {
	char *path;                 /* owned copy, for messages */
	const uint8_t *map;         /* the whole file: read-only mapping, or the caller's buffer; NULL when empty */
	bool owns_map;              /* map is our mmap (kvt_gguf_open), not borrowed (kvt_gguf_open_mem) */
	uint64_t size;              /* file bytes */
	uint32_t version;           /* 2 or 3 */
	uint64_t alignment;         /* general.alignment or 32; a power of two */
	uint64_t off_data;          /* file offset of the data section (aligned) */
	uint64_t n_kv;              /* entries in kvs */
	kvt_gguf_kv *kvs;           /* [n_kv], in file order */
	uint64_t n_tensors;         /* entries in tensors */
	kvt_gguf_tensor *tensors;   /* [n_tensors], in file order */
	kvt_gguf_str *strs;         /* every string-array element, carved into kvs[i].v.arr.strs */
	uint64_t *kv_slots;         /* key hash index: kv index + 1, 0 empty; kv_mask + 1 slots */
	uint64_t kv_mask;           /* slots - 1 (a power of two minus one) */
	uint64_t *t_slots;          /* tensor name hash index, as kv_slots */
	uint64_t t_mask;            /* slots - 1 */
};

enum parse_sect { SECT_HEADER, SECT_KV, SECT_TI };

typedef struct parser {
	const char *path;     /* for messages */
	const uint8_t *base;  /* the mapping */
	uint64_t size;        /* file bytes */
	uint64_t pos;         /* cursor: next byte to read */
	kvt_gguf *g;          /* NULL in the validating pass; the arrays to fill in the second */
	int sect;             /* enum parse_sect: where the cursor is, for messages */
	uint64_t idx;         /* kv or tensor info index within sect */
	kvt_gguf_str name;    /* key or tensor name once read (len 0 before) */
	uint64_t n_strs;      /* string-array elements seen so far */
	uint32_t version;     /* from the header */
} parser;

/* Quote up to NAME_SHOW_MAX bytes of a name, replacing control bytes, into buf. */
static const char *show_name(char *buf, size_t cap, const char *s, uint64_t len)
{
	size_t n = len < NAME_SHOW_MAX ? (size_t)len : NAME_SHOW_MAX;
	size_t o = 0;

	for (size_t i = 0; i < n && o + 1 < cap; i++) {
		unsigned char c = (unsigned char)s[i];
		buf[o++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	if (n < len && o + 4 < cap) {
		memcpy(buf + o, "...", 3);
		o += 3;
	}
	buf[o] = '\0';
	return buf;
}

/* "kv 3 (general.name)", "tensor info 12 (blk.0.attn_q.weight)" or "header". */
static const char *where(const parser *p, char *buf, size_t cap)
{
	char name[NAME_SHOW_MAX + 8];
	const char *sect = p->sect == SECT_KV ? "kv" : "tensor info";

	if (p->sect == SECT_HEADER)
		snprintf(buf, cap, "header");
	else if (p->name.len)
		snprintf(buf, cap, "%s %llu (%s)", sect, (unsigned long long)p->idx,
			 show_name(name, sizeof(name), p->name.ptr, p->name.len));
	else
		snprintf(buf, cap, "%s %llu", sect, (unsigned long long)p->idx);
	return buf;
}

#define NO_IDX UINT64_MAX

/* "what" or "what 17": the field being read, with an element index when one applies. */
static const char *field(char *buf, size_t cap, const char *what, uint64_t idx)
{
	if (idx == NO_IDX)
		snprintf(buf, cap, "%s", what);
	else
		snprintf(buf, cap, "%s %llu", what, (unsigned long long)idx);
	return buf;
}

/* Check that n bytes remain at the cursor; log a truncation naming the field if not. */
static int need_i(parser *p, uint64_t n, const char *what, uint64_t idx)
{
	char w[128], f[64];

	if (p->size - p->pos >= n)
		return KVT_OK;
	KVT_LOGE("%s: truncated: %s: %s needs %llu bytes at offset %llu, file has %llu bytes",
		 p->path, where(p, w, sizeof(w)), field(f, sizeof(f), what, idx), (unsigned long long)n,
		 (unsigned long long)p->pos, (unsigned long long)p->size);
	return KVT_ECORRUPT;
}

static int need(parser *p, uint64_t n, const char *what)
{
	return need_i(p, n, what, NO_IDX);
}

static int rd_u32(parser *p, uint32_t *v, const char *what)
{
	int rc = need(p, 4, what);

	if (rc == KVT_OK) {
		memcpy(v, p->base + p->pos, 4);
		p->pos += 4;
	}
	return rc;
}

static int rd_u64(parser *p, uint64_t *v, const char *what)
{
	int rc = need(p, 8, what);

	if (rc == KVT_OK) {
		memcpy(v, p->base + p->pos, 8);
		p->pos += 8;
	}
	return rc;
}

/* A gguf string (u64 length + bytes, the bytes inside the file); idx names an array element. */
static int rd_str(parser *p, kvt_gguf_str *s, const char *what, uint64_t idx)
{
	char w[128], f[64];
	uint64_t len, at = p->pos;
	int rc = need_i(p, 8, what, idx);

	if (rc)
		return rc;
	memcpy(&len, p->base + p->pos, 8);
	p->pos += 8;
	if (len > p->size - p->pos) {
		KVT_LOGE("%s: truncated: %s: %s length %llu at offset %llu exceeds the %llu bytes left in the file",
			 p->path, where(p, w, sizeof(w)), field(f, sizeof(f), what, idx), (unsigned long long)len,
			 (unsigned long long)at, (unsigned long long)(p->size - p->pos));
		return KVT_ECORRUPT;
	}
	s->ptr = (const char *)p->base + p->pos;
	s->len = len;
	p->pos += len;
	return KVT_OK;
}

static uint32_t gguf_scalar_bytes(uint32_t type)
{
	switch (type) {
	case KVT_GGUF_UINT8: case KVT_GGUF_INT8: case KVT_GGUF_BOOL: return 1;
	case KVT_GGUF_UINT16: case KVT_GGUF_INT16: return 2;
	case KVT_GGUF_UINT32: case KVT_GGUF_INT32: case KVT_GGUF_FLOAT32: return 4;
	case KVT_GGUF_UINT64: case KVT_GGUF_INT64: case KVT_GGUF_FLOAT64: return 8;
	}
	return 0; /* STRING, ARRAY: variable */
}

static bool gguf_type_is_int(uint32_t type)
{
	switch (type) {
	case KVT_GGUF_UINT8: case KVT_GGUF_INT8: case KVT_GGUF_UINT16: case KVT_GGUF_INT16:
	case KVT_GGUF_UINT32: case KVT_GGUF_INT32: case KVT_GGUF_UINT64: case KVT_GGUF_INT64:
		return true;
	}
	return false;
}

static bool gguf_type_is_signed(uint32_t type)
{
	return type == KVT_GGUF_INT8 || type == KVT_GGUF_INT16 || type == KVT_GGUF_INT32 ||
	       type == KVT_GGUF_INT64;
}

/* Widen one little-endian scalar of a fixed-size type into the kv union. */
static void load_scalar(kvt_gguf_kv *kv, uint32_t type, const uint8_t *p)
{
	switch (type) {
	case KVT_GGUF_UINT8: kv->v.u64 = p[0]; break;
	case KVT_GGUF_INT8: kv->v.i64 = (int8_t)p[0]; break;
	case KVT_GGUF_BOOL: kv->v.b = p[0] != 0; break;
	case KVT_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u64 = x; break; }
	case KVT_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i64 = x; break; }
	case KVT_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u64 = x; break; }
	case KVT_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i64 = x; break; }
	case KVT_GGUF_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f64 = x; break; }
	case KVT_GGUF_UINT64: memcpy(&kv->v.u64, p, 8); break;
	case KVT_GGUF_INT64: memcpy(&kv->v.i64, p, 8); break;
	case KVT_GGUF_FLOAT64: memcpy(&kv->v.f64, p, 8); break;
	}
}

static int check_bools(parser *p, const uint8_t *v, uint64_t n, uint64_t at)
{
	char w[128];

	for (uint64_t i = 0; i < n; i++) {
		if (v[i] > 1) {
			KVT_LOGE("%s: %s: bool value %u at offset %llu (expected 0 or 1)", p->path,
				 where(p, w, sizeof(w)), v[i], (unsigned long long)(at + i));
			return KVT_ECORRUPT;
		}
	}
	return KVT_OK;
}

/* One metadata key/value at the cursor; fills *kv when kv is not NULL. */
static int parse_kv(parser *p, kvt_gguf_kv *kv)
{
	char w[128];
	kvt_gguf_str key;
	uint32_t type;
	uint64_t at;
	int rc;

	p->name.len = 0;
	at = p->pos;
	if ((rc = rd_str(p, &key, "key", NO_IDX)))
		return rc;
	if (key.len == 0) {
		KVT_LOGE("%s: %s: empty key at offset %llu", p->path, where(p, w, sizeof(w)),
			 (unsigned long long)at);
		return KVT_ECORRUPT;
	}
	p->name = key;
	at = p->pos;
	if ((rc = rd_u32(p, &type, "value type")))
		return rc;
	if (type >= KVT_GGUF_N_TYPES) {
		KVT_LOGE("%s: %s: bad value type %u at offset %llu (expected 0..%d)", p->path,
			 where(p, w, sizeof(w)), type, (unsigned long long)at, KVT_GGUF_N_TYPES - 1);
		return KVT_ECORRUPT;
	}
	if (kv) {
		memset(kv, 0, sizeof(*kv));
		kv->key = key;
		kv->type = type;
		kv->n = 1;
	}
	if (type == KVT_GGUF_STRING) {
		kvt_gguf_str s;
		if ((rc = rd_str(p, &s, "string value", NO_IDX)))
			return rc;
		if (kv)
			kv->v.str = s;
		return KVT_OK;
	}
	if (type != KVT_GGUF_ARRAY) {
		uint32_t nb = gguf_scalar_bytes(type);
		if ((rc = need(p, nb, kvt_gguf_type_name(type))))
			return rc;
		if (type == KVT_GGUF_BOOL && (rc = check_bools(p, p->base + p->pos, 1, p->pos)))
			return rc;
		if (kv)
			load_scalar(kv, type, p->base + p->pos);
		p->pos += nb;
		return KVT_OK;
	}

	uint32_t elem;
	uint64_t n;
	at = p->pos;
	if ((rc = rd_u32(p, &elem, "array element type")))
		return rc;
	if (elem >= KVT_GGUF_N_TYPES) {
		KVT_LOGE("%s: %s: bad array element type %u at offset %llu (expected 0..%d)", p->path,
			 where(p, w, sizeof(w)), elem, (unsigned long long)at, KVT_GGUF_N_TYPES - 1);
		return KVT_ECORRUPT;
	}
	if (elem == KVT_GGUF_ARRAY) {
		KVT_LOGE("%s: %s: array of arrays at offset %llu is not supported", p->path,
			 where(p, w, sizeof(w)), (unsigned long long)at);
		return KVT_EUNSUPPORTED;
	}
	at = p->pos;
	if ((rc = rd_u64(p, &n, "array count")))
		return rc;
	/* Every string element takes at least its 8-byte length. */
	uint64_t min_elem = elem == KVT_GGUF_STRING ? 8 : gguf_scalar_bytes(elem);
	uint64_t left = p->size - p->pos;
	if (n > left / min_elem) {
		KVT_LOGE("%s: %s: array count %llu at offset %llu is more than the %llu bytes left can hold "
			 "(%s elements of at least %llu bytes)", p->path, where(p, w, sizeof(w)),
			 (unsigned long long)n, (unsigned long long)at, (unsigned long long)left,
			 kvt_gguf_type_name(elem), (unsigned long long)min_elem);
		return KVT_ECORRUPT;
	}
	if (kv) {
		kv->arr_type = elem;
		kv->n = n;
	}
	if (elem != KVT_GGUF_STRING) {
		if (elem == KVT_GGUF_BOOL && (rc = check_bools(p, p->base + p->pos, n, p->pos)))
			return rc;
		if (kv)
			kv->v.arr.data = p->base + p->pos;
		p->pos += n * min_elem;
		return KVT_OK;
	}
	if (kv)
		kv->v.arr.strs = n ? p->g->strs + p->n_strs : NULL;
	for (uint64_t i = 0; i < n; i++) {
		kvt_gguf_str s;
		if ((rc = rd_str(p, &s, "array string", i)))
			return rc;
		if (kv)
			kv->v.arr.strs[i] = s;
	}
	p->n_strs += n;
	return KVT_OK;
}

/* One tensor info at the cursor; fills *t (without data/offset checks) when t is not NULL. */
static int parse_tensor_info(parser *p, kvt_gguf_tensor *t)
{
	char w[128];
	kvt_gguf_str name;
	uint32_t n_dims, type;
	uint64_t ne[KVT_GGUF_MAX_DIMS] = { 1, 1, 1, 1 };
	uint64_t off, at, n_elems = 1, n_bytes;
	int rc;

	p->name.len = 0;
	at = p->pos;
	if ((rc = rd_str(p, &name, "name", NO_IDX)))
		return rc;
	if (name.len == 0) {
		KVT_LOGE("%s: %s: empty tensor name at offset %llu", p->path, where(p, w, sizeof(w)),
			 (unsigned long long)at);
		return KVT_ECORRUPT;
	}
	p->name = name;
	at = p->pos;
	if ((rc = rd_u32(p, &n_dims, "n_dims")))
		return rc;
	if (n_dims < 1 || n_dims > KVT_GGUF_MAX_DIMS) {
		KVT_LOGE("%s: %s: n_dims %u at offset %llu (expected 1..%d)", p->path,
			 where(p, w, sizeof(w)), n_dims, (unsigned long long)at, KVT_GGUF_MAX_DIMS);
		return KVT_ECORRUPT;
	}
	for (uint32_t d = 0; d < n_dims; d++) {
		at = p->pos;
		if ((rc = need_i(p, 8, "ne", d)))
			return rc;
		memcpy(&ne[d], p->base + p->pos, 8);
		p->pos += 8;
		/* ggml keeps ne as int64_t. */
		if (ne[d] > (uint64_t)INT64_MAX) {
			KVT_LOGE("%s: %s: ne[%u] = %llu at offset %llu exceeds INT64_MAX", p->path,
				 where(p, w, sizeof(w)), d, (unsigned long long)ne[d], (unsigned long long)at);
			return KVT_ECORRUPT;
		}
	}
	for (uint32_t d = 0; d < n_dims; d++) {
		if (!kvt_mul_u64(n_elems, ne[d], &n_elems) || n_elems > (uint64_t)INT64_MAX) {
			KVT_LOGE("%s: %s: element count overflows (ne = [%llu, %llu, %llu, %llu])", p->path,
				 where(p, w, sizeof(w)), (unsigned long long)ne[0], (unsigned long long)ne[1],
				 (unsigned long long)ne[2], (unsigned long long)ne[3]);
			return KVT_ECORRUPT;
		}
	}
	at = p->pos;
	if ((rc = rd_u32(p, &type, "type")))
		return rc;
	const kvt_ggml_traits *ti = kvt_ggml_traits_of(type);
	if (!ti) {
		KVT_LOGE("%s: %s: unknown ggml type %u at offset %llu", p->path, where(p, w, sizeof(w)),
			 type, (unsigned long long)at);
		return KVT_ECORRUPT;
	}
	if (ne[0] % ti->block_elems) {
		KVT_LOGE("%s: %s: ne[0] = %llu is not a multiple of the %s block size %u", p->path,
			 where(p, w, sizeof(w)), (unsigned long long)ne[0], ti->name, ti->block_elems);
		return KVT_ECORRUPT;
	}
	if (!kvt_mul_u64(n_elems / ti->block_elems, ti->block_bytes, &n_bytes)) {
		KVT_LOGE("%s: %s: byte size overflows (%llu elements of %s)", p->path,
			 where(p, w, sizeof(w)), (unsigned long long)n_elems, ti->name);
		return KVT_ECORRUPT;
	}
	if ((rc = rd_u64(p, &off, "offset")))
		return rc;
	if (t) {
		memset(t, 0, sizeof(*t));
		t->name = name;
		t->n_dims = n_dims;
		memcpy(t->ne, ne, sizeof(ne));
		t->type = type;
		t->off_data = off;
		t->n_elems = n_elems;
		t->n_bytes = n_bytes;
	}
	return KVT_OK;
}

/* Walk header, kvs and tensor infos; the first pass (p->g == NULL) validates and counts. */
static int parse(parser *p, uint64_t *n_tensors, uint64_t *n_kv)
{
	uint32_t version;
	int rc;

	p->pos = 0;
	p->sect = SECT_HEADER;
	p->name.len = 0;
	p->n_strs = 0;
	if ((rc = need(p, 4, "magic")))
		return rc;
	if (memcmp(p->base, KVT_GGUF_MAGIC, 4) != 0) {
		char m[8];
		KVT_LOGE("%s: bad magic \"%s\" (%02x %02x %02x %02x) at offset 0 (expected \"GGUF\"): not a GGUF file",
			 p->path, show_name(m, sizeof(m), (const char *)p->base, 4), p->base[0], p->base[1],
			 p->base[2], p->base[3]);
		return KVT_ECORRUPT;
	}
	p->pos = 4;
	if ((rc = rd_u32(p, &version, "version")))
		return rc;
	p->version = version;
	if (version != 2 && version != 3) {
		if (__builtin_bswap32(version) >= 1 && __builtin_bswap32(version) <= 3)
			KVT_LOGE("%s: version %u at offset 4 is a big-endian GGUF (v%u), which is not supported",
				 p->path, version, __builtin_bswap32(version));
		else
			KVT_LOGE("%s: version %u at offset 4 is not supported (expected 2 or 3)", p->path, version);
		return KVT_EUNSUPPORTED;
	}
	if ((rc = rd_u64(p, n_tensors, "n_tensors")) || (rc = rd_u64(p, n_kv, "n_kv")))
		return rc;
	uint64_t left = p->size - p->pos;
	if (*n_tensors > left / GGUF_MIN_TI_BYTES) {
		KVT_LOGE("%s: n_tensors %llu at offset 8 is more than the %llu bytes left can hold "
			 "(each tensor info needs at least %d bytes)", p->path, (unsigned long long)*n_tensors,
			 (unsigned long long)left, GGUF_MIN_TI_BYTES);
		return KVT_ECORRUPT;
	}
	if (*n_kv > left / GGUF_MIN_KV_BYTES) {
		KVT_LOGE("%s: n_kv %llu at offset 16 is more than the %llu bytes left can hold "
			 "(each kv needs at least %d bytes)", p->path, (unsigned long long)*n_kv,
			 (unsigned long long)left, GGUF_MIN_KV_BYTES);
		return KVT_ECORRUPT;
	}
	p->sect = SECT_KV;
	for (uint64_t i = 0; i < *n_kv; i++) {
		p->idx = i;
		if ((rc = parse_kv(p, p->g ? &p->g->kvs[i] : NULL)))
			return rc;
	}
	p->sect = SECT_TI;
	for (uint64_t i = 0; i < *n_tensors; i++) {
		p->idx = i;
		if ((rc = parse_tensor_info(p, p->g ? &p->g->tensors[i] : NULL)))
			return rc;
	}
	return KVT_OK;
}

/* FNV-1a over a name's bytes. */
static uint64_t hash_name(const char *s, uint64_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (uint64_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
	return h;
}

static bool str_eq(kvt_gguf_str a, const char *b, uint64_t b_len)
{
	return a.len == b_len && memcmp(a.ptr, b, b_len) == 0;
}

/* Slots for n names: a power of two at least 2n (load factor <= 1/2). */
static int index_alloc(uint64_t n, uint64_t **slots, uint64_t *mask)
{
	uint64_t cap = 8;

	while (cap < 2 * n)
		cap *= 2;
	*slots = calloc(cap, sizeof(**slots));
	if (!*slots)
		return KVT_ENOMEM;
	*mask = cap - 1;
	return KVT_OK;
}

/*
 * Insert name i, unless an equal name is there: then return its index + 1
 * (0 when inserted). names(j) is the j-th name.
 */
static uint64_t index_insert(uint64_t *slots, uint64_t mask, uint64_t i, kvt_gguf_str name,
			     const kvt_gguf_str *(*names)(const kvt_gguf *, uint64_t), const kvt_gguf *g)
{
	for (uint64_t s = hash_name(name.ptr, name.len) & mask;; s = (s + 1) & mask) {
		if (!slots[s]) {
			slots[s] = i + 1;
			return 0;
		}
		if (str_eq(*names(g, slots[s] - 1), name.ptr, name.len))
			return slots[s];
	}
}

static uint64_t index_find(const uint64_t *slots, uint64_t mask, const char *name, uint64_t len,
			   const kvt_gguf_str *(*names)(const kvt_gguf *, uint64_t), const kvt_gguf *g)
{
	if (!slots)
		return 0;
	for (uint64_t s = hash_name(name, len) & mask; slots[s]; s = (s + 1) & mask) {
		if (str_eq(*names(g, slots[s] - 1), name, len))
			return slots[s];
	}
	return 0;
}

static const kvt_gguf_str *kv_key(const kvt_gguf *g, uint64_t i)
{
	return &g->kvs[i].key;
}

static const kvt_gguf_str *tensor_name(const kvt_gguf *g, uint64_t i)
{
	return &g->tensors[i].name;
}

typedef struct tensor_span {
	uint64_t off;  /* offset in the data section */
	uint64_t end;  /* off + n_bytes */
	uint64_t idx;  /* tensor index */
} tensor_span;

static int span_cmp(const void *a, const void *b)
{
	const tensor_span *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off ? 1 : 0;
}

/* Duplicates, alignment, tensor ranges and overlap, over the filled arrays. */
static int check_semantics(kvt_gguf *g, uint64_t off_infos_end)
{
	char a[NAME_SHOW_MAX + 8], b[NAME_SHOW_MAX + 8];
	int rc;

	if ((rc = index_alloc(g->n_kv, &g->kv_slots, &g->kv_mask)))
		return rc;
	for (uint64_t i = 0; i < g->n_kv; i++) {
		uint64_t dup = index_insert(g->kv_slots, g->kv_mask, i, g->kvs[i].key, kv_key, g);
		if (dup) {
			KVT_LOGE("%s: duplicate key '%s' (kv %llu and kv %llu)", g->path,
				 show_name(a, sizeof(a), g->kvs[i].key.ptr, g->kvs[i].key.len),
				 (unsigned long long)(dup - 1), (unsigned long long)i);
			return KVT_ECORRUPT;
		}
	}

	g->alignment = KVT_GGUF_DEFAULT_ALIGNMENT;
	const kvt_gguf_kv *al = kvt_gguf_find_kv(g, "general.alignment");
	if (al) {
		if (al->type != KVT_GGUF_UINT32) {
			KVT_LOGE("%s: general.alignment has type %s (expected UINT32)", g->path,
				 kvt_gguf_type_name(al->type));
			return KVT_ECORRUPT;
		}
		if (al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1))) {
			KVT_LOGE("%s: general.alignment %llu is not a nonzero power of two", g->path,
				 (unsigned long long)al->v.u64);
			return KVT_ECORRUPT;
		}
		g->alignment = al->v.u64;
	}
	/* off_infos_end <= size and alignment <= 2^31, so this cannot overflow. */
	g->off_data = (off_infos_end + g->alignment - 1) & ~(g->alignment - 1);

	if ((rc = index_alloc(g->n_tensors, &g->t_slots, &g->t_mask)))
		return rc;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		uint64_t dup = index_insert(g->t_slots, g->t_mask, i, g->tensors[i].name, tensor_name, g);
		if (dup) {
			KVT_LOGE("%s: duplicate tensor name '%s' (tensor infos %llu and %llu)", g->path,
				 show_name(a, sizeof(a), g->tensors[i].name.ptr, g->tensors[i].name.len),
				 (unsigned long long)(dup - 1), (unsigned long long)i);
			return KVT_ECORRUPT;
		}
	}
	if (g->n_tensors == 0)
		return KVT_OK;

	tensor_span *spans = malloc(g->n_tensors * sizeof(*spans));
	uint64_t n_spans = 0;
	if (!spans)
		return KVT_ENOMEM;
	rc = KVT_ECORRUPT;
	uint64_t data_bytes = g->off_data <= g->size ? g->size - g->off_data : 0;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		kvt_gguf_tensor *t = &g->tensors[i];
		const char *tn = show_name(a, sizeof(a), t->name.ptr, t->name.len);
		if (t->off_data % g->alignment) {
			KVT_LOGE("%s: tensor '%s': offset %llu is not a multiple of the alignment %llu", g->path,
				 tn, (unsigned long long)t->off_data, (unsigned long long)g->alignment);
			goto out;
		}
		if (g->off_data > g->size || t->off_data > data_bytes || t->n_bytes > data_bytes - t->off_data) {
			KVT_LOGE("%s: truncated: tensor '%s': %llu bytes of %s at data offset %llu (the data section "
				 "starts at file offset %llu) run past the end of the file (%llu bytes)", g->path, tn,
				 (unsigned long long)t->n_bytes, kvt_ggml_type_name(t->type),
				 (unsigned long long)t->off_data, (unsigned long long)g->off_data,
				 (unsigned long long)g->size);
			goto out;
		}
		t->data = g->map + g->off_data + t->off_data;
		if (t->n_bytes)
			spans[n_spans++] = (tensor_span){ t->off_data, t->off_data + t->n_bytes, i };
	}
	qsort(spans, n_spans, sizeof(*spans), span_cmp);
	for (uint64_t i = 1; i < n_spans; i++) {
		if (spans[i].off < spans[i - 1].end) {
			const kvt_gguf_tensor *x = &g->tensors[spans[i - 1].idx], *y = &g->tensors[spans[i].idx];
			KVT_LOGE("%s: tensors '%s' (data offset %llu, %llu bytes) and '%s' (data offset %llu, "
				 "%llu bytes) overlap", g->path, show_name(a, sizeof(a), x->name.ptr, x->name.len),
				 (unsigned long long)x->off_data, (unsigned long long)x->n_bytes,
				 show_name(b, sizeof(b), y->name.ptr, y->name.len),
				 (unsigned long long)y->off_data, (unsigned long long)y->n_bytes);
			goto out;
		}
	}
	rc = KVT_OK;
out:
	free(spans);
	return rc;
}

/* Parse and validate g->map (g->size bytes); g->path is set. Logs once on failure. */
static int parse_all(kvt_gguf *g)
{
	/* An empty file has no mapping; point at a zero byte so the parser's base is valid. */
	static const uint8_t empty[1];
	parser p = { .path = g->path, .base = g->map ? g->map : empty, .size = g->size };
	uint64_t n_tensors, n_kv;
	int rc;

	if ((rc = parse(&p, &n_tensors, &n_kv)))
		return rc;
	uint64_t off_infos_end = p.pos;
	/* Counts below are bounded by what the first pass found in the file. */
	g->kvs = calloc(n_kv ? n_kv : 1, sizeof(*g->kvs));
	g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(*g->tensors));
	g->strs = calloc(p.n_strs ? p.n_strs : 1, sizeof(*g->strs));
	if (!g->kvs || !g->tensors || !g->strs) {
		KVT_LOGE("%s: out of memory for %llu kvs, %llu tensors, %llu strings", g->path,
			 (unsigned long long)n_kv, (unsigned long long)n_tensors, (unsigned long long)p.n_strs);
		return KVT_ENOMEM;
	}
	p.g = g;
	if ((rc = parse(&p, &g->n_tensors, &g->n_kv)))
		return rc; /* NOTE: the bytes passed the first pass; only a bug gets here */
	g->version = p.version;
	rc = check_semantics(g, off_infos_end);
	if (rc == KVT_ENOMEM)
		KVT_LOGE("%s: out of memory for the name indexes", g->path);
	return rc;
}

static kvt_gguf *gguf_alloc(const char *path)
{
	kvt_gguf *g = calloc(1, sizeof(*g));

	if (!g || !(g->path = strdup(path))) {
		KVT_LOGE("%s: out of memory", path);
		free(g);
		return NULL;
	}
	return g;
}

int kvt_gguf_open(const char *path, kvt_gguf **out)
{
	struct stat st;
	kvt_gguf *g;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		KVT_LOGE("%s: cannot open: %s", path, strerror(e));
		return e == ENOENT ? KVT_ENOTFOUND : KVT_EIO;
	}
	if (fstat(fd, &st) != 0) {
		KVT_LOGE("%s: cannot stat: %s", path, strerror(errno));
		close(fd);
		return KVT_EIO;
	}
	if (!S_ISREG(st.st_mode)) {
		KVT_LOGE("%s: cannot open: not a regular file", path);
		close(fd);
		return KVT_EIO;
	}
	if (!(g = gguf_alloc(path))) {
		close(fd);
		return KVT_ENOMEM;
	}
	g->size = (uint64_t)st.st_size;
	if (g->size) {
		void *m = mmap(NULL, (size_t)g->size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (m == MAP_FAILED) {
			KVT_LOGE("%s: cannot map %llu bytes: %s", path, (unsigned long long)g->size, strerror(errno));
			close(fd);
			kvt_gguf_close(g);
			return KVT_EIO;
		}
		/* weights kept as stored are read from here on the CPU (see cpu_alloc on huge pages); a hint only */
		(void)madvise(m, (size_t)g->size, MADV_HUGEPAGE);
		g->map = m;
		g->owns_map = true;
	}
	close(fd);
	if ((rc = parse_all(g))) {
		kvt_gguf_close(g);
		return rc;
	}
	*out = g;
	return KVT_OK;
}

int kvt_gguf_open_mem(const void *data, uint64_t n_bytes, const char *name, kvt_gguf **out)
{
	kvt_gguf *g = gguf_alloc(name);
	int rc;

	if (!g)
		return KVT_ENOMEM;
	g->map = n_bytes ? data : NULL;
	g->size = n_bytes;
	if ((rc = parse_all(g))) {
		kvt_gguf_close(g);
		return rc;
	}
	*out = g;
	return KVT_OK;
}

void kvt_gguf_close(kvt_gguf *g)
{
	if (!g)
		return;
	if (g->owns_map)
		munmap((void *)g->map, (size_t)g->size);
	free(g->kv_slots);
	free(g->t_slots);
	free(g->strs);
	free(g->tensors);
	free(g->kvs);
	free(g->path);
	free(g);
}

const char *kvt_gguf_path(const kvt_gguf *g)
{
	return g->path;
}

uint32_t kvt_gguf_version(const kvt_gguf *g)
{
	return g->version;
}

uint64_t kvt_gguf_alignment(const kvt_gguf *g)
{
	return g->alignment;
}

uint64_t kvt_gguf_n_kv(const kvt_gguf *g)
{
	return g->n_kv;
}

const kvt_gguf_kv *kvt_gguf_kv_at(const kvt_gguf *g, uint64_t i)
{
	return i < g->n_kv ? &g->kvs[i] : NULL;
}

const kvt_gguf_kv *kvt_gguf_find_kv(const kvt_gguf *g, const char *key)
{
	uint64_t i = index_find(g->kv_slots, g->kv_mask, key, strlen(key), kv_key, g);

	return i ? &g->kvs[i - 1] : NULL;
}

uint64_t kvt_gguf_n_tensors(const kvt_gguf *g)
{
	return g->n_tensors;
}

const kvt_gguf_tensor *kvt_gguf_tensor_at(const kvt_gguf *g, uint64_t i)
{
	return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kvt_gguf_tensor *kvt_gguf_find_tensor(const kvt_gguf *g, const char *name)
{
	uint64_t i = index_find(g->t_slots, g->t_mask, name, strlen(name), tensor_name, g);

	return i ? &g->tensors[i - 1] : NULL;
}

/* ---- typed getters ---- */

/* Log a getter type mismatch: "m.gguf: key 'x' has type STRING, expected UINT32". */
static int wrong_type(const kvt_gguf *g, const kvt_gguf_kv *kv, const char *expected)
{
	char k[NAME_SHOW_MAX + 8];

	if (kv->type == KVT_GGUF_ARRAY)
		KVT_LOGE("%s: key '%s' has type ARRAY of %s, expected %s", g->path,
			 show_name(k, sizeof(k), kv->key.ptr, kv->key.len), kvt_gguf_type_name(kv->arr_type), expected);
	else
		KVT_LOGE("%s: key '%s' has type %s, expected %s", g->path,
			 show_name(k, sizeof(k), kv->key.ptr, kv->key.len), kvt_gguf_type_name(kv->type), expected);
	return KVT_EINVAL;
}

static int does_not_fit(const kvt_gguf *g, const kvt_gguf_kv *kv, const char *expected)
{
	char k[NAME_SHOW_MAX + 8];

	if (gguf_type_is_signed(kv->type))
		KVT_LOGE("%s: key '%s': %s value %lld does not fit %s", g->path,
			 show_name(k, sizeof(k), kv->key.ptr, kv->key.len), kvt_gguf_type_name(kv->type),
			 (long long)kv->v.i64, expected);
	else if (gguf_type_is_int(kv->type))
		KVT_LOGE("%s: key '%s': %s value %llu does not fit %s", g->path,
			 show_name(k, sizeof(k), kv->key.ptr, kv->key.len), kvt_gguf_type_name(kv->type),
			 (unsigned long long)kv->v.u64, expected);
	else
		KVT_LOGE("%s: key '%s': %s value %g does not fit %s", g->path,
			 show_name(k, sizeof(k), kv->key.ptr, kv->key.len), kvt_gguf_type_name(kv->type),
			 kv->v.f64, expected);
	return KVT_EINVAL;
}

int kvt_gguf_get_u64(const kvt_gguf *g, const char *key, uint64_t *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (!gguf_type_is_int(kv->type))
		return wrong_type(g, kv, "UINT64");
	if (gguf_type_is_signed(kv->type) && kv->v.i64 < 0)
		return does_not_fit(g, kv, "UINT64");
	*out = kv->v.u64;
	return KVT_OK;
}

int kvt_gguf_get_u32(const kvt_gguf *g, const char *key, uint32_t *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (!gguf_type_is_int(kv->type))
		return wrong_type(g, kv, "UINT32");
	if ((gguf_type_is_signed(kv->type) && kv->v.i64 < 0) || kv->v.u64 > UINT32_MAX)
		return does_not_fit(g, kv, "UINT32");
	*out = (uint32_t)kv->v.u64;
	return KVT_OK;
}

int kvt_gguf_get_i64(const kvt_gguf *g, const char *key, int64_t *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (!gguf_type_is_int(kv->type))
		return wrong_type(g, kv, "INT64");
	if (!gguf_type_is_signed(kv->type) && kv->v.u64 > (uint64_t)INT64_MAX)
		return does_not_fit(g, kv, "INT64");
	*out = kv->v.i64;
	return KVT_OK;
}

int kvt_gguf_get_f32(const kvt_gguf *g, const char *key, float *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (kv->type == KVT_GGUF_FLOAT32 || kv->type == KVT_GGUF_FLOAT64) {
		if (isfinite(kv->v.f64) && fabs(kv->v.f64) > FLT_MAX)
			return does_not_fit(g, kv, "FLOAT32");
		*out = (float)kv->v.f64;
	} else if (gguf_type_is_signed(kv->type)) {
		*out = (float)kv->v.i64;
	} else if (gguf_type_is_int(kv->type)) {
		*out = (float)kv->v.u64;
	} else {
		return wrong_type(g, kv, "FLOAT32");
	}
	return KVT_OK;
}

int kvt_gguf_get_bool(const kvt_gguf *g, const char *key, bool *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (kv->type != KVT_GGUF_BOOL)
		return wrong_type(g, kv, "BOOL");
	*out = kv->v.b;
	return KVT_OK;
}

int kvt_gguf_get_str(const kvt_gguf *g, const char *key, kvt_gguf_str *out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);

	if (!kv)
		return KVT_ENOTFOUND;
	if (kv->type != KVT_GGUF_STRING)
		return wrong_type(g, kv, "STRING");
	*out = kv->v.str;
	return KVT_OK;
}

int kvt_gguf_get_arr(const kvt_gguf *g, const char *key, uint32_t elem_type, const kvt_gguf_kv **out)
{
	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, key);
	char want[48];

	if (!kv)
		return KVT_ENOTFOUND;
	if (kv->type != KVT_GGUF_ARRAY || kv->arr_type != elem_type) {
		snprintf(want, sizeof(want), "ARRAY of %s", kvt_gguf_type_name(elem_type));
		return wrong_type(g, kv, want);
	}
	*out = kv;
	return KVT_OK;
}

int64_t kvt_gguf_arr_i64(const kvt_gguf_kv *kv, uint64_t i)
{
	kvt_gguf_kv x;

	KVT_ASSERT(kv->type == KVT_GGUF_ARRAY && i < kv->n);
	KVT_ASSERT(gguf_type_is_int(kv->arr_type) || kv->arr_type == KVT_GGUF_BOOL);
	uint32_t nb = gguf_scalar_bytes(kv->arr_type);
	load_scalar(&x, kv->arr_type, (const uint8_t *)kv->v.arr.data + i * nb);
	if (kv->arr_type == KVT_GGUF_BOOL)
		return x.v.b;
	return x.v.i64; /* NOTE: UINT64 elements above INT64_MAX wrap negative */
}

double kvt_gguf_arr_f64(const kvt_gguf_kv *kv, uint64_t i)
{
	kvt_gguf_kv x;

	KVT_ASSERT(kv->type == KVT_GGUF_ARRAY && i < kv->n);
	uint32_t nb = gguf_scalar_bytes(kv->arr_type);
	KVT_ASSERT(nb != 0);
	load_scalar(&x, kv->arr_type, (const uint8_t *)kv->v.arr.data + i * nb);
	switch (kv->arr_type) {
	case KVT_GGUF_FLOAT32: case KVT_GGUF_FLOAT64: return x.v.f64;
	case KVT_GGUF_BOOL: return x.v.b;
	}
	return gguf_type_is_signed(kv->arr_type) ? (double)x.v.i64 : (double)x.v.u64;
}

int kvt_gguf_tensor_check_finite(const kvt_gguf *g, const kvt_gguf_tensor *t, uint64_t *bad_elem)
{
	/* the byte offsets of a block's fp16 scales (d, and m / dmin where the type has one) */
	uint32_t off[2], n_off = 1;
	switch (t->type) {
	case KVT_GGML_F32:
	case KVT_GGML_F16:
	case KVT_GGML_BF16: off[0] = 0; break;
	case KVT_GGML_Q8_0:
	case KVT_GGML_Q4_0:
	case KVT_GGML_Q5_0: off[0] = 0; break;
	case KVT_GGML_Q4_1:
	case KVT_GGML_Q4_K:
	case KVT_GGML_Q5_K: off[0] = 0, off[1] = 2, n_off = 2; break;
	case KVT_GGML_Q6_K: off[0] = 208; break; /* ql[128], qh[64], scales[16], then d */
	default: return KVT_EUNSUPPORTED;
	}
	KVT_ASSERT(t >= g->tensors && t < g->tensors + g->n_tensors);
	const kvt_ggml_traits *ti = kvt_ggml_traits_of(t->type);
	const uint8_t *p = t->data;
	const uint64_t n_blocks = t->n_elems / ti->block_elems;
	for (uint64_t b = 0; b < n_blocks; b++, p += ti->block_bytes) {
		bool bad = false;
		if (t->type == KVT_GGML_F32) {
			uint32_t u;
			memcpy(&u, p, 4);
			bad = (u & 0x7f800000u) == 0x7f800000u;
		} else {
			for (uint32_t k = 0; k < n_off; k++) {
				uint16_t h;
				memcpy(&h, p + off[k], 2);
				/* an all-ones exponent is Inf or NaN: fp16's is 5 bits, bf16's 8 */
				bad |= t->type == KVT_GGML_BF16 ? (h & 0x7f80u) == 0x7f80u : (h & 0x7c00u) == 0x7c00u;
			}
		}
		if (bad) {
			*bad_elem = b * ti->block_elems;
			return KVT_ECORRUPT;
		}
	}
	return KVT_OK;
}

int kvt_gguf_tensor_to_f32(const kvt_gguf *g, const kvt_gguf_tensor *t, float *dst)
{
	char n[NAME_SHOW_MAX + 8];
	const kvt_ggml_traits *ti = kvt_ggml_traits_of(t->type);

	KVT_ASSERT(t >= g->tensors && t < g->tensors + g->n_tensors);
	if (!ti->dequant) {
		KVT_LOGE("%s: %s: type %s is not supported", g->path,
			 show_name(n, sizeof(n), t->name.ptr, t->name.len), ti->name);
		return KVT_EUNSUPPORTED;
	}
	ti->dequant(t->data, dst, t->n_elems / ti->block_elems);
	return KVT_OK;
}
