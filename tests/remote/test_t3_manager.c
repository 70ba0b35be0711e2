/*
 * tests/remote/test_t3_manager.c — the tiering manager with T3 on a real Redis
 * Cluster (run under tests/remote/redis_cluster.py; skip without it): several
 * managers, each a node of its own (CPU device, T0 pool, block table, no T2),
 * sharing the cluster.
 *
 * For f16 and fp8:
 *  - write_through: node A registers a chain and ends the turn; its writer
 *    thread puts every block in T3 (and nothing before the turn ended);
 *  - node B, which never saw the chain, submits it as remote: every block comes
 *    T3 -> T1 -> T0 (f16 bit for bit, fp8 identical to A's own T1 copy), enters
 *    B's table clean with a pin for the caller; the manager's invariants hold;
 *  - a chain one block longer than T3 has: the run found is promoted, the rest
 *    is a miss; a ticket freed without taking its results drops its pins;
 *  - local and remote mixed: the first blocks in the table, the rest from T3.
 * Then (fp8): on_demote writes nothing at the end of a turn, and writes every
 * block as eviction pushes it off the node (T0 -> T1 -> out); another node
 * then reads them all. A dead T3: every remote block a prompt miss (within
 * the timeout), degraded, writes kept queued, and the manager shuts down
 * promptly. Threads: clean under ThreadSanitizer (the TSan build runs it).
 */
#include "check.h"
#include "test_dev.h"
#include "manager.h"

#include <unistd.h>

#define BT 16
#define N_T0 8
#define N_T1 8
#define N_CHAIN 6

static const kvt_kv_layout shape = { .n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_tokens = BT };
static uint8_t model_fp[32] = { 9, 1, 7 };
static char seeds[512];
static int32_t toks[(N_CHAIN + 1) * BT];
static uint8_t root[32], hashes[N_CHAIN + 1][32];
static uint16_t *data;
static size_t n_el;

typedef struct node {
	kvt_dev *dev;
	kvt_t0_pool *t0;
	kvt_btable *bt;
	kvt_t3 *t3;
	kvt_tm *tm;
} node;

static int node_open(node *n, int codec, const char *prefix, int policy, const char *seed_list, float t1_high)
{
	kvt_dev_config dc = { .kind = test_dev_kind(), .n_threads = 1 };
	memset(n, 0, sizeof(*n));
	if (kvt_dev_create(&dc, &n->dev) || kvt_t0_create(n->dev, &shape, N_T0, &n->t0) || kvt_btable_create(BT, 0, &n->bt))
		return 1;
	kvt_t3_config t3c;
	kvt_t3_config_default(&t3c);
	t3c.rc.seeds = seed_list;
	t3c.rc.command_timeout_ms = 5000; /* sanitizer builds are slow; the dead T3 is refused at once anyway */
	t3c.prefix = prefix;
	t3c.write_policy = policy;
	if (kvt_t3_create(&t3c, model_fp, &n->t3))
		return 1;
	kvt_tm_config c;
	kvt_tm_config_default(&c);
	c.dev = n->dev;
	c.t0 = n->t0;
	c.bt = n->bt;
	c.t3 = n->t3;
	c.t1_slots = N_T1;
	c.t1_codec = codec;
	c.batch_blocks = 4;
	c.high[KVT_TIER_HBM] = 1.0f;
	c.high[KVT_TIER_HOST] = t1_high;
	c.low[KVT_TIER_HOST] = 0.0f;
	c.poll_s = 5.0;
	return kvt_tm_create(&c, &n->tm) != KVT_OK;
}

static void node_close(node *n)
{
	kvt_tm_destroy(n->tm);
	kvt_t3_destroy(n->t3);
	kvt_btable_destroy(n->bt);
	kvt_t0_destroy(n->t0);
	kvt_dev_destroy(n->dev);
}

