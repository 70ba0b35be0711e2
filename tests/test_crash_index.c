/*
 * tests/test_crash_index.c — crash consistency of T2 + index (DESIGN.md §8.3).
 *
 * Each trial forks a child (also runnable by hand: --child DIR SEED) that
 * runs the start-up recovery (kvt_tm_recover, the daemon's, through
 * tm_fixture.h's tm_fx_recover) on one data directory (kept across trials), then
 * writes blocks through the REAL T2 store and rows through the index in the
 * required order — bytes durable (kvt_t2_write_batch), then the row, and the
 * block counts as acknowledged only once its row committed (kvt_db_wait) —
 * and deletes rows (row delete committed, then kvt_t2_free). It reports each
 * step on a pipe: "A <hash>" after a put committed, "d <hash>" before a delete
 * is queued. The parent SIGKILLs the child at a random moment, reopens
 * everything, runs the same start-up recovery and checks:
 *   - it skipped no row (no two rows share an extent, none lies outside the
 *     file) and lost none;
 *   - 0 rows pointing at bytes that fail verification (kvt_t2_read with the
 *     row's hash, the row's token ids, and the payload regenerated from the
 *     hash);
 *   - 100% of acknowledged blocks (not since marked for deletion) present.
 * 200 trials by default; KVT_CRASH_TRIALS=N for more (bench/stress runs).
 *
 * Then the same trials under power loss (tests/powerloss.h), in a fresh data
 * directory: the child's T2 file (through the store's I/O ops, thread-pool
 * engine) and index (through a shim SQLite VFS) keep every write not yet
 * covered by a completed sync in a journal; after the kill the parent makes
 * each file its synced image plus a seeded drop, apply or tear of each
 * unsynced write, as a power cut may leave it, and checks the same two
 * things. 100 trials by default; KVT_POWERLOSS_TRIALS=N to change (0: none).
 */
/* ctest-labels: integration */
#include "check.h"
#include "index.h"
#include "powerloss.h"
#include "t2_store.h"
#include "tm_fixture.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLOCK_TOKENS 4
#define T2_CAPACITY (2u << 20)

static bool g_powerloss; /* the child runs on the power-loss layer (tests/powerloss.h) */

static void fixed_fp(uint8_t fp[32])
{
	for (int i = 0; i < 32; i++)
		fp[i] = (uint8_t)(0x40 + i);
}

/* Payload size and bytes are a function of the hash, so the parent can regenerate them. */
static uint32_t payload_bytes_of(const uint8_t h[32])
{
	return 1000 + ((uint32_t)h[8] | (uint32_t)h[9] << 8) % 15000;
}

static void payload_fill(const uint8_t h[32], uint8_t *p, uint32_t n)
{
	check_rng r;
	memcpy(&r.s, h, 8);
	r.s |= 1;
	for (uint32_t i = 0; i < n; i += 8) {
		uint64_t x = check_rng_u64(&r);
		memcpy(p + i, &x, n - i < 8 ? n - i : 8);
	}
}

static int open_all(const char *dir, kvt_t2_store **t2, kvt_db **db)
{
	char t2_path[1024], idx_path[1024];
	kvt_t2_config tc;
	kvt_db_config dc;
	int rc = kvt_index_paths(dir, t2_path, idx_path, sizeof(t2_path));
	if (rc)
		return rc;
	memset(&tc, 0, sizeof(tc));
	tc.path = t2_path;
	tc.capacity_bytes = T2_CAPACITY;
	tc.io_mode = KVT_T2_IO_AUTO;
	tc.buffered_ok = true;
	tc.max_raw_bytes = 64 << 10;
	if (g_powerloss) { /* every data write and sync through the ops */
		tc.io_mode = KVT_T2_IO_THREADS;
		tc.io = &powerloss_t2_ops;
	}
	fixed_fp(tc.model_fp);
	if ((rc = kvt_t2_open(&tc, t2)) != KVT_OK)
		return rc;
	memset(&dc, 0, sizeof(dc));
	dc.path = idx_path;
	dc.create = true;
	fixed_fp(dc.ns.model_fp);
	dc.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	dc.ns.block_tokens = BLOCK_TOKENS;
	if ((rc = kvt_db_open(&dc, db)) != KVT_OK) {
		kvt_t2_close(*t2);
		*t2 = NULL;
	}
	return rc;
}

