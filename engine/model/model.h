/*
 * engine/model/ — the model runtime: everything that turns a GGUF file into
 * tokens. GGUF reader and writer (gguf.h), tokenizer and chat template
 * (tokenizer.h), weights and the forward pass over paged KV (this header),
 * sampler (sampler.h), the synthetic-model writer for tests (synth_model.h),
 * the model fingerprint (fingerprint.h) and one-request generation
 * (generate.h). It may use tiers/, index/, gpu/ and core/; it knows nothing
 * of requests, sessions, HTTP or configuration files, and never includes a
 * header of engine/serve/ or engine/cli/ (cmake/check_layout.cmake fails the
 * build if it does).
 *
 * engine/model/model.h — a model of one of the supported architectures
 * (arch.h: Llama, Mistral, Qwen2, Qwen3, Gemma 3): weights on the device, the
 * forward pass over paged KV, and the per-sequence block table.
 *
 * Loading reads the architecture from GGUF metadata ({arch}.block_count,
 * ...), checks every tensor's presence, shape and values, and stores it on the
 * device: a matrix stored block-quantized (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K,
 * Q6_K) stays so when the backend multiplies that form directly (a decode step
 * is bound by reading the weights: Q4_K is 4.5 bits a weight against fp16's
 * 16); every other tensor is dequantized to the weight dtype (fp16 by default,
 * fp32 on request), and a block-quantized matrix that is widened so gets an
 * info log line naming it, its type and why. Norm weights are fp32. All activation buffers and the op workspace are allocated once
 * here, for a maximum batch of max_batch tokens and a context of max_ctx, so
 * the forward pass allocates nothing.
 *
 * A sequence (kvt_seq) is the engine's view of one token stream's KV: a block
 * table of T0 slots (one per block_tokens tokens) and the count of tokens
 * whose K/V are stored. kvt_model_forward appends tokens: it reserves the
 * blocks they need, runs the layers over them (prefill of n > 1 tokens on top
 * of whatever the sequence already holds, or decode of one), and returns
 * logits. Full blocks can be shared between sequences by reference
 * (kvt_seq_share_prefix): that is how a cached prefix is reused.
 *
 * Thread rules: one model is driven by one thread at a time.
 */
#ifndef KVT_MODEL_H
#define KVT_MODEL_H

#include "dev.h"
#include "tiers.h"

struct kvt_gguf;

typedef struct kvt_model_hparams {
	char arch[32];          /* general.architecture, e.g. "llama" */
	uint32_t n_layer;       /* transformer blocks */
	uint32_t n_embd;        /* model width */
	uint32_t n_head;        /* query heads */
	uint32_t n_head_kv;     /* K/V heads (GQA) */
	uint32_t head_dim;      /* n_embd / n_head */
	uint32_t n_rot;         /* rotated dims per head */
	uint32_t n_ff;          /* feed-forward width */
	uint32_t n_vocab;       /* vocabulary (rows of token_embd) */
	uint32_t n_ctx_train;   /* trained context length */
	float rope_base;        /* RoPE theta base */
	float rms_eps;          /* RMSNorm epsilon */
	bool tied_embeddings;   /* output projection is token_embd */
	uint32_t n_swa;         /* sliding window of the local layers in tokens; 0: every layer is global */
	uint32_t swa_pattern;   /* layer l is local when n_swa and l % swa_pattern < swa_pattern - 1 */
	float rope_base_swa;    /* RoPE base of the local layers */
	float attn_scale;       /* query scale: 1/sqrt(head_dim) (Gemma 3 27B: 1/sqrt(n_embd / n_head)) */
	int rope_scaling;       /* 0 none, 1 linear, 2 llama3 ({arch}.rope.scaling.type) */
	float rope_scale_factor;   /* rope.scaling.factor (1: none) */
	float rope_low_freq;       /* llama3: rope.scaling.low_freq_factor (default 1) */
	float rope_high_freq;      /* llama3: rope.scaling.high_freq_factor (default 4) */
	uint32_t rope_orig_ctx;    /* llama3: rope.scaling.original_context_length (default 8192) */
} kvt_model_hparams;

/* Whether layer l of a model attends through a sliding window (hp->n_swa tokens). */
static inline bool kvt_model_layer_is_local(const kvt_model_hparams *hp, uint32_t l)
{
	return hp->n_swa && hp->swa_pattern && l % hp->swa_pattern < hp->swa_pattern - 1;
}

