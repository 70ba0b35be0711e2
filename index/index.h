/*
 * index/index.h — the index module's one public header: block hashing, the
 * in-memory block table (the hot path), and the SQLite mirror (the durable
 * index) with its recovery helpers. DESIGN.md §2 and §4.
 *
 * Dependencies: core only (no device code, no tiers). The NVMe location of a
 * block is described here by kvt_nvme_loc, field for field the same as the T2
 * store's kvt_t2_loc (tiers/t2_store.h), so tiers/ converts with a plain
 * member copy and index/ never includes tiers/.
 *
 * Hashing
 *   root = SHA-256( F("kvtier-root-v1") F(model_fp[32]) F(u32 layout_version)
 *                   F(u32 block_tokens) F(salt[32]) )
 *   h_i  = SHA-256( F(h_{i-1}[32]) F(tokens of full block i, int32 LE) )
 * where F(x) = u32 LE byte length of x, then x. Only full blocks are hashed.
 * A hit is always verified token for token against the block's stored ids, so
 * even a forced hash collision never serves a wrong block.
 *
 * Names: session ids and tenant names are checked with kvt_name_check
 * (charset [A-Za-z0-9._-], 1..128 bytes, no leading '.'). Nothing from a
 * request ever becomes a path: file names come from kvt_index_paths only.
 */
#ifndef KVT_INDEX_H
#define KVT_INDEX_H

#include "kvt.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ------------------------------------------------------------------------ */
/* Constants                                                                */
/* ------------------------------------------------------------------------ */

#define KVT_HASH_BYTES 32          /* SHA-256 */
#define KVT_BLOCK_MAX_TOKENS 256   /* same bound as the T2 record (KVT_T2_MAX_TOKENS) */
#define KVT_KV_LAYOUT_VERSION 1    /* bump when the block record layout changes */
#define KVT_NAME_MAX 128           /* longest session id / tenant name, bytes */
#define KVT_DB_OWNER_BYTES 16      /* an index's identity (meta.owner_id), recorded in its T2 file */

/* File names inside a data directory; the daemon and the CLI use these. */
#define KVT_DATA_T2_FILE "kvtier.t2"         /* the T2 (NVMe) store */
#define KVT_DATA_INDEX_FILE "index.sqlite"   /* the SQLite index */
#define KVT_DATA_SESSIONS_FILE "sessions.journal" /* every session write, beside the T2 file (index/journal.c) */
#define KVT_DATA_RESERVE_FILE "index.reserve" /* disk space kept for session rows (kvt_db_config.reserve_path) */
#define KVT_DATA_LOCK_FILE "kvtier.lock"     /* the directory's lock (index/datadir.c) */

/* ------------------------------------------------------------------------ */
/* Block hashing (index/blockhash.c)                                        */
/* ------------------------------------------------------------------------ */

/*
 * The root of every chain for one (model, layout, block size, tenant).
 * block_tokens must be in 1..KVT_BLOCK_MAX_TOKENS (else KVT_EINVAL, logged).
 * KVT_EIO if libcrypto fails (logged). Thread-safe.
 */
int kvt_hash_root(const uint8_t model_fp[KVT_HASH_BYTES], uint32_t layout_version,
		  uint32_t block_tokens, const uint8_t salt[KVT_HASH_BYTES],
		  uint8_t out[KVT_HASH_BYTES]);

/*
 * One chain step: out = H(parent, tokens[0..n_tokens)). n_tokens must be in
 * 1..KVT_BLOCK_MAX_TOKENS. out may alias parent. Thread-safe.
 */
