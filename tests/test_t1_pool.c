/* ctest-labels: unit */
/*
 * tests/test_t1_pool.c — T1, the pinned host pool, and the T0 <-> T1 mover:
 * slots and counts as in T0; a round trip T0 -> T1 -> T0 through every codec
 * on blocks shaped like real KV (per-head magnitudes that differ by orders,
 * outliers, an all-zero head, fp16 subnormals): f16 bit for bit, FP8 and INT8
 * within the bound documented in tiers.h on EVERY element, with s the scale of
 * the element's group (the whole token-and-head vector for FP8, its 32 dims
 * for INT8); the packed bytes are what dev.h documents (codes, then a scale
 * per vector (FP8) or per vector and 32 dims (INT8)); bad arguments are refused
 * with a named error; a concurrent alloc/unref stress run for TSan.
 */
#include "check.h"
#include "test_dev.h"
#include "tiers.h"

#include <pthread.h>

static const kvt_kv_layout shape = { .n_layers = 3, .n_kv_heads = 2, .head_dim = 64, .block_tokens = 16 };

/* Fill a host fp16 block with KV-like values: each (layer, K/V, head) gets its own magnitude. */
static void fill_block(uint16_t *h, check_rng *rng)
{
	const uint32_t n_vec = shape.n_layers * 2 * shape.n_kv_heads, per = shape.block_tokens * shape.head_dim;
	for (uint32_t v = 0; v < n_vec; v++) {
		float mag = powf(10.0f, (float)(check_rng_u64(rng) % 7) - 4.0f); /* 1e-4 .. 1e2 */
		for (uint32_t i = 0; i < per; i++) {
			float x = check_rng_f32(rng) * mag;
			if (check_rng_u64(rng) % 97 == 0)
				x *= 20.0f; /* outlier channel value */
			if (v == 1)
				x = 0.0f; /* a whole zero head: scale 0 */
			if (v == 2 && i % 5 == 0)
				x = 3e-7f; /* fp16 subnormals */
			h[v * per + i] = kvt_f32_to_f16(x);
		}
	}
}

/* Check every element of out against in for codec; returns the number out of bound. */
static int check_bound(int codec, const uint16_t *in, const uint16_t *out, double *max_rel_l2)
{
	const uint32_t T = shape.block_tokens, D = shape.head_dim;
	const uint32_t n_vec = shape.n_layers * 2 * shape.n_kv_heads * T;
	const uint32_t gd = codec == KVT_KV_CODEC_F16 ? D : kvt_kv_group_dims(codec, D); /* values per scale */
	int n_bad = 0;
	double num = 0, den = 0;
	for (uint32_t v = 0; v < n_vec; v++) {
		float amax = 0; /* of the current group */
		for (uint32_t d = 0; d < D; d++) {
			if (d % gd == 0) {
				amax = 0;
				for (uint32_t i = d; i < d + gd; i++)
					amax = fmaxf(amax, fabsf(kvt_f16_to_f32(in[v * D + i])));
			}
			float x = kvt_f16_to_f32(in[v * D + d]), y = kvt_f16_to_f32(out[v * D + d]);
			double err = fabs((double)y - x), bound;
			if (codec == KVT_KV_CODEC_F16) {
				if (in[v * D + d] != out[v * D + d])
					n_bad++;
				continue;
			}
			if (codec == KVT_KV_CODEC_INT8) {
				double s = amax / 127.0;
				bound = s / 2 + fmax(ldexp(fabs(y), -11), 0x1p-25);
			} else {
				double s = amax / 448.0;
				bound = ldexp(fabs(x), -4) + ldexp(s, -10) + fmax(ldexp(fabs(y), -11), 0x1p-25);
			}
			bound = bound * (1 + 1e-6) + 1e-30; /* fp32 arithmetic of the scale itself */
			if (err > bound) {
				if (n_bad < 5)
					fprintf(stderr, "  %s vec %u dim %u: x %g -> %g (err %g > bound %g)\n",
						kvt_kv_codec_name(codec), v, d, x, y, err, bound);
				n_bad++;
			}
			num += err * err;
			den += (double)x * x;
		}
	}
	if (max_rel_l2)
		*max_rel_l2 = den > 0 ? sqrt(num / den) : 0;
	return n_bad;
}

