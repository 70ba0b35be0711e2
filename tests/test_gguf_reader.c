/*
 * tests/test_gguf_reader.c — GGUF writer -> reader round trips, typed
 * getters, (de)quantization against handcrafted blocks and reference values,
 * alignment, and the synthetic Llama model.
 *
 * Reference values for Q5_0, Q4_K, Q5_K and Q6_K come from the python `gguf` package
 * (gguf 0.19.0, gguf.quants.dequantize) run on the same pattern block that
 * pattern_block() builds here; the quantizers were checked byte-for-byte
 * against gguf.quants.quantize (which mirrors ggml's reference quantizers) on
 * 4096 random blocks when this test was written.
 *
 * The Q5_0, Q4_K, Q5_K and Q6_K quantizers are checked byte for byte against
 * llama.cpp's own ggml (tests/ref/quant_ref.h, made by tests/ref/quant_ref.py
 * with llama-cpp-python 0.3.16) on 16 superblocks the test rebuilds exactly.
 */
/* ctest-labels: unit */
#define _GNU_SOURCE /* memmem */
#include "check.h"
#include "gguf.h"
#include "synth_model.h"
#include "ref/quant_ref.h"

#include <float.h>
#include <stdint.h>
#include <unistd.h>

static char tmp_dir[256];

static void tmp_path(char *buf, size_t cap, const char *name)
{
	snprintf(buf, cap, "%s/%s", tmp_dir, name);
}

