/*
 * tiers/tm_persist.c — persistence: the T2 write order and turn durability
 * (tm_int.h: the manager's files).
 *
 * The write order (DESIGN.md §4), as named steps every writer uses:
 *   1. bytes durable:    kvt_t2_write_batch returned KVT_OK for the record;
 *   2. row committed:    tm_rows_commit queues each durable record's row and
 *                        waits for its commit; a row that does not commit
 *                        gives its extent back at once (no row names it);
 *   3. acknowledged:     only after step 2 is the block marked clean (its
 *                        NVMe slot set in the table), so a durable prefix
 *                        (tm_durable_prefix) and a turn's answer count only
 *                        committed rows.
 *   Removal runs backwards: tm_row_delete_then_free deletes the row, waits
 *   for the delete to commit, and only then frees the extent.
 * The pending list holds registered blocks not yet durable; its due prefix
 * (end of turn, flush) is written through by the maintenance pass
 * (tm_persist_due). A turn whose owner waits (kvt_tm_end_turn_chain) is
 * answered once none of its blocks is pending, with its durable prefix.
 * No space (T2 full, the index out of space) is transient: such blocks stay
 * due and are retried; other failures drop them from the list.
 */
#include "tm_int.h"

/*
 * Make n blocks (busy-held by the caller, n <= batch) durable: write their
 * records, put their rows, and once a row commits mark the block clean in
 * the table. ok[i] says whether block i is durable afterwards (true also for
 * a block that already was). Returns the first failure (KVT_EFULL, KVT_EIO)
 * or KVT_OK.
 */
