/*
 * tiers/t2_store.h — T2, the NVMe tier: one preallocated file of
 * self-describing, checksummed block records, written with O_DIRECT over
 * io_uring (a pread/pwrite thread pool where io_uring is refused).
 *
 * This header is the contract shared by the tiering manager (tiers/manager*),
 * the index (index/: its rows store a kvt_t2_loc) and `kvtier rebuild-index`
 * (kvt_t2_scan). The store owns bytes on disk and free space; it never decides
 * what to keep. The index owns the rows; the write order (DESIGN.md §4) is
 *   1. kvt_t2_write_batch returns KVT_OK for a record: its bytes are durable;
 *   2. the caller commits the index row holding the returned kvt_t2_loc;
 *   3. only after a row is deleted does the caller kvt_t2_free its extent.
 *
 * ---------------------------------------------------------------------------
 * On-disk format (version 1; all integers little-endian)
 *
 * The file is an array of 4 KiB units (KVT_T2_UNIT_BYTES). Units 0 and 1 hold
 * two copies of the superblock; records occupy runs of whole units
 * ("extents") anywhere after them.
 *
 * Superblock copy (unit i for copy i, 4096 bytes; superblock format 2):
 *     0   8  magic "KVT2FILE"
 *     8   4  superblock format version (2; 1 is the older single-copy format)
 *    12   4  unit bytes (4096)
 *    16   8  capacity bytes (file size; a multiple of 4096)
 *    24  32  model fingerprint
 *    56   8  generation high-water: every generation ever handed out is below it
 *    64   8  XXH3-64 of bytes [0, 64), seed 0 (so a format-1 reader names the
 *            version instead of reporting a checksum mismatch)
 *    72   8  sequence: raised by every superblock write; the newest valid copy wins
 *    80  16  owner id: the identity of the index (index.sqlite) whose rows point
 *            here (zeros: none recorded yet); another index is refused
 *    96   2  copy number (i)
 *    98   2  copies (2; 1 for a format-1 file upgraded in place, whose records
 *            start at unit 1)
 *   100   4  zero
 *   104   8  XXH3-64 of bytes [0, 104), seed 0
 *   112 ...  zero
 *   Format 1 (older files) had only bytes [0, 72) of copy 0 and records from
 *   unit 1; it is read, and rewritten as format 2 with one copy at open.
 *   The store reserves generations in chunks (KVT_T2_GEN_CHUNK): it raises the
 *   high-water, writes and fdatasyncs copy 0, then copy 1, then hands out
 *   numbers below it, so a generation is never reused, even across a crash
 *   that tears one copy. A damaged copy is rewritten from the other at open.
 *   With no valid copy the store refuses to open, except with cfg.salvage
 *   (fsck, rebuild-index), which writes new copies from the records
 *   (the model from the records' headers when cfg gives none; generations
 *   past every record's).
 *
 * Truncation: a file shorter than its superblock says lost every record past
 * the cut (kvt_t2_intact_bytes tells the caller where); the store extends it
 * back to its size (not with cfg.no_repair). An empty or missing file is made
 * anew (intact bytes 0): the caller counts the rows that pointed into it as lost.
 *
 * Record (an extent of extent_bytes = round_up(header_bytes + stored_bytes, 4096)):
 *     0   8  magic "KVT2REC\0"
 *     8   2  format version (1)
 *    10   2  header bytes (1280 in version 1, required so by version-1 readers)
 *    12   4  flags (kvt_t2_block_meta.flags: bit 0 KVT_T2_FLAG_CHUNK; the
 *            other bits 0; readers ignore what they do not know, so a record
 *            with a flag verifies under a reader older than the flag, and
 *            one written before it reads as flags 0)
 *    16  32  model fingerprint
 *    48  32  block hash (chained SHA-256, from the index module)
 *    80  32  parent hash
 *   112   8  generation
 *   120   8  file offset the record was written for
 *   128   4  raw bytes (the block before compression)
 *   132   4  stored bytes (payload bytes following the header)
 *   136   4  extent bytes
 *   140   4  n_tokens (<= KVT_T2_MAX_TOKENS)
 *   144   1  kv dtype        (opaque to T2; from kvt_t2_block_meta)
 *   145   1  kv codec        (opaque to T2: fp16/fp8/int8 of the T1 record)
 *   146   1  scale layout    (opaque to T2)
 *   147   1  compression     (enum kvt_t2_comp: 0 raw, 1 LZ4, 2 shuffle+LZ4)
 *   148   4  zero
 *   152   8  checksum: XXH3-64 over the whole extent (header with this field
 *            read as zero, payload, padding), seeded with
 *            XXH3-64(le64 offset || le64 generation, seed 0x6b76743254324b56)
 *   160 1024 token ids, int32[256] (entries past n_tokens are zero)
 *  1184  96  zero
 *  1280 ...  payload (stored bytes), then zero padding to the extent end
 *
 * A read accepts a record only if: the magic, version and lengths are sane;
 * the offset and generation in the header equal the ones asked for; the model
 * fingerprint equals the store's; the hash equals the expected one; the
 * checksum recomputed with seed(offset, generation) equals both the header's
 * and the loc's; and LZ4_decompress_safe yields exactly raw bytes. So a record
 * written to the wrong slot, a stale record left by an older generation, a
 * torn write and any flipped bit are all rejected (KVT_ECORRUPT).
 *
 * Compression: with cfg.compress, each block is compressed and kept only when
 * the stored payload is at most 85% of the raw bytes (saves >= 15%) AND the
 * extent shrinks by at least one 4 KiB unit; otherwise it is stored raw.
 * Decompression uses LZ4_decompress_safe only. KVT_T2_COMP_SHUF2_LZ4 first
 * splits the payload into two byte planes (all low bytes of each 16-bit word,
 * then all high bytes), meant to let LZ4 find repetition in the fp16
 * sign/exponent bytes; on real KV it did not help (see KVT_T2_COMP_DEFAULT
 * and bench/README.md, T2).
 *
 * Durability: the file is opened O_DIRECT (buffered only with
 * cfg.buffered_ok, logged); a write batch's records are acknowledged only after
 * all of its writes completed and an fdatasync of the file returned 0. A new
 * file is fallocated; on ENOSPC it is created sparse and the tier starts
 * degraded (writes that meet ENOSPC return KVT_EFULL, and it recovers by
 * itself when the file system has room again).
 *
 * Space allocator: a bitmap of 4 KiB units is the truth (1 = used or
 * quarantined). Allocation of k units first pops an exact-size free list for
 * k (extents freed earlier, re-checked against the bitmap), then searches the
 * bitmap next-fit from a rotor for a run of k free units. Free-space
 * accounting is in units. A quarantined extent stays set in the bitmap:
 * kvt_t2_free of it keeps it out of allocation until
 * kvt_t2_release_quarantine (fsck / rebuild) or a restart (whose free map is
 * rebuilt from index rows, which no longer point at it).
 *
 * ---------------------------------------------------------------------------
 * Thread rules: every function may be called from any thread, concurrently,
 * on one store, except kvt_t2_open/kvt_t2_close (no other call may be in
 * flight) and kvt_t2_mark_used/kvt_t2_scan which are meant for start-up but
 * are also safe concurrently. The allocator and counters sit under one mutex;
 * I/O runs on a small pool of I/O contexts (an io_uring each, or the shared
 * thread pool), so concurrent batches overlap. The caller must not free (or
 * read after freeing) an extent while another thread writes or reads it.
 */
