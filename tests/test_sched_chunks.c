/* ctest-labels: model */
/*
 * tests/test_sched_chunks.c — chunk reuse through the scheduler on the real
 * models (the default model, SmolLM2, a Llama; Gemma 3 270M, NEOX RoPE and
 * sliding-window layers), each skipped when its file is absent.
 *
 * Prompts are a header, two documents and a question, as token runs; the
 * documents are marked spans (kvt_sched_req.chunks).
 *  - order A (header, doc 1, doc 2, question): nothing found; both spans are
 *    stored as chunk blocks (chunk_stored_tokens grows by their full blocks);
 *  - order B (header, doc 2, doc 1, another question) at recompute 0.15: both
 *    found and blended in: chunk_reused_tokens > 0, chunk_recomputed_tokens
 *    = the rounded-up fraction, cached_tokens only the header's exact prefix;
 *  - order B at recompute 1: exactly the tokens of a plain prefill of order B
 *    (the same request without spans);
 *  - another tenant finds nothing of them (chunks are salted like blocks);
 *  - the blended request's blocks past its first placed span were not
 *    registered: a plain request of order B finds only the header cached.
 */
#include "check.h"
#include "gguf.h"
#include "model.h"
#include "scheduler.h"
#include "stack.h"
#include "tokenizer.h"

#define BT 16
#define N_GEN 16

static const uint8_t secret[32] = "0123456789abcdef0123456789abcde";

static const char HEADER[] = "You answer questions about the documents below, briefly.\n\n";
static const char DOC1[] =
	"Document one. The lighthouse on Gray Point was built in 1871 from granite blocks quarried two miles "
	"inland and hauled to the cliff on oxen-drawn sledges. Its lamp burned whale oil until 1890, then kerosene, "
	"and was finally electrified in 1934. The keeper's log records that in the winter of 1888 the tower was "
	"struck by lightning three times in one night without damage to the lens, which had been made in Paris.\n\n";
static const char DOC2[] =
	"Document two. The river town of Millbrook grew around a paper mill that opened in 1902. At its peak the "
	"mill employed four hundred workers and shipped rolls of newsprint by barge to the coast every week. A fire "
	"in 1957 destroyed the east wing, and the mill closed for good in 1971, after which the building became a "
	"museum of local history with a working water wheel.\n\n";
static const char Q_A[] = "Question: In which year was the lighthouse electrified? Answer:";
static const char Q_B[] = "Question: What did the Millbrook mill ship by barge? Answer:";

typedef struct piece {
	int32_t ids[512];
	uint32_t n;
} piece;

static void enc(const kvt_tok *tok, const char *text, piece *p)
{
	size_t n = 0;
	CHECK(kvt_tok_encode(tok, text, strlen(text), false, p->ids, 512, &n) == KVT_OK);
	p->n = (uint32_t)n;
}

/* prompt = parts in order; spans (when marked) at the documents */
static uint32_t build(int32_t *prompt, const piece *const *parts, uint32_t n_parts, kvt_sched_req *q, bool mark,
		      uint32_t first_doc, uint32_t n_docs)
{
	uint32_t n = 0;
	q->n_chunks = 0;
	for (uint32_t i = 0; i < n_parts; i++) {
		if (mark && i >= first_doc && i < first_doc + n_docs)
			q->chunks[q->n_chunks++] = (kvt_sched_chunk){ .start = n, .n = parts[i]->n };
		memcpy(prompt + n, parts[i]->ids, parts[i]->n * sizeof(int32_t));
		n += parts[i]->n;
	}
	q->prompt = prompt;
	q->n_prompt = n;
	return n;
}

static void run(kvt_sched *s, const kvt_sched_req *q, int32_t *out, uint32_t *n_out, kvt_sched_usage *u)
{
	kvt_sched_handle *h;
	int finish = KVT_FINISH_NONE;
	*n_out = 0;
	CHECK(kvt_sched_submit(s, q, &h) == KVT_OK);
	while (finish == KVT_FINISH_NONE) {
		uint32_t n = 0;
		kvt_sched_next(h, out + *n_out, N_GEN - *n_out, &n, &finish, u, 1.0);
		*n_out += n;
	}
	kvt_sched_release(h);
}

