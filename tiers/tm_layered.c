/*
 * tiers/tm_layered.c — layer-wise promotion from T1 (manager.h,
 * kvt_tm_promote_layered; tm_int.h: the manager's files).
 *
 * All blocks are busy-held for the promotion's life (try-acquired: a busy
 * one means "not now", never a wait while holding). The copies run on the
 * manager's own stream, one event per layer group, so the engine's forward
 * pass can start layer 0 while later layers are still coming; the table
 * names the new T0 slots only in kvt_tm_layered_finish, after the stream.
 */
#include "tm_int.h"

/*
 * A layer range of a packed record is one byte range (f16: the record is
 * [layer][K,V][kv_head][token][dim]) or two (FP8/INT8: the codes of those
 * layers, then their scales; tiers/README.md). A T0 pool that keeps its own
 * codec is filled straight from the T1 slot by those ranges. An fp16 pool
 * under an 8-bit T1 gets the ranges gathered into a device staging buffer as
 * "sub-blocks" of G layers — a packed block of a layout with n_layers = G —
 * and unpacked by kvt_dev_kv_unpack over a view of the pool as units of G
 * layers (unit slot * (L / G) + g), so one launch decodes group g of a whole
 * chunk of blocks and the codec kernels stay as they are. The staging
 * buffer is reused chunk after chunk: copies and unpacks run in order on one
 * stream, so no host wait is needed between them.
 */
#define TM_LAY_STAGE_MIN_BLOCKS 64u /* staging capacity in whole packed blocks (at least batch_blocks) */

typedef struct tm_lay {
	kvt_stream *stream;   /* the layered copy stream */
	kvt_event **events;   /* [n_layers] one per group (at most one group per layer) */
	uint32_t n_events;    /* created */
	unsigned char *d_stage; /* [stage_bytes] sub-blocks of one group, device */
	size_t stage_bytes;   /* its size */
} tm_lay;

struct kvt_tm_layered {
	uint32_t n;                         /* blocks */
	uint8_t (*hashes)[KVT_HASH_BYTES];  /* [n] copies, busy-held */
	int32_t *t0;                        /* [n] the caller's T0 slots */
	int32_t *t1;                        /* [n] T1 slot copied from (with our reference); -1: was in T0 */
	int32_t *units;                     /* [n] unpack units of the current group (scratch) */
	const void **src;                   /* [n] T1 slot addresses of the copied blocks (scratch) */
	uint32_t n_copied;                  /* blocks with t1 >= 0 */
	uint32_t n_groups, layers_per_group;/* the groups chosen */
	kvt_event *const *events;           /* [n_groups] the layered stream's events (tm_lay's) */
	int8_t *found;                      /* [n] the tier each block was found in (lookup stats) */
	int64_t *order;                     /* [n] sort keys (scratch of lay_sort_by_t1) */
	double t_start;                     /* when the copies were issued */
};

void tm_lay_destroy(kvt_tm *tm)
{
	tm_lay *ly = tm->lay;
	if (!ly)
		return;
	kvt_dev_stream_destroy(tm->cfg.dev, ly->stream); /* waits for it */
	for (uint32_t i = 0; i < ly->n_events; i++)
		kvt_dev_event_destroy(tm->cfg.dev, ly->events[i]);
	free(ly->events);
	kvt_dev_free(tm->cfg.dev, ly->d_stage);
	free(ly);
	tm->lay = NULL;
}

