/*
 * engine/serve/scheduler.h — the serving engine: one scheduler thread owns the model,
 * runs continuous batching over the requests, reuses cached prefixes through
 * the tiering manager, and keeps the sessions.
 *
 * A request is planned as DESIGN.md §5 says: longest cached prefix (by block
 * hash, under the request's tenant salt) -> promote those blocks to T0 ->
 * prefill only the rest, in chunks of prefill_chunk tokens interleaved with
 * decode steps -> decode, every step one batch over all running sequences ->
 * register each new full block with the manager -> at the end of the turn
 * the manager's write policy makes the turn's blocks durable, and the
 * session row (token history) is queued to the index. A grammar and the
 * penalties change the choice of each token only (kvt_sampler_next, over
 * the token trie built here when the scheduler starts): the K/V and the
 * blocks of a constrained turn are cached like any other.
 *
 * Each step's rows: one per decoding sequence first, then the prefill
 * budget (prefill_chunk prompt tokens) shared by the prefilling sequences
 * under the policy (enum kvt_sched_policy): FAIR ranks them by effective
 * priority, then shortest remaining prompt first, so a request admitted
 * behind a long prompt gets its first chunk in the next step, and a shorter
 * one passed over for aging_steps steps goes first. The
 * head prompt (the oldest prefilling sequence of the best effective
 * priority) lets the others' rows (prompt and decode) run before it only
 * until they add up to (1 / head_share - 1) times its prompt; then it goes
 * first (with at least head_share of the budget while shorter ones have
 * aged), so a stream of short requests cannot stretch a long prompt's
 * prefill without bound, no prompt starves, and prompts at least as long
 * as the head do not age: they wait to be head in turn. FIFO is the old order
 * (oldest first, taking all it can), kept as the baseline.
 * Priorities (lower first, KVT_PRIORITY_MIN..MAX) also order the queue; a
 * waiting request gains one level per priority_aging_s. FAIR admits a
 * prompt longer than prefill_chunk only while it leaves a reserve of T0 to
 * shorter ones (one step's budget of them, at most a quarter of T0); when
 * the best queued request does not fit T0 next to the running ones, it
 * admits smaller ones that do past it, their prompts adding up to at most
 * the same (1 / head_share - 1) times its prompt, then waits for room for it.
 *
 * Memory pressure: when T0 cannot hold the next step, the lowest-priority,
 * latest running sequence is preempted: its pins and T0 references are let
 * go, its registered blocks stay in the cache (the manager demotes them to
 * T1 as T0 needs room), and it goes back to the front of the queue with
 * every token so far. Re-admitted, it takes its own blocks back through the
 * prefix cache (SWAP) or only those still in T0, prefilling the rest
 * (RECOMPUTE), and goes on exactly where it stopped: with a lossless T1
 * (or by recompute) its greedy tokens are those of an uninterrupted run.
 * NOTE: "identical" assumes kernels whose result for a row does not depend
 * on how many rows share the matmul (the reference kernels, the emulator);
 * recomputed rows run as prefill where they first ran as decode, and a fast
 * path whose prefill and decode matmuls round differently can flip a
 * near-tie, exactly as continuous batching itself can.
 *
 * Threads: kvt_sched_* calls are safe from any thread (the HTTP server's
 * connection threads). Only the scheduler thread touches the model.
 */
#ifndef KVT_SCHEDULER_H
#define KVT_SCHEDULER_H

#include "manager.h" /* the prefix-cache handle, the tier counters; the index types it carries */
#include "grammar.h"
#include "model.h"
#include "sampler.h"

struct kvt_tok;

enum kvt_sched_policy {
	KVT_SCHED_FAIR = 0, /* default: priority, shortest remaining prompt first, aging */
	KVT_SCHED_FIFO = 1, /* prompt chunks oldest first, each taking all the budget it can */
};

