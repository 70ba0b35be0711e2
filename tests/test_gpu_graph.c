/* ctest-labels: parity gpu */
/*
 * tests/test_gpu_graph.c — decode steps as graphs (kvt_model_decode) and the
 * device counters, on the device tests/test_dev.h names: the CPU backend
 * (no graphs: the direct path and the token identities still run), or the
 * CUDA backend, on a GPU or on its CPU emulator (test_gpu_graph_emu), where
 * stream capture is recorded and replayed.
 *
 *   - attention and kv_store reading their position from device memory
 *     (d_pos0, the launch sized for a bound) give bit-identical results to
 *     the same ops given the position itself, for every decode kernel
 *     (the default chunked path, KVT_CUDA_DECODE 1, 2, 3) and KV codec;
 *   - greedy decoding of a synthetic model by kvt_model_decode, with graphs
 *     and without, gives the tokens of kvt_model_forward plus a host argmax,
 *     at batch 1 and at batch 4 (sequences of different lengths, crossing
 *     blocks); sampling on the device gives the same tokens graphed or not;
 *   - at batch 1 with graphs: at most one graph launch and one host wait per
 *     decoded token, no kernel launched outside the graph; the kernels a
 *     replay runs per layer are printed (the fusion work's yardstick);
 *   - a host wait while capturing fails the op and the capture;
 *   - the combine fused into the last CTA of each head (KVT_CUDA_COMBINE=fused,
 *     every decode kernel, kernel 2/3 also with staging, KVT_CUDA_STAGE=1):
 *     device-position attention bit-identical to the separate combine given
 *     the position, launch after launch (its counters reset themselves);
 *     graph decode gives the same tokens with one kernel less a layer.
 *   - batch 64 and 128 (every sequence its own length), and a padded bucket
 *     (40 sequences, then 37 of them: 3 padding rows in the bucket of 40):
 *     kvt_model_decode with graphs and without gives the tokens of
 *     kvt_model_forward_batch plus a host argmax; one graph launch and one
 *     host wait a step; the K/V of the 3 sequences left out stay bit for bit
 *     as they were, and the scratch block of the padding rows goes back to
 *     the pool;
 *   - kvt_model_create_random (fp16 and Q4_K): its weight bytes, bad shapes
 *     and dtypes refused, and 12 sequences (padded to the bucket of 16)
 *     decode as kvt_model_forward_batch does.
 */
#include "check.h"
#include "dev.h"
#include "gguf.h"
#include "model.h"
#include "synth_model.h"
#include "test_dev.h"
#include "tiers.h"

#include <unistd.h>

static check_rng rng = { 0x51ab1e5eedULL };

/* The CUDA backend with this decode kernel, combine (fused or separate) and staging (0, 1), forced. */
static kvt_dev *make_variant(const char *decode, const char *combine, const char *stage)
{
	setenv("KVT_CUDA_COMBINE", combine, 1);
	setenv("KVT_CUDA_STAGE", stage, 1);
	setenv("KVT_CUDA_STAGE_BLOCKS", "4", 1); /* several staged rounds a split */
	kvt_dev_config c = { .kind = test_dev_kind(), .n_threads = 2 };
	kvt_dev *d = NULL;
	setenv("KVT_CUDA_DECODE", decode, 1);
	int rc = kvt_dev_create(&c, &d);
	unsetenv("KVT_CUDA_DECODE");
	unsetenv("KVT_CUDA_COMBINE");
	unsetenv("KVT_CUDA_STAGE");
	unsetenv("KVT_CUDA_STAGE_BLOCKS");
	return rc ? NULL : d;
}

static kvt_dev *make_dev(const char *decode)
{
	kvt_dev_config c = { .kind = test_dev_kind(), .n_threads = 2 };
	kvt_dev *d = NULL;
	if (decode)
		setenv("KVT_CUDA_DECODE", decode, 1);
	int rc = kvt_dev_create(&c, &d);
	unsetenv("KVT_CUDA_DECODE");
	return rc ? NULL : d;
}

static void *up(kvt_dev *d, const void *h, size_t n)
{
	void *p = NULL;
	if (kvt_dev_alloc(d, n, &p) || kvt_dev_copy_h2d(d, p, h, n))
		abort();
	return p;
}

/*
 * Decode attention at position pos: given pos0 = pos, and given d_pos0 -> pos with pos0 = bound;
 * with sep (a device whose combine is its own kernel), also sep's given pos0 = pos, all bit-identical.
 */