static bool str_is(kvt_gguf_str s, const char *c)
{
	return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static uint16_t h16(float f)
{
	return kvt_f32_to_f16(f);
}

/* ---- metadata ---- */

static void test_metadata(void)
{
	char path[512];
	kvt_gguf_writer *w;
	kvt_gguf *g;
	const char *strs[] = { "alpha", "", "g\xc3\xa4mma" };
	const int32_t ints[] = { -5, 0, 7, INT32_MAX, INT32_MIN };
	const float floats[] = { 1.5f, -0.25f, 3.0e38f };
	uint8_t u8 = 200;
	int8_t i8 = -100;
	uint16_t u16 = 60000, u16s[3] = { 1, 2, 65535 };
	int16_t i16 = -30000;
	int64_t i64 = -((int64_t)1 << 40);
	double f64 = 2.718281828459045;
	uint8_t bools[2] = { 1, 0 };

	tmp_path(path, sizeof(path), "meta.gguf");
	CHECK(kvt_gguf_writer_create(&w) == KVT_OK);
	CHECK(kvt_gguf_writer_add_u32(w, "t.u32", 4000000000u) == KVT_OK);
	CHECK(kvt_gguf_writer_add_i32(w, "t.i32", -7) == KVT_OK);
	CHECK(kvt_gguf_writer_add_u64(w, "t.u64", UINT64_MAX) == KVT_OK);
	CHECK(kvt_gguf_writer_add_u64(w, "t.u64small", 12) == KVT_OK);
	CHECK(kvt_gguf_writer_add_f32(w, "t.f32", 0.1f) == KVT_OK);
	CHECK(kvt_gguf_writer_add_bool(w, "t.bool", true) == KVT_OK);
	CHECK(kvt_gguf_writer_add_str(w, "t.str", "hello") == KVT_OK);
	CHECK(kvt_gguf_writer_add_str(w, "t.empty", "") == KVT_OK);
	CHECK(kvt_gguf_writer_add_arr_str(w, "t.astr", strs, 3) == KVT_OK);
	CHECK(kvt_gguf_writer_add_arr_str(w, "t.astr0", strs, 0) == KVT_OK);
	CHECK(kvt_gguf_writer_add_arr_i32(w, "t.ai32", ints, 5) == KVT_OK);
	CHECK(kvt_gguf_writer_add_arr_f32(w, "t.af32", floats, 3) == KVT_OK);
	CHECK(kvt_gguf_writer_add_raw(w, "t.u8", KVT_GGUF_UINT8, &u8, 1) == KVT_OK);
	CHECK(kvt_gguf_writer_add_raw(w, "t.i8", KVT_GGUF_INT8, &i8, 1) == KVT_OK);
	CHECK(kvt_gguf_writer_add_raw(w, "t.u16", KVT_GGUF_UINT16, &u16, 2) == KVT_OK);
	CHECK(kvt_gguf_writer_add_raw(w, "t.i16", KVT_GGUF_INT16, &i16, 2) == KVT_OK);
	CHECK(kvt_gguf_writer_add_raw(w, "t.i64", KVT_GGUF_INT64, &i64, 8) == KVT_OK);
	CHECK(kvt_gguf_writer_add_raw(w, "t.f64", KVT_GGUF_FLOAT64, &f64, 8) == KVT_OK);
	{
		/* ARRAY of UINT16 and of BOOL, encoded by hand: elem type, count, elements. */
		uint8_t raw[4 + 8 + 6], rawb[4 + 8 + 2];
		uint32_t et = KVT_GGUF_UINT16;
		uint64_t n = 3;
		memcpy(raw, &et, 4);
		memcpy(raw + 4, &n, 8);
		memcpy(raw + 12, u16s, 6);
		CHECK(kvt_gguf_writer_add_raw(w, "t.au16", KVT_GGUF_ARRAY, raw, sizeof(raw)) == KVT_OK);
		et = KVT_GGUF_BOOL;
		n = 2;
		memcpy(rawb, &et, 4);
		memcpy(rawb + 4, &n, 8);
		memcpy(rawb + 12, bools, 2);
		CHECK(kvt_gguf_writer_add_raw(w, "t.abool", KVT_GGUF_ARRAY, rawb, sizeof(rawb)) == KVT_OK);
	}
	/* Writer rejections. */
	check_log_reset();
	CHECK(kvt_gguf_writer_add_u32(w, "t.u32", 1) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "duplicate key 't.u32'") != NULL);
	CHECK(kvt_gguf_writer_add_str(w, "", "x") == KVT_EINVAL);
	CHECK(kvt_gguf_writer_add_u32(w, "general.alignment", 48) == KVT_EINVAL);
	CHECK(kvt_gguf_writer_write(w, path) == KVT_OK);
	kvt_gguf_writer_destroy(w);

	CHECK(kvt_gguf_open(path, &g) == KVT_OK);
	if (!g)
		return;
	CHECK(kvt_gguf_version(g) == 3);
	CHECK(kvt_gguf_alignment(g) == 32);
	CHECK(kvt_gguf_n_kv(g) == 20);
	CHECK(kvt_gguf_n_tensors(g) == 0);
	CHECK(strcmp(kvt_gguf_path(g), path) == 0);
	CHECK(str_is(kvt_gguf_kv_at(g, 0)->key, "t.u32"));
	CHECK(str_is(kvt_gguf_kv_at(g, 19)->key, "t.abool"));
	CHECK(kvt_gguf_kv_at(g, 20) == NULL);
	CHECK(kvt_gguf_find_kv(g, "t.missing") == NULL);
	CHECK(kvt_gguf_find_kv(g, "t.u3") == NULL);

	const kvt_gguf_kv *kv = kvt_gguf_find_kv(g, "t.u32");
	CHECK(kv && kv->type == KVT_GGUF_UINT32 && kv->n == 1 && kv->v.u64 == 4000000000u);
	kv = kvt_gguf_find_kv(g, "t.i32");
	CHECK(kv && kv->type == KVT_GGUF_INT32 && kv->v.i64 == -7);
	kv = kvt_gguf_find_kv(g, "t.u8");
	CHECK(kv && kv->type == KVT_GGUF_UINT8 && kv->v.u64 == 200);
	kv = kvt_gguf_find_kv(g, "t.i8");
	CHECK(kv && kv->type == KVT_GGUF_INT8 && kv->v.i64 == -100);
	kv = kvt_gguf_find_kv(g, "t.u16");
	CHECK(kv && kv->type == KVT_GGUF_UINT16 && kv->v.u64 == 60000);
	kv = kvt_gguf_find_kv(g, "t.i16");
	CHECK(kv && kv->type == KVT_GGUF_INT16 && kv->v.i64 == -30000);
	kv = kvt_gguf_find_kv(g, "t.f64");
	CHECK(kv && kv->type == KVT_GGUF_FLOAT64 && kv->v.f64 == f64);
	kv = kvt_gguf_find_kv(g, "t.f32");
	CHECK(kv && kv->type == KVT_GGUF_FLOAT32 && kv->v.f64 == (double)0.1f);
	kv = kvt_gguf_find_kv(g, "t.empty");
	CHECK(kv && kv->type == KVT_GGUF_STRING && kv->v.str.len == 0);

	/* Typed getters: conversions that fit. */
	uint32_t u32;
	uint64_t u64;
	int64_t s64;
	float f;
	bool b;
	kvt_gguf_str s;
	const kvt_gguf_kv *arr;
	CHECK(kvt_gguf_get_u32(g, "t.u32", &u32) == KVT_OK && u32 == 4000000000u);
	CHECK(kvt_gguf_get_u32(g, "t.u8", &u32) == KVT_OK && u32 == 200);
	CHECK(kvt_gguf_get_u32(g, "t.u16", &u32) == KVT_OK && u32 == 60000);
	CHECK(kvt_gguf_get_u32(g, "t.u64small", &u32) == KVT_OK && u32 == 12);
	CHECK(kvt_gguf_get_u64(g, "t.u64", &u64) == KVT_OK && u64 == UINT64_MAX);
	CHECK(kvt_gguf_get_u64(g, "t.u32", &u64) == KVT_OK && u64 == 4000000000u);
	CHECK(kvt_gguf_get_i64(g, "t.i64", &s64) == KVT_OK && s64 == i64);
	CHECK(kvt_gguf_get_i64(g, "t.i8", &s64) == KVT_OK && s64 == -100);
	CHECK(kvt_gguf_get_i64(g, "t.u32", &s64) == KVT_OK && s64 == 4000000000ll);
	CHECK(kvt_gguf_get_f32(g, "t.f32", &f) == KVT_OK && f == 0.1f);
	CHECK(kvt_gguf_get_f32(g, "t.f64", &f) == KVT_OK && f == (float)f64);
	CHECK(kvt_gguf_get_f32(g, "t.i32", &f) == KVT_OK && f == -7.0f);
	CHECK(kvt_gguf_get_f32(g, "t.u16", &f) == KVT_OK && f == 60000.0f);
	CHECK(kvt_gguf_get_bool(g, "t.bool", &b) == KVT_OK && b);
	CHECK(kvt_gguf_get_str(g, "t.str", &s) == KVT_OK && str_is(s, "hello"));

	/* Absent keys: KVT_ENOTFOUND, not logged, *out untouched. */
	check_log_reset();
	u32 = 77;
	CHECK(kvt_gguf_get_u32(g, "nope", &u32) == KVT_ENOTFOUND && u32 == 77);
	CHECK(kvt_gguf_get_str(g, "nope", &s) == KVT_ENOTFOUND);
	CHECK(kvt_gguf_get_arr(g, "nope", KVT_GGUF_STRING, &arr) == KVT_ENOTFOUND);
	CHECK(check_log_n_errors == 0);

	/* Wrong types and values that do not fit: KVT_EINVAL, logged once naming the key and types. */
	check_log_reset();
	CHECK(kvt_gguf_get_u32(g, "t.str", &u32) == KVT_EINVAL && u32 == 77);
	CHECK(check_log_n_errors == 1 && strstr(check_log_text, "'t.str' has type STRING, expected UINT32"));
	check_log_reset();
	CHECK(kvt_gguf_get_u32(g, "t.u64", &u32) == KVT_EINVAL);
	CHECK(check_log_n_errors == 1 && strstr(check_log_text, "'t.u64'") && strstr(check_log_text, "does not fit UINT32"));
	check_log_reset();
	CHECK(kvt_gguf_get_u32(g, "t.i32", &u32) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "INT32 value -7 does not fit UINT32") != NULL);
	CHECK(kvt_gguf_get_u64(g, "t.i8", &u64) == KVT_EINVAL);
	CHECK(kvt_gguf_get_i64(g, "t.u64", &s64) == KVT_EINVAL);
	CHECK(kvt_gguf_get_i64(g, "t.f32", &s64) == KVT_EINVAL);
	CHECK(kvt_gguf_get_u32(g, "t.bool", &u32) == KVT_EINVAL);
	CHECK(kvt_gguf_get_f32(g, "t.str", &f) == KVT_EINVAL);
	CHECK(kvt_gguf_get_f32(g, "t.bool", &f) == KVT_EINVAL);
	CHECK(kvt_gguf_get_bool(g, "t.u8", &b) == KVT_EINVAL);
	CHECK(kvt_gguf_get_str(g, "t.u32", &s) == KVT_EINVAL);
	check_log_reset();
	CHECK(kvt_gguf_get_str(g, "t.astr", &s) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "'t.astr' has type ARRAY of STRING, expected STRING") != NULL);
	check_log_reset();
	CHECK(kvt_gguf_get_arr(g, "t.ai32", KVT_GGUF_FLOAT32, &arr) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "'t.ai32' has type ARRAY of INT32, expected ARRAY of FLOAT32") != NULL);
	CHECK(kvt_gguf_get_arr(g, "t.u32", KVT_GGUF_UINT32, &arr) == KVT_EINVAL);

	/* Arrays. */
	CHECK(kvt_gguf_get_arr(g, "t.astr", KVT_GGUF_STRING, &arr) == KVT_OK);
	CHECK(arr->n == 3 && arr->arr_type == KVT_GGUF_STRING);
	CHECK(str_is(arr->v.arr.strs[0], "alpha") && arr->v.arr.strs[1].len == 0 &&
	      str_is(arr->v.arr.strs[2], "g\xc3\xa4mma"));
	CHECK(kvt_gguf_get_arr(g, "t.astr0", KVT_GGUF_STRING, &arr) == KVT_OK && arr->n == 0);
	CHECK(kvt_gguf_get_arr(g, "t.ai32", KVT_GGUF_INT32, &arr) == KVT_OK && arr->n == 5);
	for (uint64_t i = 0; i < 5; i++) {
		CHECK(kvt_gguf_arr_i64(arr, i) == ints[i]);
		CHECK(kvt_gguf_arr_f64(arr, i) == (double)ints[i]);
	}
	CHECK(kvt_gguf_get_arr(g, "t.af32", KVT_GGUF_FLOAT32, &arr) == KVT_OK && arr->n == 3);
	for (uint64_t i = 0; i < 3; i++)
		CHECK(kvt_gguf_arr_f64(arr, i) == (double)floats[i]);
	CHECK(kvt_gguf_get_arr(g, "t.au16", KVT_GGUF_UINT16, &arr) == KVT_OK && arr->n == 3);
	CHECK(kvt_gguf_arr_i64(arr, 2) == 65535 && kvt_gguf_arr_f64(arr, 0) == 1.0);
	CHECK(kvt_gguf_get_arr(g, "t.abool", KVT_GGUF_BOOL, &arr) == KVT_OK && arr->n == 2);
	CHECK(kvt_gguf_arr_i64(arr, 0) == 1 && kvt_gguf_arr_i64(arr, 1) == 0);
	kvt_gguf_close(g);
	kvt_gguf_close(NULL);
	unlink(path);
}

