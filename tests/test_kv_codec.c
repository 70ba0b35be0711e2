/* ctest-labels: unit parity */
/*
 * tests/test_kv_codec.c — the block codecs and 8-bit KV pools of the device
 * interface, on the CPU reference (the GPU is held to the same bytes by
 * test_gpu_parity):
 *   - FP8 E4M3 encoding is round-to-nearest-even with saturation: every
 *     finite code survives decode+encode, and random values encode to the
 *     nearest representable value (checked by brute force);
 *   - kv_pack/kv_unpack: fp16 bit for bit; FP8 and INT8 within their bounds
 *     (per value: half a quantization step of its vector's scale, plus the
 *     fp16 rounding of the result);
 *   - an 8-bit pool: kv_store writes exactly the bytes kv_pack makes of an
 *     fp16 pool holding the same tokens, and attention over it equals
 *     attention over the fp16 pool of its unpacked values;
 *   - misuse is refused with a message: packing an FP8 pool to INT8.
 */
#include "check.h"
#include "dev.h"
#include "kv_codec.h"

static check_rng rng = { 12345 };

static void test_fp8_scalar(void)
{
	int bad = 0;
	for (int c = 0; c < 256; c++) {
		if ((c & 0x7f) == 0x7f)
			continue; /* NaN */
		float v = kvt_fp8_e4m3_decode((uint8_t)c);
		uint8_t back = kvt_fp8_e4m3_encode(v);
		if (back != c && !(c == 0x80 && back == 0x80))
			bad++;
	}
	CHECKF(bad == 0, "%d codes do not survive decode+encode", bad);
	CHECK(kvt_fp8_e4m3_decode(0x7e) == 448.0f && kvt_fp8_e4m3_decode(0x01) == 1.0f / 512);
	CHECK(kvt_fp8_e4m3_encode(1e9f) == 0x7e && kvt_fp8_e4m3_encode(-1e9f) == 0xfe);
	CHECK(kvt_fp8_e4m3_encode(0.0f) == 0x00);

	/* nearest representable, ties to the even code */
	bad = 0;
	for (int i = 0; i < 200000; i++) {
		float x = check_rng_f32(&rng) * (i % 3 == 0 ? 460.0f : i % 3 == 1 ? 1.0f : 0.01f);
		uint8_t c = kvt_fp8_e4m3_encode(x);
		float got = kvt_fp8_e4m3_decode(c), best_d = INFINITY;
		for (int k = 0; k < 256; k++) {
			if ((k & 0x7f) == 0x7f)
				continue;
			float d = fabsf(kvt_fp8_e4m3_decode((uint8_t)k) - x);
			best_d = d < best_d ? d : best_d;
		}
		float d = fabsf(got - x);
		if (fabsf(x) <= 448.0f && d != best_d)
			bad++;
	}
	CHECKF(bad == 0, "%d values not encoded to the nearest FP8 value", bad);
	/* a tie: 1 + 1/16 lies halfway between 1 (mantissa 000, even) and 1.125 */
	CHECK(kvt_fp8_e4m3_encode(1.0625f) == 0x38);
	CHECK(kvt_fp8_e4m3_encode(1.1875f) == 0x3a); /* between 1.125 (001) and 1.25 (010): even wins */
	CHECK(kvt_int8_encode(2.5f) == 2 && kvt_int8_encode(-3.5f) == -4 && kvt_int8_encode(300.0f) == 127);
}

static kvt_kv_layout pool_make(kvt_dev *d, int codec, uint32_t n_slots)
{
	kvt_kv_layout l = { .n_layers = 2, .n_kv_heads = 3, .head_dim = 64, .block_tokens = 16, .n_slots = n_slots,
			    .codec = codec };
	if (kvt_dev_alloc(d, kvt_kv_block_bytes(&l) * n_slots, &l.pool))
		abort();
	memset(l.pool, 0, kvt_kv_block_bytes(&l) * n_slots);
	return l;
}

