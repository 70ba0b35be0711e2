/*
 * tiers/t2_store.c — T2, the NVMe tier: the data file, its superblock, write
 * and read batches, scan, free-space accounting and statistics (the record
 * format, the allocator and the I/O engines are in t2_record.c, t2_alloc.c
 * and t2_io.c; the contract is t2_store.h).
 *
 * Invariants:
 *  - A result of KVT_OK from kvt_t2_write_batch means the record's bytes were
 *    written with O_DIRECT and a later fdatasync of the file returned 0.
 *  - A failed fdatasync is never retried and trusted: the whole batch fails,
 *    its extents are quarantined and the store refuses every later write
 *    (read_only). A batch whose own fdatasync follows another's failure is
 *    poisoned too (final barriers are ordered by sync_mu). Reads go on.
 *  - Generations only grow and are never handed out twice over the life of the
 *    file: they are reserved in chunks, the superblock's high-water is durable
 *    before any number below it is used.
 *  - A record that fails verification is never returned; its extent is
 *    quarantined (kept out of allocation) and counted.
 *  - Lack of space (no free extent, or ENOSPC from the file system) is
 *    KVT_EFULL and sets `degraded`; the next successful allocation and write
 *    clears it.
 * Locking: `mu` guards the allocator, the generation counter, the flags and
 * every counter; it is never held across data I/O (only across the rare
 * superblock update). I/O runs on a context taken from the I/O engine.
 */
#define _GNU_SOURCE /* O_DIRECT, fallocate */
#include "t2_int.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#define KVT_T2_DEFAULT_QD 32u
#define KVT_T2_DEFAULT_MAX_RAW (4u << 20)
#define KVT_T2_SCAN_WINDOW (4u << 20)

struct kvt_t2_store {
	int fd;                   /* the data file */
	char *path;               /* for log lines */
	kvt_t2_io_ops ops;        /* every member set (real syscalls where cfg gave NULL) */
	uint8_t model_fp[32];     /* expected in every record */
	uint64_t file_bytes;      /* file size = superblock + record units */
	uint32_t max_raw;         /* largest payload accepted */
	size_t slot_bytes;        /* staging slot: the largest extent */
	uint32_t sync_every;      /* writes between background fdatasyncs inside a batch (0: none) */
	uint8_t comp;             /* enum kvt_t2_comp to try (NONE: compression off) */
	bool direct;              /* O_DIRECT */
	kvt_t2_io *io;            /* I/O engine */
	uint8_t *sb;              /* [4096] superblock staging, aligned; under mu */

	pthread_mutex_t sync_mu;  /* orders the final fdatasync of concurrent write batches */
	pthread_mutex_t mu;       /* guards everything below */
	kvt_t2_alloc alloc;       /* free map */
	uint64_t next_gen;        /* next generation to hand out */
	uint64_t gen_limit;       /* durable high-water: next_gen < gen_limit to hand out */
	bool degraded, read_only;
	uint64_t n_reads, n_writes, bytes_read, bytes_written, raw_bytes_written, n_compressed;
	uint64_t n_corrupt, n_enospc;
	double read_s, write_s;
};

/* ---- the real syscalls, as the default ops ---- */
static ssize_t real_pread(void *ctx, int fd, void *buf, size_t n, off_t off) { return pread(fd, buf, n, off); }
static ssize_t real_pwrite(void *ctx, int fd, const void *buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }
static int real_fdatasync(void *ctx, int fd) { return fdatasync(fd); }
static int real_fallocate(void *ctx, int fd, off_t off, off_t len) { return fallocate(fd, 0, off, len); }

/* ---- superblock ---- */
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Write and fdatasync the superblock with high-water gen_limit. Caller holds mu (or is open). */
static int sb_write(kvt_t2_store *s, uint64_t gen_limit)
{
	uint8_t *b = s->sb;
	memset(b, 0, KVT_T2_UNIT_BYTES);
	memcpy(b, KVT_T2_SB_MAGIC, 8);
	put64(b + 8, (uint64_t)KVT_T2_FORMAT_VERSION | (uint64_t)KVT_T2_UNIT_BYTES << 32);
	put64(b + 16, s->file_bytes);
	memcpy(b + 24, s->model_fp, 32);
	put64(b + 56, gen_limit);
	put64(b + 64, XXH3_64bits(b, 64));
	int r = kvt_t2_io_pwrite_full(&s->ops, s->fd, b, KVT_T2_UNIT_BYTES, 0);
	if (r) {
		KVT_LOGE("t2 %s: superblock write failed: %s", s->path, strerror(-r));
		return KVT_EIO;
	}
	if (s->ops.fdatasync(s->ops.ctx, s->fd) != 0) {
		KVT_LOGE("t2 %s: fdatasync of the superblock failed: %s; T2 is now read-only", s->path,
			 strerror(errno));
		s->read_only = true;
		return KVT_EIO;
	}
	return KVT_OK;
}

