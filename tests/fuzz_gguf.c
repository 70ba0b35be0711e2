/*
 * tests/fuzz_gguf.c — libFuzzer target for the GGUF reader.
 *
 * Each input is parsed from memory (kvt_gguf_open_mem, the same parser as
 * kvt_gguf_open); when it opens, every key, array element and tensor is read
 * and every supported tensor up to 16M elements is dequantized, so the
 * sanitizers see any access the reader's checks let through. Errors go to a
 * silent log sink.
 *
 * Build and run by hand (not part of CTest):
 *   clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -Icore -Iengine \
 *     tests/fuzz_gguf.c engine/gguf.c core/log.c core/half.c -lm -lpthread -o fuzz_gguf
 *   mkdir -p corpus && ./fuzz_gguf -max_total_time=60 corpus
 * A crashing input goes into tests/data/gguf_regress/, which
 * test_gguf_corrupt replays.
 */
#include "gguf.h"

#include <stdlib.h>
#include <string.h>

static void quiet(int level, const char *msg, void *user)
{
	(void)level;
	(void)msg;
	(void)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	volatile double sink = 0;
	kvt_gguf *g = NULL;

	if (!init) {
		kvt_log_set_sink(quiet, NULL);
		init = 1;
	}
	if (kvt_gguf_open_mem(data, size, "fuzz", &g) != KVT_OK)
		return 0;
	for (uint64_t i = 0; i < kvt_gguf_n_kv(g); i++) {
		const kvt_gguf_kv *kv = kvt_gguf_kv_at(g, i);
		sink += (double)kv->key.ptr[kv->key.len - 1];
		if (kv->type == KVT_GGUF_STRING && kv->v.str.len)
			sink += (double)kv->v.str.ptr[kv->v.str.len - 1];
		if (kv->type != KVT_GGUF_ARRAY)
			continue;
		for (uint64_t j = 0; j < kv->n; j++) {
			if (kv->arr_type == KVT_GGUF_STRING) {
				if (kv->v.arr.strs[j].len)
					sink += (double)kv->v.arr.strs[j].ptr[0] + kv->v.arr.strs[j].ptr[kv->v.arr.strs[j].len - 1];
			} else {
				sink += kvt_gguf_arr_f64(kv, j);
			}
		}
		/* lookups by name go through the hash index */
		char key[64];
		size_t n = kv->key.len < sizeof(key) - 1 ? kv->key.len : sizeof(key) - 1;
		memcpy(key, kv->key.ptr, n);
		key[n] = '\0';
		sink += kvt_gguf_find_kv(g, key) != NULL;
	}
	for (uint64_t i = 0; i < kvt_gguf_n_tensors(g); i++) {
		const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
		if (!kvt_ggml_type_supported(t->type) || t->n_elems > (1u << 24))
			continue;
		float *x = malloc((t->n_elems ? t->n_elems : 1) * sizeof(float));
		if (x && kvt_gguf_tensor_to_f32(g, t, x) == KVT_OK && t->n_elems)
			sink += x[0] + x[t->n_elems - 1];
		free(x);
	}
	(void)sink;
	kvt_gguf_close(g);
	return 0;
}