static void test_dyn_pos(kvt_dev *d, int codec, kvt_dev *sep)
{
	enum { HD = 64, NKV = 2, NH = 8, BT = 16, SLOTS = 64, BOUND = SLOTS * BT - 1 };
	kvt_kv_layout l = { .n_layers = 2, .n_kv_heads = NKV, .head_dim = HD, .block_tokens = BT, .n_slots = SLOTS,
			    .codec = codec };
	const size_t pool_bytes = kvt_kv_block_bytes(&l) * SLOTS;
	uint8_t *zero = calloc(1, pool_bytes);
	l.pool = up(d, zero, pool_bytes);
	free(zero);
	int32_t table[SLOTS];
	for (int i = 0; i < SLOTS; i++)
		table[i] = (i * 37 + 5) % SLOTS; /* scattered */
	int32_t *d_table = up(d, table, sizeof table);
	/* K/V for every position, stored with the position given on the device */
	float *kv = malloc((size_t)BOUND * NKV * HD * sizeof(float) * 2);
	for (size_t i = 0; i < (size_t)BOUND * NKV * HD * 2; i++)
		kv[i] = check_rng_f32(&rng) * 2.0f;
	float *d_k = up(d, kv, (size_t)BOUND * NKV * HD * sizeof(float));
	float *d_v = up(d, kv + (size_t)BOUND * NKV * HD, (size_t)BOUND * NKV * HD * sizeof(float));
	int32_t *d_p = NULL;
	CHECK(kvt_dev_alloc(d, sizeof(int32_t), (void **)&d_p) == KVT_OK);
	for (uint32_t layer = 0; layer < 2; layer++) {
		kvt_kv_store_args st = { .kv = &l, .layer = layer, .block_table = d_table, .pos0 = 0, .n_rows = 400,
					 .k = d_k, .v = d_v };
		CHECK(kvt_dev_kv_store(d, &st) == KVT_OK);
		/* one more row at 400 through d_pos0 (pos0 says something else on purpose) */
		int32_t p = 400;
		CHECK(kvt_dev_copy_h2d(d, d_p, &p, sizeof p) == KVT_OK);
		st.pos0 = 7;
		st.d_pos0 = d_p;
		st.n_rows = 1;
		st.k = d_k + (size_t)400 * NKV * HD;
		st.v = d_v + (size_t)400 * NKV * HD;
		CHECK(kvt_dev_kv_store(d, &st) == KVT_OK);
	}
	float *q = malloc(NH * HD * sizeof(float));
	for (int i = 0; i < NH * HD; i++)
		q[i] = check_rng_f32(&rng);
	float *d_q = up(d, q, NH * HD * sizeof(float)), *d_o1 = NULL, *d_o2 = NULL, *d_o3 = NULL;
	CHECK(kvt_dev_alloc(d, NH * HD * sizeof(float), (void **)&d_o1) == KVT_OK);
	CHECK(kvt_dev_alloc(d, NH * HD * sizeof(float), (void **)&d_o2) == KVT_OK);
	CHECK(kvt_dev_alloc(d, NH * HD * sizeof(float), (void **)&d_o3) == KVT_OK);
	kvt_attention_args at = { .kv = &l, .layer = 1, .block_table = d_table, .pos0 = BOUND, .n_rows = 1,
				  .n_heads = NH, .scale = 0.125f, .q = d_q };
	void *ws = NULL, *ws3 = NULL;
	size_t wsb = kvt_dev_attention_workspace_bytes(d, &at);
	if (wsb)
		CHECK(kvt_dev_alloc(d, wsb, &ws) == KVT_OK);
	if (sep && (wsb = kvt_dev_attention_workspace_bytes(sep, &at)) > 0)
		CHECK(kvt_dev_alloc(sep, wsb, &ws3) == KVT_OK);
	static const int32_t positions[] = { 0, 1, 15, 16, 63, 64, 65, 200, 400 };
	int same = 0;
	for (size_t i = 0; i < sizeof positions / sizeof *positions; i++) {
		const int32_t p = positions[i];
		float o1[NH * HD], o2[NH * HD];
		at.pos0 = (uint32_t)p;
		at.d_pos0 = NULL;
		at.out = d_o1;
		CHECK(kvt_dev_attention(d, &at, ws) == KVT_OK);
		CHECK(kvt_dev_copy_h2d(d, d_p, &p, sizeof p) == KVT_OK);
		at.pos0 = BOUND;
		at.d_pos0 = d_p;
		at.out = d_o2;
		CHECK(kvt_dev_attention(d, &at, ws) == KVT_OK);
		CHECK(kvt_dev_sync(d) == KVT_OK);
		CHECK(kvt_dev_copy_d2h(d, o1, d_o1, sizeof o1) == KVT_OK);
		CHECK(kvt_dev_copy_d2h(d, o2, d_o2, sizeof o2) == KVT_OK);
		bool eq = memcmp(o1, o2, sizeof o1) == 0;
		CHECKF(eq, "%s codec %s: attention at %d differs with the position on the device", kvt_dev_name(d),
		       kvt_kv_codec_name(codec), p);
		if (sep) { /* the separate combine, given the position */
			float o3[NH * HD];
			at.pos0 = (uint32_t)p;
			at.d_pos0 = NULL;
			at.out = d_o3;
			CHECK(kvt_dev_attention(sep, &at, ws3) == KVT_OK);
			CHECK(kvt_dev_sync(sep) == KVT_OK);
			CHECK(kvt_dev_copy_d2h(sep, o3, d_o3, sizeof o3) == KVT_OK);
			const bool eq3 = memcmp(o1, o3, sizeof o1) == 0;
			CHECKF(eq3, "codec %s: fused combine at %d differs from the separate one", kvt_kv_codec_name(codec), p);
			eq = eq && eq3;
		}
		same += eq;
	}
	printf("%s, %s pool: device-position attention bit-identical at %d of %zu positions%s\n", kvt_dev_name(d),
	       kvt_kv_codec_name(codec), same, sizeof positions / sizeof *positions,
	       sep ? " (and to the separate combine given the position)" : "");
	kvt_dev_free(d, ws);
	if (sep)
		kvt_dev_free(sep, ws3);
	kvt_dev_free(d, d_o3);
	kvt_dev_free(d, d_q);
	kvt_dev_free(d, d_o1);
	kvt_dev_free(d, d_o2);
	kvt_dev_free(d, d_p);
	kvt_dev_free(d, d_k);
	kvt_dev_free(d, d_v);
	kvt_dev_free(d, d_table);
	kvt_dev_free(d, l.pool);
	free(kv);
	free(q);
}

static double nmse(const float *got, const float *want, size_t n)
{
	double e = 0, w = 0;
	for (size_t i = 0; i < n; i++) {
		double dd = (double)got[i] - want[i];
		e += dd * dd;
		w += (double)want[i] * want[i];
	}
	return w > 0 ? e / w : e;
}

static float *down_f(kvt_dev *d, const void *p, size_t n)
{
	float *h = malloc(n * sizeof(float));
	if (kvt_dev_sync(d) || kvt_dev_copy_d2h(d, h, p, n * sizeof(float)))
		abort();
	return h;
}

static void *ws_of(kvt_dev *d, size_t n)
{
	void *p = NULL;
	if (n && kvt_dev_alloc(d, n, &p))
		abort();
	return p;
}

/* Bitwise on the backend that runs the composition itself or on the emulator; to 1e-12 on a GPU. */
static bool same_dev_ok(kvt_dev *d, const float *a, const float *b, size_t n)
{
	if (kvt_dev_kind(d) == KVT_DEV_CPU || strstr(kvt_dev_name(d), "cuemu"))
		return memcmp(a, b, n * sizeof(float)) == 0;
	return nmse(a, b, n) <= 1e-12;
}

/*
 * The fused ops against the plain ops they are defined as: on the same
 * device (bit-identical), and against the CPU reference backend.
 */
