/*
 * engine/model/gguf_writer.c — the GGUF v3 writer: the synthetic models
 * (synth_model.c), tests and benchmarks build their files with it.
 *
 * Metadata is encoded as it is added, into one growable buffer in the file's
 * own byte layout, so writing is a header, that buffer, the tensor infos and
 * the data section; tensors keep an owned copy of their encoded bytes until
 * then. Tensor types and block sizes come from the ggml type table
 * (gguf_quant.c, gguf_int.h), and add_tensor_f32 quantizes with
 * kvt_ggml_quantize(), so a file written here holds llama.cpp's bytes.
 *
 * Invariants: keys and tensor names are non-empty and unique (checked on
 * add); a key/value whose value fails to encode is rolled back out of the
 * buffer (kv_end) and not counted; the alignment is a nonzero power of two (32 unless general.alignment is
 * added as a u32; add_raw never changes it, so tests can write a bad one);
 * every tensor's data starts aligned within the data section, padding is
 * zeros, and the file ends padded to the alignment, as gguf-py writes it.
 */
#include "gguf_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct wtensor {
	char *name;                   /* owned */
	uint32_t type;                /* enum kvt_ggml_type */
	uint32_t n_dims;              /* 1..4 */
	uint64_t ne[KVT_GGUF_MAX_DIMS]; /* unused dims 1 */
	uint8_t *data;                /* owned, n_bytes */
	uint64_t n_bytes;             /* encoded size */
	uint64_t off_data;            /* offset in the data section, set by write */
} wtensor;

struct kvt_gguf_writer {
	uint8_t *kv_buf;     /* every key/value, encoded as in the file, in add order */
	size_t kv_len;       /* bytes used in kv_buf */
	size_t kv_cap;       /* bytes allocated */
	char **keys;         /* [n_kv] owned copies, for duplicate checks */
	uint64_t n_kv;       /* keys added */
	uint64_t cap_kv;     /* keys allocated */
	wtensor *tensors;    /* [n_tensors] in add order = file order */
	uint64_t n_tensors;  /* tensors added */
	uint64_t cap_tensors; /* tensors allocated */
	uint32_t alignment;  /* from add_u32("general.alignment"), else 32 */
};

int kvt_gguf_writer_create(kvt_gguf_writer **out)
{
	kvt_gguf_writer *w = calloc(1, sizeof(*w));

	if (!w) {
		KVT_LOGE("gguf writer: out of memory");
		return KVT_ENOMEM;
	}
	w->alignment = KVT_GGUF_DEFAULT_ALIGNMENT;
	*out = w;
	return KVT_OK;
}

void kvt_gguf_writer_destroy(kvt_gguf_writer *w)
{
	if (!w)
		return;
	for (uint64_t i = 0; i < w->n_kv; i++)
		free(w->keys[i]);
	for (uint64_t i = 0; i < w->n_tensors; i++) {
		free(w->tensors[i].name);
		free(w->tensors[i].data);
	}
	free(w->keys);
	free(w->tensors);
	free(w->kv_buf);
	free(w);
}

static int wbuf_put(kvt_gguf_writer *w, const void *p, size_t n)
{
	if (w->kv_cap - w->kv_len < n) {
		size_t cap = w->kv_cap ? w->kv_cap : 4096;
		while (cap - w->kv_len < n) {
			if (cap > SIZE_MAX / 2)
				return KVT_ENOMEM;
			cap *= 2;
		}
		uint8_t *nb = realloc(w->kv_buf, cap);
		if (!nb)
			return KVT_ENOMEM;
		w->kv_buf = nb;
		w->kv_cap = cap;
	}
	memcpy(w->kv_buf + w->kv_len, p, n);
	w->kv_len += n;
	return KVT_OK;
}

static int wbuf_u32(kvt_gguf_writer *w, uint32_t v)
{
	return wbuf_put(w, &v, 4);
}

static int wbuf_u64(kvt_gguf_writer *w, uint64_t v)
{
	return wbuf_put(w, &v, 8);
}

static int wbuf_str(kvt_gguf_writer *w, const char *s)
{
	size_t n = strlen(s);
	int rc = wbuf_u64(w, n);

	return rc ? rc : wbuf_put(w, s, n);
}

/*
 * Start a kv: check the key, remember it, write key and type. On failure the
 * buffer is rolled back by the caller through kv_end(w, mark, rc).
 */
