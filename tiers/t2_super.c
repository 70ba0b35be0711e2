/*
 * tiers/t2_super.c — the T2 superblock: the copies' format (t2_store.h), their
 * encoding and parsing, loading the newest valid copy, writing every copy, and
 * kvt_t2_probe, which reads them without opening a store.
 *
 * Invariants: a write goes to one copy, then the next, each fdatasynced before
 * the next starts, so a crash tears at most the copy being written; every copy
 * carries its own checksums and a sequence, and the newest valid copy wins. A
 * failed fdatasync of a copy turns the store read-only. What the store does
 * with a damaged, missing or old-format superblock at open (repair, salvage,
 * refuse) is decided in t2_store.c.
 */
#include "t2_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Field offsets of a superblock copy (t2_store.h). */
enum {
	SB_MAGIC = 0, SB_VERSION = 8, SB_CAPACITY = 16, SB_MODEL = 24, SB_GEN_LIMIT = 56, SB_CSUM1 = 64, SB_SEQ = 72,
	SB_OWNER = 80, SB_COPY = 96, SB_N_COPIES = 98, SB_CSUM2 = 104, SB_BYTES = 112,
};

/* Encode copy `copy` of the superblock into b (one unit). */
static void sb_encode(const kvt_t2_store *s, uint32_t copy, uint64_t gen_limit, uint64_t seq, uint8_t *b)
{
	memset(b, 0, KVT_T2_UNIT_BYTES);
	memcpy(b + SB_MAGIC, KVT_T2_SB_MAGIC, 8);
	put64(b + SB_VERSION, (uint64_t)KVT_T2_SB_VERSION | (uint64_t)KVT_T2_UNIT_BYTES << 32);
	put64(b + SB_CAPACITY, s->file_bytes);
	memcpy(b + SB_MODEL, s->model_fp, 32);
	put64(b + SB_GEN_LIMIT, gen_limit);
	put64(b + SB_CSUM1, XXH3_64bits(b, SB_CSUM1));
	put64(b + SB_SEQ, seq);
	memcpy(b + SB_OWNER, s->owner, KVT_T2_OWNER_BYTES);
	put16(b + SB_COPY, (uint16_t)copy);
	put16(b + SB_N_COPIES, (uint16_t)s->n_sb);
	put64(b + SB_CSUM2, XXH3_64bits(b, SB_CSUM2));
}

/*
 * Write and fdatasync every superblock copy with high-water gen_limit, one
 * after the other: a crash tears at most the copy being written, and the
 * others still hold the previous high-water, below which nothing was handed
 * out yet. Caller holds mu (or is open).
 */
int kvt_t2_sb_write(kvt_t2_store *s, uint64_t gen_limit)
{
	s->sb_seq++;
	for (uint32_t i = 0; i < s->n_sb; i++) {
		sb_encode(s, i, gen_limit, s->sb_seq, s->sb);
		int r = kvt_t2_io_pwrite_full(&s->ops, s->fd, s->sb, KVT_T2_UNIT_BYTES, (uint64_t)i * KVT_T2_UNIT_BYTES);
		if (r) {
			KVT_LOGE("t2 %s: superblock copy %u write failed: %s", s->path, i, strerror(-r));
			return KVT_EIO;
		}
		if (s->ops.fdatasync(s->ops.ctx, s->fd) != 0) {
			KVT_LOGE("t2 %s: fdatasync of superblock copy %u failed: %s; T2 is now read-only", s->path, i,
				 strerror(errno));
			s->read_only = true;
			return KVT_EIO;
		}
	}
	return KVT_OK;
}

int kvt_t2_sb_parse(const uint8_t *b, size_t n, uint32_t copy, kvt_t2_info *out, const char **why)
{
	if (n < SB_CSUM1 + 8)
		return *why = "short (the file ends inside it)", KVT_ECORRUPT;
	if (memcmp(b + SB_MAGIC, KVT_T2_SB_MAGIC, 8) != 0)
		return *why = "bad magic", KVT_EINVAL;
	if (get64(b + SB_CSUM1) != XXH3_64bits(b, SB_CSUM1))
		return *why = "checksum mismatch", KVT_ECORRUPT;
	uint64_t ver = get64(b + SB_VERSION);
	if ((ver >> 32) != KVT_T2_UNIT_BYTES)
		return *why = "unit size is not 4096", KVT_EUNSUPPORTED;
	memset(out, 0, sizeof(*out));
	out->version = (uint32_t)ver;
	out->capacity_bytes = get64(b + SB_CAPACITY);
	memcpy(out->model_fp, b + SB_MODEL, 32);
	out->gen_limit = get64(b + SB_GEN_LIMIT);
	if (out->version == 1) {
		/* format 1: one copy in unit 0, no owner; records from unit 1 */
		if (copy != 0)
			return *why = "format 1 has no second copy", KVT_ECORRUPT;
		out->n_copies = 1;
		return KVT_OK;
	}
	if (out->version != KVT_T2_SB_VERSION)
		return *why = "format version written by a newer kvtier", KVT_EUNSUPPORTED;
	if (n < SB_BYTES)
		return *why = "short (the file ends inside it)", KVT_ECORRUPT;
	if (get64(b + SB_CSUM2) != XXH3_64bits(b, SB_CSUM2))
		return *why = "checksum mismatch", KVT_ECORRUPT;
	out->n_copies = get16(b + SB_N_COPIES);
	if (get16(b + SB_COPY) != copy || out->n_copies < 1 || out->n_copies > KVT_T2_SB_COPIES || copy >= out->n_copies)
		return *why = "copy number out of place", KVT_ECORRUPT;
	out->seq = get64(b + SB_SEQ);
	memcpy(out->owner_id, b + SB_OWNER, KVT_T2_OWNER_BYTES);
	if (out->capacity_bytes % KVT_T2_UNIT_BYTES || out->capacity_bytes <= (uint64_t)out->n_copies * KVT_T2_UNIT_BYTES)
		return *why = "capacity is not a whole number of units past the superblock", KVT_ECORRUPT;
	return KVT_OK;
}