/* ---- handcrafted blocks ---- */

/* Byte k of a pattern block is (37k + 11) mod 256 (as in the python reference script). */
static void pattern_block(uint8_t *b, size_t n)
{
	for (size_t k = 0; k < n; k++)
		b[k] = (uint8_t)((k * 37 + 11) & 0xff);
}

static void put16(uint8_t *p, uint16_t v)
{
	memcpy(p, &v, 2);
}

static void test_dequant_blocks(void)
{
	uint8_t q8[34], q41[20], q40[18], q50[22], q4k[144], q5k[176], q6k[210];
	float out[256];

	/* Q8_0: d = 0.5, q[j] = j - 16, with the int8 extremes at both ends. */
	put16(q8, 0x3800);
	for (int j = 0; j < 32; j++)
		q8[2 + j] = (uint8_t)(int8_t)(j - 16);
	q8[2] = (uint8_t)(int8_t)-128;
	q8[2 + 31] = 127;
	CHECK(kvt_ggml_dequantize(KVT_GGML_Q8_0, q8, out, 32) == KVT_OK);
	CHECK(out[0] == -64.0f && out[31] == 63.5f);
	for (int j = 1; j < 31; j++)
		CHECKF(out[j] == (float)(j - 16) * 0.5f, "q8_0 [%d] = %g", j, (double)out[j]);

	/* Q4_1: d = 0.25, m = -1; element j = (j & 15), element j + 16 = 15 - j. */
	put16(q41, 0x3400);
	put16(q41 + 2, 0xbc00);
	for (int j = 0; j < 16; j++)
		q41[4 + j] = (uint8_t)(j | ((15 - j) << 4));
	CHECK(kvt_ggml_dequantize(KVT_GGML_Q4_1, q41, out, 32) == KVT_OK);
	for (int j = 0; j < 16; j++) {
		CHECKF(out[j] == (float)j * 0.25f - 1.0f, "q4_1 [%d] = %g", j, (double)out[j]);
		CHECKF(out[j + 16] == (float)(15 - j) * 0.25f - 1.0f, "q4_1 [%d] = %g", j + 16, (double)out[j + 16]);
	}
	CHECK(out[0] == -1.0f && out[15] == 2.75f && out[16] == 2.75f && out[31] == -1.0f);

	/* Q4_0: d = 2; x = (q - 8) * d. */
	put16(q40, 0x4000);
	for (int j = 0; j < 16; j++)
		q40[2 + j] = (uint8_t)(j | ((15 - j) << 4));
	CHECK(kvt_ggml_dequantize(KVT_GGML_Q4_0, q40, out, 32) == KVT_OK);
	for (int j = 0; j < 16; j++) {
		CHECK(out[j] == (float)(j - 8) * 2.0f);
		CHECK(out[j + 16] == (float)(7 - j) * 2.0f);
	}

	/* F16 and BF16 bit patterns. */
	uint16_t hf[6] = { 0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x3555 };
	CHECK(kvt_ggml_dequantize(KVT_GGML_F16, hf, out, 6) == KVT_OK);
	CHECK(out[0] == 1.0f && out[1] == -2.0f && out[2] == 65504.0f && out[3] == ldexpf(1.0f, -24));
	CHECK(out[4] == 0.0f && signbit(out[4]) && fabsf(out[5] - 0.33325195f) < 1e-7f);
	uint16_t bf[3] = { 0x3f80, 0xc040, 0x4049 };
	CHECK(kvt_ggml_dequantize(KVT_GGML_BF16, bf, out, 3) == KVT_OK);
	CHECK(out[0] == 1.0f && out[1] == -3.0f && out[2] == 3.140625f);

	/* Q4_K and Q6_K pattern blocks against gguf-py (see the file comment). */
	static const int idx[16] = { 0, 1, 15, 16, 31, 32, 33, 63, 64, 100, 127, 128, 160, 200, 223, 255 };
	static const float ref_q4k[16] = { 157.75f, -12.75f, 80.25f, 157.75f, 80.25f, 4.0f, 10.0f, 20.0f,
					   210.25f, 47.5f, 40.5f, 211.5f, 262.5f, 69.25f, 142.75f, 24.25f };
	static const float ref_q6k[16] = { -178.875f, 212.0f, -39.75f, -54.0f, -12.0f, 28.875f, -84.0f, -72.5f,
					   -380.0f, 315.375f, 187.5f, -43.875f, 83.875f, 136.125f, -126.0f, -7.5f };
	pattern_block(q4k, sizeof(q4k));
	put16(q4k, h16(0.5f));
	put16(q4k + 2, h16(0.25f));
	CHECK(kvt_ggml_type_supported(KVT_GGML_Q4_K));
	CHECK(kvt_ggml_dequantize(KVT_GGML_Q4_K, q4k, out, 256) == KVT_OK);
	for (int i = 0; i < 16; i++)
		CHECKF(out[idx[i]] == ref_q4k[i], "q4_K [%d] = %.9g, gguf-py %.9g", idx[i], (double)out[idx[i]],
		       (double)ref_q4k[i]);
	pattern_block(q6k, sizeof(q6k));
	put16(q6k + 208, h16(0.125f));
	CHECK(kvt_ggml_dequantize(KVT_GGML_Q6_K, q6k, out, 256) == KVT_OK);
	for (int i = 0; i < 16; i++)
		CHECKF(out[idx[i]] == ref_q6k[i], "q6_K [%d] = %.9g, gguf-py %.9g", idx[i], (double)out[idx[i]],
		       (double)ref_q6k[i]);


	/* Q5_0 and Q5_K pattern blocks against gguf-py (see the file comment). */
	static const float ref_q50[32] = { 4.5f, -1.0f, 1.5f, -4.0f, 6.5f, -7.0f, 3.5f, -2.0f, -7.5f, 3.0f, -2.5f,
					   0.0f, 2.5f, 5.0f, 7.5f, -6.0f, 7.0f, 0.0f, 1.5f, 2.5f, 3.5f, -3.0f,
					   -2.0f, 7.0f, -7.5f, -6.5f, 2.5f, -4.0f, -3.0f, -2.0f, 7.0f, 0.5f };
	static const float ref_q5k[16] = { 405.75f, -12.75f, 80.25f, 405.75f, 80.25f, 56.0f, -2.0f, 40.0f,
					   210.25f, 117.5f, -1.5f, 523.5f, 82.5f, 69.25f, 534.75f, 54.25f };
	pattern_block(q50, sizeof(q50));
	put16(q50, h16(0.5f));
	CHECK(kvt_ggml_dequantize(KVT_GGML_Q5_0, q50, out, 32) == KVT_OK);
	for (int j = 0; j < 32; j++)
		CHECKF(out[j] == ref_q50[j], "q5_0 [%d] = %.9g, gguf-py %.9g", j, (double)out[j], (double)ref_q50[j]);
	pattern_block(q5k, sizeof(q5k));
	put16(q5k, h16(0.5f));
	put16(q5k + 2, h16(0.25f));
	CHECK(kvt_ggml_dequantize(KVT_GGML_Q5_K, q5k, out, 256) == KVT_OK);
	for (int i = 0; i < 16; i++)
		CHECKF(out[idx[i]] == ref_q5k[i], "q5_K [%d] = %.9g, gguf-py %.9g", idx[i], (double)out[idx[i]],
		       (double)ref_q5k[i]);

	/* Argument errors. */
	check_log_reset();
	CHECK(kvt_ggml_dequantize(KVT_GGML_Q8_0, q8, out, 31) == KVT_EINVAL);
	CHECK(kvt_ggml_dequantize(KVT_GGML_Q3_K, q8, out, 256) == KVT_EUNSUPPORTED);
	CHECK(kvt_ggml_dequantize(99, q8, out, 32) == KVT_EUNSUPPORTED);
	CHECK(check_log_n_errors == 3 && strstr(check_log_text, "type Q3_K is not supported") && strstr(check_log_text, "type99"));
	CHECK(!kvt_ggml_type_supported(KVT_GGML_Q3_K) && !kvt_ggml_type_supported(4));
	uint32_t be, bb;
	CHECK(kvt_ggml_type_block(KVT_GGML_Q5_K, &be, &bb) && be == 256 && bb == 176);
	CHECK(kvt_ggml_type_block(KVT_GGML_Q8_1, &be, &bb) && be == 32 && bb == 36);
	CHECK(kvt_ggml_type_block(KVT_GGML_Q2_K, &be, &bb) && be == 256 && bb == 84);
	CHECK(kvt_ggml_type_block(KVT_GGML_Q3_K, &be, &bb) && be == 256 && bb == 110);
	CHECK(kvt_ggml_type_block(KVT_GGML_Q8_K, &be, &bb) && be == 256 && bb == 292);
	CHECK(!kvt_ggml_type_block(4, &be, &bb) && !kvt_ggml_type_block(1000, &be, &bb));
	CHECK(strcmp(kvt_ggml_type_name(KVT_GGML_Q4_1), "Q4_1") == 0);
	CHECK(strcmp(kvt_ggml_type_name(77), "type77") == 0);
	CHECK(strcmp(kvt_gguf_type_name(KVT_GGUF_FLOAT64), "FLOAT64") == 0);
}