typedef struct kvt_model_config {
	int weight_dtype;    /* enum kvt_dtype for dequantized matrices: F16 (default) or F32 */
	bool keep_quantized; /* keep block-quantized matrices (Q8_0 ... Q6_K) as stored where the backend takes them (default) */
	uint32_t max_batch;  /* tokens per forward chunk (prefill is split into chunks of this) */
	uint32_t max_ctx;    /* longest sequence (0: the trained context) */
	bool no_graphs;      /* kvt_model_decode issues its ops one by one even where the backend has graphs */
	bool map_weights;    /* where device memory is host memory (kvt_dev_host_is_device), a weight the backend
	                        takes in its stored form points into the GGUF's mapping instead of being copied:
	                        the GGUF must then stay open until the model is destroyed (default false) */
} kvt_model_config;

/* fp16 weights (quantized ones kept as stored), batch 512, trained context. */
void kvt_model_config_default(kvt_model_config *c);

typedef struct kvt_model kvt_model;

/*
 * Load from an open GGUF (borrowed; may be closed after this returns unless
 * cfg->map_weights, then it must outlive the model) onto d
 * (borrowed; must outlive the model). KVT_EUNSUPPORTED for an architecture
 * that arch.h does not describe, or a tensor type, KVT_ECORRUPT for missing or misshapen
 * tensors and bad hyperparameters (logged, naming the key or tensor),
 * KVT_ENOMEM.
 */
int kvt_model_load(kvt_dev *d, const struct kvt_gguf *g, const kvt_model_config *cfg, kvt_model **out);
void kvt_model_destroy(kvt_model *m); /* NULL is a no-op */
/* Only the hyperparameters (no tensor data is read): for the capacity planner. */
int kvt_model_read_hparams(const struct kvt_gguf *g, kvt_model_hparams *out);
const kvt_model_hparams *kvt_model_hparams_get(const kvt_model *m);
uint32_t kvt_model_max_ctx(const kvt_model *m);
uint32_t kvt_model_max_batch(const kvt_model *m); /* rows per forward call */
/* Bytes of weights held on the device. */
size_t kvt_model_weight_bytes(const kvt_model *m);
/* Of those, the bytes that point into the GGUF's mapping (cfg.map_weights; 0 otherwise). */
size_t kvt_model_mapped_bytes(const kvt_model *m);
/* The KV block shape this model needs (pool and n_slots left 0). */
void kvt_model_kv_shape(const kvt_model *m, uint32_t block_tokens, kvt_kv_layout *out);

typedef struct kvt_seq {
	kvt_t0_pool *pool;      /* borrowed; must outlive the sequence */
	int32_t *blocks;        /* [max_blocks] T0 slots, host copy */
	int32_t *d_blocks;      /* [max_blocks] the same, device copy used by the ops */
	uint32_t max_blocks;    /* capacity of the tables */
	uint32_t n_blocks;      /* slots held (each holds one reference) */
	uint32_t n_synced;      /* leading entries of d_blocks that equal blocks */
	uint32_t n_tokens;      /* tokens whose K/V are stored */
	kvt_dev *dev;           /* borrowed, for the device table */
} kvt_seq;

/* The device dtype (enum kvt_dtype) that holds a GGUF tensor type as stored (the quantized types a backend
 * may keep), or -1. */
int kvt_model_stored_dtype(uint32_t ggml_type);

/* A sequence of at most max_tokens tokens. */
int kvt_seq_init(kvt_seq *s, kvt_dev *d, kvt_t0_pool *pool, uint32_t max_tokens);
void kvt_seq_deinit(kvt_seq *s);
/* Drop every block (unref) and forget every token. */
void kvt_seq_reset(kvt_seq *s);
/*
 * Make dst (empty) start with the first n_blocks full blocks of src, by
 * reference: dst then holds n_blocks * block_tokens tokens without compute.
 */
int kvt_seq_share_prefix(kvt_seq *dst, const kvt_seq *src, uint32_t n_blocks);

/*
 * Append n tokens to s and run them through the model. Logits (host memory,
 * caller-owned) receive n_logits rows of n_vocab floats: the last n_logits
 * positions of this call (1 for generation; n for a full scoring pass).
 * n_logits may be 0 (prefill only). KVT_EFULL when the pool has no free
 * block or the sequence would exceed max_ctx (nothing is appended then).
 */
int kvt_model_forward(kvt_model *m, kvt_seq *s, const int32_t *tokens, uint32_t n,
		      float *h_logits, uint32_t n_logits);

