/*
 * tests/tm_fixture.h — the pieces the tiering-manager tests (test_manager_tiers,
 * test_manager_retain, test_t2_disk) build a kvt_tm over: the test device (one
 * thread), a T0 pool and the hot table; the SQLite index's namespace for a model
 * fingerprint and block size; the manager's wiring; and the close in reverse
 * order. Each test keeps its own fixture struct and sets its own knobs (codec,
 * watermarks, persistence) on the config this fills.
 *
 * tm_fx_recover is the start-up recovery as the daemon runs it (kvt_tm_recover)
 * for the tests that hold only an index, a T2 store and a table
 * (test_index_recovery, test_crash_index): a manager is made around them for
 * the recovery and destroyed after it.
 */
#ifndef KVT_TEST_TM_FIXTURE_H
#define KVT_TEST_TM_FIXTURE_H

#include "index.h"
#include "manager.h"
#include "test_dev.h"
#include "tiers.h"

#include <string.h>

/* A manager over T2 and the index, for the tests that need nothing more. */
typedef struct tm_fx {
	kvt_dev *dev;       /* the test device */
	kvt_t0_pool *t0;    /* T0 */
	kvt_btable *bt;     /* hot table */
	kvt_t2_store *t2;   /* NVMe tier */
	kvt_db *db;         /* SQLite index */
	kvt_tm *tm;         /* the manager */
} tm_fx;

/* The device, a T0 pool of n_t0 blocks of shape, and the hot table; 0, or 1 on failure. */
static inline int tm_fx_base(const kvt_kv_layout *shape, uint32_t n_t0, kvt_dev **dev, kvt_t0_pool **t0,
			     kvt_btable **bt)
{
	kvt_dev_config dc = { .kind = test_dev_kind(), .n_threads = 1 };
	return kvt_dev_create(&dc, dev) || kvt_t0_create(*dev, shape, n_t0, t0) ||
	       kvt_btable_create(shape->block_tokens, 0, bt);
}

/* The index at path (created if absent) for model_fp and block_tokens; kvt_db_open's result. */
static inline int tm_fx_db_open(const char *path, const uint8_t model_fp[32], uint32_t block_tokens, kvt_db **db)
{
	kvt_db_config dbc = { .path = path, .create = true };
	memcpy(dbc.ns.model_fp, model_fp, 32);
	dbc.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	dbc.ns.block_tokens = block_tokens;
	return kvt_db_open(&dbc, db);
}

/* The manager's defaults wired to the pieces (borrowed), with t1_slots of codec and a slow poll (the tests drive maintenance). */
static inline void tm_fx_config(kvt_tm_config *c, kvt_dev *dev, kvt_t0_pool *t0, kvt_btable *bt, kvt_t2_store *t2,
				kvt_db *db, uint32_t t1_slots, int codec)
{
	kvt_tm_config_default(c);
	c->dev = dev;
	c->t0 = t0;
	c->bt = bt;
	c->t2 = t2;
	c->db = db;
	c->t1_slots = t1_slots;
	c->t1_codec = codec;
	c->poll_s = 5.0;
}

/* Destroy the manager and its pieces, the manager first (each may be NULL). */
static inline void tm_fx_free(kvt_tm *tm, kvt_db *db, kvt_t2_store *t2, kvt_btable *bt, kvt_t0_pool *t0, kvt_dev *dev)
{
	kvt_tm_destroy(tm);
	kvt_db_close(db);
	kvt_t2_close(t2);
	kvt_btable_destroy(bt);
	kvt_t0_destroy(t0);
	kvt_dev_destroy(dev);
}

/* The counts of one tm_fx_recover. */
typedef struct tm_fx_recovery {
	uint64_t n_loaded;  /* kvt_tm_recover's *n_blocks: blocks entered in the table */
	uint64_t n_skipped; /* kvt_tm_stats.n_skipped: bad rows skipped */
	uint64_t n_lost;    /* kvt_tm_stats.n_lost: rows whose records are gone (deleted) */
} tm_fx_recovery;

/*
 * Run the start-up recovery (kvt_tm_recover) over db and t2 into bt (all
 * borrowed; bt's block size is the namespace's): a manager on the test
 * device, a small T0 of bt's block size and a T1 of 4 slots, no T2
 * eviction, its threads stopped again before this returns (so a test may
 * fork after it). What recovery did to t2 (extents marked used), bt (blocks
 * loaded) and db (lost rows deleted) stays. kvt_tm_recover's result, or the
 * first failure making the manager; *out filled on KVT_OK.
 */
static inline int tm_fx_recover(kvt_db *db, kvt_t2_store *t2, kvt_btable *bt, tm_fx_recovery *out)
{
	kvt_kv_layout shape = { .n_layers = 1, .n_kv_heads = 1, .head_dim = 32,
				.block_tokens = kvt_btable_block_tokens(bt) };
	kvt_dev_config dc = { .kind = test_dev_kind(), .n_threads = 1 };
	kvt_dev *dev = NULL;
	kvt_t0_pool *t0 = NULL;
	kvt_tm *tm = NULL;
	kvt_tm_config c;
	kvt_tm_stats st;
	uint64_t n = 0;
	int rc = kvt_dev_create(&dc, &dev);
	if (rc == KVT_OK)
		rc = kvt_t0_create(dev, &shape, 4, &t0);
	if (rc == KVT_OK) {
		tm_fx_config(&c, dev, t0, bt, t2, db, 4, KVT_KV_CODEC_F16);
		c.high[KVT_TIER_NVME] = 1.0f; /* recovery only: nothing is evicted */
		c.low[KVT_TIER_NVME] = 0.99f;
		rc = kvt_tm_create(&c, &tm);
	}
	if (rc == KVT_OK)
		rc = kvt_tm_recover(tm, &n);
	if (rc == KVT_OK) {
		kvt_tm_get_stats(tm, &st);
		out->n_loaded = n;
		out->n_skipped = st.n_skipped;
		out->n_lost = st.n_lost;
	}
	kvt_tm_destroy(tm);
	kvt_t0_destroy(t0);
	kvt_dev_destroy(dev);
	return rc;
}

/* tm_fx_free of a whole tm_fx. */
static inline void tm_fx_close(tm_fx *f)
{
	tm_fx_free(f->tm, f->db, f->t2, f->bt, f->t0, f->dev);
}

#endif