int tm_persist_held(kvt_tm *tm, tm_ctx *c, uint32_t n, uint8_t (*hashes)[KVT_HASH_BYTES], bool *ok)
{
	const uint32_t B = tm->cfg.batch_blocks;
	kvt_btable_entry *e = malloc((size_t)n * sizeof(*e));
	kvt_t2_block_meta *meta = malloc((size_t)n * sizeof(*meta));
	kvt_t2_write_req *req = malloc((size_t)n * sizeof(*req));
	kvt_t2_loc *loc = calloc(n, sizeof(*loc));
	int *res = malloc((size_t)n * sizeof(*res));
	uint32_t *widx = malloc((size_t)n * sizeof(*widx));
	uint64_t *tick = malloc((size_t)n * sizeof(*tick));
	int32_t *pack_slots = malloc((size_t)n * sizeof(*pack_slots));
	void **pack_dst = malloc((size_t)n * sizeof(*pack_dst));
	uint32_t n_w = 0, n_pack = 0;
	int rc = KVT_OK;
	double t_start = kvt_now_s();
	uint64_t bytes_t0 = 0, bytes_t1 = 0, n_t0 = 0, n_t1 = 0;

	KVT_ASSERT(n <= B);
	if (!e || !meta || !req || !loc || !res || !widx || !tick || !pack_slots || !pack_dst) {
		rc = KVT_ENOMEM;
		for (uint32_t i = 0; i < n; i++)
			ok[i] = false;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		ok[i] = false;
		if (kvt_btable_get(tm->cfg.bt, hashes[i], &e[i]) != KVT_OK)
			continue; /* gone: nothing to persist */
		if (e[i].slot[KVT_TIER_NVME] >= 0 || !e[i].dirty) {
			ok[i] = true;
			continue;
		}
		const void *src;
		if (e[i].slot[KVT_TIER_HOST] >= 0) {
			src = kvt_t1_slot_ptr(tm->t1, e[i].slot[KVT_TIER_HOST]);
			bytes_t1 += tm->packed_bytes;
			n_t1++;
		} else if (e[i].slot[KVT_TIER_HBM] >= 0) {
			pack_slots[n_pack] = e[i].slot[KVT_TIER_HBM];
			pack_dst[n_pack] = c->h_stage + (size_t)n_pack * tm->packed_bytes;
			src = pack_dst[n_pack++];
			bytes_t0 += tm->packed_bytes;
			n_t0++;
		} else {
			continue; /* in no tier: its bytes are gone */
		}
		kvt_t2_block_meta *m = &meta[n_w];
		memset(m, 0, sizeof(*m));
		memcpy(m->hash, e[i].hash, KVT_HASH_BYTES);
		memcpy(m->parent, e[i].parent, KVT_HASH_BYTES);
		m->n_tokens = e[i].n_tokens;
		memcpy(m->tokens, e[i].tokens, e[i].n_tokens * sizeof(int32_t));
		m->kv_dtype = KVT_DTYPE_F16;
		m->codec = (uint8_t)tm->cfg.t1_codec;
		m->scale_layout = tm_scale_layout_of(tm->cfg.t1_codec);
		m->raw_bytes = (uint32_t)tm->packed_bytes;
		m->flags = e[i].kind == KVT_BLOCK_CHUNK ? KVT_T2_FLAG_CHUNK : 0; /* rebuild-index and T3 keep the kind */
		req[n_w].meta = m;
		req[n_w].payload = src;
		widx[n_w++] = i;
	}
	if (!n_w)
		goto out;
	if (n_pack) {
		rc = tm_wait_compute(tm, c);
		if (rc == KVT_OK)
			rc = kvt_t1_mover_pack(c->mv, n_pack, pack_slots, pack_dst);
		if (rc)
			goto out;
	}
	(void)kvt_t2_write_batch(tm->cfg.t2, n_w, req, loc, res);
	/* Bytes durable: queue the rows of the records that made it. */
	bool any_full = false;
	for (uint32_t k = 0; k < n_w; k++) {
		tick[k] = 0;
		if (res[k] == KVT_EFULL)
			any_full = true;
		if (res[k] != KVT_OK) {
			if (rc == KVT_OK)
				rc = res[k];
			continue;
		}
		const kvt_btable_entry *b = &e[widx[k]];
		kvt_db_block_row row;
		memset(&row, 0, sizeof(row));
		memcpy(row.hash, b->hash, KVT_HASH_BYTES);
		memcpy(row.parent, b->parent, KVT_HASH_BYTES);
		row.n_tokens = b->n_tokens;
		memcpy(row.tokens, b->tokens, b->n_tokens * sizeof(int32_t));
		row.loc = loc[k];
		row.kv_dtype = meta[k].kv_dtype;
		row.codec = meta[k].codec;
		row.scale_layout = meta[k].scale_layout;
		row.raw_bytes = meta[k].raw_bytes;
		row.last_use = kvt_wall_us();
		row.hit_count = b->hits;
		row.kind = (uint8_t)b->kind;
		int prc = tm_retain_put_row(tm->rt, tm->cfg.db, &row, &tick[k]);
		if (prc != KVT_OK) {
			/* No row will point at the extent: it can go back at once. */
			kvt_t2_free(tm->cfg.t2, &loc[k]);
			res[k] = prc;
			tick[k] = 0;
			if (rc == KVT_OK)
				rc = prc;
		}
	}
	/* Rows committed: only now is the block clean. */
	uint64_t n_ok = 0, n_fail = 0;
	bool db_full = false;
	for (uint32_t k = 0; k < n_w; k++) {
		if (res[k] != KVT_OK) {
			n_fail++;
			continue;
		}
		int wrc = kvt_db_wait(tm->cfg.db, tick[k]);
		if (wrc != KVT_OK) {
			/* Rolled back: no row points at the record, so its extent goes back at once. */
			kvt_t2_free(tm->cfg.t2, &loc[k]);
			db_full |= wrc == KVT_EFULL;
			n_fail++;
			if (rc == KVT_OK)
				rc = wrc;
			continue;
		}
		kvt_nvme_loc nl;
		nl = loc[k];
		(void)kvt_btable_set_nvme(tm->cfg.bt, hashes[widx[k]], &nl);
		ok[widx[k]] = true;
		n_ok++;
	}
	double dt = kvt_now_s() - t_start;
	pthread_mutex_lock(&tm->mu);
	if (any_full) {
		tm->t2_full = true;
		tm->t2_full_t = kvt_now_s();
	} else if (n_ok) {
		tm->t2_full = false;
	}
	if (db_full) {
		tm->db_full = true;
		tm->db_full_t = kvt_now_s();
	} else if (n_ok) {
		tm->db_full = false;
	}
	tm->st.n_persisted += n_ok;
	tm->st.n_persist_failed += n_fail;
	/* Copies out of T1 (or straight out of T0) into T2. */
	if (n_t1) {
		tm->st.tier[KVT_TIER_HOST].n_demotions += n_t1;
		tm->st.tier[KVT_TIER_HOST].demotion_bytes += bytes_t1;
		tm->st.tier[KVT_TIER_HOST].demotion_s += dt * (double)n_t1 / (double)(n_t0 + n_t1);
	}
	if (n_t0) {
		tm->st.tier[KVT_TIER_HBM].n_demotions += n_t0;
		tm->st.tier[KVT_TIER_HBM].demotion_bytes += bytes_t0;
		tm->st.tier[KVT_TIER_HBM].demotion_s += dt * (double)n_t0 / (double)(n_t0 + n_t1);
	}
	pthread_mutex_unlock(&tm->mu);
out:
	free(e);
	free(meta);
	free(req);
	free(loc);
	free(res);
	free(widx);
	free(tick);
	free(pack_slots);
	free(pack_dst);
	return rc;
}

