/*
 * index/btable.c — the in-memory block table: the hot path of the index.
 *
 * A chained hash map (power-of-two buckets, keyed by the first 8 bytes of the
 * SHA-256 block hash, which are uniform) of heap entries; each entry holds
 * its token ids inline. One mutex guards everything.
 *
 * Parent links do not depend on insertion order: an entry whose parent is
 * not in the table waits in a second hash map keyed by its parent hash (the
 * "orphans": chain starts, whose parent is a root hash, and children that
 * arrived before their parent); inserting an entry adopts every orphan
 * waiting for it.
 *
 * Invariants (kvt_btable_check walks them all):
 *  - e->parent != NULL iff an entry with hash e->parent_hash is in the table
 *    (an entry naming itself as parent is never linked); otherwise e is in
 *    the orphan map, under its parent hash. A parent with children cannot be
 *    removed, so the pointer stays valid. p->n_children counts entries
 *    pointing at p and p->n_children_in[t] those of them present in tier t.
 *  - Per tier t, an entry present in t (slot[t] >= 0) is on exactly one of
 *    leaf[t][kind] (n_children_in[t] == 0) or inner[t][kind] (otherwise),
 *    kind being the entry's own (enum kvt_block_kind); an absent entry is on
 *    none. Each list is ordered by last_use, strictly increasing from the
 *    cold end to the hot end. Ticks are unique: every touch and insert takes
 *    a new one.
 *  - Counters (n_entries, n_in_tier, n_in_tier_kind, n_pinned, n_dirty)
 *    match the entries; n_in_tier[t] is the sum of n_in_tier_kind[t][k].
 *
 * Kinds: the lists are split by kind so that a query for one kind's coldest
 * leaves (kvt_btable_coldest_kind) costs what an unrestricted one does; the
 * unrestricted query merges the kinds' leaf lists by tick, so it returns
 * exactly the order one list would.
 *
 * Cost: touch moves an entry to the hot end, O(1). An entry joining a list
 * (entering a tier, or a parent whose last child in the tier left) is placed
 * by tick, walking from both ends at once: O(distance to the nearer end),
 * which is O(1) in the common cases (a touched entry is the hottest; a parent
 * exposed by evicting its coldest child is near the cold end).
 */
#include "index_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { LIST_NONE = 0, LIST_LEAF = 1, LIST_INNER = 2 };

typedef struct bt_entry bt_entry;
struct bt_entry {
	bt_entry *next_hash;                    /* bucket chain */
	bt_entry *next_orphan;                  /* orphan-map chain (parent == NULL only) */
	bt_entry **pprev_orphan;                /* the pointer that points at this entry in that chain */
	bt_entry *parent;                       /* parent entry, or NULL (root child / orphan) */
	bt_entry *first_child;                  /* head of this entry's children list */
	bt_entry *next_sib;                     /* next child of the same parent (parent != NULL only) */
	bt_entry **pprev_sib;                   /* the pointer that points at this entry in that list */
	bt_entry *lru_prev[KVT_TIER_COUNT];     /* toward the cold end of this tier's list */
	bt_entry *lru_next[KVT_TIER_COUNT];     /* toward the hot end */
	uint8_t on_list[KVT_TIER_COUNT];        /* LIST_NONE / LIST_LEAF / LIST_INNER per tier */
	uint8_t kind;                           /* enum kvt_block_kind: which lists of each tier it is on */
	uint8_t hash[KVT_HASH_BYTES];           /* key */
	uint8_t parent_hash[KVT_HASH_BYTES];    /* parent's hash or the chain root */
	int32_t slot[KVT_TIER_COUNT];           /* -1 absent; NVMe: 0 when present */
	kvt_nvme_loc nvme;                      /* valid when slot[KVT_TIER_NVME] >= 0 */
	uint32_t pins;                          /* holders */
	uint64_t last_use;                      /* tick */
	uint64_t hits;                          /* matched lookups + touches */
	bool dirty;                             /* not durable on NVMe */
	bool t0_lossy;                          /* the T0 copy came from an 8-bit record */
	uint8_t retain_floor;                   /* retention: not evicted from this tier or any below it */
	uint64_t retain_until_us;               /* retention deadline, unix microseconds (0: not retained) */
	uint32_t n_children;                    /* entries whose parent is this */
	uint32_t n_children_in[KVT_TIER_COUNT]; /* children present per tier */
	uint32_t chk_children;                  /* scratch for kvt_btable_check */
	uint32_t chk_in[KVT_TIER_COUNT];        /* scratch for kvt_btable_check */
	int32_t tokens[];                       /* [block_tokens] */
};

typedef struct bt_list {
	bt_entry *cold; /* smallest tick */
	bt_entry *hot;  /* largest tick */
	uint64_t n;     /* entries on the list */
} bt_list;

