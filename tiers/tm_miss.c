/*
 * tiers/tm_miss.c — why a prompt missed the cache (manager.h,
 * kvt_tm_miss_explain; tm_int.h: the manager's files).
 *
 * The manager remembers, for each block that left its last tier, a
 * tombstone: which tier it left, when, why (evicted under which pressure,
 * expired after its retention, dropped before it was ever durable, its
 * record failed verification). The map is direct-mapped on the block hash
 * (TM_TOMB_CAP entries, about 0.7 MiB): a newer tombstone may take an older
 * one's place, and none survives a restart — such a block then reads as
 * "new". A miss at block k is explained, in order, by: the block present in
 * a tier but not served (the last partial block's neighbour, or no room to
 * bring it up), its tombstone, its entry kept as metadata (a parent of live
 * children), a child of block k-1 (or of the chain root) whose tokens differ
 * from the prompt's (a stored history that diverged: the first differing
 * token is named), a prefix longer than every tier together holds, and
 * otherwise "new". Block hashes are salted per tenant, so every lookup here
 * sees only the asking tenant's blocks: a miss explanation never reveals
 * another tenant's data.
 */
#include "tm_int.h"

#define TM_TOMB_CAP 16384u

typedef struct tm_tomb_entry {
	uint8_t hash[KVT_HASH_BYTES]; /* the block */
	uint64_t when_us;             /* when it left, unix microseconds (0: the entry is empty) */
	int8_t tier;                  /* the tier it left last */
	uint8_t reason;               /* enum kvt_tm_miss_reason */
	uint8_t pressure;             /* enum kvt_tm_pressure */
} tm_tomb_entry;

struct tm_tomb {
	pthread_mutex_t mu;    /* guards v and n_used */
	tm_tomb_entry *v;      /* [TM_TOMB_CAP], indexed by the hash's first 8 bytes */
	uint64_t n_used;       /* entries in use */
};

static const char *const miss_names[KVT_TM_MISS_COUNT] = {
	"", "new", "diverged", "evicted", "expired", "model_changed", "failed_verification", "chunk_boundary",
	"capacity",
};

const char *kvt_tm_miss_reason_name(int reason)
{
	return reason >= 0 && reason < KVT_TM_MISS_COUNT ? miss_names[reason] : "unknown";
}

const char *kvt_tm_pressure_name(int pressure)
{
	return pressure == KVT_TM_PRESSURE_WATERMARK ? "watermark" : pressure == KVT_TM_PRESSURE_ROOM ? "room" : "unknown";
}

int tm_tomb_create(kvt_tm *tm)
{
	tm_tomb *tb = calloc(1, sizeof(*tb));
	if (!tb || !(tb->v = calloc(TM_TOMB_CAP, sizeof(*tb->v)))) {
		free(tb);
		return KVT_ENOMEM;
	}
	pthread_mutex_init(&tb->mu, NULL);
	tm->tomb = tb;
	return KVT_OK;
}

void tm_tomb_destroy(kvt_tm *tm)
{
	if (!tm->tomb)
		return;
	pthread_mutex_destroy(&tm->tomb->mu);
	free(tm->tomb->v);
	free(tm->tomb);
	tm->tomb = NULL;
}

static tm_tomb_entry *tomb_slot(tm_tomb *tb, const uint8_t h[KVT_HASH_BYTES])
{
	uint64_t k;
	memcpy(&k, h, sizeof(k));
	return &tb->v[k % TM_TOMB_CAP];
}

void tm_tomb_put(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES], int tier, int reason, int pressure)
{
	tm_tomb *tb = tm->tomb;
	if (!tb)
		return;
	pthread_mutex_lock(&tb->mu);
	tm_tomb_entry *e = tomb_slot(tb, h);
	tb->n_used += e->when_us == 0;
	memcpy(e->hash, h, KVT_HASH_BYTES);
	e->when_us = kvt_wall_us();
	e->tier = (int8_t)tier;
	e->reason = (uint8_t)reason;
	e->pressure = (uint8_t)pressure;
	pthread_mutex_unlock(&tb->mu);
}

static bool tomb_get(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES], tm_tomb_entry *out)
{
	tm_tomb *tb = tm->tomb;
	pthread_mutex_lock(&tb->mu);
	tm_tomb_entry *e = tomb_slot(tb, h);
	bool found = e->when_us && !memcmp(e->hash, h, KVT_HASH_BYTES);
	if (found)
		*out = *e;
	pthread_mutex_unlock(&tb->mu);
	return found;
}

void tm_tomb_expired(void *tm, const uint8_t *h)
{
	tm_tomb_put(tm, h, -1, KVT_TM_MISS_EXPIRED, KVT_TM_PRESSURE_NONE); /* a mark until it is evicted */
}

void tm_tomb_dropped(kvt_tm *tm, const kvt_btable_entry *e, int tier, int pressure)
{
	if (pressure == KVT_TM_PRESSURE_NONE)
		return; /* shutdown: not an eviction */
	tm_tomb_entry prev;
	bool ended = (tomb_get(tm, e->hash, &prev) && prev.reason == KVT_TM_MISS_EXPIRED) ||
		     (e->retain_until_us && e->retain_until_us <= tm_retain_now(tm->rt));
	int reason = e->dirty ? KVT_TM_MISS_CAPACITY /* never durable: lost for lack of room */
		   : ended    ? KVT_TM_MISS_EXPIRED
			      : KVT_TM_MISS_EVICTED;
	tm_tomb_put(tm, e->hash, tier, reason, pressure);
}

