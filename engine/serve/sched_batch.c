/*
 * engine/serve/sched_batch.c — one step's batch (sched_int.h, sched_batch):
 * the rows of the decoding and finishing sequences, room in T0 for them and
 * for the prompt chunks the policy planned (sched_policy.c), the forward, and
 * retiring the rows that ran.
 *
 * Design. The step (scheduler.c) runs these phases in order, each one job:
 *   sched_plan_decode   one row per decoding sequence (its last sampled
 *                       token) and per finishing one (its last token, so the
 *                       whole turn's K/V is stored and its blocks cached);
 *   sched_plan_prefill  (sched_policy.c) the prompt chunks;
 *   sched_make_room     room in T0: the manager evicts; else a preemption
 *                       (the step is planned again), or the decode rows
 *                       alone, or the newest request ends;
 *   sched_run           the forward: on the device (kvt_model_decode, the
 *                       tokens picked there) when only plain greedy decode
 *                       rows run and no prefix is still coming up, else
 *                       kvt_model_forward_batch_gated (a prefix still coming
 *                       up layer group by layer group gates its sequence's
 *                       layers); then the layered prefixes are settled;
 *   sched_retire        the new blocks registered, chunks stored, the next
 *                       token of each sequence that asked for logits
 *                       sampled, the finished requests ended.
 * The batch's buffers are allocated once, when the scheduler thread starts:
 * nothing is allocated per step.
 *
 * Invariants: the decode and finishing rows are the batch's first n_decode
 * entries, one row each, so running them alone is cutting the batch short;
 * the logits of the entries that want them lie in s->logits in entry order
 * (a host forward), and picked[i] is entry i's token (a device step); an
 * entry whose prefix failed to reach T0 (bad[i]) has nothing registered or
 * sampled. Scheduler thread only; s->mu for the counters.
 */
#include "sched_int.h"

#include <stdlib.h>
#include <string.h>

int sched_batch_init(const kvt_sched *s, sched_batch *b)
{
	const uint32_t cap_ent = s->cfg.max_running + 1;
	memset(b, 0, sizeof(*b));
	b->ents = calloc(cap_ent, sizeof(*b->ents));
	b->rows = calloc(s->max_batch, sizeof(*b->rows));
	b->cands = calloc(cap_ent, sizeof(*b->cands));
	b->seqs = calloc(cap_ent, sizeof(*b->seqs));
	b->n = calloc(cap_ent, sizeof(*b->n));
	b->want = calloc(cap_ent, sizeof(*b->want));
	b->gates = calloc(cap_ent, sizeof(*b->gates));
	b->picked = calloc(cap_ent, sizeof(*b->picked));
	b->bad = calloc(cap_ent, sizeof(*b->bad));
	if (b->ents && b->rows && b->cands && b->seqs && b->n && b->want && b->gates && b->picked && b->bad)
		return KVT_OK;
	sched_batch_deinit(b);
	return KVT_ENOMEM;
}

void sched_batch_deinit(sched_batch *b)
{
	free(b->ents);
	free(b->rows);
	free(b->cands);
	free(b->seqs);
	free(b->n);
	free(b->want);
	free(b->gates);
	free(b->picked);
	free(b->bad);
	memset(b, 0, sizeof(*b));
}

void sched_plan_decode(kvt_sched *s, sched_batch *b)
{
	const uint32_t cap_rows = s->max_batch;
	const uint32_t cap_ent = s->cfg.max_running + 1;
	b->n_ent = b->n_rows = 0;
	for (kvt_sched_handle *h = s->running; h; h = h->next) {
		if ((h->state == H_DECODE || h->state == H_FINISHING) && b->n_rows < cap_rows && b->n_ent < cap_ent) {
			b->ents[b->n_ent++] = (sched_entry){ .h = h, .n = 1, .logits = h->state == H_DECODE };
			b->rows[b->n_rows++] = h->toks[h->n_toks - 1];
		}
	}
	b->n_decode = b->n_ent;
}

/* ---- room in T0 ---- */

static uint32_t blocks_needed(const kvt_sched *s, const sched_entry *e)
{
	const uint32_t bt = s->block_tokens;
	uint32_t need = (e->h->seq.n_tokens + e->n + bt - 1) / bt;
	return need > e->h->seq.n_blocks ? need - e->h->seq.n_blocks : 0;
}

/* The T0 blocks the batch's entries need beyond those their sequences hold. */
static uint32_t batch_blocks(const kvt_sched *s, const sched_batch *b)
{
	uint32_t need = 0;
	for (uint32_t i = 0; i < b->n_ent; i++)
		need += blocks_needed(s, &b->ents[i]);
	return need;
}

/* T0 cannot hold even the decode rows and nothing can be preempted: the newest request ends. */
static void end_newest(kvt_sched *s, uint32_t need)
{
	kvt_sched_handle *newest = NULL;
	for (kvt_sched_handle *h = s->running; h; h = h->next)
		if (h->state != H_DONE)
			newest = h;
	KVT_LOGE("sched: the device block pool is full (%u blocks needed, %u free) with nothing to preempt: "
		 "ending the newest request",
		 need, kvt_t0_n_free(s->cfg.t0));
	if (newest)
		sched_finish_request(s, newest, KVT_FINISH_ERROR);
}

/*
 * Room in T0: let the manager evict; else preempt the lowest-priority,
 * latest sequence and build the step again; else (one sequence left)
 * run the decode rows alone; else end the newest request.
 */