/*
 * One step of continuous batching: append n[i] tokens (consecutive in
 * tokens[]) to each of n_seq distinct sequences and run them through the
 * model together (sum of n[i] <= max_batch). h_logits receives one row of
 * n_vocab floats per sequence with want_logits[i], in order: the logits after
 * that sequence's last token. KVT_EFULL when the pool has no free block (the
 * sequences that got their blocks keep them, holding no new tokens) or a
 * sequence would exceed the context; KVT_EINVAL for a bad id or shape.
 */
int kvt_model_forward_batch(kvt_model *m, uint32_t n_seq, kvt_seq *const *seqs, const uint32_t *n,
			    const int32_t *tokens, const bool *want_logits, float *h_logits);

/* How kvt_model_decode picks each next token, on the device. */
typedef struct kvt_decode_sampling {
	float temperature; /* 0: greedy (argmax, lowest id on ties); else kvt_dev_sample's rule */
	uint32_t top_k;    /* 0: no limit */
	float top_p;       /* in (0, 1] when temperature > 0 */
} kvt_decode_sampling;
#define KVT_DECODE_MAX_SEQ 128 /* sequences per decode step */

/*
 * One decode step done on the device: append tokens[i] to each of n_seq
 * distinct sequences (1..KVT_DECODE_MAX_SEQ, at most max_batch, one KV pool),
 * run the model and pick each one's next token there (smp NULL: greedy;
 * else with the uniform draws u[i] in [0, 1)); next[i] receives it. Only the
 * token ids come back to the host. Where the backend has graphs (and not
 * cfg.no_graphs) the step is one graph per batch-size bucket (1..8 exactly,
 * then multiples of 8), captured on first use and replayed after: the step's
 * ids, positions and draws go over in one copy, block-table rows only when a
 * sequence's table changed, then one graph launch and one host wait. A step
 * padded up to its bucket borrows one free block of the pool for the
 * padding rows' K/V until its host wait (no free block: the step runs at its
 * exact size); padding touches no sequence's KV or token. Errors as
 * kvt_model_forward_batch's.
 * NOTE: the first step on a KV pool allocates the step's staging buffers
 * (and, past 32 rows, a logits buffer of min(max_batch, 128) rows), and the
 * first step of each bucket captures its graph; later steps allocate nothing.
 */
int kvt_model_decode(kvt_model *m, uint32_t n_seq, kvt_seq *const *seqs, const int32_t *tokens,
		     const kvt_decode_sampling *smp, const float *u, int32_t *next);

/*
 * Layer gates: the K/V of a sequence's cached prefix may still be arriving in
 * T0 layer group by layer group (kvt_tm_promote_layered, tiers/manager.h).
 * A gate names one event per group: event g completes when layers
 * [g * layers_per_group, (g + 1) * layers_per_group) of the promoted blocks
 * are in T0. The gated forward makes the compute stream wait for event g (on
 * the device, kvt_dev_stream_wait_event: the host does not block) just before
 * the first op of layer g * layers_per_group, so layer l's attention reads
 * its K/V only once it is there, while the copies of later groups go on
 * beside the earlier layers' compute. Layers past the last group are not
 * gated. The waits are issued once, in the first chunk of the call (later
 * chunks run after it on the same stream). On the CPU backend events are
 * complete when recorded, so a gated forward computes what the plain one
 * does.
 */
typedef struct kvt_model_gate {
	kvt_event *const *events;   /* [n_groups], borrowed; recorded (or to be recorded) by the copier */
	uint32_t n_groups;          /* groups (>= 1) */
	uint32_t layers_per_group;  /* layers a group covers (>= 1) */
	uint64_t *launches_at_wait; /* NULL, or [n_groups] out: the device's kernel_launches counter
	                               (kvt_dev_counters) when group g's wait was issued (tests) */
} kvt_model_gate;

/* kvt_model_forward behind one gate (NULL: none). KVT_EINVAL for a bad gate, else as kvt_model_forward. */
int kvt_model_forward_gated(kvt_model *m, kvt_seq *s, const int32_t *tokens, uint32_t n, float *h_logits,
			    uint32_t n_logits, const kvt_model_gate *gate);
/*
 * kvt_model_forward_batch behind n_gates gates (several sequences of the
 * batch may each have a layered promotion in flight): before each gated
 * layer the compute stream waits for every gate's event of that layer's group.
 */
int kvt_model_forward_batch_gated(kvt_model *m, uint32_t n_seq, kvt_seq *const *seqs, const uint32_t *n,
				  const int32_t *tokens, const bool *want_logits, float *h_logits, uint32_t n_gates,
				  const kvt_model_gate *gates);

