/*
 * tiers/tm_remote.c — T3, the remote tier, as the manager drives it
 * (tiers/t3_remote.h is the client; tm_int.h: the manager's files).
 *
 * Reads: a ticket's indices [n_local, n) name blocks the table did not know
 * at submit time (kvt_tm_submit_remote). The first worker to reach them takes
 * them all and looks them up in T3 in one round (pipelined per node); the
 * run found from the first (verified: checksum, model, hash, tokens hashing
 * to it, the parent the chain expects, our codec) enters the table clean (T3
 * holds it: dropping the local copy loses nothing) with a T1 slot holding
 * the bytes, pinned for the caller when it takes references, and goes on to
 * T0 through tm_promote_one. Anything else is a miss.
 *
 * Writes: WRITE_THROUGH queues every block registered for T3 and makes the
 * queue due at each end of turn; ON_DEMOTE writes a block from the eviction
 * path when it is about to leave the last local tier. Sessions are queued as
 * copies. The remote writer thread drains the due queue in batches (bytes from
 * T1, T0 packed through its own mover, or T2), writes them in one round, and
 * keeps a batch that failed for lack of a server (KVT_EIO) for a retry a
 * second later, so writes resume when T3 comes back. The queue is bounded
 * (KVT_TM_REMOTE_QUEUE_MAX); what does not fit is counted and skipped.
 */
#include "tm_int.h"

#define KVT_TM_REMOTE_QUEUE_MAX 65536u
#define KVT_TM_REMOTE_RETRY_S 1.0

/*
 * Busy-held blocks: copy their packed bytes (T1, T0 packed, or T2) into
 * c->h_stage (n <= batch) and write them to T3 in one round. res[i] per
 * block (KVT_ENOTFOUND: gone, or in no tier). Returns how many were written.
 */
static uint32_t remote_put_held(kvt_tm *tm, tm_ctx *c, uint32_t n, uint8_t (*h)[KVT_HASH_BYTES], int *res)
{
	kvt_btable_entry *e = malloc(sizeof(*e));
	kvt_t2_block_meta *meta = malloc((size_t)n * sizeof(*meta));
	kvt_rstore_rec *rec = malloc((size_t)n * sizeof(*rec));
	uint32_t *idx = malloc((size_t)n * sizeof(*idx));
	int *r = malloc((size_t)n * sizeof(*r));
	uint32_t n_w = 0, n_ok = 0;
	KVT_ASSERT(n <= tm->cfg.batch_blocks);
	for (uint32_t i = 0; i < n; i++)
		res[i] = KVT_ENOTFOUND;
	if (!e || !meta || !rec || !idx || !r) {
		for (uint32_t i = 0; i < n; i++)
			res[i] = KVT_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (kvt_btable_get(tm->cfg.bt, h[i], e) != KVT_OK)
			continue; /* gone */
		void *dst = c->h_stage + (size_t)n_w * tm->packed_bytes;
		int rc = tm_block_packed(tm, c, e, dst);
		if (rc != KVT_OK) {
			res[i] = rc;
			continue;
		}
		tm_record_meta(tm, e, &meta[n_w]);
		rec[n_w].meta = &meta[n_w];
		rec[n_w].payload = dst;
		idx[n_w++] = i;
	}
	if (n_w) /* per record: acknowledged, or why not (a whole-call failure is in every result) */
		(void)tm->rs3->ops->put(tm->rs3, n_w, rec, NULL, r);
	for (uint32_t j = 0; j < n_w; j++) {
		res[idx[j]] = r[j];
		n_ok += r[j] == KVT_OK;
	}
out:
	free(e);
	free(meta);
	free(rec);
	free(idx);
	free(r);
	return n_ok;
}