enum kvt_preempt_mode {
	KVT_PREEMPT_SWAP = 0,      /* a preempted sequence's cached blocks come back from any tier */
	KVT_PREEMPT_RECOMPUTE = 1, /* only those still in T0 are reused; the rest is prefilled again */
};

#define KVT_PRIORITY_MIN (-100) /* request priorities: lower runs first */
#define KVT_PRIORITY_MAX 100
#define KVT_PRIORITY_LEVELS (KVT_PRIORITY_MAX - KVT_PRIORITY_MIN + 1)
#define KVT_SCHED_MAX_TENANT_PRIO 64 /* per-tenant default priorities */

typedef struct kvt_tenant_priority {
	char tenant[KVT_NAME_MAX + 1]; /* kvt_name_check'ed */
	int priority;                  /* KVT_PRIORITY_MIN..MAX */
} kvt_tenant_priority;

typedef struct kvt_sched_config {
	kvt_dev *dev;              /* borrowed: the model's device */
	kvt_model *model;          /* borrowed */
	const struct kvt_tok *tok; /* borrowed: end-of-generation ids */
	kvt_t0_pool *t0;           /* borrowed: the pool sequences draw from */
	kvt_tm *tm;                /* borrowed; NULL: no prefix cache (every prompt is prefilled) */
	kvt_db *db;                /* borrowed; NULL: sessions are not kept */
	uint8_t model_fp[KVT_HASH_BYTES]; /* model fingerprint (chain roots) */
	uint32_t layout_version;   /* KV layout version (chain roots) */
	const uint8_t *secret;     /* server secret for tenant salts (>= 16 bytes; copied) */
	size_t secret_bytes;
	uint32_t max_running;      /* sequences decoding at once (default 16) */
	uint32_t max_queue;        /* requests waiting beyond the free places of max_running; more: submit says
	                              KVT_EFULL (default 64; 0: a request is taken only into a free place) */
	uint32_t prefill_chunk;    /* prompt tokens run per scheduler step (default 256) */
	bool cache;                /* reuse cached prefixes (default true; false: benchmark baseline) */
	int policy;                /* enum kvt_sched_policy (default FAIR) */
	uint32_t aging_steps;      /* FAIR: a prefilling sequence passed over this many steps goes first (default 4) */
	float head_share;          /* FAIR: others may run (1/head_share - 1) x the head prompt's length before it (default 0.8; 0 = no limit) */
	double priority_aging_s;   /* a waiting request's priority improves one level per this (default 5; 0 = never) */
	int preempt;               /* enum kvt_preempt_mode (default SWAP) */
	bool admit_longest;        /* admit only when T0 holds every request at its longest (no preemption needed; default false: the prompt's blocks) */
	int default_priority;      /* a request without one, of a tenant not listed (default 0) */
	kvt_tenant_priority tenant_priority[KVT_SCHED_MAX_TENANT_PRIO]; /* per-tenant defaults */
	uint32_t n_tenant_priority; /* entries used */
	int retain_tier;           /* floor tier of a retention that names none (default KVT_TIER_HOST) */
	bool device_decode;        /* a step of decode rows only, every one greedy with nothing the host sampler must see
				    * (no grammar, logprobs, penalties or bias), runs as kvt_model_decode where the backend
				    * has graphs: one graph launch, the tokens picked on the device (default true) */
	uint32_t layer_groups;     /* a cached prefix all in T0/T1 comes up layer group by layer group in this many
	                              groups, its prefill waiting per layer on the device (kvt_tm_promote_layered);
	                              0 (default): the sequential promotion (I/O threads, then prefill) */
	const char *rate_path;     /* the prefill rate kept between runs (kvt_prefill_rate_*; copied): read at create,
	                              written once this run has measured 0.5 s of prefill; NULL (default): none, and
	                              the rate comes from this run's prefills alone */
	float chunk_recompute;     /* chunk reuse: the fraction of a found chunk's tokens recomputed past the check
	                              layers, 0..1 (default 0.15; a request's chunk_recompute overrides it) */
	float chunk_share;         /* chunk reuse: the share of each tier's blocks chunk blocks may hold before
	                              eviction takes them first, 0..1 (default 0.5) */
} kvt_sched_config;

