/*
 * tests/test_index_db.c — the SQLite index on real files in a temp dir.
 *
 * Rows and sessions survive close/reopen; tickets and done callbacks report
 * commits; group commit batches; namespaces never mix;
 * migration from schema 1; migration from schema 4 to 5 (a block row's kind:
 * old rows prefix, a chunk row keeps its kind across reopen); a session row's durable count (put, raised
 * by a mark of the same history only); a newer schema, a second process's lock, missing,
 * truncated, garbage and corrupted files each get their own clear error;
 * one bad session row is skipped by the listing, counted and named.
 */
/* ctest-labels: unit */
#include "check.h"
#include "index.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256], g_path[512];

static kvt_db_config cfg_for(const char *path, uint8_t fp_byte)
{
	kvt_db_config c;
	memset(&c, 0, sizeof(c));
	c.path = path;
	memset(c.ns.model_fp, fp_byte, 32);
	c.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	c.ns.block_tokens = 4;
	c.create = true;
	return c;
}

static void make_row(kvt_db_block_row *r, int i, const uint8_t *parent)
{
	memset(r, 0, sizeof(*r));
	memset(r->hash, 0, 32);
	r->hash[0] = (uint8_t)(i + 1);
	r->hash[1] = (uint8_t)((i + 1) >> 8);
	r->hash[31] = 0x77;
	if (parent)
		memcpy(r->parent, parent, 32);
	else
		memset(r->parent, 0xEE, 32); /* a chain root */
	r->n_tokens = 4;
	for (int k = 0; k < 4; k++)
		r->tokens[k] = i * 4 + k - 7;
	r->loc.off = (uint64_t)i * 8192;
	r->loc.extent_bytes = 8192;
	r->loc.stored_bytes = 5000 + (uint32_t)i;
	r->loc.generation = 0xF000000000000000ull + (uint64_t)i; /* above INT64_MAX: bit pattern round trip */
	r->loc.checksum = 0xDEADBEEFCAFEF00Dull ^ (uint64_t)i;
	r->loc.compressed = (uint8_t)(i & 1);
	r->kv_dtype = 1;
	r->codec = 2;
	r->scale_layout = 3;
	r->raw_bytes = 9000;
	r->last_use = 100 + (uint64_t)i;
	r->hit_count = (uint64_t)i;
}

static atomic_int g_done_ok, g_done_fail;

static void on_done(void *user, int rc)
{
	(void)user;
	if (rc == KVT_OK)
		atomic_fetch_add(&g_done_ok, 1);
	else
		atomic_fetch_add(&g_done_fail, 1);
}

struct collect {
	int n;
	kvt_db_block_row rows[64];
};

static int collect_fn(void *ctx, const kvt_db_block_row *row)
{
	struct collect *c = ctx;
	if (c->n < 64)
		c->rows[c->n] = *row;
	c->n++;
	return 0;
}

