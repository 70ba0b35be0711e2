/*
 * tests/test_index_diskfull.c — the SQLite index on a file system that fills
 * up and then frees space again (issue 13 item 1): a real tmpfs, filled by a
 * filler file, real SQLite.
 *
 * While the disk is full, the transactions roll back with KVT_EFULL (not the
 * sticky KVT_EIO), the handle says degraded and keeps the session writes;
 * once the filler is deleted, the idle writer retries by itself, the kept
 * session writes commit (the newest version of each session), the block rows
 * the caller re-sends commit, and everything is there after a reopen.
 *
 * Needs root (mount -t tmpfs); without it the test skips (77) and says why.
 */
/* ctest-labels: fault */
#include "check.h"
#include "index.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];
static bool g_mounted;

static kvt_db_config cfg_for(const char *path)
{
	kvt_db_config c;
	memset(&c, 0, sizeof(c));
	c.path = path;
	memset(c.ns.model_fp, 0x5a, 32);
	c.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	c.ns.block_tokens = 4;
	c.create = true;
	return c;
}

static void make_row(kvt_db_block_row *r, int i)
{
	memset(r, 0, sizeof(*r));
	r->hash[0] = (uint8_t)(i + 1);
	r->hash[1] = (uint8_t)((i + 1) >> 8);
	memset(r->parent, 0xEE, 32);
	r->n_tokens = 4;
	for (int k = 0; k < 4; k++)
		r->tokens[k] = i * 4 + k;
	r->loc.off = (uint64_t)i * 8192;
	r->loc.extent_bytes = 8192;
	r->loc.stored_bytes = 5000;
	r->raw_bytes = 9000;
}

static int put_session(kvt_db *db, const char *id, int32_t first_tok, uint32_t n, uint64_t *ticket)
{
	static int32_t toks[4096];
	kvt_db_session s;
	memset(&s, 0, sizeof(s));
	snprintf(s.tenant, sizeof(s.tenant), "t");
	snprintf(s.id, sizeof(s.id), "%s", id);
	for (uint32_t i = 0; i < n; i++)
		toks[i] = first_tok + (int32_t)i;
	s.tokens = toks;
	s.n_tokens = n;
	return kvt_db_put_session(db, &s, NULL, NULL, ticket);
}

/* Write the filler until the file system says ENOSPC. */
static int fill(const char *path)
{
	static char buf[65536];
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return -1;
	memset(buf, 0x42, sizeof(buf));
	for (size_t chunk = sizeof(buf); chunk >= 512; chunk /= 2)
		while (write(fd, buf, chunk) == (ssize_t)chunk)
			;
	int e = errno;
	close(fd);
	return e == ENOSPC ? 0 : -1;
}

static void cleanup(void)
{
	if (g_mounted && umount(g_dir) != 0)
		fprintf(stderr, "test_index_diskfull: umount %s: %s\n", g_dir, strerror(errno));
	g_mounted = false;
	rmdir(g_dir);
}