int kvt_hash_block(const uint8_t parent[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n_tokens,
		   uint8_t out[KVT_HASH_BYTES]);

/*
 * The chained hashes of every full block of tokens[0..n_tokens), at most
 * cap of them: out[i] = hash of block i. *n_out = min(n_tokens /
 * block_tokens, cap). Thread-safe.
 */
int kvt_hash_chain(const uint8_t root[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n_tokens,
		   uint32_t block_tokens, uint8_t (*out)[KVT_HASH_BYTES], uint32_t cap,
		   uint32_t *n_out);

/*
 * A tenant's salt: HMAC-SHA256(server secret, tenant name). Server side only:
 * the secret never leaves the daemon, so a client cannot aim at another
 * tenant's chain. The tenant name must pass kvt_name_check (else KVT_EINVAL);
 * secret_bytes must be >= 16 (else KVT_EINVAL). Thread-safe.
 */
int kvt_tenant_salt(const uint8_t *secret, size_t secret_bytes, const char *tenant,
		    uint8_t out[KVT_HASH_BYTES]);

/*
 * Validate a session id or tenant name: 1..KVT_NAME_MAX bytes of
 * [A-Za-z0-9._-], not starting with '.'. KVT_OK, or KVT_EINVAL with a log
 * line "<what> "...": <reason>" (what = "session id", "tenant", ...).
 * kvt_name_valid is the silent predicate.
 */
int kvt_name_check(const char *what, const char *name);
bool kvt_name_valid(const char *name);

/* Lowercase hex of a hash (65 bytes with the NUL), for log lines. */
void kvt_hash_hex(const uint8_t h[KVT_HASH_BYTES], char out[2 * KVT_HASH_BYTES + 1]);

/* ------------------------------------------------------------------------ */
/* The in-memory block table (index/btable.c)                               */
/* ------------------------------------------------------------------------ */

/*
 * One entry per known full block, keyed by its chained hash. It records the
 * block's parent hash and token ids, which tiers hold a copy (a slot per
 * tier), pins, LRU state and a dirty flag. The tiering manager owns policy;
 * the table only keeps state consistent and answers queries.
 *
 * Parent links: an entry whose parent hash is itself an entry is its child;
 * otherwise (the first block of a chain, whose parent is a root hash, or a
 * block whose parent is not in the table) it has no parent in the table.
 * Links do not depend on insertion order: inserting a block links the
 * entries already waiting for it as its children. Each entry counts its
 * children (n_children) and, per tier, its children present in that tier; an
 * entry is a *leaf in tier t* when no child is present in t.
 *
 * LRU: a global tick advances on every touch. Per tier, the entries present
 * in the tier sit on one of two lists (leaves, inner) ordered by last-use
 * tick, so kvt_btable_coldest takes leaves from the cold end in O(N + pinned
 * leaves skipped).
 *
 * Kinds: every entry has a kind (enum kvt_block_kind): a prefix block (a
 * block of a conversation's chain, the default) or a chunk block (a block
 * of a document span, named under a tenant's chunk root; DESIGN.md §2). The
 * table keeps, per tier, exact counts of the present entries of each kind
 * (kvt_btable_stats.n_in_tier_kind) and can offer one kind's coldest leaves
 * (kvt_btable_coldest_kind), so the tiering manager can hold each kind to
 * its share of a tier. A kind is set with kvt_btable_set_kind, at or after
 * insertion; the index row keeps it (kvt_db_block_row.kind).
 *
 * Thread rules: one mutex; every call is safe from any thread. Nothing here
 * does I/O; the lookup hashes outside the lock.
 */

enum kvt_tier {
	KVT_TIER_HBM = 0,  /* T0, device pool slot */
	KVT_TIER_HOST = 1, /* T1, pinned host pool slot */
	KVT_TIER_NVME = 2, /* T2, a record in the NVMe store (see kvt_nvme_loc) */
	KVT_TIER_COUNT
};

/* What a block is for; its own accounting in every tier. */
enum kvt_block_kind {
	KVT_BLOCK_ANY = -1,   /* queries only (kvt_btable_coldest_kind): every kind */
	KVT_BLOCK_PREFIX = 0, /* a block of a prefix chain (a conversation); the default */
	KVT_BLOCK_CHUNK = 1,  /* a block of a document span, stored under a chunk root (chunk reuse) */
	KVT_BLOCK_KIND_COUNT
};

/* Where a block's record lives in the T2 store: the same fields as kvt_t2_loc. */
typedef struct kvt_nvme_loc {
	uint64_t off;          /* byte offset of the record in the T2 file */
	uint32_t extent_bytes; /* bytes reserved for it (4 KiB multiple) */
	uint32_t stored_bytes; /* bytes of payload as stored (after codec) */
	uint64_t generation;   /* write generation, seeds the checksum */
	uint64_t checksum;     /* XXH3 over header and payload */
	uint8_t compressed;    /* 1 if the payload is LZ4-compressed */
} kvt_nvme_loc;

typedef struct kvt_btable kvt_btable;

/* A snapshot copy of one entry (kvt_btable_get). */
typedef struct kvt_btable_entry {
	uint8_t hash[KVT_HASH_BYTES];   /* this block's chained hash */
	uint8_t parent[KVT_HASH_BYTES]; /* parent block's hash, or the chain root */
	bool has_parent;                /* parent is an entry of the table */
	uint32_t n_tokens;              /* = the table's block_tokens */
	int32_t tokens[KVT_BLOCK_MAX_TOKENS]; /* [n_tokens] token ids of this block */
	int32_t slot[KVT_TIER_COUNT];   /* slot per tier, -1 when absent; NVMe: 0 when present */
	kvt_nvme_loc nvme;              /* valid when slot[KVT_TIER_NVME] >= 0 */
	uint32_t pins;                  /* holders; a pinned entry is never returned by coldest or removed */
	uint64_t last_use;              /* table tick of the last touch (larger = more recent) */
	uint64_t hits;                  /* lookups that matched this block */
	bool dirty;                     /* not yet durable on NVMe (no committed index row) */
	bool t0_lossy;                  /* the T0 copy was unpacked from an 8-bit (FP8/INT8) record, not computed */
	uint64_t retain_until_us;       /* retention deadline, unix microseconds (0: not retained) */
	int retain_floor;               /* while retained: never offered by coldest_at for this tier or below */
	int kind;                       /* enum kvt_block_kind */
	uint32_t n_children;            /* entries whose parent is this one */
	uint32_t n_children_in[KVT_TIER_COUNT]; /* of those, how many are present in each tier */
} kvt_btable_entry;

/* One matched block of a prefix lookup. */
typedef struct kvt_btable_match {
	uint8_t hash[KVT_HASH_BYTES]; /* block hash (filled for every full block hashed, matched or not) */
	int32_t slot[KVT_TIER_COUNT]; /* slot per tier at lookup time, -1 when absent */
	kvt_nvme_loc nvme;            /* valid when slot[KVT_TIER_NVME] >= 0 */
	bool t0_lossy;                /* the T0 copy (slot[KVT_TIER_HBM] >= 0) came from an 8-bit record */
} kvt_btable_match;

/* Lookup flags. */
enum {
	KVT_BT_PIN = 1u << 0,   /* pin every matched block (same lock as the match: atomic) */
	KVT_BT_TOUCH = 1u << 1, /* touch every matched block (LRU, hit count) */
};

typedef struct kvt_btable_stats {
	uint64_t n_entries;                 /* entries in the table */
	uint64_t n_in_tier[KVT_TIER_COUNT]; /* entries present per tier */
	uint64_t n_in_tier_kind[KVT_TIER_COUNT][KVT_BLOCK_KIND_COUNT]; /* of those, by kind (sums to n_in_tier) */
	uint64_t n_pinned;                  /* entries with pins > 0 */
	uint64_t n_dirty;                   /* entries with dirty set */
	uint64_t n_lookups;                 /* kvt_btable_lookup calls */
	uint64_t n_hit_blocks;              /* blocks matched over all lookups */
	uint64_t n_collisions;              /* same hash, different tokens (insert or lookup) */
} kvt_btable_stats;

/*
 * Create an empty table for blocks of block_tokens tokens (1..256).
 * expect_entries sizes the hash table up front (0 = small; it grows).
 * KVT_EINVAL / KVT_ENOMEM.
 */
int kvt_btable_create(uint32_t block_tokens, uint32_t expect_entries, kvt_btable **out);
void kvt_btable_destroy(kvt_btable *bt); /* NULL is a no-op */
uint32_t kvt_btable_block_tokens(const kvt_btable *bt);

/*
 * Insert a block (present in no tier, unpinned, dirty, kind
 * KVT_BLOCK_PREFIX, last_use = a new tick). parent: its parent hash (the chain root for the first block); if
 * that hash is an entry, the new entry becomes its child, and entries already
 * in the table whose parent hash is this block's hash become the new entry's
 * children (any insertion order gives the same links). tokens: block_tokens
 * ids. Idempotent: an existing entry with the same tokens is left as it is
 * (*created = false); with different tokens it is a collision: KVT_ECORRUPT
 * (logged, counted), the entry is untouched and never a hit for those tokens.
 * created may be NULL. KVT_ENOMEM.
 */
int kvt_btable_insert(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES],
		      const uint8_t parent[KVT_HASH_BYTES], const int32_t *tokens, bool *created);

/* Copy one entry into *out. KVT_ENOTFOUND (not logged) when absent. */
int kvt_btable_get(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], kvt_btable_entry *out);