/* The stream, one event per layer and the staging buffer, on first use. */
static int lay_init(kvt_tm *tm)
{
	if (tm->lay)
		return KVT_OK;
	const kvt_kv_layout *l = kvt_t0_layout(tm->cfg.t0);
	tm_lay *ly = calloc(1, sizeof(*ly));
	int rc = KVT_ENOMEM;
	if (!ly || !(ly->events = calloc(l->n_layers, sizeof(*ly->events))))
		goto fail;
	tm->lay = ly;
	if ((rc = kvt_dev_stream_create(tm->cfg.dev, &ly->stream)))
		goto fail;
	for (; ly->n_events < l->n_layers; ly->n_events++)
		if ((rc = kvt_dev_event_create(tm->cfg.dev, &ly->events[ly->n_events])))
			goto fail;
	if (l->codec == KVT_KV_CODEC_F16 && tm->cfg.t1_codec != KVT_KV_CODEC_F16) {
		uint32_t nb = tm->cfg.batch_blocks > TM_LAY_STAGE_MIN_BLOCKS ? tm->cfg.batch_blocks : TM_LAY_STAGE_MIN_BLOCKS;
		ly->stage_bytes = (size_t)nb * tm->packed_bytes;
		if ((rc = kvt_dev_alloc(tm->cfg.dev, ly->stage_bytes, (void **)&ly->d_stage)))
			goto fail;
	}
	return KVT_OK;
fail:
	if (ly && !tm->lay)
		free(ly);
	tm_lay_destroy(tm);
	KVT_LOGE("tm: layered promotion: cannot set up its stream, events or staging: %s", kvt_strerror(rc));
	return rc;
}

/* G: the smallest divisor of n_layers that is >= ceil(n_layers / n_groups). */
static uint32_t lay_group_layers(uint32_t n_layers, uint32_t n_groups)
{
	if (n_groups > n_layers)
		n_groups = n_layers;
	uint32_t g = (n_layers + n_groups - 1) / n_groups;
	while (n_layers % g)
		g++;
	return g;
}

/*
 * Byte ranges of layers [l0, l0 + g) in a record of the layout and codec:
 * off[i], len[i] for i < the count returned (1 for f16, 2 for 8-bit).
 */
static uint32_t lay_ranges(const kvt_kv_layout *l, int codec, uint32_t l0, uint32_t g, size_t off[2], size_t len[2])
{
	const size_t vec_per_layer = (size_t)2 * l->n_kv_heads * l->block_tokens;
	if (codec == KVT_KV_CODEC_F16) {
		const size_t layer_bytes = vec_per_layer * l->head_dim * 2;
		off[0] = l0 * layer_bytes;
		len[0] = g * layer_bytes;
		return 1;
	}
	const size_t codes_per_layer = vec_per_layer * l->head_dim;
	/* every 8-bit format keeps its scales layer after layer behind the codes (gpu/dev.h, "Block codecs") */
	const size_t scales_per_layer = (kvt_kv_packed_bytes(l, codec) - l->n_layers * codes_per_layer) / l->n_layers;
	off[0] = l0 * codes_per_layer;
	len[0] = g * codes_per_layer;
	off[1] = (size_t)l->n_layers * codes_per_layer + l0 * scales_per_layer;
	len[1] = g * scales_per_layer;
	return 2;
}

/*
 * The length of the run of copied blocks from i whose T1 slots are adjacent
 * in the pool (and, with t0_too, whose T0 units are adjacent too), at most
 * max: one strided copy per byte range moves the whole run.
 */
static uint32_t lay_run(const kvt_tm *tm, const kvt_tm_layered *p, uint32_t i, uint32_t max, bool t0_too)
{
	const size_t t1_bytes = tm->packed_bytes;
	uint32_t n = 1;
	while (i + n < p->n_copied && n < max &&
	       (const unsigned char *)p->src[i + n] == (const unsigned char *)p->src[i + n - 1] + t1_bytes &&
	       (!t0_too || p->units[i + n] == p->units[i + n - 1] + 1))
		n++;
	return n;
}

