/*
 * tiers/tm_promote.c — promotion: bringing blocks up to T1 or T0, and the
 * tickets the I/O workers run (tm_int.h: the manager's files).
 *
 * A ticket names blocks to promote; workers claim its indices one at a time
 * (the T3 part all in one round, tm_remote.c) and promote each through
 * tm_promote_one, which busy-holds the block for the whole move: find its
 * highest tier, make room (T0 first: evicting may write through the staging
 * buffer), read a T2 record into a T1 slot (verified: hash, checksum, codec,
 * scale layout, size and tokens; a corrupt record is dropped, never served),
 * then unpack into T0. A block promoted into T0 with take_ref carries one
 * caller reference, taken while it is still busy-held.
 */
#include "tm_int.h"

void tm_count_lookup(kvt_tm *tm, int found_tier)
{
	pthread_mutex_lock(&tm->mu);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		if (t == found_tier)
			tm->st.tier[t].hits++;
		else if (found_tier < 0 || t < found_tier)
			tm->st.tier[t].misses++;
	}
	pthread_mutex_unlock(&tm->mu);
}

/* A T2 record failed verification: its row goes, then its (quarantined) extent. */
static void drop_corrupt(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	/* The block is busy-held by the caller; the pin check does not apply to a corrupt record. */
	kvt_btable_entry e;
	kvt_nvme_loc old;
	if (kvt_btable_get(tm->cfg.bt, h, &e) != KVT_OK || e.slot[KVT_TIER_NVME] < 0)
		return;
	pthread_mutex_lock(&tm->pin_mu);
	int rc = kvt_btable_clear_slot(tm->cfg.bt, h, KVT_TIER_NVME, NULL, &old);
	pthread_mutex_unlock(&tm->pin_mu);
	if (rc != KVT_OK)
		return;
	(void)tm_row_delete_then_free(tm, 0, h, &old); /* the extent stays quarantined in the store */
	tm_tomb_put(tm, h, KVT_TIER_NVME, KVT_TM_MISS_FAILED_VERIFICATION, KVT_TM_PRESSURE_NONE);
	pthread_mutex_lock(&tm->mu);
	tm->st.tier[KVT_TIER_NVME].n_corrupt++;
	pthread_mutex_unlock(&tm->mu);
}

/*
 * The codec of a T2 record this manager can decode (manager.h, "Versioning"):
 * any codec whose scale layout and size are those it writes for this T0
 * layout, with the table entry's tokens; -1 otherwise (a miss, warned about
 * once).
 * NOTE: the scale layout must match as well as the codec and size: an INT8
 * record of layout 1 may have exactly our size (head_dim 32) and would
 * decode to wrong values without an error.
 */
static int record_codec(kvt_tm *tm, const tm_ctx *c, const kvt_t2_block_meta *m, const kvt_btable_entry *e)
{
	const int k = m->codec;
	if (k >= 0 && k < KVT_KV_CODEC_COUNT && (k == tm->cfg.t1_codec || c->mv_rec[k]) &&
	    m->scale_layout == tm_scale_layout_of(k) && m->raw_bytes == kvt_kv_packed_bytes(kvt_t0_layout(tm->cfg.t0), k) &&
	    m->n_tokens == e->n_tokens && !memcmp(m->tokens, e->tokens, e->n_tokens * sizeof(int32_t)))
		return k;
	pthread_mutex_lock(&tm->mu);
	bool warn = !tm->warned_codec;
	tm->warned_codec = true;
	pthread_mutex_unlock(&tm->mu);
	if (warn)
		KVT_LOGW("tm: a T2 record holds codec %s, scale layout %u, %u bytes; this manager runs %s, "
			 "scale layout %u, %zu bytes, and decodes the known formats of its layout: such records are misses",
			 kvt_kv_codec_name(m->codec), (unsigned)m->scale_layout, m->raw_bytes,
			 kvt_kv_codec_name(tm->cfg.t1_codec), (unsigned)tm_scale_layout_of(tm->cfg.t1_codec),
			 tm->packed_bytes);
	return -1;
}

/* The promotion's statistics for a T2 read that took t_start.. (kept in T1 when kept). */
static void count_t2_read(kvt_tm *tm, const kvt_btable_entry *e, bool kept, double t_start, uint64_t *bytes_from)
{
	pthread_mutex_lock(&tm->mu);
	if (kept)
		tm->st.tier[KVT_TIER_HOST].n_promotions++;
	tm->st.tier[KVT_TIER_HOST].promotion_bytes += e->nvme.extent_bytes;
	tm->st.tier[KVT_TIER_HOST].promotion_s += kvt_now_s() - t_start;
	if (bytes_from)
		bytes_from[KVT_TIER_NVME] += e->nvme.extent_bytes;
	pthread_mutex_unlock(&tm->mu);
}

