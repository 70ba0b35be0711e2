/*
 * engine/serve/scheduler.c — continuous batching over the requests, and the
 * prefix cache through the tiering manager's prefix-cache handle
 * (scheduler.h; the sessions are engine/serve/sessions.c).
 *
 * One scheduler thread. Each step it:
 *   1. admits queued requests while fewer than max_running run: hashes the
 *      fill's full blocks under the tenant's chain root (each block once: the
 *      same hashes serve the lookup and, later, registration) and acquires
 *      their prefix handle; the manager pins what is cached and chooses how
 *      it comes up (tiers/manager.h: READY, LAYERED, ASYNC, REMOTE);
 *   2. builds one batch: one row per decoding sequence (its last sampled
 *      token), one row per finishing sequence (its last token, so the whole
 *      turn's K/V is stored and its blocks cached), then prompt chunks of the
 *      prefilling sequences up to prefill_chunk rows, shared by the policy
 *      (scheduler.h: FAIR ranks by priority, shortest remaining, aging;
 *      FIFO gives the oldest all it takes); a prefix still coming up layer
 *      group by layer group gates its sequence's forward (the handle's gate);
 *   3. makes room in T0 (the manager evicts); if it cannot, preempts the
 *      lowest-priority, latest sequence (back to the queue's front, its
 *      blocks left to the cache) and builds the step again; then runs it;
 *   4. settles layered prefixes, registers every new full block with the
 *      manager, samples the next token of each sequence that asked for
 *      logits, and ends the requests that are done: the handle released
 *      (unpinned), the session row and the end of that request's turn
 *      (sched_turn_end, sessions.c).
 *
 * The manager functions this file calls: kvt_tm_prefix_acquire / _ready /
 * _take / _gate / _settle / _get_counts / _release (the cached prefix),
 * kvt_tm_register (a new block), kvt_tm_reserve_t0 (room for a step),
 * kvt_tm_retain (cache control), and
 * for statistics and shutdown kvt_tm_get_stats, kvt_tm_get_tenants,
 * kvt_tm_flush. It never touches a T0 slot, the block table or the index
 * (cmake/check_layout.cmake fails the build if it does); of the T0 pool it
 * asks only its size and free count (the admission and step budgets), and of
 * the index module only the pure chain hash (kvt_hash_chain).
 *
 * A request's handle moves through these states (h->state; scheduler
 * thread only):
 *
 *   submit -> QUEUED --admit--> PROMOTE --handle ready--> PREFILL --prompt done--> DECODE
 *               ^  |                                        ^  |                      |
 *               |  '---------- prefix up at once, or none --'  |                      | EOG, max_tokens,
 *               |                                              |                      | context full
 *               '--- preempt (T0 full: its pins and T0 refs go) +----------------------+
 *                                                                                      v
 *                                  DONE <-- one more row (the last token's K/V) -- FINISHING
 *
 *   Any state but DONE -> DONE on cancel, shutdown or an engine error
 *   (finish_request). DONE handles leave the running list (prune) and are
 *   freed by whichever of the client and the scheduler lets go last.
 *
 * Locking: s->mu guards the queue, the handles' client-visible fields and
 * the counters (sched_int.h). The model, the sequences, the samplers and
 * the prefix handles belong to the scheduler thread alone.
 */
#include "sched_int.h"

#include "tokenizer.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const double kvt_ttft_bucket_le[KVT_TTFT_BUCKETS] = { 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
						      0.5,   1.0,  2.5,   5.0,  10.0, INFINITY };


enum h_state { H_QUEUED, H_PROMOTE, H_PREFILL, H_DECODE, H_FINISHING, H_DONE };

/*
 * Chunk reuse. A marked span (kvt_sched_req.chunks) is named by its own
 * tokens: its full blocks form a chain under the tenant's chunk root
 * (sched_chunk_root), whatever precedes it. Admission looks each span up
 * (a SERVE handle, waited for at once); once the exact prefix is taken, the
 * blocks found are moved into the request's sequence at the span's position
 * (kvt_model_kv_move: their K was stored at chunk-relative positions, and
 * is turned by the span's start), and the handle is let go. The prompt is
 * prefilled as usual up to the first placed span; from there to the
 * prompt's last token kvt_model_forward_blend runs alone (the rows placed
 * are recomputed past the check layer only in the fraction asked for); the
 * last token runs in the batch as usual. Blocks from the first placed span
 * on are not registered under the chain: their K/V are not a plain
 * prefill's, and an exact prefix hit must be exact. A span not found is
 * stored once its positions are computed: its K/V moved to chunk-relative
 * positions (turned by -start) into fresh blocks, registered under the
 * chunk chain. A preempted request resumes without chunk reuse.
 */
#define NO_BLEND UINT32_MAX
#define BLEND_CHECK_LAYER 1u

typedef struct sched_chunk {
	uint32_t start, n;                 /* the span in the prompt */
	uint32_t n_blocks;                 /* its full blocks */
	uint8_t (*hashes)[KVT_HASH_BYTES]; /* [n_blocks] their chain under the chunk root */
	kvt_tm_prefix *pfx;                /* the lookup, until placed (NULL: none) */
	uint32_t n_found;                  /* leading blocks found and placed */
	bool stored;                       /* the blocks not found were stored (or need not be) */
} sched_chunk;

/*
 * A preempted request keeps its handle, tokens and sampler; only its
 * sequence (T0 references) and pins go. n_fill is how many tokens its KV
 * must hold before it samples again: the prompt at first; after a
 * preemption in decode, every token but the last sampled one (which the
 * next decode row runs), so the resumed sequence computes exactly the rows
 * an uninterrupted one would have.
 */

struct kvt_sched_handle {
	kvt_sched *s;
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
	kvt_sched_usage usage;
	kvt_sched_handle *next;     /* queue / running list link */
	/* scheduler thread only */
	int state;                  /* enum h_state */
	uint32_t cap_toks;
	kvt_seq seq;
	bool seq_ready;
	kvt_sampler sampler;
	bool sampler_ready;
	kvt_gmatch *gm;             /* the grammar's matcher (req.grammar), NULL: unconstrained */
	kvt_token_lp *lps;          /* [max_tokens + 1] logprobs of the generated tokens (req.logprobs >= 0), under s->mu as toks */
	uint8_t root[KVT_HASH_BYTES];      /* the tenant's chain root */
	uint8_t (*hashes)[KVT_HASH_BYTES]; /* [max blocks] the chain of toks' full blocks: hashed once each (admission
	                                      for the fill, registration for the rest), for lookup and registration */
	uint32_t n_hashed;          /* leading hashes[] computed */
	uint32_t n_hashes;          /* leading blocks in the cache: the served prefix, then those registered */
	kvt_tm_prefix *pfx;         /* the cached prefix's handle (tiers/manager.h): pins, promotion, layer gate; NULL
	                               without one */
	double t_submit, t_first;
	int prio;                   /* priority (the request's, or its tenant's default) */
	uint64_t submit_step;       /* the step count at submit (under s->mu) */
	double t_wait;              /* entered the queue (submit or preemption), under s->mu */
	uint32_t n_fill;            /* tokens the KV must hold before sampling (see above) */
	bool resume_decode;         /* preempted while decoding: after the fill, decode without sampling */
	bool preempted;             /* re-queued by a preemption (admission does not count it anew) */
	uint32_t passed;            /* FAIR: steps passed over while prefilling */
	uint32_t yielded;           /* FAIR: others' rows run while this was the head prompt */
	uint32_t committed;         /* T0 blocks committed at admission (t0_committed) */
	uint64_t seq_no;            /* admission order (latest = largest) */
	sched_chunk *chunks;        /* [req.n_chunks] the marked spans' chunk chains (NULL: none, or preempted) */
	uint32_t blend_at;          /* the prompt position where the blended prefill starts (NO_BLEND: none) */
	uint32_t reg_limit;         /* blocks that may be registered under the chain: those before blend_at */
};


void kvt_sched_config_default(kvt_sched_config *c)
{
	memset(c, 0, sizeof(*c));
	c->layout_version = KVT_KV_LAYOUT_VERSION;
	c->max_running = 16;
	c->max_queue = 64;
	c->prefill_chunk = 256;
	c->cache = true;
	c->policy = KVT_SCHED_FAIR;
	c->aging_steps = 4;
	c->head_share = 0.8f;
	c->priority_aging_s = 5.0;
	c->preempt = KVT_PREEMPT_SWAP;
	c->retain_tier = KVT_TIER_HOST;
	c->device_decode = true;
	c->chunk_recompute = 0.15f;
	c->chunk_share = 0.5f;
}

const char *kvt_finish_name(int finish)
{
	switch (finish) {
	case KVT_FINISH_STOP: return "stop";
	case KVT_FINISH_LENGTH: return "length";
	case KVT_FINISH_CANCELLED: return "cancelled";
	case KVT_FINISH_ERROR: return "error";
	case KVT_FINISH_UNSAVED: return "unsaved";
	default: return "none";
	}
}

uint32_t kvt_sched_n_vocab(const kvt_sched *s) { return s->n_vocab; }
uint32_t kvt_sched_max_ctx(const kvt_sched *s) { return s->max_ctx; }

/* T0 blocks a request's sequence may hold at its longest. */
static uint32_t blocks_at_most(const kvt_sched *s, const kvt_sched_handle *h)
{
	return (h->req.n_prompt + h->req.max_tokens + s->block_tokens - 1) / s->block_tokens;
}