/* The block is still dirty and has bytes to write (in T0 or T1). */
static bool still_dirty(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	kvt_btable_entry e;
	return kvt_btable_get(tm->cfg.bt, h, &e) == KVT_OK && e.dirty && e.slot[KVT_TIER_NVME] < 0 &&
	       (e.slot[KVT_TIER_HBM] >= 0 || e.slot[KVT_TIER_HOST] >= 0);
}

/* Write the due prefix of the pending list through to T2, in batches. */
void tm_persist_due(kvt_tm *tm, tm_ctx *c)
{
	const uint32_t B = tm->cfg.batch_blocks;
	uint8_t (*h)[KVT_HASH_BYTES] = malloc(B * sizeof(*h));
	double *due_t = malloc(B * sizeof(*due_t));
	bool *ok = malloc(B * sizeof(*ok));
	bool *held = malloc(B * sizeof(*held));
	if (!h || !due_t || !ok || !held)
		goto out;
	uint32_t pos = 0; /* due entries before pos were skipped (busy) this pass */
	for (;;) {
		pthread_mutex_lock(&tm->mu);
		uint32_t n = 0;
		while (pos + n < tm->n_due && n < B) {
			memcpy(h[n], tm->pend[pos + n].hash, KVT_HASH_BYTES);
			due_t[n] = tm->pend[pos + n].due_t;
			n++;
		}
		pthread_mutex_unlock(&tm->mu);
		if (!n)
			break;
		/* Take what is not being moved; come back for the rest next pass. */
		uint8_t (*hh)[KVT_HASH_BYTES] = malloc(n * sizeof(*hh));
		uint32_t n_held = 0;
		if (!hh)
			break;
		for (uint32_t i = 0; i < n; i++) {
			held[i] = tm_busy_try(tm, h[i]);
			if (held[i])
				memcpy(hh[n_held++], h[i], KVT_HASH_BYTES);
		}
		int rc = KVT_OK;
		bool *okh = ok;
		if (!tm_t2_writable(tm)) {
			rc = tm->cfg.t2 ? KVT_EIO : KVT_EUNSUPPORTED;
			kvt_t2_stats s;
			if (tm->cfg.t2) {
				kvt_t2_get_stats(tm->cfg.t2, &s);
				if (!s.read_only)
					rc = KVT_EFULL;
			}
			for (uint32_t i = 0; i < n_held; i++)
				okh[i] = false;
		} else if (n_held) {
			rc = tm_persist_held(tm, c, n_held, hh, okh);
		}
		for (uint32_t i = 0; i < n_held; i++)
			tm_busy_release(tm, hh[i]);
		free(hh);
		/* Remove the handled entries (held ones) from the list; keep the busy ones due. */
		double now = kvt_now_s();
		pthread_mutex_lock(&tm->mu);
		if (rc != KVT_OK && tm->persist_err == KVT_OK)
			tm->persist_err = rc;
		/*
		 * No space (T2 full, or the index rolling back for lack of space) is
		 * transient: a block that did not make it stays due, to be retried once
		 * space returns. Other failures (a read-only T2) drop it from the list;
		 * its only copy then goes to T2 when T1 evicts it, if T2 takes writes.
		 */
		const bool keep_failed = rc == KVT_EFULL;
		uint32_t w = pos, k = 0;
		for (uint32_t i = 0; i < n; i++) {
			if (held[i] && !ok[k] && keep_failed && still_dirty(tm, h[i])) {
				k++;
				tm->pend[w++] = tm->pend[pos + i];
				continue;
			}
			if (held[i]) {
				if (ok[k] && due_t[i] > 0) {
					tm->st.n_turn_late += now - due_t[i] > tm->cfg.end_turn_s;
					if (now - due_t[i] > tm->st.max_turn_s)
						tm->st.max_turn_s = now - due_t[i];
				}
				k++;
				continue;
			}
			tm->pend[w++] = tm->pend[pos + i];
		}
		uint32_t removed = n - (w - pos);
		memmove(&tm->pend[w], &tm->pend[pos + n], (tm->n_pend - pos - n) * sizeof(*tm->pend));
		tm->n_pend -= removed;
		tm->n_due -= removed;
		pos = w;
		pthread_mutex_unlock(&tm->mu);
		if (!removed && pos >= tm->n_due)
			break;
	}
out:
	free(h);
	free(due_t);
	free(ok);
	free(held);
}