/*
 * Record that tier (KVT_TIER_HBM or KVT_TIER_HOST) holds the block in slot
 * (>= 0), replacing any previous slot of that tier. Joins that tier's LRU by
 * its last-use tick and updates the parent's per-tier child count. A T0
 * slot set this way holds computed K/V (t0_lossy false).
 * KVT_ENOTFOUND / KVT_EINVAL (bad tier or slot, logged).
 */
int kvt_btable_set_slot(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], int tier, int32_t slot);
/* kvt_btable_set_slot(KVT_TIER_HBM) for a T0 copy unpacked from a record of codec lossy (t0_lossy). */
int kvt_btable_set_t0_unpacked(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], int32_t slot, bool lossy);

/*
 * Record that the block is durable in T2 at *loc (call once its index row has
 * committed): slot[KVT_TIER_NVME] = 0, nvme = *loc, dirty = false.
 * KVT_ENOTFOUND.
 */
int kvt_btable_set_nvme(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], const kvt_nvme_loc *loc);

/*
 * The block left tier (any tier): slot = -1, off that tier's LRU, parent's
 * count updated. *old_slot (may be NULL) gets the previous slot (-1 if it was
 * absent), *old_loc (may be NULL) the previous NVMe location when tier is
 * NVMe. Clearing NVMe sets dirty again. KVT_ENOTFOUND / KVT_EINVAL.
 */
int kvt_btable_clear_slot(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], int tier,
			  int32_t *old_slot, kvt_nvme_loc *old_loc);

/* Set or clear the dirty flag explicitly. KVT_ENOTFOUND. */
int kvt_btable_set_dirty(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], bool dirty);

/*
 * Set the entry's kind (KVT_BLOCK_PREFIX or KVT_BLOCK_CHUNK): at insertion
 * (before the entry enters a tier), or later, when it moves to the new kind's
 * lists in every tier it is in (by its tick: its LRU position is kept) and
 * the per-kind counts follow. The same kind again changes nothing.
 * KVT_ENOTFOUND, KVT_EINVAL (no such kind, logged).
 */
int kvt_btable_set_kind(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], int kind);

/*
 * Pin / unpin one entry (a holder count). Each successful pin gets exactly one
 * unpin; unpinning an unpinned entry is a programmer error (KVT_ASSERT).
 * KVT_ENOTFOUND.
 */
