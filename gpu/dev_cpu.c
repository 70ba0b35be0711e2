/*
 * gpu/dev_cpu.c — the CPU backend: the reference every other backend is
 * tested against, and the fallback where no GPU is present. This file holds
 * its ops table, its constructor, memory, copies, streams and events, and the
 * dispatch of each op to its reference loops (cpu_ref.c) or its fast path
 * (cpu_fast.c); cpu_int.h describes the split.
 *
 * Two paths per op, chosen by use_ref at creation:
 *   - reference: plain single-threaded loops, as readable as llama2.c; this
 *     is the oracle the parity tests trust;
 *   - fast: matmuls read the weights as stored (F16C GEMV for fp16, int8 or
 *     int16 GEMVs for the block-quantized types, an AVX-512 int8 GEMM in the
 *     GEMV's order), attention blocked by absolute key position with an
 *     online softmax, all under the order rule of dev_impl.h. Every op is
 *     split into tasks for the backend's own worker threads (cpu_pool.c).
 * "Device" memory is ordinary 64-byte-aligned host memory, and every op
 * completes before it returns, so sync has nothing to wait for.
 */
#include "cpu_int.h"

#include <strings.h>
#include <sys/mman.h>

static void cpu_destroy(kvt_dev *d)
{
	kvt_cpu_pool_destroy(((cpu_dev *)d)->pool);
	free(d);
}

/* n bytes (rounded up to align, a power of two) aligned to align; what names them in the error. */
static int alloc_aligned(size_t align, size_t n, const char *what, void **out)
{
	size_t rounded = (n + align - 1) & ~(align - 1);
	void *p = rounded >= n ? aligned_alloc(align, rounded) : NULL;

	if (!p) {
		KVT_LOGE("cpu: cannot allocate %zu bytes%s", n, what);
		return KVT_ENOMEM;
	}
	*out = p;
	return KVT_OK;
}

/*
 * Device memory. Buffers of 4 MiB and more (the weights, the KV pools) are
 * 2 MiB aligned and asked to be backed by huge pages: a decode streams every
 * weight once per token, and with 4 KiB pages the walks and the prefetcher
 * stopping at each page cost a 1B-shaped Q8_0 decode a fifth of its speed.
 * (Where THP is off, or "never", madvise fails and nothing changes.)
 */
static int cpu_alloc(kvt_dev *d, size_t n, void **out)
{
	const size_t huge = (size_t)2 << 20;
	if (n >= 2 * huge) {
		int rc = alloc_aligned(huge, n, "", out);
		if (rc == KVT_OK)
			(void)madvise(*out, (n + huge - 1) & ~(huge - 1), MADV_HUGEPAGE);
		return rc;
	}
	return alloc_aligned(64, n, "", out);
}

static void cpu_free(kvt_dev *d, void *p)
{
	free(p);
}

static int cpu_copy(kvt_dev *d, void *dst, const void *src, size_t n)
{
	memmove(dst, src, n);
	return KVT_OK;
}

static int cpu_sync(kvt_dev *d)
{
	return KVT_OK;
}

static bool cpu_supports_dtype(const kvt_dev *d, int dtype)
{
	return true; /* every dtype in dev.h */
}

static int cpu_matmul(kvt_dev *d, const kvt_matmul_args *a, void *ws)
{
	return d->use_ref ? kvt_cpu_matmul_ref(a) : kvt_cpu_matmul_fast(d, a, ws);
}

static int cpu_rmsnorm(kvt_dev *d, const kvt_rmsnorm_args *a)
{
	par_run(d, a->n_rows, d->use_ref ? kvt_cpu_rmsnorm_task : kvt_cpu_rmsnorm_fast_task, (void *)a);
	return KVT_OK;
}

static int cpu_rope(kvt_dev *d, const kvt_rope_args *a)
{
	par_run(d, a->n_rows, kvt_cpu_rope_task, (void *)a);
	return KVT_OK;
}

static int cpu_swiglu(kvt_dev *d, const kvt_swiglu_args *a)
{
	elem_job j = { .args = a, .n = a->n, .n_tasks = split(d, a->n, 4096) };
	par_run(d, j.n_tasks, d->use_ref ? kvt_cpu_swiglu_task : kvt_cpu_swiglu_fast_task, &j);
	return KVT_OK;
}

