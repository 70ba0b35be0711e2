/*
 * tests/test_index_fingerprint.c — the model fingerprint and its cache.
 *
 * Synthetic GGUFs in a temp dir: the fingerprint depends on content (weights,
 * hyperparameters), not on the path; the cache is used when the file is
 * unchanged and missed when it is rewritten (even with the same size); a
 * damaged cache file is ignored and rewritten. Version 1 still gives the
 * values builds before version 2 stored (pinned below), version 2 does not
 * depend on its thread count and sees every byte of every leaf, and a data
 * directory keeps the version its KV was stored under. With the default
 * model present, also times both versions cold against a cached start-up
 * (printed only).
 */
/* ctest-labels: unit */
#include "check.h"
#include "fingerprint.h"
#include "synth_model.h"

#include "index.h"

#include <unistd.h>

static char g_dir[64];

static void path_in(char *out, size_t cap, const char *name)
{
	snprintf(out, cap, "%s/%s", g_dir, name);
}

/* A GGUF of one F32 tensor of n_floats values (3 leaves of 8 MiB for 5 Mi + 1 floats) from data. */
static int write_big(const char *path, const float *data, uint64_t n_floats)
{
	kvt_gguf_writer *w = NULL;
	uint64_t ne[1] = { n_floats };
	int rc = kvt_gguf_writer_create(&w);
	if (rc)
		return rc;
	rc = kvt_gguf_writer_add_str(w, "general.architecture", "llama");
	if (!rc)
		rc = kvt_gguf_writer_add_tensor(w, "big.weight", 0 /* F32 */, 1, ne, data, n_floats * 4);
	if (!rc)
		rc = kvt_gguf_writer_write(w, path);
	kvt_gguf_writer_destroy(w);
	return rc;
}

static int fp_of(const char *path, int version, uint32_t n_threads, uint8_t out[32])
{
	kvt_gguf *g = NULL;
	int rc = kvt_gguf_open(path, &g);
	if (rc)
		return rc;
	rc = kvt_model_fingerprint_gguf(g, version, n_threads, out);
	kvt_gguf_close(g);
	return rc;
}

static void hex_of(const uint8_t fp[32], char out[65])
{
	kvt_hash_hex(fp, out);
}

/*
 * Version 1 of write_big's file of (i % 1000) / 4 (exact floats: the same bytes from any build; the synthetic
 * model's quantized weights differ between a Release and a Debug build) and of SmolLM2-135M-Instruct.Q4_1, as
 * builds before version 2 (403ceb3) computed them: data directories made by those builds hold these.
 */
#define V1_BIG "cae54493b3448e045e14e58760fb1abb09af6c250ec967326289897393635960"
#define V1_SMOLLM2_Q4_1 "fbc3e2908c844c192fb17965db6f91917fae04be859f9f2699dd1ccb94f4f181"

