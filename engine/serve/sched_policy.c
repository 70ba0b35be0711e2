/*
 * engine/serve/sched_policy.c — who goes when (sched_int.h): which queued
 * requests admission starts, how a step's prefill budget is shared among the
 * prefilling sequences, and which sequence a full T0 preempts.
 *
 * Design. The policy (scheduler.h, enum kvt_sched_policy) decides order
 * only; it never touches a sequence, a block or the model. Admission takes
 * the best request first (FAIR: a preempted one, then the lowest effective
 * priority, then the oldest; FIFO: the queue's order) while the T0 pool can
 * hold what is committed to the running ones; FAIR keeps a small reserve of
 * T0 for prompts of at most one step's budget, and when the best request
 * does not fit it admits smaller ones past it, their prompts bounded as the
 * head prompt's delay is (head_share), so a burst of long prompts never
 * keeps a short request waiting for T0 room. The prefill budget
 * (prefill_chunk rows a step) goes by FAIR's ranking: aged first, then
 * effective priority, shortest remaining prompt, admission order, with the
 * head prompt's turn (pick_head, head_turn) bounding how long others may
 * run before it; FIFO gives the oldest all it takes. The victim of a
 * preemption is the lowest-priority, latest sequence, never the oldest.
 *
 * Invariants: a request's effective priority only improves while it waits
 * (one level per priority_aging_s, never past KVT_PRIORITY_MIN); the oldest
 * running sequence is never preempted, so someone always progresses;
 * t0_committed is the sum of the running requests' committed blocks; the
 * prompt tokens FAIR admits past a waiting request (its overtaken) never
 * exceed its allowance, so it waits at most for them and the running ones.
 * Admission runs under s->mu; the rest on the scheduler thread alone.
 */
#include "sched_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
int sched_tenant_priority(const kvt_sched *s, const char *tenant)
{
	for (uint32_t i = 0; i < s->cfg.n_tenant_priority; i++)
		if (!strcmp(s->cfg.tenant_priority[i].tenant, sched_tenant(tenant)))
			return s->cfg.tenant_priority[i].priority;
	return s->cfg.default_priority;
}

/*
 * The queued request admission takes next (under s->mu): FAIR (but when
 * stopping) a preempted request, then the lowest effective priority, then
 * the oldest; FIFO the queue's head. Returns the link that points at it.
 */
static kvt_sched_handle **queue_best(kvt_sched *s, bool stop, double now)
{
	kvt_sched_handle **best = &s->q_head;
	if (s->cfg.policy != KVT_SCHED_FAIR || stop)
		return best;
	int bp = 0;
	for (kvt_sched_handle **pp = &s->q_head; *pp; pp = &(*pp)->next) {
		kvt_sched_handle *c = *pp;
		int p = c->preempted ? KVT_PRIORITY_MIN - 1 : effective_priority(s, c, now);
		if (pp == &s->q_head || p < bp) {
			best = pp;
			bp = p;
		}
	}
	return best;
}

/* Take the request *link points at off the queue: running, need T0 blocks committed to it, its wait recorded. */
static void dequeue(kvt_sched *s, kvt_sched_handle **link, uint32_t need, double now)
{
	kvt_sched_handle *h = *link;
	s->t0_committed += need;
	h->committed = need;
	*link = h->next;
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
}

/*
 * FAIR's reserve: T0 blocks only prompts of at most one step's budget
 * (prefill_chunk tokens) may take, so that however much of T0 long prompts
 * hold, a short question finds room. It holds one step's budget of new
 * prompts, each rounded up to whole blocks with the block of growth
 * admission commits (two blocks a running place), and at most a quarter of
 * T0 (a small T0 still runs two long prompts at once).
 */
static uint32_t short_reserve(const kvt_sched *s)
{
	const uint32_t n_slots = kvt_t0_n_slots(s->cfg.t0);
	const uint32_t r = (s->cfg.prefill_chunk + s->block_tokens - 1) / s->block_tokens + 2 * s->cfg.max_running;
	return r < n_slots / 4 ? r : n_slots / 4;
}

/* Whether T0 can hold h's need next to what is committed to the running ones (FAIR: a long prompt leaves the reserve). */
static bool t0_fits(const kvt_sched *s, const kvt_sched_handle *h, uint32_t need)
{
	uint32_t n_slots = kvt_t0_n_slots(s->cfg.t0);
	if (s->cfg.policy == KVT_SCHED_FAIR && h->n_fill > s->cfg.prefill_chunk)
		n_slots -= short_reserve(s);
	return s->t0_committed + need <= n_slots;
}

/*
 * Prompt tokens FAIR may admit past a request T0 cannot hold yet:
 * (1 / head_share - 1) times its fill, to the nearest token (head_share is a
 * float: 1 / 0.8f is a hair under 1.25).
 */