/* ---- quantizers ---- */

static void test_quantize(void)
{
	enum { N = 32 * 64 };
	static float x[N], y[N];
	static uint8_t q[N * 4];
	check_rng r = { 12345 };

	/* Block b has scale 10^(b%5 - 2) and, every third block, an offset. */
	for (int i = 0; i < N; i++) {
		int b = i / 32;
		x[i] = check_rng_f32(&r) * powf(10.0f, (float)(b % 5 - 2)) + (b % 3 == 0 ? 3.0f : 0.0f);
	}
	x[40] = 0.0f; /* keeps a zero inside a block */
	for (int i = 32 * 7; i < 32 * 8; i++)
		x[i] = 0.0f; /* an all-zero block: d = 0 */

	/* Hand-checked Q8_0 block: x = j - 16 gives d = 16/127 and q = round((j - 16) * 127/16). */
	float hx[32];
	for (int j = 0; j < 32; j++)
		hx[j] = (float)(j - 16);
	CHECK(kvt_ggml_quantize(KVT_GGML_Q8_0, hx, q, 32) == KVT_OK);
	uint16_t d16;
	memcpy(&d16, q, 2);
	CHECK(d16 == h16(16.0f / 127.0f));
	CHECK((int8_t)q[2] == -127 && (int8_t)q[2 + 16] == 0 && (int8_t)q[2 + 17] == 8 && (int8_t)q[2 + 31] == 119);
	/* Hand-checked Q4_1 block: x = j gives d = 31/15, m = 0, q = trunc(j * 15/31 + 0.5). */
	for (int j = 0; j < 32; j++)
		hx[j] = (float)j;
	CHECK(kvt_ggml_quantize(KVT_GGML_Q4_1, hx, q, 32) == KVT_OK);
	memcpy(&d16, q, 2);
	CHECK(d16 == h16(31.0f / 15.0f));
	memcpy(&d16, q + 2, 2);
	CHECK(d16 == 0);
	CHECK(q[4] == 0x80 && q[4 + 1] == 0x80 && q[4 + 2] == 0x91 && q[4 + 15] == 0xf7);
	/* Hand-checked Q4_0 block: the largest magnitude is -16, so d = 2 and q = trunc(x/2 + 8.5) <= 15. */
	for (int j = 0; j < 32; j++)
		hx[j] = (float)(j - 16);
	CHECK(kvt_ggml_quantize(KVT_GGML_Q4_0, hx, q, 32) == KVT_OK);
	memcpy(&d16, q, 2);
	CHECK(d16 == h16(2.0f));
	CHECK(q[2] == 0x80 && q[2 + 15] == 0xf8);

	/* Round trips with per-block error bounds. */
	const uint32_t types[] = { KVT_GGML_F32, KVT_GGML_F16, KVT_GGML_BF16, KVT_GGML_Q8_0, KVT_GGML_Q4_0, KVT_GGML_Q4_1 };
	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		uint32_t type = types[t];
		CHECK(kvt_ggml_quantize(type, x, q, N) == KVT_OK);
		CHECK(kvt_ggml_dequantize(type, q, y, N) == KVT_OK);
		int bad = 0;
		for (int b = 0; b < N / 32; b++) {
			float amax = 0, mn = FLT_MAX, mx = -FLT_MAX;
			for (int j = 0; j < 32; j++) {
				amax = fmaxf(amax, fabsf(x[b * 32 + j]));
				mn = fminf(mn, x[b * 32 + j]);
				mx = fmaxf(mx, x[b * 32 + j]);
			}
			for (int j = 0; j < 32; j++) {
				int i = b * 32 + j;
				float err = fabsf(y[i] - x[i]), bound;
				switch (type) {
				case KVT_GGML_F32: bound = 0.0f; break;
				case KVT_GGML_F16: bound = fabsf(x[i]) * 0x1p-11f + 0x1p-25f; break;
				case KVT_GGML_BF16: bound = fabsf(x[i]) * 0x1p-8f; break;
				/* half a step, plus the step's own f16 rounding times the largest q */
				case KVT_GGML_Q8_0: bound = amax / 127 * (0.5f + 127 * 0x1p-11f) + 1e-7f; break;
				/* the value opposite the largest magnitude clamps to 7d instead of 8d: one step */
				case KVT_GGML_Q4_0: bound = amax / 8 * (1.0f + 16 * 0x1p-11f) + 1e-7f; break;
				default: bound = (mx - mn) / 15 * (0.5f + 15 * 0x1p-11f) + fabsf(mn) * 0x1p-11f + 1e-6f; break;
				}
				if (err > bound && bad++ < 3)
					CHECKF(err <= bound, "%s [%d]: x %g y %g err %g > %g", kvt_ggml_type_name(type),
					       i, (double)x[i], (double)y[i], (double)err, (double)bound);
			}
		}
		CHECKF(bad == 0, "%s: %d elements out of bounds", kvt_ggml_type_name(type), bad);
		for (int i = 32 * 7; i < 32 * 8; i++)
			CHECK(y[i] == 0.0f); /* zero block stays exactly zero */
	}

	/* Argument errors. */
	check_log_reset();
	CHECK(kvt_ggml_quantize(KVT_GGML_Q8_0, x, q, 33) == KVT_EINVAL);
	CHECK(kvt_ggml_quantize(KVT_GGML_Q3_K, x, q, 256) == KVT_EUNSUPPORTED);
	x[5] = NAN;
	CHECK(kvt_ggml_quantize(KVT_GGML_Q4_1, x, q, 32) == KVT_EINVAL);
	CHECK(check_log_n_errors == 3 && strstr(check_log_text, "element 5 is not finite"));
	CHECK(kvt_ggml_quantize(KVT_GGML_F32, x, q, 32) == KVT_OK); /* floats keep NaN */
	x[5] = INFINITY;
	CHECK(kvt_ggml_quantize(KVT_GGML_F16, x, q, 32) == KVT_OK);
	CHECK(kvt_ggml_dequantize(KVT_GGML_F16, q, y, 32) == KVT_OK && isinf(y[5]));
}

