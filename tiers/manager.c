/*
 * tiers/manager.c — the tiering manager's core (see manager.h for the contract,
 * tm_int.h for how its files divide the work and the locking rules they share).
 *
 * Here: the busy set (which blocks some thread is moving), the small helpers
 * every part uses, create/destroy and the configuration check, registration
 * of new blocks (a block enters the table busy-held, then takes its T0 slot,
 * then joins the pending list: so no eviction can see it half-entered), pins,
 * lookups, statistics, the retention API (the ledger is retain.c), and the
 * maintenance thread, whose pass is: persistence due first (it has a
 * deadline), then turn answers, then the watermarks top down (what T0 pushes
 * out lands in T1, what T1 pushes out lands in T2).
 */
#include "tm_int.h"

static int busy_find(const kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	for (uint32_t i = 0; i < tm->n_busy; i++)
		if (!memcmp(tm->busy[i], h, KVT_HASH_BYTES))
			return (int)i;
	return -1;
}

/* Under tm->mu. */
static int busy_add_locked(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	if (tm->n_busy == tm->cap_busy) {
		uint32_t cap = tm->cap_busy ? 2 * tm->cap_busy : 64;
		void *p = realloc(tm->busy, cap * sizeof(*tm->busy));
		if (!p)
			return KVT_ENOMEM;
		tm->busy = p;
		tm->cap_busy = cap;
	}
	memcpy(tm->busy[tm->n_busy++], h, KVT_HASH_BYTES);
	return KVT_OK;
}

bool tm_busy_try(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	bool ok = false;
	pthread_mutex_lock(&tm->mu);
	if (busy_find(tm, h) < 0)
		ok = busy_add_locked(tm, h) == KVT_OK;
	pthread_mutex_unlock(&tm->mu);
	return ok;
}

int tm_busy_wait(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	pthread_mutex_lock(&tm->mu);
	while (busy_find(tm, h) >= 0)
		pthread_cond_wait(&tm->cv_done, &tm->mu);
	int rc = busy_add_locked(tm, h);
	pthread_mutex_unlock(&tm->mu);
	return rc;
}

void tm_busy_release(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	pthread_mutex_lock(&tm->mu);
	int i = busy_find(tm, h);
	KVT_ASSERT(i >= 0);
	memcpy(tm->busy[i], tm->busy[--tm->n_busy], KVT_HASH_BYTES);
	pthread_cond_broadcast(&tm->cv_done);
	pthread_mutex_unlock(&tm->mu);
}

/* The scale_layout a T2 record of this codec carries (manager.h). */
uint8_t tm_scale_layout_of(int codec)
{
	switch (codec) {
	case KVT_KV_CODEC_FP8: return KVT_TM_SCALE_LAYOUT_TOKEN_HEAD;
	case KVT_KV_CODEC_INT8: return KVT_TM_SCALE_LAYOUT_TOKEN_HEAD_32;
	case KVT_KV_CODEC_INT8KV1: return KVT_TM_SCALE_LAYOUT_KCHAN_VTOK32;
	case KVT_KV_CODEC_INT8KV: return KVT_TM_SCALE_LAYOUT_KCHAN8_VTOK16;
	}
	return 0;
}

bool tm_t2_writable(kvt_tm *tm)
{
	if (!tm->cfg.t2)
		return false;
	kvt_t2_stats s;
	kvt_t2_get_stats(tm->cfg.t2, &s);
	if (s.read_only)
		return false;
	pthread_mutex_lock(&tm->mu);
	/* A full store is retried once a second, or as soon as we free an extent;
	 * an index out of space once a second too. */
	bool full = (tm->t2_full && kvt_now_s() - tm->t2_full_t < 1.0) ||
		    (tm->db_full && kvt_now_s() - tm->db_full_t < 1.0);
	pthread_mutex_unlock(&tm->mu);
	return !full;
}

/* Order the mover after the engine's writes of registered blocks. */
int tm_wait_compute(kvt_tm *tm, tm_ctx *c)
{
	pthread_mutex_lock(&tm->mu);
	int rc = kvt_t1_mover_wait_event(c->mv, tm->ev_compute);
	pthread_mutex_unlock(&tm->mu);
	return rc;
}

static void maintain_locked(kvt_tm *tm, tm_ctx *c);

static void maintain(kvt_tm *tm, tm_ctx *c)
{
	pthread_mutex_lock(&tm->maint_mu);
	maintain_locked(tm, c);
	pthread_mutex_unlock(&tm->maint_mu);
}