/*
 * The block's packed bytes from its T2 record, read into c->h_rec and
 * verified: a corrupt record is dropped (drop_corrupt), one this manager
 * cannot decode is a miss (KVT_ENOTFOUND). A record of t1_codec then moves
 * to a new T1 slot (the table names it) or, when T1 has no room, to c's
 * staging buffer (*t1s = -1); a record of another codec (an f16 NVMe copy,
 * or an older build's format) stays in c->h_rec, *t1s = -1. *codec gets it.
 */
static int promote_read_t2(kvt_tm *tm, tm_ctx *c, const uint8_t h[KVT_HASH_BYTES], const kvt_btable_entry *e,
			   int32_t *t1s, const void **packed, int *codec, uint64_t *bytes_from)
{
	void *buf = c->h_rec;
	kvt_rstore_loc l;
	kvt_t2_block_meta m;
	l = e->nvme;
	double t_start = kvt_now_s();
	int rc;
	*t1s = -1;
	(void)tm->rs2->ops->get(tm->rs2, 1, (const uint8_t(*)[KVT_HASH_BYTES])h, &l, false, &m, &buf, tm->block_bytes,
				&rc);
	if (rc == KVT_OK && (*codec = record_codec(tm, c, &m, e)) < 0)
		rc = KVT_ENOTFOUND;
	else if (rc == KVT_ECORRUPT)
		drop_corrupt(tm, h);
	else if (rc == KVT_EFULL)
		rc = KVT_ENOTFOUND; /* a record larger than any block of ours: not ours */
	if (rc != KVT_OK)
		return rc;
	*packed = c->h_rec;
	if (*codec == tm->cfg.t1_codec) {
		if (kvt_t1_alloc(tm->t1, t1s) != KVT_OK) {
			tm_evict_t1(tm, c, 1, KVT_TM_PRESSURE_ROOM); /* may write through h_stage, not h_rec */
			if (kvt_t1_alloc(tm->t1, t1s) != KVT_OK)
				*t1s = -1;
		}
		if (*t1s >= 0) /* the bytes first: once the table names the slot, others may read it */
			memcpy(kvt_t1_slot_ptr(tm->t1, *t1s), c->h_rec, tm->packed_bytes);
		if (*t1s >= 0 && kvt_btable_set_slot(tm->cfg.bt, h, KVT_TIER_HOST, *t1s) != KVT_OK) {
			kvt_t1_unref(tm->t1, *t1s); /* the table will not name the slot: unpack from h_rec */
			*t1s = -1;
		}
		if (*t1s >= 0)
			*packed = kvt_t1_slot_ptr(tm->t1, *t1s);
	}
	count_t2_read(tm, e, *t1s >= 0, t_start, bytes_from);
	return KVT_OK;
}

/*
 * Unpack packed (a record of codec) into the T0 slot s (ours: given back on
 * failure), then the table names it, lossy unless the record was f16.
 */
static int promote_unpack_t0(kvt_tm *tm, tm_ctx *c, const uint8_t h[KVT_HASH_BYTES], const void *packed, int codec,
			     int32_t s, int found, uint64_t *bytes_from)
{
	double t_start = kvt_now_s();
	kvt_t1_mover *mv = codec == tm->cfg.t1_codec ? c->mv : c->mv_rec[codec];
	int rc = kvt_t1_mover_unpack(mv, 1, &packed, &s);
	if (rc == KVT_OK)
		rc = kvt_btable_set_t0_unpacked(tm->cfg.bt, h, s, codec != KVT_KV_CODEC_F16);
	if (rc != KVT_OK) {
		kvt_t0_unref(tm->cfg.t0, s);
		return rc;
	}
	const size_t nb = kvt_kv_packed_bytes(kvt_t0_layout(tm->cfg.t0), codec);
	pthread_mutex_lock(&tm->mu);
	tm->st.tier[KVT_TIER_HBM].n_promotions++;
	tm->st.tier[KVT_TIER_HBM].promotion_bytes += nb;
	tm->st.tier[KVT_TIER_HBM].promotion_s += kvt_now_s() - t_start;
	if (bytes_from && found == KVT_TIER_HOST)
		bytes_from[KVT_TIER_HOST] += nb;
	pthread_mutex_unlock(&tm->mu);
	return KVT_OK;
}

