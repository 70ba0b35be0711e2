/* ctest-labels: unit integration */
/*
 * tests/test_sessions.c — the sessions (engine/serve/sessions.c) and the
 * per-request end of turn, on a synthetic Llama through the whole stack:
 *
 *  - a resume's tier figures are its own: two sessions resumed from NVMe at
 *    the same moment (each read slowed down, so the two overlap) report
 *    exactly what each reports when resumed alone — bytes and tokens by tier;
 *    figures taken as differences of the manager's global counters (the old
 *    way) count the other resume's reads too;
 *  - end of turn marks that request's blocks due, not everyone's: while a
 *    long request is still decoding, a short one ends; only the short one's
 *    blocks are made durable, the long one's when it ends.
 */
#include "check.h"
#include "sched_rig.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#define CTX 4096 /* the model's context: room for a request that decodes for seconds */

static char dir[256], model_path[300], t2_path[300], db_path[300];

/* The store's reads, each slowed by 3 ms (the thread-pool path: io_uring is refused so every read is a pread). */
static ssize_t slow_pread(void *ctx, int fd, void *buf, size_t n, off_t off)
{
	(void)ctx;
	struct timespec ts = { 0, 3 * 1000 * 1000 };
	nanosleep(&ts, NULL);
	return pread(fd, buf, n, off);
}
static int no_uring(void *ctx)
{
	(void)ctx;
	return -EPERM;
}
static const kvt_t2_io_ops slow_io = { .pread = slow_pread, .uring_setup = no_uring };

typedef struct rig {
	kvt_dev *dev;
	kvt_model *m;
	kvt_tok *tok;
	kvt_stack st;
} rig;

static int rig_open(rig *r, bool reset, bool slow)
{
	memset(r, 0, sizeof(*r));
	if (sched_rig_load_ctx(model_path, 2, CTX, &r->dev, &r->m, &r->tok))
		return 1;
	kvt_stack_config c;
	sched_rig_config(&c, r->dev, r->m, r->tok, db_path, t2_path, CTX / BT + 64, 64);
	c.t2.reset = reset;
	c.t2.io = slow ? &slow_io : NULL;
	c.sched.max_running = 8;
	c.sched.prefill_chunk = 64;
	return kvt_stack_open(&c, &r->st) ? 1 : 0;
}

static void rig_close(rig *r) { sched_rig_free(&r->st, r->dev, r->m, r->tok); }

static void req_init(kvt_sched_req *q, const int32_t *p, uint32_t n, uint32_t max_tokens, const char *tenant,
		     const char *session)
{
	memset(q, 0, sizeof(*q));
	q->prompt = p;
	q->n_prompt = n;
	q->max_tokens = max_tokens;
	q->ignore_eos = true;
	snprintf(q->tenant, sizeof(q->tenant), "%s", tenant);
	snprintf(q->session_id, sizeof(q->session_id), "%s", session ? session : "");
}

enum { N_HIST = 20 * BT + 5, GEN = 3 };
static const char *const tenants[2] = { "ann", "bob" };
static const char *const ids[2] = { "conv-a", "conv-b" };

typedef struct resume_arg {
	kvt_sched *s;
	int who;
	pthread_barrier_t *go;
	kvt_resume_report rep;
	int rc;
} resume_arg;

static void *resume_main(void *arg)
{
	resume_arg *a = arg;
	pthread_barrier_wait(a->go);
	a->rc = kvt_sched_session_resume(a->s, tenants[a->who], ids[a->who], NULL, NULL, &a->rep);
	return NULL;
}

static void check_same(const kvt_resume_report *together, const kvt_resume_report *alone, const char *who)
{
	printf("  %s: alone %llu bytes from nvme (%u tokens); together %llu bytes (%u tokens), %.3f s\n", who,
	       (unsigned long long)alone->bytes_from[KVT_TIER_NVME], alone->tokens_from[KVT_TIER_NVME],
	       (unsigned long long)together->bytes_from[KVT_TIER_NVME], together->tokens_from[KVT_TIER_NVME],
	       together->seconds);
	for (int t = 0; t < KVT_TM_N_TIERS; t++) {
		CHECK_EQ_INT(together->bytes_from[t], alone->bytes_from[t]);
		CHECK_EQ_INT(together->tokens_from[t], alone->tokens_from[t]);
	}
	CHECK_EQ_INT(together->tokens_missing, alone->tokens_missing);
}