static int cpu_add(kvt_dev *d, const kvt_add_args *a)
{
	elem_job j = { .args = a, .n = a->n, .n_tasks = split(d, a->n, 16384) };
	par_run(d, j.n_tasks, kvt_cpu_add_task, &j);
	return KVT_OK;
}

/* The reference's plain loop, or the same index with eight running maxima (core/argmax.c). */
static int cpu_argmax(kvt_dev *d, const kvt_argmax_args *a)
{
	if (d->use_ref)
		return kvt_cpu_argmax(d, a);
	for (uint32_t m = 0; m < a->n_rows; m++)
		a->out[m] = (int32_t)kvt_argmax_f32(a->x + (size_t)m * a->n_cols, a->n_cols);
	return KVT_OK;
}

static int cpu_embed(kvt_dev *d, const kvt_embed_args *a)
{
	const size_t row_bytes = kvt_dtype_row_bytes(a->table_dtype, a->n_dim);
	for (uint32_t m = 0; m < a->n_rows; m++) {
		int32_t id = a->ids[m];
		if (id < 0 || (uint32_t)id >= a->n_vocab) {
			KVT_LOGE("dev.embed: token id %d out of range (vocab %u)", id, a->n_vocab);
			return KVT_EINVAL;
		}
		const uint8_t *row = (const uint8_t *)a->table + (size_t)id * row_bytes;
		float *y = a->y + (size_t)m * a->n_dim;
		if (d->use_ref)
			for (uint32_t k = 0; k < a->n_dim; k++)
				y[k] = kvt_cpu_row_elem(a->table_dtype, row, k);
		else
			kvt_cpu_widen_row(a->table_dtype, row, y, a->n_dim);
		if (a->scale != 0 && a->scale != 1)
			for (uint32_t k = 0; k < a->n_dim; k++)
				y[k] *= a->scale;
	}
	return KVT_OK;
}

/* Per-thread scratch floats of the row-by-row kernel: every score, one output row. */
static size_t attn_row_floats(const kvt_attention_args *a)
{
	return (size_t)a->pos0 + a->n_rows + 2 * (size_t)a->kv->head_dim; /* + a dequantized row */
}

/*
 * Per-thread scratch floats of the blocked kernel: for ATTN_ROWS x group
 * query vectors an accumulator row, a running max and a running sum; one KV
 * block's K and V widened to fp32; its scores.
 */
static size_t attn_block_floats(const kvt_attention_args *a)
{
	const size_t nq = (size_t)ATTN_ROWS * (a->n_heads / a->kv->n_kv_heads);
	const size_t hd = a->kv->head_dim, bt = a->kv->block_tokens;
	return nq * (hd + 2) + 2 * bt * hd + bt;
}

/* Decode tasks per KV head: shares of its query heads, about two tasks per thread in all. */
static uint32_t attn_n_shares(const kvt_dev *d, const kvt_attention_args *a)
{
	const uint32_t G = a->n_heads / a->kv->n_kv_heads;
	uint32_t n = (2 * (uint32_t)cpu_n_threads(d) + a->kv->n_kv_heads - 1) / a->kv->n_kv_heads;
	return n > G ? G : n ? n : 1;
}

static size_t cpu_attention_workspace(const kvt_dev *d, const kvt_attention_args *a)
{
	size_t r = attn_row_floats(a), b = attn_block_floats(a);
	return (size_t)cpu_n_threads(d) * (r > b ? r : b) * sizeof(float);
}

static int cpu_attention(kvt_dev *d, const kvt_attention_args *a, void *ws)
{
	kvt_attention_args at_pos;
	if (a->d_pos0) { /* the position lives in (host-addressable) device memory */
		at_pos = *a;
		at_pos.pos0 = (uint32_t)*a->d_pos0;
		at_pos.d_pos0 = NULL;
		a = &at_pos;
	}
	size_t r = attn_row_floats(a), b = attn_block_floats(a);
	attn_job j = { .a = a, .ws = ws, .ws_floats = r > b ? r : b };
	if (d->use_ref || a->kv->codec != KVT_KV_CODEC_F16) { /* 8-bit pools: row by row, on the workers */
		par_run(d, a->n_rows * a->n_heads, kvt_cpu_attention_task, &j);
		return KVT_OK;
	}
	if (a->n_rows > 1) {
		j.n_row_blocks = (a->n_rows + ATTN_ROWS - 1) / ATTN_ROWS;
		par_run(d, j.n_row_blocks * a->kv->n_kv_heads, kvt_cpu_attention_prefill_task, &j);
		return KVT_OK;
	}
	j.n_shares = attn_n_shares(d, a);
	par_run(d, a->kv->n_kv_heads * j.n_shares, kvt_cpu_attention_decode_task, &j);
	return KVT_OK;
}

