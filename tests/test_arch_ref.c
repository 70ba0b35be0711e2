/* ctest-labels: unit */
/*
 * tests/test_arch_ref.c — every architecture of engine/model/arch.c on a tiny
 * synthetic GGUF of its family (synth_model.c), against references:
 *
 *  1. tests/ref/arch_ref.txt: llama.cpp's logits on the very same files
 *     (tests/ref/gen_arch_refs.py, llama-cpp-python 0.3.16, which runs this
 *     binary with --write DIR to get them). Tolerance: see tests/ref/README.md.
 *  2. tests/ref/arch_exact_ref.txt: a float64 numpy forward pass of the gemma3
 *     file (tests/ref/exact_arch_ref.py) with K/V rounded to fp16 as stored.
 *  3. Within kvtier, per family: one prefill of the whole prompt, prefill in
 *     chunks of 5, token-by-token decode, and a prompt continued from shared
 *     (cached) blocks of another sequence all give the same logits (the KV
 *     store's blocks mean the same thing however they were made).
 *
 * The files (F32 weights, loaded as fp32 so only the fp16 K/V round):
 *   llama3: Llama with rope.scaling llama3 and rope_freqs.weight, untied output;
 *   qwen2:  Q/K/V biases;  qwen3: Q/K norms, head_dim 32 over a width of 64;
 *   gemma3: 6 layers (5 local, 1 global), window 8, head_dim 32, one KV head.
 * The prompt is 40 tokens, so gemma3's window cuts in long before the end.
 */
#include "check.h"
#include "dev.h"
#include "gguf.h"
#include "model.h"
#include "synth_model.h"
#include "tiers.h"

#include <unistd.h>

#define N_PROMPT 40
#define MAX_ROWS 16

typedef struct fam {
	const char *name; /* file and reference name */
	kvt_synth_llama cfg;
} fam;

static void families(fam f[4])
{
	for (int i = 0; i < 4; i++)
		kvt_synth_llama_default(&f[i].cfg);
	f[0].name = "llama3";
	f[0].cfg.llama3_rope = 1;
	f[0].cfg.tied_embeddings = false;
	f[1].name = "qwen2";
	f[1].cfg.arch = "qwen2";
	f[2].name = "qwen3";
	f[2].cfg.arch = "qwen3";
	f[2].cfg.head_dim = 32;
	f[3].name = "gemma3";
	f[3].cfg.arch = "gemma3";
	f[3].cfg.n_layer = 6;
	f[3].cfg.head_dim = 32;
	f[3].cfg.n_head_kv = 1;
	f[3].cfg.sliding_window = 8;
	f[3].cfg.rope_base = 1000000.0f;
	f[3].cfg.rms_eps = 1e-6f;
	for (int i = 0; i < 4; i++)
		f[i].cfg.seed = 7 + (uint64_t)i;
}

static void prompt(int32_t *ids)
{
	for (int i = 0; i < N_PROMPT; i++)
		ids[i] = (int32_t)((i * 37 + 11) % 300);
}

/* One reference row: logits of position pos of family fam. */
typedef struct ref_row {
	char fam[16];  /* family name */
	uint32_t pos;  /* prompt position */
	float *v;      /* [n_vocab] */
} ref_row;

/* "L <family> <pos> v0 v1 ..." lines; '#' lines are comments. Returns rows read, -1 on a format error. */
static int read_refs(const char *path, uint32_t n_vocab, ref_row *rows, int cap)
{
	FILE *f = fopen(path, "r");
	char tag[4];
	int n = 0;
	if (!f)
		return -1;
	for (;;) {
		int c = fgetc(f);
		if (c == EOF)
			break;
		if (c == '#' || c == '\n') {
			while (c != '\n' && c != EOF)
				c = fgetc(f);
			continue;
		}
		ungetc(c, f);
		if (n == cap || fscanf(f, "%3s %15s %u", tag, rows[n].fam, &rows[n].pos) != 3 || strcmp(tag, "L")) {
			fclose(f);
			return -1;
		}
		rows[n].v = malloc(n_vocab * sizeof(float));
		for (uint32_t i = 0; i < n_vocab; i++)
			if (fscanf(f, "%f", &rows[n].v[i]) != 1) {
				fclose(f);
				return -1;
			}
		n++;
	}
	fclose(f);
	return n;
}

