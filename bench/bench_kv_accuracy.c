/*
 * bench/bench_kv_accuracy.c — what the T1 codecs do to real KV of the default
 * model over real English text, and the scale-granularity measurement.
 *
 *   bench_kv_accuracy [--model M] [--text F] [--prefix 512] [--cont 256] [--windows 4] [--threads N]
 *
 * For each window of the text (default bench/data/devils_dictionary.txt, public-domain prose:
 * bench/data/README.md;
 * windows are consecutive, prefix + cont tokens each, BOS first when the
 * model asks for it):
 *   1. the reference: the prefix is prefilled in fp16 KV, then the
 *      continuation is scored on top of it (logits at every position);
 *   2. each variant: the prefix's KV blocks go through a codec and back into
 *      fresh T0 slots, and the same continuation is scored on top of THAT
 *      prefix. This is the tiering case exactly: a cached prefix demoted to
 *      T1, promoted, and new tokens computed on it.
 * Variants: the device codecs through the mover the manager uses (f16; fp8
 * with one scale per token and KV head; int8 with one scale per token, KV
 * head and 32 dims; int8kv1 and int8kv, K per channel over the block and V per
 * token and 32 / 16 dims, dev.h), and, for the granularity measurement, the same FP8/INT8
 * arithmetic (gpu/kv_codec.h) applied on the CPU with other scales: one per
 * token and KV head (int8's format before group scales), one per block and
 * KV head (16 tokens x head_dim values), and one per tensor (a layer's K or V
 * over the whole prefix). The CPU simulation of each device row is checked
 * against the device path bit for bit.
 *
 * Reported per variant:
 *   - round-trip relative L2 error ||x' - x|| / ||x|| over all prefix KV, K and
 *     V separately, and cosine similarity per (token, head) vector (mean, min);
 *   - attention-output error vs fp32: per layer and KV head, queries = the
 *     model's own keys at the last 16 prefix positions (real vectors of that
 *     head), softmax(q.K^T / sqrt(d)) V over all prefix positions in fp32,
 *     with the reference KV and with the round-tripped KV; relative L2 of the
 *     outputs (all layers, heads and queries pooled);
 *   - perplexity of the continuation (teacher-forced) and its change vs the
 *     reference, and greedy-token agreement: the share of continuation
 *     positions whose argmax equals the reference's.
 * Targets (issue 3): FP8 rel-L2 <= 3% with cosine >= 0.99; INT8 <= 1%;
 * perplexity change <= +1% (FP8) and <= +0.5% (INT8).
 */
#include "gguf.h"
#include "kv_codec.h"
#include "model.h"
#include "tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVT_MAX_LAYERS_BENCH 128 /* layers with a per-layer error row */

enum { G_TOKEN_HEAD = 0, G_BLOCK_HEAD = 1, G_TENSOR = 2, G_GROUP32 = 3, G_KCH_V32 = 4, G_KCHA_V32 = 5, G_KCH_VTOK = 6,
       G_KV_SPLIT = 7, G_C8_V32 = 8, G_C8_V16 = 9 };
static const char *const gran_name[] = { "token x head", "block x head", "tensor", "token x head x 32",
					 "K channel x block (fp16 scale), V token x 32",
					 "K channel x block asymmetric (fp16 scale, min), V token x 32 (fp16)",
					 "K channel x block (fp16 scale), V token", "K channel x block (fp16), V token x 32",
					 "K channel x block asymmetric (fp16 min, E5M3 scale), V token x 32 (E5M3)",
					 "K channel x block asymmetric (fp16 min, E5M3 scale), V token x 16 (E5M3)" };

typedef struct variant {
	int codec;   /* enum kvt_kv_codec */
	int gran;    /* G_* */
	bool device; /* through the mover (device ops) rather than the CPU simulation */
	/* accumulated over windows */
	double se_k, ref_k, se_v, ref_v; /* squared error and squared reference, K and V */
	double cos_sum, cos_min;         /* per-vector cosine */
	uint64_t n_vec;                  /* vectors */
	double att_se, att_ref;          /* attention outputs */
	double nll;                      /* summed NLL of the continuation */
	uint64_t n_tok, n_agree;         /* scored positions, greedy agreements */
	uint64_t n_mismatch;             /* CPU simulation vs device bytes (device rows only) */
	double se_kl[KVT_MAX_LAYERS_BENCH], ref_kl[KVT_MAX_LAYERS_BENCH]; /* per layer: K squared error, reference */
	double se_vl[KVT_MAX_LAYERS_BENCH], ref_vl[KVT_MAX_LAYERS_BENCH]; /* per layer: V */
} variant;

