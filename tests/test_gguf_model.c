/*
 * tests/test_gguf_model.c — the reader on the real default model
 * (SmolLM2-135M-Instruct Q4_1); skipped (77) when the file is absent.
 *
 * Checks the header, the llama.* hyperparameters, the tokenizer arrays, every
 * tensor's shape and type, and dequantized values. The reference values were
 * obtained independently with the python `gguf` package (0.19.0):
 *
 *   r = gguf.GGUFReader("models/SmolLM2-135M-Instruct.Q4_1.gguf")
 *   t = [t for t in r.tensors if t.name == NAME][0]
 *   gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)[INDEX]
 *
 * Flat indices run over the tensor in ggml order (ne[0] fastest), so index
 * 576 * 49151 + 575 is the last element of token 49151's embedding.
 */
/* ctest-labels: model */
#include "check.h"
#include "gguf.h"

#include <stdint.h>

typedef struct ref_value {
	uint64_t i; /* flat element index */
	float v;    /* gguf-py's dequantized value */
} ref_value;

static bool str_is(kvt_gguf_str s, const char *c)
{
	return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static void check_values(const kvt_gguf *g, const char *name, uint32_t type, uint64_t n_elems,
			 const ref_value *ref, int n_ref)
{
	const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, name);

	CHECKF(t != NULL, "%s missing", name);
	if (!t)
		return;
	CHECKF(t->type == type && t->n_elems == n_elems, "%s: type %s, %llu elements", name,
	       kvt_ggml_type_name(t->type), (unsigned long long)t->n_elems);
	float *x = malloc(t->n_elems * sizeof(float));
	double t0 = kvt_now_s();
	CHECK(kvt_gguf_tensor_to_f32(g, t, x) == KVT_OK);
	printf("%s (%s, %llu elements): dequantized in %.1f ms\n", name, kvt_ggml_type_name(t->type),
	       (unsigned long long)t->n_elems, (kvt_now_s() - t0) * 1e3);
	for (int k = 0; k < n_ref; k++) {
		/* The products are exact in float for these scales; allow one rounding anyway (FMA contraction). */
		float v = x[ref[k].i];
		CHECKF(fabsf(v - ref[k].v) <= fabsf(ref[k].v) * 1e-6f, "%s[%llu] = %.9g, gguf-py %.9g", name,
		       (unsigned long long)ref[k].i, (double)v, (double)ref[k].v);
	}
	free(x);
}