/* Issue group grp's copies (and unpacks) of the copied blocks on the layered stream. */
static int lay_issue_group(kvt_tm *tm, kvt_tm_layered *p, uint32_t grp)
{
	tm_lay *ly = tm->lay;
	kvt_dev *d = tm->cfg.dev;
	const kvt_kv_layout *l = kvt_t0_layout(tm->cfg.t0);
	const uint32_t G = p->layers_per_group, l0 = grp * G;
	const size_t t0_bytes = kvt_t0_block_bytes(tm->cfg.t0), t1_bytes = tm->packed_bytes;
	size_t off[2], len[2];
	int rc = KVT_OK;

	if (tm->cfg.layered_fault && (rc = tm->cfg.layered_fault(tm->cfg.layered_fault_user, grp))) {
		KVT_LOGE("tm: layered promotion: the copy of layer group %u failed: %s", grp, kvt_strerror(rc));
		return rc;
	}
	if (l->codec == tm->cfg.t1_codec) { /* the records as they are: straight into the T0 slots */
		const uint32_t nr = lay_ranges(l, l->codec, l0, G, off, len);
		for (uint32_t i = 0, run; i < p->n_copied && rc == KVT_OK; i += run) {
			run = lay_run(tm, p, i, p->n_copied, true);
			unsigned char *dst = (unsigned char *)l->pool + (size_t)p->units[i] * t0_bytes;
			const unsigned char *src = p->src[i];
			for (uint32_t r = 0; r < nr && rc == KVT_OK; r++)
				rc = kvt_dev_copy_2d_async(d, ly->stream, dst + off[r], t0_bytes, src + off[r], t1_bytes, len[r],
							   run, KVT_COPY_H2D);
		}
		return rc;
	}
	/* 8-bit T1 into an fp16 pool: gather sub-blocks, unpack a chunk at a time. */
	kvt_kv_layout sub = *l;
	sub.n_layers = G;
	sub.n_slots = l->n_slots * (l->n_layers / G);
	const size_t sub_bytes = kvt_kv_packed_bytes(&sub, tm->cfg.t1_codec);
	const uint32_t cap = (uint32_t)(ly->stage_bytes / sub_bytes);
	const uint32_t nr = lay_ranges(l, tm->cfg.t1_codec, l0, G, off, len);
	KVT_ASSERT(cap >= 1 && nr == 2);
	int32_t unit[TM_LAY_STAGE_MIN_BLOCKS];
	for (uint32_t b0 = 0; b0 < p->n_copied && rc == KVT_OK;) {
		uint32_t nb = p->n_copied - b0;
		if (nb > cap)
			nb = cap;
		if (nb > TM_LAY_STAGE_MIN_BLOCKS)
			nb = TM_LAY_STAGE_MIN_BLOCKS;
		/* sub-block i of the chunk: the group's codes, then its scales (kvt_kv_packed_bytes of sub) */
		for (uint32_t i = 0, run; i < nb && rc == KVT_OK; i += run) {
			run = lay_run(tm, p, b0 + i, nb - i, false);
			const unsigned char *src = p->src[b0 + i];
			unsigned char *st = ly->d_stage + (size_t)i * sub_bytes;
			rc = kvt_dev_copy_2d_async(d, ly->stream, st, sub_bytes, src + off[0], t1_bytes, len[0], run,
						   KVT_COPY_H2D);
			if (rc == KVT_OK)
				rc = kvt_dev_copy_2d_async(d, ly->stream, st + len[0], sub_bytes, src + off[1], t1_bytes, len[1],
							   run, KVT_COPY_H2D);
		}
		for (uint32_t i = 0; i < nb; i++)
			unit[i] = p->units[b0 + i] * (int32_t)(l->n_layers / G) + (int32_t)grp;
		if (rc == KVT_OK) {
			kvt_kv_unpack_args a = { .kv = &sub, .codec = tm->cfg.t1_codec, .n_blocks = nb, .h_slots = unit,
						 .src = ly->d_stage };
			rc = kvt_dev_kv_unpack(d, ly->stream, &a);
		}
		b0 += nb;
	}
	return rc;
}

static int lay_cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

/* p->units[0, n_copied) holds block indices: order them by the blocks' T1 slots (key t1 << 32 | index). */
static void lay_sort_by_t1(kvt_tm_layered *p)
{
	for (uint32_t k = 0; k < p->n_copied; k++)
		p->order[k] = ((int64_t)p->t1[p->units[k]] << 32) | (uint32_t)p->units[k];
	qsort(p->order, p->n_copied, sizeof(int64_t), lay_cmp_i64);
	for (uint32_t k = 0; k < p->n_copied; k++)
		p->units[k] = (int32_t)(p->order[k] & 0xffffffff);
}