static kvt_kv_layout shape;
static size_t n_el; /* fp16 values in a block */

/* Quantize n fp16 values in place with the scale of amax, the device's arithmetic. */
static void quant_run(int codec, uint16_t *x, size_t n, float amax)
{
	float s, inv;
	kvt_codec_scales(amax, codec == KVT_KV_CODEC_FP8 ? KVT_FP8_MAX : KVT_INT8_MAX, &s, &inv);
	for (size_t i = 0; i < n; i++) {
		float v = kvt_f16_to_f32(x[i]) * inv;
		float c = codec == KVT_KV_CODEC_FP8 ? kvt_fp8_e4m3_decode(kvt_fp8_e4m3_encode(v)) : (float)kvt_int8_encode(v);
		x[i] = kvt_f32_to_f16(c * s);
	}
}

static float amax_of(const uint16_t *x, size_t n)
{
	float a = 0;
	for (size_t i = 0; i < n; i++)
		a = fmaxf(a, fabsf(kvt_f16_to_f32(x[i])));
	return a;
}

/* The minimum and maximum of K channel d over a block's T tokens ([token][dim]). */
static void channel_range(const uint16_t *k, uint32_t T, uint32_t D, uint32_t d, float *mn, float *mx)
{
	*mn = INFINITY;
	*mx = -INFINITY;
	for (uint32_t t = 0; t < T; t++) {
		float x = kvt_f16_to_f32(k[(size_t)t * D + d]);
		*mn = fminf(*mn, x);
		*mx = fmaxf(*mx, x);
	}
}

/*
 * One block's K of one (layer, head) in place, [token][dim]: one INT8 scale per
 * channel over the block's tokens, stored as fp16 (so it is rounded first);
 * asym: uint8 codes with an fp16 scale and minimum per channel.
 */
static void quant_k_channels(uint16_t *k, uint32_t T, uint32_t D, bool asym)
{
	for (uint32_t d = 0; d < D; d++) {
		float mn, mx;
		channel_range(k, T, D, d, &mn, &mx);
		if (!asym) {
			float a = fmaxf(fabsf(mn), fabsf(mx)), sc = kvt_f16_to_f32(kvt_f32_to_f16(a / KVT_INT8_MAX));
			float inv = sc > 0 ? 1.0f / sc : 0.0f;
			for (uint32_t t = 0; t < T; t++) {
				uint16_t *x = &k[(size_t)t * D + d];
				*x = kvt_f32_to_f16((float)kvt_int8_encode(kvt_f16_to_f32(*x) * inv) * sc);
			}
			continue;
		}
		/* INT8KV's arithmetic (kv_codec.h), so the device row can be checked against it */
		float m16 = kvt_f16_to_f32(kvt_f32_to_f16(mn)), sc = kvt_f16_to_f32(kvt_f32_to_f16((mx - m16) / KVT_KVK_QMAX));
		float inv = kvt_int8kv_inv(sc);
		for (uint32_t t = 0; t < T; t++) {
			uint16_t *x = &k[(size_t)t * D + d];
			*x = kvt_f32_to_f16(kvt_int8kv_k_decode(kvt_int8kv_k_encode(kvt_f16_to_f32(*x), m16, inv), m16, sc));
		}
	}
}

