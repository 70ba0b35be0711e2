/* ctest-labels: unit */
/*
 * tests/test_model_load.c — a model file that parses as GGUF but is not a
 * model we can run gets one clear error naming what is wrong, never a crash
 * and never a half-loaded model.
 *
 * Each case starts from a valid synthetic Llama GGUF, copies it through the
 * GGUF writer with one thing changed (a key dropped or replaced, a tensor
 * dropped, reshaped, retyped or given a non-finite value), loads it, and
 * checks the result code and that exactly one error line names the cause.
 */
#include "check.h"
#include "gguf.h"
#include "model.h"
#include "synth_model.h"

#include <unistd.h>

static char dir[64], base_path[128], bad_path[128];
static char last_err[1024];
static int n_err;

static void sink(int level, const char *msg, void *user)
{
	if (level == KVT_LOG_ERROR) {
		n_err++;
		snprintf(last_err, sizeof(last_err), "%s", msg);
	}
}

/* What one case changes. */
typedef struct mutation {
	const char *name;          /* case name */
	const char *drop_key;      /* metadata key left out */
	const char *set_key;       /* metadata key replaced ... */
	uint32_t set_u32;          /* ... by this UINT32 (when set_str is NULL) */
	const char *set_str;       /* ... or by this STRING */
	const char *drop_tensor;   /* tensor left out */
	const char *edit_tensor;   /* tensor changed: */
	uint64_t new_ne1;          /*   new ne[1] (0: keep) */
	uint32_t new_type;         /*   new ggml type (0: keep) */
	float poke;                /*   value written into element 3 of an F32 tensor (0: none) */
	int want_rc;               /* expected load result */
	const char *want_msg;      /* expected text in the single error line */
	int weight_dtype;          /* load option */
	bool keep_quantized;       /* load option */
} mutation;

static int copy_kv(kvt_gguf_writer *w, const kvt_gguf_kv *kv, const mutation *mu)
{
	char key[256];
	snprintf(key, sizeof(key), "%.*s", (int)kv->key.len, kv->key.ptr);
	if (mu->drop_key && !strcmp(key, mu->drop_key))
		return KVT_OK;
	if (mu->set_key && !strcmp(key, mu->set_key))
		return mu->set_str ? kvt_gguf_writer_add_str(w, key, mu->set_str) : kvt_gguf_writer_add_u32(w, key, mu->set_u32);
	return kvt_gguf_writer_copy_kv(w, key, kv);
}

static int write_mutant(const mutation *mu)
{
	kvt_gguf *g;
	kvt_gguf_writer *w;
	int rc;
	if ((rc = kvt_gguf_open(base_path, &g)) || (rc = kvt_gguf_writer_create(&w)))
		return rc;
	for (uint64_t i = 0; i < kvt_gguf_n_kv(g) && !rc; i++)
		rc = copy_kv(w, kvt_gguf_kv_at(g, i), mu);
	for (uint64_t i = 0; i < kvt_gguf_n_tensors(g) && !rc; i++) {
		const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
		char name[128];
		snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.ptr);
		if (mu->drop_tensor && !strcmp(name, mu->drop_tensor))
			continue;
		if (!mu->edit_tensor || strcmp(name, mu->edit_tensor)) {
			rc = kvt_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
			continue;
		}
		uint64_t ne[4] = { t->ne[0], t->ne[1], t->ne[2], t->ne[3] };
		if (mu->new_ne1)
			ne[1] = mu->new_ne1;
		uint32_t type = mu->new_type ? mu->new_type : t->type;
		uint32_t be, bb;
		kvt_ggml_type_block(type, &be, &bb);
		uint64_t n_bytes = ne[0] * ne[1] / be * bb;
		unsigned char *data = calloc(1, n_bytes);
		if (type == t->type)
			memcpy(data, t->data, n_bytes < t->n_bytes ? n_bytes : t->n_bytes);
		if (mu->poke != 0)
			((float *)data)[3] = mu->poke;
		rc = kvt_gguf_writer_add_tensor(w, name, type, t->n_dims, ne, data, n_bytes);
		free(data);
	}
	if (!rc)
		rc = kvt_gguf_writer_write(w, bad_path);
	kvt_gguf_writer_destroy(w);
	kvt_gguf_close(g);
	return rc;
}

