/*
 * tests/test_index_journal.c — sessions survive the loss of the index (issue
 * 13 item 6): the session journal beside the index, on real files with real
 * SQLite.
 *
 * A deleted index comes back with every session (the newest version of each,
 * deletions kept, every namespace); a deleted WAL (after a crash: a child
 * that exits without closing) loses commits, and the journal replays the
 * session writes the index lacks; a torn journal tail is cut; a deleted
 * journal is rewritten from the index; the journal is rewritten to its live
 * sessions as it grows. Each recovery is logged.
 */
/* ctest-labels: unit fault */
#include "check.h"
#include "index.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[256], g_db[512], g_wal[520], g_sj[512];

static kvt_db_config cfg_for(uint8_t fp_byte)
{
	kvt_db_config c;
	memset(&c, 0, sizeof(c));
	c.path = g_db;
	c.journal_path = g_sj;
	memset(c.ns.model_fp, fp_byte, 32);
	c.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	c.ns.block_tokens = 16;
	c.create = true;
	return c;
}

static int32_t g_toks[8192];

static void put(kvt_db *db, const char *id, int32_t first, uint32_t n)
{
	kvt_db_session s;
	memset(&s, 0, sizeof(s));
	snprintf(s.tenant, sizeof(s.tenant), "ten");
	snprintf(s.id, sizeof(s.id), "%s", id);
	for (uint32_t i = 0; i < n; i++)
		g_toks[i] = first + (int32_t)i;
	s.tokens = g_toks;
	s.n_tokens = n;
	s.last_hash[0] = (uint8_t)first;
	CHECK(kvt_db_put_session(db, &s, NULL, NULL, NULL) == KVT_OK);
}

/* The session's first token and length, or -1 when absent. */
static int32_t first_tok(kvt_db *db, const char *id, uint32_t *n)
{
	kvt_db_session g;
	if (kvt_db_get_session(db, "ten", id, &g) != KVT_OK)
		return -1;
	int32_t v = g.n_tokens ? g.tokens[0] : 0;
	*n = g.n_tokens;
	kvt_db_session_deinit(&g);
	return v;
}

