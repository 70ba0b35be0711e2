/*
 * engine/model/model.c — the forward pass on the device interface, one for
 * every architecture: arch.h's traits switch its optional steps (marked [trait]).
 *
 * Per chunk of M tokens at positions pos0..pos0+M-1 (x is the residual
 * stream, [M][n_embd]; Q and the attention output are [M][n_head * head_dim],
 * which need not be n_embd: Gemma 3 270M has 4 heads of 256 over 640):
 *   x = embed(tokens)                                  [embd_scale: * sqrt(n_embd)]
 *   for each layer l:
 *     h = rmsnorm(x) * attn_norm
 *     q, k, v = h Wq, h Wk, h Wv                       [qkv_bias: + bq, bk, bv]
 *     [qk_norm: q, k = rmsnorm of each head * attn_{q,k}_norm]
 *     rope(q), rope(k)   (adjacent pairs; [rope_neox]: pairs half a head apart;
 *                         local layers use their own base; Llama 3 / linear
 *                         scaling divides each pair's angle by its factor)
 *     store k, v into the sequence's blocks at pos0..
 *     a = attention(q, paged K/V of positions 0..pos) Wo
 *                         [swa, local layer: only positions pos-window+1..pos]
 *     x += a              [post_norms: x += rmsnorm(a) * post_attention_norm]
 *     h = rmsnorm(x) * ffn_norm
 *     f = (act(h Wgate) * (h Wup)) Wdown               (act: SiLU, or GELU-tanh)
 *     x += f              [post_norms: x += rmsnorm(f) * post_ffw_norm]
 *   logits = (rmsnorm(x) * output_norm) Wout   (only the rows asked for)
 * Residual additions ride on the matmul's accumulate flag where no post-norm
 * sits between. Llama's GGUF Q/K weights are already permuted for
 * adjacent-pair rotation by the converter, which is why "normal" RoPE is
 * right there; the NEOX families are converted unpermuted.
 */
#include "model.h"

#include "arch.h"
#include "gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limits on hyperparameters read from a file, so a hostile header cannot
 * make us allocate absurd buffers before a tensor check catches it. */
#define MAX_LAYERS 1024
#define MAX_DIM (1u << 16)
#define MAX_VOCAB (1u << 22)

/* A weight matrix on the device: [out] rows of [in] elements of dtype. */
typedef struct wmat {
	void *p;    /* device */
	int dtype;  /* enum kvt_dtype */
} wmat;

typedef struct layer_w {
	float *attn_norm;  /* [n_embd], device fp32 */
	wmat wq;           /* [q_dim][n_embd] */
	wmat wk;           /* [kv_dim][n_embd] */
	wmat wv;           /* [kv_dim][n_embd] */
	wmat wo;           /* [n_embd][q_dim] */
	float *ffn_norm;   /* [n_embd], device fp32 */
	wmat w_gate;       /* [n_ff][n_embd] */
	wmat w_up;         /* [n_ff][n_embd] */
	wmat w_down;       /* [n_embd][n_ff] */
	float *bq;         /* [q_dim] Q bias, device fp32 (qkv_bias; else NULL) */
	float *bk;         /* [kv_dim] */
	float *bv;         /* [kv_dim] */
	float *q_norm;     /* [head_dim] per-head Q norm (qk_norm; else NULL) */
	float *k_norm;     /* [head_dim] */
	float *post_attn_norm; /* [n_embd] (post_norms; else NULL) */
	float *post_ffn_norm;  /* [n_embd] */
} layer_w;

struct kvt_model {
	kvt_dev *dev;             /* borrowed */
	kvt_model_hparams hp;     /* hyperparameters */
	kvt_model_config cfg;     /* effective config */
	const kvt_arch *arch;     /* the architecture's traits (static) */
	float *rope_factors;      /* [n_rot / 2] RoPE angle divisors, device (NULL: none) */
	size_t weight_bytes;      /* device bytes of weights (mapped ones included) */
	size_t mapped_bytes;      /* of which point into the GGUF's mapping (cfg.map_weights) */
	const uint8_t *map_lo, *map_hi; /* the span of the weights that point into the mapping (not freed) */
	wmat tok_embd;            /* [n_vocab][n_embd] */
	wmat output;              /* [n_vocab][n_embd]; the same pointer as tok_embd when tied */
	float *output_norm;       /* [n_embd], device */
	layer_w *layers;          /* [n_layer] */
	/* activations, device, sized for cfg.max_batch rows */
	float *x;                 /* [B][n_embd] residual stream */
	float *h;                 /* [B][n_embd] normed input */
	float *q;                 /* [B][q_dim] */
	float *k;                 /* [B][kv_dim] */
	float *v;                 /* [B][kv_dim] */
	float *att;               /* [B][max(q_dim, n_embd)] attention output */
	float *sub;               /* [B][n_embd] a sublayer's output before its post-norm (post_norms; else NULL) */
	float *gate;              /* [B][n_ff] */
	float *up;                /* [B][n_ff] */
	float *logits;            /* [LOGIT_ROWS][n_vocab] */
	int32_t *ids;             /* [B] token ids */
	int32_t *pos;             /* [B] positions */
	void *ws;                 /* op workspace */
	size_t ws_bytes;          /* its size */
	struct decode_state *dec; /* kvt_model_decode's buffers and graphs; NULL until its first call */
	bool dec_issue;           /* run_layers is issuing a decode step (positions, tables on the device) */
	const kvt_model_gate *gates; /* [n_gates] layer gates of the call in progress (kvt_model_forward_gated) */
	uint32_t n_gates;         /* 0: none (run_layers clears it once it issued the waits) */
};

/* Rows of logits computed per output matmul (bounds the logits buffer). */
#define LOGIT_ROWS 32u

/* kvt_model_decode's parts run_layers and kvt_model_destroy call (at the end of this file). */
static void decode_rows(kvt_model *m, int32_t **ids, int32_t **pos);
static void decode_seq_args(kvt_model *m, uint32_t i, kvt_kv_store_args *st, kvt_attention_args *at);
static void decode_free(kvt_model *m);
/* The layer gates' waits before layer l (at the end of this file). */
static int gate_wait(kvt_model *m, uint32_t l);

void kvt_model_config_default(kvt_model_config *c)
{
	c->weight_dtype = KVT_DTYPE_F16;
	c->keep_quantized = true;
	c->max_batch = 512;
	c->max_ctx = 0;
	c->no_graphs = false;
	c->map_weights = false;
}

static int get_u32_key(const kvt_gguf *g, const char *arch, const char *suffix, bool required,
		       uint32_t def, uint32_t *out)
{
	char key[128];
	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	int rc = kvt_gguf_get_u32(g, key, out);
	if (rc == KVT_ENOTFOUND && !required) {
		*out = def;
		return KVT_OK;
	}
	if (rc == KVT_ENOTFOUND)
		KVT_LOGE("%s: missing metadata key %s", kvt_gguf_path(g), key);
	return rc == KVT_ENOTFOUND ? KVT_ECORRUPT : rc;
}

static int get_f32_key(const kvt_gguf *g, const char *arch, const char *suffix, float def, float *out)
{
	char key[128];
	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	int rc = kvt_gguf_get_f32(g, key, out);
	if (rc == KVT_ENOTFOUND) {
		*out = def;
		return KVT_OK;
	}
	return rc;
}

/* {arch}.rope.scaling.*: none, linear (every angle / factor) or llama3 (per-frequency factors). */
static int read_rope_scaling(const kvt_gguf *g, kvt_model_hparams *hp)
{
	const char *path = kvt_gguf_path(g);
	char key[128];
	kvt_gguf_str type;
	int rc;

	hp->rope_scale_factor = 1.0f;
	hp->rope_low_freq = 1.0f;
	hp->rope_high_freq = 4.0f;
	hp->rope_orig_ctx = 8192;
	snprintf(key, sizeof(key), "%s.rope.scaling.type", hp->arch);
	rc = kvt_gguf_get_str(g, key, &type);
	if (rc == KVT_ENOTFOUND)
		return KVT_OK;
	if (rc)
		return rc;
	if (type.len == 4 && !memcmp(type.ptr, "none", 4))
		return KVT_OK;
	if (type.len == 6 && !memcmp(type.ptr, "linear", 6))
		hp->rope_scaling = 1;
	else if (type.len == 6 && !memcmp(type.ptr, "llama3", 6))
		hp->rope_scaling = 2;
	else {
		KVT_LOGE("%s: %s '%.*s' is not supported (none, linear, llama3)", path, key,
			 (int)(type.len > 32 ? 32 : type.len), type.ptr);
		return KVT_EUNSUPPORTED;
	}
	if ((rc = get_f32_key(g, hp->arch, "rope.scaling.factor", 1.0f, &hp->rope_scale_factor)) ||
	    (rc = get_f32_key(g, hp->arch, "rope.scaling.low_freq_factor", 1.0f, &hp->rope_low_freq)) ||
	    (rc = get_f32_key(g, hp->arch, "rope.scaling.high_freq_factor", 4.0f, &hp->rope_high_freq)) ||
	    (rc = get_u32_key(g, hp->arch, "rope.scaling.original_context_length", false, 8192, &hp->rope_orig_ctx)))
		return rc;
	if (!(hp->rope_scale_factor >= 1.0f) || !isfinite(hp->rope_scale_factor) || !(hp->rope_low_freq > 0) ||
	    !(hp->rope_high_freq > hp->rope_low_freq) || !isfinite(hp->rope_high_freq) || !hp->rope_orig_ctx) {
		KVT_LOGE("%s: bad rope scaling: factor %g, low_freq_factor %g, high_freq_factor %g, original context %u",
			 path, hp->rope_scale_factor, hp->rope_low_freq, hp->rope_high_freq, hp->rope_orig_ctx);
		return KVT_ECORRUPT;
	}
	return KVT_OK;
}

static int read_hparams(const kvt_gguf *g, kvt_model_hparams *hp)
{
	const char *path = kvt_gguf_path(g);
	kvt_gguf_str arch;
	int rc;

	memset(hp, 0, sizeof(*hp));
	rc = kvt_gguf_get_str(g, "general.architecture", &arch);
	if (rc) {
		KVT_LOGE("%s: no general.architecture", path);
		return KVT_ECORRUPT;
	}
	const kvt_arch *ad = kvt_arch_find(arch.ptr, arch.len);
	if (!ad) {
		KVT_LOGE("%s: architecture '%.*s' is not supported (%s)", path, (int)(arch.len > 64 ? 64 : arch.len),
			 arch.ptr, kvt_arch_names());
		return KVT_EUNSUPPORTED;
	}
	memcpy(hp->arch, arch.ptr, arch.len);

	if ((rc = get_u32_key(g, hp->arch, "block_count", true, 0, &hp->n_layer)) ||
	    (rc = get_u32_key(g, hp->arch, "embedding_length", true, 0, &hp->n_embd)) ||
	    (rc = get_u32_key(g, hp->arch, "feed_forward_length", true, 0, &hp->n_ff)) ||
	    (rc = get_u32_key(g, hp->arch, "attention.head_count", true, 0, &hp->n_head)) ||
	    (rc = get_u32_key(g, hp->arch, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv)) ||
	    (rc = get_u32_key(g, hp->arch, "context_length", false, 2048, &hp->n_ctx_train)) ||
	    (rc = get_f32_key(g, hp->arch, "rope.freq_base", 10000.0f, &hp->rope_base)) ||
	    (rc = get_f32_key(g, hp->arch, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps)))
		return rc;

	if (!hp->n_layer || hp->n_layer > MAX_LAYERS || !hp->n_embd || hp->n_embd > MAX_DIM || !hp->n_ff ||
	    hp->n_ff > 4 * MAX_DIM || !hp->n_head || hp->n_head > hp->n_embd || !hp->n_head_kv ||
	    hp->n_head % hp->n_head_kv || !hp->n_ctx_train) {
		KVT_LOGE("%s: bad hyperparameters: layers %u, embd %u, ff %u, heads %u, kv heads %u, ctx %u",
			 path, hp->n_layer, hp->n_embd, hp->n_ff, hp->n_head, hp->n_head_kv, hp->n_ctx_train);
		return KVT_ECORRUPT;
	}
	/* head_dim: attention.key_length where the file gives it (Gemma 3: 256 over a width of 640),
	 * else n_embd / n_head; V heads must be as wide (one K/V block shape) */
	uint32_t v_len;
	bool has_key_len = false;
	{
		char key[128];
		snprintf(key, sizeof(key), "%s.attention.key_length", hp->arch);
		has_key_len = kvt_gguf_get_u32(g, key, &hp->head_dim) == KVT_OK;
	}
	if (!has_key_len) {
		if (hp->n_embd % hp->n_head) {
			KVT_LOGE("%s: bad hyperparameters: embedding_length %u is not a multiple of head_count %u "
				 "(and no attention.key_length)",
				 path, hp->n_embd, hp->n_head);
			return KVT_ECORRUPT;
		}
		hp->head_dim = hp->n_embd / hp->n_head;
	}
	if ((rc = get_u32_key(g, hp->arch, "attention.value_length", false, hp->head_dim, &v_len)))
		return rc;
	if (!hp->head_dim || hp->head_dim > 1024 || (uint64_t)hp->head_dim * hp->n_head > 4 * MAX_DIM ||
	    v_len != hp->head_dim) {
		KVT_LOGE("%s: bad head size: key_length %u, value_length %u, heads %u", path, hp->head_dim, v_len,
			 hp->n_head);
		return KVT_ECORRUPT;
	}
	if ((rc = get_u32_key(g, hp->arch, "rope.dimension_count", false, hp->head_dim, &hp->n_rot)))
		return rc;
	if (hp->head_dim % 2 || !hp->n_rot || hp->n_rot % 2 || hp->n_rot > hp->head_dim) {
		KVT_LOGE("%s: bad rope: head_dim %u, rope.dimension_count %u", path, hp->head_dim, hp->n_rot);
		return KVT_ECORRUPT;
	}
	if (!(hp->rope_base > 0) || !(hp->rms_eps >= 0) || !isfinite(hp->rope_base) || !isfinite(hp->rms_eps)) {
		KVT_LOGE("%s: bad rope.freq_base %g or rms epsilon %g", path, hp->rope_base, hp->rms_eps);
		return KVT_ECORRUPT;
	}
	if ((rc = read_rope_scaling(g, hp)))
		return rc;
	hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
	/* NOTE: Gemma 3 27B (62 layers) was trained with query_pre_attn_scalar = n_embd / n_head
	 * (168), not head_dim (128); its GGUF has no key for it, and llama.cpp keys the
	 * exception on the layer count as done here. */
	if (ad->swa && !strcmp(hp->arch, "gemma3") && hp->n_layer == 62)
		hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
	if (ad->swa) {
		if ((rc = get_u32_key(g, hp->arch, "attention.sliding_window", true, 0, &hp->n_swa)))
			return rc;
		if (!hp->n_swa) {
			KVT_LOGE("%s: %s.attention.sliding_window is 0", path, hp->arch);
			return KVT_ECORRUPT;
		}
		hp->swa_pattern = ad->swa_pattern;
		hp->rope_base_swa = ad->swa_rope_base;
	}
	const kvt_gguf_tensor *te = kvt_gguf_find_tensor(g, "token_embd.weight");
	if (!te) {
		KVT_LOGE("%s: missing tensor token_embd.weight", path);
		return KVT_ECORRUPT;
	}
	if (te->n_dims != 2 || te->ne[1] == 0 || te->ne[1] > MAX_VOCAB) {
		KVT_LOGE("%s: token_embd.weight: bad shape", path);
		return KVT_ECORRUPT;
	}
	hp->n_vocab = (uint32_t)te->ne[1];
	hp->tied_embeddings = kvt_gguf_find_tensor(g, "output.weight") == NULL;
	return KVT_OK;
}

