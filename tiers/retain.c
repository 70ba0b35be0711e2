/*
 * tiers/retain.c — the retention ledger of the tiering manager: which blocks
 * a client asked to keep (cache-control breakpoints with a TTL, a retention
 * class), until when, against whose quota (manager.h, "Retention").
 *
 * Design. The block table holds, per entry, only what eviction must see (the
 * deadline and the floor tier: kvt_btable_coldest_at skips a retained entry
 * like a pinned one). This ledger holds the rest, one record per retained
 * block: tenant, TTL (restarted on every hit), depth in its chain, and the
 * deadline last written to the index. Records live in one array with an
 * open-addressing map (hash -> index) beside it, so a request's retain or
 * refresh is O(blocks of the request), and a quota decision O(records).
 *
 * Invariants (rt->mu guards everything):
 *  - A record exists iff the table entry carries a non-zero deadline set by
 *    this ledger; both are changed together under rt->mu.
 *  - Every change of a durable block's retention is queued to the index
 *    under rt->mu, and kvt_tm_* persistence builds a block's row (with its
 *    retention) under rt->mu too (tm_retain_put_row): so the index never
 *    misses a retention whatever the order of the row and the update.
 *  - Along a chain, a parent's deadline is >= its child's: every retain and
 *    every refresh covers a prefix, and quota releases take the deepest of
 *    the records with the earliest deadline first. A retained leaf thus
 *    keeps its parents (they are not leaves in a tier it is in), and losing
 *    retention never leaves a retained block above an unretained parent.
 *  - Quotas: a tenant's retained bytes (per record: the block's size in its
 *    floor tier) never exceed its quota, total or for that floor tier; a
 *    request that asks for more gets the prefix that fits, after the
 *    tenant's own oldest retentions (never another tenant's) have gone.
 */
#include "tiers_int.h"
#include "fault.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rt_rec {
	uint8_t hash[KVT_HASH_BYTES]; /* the block */
	uint32_t tenant;              /* index into rt->ten */
	uint32_t depth;               /* block index in its chain (parents smaller) */
	uint8_t floor;                /* enum kvt_tier */
	uint64_t until_us;            /* deadline, clock microseconds */
	uint64_t ttl_us;              /* what a hit restarts */
	uint64_t db_until_us;         /* the deadline last queued to the index */
	uint64_t stamp;               /* the retain call that last touched it (protects a request's own records) */
} rt_rec;

struct tm_retain {
	pthread_mutex_t mu;            /* guards everything below */
	kvt_btable *bt;                /* borrowed */
	kvt_db *db;                    /* borrowed; NULL: retention is not durable */
	uint64_t (*clock_us)(void *);  /* the clock (tests advance their own) */
	void *clock_user;              /* its argument */
	uint64_t cost[KVT_TIER_COUNT]; /* bytes a retained block counts, by floor tier */
	rt_rec *rec;                   /* [n_rec] records */
	uint32_t n_rec, cap_rec;       /* entries, capacity */
	int32_t *map;                  /* [n_map] record index + 1, 0 = empty (linear probing) */
	uint32_t n_map;                /* power of two, >= 2 * cap_rec */
	kvt_tm_tenant_stats *ten;      /* [n_ten] tenants seen or configured (stats, quotas) */
	uint32_t n_ten, cap_ten;       /* entries, capacity */
	kvt_tm_quota dflt;             /* quota of a tenant not configured */
	uint64_t stamp;                /* retain calls so far */
	void (*on_expired)(void *, const uint8_t *); /* told of each record whose deadline passed (may be NULL) */
	void *on_expired_user;         /* its argument */
};

static uint64_t now_of(tm_retain *rt) { return rt->clock_us(rt->clock_user); }

static uint32_t map_home(const tm_retain *rt, const uint8_t h[KVT_HASH_BYTES])
{
	uint64_t k;
	memcpy(&k, h, sizeof(k));
	return (uint32_t)(k & (rt->n_map - 1));
}

static int32_t map_find(const tm_retain *rt, const uint8_t h[KVT_HASH_BYTES])
{
	if (!rt->n_map)
		return -1;
	for (uint32_t i = map_home(rt, h);; i = (i + 1) & (rt->n_map - 1)) {
		int32_t v = rt->map[i];
		if (!v)
			return -1;
		if (!memcmp(rt->rec[v - 1].hash, h, KVT_HASH_BYTES))
			return v - 1;
	}
}

static void map_put(tm_retain *rt, uint32_t idx)
{
	uint32_t i = map_home(rt, rt->rec[idx].hash);
	while (rt->map[i])
		i = (i + 1) & (rt->n_map - 1);
	rt->map[i] = (int32_t)idx + 1;
}

