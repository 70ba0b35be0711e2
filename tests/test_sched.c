/* ctest-labels: unit integration */
/*
 * tests/test_sched.c — the scheduler on a tiny synthetic Llama, with the
 * real tiering manager, NVMe store and SQLite index in a temporary folder.
 *
 *  - continuous batching: six requests submitted together decode the same
 *    greedy tokens as each run alone (reference kernels: a row's result does
 *    not depend on how many rows share a matmul; so also on the CUDA
 *    backend's emulator, whose GEMM is a reference loop, but not necessarily
 *    on a GPU, where cuBLAS may pick other kernels for other row counts);
 * The device is the CPU's reference, or KVTIER_TEST_DEVICE's (test_dev.h).
 *  - a conversation of 6 turns: each turn's cached_tokens equals the full
 *    blocks of the previous turn's prompt and reply;
 *  - tenants: the same prompt under another tenant gets 0 cached tokens;
 *  - cancel mid-generation ends the request and the scheduler goes on;
 *  - sessions: listed with their history, resumed (report by tier), deleted;
 *  - restart: the stack is closed and reopened; the session's blocks come
 *    back from NVMe and the next turn produces the tokens the uninterrupted
 *    run produced (fp16 tiers);
 *  - bad requests (token out of range, over the context) are refused;
 *  - drain with a request in flight lets it finish;
 *  - device decode: where the backend has graphs, steps of greedy decode
 *    rows run as kvt_model_decode (counted), a request the host sampler must
 *    see (a penalty) keeps its steps on the host, and every request's tokens
 *    equal those of a scheduler with device_decode off.
 */
#include "check.h"
#include "sched_rig.h"
#include "test_dev.h"
#include "gguf.h"
#include "manager.h"
#include "model.h"
#include "scheduler.h"
#include "stack.h"
#include "synth_model.h"
#include "tokenizer.h"

#include <pthread.h>
#include <unistd.h>

#define BT 16

static char dir[256], model_path[300], t2_path[300], db_path[300];
static bool device_decode = true; /* rig_open's c.sched.device_decode */
static uint32_t max_queue = 64;    /* rig_open's c.sched.max_queue */

typedef struct rig {
	kvt_dev *dev;
	kvt_model *m;
	kvt_tok *tok;
	kvt_stack st;
	kvt_t0_pool *t0; /* st's, for short */
	kvt_sched *s;    /* st's */
	uint8_t fp[32];
} rig;

static int rig_open(rig *r, bool reset, uint32_t max_running)
{
	memset(r, 0, sizeof(*r));
	memset(r->fp, 0x5a, 32);
	if (sched_rig_load(model_path, 2, &r->dev, &r->m, &r->tok))
		return 1;
	kvt_stack_config c;
	sched_rig_config(&c, r->dev, r->m, r->tok, db_path, t2_path, 160, 64);
	memcpy(c.model_fp, r->fp, 32);
	c.t2.reset = reset;
	c.sched.max_running = max_running;
	c.sched.prefill_chunk = 48;
	c.sched.device_decode = device_decode;
	c.sched.max_queue = max_queue;
	if (kvt_stack_open(&c, &r->st))
		return 1;
	r->t0 = r->st.t0;
	r->s = r->st.sched;
	return 0;
}

static void rig_close(rig *r)
{
	sched_rig_free(&r->st, r->dev, r->m, r->tok);
}

static void req_init(kvt_sched_req *q, const int32_t *p, uint32_t n, uint32_t max_tokens, const char *tenant,
		     const char *session)
{
	memset(q, 0, sizeof(*q));
	q->prompt = p;
	q->n_prompt = n;
	q->max_tokens = max_tokens;
	q->ignore_eos = true;
	snprintf(q->tenant, sizeof(q->tenant), "%s", tenant ? tenant : "");
	snprintf(q->session_id, sizeof(q->session_id), "%s", session ? session : "");
}

static int run(rig *r, const kvt_sched_req *q, sched_result *res)
{
	kvt_sched_handle *h;
	int rc = kvt_sched_submit(r->s, q, &h);
	if (rc)
		return rc;
	return sched_collect(h, res);
}