/* ON_DEMOTE: the n busy-held blocks that are about to leave the last local tier holding them go to T3 first. */
void tm_remote_demote_held(kvt_tm *tm, tm_ctx *c, uint32_t n, uint8_t (*h)[KVT_HASH_BYTES], int leaving_tier)
{
	if (!tm->cfg.t3 || kvt_t3_write_policy(tm->cfg.t3) != KVT_T3_ON_DEMOTE || !n)
		return;
	uint8_t (*last)[KVT_HASH_BYTES] = malloc((size_t)n * sizeof(*last));
	int *res = malloc((size_t)n * sizeof(*res));
	kvt_btable_entry *e = malloc(sizeof(*e));
	uint32_t k = 0;
	if (last && res && e)
		for (uint32_t i = 0; i < n; i++) {
			if (kvt_btable_get(tm->cfg.bt, h[i], e) != KVT_OK || e->pins)
				continue;
			bool other = false;
			for (int t = 0; t < KVT_TIER_COUNT; t++)
				other |= t != leaving_tier && e->slot[t] >= 0;
			/* going to T2 (dirty, T2 takes writes) is not leaving the node */
			if (leaving_tier != KVT_TIER_NVME && e->dirty && tm_t2_writable(tm))
				other = true;
			if (!other)
				memcpy(last[k++], h[i], KVT_HASH_BYTES);
		}
	if (k) {
		uint32_t ok = remote_put_held(tm, c, k, last, res);
		pthread_mutex_lock(&tm->mu);
		tm->st.remote.n_demotions += ok;
		pthread_mutex_unlock(&tm->mu);
	}
	free(last);
	free(res);
	free(e);
}

/* Queue a registered block for T3 (WRITE_THROUGH). Under tm->mu. */
void tm_remote_queue_locked(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	if (tm->n_rq == tm->cap_rq) {
		uint32_t cap = tm->cap_rq ? 2 * tm->cap_rq : 256;
		void *p = cap <= KVT_TM_REMOTE_QUEUE_MAX ? realloc(tm->rq, cap * sizeof(*tm->rq)) : NULL;
		if (!p) {
			tm->st.n_remote_skipped++;
			return;
		}
		tm->rq = p;
		tm->cap_rq = cap;
	}
	memcpy(tm->rq[tm->n_rq].hash, h, KVT_HASH_BYTES);
	tm->rq[tm->n_rq].retry_t = 0;
	tm->n_rq++;
}

/* Write the newest queued session to T3. Called and returns under tm->mu (dropped for the write). */
static void remote_send_session(kvt_tm *tm)
{
	kvt_db_session s = tm->rs[--tm->n_rs];
	tm->remote_inflight = true;
	tm->remote_inflight_n = 1;
	pthread_mutex_unlock(&tm->mu);
	int rc = kvt_t3_put_session(tm->cfg.t3, &s);
	if (rc != KVT_OK)
		KVT_LOGD("tm: session \"%s\" not written to T3: %s", s.id, kvt_strerror(rc));
	kvt_db_session_deinit(&s);
	pthread_mutex_lock(&tm->mu);
	tm->remote_inflight = false;
	tm->remote_inflight_n = 0;
}

/* Take up to B due entries ready at now off the queue's front into h, in flight. Under tm->mu. */
static uint32_t remote_take_due(kvt_tm *tm, uint8_t (*h)[KVT_HASH_BYTES], uint32_t B, double now)
{
	uint32_t n = 0;
	while (n < B && n < tm->n_rq_due && tm->rq[n].retry_t <= now) {
		memcpy(h[n], tm->rq[n].hash, KVT_HASH_BYTES);
		n++;
	}
	memmove(tm->rq, tm->rq + n, (tm->n_rq - n) * sizeof(*tm->rq));
	tm->n_rq -= n;
	tm->n_rq_due -= n;
	tm->remote_inflight = true;
	tm->remote_inflight_n = n;
	return n;
}

/*
 * After a batch (under tm->mu): the blocks that failed for lack of a server
 * (res KVT_EIO; retried a second later) and those another thread was moving
 * (hb[0, n_busy); retried at once) go back to the front of the due queue,
 * room permitting (else counted as skipped); other failures are counted.
 */
static void remote_requeue(kvt_tm *tm, uint8_t (*h)[KVT_HASH_BYTES], uint32_t n_got, const int *res,
			   uint8_t (*hb)[KVT_HASH_BYTES], uint32_t n_busy)
{
	uint32_t n_retry = n_busy;
	for (uint32_t i = 0; i < n_got; i++)
		n_retry += res[i] == KVT_EIO;
	if (n_retry && tm->n_rq + n_retry <= tm->cap_rq) {
		memmove(tm->rq + n_retry, tm->rq, tm->n_rq * sizeof(*tm->rq));
		uint32_t k = 0;
		double now2 = kvt_now_s();
		for (uint32_t i = 0; i < n_got; i++)
			if (res[i] == KVT_EIO) {
				memcpy(tm->rq[k].hash, h[i], KVT_HASH_BYTES);
				tm->rq[k++].retry_t = now2 + KVT_TM_REMOTE_RETRY_S;
			}
		for (uint32_t i = 0; i < n_busy; i++) {
			memcpy(tm->rq[k].hash, hb[i], KVT_HASH_BYTES);
			tm->rq[k++].retry_t = now2 + 0.05;
		}
		tm->n_rq += n_retry;
		tm->n_rq_due += n_retry;
	} else {
		tm->st.n_remote_skipped += n_retry;
	}
	for (uint32_t i = 0; i < n_got; i++)
		tm->st.n_remote_failed += res[i] != KVT_OK && res[i] != KVT_EIO && res[i] != KVT_ENOTFOUND;
}

