/*
 * engine/serve/sched_request.c — a request's life on the scheduler thread
 * (sched_int.h): started once admitted (its cached prefix acquired through
 * the manager's prefix-cache handle, its sequence and sampler), the prefix
 * taken once it has come up, its new blocks hashed and registered, its
 * tokens taken, preempted when T0 is full, and ended: its blocks and pins
 * released, usage published, the session row and the end of its turn
 * handed to the sessions (sessions_turn_end).
 *
 * Design. Each transition of a handle's state (scheduler.c's opening
 * comment) is one function here; the loop's phases (scheduler.c,
 * sched_batch.c) decide when, these decide how. A request's toks are hashed
 * once each block (hash_blocks): the same hashes serve the lookup at
 * admission and the registration later.
 *
 * Invariants: h->n_hashes <= h->n_hashed; a DONE handle holds no prefix
 * handle and no sequence; a session turn is acknowledged (ended for its
 * client) only once its row has committed (sched_turn_saved). Scheduler
 * thread only, but for sched_turn_saved (any thread); s->mu is taken for the
 * client-visible fields and the counters.
 */
#include "sched_int.h"

#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
void sched_finish_request(kvt_sched *s, kvt_sched_handle *h, int finish)
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
	if (sessions_turn_end(&s->sess, h->req.tenant, save ? h->req.session_id : NULL, h->toks, h->n_toks,
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
 * Why the prompt's cached prefix ends at ok of the n_full blocks looked up
 * (the prompt's last token is always run, so at best the blocks before it
 * are served: the rest is CHUNK_BOUNDARY). A session whose stored history
 * was hashed under another chain root turns NEW into MODEL_CHANGED.
 */
static void explain_miss(kvt_sched *s, kvt_sched_handle *h, uint32_t ok, uint32_t n_full)
{
	const uint32_t bt = s->block_tokens;
	kvt_tm_miss *m = &h->usage.miss;
	kvt_tm_miss_explain(s->cfg.tm, h->root, (const uint8_t(*)[KVT_HASH_BYTES])h->hashes, h->toks, n_full * bt,
			    ok * bt, m);
	if (m->reason == KVT_TM_MISS_NONE) /* every block looked up was served: the rest is the prompt's tail */
		m->reason = KVT_TM_MISS_CHUNK_BOUNDARY;
	if (m->reason == KVT_TM_MISS_NEW &&
	    sessions_model_changed(&s->sess, h->req.tenant, h->req.session_id, h->toks, h->req.n_prompt))
		m->reason = KVT_TM_MISS_MODEL_CHANGED;
	kvt_tm_miss_count(s->cfg.tm, m->reason);
	h->usage.has_miss = true;
}

/*
 * The cached prefix has come up: the blocks up to the first failure become
 * the start of the sequence (their slots straight into it, with the
 * references the handle hands over); the rest are recomputed.
 */
void sched_take_prefix(kvt_sched *s, kvt_sched_handle *h)
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
	const bool explain = !h->preempted;
	s->st.layered_promotions += c.path == KVT_TM_PREFIX_LAYERED;
	pthread_mutex_unlock(&s->mu);
	if (explain)
		explain_miss(s, h, ok, h->n_hashed);
	h->state = H_PREFILL;
	sched_chunks_place(s, h);
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
void sched_start_request(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	const uint32_t max_blocks = h->cap_toks / bt + 1;
	int rc = KVT_ENOMEM;

	if (!h->preempted) {
		h->usage.prompt_tokens = h->req.n_prompt;
		h->usage.queue_s = kvt_now_s() - h->t_submit;
	}
	if ((!h->hashes && !(h->hashes = calloc(max_blocks, KVT_HASH_BYTES))) ||
	    (!h->n_hashed && (rc = sessions_chain_root(&s->sess, h->req.tenant, h->root))) ||
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
	sched_chunks_lookup(s, h);
	if (c.path == KVT_TM_PREFIX_NONE) { /* nothing cached: everything is prefilled */
		kvt_tm_prefix_release(s->cfg.tm, h->pfx);
		h->pfx = NULL;
		if (!h->preempted && s->cfg.tm && s->cfg.cache)
			explain_miss(s, h, 0, n_full);
		sched_chunks_place(s, h);
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
				sched_finish_request(s, o, KVT_FINISH_ERROR);
	if (kvt_tm_prefix_ready(s->cfg.tm, h->pfx))
		sched_take_prefix(s, h);
	else
		h->state = H_PROMOTE;
	return;
fail:
	KVT_LOGE("sched: cannot start a request: %s", kvt_strerror(rc));
	sched_finish_request(s, h, KVT_FINISH_ERROR);
}

/* Register the sequence's new full blocks (K/V stored) with the manager. */
void sched_register_blocks(kvt_sched *s, kvt_sched_handle *h)
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
void sched_take_token(kvt_sched *s, kvt_sched_handle *h, int32_t tok)
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

/*
 * Preempt h: let go of its pins and T0 references (its registered blocks
 * stay in the cache, demoted by the manager as T0 needs room) and put it at
 * the front of the queue. Admission holds until a request ends.
 */
void sched_preempt(kvt_sched *s, kvt_sched_handle *h)
{
	const bool swap = s->cfg.preempt == KVT_PREEMPT_SWAP && s->cfg.tm && s->cfg.cache;
	const uint32_t held = h->seq.n_tokens;
	if (h->pfx && kvt_tm_prefix_settle(s->cfg.tm, h->pfx) != KVT_OK) { /* its prefix never arrived: nothing of it
									       may be reused */
		sched_finish_request(s, h, KVT_FINISH_ERROR);
		return;
	}
	kvt_tm_prefix_release(s->cfg.tm, h->pfx); /* its pins go; the blocks stay cached */
	h->pfx = NULL;
	sched_chunks_free(h); /* it resumes with a plain prefill: every block it computes then is exact */
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
