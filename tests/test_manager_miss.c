/* ctest-labels: unit integration */
/*
 * tests/test_manager_miss.c — why a prompt missed the cache
 * (kvt_tm_miss_explain, tiers/tm_miss.c) on a small real manager:
 *  - a full hit is NONE; only the last partial block missing is
 *    CHUNK_BOUNDARY, at the first token past the cached blocks;
 *  - a prompt that changes one token of a stored block is DIVERGED at that
 *    very token, naming the stored token and the new one; one sharing no
 *    token with anything stored is NEW;
 *  - the same tokens under another tenant's root (another salt) are NEW:
 *    nothing of the first tenant's shows;
 *  - blocks evicted from T2 by its watermark are EVICTED (tier T2, pressure
 *    watermark, a time); a retained block evicted after its TTL ran out is
 *    EXPIRED; a T2 record corrupted on disk, found at promotion, is
 *    FAILED_VERIFICATION;
 *  - without T2, blocks dropped before they were ever durable are CAPACITY,
 *    and so is a prompt whose cached prefix already fills every tier;
 *  - the reasons are counted in kvt_tm_stats.n_miss.
 */
#include "check.h"
#include "test_dev.h"
#include "tm_fixture.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

#define BT 16
#define N_T0 8
#define N_T1 6
#define N_SINGLE 40 /* one-block prompts that fill T2 past its watermark */

static const kvt_kv_layout shape = { .n_layers = 4, .n_kv_heads = 2, .head_dim = 32, .block_tokens = BT };
static char dir[256], t2_path[300], db_path[300];
static uint8_t model_fp[32] = { 7, 7, 1 };
static _Atomic uint64_t g_now_us = 1000000000ull; /* the retention clock (read by the manager's threads) */
static uint16_t *g_data;                  /* one block's bytes */
static size_t g_n_el;

static uint64_t test_clock(void *user)
{
	(void)user;
	return atomic_load(&g_now_us);
}

/* T0, T1, and T2 of capacity bytes with its watermarks at 0.5 / 0.25 (or no T2 when capacity is 0). */
static int fx_open(tm_fx *f, uint64_t capacity)
{
	memset(f, 0, sizeof(*f));
	if (tm_fx_base(&shape, N_T0, &f->dev, &f->t0, &f->bt))
		return 1;
	if (capacity) {
		kvt_t2_config tc = { .path = t2_path, .capacity_bytes = capacity, .reset = true, .buffered_ok = true };
		memcpy(tc.model_fp, model_fp, 32);
		if (kvt_t2_open(&tc, &f->t2) || tm_fx_db_open(db_path, model_fp, BT, &f->db))
			return 1;
	}
	kvt_tm_config c;
	tm_fx_config(&c, f->dev, f->t0, f->bt, f->t2, f->db, N_T1, KVT_KV_CODEC_F16);
	c.high[KVT_TIER_HBM] = c.high[KVT_TIER_HOST] = 1.0f; /* the test drives T0/T1 eviction */
	c.high[KVT_TIER_NVME] = 0.5f;
	c.low[KVT_TIER_NVME] = 0.25f;
	c.clock_us = test_clock;
	return kvt_tm_create(&c, &f->tm) != KVT_OK;
}

/* Register the n blocks of a chain (hashes from root over toks) as the engine does. */
static void compute(tm_fx *f, const uint8_t *root, const uint8_t (*h)[32], const int32_t *toks, uint32_t n)
{
	for (uint32_t b = 0; b < n; b++) {
		int32_t s;
		if (kvt_t0_alloc(f->t0, &s) != KVT_OK) {
			CHECK(kvt_tm_reserve_t0(f->tm, 1) == KVT_OK);
			CHECK(kvt_t0_alloc(f->t0, &s) == KVT_OK);
		}
		CHECK(kvt_dev_copy_h2d(f->dev, (char *)kvt_t0_layout(f->t0)->pool + (size_t)s * g_n_el * 2, g_data,
				       g_n_el * 2) == KVT_OK);
		CHECK(kvt_tm_register(f->tm, h[b], b ? h[b - 1] : root, toks + b * BT, s) == KVT_OK);
		kvt_t0_unref(f->t0, s);
	}
}