#ifndef KVT_T2_STORE_H
#define KVT_T2_STORE_H

#include "index.h"
#include "kvt.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define KVT_T2_UNIT_BYTES 4096u    /* allocation unit, O_DIRECT alignment */
#define KVT_T2_MAX_TOKENS 256u     /* token ids a record can carry */
#define KVT_T2_HEADER_BYTES 1280u  /* record header bytes, format version 1 */
#define KVT_T2_FORMAT_VERSION 1u
#define KVT_T2_MAX_RAW_BYTES (64u << 20) /* largest block payload accepted */
#define KVT_T2_GEN_CHUNK 65536u    /* generations reserved per superblock sync */
#define KVT_T2_SB_VERSION 2u       /* superblock format (records keep KVT_T2_FORMAT_VERSION) */
#define KVT_T2_SB_COPIES 2u        /* superblock copies of a new file (units 0 and 1) */
#define KVT_T2_OWNER_BYTES KVT_DB_OWNER_BYTES /* the owning index's identity */

typedef struct kvt_t2_store kvt_t2_store;

enum kvt_t2_io_mode {
	KVT_T2_IO_AUTO = 0,    /* io_uring; the thread pool if io_uring_setup is refused */
	KVT_T2_IO_URING = 1,   /* io_uring or fail (KVT_EUNSUPPORTED) */
	KVT_T2_IO_THREADS = 2, /* pread/pwrite thread pool */
};

