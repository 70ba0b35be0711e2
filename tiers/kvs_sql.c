/*
 * tiers/kvs_sql.c — the key-value store's index: DATA_DIR/store.sqlite, one
 * row per value on NVMe (kvstore.h). Written by the writer thread alone
 * (kvs_writer.c), read whole at open.
 *
 * Schema (PRAGMA user_version 1):
 *   kvs(ns TEXT, key BLOB, version INTEGER, vlen INTEGER, xxh3 INTEGER,
 *       expires_ms INTEGER, locs BLOB, PRIMARY KEY (ns, key)) WITHOUT ROWID
 * locs: one 33-byte little-endian entry per chunk, in order: off u64,
 * extent_bytes u32, stored_bytes u32, generation u64, checksum u64,
 * compressed u8. xxh3 is the XXH3-64 of the whole value (stored as the
 * signed 64-bit integer with the same bits).
 * journal_mode WAL, synchronous FULL: a commit that returned is on disk.
 */
#include "kvs_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOC_BYTES 33u
#define SCHEMA_VERSION 1

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static void loc_encode(uint8_t *p, const kvt_t2_loc *l)
{
	put_le(p, l->off, 8);
	put_le(p + 8, l->extent_bytes, 4);
	put_le(p + 12, l->stored_bytes, 4);
	put_le(p + 16, l->generation, 8);
	put_le(p + 24, l->checksum, 8);
	p[32] = l->compressed;
}

static void loc_decode(const uint8_t *p, kvt_t2_loc *l)
{
	l->off = get_le(p, 8);
	l->extent_bytes = (uint32_t)get_le(p + 8, 4);
	l->stored_bytes = (uint32_t)get_le(p + 12, 4);
	l->generation = get_le(p + 16, 8);
	l->checksum = get_le(p + 24, 8);
	l->compressed = p[32];
}

static int sql_err(kvt_kvs *s, int rc, const char *what)
{
	KVT_LOGE("store: %s/store.sqlite: %s: %s", s->dir, what, s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc));
	return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB ? KVT_ECORRUPT : KVT_EIO;
}

static int exec(kvt_kvs *s, const char *q)
{
	int rc = sqlite3_exec(s->db, q, NULL, NULL, NULL);
	return rc == SQLITE_OK ? KVT_OK : sql_err(s, rc, q);
}

static int schema(kvt_kvs *s)
{
	sqlite3_stmt *st;
	int rc = sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &st, NULL);
	if (rc != SQLITE_OK)
		return sql_err(s, rc, "reading the schema version");
	int ver = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
	sqlite3_finalize(st);
	if (ver > SCHEMA_VERSION) {
		KVT_LOGE("store: %s/store.sqlite: schema version %d is newer than this kvtier's (%d)", s->dir, ver,
			 SCHEMA_VERSION);
		return KVT_EINVAL;
	}
	return exec(s, "PRAGMA journal_mode=WAL") ||
	       exec(s, "PRAGMA synchronous=FULL") ||
	       exec(s, "CREATE TABLE IF NOT EXISTS kvs(ns TEXT NOT NULL, key BLOB NOT NULL, version INTEGER NOT NULL,"
		       " vlen INTEGER NOT NULL, xxh3 INTEGER NOT NULL, expires_ms INTEGER NOT NULL, locs BLOB NOT NULL,"
		       " PRIMARY KEY (ns, key)) WITHOUT ROWID") ||
	       exec(s, "PRAGMA user_version=1") ? KVT_EIO : KVT_OK;
}

