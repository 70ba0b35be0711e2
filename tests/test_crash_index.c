/*
 * tests/test_crash_index.c — crash consistency of the tiering manager's write
 * path: T2 records, index rows, session rows and the session journal
 * (DESIGN.md §8.3).
 *
 * Each trial forks a child (also runnable by hand: --child DIR SEED [POINT
 * NTH] [powerloss]) that opens one data directory (kept across trials) as the
 * daemon does (kvt_stack_open: the index with its session journal, the T2
 * file owned by the index, a manager on the CPU device, then kvt_tm_recover,
 * the daemon's one start-up recovery) and then serves turns through the
 * manager's public API only, as engine/serve does: a turn appends tokens to
 * a session, its new full blocks are written into T0 slots (real KV bytes, a
 * function of the block hash) and registered (kvt_tm_register); a retained
 * session's chain is retained in T2 (kvt_tm_retain, floor NVMe, as cache
 * control does); the session row is put (kvt_db_put_session, its done
 * callback as sched_turn_end's) and the turn ends (kvt_tm_end_turn_chain with
 * a durable callback). T0 and T1 are 8 blocks and T2 half a megabyte, so the
 * manager's own maintenance evicts T0 -> T1, writes T1 back to T2 and evicts
 * T2 under pressure (row deleted, then extent freed), while turns persist.
 * Sessions are deleted as kvt_sched_session_delete does (kvt_tm_release,
 * kvt_db_delete_session, wait). The child reports on a pipe, one write() per
 * line:
 *   "S <id> <n>"  a session turn acknowledged: its row committed (the put's
 *                 done callback with KVT_OK: when the daemon replies);
 *   "A <hash>"    a block acknowledged: a retained session's leading block
 *                 that the durable callback counted (bytes in T2, row
 *                 committed), once the turn's row (queued after its
 *                 retention) committed too;
 *   "x <id>", "d <hash>"  before a session's deletion, and for each of its
 *                 retained blocks before their release;
 *   "F <name>"    a named fault point fired (the child dies right after);
 *   "M ..."       every few turns, the manager's counters (evictions per
 *                 tier, blocks persisted): the report shows the pressure.
 * Unretained blocks may be evicted from T2 at any time: they are never
 * "must" blocks, but their rows are checked like every other.
 *
 * The parent SIGKILLs the child at a random moment, or arms a named fault
 * point (core/fault.h) in it: the nth hit of one of FAULT_POINTS kills it
 * there (moments a random kill almost never hits: between a journal's
 * fdatasync and the COMMIT, between bytes durable and the row, between a
 * row's deletion and its extent's release). A point never reached leaves a
 * random-kill trial; the report counts the trials that landed on each point.
 * Then the parent reopens the directory as the daemon does (the index with
 * its journal: records the index lacks are replayed) and runs the same
 * start-up recovery (tm_fx_recover: kvt_tm_recover), and checks:
 *   - it skipped no row (no two rows share an extent, none lies outside the
 *     file) and lost none;
 *   - 0 rows pointing at bytes that fail verification (kvt_t2_read with the
 *     row's hash, the row's token ids, and the payload regenerated from the
 *     hash);
 *   - 100% of acknowledged blocks (not since marked for deletion) present;
 *   - every acknowledged session turn (session not since deleted) present:
 *     its row holds that turn's history or a later turn's;
 *   - no session row half-applied: every row's history is the generator's
 *     tokens, ends at a turn boundary, and its last_hash is its chain's.
 * 200 trials by default; KVT_CRASH_TRIALS=N for more (bench/stress runs).
 *
 * Then the same trials under power loss (tests/powerloss.h), in a fresh data
 * directory: the child's T2 file (through the store's I/O ops, thread-pool
 * engine), index and WAL (through a shim SQLite VFS) and session journal
 * (through the index's journal I/O seam) keep every write not yet covered
 * by a completed sync in a journal; after the kill the parent makes each
 * file its synced image plus a seeded drop, apply or tear of each unsynced
 * write, as a power cut may leave it, and checks the same things. 100 trials
 * by default; KVT_POWERLOSS_TRIALS=N to change (0: none).
 *
 * Seeds: the trials are seeded from KVT_CRASH_SEED (default 0xC0FFEE; the
 * power-loss phase from it xor 0x1E2E3E), printed at the start.
 */
/* ctest-labels: integration */
#include "check.h"
#include "fault.h"
#include "index.h"
#include "manager.h"
#include "powerloss.h"
#include "t2_store.h"
#include "test_dev.h"
#include "tm_fixture.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLOCK_TOKENS 4
#define T2_CAPACITY (512u << 10)
#define N_T0 8              /* T0 slots */
#define N_T1 8              /* T1 slots */
#define MAX_SESSIONS 10     /* live sessions a child keeps */
#define MAX_RETAINED 3      /* of those, retained (their blocks must survive) */
#define MAX_TOKENS 48       /* a session longer than this is deleted */
#define MAX_BLOCKS (MAX_TOKENS / BLOCK_TOKENS + 4)
#define TENANT "t"
#define RETAIN_TTL_US 1000000000000ull /* 11 days: never expires in a run */

/* The KV block shape: 2 layers x K/V x 2 heads x 4 tokens x 32 dims, fp16: 2 KiB records. */
static const kvt_kv_layout g_shape = { .n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_tokens = BLOCK_TOKENS };

/*
 * The named fault points the trials arm. The idx.* points are in index/; the
 * tm.* and t2.* ones are asked of tiers/ (the report of issue 48 item 4):
 * until they are placed, trials that arm them are random-kill trials.
 */