/* One pass: persistence due, then the watermarks. Under maint_mu (the pending list's prefix is ours). */
static void maintain_locked(kvt_tm *tm, tm_ctx *c)
{
	/* Flush requests and turn ends first: they have a deadline. */
	pthread_mutex_lock(&tm->mu);
	uint64_t flush_target = tm->flush_req;
	bool due = tm->n_due > 0;
	pthread_mutex_unlock(&tm->mu);
	if (due)
		tm_persist_due(tm, c);
	bool writable = tm_t2_writable(tm);
	pthread_mutex_lock(&tm->mu);
	if (tm->flush_done < flush_target && (tm->n_due == 0 || !writable)) {
		tm->flush_done = flush_target;
		pthread_cond_broadcast(&tm->cv_done);
	}
	/* WRITE_BACK keeps every registered block on the list: drop those no longer dirty now and then. */
	uint32_t n_pend = tm->n_pend;
	pthread_mutex_unlock(&tm->mu);
	tm_turn_waits_answer(tm, false);
	if (n_pend > 4096) {
		pthread_mutex_lock(&tm->mu);
		uint32_t w = tm->n_due;
		for (uint32_t i = tm->n_due; i < tm->n_pend; i++) {
			kvt_btable_entry e;
			if (kvt_btable_get(tm->cfg.bt, tm->pend[i].hash, &e) == KVT_OK && e.dirty &&
			    (e.slot[KVT_TIER_HBM] >= 0 || e.slot[KVT_TIER_HOST] >= 0))
				tm->pend[w++] = tm->pend[i];
		}
		tm->n_pend = w;
		pthread_mutex_unlock(&tm->mu);
	}

	/* Retention whose TTL ran out: evictable already (the table compares deadlines); tidy the ledger now and then. */
	double now_s = kvt_now_s();
	if (now_s - tm->sweep_t > 1.0) {
		tm->sweep_t = now_s;
		tm_retain_sweep(tm->rt);
	}

	/* Watermarks, top down: what T0 pushes out lands in T1, what T1 pushes out lands in T2. */
	uint32_t n0 = kvt_t0_n_slots(tm->cfg.t0), used0 = n0 - kvt_t0_n_free(tm->cfg.t0);
	if (used0 > tm->cfg.high[KVT_TIER_HBM] * n0)
		tm_evict_t0(tm, c, n0 - (uint32_t)(tm->cfg.low[KVT_TIER_HBM] * n0), NULL, KVT_TM_PRESSURE_WATERMARK);
	uint32_t n1 = kvt_t1_n_slots(tm->t1), used1 = n1 - kvt_t1_n_free(tm->t1);
	if (used1 > tm->cfg.high[KVT_TIER_HOST] * n1)
		tm_evict_t1(tm, c, n1 - (uint32_t)(tm->cfg.low[KVT_TIER_HOST] * n1), KVT_TM_PRESSURE_WATERMARK);
	if (tm->cfg.t2) {
		kvt_t2_stats s;
		kvt_t2_get_stats(tm->cfg.t2, &s);
		if (s.used_bytes > tm->cfg.high[KVT_TIER_NVME] * (double)s.capacity_bytes)
			tm_evict_t2(tm, c, (uint64_t)(tm->cfg.low[KVT_TIER_NVME] * (double)s.capacity_bytes));
	}
}

static void *maint_main(void *arg)
{
	kvt_tm *tm = arg;
	tm_ctx *c = &tm->wctx[tm->cfg.n_io_threads];
	pthread_mutex_lock(&tm->mu);
	while (!tm->stop) {
		if (!tm->maint_kick) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			long ns = ts.tv_nsec + (long)(tm->cfg.poll_s * 1e9);
			ts.tv_sec += ns / 1000000000L;
			ts.tv_nsec = ns % 1000000000L;
			pthread_cond_timedwait(&tm->cv_maint, &tm->mu, &ts);
		}
		if (tm->stop)
			break;
		tm->maint_kick = false;
		pthread_mutex_unlock(&tm->mu);
		maintain(tm, c);
		pthread_mutex_lock(&tm->mu);
	}
	pthread_mutex_unlock(&tm->mu);
	return NULL;
}

void tm_kick(kvt_tm *tm)
{
	pthread_mutex_lock(&tm->mu);
	tm->maint_kick = true;
	pthread_cond_signal(&tm->cv_maint);
	pthread_mutex_unlock(&tm->mu);
}