void kvt_sched_config_default(kvt_sched_config *c);

/*
 * The prefill rate kept between runs (prefill_rate.c): one small text file
 * keyed by the model fingerprint, the CPU's model string and the device's
 * description (backend and threads), so a start need not measure it.
 */
typedef struct kvt_prefill_rate_key {
	char model[2 * KVT_HASH_BYTES + 1]; /* the model fingerprint, hex */
	char cpu[256];                      /* /proc/cpuinfo's model name ("?" without one) */
	char device[96];                    /* kvt_dev_name(): backend, threads */
} kvt_prefill_rate_key;

/* The key of model_fp run on d (reads /proc/cpuinfo). */
void kvt_prefill_rate_key_init(kvt_prefill_rate_key *k, const kvt_dev *d, const uint8_t model_fp[KVT_HASH_BYTES]);
/*
 * The rate path holds for k: KVT_OK and *rate_out; KVT_ENOTFOUND when there
 * is no file or it is another key's (logged at info); KVT_ECORRUPT when it is
 * not a file this writes (logged as a warning). Never fatal: the caller
 * measures the rate instead.
 */
int kvt_prefill_rate_load(const char *path, const kvt_prefill_rate_key *k, double *rate_out);
/* Write rate for k to path (a temporary file renamed over it). KVT_OK, or KVT_EIO/KVT_EINVAL (logged). */
int kvt_prefill_rate_save(const char *path, const kvt_prefill_rate_key *k, double rate);
/*
 * Parse "tenant:prio, tenant2:prio2, *:prio" (prio KVT_PRIORITY_MIN..MAX;
 * "*" sets default_priority) into c->tenant_priority / default_priority.
 * "" is no entries. KVT_EINVAL with the reason in why (c unchanged).
 */
int kvt_sched_parse_priorities(const char *text, kvt_sched_config *c, char *why, size_t why_cap);

enum kvt_finish {
	KVT_FINISH_NONE = 0,      /* still running */
	KVT_FINISH_STOP = 1,      /* an end-of-generation token (not returned) */
	KVT_FINISH_LENGTH = 2,    /* max_tokens reached, or the context is full */
	KVT_FINISH_CANCELLED = 3, /* kvt_sched_cancel, or shutdown */
	KVT_FINISH_ERROR = 4,     /* the engine failed (logged); usage still valid */
	KVT_FINISH_UNSAVED = 5,   /* generated, but its session row could not be made durable (no space, or the
	                             index failed): the turn is not acknowledged (HTTP 507) */
};
const char *kvt_finish_name(int finish); /* "stop", "length", "cancelled", "error", "unsaved" */

/* One retained prefix of a request's prompt (tiers/manager.h, "Retention"). */
#define KVT_SCHED_MAX_RETAIN 4
typedef struct kvt_sched_retain {
	uint32_t tokens;               /* keep the full blocks of prompt[0..tokens) */
	double ttl_s;                  /* for this long (> 0), restarted by every hit */
	int tier;                      /* floor tier (enum kvt_tier); -1: the config's (kvt_sched_config.retain_tier) */
} kvt_sched_retain;

/*
 * A span of the prompt marked for reuse at any position (a document, a tool
 * output: docs/http-api.md, "Chunk reuse"): its KV is stored and found by its
 * own tokens (the tenant's chunk root), not by the chain before it, and
 * blended in where it lands (the scheduler's file comment).
 */
#define KVT_SCHED_MAX_CHUNKS 16 /* marked spans per request */
typedef struct kvt_sched_chunk {
	uint32_t start;                /* first token of the span in the prompt */
	uint32_t n;                    /* its tokens (>= 1; only its full blocks are cached) */
} kvt_sched_chunk;

