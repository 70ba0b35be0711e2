/*
 * engine/model/synth_model.c — the synthetic Llama GGUF writer (see synth_model.h).
 *
 * Vocabulary layout (fixed, independent of the config):
 *   0..255              one token per byte, GPT-2 bytes_to_unicode text;
 *   256..256+N_MERGES-1 one token per merge, the concatenation of its parts;
 *   then <|endoftext|>, <|im_start|> (BOS), <|im_end|> (EOS), type CONTROL.
 * Every merge's parts are tokens defined before it (asserted while building),
 * as a BPE tokenizer requires.
 *
 * Tensor order follows llama.cpp's converter: token_embd, then per layer
 * attn_norm, ffn_down, ffn_gate, ffn_up, ffn_norm, attn_k, attn_output,
 * attn_q, attn_v, then output_norm and (untied) output.
 */
#include "synth_model.h"

#include "gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Merges as raw byte pairs, in rank order; each part is a byte or an earlier result. */
static const char *const synth_merges[][2] = {
	{ " ", "t" }, { "h", "e" }, { " t", "he" }, { "i", "n" }, { " ", "a" }, { "e", "r" },
	{ "o", "n" }, { "r", "e" }, { "a", "n" }, { " ", "s" }, { " ", "w" }, { "o", "u" },
	{ " ", "o" }, { " ", "c" }, { "i", "s" }, { " ", "i" }, { "e", "n" }, { " a", "n" },
	{ " an", "d" }, { " o", "f" }, { "in", "g" }, { "l", "l" }, { " ", "h" }, { " t", "o" },
	{ " i", "s" }, { " ", "b" }, { "e", "d" }, { " ", "m" }, { "o", "r" }, { " ", "H" },
	{ " H", "e" }, { " He", "ll" }, { " Hell", "o" }, { " w", "or" }, { " wor", "l" },
	{ " worl", "d" }, { "H", "e" }, { "He", "ll" }, { "Hell", "o" }, { "a", "t" },
	{ " c", "at" }, { "\n", "\n" }, { " ", " " }, { ",", " " }, { " s", "at" },
	{ " o", "n" },
};
#define N_MERGES (sizeof(synth_merges) / sizeof(synth_merges[0]))

static const char *const synth_specials[] = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" };
#define N_SPECIALS 3
#define N_VOCAB (256 + N_MERGES + N_SPECIALS)
#define MAX_TOKEN_BYTES 64 /* longest encoded token text, with room to spare */

static const char synth_chat_template[] =
	"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
	"'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

void kvt_synth_llama_default(kvt_synth_llama *c)
{
	memset(c, 0, sizeof(*c));
	c->n_layer = 2;
	c->n_embd = 64;
	c->n_head = 4;
	c->n_head_kv = 2;
	c->n_ff = 128;
	c->n_ctx = 512;
	c->rope_base = 10000.0f;
	c->rms_eps = 1e-5f;
	c->weight_type = KVT_GGML_F32;
	c->tied_embeddings = true;
	c->seed = 1;
}

uint32_t kvt_synth_llama_n_vocab(void)
{
	return (uint32_t)N_VOCAB;
}

/*
 * GPT-2 bytes_to_unicode: printable bytes 33..126, 161..172 and 174..255 map
 * to themselves; the other 68 map to U+0100 + (their rank among those 68).
 */
static uint32_t byte_to_cp(uint8_t b)
{
	uint32_t k = 0;

	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
		return b;
	for (uint32_t x = 0; x < b; x++)
		if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
			k++;
	return 256 + k;
}

/* Raw bytes -> bytes_to_unicode text (UTF-8) in out (cap bytes, NUL-terminated). */
static void encode_bytes(const char *raw, char *out, size_t cap)
{
	size_t o = 0;

	for (const unsigned char *s = (const unsigned char *)raw; *s; s++) {
		uint32_t cp = byte_to_cp(*s);
		KVT_ASSERT(o + 3 < cap);
		if (cp < 0x80) {
			out[o++] = (char)cp;
		} else {
			out[o++] = (char)(0xc0 | (cp >> 6));
			out[o++] = (char)(0x80 | (cp & 0x3f));
		}
	}
	out[o] = '\0';
}

