/*
 * tiers/rstore.h — the record store: one seam through which the tiering
 * manager puts, gets, checks and drops block records, whatever holds them:
 * the T2 file (tiers/rstore_t2.c over kvt_t2_store) or the T3 Redis Cluster
 * (tiers/rstore_t3.c over kvt_t3). Private to tiers/.
 *
 * Design: a struct of function pointers, as SQLite's VFS (STYLE.md §9): the
 * caller holds a kvt_rstore and calls rs->ops->put(rs, ...). The adapters are
 * thin: each op is one call into the store it wraps (plus mapping its
 * results), so a store's rules (verification, write order, retries) live in
 * one place, the store. A kvt_rstore is a view: it owns nothing, allocates
 * nothing at init, and has no destroy; the store it wraps must outlive it.
 *
 * What a record is: a kvt_t2_block_meta (hash, parent, tokens, codec, sizes)
 * and meta.raw_bytes of payload, sealed by the store into the T2 record
 * format (t2_store.h) and verified on every get against its checksum, the
 * store's model fingerprint and the expected block hash.
 *
 * Where a record is: a located store (T2) hands back a kvt_rstore_loc from
 * put that the caller keeps (the index row) and passes to every later op; a
 * keyed store (T3) finds a record by its block hash alone, returns zeroed
 * locs, and ignores the locs it is given (they may be NULL).
 *
 * The write order (DESIGN.md §4) through this seam:
 *   1. put returns KVT_OK for a record: its bytes are durable (located store);
 *   2. the caller commits the index row holding the returned loc;
 *   3. only after the row is deleted does the caller call del on the record.
 *
 * Batches: every op but iterate and stats takes n records (n == 0 is KVT_OK)
 * and writes one result per record to results[i]; it returns KVT_OK when every
 * result is KVT_OK, else the first result that is not. A whole-call failure
 * (KVT_ENOMEM, KVT_EINVAL for an argument the store cannot use) is written to
 * every results[i] and returned.
 *
 * Thread rules: every op of both adapters may be called from any thread at
 * once, except iterate, which runs alone (offline: start-up, fsck,
 * rebuild-index; no put or del in flight). Each op's arguments are borrowed
 * for the call only.
 */
#ifndef KVT_RSTORE_H
#define KVT_RSTORE_H

#include "t2_store.h"
#include "t3_remote.h"

/* Where a record lives: T2's extent (what the index row keeps); zeros for a keyed store (T3). */
typedef kvt_t2_loc kvt_rstore_loc;

/* A record to put: meta (borrowed for the call) and meta->raw_bytes of payload (borrowed; any alignment). */
typedef kvt_t2_write_req kvt_rstore_rec;

/* Counters both stores can give; what one cannot, it leaves 0 (and says so below). */
typedef struct kvt_rstore_stats {
	bool held_known;          /* n_records, used_bytes, capacity_bytes are counted here (T2); false: the
				     servers hold the records and this side does not count them (T3: all 0) */
	uint64_t n_records;       /* records held now (T2: extents in use, quarantined included) */
	uint64_t used_bytes;      /* bytes they take (T2: extent bytes) */
	uint64_t capacity_bytes;  /* bytes available to records (T2: the file less its superblock) */
	uint64_t n_puts;          /* records put with KVT_OK (T2: durable; T3: acknowledged) */
	uint64_t bytes_put;       /* bytes those took (T2: extent bytes; T3: record values sent) */
	uint64_t n_gets;          /* records asked for (T2: extents read; T3: hits and misses) */
	uint64_t bytes_got;       /* record bytes read */
	uint64_t n_corrupt;       /* records that failed verification (never served) */
	uint64_t n_full;          /* records refused for lack of space (T2; T3 counts OOM in n_errors) */
	uint64_t n_errors;        /* failed commands: node down, timeout, OOM, error reply (T3; T2 logs each
				     failed I/O and does not count it: 0, see read_only) */
	bool degraded;            /* T2: the last allocation found no space; T3: a command failed within 2 s */
	bool read_only;           /* T2: a failed fdatasync poisoned the store (every put KVT_EIO); T3: false */
} kvt_rstore_stats;

/* iterate's callback: 0 to go on, a negative code to stop (iterate returns it). */
typedef int (*kvt_rstore_visit_fn)(void *ctx, const kvt_t2_block_meta *meta, const kvt_rstore_loc *loc);

typedef struct kvt_rstore kvt_rstore;

