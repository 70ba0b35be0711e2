/*
 * tiers/t2_int.h — internals shared by the T2 store's subsystems:
 *   t2_record.c  the on-disk record: encode, verify, checksum, compression;
 *   t2_alloc.c   the 4 KiB-unit bitmap allocator and its exact-size free lists;
 *   t2_io.c      the I/O engines (io_uring contexts, the pread/pwrite pool);
 *   t2_super.c   the superblock: encode, parse, load, write, probe;
 *   t2_store.c   open/close, repair and salvage, batches, scan, stats.
 * Nothing here is visible outside tiers/t2_*.c, except the record functions,
 * which tiers/t3_remote.c uses to seal and verify T3 (remote) records too.
 */
#ifndef KVT_T2_INT_H
#define KVT_T2_INT_H

#include "t2_store.h"

#include <liburing.h>
#include <pthread.h>

#define KVT_T2_SB_MAGIC "KVT2FILE"
#define KVT_T2_REC_MAGIC "KVT2REC\0"
#define KVT_T2_MIN_HEADER_BYTES 160u
#define KVT_T2_REC_MODEL_OFF 16u /* the model fingerprint's offset in a record header */

/* ---- t2_super.c ---- */

/*
 * Parse superblock copy `copy` from b (n bytes available): KVT_OK and *out,
 * or KVT_EINVAL (no magic: not a T2 file), KVT_ECORRUPT (short, checksum,
 * misplaced copy), KVT_EUNSUPPORTED (newer format, other unit), *why saying which.
 */
int kvt_t2_sb_parse(const uint8_t *b, size_t n, uint32_t copy, kvt_t2_info *out, const char **why);
/*
 * Read the copies in the first n bytes of fd into buf ([KVT_T2_SB_COPIES][4096],
 * aligned) and pick the newest valid one into *out; why[i] says why copy i did
 * not verify (NULL when it did). KVT_OK, KVT_EINVAL (not a T2 file),
 * KVT_EUNSUPPORTED (newer format), KVT_ECORRUPT (no copy verifies), KVT_EIO.
 */
int kvt_t2_sb_load(const kvt_t2_io_ops *ops, int fd, uint8_t *buf, uint64_t n, kvt_t2_info *out,
		   const char *why[KVT_T2_SB_COPIES]);
/*
 * Write and fdatasync every copy of s's superblock with high-water gen_limit
 * and the next sequence, one after the other. KVT_OK or KVT_EIO (logged; a
 * failed fdatasync also turns s read-only). Caller holds s->mu (or is open).
 */
int kvt_t2_sb_write(kvt_t2_store *s, uint64_t gen_limit);

static inline uint64_t kvt_t2_round_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

/* ---- t2_record.c ---- */

/* Seed of the record checksum: mixes the offset and the generation. */
uint64_t kvt_t2_seed(uint64_t off, uint64_t generation);

/*
 * Encode a record for (off, generation) into rec (a staging buffer of
 * rec_cap bytes, 4 KiB aligned): header, payload compressed with comp when it
 * saves >= 15% and at least one unit (scratch: raw_bytes bytes, for the
 * shuffle), zero padding to the extent. Fills *loc. The extent size is known
 * before off is: call kvt_t2_record_size first, allocate, then encode.
 */
typedef struct kvt_t2_sized {
	uint32_t stored_bytes; /* payload bytes after the chosen compression */
	uint32_t extent_bytes; /* header + stored, rounded to 4 KiB */
	uint8_t comp;          /* enum kvt_t2_comp chosen */
} kvt_t2_sized;
/* Compress (or not) meta/payload into rec + KVT_T2_HEADER_BYTES and report the sizes. */
void kvt_t2_record_pack(const kvt_t2_block_meta *meta, const void *payload, uint8_t comp, void *scratch,
			uint8_t *rec, size_t rec_cap, kvt_t2_sized *out);
/* Write the header of a packed record for (off, generation) and the padding; fills *loc. */
void kvt_t2_record_seal(const kvt_t2_block_meta *meta, const uint8_t model_fp[32], const kvt_t2_sized *sz,
			uint64_t off, uint64_t generation, uint8_t *rec, kvt_t2_loc *loc);

/*
 * Verify the record in rec (n bytes read from off) against the expected
 * generation/checksum (want may be NULL: scan), the model fingerprint and
 * expect_hash (may be NULL). On success decode the meta and decompress the
 * payload into payload_out (payload_cap bytes; scratch holds raw bytes for the
 * unshuffle) and fill *loc_out (may be NULL). Returns KVT_OK, KVT_ECORRUPT
 * (why names the failed check), KVT_EFULL (payload_cap too small).
 */