static int sb_read(kvt_t2_store *s, uint64_t size)
{
	uint8_t *b = s->sb;
	int r = kvt_t2_io_pread_full(&s->ops, s->fd, b, KVT_T2_UNIT_BYTES, 0);
	if (r) {
		KVT_LOGE("t2 %s: superblock read failed: %s", s->path, strerror(-r));
		return KVT_EIO;
	}
	if (memcmp(b, KVT_T2_SB_MAGIC, 8) != 0) {
		KVT_LOGE("t2 %s: not a kvtier T2 file (bad superblock magic)", s->path);
		return KVT_EINVAL;
	}
	if (get64(b + 64) != XXH3_64bits(b, 64)) {
		KVT_LOGE("t2 %s: superblock checksum mismatch", s->path);
		return KVT_ECORRUPT;
	}
	uint64_t ver = get64(b + 8);
	if ((uint32_t)ver != KVT_T2_FORMAT_VERSION || (ver >> 32) != KVT_T2_UNIT_BYTES) {
		KVT_LOGE("t2 %s: unsupported format version %u (unit %u bytes)", s->path, (unsigned)(uint32_t)ver,
			 (unsigned)(ver >> 32));
		return KVT_EINVAL;
	}
	if (get64(b + 16) != size) {
		KVT_LOGE("t2 %s: superblock says %llu bytes but the file has %llu", s->path,
			 (unsigned long long)get64(b + 16), (unsigned long long)size);
		return KVT_ECORRUPT;
	}
	if (memcmp(b + 24, s->model_fp, 32) != 0) {
		KVT_LOGE("t2 %s: file was written for another model (fingerprint differs); open with reset to discard it",
			 s->path);
		return KVT_EINVAL;
	}
	s->gen_limit = get64(b + 56);
	s->next_gen = s->gen_limit; /* numbers below it may have been handed out */
	return KVT_OK;
}