static void make_chain(void)
{
	check_rng rng = { 17 };
	uint8_t salt[32] = { 1 };
	uint32_t k;
	for (int i = 0; i < (N_CHAIN + 1) * BT; i++)
		toks[i] = (int32_t)(check_rng_u64(&rng) % 30000);
	CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt, root) == KVT_OK);
	CHECK(kvt_hash_chain(root, toks, (N_CHAIN + 1) * BT, BT, hashes, N_CHAIN + 1, &k) == KVT_OK && k == N_CHAIN + 1);
	n_el = kvt_kv_block_bytes(&shape) / 2;
	data = malloc((N_CHAIN + 1) * n_el * 2);
	for (size_t i = 0; i < (N_CHAIN + 1) * n_el; i++)
		data[i] = kvt_f32_to_f16(check_rng_f32(&rng) * 3.0f);
}

static void compute(node *n, int b)
{
	int32_t s;
	CHECK(kvt_t0_alloc(n->t0, &s) == KVT_OK);
	CHECK(kvt_dev_copy_h2d(n->dev, (char *)kvt_t0_layout(n->t0)->pool + (size_t)s * n_el * 2, data + b * n_el,
			       n_el * 2) == KVT_OK);
	CHECK(kvt_tm_register(n->tm, hashes[b], b ? hashes[b - 1] : root, toks + b * BT, s) == KVT_OK);
	kvt_t0_unref(n->t0, s);
}

/* The fp16 bytes of T0 slot s. */
static uint16_t *slot_bytes(node *n, int32_t s)
{
	uint16_t *out = malloc(n_el * 2);
	CHECK(kvt_dev_copy_d2h(n->dev, out, (char *)kvt_t0_layout(n->t0)->pool + (size_t)s * n_el * 2, n_el * 2) ==
	      KVT_OK);
	return out;
}

/* Submit hashes[0, n) with n_local local ones; check results[i] == want[i]; return the T0 bytes (or NULL) per block. */
static void fetch(node *n, uint32_t cnt, uint32_t n_local, const int *want, uint16_t **bytes, bool collect)
{
	kvt_tm_ticket *t = NULL;
	int32_t slots[N_CHAIN + 1];
	int res[N_CHAIN + 1];
	CHECK(kvt_tm_submit_remote(n->tm, cnt, (const uint8_t(*)[32])hashes, n_local, root, KVT_TIER_HBM, true, &t) ==
	      KVT_OK);
	if (!t)
		return;
	kvt_tm_ticket_wait(n->tm, t);
	if (!collect) {
		kvt_tm_ticket_free(n->tm, t);
		return;
	}
	kvt_tm_ticket_results(n->tm, t, slots, res);
	kvt_tm_ticket_free(n->tm, t);
	for (uint32_t i = 0; i < cnt; i++) {
		CHECKF(res[i] == want[i], "block %u: %s, expected %s", i, kvt_strerror(res[i]), kvt_strerror(want[i]));
		if (bytes)
			bytes[i] = NULL;
		if (res[i] != KVT_OK)
			continue;
		if (bytes)
			bytes[i] = slot_bytes(n, slots[i]);
		kvt_t0_unref(n->t0, slots[i]);
	}
}

static uint32_t pins(node *n, int b)
{
	kvt_btable_entry e;
	return kvt_btable_get(n->bt, hashes[b], &e) == KVT_OK ? e.pins : 0;
}

