/*
 * tiers/t2_store.c — T2, the NVMe tier: the data file (open, check, repair,
 * salvage), write and read batches, scan, free-space accounting and
 * statistics (the superblock's format and I/O, the record format, the
 * allocator and the I/O engines are in t2_super.c, t2_record.c, t2_alloc.c
 * and t2_io.c; the contract is t2_store.h; the store's state, struct
 * kvt_t2_store, is in t2_int.h).
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
 *  - One store per file: an flock on a second open file description (never
 *    given to io_uring, so a kill -9 releases it at once) and, for a block
 *    device, an O_EXCL claim, both held from open to close.
 *  - The superblock has no single point of failure: every copy carries its
 *    own checksums and a sequence, the newest valid copy wins, and a write
 *    goes to one copy, then the next, each fdatasynced before the next
 *    starts. Nothing at open is ever overwritten that could hold a record:
 *    a damaged copy is rewritten from a valid one, a truncated file is
 *    extended (its cut reported through intact_bytes), and a file with no
 *    valid copy is refused unless cfg.salvage writes new ones from the
 *    records.
 * Locking: `mu` guards the allocator, the generation counter, the flags and
 * every counter; it is never held across data I/O (only across the rare
 * superblock update). I/O runs on a context taken from the I/O engine.
 */
#define _GNU_SOURCE /* O_DIRECT, fallocate */
#include "t2_int.h"
#include "fault.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVT_T2_DEFAULT_QD 32u
#define KVT_T2_DEFAULT_MAX_RAW (4u << 20)
#define KVT_T2_SCAN_WINDOW (4u << 20)

/* Whether n bytes at p are all zero (a blank superblock, an unset owner or model). */
static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

/* Size the file to capacity and preallocate [from, capacity): a sparse tail if there is no space now (degraded). */
static int file_size_to(kvt_t2_store *s, uint64_t from, uint64_t capacity)
{
	if (!s->blockdev && ftruncate(s->fd, (off_t)capacity) != 0) {
		KVT_LOGE("t2 %s: cannot size the file to %llu bytes: %s", s->path, (unsigned long long)capacity,
			 strerror(errno));
		return errno == ENOSPC || errno == EFBIG ? KVT_EFULL : KVT_EIO;
	}
	if (!s->blockdev && capacity > from && s->ops.fallocate(s->ops.ctx, s->fd, (off_t)from, (off_t)(capacity - from)) != 0) {
		int e = errno;
		if (e == ENOSPC || e == EDQUOT) {
			/* keep serving: writes that find no disk space get KVT_EFULL */
			KVT_LOGW("t2 %s: fallocate of %llu bytes: %s; the tier starts degraded", s->path,
				 (unsigned long long)(capacity - from), strerror(e));
			s->degraded = true;
		} else if (e != EOPNOTSUPP) {
			KVT_LOGE("t2 %s: fallocate of %llu bytes failed: %s", s->path, (unsigned long long)(capacity - from),
				 strerror(e));
			return KVT_EIO;
		}
	}
	s->file_bytes = capacity;
	return KVT_OK;
}

