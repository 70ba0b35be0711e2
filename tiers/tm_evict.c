/*
 * tiers/tm_evict.c — eviction and demotion (tm_int.h: the manager's files).
 *
 * Victims are the coldest unpinned, unretained leaves of the prefix tree
 * (parents outlive children), of each block kind as the chunk share says;
 * each is busy-held (try-acquired, never waited for) while it moves. A dirty
 * block never leaves its last copy behind: T0 -> T1 (packed), T1 -> T2
 * (tm_persist_held) when T2 takes writes, or T3 first under ON_DEMOTE; a
 * clean copy is dropped at once. Out of T2 a block goes only through
 * tm_row_delete_then_free: its row is deleted and committed before the
 * extent is freed, so no row ever names reused space.
 */
#include "tm_int.h"

/*
 * The block left tier: clear the table's slot if the block is (still)
 * unpinned, and drop the manager's reference. Returns true if it left.
 * If the block is then in no tier, it leaves the table when it can (a parent
 * of live children stays as metadata).
 */
bool tm_leave_tier(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES], int tier, bool *dropped, int *kind, int why)
{
	kvt_btable_entry e;
	int32_t old = -1;
	bool left = false;

	*dropped = false;
	pthread_mutex_lock(&tm->pin_mu);
	if (kvt_btable_get(tm->cfg.bt, h, &e) == KVT_OK && e.pins == 0 && e.slot[tier] >= 0 &&
	    kvt_btable_clear_slot(tm->cfg.bt, h, tier, &old, NULL) == KVT_OK) {
		left = true;
		*kind = e.kind;
		if (tier == KVT_TIER_HBM)
			kvt_t0_unref(tm->cfg.t0, old);
		else if (tier == KVT_TIER_HOST)
			kvt_t1_unref(tm->t1, old);
		bool any = false;
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			any |= t != tier && e.slot[t] >= 0;
		if (!any) {
			*dropped = true;
			/* KVT_EINVAL: has children; stays as metadata */
			if (kvt_btable_remove(tm->cfg.bt, h) == KVT_OK)
				tm_retain_forget(tm->rt, h);
		}
	}
	pthread_mutex_unlock(&tm->pin_mu);
	if (*dropped)
		tm_tomb_dropped(tm, &e, tier, why);
	return left;
}

static void count_leave(kvt_tm *tm, int tier, bool dropped, int kind)
{
	pthread_mutex_lock(&tm->mu);
	tm->st.tier[tier].n_evictions++;
	tm->st.tier[tier].n_evictions_by_kind[kind]++;
	tm->st.tier[tier].n_dropped += dropped;
	pthread_mutex_unlock(&tm->mu);
}

/*
 * The kind share (manager.h, "Chunk share"): of want blocks about to leave
 * tier, how many should be chunk blocks (the rest are prefix blocks) so that
 * of the blocks the table keeps there, chunks hold at most chunk_share and
 * prefixes at most the rest. With c chunks and p prefixes present and
 * left = c + p - want staying, that is c - floor(share * left), within
 * [0, want]: zero while chunks are within their share (the prefixes are
 * over theirs: they go), all of want while chunks exceed it by want or more.
 * Either kind then keeps at least its share of what stays.
 */
static uint32_t chunk_victims(kvt_tm *tm, int tier, uint32_t want)
{
	kvt_btable_stats s;
	kvt_btable_get_stats(tm->cfg.bt, &s);
	uint64_t c = s.n_in_tier_kind[tier][KVT_BLOCK_CHUNK], p = s.n_in_tier_kind[tier][KVT_BLOCK_PREFIX];
	uint64_t left = c + p > want ? c + p - want : 0;
	uint64_t keep = (uint64_t)((double)tm->cfg.chunk_share * (double)left); /* >= 0: truncation is floor */
	uint64_t v = c > keep ? c - keep : 0;
	return v < want ? (uint32_t)v : want;
}