static const char *const FAULT_POINTS[] = {
	"idx.journal.written",        "idx.commit.journal_synced", "idx.commit.before",
	"idx.commit.committed",       "idx.journal.rewrite_synced", "idx.journal.rewrite_renamed",
	"tm.persist.bytes_durable",   "tm.persist.rows_queued",    "tm.persist.row_committed",
	"tm.evict.row_deleted",       "tm.evict.extent_freed",     "tm.turn.answered",
	"tm.retain.row_queued",       "t2.write.synced",
};
#define N_FAULT_POINTS (sizeof(FAULT_POINTS) / sizeof(FAULT_POINTS[0]))

static bool g_powerloss; /* the child runs on the power-loss layer (tests/powerloss.h) */

static void fixed_fp(uint8_t fp[32])
{
	for (int i = 0; i < 32; i++)
		fp[i] = (uint8_t)(0x40 + i);
}

static size_t block_bytes(void)
{
	return kvt_kv_packed_bytes(&g_shape, KVT_KV_CODEC_F16);
}

/* A block's KV bytes are a function of its hash, so the parent can regenerate them. */
static void payload_fill(const uint8_t h[32], uint8_t *p, size_t n)
{
	check_rng r;
	memcpy(&r.s, h, 8);
	r.s |= 1;
	for (size_t i = 0; i < n; i += 8) {
		uint64_t x = check_rng_u64(&r);
		memcpy(p + i, &x, n - i < 8 ? n - i : 8);
	}
}

/* ---- sessions: ids, token histories and turn boundaries are functions of the id ---- */

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Session ids: "r<16 hex>" (retained) or "s<16 hex>"; the hex is the session's key. */
static bool sess_parse(const char *id, uint64_t *key, bool *retained)
{
	if ((id[0] != 'r' && id[0] != 's') || strlen(id) != 17)
		return false;
	char *end;
	*key = strtoull(id + 1, &end, 16);
	*retained = id[0] == 'r';
	return *end == '\0';
}

static int32_t sess_token(uint64_t key, uint32_t i)
{
	return (int32_t)(mix64(key ^ (0x100000001b3ull * (i + 1))) % 30000);
}

/* Tokens turn k appends: 2..12. */
static uint32_t sess_turn_len(uint64_t key, uint32_t k)
{
	return 2 + (uint32_t)(mix64(key + 0x51ed2701ull * (k + 1)) % 11);
}

/* How many whole turns make n tokens, or -1 when n is not a turn boundary. */
static int sess_turns_of(uint64_t key, uint32_t n)
{
	uint32_t sum = 0;
	for (int k = 0; sum < n; k++) {
		sum += sess_turn_len(key, (uint32_t)k);
		if (sum == n)
			return k + 1;
	}
	return n == 0 ? 0 : -1;
}

static void chain_root(uint8_t root[32])
{
	uint8_t fp[32], salt[32] = { 0 };
	fixed_fp(fp);
	KVT_ASSERT(kvt_hash_root(fp, KVT_KV_LAYOUT_VERSION, BLOCK_TOKENS, salt, root) == KVT_OK);
}

/* ---- opening the data directory as kvt_stack_open does ---- */

static int db_open_dir(const char *dir, kvt_db **db)
{
	char t2_path[1024], idx_path[1024], sj_path[1100];
	kvt_db_config dc;
	int rc = kvt_index_paths(dir, t2_path, idx_path, sizeof(t2_path));
	if (rc)
		return rc;
	snprintf(sj_path, sizeof(sj_path), "%s/%s", dir, KVT_DATA_SESSIONS_FILE);
	memset(&dc, 0, sizeof(dc));
	dc.path = idx_path;
	dc.create = true;
	dc.journal_path = sj_path;
	dc.journal_compact_bytes = 2 << 10; /* small: the journal is rewritten every dozen session writes or so */
	if (g_powerloss)
		dc.journal_io = &powerloss_sj_io;
	fixed_fp(dc.ns.model_fp);
	dc.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	dc.ns.block_tokens = BLOCK_TOKENS;
	return kvt_db_open(&dc, db);
}

static int open_all(const char *dir, kvt_t2_store **t2, kvt_db **db)
{
	char t2_path[1024], idx_path[1024];
	kvt_t2_config tc;
	int rc = kvt_index_paths(dir, t2_path, idx_path, sizeof(t2_path));
	if (rc || (rc = db_open_dir(dir, db)) != KVT_OK)
		return rc;
	memset(&tc, 0, sizeof(tc));
	tc.path = t2_path;
	tc.capacity_bytes = T2_CAPACITY;
	tc.io_mode = KVT_T2_IO_AUTO;
	tc.buffered_ok = true;
	tc.max_raw_bytes = (uint32_t)block_bytes();
	if (g_powerloss) { /* every data write and sync through the ops */
		tc.io_mode = KVT_T2_IO_THREADS;
		tc.io = &powerloss_t2_ops;
	}
	fixed_fp(tc.model_fp);
	kvt_db_owner_id(*db, tc.owner_id); /* the file belongs to this index, and no other */
	if ((rc = kvt_t2_open(&tc, t2)) != KVT_OK) {
		kvt_db_close(*db);
		*db = NULL;
	}
	return rc;
}

/* ---- the child -------------------------------------------------------------- */

static int g_out_fd = 1; /* the child's end of the pipe */

/* One line to the parent: one write() of < PIPE_BUF bytes, so no thread's line is ever split. */
static void say(const char *fmt, ...)
{
	char line[160];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	KVT_ASSERT(n > 0 && n < (int)sizeof(line));
	if (write(g_out_fd, line, (size_t)n) != n)
		_exit(3);
}

static void say_hash(char kind, const uint8_t h[32])
{
	char hex[65];
	kvt_hash_hex(h, hex);
	say("%c %s\n", kind, hex);
}