int kvt_t2_record_verify(const uint8_t *rec, size_t n, uint64_t off, const kvt_t2_loc *want,
			 const uint8_t model_fp[32], const uint8_t *expect_hash, kvt_t2_block_meta *meta_out,
			 void *payload_out, size_t payload_cap, void *scratch, kvt_t2_loc *loc_out, const char **why);
/*
 * As kvt_t2_record_verify (want NULL, no loc) for a record of which only the
 * first n bytes are present, its extent's bytes past them taken as zeros
 * (T3 sends records without their padding); the extent may be up to limit.
 * A record with more bytes than its extent, or fewer than its header and
 * stored payload, is KVT_ECORRUPT.
 */
int kvt_t2_record_verify_unpadded(const uint8_t *rec, size_t n, uint64_t limit, uint64_t off,
				  const uint8_t model_fp[32], const uint8_t *expect_hash, kvt_t2_block_meta *meta_out,
				  void *payload_out, size_t payload_cap, void *scratch, const char **why);
/* Header-only sanity check for scan: the magic and lengths; *extent_bytes from the header. */
bool kvt_t2_record_peek(const uint8_t *rec, uint64_t off, uint64_t file_bytes, uint32_t *extent_bytes);

/* Byte shuffle of 16-bit words into two planes, and back (n even; odd tail byte copied). */
void kvt_t2_shuffle2(const uint8_t *src, uint8_t *dst, size_t n);
void kvt_t2_unshuffle2(const uint8_t *src, uint8_t *dst, size_t n);

/* ---- t2_alloc.c ---- */

typedef struct kvt_t2_alloc {
	uint64_t *used;      /* [n_words] bit per unit: used or quarantined */
	uint64_t *quar;      /* [n_words] bit per unit: quarantined (subset of used) */
	uint64_t n_units;    /* units in the file */
	uint64_t n_reserved; /* units [0, n_reserved) hold the superblock copies: always used */
	uint64_t n_words;    /* (n_units + 63) / 64 */
	uint64_t n_used;     /* units set in used */
	uint64_t n_extents;  /* extents marked used (records) */
	uint64_t n_quar_ext; /* extents quarantined (freed by their owner or not) */
	struct { uint64_t unit, k; } *qfreed; /* [n_qfreed] quarantined extents their owner freed */
	uint32_t n_qfreed, qfreed_cap;
	uint64_t rotor;      /* next-fit start unit */
	/* exact-size free lists: lists[k] holds start units of freed k-unit
	 * extents (k < KVT_T2_N_LISTS), entries re-checked on pop */
	uint64_t *lists[64]; /* [list_cap[k]] */
	uint32_t list_n[64];
	uint32_t list_cap[64];
} kvt_t2_alloc;
#define KVT_T2_N_LISTS 64u

/* n_reserved (>= 1, < n_units): the leading units kept for the superblock copies. */
int kvt_t2_alloc_init(kvt_t2_alloc *a, uint64_t n_units, uint64_t n_reserved);
void kvt_t2_alloc_deinit(kvt_t2_alloc *a);
/* Take k free units; KVT_EFULL if no run of k is free. */
int kvt_t2_alloc_get(kvt_t2_alloc *a, uint64_t k, uint64_t *unit);
/* Mark [unit, unit+k) used; false if out of range or any is used already. */
bool kvt_t2_alloc_mark(kvt_t2_alloc *a, uint64_t unit, uint64_t k);
/* Whether every unit of [unit, unit+k) is used (and in range). */
bool kvt_t2_alloc_is_used(const kvt_t2_alloc *a, uint64_t unit, uint64_t k);
/* Release [unit, unit+k): back to the free map unless quarantined (then kept, returns false). */
bool kvt_t2_alloc_put(kvt_t2_alloc *a, uint64_t unit, uint64_t k);
/* Quarantine [unit, unit+k) (marking it used if it was not). */
void kvt_t2_alloc_quarantine(kvt_t2_alloc *a, uint64_t unit, uint64_t k);
/* Return the quarantined extents their owner has freed to the free map (fsck decided). */
void kvt_t2_alloc_release_quarantine(kvt_t2_alloc *a);

/* ---- t2_io.c ---- */

