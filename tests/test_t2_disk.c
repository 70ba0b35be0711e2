/* ctest-labels: unit integration */
/*
 * tests/test_t2_disk.c — the T2 file as an operator meets it (issue 13, items
 * 4, 5 and 7): real files in a temp dir, real io_uring, real SQLite, the real
 * tiering manager on the CPU device; no I/O fault hooks.
 *
 *  - lock: a second store on the same file is refused while the first is
 *    open (two daemons, two data dirs, one [tier.nvme] path), and a kill -9
 *    with writes in flight never leaves the lock behind for the restart;
 *  - owner: the file records the identity of the index whose rows point into
 *    it, and another index is refused with a message saying what to do;
 *    rebuild-index adopts the file's identity;
 *  - superblock: one flipped byte anywhere in either copy opens (newest valid
 *    copy wins, the damaged one is rewritten); with both copies broken the
 *    daemon's open is refused with the repair command, and fsck and
 *    rebuild-index salvage every record; a format-1 file (one copy) is read
 *    and upgraded in place;
 *  - truncation: a file cut at any length opens, keeps every record before
 *    the cut, and the manager drops and counts (n_lost, log naming the file)
 *    the rows that pointed past it; an emptied file is not "recovered";
 *  - block size: 16 -> 32 -> 16 tokens per block starts every time; the
 *    other size's records are kept, never served, and reclaimed first when
 *    T2 needs room.
 */
#include "check.h"
#include "test_dev.h"
#include "tm_fixture.h"
#include "cli_index.h"
#include "manager.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

static char g_dir[256];
static const uint8_t g_fp[32] = { 'd', 'i', 's', 'k', '-', 't', 'e', 's', 't' };

/* ---- the fix's API, in one place ---- */
/* NOTE: the only block that names what the fix added (owner ids, salvage, intact bytes, probe, lost and
 * reclaimed counts): swapping it for stubs builds this test against the code before the fix, to show
 * that each case fails there. */
static void cfg_extra(kvt_t2_config *c, const uint8_t *owner, bool salvage)
{
	if (owner)
		memcpy(c->owner_id, owner, KVT_T2_OWNER_BYTES);
	c->salvage = salvage;
}
static void cfg_owner_of(kvt_t2_config *c, kvt_db *db) { kvt_db_owner_id(db, c->owner_id); }
static uint64_t intact_bytes(kvt_t2_store *s) { return kvt_t2_intact_bytes(s); }
static int probe(const char *path, uint32_t *version, uint32_t *n_copies, uint32_t *n_valid)
{
	kvt_t2_info in;
	int rc = kvt_t2_probe(path, &in);
	*version = in.version;
	*n_copies = in.n_copies;
	*n_valid = in.n_valid;
	return rc;
}
static uint64_t tm_lost(const kvt_tm_stats *st) { return st->n_lost; }
static uint64_t tm_foreign(const kvt_tm_stats *st) { return st->n_foreign; }
static uint64_t tm_reclaimed(const kvt_tm_stats *st) { return st->n_reclaimed; }
/* ---- end of the fix's API ---- */

static void path_in(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

static int open_t2(const char *path, uint64_t cap, const uint8_t *owner, bool salvage, kvt_t2_store **s)
{
	kvt_t2_config c = { .path = path, .capacity_bytes = cap, .queue_depth = 8, .io_mode = KVT_T2_IO_AUTO,
			    .buffered_ok = true, .max_raw_bytes = 64 << 10 };
	memcpy(c.model_fp, g_fp, 32);
	cfg_extra(&c, owner, salvage);
	return kvt_t2_open(&c, s);
}

/* N records of RAW random bytes each, written one batch; kept for checks. */
enum { N_REC = 10, RAW = 20000 };
static kvt_t2_block_meta g_meta[N_REC];
static uint8_t g_payload[N_REC][RAW];
static kvt_t2_loc g_loc[N_REC];

static void write_records(kvt_t2_store *s, unsigned seed)
{
	check_rng r = { seed };
	kvt_t2_write_req req[N_REC];
	int res[N_REC];
	for (int i = 0; i < N_REC; i++) {
		memset(&g_meta[i], 0, sizeof(g_meta[i]));
		for (int k = 0; k < 32; k++)
			g_meta[i].hash[k] = (uint8_t)check_rng_u64(&r);
		g_meta[i].n_tokens = 4;
		for (int k = 0; k < 4; k++)
			g_meta[i].tokens[k] = (int32_t)(check_rng_u64(&r) % 1000);
		g_meta[i].raw_bytes = RAW;
		for (int k = 0; k < RAW; k++)
			g_payload[i][k] = (uint8_t)check_rng_u64(&r);
		req[i].meta = &g_meta[i];
		req[i].payload = g_payload[i];
	}
	CHECK(kvt_t2_write_batch(s, N_REC, req, g_loc, res) == KVT_OK);
}

/* How many of the records read back verified and equal (the others must fail, never mismatch). */
static int count_readable(kvt_t2_store *s)
{
	static uint8_t buf[RAW];
	int n = 0;
	for (int i = 0; i < N_REC; i++) {
		kvt_t2_block_meta m;
		int rc = kvt_t2_read(s, &g_loc[i], g_meta[i].hash, &m, buf, RAW);
		if (rc == KVT_OK) {
			CHECKF(memcmp(buf, g_payload[i], RAW) == 0, "record %d verified but its bytes differ", i);
			n++;
		} else {
			CHECKF(rc == KVT_ECORRUPT || rc == KVT_EINVAL, "record %d: %s", i, kvt_strerror(rc));
		}
	}
	return n;
}

static void flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;
	CHECK(fd >= 0 && pread(fd, &b, 1, off) == 1);
	b ^= 0x5a;
	CHECK(pwrite(fd, &b, 1, off) == 1);
	close(fd);
}