static void test_fused(kvt_dev *d, kvt_dev *ref)
{
	static const uint32_t shapes[][3] = { { 1, 256, 96 }, { 3, 256, 40 }, { 8, 104, 64 }, { 17, 256, 72 } };
	int n_cases = 0;
	for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
		for (int dt = KVT_DTYPE_F32; dt <= KVT_DTYPE_F16; dt++) {
			const uint32_t M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
			float *x = malloc((size_t)M * K * 4), *nw = malloc(K * 4), *wf = malloc((size_t)N * K * 4 * 2);
			for (size_t i = 0; i < (size_t)M * K; i++)
				x[i] = check_rng_f32(&rng) * 3.0f;
			for (uint32_t i = 0; i < K; i++)
				nw[i] = 1.0f + 0.2f * check_rng_f32(&rng);
			for (size_t i = 0; i < (size_t)N * K * 2; i++)
				wf[i] = check_rng_f32(&rng) * 0.1f;
			size_t wb = kvt_dtype_row_bytes(dt, K) * N;
			void *wh = malloc(wb * 2);
			for (size_t i = 0; i < (size_t)N * K * 2; i++) {
				if (dt == KVT_DTYPE_F16)
					((uint16_t *)wh)[i] = kvt_f32_to_f16(wf[i]);
				else
					((float *)wh)[i] = wf[i];
			}
			kvt_dev *devs[2] = { d, ref };
			float *out[2][4]; /* [dev][fused nm, plain nm, fused swiglu(norm), plain swiglu(norm)] */
			for (int di = 0; di < 2; di++) {
				kvt_dev *e = devs[di];
				float *dx = up(e, x, (size_t)M * K * 4), *dn = up(e, nw, K * 4);
				char *dw = up(e, wh, wb * 2);
				float *y = ws_of(e, (size_t)M * N * 4), *h = ws_of(e, (size_t)M * K * 4),
				      *u = ws_of(e, (size_t)M * N * 4);
				kvt_norm_matmul_args na = { .mm = { .n_rows = M, .n_in = K, .n_out = N, .w_dtype = dt, .w = dw,
								    .x = dx, .y = y },
							    .norm_w = dn, .eps = 1e-5f };
				kvt_matmul_swiglu_args sa = { .n_rows = M, .n_in = K, .n_out = N, .w_dtype = dt, .w_gate = dw,
							      .w_up = dw + wb, .x = dx, .y = y, .norm_w = dn, .eps = 1e-5f };
				size_t wsn = kvt_dev_norm_matmul_workspace_bytes(e, &na),
				       wss = kvt_dev_matmul_swiglu_workspace_bytes(e, &sa);
				void *ws = ws_of(e, wsn > wss ? wsn : wss);
				CHECK(kvt_dev_norm_matmul(e, &na, ws) == KVT_OK);
				out[di][0] = down_f(e, y, (size_t)M * N);
				kvt_rmsnorm_args rn = { .n_rows = M, .n_dim = K, .eps = 1e-5f, .w = dn, .x = dx, .y = h };
				kvt_matmul_args mm = na.mm;
				mm.x = h;
				CHECK(kvt_dev_rmsnorm(e, &rn) == KVT_OK && kvt_dev_matmul(e, &mm, ws) == KVT_OK);
				out[di][1] = down_f(e, y, (size_t)M * N);
				CHECK(kvt_dev_matmul_swiglu(e, &sa, ws) == KVT_OK);
				out[di][2] = down_f(e, y, (size_t)M * N);
				mm.w = dw + wb;
				mm.y = u;
				CHECK(kvt_dev_matmul(e, &mm, ws) == KVT_OK);
				mm.w = dw;
				mm.y = y;
				kvt_swiglu_args sw = { .n = (uint64_t)M * N, .gate = y, .up = u, .y = y };
				CHECK(kvt_dev_matmul(e, &mm, ws) == KVT_OK && kvt_dev_swiglu(e, &sw) == KVT_OK);
				out[di][3] = down_f(e, y, (size_t)M * N);
				void *bufs[] = { dx, dn, dw, y, h, u, ws };
				for (size_t b = 0; b < sizeof bufs / sizeof *bufs; b++)
					kvt_dev_free(e, bufs[b]);
			}
			const double tol = dt == KVT_DTYPE_F16 && M > 8 ? 1e-5 : 1e-10;
			CHECKF(same_dev_ok(d, out[0][0], out[0][1], (size_t)M * N), "norm_matmul %ux%ux%u %s: fused != plain",
			       M, K, N, kvt_dtype_name(dt));
			CHECKF(same_dev_ok(d, out[0][2], out[0][3], (size_t)M * N),
			       "matmul_swiglu %ux%ux%u %s: fused != plain", M, K, N, kvt_dtype_name(dt));
			double e0 = nmse(out[0][0], out[1][1], (size_t)M * N), e2 = nmse(out[0][2], out[1][3], (size_t)M * N);
			CHECKF(e0 <= tol && e2 <= tol, "%ux%ux%u %s: NMSE vs the CPU reference %.3g / %.3g (tolerance %g)", M, K,
			       N, kvt_dtype_name(dt), e0, e2, tol);
			CHECK(memcmp(out[1][0], out[1][1], (size_t)M * N * 4) == 0); /* the reference composes */
			for (int di = 0; di < 2; di++)
				for (int k = 0; k < 4; k++)
					free(out[di][k]);
			free(x);
			free(nw);
			free(wf);
			free(wh);
			n_cases++;
		}
	/* rope_store, fp16 and INT8 pools */
	for (int codec = KVT_KV_CODEC_F16; codec <= KVT_KV_CODEC_INT8; codec += 2) {
		enum { R = 5, NKV = 2, NH = 6, HD = 64, BT = 4, SL = 8 };
		kvt_kv_layout l = { .n_layers = 2, .n_kv_heads = NKV, .head_dim = HD, .block_tokens = BT, .n_slots = SL,
				    .codec = codec };
		const size_t pb = kvt_kv_block_bytes(&l) * SL;
		float *q = malloc(R * NH * HD * 4), *k = malloc(R * NKV * HD * 4), *v = malloc(R * NKV * HD * 4);
		for (int i = 0; i < R * NH * HD; i++)
			q[i] = check_rng_f32(&rng);
		for (int i = 0; i < R * NKV * HD; i++) {
			k[i] = check_rng_f32(&rng);
			v[i] = check_rng_f32(&rng);
		}
		const int32_t table[SL] = { 5, 2, 7, 0, 1, 3, 4, 6 }, pos[R] = { 6, 7, 8, 9, 10 };
		uint8_t *pools[2];
		float *qs[2], *ks[2];
		for (int fused = 0; fused < 2; fused++) {
			uint8_t *zero = calloc(1, pb);
			l.pool = up(d, zero, pb);
			float *dq = up(d, q, R * NH * HD * 4), *dk = up(d, k, R * NKV * HD * 4), *dv = up(d, v, R * NKV * HD * 4);
			int32_t *dt = up(d, table, sizeof table), *dp = up(d, pos, sizeof pos);
			kvt_rope_store_args a = { .st = { .kv = &l, .layer = 1, .block_table = dt, .pos0 = 6, .n_rows = R, .k = dk,
							  .v = dv },
						  .n_heads = NH, .n_rot = 48, .freq_base = 10000.0f, .pos = dp, .q = dq, .k = dk };
			if (fused) {
				CHECK(kvt_dev_rope_store(d, &a) == KVT_OK);
			} else {
				kvt_rope_args r = { .n_rows = R, .n_heads = NH, .head_dim = HD, .n_rot = 48, .freq_base = 10000.0f,
						    .pos = dp, .x = dq };
				CHECK(kvt_dev_rope(d, &r) == KVT_OK);
				r.n_heads = NKV;
				r.x = dk;
				CHECK(kvt_dev_rope(d, &r) == KVT_OK && kvt_dev_kv_store(d, &a.st) == KVT_OK);
			}
			pools[fused] = malloc(pb);
			CHECK(kvt_dev_sync(d) == KVT_OK && kvt_dev_copy_d2h(d, pools[fused], l.pool, pb) == KVT_OK);
			qs[fused] = down_f(d, dq, R * NH * HD);
			ks[fused] = down_f(d, dk, R * NKV * HD);
			void *bufs[] = { l.pool, dq, dk, dv, dt, dp };
			for (size_t b = 0; b < sizeof bufs / sizeof *bufs; b++)
				kvt_dev_free(d, bufs[b]);
			free(zero);
		}
		CHECKF(memcmp(pools[0], pools[1], pb) == 0, "rope_store %s pool: fused store differs",
		       kvt_kv_codec_name(codec));
		CHECK(same_dev_ok(d, qs[0], qs[1], R * NH * HD) && same_dev_ok(d, ks[0], ks[1], R * NKV * HD));
		for (int f = 0; f < 2; f++) {
			free(pools[f]);
			free(qs[f]);
			free(ks[f]);
		}
		free(q);
		free(k);
		free(v);
		n_cases++;
	}
	printf("%s: fused ops (norm_matmul, matmul_swiglu, rope_store) against the plain ops, %d cases\n",
	       kvt_dev_name(d), n_cases);
}

