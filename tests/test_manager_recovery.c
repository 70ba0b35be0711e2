/* ctest-labels: unit integration */
/*
 * tests/test_manager_recovery.c — the start-up recovery (kvt_tm_recover, the
 * one the daemon runs through kvt_stack_open) over an index with bad rows
 * (DESIGN.md §8 item 7, issue 27 item 1).
 *
 * A chain of blocks is computed and made durable by the real manager on the
 * CPU device; then rows are added to the index by hand whose T2 extents
 * start where another row's extent starts (two rows claiming one record, as
 * a damaged or hand-edited index may hold). Start-up must not fail: the
 * bad rows are skipped, counted (kvt_tm_stats.n_skipped) and logged naming
 * the row and why, and every good row is served (promoted to T0 with its
 * bytes as computed). fsck then deletes the impostors, and the next start
 * skips nothing. On the code before the fix, kvt_tm_recover returned
 * KVT_EINVAL for such an index and kvt_stack_open failed.
 */
#include "check.h"
#include "cli_index.h"
#include "test_dev.h"
#include "tm_fixture.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_BLOCKS 6
#define BLOCK_TOKENS 4

static char g_dir[64], g_data[128], g_t2[256], g_idx[256];
static const uint8_t g_fp[32] = { 'r', 'e', 'c', 'o', 'v', 'e', 'r' };

/* ---- the fix's API, in one place ---- */
/* NOTE: the only line that names what the fix added: returning 0 here builds this test against the code
 * before the fix, to show that it fails there. */
static uint64_t tm_skipped(const kvt_tm_stats *st) { return st->n_skipped; }

typedef struct fixture {
	kvt_kv_layout shape; /* the KV block shape */
	tm_fx fx;            /* device, T0, table, T2, index, manager */
	uint64_t n_recovered; /* kvt_tm_recover's count */
} fixture;

/* As kvt_stack_open does: the index, the T2 file owned by it, the manager, then recovery. */
static int fx_open(fixture *f)
{
	memset(f, 0, sizeof(*f));
	f->shape = (kvt_kv_layout){ .n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_tokens = BLOCK_TOKENS };
	if (tm_fx_base(&f->shape, 8, &f->fx.dev, &f->fx.t0, &f->fx.bt))
		return KVT_EINVAL;
	int rc = tm_fx_db_open(g_idx, g_fp, BLOCK_TOKENS, &f->fx.db);
	if (rc)
		return rc;
	kvt_t2_config tc = { .path = g_t2, .capacity_bytes = 1 << 20, .io_mode = KVT_T2_IO_AUTO, .buffered_ok = true,
			     .max_raw_bytes = (uint32_t)kvt_kv_packed_bytes(&f->shape, KVT_KV_CODEC_F16) };
	memcpy(tc.model_fp, g_fp, 32);
	kvt_db_owner_id(f->fx.db, tc.owner_id);
	if ((rc = kvt_t2_open(&tc, &f->fx.t2)))
		return rc;
	kvt_tm_config c;
	tm_fx_config(&c, f->fx.dev, f->fx.t0, f->fx.bt, f->fx.t2, f->fx.db, 4, KVT_KV_CODEC_F16);
	c.high[KVT_TIER_NVME] = 1.0f;
	c.low[KVT_TIER_NVME] = 0.9f;
	if ((rc = kvt_tm_create(&c, &f->fx.tm)))
		return rc;
	return kvt_tm_recover(f->fx.tm, &f->n_recovered);
}

static void fx_close(fixture *f)
{
	tm_fx_close(&f->fx);
	memset(f, 0, sizeof(*f));
}

/* The chain: tokens, hashes and each block's fp16 bytes. */
typedef struct chain {
	uint8_t root[32];                       /* the chain's root hash */
	uint8_t hash[N_BLOCKS][32];             /* block hashes */
	int32_t tok[N_BLOCKS * BLOCK_TOKENS];   /* token ids */
	uint16_t *bytes;                        /* [N_BLOCKS][n_el] fp16 KV, as computed */
	size_t n_el;                            /* fp16 elements per block */
} chain;