static void test_versions(const char *a, const char *cache)
{
	char big[256], hex[65];
	uint8_t v1[32], v2[32], x[32], y[32], base1[32], base2[32];
	bool hit = true;
	int version = 0;
	kvt_synth_llama cfg;

	/* version 2 is another value than version 1; each deterministic */
	kvt_synth_llama_default(&cfg);
	CHECK(kvt_synth_llama_write(&cfg, a) == KVT_OK);
	CHECK(kvt_model_fingerprint(a, NULL, KVT_FP_V1, v1, NULL) == KVT_OK);
	CHECK(kvt_model_fingerprint(a, NULL, KVT_FP_V2, v2, NULL) == KVT_OK);
	CHECK(memcmp(v1, v2, 32) != 0);
	CHECK(fp_of(a, KVT_FP_V2, 1, x) == KVT_OK && memcmp(x, v2, 32) == 0);
	CHECK(kvt_model_fingerprint(a, NULL, 3, x, NULL) == KVT_EINVAL);

	/* both versions cached side by side for one path */
	unlink(cache);
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_V1, x, &hit) == KVT_OK && !hit && memcmp(x, v1, 32) == 0);
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_V2, x, &hit) == KVT_OK && !hit && memcmp(x, v2, 32) == 0);
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_V1, x, &hit) == KVT_OK && hit && memcmp(x, v1, 32) == 0);
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_V2, x, &hit) == KVT_OK && hit && memcmp(x, v2, 32) == 0);

	/* the version a data directory uses: none stored -> 2; version 1 stored -> 1 (cached or hashed);
	 * version 2 stored -> 2; another model's stored -> 2's value (the store refuses it on open) */
	uint8_t zeros[32] = { 0 }, other[32];
	memset(other, 0xa1, 32);
	CHECK(kvt_model_fingerprint_for(a, cache, NULL, x, &version) == KVT_OK && version == 2 && !memcmp(x, v2, 32));
	CHECK(kvt_model_fingerprint_for(a, cache, zeros, x, &version) == KVT_OK && version == 2 && !memcmp(x, v2, 32));
	CHECK(kvt_model_fingerprint_for(a, cache, v1, x, &version) == KVT_OK && version == 1 && !memcmp(x, v1, 32));
	CHECK(kvt_model_fingerprint_for(a, NULL, v1, x, &version) == KVT_OK && version == 1 && !memcmp(x, v1, 32));
	CHECK(kvt_model_fingerprint_for(a, NULL, v2, x, &version) == KVT_OK && version == 2 && !memcmp(x, v2, 32));
	CHECK(kvt_model_fingerprint_for(a, cache, other, x, &version) == KVT_OK && version == 2 && !memcmp(x, v2, 32));
	/* a cache an older build wrote (its version 1 line only) is read as it is */
	unlink(cache);
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_V1, x, &hit) == KVT_OK && !hit);
	CHECK(kvt_model_fingerprint_for(a, cache, v1, x, &version) == KVT_OK && version == 1 && !memcmp(x, v1, 32));
	FILE *f = fopen(cache, "r");
	char line[1024];
	int n_lines = 0;
	while (f && fgets(line, sizeof(line), f))
		n_lines += !strncmp(line, "kvtfp1 ", 7) ? 1 : 100; /* found in the cache: nothing hashed, nothing added */
	if (f)
		fclose(f);
	CHECKF(n_lines == 1, "the cache after a cached version 1 lookup: %d", n_lines);

	/* version 2 over leaves: 5 Mi + 1 floats are 3 leaves (8, 8 and 4 MiB + 4 bytes) */
	const uint64_t n_floats = (5u << 20) + 1;
	float *data = malloc(n_floats * 4);
	CHECK(data != NULL);
	if (!data)
		return;
	for (uint64_t i = 0; i < n_floats; i++)
		data[i] = (float)(i % 1000) * 0.25f;
	snprintf(big, sizeof(big), "%s", a);
	strcpy(strrchr(big, '/') + 1, "big.gguf");
	CHECK(write_big(big, data, n_floats) == KVT_OK);
	CHECK(fp_of(big, KVT_FP_V1, 0, base1) == KVT_OK);
	hex_of(base1, hex);
	CHECKF(strcmp(hex, V1_BIG) == 0, "version 1 of the F32 file changed: %s", hex);
	CHECK(fp_of(big, KVT_FP_V2, 1, base2) == KVT_OK);
	static const uint32_t threads[] = { 2, 3, 7, 0 };
	for (size_t i = 0; i < sizeof(threads) / sizeof(threads[0]); i++) {
		CHECK(fp_of(big, KVT_FP_V2, threads[i], x) == KVT_OK);
		CHECKF(memcmp(x, base2, 32) == 0, "version 2 on %u threads differs from one thread's", threads[i]);
	}
	/* one bit in the first leaf, at the start of the second, in the third, in the last byte */
	static const uint64_t flips[] = { 5, (8u << 20) + 0, (16u << 20) + 12345, (5u << 22) + 3 };
	for (size_t i = 0; i < sizeof(flips) / sizeof(flips[0]); i++) {
		uint8_t *b = (uint8_t *)data + flips[i];
		*b ^= 0x10;
		CHECK(write_big(big, data, n_floats) == KVT_OK);
		CHECK(fp_of(big, KVT_FP_V2, 0, x) == KVT_OK && fp_of(big, KVT_FP_V1, 0, y) == KVT_OK);
		CHECKF(memcmp(x, base2, 32) != 0 && memcmp(y, base1, 32) != 0, "a bit at byte %llu went unseen",
		       (unsigned long long)flips[i]);
		*b ^= 0x10;
	}
	/* the first two leaves swapped: the same leaf digests in another order */
	float *keep = malloc(8u << 20);
	CHECK(keep != NULL);
	if (keep) {
		memcpy(keep, data, 8u << 20);
		memcpy(data, data + (2u << 20), 8u << 20);
		memcpy(data + (2u << 20), keep, 8u << 20);
		free(keep);
		CHECK(write_big(big, data, n_floats) == KVT_OK);
		CHECK(fp_of(big, KVT_FP_V2, 0, x) == KVT_OK);
		CHECK(memcmp(x, base2, 32) != 0);
	}
	free(data);
	unlink(big);
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
	CHECK(kvt_model_fingerprint(a, NULL, KVT_FP_CURRENT, fa, &hit) == KVT_OK && !hit);
	CHECK(kvt_model_fingerprint(b, NULL, KVT_FP_CURRENT, fb, NULL) == KVT_OK);
	CHECK(memcmp(fa, fb, 32) == 0);

	/* the cache: miss, then hit with the same value */
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_CURRENT, fa2, &hit) == KVT_OK && !hit);
	CHECK(memcmp(fa, fa2, 32) == 0);
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_CURRENT, fa2, &hit) == KVT_OK && hit);
	CHECK(memcmp(fa, fa2, 32) == 0);
	/* b gets its own line; a's is kept */
	CHECK(kvt_model_fingerprint(b, cache, KVT_FP_CURRENT, fb, &hit) == KVT_OK && !hit);
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_CURRENT, fa2, &hit) == KVT_OK && hit);
	CHECK(kvt_model_fingerprint(b, cache, KVT_FP_CURRENT, fb, &hit) == KVT_OK && hit);

	/* other weights, same size, same path: the cache misses and the value changes */
	cfg.seed = 2;
	usleep(20000);
	CHECK(kvt_synth_llama_write(&cfg, a) == KVT_OK);
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_CURRENT, fc, &hit) == KVT_OK && !hit);
	CHECK(memcmp(fc, fa, 32) != 0);
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_CURRENT, fa2, &hit) == KVT_OK && hit && memcmp(fa2, fc, 32) == 0);
	/* the same bytes written again: a miss (new mtime/ctime), the same value */
	usleep(20000);
	CHECK(kvt_synth_llama_write(&cfg, a) == KVT_OK);
	CHECK(kvt_model_fingerprint(a, cache, KVT_FP_CURRENT, fa2, &hit) == KVT_OK && !hit && memcmp(fa2, fc, 32) == 0);

	/* a hyperparameter alone changes it */
	kvt_synth_llama_default(&cfg);
	cfg.rope_base = 500000.0f;
	CHECK(kvt_synth_llama_write(&cfg, b) == KVT_OK);
	CHECK(kvt_model_fingerprint(b, NULL, KVT_FP_CURRENT, fc, NULL) == KVT_OK);
	CHECK(memcmp(fc, fa, 32) != 0);

	/* a damaged cache is ignored and rewritten */
	FILE *f = fopen(cache, "w");
	fprintf(f, "garbage\nkvtfp1 1 2 3\n\x01\x02 not a line");
	fclose(f);
	CHECK(kvt_model_fingerprint(b, cache, KVT_FP_CURRENT, fa2, &hit) == KVT_OK && !hit && memcmp(fa2, fc, 32) == 0);
	CHECK(kvt_model_fingerprint(b, cache, KVT_FP_CURRENT, fa2, &hit) == KVT_OK && hit && memcmp(fa2, fc, 32) == 0);

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
			CHECK(kvt_model_fingerprint(b, NULL, KVT_FP_CURRENT, fps[i], NULL) == KVT_OK);
			for (int j = 0; j < i; j++)
				CHECKF(memcmp(fps[i], fps[j], 32) != 0, "fingerprints of %s and %s (window) are equal", archs[i],
				       archs[j]);
		}
	}

	test_versions(a, cache);

	/* a missing or broken model is an error, never a fingerprint */
	char none[256];
	path_in(none, sizeof(none), "none.gguf");
	kvt_log_set_level(-1);
	CHECK(kvt_model_fingerprint(none, cache, KVT_FP_CURRENT, fa2, NULL) != KVT_OK);
	f = fopen(none, "w");
	fprintf(f, "GGUF but not really");
	fclose(f);
	CHECK(kvt_model_fingerprint(none, cache, KVT_FP_CURRENT, fa2, NULL) != KVT_OK);
	kvt_log_set_level(KVT_LOG_INFO);

	/* the real model: version 1 as older builds stored it; both versions cold against a cached start-up
	 * (times informational) */
	const char *model = check_default_model();
	if (model) {
		char mcache[256], hex[65];
		path_in(mcache, sizeof(mcache), "model.cache");
		double t0 = kvt_now_s();
		CHECK(kvt_model_fingerprint(model, mcache, KVT_FP_V1, fc, &hit) == KVT_OK && !hit);
		double t1 = kvt_now_s();
		hex_of(fc, hex);
		CHECKF(strcmp(hex, V1_SMOLLM2_Q4_1) == 0 || !strstr(model, "SmolLM2-135M-Instruct.Q4_1"),
		       "version 1 of the default model changed: %s", hex);
		CHECK(kvt_model_fingerprint(model, mcache, KVT_FP_CURRENT, fa, &hit) == KVT_OK && !hit);
		double t2 = kvt_now_s();
		CHECK(kvt_model_fingerprint(model, mcache, KVT_FP_CURRENT, fa2, &hit) == KVT_OK && hit && memcmp(fa, fa2, 32) == 0);
		double t3 = kvt_now_s();
		printf("default model: fingerprint version 1 %.1f ms cold, version 2 %.1f ms cold, %.3f ms from the cache\n",
		       (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3);
	}

	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", g_dir);
	return check_done("test_index_fingerprint");
}