static int32_t host_argmax(const float *x, uint32_t n)
{
	uint32_t b = 0;
	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return (int32_t)b;
}

typedef struct rig {
	kvt_model *m;
	kvt_t0_pool *pool;
	uint32_t n_vocab;
} rig;

/* rig_open with path NULL: kvt_model_create_random of this shape and dtype (seed 7) */
static kvt_model_hparams rig_random_hp;
static int rig_random_dtype;

static void rig_open(rig *r, kvt_dev *d, const char *path, bool no_graphs)
{
	kvt_gguf *g = NULL;
	kvt_model_config mc;
	kvt_kv_layout shape;
	kvt_model_config_default(&mc);
	mc.max_ctx = 512;
	mc.max_batch = KVT_DECODE_MAX_SEQ;
	mc.no_graphs = no_graphs;
	if (!path) { /* the random model rig_random names */
		CHECK(kvt_model_create_random(d, &rig_random_hp, rig_random_dtype, 7, &mc, &r->m) == KVT_OK);
	} else {
		CHECK(kvt_gguf_open(path, &g) == KVT_OK);
		CHECK(kvt_model_load(d, g, &mc, &r->m) == KVT_OK);
		kvt_gguf_close(g);
	}
	kvt_model_kv_shape(r->m, 16, &shape);
	CHECK(kvt_t0_create(d, &shape, 512, &r->pool) == KVT_OK); /* 16 KiB blocks: room for 128 sequences */
	r->n_vocab = kvt_model_hparams_get(r->m)->n_vocab;
}

static void rig_close(rig *r)
{
	kvt_t0_destroy(r->pool);
	kvt_model_destroy(r->m);
}

static void prompt_of(int32_t *p, uint32_t n, uint32_t salt)
{
	for (uint32_t i = 0; i < n; i++)
		p[i] = (int32_t)(3 + (i * 7 + salt * 13) % 250);
}

/* The reference: prefill, then kvt_model_forward one token at a time and a host argmax. */
static void ref_greedy(kvt_dev *d, const char *path, uint32_t n_prompt, uint32_t salt, uint32_t n_gen, int32_t *out)
{
	rig r;
	rig_open(&r, d, path, true);
	kvt_seq s;
	CHECK(kvt_seq_init(&s, d, r.pool, 512) == KVT_OK);
	int32_t prompt[64];
	prompt_of(prompt, n_prompt, salt);
	float *logits = malloc(r.n_vocab * sizeof(float));
	CHECK(kvt_model_forward(r.m, &s, prompt, n_prompt, logits, 1) == KVT_OK);
	for (uint32_t i = 0; i < n_gen; i++) {
		out[i] = host_argmax(logits, r.n_vocab);
		if (i + 1 < n_gen)
			CHECK(kvt_model_forward(r.m, &s, &out[i], 1, logits, 1) == KVT_OK);
	}
	free(logits);
	kvt_seq_deinit(&s);
	rig_close(&r);
}

/*
 * n_seq sequences (prompt lengths lens[]), first token from the prefill's
 * logits, then n_gen - 1 steps of kvt_model_decode over all of them; out is
 * [n_seq][n_gen]. Counters cover the decode steps only.
 */
static void dec_run(kvt_dev *d, const char *path, bool no_graphs, uint32_t n_seq, const uint32_t *lens,
		    uint32_t n_gen, const kvt_decode_sampling *smp, int32_t *out, kvt_dev_counters *ctr)
{
	rig r;
	rig_open(&r, d, path, no_graphs);
	kvt_seq s[8];
	kvt_seq *sp[8];
	float *logits = malloc(r.n_vocab * sizeof(float));
	int32_t tok[8], next[8];
	for (uint32_t i = 0; i < n_seq; i++) {
		int32_t prompt[64];
		prompt_of(prompt, lens[i], i);
		CHECK(kvt_seq_init(&s[i], d, r.pool, 512) == KVT_OK);
		sp[i] = &s[i];
		CHECK(kvt_model_forward(r.m, &s[i], prompt, lens[i], logits, 1) == KVT_OK);
		tok[i] = out[(size_t)i * n_gen] = host_argmax(logits, r.n_vocab);
	}
	kvt_dev_counters_reset(d);
	for (uint32_t t = 1; t < n_gen; t++) {
		float u[8];
		for (uint32_t i = 0; i < n_seq; i++)
			u[i] = (float)((t * 7919 + i * 104729) % 1000) / 1000.0f;
		int rc = kvt_model_decode(r.m, n_seq, sp, tok, smp, u, next);
		CHECKF(rc == KVT_OK, "decode step %u: %d", t, rc);
		if (rc)
			break;
		for (uint32_t i = 0; i < n_seq; i++)
			tok[i] = out[(size_t)i * n_gen + t] = next[i];
	}
	kvt_dev_counters_get(d, ctr);
	for (uint32_t i = 0; i < n_seq; i++) {
		CHECK(s[i].n_tokens == lens[i] + n_gen - 1);
		kvt_seq_deinit(&s[i]);
	}
	free(logits);
	rig_close(&r);
}

