/*
 * tiers/prefix.c — the prefix-cache handle (manager.h, "the prefix-cache
 * handle"): how a request's cached prefix, or a resumed session's history,
 * comes up from the tiers, behind one small interface.
 *
 * Design. The handle is a thin owner over the manager's primitives: the
 * pinned chain lookup (kvt_tm_lookup_chain), the tickets of the I/O threads
 * (kvt_tm_submit_remote, which also continues a chain in T3), and the
 * layered promotion (kvt_tm_promote_layered). What used to be the
 * scheduler's choice between them is made here, in one place
 * (prefix_start), and the handle owns every pin, T0 reference and ticket it
 * takes until take or release hands them on or gives them back. Its byte
 * counts come from its own tickets (the bytes each promotion read, counted
 * where the read happens), never from differences of the manager's global
 * counters, so they are right while other requests promote.
 *
 * Invariants:
 *  - pins: a SERVE handle holds one pin on each of its leading n_pinned
 *    blocks (the lookup's, and T3 blocks' once they came), given back at
 *    release; a WARM handle holds none;
 *  - references: the T0 references of a ticket or a layered promotion go to
 *    the caller at take, or are dropped at release (ticket_free drops those
 *    never collected);
 *  - a layered promotion is settled (its copies waited for) before its slots
 *    can be dropped, and at most one is in flight per manager
 *    (tm_lay_owner names its handle, so a blocking promotion that would wait
 *    for its blocks can settle it first).
 */
#include "tiers_int.h"

#include <stdlib.h>
#include <string.h>

struct kvt_tm_prefix {
	int use;                          /* enum kvt_tm_prefix_use */
	uint32_t n;                       /* chain blocks asked for */
	uint8_t (*hashes)[KVT_HASH_BYTES];/* [n] copies of the chain */
	uint8_t *origin;                  /* [n] the tier each usable block was found in (KVT_TM_TIER_REMOTE: T3) */
	bool *lossy;                      /* [n] its K/V comes through an 8-bit copy (see kvt_tm_prefix_counts) */
	uint32_t n_local;                 /* usable blocks found in the table (the rest of n_usable: T3's) */
	uint32_t n_pinned;                /* SERVE: leading blocks pinned for the handle */
	bool refresh;                     /* SERVE: restart retention TTLs at take */
	kvt_tm_ticket *ticket;            /* READY / ASYNC / REMOTE: the I/O threads' work (until take / release) */
	kvt_tm_ticket *ticket_t1;         /* WARM: the blocks T0 had no room for, to T1 (waited for in wait) */
	kvt_tm_layered *layered;          /* LAYERED, until settled */
	int32_t *lay_slots;               /* [n_local] LAYERED: the T0 slots handed at once (until take) */
	bool settled;                     /* the layered promotion was settled (settle_rc says how) */
	int settle_rc;                    /* its result */
	bool waited;                      /* WARM: wait has run */
	bool taken;                       /* SERVE: take has run */
	kvt_tm_prefix_counts c;           /* the figures (n_served, blocks_from once taken / waited for) */
};

/* The tier a matched block is served from: the highest one holding it; -1 for none. */
static int origin_tier(const kvt_btable_match *m)
{
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		if (m->slot[t] >= 0)
			return t;
	return -1;
}

static void prefix_free(kvt_tm_prefix *p)
{
	free(p->hashes);
	free(p->origin);
	free(p->lossy);
	free(p->lay_slots);
	free(p);
}

/* Settle the layered promotion of p (its copies waited for, its blocks entered in T0). */
static int lay_settle(kvt_tm *tm, kvt_tm_prefix *p)
{
	if (p->layered) {
		p->settle_rc = kvt_tm_layered_finish(tm, p->layered);
		p->layered = NULL;
		p->settled = true;
		if (*tm_lay_owner(tm) == p)
			*tm_lay_owner(tm) = NULL;
	}
	return p->settled ? p->settle_rc : KVT_OK;
}

/*
 * The usable blocks, all in T0 or T1, come up layer group by layer group.
 * false: not taken (off, a block in T2 only, another layered promotion in
 * flight, a block moving): the caller goes on to the I/O threads.
 */