static void test_pack_bounds(kvt_dev *d)
{
	const uint32_t nb = 5;
	kvt_kv_layout l = pool_make(d, KVT_KV_CODEC_F16, nb);
	const size_t n = kvt_kv_block_bytes(&l) / 2 * nb, hd = l.head_dim;
	uint16_t *x = l.pool;
	for (size_t i = 0; i < n; i++) /* a mix of magnitudes, with outliers, like real K */
		x[i] = kvt_f32_to_f16(check_rng_f32(&rng) * ((i / hd) % 5 == 0 ? 20.0f : 1.0f) * (i % 61 == 0 ? 8 : 1));
	uint16_t *orig = malloc(n * 2);
	memcpy(orig, x, n * 2);
	int32_t slots[5] = { 4, 2, 0, 1, 3 };
	for (int codec = 0; codec < KVT_KV_CODEC_COUNT; codec++) {
		size_t pb = kvt_kv_packed_bytes(&l, codec);
		uint8_t *stage = malloc(pb * nb);
		kvt_kv_pack_args pa = { .kv = &l, .codec = codec, .n_blocks = nb, .h_slots = slots, .dst = stage };
		kvt_kv_unpack_args ua = { .kv = &l, .codec = codec, .n_blocks = nb, .h_slots = slots, .src = stage };
		CHECK(kvt_dev_kv_pack(d, NULL, &pa) == KVT_OK);
		memset(l.pool, 0xff, n * 2);
		CHECK(kvt_dev_kv_unpack(d, NULL, &ua) == KVT_OK);
		if (codec == KVT_KV_CODEC_F16) {
			CHECK(memcmp(l.pool, orig, n * 2) == 0);
		} else {
			const float qmax = codec == KVT_KV_CODEC_FP8 ? 448.0f : 127.0f;
			int over = 0;
			double e2 = 0, s2 = 0;
			for (size_t v = 0; v < n / hd; v++) {
				float amax = 0;
				for (size_t i = 0; i < hd; i++)
					amax = fmaxf(amax, fabsf(kvt_f16_to_f32(orig[v * hd + i])));
				for (size_t i = 0; i < hd; i++) {
					float a = kvt_f16_to_f32(orig[v * hd + i]), b = kvt_f16_to_f32(x[v * hd + i]);
					/* INT8: half a step of amax/127; FP8: 2^-4 relative, or half the
					 * smallest subnormal step; both plus fp16's rounding of the result */
					float step = codec == KVT_KV_CODEC_INT8 ? amax / qmax * 0.5f
										: fmaxf(fabsf(a) / 16, amax / qmax / 1024);
					if (fabsf(a - b) > step * 1.001f + fabsf(a) / 1024 + 1e-7f)
						over++;
					e2 += (double)(a - b) * (a - b);
					s2 += (double)a * a;
				}
			}
			CHECKF(over == 0, "%s: %d values outside the bound", kvt_kv_codec_name(codec), over);
			/* (this data has 8x outliers in every 61st value, which coarsen INT8's
			 * step; the accuracy on real KV is bench/bench_kv_accuracy's job) */
			printf("%s round trip: relative L2 error %.4f%%\n", kvt_kv_codec_name(codec), 100 * sqrt(e2 / s2));
		}
		memcpy(l.pool, orig, n * 2);
		free(stage);
	}
	free(orig);
	kvt_dev_free(d, l.pool);
}