/* How a payload is stored (record byte 147, kvt_t2_loc.compressed). */
enum kvt_t2_comp {
	KVT_T2_COMP_NONE = 0,      /* raw */
	KVT_T2_COMP_LZ4 = 1,       /* LZ4 block format */
	KVT_T2_COMP_SHUF2_LZ4 = 2, /* 16-bit byte planes (low, high), then LZ4 */
};

/*
 * Fault-injection seam: the store's syscalls on its file go through these
 * (NULL member = the real syscall; NULL table = all real). They return what
 * the syscall would (-1 with errno set for pread/pwrite/fdatasync/fallocate).
 * pread/pwrite serve the thread-pool path and the store's synchronous I/O
 * (superblock, scan); on the io_uring path reads and writes go to the kernel
 * ring, and uring_result filters each completion instead (the background
 * fdatasync inside a write batch too: is_write, n == 0).
 */
typedef struct kvt_t2_io_ops {
	ssize_t (*pread)(void *ctx, int fd, void *buf, size_t n, off_t off);         /* thread path + sync I/O */
	ssize_t (*pwrite)(void *ctx, int fd, const void *buf, size_t n, off_t off);  /* thread path + sync I/O */
	int (*fdatasync)(void *ctx, int fd);                                         /* a batch's final barrier; thread path: also the background ones */
	int (*fallocate)(void *ctx, int fd, off_t off, off_t len);                   /* preallocation at open */
	int (*uring_setup)(void *ctx); /* called before io_uring_queue_init; return -EPERM to simulate a refused io_uring_setup, 0 to go on */
	/* io_uring path: called with each completion's result res (bytes or -errno)
	 * for an I/O of n bytes at off; returns the result the store acts on (e.g.
	 * a short count, -EIO, -EAGAIN). NULL = unchanged. */
	int (*uring_result)(void *ctx, bool is_write, int res, size_t n, off_t off);
	void *ctx; /* passed to every hook */
} kvt_t2_io_ops;

typedef struct kvt_t2_config {
	const char *path;        /* data file (created if absent); borrowed for open only */
	uint64_t capacity_bytes; /* file size for a new file (rounded down to 4 KiB; >= 2 units); 0 = keep an existing file's size */
	uint32_t queue_depth;    /* I/Os in flight per I/O context (0 = 32; max 1024) */
	int io_mode;             /* enum kvt_t2_io_mode */
	bool compress;           /* try compression per block (kept only where it saves >= 15%) */
	uint8_t comp;            /* enum kvt_t2_comp used when compress (0 = the measured default, KVT_T2_COMP_DEFAULT) */
	bool reset;              /* discard an existing file's contents (new superblock, new model) */
	bool buffered_ok;        /* if O_DIRECT is refused by the filesystem, fall back to buffered I/O (logged) instead of failing */
	uint32_t max_raw_bytes;  /* largest payload a write will get and largest record a read accepts (0 = 4 MiB);
				    sizes the staging slots: round_up(1280 + max_raw_bytes, 4 KiB) each */
	uint32_t n_io_ctx;       /* concurrent I/O contexts (0 = 2). Memory: each holds 2 x depth staging slots,
				    depth = min(queue_depth, staging_cap_bytes / (2 x slot)) (at least 1),
				    registered (pinned) with its io_uring, in 2 MiB transparent huge pages where
				    the kernel allows (the arena is rounded up to 2 MiB; a large record is then
				    one device request: bench/README.md, T2); set max_raw_bytes to the block size */
	uint64_t staging_cap_bytes; /* staging bytes per I/O context, at most (0 = 32 MiB) */
	uint32_t sync_every;     /* inside a write batch, also queue an fdatasync in the background after every
				    sync_every completed writes while more follow (0 = never, the default: on the
				    virtio disks measured it cost more flushes than it saved; bench/README.md);
				    the batch always ends with its own fdatasync before anything is acknowledged */
	const kvt_t2_io_ops *io; /* NULL = real syscalls; borrowed, must outlive the store */
	uint8_t model_fp[32];    /* model fingerprint; an existing file must match unless reset (salvage: zeros =
				    learn it from the records) */
	uint8_t owner_id[KVT_T2_OWNER_BYTES]; /* the owning index (kvt_db_owner_id); zeros = not checked, not recorded */
	bool salvage;            /* no valid superblock copy: write new ones from the records (fsck, rebuild-index) */
	bool no_repair;          /* never write at open: a damaged copy, format 1, a missing owner, a truncated
				    tail are left as found (fsck --dry-run); a truncated file then ends at the cut */
} kvt_t2_config;