int kvt_btable_pin(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES]);
int kvt_btable_unpin(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES]);
/* Unpin n entries (e.g. the matches of a pinned lookup); absent ones are skipped. */
void kvt_btable_unpin_n(kvt_btable *bt, const uint8_t (*hashes)[KVT_HASH_BYTES], uint32_t n);

/* Mark a use: new tick, hit count + 1, hot end of every tier's LRU it is in. KVT_ENOTFOUND. */
int kvt_btable_touch(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES]);

/*
 * Longest cached prefix of tokens[0..n_tokens) under chain root `root`.
 * Hashes every full block (at most cap), fills out[i].hash for each of them
 * (*n_hashed), then walks the chain under the lock: block i matches when its
 * hash is an entry, the entry's tokens equal the query's, and block i-1
 * matched. It stops at the first miss. out[i].slot/nvme are filled for the
 * *n_matched matched blocks. A hash hit with different tokens is a collision:
 * logged, counted, and the match stops there (never served).
 * flags: KVT_BT_PIN pins the matched blocks in the same critical section
 * (release with kvt_btable_unpin_n); KVT_BT_TOUCH touches them.
 * A block in no tier still matches (its metadata is known; the caller sees
 * all slots -1 and stops there if it needs bytes).
 */
int kvt_btable_lookup(kvt_btable *bt, const uint8_t root[KVT_HASH_BYTES], const int32_t *tokens,
		      uint32_t n_tokens, unsigned flags, kvt_btable_match *out, uint32_t cap,
		      uint32_t *n_hashed, uint32_t *n_matched);
/*
 * kvt_btable_lookup over a chain the caller hashed already: hashes[0..n) are
 * the chain's block hashes (as kvt_hash_chain gives them), tokens[0..n *
 * block_tokens) their tokens. The same walk, flags and collision check;
 * out[i] (hash included) is filled for the *n_matched matched blocks.
 */
int kvt_btable_lookup_chain(kvt_btable *bt, const uint8_t (*hashes)[KVT_HASH_BYTES], const int32_t *tokens,
			    uint32_t n, unsigned flags, kvt_btable_match *out, uint32_t *n_matched);

/*
 * Up to cap eviction candidates of tier, coldest first: entries present in the
 * tier, unpinned, and leaves in that tier (no child present in it). Parents
 * are never offered before their children. Writes hashes to out, count to
 * *n_out. O(cap + pinned leaves skipped).
 */
int kvt_btable_coldest(kvt_btable *bt, int tier, uint32_t cap, uint8_t (*out)[KVT_HASH_BYTES],
		       uint32_t *n_out);
/*
 * The same, honouring retention: an entry retained at now_us (retain_until_us
 * > now_us) is skipped in its floor tier and every tier below it (slower),
 * like a pinned one; so a retained leaf also keeps its parents (they are not
 * leaves while it is present). kvt_btable_coldest ignores retention (shutdown
 * releases everything).
 */
int kvt_btable_coldest_at(kvt_btable *bt, int tier, uint64_t now_us, uint32_t cap,
			  uint8_t (*out)[KVT_HASH_BYTES], uint32_t *n_out);
/*
 * kvt_btable_coldest_at restricted to one kind (KVT_BLOCK_PREFIX or
 * KVT_BLOCK_CHUNK): that kind's unpinned, unretained leaves, coldest first,
 * in O(cap + skipped) whatever the other kind holds. KVT_BLOCK_ANY is
 * kvt_btable_coldest_at. NOTE: "leaf" is tier-wide: a block whose child of
 * the other kind is present in the tier is not offered (chains do not mix
 * kinds in practice: a chunk chain starts at a chunk root). KVT_EINVAL
 * (bad tier or kind, logged).
 */
int kvt_btable_coldest_kind(kvt_btable *bt, int tier, int kind, uint64_t now_us, uint32_t cap,
			    uint8_t (*out)[KVT_HASH_BYTES], uint32_t *n_out);

/*
 * Retain a block until until_us (unix microseconds; 0 = release) against
 * eviction from floor_tier and the tiers below it. The table only stores
 * this; the tiering manager owns the policy (TTLs, quotas). KVT_ENOTFOUND,
 * KVT_EINVAL (bad tier, logged).
 */
int kvt_btable_set_retain(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], uint64_t until_us, int floor_tier);

/*
 * Remove an entry. Only an entry that is unpinned, in no tier and childless
 * can go: otherwise KVT_EINVAL (not logged: a race the caller retries).
 * KVT_ENOTFOUND.
 */
int kvt_btable_remove(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES]);
/*
 * Of the blocks whose parent is parent (an entry's hash or a chain root), the
 * one whose tokens agree longest with tokens[0..block_tokens) from the
 * start: its tokens go to out_tokens[block_tokens] and the agreeing run's
 * length to *n_same (the first token that differs is tokens[*n_same]).
 * KVT_ENOTFOUND when no such block is in the table. Hashes are tenant-salted,
 * so the children found are the same tenant's. (Cache-miss explanations.)
 */
int kvt_btable_nearest_child(kvt_btable *bt, const uint8_t parent[KVT_HASH_BYTES], const int32_t *tokens,
			     int32_t *out_tokens, uint32_t *n_same);

