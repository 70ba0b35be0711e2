/*
 * tiers/tm_int.h — the tiering manager's private state, shared by its files
 * (not for engine/, nor for the rest of tiers/: they use manager.h and
 * tiers_int.h).
 *
 * The manager is one object (struct kvt_tm) whose code is split by concept:
 *   manager.c     the core: state, create/destroy, the busy set, register,
 *                 pins, lookup, accounting, the maintenance thread
 *   tm_evict.c    eviction and demotion (T0 -> T1 -> T2, and out of T2)
 *   tm_persist.c  persistence: the write order into T2, write-through of due
 *                 blocks, turn durability (end of turn, flush)
 *   tm_promote.c  sequential promotion and the tickets the I/O workers run
 *   tm_remote.c   T3, the remote tier: its write queue, writer thread, reads
 *   tm_layered.c  layer-wise promotion from T1 on a stream of its own
 *   retain.c, recover.c, prefix.c  (tiers_int.h) the retention ledger, the
 *                 start-up recovery, the prefix-cache handle
 *
 * Concurrency (each rule holds in every file):
 *  - tm->mu guards the job queue, the busy set, the pending list, flush
 *    generations, turn waits, the T3 queues and the counters. It is never
 *    held across I/O, device work or a kvt_db_wait.
 *  - The busy set names the blocks some thread is moving. Only one blocking
 *    acquisition (tm_busy_wait) is ever held at a time (a promotion or a
 *    registration holds exactly one); eviction and persistence only
 *    try-acquire (tm_busy_try) and skip busy blocks, so no thread waits while
 *    holding a block another thread waits for: there is no cycle, hence no
 *    deadlock.
 *  - tm->maint_mu serializes maintenance passes (the thread's and
 *    kvt_tm_maintain's): a pass owns the due prefix of the pending list.
 *  - tm->pin_mu makes "pins == 0, so clear the slot" atomic against
 *    kvt_tm_pin / kvt_tm_lookup(KVT_BT_PIN). Lock order: pin_mu, then the
 *    table's own mutex (and the pools' mutexes); tm->mu is never taken with
 *    pin_mu held.
 *  - Each moving thread has a tm_ctx: its own mover (device stream + device
 *    staging) and a pinned host staging buffer. Workers own theirs; the
 *    maintenance thread and the T3 writer own one each; calls on the
 *    engine's thread (kvt_tm_reserve_t0, kvt_tm_maintain) share one under
 *    ctx_inline.mu.
 *
 * Slot ownership: for every block the table says is in T0 (T1), the manager
 * holds exactly one reference on that T0 (T1) slot, taken before the table
 * names the slot and dropped only after the table stops naming it. So a slot
 * the table names is never free, and a free slot is never named.
 *
 * The write order (DESIGN.md §4) lives in tm_persist.c's named steps:
 * tm_record_meta (what a record says), tm_rows_commit (bytes durable -> row
 * committed -> block acknowledged clean), tm_row_delete_then_free (row
 * deleted -> space freed). No other code frees a T2 extent a row may name.
 *
 * Records move through the record-store seam (rstore.h): tm->rs2 (T2) and
 * tm->rs3 (T3) take every put, get and delete, so a block's bytes reach a
 * store the same way whichever it is. What only the T2 file knows (its
 * capacity against the watermarks, its slot size, compression, read-only)
 * is read from its own stats (kvt_t2_get_stats); T3's sessions and write
 * policy from t3_remote.h.
 */
#ifndef KVT_TM_INT_H
#define KVT_TM_INT_H

#include "fault.h"
#include "manager.h"
#include "rstore.h"
#include "tiers_int.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct tm_ctx {
	kvt_t1_mover *mv;      /* own stream and device staging */
	unsigned char *h_stage;/* [batch][rec_bytes], pinned host */
	kvt_t1_mover *mv_rec[KVT_KV_CODEC_COUNT]; /* one-block movers of the other codecs (NULL for t1_codec, or
	                                              all NULL with an 8-bit T0 pool): T2 records of another format */
	unsigned char *h_rec;  /* [1][the largest record: f16], pinned host: a T2 record read before its codec is known */
	pthread_mutex_t mu;    /* only used by the shared inline ctx */
} tm_ctx;

