/* ctest-labels: model */
/*
 * tests/test_sched_model.c — logprobs and grammar-constrained requests
 * through the scheduler, on the default model (skipped without it).
 *
 *  - logprobs: a greedy request's per-token logprobs (and top 20) equal a
 *    log-softmax, computed here in double, of the logits the engine computes
 *    for the same positions (the prompt and the tokens generated so far run
 *    through kvt_model_forward on a sequence of this test's own, before the
 *    request is submitted and after it ended: the model is the scheduler's
 *    only while requests run); the chosen token's logprob is the maximum;
 *  - a request constrained by a JSON grammar produces text the grammar
 *    accepts, ended where the grammar ends, and its blocks are cached: the
 *    same prompt followed by that reply, submitted again, is served from the
 *    cache up to its last full block (constraints change sampling only).
 */
#include "check.h"
#include "gguf.h"
#include "grammar.h"
#include "model.h"
#include "scheduler.h"
#include "stack.h"
#include "tokenizer.h"

#define BT 16
#define N_GEN 12

static const uint8_t secret[32] = "0123456789abcdef0123456789abcde";

static const char JSON_G[] =
	"root ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws string ws \",\" ws \"\\\"age\\\"\" ws \":\" ws [0-9]{1,3} ws \"}\"\n"
	"string ::= \"\\\"\" [a-zA-Z ]{1,20} \"\\\"\"\n"
	"ws ::= [ \\n]{0,3}\n";

static void run(kvt_sched *s, const kvt_sched_req *q, int32_t *out, kvt_token_lp *lps, uint32_t *n_out, int *finish,
		kvt_sched_usage *u)
{
	kvt_sched_handle *h;
	*n_out = 0;
	CHECK(kvt_sched_submit(s, q, &h) == KVT_OK);
	for (;;) {
		uint32_t n = 0;
		kvt_sched_next_lp(h, out + *n_out, lps ? lps + *n_out : NULL, 256 - *n_out, &n, finish, u, 1.0);
		*n_out += n;
		if (*finish != KVT_FINISH_NONE)
			break;
	}
	kvt_sched_release(h);
}

