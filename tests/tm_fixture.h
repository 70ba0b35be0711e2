/*
 * tests/tm_fixture.h — the pieces the tiering-manager tests (test_manager_tiers,
 * test_manager_retain, test_t2_disk) build a kvt_tm over: the test device (one
 * thread), a T0 pool and the hot table; the SQLite index's namespace for a model
 * fingerprint and block size; the manager's wiring; and the close in reverse
 * order. Each test keeps its own fixture struct and sets its own knobs (codec,
 * watermarks, persistence) on the config this fills.
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

/* tm_fx_free of a whole tm_fx. */
static inline void tm_fx_close(tm_fx *f)
{
	tm_fx_free(f->tm, f->db, f->t2, f->bt, f->t0, f->dev);
}

#endif