typedef struct synth_vocab {
	char text[N_VOCAB][MAX_TOKEN_BYTES];        /* token text, encoded */
	char merges[N_MERGES][2 * MAX_TOKEN_BYTES]; /* "left right", encoded */
	const char *tok_ptrs[N_VOCAB];              /* -> text[i] */
	const char *merge_ptrs[N_MERGES];           /* -> merges[i] */
	int32_t types[N_VOCAB];                     /* enum kvt_tok_type numbers */
} synth_vocab;

static bool vocab_has(const synth_vocab *v, uint32_t n, const char *text)
{
	for (uint32_t i = 0; i < n; i++)
		if (strcmp(v->text[i], text) == 0)
			return true;
	return false;
}

static void vocab_build(synth_vocab *v)
{
	char l[MAX_TOKEN_BYTES], r[MAX_TOKEN_BYTES], both[MAX_TOKEN_BYTES];
	uint32_t n = 0;

	for (uint32_t b = 0; b < 256; b++) {
		uint32_t cp = byte_to_cp((uint8_t)b);
		char *t = v->text[n];
		/* byte 0 cannot go through encode_bytes (NUL-terminated input) */
		if (cp < 0x80) {
			t[0] = (char)cp;
			t[1] = '\0';
		} else {
			t[0] = (char)(0xc0 | (cp >> 6));
			t[1] = (char)(0x80 | (cp & 0x3f));
			t[2] = '\0';
		}
		v->types[n++] = 1; /* NORMAL, as in GPT-2 style GGUFs */
	}
	for (uint32_t m = 0; m < N_MERGES; m++) {
		char cat[MAX_TOKEN_BYTES];
		encode_bytes(synth_merges[m][0], l, sizeof(l));
		encode_bytes(synth_merges[m][1], r, sizeof(r));
		snprintf(cat, sizeof(cat), "%s%s", synth_merges[m][0], synth_merges[m][1]);
		encode_bytes(cat, both, sizeof(both));
		/* A BPE merge joins two existing tokens into a new one. */
		KVT_ASSERT(vocab_has(v, n, l) && vocab_has(v, n, r) && !vocab_has(v, n, both));
		snprintf(v->merges[m], sizeof(v->merges[m]), "%s %s", l, r);
		snprintf(v->text[n], sizeof(v->text[n]), "%s", both);
		v->types[n++] = 1;
	}
	for (uint32_t s = 0; s < N_SPECIALS; s++) {
		snprintf(v->text[n], sizeof(v->text[n]), "%s", synth_specials[s]);
		v->types[n++] = 3; /* CONTROL */
	}
	for (uint32_t i = 0; i < N_VOCAB; i++)
		v->tok_ptrs[i] = v->text[i];
	for (uint32_t i = 0; i < N_MERGES; i++)
		v->merge_ptrs[i] = v->merges[i];
}

