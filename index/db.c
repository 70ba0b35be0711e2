/*
 * index/db.c — the SQLite index: the durable mirror of the blocks on NVMe,
 * the sessions and the namespaces (DESIGN.md §4).
 *
 * One connection, one writer thread. kvt_db_open opens the file on the
 * caller's thread (pragmas, integrity check, migrations, namespace), then
 * hands the connection to the writer thread, which from then on runs every
 * statement. Writes are queued as heap nodes in ticket order; the writer takes
 * all consecutive queued writes (up to max_batch) and runs them in one
 * transaction (BEGIN IMMEDIATE ... COMMIT, synchronous=FULL: durable when
 * COMMIT returns), then publishes done_ticket and runs the done callbacks.
 * Reads are queued too, as nodes on the caller's stack: the writer first
 * commits the writes queued before a read, then runs it outside any
 * transaction, so a read sees exactly the committed writes queued before it.
 *
 * Invariants:
 *  - done_ticket only grows; a write with ticket t has committed iff
 *    t <= done_ticket, t < first_failed (the first ticket of the first
 *    failed transaction; UINT64_MAX when none failed) and t is in no range
 *    of full_rng.
 *  - A transaction rolled back for lack of space (is_transient) fails its
 *    tickets with KVT_EFULL (full_rng) and makes the handle degraded: its
 *    session writes move to db->carry, which every later transaction replays
 *    first, so a session's writes still commit in queue order; block rows
 *    are re-sent by their owner. An idle degraded writer retries once a
 *    second; the first commit ends the spell.
 *  - After any other failed transaction the handle is failed: it was rolled
 *    back, and every later write fails (KVT_EIO) without touching the file,
 *    so nothing ever commits out of order after a lost write.
 *  - locking_mode=EXCLUSIVE: the first access takes the file lock for the
 *    life of the connection; a second process gets "locked" at open.
 *
 * The schema (version 5; no index on parent, see migrations[]):
 *   meta(key, value)                      schema_version, owner_id (32 hex digits)
 *   namespaces(id, model_fp, layout_version, block_tokens, created)
 *   blocks(id, ns, hash, parent, tokens, off, extent_bytes, stored_bytes,
 *          generation, checksum, compressed, kv_dtype, codec, scale_layout,
 *          raw_bytes, last_use, hit_count, retain_until, retain_ttl,
 *          retain_floor, retain_tenant, kind)          UNIQUE(ns, hash)
 *   sessions(ns, tenant, id, tokens, n_tokens, last_hash, created, updated,
 *            durable_tokens)
 * 64-bit unsigned values (generation, checksum, last_use, hit_count) are
 * stored as their int64 bit pattern; token ids as int32 little-endian blobs.
 *
 * Fault points (core/fault.h) in the group commit, for the crash trials:
 * "idx.commit.journal_synced" (the batch's session records durable in the
 * journal, the transaction not committed), "idx.commit.before" (every write
 * of the batch run, before COMMIT), "idx.commit.committed" (COMMIT returned,
 * before done_ticket moves or any callback runs).
 */
#include "fault.h"
#include "index_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* Failed ticket ranges kept for kvt_db_wait (one per disk-full episode, in practice). */
#define FULL_RANGES 256
/* While degraded, an idle writer retries the kept writes (or probes) this often. */
#define FULL_RETRY_S 1.0

enum op_kind {
	OP_PUT_BLOCK,
	OP_DEL_BLOCK,
	OP_TOUCH_BLOCK,
	OP_RETAIN_BLOCK,
	OP_PUT_SESSION,
	OP_DEL_SESSION,
	OP_MARK_SESSION,
	OP_READ
};

typedef struct db_op db_op;
typedef int (*read_fn)(kvt_db *db, void *ctx);

struct db_op {
	db_op *next;          /* queue link */
	int kind;             /* enum op_kind */
	uint64_t ticket;      /* writes: queue order, from 1 */
	kvt_db_done_fn done;  /* writes: optional callback */
	void *user;           /* writes: callback argument */
	union {
		kvt_db_block_row row; /* OP_PUT_BLOCK */
		struct {
			int64_t ns_id;                /* namespace of the row */
			uint8_t hash[KVT_HASH_BYTES]; /* block */
			uint64_t last_use;            /* OP_TOUCH_BLOCK */
			uint64_t hit_count;           /* OP_TOUCH_BLOCK */
			uint64_t retain_until_us;     /* OP_RETAIN_BLOCK: deadline (0: released) */
			uint64_t retain_ttl_us;       /* OP_RETAIN_BLOCK: the TTL each hit restarts */
			uint8_t retain_floor;         /* OP_RETAIN_BLOCK: floor tier */
			char retain_tenant[KVT_NAME_MAX + 1]; /* OP_RETAIN_BLOCK: whose quota it counts against */
		} blk;                /* OP_DEL_BLOCK, OP_TOUCH_BLOCK, OP_RETAIN_BLOCK */
		kvt_db_session sess;  /* OP_PUT_SESSION (tokens: heap copy), OP_DEL_SESSION (names),
		                         OP_MARK_SESSION (names, last_hash, durable_tokens) */
		struct {
			read_fn fn;     /* runs on the writer thread */
			void *ctx;      /* its argument */
			int rc;         /* its result */
			bool finished;  /* set by the writer under mu */
		} rd;                 /* OP_READ (node on the caller's stack) */
	} u;
};

enum {
	ST_BEGIN,
	ST_COMMIT,
	ST_ROLLBACK,
	ST_PUT_BLOCK,
	ST_DEL_BLOCK,
	ST_TOUCH_BLOCK,
	ST_RETAIN_BLOCK,
	ST_PUT_SESSION,
	ST_DEL_SESSION,
	ST_MARK_SESSION,
	ST_PROBE,
	ST_SET_JSEQ,
	ST_COUNT
};

static const char *const stmt_sql[ST_COUNT] = {
	[ST_BEGIN] = "BEGIN IMMEDIATE",
	[ST_COMMIT] = "COMMIT",
	[ST_ROLLBACK] = "ROLLBACK",
	[ST_PUT_BLOCK] = "INSERT INTO blocks(ns, hash, parent, tokens, off, extent_bytes, stored_bytes, generation,"
			 " checksum, compressed, kv_dtype, codec, scale_layout, raw_bytes, last_use, hit_count,"
			 " retain_until, retain_ttl, retain_floor, retain_tenant, kind)"
			 " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21)"
			 " ON CONFLICT(ns, hash) DO UPDATE SET parent=excluded.parent, tokens=excluded.tokens,"
			 " off=excluded.off, extent_bytes=excluded.extent_bytes, stored_bytes=excluded.stored_bytes,"
			 " generation=excluded.generation, checksum=excluded.checksum, compressed=excluded.compressed,"
			 " kv_dtype=excluded.kv_dtype, codec=excluded.codec, scale_layout=excluded.scale_layout,"
			 " raw_bytes=excluded.raw_bytes, last_use=excluded.last_use, hit_count=excluded.hit_count,"
			 " retain_until=excluded.retain_until, retain_ttl=excluded.retain_ttl,"
			 " retain_floor=excluded.retain_floor, retain_tenant=excluded.retain_tenant, kind=excluded.kind",
	[ST_DEL_BLOCK] = "DELETE FROM blocks WHERE ns=?1 AND hash=?2",
	[ST_TOUCH_BLOCK] = "UPDATE blocks SET last_use=?3, hit_count=?4 WHERE ns=?1 AND hash=?2",
	[ST_RETAIN_BLOCK] = "UPDATE blocks SET retain_until=?3, retain_ttl=?4, retain_floor=?5, retain_tenant=?6"
			    " WHERE ns=?1 AND hash=?2",
	[ST_PUT_SESSION] = "INSERT INTO sessions(ns, tenant, id, tokens, n_tokens, last_hash, created, updated,"
			   " durable_tokens) VALUES(?1,?2,?3,?4,?5,?6,?7,?7,?8) ON CONFLICT(ns, tenant, id) DO UPDATE SET"
			   " tokens=excluded.tokens, n_tokens=excluded.n_tokens, last_hash=excluded.last_hash,"
			   " updated=excluded.updated, durable_tokens=excluded.durable_tokens",
	[ST_DEL_SESSION] = "DELETE FROM sessions WHERE ns=?1 AND tenant=?2 AND id=?3",
	/* a mark names the history it measured (last_hash): a later turn's row is never given an older count */
	[ST_MARK_SESSION] = "UPDATE sessions SET durable_tokens=max(durable_tokens, ?5)"
			    " WHERE ns=?1 AND tenant=?2 AND id=?3 AND last_hash=?4 AND n_tokens>=?5",
	[ST_PROBE] = "INSERT OR REPLACE INTO meta(key, value) VALUES('space_probe', strftime('%s', 'now'))",
	[ST_SET_JSEQ] = "INSERT OR REPLACE INTO meta(key, value) VALUES('journal_seq', ?1)",
};

/*
 * Migrations: step i takes a file from version i to i + 1. Version 1 had the
 * namespaces and blocks; version 2 added the sessions; version 3 the
 * retention of a block (deadline, TTL, floor tier, tenant: tiers/manager.h);
 * version 4 how far a session's blocks are durable (durable_tokens); version 5 the kind of
 * a block (enum kvt_block_kind: 0 prefix, every row written before; 1 chunk). NOTE: blocks has no
 * index on parent on purpose: every put would update a third b-tree at a
 * random key (measured: group-commit inserts ~1.5x slower), and the block
 * table links parents and children in any load order.
 */
static const char *const migrations[KVT_DB_SCHEMA_VERSION] = {
	"CREATE TABLE meta(key TEXT PRIMARY KEY, value);"
	"CREATE TABLE namespaces(id INTEGER PRIMARY KEY, model_fp BLOB NOT NULL,"
	" layout_version INTEGER NOT NULL, block_tokens INTEGER NOT NULL, created INTEGER NOT NULL,"
	" UNIQUE(model_fp, layout_version, block_tokens));"
	"CREATE TABLE blocks(id INTEGER PRIMARY KEY, ns INTEGER NOT NULL REFERENCES namespaces(id),"
	" hash BLOB NOT NULL, parent BLOB NOT NULL, tokens BLOB NOT NULL, off INTEGER NOT NULL,"
	" extent_bytes INTEGER NOT NULL, stored_bytes INTEGER NOT NULL, generation INTEGER NOT NULL,"
	" checksum INTEGER NOT NULL, compressed INTEGER NOT NULL, kv_dtype INTEGER NOT NULL,"
	" codec INTEGER NOT NULL, scale_layout INTEGER NOT NULL, raw_bytes INTEGER NOT NULL,"
	" last_use INTEGER NOT NULL, hit_count INTEGER NOT NULL, UNIQUE(ns, hash));",
	"CREATE TABLE sessions(ns INTEGER NOT NULL REFERENCES namespaces(id), tenant TEXT NOT NULL,"
	" id TEXT NOT NULL, tokens BLOB NOT NULL, n_tokens INTEGER NOT NULL, last_hash BLOB NOT NULL,"
	" created INTEGER NOT NULL, updated INTEGER NOT NULL, PRIMARY KEY(ns, tenant, id));",
	"ALTER TABLE blocks ADD COLUMN retain_until INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE blocks ADD COLUMN retain_ttl INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE blocks ADD COLUMN retain_floor INTEGER NOT NULL DEFAULT 0;"
	"ALTER TABLE blocks ADD COLUMN retain_tenant TEXT NOT NULL DEFAULT '';",
	"ALTER TABLE sessions ADD COLUMN durable_tokens INTEGER NOT NULL DEFAULT 0;",
	"ALTER TABLE blocks ADD COLUMN kind INTEGER NOT NULL DEFAULT 0;",
};