void kvt_tm_config_default(kvt_tm_config *c)
{
	memset(c, 0, sizeof(*c));
	c->t1_slots = 256;
	c->t1_codec = KVT_KV_CODEC_INT8KV;
	c->high[KVT_TIER_HBM] = 0.90f;
	c->low[KVT_TIER_HBM] = 0.75f;
	c->high[KVT_TIER_HOST] = 0.90f;
	c->low[KVT_TIER_HOST] = 0.80f;
	c->high[KVT_TIER_NVME] = 0.95f;
	c->low[KVT_TIER_NVME] = 0.85f;
	c->persist = KVT_PERSIST_END_OF_TURN;
	c->end_turn_s = 1.0;
	c->n_io_threads = 2;
	c->batch_blocks = 16;
	c->poll_s = 0.02;
	c->chunk_share = 0.5f;
}

static int ctx_init(kvt_tm *tm, tm_ctx *c)
{
	const kvt_kv_layout *l = kvt_t0_layout(tm->cfg.t0);
	int rc = kvt_t1_mover_create(tm->cfg.dev, tm->cfg.t0, tm->cfg.t1_codec, tm->cfg.batch_blocks, &c->mv);
	if (rc == KVT_OK)
		rc = kvt_dev_host_alloc(tm->cfg.dev, tm->rec_bytes * tm->cfg.batch_blocks, (void **)&c->h_stage);
	/* an 8-bit T0 pool takes only its own codec: then records of other formats stay misses */
	for (int k = 0; k < KVT_KV_CODEC_COUNT && rc == KVT_OK && l->codec == KVT_KV_CODEC_F16; k++)
		if (k != tm->cfg.t1_codec)
			rc = kvt_t1_mover_create(tm->cfg.dev, tm->cfg.t0, k, 1, &c->mv_rec[k]);
	if (rc == KVT_OK)
		rc = kvt_dev_host_alloc(tm->cfg.dev, tm->block_bytes, (void **)&c->h_rec);
	pthread_mutex_init(&c->mu, NULL);
	return rc;
}

static void ctx_deinit(kvt_tm *tm, tm_ctx *c)
{
	kvt_t1_mover_destroy(c->mv);
	for (int k = 0; k < KVT_KV_CODEC_COUNT; k++)
		kvt_t1_mover_destroy(c->mv_rec[k]);
	kvt_dev_host_free(tm->cfg.dev, c->h_rec);
	kvt_dev_host_free(tm->cfg.dev, c->h_stage);
	pthread_mutex_destroy(&c->mu);
}

static int check_config(const kvt_tm_config *c)
{
	static const char *const tier_name[KVT_TIER_COUNT] = { "t0", "t1", "t2" };
	if (!c->dev || !c->t0 || !c->bt) {
		KVT_LOGE("tm config: dev, t0 and bt are required");
		return KVT_EINVAL;
	}
	if (c->t2 && !c->db) {
		KVT_LOGE("tm config: a T2 store needs the index (db): its rows make records durable");
		return KVT_EINVAL;
	}
	if (!c->t1_slots) {
		KVT_LOGE("tm config: t1_slots is 0");
		return KVT_EINVAL;
	}
	if (c->t1_codec < 0 || c->t1_codec >= KVT_KV_CODEC_COUNT) {
		KVT_LOGE("tm config: t1_codec %d is not f16, fp8, int8, int8kv1 or int8kv", c->t1_codec);
		return KVT_EINVAL;
	}
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		if (!(c->high[t] > 0 && c->high[t] <= 1 && c->low[t] >= 0 && c->low[t] < c->high[t])) {
			KVT_LOGE("tm config: %s watermarks high %g low %g (need 0 <= low < high <= 1)", tier_name[t],
				 c->high[t], c->low[t]);
			return KVT_EINVAL;
		}
	}
	if (c->persist != KVT_PERSIST_END_OF_TURN && c->persist != KVT_PERSIST_WRITE_BACK) {
		KVT_LOGE("tm config: persist policy %d", c->persist);
		return KVT_EINVAL;
	}
	if (c->n_io_threads < 1 || c->n_io_threads > 16) {
		KVT_LOGE("tm config: n_io_threads %u (1..16)", c->n_io_threads);
		return KVT_EINVAL;
	}
	if (c->batch_blocks < 1 || c->batch_blocks > 1024) {
		KVT_LOGE("tm config: batch_blocks %u (1..1024)", c->batch_blocks);
		return KVT_EINVAL;
	}
	if (!(c->chunk_share >= 0 && c->chunk_share <= 1)) {
		KVT_LOGE("tm config: chunk_share %g (need 0..1)", c->chunk_share);
		return KVT_EINVAL;
	}
	if (!(c->end_turn_s > 0) || !(c->poll_s > 0) || c->poll_s > 10) {
		KVT_LOGE("tm config: end_turn_s %g, poll_s %g (need > 0, poll_s <= 10)", c->end_turn_s, c->poll_s);
		return KVT_EINVAL;
	}
	int t0_codec = kvt_t0_layout(c->t0)->codec;
	if (t0_codec != KVT_KV_CODEC_F16 && t0_codec != c->t1_codec) {
		KVT_LOGE("tm config: T0 keeps %s blocks; T1 must use the same codec, not %s", kvt_kv_codec_name(t0_codec),
			 kvt_kv_codec_name(c->t1_codec));
		return KVT_EINVAL;
	}
	if (c->t2_f16 && t0_codec != KVT_KV_CODEC_F16) {
		KVT_LOGE("tm config: f16 T2 records need an fp16 T0 pool (T0 keeps %s)", kvt_kv_codec_name(t0_codec));
		return KVT_EINVAL;
	}
	if (kvt_btable_block_tokens(c->bt) != kvt_t0_layout(c->t0)->block_tokens) {
		KVT_LOGE("tm config: the table's blocks have %u tokens, T0's %u", kvt_btable_block_tokens(c->bt),
			 kvt_t0_layout(c->t0)->block_tokens);
		return KVT_EINVAL;
	}
	return KVT_OK;
}

