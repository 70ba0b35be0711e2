/*
 * tiers/manager.h — the tiering manager: keeps T0 (device), T1 (pinned host)
 * and T2 (NVMe) between their watermarks, promotes on hit, prefetches, and
 * persists blocks in the durable write order (DESIGN.md §3, §4).
 *
 * State. The residency of every block lives in the index's block table
 * (kvt_btable, borrowed): slot[T0], slot[T1], the T2 location, pins, LRU and
 * the dirty flag. The manager keeps no second table; it owns only one
 * reference on each T0 / T1 slot the table names (so a slot named by the
 * table is never handed out again) and a small set of blocks being moved
 * right now ("busy"), which serializes all movement of one block.
 *
 * Movement. T0 -> T1: kvt_dev_kv_pack into a device staging buffer on the
 * mover's own stream, async D2H into the T1 slot (tiers.h, kvt_t1_mover).
 * T1 -> T2: the T1 slot bytes are the record payload (kvt_t2_write_batch).
 * Promotion runs the reverse, T2 -> T1 -> T0; a T1 copy is kept, so a later
 * T0 eviction of an unchanged block costs no I/O. Dropping a clean copy
 * (the block is also in a lower tier, or durable on NVMe) is free.
 *
 * Eviction. When a tier's use passes its high watermark, the manager's
 * maintenance thread takes the coldest unpinned leaves of that tier
 * (kvt_btable_coldest: children before parents) until use is at the low
 * watermark: a T0 block is copied to T1 if T1 lacks it, a dirty T1 block
 * (its only copy) is written to T2 first (write-back), a T2 block's row is
 * deleted and then its extent freed. A block that must make room but has no
 * lower tier to go to (T2 absent, full or read-only) is dropped: the cache
 * loses it, it is recomputed when needed.
 *
 * Chunk share. A block is a prefix block (a conversation's chain) or a
 * chunk block (a document span stored under a chunk root, registered with
 * kvt_tm_register_kind), and the table counts each kind per tier
 * (index.h, "Kinds"). When a tier must make room, the victims are split
 * so that of the blocks the tier keeps, chunk blocks hold at most
 * cfg.chunk_share and prefix blocks at most the rest: while chunks hold
 * more than their share, the coldest chunk blocks go first; while prefixes
 * hold more than theirs, the coldest prefix blocks; either kind within its
 * share keeps it, so a flood of new documents cannot push the
 * conversations out, nor the reverse. A kind with too few candidates
 * (pinned, retained, not leaves) is made up from the coldest of any kind.
 * Retention and pins hold as before. The share counts the blocks the table
 * has in the tier (T0: the manager's; T2: this namespace's records).
 *
 * Pins. A pinned block is never demoted and its slots are never reused: the
 * eviction path re-reads the pin count and clears the slot in one critical
 * section that kvt_tm_pin and kvt_tm_lookup(KVT_BT_PIN) also take. Pin through
 * the manager (not the table directly) to get this guarantee. A T0 slot
 * handed to the engine by kvt_tm_promote carries a T0 reference of the
 * engine's own, so even a block evicted later keeps its bytes until the
 * engine's sequence lets go.
 *
 * Durability (never violated): a block's bytes are durable in T2
 * (kvt_t2_write_batch returned KVT_OK for it) before its index row is queued;
 * the block counts as persisted (kvt_btable_set_nvme: clean) only once the
 * row has committed (kvt_db_wait); a T2 extent is freed only after the
 * deletion of the row that pointed at it has committed. If a row put fails,
 * the extent no row points at is freed; if a delete fails, the extent is
 * kept (a restart rebuilds the free map from the rows). A failed fdatasync
 * turns the store read-only (t2_store.h); the manager then stops writing to
 * T2 and keeps serving from T0/T1/T2 reads.
 *
 * Write policy: KVT_PERSIST_END_OF_TURN (default) writes a finished turn's
 * new blocks through to T2 right after kvt_tm_end_turn (durable within
 * end_turn_s, 1 s by default); KVT_PERSIST_WRITE_BACK writes a block only
 * when it leaves the last tier holding it. Both flush everything at
 * kvt_tm_destroy (and kvt_tm_flush on demand).
 *
 * Retention (tiers/retain.c): a client may ask to keep a prefix (a chain of
 * blocks, in order) for a TTL: kvt_tm_retain. Until its deadline a retained
 * block is skipped by eviction in its floor tier and every tier below it
 * (kvt_btable_coldest_at), so it may still move down to its floor (a block
 * retained in T1 leaves T0 under pressure, and comes back on use) but is
 * never dropped. Every hit restarts the TTL (kvt_tm_retain_refresh, called
 * with the matched prefix). The deadline, TTL, floor and tenant are in the
 * block's index row (written with the row, updated by a queued write), so a
 * restart keeps them (kvt_tm_recover); a deadline is unix microseconds on
 * the manager's clock (cfg.clock_us: tests pass their own to expire TTLs
 * without waiting). Quotas (kvt_tm_set_quota) bound the bytes a tenant holds
 * retained (a block counts its size in its floor tier: T0 the fp16 block,
 * T1/T2 the packed record), in all and per floor tier; over quota the
 * tenant's own oldest retentions go first (never another tenant's), and a
 * request that alone does not fit gets the longest prefix that does
 * (kvt_tm_retain_result.n_denied says how much was refused). Without T2, a
 * T2 floor is taken as T1. kvt_tm_release (a deleted session) ends retention.
 *
 * T3 (optional, cfg.t3): a remote tier shared with other nodes. Blocks the
 * table does not know are looked up there (kvt_tm_submit_remote), verified,
 * entered clean (T3 holds them) and promoted T3 -> T1 -> T0 on the I/O
 * threads. Writes run on a thread of their own: WRITE_THROUGH writes every
 * registered block after its turn ends (kvt_tm_end_turn), ON_DEMOTE a block
 * about to leave the last local tier that holds it; sessions are written as
 * queued (kvt_tm_remote_put_session). A T3 failure is a miss; a write that
 * found no server is retried a second later. T3 never holds up T0-T2.
 *
 * Threads: one maintenance thread (watermarks, persistence) and n_io_threads
 * promotion workers, each with its own device stream, device staging buffer
 * and pinned host staging buffer. The engine's calls (register, pin, lookup,
 * promote, reserve) may come from any thread. Blocks registered by the engine
 * are ordered before the manager packs them by an event the manager records
 * on the compute stream in kvt_tm_register: call it on the thread that drives
 * the compute stream, after the ops that wrote the block.
 */