/* The T3 writer's buffers: a batch's hashes, the busy ones, their results (all [batch]). */
typedef struct tm_rbuf {
	uint8_t (*h)[KVT_HASH_BYTES];  /* the batch taken */
	uint8_t (*hb)[KVT_HASH_BYTES]; /* those another thread was moving */
	int *res;                      /* per block of h */
} tm_rbuf;

/* Write one due batch to T3. Called and returns under tm->mu (dropped for the writes). */
static void remote_send_blocks(kvt_tm *tm, tm_ctx *c, tm_rbuf *b, double now)
{
	uint32_t n = remote_take_due(tm, b->h, tm->cfg.batch_blocks, now);
	pthread_mutex_unlock(&tm->mu);
	/* Take what no other thread is moving; the rest goes back to the queue for a moment. */
	uint32_t n_got = 0, n_busy = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (tm_busy_try(tm, b->h[i]))
			memmove(b->h[n_got++], b->h[i], KVT_HASH_BYTES);
		else
			memcpy(b->hb[n_busy++], b->h[i], KVT_HASH_BYTES);
	}
	uint32_t n_ok = n_got ? remote_put_held(tm, c, n_got, b->h, b->res) : 0;
	for (uint32_t i = 0; i < n_got; i++)
		tm_busy_release(tm, b->h[i]);
	pthread_mutex_lock(&tm->mu);
	tm->remote_inflight = false;
	tm->remote_inflight_n = 0;
	tm->st.remote.n_demotions += n_ok;
	remote_requeue(tm, b->h, n_got, b->res, b->hb, n_busy);
	pthread_cond_broadcast(&tm->cv_done);
}

/* Wait on cv_remote for at most 100 ms. Under tm->mu. */
static void remote_nap(kvt_tm *tm)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	long ns = ts.tv_nsec + 100L * 1000 * 1000;
	ts.tv_sec += ns / 1000000000L;
	ts.tv_nsec = ns % 1000000000L;
	pthread_cond_timedwait(&tm->cv_remote, &tm->mu, &ts);
}

void *tm_remote_main(void *arg)
{
	kvt_tm *tm = arg;
	tm_ctx *c = &tm->wctx[tm->cfg.n_io_threads + 1];
	const uint32_t B = tm->cfg.batch_blocks;
	tm_rbuf b = { malloc(B * sizeof(*b.h)), malloc(B * sizeof(*b.hb)), malloc(B * sizeof(*b.res)) };
	if (!b.h || !b.hb || !b.res) {
		free(b.h);
		free(b.hb);
		free(b.res);
		return NULL;
	}
	pthread_mutex_lock(&tm->mu);
	for (;;) {
		double now = kvt_now_s();
		/* due entries ready now (a failed batch waits for its retry time) */
		bool ready = tm->n_rs > 0 || (tm->n_rq_due > 0 && tm->rq[0].retry_t <= now);
		if (!ready && tm->stop)
			break;
		if (!ready)
			remote_nap(tm);
		else if (tm->n_rs) /* sessions first: they are small, and a resume elsewhere starts from them */
			remote_send_session(tm);
		else
			remote_send_blocks(tm, c, &b, now);
	}
	pthread_mutex_unlock(&tm->mu);
	free(b.h);
	free(b.hb);
	free(b.res);
	return NULL;
}