int tm_hash_cmp(const void *a, const void *b) { return memcmp(a, b, KVT_HASH_BYTES); }

/* Leading blocks of a chain whose bytes are durable in T2 with their row committed. */
uint32_t tm_durable_prefix(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES])
{
	uint32_t i = 0;
	kvt_btable_entry e;
	while (i < n && kvt_btable_get(tm->cfg.bt, hashes[i], &e) == KVT_OK && e.slot[KVT_TIER_NVME] >= 0)
		i++;
	return i;
}

/* Does the pending list still hold a block of this turn? (tm->mu) */
static bool turn_pending(const kvt_tm *tm, const tm_turn_wait *w)
{
	for (uint32_t i = 0; i < tm->n_pend; i++)
		if (bsearch(tm->pend[i].hash, w->sorted, w->n, KVT_HASH_BYTES, tm_hash_cmp))
			return true;
	return false;
}

/*
 * Answer the turns none of whose blocks waits for write-through any more
 * (every turn when all: shutdown), and the oldest past TM_MAX_TURN_WAITS,
 * each with its chain's durable prefix then. The callbacks run here, outside
 * tm->mu.
 */
void tm_turn_waits_answer(kvt_tm *tm, bool all)
{
	tm_turn_wait *done = NULL, **tail = &done;
	pthread_mutex_lock(&tm->mu);
	for (tm_turn_wait **pp = &tm->waits; *pp;) {
		tm_turn_wait *w = *pp;
		if (all || tm->n_waits > TM_MAX_TURN_WAITS || !turn_pending(tm, w)) {
			*pp = w->next;
			tm->n_waits--;
			w->next = NULL;
			*tail = w;
			tail = &w->next;
		} else {
			pp = &w->next;
		}
	}
	pthread_mutex_unlock(&tm->mu);
	while (done) {
		tm_turn_wait *w = done;
		done = w->next;
		w->fn(w->user, all ? KVT_ESTOPPED : KVT_OK,
		      tm_durable_prefix(tm, w->n, (const uint8_t(*)[KVT_HASH_BYTES])w->chain));
		free(w->chain);
		free(w->sorted);
		free(w);
	}
}

void kvt_tm_end_turn(kvt_tm *tm)
{
	if (tm->cfg.t3) { /* the turn's blocks become due for T3 (WRITE_THROUGH queues them) */
		pthread_mutex_lock(&tm->mu);
		tm->n_rq_due = tm->n_rq;
		pthread_cond_signal(&tm->cv_remote);
		pthread_mutex_unlock(&tm->mu);
	}
	if (tm->cfg.persist != KVT_PERSIST_END_OF_TURN || !tm->cfg.t2)
		return;
	double now = kvt_now_s();
	pthread_mutex_lock(&tm->mu);
	for (uint32_t i = tm->n_due; i < tm->n_pend; i++)
		tm->pend[i].due_t = now;
	tm->n_due = tm->n_pend;
	tm->maint_kick = true;
	pthread_cond_signal(&tm->cv_maint);
	pthread_mutex_unlock(&tm->mu);
}

/*
 * Move the entries of arr[n_due..n) (elements of elem bytes, each starting
 * with its block hash) whose hash is in the sorted set hs[0..n_hs) into the
 * due prefix, keeping the order of those it moves; returns the new due count.
 */
