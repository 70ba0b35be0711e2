/* ctest-labels: unit */
/*
 * tests/test_grammar.c — the grammar compiler, the pushdown matcher, the
 * vocabulary mask and the sampler's controls (grammar.h, sampler.h).
 *
 * Without a vocabulary: compile errors name the line and the fault (syntax,
 * undefined rule, left recursion, a repetition of something empty); a JSON
 * grammar accepts valid documents byte by byte and refuses invalid ones at
 * the first bad byte; repetition counts {m,n} hold exactly; the end is
 * allowed only where the grammar may end.
 * With the default model's tokenizer (skipped if it is absent): the mask
 * equals a token-by-token check of every id in several states; constrained
 * sampling (greedy and seeded draws, with and without top-p, on random
 * logits) always produces text the grammar accepts, ended by an EOG token.
 * The sampler: presence / frequency / repetition penalties, logit_bias
 * (including -100 bans), min_p, and logprobs equal to a log-softmax computed
 * here.
 */
#include "check.h"
#include "gguf.h"
#include "grammar.h"
#include "sampler.h"
#include "tokenizer.h"

static const char JSON_G[] =
	"root ::= value\n"
	"value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
	"object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n"
	"array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
	"string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt] )* \"\\\"\"\n"
	"number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )?\n"
	"ws ::= [ \\t\\n]{0,4}\n";

static bool accepts(const kvt_grammar *g, const char *s)
{
	kvt_gmatch *m;
	if (kvt_gmatch_create(g, NULL, &m))
		return false;
	bool ok = kvt_gmatch_feed(m, s, strlen(s)) && kvt_gmatch_can_end(m);
	kvt_gmatch_destroy(m);
	return ok;
}