static uint64_t wall_clock(void *user)
{
	(void)user;
	return kvt_wall_us();
}

int kvt_tm_create(const kvt_tm_config *cfg, kvt_tm **out)
{
	int rc = check_config(cfg);
	if (rc)
		return rc;
	kvt_tm *tm = calloc(1, sizeof(*tm));
	if (!tm)
		return KVT_ENOMEM;
	tm->cfg = *cfg;
	if (cfg->t2) {
		kvt_rstore_t2_init(&tm->t2rs, cfg->t2);
		tm->rs2 = &tm->t2rs;
	}
	if (cfg->t3) {
		kvt_rstore_t3_init(&tm->t3rs, cfg->t3);
		tm->rs3 = &tm->t3rs;
	}
	tm->block_bytes = kvt_kv_packed_bytes(kvt_t0_layout(cfg->t0), KVT_KV_CODEC_F16);
	tm->packed_bytes = kvt_kv_packed_bytes(kvt_t0_layout(cfg->t0), cfg->t1_codec);
	tm->rec_codec = cfg->t2_f16 ? KVT_KV_CODEC_F16 : cfg->t1_codec;
	tm->rec_bytes = kvt_kv_packed_bytes(kvt_t0_layout(cfg->t0), tm->rec_codec);
	pthread_mutex_init(&tm->mu, NULL);
	pthread_mutex_init(&tm->pin_mu, NULL);
	pthread_mutex_init(&tm->maint_mu, NULL);
	pthread_cond_init(&tm->cv_work, NULL);
	pthread_cond_init(&tm->cv_done, NULL);
	pthread_cond_init(&tm->cv_maint, NULL);
	pthread_cond_init(&tm->cv_remote, NULL);
	tm->wctx = calloc(cfg->n_io_threads + 2, sizeof(*tm->wctx)); /* workers, maintenance, the T3 writer */
	tm->workers = calloc(cfg->n_io_threads, sizeof(*tm->workers));
	if (!tm->wctx || !tm->workers) {
		rc = KVT_ENOMEM;
		goto fail;
	}
	rc = kvt_t1_create(cfg->dev, kvt_t0_layout(cfg->t0), cfg->t1_codec, cfg->t1_slots, &tm->t1);
	if (rc == KVT_OK)
		rc = kvt_dev_event_create(cfg->dev, &tm->ev_compute);
	if (rc == KVT_OK)
		rc = kvt_dev_event_record(cfg->dev, tm->ev_compute, NULL);
	for (uint32_t i = 0; i <= cfg->n_io_threads + (cfg->t3 != NULL) && rc == KVT_OK; i++)
		rc = ctx_init(tm, &tm->wctx[i]);
	if (rc == KVT_OK)
		rc = ctx_init(tm, &tm->ctx_inline);
	if (rc == KVT_OK) {
		tm_retain_config rc_cfg = { .bt = cfg->bt, .db = cfg->t2 ? cfg->db : NULL,
					    .clock_us = cfg->clock_us ? cfg->clock_us : wall_clock,
					    .clock_user = cfg->clock_user };
		rc_cfg.cost[KVT_TIER_HBM] = kvt_t0_block_bytes(cfg->t0);
		rc_cfg.cost[KVT_TIER_HOST] = rc_cfg.cost[KVT_TIER_NVME] = tm->packed_bytes;
		rc_cfg.on_expired = tm_tomb_expired;
		rc_cfg.on_expired_user = tm;
		rc = tm_retain_create(&rc_cfg, &tm->rt);
	}
	if (rc == KVT_OK)
		rc = tm_tomb_create(tm);
	if (rc)
		goto fail;
	for (uint32_t i = 0; i < cfg->n_io_threads; i++) {
		tm_worker_arg *a = malloc(sizeof(*a));
		if (!a) {
			rc = KVT_ENOMEM;
			goto fail;
		}
		a->tm = tm;
		a->ctx = &tm->wctx[i];
		if (pthread_create(&tm->workers[i], NULL, tm_worker_main, a)) {
			free(a);
			KVT_LOGE("tm: cannot start I/O thread %u", i);
			rc = KVT_ENOMEM;
			goto fail;
		}
		tm->n_workers++;
	}
	if (pthread_create(&tm->maint, NULL, maint_main, tm)) {
		KVT_LOGE("tm: cannot start the maintenance thread");
		rc = KVT_ENOMEM;
		goto fail;
	}
	tm->maint_started = true;
	if (cfg->t3) {
		if (pthread_create(&tm->rwriter, NULL, tm_remote_main, tm)) {
			KVT_LOGE("tm: cannot start the T3 writer thread");
			rc = KVT_ENOMEM;
			goto fail;
		}
		tm->rwriter_started = true;
	}
	*out = tm;
	return KVT_OK;
fail:
	kvt_tm_destroy(tm);
	return rc;
}