/* ---- the child -------------------------------------------------------------- */

struct known {
	uint8_t hash[32];  /* block */
	kvt_nvme_loc loc;  /* where */
};

struct child_rows {
	struct known *v; /* current rows */
	size_t n, cap;
};

static int collect_known(void *ctx, const kvt_db_block_row *row)
{
	struct child_rows *k = ctx;
	if (k->n == k->cap) {
		k->cap = k->cap ? 2 * k->cap : 256;
		k->v = realloc(k->v, k->cap * sizeof(*k->v));
		KVT_ASSERT(k->v);
	}
	memcpy(k->v[k->n].hash, row->hash, 32);
	k->v[k->n].loc = row->loc;
	k->n++;
	return 0;
}

static int g_out_fd = 1; /* the child's end of the pipe */

static void say(char kind, const uint8_t h[32])
{
	char line[80];
	line[0] = kind;
	line[1] = ' ';
	kvt_hash_hex(h, line + 2);
	line[66] = '\n';
	/* one write() of < PIPE_BUF bytes: the parent never sees half a line */
	if (write(g_out_fd, line, 67) != 67)
		_exit(3);
}

static int child_main(const char *dir, unsigned long long seed)
{
	kvt_t2_store *t2;
	kvt_db *db;
	kvt_btable *bt;
	tm_fx_recovery fr;
	struct child_rows rows = { 0 };
	check_rng r = { seed | 1 };
	uint8_t fp[32], root[32], salt[32] = { 0 };

	kvt_log_set_level(KVT_LOG_ERROR);
	if (g_powerloss && powerloss_begin(dir) != 0)
		return 16;
	if (open_all(dir, &t2, &db) != KVT_OK)
		return 10;
	if (kvt_btable_create(BLOCK_TOKENS, 0, &bt) != KVT_OK || tm_fx_recover(db, t2, bt, &fr) != KVT_OK)
		return 11;
	if (kvt_db_for_each_block(db, 0, collect_known, &rows) != KVT_OK)
		return 12;
	fixed_fp(fp);
	kvt_hash_root(fp, KVT_KV_LAYOUT_VERSION, BLOCK_TOKENS, salt, root);
	say('R', salt); /* recovered: the parent may time its kill from here */

	static kvt_t2_block_meta metas[8];
	static uint8_t payloads[8][16384];
	for (int op = 0; op < 400; op++) {
		bool del = rows.n > 0 && (check_rng_u64(&r) % 4 == 0);
		if (!del) {
			uint32_t n = 1 + (uint32_t)(check_rng_u64(&r) % 8);
			kvt_t2_write_req reqs[8];
			kvt_t2_loc locs[8];
			int res[8];
			uint64_t tickets[8];
			for (uint32_t i = 0; i < n; i++) {
				kvt_t2_block_meta *m = &metas[i];
				memset(m, 0, sizeof(*m));
				/* parent: a random current row (a chain continues) or the root */
				const uint8_t *par = rows.n && (check_rng_u64(&r) & 1) ? rows.v[check_rng_u64(&r) % rows.n].hash
										       : root;
				memcpy(m->parent, par, 32);
				m->n_tokens = BLOCK_TOKENS;
				for (int k = 0; k < BLOCK_TOKENS; k++)
					m->tokens[k] = (int32_t)(check_rng_u64(&r) % 49152);
				kvt_hash_block(m->parent, m->tokens, BLOCK_TOKENS, m->hash);
				m->raw_bytes = payload_bytes_of(m->hash);
				m->kv_dtype = 1;
				payload_fill(m->hash, payloads[i], m->raw_bytes);
				reqs[i].meta = m;
				reqs[i].payload = payloads[i];
			}
			kvt_t2_write_batch(t2, n, reqs, locs, res);
			bool full = false;
			for (uint32_t i = 0; i < n; i++) {
				tickets[i] = 0;
				if (res[i] == KVT_EFULL)
					full = true;
				if (res[i] != KVT_OK)
					continue;
				kvt_db_block_row row;
				memset(&row, 0, sizeof(row));
				memcpy(row.hash, metas[i].hash, 32);
				memcpy(row.parent, metas[i].parent, 32);
				row.n_tokens = BLOCK_TOKENS;
				memcpy(row.tokens, metas[i].tokens, sizeof(int32_t) * BLOCK_TOKENS);
				row.loc.off = locs[i].off;
				row.loc.extent_bytes = locs[i].extent_bytes;
				row.loc.stored_bytes = locs[i].stored_bytes;
				row.loc.generation = locs[i].generation;
				row.loc.checksum = locs[i].checksum;
				row.loc.compressed = locs[i].compressed;
				row.kv_dtype = 1;
				row.raw_bytes = metas[i].raw_bytes;
				if (kvt_db_put_block(db, &row, NULL, NULL, &tickets[i]) != KVT_OK)
					return 13;
			}
			for (uint32_t i = 0; i < n; i++) {
				if (!tickets[i])
					continue;
				if (kvt_db_wait(db, tickets[i]) != KVT_OK)
					return 14;
				say('A', metas[i].hash);
				struct known k;
				memcpy(k.hash, metas[i].hash, 32);
				k.loc.off = locs[i].off;
				k.loc.extent_bytes = locs[i].extent_bytes;
				k.loc.stored_bytes = locs[i].stored_bytes;
				k.loc.generation = locs[i].generation;
				k.loc.checksum = locs[i].checksum;
				k.loc.compressed = locs[i].compressed;
				kvt_db_block_row dummy;
				memset(&dummy, 0, sizeof(dummy));
				memcpy(dummy.hash, k.hash, 32);
				dummy.loc = k.loc;
				collect_known(&rows, &dummy);
			}
			if (!full)
				continue;
		}
		/* delete 1..4 rows: intent, row delete committed, then the extent freed */
		uint32_t n_del = 1 + (uint32_t)(check_rng_u64(&r) % 4);
		for (uint32_t d = 0; d < n_del && rows.n; d++) {
			size_t j = check_rng_u64(&r) % rows.n;
			struct known k = rows.v[j];
			uint64_t t;
			say('d', k.hash);
			if (kvt_db_delete_block(db, k.hash, NULL, NULL, &t) != KVT_OK || kvt_db_wait(db, t) != KVT_OK)
				return 15;
			kvt_t2_loc loc = { k.loc.off, k.loc.extent_bytes, k.loc.stored_bytes, k.loc.generation,
					   k.loc.checksum, k.loc.compressed };
			kvt_t2_free(t2, &loc);
			rows.v[j] = rows.v[--rows.n];
		}
	}
	kvt_db_close(db);
	kvt_t2_close(t2);
	kvt_btable_destroy(bt);
	free(rows.v);
	return 0;
}