/*
 * Move a busy-held block found in a lower tier up to tier: T0 room first
 * (evicting may write through the staging buffer, which may hold the bytes
 * below), then the packed bytes (its T1 slot, or its T2 record), then, for
 * T0, the unpack. e->slot[KVT_TIER_HBM] gets the new T0 slot.
 */
static int promote_move(kvt_tm *tm, tm_ctx *c, const uint8_t h[KVT_HASH_BYTES], kvt_btable_entry *e, int found,
			int tier, uint64_t *bytes_from)
{
	int32_t s0 = -1;
	if (tier == KVT_TIER_HBM && kvt_t0_alloc(tm->cfg.t0, &s0) != KVT_OK) {
		tm_evict_t0(tm, c, 1, NULL, KVT_TM_PRESSURE_ROOM);
		if (kvt_t0_alloc(tm->cfg.t0, &s0) != KVT_OK)
			return KVT_EFULL;
	}
	const void *packed = NULL;
	int32_t t1s = e->slot[KVT_TIER_HOST];
	int codec = tm->cfg.t1_codec;
	if (t1s >= 0) {
		packed = kvt_t1_slot_ptr(tm->t1, t1s);
	} else {
		int rc = promote_read_t2(tm, c, h, e, &t1s, &packed, &codec, bytes_from);
		if (rc != KVT_OK) {
			if (s0 >= 0)
				kvt_t0_unref(tm->cfg.t0, s0);
			return rc;
		}
		if (tier == KVT_TIER_HOST && t1s < 0)
			return codec == tm->cfg.t1_codec ? KVT_EFULL  /* read and verified, but no T1 room to keep it */
							 : KVT_ENOTFOUND; /* another format: T1 cannot hold it */
	}
	if (tier != KVT_TIER_HBM)
		return KVT_OK;
	int rc = promote_unpack_t0(tm, c, h, packed, codec, s0, found, bytes_from);
	if (rc == KVT_OK)
		e->slot[KVT_TIER_HBM] = s0;
	return rc;
}

/* The block is in tier or above: the caller's T0 reference, the LRU touch, the durable row's refresh. */
static void promote_reached(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES], const kvt_btable_entry *e, int tier,
			    bool take_ref, int32_t *t0_slot)
{
	if (take_ref && tier == KVT_TIER_HBM) {
		/* Busy-held: the slot cannot leave the table (nor be freed) before the ref is taken. */
		kvt_t0_ref(tm->cfg.t0, e->slot[KVT_TIER_HBM]);
		*t0_slot = e->slot[KVT_TIER_HBM];
	}
	(void)kvt_btable_touch(tm->cfg.bt, h);
	/* A hit on a durable block refreshes its row (queued, group-committed, not
	 * waited for), so the LRU order survives a restart (kvt_tm_recover). */
	if (tm->cfg.db && e->slot[KVT_TIER_NVME] >= 0) {
		kvt_btable_entry now;
		if (kvt_btable_get(tm->cfg.bt, h, &now) == KVT_OK)
			(void)kvt_db_touch_block(tm->cfg.db, h, kvt_wall_us(), now.hits, NULL, NULL, NULL);
	}
}

/*
 * Bring one block to tier (HBM or HOST). With take_ref, *t0_slot gets a T0
 * slot with a caller reference. The block is busy-held for the whole move.
 * bytes_from (may be NULL; updated under tm->mu) gets the bytes read for it
 * by the tier they came from: a T2 record's extent, a T1 slot unpacked into
 * T0 (a block read from T2 and unpacked counts as T2 only).
 */
int tm_promote_one(kvt_tm *tm, tm_ctx *c, const uint8_t h[KVT_HASH_BYTES], int tier, bool take_ref,
		   int32_t *t0_slot, uint64_t *bytes_from)
{
	kvt_btable_entry e;
	int rc = tm_busy_wait(tm, h);
	if (rc)
		return rc;
	*t0_slot = -1;
	int found = -1;
	if (kvt_btable_get(tm->cfg.bt, h, &e) == KVT_OK)
		found = e.slot[KVT_TIER_HBM] >= 0 ? KVT_TIER_HBM
		      : e.slot[KVT_TIER_HOST] >= 0 ? KVT_TIER_HOST
		      : e.slot[KVT_TIER_NVME] >= 0 ? KVT_TIER_NVME : -1;
	tm_count_lookup(tm, found);
	rc = found < 0 ? KVT_ENOTFOUND : found > tier ? promote_move(tm, c, h, &e, found, tier, bytes_from) : KVT_OK;
	if (rc == KVT_OK)
		promote_reached(tm, h, &e, tier, take_ref, t0_slot);
	tm_busy_release(tm, h);
	return rc;
}