/* The promotion's arrays and itself (any may be NULL). */
static void lay_arrays_free(kvt_tm_layered *p)
{
	free(p->hashes);
	free(p->t0);
	free(p->t1);
	free(p->units);
	free(p->src);
	free(p->found);
	free(p->order);
	free(p);
}

/* Free the promotion's arrays and itself, and let the next layered promotion start. */
static void lay_free(kvt_tm *tm, kvt_tm_layered *p)
{
	pthread_mutex_lock(&tm->mu);
	tm->lay_active = false;
	pthread_mutex_unlock(&tm->mu);
	lay_arrays_free(p);
}

/* Give back what the promotion holds: the caller's slots (when drop_t0), our T1 references, the blocks. */
static void lay_release(kvt_tm *tm, kvt_tm_layered *p, uint32_t n_held, bool drop_t0)
{
	for (uint32_t i = 0; i < n_held; i++) {
		if (drop_t0 && p->t0[i] >= 0)
			kvt_t0_unref(tm->cfg.t0, p->t0[i]);
		if (p->t1[i] >= 0)
			kvt_t1_unref(tm->t1, p->t1[i]);
		tm_busy_release(tm, p->hashes[i]);
	}
	lay_free(tm, p);
}

/* A promotion of n blocks with its arrays (t0, t1 = -1), or NULL without memory. */
static kvt_tm_layered *lay_alloc(uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES])
{
	kvt_tm_layered *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->hashes = malloc((size_t)n * KVT_HASH_BYTES);
	p->t0 = malloc(n * sizeof(int32_t));
	p->t1 = malloc(n * sizeof(int32_t));
	p->units = malloc(n * sizeof(int32_t));
	p->src = malloc(n * sizeof(*p->src));
	p->found = malloc(n);
	p->order = malloc(n * sizeof(int64_t));
	if (!p->hashes || !p->t0 || !p->t1 || !p->units || !p->src || !p->found || !p->order) {
		lay_arrays_free(p);
		return NULL;
	}
	memcpy(p->hashes, hashes, (size_t)n * KVT_HASH_BYTES);
	p->n = n;
	for (uint32_t i = 0; i < n; i++)
		p->t0[i] = p->t1[i] = -1;
	return p;
}

/*
 * Hold every block (busy; *n_held counts them) and take its bytes: a block
 * in T0 gets the caller's reference on its slot, one in T1 our reference on
 * its T1 slot and a place in the copy list (units: its index, for now).
 * Never waits while holding (tm_int.h's no-cycle rule): a busy block means
 * "not now" (KVT_EBUSY); one in neither tier is a miss (KVT_ENOTFOUND).
 */
static int lay_hold(kvt_tm *tm, kvt_tm_layered *p, uint32_t *n_held)
{
	for (; *n_held < p->n; (*n_held)++)
		if (!tm_busy_try(tm, p->hashes[*n_held]))
			return KVT_EBUSY;
	for (uint32_t i = 0; i < p->n; i++) {
		kvt_btable_entry e;
		if (kvt_btable_get(tm->cfg.bt, p->hashes[i], &e) != KVT_OK ||
		    (e.slot[KVT_TIER_HBM] < 0 && e.slot[KVT_TIER_HOST] < 0))
			return KVT_ENOTFOUND;
		if (e.slot[KVT_TIER_HBM] >= 0) { /* busy-held: the slot cannot leave the table before the ref */
			p->found[i] = KVT_TIER_HBM;
			kvt_t0_ref(tm->cfg.t0, e.slot[KVT_TIER_HBM]);
			p->t0[i] = e.slot[KVT_TIER_HBM];
			continue;
		}
		p->found[i] = KVT_TIER_HOST;
		p->t1[i] = e.slot[KVT_TIER_HOST];
		kvt_t1_ref(tm->t1, p->t1[i]);
		p->units[p->n_copied++] = (int32_t)i;
	}
	return KVT_OK;
}

/*
 * New T0 slots for the copied blocks. The copies go in T1 slot order (any
 * order is correct: each block's bytes go to its own slot), and the T0 slots
 * are taken in that order, so that slots adjacent in T1 (a history demoted
 * together) make runs that one strided copy moves (lay_run).
 */