static void test_decode(kvt_dev *d, const char *path, uint32_t n_layer)
{
	enum { N = 24 };
	const bool graphs = kvt_dev_graphs_supported(d);
	kvt_dev_counters cg, cn;

	/* batch 1, greedy */
	const uint32_t len1 = 13;
	int32_t ref[N], got_g[N], got_n[N];
	ref_greedy(d, path, len1, 0, N, ref);
	dec_run(d, path, false, 1, &len1, N, NULL, got_g, &cg);
	dec_run(d, path, true, 1, &len1, N, NULL, got_n, &cn);
	CHECKF(memcmp(ref, got_g, sizeof ref) == 0, "batch 1: decode (graphs %s) differs from forward",
	       graphs ? "on" : "unsupported");
	CHECKF(memcmp(ref, got_n, sizeof ref) == 0, "batch 1: decode without graphs differs from forward");
	const uint64_t steps = N - 1;
	printf("%s batch 1, %llu steps: graphs: %llu graph launches, %llu host syncs, %llu kernels outside, "
	       "%llu in graphs (%.1f a step, %.1f a layer besides the 3 of embed, norm + logits, pick), %llu copies; "
	       "direct: %llu kernels (%.1f a step), %llu host syncs\n",
	       kvt_dev_name(d), (unsigned long long)steps, (unsigned long long)cg.graph_launches,
	       (unsigned long long)cg.host_syncs, (unsigned long long)cg.kernel_launches,
	       (unsigned long long)cg.graph_kernels, (double)cg.graph_kernels / steps,
	       cg.graph_kernels ? ((double)cg.graph_kernels / steps - 3) / n_layer : 0.0, (unsigned long long)cg.copies,
	       (unsigned long long)cn.kernel_launches, (double)cn.kernel_launches / steps,
	       (unsigned long long)cn.host_syncs);
	if (graphs) {
		CHECKF(cg.graph_launches <= steps, "%llu graph launches for %llu tokens",
		       (unsigned long long)cg.graph_launches, (unsigned long long)steps);
		CHECKF(cg.graph_launches >= 1, "graphs supported but none launched");
		CHECKF(cg.host_syncs <= steps, "%llu host syncs for %llu tokens", (unsigned long long)cg.host_syncs,
		       (unsigned long long)steps);
		CHECK_EQ_INT(cg.kernel_launches, 0);
		/* a layer is 9 launches: 3 GEMVs with the norm fused, RoPE + store, attention and its combine,
		 * the output GEMV, gate + up + SwiGLU, down; plus embed, norm + logits, argmax a step */
		CHECKF(cg.graph_kernels <= steps * (3 + 9 * n_layer), "%.1f kernels a step",
		       (double)cg.graph_kernels / steps);
		CHECK(cg.graph_kernels == cn.kernel_launches); /* the same ops, replayed */
		CHECK(cn.host_syncs <= steps);
		CHECK(cn.graph_launches == 0);
	} else {
		printf("  (%s has no graphs: the direct path only; its counters are zero)\n", kvt_dev_name(d));
	}

	/* batch 4: different lengths, blocks crossed during the steps */
	enum { B = 4 };
	const uint32_t lens[B] = { 13, 20, 31, 5 };
	int32_t ref4[B][N], got4[B][N], gotn4[B][N];
	for (int i = 0; i < B; i++)
		ref_greedy(d, path, lens[i], (uint32_t)i, N, ref4[i]);
	dec_run(d, path, false, B, lens, N, NULL, &got4[0][0], &cg);
	dec_run(d, path, true, B, lens, N, NULL, &gotn4[0][0], &cn);
	for (int i = 0; i < B; i++) {
		CHECKF(memcmp(ref4[i], got4[i], sizeof ref4[i]) == 0, "batch 4, sequence %d: decode differs", i);
		CHECKF(memcmp(ref4[i], gotn4[i], sizeof ref4[i]) == 0, "batch 4, sequence %d: direct decode differs",
		       i);
	}
	if (graphs) {
		CHECK(cg.graph_launches <= steps);
		CHECK(cg.host_syncs <= steps);
	}

	/* sampling on the device: graphed and direct pick alike */
	const kvt_decode_sampling smp = { .temperature = 0.8f, .top_k = 20, .top_p = 0.9f };
	dec_run(d, path, false, B, lens, N, &smp, &got4[0][0], &cg);
	dec_run(d, path, true, B, lens, N, &smp, &gotn4[0][0], &cn);
	CHECK(memcmp(got4, gotn4, sizeof got4) == 0);
	int differ = 0; /* and sampling is not greedy in disguise */
	for (int i = 0; i < B; i++)
		differ += memcmp(got4[i], ref4[i], sizeof got4[i]) != 0;
	CHECKF(differ > 0, "sampled tokens all equal the greedy ones");
}

/*
 * Batches past 32 rows. n_seq sequences (prompt lengths 3..24) decode
 * n_gen - 1 steps: the first n_hi steps all of them, then the first n_lo
 * (the rest idle). mode 0: the reference, kvt_model_forward_batch of one
 * token each and a host argmax; 1: kvt_model_decode with graphs; 2: without.
 * out is [n_seq][n_gen], -1 where a sequence sat a step out; ctr sums the
 * counters of the steps after the first (each a replay: 37 sequences pad up
 * to the bucket of 40), n_replays counts them. Returns whether
 * the idle sequences' K/V bytes stayed as they were and every block went back
 * to the pool at the end.
 */