void *tm_worker_main(void *arg)
{
	kvt_tm *tm = ((tm_worker_arg *)arg)->tm;
	tm_ctx *c = ((tm_worker_arg *)arg)->ctx;
	free(arg);
	pthread_mutex_lock(&tm->mu);
	for (;;) {
		while (!tm->stop && !tm->q_head)
			pthread_cond_wait(&tm->cv_work, &tm->mu);
		if (!tm->q_head)
			break; /* stop, and the queue is drained */
		kvt_tm_ticket *t = tm->q_head;
		uint32_t i = t->next, k = i < t->n_local ? 1 : t->n - i; /* T3 blocks: all in one round */
		t->next += k;
		if (t->next == t->n_claim) {
			tm->q_head = t->qnext;
			if (!tm->q_head)
				tm->q_tail = NULL;
		}
		pthread_mutex_unlock(&tm->mu);
		if (i < t->n_local) {
			int32_t slot = -1;
			uint64_t bytes[KVT_TM_N_TIERS] = { 0 };
			int rc = tm_promote_one(tm, c, t->hashes[i], t->tier, t->take_refs, &slot, bytes);
			pthread_mutex_lock(&tm->mu);
			for (int b = 0; b < KVT_TM_N_TIERS; b++)
				t->bytes_from[b] += bytes[b];
			t->results[i] = rc;
			t->slots[i] = slot;
		} else {
			tm_remote_fetch(tm, c, t, i);
			pthread_mutex_lock(&tm->mu);
		}
		t->n_done += k;
		pthread_cond_broadcast(&tm->cv_done);
	}
	pthread_mutex_unlock(&tm->mu);
	return NULL;
}

int kvt_tm_submit(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int tier, bool take_refs,
		  kvt_tm_ticket **out)
{
	return kvt_tm_submit_remote(tm, n, hashes, n, NULL, tier, take_refs, out);
}

int kvt_tm_submit_remote(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], uint32_t n_local,
			 const uint8_t root[KVT_HASH_BYTES], int tier, bool take_refs, kvt_tm_ticket **out)
{
	if (n_local > n || (n_local < n && n_local == 0 && !root)) {
		KVT_LOGE("tm submit: %u local blocks of %u, %s root", n_local, n, root ? "a" : "no");
		return KVT_EINVAL;
	}
	if (tier != KVT_TIER_HBM && tier != KVT_TIER_HOST) {
		KVT_LOGE("tm submit: tier %d (promotion targets T0 or T1)", tier);
		return KVT_EINVAL;
	}
	if (take_refs && tier != KVT_TIER_HBM) {
		KVT_LOGE("tm submit: T0 references asked for a promotion to T1");
		return KVT_EINVAL;
	}
	kvt_tm_ticket *t = calloc(1, sizeof(*t));
	if (!t)
		return KVT_ENOMEM;
	t->n = n;
	t->tier = tier;
	t->take_refs = take_refs;
	t->hashes = malloc((n ? n : 1) * sizeof(*t->hashes));
	t->results = malloc((n ? n : 1) * sizeof(*t->results));
	t->slots = malloc((n ? n : 1) * sizeof(*t->slots));
	if (!t->hashes || !t->results || !t->slots) {
		free(t->hashes);
		free(t->results);
		free(t->slots);
		free(t);
		return KVT_ENOMEM;
	}
	memcpy(t->hashes, hashes, n * sizeof(*t->hashes));
	for (uint32_t i = 0; i < n; i++) {
		t->results[i] = KVT_ENOTFOUND;
		t->slots[i] = -1;
	}
	/* Without T3 the remote part is a miss at once: no worker sees it. */
	t->n_local = n_local;
	t->n_claim = n;
	if (n_local < n && !tm->cfg.t3) {
		t->n_claim = n_local;
		t->n_done = n - n_local;
	}
	if (root)
		memcpy(t->root, root, KVT_HASH_BYTES);
	if (t->n_local < t->n && !(t->pinned = calloc(n, sizeof(*t->pinned)))) {
		free(t->hashes);
		free(t->results);
		free(t->slots);
		free(t);
		return KVT_ENOMEM;
	}
	if (t->n_claim) {
		pthread_mutex_lock(&tm->mu);
		if (tm->q_tail)
			tm->q_tail->qnext = t;
		else
			tm->q_head = t;
		tm->q_tail = t;
		pthread_cond_broadcast(&tm->cv_work);
		pthread_mutex_unlock(&tm->mu);
	}
	*out = t;
	return KVT_OK;
}

