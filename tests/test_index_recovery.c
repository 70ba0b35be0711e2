/*
 * tests/test_index_recovery.c — start-up recovery, fsck and rebuild-index on
 * a real data directory (T2 file + SQLite index in a temp dir).
 *
 *  - Recovery (the one start-up recovery, kvt_tm_recover, as kvt_stack_open
 *    runs it: tm_fx_recover): the T2 free map is rebuilt from the rows, so a
 *    record written without a committed row (a crash between the two) is free
 *    space; the block table gets every row (links made in any order) and
 *    answers prefix lookups; a row claiming another row's extent is skipped
 *    and counted, and start-up goes on.
 *  - fsck: a flipped bit in a record and a row pointing at another block's
 *    record are found (dry run: reported, kept; repair: deleted).
 *  - A truncated index fails to open with an error naming the file and
 *    `kvtier rebuild-index`; rebuild-index (the function and the real
 *    `kvtier` binary) recovers every valid record; another model is refused.
 */
/* ctest-labels: integration */
#include "check.h"
#include "cli_index.h"
#include "index.h"
#include "t2_store.h"
#include "tm_fixture.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define BT 8
#define N_CHAINS 4
#define N_BLOCKS 6
#define RAW_BYTES 6000

static char g_dir[64], g_t2[256], g_idx[256];
static uint8_t g_fp[32], g_root[32];
static int32_t g_toks[N_CHAINS][N_BLOCKS * BT];
static uint8_t g_hash[N_CHAINS][N_BLOCKS][32];

static int open_t2(kvt_t2_store **t2)
{
	kvt_t2_config c;
	memset(&c, 0, sizeof(c));
	c.path = g_t2;
	c.capacity_bytes = 4u << 20;
	c.buffered_ok = true;
	c.max_raw_bytes = 64 << 10;
	memcpy(c.model_fp, g_fp, 32);
	return kvt_t2_open(&c, t2);
}

static int open_db(kvt_db **db)
{
	kvt_db_config c;
	memset(&c, 0, sizeof(c));
	c.path = g_idx;
	c.create = true;
	memcpy(c.ns.model_fp, g_fp, 32);
	c.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	c.ns.block_tokens = BT;
	return kvt_db_open(&c, db);
}

static void payload_of(int c, int b, uint8_t *p)
{
	for (int i = 0; i < RAW_BYTES; i++)
		p[i] = (uint8_t)(c * 31 + b * 7 + i * 13);
}

/* Write block (c, b) to T2; with a row unless orphan. Returns its loc. */
static kvt_t2_loc write_block(kvt_t2_store *t2, kvt_db *db, int c, int b, bool orphan)
{
	static uint8_t payload[RAW_BYTES];
	kvt_t2_block_meta m;
	kvt_t2_write_req req = { &m, payload };
	kvt_t2_loc loc;
	int res = -1;
	memset(&m, 0, sizeof(m));
	memcpy(m.hash, g_hash[c][b], 32);
	memcpy(m.parent, b ? g_hash[c][b - 1] : g_root, 32);
	m.n_tokens = BT;
	memcpy(m.tokens, g_toks[c] + b * BT, BT * sizeof(int32_t));
	m.raw_bytes = RAW_BYTES;
	payload_of(c, b, payload);
	CHECK(kvt_t2_write_batch(t2, 1, &req, &loc, &res) == KVT_OK && res == KVT_OK);
	if (!orphan) {
		kvt_db_block_row row;
		memset(&row, 0, sizeof(row));
		memcpy(row.hash, m.hash, 32);
		memcpy(row.parent, m.parent, 32);
		row.n_tokens = BT;
		memcpy(row.tokens, m.tokens, sizeof(int32_t) * BT);
		row.loc = (kvt_nvme_loc){ loc.off, loc.extent_bytes, loc.stored_bytes, loc.generation, loc.checksum,
					  loc.compressed };
		row.raw_bytes = RAW_BYTES;
		uint64_t t;
		CHECK(kvt_db_put_block(db, &row, NULL, NULL, &t) == KVT_OK && kvt_db_wait(db, t) == KVT_OK);
	}
	return loc;
}

/* What one start-up recovery did, as the checks below read it. */
typedef struct recov {
	uint64_t n_model_rows; /* rows of this model in the index when it ran (every namespace) */
	uint64_t n_marked;     /* T2 extents in use after it (kvt_t2_stats.n_records) */
	uint64_t n_loaded;     /* blocks it entered in the table */
	uint64_t n_bad_extent; /* bad rows it skipped (kvt_tm_stats.n_skipped) */
} recov;