void kvt_btable_get_stats(kvt_btable *bt, kvt_btable_stats *st);

/*
 * Walk the whole table and check every invariant (hash chains, child counts
 * per tier, LRU list membership and tick order, counters). KVT_ECORRUPT
 * (logged, naming the entry and the broken rule) if one fails. Tests and
 * debug builds.
 */
int kvt_btable_check(kvt_btable *bt);

/* ------------------------------------------------------------------------ */
/* The SQLite index (index/db.c)                                            */
/* ------------------------------------------------------------------------ */

/*
 * The durable mirror: one row per block whose bytes are durable in T2, the
 * sessions, and the namespaces. One SQLite connection, owned by one writer
 * thread (every statement runs there); WAL with locking_mode=EXCLUSIVE (no
 * second connection, no shared memory: Debian 12's SQLite 3.40 has a WAL race
 * between connections that can lose commits) and synchronous=FULL, so a
 * committed transaction is durable when the commit returns.
 *
 * Writes are queued (kvt_db_put_block, kvt_db_delete_block, kvt_db_put_session,
 * ...) and the writer commits everything queued, up to max_batch operations,
 * in one transaction (group commit). Each queued write gets a ticket (a
 * sequence number, increasing in queue order); the optional done callback
 * runs on the writer thread right after the commit, and kvt_db_wait(ticket)
 * returns once that write's transaction has committed and its callback ran. Write ordering for the
 * caller (the tiering manager): write a block's bytes to T2 (durable), then
 * put its row, and treat the block as persisted only once the row commits;
 * delete a row, and free its T2 extent only once the delete commits.
 *
 * Namespaces: a (model fingerprint, KV layout version, block_tokens) triple is
 * a namespace with its own id; every block and session row carries it. A db
 * handle is opened for one namespace: its block and session calls never see
 * another namespace's rows (never a hit, never mixed). All namespaces share
 * one file and one T2 store, so start-up marks the T2 extents of every
 * namespace used (kvt_db_for_each_block with KVT_DB_ALL_NS).
 *
 * Errors: a transaction rolled back for lack of space (SQLITE_FULL, or ENOSPC /
 * EDQUOT on a write: before any fsync) fails the writes of that batch with
 * KVT_EFULL and makes the handle *degraded*, not failed: it keeps taking
 * writes; its session writes (put, delete) are kept by the handle and
 * replayed, in order and before any newer write, in every later transaction
 * until one commits (a later write of the same session replaces the kept
 * one); the caller re-sends its block rows (the tiering manager keeps those
 * blocks pending). An idle degraded handle retries (or probes with a one-row
 * write) once a second. The start and the end of a degraded spell are logged
 * once each. Any other failure (an fsync error, I/O error, constraint) rolls
 * back, fails the batch with KVT_EIO and turns the handle failed: later writes
 * fail at once with KVT_EIO (the caller reopens). NOTE: while degraded a read
 * sees the committed state, not the kept session writes. A corrupt or truncated file
 * fails kvt_db_open with KVT_ECORRUPT and a log line naming the file and
 * suggesting `kvtier rebuild-index`.
 *
 * Reserve (reserve_path, reserve_bytes): a file of that many bytes,
 * allocated at open (a warning when the disk has no room for it), that
 * keeps space for session rows. When a transaction is rolled back for lack
 * of space, the writer gives the reserve's space back to the file system
 * and runs the transaction's session writes again at once; from then on,
 * while the reserve is in use, only session writes commit (block-row writes
 * fail with KVT_EFULL, their owners retry) and the handle is degraded. Once
 * a second a writer in that state tries to allocate the reserve again;
 * when it can, space has returned and every write commits as before. Only
 * when the reserve itself is used up do session writes fail (KVT_EFULL).
 *
 * Session journal (journal_path): every session write also goes to a log
 * file of its own (index/journal.c), appended and fdatasync'ed in the same
 * group commit, before the COMMIT; meta.journal_seq names the last record
 * the index holds. At open, the records the index lacks are replayed (all of
 * them when the index file is new: `rebuild-index`, or a deleted index), a
 * journal behind the index (deleted, damaged) is rewritten from it, and each
 * of these is logged. The journal is rewritten to one record per live
 * session when it outgrows twice that (and journal_compact_bytes).
 *
 * Schema versions: meta.schema_version; kvt_db_open migrates an older file
 * step by step (each step one transaction) and refuses a newer one
 * (KVT_EUNSUPPORTED).
 */

#define KVT_DB_SCHEMA_VERSION 5

/*
 * The session journal's I/O seam (kvt_db_config.journal_io): every write,
 * fdatasync, truncation and rename of the journal file (and of the tmp file
 * a rewrite builds) goes through these when set, so a test can keep what a
 * power cut would lose (tests/powerloss.h); NULL (the table or a field) is
 * the plain syscall. path names the file the fd is open on. Each hook returns
 * what the syscall would (errno set on failure). Called on the index's writer
 * thread (and at open, on the opening thread).
 */