int kvt_tm_prefetch(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int tier,
		    kvt_tm_ticket **out)
{
	return kvt_tm_submit(tm, n, hashes, tier, false, out);
}

int kvt_tm_ticket_wait(kvt_tm *tm, kvt_tm_ticket *t)
{
	int rc = KVT_OK;
	pthread_mutex_lock(&tm->mu);
	while (t->n_done < t->n)
		pthread_cond_wait(&tm->cv_done, &tm->mu);
	for (uint32_t i = 0; i < t->n && rc == KVT_OK; i++)
		rc = t->results[i];
	pthread_mutex_unlock(&tm->mu);
	return rc;
}

int tm_ticket_wait_progress(kvt_tm *tm, kvt_tm_ticket *t, void (*fn)(void *user, uint32_t done, uint32_t total),
			    void *user, uint64_t bytes_from[KVT_TM_N_TIERS])
{
	int rc = KVT_OK;
	uint32_t told = 0;
	pthread_mutex_lock(&tm->mu);
	while (t->n_done < t->n) {
		if (fn && t->n_done != told) {
			told = t->n_done;
			pthread_mutex_unlock(&tm->mu); /* the callback may take its time: not under the manager's lock */
			fn(user, told, t->n);
			pthread_mutex_lock(&tm->mu);
			continue;
		}
		pthread_cond_wait(&tm->cv_done, &tm->mu);
	}
	for (uint32_t i = 0; i < t->n && rc == KVT_OK; i++)
		rc = t->results[i];
	if (bytes_from)
		memcpy(bytes_from, t->bytes_from, sizeof(t->bytes_from));
	pthread_mutex_unlock(&tm->mu);
	return rc;
}

bool kvt_tm_ticket_done(kvt_tm *tm, kvt_tm_ticket *t, uint32_t *n_done)
{
	pthread_mutex_lock(&tm->mu);
	uint32_t d = t->n_done;
	pthread_mutex_unlock(&tm->mu);
	if (n_done)
		*n_done = d;
	return d == t->n;
}

void kvt_tm_ticket_results(kvt_tm *tm, kvt_tm_ticket *t, int32_t *t0_slots, int *results)
{
	(void)kvt_tm_ticket_wait(tm, t);
	if (results)
		memcpy(results, t->results, t->n * sizeof(*results));
	if (t0_slots) {
		memcpy(t0_slots, t->slots, t->n * sizeof(*t0_slots));
		t->collected = true;
		/* the pins of T3 blocks that made it go with their slots; the others are dropped now */
		for (uint32_t i = t->n_local; t->pinned && i < t->n; i++)
			if (t->pinned[i] && t->results[i] != KVT_OK) {
				kvt_tm_unpin(tm, t->hashes[i]);
				t->pinned[i] = false;
			}
	}
}

void kvt_tm_ticket_free(kvt_tm *tm, kvt_tm_ticket *t)
{
	if (!t)
		return;
	(void)kvt_tm_ticket_wait(tm, t);
	if (t->take_refs && !t->collected)
		for (uint32_t i = 0; i < t->n; i++)
			if (t->results[i] == KVT_OK)
				kvt_t0_unref(tm->cfg.t0, t->slots[i]);
	for (uint32_t i = t->n_local; t->pinned && !t->collected && i < t->n; i++)
		if (t->pinned[i])
			kvt_tm_unpin(tm, t->hashes[i]);
	free(t->pinned);
	free(t->hashes);
	free(t->results);
	free(t->slots);
	free(t);
}

int kvt_tm_promote(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int32_t *t0_slots,
		   int *results)
{
	kvt_tm_ticket *t;
	int rc = kvt_tm_submit(tm, n, hashes, KVT_TIER_HBM, true, &t);
	if (rc)
		return rc;
	rc = kvt_tm_ticket_wait(tm, t);
	kvt_tm_ticket_results(tm, t, t0_slots, results);
	kvt_tm_ticket_free(tm, t);
	return rc;
}
