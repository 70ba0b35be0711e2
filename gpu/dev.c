/*
 * gpu/dev.c — the public device wrappers: validate once, then dispatch.
 *
 * Validation here is for programmer-visible argument errors (shapes, NULL
 * buffers, out-of-range layer or position). Each failure is logged once with
 * the op and the field, and returns KVT_EINVAL; backends never re-check.
 */
#include "dev_impl.h"
#include "kv_codec.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

/*
 * KVT_DEV_OPS is struct kvt_dev_ops field for field: each op at its index's
 * offset after `name`, and nothing after the last (every field a pointer).
 */
#define KVT_DEV_OP_AT(op)                                                                      \
	_Static_assert(offsetof(struct kvt_dev_ops, op) ==                                     \
			       sizeof(const char *) + KVT_DEV_OP_##op * sizeof(void (*)(void)),      \
		       "struct kvt_dev_ops: field " #op " is not where KVT_DEV_OPS (dev_impl.h) puts it");
KVT_DEV_OPS(KVT_DEV_OP_AT)
#undef KVT_DEV_OP_AT
_Static_assert(offsetof(struct kvt_dev_ops, name) == 0, "struct kvt_dev_ops: name first");
_Static_assert(sizeof(struct kvt_dev_ops) == sizeof(const char *) + KVT_DEV_N_OPS * sizeof(void (*)(void)),
	       "struct kvt_dev_ops has a field KVT_DEV_OPS (dev_impl.h) does not list");

#define BAD(op, ...)                                   \
	do {                                           \
		KVT_LOGE("dev." op ": " __VA_ARGS__);  \
		return KVT_EINVAL;                     \
	} while (0)

int kvt_dev_create(const kvt_dev_config *cfg, kvt_dev **out)
{
	kvt_dev_config c = cfg ? *cfg : (kvt_dev_config){ 0 };

	if (c.kind == KVT_DEV_CUDA) {
#ifdef KVT_HAVE_CUDA
		return kvt_dev_cuda_create(&c, out);
#else
		KVT_LOGE("device cuda: this build has no CUDA backend");
		return KVT_EDEVICE;
#endif
	}
	if (c.kind == KVT_DEV_AUTO) {
#ifdef KVT_HAVE_CUDA
		if (kvt_dev_cuda_create(&c, out) == KVT_OK)
			return KVT_OK;
		KVT_LOGI("device auto: no usable GPU, using the CPU backend");
#else
		KVT_LOGI("device auto: this build has no CUDA backend, using the CPU backend");
#endif
		c.kind = KVT_DEV_CPU;
	}
	if (c.kind != KVT_DEV_CPU) {
		KVT_LOGE("device: unknown kind %d", c.kind);
		return KVT_EINVAL;
	}
	return kvt_dev_cpu_create(&c, out);
}

void kvt_dev_destroy(kvt_dev *d)
{
	if (d)
		d->ops->destroy(d);
}

int kvt_dev_kind(const kvt_dev *d) { return d->kind; }
const char *kvt_dev_name(const kvt_dev *d) { return d->name; }
int kvt_dev_n_threads(const kvt_dev *d) { return d->n_threads; }
bool kvt_dev_host_is_device(const kvt_dev *d) { return d->kind == KVT_DEV_CPU; }

uint32_t kvt_dtype_block_elems(int dtype)
{
	switch (dtype) {
	case KVT_DTYPE_F32: case KVT_DTYPE_F16: return 1;
	case KVT_DTYPE_Q8_0: case KVT_DTYPE_Q4_0: case KVT_DTYPE_Q4_1: case KVT_DTYPE_Q5_0: return KVT_QBLOCK;
	case KVT_DTYPE_Q4_K: case KVT_DTYPE_Q5_K: case KVT_DTYPE_Q6_K: return KVT_QK_BLOCK;
	}
	return 0;
}

size_t kvt_dtype_row_bytes(int dtype, size_t n)
{
	switch (dtype) {
	case KVT_DTYPE_F32: return n * 4;
	case KVT_DTYPE_F16: return n * 2;
	case KVT_DTYPE_Q8_0: return n / KVT_QBLOCK * 34;
	case KVT_DTYPE_Q4_0: return n / KVT_QBLOCK * 18;
	case KVT_DTYPE_Q4_1: return n / KVT_QBLOCK * 20;
	case KVT_DTYPE_Q5_0: return n / KVT_QBLOCK * 22;
	case KVT_DTYPE_Q4_K: return n / KVT_QK_BLOCK * 144;
	case KVT_DTYPE_Q5_K: return n / KVT_QK_BLOCK * 176;
	case KVT_DTYPE_Q6_K: return n / KVT_QK_BLOCK * 210;
	}
	return 0;
}

const char *kvt_dtype_name(int dtype)
{
	static const char *const names[KVT_DTYPE_COUNT] = { "f32", "f16", "q8_0", "q4_0", "q4_1",
							    "q5_0", "q4_k", "q5_k", "q6_k" };
	return dtype >= 0 && dtype < KVT_DTYPE_COUNT ? names[dtype] : "?";
}

bool kvt_dev_supports_dtype(const kvt_dev *d, int dtype)
{
	return dtype >= 0 && dtype < KVT_DTYPE_COUNT && d->ops->supports_dtype(d, dtype);
}

/* A weight dtype the backend takes, with rows of n elements (whole blocks). */
static bool weight_ok(const kvt_dev *d, int dtype, uint32_t n)
{
	if (!kvt_dev_supports_dtype(d, dtype))
		return false;
	return n % kvt_dtype_block_elems(dtype) == 0;
}

int kvt_dev_alloc(kvt_dev *d, size_t n_bytes, void **out)
{
	if (n_bytes == 0)
		BAD("alloc", "zero bytes");
	return d->ops->alloc(d, n_bytes, out);
}

void kvt_dev_free(kvt_dev *d, void *p)
{
	if (p)
		d->ops->free(d, p);
}

int kvt_dev_copy_h2d(kvt_dev *d, void *dst, const void *src, size_t n)
{
	if (n && (!dst || !src))
		BAD("copy_h2d", "NULL buffer");
	return n ? d->ops->copy_h2d(d, dst, src, n) : KVT_OK;
}

int kvt_dev_copy_d2h(kvt_dev *d, void *dst, const void *src, size_t n)
{
	if (n && (!dst || !src))
		BAD("copy_d2h", "NULL buffer");
	return n ? d->ops->copy_d2h(d, dst, src, n) : KVT_OK;
}

int kvt_dev_copy_d2d(kvt_dev *d, void *dst, const void *src, size_t n)
{
	if (n && (!dst || !src))
		BAD("copy_d2d", "NULL buffer");
	return n ? d->ops->copy_d2d(d, dst, src, n) : KVT_OK;
}

int kvt_dev_sync(kvt_dev *d)
{
	return d->ops->sync(d);
}

void kvt_dev_counters_get(const kvt_dev *d, kvt_dev_counters *out)
{
	const uint64_t *src = (const uint64_t *)&d->ctr;
	uint64_t *dst = (uint64_t *)out;
	for (size_t i = 0; i < sizeof *out / sizeof(uint64_t); i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

void kvt_dev_counters_reset(kvt_dev *d)
{
	uint64_t *c = (uint64_t *)&d->ctr;
	for (size_t i = 0; i < sizeof d->ctr / sizeof(uint64_t); i++)
		__atomic_store_n(&c[i], 0, __ATOMIC_RELAXED);
}

bool kvt_dev_graphs_supported(const kvt_dev *d)
{
	return d->ops->capture_begin != NULL;
}

int kvt_dev_capture_begin(kvt_dev *d)
{
	if (!d->ops->capture_begin) {
		KVT_LOGE("dev.capture_begin: the %s backend has no graphs", d->ops->name);
		return KVT_EUNSUPPORTED;
	}
	return d->ops->capture_begin(d);
}

int kvt_dev_capture_end(kvt_dev *d, kvt_graph **out)
{
	if (!out)
		BAD("capture_end", "NULL out");
	*out = NULL;
	if (!d->ops->capture_end) {
		KVT_LOGE("dev.capture_end: the %s backend has no graphs", d->ops->name);
		return KVT_EUNSUPPORTED;
	}
	return d->ops->capture_end(d, out);
}

int kvt_dev_graph_launch(kvt_dev *d, kvt_graph *g)
{
	if (!g)
		BAD("graph_launch", "NULL graph");
	return d->ops->graph_launch(d, g);
}

void kvt_dev_graph_destroy(kvt_dev *d, kvt_graph *g)
{
	if (g)
		d->ops->graph_destroy(d, g);
}

size_t kvt_dev_matmul_workspace_bytes(const kvt_dev *d, const kvt_matmul_args *a)
{
	return d->ops->matmul_workspace(d, a);
}

int kvt_dev_matmul(kvt_dev *d, const kvt_matmul_args *a, void *ws)
{
	if (!a->n_rows || !a->n_in || !a->n_out)
		BAD("matmul", "empty shape %ux%ux%u", a->n_rows, a->n_in, a->n_out);
	if (!a->w || !a->x || !a->y)
		BAD("matmul", "NULL buffer");
	if (!weight_ok(d, a->w_dtype, a->n_in))
		BAD("matmul", "weight dtype %s with rows of %u (%s; rows must be whole blocks of %u)",
		    kvt_dtype_name(a->w_dtype), a->n_in,
		    kvt_dev_supports_dtype(d, a->w_dtype) ? "supported" : "not supported by this backend",
		    kvt_dtype_block_elems(a->w_dtype));
	if ((const void *)a->x == (void *)a->y)
		BAD("matmul", "y aliases x");
	if (!ws && d->ops->matmul_workspace(d, a))
		BAD("matmul", "missing workspace");
	return d->ops->matmul(d, a, ws);
}

int kvt_dev_rmsnorm(kvt_dev *d, const kvt_rmsnorm_args *a)
{
	if (!a->n_rows || !a->n_dim || !a->w || !a->x || !a->y || !(a->eps >= 0))
		BAD("rmsnorm", "bad arguments (rows %u dim %u)", a->n_rows, a->n_dim);
	return d->ops->rmsnorm(d, a);
}

int kvt_dev_rope(kvt_dev *d, const kvt_rope_args *a)
{
	if (!a->n_rows || !a->n_heads || !a->x || !a->pos)
		BAD("rope", "bad arguments");
	if (a->n_rot % 2 || a->n_rot > a->head_dim || !a->n_rot)
		BAD("rope", "n_rot %u with head_dim %u", a->n_rot, a->head_dim);
	if (!(a->freq_base > 0))
		BAD("rope", "freq_base %g", a->freq_base);
	return d->ops->rope(d, a);
}

int kvt_dev_swiglu(kvt_dev *d, const kvt_swiglu_args *a)
{
	if (!a->n || !a->gate || !a->up || !a->y)
		BAD("swiglu", "bad arguments");
	if (a->act < 0 || a->act >= KVT_ACT_COUNT)
		BAD("swiglu", "activation %d", a->act);
	return d->ops->swiglu(d, a);
}

int kvt_dev_add(kvt_dev *d, const kvt_add_args *a)
{
	if (!a->n || !a->x || !a->y)
		BAD("add", "bad arguments");
	if (a->n_x && a->n % a->n_x)
		BAD("add", "a row of %llu does not divide %llu elements", (unsigned long long)a->n_x,
		    (unsigned long long)a->n);
	return d->ops->add(d, a);
}

int kvt_dev_embed(kvt_dev *d, const kvt_embed_args *a)
{
	if (!a->n_rows || !a->n_dim || !a->n_vocab || !a->table || !a->ids || !a->y)
		BAD("embed", "bad arguments");
	if (!isfinite(a->scale))
		BAD("embed", "scale %g", a->scale);
	if (!weight_ok(d, a->table_dtype, a->n_dim))
		BAD("embed", "table dtype %s with rows of %u (%s; rows must be whole blocks of %u)",
		    kvt_dtype_name(a->table_dtype), a->n_dim,
		    kvt_dev_supports_dtype(d, a->table_dtype) ? "supported" : "not supported by this backend",
		    kvt_dtype_block_elems(a->table_dtype));
	return d->ops->embed(d, a);
}

size_t kvt_kv_block_bytes(const kvt_kv_layout *l)
{
	return kvt_kv_packed_bytes(l, l->codec);
}

static int check_kv(const char *op, const kvt_kv_layout *kv, uint32_t layer, const int32_t *table)
{
	if (!kv || !kv->pool || !kv->n_slots || !kv->block_tokens || !kv->head_dim || !kv->n_kv_heads ||
	    kv->codec < 0 || kv->codec >= KVT_KV_POOL_CODEC_COUNT || kv->head_dim % 4) {
		KVT_LOGE("dev.%s: bad KV layout (codec %d, head_dim %u)", op, kv ? kv->codec : -1, kv ? kv->head_dim : 0);
		return KVT_EINVAL;
	}
	if (layer >= kv->n_layers) {
		KVT_LOGE("dev.%s: layer %u of %u", op, layer, kv->n_layers);
		return KVT_EINVAL;
	}
	if (!table) {
		KVT_LOGE("dev.%s: NULL block table", op);
		return KVT_EINVAL;
	}
	return KVT_OK;
}

int kvt_dev_kv_store(kvt_dev *d, const kvt_kv_store_args *a)
{
	int rc = check_kv("kv_store", a->kv, a->layer, a->block_table);
	if (rc)
		return rc;
	if (!a->n_rows || !a->k || !a->v)
		BAD("kv_store", "bad arguments");
	return d->ops->kv_store(d, a);
}

int kvt_dev_kv_load(kvt_dev *d, const kvt_kv_load_args *a)
{
	int rc = check_kv("kv_load", a->kv, a->layer, a->block_table);
	if (rc)
		return rc;
	if (!a->n_rows || !a->k || !a->v)
		BAD("kv_load", "bad arguments");
	return d->ops->kv_load(d, a);
}

size_t kvt_dev_attention_workspace_bytes(const kvt_dev *d, const kvt_attention_args *a)
{
	return d->ops->attention_workspace(d, a);
}

int kvt_dev_attention(kvt_dev *d, const kvt_attention_args *a, void *ws)
{
	int rc = check_kv("attention", a->kv, a->layer, a->block_table);
	if (rc)
		return rc;
	if (!a->n_rows || !a->q || !a->out || !a->n_heads || a->n_heads % a->kv->n_kv_heads)
		BAD("attention", "bad arguments (rows %u heads %u)", a->n_rows, a->n_heads);
	if (!ws && d->ops->attention_workspace(d, a))
		BAD("attention", "missing workspace");
	return d->ops->attention(d, a, ws);
}

int kvt_dev_argmax(kvt_dev *d, const kvt_argmax_args *a)
{
	if (!a->n_rows || !a->n_cols || !a->x || !a->out)
		BAD("argmax", "bad arguments");
	return d->ops->argmax(d, a);
}

size_t kvt_dev_sample_workspace_bytes(const kvt_dev *d, const kvt_sample_args *a)
{
	return d->ops->sample_workspace(d, a);
}

int kvt_dev_sample(kvt_dev *d, const kvt_sample_args *a, void *ws)
{
	if (!a->n_rows || !a->n_cols || !a->x || !a->u || !a->out)
		BAD("sample", "bad arguments");
	if (!(a->temperature > 0) || !(a->top_p > 0 && a->top_p <= 1))
		BAD("sample", "temperature %g top_p %g (need temperature > 0, 0 < top_p <= 1)", a->temperature,
		    a->top_p);
	if (!ws && d->ops->sample_workspace(d, a))
		BAD("sample", "missing workspace");
	return d->ops->sample(d, a, ws);
}

int kvt_dev_host_alloc(kvt_dev *d, size_t n_bytes, void **out)
{
	if (n_bytes == 0 || !out)
		BAD("host_alloc", "zero bytes or NULL out");
	return d->ops->host_alloc(d, n_bytes, out);
}

void kvt_dev_host_free(kvt_dev *d, void *h)
{
	if (h)
		d->ops->host_free(d, h);
}

int kvt_dev_stream_create(kvt_dev *d, kvt_stream **out)
{
	return d->ops->stream_create(d, out);
}

void kvt_dev_stream_destroy(kvt_dev *d, kvt_stream *s)
{
	if (s)
		d->ops->stream_destroy(d, s);
}

int kvt_dev_stream_sync(kvt_dev *d, kvt_stream *s)
{
	return d->ops->stream_sync(d, s);
}

int kvt_dev_event_create(kvt_dev *d, kvt_event **out)
{
	return d->ops->event_create(d, out);
}

void kvt_dev_event_destroy(kvt_dev *d, kvt_event *e)
{
	if (e)
		d->ops->event_destroy(d, e);
}

int kvt_dev_event_record(kvt_dev *d, kvt_event *e, kvt_stream *s)
{
	if (!e)
		BAD("event_record", "NULL event");
	return d->ops->event_record(d, e, s);
}

int kvt_dev_stream_wait_event(kvt_dev *d, kvt_stream *s, kvt_event *e)
{
	if (!e)
		BAD("stream_wait_event", "NULL event");
	return d->ops->stream_wait_event(d, s, e);
}

int kvt_dev_event_sync(kvt_dev *d, kvt_event *e)
{
	if (!e)
		BAD("event_sync", "NULL event");
	return d->ops->event_sync(d, e);
}

bool kvt_dev_event_done(kvt_dev *d, kvt_event *e)
{
	return e && d->ops->event_done(d, e);
}

int kvt_dev_copy_async(kvt_dev *d, kvt_stream *s, void *dst, const void *src, size_t n, int dir)
{
	if (n && (!dst || !src))
		BAD("copy_async", "NULL buffer");
	if (dir < KVT_COPY_H2D || dir > KVT_COPY_D2D)
		BAD("copy_async", "direction %d", dir);
	return n ? d->ops->copy_async(d, s, dst, src, n, dir) : KVT_OK;
}

const char *kvt_kv_codec_name(int codec)
{
	static const char *const names[KVT_KV_CODEC_COUNT] = { "f16", "fp8", "int8", "int8kv1", "int8kv" };
	return codec >= 0 && codec < KVT_KV_CODEC_COUNT ? names[codec] : "?";
}

uint32_t kvt_kv_group_dims(int codec, uint32_t head_dim)
{
	if (codec != KVT_KV_CODEC_FP8 && codec != KVT_KV_CODEC_INT8)
		return 0;
	return kvt_codec_group_dims(codec, head_dim);
}

size_t kvt_kv_packed_bytes(const kvt_kv_layout *l, int codec)
{
	size_t n_vec = (size_t)l->n_layers * 2 * l->n_kv_heads * l->block_tokens;
	switch (codec) {
	case KVT_KV_CODEC_F16: return n_vec * l->head_dim * 2;
	case KVT_KV_CODEC_FP8:
	case KVT_KV_CODEC_INT8: /* codes, then one fp32 scale per group */
		if (!l->head_dim)
			return 0;
		return n_vec * l->head_dim + n_vec * (l->head_dim / kvt_codec_group_dims(codec, l->head_dim)) * sizeof(float);
	case KVT_KV_CODEC_INT8KV1:
	case KVT_KV_CODEC_INT8KV: /* codes, then per layer the K channel and V token parameters */
		if (!l->head_dim)
			return 0;
		return n_vec * l->head_dim + l->n_layers * kvt_int8kv_layer_bytes(codec, l->n_kv_heads, l->block_tokens, l->head_dim);
	}
	return 0;
}

static int check_codec(const char *op, const kvt_kv_layout *kv, int codec, uint32_t n_blocks,
		       const int32_t *slots, const void *buf)
{
	if (!kv || !kv->pool || !kv->n_slots || !kv->block_tokens || !kv->head_dim || !kv->n_kv_heads ||
	    !kv->n_layers) {
		KVT_LOGE("dev.%s: bad KV layout", op);
		return KVT_EINVAL;
	}
	if (codec < 0 || codec >= KVT_KV_CODEC_COUNT || kv->codec < 0 || kv->codec >= KVT_KV_POOL_CODEC_COUNT) {
		KVT_LOGE("dev.%s: codec %d (pool codec %d)", op, codec, kv->codec);
		return KVT_EINVAL;
	}
	if (kv->codec != KVT_KV_CODEC_F16 && codec != kv->codec) {
		KVT_LOGE("dev.%s: a %s pool packs only to %s, not %s", op, kvt_kv_codec_name(kv->codec),
			 kvt_kv_codec_name(kv->codec), kvt_kv_codec_name(codec));
		return KVT_EINVAL;
	}
	if (n_blocks && (!slots || !buf)) {
		KVT_LOGE("dev.%s: NULL slots or buffer", op);
		return KVT_EINVAL;
	}
	for (uint32_t i = 0; i < n_blocks; i++) {
		if (slots[i] < 0 || (uint32_t)slots[i] >= kv->n_slots) {
			KVT_LOGE("dev.%s: slot %d of %u (block %u)", op, slots[i], kv->n_slots, i);
			return KVT_EINVAL;
		}
	}
	return KVT_OK;
}

int kvt_dev_kv_pack(kvt_dev *d, kvt_stream *s, const kvt_kv_pack_args *a)
{
	int rc = check_codec("kv_pack", a->kv, a->codec, a->n_blocks, a->h_slots, a->dst);
	if (rc)
		return rc;
	return a->n_blocks ? d->ops->kv_pack(d, s, a) : KVT_OK;
}

int kvt_dev_kv_unpack(kvt_dev *d, kvt_stream *s, const kvt_kv_unpack_args *a)
{
	int rc = check_codec("kv_unpack", a->kv, a->codec, a->n_blocks, a->h_slots, a->src);
	if (rc)
		return rc;
	return a->n_blocks ? d->ops->kv_unpack(d, s, a) : KVT_OK;
}

/* ---- fused ops: validation, and the composition of the plain ops they are defined as ---- */

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

size_t kvt_dev_norm_matmul_workspace_bytes(const kvt_dev *d, const kvt_norm_matmul_args *a)
{
	return align256((size_t)a->mm.n_rows * a->mm.n_in * sizeof(float)) + d->ops->matmul_workspace(d, &a->mm);
}

int kvt_dev_norm_matmul(kvt_dev *d, const kvt_norm_matmul_args *a, void *ws)
{
	if (!a->norm_w || !(a->eps >= 0))
		BAD("norm_matmul", "NULL norm weight or eps %g", a->eps);
	if (!ws)
		BAD("norm_matmul", "missing workspace");
	if (!a->mm.n_rows || !a->mm.n_in || !a->mm.n_out || !a->mm.w || !a->mm.x || !a->mm.y)
		BAD("norm_matmul", "bad matmul arguments (%ux%ux%u)", a->mm.n_rows, a->mm.n_in, a->mm.n_out);
	if (d->ops->norm_matmul) {
		int rc = d->ops->norm_matmul(d, a, ws);
		if (rc != KVT_DEV_COMPOSE)
			return rc;
	}
	float *xn = ws;
	kvt_rmsnorm_args rn = { .n_rows = a->mm.n_rows, .n_dim = a->mm.n_in, .eps = a->eps, .w = a->norm_w,
				.x = a->mm.x, .y = xn };
	kvt_matmul_args mm = a->mm;
	mm.x = xn;
	int rc = kvt_dev_rmsnorm(d, &rn);
	return rc ? rc : kvt_dev_matmul(d, &mm, (char *)ws + align256((size_t)mm.n_rows * mm.n_in * sizeof(float)));
}

size_t kvt_dev_matmul_swiglu_workspace_bytes(const kvt_dev *d, const kvt_matmul_swiglu_args *a)
{
	kvt_matmul_args mm = { .n_rows = a->n_rows, .n_in = a->n_in, .n_out = a->n_out, .w_dtype = a->w_dtype };
	return align256((size_t)a->n_rows * a->n_in * sizeof(float)) +
	       align256((size_t)a->n_rows * a->n_out * sizeof(float)) + d->ops->matmul_workspace(d, &mm);
}

int kvt_dev_matmul_swiglu(kvt_dev *d, const kvt_matmul_swiglu_args *a, void *ws)
{
	if (!a->n_rows || !a->n_in || !a->n_out || !a->w_gate || !a->w_up || !a->x || !a->y || !(a->eps >= 0))
		BAD("matmul_swiglu", "bad arguments (%ux%ux%u)", a->n_rows, a->n_in, a->n_out);
	if (!weight_ok(d, a->w_dtype, a->n_in))
		BAD("matmul_swiglu", "weight dtype %s with rows of %u", kvt_dtype_name(a->w_dtype), a->n_in);
	if ((const void *)a->x == (void *)a->y)
		BAD("matmul_swiglu", "y aliases x");
	if (!ws)
		BAD("matmul_swiglu", "missing workspace");
	if (d->ops->matmul_swiglu) {
		int rc = d->ops->matmul_swiglu(d, a, ws);
		if (rc != KVT_DEV_COMPOSE)
			return rc;
	}
	float *xn = ws, *upv = (float *)((char *)ws + align256((size_t)a->n_rows * a->n_in * sizeof(float)));
	void *mws = (char *)upv + align256((size_t)a->n_rows * a->n_out * sizeof(float));
	int rc = KVT_OK;
	if (a->norm_w) {
		kvt_rmsnorm_args rn = { .n_rows = a->n_rows, .n_dim = a->n_in, .eps = a->eps, .w = a->norm_w,
					.x = a->x, .y = xn };
		rc = kvt_dev_rmsnorm(d, &rn);
	}
	kvt_matmul_args mm = { .n_rows = a->n_rows, .n_in = a->n_in, .n_out = a->n_out, .w_dtype = a->w_dtype,
			       .w = a->w_gate, .x = a->norm_w ? xn : a->x, .y = a->y };
	if (!rc)
		rc = kvt_dev_matmul(d, &mm, mws);
	mm.w = a->w_up;
	mm.y = upv;
	if (!rc)
		rc = kvt_dev_matmul(d, &mm, mws);
	kvt_swiglu_args sw = { .n = (uint64_t)a->n_rows * a->n_out, .gate = a->y, .up = upv, .y = a->y };
	return rc ? rc : kvt_dev_swiglu(d, &sw);
}

int kvt_dev_rope_store(kvt_dev *d, const kvt_rope_store_args *a)
{
	const kvt_kv_layout *kv = a->st.kv;
	if (!kv || !a->k || a->st.k != a->k || !a->pos)
		BAD("rope_store", "bad arguments (st.k must be k)");
	if (d->ops->rope_store) {
		int rc = check_kv("rope_store", kv, a->st.layer, a->st.block_table);
		if (rc)
			return rc;
		if (!a->st.n_rows || !a->st.v || (a->q && !a->n_heads))
			BAD("rope_store", "bad arguments");
		if (a->n_rot % 2 || a->n_rot > kv->head_dim || !a->n_rot || !(a->freq_base > 0))
			BAD("rope_store", "n_rot %u with head_dim %u, freq_base %g", a->n_rot, kv->head_dim, a->freq_base);
		rc = d->ops->rope_store(d, a);
		if (rc != KVT_DEV_COMPOSE)
			return rc;
	}
	kvt_rope_args r = { .n_rows = a->st.n_rows, .n_heads = a->n_heads, .head_dim = kv->head_dim, .n_rot = a->n_rot,
			    .freq_base = a->freq_base, .pos = a->pos, .x = a->q };
	int rc = a->q ? kvt_dev_rope(d, &r) : KVT_OK;
	r.n_heads = kv->n_kv_heads;
	r.x = a->k;
	if (!rc)
		rc = kvt_dev_rope(d, &r);
	return rc ? rc : kvt_dev_kv_store(d, &a->st);
}

/* ---- strided copies (kvt_dev_copy_2d_async) ---- */

int kvt_dev_copy_2d_async(kvt_dev *d, kvt_stream *s, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
			  size_t row_bytes, size_t n_rows, int dir)
{
	if (!row_bytes || !n_rows)
		return KVT_OK;
	if (!dst || !src)
		BAD("copy_2d_async", "NULL buffer");
	if (dir < KVT_COPY_H2D || dir > KVT_COPY_D2D)
		BAD("copy_2d_async", "direction %d", dir);
	if (n_rows > 1 && (dst_pitch < row_bytes || src_pitch < row_bytes))
		BAD("copy_2d_async", "pitches %zu / %zu below the row of %zu bytes", dst_pitch, src_pitch, row_bytes);
	if (d->ops->copy_2d_async)
		return d->ops->copy_2d_async(d, s, dst, dst_pitch, src, src_pitch, row_bytes, n_rows, dir);
	for (size_t r = 0; r < n_rows; r++) {
		int rc = d->ops->copy_async(d, s, (char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes,
					    dir);
		if (rc)
			return rc;
	}
	return KVT_OK;
}