/* ---- tensors, alignment ---- */

/* Reference Q4_1 dequantization written independently of the library, for the threaded path. */
static float ref_q4_1(const uint8_t *blocks, uint64_t i)
{
	const uint8_t *b = blocks + (i / 32) * 20;
	uint16_t d, m;
	memcpy(&d, b, 2);
	memcpy(&m, b + 2, 2);
	int j = (int)(i % 32);
	int q = j < 16 ? (b[4 + j] & 15) : (b[4 + j - 16] >> 4);
	return (float)q * kvt_f16_to_f32(d) + kvt_f16_to_f32(m);
}

static void write_and_check_tensors(uint32_t alignment)
{
	char path[512];
	kvt_gguf_writer *w;
	kvt_gguf *g = NULL;
	check_rng r = { 99 + alignment };
	enum { BIG_ROWS = 256, BIG_COLS = 512 };
	float f3[3] = { 1.0f, -2.5f, 1e30f };
	float f24[24], f16v[5] = { 1.0f, -0.5f, 65504.0f, 0.099975586f, -3.0f };
	float bfv[4] = { 1.0f, -3.0f, 3.140625f, 1e20f };
	uint64_t ne3[3] = { 4, 3, 2 }, ne1[1] = { 3 }, ne5[1] = { 5 }, ne4[1] = { 4 };
	uint64_t neq[2] = { 64, 3 }, nebig[2] = { BIG_COLS, BIG_ROWS }, ne0[2] = { 0, 4 };
	float *big = malloc(sizeof(float) * BIG_ROWS * BIG_COLS), *out = malloc(sizeof(float) * BIG_ROWS * BIG_COLS);
	float fq[64 * 3];
	uint8_t q8[34], q41[20];

	for (int i = 0; i < 24; i++)
		f24[i] = (float)i * 0.5f - 3.0f;
	for (int i = 0; i < 64 * 3; i++)
		fq[i] = check_rng_f32(&r);
	for (int i = 0; i < BIG_ROWS * BIG_COLS; i++)
		big[i] = check_rng_f32(&r) * 0.1f;
	put16(q8, 0x3800);
	for (int j = 0; j < 32; j++)
		q8[2 + j] = (uint8_t)(int8_t)(j - 16);
	put16(q41, 0x3400);
	put16(q41 + 2, 0xbc00);
	for (int j = 0; j < 16; j++)
		q41[4 + j] = (uint8_t)(j | ((15 - j) << 4));

	snprintf(path, sizeof(path), "%s/tensors_a%u.gguf", tmp_dir, alignment);
	CHECK(kvt_gguf_writer_create(&w) == KVT_OK);
	if (alignment != 32)
		CHECK(kvt_gguf_writer_add_u32(w, "general.alignment", alignment) == KVT_OK);
	CHECK(kvt_gguf_writer_add_str(w, "general.name", "tensors") == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "odd.f32", KVT_GGML_F32, 1, ne1, f3) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "cube.f32", KVT_GGML_F32, 3, ne3, f24) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "v.f16", KVT_GGML_F16, 1, ne5, f16v) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "v.bf16", KVT_GGML_BF16, 1, ne4, bfv) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "m.q8_0", KVT_GGML_Q8_0, 2, neq, fq) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "m.q4_0", KVT_GGML_Q4_0, 2, neq, fq) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "m.q4_1", KVT_GGML_Q4_1, 2, neq, fq) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor(w, "hand.q8_0", KVT_GGML_Q8_0, 1, (uint64_t[]){ 32 }, q8, 34) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor(w, "hand.q4_1", KVT_GGML_Q4_1, 1, (uint64_t[]){ 32 }, q41, 20) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor(w, "empty", KVT_GGML_F32, 2, ne0, NULL, 0) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "big.q4_1", KVT_GGML_Q4_1, 2, nebig, big) == KVT_OK);
	/* Writer rejections. */
	check_log_reset();
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "odd.f32", KVT_GGML_F32, 1, ne1, f3) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "duplicate tensor name 'odd.f32'") != NULL);
	CHECK(kvt_gguf_writer_add_tensor(w, "bad.size", KVT_GGML_Q8_0, 1, (uint64_t[]){ 32 }, q8, 33) == KVT_EINVAL);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "bad.block", KVT_GGML_Q8_0, 1, ne5, f16v) == KVT_EINVAL);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "bad.dims", KVT_GGML_F32, 5, ne3, f24) == KVT_EINVAL);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "bad.type", 4, 1, ne1, f3) == KVT_EINVAL);
	CHECK(check_log_n_errors == 5);
	CHECK(kvt_gguf_writer_write(w, path) == KVT_OK);
	kvt_gguf_writer_destroy(w);

	CHECK(kvt_gguf_open(path, &g) == KVT_OK);
	if (!g)
		goto done;
	CHECK(kvt_gguf_alignment(g) == alignment);
	CHECK(kvt_gguf_n_tensors(g) == 11);
	for (uint64_t i = 0; i < kvt_gguf_n_tensors(g); i++) {
		const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
		CHECKF((uintptr_t)t->data % alignment == 0, "tensor %llu data %p", (unsigned long long)i, t->data);
		CHECK(t->off_data % alignment == 0);
	}
	CHECK(kvt_gguf_find_tensor(g, "odd.f32") == kvt_gguf_tensor_at(g, 0));
	CHECK(kvt_gguf_find_tensor(g, "big.q4_1") == kvt_gguf_tensor_at(g, 10));
	CHECK(kvt_gguf_tensor_at(g, 11) == NULL);
	CHECK(kvt_gguf_find_tensor(g, "nope") == NULL && kvt_gguf_find_tensor(g, "odd.f3") == NULL);

	const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, "odd.f32");
	CHECK(t && t->n_dims == 1 && t->ne[0] == 3 && t->ne[1] == 1 && t->n_elems == 3 && t->n_bytes == 12 &&
	      t->off_data == 0 && t->type == KVT_GGML_F32);
	CHECK(kvt_gguf_tensor_to_f32(g, t, out) == KVT_OK && memcmp(out, f3, sizeof(f3)) == 0);
	t = kvt_gguf_find_tensor(g, "cube.f32");
	CHECK(t && t->n_dims == 3 && t->ne[0] == 4 && t->ne[1] == 3 && t->ne[2] == 2 && t->ne[3] == 1 &&
	      t->n_elems == 24 && t->off_data == alignment);
	CHECK(kvt_gguf_tensor_to_f32(g, t, out) == KVT_OK && memcmp(out, f24, sizeof(f24)) == 0);
	t = kvt_gguf_find_tensor(g, "v.f16");
	CHECK(t && t->n_bytes == 10 && kvt_gguf_tensor_to_f32(g, t, out) == KVT_OK);
	for (int i = 0; i < 5; i++)
		CHECK(out[i] == kvt_f16_to_f32(h16(f16v[i])));
	CHECK(out[0] == 1.0f && out[2] == 65504.0f && out[4] == -3.0f);
	t = kvt_gguf_find_tensor(g, "v.bf16");
	CHECK(t && t->n_bytes == 8 && kvt_gguf_tensor_to_f32(g, t, out) == KVT_OK);
	CHECK(out[0] == 1.0f && out[1] == -3.0f && out[2] == 3.140625f && fabsf(out[3] / 1e20f - 1) < 0x1p-8f);
	t = kvt_gguf_find_tensor(g, "hand.q8_0");
	CHECK(t && t->n_bytes == 34 && kvt_gguf_tensor_to_f32(g, t, out) == KVT_OK);
	for (int j = 0; j < 32; j++)
		CHECK(out[j] == (float)(j - 16) * 0.5f);
	t = kvt_gguf_find_tensor(g, "hand.q4_1");
	CHECK(t && t->n_bytes == 20 && kvt_gguf_tensor_to_f32(g, t, out) == KVT_OK);
	for (int j = 0; j < 16; j++)
		CHECK(out[j] == (float)j * 0.25f - 1.0f && out[j + 16] == (float)(15 - j) * 0.25f - 1.0f);
	const char *qn[3] = { "m.q8_0", "m.q4_0", "m.q4_1" };
	const uint32_t qt[3] = { KVT_GGML_Q8_0, KVT_GGML_Q4_0, KVT_GGML_Q4_1 };
	const uint64_t qb[3] = { 6 * 34, 6 * 18, 6 * 20 };
	for (int k = 0; k < 3; k++) {
		float ref[64 * 3];
		uint8_t enc[6 * 34];
		t = kvt_gguf_find_tensor(g, qn[k]);
		CHECK(t && t->type == qt[k] && t->n_elems == 192 && t->n_bytes == qb[k]);
		if (!t)
			continue;
		/* The stored bytes are exactly what the quantizer produces. */
		CHECK(kvt_ggml_quantize(qt[k], fq, enc, 192) == KVT_OK && memcmp(enc, t->data, qb[k]) == 0);
		CHECK(kvt_ggml_dequantize(qt[k], enc, ref, 192) == KVT_OK);
		CHECK(kvt_gguf_tensor_to_f32(g, t, out) == KVT_OK && memcmp(out, ref, sizeof(ref)) == 0);
	}
	t = kvt_gguf_find_tensor(g, "empty");
	CHECK(t && t->n_elems == 0 && t->n_bytes == 0 && t->ne[0] == 0 && t->ne[1] == 4);
	out[0] = 42.0f;
	CHECK(kvt_gguf_tensor_to_f32(g, t, out) == KVT_OK && out[0] == 42.0f);
	/* A large tensor: the dequantizer must equal an independent scalar decode. */
	t = kvt_gguf_find_tensor(g, "big.q4_1");
	CHECK(t && t->n_elems == (uint64_t)BIG_ROWS * BIG_COLS && kvt_gguf_tensor_to_f32(g, t, out) == KVT_OK);
	int bad = 0;
	for (uint64_t i = 0; t && i < t->n_elems; i++)
		bad += out[i] != ref_q4_1(t->data, i);
	CHECKF(bad == 0, "%d threaded Q4_1 values differ from the scalar reference", bad);