static off_t file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? st.st_size : -1;
}

/* ---- item 4: the lock and the owner ---- */

static void test_lock(void)
{
	char path[300];
	path_in(path, sizeof(path), "lock.t2");
	unlink(path);
	kvt_t2_store *a = NULL, *b = NULL;
	CHECK(open_t2(path, 1 << 20, NULL, false, &a) == KVT_OK);
	check_log_capture();
	int rc = open_t2(path, 1 << 20, NULL, false, &b);
	kvt_log_set_sink(NULL, NULL);
	CHECKF(rc == KVT_EINVAL, "a second store on an open T2 file: %s", kvt_strerror(rc));
	CHECKF(strstr(check_log_text, "locked by another process") && strstr(check_log_text, "[tier.nvme] path"),
	       "log: %s", check_log_text);
	if (rc == KVT_OK)
		kvt_t2_close(b);
	kvt_t2_close(a);
	CHECK(open_t2(path, 1 << 20, NULL, false, &b) == KVT_OK); /* released at close */
	kvt_t2_close(b);

	/* kill -9 with io_uring writes in flight: the restart right after finds the file free */
	int n_ok = 0;
	for (int round = 0; round < 8; round++) {
		pid_t pid = fork();
		if (pid == 0) {
			kvt_t2_store *s;
			if (open_t2(path, 1 << 20, NULL, false, &s) != KVT_OK)
				_exit(3);
			kvt_t2_write_req req[N_REC];
			int res[N_REC];
			for (int i = 0; i < N_REC; i++) {
				g_meta[i].n_tokens = 1;
				g_meta[i].raw_bytes = RAW;
				req[i].meta = &g_meta[i];
				req[i].payload = g_payload[i];
			}
			for (;;) { /* write, free, write again: always I/O in flight */
				kvt_t2_write_batch(s, N_REC, req, g_loc, res);
				for (int i = 0; i < N_REC; i++)
					if (res[i] == KVT_OK)
						kvt_t2_free(s, &g_loc[i]);
			}
		}
		usleep(30000 + 10000 * round);
		kill(pid, SIGKILL);
		int st;
		waitpid(pid, &st, 0);
		kvt_t2_store *s = NULL;
		rc = open_t2(path, 1 << 20, NULL, false, &s);
		CHECKF(rc == KVT_OK, "round %d: reopen right after kill -9: %s", round, kvt_strerror(rc));
		n_ok += rc == KVT_OK;
		kvt_t2_close(s);
	}
	printf("lock: 8 kill -9 rounds, %d reopened at once\n", n_ok);
	unlink(path);
}

/* A data dir's index and its T2 file, opened the way the daemon's stack does. */
static int open_pair(const char *dir, const char *t2_path, kvt_db **db, kvt_t2_store **t2)
{
	char db_path[400];
	snprintf(db_path, sizeof(db_path), "%s/%s", dir, KVT_DATA_INDEX_FILE);
	kvt_db_config dc = { .path = db_path, .create = true };
	memcpy(dc.ns.model_fp, g_fp, 32);
	dc.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	dc.ns.block_tokens = 16;
	*t2 = NULL;
	int rc = kvt_db_open(&dc, db);
	if (rc)
		return rc;
	kvt_t2_config c = { .path = t2_path, .capacity_bytes = 1 << 20, .io_mode = KVT_T2_IO_AUTO, .buffered_ok = true,
			    .max_raw_bytes = 64 << 10 };
	memcpy(c.model_fp, g_fp, 32);
	cfg_owner_of(&c, *db);
	rc = kvt_t2_open(&c, t2);
	if (rc) {
		kvt_db_close(*db);
		*db = NULL;
	}
	return rc;
}