/*
 * Pinned host memory, streams and events. Everything completes before it
 * returns on this backend, so a stream is only a token and an event is
 * complete as soon as it is recorded. They are still real objects so that
 * a stream or event misused (destroyed twice, say) shows up under ASan.
 */
struct kvt_stream {
	int unused;
};
struct kvt_event {
	int unused;
};

/*
 * "Pinned" host memory is ordinary memory here: nothing copies it by DMA, so
 * it is not locked, and its pages are taken as the slots are first written
 * (an empty host tier costs address space, not RAM).
 */
static int cpu_host_alloc(kvt_dev *d, size_t n, void **out)
{
	return alloc_aligned(4096, n, " of host memory", out);
}

static void cpu_host_free(kvt_dev *d, void *p)
{
	free(p);
}

static int cpu_stream_create(kvt_dev *d, kvt_stream **out)
{
	*out = calloc(1, sizeof(kvt_stream));
	return *out ? KVT_OK : KVT_ENOMEM;
}

static void cpu_stream_destroy(kvt_dev *d, kvt_stream *s) { free(s); }
static int cpu_stream_sync(kvt_dev *d, kvt_stream *s) { return KVT_OK; }

static int cpu_event_create(kvt_dev *d, kvt_event **out)
{
	*out = calloc(1, sizeof(kvt_event));
	return *out ? KVT_OK : KVT_ENOMEM;
}

static void cpu_event_destroy(kvt_dev *d, kvt_event *e) { free(e); }
static int cpu_event_record(kvt_dev *d, kvt_event *e, kvt_stream *s) { return KVT_OK; }
static int cpu_stream_wait_event(kvt_dev *d, kvt_stream *s, kvt_event *e) { return KVT_OK; }
static int cpu_event_sync(kvt_dev *d, kvt_event *e) { return KVT_OK; }
static bool cpu_event_done(kvt_dev *d, kvt_event *e) { return true; }

static int cpu_copy_async(kvt_dev *d, kvt_stream *s, void *dst, const void *src, size_t n, int dir)
{
	memcpy(dst, src, n);
	return KVT_OK;
}

static int cpu_kv_pack(kvt_dev *d, kvt_stream *st, const kvt_kv_pack_args *a)
{
	const kvt_kv_layout *l = a->kv;
	size_t block_bytes = kvt_kv_block_bytes(l), packed = kvt_kv_packed_bytes(l, a->codec);
	size_t n_vec = (size_t)l->n_layers * 2 * l->n_kv_heads * l->block_tokens;
	const uint32_t hd = l->head_dim, ng = a->codec == KVT_KV_CODEC_F16 ? 0 : hd / kvt_codec_group_dims(a->codec, hd);
	for (uint32_t b = 0; b < a->n_blocks; b++) {
		const uint16_t *src = (const uint16_t *)((const char *)l->pool + (size_t)a->h_slots[b] * block_bytes);
		uint8_t *dst = (uint8_t *)a->dst + b * packed;
		if (a->codec == l->codec) { /* the record as it is */
			memcpy(dst, src, block_bytes);
			continue;
		}
		if (a->codec == KVT_KV_CODEC_INT8KV || a->codec == KVT_KV_CODEC_INT8KV1) { /* the plain path: no vectorised variant */
			kvt_cpu_pack_int8kv(a->codec, l, src, dst);
			continue;
		}
		uint8_t *scales = dst + n_vec * hd; /* fp32, not necessarily aligned */
		pack_group_fn pack = kvt_cpu_pack_group;
#ifdef KVT_HAVE_CODEC8
		if (!d->use_ref && hd % 8 == 0) /* then every group is a multiple of 8 values too */
			pack = kvt_cpu_pack_group8;
#endif
		for (size_t v = 0; v < n_vec; v++)
			kvt_cpu_pack_vec(pack, a->codec, src + v * hd, hd, dst + v * hd, scales + v * ng * sizeof(float));
	}
	return KVT_OK;
}

