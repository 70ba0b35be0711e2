/* ctest-labels: unit integration */
/*
 * tests/test_manager_prefix.c — the prefix-cache handle (tiers/prefix.c) on
 * a small manager with T1, T2 and the index:
 *  - nothing cached: path NONE, nothing taken, nothing pinned;
 *  - a chain all in T0: READY at once; take hands the very slots with a
 *    reference each; the handle holds one pin per served block until release;
 *    a chain longer than what is cached matches its cached prefix;
 *  - the chain in T1: ASYNC (the I/O threads), or LAYERED with layer groups
 *    (a gate until settled); the bytes come back equal; the handle counts its
 *    blocks by origin tier and the T1 bytes copied;
 *  - RECOMPUTE's t0_only with the chain in T1: nothing usable (NONE);
 *  - after a restart (the chain in T2 only), a WARM handle brings it to T0
 *    without pins and counts every record's bytes as NVMe's;
 *  - kvt_tm_locate says where a chain is without pinning it.
 */
#include "check.h"
#include "test_dev.h"
#include "tm_fixture.h"
#include "manager.h"

#include <unistd.h>

#define BT 16
#define N_T0 8
#define N_T1 6
#define N_CHAIN 4

static const kvt_kv_layout shape = { .n_layers = 4, .n_kv_heads = 2, .head_dim = 32, .block_tokens = BT };
static char dir[256], t2_path[300], db_path[300];
static uint8_t model_fp[32] = { 9, 1, 9 };
static int32_t toks[(N_CHAIN + 2) * BT];
static uint8_t root[32], hashes[N_CHAIN + 2][32];
static uint16_t *data; /* [N_CHAIN][block elements] */
static size_t n_el;

static int fx_open_codec(tm_fx *f, bool reset, int codec)
{
	memset(f, 0, sizeof(*f));
	if (tm_fx_base(&shape, N_T0, &f->dev, &f->t0, &f->bt))
		return 1;
	kvt_t2_config tc = { .path = t2_path, .capacity_bytes = 4u << 20, .reset = reset, .buffered_ok = true };
	memcpy(tc.model_fp, model_fp, 32);
	if (kvt_t2_open(&tc, &f->t2) || tm_fx_db_open(db_path, model_fp, BT, &f->db))
		return 1;
	kvt_tm_config c;
	tm_fx_config(&c, f->dev, f->t0, f->bt, f->t2, f->db, N_T1, codec);
	c.high[KVT_TIER_HBM] = c.high[KVT_TIER_HOST] = c.high[KVT_TIER_NVME] = 1.0f; /* the test drives eviction */
	return kvt_tm_create(&c, &f->tm) != KVT_OK;
}

static int fx_open(tm_fx *f, bool reset) { return fx_open_codec(f, reset, KVT_KV_CODEC_F16); }

/* The bytes of T0 slot s equal block b's. */
static bool slot_holds(tm_fx *f, int32_t s, int b)
{
	uint16_t *got = malloc(n_el * 2);
	bool ok = got && kvt_dev_copy_d2h(f->dev, got, (char *)kvt_t0_layout(f->t0)->pool + (size_t)s * n_el * 2,
					  n_el * 2) == KVT_OK &&
		  memcmp(got, data + (size_t)b * n_el, n_el * 2) == 0;
	free(got);
	return ok;
}

static uint32_t pins_of(tm_fx *f, int b)
{
	kvt_btable_entry e;
	return kvt_btable_get(f->bt, hashes[b], &e) == KVT_OK ? e.pins : 999;
}

static kvt_tm_prefix_req serve_req(uint32_t n)
{
	return (kvt_tm_prefix_req){ .use = KVT_TM_PREFIX_SERVE,
				    .hashes = (const uint8_t(*)[32])hashes,
				    .tokens = toks,
				    .n = n,
				    .root = root,
				    .refresh = true };
}

/*
 * Serve the chain through a handle expecting path want and n_lossy blocks that came through an 8-bit copy;
 * counts by origin tier; with an f16 T1 (lossy 0 expected everywhere) the slots hold the blocks' exact bytes.
 */