static void test_owner(void)
{
	char dir_a[300], dir_b[300], shared[300], cmd[700];
	path_in(dir_a, sizeof(dir_a), "daemon-a");
	path_in(dir_b, sizeof(dir_b), "daemon-b");
	path_in(shared, sizeof(shared), "shared.t2");
	mkdir(dir_a, 0755);
	mkdir(dir_b, 0755);
	kvt_db *da, *db_b;
	kvt_t2_store *ta, *tb;

	/* daemon A starts and keeps blocks */
	CHECK(open_pair(dir_a, shared, &da, &ta) == KVT_OK);
	write_records(ta, 5);
	/* daemon B (its own data dir, the same [tier.nvme] path) while A runs: locked */
	check_log_capture();
	int rc = open_pair(dir_b, shared, &db_b, &tb);
	kvt_log_set_sink(NULL, NULL);
	CHECKF(rc == KVT_EINVAL, "second daemon on the same T2 file while the first runs: %s", kvt_strerror(rc));
	if (rc == KVT_OK) {
		kvt_t2_close(tb);
		kvt_db_close(db_b);
	}
	kvt_t2_close(ta);
	kvt_db_close(da);

	/* A stopped: B still may not take A's file */
	check_log_capture();
	rc = open_pair(dir_b, shared, &db_b, &tb);
	kvt_log_set_sink(NULL, NULL);
	CHECKF(rc == KVT_EINVAL, "another index's daemon on the T2 file: %s", kvt_strerror(rc));
	CHECKF(strstr(check_log_text, "belongs to another index") && strstr(check_log_text, "rebuild-index"),
	       "log: %s", check_log_text);
	if (rc == KVT_OK) {
		kvt_t2_close(tb);
		kvt_db_close(db_b);
	}
	/* A itself reopens, and its records are intact */
	CHECK(open_pair(dir_a, shared, &da, &ta) == KVT_OK);
	if (ta)
		CHECK_EQ_INT(count_readable(ta), N_REC);
	kvt_t2_close(ta);
	kvt_db_close(da);

	/* an index lost: rebuild-index makes a new one that takes the file's identity */
	char t2_in_a[400], idx_a[400];
	snprintf(t2_in_a, sizeof(t2_in_a), "%s/%s", dir_a, KVT_DATA_T2_FILE);
	snprintf(idx_a, sizeof(idx_a), "%s/%s", dir_a, KVT_DATA_INDEX_FILE);
	CHECK(rename(shared, t2_in_a) == 0);
	unlink(idx_a);
	CHECK(open_pair(dir_a, t2_in_a, &da, &ta) == KVT_EINVAL); /* a fresh index is another identity */
	kvt_rebuild_stats rs;
	CHECK(kvt_index_rebuild(dir_a, NULL, &rs) == KVT_OK);
	CHECK(open_pair(dir_a, t2_in_a, &da, &ta) == KVT_OK);
	kvt_t2_close(ta);
	kvt_db_close(da);

	snprintf(cmd, sizeof(cmd), "rm -rf %s %s", dir_a, dir_b);
	CHECK(system(cmd) == 0);
}

/* ---- item 5: superblock copies, salvage, truncation ---- */

static void test_superblock_flips(void)
{
	char path[300];
	path_in(path, sizeof(path), "flip.t2");
	unlink(path);
	kvt_t2_store *s;
	CHECK(open_t2(path, 1 << 20, NULL, false, &s) == KVT_OK);
	write_records(s, 7);
	kvt_t2_close(s);

	/* every byte of both copies' used part, one at a time */
	int n_open = 0, n_all = 0, n_tried = 0;
	for (uint32_t copy = 0; copy < 2; copy++)
		for (off_t i = 0; i < 112; i++) {
			flip_byte(path, (off_t)copy * 4096 + i);
			n_tried++;
			s = NULL;
			kvt_log_set_sink(check_log_sink, NULL);
			int rc = open_t2(path, 1 << 20, NULL, false, &s);
			kvt_log_set_sink(NULL, NULL);
			if (rc == KVT_OK) {
				n_open++;
				n_all += count_readable(s) == N_REC;
				kvt_t2_close(s);
			} else {
				fprintf(stderr, "copy %u byte %lld flipped: open %s\n", copy, (long long)i, kvt_strerror(rc));
				flip_byte(path, (off_t)copy * 4096 + i); /* undo, so the next case has one flip */
			}
			uint32_t v, nc, nv;
			CHECK(probe(path, &v, &nc, &nv) == KVT_OK && nv == 2); /* the damaged copy was rewritten */
		}
	CHECKF(n_open == n_tried && n_all == n_tried, "one flipped superblock byte: %d of %d opened, %d with every record",
	       n_open, n_tried, n_all);
	printf("superblock: %d single-byte flips, %d opened with every record\n", n_tried, n_all);

	/* both copies broken: the daemon's open is refused and says how to repair; salvage keeps every record */
	flip_byte(path, 30);
	flip_byte(path, 4096 + 30);
	check_log_capture();
	int rc = open_t2(path, 1 << 20, NULL, false, &s);
	kvt_log_set_sink(NULL, NULL);
	CHECKF(rc == KVT_ECORRUPT && strstr(check_log_text, "kvtier fsck"), "both copies broken: %s, log %s",
	       kvt_strerror(rc), check_log_text);
	kvt_t2_config c = { .path = path, .io_mode = KVT_T2_IO_AUTO, .buffered_ok = true };
	cfg_extra(&c, NULL, true);
	/* no model given: learnt from the records */
	kvt_log_set_sink(check_log_sink, NULL);
	rc = kvt_t2_open(&c, &s);
	kvt_log_set_sink(NULL, NULL);
	CHECKF(rc == KVT_OK, "salvage: %s", kvt_strerror(rc));
	if (rc == KVT_OK) {
		CHECK_EQ_INT(count_readable(s), N_REC);
		/* generations go on past every record's */
		kvt_t2_loc old[N_REC];
		memcpy(old, g_loc, sizeof(old));
		kvt_t2_close(s);
		CHECK(open_t2(path, 1 << 20, NULL, false, &s) == KVT_OK);
		kvt_t2_block_meta m = g_meta[0];
		kvt_t2_write_req req = { &m, g_payload[0] };
		kvt_t2_loc l;
		int res;
		m.hash[0] ^= 1;
		CHECK(kvt_t2_write_batch(s, 1, &req, &l, &res) == KVT_OK);
		for (int i = 0; i < N_REC; i++)
			CHECK(l.generation > old[i].generation);
		kvt_t2_close(s);
	}
	unlink(path);
}