/* kvt_fault_arm's fire: tell the parent which point this trial died at. */
static void on_fault(const char *name)
{
	say("F %s\n", name);
}

typedef struct child_sess {
	char id[24];       /* "r<hex>" / "s<hex>" */
	uint64_t key;      /* its tokens' and turns' generator */
	bool retained;     /* its chain is retained in T2 */
	uint32_t n_tokens; /* history so far */
	uint32_t n_turns;  /* turns so far */
	atomic_int n_cb;   /* durable callbacks not yet run: not deleted (or freed) while > 0 */
} child_sess;

typedef struct child {
	kvt_dev *dev;        /* CPU test device */
	kvt_t0_pool *t0;     /* T0 */
	kvt_btable *bt;      /* hot table */
	kvt_t2_store *t2;    /* NVMe tier */
	kvt_db *db;          /* index (with its session journal) */
	kvt_tm *tm;          /* the manager */
	uint8_t root[32];    /* every session's chain root (one tenant) */
	child_sess *s[2 * MAX_SESSIONS]; /* live sessions (heap: callbacks hold them) */
	uint32_t n_s;        /* in s */
	uint8_t *kv;         /* one block's bytes (host) */
	check_rng r;         /* this child's choices */
} child;

/* A turn's session row committed or failed (kvt_db_put_session's done, on the writer thread). */
typedef struct row_ack {
	char id[24];       /* the session */
	uint32_t n_tokens; /* its history in this turn */
} row_ack;

static void on_row_done(void *user, int rc)
{
	row_ack *a = user;
	if (rc == KVT_OK) /* sched_turn_saved: the daemon replies now */
		say("S %s %u\n", a->id, a->n_tokens);
	free(a);
}

/* A turn's durable callback (kvt_tm_end_turn_chain): its context. */
typedef struct turn_wait {
	child_sess *s;            /* the session (kept alive while n_cb > 0) */
	kvt_db *db;               /* the index */
	uint64_t ticket;          /* the turn's session row (queued after the chain's retention), 0: none */
	uint32_t n_retained;      /* leading blocks of the chain that kvt_tm_retain retained */
	uint8_t chain[MAX_BLOCKS][32]; /* the turn's chain */
} turn_wait;

/*
 * On the manager's thread: the first n_durable blocks have their bytes in T2
 * and rows committed. Retained ones are acknowledged once the turn's row
 * committed too: their retention (a row update queued before it, when a block
 * had a row already) is then durable, so no later start evicts them.
 */
static void on_durable(void *user, int rc, uint32_t n_durable)
{
	turn_wait *w = user;
	(void)rc;
	uint32_t n = n_durable < w->n_retained ? n_durable : w->n_retained;
	if (n && w->ticket && kvt_db_wait(w->db, w->ticket) == KVT_OK)
		for (uint32_t i = 0; i < n; i++)
			say_hash('A', w->chain[i]);
	atomic_fetch_sub(&w->s->n_cb, 1);
	free(w);
}

/* The engine computed block hash into a T0 slot: its KV bytes written, registered, the sequence lets go. */
static int child_register(child *c, const uint8_t hash[32], const uint8_t parent[32], const int32_t *tokens)
{
	int32_t slot;
	if (kvt_t0_alloc(c->t0, &slot) != KVT_OK &&
	    (kvt_tm_reserve_t0(c->tm, 1) != KVT_OK || kvt_t0_alloc(c->t0, &slot) != KVT_OK))
		return KVT_EFULL;
	size_t nb = block_bytes();
	payload_fill(hash, c->kv, nb);
	int rc = kvt_dev_copy_h2d(c->dev, (char *)kvt_t0_layout(c->t0)->pool + (size_t)slot * nb, c->kv, nb);
	if (rc == KVT_OK)
		rc = kvt_tm_register(c->tm, hash, parent, tokens, slot);
	kvt_t0_unref(c->t0, slot);
	return rc;
}

static uint32_t child_history(const child *c, const child_sess *s, uint32_t n, int32_t *toks, uint8_t (*chain)[32])
{
	uint32_t n_chain = 0;
	for (uint32_t i = 0; i < n; i++)
		toks[i] = sess_token(s->key, i);
	KVT_ASSERT(kvt_hash_chain(c->root, toks, n, BLOCK_TOKENS, chain, MAX_BLOCKS, &n_chain) == KVT_OK);
	return n_chain;
}

/*
 * One turn of session s, as the daemon runs it: the blocks the cache lacks
 * computed and registered, the chain retained (a retained session), the
 * session row put (sched_turn_end: durable_tokens from the manager), the
 * turn ended with a durable callback, the reply after the row committed.
 */
