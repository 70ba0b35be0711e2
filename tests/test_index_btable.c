/*
 * tests/test_index_btable.c — the in-memory block table.
 *
 * Fixed cases (prefix lookup, collisions, namespaces and tenants giving 0
 * hits, pins, leaves-first eviction order, remove rules, block kinds: per-tier
 * per-kind counts through insert, slot changes, kind changes and removal,
 * kind-restricted coldest with pins and retention), then a seeded random
 * walk checked against a brute-force model of `coldest` (any kind and each
 * kind) and the invariant walker after every step, then several threads at
 * once (TSan).
 */
/* ctest-labels: unit */
#include "check.h"
#include "index.h"

#include <pthread.h>
#include <string.h>

#define BT 16

static uint8_t g_fp[32], g_salt[32];

static void root_for(uint8_t root[32], uint32_t layout, uint32_t bt, uint8_t salt_xor, uint8_t fp_xor)
{
	uint8_t fp[32], salt[32];
	memcpy(fp, g_fp, 32);
	memcpy(salt, g_salt, 32);
	fp[0] ^= fp_xor;
	salt[0] ^= salt_xor;
	KVT_ASSERT(kvt_hash_root(fp, layout, bt, salt, root) == KVT_OK);
}

/* Insert the chain of every full block of toks under root; returns blocks inserted. */
static uint32_t insert_chain(kvt_btable *t, const uint8_t root[32], const int32_t *toks, uint32_t n_tokens,
			     uint8_t (*hashes)[32])
{
	uint32_t n = 0;
	KVT_ASSERT(kvt_hash_chain(root, toks, n_tokens, BT, hashes, 1u << 20, &n) == KVT_OK);
	for (uint32_t i = 0; i < n; i++)
		KVT_ASSERT(kvt_btable_insert(t, hashes[i], i ? hashes[i - 1] : root, toks + i * BT, NULL) == KVT_OK);
	return n;
}