static void test_resume_figures(void)
{
	rig r;
	static int32_t hist[2][N_HIST + GEN];
	kvt_sched_req q;
	sched_result res;

	/* two conversations, one turn each, persisted (close flushes every block to NVMe) */
	CHECK(rig_open(&r, true, false) == 0);
	for (int i = 0; i < 2; i++) {
		sched_make_prompt(hist[i], N_HIST, 700 + i);
		req_init(&q, hist[i], N_HIST, GEN, tenants[i], ids[i]);
		kvt_sched_handle *h;
		CHECK(kvt_sched_submit(r.st.sched, &q, &h) == KVT_OK);
		CHECK(sched_collect(h, &res) == KVT_OK);
	}
	CHECK(kvt_sched_drain(r.st.sched, 5.0) == 0);
	rig_close(&r);

	/* after a restart, each resumed alone: the reference figures */
	kvt_resume_report alone[2];
	CHECK(rig_open(&r, false, true) == 0);
	for (int i = 0; i < 2; i++) {
		CHECK(kvt_sched_session_resume(r.st.sched, tenants[i], ids[i], NULL, NULL, &alone[i]) == KVT_OK);
		CHECK_EQ_INT(alone[i].tokens_from[KVT_TIER_NVME], (N_HIST + GEN) / BT * BT);
		CHECK(alone[i].bytes_from[KVT_TIER_NVME] > 0);
	}
	rig_close(&r);

	/* after another restart, both at once: each still reports only its own reads */
	CHECK(rig_open(&r, false, true) == 0);
	pthread_barrier_t go;
	pthread_barrier_init(&go, NULL, 2);
	resume_arg a[2];
	pthread_t th[2];
	for (int i = 0; i < 2; i++) {
		a[i] = (resume_arg){ .s = r.st.sched, .who = i, .go = &go };
		CHECK(pthread_create(&th[i], NULL, resume_main, &a[i]) == 0);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&go);
	for (int i = 0; i < 2; i++) {
		CHECK_EQ_INT(a[i].rc, KVT_OK);
		check_same(&a[i].rep, &alone[i], ids[i]);
	}
	rig_close(&r);
}

static void test_end_of_turn(void)
{
	enum { N_LONG = 4 * BT, LONG_GEN = CTX - N_LONG, N_SHORT = 2 * BT - 2, SHORT_GEN = 2 };
	static int32_t p_long[N_LONG], p_short[N_SHORT];
	rig r;
	kvt_sched_req q;
	kvt_sched_handle *h_long;
	sched_result res;
	int32_t ids_buf[64];
	uint32_t n = 0;
	int finish = 0;

	CHECK(rig_open(&r, true, false) == 0);
	sched_make_prompt(p_long, N_LONG, 811);
	sched_make_prompt(p_short, N_SHORT, 812);
	req_init(&q, p_long, N_LONG, LONG_GEN, "carol", NULL);
	CHECK(kvt_sched_submit(r.st.sched, &q, &h_long) == KVT_OK);
	/* its prompt is prefilled (and its blocks registered) once it has a token */
	for (int i = 0; i < 100 && !n; i++)
		kvt_sched_next(h_long, ids_buf, 64, &n, &finish, NULL, 0.1);
	CHECK(n > 0 && finish == KVT_FINISH_NONE);

	/* a short request ends while the long one decodes: only its blocks become due */
	req_init(&q, p_short, N_SHORT, SHORT_GEN, "dave", NULL);
	kvt_sched_handle *h_short;
	CHECK(kvt_sched_submit(r.st.sched, &q, &h_short) == KVT_OK);
	CHECK(sched_collect(h_short, &res) == KVT_OK);
	const uint64_t short_blocks = (N_SHORT + SHORT_GEN) / BT;
	kvt_tm_stats st;
	for (int i = 0; i < 300; i++) { /* its blocks durable (the end of turn kicked the maintenance thread) */
		kvt_tm_get_stats(r.st.tm, &st);
		if (st.n_persisted >= short_blocks)
			break;
		usleep(10 * 1000);
	}
	usleep(100 * 1000); /* anything else made due would be persisted by now too */
	kvt_tm_get_stats(r.st.tm, &st);
	kvt_sched_stats ss;
	kvt_sched_get_stats(r.st.sched, &ss);
	printf("  end of turn: %llu blocks persisted after the short turn (its own: %llu), %u request(s) still running\n",
	       (unsigned long long)st.n_persisted, (unsigned long long)short_blocks, ss.running);
	CHECK_EQ_INT(ss.running, 1); /* the long one decodes on (thousands of tokens): its blocks must still be pending */
	CHECK_EQ_INT(st.n_persisted, short_blocks);

	/* the long request ends (cancelled): now its blocks follow, every block registered is durable */
	kvt_sched_cancel(h_long);
	for (int i = 0; i < 100000 && finish == KVT_FINISH_NONE; i++)
		kvt_sched_next(h_long, ids_buf, 64, &n, &finish, NULL, 0.5);
	kvt_sched_release(h_long);
	CHECK_EQ_INT(finish, KVT_FINISH_CANCELLED);
	for (int i = 0; i < 300; i++) {
		kvt_tm_get_stats(r.st.tm, &st);
		if (st.n_persisted >= st.n_registered)
			break;
		usleep(10 * 1000);
	}
	CHECK(st.n_registered >= short_blocks + N_LONG / BT);
	CHECK_EQ_INT(st.n_persisted, st.n_registered);
	rig_close(&r);
}

int main(void)
{
	int probe_rc = test_dev_probe("test_sessions");
	if (probe_rc >= 0)
		return probe_rc;
	snprintf(dir, sizeof(dir), "/tmp/kvt_test_sessions_XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(model_path, sizeof(model_path), "%s/m.gguf", dir);
	snprintf(t2_path, sizeof(t2_path), "%s/kvtier.t2", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);
	CHECK(sched_rig_write_model_ctx(model_path, CTX) == KVT_OK);

	test_resume_figures();
	test_end_of_turn();

	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	return check_done("test_sessions");
}