/* What a record carries besides lengths and checksum (all of it is in the on-disk header). */
/* kvt_t2_block_meta.flags */
#define KVT_T2_FLAG_CHUNK 1u /* the block is a chunk block (index.h, enum kvt_block_kind), not a prefix block */

typedef struct kvt_t2_block_meta {
	uint8_t hash[32];                    /* chained SHA-256 block hash */
	uint8_t parent[32];                  /* parent block's hash (zeros for the first block) */
	uint32_t n_tokens;                   /* token ids in tokens[] (<= KVT_T2_MAX_TOKENS) */
	int32_t tokens[KVT_T2_MAX_TOKENS];   /* the block's token ids */
	uint8_t kv_dtype;                    /* opaque to T2 (e.g. enum kvt_dtype) */
	uint8_t codec;                       /* opaque to T2: the T1 record codec (fp16/fp8/int8) */
	uint8_t scale_layout;                /* opaque to T2 */
	uint32_t raw_bytes;                  /* payload bytes (before compression) */
	uint32_t flags;                      /* header flags: KVT_T2_FLAG_CHUNK or 0 (opaque to T2) */
} kvt_t2_block_meta;

/*
 * Where a record lives: the durable index row stores exactly these, so the
 * type is the index's own (index/index.h, kvt_nvme_loc): off is the file
 * offset of the record (multiple of 4096, > 0), extent_bytes the bytes it
 * occupies (multiple of 4096), stored_bytes its payload bytes on disk (after
 * compression), generation its write generation (unique over the file's
 * life), checksum its XXH3-64, compressed an enum kvt_t2_comp (0 = raw).
 */
typedef kvt_nvme_loc kvt_t2_loc;

typedef struct kvt_t2_write_req {
	const kvt_t2_block_meta *meta; /* borrowed for the call */
	const void *payload;           /* meta->raw_bytes bytes; borrowed for the call; any alignment */
} kvt_t2_write_req;

/*
 * Open cfg->path: create it (fallocate to capacity, superblock, fdatasync) or
 * open an existing file (superblock verified: magic, version, size, model
 * fingerprint). The free map starts with every record unit FREE: the caller
 * rebuilds it from its index rows with kvt_t2_mark_used before writing.
 * I/O: io_uring per cfg->io_mode; when io_uring_queue_init (or the
 * uring_setup hook) fails in AUTO mode, the thread pool takes over and that
 * is logged once (warning). O_DIRECT is required unless cfg->buffered_ok.
 * Exclusive: the store holds an flock on a second open file description of
 * the path (and claims a block device O_EXCL) from open to close, so a second
 * store (another daemon, an offline tool) on the same file or device fails
 * with KVT_EINVAL (logged: what to do). NOTE: the lock is not taken on the
 * data descriptor: after a kill -9 the kernel tears the dead process's
 * io_uring down asynchronously and holds that file meanwhile, so a lock on
 * it would outlive the process and fail a restart.
 * Ownership: cfg.owner_id (when not zeros) must equal the file's recorded
 * owner; a file with none recorded adopts it.
 * Returns KVT_EINVAL (bad config, another model, another owner, locked:
 * logged), KVT_EFULL (fallocate reports no space), KVT_EIO, KVT_ECORRUPT
 * (no superblock copy verifies: logged with the command that repairs it),
 * KVT_EUNSUPPORTED (IO_URING mode refused, a newer superblock format),
 * KVT_ENOMEM.
 */
int kvt_t2_open(const kvt_t2_config *cfg, kvt_t2_store **out);
/* Close the file and free everything. NULL is a no-op. No call may be in flight. */
void kvt_t2_close(kvt_t2_store *s);

/*
 * Bytes of the file that held data when it was opened: file size for an
 * intact file, the cut for a truncated one, 0 for one made anew (missing,
 * empty, reset). A record at or past it was lost before this open: the caller
 * drops (and counts) the rows that point there.
 */
