/*
 * tiers/tiers_int.h — internals shared by the tier pools (not for engine/).
 *
 * kvt_slots is the bookkeeping of a pool of fixed slots, shared by T0 and T1:
 * a reference count per slot and a LIFO stack of the free ones (recently
 * freed slots are reused first, which keeps a GPU's L2 and a CPU's caches
 * warm). Invariant: a slot is on the stack iff its count is 0. ref/unref of
 * a free slot is a programmer error and aborts. One mutex; every call is
 * safe from any thread.
 */
#ifndef KVT_TIERS_INT_H
#define KVT_TIERS_INT_H

#include "kvt.h"
#include "manager.h"

#include <pthread.h>

typedef struct kvt_slots {
	const char *name;      /* "t0" or "t1", for messages */
	uint32_t n_slots;      /* slots */
	uint32_t *refs;        /* [n_slots] holders per slot */
	int32_t *free_stack;   /* [n_slots] free slot numbers, top at n_free - 1 */
	uint32_t n_free;       /* entries on free_stack */
	pthread_mutex_t mu;    /* guards refs, free_stack, n_free */
} kvt_slots;

/* Every slot free; slot 0 is handed out first. KVT_ENOMEM. */
int kvt_slots_init(kvt_slots *s, const char *name, uint32_t n_slots);
void kvt_slots_deinit(kvt_slots *s);
uint32_t kvt_slots_n_free(kvt_slots *s);
int kvt_slots_alloc(kvt_slots *s, int32_t *slot); /* KVT_EFULL when none is free */
void kvt_slots_ref(kvt_slots *s, int32_t slot);
void kvt_slots_unref(kvt_slots *s, int32_t slot);
uint32_t kvt_slots_refcount(kvt_slots *s, int32_t slot);
/* Walk the invariants: KVT_ECORRUPT (logged, naming the slot) if broken. */
int kvt_slots_check(kvt_slots *s);

/*
 * The retention ledger of the tiering manager (tiers/retain.c; the contract
 * is manager.h's "Retention"). One mutex; safe from any thread. Lock order:
 * the manager's pin_mu, then the ledger's mutex, then the block table's.
 */
typedef struct tm_retain tm_retain;
typedef struct tm_retain_config {
	kvt_btable *bt;                /* borrowed: where eviction sees deadlines */
	kvt_db *db;                    /* borrowed; NULL: retention is not durable */
	uint64_t (*clock_us)(void *);  /* the clock, microseconds (unix time by default) */
	void *clock_user;              /* its argument */
	uint64_t cost[KVT_TIER_COUNT]; /* bytes one retained block counts, by floor tier */
	void (*on_expired)(void *user, const uint8_t hash[KVT_HASH_BYTES]); /* a record's deadline passed (may be
	                                 NULL); called under the ledger's mutex: it must take no lock but a leaf one */
	void *on_expired_user;         /* its argument */
} tm_retain_config;
int tm_retain_create(const tm_retain_config *c, tm_retain **out);
void tm_retain_destroy(tm_retain *rt); /* NULL is a no-op */
uint64_t tm_retain_now(tm_retain *rt);
int tm_retain_set_quota(tm_retain *rt, const char *tenant, const kvt_tm_quota *q);
int tm_retain_add(tm_retain *rt, const char *tenant, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES],
		  uint64_t ttl_us, int floor, kvt_tm_retain_result *res);