typedef struct run {
	kvt_model *m;
	kvt_t0_pool *pool;
	uint32_t n_vocab;
} run;

static int open_run(run *r, kvt_dev *d, const char *path, uint32_t max_batch)
{
	kvt_gguf *g;
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.weight_dtype = KVT_DTYPE_F32;
	mc.max_batch = max_batch;
	if (kvt_gguf_open(path, &g))
		return -1;
	int rc = kvt_model_load(d, g, &mc, &r->m);
	kvt_gguf_close(g);
	if (rc)
		return rc;
	kvt_kv_layout lay;
	kvt_model_kv_shape(r->m, 16, &lay);
	r->n_vocab = kvt_model_hparams_get(r->m)->n_vocab;
	return kvt_t0_create(d, &lay, 16, &r->pool);
}

static void close_run(run *r)
{
	kvt_t0_destroy(r->pool);
	kvt_model_destroy(r->m);
}

static double max_abs(const float *a, const float *b, size_t n)
{
	double w = 0;
	for (size_t i = 0; i < n; i++)
		w = fmax(w, fabs((double)a[i] - b[i]));
	return w;
}

/* The largest |a - b| over rows of V, each divided by its row's largest |b|: the error
 * relative to the scale of the logits (0.1 for llama3's, 30 for gemma3's tied, scaled ones). */
static double max_rel(const float *a, const float *b, size_t n_rows, uint32_t V)
{
	double w = 0;
	for (size_t r = 0; r < n_rows; r++) {
		double scale = 0;
		for (uint32_t i = 0; i < V; i++)
			scale = fmax(scale, fabs(b[r * V + i]));
		w = fmax(w, max_abs(a + r * V, b + r * V, V) / scale);
	}
	return w;
}

/* Logits of every prompt position, one forward call (chunked by the model's max_batch). */
static void all_logits(run *r, kvt_dev *d, const int32_t *ids, float *out)
{
	kvt_seq s;
	CHECK(kvt_seq_init(&s, d, r->pool, N_PROMPT) == KVT_OK);
	CHECK(kvt_model_forward(r->m, &s, ids, N_PROMPT, out, N_PROMPT) == KVT_OK);
	kvt_seq_deinit(&s);
}

