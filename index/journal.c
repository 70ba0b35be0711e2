/*
 * index/journal.c — the session journal: every session write of the index,
 * appended to a file of its own in the data directory, so the sessions can be
 * recovered when the SQLite index (or its WAL) is lost (DESIGN.md §4: what
 * SQLite holds must be recoverable from what survives its loss; the blocks
 * come back from the T2 records, the sessions from here).
 *
 * Design: an append-only log of self-checking records, written by the index's
 * writer thread in the same group commit as the SQLite transaction: the
 * records of a batch are appended and fdatasync'ed *before* its COMMIT, so the
 * journal is never behind the index. Each record carries a sequence number;
 * the index stores the last one it committed (meta.journal_seq), so at open
 * the records the index lacks (seq > journal_seq) are exactly the ones to
 * replay, and a journal that ends before journal_seq has lost records.
 * Rewriting (kvt_sj_rewrite) replaces the log by one put per live session
 * (tmp file, fsync, rename, fsync of the directory), which bounds its size.
 *
 * Record (little-endian):
 *   u32 magic "KVSJ", u32 body_bytes, body, u64 XXH3-64(body)
 *   body: u64 seq, u8 kind (1 put, 2 delete), u8 pad[3], u32 layout_version,
 *         u32 block_tokens, u8 model_fp[32], u16 tenant_len, u16 id_len,
 *         u32 n_tokens, u8 last_hash[32], i64 updated (unix s),
 *         tenant, id, n_tokens x i32 token ids
 * Reading stops at the first record that does not check (a torn tail after a
 * crash); the writer truncates the file there before appending.
 *
 * I/O seam: every pwrite, fdatasync, ftruncate and rename of the file (and
 * of a rewrite's tmp file) goes through sj_pwrite / sj_fdatasync /
 * sj_ftruncate / sj_rename, which call kvt_db_config.journal_io's hooks when
 * set (tests/powerloss.h keeps what a power cut would lose) and the syscalls
 * otherwise; reads and the creating open are plain.
 *
 * Fault points (core/fault.h): "idx.journal.written" after a batch's records
 * are written and before their fdatasync; "idx.journal.rewrite_synced" after
 * a rewrite's tmp file is synced and before the rename;
 * "idx.journal.rewrite_renamed" after the rename and before the directory's
 * fsync.
 *
 * Thread rules: one owner thread per handle (the index's writer).
 */
#include "fault.h"
#include "index_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define SJ_MAGIC 0x4a53564bu /* "KVSJ" */
#define SJ_FIXED (8 + 1 + 3 + 4 + 4 + 32 + 2 + 2 + 4 + 32 + 8) /* body bytes before the names */

struct kvt_sjournal {
	char *path;        /* the file */
	int fd;            /* O_RDWR | O_APPEND-free: we write at good_end */
	uint64_t good_end; /* bytes of whole, checked records */
	uint8_t *buf;      /* records appended since the last sync */
	size_t n_buf, cap_buf;
	const kvt_db_journal_io *io; /* the I/O hooks (borrowed), or NULL: syscalls */
};

/* ---- the I/O seam: the hook when set, else the syscall ---- */

static ssize_t sj_pwrite(const kvt_sjournal *j, const void *buf, size_t n, off_t off)
{
	return j->io && j->io->pwrite ? j->io->pwrite(j->io->ctx, j->path, j->fd, buf, n, off)
				      : pwrite(j->fd, buf, n, off);
}

static int sj_fdatasync(const kvt_sjournal *j)
{
	return j->io && j->io->fdatasync ? j->io->fdatasync(j->io->ctx, j->path, j->fd) : fdatasync(j->fd);
}

static int sj_ftruncate(const kvt_sjournal *j, off_t len)
{
	return j->io && j->io->ftruncate ? j->io->ftruncate(j->io->ctx, j->path, j->fd, len) : ftruncate(j->fd, len);
}