void kvt_tm_destroy(kvt_tm *tm)
{
	if (!tm)
		return;
	if (tm->maint_started && tm->cfg.t2) {
		int rc = kvt_tm_flush(tm);
		if (rc != KVT_OK)
			KVT_LOGW("tm: shutdown flush: %s (the unflushed blocks are lost)", kvt_strerror(rc));
	}
	pthread_mutex_lock(&tm->mu);
	tm->stop = true;
	pthread_cond_broadcast(&tm->cv_work);
	pthread_cond_broadcast(&tm->cv_maint);
	pthread_cond_broadcast(&tm->cv_remote);
	pthread_mutex_unlock(&tm->mu);
	for (uint32_t i = 0; i < tm->n_workers; i++)
		pthread_join(tm->workers[i], NULL);
	if (tm->maint_started)
		pthread_join(tm->maint, NULL);
	if (tm->rwriter_started)
		pthread_join(tm->rwriter, NULL); /* it wrote what was due and reachable */
	tm_turn_waits_answer(tm, true);
	if (tm->t1) {
		tm_release_tier(tm, KVT_TIER_HBM);
		tm_release_tier(tm, KVT_TIER_HOST);
	}
	if (tm->wctx)
		for (uint32_t i = 0; i <= tm->cfg.n_io_threads + 1; i++)
			if (tm->wctx[i].mv || tm->wctx[i].h_stage)
				ctx_deinit(tm, &tm->wctx[i]);
	if (tm->ctx_inline.mv || tm->ctx_inline.h_stage)
		ctx_deinit(tm, &tm->ctx_inline);
	kvt_dev_event_destroy(tm->cfg.dev, tm->ev_compute);
	tm_lay_destroy(tm);
	kvt_t1_destroy(tm->t1);
	tm_retain_destroy(tm->rt);
	tm_tomb_destroy(tm);
	pthread_mutex_destroy(&tm->mu);
	pthread_mutex_destroy(&tm->pin_mu);
	pthread_mutex_destroy(&tm->maint_mu);
	pthread_cond_destroy(&tm->cv_work);
	pthread_cond_destroy(&tm->cv_done);
	pthread_cond_destroy(&tm->cv_maint);
	pthread_cond_destroy(&tm->cv_remote);
	for (uint32_t i = 0; i < tm->n_rs; i++)
		kvt_db_session_deinit(&tm->rs[i]);
	free(tm->rs);
	free(tm->rq);
	free(tm->foreign);
	free(tm->wctx);
	free(tm->workers);
	free(tm->busy);
	free(tm->pend);
	free(tm);
}

kvt_t1_pool *kvt_tm_t1(kvt_tm *tm) { return tm->t1; }

