/*
 * engine/serve/sched_int.h — the scheduler's internals: its state, a
 * request's handle, a step's batch, and the functions its files share.
 * Private to the scheduler's files:
 *
 *   scheduler.c      the public calls (submit, next, cancel, release, stats,
 *                    lifecycle), the scheduler thread and its loop: each step
 *                    a sequence of named phases
 *   sched_policy.c   who goes when: admission from the queue, the prefill
 *                    budget shared by the policy (FAIR's ranking, the head
 *                    prompt, aging), the victim of a preemption
 *   sched_request.c  a request's life on the scheduler thread: started, its
 *                    cached prefix taken, its blocks registered, its tokens
 *                    taken, preempted, ended
 *   sched_batch.c    one step's batch: the decode rows, room in T0, the
 *                    forward, retiring the rows that ran
 *   sched_chunks.c   chunk reuse: marked spans looked up, placed, blended,
 *                    stored
 *
 * Dependencies run one way: the scheduler's files -> the sessions
 * (sessions.h) -> the manager and the index. The scheduler owns a
 * sched_sessions (s->sess) and calls the sessions with it; sessions.c never
 * includes this header, and what it needs back comes through the callbacks
 * in that struct (sched_turn_saved, the prefill rate).
 *
 * Locking: s->mu guards the queue, the handles' client-visible fields and
 * the counters (st, the rings, calib_rate); the model, the sequences, the
 * samplers, the prefix handles and the batch belong to the scheduler thread
 * alone. The sessions' calls run on their caller's thread (the HTTP server's)
 * and reach the scheduler only through the sessions' callbacks, which take
 * s->mu.
 */
#ifndef KVT_SCHED_INT_H
#define KVT_SCHED_INT_H

#include "scheduler.h"
#include "sessions.h"

#include <pthread.h>

#define TTFT_RING 1024u
#define WAIT_RING 1024u