static bool start_layered(kvt_tm *tm, kvt_tm_prefix *p, uint32_t layer_groups)
{
	if (!layer_groups)
		return false;
	for (uint32_t i = 0; i < p->n_local; i++)
		if (p->origin[i] != KVT_TIER_HBM && p->origin[i] != KVT_TIER_HOST)
			return false;
	if (!(p->lay_slots = calloc(p->n_local, sizeof(*p->lay_slots))))
		return false;
	if (kvt_tm_promote_layered(tm, p->n_local, (const uint8_t(*)[KVT_HASH_BYTES])p->hashes, layer_groups,
				   p->lay_slots, &p->layered) != KVT_OK) {
		free(p->lay_slots);
		p->lay_slots = NULL;
		return false;
	}
	*tm_lay_owner(tm) = p;
	p->c.path = KVT_TM_PREFIX_LAYERED;
	p->c.bytes_from[KVT_TIER_HOST] = (uint64_t)kvt_tm_layered_n_copied(p->layered) * tm_packed_bytes(tm);
	return true;
}

/*
 * How the usable blocks come up (the lookup is done: p->n_local blocks
 * pinned, n_remote more to look up in T3): T3 continuation, layered, the
 * I/O threads, or at once (every block in T0, or the I/O threads' ticket
 * could not be made: the blocking promotion, after settling the layered
 * promotion in flight, whose blocks it may wait for).
 */
static int prefix_start(kvt_tm *tm, kvt_tm_prefix *p, const kvt_tm_prefix_req *r, uint32_t n_remote, bool all_in_t0)
{
	const bool serve = p->use == KVT_TM_PREFIX_SERVE;
	if (n_remote &&
	    kvt_tm_submit_remote(tm, p->n_local + n_remote, (const uint8_t(*)[KVT_HASH_BYTES])p->hashes, p->n_local,
				 r->root, KVT_TIER_HBM, serve, &p->ticket) == KVT_OK) {
		p->c.n_usable = p->n_local + n_remote;
		p->c.path = KVT_TM_PREFIX_REMOTE;
		return KVT_OK;
	}
	if (!p->n_local)
		return KVT_OK; /* path NONE */
	p->c.n_usable = p->n_local;
	if (!serve) {
		int rc = kvt_tm_submit(tm, p->n_local, (const uint8_t(*)[KVT_HASH_BYTES])p->hashes, KVT_TIER_HBM, false,
				       &p->ticket);
		if (rc == KVT_OK)
			p->c.path = KVT_TM_PREFIX_ASYNC;
		return rc;
	}
	if (!all_in_t0 && start_layered(tm, p, r->layer_groups))
		return KVT_OK;
	if (!all_in_t0 && kvt_tm_submit(tm, p->n_local, (const uint8_t(*)[KVT_HASH_BYTES])p->hashes, KVT_TIER_HBM, true,
					&p->ticket) == KVT_OK) {
		p->c.path = KVT_TM_PREFIX_ASYNC;
		return KVT_OK;
	}
	kvt_tm_prefix *owner = *tm_lay_owner(tm);
	if (owner && owner != p)
		(void)lay_settle(tm, owner); /* its result waits in owner for its own settle */
	int rc = kvt_tm_submit(tm, p->n_local, (const uint8_t(*)[KVT_HASH_BYTES])p->hashes, KVT_TIER_HBM, true,
			       &p->ticket);
	if (rc)
		return rc;
	(void)kvt_tm_ticket_wait(tm, p->ticket);
	p->c.path = KVT_TM_PREFIX_READY;
	return KVT_OK;
}

/* A handle for the request (its hashes copied), or NULL without memory. */
static kvt_tm_prefix *prefix_alloc(const kvt_tm_prefix_req *r)
{
	const uint32_t cap = r->n ? r->n : 1;
	kvt_tm_prefix *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	if (!(p->hashes = malloc((size_t)cap * KVT_HASH_BYTES)) || !(p->origin = calloc(cap, 1)) ||
	    !(p->lossy = calloc(cap, sizeof(bool)))) {
		prefix_free(p);
		return NULL;
	}
	p->use = r->use;
	p->n = r->n;
	p->refresh = r->refresh;
	if (r->n)
		memcpy(p->hashes, r->hashes, (size_t)r->n * KVT_HASH_BYTES);
	return p;
}