struct kvt_db {
	sqlite3 *sql;                /* the one connection; writer thread only after open */
	sqlite3_stmt *st[ST_COUNT];  /* prepared statements */
	char *path;                  /* the file, for log lines */
	char *dir;                   /* its directory, for the rebuild-index hint */
	int64_t ns_id;               /* this handle's namespace */
	uint8_t owner[KVT_DB_OWNER_BYTES]; /* meta.owner_id (zeros: none); immutable after open */
	uint32_t max_batch;          /* writes per transaction */
	uint32_t max_wait_us;        /* group-commit wait */
	pthread_t thread;            /* the writer */
	pthread_mutex_t mu;          /* guards everything below */
	pthread_cond_t cv_queue;     /* queue non-empty or stopping */
	pthread_cond_t cv_done;      /* done_ticket advanced or a read finished */
	db_op *head, *tail;          /* the queue */
	uint64_t next_ticket;        /* last ticket handed out */
	uint64_t done_ticket;        /* highest finished ticket */
	uint64_t first_failed;       /* first ticket of the first failed batch, UINT64_MAX none */
	bool failed;                 /* a transaction failed for good: writes refused */
	struct full_range {
		uint64_t lo, hi;     /* tickets of consecutive batches rolled back for lack of space */
	} full_rng[FULL_RANGES];     /* oldest first */
	uint32_t n_full_rng;         /* entries in full_rng */
	uint64_t full_floor;         /* tickets <= this whose range was dropped: reported as KVT_EFULL */
	db_op *carry;                /* session writes rolled back for lack of space, oldest first (writer) */
	bool degraded;               /* the last transaction was rolled back for lack of space */
	double degraded_t;           /* when that started */
	uint64_t n_full_episode;     /* transactions rolled back since */
	int last_sql_rc;             /* SQLite code of the last failed step (writer) */
	bool last_transient;         /* the last failed batch may succeed once space returns (writer) */
	kvt_db_ns ns;                /* this handle's namespace, for the journal's records */
	kvt_sjournal *sj;            /* the session journal, or NULL (writer after open) */
	uint64_t sj_seq;             /* last journal seq handed out */
	uint64_t sj_compact_at;      /* rewrite the journal when it grows past this */
	uint64_t sj_compact_min;     /* ... never below this */
	const kvt_db_journal_io *journal_io; /* the journal's I/O hooks (cfg.journal_io; borrowed), or NULL */
	char *reserve_path;          /* the reserve file, or NULL (no reserve) */
	uint64_t reserve_bytes;      /* its size */
	bool reserve_held;           /* the file holds reserve_bytes (writer after open) */
	bool reserve_mode;           /* the reserve was given up for lack of space: only session writes commit (writer) */
	double reserve_retry_t;      /* next try to allocate it again (writer) */
	bool stop;                   /* close requested */
	kvt_db_stats stats;          /* counters */
	int64_t bad_seen[64];        /* rowids of bad session rows already logged (writer thread) */
	uint32_t n_bad_seen;         /* entries in bad_seen */
};

/* ---- helpers ---------------------------------------------------------------- */

static bool is_corrupt_code(int rc)
{
	rc &= 0xff;
	return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB;
}

/* Log a SQLite failure naming the file and map it to a KVT code. */
static int sql_fail(const char *path, const char *dir, sqlite3 *sql, int rc, const char *what)
{
	const char *msg = sql ? sqlite3_errmsg(sql) : sqlite3_errstr(rc);
	if (is_corrupt_code(rc)) {
		KVT_LOGE("index %s: %s: %s: the file is corrupt or truncated; run `kvtier rebuild-index --data-dir %s`",
			 path, what, msg, dir);
		return KVT_ECORRUPT;
	}
	if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) {
		KVT_LOGE("index %s: %s: %s (is another kvtier process using this data directory?)", path, what, msg);
		return KVT_EIO;
	}
	if ((rc & 0xff) == SQLITE_NOMEM)
		return KVT_ENOMEM;
	KVT_LOGE("index %s: %s: %s", path, what, msg);
	return KVT_EIO;
}

static int fail(kvt_db *db, int rc, const char *what)
{
	return sql_fail(db->path, db->dir, db->sql, rc, what);
}

static int writer_fail(kvt_db *db, int rc, const char *what);

/*
 * One step of a loop over a statement's rows: true with a row; false at the
 * end (*rc = KVT_OK) or on an error (*rc = fail()'s code, logged naming what).
 */
static bool next_row(kvt_db *db, sqlite3_stmt *st, const char *what, int *rc)
{
	int s = sqlite3_step(st);
	if (s == SQLITE_ROW)
		return true;
	*rc = s == SQLITE_DONE ? KVT_OK : fail(db, s, what);
	return false;
}