/* T0 blocks admission commits: at its longest, or (preemption covers growth) its fill and one block more. */
static uint32_t blocks_to_commit(const kvt_sched *s, const kvt_sched_handle *h)
{
	if (s->cfg.admit_longest)
		return blocks_at_most(s, h);
	uint32_t n = (h->n_fill + s->block_tokens - 1) / s->block_tokens + 1;
	uint32_t most = blocks_at_most(s, h);
	return n < most ? n : most;
}

/* The priority a request waits at: one level better per priority_aging_s waited (never past MIN). */
static int effective_priority(const kvt_sched *s, const kvt_sched_handle *h, double now)
{
	int p = h->prio;
	if (s->cfg.priority_aging_s > 0 && !h->t_first) {
		double levels = floor((now - h->t_submit) / s->cfg.priority_aging_s);
		p = levels >= (double)(p - KVT_PRIORITY_MIN) ? KVT_PRIORITY_MIN : p - (int)levels;
	}
	return p;
}

/* A request's default priority: its tenant's entry, else default_priority. */
static int tenant_priority(const kvt_sched *s, const char *tenant)
{
	for (uint32_t i = 0; i < s->cfg.n_tenant_priority; i++)
		if (!strcmp(s->cfg.tenant_priority[i].tenant, sched_tenant(tenant)))
			return s->cfg.tenant_priority[i].priority;
	return s->cfg.default_priority;
}

/* ---- handles ---- */

/* Let go of the chunk lookups and chains (the handles' pins and T0 references). */
static void chunks_free(kvt_sched_handle *h)
{
	for (uint32_t i = 0; h->chunks && i < h->req.n_chunks; i++) {
		kvt_tm_prefix_release(h->s->cfg.tm, h->chunks[i].pfx);
		free(h->chunks[i].hashes);
	}
	free(h->chunks);
	h->chunks = NULL;
	h->blend_at = NO_BLEND;
}

static void handle_free(kvt_sched_handle *h)
{
	if (h->sampler_ready)
		kvt_sampler_deinit(&h->sampler);
	kvt_gmatch_destroy(h->gm);
	kvt_grammar_unref(h->req.grammar);
	free(h->lps);
	if (h->seq_ready)
		kvt_seq_deinit(&h->seq);
	pthread_cond_destroy(&h->cv);
	chunks_free(h);
	free(h->hashes);
	free(h->toks);
	free(h);
}

/*
 * Places of max_running not held by a live request (under mu). A request
 * that has ended holds none, though prune has not yet taken it off the
 * running list: a client that sends its next request on the last one's end
 * finds its place free (with max_queue = 0 it would be refused otherwise).
 */
static uint32_t free_places(const kvt_sched *s)
{
	uint32_t live = s->n_running - s->n_ended;
	return live < s->cfg.max_running ? s->cfg.max_running - live : 0;
}

int kvt_sched_submit(kvt_sched *s, const kvt_sched_req *r, kvt_sched_handle **out)
{
	*out = NULL;
	if (!r->n_prompt || !r->prompt || !r->max_tokens) {
		KVT_LOGE("sched: a request needs a prompt and max_tokens >= 1");
		return KVT_EINVAL;
	}
	if ((uint64_t)r->n_prompt + r->max_tokens > s->max_ctx) {
		KVT_LOGE("sched: %u prompt tokens + %u max_tokens exceed the context of %u", r->n_prompt, r->max_tokens,
			 s->max_ctx);
		return KVT_EINVAL;
	}
	uint32_t longest = (r->n_prompt + r->max_tokens + s->block_tokens - 1) / s->block_tokens;
	if (longest > kvt_t0_n_slots(s->cfg.t0)) {
		KVT_LOGE("sched: %u prompt tokens + %u max_tokens need %u blocks; the device pool has %u (tier.hbm capacity)",
			 r->n_prompt, r->max_tokens, longest, kvt_t0_n_slots(s->cfg.t0));
		return KVT_EINVAL;
	}
	for (uint32_t i = 0; i < r->n_prompt; i++) {
		if (r->prompt[i] < 0 || (uint32_t)r->prompt[i] >= s->n_vocab) {
			KVT_LOGE("sched: token id %d at %u is outside the vocabulary (%u)", r->prompt[i], i, s->n_vocab);
			return KVT_EINVAL;
		}
	}
	if ((r->tenant[0] && kvt_name_check("tenant", r->tenant)) ||
	    (r->session_id[0] && kvt_name_check("session id", r->session_id)))
		return KVT_EINVAL;
	if (r->session_id[0] && !s->cfg.db) {
		KVT_LOGE("sched: session \"%s\": sessions are not kept (no index)", r->session_id);
		return KVT_EINVAL;
	}
	if (r->has_priority && (r->priority < KVT_PRIORITY_MIN || r->priority > KVT_PRIORITY_MAX)) {
		KVT_LOGE("sched: priority %d is outside %d..%d", r->priority, KVT_PRIORITY_MIN, KVT_PRIORITY_MAX);
		return KVT_EINVAL;
	}
	if (r->grammar && !s->trie) {
		KVT_LOGE("sched: a grammar needs the tokenizer (the scheduler has none)");
		return KVT_EINVAL;
	}
	if (r->top_logprobs > KVT_MAX_TOP_LOGPROBS) {
		KVT_LOGE("sched: %u top logprobs asked; at most %d", r->top_logprobs, KVT_MAX_TOP_LOGPROBS);
		return KVT_EINVAL;
	}
	if (r->n_chunks > KVT_SCHED_MAX_CHUNKS || !(r->chunk_recompute <= 1.0f)) {
		KVT_LOGE("sched: %u chunk spans (at most %d), recompute %g (at most 1)", r->n_chunks, KVT_SCHED_MAX_CHUNKS,
			 r->chunk_recompute);
		return KVT_EINVAL;
	}
	for (uint32_t i = 0, end = 0; i < r->n_chunks; i++) {
		const kvt_sched_chunk *c = &r->chunks[i];
		if (!c->n || c->start < end || (uint64_t)c->start + c->n > r->n_prompt) {
			KVT_LOGE("sched: chunk span %u (%u tokens at %u) is empty, overlaps the one before or leaves the prompt "
				 "of %u", i, c->n, c->start, r->n_prompt);
			return KVT_EINVAL;
		}
		end = c->start + c->n;
	}

	kvt_sched_handle *h = calloc(1, sizeof(*h));
	if (!h)
		return KVT_ENOMEM;
	h->s = s;
	h->req = *r;
	h->cap_toks = r->n_prompt + r->max_tokens;
	h->toks = malloc((size_t)h->cap_toks * sizeof(int32_t));
	if (!h->toks) {
		free(h);
		return KVT_ENOMEM;
	}
	if (r->logprobs && !(h->lps = malloc((size_t)(r->max_tokens + 1) * sizeof(kvt_token_lp)))) {
		free(h->toks);
		free(h);
		return KVT_ENOMEM;
	}
	if (r->grammar)
		kvt_grammar_ref(r->grammar);
	memcpy(h->toks, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
	h->n_toks = r->n_prompt;
	h->req.prompt = h->toks;
	h->state = H_QUEUED;
	h->t_submit = h->t_wait = kvt_now_s();
	h->n_fill = r->n_prompt;
	h->blend_at = NO_BLEND;
	h->reg_limit = UINT32_MAX;
	h->prio = r->has_priority ? r->priority : tenant_priority(s, r->tenant);
	h->usage.priority = h->prio;
	pthread_cond_init(&h->cv, NULL);

	pthread_mutex_lock(&s->mu);
	int rc = KVT_OK;
	if (s->draining || s->stop)
		rc = KVT_ESTOPPED;
	else if (s->n_queued >= s->cfg.max_queue + free_places(s))
		rc = KVT_EFULL; /* max_queue waiting beyond the batch's free places (0: none waits) */
	if (rc) {
		pthread_mutex_unlock(&s->mu);
		pthread_cond_destroy(&h->cv);
		kvt_grammar_unref(h->req.grammar);
		free(h->lps);
		free(h->toks);
		free(h);
		return rc;
	}
	h->submit_step = s->st.steps;
	if (s->q_tail)
		s->q_tail->next = h;
	else
		s->q_head = h;
	s->q_tail = h;
	s->n_queued++;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->mu);
	*out = h;
	return KVT_OK;
}

static void abs_deadline(struct timespec *ts, double seconds)
{
	clock_gettime(CLOCK_REALTIME, ts);
	double whole = floor(seconds);
	ts->tv_sec += (time_t)whole;
	ts->tv_nsec += (long)((seconds - whole) * 1e9);
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

int kvt_sched_next(kvt_sched_handle *h, int32_t *ids, uint32_t cap, uint32_t *n, int *finish,
		   kvt_sched_usage *usage, double timeout_s)
{
	return kvt_sched_next_lp(h, ids, NULL, cap, n, finish, usage, timeout_s);
}

int kvt_sched_next_lp(kvt_sched_handle *h, int32_t *ids, kvt_token_lp *lps, uint32_t cap, uint32_t *n, int *finish,
		      kvt_sched_usage *usage, double timeout_s)
{
	kvt_sched *s = h->s;
	struct timespec dl;
	abs_deadline(&dl, timeout_s > 0 ? timeout_s : 0);
	pthread_mutex_lock(&s->mu);
	while (h->n_returned == h->n_visible && !h->ended) {
		if (timeout_s <= 0 || pthread_cond_timedwait(&h->cv, &s->mu, &dl) == ETIMEDOUT)
			break;
	}
	uint32_t k = h->n_visible - h->n_returned;
	if (k > cap)
		k = cap;
	memcpy(ids, h->toks + h->req.n_prompt + h->n_returned, (size_t)k * sizeof(int32_t));
	if (lps && h->lps)
		memcpy(lps, h->lps + h->n_returned, (size_t)k * sizeof(kvt_token_lp));
	h->n_returned += k;
	*n = k;
	*finish = KVT_FINISH_NONE;
	if (h->ended && h->n_returned == h->n_visible) {
		*finish = h->finish;
		if (usage)
			*usage = h->usage;
	}
	pthread_mutex_unlock(&s->mu);
	return KVT_OK;
}

void kvt_sched_set_progress(kvt_sched *s, kvt_sched_progress_fn fn, void *user)
{
	pthread_mutex_lock(&s->mu);
	s->progress = fn;
	s->progress_user = user;
	pthread_mutex_unlock(&s->mu);
}

void kvt_sched_cancel(kvt_sched_handle *h)
{
	kvt_sched *s = h->s;
	pthread_mutex_lock(&s->mu);
	h->cancel = true;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->mu);
}