/*
 * The usable prefix of the nm matched blocks: those in a local tier (in T0
 * only, for a SERVE request with t0_only), each with its origin tier and
 * whether its bytes are lossy. Returns how many; *all_in_t0 says whether
 * every usable block is in T0.
 */
static uint32_t prefix_usable(kvt_tm *tm, kvt_tm_prefix *p, const kvt_tm_prefix_req *r, const kvt_btable_match *mt,
			      uint32_t nm, bool *all_in_t0)
{
	const bool t0_only = r->use == KVT_TM_PREFIX_SERVE && r->t0_only;
	uint32_t usable = 0;
	*all_in_t0 = true;
	while (usable < nm && origin_tier(&mt[usable]) >= 0 &&
	       (!t0_only || origin_tier(&mt[usable]) == KVT_TIER_HBM)) {
		p->origin[usable] = (uint8_t)origin_tier(&mt[usable]);
		p->lossy[usable] = p->origin[usable] == KVT_TIER_HBM ? mt[usable].t0_lossy : tm_lossy(tm);
		*all_in_t0 = *all_in_t0 && p->origin[usable] == KVT_TIER_HBM;
		usable++;
	}
	return usable;
}

/*
 * A local miss with T3: the chain goes on there (the I/O threads look it
 * up). A request continues only past a prefix that is all usable; a
 * resumed session past whatever is local. Returns the blocks to look up
 * there (their origin marked remote).
 */
static uint32_t prefix_remote_part(kvt_tm *tm, kvt_tm_prefix *p, const kvt_tm_prefix_req *r, uint32_t usable,
				   uint32_t nm)
{
	const bool serve = r->use == KVT_TM_PREFIX_SERVE;
	if (!r->root || !kvt_tm_has_remote(tm) || usable >= r->n || (serve && (usable != nm || r->t0_only)))
		return 0;
	uint32_t n_remote = r->n - usable;
	memset(p->origin + usable, KVT_TM_TIER_REMOTE, n_remote);
	for (uint32_t i = usable; i < r->n; i++)
		p->lossy[i] = tm_lossy(tm);
	return n_remote;
}

/* The chain's lookup: a request's pins, touches and counts its miss; a resume's only looks (as a session listing does). */
static int prefix_lookup(kvt_tm *tm, const kvt_tm_prefix_req *r, kvt_btable_match *mt, uint32_t *nm)
{
	*nm = 0;
	if (!r->n)
		return KVT_OK;
	if (r->use == KVT_TM_PREFIX_SERVE)
		return kvt_tm_lookup_chain(tm, r->hashes, r->tokens, r->n, KVT_BT_PIN | KVT_BT_TOUCH, mt, nm);
	return kvt_btable_lookup_chain(tm_bt(tm), r->hashes, r->tokens, r->n, 0, mt, nm);
}

int kvt_tm_prefix_acquire(kvt_tm *tm, const kvt_tm_prefix_req *r, kvt_tm_prefix **out)
{
	*out = NULL;
	if ((r->use != KVT_TM_PREFIX_SERVE && r->use != KVT_TM_PREFIX_WARM) || (r->n && (!r->hashes || !r->tokens))) {
		KVT_LOGE("tm prefix: bad request (use %d, %u blocks, %s hashes, %s tokens)", r->use, r->n,
			 r->hashes ? "with" : "no", r->tokens ? "with" : "no");
		return KVT_EINVAL;
	}
	kvt_btable_match *mt = r->n ? calloc(r->n, sizeof(*mt)) : NULL;
	kvt_tm_prefix *p = r->n && !mt ? NULL : prefix_alloc(r);
	if (!p) {
		free(mt);
		return KVT_ENOMEM;
	}
	const bool serve = r->use == KVT_TM_PREFIX_SERVE;
	uint32_t nm;
	int rc = prefix_lookup(tm, r, mt, &nm);
	if (rc) {
		free(mt);
		prefix_free(p);
		return rc;
	}
	bool all_in_t0;
	uint32_t usable = prefix_usable(tm, p, r, mt, nm, &all_in_t0);
	free(mt);
	if (serve)
		for (uint32_t i = usable; i < nm; i++) /* matched, but in no tier: let them go */
			kvt_tm_unpin(tm, p->hashes[i]);
	p->n_local = usable;
	p->n_pinned = serve ? usable : 0;
	p->c.n_matched = nm;
	uint32_t n_remote = prefix_remote_part(tm, p, r, usable, nm);
	if ((rc = prefix_start(tm, p, r, n_remote, all_in_t0))) {
		(void)kvt_tm_prefix_release(tm, p);
		return rc;
	}
	*out = p;
	return KVT_OK;
}