enum { BIG_MAX = KVT_DECODE_MAX_SEQ, BIG_GEN = 5 };
static bool big_run(kvt_dev *d, const char *path, int mode, uint32_t n_seq, uint32_t n_hi, uint32_t n_lo,
		    uint32_t n_gen, int32_t *out, kvt_dev_counters *ctr, uint32_t *n_replays)
{
	rig r;
	rig_open(&r, d, path, mode == 2);
	static kvt_seq s[BIG_MAX];
	kvt_seq *sp[BIG_MAX];
	static int32_t tok[BIG_MAX], next[BIG_MAX];
	static uint32_t ones[BIG_MAX];
	static bool want[BIG_MAX];
	float *logits = malloc((size_t)BIG_MAX * r.n_vocab * sizeof(float));
	/* prefill in batches of up to BIG_MAX rows (a forward per sequence costs the emulator 8x the launches) */
	static int32_t prompts[BIG_MAX * 24];
	static uint32_t lens[BIG_MAX];
	for (uint32_t i0 = 0, i1; i0 < n_seq; i0 = i1) {
		uint32_t rows = 0;
		for (i1 = i0; i1 < n_seq; i1++) {
			const uint32_t len = 3 + (i1 * 7) % 22; /* 3..24: some cross a block during the steps */
			if (rows + len > BIG_MAX)
				break;
			prompt_of(prompts + rows, len, i1);
			CHECK(kvt_seq_init(&s[i1], d, r.pool, 512) == KVT_OK);
			sp[i1] = &s[i1];
			ones[i1] = 1;
			want[i1] = true;
			lens[i1] = len;
			rows += len;
		}
		CHECK(kvt_model_forward_batch(r.m, i1 - i0, sp + i0, lens + i0, prompts, want + i0, logits) == KVT_OK);
		for (uint32_t i = i0; i < i1; i++) {
			tok[i] = out[(size_t)i * n_gen] = host_argmax(logits + (size_t)(i - i0) * r.n_vocab, r.n_vocab);
			for (uint32_t t = 1; t < n_gen; t++)
				out[(size_t)i * n_gen + t] = -1;
		}
	}
	const kvt_kv_layout *kv = kvt_t0_layout(r.pool);
	const size_t bb = kvt_t0_block_bytes(r.pool);
	uint8_t *before = NULL;
	size_t n_idle_bytes = 0;
	bool kept = true;
	memset(ctr, 0, sizeof *ctr);
	*n_replays = 0;
	for (uint32_t t = 1; t < n_gen; t++) {
		const uint32_t n = t <= n_hi ? n_seq : n_lo;
		if (n < n_seq && !before) { /* the idle sequences' K/V as they are now */
			for (uint32_t i = n; i < n_seq; i++)
				n_idle_bytes += s[i].n_blocks * bb;
			before = malloc(n_idle_bytes);
			for (uint32_t i = n, o = 0; i < n_seq; i++)
				for (uint32_t b = 0; b < s[i].n_blocks; b++, o++)
					CHECK(kvt_dev_copy_d2h(d, before + (size_t)o * bb,
							       (const uint8_t *)kv->pool + (size_t)s[i].blocks[b] * bb,
							       bb) == KVT_OK);
		}
		kvt_dev_counters c;
		int rc;
		kvt_dev_counters_reset(d);
		if (mode == 0) {
			rc = kvt_model_forward_batch(r.m, n, sp, ones, tok, want, logits);
			for (uint32_t i = 0; !rc && i < n; i++)
				next[i] = host_argmax(logits + (size_t)i * r.n_vocab, r.n_vocab);
		} else {
			rc = kvt_model_decode(r.m, n, sp, tok, NULL, NULL, next);
		}
		kvt_dev_counters_get(d, &c);
		CHECKF(rc == KVT_OK, "batch %u, step %u (mode %d): %d", n, t, mode, rc);
		if (rc)
			break;
		if (t > 1) {
			ctr->graph_launches += c.graph_launches;
			ctr->host_syncs += c.host_syncs;
			ctr->kernel_launches += c.kernel_launches;
			ctr->graph_kernels += c.graph_kernels;
			(*n_replays)++;
		}
		for (uint32_t i = 0; i < n; i++)
			tok[i] = out[(size_t)i * n_gen + t] = next[i];
	}
	if (before) {
		uint8_t *after = malloc(bb);
		for (uint32_t i = n_lo, o = 0; i < n_seq; i++)
			for (uint32_t b = 0; b < s[i].n_blocks; b++, o++) {
				CHECK(kvt_dev_copy_d2h(d, after, (const uint8_t *)kv->pool + (size_t)s[i].blocks[b] * bb,
						       bb) == KVT_OK);
				kept = kept && memcmp(after, before + (size_t)o * bb, bb) == 0;
			}
		free(after);
		free(before);
	}
	for (uint32_t i = 0; i < n_seq; i++)
		kvt_seq_deinit(&s[i]);
	kept = kept && kvt_t0_n_free(r.pool) == kvt_t0_n_slots(r.pool);
	free(logits);
	rig_close(&r);
	return kept;
}

static void test_decode_big(kvt_dev *d, const char *path)
{
	static const uint32_t cases[][4] = { /* sequences, steps at all of them, then how many, tokens */
		{ 64, 2, 64, 3 }, { 128, 2, 128, 3 }, { 40, 2, 37, 5 },
	};
	static int32_t ref[BIG_MAX * BIG_GEN], got[BIG_MAX * BIG_GEN], gotn[BIG_MAX * BIG_GEN];
	const bool graphs = kvt_dev_graphs_supported(d);
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
		const uint32_t n_seq = cases[k][0], n_hi = cases[k][1], n_lo = cases[k][2], n_gen = cases[k][3];
		kvt_dev_counters cr, cg, cn;
		uint32_t nr, ng, nn;
		bool kept_r = big_run(d, path, 0, n_seq, n_hi, n_lo, n_gen, ref, &cr, &nr);
		bool kept_g = big_run(d, path, 1, n_seq, n_hi, n_lo, n_gen, got, &cg, &ng);
		bool kept_n = big_run(d, path, 2, n_seq, n_hi, n_lo, n_gen, gotn, &cn, &nn);
		const size_t bytes = (size_t)n_seq * n_gen * sizeof(int32_t);
		CHECKF(memcmp(ref, got, bytes) == 0, "batch %u then %u: decode (graphs %s) differs from forward_batch",
		       n_seq, n_lo, graphs ? "on" : "unsupported");
		CHECKF(memcmp(ref, gotn, bytes) == 0, "batch %u then %u: direct decode differs from forward_batch",
		       n_seq, n_lo);
		CHECKF(kept_r && kept_g && kept_n, "batch %u then %u: idle K/V changed or a block was not given back "
		       "(reference %d, graphs %d, direct %d)", n_seq, n_lo, kept_r, kept_g, kept_n);
		uint32_t changes = 0; /* and the tokens are not one repeated id */
		for (uint32_t i = 0; i + 1 < n_seq * n_gen; i++)
			changes += ref[i] != ref[i + 1];
		CHECK(changes > n_seq);
		printf("%s batch %u then %u: tokens of decode (graphs, direct) = forward_batch: %s; %llu replayed steps: "
		       "%llu graph launches, %llu host syncs, %llu kernels outside, %.1f kernels in graphs a step\n",
		       kvt_dev_name(d), n_seq, n_lo, memcmp(ref, got, bytes) == 0 && memcmp(ref, gotn, bytes) == 0 ? "yes" : "NO",
		       (unsigned long long)ng, (unsigned long long)cg.graph_launches,
		       (unsigned long long)cg.host_syncs, (unsigned long long)cg.kernel_launches,
		       ng ? (double)cg.graph_kernels / ng : 0.0);
		CHECK(ng == n_gen - 2 && nn == ng && nr == ng);
		if (graphs) {
			CHECK_EQ_INT(cg.graph_launches, ng);
			CHECK_EQ_INT(cg.host_syncs, ng);
			CHECK_EQ_INT(cg.kernel_launches, 0);
		}
	}
}