void kvt_sched_release(kvt_sched_handle *h)
{
	if (!h)
		return;
	kvt_sched *s = h->s;
	pthread_mutex_lock(&s->mu);
	h->cancel = true;
	h->client_gone = true;
	bool mine = h->unlinked; /* the scheduler is done with it: free here */
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->mu);
	if (mine)
		handle_free(h);
}

/* ---- the scheduler thread ---- */

static void record_usage_locked(kvt_sched *s, kvt_sched_handle *h)
{
	kvt_sched_stats *st = &s->st;
	const kvt_sched_usage *u = &h->usage;
	st->requests++;
	st->requests_failed += h->finish == KVT_FINISH_ERROR || h->finish == KVT_FINISH_UNSAVED;
	st->prompt_tokens += u->prompt_tokens;
	st->cached_tokens += u->cached_tokens;
	for (int t = 0; t < KVT_TM_N_TIERS; t++)
		st->cached_by_tier[t] += u->cached_by_tier[t];
	st->lossy_cached_tokens += u->lossy_cached_tokens;
	st->completion_tokens += u->completion_tokens;
	if (h->t_first > 0) {
		double ttft = u->ttft_s;
		int b = 0;
		while (b < KVT_TTFT_BUCKETS - 1 && ttft > kvt_ttft_bucket_le[b])
			b++;
		st->ttft_bucket[b]++;
		st->ttft_sum_s += ttft;
		s->ttft_ring[s->n_ttft++ % TTFT_RING] = ttft;
		st->ttft_by_priority_n[h->prio - KVT_PRIORITY_MIN]++;
		st->ttft_by_priority_sum_s[h->prio - KVT_PRIORITY_MIN] += ttft;
	}
}

/*
 * The request asked to keep its prompt's prefix: retain its full blocks that
 * are cached (served or registered), under the tenant's quota.
 */
static void retain_prompt(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	uint32_t want_max = 0, got_max = 0, n_new = 0;
	for (uint32_t k = 0; k < h->req.n_retain && k < KVT_SCHED_MAX_RETAIN; k++) {
		const kvt_sched_retain *r = &h->req.retain[k];
		uint32_t want = (r->tokens < h->req.n_prompt ? r->tokens : h->req.n_prompt) / bt;
		uint32_t n = want < h->n_hashes ? want : h->n_hashes;
		want_max = want > want_max ? want : want_max;
		if (!s->cfg.tm || !s->cfg.cache || !n || !(r->ttl_s > 0))
			continue;
		kvt_tm_retain_result res;
		int tier = r->tier >= 0 ? r->tier : s->cfg.retain_tier;
		int rc = kvt_tm_retain(s->cfg.tm, sched_tenant(h->req.tenant), n, (const uint8_t(*)[KVT_HASH_BYTES])h->hashes,
				       (uint64_t)(r->ttl_s * 1e6), tier, &res);
		if (rc) {
			KVT_LOGW("sched: retention not applied: %s", kvt_strerror(rc));
			continue;
		}
		n_new += res.n_new; /* a later (longer) prefix counts only the blocks new to it */
		if (res.n_new + res.n_kept > got_max)
			got_max = res.n_new + res.n_kept;
	}
	h->usage.retain_requested_tokens = want_max * bt;
	h->usage.cache_creation_tokens = n_new * bt;
	h->usage.retain_denied_tokens = (want_max - (got_max < want_max ? got_max : want_max)) * bt;
}

/* The request has ended for its client: usage final, the waiters woken. Under s->mu. */
static void end_locked(kvt_sched *s, kvt_sched_handle *h)
{
	h->ended = true;
	s->n_ended++; /* h is on the running list until prune */
	record_usage_locked(s, h);
	pthread_cond_broadcast(&h->cv);
	if (s->progress)
		s->progress(s->progress_user);
}

/* End a running request: release its blocks and pins, save its session, mark its turn's blocks due, publish usage. */
static void finish_request(kvt_sched *s, kvt_sched_handle *h, int finish)
{
	/* the prefix first: a layered promotion's copies must be done before the slots go (ended before its forward) */
	if (h->pfx && kvt_tm_prefix_release(s->cfg.tm, h->pfx) != KVT_OK)
		finish = KVT_FINISH_ERROR;
	h->pfx = NULL;
	if (h->seq_ready) {
		kvt_seq_deinit(&h->seq);
		h->seq_ready = false;
	}
	if (h->req.n_retain && finish != KVT_FINISH_ERROR)
		retain_prompt(s, h);
	h->state = H_DONE;

	/*
	 * A session turn is acknowledged (ended) only once its row has committed
	 * (sched_turn_saved, on the index's writer thread). NOTE: its usage and
	 * saving flag are set before the row is queued: the commit may come at once.
	 */
	const bool save = h->req.session_id[0] && s->cfg.db && finish != KVT_FINISH_ERROR;
	pthread_mutex_lock(&s->mu);
	h->finish = finish;
	h->usage.completion_tokens = h->n_visible;
	h->usage.total_s = kvt_now_s() - h->t_submit;
	h->saving = save;
	if (!save)
		end_locked(s, h);
	pthread_mutex_unlock(&s->mu);
	/* this turn's blocks (and only this request's) become due for write-through, after its session row */
	if (sched_turn_end(s, h->req.tenant, save ? h->req.session_id : NULL, h->toks, h->n_toks,
			   (const uint8_t(*)[KVT_HASH_BYTES])h->hashes, h->n_hashes, h->root, h) != KVT_OK)
		sched_turn_saved(s, h, KVT_EIO); /* not even queued: never acknowledged */
}

void sched_turn_saved(kvt_sched *s, kvt_sched_handle *h, int rc)
{
	pthread_mutex_lock(&s->mu);
	if (rc != KVT_OK) /* not durable: not acknowledged (the disk is full, or the index failed) */
		h->finish = KVT_FINISH_UNSAVED;
	h->saving = false;
	end_locked(s, h);
	pthread_cond_signal(&s->work); /* the scheduler prunes it */
	pthread_mutex_unlock(&s->mu);
}

/*
 * Look the marked spans up (admission, not for a preempted request): each
 * span's full blocks hashed under the chunk root, a SERVE handle acquired
 * and waited for at once (NOTE: a span found in T2 is read while the other
 * sequences wait; the spans are short next to a conversation's history).
 * A failure leaves the span unmarked (logged): it is prefilled as text.
 */
static void chunks_lookup(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	uint8_t croot[KVT_HASH_BYTES];
	if (!h->req.n_chunks || !s->cfg.tm || !s->cfg.cache || h->preempted)
		return;
	if (sched_chunk_root(s, h->req.tenant, croot) || !(h->chunks = calloc(h->req.n_chunks, sizeof(*h->chunks)))) {
		KVT_LOGW("sched: chunk reuse skipped for a request (no chunk root or no memory)");
		return;
	}
	uint32_t span_tokens = 0;
	for (uint32_t i = 0; i < h->req.n_chunks; i++) {
		sched_chunk *c = &h->chunks[i];
		c->start = h->req.chunks[i].start;
		c->n = h->req.chunks[i].n;
		c->n_blocks = c->n / bt;
		span_tokens += c->n;
		uint32_t got = 0;
		if (!c->n_blocks || !(c->hashes = malloc((size_t)c->n_blocks * KVT_HASH_BYTES)) ||
		    kvt_hash_chain(croot, h->toks + c->start, c->n_blocks * bt, bt, c->hashes, c->n_blocks, &got) ||
		    got != c->n_blocks) {
			c->n_blocks = 0;
			c->stored = true;
			continue;
		}
		const kvt_tm_prefix_req pr = { .use = KVT_TM_PREFIX_SERVE,
					       .hashes = (const uint8_t(*)[KVT_HASH_BYTES])c->hashes,
					       .tokens = h->toks + c->start,
					       .n = c->n_blocks,
					       .root = croot,
					       .refresh = true };
		if (kvt_tm_prefix_acquire(s->cfg.tm, &pr, &c->pfx) == KVT_OK)
			kvt_tm_prefix_wait(s->cfg.tm, c->pfx, NULL, NULL);
		else
			c->pfx = NULL;
	}
	pthread_mutex_lock(&s->mu);
	h->usage.chunk_tokens = span_tokens;
	pthread_mutex_unlock(&s->mu);
}

/*
 * The exact prefix is in the sequence (its first n_tokens): move each span's
 * found blocks to the span's place, turned by its start, and let the lookups
 * go. A span that starts inside the exact prefix is left to it. The first
 * span placed is where the blend starts.
 */