uint64_t tm_tomb_count(kvt_tm *tm)
{
	pthread_mutex_lock(&tm->tomb->mu);
	uint64_t n = tm->tomb->n_used;
	pthread_mutex_unlock(&tm->tomb->mu);
	return n;
}

/* Blocks every tier together holds at most (T0 and T1 slots, T2 records of our size). */
static uint64_t capacity_blocks(kvt_tm *tm)
{
	uint64_t n = (uint64_t)kvt_t0_n_slots(tm->cfg.t0) + kvt_t1_n_slots(tm->t1);
	if (tm->cfg.t2) {
		kvt_t2_stats s;
		kvt_t2_get_stats(tm->cfg.t2, &s);
		n += s.slot_bytes ? s.capacity_bytes / s.slot_bytes : 0;
	}
	return n;
}

/* A stored history under block k's parent that differs from the prompt's block k: DIVERGED. */
static bool explain_diverged(kvt_tm *tm, const uint8_t parent[KVT_HASH_BYTES], const int32_t *block_tokens,
			     uint32_t k, kvt_tm_miss *out)
{
	const uint32_t B = kvt_btable_block_tokens(tm->cfg.bt);
	int32_t stored[KVT_BLOCK_MAX_TOKENS];
	uint32_t n_same = 0;
	if (kvt_btable_nearest_child(tm->cfg.bt, parent, block_tokens, stored, &n_same) != KVT_OK)
		return false;
	if (k == 0 && n_same == 0)
		return false; /* nothing in common with anything stored: new */
	out->reason = KVT_TM_MISS_DIVERGED;
	out->at_token = k * B;
	if (n_same < B) {
		out->at_token += n_same;
		out->cached_token = stored[n_same];
		out->new_token = block_tokens[n_same];
	}
	return true;
}

/* Block k (not served) is in the table: in a tier (not brought up), or kept as metadata only. */
static void explain_present(kvt_tm *tm, const kvt_btable_entry *e, uint32_t k, uint32_t n_tokens,
			    uint32_t n_cached, kvt_tm_miss *out)
{
	const uint32_t B = kvt_btable_block_tokens(tm->cfg.bt);
	bool in_tier = e->slot[KVT_TIER_HBM] >= 0 || e->slot[KVT_TIER_HOST] >= 0 || e->slot[KVT_TIER_NVME] >= 0;
	if (!in_tier)
		out->reason = KVT_TM_MISS_EVICTED; /* its bytes left every tier; the entry stays for its children */
	else if ((k + 1) * B >= n_tokens - (n_tokens % B) && n_tokens - n_cached <= B)
		out->reason = KVT_TM_MISS_CHUNK_BOUNDARY; /* the prompt's end is recomputed for its logits */
	else
		out->reason = KVT_TM_MISS_CAPACITY; /* cached, but there was no room to bring it up */
}

/* The reason for block k, the first not served, of a prompt of n_full full blocks. */
static void explain_block(kvt_tm *tm, const uint8_t root[KVT_HASH_BYTES], const uint8_t (*hashes)[KVT_HASH_BYTES],
			  const int32_t *tokens, uint32_t k, uint32_t n_tokens, uint32_t n_cached, kvt_tm_miss *out)
{
	const uint32_t B = kvt_btable_block_tokens(tm->cfg.bt);
	kvt_btable_entry e;
	tm_tomb_entry tb;
	bool known = kvt_btable_get(tm->cfg.bt, hashes[k], &e) == KVT_OK;
	bool in_tier = known && (e.slot[KVT_TIER_HBM] >= 0 || e.slot[KVT_TIER_HOST] >= 0 || e.slot[KVT_TIER_NVME] >= 0);
	if (!in_tier && tomb_get(tm, hashes[k], &tb)) {
		out->reason = tb.reason;
		out->tier = tb.tier;
		out->when_us = tb.when_us;
		out->pressure = tb.pressure;
		return;
	}
	if (known) {
		explain_present(tm, &e, k, n_tokens, n_cached, out);
		return;
	}
	if (explain_diverged(tm, k ? hashes[k - 1] : root, tokens + (size_t)k * B, k, out))
		return;
	out->reason = k >= capacity_blocks(tm) ? KVT_TM_MISS_CAPACITY : KVT_TM_MISS_NEW;
}

void kvt_tm_miss_count(kvt_tm *tm, int reason)
{
	if (reason < 0 || reason >= KVT_TM_MISS_COUNT)
		return;
	pthread_mutex_lock(&tm->mu);
	tm->st.n_miss[reason]++;
	pthread_mutex_unlock(&tm->mu);
}

void kvt_tm_miss_explain(kvt_tm *tm, const uint8_t root[KVT_HASH_BYTES], const uint8_t (*hashes)[KVT_HASH_BYTES],
			 const int32_t *tokens, uint32_t n_tokens, uint32_t n_cached, kvt_tm_miss *out)
{
	const uint32_t B = kvt_btable_block_tokens(tm->cfg.bt);
	*out = (kvt_tm_miss){ .reason = KVT_TM_MISS_NONE, .at_token = n_cached, .tier = -1, .cached_token = -1,
			      .new_token = -1 };
	if (n_cached < n_tokens) {
		const uint32_t k = n_cached / B;
		if (k >= n_tokens / B)
			out->reason = KVT_TM_MISS_CHUNK_BOUNDARY; /* only the last partial block: never cached */
		else
			explain_block(tm, root, hashes, tokens, k, n_tokens, n_cached, out);
	}
}