static void compile_errors(void)
{
	struct {
		const char *text, *needle;
	} bad[] = {
		{ "root ::= foo\n", "foo is used but not defined" },
		{ "root ::= root \"a\" | \"b\"\n", "left recursion" },
		{ "root ::= (\"a\"?)*\n", "start with itself" },
		{ "root ::= \"a\n", "newline inside" },
		{ "root ::= [b-a]\n", "backwards" },
		{ "root ::= \"a\" )\n", "')' without '('" },
		{ "a ::= \"x\"\n", "no rule named root" },
		{ "root ::= \"a\"\nroot ::= \"b\"\n", "defined twice" },
		{ "root ::= \"a\"{3,2}\n", "backwards" },
		{ "root ::= \"\\q\"\n", "unknown escape" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		kvt_grammar *g = (kvt_grammar *)1;
		char err[256];
		int rc = kvt_grammar_compile(bad[i].text, strlen(bad[i].text), "root", &g, err, sizeof(err));
		CHECKF(rc == KVT_EINVAL && g == NULL, "%s: rc %d", bad[i].text, rc);
		CHECKF(strstr(err, bad[i].needle) && strstr(err, "line "), "%s: error '%s'", bad[i].text, err);
	}
}

static void json_strings(void)
{
	kvt_grammar *g;
	char err[256];
	CHECK(kvt_grammar_compile(JSON_G, strlen(JSON_G), "root", &g, err, sizeof(err)) == KVT_OK);
	const char *good[] = { "{}", "[]", "0", "-12.5", "\"a\\\"b\"", "{\"a\": [1, 2, {\"b\": null}], \"c\": true}",
			       "[\n  \"x\",\n  false\n]", "\"\xc3\xa9\"" };
	const char *badv[] = { "{", "{\"a\" 1}", "01", "[1,]", "\"a", "tru", "{\"a\": 1,}", "\"\x01\"", "1.",
			       "[     1]" /* five spaces: ws is {0,4} */ };
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		CHECKF(accepts(g, good[i]), "refused %s", good[i]);
	for (size_t i = 0; i < sizeof(badv) / sizeof(badv[0]); i++)
		CHECKF(!accepts(g, badv[i]), "accepted %s", badv[i]);
	/* the first bad byte is refused and leaves the state as it was */
	kvt_gmatch *m;
	CHECK(kvt_gmatch_create(g, NULL, &m) == KVT_OK);
	CHECK(kvt_gmatch_feed(m, "{\"k\": ", 6));
	CHECK(!kvt_gmatch_can_end(m));
	CHECK(!kvt_gmatch_feed(m, "}", 1));
	CHECK(kvt_gmatch_feed(m, "7}", 2));
	CHECK(kvt_gmatch_can_end(m) && kvt_gmatch_must_end(m));
	kvt_gmatch_destroy(m);
	/* deep nesting: the stack grows, and comes back */
	char deep[2100];
	for (int i = 0; i < 1000; i++)
		deep[i] = '[';
	for (int i = 0; i < 1000; i++)
		deep[1000 + i] = ']';
	deep[2000] = 0;
	CHECK(accepts(g, deep));
	deep[1999] = 0;
	CHECK(!accepts(g, deep));
	kvt_grammar *g2 = kvt_grammar_ref(g);
	kvt_grammar_unref(g);
	CHECK(accepts(g2, "[true]"));
	kvt_grammar_unref(g2);

	/* groups nested too deep are refused, not recursed into */
	char nest[1200];
	size_t k = (size_t)snprintf(nest, sizeof(nest), "root ::= ");
	for (int i = 0; i < 300; i++)
		nest[k++] = '(';
	k += (size_t)snprintf(nest + k, sizeof(nest) - k, "\"a\"");
	for (int i = 0; i < 300; i++)
		nest[k++] = ')';
	nest[k] = 0;
	CHECK(kvt_grammar_compile(nest, k, "root", &g, err, sizeof(err)) == KVT_EINVAL && strstr(err, "nest deeper"));

	/* exact counts */
	const char *rep = "root ::= \"a\"{2,3} \"b\"{2} \"c\"{1,}\n";
	CHECK(kvt_grammar_compile(rep, strlen(rep), "root", &g, err, sizeof(err)) == KVT_OK);
	CHECK(accepts(g, "aabbc") && accepts(g, "aaabbccc"));
	CHECK(!accepts(g, "abbc") && !accepts(g, "aaaabbc") && !accepts(g, "aabbbc") && !accepts(g, "aabb"));
	kvt_grammar_unref(g);
}

/* ---- with the model's vocabulary ---- */

static void check_mask(kvt_gmatch *m, uint32_t n_vocab, uint64_t *allow, const char *where)
{
	uint32_t n = kvt_gmatch_mask(m, allow), n_check = 0, bad = 0;
	for (uint32_t id = 0; id < n_vocab; id++) {
		bool a = allow[id >> 6] >> (id & 63) & 1;
		n_check += a;
		if (a != kvt_gmatch_allows(m, (int32_t)id) && bad++ < 3)
			fprintf(stderr, "%s: token %u: mask %d, check %d\n", where, id, a, !a);
	}
	CHECKF(!bad && n == n_check && n > 0, "%s: %u disagreements, %u allowed (%u counted)", where, bad, n, n_check);
}

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)(rng >> 40) / 16777216.0f;
}

