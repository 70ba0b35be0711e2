/*
 * engine/model/arch.h — what each supported architecture (GGUF
 * general.architecture) changes in the one forward pass of model.c.
 *
 * Llama is the base: pre-norm RMSNorm blocks, Q/K/V/O without biases, RoPE
 * on adjacent pairs (the converter permutes Llama's Q/K rows for it), full
 * causal attention, a SiLU-gated FFN, no embedding scale. Every other family
 * is that pass plus the traits set in its table entry (arch.c), the way
 * llama.cpp describes a family by its hparams rather than by a forward pass
 * of its own. Each trait names the tensors it requires; a file missing one
 * is refused at load, naming the tensor.
 *
 * Traits that change K/V (RoPE pairing and base, Q/K norms, biases, the
 * window) are a function of the architecture name and the "<arch>." keys,
 * both of which the model fingerprint hashes (fingerprint.c), so KV made
 * under one architecture is never looked up under another.
 */
#ifndef KVT_ARCH_H
#define KVT_ARCH_H

#include "kvt.h"

typedef struct kvt_arch {
	const char *name;        /* general.architecture */
	bool qkv_bias;           /* blk.N.attn_{q,k,v}.bias added after the projections (Qwen2) */
	bool qk_norm;            /* blk.N.attn_{q,k}_norm.weight: RMSNorm over each head of Q and K
	                            before RoPE (Qwen3, Gemma 3) */
	bool post_norms;         /* blk.N.post_attention_norm / post_ffw_norm: RMSNorm of each
	                            sublayer's output before it joins the residual (Gemma 3) */
	bool embd_scale;         /* embeddings times sqrt(n_embd) (Gemma) */
	bool rope_neox;          /* RoPE pairs (x[i], x[i + n_rot/2]) (no Q/K permutation in the converter) */
	int act;                 /* enum kvt_act of the gated FFN */
	bool swa;                /* sliding-window attention on the local layers: window from
	                            <arch>.attention.sliding_window (required) */
	uint32_t swa_pattern;    /* with swa: layer l is local when l % swa_pattern < swa_pattern - 1
	                            (llama.cpp's Gemma 3: 5 local, then 1 global) */
	float swa_rope_base;     /* with swa: the local layers' RoPE base (the global one is
	                            <arch>.rope.freq_base) */
} kvt_arch;

/* The description of an architecture name (len bytes, not terminated), or NULL. */
const kvt_arch *kvt_arch_find(const char *name, size_t len);
/* The supported names, comma-separated, for error messages. */
const char *kvt_arch_names(void);

#endif