static int cpu_kv_unpack(kvt_dev *d, kvt_stream *st, const kvt_kv_unpack_args *a)
{
	const kvt_kv_layout *l = a->kv;
	size_t block_bytes = kvt_kv_block_bytes(l), packed = kvt_kv_packed_bytes(l, a->codec);
	size_t n_vec = (size_t)l->n_layers * 2 * l->n_kv_heads * l->block_tokens;
	const uint32_t hd = l->head_dim, ng = a->codec == KVT_KV_CODEC_F16 ? 0 : hd / kvt_codec_group_dims(a->codec, hd);
	for (uint32_t b = 0; b < a->n_blocks; b++) {
		uint16_t *dst = (uint16_t *)((char *)l->pool + (size_t)a->h_slots[b] * block_bytes);
		const uint8_t *src = (const uint8_t *)a->src + b * packed;
		if (a->codec == l->codec) {
			memcpy(dst, src, block_bytes);
			continue;
		}
		if (a->codec == KVT_KV_CODEC_INT8KV || a->codec == KVT_KV_CODEC_INT8KV1) {
			kvt_cpu_unpack_int8kv(a->codec, l, src, dst);
			continue;
		}
		unpack_group_fn unpack = kvt_cpu_unpack_group;
#ifdef KVT_HAVE_CODEC8
		if (!d->use_ref && hd % 8 == 0) {
			kvt_cpu_codec8_init();
			unpack = kvt_cpu_unpack_group8;
		}
#endif
		for (size_t v = 0; v < n_vec; v++)
			kvt_cpu_unpack_vec(unpack, a->codec, src + v * hd, src + n_vec * hd + v * ng * sizeof(float), hd, dst + v * hd);
	}
	return KVT_OK;
}

static const struct kvt_dev_ops cpu_ops = {
	.name = "cpu",
	.destroy = cpu_destroy,
	.supports_dtype = cpu_supports_dtype,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.copy_h2d = cpu_copy,
	.copy_d2h = cpu_copy,
	.copy_d2d = cpu_copy,
	.sync = cpu_sync,
	.matmul_workspace = kvt_cpu_matmul_workspace,
	.matmul = cpu_matmul,
	.rmsnorm = cpu_rmsnorm,
	.rope = cpu_rope,
	.swiglu = cpu_swiglu,
	.add = cpu_add,
	.embed = cpu_embed,
	.kv_store = kvt_cpu_kv_store,
	.kv_load = kvt_cpu_kv_load,
	.attention_workspace = cpu_attention_workspace,
	.attention = cpu_attention,
	.argmax = cpu_argmax,
	.host_alloc = cpu_host_alloc,
	.host_free = cpu_host_free,
	.stream_create = cpu_stream_create,
	.stream_destroy = cpu_stream_destroy,
	.stream_sync = cpu_stream_sync,
	.event_create = cpu_event_create,
	.event_destroy = cpu_event_destroy,
	.event_record = cpu_event_record,
	.stream_wait_event = cpu_stream_wait_event,
	.event_sync = cpu_event_sync,
	.event_done = cpu_event_done,
	.copy_async = cpu_copy_async,
	.kv_pack = cpu_kv_pack,
	.kv_unpack = cpu_kv_unpack,
	.sample_workspace = kvt_cpu_sample_workspace,
	.sample = kvt_cpu_sample,
};

/*
 * OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels from the CPU's
 * family and model. A model newer than the library (Debian 12's 0.3.21 on an
 * Emerald Rapids Xeon, family 6 model 207) falls to its SSE3 "Prescott"
 * kernels: prefill's sgemm then runs at a fraction of the machine's speed.
 * When the chosen core lacks AVX2 but the CPU (and the OS, which
 * __builtin_cpu_supports checks through XGETBV) has AVX-512 or AVX2+FMA, ask
 * the library again with OPENBLAS_CORETYPE naming the matching core, the way
 * a user would set it before start. A user's own OPENBLAS_CORETYPE is kept.
 * gotoblas_dynamic_init/quit are weak: an OpenBLAS without DYNAMIC_ARCH lacks
 * them, and then the log says what to do instead. Runs once, before any BLAS
 * call (the first device's creation).
 */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