static int child_turn(child *c, child_sess *s)
{
	int32_t toks[MAX_TOKENS + 16];
	turn_wait *w = calloc(1, sizeof(*w));
	row_ack *a = malloc(sizeof(*a));
	if (!w || !a)
		return KVT_ENOMEM;
	uint32_t n = s->n_tokens + sess_turn_len(s->key, s->n_turns);
	uint32_t n_chain = child_history(c, s, n, toks, w->chain);
	kvt_btable_match m[MAX_BLOCKS];
	uint32_t n_matched = 0;
	if (n_chain && kvt_tm_lookup_chain(c->tm, (const uint8_t(*)[32])w->chain, toks, n_chain, 0, m, &n_matched))
		n_matched = 0;
	for (uint32_t b = n_matched; b < n_chain; b++)
		if (child_register(c, w->chain[b], b ? w->chain[b - 1] : c->root, toks + b * BLOCK_TOKENS) != KVT_OK)
			break;
	kvt_tm_retain_result rr;
	if (s->retained && n_chain &&
	    kvt_tm_retain(c->tm, TENANT, n_chain, (const uint8_t(*)[32])w->chain, RETAIN_TTL_US, KVT_TIER_NVME, &rr) ==
		    KVT_OK)
		w->n_retained = n_chain - rr.n_denied;
	kvt_db_session row;
	memset(&row, 0, sizeof(row));
	snprintf(row.id, sizeof(row.id), "%s", s->id);
	snprintf(row.tenant, sizeof(row.tenant), "%s", TENANT);
	row.tokens = toks;
	row.n_tokens = n;
	memcpy(row.last_hash, n_chain ? w->chain[n_chain - 1] : c->root, 32);
	row.durable_tokens = kvt_tm_durable_prefix(c->tm, n_chain, (const uint8_t(*)[32])w->chain) * BLOCK_TOKENS;
	snprintf(a->id, sizeof(a->id), "%.23s", s->id);
	a->n_tokens = n;
	if (kvt_db_put_session(c->db, &row, on_row_done, a, &w->ticket) != KVT_OK) {
		free(a);
		w->ticket = 0;
	}
	uint64_t ticket = w->ticket;
	w->s = s;
	w->db = c->db;
	atomic_fetch_add(&s->n_cb, 1);
	if (kvt_tm_end_turn_chain(c->tm, n_chain, (const uint8_t(*)[32])w->chain, on_durable, w) != KVT_OK) {
		atomic_fetch_sub(&s->n_cb, 1);
		free(w);
	}
	if (ticket && kvt_db_wait(c->db, ticket) != KVT_OK)
		return KVT_EIO;
	s->n_tokens = n;
	s->n_turns++;
	return KVT_OK;
}

/* Delete session i as kvt_sched_session_delete does: its retention ends, the row goes, committed. */
static int child_delete(child *c, uint32_t i)
{
	child_sess *s = c->s[i];
	int32_t toks[MAX_TOKENS + 16];
	uint8_t chain[MAX_BLOCKS][32];
	uint64_t t = 0;
	if (atomic_load(&s->n_cb)) /* a durable callback may still acknowledge its blocks */
		return KVT_OK;
	uint32_t n_chain = child_history(c, s, s->n_tokens, toks, chain);
	say("x %s\n", s->id);
	if (s->retained)
		for (uint32_t b = 0; b < n_chain; b++)
			say_hash('d', chain[b]);
	(void)kvt_tm_release(c->tm, n_chain, (const uint8_t(*)[32])chain);
	if (kvt_db_delete_session(c->db, TENANT, s->id, NULL, NULL, &t) != KVT_OK || kvt_db_wait(c->db, t) != KVT_OK)
		return KVT_EIO;
	free(s);
	c->s[i] = c->s[--c->n_s];
	return KVT_OK;
}

static child_sess *sess_new(const char *id, uint64_t key, bool retained)
{
	child_sess *s = calloc(1, sizeof(*s));
	KVT_ASSERT(s);
	snprintf(s->id, sizeof(s->id), "%.23s", id);
	s->key = key;
	s->retained = retained;
	atomic_init(&s->n_cb, 0);
	return s;
}

/* The sessions the index holds at start: the child continues them (a row not at a turn boundary is left alone). */
static int load_session(void *ctx, const kvt_db_session *row)
{
	child *c = ctx;
	uint64_t key;
	bool retained;
	int turns;
	if (c->n_s == 2 * MAX_SESSIONS || !sess_parse(row->id, &key, &retained) ||
	    (turns = sess_turns_of(key, row->n_tokens)) < 0)
		return 0;
	child_sess *s = sess_new(row->id, key, retained);
	s->n_tokens = row->n_tokens;
	s->n_turns = (uint32_t)turns;
	c->s[c->n_s++] = s;
	return 0;
}

/* Open the directory as kvt_stack_open does and run its start-up recovery. */
static int child_open(child *c, const char *dir)
{
	kvt_tm_config cfg;
	uint64_t n_rec = 0;
	int rc;
	if ((rc = open_all(dir, &c->t2, &c->db)) != KVT_OK)
		return 10;
	if (tm_fx_base(&g_shape, N_T0, &c->dev, &c->t0, &c->bt))
		return 11;
	tm_fx_config(&cfg, c->dev, c->t0, c->bt, c->t2, c->db, N_T1, KVT_KV_CODEC_F16);
	cfg.poll_s = 0.02; /* the daemon's maintenance period */
	cfg.n_io_threads = 1;
	cfg.batch_blocks = 8;
	if (kvt_tm_create(&cfg, &c->tm) != KVT_OK || kvt_tm_recover(c->tm, &n_rec) != KVT_OK)
		return 12;
	if (kvt_db_list_sessions(c->db, TENANT, load_session, c) != KVT_OK)
		return 13;
	return 0;
}