int kvt_tm_recover(kvt_tm *tm, uint64_t *n_blocks)
{
	if (!tm->cfg.t2) {
		KVT_LOGE("tm recover: no T2 store configured");
		return KVT_EINVAL;
	}
	tm_recovery r;
	int rc = tm_recover_rows(tm->cfg.db, tm->cfg.t2, tm->cfg.bt, tm->rt, &r); /* tiers/recover.c */
	tm_retain_enforce(tm->rt); /* quotas may have shrunk since the rows were written */
	pthread_mutex_lock(&tm->mu);
	tm->st.n_lost = r.n_lost;
	tm->st.n_skipped = r.n_skipped;
	tm->st.n_foreign = r.n_foreign;
	free(tm->foreign);
	tm->foreign = r.foreign;
	tm->n_foreign = r.n_foreign;
	tm->next_foreign = 0;
	pthread_mutex_unlock(&tm->mu);
	if (rc == KVT_OK && n_blocks)
		*n_blocks = r.n_loaded;
	return rc;
}

int kvt_tm_register(kvt_tm *tm, const uint8_t hash[KVT_HASH_BYTES], const uint8_t parent[KVT_HASH_BYTES],
		    const int32_t *tokens, int32_t t0_slot)
{
	return kvt_tm_register_kind(tm, hash, parent, tokens, t0_slot, KVT_BLOCK_PREFIX);
}

int kvt_tm_register_kind(kvt_tm *tm, const uint8_t hash[KVT_HASH_BYTES], const uint8_t parent[KVT_HASH_BYTES],
			 const int32_t *tokens, int32_t t0_slot, int kind)
{
	bool created;
	kvt_btable_entry e;

	if (kind < 0 || kind >= KVT_BLOCK_KIND_COUNT) {
		KVT_LOGE("tm register: block kind %d (0 prefix, 1 chunk)", kind);
		return KVT_EINVAL;
	}
	if (t0_slot < 0 || (uint32_t)t0_slot >= kvt_t0_n_slots(tm->cfg.t0) || kvt_t0_refcount(tm->cfg.t0, t0_slot) == 0) {
		KVT_LOGE("tm register: T0 slot %d is not a slot in use", t0_slot);
		return KVT_EINVAL;
	}
	/* Busy first: no eviction can remove the entry between its insert and its T0 slot. */
	int rc = tm_busy_wait(tm, hash);
	if (rc)
		return rc;
	rc = kvt_btable_insert(tm->cfg.bt, hash, parent, tokens, &created);
	/* The kind before the T0 slot: the block is counted in its kind's share from the start. A known block
	 * takes the kind it is registered with (one that came from T3, or a rebuilt index, came as a prefix). */
	if (rc == KVT_OK)
		rc = kvt_btable_set_kind(tm->cfg.bt, hash, kind);
	if (rc) {
		tm_busy_release(tm, hash);
		return rc;
	}
	/* The pack that may follow must see the engine's writes of this slot. */
	pthread_mutex_lock(&tm->mu);
	rc = kvt_dev_event_record(tm->cfg.dev, tm->ev_compute, NULL);
	pthread_mutex_unlock(&tm->mu);
	if (rc == KVT_OK)
		rc = kvt_btable_get(tm->cfg.bt, hash, &e);
	if (rc == KVT_OK && e.slot[KVT_TIER_HBM] < 0) {
		kvt_t0_ref(tm->cfg.t0, t0_slot);
		rc = kvt_btable_set_slot(tm->cfg.bt, hash, KVT_TIER_HBM, t0_slot);
		if (rc != KVT_OK)
			kvt_t0_unref(tm->cfg.t0, t0_slot);
	}
	if (rc == KVT_OK)
		(void)kvt_btable_touch(tm->cfg.bt, hash);
	/* A new block, or a known one whose durable copy was lost (e.g. a corrupt record), is pending. */
	if (rc == KVT_OK && (created || (e.dirty && e.slot[KVT_TIER_NVME] < 0))) {
		pthread_mutex_lock(&tm->mu);
		rc = tm_pend_add_locked(tm, hash);
		tm->st.n_registered += created;
		if (created && tm->cfg.t3 && kvt_t3_write_policy(tm->cfg.t3) == KVT_T3_WRITE_THROUGH)
			tm_remote_queue_locked(tm, hash);
		pthread_mutex_unlock(&tm->mu);
	}
	tm_busy_release(tm, hash);
	/* T0 use may have crossed the high watermark. */
	uint32_t n0 = kvt_t0_n_slots(tm->cfg.t0);
	if (n0 - kvt_t0_n_free(tm->cfg.t0) > tm->cfg.high[KVT_TIER_HBM] * n0)
		tm_kick(tm);
	return rc;
}