bool sched_make_room(kvt_sched *s, sched_batch *b)
{
	uint32_t need = batch_blocks(s, b);
	if (need > kvt_t0_n_free(s->cfg.t0) && s->cfg.tm)
		kvt_tm_reserve_t0(s->cfg.tm, need);
	if (need > kvt_t0_n_free(s->cfg.t0)) {
		kvt_sched_handle *v = sched_pick_victim(s);
		if (v) {
			sched_preempt(s, v);
			return false;
		}
	}
	if (need > kvt_t0_n_free(s->cfg.t0) && b->n_decode < b->n_ent) {
		b->n_ent = b->n_decode;
		b->n_rows = b->n_decode;
		need = batch_blocks(s, b);
	}
	if (need > kvt_t0_n_free(s->cfg.t0)) {
		end_newest(s, need);
		return false;
	}
	return true;
}

/* ---- the forward ---- */

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
static bool device_step(const kvt_sched *s, const sched_entry *ents, uint32_t n_ent, uint32_t n_decode)
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

/* The forward's arguments: each entry's sequence, rows and whether it wants logits; the prompt rows among them. */
static void batch_args(sched_batch *b)
{
	b->n_prefill = 0;
	for (uint32_t i = 0; i < b->n_ent; i++) {
		b->seqs[i] = &b->ents[i].h->seq;
		b->n[i] = b->ents[i].n;
		b->want[i] = b->ents[i].logits;
		b->n_prefill += b->ents[i].h->state == H_PREFILL ? b->ents[i].n : 0;
	}
}

/* Sequences whose prefix is still coming up layer group by layer group: their layers wait per group. */
static uint32_t batch_gates(sched_batch *b)
{
	uint32_t n_gates = 0;
	for (uint32_t i = 0; i < b->n_ent; i++) {
		kvt_model_gate *g = &b->gates[n_gates];
		*g = (kvt_model_gate){ 0 };
		if (b->ents[i].h->pfx &&
		    kvt_tm_prefix_gate(b->ents[i].h->pfx, &g->events, &g->n_groups, &g->layers_per_group))
			n_gates++;
	}
	return n_gates;
}

/* Their copies are done (the forward synced): enter the blocks in T0; a failed copy ends the request (retire). */
static void settle_prefixes(kvt_sched *s, sched_batch *b)
{
	for (uint32_t i = 0; i < b->n_ent; i++) {
		b->bad[i] = b->ents[i].h->pfx && kvt_tm_prefix_settle(s->cfg.tm, b->ents[i].h->pfx) != KVT_OK;
		if (b->bad[i])
			KVT_LOGE("sched: a request's cached prefix failed to reach T0: ending it");
	}
}

bool sched_run(kvt_sched *s, sched_batch *b, double *dt)
{
	batch_args(b);
	const uint32_t n_gates = batch_gates(b);
	b->on_device = !n_gates && device_step(s, b->ents, b->n_ent, b->n_decode);
	double t0 = kvt_now_s();
	int rc = b->on_device ? kvt_model_decode(s->cfg.model, b->n_ent, b->seqs, b->rows, NULL, NULL, b->picked)
			      : kvt_model_forward_batch_gated(s->cfg.model, b->n_ent, b->seqs, b->n, b->rows, b->want,
							      s->logits, n_gates, b->gates);
	*dt = kvt_now_s() - t0;
	settle_prefixes(s, b);
	KVT_LOGD("sched: step: %u rows (%u decode, %u prefill) in %u sequences, %.1f ms%s", b->n_rows,
		 b->n_rows - b->n_prefill, b->n_prefill, b->n_ent, *dt * 1e3, b->on_device ? " (on the device)" : "");
	/*
	 * NOTE: the I/O threads take T0 slots for promotions in flight, so the
	 * free count sched_make_room read can be gone by the time the forward
	 * reserves: it then holds no new token of any sequence (model.h), and
	 * the next step makes room again (evicting, else preempting). Only a
	 * pool that stays short fails the batch.
	 */
	if (rc == KVT_EFULL && !b->on_device && s->efull_retries < 3) {
		s->efull_retries++;
		KVT_LOGW("sched: T0 ran out during a step of %u rows (a promotion took the room): running it again",
			 b->n_rows);
		return false;
	}
	s->efull_retries = 0;
	if (rc) {
		KVT_LOGE("sched: a batch of %u rows failed: %s", b->n_rows, kvt_strerror(rc));
		for (uint32_t i = 0; i < b->n_ent; i++)
			sched_finish_request(s, b->ents[i].h, KVT_FINISH_ERROR);
		return false;
	}
	return true;
}

/* ---- retiring the rows that ran ---- */

void sched_retire(kvt_sched *s, sched_batch *b)
{
	uint32_t li = 0;
	for (uint32_t i = 0; i < b->n_ent; i++) {
		kvt_sched_handle *h = b->ents[i].h;
		if (b->bad[i]) { /* its K/V is not what it should be: nothing of it is registered or sampled */
			li += b->ents[i].logits;
			sched_finish_request(s, h, KVT_FINISH_ERROR);
			continue;
		}
		sched_register_blocks(s, h);
		sched_chunks_store(s, h);
		if (h->state == H_FINISHING) {
			sched_finish_request(s, h, h->finish);
			continue;
		}
		if (!b->ents[i].logits)
			continue;
		if (b->on_device) {
			sched_take_token(s, h, b->picked[i]);
			continue;
		}
		float *lg = s->logits + (size_t)li++ * s->n_vocab;
		kvt_token_lp *lp = h->lps ? &h->lps[h->n_toks - h->req.n_prompt] : NULL;
		int32_t tok = kvt_sampler_next(&h->sampler, lg, h->gm, lp, h->req.top_logprobs);
		if (tok < 0) /* the grammar allows nothing (logged) */
			sched_finish_request(s, h, KVT_FINISH_ERROR);
		else
			sched_take_token(s, h, tok);
	}
}
