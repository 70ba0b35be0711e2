/*
 * bench/bench_chunks.c — chunk reuse at any position (docs/http-api.md,
 * "Chunk reuse"): its quality against a full prefill, its TTFT, and its
 * reuse rate under a stream of new documents. CPU backend.
 *
 *   bench_chunks quality --model M --set SET.json [--prompts N] [--threads T] [--json OUT]
 *                        [--check L] [--sink N] [--isolated 1] [--r R]   (the rule: check layer, chunk-start
 *                        rows, chunks computed alone instead of in their first context; one r)
 *   bench_chunks speed   --model M --set SET.json [--rounds R] [--threads T] [--json OUT]
 *   bench_chunks steady  --model M --set SET.json [--requests N] [--threads T] [--json OUT]
 *
 * SET.json comes from bench/chunk_set.py (public-domain text). Prompts are
 * the model's chat template around one user turn: the set's instruction,
 * 3-6 documents, a question about one; each document is a marked span.
 *
 * quality (the engine, model.h): per prompt, a full prefill and greedy
 * answer (up to 32 tokens) is the reference. Each document's chunk K/V is
 * taken from the first context it was seen in (the prompt's warm order:
 * the same documents in another order after another question), moved to
 * chunk-relative positions, as the scheduler stores it. Then, for each
 * recompute fraction r in {0, 0.05, 0.15, 0.3, 1}: the instruction prefix
 * prefilled, the documents placed at their new positions, the rest through
 * kvt_model_forward_blend, and the reference answer fed token by token
 * (teacher forcing). Reported per r: greedy answer agreement (every step's
 * argmax is the reference's token, so a greedy decode gives the same
 * answer), first-token top-1 agreement, the mean KL(full || blended) of
 * the first 16 positions' distributions (the whole vocabulary, in double),
 * and the blended prefill's time against the full prefill's.
 *
 * speed (the scheduler, as kvtierd runs it): 4 documents of 500 tokens and a
 * 30-token question. Rounds alternate a full prefill (a fresh tenant: nothing
 * cached) and a marked request whose documents were cached by an earlier
 * request in another order (the chunk blocks in T0/T1), each with a new
 * order; TTFT is the scheduler's (usage.ttft_s). The ratio of the medians is
 * the result (target <= 0.3 at the default r, 0.15).
 *
 * steady: a stream of marked requests of 4 documents, half of them new (never
 * seen), half seen in the last 8 requests, with T0/T1 small enough that
 * chunk blocks are evicted all the time. The reuse rate (found tokens / the
 * seen documents' full-block tokens) per window of 10 requests must not
 * decay as the store fills.
 */
#include "gguf.h"
#include "model.h"
#include "scheduler.h"
#include "stack.h"
#include "tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BT 16
#define MAX_DOCS 64
#define MAX_ANS 32
#define KL_POS 16
#define N_R 5

static const float R_LIST[N_R] = { 0.0f, 0.05f, 0.15f, 0.3f, 1.0f };
static const uint8_t secret[32] = "0123456789abcdef0123456789abcde";

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *m)
{
	fprintf(stderr, "bench_chunks: %s\n", m);
	exit(1);
}

typedef struct toks {
	int32_t *p;
	uint32_t n;
} toks;

typedef struct set {
	char *instruction;
	uint32_t n_docs;
	char *doc[MAX_DOCS];
	uint32_t n_prompts;
	struct {
		uint32_t k, order[8], warm[8], target;
		char *q, *wq;
	} pr[256];
} set;