static void test_basic(void)
{
	kvt_btable *t;
	uint8_t root[32], h[8][32];
	int32_t toks[8 * BT + 5];
	kvt_btable_match m[9];
	kvt_btable_entry e;
	uint32_t nh, nm;
	bool created;

	for (int i = 0; i < 8 * BT + 5; i++)
		toks[i] = 1000 + i;
	root_for(root, KVT_KV_LAYOUT_VERSION, BT, 0, 0);
	CHECK(kvt_btable_create(BT, 0, &t) == KVT_OK);
	CHECK_EQ_INT(kvt_btable_block_tokens(t), BT);
	/* only 5 of 8 blocks cached */
	CHECK_EQ_INT(insert_chain(t, root, toks, 5 * BT + 3, h), 5);
	CHECK(kvt_btable_check(t) == KVT_OK);
	CHECK(kvt_btable_lookup(t, root, toks, 8 * BT + 5, 0, m, 9, &nh, &nm) == KVT_OK);
	CHECK_EQ_INT(nh, 8);
	CHECK_EQ_INT(nm, 5);
	for (int i = 0; i < 5; i++)
		CHECK(memcmp(m[i].hash, h[i], 32) == 0);
	CHECK(m[0].slot[KVT_TIER_HBM] == -1 && m[0].slot[KVT_TIER_NVME] == -1);
	/* idempotent insert */
	CHECK(kvt_btable_insert(t, h[2], h[1], toks + 2 * BT, &created) == KVT_OK);
	CHECK(!created);
	/* get */
	CHECK(kvt_btable_get(t, h[2], &e) == KVT_OK);
	CHECK(e.has_parent && memcmp(e.parent, h[1], 32) == 0 && e.n_tokens == BT && e.tokens[0] == toks[2 * BT]);
	CHECK(e.dirty && e.pins == 0 && e.n_children == 1);
	CHECK(kvt_btable_get(t, root, &e) == KVT_ENOTFOUND);
	CHECK(kvt_btable_get(t, h[0], &e) == KVT_OK && !e.has_parent && memcmp(e.parent, root, 32) == 0);

	/* a miss in the middle stops the match there */
	int32_t alt[8 * BT];
	memcpy(alt, toks, sizeof(alt));
	alt[3 * BT + 7] = -1;
	CHECK(kvt_btable_lookup(t, root, alt, 8 * BT, 0, m, 9, &nh, &nm) == KVT_OK);
	CHECK_EQ_INT(nm, 3);
	/* cap bounds the work */
	CHECK(kvt_btable_lookup(t, root, toks, 8 * BT, 0, m, 2, &nh, &nm) == KVT_OK);
	CHECK(nh == 2 && nm == 2);

	/* another tenant, model, layout or block size: 0 hits */
	uint8_t r2[32];
	root_for(r2, KVT_KV_LAYOUT_VERSION, BT, 1, 0);
	CHECK(kvt_btable_lookup(t, r2, toks, 8 * BT, 0, m, 9, &nh, &nm) == KVT_OK && nm == 0);
	root_for(r2, KVT_KV_LAYOUT_VERSION, BT, 0, 1);
	CHECK(kvt_btable_lookup(t, r2, toks, 8 * BT, 0, m, 9, &nh, &nm) == KVT_OK && nm == 0);
	root_for(r2, KVT_KV_LAYOUT_VERSION + 1, BT, 0, 0);
	CHECK(kvt_btable_lookup(t, r2, toks, 8 * BT, 0, m, 9, &nh, &nm) == KVT_OK && nm == 0);
	root_for(r2, KVT_KV_LAYOUT_VERSION, 32, 0, 0);
	CHECK(kvt_btable_lookup(t, r2, toks, 8 * BT, 0, m, 9, &nh, &nm) == KVT_OK && nm == 0);

	/* pinned lookup: atomically pins every matched block */
	CHECK(kvt_btable_lookup(t, root, toks, 8 * BT, KVT_BT_PIN | KVT_BT_TOUCH, m, 9, &nh, &nm) == KVT_OK);
	CHECK_EQ_INT(nm, 5);
	CHECK(kvt_btable_get(t, h[4], &e) == KVT_OK && e.pins == 1 && e.hits == 1);
	CHECK(kvt_btable_remove(t, h[4]) == KVT_EINVAL); /* pinned */
	uint8_t mh[5][32];
	for (int i = 0; i < 5; i++)
		memcpy(mh[i], m[i].hash, 32);
	kvt_btable_unpin_n(t, (const uint8_t(*)[32])mh, 5);
	CHECK(kvt_btable_get(t, h[4], &e) == KVT_OK && e.pins == 0);

	/* remove: parents with children cannot go, leaves can */
	CHECK(kvt_btable_remove(t, h[3]) == KVT_EINVAL);
	CHECK(kvt_btable_set_slot(t, h[4], KVT_TIER_HOST, 3) == KVT_OK);
	CHECK(kvt_btable_remove(t, h[4]) == KVT_EINVAL); /* in a tier */
	CHECK(kvt_btable_clear_slot(t, h[4], KVT_TIER_HOST, NULL, NULL) == KVT_OK);
	CHECK(kvt_btable_remove(t, h[4]) == KVT_OK);
	CHECK(kvt_btable_remove(t, h[4]) == KVT_ENOTFOUND);
	CHECK(kvt_btable_get(t, h[3], &e) == KVT_OK && e.n_children == 0);
	CHECK(kvt_btable_lookup(t, root, toks, 8 * BT, 0, m, 9, &nh, &nm) == KVT_OK && nm == 4);
	CHECK(kvt_btable_check(t) == KVT_OK);

	/* bad arguments are named */
	check_log_capture();
	CHECK(kvt_btable_set_slot(t, h[0], KVT_TIER_NVME, 0) == KVT_EINVAL);
	CHECK(kvt_btable_set_slot(t, h[0], KVT_TIER_HBM, -2) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "slot -2") != NULL);
	CHECK(kvt_btable_clear_slot(t, h[0], 7, NULL, NULL) == KVT_EINVAL);
	kvt_btable *t2;
	CHECK(kvt_btable_create(0, 0, &t2) == KVT_EINVAL);
	CHECK(kvt_btable_create(300, 0, &t2) == KVT_EINVAL);
	kvt_log_set_sink(NULL, NULL);
	kvt_btable_destroy(t);
	kvt_btable_destroy(NULL);
}