static void run_case(kvt_dev *dev, const mutation *mu)
{
	kvt_gguf *g;
	kvt_model *m = NULL;
	kvt_model_config mc;

	CHECKF(write_mutant(mu) == KVT_OK, "%s: could not write the file", mu->name);
	kvt_model_config_default(&mc);
	mc.weight_dtype = mu->weight_dtype;
	mc.keep_quantized = mu->keep_quantized;
	CHECK(kvt_gguf_open(bad_path, &g) == KVT_OK);
	n_err = 0;
	last_err[0] = 0;
	int rc = kvt_model_load(dev, g, &mc, &m);
	CHECKF(rc == mu->want_rc, "%s: load gave %s, want %s", mu->name, kvt_strerror(rc), kvt_strerror(mu->want_rc));
	CHECKF(m == NULL || rc == KVT_OK, "%s: a model came back with an error", mu->name);
	CHECKF(n_err == (mu->want_rc != KVT_OK), "%s: %d error lines", mu->name, n_err);
	CHECKF(strstr(last_err, mu->want_msg) != NULL, "%s: error \"%s\" does not say \"%s\"", mu->name, last_err,
	       mu->want_msg);
	printf("%-22s -> %s\n", mu->name, last_err);
	kvt_model_destroy(m);
	kvt_gguf_close(g);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/kvt_load_XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(base_path, sizeof(base_path), "%s/base.gguf", dir);
	snprintf(bad_path, sizeof(bad_path), "%s/bad.gguf", dir);
	kvt_synth_llama cfg;
	kvt_synth_llama_default(&cfg); /* 2 layers, n_embd 64, 4 heads, 2 KV heads: head_dim 16, kv_dim 32 */
	cfg.weight_type = KVT_GGML_F32;
	if (kvt_synth_llama_write(&cfg, base_path))
		return 1;
	kvt_dev *dev;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = 2 };
	if (kvt_dev_create(&dc, &dev))
		return 1;
	kvt_log_set_sink(sink, NULL);

	const mutation cases[] = {
		{ .name = "unchanged", .want_rc = KVT_OK, .want_msg = "", .keep_quantized = true, .weight_dtype = KVT_DTYPE_F16 },
		{ .name = "other architecture", .set_key = "general.architecture", .set_str = "gpt2",
		  .want_rc = KVT_EUNSUPPORTED, .want_msg = "architecture 'gpt2' is not supported" },
		{ .name = "no block count", .drop_key = "llama.block_count", .want_rc = KVT_ECORRUPT,
		  .want_msg = "missing metadata key llama.block_count" },
		{ .name = "heads do not divide", .set_key = "llama.attention.head_count", .set_u32 = 5,
		  .want_rc = KVT_ECORRUPT, .want_msg = "bad hyperparameters" },
		{ .name = "kv heads do not divide", .set_key = "llama.attention.head_count_kv", .set_u32 = 3,
		  .want_rc = KVT_ECORRUPT, .want_msg = "kv heads 3" },
		{ .name = "odd rope dims", .set_key = "llama.rope.dimension_count", .set_u32 = 7,
		  .want_rc = KVT_ECORRUPT, .want_msg = "rope.dimension_count 7" },
		{ .name = "layer count as string", .set_key = "llama.block_count", .set_str = "two",
		  .want_rc = KVT_EINVAL, .want_msg = "llama.block_count" },
		{ .name = "missing tensor", .drop_tensor = "blk.1.ffn_up.weight", .want_rc = KVT_ECORRUPT,
		  .want_msg = "missing tensor blk.1.ffn_up.weight" },
		{ .name = "misshapen tensor", .edit_tensor = "blk.0.attn_k.weight", .new_ne1 = 64,
		  .want_rc = KVT_ECORRUPT, .want_msg = "blk.0.attn_k.weight: shape [64, 64] but the model needs [64, 32]" },
		{ .name = "unsupported type", .edit_tensor = "blk.0.attn_q.weight", .new_type = KVT_GGML_Q5_1,
		  .want_rc = KVT_EUNSUPPORTED, .want_msg = "blk.0.attn_q.weight: type Q5_1 is not supported" },
		{ .name = "NaN weight", .edit_tensor = "blk.1.ffn_norm.weight", .poke = NAN,
		  .want_rc = KVT_ECORRUPT, .want_msg = "blk.1.ffn_norm.weight: element 3 is not finite" },
		{ .name = "too big for fp16", .edit_tensor = "blk.0.attn_v.weight", .poke = 1e6f,
		  .want_rc = KVT_EUNSUPPORTED, .want_msg = "blk.0.attn_v.weight: element 3 (1e+06) does not fit fp16",
		  .weight_dtype = KVT_DTYPE_F16 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++)
		run_case(dev, &cases[i]); /* weight_dtype 0 is KVT_DTYPE_F32 */

	/* the other families: what their traits require is named when it is missing */
	static const struct { const char *arch; mutation mu; } fam_cases[] = {
		{ "qwen2", { .name = "qwen2 unchanged", .want_rc = KVT_OK, .want_msg = "" } },
		{ "qwen2", { .name = "qwen2 without a bias", .drop_tensor = "blk.0.attn_q.bias",
			     .want_rc = KVT_ECORRUPT, .want_msg = "missing tensor blk.0.attn_q.bias" } },
		{ "qwen3", { .name = "qwen3 without a K norm", .drop_tensor = "blk.1.attn_k_norm.weight",
			     .want_rc = KVT_ECORRUPT, .want_msg = "missing tensor blk.1.attn_k_norm.weight" } },
		{ "gemma3", { .name = "gemma3 unchanged", .want_rc = KVT_OK, .want_msg = "" } },
		{ "gemma3", { .name = "gemma3 without post-norm", .drop_tensor = "blk.1.post_ffw_norm.weight",
			      .want_rc = KVT_ECORRUPT, .want_msg = "missing tensor blk.1.post_ffw_norm.weight" } },
		{ "gemma3", { .name = "gemma3 without window", .drop_key = "gemma3.attention.sliding_window",
			      .want_rc = KVT_ECORRUPT, .want_msg = "missing metadata key gemma3.attention.sliding_window" } },
		{ "gemma3", { .name = "gemma3 window 0", .set_key = "gemma3.attention.sliding_window", .set_u32 = 0,
			      .want_rc = KVT_ECORRUPT, .want_msg = "gemma3.attention.sliding_window is 0" } },
		{ "gemma3", { .name = "gemma3 V wider than K", .set_key = "gemma3.attention.value_length", .set_u32 = 32,
			      .want_rc = KVT_ECORRUPT, .want_msg = "value_length 32" } },
	};
	for (size_t i = 0; i < sizeof(fam_cases) / sizeof(*fam_cases); i++) {
		cfg.arch = fam_cases[i].arch;
		cfg.head_dim = !strcmp(cfg.arch, "gemma3") ? 16 : 0; /* written as key_length / value_length */
		if (kvt_synth_llama_write(&cfg, base_path))
			return 1;
		run_case(dev, &fam_cases[i].mu);
	}
	kvt_log_set_sink(NULL, NULL);
	kvt_dev_destroy(dev);
	unlink(base_path);
	unlink(bad_path);
	rmdir(dir);
	return check_done("test_model_load");
}
