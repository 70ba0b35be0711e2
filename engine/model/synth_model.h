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
} kvt_synth_llama;

/* 2 layers, n_embd 64, 4 heads, 2 kv heads, n_ff 128, n_ctx 512, F32, tied, seed 1. */
void kvt_synth_llama_default(kvt_synth_llama *c);

/* Vocabulary size of every synthetic model (byte tokens + merges + 3 control tokens). */
uint32_t kvt_synth_llama_n_vocab(void);

/*
 * Write the model to path (created or truncated). KVT_EINVAL for a config
 * that cannot be a valid model (logged, naming the field), KVT_EIO for a
 * write error, KVT_ENOMEM. The whole file is built in memory first (about the
 * size of the file).
 */
int kvt_synth_llama_write(const kvt_synth_llama *c, const char *path);

#endif