struct kvt_tm_ticket {
	uint32_t n;                       /* blocks */
	uint8_t (*hashes)[KVT_HASH_BYTES];/* [n] copies of the caller's hashes */
	int tier;                         /* target tier */
	bool take_refs;                   /* hand T0 references to the caller */
	bool collected;                   /* the caller took the references */
	int *results;                     /* [n] per block */
	int32_t *slots;                   /* [n] T0 slot (with a reference when take_refs and OK) */
	uint32_t next;                    /* next index a worker claims (tm->mu) */
	uint32_t n_done;                  /* indices finished (tm->mu) */
	kvt_tm_ticket *qnext;             /* job queue link (tm->mu) */
	uint32_t n_local;                 /* indices >= n_local are looked up in T3 (= n: none) */
	uint32_t n_claim;                 /* indices the workers claim (n, or n_local without T3) */
	uint8_t root[KVT_HASH_BYTES];     /* parent of hashes[0] (T3 blocks' chain check) */
	bool *pinned;                     /* [n] a pin taken for the caller on a block from T3, or NULL */
	uint64_t bytes_from[KVT_TM_N_TIERS]; /* bytes read for this ticket, by the tier they came from (tm->mu):
	                                        T2 records, T1 slots unpacked into T0, T3 records */
};

typedef struct tm_remote_q {
	uint8_t hash[KVT_HASH_BYTES]; /* a block to write to T3 */
	double retry_t;               /* not before this (a failed write's retry; 0: now) */
} tm_remote_q;

/* A turn whose durability its owner waits for (kvt_tm_end_turn_chain's done). */
typedef struct tm_turn_wait {
	struct tm_turn_wait *next;         /* list link, oldest first */
	uint32_t n;                        /* blocks in the chain */
	kvt_tm_durable_fn fn;              /* called once */
	void *user;                        /* its argument */
	uint8_t (*chain)[KVT_HASH_BYTES];  /* [n] the chain, in order */
	uint8_t (*sorted)[KVT_HASH_BYTES]; /* [n] the same, sorted (membership tests) */
} tm_turn_wait;

/* Turns waited for at most: past it the oldest is answered with what is durable then (a long full-disk spell). */
#define TM_MAX_TURN_WAITS 1024

typedef struct tm_pending {
	uint8_t hash[KVT_HASH_BYTES]; /* a registered block not yet known durable */
	double due_t;                 /* when it became due for write-through (0: not due) */
} tm_pending;

struct kvt_tm {
	kvt_tm_config cfg;             /* copy (borrowed handles inside) */
	kvt_t1_pool *t1;               /* owned */
	size_t block_bytes;            /* the block in fp16 (the compression baseline) */
	size_t packed_bytes;           /* T1 slot / T2 payload of t1_codec */
	int rec_codec;                 /* codec of T2 records written from T0: F16 with t2_f16, else t1_codec */
	size_t rec_bytes;              /* their payload bytes (>= packed_bytes) */
	pthread_mutex_t mu;            /* see the file comment */
	pthread_cond_t cv_work;        /* workers: a ticket queued, or stop */
	pthread_cond_t cv_done;        /* ticket progress, busy released, flush progress */
	pthread_cond_t cv_maint;       /* wakes the maintenance thread */
	pthread_mutex_t pin_mu;        /* pins vs eviction */
	pthread_mutex_t maint_mu;      /* one maintenance pass at a time (the thread, kvt_tm_maintain) */
	kvt_event *ev_compute;         /* recorded on the compute stream by kvt_tm_register */
	uint8_t (*busy)[KVT_HASH_BYTES];/* [cap_busy] blocks being moved */
	uint32_t n_busy, cap_busy;     /* entries, capacity */
	kvt_tm_ticket *q_head, *q_tail;/* tickets with unclaimed indices */
	tm_pending *pend;              /* [cap_pend] registered, not yet durable; due ones first */
	uint32_t n_pend, n_due, cap_pend; /* entries, due prefix, capacity */
	uint64_t flush_req, flush_done;/* flush generations */
	tm_turn_wait *waits;           /* turns whose owner waits for their blocks, oldest first (tm->mu) */
	uint32_t n_waits;              /* entries */
	int persist_err;               /* first persistence failure since the last flush began */
	bool maint_kick;               /* work for the maintenance thread */
	bool stop;                     /* threads exit */
	bool t2_full;                  /* the last T2 write found no space */
	double t2_full_t;              /* when */
	bool db_full;                  /* the last row commit was rolled back for lack of space */
	double db_full_t;              /* when */
	bool warned_codec;             /* logged a record of another codec once */
	pthread_t maint;               /* maintenance thread */
	pthread_t *workers;            /* [n_io_threads] */
	uint32_t n_workers;            /* started */
	bool maint_started;            /* maint is running */
	tm_ctx *wctx;                  /* [n_io_threads + 1]: workers, then maintenance */
	tm_ctx ctx_inline;             /* engine-thread calls */
	tm_foreign *foreign;           /* [n_foreign] other namespaces' records, least recently used first (tm->mu) */
	uint32_t n_foreign, next_foreign; /* entries, first not yet reclaimed (tm->mu) */
	kvt_tm_stats st;               /* counters (capacity/used filled by get_stats) */
	tm_retain *rt;                 /* the retention ledger (owned) */
	double sweep_t;                /* last expiry sweep of the ledger (maintenance) */
	/* T3 (cfg.t3): the write queue, its due prefix and the session copies (tm->mu) */
	tm_remote_q *rq;               /* [cap_rq] blocks to write, due ones first */
	uint32_t n_rq, n_rq_due, cap_rq;
	kvt_db_session *rs;            /* [cap_rs] sessions to write (owned copies) */
	uint32_t n_rs, cap_rs;
	bool remote_inflight;          /* the writer holds a batch */
	uint32_t remote_inflight_n;    /* entries in it (blocks, or 1 session) */
	bool warned_remote;            /* logged a T3 record of another codec once */
	pthread_cond_t cv_remote;      /* wakes the remote writer */
	pthread_t rwriter;             /* the remote writer thread */
	bool rwriter_started;
	struct tm_lay *lay;            /* kvt_tm_promote_layered's stream, events and staging; NULL until first use */
	bool lay_active;               /* a layered promotion is in flight (tm->mu) */
	kvt_rstore t2rs, t3rs;         /* the record stores' views of cfg.t2 and cfg.t3 (rstore.h) */
	kvt_rstore *rs2, *rs3;         /* &t2rs / &t3rs when that tier is configured, else NULL: every record
	                                  put, get and delete goes through them */
	struct tm_tomb *tomb;          /* the blocks that left their last tier (tm_miss.c) */
	kvt_tm_prefix *lay_owner;      /* the prefix handle whose layered promotion is in flight (tiers/prefix.c;
	                                  the compute-stream thread only) */
};