static void test_random_model(kvt_dev *d)
{
	const kvt_model_hparams hp = { .n_layer = 2, .n_embd = 256, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
				       .n_ff = 512, .n_vocab = 1024, .n_ctx_train = 512, .rope_base = 10000.0f,
				       .rms_eps = 1e-5f };
	kvt_model *m = (kvt_model *)&m;
	/* bad shapes and dtypes, each named */
	kvt_model_hparams bad = hp;
	bad.n_head_kv = 3;
	check_log_capture();
	CHECK(kvt_model_create_random(d, &bad, KVT_DTYPE_F16, 1, NULL, &m) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "n_head / n_head_kv") != NULL);
	bad = hp;
	bad.n_embd = 320;
	bad.n_head = 5;
	bad.n_head_kv = 5;
	CHECK(kvt_model_create_random(d, &bad, KVT_DTYPE_Q4_K, 1, NULL, &m) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "multiples of 256") != NULL);
	CHECK(kvt_model_create_random(d, &hp, KVT_DTYPE_Q8_0, 1, NULL, &m) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "F16 or Q4_K") != NULL);
	bad = hp;
	bad.n_vocab = 0;
	CHECK(kvt_model_create_random(d, &bad, KVT_DTYPE_F16, 1, NULL, &m) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "n_vocab") != NULL);
	kvt_log_set_sink(NULL, NULL);
	CHECK(m == (kvt_model *)&m); /* nothing written on failure */

	static const int dtypes[] = { KVT_DTYPE_F16, KVT_DTYPE_Q4_K };
	for (size_t k = 0; k < 2; k++) {
		const int dt = dtypes[k];
		if (!kvt_dev_supports_dtype(d, dt)) {
			printf("%s: no %s weights, random model skipped\n", kvt_dev_name(d), kvt_dtype_name(dt));
			continue;
		}
		CHECK(kvt_model_create_random(d, &hp, dt, 7, NULL, &m) == KVT_OK);
		const size_t E = hp.n_embd, F = hp.n_ff, V = hp.n_vocab, QD = hp.n_head * hp.head_dim;
		const size_t KVD = hp.n_head_kv * hp.head_dim;
		const size_t want = 2 * V * kvt_dtype_row_bytes(dt, E) +
				    hp.n_layer * ((QD + 2 * KVD + 2 * F) * kvt_dtype_row_bytes(dt, E) +
						  E * kvt_dtype_row_bytes(dt, QD) + E * kvt_dtype_row_bytes(dt, F)) +
				    (1 + 2 * hp.n_layer) * E * sizeof(float);
		CHECK_EQ_INT(kvt_model_weight_bytes(m), want);
		kvt_model_destroy(m);
		rig_random_hp = hp;
		rig_random_dtype = dt;
		static int32_t ref[12 * 4], got[12 * 4];
		kvt_dev_counters c;
		uint32_t nr, ng;
		CHECK(big_run(d, NULL, 0, 12, 3, 12, 4, ref, &c, &nr));
		CHECK(big_run(d, NULL, 1, 12, 3, 12, 4, got, &c, &ng));
		CHECKF(memcmp(ref, got, sizeof ref) == 0, "random %s model: decode of 12 differs from forward_batch",
		       kvt_dtype_name(dt));
		printf("%s: random %s model (%zu weight bytes): 12 sequences decode as forward_batch: %s\n",
		       kvt_dev_name(d), kvt_dtype_name(dt), want, memcmp(ref, got, sizeof ref) == 0 ? "yes" : "NO");
	}
}

static void test_capture_rules(kvt_dev *d)
{
	kvt_graph *g = (kvt_graph *)&g;
	if (!kvt_dev_graphs_supported(d)) {
		check_log_capture();
		CHECK(kvt_dev_capture_begin(d) == KVT_EUNSUPPORTED);
		CHECK(kvt_dev_capture_end(d, &g) == KVT_EUNSUPPORTED && g == NULL);
		kvt_log_set_sink(NULL, NULL);
		return;
	}
	/* a host wait inside a capture fails, and so does the capture */
	CHECK(kvt_dev_capture_begin(d) == KVT_OK);
	check_log_capture();
	CHECK(kvt_dev_sync(d) == KVT_EINVAL);
	CHECK(kvt_dev_capture_end(d, &g) == KVT_EINVAL && g == NULL);
	kvt_log_set_sink(NULL, NULL);
	/* counters: a blocking copy is one copy, its bytes and one host wait */
	void *p = NULL;
	char h[1000] = { 1 };
	CHECK(kvt_dev_alloc(d, sizeof h, &p) == KVT_OK);
	kvt_dev_counters_reset(d);
	CHECK(kvt_dev_copy_h2d(d, p, h, sizeof h) == KVT_OK);
	CHECK(kvt_dev_copy_d2h(d, h, p, 600) == KVT_OK);
	kvt_dev_counters c;
	kvt_dev_counters_get(d, &c);
	CHECK(c.h2d_bytes == 1000 && c.d2h_bytes == 600 && c.copies == 2 && c.host_syncs == 2);
	/* a captured copy counts when replayed, once per launch */
	float *x = NULL;
	float ones[256];
	for (int i = 0; i < 256; i++)
		ones[i] = 1.0f;
	CHECK(kvt_dev_alloc(d, sizeof ones, (void **)&x) == KVT_OK);
	CHECK(kvt_dev_copy_h2d(d, x, ones, sizeof ones) == KVT_OK);
	kvt_dev_counters_reset(d);
	CHECK(kvt_dev_capture_begin(d) == KVT_OK);
	kvt_add_args aa = { .n = 256, .x = x, .y = x }; /* doubles x each replay */
	CHECK(kvt_dev_add(d, &aa) == KVT_OK);
	CHECK(kvt_dev_copy_d2d(d, p, x, 16) == KVT_OK);
	CHECK(kvt_dev_capture_end(d, &g) == KVT_OK && g);
	kvt_dev_counters_get(d, &c);
	CHECK(c.kernel_launches == 0 && c.copies == 0 && c.graph_launches == 0); /* nothing ran yet */
	float back[256];
	CHECK(kvt_dev_copy_d2h(d, back, x, sizeof back) == KVT_OK);
	CHECK(back[0] == 1.0f && back[255] == 1.0f);
	for (int i = 0; i < 3; i++)
		CHECK(kvt_dev_graph_launch(d, g) == KVT_OK);
	CHECK(kvt_dev_sync(d) == KVT_OK);
	CHECK(kvt_dev_copy_d2h(d, back, x, sizeof back) == KVT_OK);
	CHECK(back[0] == 8.0f && back[255] == 8.0f);
	kvt_dev_counters_get(d, &c);
	CHECK(c.graph_launches == 3 && c.graph_kernels == 3 && c.kernel_launches == 0 && c.d2d_bytes == 48);
	kvt_dev_graph_destroy(d, g);
	kvt_dev_free(d, x);
	kvt_dev_free(d, p);
}