static void test_batching(rig *r)
{
	enum { N = 6, GEN = 20 };
	int32_t p[N][80];
	sched_result alone[N], together[N];
	kvt_sched_handle *h[N];
	kvt_sched_req q;
	for (int i = 0; i < N; i++) {
		sched_make_prompt(p[i], 20 + 10 * i, 100 + i);
		req_init(&q, p[i], 20 + 10 * i, GEN, "batch-alone", NULL);
		CHECK(run(r, &q, &alone[i]) == KVT_OK);
		CHECK_EQ_INT(alone[i].n, GEN);
		CHECK_EQ_INT(alone[i].finish, KVT_FINISH_LENGTH);
	}
	for (int i = 0; i < N; i++) {
		req_init(&q, p[i], 20 + 10 * i, GEN, "batch-together", NULL);
		CHECK(kvt_sched_submit(r->s, &q, &h[i]) == KVT_OK);
	}
	for (int i = 0; i < N; i++) {
		CHECK(sched_collect(h[i], &together[i]) == KVT_OK);
		CHECKF(together[i].n == alone[i].n && !memcmp(together[i].out, alone[i].out, GEN * 4),
		       "request %d: batched tokens differ from the request run alone", i);
		CHECK_EQ_INT(together[i].u.cached_tokens, 0); /* another tenant: nothing shared */
	}
}

/* Six turns; returns the history after the last turn in hist (length *n_hist). */
static void test_conversation(rig *r, const char *session, int32_t *hist, uint32_t *n_hist)
{
	uint32_t n = 0, prev_full = 0;
	for (int turn = 0; turn < 6; turn++) {
		sched_make_prompt(hist + n, 13 + turn, 7 + turn); /* the user's new message */
		n += 13 + turn;
		kvt_sched_req q;
		sched_result res;
		req_init(&q, hist, n, 9 + turn, "alice", session);
		CHECK(run(r, &q, &res) == KVT_OK);
		CHECKF(res.u.cached_tokens == prev_full, "turn %d: %u cached tokens, expected %u (full blocks of the previous turn)",
		       turn, res.u.cached_tokens, prev_full);
		CHECK_EQ_INT(res.u.prompt_tokens, n);
		memcpy(hist + n, res.out, res.n * sizeof(int32_t));
		n += res.n;
		prev_full = n / BT * BT;
	}
	*n_hist = n;
}

static void test_tenants(rig *r, const int32_t *hist, uint32_t n)
{
	kvt_sched_req q;
	sched_result res;
	req_init(&q, hist, n, 4, "bob", NULL);
	CHECK(run(r, &q, &res) == KVT_OK);
	CHECK_EQ_INT(res.u.cached_tokens, 0);
	req_init(&q, hist, n, 4, "alice", NULL);
	CHECK(run(r, &q, &res) == KVT_OK);
	CHECK_EQ_INT(res.u.cached_tokens, (n - 1) / BT * BT);
}

static void test_cancel_and_errors(rig *r)
{
	int32_t p[40];
	sched_make_prompt(p, 40, 99);
	kvt_sched_req q;
	kvt_sched_handle *h;
	req_init(&q, p, 40, 400, "carol", NULL);
	CHECK(kvt_sched_submit(r->s, &q, &h) == KVT_OK);
	int32_t buf[512];
	uint32_t n = 0, got = 0;
	int fin = 0;
	while (got < 3 && !fin) {
		kvt_sched_next(h, buf, 512, &n, &fin, NULL, 1.0);
		got += n;
	}
	kvt_sched_cancel(h);
	kvt_sched_usage u;
	for (int i = 0; i < 200 && !fin; i++)
		kvt_sched_next(h, buf, 512, &n, &fin, &u, 0.1);
	CHECK_EQ_INT(fin, KVT_FINISH_CANCELLED);
	kvt_sched_release(h);

	/* a released handle mid-run is freed by the scheduler */
	CHECK(kvt_sched_submit(r->s, &q, &h) == KVT_OK);
	kvt_sched_release(h);

	p[5] = (int32_t)kvt_sched_n_vocab(r->s);
	req_init(&q, p, 40, 4, "carol", NULL);
	CHECK(kvt_sched_submit(r->s, &q, &h) == KVT_EINVAL);
	p[5] = 7;
	req_init(&q, p, 40, kvt_sched_max_ctx(r->s), "carol", NULL);
	CHECK(kvt_sched_submit(r->s, &q, &h) == KVT_EINVAL);
	req_init(&q, p, 40, 4, "../etc", NULL);
	CHECK(kvt_sched_submit(r->s, &q, &h) == KVT_EINVAL);
	/* still serving */
	sched_result res;
	req_init(&q, p, 40, 4, "carol", NULL);
	CHECK(run(r, &q, &res) == KVT_OK && res.n == 4);
}

