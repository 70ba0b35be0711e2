/* ctest-labels: model invariant */
/*
 * tests/test_model_invariant.c — DESIGN §8 invariant 1 on real models, on
 * the default fast CPU path (int8 activations, weights kept as stored): a
 * request's logits and greedy tokens are bitwise the same
 *   (a) cold, continued from its prefix cached in T0 (shared blocks), and
 *       continued after a "restart": the prefix blocks' fp16 bytes (what the
 *       f16 tiers keep, losslessly) copied out, then into other slots of a
 *       new device, model and pool, placed as the scheduler places blocks
 *       found in the cache (sched_chunks.c);
 *   (b) alone, and batched with 1, 3 and 7 other requests of other lengths
 *       (kvt_model_forward_batch for the prompt and every decode step, the
 *       others appending 1 to 3 tokens a step beside the target's one), and
 *       its tokens through the device decode step (kvt_model_decode) alone
 *       and beside 3 others;
 *   (c) on 1 thread and on 2;
 *   (d) with prompt chunks ([model] batch) of 256, 32 and 1.
 * Models: the default (SmolLM2-135M Q4_1), Gemma 3 270M (Q4_K_M: Q5_0,
 * Q6_K, Q8_0 and Q4_K rows), and a synthetic Llama 3.2 1B shape (2048-wide,
 * FFN 8192, 32 query and 8 KV heads; 2 layers, Q4_K_M mix) written by the
 * test. A model file that is missing is skipped (77 when none ran).
 * The reference is one cold run: the prompt in one chunk of 256 on 2
 * threads, then N_GEN greedy steps of kvt_model_forward, keeping every
 * step's logits.
 */
#include "check.h"
#include "gguf.h"
#include "ref_read.h"
#include "model.h"
#include "sampler.h"
#include "synth_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BT 16        /* tokens per KV block */
#define N_PROMPT 75  /* prompt tokens: 4 whole blocks and a partial one */
#define N_GEN 6      /* greedy steps after the prompt */
#define MAX_OTHERS 7 /* other requests in a batch */

typedef struct rig {
	kvt_gguf *g;       /* the file */
	kvt_dev *dev;      /* CPU backend */
	kvt_model *m;      /* model on it */
	kvt_t0_pool *pool; /* KV blocks */
	uint32_t V;        /* vocabulary */
} rig;

/* The reference: every step's logits ([N_GEN + 1][V]) and the greedy tokens. */
typedef struct trace {
	float *logits;         /* after the prompt, then after each generated token */
	int32_t toks[N_GEN + 1]; /* argmax of each row */
} trace;

static int32_t prompt[N_PROMPT];
static int n_models;

static int rig_open(rig *r, const char *path, int threads, uint32_t max_batch)
{
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = threads, .fixed_threads = true, .act_int8 = true };
	kvt_model_config mc;
	kvt_kv_layout shape;
	memset(r, 0, sizeof(*r));
	kvt_model_config_default(&mc);
	mc.max_batch = max_batch;
	mc.max_ctx = 1024;
	if (kvt_gguf_open(path, &r->g) || kvt_dev_create(&dc, &r->dev) || kvt_model_load(r->dev, r->g, &mc, &r->m))
		return 1;
	kvt_model_kv_shape(r->m, BT, &shape);
	r->V = kvt_model_hparams_get(r->m)->n_vocab;
	return kvt_t0_create(r->dev, &shape, 96, &r->pool);
}

static void rig_close(rig *r)
{
	kvt_t0_destroy(r->pool);
	kvt_model_destroy(r->m);
	kvt_dev_destroy(r->dev);
	kvt_gguf_close(r->g);
}

static bool same(const float *a, const float *b, size_t n)
{
	return !memcmp(a, b, n * sizeof(float));
}

/* After s's prompt (logits in t->logits row 0): N_GEN greedy steps of kvt_model_forward. */
static void greedy_steps(rig *r, kvt_seq *s, trace *t)
{
	t->toks[0] = kvt_argmax(t->logits, r->V);
	for (int i = 1; i <= N_GEN; i++) {
		CHECK(kvt_model_forward(r->m, s, &t->toks[i - 1], 1, t->logits + (size_t)i * r->V, 1) == KVT_OK);
		t->toks[i] = kvt_argmax(t->logits + (size_t)i * r->V, r->V);
	}
}