static double pass_allowance(const kvt_sched *s, const kvt_sched_handle *blocked)
{
	if (!(s->cfg.head_share > 0))
		return INFINITY; /* no head bound: smaller requests always go first */
	return round((1.0 / (double)s->cfg.head_share - 1.0) * (double)blocked->n_fill);
}

/*
 * FAIR's backfill: the best queued request other than blocked (the best one,
 * which T0 cannot hold next to the running ones) that T0 can hold and whose
 * fill keeps the tokens admitted past blocked within its allowance. A burst
 * of long prompts thus cannot keep a short request waiting at admission,
 * and a stream of short ones cannot keep the long one out for good: once
 * they have used its allowance, admission waits for room for it, as FIFO
 * always does. Never past a preempted request (it resumes first), and never
 * a preempted one (its swapped-out blocks come back into T0 beside its fill;
 * queue_best already takes a queued preempted request first, so this only
 * states the rule). Returns
 * the link that points at it; NULL: none.
 */
static kvt_sched_handle **queue_backfill(kvt_sched *s, const kvt_sched_handle *blocked, double now)
{
	if (s->cfg.policy != KVT_SCHED_FAIR || blocked->preempted)
		return NULL;
	const double room = pass_allowance(s, blocked) - (double)blocked->overtaken;
	kvt_sched_handle **best = NULL;
	int bp = 0;
	for (kvt_sched_handle **pp = &s->q_head; *pp; pp = &(*pp)->next) {
		const kvt_sched_handle *c = *pp;
		if (c == blocked || c->preempted || (double)c->n_fill > room || !t0_fits(s, c, blocks_to_commit(s, c)))
			continue;
		int p = effective_priority(s, c, now);
		if (!best || p < bp) {
			best = pp;
			bp = p;
		}
	}
	return best;
}

/*
 * Admission, best first (queue_best): a request starts when the T0 pool can
 * hold what is committed to the running ones next to it (or nothing runs).
 * Committed is each one's fill and a block (growth past it is met by
 * preemption), or with admit_longest its longest, so that a sequence never
 * finds the pool full half way. FAIR keeps a reserve of T0 that only short
 * prompts may take (short_reserve), and when the best request does not fit
 * it admits smaller ones past it within its allowance (queue_backfill).
 * After a preemption nothing is admitted until a request ends.
 */
kvt_sched_handle *sched_admit_from_queue(kvt_sched *s, bool stop)
{
	kvt_sched_handle *adm = NULL, **tail = &adm;
	const double now = kvt_now_s();
	while (s->q_head && (stop || (s->n_running < s->cfg.max_running && !(s->admit_hold && s->n_running)))) {
		kvt_sched_handle **best = queue_best(s, stop, now);
		kvt_sched_handle *h = *best;
		uint32_t need = blocks_to_commit(s, h);
		if (!stop && s->n_running && !t0_fits(s, h, need)) {
			kvt_sched_handle *blocked = h;
			if (!(best = queue_backfill(s, blocked, now)))
				break;
			h = *best;
			need = blocks_to_commit(s, h);
			blocked->overtaken += h->n_fill;
			s->st.admit_backfills++;
		}
		dequeue(s, best, need, now);
		*tail = h;
		tail = &h->next;
	}
	if (!s->n_running)
		s->admit_hold = false;
	return adm;
}

/* ---- the prefill budget ---- */

/* Where h's plain prefill stops for now: the blend's start, or the end of the fill. */
static uint32_t prefill_stop(const kvt_sched_handle *h)
{
	return h->blend_at != NO_BLEND && h->seq.n_tokens < h->blend_at ? h->blend_at : h->n_fill;
}

static int cmp_cand(const void *a, const void *b)
{
	const sched_cand *x = a, *y = b;
	if (x->aged != y->aged)
		return x->aged ? -1 : 1;
	if (x->prio != y->prio)
		return x->prio < y->prio ? -1 : 1;
	if (x->left != y->left)
		return x->left < y->left ? -1 : 1;
	return (x->h->seq_no > y->h->seq_no) - (x->h->seq_no < y->h->seq_no);
}

/* The prefilling sequences (at most cap) as candidates, with what the policy ranks them by now. */
static uint32_t collect_cands(kvt_sched *s, sched_cand *cands, uint32_t cap)
{
	uint32_t n_cand = 0;
	const double now = kvt_now_s();
	for (kvt_sched_handle *h = s->running; h && n_cand < cap; h = h->next) {
		if (h->state != H_PREFILL)
			continue;
		cands[n_cand++] = (sched_cand){ .h = h,
						.aged = h->passed >= s->cfg.aging_steps,
						.prio = effective_priority(s, h, now),
						.left = prefill_stop(h) - h->seq.n_tokens };
	}
	return n_cand;
}