/* Matched blocks of chain c after a full recovery into a fresh table. */
static uint32_t recovered_match(int c, recov *rs_out)
{
	kvt_t2_store *t2;
	kvt_db *db;
	kvt_btable *bt;
	kvt_btable_match m[N_BLOCKS];
	kvt_t2_stats ts;
	tm_fx_recovery fr;
	uint32_t nh = 0, nm = 0;
	CHECK(open_t2(&t2) == KVT_OK);
	CHECK(open_db(&db) == KVT_OK);
	CHECK(kvt_btable_create(BT, 0, &bt) == KVT_OK);
	memset(rs_out, 0, sizeof(*rs_out));
	CHECK(kvt_db_count_blocks(db, KVT_DB_MODEL_NS, &rs_out->n_model_rows) == KVT_OK);
	CHECK(tm_fx_recover(db, t2, bt, &fr) == KVT_OK);
	kvt_t2_get_stats(t2, &ts);
	rs_out->n_marked = ts.n_records;
	rs_out->n_loaded = fr.n_loaded;
	rs_out->n_bad_extent = fr.n_skipped;
	CHECK(kvt_btable_check(bt) == KVT_OK);
	CHECK(kvt_btable_lookup(bt, g_root, g_toks[c], N_BLOCKS * BT, 0, m, N_BLOCKS, &nh, &nm) == KVT_OK);
	for (uint32_t i = 0; i < nm; i++)
		CHECK(m[i].slot[KVT_TIER_NVME] == 0 && m[i].nvme.extent_bytes > 0);
	kvt_btable_destroy(bt);
	kvt_db_close(db);
	kvt_t2_close(t2);
	return nm;
}

static void flip_byte(const char *path, uint64_t off)
{
	FILE *f = fopen(path, "r+b");
	KVT_ASSERT(f);
	fseek(f, (long)off, SEEK_SET);
	int ch = fgetc(f);
	fseek(f, (long)off, SEEK_SET);
	fputc(ch ^ 0x10, f);
	fclose(f);
}

static int run_kvtier(const char *a1, const char *a2, const char *a3, const char *a4)
{
	char bin[512];
	snprintf(bin, sizeof(bin), "%s/kvtier", KVT_BINARY_DIR);
	if (access(bin, X_OK) != 0)
		return -1;
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		if (!freopen("/dev/null", "w", stdout))
			_exit(126);
		execl(bin, "kvtier", a1, a2, a3, a4, (char *)NULL);
		_exit(127);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -2;
}