/*
 * Chunk reuse (reuse at any position; docs/http-api.md, "Chunk reuse").
 *
 * kvt_model_kv_move copies the K/V of n stored tokens at positions
 * src_pos.. of src into dst at dst_pos.., every layer, and rotates each K by
 * delta positions on the way with the forward pass's own RoPE (each layer's
 * base, NEOX or adjacent pairs, Llama 3 / linear scaling factors: a rotation
 * by a then by b is one by a + b, so K stored at chunk-relative positions
 * (delta = -start when extracted) lands where a prefill at the new position
 * would have put it (delta = +new start), up to the K/V dtype's rounding).
 * dst gets the blocks it needs to cover dst_pos + n (and src's device table
 * is brought in step with its host one); neither sequence's n_tokens
 * changes (the caller sets it). src and dst may be the same
 * sequence only with disjoint ranges. KVT_EFULL when the pool has no free
 * block, KVT_EINVAL for a range outside src's tokens or dst's capacity.
 */
int kvt_model_kv_move(kvt_model *m, kvt_seq *src, uint32_t src_pos, kvt_seq *dst, uint32_t dst_pos, uint32_t n,
		      int32_t delta);

/*
 * How kvt_model_forward_blend restores the attention across placed chunks
 * (CacheBlend's selective recompute): every row runs through layers
 * 0..check_layer-1, and gets this prompt's K/V of layer check_layer, both
 * overwriting the placed K/V there; at check_layer each placed row's
 * deviation (the squared difference between the K/V it had and the K/V just
 * computed, relative to the computed ones' norm, K and V added) ranks it,
 * and only the rows not placed plus the fraction `recompute` of the placed
 * rows that deviate most (per forward chunk of max_batch rows, rounded up)
 * run through layers check_layer.. (attention, FFN), their K/V overwriting
 * the placed ones there. Those rows run max_batch at a time, so the matmuls
 * of the later layers see full chunks as a plain prefill's do.
 * recompute = 1 runs every row through every layer: a plain prefill.
 */
typedef struct kvt_blend_params {
	float recompute;      /* fraction of the placed rows recomputed past check_layer, 0..1 */
	uint32_t check_layer; /* the layer whose deviation ranks the rows (>= 1: layer 0's K/V do not see the context) */
	uint32_t n_sink;      /* also recompute the first n_sink rows of every run of placed rows (a chunk's start,
	                         whose K/V saw the other context's text right before it), counted in the fraction */
} kvt_blend_params;

typedef struct kvt_blend_result {
	uint32_t n_placed;     /* rows that had placed K/V */
	uint32_t n_recomputed; /* of those, rows run through every layer */
} kvt_blend_result;

/*
 * Append n tokens to s as kvt_model_forward does, where placed[i] != 0 says
 * that row i (position s->n_tokens + i) already has K/V in every layer
 * (kvt_model_kv_move put it there) and may skip the layers past
 * bp->check_layer. The last row is always computed; h_logits (n_logits 0 or
 * 1) receives its logits. *out (may be NULL) gets the counts. Errors as
 * kvt_model_forward's; KVT_EINVAL for a bad bp.
 */
int kvt_model_forward_blend(kvt_model *m, kvt_seq *s, const int32_t *tokens, uint32_t n, const uint8_t *placed,
			    const kvt_blend_params *bp, float *h_logits, uint32_t n_logits, kvt_blend_result *out);

/*
 * A Llama-shaped model with random weights made on the device, for
 * benchmarks at real sizes (an 8B model's 16 GB of fp16 need no GGUF file).
 * hp gives n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab,
 * n_ctx_train, rope_base, rms_eps and tied_embeddings; the rest is set here
 * (arch "llama", n_rot = head_dim, no RoPE scaling, no sliding window).
 * Every matrix, embeddings and output included, is of w_dtype (KVT_DTYPE_F16,
 * or KVT_DTYPE_Q4_K as a K-quant file stores it), copied on the device from
 * one seed-generated buffer per fan-in (fp16 uniform in +-sqrt(3 / fan_in);
 * Q4_K blocks with random codes and 6-bit scales whose values span about
 * that), so tensors repeat that buffer at offsets that differ by tensor;
 * norm weights are 1. The outputs are deterministic for a seed and mean
 * nothing. KVT_EINVAL (logged, naming the field) for a bad shape or dtype,
 * KVT_EUNSUPPORTED for a dtype the backend does not multiply, KVT_ENOMEM.
 */
int kvt_model_create_random(kvt_dev *d, const kvt_model_hparams *hp, int w_dtype, uint64_t seed,
			    const kvt_model_config *cfg, kvt_model **out);

#endif