static void chunks_place(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	uint64_t found = 0, looked = 0, by_tier[KVT_TM_N_TIERS] = { 0 }, bytes[KVT_TM_N_TIERS] = { 0 };
	for (uint32_t i = 0; h->chunks && i < h->req.n_chunks; i++) {
		sched_chunk *c = &h->chunks[i];
		if (!c->pfx)
			continue;
		if (c->start < h->seq.n_tokens) { /* the exact prefix covers (some of) it: nothing to reuse or store */
			c->stored = true;
			kvt_tm_prefix_release(s->cfg.tm, c->pfx);
			c->pfx = NULL;
			continue;
		}
		looked += (uint64_t)c->n_blocks * bt;
		kvt_tm_prefix_counts pc;
		kvt_seq cs;
		uint32_t k = 0;
		if (kvt_seq_init(&cs, s->cfg.dev, s->cfg.t0, c->n_blocks * bt) == KVT_OK) {
			k = kvt_tm_prefix_take(s->cfg.tm, c->pfx, cs.blocks);
			cs.n_blocks = k;
			cs.n_tokens = k * bt;
			cs.n_synced = 0; /* kvt_model_kv_move brings the device table in step */
			int rc = k ? kvt_model_kv_move(s->cfg.model, &cs, 0, &h->seq, c->start, k * bt, (int32_t)c->start)
				   : KVT_OK;
			if (k && rc != KVT_OK) {
				KVT_LOGW("sched: a found chunk of %u blocks could not be placed (%s): prefilled as text", k,
					 kvt_strerror(rc));
				k = 0;
			}
			kvt_seq_deinit(&cs);
		}
		kvt_tm_prefix_get_counts(s->cfg.tm, c->pfx, &pc);
		for (int t = 0; t < KVT_TM_N_TIERS; t++) {
			by_tier[t] += (uint64_t)pc.blocks_from[t] * bt;
			bytes[t] += pc.bytes_from[t];
		}
		kvt_tm_prefix_release(s->cfg.tm, c->pfx);
		c->pfx = NULL;
		c->n_found = k;
		found += (uint64_t)k * bt;
		if (k && h->blend_at == NO_BLEND)
			h->blend_at = c->start;
	}
	if (h->blend_at != NO_BLEND)
		h->reg_limit = h->blend_at / bt;
	pthread_mutex_lock(&s->mu);
	s->st.chunk_lookup_tokens += looked;
	s->st.chunk_hit_tokens += found;
	for (int t = 0; t < KVT_TM_N_TIERS; t++) {
		s->st.chunk_hits_by_tier[t] += by_tier[t];
		s->st.chunk_bytes_from[t] += bytes[t];
	}
	pthread_mutex_unlock(&s->mu);
}

/*
 * Store the blocks of the spans not found once the sequence holds their
 * K/V: moved to chunk-relative positions into fresh blocks (turned by
 * -start) and registered under the chunk chain as chunk blocks; the manager
 * keeps them like any block (its own T0 reference; T1, T2, T3 as they cool),
 * within the chunk share of each tier (kvt_sched_config.chunk_share;
 * manager.h, "Chunk share").
 */
static void chunks_store(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	uint8_t croot[KVT_HASH_BYTES];
	uint64_t stored = 0;
	for (uint32_t i = 0; h->chunks && i < h->req.n_chunks; i++) {
		sched_chunk *c = &h->chunks[i];
		if (c->stored || c->pfx || c->start + c->n_blocks * bt > h->seq.n_tokens)
			continue;
		c->stored = true;
		const uint32_t from = c->n_found, n = c->n_blocks - from;
		kvt_seq cs;
		if (!n || sched_chunk_root(s, h->req.tenant, croot) ||
		    kvt_seq_init(&cs, s->cfg.dev, s->cfg.t0, c->n_blocks * bt) != KVT_OK)
			continue;
		/* the blocks not found sit at chunk-relative positions from * bt on; cs holds them from its block `from` */
		cs.n_tokens = 0;
		int rc = kvt_model_kv_move(s->cfg.model, &h->seq, c->start + from * bt, &cs, from * bt, n * bt,
					   -(int32_t)c->start);
		if (rc == KVT_OK)
			for (uint32_t j = from; j < c->n_blocks; j++) {
				const uint8_t *parent = j ? c->hashes[j - 1] : croot;
				if ((rc = kvt_tm_register_kind(s->cfg.tm, c->hashes[j], parent, h->toks + c->start + j * bt,
							       cs.blocks[j], KVT_BLOCK_CHUNK)))
					break;
				stored += bt;
			}
		if (rc)
			KVT_LOGW("sched: a chunk's blocks were not stored: %s", kvt_strerror(rc));
		/* no turn's chain names them: they become due for write-through (T2, T3) now, as a turn's blocks do */
		else if (kvt_tm_end_turn_chain(s->cfg.tm, n, (const uint8_t(*)[KVT_HASH_BYTES])c->hashes + from, NULL, NULL))
			KVT_LOGW("sched: a chunk's blocks go to NVMe only when evicted (no memory to mark them due)");
		kvt_seq_deinit(&cs);
	}
	if (stored) {
		pthread_mutex_lock(&s->mu);
		s->st.chunk_stored_tokens += stored;
		pthread_mutex_unlock(&s->mu);
	}
}

/*
 * The blend (see above): the prompt from blend_at to its last token but one,
 * placed rows marked, through kvt_model_forward_blend, alone. The last
 * prompt token then runs in the batch and samples as usual. A failure (no
 * room in T0) falls back to the plain prefill from blend_at: the rows it
 * computes overwrite whatever was placed.
 */
static void run_blend(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t from = h->blend_at, to = h->n_fill - 1, bt = s->block_tokens;
	h->blend_at = NO_BLEND;
	if (to <= from) {
		h->reg_limit = UINT32_MAX;
		return;
	}
	uint8_t *placed = calloc(to - from, 1);
	if (!placed)
		return;
	for (uint32_t i = 0; i < h->req.n_chunks; i++) {
		const sched_chunk *c = &h->chunks[i];
		for (uint32_t p = c->start; c->n_found && p < c->start + c->n_found * bt && p < to; p++)
			if (p >= from)
				placed[p - from] = 1;
	}
	const float r = h->req.chunk_recompute >= 0 ? h->req.chunk_recompute : s->cfg.chunk_recompute;
	const kvt_blend_params bp = { .recompute = r, .check_layer = BLEND_CHECK_LAYER };
	kvt_blend_result res = { 0 };
	const uint32_t need = (to + bt - 1) / bt;
	if (need > h->seq.n_blocks && s->cfg.tm)
		kvt_tm_reserve_t0(s->cfg.tm, need - h->seq.n_blocks);
	double t0 = kvt_now_s();
	int rc = kvt_model_forward_blend(s->cfg.model, &h->seq, h->toks + from, to - from, placed, &bp, NULL, 0, &res);
	double dt = kvt_now_s() - t0;
	free(placed);
	if (rc != KVT_OK) {
		KVT_LOGW("sched: a blended prefill of %u tokens failed (%s): prefilling them plainly", to - from,
			 kvt_strerror(rc));
		h->reg_limit = UINT32_MAX;
		return;
	}
	KVT_LOGD("sched: blend: %u tokens from %u, %u placed, %u of them recomputed (r %.2f), %.1f ms", to - from, from,
		 res.n_placed, res.n_recomputed, r, dt * 1e3);
	pthread_mutex_lock(&s->mu);
	h->usage.chunk_reused_tokens += res.n_placed - res.n_recomputed;
	h->usage.chunk_recomputed_tokens += res.n_recomputed;
	s->st.chunk_reused_tokens += res.n_placed - res.n_recomputed;
	s->st.chunk_recomputed_tokens += res.n_recomputed;
	s->st.chunk_blends++;
	s->st.prefill_tokens += to - from;
	s->st.prefill_s += dt;
	s->st.steps++;
	pthread_mutex_unlock(&s->mu);
	chunks_store(s, h);
}

/*
 * The cached prefix has come up: the blocks up to the first failure become
 * the start of the sequence (their slots straight into it, with the
 * references the handle hands over); the rest are recomputed.
 */
static void take_prefix(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	kvt_tm_prefix_counts c;
	const uint32_t ok = kvt_tm_prefix_take(s->cfg.tm, h->pfx, h->seq.blocks);
	kvt_tm_prefix_get_counts(s->cfg.tm, h->pfx, &c);
	h->seq.n_blocks = ok;
	h->seq.n_tokens = ok * bt;
	h->seq.n_synced = 0;
	h->n_hashes = ok; /* blocks past the served prefix get registered anew */
	pthread_mutex_lock(&s->mu);
	if (h->preempted) { /* resumed: the usage describes the prompt, as first served */
		s->st.resume_recomputed_tokens += h->n_fill - ok * bt;
		s->st.resume_swapped_in_tokens += (uint64_t)(ok - c.blocks_from[KVT_TIER_HBM]) * bt;
	} else {
		for (int t = 0; t < KVT_TM_N_TIERS; t++)
			h->usage.cached_by_tier[t] += c.blocks_from[t] * bt;
		h->usage.cached_tokens = ok * bt;
		h->usage.lossy_cached_tokens = c.n_lossy * bt;
		h->usage.cache_read_tokens = c.n_retained * bt;
		s->st.prefix_hits_tokens += (uint64_t)ok * bt; /* counted at lookup, as prefix_queries_tokens */
	}
	s->st.layered_promotions += c.path == KVT_TM_PREFIX_LAYERED;
	pthread_mutex_unlock(&s->mu);
	h->state = H_PREFILL;
	chunks_place(s, h);
}