static void with_vocab(void)
{
	const char *path = KVT_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
	kvt_gguf *gg;
	kvt_tok *tok;
	if (kvt_gguf_open(path, &gg) != KVT_OK) {
		printf("no default model: vocabulary checks skipped\n");
		return;
	}
	CHECK(kvt_tok_create_from_gguf(gg, &tok) == KVT_OK);
	uint32_t nv = kvt_tok_n_vocab(tok);
	kvt_vocab_trie *trie;
	CHECK(kvt_vocab_trie_create(tok, nv, &trie) == KVT_OK);
	kvt_grammar *g;
	char err[256];
	CHECK(kvt_grammar_compile(JSON_G, strlen(JSON_G), "root", &g, err, sizeof(err)) == KVT_OK);
	uint64_t *allow = calloc((nv + 63) / 64, 8);
	kvt_gmatch *m;
	CHECK(kvt_gmatch_create(g, trie, &m) == KVT_OK);
	const char *prefixes[] = { "", "{", "{\"na", "{\"name\": ", "{\"name\": \"x", "[1, 2", "[\"a\\", "[\"\xc3", "[1, 2]" };
	int32_t eog = kvt_tok_eos(tok);
	for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
		kvt_gmatch *p;
		CHECK(kvt_gmatch_create(g, trie, &p) == KVT_OK);
		CHECK(kvt_gmatch_feed(p, prefixes[i], strlen(prefixes[i])));
		check_mask(p, nv, allow, prefixes[i]);
		bool eog_ok = allow[eog >> 6] >> (eog & 63) & 1;
		CHECKF(eog_ok == (i == 8), "'%s': end of generation allowed %d", prefixes[i], eog_ok);
		kvt_gmatch_destroy(p);
	}
	kvt_gmatch_destroy(m);

	/* constrained sampling on random logits always stays in the grammar */
	float *logits = malloc(nv * sizeof(float));
	for (int run = 0; run < 6; run++) {
		kvt_sampler s;
		kvt_sampler_params sp = { .temp = run < 2 ? 0.0f : 1.0f, .top_p = run >= 4 ? 0.9f : 1.0f, .seed = 7 + run };
		CHECK(kvt_sampler_init(&s, &sp, nv) == KVT_OK);
		CHECK(kvt_gmatch_create(g, trie, &m) == KVT_OK);
		char out[4096];
		size_t n_out = 0;
		bool ended = false;
		for (int step = 0; step < 200 && !ended; step++) {
			for (uint32_t i = 0; i < nv; i++)
				logits[i] = 4 * frand();
			if (step > 60) /* push towards the end: closing brackets, then EOG */
				logits[eog] = 30;
			int32_t t = kvt_sampler_next(&s, logits, m, NULL, 0);
			CHECK(t >= 0);
			if (t < 0)
				break;
			if (kvt_tok_is_eog(tok, t)) {
				ended = true;
				break;
			}
			const char *b;
			size_t n;
			kvt_tok_token_bytes(tok, t, &b, &n);
			if (n_out + n < sizeof(out)) {
				memcpy(out + n_out, b, n);
				n_out += n;
			}
		}
		out[n_out] = 0;
		kvt_gmatch_stats st;
		kvt_gmatch_get_stats(m, &st);
		if (ended) {
			CHECKF(accepts(g, out), "run %d: output leaves the grammar: %s", run, out);
		} else { /* cut at 200 tokens: a prefix the grammar can go on from */
			kvt_gmatch *p;
			CHECK(kvt_gmatch_create(g, NULL, &p) == KVT_OK);
			CHECKF(kvt_gmatch_feed(p, out, n_out) && !kvt_gmatch_can_end(p), "run %d: not a prefix: %s", run, out);
			kvt_gmatch_destroy(p);
		}
		printf("run %d: %zu bytes, ended %d, %llu masks (%llu cached), %llu fast, %.2f ms/mask: %.60s\n", run,
		       n_out, ended, (unsigned long long)st.n_masks, (unsigned long long)st.n_cached,
		       (unsigned long long)st.n_fast,
		       st.n_masks ? st.mask_s * 1e3 / (double)st.n_masks : 0.0, out);
		kvt_gmatch_destroy(m);
		kvt_sampler_deinit(&s);
	}
	free(logits);
	free(allow);
	kvt_grammar_unref(g);
	kvt_vocab_trie_destroy(trie);
	kvt_tok_destroy(tok);
	kvt_gguf_close(gg);
}

/* ---- sampler controls ---- */

#define V 8