int main(void)
{
	char path[512], filler[512];
	kvt_db *db;
	kvt_db_stats st;
	kvt_db_block_row r;
	uint64_t tk = 0, tk_sess = 0;

	if (geteuid() != 0)
		return check_skip("test_index_diskfull", "needs root to mount a small tmpfs");
	snprintf(g_dir, sizeof(g_dir), "/tmp/kvt_test_full_XXXXXX");
	if (!mkdtemp(g_dir))
		return check_skip("test_index_diskfull", "mkdtemp failed");
	if (mount("tmpfs", g_dir, "tmpfs", 0, "size=2m") != 0) {
		char why[300];
		snprintf(why, sizeof(why), "mount -t tmpfs on %s: %s", g_dir, strerror(errno));
		rmdir(g_dir);
		return check_skip("test_index_diskfull", why);
	}
	g_mounted = true;
	atexit(cleanup);
	snprintf(path, sizeof(path), "%s/%s", g_dir, KVT_DATA_INDEX_FILE);
	snprintf(filler, sizeof(filler), "%s/filler", g_dir);

	kvt_db_config c = cfg_for(path);
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	for (int i = 0; i < 10; i++) {
		make_row(&r, i);
		CHECK(kvt_db_put_block(db, &r, NULL, NULL, &tk) == KVT_OK);
	}
	CHECK(put_session(db, "early", 100, 64, &tk_sess) == KVT_OK);
	CHECK(kvt_db_flush(db) == KVT_OK);

	/* the disk fills up */
	CHECK(fill(filler) == 0);
	check_log_capture();
	for (int i = 10; i < 400; i++) {
		make_row(&r, i);
		CHECK(kvt_db_put_block(db, &r, NULL, NULL, &tk) == KVT_OK); /* accepted: not refused */
	}
	CHECK(put_session(db, "during", 200, 2048, &tk_sess) == KVT_OK);
	int wrc = kvt_db_wait(db, tk_sess);
	CHECKF(wrc == KVT_EFULL, "wait on a write rolled back for lack of space: %s", kvt_strerror(wrc));
	CHECK(kvt_db_wait(db, tk) == KVT_EFULL);
	kvt_db_get_stats(db, &st);
	CHECK(st.degraded);
	CHECK(st.n_full >= 1);
	CHECKF(st.n_carried == 1, "%llu session writes kept", (unsigned long long)st.n_carried);
	/* a newer turn of the same session replaces the kept one; a second session joins it */
	CHECK(put_session(db, "during", 300, 2048, NULL) == KVT_OK);
	CHECK(put_session(db, "other", 400, 1024, &tk_sess) == KVT_OK);
	CHECK(kvt_db_wait(db, tk_sess) == KVT_EFULL); /* the last write: both are in rolled-back transactions */
	kvt_db_get_stats(db, &st);
	CHECK(st.degraded && st.n_carried == 2);
	CHECK(strstr(check_log_text, "durability is degraded") != NULL);
	/* logged once when it starts, however many transactions roll back */
	const char *first = strstr(check_log_text, "durability is degraded");
	CHECK(first && !strstr(first + 1, "durability is degraded"));

	/* space returns: the idle writer retries on its own within a couple of seconds */
	CHECK(unlink(filler) == 0);
	for (int i = 0; i < 50; i++) {
		kvt_db_get_stats(db, &st);
		if (!st.degraded)
			break;
		usleep(100 * 1000);
	}
	CHECK(!st.degraded);
	CHECK_EQ_INT(st.n_carried, 0);
	CHECK(strstr(check_log_text, "durability restored") != NULL);
	/* SQLite's error is named once, in the line that starts the episode: the retries add no line each */
	const char *full = strstr(check_log_text, "database or disk is full");
	CHECKF(full && full < strstr(check_log_text, "durability is degraded") && !strstr(full + 1, "database or disk is full"),
	       "the episode's log:\n%s", check_log_text);
	/* the caller (the tiering manager) re-sends the block rows that were rolled back */
	for (int i = 10; i < 400; i++) {
		make_row(&r, i);
		CHECK(kvt_db_put_block(db, &r, NULL, NULL, &tk) == KVT_OK);
	}
	CHECK(kvt_db_wait(db, tk) == KVT_OK);
	CHECK(kvt_db_flush(db) == KVT_OK);
	kvt_log_set_sink(NULL, NULL);
	kvt_db_close(db);

	/* everything acknowledged is there after a reopen */
	CHECK(kvt_db_open(&c, &db) == KVT_OK);
	uint64_t n = 0;
	CHECK(kvt_db_count_blocks(db, 0, &n) == KVT_OK);
	CHECK_EQ_INT(n, 400);
	kvt_db_session g;
	CHECK(kvt_db_get_session(db, "t", "during", &g) == KVT_OK);
	CHECK(g.n_tokens == 2048 && g.tokens[0] == 300); /* the newest version */
	kvt_db_session_deinit(&g);
	CHECK(kvt_db_get_session(db, "t", "other", &g) == KVT_OK && g.n_tokens == 1024);
	kvt_db_session_deinit(&g);
	CHECK(kvt_db_get_session(db, "t", "early", &g) == KVT_OK && g.n_tokens == 64);
	kvt_db_session_deinit(&g);
	kvt_db_close(db);
	return check_done("test_index_diskfull");
}