/*
 * Read every superblock copy present in the first n bytes of fd and pick the
 * newest valid one into *out (out->n_valid: how many verified; why[i]: the
 * reason copy i did not, NULL when it did). Returns KVT_OK, or the first
 * copy's error when none verified (KVT_EINVAL: not a T2 file at all;
 * KVT_EUNSUPPORTED: a newer format), KVT_EIO.
 */
int kvt_t2_sb_load(const kvt_t2_io_ops *ops, int fd, uint8_t *buf, uint64_t n, kvt_t2_info *out,
		   const char *why[KVT_T2_SB_COPIES])
{
	kvt_t2_info c[KVT_T2_SB_COPIES];
	int rcs[KVT_T2_SB_COPIES];
	int best = -1;
	for (uint32_t i = 0; i < KVT_T2_SB_COPIES; i++) {
		why[i] = NULL;
		rcs[i] = KVT_ENOTFOUND;
	}
	uint64_t want = n < (uint64_t)KVT_T2_SB_COPIES * KVT_T2_UNIT_BYTES ? n : (uint64_t)KVT_T2_SB_COPIES * KVT_T2_UNIT_BYTES;
	memset(buf, 0, (size_t)KVT_T2_SB_COPIES * KVT_T2_UNIT_BYTES);
	/* whole units only (O_DIRECT); a partial last unit is read buffered by the caller's probe */
	uint64_t whole = want / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES;
	if (whole) {
		int r = kvt_t2_io_pread_full(ops, fd, buf, whole, 0);
		if (r)
			return r;
	}
	for (uint32_t i = 0; i < KVT_T2_SB_COPIES; i++) {
		uint64_t at = (uint64_t)i * KVT_T2_UNIT_BYTES;
		size_t avail = whole > at ? KVT_T2_UNIT_BYTES : 0;
		why[i] = NULL;
		rcs[i] = kvt_t2_sb_parse(buf + at, avail, i, &c[i], &why[i]);
		if (rcs[i] == KVT_OK && i > 0 && best >= 0 && c[best].n_copies <= i) {
			why[i] = NULL; /* not a superblock copy: the record area */
			rcs[i] = KVT_ENOTFOUND;
			continue;
		}
		if (rcs[i] == KVT_OK && (best < 0 || c[i].seq > c[best].seq))
			best = (int)i;
		if (i == 0 && rcs[0] == KVT_OK && c[0].n_copies == 1)
			break; /* format 1 (or one copy): unit 1 is a record */
	}
	if (best < 0)
		return rcs[0] == KVT_EUNSUPPORTED || rcs[1] == KVT_EUNSUPPORTED ? KVT_EUNSUPPORTED
		       : rcs[0] == KVT_EINVAL && rcs[1] == KVT_EINVAL ? KVT_EINVAL
								    : KVT_ECORRUPT;
	*out = c[best];
	out->n_valid = 0;
	for (uint32_t i = 0; i < out->n_copies; i++) {
		if (rcs[i] == KVT_OK && c[i].seq == out->seq)
			out->n_valid++;
		else if (rcs[i] == KVT_OK)
			why[i] = "older than the other copy";
		else if (rcs[i] == KVT_ENOTFOUND)
			why[i] = "missing";
	}
	return KVT_OK;
}

int kvt_t2_probe(const char *path, kvt_t2_info *out)
{
	uint8_t *buf = calloc(KVT_T2_SB_COPIES, KVT_T2_UNIT_BYTES);
	const char *why[KVT_T2_SB_COPIES];
	struct stat st;
	int rc;
	if (!buf)
		return KVT_ENOMEM;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		KVT_LOGE("t2 %s: %s", path, strerror(e));
		free(buf);
		return e == ENOENT ? KVT_ENOTFOUND : KVT_EIO;
	}
	if (fstat(fd, &st) != 0) {
		KVT_LOGE("t2 %s: fstat: %s", path, strerror(errno));
		close(fd);
		free(buf);
		return KVT_EIO;
	}
	kvt_t2_io_ops ops;
	kvt_t2_io_ops_resolve(NULL, &ops);
	uint64_t size = S_ISBLK(st.st_mode) ? kvt_t2_io_blockdev_bytes(fd) : (uint64_t)st.st_size;
	rc = kvt_t2_sb_load(&ops, fd, buf, size, out, why);
	close(fd);
	free(buf);
	if (rc) {
		KVT_LOGE("t2 %s: no valid superblock (copy 0: %s; copy 1: %s)", path, why[0] ? why[0] : "-",
			 why[1] ? why[1] : "-");
		return rc;
	}
	out->file_bytes = size;
	return KVT_OK;
}