/* One I/O of a batch, owned by the engine loop while in flight. */
typedef struct kvt_t2_job {
	uint8_t *buf;    /* staging buffer (4 KiB aligned) */
	size_t n;        /* bytes */
	uint64_t off;    /* file offset */
	size_t done;     /* bytes completed so far (short I/O resubmits the rest) */
	int res;         /* 0 or -errno when finished */
	int slot;        /* staging slot index */
	uint32_t idx;    /* the batch entry it serves */
	bool is_write;
	bool is_sync;    /* an intermediate fdatasync (no buffer, no slot) */
	uint32_t n_again;/* -EAGAIN retries */
} kvt_t2_job;

typedef struct kvt_t2_io kvt_t2_io;
typedef struct kvt_t2_ioctx kvt_t2_ioctx;

/* Per-batch callbacks of the engine loop. */
typedef struct kvt_t2_batch_cb {
	/* Fill job for entry idx into staging slot buf (slot_bytes); return false
	 * to skip the entry (already finished with an error). */
	bool (*prep)(void *ctx, uint32_t idx, uint8_t *buf, size_t slot_bytes, kvt_t2_job *job);
	/* The I/O of entry job->idx finished (job->res). */
	void (*done)(void *ctx, kvt_t2_job *job);
	void *ctx;
	/* Writes: queue an fdatasync behind every sync_every completed writes while
	 * more are still to come (0 = never). It overlaps the device's flush with
	 * the rest of the batch, so the caller's final fdatasync has less to do. */
	uint32_t sync_every;
} kvt_t2_batch_cb;

typedef struct kvt_t2_io_cfg {
	int fd;
	int mode;                 /* enum kvt_t2_io_mode */
	uint32_t queue_depth;     /* requested in-flight I/Os per context */
	uint32_t n_ctx;           /* I/O contexts */
	size_t slot_bytes;        /* staging slot size (multiple of 4 KiB) */
	uint64_t staging_cap;     /* staging bytes per context, at most */
	const kvt_t2_io_ops *ops; /* never NULL members (defaults filled in) */
} kvt_t2_io_cfg;

int kvt_t2_io_create(const kvt_t2_io_cfg *cfg, kvt_t2_io **out);
void kvt_t2_io_destroy(kvt_t2_io *io);
bool kvt_t2_io_uring(const kvt_t2_io *io);
/* Take an idle context (blocks while all are busy) / give it back. */
kvt_t2_ioctx *kvt_t2_io_acquire(kvt_t2_io *io);
void kvt_t2_io_release(kvt_t2_io *io, kvt_t2_ioctx *c);
/* The context's scratch buffer (slot_bytes, for shuffles). */
uint8_t *kvt_t2_ioctx_scratch(kvt_t2_ioctx *c);
/*
 * Run entries [0, n) of a batch through prep -> I/O -> done, up to the
 * context's depth in flight. Returns 0, or the -errno of a failed
 * intermediate fdatasync (cb->sync_every): the caller must treat the batch as
 * not durable.
 */
int kvt_t2_io_run(kvt_t2_io *io, kvt_t2_ioctx *c, uint32_t n, const kvt_t2_batch_cb *cb);
/* Fill *out from o (may be NULL): o's members, the real syscalls where o gives none. */
void kvt_t2_io_ops_resolve(const kvt_t2_io_ops *o, kvt_t2_io_ops *out);
/* Size in bytes of the block device open at fd (0 when it cannot be read). */
uint64_t kvt_t2_io_blockdev_bytes(int fd);
/* Whole synchronous pread/pwrite through the ops (loops on short counts, EINTR, EAGAIN): 0 or -errno. */
int kvt_t2_io_pread_full(const kvt_t2_io_ops *ops, int fd, void *buf, size_t n, uint64_t off);
int kvt_t2_io_pwrite_full(const kvt_t2_io_ops *ops, int fd, const void *buf, size_t n, uint64_t off);

/* ---- the store's state (t2_store.c, t2_super.c) ---- */

/* Opaque outside tiers/t2_*.c; see t2_store.c for its invariants and locking. */
struct kvt_t2_store {
	int fd;                   /* the data file */
	int lock_fd;              /* a second open file description of it, holding the flock (O_EXCL for a device) */
	bool blockdev;            /* the path is a block device (no ftruncate/fallocate; size from BLKGETSIZE64) */
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
	uint8_t *sb;              /* [KVT_T2_SB_COPIES][4096] superblock staging, aligned; under mu */
	uint32_t n_sb;            /* superblock copies at units [0, n_sb); records start at unit n_sb */
	uint64_t sb_seq;          /* sequence of the newest superblock written (newest valid copy wins) */
	uint8_t owner[KVT_T2_OWNER_BYTES]; /* the index this file belongs to (zeros: none recorded) */
	uint64_t intact_bytes;    /* bytes found holding data at open (less than file_bytes: recreated or truncated) */

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

#endif