static uint32_t move_due(void *arr, size_t elem, uint32_t n_due, uint32_t n, const uint8_t (*hs)[KVT_HASH_BYTES],
			 uint32_t n_hs)
{
	unsigned char *a = arr, tmp[64];
	KVT_ASSERT(elem <= sizeof(tmp));
	for (uint32_t i = n_due; i < n; i++) {
		if (!bsearch(a + (size_t)i * elem, hs, n_hs, KVT_HASH_BYTES, tm_hash_cmp))
			continue;
		memcpy(tmp, a + (size_t)i * elem, elem);
		memcpy(a + (size_t)i * elem, a + (size_t)n_due * elem, elem);
		memcpy(a + (size_t)n_due * elem, tmp, elem);
		n_due++;
	}
	return n_due;
}
_Static_assert(offsetof(tm_pending, hash) == 0 && offsetof(tm_remote_q, hash) == 0,
	       "move_due finds the block hash at the start of each entry");

uint32_t kvt_tm_durable_prefix(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES])
{
	return tm_durable_prefix(tm, n, hashes);
}

int kvt_tm_end_turn_chain(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], kvt_tm_durable_fn done,
			  void *user)
{
	const bool eot = tm->cfg.persist == KVT_PERSIST_END_OF_TURN && tm->cfg.t2;
	if (!n || (!tm->cfg.t3 && !eot)) {
		if (done) /* nothing is written through for it: what is durable now is all it gets */
			done(user, KVT_OK, tm_durable_prefix(tm, n, hashes));
		return KVT_OK;
	}
	uint8_t(*hs)[KVT_HASH_BYTES] = malloc((size_t)n * KVT_HASH_BYTES);
	tm_turn_wait *w = done && eot ? calloc(1, sizeof(*w)) : NULL;
	uint8_t(*chain)[KVT_HASH_BYTES] = w ? malloc((size_t)n * KVT_HASH_BYTES) : NULL;
	if (!hs || (done && eot && (!w || !chain))) {
		free(hs);
		free(w);
		free(chain);
		return KVT_ENOMEM;
	}
	memcpy(hs, hashes, (size_t)n * KVT_HASH_BYTES);
	qsort(hs, n, KVT_HASH_BYTES, tm_hash_cmp);
	if (w) {
		memcpy(chain, hashes, (size_t)n * KVT_HASH_BYTES);
		*w = (tm_turn_wait){ .n = n, .fn = done, .user = user, .chain = chain, .sorted = hs };
	}
	const double now = kvt_now_s();
	pthread_mutex_lock(&tm->mu);
	if (tm->cfg.t3) {
		tm->n_rq_due = move_due(tm->rq, sizeof(*tm->rq), tm->n_rq_due, tm->n_rq, (const uint8_t(*)[KVT_HASH_BYTES])hs, n);
		pthread_cond_signal(&tm->cv_remote);
	}
	if (tm->cfg.persist == KVT_PERSIST_END_OF_TURN && tm->cfg.t2) {
		uint32_t was = tm->n_due;
		tm->n_due = move_due(tm->pend, sizeof(*tm->pend), tm->n_due, tm->n_pend, (const uint8_t(*)[KVT_HASH_BYTES])hs, n);
		for (uint32_t i = was; i < tm->n_due; i++)
			tm->pend[i].due_t = now;
		tm->maint_kick = true;
		pthread_cond_signal(&tm->cv_maint);
	}
	if (w) { /* answered by a maintenance pass once none of its blocks is pending */
		tm_turn_wait **pp = &tm->waits;
		while (*pp)
			pp = &(*pp)->next;
		*pp = w;
		tm->n_waits++;
	}
	pthread_mutex_unlock(&tm->mu);
	if (!w)
		free(hs);
	if (done && !eot) /* T3 only: its blocks never become durable here */
		done(user, KVT_OK, tm_durable_prefix(tm, n, hashes));
	return KVT_OK;
}

int kvt_tm_flush(kvt_tm *tm)
{
	if (!tm->cfg.t2)
		return KVT_EUNSUPPORTED;
	pthread_mutex_lock(&tm->mu);
	tm->n_due = tm->n_pend;
	tm->persist_err = KVT_OK;
	uint64_t target = ++tm->flush_req;
	tm->maint_kick = true;
	pthread_cond_signal(&tm->cv_maint);
	while (tm->flush_done < target && !tm->stop)
		pthread_cond_wait(&tm->cv_done, &tm->mu);
	int rc = tm->persist_err;
	pthread_mutex_unlock(&tm->mu);
	return rc;
}