typedef struct kvt_rstore_ops {
	/*
	 * Store n records; locs[i] gets where record i went (zeros for T3).
	 * results[i]:
	 *   KVT_OK      stored. T2: DURABLE on return (O_DIRECT write, then an
	 *               fdatasync of the file returned 0): the first step of the
	 *               write order, the row may now commit. T3: acknowledged by
	 *               the master that owns the key (in its memory: a TTL,
	 *               eviction, a restart or a failover may lose it later,
	 *               and a lost record is a miss, never wrong bytes);
	 *   KVT_EFULL   no room (T2: no free extent, the store is degraded; T3:
	 *               the server's OOM reply);
	 *   KVT_EINVAL  a meta that cannot be a record (raw_bytes 0 or too large,
	 *               n_tokens too many; logged). T3 then stores none of the batch;
	 *   KVT_EIO     the write failed (T2: a failed fdatasync fails the whole
	 *               batch and turns the store read-only; T3: unreachable,
	 *               timeout, an error reply).
	 * T2 assigns each record a fresh extent and generation: putting a block
	 * twice gives two records (the caller frees the one its row drops). T3
	 * overwrites the key.
	 */
	int (*put)(kvt_rstore *rs, uint32_t n, const kvt_rstore_rec *recs, kvt_rstore_loc *locs, int *results);
	/*
	 * Read and verify n records: record i by hashes[i] (required by T3, the
	 * key; T2 may take NULL to skip the hash check, as fsck does) and locs[i]
	 * (required by T2: NULL is KVT_EINVAL; ignored by T3). metas may be NULL
	 * (no meta out); payloads[i] holds payload_cap bytes (any alignment).
	 * results[i]:
	 *   KVT_OK        metas[i] and payloads[i] hold the verified record (its
	 *                 checksum, the store's model, the expected hash; T3 also
	 *                 that the tokens hash, from the parent, to the key);
	 *   KVT_ENOTFOUND no such record (T2: the extent is not in use, i.e. never
	 *                 written or deleted; T3: no key);
	 *   KVT_ECORRUPT  the record fails verification: never served, counted
	 *                 (T2 also quarantines the extent and logs it);
	 *   KVT_EFULL     payload_cap is below the record's raw bytes (T2; T3
	 *                 counts it KVT_ECORRUPT: a record larger than a block);
	 *   KVT_EINVAL    a loc outside the file or misaligned (T2; logged);
	 *   KVT_EIO       the read failed (T2), unreachable or timeout (T3).
	 * stop_at_miss: the caller wants a prefix, so the store MAY leave the
	 * records after the first that is not KVT_OK undecoded, KVT_ENOTFOUND
	 * (T3 does; T2 reads them all). payloads[i]'s bytes are unspecified on
	 * any result but KVT_OK.
	 */
	int (*get)(kvt_rstore *rs, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], const kvt_rstore_loc *locs,
		   bool stop_at_miss, kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results);
	/*
	 * Whether each record is there, without reading it: results[i] KVT_OK or
	 * KVT_ENOTFOUND (T2: the extent is in use; T3: the key exists), KVT_EINVAL
	 * (T2: a bad loc), KVT_EIO (T3). A record that would fail verification
	 * counts as there until a get says otherwise.
	 */
	int (*exists)(kvt_rstore *rs, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], const kvt_rstore_loc *locs,
		      int *results);
	/*
	 * Drop n records: the last step of the write order, only once no row
	 * points at them. results[i]: KVT_OK, KVT_ENOTFOUND (not there: T2, an
	 * extent not in use, left alone; T3, no key), KVT_EINVAL (T2: a bad loc),
	 * KVT_EIO (T3). T2 gives the extent back to free space (a quarantined one
	 * stays out of it); the caller must not get a record it is deleting.
	 */
	int (*del)(kvt_rstore *rs, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], const kvt_rstore_loc *locs,
		   int *results);
	/*
	 * Walk every record that verifies (no expected hash), in the store's
	 * order, calling fn. Returns the number of records that failed
	 * verification (>= 0), fn's negative code, or KVT_EIO / KVT_ENOMEM.
	 * T2: kvt_t2_scan (a freed extent not yet overwritten still holds a record
	 * and is reported; keep the highest generation per hash). T3: returns
	 * KVT_EUNSUPPORTED; the cluster client speaks GET/SET/DEL/EXISTS only,
	 * and a keyed store's records are found by their hash.
	 */
	int (*iterate)(kvt_rstore *rs, kvt_rstore_visit_fn fn, void *ctx);
	/* Fill *st (every field set; see kvt_rstore_stats for what each store counts). */
	void (*stats)(kvt_rstore *rs, kvt_rstore_stats *st);
} kvt_rstore_ops;

struct kvt_rstore {
	const kvt_rstore_ops *ops; /* the store's ops (static) */
	void *impl;                /* the store: kvt_t2_store or kvt_t3 (borrowed; must outlive the view) */
	const char *name;          /* "t2" or "t3", for log lines */
};

/* For the adapters: set every result to rc and return it (KVT_OK for n == 0). */
static inline int kvt_rstore_fill(uint32_t n, int *results, int rc)
{
	for (uint32_t i = 0; i < n; i++)
		results[i] = rc;
	return n ? rc : KVT_OK;
}

/* For the adapters and callers: the first result that is not KVT_OK, or KVT_OK. */
static inline int kvt_rstore_first_error(uint32_t n, const int *results)
{
	for (uint32_t i = 0; i < n; i++)
		if (results[i] != KVT_OK)
			return results[i];
	return KVT_OK;
}

/* Make rs a view of the T2 store s (borrowed; must outlive rs). */
void kvt_rstore_t2_init(kvt_rstore *rs, kvt_t2_store *s);
/* Make rs a view of the T3 tier t (borrowed; must outlive rs). */
void kvt_rstore_t3_init(kvt_rstore *rs, kvt_t3 *t);

#endif