typedef struct kvt_sched_req {
	const int32_t *prompt;         /* [n_prompt] token ids (copied by submit) */
	uint32_t n_prompt;             /* >= 1 */
	uint32_t max_tokens;           /* >= 1 */
	kvt_sampler_params sample;     /* temp 0 = greedy; penalties, bias (sampler.h) */
	kvt_grammar *grammar;          /* borrowed: submit takes its own reference; NULL: unconstrained */
	bool logprobs;                 /* keep each generated token's raw logprobs (kvt_sched_next_lp) */
	uint32_t top_logprobs;         /* with logprobs: alternatives per token (0..20) */
	bool ignore_eos;               /* do not stop at end-of-generation tokens (but at a grammar's end) */
	char tenant[KVT_NAME_MAX + 1]; /* kvt_name_check'ed; "" = "default" */
	char session_id[KVT_NAME_MAX + 1]; /* "" = no session */
	bool has_priority;             /* priority given; else the tenant's default */
	int priority;                  /* KVT_PRIORITY_MIN..MAX, lower first */
	kvt_sched_retain retain[KVT_SCHED_MAX_RETAIN]; /* prefixes to keep (cache-control breakpoints) */
	uint32_t n_retain;             /* entries of retain[] (0: none) */
	kvt_sched_chunk chunks[KVT_SCHED_MAX_CHUNKS]; /* spans for chunk reuse, in prompt order, disjoint */
	uint32_t n_chunks;             /* entries of chunks[] (0: none) */
	float chunk_recompute;         /* fraction of a reused chunk's tokens recomputed, 0..1; < 0: the
	                                  scheduler's default (kvt_sched_config.chunk_recompute) */
} kvt_sched_req;

typedef struct kvt_sched_usage {
	uint32_t prompt_tokens;        /* tokens of the prompt */
	uint32_t completion_tokens;    /* tokens generated */
	uint32_t cached_tokens;        /* prompt tokens served from the cache (full blocks) */
	uint32_t cached_by_tier[KVT_TM_N_TIERS]; /* of those, by the tier the block was found in (KVT_TM_TIER_REMOTE: T3) */
	uint32_t lossy_cached_tokens;  /* of the cached tokens, those whose K/V came through an 8-bit (FP8/INT8) copy
	                                  (greedy output may then differ from a recompute; 0 with an f16 [tier.host]) */
	uint32_t cache_read_tokens;    /* of the cached tokens, those of retained blocks (their TTL restarted) */
	uint32_t cache_creation_tokens;/* prompt tokens newly retained by this request */
	uint32_t retain_requested_tokens; /* full-block tokens the request asked to retain */
	uint32_t retain_denied_tokens; /* of those, refused (over the tenant's quota, or not cached) */
	double queue_s;                /* submit -> first scheduled */
	double ttft_s;                 /* submit -> first token */
	double total_s;                /* submit -> finish */
	int priority;                  /* the priority the request ran at (before aging) */
	uint32_t ttft_steps;           /* scheduler steps from submit to the first token */
	uint64_t first_step;           /* the scheduler's step count at the first token */
	uint32_t preemptions;          /* times it was preempted and resumed */
	uint32_t chunk_tokens;         /* prompt tokens in marked spans (kvt_sched_req.chunks) */
	uint32_t chunk_reused_tokens;  /* of those, tokens whose cached chunk K/V was used as found (blended in,
	                                  not recomputed past the check layers); never counted in cached_tokens */
	uint32_t chunk_recomputed_tokens; /* of those, tokens of found chunks recomputed to restore cross-chunk
	                                  attention (the recompute fraction) */
	bool has_miss;                 /* miss is filled (the prefix cache was asked; not with the cache off) */
	kvt_tm_miss miss;              /* why the first prompt token not served from the cache was not
	                                  (kvt_tm_miss_explain; reason NONE on a full hit) */
} kvt_sched_usage;