/* Children inserted before their parents are linked when the parent arrives. */
static void test_out_of_order(void)
{
	kvt_btable *t;
	uint8_t root[32], h[4][32], out[4][32];
	int32_t toks[4 * BT];
	kvt_btable_entry e;
	uint32_t n;

	for (int i = 0; i < 4 * BT; i++)
		toks[i] = 77 + i;
	root_for(root, 1, BT, 0, 0);
	CHECK(kvt_btable_create(BT, 0, &t) == KVT_OK);
	CHECK(kvt_hash_chain(root, toks, 4 * BT, BT, h, 4, &n) == KVT_OK);
	/* blocks 3 and 1 first, both already in HBM; then 2, then 0 */
	CHECK(kvt_btable_insert(t, h[3], h[2], toks + 3 * BT, NULL) == KVT_OK);
	CHECK(kvt_btable_set_slot(t, h[3], KVT_TIER_HBM, 3) == KVT_OK);
	CHECK(kvt_btable_insert(t, h[1], h[0], toks + BT, NULL) == KVT_OK);
	CHECK(kvt_btable_set_slot(t, h[1], KVT_TIER_HBM, 1) == KVT_OK);
	CHECK(kvt_btable_check(t) == KVT_OK);
	CHECK(kvt_btable_coldest(t, KVT_TIER_HBM, 4, out, &n) == KVT_OK && n == 2); /* both look like leaves */
	CHECK(kvt_btable_insert(t, h[2], h[1], toks + 2 * BT, NULL) == KVT_OK);
	CHECK(kvt_btable_get(t, h[3], &e) == KVT_OK && e.has_parent);
	CHECK(kvt_btable_get(t, h[2], &e) == KVT_OK && e.has_parent && e.n_children == 1 && e.n_children_in[KVT_TIER_HBM] == 1);
	CHECK(kvt_btable_set_slot(t, h[2], KVT_TIER_HBM, 2) == KVT_OK);
	CHECK(kvt_btable_insert(t, h[0], root, toks, NULL) == KVT_OK);
	CHECK(kvt_btable_set_slot(t, h[0], KVT_TIER_HBM, 0) == KVT_OK);
	CHECK(kvt_btable_check(t) == KVT_OK);
	/* one chain now: only its tail is a leaf, and nothing but the tail can be removed */
	CHECK(kvt_btable_coldest(t, KVT_TIER_HBM, 4, out, &n) == KVT_OK && n == 1 && memcmp(out[0], h[3], 32) == 0);
	for (int i = 0; i < 4; i++)
		CHECK(kvt_btable_clear_slot(t, h[i], KVT_TIER_HBM, NULL, NULL) == KVT_OK);
	CHECK(kvt_btable_remove(t, h[1]) == KVT_EINVAL);
	CHECK(kvt_btable_remove(t, h[3]) == KVT_OK);
	CHECK(kvt_btable_remove(t, h[2]) == KVT_OK);
	/* a removed child's parent can be re-linked by a later insert */
	CHECK(kvt_btable_insert(t, h[2], h[1], toks + 2 * BT, NULL) == KVT_OK);
	CHECK(kvt_btable_get(t, h[1], &e) == KVT_OK && e.n_children == 1);
	/* a block naming itself as its parent is never its own child */
	uint8_t selfh[32];
	memset(selfh, 0x3c, 32);
	CHECK(kvt_btable_insert(t, selfh, selfh, toks, NULL) == KVT_OK);
	CHECK(kvt_btable_get(t, selfh, &e) == KVT_OK && !e.has_parent && e.n_children == 0);
	CHECK(kvt_btable_remove(t, selfh) == KVT_OK);
	CHECK(kvt_btable_check(t) == KVT_OK);
	kvt_btable_destroy(t);
}

/* A forced collision: a hash already present under other tokens is never served. */
static void test_collision(void)
{
	kvt_btable *t;
	uint8_t root[32], h[2][32];
	int32_t a[2 * BT], b[BT];
	kvt_btable_match m[2];
	kvt_btable_stats st;
	uint32_t nh, nm;

	for (int i = 0; i < 2 * BT; i++)
		a[i] = i * 7;
	for (int i = 0; i < BT; i++)
		b[i] = 5000 + i;
	root_for(root, 1, BT, 0, 0);
	CHECK(kvt_btable_create(BT, 0, &t) == KVT_OK);
	CHECK(kvt_hash_chain(root, a, 2 * BT, BT, h, 2, &nh) == KVT_OK);
	/* plant block 0 of `a`'s hash carrying tokens `b` (as if SHA-256 had collided) */
	CHECK(kvt_btable_insert(t, h[0], root, b, NULL) == KVT_OK);
	CHECK(kvt_btable_insert(t, h[1], h[0], a + BT, NULL) == KVT_OK);
	check_log_capture();
	CHECK(kvt_btable_lookup(t, root, a, 2 * BT, KVT_BT_PIN, m, 2, &nh, &nm) == KVT_OK);
	CHECK_EQ_INT(nm, 0);
	CHECK(strstr(check_log_text, "collision") != NULL);
	/* inserting the real tokens under that hash is refused */
	CHECK(kvt_btable_insert(t, h[0], root, a, NULL) == KVT_ECORRUPT);
	kvt_log_set_sink(NULL, NULL);
	kvt_btable_get_stats(t, &st);
	CHECK_EQ_INT(st.n_collisions, 2);
	CHECK_EQ_INT(st.n_pinned, 0);
	kvt_btable_entry e;
	CHECK(kvt_btable_get(t, h[0], &e) == KVT_OK && e.tokens[0] == 5000);
	CHECK(kvt_btable_check(t) == KVT_OK);
	kvt_btable_destroy(t);
}