/* Remove the map slot holding idx + 1 (backward-shift deletion keeps probe chains whole). */
static void map_del(tm_retain *rt, uint32_t idx)
{
	uint32_t i = map_home(rt, rt->rec[idx].hash), mask = rt->n_map - 1;
	while (rt->map[i] != (int32_t)idx + 1)
		i = (i + 1) & mask;
	for (uint32_t j = (i + 1) & mask; rt->map[j]; j = (j + 1) & mask) {
		uint32_t home = map_home(rt, rt->rec[rt->map[j] - 1].hash);
		/* j's entry may move to i when its home is not in (i, j] cyclically. */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			rt->map[i] = rt->map[j];
			i = j;
		}
	}
	rt->map[i] = 0;
}

static int grow(tm_retain *rt)
{
	uint32_t cap = rt->cap_rec ? rt->cap_rec * 2 : 256;
	rt_rec *r = realloc(rt->rec, (size_t)cap * sizeof(*r));
	if (!r)
		return KVT_ENOMEM;
	rt->rec = r;
	int32_t *m = calloc((size_t)cap * 2, sizeof(*m));
	if (!m)
		return KVT_ENOMEM;
	free(rt->map);
	rt->map = m;
	rt->n_map = cap * 2;
	rt->cap_rec = cap;
	for (uint32_t i = 0; i < rt->n_rec; i++)
		map_put(rt, i);
	return KVT_OK;
}

static int tenant_idx(tm_retain *rt, const char *name, uint32_t *out)
{
	for (uint32_t i = 0; i < rt->n_ten; i++)
		if (!strcmp(rt->ten[i].tenant, name)) {
			*out = i;
			return KVT_OK;
		}
	if (!kvt_name_valid(name)) {
		KVT_LOGE("tm retain: tenant \"%.64s\" is not a valid name", name);
		return KVT_EINVAL;
	}
	if (rt->n_ten == rt->cap_ten) {
		uint32_t cap = rt->cap_ten ? rt->cap_ten * 2 : 8;
		kvt_tm_tenant_stats *t = realloc(rt->ten, (size_t)cap * sizeof(*t));
		if (!t)
			return KVT_ENOMEM;
		rt->ten = t;
		rt->cap_ten = cap;
	}
	kvt_tm_tenant_stats *t = &rt->ten[rt->n_ten];
	memset(t, 0, sizeof(*t));
	snprintf(t->tenant, sizeof(t->tenant), "%s", name);
	t->quota = rt->dflt;
	*out = rt->n_ten++;
	return KVT_OK;
}

static void queue_db(tm_retain *rt, rt_rec *r, uint64_t until_us)
{
	if (!rt->db)
		return;
	r->db_until_us = until_us;
	if (kvt_db_retain_block(rt->db, r->hash, until_us, r->ttl_us, r->floor, rt->ten[r->tenant].tenant, NULL, NULL,
				NULL) != KVT_OK)
		KVT_LOGW("tm retain: the index did not take a retention update (it is lost at a restart)");
	else
		kvt_fault_point("tm.retain.row_queued"); /* queued, not committed: a kill here loses only the update */
}

/* Drop record idx: the table entry loses its deadline; the index's too when durable is set. */
static void drop_rec(tm_retain *rt, uint32_t idx, bool durable)
{
	rt_rec *r = &rt->rec[idx];
	kvt_tm_tenant_stats *t = &rt->ten[r->tenant];
	t->n_blocks[r->floor]--;
	t->bytes[r->floor] -= rt->cost[r->floor];
	(void)kvt_btable_set_retain(rt->bt, r->hash, 0, 0);
	if (durable)
		queue_db(rt, r, 0);
	map_del(rt, idx);
	uint32_t last = rt->n_rec - 1;
	if (idx != last) {
		map_del(rt, last);
		rt->rec[idx] = rt->rec[last];
		map_put(rt, idx);
	}
	rt->n_rec--;
}

static uint64_t total_bytes(const kvt_tm_tenant_stats *t)
{
	uint64_t b = 0;
	for (int f = 0; f < KVT_TIER_COUNT; f++)
		b += t->bytes[f];
	return b;
}

/* Whether tenant t can take `extra` more bytes at floor f. */
static bool fits(const kvt_tm_tenant_stats *t, int f, uint64_t extra)
{
	if (t->quota.bytes && total_bytes(t) + extra > t->quota.bytes)
		return false;
	if (t->quota.tier_bytes[f] && t->bytes[f] + extra > t->quota.tier_bytes[f])
		return false;
	return true;
}