/* fsync the directory holding the file (a new directory entry, a new size). */
static void sync_dir(const kvt_t2_store *s)
{
	char *dup = strdup(s->path);
	if (dup) {
		int dfd = open(dirname(dup), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
		free(dup);
	}
}

/* Make a new, empty store of capacity bytes: size, preallocate, superblock copies. */
static int file_create(kvt_t2_store *s, uint64_t capacity)
{
	if (!s->blockdev && ftruncate(s->fd, 0) != 0) {
		KVT_LOGE("t2 %s: cannot empty the file: %s", s->path, strerror(errno));
		return KVT_EIO;
	}
	int rc = file_size_to(s, 0, capacity);
	if (rc)
		return rc;
	s->n_sb = KVT_T2_SB_COPIES;
	s->next_gen = 1;
	s->gen_limit = 1 + KVT_T2_GEN_CHUNK;
	if ((rc = kvt_t2_sb_write(s, s->gen_limit)))
		return rc;
	sync_dir(s);
	return KVT_OK;
}

static int noop_scan(void *ctx, const kvt_t2_block_meta *meta, const kvt_t2_loc *loc)
{
	(void)ctx, (void)meta, (void)loc;
	return 0;
}

/* The model fingerprint of the first record that verifies against its own header (salvage). */
static bool learn_model(kvt_t2_store *s, uint8_t fp[32])
{
	uint8_t *buf = aligned_alloc(KVT_T2_UNIT_BYTES, s->slot_bytes);
	bool found = false;
	if (!buf)
		return false;
	for (uint64_t off = (uint64_t)s->n_sb * KVT_T2_UNIT_BYTES; off + KVT_T2_UNIT_BYTES <= s->file_bytes && !found;
	     off += KVT_T2_UNIT_BYTES) {
		uint32_t ext;
		if (kvt_t2_io_pread_full(&s->ops, s->fd, buf, KVT_T2_UNIT_BYTES, off) != 0)
			break;
		if (memcmp(buf, KVT_T2_REC_MAGIC, 8) != 0 || !kvt_t2_record_peek(buf, off, s->file_bytes, &ext) ||
		    ext > s->slot_bytes || kvt_t2_io_pread_full(&s->ops, s->fd, buf, ext, off) != 0)
			continue;
		const char *why;
		uint8_t own[32];
		memcpy(own, buf + KVT_T2_REC_MODEL_OFF, 32);
		if (kvt_t2_record_verify(buf, ext, off, NULL, own, NULL, NULL, NULL, 0, NULL, NULL, &why) == KVT_OK) {
			memcpy(fp, own, 32);
			found = true;
		}
	}
	free(buf);
	return found;
}

/*
 * No superblock copy verifies (cfg.salvage): write new ones from what the
 * records say. Layout: unit 1 holding a record means format 1 (one copy);
 * else two copies. Generations: past every record's (a full scan).
 */
static int salvage(kvt_t2_store *s, const kvt_t2_config *cfg, uint64_t size, const char *const why[KVT_T2_SB_COPIES])
{
	uint8_t *u1 = s->sb + KVT_T2_UNIT_BYTES;
	s->n_sb = size >= 2 * KVT_T2_UNIT_BYTES && memcmp(u1, KVT_T2_REC_MAGIC, 8) == 0 ? 1 : KVT_T2_SB_COPIES;
	uint64_t cap = size / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES;
	uint64_t want = cfg->capacity_bytes / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES;
	if (want > cap)
		cap = want;
	if (cap <= (uint64_t)s->n_sb * KVT_T2_UNIT_BYTES) {
		KVT_LOGE("t2 %s: no valid superblock and only %llu bytes: nothing to salvage", s->path,
			 (unsigned long long)size);
		return KVT_ECORRUPT;
	}
	s->file_bytes = size / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES;
	if (all_zero(s->model_fp, 32) && !learn_model(s, s->model_fp)) {
		KVT_LOGE("t2 %s: no valid superblock and no record to learn the model from; pass the model (--model)",
			 s->path);
		return KVT_ECORRUPT;
	}
	int n_bad = kvt_t2_scan(s, noop_scan, NULL); /* raises next_gen past every record */
	if (n_bad < 0)
		return n_bad;
	int rc = file_size_to(s, s->file_bytes, cap);
	if (rc)
		return rc;
	if (s->next_gen < 1)
		s->next_gen = 1;
	s->gen_limit = s->next_gen + KVT_T2_GEN_CHUNK;
	if ((rc = kvt_t2_sb_write(s, s->gen_limit)))
		return rc;
	s->intact_bytes = size / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES; /* what it held; any tail added is new */
	KVT_LOGW("t2 %s: no valid superblock (copy 0: %s; copy 1: %s); wrote %u new copies from the records "
		 "(%llu-byte file, generations from %llu)",
		 s->path, why[0] ? why[0] : "-", why[1] ? why[1] : "-", s->n_sb, (unsigned long long)cap,
		 (unsigned long long)s->next_gen);
	return KVT_OK;
}

/*
 * What a file without a superblock magic holds: KVT_ECORRUPT when a record
 * magic starts a unit of the first 16 MiB (records are allocated from the
 * start: a store whose superblocks alone were lost, to salvage), else
 * KVT_ENOTFOUND when both superblock units are zeros (blank, as a new block
 * device: a store is made in it), else KVT_EINVAL (not a T2 file: left alone).
 */
static int sniff(kvt_t2_store *s, uint64_t size)
{
	const uint64_t window = 16u << 20;
	uint64_t n = size < window ? size / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES : window;
	uint8_t *buf = aligned_alloc(KVT_T2_UNIT_BYTES, 1u << 20);
	if (!buf)
		return KVT_ENOMEM;
	bool records = false;
	for (uint64_t off = 0; !records && off < n; off += 1u << 20) {
		size_t len = n - off < (1u << 20) ? (size_t)(n - off) : (1u << 20);
		if (kvt_t2_io_pread_full(&s->ops, s->fd, buf, len, off) != 0) {
			free(buf);
			return KVT_EIO;
		}
		for (size_t u = 0; u < len; u += KVT_T2_UNIT_BYTES)
			records = records || memcmp(buf + u, KVT_T2_REC_MAGIC, 8) == 0;
	}
	free(buf);
	if (records)
		return KVT_ECORRUPT;
	return all_zero(s->sb, (size_t)KVT_T2_SB_COPIES * KVT_T2_UNIT_BYTES) ? KVT_ENOTFOUND : KVT_EINVAL;
}

/*
 * A T2 file (or records) whose superblock copies all fail to verify: a file
 * cut inside its superblock is made anew (KVT_ENOTFOUND), cfg.salvage writes
 * new copies from the records, anything else is refused (logged).
 */
static int sb_invalid(kvt_t2_store *s, const kvt_t2_config *cfg, uint64_t size, const char *const why[KVT_T2_SB_COPIES])
{
	bool repair = !cfg->no_repair;
	char head[8];
	size_t n_head = size < 8 ? (size_t)size : 8;
	bool t2_head = pread(s->lock_fd, head, n_head, 0) == (ssize_t)n_head && memcmp(head, KVT_T2_SB_MAGIC, n_head) == 0;
	if (size < KVT_T2_UNIT_BYTES && repair && t2_head) {
		/* a T2 file cut inside its superblock: not one record can have survived */
		KVT_LOGE("t2 %s: truncated to %llu bytes: no superblock and no record survive; a new, empty "
			 "store is made in it",
			 s->path, (unsigned long long)size);
		return KVT_ENOTFOUND; /* the caller creates */
	}
	if (cfg->salvage && repair) {
		memcpy(s->owner, cfg->owner_id, KVT_T2_OWNER_BYTES);
		return salvage(s, cfg, size, why);
	}
	if (size < KVT_T2_UNIT_BYTES && !t2_head) {
		KVT_LOGE("t2 %s: not a kvtier T2 file (%llu bytes that are no superblock)", s->path,
			 (unsigned long long)size);
		return KVT_EINVAL;
	}
	KVT_LOGE("t2 %s: no valid superblock (copy 0: %s; copy 1: %s); the records carry their own headers: "
		 "run `kvtier fsck --data-dir DIR` (or `kvtier rebuild-index`) on this data directory to write a "
		 "new one",
		 s->path, why[0] ? why[0] : "-", why[1] ? why[1] : "-");
	return KVT_ECORRUPT;
}

/*
 * No superblock copy loaded (rc from kvt_t2_sb_load): say why and decide.
 * KVT_ENOTFOUND when the file is blank or a T2 file cut inside its
 * superblock (the caller makes a new store in it); KVT_OK after a salvage
 * (cfg.salvage); else the error, logged.
 */
static int sb_missing(kvt_t2_store *s, const kvt_t2_config *cfg, uint64_t size, int rc,
		      const char *const why[KVT_T2_SB_COPIES])
{
	if (rc == KVT_EIO) {
		KVT_LOGE("t2 %s: superblock read failed", s->path);
		return KVT_EIO;
	}
	if (rc == KVT_EUNSUPPORTED) {
		KVT_LOGE("t2 %s: superblock of an unsupported format (%s); this kvtier reads formats 1 and %u", s->path,
			 why[0] ? why[0] : why[1], KVT_T2_SB_VERSION);
		return KVT_EUNSUPPORTED;
	}
	if (rc == KVT_EINVAL) {
		rc = sniff(s, size);
		if (rc == KVT_ENOTFOUND && !cfg->no_repair)
			KVT_LOGI("t2 %s: blank (zeros where the superblock and the first records go): a new store is "
				 "made in it", s->path);
		if (rc == KVT_ENOTFOUND || rc == KVT_EIO || rc == KVT_ENOMEM)
			return rc; /* KVT_ENOTFOUND: the caller creates */
	}
	if (rc == KVT_EINVAL) {
		KVT_LOGE("t2 %s: not a kvtier T2 file (bad superblock magic)", s->path);
		return KVT_EINVAL;
	}
	return sb_invalid(s, cfg, size, why);
}

/* The superblock names this store's model and, when both record one, its owning index. */
static int sb_check_identity(const kvt_t2_store *s, const kvt_t2_config *cfg, const kvt_t2_info *in)
{
	if (memcmp(in->model_fp, s->model_fp, 32) != 0) {
		KVT_LOGE("t2 %s: file was written for another model (fingerprint differs); open with reset to discard it",
			 s->path);
		return KVT_EINVAL;
	}
	if (!all_zero(cfg->owner_id, KVT_T2_OWNER_BYTES) && !all_zero(in->owner_id, KVT_T2_OWNER_BYTES) &&
	    memcmp(cfg->owner_id, in->owner_id, KVT_T2_OWNER_BYTES) != 0) {
		char a[2 * KVT_T2_OWNER_BYTES + 1], b[2 * KVT_T2_OWNER_BYTES + 1];
		for (int i = 0; i < KVT_T2_OWNER_BYTES; i++) {
			snprintf(a + 2 * i, 3, "%02x", in->owner_id[i]);
			snprintf(b + 2 * i, 3, "%02x", cfg->owner_id[i]);
		}
		KVT_LOGE("t2 %s: belongs to another index (its owner id is %s, this index's is %s): another data "
			 "directory's daemon keeps its blocks here. Give each daemon its own [tier.nvme] path; if this "
			 "file's own index was lost, run `kvtier rebuild-index` on this data directory to index its "
			 "records",
			 s->path, a, b);
		return KVT_EINVAL;
	}
	return KVT_OK;
}

/*
 * The file's size against the superblock's: sets intact_bytes (a truncated
 * file keeps the bytes before the cut); a file longer than its superblock
 * says (not a block device) is KVT_ECORRUPT.
 */
static int sb_check_size(kvt_t2_store *s, const kvt_t2_info *in, uint64_t size, bool repair)
{
	if (in->capacity_bytes > size) {
		uint64_t cut = size / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES;
		KVT_LOGE("t2 %s: truncated: the file has %llu bytes but its superblock says %llu; every record past "
			 "byte %llu is lost%s",
			 s->path, (unsigned long long)size, (unsigned long long)in->capacity_bytes,
			 (unsigned long long)cut, repair ? " (the file is extended back to its size)" : "");
		s->intact_bytes = cut;
	} else if (in->capacity_bytes < size && !s->blockdev) {
		KVT_LOGE("t2 %s: superblock says %llu bytes but the file has %llu", s->path,
			 (unsigned long long)in->capacity_bytes, (unsigned long long)size);
		return KVT_ECORRUPT;
	} else {
		s->intact_bytes = in->capacity_bytes;
	}
	return KVT_OK;
}

/* Take the superblock's layout, owner and generation high-water as the store's. */
static void sb_adopt(kvt_t2_store *s, const kvt_t2_info *in)
{
	memcpy(s->owner, in->owner_id, KVT_T2_OWNER_BYTES);
	s->n_sb = in->n_copies;
	s->sb_seq = in->seq;
	s->gen_limit = in->gen_limit;
	s->next_gen = in->gen_limit; /* numbers below it may have been handed out */
	s->file_bytes = in->capacity_bytes;
}

/*
 * Repair what the superblock check found: extend a truncated file back to
 * its size, rewrite a damaged copy, upgrade format 1, record the owner when
 * none is; then write the copies once if any of them asked for it.
 */
static int sb_repair(kvt_t2_store *s, const kvt_t2_config *cfg, const kvt_t2_info *in,
		     const char *const why[KVT_T2_SB_COPIES])
{
	bool rewrite = false;
	int rc;
	if (s->intact_bytes < in->capacity_bytes) {
		uint64_t from = s->intact_bytes;
		s->file_bytes = from;
		if ((rc = file_size_to(s, from, in->capacity_bytes)))
			return rc;
		rewrite = true;
	}
	if (in->n_valid < in->n_copies) {
		KVT_LOGW("t2 %s: superblock copy %s is damaged (%s); rewriting it from copy %s", s->path,
			 why[0] ? "0" : "1", why[0] ? why[0] : why[1], why[0] ? "1" : "0");
		rewrite = true;
	}
	if (in->version == 1) {
		KVT_LOGI("t2 %s: superblock format 1 upgraded to %u (one copy: the file's records start at unit 1)",
			 s->path, KVT_T2_SB_VERSION);
		rewrite = true;
	}
	if (all_zero(s->owner, KVT_T2_OWNER_BYTES) && !all_zero(cfg->owner_id, KVT_T2_OWNER_BYTES)) {
		memcpy(s->owner, cfg->owner_id, KVT_T2_OWNER_BYTES);
		rewrite = true;
	}
	if (rewrite && (rc = kvt_t2_sb_write(s, s->gen_limit)))
		return rc;
	return KVT_OK;
}

/*
 * Open an existing, non-empty file: pick the newest valid superblock copy,
 * check it against cfg, repair what can be repaired (a damaged copy, format
 * 1, a missing owner, a truncated tail) unless cfg.no_repair.
 */
static int open_existing(kvt_t2_store *s, const kvt_t2_config *cfg, uint64_t size)
{
	kvt_t2_info in;
	const char *why[KVT_T2_SB_COPIES];
	bool repair = !cfg->no_repair;
	int rc = kvt_t2_sb_load(&s->ops, s->fd, s->sb, size, &in, why);
	if (rc)
		return sb_missing(s, cfg, size, rc, why);
	if ((rc = sb_check_identity(s, cfg, &in)) || (rc = sb_check_size(s, &in, size, repair)))
		return rc;
	sb_adopt(s, &in);
	if (!repair) {
		if (s->intact_bytes < s->file_bytes)
			s->file_bytes = s->intact_bytes > (uint64_t)s->n_sb * KVT_T2_UNIT_BYTES
						? s->intact_bytes
						: (uint64_t)(s->n_sb + 1) * KVT_T2_UNIT_BYTES;
		return KVT_OK;
	}
	return sb_repair(s, cfg, &in, why);
}

/* Check cfg's numbers; *qd, *max_raw, *n_ctx get them with the defaults filled in. */
static int open_check_config(const kvt_t2_config *cfg, uint32_t *qd, uint32_t *max_raw, uint32_t *n_ctx)
{
	if (!cfg || !cfg->path || !*cfg->path) {
		KVT_LOGE("t2: no data file path");
		return KVT_EINVAL;
	}
	*qd = cfg->queue_depth ? cfg->queue_depth : KVT_T2_DEFAULT_QD;
	*max_raw = cfg->max_raw_bytes ? cfg->max_raw_bytes : KVT_T2_DEFAULT_MAX_RAW;
	*n_ctx = cfg->n_io_ctx ? cfg->n_io_ctx : 2;
	if (*qd > 1024 || cfg->io_mode < KVT_T2_IO_AUTO || cfg->io_mode > KVT_T2_IO_THREADS ||
	    cfg->comp > KVT_T2_COMP_SHUF2_LZ4 || *max_raw > KVT_T2_MAX_RAW_BYTES || *n_ctx > 64) {
		KVT_LOGE("t2 %s: bad config (queue_depth %u of 1..1024, io_mode %d, comp %u, max_raw_bytes %u of at most %u, n_io_ctx %u of at most 64)",
			 cfg->path, *qd, cfg->io_mode, cfg->comp, *max_raw, KVT_T2_MAX_RAW_BYTES, *n_ctx);
		return KVT_EINVAL;
	}
	return KVT_OK;
}

/* A store with nothing open yet: its buffers, I/O ops and settings from cfg. NULL: out of memory. */
static kvt_t2_store *store_new(const kvt_t2_config *cfg, uint32_t max_raw)
{
	kvt_t2_store *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->fd = -1;
	s->lock_fd = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->sync_mu, NULL);
	s->path = strdup(cfg->path);
	s->sb = aligned_alloc(KVT_T2_UNIT_BYTES, (size_t)KVT_T2_SB_COPIES * KVT_T2_UNIT_BYTES);
	if (!s->path || !s->sb) {
		kvt_t2_close(s);
		return NULL;
	}
	kvt_t2_io_ops_resolve(cfg->io, &s->ops);
	memcpy(s->model_fp, cfg->model_fp, 32);
	memcpy(s->owner, cfg->owner_id, KVT_T2_OWNER_BYTES);
	s->max_raw = max_raw;
	s->slot_bytes = kvt_t2_round_up((uint64_t)KVT_T2_HEADER_BYTES + max_raw, KVT_T2_UNIT_BYTES);
	s->sync_every = cfg->sync_every;
	s->comp = cfg->compress ? (cfg->comp ? cfg->comp : KVT_T2_COMP_DEFAULT) : KVT_T2_COMP_NONE;
	return s;
}