struct kvt_btable {
	pthread_mutex_t mu;              /* guards everything below */
	uint32_t block_tokens;           /* tokens per block */
	bt_entry **buckets;              /* [n_buckets] chains, by hash */
	bt_entry **orphans;              /* [n_buckets] chains of parentless entries, by parent hash */
	uint64_t n_buckets;              /* power of two */
	uint64_t tick;                   /* last tick handed out */
	bt_list leaf[KVT_TIER_COUNT][KVT_BLOCK_KIND_COUNT];  /* present, no child present in the tier; by kind */
	bt_list inner[KVT_TIER_COUNT][KVT_BLOCK_KIND_COUNT]; /* present, some child present in the tier; by kind */
	kvt_btable_stats st;             /* counters (n_entries, n_in_tier, n_in_tier_kind, ...) */
};

static uint64_t key_of(const uint8_t h[KVT_HASH_BYTES])
{
	uint64_t k;
	memcpy(&k, h, sizeof(k));
	return k;
}

static bt_entry *find(const kvt_btable *bt, const uint8_t h[KVT_HASH_BYTES])
{
	bt_entry *e = bt->buckets[key_of(h) & (bt->n_buckets - 1)];
	while (e && memcmp(e->hash, h, KVT_HASH_BYTES) != 0)
		e = e->next_hash;
	return e;
}

static bt_list *list_of(kvt_btable *bt, int tier, int which, int kind)
{
	return which == LIST_LEAF ? &bt->leaf[tier][kind] : &bt->inner[tier][kind];
}

static void list_unlink(kvt_btable *bt, bt_entry *e, int t)
{
	bt_list *l;
	if (e->on_list[t] == LIST_NONE)
		return;
	l = list_of(bt, t, e->on_list[t], e->kind);
	if (e->lru_prev[t])
		e->lru_prev[t]->lru_next[t] = e->lru_next[t];
	else
		l->cold = e->lru_next[t];
	if (e->lru_next[t])
		e->lru_next[t]->lru_prev[t] = e->lru_prev[t];
	else
		l->hot = e->lru_prev[t];
	e->lru_prev[t] = e->lru_next[t] = NULL;
	e->on_list[t] = LIST_NONE;
	l->n--;
}

/* Insert e between a (colder, may be NULL) and b (hotter, may be NULL). */
static void list_link_between(bt_list *l, bt_entry *e, int t, bt_entry *a, bt_entry *b)
{
	e->lru_prev[t] = a;
	e->lru_next[t] = b;
	if (a)
		a->lru_next[t] = e;
	else
		l->cold = e;
	if (b)
		b->lru_prev[t] = e;
	else
		l->hot = e;
	l->n++;
}

/* Place e on list `which` of tier t by its tick, walking from both ends. */
static void list_insert_ordered(kvt_btable *bt, bt_entry *e, int t, int which)
{
	bt_list *l = list_of(bt, t, which, e->kind);
	bt_entry *h = l->hot, *c = l->cold;

	for (;;) {
		if (!h || h->last_use < e->last_use) { /* e goes just hotter than h */
			list_link_between(l, e, t, h, h ? h->lru_next[t] : l->cold);
			break;
		}
		if (c->last_use > e->last_use) { /* e goes just colder than c */
			list_link_between(l, e, t, c->lru_prev[t], c);
			break;
		}
		h = h->lru_prev[t];
		c = c->lru_next[t];
	}
	e->on_list[t] = (uint8_t)which;
}

/* Which list e belongs on in tier t given its state. */
static int want_list(const bt_entry *e, int t)
{
	if (e->slot[t] < 0)
		return LIST_NONE;
	return e->n_children_in[t] ? LIST_INNER : LIST_LEAF;
}

/* Re-file e in tier t after its presence or child count changed. */
static void refile(kvt_btable *bt, bt_entry *e, int t)
{
	int w = want_list(e, t);
	if (w == e->on_list[t])
		return;
	list_unlink(bt, e, t);
	if (w != LIST_NONE)
		list_insert_ordered(bt, e, t, w);
}

/* New tick for e; move it to the hot end of every list it is on. */
static void touch_locked(kvt_btable *bt, bt_entry *e)
{
	e->last_use = ++bt->tick;
	e->hits++;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		int w = e->on_list[t];
		if (w == LIST_NONE)
			continue;
		bt_list *l = list_of(bt, t, w, e->kind);
		if (l->hot == e)
			continue;
		list_unlink(bt, e, t);
		list_link_between(l, e, t, l->hot, NULL);
		e->on_list[t] = (uint8_t)w;
	}
}

static int grow(kvt_btable *bt)
{
	uint64_t nb = bt->n_buckets * 2;
	bt_entry **b = calloc(nb, sizeof(*b)), **o = calloc(nb, sizeof(*o));
	if (!b || !o) {
		free(b);
		free(o);
		return KVT_ENOMEM;
	}
	for (uint64_t i = 0; i < bt->n_buckets; i++) {
		bt_entry *e = bt->buckets[i];
		while (e) {
			bt_entry *next = e->next_hash;
			uint64_t j = key_of(e->hash) & (nb - 1);
			e->next_hash = b[j];
			b[j] = e;
			e = next;
		}
		e = bt->orphans[i];
		while (e) {
			bt_entry *next = e->next_orphan;
			uint64_t j = key_of(e->parent_hash) & (nb - 1);
			e->next_orphan = o[j];
			if (o[j])
				o[j]->pprev_orphan = &e->next_orphan;
			e->pprev_orphan = &o[j];
			o[j] = e;
			e = next;
		}
	}
	free(bt->buckets);
	free(bt->orphans);
	bt->buckets = b;
	bt->orphans = o;
	bt->n_buckets = nb;
	return KVT_OK;
}