uint64_t kvt_t2_intact_bytes(const kvt_t2_store *s);
const char *kvt_t2_file_path(const kvt_t2_store *s); /* the path, for log lines */
void kvt_t2_owner_id(const kvt_t2_store *s, uint8_t out[KVT_T2_OWNER_BYTES]); /* recorded owner (zeros: none) */

/* What a file's superblock says (kvt_t2_probe). */
typedef struct kvt_t2_info {
	uint32_t version;        /* superblock format of the copy used (1 or 2) */
	uint32_t n_copies;       /* superblock copies the file keeps (records start at unit n_copies) */
	uint32_t n_valid;        /* copies that verified and agree */
	uint64_t seq;            /* sequence of the copy used */
	uint64_t capacity_bytes; /* the size the superblock says */
	uint64_t file_bytes;     /* the size the file has */
	uint64_t gen_limit;      /* generation high-water */
	uint8_t model_fp[32];    /* model fingerprint */
	uint8_t owner_id[KVT_T2_OWNER_BYTES]; /* owning index (zeros: none) */
} kvt_t2_info;
/*
 * Read the superblock copies of path without opening a store (no lock, no
 * writes): the newest valid copy. KVT_ENOTFOUND (no file), KVT_EIO,
 * KVT_EINVAL (not a T2 file), KVT_ECORRUPT (no copy verifies),
 * KVT_EUNSUPPORTED (newer format); logged.
 */
int kvt_t2_probe(const char *path, kvt_t2_info *out);

/*
 * Start-up: mark loc's extent used (an index row points at it) and raise the
 * next generation above loc->generation. KVT_EINVAL (logged) if the extent is
 * misaligned, out of the file or overlaps an extent already marked.
 */
int kvt_t2_mark_used(kvt_t2_store *s, const kvt_t2_loc *loc);

/*
 * Write n records. results[i] (and locs[i] when KVT_OK) per record:
 *   KVT_OK      the record is DURABLE (O_DIRECT write + fdatasync done) at locs[i];
 *   KVT_EFULL   no extent free for it (the tier is degraded; not logged per
 *               record, counted in n_enospc; clears when frees make room);
 *   KVT_EINVAL  bad meta (n_tokens, raw_bytes 0 or > max_raw_bytes): logged;
 *   KVT_EIO     the write failed (its extent is released), or the batch's
 *               fdatasync failed: then EVERY record of the batch is KVT_EIO,
 *               their extents are quarantined (their bytes are unknown) and
 *               the store turns read-only (all later writes KVT_EIO); a
 *               concurrent batch whose fdatasync comes after that failure
 *               is failed the same way (its 0 cannot be trusted).
 * Returns KVT_OK if every record is KVT_OK, else the first non-OK result.
 * Records are independent; n may exceed the queue depth (the store keeps
 * queue_depth writes in flight). n == 0 is KVT_OK.
 */
int kvt_t2_write_batch(kvt_t2_store *s, uint32_t n, const kvt_t2_write_req *reqs, kvt_t2_loc *locs, int *results);

/*
 * Read and verify one record at *loc (see "A read accepts" above); expect_hash
 * may be NULL to skip the hash check (fsck). On KVT_OK fills *meta_out (may be
 * NULL) and meta->raw_bytes bytes of payload_out (any alignment).
 * KVT_ECORRUPT on any mismatch: logged, counted (n_corrupt), the extent
 * quarantined, *meta_out untouched (payload_out's bytes are unspecified on
 * any error; never a partially verified block: the checksum is checked before
 * anything is decompressed). KVT_EFULL if payload_cap is
 * below the record's raw bytes; KVT_EINVAL for a loc outside the file or
 * misaligned; KVT_EIO when the read fails.
 */
int kvt_t2_read(kvt_t2_store *s, const kvt_t2_loc *loc, const uint8_t expect_hash[32],
		kvt_t2_block_meta *meta_out, void *payload_out, size_t payload_cap);
/*
 * Read n records, up to queue_depth in flight; results[i] as kvt_t2_read.
 * expect_hash, metas may be NULL (no hash check / no meta out); payloads[i]
 * each hold payload_cap bytes. Returns KVT_OK or the first non-OK result.
 */
int kvt_t2_read_batch(kvt_t2_store *s, uint32_t n, const kvt_t2_loc *locs, const uint8_t (*expect_hash)[32],
		      kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results);

