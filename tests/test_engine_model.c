/* ctest-labels: model */
/*
 * tests/test_engine_model.c — the engine on the real default model against
 * llama.cpp (tests/ref/greedy_ref.txt, made by tests/ref/gen_refs.py).
 *
 * For each reference prompt the engine runs the prompt ids, then is fed
 * llama.cpp's 16 greedy tokens one by one (teacher forcing), so the logits of
 * every step can be compared even if an argmax were to differ. Two references:
 *
 *  1. tests/ref/exact_ref.txt: the same forward pass in float64 numpy on the
 *     dequantized weights (tests/ref/exact_ref.py). Our logits must be within
 *     EXACT_TOL of it and our argmax must be its argmax (unless its own top two
 *     are within EXACT_TIE). What remains is our fp16 KV cache and fp32 math.
 *  2. tests/ref/greedy_ref.txt: llama.cpp. It multiplies Q4_1 weights with
 *     activations rounded to 8 bits, which moves its logits by up to ~1.3 from
 *     the exact values; so here the tolerance is LLAMA_TOL, and our argmax
 *     must equal llama.cpp's token unless llama.cpp's own logits make it a
 *     near tie (LLAMA_TIE) — the one way two correct engines diverge.
 * The largest differences seen are printed (and quoted in the issue notes).
 *
 * Then "The capital of France is", tokenized by our tokenizer, must continue
 * with " Paris".
 */
#include "check.h"
#include "generate.h"
#include "gguf.h"
#include "model.h"
#include "ref_read.h"
#include "tokenizer.h"

#define EXACT_TOL 0.05f
#define EXACT_TIE 0.02f
#define LLAMA_TOL 1.5f
#define LLAMA_TIE 0.5f
#define N_STEPS 16
#define MAX_TOP 20

typedef struct ref_case {
	char prompt[1024];        /* decoded P line */
	int32_t ids[512];         /* I line */
	uint32_t n_ids;           /* count */
	int32_t gen[N_STEPS];     /* G line */
	int32_t top_id[N_STEPS][10];  /* L lines: ids */
	float top_logit[N_STEPS][10]; /* L lines: logits */
	int32_t ex_id[N_STEPS][MAX_TOP];    /* E lines: ids, descending exact logit */
	float ex_logit[N_STEPS][MAX_TOP];   /* E lines: exact logits */
	int n_ex[N_STEPS];                  /* pairs per E line */
} ref_case;

static int load_refs(const char *path, ref_case *cases, int cap)
{
	FILE *f = fopen(path, "r");
	static char line[1 << 16];
	int n = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (line[0] == 'P' && n + 1 < cap) {
			ref_case *c = &cases[++n];
			memset(c, 0, sizeof(*c));
			size_t len = 0;
			for (const char *h = line + 2; h[0] && h[1] && h[0] != '\n' && len + 1 < sizeof(c->prompt); h += 2) {
				unsigned v;
				sscanf(h, "%2x", &v);
				c->prompt[len++] = (char)v;
			}
		} else if (line[0] == 'I' && n >= 0) {
			int k = ref_parse_ids(line + 1, cases[n].ids, 512, NULL);
			cases[n].n_ids = k > 0 ? (uint32_t)k : 0;
		} else if (line[0] == 'G' && n >= 0) {
			if (ref_parse_ids(line + 1, cases[n].gen, N_STEPS, NULL) != N_STEPS)
				return -1;
		} else if (line[0] == 'L' && n >= 0) {
			char *p = line + 1;
			long step = strtol(p, &p, 10);
			if (step < 0 || step >= N_STEPS)
				return -1;
			for (int j = 0; j < 10; j++) {
				cases[n].top_id[step][j] = (int32_t)strtol(p, &p, 10);
				if (*p++ != ':')
					return -1;
				cases[n].top_logit[step][j] = strtof(p, &p);
			}
		}
	}
	fclose(f);
	return n + 1;
}