/* Leaves first, coldest first, per tier. */
static void test_coldest(void)
{
	kvt_btable *t;
	uint8_t root[32], h[6][32], out[8][32];
	int32_t toks[6 * BT];
	uint32_t n;
	kvt_nvme_loc loc = { .off = 4096, .extent_bytes = 8192, .stored_bytes = 5000, .generation = 3, .checksum = 9 };

	for (int i = 0; i < 6 * BT; i++)
		toks[i] = i;
	root_for(root, 1, BT, 0, 0);
	CHECK(kvt_btable_create(BT, 0, &t) == KVT_OK);
	insert_chain(t, root, toks, 6 * BT, h);
	for (int i = 0; i < 6; i++)
		CHECK(kvt_btable_set_slot(t, h[i], KVT_TIER_HBM, i) == KVT_OK);
	CHECK(kvt_btable_coldest(t, KVT_TIER_HBM, 8, out, &n) == KVT_OK);
	CHECK_EQ_INT(n, 1);
	CHECK(memcmp(out[0], h[5], 32) == 0);
	/* NVMe holds blocks 0..2: its leaf is block 2, although 3..5 are children in HBM */
	for (int i = 0; i < 3; i++)
		CHECK(kvt_btable_set_nvme(t, h[i], &loc) == KVT_OK);
	CHECK(kvt_btable_coldest(t, KVT_TIER_NVME, 8, out, &n) == KVT_OK);
	CHECK(n == 1 && memcmp(out[0], h[2], 32) == 0);
	/* evicting the HBM leaf exposes its parent */
	int32_t old = 99;
	CHECK(kvt_btable_clear_slot(t, h[5], KVT_TIER_HBM, &old, NULL) == KVT_OK);
	CHECK_EQ_INT(old, 5);
	CHECK(kvt_btable_coldest(t, KVT_TIER_HBM, 8, out, &n) == KVT_OK);
	CHECK(n == 1 && memcmp(out[0], h[4], 32) == 0);
	/* pinned leaves are skipped */
	CHECK(kvt_btable_pin(t, h[4]) == KVT_OK);
	CHECK(kvt_btable_coldest(t, KVT_TIER_HBM, 8, out, &n) == KVT_OK);
	CHECK_EQ_INT(n, 0);
	CHECK(kvt_btable_unpin(t, h[4]) == KVT_OK);
	/* a second branch: two leaves, the least recently touched first */
	int32_t br[2 * BT];
	uint8_t hb[2][32];
	memcpy(br, toks, BT * sizeof(int32_t));
	for (int i = BT; i < 2 * BT; i++)
		br[i] = -i;
	CHECK(kvt_hash_chain(root, br, 2 * BT, BT, hb, 2, &n) == KVT_OK);
	CHECK(memcmp(hb[0], h[0], 32) == 0);
	CHECK(kvt_btable_insert(t, hb[1], hb[0], br + BT, NULL) == KVT_OK);
	CHECK(kvt_btable_set_slot(t, hb[1], KVT_TIER_HBM, 40) == KVT_OK);
	CHECK(kvt_btable_coldest(t, KVT_TIER_HBM, 8, out, &n) == KVT_OK);
	CHECK(n == 2 && memcmp(out[0], h[4], 32) == 0 && memcmp(out[1], hb[1], 32) == 0);
	CHECK(kvt_btable_touch(t, h[4]) == KVT_OK);
	CHECK(kvt_btable_coldest(t, KVT_TIER_HBM, 8, out, &n) == KVT_OK);
	CHECK(n == 2 && memcmp(out[0], hb[1], 32) == 0 && memcmp(out[1], h[4], 32) == 0);
	/* clear NVMe: old location returned, dirty again */
	kvt_nvme_loc got;
	kvt_btable_entry e;
	CHECK(kvt_btable_get(t, h[2], &e) == KVT_OK && !e.dirty && e.nvme.generation == 3);
	CHECK(kvt_btable_clear_slot(t, h[2], KVT_TIER_NVME, NULL, &got) == KVT_OK);
	CHECK(got.off == 4096 && got.extent_bytes == 8192 && got.checksum == 9);
	CHECK(kvt_btable_get(t, h[2], &e) == KVT_OK && e.dirty && e.slot[KVT_TIER_NVME] == -1);
	CHECK(kvt_btable_check(t) == KVT_OK);
	kvt_btable_destroy(t);
}

/* ---- block kinds --------------------------------------------------------------- */