static void put_u32le(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32le(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Bind n token ids as a little-endian blob (SQLITE_TRANSIENT copies it). */
static int bind_tokens(sqlite3_stmt *st, int col, const int32_t *tokens, uint32_t n)
{
	uint8_t small[4 * KVT_BLOCK_MAX_TOKENS];
	uint8_t *buf = n <= KVT_BLOCK_MAX_TOKENS ? small : malloc((size_t)n * 4);
	int rc;
	if (!buf)
		return SQLITE_NOMEM;
	for (uint32_t i = 0; i < n; i++)
		put_u32le(buf + 4 * i, (uint32_t)tokens[i]);
	rc = sqlite3_bind_blob(st, col, n ? (const void *)buf : (const void *)"", (int)(4 * n), SQLITE_TRANSIENT);
	if (buf != small)
		free(buf);
	return rc;
}

static int64_t now_unix(void)
{
	return (int64_t)time(NULL);
}

static int exec(kvt_db *db, const char *sql_text, const char *what)
{
	int rc = sqlite3_exec(db->sql, sql_text, NULL, NULL, NULL);
	return rc == SQLITE_OK ? KVT_OK : fail(db, rc, what);
}

/* ---- open: pragmas, checks, migrations, namespace ----------------------------- */

/* Cheap structural checks before SQLite sees the file: magic and whole pages. */
static int precheck_file(const char *path, const char *dir, bool create, bool *exists)
{
	struct stat sb;
	uint8_t hdr[100];
	FILE *f;

	if (stat(path, &sb) != 0) {
		if (errno == ENOENT && create) {
			*exists = false;
			return KVT_OK;
		}
		KVT_LOGE("index %s: %s%s", path, strerror(errno),
			 errno == ENOENT ? " (no index here; `kvtier rebuild-index` can create one from the T2 file)" : "");
		return errno == ENOENT ? KVT_ENOTFOUND : KVT_EIO;
	}
	*exists = true;
	if (!S_ISREG(sb.st_mode)) {
		KVT_LOGE("index %s: not a regular file", path);
		return KVT_EINVAL;
	}
	if (sb.st_size == 0)
		return KVT_OK; /* SQLite treats an empty file as an empty database */
	if (sb.st_size < (off_t)sizeof(hdr)) {
		KVT_LOGE("index %s: truncated (%lld bytes, shorter than the 100-byte SQLite header); run "
			 "`kvtier rebuild-index --data-dir %s`",
			 path, (long long)sb.st_size, dir);
		return KVT_ECORRUPT;
	}
	f = fopen(path, "rb");
	if (!f || fread(hdr, 1, sizeof(hdr), f) != sizeof(hdr)) {
		KVT_LOGE("index %s: cannot read the header: %s", path, strerror(errno));
		if (f)
			fclose(f);
		return KVT_EIO;
	}
	fclose(f);
	if (memcmp(hdr, "SQLite format 3", 16) != 0) {
		KVT_LOGE("index %s: not an SQLite database (bad magic); run `kvtier rebuild-index --data-dir %s`", path,
			 dir);
		return KVT_ECORRUPT;
	}
	uint32_t page = (uint32_t)hdr[16] << 8 | hdr[17];
	if (page == 1)
		page = 65536;
	if (page < 512 || (page & (page - 1)) != 0) {
		KVT_LOGE("index %s: header page size %u is invalid; run `kvtier rebuild-index --data-dir %s`", path,
			 page, dir);
		return KVT_ECORRUPT;
	}
	if (sb.st_size % page != 0) {
		KVT_LOGE("index %s: truncated (%lld bytes is not a whole number of %u-byte pages); run "
			 "`kvtier rebuild-index --data-dir %s`",
			 path, (long long)sb.st_size, page, dir);
		return KVT_ECORRUPT;
	}
	return KVT_OK;
}

/* Run a one-row, one-column text pragma/query; copy its value into out. */
static int query_text(kvt_db *db, const char *q, char *out, size_t cap)
{
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(db->sql, q, -1, &st, NULL);
	if (rc == SQLITE_OK) {
		rc = sqlite3_step(st);
		if (rc == SQLITE_ROW) {
			const unsigned char *t = sqlite3_column_text(st, 0);
			snprintf(out, cap, "%s", t ? (const char *)t : "");
			rc = SQLITE_OK;
		} else if (rc == SQLITE_DONE) {
			out[0] = '\0';
			rc = SQLITE_OK;
		}
	}
	if (rc != SQLITE_OK) {
		int r = fail(db, rc, q);
		sqlite3_finalize(st);
		return r;
	}
	sqlite3_finalize(st);
	return KVT_OK;
}

static int schema_version(kvt_db *db, int64_t *out)
{
	char buf[64];
	int rc = query_text(db, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='meta'", buf,
			    sizeof(buf));
	if (rc)
		return rc;
	if (atoi(buf) == 0) {
		*out = 0;
		return KVT_OK;
	}
	rc = query_text(db, "SELECT value FROM meta WHERE key='schema_version'", buf, sizeof(buf));
	if (rc)
		return rc;
	char *end;
	long long v = strtoll(buf, &end, 10);
	if (buf[0] == '\0' || *end != '\0' || v < 1) {
		KVT_LOGE("index %s: meta.schema_version \"%s\" is not a version; run `kvtier rebuild-index --data-dir %s`",
			 db->path, buf, db->dir);
		return KVT_ECORRUPT;
	}
	*out = v;
	return KVT_OK;
}

static int migrate(kvt_db *db)
{
	int64_t v;
	int rc = schema_version(db, &v);
	if (rc)
		return rc;
	if (v > KVT_DB_SCHEMA_VERSION) {
		KVT_LOGE("index %s: schema version %lld is newer than this kvtier understands (%d)", db->path,
			 (long long)v, KVT_DB_SCHEMA_VERSION);
		return KVT_EUNSUPPORTED;
	}
	int64_t from = v;
	for (; v < KVT_DB_SCHEMA_VERSION; v++) {
		char set[160];
		snprintf(set, sizeof(set), "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', %lld)",
			 (long long)(v + 1));
		if ((rc = exec(db, "BEGIN IMMEDIATE", "begin migration")) != KVT_OK)
			return rc;
		if ((rc = exec(db, migrations[v], "migration")) != KVT_OK ||
		    (rc = exec(db, set, "migration: schema_version")) != KVT_OK ||
		    (rc = exec(db, "COMMIT", "commit migration")) != KVT_OK) {
			sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
			return rc;
		}
		if (from > 0)
			KVT_LOGI("index %s: migrated schema %lld -> %lld", db->path, (long long)v, (long long)(v + 1));
	}
	return KVT_OK;
}

static int ns_id_of(kvt_db *db, const kvt_db_ns *ns, int64_t *id_out)
{
	sqlite3_stmt *st = NULL;
	const char *q = "SELECT id FROM namespaces WHERE model_fp=?1 AND layout_version=?2 AND block_tokens=?3";
	int rc;

	for (int pass = 0; pass < 2; pass++) {
		rc = sqlite3_prepare_v2(db->sql, q, -1, &st, NULL);
		if (rc != SQLITE_OK)
			return fail(db, rc, "prepare namespace lookup");
		sqlite3_bind_blob(st, 1, ns->model_fp, KVT_HASH_BYTES, SQLITE_STATIC);
		sqlite3_bind_int64(st, 2, ns->layout_version);
		sqlite3_bind_int64(st, 3, ns->block_tokens);
		rc = sqlite3_step(st);
		if (rc == SQLITE_ROW) {
			*id_out = sqlite3_column_int64(st, 0);
			sqlite3_finalize(st);
			return KVT_OK;
		}
		sqlite3_finalize(st);
		if (rc != SQLITE_DONE)
			return fail(db, rc, "namespace lookup");
		if (pass == 1)
			break;
		rc = sqlite3_prepare_v2(db->sql,
					"INSERT INTO namespaces(model_fp, layout_version, block_tokens, created)"
					" VALUES(?1,?2,?3,?4)",
					-1, &st, NULL);
		if (rc != SQLITE_OK)
			return fail(db, rc, "prepare namespace insert");
		sqlite3_bind_blob(st, 1, ns->model_fp, KVT_HASH_BYTES, SQLITE_STATIC);
		sqlite3_bind_int64(st, 2, ns->layout_version);
		sqlite3_bind_int64(st, 3, ns->block_tokens);
		sqlite3_bind_int64(st, 4, now_unix());
		rc = sqlite3_step(st);
		sqlite3_finalize(st);
		if (rc != SQLITE_DONE)
			return fail(db, rc, "namespace insert");
	}
	KVT_LOGE("index %s: namespace row vanished after insert", db->path);
	return KVT_EIO;
}

static int find_or_add_ns(kvt_db *db, const kvt_db_ns *ns)
{
	return ns_id_of(db, ns, &db->ns_id);
}

static void *writer_main(void *arg);

/* Record db->owner as meta.owner_id. */
static int owner_write(kvt_db *db)
{
	char q[160];
	int o = snprintf(q, sizeof(q), "INSERT OR REPLACE INTO meta(key, value) VALUES('owner_id', '");
	for (int i = 0; i < KVT_DB_OWNER_BYTES; i++)
		o += snprintf(q + o, sizeof(q) - (size_t)o, "%02x", db->owner[i]);
	snprintf(q + o, sizeof(q) - (size_t)o, "')");
	return exec(db, q, "record owner_id");
}

/* Read meta.owner_id; record set (given) or a random one (make: *made) when asked. */
static int owner_id(kvt_db *db, const uint8_t *set, bool make, bool *made)
{
	char buf[2 * KVT_DB_OWNER_BYTES + 8];
	*made = false;
	int rc = query_text(db, "SELECT value FROM meta WHERE key='owner_id'", buf, sizeof(buf));
	if (rc)
		return rc;
	bool have = strlen(buf) == 2 * KVT_DB_OWNER_BYTES;
	for (int i = 0; have && i < KVT_DB_OWNER_BYTES; i++) {
		unsigned v;
		have = sscanf(buf + 2 * i, "%2x", &v) == 1;
		db->owner[i] = (uint8_t)v;
	}
	if (!set && (have || !make))
		return KVT_OK;
	if (set) {
		memcpy(db->owner, set, KVT_DB_OWNER_BYTES);
	} else {
		int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? read(fd, db->owner, KVT_DB_OWNER_BYTES) : -1;
		if (fd >= 0)
			close(fd);
		if (n != KVT_DB_OWNER_BYTES) {
			KVT_LOGE("index %s: cannot read /dev/urandom for the index's owner id", db->path);
			return KVT_EIO;
		}
		*made = true;
	}
	return owner_write(db);
}

/* ---- the session journal (index/journal.c) ------------------------------------ */

static void sj_rec_of(const kvt_db *db, const db_op *op, uint64_t seq, kvt_sj_rec *r)
{
	memset(r, 0, sizeof(*r));
	r->seq = seq;
	r->kind = op->kind == OP_PUT_SESSION ? KVT_SJ_PUT : KVT_SJ_DEL;
	r->ns = db->ns;
	snprintf(r->tenant, sizeof(r->tenant), "%s", op->u.sess.tenant);
	snprintf(r->id, sizeof(r->id), "%s", op->u.sess.id);
	if (op->kind == OP_PUT_SESSION) {
		r->tokens = op->u.sess.tokens;
		r->n_tokens = op->u.sess.n_tokens;
		memcpy(r->last_hash, op->u.sess.last_hash, KVT_HASH_BYTES);
	}
	r->updated = now_unix();
}

static int journal_ops(kvt_db *db, db_op *op, uint32_t n, uint64_t *seq)
{
	for (uint32_t i = 0; op && i < n; i++, op = op->next) {
		if (op->kind != OP_PUT_SESSION && op->kind != OP_DEL_SESSION)
			continue;
		kvt_sj_rec r;
		sj_rec_of(db, op, ++*seq, &r);
		int rc = kvt_sj_append(db->sj, &r);
		if (rc)
			return rc;
	}
	return KVT_OK;
}

/*
 * Writer, inside the transaction, before its COMMIT: the session writes of
 * the transaction (the carried ones, then the batch's) go to the journal,
 * durably, and meta.journal_seq names the last of them, so the journal is
 * never behind the index. KVT_EFULL (no space: transient) or KVT_EIO.
 */
static int journal_batch(kvt_db *db, db_op *first, uint32_t n)
{
	if (!db->sj)
		return KVT_OK;
	uint64_t seq = db->sj_seq;
	int rc = journal_ops(db, db->carry, UINT32_MAX, &seq);
	if (rc == KVT_OK)
		rc = journal_ops(db, first, n, &seq);
	if (rc == KVT_OK && seq == db->sj_seq)
		return KVT_OK; /* no session write in this transaction */
	db->sj_seq = seq; /* seqs are never reused, even when this batch fails */
	if (rc == KVT_OK)
		rc = kvt_sj_sync(db->sj);
	else
		kvt_sj_abort(db->sj);
	if (rc == KVT_OK)
		kvt_fault_point("idx.commit.journal_synced"); /* journal durable, the transaction not committed */
	if (rc == KVT_EFULL) {
		db->last_transient = true;
		return rc;
	}
	if (rc)
		return rc;
	sqlite3_stmt *st = db->st[ST_SET_JSEQ];
	sqlite3_bind_int64(st, 1, (int64_t)seq);
	rc = sqlite3_step(st);
	sqlite3_reset(st);
	if (rc == SQLITE_DONE)
		return KVT_OK;
	return writer_fail(db, rc, "journal_seq");
}

/* Writer (or open): append one put per decodable session row of every namespace to tmp. */
static int rewrite_each(void *ctx, kvt_sjournal *tmp)
{
	kvt_db *db = ctx;
	sqlite3_stmt *st = NULL;
	int32_t *toks = NULL;
	size_t cap = 0;
	int rc = sqlite3_prepare_v2(db->sql,
				    "SELECT s.tenant, s.id, s.tokens, s.last_hash, s.updated, n.model_fp, n.layout_version,"
				    " n.block_tokens FROM sessions s JOIN namespaces n ON n.id = s.ns ORDER BY s.rowid",
				    -1, &st, NULL);
	if (rc != SQLITE_OK)
		return fail(db, rc, "prepare journal rewrite");
	while (next_row(db, st, "journal rewrite", &rc)) {
		kvt_sj_rec r;
		memset(&r, 0, sizeof(r));
		const char *tenant = (const char *)sqlite3_column_text(st, 0), *id = (const char *)sqlite3_column_text(st, 1);
		int n_bytes = sqlite3_column_bytes(st, 2);
		if (!tenant || !id || !kvt_name_valid(tenant) || !kvt_name_valid(id) || n_bytes % 4 ||
		    sqlite3_column_bytes(st, 3) != KVT_HASH_BYTES || sqlite3_column_bytes(st, 5) != KVT_HASH_BYTES)
			continue; /* a bad row (the listing names it) */
		if ((size_t)n_bytes / 4 > cap) {
			int32_t *t = realloc(toks, (size_t)n_bytes);
			if (!t) {
				rc = KVT_ENOMEM;
				break;
			}
			toks = t;
			cap = (size_t)n_bytes / 4;
		}
		const uint8_t *p = sqlite3_column_blob(st, 2);
		for (int i = 0; i < n_bytes / 4; i++)
			toks[i] = (int32_t)get_u32le(p + 4 * i);
		r.seq = db->sj_seq;
		r.kind = KVT_SJ_PUT;
		snprintf(r.tenant, sizeof(r.tenant), "%s", tenant);
		snprintf(r.id, sizeof(r.id), "%s", id);
		r.tokens = toks;
		r.n_tokens = (uint32_t)(n_bytes / 4);
		memcpy(r.last_hash, sqlite3_column_blob(st, 3), KVT_HASH_BYTES);
		r.updated = sqlite3_column_int64(st, 4);
		memcpy(r.ns.model_fp, sqlite3_column_blob(st, 5), KVT_HASH_BYTES);
		r.ns.layout_version = (uint32_t)sqlite3_column_int64(st, 6);
		r.ns.block_tokens = (uint32_t)sqlite3_column_int64(st, 7);
		if ((rc = kvt_sj_append(tmp, &r)) != KVT_OK)
			break;
	}
	sqlite3_finalize(st);
	free(toks);
	return rc;
}

/* Replace the journal by one record per live session; logs failures. */
static int journal_rewrite(kvt_db *db)
{
	double t0 = kvt_now_s();
	if (!db->sj_seq)
		db->sj_seq = 1; /* a record of seq 0 would never count as newer than the index */
	int rc = kvt_sj_rewrite(db->sj, rewrite_each, db);
	if (rc == KVT_OK) {
		/* The index holds exactly what the new journal holds. */
		char set[128];
		snprintf(set, sizeof(set), "INSERT OR REPLACE INTO meta(key, value) VALUES('journal_seq', %llu)",
			 (unsigned long long)db->sj_seq);
		(void)exec(db, set, "journal rewrite: journal_seq"); /* a failure only means a replay of the same rows */
	}
	double dt = kvt_now_s() - t0;
	uint64_t bytes = kvt_sj_bytes(db->sj);
	uint64_t next = 2 * bytes > db->sj_compact_min ? 2 * bytes : db->sj_compact_min;
	db->sj_compact_at = rc == KVT_OK ? next : 2 * db->sj_compact_at;
	if (rc != KVT_OK)
		KVT_LOGW("index %s: rewriting the session journal failed (%s); it keeps growing until the next try",
			 db->path, kvt_strerror(rc));
	pthread_mutex_lock(&db->mu);
	db->stats.n_journal_rewrites += rc == KVT_OK;
	db->stats.journal_rewrite_s += dt;
	db->stats.journal_bytes = bytes;
	pthread_mutex_unlock(&db->mu);
	return rc;
}

struct replay_ctx {
	kvt_db *db;            /* the handle being opened */
	uint64_t after;        /* meta.journal_seq: records up to it are in the index */
	sqlite3_stmt *put, *del;
	uint64_t n_applied;    /* records replayed */
	uint64_t first, last;  /* their seqs */
};

static int replay_fn(void *arg, const kvt_sj_rec *r)
{
	struct replay_ctx *c = arg;
	kvt_db *db = c->db;
	int64_t ns;
	if (r->seq <= c->after)
		return 0;
	if (r->ns.block_tokens < 1 || r->ns.block_tokens > KVT_BLOCK_MAX_TOKENS)
		return 0; /* cannot be a namespace: the record checked, so skip it */
	int rc = ns_id_of(db, &r->ns, &ns);
	if (rc)
		return rc;
	sqlite3_stmt *st = r->kind == KVT_SJ_PUT ? c->put : c->del;
	sqlite3_bind_int64(st, 1, ns);
	sqlite3_bind_text(st, 2, r->tenant, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, r->id, -1, SQLITE_STATIC);
	if (r->kind == KVT_SJ_PUT) {
		bind_tokens(st, 4, r->tokens, r->n_tokens);
		sqlite3_bind_int64(st, 5, r->n_tokens);
		sqlite3_bind_blob(st, 6, r->last_hash, KVT_HASH_BYTES, SQLITE_STATIC);
		sqlite3_bind_int64(st, 7, r->updated);
	}
	rc = sqlite3_step(st);
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	if (rc != SQLITE_DONE)
		return fail(db, rc, "journal replay");
	if (!c->n_applied++)
		c->first = r->seq;
	c->last = r->seq;
	return 0;
}

/*
 * At open, on the caller's thread: open the session journal, replay the
 * records the index lacks (all of them into a new file), and rewrite the
 * journal when it is behind the index. Every recovery is logged.
 */
static int journal_open(kvt_db *db, const char *path, bool db_existed)
{
	char buf[64];
	int rc = query_text(db, "SELECT value FROM meta WHERE key='journal_seq'", buf, sizeof(buf));
	if (rc)
		return rc;
	uint64_t d = strtoull(buf, NULL, 10);
	struct replay_ctx c = { .db = db, .after = d };
	if ((rc = exec(db, "BEGIN IMMEDIATE", "begin journal replay")) != KVT_OK)
		return rc;
	if (sqlite3_prepare_v2(db->sql,
			       "INSERT INTO sessions(ns, tenant, id, tokens, n_tokens, last_hash, created, updated)"
			       " VALUES(?1,?2,?3,?4,?5,?6,?7,?7) ON CONFLICT(ns, tenant, id) DO UPDATE SET"
			       " tokens=excluded.tokens, n_tokens=excluded.n_tokens, last_hash=excluded.last_hash,"
			       " updated=excluded.updated, durable_tokens=0", /* the journal does not carry it */
			       -1, &c.put, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(db->sql, "DELETE FROM sessions WHERE ns=?1 AND tenant=?2 AND id=?3", -1, &c.del, NULL) !=
		    SQLITE_OK) {
		rc = fail(db, sqlite3_errcode(db->sql), "prepare journal replay");
		goto out;
	}
	kvt_sj_info info;
	rc = kvt_sj_open(path, db->journal_io, replay_fn, &c, &db->sj, &info);
	if (rc == KVT_OK && c.n_applied) {
		char set[128];
		snprintf(set, sizeof(set), "INSERT OR REPLACE INTO meta(key, value) VALUES('journal_seq', %llu)",
			 (unsigned long long)c.last);
		rc = exec(db, set, "journal replay: journal_seq");
		if (rc == KVT_OK)
			rc = exec(db, "COMMIT", "commit journal replay");
	}
out:
	sqlite3_finalize(c.put);
	sqlite3_finalize(c.del);
	if (!sqlite3_get_autocommit(db->sql))
		sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
	if (rc)
		return rc;
	db->stats.n_replayed = c.n_applied;
	if (info.torn_bytes)
		KVT_LOGW("session journal %s: %llu bytes at its end do not form a whole record (a torn write): cut off",
			 path, (unsigned long long)info.torn_bytes);
	if (c.n_applied && !db_existed)
		KVT_LOGW("index %s was missing: created anew, and %llu session writes restored from the session journal %s",
			 db->path, (unsigned long long)c.n_applied, path);
	else if (c.n_applied)
		KVT_LOGW("index %s lacked the last %llu session writes of the session journal %s (seq %llu..%llu): "
			 "restored them. One batch is a crash between the journal and the commit; more means the index "
			 "or its WAL lost commits, and blocks written since may be missing: `kvtier rebuild-index "
			 "--data-dir %s` rebuilds them from the T2 file",
			 db->path, (unsigned long long)c.n_applied, path, (unsigned long long)c.first,
			 (unsigned long long)c.last, db->dir);
	db->sj_seq = info.last_seq > d ? info.last_seq : d;
	bool rewrite = false;
	if (d > info.last_seq) {
		KVT_LOGW("session journal %s %s at seq %llu but the index committed up to seq %llu: it lost records "
			 "(deleted or damaged); rewriting it from the index",
			 path, info.existed ? "ends" : "is missing; it was", (unsigned long long)info.last_seq,
			 (unsigned long long)d);
		rewrite = true;
	} else if (!info.existed) {
		uint64_t n = 0;
		if ((rc = query_text(db, "SELECT count(*) FROM sessions", buf, sizeof(buf))) != KVT_OK)
			return rc;
		n = strtoull(buf, NULL, 10);
		if (n) {
			KVT_LOGI("session journal %s: new; writing the index's %llu sessions into it", path,
				 (unsigned long long)n);
			rewrite = true;
		}
	}
	db->sj_compact_at = db->sj_compact_min;
	if (rewrite)
		(void)journal_rewrite(db); /* a failure is logged; the index itself is whole */
	else if (kvt_sj_bytes(db->sj) >= db->sj_compact_at)
		db->sj_compact_at = 2 * kvt_sj_bytes(db->sj);
	return KVT_OK;
}


static char *dir_of(const char *path)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		return strdup(".");
	if (slash == path)
		return strdup("/");
	return strndup(path, (size_t)(slash - path));
}

static void db_free(kvt_db *db)
{
	kvt_sj_close(db->sj);
	for (int i = 0; i < ST_COUNT; i++)
		sqlite3_finalize(db->st[i]);
	if (db->sql)
		sqlite3_close(db->sql);
	free(db->path);
	free(db->dir);
	free(db->reserve_path);
	free(db);
}

/* ---- the reserve (index.h, "Reserve") ---------------------------------------- */

/* Allocate the reserve file's reserve_bytes; false (the file emptied again) when there is no room. */
static bool reserve_take(kvt_db *db)
{
	int fd = open(db->reserve_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return false;
	bool ok = posix_fallocate(fd, 0, (off_t)db->reserve_bytes) == 0 && fdatasync(fd) == 0;
	if (!ok && ftruncate(fd, 0) != 0) /* a partial allocation must not keep space the index needs */
		KVT_LOGW("index %s: the reserve %s cannot be emptied again: %s", db->path, db->reserve_path, strerror(errno));
	close(fd);
	return ok;
}

/*
 * Space has returned when the file system has room for the reserve and a
 * quarter of it more: making it again with less would only fill the disk at
 * once and give it up again.
 */
static bool reserve_room(const kvt_db *db)
{
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s", db->reserve_path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	struct statvfs vs;
	if (statvfs(slash ? (dir[0] ? dir : "/") : ".", &vs) != 0)
		return false;
	return (uint64_t)vs.f_bavail * vs.f_frsize >= db->reserve_bytes + db->reserve_bytes / 4;
}

/* Give the reserve's space back to the file system; true if there was one to give. */
static bool reserve_release(kvt_db *db)
{
	if (!db->reserve_held)
		return false;
	int fd = open(db->reserve_path, O_RDWR | O_CLOEXEC);
	bool ok = fd >= 0 && ftruncate(fd, 0) == 0;
	if (fd >= 0)
		close(fd);
	if (!ok) {
		KVT_LOGE("index %s: the reserve %s cannot be given up: %s", db->path, db->reserve_path, strerror(errno));
		return false;
	}
	db->reserve_held = false;
	db->reserve_mode = true;
	db->reserve_retry_t = kvt_now_s() + FULL_RETRY_S;
	return true;
}

static bool is_session_op(const db_op *op) { return op->kind == OP_PUT_SESSION || op->kind == OP_DEL_SESSION; }

int kvt_db_open(const kvt_db_config *cfg, kvt_db **out)
{
	kvt_db *db;
	bool exists = false;
	char buf[64];
	int rc;

	if (!cfg || !cfg->path || !cfg->path[0]) {
		KVT_LOGE("index: no database path given");
		return KVT_EINVAL;
	}
	if (cfg->ns.block_tokens > KVT_BLOCK_MAX_TOKENS) {
		KVT_LOGE("index %s: namespace block_tokens %u out of range 1..%u", cfg->path, cfg->ns.block_tokens,
			 KVT_BLOCK_MAX_TOKENS);
		return KVT_EINVAL;
	}
	db = calloc(1, sizeof(*db));
	if (!db)
		return KVT_ENOMEM;
	db->path = strdup(cfg->path);
	db->dir = dir_of(cfg->path);
	if (!db->path || !db->dir) {
		db_free(db);
		return KVT_ENOMEM;
	}
	db->max_batch = cfg->max_batch ? cfg->max_batch : 4096;
	db->max_wait_us = cfg->max_wait_us;
	db->first_failed = UINT64_MAX;

	rc = precheck_file(db->path, db->dir, cfg->create, &exists);
	if (rc)
		goto fail;
	int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (cfg->create ? SQLITE_OPEN_CREATE : 0);
	int src = sqlite3_open_v2(db->path, &db->sql, flags, NULL);
	if (src != SQLITE_OK) {
		rc = fail(db, src, "open");
		goto fail;
	}
	sqlite3_extended_result_codes(db->sql, 1);
	/* NOTE: locking_mode must be EXCLUSIVE before journal_mode=WAL, so WAL uses heap memory, not -shm. */
	if ((rc = query_text(db, "PRAGMA locking_mode=EXCLUSIVE", buf, sizeof(buf))) != KVT_OK)
		goto fail;
	if ((rc = query_text(db, "PRAGMA journal_mode=WAL", buf, sizeof(buf))) != KVT_OK)
		goto fail;
	if (strcmp(buf, "wal") != 0) {
		KVT_LOGE("index %s: cannot switch to WAL (journal_mode is \"%s\")", db->path, buf);
		rc = KVT_EIO;
		goto fail;
	}
	if ((rc = exec(db, "PRAGMA synchronous=FULL", "synchronous=FULL")) != KVT_OK)
		goto fail;
	/*
	 * A 64 MiB page cache keeps the blocks b-trees' interior pages resident;
	 * checkpoints every 8,192 WAL pages (32 MiB at 4 KiB) instead of 1,000,
	 * so a burst of group commits is not interrupted by checkpoint fsyncs.
	 */
	if ((rc = exec(db, "PRAGMA cache_size=-65536; PRAGMA wal_autocheckpoint=8192", "cache pragmas")) != KVT_OK)
		goto fail;
	if (exists && !cfg->skip_check) {
		if ((rc = query_text(db, "PRAGMA quick_check", buf, sizeof(buf))) != KVT_OK)
			goto fail;
		if (strcmp(buf, "ok") != 0) {
			KVT_LOGE("index %s: integrity check failed (%s); run `kvtier rebuild-index --data-dir %s`",
				 db->path, buf, db->dir);
			rc = KVT_ECORRUPT;
			goto fail;
		}
	}
	if ((rc = migrate(db)) != KVT_OK)
		goto fail;
	if (cfg->ns.block_tokens && (rc = find_or_add_ns(db, &cfg->ns)) != KVT_OK)
		goto fail;
	bool owner_made = false;
	if ((rc = owner_id(db, cfg->owner_id, cfg->ns.block_tokens != 0, &owner_made)) != KVT_OK)
		goto fail;
	for (int i = 0; i < ST_COUNT; i++) {
		src = sqlite3_prepare_v3(db->sql, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &db->st[i], NULL);
		if (src != SQLITE_OK) {
			rc = fail(db, src, "prepare");
			goto fail;
		}
	}
	pthread_mutex_init(&db->mu, NULL);
	pthread_cond_init(&db->cv_queue, NULL);
	pthread_cond_init(&db->cv_done, NULL);
	db->ns = cfg->ns;
	db->sj_compact_min = cfg->journal_compact_bytes ? cfg->journal_compact_bytes : (4u << 20);
	db->journal_io = cfg->journal_io;
	if (cfg->journal_path && (rc = journal_open(db, cfg->journal_path, exists)) != KVT_OK)
		goto fail; /* NOTE: the mutex and conditions hold no resources on Linux */
	/*
	 * An index rebuilt from the session journal at this open (it had no owner
	 * id, so its first commits were lost: a young index whose WAL went before
	 * any checkpoint) takes the owner the T2 file beside the journal recorded.
	 */
	static const uint8_t zero_owner[KVT_DB_OWNER_BYTES];
	if (owner_made && db->stats.n_replayed && cfg->adopt_owner &&
	    memcmp(cfg->adopt_owner, zero_owner, KVT_DB_OWNER_BYTES) != 0) {
		memcpy(db->owner, cfg->adopt_owner, KVT_DB_OWNER_BYTES);
		if ((rc = owner_write(db)) != KVT_OK)
			goto fail;
		KVT_LOGW("index %s had lost its first commits (no owner id) and was rebuilt from the session journal: it "
			 "takes the owner id its T2 file recorded", db->path);
	}
	if (cfg->reserve_path && cfg->reserve_bytes) {
		if (!(db->reserve_path = strdup(cfg->reserve_path))) {
			rc = KVT_ENOMEM;
			goto fail;
		}
		db->reserve_bytes = cfg->reserve_bytes;
		db->reserve_held = reserve_take(db);
		if (!db->reserve_held) {
			/* the disk is already (nearly) full: start as with the reserve in use, retried once a second */
			KVT_LOGW("index %s: no room for the %llu-byte reserve %s: only session rows commit until it can be "
				 "made", db->path, (unsigned long long)db->reserve_bytes, db->reserve_path);
			db->reserve_mode = true;
			db->reserve_retry_t = kvt_now_s() + FULL_RETRY_S;
			db->degraded = db->stats.degraded = true; /* the blocks wait: /health says so */
			db->degraded_t = kvt_now_s();
		}
		db->stats.reserve_bytes = db->reserve_held ? db->reserve_bytes : 0;
		db->stats.reserve_in_use = db->reserve_mode;
	}
	if (pthread_create(&db->thread, NULL, writer_main, db) != 0) {
		KVT_LOGE("index %s: cannot start the writer thread", db->path);
		pthread_mutex_destroy(&db->mu);
		pthread_cond_destroy(&db->cv_queue);
		pthread_cond_destroy(&db->cv_done);
		rc = KVT_ENOMEM;
		goto fail;
	}
	*out = db;
	return KVT_OK;
fail:
	db_free(db);
	return rc;
}

int64_t kvt_db_ns_id(const kvt_db *db)
{
	return db->ns_id; /* immutable after open */
}

void kvt_db_owner_id(const kvt_db *db, uint8_t out[KVT_DB_OWNER_BYTES])
{
	memcpy(out, db->owner, KVT_DB_OWNER_BYTES); /* immutable after open */
}

/* ---- the writer thread ------------------------------------------------------- */

/*
 * A rolled-back transaction that may succeed later: the file system had no
 * space (SQLITE_FULL is SQLite's ENOSPC on a write) or the quota ran out.
 * Both happen while writing the WAL, before its fsync. NOTE: a failed fsync
 * (SQLITE_IOERR_FSYNC) is never transient: what the kernel dropped is gone,
 * so that failure stays sticky (DESIGN.md §4).
 */
static bool is_transient(kvt_db *db, int rc)
{
	if ((rc & 0xff) == SQLITE_FULL)
		return true;
	if (rc == SQLITE_IOERR_WRITE || rc == SQLITE_IOERR_TRUNCATE) {
		int e = sqlite3_system_errno(db->sql);
		return e == ENOSPC || e == EDQUOT;
	}
	return false;
}

/*
 * A statement of the writer's transaction failed. A transient failure (no
 * space) is not logged here: it rolls the transaction back, the writer logs
 * the episode once when it starts (naming SQLite's error) and once when writes
 * commit again, and retries in between without a line per attempt.
 */
static int writer_fail(kvt_db *db, int rc, const char *what)
{
	db->last_sql_rc = rc;
	if (is_transient(db, rc)) {
		db->last_transient = true;
		return KVT_EIO;
	}
	return fail(db, rc, what);
}

static int run_write(kvt_db *db, db_op *op)
{
	sqlite3_stmt *st;
	int rc;

	switch (op->kind) {
	case OP_PUT_BLOCK: {
		const kvt_db_block_row *r = &op->u.row;
		st = db->st[ST_PUT_BLOCK];
		sqlite3_bind_int64(st, 1, db->ns_id);
		sqlite3_bind_blob(st, 2, r->hash, KVT_HASH_BYTES, SQLITE_STATIC);
		sqlite3_bind_blob(st, 3, r->parent, KVT_HASH_BYTES, SQLITE_STATIC);
		bind_tokens(st, 4, r->tokens, r->n_tokens);
		sqlite3_bind_int64(st, 5, (int64_t)r->loc.off);
		sqlite3_bind_int64(st, 6, r->loc.extent_bytes);
		sqlite3_bind_int64(st, 7, r->loc.stored_bytes);
		sqlite3_bind_int64(st, 8, (int64_t)r->loc.generation);
		sqlite3_bind_int64(st, 9, (int64_t)r->loc.checksum);
		sqlite3_bind_int(st, 10, r->loc.compressed);
		sqlite3_bind_int(st, 11, r->kv_dtype);
		sqlite3_bind_int(st, 12, r->codec);
		sqlite3_bind_int(st, 13, r->scale_layout);
		sqlite3_bind_int64(st, 14, r->raw_bytes);
		sqlite3_bind_int64(st, 15, (int64_t)r->last_use);
		sqlite3_bind_int64(st, 16, (int64_t)r->hit_count);
		sqlite3_bind_int64(st, 17, (int64_t)r->retain_until_us);
		sqlite3_bind_int64(st, 18, (int64_t)r->retain_ttl_us);
		sqlite3_bind_int(st, 19, r->retain_floor);
		sqlite3_bind_text(st, 20, r->retain_tenant, -1, SQLITE_STATIC);
		sqlite3_bind_int(st, 21, r->kind);
		break;
	}
	case OP_DEL_BLOCK:
		st = db->st[ST_DEL_BLOCK];
		sqlite3_bind_int64(st, 1, op->u.blk.ns_id);
		sqlite3_bind_blob(st, 2, op->u.blk.hash, KVT_HASH_BYTES, SQLITE_STATIC);
		break;
	case OP_TOUCH_BLOCK:
		st = db->st[ST_TOUCH_BLOCK];
		sqlite3_bind_int64(st, 1, db->ns_id);
		sqlite3_bind_blob(st, 2, op->u.blk.hash, KVT_HASH_BYTES, SQLITE_STATIC);
		sqlite3_bind_int64(st, 3, (int64_t)op->u.blk.last_use);
		sqlite3_bind_int64(st, 4, (int64_t)op->u.blk.hit_count);
		break;
	case OP_RETAIN_BLOCK:
		st = db->st[ST_RETAIN_BLOCK];
		sqlite3_bind_int64(st, 1, db->ns_id);
		sqlite3_bind_blob(st, 2, op->u.blk.hash, KVT_HASH_BYTES, SQLITE_STATIC);
		sqlite3_bind_int64(st, 3, (int64_t)op->u.blk.retain_until_us);
		sqlite3_bind_int64(st, 4, (int64_t)op->u.blk.retain_ttl_us);
		sqlite3_bind_int(st, 5, op->u.blk.retain_floor);
		sqlite3_bind_text(st, 6, op->u.blk.retain_tenant, -1, SQLITE_STATIC);
		break;
	case OP_PUT_SESSION: {
		const kvt_db_session *s = &op->u.sess;
		st = db->st[ST_PUT_SESSION];
		sqlite3_bind_int64(st, 1, db->ns_id);
		sqlite3_bind_text(st, 2, s->tenant, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, s->id, -1, SQLITE_STATIC);
		bind_tokens(st, 4, s->tokens, s->n_tokens);
		sqlite3_bind_int64(st, 5, s->n_tokens);
		sqlite3_bind_blob(st, 6, s->last_hash, KVT_HASH_BYTES, SQLITE_STATIC);
		sqlite3_bind_int64(st, 7, now_unix());
		sqlite3_bind_int64(st, 8, s->durable_tokens);
		break;
	}
	case OP_MARK_SESSION:
		st = db->st[ST_MARK_SESSION];
		sqlite3_bind_int64(st, 1, db->ns_id);
		sqlite3_bind_text(st, 2, op->u.sess.tenant, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, op->u.sess.id, -1, SQLITE_STATIC);
		sqlite3_bind_blob(st, 4, op->u.sess.last_hash, KVT_HASH_BYTES, SQLITE_STATIC);
		sqlite3_bind_int64(st, 5, op->u.sess.durable_tokens);
		break;
	case OP_DEL_SESSION:
		st = db->st[ST_DEL_SESSION];
		sqlite3_bind_int64(st, 1, db->ns_id);
		sqlite3_bind_text(st, 2, op->u.sess.tenant, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, op->u.sess.id, -1, SQLITE_STATIC);
		break;
	default:
		KVT_ASSERT(!"not a write");
		return KVT_EINVAL;
	}
	rc = sqlite3_step(st);
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	if (rc == SQLITE_DONE)
		return KVT_OK;
	return writer_fail(db, rc, "write");
}

static int step_simple(kvt_db *db, int which, const char *what)
{
	int rc = sqlite3_step(db->st[which]);
	sqlite3_reset(db->st[which]);
	if (rc == SQLITE_DONE)
		return KVT_OK;
	return writer_fail(db, rc, what);
}

/*
 * One transaction: the carried session writes (oldest first), then a chain of
 * n writes; with neither, a probe write (is there space again?). *commit_s
 * gets the COMMIT's seconds.
 */
static int run_batch(kvt_db *db, db_op *first, uint32_t n, bool sessions_only, double *commit_s)
{
	db->last_sql_rc = SQLITE_OK;
	db->last_transient = false;
	int rc = step_simple(db, ST_BEGIN, "begin");
	for (db_op *op = db->carry; rc == KVT_OK && op; op = op->next)
		rc = run_write(db, op);
	db_op *op = first;
	for (uint32_t i = 0; rc == KVT_OK && i < n; i++, op = op->next)
		if (!sessions_only || is_session_op(op))
			rc = run_write(db, op);
	if (rc == KVT_OK && !n && !db->carry)
		rc = step_simple(db, ST_PROBE, "probe");
	if (rc == KVT_OK)
		rc = journal_batch(db, first, n);
	if (rc == KVT_OK) {
		kvt_fault_point("idx.commit.before"); /* every write of the batch run, not committed */
		double t0 = kvt_now_s();
		rc = step_simple(db, ST_COMMIT, "commit");
		*commit_s = kvt_now_s() - t0;
		if (rc == KVT_OK)
			kvt_fault_point("idx.commit.committed"); /* committed, no callback run, no waiter told */
	}
	if (rc != KVT_OK && !sqlite3_get_autocommit(db->sql))
		step_simple(db, ST_ROLLBACK, "rollback");
	return rc;
}

static void free_op(db_op *op);

static bool same_session(const db_op *a, const db_op *b)
{
	return !strcmp(a->u.sess.tenant, b->u.sess.tenant) && !strcmp(a->u.sess.id, b->u.sess.id);
}

/* Keep a rolled-back session write for the next transaction; a later write of the same session replaces it. */
static void carry_add(kvt_db *db, db_op *op)
{
	db_op **pp = &db->carry;
	while (*pp) {
		if (same_session(*pp, op)) {
			db_op *old = *pp;
			*pp = old->next;
			free_op(old);
			continue;
		}
		pp = &(*pp)->next;
	}
	op->next = NULL;
	op->done = NULL; /* it was told once (KVT_EFULL); the carried copy commits silently */
	*pp = op;
}

static uint32_t carry_count(const kvt_db *db)
{
	uint32_t n = 0;
	for (const db_op *op = db->carry; op; op = op->next)
		n++;
	return n;
}

static void carry_clear(kvt_db *db)
{
	while (db->carry) {
		db_op *op = db->carry;
		db->carry = op->next;
		free_op(op);
	}
}

/* Under mu: tickets lo..hi were rolled back for lack of space. */
static void full_range_add(kvt_db *db, uint64_t lo, uint64_t hi)
{
	if (db->n_full_rng && db->full_rng[db->n_full_rng - 1].hi + 1 == lo) {
		db->full_rng[db->n_full_rng - 1].hi = hi;
		return;
	}
	if (db->n_full_rng == FULL_RANGES) {
		/* NOTE: forgetting a range must never turn a lost write into a committed
		 * one, so the oldest tickets all read as lost from now on. */
		db->full_floor = db->full_rng[0].hi;
		memmove(&db->full_rng[0], &db->full_rng[1], (FULL_RANGES - 1) * sizeof(db->full_rng[0]));
		db->n_full_rng--;
	}
	db->full_rng[db->n_full_rng].lo = lo;
	db->full_rng[db->n_full_rng].hi = hi;
	db->n_full_rng++;
}

/* Under mu: was ticket t in a transaction rolled back for lack of space? */
static bool full_range_has(const kvt_db *db, uint64_t t)
{
	if (t && t <= db->full_floor) /* ticket 0: no write at all */
		return true;
	for (uint32_t i = 0; i < db->n_full_rng; i++)
		if (t >= db->full_rng[i].lo && t <= db->full_rng[i].hi)
			return true;
	return false;
}

static void free_op(db_op *op)
{
	if (op->kind == OP_PUT_SESSION)
		free(op->u.sess.tokens);
	free(op);
}

static void *writer_main(void *arg)
{
	kvt_db *db = arg;

	pthread_mutex_lock(&db->mu);
	for (;;) {
		bool retry = false;
		while (!db->head && !db->stop && !retry) {
			if (!db->degraded) {
				pthread_cond_wait(&db->cv_queue, &db->mu);
				continue;
			}
			/* Degraded and idle: retry the kept writes (or probe) once a second. */
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += (time_t)FULL_RETRY_S;
			retry = pthread_cond_timedwait(&db->cv_queue, &db->mu, &ts) == ETIMEDOUT && !db->head;
		}
		if (!db->head && !retry) {
			if (db->carry) {
				/* Stopping: one last try for the kept session writes. */
				pthread_mutex_unlock(&db->mu);
				double cs = 0;
				uint32_t n_carry = carry_count(db);
				if (!db->failed && run_batch(db, NULL, 0, false, &cs) == KVT_OK)
					KVT_LOGI("index %s: %u kept session writes committed at close", db->path, n_carry);
				else
					KVT_LOGE("index %s: closing with %u session writes not committed (no space): they are "
						 "lost", db->path, n_carry);
				carry_clear(db);
				pthread_mutex_lock(&db->mu);
			}
			break; /* stopping and drained */
		}
		if (db->head && db->head->kind == OP_READ) {
			db_op *op = db->head;
			db->head = op->next;
			if (!db->head)
				db->tail = NULL;
			pthread_mutex_unlock(&db->mu);
			int rc = op->u.rd.fn(db, op->u.rd.ctx);
			pthread_mutex_lock(&db->mu);
			op->u.rd.rc = rc;
			op->u.rd.finished = true;
			pthread_cond_broadcast(&db->cv_done);
			continue;
		}
		if (db->head && db->max_wait_us && !db->stop) {
			/* Group-commit window: let more writers join this transaction. */
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)db->max_wait_us * 1000u;
			ts.tv_sec += (time_t)(ns / 1000000000u);
			ts.tv_nsec = (long)(ns % 1000000000u);
			pthread_cond_timedwait(&db->cv_queue, &db->mu, &ts);
		}
		/* Take consecutive writes, up to max_batch, stopping before a read (none: a retry). */
		db_op *first = db->head, *last = first;
		uint32_t n = 0;
		if (first && first->kind != OP_READ) {
			n = 1;
			while (n < db->max_batch && last->next && last->next->kind != OP_READ) {
				last = last->next;
				n++;
			}
			db->head = last->next;
			if (!db->head)
				db->tail = NULL;
			last->next = NULL;
		} else {
			first = last = NULL;
		}
		if (!n && !retry)
			continue;
		bool failed = db->failed;
		uint64_t first_ticket = first ? first->ticket : 0, last_ticket = last ? last->ticket : 0;
		pthread_mutex_unlock(&db->mu);

		/* The reserve in use: space may have returned (it can be made again), else only session writes run. */
		bool restored = false;
		if (db->reserve_mode && !failed && kvt_now_s() >= db->reserve_retry_t) {
			db->reserve_retry_t = kvt_now_s() + FULL_RETRY_S;
			if ((restored = reserve_room(db) && reserve_take(db))) {
				db->reserve_held = true;
				db->reserve_mode = false;
			}
		}
		if (restored)
			KVT_LOGW("index %s: there is space again: the %llu-byte reserve is made again; block rows commit again",
				 db->path, (unsigned long long)db->reserve_bytes);
		if (db->reserve_mode && !n && !db->carry) { /* an idle retry: nothing to commit, no probe to make */
			pthread_mutex_lock(&db->mu);
			continue;
		}
		double commit_s = 0;
		bool sessions_only = db->reserve_mode;
		int rc = failed ? KVT_EIO : run_batch(db, first, n, sessions_only, &commit_s);
		bool transient = rc != KVT_OK && !failed && db->last_transient;
		bool released = false;
		if (transient && !sessions_only && (released = reserve_release(db))) {
			/* the disk is full: the reserve's space is given back, and the session writes run again at once */
			sessions_only = true;
			rc = run_batch(db, first, n, true, &commit_s);
			transient = rc != KVT_OK && db->last_transient;
		}
		uint32_t n_carried = carry_count(db);
		uint32_t n_refused = 0; /* block-row writes refused because the reserve is in use */
		if (rc == KVT_OK && sessions_only)
			for (db_op *op = first; op; op = op->next)
				n_refused += !is_session_op(op);

		if (rc != KVT_OK)
			rc = transient ? KVT_EFULL : KVT_EIO;
		if (rc == KVT_OK) {
			carry_clear(db); /* committed with this transaction */
		}
		if (rc == KVT_OK && db->sj && kvt_sj_bytes(db->sj) > db->sj_compact_at)
			(void)journal_rewrite(db); /* logged; stats under mu below */
		/* The refused block-row writes' tickets, as runs (kvt_db_wait reports KVT_EFULL for them). */
		struct full_range *refused = NULL;
		uint32_t n_runs = 0;
		if (n_refused && (refused = malloc(n_refused * sizeof(*refused))))
			for (db_op *op = first, *prev = NULL; op; prev = op, op = op->next) {
				if (is_session_op(op))
					continue;
				if (n_runs && prev && !is_session_op(prev))
					refused[n_runs - 1].hi = op->ticket;
				else
					refused[n_runs++] = (struct full_range){ op->ticket, op->ticket };
			}
		/* Callbacks first, so that when kvt_db_wait returns the write's callback has run. */
		for (db_op *op = first; op;) {
			db_op *next = op->next;
			if (op->done)
				op->done(op->user, rc == KVT_OK && sessions_only && !is_session_op(op) ? KVT_EFULL : rc);
			if (transient && (op->kind == OP_PUT_SESSION || op->kind == OP_DEL_SESSION))
				carry_add(db, op); /* the history of a turn already answered: kept, retried */
			else
				free_op(op);
			op = next;
		}
		if (rc != KVT_OK && !transient) {
			carry_clear(db); /* the handle failed for good: nothing more will commit */
		}
		pthread_mutex_lock(&db->mu);
		if (transient) {
			if (!db->degraded) {
				KVT_LOGE("index %s: a transaction of %u writes was rolled back: %s; durability is degraded: the "
					 "session writes are kept and the blocks stay pending, all retried until space returns",
					 db->path, n + n_carried, sqlite3_errstr(db->last_sql_rc));
				db->degraded = true;
				db->degraded_t = kvt_now_s();
				db->n_full_episode = 0;
			}
			db->n_full_episode++;
			db->stats.n_full++;
			if (n)
				full_range_add(db, first_ticket, last_ticket);
			db->stats.n_failed += n;
		} else if (rc != KVT_OK) {
			if (!db->failed)
				KVT_LOGE("index %s: a transaction of %u writes failed; the index refuses writes until reopened",
					 db->path, n + n_carried);
			db->failed = true;
			db->degraded = false;
			if (db->first_failed == UINT64_MAX)
				db->first_failed = db->done_ticket + 1; /* this batch and all queued after it */
			db->stats.n_failed += n + n_carried;
		} else if (sessions_only) {
			/* committed on the reserve: the session writes are durable, the block rows wait for space */
			if (released)
				KVT_LOGE("index %s: the disk is full: the %llu-byte reserve is given up so that session rows "
					 "still commit; block rows are refused until space returns", db->path,
					 (unsigned long long)db->reserve_bytes);
			if (!db->degraded) {
				KVT_LOGE("index %s: no space: durability is degraded: session writes commit on the reserve, "
					 "the blocks stay pending until space returns", db->path);
				db->degraded = true;
				db->degraded_t = kvt_now_s();
				db->n_full_episode = 0;
			}
			db->n_full_episode++;
			for (uint32_t k = 0; refused && k < n_runs; k++)
				full_range_add(db, refused[k].lo, refused[k].hi);
			if (n_refused && !refused) /* no memory for the runs: the whole batch's tickets (sessions' too) */
				full_range_add(db, first_ticket, last_ticket);
			db->stats.n_failed += n_refused;
			db->stats.n_reserve_refused += n_refused;
			if (n + n_carried > n_refused) {
				db->stats.n_commits++;
				db->stats.commit_s += commit_s;
				db->stats.n_writes += n + n_carried - n_refused;
			}
		} else {
			if (db->degraded) {
				KVT_LOGW("index %s: writes commit again after %llu rolled-back transactions in %.1f s (%u kept "
					 "session writes committed); durability restored",
					 db->path, (unsigned long long)db->n_full_episode, kvt_now_s() - db->degraded_t,
					 n_carried);
				db->degraded = false;
			}
			if (n + n_carried) {
				db->stats.n_commits++;
				db->stats.commit_s += commit_s;
				db->stats.n_writes += n + n_carried;
				if (n > db->stats.max_batch_seen)
					db->stats.max_batch_seen = n;
			}
		}
		free(refused);
		db->stats.reserve_bytes = db->reserve_held ? db->reserve_bytes : 0;
		db->stats.reserve_in_use = db->reserve_mode;
		db->stats.degraded = db->degraded;
		if (db->sj)
			db->stats.journal_bytes = kvt_sj_bytes(db->sj);
		db->stats.n_carried = carry_count(db);
		if (n)
			db->done_ticket = last_ticket;
		pthread_cond_broadcast(&db->cv_done);
	}
	pthread_mutex_unlock(&db->mu);
	return NULL;
}

void kvt_db_close(kvt_db *db)
{
	if (!db)
		return;
	pthread_mutex_lock(&db->mu);
	db->stop = true;
	pthread_cond_broadcast(&db->cv_queue);
	pthread_mutex_unlock(&db->mu);
	pthread_join(db->thread, NULL);
	pthread_mutex_destroy(&db->mu);
	pthread_cond_destroy(&db->cv_queue);
	pthread_cond_destroy(&db->cv_done);
	db_free(db);
}

/* ---- queueing --------------------------------------------------------------- */

static int enqueue(kvt_db *db, db_op *op, uint64_t *ticket)
{
	pthread_mutex_lock(&db->mu);
	if (db->failed || db->stop) {
		pthread_mutex_unlock(&db->mu);
		free_op(op);
		return KVT_EIO;
	}
	op->next = NULL;
	op->ticket = ++db->next_ticket;
	if (db->tail)
		db->tail->next = op;
	else
		db->head = op;
	db->tail = op;
	if (ticket)
		*ticket = op->ticket;
	pthread_cond_signal(&db->cv_queue);
	pthread_mutex_unlock(&db->mu);
	return KVT_OK;
}

static db_op *new_op(int kind, kvt_db_done_fn done, void *user)
{
	db_op *op = calloc(1, sizeof(*op));
	if (op) {
		op->kind = kind;
		op->done = done;
		op->user = user;
	}
	return op;
}

int kvt_db_put_block(kvt_db *db, const kvt_db_block_row *row, kvt_db_done_fn done, void *user, uint64_t *ticket)
{
	if (!db->ns_id) {
		KVT_LOGE("index %s: this handle has no namespace (opened with block_tokens 0): cannot write", db->path);
		return KVT_EINVAL;
	}
	if (row->n_tokens < 1 || row->n_tokens > KVT_BLOCK_MAX_TOKENS) {
		KVT_LOGE("index %s: block row with %u tokens (1..%u)", db->path, row->n_tokens, KVT_BLOCK_MAX_TOKENS);
		return KVT_EINVAL;
	}
	if (row->kind >= KVT_BLOCK_KIND_COUNT) {
		KVT_LOGE("index %s: block row of kind %u (0 prefix, 1 chunk)", db->path, row->kind);
		return KVT_EINVAL;
	}
	db_op *op = new_op(OP_PUT_BLOCK, done, user);
	if (!op)
		return KVT_ENOMEM;
	op->u.row = *row;
	return enqueue(db, op, ticket);
}

int kvt_db_delete_block_ns(kvt_db *db, int64_t ns_id, const uint8_t hash[KVT_HASH_BYTES], kvt_db_done_fn done,
			   void *user, uint64_t *ticket)
{
	db_op *op = new_op(OP_DEL_BLOCK, done, user);
	if (!op)
		return KVT_ENOMEM;
	op->u.blk.ns_id = ns_id;
	memcpy(op->u.blk.hash, hash, KVT_HASH_BYTES);
	return enqueue(db, op, ticket);
}

int kvt_db_delete_block(kvt_db *db, const uint8_t hash[KVT_HASH_BYTES], kvt_db_done_fn done, void *user,
			uint64_t *ticket)
{
	return kvt_db_delete_block_ns(db, db->ns_id, hash, done, user, ticket);
}

int kvt_db_touch_block(kvt_db *db, const uint8_t hash[KVT_HASH_BYTES], uint64_t last_use, uint64_t hit_count,
		       kvt_db_done_fn done, void *user, uint64_t *ticket)
{
	db_op *op = new_op(OP_TOUCH_BLOCK, done, user);
	if (!op)
		return KVT_ENOMEM;
	memcpy(op->u.blk.hash, hash, KVT_HASH_BYTES);
	op->u.blk.last_use = last_use;
	op->u.blk.hit_count = hit_count;
	return enqueue(db, op, ticket);
}

int kvt_db_retain_block(kvt_db *db, const uint8_t hash[KVT_HASH_BYTES], uint64_t until_us, uint64_t ttl_us,
			int floor_tier, const char *tenant, kvt_db_done_fn done, void *user, uint64_t *ticket)
{
	if (floor_tier < 0 || floor_tier >= KVT_TIER_COUNT || (tenant && strlen(tenant) > KVT_NAME_MAX)) {
		KVT_LOGE("index %s: retain: floor tier %d or tenant out of range", db->path, floor_tier);
		return KVT_EINVAL;
	}
	db_op *op = new_op(OP_RETAIN_BLOCK, done, user);
	if (!op)
		return KVT_ENOMEM;
	memcpy(op->u.blk.hash, hash, KVT_HASH_BYTES);
	op->u.blk.retain_until_us = until_us;
	op->u.blk.retain_ttl_us = ttl_us;
	op->u.blk.retain_floor = (uint8_t)floor_tier;
	snprintf(op->u.blk.retain_tenant, sizeof(op->u.blk.retain_tenant), "%s", tenant ? tenant : "");
	return enqueue(db, op, ticket);
}

int kvt_db_put_session(kvt_db *db, const kvt_db_session *s, kvt_db_done_fn done, void *user, uint64_t *ticket)
{
	if (!db->ns_id) {
		KVT_LOGE("index %s: this handle has no namespace (opened with block_tokens 0): cannot write", db->path);
		return KVT_EINVAL;
	}
	if (kvt_name_check("session id", s->id) || kvt_name_check("tenant", s->tenant))
		return KVT_EINVAL;
	if (s->n_tokens && !s->tokens) {
		KVT_LOGE("index %s: session %s: %u tokens but no token array", db->path, s->id, s->n_tokens);
		return KVT_EINVAL;
	}
	db_op *op = new_op(OP_PUT_SESSION, done, user);
	if (!op)
		return KVT_ENOMEM;
	op->u.sess = *s;
	op->u.sess.tokens = NULL;
	if (s->n_tokens) {
		op->u.sess.tokens = malloc((size_t)s->n_tokens * sizeof(int32_t));
		if (!op->u.sess.tokens) {
			free(op);
			return KVT_ENOMEM;
		}
		memcpy(op->u.sess.tokens, s->tokens, (size_t)s->n_tokens * sizeof(int32_t));
	}
	return enqueue(db, op, ticket);
}

int kvt_db_mark_session_durable(kvt_db *db, const char *tenant, const char *id,
				const uint8_t last_hash[KVT_HASH_BYTES], uint32_t durable_tokens, kvt_db_done_fn done,
				void *user, uint64_t *ticket)
{
	if (kvt_name_check("session id", id) || kvt_name_check("tenant", tenant))
		return KVT_EINVAL;
	db_op *op = new_op(OP_MARK_SESSION, done, user);
	if (!op)
		return KVT_ENOMEM;
	snprintf(op->u.sess.tenant, sizeof(op->u.sess.tenant), "%s", tenant);
	snprintf(op->u.sess.id, sizeof(op->u.sess.id), "%s", id);
	memcpy(op->u.sess.last_hash, last_hash, KVT_HASH_BYTES);
	op->u.sess.durable_tokens = durable_tokens;
	return enqueue(db, op, ticket);
}

int kvt_db_delete_session(kvt_db *db, const char *tenant, const char *id, kvt_db_done_fn done, void *user,
			  uint64_t *ticket)
{
	if (kvt_name_check("session id", id) || kvt_name_check("tenant", tenant))
		return KVT_EINVAL;
	db_op *op = new_op(OP_DEL_SESSION, done, user);
	if (!op)
		return KVT_ENOMEM;
	snprintf(op->u.sess.tenant, sizeof(op->u.sess.tenant), "%s", tenant);
	snprintf(op->u.sess.id, sizeof(op->u.sess.id), "%s", id);
	return enqueue(db, op, ticket);
}

int kvt_db_wait(kvt_db *db, uint64_t ticket)
{
	int rc;
	pthread_mutex_lock(&db->mu);
	if (ticket > db->next_ticket) {
		pthread_mutex_unlock(&db->mu);
		KVT_LOGE("index %s: wait for ticket %llu, which was never handed out", db->path,
			 (unsigned long long)ticket);
		return KVT_EINVAL;
	}
	while (db->done_ticket < ticket)
		pthread_cond_wait(&db->cv_done, &db->mu);
	rc = ticket >= db->first_failed ? KVT_EIO : full_range_has(db, ticket) ? KVT_EFULL : KVT_OK;
	pthread_mutex_unlock(&db->mu);
	return rc;
}

int kvt_db_flush(kvt_db *db)
{
	uint64_t t;
	pthread_mutex_lock(&db->mu);
	t = db->next_ticket;
	pthread_mutex_unlock(&db->mu);
	return kvt_db_wait(db, t);
}

uint64_t kvt_db_done_ticket(kvt_db *db)
{
	pthread_mutex_lock(&db->mu);
	uint64_t t = db->done_ticket;
	pthread_mutex_unlock(&db->mu);
	return t;
}

void kvt_db_get_stats(kvt_db *db, kvt_db_stats *st)
{
	pthread_mutex_lock(&db->mu);
	*st = db->stats;
	pthread_mutex_unlock(&db->mu);
}

/* Run fn on the writer thread after every write queued before it has finished. */
static int run_read(kvt_db *db, read_fn fn, void *ctx)
{
	db_op op;
	memset(&op, 0, sizeof(op));
	op.kind = OP_READ;
	op.u.rd.fn = fn;
	op.u.rd.ctx = ctx;
	pthread_mutex_lock(&db->mu);
	if (db->stop) {
		pthread_mutex_unlock(&db->mu);
		return KVT_EIO;
	}
	if (db->tail)
		db->tail->next = &op;
	else
		db->head = &op;
	db->tail = &op;
	pthread_cond_signal(&db->cv_queue);
	while (!op.u.rd.finished)
		pthread_cond_wait(&db->cv_done, &db->mu);
	pthread_mutex_unlock(&db->mu);
	return op.u.rd.rc;
}

/* ---- reads (writer thread) ------------------------------------------------------ */

/* Decode a token blob; KVT_ECORRUPT if its length is not whole ids or over max. */
static int column_tokens(kvt_db *db, sqlite3_stmt *st, int col, uint32_t max, int32_t *out, uint32_t *n_out,
			 const char *what)
{
	const uint8_t *p = sqlite3_column_blob(st, col);
	int n_bytes = sqlite3_column_bytes(st, col);
	if (n_bytes < 0 || n_bytes % 4 != 0 || (uint32_t)n_bytes / 4 > max) {
		KVT_LOGE("index %s: %s: token blob of %d bytes (need a multiple of 4, at most %u ids); run "
			 "`kvtier rebuild-index --data-dir %s`",
			 db->path, what, n_bytes, max, db->dir);
		return KVT_ECORRUPT;
	}
	for (int i = 0; i < n_bytes / 4; i++)
		out[i] = (int32_t)get_u32le(p + 4 * i);
	*n_out = (uint32_t)n_bytes / 4;
	return KVT_OK;
}

static int column_hash(kvt_db *db, sqlite3_stmt *st, int col, uint8_t out[KVT_HASH_BYTES], const char *what)
{
	if (sqlite3_column_bytes(st, col) != KVT_HASH_BYTES) {
		KVT_LOGE("index %s: %s: hash of %d bytes, expected %d; run `kvtier rebuild-index --data-dir %s`",
			 db->path, what, sqlite3_column_bytes(st, col), KVT_HASH_BYTES, db->dir);
		return KVT_ECORRUPT;
	}
	memcpy(out, sqlite3_column_blob(st, col), KVT_HASH_BYTES);
	return KVT_OK;
}

struct session_get_ctx {
	const char *tenant, *id; /* key */
	kvt_db_session *out;     /* result */
};

static int session_from_row(kvt_db *db, sqlite3_stmt *st, kvt_db_session *s, int32_t **tokens_heap)
{
	/* columns: tenant, id, tokens, n_tokens, last_hash, created, updated, durable_tokens[, rowid] */
	int n_bytes = sqlite3_column_bytes(st, 2);
	uint32_t n = 0;
	const char *tenant = (const char *)sqlite3_column_text(st, 0);
	const char *id = (const char *)sqlite3_column_text(st, 1);
	if (!tenant || !id || !kvt_name_valid(tenant) || !kvt_name_valid(id)) {
		KVT_LOGE("index %s: a session row has an invalid tenant or id; run `kvtier rebuild-index --data-dir %s`",
			 db->path, db->dir);
		return KVT_ECORRUPT;
	}
	snprintf(s->tenant, sizeof(s->tenant), "%s", tenant);
	snprintf(s->id, sizeof(s->id), "%s", id);
	int32_t *t = malloc(n_bytes > 0 ? (size_t)n_bytes : 1);
	if (!t)
		return KVT_ENOMEM;
	char what[KVT_NAME_MAX * 2 + 48];
	snprintf(what, sizeof(what), "session %s/%s tokens", s->tenant, s->id);
	int rc = column_tokens(db, st, 2, (uint32_t)(n_bytes / 4), t, &n, what);
	if (rc == KVT_OK && (int64_t)n != sqlite3_column_int64(st, 3)) {
		KVT_LOGE("index %s: session %s/%s: n_tokens %lld but %u token ids stored; run `kvtier rebuild-index "
			 "--data-dir %s`",
			 db->path, s->tenant, s->id, (long long)sqlite3_column_int64(st, 3), n, db->dir);
		rc = KVT_ECORRUPT;
	}
	if (rc == KVT_OK) {
		snprintf(what, sizeof(what), "session %s/%s last_hash", s->tenant, s->id);
		rc = column_hash(db, st, 4, s->last_hash, what);
	}
	if (rc) {
		free(t);
		return rc;
	}
	s->tokens = t;
	s->n_tokens = n;
	s->created = sqlite3_column_int64(st, 5);
	s->updated = sqlite3_column_int64(st, 6);
	/* a count past the history (a damaged row) promises nothing */
	const int64_t d = sqlite3_column_int64(st, 7);
	s->durable_tokens = d > 0 && d <= (int64_t)n ? (uint32_t)d : 0;
	*tokens_heap = t;
	return KVT_OK;
}

/*
 * A session row that does not decode (session_from_row logged why) is skipped
 * by the listing: counted, and named once per row in the log, so one bad row
 * never hides the others. Writer thread.
 */
static void skip_bad_session(kvt_db *db, int64_t rowid)
{
	bool seen = false;
	for (uint32_t i = 0; i < db->n_bad_seen && !seen; i++)
		seen = db->bad_seen[i] == rowid;
	if (!seen && db->n_bad_seen < sizeof(db->bad_seen) / sizeof(db->bad_seen[0]))
		db->bad_seen[db->n_bad_seen++] = rowid;
	pthread_mutex_lock(&db->mu);
	if (!seen)
		db->stats.n_bad_sessions++;
	pthread_mutex_unlock(&db->mu);
	if (!seen)
		KVT_LOGW("index %s: session row %lld is unreadable (see above) and is skipped; the other sessions are "
			 "listed", db->path, (long long)rowid);
}

static int session_get_fn(kvt_db *db, void *arg)
{
	struct session_get_ctx *c = arg;
	sqlite3_stmt *st = NULL;
	int32_t *heap = NULL;
	int rc = sqlite3_prepare_v2(db->sql,
				    "SELECT tenant, id, tokens, n_tokens, last_hash, created, updated, durable_tokens FROM sessions"
				    " WHERE ns=?1 AND tenant=?2 AND id=?3",
				    -1, &st, NULL);
	if (rc != SQLITE_OK)
		return fail(db, rc, "prepare session get");
	sqlite3_bind_int64(st, 1, db->ns_id);
	sqlite3_bind_text(st, 2, c->tenant, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, c->id, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		rc = session_from_row(db, st, c->out, &heap);
	else if (rc == SQLITE_DONE)
		rc = KVT_ENOTFOUND;
	else
		rc = fail(db, rc, "session get");
	sqlite3_finalize(st);
	return rc;
}

int kvt_db_get_session(kvt_db *db, const char *tenant, const char *id, kvt_db_session *out)
{
	kvt_db_session s;
	struct session_get_ctx c = { tenant, id, &s };
	if (kvt_name_check("session id", id) || kvt_name_check("tenant", tenant))
		return KVT_EINVAL;
	memset(&s, 0, sizeof(s));
	int rc = run_read(db, session_get_fn, &c);
	if (rc == KVT_OK)
		*out = s;
	return rc;
}

void kvt_db_session_deinit(kvt_db_session *s)
{
	if (!s)
		return;
	free(s->tokens);
	s->tokens = NULL;
	s->n_tokens = 0;
}

struct session_list_ctx {
	const char *tenant;                              /* filter or NULL */
	int (*fn)(void *ctx, const kvt_db_session *s);   /* user callback */
	void *ctx;                                       /* its argument */
};

static int session_list_fn(kvt_db *db, void *arg)
{
	struct session_list_ctx *c = arg;
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(db->sql,
				    "SELECT tenant, id, tokens, n_tokens, last_hash, created, updated, durable_tokens, rowid"
				    " FROM sessions"
				    " WHERE ns=?1 AND (?2 IS NULL OR tenant=?2) ORDER BY tenant, id",
				    -1, &st, NULL);
	if (rc != SQLITE_OK)
		return fail(db, rc, "prepare session list");
	sqlite3_bind_int64(st, 1, db->ns_id);
	if (c->tenant)
		sqlite3_bind_text(st, 2, c->tenant, -1, SQLITE_STATIC);
	while (next_row(db, st, "session list", &rc)) {
		kvt_db_session s;
		int32_t *heap = NULL;
		memset(&s, 0, sizeof(s));
		rc = session_from_row(db, st, &s, &heap);
		if (rc == KVT_ECORRUPT) {
			skip_bad_session(db, sqlite3_column_int64(st, 8));
			continue;
		}
		if (rc)
			break;
		rc = c->fn(c->ctx, &s);
		free(heap);
		if (rc)
			break;
	}
	sqlite3_finalize(st);
	return rc;
}

int kvt_db_list_sessions(kvt_db *db, const char *tenant, int (*fn)(void *ctx, const kvt_db_session *s), void *ctx)
{
	struct session_list_ctx c = { tenant, fn, ctx };
	if (tenant && kvt_name_check("tenant", tenant))
		return KVT_EINVAL;
	return run_read(db, session_list_fn, &c);
}

struct block_walk_ctx {
	unsigned flags;                                       /* KVT_DB_ALL_NS */
	int (*fn)(void *ctx, const kvt_db_block_row *row);    /* user callback */
	void *ctx;                                            /* its argument */
};

#define BLOCK_COLS                                                                                     \
	"b.ns, b.hash, b.parent, b.tokens, b.off, b.extent_bytes, b.stored_bytes, b.generation, b.checksum, " \
	"b.compressed, b.kv_dtype, b.codec, b.scale_layout, b.raw_bytes, b.last_use, b.hit_count, b.id, "       \
	"b.retain_until, b.retain_ttl, b.retain_floor, b.retain_tenant, b.kind"

static int block_from_row(kvt_db *db, sqlite3_stmt *st, kvt_db_block_row *r)
{
	char what[64];
	int64_t rowid = sqlite3_column_int64(st, 16);
	int rc;
	snprintf(what, sizeof(what), "block row %lld", (long long)rowid);
	r->ns_id = sqlite3_column_int64(st, 0);
	r->this_ns = r->ns_id == db->ns_id;
	if ((rc = column_hash(db, st, 1, r->hash, what)) || (rc = column_hash(db, st, 2, r->parent, what)) ||
	    (rc = column_tokens(db, st, 3, KVT_BLOCK_MAX_TOKENS, r->tokens, &r->n_tokens, what)))
		return rc;
	int64_t off = sqlite3_column_int64(st, 4), ext = sqlite3_column_int64(st, 5), sto = sqlite3_column_int64(st, 6);
	int64_t raw = sqlite3_column_int64(st, 13);
	if (r->n_tokens == 0 || off < 0 || ext <= 0 || ext > UINT32_MAX || sto < 0 || sto > ext || raw < 0 ||
	    raw > UINT32_MAX) {
		KVT_LOGE("index %s: %s: impossible location (off %lld, extent %lld, stored %lld, raw %lld, %u tokens); "
			 "run `kvtier rebuild-index --data-dir %s`",
			 db->path, what, (long long)off, (long long)ext, (long long)sto, (long long)raw, r->n_tokens,
			 db->dir);
		return KVT_ECORRUPT;
	}
	r->loc.off = (uint64_t)off;
	r->loc.extent_bytes = (uint32_t)ext;
	r->loc.stored_bytes = (uint32_t)sto;
	r->loc.generation = (uint64_t)sqlite3_column_int64(st, 7);
	r->loc.checksum = (uint64_t)sqlite3_column_int64(st, 8);
	r->loc.compressed = (uint8_t)sqlite3_column_int(st, 9);
	r->kv_dtype = (uint8_t)sqlite3_column_int(st, 10);
	r->codec = (uint8_t)sqlite3_column_int(st, 11);
	r->scale_layout = (uint8_t)sqlite3_column_int(st, 12);
	r->raw_bytes = (uint32_t)raw;
	r->last_use = (uint64_t)sqlite3_column_int64(st, 14);
	r->hit_count = (uint64_t)sqlite3_column_int64(st, 15);
	r->retain_until_us = (uint64_t)sqlite3_column_int64(st, 17);
	r->retain_ttl_us = (uint64_t)sqlite3_column_int64(st, 18);
	int floor = sqlite3_column_int(st, 19);
	const unsigned char *ten = sqlite3_column_text(st, 20);
	r->retain_floor = (uint8_t)(floor >= 0 && floor < KVT_TIER_COUNT ? floor : 0);
	snprintf(r->retain_tenant, sizeof(r->retain_tenant), "%s", ten && kvt_name_valid((const char *)ten) ? (const char *)ten : "");
	if (!r->retain_tenant[0] || floor != r->retain_floor)
		r->retain_until_us = 0; /* a retention we cannot account for is dropped, never guessed */
	int kind = sqlite3_column_int(st, 21);
	r->kind = (uint8_t)(kind > 0 && kind < KVT_BLOCK_KIND_COUNT ? kind : KVT_BLOCK_PREFIX); /* unknown: a prefix */
	return KVT_OK;
}

static int block_walk_fn(kvt_db *db, void *arg)
{
	struct block_walk_ctx *c = arg;
	sqlite3_stmt *st = NULL;
	kvt_db_block_row *row = malloc(sizeof(*row));
	const char *q_all = "SELECT " BLOCK_COLS " FROM blocks b";
	const char *q_model = "SELECT " BLOCK_COLS " FROM blocks b JOIN namespaces n ON n.id=b.ns"
			      " WHERE n.model_fp=(SELECT model_fp FROM namespaces WHERE id=?1)";
	const char *q_ns = "SELECT " BLOCK_COLS " FROM blocks b WHERE b.ns=?1";
	char q[512];
	int rc;
	if (!row)
		return KVT_ENOMEM;
	snprintf(q, sizeof(q), "%s%s",
		 (c->flags & KVT_DB_ALL_NS) ? q_all : (c->flags & KVT_DB_MODEL_NS) ? q_model : q_ns,
		 (c->flags & KVT_DB_BY_LAST_USE) ? " ORDER BY b.last_use, b.id" : "");
	rc = sqlite3_prepare_v2(db->sql, q, -1, &st, NULL);
	if (rc != SQLITE_OK) {
		free(row);
		return fail(db, rc, "prepare block walk");
	}
	if (!(c->flags & KVT_DB_ALL_NS))
		sqlite3_bind_int64(st, 1, db->ns_id);
	while (next_row(db, st, "block walk", &rc)) {
		memset(row, 0, sizeof(*row));
		if ((rc = block_from_row(db, st, row)) != KVT_OK)
			break;
		if ((rc = c->fn(c->ctx, row)) != 0)
			break;
	}
	sqlite3_finalize(st);
	free(row);
	return rc;
}

int kvt_db_for_each_block(kvt_db *db, unsigned flags, int (*fn)(void *ctx, const kvt_db_block_row *row), void *ctx)
{
	struct block_walk_ctx c = { flags, fn, ctx };
	return run_read(db, block_walk_fn, &c);
}

struct count_ctx {
	const char *sql;  /* SELECT count(*) ..., ?1 = this namespace when bind_ns */
	bool bind_ns;
	uint64_t n;       /* the result */
};

static int count_fn(kvt_db *db, void *arg)
{
	struct count_ctx *c = arg;
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(db->sql, c->sql, -1, &st, NULL);
	if (rc != SQLITE_OK)
		return fail(db, rc, "prepare count");
	if (c->bind_ns)
		sqlite3_bind_int64(st, 1, db->ns_id);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		c->n = (uint64_t)sqlite3_column_int64(st, 0);
		rc = KVT_OK;
	} else {
		rc = fail(db, rc, "count");
	}
	sqlite3_finalize(st);
	return rc;
}

static int count_rows(kvt_db *db, const char *sql, bool bind_ns, uint64_t *n_out)
{
	struct count_ctx c = { sql, bind_ns, 0 };
	int rc = run_read(db, count_fn, &c);
	if (rc == KVT_OK)
		*n_out = c.n;
	return rc;
}

int kvt_db_count_blocks(kvt_db *db, unsigned flags, uint64_t *n_out)
{
	const char *sql = (flags & KVT_DB_ALL_NS)     ? "SELECT count(*) FROM blocks"
			  : (flags & KVT_DB_MODEL_NS) ? "SELECT count(*) FROM blocks b JOIN namespaces n ON n.id=b.ns"
							" WHERE n.model_fp=(SELECT model_fp FROM namespaces WHERE id=?1)"
						      : "SELECT count(*) FROM blocks WHERE ns=?1";
	return count_rows(db, sql, !(flags & KVT_DB_ALL_NS), n_out);
}

int kvt_db_count_sessions(kvt_db *db, uint64_t *n_out)
{
	return count_rows(db, "SELECT count(*) FROM sessions WHERE ns=?1", true, n_out);
}

int kvt_index_paths(const char *data_dir, char *t2_path, char *index_path, size_t cap)
{
	if (!data_dir || !data_dir[0]) {
		KVT_LOGE("data directory: empty path");
		return KVT_EINVAL;
	}
	int a = snprintf(t2_path, cap, "%s/%s", data_dir, KVT_DATA_T2_FILE);
	int b = snprintf(index_path, cap, "%s/%s", data_dir, KVT_DATA_INDEX_FILE);
	if (a < 0 || b < 0 || (size_t)a >= cap || (size_t)b >= cap) {
		KVT_LOGE("data directory %s: path too long", data_dir);
		return KVT_EINVAL;
	}
	return KVT_OK;
}