static void test_rows_and_reopen(void)
{
	kvt_db_config c = cfg_for(g_path, 0x11);
	kvt_db *db;
	kvt_db_block_row r[10];
	uint64_t t[10], tdel;

	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	/* a chain of 10, queued children first */
	for (int i = 0; i < 10; i++)
		make_row(&r[i], i, i ? r[i - 1].hash : NULL);
	for (int i = 9; i >= 0; i--)
		CHECK(kvt_db_put_block(db, &r[i], on_done, NULL, &t[i]) == KVT_OK);
	CHECK(t[0] > t[9]);
	CHECK(kvt_db_wait(db, t[0]) == KVT_OK);
	CHECK(kvt_db_done_ticket(db) >= t[0]);
	CHECK_EQ_INT(atomic_load(&g_done_ok), 10);
	CHECK(kvt_db_delete_block(db, r[9].hash, on_done, NULL, &tdel) == KVT_OK);
	CHECK(kvt_db_touch_block(db, r[3].hash, 777, 55, NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_flush(db) == KVT_OK);
	CHECK_EQ_INT(atomic_load(&g_done_ok), 11);
	check_log_capture();
	CHECK(kvt_db_wait(db, tdel + 1000) == KVT_EINVAL); /* never handed out: an error, not a hang */
	CHECK(strstr(check_log_text, "never handed out") != NULL);
	kvt_log_set_sink(NULL, NULL);
	kvt_db_close(db);

	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	uint64_t n = 0;
	CHECK(kvt_db_count_blocks(db, 0, &n) == KVT_OK);
	CHECK_EQ_INT(n, 9);
	static struct collect col;
	col.n = 0;
	CHECK(kvt_db_for_each_block(db, 0, collect_fn, &col) == KVT_OK);
	CHECK_EQ_INT(col.n, 9);
	for (int k = 0; k < col.n && k < 9; k++) {
		const kvt_db_block_row *g = &col.rows[k];
		int i = g->hash[0] - 1; /* make_row's index */
		CHECK(g->this_ns && g->ns_id == kvt_db_ns_id(db));
		CHECKF(i >= 0 && i < 9, "row %d has hash[0] %d", k, g->hash[0]);
		if (i < 0 || i >= 9)
			continue;
		CHECK(memcmp(g->hash, r[i].hash, 32) == 0 && memcmp(g->parent, i ? r[i - 1].hash : r[0].parent, 32) == 0);
		CHECK(g->n_tokens == 4 && g->tokens[0] == r[i].tokens[0] && g->tokens[3] == r[i].tokens[3]);
		CHECK(g->loc.off == r[i].loc.off && g->loc.generation == r[i].loc.generation &&
		      g->loc.checksum == r[i].loc.checksum && g->loc.stored_bytes == r[i].loc.stored_bytes &&
		      g->loc.compressed == r[i].loc.compressed);
		CHECK(g->kv_dtype == 1 && g->codec == 2 && g->scale_layout == 3 && g->raw_bytes == 9000);
		if (i == 3)
			CHECK(g->last_use == 777 && g->hit_count == 55);
	}
	kvt_db_stats st;
	kvt_db_get_stats(db, &st);
	CHECK_EQ_INT(st.n_failed, 0);
	kvt_db_close(db);
}

static void test_namespaces(void)
{
	kvt_db_config a = cfg_for(g_path, 0x11), b = cfg_for(g_path, 0x22), l = cfg_for(g_path, 0x11);
	kvt_db *db;
	kvt_db_block_row r;
	uint64_t n = 0;

	l.ns.layout_version = 99;
	CHECK(kvt_db_open(&b, &db) == KVT_OK);
	CHECK(kvt_db_count_blocks(db, 0, &n) == KVT_OK);
	CHECK_EQ_INT(n, 0); /* another model: nothing */
	CHECK(kvt_db_count_blocks(db, KVT_DB_ALL_NS, &n) == KVT_OK);
	CHECK_EQ_INT(n, 9); /* ... but its extents are still accounted for */
	make_row(&r, 0, NULL); /* the same hash as namespace a's first block */
	r.loc.off = 1 << 20;
	CHECK(kvt_db_put_block(db, &r, NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_flush(db) == KVT_OK);
	static struct collect col;
	col.n = 0;
	CHECK(kvt_db_for_each_block(db, KVT_DB_ALL_NS, collect_fn, &col) == KVT_OK);
	CHECK_EQ_INT(col.n, 10);
	int mine = 0;
	for (int i = 0; i < col.n; i++)
		mine += col.rows[i].this_ns;
	CHECK_EQ_INT(mine, 1);
	kvt_db_close(db);
	CHECK(kvt_db_open(&b, &db) == KVT_OK);
	CHECK(kvt_db_count_blocks(db, KVT_DB_MODEL_NS, &n) == KVT_OK);
	CHECK_EQ_INT(n, 1); /* model 0x22's T2 file holds only its own row */
	kvt_db_close(db);
	CHECK(kvt_db_open(&l, &db) == KVT_OK);
	CHECK(kvt_db_count_blocks(db, 0, &n) == KVT_OK);
	CHECK_EQ_INT(n, 0); /* another layout: nothing */
	CHECK(kvt_db_count_blocks(db, KVT_DB_MODEL_NS, &n) == KVT_OK);
	CHECK_EQ_INT(n, 9); /* ... but the same model: its rows' extents share the T2 file */
	col.n = 0;
	CHECK(kvt_db_for_each_block(db, KVT_DB_MODEL_NS, collect_fn, &col) == KVT_OK);
	CHECK(col.n == 9 && !col.rows[0].this_ns);
	kvt_db_close(db);
	CHECK(kvt_db_open(&a, &db) == KVT_OK);
	col.n = 0;
	CHECK(kvt_db_for_each_block(db, 0, collect_fn, &col) == KVT_OK);
	CHECK_EQ_INT(col.n, 9);
	CHECK(col.rows[0].loc.off == 0); /* namespace b's row did not replace a's */
	kvt_db_close(db);
}

static int count_sessions(void *ctx, const kvt_db_session *s)
{
	(*(int *)ctx)++;
	return s->n_tokens == 0 ? 0 : 0;
}

static void test_sessions(void)
{
	kvt_db_config c = cfg_for(g_path, 0x11);
	kvt_db *db;
	kvt_db_session s, g;
	int32_t hist[1000];

	for (int i = 0; i < 1000; i++)
		hist[i] = i * 13 - 500;
	memset(&s, 0, sizeof(s));
	snprintf(s.id, sizeof(s.id), "conv-1");
	snprintf(s.tenant, sizeof(s.tenant), "alice");
	s.tokens = hist;
	s.n_tokens = 1000;
	memset(s.last_hash, 0xAB, 32);
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	CHECK(kvt_db_put_session(db, &s, NULL, NULL, NULL) == KVT_OK);
	/* a read sees the writes queued before it, without waiting */
	CHECK(kvt_db_get_session(db, "alice", "conv-1", &g) == KVT_OK);
	CHECK(g.n_tokens == 1000 && g.tokens[999] == hist[999] && g.last_hash[5] == 0xAB);
	CHECK(g.created > 0 && g.updated >= g.created);
	kvt_db_session_deinit(&g);
	/* another tenant does not see it */
	CHECK(kvt_db_get_session(db, "bob", "conv-1", &g) == KVT_ENOTFOUND);
	snprintf(s.tenant, sizeof(s.tenant), "bob");
	s.n_tokens = 10;
	CHECK(kvt_db_put_session(db, &s, NULL, NULL, NULL) == KVT_OK);
	snprintf(s.tenant, sizeof(s.tenant), "alice");
	snprintf(s.id, sizeof(s.id), "conv-2");
	s.n_tokens = 0;
	CHECK(kvt_db_put_session(db, &s, NULL, NULL, NULL) == KVT_OK);
	int n = 0;
	CHECK(kvt_db_list_sessions(db, NULL, count_sessions, &n) == KVT_OK);
	CHECK_EQ_INT(n, 3);
	n = 0;
	CHECK(kvt_db_list_sessions(db, "alice", count_sessions, &n) == KVT_OK);
	CHECK_EQ_INT(n, 2);
	/* update in place */
	snprintf(s.id, sizeof(s.id), "conv-1");
	s.n_tokens = 500;
	CHECK(kvt_db_put_session(db, &s, NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_delete_session(db, "bob", "conv-1", NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_flush(db) == KVT_OK);
	kvt_db_close(db);

	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	CHECK(kvt_db_get_session(db, "alice", "conv-1", &g) == KVT_OK);
	CHECK(g.n_tokens == 500 && g.tokens[499] == hist[499]);
	kvt_db_session_deinit(&g);
	CHECK(kvt_db_get_session(db, "bob", "conv-1", &g) == KVT_ENOTFOUND);
	/* bad names never reach SQL */
	check_log_capture();
	CHECK(kvt_db_get_session(db, "alice", "../../etc/passwd", &g) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "session id \"../../etc/passwd\"") != NULL);
	snprintf(s.tenant, sizeof(s.tenant), ".x");
	CHECK(kvt_db_put_session(db, &s, NULL, NULL, NULL) == KVT_EINVAL);
	CHECK(kvt_db_list_sessions(db, "a b", count_sessions, &n) == KVT_EINVAL);
	kvt_log_set_sink(NULL, NULL);
	kvt_db_close(db);
	/* another namespace sees no sessions */
	kvt_db_config o = cfg_for(g_path, 0x22);
	CHECK(kvt_db_open(&o, &db) == KVT_OK);
	CHECK(kvt_db_get_session(db, "alice", "conv-1", &g) == KVT_ENOTFOUND);
	kvt_db_close(db);
}

static void test_group_commit(void)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/gc.sqlite", g_dir);
	kvt_db_config c = cfg_for(path, 0x33);
	kvt_db *db;
	kvt_db_stats st;
	kvt_db_block_row r;

	c.max_wait_us = 2000;
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	for (int i = 0; i < 300; i++) {
		make_row(&r, i, NULL);
		CHECK(kvt_db_put_block(db, &r, NULL, NULL, NULL) == KVT_OK);
	}
	CHECK(kvt_db_flush(db) == KVT_OK);
	kvt_db_get_stats(db, &st);
	CHECK_EQ_INT(st.n_writes, 300);
	CHECKF(st.n_commits < 300 && st.max_batch_seen > 1, "%llu commits, max batch %llu",
	       (unsigned long long)st.n_commits, (unsigned long long)st.max_batch_seen);
	kvt_db_close(db);
	c.max_batch = 1;
	c.max_wait_us = 0;
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	for (int i = 0; i < 20; i++) {
		make_row(&r, i + 1000, NULL);
		CHECK(kvt_db_put_block(db, &r, NULL, NULL, NULL) == KVT_OK);
	}
	CHECK(kvt_db_flush(db) == KVT_OK);
	kvt_db_get_stats(db, &st);
	CHECK(st.n_writes == 20 && st.n_commits == 20 && st.max_batch_seen == 1);
	uint64_t n;
	CHECK(kvt_db_count_blocks(db, 0, &n) == KVT_OK && n == 320);
	kvt_db_close(db);
}

/* Schema 1 as it was written: namespaces and blocks, no sessions. */
/* How far a session's blocks are durable: put with the row, raised by a mark of the same history only. */
static void test_session_durable(void)
{
	kvt_db_config c = cfg_for(g_path, 0x33);
	kvt_db *db;
	kvt_db_session s, g;
	int32_t hist[64];
	uint8_t other[32];

	for (int i = 0; i < 64; i++)
		hist[i] = i + 1;
	memset(&s, 0, sizeof(s));
	snprintf(s.id, sizeof(s.id), "d-1");
	snprintf(s.tenant, sizeof(s.tenant), "alice");
	s.tokens = hist;
	s.n_tokens = 40;
	s.durable_tokens = 8;
	memset(s.last_hash, 0x5A, 32);
	memset(other, 0x6B, 32);
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	CHECK(kvt_db_put_session(db, &s, NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_get_session(db, "alice", "d-1", &g) == KVT_OK);
	CHECK_EQ_INT(g.durable_tokens, 8);
	kvt_db_session_deinit(&g);
	/* the blocks landed: the mark raises it */
	CHECK(kvt_db_mark_session_durable(db, "alice", "d-1", s.last_hash, 36, NULL, NULL, NULL) == KVT_OK);
	/* a mark never lowers it, one of another history changes nothing, one past the history is ignored */
	CHECK(kvt_db_mark_session_durable(db, "alice", "d-1", s.last_hash, 12, NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_mark_session_durable(db, "alice", "d-1", other, 40, NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_mark_session_durable(db, "alice", "d-1", s.last_hash, 44, NULL, NULL, NULL) == KVT_OK);
	/* a session that does not exist: nothing happens, the mark still commits */
	CHECK(kvt_db_mark_session_durable(db, "alice", "none", s.last_hash, 4, on_done, NULL, NULL) == KVT_OK);
	check_log_capture();
	CHECK(kvt_db_mark_session_durable(db, "alice", "../x", s.last_hash, 4, NULL, NULL, NULL) == KVT_EINVAL);
	kvt_log_set_sink(NULL, NULL);
	CHECK(kvt_db_flush(db) == KVT_OK);
	kvt_db_close(db);
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	CHECK(kvt_db_get_session(db, "alice", "d-1", &g) == KVT_OK);
	CHECK_EQ_INT(g.durable_tokens, 36);
	kvt_db_session_deinit(&g);
	/* the next turn's row says its own figure, and a late mark of the old turn does not apply to it */
	s.n_tokens = 64;
	s.durable_tokens = 32;
	uint8_t old[32];
	memcpy(old, s.last_hash, 32);
	memset(s.last_hash, 0x7C, 32);
	CHECK(kvt_db_put_session(db, &s, NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_mark_session_durable(db, "alice", "d-1", old, 40, NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_get_session(db, "alice", "d-1", &g) == KVT_OK);
	CHECK_EQ_INT(g.durable_tokens, 32);
	kvt_db_session_deinit(&g);
	kvt_db_close(db);
}

static void test_migration(void)
{
	char path[600];
	sqlite3 *s;
	snprintf(path, sizeof(path), "%s/v1.sqlite", g_dir);
	CHECK(sqlite3_open(path, &s) == SQLITE_OK);
	const char *v1 =
		"CREATE TABLE meta(key TEXT PRIMARY KEY, value);"
		"CREATE TABLE namespaces(id INTEGER PRIMARY KEY, model_fp BLOB NOT NULL,"
		" layout_version INTEGER NOT NULL, block_tokens INTEGER NOT NULL, created INTEGER NOT NULL,"
		" UNIQUE(model_fp, layout_version, block_tokens));"
		"CREATE TABLE blocks(id INTEGER PRIMARY KEY, ns INTEGER NOT NULL REFERENCES namespaces(id),"
		" hash BLOB NOT NULL, parent BLOB NOT NULL, tokens BLOB NOT NULL, off INTEGER NOT NULL,"
		" extent_bytes INTEGER NOT NULL, stored_bytes INTEGER NOT NULL, generation INTEGER NOT NULL,"
		" checksum INTEGER NOT NULL, compressed INTEGER NOT NULL, kv_dtype INTEGER NOT NULL,"
		" codec INTEGER NOT NULL, scale_layout INTEGER NOT NULL, raw_bytes INTEGER NOT NULL,"
		" last_use INTEGER NOT NULL, hit_count INTEGER NOT NULL, UNIQUE(ns, hash));"
		"INSERT INTO meta VALUES('schema_version', 1);"
		"INSERT INTO namespaces VALUES(1, zeroblob(32), 1, 4, 0);"
		"INSERT INTO blocks VALUES(1, 1, randomblob(32), randomblob(32), x'01000000020000000300000004000000',"
		" 4096, 8192, 100, 7, 8, 0, 0, 0, 0, 4096, 1, 0);";
	CHECK(sqlite3_exec(s, v1, NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(s);

	kvt_db_config c = cfg_for(path, 0x00); /* zeroblob fingerprint: namespace 1 */
	c.ns.layout_version = 1;
	kvt_db *db;
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	CHECK_EQ_INT(kvt_db_ns_id(db), 1);
	static struct collect col;
	col.n = 0;
	CHECK(kvt_db_for_each_block(db, 0, collect_fn, &col) == KVT_OK);
	CHECK(col.n == 1 && col.rows[0].tokens[2] == 3 && col.rows[0].loc.off == 4096);
	kvt_db_session ses;
	memset(&ses, 0, sizeof(ses));
	snprintf(ses.id, sizeof(ses.id), "s");
	snprintf(ses.tenant, sizeof(ses.tenant), "t");
	CHECK(kvt_db_put_session(db, &ses, NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_mark_session_durable(db, "t", "s", ses.last_hash, 0, NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_flush(db) == KVT_OK);
	kvt_db_close(db);
	CHECK(sqlite3_open(path, &s) == SQLITE_OK);
	sqlite3_stmt *st;
	CHECK(sqlite3_prepare_v2(s, "SELECT value FROM meta WHERE key='schema_version'", -1, &st, NULL) == SQLITE_OK);
	CHECK(sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int(st, 0) == KVT_DB_SCHEMA_VERSION);
	sqlite3_finalize(st);
	/* a newer schema is refused */
	CHECK(sqlite3_exec(s, "PRAGMA journal_mode=DELETE; UPDATE meta SET value=99 WHERE key='schema_version'", NULL,
			   NULL, NULL) == SQLITE_OK);
	sqlite3_close(s);
	check_log_capture();
	CHECK(kvt_db_open(&c, &db) == KVT_EUNSUPPORTED);
	CHECK(strstr(check_log_text, "schema version 99 is newer") != NULL);
	kvt_log_set_sink(NULL, NULL);
}

/* A schema-4 file (as kvtier wrote it before block kinds) opens, migrates to 5, and its rows are prefix blocks. */
static void test_migration_kind(void)
{
	char path[600];
	sqlite3 *s;
	snprintf(path, sizeof(path), "%s/v4.sqlite", g_dir);
	CHECK(sqlite3_open(path, &s) == SQLITE_OK);
	const char *v4 =
		"CREATE TABLE meta(key TEXT PRIMARY KEY, value);"
		"CREATE TABLE namespaces(id INTEGER PRIMARY KEY, model_fp BLOB NOT NULL,"
		" layout_version INTEGER NOT NULL, block_tokens INTEGER NOT NULL, created INTEGER NOT NULL,"
		" UNIQUE(model_fp, layout_version, block_tokens));"
		"CREATE TABLE blocks(id INTEGER PRIMARY KEY, ns INTEGER NOT NULL REFERENCES namespaces(id),"
		" hash BLOB NOT NULL, parent BLOB NOT NULL, tokens BLOB NOT NULL, off INTEGER NOT NULL,"
		" extent_bytes INTEGER NOT NULL, stored_bytes INTEGER NOT NULL, generation INTEGER NOT NULL,"
		" checksum INTEGER NOT NULL, compressed INTEGER NOT NULL, kv_dtype INTEGER NOT NULL,"
		" codec INTEGER NOT NULL, scale_layout INTEGER NOT NULL, raw_bytes INTEGER NOT NULL,"
		" last_use INTEGER NOT NULL, hit_count INTEGER NOT NULL, UNIQUE(ns, hash));"
		"CREATE TABLE sessions(ns INTEGER NOT NULL REFERENCES namespaces(id), tenant TEXT NOT NULL,"
		" id TEXT NOT NULL, tokens BLOB NOT NULL, n_tokens INTEGER NOT NULL, last_hash BLOB NOT NULL,"
		" created INTEGER NOT NULL, updated INTEGER NOT NULL, PRIMARY KEY(ns, tenant, id));"
		"ALTER TABLE blocks ADD COLUMN retain_until INTEGER NOT NULL DEFAULT 0;"
		"ALTER TABLE blocks ADD COLUMN retain_ttl INTEGER NOT NULL DEFAULT 0;"
		"ALTER TABLE blocks ADD COLUMN retain_floor INTEGER NOT NULL DEFAULT 0;"
		"ALTER TABLE blocks ADD COLUMN retain_tenant TEXT NOT NULL DEFAULT '';"
		"ALTER TABLE sessions ADD COLUMN durable_tokens INTEGER NOT NULL DEFAULT 0;"
		"INSERT INTO meta VALUES('schema_version', 4);"
		"INSERT INTO namespaces VALUES(1, zeroblob(32), 1, 4, 0);"
		"INSERT INTO blocks VALUES(1, 1, zeroblob(32), randomblob(32), x'01000000020000000300000004000000',"
		" 4096, 8192, 100, 7, 8, 0, 0, 0, 0, 4096, 1, 0, 0, 0, 0, '');";
	CHECK(sqlite3_exec(s, v4, NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(s);

	kvt_db_config c = cfg_for(path, 0x00); /* zeroblob fingerprint: namespace 1 */
	c.ns.layout_version = 1;
	kvt_db *db;
	check_log_capture();
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	CHECK(strstr(check_log_text, "migrated schema 4 -> 5") != NULL);
	kvt_log_set_sink(NULL, NULL);
	static struct collect col;
	col.n = 0;
	CHECK(kvt_db_for_each_block(db, 0, collect_fn, &col) == KVT_OK);
	CHECK(col.n == 1 && col.rows[0].tokens[3] == 4 && col.rows[0].kind == KVT_BLOCK_PREFIX);
	/* a chunk row, and a prefix row beside it */
	kvt_db_block_row r;
	make_row(&r, 5, NULL);
	r.kind = KVT_BLOCK_CHUNK;
	CHECK(kvt_db_put_block(db, &r, NULL, NULL, NULL) == KVT_OK);
	make_row(&r, 6, NULL);
	CHECK(kvt_db_put_block(db, &r, NULL, NULL, NULL) == KVT_OK);
	r.kind = KVT_BLOCK_KIND_COUNT;
	CHECK(kvt_db_put_block(db, &r, NULL, NULL, NULL) == KVT_EINVAL);
	CHECK(kvt_db_flush(db) == KVT_OK);
	kvt_db_close(db);

	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	col.n = 0;
	CHECK(kvt_db_for_each_block(db, 0, collect_fn, &col) == KVT_OK);
	CHECK_EQ_INT(col.n, 3);
	int n_chunk = 0, n_prefix = 0;
	for (int k = 0; k < col.n && k < 64; k++) {
		const kvt_db_block_row *g = &col.rows[k];
		n_chunk += g->kind == KVT_BLOCK_CHUNK;
		n_prefix += g->kind == KVT_BLOCK_PREFIX;
		if (g->hash[0] == 6) /* make_row(5): the chunk row */
			CHECKF(g->kind == KVT_BLOCK_CHUNK, "the chunk row came back as kind %u", g->kind);
	}
	CHECK(n_chunk == 1 && n_prefix == 2);
	/* a row put again with another kind takes it (the upsert carries the kind) */
	make_row(&r, 5, NULL);
	CHECK(kvt_db_put_block(db, &r, NULL, NULL, NULL) == KVT_OK);
	col.n = 0;
	CHECK(kvt_db_for_each_block(db, 0, collect_fn, &col) == KVT_OK);
	for (int k = 0; k < col.n && k < 64; k++)
		CHECK(col.rows[k].kind == KVT_BLOCK_PREFIX);
	kvt_db_close(db);
	CHECK(sqlite3_open(path, &s) == SQLITE_OK);
	sqlite3_stmt *st;
	CHECK(sqlite3_prepare_v2(s, "SELECT value FROM meta WHERE key='schema_version'", -1, &st, NULL) == SQLITE_OK);
	CHECK(sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int(st, 0) == 5);
	sqlite3_finalize(st);
	sqlite3_close(s);
}

/*
 * Holding the writer thread inside a read callback lets the test queue several
 * writes that the writer then takes as one transaction (deterministically).
 */
static atomic_int g_in_read, g_release;

static int hold_writer(void *ctx, const kvt_db_block_row *row)
{
	(void)ctx;
	(void)row;
	atomic_store(&g_in_read, 1);
	while (!atomic_load(&g_release))
		usleep(1000);
	return 0;
}

static void *reader_thread(void *arg)
{
	kvt_db_for_each_block(arg, 0, hold_writer, NULL);
	return NULL;
}

/* A failed transaction (injected with a trigger) fails its whole batch and every later write. */
static void test_failed_commit(void)
{
	char path[600];
	sqlite3 *s;
	kvt_db *db;
	kvt_db_block_row r;
	uint64_t t[3] = { 0 };
	pthread_t th;
	snprintf(path, sizeof(path), "%s/fail.sqlite", g_dir);
	kvt_db_config c = cfg_for(path, 0x44);
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	make_row(&r, 1, NULL);
	CHECK(kvt_db_put_block(db, &r, NULL, NULL, &t[0]) == KVT_OK && kvt_db_wait(db, t[0]) == KVT_OK);
	kvt_db_close(db);
	CHECK(sqlite3_open(path, &s) == SQLITE_OK);
	CHECK(sqlite3_exec(s, "CREATE TRIGGER inject BEFORE INSERT ON blocks WHEN NEW.off = 123456789"
			      " BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
			   NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(s);

	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	atomic_store(&g_done_ok, 0);
	atomic_store(&g_done_fail, 0);
	atomic_store(&g_in_read, 0);
	atomic_store(&g_release, 0);
	check_log_capture();
	/* park the writer in a read, queue good, bad, good: one transaction */
	CHECK(pthread_create(&th, NULL, reader_thread, db) == 0);
	while (!atomic_load(&g_in_read))
		usleep(1000);
	for (int i = 0; i < 3; i++) {
		make_row(&r, 10 + i, NULL);
		if (i == 1)
			r.loc.off = 123456789;
		CHECK(kvt_db_put_block(db, &r, on_done, NULL, &t[i]) == KVT_OK);
	}
	atomic_store(&g_release, 1);
	pthread_join(th, NULL);
	CHECK(t[0] && kvt_db_wait(db, t[0]) == KVT_EIO); /* rolled back with the bad row */
	CHECK(t[2] && kvt_db_wait(db, t[2]) == KVT_EIO);
	CHECK_EQ_INT(atomic_load(&g_done_fail), 3);
	CHECK_EQ_INT(atomic_load(&g_done_ok), 0);
	CHECK(strstr(check_log_text, "injected failure") != NULL);
	CHECK(strstr(check_log_text, "a transaction of 3 writes failed") != NULL);
	make_row(&r, 20, NULL);
	CHECK(kvt_db_put_block(db, &r, NULL, NULL, NULL) == KVT_EIO); /* sticky */
	CHECK(kvt_db_flush(db) == KVT_EIO);
	uint64_t n = 0;
	CHECK(kvt_db_count_blocks(db, 0, &n) == KVT_OK && n == 1); /* reads still work; nothing of the batch */
	kvt_db_stats st;
	kvt_db_get_stats(db, &st);
	CHECK_EQ_INT(st.n_failed, 3);
	kvt_log_set_sink(NULL, NULL);
	kvt_db_close(db);
}

static void copy_file(const char *from, const char *to, long keep_bytes)
{
	FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
	char buf[4096];
	long done = 0;
	size_t n;
	KVT_ASSERT(a && b);
	while ((n = fread(buf, 1, sizeof(buf), a)) > 0 && (keep_bytes < 0 || done < keep_bytes)) {
		if (keep_bytes >= 0 && done + (long)n > keep_bytes)
			n = (size_t)(keep_bytes - done);
		fwrite(buf, 1, n, b);
		done += (long)n;
	}
	fclose(a);
	fclose(b);
}

static long file_size(const char *p)
{
	struct stat sb;
	return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

static void expect_corrupt(const char *path, const char *what, const char *needle)
{
	kvt_db_config c = cfg_for(path, 0x11);
	kvt_db *db = NULL;
	check_log_capture();
	int rc = kvt_db_open(&c, &db);
	CHECKF(rc == KVT_ECORRUPT, "%s: open gave %s", what, kvt_strerror(rc));
	CHECKF(strstr(check_log_text, path) != NULL && strstr(check_log_text, "kvtier rebuild-index") != NULL,
	       "%s: log was: %s", what, check_log_text);
	if (needle)
		CHECKF(strstr(check_log_text, needle) != NULL, "%s: no \"%s\" in: %s", what, needle, check_log_text);
	if (rc == KVT_OK)
		kvt_db_close(db);
	kvt_log_set_sink(NULL, NULL);
}

static void test_bad_files(void)
{
	char p[600], big[600];
	kvt_db_config c;
	kvt_db *db;

	/* a checkpointed file with many pages, to damage */
	snprintf(big, sizeof(big), "%s/big.sqlite", g_dir);
	c = cfg_for(big, 0x11);
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	kvt_db_block_row r;
	for (int i = 0; i < 2000; i++) {
		make_row(&r, i, NULL);
		kvt_db_put_block(db, &r, NULL, NULL, NULL);
	}
	CHECK(kvt_db_flush(db) == KVT_OK);
	kvt_db_close(db); /* the last connection checkpoints the WAL into the file */
	long size = file_size(big);
	CHECKF(size > 64 * 1024, "big index is %ld bytes", size);

	snprintf(p, sizeof(p), "%s/trunc_odd.sqlite", g_dir);
	copy_file(big, p, size / 2 + 100);
	expect_corrupt(p, "truncated mid-page", "truncated");

	snprintf(p, sizeof(p), "%s/trunc_page.sqlite", g_dir);
	copy_file(big, p, (size / 2) & ~4095L);
	expect_corrupt(p, "truncated at a page boundary", NULL);

	snprintf(p, sizeof(p), "%s/tiny.sqlite", g_dir);
	copy_file(big, p, 60);
	expect_corrupt(p, "shorter than the header", "truncated");

	snprintf(p, sizeof(p), "%s/garbage.sqlite", g_dir);
	FILE *f = fopen(p, "wb");
	for (int i = 0; i < 8192; i++)
		fputc((i * 131) & 0xff, f);
	fclose(f);
	expect_corrupt(p, "not a database", "not an SQLite database");

	/* scribble over whole interior pages (headers included) */
	snprintf(p, sizeof(p), "%s/scribble.sqlite", g_dir);
	copy_file(big, p, -1);
	f = fopen(p, "r+b");
	fseek(f, 3 * 4096, SEEK_SET);
	for (int i = 0; i < 2 * 4096; i++)
		fputc((i * 7 + 3) & 0xff, f);
	fclose(f);
	expect_corrupt(p, "scribbled pages", NULL);

	/* an admin handle (no namespace) reads every row but cannot write */
	c = cfg_for(big, 0x11);
	c.ns.block_tokens = 0;
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	uint64_t n_all = 0;
	CHECK(kvt_db_count_blocks(db, KVT_DB_ALL_NS, &n_all) == KVT_OK && n_all == 2000);
	check_log_capture();
	CHECK(kvt_db_put_block(db, &r, NULL, NULL, NULL) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "no namespace") != NULL);
	kvt_log_set_sink(NULL, NULL);
	kvt_db_close(db);

	/* missing, without create */
	snprintf(p, sizeof(p), "%s/none.sqlite", g_dir);
	c = cfg_for(p, 0x11);
	c.create = false;
	check_log_capture();
	CHECK(kvt_db_open(&c, &db) == KVT_ENOTFOUND);
	CHECK(strstr(check_log_text, "none.sqlite") != NULL);

	/* held by another handle: refused, not shared */
	c = cfg_for(big, 0x11);
	kvt_db *db2 = NULL;
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	check_log_reset();
	CHECK(kvt_db_open(&c, &db2) == KVT_EIO);
	CHECK(strstr(check_log_text, "another kvtier process") != NULL);
	kvt_db_close(db);
	kvt_log_set_sink(NULL, NULL);

	/* a row with a malformed token blob is named on load */
	sqlite3 *s;
	CHECK(sqlite3_open(big, &s) == SQLITE_OK);
	CHECK(sqlite3_exec(s, "UPDATE blocks SET tokens=x'010203' WHERE id=5", NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(s);
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	static struct collect col;
	col.n = 0;
	check_log_capture();
	CHECK(kvt_db_for_each_block(db, 0, collect_fn, &col) == KVT_ECORRUPT);
	CHECK(strstr(check_log_text, "block row 5: token blob of 3 bytes") != NULL);
	kvt_log_set_sink(NULL, NULL);
	kvt_db_close(db);
}

struct name_list {
	char names[8][2 * KVT_NAME_MAX + 2]; /* "tenant/id" */
	int n;
};

static int list_names(void *ctx, const kvt_db_session *s)
{
	struct name_list *l = ctx;
	if (l->n < 8)
		snprintf(l->names[l->n++], sizeof(l->names[0]), "%s/%s", s->tenant, s->id);
	return 0;
}

/* One bad session row (issue 13 item 8): skipped, counted, named; the others list and read. */
static void test_bad_session_row(void)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/badrow.sqlite", g_dir);
	kvt_db_config c = cfg_for(path, 0x55);
	kvt_db *db;
	sqlite3 *q;
	int32_t toks[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	static const char *const ids[3] = { "a", "b", "c" };
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	for (int i = 0; i < 3; i++) {
		kvt_db_session s;
		memset(&s, 0, sizeof(s));
		snprintf(s.tenant, sizeof(s.tenant), "t1");
		snprintf(s.id, sizeof(s.id), "%s", ids[i]);
		s.tokens = toks;
		s.n_tokens = 8;
		CHECK(kvt_db_put_session(db, &s, NULL, NULL, NULL) == KVT_OK);
	}
	CHECK(kvt_db_flush(db) == KVT_OK);
	kvt_db_close(db);
	CHECK(sqlite3_open(path, &q) == SQLITE_OK);
	CHECK(sqlite3_exec(q, "UPDATE sessions SET tokens=x'010203' WHERE id='b'", NULL, NULL, NULL) == SQLITE_OK);
	sqlite3_close(q);

	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	check_log_capture();
	for (int pass = 0; pass < 2; pass++) {
		struct name_list l = { .n = 0 };
		CHECK(kvt_db_list_sessions(db, "t1", list_names, &l) == KVT_OK);
		CHECK_EQ_INT(l.n, 2);
		CHECK(l.n == 2 && !strcmp(l.names[0], "t1/a") && !strcmp(l.names[1], "t1/c"));
		l.n = 0;
		CHECK(kvt_db_list_sessions(db, NULL, list_names, &l) == KVT_OK && l.n == 2);
	}
	CHECK(strstr(check_log_text, "session t1/b tokens: token blob of 3 bytes") != NULL);
	CHECK(strstr(check_log_text, "session row 2 is unreadable") != NULL);
	kvt_db_stats st;
	kvt_db_get_stats(db, &st);
	CHECK_EQ_INT(st.n_bad_sessions, 1); /* counted once, logged once, however often it is listed */
	kvt_db_session g;
	CHECK(kvt_db_get_session(db, "t1", "a", &g) == KVT_OK && g.n_tokens == 8);
	kvt_db_session_deinit(&g);
	CHECK(kvt_db_get_session(db, "t1", "b", &g) == KVT_ECORRUPT); /* only that one */
	kvt_log_set_sink(NULL, NULL);
	kvt_db_close(db);
}

static void cleanup(void)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", g_dir);
}

int main(void)
{
	snprintf(g_dir, sizeof(g_dir), "/tmp/kvt_test_db_XXXXXX");
	if (!mkdtemp(g_dir))
		return check_skip("test_index_db", "mkdtemp failed");
	snprintf(g_path, sizeof(g_path), "%s/%s", g_dir, KVT_DATA_INDEX_FILE);
	test_rows_and_reopen();
	test_namespaces();
	test_sessions();
	test_session_durable();
	test_group_commit();
	test_migration();
	test_migration_kind();
	test_failed_commit();
	test_bad_files();
	test_bad_session_row();
	cleanup();
	return check_done("test_index_db");
}