#ifndef KVT_MANAGER_H
#define KVT_MANAGER_H

#include "index.h"
#include "t2_store.h"
#include "t3_remote.h"
#include "tiers.h"

enum kvt_persist {
	KVT_PERSIST_END_OF_TURN = 0, /* write-through of each turn's new blocks (default) */
	KVT_PERSIST_WRITE_BACK = 1,  /* write a block to T2 only when it is evicted from its last tier */
};

/*
 * T2 record scale_layout (kvt_t2_block_meta.scale_layout): how the scales of
 * an 8-bit payload are laid out (gpu/dev.h, "Block codecs"). 0 for f16.
 * A manager reads only records of its own codec AND layout; any other record
 * (an INT8 record of layout 1, written before INT8 took group scales) is a
 * miss, logged once, never decoded.
 */
#define KVT_TM_SCALE_LAYOUT_TOKEN_HEAD 1 /* one scale per token and KV head: FP8 (and INT8 before group scales) */
#define KVT_TM_SCALE_LAYOUT_TOKEN_HEAD_32 2 /* INT8: one scale per token, KV head and 32 dims (the whole head when
                                               head_dim is not a multiple of 32) */
#define KVT_TM_SCALE_LAYOUT_KCHAN_VTOK32 3 /* INT8KV1: K per channel over the block (fp16 scale and minimum), V per
                                              token, KV head and 32 dims (fp16 scale) */
#define KVT_TM_SCALE_LAYOUT_KCHAN8_VTOK16 4 /* INT8KV: K per channel over the block (fp16 minimum, E5M3 scale), V per
                                               token, KV head and 16 dims (E5M3 scale) */
/*
 * Versioning: the (codec, scale_layout) pair of a record is its format. A
 * promotion decodes every format above whatever the manager's own t1_codec
 * (a record of another codec is unpacked straight into T0 with its own
 * codec, never kept in T1), so data written by an older build (FP8, INT8 or
 * INT8KV1 records) still resumes after the default changes; only an INT8 record of
 * layout 1 (before group scales) is a miss.
 */

/* The remote tier's index in per-tier arrays that count it beside T0-T2 (usage, resume reports). */
#define KVT_TM_TIER_REMOTE KVT_TIER_COUNT
#define KVT_TM_N_TIERS (KVT_TIER_COUNT + 1)

typedef struct kvt_tm_config {
	kvt_dev *dev;            /* borrowed; must outlive the manager */
	kvt_t0_pool *t0;         /* borrowed: the engine's T0 pool */
	kvt_btable *bt;          /* borrowed: the block table (residency state) */
	kvt_t2_store *t2;        /* borrowed; NULL = no NVMe tier */
	kvt_db *db;              /* borrowed; required with t2 (the durable rows) */
	uint32_t t1_slots;       /* T1 capacity in blocks (>= 1) */
	int t1_codec;            /* enum kvt_kv_codec of T1 and T2 records (default INT8KV) */
	bool t2_f16;             /* T2 records written from T0 (end of turn, flush) are f16 (exact) while T1
	                            keeps t1_codec; a record written from a T1 slot stays t1_codec */
	float high[KVT_TIER_COUNT]; /* high watermark per tier, fraction of capacity in (0, 1] */
	float low[KVT_TIER_COUNT];  /* low watermark per tier, < high */
	int persist;             /* enum kvt_persist */
	double end_turn_s;       /* END_OF_TURN: a turn's blocks durable within this (default 1.0) */
	uint32_t n_io_threads;   /* promotion workers (default 2, 1..16) */
	uint32_t batch_blocks;   /* blocks per move / T2 batch; sizes the staging buffers (default 16) */
	double poll_s;           /* maintenance period when nothing signals it (default 0.02) */
	uint64_t (*clock_us)(void *user); /* retention clock, microseconds; NULL = unix time (kvt_wall_us) */
	void *clock_user;        /* its argument */
	kvt_t3 *t3;              /* borrowed; NULL = no remote tier */
	int (*layered_fault)(void *user, uint32_t group); /* tests: called before kvt_tm_promote_layered issues
	                                                      group's copies; non-zero fails them as a failed copy
	                                                      would (NULL: never) */
	void *layered_fault_user; /* its argument */
	float chunk_share;       /* the most of each tier's blocks chunk blocks keep when the tier makes room, 0..1;
	                            prefix blocks keep the rest (default 0.5; see "Chunk share") */
} kvt_tm_config;

/* A tenant's retention quota; 0 = no limit. */
typedef struct kvt_tm_quota {
	uint64_t bytes;                          /* retained bytes in all */
	uint64_t tier_bytes[KVT_TIER_COUNT];     /* retained bytes whose floor is this tier */
} kvt_tm_quota;

/* What one kvt_tm_retain did with the blocks it was given (in chain order). */
typedef struct kvt_tm_retain_result {
	uint32_t n_new;    /* blocks retained that were not before (cache writes) */
	uint32_t n_kept;   /* blocks already retained: deadline extended (never shortened) */
	uint32_t n_denied; /* blocks refused (the tail of the chain): over quota, or not cached */
} kvt_tm_retain_result;

/* One block's retention (kvt_tm_get_retention). */
typedef struct kvt_tm_retention {
	char tenant[KVT_NAME_MAX + 1]; /* whose quota it counts against */
	uint64_t until_us;             /* deadline on the manager's clock */
	uint64_t ttl_us;               /* restarted on every hit */
	int floor;                     /* enum kvt_tier */
} kvt_tm_retention;