/*
 * The orphan map is a doubly linked (pprev) chain per bucket, so an entry
 * leaves it in O(1): every chain start of one root sits in the same bucket.
 */
static void orphan_add(kvt_btable *bt, bt_entry *e)
{
	bt_entry **head = &bt->orphans[key_of(e->parent_hash) & (bt->n_buckets - 1)];
	e->next_orphan = *head;
	if (*head)
		(*head)->pprev_orphan = &e->next_orphan;
	e->pprev_orphan = head;
	*head = e;
}

static void orphan_remove(bt_entry *e)
{
	KVT_ASSERT(e->pprev_orphan && *e->pprev_orphan == e);
	*e->pprev_orphan = e->next_orphan;
	if (e->next_orphan)
		e->next_orphan->pprev_orphan = e->pprev_orphan;
	e->next_orphan = NULL;
	e->pprev_orphan = NULL;
}

/* Link e into its parent's children list (e->parent set). */
static void child_link(bt_entry *e)
{
	bt_entry *p = e->parent;
	e->next_sib = p->first_child;
	if (p->first_child)
		p->first_child->pprev_sib = &e->next_sib;
	p->first_child = e;
	e->pprev_sib = &p->first_child;
	p->n_children++;
}

static void child_unlink(bt_entry *e)
{
	KVT_ASSERT(e->parent->n_children > 0 && e->pprev_sib);
	*e->pprev_sib = e->next_sib;
	if (e->next_sib)
		e->next_sib->pprev_sib = e->pprev_sib;
	e->next_sib = NULL;
	e->pprev_sib = NULL;
	e->parent->n_children--;
}

/* p was just inserted: link every orphan waiting for it as its child. */
static void adopt_orphans(kvt_btable *bt, bt_entry *p)
{
	bt_entry *o = bt->orphans[key_of(p->hash) & (bt->n_buckets - 1)];
	while (o) {
		bt_entry *next = o->next_orphan;
		if (o == p || memcmp(o->parent_hash, p->hash, KVT_HASH_BYTES) != 0) {
			o = next;
			continue;
		}
		orphan_remove(o);
		o->parent = p;
		child_link(o);
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			p->n_children_in[t] += o->slot[t] >= 0;
		o = next;
	}
	/* p is in no tier yet, so its lists need no change */
}

int kvt_btable_create(uint32_t block_tokens, uint32_t expect_entries, kvt_btable **out)
{
	kvt_btable *bt;
	uint64_t nb = 1024;

	if (block_tokens < 1 || block_tokens > KVT_BLOCK_MAX_TOKENS) {
		KVT_LOGE("btable: block_tokens %u out of range 1..%u", block_tokens, KVT_BLOCK_MAX_TOKENS);
		return KVT_EINVAL;
	}
	while (nb < expect_entries)
		nb *= 2;
	bt = calloc(1, sizeof(*bt));
	if (!bt)
		return KVT_ENOMEM;
	bt->buckets = calloc(nb, sizeof(*bt->buckets));
	bt->orphans = calloc(nb, sizeof(*bt->orphans));
	if (!bt->buckets || !bt->orphans) {
		free(bt->buckets);
		free(bt->orphans);
		free(bt);
		return KVT_ENOMEM;
	}
	bt->n_buckets = nb;
	bt->block_tokens = block_tokens;
	pthread_mutex_init(&bt->mu, NULL);
	*out = bt;
	return KVT_OK;
}

void kvt_btable_destroy(kvt_btable *bt)
{
	if (!bt)
		return;
	for (uint64_t i = 0; i < bt->n_buckets; i++) {
		bt_entry *e = bt->buckets[i];
		while (e) {
			bt_entry *next = e->next_hash;
			free(e);
			e = next;
		}
	}
	free(bt->buckets);
	free(bt->orphans);
	pthread_mutex_destroy(&bt->mu);
	free(bt);
}

uint32_t kvt_btable_block_tokens(const kvt_btable *bt)
{
	return bt->block_tokens; /* immutable after create */
}

static void log_collision(const char *where, const uint8_t h[KVT_HASH_BYTES])
{
	char hex[2 * KVT_HASH_BYTES + 1];
	kvt_hash_hex(h, hex);
	KVT_LOGE("btable: %s: block %s: same hash, different token ids (collision); not served", where, hex);
}