/* Whether trace t is the reference's, bit for bit; a failure names the case. */
static void check_trace(const rig *r, const trace *ref, const trace *t, const char *model, const char *what)
{
	for (int i = 0; i <= N_GEN; i++) {
		if (!same(ref->logits + (size_t)i * r->V, t->logits + (size_t)i * r->V, r->V)) {
			CHECKF(0, "%s: %s: logits of step %d differ from the cold run's", model, what, i);
			return;
		}
	}
	CHECKF(!memcmp(ref->toks, t->toks, sizeof(ref->toks)), "%s: %s: greedy tokens differ", model, what);
}

/* The prompt in one forward on r, then the greedy steps. */
static void run_alone(rig *r, trace *t)
{
	kvt_seq s;
	CHECK(kvt_seq_init(&s, r->dev, r->pool, 1024) == KVT_OK);
	CHECK(kvt_model_forward(r->m, &s, prompt, N_PROMPT, t->logits, 1) == KVT_OK);
	greedy_steps(r, &s, t);
	kvt_seq_deinit(&s);
}

/* (a): the first n_blocks blocks of a cold sequence shared, the rest computed. */
static void run_cached(rig *r, uint32_t n_blocks, trace *t)
{
	kvt_seq cold, warm;
	float *scratch = malloc((size_t)r->V * sizeof(float));
	CHECK(kvt_seq_init(&cold, r->dev, r->pool, 1024) == KVT_OK);
	CHECK(kvt_seq_init(&warm, r->dev, r->pool, 1024) == KVT_OK);
	CHECK(kvt_model_forward(r->m, &cold, prompt, N_PROMPT, scratch, 1) == KVT_OK);
	CHECK(kvt_seq_share_prefix(&warm, &cold, n_blocks) == KVT_OK);
	kvt_seq_deinit(&cold); /* the blocks live on in warm */
	CHECK(kvt_model_forward(r->m, &warm, prompt + n_blocks * BT, N_PROMPT - n_blocks * BT, t->logits, 1) == KVT_OK);
	greedy_steps(r, &warm, t);
	kvt_seq_deinit(&warm);
	free(scratch);
}

/* (a) after a restart: the cold run's first n_blocks blocks as bytes into fresh slots of a new rig. */
static void run_restarted(const char *path, uint32_t n_blocks, trace *t)
{
	rig a, b;
	kvt_seq cold, warm;
	int32_t hold[5];
	CHECK(rig_open(&a, path, 2, 256) == KVT_OK);
	float *scratch = malloc((size_t)a.V * sizeof(float));
	const size_t bb = kvt_t0_block_bytes(a.pool);
	unsigned char *bytes = malloc(n_blocks * bb);
	CHECK(kvt_seq_init(&cold, a.dev, a.pool, 1024) == KVT_OK);
	CHECK(kvt_model_forward(a.m, &cold, prompt, N_PROMPT, scratch, 1) == KVT_OK);
	for (uint32_t i = 0; i < n_blocks; i++)
		kvt_dev_copy_d2h(a.dev, bytes + i * bb, (char *)kvt_t0_layout(a.pool)->pool + (size_t)cold.blocks[i] * bb, bb);
	kvt_seq_deinit(&cold);
	rig_close(&a);

	CHECK(rig_open(&b, path, 2, 256) == KVT_OK);
	for (int i = 0; i < 5; i++) /* other slots than the cold run's */
		CHECK(kvt_t0_alloc(b.pool, &hold[i]) == KVT_OK);
	CHECK(kvt_seq_init(&warm, b.dev, b.pool, 1024) == KVT_OK);
	for (uint32_t i = 0; i < n_blocks; i++) {
		CHECK(kvt_t0_alloc(b.pool, &warm.blocks[i]) == KVT_OK);
		CHECK(kvt_dev_copy_h2d(b.dev, (char *)kvt_t0_layout(b.pool)->pool + (size_t)warm.blocks[i] * bb,
				       bytes + i * bb, bb) == KVT_OK);
	}
	warm.n_blocks = n_blocks;
	warm.n_tokens = n_blocks * BT;
	warm.n_synced = 0; /* the next forward brings the device table in step */
	CHECK(kvt_model_forward(b.m, &warm, prompt + n_blocks * BT, N_PROMPT - n_blocks * BT, t->logits, 1) == KVT_OK);
	greedy_steps(&b, &warm, t);
	kvt_seq_deinit(&warm);
	for (int i = 0; i < 5; i++)
		kvt_t0_unref(b.pool, hold[i]);
	rig_close(&b);
	free(bytes), free(scratch);
}