static void test_q8_pool(kvt_dev *d)
{
	const uint32_t n_ctx = 77, nb = 5, H = 3, G = 3, hd = 64, R = 13;
	for (int codec = KVT_KV_CODEC_FP8; codec <= KVT_KV_CODEC_INT8; codec++) {
		kvt_kv_layout l16 = pool_make(d, KVT_KV_CODEC_F16, nb), l8 = pool_make(d, codec, nb);
		int32_t table[5] = { 3, 0, 4, 1, 2 };
		float *k = malloc(n_ctx * H * hd * 4), *v = malloc(n_ctx * H * hd * 4), *q = malloc(R * H * G * hd * 4);
		for (size_t i = 0; i < (size_t)n_ctx * H * hd; i++) {
			k[i] = check_rng_f32(&rng) * 3;
			v[i] = check_rng_f32(&rng);
		}
		for (size_t i = 0; i < (size_t)R * H * G * hd; i++)
			q[i] = check_rng_f32(&rng);
		for (uint32_t layer = 0; layer < 2; layer++) {
			/* two stores: a prefix, then the rest (a partial block in the middle) */
			for (int part = 0; part < 2; part++) {
				uint32_t p0 = part ? 40 : 0, nr = part ? n_ctx - 40 : 40;
				kvt_kv_store_args st = { .kv = &l16, .layer = layer, .block_table = table, .pos0 = p0,
							 .n_rows = nr, .k = k + (size_t)p0 * H * hd, .v = v + (size_t)p0 * H * hd };
				CHECK(kvt_dev_kv_store(d, &st) == KVT_OK);
				st.kv = &l8;
				CHECK(kvt_dev_kv_store(d, &st) == KVT_OK);
			}
		}
		/* the 8-bit pool holds exactly what packing the fp16 pool makes */
		size_t pb = kvt_kv_packed_bytes(&l16, codec);
		uint8_t *stage = malloc(pb * nb);
		kvt_kv_pack_args pa = { .kv = &l16, .codec = codec, .n_blocks = nb, .h_slots = table, .dst = stage };
		CHECK(kvt_dev_kv_pack(d, NULL, &pa) == KVT_OK);
		bool same = true;
		for (uint32_t b = 0; b < nb; b++)
			same &= memcmp(stage + b * pb, (uint8_t *)l8.pool + (size_t)table[b] * pb, pb) == 0;
		CHECKF(same, "%s pool differs from the packed fp16 pool", kvt_kv_codec_name(codec));
		/* packing the 8-bit pool to its own codec is a copy; to another codec an error */
		uint8_t *stage2 = malloc(pb * nb);
		pa.kv = &l8;
		pa.dst = stage2;
		CHECK(kvt_dev_kv_pack(d, NULL, &pa) == KVT_OK);
		CHECK(memcmp(stage, stage2, pb * nb) == 0);
		pa.codec = codec == KVT_KV_CODEC_FP8 ? KVT_KV_CODEC_INT8 : KVT_KV_CODEC_FP8;
		check_log_capture();
		CHECK(kvt_dev_kv_pack(d, NULL, &pa) == KVT_EINVAL);
		CHECK(strstr(check_log_text, "packs only to") != NULL);
		kvt_log_set_sink(NULL, NULL);

		/* attention over the 8-bit pool vs over the fp16 pool of its unpacked values */
		kvt_kv_unpack_args ua = { .kv = &l16, .codec = codec, .n_blocks = nb, .h_slots = table, .src = stage };
		CHECK(kvt_dev_kv_unpack(d, NULL, &ua) == KVT_OK);
		float *o16 = malloc(R * H * G * hd * 4), *o8 = malloc(R * H * G * hd * 4);
		kvt_attention_args at = { .kv = &l16, .layer = 1, .block_table = table, .pos0 = n_ctx - R, .n_rows = R,
					  .n_heads = H * G, .scale = 0.125f, .q = q, .out = o16 };
		size_t wsb = kvt_dev_attention_workspace_bytes(d, &at);
		void *ws = malloc(wsb + 64);
		CHECK(kvt_dev_attention(d, &at, ws) == KVT_OK);
		at.kv = &l8;
		at.out = o8;
		wsb = kvt_dev_attention_workspace_bytes(d, &at);
		free(ws);
		ws = malloc(wsb + 64);
		CHECK(kvt_dev_attention(d, &at, ws) == KVT_OK);
		double e2 = 0, s2 = 0;
		for (size_t i = 0; i < (size_t)R * H * G * hd; i++) {
			e2 += (double)(o16[i] - o8[i]) * (o16[i] - o8[i]);
			s2 += (double)o16[i] * o16[i];
		}
		CHECKF(e2 / s2 < 1e-6, "%s pool attention: nmse %.3g vs the unpacked fp16 pool", kvt_kv_codec_name(codec),
		       e2 / s2);
		free(ws);
		free(o16);
		free(o8);
		free(stage);
		free(stage2);
		free(k);
		free(v);
		free(q);
		kvt_dev_free(d, l16.pool);
		kvt_dev_free(d, l8.pool);
	}
}