int kvt_btable_insert(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES],
		      const uint8_t parent[KVT_HASH_BYTES], const int32_t *tokens, bool *created)
{
	size_t tok_bytes = (size_t)bt->block_tokens * sizeof(int32_t);
	bt_entry *e;
	int rc = KVT_OK;

	pthread_mutex_lock(&bt->mu);
	e = find(bt, hash);
	if (e) {
		if (memcmp(e->tokens, tokens, tok_bytes) != 0) {
			bt->st.n_collisions++;
			log_collision("insert", hash);
			rc = KVT_ECORRUPT;
		} else if (created) {
			*created = false;
		}
		pthread_mutex_unlock(&bt->mu);
		return rc;
	}
	if (bt->st.n_entries >= bt->n_buckets && grow(bt) != KVT_OK) {
		/* A full table keeps working with longer chains; only a failed entry allocation fails. */
		KVT_LOGW("btable: could not grow the hash table past %llu buckets", (unsigned long long)bt->n_buckets);
	}
	e = calloc(1, sizeof(*e) + tok_bytes);
	if (!e) {
		pthread_mutex_unlock(&bt->mu);
		return KVT_ENOMEM;
	}
	memcpy(e->hash, hash, KVT_HASH_BYTES);
	memcpy(e->parent_hash, parent, KVT_HASH_BYTES);
	memcpy(e->tokens, tokens, tok_bytes);
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		e->slot[t] = -1;
	e->dirty = true;
	e->last_use = ++bt->tick;
	e->parent = find(bt, parent);
	if (e->parent)
		child_link(e);
	else
		orphan_add(bt, e);
	uint64_t b = key_of(hash) & (bt->n_buckets - 1);
	e->next_hash = bt->buckets[b];
	bt->buckets[b] = e;
	adopt_orphans(bt, e);
	bt->st.n_entries++;
	bt->st.n_dirty++;
	if (created)
		*created = true;
	pthread_mutex_unlock(&bt->mu);
	return KVT_OK;
}

static void snapshot(const kvt_btable *bt, const bt_entry *e, kvt_btable_entry *out)
{
	memcpy(out->hash, e->hash, KVT_HASH_BYTES);
	memcpy(out->parent, e->parent_hash, KVT_HASH_BYTES);
	out->has_parent = e->parent != NULL;
	out->n_tokens = bt->block_tokens;
	memcpy(out->tokens, e->tokens, (size_t)bt->block_tokens * sizeof(int32_t));
	memcpy(out->slot, e->slot, sizeof(out->slot));
	out->nvme = e->nvme;
	out->pins = e->pins;
	out->last_use = e->last_use;
	out->hits = e->hits;
	out->dirty = e->dirty;
	out->t0_lossy = e->t0_lossy;
	out->retain_until_us = e->retain_until_us;
	out->retain_floor = e->retain_floor;
	out->kind = e->kind;
	out->n_children = e->n_children;
	memcpy(out->n_children_in, e->n_children_in, sizeof(out->n_children_in));
}

int kvt_btable_get(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], kvt_btable_entry *out)
{
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e)
		snapshot(bt, e, out);
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

static void set_dirty_locked(kvt_btable *bt, bt_entry *e, bool dirty)
{
	if (e->dirty == dirty)
		return;
	e->dirty = dirty;
	if (dirty)
		bt->st.n_dirty++;
	else
		bt->st.n_dirty--;
}

/* Make e present in tier t with slot (>= 0); updates lists and the parent's count. */
static void set_present(kvt_btable *bt, bt_entry *e, int t, int32_t slot)
{
	bool was = e->slot[t] >= 0;
	e->slot[t] = slot;
	if (was)
		return;
	bt->st.n_in_tier[t]++;
	bt->st.n_in_tier_kind[t][e->kind]++;
	refile(bt, e, t);
	if (e->parent) {
		e->parent->n_children_in[t]++;
		refile(bt, e->parent, t);
	}
}

static void set_absent(kvt_btable *bt, bt_entry *e, int t)
{
	if (e->slot[t] < 0)
		return;
	e->slot[t] = -1;
	bt->st.n_in_tier[t]--;
	bt->st.n_in_tier_kind[t][e->kind]--;
	refile(bt, e, t);
	if (e->parent) {
		KVT_ASSERT(e->parent->n_children_in[t] > 0);
		e->parent->n_children_in[t]--;
		refile(bt, e->parent, t);
	}
}

int kvt_btable_set_slot(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], int tier, int32_t slot)
{
	if ((tier != KVT_TIER_HBM && tier != KVT_TIER_HOST) || slot < 0) {
		KVT_LOGE("btable: set_slot: tier %d slot %d (need tier HBM or HOST and slot >= 0)", tier, (int)slot);
		return KVT_EINVAL;
	}
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e) {
		set_present(bt, e, tier, slot);
		if (tier == KVT_TIER_HBM)
			e->t0_lossy = false;
	}
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

int kvt_btable_set_t0_unpacked(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], int32_t slot, bool lossy)
{
	if (slot < 0) {
		KVT_LOGE("btable: set_t0_unpacked: slot %d", (int)slot);
		return KVT_EINVAL;
	}
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e) {
		set_present(bt, e, KVT_TIER_HBM, slot);
		e->t0_lossy = lossy;
	}
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