static int prepare(kvt_kvs *s)
{
	struct {
		sqlite3_stmt **st;
		const char *q;
	} p[] = {
		{ &s->st_put, "INSERT OR REPLACE INTO kvs(ns, key, version, vlen, xxh3, expires_ms, locs)"
			      " VALUES (?, ?, ?, ?, ?, ?, ?)" },
		{ &s->st_del, "DELETE FROM kvs WHERE ns = ? AND key = ?" },
		{ &s->st_begin, "BEGIN IMMEDIATE" },
		{ &s->st_commit, "COMMIT" },
		{ &s->st_rollback, "ROLLBACK" },
	};
	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++) {
		int rc = sqlite3_prepare_v3(s->db, p[i].q, -1, SQLITE_PREPARE_PERSISTENT, p[i].st, NULL);
		if (rc != SQLITE_OK)
			return sql_err(s, rc, p[i].q);
	}
	return KVT_OK;
}

int kvs_sql_open(kvt_kvs *s, const char *path)
{
	int rc = sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc != SQLITE_OK)
		return sql_err(s, rc, "open");
	sqlite3_busy_timeout(s->db, 5000);
	if ((rc = schema(s)))
		return rc;
	return prepare(s);
}

void kvs_sql_close(kvt_kvs *s)
{
	sqlite3_stmt *st[] = { s->st_put, s->st_del, s->st_begin, s->st_commit, s->st_rollback };
	for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++)
		sqlite3_finalize(st[i]);
	if (s->db)
		sqlite3_close(s->db);
	s->db = NULL;
}

static int step_reset(kvt_kvs *s, sqlite3_stmt *st, const char *what)
{
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	return rc == SQLITE_DONE ? KVT_OK : sql_err(s, rc, what);
}

int kvs_sql_begin(kvt_kvs *s)
{
	return step_reset(s, s->st_begin, "BEGIN");
}

int kvs_sql_commit(kvt_kvs *s)
{
	return step_reset(s, s->st_commit, "COMMIT");
}

void kvs_sql_rollback(kvt_kvs *s)
{
	if (!sqlite3_get_autocommit(s->db))
		step_reset(s, s->st_rollback, "ROLLBACK");
}

int kvs_sql_put(kvt_kvs *s, const kvs_ent *e, uint64_t version, uint64_t len, uint64_t sum, uint64_t expires_ms,
		const kvt_t2_loc *locs,
		uint32_t n_locs)
{
	uint8_t *b = malloc((size_t)n_locs * LOC_BYTES);
	if (!b)
		return KVT_ENOMEM;
	for (uint32_t i = 0; i < n_locs; i++)
		loc_encode(b + (size_t)i * LOC_BYTES, &locs[i]);
	sqlite3_stmt *st = s->st_put;
	sqlite3_bind_text(st, 1, s->ten[e->tenant].ns, -1, SQLITE_STATIC);
	sqlite3_bind_blob(st, 2, e->key, (int)e->klen, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, (sqlite3_int64)version);
	sqlite3_bind_int64(st, 4, (sqlite3_int64)len);
	sqlite3_bind_int64(st, 5, (sqlite3_int64)sum);
	sqlite3_bind_int64(st, 6, (sqlite3_int64)expires_ms);
	sqlite3_bind_blob(st, 7, b, (int)(n_locs * LOC_BYTES), SQLITE_STATIC);
	int rc = step_reset(s, st, "writing a row");
	free(b);
	return rc;
}

int kvs_sql_del(kvt_kvs *s, const kvs_ent *e)
{
	sqlite3_bind_text(s->st_del, 1, s->ten[e->tenant].ns, -1, SQLITE_STATIC);
	sqlite3_bind_blob(s->st_del, 2, e->key, (int)e->klen, SQLITE_STATIC);
	return step_reset(s, s->st_del, "deleting a row");
}