/* ---- the parent --------------------------------------------------------------- */

struct hset {
	uint8_t (*v)[32]; /* acknowledged, not marked for deletion */
	size_t n, cap;
};

static void hset_add(struct hset *s, const uint8_t h[32])
{
	for (size_t i = 0; i < s->n; i++)
		if (memcmp(s->v[i], h, 32) == 0)
			return;
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 1024;
		s->v = realloc(s->v, s->cap * 32);
		KVT_ASSERT(s->v);
	}
	memcpy(s->v[s->n++], h, 32);
}

static void hset_del(struct hset *s, const uint8_t h[32])
{
	for (size_t i = 0; i < s->n; i++)
		if (memcmp(s->v[i], h, 32) == 0) {
			memcpy(s->v[i], s->v[--s->n], 32);
			return;
		}
}

static bool parse_hex(const char *p, uint8_t h[32])
{
	for (int i = 0; i < 32; i++) {
		unsigned v;
		if (sscanf(p + 2 * i, "%2x", &v) != 1)
			return false;
		h[i] = (uint8_t)v;
	}
	return true;
}

struct verify {
	kvt_db_block_row *rows; /* this trial's rows */
	size_t n_rows, cap_rows;
	uint8_t (*hashes)[32];  /* their hashes, sorted after the walk */
	uint64_t n_bad;         /* rows pointing at bad bytes, all trials */
};