/* splitmix64: seeds the per-tensor generator. */
static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [-1, 1) from the top 24 bits. */
static float rng_f32(uint64_t *s)
{
	return (float)((splitmix64(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Generator state for one tensor: depends on the seed and the tensor name only. */
static uint64_t tensor_seed(uint64_t seed, const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 0x100000001b3ull;
	return seed ^ h;
}

/*
 * Add one tensor of ne0 x ne1 (ne1 == 0: 1-D) with values center + scale * U(-1, 1).
 */
static int add_weight(kvt_gguf_writer *w, const char *name, uint32_t type, uint64_t ne0, uint64_t ne1,
		      float center, float scale, uint64_t seed)
{
	uint64_t ne[2] = { ne0, ne1 ? ne1 : 1 };
	uint64_t n = ne[0] * ne[1];
	uint64_t s = tensor_seed(seed, name);
	float *x = malloc(n * sizeof(*x));
	int rc;

	if (!x) {
		KVT_LOGE("synth model: out of memory for tensor '%s'", name);
		return KVT_ENOMEM;
	}
	for (uint64_t i = 0; i < n; i++)
		x[i] = center + scale * rng_f32(&s);
	rc = kvt_gguf_writer_add_tensor_f32(w, name, type, ne1 ? 2 : 1, ne, x);
	free(x);
	return rc;
}

static int check_config(const kvt_synth_llama *c)
{
	uint32_t be, bb;

	if (c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1 || c->n_head_kv < 1 || c->n_ff < 1 || c->n_ctx < 1) {
		KVT_LOGE("synth model: n_layer %u, n_embd %u, n_head %u, n_head_kv %u, n_ff %u, n_ctx %u: all must be >= 1",
			 c->n_layer, c->n_embd, c->n_head, c->n_head_kv, c->n_ff, c->n_ctx);
		return KVT_EINVAL;
	}
	if (c->head_dim ? c->head_dim % 2 : c->n_embd % c->n_head || (c->n_embd / c->n_head) % 2) {
		KVT_LOGE("synth model: n_embd %u / n_head %u (or head_dim %u) must give an even head_dim", c->n_embd,
			 c->n_head, c->head_dim);
		return KVT_EINVAL;
	}
	const char *a = c->arch ? c->arch : "llama";
	if (strcmp(a, "llama") && strcmp(a, "mistral") && strcmp(a, "qwen2") && strcmp(a, "qwen3") && strcmp(a, "gemma3")) {
		KVT_LOGE("synth model: arch '%s' is not one of llama, mistral, qwen2, qwen3, gemma3", a);
		return KVT_EINVAL;
	}
	if (c->n_head % c->n_head_kv) {
		KVT_LOGE("synth model: n_head_kv %u does not divide n_head %u", c->n_head_kv, c->n_head);
		return KVT_EINVAL;
	}
	switch (c->weight_type) {
	case KVT_GGML_F32: case KVT_GGML_F16: case KVT_GGML_BF16:
	case KVT_GGML_Q8_0: case KVT_GGML_Q4_0: case KVT_GGML_Q4_1:
	case KVT_GGML_Q5_0: case KVT_GGML_Q4_K: case KVT_GGML_Q5_K: case KVT_GGML_Q6_K:
		break;
	default:
		KVT_LOGE("synth model: weight_type %s is not one of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K",
			 kvt_ggml_type_name(c->weight_type));
		return KVT_EINVAL;
	}
	if (c->q4_k_m_mix && c->weight_type != KVT_GGML_Q4_K) {
		KVT_LOGE("synth model: q4_k_m_mix needs weight_type Q4_K, not %s", kvt_ggml_type_name(c->weight_type));
		return KVT_EINVAL;
	}
	kvt_ggml_type_block(c->weight_type, &be, &bb);
	if (c->n_embd % be || c->n_ff % be) {
		KVT_LOGE("synth model: weight_type %s needs n_embd (%u) and n_ff (%u) divisible by %u",
			 kvt_ggml_type_name(c->weight_type), c->n_embd, c->n_ff, be);
		return KVT_EINVAL;
	}
	return KVT_OK;
}

/* llama.cpp's general.file_type (LLAMA_FTYPE_*) for the weight type. */
static uint32_t file_type(uint32_t weight_type, bool mix)
{
	switch (weight_type) {
	case KVT_GGML_F16: return 1;
	case KVT_GGML_Q4_0: return 2;
	case KVT_GGML_Q4_1: return 3;
	case KVT_GGML_Q8_0: return 7;
	case KVT_GGML_Q5_0: return 8;
	case KVT_GGML_Q4_K: return mix ? 15 : 14; /* Q4_K_M : Q4_K_S */
	case KVT_GGML_Q5_K: return 16;            /* Q5_K_S */
	case KVT_GGML_Q6_K: return 18;
	case KVT_GGML_BF16: return 32;
	}
	return 0; /* ALL_F32 */
}

static const char *arch_of(const kvt_synth_llama *c) { return c->arch ? c->arch : "llama"; }
static uint32_t head_dim_of(const kvt_synth_llama *c) { return c->head_dim ? c->head_dim : c->n_embd / c->n_head; }

/* The "<arch>." keys beyond Llama's. */
static int add_arch_metadata(kvt_gguf_writer *w, const kvt_synth_llama *c)
{
	const char *a = arch_of(c);
	char key[96];
	int rc = KVT_OK;
#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, a), key)
	if (c->head_dim && ((rc = kvt_gguf_writer_add_u32(w, KEY("attention.key_length"), c->head_dim)) ||
			    (rc = kvt_gguf_writer_add_u32(w, KEY("attention.value_length"), c->head_dim))))
		return rc;
	if (!strcmp(a, "gemma3") &&
	    (rc = kvt_gguf_writer_add_u32(w, KEY("attention.sliding_window"), c->sliding_window ? c->sliding_window : 8)))
		return rc;
	if (c->llama3_rope == 2 && ((rc = kvt_gguf_writer_add_str(w, KEY("rope.scaling.type"), "llama3")) ||
			       (rc = kvt_gguf_writer_add_f32(w, KEY("rope.scaling.factor"), 8.0f)) ||
			       (rc = kvt_gguf_writer_add_f32(w, KEY("rope.scaling.low_freq_factor"), 1.0f)) ||
			       (rc = kvt_gguf_writer_add_f32(w, KEY("rope.scaling.high_freq_factor"), 4.0f)) ||
			       (rc = kvt_gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), 32))))
		return rc;
#undef KEY
	return rc;
}

/* The tokenizer.* keys of another file (tok), instead of the synthetic vocabulary. */
static int copy_tokenizer(kvt_gguf_writer *w, const kvt_gguf *tok)
{
	int rc = KVT_OK;
	for (uint64_t i = 0; i < kvt_gguf_n_kv(tok) && rc == KVT_OK; i++) {
		const kvt_gguf_kv *kv = kvt_gguf_kv_at(tok, i);
		char key[256];
		if (kv->key.len >= sizeof(key))
			continue;
		memcpy(key, kv->key.ptr, kv->key.len);
		key[kv->key.len] = 0;
		if (!strncmp(key, "tokenizer.", 10))
			rc = kvt_gguf_writer_copy_kv(w, key, kv);
	}
	return rc;
}

static int add_metadata(kvt_gguf_writer *w, const kvt_synth_llama *c, const synth_vocab *v, const kvt_gguf *tok,
			uint32_t n_vocab)
{
	uint32_t head_dim = head_dim_of(c);
	uint32_t id_eot = 256 + N_MERGES, id_bos = id_eot + 1, id_eos = id_eot + 2;
	int rc;

	/* Each add logs its own failure; stop at the first. */
	const char *a = arch_of(c);
	char key[96];
#define KEY(suffix) (snprintf(key, sizeof(key), "%s." suffix, a), key)
	if ((rc = kvt_gguf_writer_add_str(w, "general.architecture", a)) ||
	    (rc = kvt_gguf_writer_add_str(w, "general.type", "model")) ||
	    (rc = kvt_gguf_writer_add_str(w, "general.name", "kvtier synthetic llama")) ||
	    (rc = kvt_gguf_writer_add_u32(w, "general.alignment", KVT_GGUF_DEFAULT_ALIGNMENT)) ||
	    (rc = kvt_gguf_writer_add_u32(w, "general.file_type", file_type(c->weight_type, c->q4_k_m_mix))) ||
	    (rc = kvt_gguf_writer_add_u32(w, "general.quantization_version", 2)) ||
	    (rc = kvt_gguf_writer_add_u32(w, KEY("block_count"), c->n_layer)) ||
	    (rc = kvt_gguf_writer_add_u32(w, KEY("context_length"), c->n_ctx)) ||
	    (rc = kvt_gguf_writer_add_u32(w, KEY("embedding_length"), c->n_embd)) ||
	    (rc = kvt_gguf_writer_add_u32(w, KEY("feed_forward_length"), c->n_ff)) ||
	    (rc = kvt_gguf_writer_add_u32(w, KEY("attention.head_count"), c->n_head)) ||
	    (rc = kvt_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), c->n_head_kv)) ||
	    (rc = kvt_gguf_writer_add_f32(w, KEY("rope.freq_base"), c->rope_base != 0.0f ? c->rope_base : 10000.0f)) ||
	    (rc = kvt_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"),
					  c->rms_eps != 0.0f ? c->rms_eps : 1e-5f)) ||
	    (rc = kvt_gguf_writer_add_u32(w, KEY("vocab_size"), n_vocab)) ||
	    (rc = kvt_gguf_writer_add_u32(w, KEY("rope.dimension_count"), head_dim)) ||
	    (rc = add_arch_metadata(w, c)))
		return rc;
	if (tok)
		return copy_tokenizer(w, tok);
	if ((rc = kvt_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", false)) ||
	    (rc = kvt_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false)) ||
	    (rc = kvt_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2")) ||
	    (rc = kvt_gguf_writer_add_str(w, "tokenizer.ggml.pre", "smollm")) ||
	    (rc = kvt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", v->tok_ptrs, N_VOCAB)) ||
	    (rc = kvt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", v->types, N_VOCAB)) ||
	    (rc = kvt_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", v->merge_ptrs, N_MERGES)) ||
	    (rc = kvt_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", id_bos)) ||
	    (rc = kvt_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", id_eos)) ||
	    (rc = kvt_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", id_eot)) ||
	    (rc = kvt_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", id_eos)) ||
	    (rc = kvt_gguf_writer_add_str(w, "tokenizer.chat_template", synth_chat_template)))
		return rc;
#undef KEY
	return KVT_OK;
}

/* rope_freqs.weight: Llama 3's per-pair divisors, as llama.cpp's converter computes them
 * (the constants of kvt_synth_llama.llama3_rope). */
static int add_rope_freqs(kvt_gguf_writer *w, const kvt_synth_llama *c)
{
	const uint32_t hd = head_dim_of(c), half = hd / 2;
	const double base = c->rope_base != 0.0f ? c->rope_base : 10000.0f, factor = 8, lo = 1, hi = 4, orig = 32;
	float f[512];
	uint64_t ne[1] = { half };
	if (half > 512)
		return KVT_EINVAL;
	for (uint32_t i = 0; i < half; i++) {
		const double freq = pow(base, -2.0 * i / hd), wl = 2 * M_PI / freq;
		if (wl < orig / hi)
			f[i] = 1.0f;
		else if (wl > orig / lo)
			f[i] = (float)factor;
		else {
			const double smooth = (orig / wl - lo) / (hi - lo);
			f[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
		}
	}
	return kvt_gguf_writer_add_tensor_f32(w, "rope_freqs.weight", KVT_GGML_F32, 1, ne, f);
}

static int add_tensors(kvt_gguf_writer *w, const kvt_synth_llama *c, uint32_t n_vocab)
{
	uint32_t head_dim = head_dim_of(c), n_kv = c->n_head_kv * head_dim, n_q = c->n_head * head_dim;
	uint32_t wt = c->weight_type;
	const char *a = arch_of(c);
	const bool bias = !strcmp(a, "qwen2"), qk_norm = !strcmp(a, "qwen3") || !strcmp(a, "gemma3");
	const bool post = !strcmp(a, "gemma3");
	float s_q = sqrtf(3.0f / (float)n_q);
	float s_embd = sqrtf(3.0f / (float)c->n_embd), s_ff = sqrtf(3.0f / (float)c->n_ff);
	char name[64];
	int rc;

	/* token_embd ne = [n_embd, n_vocab]: row t is token t's embedding. */
	if ((rc = add_weight(w, "token_embd.weight", wt, c->n_embd, n_vocab, 0.0f, 1.0f, c->seed)))
		return rc;
	for (uint32_t l = 0; l < c->n_layer; l++) {
		/* ggml shape [in, out]: ne[0] is the input width, the fan-in. */
		const struct { const char *n; uint64_t ne0, ne1; float center, scale; } t[] = {
			{ "attn_norm", c->n_embd, 0, 1.0f, 0.1f },
			{ "ffn_down", c->n_ff, c->n_embd, 0.0f, s_ff },
			{ "ffn_gate", c->n_embd, c->n_ff, 0.0f, s_embd },
			{ "ffn_up", c->n_embd, c->n_ff, 0.0f, s_embd },
			{ "ffn_norm", c->n_embd, 0, 1.0f, 0.1f },
			{ "attn_k", c->n_embd, n_kv, 0.0f, s_embd },
			{ "attn_output", n_q, c->n_embd, 0.0f, s_q },
			{ "attn_q", c->n_embd, n_q, 0.0f, s_embd },
			{ "attn_v", c->n_embd, n_kv, 0.0f, s_embd },
		};
		for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
			snprintf(name, sizeof(name), "blk.%u.%s.weight", l, t[i].n);
			/* Norm weights stay F32, as in real conversions; a Q4_K_M mix keeps
			 * attn_v and ffn_down in Q6_K (llama.cpp does so for some layers) */
			uint32_t type = t[i].ne1 ? wt : KVT_GGML_F32;
			if (c->q4_k_m_mix && (!strcmp(t[i].n, "attn_v") || !strcmp(t[i].n, "ffn_down")))
				type = KVT_GGML_Q6_K;
			if ((rc = add_weight(w, name, type, t[i].ne0, t[i].ne1,
					     t[i].center, t[i].scale, c->seed)))
				return rc;
		}
		/* the family's extra tensors (1-D, F32): biases, per-head Q/K norms, post-norms */
		const struct { const char *n; uint64_t ne0; float center, scale; bool on; } x[] = {
			{ "attn_q.bias", n_q, 0.0f, 0.5f, bias },
			{ "attn_k.bias", n_kv, 0.0f, 0.5f, bias },
			{ "attn_v.bias", n_kv, 0.0f, 0.5f, bias },
			{ "attn_q_norm.weight", head_dim, 1.0f, 0.1f, qk_norm },
			{ "attn_k_norm.weight", head_dim, 1.0f, 0.1f, qk_norm },
			{ "post_attention_norm.weight", c->n_embd, 1.0f, 0.1f, post },
			{ "post_ffw_norm.weight", c->n_embd, 1.0f, 0.1f, post },
		};
		for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++) {
			snprintf(name, sizeof(name), "blk.%u.%s", l, x[i].n);
			if (x[i].on && (rc = add_weight(w, name, KVT_GGML_F32, x[i].ne0, 0, x[i].center, x[i].scale, c->seed)))
				return rc;
		}
	}
	if (c->llama3_rope == 1 && (rc = add_rope_freqs(w, c)))
		return rc;
	if ((rc = add_weight(w, "output_norm.weight", KVT_GGML_F32, c->n_embd, 0, 1.0f, 0.1f, c->seed)))
		return rc;
	if (!c->tied_embeddings &&
	    (rc = add_weight(w, "output.weight", wt, c->n_embd, n_vocab, 0.0f, s_embd, c->seed)))
		return rc;
	return KVT_OK;
}

int kvt_synth_llama_write(const kvt_synth_llama *c, const char *path)
{
	kvt_gguf_writer *w = NULL;
	synth_vocab *v;
	int rc;

	if ((rc = check_config(c)))
		return rc;
	v = calloc(1, sizeof(*v));
	if (!v) {
		KVT_LOGE("synth model: out of memory");
		return KVT_ENOMEM;
	}
	vocab_build(v);
	kvt_gguf *tok = NULL;
	uint32_t n_vocab = (uint32_t)N_VOCAB;
	if (c->tokenizer_from) {
		const kvt_gguf_kv *toks = NULL;
		if ((rc = kvt_gguf_open(c->tokenizer_from, &tok)))
			goto out;
		if (kvt_gguf_get_arr(tok, "tokenizer.ggml.tokens", KVT_GGUF_STRING, &toks) || !toks->n ||
		    toks->n > UINT32_MAX) {
			KVT_LOGE("synth model: %s has no tokenizer.ggml.tokens array to copy", c->tokenizer_from);
			rc = KVT_EINVAL;
			goto out;
		}
		n_vocab = (uint32_t)toks->n;
	}
	if (!(rc = kvt_gguf_writer_create(&w)) && !(rc = add_metadata(w, c, v, tok, n_vocab)) &&
	    !(rc = add_tensors(w, c, n_vocab)))
		rc = kvt_gguf_writer_write(w, path);
out:
	kvt_gguf_writer_destroy(w);
	kvt_gguf_close(tok);
	free(v);
	return rc;
}