typedef struct kvt_sched kvt_sched;
typedef struct kvt_sched_handle kvt_sched_handle;

/* Start the scheduler thread. KVT_EINVAL (logged, naming the field), KVT_ENOMEM. */
int kvt_sched_create(const kvt_sched_config *cfg, kvt_sched **out);
/*
 * Stop: requests still queued or running finish with KVT_FINISH_CANCELLED
 * (call kvt_sched_drain first for a graceful stop); then every session's
 * blocks are flushed to T2 and the index is committed. NULL is a no-op.
 * Every handle must have been released.
 */
void kvt_sched_destroy(kvt_sched *s);

/* The limits a request must respect (for the HTTP layer's checks). */
uint32_t kvt_sched_n_vocab(const kvt_sched *s);
uint32_t kvt_sched_max_ctx(const kvt_sched *s); /* prompt + max_tokens must fit */

/*
 * Queue a request. KVT_EFULL: the queue is full (HTTP 503): max_queue
 * requests wait beyond the places max_running has free; KVT_EINVAL
 * (logged): a token id out of range, an empty prompt, prompt + max_tokens
 * over the context, a bad tenant or session id; KVT_ESTOPPED: draining (503);
 * KVT_ENOMEM.
 */
int kvt_sched_submit(kvt_sched *s, const kvt_sched_req *r, kvt_sched_handle **out);

/*
 * Wait up to timeout_s for progress. Copies the tokens generated since the
 * last call (at most cap; the rest come next call) to ids and their count to
 * *n; *finish is KVT_FINISH_NONE while running. Once every token has been
 * returned and the request has ended, *finish says why and *usage (may be
 * NULL) is filled. A request with a session_id ends only once its session
 * row has committed to the index (the turn is durable before its client
 * hears of its end), as KVT_FINISH_UNSAVED if the row could not commit.
 * Returns KVT_OK (possibly with *n == 0 on timeout).
 */
int kvt_sched_next(kvt_sched_handle *h, int32_t *ids, uint32_t cap, uint32_t *n, int *finish,
		   kvt_sched_usage *usage, double timeout_s);
/*
 * kvt_sched_next, with the logprobs of each token returned (lps[cap]; the
 * request must have asked for them, else lps is left alone).
 */
int kvt_sched_next_lp(kvt_sched_handle *h, int32_t *ids, kvt_token_lp *lps, uint32_t cap, uint32_t *n, int *finish,
		      kvt_sched_usage *usage, double timeout_s);
/*
 * A hook for callers that wait on many handles without a thread each (the
 * HTTP layer): fn(user) is called whenever any handle gets tokens or ends.
 * It runs on the scheduler thread with the scheduler's lock held, so it must
 * be quick and must not call back into the scheduler (signalling an eventfd
 * or a condition variable is the intended use). After
 * kvt_sched_set_progress(s, NULL, NULL) returns, fn is never called again.
 */
typedef void (*kvt_sched_progress_fn)(void *user);
void kvt_sched_set_progress(kvt_sched *s, kvt_sched_progress_fn fn, void *user);

/* Stop generating (client went away, a stop string matched). Safe to call twice. */
void kvt_sched_cancel(kvt_sched_handle *h);
/* Cancel if running, and free. NULL is a no-op. */
void kvt_sched_release(kvt_sched_handle *h);

/*
 * Graceful stop: refuse new submits (KVT_ESTOPPED) and wait up to timeout_s for
 * the running and queued requests to finish; those left are cancelled.
 * Returns how many were cancelled.
 */
uint32_t kvt_sched_drain(kvt_sched *s, double timeout_s);

/* ---- sessions ---- */