int kvt_tm_pin(kvt_tm *tm, const uint8_t hash[KVT_HASH_BYTES])
{
	pthread_mutex_lock(&tm->pin_mu);
	int rc = kvt_btable_pin(tm->cfg.bt, hash);
	pthread_mutex_unlock(&tm->pin_mu);
	return rc;
}

int kvt_tm_unpin(kvt_tm *tm, const uint8_t hash[KVT_HASH_BYTES])
{
	return kvt_btable_unpin(tm->cfg.bt, hash);
}

int kvt_tm_lookup(kvt_tm *tm, const uint8_t root[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n_tokens,
		  unsigned flags, kvt_btable_match *out, uint32_t cap, uint32_t *n_hashed, uint32_t *n_matched)
{
	uint32_t nh = 0, nm = 0;
	if (flags & KVT_BT_PIN)
		pthread_mutex_lock(&tm->pin_mu);
	int rc = kvt_btable_lookup(tm->cfg.bt, root, tokens, n_tokens, flags, out, cap, &nh, &nm);
	if (flags & KVT_BT_PIN)
		pthread_mutex_unlock(&tm->pin_mu);
	if (rc != KVT_OK)
		return rc;
	if (nm < nh)
		tm_count_lookup(tm, -1); /* the first full block past the cached prefix */
	if (n_hashed)
		*n_hashed = nh;
	if (n_matched)
		*n_matched = nm;
	return KVT_OK;
}

int kvt_tm_lookup_chain(kvt_tm *tm, const uint8_t (*hashes)[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n,
			unsigned flags, kvt_btable_match *out, uint32_t *n_matched)
{
	uint32_t nm = 0;
	if (flags & KVT_BT_PIN)
		pthread_mutex_lock(&tm->pin_mu);
	int rc = kvt_btable_lookup_chain(tm->cfg.bt, hashes, tokens, n, flags, out, &nm);
	if (flags & KVT_BT_PIN)
		pthread_mutex_unlock(&tm->pin_mu);
	if (rc != KVT_OK)
		return rc;
	if (nm < n)
		tm_count_lookup(tm, -1); /* the first full block past the cached prefix */
	*n_matched = nm;
	return KVT_OK;
}

kvt_tm_prefix **tm_lay_owner(kvt_tm *tm) { return &tm->lay_owner; }
size_t tm_packed_bytes(const kvt_tm *tm) { return tm->packed_bytes; }
kvt_t0_pool *tm_t0(kvt_tm *tm) { return tm->cfg.t0; }
kvt_btable *tm_bt(kvt_tm *tm) { return tm->cfg.bt; }
bool tm_lossy(const kvt_tm *tm) { return tm->cfg.t1_codec != KVT_KV_CODEC_F16; }

void kvt_tm_maintain(kvt_tm *tm)
{
	pthread_mutex_lock(&tm->ctx_inline.mu);
	maintain(tm, &tm->ctx_inline);
	pthread_mutex_unlock(&tm->ctx_inline.mu);
}

void kvt_tm_get_stats(kvt_tm *tm, kvt_tm_stats *st)
{
	pthread_mutex_lock(&tm->mu);
	*st = tm->st;
	bool full = tm->t2_full;
	st->n_remote_queued = tm->n_rq + tm->n_rs + tm->remote_inflight_n; /* the batch being sent too: 0 means written */
	pthread_mutex_unlock(&tm->mu);
	if (tm->cfg.t3) {
		st->has_remote = true;
		kvt_t3_get_stats(tm->cfg.t3, &st->t3);
		st->remote.n_corrupt = st->t3.n_corrupt;
		st->remote.degraded = st->t3.degraded;
	}
	kvt_tm_tier_stats *t0 = &st->tier[KVT_TIER_HBM], *t1 = &st->tier[KVT_TIER_HOST], *t2 = &st->tier[KVT_TIER_NVME];
	uint32_t n0 = kvt_t0_n_slots(tm->cfg.t0), n1 = kvt_t1_n_slots(tm->t1);
	t0->capacity_blocks = n0;
	t0->used_blocks = n0 - kvt_t0_n_free(tm->cfg.t0);
	size_t t0_bytes = kvt_t0_block_bytes(tm->cfg.t0);
	t0->capacity_bytes = (uint64_t)n0 * t0_bytes;
	t0->used_bytes = t0->used_blocks * t0_bytes;
	t0->compression_ratio = (double)tm->block_bytes / (double)t0_bytes;
	t1->capacity_blocks = n1;
	t1->used_blocks = n1 - kvt_t1_n_free(tm->t1);
	t1->capacity_bytes = (uint64_t)n1 * tm->packed_bytes;
	t1->used_bytes = t1->used_blocks * tm->packed_bytes;
	t1->compression_ratio = (double)tm->block_bytes / (double)tm->packed_bytes;
	if (tm->cfg.t2) {
		kvt_t2_stats s;
		kvt_t2_get_stats(tm->cfg.t2, &s);
		t2->capacity_bytes = s.capacity_bytes;
		t2->capacity_blocks = s.slot_bytes ? s.capacity_bytes / s.slot_bytes : 0; /* uncompressed records */
		t2->used_bytes = s.used_bytes;
		t2->used_blocks = s.n_records;
		t2->compression_ratio = s.bytes_written ? (double)s.n_writes * tm->block_bytes / (double)s.bytes_written : 0;
		t2->n_corrupt = s.n_corrupt;
		/* An index that cannot commit stalls persistence as surely as a full T2. */
		kvt_db_stats ds;
		kvt_db_get_stats(tm->cfg.db, &ds);
		t2->degraded = full || s.read_only || ds.degraded;
		st->t2_read_only = s.read_only;
	}
	tm_retain_stats(tm->rt, &st->retain, NULL, 0, &st->retain.n_tenants);
	kvt_btable_stats bs;
	kvt_btable_get_stats(tm->cfg.bt, &bs);
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		for (int k = 0; k < KVT_BLOCK_KIND_COUNT; k++)
			st->tier[t].n_blocks_by_kind[k] = bs.n_in_tier_kind[t][k];
	st->chunk_share = tm->cfg.chunk_share;
	st->n_tombstones = tm_tomb_count(tm);
}

int kvt_tm_set_quota(kvt_tm *tm, const char *tenant, const kvt_tm_quota *q)
{
	return tm_retain_set_quota(tm->rt, tenant, q);
}

int kvt_tm_retain(kvt_tm *tm, const char *tenant, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES],
		  uint64_t ttl_us, int floor, kvt_tm_retain_result *res)
{
	if (floor == KVT_TIER_NVME && !tm->cfg.t2)
		floor = KVT_TIER_HOST; /* no NVMe tier: the slowest one there is */
	return tm_retain_add(tm->rt, tenant, n, hashes, ttl_us, floor, res);
}

uint32_t kvt_tm_retain_refresh(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES])
{
	return tm_retain_refresh(tm->rt, n, hashes);
}