/* A blank (zeroed) file, as a new block device is: a store is made in it. Zeroed superblocks over records: refused. */
static void test_blank(void)
{
	char path[300];
	path_in(path, sizeof(path), "blank.t2");
	unlink(path);
	int fd = open(path, O_RDWR | O_CREAT, 0644);
	CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0);
	close(fd);
	kvt_t2_store *s = NULL;
	kvt_log_set_sink(check_log_sink, NULL);
	int rc = open_t2(path, 1 << 20, NULL, false, &s);
	CHECKF(rc == KVT_OK, "blank file: %s", kvt_strerror(rc));
	if (rc == KVT_OK) {
		write_records(s, 3);
		kvt_t2_close(s);
	}
	/* both superblock units zeroed, the records still there: never taken for blank */
	static uint8_t zero[8192];
	fd = open(path, O_RDWR);
	CHECK(fd >= 0 && pwrite(fd, zero, sizeof(zero), 0) == (ssize_t)sizeof(zero));
	close(fd);
	rc = open_t2(path, 1 << 20, NULL, false, &s);
	kvt_log_set_sink(NULL, NULL);
	CHECKF(rc == KVT_ECORRUPT, "zeroed superblocks over records: %s", kvt_strerror(rc));
	if (rc == KVT_OK)
		kvt_t2_close(s);
	CHECK(open_t2(path, 1 << 20, NULL, true, &s) == KVT_OK); /* salvage keeps them */
	if (s)
		CHECK_EQ_INT(count_readable(s), N_REC);
	kvt_t2_close(s);
	unlink(path);
}

/* A format-1 file (one superblock copy, records from unit 1), as older kvtier wrote it. */
static void test_format1(void)
{
	char path[300];
	path_in(path, sizeof(path), "v1.t2");
	unlink(path);
	kvt_t2_store *s;
	CHECK(open_t2(path, 1 << 20, NULL, false, &s) == KVT_OK);
	write_records(s, 9);
	kvt_t2_close(s);
	/* rewrite unit 0 as format 1 and zero unit 1 (records sit from unit 2: allowed in format 1) */
	uint8_t u[8192];
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0 && pread(fd, u, 8192, 0) == 8192);
	memset(u + 72, 0, 8192 - 72);
	u[8] = 1; /* version 1 */
	uint64_t h = XXH3_64bits(u, 64); /* format 1's one checksum */
	for (int i = 0; i < 8; i++)
		u[64 + i] = (uint8_t)(h >> (8 * i));
	CHECK(pwrite(fd, u, 8192, 0) == 8192);
	close(fd);
	uint32_t v, nc, nv;
	CHECK(probe(path, &v, &nc, &nv) == KVT_OK && v == 1 && nc == 1);
	kvt_log_set_sink(check_log_sink, NULL);
	int rc = open_t2(path, 1 << 20, NULL, false, &s);
	kvt_log_set_sink(NULL, NULL);
	CHECKF(rc == KVT_OK, "format 1: %s", kvt_strerror(rc));
	if (rc == KVT_OK) {
		CHECK_EQ_INT(count_readable(s), N_REC);
		/* unit 1 is record space in a format-1 file: a new record may land there */
		kvt_t2_block_meta m;
		memset(&m, 0, sizeof(m));
		m.hash[0] = 0xee;
		m.n_tokens = 1;
		m.raw_bytes = 1000;
		kvt_t2_write_req req = { &m, g_payload[0] };
		kvt_t2_loc l;
		int res;
		CHECK(kvt_t2_write_batch(s, 1, &req, &l, &res) == KVT_OK);
		CHECK_EQ_INT(l.off, 4096);
		kvt_t2_close(s);
	}
	CHECK(probe(path, &v, &nc, &nv) == KVT_OK && v == 2 && nc == 1);
	CHECK(open_t2(path, 1 << 20, NULL, false, &s) == KVT_OK);
	if (s)
		CHECK_EQ_INT(count_readable(s), N_REC);
	kvt_t2_close(s);
	unlink(path);
}