static void chain_make(chain *c, const fixture *f)
{
	check_rng r = { 27 };
	uint8_t salt[32] = { 27 };
	uint32_t got;
	c->n_el = kvt_kv_block_bytes(&f->shape) / 2;
	c->bytes = malloc(N_BLOCKS * c->n_el * 2);
	KVT_ASSERT(c->bytes);
	for (uint32_t i = 0; i < N_BLOCKS * BLOCK_TOKENS; i++)
		c->tok[i] = (int32_t)(check_rng_u64(&r) % 30000);
	for (size_t i = 0; i < N_BLOCKS * c->n_el; i++)
		c->bytes[i] = kvt_f32_to_f16(check_rng_f32(&r));
	CHECK(kvt_hash_root(g_fp, KVT_KV_LAYOUT_VERSION, BLOCK_TOKENS, (uint8_t *)salt, c->root) == KVT_OK);
	CHECK(kvt_hash_chain(c->root, c->tok, N_BLOCKS * BLOCK_TOKENS, BLOCK_TOKENS, c->hash, N_BLOCKS, &got) ==
		      KVT_OK &&
	      got == N_BLOCKS);
}

/* The engine computes every block of the chain, the turn ends, and they are flushed (rows committed). */
static void compute_persist(fixture *f, const chain *c)
{
	for (uint32_t b = 0; b < N_BLOCKS; b++) {
		int32_t s;
		if (kvt_t0_alloc(f->fx.t0, &s) != KVT_OK) {
			CHECK(kvt_tm_reserve_t0(f->fx.tm, 1) == KVT_OK);
			CHECK(kvt_t0_alloc(f->fx.t0, &s) == KVT_OK);
		}
		CHECK(kvt_dev_copy_h2d(f->fx.dev, (char *)kvt_t0_layout(f->fx.t0)->pool + (size_t)s * c->n_el * 2,
				       c->bytes + b * c->n_el, c->n_el * 2) == KVT_OK);
		CHECK(kvt_tm_register(f->fx.tm, c->hash[b], b ? c->hash[b - 1] : c->root, c->tok + b * BLOCK_TOKENS, s) ==
		      KVT_OK);
		kvt_t0_unref(f->fx.t0, s);
	}
	kvt_tm_end_turn(f->fx.tm);
	CHECK(kvt_tm_flush(f->fx.tm) == KVT_OK);
}

/* Promote every block of the chain and compare its bytes: how many came back as computed. */
static uint32_t promote_equal(fixture *f, const chain *c)
{
	uint32_t n_eq = 0;
	uint16_t *out = malloc(c->n_el * 2);
	KVT_ASSERT(out);
	for (uint32_t b = 0; b < N_BLOCKS; b++) {
		int32_t slot;
		int res;
		if (kvt_tm_promote(f->fx.tm, 1, (const uint8_t(*)[32])c->hash[b], &slot, &res) != KVT_OK || res != KVT_OK)
			continue;
		CHECK(kvt_dev_copy_d2h(f->fx.dev, out, (char *)kvt_t0_layout(f->fx.t0)->pool + (size_t)slot * c->n_el * 2,
				       c->n_el * 2) == KVT_OK);
		n_eq += memcmp(out, c->bytes + b * c->n_el, c->n_el * 2) == 0;
		kvt_t0_unref(f->fx.t0, slot);
		CHECK(kvt_tm_reserve_t0(f->fx.tm, 8) == KVT_OK);
	}
	free(out);
	return n_eq;
}

/* A row with hash `hash` claiming block `of`'s extent (its start, its length), its tokens and parent. */
static void add_impostor(const uint8_t of[32], const uint8_t hash[32])
{
	sqlite3 *s;
	sqlite3_stmt *st;
	CHECK(sqlite3_open(g_idx, &s) == SQLITE_OK);
	CHECK(sqlite3_prepare_v2(s,
				 "INSERT INTO blocks(ns, hash, parent, tokens, off, extent_bytes, stored_bytes,"
				 " generation, checksum, compressed, kv_dtype, codec, scale_layout, raw_bytes, last_use,"
				 " hit_count) SELECT ns, ?2, parent, tokens, off, extent_bytes, stored_bytes,"
				 " generation, checksum, compressed, kv_dtype, codec, scale_layout, raw_bytes, last_use + 1,"
				 " hit_count FROM blocks WHERE hash=?1",
				 -1, &st, NULL) == SQLITE_OK);
	sqlite3_bind_blob(st, 1, of, 32, SQLITE_STATIC);
	sqlite3_bind_blob(st, 2, hash, 32, SQLITE_STATIC);
	CHECK(sqlite3_step(st) == SQLITE_DONE);
	CHECK_EQ_INT(sqlite3_changes(s), 1);
	sqlite3_finalize(st);
	sqlite3_close(s);
}