/* One row at open: its locations decoded and marked used, or why it cannot be kept. */
static const char *load_row(kvt_kvs *s, sqlite3_stmt *st, kvt_t2_loc **locs_out, uint32_t *n_out)
{
	uint64_t len = (uint64_t)sqlite3_column_int64(st, 3);
	const uint8_t *b = sqlite3_column_blob(st, 6);
	size_t nb = (size_t)sqlite3_column_bytes(st, 6);
	uint64_t exp = (uint64_t)sqlite3_column_int64(st, 5);
	if (sqlite3_column_bytes(st, 0) < 1 || sqlite3_column_bytes(st, 0) > (int)KVT_KVS_NS_MAX ||
	    sqlite3_column_bytes(st, 1) < 1 || sqlite3_column_bytes(st, 1) > (int)KVT_KVS_KEY_MAX)
		return "a bad namespace or key";
	if (len == 0 || nb != (size_t)kvs_n_chunks(len) * LOC_BYTES)
		return "its locations do not match its length";
	if (exp && exp <= kvs_wall_ms())
		return NULL; /* expired: dropped without a warning */
	uint32_t n = (uint32_t)(nb / LOC_BYTES);
	kvt_t2_loc *locs = calloc(n, sizeof(*locs));
	if (!locs)
		return "out of memory";
	for (uint32_t i = 0; i < n; i++) {
		loc_decode(b + (size_t)i * LOC_BYTES, &locs[i]);
		if (kvt_t2_mark_used(s->t2, &locs[i])) {
			for (uint32_t j = 0; j < i; j++)
				kvt_t2_free(s->t2, &locs[j]);
			free(locs);
			return "an extent outside the file or overlapping another";
		}
	}
	*locs_out = locs;
	*n_out = n;
	return "";
}

/* Keep one loaded row in the map; false: it must go. */
static bool keep_row(kvt_kvs *s, sqlite3_stmt *st)
{
	kvt_t2_loc *locs = NULL;
	uint32_t n = 0;
	const char *why = load_row(s, st, &locs, &n);
	if (!why)
		return false;
	if (why[0]) {
		KVT_LOGW("store: %s/store.sqlite: dropping the row of a key in %s: %s", s->dir,
			 (const char *)sqlite3_column_text(st, 0), why);
		s->dropped_at_open++;
		return false;
	}
	char ns[KVT_KVS_NS_MAX + 1];
	snprintf(ns, sizeof(ns), "%s", (const char *)sqlite3_column_text(st, 0));
	int rc = kvs_insert_loaded(s, ns, sqlite3_column_blob(st, 1), (uint32_t)sqlite3_column_bytes(st, 1),
				   (uint64_t)sqlite3_column_int64(st, 2), (uint64_t)sqlite3_column_int64(st, 3),
				   (uint64_t)sqlite3_column_int64(st, 4), (uint64_t)sqlite3_column_int64(st, 5), locs, n);
	if (rc) {
		for (uint32_t j = 0; j < n; j++)
			kvt_t2_free(s->t2, &locs[j]);
		free(locs);
		s->dropped_at_open++;
		return false;
	}
	s->recovered++;
	return true;
}

int kvs_sql_load(kvt_kvs *s)
{
	sqlite3_stmt *st;
	int rc = sqlite3_prepare_v2(s->db, "SELECT ns, key, version, vlen, xxh3, expires_ms, locs FROM kvs ORDER BY version",
				    -1, &st, NULL);
	if (rc != SQLITE_OK)
		return sql_err(s, rc, "reading the rows");
	if (exec(s, "CREATE TEMP TABLE drop_rows(ns TEXT, key BLOB)"))
		return KVT_EIO;
	sqlite3_stmt *ins = NULL;
	sqlite3_prepare_v2(s->db, "INSERT INTO drop_rows VALUES (?, ?)", -1, &ins, NULL);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (keep_row(s, st) || !ins)
			continue;
		sqlite3_bind_value(ins, 1, sqlite3_column_value(st, 0));
		sqlite3_bind_value(ins, 2, sqlite3_column_value(st, 1));
		sqlite3_step(ins);
		sqlite3_reset(ins);
	}
	sqlite3_finalize(ins);
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return sql_err(s, rc, "reading the rows");
	return exec(s, "DELETE FROM kvs WHERE (ns, key) IN (SELECT ns, key FROM drop_rows)") ||
	       exec(s, "DROP TABLE drop_rows") ? KVT_EIO : KVT_OK;
}
