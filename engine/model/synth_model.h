/*
 * engine/model/synth_model.h — writes a tiny synthetic Llama GGUF for tests and
 * benchmarks.
 *
 * The file looks like a real llama.cpp conversion (SmolLM2's layout): llama.*
 * hyperparameters, a GPT-2 byte-level BPE tokenizer (256 byte tokens in
 * bytes_to_unicode form, a few dozen merges, then the ChatML control tokens
 * <|endoftext|>, <|im_start|> = BOS, <|im_end|> = EOS), a ChatML chat
 * template, and every tensor llama.cpp's loader expects, in ggml shapes.
 *
 * Weights are seeded per tensor (seed and tensor name), uniform in
 * +-sqrt(3 / fan_in) so activations stay O(1); norm weights are 1 +- 0.1 and
 * embeddings +-1, so logits are spread out and greedy decoding changes from
 * token to token. A tensor's float values do not depend on weight_type or on
 * the other settings' effect on other tensors, so an F32 and a Q8_0 model with
 * the same seed and shape differ only by quantization.
 *
 * Other architectures (arch): the same vocabulary and weights, plus the
 * tensors and keys the family needs, named as llama.cpp's converter names
 * them, so llama.cpp loads the file as that family.
 */
#ifndef KVT_SYNTH_MODEL_H
#define KVT_SYNTH_MODEL_H

#include "kvt.h"

typedef struct kvt_synth_llama {
	uint32_t n_layer;     /* transformer blocks, >= 1 */
	uint32_t n_embd;      /* model width, divisible by n_head */
	uint32_t n_head;      /* query heads; head_dim = n_embd / n_head must be even (RoPE) */
	uint32_t n_head_kv;   /* K/V heads, divides n_head */
	uint32_t n_ff;        /* feed-forward width */
	uint32_t n_ctx;       /* llama.context_length */
	float rope_base;      /* llama.rope.freq_base; 0: 10000 */
	float rms_eps;        /* llama.attention.layer_norm_rms_epsilon; 0: 1e-5 */
	uint32_t weight_type; /* enum kvt_ggml_type of the 2-D weights: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
	                         Q5_0, Q4_K, Q5_K, Q6_K (block types need n_embd and n_ff divisible
	                         by the block: 32, or 256 for the K-quants) */
	bool q4_k_m_mix;      /* weight_type Q4_K with attn_v and ffn_down in Q6_K, as in a Q4_K_M file */
	bool tied_embeddings; /* true: no output.weight (the output projection is token_embd) */
	uint64_t seed;        /* weight generator seed */
	const char *arch;     /* general.architecture: NULL or "llama", "mistral" (Llama's tensors
	                         under mistral.* keys), "qwen2" (adds Q/K/V biases),
	                         "qwen3" (Q/K norms), "gemma3" (Q/K norms, post-attention and post-FFN
	                         norms, sliding window); the keys are prefixed with it */
	uint32_t head_dim;    /* 0: n_embd / n_head; else written as attention.key_length and
	                         value_length (Q is n_head * head_dim wide) */
	uint32_t sliding_window; /* gemma3: attention.sliding_window (0: 8) */
	const char *tokenizer_from; /* NULL: the synthetic vocabulary above; else a GGUF file whose
	                         tokenizer.* keys (vocabulary, merges, special ids, chat template) are
	                         copied, the embeddings sized to its vocabulary: a real tokenizer on
	                         a synthetic model (benchmarks at real shapes) */
	uint32_t llama3_rope; /* llama, Llama 3 RoPE scaling (factor 8, low 1, high 4, original
	                         context 32: small, so a short prompt sees all three bands):
	                         0 none; 1 the rope_freqs.weight tensor llama.cpp's converter
	                         computes (what real Llama 3.x GGUFs carry); 2 only the
	                         rope.scaling.* keys (type "llama3"; llama.cpp refuses these) */
} kvt_synth_llama;

/* 2 layers, n_embd 64, 4 heads, 2 kv heads, n_ff 128, n_ctx 512, F32, tied, seed 1. */
void kvt_synth_llama_default(kvt_synth_llama *c);

/* Vocabulary size of every synthetic model (byte tokens + merges + 3 control tokens). */
uint32_t kvt_synth_llama_n_vocab(void);

/*
 * Write the model to path (created or truncated). KVT_EINVAL for a config
 * that cannot be a valid model (logged, naming the field), KVT_EIO for a
 * write error, KVT_ENOMEM; with tokenizer_from, that file's open error, or
 * KVT_EINVAL when it has no tokenizer.ggml.tokens array. The whole file is built in memory first (about the
 * size of the file).
 */
int kvt_synth_llama_write(const kvt_synth_llama *c, const char *path);

#endif