static int kv_begin(kvt_gguf_writer *w, const char *key, uint32_t type, size_t *mark)
{
	int rc;

	if (!key || !*key) {
		KVT_LOGE("gguf writer: empty key");
		return KVT_EINVAL;
	}
	for (uint64_t i = 0; i < w->n_kv; i++) {
		if (strcmp(w->keys[i], key) == 0) {
			KVT_LOGE("gguf writer: duplicate key '%s'", key);
			return KVT_EINVAL;
		}
	}
	if (w->n_kv == w->cap_kv) {
		uint64_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
		char **nk = realloc(w->keys, cap * sizeof(*nk));
		if (!nk)
			goto nomem;
		w->keys = nk;
		w->cap_kv = cap;
	}
	*mark = w->kv_len;
	if ((rc = wbuf_str(w, key)) || (rc = wbuf_u32(w, type)))
		goto nomem;
	return KVT_OK;
nomem:
	KVT_LOGE("gguf writer: out of memory adding key '%s'", key);
	return KVT_ENOMEM;
}

/* Finish a kv begun with kv_begin: keep it (rc == OK) or roll the buffer back. */
static int kv_end(kvt_gguf_writer *w, const char *key, size_t mark, int rc)
{
	char *k;

	if (rc == KVT_OK && (k = strdup(key))) {
		w->keys[w->n_kv++] = k;
		return KVT_OK;
	}
	w->kv_len = mark;
	if (rc == KVT_OK || rc == KVT_ENOMEM) {
		KVT_LOGE("gguf writer: out of memory adding key '%s'", key);
		return KVT_ENOMEM;
	}
	return rc;
}

static int add_scalar(kvt_gguf_writer *w, const char *key, uint32_t type, const void *v, size_t n)
{
	size_t mark;
	int rc = kv_begin(w, key, type, &mark);

	if (rc)
		return rc;
	return kv_end(w, key, mark, wbuf_put(w, v, n));
}

int kvt_gguf_writer_add_u32(kvt_gguf_writer *w, const char *key, uint32_t v)
{
	bool is_align = key && strcmp(key, "general.alignment") == 0;

	if (is_align && (v == 0 || (v & (v - 1)))) {
		KVT_LOGE("gguf writer: general.alignment %u is not a nonzero power of two", v);
		return KVT_EINVAL;
	}
	int rc = add_scalar(w, key, KVT_GGUF_UINT32, &v, 4);
	if (rc == KVT_OK && is_align)
		w->alignment = v;
	return rc;
}

int kvt_gguf_writer_add_i32(kvt_gguf_writer *w, const char *key, int32_t v)
{
	return add_scalar(w, key, KVT_GGUF_INT32, &v, 4);
}

int kvt_gguf_writer_add_u64(kvt_gguf_writer *w, const char *key, uint64_t v)
{
	return add_scalar(w, key, KVT_GGUF_UINT64, &v, 8);
}

int kvt_gguf_writer_add_f32(kvt_gguf_writer *w, const char *key, float v)
{
	return add_scalar(w, key, KVT_GGUF_FLOAT32, &v, 4);
}

int kvt_gguf_writer_add_bool(kvt_gguf_writer *w, const char *key, bool v)
{
	uint8_t b = v ? 1 : 0;

	return add_scalar(w, key, KVT_GGUF_BOOL, &b, 1);
}

int kvt_gguf_writer_add_str(kvt_gguf_writer *w, const char *key, const char *v)
{
	size_t mark;
	int rc = kv_begin(w, key, KVT_GGUF_STRING, &mark);

	if (rc)
		return rc;
	return kv_end(w, key, mark, wbuf_str(w, v));
}

/* Array header (element type, count) then n elements of elem_bytes each. */
static int add_arr(kvt_gguf_writer *w, const char *key, uint32_t elem, const void *v, uint64_t n,
		   size_t elem_bytes)
{
	size_t mark;
	int rc = kv_begin(w, key, KVT_GGUF_ARRAY, &mark);

	if (rc)
		return rc;
	if (n > SIZE_MAX / elem_bytes)
		return kv_end(w, key, mark, KVT_ENOMEM);
	if (!(rc = wbuf_u32(w, elem)) && !(rc = wbuf_u64(w, n)))
		rc = wbuf_put(w, v, (size_t)n * elem_bytes);
	return kv_end(w, key, mark, rc);
}

int kvt_gguf_writer_add_arr_i32(kvt_gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
	return add_arr(w, key, KVT_GGUF_INT32, v, n, 4);
}

int kvt_gguf_writer_add_arr_f32(kvt_gguf_writer *w, const char *key, const float *v, uint64_t n)
{
	return add_arr(w, key, KVT_GGUF_FLOAT32, v, n, 4);
}