static void check_family(kvt_dev *d, const fam *f, const char *dir, const ref_row *refs, int n_refs,
			 const ref_row *exact, int n_exact)
{
	char path[512];
	int32_t ids[N_PROMPT];
	run r = { 0 }, rc5 = { 0 };
	prompt(ids);
	snprintf(path, sizeof(path), "%s/%s.gguf", dir, f->name);
	CHECK(kvt_synth_llama_write(&f->cfg, path) == KVT_OK);
	bool ok = open_run(&r, d, path, 64) == KVT_OK && open_run(&rc5, d, path, 5) == KVT_OK;
	CHECKF(ok, "%s loads", f->name);
	if (!ok)
		return;
	const uint32_t V = r.n_vocab;
	float *one = malloc((size_t)N_PROMPT * V * 4), *chunked = malloc((size_t)N_PROMPT * V * 4);
	float *step = malloc((size_t)N_PROMPT * V * 4), *cont = malloc((size_t)N_PROMPT * V * 4);
	all_logits(&r, d, ids, one);
	all_logits(&rc5, d, ids, chunked);

	/* token by token, and continued after 32 tokens (two blocks) shared from another sequence */
	kvt_seq a, b;
	CHECK(kvt_seq_init(&a, d, r.pool, N_PROMPT) == KVT_OK && kvt_seq_init(&b, d, r.pool, N_PROMPT) == KVT_OK);
	for (uint32_t i = 0; i < N_PROMPT; i++)
		CHECK(kvt_model_forward(r.m, &a, ids + i, 1, step + (size_t)i * V, 1) == KVT_OK);
	CHECK(kvt_seq_share_prefix(&b, &a, 2) == KVT_OK);
	CHECK(kvt_model_forward(r.m, &b, ids + 32, N_PROMPT - 32, cont + (size_t)32 * V, N_PROMPT - 32) == KVT_OK);
	kvt_seq_deinit(&a);
	kvt_seq_deinit(&b);
	const size_t nv = (size_t)N_PROMPT * V;
	(void)nv;
	double e_chunk = max_rel(chunked, one, N_PROMPT, V), e_step = max_rel(step, one, N_PROMPT, V);
	double e_cont = max_rel(cont + (size_t)32 * V, one + (size_t)32 * V, N_PROMPT - 32, V);
	printf("%s: relative max |logit diff| of one prefill vs chunks of 5 %.3g, vs decode %.3g, vs continued "
	       "from shared blocks %.3g\n", f->name, e_chunk, e_step, e_cont);
	/* The kernels differ (BLAS prefill vs GEMV decode, blocked vs split attention: summation
	 * order), so a K or V value can round to the neighbouring fp16 (2^-11 relative); the math
	 * does not differ. Measured up to 4e-5. */
	CHECKF(e_chunk < 2e-4 && e_step < 2e-4 && e_cont < 2e-4, "%s: prefill / chunked / decode / cached agree",
	       f->name);

	double worst = 0, worst_x = 0;
	int n_cmp = 0, n_x = 0;
	for (int i = 0; i < n_refs; i++) {
		if (strcmp(refs[i].fam, f->name) || refs[i].pos >= N_PROMPT)
			continue;
		const float *got = one + (size_t)refs[i].pos * V;
		double e = max_rel(got, refs[i].v, 1, V);
		worst = fmax(worst, e);
		n_cmp++;
		uint32_t am_got = 0, am_ref = 0;
		for (uint32_t k = 1; k < V; k++) {
			am_got = got[k] > got[am_got] ? k : am_got;
			am_ref = refs[i].v[k] > refs[i].v[am_ref] ? k : am_ref;
		}
		CHECKF(am_got == am_ref || fabs(got[am_got] - got[am_ref]) < 1e-3, "%s pos %u: argmax %u, llama.cpp %u",
		       f->name, refs[i].pos, am_got, am_ref);
	}
	for (int i = 0; i < n_exact; i++) {
		if (strcmp(exact[i].fam, f->name) || exact[i].pos >= N_PROMPT)
			continue;
		worst_x = fmax(worst_x, max_rel(one + (size_t)exact[i].pos * V, exact[i].v, 1, V));
		n_x++;
	}
	printf("%s: relative max |logit diff| over %d positions vs llama.cpp %.3g; over %d vs float64 %.3g\n", f->name,
	       n_cmp, worst, n_x, worst_x);
	CHECKF(n_cmp > 0, "%s: llama.cpp reference rows present", f->name);
	CHECKF(worst < 1e-3, "%s vs llama.cpp: relative max |logit diff| %.3g", f->name, worst);
	if (n_x)
		CHECKF(worst_x < 2e-4, "%s vs float64: relative max |logit diff| %.3g", f->name, worst_x);
	free(one), free(chunked), free(step), free(cont);
	close_run(&rc5);
	close_run(&r);
	unlink(path);
}

/*
 * Llama 3 scaling given only as rope.scaling.* keys (kvtier computes the
 * factors; llama.cpp reads only the tensor) must equal the rope_freqs.weight
 * file, and both must differ from no scaling at all (the prompt reaches the
 * bands the factors change).
 */