static void kind_counts(kvt_btable *t, int tier, uint64_t *n_prefix, uint64_t *n_chunk)
{
	kvt_btable_stats st;
	kvt_btable_get_stats(t, &st);
	*n_prefix = st.n_in_tier_kind[tier][KVT_BLOCK_PREFIX];
	*n_chunk = st.n_in_tier_kind[tier][KVT_BLOCK_CHUNK];
	CHECK(st.n_in_tier[tier] == *n_prefix + *n_chunk);
}

#define CHECK_KINDS(t, tier, np, nc)                                                                       \
	do {                                                                                               \
		uint64_t p_, c_;                                                                           \
		kind_counts(t, tier, &p_, &c_);                                                            \
		CHECKF(p_ == (np) && c_ == (nc), "tier %d: %llu prefix, %llu chunk blocks; want %d, %d", tier, \
		       (unsigned long long)p_, (unsigned long long)c_, (int)(np), (int)(nc));              \
		CHECK(kvt_btable_check(t) == KVT_OK);                                                      \
	} while (0)

static void test_kinds(void)
{
	kvt_btable *t;
	uint8_t root[32], croot[32], a[4][32], b[4][32], out[8][32];
	int32_t toks[4 * BT];
	uint32_t n;
	kvt_btable_entry e;

	for (int i = 0; i < 4 * BT; i++)
		toks[i] = 7 + i;
	root_for(root, 1, BT, 0, 0);
	root_for(croot, 1, BT, 0x5a, 0); /* the same tokens under another root: a chunk chain */
	CHECK(kvt_btable_create(BT, 0, &t) == KVT_OK);
	insert_chain(t, root, toks, 4 * BT, a);
	insert_chain(t, croot, toks, 4 * BT, b);
	CHECK(kvt_btable_get(t, b[0], &e) == KVT_OK && e.kind == KVT_BLOCK_PREFIX); /* the default */
	/* at insertion: in no tier yet, so no count moves */
	for (int i = 0; i < 4; i++)
		CHECK(kvt_btable_set_kind(t, b[i], KVT_BLOCK_CHUNK) == KVT_OK);
	CHECK(kvt_btable_get(t, b[3], &e) == KVT_OK && e.kind == KVT_BLOCK_CHUNK);
	CHECK_KINDS(t, KVT_TIER_HOST, 0, 0);
	for (int i = 0; i < 4; i++) {
		CHECK(kvt_btable_set_slot(t, a[i], KVT_TIER_HOST, i) == KVT_OK);
		CHECK(kvt_btable_set_slot(t, b[i], KVT_TIER_HOST, 4 + i) == KVT_OK);
	}
	CHECK_KINDS(t, KVT_TIER_HOST, 4, 4);
	CHECK_KINDS(t, KVT_TIER_HBM, 0, 0);
	/* a slot change within the tier counts nothing twice */
	CHECK(kvt_btable_set_slot(t, b[1], KVT_TIER_HOST, 40) == KVT_OK);
	CHECK_KINDS(t, KVT_TIER_HOST, 4, 4);

	/* each kind's coldest leaf; any kind: both, in tick order (chain a was inserted first) */
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, KVT_BLOCK_CHUNK, UINT64_MAX, 8, out, &n) == KVT_OK);
	CHECK(n == 1 && !memcmp(out[0], b[3], 32));
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, KVT_BLOCK_PREFIX, UINT64_MAX, 8, out, &n) == KVT_OK);
	CHECK(n == 1 && !memcmp(out[0], a[3], 32));
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, KVT_BLOCK_ANY, UINT64_MAX, 8, out, &n) == KVT_OK);
	CHECK(n == 2 && !memcmp(out[0], a[3], 32) && !memcmp(out[1], b[3], 32));
	CHECK(kvt_btable_touch(t, a[3]) == KVT_OK);
	CHECK(kvt_btable_coldest_at(t, KVT_TIER_HOST, 0, 8, out, &n) == KVT_OK);
	CHECK(n == 2 && !memcmp(out[0], b[3], 32) && !memcmp(out[1], a[3], 32));

	/* a kind change of a present block moves it and its count, keeping its LRU place */
	CHECK(kvt_btable_set_kind(t, a[3], KVT_BLOCK_CHUNK) == KVT_OK);
	CHECK_KINDS(t, KVT_TIER_HOST, 3, 5);
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, KVT_BLOCK_CHUNK, UINT64_MAX, 8, out, &n) == KVT_OK);
	CHECK(n == 2 && !memcmp(out[0], b[3], 32) && !memcmp(out[1], a[3], 32));
	/* leaves are tier-wide: a[2] has its child a[3] present, so no prefix block is a leaf now */
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, KVT_BLOCK_PREFIX, UINT64_MAX, 8, out, &n) == KVT_OK);
	CHECK_EQ_INT(n, 0);
	CHECK(kvt_btable_set_kind(t, a[3], KVT_BLOCK_CHUNK) == KVT_OK); /* the same kind again: nothing moves */
	CHECK_KINDS(t, KVT_TIER_HOST, 3, 5);
	CHECK(kvt_btable_set_kind(t, a[3], KVT_BLOCK_PREFIX) == KVT_OK);
	CHECK_KINDS(t, KVT_TIER_HOST, 4, 4);

	/* leaving a tier: the chunk's parent becomes the chunk leaf */
	CHECK(kvt_btable_clear_slot(t, b[3], KVT_TIER_HOST, NULL, NULL) == KVT_OK);
	CHECK_KINDS(t, KVT_TIER_HOST, 4, 3);
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, KVT_BLOCK_CHUNK, UINT64_MAX, 8, out, &n) == KVT_OK);
	CHECK(n == 1 && !memcmp(out[0], b[2], 32));
	/* T2 counts apart from T1 */
	kvt_nvme_loc loc = { .off = 4096, .extent_bytes = 4096 };
	for (int i = 0; i < 3; i++) {
		loc.off = 4096u * (uint64_t)(i + 1);
		CHECK(kvt_btable_set_nvme(t, b[i], &loc) == KVT_OK);
	}
	CHECK_KINDS(t, KVT_TIER_NVME, 0, 3);
	CHECK_KINDS(t, KVT_TIER_HOST, 4, 3);

	/* retention and pins hold for a kind-restricted query */
	CHECK(kvt_btable_set_retain(t, b[2], 1000, KVT_TIER_HOST) == KVT_OK);
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, KVT_BLOCK_CHUNK, 999, 8, out, &n) == KVT_OK);
	CHECK_EQ_INT(n, 0);
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_NVME, KVT_BLOCK_CHUNK, 999, 8, out, &n) == KVT_OK);
	CHECK_EQ_INT(n, 0); /* retained in T1 and every tier below */
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, KVT_BLOCK_CHUNK, 1000, 8, out, &n) == KVT_OK);
	CHECK(n == 1 && !memcmp(out[0], b[2], 32)); /* the deadline passed */
	CHECK(kvt_btable_pin(t, a[3]) == KVT_OK);
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, KVT_BLOCK_PREFIX, UINT64_MAX, 8, out, &n) == KVT_OK);
	CHECK_EQ_INT(n, 0);
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, KVT_BLOCK_ANY, 999, 8, out, &n) == KVT_OK);
	CHECK_EQ_INT(n, 0);
	CHECK(kvt_btable_unpin(t, a[3]) == KVT_OK);

	/* bad arguments */
	CHECK(kvt_btable_set_kind(t, a[0], KVT_BLOCK_KIND_COUNT) == KVT_EINVAL);
	CHECK(kvt_btable_set_kind(t, a[0], KVT_BLOCK_ANY) == KVT_EINVAL);
	CHECK(kvt_btable_set_kind(t, root, KVT_BLOCK_CHUNK) == KVT_ENOTFOUND);
	CHECK(kvt_btable_coldest_kind(t, KVT_TIER_HOST, 7, 0, 8, out, &n) == KVT_EINVAL);

	/* removal: a chunk block leaves its tiers, then the table; the counts follow */
	for (int i = 3; i >= 0; i--) {
		CHECK(kvt_btable_clear_slot(t, b[i], KVT_TIER_HOST, NULL, NULL) == KVT_OK);
		CHECK(kvt_btable_clear_slot(t, b[i], KVT_TIER_NVME, NULL, NULL) == KVT_OK);
		CHECK(kvt_btable_remove(t, b[i]) == KVT_OK);
	}
	CHECK_KINDS(t, KVT_TIER_HOST, 4, 0);
	CHECK_KINDS(t, KVT_TIER_NVME, 0, 0);
	kvt_btable_destroy(t);
}