static int lay_take_t0(kvt_tm *tm, kvt_tm_layered *p)
{
	lay_sort_by_t1(p);
	for (uint32_t k = 0; k < p->n_copied; k++) {
		const uint32_t i = (uint32_t)p->units[k];
		if (kvt_t0_alloc(tm->cfg.t0, &p->t0[i])) {
			p->t0[i] = -1;
			return KVT_EFULL;
		}
		p->units[k] = p->t0[i];
		p->src[k] = kvt_t1_slot_ptr(tm->t1, p->t1[i]);
	}
	return KVT_OK;
}

/* The copies, group after group on the layered stream, each followed by its event. */
static int lay_issue(kvt_tm *tm, kvt_tm_layered *p)
{
	tm_lay *ly = tm->lay;
	p->events = ly->events;
	p->t_start = kvt_now_s();
	pthread_mutex_lock(&tm->mu); /* after the engine's writes (as the movers: tm_wait_compute) */
	int rc = kvt_dev_stream_wait_event(tm->cfg.dev, ly->stream, tm->ev_compute);
	pthread_mutex_unlock(&tm->mu);
	for (uint32_t g = 0; g < p->n_groups && rc == KVT_OK; g++) {
		if (p->n_copied)
			rc = lay_issue_group(tm, p, g);
		if (rc == KVT_OK)
			rc = kvt_dev_event_record(tm->cfg.dev, ly->events[g], ly->stream);
	}
	if (rc) {
		/* NOTE: sync even after a failure, so no copy is still writing a slot we give back. */
		(void)kvt_dev_stream_sync(tm->cfg.dev, ly->stream);
		pthread_mutex_lock(&tm->mu);
		tm->st.n_layered_failed++;
		pthread_mutex_unlock(&tm->mu);
	}
	return rc;
}

/* The arguments' check (logged); KVT_EINVAL or KVT_OK. */
static int lay_check_args(kvt_tm *tm, uint32_t n, const void *hashes, uint32_t n_groups, const int32_t *t0_slots,
			  kvt_tm_layered **out)
{
	const kvt_kv_layout *l = kvt_t0_layout(tm->cfg.t0);
	if (!n || !hashes || !t0_slots || !out || !n_groups) {
		KVT_LOGE("tm: layered promotion of %u blocks in %u layer groups (need >= 1 of each, hashes, slots, out)",
			 n, n_groups);
		return KVT_EINVAL;
	}
	if (l->codec != KVT_KV_CODEC_F16 && l->codec != tm->cfg.t1_codec) {
		KVT_LOGE("tm: layered promotion: a %s T0 pool cannot take %s T1 records", kvt_kv_codec_name(l->codec),
			 kvt_kv_codec_name(tm->cfg.t1_codec));
		return KVT_EINVAL;
	}
	return KVT_OK;
}

/* The blocks of hashes not in T0 now (the T0 room the promotion needs). */
static uint32_t lay_t0_needed(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES])
{
	uint32_t n_need = 0;
	for (uint32_t i = 0; i < n; i++) {
		kvt_btable_entry e;
		n_need += kvt_btable_get(tm->cfg.bt, hashes[i], &e) == KVT_OK && e.slot[KVT_TIER_HBM] < 0;
	}
	return n_need;
}

