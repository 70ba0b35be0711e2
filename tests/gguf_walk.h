/*
 * tests/gguf_walk.h — read everything an opened GGUF exposes: every key and
 * value, every string of every array, a lookup by name of each key, and the
 * dequantized data of each loadable tensor (up to 16M elements). Shared by
 * the corrupt-file test and the fuzzer: whatever opened must survive this.
 */
#ifndef KVT_GGUF_WALK_H
#define KVT_GGUF_WALK_H

#include "gguf.h"

#include <stdlib.h>
#include <string.h>

/* Returns a value derived from every byte read, so nothing is optimised away. */
static inline double gguf_walk(const kvt_gguf *g)
{
	double sink = 0;

	for (uint64_t i = 0; i < kvt_gguf_n_kv(g); i++) {
		const kvt_gguf_kv *kv = kvt_gguf_kv_at(g, i);
		sink += (double)kv->key.ptr[kv->key.len - 1];
		if (kv->type == KVT_GGUF_STRING && kv->v.str.len)
			sink += (double)kv->v.str.ptr[kv->v.str.len - 1];
		for (uint64_t j = 0; kv->type == KVT_GGUF_ARRAY && j < kv->n; j++) {
			if (kv->arr_type != KVT_GGUF_STRING)
				sink += kvt_gguf_arr_f64(kv, j);
			else if (kv->v.arr.strs[j].len)
				sink += (double)kv->v.arr.strs[j].ptr[0] + kv->v.arr.strs[j].ptr[kv->v.arr.strs[j].len - 1];
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
	return sink;
}

#endif