/*
 * The tenant's oldest record not stamped `keep` (earliest deadline; the
 * deepest among equal ones), limited to floor f when f >= 0. -1 when none.
 */
static int32_t oldest_of(const tm_retain *rt, uint32_t tenant, int f, uint64_t keep)
{
	int32_t best = -1;
	for (uint32_t i = 0; i < rt->n_rec; i++) {
		const rt_rec *r = &rt->rec[i];
		if (r->tenant != tenant || r->stamp == keep || (f >= 0 && r->floor != f))
			continue;
		if (best < 0 || r->until_us < rt->rec[best].until_us ||
		    (r->until_us == rt->rec[best].until_us && r->depth > rt->rec[best].depth))
			best = (int32_t)i;
	}
	return best;
}

/* Make room for `extra` bytes at floor f by releasing the tenant's oldest records (not stamped keep). */
static bool make_room(tm_retain *rt, uint32_t tenant, int f, uint64_t extra, uint64_t keep)
{
	kvt_tm_tenant_stats *t = &rt->ten[tenant];
	while (!fits(t, f, extra)) {
		/* Over the tier's own quota only records of that tier help. */
		bool tier_over = t->quota.tier_bytes[f] && t->bytes[f] + extra > t->quota.tier_bytes[f];
		int32_t v = oldest_of(rt, tenant, tier_over ? f : -1, keep);
		if (v < 0)
			return false;
		drop_rec(rt, (uint32_t)v, true);
		t->n_quota_released++;
	}
	return true;
}

static void sweep_locked(tm_retain *rt, uint64_t now)
{
	for (uint32_t i = 0; i < rt->n_rec;) {
		if (rt->rec[i].until_us <= now) {
			rt->ten[rt->rec[i].tenant].n_expired++;
			if (rt->on_expired)
				rt->on_expired(rt->on_expired_user, rt->rec[i].hash);
			drop_rec(rt, i, false); /* a past deadline in the index is inert */
		} else {
			i++;
		}
	}
}

int tm_retain_create(const tm_retain_config *c, tm_retain **out)
{
	tm_retain *rt = calloc(1, sizeof(*rt));
	if (!rt)
		return KVT_ENOMEM;
	pthread_mutex_init(&rt->mu, NULL);
	rt->bt = c->bt;
	rt->db = c->db;
	rt->clock_us = c->clock_us;
	rt->clock_user = c->clock_user;
	memcpy(rt->cost, c->cost, sizeof(rt->cost));
	rt->on_expired = c->on_expired;
	rt->on_expired_user = c->on_expired_user;
	*out = rt;
	return KVT_OK;
}

void tm_retain_destroy(tm_retain *rt)
{
	if (!rt)
		return;
	pthread_mutex_destroy(&rt->mu);
	free(rt->rec);
	free(rt->map);
	free(rt->ten);
	free(rt);
}

uint64_t tm_retain_now(tm_retain *rt) { return now_of(rt); }

int tm_retain_set_quota(tm_retain *rt, const char *tenant, const kvt_tm_quota *q)
{
	int rc = KVT_OK;
	pthread_mutex_lock(&rt->mu);
	if (!tenant || !strcmp(tenant, "*")) {
		rt->dflt = *q;
		for (uint32_t i = 0; i < rt->n_ten; i++)
			if (!rt->ten[i].quota_set)
				rt->ten[i].quota = *q;
	} else {
		uint32_t t;
		if ((rc = tenant_idx(rt, tenant, &t)) == KVT_OK) {
			rt->ten[t].quota = *q;
			rt->ten[t].quota_set = true;
		}
	}
	pthread_mutex_unlock(&rt->mu);
	return rc;
}

