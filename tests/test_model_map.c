/* ctest-labels: unit model */
/*
 * tests/test_model_map.c — weights that point into the GGUF's mapping
 * (kvt_model_config.map_weights) on the CPU backend.
 *
 * For each model (synthetic fp16, q8_0 and Q4_K_M-mix Llamas written here,
 * and the default SmolLM2 and Gemma 3 models where models/ has them), it loads
 * the file twice, copying and mapping, and checks:
 *  - mapped, every weight the backend takes as stored is mapped: the mapped
 *    bytes are nearly all the weight bytes (what is not is dequantized or
 *    widened), and the weight bytes are the same as when copied; copying
 *    maps nothing;
 *  - the process's anonymous memory grows by less than a tenth of the mapped
 *    bytes (and 1 MiB) for the mapped load (its weights are file pages), and
 *    by at least half the weight bytes for a copy of a real model's;
 *  - the logits of a 12-token prompt and of 4 greedy steps are bit for bit
 *    the same from both loads.
 * The value check of weights loaded as stored reads their scales, not a
 * dequantized copy: a NaN or Inf poked into one block's scale (every scale
 * field of every block type, and an element of F16/F32/BF16) is found at that
 * block's first element (kvt_gguf_tensor_check_finite), and the load fails
 * with one error naming the tensor and the element, mapped or not.
 */
#include "check.h"
#include "gguf.h"
#include "model.h"
#include "synth_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_PROMPT 12
#define N_STEPS 4

/* RssAnon of this process, bytes (/proc/self/status). */
static uint64_t rss_anon(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	uint64_t kb = 0;
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "RssAnon:", 8))
			kb = strtoull(line + 8, NULL, 10);
	if (f)
		fclose(f);
	return kb * 1024;
}

/* Load path with map_weights = map; the logits of the prompt and N_STEPS greedy steps into out. */
static int run(kvt_dev *dev, const char *path, bool map, float *out, size_t *weight_bytes, size_t *mapped_bytes,
	       int64_t *anon_growth)
{
	kvt_gguf *g = NULL;
	kvt_model *m = NULL;
	kvt_t0_pool *pool = NULL;
	kvt_seq s = { 0 };
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_ctx = 64;
	mc.max_batch = 16;
	mc.map_weights = map;
	const uint64_t before = rss_anon();
	int rc = kvt_gguf_open(path, &g);
	if (!rc)
		rc = kvt_model_load(dev, g, &mc, &m);
	if (rc)
		goto out;
	*anon_growth = (int64_t)rss_anon() - (int64_t)before;
	*weight_bytes = kvt_model_weight_bytes(m);
	*mapped_bytes = kvt_model_mapped_bytes(m);
	kvt_kv_layout shape;
	kvt_model_kv_shape(m, 16, &shape);
	if ((rc = kvt_t0_create(dev, &shape, 8, &pool)) || (rc = kvt_seq_init(&s, dev, pool, 64)))
		goto out;
	const uint32_t V = kvt_model_hparams_get(m)->n_vocab;
	int32_t ids[N_PROMPT];
	for (int i = 0; i < N_PROMPT; i++)
		ids[i] = (int32_t)((i * 37 + 11) % V);
	if ((rc = kvt_model_forward(m, &s, ids, N_PROMPT, out, 1)))
		goto out;
	for (int step = 0; step < N_STEPS; step++) {
		const float *row = out + (size_t)step * V;
		int32_t best = 0;
		for (uint32_t k = 1; k < V; k++)
			if (row[k] > row[best])
				best = (int32_t)k;
		if ((rc = kvt_model_forward(m, &s, &best, 1, out + (size_t)(step + 1) * V, 1)))
			goto out;
	}
out:
	kvt_seq_deinit(&s);
	kvt_t0_destroy(pool);
	kvt_model_destroy(m); /* before the GGUF: mapped weights point into it */
	kvt_gguf_close(g);
	return rc;
}

/* The file at path, in memory (caller frees); NULL on error. */
static uint8_t *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	if (f && !fseek(f, 0, SEEK_END)) {
		long len = ftell(f);
		buf = len > 0 ? malloc((size_t)len) : NULL;
		if (buf && (fseek(f, 0, SEEK_SET) || fread(buf, 1, (size_t)len, f) != (size_t)len)) {
			free(buf);
			buf = NULL;
		}
		*n = (size_t)len;
	}
	if (f)
		fclose(f);
	return buf;
}

/*
 * In a copy of the file at path, the 16-bit field at byte off of block 5 of
 * tensor name set to bits: the check finds element 5 * block_elems, and a load
 * (map or not) fails naming it.
 */