int kvt_model_stored_dtype(uint32_t ggml_type)
{
	switch (ggml_type) {
	case KVT_GGML_Q8_0: return KVT_DTYPE_Q8_0;
	case KVT_GGML_Q4_0: return KVT_DTYPE_Q4_0;
	case KVT_GGML_Q4_1: return KVT_DTYPE_Q4_1;
	case KVT_GGML_Q5_0: return KVT_DTYPE_Q5_0;
	case KVT_GGML_Q4_K: return KVT_DTYPE_Q4_K;
	case KVT_GGML_Q5_K: return KVT_DTYPE_Q5_K;
	case KVT_GGML_Q6_K: return KVT_DTYPE_Q6_K;
	}
	return -1;
}

/*
 * Check a tensor's shape and values and upload it. A matrix (out_dtype set)
 * keeps its stored block-quantized form when the config allows and the
 * backend multiplies it directly; everything else is dequantized to dtype.
 * Where the stored bytes are what the backend gets, the values are checked
 * from them (kvt_gguf_tensor_check_finite) and, with cfg.map_weights on a
 * backend whose device memory is host memory, the weight points at them.
 */
static int load_tensor(kvt_model *m, const kvt_gguf *g, const char *name, uint64_t ne0, uint64_t ne1,
		       int dtype, float *tmp, void **out, int *out_dtype)
{
	const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, name);
	const char *path = kvt_gguf_path(g);
	uint32_t want_dims = ne1 ? 2 : 1;
	int rc;

	if (!t) {
		KVT_LOGE("%s: missing tensor %s", path, name);
		return KVT_ECORRUPT;
	}
	if (t->n_dims != want_dims || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1)) {
		KVT_LOGE("%s: %s: shape [%llu, %llu] but the model needs [%llu, %llu]", path, name,
			 (unsigned long long)t->ne[0], (unsigned long long)(t->n_dims > 1 ? t->ne[1] : 1),
			 (unsigned long long)ne0, (unsigned long long)(ne1 ? ne1 : 1));
		return KVT_ECORRUPT;
	}
	size_t n = (size_t)t->n_elems;
	int keep = kvt_model_stored_dtype(t->type);
	uint32_t be = 1, bb;
	kvt_ggml_type_block(t->type, &be, &bb);
	if (out_dtype && m->cfg.keep_quantized && keep >= 0 && kvt_dev_supports_dtype(m->dev, keep))
		dtype = keep;
	else if (out_dtype && be > 1)
		/* a block-quantized matrix (a type without kernels, or one this backend lacks)
		 * costs 16 or 32 bits a weight from here on; said at info level unless the
		 * config asked for it */
		kvt_log(m->cfg.keep_quantized ? KVT_LOG_INFO : KVT_LOG_DEBUG, "%s: %s: %s widened to %s (%s)", path,
			name, kvt_ggml_type_name(t->type), kvt_dtype_name(dtype),
			!m->cfg.keep_quantized ? "quantized weights not kept" : keep < 0 ? "no kernels for the type"
										   : "the backend has no kernels for it");
	size_t bytes = kvt_dtype_row_bytes(dtype, n);
	/* the stored bytes are the backend's, bit for bit: kept as stored, or fp16/fp32 held as such
	 * (an fp16 value widened and narrowed again is the same bits) */
	const bool as_stored = dtype == keep || (t->type == KVT_GGML_F16 && dtype == KVT_DTYPE_F16) ||
			       (t->type == KVT_GGML_F32 && dtype == KVT_DTYPE_F32);
	uint64_t bad = 0;
	if (as_stored) {
		/* every value checked from its scales, nothing dequantized (the load reads each byte once) */
		rc = kvt_gguf_tensor_check_finite(g, t, &bad);
		if (rc == KVT_ECORRUPT)
			KVT_LOGE("%s: %s: element %llu is not finite", path, name, (unsigned long long)bad);
		if (rc)
			return rc;
	} else {
		if ((rc = kvt_gguf_tensor_to_f32(g, t, tmp)))
			return rc;
		for (size_t i = 0; i < n; i++) {
			if (!isfinite(tmp[i])) {
				KVT_LOGE("%s: %s: element %zu is not finite", path, name, i);
				return KVT_ECORRUPT;
			}
		}
	}
	if (dtype == KVT_DTYPE_F16 && !as_stored) {
		/* narrow in place: the fp16 values fill the front half of tmp */
		uint16_t *h = (uint16_t *)tmp;
		for (size_t i = 0; i < n; i++) {
			if (fabsf(tmp[i]) > 65504.0f) {
				KVT_LOGE("%s: %s: element %zu (%g) does not fit fp16; load with fp32 weights",
					 path, name, i, tmp[i]);
				return KVT_EUNSUPPORTED;
			}
			h[i] = kvt_f32_to_f16(tmp[i]);
		}
	}
	m->weight_bytes += bytes;
	if (out_dtype)
		*out_dtype = dtype;
	if (as_stored && m->cfg.map_weights && kvt_dev_host_is_device(m->dev) && bytes == t->n_bytes &&
	    (uintptr_t)t->data % 16 == 0) {
		/* NOTE: the GGUF's mapping is read-only; no op writes its weights */
		const uint8_t *p = t->data;
		*out = (void *)(uintptr_t)p;
		m->mapped_bytes += bytes;
		if (!m->map_lo || p < m->map_lo)
			m->map_lo = p;
		if (p + bytes > m->map_hi)
			m->map_hi = p + bytes;
		return KVT_OK;
	}
	rc = kvt_dev_alloc(m->dev, bytes, out);
	if (rc)
		return rc;
	return kvt_dev_copy_h2d(m->dev, *out, as_stored ? t->data : (const void *)tmp, bytes);
}

/* Free a weight unless it points into the GGUF's mapping. */
static void free_weight(kvt_model *m, void *p)
{
	if (!p || ((const uint8_t *)p >= m->map_lo && (const uint8_t *)p < m->map_hi))
		return;
	kvt_dev_free(m->dev, p);
}

/*
 * RoPE angle divisors, one per rotated pair: the file's rope_freqs.weight
 * where it has one (llama.cpp's converter writes it for Llama 3.x and
 * llama.cpp reads only it), else computed from rope.scaling: linear divides
 * every angle by the factor; llama3 (Meta's formula, as llama.cpp's converter
 * applies it) keeps high frequencies (wavelength < original context /
 * high_freq_factor), divides low ones (wavelength > original context /
 * low_freq_factor) by the factor, and blends smoothly between.
 */
static int load_rope_factors(kvt_model *m, const kvt_gguf *g)
{
	const kvt_model_hparams *hp = &m->hp;
	const uint32_t half = hp->n_rot / 2;
	float f[MAX_DIM / 2];
	int rc;

	if (kvt_gguf_find_tensor(g, "rope_freqs.weight")) {
		if ((rc = load_tensor(m, g, "rope_freqs.weight", half, 0, KVT_DTYPE_F32, f, (void **)&m->rope_factors,
				      NULL)))
			return rc;
		if (kvt_dev_copy_d2h(m->dev, f, m->rope_factors, half * sizeof(float)) == KVT_OK)
			for (uint32_t i = 0; i < half; i++)
				if (!(f[i] > 0)) {
					KVT_LOGE("%s: rope_freqs.weight: element %u (%g) is not positive", kvt_gguf_path(g),
						 i, f[i]);
					return KVT_ECORRUPT;
				}
		return KVT_OK;
	}
	if (!hp->rope_scaling || hp->rope_scale_factor == 1.0f)
		return KVT_OK;
	for (uint32_t i = 0; i < half; i++) {
		if (hp->rope_scaling == 1) {
			f[i] = hp->rope_scale_factor;
			continue;
		}
		const double freq = pow(hp->rope_base, -2.0 * i / hp->n_rot), wavelen = 2 * M_PI / freq;
		const double lo_wl = hp->rope_orig_ctx / hp->rope_low_freq, hi_wl = hp->rope_orig_ctx / hp->rope_high_freq;
		if (wavelen < hi_wl)
			f[i] = 1.0f;
		else if (wavelen > lo_wl)
			f[i] = hp->rope_scale_factor;
		else {
			const double smooth = (hp->rope_orig_ctx / wavelen - hp->rope_low_freq) /
					      (hp->rope_high_freq - hp->rope_low_freq);
			f[i] = (float)(1.0 / ((1 - smooth) / hp->rope_scale_factor + smooth));
		}
	}
	if ((rc = kvt_dev_alloc(m->dev, half * sizeof(float), (void **)&m->rope_factors)))
		return rc;
	m->weight_bytes += half * sizeof(float);
	return kvt_dev_copy_h2d(m->dev, m->rope_factors, f, half * sizeof(float));
}

static int alloc_act(kvt_model *m, size_t n_floats, void *out)
{
	return kvt_dev_alloc(m->dev, n_floats * sizeof(float), (void **)out);
}