static void test_truncation(void)
{
	char path[300];
	path_in(path, sizeof(path), "trunc.t2");
	const uint64_t cap = 1 << 20;
	for (int k = 0; k < 6; k++) {
		unlink(path);
		kvt_t2_store *s;
		CHECK(open_t2(path, cap, NULL, false, &s) == KVT_OK);
		write_records(s, 20 + (unsigned)k);
		kvt_t2_close(s);
		/* cuts: inside record 5, at record 3's start, inside copy 1, inside copy 0, 1 byte, past the last record */
		off_t cuts[6] = { (off_t)g_loc[5].off + 1000, (off_t)g_loc[3].off, 5000, 100, 1,
				  (off_t)(g_loc[N_REC - 1].off + g_loc[N_REC - 1].extent_bytes + 4096 + 17) };
		int want[6] = { 5, 3, 0, 0, 0, N_REC };
		CHECK(truncate(path, cuts[k]) == 0);
		kvt_log_set_sink(check_log_sink, NULL);
		check_log_reset();
		int rc = open_t2(path, cap, NULL, false, &s);
		kvt_log_set_sink(NULL, NULL);
		CHECKF(rc == KVT_OK, "truncated to %lld bytes: open %s", (long long)cuts[k], kvt_strerror(rc));
		if (rc != KVT_OK)
			continue;
		uint64_t intact = intact_bytes(s);
		CHECKF(intact <= (uint64_t)cuts[k] && intact + 4096 > (uint64_t)cuts[k] - (cuts[k] < 4096 ? cuts[k] : 0),
		       "cut %lld: intact %llu", (long long)cuts[k], (unsigned long long)intact);
		CHECKF(strstr(check_log_text, path) != NULL, "cut %lld: no log line names the file: %s", (long long)cuts[k],
		       check_log_text);
		int n = count_readable(s);
		CHECKF(n == want[k], "cut %lld: %d records readable, want %d", (long long)cuts[k], n, want[k]);
		kvt_t2_close(s);
		CHECK_EQ_INT(file_size(path), cap); /* extended back */
	}
	unlink(path);
}

/* ---- the manager over a data dir: lost rows, block sizes ---- */

typedef struct fixture {
	kvt_kv_layout shape;
	kvt_dev *dev;
	kvt_t0_pool *t0;
	kvt_btable *bt;
	kvt_db *db;
	kvt_t2_store *t2;
	kvt_tm *tm;
	uint64_t n_recovered;
} fixture;

static char g_data[300], g_t2[400], g_idx[400];

/* As kvt_stack_open does: index, then the T2 file sized for this block size's records, then recover. */
static int fx_open(fixture *f, uint32_t bt, uint64_t t2_cap, float t2_high, float t2_low)
{
	memset(f, 0, sizeof(*f));
	f->shape = (kvt_kv_layout){ .n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_tokens = bt };
	if (tm_fx_base(&f->shape, 8, &f->dev, &f->t0, &f->bt))
		return KVT_EINVAL;
	int rc = tm_fx_db_open(g_idx, g_fp, bt, &f->db);
	if (rc)
		return rc;
	kvt_t2_config tc = { .path = g_t2, .capacity_bytes = t2_cap, .io_mode = KVT_T2_IO_AUTO, .buffered_ok = true,
			     .max_raw_bytes = (uint32_t)kvt_kv_packed_bytes(&f->shape, KVT_KV_CODEC_F16) };
	memcpy(tc.model_fp, g_fp, 32);
	cfg_owner_of(&tc, f->db);
	if ((rc = kvt_t2_open(&tc, &f->t2)))
		return rc;
	kvt_tm_config c;
	tm_fx_config(&c, f->dev, f->t0, f->bt, f->t2, f->db, 4, KVT_KV_CODEC_F16);
	c.persist = KVT_PERSIST_END_OF_TURN;
	c.high[KVT_TIER_NVME] = t2_high;
	c.low[KVT_TIER_NVME] = t2_low;
	if ((rc = kvt_tm_create(&c, &f->tm)))
		return rc;
	return kvt_tm_recover(f->tm, &f->n_recovered);
}

static void fx_close(fixture *f)
{
	tm_fx_free(f->tm, f->db, f->t2, f->bt, f->t0, f->dev);
	memset(f, 0, sizeof(*f));
}