/* Compact K: per channel, minimum as fp16 rounded down, scale as an E5M3 code rounded up. */
static void quant_k_compact(uint16_t *k, uint32_t T, uint32_t D)
{
	for (uint32_t d = 0; d < D; d++) {
		float mn, mx;
		channel_range(k, T, D, d, &mn, &mx);
		uint16_t mb = kvt_f32_to_f16(mn);
		float m16 = kvt_f16_to_f32(mb);
		if (m16 > mn) /* one fp16 step down (mn is itself an fp16 value, so this is rare) */
			m16 = kvt_f16_to_f32((uint16_t)(mb & 0x8000 ? mb + 1 : mb - 1));
		float sc = kvt_e5m3_decode(kvt_e5m3_encode_up((mx - m16) / KVT_KVK_QMAX)), inv = kvt_int8kv_inv(sc);
		for (uint32_t t = 0; t < T; t++) {
			uint16_t *x = &k[(size_t)t * D + d];
			*x = kvt_f32_to_f16(kvt_int8kv_k_decode(kvt_int8kv_k_encode(kvt_f16_to_f32(*x), m16, inv), m16, sc));
		}
	}
}

/* n values with one INT8 scale stored as an E5M3 code rounded up. */
static void quant_v_e5m3(uint16_t *x, size_t n)
{
	float s = kvt_e5m3_decode(kvt_e5m3_encode_up(amax_of(x, n) / KVT_INT8_MAX)), inv = kvt_int8kv_inv(s);
	for (size_t i = 0; i < n; i++)
		x[i] = kvt_f32_to_f16((float)kvt_int8_encode(kvt_f16_to_f32(x[i]) * inv) * s);
}

/* n values with one INT8 scale stored as fp16 (INT8KV's V). */
static void quant_v_f16(uint16_t *x, size_t n)
{
	float s = kvt_f16_to_f32(kvt_f32_to_f16(amax_of(x, n) / KVT_INT8_MAX)), inv = kvt_int8kv_inv(s);
	for (size_t i = 0; i < n; i++)
		x[i] = kvt_f32_to_f16((float)kvt_int8_encode(kvt_f16_to_f32(x[i]) * inv) * s);
}

/* KIVI-style: K per channel (per block), V per token (vrun = D) or per 32 dims. */
static void quant_blocks_kivi(int g, uint16_t *kv, uint32_t n_blocks)
{
	const uint32_t T = shape.block_tokens, D = shape.head_dim, H = shape.n_kv_heads;
	const size_t seg = (size_t)T * D;
	const size_t vrun = g == G_KCH_VTOK ? D : g == G_C8_V16 ? 16 : kvt_codec_group_dims(KVT_KV_CODEC_INT8, D);
	for (uint32_t b = 0; b < n_blocks; b++)
		for (uint32_t l = 0; l < shape.n_layers; l++)
			for (uint32_t h = 0; h < H; h++) {
				uint16_t *k = kv + b * n_el + (((size_t)l * 2 + 0) * H + h) * seg;
				uint16_t *v = kv + b * n_el + (((size_t)l * 2 + 1) * H + h) * seg;
				if (g == G_C8_V32 || g == G_C8_V16) {
					quant_k_compact(k, T, D);
					for (size_t off = 0; off < seg; off += vrun)
						quant_v_e5m3(v + off, vrun);
					continue;
				}
				quant_k_channels(k, T, D, g == G_KCHA_V32);
				for (size_t off = 0; off < seg; off += vrun)
					if (g == G_KCHA_V32) /* INT8KV: the V scale is fp16 */
						quant_v_f16(v + off, vrun);
					else
						quant_run(KVT_KV_CODEC_INT8, v + off, vrun, amax_of(v + off, vrun));
			}
}