static uint64_t rows_all(fixture *f)
{
	uint64_t n = 0;
	CHECK(kvt_db_count_blocks(f->fx.db, KVT_DB_MODEL_NS, &n) == KVT_OK);
	return n;
}

int main(void)
{
	int probe_rc = test_dev_probe("test_manager_recovery");
	if (probe_rc >= 0)
		return probe_rc;
	snprintf(g_dir, sizeof(g_dir), "/tmp/kvt_mrecov_XXXXXX");
	if (!mkdtemp(g_dir))
		return check_skip("test_manager_recovery", "mkdtemp failed");
	snprintf(g_data, sizeof(g_data), "%s/data", g_dir);
	mkdir(g_data, 0755);
	snprintf(g_t2, sizeof(g_t2), "%s/%s", g_data, KVT_DATA_T2_FILE);
	snprintf(g_idx, sizeof(g_idx), "%s/%s", g_data, KVT_DATA_INDEX_FILE);

	fixture f;
	chain c;
	kvt_tm_stats st;
	CHECK(fx_open(&f) == KVT_OK);
	chain_make(&c, &f);
	compute_persist(&f, &c);
	fx_close(&f);

	/* two impostors: rows whose extents start where blocks 1's and 3's start. NOTE: of two rows claiming
	 * one extent the one walked first keeps it (tiers/recover.c); the impostors' hashes sort after every
	 * real one and their ids are the newest, so they are walked last in either order the index may use. */
	uint8_t bad[2][32];
	char bad_hex[2][65];
	for (int i = 0; i < 2; i++) {
		memset(bad[i], 0xFF, 32);
		bad[i][31] = (uint8_t)(0xFE + i);
		kvt_hash_hex(bad[i], bad_hex[i]);
	}
	add_impostor(c.hash[1], bad[0]);
	add_impostor(c.hash[3], bad[1]);

	/* start-up succeeds: the impostors are skipped, counted and named; the good rows are served */
	check_log_capture();
	int rc = fx_open(&f);
	kvt_log_set_sink(NULL, NULL);
	CHECKF(rc == KVT_OK, "start-up over an index with overlapping rows: %s", kvt_strerror(rc));
	if (rc == KVT_OK) {
		kvt_tm_get_stats(f.fx.tm, &st);
		CHECKF(f.n_recovered == N_BLOCKS && tm_skipped(&st) == 2 && st.n_lost == 0,
		       "%llu recovered, %llu skipped, %llu lost (want %d, 2, 0)", (unsigned long long)f.n_recovered,
		       (unsigned long long)tm_skipped(&st), (unsigned long long)st.n_lost, N_BLOCKS);
		for (int i = 0; i < 2; i++)
			CHECKF(strstr(check_log_text, bad_hex[i]) && strstr(check_log_text, "overlaps"),
			       "the log names skipped row %d and why: %s", i, check_log_text);
		CHECK_EQ_INT(promote_equal(&f, &c), N_BLOCKS);
		kvt_btable_entry e;
		CHECK(kvt_btable_get(f.fx.bt, bad[0], &e) == KVT_ENOTFOUND); /* never served */
		CHECK(kvt_btable_get(f.fx.bt, bad[1], &e) == KVT_ENOTFOUND);
		CHECK_EQ_INT(rows_all(&f), N_BLOCKS + 2); /* recovery deletes nothing it skips: fsck decides */
	}
	fx_close(&f);

	/* fsck deletes the impostors; the next start skips nothing and serves everything */
	kvt_fsck_stats fs;
	kvt_log_set_level(-1); /* the store logs each bad record */
	CHECK(kvt_index_fsck(g_data, true, &fs) == KVT_OK);
	kvt_log_set_level(KVT_LOG_INFO);
	CHECKF(fs.n_bad == 2 && fs.n_deleted == 2 && fs.n_ok == N_BLOCKS, "fsck: %llu bad, %llu deleted, %llu ok",
	       (unsigned long long)fs.n_bad, (unsigned long long)fs.n_deleted, (unsigned long long)fs.n_ok);
	CHECK(fx_open(&f) == KVT_OK);
	if (f.fx.tm) {
		kvt_tm_get_stats(f.fx.tm, &st);
		CHECK(f.n_recovered == N_BLOCKS && tm_skipped(&st) == 0);
		CHECK_EQ_INT(promote_equal(&f, &c), N_BLOCKS);
	}
	fx_close(&f);
	free(c.bytes);

	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", g_dir);
	return check_done("test_manager_recovery");
}
