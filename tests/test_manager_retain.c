/* ctest-labels: unit integration */
/*
 * tests/test_manager_retain.c — retention in the tiering manager over the
 * real pieces (CPU device, T0 pool, block table, SQLite index, T2 file in a
 * temp dir), on a controllable clock (kvt_tm_config.clock_us), so TTLs run
 * out without waiting:
 *  - TTL: under pressure, a retained chain stays in T1 (its floor) while an
 *    unretained one of the same size leaves; a hit restarts the TTL; past the
 *    deadline the chain is evicted like any other. Retaining a prefix of a
 *    chain keeps the prefix and lets the tail go, never a parent before its
 *    child. T2 eviction skips retained blocks too.
 *  - restart: retention set before a block's row exists (written with the
 *    row) and after (an update of the row) both survive a restart and keep
 *    the blocks against T2 pressure; kvt_tm_release ends it durably.
 *  - quotas between two tenants: over quota, a tenant's own oldest
 *    retentions go first, never the other tenant's; a request larger than
 *    the quota is honoured for the prefix that fits; per-tier quotas.
 */
#include "check.h"
#include "test_dev.h"
#include "tm_fixture.h"
#include "manager.h"

#include <stdatomic.h>
#include <unistd.h>

#define BT 16      /* tokens per block */
#define N_T0 8     /* T0 slots */
#define N_T1 8     /* T1 slots */
#define N_CH 4     /* chains */
#define CH_LEN 3   /* blocks per chain */

static const kvt_kv_layout shape = { .n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_tokens = BT };
static char dir[256], t2_path[300], db_path[300];
static uint8_t model_fp[32] = { 9, 1, 9 };
/* The manager's clock; atomic: the maintenance thread reads it while the test advances it. */
static _Atomic uint64_t fake_now_us = 1700000000ull * 1000000ull;
static const uint64_t MIN_US = 60ull * 1000000ull;

static uint64_t fake_clock(void *user)
{
	(void)user;
	return fake_now_us;
}

typedef tm_fx fixture;

/* t1_high / nvme_high: the watermarks the test crosses on purpose. */
static int fx_open(fixture *f, bool reset, float t1_high, float nvme_high)
{
	memset(f, 0, sizeof(*f));
	if (tm_fx_base(&shape, N_T0, &f->dev, &f->t0, &f->bt))
		return 1;
	kvt_t2_config tc = { .path = t2_path, .capacity_bytes = 4u << 20, .io_mode = KVT_T2_IO_AUTO,
			     .reset = reset, .buffered_ok = true };
	memcpy(tc.model_fp, model_fp, 32);
	if (kvt_t2_open(&tc, &f->t2) || tm_fx_db_open(db_path, model_fp, BT, &f->db))
		return 1;
	kvt_tm_config c;
	tm_fx_config(&c, f->dev, f->t0, f->bt, f->t2, f->db, N_T1, KVT_KV_CODEC_FP8);
	c.persist = KVT_PERSIST_WRITE_BACK;
	c.batch_blocks = 4;
	c.high[KVT_TIER_HBM] = 1.0f;
	c.high[KVT_TIER_HOST] = t1_high;
	c.low[KVT_TIER_HOST] = t1_high / 100;
	c.high[KVT_TIER_NVME] = nvme_high;
	c.low[KVT_TIER_NVME] = nvme_high / 100;
	c.poll_s = 5.0; /* the test drives maintenance itself */
	c.clock_us = fake_clock;
	return kvt_tm_create(&c, &f->tm) != KVT_OK;
}

static int32_t toks[N_CH][CH_LEN * BT];
static uint8_t root[32], hashes[N_CH][CH_LEN][32];
static uint16_t *data; /* one block's worth of fp16 contents, reused */
static size_t n_el;