/* CPU round trip of n_blocks blocks (in place) at granularity g. */
static void quant_blocks(int codec, int g, uint16_t *kv, uint32_t n_blocks)
{
	const uint32_t T = shape.block_tokens, D = shape.head_dim, H = shape.n_kv_heads;
	if (g == G_KCH_V32 || g == G_KCHA_V32 || g == G_KCH_VTOK || g == G_C8_V32 || g == G_C8_V16) {
		quant_blocks_kivi(g, kv, n_blocks);
		return;
	}
	if (g == G_TOKEN_HEAD || g == G_BLOCK_HEAD || g == G_GROUP32) {
		/* G_GROUP32: INT8's device groups (32 dims, or the whole head when D % 32 != 0) */
		size_t run = g == G_TOKEN_HEAD	 ? D
			     : g == G_GROUP32 ? kvt_codec_group_dims(KVT_KV_CODEC_INT8, D)
					      : (size_t)T * D;
		for (size_t off = 0; off < (size_t)n_blocks * n_el; off += run)
			quant_run(codec, kv + off, run, amax_of(kv + off, run));
		return;
	}
	/* per tensor: one scale for a layer's K (or V) over every block, head and token */
	const size_t lkv = (size_t)H * T * D; /* one (layer, K/V) of one block */
	for (uint32_t l = 0; l < shape.n_layers; l++)
		for (uint32_t k = 0; k < 2; k++) {
			float a = 0;
			for (uint32_t b = 0; b < n_blocks; b++)
				a = fmaxf(a, amax_of(kv + b * n_el + (l * 2 + k) * lkv, lkv));
			for (uint32_t b = 0; b < n_blocks; b++)
				quant_run(codec, kv + b * n_el + (l * 2 + k) * lkv, lkv, a);
		}
}

/* K or V vector (layer l, k 0/1, head h, position p) of a prefix stored block after block. */
static const uint16_t *vec_at(const uint16_t *kv, uint32_t l, uint32_t k, uint32_t h, uint32_t p)
{
	const uint32_t T = shape.block_tokens, D = shape.head_dim, H = shape.n_kv_heads;
	return kv + (size_t)(p / T) * n_el + ((((size_t)l * 2 + k) * H + h) * T + p % T) * D;
}

/* Error statistics of a round-tripped prefix q against the reference r (n_pos positions). */
static void kv_error(variant *v, const uint16_t *r, const uint16_t *q, uint32_t n_pos)
{
	const uint32_t D = shape.head_dim, H = shape.n_kv_heads;
	float *sc = malloc(n_pos * sizeof(float)), *oq = malloc(D * sizeof(float)), *or_ = malloc(D * sizeof(float));
	const uint32_t n_q = n_pos < 16 ? n_pos : 16;
	for (uint32_t l = 0; l < shape.n_layers; l++)
		for (uint32_t h = 0; h < H; h++) {
			for (uint32_t k = 0; k < 2; k++)
				for (uint32_t p = 0; p < n_pos; p++) {
					const uint16_t *a = vec_at(r, l, k, h, p), *b = vec_at(q, l, k, h, p);
					double se = 0, rr = 0, qq = 0, rq = 0;
					for (uint32_t d = 0; d < D; d++) {
						double x = kvt_f16_to_f32(a[d]), y = kvt_f16_to_f32(b[d]);
						se += (y - x) * (y - x);
						rr += x * x;
						qq += y * y;
						rq += x * y;
					}
					if (k == 0) {
						v->se_k += se;
						v->ref_k += rr;
					} else {
						v->se_v += se;
						v->ref_v += rr;
					}
					if (l < KVT_MAX_LAYERS_BENCH) {
						(k ? v->se_vl : v->se_kl)[l] += se;
						(k ? v->ref_vl : v->ref_kl)[l] += rr;
					}
					double c = rr > 0 && qq > 0 ? rq / sqrt(rr * qq) : (rr == qq ? 1.0 : 0.0);
					v->cos_sum += c;
					v->cos_min = fmin(v->cos_min, c);
					v->n_vec++;
				}
			/* attention outputs for queries = the last n_q keys (reference values) */
			for (uint32_t qi = 0; qi < n_q; qi++) {
				const uint16_t *qv = vec_at(r, l, 0, h, n_pos - 1 - qi);
				float qf[512];
				for (uint32_t d = 0; d < D; d++)
					qf[d] = kvt_f16_to_f32(qv[d]);
				for (int pass = 0; pass < 2; pass++) {
					const uint16_t *kv = pass ? q : r;
					float *o = pass ? oq : or_, mx = -INFINITY, sum = 0;
					for (uint32_t p = 0; p < n_pos; p++) {
						const uint16_t *kk = vec_at(kv, l, 0, h, p);
						float dot = 0;
						for (uint32_t d = 0; d < D; d++)
							dot += qf[d] * kvt_f16_to_f32(kk[d]);
						sc[p] = dot / sqrtf((float)D);
						mx = fmaxf(mx, sc[p]);
					}
					memset(o, 0, D * sizeof(float));
					for (uint32_t p = 0; p < n_pos; p++) {
						float w = expf(sc[p] - mx);
						const uint16_t *vv = vec_at(kv, l, 1, h, p);
						sum += w;
						for (uint32_t d = 0; d < D; d++)
							o[d] += w * kvt_f16_to_f32(vv[d]);
					}
					for (uint32_t d = 0; d < D; d++)
						o[d] /= sum;
				}
				for (uint32_t d = 0; d < D; d++) {
					v->att_se += (double)(oq[d] - or_[d]) * (oq[d] - or_[d]);
					v->att_ref += (double)or_[d] * or_[d];
				}
			}
		}
	free(sc);
	free(oq);
	free(or_);
}