/*
 * The lock: its own open file description, never handed to io_uring, so
 * it dies with this process (a kill -9 included) even while the kernel
 * still tears down the rings that reference the data descriptor. A block
 * device is also claimed O_EXCL on it (exclusive against other O_EXCL
 * openers and mounts). *existed: the path was there before (the lock
 * creates a file).
 */
static int open_lock(kvt_t2_store *s, const kvt_t2_config *cfg, bool *existed)
{
	struct stat pre;
	*existed = stat(cfg->path, &pre) == 0;
	s->blockdev = *existed && S_ISBLK(pre.st_mode);
	s->lock_fd = s->blockdev ? open(cfg->path, O_RDONLY | O_CLOEXEC | O_EXCL)
				 : open(cfg->path, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
	if (s->lock_fd < 0) {
		int e = errno;
		if (e == EBUSY)
			KVT_LOGE("t2 %s: the block device is in use (mounted, or claimed by another process): give this "
				 "daemon a device or file of its own in [tier.nvme] path",
				 cfg->path);
		else
			KVT_LOGE("t2 %s: cannot open: %s", cfg->path, strerror(e));
		return e == EBUSY ? KVT_EINVAL : KVT_EIO;
	}
	if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
		int e = errno;
		if (e == EWOULDBLOCK)
			KVT_LOGE("t2 %s: locked by another process: another daemon (or an offline kvtier command) is "
				 "using this T2 file. Two daemons cannot share one [tier.nvme] path: give each its own, or "
				 "stop the other one first",
				 cfg->path);
		else
			KVT_LOGE("t2 %s: cannot lock: %s", cfg->path, strerror(e));
		return e == EWOULDBLOCK ? KVT_EINVAL : KVT_EIO;
	}
	return KVT_OK;
}

