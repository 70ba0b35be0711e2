/*
 * engine/serve/scheduler.c — continuous batching over the requests, and the
 * prefix cache through the tiering manager's prefix-cache handle
 * (scheduler.h). This file holds the public calls, the scheduler thread and
 * its loop; each phase of the loop lives in the file of its concept
 * (sched_int.h lists them), and the sessions in sessions.c.
 *
 * One scheduler thread (sched_main). Like an event loop's named phases, each
 * turn of its loop:
 *   1. admits: sched_admit_from_queue (sched_policy.c) takes the queued
 *      requests that may start, best first, while fewer than max_running
 *      run and T0 can hold what is committed; start_admitted starts each
 *      (sched_start_request, sched_request.c): hashes the fill's full blocks
 *      under the tenant's chain root (each block once: the same hashes serve
 *      the lookup and, later, registration) and acquires their prefix
 *      handle; the manager pins what is cached and chooses how it comes up
 *      (tiers/manager.h: READY, LAYERED, ASYNC, REMOTE);
 *   2. prunes the ended requests and ends the cancelled (reap_cancelled);
 *   3. runs one step (step), itself a sequence of phases:
 *      advance_states      takes the prefixes that have come up, lets a
 *                          resumed sequence whose fill is done decode, runs
 *                          the blends due (sched_chunks.c);
 *      sched_plan_decode   one row per decoding sequence (its last sampled
 *                          token), one per finishing sequence (its last
 *                          token, so the whole turn's K/V is stored and its
 *                          blocks cached) (sched_batch.c);
 *      sched_plan_prefill  prompt chunks of the prefilling sequences up to
 *                          prefill_chunk rows, shared by the policy
 *                          (scheduler.h: FAIR ranks by priority, shortest
 *                          remaining, aging; FIFO gives the oldest all it
 *                          takes) (sched_policy.c);
 *      sched_make_room     makes room in T0 (the manager evicts); if it
 *                          cannot, preempts the lowest-priority, latest
 *                          sequence (back to the queue's front, its blocks
 *                          left to the cache) and the step is planned again;
 *      sched_run           the forward; a prefix still coming up layer group
 *                          by layer group gates its sequence's forward (the
 *                          handle's gate); then the layered prefixes settle;
 *      count_step          the step's counters and the prefill rate;
 *      sched_retire        registers every new full block with the manager,
 *                          samples the next token of each sequence that
 *                          asked for logits, and ends the requests that are
 *                          done: the handle released (unpinned), the session
 *                          row and the end of that request's turn
 *                          (sessions_turn_end, sessions.c);
 *   4. prunes again.
 *
 * The manager functions the scheduler's files call: kvt_tm_prefix_acquire /
 * _ready / _take / _gate / _settle / _wait / _get_counts / _release (the
 * cached prefix, a chunk's lookup), kvt_tm_register / _register_kind (a new
 * block, a chunk's), kvt_tm_end_turn_chain (a stored chunk's blocks due),
 * kvt_tm_reserve_t0 (room for a step), kvt_tm_retain (cache control), and
 * for statistics and shutdown kvt_tm_get_stats, kvt_tm_get_tenants,
 * kvt_tm_flush. They never touch a T0 slot, the block table or the index
 * (cmake/check_layout.cmake fails the build if one does); of the T0 pool
 * they ask only its size and free count (the admission and step budgets),
 * and of the index module only the pure chain hash (kvt_hash_chain).
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
 *   (sched_finish_request). DONE handles leave the running list (prune) and
 *   are freed by whichever of the client and the scheduler lets go last.
 *
 * Locking: s->mu guards the queue, the handles' client-visible fields and
 * the counters (sched_int.h). The model, the sequences, the samplers, the
 * prefix handles and the batch belong to the scheduler thread alone.
 */
#include "sched_int.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const double kvt_ttft_bucket_le[KVT_TTFT_BUCKETS] = { 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
						      0.5,   1.0,  2.5,   5.0,  10.0, INFINITY };

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
const sched_sessions *kvt_sched_sessions_of(kvt_sched *s) { return &s->sess; }
uint32_t kvt_sched_max_ctx(const kvt_sched *s) { return s->max_ctx; }

