/*
 * bench/bench_grammar.c — grammar-constrained decoding against plain decoding
 * on the same model, in the same run.
 *
 *   bench_grammar [--model M] [--gen-tokens 64] [--reps 3] [--threads N]
 *
 * The prompt is a chat turn asking for a person as JSON (the default model's
 * template). Per rep: greedy decode of --gen-tokens steps unconstrained, then
 * the same prompt constrained by a JSON Schema (the person schema below,
 * compiled as the server does, structured.h) through kvt_sampler_next, which
 * stops when the grammar has ended (the EOG token). tokens/s counts decode
 * steps (forward + sampling + mask) only; the ratio is constrained /
 * unconstrained, median over reps after one warm-up.
 *
 * Then the same twice more sampled (temperature 0.7, top_p 0.9, seeded): with
 * a top_p cut the mask cannot be skipped, so every constrained token pays
 * one (from the per-state cache or a walk).
 *
 * Mask time: the matcher's own clock over the constrained run (masks needed
 * when the greedy token is refused, cached by state or walked), per token;
 * and the cost of one full walk of the vocabulary trie with the cache cold,
 * at every position of the constrained output (a fresh matcher fed the
 * output so far), median and max: what a token costs when nothing is reused.
 * Prints one JSON object.
 */
#include "gguf.h"
#include "grammar.h"
#include "model.h"
#include "sampler.h"
#include "structured.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static const char SCHEMA[] =
	"{\"type\": \"object\", \"additionalProperties\": false, \"required\": [\"name\", \"age\", \"email\", \"hobbies\"],"
	" \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"},"
	" \"email\": {\"type\": \"string\"}, \"hobbies\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}}";