static bool picked(uint8_t (*out)[KVT_HASH_BYTES], uint32_t n, const uint8_t h[KVT_HASH_BYTES])
{
	for (uint32_t i = 0; i < n; i++)
		if (!memcmp(out[i], h, KVT_HASH_BYTES))
			return true;
	return false;
}

/*
 * Acquire up to want eviction victims of tier that are not busy: the coldest
 * unpinned, unretained leaves of each kind, as many of each as the kind share
 * says (chunk_victims), the kind over its share first. A kind that yields no
 * victim at all (none present, or all pinned, retained or busy) leaves its
 * part to the coldest of any kind; one that yields fewer than its part is not
 * made up: the caller's next call (its parents may be leaves by then)
 * recounts. *saw_busy (may be NULL) is set when a candidate was skipped
 * because another thread is moving it.
 */
static uint32_t pick_victims(kvt_tm *tm, int tier, uint32_t want, uint8_t (*out)[KVT_HASH_BYTES], bool *saw_busy)
{
	uint32_t n_busy, n = 0, quota[KVT_BLOCK_KIND_COUNT];
	pthread_mutex_lock(&tm->mu);
	n_busy = tm->n_busy;
	pthread_mutex_unlock(&tm->mu);
	uint32_t cap = want + n_busy + 8; /* our own picks reappear in the last pass: cap covers them (n <= want) */
	uint8_t (*cand)[KVT_HASH_BYTES] = malloc(cap * sizeof(*cand));
	if (!cand)
		return 0;
	quota[KVT_BLOCK_CHUNK] = chunk_victims(tm, tier, want);
	quota[KVT_BLOCK_PREFIX] = want - quota[KVT_BLOCK_CHUNK];
	const int first = quota[KVT_BLOCK_CHUNK] ? KVT_BLOCK_CHUNK : KVT_BLOCK_PREFIX;
	const int order[3] = { first, KVT_BLOCK_CHUNK + KVT_BLOCK_PREFIX - first, KVT_BLOCK_ANY };
	const uint64_t now = tm_retain_now(tm->rt);
	uint32_t open = 0; /* the parts of kinds that yielded no victim: any kind's coldest take them */
	for (int pass = 0; pass < 3 && n < want; pass++) {
		const int kind = order[pass];
		uint32_t goal = n + (kind == KVT_BLOCK_ANY ? open : quota[kind]), n_cand = 0, n_before = n;
		if (goal > want)
			goal = want;
		if (goal <= n)
			continue;
		if (kvt_btable_coldest_kind(tm->cfg.bt, tier, kind, now, cap, cand, &n_cand) == KVT_OK)
			for (uint32_t i = 0; i < n_cand && n < goal; i++) {
				if (picked(out, n, cand[i]))
					continue;
				if (tm_busy_try(tm, cand[i]))
					memcpy(out[n++], cand[i], KVT_HASH_BYTES);
				else if (saw_busy)
					*saw_busy = true;
			}
		if (kind != KVT_BLOCK_ANY && n == n_before)
			open += quota[kind];
	}
	free(cand);
	return n;
}

/* Delete the rows of n busy-held T2 blocks, then free their extents. */
/* Let each of the n held blocks leave the tier (counted) and release it; how many left. */
static uint32_t leave_all(kvt_tm *tm, uint32_t n, uint8_t (*h)[KVT_HASH_BYTES], int tier, int why)
{
	uint32_t n_left = 0;
	for (uint32_t i = 0; i < n; i++) {
		bool dropped;
		int kind = KVT_BLOCK_PREFIX;
		if (tm_leave_tier(tm, h[i], tier, &dropped, &kind, why)) {
			count_leave(tm, tier, dropped, kind);
			n_left++;
		}
		tm_busy_release(tm, h[i]);
	}
	return n_left;
}