/* Score tokens[0..n) on top of seq: NLL of tokens[1..n) and argmax per position. */
static int score(kvt_model *m, kvt_seq *s, const int32_t *tokens, uint32_t n, float *logits, uint32_t n_vocab,
		 double *nll, int32_t *amax)
{
	int rc = kvt_model_forward(m, s, tokens, n, logits, n);
	if (rc)
		return rc;
	for (uint32_t j = 0; j < n; j++) {
		const float *row = logits + (size_t)j * n_vocab;
		float mx = row[0];
		int32_t am = 0;
		for (uint32_t i = 1; i < n_vocab; i++)
			if (row[i] > mx) {
				mx = row[i];
				am = (int32_t)i;
			}
		amax[j] = am;
		if (j + 1 < n) {
			double se = 0;
			for (uint32_t i = 0; i < n_vocab; i++)
				se += exp((double)row[i] - mx);
			nll[j] = -((double)row[tokens[j + 1]] - mx - log(se));
		}
	}
	return KVT_OK;
}

int main(int argc, char **argv)
{
	const char *model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf", *text_path = "bench/data/devils_dictionary.txt";
	uint32_t n_prefix = 512, n_cont = 256, n_windows = 4;
	int threads = 0;
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];
		if (!strcmp(k, "--model")) model_path = v;
		else if (!strcmp(k, "--text")) text_path = v;
		else if (!strcmp(k, "--prefix")) n_prefix = (uint32_t)atoi(v);
		else if (!strcmp(k, "--cont")) n_cont = (uint32_t)atoi(v);
		else if (!strcmp(k, "--windows")) n_windows = (uint32_t)atoi(v);
		else if (!strcmp(k, "--threads")) threads = atoi(v);
		else {
			fprintf(stderr, "bench_kv_accuracy: unknown option %s\n", k);
			return 2;
		}
	}
	if (n_prefix < 16 || n_prefix % 16 || n_prefix > 16 * 4096 || n_cont < 2 || !n_windows) {
		fprintf(stderr, "usage: bench_kv_accuracy [--model M] [--text F] [--prefix N (multiple of 16)] "
				"[--cont N >= 2] [--windows N] [--threads N]\n");
		return 2;
	}
	FILE *f = fopen(text_path, "rb");
	if (!f) {
		perror(text_path);
		return 1;
	}
	fseek(f, 0, SEEK_END);
	long text_len = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *text = malloc((size_t)text_len + 1);
	if (fread(text, 1, (size_t)text_len, f) != (size_t)text_len) {
		perror(text_path);
		return 1;
	}
	fclose(f);

	kvt_dev *dev;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = threads };
	kvt_gguf *g;
	kvt_model *m;
	kvt_tok *tok;
	kvt_model_config mc;
	if (kvt_dev_create(&dc, &dev) || kvt_gguf_open(model_path, &g))
		return 1;
	kvt_model_config_default(&mc);
	mc.max_ctx = n_prefix + n_cont + 1;
	if (kvt_model_load(dev, g, &mc, &m) || kvt_tok_create_from_gguf(g, &tok))
		return 1;
	kvt_gguf_close(g);
	const uint32_t n_vocab = kvt_model_hparams_get(m)->n_vocab;

	size_t n_text_tok = 0, cap = (size_t)text_len + 16;
	int32_t *ids = malloc(cap * sizeof(int32_t));
	if (kvt_tok_encode(tok, text, (size_t)text_len, false, ids, cap, &n_text_tok))
		return 1;
	const bool bos = kvt_tok_add_bos(tok);
	const uint32_t per_window = n_prefix + n_cont - (bos ? 1 : 0);
	if (n_text_tok < (size_t)per_window * n_windows) {
		n_windows = (uint32_t)(n_text_tok / per_window);
		if (!n_windows) {
			fprintf(stderr, "bench_kv_accuracy: %s has only %zu tokens\n", text_path, n_text_tok);
			return 1;
		}
	}

	kvt_model_kv_shape(m, 16, &shape);
	const uint32_t n_pb = n_prefix / 16, n_all = (n_prefix + n_cont + 15) / 16;
	kvt_t0_pool *t0;
	if (kvt_t0_create(dev, &shape, 2 * n_all + n_pb + 4, &t0))
		return 1;
	const size_t bb = kvt_t0_block_bytes(t0);
	n_el = bb / 2;

	/* the device rows first: their granularity is the device format's (dev.h) */
	variant vars[] = {
		{ .codec = KVT_KV_CODEC_F16, .gran = G_TOKEN_HEAD, .device = true },
		{ .codec = KVT_KV_CODEC_FP8, .gran = G_TOKEN_HEAD, .device = true },
		{ .codec = KVT_KV_CODEC_INT8, .gran = G_GROUP32, .device = true },
		{ .codec = KVT_KV_CODEC_INT8KV1, .gran = G_KCHA_V32, .device = true },
		{ .codec = KVT_KV_CODEC_INT8KV, .gran = G_C8_V16, .device = true },
		{ .codec = KVT_KV_CODEC_FP8, .gran = G_BLOCK_HEAD, .device = false },
		{ .codec = KVT_KV_CODEC_FP8, .gran = G_TENSOR, .device = false },
		{ .codec = KVT_KV_CODEC_INT8, .gran = G_TOKEN_HEAD, .device = false },
		{ .codec = KVT_KV_CODEC_INT8, .gran = G_BLOCK_HEAD, .device = false },
		{ .codec = KVT_KV_CODEC_INT8, .gran = G_TENSOR, .device = false },
		{ .codec = KVT_KV_CODEC_INT8, .gran = G_KCH_V32, .device = false },
		{ .codec = KVT_KV_CODEC_INT8, .gran = G_KCHA_V32, .device = false },
		{ .codec = KVT_KV_CODEC_INT8, .gran = G_KCH_VTOK, .device = false },
		{ .codec = KVT_KV_CODEC_INT8, .gran = G_C8_V32, .device = false },
	};
	const int n_var = (int)(sizeof(vars) / sizeof(vars[0]));
	for (int i = 0; i < n_var; i++)
		vars[i].cos_min = 1.0;
	kvt_t1_mover *mv[KVT_KV_CODEC_COUNT];
	kvt_t1_pool *t1[KVT_KV_CODEC_COUNT];
	for (int c = 0; c < KVT_KV_CODEC_COUNT; c++)
		if (kvt_t1_create(dev, &shape, c, n_pb, &t1[c]) || kvt_t1_mover_create(dev, t0, c, n_pb, &mv[c]))
			return 1;

	float *logits = malloc((size_t)n_cont * n_vocab * sizeof(float));
	double *nll_ref = malloc(n_cont * sizeof(double)), *nll = malloc(n_cont * sizeof(double));
	int32_t *am_ref = malloc(n_cont * sizeof(int32_t)), *am = malloc(n_cont * sizeof(int32_t));
	uint16_t *kv_ref = malloc((size_t)n_pb * bb), *kv_q = malloc((size_t)n_pb * bb), *kv_sim = malloc((size_t)n_pb * bb);
	double nll_ref_sum = 0;
	uint64_t n_scored = 0;
	int32_t *win = malloc((n_prefix + n_cont) * sizeof(int32_t));
	double t_start = kvt_now_s();

	for (uint32_t w = 0; w < n_windows; w++) {
		uint32_t o = 0;
		if (bos)
			win[o++] = kvt_tok_bos(tok);
		memcpy(win + o, ids + (size_t)w * per_window, per_window * sizeof(int32_t));
		kvt_seq a, r;
		if (kvt_seq_init(&a, dev, t0, n_prefix + n_cont) || kvt_seq_init(&r, dev, t0, n_prefix + n_cont))
			return 1;
		if (kvt_model_forward(m, &a, win, n_prefix, NULL, 0))
			return 1;
		for (uint32_t b = 0; b < n_pb; b++)
			kvt_dev_copy_d2h(dev, kv_ref + (size_t)b * n_el, (char *)kvt_t0_layout(t0)->pool + (size_t)a.blocks[b] * bb, bb);
		/* the reference continuation */
		if (kvt_seq_share_prefix(&r, &a, n_pb) ||
		    score(m, &r, win + n_prefix, n_cont, logits, n_vocab, nll_ref, am_ref))
			return 1;
		kvt_seq_deinit(&r);
		for (uint32_t j = 0; j + 1 < n_cont; j++)
			nll_ref_sum += nll_ref[j];
		n_scored += n_cont - 1;

		for (int vi = 0; vi < n_var; vi++) {
			variant *v = &vars[vi];
			kvt_seq q;
			if (kvt_seq_init(&q, dev, t0, n_prefix + n_cont))
				return 1;
			for (uint32_t b = 0; b < n_pb; b++)
				if (kvt_t0_alloc(t0, &q.blocks[b]))
					return 1;
			q.n_blocks = n_pb;
			q.n_tokens = n_prefix;
			q.n_synced = 0;
			if (v->device) {
				/* demote to T1 and promote back, as the manager does */
				void *hp[4096];
				for (uint32_t b = 0; b < n_pb; b++)
					hp[b] = kvt_t1_slot_ptr(t1[v->codec], (int32_t)b);
				if (kvt_t1_mover_pack(mv[v->codec], n_pb, a.blocks, hp) ||
				    kvt_t1_mover_unpack(mv[v->codec], n_pb, (const void *const *)hp, q.blocks))
					return 1;
				for (uint32_t b = 0; b < n_pb; b++)
					kvt_dev_copy_d2h(dev, kv_q + (size_t)b * n_el, (char *)kvt_t0_layout(t0)->pool + (size_t)q.blocks[b] * bb, bb);
				if (v->codec != KVT_KV_CODEC_F16) {
					memcpy(kv_sim, kv_ref, (size_t)n_pb * bb);
					quant_blocks(v->codec, v->gran, kv_sim, n_pb);
					for (size_t i = 0; i < (size_t)n_pb * n_el; i++)
						v->n_mismatch += kv_sim[i] != kv_q[i];
				}
			} else {
				memcpy(kv_q, kv_ref, (size_t)n_pb * bb);
				quant_blocks(v->codec, v->gran, kv_q, n_pb);
				for (uint32_t b = 0; b < n_pb; b++)
					kvt_dev_copy_h2d(dev, (char *)kvt_t0_layout(t0)->pool + (size_t)q.blocks[b] * bb, kv_q + (size_t)b * n_el, bb);
			}
			kv_error(v, kv_ref, kv_q, n_prefix);
			if (score(m, &q, win + n_prefix, n_cont, logits, n_vocab, nll, am))
				return 1;
			for (uint32_t j = 0; j < n_cont; j++) {
				if (j + 1 < n_cont) {
					v->nll += nll[j];
					v->n_tok++;
				}
				v->n_agree += am[j] == am_ref[j];
			}
			kvt_seq_deinit(&q);
		}
		kvt_seq_deinit(&a);
		fprintf(stderr, "window %u/%u done (%.0f s)\n", w + 1, n_windows, kvt_now_s() - t_start);
	}

	const double ppl_ref = exp(nll_ref_sum / (double)n_scored);
	printf("bench_kv_accuracy: %s; %s; %u windows of %u prefix + %u continuation tokens of %s (%zu tokens in the text)\n",
	       model_path, kvt_dev_name(dev), n_windows, n_prefix, n_cont, text_path, n_text_tok);
	printf("KV: %u layers x %u kv heads x %u dims; reference perplexity %.4f over %llu tokens\n\n", shape.n_layers,
	       shape.n_kv_heads, shape.head_dim, ppl_ref, (unsigned long long)n_scored);
	printf("| codec | scales | rel L2 (all) | rel L2 K | rel L2 V | cosine mean | cosine min | attn-out rel err | "
	       "perplexity | change | greedy agreement | target |\n");
	printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (int vi = 0; vi < n_var; vi++) {
		variant *v = &vars[vi];
		double rel = sqrt((v->se_k + v->se_v) / (v->ref_k + v->ref_v));
		double ppl = exp(v->nll / (double)v->n_tok), chg = (ppl / ppl_ref - 1) * 100;
		double cos_mean = v->cos_sum / (double)v->n_vec;
		const char *target = "-";
		if (v->device && v->codec == KVT_KV_CODEC_FP8)
			target = rel <= 0.03 && cos_mean >= 0.99 && chg <= 1.0 ? "met" : "MISSED";
		else if (v->device && (v->codec == KVT_KV_CODEC_INT8 || v->codec == KVT_KV_CODEC_INT8KV1 ||
					    v->codec == KVT_KV_CODEC_INT8KV))
			target = rel <= 0.01 && chg <= 0.5 ? "met" : "MISSED";
		else if (v->codec == KVT_KV_CODEC_F16)
			target = rel == 0 && v->n_agree == (uint64_t)n_windows * n_cont ? "exact" : "NOT EXACT";
		printf("| %s | %s%s | %.3f%% | %.3f%% | %.3f%% | %.5f | %.4f | %.3f%% | %.4f | %+.3f%% | %.2f%% | %s |\n",
		       kvt_kv_codec_name(v->codec), v->codec == KVT_KV_CODEC_F16 ? "-" : gran_name[v->gran],
		       v->device ? " (device)" : "", rel * 100, sqrt(v->se_k / v->ref_k) * 100, sqrt(v->se_v / v->ref_v) * 100,
		       cos_mean, v->cos_min, sqrt(v->att_se / v->att_ref) * 100, ppl, chg,
		       100.0 * (double)v->n_agree / (double)((uint64_t)n_windows * n_cont), target);
	}
	for (int vi = 0; vi < n_var; vi++)
		if (vars[vi].device && vars[vi].codec != KVT_KV_CODEC_F16)
			printf("\nCPU simulation vs device, %s %s: %llu of %llu values differ",
			       kvt_kv_codec_name(vars[vi].codec), gran_name[vars[vi].gran], (unsigned long long)vars[vi].n_mismatch,
			       (unsigned long long)n_windows * n_pb * n_el);
	printf("\n\nPer layer, relative L2 of K / V (%%), the device rows:\n\n| layer |");
	for (int vi = 0; vi < n_var; vi++)
		if (vars[vi].device)
			printf(" %s K | %s V |", kvt_kv_codec_name(vars[vi].codec), kvt_kv_codec_name(vars[vi].codec));
	printf("\n|---|");
	for (int vi = 0; vi < n_var; vi++)
		if (vars[vi].device)
			printf("---|---|");
	for (uint32_t l = 0; l < shape.n_layers && l < KVT_MAX_LAYERS_BENCH; l++) {
		printf("\n| %u |", l);
		for (int vi = 0; vi < n_var; vi++)
			if (vars[vi].device)
				printf(" %.3f | %.3f |", 100 * sqrt(vars[vi].se_kl[l] / vars[vi].ref_kl[l]),
				       100 * sqrt(vars[vi].se_vl[l] / vars[vi].ref_vl[l]));
	}
	printf("\n(%.0f s)\n", kvt_now_s() - t_start);

	for (int c = 0; c < KVT_KV_CODEC_COUNT; c++) {
		kvt_t1_mover_destroy(mv[c]);
		kvt_t1_destroy(t1[c]);
	}
	free(win);
	free(logits);
	free(nll_ref);
	free(nll);
	free(am_ref);
	free(am);
	free(kv_ref);
	free(kv_q);
	free(kv_sim);
	free(ids);
	free(text);
	kvt_t0_destroy(t0);
	kvt_tok_destroy(tok);
	kvt_model_destroy(m);
	kvt_dev_destroy(dev);
	return 0;
}