/* Per-tenant retention counters (kvt_tm_get_tenants). */
typedef struct kvt_tm_tenant_stats {
	char tenant[KVT_NAME_MAX + 1];      /* the tenant */
	kvt_tm_quota quota;                 /* its quota (the default "*" unless set for it) */
	bool quota_set;                     /* set for this tenant by name */
	uint64_t n_blocks[KVT_TIER_COUNT];  /* retained blocks now, by floor tier */
	uint64_t bytes[KVT_TIER_COUNT];     /* their bytes, by floor tier */
	uint64_t n_granted_blocks;          /* blocks newly retained so far */
	uint64_t n_denied_blocks;           /* blocks refused (quota) */
	uint64_t n_quota_released;          /* retentions ended early to make room for newer ones of the tenant */
	uint64_t n_expired;                 /* retentions whose TTL ran out */
	uint64_t n_released;                /* retentions ended by kvt_tm_release (session deleted) */
	uint64_t n_lost;                    /* retained blocks dropped anyway (no floor tier had room) */
	uint64_t n_hits;                    /* retained blocks hit (TTL restarted) */
} kvt_tm_tenant_stats;

/* Retention in all (kvt_tm_stats.retain). */
typedef struct kvt_tm_retain_stats {
	uint64_t n_blocks;                    /* retained blocks now */
	uint64_t bytes;                       /* their bytes (as quotas count them) */
	uint64_t n_by_floor[KVT_TIER_COUNT];  /* of those, by floor tier */
	uint64_t n_in_tier[KVT_TIER_COUNT];   /* retained blocks present in each tier now */
	uint64_t bytes_in_tier[KVT_TIER_COUNT]; /* their bytes in that tier (its slot / record size) */
	uint32_t n_tenants;                   /* tenants with retention state or a quota */
} kvt_tm_retain_stats;

/* Defaults for everything but the borrowed handles (left NULL). */
void kvt_tm_config_default(kvt_tm_config *c);

/* Per-tier counters for the statistics report. */
typedef struct kvt_tm_tier_stats {
	uint64_t capacity_bytes;  /* T0/T1: slots x slot bytes; T2: record space of the file */
	uint64_t used_bytes;      /* slots in use x slot bytes; T2: bytes in used extents */
	uint64_t capacity_blocks; /* T0/T1: slots; T2: uncompressed records the file holds (compressed ones take less) */
	uint64_t used_blocks;     /* slots in use; T2: records */
	uint64_t hits;            /* blocks asked for (promote/prefetch) found first in this tier */
	uint64_t misses;          /* blocks asked for that this tier did not hold */
	uint64_t n_promotions;    /* blocks copied INTO this tier from the one below */
	uint64_t promotion_bytes; /* bytes read from the lower tier for them */
	double promotion_s;       /* wall seconds spent on them */
	uint64_t n_demotions;     /* blocks copied OUT of this tier to the one below */
	uint64_t demotion_bytes;  /* bytes written to the lower tier for them */
	double demotion_s;        /* wall seconds spent on them */
	uint64_t n_evictions;     /* blocks that left this tier to make room (demoted or dropped) */
	uint64_t n_dropped;       /* of those, blocks that left every tier (lost from the cache) */
	uint64_t n_evictions_by_kind[KVT_BLOCK_KIND_COUNT]; /* n_evictions by the block's kind (enum kvt_block_kind) */
	uint64_t n_blocks_by_kind[KVT_BLOCK_KIND_COUNT];    /* blocks the table has present in the tier now, by kind
	                                                       (local tiers only; see "Chunk share") */
	double compression_ratio; /* fp16 bytes / bytes held (T1: codec; T2: codec and LZ4) */
	uint64_t n_corrupt;       /* records that failed verification (T2) */
	bool degraded;            /* T2: full, read-only, or its index rolling back for lack of space: not persisting */
} kvt_tm_tier_stats;

/*
 * Why a prompt missed the cache (kvt_tm_miss_explain): the reason for the
 * first prompt token not served from it.
 */
enum kvt_tm_miss_reason {
	KVT_TM_MISS_NONE = 0,       /* a full hit: nothing to explain */
	KVT_TM_MISS_NEW,            /* the prefix was never stored for this tenant (or its record is forgotten) */
	KVT_TM_MISS_DIVERGED,       /* a stored history differs from the prompt from at_token on */
	KVT_TM_MISS_EVICTED,        /* stored, then evicted from its last tier under pressure */
	KVT_TM_MISS_EXPIRED,        /* stored and retained; evicted after its retention ended */
	KVT_TM_MISS_MODEL_CHANGED,  /* the session's history was stored under another model (set by the caller) */
	KVT_TM_MISS_FAILED_VERIFICATION, /* its T2 record failed verification and was dropped */
	KVT_TM_MISS_CHUNK_BOUNDARY, /* only the prompt's last partial block (never cached) is missing */
	KVT_TM_MISS_CAPACITY,       /* longer than the tiers could keep, or dropped before it could be kept */
	KVT_TM_MISS_COUNT
};
/* The pressure that evicted a block (kvt_tm_miss.pressure). */
enum kvt_tm_pressure {
	KVT_TM_PRESSURE_NONE = 0,   /* unknown */
	KVT_TM_PRESSURE_WATERMARK,  /* the tier passed its high watermark (maintenance) */
	KVT_TM_PRESSURE_ROOM,       /* a request or a promotion needed room in the tier now */
	KVT_TM_PRESSURE_COUNT
};
const char *kvt_tm_miss_reason_name(int reason); /* "new", "diverged", ... ("" for NONE) */
const char *kvt_tm_pressure_name(int pressure);  /* "watermark", "room", "unknown" */

typedef struct kvt_tm_miss {
	int reason;            /* enum kvt_tm_miss_reason */
	uint32_t at_token;     /* the first prompt token not served from the cache */
	int tier;              /* EVICTED, EXPIRED, CAPACITY, FAILED_VERIFICATION: the last tier that held it (-1: unknown) */
	uint64_t when_us;      /* when it left that tier, unix microseconds (0: unknown) */
	int pressure;          /* EVICTED: enum kvt_tm_pressure */
	int32_t cached_token;  /* DIVERGED: the stored token at at_token (-1: unknown) */
	int32_t new_token;     /* DIVERGED: the prompt's token there (-1: unknown) */
} kvt_tm_miss;