static uint32_t evict_t2_held(kvt_tm *tm, uint32_t n, uint8_t (*h)[KVT_HASH_BYTES], int why)
{
	uint32_t n_gone = 0;
	for (uint32_t i = 0; i < n; i++) {
		kvt_btable_entry e;
		kvt_nvme_loc old;
		bool left = false, dropped = false;
		pthread_mutex_lock(&tm->pin_mu);
		if (kvt_btable_get(tm->cfg.bt, h[i], &e) == KVT_OK && e.pins == 0 && e.slot[KVT_TIER_NVME] >= 0 &&
		    kvt_btable_clear_slot(tm->cfg.bt, h[i], KVT_TIER_NVME, NULL, &old) == KVT_OK) {
			left = true;
			if (e.slot[KVT_TIER_HBM] < 0 && e.slot[KVT_TIER_HOST] < 0) {
				dropped = true;
				if (kvt_btable_remove(tm->cfg.bt, h[i]) == KVT_OK)
					tm_retain_forget(tm->rt, h[i]);
			}
		}
		pthread_mutex_unlock(&tm->pin_mu);
		if (!left)
			continue;
		if (dropped)
			tm_tomb_dropped(tm, &e, KVT_TIER_NVME, why);
		int rc = tm_row_delete_then_free(tm, 0, h[i], &old);
		if (rc == KVT_OK) {
			pthread_mutex_lock(&tm->mu);
			tm->t2_full = false;
			pthread_mutex_unlock(&tm->mu);
		} else {
			KVT_LOGW("tm: deleting an index row failed (%s): its T2 extent stays allocated until a restart",
				 kvt_strerror(rc));
		}
		count_leave(tm, KVT_TIER_NVME, dropped, e.kind);
		n_gone++;
	}
	return n_gone;
}

/*
 * Reclaim the least recently used record of another namespace (it can never
 * be served by this one): delete its row, then free its extent. false when
 * none is left (or its row could not be deleted).
 */
static bool reclaim_foreign(kvt_tm *tm)
{
	pthread_mutex_lock(&tm->mu);
	if (tm->next_foreign >= tm->n_foreign) {
		pthread_mutex_unlock(&tm->mu);
		return false;
	}
	tm_foreign f = tm->foreign[tm->next_foreign++];
	pthread_mutex_unlock(&tm->mu);
	int rc = tm_row_delete_then_free(tm, f.ns_id, f.hash, &f.loc);
	if (rc != KVT_OK) {
		KVT_LOGW("tm: deleting the index row of a namespace-%lld record failed (%s): its T2 extent stays "
			 "allocated", (long long)f.ns_id, kvt_strerror(rc));
		return false;
	}
	pthread_mutex_lock(&tm->mu);
	tm->st.n_reclaimed++;
	tm->t2_full = false;
	pthread_mutex_unlock(&tm->mu);
	return true;
}

void tm_evict_t2(kvt_tm *tm, tm_ctx *c, uint64_t bytes_target)
{
	const uint32_t B = tm->cfg.batch_blocks;
	uint8_t (*h)[KVT_HASH_BYTES] = malloc(B * sizeof(*h));
	if (!h)
		return;
	for (;;) {
		kvt_t2_stats s;
		kvt_t2_get_stats(tm->cfg.t2, &s);
		if (s.used_bytes <= bytes_target)
			break;
		if (reclaim_foreign(tm))
			continue;
		uint32_t n = pick_victims(tm, KVT_TIER_NVME, B, h, NULL);
		if (!n)
			break;
		tm_remote_demote_held(tm, c, n, h, KVT_TIER_NVME);
		uint32_t gone = evict_t2_held(tm, n, h, KVT_TM_PRESSURE_WATERMARK);
		for (uint32_t i = 0; i < n; i++)
			tm_busy_release(tm, h[i]);
		if (!gone)
			break;
	}
	free(h);
}

/*
 * Make T1 hold at least want_free free slots: drop clean copies, write dirty
 * ones to T2 first (when it takes writes), drop the rest. Returns the free
 * slots after.
 */