static void test_write_through(int codec)
{
	char prefix[32];
	snprintf(prefix, sizeof(prefix), "tm%d:", codec);
	node a, b, c, d;
	CHECK(node_open(&a, codec, prefix, KVT_T3_WRITE_THROUGH, seeds, 1.0f) == 0);
	for (int i = 0; i < N_CHAIN; i++)
		compute(&a, i);
	kvt_tm_stats st;
	usleep(200 * 1000);
	kvt_tm_get_stats(a.tm, &st);
	CHECK_EQ_INT(st.t3.n_writes, 0); /* not before the turn ends */
	CHECK_EQ_INT(st.n_remote_queued, N_CHAIN);
	kvt_tm_end_turn(a.tm);
	CHECK(kvt_tm_remote_drain(a.tm, 10.0));
	kvt_tm_get_stats(a.tm, &st);
	CHECK_EQ_INT(st.t3.n_writes, N_CHAIN);
	CHECK_EQ_INT(st.remote.n_demotions, N_CHAIN);
	CHECK(st.has_remote && !st.remote.degraded);
	/* A's own view of the blocks, through its T1 copy (the codec's round trip) */
	uint16_t *ref[N_CHAIN + 1];
	int ok6[N_CHAIN + 1];
	for (int i = 0; i <= N_CHAIN; i++)
		ok6[i] = KVT_OK;
	CHECK_EQ_INT(kvt_tm_reserve_t0(a.tm, N_T0), KVT_OK); /* T0 -> T1 */
	fetch(&a, N_CHAIN, N_CHAIN, ok6, ref, true);

	/* B never saw the chain: all of it from T3 */
	CHECK(node_open(&b, codec, prefix, KVT_T3_WRITE_THROUGH, seeds, 1.0f) == 0);
	uint16_t *got[N_CHAIN + 1];
	fetch(&b, N_CHAIN, 0, ok6, got, true);
	int same = 0;
	for (int i = 0; i < N_CHAIN; i++) {
		same += got[i] && ref[i] && !memcmp(got[i], ref[i], n_el * 2);
		if (codec == KVT_KV_CODEC_F16)
			CHECKF(got[i] && !memcmp(got[i], data + i * n_el, n_el * 2), "f16 block %d bit for bit", i);
	}
	CHECKF(same == N_CHAIN, "%s: %d of %d blocks from T3 equal A's", kvt_kv_codec_name(codec), same, N_CHAIN);
	int pinned = 0, clean = 0;
	for (int i = 0; i < N_CHAIN; i++) {
		kvt_btable_entry e;
		if (kvt_btable_get(b.bt, hashes[i], &e) == KVT_OK) {
			pinned += e.pins == 1;
			clean += !e.dirty && e.slot[KVT_TIER_HOST] >= 0 && e.slot[KVT_TIER_HBM] >= 0;
		}
	}
	CHECK_EQ_INT(pinned, N_CHAIN); /* the caller's, handed over with the slots */
	CHECK_EQ_INT(clean, N_CHAIN);
	for (int i = 0; i < N_CHAIN; i++)
		kvt_tm_unpin(b.tm, hashes[i]);
	CHECK(kvt_tm_check(b.tm) == KVT_OK);
	kvt_tm_get_stats(b.tm, &st);
	CHECK_EQ_INT(st.remote.hits, N_CHAIN);
	CHECK_EQ_INT(st.remote.n_promotions, N_CHAIN);
	CHECK_EQ_INT(st.t3.n_writes, 0); /* fetched blocks are not written back */

	/* C: one block more than T3 has; then a ticket dropped without its results */
	CHECK(node_open(&c, codec, prefix, KVT_T3_WRITE_THROUGH, seeds, 1.0f) == 0);
	int want7[N_CHAIN + 1];
	for (int i = 0; i <= N_CHAIN; i++)
		want7[i] = i < N_CHAIN ? KVT_OK : KVT_ENOTFOUND;
	fetch(&c, N_CHAIN + 1, 0, want7, NULL, true);
	for (int i = 0; i < N_CHAIN; i++)
		kvt_tm_unpin(c.tm, hashes[i]);
	node_close(&c);
	CHECK(node_open(&c, codec, prefix, KVT_T3_WRITE_THROUGH, seeds, 1.0f) == 0);
	fetch(&c, N_CHAIN, 0, ok6, NULL, false);
	int left = 0;
	for (int i = 0; i < N_CHAIN; i++)
		left += (int)pins(&c, i);
	CHECK_EQ_INT(left, 0);
	CHECK(kvt_tm_check(c.tm) == KVT_OK);
	node_close(&c);

	/* D: two blocks of its own, the rest from T3 */
	CHECK(node_open(&d, codec, prefix, KVT_T3_WRITE_THROUGH, seeds, 1.0f) == 0);
	compute(&d, 0);
	compute(&d, 1);
	CHECK(kvt_tm_pin(d.tm, hashes[0]) == KVT_OK && kvt_tm_pin(d.tm, hashes[1]) == KVT_OK);
	fetch(&d, N_CHAIN, 2, ok6, NULL, true);
	for (int i = 0; i < N_CHAIN; i++)
		kvt_tm_unpin(d.tm, hashes[i]);
	kvt_tm_get_stats(d.tm, &st);
	CHECK_EQ_INT(st.remote.hits, N_CHAIN - 2);
	CHECK(kvt_tm_check(d.tm) == KVT_OK);
	node_close(&d);

	for (int i = 0; i < N_CHAIN; i++) {
		free(ref[i]);
		free(got[i]);
	}
	node_close(&b);
	node_close(&a);
}