static void serve_lossy(tm_fx *f, kvt_tm_prefix_req r, int want, int origin, int codec, uint32_t want_lossy)
{
	kvt_tm_prefix *p = NULL;
	kvt_tm_prefix_counts c;
	int32_t slots[N_CHAIN + 2];
	CHECK(kvt_tm_prefix_acquire(f->tm, &r, &p) == KVT_OK && p);
	kvt_tm_prefix_get_counts(f->tm, p, &c);
	CHECK_EQ_INT(c.path, want);
	CHECK_EQ_INT(c.n_matched, N_CHAIN);
	for (int i = 0; i < 500 && !kvt_tm_prefix_ready(f->tm, p); i++)
		usleep(2000);
	CHECK(kvt_tm_prefix_ready(f->tm, p));
	kvt_event *const *ev;
	uint32_t ng = 0, lpg = 0;
	CHECK_EQ_INT(kvt_tm_prefix_gate(p, &ev, &ng, &lpg), want == KVT_TM_PREFIX_LAYERED);
	CHECK_EQ_INT(kvt_tm_prefix_take(f->tm, p, slots), N_CHAIN);
	CHECK_EQ_INT(kvt_tm_prefix_settle(f->tm, p), KVT_OK);
	CHECK(!kvt_tm_prefix_gate(p, &ev, &ng, &lpg));
	kvt_tm_prefix_get_counts(f->tm, p, &c);
	CHECK_EQ_INT(c.n_served, N_CHAIN);
	CHECK_EQ_INT(c.blocks_from[origin], N_CHAIN);
	CHECK_EQ_INT(c.n_lossy, want_lossy);
	const uint64_t packed = kvt_kv_packed_bytes(&shape, codec);
	CHECK_EQ_INT(c.bytes_from[KVT_TIER_HOST], origin == KVT_TIER_HOST ? N_CHAIN * packed : 0);
	CHECK_EQ_INT(c.bytes_from[KVT_TIER_NVME], 0);
	for (int b = 0; b < N_CHAIN; b++) {
		CHECK(codec != KVT_KV_CODEC_F16 || slot_holds(f, slots[b], b));
		CHECK_EQ_INT(pins_of(f, b), 1); /* the handle's */
	}
	CHECK_EQ_INT(kvt_tm_prefix_release(f->tm, p), KVT_OK);
	for (int b = 0; b < N_CHAIN; b++) {
		CHECK_EQ_INT(pins_of(f, b), 0);
		kvt_t0_unref(f->t0, slots[b]); /* the caller's references */
	}
	CHECK(kvt_tm_check(f->tm) == KVT_OK);
}

static void serve(tm_fx *f, kvt_tm_prefix_req r, int want, int origin)
{
	serve_lossy(f, r, want, origin, KVT_KV_CODEC_F16, 0);
}

/* The engine computes the chain: fresh T0 slots, their bytes, registered. */
static void compute_chain(tm_fx *f)
{
	for (int b = 0; b < N_CHAIN; b++) {
		int32_t s;
		CHECK(kvt_t0_alloc(f->t0, &s) == KVT_OK);
		CHECK(kvt_dev_copy_h2d(f->dev, (char *)kvt_t0_layout(f->t0)->pool + (size_t)s * n_el * 2,
				       data + (size_t)b * n_el, n_el * 2) == KVT_OK);
		CHECK(kvt_tm_register(f->tm, hashes[b], b ? hashes[b - 1] : root, toks + b * BT, s) == KVT_OK);
		kvt_t0_unref(f->t0, s);
	}
}

/* Everything unpinned leaves T0 for T1. */
static void demote_all(tm_fx *f)
{
	CHECK(kvt_tm_reserve_t0(f->tm, N_T0) == KVT_OK);
	uint32_t in[KVT_TIER_COUNT], n = 0;
	CHECK(kvt_tm_locate(f->tm, (const uint8_t(*)[32])hashes, toks, N_CHAIN, in, &n) == KVT_OK);
	CHECK_EQ_INT(n, N_CHAIN);
	CHECK_EQ_INT(in[KVT_TIER_HOST], N_CHAIN);
}