static void test_sessions(rig *r, const char *session, uint32_t n_hist)
{
	kvt_session_info *info = NULL;
	size_t n = 0;
	CHECK(kvt_sched_sessions(r->s, "alice", &info, &n) == KVT_OK);
	CHECK_EQ_INT(n, 1);
	if (n == 1) {
		CHECK(!strcmp(info[0].id, session));
		CHECK_EQ_INT(info[0].n_tokens, n_hist);
		CHECK_EQ_INT(info[0].n_blocks, n_hist / BT);
		CHECK_EQ_INT(info[0].blocks_missing, 0);
	}
	free(info);
	CHECK(kvt_sched_sessions(r->s, "bob", &info, &n) == KVT_OK && n == 0);
	free(info);
	kvt_resume_report rep;
	CHECK(kvt_sched_session_resume(r->s, "bob", session, NULL, NULL, &rep) == KVT_ENOTFOUND);
	CHECK(kvt_sched_session_delete(r->s, "alice", "nope") == KVT_ENOTFOUND);
}

/*
 * Four greedy requests and one with a repetition penalty, submitted
 * together, then one greedy request alone; out[0..5] receive their tokens.
 * *dev_steps: the device steps the mix and the greedy one alone took;
 * *pen_dev: those of the penalised request run alone.
 */
static void device_decode_run(bool on, sched_result *out, uint64_t *dev_steps, uint64_t *pen_dev)
{
	enum { N = 5, GEN = 24 };
	static int32_t p[N][64];
	device_decode = on;
	rig r;
	CHECK(rig_open(&r, true, 8) == KVT_OK);
	kvt_sched_req q;
	kvt_sched_handle *h[N];
	kvt_sched_stats st0, st1, st2;
	kvt_sched_get_stats(r.s, &st0);
	for (int i = 0; i < N; i++) {
		sched_make_prompt(p[i], 9 + 7 * i, 700 + i);
		req_init(&q, p[i], 9 + 7 * i, GEN, "dd", NULL);
		if (i == N - 1)
			q.sample.repetition_penalty = 1.3f;
		CHECK(kvt_sched_submit(r.s, &q, &h[i]) == KVT_OK);
	}
	for (int i = 0; i < N; i++) {
		CHECK(sched_collect(h[i], &out[i]) == KVT_OK);
		CHECK_EQ_INT(out[i].n, GEN);
	}
	req_init(&q, p[0], 9, GEN, "dd-alone", NULL);
	CHECK(run(&r, &q, &out[N]) == KVT_OK);
	kvt_sched_get_stats(r.s, &st1);
	req_init(&q, p[N - 1], 9 + 7 * (N - 1), GEN, "dd-pen", NULL);
	q.sample.repetition_penalty = 1.3f;
	sched_result pen;
	CHECK(run(&r, &q, &pen) == KVT_OK);
	kvt_sched_get_stats(r.s, &st2);
	CHECKF(pen.n == out[N - 1].n && !memcmp(pen.out, out[N - 1].out, GEN * 4),
	       "the penalised request's tokens differ alone and in the mix");
	*dev_steps = st1.device_steps - st0.device_steps;
	*pen_dev = st2.device_steps - st1.device_steps;
	printf("  device_decode %s: %llu of %llu steps on the device; penalised alone %llu of %llu\n", on ? "on" : "off",
	       (unsigned long long)*dev_steps, (unsigned long long)(st1.steps - st0.steps),
	       (unsigned long long)*pen_dev, (unsigned long long)(st2.steps - st1.steps));
	CHECK(kvt_sched_drain(r.s, 5.0) == 0);
	rig_close(&r);
}