/*
 * Graph decode with the combine fused (decode kernel 1 and 2): the tokens of
 * the separate combine's graphs, and one kernel less a layer (8, not 9).
 */
static void test_decode_fused(const char *path, uint32_t n_layer)
{
	enum { N = 12 };
	const uint32_t len = 13;
	for (int v = 1; v <= 2; v++) {
		char name[2] = { (char)('0' + v), 0 };
		kvt_dev *sep = make_variant(name, "separate", "0"), *fu = make_variant(name, "fused", "0");
		CHECK(sep && fu);
		if (!sep || !fu)
			return;
		int32_t ts[N], tf[N];
		kvt_dev_counters cs, cf;
		dec_run(sep, path, false, 1, &len, N, NULL, ts, &cs);
		dec_run(fu, path, false, 1, &len, N, NULL, tf, &cf);
		const uint64_t steps = N - 1;
		CHECKF(memcmp(ts, tf, sizeof ts) == 0, "decode kernel %d: graph decode with the fused combine differs", v);
		CHECKF(cf.graph_kernels + steps * n_layer == cs.graph_kernels,
		       "decode kernel %d: %llu kernels fused, %llu separate, over %llu steps of %u layers", v,
		       (unsigned long long)cf.graph_kernels, (unsigned long long)cs.graph_kernels,
		       (unsigned long long)steps, n_layer);
		/* a layer is 8 launches with the combine in the attention kernel */
		CHECKF(cf.graph_kernels <= steps * (3 + 8 * n_layer), "%.1f kernels a step fused",
		       (double)cf.graph_kernels / steps);
		CHECK(cf.kernel_launches == 0 && cf.graph_launches <= steps && cf.host_syncs <= steps);
		printf("decode kernel %d, batch 1 graphs: %.1f kernels a step with the combine fused, %.1f separate\n", v,
		       (double)cf.graph_kernels / steps, (double)cs.graph_kernels / steps);
		kvt_dev_destroy(sep);
		kvt_dev_destroy(fu);
	}
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	kvt_dev *d = make_dev(NULL);
	if (!d)
		return check_skip("test_gpu_graph", "the device KVTIER_TEST_DEVICE names is not available");
	test_capture_rules(d);
	kvt_dev_config rc = { .kind = KVT_DEV_CPU, .use_ref = true };
	kvt_dev *ref = NULL;
	CHECK(kvt_dev_create(&rc, &ref) == KVT_OK);
	test_fused(d, ref);
	kvt_dev_destroy(ref);

	/* every decode kernel (0: the default, order-invariant chunked path), every codec */
	const bool cuda = kvt_dev_kind(d) == KVT_DEV_CUDA;
	for (int v = cuda ? 0 : 1; v <= (cuda ? 3 : 1); v++) {
		char name[2] = { (char)('0' + v), 0 };
		kvt_dev *dv = cuda && v ? make_dev(name) : d;
		CHECK(dv != NULL);
		for (int codec = 0; dv && codec < KVT_KV_POOL_CODEC_COUNT; codec++)
			test_dyn_pos(dv, codec, NULL);
		if (dv != d)
			kvt_dev_destroy(dv);
	}
	/* the fused combine (and kernel 2/3 staging), every decode kernel, every codec, against the separate one */
	for (int v = 1; cuda && v <= 3; v++) {
		char name[2] = { (char)('0' + v), 0 };
		kvt_dev *sep = make_variant(name, "separate", "0");
		for (int st = 0; st < (v == 1 ? 1 : 2); st++) {
			kvt_dev *fu = make_variant(name, "fused", st ? "1" : "0");
			CHECK(sep && fu);
			printf("decode kernel %d, fused combine%s:\n", v, st ? ", staged" : "");
			for (int codec = 0; sep && fu && codec < KVT_KV_POOL_CODEC_COUNT; codec++)
				test_dyn_pos(fu, codec, sep);
			kvt_dev_destroy(fu);
		}
		kvt_dev_destroy(sep);
	}

	char dir[] = "/tmp/kvt_graph_XXXXXX", path[64];
	if (!mkdtemp(dir))
		abort();
	snprintf(path, sizeof path, "%s/synth.gguf", dir);
	kvt_synth_llama cfg;
	kvt_synth_llama_default(&cfg);
	cfg.n_layer = 2;
	cfg.n_embd = 256;
	cfg.n_head = 4; /* head_dim 64: the decode kernels */
	cfg.n_head_kv = 2;
	cfg.n_ff = 512;
	cfg.n_ctx = 512;
	cfg.weight_type = KVT_GGML_F16; /* the GEMV path */
	cfg.tied_embeddings = false;
	cfg.seed = 5;
	CHECK(kvt_synth_llama_write(&cfg, path) == KVT_OK);
	test_decode(d, path, cfg.n_layer);
	if (cuda)
		test_decode_fused(path, cfg.n_layer);
	test_decode_big(d, path);
	test_random_model(d);
	unlink(path);
	rmdir(dir);
	kvt_dev_destroy(d);
	return check_done("test_gpu_graph");
}