bool kvt_tm_prefix_ready(kvt_tm *tm, kvt_tm_prefix *p)
{
	return !p->ticket || kvt_tm_ticket_done(tm, p->ticket, NULL);
}

/* The leading blocks the ticket served (res[i] KVT_OK, or for WARM KVT_EFULL: kept in T1). */
static uint32_t count_served(kvt_tm_prefix *p, const int *res, bool efull_ok)
{
	uint32_t k = 0;
	while (k < p->c.n_usable && (res[k] == KVT_OK || (efull_ok && res[k] == KVT_EFULL)))
		k++;
	for (uint32_t i = 0; i < k; i++) {
		p->c.blocks_from[p->origin[i]]++;
		p->c.n_lossy += p->lossy[i];
	}
	p->c.n_served = k;
	return k;
}

int kvt_tm_prefix_wait(kvt_tm *tm, kvt_tm_prefix *p, void (*progress)(void *user, uint32_t done, uint32_t total),
		       void *user)
{
	if (!p->ticket)
		return KVT_OK;
	(void)tm_ticket_wait_progress(tm, p->ticket, progress, user, p->c.bytes_from);
	if (p->use != KVT_TM_PREFIX_WARM || p->waited)
		return KVT_OK;
	p->waited = true;
	int *res = calloc(p->c.n_usable ? p->c.n_usable : 1, sizeof(*res));
	uint8_t(*h1)[KVT_HASH_BYTES] = calloc(p->c.n_usable ? p->c.n_usable : 1, KVT_HASH_BYTES);
	if (!res || !h1) {
		free(res);
		free(h1);
		return KVT_ENOMEM;
	}
	kvt_tm_ticket_results(tm, p->ticket, NULL, res);
	/* to T0 as far as it had room; what did not fit comes up to T1 */
	uint32_t n1 = 0;
	for (uint32_t i = 0; i < p->c.n_usable; i++)
		if (res[i] == KVT_EFULL)
			memcpy(h1[n1++], p->hashes[i], KVT_HASH_BYTES);
	if (n1 && kvt_tm_prefetch(tm, n1, (const uint8_t(*)[KVT_HASH_BYTES])h1, KVT_TIER_HOST, &p->ticket_t1) == KVT_OK) {
		uint64_t b[KVT_TM_N_TIERS] = { 0 };
		(void)tm_ticket_wait_progress(tm, p->ticket_t1, NULL, NULL, b);
		for (int t = 0; t < KVT_TM_N_TIERS; t++)
			p->c.bytes_from[t] += b[t];
	}
	count_served(p, res, true); /* a miss (corrupt, gone) ends it: the rest of the chain is recomputed */
	free(res);
	free(h1);
	return KVT_OK;
}