static int sj_rename(const kvt_sjournal *j, const char *from, const char *to)
{
	return j->io && j->io->rename ? j->io->rename(j->io->ctx, from, to) : rename(from, to);
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

size_t kvt_sj_record_bytes(const kvt_sj_rec *r)
{
	return 8 + SJ_FIXED + strlen(r->tenant) + strlen(r->id) + 4 * (size_t)r->n_tokens + 8;
}

/* Encode r at out (kvt_sj_record_bytes(r) bytes). */
static void encode(const kvt_sj_rec *r, uint8_t *out)
{
	size_t lt = strlen(r->tenant), li = strlen(r->id);
	size_t body = SJ_FIXED + lt + li + 4 * (size_t)r->n_tokens;
	uint8_t *b = out + 8;
	put32(out, SJ_MAGIC);
	put32(out + 4, (uint32_t)body);
	memset(b, 0, SJ_FIXED);
	put64(b, r->seq);
	b[8] = r->kind;
	put32(b + 12, r->ns.layout_version);
	put32(b + 16, r->ns.block_tokens);
	memcpy(b + 20, r->ns.model_fp, KVT_HASH_BYTES);
	put16(b + 52, (uint16_t)lt);
	put16(b + 54, (uint16_t)li);
	put32(b + 56, r->n_tokens);
	memcpy(b + 60, r->last_hash, KVT_HASH_BYTES);
	put64(b + 92, (uint64_t)r->updated);
	memcpy(b + SJ_FIXED, r->tenant, lt);
	memcpy(b + SJ_FIXED + lt, r->id, li);
	uint8_t *t = b + SJ_FIXED + lt + li;
	for (uint32_t i = 0; i < r->n_tokens; i++)
		put32(t + 4 * i, (uint32_t)r->tokens[i]);
	put64(b + body, XXH3_64bits(b, body));
}

/*
 * Decode the record at p (avail bytes). Returns its size, 0 when it does not
 * check (torn, garbage). r->tokens points into scratch (grown as needed).
 */
static size_t decode(const uint8_t *p, size_t avail, kvt_sj_rec *r, int32_t **scratch, size_t *cap)
{
	if (avail < 8 + SJ_FIXED + 8 || get32(p) != SJ_MAGIC)
		return 0;
	size_t body = get32(p + 4);
	if (body < SJ_FIXED || body > avail - 16)
		return 0;
	const uint8_t *b = p + 8;
	if (get64(b + body) != XXH3_64bits(b, body))
		return 0;
	size_t lt = get16(b + 52), li = get16(b + 54);
	uint64_t n = get32(b + 56);
	if (lt > KVT_NAME_MAX || li > KVT_NAME_MAX || SJ_FIXED + lt + li + 4 * n != body || (b[8] != KVT_SJ_PUT && b[8] != KVT_SJ_DEL))
		return 0;
	r->seq = get64(b);
	r->kind = b[8];
	r->ns.layout_version = get32(b + 12);
	r->ns.block_tokens = get32(b + 16);
	memcpy(r->ns.model_fp, b + 20, KVT_HASH_BYTES);
	memcpy(r->tenant, b + SJ_FIXED, lt);
	r->tenant[lt] = '\0';
	memcpy(r->id, b + SJ_FIXED + lt, li);
	r->id[li] = '\0';
	if (!kvt_name_valid(r->tenant) || !kvt_name_valid(r->id))
		return 0;
	r->n_tokens = (uint32_t)n;
	memcpy(r->last_hash, b + 60, KVT_HASH_BYTES);
	r->updated = (int64_t)get64(b + 92);
	if (n > *cap) {
		int32_t *t = realloc(*scratch, n * sizeof(int32_t));
		if (!t)
			return 0;
		*scratch = t;
		*cap = n;
	}
	const uint8_t *t = b + SJ_FIXED + lt + li;
	for (uint64_t i = 0; i < n; i++)
		(*scratch)[i] = (int32_t)get32(t + 4 * i);
	r->tokens = *scratch;
	return 8 + body + 8;
}

/* Read the whole file into memory (a missing file is empty). */
static int slurp(const char *path, uint8_t **out, size_t *n_out, bool *exists)
{
	*out = NULL;
	*n_out = 0;
	*exists = false;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return KVT_OK;
		KVT_LOGE("session journal %s: cannot open: %s", path, strerror(errno));
		return KVT_EIO;
	}
	*exists = true;
	struct stat sb;
	if (fstat(fd, &sb) != 0) {
		KVT_LOGE("session journal %s: fstat: %s", path, strerror(errno));
		close(fd);
		return KVT_EIO;
	}
	uint8_t *buf = malloc(sb.st_size > 0 ? (size_t)sb.st_size : 1);
	if (!buf) {
		close(fd);
		return KVT_ENOMEM;
	}
	size_t got = 0;
	while (got < (size_t)sb.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
		if (r <= 0) {
			if (r < 0 && errno == EINTR)
				continue;
			break;
		}
		got += (size_t)r;
	}
	close(fd);
	*out = buf;
	*n_out = got;
	return KVT_OK;
}

int kvt_sj_open(const char *path, const kvt_db_journal_io *io, int (*fn)(void *ctx, const kvt_sj_rec *r), void *ctx,
		kvt_sjournal **out, kvt_sj_info *info)
{
	uint8_t *data;
	size_t n;
	bool exists;
	int rc = slurp(path, &data, &n, &exists);
	if (rc)
		return rc;
	memset(info, 0, sizeof(*info));
	info->existed = exists;
	int32_t *scratch = NULL;
	size_t cap = 0, off = 0;
	kvt_sj_rec r;
	while (off < n) {
		memset(&r, 0, sizeof(r));
		size_t used = decode(data + off, n - off, &r, &scratch, &cap);
		if (!used)
			break;
		info->n_records++;
		info->last_seq = r.seq > info->last_seq ? r.seq : info->last_seq;
		if (fn && (rc = fn(ctx, &r)) != 0)
			break;
		off += used;
	}
	free(scratch);
	free(data);
	if (rc)
		return rc;
	info->torn_bytes = n - off;
	kvt_sjournal *j = calloc(1, sizeof(*j));
	if (!j || !(j->path = strdup(path))) {
		free(j);
		return KVT_ENOMEM;
	}
	j->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (j->fd < 0) {
		KVT_LOGE("session journal %s: cannot open for writing: %s", path, strerror(errno));
		free(j->path);
		free(j);
		return KVT_EIO;
	}
	j->good_end = off;
	j->io = io;
	if (info->torn_bytes && sj_ftruncate(j, (off_t)off) != 0)
		KVT_LOGW("session journal %s: cannot cut the torn tail at %zu: %s", path, off, strerror(errno));
	*out = j;
	return KVT_OK;
}