static kvt_tm_miss explain(tm_fx *f, const uint8_t *root, const uint8_t (*h)[32], const int32_t *toks,
			   uint32_t n_tokens, uint32_t n_cached)
{
	kvt_tm_miss m;
	kvt_tm_miss_explain(f->tm, root, h, toks, n_tokens, n_cached, &m);
	kvt_tm_miss_count(f->tm, m.reason);
	return m;
}

static void test_chain(tm_fx *f, const uint8_t *root, const uint8_t *root_b)
{
	enum { N = 4 };
	int32_t toks[N * BT + 5], alt[N * BT + 5];
	uint8_t h[N][32], ha[N][32], hb[N][32];
	uint32_t n = 0;
	check_rng rng = { 11 };
	for (size_t i = 0; i < N * BT + 5; i++)
		toks[i] = (int32_t)(1000 + check_rng_u64(&rng) % 20000);
	CHECK(kvt_hash_chain(root, toks, N * BT, BT, h, N, &n) == KVT_OK && n == N);
	compute(f, root, (const uint8_t(*)[32])h, toks, N);

	kvt_tm_miss m = explain(f, root, (const uint8_t(*)[32])h, toks, N * BT, N * BT);
	CHECK_EQ_INT(m.reason, KVT_TM_MISS_NONE);
	m = explain(f, root, (const uint8_t(*)[32])h, toks, N * BT + 5, N * BT);
	CHECK_EQ_INT(m.reason, KVT_TM_MISS_CHUNK_BOUNDARY);
	CHECK_EQ_INT(m.at_token, N * BT);

	/* one token of block 2 changed: diverged right there */
	memcpy(alt, toks, sizeof(alt));
	alt[2 * BT + 5] = 7;
	CHECK(kvt_hash_chain(root, alt, N * BT, BT, ha, N, &n) == KVT_OK);
	m = explain(f, root, (const uint8_t(*)[32])ha, alt, N * BT, 2 * BT);
	CHECK_EQ_INT(m.reason, KVT_TM_MISS_DIVERGED);
	CHECK_EQ_INT(m.at_token, 2 * BT + 5);
	CHECK_EQ_INT(m.cached_token, toks[2 * BT + 5]);
	CHECK_EQ_INT(m.new_token, 7);

	/* nothing in common from the first token: new */
	for (size_t i = 0; i < N * BT; i++)
		alt[i] = (int32_t)(25000 + i);
	CHECK(kvt_hash_chain(root, alt, N * BT, BT, ha, N, &n) == KVT_OK);
	m = explain(f, root, (const uint8_t(*)[32])ha, alt, N * BT, 0);
	CHECK_EQ_INT(m.reason, KVT_TM_MISS_NEW);
	CHECK_EQ_INT(m.at_token, 0);

	/* the same tokens, changed at one place, under another tenant's root: new, nothing of ours shown */
	memcpy(alt, toks, sizeof(alt));
	alt[5] = 7;
	CHECK(kvt_hash_chain(root_b, alt, N * BT, BT, hb, N, &n) == KVT_OK);
	m = explain(f, root_b, (const uint8_t(*)[32])hb, alt, N * BT, 0);
	CHECK_EQ_INT(m.reason, KVT_TM_MISS_NEW);
	CHECK_EQ_INT(m.cached_token, -1);
	/* ...while under our own root the same prompt diverges at token 5 */
	CHECK(kvt_hash_chain(root, alt, N * BT, BT, ha, N, &n) == KVT_OK);
	m = explain(f, root, (const uint8_t(*)[32])ha, alt, N * BT, 0);
	CHECK_EQ_INT(m.reason, KVT_TM_MISS_DIVERGED);
	CHECK_EQ_INT(m.at_token, 5);
}