static kvt_t1_pool *spool;
static void *stress(void *arg)
{
	check_rng rng = { (unsigned long long)(uintptr_t)arg * 104729 + 3 };
	int32_t held[8];
	int n = 0;
	for (int i = 0; i < 20000; i++) {
		unsigned long long r = check_rng_u64(&rng) % 3;
		if (r == 0 && n < 8) {
			if (kvt_t1_alloc(spool, &held[n]) == KVT_OK) {
				/* a holder owns its bytes: write them, TSan sees no sharing */
				memset(kvt_t1_slot_ptr(spool, held[n]), (int)i, 64);
				n++;
			}
		} else if (r == 1 && n > 0 && n < 8) {
			kvt_t1_ref(spool, held[n - 1]);
			held[n] = held[n - 1];
			n++;
		} else if (n > 0) {
			kvt_t1_unref(spool, held[--n]);
		}
	}
	while (n > 0)
		kvt_t1_unref(spool, held[--n]);
	return NULL;
}

int main(void)
{
	kvt_dev *dev;
	kvt_dev_config dc = { .kind = test_dev_kind(), .n_threads = 2 };
	if (kvt_dev_create(&dc, &dev))
		return dc.kind == KVT_DEV_CPU ? 1 : check_skip("test_t1_pool", "the requested device is not available");
	printf("device: %s\n", kvt_dev_name(dev));
	kvt_t0_pool *t0;
	const uint32_t NB = 6; /* blocks per round trip */
	CHECK(kvt_t0_create(dev, &shape, 2 * NB, &t0) == KVT_OK);
	const size_t bb = kvt_t0_block_bytes(t0);
	const size_t n_el = bb / 2;
	const uint32_t n_vec = shape.n_layers * 2 * shape.n_kv_heads * shape.block_tokens;
	uint16_t *in = malloc(bb * NB), *out = malloc(bb * NB);
	check_rng rng = { 12345 };
	for (uint32_t b = 0; b < NB; b++)
		fill_block(in + b * n_el, &rng);

	for (int codec = 0; codec < KVT_KV_POOL_CODEC_COUNT; codec++) {
		kvt_t1_pool *t1;
		kvt_t1_mover *mv;
		CHECK(kvt_t1_create(dev, &shape, codec, NB, &t1) == KVT_OK);
		CHECK(kvt_t1_mover_create(dev, t0, codec, NB, &mv) == KVT_OK);
		CHECK_EQ_INT(kvt_t1_codec(t1), codec);
		CHECK_EQ_INT(kvt_t1_slot_bytes(t1), kvt_kv_packed_bytes(kvt_t0_layout(t0), codec));
		/* codes, then fp32 scales: one per vector (FP8), one per vector and 32 dims (INT8) */
		const uint32_t n_groups = codec == KVT_KV_CODEC_INT8 ? shape.head_dim / 32 : 1;
		CHECK_EQ_INT(kvt_kv_group_dims(codec, shape.head_dim), codec == KVT_KV_CODEC_F16 ? 0 : shape.head_dim / n_groups);
		CHECK_EQ_INT(kvt_t1_slot_bytes(t1), codec == KVT_KV_CODEC_F16
							? bb
							: (size_t)n_vec * shape.head_dim + (size_t)n_vec * n_groups * 4);

		/* source slots 0..NB-1, destinations NB..2NB-1 */
		int32_t src[16], dst[16], t1s[16];
		void *h[16];
		for (uint32_t b = 0; b < NB; b++) {
			CHECK(kvt_t0_alloc(t0, &src[b]) == KVT_OK);
			CHECK(kvt_dev_copy_h2d(dev, (char *)kvt_t0_layout(t0)->pool + (size_t)src[b] * bb,
					       in + b * n_el, bb) == KVT_OK);
		}
		for (uint32_t b = 0; b < NB; b++) {
			CHECK(kvt_t0_alloc(t0, &dst[b]) == KVT_OK);
			CHECK(kvt_t1_alloc(t1, &t1s[b]) == KVT_OK);
			h[b] = kvt_t1_slot_ptr(t1, t1s[b]);
		}
		int32_t extra;
		CHECK(kvt_t1_alloc(t1, &extra) == KVT_EFULL);
		/* demote in two calls (staging reuse), promote in one, in reverse slot order */
		CHECK(kvt_t1_mover_pack(mv, 2, src, h) == KVT_OK);
		CHECK(kvt_t1_mover_pack(mv, NB - 2, src + 2, h + 2) == KVT_OK);
		if (codec == KVT_KV_CODEC_F16) {
			CHECK(memcmp(h[0], in, bb) == 0);
		} else {
			/* the scales of vector 0 are amax / qmax of each group, after the codes */
			const float *sc = (const float *)((const uint8_t *)h[0] + (size_t)n_vec * shape.head_dim);
			const uint32_t gd = shape.head_dim / n_groups;
			for (uint32_t g = 0; g < n_groups; g++) {
				float amax = 0;
				for (uint32_t d = g * gd; d < (g + 1) * gd; d++)
					amax = fmaxf(amax, fabsf(kvt_f16_to_f32(in[d])));
				CHECKF(sc[g] == amax / (codec == KVT_KV_CODEC_FP8 ? 448.0f : 127.0f), "group %u scale %g amax %g",
				       g, sc[g], amax);
			}
			/* the all-zero head (vectors block_tokens..) has scale 0 in every group */
			for (uint32_t g = 0; g < n_groups; g++)
				CHECK(sc[shape.block_tokens * n_groups + g] == 0.0f);
		}
		const void *hs[16];
		int32_t rdst[16];
		for (uint32_t b = 0; b < NB; b++) {
			hs[b] = h[NB - 1 - b];
			rdst[b] = dst[NB - 1 - b];
		}
		CHECK(kvt_t1_mover_unpack(mv, NB, hs, rdst) == KVT_OK);
		for (uint32_t b = 0; b < NB; b++)
			CHECK(kvt_dev_copy_d2h(dev, out + b * n_el,
					       (char *)kvt_t0_layout(t0)->pool + (size_t)dst[b] * bb, bb) == KVT_OK);
		double rel = 0, worst = 0;
		int n_bad = 0;
		for (uint32_t b = 0; b < NB; b++) {
			n_bad += check_bound(codec, in + b * n_el, out + b * n_el, &rel);
			worst = fmax(worst, rel);
		}
		CHECKF(n_bad == 0, "%s: %d elements outside the documented bound", kvt_kv_codec_name(codec), n_bad);
		printf("  %s: %d elements outside the bound; worst block relative L2 %.4f%% (outlier-heavy data)\n",
		       kvt_kv_codec_name(codec), n_bad, worst * 100);

		/* bad arguments: too many blocks for the staging buffer */
		check_log_capture();
		CHECK(kvt_t1_mover_pack(mv, NB + 1, src, h) == KVT_EINVAL);
		CHECK(strstr(check_log_text, "t1 mover pack: 7 blocks, staging holds 6") != NULL);
		kvt_log_set_sink(NULL, NULL);

		for (uint32_t b = 0; b < NB; b++) {
			kvt_t0_unref(t0, src[b]);
			kvt_t0_unref(t0, dst[b]);
			kvt_t1_unref(t1, t1s[b]);
		}
		CHECK(kvt_t1_check(t1) == KVT_OK);
		CHECK_EQ_INT(kvt_t1_n_free(t1), NB);
		kvt_t1_mover_destroy(mv);
		kvt_t1_destroy(t1);
	}

	/* an 8-bit T0 pool (dev.h: kvt_kv_layout.codec) moves to a T1 of its own codec as a plain copy */
	{
		kvt_kv_layout s8 = shape;
		s8.codec = KVT_KV_CODEC_FP8;
		kvt_t0_pool *p8;
		kvt_t1_pool *t18;
		kvt_t1_mover *mv8;
		CHECK(kvt_t0_create(dev, &s8, 2, &p8) == KVT_OK);
		CHECK(kvt_t1_create(dev, &s8, KVT_KV_CODEC_FP8, 1, &t18) == KVT_OK);
		CHECK(kvt_t1_mover_create(dev, p8, KVT_KV_CODEC_FP8, 1, &mv8) == KVT_OK);
		const size_t b8 = kvt_t0_block_bytes(p8);
		CHECK_EQ_INT(b8, kvt_t1_slot_bytes(t18));
		unsigned char *x = malloc(b8), *y = malloc(b8);
		for (size_t i = 0; i < b8; i++)
			x[i] = (unsigned char)(check_rng_u64(&rng) & 0x7E); /* finite codes, whatever the scales */
		int32_t a8, b8s, t8;
		CHECK(kvt_t0_alloc(p8, &a8) == KVT_OK && kvt_t0_alloc(p8, &b8s) == KVT_OK && kvt_t1_alloc(t18, &t8) == KVT_OK);
		CHECK(kvt_dev_copy_h2d(dev, (char *)kvt_t0_layout(p8)->pool + (size_t)a8 * b8, x, b8) == KVT_OK);
		void *h8 = kvt_t1_slot_ptr(t18, t8);
		const void *hc8 = h8;
		CHECK(kvt_t1_mover_pack(mv8, 1, &a8, &h8) == KVT_OK);
		CHECK(memcmp(h8, x, b8) == 0);
		CHECK(kvt_t1_mover_unpack(mv8, 1, &hc8, &b8s) == KVT_OK);
		CHECK(kvt_dev_copy_d2h(dev, y, (char *)kvt_t0_layout(p8)->pool + (size_t)b8s * b8, b8) == KVT_OK);
		CHECK(memcmp(x, y, b8) == 0);
		kvt_t0_unref(p8, a8);
		kvt_t0_unref(p8, b8s);
		kvt_t1_unref(t18, t8);
		free(x);
		free(y);
		kvt_t1_mover_destroy(mv8);
		kvt_t1_destroy(t18);
		kvt_t0_destroy(p8);
	}

	/* refcounts as in T0 */
	kvt_t1_pool *t1;
	CHECK(kvt_t1_create(dev, &shape, KVT_KV_CODEC_FP8, 4, &t1) == KVT_OK);
	int32_t a, b;
	CHECK(kvt_t1_alloc(t1, &a) == KVT_OK && a == 0);
	kvt_t1_ref(t1, a);
	CHECK_EQ_INT(kvt_t1_refcount(t1, a), 2);
	kvt_t1_unref(t1, a);
	CHECK_EQ_INT(kvt_t1_n_free(t1), 3);
	kvt_t1_unref(t1, a);
	CHECK(kvt_t1_alloc(t1, &b) == KVT_OK && b == a); /* LIFO */
	kvt_t1_unref(t1, b);
	CHECK(((uintptr_t)kvt_t1_slot_ptr(t1, 1) & 63) == 0);

	/* bad arguments are named */
	kvt_t1_pool *bad;
	kvt_t1_mover *badm;
	kvt_kv_layout empty = { 0 };
	check_log_capture();
	CHECK(kvt_t1_create(dev, &empty, KVT_KV_CODEC_F16, 4, &bad) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "t1: empty pool shape") != NULL);
	CHECK(kvt_t1_create(dev, &shape, 7, 4, &bad) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "t1: codec 7 is not f16, fp8 or int8") != NULL);
	CHECK(kvt_t1_mover_create(dev, t0, KVT_KV_CODEC_FP8, 0, &badm) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "t1 mover: 0 staging blocks") != NULL);
	kvt_log_set_sink(NULL, NULL);

	/* concurrent holders */
	spool = t1;
	pthread_t th[4];
	for (uintptr_t i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, stress, (void *)i);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	CHECK_EQ_INT(kvt_t1_n_free(t1), 4);
	CHECK(kvt_t1_check(t1) == KVT_OK);

	kvt_t1_destroy(t1);
	kvt_t1_destroy(NULL);
	kvt_t1_mover_destroy(NULL);
	kvt_t0_destroy(t0);
	kvt_dev_destroy(dev);
	free(in);
	free(out);
	return check_done("test_t1_pool");
}