int main(int argc, char **argv)
{
	const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
	int threads = 0, n_gen = 64, reps = 3;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--model")) model = argv[i + 1];
		else if (!strcmp(argv[i], "--gen-tokens")) n_gen = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
		else {
			fprintf(stderr, "bench_grammar: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (reps < 1 || reps > 100 || n_gen < 1 || n_gen > 1024) {
		fprintf(stderr, "usage: bench_grammar [--model M] [--gen-tokens N] [--reps N] [--threads N]\n");
		return 2;
	}
	kvt_gguf *g;
	kvt_dev *dev;
	kvt_model *m;
	kvt_tok *tok;
	kvt_t0_pool *pool;
	kvt_kv_layout shape;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = threads };
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_batch = 256;
	mc.max_ctx = 256 + (uint32_t)n_gen;
	if (kvt_gguf_open(model, &g) || kvt_dev_create(&dc, &dev) || kvt_model_load(dev, g, &mc, &m) ||
	    kvt_tok_create_from_gguf(g, &tok))
		return 1;
	kvt_gguf_close(g);
	kvt_model_kv_shape(m, 16, &shape);
	if (kvt_t0_create(dev, &shape, (mc.max_ctx + 15) / 16 + 1, &pool))
		return 1;
	const uint32_t V = kvt_model_hparams_get(m)->n_vocab;
	double t_trie = kvt_now_s();
	kvt_vocab_trie *trie;
	if (kvt_vocab_trie_create(tok, V, &trie))
		return 1;
	t_trie = kvt_now_s() - t_trie;

	json_error_t jerr;
	json_t *schema = json_loads(SCHEMA, 0, &jerr);
	char *text;
	kvt_req_err oe;
	kvt_grammar *gr;
	char err[256];
	if (!schema || kvt_schema_grammar(schema, "schema", &text, &oe) ||
	    kvt_grammar_compile(text, strlen(text), "root", &gr, err, sizeof(err))) {
		fprintf(stderr, "bench_grammar: schema: %s %s\n", oe.message, err);
		return 1;
	}
	free(text);
	json_decref(schema);

	kvt_chat_msg msg = { .role = "user", .content = "Describe a person (name, age, email, hobbies) as JSON." };
	int32_t *prompt;
	size_t n_prompt;
	if (kvt_tok_chat_encode(tok, &msg, 1, true, &prompt, &n_prompt))
		return 1;
	float *logits = malloc(V * sizeof(float));
	int32_t *out = malloc((size_t)n_gen * sizeof(int32_t));
	double rate_u[101], rate_c[101], mask_tok[101], srate_u[101], srate_c[101], smask_tok[101];
	int n_out = 0, n_sout = 0;
	kvt_gmatch_stats last = { 0 }, slast = { 0 };
	kvt_seq s;
	kvt_seq_init(&s, dev, pool, mc.max_ctx);
	for (int r = 0; r <= reps; r++) { /* rep 0 is the warm-up */
		for (int mode = 0; mode < 4; mode++) {
			/* 0, 1: greedy plain / constrained; 2, 3: sampled (T 0.7, top_p 0.9: a mask every token) */
			const bool constrained = mode & 1, sampled = mode >= 2;
			kvt_sampler smp;
			kvt_sampler_params sp = { 0 };
			if (sampled) {
				sp.temp = 0.7f;
				sp.top_p = 0.9f;
				sp.seed = 1000 + (uint64_t)r;
			}
			kvt_gmatch *gm = NULL;
			kvt_sampler_init(&smp, &sp, V);
			if (constrained && kvt_gmatch_create(gr, trie, &gm))
				return 1;
			kvt_seq_reset(&s);
			if (kvt_model_forward(m, &s, prompt, (uint32_t)n_prompt, logits, 1))
				return 1;
			int n = 0;
			double t0 = kvt_now_s();
			for (; n < n_gen; n++) {
				int32_t next = kvt_sampler_next(&smp, logits, gm, NULL, 0);
				if (next < 0 || kvt_tok_is_eog(tok, next))
					break;
				if (constrained && !sampled)
					out[n] = next;
				if (kvt_model_forward(m, &s, &next, 1, logits, 1))
					return 1;
			}
			double dt = kvt_now_s() - t0;
			if (constrained && !sampled) {
				rate_c[r] = n / dt;
				kvt_gmatch_get_stats(gm, &last);
				mask_tok[r] = last.mask_s / (n ? n : 1);
				n_out = n;
			} else if (constrained) {
				srate_c[r] = n / dt;
				kvt_gmatch_get_stats(gm, &slast);
				smask_tok[r] = slast.mask_s / (n ? n : 1);
				n_sout = n;
			} else if (sampled) {
				srate_u[r] = n / dt;
			} else {
				rate_u[r] = n / dt;
			}
			kvt_gmatch_destroy(gm);
			kvt_sampler_deinit(&smp);
		}
	}
	/* a cold mask (fresh matcher, no cache) at every position of the constrained output */
	uint64_t *allow = malloc((V + 63) / 64 * sizeof(uint64_t));
	double *cold = malloc((size_t)(n_out + 1) * sizeof(double));
	for (int i = 0; i <= n_out; i++) {
		kvt_gmatch *gm;
		kvt_gmatch_create(gr, trie, &gm);
		for (int k = 0; k < i; k++)
			kvt_gmatch_accept(gm, out[k]);
		double t0 = kvt_now_s();
		kvt_gmatch_mask(gm, allow);
		cold[i] = kvt_now_s() - t0;
		if (getenv("KVT_BENCH_TRACE"))
			fprintf(stderr, "cold mask at %d: %.2f ms\n", i, cold[i] * 1e3);
		kvt_gmatch_destroy(gm);
	}
	double cold_max = 0, cold_sum = 0;
	for (int i = 0; i <= n_out; i++) {
		cold_max = cold[i] > cold_max ? cold[i] : cold_max;
		cold_sum += cold[i];
	}
	double u = median(rate_u + 1, reps), c = median(rate_c + 1, reps), mt = median(mask_tok + 1, reps);
	double su = median(srate_u + 1, reps), sc = median(srate_c + 1, reps), smt = median(smask_tok + 1, reps);
	double cold_med = median(cold, n_out + 1);
	char shown[512];
	size_t ns = 0;
	for (int i = 0; i < n_out && ns + 64 < sizeof(shown); i++) {
		const char *b;
		size_t n;
		kvt_tok_token_bytes(tok, out[i], &b, &n);
		for (size_t k = 0; k < n && ns + 2 < sizeof(shown); k++)
			shown[ns++] = b[k] == '\n' ? ' ' : b[k] == '"' ? '\'' : b[k];
	}
	shown[ns] = 0;
	printf("{\"bench\": \"grammar\", \"threads\": %d, \"n_prompt\": %zu, \"gen_tokens\": %d, \"constrained_tokens\": %d,"
	       " \"unconstrained_tok_s\": %.2f, \"constrained_tok_s\": %.2f, \"ratio\": %.3f,"
	       " \"mask_ms_per_token\": %.3f, \"masks\": %llu, \"masks_cached\": %llu, \"fast_path_tokens\": %llu,"
	       " \"sampled_unconstrained_tok_s\": %.2f, \"sampled_constrained_tok_s\": %.2f, \"sampled_ratio\": %.3f,"
	       " \"sampled_constrained_tokens\": %d, \"sampled_mask_ms_per_token\": %.3f, \"sampled_masks\": %llu,"
	       " \"sampled_masks_cached\": %llu,"
	       " \"cold_mask_ms_median\": %.2f, \"cold_mask_ms_mean\": %.2f, \"cold_mask_ms_max\": %.2f, \"trie_build_ms\": %.1f, \"output\": \"%s\"}\n",
	       kvt_dev_n_threads(dev), n_prompt, n_gen, n_out, u, c, c / u, mt * 1e3, (unsigned long long)last.n_masks,
	       (unsigned long long)last.n_cached, (unsigned long long)last.n_fast, su, sc, sc / su, n_sout, smt * 1e3,
	       (unsigned long long)slast.n_masks, (unsigned long long)slast.n_cached, cold_med * 1e3, cold_sum / (n_out + 1) * 1e3, cold_max * 1e3,
	       t_trie * 1e3, shown);
	free(cold);
	free(allow);
	kvt_seq_deinit(&s);
	free(out);
	free(logits);
	free(prompt);
	kvt_grammar_unref(gr);
	kvt_vocab_trie_destroy(trie);
	kvt_t0_destroy(pool);
	kvt_tok_destroy(tok);
	kvt_model_destroy(m);
	kvt_dev_destroy(dev);
	return 0;
}