static void check_poke(kvt_dev *dev, const char *path, const char *name, uint32_t off, uint16_t bits, bool map)
{
	size_t n = 0;
	uint8_t *buf = slurp(path, &n);
	kvt_gguf *g = NULL;
	CHECK(buf && kvt_gguf_open_mem(buf, n, "poked", &g) == KVT_OK);
	if (!g) {
		free(buf);
		return;
	}
	const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, name);
	uint32_t be = 0, bb = 0;
	CHECK(t && kvt_ggml_type_block(t->type, &be, &bb) && t->n_elems >= 6 * (uint64_t)be);
	if (t && be) {
		uint8_t *p = buf + ((const uint8_t *)t->data - buf) + 5 * (size_t)bb + off;
		uint64_t bad = 0;
		CHECK(kvt_gguf_tensor_check_finite(g, t, &bad) == KVT_OK);
		memcpy(p, &bits, 2);
		CHECKF(kvt_gguf_tensor_check_finite(g, t, &bad) == KVT_ECORRUPT && bad == 5 * (uint64_t)be,
		       "%s (%s) at block offset %u = 0x%04x: bad element %llu", name, kvt_ggml_type_name(t->type), off, bits,
		       (unsigned long long)bad);
		kvt_model_config mc;
		kvt_model_config_default(&mc);
		mc.max_ctx = 64;
		mc.map_weights = map;
		kvt_model *m = NULL;
		char want[160];
		snprintf(want, sizeof(want), "%s: element %llu is not finite", name, 5ull * be);
		check_log_capture();
		CHECKF(kvt_model_load(dev, g, &mc, &m) == KVT_ECORRUPT && check_log_n_errors == 1 &&
			       strstr(check_log_text, want),
		       "load with %s poked: %s", name, check_log_text);
		kvt_log_set_sink(NULL, NULL);
		kvt_model_destroy(m);
	}
	kvt_gguf_close(g);
	free(buf);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVT_TEST_SANITIZED 1
#else
#define KVT_TEST_SANITIZED 0
#endif

static void check_model(kvt_dev *dev, const char *path, const char *label, uint32_t n_vocab)
{
	const size_t n = (size_t)(N_STEPS + 1) * n_vocab;
	float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float));
	size_t wa = 0, ma = 0, wb = 0, mb = 0;
	int64_t ga = 0, gb = 0;
	CHECK(a && b);
	if (!a || !b)
		goto out;
	CHECKF(run(dev, path, false, a, &wa, &ma, &ga) == KVT_OK, "%s: copied load", label);
	CHECKF(run(dev, path, true, b, &wb, &mb, &gb) == KVT_OK, "%s: mapped load", label);
	printf("%s: %zu weight bytes, %zu mapped; anonymous memory grew %lld (copied) and %lld (mapped)\n", label, wa,
	       mb, (long long)ga, (long long)gb);
	CHECKF(wa == wb && wa > 0, "%s: weight bytes %zu copied, %zu mapped", label, wa, wb);
	CHECKF(ma == 0, "%s: a copied load maps %zu bytes", label, ma);
	CHECKF(mb >= wb / 10 * 9, "%s: %zu of %zu weight bytes mapped", label, mb, wb);
	/* the measure itself, where the weights are large enough not to fit in freed heap; not under a
	 * sanitizer, whose allocator and shadow memory do not follow the loads (CI's ASan run: the copy
	 * showed 116 of 246 MB; TSan: a mapped load 3-11 MB) */
	CHECKF(KVT_TEST_SANITIZED || wa < (32u << 20) || ga >= (int64_t)(wa / 2), "%s: the copy took %lld anonymous bytes for %zu of weights",
	       label, (long long)ga, wa);
	CHECKF(KVT_TEST_SANITIZED || gb < (int64_t)(mb / 10) + (1 << 20), "%s: the mapped load took %lld anonymous bytes (%zu mapped)", label,
	       (long long)gb, mb);
	CHECKF(!memcmp(a, b, n * sizeof(float)), "%s: logits differ between the copied and the mapped load", label);
out:
	free(a);
	free(b);
}