/* N_SINGLE one-block prompts, durable, then T2's watermark evicts some: those read EVICTED. */
static void test_evicted(tm_fx *f, const uint8_t *root)
{
	static int32_t toks[N_SINGLE][BT];
	static uint8_t h[N_SINGLE][1][32];
	for (int i = 0; i < N_SINGLE; i++) {
		uint32_t n = 0;
		for (int k = 0; k < BT; k++)
			toks[i][k] = 30000 + i * BT + k;
		CHECK(kvt_hash_chain(root, toks[i], BT, BT, h[i], 1, &n) == KVT_OK);
		compute(f, root, (const uint8_t(*)[32])h[i], toks[i], 1);
		kvt_tm_retain_result rr;
		if (i == 0) /* retained for 1 s of the test clock: evicted after that, it expired */
			CHECK(kvt_tm_retain(f->tm, "t", 1, (const uint8_t(*)[32])h[i], 1000000, KVT_TIER_NVME, &rr) ==
			      KVT_OK);
	}
	CHECK(kvt_tm_flush(f->tm) == KVT_OK);
	CHECK(kvt_tm_reserve_t0(f->tm, N_T0) == KVT_OK); /* clean: the T0 copies just go */
	atomic_fetch_add(&g_now_us, 2000000);            /* block 0's retention ran out */
	kvt_tm_maintain(f->tm);                          /* T2 over its watermark: evict to 0.25 */
	uint32_t n_evicted = 0, n_expired = 0;
	for (int i = 0; i < N_SINGLE; i++) {
		kvt_btable_entry e;
		if (kvt_btable_get(f->bt, h[i][0], &e) == KVT_OK)
			continue; /* still somewhere */
		kvt_tm_miss m = explain(f, root, (const uint8_t(*)[32])h[i], toks[i], BT, 0);
		CHECK(m.reason == KVT_TM_MISS_EVICTED || m.reason == KVT_TM_MISS_EXPIRED);
		n_evicted += m.reason == KVT_TM_MISS_EVICTED;
		n_expired += m.reason == KVT_TM_MISS_EXPIRED;
		CHECK_EQ_INT(m.tier, KVT_TIER_NVME);
		CHECK_EQ_INT(m.pressure, KVT_TM_PRESSURE_WATERMARK);
		CHECK(m.when_us > 0);
		if (i == 0)
			CHECK_EQ_INT(m.reason, KVT_TM_MISS_EXPIRED);
	}
	fprintf(stderr, "test_manager_miss: %u of %d evicted, %u expired\n", n_evicted, N_SINGLE, n_expired);
	CHECK(n_evicted >= N_SINGLE / 4);
	CHECK_EQ_INT(n_expired, 1);
}

/* A durable block whose record is damaged on disk: the promotion finds it, and the miss says so. */
static void test_failed_verification(tm_fx *f, const uint8_t *root)
{
	int32_t toks[BT];
	uint8_t h[1][32];
	uint32_t n = 0;
	for (int k = 0; k < BT; k++)
		toks[k] = 20000 + 3 * k;
	CHECK(kvt_hash_chain(root, toks, BT, BT, h, 1, &n) == KVT_OK);
	compute(f, root, (const uint8_t(*)[32])h, toks, 1);
	CHECK(kvt_tm_flush(f->tm) == KVT_OK);
	CHECK(kvt_tm_reserve_t0(f->tm, N_T0) == KVT_OK);
	kvt_btable_entry e;
	CHECK(kvt_btable_get(f->bt, h[0], &e) == KVT_OK);
	CHECK(e.slot[KVT_TIER_NVME] >= 0 && e.slot[KVT_TIER_HBM] < 0 && e.slot[KVT_TIER_HOST] < 0);
	int fd = open(t2_path, O_WRONLY);
	CHECK(fd >= 0);
	uint8_t junk[64];
	memset(junk, 0x5a, sizeof(junk));
	CHECK(pwrite(fd, junk, sizeof(junk), (off_t)(e.nvme.off + 2048)) == (ssize_t)sizeof(junk));
	CHECK(fsync(fd) == 0);
	close(fd);
	int32_t slot;
	int res;
	(void)kvt_tm_promote(f->tm, 1, (const uint8_t(*)[32])h, &slot, &res);
	CHECK(res != KVT_OK);
	kvt_tm_miss m = explain(f, root, (const uint8_t(*)[32])h, toks, BT, 0);
	CHECK_EQ_INT(m.reason, KVT_TM_MISS_FAILED_VERIFICATION);
	CHECK_EQ_INT(m.tier, KVT_TIER_NVME);
}