/* Block i of chain `seed` (bt tokens per block): hash, parent, tokens, bytes. */
typedef struct chain {
	uint32_t bt, n;
	uint8_t root[32], (*hash)[32];
	int32_t *tok;
	uint16_t *bytes;
	size_t n_el;
} chain;

static void chain_make(chain *c, const fixture *f, uint32_t n, unsigned seed)
{
	check_rng r = { seed };
	uint8_t salt[32] = { (uint8_t)seed };
	uint32_t got;
	c->bt = f->shape.block_tokens;
	c->n = n;
	c->hash = malloc(n * 32);
	c->tok = malloc(n * c->bt * sizeof(int32_t));
	c->n_el = kvt_kv_block_bytes(&f->shape) / 2;
	c->bytes = malloc(n * c->n_el * 2);
	for (uint32_t i = 0; i < n * c->bt; i++)
		c->tok[i] = (int32_t)(check_rng_u64(&r) % 30000);
	for (size_t i = 0; i < n * c->n_el; i++)
		c->bytes[i] = kvt_f32_to_f16(check_rng_f32(&r));
	CHECK(kvt_hash_root(g_fp, KVT_KV_LAYOUT_VERSION, c->bt, salt, c->root) == KVT_OK);
	CHECK(kvt_hash_chain(c->root, c->tok, n * c->bt, c->bt, c->hash, n, &got) == KVT_OK && got == n);
}

static void chain_free(chain *c)
{
	free(c->hash);
	free(c->tok);
	free(c->bytes);
}

/* The engine computes the chain's blocks [b0, b1), then the turn ends and they are flushed (durable). */
static void compute_persist(fixture *f, const chain *c, uint32_t b0, uint32_t b1)
{
	for (uint32_t b = b0; b < b1; b++) {
		int32_t s;
		if (kvt_t0_alloc(f->t0, &s) != KVT_OK) {
			CHECK(kvt_tm_reserve_t0(f->tm, 1) == KVT_OK);
			CHECK(kvt_t0_alloc(f->t0, &s) == KVT_OK);
		}
		CHECK(kvt_dev_copy_h2d(f->dev, (char *)kvt_t0_layout(f->t0)->pool + (size_t)s * c->n_el * 2,
				       c->bytes + b * c->n_el, c->n_el * 2) == KVT_OK);
		CHECK(kvt_tm_register(f->tm, c->hash[b], b ? c->hash[b - 1] : c->root, c->tok + b * c->bt, s) == KVT_OK);
		kvt_t0_unref(f->t0, s);
	}
	kvt_tm_end_turn(f->tm);
	CHECK(kvt_tm_flush(f->tm) == KVT_OK);
}

/* Promote the chain's blocks [b0, b1) and compare their bytes: how many came back equal. */
static uint32_t promote_equal(fixture *f, const chain *c, uint32_t b0, uint32_t b1)
{
	uint32_t n_eq = 0;
	uint16_t *out = malloc(c->n_el * 2);
	for (uint32_t b = b0; b < b1; b++) {
		int32_t slot;
		int res;
		if (kvt_tm_promote(f->tm, 1, (const uint8_t(*)[32])c->hash[b], &slot, &res) != KVT_OK || res != KVT_OK)
			continue;
		CHECK(kvt_dev_copy_d2h(f->dev, out, (char *)kvt_t0_layout(f->t0)->pool + (size_t)slot * c->n_el * 2,
				       c->n_el * 2) == KVT_OK);
		n_eq += memcmp(out, c->bytes + b * c->n_el, c->n_el * 2) == 0;
		kvt_t0_unref(f->t0, slot);
		CHECK(kvt_tm_reserve_t0(f->tm, 8) == KVT_OK);
	}
	free(out);
	return n_eq;
}

static uint64_t rows_all(fixture *f)
{
	uint64_t n = 0;
	CHECK(kvt_db_count_blocks(f->db, KVT_DB_MODEL_NS, &n) == KVT_OK);
	return n;
}

