/*
 * engine/model/arch.c — the per-architecture trait table (see arch.h).
 *
 * Sources for each row: llama.cpp's llama-model.cpp (hparams, tensor lists and
 * graph per LLM_ARCH_*) and llama-arch.cpp (tensor names), read for llama-cpp-python
 * 0.3.16, the version the references in tests/ref were made with.
 *   llama, mistral: the base.
 *   qwen2:  Q/K/V biases; NEOX RoPE.
 *   qwen3:  per-head Q/K RMSNorm before RoPE, no biases; NEOX RoPE.
 *   gemma3: embedding scale sqrt(n_embd), GELU(tanh) gate, Q/K norms, post-attention
 *           and post-FFN norms, NEOX RoPE, sliding window on 5 of every 6 layers with
 *           RoPE base 10000 there. Its GGUF norm weights already hold 1 + w (the
 *           converter adds the 1 that Gemma's RMSNorm applies), so they multiply as
 *           stored. Query scale 1/sqrt(attention.key_length), which is what every
 *           size but 27B uses (model.c makes its exception, as llama.cpp does).
 */
#include "arch.h"

#include "dev.h"

#include <string.h>

static const kvt_arch archs[] = {
	{ .name = "llama" },
	{ .name = "mistral" },
	{ .name = "qwen2", .qkv_bias = true, .rope_neox = true },
	{ .name = "qwen3", .qk_norm = true, .rope_neox = true },
	{ .name = "gemma3",
	  .qk_norm = true,
	  .post_norms = true,
	  .embd_scale = true,
	  .rope_neox = true,
	  .act = KVT_ACT_GELU_TANH,
	  .swa = true,
	  .swa_pattern = 6,
	  .swa_rope_base = 10000.0f },
};

const kvt_arch *kvt_arch_find(const char *name, size_t len)
{
	for (size_t i = 0; i < sizeof(archs) / sizeof(*archs); i++)
		if (strlen(archs[i].name) == len && !memcmp(archs[i].name, name, len))
			return &archs[i];
	return NULL;
}

const char *kvt_arch_names(void)
{
	return "llama, mistral, qwen2, qwen3, gemma3";
}