static void test_device_decode(void)
{
	sched_result off[6], on[6];
	uint64_t off_steps, off_pen, on_steps, on_pen;
	device_decode_run(false, off, &off_steps, &off_pen);
	device_decode_run(true, on, &on_steps, &on_pen);
	device_decode = true;
	CHECK_EQ_INT(off_steps, 0);
	CHECK_EQ_INT(off_pen, 0);
	CHECK_EQ_INT(on_pen, 0); /* the host sampler must see every token of a penalised request */
	/* the probe device's kind is what the rigs ran on */
	kvt_dev *d;
	kvt_dev_config dc = { .kind = test_dev_kind(), .use_ref = true, .n_threads = 1 };
	CHECK(kvt_dev_create(&dc, &d) == KVT_OK);
	bool graphs = kvt_dev_graphs_supported(d);
	kvt_dev_destroy(d);
	if (graphs) /* the greedy-only steps: at least the alone request's 23 decode steps */
		CHECKF(on_steps >= 23, "only %llu steps ran on the device", (unsigned long long)on_steps);
	else
		CHECK_EQ_INT(on_steps, 0);
	for (int i = 0; i < 6; i++)
		CHECKF(on[i].n == off[i].n && !memcmp(on[i].out, off[i].out, on[i].n * 4),
		       "request %d: tokens with device decode differ from the host path", i);
	CHECKF(!memcmp(on[5].out, on[0].out, 24 * 4), "the greedy request alone and in the mix differ");
}

static void on_progress(void *user, uint32_t done, uint32_t total)
{
	uint32_t *last = user;
	CHECK(done <= total);
	*last = done;
}
/*
 * max_queue bounds the requests waiting beyond the places max_running has
 * free ([server] max_queue): 0 takes a request only into a free place, and
 * the place of a request that ended takes one again as soon as its client
 * has the end.
 */
static void test_queue_limit(void)
{
	for (uint32_t mq = 0; mq < 2; mq++) {
		rig r;
		max_queue = mq;
		CHECKF(rig_open(&r, true, 2) == KVT_OK, "max_queue %u: the scheduler starts", mq);
		max_queue = 64;
		if (!r.s) {
			rig_close(&r);
			continue;
		}
		int32_t p[40];
		sched_make_prompt(p, 40, 31);
		kvt_sched_req q;
		req_init(&q, p, 40, 300, "queue", NULL);
		kvt_sched_handle *h[3] = { 0 }, *extra = NULL;
		sched_result res;
		for (uint32_t i = 0; i < 2 + mq; i++)
			CHECKF(kvt_sched_submit(r.s, &q, &h[i]) == KVT_OK, "max_queue %u: request %u taken", mq, i);
		int rc = kvt_sched_submit(r.s, &q, &extra);
		CHECKF(rc == KVT_EFULL, "max_queue %u: request %u refused (rc %d)", mq, 2 + mq, rc);
		if (rc == KVT_OK) {
			kvt_sched_cancel(extra);
			CHECK(sched_collect(extra, &res) == KVT_OK);
		}
		if (h[0]) {
			kvt_sched_cancel(h[0]);
			CHECK(sched_collect(h[0], &res) == KVT_OK);
		}
		/* at once: the client has the end, so the place is free (before the scheduler prunes the handle) */
		rc = kvt_sched_submit(r.s, &q, &extra);
		CHECKF(rc == KVT_OK, "max_queue %u: the place of a request that ended takes one at once (rc %d)", mq, rc);
		if (rc == KVT_OK) {
			kvt_sched_cancel(extra);
			CHECK(sched_collect(extra, &res) == KVT_OK);
		}
		for (uint32_t i = 1; i < 2 + mq; i++) {
			if (!h[i])
				continue;
			kvt_sched_cancel(h[i]);
			CHECK(sched_collect(h[i], &res) == KVT_OK);
		}
		rig_close(&r);
	}
}