int main(void)
{
	int probe_rc = test_dev_probe("test_manager_prefix");
	if (probe_rc >= 0)
		return probe_rc;
	snprintf(dir, sizeof(dir), "/tmp/kvt_test_prefix_XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(t2_path, sizeof(t2_path), "%s/kvtier.t2", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);

	check_rng rng = { 5 };
	uint8_t salt[32] = { 0 };
	uint32_t n = 0;
	for (size_t i = 0; i < sizeof(toks) / sizeof(toks[0]); i++)
		toks[i] = (int32_t)(check_rng_u64(&rng) % 30000);
	CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt, root) == KVT_OK);
	CHECK(kvt_hash_chain(root, toks, (N_CHAIN + 2) * BT, BT, hashes, N_CHAIN + 2, &n) == KVT_OK);
	n_el = kvt_kv_block_bytes(&shape) / 2;
	data = malloc(N_CHAIN * n_el * 2);
	for (size_t i = 0; i < N_CHAIN * n_el; i++)
		data[i] = kvt_f32_to_f16(check_rng_f32(&rng));

	tm_fx f;
	CHECK(fx_open(&f, true) == 0);

	/* nothing cached */
	kvt_tm_prefix *p = NULL;
	kvt_tm_prefix_counts c;
	kvt_tm_prefix_req r = serve_req(N_CHAIN);
	int32_t slots[N_CHAIN + 2];
	CHECK(kvt_tm_prefix_acquire(f.tm, &r, &p) == KVT_OK);
	kvt_tm_prefix_get_counts(f.tm, p, &c);
	CHECK_EQ_INT(c.path, KVT_TM_PREFIX_NONE);
	CHECK(kvt_tm_prefix_ready(f.tm, p));
	CHECK_EQ_INT(kvt_tm_prefix_take(f.tm, p, slots), 0);
	CHECK_EQ_INT(kvt_tm_prefix_release(f.tm, p), KVT_OK);

	/* the engine computes the chain: T0 */
	compute_chain(&f);
	serve(&f, serve_req(N_CHAIN + 2), KVT_TM_PREFIX_READY, KVT_TIER_HBM); /* longer than cached: its prefix */

	/* in T1: the I/O threads, or layer group by layer group */
	demote_all(&f);
	serve(&f, serve_req(N_CHAIN), KVT_TM_PREFIX_ASYNC, KVT_TIER_HOST);
	demote_all(&f);
	r = serve_req(N_CHAIN);
	r.layer_groups = 2;
	serve(&f, r, KVT_TM_PREFIX_LAYERED, KVT_TIER_HOST);
	demote_all(&f);
	r = serve_req(N_CHAIN);
	r.t0_only = true;
	CHECK(kvt_tm_prefix_acquire(f.tm, &r, &p) == KVT_OK);
	kvt_tm_prefix_get_counts(f.tm, p, &c);
	CHECK_EQ_INT(c.path, KVT_TM_PREFIX_NONE);
	CHECK_EQ_INT(pins_of(&f, 0), 0);
	CHECK_EQ_INT(kvt_tm_prefix_release(f.tm, p), KVT_OK);

	/* after a restart the chain is in T2 only: a resume brings it to T0 */
	CHECK(kvt_tm_flush(f.tm) == KVT_OK);
	tm_fx_close(&f);
	CHECK(fx_open(&f, false) == 0);
	uint64_t n_rec = 0;
	CHECK(kvt_tm_recover(f.tm, &n_rec) == KVT_OK && n_rec == N_CHAIN);
	kvt_tm_prefix_req w = { .use = KVT_TM_PREFIX_WARM, .hashes = (const uint8_t(*)[32])hashes, .tokens = toks,
				.n = N_CHAIN, .root = root };
	CHECK(kvt_tm_prefix_acquire(f.tm, &w, &p) == KVT_OK);
	CHECK_EQ_INT(pins_of(&f, 0), 0);
	CHECK(kvt_tm_prefix_wait(f.tm, p, NULL, NULL) == KVT_OK);
	kvt_tm_prefix_get_counts(f.tm, p, &c);
	CHECK_EQ_INT(c.path, KVT_TM_PREFIX_ASYNC);
	CHECK_EQ_INT(c.n_served, N_CHAIN);
	CHECK_EQ_INT(c.blocks_from[KVT_TIER_NVME], N_CHAIN);
	kvt_tm_stats st;
	kvt_tm_get_stats(f.tm, &st);
	CHECK(c.bytes_from[KVT_TIER_NVME] > 0);
	CHECK_EQ_INT(c.bytes_from[KVT_TIER_NVME], st.tier[KVT_TIER_HOST].promotion_bytes); /* alone: all of it */
	CHECK_EQ_INT(c.bytes_from[KVT_TIER_HOST], 0);
	CHECK_EQ_INT(kvt_tm_prefix_release(f.tm, p), KVT_OK);
	uint32_t in[KVT_TIER_COUNT];
	CHECK(kvt_tm_locate(f.tm, (const uint8_t(*)[32])hashes, toks, N_CHAIN, in, &n) == KVT_OK);
	CHECK_EQ_INT(in[KVT_TIER_HBM], N_CHAIN);
	CHECK(kvt_tm_check(f.tm) == KVT_OK);
	tm_fx_close(&f);

	/*
	 * An FP8 T1: computed blocks are exact (0 lossy); served from T1 all are lossy, and so they stay once
	 * unpacked into T0 (a registration of a block already in T0 leaves its copy alone).
	 */
	CHECK(fx_open_codec(&f, true, KVT_KV_CODEC_FP8) == 0);
	compute_chain(&f);
	serve_lossy(&f, serve_req(N_CHAIN), KVT_TM_PREFIX_READY, KVT_TIER_HBM, KVT_KV_CODEC_FP8, 0);
	demote_all(&f);
	serve_lossy(&f, serve_req(N_CHAIN), KVT_TM_PREFIX_ASYNC, KVT_TIER_HOST, KVT_KV_CODEC_FP8, N_CHAIN);
	serve_lossy(&f, serve_req(N_CHAIN), KVT_TM_PREFIX_READY, KVT_TIER_HBM, KVT_KV_CODEC_FP8, N_CHAIN);
	tm_fx_close(&f);

	free(data);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	return check_done("test_manager_prefix");
}