static int child_main(const char *dir, unsigned long long seed, const char *point, uint64_t nth)
{
	child c;
	memset(&c, 0, sizeof(c));
	c.r.s = seed | 1;
	kvt_log_set_level(KVT_LOG_ERROR);
	if (g_powerloss && powerloss_begin(dir) != 0)
		return 16;
	int rc = child_open(&c, dir);
	if (rc)
		return rc;
	chain_root(c.root);
	c.kv = malloc(block_bytes());
	KVT_ASSERT(c.kv);
	say("R\n"); /* recovered: the parent may time its kill from here */
	if (point)
		kvt_fault_arm(point, nth, on_fault);

	for (int op = 0; op < 300; op++) {
		uint32_t n_ret = 0;
		for (uint32_t i = 0; i < c.n_s; i++)
			n_ret += c.s[i]->retained;
		uint64_t x = check_rng_u64(&c.r);
		if (c.n_s == 0 || (c.n_s < MAX_SESSIONS && x % 6 == 0)) {
			char id[24];
			bool retained = n_ret < MAX_RETAINED && (x >> 8) % 2;
			snprintf(id, sizeof(id), "%c%016llx", retained ? 'r' : 's', (unsigned long long)check_rng_u64(&c.r));
			uint64_t key;
			KVT_ASSERT(sess_parse(id, &key, &retained));
			c.s[c.n_s++] = sess_new(id, key, retained);
		}
		uint32_t i = (uint32_t)(check_rng_u64(&c.r) % c.n_s);
		if (c.s[i]->n_tokens >= MAX_TOKENS || x % 11 == 1)
			rc = child_delete(&c, i);
		else
			rc = child_turn(&c, c.s[i]);
		if (rc)
			return 14;
		if (op % 4 == 3) {
			kvt_tm_stats ts;
			kvt_tm_get_stats(c.tm, &ts);
			say("M %llu %llu %llu %llu\n", (unsigned long long)ts.tier[KVT_TIER_HBM].n_evictions,
			    (unsigned long long)ts.tier[KVT_TIER_HOST].n_evictions,
			    (unsigned long long)ts.tier[KVT_TIER_NVME].n_evictions, (unsigned long long)ts.n_persisted);
		}
	}
	kvt_tm_destroy(c.tm); /* flushes: the callbacks run (KVT_ESTOPPED) */
	for (uint32_t i = 0; i < c.n_s; i++)
		free(c.s[i]);
	free(c.kv);
	kvt_db_close(c.db);
	kvt_t2_close(c.t2);
	kvt_btable_destroy(c.bt);
	kvt_t0_destroy(c.t0);
	kvt_dev_destroy(c.dev);
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

/* Acknowledged session turns, not deleted since: id -> the newest acknowledged history length. */
struct sess_ack {
	char id[24];       /* session id */
	uint32_t n_tokens; /* acknowledged history */
	uint32_t seen;     /* the row's history at this trial's check (0: no row) */
};

struct sset {
	struct sess_ack *v; /* the sessions */
	size_t n, cap;
};

static struct sess_ack *sset_find(struct sset *s, const char *id)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i].id, id) == 0)
			return &s->v[i];
	return NULL;
}

static void sset_ack(struct sset *s, const char *id, uint32_t n)
{
	struct sess_ack *a = sset_find(s, id);
	if (!a) {
		if (s->n == s->cap) {
			s->cap = s->cap ? 2 * s->cap : 64;
			s->v = realloc(s->v, s->cap * sizeof(*s->v));
			KVT_ASSERT(s->v);
		}
		a = &s->v[s->n++];
		memset(a, 0, sizeof(*a));
		snprintf(a->id, sizeof(a->id), "%.23s", id);
	}
	if (n > a->n_tokens)
		a->n_tokens = n;
}