/* Hash toks' full blocks up to n (each block once: a chain continues from the last one hashed). */
static int hash_blocks(kvt_sched *s, kvt_sched_handle *h, uint32_t n)
{
	const uint32_t bt = s->block_tokens;
	if (n <= h->n_hashed)
		return KVT_OK;
	uint32_t got = 0;
	int rc = kvt_hash_chain(h->n_hashed ? h->hashes[h->n_hashed - 1] : h->root, h->toks + (size_t)h->n_hashed * bt,
				(n - h->n_hashed) * bt, bt, h->hashes + h->n_hashed, n - h->n_hashed, &got);
	if (rc == KVT_OK)
		h->n_hashed += got;
	return rc;
}

/*
 * Start a queued request: the cached prefix (the manager's handle: pinned,
 * brought up as the manager chooses), the sequence, the sampler. A prefix
 * that is up at once is taken at once; one still coming up from T1, T2 or
 * T3 is taken when its handle is ready while the other sequences go on
 * decoding (state H_PROMOTE). On failure the request ends with ERROR.
 */
static void admit(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	const uint32_t max_blocks = h->cap_toks / bt + 1;
	int rc = KVT_ENOMEM;

	if (!h->preempted) {
		h->usage.prompt_tokens = h->req.n_prompt;
		h->usage.queue_s = kvt_now_s() - h->t_submit;
	}
	if ((!h->hashes && !(h->hashes = calloc(max_blocks, KVT_HASH_BYTES))) ||
	    (!h->n_hashed && (rc = sched_chain_root(s, h->req.tenant, h->root))) ||
	    (rc = kvt_seq_init(&h->seq, s->cfg.dev, s->cfg.t0, h->cap_toks)))
		goto fail;
	h->seq_ready = true;
	if (!h->sampler_ready) { /* a resumed request keeps its sampler and grammar state (their state is the run's) */
		if ((rc = kvt_sampler_init(&h->sampler, &h->req.sample, s->n_vocab)))
			goto fail;
		h->sampler_ready = true;
		kvt_sampler_prompt(&h->sampler, h->toks, h->req.n_prompt);
		if (h->req.grammar && (rc = kvt_gmatch_create(h->req.grammar, s->trie, &h->gm)))
			goto fail;
	}
	h->state = H_PREFILL;

	/*
	 * The cached prefix: full blocks of the fill, less its last token when
	 * that token's logits are wanted (a prompt's last token is always run).
	 * A resumed request looks up its own blocks; under RECOMPUTE it takes
	 * only those still in T0.
	 */
	const bool t0_only = h->preempted && s->cfg.preempt == KVT_PREEMPT_RECOMPUTE;
	uint32_t n_look = h->n_fill - (h->resume_decode ? 0 : 1), n_full = n_look / bt;
	if (!h->preempted) {
		pthread_mutex_lock(&s->mu);
		s->st.prefix_queries_tokens += h->req.n_prompt;
		s->st.reusable_tokens += (uint64_t)n_full * bt;
		pthread_mutex_unlock(&s->mu);
	}
	kvt_tm_prefix_counts c = { 0 };
	if (s->cfg.tm && s->cfg.cache && n_full) {
		if ((rc = hash_blocks(s, h, n_full)))
			goto fail;
		const kvt_tm_prefix_req pr = { .use = KVT_TM_PREFIX_SERVE,
					       .hashes = (const uint8_t(*)[KVT_HASH_BYTES])h->hashes,
					       .tokens = h->toks,
					       .n = n_full,
					       .root = h->root,
					       .t0_only = t0_only,
					       .refresh = !h->preempted, /* not again when a preempted request resumes */
					       .layer_groups = s->cfg.layer_groups };
		if ((rc = kvt_tm_prefix_acquire(s->cfg.tm, &pr, &h->pfx)))
			goto fail;
		kvt_tm_prefix_get_counts(s->cfg.tm, h->pfx, &c);
	}
	chunks_lookup(s, h);
	if (c.path == KVT_TM_PREFIX_NONE) { /* nothing cached: everything is prefilled */
		kvt_tm_prefix_release(s->cfg.tm, h->pfx);
		h->pfx = NULL;
		chunks_place(s, h);
		if (h->preempted) {
			pthread_mutex_lock(&s->mu);
			s->st.resume_recomputed_tokens += h->n_fill;
			pthread_mutex_unlock(&s->mu);
		}
		return;
	}
	/* NOTE: a READY acquire settled the layered promotion it had to wait for: a failed one ends its request */
	if (c.path == KVT_TM_PREFIX_READY)
		for (kvt_sched_handle *o = s->running; o; o = o->next)
			if (o != h && o->pfx && o->state != H_DONE && kvt_tm_prefix_settle(s->cfg.tm, o->pfx) != KVT_OK)
				finish_request(s, o, KVT_FINISH_ERROR);
	if (kvt_tm_prefix_ready(s->cfg.tm, h->pfx))
		take_prefix(s, h);
	else
		h->state = H_PROMOTE;
	return;
fail:
	KVT_LOGE("sched: cannot start a request: %s", kvt_strerror(rc));
	finish_request(s, h, KVT_FINISH_ERROR);
}

/* Register the sequence's new full blocks (K/V stored) with the manager. */
static void register_blocks(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	while ((h->n_hashes + 1) * bt <= h->seq.n_tokens && h->n_hashes < h->reg_limit) {
		uint32_t i = h->n_hashes;
		const uint8_t *parent = i ? h->hashes[i - 1] : h->root;
		if (hash_blocks(s, h, i + 1))
			return;
		h->n_hashes++;
		if (!s->cfg.tm || !s->cfg.cache)
			continue;
		int rc = kvt_tm_register(s->cfg.tm, h->hashes[i], parent, h->toks + (size_t)i * bt, h->seq.blocks[i]);
		if (rc)
			KVT_LOGW("sched: block %u not cached: %s", i, kvt_strerror(rc));
	}
}

/*
 * A token was sampled for h: append it; decide whether the request is done.
 * ignore_eos runs past an end-of-generation token, except under a grammar:
 * there the token means the grammar ended, and nothing but more of them
 * could follow.
 */
static void take_token(kvt_sched *s, kvt_sched_handle *h, int32_t tok)
{
	const bool eog = s->cfg.tok && kvt_tok_is_eog(s->cfg.tok, tok) && (!h->req.ignore_eos || h->gm);
	int finish = KVT_FINISH_NONE;
	double now = kvt_now_s();

	pthread_mutex_lock(&s->mu);
	h->toks[h->n_toks++] = tok;
	if (!h->t_first) {
		h->t_first = now;
		h->usage.ttft_s = now - h->t_submit;
		h->usage.first_step = s->st.steps;
		h->usage.ttft_steps = (uint32_t)(s->st.steps - h->submit_step);
	}
	if (eog)
		finish = KVT_FINISH_STOP;
	else if (++h->n_visible >= h->req.max_tokens || h->n_toks >= h->cap_toks)
		finish = KVT_FINISH_LENGTH;
	if (finish)
		h->finish = finish;
	pthread_cond_broadcast(&h->cv);
	if (s->progress)
		s->progress(s->progress_user);
	pthread_mutex_unlock(&s->mu);
	/* Done: one more step stores the last token's K/V, so the whole turn is cached. */
	h->state = finish ? H_FINISHING : H_DECODE;
}

/* Where h's plain prefill stops for now: the blend's start, or the end of the fill. */
static uint32_t prefill_stop(const kvt_sched_handle *h)
{
	return h->blend_at != NO_BLEND && h->seq.n_tokens < h->blend_at ? h->blend_at : h->n_fill;
}

/* One batch entry. */
typedef struct entry {
	kvt_sched_handle *h;
	uint32_t n;       /* rows */
	bool logits;      /* wants the logits of its last row */
} entry;

static uint32_t blocks_needed(const kvt_sched *s, const entry *e)
{
	const uint32_t bt = s->block_tokens;
	uint32_t need = (e->h->seq.n_tokens + e->n + bt - 1) / bt;
	return need > e->h->seq.n_blocks ? need - e->h->seq.n_blocks : 0;
}

/* FAIR's order of the prefilling sequences: aged first, then priority, shortest remaining, admission. */
typedef struct cand {
	kvt_sched_handle *h;
	bool aged;     /* passed over aging_steps steps */
	int prio;      /* effective priority now */
	uint32_t left; /* prompt tokens still to run */
} cand;

static int cmp_cand(const void *a, const void *b)
{
	const cand *x = a, *y = b;
	if (x->aged != y->aged)
		return x->aged ? -1 : 1;
	if (x->prio != y->prio)
		return x->prio < y->prio ? -1 : 1;
	if (x->left != y->left)
		return x->left < y->left ? -1 : 1;
	return (x->h->seq_no > y->h->seq_no) - (x->h->seq_no < y->h->seq_no);
}

/*
 * The victim of a preemption: the lowest-priority (largest value), latest
 * admitted sequence holding T0 blocks, other than the oldest one running
 * (which always fits alone, so someone always progresses). NULL: none.
 */
static kvt_sched_handle *pick_victim(kvt_sched *s)
{
	kvt_sched_handle *v = NULL, *oldest = NULL;
	for (kvt_sched_handle *h = s->running; h; h = h->next)
		if ((h->state == H_PREFILL || h->state == H_DECODE) && h->seq_ready &&
		    (!oldest || h->seq_no < oldest->seq_no))
			oldest = h;
	for (kvt_sched_handle *h = s->running; h; h = h->next) {
		if (h == oldest || (h->state != H_PREFILL && h->state != H_DECODE) || !h->seq_ready || !h->seq.n_blocks)
			continue;
		if (!v || h->prio > v->prio || (h->prio == v->prio && h->seq_no > v->seq_no))
			v = h;
	}
	return v;
}

