/*
 * tests/gguf_copy.h — copy one metadata key/value of an opened GGUF into a
 * writer (the types real models use: u32, i32, u64, f32, bool, string, and
 * arrays of strings, i32 and f32). Shared by the tests and benches that
 * rewrite a real model (test_model_load's mutants, bench_quant's requantized
 * copies). Returns KVT_OK, the writer's error, or KVT_EINVAL (logged, naming
 * the key) for a type it does not copy.
 */
#ifndef KVT_TEST_GGUF_COPY_H
#define KVT_TEST_GGUF_COPY_H

#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* key: kv's key as a C string (the caller's copy, so it can match on it first). */
static inline int gguf_copy_kv(kvt_gguf_writer *w, const char *key, const kvt_gguf_kv *kv)
{
	switch (kv->type) {
	case KVT_GGUF_UINT32: return kvt_gguf_writer_add_u32(w, key, (uint32_t)kv->v.u64);
	case KVT_GGUF_INT32: return kvt_gguf_writer_add_i32(w, key, (int32_t)kv->v.i64);
	case KVT_GGUF_UINT64: return kvt_gguf_writer_add_u64(w, key, kv->v.u64);
	case KVT_GGUF_FLOAT32: return kvt_gguf_writer_add_f32(w, key, (float)kv->v.f64);
	case KVT_GGUF_BOOL: return kvt_gguf_writer_add_bool(w, key, kv->v.b);
	case KVT_GGUF_STRING: {
		char *v = strndup(kv->v.str.ptr, kv->v.str.len);
		int rc = v ? kvt_gguf_writer_add_str(w, key, v) : KVT_ENOMEM;
		free(v);
		return rc;
	}
	case KVT_GGUF_ARRAY:
		if (kv->arr_type == KVT_GGUF_STRING) {
			char **v = calloc(kv->n, sizeof(*v));
			int rc = v ? KVT_OK : KVT_ENOMEM;
			for (uint64_t i = 0; v && i < kv->n; i++)
				if (!(v[i] = strndup(kv->v.arr.strs[i].ptr, kv->v.arr.strs[i].len)))
					rc = KVT_ENOMEM;
			if (rc == KVT_OK)
				rc = kvt_gguf_writer_add_arr_str(w, key, (const char *const *)v, kv->n);
			for (uint64_t i = 0; v && i < kv->n; i++)
				free(v[i]);
			free(v);
			return rc;
		}
		if (kv->arr_type == KVT_GGUF_INT32)
			return kvt_gguf_writer_add_arr_i32(w, key, kv->v.arr.data, kv->n);
		if (kv->arr_type == KVT_GGUF_FLOAT32)
			return kvt_gguf_writer_add_arr_f32(w, key, kv->v.arr.data, kv->n);
		break;
	}
	fprintf(stderr, "gguf_copy_kv: %s: metadata type %u/%u not copied\n", key, kv->type, kv->arr_type);
	return KVT_EINVAL;
}

#endif