/* A worker thread's argument (freed by the thread). */
typedef struct tm_worker_arg {
	kvt_tm *tm;  /* the manager */
	tm_ctx *ctx; /* the worker's own context */
} tm_worker_arg;

/* ---- manager.c: the busy set, small helpers, the maintenance thread ------ */

/* Take h into the busy set unless another thread holds it (never waits). */
bool tm_busy_try(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES]);
/* Wait until h is free, then take it (KVT_ENOMEM). Hold no other block while waiting. */
int tm_busy_wait(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES]);
/* Give h back (it must be held) and wake the waiters. */
void tm_busy_release(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES]);
/* The scale_layout a T2 record of this codec carries (manager.h). */
uint8_t tm_scale_layout_of(int codec);
/* T2 takes writes now: configured, not read-only, not recently full (nor the index). */
bool tm_t2_writable(kvt_tm *tm);
/* Order c's mover after the engine's writes of registered blocks. */
int tm_wait_compute(kvt_tm *tm, tm_ctx *c);
/* Wake the maintenance thread. */
void tm_kick(kvt_tm *tm);

/* ---- tm_evict.c: eviction and demotion ---------------------------------- */

/* The block left tier (unpinned): clear its slot, drop the manager's reference; true if it left.
 * Left its last tier: remembered (tm_tomb_dropped) under pressure why. */
bool tm_leave_tier(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES], int tier, bool *dropped, int *kind, int why);
/* Make T0 (T1) hold at least want_free free slots; returns the free slots after. why: enum kvt_tm_pressure. */
uint32_t tm_evict_t0(kvt_tm *tm, tm_ctx *c, uint32_t want_free, bool *saw_busy, int why);
uint32_t tm_evict_t1(kvt_tm *tm, tm_ctx *c, uint32_t want_free, int why);
/* Free T2 space down to bytes_target used. */
void tm_evict_t2(kvt_tm *tm, tm_ctx *c, uint64_t bytes_target);
/* Release every T0/T1 slot the manager holds (shutdown). */
void tm_release_tier(kvt_tm *tm, int tier);

/* ---- tm_persist.c: the T2 write order and turn durability ---------------- */