typedef struct kvt_tm_stats {
	kvt_tm_tier_stats tier[KVT_TIER_COUNT]; /* KVT_TIER_HBM, _HOST, _NVME */
	uint64_t n_registered;    /* blocks registered by the engine */
	uint64_t n_persisted;     /* blocks made durable (row committed) */
	uint64_t n_persist_failed;/* blocks a persist pass could not make durable */
	bool t2_read_only;        /* the store has turned read-only (failed fsync) */
	uint64_t n_lost;          /* blocks the index listed at start-up whose records the T2 file no longer
				     held (recreated or truncated): rows dropped, sessions recompute them */
	uint64_t n_skipped;       /* bad index rows start-up skipped (extent invalid or overlapping another row's,
				     block size, hash collision): not served, kept in the index for `kvtier fsck` */
	uint64_t n_foreign;       /* records of another namespace of this model (another block size) kept in T2 */
	uint64_t n_reclaimed;     /* of those, records reclaimed (row deleted, extent freed) to make room */
	uint64_t n_turn_late;     /* END_OF_TURN blocks made durable later than end_turn_s after their turn ended */
	double max_turn_s;        /* longest end of turn -> durable (row committed) seen, seconds */
	kvt_tm_retain_stats retain; /* retention (see "Retention" above) */
	float chunk_share;        /* cfg.chunk_share */
	/* T3 (when cfg.t3): hits/misses are blocks looked up there; n_promotions/promotion_bytes/promotion_s
	 * the blocks brought in from it; n_demotions the blocks written to it */
	bool has_remote;          /* a remote tier is configured */
	kvt_tm_tier_stats remote; /* as the local tiers (degraded, n_corrupt from t3) */
	kvt_t3_stats t3;          /* the remote tier's own counters: bytes, errors, latency */
	uint64_t n_remote_queued; /* blocks (and sessions) not yet written to T3: queued, due or not, and the batch being sent */
	uint64_t n_remote_skipped;/* blocks never written to T3: the queue was full */
	uint64_t n_remote_failed; /* blocks T3 refused (OOM, an error reply) */
	uint64_t n_layered;       /* of the T0 promotions, blocks copied layer group by layer group (kvt_tm_promote_layered) */
	uint64_t n_layered_calls; /* kvt_tm_promote_layered calls that issued their copies */
	uint64_t n_layered_failed;/* of those, calls whose copies failed (the request's blocks were given back) */
	uint64_t n_miss[KVT_TM_MISS_COUNT]; /* prompts explained by kvt_tm_miss_explain, by reason */
	uint64_t n_tombstones;    /* blocks remembered as gone (evicted, expired, dropped), of TM_TOMB_CAP at most */
} kvt_tm_stats;

typedef struct kvt_tm kvt_tm;
typedef struct kvt_tm_ticket kvt_tm_ticket;
typedef struct kvt_tm_prefix kvt_tm_prefix; /* the prefix-cache handle (below; tiers/prefix.c) */

/*
 * Create the manager: the T1 pool (t1_slots of t1_codec), the movers and
 * threads. KVT_EINVAL (logged, naming the field) for a bad config; KVT_ENOMEM /
 * KVT_EDEVICE.
 */
int kvt_tm_create(const kvt_tm_config *cfg, kvt_tm **out);
/*
 * Flush (every dirty block written to T2 when there is one), stop the
 * threads, release every slot the manager holds and clear the table's T0/T1
 * slots. NULL is a no-op. No other call may be in flight.
 */
void kvt_tm_destroy(kvt_tm *tm);
kvt_t1_pool *kvt_tm_t1(kvt_tm *tm); /* the manager's T1 pool (for tests and the stats report) */

/*
 * Start-up: rebuild state from the durable index. This is THE start-up
 * recovery (DESIGN.md §8 item 7): kvt_stack_open runs it for the daemon, and
 * the crash and power-loss trials (test_crash_index) and test_index_recovery
 * run it too; its rules are tiers/recover.c's opening comment. Marks the T2
 * extent of every row of every namespace of this model used, then inserts
 * this namespace's blocks into the table (least recently used first) as
 * present in T2 only, clean. Rows whose extent lies past
 * kvt_t2_intact_bytes (the file was recreated or truncated) are lost:
 * deleted from the index, counted (n_lost) and logged naming the file. Rows
 * of this model's other namespaces (another block size) are kept, never
 * served, and reclaimed oldest first when T2 passes its high watermark,
 * before any block of this namespace is evicted. A bad row never fails
 * start-up: a row whose extent is invalid or overlaps one an earlier row
 * claimed (or of another block size, or whose hash collides) is skipped,
 * counted (n_skipped) and logged naming the row and why; it stays in the
 * index for `kvtier fsck`. *n_blocks: the blocks loaded. Call once, before
 * anything is registered. KVT_EINVAL (no T2 store), KVT_ENOMEM, or the
 * index's error.
 */
int kvt_tm_recover(kvt_tm *tm, uint64_t *n_blocks);

/*
 * The engine computed a new full block in T0 slot t0_slot: enter it in the
 * table (dirty) and resident in T0. The manager takes its own T0 reference
 * (the engine keeps its own). If the block is already known and in T0, the
 * engine's slot is left alone (only touched). Records the compute-stream
 * event that orders later packs after the writes. KVT_ECORRUPT for a hash
 * collision (logged by the table), KVT_EINVAL, KVT_ENOMEM.
 */
int kvt_tm_register(kvt_tm *tm, const uint8_t hash[KVT_HASH_BYTES], const uint8_t parent[KVT_HASH_BYTES],
		    const int32_t *tokens, int32_t t0_slot);
/*
 * kvt_tm_register of a block of kind (enum kvt_block_kind; kvt_tm_register
 * is KVT_BLOCK_PREFIX): the kind is set before the block enters T0, so it
 * counts in its kind's share from the start, and goes into the block's index
 * row. A block the table knows takes the kind it is registered with.
 * KVT_EINVAL (no such kind, logged), and kvt_tm_register's errors.
 */
