/*
 * engine/serve/sched_int.h — what the scheduler (scheduler.c) and the
 * sessions (sessions.c) share inside engine/serve: the scheduler's state,
 * the tenant's chain root, and the session row a turn leaves.
 *
 * Locking: s->mu guards the queue, the handles' client-visible fields and
 * the counters (st, the rings, calib_rate); the model, the sequences and the
 * samplers belong to the scheduler thread alone. The sessions' calls run on
 * the caller's thread (the HTTP server's) and touch only the manager, the
 * index and, under s->mu, the counters.
 */
#ifndef KVT_SCHED_INT_H
#define KVT_SCHED_INT_H

#include "scheduler.h"

#include <pthread.h>

#define TTFT_RING 1024u
#define WAIT_RING 1024u

struct kvt_sched {
	kvt_sched_config cfg;        /* copy (borrowed handles inside; secret points at secret[]) */
	uint8_t secret[64];         /* the server secret (tenant salts) */
	uint32_t n_vocab, max_ctx, block_tokens, max_batch; /* the model's limits, the pool's block size */
	pthread_t thread;           /* the scheduler thread */
	pthread_mutex_t mu;         /* see the file comment */
	pthread_cond_t work;        /* queue or cancels for the scheduler */
	pthread_cond_t idle;        /* a request ended (drain waits on it) */
	bool stop, draining;        /* stopping; refusing submits (KVT_ESTOPPED) */
	kvt_sched_handle *q_head, *q_tail; /* the queue (under mu) */
	uint32_t n_queued, n_running; /* requests waiting, admitted (under mu) */
	uint32_t n_ended;           /* of n_running, ended (their clients have the end) and not yet pruned: their
	                               places count as free to submit (under mu) */
	uint32_t t0_committed;      /* T0 blocks committed to the running requests (admission) */
	bool admit_hold;            /* a preemption happened: admit nothing until a request ends (no thrashing) */
	uint64_t n_admitted;        /* admissions so far (seq_no), scheduler thread */
	uint32_t efull_retries;     /* steps in a row whose forward found T0 short (retried; scheduler thread) */
	kvt_sched_handle *running;  /* scheduler thread's list (n_running mirrors its length) */
	float *logits;              /* [max_running][n_vocab] */
	kvt_vocab_trie *trie;       /* the vocabulary's token bytes, for grammars (NULL without cfg.tok) */
	double calib_rate;          /* prefill tokens/s: kept from an earlier run, then this run's (0: none yet) */
	char rate_path[4096];       /* where the rate is kept between runs ("": nowhere) */
	kvt_prefill_rate_key rate_key; /* what the kept rate must be for (rate_path set) */
	bool rate_saved;            /* this run's measured rate replaced calib_rate (under mu) */
	kvt_sched_progress_fn progress; /* called (under mu) when a handle has news; NULL: none */
	void *progress_user;        /* its argument */
	/* counters, under mu */
	kvt_sched_stats st;         /* the counters kvt_sched_get_stats reports */
	double ttft_ring[TTFT_RING]; /* the last TTFTs (percentiles) */
	uint64_t n_ttft;            /* TTFTs recorded */
	double wait_ring[WAIT_RING]; /* the last queue waits */
	uint64_t n_wait;            /* waits recorded */
};

/* A request's tenant: "" or NULL is "default". */
static inline const char *sched_tenant(const char *t) { return t && t[0] ? t : "default"; }

/* The tenant's chain root (model fingerprint, layout, block size, the tenant's salt). KVT_OK or kvt_hash_root's error. */
int sched_chain_root(kvt_sched *s, const char *tenant, uint8_t root[KVT_HASH_BYTES]);

/*
 * The tenant's chunk root: the parent of the first block of every span marked
 * for chunk reuse, one step from the chain root over a token run no prompt
 * can hold (negative ids), so a chunk chain never meets a prefix chain.
 */
int sched_chunk_root(kvt_sched *s, const char *tenant, uint8_t root[KVT_HASH_BYTES]);

/*
 * The end of a finished turn (sessions.c): its blocks (chain[0..n_chain),
 * when the cache is on) become due for write-through, and with a session id
 * the row it leaves is queued first: the whole history, the hash of its last
 * cached block (root when none) and how far its blocks are durable now; once
 * they have landed a mark follows the row (kvt_db_mark_session_durable), so
 * a resume after a crash knows how much it re-prefills. The row also goes to
 * T3 when there is one. KVT_OK: queued (or no session), and
 * sched_turn_saved(s, h, rc) follows on the index's writer thread once the
 * row has committed (rc KVT_OK) or failed (KVT_EFULL: no space; KVT_EIO);
 * else the row was not queued (logged) and nothing follows. Borrows chain
 * only during the call (h may be gone when it returns).
 */
int sched_turn_end(kvt_sched *s, const char *tenant, const char *id, const int32_t *toks, uint32_t n_toks,
		   const uint8_t (*chain)[KVT_HASH_BYTES], uint32_t n_chain, const uint8_t root[KVT_HASH_BYTES],
		   kvt_sched_handle *h);
/*
 * A finished turn's session row committed (rc KVT_OK) or did not: the turn
 * ends for its client now (scheduler.c), as KVT_FINISH_UNSAVED if it did not.
 * Any thread; takes s->mu.
 */
void sched_turn_saved(kvt_sched *s, kvt_sched_handle *h, int rc);

/* The sessions known and the index's counters (zero without an index). */
void sched_sessions_stats(kvt_sched *s, uint64_t *n_sessions, kvt_db_stats *index);
/* Shutdown: commit everything queued to the index (the session rows of the last turns); a failure is logged. */
void sched_sessions_flush(kvt_sched *s);

#endif