static void sampler_controls(void)
{
	const float base[V] = { 1.0f, 3.0f, 0.5f, 2.9f, -2.0f, 2.0f, 0.0f, 1.5f };
	float l[V];
	kvt_sampler s;
	kvt_sampler_params p;

	/* frequency penalty: token 1 is taken, then its logit drops by 1 per use; 3 takes over */
	memset(&p, 0, sizeof(p));
	p.frequency_penalty = 0.2f;
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_OK);
	memcpy(l, base, sizeof(l));
	CHECK_EQ_INT(kvt_sampler_next(&s, l, NULL, NULL, 0), 1);
	memcpy(l, base, sizeof(l));
	CHECK_EQ_INT(kvt_sampler_next(&s, l, NULL, NULL, 0), 3); /* 3.0 - 0.2 < 2.9 */
	memcpy(l, base, sizeof(l));
	CHECK_EQ_INT(kvt_sampler_next(&s, l, NULL, NULL, 0), 1); /* 2.8 vs 2.7 */
	CHECKF(fabsf(l[1] - 2.8f) < 1e-6f && fabsf(l[3] - 2.7f) < 1e-6f, "penalised %g %g", l[1], l[3]);
	kvt_sampler_deinit(&s);

	/* presence penalty: once, whatever the count */
	memset(&p, 0, sizeof(p));
	p.presence_penalty = 0.5f;
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_OK);
	for (int i = 0; i < 3; i++) {
		memcpy(l, base, sizeof(l));
		kvt_sampler_next(&s, l, NULL, NULL, 0);
	}
	CHECKF(fabsf(l[1] - 2.5f) < 1e-6f && fabsf(l[3] - 2.4f) < 1e-6f && l[5] == 2.0f, "presence %g %g %g", l[1],
	       l[3], l[5]);
	kvt_sampler_deinit(&s);

	/* repetition penalty over the prompt: a positive logit divided, a negative one multiplied */
	memset(&p, 0, sizeof(p));
	p.repetition_penalty = 2.0f;
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_OK);
	const int32_t prompt[] = { 1, 4 };
	kvt_sampler_prompt(&s, prompt, 2);
	memcpy(l, base, sizeof(l));
	CHECK_EQ_INT(kvt_sampler_next(&s, l, NULL, NULL, 0), 3);
	CHECKF(l[1] == 1.5f && l[4] == -4.0f, "repetition %g %g", l[1], l[4]);
	kvt_sampler_deinit(&s);

	/* logit_bias: +2 on 6 makes it the greedy choice; -100 bans 1 even at high temperature */
	memset(&p, 0, sizeof(p));
	p.n_bias = 1;
	p.bias[0] = (kvt_logit_bias){ 6, 3.5f };
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_OK);
	memcpy(l, base, sizeof(l));
	CHECK_EQ_INT(kvt_sampler_next(&s, l, NULL, NULL, 0), 6);
	kvt_sampler_deinit(&s);
	memset(&p, 0, sizeof(p));
	p.temp = 2.0f;
	p.seed = 5;
	p.n_bias = 1;
	p.bias[0] = (kvt_logit_bias){ 1, -100 };
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_OK);
	int n1 = 0;
	for (int i = 0; i < 3000; i++) {
		memcpy(l, base, sizeof(l));
		n1 += kvt_sampler_next(&s, l, NULL, NULL, 0) == 1;
	}
	CHECK_EQ_INT(n1, 0);
	kvt_sampler_deinit(&s);
	p.bias[0].id = V;
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_EINVAL);

	/* min_p 0.5: only tokens with at least half the best one's probability (1 and 3 at T = 1) */
	memset(&p, 0, sizeof(p));
	p.temp = 1.0f;
	p.min_p = 0.5f;
	p.seed = 9;
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_OK);
	int seen[V] = { 0 };
	for (int i = 0; i < 3000; i++) {
		memcpy(l, base, sizeof(l));
		seen[kvt_sampler_next(&s, l, NULL, NULL, 0)]++;
	}
	CHECKF(seen[1] + seen[3] == 3000 && seen[1] > 1200 && seen[3] > 1200, "min_p drew 1:%d 3:%d", seen[1], seen[3]);
	kvt_sampler_deinit(&s);
	p.min_p = 1.5f;
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_EINVAL);

	/* logprobs: raw log-softmax, top list in order, whatever the penalties did */
	memset(&p, 0, sizeof(p));
	p.frequency_penalty = 2.0f;
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_OK);
	double z = 0;
	for (int i = 0; i < V; i++)
		z += exp(base[i]);
	for (int step = 0; step < 3; step++) {
		kvt_token_lp lp;
		memcpy(l, base, sizeof(l));
		int32_t t = kvt_sampler_next(&s, l, NULL, &lp, 4);
		CHECKF(lp.id == t && fabs(lp.logprob - (base[t] - log(z))) < 1e-5, "step %d: token %d logprob %g", step,
		       t, lp.logprob);
		CHECK(lp.n_top == 4 && lp.top_id[0] == 1 && lp.top_id[1] == 3 && lp.top_id[2] == 5 && lp.top_id[3] == 7);
		CHECK(fabs(lp.top_lp[0] - (3.0 - log(z))) < 1e-5);
		if (step == 0)
			CHECK(lp.logprob == lp.top_lp[0]); /* greedy: the chosen one is the most likely */
	}
	kvt_sampler_deinit(&s);
}

int main(void)
{
	compile_errors();
	json_strings();
	sampler_controls();
	with_vocab();
	return check_done("test_grammar");
}