static const char *blas_core_for_cpu(void)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
		return "SkylakeX";
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return "Haswell";
	return NULL;
}

static bool blas_core_has_avx2(const char *core)
{
	static const char *const good[] = { "Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator" };
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		if (!strcasecmp(core, good[i]))
			return true;
	return false;
}

static void blas_core_check(void)
{
	const char *core = openblas_get_corename();
	const char *want = blas_core_for_cpu();
	if (!core || !want || blas_core_has_avx2(core) || getenv("OPENBLAS_CORETYPE"))
		return;
	if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit) {
		KVT_LOGW("cpu: OpenBLAS chose its %s kernels, which use neither AVX2 nor AVX-512, on a CPU that has them; "
			 "prefill runs slower than it could: set OPENBLAS_CORETYPE=%s before starting", core, want);
		return;
	}
	char was[32];
	snprintf(was, sizeof(was), "%s", core);
	setenv("OPENBLAS_CORETYPE", want, 1);
	gotoblas_dynamic_quit();
	gotoblas_dynamic_init();
	unsetenv("OPENBLAS_CORETYPE");
	core = openblas_get_corename();
	if (core && blas_core_has_avx2(core))
		KVT_LOGI("cpu: OpenBLAS chose its %s kernels (neither AVX2 nor AVX-512) for this CPU, which has the "
			 "instructions of its %s kernels; switched to those (set OPENBLAS_CORETYPE to choose)", was, core);
	else
		KVT_LOGW("cpu: OpenBLAS chose its %s kernels on a CPU with %s; asking for %s gave %s: prefill runs slower "
			 "than it could", was, want, want, core ? core : "nothing");
}

static pthread_once_t g_blas_core_once = PTHREAD_ONCE_INIT;

int kvt_dev_cpu_create(const kvt_dev_config *cfg, kvt_dev **out)
{
	cpu_dev *c = calloc(1, sizeof(*c));

	if (!c)
		return KVT_ENOMEM;
	kvt_dev *d = &c->base;
	d->ops = &cpu_ops;
	d->kind = KVT_DEV_CPU;
	d->use_ref = cfg->use_ref;
	d->act_int8 = cfg->act_int8 && !cfg->use_ref;
	d->n_threads = cfg->n_threads;
	if (d->n_threads <= 0) {
		/* auto: the CPUs this process may use, not the host's (taskset, a container's quota) */
		kvt_cpu_budget b;
		kvt_cpu_budget_get(&b);
		d->n_threads = b.n_auto;
		if (!d->use_ref) {
			char q[160] = "none";
			if (b.quota_cpus > 0)
				snprintf(q, sizeof(q), "%.2f CPUs (%s)", b.quota_cpus, b.quota_source);
			KVT_LOGI("cpu: %d thread%s (auto: %d of %d online CPUs in the affinity mask; cgroup quota %s)",
				 d->n_threads, d->n_threads == 1 ? "" : "s", b.n_affinity, b.n_online, q);
		}
	}
	if (!d->use_ref) {
		int rc = kvt_cpu_pool_create((uint32_t)d->n_threads, &c->pool);
		if (rc) {
			free(c);
			return rc;
		}
		kvt_cpu_pool_set_adaptive(c->pool, !cfg->fixed_threads);
	}
	/* OpenBLAS runs single-threaded inside our tasks (see kvt_cpu_matmul_fast), on kernels this CPU has */
	if (!d->use_ref)
		pthread_once(&g_blas_core_once, blas_core_check);
	openblas_set_num_threads(1);
	const char *core = d->use_ref ? NULL : openblas_get_corename();
	snprintf(d->name, sizeof(d->name), "cpu (%d thread%s, %s%s%s%s)", cpu_n_threads(d),
		 cpu_n_threads(d) == 1 ? "" : "s", d->use_ref ? "reference kernels" : "openblas",
		 core ? " " : "", core ? core : "", d->act_int8 ? ", int8 activations" : "");
	*out = d;
	return KVT_OK;
}
