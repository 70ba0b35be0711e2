/*
 * bench/bench_sessions.c — what the session journal (index/journal.c) costs,
 * each figure as a ratio to the same work without it, measured in the same run.
 *
 *   bench_sessions [--sessions N] [--tokens T] [--dir D]
 *
 * 1. One turn: put one session row of T tokens and wait for its commit
 *    (synchronous=FULL; with the journal, one more append + fdatasync before
 *    the COMMIT). Median of 201 turns, ms; ratio journal / none.
 * 2. Group commit: N session puts of T tokens queued at once, then a flush:
 *    puts per second; ratio none / journal.
 * 3. Space: journal bytes per session write, the journal after the N puts,
 *    and the time to rewrite it to its live sessions (forced by reopening
 *    after deleting it).
 * 4. Recovery: opening with the index deleted, replaying the N sessions from
 *    the journal: seconds.
 * Files go to --dir (default /tmp), removed after.
 */
#include "index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

static char g_db[600], g_sj[600], g_wal[610];
static uint32_t g_tokens = 1024, g_sessions = 1000;
static int32_t *g_toks;

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static long file_size(const char *p)
{
	struct stat sb;
	return stat(p, &sb) == 0 ? (long)sb.st_size : 0;
}

static void reset_files(void)
{
	unlink(g_db);
	unlink(g_wal);
	unlink(g_sj);
}

static kvt_db *open_db(bool journal)
{
	kvt_db_config c;
	kvt_db *db = NULL;
	memset(&c, 0, sizeof(c));
	c.path = g_db;
	c.journal_path = journal ? g_sj : NULL;
	c.journal_compact_bytes = UINT64_MAX / 4; /* no rewrite during the runs: measured on its own */
	memset(c.ns.model_fp, 0x42, 32);
	c.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	c.ns.block_tokens = 16;
	c.create = true;
	if (kvt_db_open(&c, &db) != KVT_OK) {
		fprintf(stderr, "bench_sessions: cannot open %s\n", g_db);
		exit(1);
	}
	return db;
}

static void put(kvt_db *db, uint32_t i, uint64_t *ticket)
{
	kvt_db_session s;
	memset(&s, 0, sizeof(s));
	snprintf(s.tenant, sizeof(s.tenant), "bench");
	snprintf(s.id, sizeof(s.id), "s%u", i);
	g_toks[0] = (int32_t)i;
	s.tokens = g_toks;
	s.n_tokens = g_tokens;
	if (kvt_db_put_session(db, &s, NULL, NULL, ticket) != KVT_OK)
		exit(1);
}

static double turn_ms(bool journal)
{
	enum { N = 201 };
	double v[N];
	reset_files();
	kvt_db *db = open_db(journal);
	for (int i = 0; i < N; i++) {
		uint64_t t = 0;
		double t0 = kvt_now_s();
		put(db, (uint32_t)i % 16, &t);
		if (kvt_db_wait(db, t) != KVT_OK)
			exit(1);
		v[i] = (kvt_now_s() - t0) * 1e3;
	}
	kvt_db_close(db);
	qsort(v, N, sizeof(v[0]), cmp_d);
	return v[N / 2];
}

static double group_puts_per_s(bool journal)
{
	reset_files();
	kvt_db *db = open_db(journal);
	double t0 = kvt_now_s();
	for (uint32_t i = 0; i < g_sessions; i++)
		put(db, i, NULL);
	if (kvt_db_flush(db) != KVT_OK)
		exit(1);
	double dt = kvt_now_s() - t0;
	kvt_db_close(db);
	return g_sessions / dt;
}

int main(int argc, char **argv)
{
	const char *dir = "/tmp";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--sessions") && i + 1 < argc)
			g_sessions = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
			g_tokens = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else {
			fprintf(stderr, "usage: bench_sessions [--sessions N] [--tokens T] [--dir D]\n");
			return 2;
		}
	}
	if (!g_sessions || !g_tokens || g_tokens > 1u << 20)
		return 2;
	char base[512];
	snprintf(base, sizeof(base), "%s/kvt_bench_sessions_XXXXXX", dir);
	if (!mkdtemp(base)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(g_db, sizeof(g_db), "%s/%s", base, KVT_DATA_INDEX_FILE);
	snprintf(g_wal, sizeof(g_wal), "%s-wal", g_db);
	snprintf(g_sj, sizeof(g_sj), "%s/%s", base, KVT_DATA_SESSIONS_FILE);
	g_toks = calloc(g_tokens, sizeof(int32_t));
	for (uint32_t i = 0; i < g_tokens; i++)
		g_toks[i] = (int32_t)(i * 2654435761u % 49152);
	kvt_log_set_level(KVT_LOG_WARN);

	struct utsname u;
	uname(&u);
	printf("bench_sessions: %s %s, %ld cores, dir %s, %u sessions x %u tokens\n", u.sysname, u.release,
	       sysconf(_SC_NPROCESSORS_ONLN), dir, g_sessions, g_tokens);

	double t_none = turn_ms(false), t_j = turn_ms(true);
	printf("1. one turn (put + commit wait), median of 201: %.3f ms without the journal, %.3f ms with it: "
	       "ratio %.2f\n",
	       t_none, t_j, t_j / t_none);
	double g_none = group_puts_per_s(false), g_j = group_puts_per_s(true);
	printf("2. group commit of %u puts: %.0f puts/s without, %.0f puts/s with: ratio %.2f\n", g_sessions, g_none, g_j,
	       g_none / g_j);
	/* the journal of the group run is still there: N records */
	long j_bytes = file_size(g_sj);
	printf("3. journal: %ld bytes after %u puts (%.0f bytes per write, %.2f x the %u-byte token blob)\n", j_bytes,
	       g_sessions, (double)j_bytes / g_sessions, (double)j_bytes / g_sessions / (4.0 * g_tokens), 4 * g_tokens);
	unlink(g_sj); /* forces a rewrite from the index at the next open */
	double t0 = kvt_now_s();
	kvt_db *db = open_db(true);
	double t_rw = kvt_now_s() - t0;
	kvt_db_stats st;
	kvt_db_get_stats(db, &st);
	kvt_db_close(db);
	printf("   rewrite of the journal from the index (open with it deleted): %.3f s for %u sessions, %llu bytes "
	       "(%.3f s in the rewrite itself)\n",
	       t_rw, g_sessions, (unsigned long long)file_size(g_sj), st.journal_rewrite_s);
	/* the index is lost: the open replays every session */
	unlink(g_db);
	unlink(g_wal);
	t0 = kvt_now_s();
	db = open_db(true);
	double t_rp = kvt_now_s() - t0;
	kvt_db_get_stats(db, &st);
	uint64_t n = 0;
	kvt_db_count_sessions(db, &n);
	kvt_db_close(db);
	printf("4. recovery with the index deleted: %llu session writes replayed, %llu sessions back, in %.3f s\n",
	       (unsigned long long)st.n_replayed, (unsigned long long)n, t_rp);
	reset_files();
	rmdir(base);
	free(g_toks);
	return 0;
}