static void set_load(const char *path, set *s)
{
	json_error_t err;
	json_t *j = json_load_file(path, 0, &err);
	if (!j)
		die("cannot read the set (bench/chunk_set.py OUT.json makes one)");
	memset(s, 0, sizeof(*s));
	s->instruction = strdup(json_string_value(json_object_get(j, "instruction")));
	json_t *docs = json_object_get(j, "docs"), *prs = json_object_get(j, "prompts");
	for (size_t i = 0; i < json_array_size(docs) && i < MAX_DOCS; i++)
		s->doc[s->n_docs++] = strdup(json_string_value(json_object_get(json_array_get(docs, i), "text")));
	for (size_t i = 0; i < json_array_size(prs) && i < 256; i++) {
		json_t *p = json_array_get(prs, i), *o = json_object_get(p, "order"), *w = json_object_get(p, "warm_order");
		s->pr[i].k = (uint32_t)json_array_size(o);
		for (uint32_t k = 0; k < s->pr[i].k && k < 8; k++) {
			s->pr[i].order[k] = (uint32_t)json_integer_value(json_array_get(o, k));
			s->pr[i].warm[k] = (uint32_t)json_integer_value(json_array_get(w, k));
		}
		s->pr[i].target = (uint32_t)json_integer_value(json_object_get(p, "target"));
		s->pr[i].q = strdup(json_string_value(json_object_get(p, "question")));
		s->pr[i].wq = strdup(json_string_value(json_object_get(p, "warm_question")));
		s->n_prompts++;
	}
	json_decref(j);
}

static toks enc(const kvt_tok *tok, const char *text, bool special)
{
	toks t = { 0 };
	size_t n = 0, cap = strlen(text) + 16;
	t.p = malloc(cap * sizeof(int32_t));
	if (!t.p || kvt_tok_encode(tok, text, strlen(text), special, t.p, cap, &n) != KVT_OK)
		die("tokenize");
	t.n = (uint32_t)n;
	return t;
}

/* The chat template around one user turn: the text before and after its content. */
static void template_parts(const kvt_tok *tok, toks *head, toks *tail)
{
	kvt_chat_msg msg = { .role = "user", .content = "\x01" };
	char *f = NULL;
	if (kvt_tok_chat_format(tok, &msg, 1, true, &f) != KVT_OK)
		die("the model has no chat template");
	char *cut = strchr(f, '\x01');
	*cut = 0;
	toks h = enc(tok, f, true);
	*tail = enc(tok, cut + 1, true);
	if (kvt_tok_add_bos(tok) && (!h.n || h.p[0] != kvt_tok_bos(tok))) {
		int32_t *p = malloc((h.n + 1) * sizeof(int32_t));
		p[0] = kvt_tok_bos(tok);
		memcpy(p + 1, h.p, h.n * sizeof(int32_t));
		free(h.p);
		h.p = p;
		h.n++;
	}
	*head = h;
	free(f);
}

/* A prompt: head + instruction, docs in order, question + tail; start[i] where doc order[i] begins. */
typedef struct prompt {
	int32_t *ids;
	uint32_t n, n_head, start[8], len[8];
} prompt;

static void prompt_build(prompt *p, const toks *head, const toks *instr, toks *const *docs, const uint32_t *order,
			 uint32_t k, const toks *q, const toks *tail)
{
	uint32_t n = head->n + instr->n + q->n + tail->n;
	for (uint32_t i = 0; i < k; i++)
		n += docs[order[i]]->n;
	p->ids = malloc(n * sizeof(int32_t));
	p->n = 0;
#define PUT(t)                                                                 \
	do {                                                                   \
		memcpy(p->ids + p->n, (t)->p, (t)->n * sizeof(int32_t));       \
		p->n += (t)->n;                                                \
	} while (0)
	PUT(head);
	PUT(instr);
	p->n_head = p->n;
	for (uint32_t i = 0; i < k; i++) {
		p->start[i] = p->n;
		p->len[i] = docs[order[i]]->n;
		PUT(docs[order[i]]);
	}
	PUT(q);
	PUT(tail);
#undef PUT
}

typedef struct eng {
	kvt_dev *dev;
	kvt_model *m;
	kvt_tok *tok;
	uint32_t V;
} eng;