int kvt_btable_set_nvme(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], const kvt_nvme_loc *loc)
{
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e) {
		e->nvme = *loc;
		set_present(bt, e, KVT_TIER_NVME, 0);
		set_dirty_locked(bt, e, false);
	}
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

int kvt_btable_clear_slot(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], int tier,
			  int32_t *old_slot, kvt_nvme_loc *old_loc)
{
	if (tier < 0 || tier >= KVT_TIER_COUNT) {
		KVT_LOGE("btable: clear_slot: no tier %d", tier);
		return KVT_EINVAL;
	}
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e) {
		if (old_slot)
			*old_slot = e->slot[tier];
		if (old_loc && tier == KVT_TIER_NVME)
			*old_loc = e->nvme;
		if (tier == KVT_TIER_NVME && e->slot[tier] >= 0) {
			memset(&e->nvme, 0, sizeof(e->nvme));
			set_dirty_locked(bt, e, true);
		}
		set_absent(bt, e, tier);
	}
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

int kvt_btable_set_dirty(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], bool dirty)
{
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e)
		set_dirty_locked(bt, e, dirty);
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

int kvt_btable_set_kind(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], int kind)
{
	if (kind < 0 || kind >= KVT_BLOCK_KIND_COUNT) {
		KVT_LOGE("btable: set_kind: no block kind %d", kind);
		return KVT_EINVAL;
	}
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e && e->kind != kind) {
		/* Off the old kind's lists, then onto the new kind's by tick: the tiers it is in keep it. */
		for (int t = 0; t < KVT_TIER_COUNT; t++) {
			list_unlink(bt, e, t);
			if (e->slot[t] >= 0) {
				bt->st.n_in_tier_kind[t][e->kind]--;
				bt->st.n_in_tier_kind[t][kind]++;
			}
		}
		e->kind = (uint8_t)kind;
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			refile(bt, e, t);
	}
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

static void pin_locked(kvt_btable *bt, bt_entry *e)
{
	if (e->pins++ == 0)
		bt->st.n_pinned++;
}

static void unpin_locked(kvt_btable *bt, bt_entry *e)
{
	KVT_ASSERT(e->pins > 0); /* an unpin without its pin */
	if (--e->pins == 0)
		bt->st.n_pinned--;
}

int kvt_btable_pin(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES])
{
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e)
		pin_locked(bt, e);
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

int kvt_btable_unpin(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES])
{
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e)
		unpin_locked(bt, e);
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

void kvt_btable_unpin_n(kvt_btable *bt, const uint8_t (*hashes)[KVT_HASH_BYTES], uint32_t n)
{
	pthread_mutex_lock(&bt->mu);
	for (uint32_t i = 0; i < n; i++) {
		bt_entry *e = find(bt, hashes[i]);
		if (e)
			unpin_locked(bt, e);
	}
	pthread_mutex_unlock(&bt->mu);
}

int kvt_btable_touch(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES])
{
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e)
		touch_locked(bt, e);
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

/*
 * The walk both lookups share: block m matches when hash(m) is an entry whose
 * tokens equal the query's and block m-1 matched. hash(m) is at
 * hashes + m * stride (a match array's .hash, or a plain hash array); slots
 * go to out[m] (out[m].hash is left alone).
 */
static uint32_t walk_chain(kvt_btable *bt, const uint8_t *hashes, size_t stride, const int32_t *tokens, uint32_t n,
			   unsigned flags, kvt_btable_match *out)
{
	const size_t tok_bytes = (size_t)bt->block_tokens * sizeof(int32_t);
	uint32_t m = 0;
	pthread_mutex_lock(&bt->mu);
	bt->st.n_lookups++;
	for (; m < n; m++) {
		bt_entry *e = find(bt, hashes + (size_t)m * stride);
		if (!e)
			break;
		if (memcmp(e->tokens, tokens + (size_t)m * bt->block_tokens, tok_bytes) != 0) {
			bt->st.n_collisions++;
			log_collision("lookup", e->hash);
			break;
		}
		memcpy(out[m].slot, e->slot, sizeof(out[m].slot));
		out[m].nvme = e->nvme;
		out[m].t0_lossy = e->t0_lossy;
		if (flags & KVT_BT_PIN)
			pin_locked(bt, e);
		if (flags & KVT_BT_TOUCH)
			touch_locked(bt, e);
	}
	bt->st.n_hit_blocks += m;
	pthread_mutex_unlock(&bt->mu);
	return m;
}

int kvt_btable_lookup(kvt_btable *bt, const uint8_t root[KVT_HASH_BYTES], const int32_t *tokens,
		      uint32_t n_tokens, unsigned flags, kvt_btable_match *out, uint32_t cap,
		      uint32_t *n_hashed, uint32_t *n_matched)
{
	uint32_t bs = bt->block_tokens, n = n_tokens / bs;
	int rc;

	if (n > cap)
		n = cap;
	/* Hash outside the lock: SHA-256 is the expensive part. */
	rc = n ? kvt_hash_chain_strided(root, tokens, n, bs, out[0].hash, sizeof(*out)) : KVT_OK;
	if (rc)
		return rc;
	*n_matched = walk_chain(bt, out[0].hash, sizeof(*out), tokens, n, flags, out);
	*n_hashed = n;
	return KVT_OK;
}