static void make_chains(void)
{
	check_rng rng = { 42 };
	uint8_t salt[32] = { 0 };
	uint32_t n;
	CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt, root) == KVT_OK);
	for (int c = 0; c < N_CH; c++) {
		for (int i = 0; i < CH_LEN * BT; i++)
			toks[c][i] = (int32_t)(check_rng_u64(&rng) % 30000);
		CHECK(kvt_hash_chain(root, toks[c], CH_LEN * BT, BT, hashes[c], CH_LEN, &n) == KVT_OK && n == CH_LEN);
	}
	n_el = kvt_kv_block_bytes(&shape) / 2;
	data = malloc(n_el * 2);
	for (size_t i = 0; i < n_el; i++)
		data[i] = kvt_f32_to_f16(check_rng_f32(&rng));
}

/* The engine computes every block of chain c (registered in T0, the engine's own ref dropped). */
static void compute_chain(fixture *f, int c)
{
	for (int b = 0; b < CH_LEN; b++) {
		int32_t s;
		if (kvt_t0_alloc(f->t0, &s) != KVT_OK) {
			CHECK(kvt_tm_reserve_t0(f->tm, 1) == KVT_OK);
			CHECK(kvt_t0_alloc(f->t0, &s) == KVT_OK);
		}
		CHECK(kvt_dev_copy_h2d(f->dev, (char *)kvt_t0_layout(f->t0)->pool + (size_t)s * n_el * 2, data,
				       n_el * 2) == KVT_OK);
		CHECK(kvt_tm_register(f->tm, hashes[c][b], b ? hashes[c][b - 1] : root, toks[c] + b * BT, s) == KVT_OK);
		kvt_t0_unref(f->t0, s);
	}
}

/* Slot of block b of chain c in tier; -2 when the block is not in the table. */
static int32_t slot_of(fixture *f, int c, int b, int tier)
{
	kvt_btable_entry e;
	if (kvt_btable_get(f->bt, hashes[c][b], &e) != KVT_OK)
		return -2;
	return e.slot[tier];
}

static bool in_tier(fixture *f, int c, int b, int tier) { return slot_of(f, c, b, tier) >= 0; }

/* Push everything out of T0, then run maintenance (T1 and T2 watermarks). */
static void pressure(fixture *f)
{
	CHECK(kvt_tm_reserve_t0(f->tm, N_T0) == KVT_OK);
	kvt_tm_maintain(f->tm);
	CHECK(kvt_tm_check(f->tm) == KVT_OK);
	CHECK(kvt_btable_check(f->bt) == KVT_OK);
}