/* ---- random walk against a brute-force model of coldest ----------------------- */

#define NR_CHAINS 6
#define NR_BLOCKS 12

struct cand {
	uint64_t last_use;
	int idx;
};

static int cmp_cand(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	return x->last_use < y->last_use ? -1 : x->last_use > y->last_use;
}

static void test_random(void)
{
	kvt_btable *t;
	uint8_t root[32];
	static uint8_t h[NR_CHAINS * NR_BLOCKS][32];
	static int32_t toks[NR_CHAINS][NR_BLOCKS * BT];
	static int pins[NR_CHAINS * NR_BLOCKS];
	check_rng r = { 0x1234567ull };
	int n_all = NR_CHAINS * NR_BLOCKS, bad_check = 0, bad_cold = 0;

	root_for(root, 1, BT, 0, 0);
	CHECK(kvt_btable_create(BT, 4, &t) == KVT_OK); /* tiny: exercises growth */
	/* chains share prefixes: chain c copies chain c/2's first c blocks */
	for (int c = 0; c < NR_CHAINS; c++) {
		for (int i = 0; i < NR_BLOCKS * BT; i++)
			toks[c][i] = (int32_t)(check_rng_u64(&r) % 50000);
		if (c)
			memcpy(toks[c], toks[c / 2], (size_t)c * BT * sizeof(int32_t));
		uint32_t n;
		CHECK(kvt_hash_chain(root, toks[c], NR_BLOCKS * BT, BT, &h[c * NR_BLOCKS], NR_BLOCKS, &n) == KVT_OK);
	}
	for (int step = 0; step < 4000; step++) {
		int c = (int)(check_rng_u64(&r) % NR_CHAINS), b = (int)(check_rng_u64(&r) % NR_BLOCKS);
		int i = c * NR_BLOCKS + b;
		int tier = (int)(check_rng_u64(&r) % KVT_TIER_COUNT);
		uint8_t *par = b ? h[i - 1] : root;
		switch (check_rng_u64(&r) % 10) {
		case 0: /* insert the chain prefix up to b, parents first */
			for (int k = 0; k <= b; k++)
				CHECK(kvt_btable_insert(t, h[c * NR_BLOCKS + k], k ? h[c * NR_BLOCKS + k - 1] : root,
							toks[c] + k * BT, NULL) == KVT_OK);
			break;
		case 1: /* ... or children first (links must come out the same) */
			for (int k = b; k >= 0; k--)
				CHECK(kvt_btable_insert(t, h[c * NR_BLOCKS + k], k ? h[c * NR_BLOCKS + k - 1] : root,
							toks[c] + k * BT, NULL) == KVT_OK);
			break;
		case 2:
			if (tier == KVT_TIER_NVME) {
				kvt_nvme_loc loc = { .off = (uint64_t)i * 4096, .extent_bytes = 4096 };
				kvt_btable_set_nvme(t, h[i], &loc);
			} else {
				kvt_btable_set_slot(t, h[i], tier, i);
			}
			break;
		case 3:
			kvt_btable_clear_slot(t, h[i], tier, NULL, NULL);
			break;
		case 4:
			kvt_btable_touch(t, h[i]);
			break;
		case 5:
			if (kvt_btable_pin(t, h[i]) == KVT_OK)
				pins[i]++;
			break;
		case 6:
			if (pins[i]) {
				CHECK(kvt_btable_unpin(t, h[i]) == KVT_OK);
				pins[i]--;
			}
			break;
		case 7: {
			int rc = kvt_btable_remove(t, h[i]);
			CHECK(rc == KVT_OK || rc == KVT_EINVAL || rc == KVT_ENOTFOUND);
			if (rc == KVT_OK)
				CHECK(pins[i] == 0);
			break;
		}
		case 8: {
			kvt_btable_match m[NR_BLOCKS];
			uint32_t nh, nm;
			CHECK(kvt_btable_lookup(t, root, toks[c], NR_BLOCKS * BT, KVT_BT_TOUCH, m, NR_BLOCKS, &nh, &nm) ==
			      KVT_OK);
			kvt_btable_entry e;
			/* the match is exactly the leading run of present entries */
			uint32_t want = 0;
			while (want < NR_BLOCKS && kvt_btable_get(t, h[c * NR_BLOCKS + want], &e) == KVT_OK)
				want++;
			CHECK_EQ_INT(nm, want);
			break;
		}
		case 9: /* a kind, at any time: counts and lists follow */
			kvt_btable_set_kind(t, h[i], (int)(check_rng_u64(&r) % KVT_BLOCK_KIND_COUNT));
			break;
		}
		(void)par;
		if (kvt_btable_check(t) != KVT_OK)
			bad_check++;
		/* brute force coldest for a random tier, of any kind or one kind, and the kind counts */
		int tt = step % KVT_TIER_COUNT, qk = (step / KVT_TIER_COUNT) % 3 - 1;
		struct cand cands[NR_CHAINS * NR_BLOCKS];
		uint64_t n_kind[KVT_BLOCK_KIND_COUNT] = { 0 };
		int nc = 0;
		for (int k = 0; k < n_all; k++) {
			kvt_btable_entry e;
			bool dup = false;
			for (int j = 0; j < k && !dup; j++)
				dup = memcmp(h[j], h[k], 32) == 0; /* shared prefix blocks */
			if (dup || kvt_btable_get(t, h[k], &e) != KVT_OK)
				continue;
			n_kind[e.kind] += e.slot[tt] >= 0;
			if (e.slot[tt] >= 0 && e.pins == 0 && e.n_children_in[tt] == 0 && (qk < 0 || e.kind == qk))
				cands[nc++] = (struct cand){ e.last_use, k };
		}
		kvt_btable_stats ks;
		kvt_btable_get_stats(t, &ks);
		if (ks.n_in_tier_kind[tt][KVT_BLOCK_PREFIX] != n_kind[KVT_BLOCK_PREFIX] ||
		    ks.n_in_tier_kind[tt][KVT_BLOCK_CHUNK] != n_kind[KVT_BLOCK_CHUNK])
			bad_cold++;
		qsort(cands, (size_t)nc, sizeof(*cands), cmp_cand);
		uint8_t out[NR_CHAINS * NR_BLOCKS][32];
		uint32_t n_out = 0;
		uint32_t want = (uint32_t)(check_rng_u64(&r) % 8);
		if (qk < 0 && step % 2)
			CHECK(kvt_btable_coldest(t, tt, want, out, &n_out) == KVT_OK);
		else
			CHECK(kvt_btable_coldest_kind(t, tt, qk, UINT64_MAX, want, out, &n_out) == KVT_OK);
		if (n_out != (uint32_t)(nc < (int)want ? nc : (int)want)) {
			bad_cold++;
		} else {
			for (uint32_t k = 0; k < n_out; k++)
				if (memcmp(out[k], h[cands[k].idx], 32) != 0)
					bad_cold++;
		}
	}
	CHECK_EQ_INT(bad_check, 0);
	CHECK_EQ_INT(bad_cold, 0);
	kvt_btable_stats st;
	kvt_btable_get_stats(t, &st);
	CHECK(st.n_entries > 0 && st.n_lookups > 0);
	kvt_btable_destroy(t);
}