static void check_llama3_keys(kvt_dev *d, const fam *tensor_fam, const char *dir)
{
	kvt_synth_llama cfg[3] = { tensor_fam->cfg, tensor_fam->cfg, tensor_fam->cfg };
	cfg[1].llama3_rope = 2;
	cfg[2].llama3_rope = 0;
	int32_t ids[N_PROMPT];
	float *lg[3];
	prompt(ids);
	for (int i = 0; i < 3; i++) {
		char path[512];
		run r = { 0 };
		snprintf(path, sizeof(path), "%s/llama3-%d.gguf", dir, i);
		CHECK(kvt_synth_llama_write(&cfg[i], path) == KVT_OK);
		lg[i] = calloc((size_t)N_PROMPT * kvt_synth_llama_n_vocab(), 4);
		if (open_run(&r, d, path, 64) == KVT_OK)
			all_logits(&r, d, ids, lg[i]);
		else
			CHECKF(0, "llama3 variant %d loads", i);
		close_run(&r);
		unlink(path);
	}
	const size_t n = (size_t)N_PROMPT * kvt_synth_llama_n_vocab();
	double keys = max_abs(lg[0], lg[1], n), none = max_abs(lg[0], lg[2], n);
	printf("llama3: rope.scaling keys vs rope_freqs tensor %.3g; vs no scaling %.3g\n", keys, none);
	CHECKF(keys < 1e-5, "llama3 keys vs tensor: %.3g", keys);
	CHECKF(none > 1e-2, "llama3 scaling changes the logits: %.3g", none);
	for (int i = 0; i < 3; i++)
		free(lg[i]);
}

/* A mistral-named file (mistral.* keys, Llama's tensors) is a Llama: the same logits as the llama file. */
static void check_mistral(kvt_dev *d, const char *dir)
{
	kvt_synth_llama cfg[2];
	int32_t ids[N_PROMPT];
	float *lg[2];
	prompt(ids);
	for (int i = 0; i < 2; i++) {
		char path[512];
		run r = { 0 };
		kvt_synth_llama_default(&cfg[i]);
		cfg[i].arch = i ? "mistral" : "llama";
		snprintf(path, sizeof(path), "%s/%s.gguf", dir, cfg[i].arch);
		CHECK(kvt_synth_llama_write(&cfg[i], path) == KVT_OK);
		lg[i] = calloc((size_t)N_PROMPT * kvt_synth_llama_n_vocab(), 4);
		if (open_run(&r, d, path, 64) == KVT_OK)
			all_logits(&r, d, ids, lg[i]);
		else
			CHECKF(0, "%s loads", cfg[i].arch);
		close_run(&r);
		unlink(path);
	}
	double e = max_abs(lg[0], lg[1], (size_t)N_PROMPT * kvt_synth_llama_n_vocab());
	printf("mistral vs llama keys, same weights: %.3g\n", e);
	CHECKF(e == 0, "mistral vs llama: %.3g", e);
	free(lg[0]), free(lg[1]);
}

int main(int argc, char **argv)
{
	fam f[4];
	families(f);
	if (argc == 3 && !strcmp(argv[1], "--write")) { /* for tests/ref/gen_arch_refs.py */
		char path[512];
		for (int i = 0; i < 4; i++) {
			snprintf(path, sizeof(path), "%s/%s.gguf", argv[2], f[i].name);
			if (kvt_synth_llama_write(&f[i].cfg, path))
				return 1;
			printf("%s\n", path);
		}
		return 0;
	}
	char dir[] = "/tmp/kvt_arch_ref_XXXXXX", path[512];
	if (!mkdtemp(dir))
		return 1;
	kvt_dev *d;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = 2 };
	if (kvt_dev_create(&dc, &d))
		return 1;
	const uint32_t V = kvt_synth_llama_n_vocab();
	static ref_row refs[64], exact[64];
	snprintf(path, sizeof(path), "%s/tests/ref/arch_ref.txt", KVT_SOURCE_DIR);
	int n_refs = read_refs(path, V, refs, 64);
	CHECKF(n_refs > 0, "read %s", path);
	snprintf(path, sizeof(path), "%s/tests/ref/arch_exact_ref.txt", KVT_SOURCE_DIR);
	int n_exact = read_refs(path, V, exact, 64);
	CHECKF(n_exact > 0, "read %s", path);
	for (int i = 0; i < 4; i++)
		check_family(d, &f[i], dir, refs, n_refs, exact, n_exact);
	check_llama3_keys(d, &f[0], dir);
	check_mistral(d, dir);
	for (int i = 0; i < n_refs; i++)
		free(refs[i].v);
	for (int i = 0; i < n_exact; i++)
		free(exact[i].v);
	kvt_dev_destroy(d);
	rmdir(dir);
	return check_done("test_arch_ref");
}