/*
 * FAIR's head: the oldest prefilling sequence of the best effective
 * priority. Others' rows (prompt and decode) run before it until they
 * add up to (1 / head_share - 1) times its prompt; from then on it takes
 * the budget first, as FIFO would, so they cannot stretch its prefill by
 * more than that however fast they arrive. Aging still lifts a shorter
 * prompt passed over (so a short one never waits out a long prefill),
 * but not one at least as long as the head: those wait to be head in
 * turn rather than round-robin with it, which would delay them all.
 * NULL: no head (fewer than two candidates, or head_share 0).
 */
static kvt_sched_handle *pick_head(const kvt_sched *s, sched_cand *cands, uint32_t n_cand)
{
	if (n_cand < 2 || !(s->cfg.head_share > 0))
		return NULL;
	uint32_t hi = 0;
	for (uint32_t i = 1; i < n_cand; i++)
		if (cands[i].prio < cands[hi].prio ||
		    (cands[i].prio == cands[hi].prio && cands[i].h->seq_no < cands[hi].h->seq_no))
			hi = i;
	for (uint32_t i = 0; i < n_cand; i++)
		if (i != hi && cands[i].left >= cands[hi].left)
			cands[i].aged = false;
	return cands[hi].h;
}

/*
 * The head's turn, once the others' rows have added up to its allowance:
 * first (moved to the front of the ranked candidates), taking all it can,
 * or head_share of the budget while shorter prompts have aged (they share
 * the rest). Returns its cap in its turn; 0: none (not its turn, or all).
 */
static uint32_t head_turn(const kvt_sched *s, sched_cand *cands, uint32_t n_cand, const kvt_sched_handle *head)
{
	uint32_t hi = 0;
	while (cands[hi].h != head)
		hi++;
	double allowance = (1.0 / s->cfg.head_share - 1.0) * (double)head->n_fill;
	if ((double)head->yielded < allowance)
		return 0;
	bool aged_others = false;
	for (uint32_t i = 0; i < n_cand; i++)
		aged_others = aged_others || (i != hi && cands[i].aged);
	sched_cand c = cands[hi];
	memmove(cands + 1, cands, hi * sizeof(sched_cand));
	cands[0] = c;
	cands[0].aged = false;
	if (!aged_others)
		return 0;
	uint32_t head_cap = (uint32_t)ceilf(s->cfg.head_share * (float)s->cfg.prefill_chunk);
	return head_cap ? head_cap : 1;
}

/*
 * The budget to the ranked candidates, in order, each as much as its cap,
 * the budget and the batch's rows allow: an entry each, its prompt chunk in
 * the rows. A candidate given nothing is passed over (aging); the head
 * counts the others' rows run before it.
 */
static void share_budget(kvt_sched *s, sched_batch *b, uint32_t n_cand, kvt_sched_handle *head, uint32_t head_cap)
{
	const bool fair = s->cfg.policy == KVT_SCHED_FAIR;
	const uint32_t cap_rows = s->max_batch;
	const uint32_t cap_ent = s->cfg.max_running + 1;
	const sched_cand *cands = b->cands;
	uint32_t budget = s->cfg.prefill_chunk;
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
		if (c > cap_rows - b->n_rows)
			c = cap_rows - b->n_rows;
		if (!c || b->n_ent >= cap_ent) {
			h->passed++;
			continue;
		}
		h->passed = 0;
		const bool logits = c == left && prefill_stop(h) == h->n_fill && !h->resume_decode;
		b->ents[b->n_ent++] = (sched_entry){ .h = h, .n = c, .logits = logits };
		memcpy(b->rows + b->n_rows, h->toks + h->seq.n_tokens, (size_t)c * sizeof(int32_t));
		b->n_rows += c;
		budget -= c;
		if (h == head)
			head_rows = c;
	}
	if (head)
		head->yielded += b->n_rows - head_rows;
}

void sched_plan_prefill(kvt_sched *s, sched_batch *b)
{
	const bool fair = s->cfg.policy == KVT_SCHED_FAIR;
	const uint32_t n_cand = collect_cands(s, b->cands, s->cfg.max_running + 1);
	kvt_sched_handle *head = fair ? pick_head(s, b->cands, n_cand) : NULL;
	if (fair)
		qsort(b->cands, n_cand, sizeof(sched_cand), cmp_cand);
	const uint32_t head_cap = head ? head_turn(s, b->cands, n_cand, head) : 0;
	share_budget(s, b, n_cand, head, head_cap);
}

/* ---- preemption ---- */

/*
 * The victim of a preemption: the lowest-priority (largest value), latest
 * admitted sequence holding T0 blocks, other than the oldest one running
 * (which always fits alone, so someone always progresses). NULL: none.
 */
kvt_sched_handle *sched_pick_victim(kvt_sched *s)
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