done:
	kvt_gguf_close(g);
	unlink(path);
	free(big);
	free(out);
}

/* Version 2 has the v3 layout; a v3 file with the version patched to 2 opens the same. */
static void test_version2_and_misc(void)
{
	char path[512];
	kvt_gguf_writer *w;
	kvt_gguf *g = NULL;
	float v[2] = { 1, 2 };
	uint64_t ne[1] = { 2 };

	tmp_path(path, sizeof(path), "v2.gguf");
	CHECK(kvt_gguf_writer_create(&w) == KVT_OK);
	CHECK(kvt_gguf_writer_add_tensor_f32(w, "x", KVT_GGML_F32, 1, ne, v) == KVT_OK);
	CHECK(kvt_gguf_writer_write(w, path) == KVT_OK);
	kvt_gguf_writer_destroy(w);
	FILE *f = fopen(path, "r+b");
	uint32_t two = 2;
	CHECK(f && fseek(f, 4, SEEK_SET) == 0 && fwrite(&two, 4, 1, f) == 1);
	if (f)
		fclose(f);
	CHECK(kvt_gguf_open(path, &g) == KVT_OK);
	if (g) {
		CHECK(kvt_gguf_version(g) == 2 && kvt_gguf_n_kv(g) == 0 && kvt_gguf_n_tensors(g) == 1);
		kvt_gguf_close(g);
	}

	/* The same bytes from memory. */
	{
		static uint8_t mem[4096];
		FILE *mf = fopen(path, "rb");
		size_t n = mf ? fread(mem, 1, sizeof(mem), mf) : 0;
		if (mf)
			fclose(mf);
		g = NULL;
		CHECK(n > 64 && kvt_gguf_open_mem(mem, n, "mem:v2", &g) == KVT_OK);
		if (g) {
			const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, "x");
			float o[2];
			CHECK(strcmp(kvt_gguf_path(g), "mem:v2") == 0 && kvt_gguf_version(g) == 2);
			CHECK(t && (const uint8_t *)t->data >= mem && (const uint8_t *)t->data < mem + n);
			CHECK(t && kvt_gguf_tensor_to_f32(g, t, o) == KVT_OK && o[0] == 1.0f && o[1] == 2.0f);
			kvt_gguf_close(g);
		}
		check_log_reset();
		g = NULL;
		CHECK(kvt_gguf_open_mem(mem, 60, "mem:cut", &g) == KVT_ECORRUPT && g == NULL);
		CHECK(check_log_n_errors == 1 && strstr(check_log_text, "mem:cut: truncated"));
		CHECK(kvt_gguf_open_mem(NULL, 0, "mem:empty", &g) == KVT_ECORRUPT && g == NULL);
	}
	unlink(path);

	/* Opening what is not there, or not a file. */
	check_log_reset();
	g = NULL;
	tmp_path(path, sizeof(path), "does-not-exist.gguf");
	CHECK(kvt_gguf_open(path, &g) == KVT_ENOTFOUND && g == NULL);
	CHECK(check_log_n_errors == 1 && strstr(check_log_text, "does-not-exist.gguf: cannot open"));
	check_log_reset();
	CHECK(kvt_gguf_open(tmp_dir, &g) == KVT_EIO && g == NULL);
	CHECK(check_log_n_errors == 1 && strstr(check_log_text, "not a regular file"));
	check_log_reset();
	tmp_path(path, sizeof(path), "no-such-dir/x.gguf");
	CHECK(kvt_gguf_writer_create(&w) == KVT_OK);
	CHECK(kvt_gguf_writer_write(w, path) == KVT_EIO);
	CHECK(check_log_n_errors == 1 && strstr(check_log_text, "cannot create"));
	kvt_gguf_writer_destroy(w);
	kvt_gguf_writer_destroy(NULL);
}

/* ---- the synthetic Llama ---- */

static bool vocab_find(const kvt_gguf_kv *toks, const char *s, size_t len)
{
	for (uint64_t i = 0; i < toks->n; i++)
		if (toks->v.arr.strs[i].len == len && memcmp(toks->v.arr.strs[i].ptr, s, len) == 0)
			return true;
	return false;
}