static int collect_row(void *ctx, const kvt_db_block_row *row)
{
	struct verify *v = ctx;
	if (v->n_rows == v->cap_rows) {
		v->cap_rows = v->cap_rows ? 2 * v->cap_rows : 1024;
		v->rows = realloc(v->rows, v->cap_rows * sizeof(*v->rows));
		v->hashes = realloc(v->hashes, v->cap_rows * 32);
		KVT_ASSERT(v->rows && v->hashes);
	}
	v->rows[v->n_rows] = *row;
	memcpy(v->hashes[v->n_rows], row->hash, 32);
	v->n_rows++;
	return 0;
}

/* Read every row's record in batches (kvt_t2_read_batch) and check it against the row and the expected payload. */
static void verify_rows(struct verify *v, kvt_t2_store *t2)
{
	enum { CHUNK = 64, CAP = 16384 };
	static kvt_t2_loc locs[CHUNK];
	static uint8_t want_hash[CHUNK][32];
	static kvt_t2_block_meta metas[CHUNK];
	static uint8_t bufs[CHUNK][CAP], want[CAP];
	void *ptrs[CHUNK];
	int res[CHUNK];
	for (int i = 0; i < CHUNK; i++)
		ptrs[i] = bufs[i];
	for (size_t base = 0; base < v->n_rows; base += CHUNK) {
		uint32_t n = (uint32_t)(v->n_rows - base < CHUNK ? v->n_rows - base : CHUNK);
		for (uint32_t i = 0; i < n; i++) {
			const kvt_nvme_loc *l = &v->rows[base + i].loc;
			locs[i] = (kvt_t2_loc){ l->off, l->extent_bytes, l->stored_bytes, l->generation, l->checksum,
						l->compressed };
			memcpy(want_hash[i], v->rows[base + i].hash, 32);
		}
		kvt_t2_read_batch(t2, n, locs, (const uint8_t(*)[32])want_hash, metas, ptrs, CAP, res);
		for (uint32_t i = 0; i < n; i++) {
			const kvt_db_block_row *row = &v->rows[base + i];
			uint32_t nb = payload_bytes_of(row->hash);
			bool ok = res[i] == KVT_OK && metas[i].raw_bytes == nb && metas[i].n_tokens == row->n_tokens &&
				  memcmp(metas[i].tokens, row->tokens, sizeof(int32_t) * row->n_tokens) == 0;
			if (ok) {
				payload_fill(row->hash, want, nb);
				ok = memcmp(want, bufs[i], nb) == 0;
			}
			if (!ok) {
				char hex[65];
				kvt_hash_hex(row->hash, hex);
				fprintf(stderr, "bad row %s at %llu: %s\n", hex, (unsigned long long)row->loc.off,
					kvt_strerror(res[i]));
				v->n_bad++;
			}
		}
	}
}

static int cmp32(const void *a, const void *b)
{
	return memcmp(a, b, 32);
}

typedef struct trial_totals {
	uint64_t n_acks, n_killed_busy, n_exited, max_rows, bad_child, n_dels, n_must;
	double t_startup, t_verify, t_all;
	powerloss_stats pl; /* power loss: what the cuts did with unsynced writes */
} trial_totals;