int main(void)
{
	kvt_dev *dev = NULL;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = 2 };
	if (kvt_dev_create(&dc, &dev))
		return 1;
	CHECK(kvt_dev_host_is_device(dev));
	char path[128];
	snprintf(path, sizeof(path), "/tmp/kvt_test_model_map_%d.gguf", (int)getpid());
	/* BF16 and the remaining block types, straight from bytes: block 5 of a 6-block tensor */
	static const struct { uint32_t type, off; } raw[] = { { KVT_GGML_BF16, 0 }, { KVT_GGML_Q4_0, 0 },
							       { KVT_GGML_Q4_1, 2 }, { KVT_GGML_Q5_0, 0 },
							       { KVT_GGML_Q5_K, 2 } };
	for (size_t i = 0; i < sizeof(raw) / sizeof(*raw); i++) {
		uint32_t be = 0, bb = 0;
		CHECK(kvt_ggml_type_block(raw[i].type, &be, &bb));
		kvt_gguf_writer *w = NULL;
		uint8_t *blocks = calloc(6, bb);
		CHECK(blocks && kvt_gguf_writer_create(&w) == KVT_OK);
		if (blocks && w) {
			const uint16_t nan = raw[i].type == KVT_GGML_BF16 ? 0x7fc0 : 0x7e00;
			memcpy(blocks + 5 * (size_t)bb + raw[i].off, &nan, 2);
			const uint64_t ne[1] = { 6 * (uint64_t)be };
			CHECK(kvt_gguf_writer_add_tensor(w, "t", raw[i].type, 1, ne, blocks, 6 * (size_t)bb) == KVT_OK);
			size_t n = 0;
			kvt_gguf *g = NULL;
			uint8_t *file = kvt_gguf_writer_write(w, path) == KVT_OK ? slurp(path, &n) : NULL;
			CHECK(file && kvt_gguf_open_mem(file, n, "raw", &g) == KVT_OK);
			unlink(path);
			uint64_t bad = 0;
			CHECKF(g && kvt_gguf_tensor_check_finite(g, kvt_gguf_find_tensor(g, "t"), &bad) == KVT_ECORRUPT &&
				       bad == 5 * (uint64_t)be,
			       "%s: bad element %llu", kvt_ggml_type_name(raw[i].type), (unsigned long long)bad);
			kvt_gguf_close(g);
			free(file);
		}
		kvt_gguf_writer_destroy(w);
		free(blocks);
	}
	static const struct { uint32_t type; bool mix; const char *label; } synth[] = {
		{ KVT_GGML_F16, false, "synthetic f16" },
		{ KVT_GGML_Q8_0, false, "synthetic q8_0" },
		{ KVT_GGML_Q4_K, true, "synthetic Q4_K_M mix" },
	};
	for (size_t i = 0; i < sizeof(synth) / sizeof(*synth); i++) {
		kvt_synth_llama c;
		kvt_synth_llama_default(&c);
		c.n_layer = 2;
		c.n_embd = 256; /* a multiple of the K-quants' 256 */
		c.n_head = 4;
		c.n_head_kv = 2;
		c.n_ff = 512;
		c.weight_type = synth[i].type;
		c.q4_k_m_mix = synth[i].mix;
		c.tied_embeddings = false;
		CHECK(kvt_synth_llama_write(&c, path) == KVT_OK);
		check_model(dev, path, synth[i].label, kvt_synth_llama_n_vocab());
		/* the scales of each block type the file has (NaN and Inf), and an F32 norm's element */
		if (synth[i].type == KVT_GGML_F16) {
			check_poke(dev, path, "blk.0.attn_q.weight", 0, 0x7e00, i % 2);
			check_poke(dev, path, "blk.0.ffn_up.weight", 0, 0xfc00, true);
		} else if (synth[i].type == KVT_GGML_Q8_0) {
			check_poke(dev, path, "blk.0.attn_q.weight", 0, 0x7c00, false);
			check_poke(dev, path, "blk.1.ffn_down.weight", 0, 0x7e01, true);
		} else {
			check_poke(dev, path, "blk.0.attn_q.weight", 0, 0x7e00, true);  /* Q4_K d */
			check_poke(dev, path, "blk.0.attn_k.weight", 2, 0x7c00, false); /* Q4_K dmin */
			check_poke(dev, path, "blk.1.ffn_down.weight", 208, 0xfe00, true); /* Q6_K d */
		}
		check_poke(dev, path, "blk.0.attn_norm.weight", 2, 0x7fc0, true); /* F32: the top half of element 5 */
		unlink(path);
	}
	static const char *const real[] = { KVT_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
					    KVT_SOURCE_DIR "/models/gemma-3-270m-q4_k_m.gguf" };
	for (size_t i = 0; i < sizeof(real) / sizeof(*real); i++) {
		kvt_gguf *g;
		kvt_model_hparams hp;
		if (access(real[i], R_OK) || kvt_gguf_open(real[i], &g)) {
			printf("skip: no %s\n", real[i]);
			continue;
		}
		const int rc = kvt_model_read_hparams(g, &hp);
		kvt_gguf_close(g);
		CHECK(rc == KVT_OK);
		if (rc == KVT_OK)
			check_model(dev, real[i], strrchr(real[i], '/') + 1, hp.n_vocab);
	}
	kvt_dev_destroy(dev);
	return check_done("test_model_map");
}