uint32_t tm_evict_t1(kvt_tm *tm, tm_ctx *c, uint32_t want_free, int why)
{
	const uint32_t B = tm->cfg.batch_blocks;
	uint8_t (*h)[KVT_HASH_BYTES] = malloc(B * sizeof(*h));
	uint8_t (*dirty)[KVT_HASH_BYTES] = malloc(B * sizeof(*dirty));
	bool *ok = malloc(B * sizeof(*ok));
	if (!h || !dirty || !ok)
		goto out;
	while (kvt_t1_n_free(tm->t1) < want_free) {
		uint32_t want = want_free - kvt_t1_n_free(tm->t1);
		uint32_t n = pick_victims(tm, KVT_TIER_HOST, want < B ? want : B, h, NULL);
		if (!n)
			break;
		uint32_t n_dirty = 0;
		for (uint32_t i = 0; i < n; i++) {
			kvt_btable_entry e;
			if (kvt_btable_get(tm->cfg.bt, h[i], &e) == KVT_OK && e.slot[KVT_TIER_HBM] < 0 &&
			    e.slot[KVT_TIER_NVME] < 0 && e.dirty)
				memcpy(dirty[n_dirty++], h[i], KVT_HASH_BYTES);
		}
		/* Write-back: the only copy goes to T2 before it leaves T1 (or to T3, ON_DEMOTE, when it leaves the node). */
		tm_remote_demote_held(tm, c, n, h, KVT_TIER_HOST);
		if (n_dirty && tm_t2_writable(tm))
			(void)tm_persist_held(tm, c, n_dirty, dirty, ok);
		if (!leave_all(tm, n, h, KVT_TIER_HOST, why))
			break;
	}
out:
	free(h);
	free(dirty);
	free(ok);
	return kvt_t1_n_free(tm->t1);
}

/*
 * Make T0 hold at least want_free free slots by evicting manager-held blocks:
 * each gets a T1 copy first unless it already has one (or is durable on
 * NVMe); when T1 cannot make room, it is written to T2 directly (when T2
 * takes writes) or dropped. Returns the free slots after; *saw_busy (may be
 * NULL) is set when a candidate was skipped because another thread moves it.
 */
uint32_t tm_evict_t0(kvt_tm *tm, tm_ctx *c, uint32_t want_free, bool *saw_busy, int why)
{
	const uint32_t B = tm->cfg.batch_blocks;
	uint8_t (*h)[KVT_HASH_BYTES] = malloc(B * sizeof(*h));
	int32_t *src = malloc(B * sizeof(*src)), *dst = malloc(B * sizeof(*dst));
	uint32_t *idx = malloc(B * sizeof(*idx));
	void **hp = malloc(B * sizeof(*hp));
	uint8_t (*direct)[KVT_HASH_BYTES] = malloc(B * sizeof(*direct));
	bool *ok = malloc(B * sizeof(*ok));
	if (!h || !src || !dst || !idx || !hp || !direct || !ok)
		goto out;
	while (kvt_t0_n_free(tm->cfg.t0) < want_free) {
		uint32_t want = want_free - kvt_t0_n_free(tm->cfg.t0);
		uint32_t n = pick_victims(tm, KVT_TIER_HBM, want < B ? want : B, h, saw_busy);
		if (!n)
			break;
		uint32_t n_copy = 0, n_direct = 0;
		for (uint32_t i = 0; i < n; i++) {
			kvt_btable_entry e;
			if (kvt_btable_get(tm->cfg.bt, h[i], &e) != KVT_OK || e.pins || e.slot[KVT_TIER_HBM] < 0 ||
			    e.slot[KVT_TIER_HOST] >= 0 || e.slot[KVT_TIER_NVME] >= 0)
				continue; /* clean: dropping the T0 copy costs nothing */
			int32_t s;
			if (kvt_t1_alloc(tm->t1, &s) != KVT_OK) {
				tm_evict_t1(tm, c, 1, why);
				if (kvt_t1_alloc(tm->t1, &s) != KVT_OK) {
					/* T1 has no room (all pinned or busy): straight to T2 if it takes writes, else dropped below */
					memcpy(direct[n_direct++], h[i], KVT_HASH_BYTES);
					continue;
				}
			}
			src[n_copy] = e.slot[KVT_TIER_HBM];
			dst[n_copy] = s;
			hp[n_copy] = kvt_t1_slot_ptr(tm->t1, s);
			idx[n_copy++] = i;
		}
		tm_remote_demote_held(tm, c, n_direct, direct, KVT_TIER_HBM); /* ON_DEMOTE, when T2 will not take them */
		if (n_direct && tm_t2_writable(tm))
			(void)tm_persist_held(tm, c, n_direct, direct, ok);
		if (n_copy) {
			double t0 = kvt_now_s();
			int rc = tm_wait_compute(tm, c);
			if (rc == KVT_OK)
				rc = kvt_t1_mover_pack(c->mv, n_copy, src, hp);
			for (uint32_t k = 0; k < n_copy; k++) {
				if (rc == KVT_OK && kvt_btable_set_slot(tm->cfg.bt, h[idx[k]], KVT_TIER_HOST, dst[k]) == KVT_OK)
					continue;
				kvt_t1_unref(tm->t1, dst[k]);
			}
			if (rc != KVT_OK) {
				for (uint32_t i = 0; i < n; i++)
					tm_busy_release(tm, h[i]);
				break; /* the device failed: logged by the op; keep T0 as it is */
			}
			pthread_mutex_lock(&tm->mu);
			tm->st.tier[KVT_TIER_HBM].n_demotions += n_copy;
			tm->st.tier[KVT_TIER_HBM].demotion_bytes += n_copy * tm->packed_bytes;
			tm->st.tier[KVT_TIER_HBM].demotion_s += kvt_now_s() - t0;
			pthread_mutex_unlock(&tm->mu);
		}
		if (!leave_all(tm, n, h, KVT_TIER_HBM, why))
			break;
	}
out:
	free(h);
	free(src);
	free(dst);
	free(idx);
	free(hp);
	free(direct);
	free(ok);
	return kvt_t0_n_free(tm->cfg.t0);
}

