/*
 * engine/serve/sessions_snapshot.c — a slot snapshot (llama-server's
 * POST /slots/{id}?action=save|restore, engine/serve/llama_api.c): one file
 * holding a session's token history and the KV blocks of its cached prefix,
 * which a daemon on another data directory can take back without prefilling.
 *
 * File format (version 1, little-endian):
 *     0   8  magic "KVTSLOT\0"
 *     8   4  version (1)
 *    12   4  block_tokens
 *    16   4  KV layout version
 *    20   4  n_tokens: the history's tokens
 *    24   4  n_blocks: records that follow (the leading full blocks that were cached)
 *    28   4  zero
 *    32  32  model fingerprint
 *    64  4n  the tokens (int32)
 *    then n_blocks times: 4 bytes record length, then the block's record
 *            (tiers/manager.h, kvt_tm_block_export: the T2 record format,
 *            checksummed on its own, sealed with the model fingerprint)
 *    last 32  BLAKE3 of every byte before it
 *
 * Design. Save reads the session row (no row: an empty slot, saved as zero
 * tokens), names its full blocks by the tenant's chain and exports the run
 * the tiers hold from the first; the file is written beside its final name
 * and renamed over it once synced, so a crash leaves the old file or the new
 * one. Restore checks, in this order, the magic and version, the length, the
 * trailing digest (a damaged or edited file: KVT_ECORRUPT), then the model
 * fingerprint, layout and block size (another model: KVT_EINVAL), and only
 * then enters each record under this daemon's chain over the file's tokens
 * (the chain is salted with this daemon's secret, which another data dir does
 * not share), writes the session row with the history and makes the blocks
 * due for write-through. The next turn of the session finds the blocks as any
 * cached prefix: nothing is prefilled again.
 *
 * Runs on an HTTP worker thread; touches only the manager and the index (as
 * sessions.c does), never the model.
 */
#include "sessions.h"
#include "server_int.h"

#include "blake3.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SLOT_MAGIC "KVTSLOT\0"
#define SLOT_VERSION 1u
#define SLOT_HEADER_BYTES 64u
#define SLOT_DIGEST_BYTES 32u