int kvt_btable_lookup_chain(kvt_btable *bt, const uint8_t (*hashes)[KVT_HASH_BYTES], const int32_t *tokens,
			    uint32_t n, unsigned flags, kvt_btable_match *out, uint32_t *n_matched)
{
	*n_matched = n ? walk_chain(bt, hashes[0], KVT_HASH_BYTES, tokens, n, flags, out) : 0;
	for (uint32_t i = 0; i < *n_matched; i++)
		memcpy(out[i].hash, hashes[i], KVT_HASH_BYTES);
	return KVT_OK;
}

/* Whether e is retained against eviction from tier at now_us. */
static bool retained_in(const bt_entry *e, int tier, uint64_t now_us)
{
	return e->retain_until_us > now_us && tier >= e->retain_floor;
}

int kvt_btable_coldest_kind(kvt_btable *bt, int tier, int kind, uint64_t now_us, uint32_t cap,
			    uint8_t (*out)[KVT_HASH_BYTES], uint32_t *n_out)
{
	uint32_t n = 0;
	if (tier < 0 || tier >= KVT_TIER_COUNT || kind < KVT_BLOCK_ANY || kind >= KVT_BLOCK_KIND_COUNT) {
		KVT_LOGE("btable: coldest: no tier %d or no block kind %d", tier, kind);
		return KVT_EINVAL;
	}
	pthread_mutex_lock(&bt->mu);
	/* One cursor per kind asked for; each step takes the colder head (ticks are unique). */
	bt_entry *cur[KVT_BLOCK_KIND_COUNT];
	for (int k = 0; k < KVT_BLOCK_KIND_COUNT; k++)
		cur[k] = kind == KVT_BLOCK_ANY || kind == k ? bt->leaf[tier][k].cold : NULL;
	while (n < cap) {
		int k = -1;
		for (int j = 0; j < KVT_BLOCK_KIND_COUNT; j++)
			if (cur[j] && (k < 0 || cur[j]->last_use < cur[k]->last_use))
				k = j;
		if (k < 0)
			break;
		bt_entry *e = cur[k];
		cur[k] = e->lru_next[tier];
		if (e->pins || retained_in(e, tier, now_us))
			continue;
		memcpy(out[n++], e->hash, KVT_HASH_BYTES);
	}
	pthread_mutex_unlock(&bt->mu);
	*n_out = n;
	return KVT_OK;
}

int kvt_btable_coldest_at(kvt_btable *bt, int tier, uint64_t now_us, uint32_t cap, uint8_t (*out)[KVT_HASH_BYTES],
			  uint32_t *n_out)
{
	return kvt_btable_coldest_kind(bt, tier, KVT_BLOCK_ANY, now_us, cap, out, n_out);
}

int kvt_btable_coldest(kvt_btable *bt, int tier, uint32_t cap, uint8_t (*out)[KVT_HASH_BYTES], uint32_t *n_out)
{
	return kvt_btable_coldest_at(bt, tier, UINT64_MAX, cap, out, n_out);
}

int kvt_btable_set_retain(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES], uint64_t until_us, int floor_tier)
{
	if (floor_tier < 0 || floor_tier >= KVT_TIER_COUNT) {
		KVT_LOGE("btable: set_retain: no tier %d", floor_tier);
		return KVT_EINVAL;
	}
	pthread_mutex_lock(&bt->mu);
	bt_entry *e = find(bt, hash);
	if (e) {
		e->retain_until_us = until_us;
		e->retain_floor = (uint8_t)floor_tier;
	}
	pthread_mutex_unlock(&bt->mu);
	return e ? KVT_OK : KVT_ENOTFOUND;
}

int kvt_btable_remove(kvt_btable *bt, const uint8_t hash[KVT_HASH_BYTES])
{
	int rc = KVT_OK;
	pthread_mutex_lock(&bt->mu);
	uint64_t b = key_of(hash) & (bt->n_buckets - 1);
	bt_entry **pp = &bt->buckets[b];
	while (*pp && memcmp((*pp)->hash, hash, KVT_HASH_BYTES) != 0)
		pp = &(*pp)->next_hash;
	bt_entry *e = *pp;
	if (!e) {
		rc = KVT_ENOTFOUND;
		goto out;
	}
	if (e->pins || e->n_children || e->slot[0] >= 0 || e->slot[1] >= 0 || e->slot[2] >= 0) {
		rc = KVT_EINVAL;
		goto out;
	}
	*pp = e->next_hash;
	if (e->parent)
		child_unlink(e);
	else
		orphan_remove(e);
	if (e->dirty)
		bt->st.n_dirty--;
	bt->st.n_entries--;
	free(e);
out:
	pthread_mutex_unlock(&bt->mu);
	return rc;
}