/* E lines of exact_ref.txt into the cases already read; false on a format error. */
static bool load_exact(const char *path, ref_case *cases, int n_cases)
{
	FILE *f = fopen(path, "r");
	static char line[1 << 16];
	int n_lines = 0;
	if (!f)
		return false;
	while (fgets(line, sizeof(line), f)) {
		if (line[0] != 'E')
			continue;
		char *p = line + 1;
		long c = strtol(p, &p, 10), step = strtol(p, &p, 10);
		if (c < 0 || c >= n_cases || step < 0 || step >= N_STEPS)
			return false;
		ref_case *rc = &cases[c];
		int n = 0;
		while (n < MAX_TOP) {
			char *q;
			long id = strtol(p, &q, 10);
			if (q == p || *q != ':')
				break;
			rc->ex_id[step][n] = (int32_t)id;
			rc->ex_logit[step][n] = strtof(q + 1, &p);
			n++;
		}
		rc->n_ex[step] = n;
		n_lines++;
	}
	fclose(f);
	return n_lines == n_cases * N_STEPS;
}

/* llama.cpp's logit for id at a step, if id is in its top 10. */
static bool ref_logit(const ref_case *c, int step, int32_t id, float *out)
{
	for (int j = 0; j < 10; j++)
		if (c->top_id[step][j] == id) {
			*out = c->top_logit[step][j];
			return true;
		}
	return false;
}

static void run_cases(kvt_model *m, kvt_t0_pool *pool, kvt_dev *dev, ref_case *cases, int n_cases, const char *what)
{
	const uint32_t V = kvt_model_hparams_get(m)->n_vocab;
	float *logits = malloc(V * sizeof(float));
	float worst_llama = 0, worst_exact = 0;
	int n_match = 0, n_ex_match = 0, n_steps = 0, n_tie = 0;

	for (int i = 0; i < n_cases; i++) {
		ref_case *c = &cases[i];
		kvt_seq s;
		kvt_seq_init(&s, dev, pool, 1024);
		CHECK(kvt_model_forward(m, &s, c->ids, c->n_ids, logits, 1) == KVT_OK);
		for (int step = 0; step < N_STEPS; step++) {
			int32_t ours = kvt_argmax(logits, V);
			n_steps++;
			/* against the exact forward pass */
			for (int j = 0; j < c->n_ex[step]; j++)
				worst_exact = fmaxf(worst_exact, fabsf(logits[c->ex_id[step][j]] - c->ex_logit[step][j]));
			float ex_margin = c->n_ex[step] > 1 ? c->ex_logit[step][0] - c->ex_logit[step][1] : 1e9f;
			if (ours == c->ex_id[step][0])
				n_ex_match++;
			else
				CHECKF(ex_margin < EXACT_TIE, "%s: prompt %d step %d: ours %d, exact %d (exact margin %.4f)",
				       what, i, step, ours, c->ex_id[step][0], ex_margin);
			/* against llama.cpp */
			if (ours == c->gen[step]) {
				n_match++;
			} else {
				float lo = 0, lr = 0;
				bool known = ref_logit(c, step, ours, &lo) && ref_logit(c, step, c->gen[step], &lr);
				CHECKF(known && lr - lo < LLAMA_TIE,
				       "%s: prompt %d step %d: ours %d, llama.cpp %d (llama.cpp margin %.3f)", what, i, step,
				       ours, c->gen[step], known ? lr - lo : -1.0f);
				n_tie += known && lr - lo < LLAMA_TIE;
			}
			for (int j = 0; j < 10; j++)
				worst_llama = fmaxf(worst_llama, fabsf(logits[c->top_id[step][j]] - c->top_logit[step][j]));
			if (step + 1 < N_STEPS)
				CHECK(kvt_model_forward(m, &s, &c->gen[step], 1, logits, 1) == KVT_OK);
		}
		kvt_seq_deinit(&s);
	}
	printf("%s: vs exact float64: %d/%d argmax equal, max |logit diff| %.4f\n", what, n_ex_match, n_steps,
	       worst_exact);
	printf("%s: vs llama.cpp: %d/%d greedy steps equal (%d near ties in llama.cpp's logits), "
	       "max |logit diff| on its top-10 %.4f\n", what, n_match, n_steps, n_tie, worst_llama);
	CHECKF(worst_exact < EXACT_TOL, "%s: logits differ from the exact ones by %.4f", what, worst_exact);
	CHECKF(worst_llama < LLAMA_TOL, "%s: logits differ from llama.cpp's by %.4f", what, worst_llama);
	free(logits);
}