uint32_t kvt_tm_release(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES])
{
	uint32_t k = tm_retain_release(tm->rt, n, hashes);
	if (k)
		tm_kick(tm); /* what was kept over the watermark may go now */
	return k;
}

bool kvt_tm_get_retention(kvt_tm *tm, const uint8_t hash[KVT_HASH_BYTES], kvt_tm_retention *out)
{
	return tm_retain_get(tm->rt, hash, out);
}

void kvt_tm_get_tenants(kvt_tm *tm, kvt_tm_tenant_stats *out, uint32_t cap, uint32_t *n_out)
{
	kvt_tm_retain_stats st;
	tm_retain_stats(tm->rt, &st, out, cap, n_out);
}

int kvt_tm_check(kvt_tm *tm)
{
	int rc = kvt_btable_check(tm->cfg.bt);
	if (rc == KVT_OK)
		rc = kvt_t1_check(tm->t1);
	if (rc == KVT_OK)
		rc = kvt_t0_check(tm->cfg.t0);
	if (rc != KVT_OK)
		return rc;
	pthread_mutex_lock(&tm->mu);
	uint32_t n_busy = tm->n_busy;
	pthread_mutex_unlock(&tm->mu);
	if (n_busy)
		return KVT_OK; /* blocks in motion: the counts below may be between two steps */
	/* Every T1 slot in use is one the table names (the manager's only T1 holders). */
	kvt_btable_stats s;
	kvt_btable_get_stats(tm->cfg.bt, &s);
	uint32_t used1 = kvt_t1_n_slots(tm->t1) - kvt_t1_n_free(tm->t1);
	if (s.n_in_tier[KVT_TIER_HOST] != used1) {
		KVT_LOGE("tm: the table names %llu T1 slots but %u are in use",
			 (unsigned long long)s.n_in_tier[KVT_TIER_HOST], used1);
		return KVT_ECORRUPT;
	}
	return KVT_OK;
}