static void ttl_expiry(void)
{
	fixture f;
	CHECK(fx_open(&f, true, 0.3f, 1.0f) == 0);
	kvt_tm_retain_result r;
	compute_chain(&f, 0);
	compute_chain(&f, 1);
	compute_chain(&f, 2);
	/* chain 0 retained for 5 minutes in T1; chain 1 not; chain 2 only its first two blocks */
	CHECK(kvt_tm_retain(f.tm, "alice", CH_LEN, (const uint8_t(*)[32])hashes[0], 5 * MIN_US, KVT_TIER_HOST, &r) ==
	      KVT_OK);
	CHECK_EQ_INT(r.n_new, CH_LEN);
	CHECK_EQ_INT(r.n_denied, 0);
	CHECK(kvt_tm_retain(f.tm, "alice", 2, (const uint8_t(*)[32])hashes[2], 5 * MIN_US, KVT_TIER_HOST, &r) ==
	      KVT_OK);
	CHECK_EQ_INT(r.n_new, 2);
	kvt_tm_retention ret;
	CHECK(kvt_tm_get_retention(f.tm, hashes[0][2], &ret) && ret.until_us == fake_now_us + 5 * MIN_US &&
	      ret.floor == KVT_TIER_HOST && !strcmp(ret.tenant, "alice"));
	CHECK(!kvt_tm_get_retention(f.tm, hashes[1][0], &ret));

	/* T0 may still push retained blocks down to their floor (T1)... */
	pressure(&f);
	for (int b = 0; b < CH_LEN; b++) {
		CHECKF(!in_tier(&f, 0, b, KVT_TIER_HBM) && in_tier(&f, 0, b, KVT_TIER_HOST), "retained block %d", b);
		CHECKF(!in_tier(&f, 1, b, KVT_TIER_HOST), "unretained block %d still in T1", b);
	}
	/* ...a retained prefix stays, its unretained tail goes */
	CHECK(in_tier(&f, 2, 0, KVT_TIER_HOST) && in_tier(&f, 2, 1, KVT_TIER_HOST));
	CHECK(!in_tier(&f, 2, 2, KVT_TIER_HOST));

	/* a hit at 4 minutes restarts the TTL: still kept at 6 minutes */
	fake_now_us += 4 * MIN_US;
	CHECK_EQ_INT(kvt_tm_retain_refresh(f.tm, CH_LEN, (const uint8_t(*)[32])hashes[0]), CH_LEN);
	CHECK(kvt_tm_get_retention(f.tm, hashes[0][0], &ret) && ret.until_us == fake_now_us + 5 * MIN_US);
	fake_now_us += 2 * MIN_US;
	pressure(&f);
	for (int b = 0; b < CH_LEN; b++)
		CHECKF(in_tier(&f, 0, b, KVT_TIER_HOST), "refreshed block %d left T1 before its TTL", b);
	/* chain 2 had no hit: its 5 minutes are up */
	CHECK(!in_tier(&f, 2, 0, KVT_TIER_HOST) && !in_tier(&f, 2, 1, KVT_TIER_HOST));
	CHECK(!kvt_tm_get_retention(f.tm, hashes[2][0], &ret));

	/* past the restarted deadline: evicted like anything else */
	fake_now_us += 3 * MIN_US + 1;
	pressure(&f);
	for (int b = 0; b < CH_LEN; b++)
		CHECKF(!in_tier(&f, 0, b, KVT_TIER_HOST), "expired block %d still in T1", b);
	kvt_tm_tenant_stats ts[4];
	uint32_t n_ten = 0;
	kvt_tm_get_tenants(f.tm, ts, 4, &n_ten);
	CHECK_EQ_INT(n_ten, 1);
	CHECK_EQ_INT(ts[0].n_expired, CH_LEN + 2);
	CHECK_EQ_INT(ts[0].n_hits, CH_LEN);
	CHECK_EQ_INT(ts[0].n_blocks[KVT_TIER_HOST], 0);
	tm_fx_close(&f);
}

/* Count chain c's blocks present in T2. */
static int n_in_t2(fixture *f, int c)
{
	int n = 0;
	for (int b = 0; b < CH_LEN; b++)
		n += in_tier(f, c, b, KVT_TIER_NVME);
	return n;
}