/*
 * Preempt h: let go of its pins and T0 references (its registered blocks
 * stay in the cache, demoted by the manager as T0 needs room) and put it at
 * the front of the queue. Admission holds until a request ends.
 */
static void preempt(kvt_sched *s, kvt_sched_handle *h)
{
	const bool swap = s->cfg.preempt == KVT_PREEMPT_SWAP && s->cfg.tm && s->cfg.cache;
	const uint32_t held = h->seq.n_tokens;
	if (h->pfx && kvt_tm_prefix_settle(s->cfg.tm, h->pfx) != KVT_OK) { /* its prefix never arrived: nothing of it
									       may be reused */
		finish_request(s, h, KVT_FINISH_ERROR);
		return;
	}
	kvt_tm_prefix_release(s->cfg.tm, h->pfx); /* its pins go; the blocks stay cached */
	h->pfx = NULL;
	chunks_free(h); /* it resumes with a plain prefill: every block it computes then is exact */
	h->reg_limit = UINT32_MAX;
	kvt_seq_deinit(&h->seq);
	h->seq_ready = false;
	if (h->state == H_DECODE) {
		h->n_fill = h->n_toks - 1; /* the last sampled token is the next decode row */
		h->resume_decode = true;
	}
	h->state = H_QUEUED;
	h->passed = 0;
	h->preempted = true;
	for (kvt_sched_handle **pp = &s->running; *pp; pp = &(*pp)->next) {
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	}
	KVT_LOGI("sched: T0 full: preempting a request (priority %d, %u tokens held; %s)", h->prio, held,
		 swap ? "swap: its blocks stay cached" : "recompute");
	pthread_mutex_lock(&s->mu);
	h->usage.preemptions++;
	s->n_running--;
	s->t0_committed -= h->committed;
	h->committed = 0;
	s->admit_hold = true;
	h->t_wait = kvt_now_s();
	h->next = s->q_head;
	s->q_head = h;
	if (!s->q_tail)
		s->q_tail = h;
	s->n_queued++;
	if (swap)
		s->st.preempt_swap++;
	else
		s->st.preempt_recompute++;
	s->st.preempt_tokens += held;
	pthread_mutex_unlock(&s->mu);
}

/* Run one batch; false when there was nothing to run. */
/*
 * Whether h's next token may be picked on the device: greedy, with nothing
 * the host sampler must see (its state then does not change: no grammar,
 * logprobs, penalties or bias), so the device's argmax is its pick.
 */
static bool device_pickable(const kvt_sched_handle *h)
{
	return kvt_sampler_plain_greedy(&h->req.sample) && !h->gm && !h->lps;
}

/*
 * A step of decode rows only (ents[0..n_ent), one row each) can run as
 * kvt_model_decode (one graph launch, the tokens picked on the device) when
 * cfg.device_decode allows it, the backend has graphs, the step fits one
 * decode call, and every row that samples (at least one) is device_pickable.
 */
static bool device_step(const kvt_sched *s, const entry *ents, uint32_t n_ent, uint32_t n_decode)
{
	if (!s->cfg.device_decode || n_ent != n_decode || n_ent > KVT_DECODE_MAX_SEQ ||
	    n_ent > kvt_model_max_batch(s->cfg.model) || !kvt_dev_graphs_supported(s->cfg.dev))
		return false;
	uint32_t picks = 0;
	for (uint32_t i = 0; i < n_ent; i++) {
		if (ents[i].logits && !device_pickable(ents[i].h))
			return false;
		picks += ents[i].logits;
	}
	return picks > 0; /* finishing rows alone need no logits at all */
}

/*
 * The prefill rate a resume reports the avoided prefill time from: the one
 * kept for this model, CPU and device (cfg.rate_path), until this run has
 * measured its own. Nothing is measured at start-up: that cost a forward pass
 * before the daemon was ready.
 */
static void rate_load(kvt_sched *s)
{
	double rate;
	if (!s->rate_path[0])
		return;
	kvt_prefill_rate_key_init(&s->rate_key, s->cfg.dev, s->cfg.model_fp);
	if (kvt_prefill_rate_load(s->rate_path, &s->rate_key, &rate) == KVT_OK) {
		s->calib_rate = rate;
		KVT_LOGI("sched: prefill rate %.0f tokens/s (kept in %s)", rate, s->rate_path);
	}
}

/* Once per run, when 0.5 s of prefill is measured: its rate replaces the kept one (scheduler thread). */
static void rate_note(kvt_sched *s)
{
	pthread_mutex_lock(&s->mu);
	const bool due = !s->rate_saved && s->st.prefill_s > 0.5 && s->st.prefill_tokens;
	const double rate = due ? s->st.prefill_tokens / s->st.prefill_s : 0;
	if (due) {
		s->rate_saved = true;
		s->calib_rate = rate;
	}
	pthread_mutex_unlock(&s->mu);
	if (!due || !s->rate_path[0])
		return;
	if (kvt_prefill_rate_save(s->rate_path, &s->rate_key, rate) == KVT_OK)
		KVT_LOGI("sched: prefill rate measured: %.0f tokens/s (kept in %s)", rate, s->rate_path);
}