int kvt_gguf_writer_add_arr_str(kvt_gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
	size_t mark;
	int rc = kv_begin(w, key, KVT_GGUF_ARRAY, &mark);

	if (rc)
		return rc;
	if (!(rc = wbuf_u32(w, KVT_GGUF_STRING)))
		rc = wbuf_u64(w, n);
	for (uint64_t i = 0; i < n && rc == KVT_OK; i++)
		rc = wbuf_str(w, v[i]);
	return kv_end(w, key, mark, rc);
}

int kvt_gguf_writer_copy_kv(kvt_gguf_writer *w, const char *key, const kvt_gguf_kv *kv)
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
			char **v = calloc(kv->n ? kv->n : 1, sizeof(*v));
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
	KVT_LOGE("gguf writer: %s: metadata type %u/%u is not copied", key, kv->type, kv->arr_type);
	return KVT_EINVAL;
}

int kvt_gguf_writer_add_raw(kvt_gguf_writer *w, const char *key, uint32_t type, const void *bytes,
			    uint64_t n_bytes)
{
	size_t mark;
	int rc = kv_begin(w, key, type, &mark);

	if (rc)
		return rc;
	return kv_end(w, key, mark, n_bytes > SIZE_MAX ? KVT_ENOMEM : wbuf_put(w, bytes, (size_t)n_bytes));
}

/* Validate a tensor's name, shape and type; *n_bytes is its encoded size. */
static int tensor_check(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
			const uint64_t *ne, uint64_t *n_bytes, uint64_t *n_elems)
{
	const kvt_ggml_traits *ti = kvt_ggml_traits_of(type);
	uint64_t n = 1;

	if (!name || !*name) {
		KVT_LOGE("gguf writer: empty tensor name");
		return KVT_EINVAL;
	}
	for (uint64_t i = 0; i < w->n_tensors; i++) {
		if (strcmp(w->tensors[i].name, name) == 0) {
			KVT_LOGE("gguf writer: duplicate tensor name '%s'", name);
			return KVT_EINVAL;
		}
	}
	if (!ti) {
		KVT_LOGE("gguf writer: tensor '%s': unknown ggml type %u", name, type);
		return KVT_EINVAL;
	}
	if (n_dims < 1 || n_dims > KVT_GGUF_MAX_DIMS) {
		KVT_LOGE("gguf writer: tensor '%s': n_dims %u (expected 1..%d)", name, n_dims, KVT_GGUF_MAX_DIMS);
		return KVT_EINVAL;
	}
	for (uint32_t d = 0; d < n_dims; d++) {
		if (!kvt_mul_u64(n, ne[d], &n) || n > (uint64_t)INT64_MAX) {
			KVT_LOGE("gguf writer: tensor '%s': element count overflows", name);
			return KVT_EINVAL;
		}
	}
	if (ne[0] % ti->block_elems) {
		KVT_LOGE("gguf writer: tensor '%s': ne[0] = %llu is not a multiple of the %s block size %u",
			 name, (unsigned long long)ne[0], ti->name, ti->block_elems);
		return KVT_EINVAL;
	}
	if (!kvt_mul_u64(n / ti->block_elems, ti->block_bytes, n_bytes) || *n_bytes > SIZE_MAX) {
		KVT_LOGE("gguf writer: tensor '%s': byte size overflows", name);
		return KVT_EINVAL;
	}
	*n_elems = n;
	return KVT_OK;
}

/* Append a tensor whose data buffer (malloc'd, n_bytes) the writer takes over. */
static int tensor_push(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
		       const uint64_t *ne, uint8_t *data, uint64_t n_bytes)
{
	wtensor *t;
	char *nm = strdup(name);

	if (!nm)
		goto nomem;
	if (w->n_tensors == w->cap_tensors) {
		uint64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
		wtensor *nt = realloc(w->tensors, cap * sizeof(*nt));
		if (!nt)
			goto nomem;
		w->tensors = nt;
		w->cap_tensors = cap;
	}
	t = &w->tensors[w->n_tensors++];
	memset(t, 0, sizeof(*t));
	t->name = nm;
	t->type = type;
	t->n_dims = n_dims;
	for (uint32_t d = 0; d < KVT_GGUF_MAX_DIMS; d++)
		t->ne[d] = d < n_dims ? ne[d] : 1;
	t->data = data;
	t->n_bytes = n_bytes;
	return KVT_OK;
nomem:
	KVT_LOGE("gguf writer: out of memory adding tensor '%s'", name);
	free(nm);
	free(data);
	return KVT_ENOMEM;
}