int tm_retain_add(tm_retain *rt, const char *tenant, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES],
		  uint64_t ttl_us, int floor, kvt_tm_retain_result *res)
{
	memset(res, 0, sizeof(*res));
	if (floor < 0 || floor >= KVT_TIER_COUNT || !ttl_us) {
		KVT_LOGE("tm retain: floor tier %d / ttl %llu us out of range", floor, (unsigned long long)ttl_us);
		return KVT_EINVAL;
	}
	pthread_mutex_lock(&rt->mu);
	uint64_t now = now_of(rt), until = now + ttl_us, stamp = ++rt->stamp;
	uint32_t t;
	int rc = tenant_idx(rt, tenant, &t);
	if (rc)
		goto out;
	sweep_locked(rt, now);
	kvt_tm_tenant_stats *ts = &rt->ten[t];
	for (uint32_t i = 0; i < n; i++) {
		kvt_btable_entry e;
		if (kvt_btable_get(rt->bt, hashes[i], &e) != KVT_OK)
			break; /* not cached (yet): nothing past a hole can be kept either */
		int32_t v = map_find(rt, hashes[i]);
		if (v >= 0) {
			rt_rec *r = &rt->rec[v];
			r->stamp = stamp;
			if (r->tenant != t)
				continue; /* cannot happen (chains are tenant-salted); never move another's record */
			int nf = floor < r->floor ? floor : r->floor;
			if (nf != r->floor) { /* a stronger class: the block now counts in the faster tier */
				if (!make_room(rt, t, nf, rt->cost[nf], stamp)) {
					res->n_denied = n - i;
					break;
				}
				ts->n_blocks[r->floor]--;
				ts->bytes[r->floor] -= rt->cost[r->floor];
				r->floor = (uint8_t)nf;
				ts->n_blocks[nf]++;
				ts->bytes[nf] += rt->cost[nf];
			}
			if (until > r->until_us)
				r->until_us = until;
			if (ttl_us > r->ttl_us)
				r->ttl_us = ttl_us;
			(void)kvt_btable_set_retain(rt->bt, r->hash, r->until_us, r->floor);
			queue_db(rt, r, r->until_us);
			res->n_kept++;
			continue;
		}
		if (!make_room(rt, t, floor, rt->cost[floor], stamp)) {
			res->n_denied = n - i;
			break;
		}
		if (rt->n_rec == rt->cap_rec && (rc = grow(rt)))
			break;
		rt_rec *r = &rt->rec[rt->n_rec];
		memset(r, 0, sizeof(*r));
		memcpy(r->hash, hashes[i], KVT_HASH_BYTES);
		r->tenant = t;
		r->depth = i;
		r->floor = (uint8_t)floor;
		r->until_us = until;
		r->ttl_us = ttl_us;
		r->stamp = stamp;
		map_put(rt, rt->n_rec++);
		ts->n_blocks[floor]++;
		ts->bytes[floor] += rt->cost[floor];
		(void)kvt_btable_set_retain(rt->bt, r->hash, until, floor);
		queue_db(rt, r, until);
		res->n_new++;
	}
	ts->n_denied_blocks += res->n_denied;
	ts->n_granted_blocks += res->n_new;
out:
	pthread_mutex_unlock(&rt->mu);
	return rc;
}

uint32_t tm_retain_refresh(tm_retain *rt, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES])
{
	uint32_t lead = 0;
	bool run = true;
	pthread_mutex_lock(&rt->mu);
	if (!rt->n_rec) {
		pthread_mutex_unlock(&rt->mu);
		return 0;
	}
	uint64_t now = now_of(rt);
	for (uint32_t i = 0; i < n; i++) {
		int32_t v = map_find(rt, hashes[i]);
		if (v < 0 || rt->rec[v].until_us <= now) {
			run = false;
			continue;
		}
		rt_rec *r = &rt->rec[v];
		lead += run;
		r->until_us = now + r->ttl_us;
		(void)kvt_btable_set_retain(rt->bt, r->hash, r->until_us, r->floor);
		/* The index needs the new deadline only once it has moved by a good part of the TTL. */
		if (r->until_us - r->db_until_us > r->ttl_us / 16)
			queue_db(rt, r, r->until_us);
		rt->ten[r->tenant].n_hits++;
	}
	pthread_mutex_unlock(&rt->mu);
	return lead;
}

uint32_t tm_retain_release(tm_retain *rt, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES])
{
	uint32_t k = 0;
	pthread_mutex_lock(&rt->mu);
	for (uint32_t i = n; i-- > 0;) { /* leaves first */
		int32_t v = map_find(rt, hashes[i]);
		if (v < 0)
			continue;
		rt->ten[rt->rec[v].tenant].n_released++;
		drop_rec(rt, (uint32_t)v, true);
		k++;
	}
	pthread_mutex_unlock(&rt->mu);
	return k;
}

void tm_retain_forget(tm_retain *rt, const uint8_t hash[KVT_HASH_BYTES])
{
	pthread_mutex_lock(&rt->mu);
	int32_t v = map_find(rt, hash);
	if (v >= 0) {
		rt->ten[rt->rec[v].tenant].n_lost++;
		drop_rec(rt, (uint32_t)v, false); /* its row is gone or going */
	}
	pthread_mutex_unlock(&rt->mu);
}