int main(void)
{
	int probe_rc = test_dev_probe("test_sched");
	if (probe_rc >= 0)
		return probe_rc;
	snprintf(dir, sizeof(dir), "/tmp/kvt_test_sched_XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(model_path, sizeof(model_path), "%s/m.gguf", dir);
	snprintf(t2_path, sizeof(t2_path), "%s/kvtier.t2", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);
	CHECK(sched_rig_write_model(model_path) == KVT_OK);

	rig r;
	static int32_t hist[512], turn[512];
	uint32_t n_hist = 0;
	CHECK(rig_open(&r, true, 8) == KVT_OK);
	printf("device: %s\n", kvt_dev_name(r.dev));
	CHECK_EQ_INT(kvt_t0_n_free(r.t0), kvt_t0_n_slots(r.t0)); /* the start-up calibration gave its blocks back */
	test_batching(&r);
	test_conversation(&r, "conv-1", hist, &n_hist);
	test_tenants(&r, hist, n_hist);
	test_cancel_and_errors(&r);
	test_sessions(&r, "conv-1", n_hist);

	/* the next turn, uninterrupted: its tokens are the reference for after the restart */
	sched_make_prompt(hist + n_hist, 11, 555);
	uint32_t n_next = n_hist + 11;
	kvt_sched_req q;
	sched_result ref, again;
	req_init(&q, hist, n_next, 12, "alice", NULL);
	CHECK(run(&r, &q, &ref) == KVT_OK);
	CHECK_EQ_INT(ref.u.cached_tokens, n_hist / BT * BT);
	kvt_sched_stats st;
	kvt_sched_get_stats(r.s, &st);
	CHECK(st.requests >= 20 && st.cached_tokens > 0 && st.sessions == 1);
	CHECK(st.ttft_p50_s > 0 && st.ttft_p99_s >= st.ttft_p50_s);
	CHECK(kvt_sched_drain(r.s, 5.0) == 0);
	rig_close(&r); /* flushes every block to NVMe */

	/* restart: the session comes back from NVMe */
	CHECK(rig_open(&r, false, 8) == KVT_OK);
	kvt_resume_report rep;
	uint32_t last = 0;
	CHECK(kvt_sched_session_resume(r.s, "alice", "conv-1", on_progress, &last, &rep) == KVT_OK);
	CHECK_EQ_INT(rep.n_tokens, n_hist);
	CHECK_EQ_INT(rep.tokens_from[KVT_TIER_NVME], n_hist / BT * BT);
	CHECK_EQ_INT(rep.tokens_missing, n_hist % BT);
	CHECK(rep.bytes_from[KVT_TIER_NVME] > 0);
	/* every block came from NVMe: its bytes count there once, not also under host on their way to T0 */
	CHECK_EQ_INT(rep.bytes_from[KVT_TIER_HOST], 0);
	CHECK_EQ_INT(rep.bytes_from[KVT_TIER_HBM], 0);
	CHECK_EQ_INT(last, n_hist / BT);
	CHECK_EQ_INT(kvt_t0_n_slots(r.t0) - kvt_t0_n_free(r.t0), n_hist / BT); /* exactly the session's blocks in T0 */
	printf("  resume: %u tokens from nvme, %llu bytes, %.3f s; prefill avoided %.3f s\n",
	       rep.tokens_from[KVT_TIER_NVME], (unsigned long long)rep.bytes_from[KVT_TIER_NVME], rep.seconds,
	       rep.prefill_s);
	memcpy(turn, hist, n_next * sizeof(int32_t));
	req_init(&q, turn, n_next, 12, "alice", NULL);
	CHECK(run(&r, &q, &again) == KVT_OK);
	CHECK_EQ_INT(again.u.cached_tokens, n_hist / BT * BT);
	CHECK(again.u.cached_by_tier[KVT_TIER_HBM] == again.u.cached_tokens); /* resumed into T0 first */
	CHECKF(again.n == ref.n && !memcmp(again.out, ref.out, ref.n * 4),
	       "after the restart the turn's tokens differ from the uninterrupted run");
	/* once more, with no explicit resume: the prefix comes up from NVMe while the scheduler runs */
	rig_close(&r);
	CHECK(rig_open(&r, false, 8) == KVT_OK);
	req_init(&q, turn, n_next, 12, "alice", NULL);
	CHECK(run(&r, &q, &again) == KVT_OK);
	CHECK_EQ_INT(again.u.cached_by_tier[KVT_TIER_NVME], n_hist / BT * BT);
	CHECKF(again.n == ref.n && !memcmp(again.out, ref.out, ref.n * 4),
	       "promoted from NVMe on demand, the turn's tokens differ from the uninterrupted run");
	CHECK(kvt_sched_session_delete(r.s, "alice", "conv-1") == KVT_OK);
	kvt_session_info *info;
	size_t n = 0;
	CHECK(kvt_sched_sessions(r.s, NULL, &info, &n) == KVT_OK && n == 0);
	free(info);

	/* drain lets an in-flight request finish */
	kvt_sched_handle *h;
	req_init(&q, hist, 30, 30, "dave", NULL);
	CHECK(kvt_sched_submit(r.s, &q, &h) == KVT_OK);
	CHECK(kvt_sched_drain(r.s, 30.0) == 0);
	sched_result res;
	CHECK(sched_collect(h, &res) == KVT_OK && res.finish == KVT_FINISH_LENGTH && res.n == 30);
	CHECK(kvt_sched_submit(r.s, &q, &h) == KVT_ESTOPPED); /* draining: refused */
	rig_close(&r);

	test_device_decode();
	test_queue_limit();

	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	return check_done("test_sched");
}