static int alloc_buffers(kvt_model *m)
{
	const kvt_model_hparams *hp = &m->hp;
	const size_t B = m->cfg.max_batch, kvd = (size_t)hp->n_head_kv * hp->head_dim;
	const size_t qd = (size_t)hp->n_head * hp->head_dim, attd = qd > hp->n_embd ? qd : hp->n_embd;
	int rc;

	if ((rc = alloc_act(m, B * hp->n_embd, &m->x)) || (rc = alloc_act(m, B * hp->n_embd, &m->h)) ||
	    (rc = alloc_act(m, B * qd, &m->q)) || (rc = alloc_act(m, B * kvd, &m->k)) ||
	    (rc = alloc_act(m, B * kvd, &m->v)) || (rc = alloc_act(m, B * attd, &m->att)) ||
	    (m->arch->post_norms && (rc = alloc_act(m, B * hp->n_embd, &m->sub))) ||
	    (rc = alloc_act(m, B * hp->n_ff, &m->gate)) || (rc = alloc_act(m, B * hp->n_ff, &m->up)) ||
	    (rc = alloc_act(m, (size_t)LOGIT_ROWS * hp->n_vocab, &m->logits)) ||
	    (rc = kvt_dev_alloc(m->dev, B * sizeof(int32_t), (void **)&m->ids)) ||
	    (rc = kvt_dev_alloc(m->dev, B * sizeof(int32_t), (void **)&m->pos)))
		return rc;

	/* The workspace must cover the largest matmul and the longest attention. */
	uint32_t widest_in = hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd;
	widest_in = qd > widest_in ? (uint32_t)qd : widest_in;
	kvt_kv_layout shape;
	kvt_model_kv_shape(m, 16, &shape);
	kvt_attention_args at = { .kv = &shape, .pos0 = m->cfg.max_ctx, .n_rows = m->cfg.max_batch,
				  .n_heads = hp->n_head };
	m->ws_bytes = kvt_dev_attention_workspace_bytes(m->dev, &at);
	for (int dt = 0; dt < KVT_DTYPE_COUNT; dt++) { /* whichever dtypes the matrices ended up in */
		kvt_matmul_args mm = { .n_rows = m->cfg.max_batch, .n_in = widest_in, .n_out = hp->n_vocab,
				       .w_dtype = dt };
		size_t a = kvt_dev_matmul_workspace_bytes(m->dev, &mm);
		m->ws_bytes = a > m->ws_bytes ? a : m->ws_bytes;
		kvt_norm_matmul_args nm = { .mm = mm };
		nm.mm.n_in = hp->n_embd;
		a = kvt_dev_norm_matmul_workspace_bytes(m->dev, &nm);
		m->ws_bytes = a > m->ws_bytes ? a : m->ws_bytes;
		kvt_matmul_swiglu_args sw = { .n_rows = m->cfg.max_batch, .n_in = hp->n_embd, .n_out = hp->n_ff, .w_dtype = dt };
		a = kvt_dev_matmul_swiglu_workspace_bytes(m->dev, &sw);
		m->ws_bytes = a > m->ws_bytes ? a : m->ws_bytes;
	}
	/* kvt_model_decode's sampling: up to KVT_DECODE_MAX_SEQ rows (bucket padding included) */
	kvt_sample_args sa = { .n_rows = m->cfg.max_batch < KVT_DECODE_MAX_SEQ ? m->cfg.max_batch : KVT_DECODE_MAX_SEQ,
			       .n_cols = hp->n_vocab, .temperature = 1.0f, .top_p = 1.0f };
	size_t sb = kvt_dev_sample_workspace_bytes(m->dev, &sa);
	m->ws_bytes = sb > m->ws_bytes ? sb : m->ws_bytes;
	if (m->ws_bytes)
		return kvt_dev_alloc(m->dev, m->ws_bytes, &m->ws);
	return KVT_OK;
}