/* ---- threads ---------------------------------------------------------------- */

struct thr {
	kvt_btable *t;
	const uint8_t *root;
	const int32_t *toks;
	uint8_t (*h)[32];
	int id;
	int fails;
};

static void *worker(void *arg)
{
	struct thr *w = arg;
	check_rng r = { 0x9e3779b97f4a7c15ull * (unsigned long long)(w->id + 1) };
	kvt_btable_match m[64];
	uint8_t mh[64][32];
	for (int it = 0; it < 3000; it++) {
		uint32_t nh = 0, nm = 0;
		int op = (int)(check_rng_u64(&r) % 4);
		int i = (int)(check_rng_u64(&r) % 64);
		if (op == 0) {
			if (kvt_btable_lookup(w->t, w->root, w->toks, 64 * BT, KVT_BT_PIN | KVT_BT_TOUCH, m, 64, &nh, &nm))
				w->fails++;
			for (uint32_t k = 0; k < nm; k++)
				memcpy(mh[k], m[k].hash, 32);
			kvt_btable_unpin_n(w->t, (const uint8_t(*)[32])mh, nm);
		} else if (op == 1) {
			kvt_btable_set_slot(w->t, w->h[i], (int)(check_rng_u64(&r) % 2), i);
		} else if (op == 2) {
			kvt_btable_clear_slot(w->t, w->h[i], (int)(check_rng_u64(&r) % 2), NULL, NULL);
		} else {
			uint8_t out[4][32];
			uint32_t n;
			kvt_btable_coldest(w->t, (int)(check_rng_u64(&r) % 2), 4, out, &n);
		}
	}
	return NULL;
}