/* Fill a T2/T3 record header for the table entry e in this manager's codec. */
void tm_record_meta(const kvt_tm *tm, const kvt_btable_entry *e, kvt_t2_block_meta *m);
/* A registered block not yet durable joins the pending list (not due). Under tm->mu. KVT_ENOMEM. */
int tm_pend_add_locked(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES]);
/*
 * The packed bytes of the busy-held block e (a T1/T2 payload) into dst: its
 * T1 slot copied, its T0 slot packed through c's mover (dst must then be
 * pinned staging, e.g. c->h_stage), or its T2 record read and verified (a
 * record of another format decoded and packed again as t1_codec).
 * KVT_ENOTFOUND when it is in no tier; the mover's or the store's error.
 */
int tm_block_packed(kvt_tm *tm, tm_ctx *c, const kvt_btable_entry *e, void *dst);
/* Write step 3, undone: the row that would have named loc is gone (or never committed); free the extent. */
void tm_extent_free(kvt_tm *tm, const kvt_nvme_loc *loc);
/*
 * Row deleted -> space freed: delete the row of hash in namespace ns_id (0:
 * ours), wait for the delete to commit, and only then free loc's extent.
 * KVT_OK, or the index's error (the extent then stays allocated: logged by
 * the caller, reclaimed at the next start).
 */
int tm_row_delete_then_free(kvt_tm *tm, int64_t ns_id, const uint8_t hash[KVT_HASH_BYTES], const kvt_nvme_loc *loc);
/* Make n busy-held blocks durable (n <= batch); ok[i] per block. First failure or KVT_OK. */
int tm_persist_held(kvt_tm *tm, tm_ctx *c, uint32_t n, uint8_t (*hashes)[KVT_HASH_BYTES], bool *ok);
/* Write the due prefix of the pending list through to T2, in batches. */
void tm_persist_due(kvt_tm *tm, tm_ctx *c);
/* Answer the turns none of whose blocks is pending (every turn when all). */
void tm_turn_waits_answer(kvt_tm *tm, bool all);
/* Leading blocks of a chain durable in T2 with their row committed. */
uint32_t tm_durable_prefix(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES]);
int tm_hash_cmp(const void *a, const void *b); /* memcmp of two block hashes (qsort, bsearch) */

/* ---- tm_promote.c: promotion and the I/O workers ------------------------- */

/* Count a lookup that found the block in found_tier (-1: nowhere). */
void tm_count_lookup(kvt_tm *tm, int found_tier);
/* Bring one block to tier (HBM or HOST), busy-held for the move; see the file. */
int tm_promote_one(kvt_tm *tm, tm_ctx *c, const uint8_t h[KVT_HASH_BYTES], int tier, bool take_ref,
		   int32_t *t0_slot, uint64_t *bytes_from);
void *tm_worker_main(void *arg); /* an I/O worker: runs queued tickets (arg: a malloc'ed tm_worker_arg) */

/* ---- tm_remote.c: T3 ----------------------------------------------------- */

/* ON_DEMOTE: busy-held blocks about to leave the last local tier go to T3 first. */
void tm_remote_demote_held(kvt_tm *tm, tm_ctx *c, uint32_t n, uint8_t (*h)[KVT_HASH_BYTES], int leaving_tier);
/* Queue a registered block for T3 (WRITE_THROUGH). Under tm->mu. */
void tm_remote_queue_locked(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES]);
void *tm_remote_main(void *arg); /* the T3 writer thread (arg: the manager) */
/* Look up the ticket's blocks [lo, n) in T3 and bring the run found to the ticket's tier. */
void tm_remote_fetch(kvt_tm *tm, tm_ctx *c, kvt_tm_ticket *t, uint32_t lo);

/* ---- tm_miss.c: tombstones of blocks gone, for miss explanations -------- */

typedef struct tm_tomb tm_tomb;
int tm_tomb_create(kvt_tm *tm);   /* KVT_ENOMEM */
void tm_tomb_destroy(kvt_tm *tm); /* NULL-safe */
/* Remember that block h left its last tier (tier) for reason under pressure. */
void tm_tomb_put(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES], int tier, int reason, int pressure);
/* The block e left its last tier under pressure (NONE: shutdown, not remembered): evicted, expired or lost. */
void tm_tomb_dropped(kvt_tm *tm, const kvt_btable_entry *e, int tier, int pressure);
uint64_t tm_tomb_count(kvt_tm *tm); /* tombstones held */
/* The retention of block h ended (the ledger's on_expired; a leaf lock only): evicted later, it expired. */
void tm_tomb_expired(void *tm, const uint8_t *h);

/* ---- tm_layered.c -------------------------------------------------------- */

void tm_lay_destroy(kvt_tm *tm); /* the layered promotion's stream, events and staging (NULL-safe) */

#endif