static void survives_restart(void)
{
	fixture f;
	kvt_tm_retain_result r;
	kvt_tm_retention ret;
	/* T2 high watermark just above what 12 blocks take, so the restarted manager can push it */
	CHECK(fx_open(&f, true, 1.0f, 1.0f) == 0);
	for (int c = 0; c < N_CH; c++)
		compute_chain(&f, c);
	/* chain 0: retained before its rows exist (the row carries it); 24 h on NVMe */
	CHECK(kvt_tm_retain(f.tm, "alice", CH_LEN, (const uint8_t(*)[32])hashes[0], 24 * 60 * MIN_US, KVT_TIER_NVME,
			    &r) == KVT_OK && r.n_new == CH_LEN);
	CHECK(kvt_tm_flush(f.tm) == KVT_OK);
	/* chain 1: retained once its rows are durable (an update of the rows) */
	CHECK(kvt_tm_retain(f.tm, "bob", CH_LEN, (const uint8_t(*)[32])hashes[1], 60 * MIN_US, KVT_TIER_HOST, &r) ==
	      KVT_OK && r.n_new == CH_LEN);
	/* chain 3: retained, then released (a deleted session) */
	CHECK(kvt_tm_retain(f.tm, "bob", CH_LEN, (const uint8_t(*)[32])hashes[3], 60 * MIN_US, KVT_TIER_HOST, &r) ==
	      KVT_OK);
	CHECK_EQ_INT(kvt_tm_release(f.tm, CH_LEN, (const uint8_t(*)[32])hashes[3]), CH_LEN);
	CHECK(!kvt_tm_get_retention(f.tm, hashes[3][0], &ret));
	uint64_t until0 = fake_now_us + 24 * 60 * MIN_US;
	tm_fx_close(&f);

	/* restart with a T2 high watermark every block crosses: only the retained survive it */
	fake_now_us += 10 * MIN_US;
	CHECK(fx_open(&f, false, 1.0f, 0.002f) == 0);
	uint64_t n = 0;
	CHECK(kvt_tm_recover(f.tm, &n) == KVT_OK);
	CHECK_EQ_INT(n, N_CH * CH_LEN);
	for (int b = 0; b < CH_LEN; b++) {
		CHECKF(kvt_tm_get_retention(f.tm, hashes[0][b], &ret) && ret.until_us == until0 &&
			       ret.floor == KVT_TIER_NVME && !strcmp(ret.tenant, "alice"),
		       "chain 0 block %d lost its retention at the restart", b);
		CHECKF(kvt_tm_get_retention(f.tm, hashes[1][b], &ret) && !strcmp(ret.tenant, "bob") &&
			       ret.ttl_us == 60 * MIN_US,
		       "chain 1 block %d lost its retention at the restart", b);
		CHECK(!kvt_tm_get_retention(f.tm, hashes[2][b], &ret));
		CHECK(!kvt_tm_get_retention(f.tm, hashes[3][b], &ret));
	}
	kvt_tm_maintain(f.tm);
	CHECK(kvt_tm_check(f.tm) == KVT_OK);
	CHECK_EQ_INT(n_in_t2(&f, 0), CH_LEN);
	CHECK_EQ_INT(n_in_t2(&f, 1), CH_LEN);
	CHECK_EQ_INT(n_in_t2(&f, 2), 0);
	CHECK_EQ_INT(n_in_t2(&f, 3), 0);
	kvt_tm_stats st;
	kvt_tm_get_stats(f.tm, &st);
	CHECK_EQ_INT(st.retain.n_blocks, 2 * CH_LEN);
	CHECK_EQ_INT(st.retain.n_in_tier[KVT_TIER_NVME], 2 * CH_LEN);
	CHECK_EQ_INT(st.retain.n_by_floor[KVT_TIER_NVME], CH_LEN);

	/* bob's retention ends after its hour (the clock passes it): evicted at the next pass */
	fake_now_us += 55 * MIN_US;
	kvt_tm_maintain(f.tm);
	CHECK_EQ_INT(n_in_t2(&f, 1), 0);
	CHECK_EQ_INT(n_in_t2(&f, 0), CH_LEN);
	/* alice's released: gone at the next pass, and not retained after another restart */
	CHECK_EQ_INT(kvt_tm_release(f.tm, CH_LEN, (const uint8_t(*)[32])hashes[0]), CH_LEN);
	kvt_tm_maintain(f.tm);
	CHECK_EQ_INT(n_in_t2(&f, 0), 0);
	tm_fx_close(&f);
}