static bool step(kvt_sched *s, entry *ents, int32_t *rows, cand *cands)
{
	uint32_t n_ent = 0, n_rows = 0, need = 0, n_cand = 0;
	const uint32_t cap_rows = s->max_batch;
	const uint32_t cap_ent = s->cfg.max_running + 1;

	for (kvt_sched_handle *h = s->running; h; h = h->next) {
		if (h->state == H_PROMOTE && kvt_tm_prefix_ready(s->cfg.tm, h->pfx))
			take_prefix(s, h);
		/* a resumed sequence whose fill is done decodes again (its next row is its last token) */
		if (h->state == H_PREFILL && h->resume_decode && h->seq.n_tokens >= h->n_fill)
			h->state = H_DECODE;
		if (h->state == H_PREFILL && h->blend_at == h->seq.n_tokens)
			run_blend(s, h);
	}

	/* decoding and finishing sequences: one row each */
	for (kvt_sched_handle *h = s->running; h; h = h->next) {
		if ((h->state == H_DECODE || h->state == H_FINISHING) && n_rows < cap_rows && n_ent < cap_ent) {
			ents[n_ent++] = (entry){ .h = h, .n = 1, .logits = h->state == H_DECODE };
			rows[n_rows++] = h->toks[h->n_toks - 1];
		}
	}
	uint32_t n_decode = n_ent;

	/* the prefill budget, by the policy */
	const double now = kvt_now_s();
	for (kvt_sched_handle *h = s->running; h && n_cand < cap_ent; h = h->next) {
		if (h->state != H_PREFILL)
			continue;
		cands[n_cand++] = (cand){ .h = h,
					  .aged = h->passed >= s->cfg.aging_steps,
					  .prio = effective_priority(s, h, now),
					  .left = prefill_stop(h) - h->seq.n_tokens };
	}
	const bool fair = s->cfg.policy == KVT_SCHED_FAIR;
	uint32_t budget = s->cfg.prefill_chunk;
	/*
	 * FAIR's head: the oldest prefilling sequence of the best effective
	 * priority. Others' rows (prompt and decode) run before it until they
	 * add up to (1 / head_share - 1) times its prompt; from then on it takes
	 * the budget first, as FIFO would, so they cannot stretch its prefill by
	 * more than that however fast they arrive. Aging still lifts a shorter
	 * prompt passed over (so a short one never waits out a long prefill),
	 * but not one at least as long as the head: those wait to be head in
	 * turn rather than round-robin with it, which would delay them all.
	 */
	kvt_sched_handle *head = NULL;
	uint32_t head_cap = 0; /* its cap in its turn; 0: none */
	if (fair && n_cand > 1 && s->cfg.head_share > 0) {
		uint32_t hi = 0;
		for (uint32_t i = 1; i < n_cand; i++)
			if (cands[i].prio < cands[hi].prio ||
			    (cands[i].prio == cands[hi].prio && cands[i].h->seq_no < cands[hi].h->seq_no))
				hi = i;
		head = cands[hi].h;
		for (uint32_t i = 0; i < n_cand; i++)
			if (i != hi && cands[i].left >= cands[hi].left)
				cands[i].aged = false;
	}
	if (fair)
		qsort(cands, n_cand, sizeof(cand), cmp_cand);
	if (head) {
		uint32_t hi = 0;
		while (cands[hi].h != head)
			hi++;
		double allowance = (1.0 / s->cfg.head_share - 1.0) * (double)head->n_fill;
		if ((double)head->yielded >= allowance) {
			/*
			 * Its turn: first, taking all it can, or head_share of the
			 * budget while shorter prompts have aged (they share the rest).
			 */
			bool aged_others = false;
			for (uint32_t i = 0; i < n_cand; i++)
				aged_others = aged_others || (i != hi && cands[i].aged);
			cand c = cands[hi];
			memmove(cands + 1, cands, hi * sizeof(cand));
			cands[0] = c;
			cands[0].aged = false;
			if (aged_others) {
				head_cap = (uint32_t)ceilf(s->cfg.head_share * (float)s->cfg.prefill_chunk);
				if (!head_cap)
					head_cap = 1;
			}
		}
	}
	uint32_t head_rows = 0;
	for (uint32_t i = 0; i < n_cand; i++) {
		kvt_sched_handle *h = cands[i].h;
		uint32_t left = cands[i].left, c = left;
		/* an aged sequence goes first but leaves half the budget to the others waiting */
		uint32_t cap = fair && cands[i].aged && i + 1 < n_cand ? (s->cfg.prefill_chunk + 1) / 2 : budget;
		if (h == head && head_cap)
			cap = head_cap;
		if (c > cap)
			c = cap;
		if (c > budget)
			c = budget;
		if (c > cap_rows - n_rows)
			c = cap_rows - n_rows;
		if (!c || n_ent >= cap_ent) {
			h->passed++;
			continue;
		}
		h->passed = 0;
		ents[n_ent++] = (entry){ .h = h, .n = c,
					 .logits = c == left && prefill_stop(h) == h->n_fill && !h->resume_decode };
		memcpy(rows + n_rows, h->toks + h->seq.n_tokens, (size_t)c * sizeof(int32_t));
		n_rows += c;
		budget -= c;
		if (h == head)
			head_rows = c;
	}
	if (head)
		head->yielded += n_rows - head_rows;
	if (!n_ent)
		return false;

	/*
	 * Room in T0: let the manager evict; else preempt the lowest-priority,
	 * latest sequence and build the step again; else (one sequence left)
	 * run the decode rows alone; else end the newest request.
	 */
	for (uint32_t i = 0; i < n_ent; i++)
		need += blocks_needed(s, &ents[i]);
	if (need > kvt_t0_n_free(s->cfg.t0) && s->cfg.tm)
		kvt_tm_reserve_t0(s->cfg.tm, need);
	if (need > kvt_t0_n_free(s->cfg.t0)) {
		kvt_sched_handle *v = pick_victim(s);
		if (v) {
			preempt(s, v);
			return true;
		}
	}
	if (need > kvt_t0_n_free(s->cfg.t0) && n_decode < n_ent) {
		need = 0;
		n_ent = n_decode;
		n_rows = n_decode;
		for (uint32_t i = 0; i < n_ent; i++)
			need += blocks_needed(s, &ents[i]);
	}
	if (need > kvt_t0_n_free(s->cfg.t0)) {
		kvt_sched_handle *newest = NULL;
		for (kvt_sched_handle *h = s->running; h; h = h->next)
			if (h->state != H_DONE)
				newest = h;
		KVT_LOGE("sched: the device block pool is full (%u blocks needed, %u free) with nothing to preempt: "
			 "ending the newest request",
			 need, kvt_t0_n_free(s->cfg.t0));
		if (newest)
			finish_request(s, newest, KVT_FINISH_ERROR);
		return true;
	}

	kvt_seq *seqs[n_ent ? n_ent : 1];
	uint32_t n[n_ent ? n_ent : 1];
	bool want[n_ent ? n_ent : 1];
	uint32_t n_prefill = 0;
	for (uint32_t i = 0; i < n_ent; i++) {
		seqs[i] = &ents[i].h->seq;
		n[i] = ents[i].n;
		want[i] = ents[i].logits;
		n_prefill += ents[i].h->state == H_PREFILL ? ents[i].n : 0;
	}
	/* sequences whose prefix is still coming up layer group by layer group: their layers wait per group */
	kvt_model_gate gates[n_ent ? n_ent : 1];
	uint32_t n_gates = 0;
	for (uint32_t i = 0; i < n_ent; i++) {
		kvt_model_gate *g = &gates[n_gates];
		*g = (kvt_model_gate){ 0 };
		if (ents[i].h->pfx && kvt_tm_prefix_gate(ents[i].h->pfx, &g->events, &g->n_groups, &g->layers_per_group))
			n_gates++;
	}
	const bool on_device = !n_gates && device_step(s, ents, n_ent, n_decode);
	int32_t picked[on_device ? n_ent : 1];
	double t0 = kvt_now_s();
	int rc = on_device ? kvt_model_decode(s->cfg.model, n_ent, seqs, rows, NULL, NULL, picked)
			   : kvt_model_forward_batch_gated(s->cfg.model, n_ent, seqs, n, rows, want, s->logits, n_gates,
							   gates);
	double dt = kvt_now_s() - t0;
	/* their copies are done (the forward synced): enter the blocks in T0; a failed copy ends the request */
	bool bad[n_ent ? n_ent : 1];
	for (uint32_t i = 0; i < n_ent; i++) {
		bad[i] = ents[i].h->pfx && kvt_tm_prefix_settle(s->cfg.tm, ents[i].h->pfx) != KVT_OK;
		if (bad[i])
			KVT_LOGE("sched: a request's cached prefix failed to reach T0: ending it");
	}
	KVT_LOGD("sched: step: %u rows (%u decode, %u prefill) in %u sequences, %.1f ms%s", n_rows, n_rows - n_prefill,
		 n_prefill, n_ent, dt * 1e3, on_device ? " (on the device)" : "");
	/*
	 * NOTE: the I/O threads take T0 slots for promotions in flight, so the
	 * free count read above can be gone by the time the forward reserves:
	 * it then holds no new token of any sequence (model.h), and the next
	 * step makes room again (evicting, else preempting). Only a pool that
	 * stays short fails the batch.
	 */
	if (rc == KVT_EFULL && !on_device && s->efull_retries < 3) {
		s->efull_retries++;
		KVT_LOGW("sched: T0 ran out during a step of %u rows (a promotion took the room): running it again", n_rows);
		return true;
	}
	s->efull_retries = 0;
	if (rc) {
		KVT_LOGE("sched: a batch of %u rows failed: %s", n_rows, kvt_strerror(rc));
		for (uint32_t i = 0; i < n_ent; i++)
			finish_request(s, ents[i].h, KVT_FINISH_ERROR);
		return true;
	}
	pthread_mutex_lock(&s->mu);
	s->st.steps++;
	s->st.device_steps += on_device;
	s->st.prefill_tokens += n_prefill;
	/* a mixed batch's time is split by rows */
	s->st.prefill_s += dt * n_prefill / n_rows;
	s->st.decode_s += dt * (n_rows - n_prefill) / n_rows;
	pthread_mutex_unlock(&s->mu);
	if (n_prefill)
		rate_note(s);

	uint32_t li = 0;
	for (uint32_t i = 0; i < n_ent; i++) {
		kvt_sched_handle *h = ents[i].h;
		if (bad[i]) { /* its K/V is not what it should be: nothing of it is registered or sampled */
			li += ents[i].logits;
			finish_request(s, h, KVT_FINISH_ERROR);
			continue;
		}
		register_blocks(s, h);
		chunks_store(s, h);
		if (h->state == H_FINISHING) {
			finish_request(s, h, h->finish);
			continue;
		}
		if (!ents[i].logits)
			continue;
		if (on_device) {
			take_token(s, h, picked[i]);
			continue;
		}
		float *lg = s->logits + (size_t)li++ * s->n_vocab;
		kvt_token_lp *lp = h->lps ? &h->lps[h->n_toks - h->req.n_prompt] : NULL;
		int32_t tok = kvt_sampler_next(&h->sampler, lg, h->gm, lp, h->req.top_logprobs);
		if (tok < 0) /* the grammar allows nothing (logged) */
			finish_request(s, h, KVT_FINISH_ERROR);
		else
			take_token(s, h, tok);
	}
	return true;
}

/* Requests cancelled by their clients end now (their registered blocks stay cached). */
static void reap_cancelled(kvt_sched *s)
{
	for (kvt_sched_handle *h = s->running; h; h = h->next) {
		if (h->state == H_DONE)
			continue;
		pthread_mutex_lock(&s->mu);
		bool c = h->cancel || s->stop;
		pthread_mutex_unlock(&s->mu);
		if (c)
			finish_request(s, h, KVT_FINISH_CANCELLED);
	}
}

/* Drop finished handles from the running list; free those their clients released. */
static bool prune(kvt_sched *s)
{
	bool any = false;
	kvt_sched_handle **pp = &s->running;
	while (*pp) {
		kvt_sched_handle *h = *pp;
		pthread_mutex_lock(&s->mu);
		bool saving = h->saving;
		pthread_mutex_unlock(&s->mu);
		if (h->state != H_DONE || saving) { /* a turn whose row is still committing stays (drain waits for it) */
			pp = &h->next;
			continue;
		}
		*pp = h->next;
		any = true;
		pthread_mutex_lock(&s->mu);
		h->unlinked = true;
		s->n_running--;
		s->n_ended -= h->ended; /* every pruned handle has ended (finish_request, sched_turn_saved) */
		s->t0_committed -= h->committed;
		s->admit_hold = false; /* blocks came free: a preempted request may try again */
		bool gone = h->client_gone;
		pthread_cond_broadcast(&s->idle);
		pthread_mutex_unlock(&s->mu);
		if (gone)
			handle_free(h);
	}
	return any;
}