struct kvt_sched {
	kvt_sched_config cfg;        /* copy (borrowed handles inside; secret points at secret[]) */
	uint8_t secret[64];         /* the server secret (tenant salts) */
	uint32_t n_vocab, max_ctx, block_tokens, max_batch; /* the model's limits, the pool's block size */
	sched_sessions sess;        /* the sessions (sessions.h): this scheduler's db, tm and naming, its callbacks */
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

/* A request's state (h->state; scheduler thread only): see scheduler.c's opening comment. */
enum h_state { H_QUEUED, H_PROMOTE, H_PREFILL, H_DECODE, H_FINISHING, H_DONE };

#define NO_BLEND UINT32_MAX /* h->blend_at: no blended prefill (sched_chunks.c) */

struct sched_chunk; /* a marked span's chunk chain (sched_chunks.c) */

/*
 * A preempted request keeps its handle, tokens and sampler; only its
 * sequence (T0 references) and pins go. n_fill is how many tokens its KV
 * must hold before it samples again: the prompt at first; after a
 * preemption in decode, every token but the last sampled one (which the
 * next decode row runs), so the resumed sequence computes exactly the rows
 * an uninterrupted one would have.
 */
struct kvt_sched_handle {
	kvt_sched *s;               /* the scheduler it was submitted to */
	kvt_sched_req req;          /* copy; req.prompt points into toks */
	pthread_cond_t cv;          /* progress, under s->mu */
	/* under s->mu */
	int32_t *toks;              /* [cap_toks] prompt, then generated tokens (EOG included) */
	uint32_t n_toks;            /* tokens in toks */
	uint32_t n_visible;         /* generated tokens the client may see (EOG excluded) */
	uint32_t n_returned;        /* of those, handed out by kvt_sched_next */
	int finish;                 /* KVT_FINISH_* once decided */
	bool ended;                 /* finished and accounted: usage final (a session turn: once its row committed) */
	bool saving;                /* finished, its session row queued and not yet committed (sessions.c calls
	                               sched_turn_saved): the client sees no end before it */
	bool cancel;                /* the client asked to stop */
	bool client_gone;           /* released by the client */
	bool unlinked;              /* ended and off the scheduler's lists: the client frees it */
	kvt_sched_usage usage;      /* what kvt_sched_next reports once it has ended */
	kvt_sched_handle *next;     /* queue / running list link */
	/* scheduler thread only */
	int state;                  /* enum h_state */
	uint32_t cap_toks;          /* prompt + max_tokens: toks' capacity */
	kvt_seq seq;                /* its sequence (T0 blocks, K/V), while seq_ready */
	bool seq_ready;             /* seq initialized (admitted, not preempted or ended) */
	kvt_sampler sampler;        /* its sampler (kept across a preemption), while sampler_ready */
	bool sampler_ready;         /* sampler initialized */
	kvt_gmatch *gm;             /* the grammar's matcher (req.grammar), NULL: unconstrained */
	kvt_token_lp *lps;          /* [max_tokens + 1] logprobs of the generated tokens (req.logprobs >= 0), under s->mu as toks */
	uint8_t root[KVT_HASH_BYTES];      /* the tenant's chain root */
	uint8_t (*hashes)[KVT_HASH_BYTES]; /* [max blocks] the chain of toks' full blocks: hashed once each (admission
	                                      for the fill, registration for the rest), for lookup and registration */
	uint32_t n_hashed;          /* leading hashes[] computed */
	uint32_t n_hashes;          /* leading blocks in the cache: the served prefix, then those registered */
	kvt_tm_prefix *pfx;         /* the cached prefix's handle (tiers/manager.h): pins, promotion, layer gate; NULL
	                               without one */
	double t_submit, t_first;   /* submitted, first token sampled (0: none yet), kvt_now_s */
	int prio;                   /* priority (the request's, or its tenant's default) */
	uint64_t submit_step;       /* the step count at submit (under s->mu) */
	double t_wait;              /* entered the queue (submit or preemption), under s->mu */
	uint32_t n_fill;            /* tokens the KV must hold before sampling (see above) */
	bool resume_decode;         /* preempted while decoding: after the fill, decode without sampling */
	bool preempted;             /* re-queued by a preemption (admission does not count it anew) */
	uint32_t passed;            /* FAIR: steps passed over while prefilling */
	uint32_t yielded;           /* FAIR: others' rows run while this was the head prompt */
	uint32_t overtaken;         /* FAIR: prompt tokens admitted past it while T0 could not hold it (under s->mu) */
	uint32_t committed;         /* T0 blocks committed at admission (t0_committed) */
	uint64_t seq_no;            /* admission order (latest = largest) */
	struct sched_chunk *chunks; /* [req.n_chunks] the marked spans' chunk chains (NULL: none, or preempted) */
	uint32_t blend_at;          /* the prompt position where the blended prefill starts (NO_BLEND: none) */
	uint32_t reg_limit;         /* blocks that may be registered under the chain: those before blend_at */
};

/* One batch entry. */
typedef struct sched_entry {
	kvt_sched_handle *h; /* the sequence */
	uint32_t n;          /* rows */
	bool logits;         /* wants the logits of its last row */
} sched_entry;

/* FAIR's order of the prefilling sequences: aged first, then priority, shortest remaining, admission. */
typedef struct sched_cand {
	kvt_sched_handle *h; /* the prefilling sequence */
	bool aged;           /* passed over aging_steps steps */
	int prio;            /* effective priority now */
	uint32_t left;       /* prompt tokens still to run */
} sched_cand;

/*
 * One step's batch (scheduler thread only). Its buffers are allocated once,
 * when the thread starts (sched_batch_init): entries and candidates at most
 * max_running + 1, rows at most max_batch. The decode and finishing rows are
 * the first n_decode entries, one row each; the prompt chunks follow.
 */
typedef struct sched_batch {
	sched_entry *ents;       /* [max_running + 1] the step's entries */
	int32_t *rows;           /* [max_batch] their input tokens, entry after entry */
	sched_cand *cands;       /* [max_running + 1] the prefilling sequences, ranked (sched_policy.c) */
	kvt_seq **seqs;          /* [max_running + 1] the forward's arguments: each entry's sequence, */
	uint32_t *n;             /* [max_running + 1]   rows */
	bool *want;              /* [max_running + 1]   and whether it wants logits */
	kvt_model_gate *gates;   /* [max_running + 1] the layer gates of prefixes still coming up (n_gates) */
	int32_t *picked;         /* [max_running + 1] each entry's token, picked on the device (on_device) */
	bool *bad;               /* [max_running + 1] its cached prefix failed to reach T0: it ends */
	uint32_t n_ent, n_rows;  /* entries, rows planned */
	uint32_t n_decode;       /* of the entries, the leading decode and finishing rows */
	uint32_t n_prefill;      /* of the rows, prompt rows (H_PREFILL entries) */
	bool on_device;          /* the step ran as kvt_model_decode (tokens picked on the device) */
} sched_batch;

/* ---- sched_policy.c: who goes when ---- */

/* A request's default priority: its tenant's entry, else default_priority. */
int sched_tenant_priority(const kvt_sched *s, const char *tenant);
/*
 * Admission (under s->mu): takes off the queue, best first, the requests
 * that may start now (all of them when stop), counted as running with their
 * T0 blocks committed. Returns them as a list in admission order (NULL:
 * none); the caller starts them.
 */
kvt_sched_handle *sched_admit_from_queue(kvt_sched *s, bool stop);
/* The step's prompt chunks: the prefill budget shared among the prefilling sequences by the policy. */
void sched_plan_prefill(kvt_sched *s, sched_batch *b);
/* The victim of a preemption (NULL: none). */
kvt_sched_handle *sched_pick_victim(kvt_sched *s);

/* ---- sched_request.c: a request's life ---- */

/* Start an admitted request: its cached prefix, sequence and sampler. On failure it ends with ERROR. */
void sched_start_request(kvt_sched *s, kvt_sched_handle *h);
/* The cached prefix has come up (kvt_tm_prefix_ready): its blocks start the sequence; the state is PREFILL. */
void sched_take_prefix(kvt_sched *s, kvt_sched_handle *h);
/* Register the sequence's new full blocks (K/V stored) with the manager. */
void sched_register_blocks(kvt_sched *s, kvt_sched_handle *h);
/* A token was sampled for h: append it, publish it, decide whether the request is done. */
void sched_take_token(kvt_sched *s, kvt_sched_handle *h, int32_t tok);
/* Preempt h: its pins and T0 references go, it goes back to the queue's front; admission holds. */
void sched_preempt(kvt_sched *s, kvt_sched_handle *h);
/* End a running request (finish: KVT_FINISH_*): its blocks and pins released, its session saved, usage published. */
void sched_finish_request(kvt_sched *s, kvt_sched_handle *h, int finish);
/*
 * A finished turn's session row committed (rc KVT_OK) or did not: the turn
 * ends for its client now, as KVT_FINISH_UNSAVED if it did not. The
 * sessions' turn_saved callback (sessions.h). Any thread; takes s->mu.
 */
void sched_turn_saved(kvt_sched *s, kvt_sched_handle *h, int rc);

/* ---- sched_batch.c: one step's batch ---- */

/* Allocate b's buffers. KVT_OK or KVT_ENOMEM (then nothing is held). */
int sched_batch_init(const kvt_sched *s, sched_batch *b);
void sched_batch_deinit(sched_batch *b);
/* The step's first rows: one per decoding sequence (its last sampled token), one per finishing sequence. */
void sched_plan_decode(kvt_sched *s, sched_batch *b);
/*
 * Room in T0 for the planned batch. true: the batch (maybe cut to its decode
 * rows) fits and runs; false: a preemption or an ended request changed the
 * running set, and the step is planned again.
 */
bool sched_make_room(kvt_sched *s, sched_batch *b);
/* Run the batch's forward; *dt its seconds. false: it did not run (retried next step, or failed: its requests end). */
bool sched_run(kvt_sched *s, sched_batch *b, double *dt);
/* After the forward: register the new blocks, store chunks, sample, end what finished or failed. */
void sched_retire(kvt_sched *s, sched_batch *b);

/* ---- sched_chunks.c: chunk reuse ---- */

/* Look the marked spans up (admission, not for a preempted request). */
void sched_chunks_lookup(kvt_sched *s, kvt_sched_handle *h);
/* The exact prefix is in the sequence: place the spans found, let the lookups go. */
void sched_chunks_place(kvt_sched *s, kvt_sched_handle *h);
/* Store the blocks of the spans not found, once the sequence holds their K/V. */
void sched_chunks_store(kvt_sched *s, kvt_sched_handle *h);
/* The blended prefill from blend_at (the sequence has reached it), alone. */
void sched_chunks_blend(kvt_sched *s, kvt_sched_handle *h);
/* Let go of the chunk lookups and chains (the handles' pins and T0 references). */
void sched_chunks_free(kvt_sched_handle *h);

#endif