void tm_retain_sweep(tm_retain *rt)
{
	pthread_mutex_lock(&rt->mu);
	sweep_locked(rt, now_of(rt));
	pthread_mutex_unlock(&rt->mu);
}

int tm_retain_recover(tm_retain *rt, const kvt_db_block_row *row, uint32_t depth)
{
	int rc = KVT_OK;
	pthread_mutex_lock(&rt->mu);
	uint64_t now = now_of(rt);
	uint32_t t;
	if (row->retain_until_us <= now || !row->retain_tenant[0] || map_find(rt, row->hash) >= 0 ||
	    (rc = tenant_idx(rt, row->retain_tenant, &t)))
		goto out;
	if (rt->n_rec == rt->cap_rec && (rc = grow(rt)))
		goto out;
	rt_rec *r = &rt->rec[rt->n_rec];
	memset(r, 0, sizeof(*r));
	memcpy(r->hash, row->hash, KVT_HASH_BYTES);
	r->tenant = t;
	r->depth = depth;
	r->floor = row->retain_floor;
	r->until_us = r->db_until_us = row->retain_until_us;
	r->ttl_us = row->retain_ttl_us ? row->retain_ttl_us : row->retain_until_us - now;
	map_put(rt, rt->n_rec++);
	rt->ten[t].n_blocks[r->floor]++;
	rt->ten[t].bytes[r->floor] += rt->cost[r->floor];
	rc = kvt_btable_set_retain(rt->bt, r->hash, r->until_us, r->floor);
out:
	pthread_mutex_unlock(&rt->mu);
	return rc;
}

void tm_retain_enforce(tm_retain *rt)
{
	pthread_mutex_lock(&rt->mu);
	for (uint32_t t = 0; t < rt->n_ten; t++)
		for (int f = 0; f < KVT_TIER_COUNT; f++)
			(void)make_room(rt, t, f, 0, 0);
	pthread_mutex_unlock(&rt->mu);
}

int tm_retain_put_row(tm_retain *rt, kvt_db *db, kvt_db_block_row *row, uint64_t *ticket)
{
	pthread_mutex_lock(&rt->mu);
	int32_t v = map_find(rt, row->hash);
	if (v >= 0) {
		rt_rec *r = &rt->rec[v];
		row->retain_until_us = r->db_until_us = r->until_us;
		row->retain_ttl_us = r->ttl_us;
		row->retain_floor = r->floor;
		snprintf(row->retain_tenant, sizeof(row->retain_tenant), "%s", rt->ten[r->tenant].tenant);
	}
	int rc = kvt_db_put_block(db, row, NULL, NULL, ticket);
	pthread_mutex_unlock(&rt->mu);
	return rc;
}

bool tm_retain_get(tm_retain *rt, const uint8_t hash[KVT_HASH_BYTES], kvt_tm_retention *out)
{
	pthread_mutex_lock(&rt->mu);
	int32_t v = map_find(rt, hash);
	uint64_t now = now_of(rt);
	bool on = v >= 0 && rt->rec[v].until_us > now;
	if (on) {
		const rt_rec *r = &rt->rec[v];
		snprintf(out->tenant, sizeof(out->tenant), "%s", rt->ten[r->tenant].tenant);
		out->until_us = r->until_us;
		out->ttl_us = r->ttl_us;
		out->floor = r->floor;
	}
	pthread_mutex_unlock(&rt->mu);
	return on;
}

void tm_retain_stats(tm_retain *rt, kvt_tm_retain_stats *st, kvt_tm_tenant_stats *ten, uint32_t cap, uint32_t *n_ten)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&rt->mu);
	sweep_locked(rt, now_of(rt));
	for (uint32_t i = 0; i < rt->n_rec; i++) {
		kvt_btable_entry e;
		const rt_rec *r = &rt->rec[i];
		st->n_blocks++;
		if (kvt_btable_get(rt->bt, r->hash, &e) != KVT_OK)
			continue;
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			if (e.slot[t] >= 0) {
				st->n_in_tier[t]++;
				st->bytes_in_tier[t] += rt->cost[t];
			}
	}
	for (uint32_t t = 0; t < rt->n_ten; t++) {
		st->bytes += total_bytes(&rt->ten[t]);
		for (int f = 0; f < KVT_TIER_COUNT; f++)
			st->n_by_floor[f] += rt->ten[t].n_blocks[f];
		if (ten && t < cap)
			ten[t] = rt->ten[t];
	}
	if (n_ten)
		*n_ten = rt->n_ten;
	pthread_mutex_unlock(&rt->mu);
}