/* n_trials crash trials on dir (kill -9, or a power cut when g_powerloss); counters in *tt. */
static void run_trials(const char *dir, int n_trials, uint64_t seed0, trial_totals *tt)
{
	struct hset must = { 0 };
	struct verify v = { 0 };
	check_rng r = { seed0 };
	const char *mode = g_powerloss ? "power loss" : "kill -9";
	double t0 = kvt_now_s();

	for (int trial = 0; trial < n_trials; trial++) {
		int fds[2];
		if (pipe(fds) != 0)
			return;
		char seed[32];
		snprintf(seed, sizeof(seed), "%llu", check_rng_u64(&r));
		if (g_powerloss && powerloss_settle(dir) != 0) {
			CHECKF(0, "%s trial %d: cannot set up the durable images", mode, trial);
			break;
		}
		fflush(stdout);
		fflush(stderr);
		double t_fork = kvt_now_s();
		pid_t pid = fork();
		if (pid == 0) {
			/*
			 * The parent holds no threads here (store and index are
			 * closed between trials), so the child can run straight
			 * from the fork; exec'ing would cost a sanitizer runtime
			 * start per trial. `--child DIR SEED` runs one by hand.
			 */
			close(fds[0]);
			g_out_fd = fds[1];
			_exit(child_main(dir, strtoull(seed, NULL, 10)));
		}
		close(fds[1]);
		FILE *f = fdopen(fds[0], "r");
		char line[128];
		bool have_line = false;
		/*
		 * One trial in four is killed 0..60 ms after the fork (start-up and
		 * recovery included); the others 0..40 ms after the child reports it
		 * has recovered (writes, commits, deletes), so slow builds
		 * (sanitizers) still crash mid-write.
		 */
		if (trial % 4 != 0) {
			have_line = fgets(line, sizeof(line), f) != NULL;
			tt->t_startup += kvt_now_s() - t_fork;
		}
		struct timespec ts = { 0, (long)(check_rng_u64(&r) % (trial % 4 ? 40000 : 60000)) * 1000L };
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		int st = 0;
		/* drain every line the child managed to write before it died */
		while (have_line || fgets(line, sizeof(line), f)) {
			have_line = false;
			uint8_t h[32];
			if (strlen(line) != 67 || !parse_hex(line + 2, h)) {
				CHECKF(0, "%s trial %d: garbled line from the child: %s", mode, trial, line);
				continue;
			}
			if (line[0] == 'A') {
				hset_add(&must, h);
				tt->n_acks++;
			} else if (line[0] == 'd') {
				hset_del(&must, h);
				tt->n_dels++;
			}
		}
		fclose(f);
		waitpid(pid, &st, 0);
		if (WIFSIGNALED(st))
			tt->n_killed_busy++;
		else if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
			tt->n_exited++;
		else {
			tt->bad_child++;
			fprintf(stderr, "%s trial %d: child exited with %d\n", mode, trial,
				WIFEXITED(st) ? WEXITSTATUS(st) : -1);
		}
		/* the power cut: the files as the disk may hold them after it */
		if (g_powerloss)
			CHECKF(powerloss_cut(dir, check_rng_u64(&r), &tt->pl) == 0, "%s trial %d: cut failed", mode, trial);

		/* reopen and verify (real syscalls, the default VFS) */
		double t_v0 = kvt_now_s();
		kvt_t2_store *t2;
		kvt_db *db;
		bool pl_mode = g_powerloss;
		g_powerloss = false;
		int rc = open_all(dir, &t2, &db);
		g_powerloss = pl_mode;
		CHECKF(rc == KVT_OK, "%s trial %d: reopen failed: %s", mode, trial, kvt_strerror(rc));
		if (rc)
			break;
		kvt_btable *bt = NULL;
		tm_fx_recovery fr;
		CHECK(kvt_btable_create(BLOCK_TOKENS, 0, &bt) == KVT_OK);
		rc = tm_fx_recover(db, t2, bt, &fr);
		CHECKF(rc == KVT_OK, "%s trial %d: start-up recovery failed: %s", mode, trial, kvt_strerror(rc));
		kvt_btable_destroy(bt);
		if (rc) {
			kvt_db_close(db);
			kvt_t2_close(t2);
			break;
		}
		CHECKF(fr.n_skipped == 0, "%s trial %d: %llu rows share or misplace extents", mode, trial,
		       (unsigned long long)fr.n_skipped);
		CHECKF(fr.n_lost == 0, "%s trial %d: %llu rows point past the file's intact bytes", mode, trial,
		       (unsigned long long)fr.n_lost);
		v.n_rows = 0;
		uint64_t bad_before = v.n_bad;
		CHECK(kvt_db_for_each_block(db, 0, collect_row, &v) == KVT_OK);
		verify_rows(&v, t2);
		CHECKF(v.n_bad == bad_before, "%s trial %d: %llu rows point at bad bytes", mode, trial,
		       (unsigned long long)(v.n_bad - bad_before));
		if (v.n_rows)
			qsort(v.hashes, v.n_rows, 32, cmp32);
		uint64_t missing = 0;
		for (size_t i = 0; i < must.n; i++)
			if (!v.n_rows || !bsearch(must.v[i], v.hashes, v.n_rows, 32, cmp32))
				missing++;
		CHECKF(missing == 0, "%s trial %d: %llu acknowledged blocks missing", mode, trial,
		       (unsigned long long)missing);
		if (v.n_rows > tt->max_rows)
			tt->max_rows = v.n_rows;
		kvt_db_close(db);
		kvt_t2_close(t2);
		tt->t_verify += kvt_now_s() - t_v0;
	}
	tt->n_must = must.n;
	tt->t_all = kvt_now_s() - t0;
	free(must.v);
	free(v.rows);
	free(v.hashes);
}