/* Make the file capacity bytes: fallocate, or a sparse file if there is no space now (degraded). */
static int file_create(kvt_t2_store *s, uint64_t capacity)
{
	if (ftruncate(s->fd, 0) != 0 || ftruncate(s->fd, (off_t)capacity) != 0) {
		KVT_LOGE("t2 %s: cannot size the file to %llu bytes: %s", s->path, (unsigned long long)capacity,
			 strerror(errno));
		return errno == ENOSPC || errno == EFBIG ? KVT_EFULL : KVT_EIO;
	}
	if (s->ops.fallocate(s->ops.ctx, s->fd, 0, (off_t)capacity) != 0) {
		int e = errno;
		if (e == ENOSPC || e == EDQUOT) {
			/* keep serving: writes that find no disk space get KVT_EFULL */
			KVT_LOGW("t2 %s: fallocate of %llu bytes: %s; the tier starts degraded", s->path,
				 (unsigned long long)capacity, strerror(e));
			s->degraded = true;
		} else if (e != EOPNOTSUPP) {
			KVT_LOGE("t2 %s: fallocate of %llu bytes failed: %s", s->path, (unsigned long long)capacity,
				 strerror(e));
			return KVT_EIO;
		}
	}
	s->file_bytes = capacity;
	s->next_gen = 1;
	s->gen_limit = 1 + KVT_T2_GEN_CHUNK;
	int rc = sb_write(s, s->gen_limit);
	if (rc)
		return rc;
	/* the new directory entry too */
	char *dup = strdup(s->path);
	if (dup) {
		int dfd = open(dirname(dup), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
		free(dup);
	}
	return KVT_OK;
}

int kvt_t2_open(const kvt_t2_config *cfg, kvt_t2_store **out)
{
	kvt_t2_store *s;
	int rc;

	if (!cfg || !cfg->path || !*cfg->path) {
		KVT_LOGE("t2: no data file path");
		return KVT_EINVAL;
	}
	uint32_t qd = cfg->queue_depth ? cfg->queue_depth : KVT_T2_DEFAULT_QD;
	uint32_t max_raw = cfg->max_raw_bytes ? cfg->max_raw_bytes : KVT_T2_DEFAULT_MAX_RAW;
	uint32_t n_ctx = cfg->n_io_ctx ? cfg->n_io_ctx : 2;
	if (qd > 1024 || cfg->io_mode < KVT_T2_IO_AUTO || cfg->io_mode > KVT_T2_IO_THREADS ||
	    cfg->comp > KVT_T2_COMP_SHUF2_LZ4 || max_raw > KVT_T2_MAX_RAW_BYTES || n_ctx > 64) {
		KVT_LOGE("t2 %s: bad config (queue_depth %u of 1..1024, io_mode %d, comp %u, max_raw_bytes %u of at most %u, n_io_ctx %u of at most 64)",
			 cfg->path, qd, cfg->io_mode, cfg->comp, max_raw, KVT_T2_MAX_RAW_BYTES, n_ctx);
		return KVT_EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return KVT_ENOMEM;
	s->fd = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->sync_mu, NULL);
	s->path = strdup(cfg->path);
	s->sb = aligned_alloc(KVT_T2_UNIT_BYTES, KVT_T2_UNIT_BYTES);
	if (!s->path || !s->sb) {
		rc = KVT_ENOMEM;
		goto fail;
	}
	const kvt_t2_io_ops *o = cfg->io;
	s->ops.pread = o && o->pread ? o->pread : real_pread;
	s->ops.pwrite = o && o->pwrite ? o->pwrite : real_pwrite;
	s->ops.fdatasync = o && o->fdatasync ? o->fdatasync : real_fdatasync;
	s->ops.fallocate = o && o->fallocate ? o->fallocate : real_fallocate;
	s->ops.uring_setup = o ? o->uring_setup : NULL;
	s->ops.uring_result = o ? o->uring_result : NULL;
	s->ops.ctx = o ? o->ctx : NULL;
	memcpy(s->model_fp, cfg->model_fp, 32);
	s->max_raw = max_raw;
	s->slot_bytes = kvt_t2_round_up((uint64_t)KVT_T2_HEADER_BYTES + max_raw, KVT_T2_UNIT_BYTES);
	s->sync_every = cfg->sync_every;
	s->comp = cfg->compress ? (cfg->comp ? cfg->comp : KVT_T2_COMP_DEFAULT) : KVT_T2_COMP_NONE;

	s->fd = open(cfg->path, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0644);
	s->direct = s->fd >= 0;
	if (s->fd < 0 && errno == EINVAL && cfg->buffered_ok) {
		KVT_LOGW("t2 %s: the file system refuses O_DIRECT; using buffered I/O (fdatasync still orders writes)",
			 cfg->path);
		s->fd = open(cfg->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	}
	if (s->fd < 0) {
		KVT_LOGE("t2 %s: cannot open: %s", cfg->path, strerror(errno));
		rc = errno == EINVAL ? KVT_EUNSUPPORTED : KVT_EIO;
		goto fail;
	}
	struct stat st;
	if (fstat(s->fd, &st) != 0) {
		KVT_LOGE("t2 %s: fstat: %s", cfg->path, strerror(errno));
		rc = KVT_EIO;
		goto fail;
	}
	if (st.st_size == 0 || cfg->reset) {
		uint64_t cap = cfg->capacity_bytes / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES;
		if (cap < 2 * KVT_T2_UNIT_BYTES) {
			KVT_LOGE("t2 %s: capacity_bytes %llu is below two 4 KiB units", cfg->path,
				 (unsigned long long)cfg->capacity_bytes);
			rc = KVT_EINVAL;
			goto fail;
		}
		rc = file_create(s, cap);
		if (rc)
			goto fail;
	} else {
		if (st.st_size % KVT_T2_UNIT_BYTES || (uint64_t)st.st_size < 2 * KVT_T2_UNIT_BYTES) {
			KVT_LOGE("t2 %s: file size %lld is not a multiple of 4 KiB of at least two units", cfg->path,
				 (long long)st.st_size);
			rc = KVT_EINVAL;
			goto fail;
		}
		s->file_bytes = (uint64_t)st.st_size;
		rc = sb_read(s, s->file_bytes);
		if (rc)
			goto fail;
		if (cfg->capacity_bytes && cfg->capacity_bytes / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES != s->file_bytes)
			KVT_LOGI("t2 %s: existing file keeps its %llu bytes (config asks %llu; reset to resize)", cfg->path,
				 (unsigned long long)s->file_bytes, (unsigned long long)cfg->capacity_bytes);
	}
	rc = kvt_t2_alloc_init(&s->alloc, s->file_bytes / KVT_T2_UNIT_BYTES);
	if (rc)
		goto fail;
	kvt_t2_io_cfg icfg = { .fd = s->fd, .mode = cfg->io_mode, .queue_depth = qd, .n_ctx = n_ctx,
			       .slot_bytes = s->slot_bytes, .ops = &s->ops,
			       .staging_cap = cfg->staging_cap_bytes ? cfg->staging_cap_bytes : (32u << 20) };
	rc = kvt_t2_io_create(&icfg, &s->io);
	if (rc)
		goto fail;
	*out = s;
	return KVT_OK;
fail:
	kvt_t2_close(s);
	return rc;
}

void kvt_t2_close(kvt_t2_store *s)
{
	if (!s)
		return;
	if (s->io)
		kvt_t2_io_destroy(s->io);
	if (s->fd >= 0)
		close(s->fd);
	kvt_t2_alloc_deinit(&s->alloc);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->sync_mu);
	free(s->sb);
	free(s->path);
	free(s);
}

/* Geometry of a loc: aligned, inside the record area, not larger than a staging slot. */
static bool loc_ok(const kvt_t2_store *s, const kvt_t2_loc *loc, const char *what)
{
	if (loc->off < KVT_T2_UNIT_BYTES || loc->off % KVT_T2_UNIT_BYTES || !loc->extent_bytes ||
	    loc->extent_bytes % KVT_T2_UNIT_BYTES || loc->off > s->file_bytes ||
	    loc->extent_bytes > s->file_bytes - loc->off || loc->extent_bytes > s->slot_bytes) {
		KVT_LOGE("t2 %s: %s: extent at off %llu of %u bytes is misaligned, outside the %llu-byte file or above the %zu-byte record limit",
			 s->path, what, (unsigned long long)loc->off, loc->extent_bytes,
			 (unsigned long long)s->file_bytes, s->slot_bytes);
		return false;
	}
	return true;
}

int kvt_t2_mark_used(kvt_t2_store *s, const kvt_t2_loc *loc)
{
	if (!loc_ok(s, loc, "mark_used"))
		return KVT_EINVAL;
	pthread_mutex_lock(&s->mu);
	bool ok = kvt_t2_alloc_mark(&s->alloc, loc->off / KVT_T2_UNIT_BYTES, loc->extent_bytes / KVT_T2_UNIT_BYTES);
	if (ok && loc->generation >= s->next_gen)
		s->next_gen = loc->generation + 1;
	pthread_mutex_unlock(&s->mu);
	if (!ok) {
		KVT_LOGE("t2 %s: mark_used: extent at off %llu (%u bytes) overlaps an extent already in use",
			 s->path, (unsigned long long)loc->off, loc->extent_bytes);
		return KVT_EINVAL;
	}
	return KVT_OK;
}

void kvt_t2_free(kvt_t2_store *s, const kvt_t2_loc *loc)
{
	if (!loc_ok(s, loc, "free"))
		return;
	uint64_t u = loc->off / KVT_T2_UNIT_BYTES, k = loc->extent_bytes / KVT_T2_UNIT_BYTES;
	pthread_mutex_lock(&s->mu);
	bool used = kvt_t2_alloc_is_used(&s->alloc, u, k);
	if (used)
		kvt_t2_alloc_put(&s->alloc, u, k);
	pthread_mutex_unlock(&s->mu);
	if (!used)
		KVT_LOGE("t2 %s: free of extent at off %llu (%u bytes) that is not in use; ignored", s->path,
			 (unsigned long long)loc->off, loc->extent_bytes);
}

void kvt_t2_release_quarantine(kvt_t2_store *s)
{
	pthread_mutex_lock(&s->mu);
	kvt_t2_alloc_release_quarantine(&s->alloc);
	pthread_mutex_unlock(&s->mu);
}

/* ---- writes ---- */

typedef struct wbatch {
	kvt_t2_store *s;
	kvt_t2_ioctx *c;
	const kvt_t2_write_req *reqs;
	kvt_t2_loc *locs;
	int *results;
	uint64_t n_full;   /* records refused for lack of space */
} wbatch;

static bool wprep(void *ctx, uint32_t i, uint8_t *buf, size_t slot_bytes, kvt_t2_job *job)
{
	wbatch *b = ctx;
	kvt_t2_store *s = b->s;
	const kvt_t2_write_req *r = &b->reqs[i];
	kvt_t2_sized sz;
	uint64_t unit = 0, gen = 0;
	int rc;

	if (b->results[i] != KVT_OK)
		return false; /* refused in validation */
	kvt_t2_record_pack(r->meta, r->payload, s->comp, kvt_t2_ioctx_scratch(b->c), buf, slot_bytes, &sz);
	pthread_mutex_lock(&s->mu);
	if (s->read_only) {
		rc = KVT_EIO;
	} else {
		rc = kvt_t2_alloc_get(&s->alloc, sz.extent_bytes / KVT_T2_UNIT_BYTES, &unit);
		if (rc == KVT_EFULL) {
			s->n_enospc++;
			s->degraded = true;
		} else if (s->next_gen >= s->gen_limit) {
			rc = sb_write(s, s->next_gen + KVT_T2_GEN_CHUNK);
			if (rc == KVT_OK)
				s->gen_limit = s->next_gen + KVT_T2_GEN_CHUNK;
			else
				kvt_t2_alloc_put(&s->alloc, unit, sz.extent_bytes / KVT_T2_UNIT_BYTES);
		}
		if (rc == KVT_OK)
			gen = s->next_gen++;
	}
	pthread_mutex_unlock(&s->mu);
	if (rc) {
		b->results[i] = rc;
		b->n_full += rc == KVT_EFULL;
		return false;
	}
	kvt_t2_record_seal(r->meta, s->model_fp, &sz, unit * KVT_T2_UNIT_BYTES, gen, buf, &b->locs[i]);
	job->is_write = true;
	job->n = sz.extent_bytes;
	job->off = unit * KVT_T2_UNIT_BYTES;
	return true;
}

static void wdone(void *ctx, kvt_t2_job *job)
{
	wbatch *b = ctx;
	kvt_t2_store *s = b->s;
	uint32_t i = job->idx;
	if (job->res == 0)
		return; /* durable once the batch's fdatasync returns */
	const kvt_t2_loc *loc = &b->locs[i];
	pthread_mutex_lock(&s->mu);
	kvt_t2_alloc_put(&s->alloc, loc->off / KVT_T2_UNIT_BYTES, loc->extent_bytes / KVT_T2_UNIT_BYTES);
	if (job->res == -ENOSPC || job->res == -EDQUOT) {
		s->n_enospc++;
		s->degraded = true;
	}
	pthread_mutex_unlock(&s->mu);
	if (job->res == -ENOSPC || job->res == -EDQUOT) {
		b->results[i] = KVT_EFULL;
		b->n_full++;
	} else {
		KVT_LOGE("t2 %s: write of record at off %llu (%u bytes) failed: %s", s->path,
			 (unsigned long long)loc->off, loc->extent_bytes, strerror(-job->res));
		b->results[i] = KVT_EIO;
	}
}

int kvt_t2_write_batch(kvt_t2_store *s, uint32_t n, const kvt_t2_write_req *reqs, kvt_t2_loc *locs, int *results)
{
	double t0 = kvt_now_s();
	uint32_t n_ok = 0;

	for (uint32_t i = 0; i < n; i++) {
		const kvt_t2_block_meta *m = reqs[i].meta;
		results[i] = KVT_OK;
		if (!m || !reqs[i].payload || m->raw_bytes == 0 || m->raw_bytes > s->max_raw ||
		    m->n_tokens > KVT_T2_MAX_TOKENS) {
			KVT_LOGE("t2 %s: write %u: bad block (meta %s, payload %s, raw_bytes %u of 1..%u, n_tokens %u of at most %u)",
				 s->path, i, m ? "set" : "NULL", reqs[i].payload ? "set" : "NULL", m ? m->raw_bytes : 0,
				 s->max_raw, m ? m->n_tokens : 0, KVT_T2_MAX_TOKENS);
			results[i] = KVT_EINVAL;
		}
	}
	pthread_mutex_lock(&s->mu);
	bool ro = s->read_only;
	pthread_mutex_unlock(&s->mu);
	if (ro) {
		for (uint32_t i = 0; i < n; i++)
			results[i] = KVT_EIO;
		return n ? KVT_EIO : KVT_OK;
	}

	wbatch b = { .s = s, .reqs = reqs, .locs = locs, .results = results };
	b.c = kvt_t2_io_acquire(s->io);
	kvt_t2_batch_cb cb = { wprep, wdone, &b, s->sync_every };
	int sync_err = kvt_t2_io_run(s->io, b.c, n, &cb);
	kvt_t2_io_release(s->io, b.c);

	for (uint32_t i = 0; i < n; i++)
		n_ok += results[i] == KVT_OK;
	/* The final barrier. sync_mu orders it with every other batch's: a
	 * failure is recorded (read_only) before any later fdatasync's result is
	 * trusted. NOTE: Linux reports a writeback error to one fdatasync caller
	 * only, so a 0 that follows another batch's failure may hide the loss of
	 * our own writes: such a batch is poisoned too. */
	bool sync_failed = false;
	pthread_mutex_lock(&s->sync_mu);
	if (sync_err && n_ok) {
		KVT_LOGE("t2 %s: intermediate fdatasync failed: %s; batch of %u records poisoned, T2 is now read-only",
			 s->path, strerror(-sync_err), n_ok);
		sync_failed = true;
	} else if (n_ok && s->ops.fdatasync(s->ops.ctx, s->fd) != 0) {
		KVT_LOGE("t2 %s: fdatasync failed: %s; batch of %u records poisoned, T2 is now read-only", s->path,
			 strerror(errno), n_ok);
		sync_failed = true;
	}
	pthread_mutex_lock(&s->mu);
	if (!sync_failed && n_ok && s->read_only) {
		KVT_LOGE("t2 %s: another fdatasync failed while this batch ran; batch of %u records poisoned", s->path,
			 n_ok);
		sync_failed = true;
	}
	if (sync_failed)
		s->read_only = true;
	pthread_mutex_unlock(&s->sync_mu);
	if (sync_failed) {
		s->read_only = true;
		for (uint32_t i = 0; i < n; i++) {
			if (results[i] != KVT_OK)
				continue;
			uint64_t u = locs[i].off / KVT_T2_UNIT_BYTES, k = locs[i].extent_bytes / KVT_T2_UNIT_BYTES;
			kvt_t2_alloc_quarantine(&s->alloc, u, k); /* bytes of unknown state */
			kvt_t2_alloc_put(&s->alloc, u, k);       /* no row will point at it */
			results[i] = KVT_EIO;
		}
	} else {
		for (uint32_t i = 0; i < n; i++) {
			if (results[i] != KVT_OK)
				continue;
			s->n_writes++;
			s->bytes_written += locs[i].extent_bytes;
			s->raw_bytes_written += reqs[i].meta->raw_bytes;
			s->n_compressed += locs[i].compressed != KVT_T2_COMP_NONE;
		}
		if (n_ok && !b.n_full)
			s->degraded = false;
	}
	s->write_s += kvt_now_s() - t0;
	pthread_mutex_unlock(&s->mu);

	for (uint32_t i = 0; i < n; i++)
		if (results[i] != KVT_OK)
			return results[i];
	return KVT_OK;
}

/* ---- reads ---- */

typedef struct rbatch {
	kvt_t2_store *s;
	kvt_t2_ioctx *c;
	const kvt_t2_loc *locs;
	const uint8_t (*expect)[32];
	kvt_t2_block_meta *metas;
	void *const *payloads;
	size_t cap;
	int *results;
	uint64_t n_corrupt, bytes;
} rbatch;

static bool rprep(void *ctx, uint32_t i, uint8_t *buf, size_t slot_bytes, kvt_t2_job *job)
{
	rbatch *b = ctx;
	if (b->results[i] != KVT_OK)
		return false;
	job->is_write = false;
	job->n = b->locs[i].extent_bytes;
	job->off = b->locs[i].off;
	return true;
}

static void rdone(void *ctx, kvt_t2_job *job)
{
	rbatch *b = ctx;
	kvt_t2_store *s = b->s;
	uint32_t i = job->idx;
	const kvt_t2_loc *loc = &b->locs[i];
	const char *why = "";

	if (job->res) {
		KVT_LOGE("t2 %s: read of record at off %llu (%u bytes) failed: %s", s->path,
			 (unsigned long long)loc->off, loc->extent_bytes, strerror(-job->res));
		b->results[i] = KVT_EIO;
		return;
	}
	b->bytes += job->n;
	int rc = kvt_t2_record_verify(job->buf, job->n, loc->off, loc, s->model_fp, b->expect ? b->expect[i] : NULL,
				      b->metas ? &b->metas[i] : NULL, b->payloads[i], b->cap,
				      kvt_t2_ioctx_scratch(b->c), NULL, &why);
	b->results[i] = rc;
	if (rc == KVT_ECORRUPT) {
		KVT_LOGE("t2 %s: record at off %llu (generation %llu): %s; quarantined", s->path,
			 (unsigned long long)loc->off, (unsigned long long)loc->generation, why);
		b->n_corrupt++;
		pthread_mutex_lock(&s->mu);
		kvt_t2_alloc_quarantine(&s->alloc, loc->off / KVT_T2_UNIT_BYTES, loc->extent_bytes / KVT_T2_UNIT_BYTES);
		pthread_mutex_unlock(&s->mu);
	} else if (rc) {
		KVT_LOGE("t2 %s: record at off %llu: %s (%zu bytes given)", s->path, (unsigned long long)loc->off, why,
			 b->cap);
	}
}

int kvt_t2_read_batch(kvt_t2_store *s, uint32_t n, const kvt_t2_loc *locs, const uint8_t (*expect_hash)[32],
		      kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results)
{
	double t0 = kvt_now_s();
	for (uint32_t i = 0; i < n; i++)
		results[i] = loc_ok(s, &locs[i], "read") && payloads[i] ? KVT_OK : KVT_EINVAL;

	rbatch b = { .s = s, .locs = locs, .expect = expect_hash, .metas = metas, .payloads = payloads,
		     .cap = payload_cap, .results = results };
	b.c = kvt_t2_io_acquire(s->io);
	kvt_t2_batch_cb cb = { rprep, rdone, &b, 0 };
	kvt_t2_io_run(s->io, b.c, n, &cb);
	kvt_t2_io_release(s->io, b.c);

	pthread_mutex_lock(&s->mu);
	for (uint32_t i = 0; i < n; i++)
		s->n_reads += results[i] != KVT_EINVAL;
	s->n_corrupt += b.n_corrupt;
	s->bytes_read += b.bytes;
	s->read_s += kvt_now_s() - t0;
	pthread_mutex_unlock(&s->mu);
	for (uint32_t i = 0; i < n; i++)
		if (results[i] != KVT_OK)
			return results[i];
	return KVT_OK;
}

int kvt_t2_read(kvt_t2_store *s, const kvt_t2_loc *loc, const uint8_t expect_hash[32], kvt_t2_block_meta *meta_out,
		void *payload_out, size_t payload_cap)
{
	int result;
	void *const payloads[1] = { payload_out };
	const uint8_t(*eh)[32] = (const uint8_t(*)[32])expect_hash;
	kvt_t2_block_meta meta;
	int rc = kvt_t2_read_batch(s, 1, loc, eh, meta_out ? &meta : NULL, payloads, payload_cap, &result);
	if (rc == KVT_OK && meta_out)
		*meta_out = meta;
	return rc;
}

/* ---- scan ---- */

int kvt_t2_scan(kvt_t2_store *s, int (*fn)(void *ctx, const kvt_t2_block_meta *meta, const kvt_t2_loc *loc), void *ctx)
{
	size_t win_cap = KVT_T2_SCAN_WINDOW;
	uint8_t *win = aligned_alloc(KVT_T2_UNIT_BYTES, win_cap);
	uint8_t *rec = NULL;
	size_t rec_cap = 0;
	kvt_t2_block_meta *meta = malloc(sizeof(*meta));
	uint64_t win_off = 0, win_n = 0, max_gen = 0;
	int bad = 0, rc = KVT_OK;

	if (!win || !meta) {
		rc = KVT_ENOMEM;
		goto out;
	}
	for (uint64_t off = KVT_T2_UNIT_BYTES; off < s->file_bytes;) {
		if (off < win_off || off + KVT_T2_UNIT_BYTES > win_off + win_n) {
			win_off = off;
			win_n = s->file_bytes - off < win_cap ? s->file_bytes - off : win_cap;
			int r = kvt_t2_io_pread_full(&s->ops, s->fd, win, win_n, win_off);
			if (r) {
				KVT_LOGE("t2 %s: scan: read at off %llu failed: %s", s->path, (unsigned long long)win_off,
					 strerror(-r));
				rc = KVT_EIO;
				goto out;
			}
		}
		const uint8_t *h = win + (off - win_off);
		if (memcmp(h, KVT_T2_REC_MAGIC, 8) != 0) {
			off += KVT_T2_UNIT_BYTES;
			continue;
		}
		uint32_t ext;
		const char *why = "bad header";
		kvt_t2_loc loc;
		int vr = KVT_ECORRUPT;
		if (kvt_t2_record_peek(h, off, s->file_bytes, &ext)) {
			const uint8_t *r = h;
			if (off + ext > win_off + win_n) {
				if (ext > rec_cap) {
					free(rec);
					rec_cap = ext;
					rec = aligned_alloc(KVT_T2_UNIT_BYTES, rec_cap);
					if (!rec) {
						rc = KVT_ENOMEM;
						goto out;
					}
				}
				int e = kvt_t2_io_pread_full(&s->ops, s->fd, rec, ext, off);
				if (e) {
					KVT_LOGE("t2 %s: scan: read at off %llu failed: %s", s->path,
						 (unsigned long long)off, strerror(-e));
					rc = KVT_EIO;
					goto out;
				}
				r = rec;
			}
			vr = kvt_t2_record_verify(r, ext, off, NULL, s->model_fp, NULL, meta, NULL, 0, NULL, &loc, &why);
		}
		if (vr != KVT_OK) {
			KVT_LOGW("t2 %s: scan: record at off %llu: %s", s->path, (unsigned long long)off, why);
			bad++;
			off += KVT_T2_UNIT_BYTES;
			continue;
		}
		if (loc.generation > max_gen)
			max_gen = loc.generation;
		int fr = fn(ctx, meta, &loc);
		if (fr < 0) {
			rc = fr;
			goto out;
		}
		off += ext;
	}
out:
	if (max_gen) {
		pthread_mutex_lock(&s->mu);
		if (max_gen >= s->next_gen)
			s->next_gen = max_gen + 1;
		pthread_mutex_unlock(&s->mu);
	}
	free(win);
	free(rec);
	free(meta);
	return rc ? rc : bad;
}

void kvt_t2_get_stats(kvt_t2_store *s, kvt_t2_stats *st)
{
	pthread_mutex_lock(&s->mu);
	memset(st, 0, sizeof(*st));
	st->capacity_bytes = s->file_bytes - KVT_T2_UNIT_BYTES;
	st->used_bytes = (s->alloc.n_used - 1) * KVT_T2_UNIT_BYTES;
	st->n_records = s->alloc.n_extents;
	st->n_reads = s->n_reads;
	st->n_writes = s->n_writes;
	st->bytes_read = s->bytes_read;
	st->bytes_written = s->bytes_written;
	st->raw_bytes_written = s->raw_bytes_written;
	st->n_compressed = s->n_compressed;
	st->n_corrupt = s->n_corrupt;
	st->n_quarantined = s->alloc.n_quar_ext;
	st->n_enospc = s->n_enospc;
	st->read_s = s->read_s;
	st->write_s = s->write_s;
	st->degraded = s->degraded;
	st->read_only = s->read_only;
	st->using_uring = kvt_t2_io_uring(s->io);
	st->direct_io = s->direct;
	pthread_mutex_unlock(&s->mu);
}