static void eng_open(eng *e, const char *path, uint32_t threads, uint32_t max_ctx)
{
	kvt_gguf *g;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = (int)threads };
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_ctx = max_ctx;
	if (kvt_gguf_open(path, &g) || kvt_dev_create(&dc, &e->dev) || kvt_model_load(e->dev, g, &mc, &e->m) ||
	    kvt_tok_create_from_gguf(g, &e->tok))
		die("cannot load the model");
	kvt_gguf_close(g);
	e->V = kvt_model_hparams_get(e->m)->n_vocab;
}

/* log-softmax of logits into lp (double) */
static void log_softmax(const float *l, uint32_t V, double *lp)
{
	double mx = -1e300, z = 0;
	for (uint32_t i = 0; i < V; i++)
		mx = l[i] > mx ? l[i] : mx;
	for (uint32_t i = 0; i < V; i++)
		z += exp(l[i] - mx);
	const double lz = mx + log(z);
	for (uint32_t i = 0; i < V; i++)
		lp[i] = l[i] - lz;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, uint32_t n)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof(double), cmp_d);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint32_t g_check = 1, g_sink = 0; /* --check, --sink: the blend's check layer and chunk-start rows */
static float g_only_r = -1; /* --r: run this fraction only */
static bool g_isolated; /* --isolated 1: each chunk computed alone (positions 0..), not in its first context */