int kvt_model_load(kvt_dev *d, const kvt_gguf *g, const kvt_model_config *cfg, kvt_model **out)
{
	kvt_model *m = calloc(1, sizeof(*m));
	float *tmp = NULL;
	int rc;

	if (!m)
		return KVT_ENOMEM;
	m->dev = d;
	if (cfg)
		m->cfg = *cfg;
	else
		kvt_model_config_default(&m->cfg);
	rc = read_hparams(g, &m->hp);
	if (rc)
		goto fail;
	const kvt_model_hparams *hp = &m->hp;
	m->arch = kvt_arch_find(hp->arch, strlen(hp->arch));
	if (m->cfg.max_ctx == 0 || m->cfg.max_ctx > hp->n_ctx_train)
		m->cfg.max_ctx = hp->n_ctx_train;
	if (m->cfg.max_batch == 0 || m->cfg.max_batch > m->cfg.max_ctx)
		m->cfg.max_batch = m->cfg.max_ctx < 512 ? m->cfg.max_ctx : 512;
	if (m->cfg.weight_dtype != KVT_DTYPE_F16 && m->cfg.weight_dtype != KVT_DTYPE_F32) {
		KVT_LOGE("model: weight dtype %d is not fp16 or fp32", m->cfg.weight_dtype);
		rc = KVT_EINVAL;
		goto fail;
	}

	const uint64_t E = hp->n_embd, KV = (uint64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, V = hp->n_vocab;
	const uint64_t Q = (uint64_t)hp->n_head * hp->head_dim, HD = hp->head_dim;
	uint64_t biggest = V * E > F * E ? V * E : F * E;
	biggest = Q * E > biggest ? Q * E : biggest;
	tmp = malloc(biggest * sizeof(float));
	m->layers = calloc(hp->n_layer, sizeof(*m->layers));
	if (!tmp || !m->layers) {
		rc = KVT_ENOMEM;
		goto fail;
	}
	const int wd = m->cfg.weight_dtype;
	if ((rc = load_tensor(m, g, "token_embd.weight", E, V, wd, tmp, &m->tok_embd.p, &m->tok_embd.dtype)) ||
	    (rc = load_tensor(m, g, "output_norm.weight", E, 0, KVT_DTYPE_F32, tmp, (void **)&m->output_norm, NULL)))
		goto fail;
	if (hp->tied_embeddings)
		m->output = m->tok_embd;
	else if ((rc = load_tensor(m, g, "output.weight", E, V, wd, tmp, &m->output.p, &m->output.dtype)))
		goto fail;
	if ((rc = load_rope_factors(m, g)))
		goto fail;
	for (uint32_t i = 0; i < hp->n_layer; i++) {
		layer_w *L = &m->layers[i];
		char name[96];
#define LOAD_NORM(field, suffix)                                                                 \
	snprintf(name, sizeof(name), "blk.%u." suffix, i);                                       \
	if ((rc = load_tensor(m, g, name, E, 0, KVT_DTYPE_F32, tmp, (void **)&L->field, NULL)))  \
		goto fail;
#define LOAD_MAT(field, suffix, ne0, ne1)                                                        \
	snprintf(name, sizeof(name), "blk.%u." suffix, i);                                       \
	if ((rc = load_tensor(m, g, name, ne0, ne1, wd, tmp, &L->field.p, &L->field.dtype)))      \
		goto fail;
#define LOAD_VEC(field, suffix, n)                                                                \
	snprintf(name, sizeof(name), "blk.%u." suffix, i);                                       \
	if ((rc = load_tensor(m, g, name, n, 0, KVT_DTYPE_F32, tmp, (void **)&L->field, NULL)))  \
		goto fail;
		LOAD_NORM(attn_norm, "attn_norm.weight")
		LOAD_MAT(wq, "attn_q.weight", E, Q)
		LOAD_MAT(wk, "attn_k.weight", E, KV)
		LOAD_MAT(wv, "attn_v.weight", E, KV)
		LOAD_MAT(wo, "attn_output.weight", Q, E)
		LOAD_NORM(ffn_norm, "ffn_norm.weight")
		LOAD_MAT(w_gate, "ffn_gate.weight", E, F)
		LOAD_MAT(w_up, "ffn_up.weight", E, F)
		LOAD_MAT(w_down, "ffn_down.weight", F, E)
		if (m->arch->qkv_bias) {
			LOAD_VEC(bq, "attn_q.bias", Q)
			LOAD_VEC(bk, "attn_k.bias", KV)
			LOAD_VEC(bv, "attn_v.bias", KV)
		}
		if (m->arch->qk_norm) {
			LOAD_VEC(q_norm, "attn_q_norm.weight", HD)
			LOAD_VEC(k_norm, "attn_k_norm.weight", HD)
		}
		if (m->arch->post_norms) {
			LOAD_NORM(post_attn_norm, "post_attention_norm.weight")
			LOAD_NORM(post_ffn_norm, "post_ffw_norm.weight")
		}
#undef LOAD_NORM
#undef LOAD_MAT
#undef LOAD_VEC
	}
	free(tmp);
	tmp = NULL;
	rc = alloc_buffers(m);
	if (rc)
		goto fail;
	*out = m;
	return KVT_OK;
fail:
	free(tmp);
	kvt_model_destroy(m);
	return rc;
}

void kvt_model_destroy(kvt_model *m)
{
	if (!m)
		return;
	kvt_dev *d = m->dev;
	if (m->layers) {
		for (uint32_t i = 0; i < m->hp.n_layer; i++) {
			layer_w *L = &m->layers[i];
			void *ptrs[] = { L->attn_norm, L->wq.p, L->wk.p, L->wv.p, L->wo.p, L->ffn_norm, L->w_gate.p,
					 L->w_up.p, L->w_down.p, L->bq, L->bk, L->bv, L->q_norm, L->k_norm,
					 L->post_attn_norm, L->post_ffn_norm };
			for (size_t j = 0; j < sizeof(ptrs) / sizeof(*ptrs); j++)
				free_weight(m, ptrs[j]);
		}
		free(m->layers);
	}
	if (m->output.p != m->tok_embd.p)
		free_weight(m, m->output.p);
	free_weight(m, m->tok_embd.p);
	free_weight(m, m->output_norm);
	free_weight(m, m->rope_factors);
	void *bufs[] = { m->x, m->h, m->q, m->k, m->v, m->att, m->gate,
			 m->up, m->logits, m->ids, m->pos, m->ws, m->sub };
	for (size_t j = 0; j < sizeof(bufs) / sizeof(*bufs); j++)
		kvt_dev_free(d, bufs[j]);
	decode_free(m);
	free(m);
}

int kvt_model_read_hparams(const kvt_gguf *g, kvt_model_hparams *out)
{
	kvt_model_hparams hp;
	int rc = read_hparams(g, &hp);
	if (rc == KVT_OK)
		*out = hp;
	return rc;
}

const kvt_model_hparams *kvt_model_hparams_get(const kvt_model *m) { return &m->hp; }
uint32_t kvt_model_max_batch(const kvt_model *m)
{
	return m->cfg.max_batch;
}

uint32_t kvt_model_max_ctx(const kvt_model *m) { return m->cfg.max_ctx; }
size_t kvt_model_weight_bytes(const kvt_model *m) { return m->weight_bytes; }
size_t kvt_model_mapped_bytes(const kvt_model *m) { return m->mapped_bytes; }

void kvt_model_kv_shape(const kvt_model *m, uint32_t block_tokens, kvt_kv_layout *out)
{
	memset(out, 0, sizeof(*out));
	out->n_layers = m->hp.n_layer;
	out->n_kv_heads = m->hp.n_head_kv;
	out->head_dim = m->hp.head_dim;
	out->block_tokens = block_tokens;
}

/* ---- sequences ---- */

int kvt_seq_init(kvt_seq *s, kvt_dev *d, kvt_t0_pool *pool, uint32_t max_tokens)
{
	const uint32_t bt = kvt_t0_layout(pool)->block_tokens;
	memset(s, 0, sizeof(*s));
	s->pool = pool;
	s->dev = d;
	s->max_blocks = (max_tokens + bt - 1) / bt;
	if (!s->max_blocks)
		s->max_blocks = 1;
	s->blocks = calloc(s->max_blocks, sizeof(*s->blocks));
	if (!s->blocks)
		return KVT_ENOMEM;
	int rc = kvt_dev_alloc(d, s->max_blocks * sizeof(int32_t), (void **)&s->d_blocks);
	if (rc) {
		free(s->blocks);
		s->blocks = NULL;
	}
	return rc;
}

void kvt_seq_reset(kvt_seq *s)
{
	for (uint32_t i = 0; i < s->n_blocks; i++)
		kvt_t0_unref(s->pool, s->blocks[i]);
	s->n_blocks = 0;
	s->n_synced = 0;
	s->n_tokens = 0;
}

void kvt_seq_deinit(kvt_seq *s)
{
	if (!s->blocks)
		return;
	kvt_seq_reset(s);
	free(s->blocks);
	kvt_dev_free(s->dev, s->d_blocks);
	memset(s, 0, sizeof(*s));
}

int kvt_seq_share_prefix(kvt_seq *dst, const kvt_seq *src, uint32_t n_blocks)
{
	const uint32_t bt = kvt_t0_layout(src->pool)->block_tokens;
	if (dst->n_blocks || dst->pool != src->pool || n_blocks > dst->max_blocks ||
	    (uint64_t)n_blocks * bt > src->n_tokens) {
		KVT_LOGE("seq: cannot share %u blocks (source holds %u tokens)", n_blocks, src->n_tokens);
		return KVT_EINVAL;
	}
	for (uint32_t i = 0; i < n_blocks; i++) {
		kvt_t0_ref(dst->pool, src->blocks[i]);
		dst->blocks[i] = src->blocks[i];
	}
	dst->n_blocks = n_blocks;
	dst->n_tokens = n_blocks * bt;
	return KVT_OK;
}

/* Hold blocks for n_total tokens (the device table not updated); on failure hold exactly what was held before. */
static int seq_reserve_blocks(kvt_seq *s, uint32_t n_total)
{
	const uint32_t bt = kvt_t0_layout(s->pool)->block_tokens;
	const uint32_t need = (n_total + bt - 1) / bt, had = s->n_blocks;

	if (need > s->max_blocks)
		return KVT_EFULL;
	while (s->n_blocks < need) {
		int rc = kvt_t0_alloc(s->pool, &s->blocks[s->n_blocks]);
		if (rc) {
			while (s->n_blocks > had)
				kvt_t0_unref(s->pool, s->blocks[--s->n_blocks]);
			return rc;
		}
		s->n_blocks++;
	}
	return KVT_OK;
}

/* Hold blocks for n_total tokens, the device table in step; on failure hold exactly what was held before. */
static int seq_reserve(kvt_seq *s, uint32_t n_total)
{
	int rc = seq_reserve_blocks(s, n_total);
	if (rc)
		return rc;
	if (s->n_synced < s->n_blocks) {
		rc = kvt_dev_copy_h2d(s->dev, s->d_blocks + s->n_synced, s->blocks + s->n_synced,
					  (s->n_blocks - s->n_synced) * sizeof(int32_t));
		if (rc)
			return rc;
		s->n_synced = s->n_blocks;
	}
	return KVT_OK;
}

/* ---- forward ---- */

static int mm(kvt_model *m, uint32_t rows, uint32_t n_in, uint32_t n_out, wmat w, const float *x,
	      float *y, bool acc)
{
	kvt_matmul_args a = { .n_rows = rows, .n_in = n_in, .n_out = n_out, .w_dtype = w.dtype,
			      .w = w.p, .x = x, .y = y, .accumulate = acc };
	return kvt_dev_matmul(m->dev, &a, m->ws);
}

/* y = matmul(rmsnorm(x; norm), w), the norm fused in */
static int norm_mm(kvt_model *m, uint32_t rows, uint32_t n_in, uint32_t n_out, wmat w, const float *norm, float *y)
{
	kvt_norm_matmul_args a = { .mm = { .n_rows = rows, .n_in = n_in, .n_out = n_out, .w_dtype = w.dtype, .w = w.p,
					   .x = m->x, .y = y },
				   .norm_w = norm, .eps = m->hp.rms_eps };
	return kvt_dev_norm_matmul(m->dev, &a, m->ws);
}

/*
 * x += in W (a sublayer's output projection into the residual stream), or
 * with a post-norm x += rmsnorm(in W) * post_norm.
 */
static int sublayer_out(kvt_model *m, uint32_t M, uint32_t n_in, wmat w, const float *in, const float *post_norm)
{
	const uint32_t E = m->hp.n_embd;
	if (!post_norm)
		return mm(m, M, n_in, E, w, in, m->x, true);
	kvt_rmsnorm_args rn = { .n_rows = M, .n_dim = E, .eps = m->hp.rms_eps, .w = post_norm, .x = m->sub, .y = m->sub };
	kvt_add_args ad = { .n = (uint64_t)M * E, .x = m->sub, .y = m->x };
	int rc;
	if ((rc = mm(m, M, n_in, E, w, in, m->sub, false)) || (rc = kvt_dev_rmsnorm(m->dev, &rn)) ||
	    (rc = kvt_dev_add(m->dev, &ad)))
		return rc;
	return KVT_OK;
}

/*
 * One forward run: n consecutive rows of the batch appended to (or, in a
 * blend, recomputed in) sequence s at positions pos0..pos0+n-1. K/V storing
 * and attention run per run on its own rows; the matmuls see all rows.
 */
typedef struct fwd_run {
	kvt_seq *s;     /* the sequence the rows belong to */
	uint32_t pos0;  /* position of the run's first row */
	uint32_t n;     /* rows */
} fwd_run;

/* Copy M rows' positions (host pos[]) to the device's m->pos. */
static int upload_pos(kvt_model *m, const int32_t *pos, uint32_t M)
{
	return kvt_dev_copy_h2d(m->dev, m->pos, pos, M * sizeof(int32_t));
}

/*
 * Layer l over the M rows of m->x, in n_run runs (rows consecutive in run
 * order; d_pos: [M] the rows' positions on the device).
 */
static int layer_step(kvt_model *m, uint32_t l, uint32_t n_run, const fwd_run *runs, uint32_t M, const int32_t *d_pos)
{
	const kvt_model_hparams *hp = &m->hp;
	const uint32_t E = hp->n_embd, KVD = hp->n_head_kv * hp->head_dim;
	const kvt_arch *ar = m->arch;
	const uint32_t QD = hp->n_head * hp->head_dim;
	const layer_w *L = &m->layers[l];
	const bool local = kvt_model_layer_is_local(hp, l);
	int rc;

	if (m->n_gates && (rc = gate_wait(m, l)))
		return rc;
	kvt_rmsnorm_args rn = { .n_rows = M, .n_dim = E, .eps = hp->rms_eps, .w = L->attn_norm, .x = m->x, .y = m->h };
	const float freq_base = local ? hp->rope_base_swa : hp->rope_base;
	kvt_rope_args rq = { .n_rows = M, .n_heads = hp->n_head, .head_dim = hp->head_dim, .n_rot = hp->n_rot,
			     .freq_base = freq_base, .pos = d_pos, .x = m->q,
			     .neox = ar->rope_neox, .freq_factors = local ? NULL : m->rope_factors };
	kvt_rope_args rk = rq;
	rk.n_heads = hp->n_head_kv;
	rk.x = m->k;
	/* the norm fused into each input GEMM */
	if ((rc = norm_mm(m, M, E, QD, L->wq, L->attn_norm, m->q)) ||
	    (rc = norm_mm(m, M, E, KVD, L->wk, L->attn_norm, m->k)) ||
	    (rc = norm_mm(m, M, E, KVD, L->wv, L->attn_norm, m->v)))
		return rc;
	if (ar->qkv_bias) {
		kvt_add_args bq = { .n = (uint64_t)M * QD, .x = L->bq, .y = m->q, .n_x = QD };
		kvt_add_args bk = { .n = (uint64_t)M * KVD, .x = L->bk, .y = m->k, .n_x = KVD };
		kvt_add_args bv = { .n = (uint64_t)M * KVD, .x = L->bv, .y = m->v, .n_x = KVD };
		if ((rc = kvt_dev_add(m->dev, &bq)) || (rc = kvt_dev_add(m->dev, &bk)) || (rc = kvt_dev_add(m->dev, &bv)))
			return rc;
	}
	if (ar->qk_norm) { /* each head is a row of head_dim */
		kvt_rmsnorm_args nq = { .n_rows = M * hp->n_head, .n_dim = hp->head_dim, .eps = hp->rms_eps,
					.w = L->q_norm, .x = m->q, .y = m->q };
		kvt_rmsnorm_args nk = nq;
		nk.n_rows = M * hp->n_head_kv;
		nk.w = L->k_norm;
		nk.x = nk.y = m->k;
		if ((rc = kvt_dev_rmsnorm(m->dev, &nq)) || (rc = kvt_dev_rmsnorm(m->dev, &nk)))
			return rc;
	}
	/* RoPE fused with the K/V store (per run, below) where it is the plain Llama rotation */
	const bool fused_rope = !ar->rope_neox && !rq.freq_factors;
	if (!fused_rope && ((rc = kvt_dev_rope(m->dev, &rq)) || (rc = kvt_dev_rope(m->dev, &rk))))
		return rc;
	for (uint32_t i = 0, r0 = 0; i < n_run; r0 += runs[i].n, i++) {
		const kvt_seq *s = runs[i].s;
		const kvt_kv_layout *kv = kvt_t0_layout(s->pool);
		kvt_kv_store_args st = { .kv = kv, .layer = l, .block_table = s->d_blocks, .pos0 = runs[i].pos0,
					 .n_rows = runs[i].n, .k = m->k + (size_t)r0 * KVD, .v = m->v + (size_t)r0 * KVD };
		kvt_attention_args at = { .kv = kv, .layer = l, .block_table = s->d_blocks, .pos0 = runs[i].pos0,
					  .n_rows = runs[i].n, .n_heads = hp->n_head, .scale = hp->attn_scale,
					  .q = m->q + (size_t)r0 * QD, .out = m->att + (size_t)r0 * QD,
					  .window = local ? hp->n_swa : 0 };
		if (m->dec_issue)
			decode_seq_args(m, i, &st, &at);
		if (fused_rope) {
			kvt_rope_store_args rs = { .st = st, .n_heads = hp->n_head, .n_rot = hp->n_rot,
						   .freq_base = freq_base, .pos = d_pos + r0,
						   .q = m->q + (size_t)r0 * QD, .k = m->k + (size_t)r0 * KVD };
			rc = kvt_dev_rope_store(m->dev, &rs);
		} else {
			rc = kvt_dev_kv_store(m->dev, &st);
		}
		if (rc || (rc = kvt_dev_attention(m->dev, &at, m->ws)))
			return rc;
	}
	if ((rc = sublayer_out(m, M, QD, L->wo, m->att, L->post_attn_norm)))
		return rc;
	rn.w = L->ffn_norm;
	kvt_swiglu_args sw = { .n = (uint64_t)M * hp->n_ff, .gate = m->gate, .up = m->up, .y = m->gate,
			       .act = ar->act };
	/* norm, both input GEMMs and SwiGLU in one op where the two matrices share a dtype (SiLU only) */
	kvt_matmul_swiglu_args fs = { .n_rows = M, .n_in = E, .n_out = hp->n_ff, .w_dtype = L->w_gate.dtype,
				      .w_gate = L->w_gate.p, .w_up = L->w_up.p, .x = m->x, .y = m->gate,
				      .norm_w = L->ffn_norm, .eps = hp->rms_eps };
	if (L->w_gate.dtype == L->w_up.dtype && sw.act == KVT_ACT_SILU)
		rc = kvt_dev_matmul_swiglu(m->dev, &fs, m->ws);
	else if (!(rc = kvt_dev_rmsnorm(m->dev, &rn)) && !(rc = mm(m, M, E, hp->n_ff, L->w_gate, m->h, m->gate, false)) &&
		 !(rc = mm(m, M, E, hp->n_ff, L->w_up, m->h, m->up, false)))
		rc = kvt_dev_swiglu(m->dev, &sw);
	if (rc || (rc = sublayer_out(m, M, hp->n_ff, L->w_down, m->gate, L->post_ffn_norm)))
		return rc;
	return KVT_OK;
}

/*
 * Only the K/V of layer l for the M rows of m->x (one run): norm, the K and V
 * projections, bias, K norm, RoPE, store. A blend's check layer computes
 * them for every row (its deviations), and the layer's attention and FFN only
 * for the rows that go on. m->x is left as it was.
 */
static int layer_kv(kvt_model *m, uint32_t l, const fwd_run *run, uint32_t M, const int32_t *d_pos)
{
	const kvt_model_hparams *hp = &m->hp;
	const uint32_t E = hp->n_embd, KVD = hp->n_head_kv * hp->head_dim;
	const layer_w *L = &m->layers[l];
	const bool local = kvt_model_layer_is_local(hp, l);
	int rc;
	if ((rc = norm_mm(m, M, E, KVD, L->wk, L->attn_norm, m->k)) || (rc = norm_mm(m, M, E, KVD, L->wv, L->attn_norm, m->v)))
		return rc;
	if (m->arch->qkv_bias) {
		kvt_add_args bk = { .n = (uint64_t)M * KVD, .x = L->bk, .y = m->k, .n_x = KVD };
		kvt_add_args bv = { .n = (uint64_t)M * KVD, .x = L->bv, .y = m->v, .n_x = KVD };
		if ((rc = kvt_dev_add(m->dev, &bk)) || (rc = kvt_dev_add(m->dev, &bv)))
			return rc;
	}
	if (m->arch->qk_norm) {
		kvt_rmsnorm_args nk = { .n_rows = M * hp->n_head_kv, .n_dim = hp->head_dim, .eps = hp->rms_eps,
					.w = L->k_norm, .x = m->k, .y = m->k };
		if ((rc = kvt_dev_rmsnorm(m->dev, &nk)))
			return rc;
	}
	kvt_rope_args rk = { .n_rows = M, .n_heads = hp->n_head_kv, .head_dim = hp->head_dim, .n_rot = hp->n_rot,
			     .freq_base = local ? hp->rope_base_swa : hp->rope_base, .pos = d_pos, .x = m->k,
			     .neox = m->arch->rope_neox, .freq_factors = local ? NULL : m->rope_factors };
	kvt_kv_store_args st = { .kv = kvt_t0_layout(run->s->pool), .layer = l, .block_table = run->s->d_blocks,
				 .pos0 = run->pos0, .n_rows = M, .k = m->k, .v = m->v };
	if ((rc = kvt_dev_rope(m->dev, &rk)) || (rc = kvt_dev_kv_store(m->dev, &st)))
		return rc;
	return KVT_OK;
}

/* Embed M rows (ids, on the device) into m->x. */
static int embed_rows(kvt_model *m, const int32_t *ids, uint32_t M)
{
	const uint32_t E = m->hp.n_embd;
	kvt_embed_args ea = { .n_rows = M, .n_dim = E, .n_vocab = m->hp.n_vocab, .table_dtype = m->tok_embd.dtype,
			      .table = m->tok_embd.p, .ids = ids, .y = m->x, .trusted_ids = m->dec_issue,
			      .scale = m->arch->embd_scale ? sqrtf((float)E) : 1.0f };
	return kvt_dev_embed(m->dev, &ea);
}

/*
 * Embed M rows and run every layer over them. The rows are n_seq runs of
 * consecutive tokens, run i of n[i] tokens appended to seqs[i] (which holds
 * the blocks for them); the matmuls see all M rows at once, K/V storing and
 * attention run per sequence on its own rows.
 */
static int run_layers(kvt_model *m, uint32_t n_seq, kvt_seq *const *seqs, const uint32_t *n, const int32_t *tokens,
		      uint32_t M)
{
	const kvt_model_hparams *hp = &m->hp;
	int32_t pos[512];
	fwd_run runs[KVT_DECODE_MAX_SEQ];
	fwd_run *rp = n_seq <= KVT_DECODE_MAX_SEQ ? runs : malloc(n_seq * sizeof(*rp));
	int rc;

	KVT_ASSERT(M <= m->cfg.max_batch);
	if (!rp)
		return KVT_ENOMEM;
	int32_t *ids = m->ids, *d_pos = m->pos;
	if (m->dec_issue)
		decode_rows(m, &ids, &d_pos); /* ids and positions are on the device already */
	else if ((rc = kvt_dev_copy_h2d(m->dev, m->ids, tokens, M * sizeof(int32_t))))
		goto out;
	for (uint32_t i = 0, r = 0, done = 0; i < n_seq; i++) {
		rp[i] = (fwd_run){ .s = seqs[i], .pos0 = seqs[i]->n_tokens, .n = n[i] };
		for (uint32_t j = 0; j < n[i] && !m->dec_issue; j++) {
			pos[r++] = (int32_t)(seqs[i]->n_tokens + j);
			if (r == 512 || (i == n_seq - 1 && j == n[i] - 1)) {
				if ((rc = kvt_dev_copy_h2d(m->dev, m->pos + done, pos, r * sizeof(int32_t))))
					goto out;
				done += r;
				r = 0;
			}
		}
	}
	if ((rc = embed_rows(m, ids, M)))
		goto out;
	for (uint32_t l = 0; l < hp->n_layer; l++)
		if ((rc = layer_step(m, l, n_seq, rp, M, d_pos)))
			goto out;
	m->n_gates = 0; /* the waits are issued; later chunks are ordered after them */
	for (uint32_t i = 0; i < n_seq && !m->dec_issue; i++) /* a decode step counts its tokens once it ran */
		seqs[i]->n_tokens += n[i];
out:
	if (rp != runs)
		free(rp);
	return rc;
}

/* Logits of c rows of the residual stream starting at x (contiguous) into h_logits. */
static int logits_rows(kvt_model *m, const float *x, uint32_t c, float *h_logits)
{
	const kvt_model_hparams *hp = &m->hp;
	kvt_rmsnorm_args rn = { .n_rows = c, .n_dim = hp->n_embd, .eps = hp->rms_eps, .w = m->output_norm, .x = x,
				.y = m->h };
	int rc;
	if ((rc = kvt_dev_rmsnorm(m->dev, &rn)) || (rc = mm(m, c, hp->n_embd, hp->n_vocab, m->output, m->h, m->logits, false)))
		return rc;
	return kvt_dev_copy_d2h(m->dev, h_logits, m->logits, (size_t)c * hp->n_vocab * sizeof(float));
}

static int forward_chunk(kvt_model *m, kvt_seq *s, const int32_t *tokens, uint32_t M, float *h_logits,
			 uint32_t n_logits)
{
	const uint32_t E = m->hp.n_embd;
	int rc;

	if ((rc = run_layers(m, 1, &s, &M, tokens, M)))
		return rc;
	/* Logits for the last n_logits rows only, LOGIT_ROWS at a time. */
	for (uint32_t done = 0; done < n_logits; done += LOGIT_ROWS) {
		uint32_t r0 = M - n_logits + done;
		uint32_t c = n_logits - done < LOGIT_ROWS ? n_logits - done : LOGIT_ROWS;
		if ((rc = logits_rows(m, m->x + (size_t)r0 * E, c, h_logits + (size_t)done * m->hp.n_vocab)))
			return rc;
	}
	return kvt_dev_sync(m->dev);
}

int kvt_model_forward_batch(kvt_model *m, uint32_t n_seq, kvt_seq *const *seqs, const uint32_t *n,
			    const int32_t *tokens, const bool *want_logits, float *h_logits)
{
	const uint32_t E = m->hp.n_embd;
	uint32_t M = 0, n_out = 0, r0, i;
	int rc;

	for (i = 0; i < n_seq; i++) {
		if (!n[i] || (uint64_t)seqs[i]->n_tokens + n[i] > m->cfg.max_ctx) {
			KVT_LOGE("model: batch entry %u: %u tokens on %u do not fit the context of %u", i, n[i],
				 seqs[i]->n_tokens, m->cfg.max_ctx);
			return n[i] ? KVT_EFULL : KVT_EINVAL;
		}
		M += n[i];
	}
	if (!n_seq || M > m->cfg.max_batch) {
		KVT_LOGE("model: a batch of %u rows in %u sequences (at most %u rows)", M, n_seq, m->cfg.max_batch);
		return KVT_EINVAL;
	}
	for (i = 0; i < M; i++) {
		if (tokens[i] < 0 || (uint32_t)tokens[i] >= m->hp.n_vocab) {
			KVT_LOGE("model: token id %d at %u is outside the vocabulary (%u)", tokens[i], i, m->hp.n_vocab);
			return KVT_EINVAL;
		}
	}
	for (i = 0; i < n_seq; i++) {
		if ((rc = seq_reserve(seqs[i], seqs[i]->n_tokens + n[i])))
			return rc;
	}
	if ((rc = run_layers(m, n_seq, seqs, n, tokens, M)))
		return rc;
	/* Gather the last row of each sequence that wants logits into att (free now), LOGIT_ROWS at a time. */
	for (i = 0, r0 = 0; i < n_seq; r0 += n[i], i++) {
		if (!want_logits[i])
			continue;
		uint32_t g = n_out % LOGIT_ROWS;
		if ((rc = kvt_dev_copy_d2d(m->dev, m->att + (size_t)g * E, m->x + (size_t)(r0 + n[i] - 1) * E,
					   E * sizeof(float))))
			return rc;
		n_out++;
		bool last = true;
		for (uint32_t j = i + 1; j < n_seq; j++)
			last = last && !want_logits[j];
		if (g == LOGIT_ROWS - 1 || last) {
			uint32_t first = n_out - g - 1;
			if ((rc = logits_rows(m, m->att, g + 1, h_logits + (size_t)first * m->hp.n_vocab)))
				return rc;
		}
	}
	return kvt_dev_sync(m->dev);
}

/* n tokens to append to s: ids in the vocabulary, room in the context, blocks held for them (else as before). */
static int append_check(kvt_model *m, kvt_seq *s, const int32_t *tokens, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		if (tokens[i] < 0 || (uint32_t)tokens[i] >= m->hp.n_vocab) {
			KVT_LOGE("model: token id %d at %u is outside the vocabulary (%u)", tokens[i], i, m->hp.n_vocab);
			return KVT_EINVAL;
		}
	}
	if ((uint64_t)s->n_tokens + n > m->cfg.max_ctx) {
		KVT_LOGE("model: %u + %u tokens exceed the context of %u", s->n_tokens, n, m->cfg.max_ctx);
		return KVT_EFULL;
	}
	return seq_reserve(s, s->n_tokens + n);
}