static void test_threads(void)
{
	kvt_btable *t;
	uint8_t root[32];
	static uint8_t h[64][32];
	static int32_t toks[64 * BT];
	pthread_t th[4];
	struct thr w[4];

	for (int i = 0; i < 64 * BT; i++)
		toks[i] = i * 3;
	root_for(root, 1, BT, 0, 0);
	CHECK(kvt_btable_create(BT, 0, &t) == KVT_OK);
	insert_chain(t, root, toks, 64 * BT, h);
	for (int i = 0; i < 4; i++) {
		w[i] = (struct thr){ t, root, toks, h, i, 0 };
		pthread_create(&th[i], NULL, worker, &w[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		CHECK_EQ_INT(w[i].fails, 0);
	}
	kvt_btable_stats st;
	kvt_btable_get_stats(t, &st);
	CHECK_EQ_INT(st.n_pinned, 0);
	CHECK(kvt_btable_check(t) == KVT_OK);
	kvt_btable_destroy(t);
}

int main(void)
{
	for (int i = 0; i < 32; i++) {
		g_fp[i] = (uint8_t)(i * 11);
		g_salt[i] = (uint8_t)(200 - i);
	}
	test_basic();
	test_out_of_order();
	test_collision();
	test_coldest();
	test_kinds();
	test_random();
	test_threads();
	return check_done("test_index_btable");
}