static void sset_del(struct sset *s, const char *id)
{
	struct sess_ack *a = sset_find(s, id);
	if (a)
		*a = s->v[--s->n];
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
	enum { CHUNK = 64, CAP = 4096 };
	static kvt_t2_loc locs[CHUNK];
	static uint8_t want_hash[CHUNK][32];
	static kvt_t2_block_meta metas[CHUNK];
	static uint8_t bufs[CHUNK][CAP], want[CAP];
	void *ptrs[CHUNK];
	int res[CHUNK];
	const uint32_t nb = (uint32_t)block_bytes();
	KVT_ASSERT(nb <= CAP);
	for (int i = 0; i < CHUNK; i++)
		ptrs[i] = bufs[i];
	for (size_t base = 0; base < v->n_rows; base += CHUNK) {
		uint32_t n = (uint32_t)(v->n_rows - base < CHUNK ? v->n_rows - base : CHUNK);
		for (uint32_t i = 0; i < n; i++) {
			locs[i] = v->rows[base + i].loc;
			memcpy(want_hash[i], v->rows[base + i].hash, 32);
		}
		kvt_t2_read_batch(t2, n, locs, (const uint8_t(*)[32])want_hash, metas, ptrs, CAP, res);
		for (uint32_t i = 0; i < n; i++) {
			const kvt_db_block_row *row = &v->rows[base + i];
			bool ok = res[i] == KVT_OK && metas[i].raw_bytes == nb && row->raw_bytes == nb &&
				  metas[i].n_tokens == row->n_tokens &&
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

/* The session rows of one check: each whole, the acknowledged ones present. */
struct sess_check {
	struct sset *acked;  /* acknowledged turns */
	uint8_t root[32];    /* the chain root */
	uint64_t n_rows;     /* session rows */
	uint64_t n_half;     /* rows not a whole turn of their session (bad tokens, boundary, last_hash) */
};

static int check_session(void *ctx, const kvt_db_session *row)
{
	struct sess_check *k = ctx;
	uint64_t key;
	bool retained;
	int32_t toks[MAX_TOKENS + 16];
	uint8_t chain[MAX_BLOCKS][32];
	uint32_t n_chain = 0;
	k->n_rows++;
	bool ok = sess_parse(row->id, &key, &retained) && row->n_tokens <= MAX_TOKENS + 16 &&
		  sess_turns_of(key, row->n_tokens) >= 0;
	for (uint32_t i = 0; ok && i < row->n_tokens; i++)
		ok = row->tokens[i] == sess_token(key, i);
	if (ok) {
		memcpy(toks, row->tokens, row->n_tokens * sizeof(int32_t));
		ok = kvt_hash_chain(k->root, toks, row->n_tokens, BLOCK_TOKENS, chain, MAX_BLOCKS, &n_chain) == KVT_OK &&
		     memcmp(row->last_hash, n_chain ? chain[n_chain - 1] : k->root, 32) == 0;
	}
	if (!ok) {
		fprintf(stderr, "session row %s (%u tokens) is not a whole turn of its session\n", row->id,
			row->n_tokens);
		k->n_half++;
	}
	struct sess_ack *a = sset_find(k->acked, row->id);
	if (a)
		a->seen = row->n_tokens;
	return 0;
}

typedef struct trial_totals {
	uint64_t n_acks, n_killed_busy, n_exited, max_rows, bad_child, n_dels, n_must;
	uint64_t n_sess_acks, n_sess_dels, max_sessions, n_sess_must;
	uint64_t n_evict[KVT_TIER_COUNT], n_persisted; /* the manager's counters, the last reported by each child */
	uint64_t trial_m[KVT_TIER_COUNT + 1];          /* this trial's last "M" line */
	uint64_t n_armed[N_FAULT_POINTS], n_fired[N_FAULT_POINTS]; /* trials that armed / died at each point */
	double t_startup, t_verify, t_all;
	powerloss_stats pl; /* power loss: what the cuts did with unsynced writes */
} trial_totals;

/* Reopen dir as the daemon does, recover, and check everything against what was acknowledged. */
static bool verify_trial(const char *dir, const char *mode, int trial, struct hset *must, struct sset *sess,
			 struct verify *v, trial_totals *tt)
{
	kvt_t2_store *t2;
	kvt_db *db;
	bool pl_mode = g_powerloss;
	g_powerloss = false; /* real syscalls, the default VFS */
	int rc = open_all(dir, &t2, &db);
	g_powerloss = pl_mode;
	CHECKF(rc == KVT_OK, "%s trial %d: reopen failed: %s", mode, trial, kvt_strerror(rc));
	if (rc)
		return false;
	kvt_btable *bt = NULL;
	tm_fx_recovery fr = { 0 };
	CHECK(kvt_btable_create(BLOCK_TOKENS, 0, &bt) == KVT_OK);
	rc = tm_fx_recover(db, t2, bt, &fr);
	CHECKF(rc == KVT_OK, "%s trial %d: start-up recovery failed: %s", mode, trial, kvt_strerror(rc));
	kvt_btable_destroy(bt);
	if (rc) {
		kvt_db_close(db);
		kvt_t2_close(t2);
		return false;
	}
	CHECKF(fr.n_skipped == 0, "%s trial %d: %llu rows share or misplace extents", mode, trial,
	       (unsigned long long)fr.n_skipped);
	CHECKF(fr.n_lost == 0, "%s trial %d: %llu rows point past the file's intact bytes", mode, trial,
	       (unsigned long long)fr.n_lost);
	v->n_rows = 0;
	uint64_t bad_before = v->n_bad;
	CHECK(kvt_db_for_each_block(db, 0, collect_row, v) == KVT_OK);
	verify_rows(v, t2);
	CHECKF(v->n_bad == bad_before, "%s trial %d: %llu rows point at bad bytes", mode, trial,
	       (unsigned long long)(v->n_bad - bad_before));
	if (v->n_rows)
		qsort(v->hashes, v->n_rows, 32, cmp32);
	uint64_t missing = 0;
	for (size_t i = 0; i < must->n; i++)
		if (!v->n_rows || !bsearch(must->v[i], v->hashes, v->n_rows, 32, cmp32)) {
			char hex[65];
			kvt_hash_hex(must->v[i], hex);
			fprintf(stderr, "%s trial %d: acknowledged block %s has no row\n", mode, trial, hex);
			missing++;
		}
	CHECKF(missing == 0, "%s trial %d: %llu acknowledged blocks missing", mode, trial,
	       (unsigned long long)missing);
	if (v->n_rows > tt->max_rows)
		tt->max_rows = v->n_rows;

	struct sess_check k = { .acked = sess };
	chain_root(k.root);
	for (size_t i = 0; i < sess->n; i++)
		sess->v[i].seen = 0;
	CHECK(kvt_db_list_sessions(db, NULL, check_session, &k) == KVT_OK);
	CHECKF(k.n_half == 0, "%s trial %d: %llu session rows half-applied", mode, trial,
	       (unsigned long long)k.n_half);
	uint64_t lost = 0;
	for (size_t i = 0; i < sess->n; i++)
		if (sess->v[i].seen < sess->v[i].n_tokens) {
			fprintf(stderr, "%s trial %d: session %s acknowledged at %u tokens, the index has %u\n", mode,
				trial, sess->v[i].id, sess->v[i].n_tokens, sess->v[i].seen);
			lost++;
		}
	CHECKF(lost == 0, "%s trial %d: %llu acknowledged session turns lost", mode, trial, (unsigned long long)lost);
	if (k.n_rows > tt->max_sessions)
		tt->max_sessions = k.n_rows;
	kvt_db_close(db);
	kvt_t2_close(t2);
	return true;
}

/* Take one line of the child's: what it acknowledged, or is about to delete. */
static void take_line(const char *line, const char *mode, int trial, struct hset *must, struct sset *sess,
		      trial_totals *tt)
{
	uint8_t h[32];
	char id[64];
	unsigned n;
	size_t len = strlen(line);
	if ((line[0] == 'A' || line[0] == 'd') && len == 67 && parse_hex(line + 2, h)) {
		if (line[0] == 'A') {
			hset_add(must, h);
			tt->n_acks++;
		} else {
			hset_del(must, h);
			tt->n_dels++;
		}
	} else if (line[0] == 'S' && sscanf(line, "S %23s %u", id, &n) == 2) {
		sset_ack(sess, id, n);
		tt->n_sess_acks++;
	} else if (line[0] == 'x' && sscanf(line, "x %23s", id) == 1) {
		sset_del(sess, id);
		tt->n_sess_dels++;
	} else if (line[0] == 'F' && sscanf(line, "F %63s", id) == 1) {
		for (size_t p = 0; p < N_FAULT_POINTS; p++)
			tt->n_fired[p] += strcmp(id, FAULT_POINTS[p]) == 0;
	} else if (line[0] == 'M' && sscanf(line, "M %llu %llu %llu %llu", (unsigned long long *)&tt->trial_m[0],
					    (unsigned long long *)&tt->trial_m[1], (unsigned long long *)&tt->trial_m[2],
					    (unsigned long long *)&tt->trial_m[3]) == 4) {
		/* summed at the trial's end */
	} else if (strcmp(line, "R\n") != 0) {
		CHECKF(0, "%s trial %d: garbled line from the child: %s", mode, trial, line);
	}
}

/* The parent's end of the pipe: lines as they come, each handed to take_line. */
struct pipe_lines {
	int fd;             /* read end */
	char buf[8192];     /* a partial line carried between reads */
	size_t n;           /* bytes in buf */
	const char *mode;   /* for take_line */
	int trial;
	struct hset *must;
	struct sset *sess;
	trial_totals *tt;
};

/*
 * Read and take lines until EOF (true), or until deadline (kvt_now_s; < 0:
 * none), or after the first line when first (false).
 */
static bool pipe_pump(struct pipe_lines *p, double deadline, bool first)
{
	for (;;) {
		char *nl;
		while ((nl = memchr(p->buf, '\n', p->n))) {
			char line[200];
			size_t len = (size_t)(nl - p->buf) + 1;
			snprintf(line, sizeof(line), "%.*s", (int)len, p->buf);
			memmove(p->buf, nl + 1, p->n - len);
			p->n -= len;
			take_line(line, p->mode, p->trial, p->must, p->sess, p->tt);
			if (first)
				return false;
		}
		int wait_ms = -1;
		if (deadline >= 0) {
			double left = deadline - kvt_now_s();
			if (left <= 0)
				return false;
			wait_ms = (int)(left * 1e3) + 1;
		}
		struct pollfd pfd = { .fd = p->fd, .events = POLLIN };
		int pr = poll(&pfd, 1, wait_ms);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr == 0)
			return false;
		ssize_t r = read(p->fd, p->buf + p->n, sizeof(p->buf) - p->n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return true;
		p->n += (size_t)r;
	}
}

/* n_trials crash trials on dir (kill -9, or a power cut when g_powerloss); counters in *tt. */
static void run_trials(const char *dir, int n_trials, uint64_t seed0, trial_totals *tt)
{
	struct hset must = { 0 };
	struct sset sess = { 0 };
	struct verify v = { 0 };
	check_rng r = { seed0 };
	const char *mode = g_powerloss ? "power loss" : "kill -9";
	double t0 = kvt_now_s();

	for (int trial = 0; trial < n_trials; trial++) {
		int fds[2];
		if (pipe(fds) != 0)
			return;
		unsigned long long seed = check_rng_u64(&r);
		/* one trial in three of those timed from the recovery arms a fault point */
		int point = trial % 4 != 0 && check_rng_u64(&r) % 3 == 0 ? (int)(check_rng_u64(&r) % N_FAULT_POINTS) : -1;
		uint64_t nth = 1 + check_rng_u64(&r) % 2;
		if (point >= 0)
			tt->n_armed[point]++;
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
			_exit(child_main(dir, seed, point >= 0 ? FAULT_POINTS[point] : NULL, nth));
		}
		close(fds[1]);
		struct pipe_lines pl_in = { .fd = fds[0], .mode = mode, .trial = trial, .must = &must, .sess = &sess, .tt = tt };
		/*
		 * One trial in four is killed 0..60 ms after the fork (start-up and
		 * recovery included); the others 0..40 ms after the child reports it
		 * has recovered (turns, commits, evictions, deletes; up to 200 ms
		 * when a fault point is armed, 600 ms for the journal's rewrite, to
		 * give it time to be reached: such a trial ends as soon as the child
		 * dies there), so slow builds (sanitizers) still crash mid-write.
		 */
		if (trial % 4 != 0) {
			pipe_pump(&pl_in, -1.0, true);
			tt->t_startup += kvt_now_s() - t_fork;
		}
		/* a rewrite of the journal comes once it has doubled since the child opened it: a dozen turns or so */
		bool rare = point >= 0 && strstr(FAULT_POINTS[point], "rewrite");
		long us = (long)(check_rng_u64(&r) % (trial % 4 == 0 ? 60000 : rare ? 600000 : point >= 0 ? 200000 : 40000));
		pipe_pump(&pl_in, kvt_now_s() + 1e-6 * (double)us, false);
		kill(pid, SIGKILL);
		int st = 0;
		pipe_pump(&pl_in, -1.0, false); /* every line the child managed to write before it died */
		close(fds[0]);
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			tt->n_evict[t] += tt->trial_m[t];
		tt->n_persisted += tt->trial_m[KVT_TIER_COUNT];
		memset(tt->trial_m, 0, sizeof(tt->trial_m));
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

		double t_v0 = kvt_now_s();
		if (!verify_trial(dir, mode, trial, &must, &sess, &v, tt))
			break;
		tt->t_verify += kvt_now_s() - t_v0;
	}
	tt->n_must = must.n;
	tt->n_sess_must = sess.n;
	tt->t_all = kvt_now_s() - t0;
	free(must.v);
	free(sess.v);
	free(v.rows);
	free(v.hashes);
}

static void report(const char *mode, int n_trials, const trial_totals *tt)
{
	printf("crash (%s): child start-up to recovered %.1f ms (mean of the waited-for trials), parent verification "
	       "%.1f ms per trial\n",
	       mode, n_trials > 1 ? 1e3 * tt->t_startup / (n_trials - (n_trials + 3) / 4) : 0.0,
	       1e3 * tt->t_verify / n_trials);
	printf("crash (%s): %d trials in %.1f s: %llu killed while running, %llu finished first; %llu retained blocks "
	       "acknowledged, %llu released, up to %llu rows, %llu must-have blocks at the end\n",
	       mode, n_trials, tt->t_all, (unsigned long long)tt->n_killed_busy, (unsigned long long)tt->n_exited,
	       (unsigned long long)tt->n_acks, (unsigned long long)tt->n_dels, (unsigned long long)tt->max_rows,
	       (unsigned long long)tt->n_must);
	printf("crash (%s): %llu session turns acknowledged, %llu sessions deleted, up to %llu session rows, %llu "
	       "acknowledged sessions at the end\n",
	       mode, (unsigned long long)tt->n_sess_acks, (unsigned long long)tt->n_sess_dels,
	       (unsigned long long)tt->max_sessions, (unsigned long long)tt->n_sess_must);
	printf("crash (%s): the children's managers: %llu blocks persisted; evictions T0 %llu, T1 %llu, T2 %llu\n", mode,
	       (unsigned long long)tt->n_persisted, (unsigned long long)tt->n_evict[KVT_TIER_HBM],
	       (unsigned long long)tt->n_evict[KVT_TIER_HOST], (unsigned long long)tt->n_evict[KVT_TIER_NVME]);
	printf("crash (%s): fault points (trials armed / died there):", mode);
	for (size_t p = 0; p < N_FAULT_POINTS; p++)
		printf("%s %s %llu/%llu", p ? "," : "", FAULT_POINTS[p], (unsigned long long)tt->n_armed[p],
		       (unsigned long long)tt->n_fired[p]);
	printf("\n");
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

/* Create the data directory's files (synced) before the first trial: creation is not what is tested. */
static void create_dir(const char *dir)
{
	kvt_t2_store *t2;
	kvt_db *db;
	CHECK(open_all(dir, &t2, &db) == KVT_OK);
	kvt_db_close(db);
	kvt_t2_close(t2);
}

int main(int argc, char **argv)
{
	if (argc >= 4 && strcmp(argv[1], "--child") == 0) {
		g_powerloss = strcmp(argv[argc - 1], "powerloss") == 0;
		bool armed = argc - g_powerloss >= 6;
		return child_main(argv[2], strtoull(argv[3], NULL, 10), armed ? argv[4] : NULL,
				  armed ? strtoull(argv[5], NULL, 10) : 0);
	}
	int probe_rc = test_dev_probe("test_crash_index");
	if (probe_rc >= 0)
		return probe_rc;

	char dir[] = "/tmp/kvt_crash_XXXXXX";
	int n_trials = env_trials("KVT_CRASH_TRIALS", 200);
	if (n_trials == 0)
		n_trials = 200;
	int n_pl = env_trials("KVT_POWERLOSS_TRIALS", 100);
	const char *env_seed = getenv("KVT_CRASH_SEED");
	uint64_t seed = env_seed && *env_seed ? strtoull(env_seed, NULL, 0) : 0xC0FFEEull;
	printf("crash: seed %#llx (KVT_CRASH_SEED)\n", (unsigned long long)seed);
	kvt_log_set_level(KVT_LOG_ERROR); /* the recoveries' warnings (a journal record replayed, a superblock copy
					     rewritten) are expected after every other cut; the checks judge */
	if (!mkdtemp(dir))
		return check_skip("test_crash_index", "mkdtemp failed");

	trial_totals tt;
	memset(&tt, 0, sizeof(tt));
	create_dir(dir);
	run_trials(dir, n_trials, seed, &tt);
	CHECK_EQ_INT(tt.bad_child, 0);
	CHECK(tt.n_acks > 0 && tt.n_sess_acks > 0);
	report("kill -9", n_trials, &tt);
	remove_dir(dir);

	if (n_pl > 0) {
		char pdir[] = "/tmp/kvt_powerloss_XXXXXX";
		if (!mkdtemp(pdir))
			return check_skip("test_crash_index", "mkdtemp failed");
		create_dir(pdir);
		memset(&tt, 0, sizeof(tt));
		g_powerloss = true;
		run_trials(pdir, n_pl, seed ^ 0x1E2E3Eull, &tt);
		g_powerloss = false;
		CHECK_EQ_INT(tt.bad_child, 0);
		CHECK(tt.n_acks > 0 && tt.n_sess_acks > 0);
		CHECKF(tt.pl.n_dropped > 0 && tt.pl.n_torn > 0 && tt.pl.n_applied > 0,
		       "the cuts never dropped, tore or applied an unsynced write");
		CHECKF(tt.pl.n_by_file[PL_SJ] > 0, "the cuts never found an unsynced write of the session journal");
		report("power loss", n_pl, &tt);
		printf("crash (power loss): %llu unsynced writes at the cuts: %llu dropped, %llu applied, %llu torn; by "
		       "file: T2 %llu, index %llu, WAL %llu, session journal %llu, its rewrite %llu\n",
		       (unsigned long long)tt.pl.n_entries, (unsigned long long)tt.pl.n_dropped,
		       (unsigned long long)tt.pl.n_applied, (unsigned long long)tt.pl.n_torn,
		       (unsigned long long)tt.pl.n_by_file[PL_T2], (unsigned long long)tt.pl.n_by_file[PL_DB],
		       (unsigned long long)tt.pl.n_by_file[PL_WAL], (unsigned long long)tt.pl.n_by_file[PL_SJ],
		       (unsigned long long)tt.pl.n_by_file[PL_SJ_TMP]);
		remove_dir(pdir);
	}
	return check_done("test_crash_index");
}