typedef struct text_acc {
	const kvt_tok *tok;      /* borrowed */
	kvt_tok_stream st;       /* stream state */
	char text[4096];         /* decoded output */
	size_t len;              /* bytes in text */
} text_acc;

static int on_token(int32_t id, void *user)
{
	text_acc *a = user;
	size_t n = 0;
	if (a->len + 512 < sizeof(a->text))
		kvt_tok_stream_push(a->tok, &a->st, id, a->text + a->len, sizeof(a->text) - a->len, &n);
	a->len += n;
	a->text[a->len] = 0;
	return 0;
}

int main(void)
{
	const char *path = check_default_model();
	static ref_case cases[16];
	char ref_path[4096];
	kvt_gguf *g;
	kvt_tok *tok;
	kvt_dev *dev;

	if (!path)
		return check_skip("test_engine_model", "default model not fetched (scripts/fetch_model.sh)");
	snprintf(ref_path, sizeof(ref_path), "%s/tests/ref/greedy_ref.txt", KVT_SOURCE_DIR);
	int n_cases = load_refs(ref_path, cases, 16);
	CHECKF(n_cases >= 5, "need >= 5 reference prompts in %s, got %d", ref_path, n_cases);
	snprintf(ref_path, sizeof(ref_path), "%s/tests/ref/exact_ref.txt", KVT_SOURCE_DIR);
	bool ex_ok = n_cases >= 5 && load_exact(ref_path, cases, n_cases);
	CHECKF(ex_ok, "cannot read %s", ref_path);
	if (!ex_ok)
		return check_done("test_engine_model");

	kvt_dev_config dc = { .kind = KVT_DEV_CPU };
	if (kvt_gguf_open(path, &g) || kvt_tok_create_from_gguf(g, &tok) || kvt_dev_create(&dc, &dev))
		return 1;
	for (int w = 0; w < 2; w++) {
		kvt_model_config mc;
		kvt_model *m;
		kvt_t0_pool *pool;
		kvt_kv_layout shape;
		kvt_model_config_default(&mc);
		/* the default (Q4_1/Q8_0 kept as stored), then everything dequantized to fp32 */
		mc.weight_dtype = w ? KVT_DTYPE_F32 : KVT_DTYPE_F16;
		mc.keep_quantized = !w;
		mc.max_ctx = 1024;
		CHECK(kvt_model_load(dev, g, &mc, &m) == KVT_OK);
		kvt_model_kv_shape(m, 16, &shape);
		CHECK(kvt_t0_create(dev, &shape, 64, &pool) == KVT_OK);
		run_cases(m, pool, dev, cases, n_cases, w ? "fp32 weights" : "native weights");

		if (!w) {
			/* end to end, through our tokenizer: Paris */
			const char *prompt = "The capital of France is";
			int32_t ids[64];
			size_t n = 0;
			CHECK(kvt_tok_encode(tok, prompt, strlen(prompt), true, ids, 64, &n) == KVT_OK);
			kvt_seq s;
			kvt_seq_init(&s, dev, pool, 1024);
			kvt_gen_params gp = { .n_predict = 8, .stop_at_eog = true };
			kvt_gen_stats gs;
			text_acc acc = { .tok = tok };
			kvt_tok_stream_init(&acc.st);
			CHECK(kvt_generate(m, &s, tok, ids, (uint32_t)n, &gp, on_token, &acc, &gs) == KVT_OK);
			printf("\"%s\" -> \"%s\"\n", prompt, acc.text);
			CHECKF(strncmp(acc.text, " Paris", 6) == 0, "continuation is \"%s\"", acc.text);
			kvt_seq_deinit(&s);
		}
		kvt_t0_destroy(pool);
		kvt_model_destroy(m);
	}
	kvt_dev_destroy(dev);
	kvt_tok_destroy(tok);
	kvt_gguf_close(g);
	return check_done("test_engine_model");
}