int kvt_gguf_writer_add_tensor(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
			       const uint64_t *ne, const void *data, uint64_t n_bytes)
{
	uint64_t want, n_elems;
	int rc = tensor_check(w, name, type, n_dims, ne, &want, &n_elems);

	if (rc)
		return rc;
	if (n_bytes != want) {
		KVT_LOGE("gguf writer: tensor '%s': %llu bytes given, %s with %llu elements needs %llu",
			 name, (unsigned long long)n_bytes, kvt_ggml_type_name(type),
			 (unsigned long long)n_elems, (unsigned long long)want);
		return KVT_EINVAL;
	}
	uint8_t *copy = malloc(n_bytes ? (size_t)n_bytes : 1);
	if (!copy) {
		KVT_LOGE("gguf writer: out of memory for %llu bytes of tensor '%s'", (unsigned long long)n_bytes, name);
		return KVT_ENOMEM;
	}
	if (n_bytes)
		memcpy(copy, data, (size_t)n_bytes);
	return tensor_push(w, name, type, n_dims, ne, copy, n_bytes);
}

int kvt_gguf_writer_add_tensor_f32(kvt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
				   const uint64_t *ne, const float *data)
{
	uint64_t n_bytes, n_elems;
	int rc = tensor_check(w, name, type, n_dims, ne, &n_bytes, &n_elems);

	if (rc)
		return rc;
	uint8_t *q = malloc(n_bytes ? (size_t)n_bytes : 1);
	if (!q) {
		KVT_LOGE("gguf writer: out of memory for %llu bytes of tensor '%s'", (unsigned long long)n_bytes, name);
		return KVT_ENOMEM;
	}
	if ((rc = kvt_ggml_quantize(type, data, q, n_elems))) {
		free(q);
		return rc;
	}
	return tensor_push(w, name, type, n_dims, ne, q, n_bytes);
}

/* Write n zero bytes. */
static bool put_zeros(FILE *f, uint64_t n)
{
	static const uint8_t zeros[256];

	while (n) {
		size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
		if (fwrite(zeros, 1, k, f) != k)
			return false;
		n -= k;
	}
	return true;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) & ~(a - 1);
}

int kvt_gguf_writer_write(kvt_gguf_writer *w, const char *path)
{
	uint64_t a = w->alignment, off = 0, pos;
	uint32_t version = 3;
	bool ok;
	FILE *f;

	/* Offsets first: each tensor starts aligned within the data section. */
	for (uint64_t i = 0; i < w->n_tensors; i++) {
		off = align_up(off, a);
		w->tensors[i].off_data = off;
		off += w->tensors[i].n_bytes;
	}
	f = fopen(path, "wb");
	if (!f) {
		KVT_LOGE("%s: cannot create: %s", path, strerror(errno));
		return KVT_EIO;
	}
	ok = fwrite(KVT_GGUF_MAGIC, 1, 4, f) == 4 && fwrite(&version, 4, 1, f) == 1 &&
	     fwrite(&w->n_tensors, 8, 1, f) == 1 && fwrite(&w->n_kv, 8, 1, f) == 1 &&
	     (w->kv_len == 0 || fwrite(w->kv_buf, 1, w->kv_len, f) == w->kv_len);
	pos = KVT_GGUF_HEADER_BYTES + w->kv_len;
	for (uint64_t i = 0; i < w->n_tensors && ok; i++) {
		const wtensor *t = &w->tensors[i];
		uint64_t len = strlen(t->name);
		ok = fwrite(&len, 8, 1, f) == 1 && fwrite(t->name, 1, len, f) == len &&
		     fwrite(&t->n_dims, 4, 1, f) == 1 && fwrite(t->ne, 8, t->n_dims, f) == t->n_dims &&
		     fwrite(&t->type, 4, 1, f) == 1 && fwrite(&t->off_data, 8, 1, f) == 1;
		pos += 8 + len + 4 + 8ull * t->n_dims + 4 + 8;
	}
	/* Data section: aligned start, each tensor aligned, zero padding, trailing pad too (as gguf-py). */
	ok = ok && put_zeros(f, align_up(pos, a) - pos);
	off = 0;
	for (uint64_t i = 0; i < w->n_tensors && ok; i++) {
		const wtensor *t = &w->tensors[i];
		ok = put_zeros(f, t->off_data - off) &&
		     (t->n_bytes == 0 || fwrite(t->data, 1, (size_t)t->n_bytes, f) == t->n_bytes);
		off = t->off_data + t->n_bytes;
	}
	ok = ok && put_zeros(f, align_up(off, a) - off);
	if (!ok || fflush(f) != 0) {
		KVT_LOGE("%s: write failed: %s", path, strerror(errno));
		fclose(f);
		return KVT_EIO;
	}
	if (fclose(f) != 0) {
		KVT_LOGE("%s: close failed: %s", path, strerror(errno));
		return KVT_EIO;
	}
	return KVT_OK;
}