/* Open the data descriptor (O_DIRECT; buffered where refused and cfg allows) and read the size it has. */
static int open_data(kvt_t2_store *s, const kvt_t2_config *cfg, uint64_t *size)
{
	s->fd = open(cfg->path, O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
	s->direct = s->fd >= 0;
	if (s->fd < 0 && errno == EINVAL && cfg->buffered_ok) {
		KVT_LOGW("t2 %s: the file system refuses O_DIRECT; using buffered I/O (fdatasync still orders writes)",
			 cfg->path);
		s->fd = open(cfg->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	}
	if (s->fd < 0) {
		KVT_LOGE("t2 %s: cannot open: %s", cfg->path, strerror(errno));
		return errno == EINVAL ? KVT_EUNSUPPORTED : KVT_EIO;
	}
	struct stat st;
	if (fstat(s->fd, &st) != 0) {
		KVT_LOGE("t2 %s: fstat: %s", cfg->path, strerror(errno));
		return KVT_EIO;
	}
	*size = s->blockdev ? kvt_t2_io_blockdev_bytes(s->fd) : (uint64_t)st.st_size;
	return KVT_OK;
}

/* Open the store the file holds: KVT_OK, KVT_ENOTFOUND (none: make one), or an error (logged). */
static int open_contents(kvt_t2_store *s, const kvt_t2_config *cfg, uint64_t size, bool existed)
{
	int rc = KVT_ENOTFOUND;
	if (size > 0 && !cfg->reset) {
		rc = open_existing(s, cfg, size);
		if (rc && rc != KVT_ENOTFOUND)
			return rc;
		if (rc == KVT_OK && cfg->capacity_bytes &&
		    cfg->capacity_bytes / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES != s->file_bytes)
			KVT_LOGI("t2 %s: existing file keeps its %llu bytes (config asks %llu; reset to resize)", cfg->path,
				 (unsigned long long)s->file_bytes, (unsigned long long)cfg->capacity_bytes);
	} else if (existed && size == 0 && !cfg->reset) {
		KVT_LOGW("t2 %s: the file exists but is empty (0 bytes): a new store is made in it; whatever it held "
			 "is gone",
			 cfg->path);
	}
	return rc;
}

/* Make a new store in the file (size bytes now): cfg's capacity, or the whole block device. */
static int open_create(kvt_t2_store *s, const kvt_t2_config *cfg, uint64_t size)
{
	uint64_t cap = cfg->capacity_bytes / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES;
	if (s->blockdev && (!cap || cap > size))
		cap = size / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES;
	if (cap < (KVT_T2_SB_COPIES + 1) * KVT_T2_UNIT_BYTES) {
		KVT_LOGE("t2 %s: capacity_bytes %llu is below three 4 KiB units (two superblock copies and a record)",
			 cfg->path, (unsigned long long)cfg->capacity_bytes);
		return KVT_EINVAL;
	}
	if (cfg->no_repair) {
		KVT_LOGE("t2 %s: no store in the file (%llu bytes)", cfg->path, (unsigned long long)size);
		return KVT_ECORRUPT;
	}
	s->intact_bytes = 0;
	return file_create(s, cap);
}

int kvt_t2_open(const kvt_t2_config *cfg, kvt_t2_store **out)
{
	uint32_t qd, max_raw, n_ctx;
	uint64_t size;
	bool existed;
	int rc = open_check_config(cfg, &qd, &max_raw, &n_ctx);
	if (rc)
		return rc;
	kvt_t2_store *s = store_new(cfg, max_raw);
	if (!s)
		return KVT_ENOMEM;
	if ((rc = open_lock(s, cfg, &existed)) || (rc = open_data(s, cfg, &size)))
		goto fail;
	rc = open_contents(s, cfg, size, existed);
	if (rc == KVT_ENOTFOUND)
		rc = open_create(s, cfg, size);
	if (rc)
		goto fail;
	rc = kvt_t2_alloc_init(&s->alloc, s->file_bytes / KVT_T2_UNIT_BYTES, s->n_sb);
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
	if (s->lock_fd >= 0)
		close(s->lock_fd); /* last: the lock is held until the data descriptor is gone */
	kvt_t2_alloc_deinit(&s->alloc);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->sync_mu);
	free(s->sb);
	free(s->path);
	free(s);
}

/*
 * Geometry of a loc: aligned, inside the record area and, for a read (io),
 * not larger than a staging slot. mark_used and free take any size: a
 * record of another namespace (another block size) may be larger than this
 * store's slots, and is kept, never read here, and freed when reclaimed.
 */
static bool loc_ok(const kvt_t2_store *s, const kvt_t2_loc *loc, const char *what, bool io)
{
	if (loc->off < (uint64_t)s->n_sb * KVT_T2_UNIT_BYTES || loc->off % KVT_T2_UNIT_BYTES || !loc->extent_bytes ||
	    loc->extent_bytes % KVT_T2_UNIT_BYTES || loc->off > s->file_bytes ||
	    loc->extent_bytes > s->file_bytes - loc->off || (io && loc->extent_bytes > s->slot_bytes)) {
		KVT_LOGE("t2 %s: %s: extent at off %llu of %u bytes is misaligned, outside the %llu-byte file or above the %zu-byte record limit",
			 s->path, what, (unsigned long long)loc->off, loc->extent_bytes,
			 (unsigned long long)s->file_bytes, s->slot_bytes);
		return false;
	}
	return true;
}

int kvt_t2_mark_used(kvt_t2_store *s, const kvt_t2_loc *loc)
{
	if (!loc_ok(s, loc, "mark_used", false))
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
	if (!loc_ok(s, loc, "free", false))
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

int kvt_t2_holds(kvt_t2_store *s, const kvt_t2_loc *loc)
{
	if (!loc_ok(s, loc, "holds", false))
		return KVT_EINVAL;
	pthread_mutex_lock(&s->mu);
	bool used = kvt_t2_alloc_is_used(&s->alloc, loc->off / KVT_T2_UNIT_BYTES, loc->extent_bytes / KVT_T2_UNIT_BYTES);
	pthread_mutex_unlock(&s->mu);
	return used ? KVT_OK : KVT_ENOTFOUND;
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
			rc = kvt_t2_sb_write(s, s->next_gen + KVT_T2_GEN_CHUNK);
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

/* Check each request's meta and payload: results[i] KVT_OK, or KVT_EINVAL (logged). */
static void wbatch_validate(const kvt_t2_store *s, uint32_t n, const kvt_t2_write_req *reqs, int *results)
{
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
}

/*
 * The batch's own fdatasync, or the intermediate one's failure (sync_err):
 * whether the n_ok records written may NOT be trusted (logged). Caller holds
 * sync_mu.
 */
static bool wbatch_sync_failed(kvt_t2_store *s, int sync_err, uint32_t n_ok)
{
	if (sync_err && n_ok) {
		KVT_LOGE("t2 %s: intermediate fdatasync failed: %s; batch of %u records poisoned, T2 is now read-only",
			 s->path, strerror(-sync_err), n_ok);
		return true;
	}
	if (n_ok && s->ops.fdatasync(s->ops.ctx, s->fd) != 0) {
		KVT_LOGE("t2 %s: fdatasync failed: %s; batch of %u records poisoned, T2 is now read-only", s->path,
			 strerror(errno), n_ok);
		return true;
	}
	return false;
}

/* A poisoned batch: every record written fails KVT_EIO, its extent quarantined. Caller holds mu. */
static void wbatch_poison(kvt_t2_store *s, uint32_t n, const kvt_t2_loc *locs, int *results)
{
	s->read_only = true;
	for (uint32_t i = 0; i < n; i++) {
		if (results[i] != KVT_OK)
			continue;
		uint64_t u = locs[i].off / KVT_T2_UNIT_BYTES, k = locs[i].extent_bytes / KVT_T2_UNIT_BYTES;
		kvt_t2_alloc_quarantine(&s->alloc, u, k); /* bytes of unknown state */
		kvt_t2_alloc_put(&s->alloc, u, k);       /* no row will point at it */
		results[i] = KVT_EIO;
	}
}

/* A durable batch: count its records; a batch with no lack of space clears `degraded`. Caller holds mu. */
static void wbatch_account(kvt_t2_store *s, uint32_t n, const kvt_t2_write_req *reqs, const kvt_t2_loc *locs,
			   const int *results, uint32_t n_ok, uint64_t n_full)
{
	for (uint32_t i = 0; i < n; i++) {
		if (results[i] != KVT_OK)
			continue;
		s->n_writes++;
		s->bytes_written += locs[i].extent_bytes;
		s->raw_bytes_written += reqs[i].meta->raw_bytes;
		s->n_compressed += locs[i].compressed != KVT_T2_COMP_NONE;
	}
	if (n_ok && !n_full)
		s->degraded = false;
}

/* The first result of a batch that is not KVT_OK, or KVT_OK. */
static int first_error(uint32_t n, const int *results)
{
	for (uint32_t i = 0; i < n; i++)
		if (results[i] != KVT_OK)
			return results[i];
	return KVT_OK;
}

int kvt_t2_write_batch(kvt_t2_store *s, uint32_t n, const kvt_t2_write_req *reqs, kvt_t2_loc *locs, int *results)
{
	double t0 = kvt_now_s();
	uint32_t n_ok = 0;

	wbatch_validate(s, n, reqs, results);
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
	pthread_mutex_lock(&s->sync_mu);
	bool sync_failed = wbatch_sync_failed(s, sync_err, n_ok);
	if (!sync_failed && n_ok)
		kvt_fault_point("t2.write.synced"); /* the batch is durable; no caller knows yet */
	pthread_mutex_lock(&s->mu);
	if (!sync_failed && n_ok && s->read_only) {
		KVT_LOGE("t2 %s: another fdatasync failed while this batch ran; batch of %u records poisoned", s->path,
			 n_ok);
		sync_failed = true;
	}
	if (sync_failed)
		s->read_only = true;
	pthread_mutex_unlock(&s->sync_mu);
	if (sync_failed)
		wbatch_poison(s, n, locs, results);
	else
		wbatch_account(s, n, reqs, locs, results, n_ok, b.n_full);
	s->write_s += kvt_now_s() - t0;
	pthread_mutex_unlock(&s->mu);
	return first_error(n, results);
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

/*
 * A read batch: KVT_OK or, for a loc not to be read, why (KVT_EINVAL: bad
 * geometry or no payload buffer, logged; with live, KVT_ENOTFOUND: the
 * extent is not in use, i.e. never written or freed).
 */
static int read_batch(kvt_t2_store *s, uint32_t n, const kvt_t2_loc *locs, const uint8_t (*expect_hash)[32],
		      kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results, bool live)
{
	double t0 = kvt_now_s();
	for (uint32_t i = 0; i < n; i++)
		results[i] = loc_ok(s, &locs[i], "read", true) && payloads[i] ? KVT_OK : KVT_EINVAL;
	if (live) {
		pthread_mutex_lock(&s->mu);
		for (uint32_t i = 0; i < n; i++)
			if (results[i] == KVT_OK && !kvt_t2_alloc_is_used(&s->alloc, locs[i].off / KVT_T2_UNIT_BYTES,
									 locs[i].extent_bytes / KVT_T2_UNIT_BYTES))
				results[i] = KVT_ENOTFOUND;
		pthread_mutex_unlock(&s->mu);
	}

	rbatch b = { .s = s, .locs = locs, .expect = expect_hash, .metas = metas, .payloads = payloads,
		     .cap = payload_cap, .results = results };
	b.c = kvt_t2_io_acquire(s->io);
	kvt_t2_batch_cb cb = { rprep, rdone, &b, 0 };
	kvt_t2_io_run(s->io, b.c, n, &cb);
	kvt_t2_io_release(s->io, b.c);

	pthread_mutex_lock(&s->mu);
	for (uint32_t i = 0; i < n; i++)
		s->n_reads += results[i] != KVT_EINVAL && results[i] != KVT_ENOTFOUND; /* those were not read */
	s->n_corrupt += b.n_corrupt;
	s->bytes_read += b.bytes;
	s->read_s += kvt_now_s() - t0;
	pthread_mutex_unlock(&s->mu);
	return first_error(n, results);
}

int kvt_t2_read_batch(kvt_t2_store *s, uint32_t n, const kvt_t2_loc *locs, const uint8_t (*expect_hash)[32],
		      kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results)
{
	return read_batch(s, n, locs, expect_hash, metas, payloads, payload_cap, results, false);
}

int kvt_t2_read_batch_live(kvt_t2_store *s, uint32_t n, const kvt_t2_loc *locs, const uint8_t (*expect_hash)[32],
			   kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results)
{
	return read_batch(s, n, locs, expect_hash, metas, payloads, payload_cap, results, true);
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
	for (uint64_t off = (uint64_t)s->n_sb * KVT_T2_UNIT_BYTES; off < s->file_bytes;) {
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
	st->capacity_bytes = s->file_bytes - (uint64_t)s->n_sb * KVT_T2_UNIT_BYTES;
	st->used_bytes = (s->alloc.n_used - s->n_sb) * KVT_T2_UNIT_BYTES;
	st->slot_bytes = s->slot_bytes;
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

uint64_t kvt_t2_intact_bytes(const kvt_t2_store *s) { return s->intact_bytes; }
const char *kvt_t2_file_path(const kvt_t2_store *s) { return s->path; }
void kvt_t2_owner_id(const kvt_t2_store *s, uint8_t out[KVT_T2_OWNER_BYTES]) { memcpy(out, s->owner, KVT_T2_OWNER_BYTES); }