static int quality(const char *model, const set *st, uint32_t n_prompts, uint32_t threads, FILE *jo)
{
	eng e;
	eng_open(&e, model, threads, 8192);
	const kvt_model_hparams *hp = kvt_model_hparams_get(e.m);
	kvt_kv_layout shape;
	kvt_model_kv_shape(e.m, BT, &shape);
	kvt_t0_pool *pool;
	if (kvt_t0_create(e.dev, &shape, 4096, &pool))
		die("no T0 pool");
	toks head, tail, instr = enc(e.tok, st->instruction, false), *docs[MAX_DOCS];
	template_parts(e.tok, &head, &tail);
	for (uint32_t i = 0; i < st->n_docs; i++) {
		docs[i] = malloc(sizeof(toks));
		*docs[i] = enc(e.tok, st->doc[i], false);
	}
	kvt_seq chunk[MAX_DOCS];
	bool have[MAX_DOCS] = { 0 };
	float *logits = malloc(e.V * sizeof(float));
	double *lp_ref = malloc((size_t)KL_POS * e.V * sizeof(double)), *lp = malloc(e.V * sizeof(double));
	uint32_t agree[N_R] = { 0 }, top1[N_R] = { 0 }, n_done = 0, recomputed[N_R] = { 0 }, placed_total = 0;
	double kl_sum[N_R] = { 0 }, *ratio[N_R], t_full_sum = 0, t_blend_sum[N_R] = { 0 };
	for (int r = 0; r < N_R; r++)
		ratio[r] = malloc(256 * sizeof(double));
	if (n_prompts > st->n_prompts)
		n_prompts = st->n_prompts;
	printf("quality: %s (%s, %u layers), %u prompts, %u threads, check layer %u, %u chunk-start rows\n", model, hp->arch,
	       hp->n_layer, n_prompts, threads, g_check, g_sink);
	for (uint32_t pi = 0; pi < n_prompts; pi++) {
		const uint32_t k = st->pr[pi].k;
		toks q = enc(e.tok, st->pr[pi].q, false), wq = enc(e.tok, st->pr[pi].wq, false);
		prompt P, W;
		prompt_build(&P, &head, &instr, docs, st->pr[pi].order, k, &q, &tail);
		prompt_build(&W, &head, &instr, docs, st->pr[pi].warm, k, &wq, &tail);
		kvt_seq s;
		if (kvt_seq_init(&s, e.dev, pool, 8192))
			die("seq");
		/* the chunks: from the first context each document was seen in (this prompt's warm order) */
		bool need = false;
		for (uint32_t i = 0; i < k; i++)
			need = need || !have[st->pr[pi].warm[i]];
		for (uint32_t i = 0; g_isolated && i < k; i++) {
			uint32_t d = st->pr[pi].warm[i], nf = docs[d]->n / BT * BT;
			if (have[d] || !nf)
				continue;
			if (kvt_seq_init(&chunk[d], e.dev, pool, nf) || kvt_model_forward(e.m, &chunk[d], docs[d]->p, nf, NULL, 0))
				die("chunk alone");
			have[d] = true;
		}
		if (need && !g_isolated) {
			if (kvt_model_forward(e.m, &s, W.ids, W.n, NULL, 0))
				die("warm prefill");
			for (uint32_t i = 0; i < k; i++) {
				uint32_t d = st->pr[pi].warm[i], nf = W.len[i] / BT * BT;
				if (have[d] || !nf)
					continue;
				if (kvt_seq_init(&chunk[d], e.dev, pool, nf) ||
				    kvt_model_kv_move(e.m, &s, W.start[i], &chunk[d], 0, nf, -(int32_t)W.start[i]))
					die("chunk store");
				chunk[d].n_tokens = nf;
				have[d] = true;
			}
			kvt_seq_reset(&s);
		}
		/* the reference: full prefill, greedy answer, its first KL_POS distributions */
		double t0 = now_s();
		if (kvt_model_forward(e.m, &s, P.ids, P.n, logits, 1))
			die("prefill");
		const double t_full = now_s() - t0;
		int32_t ans[MAX_ANS];
		uint32_t n_ans = 0;
		for (; n_ans < MAX_ANS; n_ans++) {
			if (n_ans < KL_POS)
				log_softmax(logits, e.V, lp_ref + (size_t)n_ans * e.V);
			ans[n_ans] = kvt_argmax(logits, e.V);
			if (kvt_tok_is_eog(e.tok, ans[n_ans])) {
				n_ans++;
				break;
			}
			if (kvt_model_forward(e.m, &s, &ans[n_ans], 1, logits, 1))
				die("decode");
		}
		t_full_sum += t_full;
		uint8_t *placed = calloc(P.n, 1);
		bool counted = false;
		for (int r = 0; r < N_R; r++) {
			if (g_only_r >= 0 && fabsf(R_LIST[r] - g_only_r) > 1e-6f)
				continue;
			kvt_seq_reset(&s);
			t0 = now_s();
			if (kvt_model_forward(e.m, &s, P.ids, P.n_head, NULL, 0))
				die("head");
			memset(placed, 0, P.n);
			uint32_t n_pl = 0;
			for (uint32_t i = 0; i < k; i++) {
				uint32_t d = st->pr[pi].order[i];
				if (!have[d])
					continue;
				if (kvt_model_kv_move(e.m, &chunk[d], 0, &s, P.start[i], chunk[d].n_tokens, (int32_t)P.start[i]))
					die("place");
				memset(placed + P.start[i] - P.n_head, 1, chunk[d].n_tokens);
				n_pl += chunk[d].n_tokens;
			}
			kvt_blend_params bp = { .recompute = R_LIST[r], .check_layer = g_check, .n_sink = g_sink };
			kvt_blend_result res;
			if (kvt_model_forward_blend(e.m, &s, P.ids + P.n_head, P.n - P.n_head, placed, &bp, logits, 1, &res))
				die("blend");
			const double t_blend = now_s() - t0;
			t_blend_sum[r] += t_blend;
			ratio[r][pi] = t_blend / t_full;
			recomputed[r] += res.n_recomputed;
			if (!counted) { /* the same placement at every r */
				placed_total += n_pl;
				counted = true;
			}
			bool all = true;
			double kl = 0;
			for (uint32_t t = 0; t < n_ans; t++) {
				int32_t am = kvt_argmax(logits, e.V);
				if (t == 0)
					top1[r] += am == ans[0];
				all = all && am == ans[t];
				if (t < KL_POS) {
					log_softmax(logits, e.V, lp);
					const double *pr = lp_ref + (size_t)t * e.V;
					double d = 0;
					for (uint32_t v = 0; v < e.V; v++)
						d += exp(pr[v]) * (pr[v] - lp[v]);
					kl += d;
				}
				if (t + 1 < n_ans && kvt_model_forward(e.m, &s, &ans[t], 1, logits, 1))
					die("teacher forcing");
			}
			agree[r] += all;
			kl_sum[r] += kl / (n_ans < KL_POS ? n_ans : KL_POS);
		}
		free(placed);
		n_done++;
		printf("  prompt %2u: %4u tokens, %u docs, full prefill %.2f s\n", pi, P.n, k, t_full);
		fflush(stdout);
		kvt_seq_deinit(&s);
		free(P.ids);
		free(W.ids);
		free(q.p);
		free(wq.p);
	}
	printf("\n| r | greedy answer agreement | first-token top-1 | mean KL, first %d positions | recomputed | prefill "
	       "time vs full (median) |\n|---|---|---|---|---|---|\n",
	       KL_POS);
	if (jo)
		fprintf(jo, "{\"bench\": \"chunks quality\", \"model\": \"%s\", \"prompts\": %u, \"threads\": %u, \"rows\": [",
			model, n_done, threads);
	for (int r = 0; r < N_R; r++) {
		if (g_only_r >= 0 && fabsf(R_LIST[r] - g_only_r) > 1e-6f)
			continue;
		double med = median(ratio[r], n_done);
		printf("| %.2f | %u/%u (%.0f%%) | %u/%u (%.0f%%) | %.4f | %.1f%% | %.3fx |\n", R_LIST[r], agree[r], n_done,
		       100.0 * agree[r] / n_done, top1[r], n_done, 100.0 * top1[r] / n_done, kl_sum[r] / n_done,
		       100.0 * recomputed[r] / (placed_total ? placed_total : 1), med);
		if (jo)
			fprintf(jo,
				"%s{\"r\": %.2f, \"answer_agreement\": %.4f, \"top1\": %.4f, \"kl16\": %.5f, "
				"\"recomputed_fraction\": %.4f, \"time_ratio_median\": %.4f}",
				r ? ", " : "", R_LIST[r], (double)agree[r] / n_done, (double)top1[r] / n_done,
				kl_sum[r] / n_done, (double)recomputed[r] / (placed_total ? placed_total : 1), med);
	}
	if (jo)
		fprintf(jo, "]}\n");
	return 0;
}