/* A T2 file emptied (or cut) under an index that lists its blocks. */
static void test_lost_blocks(void)
{
	for (int k = 0; k < 2; k++) {
		fixture f;
		chain c;
		unlink(g_t2);
		unlink(g_idx);
		CHECK(fx_open(&f, 16, 1 << 20, 1.0f, 0.9f) == KVT_OK);
		chain_make(&c, &f, 6, 40 + (unsigned)k);
		compute_persist(&f, &c, 0, 6);
		kvt_btable_entry e;
		CHECK(kvt_btable_get(f.bt, c.hash[3], &e) == KVT_OK);
		off_t cut = k == 0 ? 0 : (off_t)e.nvme.off + 100; /* k = 0: emptied; 1: cut inside block 3 */
		fx_close(&f);
		CHECK(truncate(g_t2, cut) == 0);

		check_log_capture();
		int rc = fx_open(&f, 16, 1 << 20, 1.0f, 0.9f);
		kvt_log_set_sink(NULL, NULL);
		CHECKF(rc == KVT_OK, "cut at %lld: start-up %s", (long long)cut, kvt_strerror(rc));
		if (rc != KVT_OK) {
			fx_close(&f);
			chain_free(&c);
			continue;
		}
		kvt_tm_stats st;
		kvt_tm_get_stats(f.tm, &st);
		/* blocks 0..2 sit before the cut when k = 1 (the chain is written in order) */
		uint64_t want_kept = k == 0 ? 0 : 3;
		CHECKF(f.n_recovered == want_kept && tm_lost(&st) == 6 - want_kept,
		       "cut at %lld: %llu recovered, %llu lost (want %llu, %llu)", (long long)cut,
		       (unsigned long long)f.n_recovered, (unsigned long long)tm_lost(&st), (unsigned long long)want_kept,
		       (unsigned long long)(6 - want_kept));
		CHECKF(strstr(check_log_text, g_t2) && strstr(check_log_text, "gone from the file"), "log: %s",
		       check_log_text);
		CHECK_EQ_INT(rows_all(&f), want_kept); /* the lost rows are dropped */
		CHECK_EQ_INT(promote_equal(&f, &c, 0, (uint32_t)want_kept), want_kept);
		fx_close(&f);
		/* the next start has nothing left to lose */
		CHECK(fx_open(&f, 16, 1 << 20, 1.0f, 0.9f) == KVT_OK);
		if (f.tm) {
			kvt_tm_get_stats(f.tm, &st);
			CHECK(f.n_recovered == want_kept && tm_lost(&st) == 0);
		}
		fx_close(&f);
		chain_free(&c);
	}
}

/* Both superblock copies and the file's tail lost: rebuild-index and fsck keep every record before the cut. */
static void test_tools_salvage(void)
{
	for (int tool = 0; tool < 2; tool++) {
		fixture f;
		chain c;
		unlink(g_t2);
		unlink(g_idx);
		CHECK(fx_open(&f, 16, 1 << 20, 1.0f, 0.9f) == KVT_OK);
		chain_make(&c, &f, 6, 60 + (unsigned)tool);
		compute_persist(&f, &c, 0, 6);
		kvt_btable_entry e;
		CHECK(kvt_btable_get(f.bt, c.hash[4], &e) == KVT_OK);
		fx_close(&f);
		flip_byte(g_t2, 20);
		flip_byte(g_t2, 4096 + 20);
		CHECK(truncate(g_t2, (off_t)e.nvme.off + 4096) == 0); /* block 4 torn, block 5 gone */
		CHECK(fx_open(&f, 16, 1 << 20, 1.0f, 0.9f) == KVT_ECORRUPT); /* the daemon refuses, naming the repair */
		fx_close(&f);
		/* fsck --dry-run reports and writes nothing */
		off_t size_before = file_size(g_t2);
		uint8_t head_before[8192], head_after[8192];
		int fd = open(g_t2, O_RDONLY);
		CHECK(fd >= 0 && pread(fd, head_before, sizeof(head_before), 0) == (ssize_t)sizeof(head_before));
		close(fd);
		kvt_fsck_stats dry;
		kvt_log_set_sink(check_log_sink, NULL);
		CHECK(kvt_index_fsck(g_data, false, &dry) == KVT_ECORRUPT);
		kvt_log_set_sink(NULL, NULL);
		fd = open(g_t2, O_RDONLY);
		CHECK(fd >= 0 && pread(fd, head_after, sizeof(head_after), 0) == (ssize_t)sizeof(head_after));
		close(fd);
		CHECK(file_size(g_t2) == size_before && memcmp(head_before, head_after, sizeof(head_before)) == 0);
		int rc;
		kvt_log_set_sink(check_log_sink, NULL);
		if (tool == 0) {
			kvt_rebuild_stats rs;
			rc = kvt_index_rebuild(g_data, NULL, &rs);
			CHECKF(rc == KVT_OK && rs.n_rows == 4, "rebuild-index: %s, %llu rows", kvt_strerror(rc),
			       (unsigned long long)rs.n_rows);
		} else {
			kvt_fsck_stats fs;
			rc = kvt_index_fsck(g_data, true, &fs);
			CHECKF(rc == KVT_OK && fs.n_ok == 4 && fs.n_deleted == 2, "fsck: %s, %llu ok, %llu deleted",
			       kvt_strerror(rc), (unsigned long long)fs.n_ok, (unsigned long long)fs.n_deleted);
		}
		kvt_log_set_sink(NULL, NULL);
		rc = fx_open(&f, 16, 1 << 20, 1.0f, 0.9f);
		CHECKF(rc == KVT_OK, "%s, then start: %s", tool ? "fsck" : "rebuild-index", kvt_strerror(rc));
		if (rc == KVT_OK) {
			CHECK_EQ_INT(f.n_recovered, 4);
			CHECK_EQ_INT(promote_equal(&f, &c, 0, 4), 4);
		}
		fx_close(&f);
		chain_free(&c);
	}
}