/* The fast path's bytes equal the reference's, over every finite fp16 value. */
static void test_fast_equals_ref(void)
{
	kvt_dev *ref, *fast;
	kvt_dev_config rc = { .kind = KVT_DEV_CPU, .use_ref = true }, fc = { .kind = KVT_DEV_CPU, .n_threads = 2 };
	if (kvt_dev_create(&rc, &ref) || kvt_dev_create(&fc, &fast))
		abort();
	const uint32_t nb = 6;
	kvt_kv_layout l = pool_make(ref, KVT_KV_CODEC_F16, nb);
	uint16_t *x = l.pool;
	const size_t n = kvt_kv_block_bytes(&l) / 2 * nb;
	for (size_t i = 0; i < n; i++) {
		uint16_t h = (uint16_t)(i * 40503u); /* a permutation of all 65536 patterns, repeated */
		x[i] = (h & 0x7c00) == 0x7c00 ? 0 : h; /* no inf or NaN */
	}
	int32_t slots[6] = { 0, 1, 2, 3, 4, 5 };
	for (int codec = KVT_KV_CODEC_FP8; codec <= KVT_KV_CODEC_INT8; codec++) {
		size_t pb = kvt_kv_packed_bytes(&l, codec);
		uint8_t *s1 = malloc(pb * nb), *s2 = malloc(pb * nb);
		kvt_kv_pack_args pa = { .kv = &l, .codec = codec, .n_blocks = nb, .h_slots = slots, .dst = s1 };
		CHECK(kvt_dev_kv_pack(ref, NULL, &pa) == KVT_OK);
		pa.dst = s2;
		CHECK(kvt_dev_kv_pack(fast, NULL, &pa) == KVT_OK);
		CHECKF(memcmp(s1, s2, pb * nb) == 0, "%s pack: fast path differs from the reference", kvt_kv_codec_name(codec));
		uint16_t *u1 = malloc(n * 2);
		kvt_kv_unpack_args ua = { .kv = &l, .codec = codec, .n_blocks = nb, .h_slots = slots, .src = s1 };
		CHECK(kvt_dev_kv_unpack(ref, NULL, &ua) == KVT_OK);
		memcpy(u1, l.pool, n * 2);
		CHECK(kvt_dev_kv_unpack(fast, NULL, &ua) == KVT_OK);
		CHECKF(memcmp(u1, l.pool, n * 2) == 0, "%s unpack: fast path differs", kvt_kv_codec_name(codec));
		for (size_t i = 0; i < n; i++) { /* restore the input */
			uint16_t h = (uint16_t)(i * 40503u);
			x[i] = (h & 0x7c00) == 0x7c00 ? 0 : h;
		}
		free(u1);
		free(s1);
		free(s2);
	}
	kvt_dev_free(ref, l.pool);
	kvt_dev_destroy(ref);
	kvt_dev_destroy(fast);
}

int main(void)
{
	test_fp8_scalar();
	test_fast_equals_ref();
	for (int ref = 1; ref >= 0; ref--) {
		kvt_dev *d;
		kvt_dev_config c = { .kind = KVT_DEV_CPU, .use_ref = ref, .n_threads = 2 };
		if (kvt_dev_create(&c, &d))
			return 1;
		test_pack_bounds(d);
		test_q8_pool(d);
		kvt_dev_destroy(d);
	}
	return check_done("test_kv_codec");
}