uint32_t kvt_tm_prefix_take(kvt_tm *tm, kvt_tm_prefix *p, int32_t *t0_slots)
{
	if (p->use != KVT_TM_PREFIX_SERVE || p->taken || !p->c.n_usable)
		return p->c.n_served;
	p->taken = true;
	const uint32_t usable = p->c.n_usable;
	int *res = calloc(usable, sizeof(*res)); /* LAYERED: every block is KVT_OK */
	if (!res) {
		p->taken = false; /* release gives everything back */
		return 0;
	}
	if (p->layered || p->settled) {
		memcpy(t0_slots, p->lay_slots, usable * sizeof(*t0_slots));
	} else {
		(void)tm_ticket_wait_progress(tm, p->ticket, NULL, NULL, p->c.bytes_from);
		kvt_tm_ticket_results(tm, p->ticket, t0_slots, res);
		kvt_tm_ticket_free(tm, p->ticket);
		p->ticket = NULL;
	}
	/* a block read from NVMe is lossy as its record was: an f16 record (t2_f16) or an 8-bit one of any format */
	for (uint32_t i = 0; i < usable; i++) {
		kvt_btable_entry e;
		if (res[i] == KVT_OK && p->origin[i] == KVT_TIER_NVME && kvt_btable_get(tm_bt(tm), p->hashes[i], &e) == KVT_OK &&
		    e.slot[KVT_TIER_HBM] == t0_slots[i])
			p->lossy[i] = e.t0_lossy;
	}
	uint32_t ok = count_served(p, res, false);
	for (uint32_t i = ok; i < usable; i++) {
		if (res[i] == KVT_OK)
			kvt_t0_unref(tm_t0(tm), t0_slots[i]);
		if (i < p->n_local || res[i] == KVT_OK) /* a T3 block is pinned only when it came */
			kvt_tm_unpin(tm, p->hashes[i]);
	}
	if (ok < usable)
		KVT_LOGW("sched: %u of %u cached blocks could not be promoted (%s): recomputing them", usable - ok, usable,
			 kvt_strerror(res[ok]));
	p->n_pinned = ok;
	if (p->refresh) /* a hit restarts the TTL of the retained blocks it used */
		p->c.n_retained = kvt_tm_retain_refresh(tm, ok, (const uint8_t(*)[KVT_HASH_BYTES])p->hashes);
	free(res);
	return ok;
}

bool kvt_tm_prefix_gate(const kvt_tm_prefix *p, kvt_event *const **events, uint32_t *n_groups,
			uint32_t *layers_per_group)
{
	if (!p->layered)
		return false;
	kvt_tm_layered_groups(p->layered, events, n_groups, layers_per_group);
	return true;
}

int kvt_tm_prefix_settle(kvt_tm *tm, kvt_tm_prefix *p) { return lay_settle(tm, p); }

void kvt_tm_prefix_get_counts(kvt_tm *tm, const kvt_tm_prefix *p, kvt_tm_prefix_counts *c)
{
	(void)tm;
	*c = p->c;
}

int kvt_tm_prefix_release(kvt_tm *tm, kvt_tm_prefix *p)
{
	if (!p)
		return KVT_OK;
	int rc = lay_settle(tm, p); /* the copies must be done before the slots go */
	if (p->use == KVT_TM_PREFIX_SERVE && !p->taken) {
		/* never taken: the references and pins the handle still holds go back */
		for (uint32_t i = 0; p->lay_slots && i < p->c.n_usable; i++)
			kvt_t0_unref(tm_t0(tm), p->lay_slots[i]);
		kvt_tm_ticket_free(tm, p->ticket); /* waits; drops the T0 references and T3 pins not collected */
		p->ticket = NULL;
		p->n_pinned = p->n_local;
	}
	kvt_tm_ticket_free(tm, p->ticket);
	kvt_tm_ticket_free(tm, p->ticket_t1);
	for (uint32_t i = 0; i < p->n_pinned; i++)
		kvt_tm_unpin(tm, p->hashes[i]);
	prefix_free(p);
	return rc;
}

int kvt_tm_locate(kvt_tm *tm, const uint8_t (*hashes)[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n,
		  uint32_t blocks_in[KVT_TIER_COUNT], uint32_t *n_usable)
{
	uint32_t nm = 0, usable = 0;
	memset(blocks_in, 0, KVT_TIER_COUNT * sizeof(*blocks_in));
	*n_usable = 0;
	if (!n)
		return KVT_OK;
	kvt_btable_match *mt = calloc(n, sizeof(*mt));
	if (!mt)
		return KVT_ENOMEM;
	int rc = kvt_btable_lookup_chain(tm_bt(tm), hashes, tokens, n, 0, mt, &nm);
	while (rc == KVT_OK && usable < nm && origin_tier(&mt[usable]) >= 0)
		blocks_in[origin_tier(&mt[usable++])]++;
	free(mt);
	*n_usable = usable;
	return rc;
}