/* ---- the scheduler ---- */

typedef struct rig {
	eng e;
	kvt_stack st;
} rig;

static void rig_open(rig *r, const char *model, uint32_t threads, uint32_t t0_slots, uint32_t t1_slots)
{
	eng_open(&r->e, model, threads, 8192);
	kvt_stack_config c;
	kvt_stack_config_default(&c);
	c.dev = r->e.dev;
	c.model = r->e.m;
	c.tok = r->e.tok;
	memset(c.model_fp, 0x55, sizeof(c.model_fp));
	c.block_tokens = BT;
	c.t0_slots = t0_slots;
	c.tm.t1_slots = t1_slots;
	c.tm.t1_codec = KVT_KV_CODEC_F16;
	c.sched.secret = secret;
	c.sched.secret_bytes = sizeof(secret);
	if (kvt_stack_open(&c, &r->st))
		die("stack");
}

static void submit_wait(rig *r, const kvt_sched_req *q, kvt_sched_usage *u)
{
	kvt_sched_handle *h;
	int finish = KVT_FINISH_NONE;
	int32_t out[8];
	if (kvt_sched_submit(r->st.sched, q, &h))
		die("submit");
	while (finish == KVT_FINISH_NONE) {
		uint32_t n = 0;
		kvt_sched_next(h, out, 8, &n, &finish, u, 1.0);
	}
	kvt_sched_release(h);
}