int kvt_model_forward(kvt_model *m, kvt_seq *s, const int32_t *tokens, uint32_t n, float *h_logits, uint32_t n_logits)
{
	int rc;

	if (n == 0 || n_logits > n || (n_logits && !h_logits)) {
		KVT_LOGE("model: forward of %u tokens asked for %u logit rows", n, n_logits);
		return KVT_EINVAL;
	}
	if ((rc = append_check(m, s, tokens, n)))
		return rc;
	for (uint32_t done = 0; done < n; done += m->cfg.max_batch) {
		uint32_t c = n - done < m->cfg.max_batch ? n - done : m->cfg.max_batch;
		/* logit rows that fall inside this chunk */
		uint32_t first_logit = n - n_logits;
		uint32_t lo = first_logit > done ? first_logit : done;
		uint32_t chunk_logits = lo < done + c ? done + c - lo : 0;
		float *dst = chunk_logits ? h_logits + (size_t)(lo - first_logit) * m->hp.n_vocab : NULL;
		if ((rc = forward_chunk(m, s, tokens + done, c, dst, chunk_logits)))
			return rc;
	}
	return KVT_OK;
}

/* ---- chunk reuse: moving K/V between positions, blended prefill ---- */

int kvt_model_kv_move(kvt_model *m, kvt_seq *src, uint32_t src_pos, kvt_seq *dst, uint32_t dst_pos, uint32_t n,
		      int32_t delta)
{
	const kvt_model_hparams *hp = &m->hp;
	const uint32_t B = m->cfg.max_batch;
	int32_t pos[512];
	int rc;

	if (!n || (uint64_t)src_pos + n > src->n_tokens || (uint64_t)dst_pos + n > m->cfg.max_ctx ||
	    (src == dst && src_pos < dst_pos + n && dst_pos < src_pos + n)) {
		KVT_LOGE("model: kv move of %u tokens from %u (of %u) to %u (context %u)", n, src_pos, src->n_tokens,
			 dst_pos, m->cfg.max_ctx);
		return KVT_EINVAL;
	}
	if ((rc = seq_reserve(src, src->n_tokens)) || (rc = seq_reserve(dst, dst_pos + n)))
		return rc;
	/* every row turns by the same delta: one position array, filled once */
	for (uint32_t done = 0, c = B < n ? B : n; done < c; done += 512) {
		uint32_t r = c - done < 512 ? c - done : 512;
		for (uint32_t j = 0; j < r; j++)
			pos[j] = delta;
		if ((rc = kvt_dev_copy_h2d(m->dev, m->pos + done, pos, r * sizeof(int32_t))))
			return rc;
	}
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const bool local = kvt_model_layer_is_local(hp, l);
		for (uint32_t done = 0; done < n; done += B) {
			const uint32_t c = n - done < B ? n - done : B;
			kvt_kv_load_args ld = { .kv = kvt_t0_layout(src->pool), .layer = l, .block_table = src->d_blocks,
						.pos0 = src_pos + done, .n_rows = c, .k = m->k, .v = m->v };
			kvt_rope_args rk = { .n_rows = c, .n_heads = hp->n_head_kv, .head_dim = hp->head_dim,
					     .n_rot = hp->n_rot, .freq_base = local ? hp->rope_base_swa : hp->rope_base,
					     .pos = m->pos, .x = m->k, .neox = m->arch->rope_neox,
					     .freq_factors = local ? NULL : m->rope_factors };
			kvt_kv_store_args st = { .kv = kvt_t0_layout(dst->pool), .layer = l, .block_table = dst->d_blocks,
						 .pos0 = dst_pos + done, .n_rows = c, .k = m->k, .v = m->v };
			if ((rc = kvt_dev_kv_load(m->dev, &ld)) || (delta && (rc = kvt_dev_rope(m->dev, &rk))) ||
			    (rc = kvt_dev_kv_store(m->dev, &st)))
				return rc;
		}
	}
	return kvt_dev_sync(m->dev);
}

/* K and V of rows [r0, r0 + c) of a blend chunk (positions pos0 + r0..) at layer l, to host k/v ([c][KVD] each). */
static int blend_read_kv(kvt_model *m, kvt_seq *s, uint32_t l, uint32_t pos0, uint32_t c, float *k, float *v)
{
	const size_t KVD = (size_t)m->hp.n_head_kv * m->hp.head_dim;
	kvt_kv_load_args ld = { .kv = kvt_t0_layout(s->pool), .layer = l, .block_table = s->d_blocks, .pos0 = pos0,
				.n_rows = c, .k = m->k, .v = m->v };
	int rc;
	if ((rc = kvt_dev_kv_load(m->dev, &ld)) || (rc = kvt_dev_copy_d2h(m->dev, k, m->k, c * KVD * sizeof(float))) ||
	    (rc = kvt_dev_copy_d2h(m->dev, v, m->v, c * KVD * sizeof(float))))
		return rc;
	return KVT_OK;
}

typedef struct blend_rank {
	float dev;     /* the row's deviation at the check layer */
	uint32_t row;  /* its row in the chunk */
} blend_rank;

static int cmp_rank(const void *a, const void *b)
{
	const blend_rank *x = a, *y = b;
	if (x->dev != y->dev)
		return x->dev < y->dev ? 1 : -1; /* largest deviation first */
	return x->row < y->row ? -1 : x->row > y->row; /* ties: earlier rows first (deterministic) */
}

/* Rows of a forward chunk of M rows, c_placed of them placed, that run past the check layer. */
static uint32_t blend_keep(float recompute, uint32_t c_placed)
{
	return (uint32_t)ceilf(recompute * (float)c_placed - 1e-4f);
}

/*
 * Phase A of one forward chunk: M rows at positions pos0.., placed[] of them
 * with K/V there, through layers 0..check-1, and the K/V of layer check
 * (layer_kv); then the rows that go on (not
 * placed, the fraction of the placed ones that deviate most, the blend's
 * last row) appended to xs (device, [*n_xs][n_embd]) and their positions to
 * xpos (host). sel (host, [M]) says which. Scratch: host of 4 * M * KVD
 * floats, rank of M entries, pos of M.
 */