static long file_size(const char *p)
{
	struct stat sb;
	return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

static void remove_index(void)
{
	unlink(g_db);
	unlink(g_wal);
}

static void test_deleted_index(void)
{
	kvt_db *a, *b;
	uint32_t n = 0;
	kvt_db_config ca = cfg_for(0x11), cb = cfg_for(0x22);
	remove_index();
	unlink(g_sj);
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	put(a, "s1", 100, 40);
	put(a, "s2", 200, 20);
	put(a, "s1", 300, 60); /* newer turn of s1 */
	CHECK(kvt_db_delete_session(a, "ten", "s2", NULL, NULL, NULL) == KVT_OK);
	CHECK(kvt_db_flush(a) == KVT_OK);
	kvt_db_close(a);
	CHECK(kvt_db_open(&cb, &b) == KVT_OK); /* another namespace, same files */
	put(b, "s3", 400, 32);
	CHECK(kvt_db_flush(b) == KVT_OK);
	kvt_db_close(b);
	CHECK(file_size(g_sj) > 0);

	remove_index();
	check_log_capture();
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	CHECK(strstr(check_log_text, "was missing: created anew, and 5 session writes restored") != NULL);
	CHECK(first_tok(a, "s1", &n) == 300 && n == 60);
	CHECK(first_tok(a, "s2", &n) == -1); /* the deletion is kept too */
	CHECK(first_tok(a, "s3", &n) == -1); /* another namespace's session stays there */
	kvt_db_stats st;
	kvt_db_get_stats(a, &st);
	CHECK_EQ_INT(st.n_replayed, 5);
	kvt_db_close(a);
	CHECK(kvt_db_open(&cb, &b) == KVT_OK);
	CHECK(first_tok(b, "s3", &n) == 400 && n == 32);
	kvt_db_close(b);
	/* a second open replays nothing */
	check_log_reset();
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	kvt_db_get_stats(a, &st);
	CHECK_EQ_INT(st.n_replayed, 0);
	CHECK(check_log_text[0] == '\0');
	kvt_db_close(a);
	kvt_log_set_sink(NULL, NULL);
}

static void test_lost_wal(void)
{
	kvt_db *a;
	uint32_t n = 0;
	kvt_db_config ca = cfg_for(0x11);
	pid_t pid = fork();
	if (pid == 0) {
		/* a daemon that dies after its commit: the commit lives only in the WAL */
		kvt_db *d;
		if (kvt_db_open(&ca, &d) != KVT_OK)
			_exit(2);
		put(d, "s4", 500, 48);
		put(d, "s1", 600, 64);
		_exit(kvt_db_flush(d) == KVT_OK ? 0 : 3);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(file_size(g_wal) > 0);
	CHECK(unlink(g_wal) == 0); /* the WAL is lost */
	check_log_capture();
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	CHECKF(strstr(check_log_text, "lacked the last 2 session writes") != NULL, "%s", check_log_text);
	CHECK(strstr(check_log_text, "kvtier rebuild-index") != NULL);
	CHECK(first_tok(a, "s4", &n) == 500 && n == 48);
	CHECK(first_tok(a, "s1", &n) == 600 && n == 64);
	kvt_db_close(a);
	kvt_log_set_sink(NULL, NULL);
}

static void test_torn_and_deleted_journal(void)
{
	kvt_db *a;
	uint32_t n = 0;
	kvt_db_config ca = cfg_for(0x11);
	long good = file_size(g_sj);
	FILE *f = fopen(g_sj, "ab");
	CHECK(f && fwrite("KVSJ\x40\x00\x00\x00garbage", 1, 15, f) == 15);
	fclose(f);
	check_log_capture();
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	CHECK(strstr(check_log_text, "15 bytes at its end do not form a whole record") != NULL);
	CHECK_EQ_INT(file_size(g_sj), good);
	put(a, "s5", 700, 16); /* appends after the cut */
	CHECK(kvt_db_flush(a) == KVT_OK);
	kvt_db_close(a);
	/* the journal is deleted: rewritten from the index at the next open */
	CHECK(unlink(g_sj) == 0);
	check_log_reset();
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	CHECKF(strstr(check_log_text, "it lost records (deleted or damaged); rewriting it") != NULL, "%s", check_log_text);
	kvt_db_close(a);
	CHECK(file_size(g_sj) > 0);
	/* ... and it is whole again: the index can go once more */
	remove_index();
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	CHECK(first_tok(a, "s1", &n) == 600 && n == 64);
	CHECK(first_tok(a, "s4", &n) == 500);
	CHECK(first_tok(a, "s5", &n) == 700);
	CHECK(first_tok(a, "s2", &n) == -1);
	kvt_db_close(a);
	kvt_log_set_sink(NULL, NULL);
}

/* An index written before the journal existed: its sessions go into a new journal at the first open. */
static void test_legacy_index(void)
{
	kvt_db *a;
	uint32_t n = 0;
	kvt_db_config ca = cfg_for(0x44);
	remove_index();
	unlink(g_sj);
	ca.journal_path = NULL;
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	put(a, "old", 800, 24);
	CHECK(kvt_db_flush(a) == KVT_OK);
	kvt_db_close(a);
	CHECK(file_size(g_sj) < 0);
	ca.journal_path = g_sj;
	check_log_capture();
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	CHECK(strstr(check_log_text, "new; writing the index's 1 sessions into it") != NULL);
	kvt_db_close(a);
	check_log_reset();
	CHECK(kvt_db_open(&ca, &a) == KVT_OK); /* nothing to say the second time */
	CHECKF(check_log_text[0] == '\0', "%s", check_log_text);
	kvt_db_close(a);
	remove_index();
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	CHECK(first_tok(a, "old", &n) == 800 && n == 24);
	kvt_db_close(a);
	kvt_log_set_sink(NULL, NULL);
}

static void test_rewrite_bounds_size(void)
{
	kvt_db *a;
	uint32_t n = 0;
	kvt_db_config ca = cfg_for(0x33);
	ca.journal_compact_bytes = 256 << 10;
	remove_index();
	unlink(g_sj);
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	for (int turn = 0; turn < 200; turn++) {
		put(a, "long", 1000 + turn, 1000 + (uint32_t)turn * 10); /* each turn rewrites the whole history */
		put(a, "short", 5000 + turn, 8);
		if (turn % 20 == 19)
			CHECK(kvt_db_flush(a) == KVT_OK);
	}
	CHECK(kvt_db_flush(a) == KVT_OK);
	kvt_db_stats st;
	kvt_db_get_stats(a, &st);
	/* 200 turns wrote ~5 MB of records; the live sessions are ~12 KB */
	CHECKF(st.n_journal_rewrites >= 3 && st.journal_bytes < (512u << 10), "%llu rewrites, %llu bytes",
	       (unsigned long long)st.n_journal_rewrites, (unsigned long long)st.journal_bytes);
	kvt_db_close(a);
	remove_index();
	CHECK(kvt_db_open(&ca, &a) == KVT_OK);
	CHECK(first_tok(a, "long", &n) == 1199 && n == 1000 + 199 * 10);
	CHECK(first_tok(a, "short", &n) == 5199 && n == 8);
	kvt_db_close(a);
}

int main(void)
{
	snprintf(g_dir, sizeof(g_dir), "/tmp/kvt_test_journal_XXXXXX");
	if (!mkdtemp(g_dir))
		return check_skip("test_index_journal", "mkdtemp failed");
	snprintf(g_db, sizeof(g_db), "%s/%s", g_dir, KVT_DATA_INDEX_FILE);
	snprintf(g_wal, sizeof(g_wal), "%s-wal", g_db);
	snprintf(g_sj, sizeof(g_sj), "%s/%s", g_dir, KVT_DATA_SESSIONS_FILE);
	test_deleted_index();
	test_lost_wal();
	test_torn_and_deleted_journal();
	test_legacy_index();
	test_rewrite_bounds_size();
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", g_dir);
	return check_done("test_index_journal");
}