/* A request of head, docs (marked when mark), question, tail. */
static void req_build(kvt_sched_req *q, prompt *p, const toks *head, const toks *instr, toks *const *docs,
		      const uint32_t *order, uint32_t k, const toks *qt, const toks *tail, bool mark)
{
	prompt_build(p, head, instr, docs, order, k, qt, tail);
	memset(q, 0, sizeof(*q));
	q->prompt = p->ids;
	q->n_prompt = p->n;
	q->max_tokens = 1;
	q->ignore_eos = true;
	q->chunk_recompute = -1;
	for (uint32_t i = 0; mark && i < k; i++)
		q->chunks[q->n_chunks++] = (kvt_sched_chunk){ .start = p->start[i], .n = p->len[i] };
}

static int speed(const char *model, const set *st, uint32_t rounds, uint32_t threads, FILE *jo)
{
	rig r;
	rig_open(&r, model, threads, 2048, 512);
	toks head, tail, instr = enc(r.e.tok, st->instruction, false), *docs[4];
	template_parts(r.e.tok, &head, &tail);
	/* 4 documents of 500 tokens (the set's longest, cut), a 30-token question */
	for (uint32_t i = 0, d = 0; i < 4; d++) {
		if (d >= st->n_docs)
			die("the set has fewer than 4 documents of 500 tokens");
		toks t = enc(r.e.tok, st->doc[d], false);
		if (t.n < 500) {
			free(t.p);
			continue;
		}
		t.n = 500;
		docs[i] = malloc(sizeof(toks));
		*docs[i++] = t;
	}
	toks q = enc(r.e.tok, "Question: Which of the documents above tells of a journey, and who makes it? Answer in one "
			      "short sentence, please.",
		     false);
	if (q.n > 30)
		q.n = 30;
	static const uint32_t perms[24][4] = { { 0, 1, 2, 3 }, { 1, 0, 3, 2 }, { 2, 3, 0, 1 }, { 3, 2, 1, 0 }, { 0, 2, 1, 3 },
					       { 1, 3, 0, 2 }, { 2, 0, 3, 1 }, { 3, 1, 2, 0 }, { 0, 3, 2, 1 }, { 1, 2, 3, 0 },
					       { 2, 1, 0, 3 }, { 3, 0, 1, 2 }, { 0, 1, 3, 2 }, { 1, 0, 2, 3 }, { 2, 3, 1, 0 },
					       { 3, 2, 0, 1 }, { 0, 2, 3, 1 }, { 1, 3, 2, 0 }, { 2, 0, 1, 3 }, { 3, 1, 0, 2 },
					       { 0, 3, 1, 2 }, { 1, 2, 0, 3 }, { 2, 1, 3, 0 }, { 3, 0, 2, 1 } };
	kvt_sched_req req;
	kvt_sched_usage u;
	prompt p;
	/* the chunks cached once, from the first order */
	req_build(&req, &p, &head, &instr, docs, perms[0], 4, &q, &tail, true);
	submit_wait(&r, &req, &u);
	free(p.ids);
	if (rounds > 11)
		rounds = 11;
	static const uint32_t marked[12] = { 1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15 };
	double full[16], blend[16];
	uint32_t reused = 0, recomp = 0;
	for (uint32_t i = 0; i < rounds; i++) {
		/* full: a fresh tenant, nothing cached */
		req_build(&req, &p, &head, &instr, docs, perms[16 + i % 8], 4, &q, &tail, false);
		snprintf(req.tenant, sizeof(req.tenant), "full%u", i);
		submit_wait(&r, &req, &u);
		full[i] = u.ttft_s;
		free(p.ids);
		/* an order that does not start with the first one's first document (that one's exact prefix holds it) */
		req_build(&req, &p, &head, &instr, docs, perms[marked[i % 12]], 4, &q, &tail, true);
		submit_wait(&r, &req, &u);
		blend[i] = u.ttft_s;
		reused += u.chunk_reused_tokens;
		recomp += u.chunk_recomputed_tokens;
		free(p.ids);
		printf("  round %u: full prefill TTFT %.3f s, chunks reused TTFT %.3f s (%u reused, %u recomputed)\n", i,
		       full[i], blend[i], u.chunk_reused_tokens, u.chunk_recomputed_tokens);
		fflush(stdout);
	}
	double mf = median(full, rounds), mb = median(blend, rounds);
	printf("speed: %s, %u threads, %u tokens (4 x 500 + question): TTFT full %.3f s, with chunks %.3f s: %.3fx "
	       "(median of %u alternating rounds; %u reused, %u recomputed tokens in all)\n",
	       model, threads, p.n, mf, mb, mb / mf, rounds, reused, recomp);
	if (jo)
		fprintf(jo,
			"{\"bench\": \"chunks speed\", \"model\": \"%s\", \"threads\": %u, \"prompt_tokens\": %u, "
			"\"ttft_full_s\": %.4f, \"ttft_chunks_s\": %.4f, \"ratio\": %.4f, \"rounds\": %u}\n",
			model, threads, p.n, mf, mb, mb / mf, rounds);
	kvt_stack_close(&r.st);
	return 0;
}