static void check_synth(const kvt_synth_llama *c, const char *path)
{
	kvt_gguf *g = NULL;
	uint32_t u, n_vocab = kvt_synth_llama_n_vocab(), head_dim = c->n_embd / c->n_head;
	float f;
	kvt_gguf_str s;
	const kvt_gguf_kv *toks, *merges, *types;

	CHECK(kvt_gguf_open(path, &g) == KVT_OK);
	if (!g)
		return;
	CHECK(kvt_gguf_get_str(g, "general.architecture", &s) == KVT_OK && str_is(s, "llama"));
	CHECK(kvt_gguf_get_u32(g, "general.alignment", &u) == KVT_OK && u == 32);
	CHECK(kvt_gguf_get_u32(g, "llama.block_count", &u) == KVT_OK && u == c->n_layer);
	CHECK(kvt_gguf_get_u32(g, "llama.context_length", &u) == KVT_OK && u == c->n_ctx);
	CHECK(kvt_gguf_get_u32(g, "llama.embedding_length", &u) == KVT_OK && u == c->n_embd);
	CHECK(kvt_gguf_get_u32(g, "llama.feed_forward_length", &u) == KVT_OK && u == c->n_ff);
	CHECK(kvt_gguf_get_u32(g, "llama.attention.head_count", &u) == KVT_OK && u == c->n_head);
	CHECK(kvt_gguf_get_u32(g, "llama.attention.head_count_kv", &u) == KVT_OK && u == c->n_head_kv);
	CHECK(kvt_gguf_get_u32(g, "llama.rope.dimension_count", &u) == KVT_OK && u == head_dim);
	CHECK(kvt_gguf_get_u32(g, "llama.vocab_size", &u) == KVT_OK && u == n_vocab);
	CHECK(kvt_gguf_get_f32(g, "llama.rope.freq_base", &f) == KVT_OK && f == (c->rope_base ? c->rope_base : 10000.0f));
	CHECK(kvt_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f) == KVT_OK &&
	      f == (c->rms_eps ? c->rms_eps : 1e-5f));
	CHECK(kvt_gguf_get_str(g, "tokenizer.ggml.model", &s) == KVT_OK && str_is(s, "gpt2"));
	CHECK(kvt_gguf_get_str(g, "tokenizer.ggml.pre", &s) == KVT_OK && str_is(s, "smollm"));
	CHECK(kvt_gguf_get_str(g, "tokenizer.chat_template", &s) == KVT_OK && s.len > 100 &&
	      memmem(s.ptr, s.len, "<|im_start|>assistant\n", 22) != NULL);
	bool add_bos = true;
	CHECK(kvt_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) == KVT_OK && !add_bos);

	/* Tokenizer: byte tokens in bytes_to_unicode form, merges over existing tokens, control tokens last. */
	CHECK(kvt_gguf_get_arr(g, "tokenizer.ggml.tokens", KVT_GGUF_STRING, &toks) == KVT_OK);
	CHECK(kvt_gguf_get_arr(g, "tokenizer.ggml.merges", KVT_GGUF_STRING, &merges) == KVT_OK);
	CHECK(kvt_gguf_get_arr(g, "tokenizer.ggml.token_type", KVT_GGUF_INT32, &types) == KVT_OK);
	if (!toks || !merges || !types)
		goto out;
	CHECK(toks->n == n_vocab && types->n == n_vocab && merges->n >= 30 && n_vocab == 256 + merges->n + 3);
	CHECK(str_is(toks->v.arr.strs[65], "A") && str_is(toks->v.arr.strs[126], "~"));
	CHECK(str_is(toks->v.arr.strs[0], "\xc4\x80"));   /* byte 0 -> U+0100 */
	CHECK(str_is(toks->v.arr.strs[10], "\xc4\x8a"));  /* '\n' -> U+010A 'Ċ' */
	CHECK(str_is(toks->v.arr.strs[32], "\xc4\xa0"));  /* ' ' -> U+0120 'Ġ' */
	CHECK(str_is(toks->v.arr.strs[127], "\xc4\xa1")); /* DEL -> U+0121 */
	CHECK(str_is(toks->v.arr.strs[173], "\xc5\x83")); /* soft hyphen, the last of the 68 -> U+0143 */
	CHECK(str_is(toks->v.arr.strs[161], "\xc2\xa1")); /* printable Latin-1 maps to itself */
	CHECK(str_is(toks->v.arr.strs[256], "\xc4\xa0t") && str_is(merges->v.arr.strs[0], "\xc4\xa0 t"));
	for (uint64_t m = 0; m < merges->n; m++) {
		kvt_gguf_str ms = merges->v.arr.strs[m];
		const char *sp = memchr(ms.ptr, ' ', ms.len);
		CHECK(sp != NULL && sp != ms.ptr && sp != ms.ptr + ms.len - 1);
		if (!sp)
			continue;
		size_t ll = (size_t)(sp - ms.ptr), rl = ms.len - ll - 1;
		char both[128];
		CHECK(vocab_find(toks, ms.ptr, ll) && vocab_find(toks, sp + 1, rl));
		memcpy(both, ms.ptr, ll);
		memcpy(both + ll, sp + 1, rl);
		/* merge m's result is token 256 + m */
		CHECK(toks->v.arr.strs[256 + m].len == ll + rl &&
		      memcmp(toks->v.arr.strs[256 + m].ptr, both, ll + rl) == 0);
	}
	CHECK(str_is(toks->v.arr.strs[n_vocab - 3], "<|endoftext|>"));
	CHECK(str_is(toks->v.arr.strs[n_vocab - 2], "<|im_start|>"));
	CHECK(str_is(toks->v.arr.strs[n_vocab - 1], "<|im_end|>"));
	for (uint64_t i = 0; i < n_vocab; i++)
		CHECK(kvt_gguf_arr_i64(types, i) == (i >= n_vocab - 3 ? 3 : 1));
	CHECK(kvt_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u) == KVT_OK && u == n_vocab - 2);
	CHECK(kvt_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u) == KVT_OK && u == n_vocab - 1);

	/* Tensors: names, ggml shapes, types, sane values. */
	uint64_t n_t = 2 + 9ull * c->n_layer + (c->tied_embeddings ? 0 : 1);
	CHECK(kvt_gguf_n_tensors(g) == n_t);
	CHECK((kvt_gguf_find_tensor(g, "output.weight") == NULL) == c->tied_embeddings);
	const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, "token_embd.weight");
	CHECK(t && t->n_dims == 2 && t->ne[0] == c->n_embd && t->ne[1] == n_vocab && t->type == c->weight_type);
	t = kvt_gguf_find_tensor(g, "blk.1.attn_k.weight");
	CHECK(t && t->ne[0] == c->n_embd && t->ne[1] == c->n_head_kv * head_dim);
	t = kvt_gguf_find_tensor(g, "blk.1.ffn_down.weight");
	CHECK(t && t->ne[0] == c->n_ff && t->ne[1] == c->n_embd);
	t = kvt_gguf_find_tensor(g, "blk.0.ffn_norm.weight");
	CHECK(t && t->n_dims == 1 && t->ne[0] == c->n_embd && t->type == KVT_GGML_F32);
	for (uint64_t i = 0; i < n_t; i++) {
		t = kvt_gguf_tensor_at(g, i);
		float *x = malloc(t->n_elems * sizeof(float));
		CHECK(kvt_gguf_tensor_to_f32(g, t, x) == KVT_OK);
		float mx = 0, mn = FLT_MAX;
		for (uint64_t k = 0; k < t->n_elems; k++) {
			mx = fmaxf(mx, fabsf(x[k]));
			mn = fminf(mn, x[k]);
		}
		if (t->n_dims == 1)
			CHECKF(mn >= 0.85f && mx <= 1.15f, "%.*s: norm weights in [%g, %g]", (int)t->name.len, t->name.ptr,
			       (double)mn, (double)mx);
		else
			CHECKF(mx > 0.01f && mx <= 1.01f, "%.*s: max |w| %g", (int)t->name.len, t->name.ptr, (double)mx);
		free(x);
	}