static int blend_phase_a(kvt_model *m, kvt_seq *s, uint32_t pos0, const int32_t *tokens, uint32_t M,
			 const uint8_t *placed, const kvt_blend_params *bp, uint32_t check, bool force_last, float *host,
			 blend_rank *rank, int32_t *pos, uint8_t *sel, float *xs, int32_t *xpos, uint32_t *n_xs)
{
	const size_t E = m->hp.n_embd, KVD = (size_t)m->hp.n_head_kv * m->hp.head_dim;
	uint32_t n_placed = 0;
	int rc;

	for (uint32_t i = 0; i < M; i++) {
		n_placed += placed[i] != 0;
		pos[i] = (int32_t)(pos0 + i);
	}
	if ((rc = kvt_dev_copy_h2d(m->dev, m->ids, tokens, M * sizeof(int32_t))) || (rc = upload_pos(m, pos, M)) ||
	    (rc = embed_rows(m, m->ids, M)))
		return rc;
	fwd_run all = { .s = s, .pos0 = pos0, .n = M };
	for (uint32_t l = 0; l < check; l++)
		if ((rc = layer_step(m, l, 1, &all, M, m->pos)))
			return rc;
	/* the check layer: the placed K/V read, then this prompt's K/V of every row stored over them */
	if (n_placed && (rc = blend_read_kv(m, s, check, pos0, M, host, host + M * KVD)))
		return rc;
	if ((rc = layer_kv(m, check, &all, M, m->pos)))
		return rc;
	/* rank the placed rows by how far this prompt's context moved their K/V at the check layer */
	uint32_t n_rank = 0;
	if (n_placed) {
		float *pk = host, *pv = host + M * KVD, *fk = host + 2 * M * KVD, *fv = host + 3 * M * KVD;
		if ((rc = blend_read_kv(m, s, check, pos0, M, fk, fv)))
			return rc;
		for (uint32_t i = 0; i < M; i++) {
			if (!placed[i])
				continue;
			double dk = 0, dv = 0, nk = 1e-12, nv = 1e-12;
			for (size_t j = i * KVD; j < (i + 1) * KVD; j++) {
				dk += (double)(fk[j] - pk[j]) * (fk[j] - pk[j]);
				dv += (double)(fv[j] - pv[j]) * (fv[j] - pv[j]);
				nk += (double)fk[j] * fk[j];
				nv += (double)fv[j] * fv[j];
			}
			rank[n_rank++] = (blend_rank){ .dev = (float)(dk / nk + dv / nv), .row = i };
		}
		qsort(rank, n_rank, sizeof(*rank), cmp_rank);
	}
	const uint32_t n_keep = blend_keep(bp->recompute, n_placed);
	uint32_t n_kept = 0;
	for (uint32_t i = 0, run = 0; i < M; i++) {
		run = placed[i] ? (i && placed[i - 1] ? run + 1 : 0) : 0;
		sel[i] = !placed[i] || (force_last && i == M - 1);
		/* a chunk's first rows (the start of a run of placed rows; a run cut by the chunk boundary at row 0 is
		 * not a start), within the fraction */
		if (placed[i] && run < bp->n_sink && n_kept < n_keep && (run < i || (i == run && pos0 == s->n_tokens))) {
			sel[i] = 1;
			n_kept++;
		}
	}
	for (uint32_t i = 0; n_kept < n_keep && i < n_rank; i++)
		if (!sel[rank[i].row]) {
			sel[rank[i].row] = 1;
			n_kept++;
		}
	/* the selected rows' residual streams, appended to xs run by run */
	for (uint32_t i = 0; i < M;) {
		if (!sel[i]) {
			i++;
			continue;
		}
		uint32_t j = i;
		while (j < M && sel[j])
			j++;
		if ((rc = kvt_dev_copy_d2d(m->dev, xs + (size_t)*n_xs * E, m->x + (size_t)i * E, (j - i) * E * sizeof(float))))
			return rc;
		for (uint32_t r = i; r < j; r++)
			xpos[(*n_xs)++] = (int32_t)(pos0 + r);
		i = j;
	}
	return KVT_OK;
}

int kvt_model_forward_blend(kvt_model *m, kvt_seq *s, const int32_t *tokens, uint32_t n, const uint8_t *placed,
			    const kvt_blend_params *bp, float *h_logits, uint32_t n_logits, kvt_blend_result *out)
{
	const kvt_model_hparams *hp = &m->hp;
	const uint32_t B = m->cfg.max_batch, E = hp->n_embd;
	const size_t KVD = (size_t)hp->n_head_kv * hp->head_dim;
	kvt_blend_result res = { 0 };
	int rc;

	if (!bp || !(bp->recompute >= 0.0f && bp->recompute <= 1.0f) || bp->check_layer < 1 || n == 0 || n_logits > 1 ||
	    (n_logits && !h_logits) || !placed) {
		KVT_LOGE("model: blend of %u tokens: bad parameters (recompute %g, check layer %u, %u logit rows)", n,
			 bp ? bp->recompute : -1.0f, bp ? bp->check_layer : 0, n_logits);
		return KVT_EINVAL;
	}
	if ((rc = append_check(m, s, tokens, n)))
		return rc;
	/*
	 * Two phases, so the later layers' matmuls see full chunks of rows (a
	 * quantized weight widened once serves max_batch rows, as in a plain
	 * prefill): A runs each forward chunk through layers 0..check-1 and the
	 * K/V of layer check, and keeps the rows that go on (their residual
	 * streams entering layer check, packed into xs); B runs those, max_batch
	 * at a time in position order, through layers check..n_layer-1. A later
	 * chunk's phase A needs only earlier chunks' K/V of its layers, which A
	 * wrote; B's rows attend to the placed K/V (and, at layer check, this
	 * prompt's K/V of every row) and to the rows B ran before them.
	 */
	const uint32_t check = bp->check_layer < hp->n_layer ? bp->check_layer : hp->n_layer - 1;
	uint32_t cap_xs = 0;
	for (uint32_t done = 0; done < n; done += B) {
		const uint32_t c = n - done < B ? n - done : B;
		uint32_t np = 0;
		for (uint32_t i = done; i < done + c; i++)
			np += placed[i] != 0;
		cap_xs += c - np + blend_keep(bp->recompute, np) + 1;
	}
	cap_xs = cap_xs < n ? cap_xs : n;
	const uint32_t C = n < B ? n : B;
	float *host = malloc(4 * (size_t)C * KVD * sizeof(float)), *xs = NULL;
	blend_rank *rank = malloc(C * sizeof(*rank));
	uint8_t *sel = malloc(C);
	int32_t *pos = malloc(C * sizeof(int32_t)), *xpos = malloc(cap_xs * sizeof(int32_t));
	fwd_run *runs = malloc(C * sizeof(*runs));
	rc = host && rank && sel && pos && xpos && runs ? KVT_OK : KVT_ENOMEM;
	if (rc == KVT_OK)
		rc = kvt_dev_alloc(m->dev, (size_t)cap_xs * E * sizeof(float), (void **)&xs);
	uint32_t n_xs = 0, last_rows = 0;
	for (uint32_t done = 0; rc == KVT_OK && done < n; done += B) {
		const uint32_t c = n - done < B ? n - done : B;
		rc = blend_phase_a(m, s, s->n_tokens + done, tokens + done, c, placed + done, bp, check, done + c == n, host,
				   rank, pos, sel, xs, xpos, &n_xs);
		for (uint32_t i = 0; rc == KVT_OK && i < c; i++) {
			res.n_placed += placed[done + i] != 0;
			res.n_recomputed += placed[done + i] && sel[i];
		}
	}
	for (uint32_t g = 0; rc == KVT_OK && g < n_xs; g += B) {
		const uint32_t S = n_xs - g < B ? n_xs - g : B;
		uint32_t n_run = 0;
		for (uint32_t i = 0; i < S;) {
			uint32_t j = i + 1;
			while (j < S && xpos[g + j] == xpos[g + j - 1] + 1)
				j++;
			runs[n_run++] = (fwd_run){ .s = s, .pos0 = (uint32_t)xpos[g + i], .n = j - i };
			i = j;
		}
		if ((rc = kvt_dev_copy_d2d(m->dev, m->x, xs + (size_t)g * E, (size_t)S * E * sizeof(float))) ||
		    (rc = upload_pos(m, xpos + g, S)))
			break;
		for (uint32_t l = check; rc == KVT_OK && l < hp->n_layer; l++)
			rc = layer_step(m, l, n_run, runs, S, m->pos);
		last_rows = S;
	}
	/* the blend's last row is the last row phase B left in x (always selected) */
	if (rc == KVT_OK && n_logits)
		rc = logits_rows(m, m->x + (size_t)(last_rows - 1) * E, 1, h_logits);
	if (rc == KVT_OK)
		rc = kvt_dev_sync(m->dev);
	if (rc == KVT_OK)
		s->n_tokens += n;
	kvt_dev_free(m->dev, xs);
	free(host);
	free(rank);
	free(sel);
	free(pos);
	free(xpos);
	free(runs);
	if (rc == KVT_OK && out)
		*out = res;
	return rc;
}

/* ---- decode steps on the device (kvt_model_decode) ---- */

/*
 * Staging, one pinned host buffer mirrored by one device buffer, so a step's
 * inputs go over in one copy: ids[DEC_ROWS], pos[DEC_ROWS], u[DEC_ROWS]
 * (floats), then next[DEC_ROWS] (the picked tokens, copied back). Block
 * tables live in tables[DEC_ROWS][max_blocks] on the device, rows updated
 * from the host mirror only where a sequence's table changed.
 *
 * Graphs per batch-size bucket: a step of n <= DEC_EXACT sequences replays
 * the graph captured for exactly n rows; above that, n is padded up to the
 * next multiple of DEC_STEP (at most the row cap) and replays that bucket's
 * graph. One graph per exact size up to 128 would mean up to 128 captures,
 * each paid on the first step of its size (a whole step issued op by op,
 * plus instantiation), and a graph's node count grows with its rows (two
 * per-sequence ops a layer), so the graphs of every size together would
 * hold ~64x the nodes of the largest one; buckets of 8 bound it to 23
 * graphs, and pad at most 7 rows, which cost the GEMMs nothing while they
 * are bound by reading the weights (a row of activations is a few KiB
 * against the weights' GiB).
 *
 * Padding rows must not touch any sequence's KV or output: each reads token
 * 0 at position 0 through a table row holding only a scratch block, taken
 * from the pool for the step and given back after its host wait (so no
 * sequence can hold it meanwhile); their activations, logits and picked ids
 * land in rows past n, which nothing reads. When the pool has no free block
 * for the scratch, the step runs at its exact size instead (its own graph).
 */
#define DEC_ROWS KVT_DECODE_MAX_SEQ
#define DEC_EXACT 8u /* batch sizes with a graph of their own */
#define DEC_STEP 8u  /* bucket width above DEC_EXACT */

typedef struct decode_state {
	int32_t *h_stage;           /* pinned: ids, pos, u, next; then the host mirror of tables */
	int32_t *d_stage;           /* device: ids, pos, u, next */
	int32_t *d_tables;          /* device: [DEC_ROWS][max_blocks] */
	float *d_logits;            /* device: [row_cap][n_vocab] when row_cap > LOGIT_ROWS; else NULL (m->logits serves) */
	uint32_t row_cap;           /* rows a step may have: min(max_batch, DEC_ROWS) */
	uint32_t max_blocks;        /* table row length */
	uint32_t block_tokens;      /* of the pool the tables index */
	kvt_kv_layout kv;           /* the pool the graphs were captured for */
	kvt_graph *graph[DEC_ROWS + 1];      /* by row count (exact sizes, then buckets); NULL until captured */
	kvt_decode_sampling smp[DEC_ROWS + 1]; /* what each graph picks tokens with */
} decode_state;

/* The rows a step of n sequences runs with graphs: n, or its bucket (see above). */
static uint32_t decode_bucket(const decode_state *ds, uint32_t n)
{
	if (n <= DEC_EXACT)
		return n;
	uint32_t r = (n + DEC_STEP - 1) / DEC_STEP * DEC_STEP;
	return r < ds->row_cap ? r : ds->row_cap;
}

static int32_t *dec_tables_host(decode_state *ds) { return ds->h_stage + 4 * DEC_ROWS; }

static void decode_rows(kvt_model *m, int32_t **ids, int32_t **pos)
{
	*ids = m->dec->d_stage;
	*pos = m->dec->d_stage + DEC_ROWS;
}

static void decode_seq_args(kvt_model *m, uint32_t i, kvt_kv_store_args *st, kvt_attention_args *at)
{
	decode_state *ds = m->dec;
	const int32_t *table = ds->d_tables + (size_t)i * ds->max_blocks, *pos = ds->d_stage + DEC_ROWS + i;
	st->block_table = at->block_table = table;
	st->d_pos0 = at->d_pos0 = pos;
	st->pos0 = at->pos0 = m->cfg.max_ctx - 1; /* the bound the launch shapes are sized for */
}