/* cache.block_tokens 16 -> 32 -> 16: every start works; the other size is kept, never served, reclaimed first. */
static void test_block_sizes(void)
{
	fixture f;
	chain c16, c32, more;
	unlink(g_t2);
	unlink(g_idx);
	const uint64_t cap = 64 * 4096; /* 62 record units: 16-token records take 3, 32-token ones 5 */
	CHECK(fx_open(&f, 16, cap, 1.0f, 0.9f) == KVT_OK);
	chain_make(&c16, &f, 4, 70);
	compute_persist(&f, &c16, 0, 4);
	fx_close(&f);

	int rc = fx_open(&f, 32, cap, 1.0f, 0.9f);
	CHECKF(rc == KVT_OK, "16 -> 32: %s", kvt_strerror(rc));
	chain_make(&c32, &f, 6, 71);
	if (rc == KVT_OK)
		compute_persist(&f, &c32, 0, 6);
	fx_close(&f);

	check_log_capture();
	rc = fx_open(&f, 16, cap, 0.75f, 0.6f);
	kvt_log_set_sink(NULL, NULL);
	CHECKF(rc == KVT_OK, "32 -> 16: %s (log: %s)", kvt_strerror(rc), check_log_text);
	if (rc != KVT_OK) {
		fx_close(&f);
		chain_free(&c16);
		chain_free(&c32);
		return;
	}
	kvt_tm_stats st;
	kvt_tm_get_stats(f.tm, &st);
	CHECK_EQ_INT(f.n_recovered, 4);
	CHECK_EQ_INT(tm_foreign(&st), 6);
	CHECK_EQ_INT(rows_all(&f), 10); /* kept */
	CHECK_EQ_INT(promote_equal(&f, &c16, 0, 4), 4);
	/* never served: a 32-token block is no hit in the 16-token table */
	kvt_btable_entry e;
	CHECK(kvt_btable_get(f.bt, c32.hash[0], &e) == KVT_ENOTFOUND);

	/* more 16-token blocks push T2 past its high watermark: the 32-token records go first */
	chain_make(&more, &f, 4, 72); /* 12 + 30 + 12 of 62 units: past 0.75; down to 0.6 takes 4 of the 32-token records */
	compute_persist(&f, &more, 0, 4);
	kvt_tm_maintain(f.tm);
	kvt_tm_get_stats(f.tm, &st);
	CHECKF(tm_reclaimed(&st) > 0, "reclaimed %llu", (unsigned long long)tm_reclaimed(&st));
	CHECK_EQ_INT(promote_equal(&f, &c16, 0, 4), 4);
	CHECK_EQ_INT(promote_equal(&f, &more, 0, 4), 4);
	CHECK_EQ_INT(rows_all(&f), 8 + 6 - tm_reclaimed(&st));
	CHECK(kvt_tm_check(f.tm) == KVT_OK);
	fx_close(&f);
	/* fsck checks both block sizes' rows and finds nothing to delete */
	kvt_fsck_stats fs;
	rc = kvt_index_fsck(g_data, true, &fs);
	CHECKF(rc == KVT_OK && fs.n_rows == 8 + 6 - tm_reclaimed(&st) && fs.n_ok == fs.n_rows && fs.n_deleted == 0,
	       "fsck over two block sizes: %s, %llu rows, %llu ok, %llu deleted", kvt_strerror(rc),
	       (unsigned long long)fs.n_rows, (unsigned long long)fs.n_ok, (unsigned long long)fs.n_deleted);

	/* and 16 -> 32 again: the 32-token blocks that were kept still serve */
	rc = fx_open(&f, 32, cap, 1.0f, 0.9f);
	CHECKF(rc == KVT_OK, "16 -> 32 again: %s", kvt_strerror(rc));
	if (rc == KVT_OK) {
		CHECK_EQ_INT(f.n_recovered, 6 - tm_reclaimed(&st));
	}
	fx_close(&f);
	chain_free(&c16);
	chain_free(&c32);
	chain_free(&more);
}

int main(void)
{
	int probe_rc = test_dev_probe("test_t2_disk");
	if (probe_rc >= 0)
		return probe_rc;
	snprintf(g_dir, sizeof(g_dir), "/tmp/kvt_t2disk_XXXXXX");
	if (!mkdtemp(g_dir))
		return 1;
	snprintf(g_data, sizeof(g_data), "%s/data", g_dir);
	mkdir(g_data, 0755);
	snprintf(g_t2, sizeof(g_t2), "%s/%s", g_data, KVT_DATA_T2_FILE);
	snprintf(g_idx, sizeof(g_idx), "%s/%s", g_data, KVT_DATA_INDEX_FILE);

	test_lock();
	test_owner();
	test_superblock_flips();
	test_blank();
	test_format1();
	test_truncation();
	test_lost_blocks();
	test_tools_salvage();
	test_block_sizes();

	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", g_dir);
	return check_done("test_t2_disk");
}