int kvt_tm_register_kind(kvt_tm *tm, const uint8_t hash[KVT_HASH_BYTES], const uint8_t parent[KVT_HASH_BYTES],
			 const int32_t *tokens, int32_t t0_slot, int kind);

/* Pin / unpin (kvt_btable_pin semantics, atomic against eviction). KVT_ENOTFOUND. */
int kvt_tm_pin(kvt_tm *tm, const uint8_t hash[KVT_HASH_BYTES]);
int kvt_tm_unpin(kvt_tm *tm, const uint8_t hash[KVT_HASH_BYTES]);

/*
 * Longest cached prefix (kvt_btable_lookup), atomic against eviction when
 * flags has KVT_BT_PIN. A full block past the matched prefix counts as a miss
 * in every tier.
 */
int kvt_tm_lookup(kvt_tm *tm, const uint8_t root[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n_tokens,
		  unsigned flags, kvt_btable_match *out, uint32_t cap, uint32_t *n_hashed, uint32_t *n_matched);
/*
 * kvt_tm_lookup over a chain the caller hashed already (hashes[0..n), the
 * blocks' tokens[0..n * block_tokens)): kvt_btable_lookup_chain, atomic
 * against eviction with KVT_BT_PIN. out[0..n) gets the matched blocks'
 * slots; *n_matched how many lead the chain.
 */
int kvt_tm_lookup_chain(kvt_tm *tm, const uint8_t (*hashes)[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n,
			unsigned flags, kvt_btable_match *out, uint32_t *n_matched);

/*
 * Bring n blocks to T0 (blocking). results[i]: KVT_OK and t0_slots[i] a T0
 * slot holding the block, with ONE T0 reference owned by the caller (put it
 * in a kvt_seq, or kvt_t0_unref it); KVT_ENOTFOUND (in no tier: a miss);
 * KVT_ECORRUPT (its T2 record failed verification: counted, its row deleted,
 * a miss); KVT_EFULL (no T0 slot could be freed). The caller should hold a
 * pin on each block for as long as it wants it to stay. Returns KVT_OK if
 * every block is in T0, else the first failure.
 */
int kvt_tm_promote(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int32_t *t0_slots,
		   int *results);

/*
 * Asynchronous promotion / prefetch: the I/O threads bring the n blocks to
 * tier (KVT_TIER_HBM or KVT_TIER_HOST). With take_refs (tier HBM only), each
 * block's T0 slot gets a caller reference, collected with
 * kvt_tm_ticket_results. Wait with kvt_tm_ticket_wait or poll with
 * kvt_tm_ticket_done; release with kvt_tm_ticket_free (which waits, and drops
 * references not collected). KVT_EINVAL, KVT_ENOMEM.
 */
int kvt_tm_submit(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int tier, bool take_refs,
		  kvt_tm_ticket **out);
/*
 * kvt_tm_submit for hashes[0, n_local) (blocks the caller found in the table),
 * then hashes[n_local, n): the chain continued (hashes[n_local]'s parent is
 * hashes[n_local - 1], or root), blocks not in the table, looked up in T3 in
 * one round. The run found from hashes[n_local] is promoted; the rest is
 * KVT_ENOTFOUND. With take_refs, a block brought in from T3 with result
 * KVT_OK also carries a pin for the caller once kvt_tm_ticket_results has
 * handed out the T0 slots (unpin it as the pins of kvt_tm_lookup);
 * kvt_tm_ticket_free drops the pins not handed out. Without T3 the remote
 * part is KVT_ENOTFOUND. KVT_EINVAL, KVT_ENOMEM.
 */
int kvt_tm_submit_remote(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], uint32_t n_local,
			 const uint8_t root[KVT_HASH_BYTES], int tier, bool take_refs, kvt_tm_ticket **out);
bool kvt_tm_has_remote(const kvt_tm *tm);
/* Queue a copy of s for T3 (no-op without T3). KVT_ENOMEM. Never waits on the network. */
int kvt_tm_remote_put_session(kvt_tm *tm, const kvt_db_session *s);
/* Read a session from T3 (within its command timeout). KVT_ENOTFOUND also without T3; see kvt_t3_get_session. */
int kvt_tm_remote_get_session(kvt_tm *tm, const char *tenant, const char *id, kvt_db_session *out);
/* Wait (up to timeout_s) until nothing due is waiting to be written to T3; true if so (tests, benchmarks). */
bool kvt_tm_remote_drain(kvt_tm *tm, double timeout_s);

/* Prefetch: kvt_tm_submit without references. */
int kvt_tm_prefetch(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int tier,
		    kvt_tm_ticket **out);
/* Block until every block of the ticket is handled; KVT_OK if all reached the tier, else the first failure. */
int kvt_tm_ticket_wait(kvt_tm *tm, kvt_tm_ticket *t);
/* Whether every block of the ticket is handled; *n_done (may be NULL) gets how many are. */
bool kvt_tm_ticket_done(kvt_tm *tm, kvt_tm_ticket *t, uint32_t *n_done);
/*
 * After the ticket is done: results[i] as kvt_tm_promote and, with
 * take_refs, t0_slots[i] (the caller now owns those references). Either
 * array may be NULL (then the references stay with the ticket and are
 * dropped by kvt_tm_ticket_free).
 */
void kvt_tm_ticket_results(kvt_tm *tm, kvt_tm_ticket *t, int32_t *t0_slots, int *results);
void kvt_tm_ticket_free(kvt_tm *tm, kvt_tm_ticket *t); /* NULL is a no-op */

/*
 * Make at least n_free T0 slots free (blocking): evicts the coldest unpinned
 * manager-held blocks, waiting (up to 10 s) for blocks other threads are
 * moving. KVT_EFULL if that is not possible (everything pinned or held by
 * sequences).
 */
int kvt_tm_reserve_t0(kvt_tm *tm, uint32_t n_free);

/*
 * End of a turn: the blocks registered since the last call become due for
 * write-through (END_OF_TURN: within end_turn_s; WRITE_BACK: nothing).
 */
void kvt_tm_end_turn(kvt_tm *tm);
/*
 * Told how far a turn's chain is durable: its first n_durable blocks have
 * their bytes in T2 and their rows committed. rc KVT_OK, or KVT_ESTOPPED when
 * the manager is being destroyed (n_durable is still right). Runs on the
 * maintenance thread, the destroying thread, or inside kvt_tm_end_turn_chain;
 * it must not call back into the manager.
 */
typedef void (*kvt_tm_durable_fn)(void *user, int rc, uint32_t n_durable);
/*
 * End of one request's turn: of the blocks registered and not yet durable,
 * those of its chain (hashes[0..n)) become due for write-through (and, with
 * T3 WRITE_THROUGH, for T3); other requests' blocks are left as they are.
 * done (may be NULL) is called exactly once when the call returns KVT_OK:
 * after the first maintenance pass that finds none of the chain's blocks
 * pending any more (END_OF_TURN; a block kept for a full T2 keeps it
 * waiting, up to TM_MAX_TURN_WAITS turns), else at once, with what is
 * durable then. KVT_OK; KVT_ENOMEM (nothing marked and done not called: the
 * blocks still go at flush, eviction or the next end of turn that names them).
 */
int kvt_tm_end_turn_chain(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], kvt_tm_durable_fn done,
			  void *user);
