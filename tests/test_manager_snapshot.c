/* ctest-labels: unit */
/*
 * tests/test_manager_snapshot.c — blocks out of the tiers as records and back
 * in (tiers/tm_snapshot.c: kvt_tm_block_export / kvt_tm_block_import, what a
 * slot snapshot is made of), over the real pieces: the CPU device, T0 pools,
 * block tables and T1 pools of two managers, no NVMe tier.
 *  - export: a block in T0 (packed through the mover) and the same block
 *    once in T1 give the same record; a block in no tier is KVT_ENOTFOUND;
 *  - import into another manager under another chain (another tenant salt,
 *    as another daemon's secret makes): the blocks enter T1, dirty, and
 *    promote to T0 bit for bit (f16); a second import changes nothing;
 *  - a host tier of two slots takes four imports by making room (the table
 *    and the manager stay consistent);
 *  - refusals, each leaving the table without the block: a flipped payload
 *    byte (checksum), another model fingerprint, tokens that are not the
 *    history's, a manager of another codec (FP8).
 */
#include "check.h"
#include "manager.h"
#include "test_dev.h"
#include "tm_fixture.h"

#include <stdlib.h>

#define BT 16     /* tokens per block */
#define N_T0 8    /* T0 slots */
#define N_T1 16   /* T1 slots */
#define N_B 4     /* blocks in the chain */

static const kvt_kv_layout shape = { .n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_tokens = BT };
static uint8_t model_fp[32] = { 9, 1, 9 };
static int32_t toks[N_B * BT];
static uint8_t roots[3][32], hashes[3][N_B][32]; /* the chain under three tenant salts */
static uint16_t *data;                          /* [N_B][n_el] fp16 contents */
static size_t n_el;                             /* elements of a block */

typedef struct fixture {
	kvt_dev *dev;    /* the test device */
	kvt_t0_pool *t0; /* T0 */
	kvt_btable *bt;  /* the table */
	kvt_tm *tm;      /* the manager, with its T1 pool */
} fixture;

static void make_chain(void)
{
	check_rng rng = { 4242 };
	uint32_t n;
	for (int i = 0; i < N_B * BT; i++)
		toks[i] = (int32_t)(check_rng_u64(&rng) % 30000);
	for (int k = 0; k < 3; k++) {
		uint8_t salt[32] = { (uint8_t)(k + 1) };
		CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt, roots[k]) == KVT_OK);
		CHECK(kvt_hash_chain(roots[k], toks, N_B * BT, BT, hashes[k], N_B, &n) == KVT_OK && n == N_B);
	}
	n_el = kvt_kv_block_bytes(&shape) / 2;
	data = malloc(N_B * n_el * 2);
	for (size_t i = 0; i < N_B * n_el; i++)
		data[i] = kvt_f32_to_f16(check_rng_f32(&rng) * 4.0f - 2.0f);
}

static const uint8_t *parent_of(int k, int b) { return b ? hashes[k][b - 1] : roots[k]; }

static int fx_open_n(fixture *f, int codec, uint32_t n_t1)
{
	memset(f, 0, sizeof(*f));
	if (tm_fx_base(&shape, N_T0, &f->dev, &f->t0, &f->bt))
		return 1;
	kvt_tm_config c;
	tm_fx_config(&c, f->dev, f->t0, f->bt, NULL, NULL, n_t1, codec);
	c.high[KVT_TIER_HBM] = c.high[KVT_TIER_HOST] = 1.0f;
	c.batch_blocks = 4;
	return kvt_tm_create(&c, &f->tm) != KVT_OK;
}

static int fx_open(fixture *f, int codec)
{
	return fx_open_n(f, codec, N_T1);
}

static void fx_close(fixture *f)
{
	tm_fx_free(f->tm, NULL, NULL, f->bt, f->t0, f->dev);
}

/* The engine computes block b of chain k: its bytes in a fresh T0 slot, registered. */
static void compute(fixture *f, int k, int b)
{
	int32_t s;
	CHECK(kvt_t0_alloc(f->t0, &s) == KVT_OK);
	CHECK(kvt_dev_copy_h2d(f->dev, (char *)kvt_t0_layout(f->t0)->pool + (size_t)s * n_el * 2, data + b * n_el,
			       n_el * 2) == KVT_OK);
	CHECK(kvt_tm_register(f->tm, hashes[k][b], parent_of(k, b), toks + b * BT, s) == KVT_OK);
	kvt_t0_unref(f->t0, s);
}

static bool in_table(fixture *f, const uint8_t *h, kvt_btable_entry *e)
{
	return kvt_btable_get(f->bt, h, e) == KVT_OK;
}

/* Promote chain k's blocks in f and compare them with data, bit for bit. */
static void promote_equal(fixture *f, int k)
{
	int32_t slots[N_B];
	int res[N_B];
	uint16_t *out = malloc(n_el * 2);
	CHECK(kvt_tm_promote(f->tm, N_B, (const uint8_t(*)[32])hashes[k], slots, res) == KVT_OK);
	for (int b = 0; b < N_B; b++) {
		CHECKF(res[b] == KVT_OK, "block %d promoted: %s", b, kvt_strerror(res[b]));
		if (res[b] != KVT_OK)
			continue;
		CHECK(kvt_dev_copy_d2h(f->dev, out, (char *)kvt_t0_layout(f->t0)->pool + (size_t)slots[b] * n_el * 2,
				       n_el * 2) == KVT_OK);
		CHECKF(!memcmp(out, data + b * n_el, n_el * 2), "block %d comes back bit for bit", b);
		kvt_t0_unref(f->t0, slots[b]);
	}
	free(out);
}