static void quotas(void)
{
	fixture f;
	kvt_tm_retain_result r;
	kvt_tm_retention ret;
	const uint64_t blk = kvt_kv_packed_bytes(&shape, KVT_KV_CODEC_FP8);
	CHECK(fx_open(&f, true, 1.0f, 1.0f) == 0);
	kvt_tm_quota q = { .bytes = 2 * blk };
	CHECK(kvt_tm_set_quota(f.tm, "*", &q) == KVT_OK);
	kvt_tm_quota qb = { .bytes = 4 * blk, .tier_bytes = { [KVT_TIER_NVME] = blk } };
	CHECK(kvt_tm_set_quota(f.tm, "bob", &qb) == KVT_OK);
	CHECK(kvt_tm_set_quota(f.tm, "bad/name", &qb) == KVT_EINVAL);
	for (int c = 0; c < N_CH; c++)
		compute_chain(&f, c);

	/* alice asks for 3 blocks with room for 2: the prefix of 2 is retained, the tail refused */
	CHECK(kvt_tm_retain(f.tm, "alice", CH_LEN, (const uint8_t(*)[32])hashes[0], 5 * MIN_US, KVT_TIER_HOST, &r) ==
	      KVT_OK);
	CHECK_EQ_INT(r.n_new, 2);
	CHECK_EQ_INT(r.n_denied, 1);
	CHECK(kvt_tm_get_retention(f.tm, hashes[0][1], &ret) && !kvt_tm_get_retention(f.tm, hashes[0][2], &ret));
	/* bob: 3 blocks in T1 fit his 4; one NVMe-floor block fits his per-tier quota of 1, the second does not */
	CHECK(kvt_tm_retain(f.tm, "bob", CH_LEN, (const uint8_t(*)[32])hashes[1], 5 * MIN_US, KVT_TIER_HOST, &r) ==
	      KVT_OK && r.n_new == CH_LEN && r.n_denied == 0);
	CHECK(kvt_tm_retain(f.tm, "bob", 2, (const uint8_t(*)[32])hashes[3], 5 * MIN_US, KVT_TIER_NVME, &r) == KVT_OK);
	CHECK_EQ_INT(r.n_new, 1);
	CHECK_EQ_INT(r.n_denied, 1);

	/* a minute later alice retains chain 2 (2 blocks): her own older chain 0 makes room, bob keeps all of his */
	fake_now_us += MIN_US;
	CHECK(kvt_tm_retain(f.tm, "alice", 2, (const uint8_t(*)[32])hashes[2], 5 * MIN_US, KVT_TIER_HOST, &r) ==
	      KVT_OK && r.n_new == 2 && r.n_denied == 0);
	CHECK(!kvt_tm_get_retention(f.tm, hashes[0][0], &ret) && !kvt_tm_get_retention(f.tm, hashes[0][1], &ret));
	for (int b = 0; b < CH_LEN; b++)
		CHECKF(kvt_tm_get_retention(f.tm, hashes[1][b], &ret), "bob's block %d lost retention to alice", b);
	CHECK(kvt_tm_get_retention(f.tm, hashes[3][0], &ret));

	/* the same request again only extends what it holds: nothing new, nothing lost */
	CHECK(kvt_tm_retain(f.tm, "alice", 2, (const uint8_t(*)[32])hashes[2], 5 * MIN_US, KVT_TIER_HOST, &r) ==
	      KVT_OK && r.n_new == 0 && r.n_kept == 2);

	kvt_tm_tenant_stats ts[4];
	uint32_t n_ten = 0;
	kvt_tm_get_tenants(f.tm, ts, 4, &n_ten);
	CHECK_EQ_INT(n_ten, 2);
	for (uint32_t i = 0; i < n_ten; i++) {
		uint64_t bytes = ts[i].bytes[0] + ts[i].bytes[1] + ts[i].bytes[2];
		if (!strcmp(ts[i].tenant, "alice")) {
			CHECK_EQ_INT(bytes, 2 * blk);
			CHECK_EQ_INT(ts[i].n_quota_released, 2);
			CHECK_EQ_INT(ts[i].n_denied_blocks, 1);
			CHECK_EQ_INT(ts[i].quota.bytes, 2 * blk);
			CHECK(!ts[i].quota_set);
		} else {
			CHECK(!strcmp(ts[i].tenant, "bob"));
			CHECK_EQ_INT(bytes, 4 * blk);
			CHECK_EQ_INT(ts[i].n_blocks[KVT_TIER_NVME], 1);
			CHECK_EQ_INT(ts[i].n_quota_released, 0);
			CHECK_EQ_INT(ts[i].n_denied_blocks, 1);
			CHECK(ts[i].quota_set);
		}
	}
	/* pressure: alice's chain 0 (no longer retained) leaves T1 and T2 like any other */
	tm_fx_close(&f);
}

int main(void)
{
	int probe_rc = test_dev_probe("test_manager_retain");
	if (probe_rc >= 0)
		return probe_rc;
	snprintf(dir, sizeof(dir), "/tmp/kvt_tmret_XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(t2_path, sizeof(t2_path), "%s/kvtier.t2", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);
	make_chains();
	ttl_expiry();
	unlink(db_path);
	survives_restart();
	unlink(db_path);
	quotas();
	free(data);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return check_done("test_manager_retain");
}