static void test_model(const char *path, const char *name)
{
	kvt_gguf *g;
	if (kvt_gguf_open(path, &g) != KVT_OK) {
		printf("%s: skipped (no %s)\n", name, path);
		return;
	}
	kvt_dev *dev;
	kvt_model *m;
	kvt_tok *tok;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = 2 };
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_batch = 128;
	mc.max_ctx = 1024;
	CHECK(kvt_dev_create(&dc, &dev) == KVT_OK && kvt_model_load(dev, g, &mc, &m) == KVT_OK &&
	      kvt_tok_create_from_gguf(g, &tok) == KVT_OK);
	kvt_gguf_close(g);
	kvt_stack_config c;
	kvt_stack_config_default(&c);
	c.dev = dev;
	c.model = m;
	c.tok = tok;
	memset(c.model_fp, 0x44, sizeof(c.model_fp));
	c.block_tokens = BT;
	c.t0_slots = 256;
	c.tm.t1_slots = 64;
	c.tm.t1_codec = KVT_KV_CODEC_F16;
	c.sched.secret = secret;
	c.sched.secret_bytes = sizeof(secret);
	kvt_stack st;
	CHECK(kvt_stack_open(&c, &st) == KVT_OK);

	static piece hd, d1, d2, qa, qb;
	enc(tok, HEADER, &hd);
	enc(tok, DOC1, &d1);
	enc(tok, DOC2, &d2);
	enc(tok, Q_A, &qa);
	enc(tok, Q_B, &qb);
	const piece *order_a[] = { &hd, &d1, &d2, &qa }, *order_b[] = { &hd, &d2, &d1, &qb };
	static int32_t prompt[2048], out_plain[N_GEN], out_blend[N_GEN], out_r1[N_GEN], out[N_GEN];
	static kvt_sched_req q;
	kvt_sched_usage u;
	kvt_sched_stats s0, s1;
	uint32_t n_plain, n_blend, n_r1, n_out;

	memset(&q, 0, sizeof(q));
	q.max_tokens = N_GEN;
	q.ignore_eos = true;
	q.chunk_recompute = -1;

	/* A: both spans stored */
	kvt_sched_get_stats(st.sched, &s0);
	build(prompt, order_a, 4, &q, true, 1, 2);
	run(st.sched, &q, out, &n_out, &u);
	kvt_sched_get_stats(st.sched, &s1);
	const uint64_t full = (uint64_t)(d1.n / BT + d2.n / BT) * BT;
	printf("%s: order A: %u prompt tokens, spans %u + %u, stored %llu chunk tokens\n", name, q.n_prompt, d1.n, d2.n,
	       (unsigned long long)(s1.chunk_stored_tokens - s0.chunk_stored_tokens));
	CHECK_EQ_INT(u.chunk_tokens, d1.n + d2.n);
	CHECK_EQ_INT(u.chunk_reused_tokens, 0);
	CHECKF(s1.chunk_stored_tokens - s0.chunk_stored_tokens == full, "%s: stored %llu chunk tokens, want %llu", name,
	       (unsigned long long)(s1.chunk_stored_tokens - s0.chunk_stored_tokens), (unsigned long long)full);

	/* B blended at 0.15 */
	kvt_sched_get_stats(st.sched, &s0);
	build(prompt, order_b, 4, &q, true, 1, 2);
	q.chunk_recompute = 0.15f;
	run(st.sched, &q, out_blend, &n_blend, &u);
	kvt_sched_get_stats(st.sched, &s1);
	printf("%s: order B at 0.15: %u reused, %u recomputed, %u cached (exact prefix)\n", name, u.chunk_reused_tokens,
	       u.chunk_recomputed_tokens, u.cached_tokens);
	CHECKF(u.chunk_reused_tokens > 0, "%s: nothing reused", name);
	CHECKF(u.chunk_reused_tokens + u.chunk_recomputed_tokens == full, "%s: %u + %u placed tokens, want %llu", name,
	       u.chunk_reused_tokens, u.chunk_recomputed_tokens, (unsigned long long)full);
	CHECKF(u.chunk_recomputed_tokens >= (uint32_t)(0.15 * (double)full) && u.chunk_recomputed_tokens < full / 3,
	       "%s: %u tokens recomputed at 0.15 of %llu", name, u.chunk_recomputed_tokens, (unsigned long long)full);
	CHECKF(u.cached_tokens <= hd.n, "%s: %u cached tokens counted (the header has %u)", name, u.cached_tokens, hd.n);
	CHECK(s1.chunk_hit_tokens - s0.chunk_hit_tokens == full && s1.chunk_blends == s0.chunk_blends + 1);

	/* B at 1 */
	q.chunk_recompute = 1.0f;
	run(st.sched, &q, out_r1, &n_r1, &u);
	CHECKF(u.chunk_recomputed_tokens == full && u.chunk_reused_tokens == 0, "%s: r = 1: %u recomputed, %u reused", name,
	       u.chunk_recomputed_tokens, u.chunk_reused_tokens);

	/* another tenant: nothing found */
	q.chunk_recompute = 0.15f;
	snprintf(q.tenant, sizeof(q.tenant), "other");
	run(st.sched, &q, out, &n_out, &u);
	CHECKF(u.chunk_reused_tokens == 0 && u.chunk_recomputed_tokens == 0, "%s: another tenant reused %u chunk tokens",
	       name, u.chunk_reused_tokens + u.chunk_recomputed_tokens);
	q.tenant[0] = 0;

	/* B plain (no spans), the reference: the blended requests registered nothing past the header */
	build(prompt, order_b, 4, &q, false, 1, 2);
	run(st.sched, &q, out_plain, &n_plain, &u);
	CHECK_EQ_INT(u.chunk_tokens, 0);
	CHECKF(u.cached_tokens <= hd.n, "%s: a plain request found %u tokens cached (the header has %u)", name,
	       u.cached_tokens, hd.n);
	uint32_t agree = 0;
	while (agree < n_blend && agree < n_plain && out_blend[agree] == out_plain[agree])
		agree++;
	printf("%s: the first %u of %u tokens at 0.15 agree with the plain prefill's\n", name, agree, n_plain);
	CHECKF(n_r1 == n_plain && !memcmp(out_r1, out_plain, n_plain * sizeof(int32_t)),
	       "%s: recompute 1 does not give the plain prefill's tokens", name);

	/* bad spans are refused */
	kvt_sched_handle *h;
	build(prompt, order_b, 4, &q, true, 1, 2);
	q.chunks[1].start = q.chunks[0].start + 1; /* overlaps */
	CHECK(kvt_sched_submit(st.sched, &q, &h) == KVT_EINVAL);
	q.chunks[1].start = q.n_prompt; /* past the prompt */
	CHECK(kvt_sched_submit(st.sched, &q, &h) == KVT_EINVAL);

	kvt_stack_close(&st);
	kvt_tok_destroy(tok);
	kvt_model_destroy(m);
	kvt_dev_destroy(dev);
}

int main(void)
{
	test_model(KVT_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2");
	test_model(KVT_SOURCE_DIR "/models/gemma-3-270m-q4_k_m.gguf", "gemma3");
	return check_done("test_sched_chunks");
}