/* No T2: what T1 pushes out was never durable (CAPACITY), and so is a prefix past every tier's room. */
static void test_capacity(const uint8_t *root)
{
	enum { N = N_T0 + N_T1 + 6 };
	tm_fx f;
	CHECK(fx_open(&f, 0) == 0);
	static int32_t toks[N * BT];
	static uint8_t h[N][32];
	uint32_t n = 0;
	for (int i = 0; i < N * BT; i++)
		toks[i] = 4000 + i;
	CHECK(kvt_hash_chain(root, toks, N * BT, BT, h, N, &n) == KVT_OK);
	compute(&f, root, (const uint8_t(*)[32])h, toks, N); /* T0 and T1 overflow: the coldest leaves go */
	uint32_t n_cap = 0;
	for (int i = 0; i < N; i++) {
		kvt_btable_entry e;
		if (kvt_btable_get(f.bt, h[i], &e) == KVT_OK &&
		    (e.slot[KVT_TIER_HBM] >= 0 || e.slot[KVT_TIER_HOST] >= 0))
			continue;
		kvt_tm_miss m = explain(&f, root, (const uint8_t(*)[32])h, toks, N * BT, (uint32_t)i * BT);
		CHECK_EQ_INT(m.reason, KVT_TM_MISS_CAPACITY);
		CHECK_EQ_INT(m.tier, KVT_TIER_HOST);
		CHECK_EQ_INT(m.pressure, KVT_TM_PRESSURE_ROOM);
		n_cap++;
	}
	CHECK(n_cap > 0);
	/* a prompt longer than every tier: its cached prefix fills them all, the next block is capacity's */
	static int32_t long_toks[(N_T0 + N_T1 + 2) * BT];
	static uint8_t lh[N_T0 + N_T1 + 2][32];
	for (size_t i = 0; i < sizeof(long_toks) / sizeof(long_toks[0]); i++)
		long_toks[i] = 9000 + (int32_t)i;
	CHECK(kvt_hash_chain(root, long_toks, (N_T0 + N_T1 + 2) * BT, BT, lh, N_T0 + N_T1 + 2, &n) == KVT_OK);
	kvt_tm_miss m = explain(&f, root, (const uint8_t(*)[32])lh, long_toks, (N_T0 + N_T1 + 2) * BT,
				(N_T0 + N_T1) * BT);
	CHECK_EQ_INT(m.reason, KVT_TM_MISS_CAPACITY);
	kvt_tm_stats st;
	kvt_tm_get_stats(f.tm, &st);
	CHECK(st.n_miss[KVT_TM_MISS_CAPACITY] == n_cap + 1);
	tm_fx_free(f.tm, f.db, f.t2, f.bt, f.t0, f.dev);
}

int main(void)
{
	int probe_rc = test_dev_probe("test_manager_miss");
	if (probe_rc >= 0)
		return probe_rc;
	snprintf(dir, sizeof(dir), "/tmp/kvt_test_miss_XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(t2_path, sizeof(t2_path), "%s/kvtier.t2", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);
	g_n_el = kvt_kv_block_bytes(&shape) / 2;
	g_data = malloc(g_n_el * 2);
	CHECK(g_data != NULL);
	check_rng rng = { 3 };
	for (size_t i = 0; i < g_n_el; i++)
		g_data[i] = kvt_f32_to_f16(check_rng_f32(&rng));
	uint8_t salt_a[32] = { 1 }, salt_b[32] = { 2 }, root[32], root_b[32];
	CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt_a, root) == KVT_OK);
	CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt_b, root_b) == KVT_OK);

	tm_fx f;
	CHECK(fx_open(&f, 1u << 20) == 0);
	test_chain(&f, root, root_b);
	test_evicted(&f, root);
	test_failed_verification(&f, root);
	kvt_tm_stats st;
	kvt_tm_get_stats(f.tm, &st);
	CHECK(st.n_miss[KVT_TM_MISS_DIVERGED] == 2 && st.n_miss[KVT_TM_MISS_NEW] == 2);
	CHECK(st.n_miss[KVT_TM_MISS_NONE] == 1 && st.n_miss[KVT_TM_MISS_CHUNK_BOUNDARY] == 1);
	CHECK(st.n_tombstones > 0);
	tm_fx_free(f.tm, f.db, f.t2, f.bt, f.t0, f.dev);
	test_capacity(root);

	free(g_data);
	unlink(t2_path);
	unlink(db_path);
	char p[320];
	snprintf(p, sizeof(p), "%s/index.sqlite-wal", dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/index.sqlite-shm", dir);
	unlink(p);
	rmdir(dir);
	return check_done("test_manager_miss");
}