/* ---- handles ---- */

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
	sched_chunks_free(h);
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

/* A request's size: a prompt and max_tokens, within the context and the device pool, in the vocabulary. */
static int check_request_size(const kvt_sched *s, const kvt_sched_req *r)
{
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
	return KVT_OK;
}

/* A request's options: its names, session, priority, grammar, logprobs and chunk spans. */
static int check_request_options(const kvt_sched *s, const kvt_sched_req *r)
{
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
	return KVT_OK;
}

/* A handle for r, QUEUED (not yet on the queue): the prompt copied, its priority set. KVT_OK or KVT_ENOMEM. */
static int handle_new(kvt_sched *s, const kvt_sched_req *r, kvt_sched_handle **out)
{
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
	h->prio = r->has_priority ? r->priority : sched_tenant_priority(s, r->tenant);
	h->usage.priority = h->prio;
	pthread_cond_init(&h->cv, NULL);
	*out = h;
	return KVT_OK;
}

/* A handle refused at submit (nothing but handle_new has touched it). */
static void handle_refused(kvt_sched_handle *h)
{
	pthread_cond_destroy(&h->cv);
	kvt_grammar_unref(h->req.grammar);
	free(h->lps);
	free(h->toks);
	free(h);
}

/*
 * Put h at the queue's tail and wake the scheduler: KVT_OK, or KVT_ESTOPPED
 * (draining or stopping), KVT_EFULL (max_queue waiting beyond the batch's
 * free places). Takes s->mu.
 */
