/*
 * tests/test_index_fingerprint.c — the model fingerprint and its cache.
 *
 * Synthetic GGUFs in a temp dir: the fingerprint depends on content (weights,
 * hyperparameters), not on the path; the cache is used when the file is
 * unchanged and missed when it is rewritten (even with the same size); a
 * damaged cache file is ignored and rewritten. With the default model
 * present, also times a cold hash against a cached start-up (printed only).
 */
/* ctest-labels: unit */
#include "check.h"
#include "fingerprint.h"
#include "synth_model.h"

#include <unistd.h>

static char g_dir[64];

static void path_in(char *out, size_t cap, const char *name)
{
	snprintf(out, cap, "%s/%s", g_dir, name);
}

int main(void)
{
	char a[256], b[256], cache[256];
	uint8_t fa[32], fa2[32], fb[32], fc[32];
	bool hit = true;
	kvt_synth_llama cfg;

	snprintf(g_dir, sizeof(g_dir), "/tmp/kvt_test_fp_XXXXXX");
	if (!mkdtemp(g_dir))
		return check_skip("test_index_fingerprint", "mkdtemp failed");
	path_in(a, sizeof(a), "a.gguf");
	path_in(b, sizeof(b), "b.gguf");
	path_in(cache, sizeof(cache), "fp.cache");

	kvt_synth_llama_default(&cfg);
	CHECK(kvt_synth_llama_write(&cfg, a) == KVT_OK);
	CHECK(kvt_synth_llama_write(&cfg, b) == KVT_OK);
	/* content, not path */
	CHECK(kvt_model_fingerprint(a, NULL, fa, &hit) == KVT_OK && !hit);
	CHECK(kvt_model_fingerprint(b, NULL, fb, NULL) == KVT_OK);
	CHECK(memcmp(fa, fb, 32) == 0);

	/* the cache: miss, then hit with the same value */
	CHECK(kvt_model_fingerprint(a, cache, fa2, &hit) == KVT_OK && !hit);
	CHECK(memcmp(fa, fa2, 32) == 0);
	CHECK(kvt_model_fingerprint(a, cache, fa2, &hit) == KVT_OK && hit);
	CHECK(memcmp(fa, fa2, 32) == 0);
	/* b gets its own line; a's is kept */
	CHECK(kvt_model_fingerprint(b, cache, fb, &hit) == KVT_OK && !hit);
	CHECK(kvt_model_fingerprint(a, cache, fa2, &hit) == KVT_OK && hit);
	CHECK(kvt_model_fingerprint(b, cache, fb, &hit) == KVT_OK && hit);

	/* other weights, same size, same path: the cache misses and the value changes */
	cfg.seed = 2;
	usleep(20000);
	CHECK(kvt_synth_llama_write(&cfg, a) == KVT_OK);
	CHECK(kvt_model_fingerprint(a, cache, fc, &hit) == KVT_OK && !hit);
	CHECK(memcmp(fc, fa, 32) != 0);
	CHECK(kvt_model_fingerprint(a, cache, fa2, &hit) == KVT_OK && hit && memcmp(fa2, fc, 32) == 0);
	/* the same bytes written again: a miss (new mtime/ctime), the same value */
	usleep(20000);
	CHECK(kvt_synth_llama_write(&cfg, a) == KVT_OK);
	CHECK(kvt_model_fingerprint(a, cache, fa2, &hit) == KVT_OK && !hit && memcmp(fa2, fc, 32) == 0);

	/* a hyperparameter alone changes it */
	kvt_synth_llama_default(&cfg);
	cfg.rope_base = 500000.0f;
	CHECK(kvt_synth_llama_write(&cfg, b) == KVT_OK);
	CHECK(kvt_model_fingerprint(b, NULL, fc, NULL) == KVT_OK);
	CHECK(memcmp(fc, fa, 32) != 0);

	/* a damaged cache is ignored and rewritten */
	FILE *f = fopen(cache, "w");
	fprintf(f, "garbage\nkvtfp1 1 2 3\n\x01\x02 not a line");
	fclose(f);
	CHECK(kvt_model_fingerprint(b, cache, fa2, &hit) == KVT_OK && !hit && memcmp(fa2, fc, 32) == 0);
	CHECK(kvt_model_fingerprint(b, cache, fa2, &hit) == KVT_OK && hit && memcmp(fa2, fc, 32) == 0);

	/* every architecture, and each K/V-changing setting of one, is its own fingerprint:
	 * the same weights under llama, qwen3, gemma3, a gemma3 window of 16 instead of 8 */
	{
		static const char *const archs[] = { "llama", "qwen3", "gemma3", "gemma3" };
		uint8_t fps[4][32];
		kvt_synth_llama fc_cfg;
		kvt_synth_llama_default(&fc_cfg);
		for (int i = 0; i < 4; i++) {
			fc_cfg.arch = archs[i];
			fc_cfg.sliding_window = i == 3 ? 16 : 0;
			CHECK(kvt_synth_llama_write(&fc_cfg, b) == KVT_OK);
			CHECK(kvt_model_fingerprint(b, NULL, fps[i], NULL) == KVT_OK);
			for (int j = 0; j < i; j++)
				CHECKF(memcmp(fps[i], fps[j], 32) != 0, "fingerprints of %s and %s (window) are equal", archs[i],
				       archs[j]);
		}
	}

	/* a missing or broken model is an error, never a fingerprint */
	char none[256];
	path_in(none, sizeof(none), "none.gguf");
	kvt_log_set_level(-1);
	CHECK(kvt_model_fingerprint(none, cache, fa2, NULL) != KVT_OK);
	f = fopen(none, "w");
	fprintf(f, "GGUF but not really");
	fclose(f);
	CHECK(kvt_model_fingerprint(none, cache, fa2, NULL) != KVT_OK);
	kvt_log_set_level(KVT_LOG_INFO);

	/* the real model: cold hash vs cached start-up (informational) */
	const char *model = check_default_model();
	if (model) {
		char mcache[256];
		path_in(mcache, sizeof(mcache), "model.cache");
		double t0 = kvt_now_s();
		CHECK(kvt_model_fingerprint(model, mcache, fa, &hit) == KVT_OK && !hit);
		double t1 = kvt_now_s();
		CHECK(kvt_model_fingerprint(model, mcache, fa2, &hit) == KVT_OK && hit && memcmp(fa, fa2, 32) == 0);
		double t2 = kvt_now_s();
		printf("default model: fingerprint %.1f ms cold, %.3f ms from the cache\n", (t1 - t0) * 1e3,
		       (t2 - t1) * 1e3);
	}

	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", g_dir);
	return check_done("test_index_fingerprint");
}