/* Does a T3 record fit this node and the chain (codec, layout, size, tokens, parent)? Warned about once if not. */
static bool remote_record_fits(kvt_tm *tm, const kvt_t2_block_meta *m, const uint8_t parent[KVT_HASH_BYTES])
{
	if (m->codec == tm->cfg.t1_codec && m->scale_layout == tm_scale_layout_of(tm->cfg.t1_codec) &&
	    m->raw_bytes == tm->packed_bytes && m->n_tokens == kvt_btable_block_tokens(tm->cfg.bt) &&
	    !memcmp(m->parent, parent, KVT_HASH_BYTES))
		return true;
	pthread_mutex_lock(&tm->mu);
	bool warn = !tm->warned_remote;
	tm->warned_remote = true;
	pthread_mutex_unlock(&tm->mu);
	if (warn)
		KVT_LOGW("tm: a T3 record holds codec %s, scale layout %u, %u bytes, %u tokens (or another "
			 "parent); this node runs %s, %zu bytes: such records are misses (nodes sharing T3 "
			 "must share model, block_tokens and [tier.host] dtype)",
			 kvt_kv_codec_name(m->codec), (unsigned)m->scale_layout, m->raw_bytes, m->n_tokens,
			 kvt_kv_codec_name(tm->cfg.t1_codec), tm->packed_bytes);
	return false;
}

/* A new T1 slot holding the payload (T1 evicted once if full); the table names it. false: no room. */
static bool remote_fill_t1(kvt_tm *tm, tm_ctx *c, const uint8_t h[KVT_HASH_BYTES], const void *payload,
			   bool created)
{
	int32_t s1;
	if (kvt_t1_alloc(tm->t1, &s1) != KVT_OK) {
		tm_evict_t1(tm, c, 1, KVT_TM_PRESSURE_ROOM);
		if (kvt_t1_alloc(tm->t1, &s1) != KVT_OK)
			return false;
	}
	memcpy(kvt_t1_slot_ptr(tm->t1, s1), payload, tm->packed_bytes);
	if (kvt_btable_set_slot(tm->cfg.bt, h, KVT_TIER_HOST, s1) != KVT_OK) {
		kvt_t1_unref(tm->t1, s1);
		return false;
	}
	if (created)
		(void)kvt_btable_set_dirty(tm->cfg.bt, h, false); /* T3 holds it */
	return true;
}

/*
 * Enter ticket block i, read from T3 as m and payload, into the table (a
 * concurrent registration may have been first: then ours is a spare copy),
 * of the kind its record says, before it enters a tier; pinned for the
 * caller when it takes references. false: not entered (a miss).
 */
static bool remote_enter(kvt_tm *tm, tm_ctx *c, kvt_tm_ticket *t, uint32_t i, const kvt_t2_block_meta *m,
			 const void *payload)
{
	const uint8_t *h = t->hashes[i];
	const uint8_t *parent = i ? t->hashes[i - 1] : t->root;
	kvt_btable_entry e;
	if (tm_busy_wait(tm, h) != KVT_OK)
		return false;
	bool created = false, ok = false;
	const int kind = m->flags & KVT_T2_FLAG_CHUNK ? KVT_BLOCK_CHUNK : KVT_BLOCK_PREFIX;
	if (kvt_btable_insert(tm->cfg.bt, h, parent, m->tokens, &created) == KVT_OK &&
	    (!created || kvt_btable_set_kind(tm->cfg.bt, h, kind) == KVT_OK) &&
	    kvt_btable_get(tm->cfg.bt, h, &e) == KVT_OK) {
		ok = e.slot[KVT_TIER_HBM] >= 0 || e.slot[KVT_TIER_HOST] >= 0 || e.slot[KVT_TIER_NVME] >= 0;
		if (!ok)
			ok = remote_fill_t1(tm, c, h, payload, created);
		if (ok && t->take_refs && kvt_tm_pin(tm, h) == KVT_OK)
			t->pinned[i] = true;
		if (!ok && created)
			(void)kvt_btable_remove(tm->cfg.bt, h);
	}
	tm_busy_release(tm, h);
	return ok;
}

/*
 * Look up the ticket's blocks [lo, n) in T3 and bring the run found to the
 * ticket's tier (see the file comment). Fills results/slots/pinned.
 */