int kvt_tm_promote_layered(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], uint32_t n_groups,
			   int32_t *t0_slots, kvt_tm_layered **out)
{
	const kvt_kv_layout *l = kvt_t0_layout(tm->cfg.t0);
	int rc = lay_check_args(tm, n, hashes, n_groups, t0_slots, out);
	if (rc)
		return rc;
	pthread_mutex_lock(&tm->mu);
	bool busy = tm->lay_active;
	tm->lay_active = true;
	pthread_mutex_unlock(&tm->mu);
	if (busy)
		return KVT_EBUSY;
	kvt_tm_layered *p = lay_alloc(n, hashes);
	uint32_t n_held = 0, n_need;
	if (!p || (rc = lay_init(tm))) {
		if (!p)
			rc = KVT_ENOMEM;
		goto fail;
	}
	p->layers_per_group = lay_group_layers(l->n_layers, n_groups);
	p->n_groups = l->n_layers / p->layers_per_group;
	/* T0 room first, holding nothing (reserving may wait for blocks other threads move). */
	n_need = lay_t0_needed(tm, n, hashes);
	if (n_need && kvt_tm_reserve_t0(tm, n_need) != KVT_OK)
		rc = KVT_EFULL;
	if (rc == KVT_OK)
		rc = lay_hold(tm, p, &n_held);
	if (rc == KVT_OK)
		rc = lay_take_t0(tm, p);
	if (rc == KVT_OK)
		rc = lay_issue(tm, p);
	if (rc)
		goto fail;
	for (uint32_t i = 0; i < n; i++)
		tm_count_lookup(tm, p->found[i]);
	pthread_mutex_lock(&tm->mu);
	tm->st.n_layered_calls++;
	pthread_mutex_unlock(&tm->mu);
	memcpy(t0_slots, p->t0, n * sizeof(int32_t));
	*out = p;
	return KVT_OK;
fail:
	if (!p) {
		pthread_mutex_lock(&tm->mu);
		tm->lay_active = false;
		pthread_mutex_unlock(&tm->mu);
		return rc;
	}
	if (rc == KVT_EFULL) /* the other failures were logged where they were found (busy and misses are not errors) */
		KVT_LOGW("tm: layered promotion of %u blocks: no room in T0 (nothing promoted)", n);
	lay_release(tm, p, n_held, true);
	return rc;
}

void kvt_tm_layered_groups(const kvt_tm_layered *p, kvt_event *const **events, uint32_t *n_groups,
			   uint32_t *layers_per_group)
{
	*n_groups = p->n_groups;
	*layers_per_group = p->layers_per_group;
	*events = p->events;
}

uint32_t kvt_tm_layered_n_copied(const kvt_tm_layered *p) { return p->n_copied; }

int kvt_tm_layered_finish(kvt_tm *tm, kvt_tm_layered *p)
{
	if (!p)
		return KVT_OK;
	int rc = kvt_dev_stream_sync(tm->cfg.dev, tm->lay->stream);
	if (rc)
		KVT_LOGE("tm: layered promotion of %u blocks: the copies failed: %s (the blocks stay in T1)", p->n,
			 kvt_strerror(rc));
	uint32_t n_pub = 0;
	for (uint32_t i = 0; i < p->n && rc == KVT_OK; i++) {
		if (p->t1[i] < 0)
			continue;
		/* The manager's own reference, then the table names the slot (the caller keeps its own). */
		kvt_t0_ref(tm->cfg.t0, p->t0[i]);
		if (kvt_btable_set_t0_unpacked(tm->cfg.bt, p->hashes[i], p->t0[i], tm->cfg.t1_codec != KVT_KV_CODEC_F16) !=
		    KVT_OK) {
			kvt_t0_unref(tm->cfg.t0, p->t0[i]);
			continue;
		}
		n_pub++;
	}
	for (uint32_t i = 0; i < p->n && rc == KVT_OK; i++) {
		kvt_btable_entry e;
		(void)kvt_btable_touch(tm->cfg.bt, p->hashes[i]);
		if (tm->cfg.db && kvt_btable_get(tm->cfg.bt, p->hashes[i], &e) == KVT_OK && e.slot[KVT_TIER_NVME] >= 0)
			(void)kvt_db_touch_block(tm->cfg.db, p->hashes[i], kvt_wall_us(), e.hits, NULL, NULL, NULL);
	}
	pthread_mutex_lock(&tm->mu);
	if (rc == KVT_OK) {
		tm->st.tier[KVT_TIER_HBM].n_promotions += n_pub;
		tm->st.tier[KVT_TIER_HBM].promotion_bytes += (uint64_t)p->n_copied * tm->packed_bytes;
		tm->st.tier[KVT_TIER_HBM].promotion_s += kvt_now_s() - p->t_start;
		tm->st.n_layered += n_pub;
	} else {
		tm->st.n_layered_failed++;
	}
	pthread_mutex_unlock(&tm->mu);
	lay_release(tm, p, p->n, false);
	return rc;
}