/*
 * (b): the prompt and every greedy step in one kvt_model_forward_batch with
 * n_others other sequences of other lengths (their tokens arbitrary).
 */
static void run_batched(rig *r, uint32_t n_others, trace *t)
{
	kvt_seq seqs[MAX_OTHERS + 1];
	kvt_seq *sp[MAX_OTHERS + 1];
	uint32_t n[MAX_OTHERS + 1];
	bool want[MAX_OTHERS + 1];
	int32_t toks[256];
	float *logits = malloc((size_t)(MAX_OTHERS + 1) * r->V * sizeof(float));
	uint32_t at = 0;
	for (uint32_t i = 0; i <= n_others; i++) {
		CHECK(kvt_seq_init(&seqs[i], r->dev, r->pool, 1024) == KVT_OK);
		sp[i] = &seqs[i];
		want[i] = true;
		n[i] = i ? 2 + 5 * i : N_PROMPT; /* the target first, then 7 .. 37 tokens: 229 in all with 7 */
		for (uint32_t k = 0; k < n[i]; k++)
			toks[at + k] = i ? (int32_t)((k * 7919 + i * 104729) % r->V) : prompt[k];
		at += n[i];
	}
	CHECK(kvt_model_forward_batch(r->m, n_others + 1, sp, n, toks, want, logits) == KVT_OK);
	memcpy(t->logits, logits, (size_t)r->V * sizeof(float));
	t->toks[0] = kvt_argmax(t->logits, r->V);
	for (int s = 1; s <= N_GEN; s++) {
		/* the target decodes; the others append 1 to 3 tokens, so its row shares steps with prompt chunks */
		at = 0;
		for (uint32_t i = 0; i <= n_others; i++) {
			n[i] = i ? 1 + (i + (uint32_t)s) % 3 : 1;
			for (uint32_t k = 0; k < n[i]; k++)
				toks[at + k] = i ? (int32_t)((k * 31 + i * 7 + (uint32_t)s * 13) % r->V) : t->toks[s - 1];
			at += n[i];
		}
		CHECK(kvt_model_forward_batch(r->m, n_others + 1, sp, n, toks, want, logits) == KVT_OK);
		memcpy(t->logits + (size_t)s * r->V, logits, (size_t)r->V * sizeof(float));
		t->toks[s] = kvt_argmax(t->logits + (size_t)s * r->V, r->V);
	}
	for (uint32_t i = 0; i <= n_others; i++)
		kvt_seq_deinit(&seqs[i]);
	free(logits);
}

/* (b) through the device decode step: the greedy tokens with n_others other sequences beside. */
static void check_decode_step(rig *r, const trace *ref, uint32_t n_others, const char *model)
{
	kvt_seq seqs[4];
	kvt_seq *sp[4];
	int32_t tok[4], next[4];
	float *scratch = malloc((size_t)r->V * sizeof(float));
	for (uint32_t i = 0; i <= n_others; i++) {
		CHECK(kvt_seq_init(&seqs[i], r->dev, r->pool, 1024) == KVT_OK);
		sp[i] = &seqs[i];
		CHECK(kvt_model_forward(r->m, &seqs[i], prompt, i ? 20 + 11 * i : N_PROMPT, scratch, 1) == KVT_OK);
		tok[i] = i ? (int32_t)i : ref->toks[0];
	}
	for (int s = 1; s <= N_GEN; s++) {
		CHECK(kvt_model_decode(r->m, n_others + 1, sp, tok, NULL, NULL, next) == KVT_OK);
		CHECKF(next[0] == ref->toks[s], "%s: decode step %d beside %u others: token %d, cold run %d", model, s,
		       n_others, next[0], ref->toks[s]);
		memcpy(tok, next, sizeof(tok));
	}
	for (uint32_t i = 0; i <= n_others; i++)
		kvt_seq_deinit(&seqs[i]);
	free(scratch);
}

/*
 * The prompt: text where a reference file has some (tests/ref's prompts, ids
 * of this model's vocabulary, one after another from the first's BOS), else
 * ids spread over the vocabulary.
 */