static void decode_drop_graphs(kvt_model *m)
{
	for (uint32_t n = 0; n <= DEC_ROWS; n++) {
		kvt_dev_graph_destroy(m->dev, m->dec->graph[n]);
		m->dec->graph[n] = NULL;
	}
}

static void decode_free(kvt_model *m)
{
	if (!m->dec)
		return;
	decode_drop_graphs(m);
	kvt_dev_host_free(m->dev, m->dec->h_stage);
	kvt_dev_free(m->dev, m->dec->d_stage);
	kvt_dev_free(m->dev, m->dec->d_tables);
	kvt_dev_free(m->dev, m->dec->d_logits);
	free(m->dec);
	m->dec = NULL;
}

static int decode_init(kvt_model *m, const kvt_kv_layout *kv)
{
	decode_state *ds = calloc(1, sizeof *ds);
	if (!ds)
		return KVT_ENOMEM;
	m->dec = ds;
	ds->block_tokens = kv->block_tokens;
	ds->max_blocks = (m->cfg.max_ctx + kv->block_tokens - 1) / kv->block_tokens;
	ds->kv = *kv;
	ds->row_cap = m->cfg.max_batch < DEC_ROWS ? m->cfg.max_batch : DEC_ROWS;
	const size_t tab = (size_t)DEC_ROWS * ds->max_blocks * sizeof(int32_t);
	int rc;
	if ((rc = kvt_dev_host_alloc(m->dev, 4 * DEC_ROWS * sizeof(int32_t) + tab, (void **)&ds->h_stage)) ||
	    (rc = kvt_dev_alloc(m->dev, 4 * DEC_ROWS * sizeof(int32_t), (void **)&ds->d_stage)) ||
	    (rc = kvt_dev_alloc(m->dev, tab, (void **)&ds->d_tables)) ||
	    (ds->row_cap > LOGIT_ROWS &&
	     (rc = alloc_act(m, (size_t)ds->row_cap * m->hp.n_vocab, &ds->d_logits)))) {
		decode_free(m);
		return rc;
	}
	memset(ds->h_stage, 0xff, 4 * DEC_ROWS * sizeof(int32_t) + tab); /* no table row matches yet */
	return KVT_OK;
}

/* Bring device table row i up to blocks[0..n_blocks) where the host mirror says it differs: one copy. */
static int decode_sync_row(kvt_model *m, uint32_t i, const int32_t *blocks, uint32_t n_blocks)
{
	decode_state *ds = m->dec;
	int32_t *row = dec_tables_host(ds) + (size_t)i * ds->max_blocks;
	uint32_t lo = 0, hi = n_blocks;
	while (lo < hi && row[lo] == blocks[lo])
		lo++;
	while (hi > lo && row[hi - 1] == blocks[hi - 1])
		hi--;
	if (lo == hi)
		return KVT_OK;
	memcpy(row + lo, blocks + lo, (hi - lo) * sizeof(int32_t));
	return kvt_dev_copy_async(m->dev, NULL, ds->d_tables + (size_t)i * ds->max_blocks + lo, row + lo,
				  (hi - lo) * sizeof(int32_t), KVT_COPY_H2D);
}

/* The table rows of this step: the sequences' own, then (padding rows n_seq..rows-1) the scratch block. */
static int decode_sync_tables(kvt_model *m, uint32_t n_seq, kvt_seq *const *seqs, uint32_t rows, int32_t scratch)
{
	int rc = KVT_OK;
	for (uint32_t i = 0; i < n_seq && !rc; i++)
		rc = decode_sync_row(m, i, seqs[i]->blocks, seqs[i]->n_blocks);
	for (uint32_t i = n_seq; i < rows && !rc; i++)
		rc = decode_sync_row(m, i, &scratch, 1);
	return rc;
}

/*
 * The step's ops, issued (or captured) on the compute stream: inputs in,
 * layers, logits, pick, ids out, over rows >= n_seq rows (the rows past
 * n_seq are padding: their tables and inputs are staged already).
 */
static int decode_issue(kvt_model *m, uint32_t n_seq, kvt_seq *const *seqs, uint32_t rows,
			const kvt_decode_sampling *smp)
{
	decode_state *ds = m->dec;
	const kvt_model_hparams *hp = &m->hp;
	uint32_t ones[DEC_ROWS];
	kvt_seq *rs[DEC_ROWS]; /* padding rows name sequence 0 for its pool's layout only: decode_seq_args
	                          gives every row its own table row and position */
	int32_t *d_next = ds->d_stage + 3 * DEC_ROWS;
	float *logits = ds->d_logits ? ds->d_logits : m->logits;
	int rc;

	for (uint32_t i = 0; i < rows; i++) {
		ones[i] = 1;
		rs[i] = seqs[i < n_seq ? i : 0];
	}
	if ((rc = kvt_dev_copy_async(m->dev, NULL, ds->d_stage, ds->h_stage, 3 * DEC_ROWS * sizeof(int32_t),
				     KVT_COPY_H2D)))
		return rc;
	m->dec_issue = true;
	rc = run_layers(m, rows, rs, ones, NULL, rows);
	m->dec_issue = false;
	if (rc)
		return rc;
	if ((rc = norm_mm(m, rows, hp->n_embd, hp->n_vocab, m->output, m->output_norm, logits)))
		return rc;
	if (smp->temperature > 0) {
		kvt_sample_args sa = { .n_rows = rows, .n_cols = hp->n_vocab, .x = logits,
				       .temperature = smp->temperature, .top_k = smp->top_k, .top_p = smp->top_p,
				       .u = (const float *)(ds->d_stage + 2 * DEC_ROWS), .out = d_next };
		const size_t need = kvt_dev_sample_workspace_bytes(m->dev, &sa);
		if (need > m->ws_bytes) { /* the load sized ws for KVT_DECODE_MAX_SEQ rows: not reached */
			KVT_LOGE("model: sampling %u rows needs %zu bytes of workspace, the model has %zu", rows, need,
				 m->ws_bytes);
			return KVT_EINVAL;
		}
		rc = kvt_dev_sample(m->dev, &sa, m->ws);
	} else {
		kvt_argmax_args aa = { .n_rows = rows, .n_cols = hp->n_vocab, .x = logits, .out = d_next };
		rc = kvt_dev_argmax(m->dev, &aa);
	}
	if (rc)
		return rc;
	return kvt_dev_copy_async(m->dev, NULL, ds->h_stage + 3 * DEC_ROWS, d_next, rows * sizeof(int32_t),
				  KVT_COPY_D2H);
}

static bool same_sampling(const kvt_decode_sampling *a, const kvt_decode_sampling *b)
{
	return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p;
}

/* Launch the graph of this row count, capturing it first where there is none for these sampling parameters. */
static int decode_replay(kvt_model *m, uint32_t n_seq, kvt_seq *const *seqs, uint32_t rows,
			 const kvt_decode_sampling *smp)
{
	decode_state *ds = m->dec;
	int rc;
	if (ds->graph[rows] && !same_sampling(&ds->smp[rows], smp)) {
		kvt_dev_graph_destroy(m->dev, ds->graph[rows]);
		ds->graph[rows] = NULL;
	}
	if (!ds->graph[rows]) {
		if ((rc = kvt_dev_capture_begin(m->dev)))
			return rc;
		int issued = decode_issue(m, n_seq, seqs, rows, smp);
		rc = kvt_dev_capture_end(m->dev, &ds->graph[rows]); /* ends the capture either way */
		if (issued || rc) { /* a partial capture is no graph to replay */
			kvt_dev_graph_destroy(m->dev, ds->graph[rows]);
			ds->graph[rows] = NULL;
			return issued ? issued : rc;
		}
		ds->smp[rows] = *smp;
	}
	return kvt_dev_graph_launch(m->dev, ds->graph[rows]);
}

int kvt_model_decode(kvt_model *m, uint32_t n_seq, kvt_seq *const *seqs, const int32_t *tokens,
		     const kvt_decode_sampling *smp, const float *u, int32_t *next)
{
	const kvt_decode_sampling greedy = { 0 };
	int rc;

	if (!smp)
		smp = &greedy;
	if (!n_seq || n_seq > DEC_ROWS || n_seq > m->cfg.max_batch || !seqs || !tokens || !next) {
		KVT_LOGE("model: a decode step of %u sequences (1 to %u)", n_seq,
			 m->cfg.max_batch < DEC_ROWS ? m->cfg.max_batch : DEC_ROWS);
		return KVT_EINVAL;
	}
	if (!(smp->temperature >= 0) || (smp->temperature > 0 && (!u || !(smp->top_p > 0 && smp->top_p <= 1)))) {
		KVT_LOGE("model: decode sampling temperature %g top_p %g%s", smp->temperature, smp->top_p,
			 u ? "" : " without uniform draws");
		return KVT_EINVAL;
	}
	const kvt_kv_layout *kv = kvt_t0_layout(seqs[0]->pool);
	for (uint32_t i = 0; i < n_seq; i++) {
		if (tokens[i] < 0 || (uint32_t)tokens[i] >= m->hp.n_vocab) {
			KVT_LOGE("model: token id %d at %u is outside the vocabulary (%u)", tokens[i], i, m->hp.n_vocab);
			return KVT_EINVAL;
		}
		if (kvt_t0_layout(seqs[i]->pool) != kv) {
			KVT_LOGE("model: decode step entry %u uses another KV pool than entry 0", i);
			return KVT_EINVAL;
		}
		for (uint32_t j = 0; j < i; j++)
			if (seqs[j] == seqs[i]) {
				KVT_LOGE("model: decode step entries %u and %u are the same sequence", j, i);
				return KVT_EINVAL;
			}
		if ((uint64_t)seqs[i]->n_tokens + 1 > m->cfg.max_ctx) {
			KVT_LOGE("model: decode step entry %u: %u tokens already fill the context of %u", i,
				 seqs[i]->n_tokens, m->cfg.max_ctx);
			return KVT_EFULL;
		}
	}
	const kvt_kv_layout *had = m->dec ? &m->dec->kv : NULL;
	if (had && (had->pool != kv->pool || had->codec != kv->codec || had->n_slots != kv->n_slots ||
		    had->block_tokens != kv->block_tokens || had->n_layers != kv->n_layers ||
		    had->n_kv_heads != kv->n_kv_heads || had->head_dim != kv->head_dim))
		decode_free(m); /* another pool: new tables and graphs */
	if (!m->dec && (rc = decode_init(m, kv)))
		return rc;
	decode_state *ds = m->dec;
	for (uint32_t i = 0; i < n_seq; i++)
		if ((rc = seq_reserve_blocks(seqs[i], seqs[i]->n_tokens + 1)))
			return rc;
	const bool graphs = !m->cfg.no_graphs && kvt_dev_graphs_supported(m->dev);
	uint32_t rows = graphs ? decode_bucket(ds, n_seq) : n_seq; /* the direct path needs no padding */
	kvt_t0_pool *pool = seqs[0]->pool;
	int32_t scratch = -1;
	if (rows > n_seq && kvt_t0_alloc(pool, &scratch))
		rows = n_seq; /* no free block for the padding rows: this step at its exact size */
	for (uint32_t i = 0; i < rows; i++) {
		ds->h_stage[i] = i < n_seq ? tokens[i] : 0;
		ds->h_stage[DEC_ROWS + i] = i < n_seq ? (int32_t)seqs[i]->n_tokens : 0;
		float ui = u && i < n_seq ? u[i] : 0.0f;
		memcpy(&ds->h_stage[2 * DEC_ROWS + i], &ui, sizeof ui);
	}
	if (!(rc = decode_sync_tables(m, n_seq, seqs, rows, scratch)))
		rc = graphs ? decode_replay(m, n_seq, seqs, rows, smp) : decode_issue(m, n_seq, seqs, rows, smp);
	if (!rc)
		rc = kvt_dev_sync(m->dev);
	if (scratch >= 0) /* after the host wait: the step is done with it (or never ran) */
		kvt_t0_unref(pool, scratch);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n_seq; i++) {
		next[i] = ds->h_stage[3 * DEC_ROWS + i];
		seqs[i]->n_tokens++;
	}
	return KVT_OK;
}

/* ---- layer gates (kvt_model_forward_gated: a prefix promoted layer group by layer group) ---- */

static int gate_wait(kvt_model *m, uint32_t l)
{
	for (uint32_t i = 0; i < m->n_gates; i++) {
		const kvt_model_gate *g = &m->gates[i];
		if (l % g->layers_per_group || l / g->layers_per_group >= g->n_groups)
			continue;
		const uint32_t grp = l / g->layers_per_group;
		if (g->launches_at_wait) {
			kvt_dev_counters c;
			kvt_dev_counters_get(m->dev, &c);
			g->launches_at_wait[grp] = c.kernel_launches;
		}
		int rc = kvt_dev_stream_wait_event(m->dev, NULL, g->events[grp]);
		if (rc) {
			KVT_LOGE("model: layer %u: waiting for layer group %u of gate %u: %s", l, grp, i, kvt_strerror(rc));
			return rc;
		}
	}
	return KVT_OK;
}