int main(void)
{
	kvt_t2_store *t2;
	kvt_db *db;
	recov rs;
	tm_fx_recovery fr;
	kvt_btable *bt;
	kvt_fsck_stats fs;
	kvt_rebuild_stats rb;
	kvt_t2_loc locs[N_CHAINS][N_BLOCKS];
	uint8_t salt[32] = { 9 };
	check_rng r = { 77 };

	snprintf(g_dir, sizeof(g_dir), "/tmp/kvt_test_recovery_XXXXXX");
	if (!mkdtemp(g_dir))
		return check_skip("test_index_recovery", "mkdtemp failed");
	CHECK(kvt_index_paths(g_dir, g_t2, g_idx, sizeof(g_t2)) == KVT_OK);
	for (int i = 0; i < 32; i++)
		g_fp[i] = (uint8_t)(i * 5 + 1);
	CHECK(kvt_hash_root(g_fp, KVT_KV_LAYOUT_VERSION, BT, salt, g_root) == KVT_OK);
	for (int c = 0; c < N_CHAINS; c++) {
		for (int i = 0; i < N_BLOCKS * BT; i++)
			g_toks[c][i] = (int32_t)(check_rng_u64(&r) % 30000);
		if (c) /* chains share their first block */
			memcpy(g_toks[c], g_toks[0], BT * sizeof(int32_t));
		uint32_t n;
		CHECK(kvt_hash_chain(g_root, g_toks[c], N_BLOCKS * BT, BT, g_hash[c], N_BLOCKS, &n) == KVT_OK);
	}

	/* chains 0..2 fully indexed; chain 3's last two blocks reach T2 but never get a row */
	CHECK(open_t2(&t2) == KVT_OK);
	CHECK(open_db(&db) == KVT_OK);
	for (int c = 0; c < N_CHAINS; c++)
		for (int b = (c ? 1 : 0); b < N_BLOCKS; b++)
			locs[c][b] = write_block(t2, db, c, b, c == 3 && b >= 4);
	kvt_db_close(db);
	kvt_t2_close(t2);

	/* recovery: orphans are free space, rows are loaded and answer lookups */
	CHECK_EQ_INT(recovered_match(0, &rs), N_BLOCKS);
	CHECK_EQ_INT(recovered_match(3, &rs), 4);
	CHECK_EQ_INT(rs.n_model_rows, N_BLOCKS + 3 * (N_BLOCKS - 1) - 2);
	CHECK_EQ_INT(rs.n_marked, rs.n_model_rows);
	CHECK_EQ_INT(rs.n_loaded, rs.n_model_rows);
	CHECK(open_t2(&t2) == KVT_OK);
	CHECK(open_db(&db) == KVT_OK);
	CHECK(kvt_btable_create(BT, 0, &bt) == KVT_OK);
	CHECK(tm_fx_recover(db, t2, bt, &fr) == KVT_OK);
	kvt_t2_stats ts;
	kvt_t2_get_stats(t2, &ts);
	CHECK_EQ_INT(ts.n_records, rs.n_marked);
	CHECK_EQ_INT(ts.used_bytes, rs.n_marked * locs[0][0].extent_bytes);
	/* a new write may now land on an orphan's extent */
	kvt_btable_destroy(bt);
	kvt_db_close(db);
	kvt_t2_close(t2);

	/* fsck on a healthy directory */
	CHECK(kvt_index_fsck(g_dir, true, &fs) == KVT_OK);
	CHECK(fs.n_rows == rs.n_marked && fs.n_ok == fs.n_rows && fs.n_bad == 0);

	/* damage: a flipped payload bit in chain 1 block 5; chain 2 block 5's row points at chain 2 block 4's record */
	flip_byte(g_t2, locs[1][5].off + KVT_T2_HEADER_BYTES + 100);
	{
		sqlite3 *s;
		sqlite3_stmt *st;
		CHECK(sqlite3_open(g_idx, &s) == SQLITE_OK);
		CHECK(sqlite3_prepare_v2(s, "UPDATE blocks SET off=?1, generation=?2, checksum=?3 WHERE hash=?4", -1, &st,
					 NULL) == SQLITE_OK);
		sqlite3_bind_int64(st, 1, (int64_t)locs[2][4].off);
		sqlite3_bind_int64(st, 2, (int64_t)locs[2][4].generation);
		sqlite3_bind_int64(st, 3, (int64_t)locs[2][4].checksum);
		sqlite3_bind_blob(st, 4, g_hash[2][5], 32, SQLITE_STATIC);
		CHECK(sqlite3_step(st) == SQLITE_DONE);
		sqlite3_finalize(st);
		sqlite3_close(s);
	}
	kvt_log_set_level(-1); /* the T2 store logs each bad record */
	CHECK(kvt_index_fsck(g_dir, false, &fs) == KVT_OK);
	CHECK_EQ_INT(fs.n_bad, 2);
	CHECK_EQ_INT(fs.n_deleted, 0);
	CHECK(kvt_index_fsck(g_dir, false, &fs) == KVT_OK && fs.n_bad == 2); /* dry run kept them */
	int cli = run_kvtier("fsck", "--data-dir", g_dir, "--dry-run");
	if (cli != -1)
		CHECK_EQ_INT(cli, 3);
	CHECK(kvt_index_fsck(g_dir, true, &fs) == KVT_OK);
	CHECK(fs.n_bad == 2 && fs.n_deleted == 2);
	CHECK(kvt_index_fsck(g_dir, true, &fs) == KVT_OK);
	CHECK(fs.n_bad == 0 && fs.n_ok == fs.n_rows && fs.n_rows == rs.n_marked - 2);
	kvt_log_set_level(KVT_LOG_INFO);
	CHECK_EQ_INT(recovered_match(1, &rs), N_BLOCKS - 1);

	/* a truncated index: a clear error, then rebuild-index recovers from T2 alone */
	struct stat sb;
	CHECK(stat(g_idx, &sb) == 0);
	CHECK(truncate(g_idx, sb.st_size / 2 + 123) == 0);
	check_log_capture();
	CHECK(open_db(&db) == KVT_ECORRUPT);
	CHECK(strstr(check_log_text, g_idx) != NULL && strstr(check_log_text, "kvtier rebuild-index") != NULL);
	kvt_log_set_sink(NULL, NULL);
	kvt_log_set_level(-1);
	uint8_t other[32];
	memset(other, 0xAA, 32);
	CHECK(kvt_index_rebuild(g_dir, other, &rb) == KVT_EINVAL); /* another model's KV is never indexed */
	CHECK(kvt_index_rebuild(g_dir, NULL, &rb) == KVT_OK);
	kvt_log_set_level(KVT_LOG_INFO);
	/* every valid record: the 21 rows' records, minus the flipped one, plus the 2 orphans */
	CHECK_EQ_INT(rb.n_bad, 1);
	CHECK_EQ_INT(rb.n_rows, N_BLOCKS + 3 * (N_BLOCKS - 1) - 1);
	CHECK_EQ_INT(rb.n_namespaces, 1);
	CHECK_EQ_INT(recovered_match(0, &rs), N_BLOCKS);
	CHECK_EQ_INT(recovered_match(1, &rs), N_BLOCKS - 1);
	CHECK_EQ_INT(recovered_match(2, &rs), N_BLOCKS);
	CHECK_EQ_INT(recovered_match(3, &rs), N_BLOCKS); /* the orphans were valid blocks */
	CHECK(kvt_index_fsck(g_dir, true, &fs) == KVT_OK && fs.n_bad == 0 && fs.n_ok == rb.n_rows);

	/* two rows claiming one extent: recovery marks it once, loads one of them and starts; fsck deletes the impostor */
	{
		sqlite3 *s;
		sqlite3_stmt *st;
		CHECK(sqlite3_open(g_idx, &s) == SQLITE_OK);
		CHECK(sqlite3_prepare_v2(s,
					 "INSERT INTO blocks(ns, hash, parent, tokens, off, extent_bytes, stored_bytes,"
					 " generation, checksum, compressed, kv_dtype, codec, scale_layout, raw_bytes, last_use,"
					 " hit_count) SELECT ns, randomblob(32), parent, tokens, off, extent_bytes, stored_bytes,"
					 " generation, checksum, compressed, kv_dtype, codec, scale_layout, raw_bytes, last_use,"
					 " hit_count FROM blocks WHERE hash=?1",
					 -1, &st, NULL) == SQLITE_OK);
		sqlite3_bind_blob(st, 1, g_hash[0][2], 32, SQLITE_STATIC);
		CHECK(sqlite3_step(st) == SQLITE_DONE);
		sqlite3_finalize(st);
		sqlite3_close(s);
	}
	kvt_log_set_level(-1);
	recovered_match(0, &rs);
	CHECK_EQ_INT(rs.n_bad_extent, 1);
	CHECK_EQ_INT(rs.n_model_rows, rb.n_rows + 1);
	CHECK_EQ_INT(rs.n_loaded, rb.n_rows);
	CHECK(kvt_index_fsck(g_dir, true, &fs) == KVT_OK && fs.n_bad == 1 && fs.n_deleted == 1);
	CHECK(kvt_index_fsck(g_dir, true, &fs) == KVT_OK && fs.n_bad == 0 && fs.n_ok == rb.n_rows);
	kvt_log_set_level(KVT_LOG_INFO);
	CHECK_EQ_INT(recovered_match(0, &rs), N_BLOCKS);
	CHECK_EQ_INT(rs.n_bad_extent, 0);

	/*
	 * Both superblock copies unreadable (the first 8 KiB of the T2 file zeroed: bad magic, every record
	 * intact): fsck and rebuild-index run the record scan anyway and keep every record.
	 */
	static const uint8_t zeros[2 * 4096];
	for (int pass = 0; pass < 2; pass++) {
		int zfd = open(g_t2, O_WRONLY);
		CHECK(zfd >= 0 && pwrite(zfd, zeros, sizeof(zeros), 0) == (ssize_t)sizeof(zeros));
		if (zfd >= 0)
			close(zfd);
		kvt_log_set_level(-1);
		if (pass == 0) {
			int rc = kvt_index_fsck(g_dir, true, &fs);
			CHECKF(rc == KVT_OK && fs.n_bad == 0 && fs.n_ok == rb.n_rows,
			       "fsck with both superblocks zeroed: %s, %llu ok of %llu", kvt_strerror(rc),
			       (unsigned long long)fs.n_ok, (unsigned long long)rb.n_rows);
		} else {
			kvt_rebuild_stats rz;
			int rc = kvt_index_rebuild(g_dir, NULL, &rz);
			CHECKF(rc == KVT_OK && rz.n_rows == rb.n_rows && rz.n_bad == rb.n_bad,
			       "rebuild-index with both superblocks zeroed: %s, %llu rows of %llu", kvt_strerror(rc),
			       (unsigned long long)rz.n_rows, (unsigned long long)rb.n_rows);
		}
		kvt_log_set_level(KVT_LOG_INFO);
		CHECK_EQ_INT(recovered_match(0, &rs), N_BLOCKS);
	}

	/* the real binary: garbage index, rebuild-index, fsck clean; bad usage is 2 */
	FILE *f = fopen(g_idx, "wb");
	fputs("this is not a database", f);
	fclose(f);
	int st = run_kvtier("rebuild-index", "--data-dir", g_dir, NULL);
	if (st != -1) {
		CHECK_EQ_INT(st, 0);
		CHECK_EQ_INT(run_kvtier("fsck", "--data-dir", g_dir, NULL), 0);
		CHECK_EQ_INT(run_kvtier("fsck", NULL, NULL, NULL), 2);
		CHECK_EQ_INT(recovered_match(3, &rs), N_BLOCKS);
	} else {
		printf("kvtier binary not built: CLI checks skipped\n");
	}

	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", g_dir);
	return check_done("test_index_recovery");
}