static void *sched_main(void *arg)
{
	kvt_sched *s = arg;
	entry *ents = calloc(s->cfg.max_running + 1, sizeof(entry));
	cand *cands = calloc(s->cfg.max_running + 1, sizeof(cand));
	int32_t *rows = calloc(s->max_batch, sizeof(int32_t));
	if (!ents || !cands || !rows) {
		KVT_LOGE("sched: out of memory at start");
		pthread_mutex_lock(&s->mu);
		s->stop = true;
		pthread_mutex_unlock(&s->mu);
	}
	for (;;) {
		/* admit */
		pthread_mutex_lock(&s->mu);
		while (!s->stop && !s->q_head && !s->n_running)
			pthread_cond_wait(&s->work, &s->mu);
		bool stop = s->stop;
		kvt_sched_handle *adm = NULL, **tail = &adm;
		/*
		 * Admission, best first (FAIR: a preempted request, then the lowest
		 * effective priority, then the oldest; FIFO: the queue's order): a
		 * request starts when the T0 pool can hold what is committed to the
		 * running ones next to it (or nothing runs). Committed is each one's
		 * fill and a block (growth past it is met by preemption), or with
		 * admit_longest its longest, so that a sequence never finds the pool
		 * full half way. After a preemption nothing is admitted until a
		 * request ends.
		 */
		const double now = kvt_now_s();
		while (s->q_head && (stop || (s->n_running < s->cfg.max_running && !(s->admit_hold && s->n_running)))) {
			kvt_sched_handle **best = &s->q_head;
			if (s->cfg.policy == KVT_SCHED_FAIR && !stop) {
				int bp = 0;
				for (kvt_sched_handle **pp = &s->q_head; *pp; pp = &(*pp)->next) {
					kvt_sched_handle *c = *pp;
					int p = c->preempted ? KVT_PRIORITY_MIN - 1 : effective_priority(s, c, now);
					if (pp == &s->q_head || p < bp) {
						best = pp;
						bp = p;
					}
				}
			}
			kvt_sched_handle *h = *best;
			uint32_t need = blocks_to_commit(s, h);
			if (!stop && s->n_running && s->t0_committed + need > kvt_t0_n_slots(s->cfg.t0))
				break;
			s->t0_committed += need;
			h->committed = need;
			*best = h->next;
			if (s->q_tail == h) {
				s->q_tail = NULL;
				for (kvt_sched_handle *q = s->q_head; q; q = q->next)
					s->q_tail = q;
			}
			s->n_queued--;
			s->n_running++;
			if (s->n_running > s->st.running_peak)
				s->st.running_peak = s->n_running;
			double wait = now - h->t_wait;
			s->st.queue_wait_sum_s += wait;
			s->st.queue_waits++;
			s->wait_ring[s->n_wait++ % WAIT_RING] = wait;
			if (!h->seq_no) /* a resumed request keeps its place: the latest is preempted first */
				h->seq_no = ++s->n_admitted;
			h->next = NULL;
			*tail = h;
			tail = &h->next;
		}
		if (!s->n_running)
			s->admit_hold = false;
		pthread_mutex_unlock(&s->mu);
		if (stop && !s->running && !adm)
			break;
		while (adm) {
			kvt_sched_handle *h = adm;
			adm = h->next;
			h->next = NULL;
			/* append to the running list (admission order) */
			kvt_sched_handle **pp = &s->running;
			while (*pp)
				pp = &(*pp)->next;
			*pp = h;
			bool c;
			pthread_mutex_lock(&s->mu);
			c = h->cancel || stop;
			pthread_mutex_unlock(&s->mu);
			if (c) {
				h->usage.prompt_tokens = h->req.n_prompt;
				finish_request(s, h, KVT_FINISH_CANCELLED);
			} else {
				admit(s, h);
			}
		}
		prune(s);
		reap_cancelled(s);
		prune(s);
		if (ents && cands && rows && !step(s, ents, rows, cands) && s->running) {
			/* only promotions in flight: look again shortly */
			struct timespec ts = { 0, 200 * 1000 };
			nanosleep(&ts, NULL);
		}
		prune(s);
	}
	free(ents);
	free(cands);
	free(rows);
	return NULL;
}

/* ---- lifecycle ---- */

int kvt_sched_create(const kvt_sched_config *cfg, kvt_sched **out)
{
	*out = NULL;
	const char *bad = !cfg->dev ? "dev" : !cfg->model ? "model" : !cfg->t0 ? "t0"
		: (!cfg->secret || cfg->secret_bytes < 16 || cfg->secret_bytes > 64) ? "secret (16..64 bytes)"
		: !cfg->max_running ? "max_running" : !cfg->prefill_chunk ? "prefill_chunk"
		: !(cfg->head_share >= 0 && cfg->head_share <= 1) ? "head_share (0..1)" : NULL;
	if (bad) {
		KVT_LOGE("sched: bad config: %s", bad);
		return KVT_EINVAL;
	}
	kvt_sched *s = calloc(1, sizeof(*s));
	if (!s)
		return KVT_ENOMEM;
	s->cfg = *cfg;
	memcpy(s->secret, cfg->secret, cfg->secret_bytes);
	s->cfg.secret = s->secret;
	const kvt_model_hparams *hp = kvt_model_hparams_get(cfg->model);
	s->n_vocab = hp->n_vocab;
	s->max_ctx = kvt_model_max_ctx(cfg->model);
	s->max_batch = kvt_model_max_batch(cfg->model);
	s->block_tokens = kvt_t0_layout(cfg->t0)->block_tokens;
	if (s->cfg.max_running > s->max_batch)
		s->cfg.max_running = s->max_batch;
	s->logits = malloc((size_t)(s->cfg.max_running + 1) * s->n_vocab * sizeof(float));
	if (!s->logits || (cfg->tok && kvt_vocab_trie_create(cfg->tok, s->n_vocab, &s->trie))) {
		free(s->logits);
		free(s);
		return KVT_ENOMEM;
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->idle, NULL);
	if (cfg->rate_path && snprintf(s->rate_path, sizeof(s->rate_path), "%s", cfg->rate_path) >= (int)sizeof(s->rate_path)) {
		KVT_LOGW("sched: prefill rate path too long: not kept between runs");
		s->rate_path[0] = '\0';
	}
	s->cfg.rate_path = NULL; /* s->rate_path holds it */
	rate_load(s);
	if (pthread_create(&s->thread, NULL, sched_main, s)) {
		KVT_LOGE("sched: cannot start the scheduler thread");
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->work);
		pthread_cond_destroy(&s->idle);
		kvt_vocab_trie_destroy(s->trie);
		free(s->logits);
		free(s);
		return KVT_ENOMEM;
	}
	*out = s;
	return KVT_OK;
}

uint32_t kvt_sched_drain(kvt_sched *s, double timeout_s)
{
	struct timespec dl;
	abs_deadline(&dl, timeout_s);
	pthread_mutex_lock(&s->mu);
	s->draining = true;
	while (s->n_queued + s->n_running > 0) {
		if (pthread_cond_timedwait(&s->idle, &s->mu, &dl) == ETIMEDOUT)
			break;
	}
	uint32_t left = s->n_queued + s->n_running;
	for (kvt_sched_handle *h = s->q_head; h; h = h->next)
		h->cancel = true;
	s->stop = left > 0; /* the scheduler cancels what runs */
	pthread_cond_signal(&s->work);
	while (s->n_queued + s->n_running > 0)
		pthread_cond_wait(&s->idle, &s->mu);
	pthread_mutex_unlock(&s->mu);
	if (left)
		KVT_LOGW("sched: drain: %u request(s) cancelled after %.1f s", left, timeout_s);
	return left;
}

void kvt_sched_destroy(kvt_sched *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = true;
	s->draining = true;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->thread, NULL);
	if (s->cfg.tm) {
		int rc = kvt_tm_flush(s->cfg.tm);
		if (rc && rc != KVT_EUNSUPPORTED)
			KVT_LOGE("sched: flushing the cache to NVMe at shutdown: %s", kvt_strerror(rc));
	}
	sched_sessions_flush(s);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->work);
	pthread_cond_destroy(&s->idle);
	kvt_vocab_trie_destroy(s->trie);
	free(s->logits);
	free(s);
}

/* ---- statistics ---- */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

void kvt_sched_get_stats(kvt_sched *s, kvt_sched_stats *st)
{
	double sorted[TTFT_RING], waits[WAIT_RING];
	uint64_t n_sessions = 0;
	kvt_db_stats index;

	sched_sessions_stats(s, &n_sessions, &index);
	pthread_mutex_lock(&s->mu);
	*st = s->st;
	st->weight_bytes = kvt_model_weight_bytes(s->cfg.model);
	st->weight_mapped_bytes = kvt_model_mapped_bytes(s->cfg.model);
	st->running = s->n_running;
	st->queued = s->n_queued;
	uint32_t k = s->n_ttft < TTFT_RING ? (uint32_t)s->n_ttft : TTFT_RING;
	memcpy(sorted, s->ttft_ring, k * sizeof(double));
	uint32_t kw = s->n_wait < WAIT_RING ? (uint32_t)s->n_wait : WAIT_RING;
	memcpy(waits, s->wait_ring, kw * sizeof(double));
	pthread_mutex_unlock(&s->mu);
	if (k) {
		qsort(sorted, k, sizeof(double), cmp_double);
		st->ttft_p50_s = sorted[(k - 1) / 2];
		st->ttft_p99_s = sorted[(uint32_t)ceil(0.99 * k) - 1];
	}
	if (kw) {
		qsort(waits, kw, sizeof(double), cmp_double);
		st->queue_wait_p50_s = waits[(kw - 1) / 2];
		st->queue_wait_p99_s = waits[(uint32_t)ceil(0.99 * kw) - 1];
	}
	st->sessions = n_sessions;
	st->have_index = s->cfg.db != NULL;
	st->index = index;
	st->have_tiers = s->cfg.tm != NULL;
	if (s->cfg.tm)
		kvt_tm_get_stats(s->cfg.tm, &st->tiers);
	else
		memset(&st->tiers, 0, sizeof(st->tiers));
}

int kvt_sched_tenants(kvt_sched *s, kvt_tm_tenant_stats **out, uint32_t *n)
{
	uint32_t cap = 0, have = 0;
	*out = NULL;
	*n = 0;
	if (!s->cfg.tm)
		return KVT_OK;
	for (;;) { /* tenants only ever get added: size, then fill, until it fits */
		kvt_tm_get_tenants(s->cfg.tm, *out, cap, &have);
		if (have <= cap)
			break;
		free(*out);
		cap = have + 4;
		if (!(*out = calloc(cap, sizeof(**out))))
			return KVT_ENOMEM;
	}
	*n = have;
	return KVT_OK;
}