static void round_trip(void)
{
	fixture a, b;
	CHECK(fx_open(&a, KVT_KV_CODEC_F16) == 0 && fx_open(&b, KVT_KV_CODEC_F16) == 0);
	uint8_t *rec[N_B] = { 0 }, *rec0 = NULL;
	size_t n_rec[N_B] = { 0 }, n0 = 0;
	for (int i = 0; i < N_B; i++)
		compute(&a, 0, i);
	CHECK(kvt_tm_block_export(a.tm, model_fp, hashes[0][0], &rec0, &n0) == KVT_OK); /* from T0 */
	CHECK(kvt_tm_reserve_t0(a.tm, N_T0) == KVT_OK);                                   /* all to T1 */
	kvt_btable_entry e;
	CHECK(in_table(&a, hashes[0][0], &e) && e.slot[KVT_TIER_HBM] < 0 && e.slot[KVT_TIER_HOST] >= 0);
	for (int i = 0; i < N_B; i++) {
		CHECK(kvt_tm_block_export(a.tm, model_fp, hashes[0][i], &rec[i], &n_rec[i]) == KVT_OK);
		CHECK(n_rec[i] > 0 && n_rec[i] <= kvt_tm_record_max_bytes(a.tm));
	}
	CHECK(n0 == n_rec[0] && !memcmp(rec0, rec[0], n0)); /* T0 packed = T1's bytes */
	uint8_t *none = NULL;
	size_t n_none = 0;
	CHECK(kvt_tm_block_export(a.tm, model_fp, hashes[1][0], &none, &n_none) == KVT_ENOTFOUND && !none);

	/* into b, under another tenant's chain over the same tokens */
	for (int i = 0; i < N_B; i++) {
		const char *why = "";
		int rc = kvt_tm_block_import(b.tm, model_fp, rec[i], n_rec[i], hashes[1][i], parent_of(1, i),
					     toks + i * BT, BT, &why);
		CHECKF(rc == KVT_OK, "import block %d: %s (%s)", i, kvt_strerror(rc), why);
		CHECK(in_table(&b, hashes[1][i], &e) && e.slot[KVT_TIER_HOST] >= 0 && e.dirty);
		CHECK(!memcmp(e.parent, parent_of(1, i), 32));
	}
	const char *why = "";
	CHECK(kvt_tm_block_import(b.tm, model_fp, rec[0], n_rec[0], hashes[1][0], roots[1], toks, BT, &why) ==
	      KVT_OK); /* already there: unchanged */
	promote_equal(&b, 1);

	/* refusals: the block stays out of the table */
	uint8_t *bad = malloc(n_rec[1]);
	memcpy(bad, rec[1], n_rec[1]);
	bad[n_rec[1] - 7] ^= 0x10;
	CHECK(kvt_tm_block_import(b.tm, model_fp, bad, n_rec[1], hashes[2][1], parent_of(2, 1), toks + BT, BT, &why) ==
	      KVT_ECORRUPT);
	CHECKF(why[0], "a reason for the flipped byte");
	CHECK(!in_table(&b, hashes[2][1], &e));
	uint8_t other_fp[32] = { 1 };
	CHECK(kvt_tm_block_import(b.tm, other_fp, rec[1], n_rec[1], hashes[2][1], parent_of(2, 1), toks + BT, BT,
				  &why) == KVT_ECORRUPT);
	CHECK(kvt_tm_block_import(b.tm, model_fp, rec[1], n_rec[1], hashes[2][1], parent_of(2, 1), toks, BT, &why) ==
	      KVT_EINVAL); /* block 0's tokens for block 1 */
	CHECK(!in_table(&b, hashes[2][1], &e));
	CHECK(kvt_tm_block_import(b.tm, model_fp, rec[1], n_rec[1] / 2, hashes[2][1], parent_of(2, 1), toks + BT, BT,
				  &why) == KVT_ECORRUPT); /* cut short */

	fixture t; /* a host tier of 2 slots: the imports make room (dropping the coldest leaf: no T2 below) */
	CHECK(fx_open_n(&t, KVT_KV_CODEC_F16, 2) == 0);
	for (int i = 0; i < N_B; i++) {
		int rc = kvt_tm_block_import(t.tm, model_fp, rec[i], n_rec[i], hashes[2][i], parent_of(2, i),
					     toks + i * BT, BT, &why);
		CHECKF(rc == KVT_OK || rc == KVT_EFULL, "import %d into a full host tier: %s", i, kvt_strerror(rc));
	}
	CHECK(kvt_btable_check(t.bt) == KVT_OK && kvt_tm_check(t.tm) == KVT_OK);
	kvt_tm_stats ts;
	kvt_tm_get_stats(t.tm, &ts);
	CHECK(ts.tier[KVT_TIER_HOST].used_blocks <= 2);
	fx_close(&t);

	fixture c; /* a manager of another codec */
	CHECK(fx_open(&c, KVT_KV_CODEC_FP8) == 0);
	CHECK(kvt_tm_block_import(c.tm, model_fp, rec[0], n_rec[0], hashes[2][0], roots[2], toks, BT, &why) ==
	      KVT_EINVAL);
	CHECKF(strstr(why, "codec") != NULL, "the codec is named: %s", why);
	CHECK(!in_table(&c, hashes[2][0], &e));
	fx_close(&c);

	free(bad);
	free(rec0);
	for (int i = 0; i < N_B; i++)
		free(rec[i]);
	fx_close(&a);
	fx_close(&b);
}

int main(void)
{
	int probe_rc = test_dev_probe("test_manager_snapshot");
	if (probe_rc >= 0)
		return probe_rc;
	make_chain();
	round_trip();
	free(data);
	return check_done("test_manager_snapshot");
}