static int gates_check(uint32_t n_gates, const kvt_model_gate *gates)
{
	if (n_gates && !gates) {
		KVT_LOGE("model: %u layer gates, NULL array", n_gates);
		return KVT_EINVAL;
	}
	for (uint32_t i = 0; i < n_gates; i++) {
		const kvt_model_gate *g = &gates[i];
		if (!g->events || !g->n_groups || !g->layers_per_group) {
			KVT_LOGE("model: layer gate %u: %u groups of %u layers, events %s (need >= 1 group of >= 1 layer "
				 "and the events)", i, g->n_groups, g->layers_per_group, g->events ? "set" : "NULL");
			return KVT_EINVAL;
		}
		for (uint32_t j = 0; j < g->n_groups; j++) {
			if (!g->events[j]) {
				KVT_LOGE("model: layer gate %u: event of group %u is NULL", i, j);
				return KVT_EINVAL;
			}
		}
	}
	return KVT_OK;
}

int kvt_model_forward_gated(kvt_model *m, kvt_seq *s, const int32_t *tokens, uint32_t n, float *h_logits,
			    uint32_t n_logits, const kvt_model_gate *gate)
{
	int rc = gates_check(gate ? 1 : 0, gate);
	if (rc)
		return rc;
	m->gates = gate;
	m->n_gates = gate ? 1 : 0;
	rc = kvt_model_forward(m, s, tokens, n, h_logits, n_logits);
	m->gates = NULL;
	m->n_gates = 0; /* NOTE: also when the forward failed before its layers ran */
	return rc;
}

int kvt_model_forward_batch_gated(kvt_model *m, uint32_t n_seq, kvt_seq *const *seqs, const uint32_t *n,
				  const int32_t *tokens, const bool *want_logits, float *h_logits, uint32_t n_gates,
				  const kvt_model_gate *gates)
{
	int rc = gates_check(n_gates, gates);
	if (rc)
		return rc;
	m->gates = gates;
	m->n_gates = n_gates;
	rc = kvt_model_forward_batch(m, n_seq, seqs, n, tokens, want_logits, h_logits);
	m->gates = NULL;
	m->n_gates = 0;
	return rc;
}

/* ---- random-weight models made on the device (kvt_model_create_random) ---- */

/*
 * One seed buffer per fan-in on the device, SEED_BYTES each (a whole number
 * of units: 144-byte Q4_K blocks, or 128 fp16 values), filled on the host
 * from the seed; every tensor is then d2d copies of it, starting at a unit
 * that depends on the tensor's index, so making 16 GB of weights costs a few
 * milliseconds of copying instead of a GGUF file's write and read.
 */
#define SEED_UNITS 65536u

static uint64_t rnd_next(uint64_t *s)
{
	*s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
	return *s;
}

/* Unit bytes of a seed buffer for dtype: a Q4_K block, or 128 fp16 values. */
static size_t rnd_unit_bytes(int dtype) { return dtype == KVT_DTYPE_Q4_K ? 144 : 256; }

/* Host bytes of a seed buffer: fp16 uniform in +-s; Q4_K blocks whose values span about +-s. */
static void rnd_fill_host(int dtype, float s, uint64_t seed, uint8_t *h, size_t bytes)
{
	uint64_t r = seed * 0x9e3779b97f4a7c15ULL + 0x2545f4914f6cdd1dULL;
	if (dtype == KVT_DTYPE_F16) {
		uint16_t *v = (uint16_t *)h;
		for (size_t i = 0; i < bytes / 2; i++)
			v[i] = kvt_f32_to_f16(s * ((float)(rnd_next(&r) >> 40) / (float)(1 << 23) - 1.0f));
		return;
	}
	/* Q4_K: x = d * sc * q - dmin * mn, sc and mn any 6-bit values (every scales byte is valid),
	 * q in 0..15: d * 31.5 * 7.5 = dmin * 31.5 centres x on 0, d * 63 * 15 / 2 = s bounds it */
	const uint16_t d = kvt_f32_to_f16(2.0f * s / 945.0f), dmin = kvt_f32_to_f16(7.5f * 2.0f * s / 945.0f);
	for (size_t b = 0; b < bytes / 144; b++) {
		uint8_t *blk = h + b * 144;
		memcpy(blk, &d, 2);
		memcpy(blk + 2, &dmin, 2);
		for (int i = 4; i < 144; i += 8) { /* scales and codes: 140 bytes, the last 4 a half word */
			uint64_t x = rnd_next(&r);
			memcpy(blk + i, &x, i + 8 <= 144 ? 8 : 144 - i);
		}
	}
}

/* w = bytes of seed copies (a tensor of n_rows rows of n_in), the start unit picked by idx. */
static int rnd_tensor(kvt_model *m, const void *seed_buf, int dtype, uint64_t n_rows, uint64_t n_in, uint32_t idx,
		      wmat *w)
{
	const size_t unit = rnd_unit_bytes(dtype), seed_bytes = (size_t)SEED_UNITS * unit;
	const size_t bytes = kvt_dtype_row_bytes(dtype, n_in) * n_rows;
	int rc = kvt_dev_alloc(m->dev, bytes, &w->p);
	if (rc)
		return rc;
	w->dtype = dtype;
	m->weight_bytes += bytes;
	size_t off = (size_t)(idx * 2654435761u % SEED_UNITS) * unit;
	for (size_t done = 0; done < bytes;) {
		size_t c = bytes - done < seed_bytes - off ? bytes - done : seed_bytes - off;
		if ((rc = kvt_dev_copy_d2d(m->dev, (uint8_t *)w->p + done, (const uint8_t *)seed_buf + off, c)))
			return rc;
		done += c;
		off = 0;
	}
	return KVT_OK;
}

static int rnd_check(const kvt_model_hparams *hp, int w_dtype, const kvt_dev *d)
{
	const uint64_t qd = (uint64_t)hp->n_head * hp->head_dim;
	const char *bad = !hp->n_layer || hp->n_layer > MAX_LAYERS          ? "n_layer"
			  : !hp->n_embd || hp->n_embd > MAX_DIM             ? "n_embd"
			  : !hp->n_ff || hp->n_ff > 4 * MAX_DIM             ? "n_ff"
			  : !hp->n_head || !hp->n_head_kv || hp->n_head % hp->n_head_kv ? "n_head / n_head_kv"
			  : !hp->head_dim || hp->head_dim % 2 || hp->head_dim > 1024 || qd > 4 * MAX_DIM ? "head_dim"
			  : !hp->n_vocab || hp->n_vocab > MAX_VOCAB         ? "n_vocab"
			  : !hp->n_ctx_train                                ? "n_ctx_train"
			  : !(hp->rope_base > 0) || !isfinite(hp->rope_base) ? "rope_base"
			  : !(hp->rms_eps >= 0) || !isfinite(hp->rms_eps)   ? "rms_eps"
									    : NULL;
	if (bad) {
		KVT_LOGE("random model: bad %s (layers %u, embd %u, ff %u, heads %u/%u of %u, vocab %u, ctx %u)", bad,
			 hp->n_layer, hp->n_embd, hp->n_ff, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_vocab,
			 hp->n_ctx_train);
		return KVT_EINVAL;
	}
	if (w_dtype != KVT_DTYPE_F16 && w_dtype != KVT_DTYPE_Q4_K) {
		KVT_LOGE("random model: weight dtype %s (F16 or Q4_K)", kvt_dtype_name(w_dtype));
		return KVT_EINVAL;
	}
	if (!kvt_dev_supports_dtype(d, w_dtype)) {
		KVT_LOGE("random model: %s has no kernels for %s weights", kvt_dev_name(d), kvt_dtype_name(w_dtype));
		return KVT_EUNSUPPORTED;
	}
	const uint32_t be = kvt_dtype_block_elems(w_dtype);
	if (hp->n_embd % be || hp->n_ff % be || qd % be) {
		KVT_LOGE("random model: %s weights need n_embd %u, n_ff %u and n_head * head_dim %llu to be multiples of %u",
			 kvt_dtype_name(w_dtype), hp->n_embd, hp->n_ff, (unsigned long long)qd, be);
		return KVT_EINVAL;
	}
	return KVT_OK;
}

int kvt_model_create_random(kvt_dev *d, const kvt_model_hparams *hp_in, int w_dtype, uint64_t seed,
			    const kvt_model_config *cfg, kvt_model **out)
{
	int rc = rnd_check(hp_in, w_dtype, d);
	if (rc)
		return rc;
	kvt_model *m = calloc(1, sizeof(*m));
	uint8_t *h = NULL;
	float *ones = NULL;
	void *seed_buf[2] = { NULL, NULL };
	if (!m)
		return KVT_ENOMEM;
	m->dev = d;
	if (cfg)
		m->cfg = *cfg;
	else
		kvt_model_config_default(&m->cfg);
	kvt_model_hparams *hp = &m->hp;
	*hp = *hp_in;
	snprintf(hp->arch, sizeof hp->arch, "llama");
	hp->n_rot = hp->head_dim;
	hp->n_swa = hp->swa_pattern = 0;
	hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
	hp->rope_scaling = 0;
	hp->rope_scale_factor = 1.0f;
	m->arch = kvt_arch_find(hp->arch, strlen(hp->arch));
	if (m->cfg.max_ctx == 0 || m->cfg.max_ctx > hp->n_ctx_train)
		m->cfg.max_ctx = hp->n_ctx_train;
	if (m->cfg.max_batch == 0 || m->cfg.max_batch > m->cfg.max_ctx)
		m->cfg.max_batch = m->cfg.max_ctx < 512 ? m->cfg.max_ctx : 512;
	const uint64_t E = hp->n_embd, KV = (uint64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff, V = hp->n_vocab;
	const uint64_t Q = (uint64_t)hp->n_head * hp->head_dim;
	const size_t seed_bytes = (size_t)SEED_UNITS * rnd_unit_bytes(w_dtype);
	const uint64_t widest = E > F ? (E > Q ? E : Q) : (F > Q ? F : Q);
	m->layers = calloc(hp->n_layer, sizeof(*m->layers));
	h = malloc(seed_bytes);
	ones = malloc(widest * sizeof(float));
	if (!m->layers || !h || !ones) {
		rc = KVT_ENOMEM;
		goto fail;
	}
	for (uint64_t i = 0; i < widest; i++)
		ones[i] = 1.0f;
	for (int f = 0; f < 2; f++) { /* fan-in n_embd (and q_dim), then n_ff */
		rnd_fill_host(w_dtype, sqrtf(3.0f / (float)(f ? F : E)), seed + (uint64_t)f, h, seed_bytes);
		if ((rc = kvt_dev_alloc(d, seed_bytes, &seed_buf[f])) || (rc = kvt_dev_copy_h2d(d, seed_buf[f], h, seed_bytes)))
			goto fail;
	}
	uint32_t idx = (uint32_t)seed;
	if ((rc = rnd_tensor(m, seed_buf[0], w_dtype, V, E, idx++, &m->tok_embd)))
		goto fail;
	if (hp->tied_embeddings)
		m->output = m->tok_embd;
	else if ((rc = rnd_tensor(m, seed_buf[0], w_dtype, V, E, idx++, &m->output)))
		goto fail;
#define RND_NORM(ptr, n)                                                                                      \
	if ((rc = kvt_dev_alloc(d, (n) * sizeof(float), (void **)&(ptr))) ||                                 \
	    (rc = kvt_dev_copy_h2d(d, (ptr), ones, (n) * sizeof(float))))                                    \
		goto fail;                                                                                    \
	m->weight_bytes += (n) * sizeof(float);
	RND_NORM(m->output_norm, E)
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		layer_w *L = &m->layers[l];
		RND_NORM(L->attn_norm, E)
		RND_NORM(L->ffn_norm, E)
		if ((rc = rnd_tensor(m, seed_buf[0], w_dtype, Q, E, idx++, &L->wq)) ||
		    (rc = rnd_tensor(m, seed_buf[0], w_dtype, KV, E, idx++, &L->wk)) ||
		    (rc = rnd_tensor(m, seed_buf[0], w_dtype, KV, E, idx++, &L->wv)) ||
		    (rc = rnd_tensor(m, seed_buf[0], w_dtype, E, Q, idx++, &L->wo)) ||
		    (rc = rnd_tensor(m, seed_buf[0], w_dtype, F, E, idx++, &L->w_gate)) ||
		    (rc = rnd_tensor(m, seed_buf[0], w_dtype, F, E, idx++, &L->w_up)) ||
		    (rc = rnd_tensor(m, seed_buf[1], w_dtype, E, F, idx++, &L->w_down)))
			goto fail;
	}
#undef RND_NORM
	if ((rc = kvt_dev_sync(d)) || (rc = alloc_buffers(m)))
		goto fail;
	kvt_dev_free(d, seed_buf[0]);
	kvt_dev_free(d, seed_buf[1]);
	free(h);
	free(ones);
	*out = m;
	return KVT_OK;
fail:
	kvt_dev_free(d, seed_buf[0]);
	kvt_dev_free(d, seed_buf[1]);
	free(h);
	free(ones);
	kvt_model_destroy(m);
	return rc;
}
