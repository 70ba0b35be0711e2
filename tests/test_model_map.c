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
	/* the measure itself, where the weights are large enough not to fit in freed heap */
	CHECKF(wa < (32u << 20) || ga >= (int64_t)(wa / 2), "%s: the copy took %lld anonymous bytes for %zu of weights",
	       label, (long long)ga, wa);
	CHECKF(gb < (int64_t)(mb / 10) + (1 << 20), "%s: the mapped load took %lld anonymous bytes (%zu mapped)", label,
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