static void report(const char *mode, int n_trials, const trial_totals *tt)
{
	printf("crash (%s): child start-up to recovered %.1f ms (mean of the waited-for trials), parent verification "
	       "%.1f ms per trial\n",
	       mode, n_trials > 1 ? 1e3 * tt->t_startup / (n_trials - (n_trials + 3) / 4) : 0.0,
	       1e3 * tt->t_verify / n_trials);
	printf("crash (%s): %d trials in %.1f s: %llu killed while running, %llu finished first; %llu puts "
	       "acknowledged, %llu deletes started, up to %llu rows, %llu must-have blocks at the end\n",
	       mode, n_trials, tt->t_all, (unsigned long long)tt->n_killed_busy, (unsigned long long)tt->n_exited,
	       (unsigned long long)tt->n_acks, (unsigned long long)tt->n_dels, (unsigned long long)tt->max_rows,
	       (unsigned long long)tt->n_must);
}

static int env_trials(const char *name, int dflt)
{
	const char *env = getenv(name);
	return env && *env && atoi(env) >= 0 ? atoi(env) : dflt;
}

static void remove_dir(const char *dir)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

int main(int argc, char **argv)
{
	if ((argc == 4 || argc == 5) && strcmp(argv[1], "--child") == 0) {
		g_powerloss = argc == 5 && strcmp(argv[4], "powerloss") == 0;
		return child_main(argv[2], strtoull(argv[3], NULL, 10));
	}

	char dir[] = "/tmp/kvt_crash_XXXXXX";
	int n_trials = env_trials("KVT_CRASH_TRIALS", 200);
	if (n_trials == 0)
		n_trials = 200;
	int n_pl = env_trials("KVT_POWERLOSS_TRIALS", 100);
	if (!mkdtemp(dir))
		return check_skip("test_crash_index", "mkdtemp failed");

	trial_totals tt;
	memset(&tt, 0, sizeof(tt));
	run_trials(dir, n_trials, 0xC0FFEEull, &tt);
	CHECK_EQ_INT(tt.bad_child, 0);
	CHECK(tt.n_acks > 0);
	report("kill -9", n_trials, &tt);
	remove_dir(dir);

	if (n_pl > 0) {
		char pdir[] = "/tmp/kvt_powerloss_XXXXXX";
		if (!mkdtemp(pdir))
			return check_skip("test_crash_index", "mkdtemp failed");
		/* the T2 file exists (created and synced) before the first cut: creation is not what is tested */
		kvt_t2_store *t2;
		kvt_db *db;
		CHECK(open_all(pdir, &t2, &db) == KVT_OK);
		kvt_db_close(db);
		kvt_t2_close(t2);
		memset(&tt, 0, sizeof(tt));
		g_powerloss = true;
		run_trials(pdir, n_pl, 0xDEC0DEull, &tt);
		g_powerloss = false;
		CHECK_EQ_INT(tt.bad_child, 0);
		CHECK(tt.n_acks > 0);
		CHECKF(tt.pl.n_dropped > 0 && tt.pl.n_torn > 0 && tt.pl.n_applied > 0,
		       "the cuts never dropped, tore or applied an unsynced write");
		report("power loss", n_pl, &tt);
		printf("crash (power loss): %llu unsynced writes at the cuts: %llu dropped, %llu applied, %llu torn\n",
		       (unsigned long long)tt.pl.n_entries, (unsigned long long)tt.pl.n_dropped,
		       (unsigned long long)tt.pl.n_applied, (unsigned long long)tt.pl.n_torn);
		remove_dir(pdir);
	}
	return check_done("test_crash_index");
}