typedef struct kvt_db_journal_io {
	ssize_t (*pwrite)(void *ctx, const char *path, int fd, const void *buf, size_t n, off_t off); /* a write */
	int (*fdatasync)(void *ctx, const char *path, int fd);         /* the sync before a COMMIT (or a rename) */
	int (*ftruncate)(void *ctx, const char *path, int fd, off_t len); /* a torn tail or a failed batch cut off */
	int (*rename)(void *ctx, const char *from, const char *to);    /* a rewrite's tmp file replacing the journal */
	void *ctx;                                                     /* passed to every hook */
} kvt_db_journal_io;

typedef struct kvt_db kvt_db;

/* What makes a namespace. */
typedef struct kvt_db_ns {
	uint8_t model_fp[KVT_HASH_BYTES]; /* kvt_model_fingerprint of the GGUF */
	uint32_t layout_version;          /* KVT_KV_LAYOUT_VERSION */
	uint32_t block_tokens;            /* tokens per block, 1..256 */
} kvt_db_ns;

typedef struct kvt_db_config {
	const char *path;     /* the SQLite file (created when missing if create is set) */
	kvt_db_ns ns;         /* the namespace this handle reads and writes; block_tokens 0 = none
			       * (an admin handle for fsck: namespace id 0, which holds no rows) */
	bool create;          /* create a missing file (else KVT_ENOTFOUND) */
	uint32_t max_batch;   /* most writes per transaction; 0 = 4096; 1 = one per transaction */
	uint32_t max_wait_us; /* after the first queued write, wait up to this long for more (0 = none) */
	bool skip_check;      /* skip PRAGMA quick_check at open (rebuild-index creating a fresh file) */
	const uint8_t *owner_id; /* [KVT_DB_OWNER_BYTES] identity to record (rebuild-index adopting its T2
				  * file's); NULL = keep the file's, or make a random one (namespace handles) */
	const char *journal_path; /* the session journal (KVT_DATA_SESSIONS_FILE in the data dir), or NULL: none */
	uint64_t journal_compact_bytes; /* rewrite the journal when it outgrows twice its live size and this; 0 = 4M */
	const kvt_db_journal_io *journal_io; /* the journal's I/O hooks (tests); NULL = syscalls; borrowed, must outlive
					      * the handle */
	const uint8_t *adopt_owner; /* [KVT_DB_OWNER_BYTES] the T2 file's recorded owner, or NULL: taken as this index's
				     * when the index is rebuilt from the session journal at this open (it had no owner
				     * id, and journal records were replayed into it: its first commits were lost) */
	const char *reserve_path; /* the space kept for session rows (KVT_DATA_RESERVE_FILE in the data dir), or NULL */
	uint64_t reserve_bytes;   /* its size (0: no reserve); see "Reserve" above */
} kvt_db_config;

/* One block row: the block's identity plus exactly the T2 location fields. */
typedef struct kvt_db_block_row {
	uint8_t hash[KVT_HASH_BYTES];   /* block hash */
	uint8_t parent[KVT_HASH_BYTES]; /* parent hash or chain root */
	uint32_t n_tokens;              /* token ids in tokens[] */
	int32_t tokens[KVT_BLOCK_MAX_TOKENS]; /* the block's token ids (verified on every hit) */
	kvt_nvme_loc loc;               /* where its record is in T2 */
	uint8_t kv_dtype;               /* record's KV dtype (T1 format) */
	uint8_t codec;                  /* record's codec */
	uint8_t scale_layout;           /* record's scale layout */
	uint32_t raw_bytes;             /* payload bytes before the codec */
	uint64_t last_use;              /* wall clock of the last use, unix microseconds (kvt_wall_us) */
	uint64_t hit_count;             /* hits so far */
	uint64_t retain_until_us;       /* retention deadline, unix microseconds (0: not retained) */
	uint64_t retain_ttl_us;         /* the TTL a hit restarts */
	uint8_t retain_floor;           /* enum kvt_tier: retained in this tier and below */
	char retain_tenant[KVT_NAME_MAX + 1]; /* the tenant whose quota it counts against ("" with no retention) */
	uint8_t kind;                   /* enum kvt_block_kind (schema 5; rows written before read as KVT_BLOCK_PREFIX) */
	int64_t ns_id;                  /* namespace id (filled by reads; ignored by put) */
	bool this_ns;                   /* row belongs to the handle's namespace (filled by reads) */
} kvt_db_block_row;

/* One session row. */
typedef struct kvt_db_session {
	char id[KVT_NAME_MAX + 1];      /* session id (kvt_name_check) */
	char tenant[KVT_NAME_MAX + 1];  /* tenant name (kvt_name_check) */
	int32_t *tokens;                /* [n_tokens] token history; owned by the caller (get: malloc'd, free with kvt_db_session_deinit) */
	uint32_t n_tokens;              /* length of the token history */
	uint8_t last_hash[KVT_HASH_BYTES]; /* hash of the last full block of the history (or the root) */
	int64_t created;                /* unix seconds, set on first put (filled by reads) */
	int64_t updated;                /* unix seconds of the last put (filled by reads) */
	uint32_t durable_tokens;        /* leading tokens of the history whose blocks were durable in T2 when
	                                   last put or marked (kvt_db_mark_session_durable); 0: none or unknown
	                                   (a row replayed from the journal) */
} kvt_db_session;