static void make_prompt(const char *refs, uint32_t V)
{
	static char line[65536];
	FILE *f = refs ? fopen(refs, "r") : NULL;
	uint32_t n = 0;
	while (f && n < N_PROMPT && fgets(line, sizeof(line), f)) {
		int32_t ids[256];
		int k = line[0] == 'I' ? ref_parse_ids(line + 1, ids, 256, NULL) : 0;
		for (int i = n ? 1 : 0; i < k && n < N_PROMPT; i++) /* the BOS once */
			prompt[n++] = ids[i];
	}
	if (f)
		fclose(f);
	for (; n < N_PROMPT; n++)
		prompt[n] = (int32_t)((n * 2654435761u + 17) % (V - 300) + 200);
}

static void test_model(const char *path, const char *refs, const char *model)
{
	if (access(path, R_OK)) {
		printf("%s: %s missing, skipped\n", model, path);
		return;
	}
	n_models++;
	rig r2, r1, rc32, rc1;
	trace ref, t;
	CHECK(rig_open(&r2, path, 2, 256) == KVT_OK);
	const size_t bytes = (size_t)(N_GEN + 1) * r2.V * sizeof(float);
	ref.logits = malloc(bytes);
	t.logits = malloc(bytes);
	make_prompt(refs, r2.V);
	run_alone(&r2, &ref);
	printf("%s: cold greedy tokens %d %d %d %d %d %d %d\n", model, ref.toks[0], ref.toks[1], ref.toks[2],
	       ref.toks[3], ref.toks[4], ref.toks[5], ref.toks[6]);

	run_alone(&r2, &t);
	check_trace(&r2, &ref, &t, model, "a second cold run");
	for (uint32_t nb = 1; nb <= N_PROMPT / BT; nb += 3) { /* 1 and 4 blocks cached: a 59- and an 11-row suffix */
		char what[64];
		run_cached(&r2, nb, &t);
		snprintf(what, sizeof(what), "(a) %u blocks cached in T0", nb);
		check_trace(&r2, &ref, &t, model, what);
	}
	run_restarted(path, 3, &t);
	check_trace(&r2, &ref, &t, model, "(a) 3 blocks after a restart");
	static const uint32_t others[] = { 1, 3, 7 };
	for (int i = 0; i < 3; i++) {
		char what[64];
		run_batched(&r2, others[i], &t);
		snprintf(what, sizeof(what), "(b) batched with %u others", others[i]);
		check_trace(&r2, &ref, &t, model, what);
	}
	check_decode_step(&r2, &ref, 0, model);
	check_decode_step(&r2, &ref, 3, model);

	CHECK(rig_open(&r1, path, 1, 256) == KVT_OK);
	run_alone(&r1, &t);
	check_trace(&r1, &ref, &t, model, "(c) 1 thread");
	rig_close(&r1);
	CHECK(rig_open(&rc32, path, 2, 32) == KVT_OK);
	run_alone(&rc32, &t);
	check_trace(&rc32, &ref, &t, model, "(d) chunks of 32");
	rig_close(&rc32);
	CHECK(rig_open(&rc1, path, 2, 1) == KVT_OK);
	run_alone(&rc1, &t);
	check_trace(&rc1, &ref, &t, model, "(d) chunks of 1");
	rig_close(&rc1);

	rig_close(&r2);
	free(ref.logits), free(t.logits);
}

int main(void)
{
	test_model(KVT_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf", NULL, "SmolLM2-135M Q4_1");
	test_model(KVT_SOURCE_DIR "/models/gemma-3-270m-q4_k_m.gguf", KVT_SOURCE_DIR "/tests/ref/gemma3_greedy_ref.txt",
		   "Gemma 3 270M Q4_K_M");

	char dir[] = "/tmp/kvt_invariant_XXXXXX", path[64];
	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/shape1b.gguf", dir);
	kvt_synth_llama c;
	kvt_synth_llama_default(&c);
	c.n_layer = 2;
	c.n_embd = 2048;
	c.n_ff = 8192;
	c.n_head = 32;
	c.n_head_kv = 8;
	c.rope_base = 500000.0f;
	c.llama3_rope = 1;
	c.tied_embeddings = false;
	c.weight_type = KVT_GGML_Q4_K;
	c.q4_k_m_mix = true;
	c.seed = 49;
	CHECK(kvt_synth_llama_write(&c, path) == 0);
	test_model(path, NULL, "synthetic Llama 3.2 1B shape (2 layers) Q4_K_M");
	unlink(path);
	rmdir(dir);
	if (!n_models)
		return 77;
	return check_done("test_model_invariant");
}