out:
	kvt_gguf_close(g);
}

static void test_synth(void)
{
	char p32[512], p8[512], pbad[512];
	kvt_synth_llama c, c8;

	kvt_synth_llama_default(&c);
	CHECK(c.n_layer == 2 && c.n_embd == 64 && c.n_head == 4 && c.n_head_kv == 2 && c.n_ff == 128 &&
	      c.n_ctx == 512 && c.weight_type == KVT_GGML_F32 && c.tied_embeddings && c.seed == 1);
	tmp_path(p32, sizeof(p32), "synth_f32.gguf");
	CHECK(kvt_synth_llama_write(&c, p32) == KVT_OK);
	check_synth(&c, p32);

	c8 = c;
	c8.weight_type = KVT_GGML_Q8_0;
	c8.tied_embeddings = false;
	c8.n_layer = 3;
	c8.rope_base = 500000.0f;
	tmp_path(p8, sizeof(p8), "synth_q8.gguf");
	CHECK(kvt_synth_llama_write(&c8, p8) == KVT_OK);
	check_synth(&c8, p8);

	/* Same seed: a tensor's floats do not depend on weight_type or layer count. */
	kvt_gguf *a = NULL, *b = NULL;
	CHECK(kvt_gguf_open(p32, &a) == KVT_OK && kvt_gguf_open(p8, &b) == KVT_OK);
	if (a && b) {
		const kvt_gguf_tensor *ta = kvt_gguf_find_tensor(a, "blk.1.attn_q.weight");
		const kvt_gguf_tensor *tb = kvt_gguf_find_tensor(b, "blk.1.attn_q.weight");
		float *xa = malloc(ta->n_elems * 4), *xb = malloc(tb->n_elems * 4);
		float amax = 0, emax = 0;
		CHECK(kvt_gguf_tensor_to_f32(a, ta, xa) == KVT_OK && kvt_gguf_tensor_to_f32(b, tb, xb) == KVT_OK);
		for (uint64_t i = 0; i < ta->n_elems; i++) {
			amax = fmaxf(amax, fabsf(xa[i]));
			emax = fmaxf(emax, fabsf(xa[i] - xb[i]));
		}
		CHECKF(emax <= amax / 127 * 0.6f, "F32 vs Q8_0 differ by %g (amax %g)", (double)emax, (double)amax);
		free(xa);
		free(xb);
	}
	kvt_gguf_close(a);
	kvt_gguf_close(b);

	/* Bad configs are rejected before anything is written. */
	tmp_path(pbad, sizeof(pbad), "synth_bad.gguf");
	kvt_synth_llama bad = c;
	check_log_reset();
	bad.n_head = 3;
	CHECK(kvt_synth_llama_write(&bad, pbad) == KVT_EINVAL);
	bad = c;
	bad.n_head_kv = 3;
	CHECK(kvt_synth_llama_write(&bad, pbad) == KVT_EINVAL);
	bad = c;
	bad.weight_type = KVT_GGML_Q8_0;
	bad.n_ff = 48;
	CHECK(kvt_synth_llama_write(&bad, pbad) == KVT_EINVAL);
	bad = c;
	bad.weight_type = KVT_GGML_Q5_K;
	CHECK(kvt_synth_llama_write(&bad, pbad) == KVT_EINVAL);
	bad = c;
	bad.n_layer = 0;
	CHECK(kvt_synth_llama_write(&bad, pbad) == KVT_EINVAL);
	CHECK(check_log_n_errors == 5 && access(pbad, F_OK) != 0);
	unlink(p32);
	unlink(p8);
}

/* The inputs of tests/ref/quant_ref.py, bit for bit (its docstring has the recipe). */
static void quant_ref_inputs(float *x)
{
	uint64_t s = 0x9E3779B97F4A7C15ull;
	for (int i = 0; i < 4096; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		int64_t v = (int64_t)(s >> 40);
		int sb = i / 256, e = (int[]){ 0, 1, -1, 2 }[sb % 4];
		int64_t off = sb % 5 == 3 ? 1 << 22 : 0;
		x[i] = sb == 7 ? 0.0f : ldexpf((float)(v - (1 << 23) + off), e - 23);
	}
}

static void test_quantize_vs_ggml(void)
{
	static float x[4096], y[4096];
	static uint8_t q[4096], want[4096];
	static const struct { uint32_t type; const char *hex; } cases[] = {
		{ KVT_GGML_Q5_0, quant_ref_q5_0 }, { KVT_GGML_Q4_K, quant_ref_q4_k },
		{ KVT_GGML_Q5_K, quant_ref_q5_k }, { KVT_GGML_Q6_K, quant_ref_q6_k } };
	quant_ref_inputs(x);
	for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
		uint32_t be, bb;
		KVT_ASSERT(kvt_ggml_type_block(cases[c].type, &be, &bb));
		const size_t n = 4096 / be * bb;
		CHECK_EQ_INT((int)strlen(cases[c].hex), (int)(2 * n));
		for (size_t i = 0; i < n; i++) {
			unsigned v;
			sscanf(cases[c].hex + 2 * i, "%2x", &v);
			want[i] = (uint8_t)v;
		}
		CHECK(kvt_ggml_quantize(cases[c].type, x, q, 4096) == KVT_OK);
		size_t bad = 0, first = n;
		for (size_t i = 0; i < n; i++)
			if (q[i] != want[i] && bad++ == 0)
				first = i;
		CHECKF(bad == 0, "%s: %zu bytes differ from ggml's (first at byte %zu, block %zu)",
		       kvt_ggml_type_name(cases[c].type), bad, first, first / bb);
		/* and the round trip stays within a few of the block's steps */
		CHECK(kvt_ggml_dequantize(cases[c].type, q, y, 4096) == KVT_OK);
		double num = 0, den = 0;
		for (int i = 0; i < 4096; i++)
			num += (double)(y[i] - x[i]) * (y[i] - x[i]), den += (double)x[i] * x[i];
		CHECKF(num / den < 5e-3, "%s: round trip nmse %g", kvt_ggml_type_name(cases[c].type), num / den);
		for (int i = 7 * 256; i < 8 * 256; i++)
			CHECK(y[i] == 0.0f); /* the zero superblock stays zero */
	}
}

int main(void)
{
	const char *base = getenv("TMPDIR");

	snprintf(tmp_dir, sizeof(tmp_dir), "%s/kvt_gguf_reader_XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(tmp_dir)) {
		perror("mkdtemp");
		return 1;
	}
	kvt_log_set_sink(check_log_sink, NULL);
	test_metadata();
	test_dequant_blocks();
	test_quantize();
	test_quantize_vs_ggml();
	write_and_check_tensors(32);
	write_and_check_tensors(64);
	write_and_check_tensors(4096);
	test_version2_and_misc();
	test_synth();
	kvt_log_set_sink(NULL, NULL);
	rmdir(tmp_dir);
	return check_done("test_gguf_reader");
}