int kvt_sj_append(kvt_sjournal *j, const kvt_sj_rec *r)
{
	size_t need = kvt_sj_record_bytes(r);
	if (j->n_buf + need > j->cap_buf) {
		size_t cap = j->cap_buf ? j->cap_buf : 65536;
		while (cap < j->n_buf + need)
			cap *= 2;
		uint8_t *b = realloc(j->buf, cap);
		if (!b)
			return KVT_ENOMEM;
		j->buf = b;
		j->cap_buf = cap;
	}
	encode(r, j->buf + j->n_buf);
	j->n_buf += need;
	return KVT_OK;
}

void kvt_sj_abort(kvt_sjournal *j)
{
	j->n_buf = 0;
}

int kvt_sj_sync(kvt_sjournal *j)
{
	if (!j->n_buf)
		return KVT_OK;
	size_t done = 0;
	int err = 0;
	while (done < j->n_buf) {
		ssize_t w = sj_pwrite(j, j->buf + done, j->n_buf - done, (off_t)(j->good_end + done));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			err = w < 0 ? errno : ENOSPC;
			break;
		}
		done += (size_t)w;
	}
	if (err) {
		/* Nothing of this batch counts: cut back to the last whole record. */
		if (sj_ftruncate(j, (off_t)j->good_end) != 0)
			KVT_LOGW("session journal %s: cannot cut back to %llu: %s", j->path,
				 (unsigned long long)j->good_end, strerror(errno));
		j->n_buf = 0;
		if (err == ENOSPC || err == EDQUOT)
			return KVT_EFULL; /* before any fsync: retried once space returns */
		KVT_LOGE("session journal %s: write: %s", j->path, strerror(err));
		return KVT_EIO;
	}
	kvt_fault_point("idx.journal.written");
	if (sj_fdatasync(j) != 0) {
		/* NOTE: never retry-and-trust a failed fdatasync (DESIGN.md §4). */
		KVT_LOGE("session journal %s: fdatasync: %s", j->path, strerror(errno));
		j->n_buf = 0;
		return KVT_EIO;
	}
	j->good_end += j->n_buf;
	j->n_buf = 0;
	return KVT_OK;
}

uint64_t kvt_sj_bytes(const kvt_sjournal *j)
{
	return j->good_end;
}

static int fsync_parent(const char *path)
{
	char *dir = strdup(path);
	if (!dir)
		return KVT_ENOMEM;
	char *slash = strrchr(dir, '/');
	if (slash)
		*(slash == dir ? slash + 1 : slash) = '\0';
	int fd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc = fd >= 0 && fsync(fd) == 0 ? KVT_OK : KVT_EIO;
	if (fd >= 0)
		close(fd);
	free(dir);
	return rc;
}

int kvt_sj_rewrite(kvt_sjournal *j, int (*each)(void *ctx, kvt_sjournal *tmp), void *ctx)
{
	char tmp_path[4200];
	snprintf(tmp_path, sizeof(tmp_path), "%s.tmp", j->path);
	kvt_sjournal t = { .path = tmp_path, .io = j->io };
	t.fd = open(tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (t.fd < 0) {
		KVT_LOGE("session journal %s: cannot create: %s", tmp_path, strerror(errno));
		return KVT_EIO;
	}
	int rc = each(ctx, &t);
	if (rc == KVT_OK)
		rc = kvt_sj_sync(&t);
	if (rc == KVT_OK)
		kvt_fault_point("idx.journal.rewrite_synced");
	if (rc == KVT_OK && sj_rename(j, tmp_path, j->path) != 0) {
		KVT_LOGE("session journal: cannot rename %s to %s: %s", tmp_path, j->path, strerror(errno));
		rc = KVT_EIO;
	}
	if (rc == KVT_OK) {
		kvt_fault_point("idx.journal.rewrite_renamed");
		rc = fsync_parent(j->path);
	}
	free(t.buf);
	if (rc != KVT_OK) {
		close(t.fd);
		unlink(tmp_path);
		return rc;
	}
	close(j->fd);
	j->fd = t.fd;
	j->good_end = t.good_end;
	j->n_buf = 0;
	return KVT_OK;
}

void kvt_sj_close(kvt_sjournal *j)
{
	if (!j)
		return;
	close(j->fd);
	free(j->buf);
	free(j->path);
	free(j);
}