/*
 * kvt_t2_read_batch for a caller that may hold stale locs (the record-store
 * seam, rstore.h): a loc whose extent is not in use (never written, or
 * freed) is KVT_ENOTFOUND and not read, so a freed record is a miss, not
 * served from the bytes it left behind. The caller orders its frees and
 * reads of one record (a free racing the read of the same extent is a bug).
 */
int kvt_t2_read_batch_live(kvt_t2_store *s, uint32_t n, const kvt_t2_loc *locs, const uint8_t (*expect_hash)[32],
			   kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results);

/*
 * Whether loc's extent is in use (marked by a write or kvt_t2_mark_used, not
 * freed since): KVT_OK, KVT_ENOTFOUND, KVT_EINVAL (misaligned or outside the
 * file; logged). Nothing is read: whether the record verifies is a read's to say.
 */
int kvt_t2_holds(kvt_t2_store *s, const kvt_t2_loc *loc);

/*
 * Release an extent: only after the index row that pointed at it is gone.
 * A quarantined extent stays out of allocation (see above). Freeing an extent
 * that is not marked used is a caller bug: logged, ignored.
 */
void kvt_t2_free(kvt_t2_store *s, const kvt_t2_loc *loc);

/* Return every quarantined extent that was freed to the free map (fsck decided). */
void kvt_t2_release_quarantine(kvt_t2_store *s);

/*
 * Walk every record in the file (rebuild-index, fsck), in offset order:
 * calls fn for each record that verifies (the checksum, the offset, the model
 * fingerprint; no expected hash), skipping its extent; a unit that starts
 * with the record magic but fails verification is counted. fn returns 0 to go
 * on, a negative code to stop the walk (returned as is). Returns the number of
 * bad records (>= 0), or a negative KVT_E* (KVT_EIO).
 * NOTE: an extent freed but not yet overwritten still holds a valid record;
 * scan reports it (it holds the block it names). For a hash seen twice keep the
 * highest generation. Scan raises the next generation above every one it saw.
 * It does not mark anything used: the caller calls kvt_t2_mark_used for the
 * rows it keeps.
 */
int kvt_t2_scan(kvt_t2_store *s, int (*fn)(void *ctx, const kvt_t2_block_meta *meta, const kvt_t2_loc *loc), void *ctx);

typedef struct kvt_t2_stats {
	uint64_t capacity_bytes;    /* bytes available to records (file size minus the superblock) */
	uint64_t used_bytes;        /* bytes in used extents (quarantined included) */
	uint64_t slot_bytes;        /* the extent of the largest (an uncompressed) record */
	uint64_t n_records;         /* extents in use */
	uint64_t n_reads;           /* records read (verified or not) */
	uint64_t n_writes;          /* records written durably */
	uint64_t bytes_read;        /* extent bytes read */
	uint64_t bytes_written;     /* extent bytes written */
	uint64_t raw_bytes_written; /* payload bytes before compression, of durable writes */
	uint64_t n_compressed;      /* durable records stored compressed */
	uint64_t n_corrupt;         /* reads that failed verification */
	uint64_t n_quarantined;     /* extents held in quarantine now */
	uint64_t n_enospc;          /* records refused for lack of space */
	double read_s, write_s;     /* wall seconds inside read / write batches */
	bool degraded;              /* the last allocation failed for lack of space */
	bool read_only;             /* a failed fdatasync poisoned the store */
	bool using_uring;           /* io_uring path (else the thread pool) */
	bool direct_io;             /* O_DIRECT (else buffered) */
} kvt_t2_stats;
void kvt_t2_get_stats(kvt_t2_store *s, kvt_t2_stats *st);

/*
 * The compression used when cfg.compress and cfg.comp == 0: plain LZ4.
 * Measured on real KV blocks of SmolLM2-135M over GPL-3 text (bench_t2_lz4,
 * bench/README.md): neither LZ4 (ratio 0.997) nor shuffle+LZ4 (0.996) saves
 * anything on fp16, FP8 or INT8 blocks, so no block passes the 15% rule and
 * compression only costs CPU: callers should leave cfg.compress off for KV.
 * When it is on, LZ4 is the default as it gives up 5x faster than
 * shuffle+LZ4 for the same (absent) gain.
 */
#define KVT_T2_COMP_DEFAULT KVT_T2_COMP_LZ4

#endif