/* Leading blocks of hashes[0..n) durable in T2 now (bytes written, rows committed). Neither pins nor counts. */
uint32_t kvt_tm_durable_prefix(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES]);

/*
 * Make every block registered so far durable on T2 (row committed) and wait.
 * KVT_OK; KVT_EFULL (T2 is full: some blocks stay volatile), KVT_EIO (the
 * store is read-only or the index failed), KVT_EUNSUPPORTED (no T2).
 */
int kvt_tm_flush(kvt_tm *tm);

/* Run one maintenance pass now, on the caller's thread (tests; the thread runs it anyway). */
void kvt_tm_maintain(kvt_tm *tm);

void kvt_tm_get_stats(kvt_tm *tm, kvt_tm_stats *st);

/* ---- retention (see the file comment) ---- */

/* Set a tenant's quota; tenant "*" (or NULL) sets the default of every tenant not set by name. KVT_EINVAL. */
int kvt_tm_set_quota(kvt_tm *tm, const char *tenant, const kvt_tm_quota *q);
/*
 * Retain the chain hashes[0..n) (block 0 first) of tenant for ttl_us, floor
 * tier floor (KVT_TIER_*). Blocks not in the table end the chain (counted as
 * denied). Deadlines are extended, never shortened; a stronger floor wins.
 * *res says how many were new, kept, denied. KVT_EINVAL (logged), KVT_ENOMEM.
 */
int kvt_tm_retain(kvt_tm *tm, const char *tenant, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES],
		  uint64_t ttl_us, int floor, kvt_tm_retain_result *res);
/* A hit on the prefix hashes[0..n): restart the TTL of its retained blocks; returns how many leading blocks are retained. */
uint32_t kvt_tm_retain_refresh(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES]);
/* End the retention of these blocks (a deleted session's); returns how many were retained. */
uint32_t kvt_tm_release(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES]);
/* Whether the block is retained now; *out filled when it is. */
bool kvt_tm_get_retention(kvt_tm *tm, const uint8_t hash[KVT_HASH_BYTES], kvt_tm_retention *out);
/* Per-tenant counters: up to cap into out, *n_out = how many tenants there are. */
void kvt_tm_get_tenants(kvt_tm *tm, kvt_tm_tenant_stats *out, uint32_t cap, uint32_t *n_out);

/* Walk the manager's invariants against the table and the pools (tests, debug). KVT_ECORRUPT (logged). */
int kvt_tm_check(kvt_tm *tm);

/* ---- layer-wise promotion from T1 (see tiers/README.md, "Layer-wise promotion") ---- */

/*
 * A resumed prefix whose blocks are in T1 is brought to T0 one layer group at
 * a time: the copies (and, for an 8-bit T1, the unpack into the fp16 pool) of
 * layers [0, G) of every block, then [G, 2G), ..., are issued on the
 * manager's layered stream, and an event is recorded after each group. The
 * caller gets the T0 slots at once and passes the events to the forward pass
 * (kvt_model_forward_gated): its layer l waits for group l / G on the device,
 * so the prefill of the new tokens runs over the early layers while the late
 * ones are still on the bus, and a resume costs about max(copy, compute)
 * instead of their sum.
 *
 * Groups: n_groups is what the caller asks for; the groups are equal, of G
 * layers, G the smallest divisor of n_layers that is >= ceil(n_layers /
 * n_groups) (kvt_tm_layered_groups says what was chosen).
 *
 * Invariants, as kvt_tm_promote's: every block is busy-held from the call to
 * kvt_tm_layered_finish (so nothing else moves or evicts it, and another
 * promotion of it waits); its T1 slot carries an extra reference meanwhile;
 * the table names the new T0 slot only at finish, once the copies are known
 * to have completed, so no one else reads a slot still being filled. Blocks
 * already in T0 are taken as they are (no copy). One layered promotion is in
 * flight at a time per manager.
 */
typedef struct kvt_tm_layered kvt_tm_layered;

/*
 * Start the layered promotion of the n blocks (a chain, in order; the caller
 * holds a pin on each, as for kvt_tm_promote). Every block must be in T0 or
 * T1: otherwise KVT_ENOTFOUND and nothing is done (use kvt_tm_submit, which
 * also reads T2). On KVT_OK, t0_slots[i] is a T0 slot with ONE reference
 * owned by the caller, whose bytes are valid for layer group g once event g
 * has completed, and *out is the promotion in flight; the caller must call
 * kvt_tm_layered_finish after the work that reads the slots has been issued
 * (and before it drops the references). KVT_EBUSY: another layered promotion
 * is in flight, or another thread is moving one of the blocks (nothing done:
 * use the sequential path); KVT_EFULL: not enough T0 slots could be freed;
 * KVT_EINVAL, KVT_ENOMEM; a failed copy (KVT_EDEVICE, ...) fails the call
 * cleanly: every slot and reference it took is given back, the table is
 * unchanged. Call on the thread that drives the compute stream.
 */