typedef struct kvt_session_info {
	char id[KVT_NAME_MAX + 1];
	char tenant[KVT_NAME_MAX + 1];
	uint32_t n_tokens;            /* token history length */
	uint32_t n_blocks;            /* full blocks of the history */
	uint32_t blocks_in[KVT_TIER_COUNT]; /* of those, resident in each tier now (highest tier counted) */
	uint32_t blocks_missing;      /* in no tier (would be recomputed) */
	uint32_t durable_tokens;      /* leading tokens the row says have their blocks durable in T2 (0: none or unknown) */
	int64_t updated_us;           /* wall clock of the last turn */
} kvt_session_info;

/* Sessions of a tenant ("" or NULL: every tenant), newest first; *out malloc'd (free()). */
int kvt_sched_sessions(kvt_sched *s, const char *tenant, kvt_session_info **out, size_t *n);
/* Forget a session (its blocks stay cached; their retention ends). KVT_ENOTFOUND, KVT_EINVAL (bad id). */
int kvt_sched_session_delete(kvt_sched *s, const char *tenant, const char *id);

typedef struct kvt_resume_report {
	char id[KVT_NAME_MAX + 1];
	uint32_t n_tokens;            /* tokens of the session's history */
	uint32_t n_blocks;            /* full blocks */
	uint32_t tokens_from[KVT_TM_N_TIERS]; /* tokens restored, by the tier each block was found in (and T3) */
	uint64_t bytes_from[KVT_TM_N_TIERS];  /* bytes read from each tier (and T3) */
	bool from_remote;             /* the session itself came from T3 (not in the local index) */
	uint32_t tokens_missing;      /* tokens whose blocks are in no tier (will be prefilled) */
	uint32_t durable_tokens;      /* leading tokens the row says have their blocks durable in T2 */
	uint32_t durable_lost_tokens; /* of those, tokens past the served prefix: the row's blocks since lost
	                                 (evicted from T2, damaged), logged; they are prefilled too */
	double seconds;               /* wall time of the resume */
	double prefill_s;             /* re-prefill time avoided */
	bool prefill_measured;        /* prefill_s measured (else estimated from the measured prefill rate) */
} kvt_resume_report;

/* Progress callback: blocks done of total. Called on the caller's thread. */
typedef void (*kvt_resume_progress_fn)(void *user, uint32_t done, uint32_t total);

/*
 * Page a session's blocks back in (T2 -> T1 -> T0, or as far as room
 * allows), reporting progress. A session the index does not have is taken
 * from T3 when there is one (rep->from_remote; kept in the index from then
 * on), and blocks past the local ones come from T3 too. KVT_ENOTFOUND (no
 * such session for this tenant), KVT_EINVAL, KVT_EIO.
 */
/* Whether T3 (when there is one) holds the session: KVT_OK, KVT_ENOTFOUND (also without T3), KVT_EIO. */
int kvt_sched_session_remote(kvt_sched *s, const char *tenant, const char *id);
int kvt_sched_session_resume(kvt_sched *s, const char *tenant, const char *id, kvt_resume_progress_fn progress,
			     void *user, kvt_resume_report *rep);

/* ---- statistics ---- */

#define KVT_TTFT_BUCKETS 12
/* Upper bounds (seconds) of the TTFT histogram buckets; the last is +Inf. */
extern const double kvt_ttft_bucket_le[KVT_TTFT_BUCKETS];