static void le32_put(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t le32_get(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int slot_fail(char *err, size_t cap, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int slot_fail(char *err, size_t cap, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, cap, fmt, ap);
	va_end(ap);
	return rc;
}

/* The session's row: KVT_OK, or KVT_ENOTFOUND with an empty row (no index, or no such session). */
static int slot_row(kvt_sched *s, const char *tenant, const char *id, kvt_db_session *row)
{
	const sched_sessions *ss = kvt_sched_sessions_of(s);
	memset(row, 0, sizeof(*row));
	if (!ss->db)
		return KVT_ENOTFOUND;
	int rc = kvt_db_get_session(ss->db, sched_tenant(tenant), id, row);
	if (rc != KVT_OK)
		memset(row, 0, sizeof(*row));
	return rc;
}

int kvt_slot_tokens(kvt_sched *s, const char *tenant, const char *id, uint32_t *n_tokens)
{
	kvt_db_session row;
	int rc = slot_row(s, tenant, id, &row);
	*n_tokens = rc == KVT_OK ? row.n_tokens : 0;
	kvt_db_session_deinit(&row);
	return rc == KVT_ENOTFOUND ? KVT_OK : rc;
}

/* The tenant's chain over the full blocks of toks: root, and *chain [n_full] malloc'd (NULL when none). */
static int slot_chain(kvt_sched *s, const char *tenant, const int32_t *toks, uint32_t n_toks,
		      uint8_t root[KVT_HASH_BYTES], uint8_t (**chain)[KVT_HASH_BYTES], uint32_t *n_chain)
{
	const sched_sessions *ss = kvt_sched_sessions_of(s);
	const uint32_t n_full = n_toks / ss->block_tokens;
	*chain = NULL;
	*n_chain = 0;
	int rc = sessions_chain_root(ss, tenant, root);
	if (rc != KVT_OK || !n_full)
		return rc;
	uint8_t(*hh)[KVT_HASH_BYTES] = malloc((size_t)n_full * KVT_HASH_BYTES);
	if (!hh)
		return KVT_ENOMEM;
	uint32_t n = 0;
	if ((rc = kvt_hash_chain(root, toks, n_full * ss->block_tokens, ss->block_tokens, hh, n_full, &n)) != KVT_OK) {
		free(hh);
		return rc;
	}
	*chain = hh;
	*n_chain = n;
	return KVT_OK;
}

/* The header and the tokens into b. */
static void slot_put_header(kvt_sched *s, kvt_sbuf *b, const kvt_db_session *row, uint32_t n_blocks)
{
	const sched_sessions *ss = kvt_sched_sessions_of(s);
	uint8_t h[SLOT_HEADER_BYTES] = { 0 };
	memcpy(h, SLOT_MAGIC, 8);
	le32_put(h + 8, SLOT_VERSION);
	le32_put(h + 12, ss->block_tokens);
	le32_put(h + 16, ss->layout_version);
	le32_put(h + 20, row->n_tokens);
	le32_put(h + 24, n_blocks);
	memcpy(h + 32, ss->model_fp, KVT_HASH_BYTES);
	kvt_sbuf_add(b, (const char *)h, sizeof(h));
	for (uint32_t i = 0; i < row->n_tokens; i++) {
		uint8_t t[4];
		le32_put(t, (uint32_t)row->tokens[i]);
		kvt_sbuf_add(b, (const char *)t, 4);
	}
}

/*
 * The records of the chain's leading blocks the tiers hold, appended to recs;
 * *n_blocks how many. A block in no tier ends the run (the rest of the history
 * is prefilled after a restore).
 */
static int slot_put_records(kvt_sched *s, uint8_t (*chain)[KVT_HASH_BYTES], uint32_t n_chain, kvt_sbuf *recs,
			    uint32_t *n_blocks)
{
	const sched_sessions *ss = kvt_sched_sessions_of(s);
	*n_blocks = 0;
	for (uint32_t i = 0; ss->tm && i < n_chain; i++) {
		uint8_t *rec = NULL;
		size_t n = 0;
		int rc = kvt_tm_block_export(ss->tm, ss->model_fp, chain[i], &rec, &n);
		if (rc == KVT_ENOTFOUND)
			break;
		if (rc != KVT_OK)
			return rc;
		uint8_t len[4];
		le32_put(len, (uint32_t)n);
		kvt_sbuf_add(recs, (const char *)len, 4);
		kvt_sbuf_add(recs, (const char *)rec, n);
		free(rec);
		(*n_blocks)++;
	}
	return recs->failed ? KVT_ENOMEM : KVT_OK;
}

/* Write b to path through a synced temporary file renamed over it. */
static int slot_write_file(const char *path, const kvt_sbuf *b, char *err, size_t cap)
{
	char tmp[4200];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return slot_fail(err, cap, KVT_EIO, "cannot create %s: %s", tmp, strerror(errno));
	size_t off = 0;
	while (off < b->n) {
		ssize_t w = write(fd, b->p + off, b->n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	int e = off == b->n && fdatasync(fd) == 0 ? 0 : errno ? errno : EIO;
	close(fd);
	if (!e && rename(tmp, path) != 0)
		e = errno;
	if (e) {
		unlink(tmp);
		return slot_fail(err, cap, KVT_EIO, "cannot write %s: %s", path, strerror(e));
	}
	return KVT_OK;
}

int kvt_slot_save(kvt_sched *s, const char *tenant, const char *id, const char *path, kvt_slot_io *out, char *err,
		  size_t cap)
{
	kvt_db_session row;
	uint8_t root[KVT_HASH_BYTES];
	uint8_t(*chain)[KVT_HASH_BYTES] = NULL;
	uint32_t n_chain = 0, n_blocks = 0;
	kvt_sbuf b = { 0 }, recs = { 0 };
	memset(out, 0, sizeof(*out));
	int rc = slot_row(s, tenant, id, &row);
	if (rc == KVT_ENOTFOUND) /* an empty slot: saved as zero tokens */
		rc = KVT_OK;
	if (rc == KVT_OK)
		rc = slot_chain(s, tenant, row.tokens, row.n_tokens, root, &chain, &n_chain);
	if (rc == KVT_OK)
		rc = slot_put_records(s, chain, n_chain, &recs, &n_blocks);
	if (rc != KVT_OK) {
		slot_fail(err, cap, rc, "reading the slot's KV failed: %s", kvt_strerror(rc));
		goto done;
	}
	slot_put_header(s, &b, &row, n_blocks);
	kvt_sbuf_add(&b, recs.p ? recs.p : "", recs.n);
	uint8_t digest[SLOT_DIGEST_BYTES];
	kvt_blake3(b.p, b.n, digest);
	kvt_sbuf_add(&b, (const char *)digest, sizeof(digest));
	if (b.failed) {
		rc = slot_fail(err, cap, KVT_ENOMEM, "out of memory");
		goto done;
	}
	if ((rc = slot_write_file(path, &b, err, cap)) == KVT_OK) {
		out->n_tokens = row.n_tokens;
		out->n_blocks = n_blocks;
		out->n_bytes = b.n;
	}
done:
	free(b.p);
	free(recs.p);
	free(chain);
	kvt_db_session_deinit(&row);
	return rc;
}

/* The whole file into *buf (malloc'd). KVT_ENOTFOUND (no such file), KVT_EIO. */
static int slot_read_file(const char *path, uint8_t **buf, size_t *n, char *err, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return slot_fail(err, cap, errno == ENOENT ? KVT_ENOTFOUND : KVT_EIO, "cannot open %s: %s", path,
				 strerror(errno));
	struct stat st;
	uint8_t *p = NULL;
	int rc = KVT_EIO;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (off_t)1 << 40) {
		slot_fail(err, cap, rc, "%s is not a regular file of a sane size", path);
		goto out;
	}
	if (!(p = malloc((size_t)st.st_size + 1))) {
		rc = slot_fail(err, cap, KVT_ENOMEM, "out of memory for %lld bytes", (long long)st.st_size);
		goto out;
	}
	size_t off = 0;
	while (off < (size_t)st.st_size) {
		ssize_t r = read(fd, p + off, (size_t)st.st_size - off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		off += (size_t)r;
	}
	if (off != (size_t)st.st_size) {
		slot_fail(err, cap, rc, "cannot read %s", path);
		goto out;
	}
	*buf = p;
	*n = off;
	p = NULL;
	rc = KVT_OK;
out:
	free(p);
	close(fd);
	return rc;
}

/* The parsed header of a slot file. */
typedef struct slot_hdr {
	uint32_t n_tokens;      /* the history's tokens */
	uint32_t n_blocks;      /* records */
	int32_t *tokens;        /* [n_tokens] (malloc'd) */
	const uint8_t *recs;    /* the records' bytes (into the file buffer) */
	size_t n_recs;          /* their bytes */
} slot_hdr;

/* Check a slot file's framing, digest and model, in that order; fill *h. */
static int slot_parse(kvt_sched *s, const uint8_t *p, size_t n, slot_hdr *h, char *err, size_t cap)
{
	const sched_sessions *ss = kvt_sched_sessions_of(s);
	memset(h, 0, sizeof(*h));
	if (n < SLOT_HEADER_BYTES + SLOT_DIGEST_BYTES || memcmp(p, SLOT_MAGIC, 8))
		return slot_fail(err, cap, KVT_ECORRUPT, "not a kvtier slot file (no KVTSLOT header)");
	if (le32_get(p + 8) != SLOT_VERSION)
		return slot_fail(err, cap, KVT_ECORRUPT, "slot file version %u is not supported (this daemon reads %u)",
				 le32_get(p + 8), SLOT_VERSION);
	uint8_t digest[SLOT_DIGEST_BYTES];
	kvt_blake3(p, n - SLOT_DIGEST_BYTES, digest);
	if (memcmp(digest, p + n - SLOT_DIGEST_BYTES, SLOT_DIGEST_BYTES))
		return slot_fail(err, cap, KVT_ECORRUPT, "checksum mismatch: the slot file is damaged or was altered");
	if (memcmp(p + 32, ss->model_fp, KVT_HASH_BYTES))
		return slot_fail(err, cap, KVT_EINVAL,
				 "the slot file was saved with another model (its fingerprint differs from this "
				 "daemon's): restore it on the model that saved it");
	if (le32_get(p + 12) != ss->block_tokens || le32_get(p + 16) != ss->layout_version)
		return slot_fail(err, cap, KVT_EINVAL,
				 "the slot file has %u tokens per block, KV layout %u; this daemon uses %u, %u",
				 le32_get(p + 12), le32_get(p + 16), ss->block_tokens, ss->layout_version);
	h->n_tokens = le32_get(p + 20);
	h->n_blocks = le32_get(p + 24);
	const size_t body = n - SLOT_HEADER_BYTES - SLOT_DIGEST_BYTES;
	if ((uint64_t)h->n_tokens * 4 > body || h->n_blocks > h->n_tokens / ss->block_tokens)
		return slot_fail(err, cap, KVT_ECORRUPT, "the slot file's counts (%u tokens, %u blocks) do not fit it",
				 h->n_tokens, h->n_blocks);
	if (h->n_tokens > kvt_sched_max_ctx(s))
		return slot_fail(err, cap, KVT_EINVAL, "the slot's history of %u tokens is longer than this daemon's "
				 "context (%u tokens)", h->n_tokens, kvt_sched_max_ctx(s));
	if (!(h->tokens = malloc(((size_t)h->n_tokens + 1) * sizeof(int32_t))))
		return slot_fail(err, cap, KVT_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < h->n_tokens; i++) {
		h->tokens[i] = (int32_t)le32_get(p + SLOT_HEADER_BYTES + 4 * (size_t)i);
		if (h->tokens[i] < 0 || (uint32_t)h->tokens[i] >= kvt_sched_n_vocab(s)) {
			free(h->tokens);
			h->tokens = NULL;
			return slot_fail(err, cap, KVT_ECORRUPT, "token %u of the slot file is out of the vocabulary", i);
		}
	}
	h->recs = p + SLOT_HEADER_BYTES + 4 * (size_t)h->n_tokens;
	h->n_recs = body - 4 * (size_t)h->n_tokens;
	return KVT_OK;
}

/*
 * Enter the file's records as the chain's leading blocks; *n_entered how many.
 * A host tier with no room left ends the run early (logged): the blocks past
 * it are prefilled by the next turn, as after an eviction.
 */
static int slot_enter(kvt_sched *s, const slot_hdr *h, const uint8_t root[KVT_HASH_BYTES],
		      uint8_t (*chain)[KVT_HASH_BYTES], uint32_t *n_entered, char *err, size_t cap)
{
	const sched_sessions *ss = kvt_sched_sessions_of(s);
	size_t off = 0;
	*n_entered = 0;
	for (uint32_t i = 0; i < h->n_blocks; i++) {
		if (h->n_recs - off < 4 || le32_get(h->recs + off) > h->n_recs - off - 4)
			return slot_fail(err, cap, KVT_ECORRUPT, "block %u of the slot file is cut short", i);
		const uint32_t len = le32_get(h->recs + off);
		const char *why = "";
		int rc = kvt_tm_block_import(ss->tm, ss->model_fp, h->recs + off + 4, len, chain[i],
					     i ? chain[i - 1] : root, h->tokens + (size_t)i * ss->block_tokens,
					     ss->block_tokens, &why);
		if (rc == KVT_EFULL) {
			KVT_LOGW("slot restore: no room for block %u of %u in the host tier; the rest is prefilled", i,
				 h->n_blocks);
			return KVT_OK;
		}
		if (rc != KVT_OK)
			return slot_fail(err, cap, rc, "block %u of the slot file refused: %s", i, why);
		off += 4 + (size_t)len;
		*n_entered = i + 1;
	}
	if (off != h->n_recs)
		return slot_fail(err, cap, KVT_ECORRUPT, "the slot file has %zu bytes past its blocks", h->n_recs - off);
	return KVT_OK;
}

/* The session row of the restored history (queued; the next turn replaces it). */
static int slot_put_row(kvt_sched *s, const char *tenant, const char *id, const slot_hdr *h,
			const uint8_t last[KVT_HASH_BYTES], char *err, size_t cap)
{
	const sched_sessions *ss = kvt_sched_sessions_of(s);
	if (!ss->db)
		return KVT_OK;
	kvt_db_session row;
	memset(&row, 0, sizeof(row));
	snprintf(row.id, sizeof(row.id), "%s", id);
	snprintf(row.tenant, sizeof(row.tenant), "%s", sched_tenant(tenant));
	row.tokens = h->tokens;
	row.n_tokens = h->n_tokens;
	memcpy(row.last_hash, last, KVT_HASH_BYTES);
	int rc = kvt_db_put_session(ss->db, &row, NULL, NULL, NULL);
	return rc ? slot_fail(err, cap, rc, "the slot's session row was not saved: %s", kvt_strerror(rc)) : KVT_OK;
}

int kvt_slot_restore(kvt_sched *s, const char *tenant, const char *id, const char *path, kvt_slot_io *out,
		     char *err, size_t cap)
{
	const sched_sessions *ss = kvt_sched_sessions_of(s);
	uint8_t *p = NULL, root[KVT_HASH_BYTES];
	uint8_t(*chain)[KVT_HASH_BYTES] = NULL;
	size_t n = 0;
	uint32_t n_chain = 0;
	slot_hdr h = { 0 };
	memset(out, 0, sizeof(*out));
	int rc = slot_read_file(path, &p, &n, err, cap);
	if (rc == KVT_OK)
		rc = slot_parse(s, p, n, &h, err, cap);
	if (rc == KVT_OK && (rc = slot_chain(s, tenant, h.tokens, h.n_tokens, root, &chain, &n_chain)) != KVT_OK)
		slot_fail(err, cap, rc, "hashing the slot's history failed: %s", kvt_strerror(rc));
	if (rc == KVT_OK && !ss->tm && h.n_blocks)
		h.n_blocks = 0; /* no cache to enter them into: the history is prefilled */
	uint32_t n_in = 0;
	if (rc == KVT_OK)
		rc = slot_enter(s, &h, root, chain, &n_in, err, cap);
	if (rc == KVT_OK)
		rc = slot_put_row(s, tenant, id, &h, n_chain ? chain[n_chain - 1] : root, err, cap);
	if (rc == KVT_OK && n_in &&
	    kvt_tm_end_turn_chain(ss->tm, n_in, (const uint8_t(*)[KVT_HASH_BYTES])chain, NULL, NULL))
		KVT_LOGW("slot restore %s: the blocks are not yet due for NVMe (they go at the next flush)", path);
	if (rc == KVT_OK) {
		out->n_tokens = h.n_tokens;
		out->n_blocks = n_in;
		out->n_bytes = n;
	}
	free(h.tokens);
	free(chain);
	free(p);
	return rc;
}