/* Called on the writer thread once a write committed (rc KVT_OK) or failed (KVT_EIO). Must not call kvt_db_wait/flush/reads. */
typedef void (*kvt_db_done_fn)(void *user, int rc);

typedef struct kvt_db_stats {
	uint64_t n_commits;      /* transactions committed */
	uint64_t n_writes;       /* writes committed */
	uint64_t n_failed;       /* writes failed */
	uint64_t n_bad_sessions; /* session rows that do not decode, skipped by kvt_db_list_sessions */
	uint64_t max_batch_seen; /* largest transaction, writes */
	bool degraded;           /* the last transaction was rolled back for lack of space (retrying) */
	uint64_t n_full;         /* transactions rolled back for lack of space */
	uint64_t n_carried;      /* session writes kept for the next transaction now */
	uint64_t journal_bytes;  /* size of the session journal (0: none) */
	uint64_t n_journal_rewrites; /* times it was rewritten to its live sessions */
	double journal_rewrite_s;    /* seconds spent rewriting it */
	uint64_t n_replayed;         /* session writes replayed from the journal at open */
	double commit_s;         /* seconds spent in COMMIT (fsync) */
	uint64_t reserve_bytes;  /* the reserve for session rows held now (0: none, or in use) */
	bool reserve_in_use;     /* the disk is full: the reserve was given up, only session writes commit */
	uint64_t n_reserve_refused; /* block-row writes refused while the reserve is in use (their owners retry) */
} kvt_db_stats;

/*
 * Open (and create / migrate) the index, find or add the namespace, start the
 * writer thread. Errors (each logged, naming the file): KVT_ENOTFOUND (missing
 * and !create), KVT_ECORRUPT (not a database, truncated, malformed: "run
 * `kvtier rebuild-index`"), KVT_EUNSUPPORTED (newer schema), KVT_EIO (I/O,
 * locked by another process), KVT_EINVAL (bad config), KVT_ENOMEM.
 */
int kvt_db_open(const kvt_db_config *cfg, kvt_db **out);
/* Commit everything queued, stop the writer, close. NULL is a no-op. */
void kvt_db_close(kvt_db *db);
/* The namespace id of this handle. */
int64_t kvt_db_ns_id(const kvt_db *db);
/*
 * The index's identity (meta.owner_id): made at random the first time a
 * namespace handle opens the file (or set from cfg.owner_id), and recorded in
 * the superblock of the T2 file its rows point into, so a T2 file is never
 * used by the rows of another index. Zeros for an admin handle on a file that
 * has none yet.
 */
void kvt_db_owner_id(const kvt_db *db, uint8_t out[KVT_DB_OWNER_BYTES]);

/*
 * Queue "block row->hash is durable at row->loc" (insert or replace the row of
 * this namespace). Its bytes must already be durable in T2. done/user may be
 * NULL; ticket may be NULL. KVT_EIO if the handle has failed, KVT_ENOMEM,
 * KVT_EINVAL (n_tokens or kind out of range, logged). The row keeps the
 * block's kind; kvt_tm_recover gives it back to the table.
 */
int kvt_db_put_block(kvt_db *db, const kvt_db_block_row *row, kvt_db_done_fn done, void *user,
		     uint64_t *ticket);
/* Queue the deletion of a block row (absent = no-op). Free its T2 extent only after it commits. */
int kvt_db_delete_block(kvt_db *db, const uint8_t hash[KVT_HASH_BYTES], kvt_db_done_fn done, void *user,
			uint64_t *ticket);
/* Same, for a row of namespace ns_id (fsck repairing rows of every namespace). */
int kvt_db_delete_block_ns(kvt_db *db, int64_t ns_id, const uint8_t hash[KVT_HASH_BYTES], kvt_db_done_fn done,
			   void *user, uint64_t *ticket);
/* Queue a last-use/hit-count update of a block row (absent = no-op). */
int kvt_db_touch_block(kvt_db *db, const uint8_t hash[KVT_HASH_BYTES], uint64_t last_use, uint64_t hit_count,
		       kvt_db_done_fn done, void *user, uint64_t *ticket);
/*
 * Queue the retention of a block row (absent = no-op): deadline until_us
 * (unix microseconds; 0 releases it), the TTL a hit restarts, the floor tier
 * and the tenant. Survives a restart (kvt_tm_recover reads it back).
 * KVT_EINVAL (logged), KVT_ENOMEM, KVT_EIO.
 */
int kvt_db_retain_block(kvt_db *db, const uint8_t hash[KVT_HASH_BYTES], uint64_t until_us, uint64_t ttl_us,
			int floor_tier, const char *tenant, kvt_db_done_fn done, void *user, uint64_t *ticket);
/* Queue an insert-or-update of a session (ids validated: KVT_EINVAL, logged). The tokens are copied. */
int kvt_db_put_session(kvt_db *db, const kvt_db_session *s, kvt_db_done_fn done, void *user, uint64_t *ticket);
/*
 * Queue "the first durable_tokens tokens of session tenant/id's history have
 * their blocks durable in T2": applied only while the row still holds the
 * history that ends in last_hash, and never lowers the count (a late mark of
 * an older turn changes nothing). Not journaled. KVT_EINVAL (bad names,
 * logged), KVT_ENOMEM, KVT_EIO.
 */