int kvt_tm_promote_layered(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], uint32_t n_groups,
			   int32_t *t0_slots, kvt_tm_layered **out);
/* The promotion's groups: *n_groups events (borrowed; valid until finish), layers_per_group layers each. */
void kvt_tm_layered_groups(const kvt_tm_layered *p, kvt_event *const **events, uint32_t *n_groups,
			   uint32_t *layers_per_group);
/* Blocks of the promotion that are being copied (the others were in T0). */
uint32_t kvt_tm_layered_n_copied(const kvt_tm_layered *p);
/*
 * Wait for the copies, enter the new T0 slots in the table (the manager's
 * own references), count the promotions and release the blocks; frees p.
 * KVT_OK; else the copies failed (KVT_EDEVICE): the copied blocks stay in
 * T1 only, and the caller's slots hold no valid K/V — it must drop them and
 * discard what it computed from them. NULL is a no-op (KVT_OK).
 */
int kvt_tm_layered_finish(kvt_tm *tm, kvt_tm_layered *p);

/* ---- the prefix-cache handle (tiers/prefix.c) ---- */

/*
 * The one seam between the scheduler and the tiers. The scheduler hashes a
 * request's full blocks once and hands the chain to kvt_tm_prefix_acquire;
 * the manager looks it up (pinning it), continues a local miss in T3, and
 * itself chooses how the blocks come up:
 *
 *   NONE     nothing cached: the handle holds nothing, the caller prefills all;
 *   READY    every block was in T0 (or the asynchronous path could not be
 *            taken): brought up before acquire returns;
 *   LAYERED  every block in T0/T1 and layer_groups > 0: the T0 slots are
 *            handed at once, their copies run layer group by layer group and
 *            the first forward waits per group (kvt_tm_prefix_gate), settled
 *            after it (kvt_tm_prefix_settle);
 *   ASYNC    the I/O threads bring the blocks up from T1/T2: poll
 *            kvt_tm_prefix_ready (or kvt_tm_prefix_wait) before take;
 *   REMOTE   as ASYNC, the chain continued in T3.
 *
 * A SERVE handle (a request's prefix) ends in T0 slots with one reference
 * each for the caller's sequence (kvt_tm_prefix_take); the handle keeps the
 * served blocks pinned until kvt_tm_prefix_release. A WARM handle (a resumed
 * session) pins nothing and takes no references: the blocks go to T0 as far
 * as it has room and the rest to T1. Every handle counts what it served by
 * the tier each block was found in, and the bytes read for it by source
 * tier, its own figures whatever else moves at the same time
 * (kvt_tm_prefix_get_counts).
 *
 *            acquire --> NONE / READY ---------------------.
 *               |                                          v
 *               +--> ASYNC / REMOTE --ready?--> take --> [serve] --> release
 *               '--> LAYERED --> take --> gate --> settle ---^
 *
 * Threads: SERVE handles belong to the thread that drives the compute stream
 * (acquire, take, gate, settle, release all on it); WARM handles may be used
 * from any thread. NOTE: a READY acquire waits for blocks another handle's
 * layered promotion holds: it settles that promotion first, and the other
 * handle's next kvt_tm_prefix_settle returns the result.
 */
enum kvt_tm_prefix_use {
	KVT_TM_PREFIX_SERVE = 0, /* a request's prefix: to T0, pinned, T0 references for the caller */
	KVT_TM_PREFIX_WARM = 1,  /* a resumed session: T0 as far as it has room, the rest T1; no pins, no references */
};

enum kvt_tm_prefix_path {
	KVT_TM_PREFIX_NONE = 0,    /* nothing cached */
	KVT_TM_PREFIX_READY = 1,   /* up before acquire returned */
	KVT_TM_PREFIX_LAYERED = 2, /* T0/T1, layer group by layer group */
	KVT_TM_PREFIX_ASYNC = 3,   /* the I/O threads, from T1/T2 */
	KVT_TM_PREFIX_REMOTE = 4,  /* the I/O threads, the chain continued in T3 */
};

typedef struct kvt_tm_prefix_req {
	int use;                                 /* enum kvt_tm_prefix_use */
	const uint8_t (*hashes)[KVT_HASH_BYTES]; /* [n] the chain of full blocks (copied) */
	const int32_t *tokens;                   /* [n * block_tokens] their tokens (the lookup's collision check) */
	uint32_t n;                              /* blocks of the chain */
	const uint8_t *root;                     /* parent of hashes[0]: a miss continues in T3 (when there is one);
	                                            NULL: no T3 continuation */
	bool t0_only;                            /* SERVE: only the leading blocks already in T0 (no promotion) */
	bool refresh;                            /* SERVE: the served blocks are a hit (their retention TTL restarts) */
	uint32_t layer_groups;                   /* SERVE: > 0, a prefix all in T0/T1 comes up in this many groups */
} kvt_tm_prefix_req;

typedef struct kvt_tm_prefix_counts {
	int path;                             /* enum kvt_tm_prefix_path */
	uint32_t n_matched;                   /* leading blocks the table knew */
	uint32_t n_usable;                    /* leading blocks being brought up (those in some tier, and T3's) */
	uint32_t n_served;                    /* once taken (SERVE) or waited for (WARM): leading blocks that arrived */
	uint32_t blocks_from[KVT_TM_N_TIERS]; /* of the served blocks, by the tier each was found in (and T3) */
	uint64_t bytes_from[KVT_TM_N_TIERS];  /* bytes read for this handle, by source tier: T2 records, T1 slots
	                                         copied into T0, T3 records */
	uint32_t n_retained;                  /* SERVE with refresh: leading served blocks that are retained */
	uint32_t n_lossy;                     /* of the served blocks, those whose K/V came through an 8-bit copy
	                                         (found in T1/T2/T3 with an FP8/INT8 codec, or in T0 unpacked from one) */
} kvt_tm_prefix_counts;