int main(void)
{
	const char *path = check_default_model();
	kvt_gguf *g = NULL;
	uint32_t u;
	float f;
	kvt_gguf_str s;
	const kvt_gguf_kv *arr;

	if (!path)
		return check_skip("test_gguf_model", "default model not found (scripts/fetch_model.sh)");
	double t0 = kvt_now_s();
	CHECK(kvt_gguf_open(path, &g) == KVT_OK);
	if (!g)
		return check_done("test_gguf_model");
	printf("opened %s in %.1f ms\n", path, (kvt_now_s() - t0) * 1e3);

	CHECK(kvt_gguf_version(g) == 3);
	CHECK(kvt_gguf_alignment(g) == 32); /* no general.alignment key: the default */
	CHECK(kvt_gguf_find_kv(g, "general.alignment") == NULL);
	CHECK(kvt_gguf_n_kv(g) == 33);
	CHECK(kvt_gguf_n_tensors(g) == 272);

	CHECK(kvt_gguf_get_str(g, "general.architecture", &s) == KVT_OK && str_is(s, "llama"));
	CHECK(kvt_gguf_get_u32(g, "llama.block_count", &u) == KVT_OK && u == 30);
	CHECK(kvt_gguf_get_u32(g, "llama.context_length", &u) == KVT_OK && u == 8192);
	CHECK(kvt_gguf_get_u32(g, "llama.embedding_length", &u) == KVT_OK && u == 576);
	CHECK(kvt_gguf_get_u32(g, "llama.feed_forward_length", &u) == KVT_OK && u == 1536);
	CHECK(kvt_gguf_get_u32(g, "llama.attention.head_count", &u) == KVT_OK && u == 9);
	CHECK(kvt_gguf_get_u32(g, "llama.attention.head_count_kv", &u) == KVT_OK && u == 3);
	CHECK(kvt_gguf_get_u32(g, "llama.vocab_size", &u) == KVT_OK && u == 49152);
	CHECK(kvt_gguf_get_u32(g, "llama.rope.dimension_count", &u) == KVT_OK && u == 64);
	CHECK(kvt_gguf_get_f32(g, "llama.rope.freq_base", &f) == KVT_OK && f == 100000.0f);
	CHECK(kvt_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f) == KVT_OK && f == 1e-5f);
	CHECK(kvt_gguf_get_u32(g, "general.file_type", &u) == KVT_OK && u == 3); /* MOSTLY_Q4_1 */

	/* Tokenizer: GPT-2 BPE, 49152 tokens, 48900 merges, 17 control tokens at the start. */
	CHECK(kvt_gguf_get_str(g, "tokenizer.ggml.model", &s) == KVT_OK && str_is(s, "gpt2"));
	CHECK(kvt_gguf_get_str(g, "tokenizer.ggml.pre", &s) == KVT_OK && str_is(s, "smollm"));
	CHECK(kvt_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u) == KVT_OK && u == 1);
	CHECK(kvt_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u) == KVT_OK && u == 2);
	bool add_bos = true;
	CHECK(kvt_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) == KVT_OK && !add_bos);
	CHECK(kvt_gguf_get_str(g, "tokenizer.chat_template", &s) == KVT_OK && s.len > 100);
	CHECK(kvt_gguf_get_arr(g, "tokenizer.ggml.tokens", KVT_GGUF_STRING, &arr) == KVT_OK);
	if (arr) {
		CHECK(arr->n == 49152);
		CHECK(str_is(arr->v.arr.strs[0], "<|endoftext|>") && str_is(arr->v.arr.strs[1], "<|im_start|>") &&
		      str_is(arr->v.arr.strs[2], "<|im_end|>") && str_is(arr->v.arr.strs[100], "t"));
	}
	arr = NULL;
	CHECK(kvt_gguf_get_arr(g, "tokenizer.ggml.merges", KVT_GGUF_STRING, &arr) == KVT_OK);
	CHECK(arr && arr->n == 48900 && str_is(arr->v.arr.strs[0], "\xc4\xa0 t"));
	arr = NULL;
	CHECK(kvt_gguf_get_arr(g, "tokenizer.ggml.token_type", KVT_GGUF_INT32, &arr) == KVT_OK);
	if (arr) {
		int n_control = 0;
		for (uint64_t i = 0; i < arr->n; i++)
			n_control += kvt_gguf_arr_i64(arr, i) == 3;
		CHECK(arr->n == 49152 && n_control == 17 && kvt_gguf_arr_i64(arr, 16) == 3 &&
		      kvt_gguf_arr_i64(arr, 17) == 1);
	}

	/* Tensors: 1 embedding (Q8_0, tied: no output.weight), 30 x 9 per layer, output_norm. */
	int n_q41 = 0, n_f32 = 0, n_q80 = 0, misaligned = 0;
	uint64_t end = 0;
	for (uint64_t i = 0; i < kvt_gguf_n_tensors(g); i++) {
		const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
		n_q41 += t->type == KVT_GGML_Q4_1;
		n_f32 += t->type == KVT_GGML_F32;
		n_q80 += t->type == KVT_GGML_Q8_0;
		misaligned += (uintptr_t)t->data % 32 != 0;
		if (t->off_data + t->n_bytes > end)
			end = t->off_data + t->n_bytes;
	}
	CHECK(n_q41 == 210 && n_f32 == 61 && n_q80 == 1 && misaligned == 0);
	CHECK(kvt_gguf_find_tensor(g, "output.weight") == NULL);
	printf("data section ends %llu bytes after its start\n", (unsigned long long)end);
	const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, "token_embd.weight");
	CHECK(t && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152 && t->n_bytes == 30081024);
	t = kvt_gguf_find_tensor(g, "blk.0.attn_k.weight");
	CHECK(t && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 192 && t->type == KVT_GGML_Q4_1);
	t = kvt_gguf_find_tensor(g, "blk.29.ffn_down.weight");
	CHECK(t && t->ne[0] == 1536 && t->ne[1] == 576);
	t = kvt_gguf_find_tensor(g, "output_norm.weight");
	CHECK(t && t->n_dims == 1 && t->ne[0] == 576 && t->type == KVT_GGML_F32);
	for (int l = 0; l < 30; l++) {
		static const char *const parts[9] = { "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
						      "ffn_norm", "ffn_gate", "ffn_up", "ffn_down" };
		char name[64];
		for (int k = 0; k < 9; k++) {
			snprintf(name, sizeof(name), "blk.%d.%s.weight", l, parts[k]);
			CHECKF(kvt_gguf_find_tensor(g, name) != NULL, "%s missing", name);
		}
	}

	/* Values from gguf-py (see the file comment). */
	static const ref_value embd[] = {
		{ 0, -0.10654449462890625f }, { 1, 0.032978057861328125f }, { 2, 0.048198699951171875f },
		{ 3, -0.022830963134765625f }, { 31, -0.20040512084960938f }, { 32, -0.09348678588867188f },
		{ 1000, 0.007411956787109375f }, { 12345, 0.031005859375f }, { 28311551, -0.0417022705078125f },
	};
	static const ref_value attn_q0[] = {
		{ 0, -0.0963134765625f }, { 1, 0.1573486328125f }, { 3, -0.73046875f }, { 4, 1.1719970703125f },
		{ 31, -0.0963134765625f }, { 32, -0.34619140625f }, { 1000, -0.138427734375f },
		{ 12345, 0.12109375f }, { 331775, -0.255859375f },
	};
	static const ref_value ffn_down29[] = {
		{ 0, -0.2733154296875f }, { 1, 0.186279296875f }, { 17, 0.04840087890625f }, { 884735, 0.056640625f },
	};
	static const ref_value out_norm[] = { { 0, 1.7578125f }, { 1, 1.8203125f }, { 575, 1.984375f } };
	check_values(g, "token_embd.weight", KVT_GGML_Q8_0, 576ull * 49152, embd, sizeof(embd) / sizeof(embd[0]));
	check_values(g, "blk.0.attn_q.weight", KVT_GGML_Q4_1, 576ull * 576, attn_q0, sizeof(attn_q0) / sizeof(attn_q0[0]));
	check_values(g, "blk.29.ffn_down.weight", KVT_GGML_Q4_1, 1536ull * 576, ffn_down29,
		     sizeof(ffn_down29) / sizeof(ffn_down29[0]));
	check_values(g, "output_norm.weight", KVT_GGML_F32, 576, out_norm, sizeof(out_norm) / sizeof(out_norm[0]));

	/* Every tensor dequantizes to finite values; time the whole model (about 135M weights). */
	uint64_t n_total = 0, n_bad = 0;
	t0 = kvt_now_s();
	for (uint64_t i = 0; i < kvt_gguf_n_tensors(g); i++) {
		const kvt_gguf_tensor *ti = kvt_gguf_tensor_at(g, i);
		float *x = malloc(ti->n_elems * sizeof(float));
		CHECK(kvt_gguf_tensor_to_f32(g, ti, x) == KVT_OK);
		for (uint64_t k = 0; k < ti->n_elems; k++)
			n_bad += !isfinite(x[k]);
		n_total += ti->n_elems;
		free(x);
	}
	printf("all %llu weights dequantized (and scanned) in %.0f ms\n", (unsigned long long)n_total,
	       (kvt_now_s() - t0) * 1e3);
	CHECK(n_total == 134515008 && n_bad == 0);
	kvt_gguf_close(g);
	return check_done("test_gguf_model");
}