int kvt_tm_reserve_t0(kvt_tm *tm, uint32_t n_free)
{
	if (kvt_t0_n_free(tm->cfg.t0) >= n_free)
		return KVT_OK;
	/* A T0 block another thread is moving is skipped by eviction; that is transient, so retry for those
	 * (up to 10 s: under a sanitizer on a loaded 2-core machine a move took over the 2 s this waited
	 * before, and the scheduler then ended a request: test_sched_fair's swap pressure). */
	const double deadline = kvt_now_s() + 10.0;
	for (;;) {
		bool saw_busy = false;
		pthread_mutex_lock(&tm->ctx_inline.mu);
		uint32_t got = tm_evict_t0(tm, &tm->ctx_inline, n_free, &saw_busy, KVT_TM_PRESSURE_ROOM);
		pthread_mutex_unlock(&tm->ctx_inline.mu);
		if (got >= n_free)
			return KVT_OK;
		pthread_mutex_lock(&tm->mu);
		bool wait = saw_busy && kvt_now_s() < deadline;
		if (wait) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 5000000L;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&tm->cv_done, &tm->mu, &ts);
		}
		pthread_mutex_unlock(&tm->mu);
		if (!wait)
			return KVT_EFULL;
	}
}


/* Release every T0/T1 slot the manager holds (shutdown). */
void tm_release_tier(kvt_tm *tm, int tier)
{
	uint8_t h[64][KVT_HASH_BYTES];
	uint32_t n;
	while (kvt_btable_coldest(tm->cfg.bt, tier, 64, h, &n) == KVT_OK && n) {
		uint32_t n_left = 0;
		for (uint32_t i = 0; i < n; i++) {
			bool dropped;
			int kind;
			n_left += tm_leave_tier(tm, h[i], tier, &dropped, &kind, KVT_TM_PRESSURE_NONE);
		}
		if (!n_left)
			break;
	}
	kvt_btable_stats s;
	kvt_btable_get_stats(tm->cfg.bt, &s);
	if (s.n_in_tier[tier])
		KVT_LOGW("tm: %llu blocks still pinned in %s at shutdown; their slots are not released",
			 (unsigned long long)s.n_in_tier[tier], tier == KVT_TIER_HBM ? "T0" : "T1");
}