uint32_t tm_retain_refresh(tm_retain *rt, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES]);
uint32_t tm_retain_release(tm_retain *rt, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES]);
/* The block left the table (dropped): forget its record (its row is gone or going). */
void tm_retain_forget(tm_retain *rt, const uint8_t hash[KVT_HASH_BYTES]);
/* Drop the records whose deadline has passed. */
void tm_retain_sweep(tm_retain *rt);
/* Start-up: a row read back from the index; depth = its position in load order (parents first). */
int tm_retain_recover(tm_retain *rt, const kvt_db_block_row *row, uint32_t depth);
/* After recovery (or a quota change): release the oldest records of tenants over their quota. */
void tm_retain_enforce(tm_retain *rt);
/* Queue a block's row with its retention filled in, atomically against retention changes. */
int tm_retain_put_row(tm_retain *rt, kvt_db *db, kvt_db_block_row *row, uint64_t *ticket);
bool tm_retain_get(tm_retain *rt, const uint8_t hash[KVT_HASH_BYTES], kvt_tm_retention *out);
void tm_retain_stats(tm_retain *rt, kvt_tm_retain_stats *st, kvt_tm_tenant_stats *ten, uint32_t cap, uint32_t *n_ten);

/*
 * The manager's internals the prefix-cache handle (tiers/prefix.c) builds on
 * (tiers/manager.c).
 *
 * tm_ticket_wait_progress: kvt_tm_ticket_wait, calling fn(user, done, total)
 * (may be NULL; not under the manager's lock) each time more of the ticket is
 * done, and copying the bytes read for the ticket by source tier into
 * bytes_from (may be NULL). tm_lay_owner: where the manager keeps the handle
 * whose layered promotion is in flight (the compute-stream thread's; at most
 * one). tm_packed_bytes: a T1 slot / T2 payload. tm_bt: for lookups that
 * neither pin nor count (a resumed session's, a session listing's).
 */
int tm_ticket_wait_progress(kvt_tm *tm, kvt_tm_ticket *t, void (*fn)(void *user, uint32_t done, uint32_t total),
			    void *user, uint64_t bytes_from[KVT_TM_N_TIERS]);
kvt_tm_prefix **tm_lay_owner(kvt_tm *tm);
size_t tm_packed_bytes(const kvt_tm *tm);
kvt_t0_pool *tm_t0(kvt_tm *tm);  /* the engine's T0 pool (borrowed by the manager) */
kvt_btable *tm_bt(kvt_tm *tm);   /* the block table */
bool tm_lossy(const kvt_tm *tm); /* T1/T2/T3 records are 8-bit (FP8/INT8): what comes up from them is lossy */

/* A row read back at start-up (tiers/recover.c): another namespace's record the manager keeps, or a lost row. */
typedef struct tm_foreign {
	int64_t ns_id;                /* a namespace of this model other than ours */
	uint8_t hash[KVT_HASH_BYTES]; /* its block */
	kvt_nvme_loc loc;             /* its extent (marked used) */
	uint64_t last_use;            /* the row's last use, unix microseconds */
} tm_foreign;

/* What the start-up recovery found (tm_recover_rows). */
typedef struct tm_recovery {
	uint64_t n_rows;      /* rows of this model read (every namespace) */
	uint64_t n_marked;    /* of those, rows whose T2 extent was marked used */
	uint64_t n_loaded;    /* blocks of this namespace entered in the table */
	uint64_t n_skipped;   /* bad rows skipped (extent invalid or overlapping, block size, collision): kept in the index */
	uint32_t n_lost;      /* rows whose records lay past the file's intact bytes: deleted */
	tm_foreign *foreign;  /* [n_foreign] other namespaces' records, least recently used first; the caller frees */
	uint32_t n_foreign;
} tm_recovery;

/*
 * The start-up recovery (tiers/recover.c; the one kvt_tm_recover runs, the
 * rules are that file's opening comment): marks the extents of db's model's
 * rows used in t2, loads db's namespace into bt (clean, in T2 only) and its
 * retention into rt, deletes the lost rows, skips and counts the bad ones.
 * Fills *out whatever happens (free out->foreign). KVT_OK, KVT_ENOMEM, or the
 * index's error (walk, delete, flush).
 */
int tm_recover_rows(kvt_db *db, kvt_t2_store *t2, kvt_btable *bt, tm_retain *rt, tm_recovery *out);

#endif