/* How many leading tokens of a and b[0..n) agree. */
static uint32_t same_run(const int32_t *a, const int32_t *b, uint32_t n)
{
	uint32_t k = 0;
	while (k < n && a[k] == b[k])
		k++;
	return k;
}

int kvt_btable_nearest_child(kvt_btable *bt, const uint8_t parent[KVT_HASH_BYTES], const int32_t *tokens,
			     int32_t *out_tokens, uint32_t *n_same)
{
	const uint32_t n = bt->block_tokens;
	const bt_entry *best = NULL;
	uint32_t best_run = 0;
	pthread_mutex_lock(&bt->mu);
	bt_entry *p = find(bt, parent);
	/* an entry's children are on its list; a chain root's (no entry) wait in the orphan map */
	bt_entry *c = p ? p->first_child : bt->orphans[key_of(parent) & (bt->n_buckets - 1)];
	for (; c; c = p ? c->next_sib : c->next_orphan) {
		if (!p && memcmp(c->parent_hash, parent, KVT_HASH_BYTES) != 0)
			continue; /* another root's orphan in the same bucket */
		uint32_t run = same_run(c->tokens, tokens, n);
		if (!best || run > best_run) {
			best = c;
			best_run = run;
		}
	}
	if (best) {
		memcpy(out_tokens, best->tokens, (size_t)n * sizeof(int32_t));
		*n_same = best_run;
	}
	pthread_mutex_unlock(&bt->mu);
	return best ? KVT_OK : KVT_ENOTFOUND;
}

void kvt_btable_get_stats(kvt_btable *bt, kvt_btable_stats *st)
{
	pthread_mutex_lock(&bt->mu);
	*st = bt->st;
	pthread_mutex_unlock(&bt->mu);
}

#define FAIL_IF(cond, ...)                                                            \
	do {                                                                          \
		if (cond) {                                                           \
			KVT_LOGE(__VA_ARGS__);                                        \
			rc = KVT_ECORRUPT;                                            \
			goto out;                                                     \
		}                                                                     \
	} while (0)

/* e's children list holds exactly its n_children entries, each naming e as its parent. */
static bool children_listed(const bt_entry *e)
{
	uint32_t n = 0;
	for (const bt_entry *c = e->first_child; c && n <= e->n_children; c = c->next_sib, n++)
		if (c->parent != e)
			return false;
	return n == e->n_children;
}