static void test_on_demote(void)
{
	node a, b;
	/* T1 high watermark 0.1: a maintenance pass empties T1, pushing the blocks off the node */
	CHECK(node_open(&a, KVT_KV_CODEC_FP8, "tmdem:", KVT_T3_ON_DEMOTE, seeds, 0.1f) == 0);
	for (int i = 0; i < N_CHAIN; i++)
		compute(&a, i);
	kvt_tm_end_turn(a.tm);
	CHECK(kvt_tm_remote_drain(a.tm, 5.0));
	kvt_tm_stats st;
	kvt_tm_get_stats(a.tm, &st);
	CHECK_EQ_INT(st.t3.n_writes, 0); /* on_demote: not at the end of the turn */
	CHECK_EQ_INT(kvt_tm_reserve_t0(a.tm, N_T0), KVT_OK); /* T0 -> T1 */
	kvt_tm_maintain(a.tm);                                /* T1 -> off the node: to T3 first */
	kvt_btable_stats bs;
	kvt_btable_get_stats(a.bt, &bs);
	CHECK_EQ_INT(bs.n_in_tier[KVT_TIER_HOST], 0);
	kvt_tm_get_stats(a.tm, &st);
	CHECK_EQ_INT(st.t3.n_writes, N_CHAIN);
	CHECK_EQ_INT(st.remote.n_demotions, N_CHAIN);
	CHECK(node_open(&b, KVT_KV_CODEC_FP8, "tmdem:", KVT_T3_ON_DEMOTE, seeds, 1.0f) == 0);
	int ok6[N_CHAIN];
	for (int i = 0; i < N_CHAIN; i++)
		ok6[i] = KVT_OK;
	fetch(&b, N_CHAIN, 0, ok6, NULL, true);
	for (int i = 0; i < N_CHAIN; i++)
		kvt_tm_unpin(b.tm, hashes[i]);
	node_close(&b);
	node_close(&a);
}

static void test_dead(void)
{
	node a;
	CHECK(node_open(&a, KVT_KV_CODEC_FP8, "tmdead:", KVT_T3_WRITE_THROUGH, "127.0.0.1:1", 1.0f) == 0);
	int miss[N_CHAIN];
	for (int i = 0; i < N_CHAIN; i++)
		miss[i] = KVT_ENOTFOUND;
	double t0 = kvt_now_s();
	fetch(&a, N_CHAIN, 0, miss, NULL, true);
	CHECK(kvt_now_s() - t0 < 1.5);
	kvt_tm_stats st;
	kvt_tm_get_stats(a.tm, &st);
	CHECK(st.remote.degraded);
	CHECK_EQ_INT(st.remote.misses, N_CHAIN);
	for (int i = 0; i < N_CHAIN; i++)
		compute(&a, i);
	kvt_tm_end_turn(a.tm);
	CHECK(!kvt_tm_remote_drain(a.tm, 0.5)); /* kept for a retry */
	kvt_tm_get_stats(a.tm, &st);
	CHECK_EQ_INT(st.n_remote_queued, N_CHAIN);
	CHECK_EQ_INT(st.t3.n_writes, 0);
	t0 = kvt_now_s();
	node_close(&a);
	CHECK(kvt_now_s() - t0 < 3.0);
}

int main(void)
{
	const char *s = getenv("KVT_TEST_REDIS_CLUSTER");
	if (!s)
		return check_skip("test_t3_manager", "run under tests/remote/redis_cluster.py");
	snprintf(seeds, sizeof(seeds), "%s", s);
	make_chain();
	test_write_through(KVT_KV_CODEC_F16);
	test_write_through(KVT_KV_CODEC_FP8);
	test_on_demote();
	test_dead();
	free(data);
	return check_done("test_t3_manager");
}