/*
 * Look the chain up and start bringing it up (see above). *out is a handle
 * even when nothing is cached (path NONE). KVT_EINVAL (logged), KVT_ENOMEM.
 */
int kvt_tm_prefix_acquire(kvt_tm *tm, const kvt_tm_prefix_req *r, kvt_tm_prefix **out);
/* Whether the blocks are up (take may be called); never waits. */
bool kvt_tm_prefix_ready(kvt_tm *tm, kvt_tm_prefix *p);
/*
 * Wait until the blocks are up, calling progress(user, done, total) (may be
 * NULL) as they arrive; a WARM handle then brings what T0 had no room for to
 * T1. Returns KVT_OK.
 */
int kvt_tm_prefix_wait(kvt_tm *tm, kvt_tm_prefix *p, void (*progress)(void *user, uint32_t done, uint32_t total),
		       void *user);
/*
 * SERVE, once ready: t0_slots[0..k) get the leading blocks that reached T0,
 * each with ONE reference the caller owns (a kvt_seq's); the blocks after the
 * first failure are let go (logged). Returns k; the handle keeps their pins.
 */
uint32_t kvt_tm_prefix_take(kvt_tm *tm, kvt_tm_prefix *p, int32_t *t0_slots);
/*
 * LAYERED, before settle: the events the forward's layer l waits for (group
 * l / layers_per_group); false when the forward need not wait (any other path,
 * or settled).
 */
bool kvt_tm_prefix_gate(const kvt_tm_prefix *p, kvt_event *const **events, uint32_t *n_groups,
			uint32_t *layers_per_group);
/*
 * After the work reading the slots has been issued: wait for a layered
 * promotion's copies and enter its blocks in T0. KVT_OK (also for any other
 * path, and when settled before); else the copies failed: the slots hold no
 * valid K/V, the caller must drop them and what it computed from them.
 */
int kvt_tm_prefix_settle(kvt_tm *tm, kvt_tm_prefix *p);
void kvt_tm_prefix_get_counts(kvt_tm *tm, const kvt_tm_prefix *p, kvt_tm_prefix_counts *c);
/*
 * Explain a prompt's cache miss (docs/http-api.md, usage.kvtier.miss): the
 * prompt's tokens[0..n_tokens) with the hashes of its full blocks (chained
 * from root: hashes[i] names tokens [i*B, (i+1)*B)), of which the first
 * n_cached tokens were served from the cache. Fills *out (reason NONE on a
 * full hit); the caller counts the reason it reports (kvt_tm_miss_count). The manager
 * remembers the blocks that left their last tier (evicted, expired, dropped
 * for lack of room, failed verification) in a bounded in-memory map, oldest
 * forgotten first, not across a restart; a stored history that differs is
 * found through the table's children of the last block served (so only the
 * same tenant's blocks: their hashes are salted). Never fails.
 */
void kvt_tm_miss_explain(kvt_tm *tm, const uint8_t root[KVT_HASH_BYTES], const uint8_t (*hashes)[KVT_HASH_BYTES],
			 const int32_t *tokens, uint32_t n_tokens, uint32_t n_cached, kvt_tm_miss *out);
/* Count a reported miss reason (kvt_tm_stats.n_miss): once per prompt, the reason the caller settled on. */
void kvt_tm_miss_count(kvt_tm *tm, int reason);
/*
 * Where a chain's blocks are now, without pinning, touching or counting
 * anything (a session listing): blocks_in[t] of the leading blocks in some
 * tier, by the highest tier holding each; *n_usable how many lead the chain.
 * KVT_OK, KVT_ENOMEM.
 */
int kvt_tm_locate(kvt_tm *tm, const uint8_t (*hashes)[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n,
		  uint32_t blocks_in[KVT_TIER_COUNT], uint32_t *n_usable);
/*
 * Settle, wait for what is in flight, unpin, drop references not taken, free.
 * Returns kvt_tm_prefix_settle's result. NULL is a no-op (KVT_OK).
 */
int kvt_tm_prefix_release(kvt_tm *tm, kvt_tm_prefix *p);

/* ---- snapshots (tiers/tm_snapshot.c): blocks out as records, records back in ---- */

/*
 * Block h as a self-checking record: the T2 record format (t2_store.h),
 * uncompressed, without padding, sealed for offset 0 with model_fp. Its bytes
 * come from T1, T0 (packed) or T2, whichever holds it. *rec_out malloc'd
 * (free()), *n_out its bytes (at most kvt_tm_record_max_bytes). KVT_OK;
 * KVT_ENOTFOUND (in no local tier); T2's read errors; KVT_ENOMEM. Any thread.
 */
int kvt_tm_block_export(kvt_tm *tm, const uint8_t model_fp[KVT_HASH_BYTES], const uint8_t h[KVT_HASH_BYTES],
			uint8_t **rec_out, size_t *n_out);
/*
 * A record (kvt_tm_block_export's) back into the tiers as block h with parent
 * (this node's chain over the same tokens: the record's own hash may be
 * another secret's or tenant's). It must verify (checksum, model_fp), fit
 * this manager (codec, scale layout, bytes, block_tokens) and hold tokens
 * [n_tokens]. A block the table already has is left as it is (KVT_OK);
 * otherwise it enters T1, dirty and pending like a registered block (an end
 * of turn over its chain writes it through to T2). KVT_OK; KVT_ECORRUPT (does
 * not verify) or KVT_EINVAL (does not fit), *why saying which check; KVT_EFULL
 * (no T1 slot); KVT_ENOMEM. Any thread.
 */
int kvt_tm_block_import(kvt_tm *tm, const uint8_t model_fp[KVT_HASH_BYTES], const uint8_t *rec, size_t n,
			const uint8_t h[KVT_HASH_BYTES], const uint8_t parent[KVT_HASH_BYTES], const int32_t *tokens,
			uint32_t n_tokens, const char **why);
/* The most bytes one exported record has. */
size_t kvt_tm_record_max_bytes(const kvt_tm *tm);

#endif