int kvt_btable_check(kvt_btable *bt)
{
	kvt_btable_stats c = { 0 };
	uint64_t n_orphans = 0, n_orphan_links = 0;
	uint64_t on_lists[KVT_TIER_COUNT][3][KVT_BLOCK_KIND_COUNT] = { { { 0 } } };
	char hex[2 * KVT_HASH_BYTES + 1];
	int rc = KVT_OK;

	pthread_mutex_lock(&bt->mu);
	/* pass 1: reset scratch, bucket placement, per-entry list membership */
	for (uint64_t i = 0; i < bt->n_buckets; i++) {
		for (bt_entry *e = bt->buckets[i]; e; e = e->next_hash) {
			kvt_hash_hex(e->hash, hex);
			e->chk_children = 0;
			memset(e->chk_in, 0, sizeof(e->chk_in));
			FAIL_IF((key_of(e->hash) & (bt->n_buckets - 1)) != i, "btable check: %s in bucket %llu, wrong bucket",
				hex, (unsigned long long)i);
			FAIL_IF(find(bt, e->hash) != e, "btable check: %s listed twice", hex);
			FAIL_IF(e->parent && memcmp(e->parent->hash, e->parent_hash, KVT_HASH_BYTES) != 0,
				"btable check: %s: parent pointer does not match its parent hash", hex);
			FAIL_IF(e->parent && find(bt, e->parent_hash) != e->parent,
				"btable check: %s: parent entry is not in the table", hex);
			FAIL_IF(!e->parent && find(bt, e->parent_hash) && find(bt, e->parent_hash) != e,
				"btable check: %s: its parent is in the table but not linked", hex);
			if (!e->parent) {
				bt_entry *o = bt->orphans[key_of(e->parent_hash) & (bt->n_buckets - 1)];
				while (o && o != e)
					o = o->next_orphan;
				FAIL_IF(!o, "btable check: %s: parentless but not in the orphan map", hex);
				n_orphans++;
			}
			FAIL_IF(e->last_use > bt->tick, "btable check: %s: tick from the future", hex);
			FAIL_IF(e->kind >= KVT_BLOCK_KIND_COUNT, "btable check: %s: block kind %u", hex, e->kind);
			c.n_entries++;
			c.n_pinned += e->pins > 0;
			c.n_dirty += e->dirty;
			for (int t = 0; t < KVT_TIER_COUNT; t++) {
				c.n_in_tier[t] += e->slot[t] >= 0;
				c.n_in_tier_kind[t][e->kind] += e->slot[t] >= 0;
				on_lists[t][e->on_list[t]][e->kind]++;
			}
		}
	}
	/* pass 2: child counts */
	for (uint64_t i = 0; i < bt->n_buckets; i++) {
		for (bt_entry *e = bt->buckets[i]; e; e = e->next_hash) {
			if (!e->parent)
				continue;
			e->parent->chk_children++;
			for (int t = 0; t < KVT_TIER_COUNT; t++)
				e->parent->chk_in[t] += e->slot[t] >= 0;
		}
	}
	for (uint64_t i = 0; i < bt->n_buckets; i++) {
		for (bt_entry *e = bt->buckets[i]; e; e = e->next_hash) {
			kvt_hash_hex(e->hash, hex);
			FAIL_IF(e->chk_children != e->n_children, "btable check: %s: n_children %u, counted %u", hex,
				e->n_children, e->chk_children);
			FAIL_IF(!children_listed(e), "btable check: %s: its children list does not hold its %u children",
				hex, e->n_children);
			for (int t = 0; t < KVT_TIER_COUNT; t++) {
				FAIL_IF(e->chk_in[t] != e->n_children_in[t],
					"btable check: %s: tier %d children %u, counted %u", hex, t, e->n_children_in[t],
					e->chk_in[t]);
				FAIL_IF(e->on_list[t] != want_list(e, t), "btable check: %s: tier %d on list %d, want %d",
					hex, t, e->on_list[t], want_list(e, t));
			}
		}
	}
	for (uint64_t i = 0; i < bt->n_buckets; i++) {
		for (bt_entry *o = bt->orphans[i]; o; o = o->next_orphan) {
			kvt_hash_hex(o->hash, hex);
			FAIL_IF(o->parent, "btable check: %s in the orphan map but has a parent", hex);
			FAIL_IF(!o->pprev_orphan || *o->pprev_orphan != o, "btable check: %s: broken orphan back link", hex);
			FAIL_IF((key_of(o->parent_hash) & (bt->n_buckets - 1)) != i,
				"btable check: %s in orphan bucket %llu, wrong bucket", hex, (unsigned long long)i);
			FAIL_IF(++n_orphan_links > c.n_entries, "btable check: the orphan map has a cycle");
		}
	}
	FAIL_IF(n_orphan_links != n_orphans, "btable check: %llu entries in the orphan map, %llu parentless entries",
		(unsigned long long)n_orphan_links, (unsigned long long)n_orphans);
	/* pass 3: the lists themselves */
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		for (int w = LIST_LEAF; w <= LIST_INNER; w++) {
			for (int k = 0; k < KVT_BLOCK_KIND_COUNT; k++) {
				bt_list *l = list_of(bt, t, w, k);
				uint64_t n = 0;
				bt_entry *prev = NULL;
				for (bt_entry *e = l->cold; e; prev = e, e = e->lru_next[t]) {
					kvt_hash_hex(e->hash, hex);
					FAIL_IF(e->on_list[t] != w || e->kind != k,
						"btable check: %s on tier %d list %d of kind %d but tagged list %d kind %u", hex,
						t, w, k, e->on_list[t], e->kind);
					FAIL_IF(e->lru_prev[t] != prev, "btable check: %s: broken back link in tier %d", hex, t);
					FAIL_IF(prev && prev->last_use >= e->last_use,
						"btable check: %s: tier %d list not in tick order", hex, t);
					FAIL_IF(++n > l->n, "btable check: tier %d list %d kind %d longer than its count", t, w,
						k);
				}
				FAIL_IF(l->hot != prev, "btable check: tier %d list %d kind %d: hot end is not the last entry",
					t, w, k);
				FAIL_IF(n != l->n || n != on_lists[t][w][k],
					"btable check: tier %d list %d kind %d: %llu linked, count %llu, %llu tagged", t, w, k,
					(unsigned long long)n, (unsigned long long)l->n,
					(unsigned long long)on_lists[t][w][k]);
			}
		}
	}
	FAIL_IF(c.n_entries != bt->st.n_entries || c.n_pinned != bt->st.n_pinned || c.n_dirty != bt->st.n_dirty,
		"btable check: counters: entries %llu/%llu pinned %llu/%llu dirty %llu/%llu",
		(unsigned long long)c.n_entries, (unsigned long long)bt->st.n_entries,
		(unsigned long long)c.n_pinned, (unsigned long long)bt->st.n_pinned, (unsigned long long)c.n_dirty,
		(unsigned long long)bt->st.n_dirty);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		FAIL_IF(c.n_in_tier[t] != bt->st.n_in_tier[t], "btable check: tier %d count %llu, counted %llu", t,
			(unsigned long long)bt->st.n_in_tier[t], (unsigned long long)c.n_in_tier[t]);
		for (int k = 0; k < KVT_BLOCK_KIND_COUNT; k++)
			FAIL_IF(c.n_in_tier_kind[t][k] != bt->st.n_in_tier_kind[t][k],
				"btable check: tier %d kind %d count %llu, counted %llu", t, k,
				(unsigned long long)bt->st.n_in_tier_kind[t][k], (unsigned long long)c.n_in_tier_kind[t][k]);
	}
out:
	pthread_mutex_unlock(&bt->mu);
	return rc;
}