static int steady(const char *model, const set *st, uint32_t n_req, uint32_t threads, FILE *jo)
{
	rig r;
	/* small tiers: T0 holds ~3 requests' blocks, T1 ~ 8 documents */
	rig_open(&r, model, threads, 400, 160);
	toks head, tail, instr = enc(r.e.tok, st->instruction, false);
	template_parts(r.e.tok, &head, &tail);
	/*
	 * n_req * 2 new documents: the set's texts cut to 200 tokens, each behind a
	 * line of its own ("[Entry k]"), so no two share a chunk block however often
	 * a text comes round.
	 */
	const uint32_t n_docs = n_req * 2 + 4;
	toks **docs = malloc(n_docs * sizeof(*docs));
	for (uint32_t d = 0; d < n_docs; d++) {
		const char *text = st->doc[d % st->n_docs];
		char *buf = malloc(strlen(text) + 32);
		sprintf(buf, "[Entry %u]\n%s", d, text);
		toks t = enc(r.e.tok, buf, false);
		free(buf);
		t.n = t.n > 200 ? 200 : t.n;
		docs[d] = malloc(sizeof(toks));
		*docs[d] = t;
	}
	toks q = enc(r.e.tok, "Question: Which document is the longest?", false);
	uint32_t next_new = 0, hist[64], n_hist = 0;
	uint64_t seen_tok = 0, found_tok = 0;
	srand(7);
	if (jo)
		fprintf(jo, "{\"bench\": \"chunks steady\", \"model\": \"%s\", \"windows\": [", model);
	for (uint32_t i = 0; i < n_req; i++) {
		uint32_t order[4], k = 0;
		/* two seen in the last 8 requests (when there are such), two new (cycling through the set) */
		for (uint32_t j = 0; j < 2 && n_hist >= 4; j++) {
			uint32_t back = (uint32_t)rand() % (n_hist < 16 ? n_hist : 16);
			uint32_t d = hist[(n_hist - 1 - back) % 64];
			bool dup = false;
			for (uint32_t x = 0; x < k; x++)
				dup = dup || order[x] == d;
			if (!dup)
				order[k++] = d;
		}
		uint32_t n_seen = k;
		while (k < 4)
			order[k++] = next_new++;
		for (uint32_t j = 0; j < 4; j++)
			hist[n_hist++ % 64] = order[j];
		kvt_sched_req req;
		kvt_sched_usage u;
		kvt_sched_stats s0, s1;
		prompt p;
		req_build(&req, &p, &head, &instr, docs, order, 4, &q, &tail, true);
		kvt_sched_get_stats(r.st.sched, &s0);
		submit_wait(&r, &req, &u);
		kvt_sched_get_stats(r.st.sched, &s1);
		free(p.ids);
		for (uint32_t j = 0; j < n_seen; j++)
			seen_tok += docs[order[j]]->n / BT * BT;
		found_tok += s1.chunk_hit_tokens - s0.chunk_hit_tokens;
		if ((i + 1) % 10 == 0) {
			kvt_sched_stats ss;
			kvt_sched_get_stats(r.st.sched, &ss);
			const kvt_tm_tier_stats *t0 = &ss.tiers.tier[KVT_TIER_HBM], *t1 = &ss.tiers.tier[KVT_TIER_HOST];
			printf("  requests %3u-%3u: reuse rate %.1f%% of the seen documents' tokens; chunk tokens stored so far "
			       "%llu; T0 %llu chunk + %llu prefix blocks, T1 %llu + %llu, chunk evictions T0 %llu T1 %llu\n",
			       i - 8, i + 1, 100.0 * found_tok / (seen_tok ? seen_tok : 1),
			       (unsigned long long)ss.chunk_stored_tokens,
			       (unsigned long long)t0->n_blocks_by_kind[KVT_BLOCK_CHUNK],
			       (unsigned long long)t0->n_blocks_by_kind[KVT_BLOCK_PREFIX],
			       (unsigned long long)t1->n_blocks_by_kind[KVT_BLOCK_CHUNK],
			       (unsigned long long)t1->n_blocks_by_kind[KVT_BLOCK_PREFIX],
			       (unsigned long long)t0->n_evictions_by_kind[KVT_BLOCK_CHUNK],
			       (unsigned long long)t1->n_evictions_by_kind[KVT_BLOCK_CHUNK]);
			if (jo)
				fprintf(jo, "%s{\"requests\": %u, \"reuse_rate\": %.4f, \"stored_tokens\": %llu}", i >= 10 ? ", " : "",
					i + 1, (double)found_tok / (seen_tok ? seen_tok : 1),
					(unsigned long long)ss.chunk_stored_tokens);
			seen_tok = found_tok = 0;
			fflush(stdout);
		}
	}
	if (jo)
		fprintf(jo, "]}\n");
	kvt_stack_close(&r.st);
	return 0;
}