int main(void)
{
	const char *path = KVT_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
	kvt_gguf *g;
	if (kvt_gguf_open(path, &g) != KVT_OK) {
		printf("skip: no default model\n");
		return CHECK_SKIP;
	}
	kvt_dev *dev;
	kvt_model *m;
	kvt_tok *tok;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = 2 };
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_batch = 128;
	mc.max_ctx = 512;
	CHECK(kvt_dev_create(&dc, &dev) == KVT_OK && kvt_model_load(dev, g, &mc, &m) == KVT_OK &&
	      kvt_tok_create_from_gguf(g, &tok) == KVT_OK);
	kvt_gguf_close(g);
	kvt_stack_config c;
	kvt_stack_config_default(&c);
	c.dev = dev;
	c.model = m;
	c.tok = tok;
	memset(c.model_fp, 0x33, sizeof(c.model_fp));
	c.block_tokens = BT;
	c.t0_slots = 128;
	c.tm.t1_slots = 32;
	c.tm.t1_codec = KVT_KV_CODEC_F16;
	c.sched.secret = secret;
	c.sched.secret_bytes = sizeof(secret);
	kvt_stack st;
	CHECK(kvt_stack_open(&c, &st) == KVT_OK);
	const uint32_t V = kvt_model_hparams_get(m)->n_vocab;

	/* ---- logprobs against the engine's logits ---- */
	kvt_chat_msg msg = { .role = "user", .content = "Name three colours." };
	int32_t *prompt;
	size_t n_prompt;
	CHECK(kvt_tok_chat_encode(tok, &msg, 1, true, &prompt, &n_prompt) == KVT_OK);
	static kvt_sched_req q;
	memset(&q, 0, sizeof(q));
	q.prompt = prompt;
	q.n_prompt = (uint32_t)n_prompt;
	q.max_tokens = N_GEN;
	q.ignore_eos = true;
	q.logprobs = true;
	q.top_logprobs = 20;
	static int32_t out[256];
	static kvt_token_lp lps[256];
	uint32_t n_out;
	int finish;
	kvt_sched_usage u;
	run(st.sched, &q, out, lps, &n_out, &finish, &u);
	CHECK_EQ_INT(n_out, N_GEN);
	/* the reference: the same positions through the model on a sequence of our own (the scheduler is idle) */
	kvt_seq seq;
	CHECK(kvt_seq_init(&seq, dev, st.t0, 512) == KVT_OK);
	float *logits = malloc(V * sizeof(float));
	CHECK(kvt_model_forward(m, &seq, prompt, (uint32_t)n_prompt, logits, 1) == KVT_OK);
	double worst = 0;
	for (uint32_t i = 0; i < n_out; i++) {
		double mx = logits[kvt_argmax(logits, V)], sum = 0;
		for (uint32_t k = 0; k < V; k++)
			sum += exp((double)logits[k] - mx);
		double lse = mx + log(sum), want = logits[out[i]] - lse;
		CHECKF(out[i] == kvt_argmax(logits, V), "step %u: greedy token %d, argmax %d", i, out[i], kvt_argmax(logits, V));
		CHECKF(lps[i].id == out[i] && lps[i].n_top == 20, "step %u: entry for %d, %u alternatives", i, lps[i].id,
		       lps[i].n_top);
		double d = fabs(lps[i].logprob - want);
		worst = d > worst ? d : worst;
		CHECKF(d < 2e-4, "step %u: logprob %.6f, log-softmax %.6f", i, lps[i].logprob, want);
		CHECKF(lps[i].top_id[0] == out[i] && lps[i].top_lp[0] == lps[i].logprob, "step %u: the greedy token is first",
		       i);
		for (uint32_t k = 0; k < lps[i].n_top; k++) {
			double wk = logits[lps[i].top_id[k]] - lse;
			CHECKF(fabs(lps[i].top_lp[k] - wk) < 2e-4 && lps[i].top_lp[k] <= lps[i].logprob,
			       "step %u alt %u: %.6f vs %.6f", i, k, lps[i].top_lp[k], wk);
			CHECK(k == 0 || lps[i].top_lp[k] <= lps[i].top_lp[k - 1]);
		}
		CHECK(kvt_model_forward(m, &seq, &out[i], 1, logits, 1) == KVT_OK);
	}
	printf("logprobs: %u tokens, largest difference from the log-softmax of the engine's logits %.2e\n", n_out, worst);
	kvt_seq_deinit(&seq);
	free(logits);

	/* ---- a constrained request: the grammar holds, and its blocks are cached ---- */
	kvt_grammar *gr;
	char err[256];
	CHECK(kvt_grammar_compile(JSON_G, strlen(JSON_G), "root", &gr, err, sizeof(err)) == KVT_OK);
	msg.content = "Give the name and age of a person as JSON.";
	free(prompt);
	CHECK(kvt_tok_chat_encode(tok, &msg, 1, true, &prompt, &n_prompt) == KVT_OK);
	memset(&q, 0, sizeof(q));
	q.prompt = prompt;
	q.n_prompt = (uint32_t)n_prompt;
	q.max_tokens = 64;
	q.grammar = gr;
	run(st.sched, &q, out, NULL, &n_out, &finish, &u);
	CHECKF(finish == KVT_FINISH_STOP, "finish %d", finish);
	char text[1024];
	size_t nt = 0;
	for (uint32_t i = 0; i < n_out; i++) {
		const char *b;
		size_t n;
		kvt_tok_token_bytes(tok, out[i], &b, &n);
		if (nt + n < sizeof(text)) {
			memcpy(text + nt, b, n);
			nt += n;
		}
	}
	text[nt] = 0;
	kvt_gmatch *gm;
	CHECK(kvt_gmatch_create(gr, NULL, &gm) == KVT_OK);
	CHECKF(kvt_gmatch_feed(gm, text, nt) && kvt_gmatch_can_end(gm), "constrained output outside the grammar: %s", text);
	kvt_gmatch_destroy(gm);
	kvt_grammar_unref(gr); /* the scheduler held its own reference while the request ran */
	printf("constrained: %s\n", text);
	/* the turn (prompt and reply) again, plus one token: served from the cache to its last full block */
	uint32_t n_hist = (uint32_t)n_prompt + n_out;
	int32_t *again = malloc((n_hist + 1) * sizeof(int32_t));
	memcpy(again, prompt, n_prompt * sizeof(int32_t));
	memcpy(again + n_prompt, out, n_out * sizeof(int32_t));
	again[n_hist] = prompt[0];
	kvt_sched_usage u1 = u;
	memset(&q, 0, sizeof(q));
	q.prompt = again;
	q.n_prompt = n_hist + 1;
	q.max_tokens = 1;
	run(st.sched, &q, out, NULL, &n_out, &finish, &u);
	CHECKF(u.cached_tokens == n_hist / BT * BT, "cached %u of the constrained turn's %u tokens (first run %u cached)",
	       u.cached_tokens, n_hist, u1.cached_tokens);
	free(again);
	free(prompt);
	kvt_stack_close(&st);
	kvt_model_destroy(m);
	kvt_tok_destroy(tok);
	kvt_dev_destroy(dev);
	return check_done("test_sched_model");
}