int kvt_db_mark_session_durable(kvt_db *db, const char *tenant, const char *id,
				const uint8_t last_hash[KVT_HASH_BYTES], uint32_t durable_tokens, kvt_db_done_fn done,
				void *user, uint64_t *ticket);
/* Queue the deletion of a session. */
int kvt_db_delete_session(kvt_db *db, const char *tenant, const char *id, kvt_db_done_fn done, void *user,
			  uint64_t *ticket);

/* Block until write `ticket` committed: KVT_OK, KVT_EFULL if its transaction was rolled back for lack of space,
 * KVT_EIO if it failed otherwise; KVT_EINVAL (logged) for a ticket never handed out. */
int kvt_db_wait(kvt_db *db, uint64_t ticket);
/* Block until every write queued so far committed; KVT_EIO if any of them failed. */
int kvt_db_flush(kvt_db *db);
/* Highest ticket whose transaction has finished (committed or failed). */
uint64_t kvt_db_done_ticket(kvt_db *db);

/*
 * Read one session of this namespace (after the writes queued before it).
 * out->tokens is malloc'd: release with kvt_db_session_deinit. KVT_ENOTFOUND
 * (not logged), KVT_EINVAL (bad names, logged), KVT_EIO, KVT_ENOMEM.
 */
int kvt_db_get_session(kvt_db *db, const char *tenant, const char *id, kvt_db_session *out);
void kvt_db_session_deinit(kvt_db_session *s);
/*
 * Call fn for every session of this namespace (tenant NULL = every tenant),
 * ordered by tenant then id. A row that does not decode (a bad name, token
 * blob or hash) is skipped: logged once by row id, counted in
 * kvt_db_stats.n_bad_sessions; the others are still listed. s->tokens is
 * valid during the call only. fn
 * returning non-zero stops the walk and is returned. Runs on the writer
 * thread while the caller waits: fn must not call back into the db.
 */
int kvt_db_list_sessions(kvt_db *db, const char *tenant, int (*fn)(void *ctx, const kvt_db_session *s),
			 void *ctx);

enum {
	KVT_DB_ALL_NS = 1u << 0,   /* every namespace of every model (fsck) */
	KVT_DB_MODEL_NS = 1u << 1, /* every namespace of this handle's model: the rows whose
				    * records live in this model's T2 file (rebuild T2's free map from these) */
	KVT_DB_BY_LAST_USE = 1u << 2, /* in last_use order, least recent first (start-up LRU) */
};
/*
 * Call fn for every block row: of this namespace, or as KVT_DB_MODEL_NS /
 * KVT_DB_ALL_NS say; in no particular order unless KVT_DB_BY_LAST_USE (kvt_btable_insert links parents
 * and children in any order). fn returning non-zero stops the walk and is
 * returned. Runs on the writer thread while the caller waits: fn must not
 * call back into the db.
 */
int kvt_db_for_each_block(kvt_db *db, unsigned flags, int (*fn)(void *ctx, const kvt_db_block_row *row),
			  void *ctx);
/* Count block rows (this namespace, or as the flags of kvt_db_for_each_block say). */
int kvt_db_count_blocks(kvt_db *db, unsigned flags, uint64_t *n_out);
/* Count this namespace's sessions. */
int kvt_db_count_sessions(kvt_db *db, uint64_t *n_out);

void kvt_db_get_stats(kvt_db *db, kvt_db_stats *st);

/*
 * Paths inside a data directory: DIR/KVT_DATA_T2_FILE and
 * DIR/KVT_DATA_INDEX_FILE. KVT_EINVAL (logged) when they do not fit cap.
 */
int kvt_index_paths(const char *data_dir, char *t2_path, char *index_path, size_t cap);

/* ------------------------------------------------------------------------ */
/* The data directory's lock (index/datadir.c)                              */
/* ------------------------------------------------------------------------ */

typedef struct kvt_datadir_lock kvt_datadir_lock;

/*
 * Take DIR/KVT_DATA_LOCK_FILE: an exclusive, non-blocking flock that kvtierd
 * holds for its whole life and every offline tool (fsck, rebuild-index,
 * stats --offline) for its run, so no tool touches a directory a running
 * daemon holds (DESIGN.md §4) and no two daemons share one. The lock is
 * created if absent (DIR must exist); on success "WHO pid PID" is written
 * into it, so a refused caller can name the holder. The kernel drops the
 * lock when the holder exits, kill -9 included (the file is never handed to
 * io_uring, whose asynchronous teardown would keep it alive).
 * Returns KVT_OK and *out; KVT_EBUSY when another open file holds it (this
 * process included): logged, naming the holder; KVT_ENOTFOUND (no DIR),
 * KVT_EIO, KVT_ENOMEM (logged).
 */
int kvt_datadir_lock_take(const char *data_dir, const char *who, kvt_datadir_lock **out);
/* Release the lock (the file stays). NULL is a no-op. */
void kvt_datadir_lock_release(kvt_datadir_lock *l);

#endif