static int enqueue(kvt_sched *s, kvt_sched_handle *h)
{
	pthread_mutex_lock(&s->mu);
	int rc = KVT_OK;
	if (s->draining || s->stop)
		rc = KVT_ESTOPPED;
	else if (s->n_queued >= s->cfg.max_queue + free_places(s))
		rc = KVT_EFULL; /* max_queue waiting beyond the batch's free places (0: none waits) */
	if (rc) {
		pthread_mutex_unlock(&s->mu);
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
	return KVT_OK;
}

int kvt_sched_submit(kvt_sched *s, const kvt_sched_req *r, kvt_sched_handle **out)
{
	kvt_sched_handle *h;
	*out = NULL;
	int rc = check_request_size(s, r);
	if (rc || (rc = check_request_options(s, r)) || (rc = handle_new(s, r, &h)))
		return rc;
	if ((rc = enqueue(s, h))) {
		handle_refused(h);
		return rc;
	}
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

/*
 * Before a step is planned: a prefix that has come up is taken, a resumed
 * sequence whose fill is done decodes again (its next row is its last
 * token), and a blend whose start the sequence has reached runs.
 */
static void advance_states(kvt_sched *s)
{
	for (kvt_sched_handle *h = s->running; h; h = h->next) {
		if (h->state == H_PROMOTE && kvt_tm_prefix_ready(s->cfg.tm, h->pfx))
			sched_take_prefix(s, h);
		/* a resumed sequence whose fill is done decodes again (its next row is its last token) */
		if (h->state == H_PREFILL && h->resume_decode && h->seq.n_tokens >= h->n_fill)
			h->state = H_DECODE;
		if (h->state == H_PREFILL && h->blend_at == h->seq.n_tokens)
			sched_chunks_blend(s, h);
	}
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

/*
 * The sessions' prefill_rate (sessions.h): the rate a resume reports the
 * prefill it avoided from, this run's once 0.5 s of prefill is measured,
 * else the kept one. Any thread; takes s->mu.
 */
static double prefill_rate(kvt_sched *s)
{
	pthread_mutex_lock(&s->mu);
	double rate = s->st.prefill_s > 0.5 && s->st.prefill_tokens ? s->st.prefill_tokens / s->st.prefill_s
								   : s->calib_rate;
	pthread_mutex_unlock(&s->mu);
	return rate;
}

/* A step ran: its counters (a mixed batch's time split by rows), and the prefill rate once it is measured. */
static void count_step(kvt_sched *s, const sched_batch *b, double dt)
{
	pthread_mutex_lock(&s->mu);
	s->st.steps++;
	s->st.device_steps += b->on_device;
	s->st.prefill_tokens += b->n_prefill;
	/* a mixed batch's time is split by rows */
	s->st.prefill_s += dt * b->n_prefill / b->n_rows;
	s->st.decode_s += dt * (b->n_rows - b->n_prefill) / b->n_rows;
	pthread_mutex_unlock(&s->mu);
	if (b->n_prefill)
		rate_note(s);
}

/*
 * One step: one batch over the running sequences, as its phases (see the
 * opening comment). false: there were no rows to run (only promotions in
 * flight, or nothing running).
 */
static bool step(kvt_sched *s, sched_batch *b)
{
	double dt;
	advance_states(s);
	sched_plan_decode(s, b);
	sched_plan_prefill(s, b);
	if (!b->n_ent)
		return false;
	if (!sched_make_room(s, b) || !sched_run(s, b, &dt))
		return true; /* a preemption or an ended request to plan around, or a forward to retry */
	count_step(s, b, dt);
	sched_retire(s, b);
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
			sched_finish_request(s, h, KVT_FINISH_CANCELLED);
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
		s->n_ended -= h->ended; /* every pruned handle has ended (sched_finish_request, sched_turn_saved) */
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

/*
 * Start the admitted requests (adm, in admission order): each joins the
 * running list, and starts, or ends at once when it was cancelled meanwhile
 * (or the scheduler is stopping).
 */
static void start_admitted(kvt_sched *s, kvt_sched_handle *adm, bool stop)
{
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
			sched_finish_request(s, h, KVT_FINISH_CANCELLED);
		} else {
			sched_start_request(s, h);
		}
	}
}

static void *sched_main(void *arg)
{
	kvt_sched *s = arg;
	sched_batch b;
	const bool have_batch = sched_batch_init(s, &b) == KVT_OK;
	if (!have_batch) {
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
		kvt_sched_handle *adm = sched_admit_from_queue(s, stop);
		pthread_mutex_unlock(&s->mu);
		if (stop && !s->running && !adm)
			break;
		start_admitted(s, adm, stop);
		/* the ended leave, the cancelled end */
		prune(s);
		reap_cancelled(s);
		prune(s);
		if (have_batch && !step(s, &b) && s->running) {
			/* only promotions in flight: look again shortly */
			struct timespec ts = { 0, 200 * 1000 };
			nanosleep(&ts, NULL);
		}
		prune(s);
	}
	sched_batch_deinit(&b);
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
	s->sess = (sched_sessions){ .db = s->cfg.db,
				    .tm = s->cfg.tm,
				    .cache = s->cfg.cache,
				    .block_tokens = s->block_tokens,
				    .model_fp = s->cfg.model_fp,
				    .layout_version = s->cfg.layout_version,
				    .secret = s->secret,
				    .secret_bytes = s->cfg.secret_bytes,
				    .owner = s,
				    .prefill_rate = prefill_rate,
				    .turn_saved = sched_turn_saved };
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
	sessions_flush(&s->sess);
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

	sessions_stats(&s->sess, &n_sessions, &index);
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

/* ---- sessions (sessions.c): the scheduler's own, passed through ---- */

int kvt_sched_sessions(kvt_sched *s, const char *tenant, kvt_session_info **out, size_t *n)
{
	return sessions_list(&s->sess, tenant, out, n);
}

int kvt_sched_session_delete(kvt_sched *s, const char *tenant, const char *id)
{
	return sessions_delete(&s->sess, tenant, id);
}

int kvt_sched_session_remote(kvt_sched *s, const char *tenant, const char *id)
{
	return sessions_remote(&s->sess, tenant, id);
}

int kvt_sched_session_resume(kvt_sched *s, const char *tenant, const char *id, kvt_resume_progress_fn progress,
			     void *user, kvt_resume_report *rep)
{
	return sessions_resume(&s->sess, tenant, id, progress, user, rep);
}