void tm_remote_fetch(kvt_tm *tm, tm_ctx *c, kvt_tm_ticket *t, uint32_t lo)
{
	const uint32_t m = t->n - lo;
	kvt_t2_block_meta *meta = malloc((size_t)m * sizeof(*meta));
	uint8_t *buf = malloc((size_t)m * tm->packed_bytes);
	void **pay = malloc((size_t)m * sizeof(*pay));
	int *res = malloc((size_t)m * sizeof(*res));
	double t_start = kvt_now_s();
	uint32_t n_hit = 0;
	for (uint32_t j = 0; j < m; j++)
		t->results[lo + j] = KVT_ENOTFOUND;
	if (!meta || !buf || !pay || !res)
		goto out;
	for (uint32_t j = 0; j < m; j++)
		pay[j] = buf + (size_t)j * tm->packed_bytes;
	/* a miss ends the run: the results after the first that is not KVT_OK are not read */
	(void)tm->rs3->ops->get(tm->rs3, m, (const uint8_t(*)[KVT_HASH_BYTES])t->hashes + lo, NULL, true, meta, pay,
				tm->packed_bytes, res);
	for (uint32_t j = 0; j < m; j++) {
		const uint32_t i = lo + j;
		if (res[j] != KVT_OK || !remote_record_fits(tm, &meta[j], i ? t->hashes[i - 1] : t->root) ||
		    !remote_enter(tm, c, t, i, &meta[j], pay[j]))
			break;
		n_hit++;
		int32_t slot = -1;
		/* tm_promote_one counts a local hit in T1: the lookup that mattered was T3's, counted below */
		int rc = tm_promote_one(tm, c, t->hashes[i], t->tier, t->take_refs, &slot, NULL); /* its bytes are T3's */
		t->results[i] = rc;
		t->slots[i] = slot;
		if (rc != KVT_OK)
			break;
	}
out:
	pthread_mutex_lock(&tm->mu);
	tm->st.remote.hits += n_hit;
	tm->st.remote.misses += m - n_hit;
	tm->st.remote.n_promotions += n_hit;
	tm->st.remote.promotion_bytes += (uint64_t)n_hit * tm->packed_bytes;
	tm->st.remote.promotion_s += kvt_now_s() - t_start;
	t->bytes_from[KVT_TM_TIER_REMOTE] += (uint64_t)n_hit * tm->packed_bytes;
	pthread_mutex_unlock(&tm->mu);
	free(meta);
	free(buf);
	free(pay);
	free(res);
}

bool kvt_tm_has_remote(const kvt_tm *tm) { return tm->cfg.t3 != NULL; }

int kvt_tm_remote_put_session(kvt_tm *tm, const kvt_db_session *s)
{
	if (!tm->cfg.t3)
		return KVT_OK;
	kvt_db_session c = *s;
	c.tokens = malloc((s->n_tokens ? s->n_tokens : 1) * sizeof(int32_t));
	if (!c.tokens)
		return KVT_ENOMEM;
	memcpy(c.tokens, s->tokens, s->n_tokens * sizeof(int32_t));
	pthread_mutex_lock(&tm->mu);
	/* a newer copy of the same session replaces a queued one */
	for (uint32_t i = 0; i < tm->n_rs; i++)
		if (!strcmp(tm->rs[i].id, s->id) && !strcmp(tm->rs[i].tenant, s->tenant)) {
			kvt_db_session_deinit(&tm->rs[i]);
			tm->rs[i] = c;
			pthread_mutex_unlock(&tm->mu);
			return KVT_OK;
		}
	if (tm->n_rs == tm->cap_rs) {
		uint32_t cap = tm->cap_rs ? 2 * tm->cap_rs : 16;
		void *p = cap <= 4096 ? realloc(tm->rs, cap * sizeof(*tm->rs)) : NULL;
		if (!p) {
			tm->st.n_remote_skipped++;
			pthread_mutex_unlock(&tm->mu);
			free(c.tokens);
			return KVT_ENOMEM;
		}
		tm->rs = p;
		tm->cap_rs = cap;
	}
	tm->rs[tm->n_rs++] = c;
	pthread_cond_signal(&tm->cv_remote);
	pthread_mutex_unlock(&tm->mu);
	return KVT_OK;
}

int kvt_tm_remote_get_session(kvt_tm *tm, const char *tenant, const char *id, kvt_db_session *out)
{
	if (!tm->cfg.t3)
		return KVT_ENOTFOUND;
	return kvt_t3_get_session(tm->cfg.t3, tenant, id, out);
}

bool kvt_tm_remote_drain(kvt_tm *tm, double timeout_s)
{
	double end = kvt_now_s() + timeout_s;
	pthread_mutex_lock(&tm->mu);
	while ((tm->n_rq_due || tm->n_rs || tm->remote_inflight) && kvt_now_s() < end) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		long ns = ts.tv_nsec + 20L * 1000 * 1000;
		ts.tv_sec += ns / 1000000000L;
		ts.tv_nsec = ns % 1000000000L;
		pthread_cond_timedwait(&tm->cv_done, &tm->mu, &ts);
	}
	bool done = !tm->n_rq_due && !tm->n_rs && !tm->remote_inflight;
	pthread_mutex_unlock(&tm->mu);
	return done;
}