int main(int argc, char **argv)
{
	const char *model = NULL, *setp = NULL, *json = NULL;
	uint32_t n = 0, threads = 2;
	if (argc < 2)
		die("usage: bench_chunks quality|speed|steady --model M --set SET.json [--prompts|--rounds|--requests N] "
		    "[--threads T] [--json OUT]");
	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--model"))
			model = argv[i + 1];
		else if (!strcmp(argv[i], "--set"))
			setp = argv[i + 1];
		else if (!strcmp(argv[i], "--json"))
			json = argv[i + 1];
		else if (!strcmp(argv[i], "--check"))
			g_check = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--sink"))
			g_sink = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--isolated"))
			g_isolated = atoi(argv[i + 1]) != 0;
		else if (!strcmp(argv[i], "--r"))
			g_only_r = (float)atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads"))
			threads = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--prompts") || !strcmp(argv[i], "--rounds") || !strcmp(argv[i], "--requests"))
			n = (uint32_t)atoi(argv[i + 1]);
		else
			die("unknown option");
	}
	if (!model || !setp)
		die("--model and --set are needed");
	static set st;
	set_load(setp, &st);
	FILE *jo = json ? fopen(json, "w") : NULL;
	int rc;
	if (!strcmp(argv[1], "quality"))
		rc = quality(model, &st, n ? n : 12, threads, jo);
	else if (!strcmp(argv[1], "speed"))
		rc = speed(model, &st, n ? n : 5, threads, jo);
	else if (!strcmp(argv[1], "steady"))
		rc = steady(model, &st, n ? n : 60, threads, jo);
	else
		die("the mode is quality, speed or steady");
	if (jo)
		fclose(jo);
	return rc;
}