typedef struct kvt_sched_stats {
	kvt_tm_stats tiers;            /* the manager's counters (zero without tm) */
	bool have_tiers;               /* tm present */
	uint32_t running;              /* sequences running now */
	uint32_t queued;               /* requests waiting */
	uint64_t requests;             /* requests finished */
	uint64_t requests_failed;      /* of those, KVT_FINISH_ERROR or KVT_FINISH_UNSAVED */
	uint64_t prompt_tokens;        /* prompt tokens of finished requests */
	uint64_t cached_tokens;        /* of those, served from cache */
	uint64_t cached_by_tier[KVT_TM_N_TIERS];
	uint64_t lossy_cached_tokens;  /* of the cached tokens, those from 8-bit copies */
	uint64_t reusable_tokens;      /* of those, the full blocks of the prompt (the cacheable part) */
	uint64_t prefill_tokens;       /* tokens prefilled (prompt - cached) */
	uint64_t completion_tokens;    /* tokens generated */
	double prefill_s;              /* time spent in prefill chunks */
	double decode_s;               /* time spent in decode steps */
	uint64_t prefix_queries_tokens;/* tokens looked up in the prefix cache */
	uint64_t prefix_hits_tokens;   /* tokens found */
	uint64_t ttft_bucket[KVT_TTFT_BUCKETS]; /* TTFT histogram (non-cumulative counts) */
	double ttft_sum_s;             /* sum of TTFTs */
	double ttft_p50_s, ttft_p99_s; /* over the last 1024 requests (0 if none) */
	uint64_t steps;                /* scheduler steps run (batches) */
	uint64_t device_steps;         /* of those, run as kvt_model_decode (cfg.device_decode) */
	uint32_t running_peak;         /* most sequences running at once */
	double queue_wait_sum_s;       /* sum over admissions of submit (or preemption) -> admitted */
	uint64_t queue_waits;          /* admissions counted in it */
	uint64_t admit_backfills;      /* of those, FAIR admissions past a better request T0 could not hold yet */
	double queue_wait_p50_s, queue_wait_p99_s; /* over the last 1024 admissions (0 if none) */
	uint64_t preempt_swap;         /* preemptions whose blocks were kept in the cache (reused from any tier) */
	uint64_t preempt_recompute;    /* preemptions resumed by recomputing what left T0 */
	uint64_t preempt_tokens;       /* tokens the preempted sequences held (KV let go) */
	uint64_t resume_recomputed_tokens; /* of the resumed tokens, those prefilled again */
	uint64_t resume_swapped_in_tokens; /* of the resumed tokens, those brought back from T1 or T2 */
	uint64_t ttft_by_priority_n[KVT_PRIORITY_LEVELS];   /* first tokens by priority (index priority - MIN) */
	double ttft_by_priority_sum_s[KVT_PRIORITY_LEVELS]; /* their TTFT sums */
	uint64_t sessions;             /* sessions known */
	bool have_index;               /* db present */
	kvt_db_stats index;            /* the index's counters: degraded, rolled back, bad session rows (zero without db) */
	uint64_t layered_promotions;   /* cached prefixes brought up from T1 layer group by layer group (layer_groups) */
	uint64_t weight_bytes;         /* the model's weights (kvt_model_weight_bytes) */
	uint64_t weight_mapped_bytes;  /* of which point into the model file's mapping (kvt_model_mapped_bytes) */
	/* chunk reuse (kvt_sched_req.chunks): full-block tokens of marked spans */
	uint64_t chunk_lookup_tokens;  /* looked up (spans outside the exact cached prefix) */
	uint64_t chunk_hit_tokens;     /* of those, found in some tier (a hit) */
	uint64_t chunk_stored_tokens;  /* stored as new chunk blocks (a miss computed, then kept) */
	uint64_t chunk_reused_tokens;  /* found and blended in as found (not recomputed) */
	uint64_t chunk_recomputed_tokens; /* found and recomputed (the recompute fraction) */
	uint64_t chunk_hits_by_tier[KVT_TM_N_TIERS]; /* found tokens by the tier each block was found in */
	uint64_t chunk_bytes_from[KVT_TM_N_TIERS];   /* bytes read for chunk lookups, by source tier */
	uint64_t chunk_blends;         /* prefills that blended chunks in */
} kvt_sched_stats;

void kvt_sched_get_stats(kvt_sched *s, kvt_sched_stats *st);
/* Retention per tenant (kvt_tm_get_tenants); *out malloc'd (free()), *n = 0 without a cache. */
int kvt_sched_tenants(kvt_sched *s, kvt_tm_tenant_stats **out, uint32_t *n);

#endif
