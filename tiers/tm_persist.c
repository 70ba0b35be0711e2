/*
 * tiers/tm_persist.c — persistence: the T2 write order and turn durability
 * (tm_int.h: the manager's files).
 *
 * The write order (DESIGN.md §4), as named steps every writer uses:
 *   1. bytes durable:    the T2 record store's put (rstore.h) returned KVT_OK for it;
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

void tm_record_meta(const kvt_tm *tm, const kvt_btable_entry *e, kvt_t2_block_meta *m)
{
	memset(m, 0, sizeof(*m));
	memcpy(m->hash, e->hash, KVT_HASH_BYTES);
	memcpy(m->parent, e->parent, KVT_HASH_BYTES);
	m->n_tokens = e->n_tokens;
	memcpy(m->tokens, e->tokens, e->n_tokens * sizeof(int32_t));
	m->kv_dtype = KVT_DTYPE_F16;
	m->codec = (uint8_t)tm->cfg.t1_codec;
	m->scale_layout = tm_scale_layout_of(tm->cfg.t1_codec);
	m->raw_bytes = (uint32_t)tm->packed_bytes;
	m->flags = e->kind == KVT_BLOCK_CHUNK ? KVT_T2_FLAG_CHUNK : 0; /* rebuild-index and T3 keep the kind */
}

int tm_pend_add_locked(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	if (tm->n_pend == tm->cap_pend) {
		uint32_t cap = tm->cap_pend ? 2 * tm->cap_pend : 256;
		void *p = realloc(tm->pend, cap * sizeof(*tm->pend));
		if (p) {
			tm->pend = p;
			tm->cap_pend = cap;
		}
	}
	if (tm->n_pend == tm->cap_pend)
		return KVT_ENOMEM;
	memcpy(tm->pend[tm->n_pend].hash, h, KVT_HASH_BYTES);
	tm->pend[tm->n_pend].due_t = 0; /* not due until its turn ends (or a flush) */
	tm->n_pend++;
	return KVT_OK;
}

/*
 * A T2 record's bytes as t1_codec: as they are, or (a record of another
 * format: an f16 NVMe copy, an older build's) decoded into a scratch T0 slot
 * and packed again. KVT_ENOTFOUND when the record cannot be read as a known
 * format or T0 has no free slot for the scratch copy.
 */
static int packed_from_t2(kvt_tm *tm, tm_ctx *c, const kvt_btable_entry *e, void *dst)
{
	kvt_rstore_loc l;
	kvt_t2_block_meta m;
	void *buf = c->h_rec;
	int rc;
	l = e->nvme;
	(void)tm->rs2->ops->get(tm->rs2, 1, (const uint8_t(*)[KVT_HASH_BYTES])e->hash, &l, false, &m, &buf,
				tm->block_bytes, &rc);
	if (rc == KVT_EFULL)
		return KVT_ENOTFOUND;
	if (rc != KVT_OK)
		return rc;
	const int k = m.codec;
	if (k < 0 || k >= KVT_KV_CODEC_COUNT || m.scale_layout != tm_scale_layout_of(k) ||
	    m.raw_bytes != kvt_kv_packed_bytes(kvt_t0_layout(tm->cfg.t0), k) || (k != tm->cfg.t1_codec && !c->mv_rec[k]))
		return KVT_ENOTFOUND;
	if (k == tm->cfg.t1_codec) {
		memcpy(dst, c->h_rec, tm->packed_bytes);
		return KVT_OK;
	}
	int32_t s;
	if (kvt_t0_alloc(tm->cfg.t0, &s) != KVT_OK)
		return KVT_ENOTFOUND; /* no scratch slot: as a miss */
	const void *src = c->h_rec;
	rc = kvt_t1_mover_unpack(c->mv_rec[k], 1, &src, &s);
	if (rc == KVT_OK)
		rc = kvt_t1_mover_pack(c->mv, 1, &s, &dst);
	kvt_t0_unref(tm->cfg.t0, s);
	return rc;
}

int tm_block_packed(kvt_tm *tm, tm_ctx *c, const kvt_btable_entry *e, void *dst)
{
	int rc = KVT_ENOTFOUND;
	if (e->slot[KVT_TIER_HOST] >= 0) {
		memcpy(dst, kvt_t1_slot_ptr(tm->t1, e->slot[KVT_TIER_HOST]), tm->packed_bytes);
		rc = KVT_OK;
	} else if (e->slot[KVT_TIER_HBM] >= 0) {
		int32_t s = e->slot[KVT_TIER_HBM];
		rc = tm_wait_compute(tm, c);
		if (rc == KVT_OK)
			rc = kvt_t1_mover_pack(c->mv, 1, &s, &dst);
	} else if (e->slot[KVT_TIER_NVME] >= 0 && tm->rs2) {
		rc = packed_from_t2(tm, c, e, dst);
	}
	return rc;
}

void tm_extent_free(kvt_tm *tm, const kvt_nvme_loc *loc)
{
	kvt_rstore_loc l;
	int res;
	l = *loc;
	if (tm->rs2->ops->del(tm->rs2, 1, NULL, &l, &res) != KVT_OK)
		KVT_LOGE("tm: the T2 extent at off %llu (%u bytes) to free is not in use (%s); ignored",
			 (unsigned long long)l.off, l.extent_bytes, kvt_strerror(res));
}

int tm_row_delete_then_free(kvt_tm *tm, int64_t ns_id, const uint8_t hash[KVT_HASH_BYTES], const kvt_nvme_loc *loc)
{
	uint64_t tk = 0;
	int rc = ns_id ? kvt_db_delete_block_ns(tm->cfg.db, ns_id, hash, NULL, NULL, &tk)
		       : kvt_db_delete_block(tm->cfg.db, hash, NULL, NULL, &tk);
	if (rc == KVT_OK)
		rc = kvt_db_wait(tm->cfg.db, tk); /* the delete committed: no row names the extent any more */
	if (rc != KVT_OK)
		return rc;
	kvt_fault_point("tm.evict.row_deleted");
	tm_extent_free(tm, loc);
	kvt_fault_point("tm.evict.extent_freed");
	return KVT_OK;
}

/* One persistence batch: the blocks' entries, their records and rows in the making (all [n]). */
typedef struct tm_pbatch {
	kvt_btable_entry *e;      /* [n] the blocks' table entries */
	kvt_t2_block_meta *meta;  /* [n_w] the records' headers */
	kvt_t2_write_req *req;    /* [n_w] the writes */
	kvt_t2_loc *loc;          /* [n_w] where each record went */
	int *res;                 /* [n_w] each write's (then row's) result */
	uint32_t *widx;           /* [n_w] the block index of write k */
	uint64_t *tick;           /* [n_w] each row's commit ticket (0: none) */
	int32_t *pack_slots;      /* [n_pack] T0 slots to pack into the staging buffer */
	void **pack_dst;          /* [n_pack] where each goes in c->h_stage */
	uint32_t n_w, n_pack;     /* records to write, T0 blocks to pack */
	uint64_t n_t0, n_t1;      /* records whose bytes come from T0 (packed) / T1 */
} tm_pbatch;

static void pbatch_free(tm_pbatch *b)
{
	free(b->e);
	free(b->meta);
	free(b->req);
	free(b->loc);
	free(b->res);
	free(b->widx);
	free(b->tick);
	free(b->pack_slots);
	free(b->pack_dst);
}

static int pbatch_alloc(tm_pbatch *b, uint32_t n)
{
	memset(b, 0, sizeof(*b));
	b->e = malloc((size_t)n * sizeof(*b->e));
	b->meta = malloc((size_t)n * sizeof(*b->meta));
	b->req = malloc((size_t)n * sizeof(*b->req));
	b->loc = calloc(n, sizeof(*b->loc));
	b->res = malloc((size_t)n * sizeof(*b->res));
	b->widx = malloc((size_t)n * sizeof(*b->widx));
	b->tick = malloc((size_t)n * sizeof(*b->tick));
	b->pack_slots = malloc((size_t)n * sizeof(*b->pack_slots));
	b->pack_dst = malloc((size_t)n * sizeof(*b->pack_dst));
	if (b->e && b->meta && b->req && b->loc && b->res && b->widx && b->tick && b->pack_slots && b->pack_dst)
		return KVT_OK;
	pbatch_free(b);
	return KVT_ENOMEM;
}

/*
 * Which blocks need a record, and where its bytes are: a T1 slot as it is,
 * or a T0 slot to pack into the staging buffer. ok[i] = true for a block
 * already durable (or clean); false for the rest, until step 3.
 */
static void pbatch_collect(kvt_tm *tm, tm_ctx *c, tm_pbatch *b, uint32_t n, uint8_t (*hashes)[KVT_HASH_BYTES],
			   bool *ok)
{
	for (uint32_t i = 0; i < n; i++) {
		kvt_btable_entry *e = &b->e[i];
		ok[i] = false;
		if (kvt_btable_get(tm->cfg.bt, hashes[i], e) != KVT_OK)
			continue; /* gone: nothing to persist */
		if (e->slot[KVT_TIER_NVME] >= 0 || !e->dirty) {
			ok[i] = true;
			continue;
		}
		const void *src;
		if (e->slot[KVT_TIER_HOST] >= 0) {
			src = kvt_t1_slot_ptr(tm->t1, e->slot[KVT_TIER_HOST]);
			b->n_t1++;
		} else if (e->slot[KVT_TIER_HBM] >= 0) {
			b->pack_slots[b->n_pack] = e->slot[KVT_TIER_HBM];
			b->pack_dst[b->n_pack] = c->h_stage + (size_t)b->n_pack * tm->rec_bytes;
			src = b->pack_dst[b->n_pack++];
			b->n_t0++;
		} else {
			continue; /* in no tier: its bytes are gone */
		}
		tm_record_meta(tm, e, &b->meta[b->n_w]);
		if (e->slot[KVT_TIER_HOST] < 0) { /* packed from T0: the T2 record codec (f16 with t2_f16) */
			b->meta[b->n_w].codec = (uint8_t)tm->rec_codec;
			b->meta[b->n_w].scale_layout = tm_scale_layout_of(tm->rec_codec);
			b->meta[b->n_w].raw_bytes = (uint32_t)tm->rec_bytes;
		}
		b->req[b->n_w].meta = &b->meta[b->n_w];
		b->req[b->n_w].payload = src;
		b->widx[b->n_w++] = i;
	}
}

/* The row that will name record k of the batch (retention filled in by the ledger). */
static void pbatch_row(const tm_pbatch *b, uint32_t k, kvt_db_block_row *row)
{
	const kvt_btable_entry *e = &b->e[b->widx[k]];
	memset(row, 0, sizeof(*row));
	memcpy(row->hash, e->hash, KVT_HASH_BYTES);
	memcpy(row->parent, e->parent, KVT_HASH_BYTES);
	row->n_tokens = e->n_tokens;
	memcpy(row->tokens, e->tokens, e->n_tokens * sizeof(int32_t));
	row->loc = b->loc[k];
	row->kv_dtype = b->meta[k].kv_dtype;
	row->codec = b->meta[k].codec;
	row->scale_layout = b->meta[k].scale_layout;
	row->raw_bytes = b->meta[k].raw_bytes;
	row->last_use = kvt_wall_us();
	row->hit_count = e->hits;
	row->kind = (uint8_t)e->kind;
}

/* What one batch did, for the flags and counters (pbatch_account). */
typedef struct tm_pdone {
	uint64_t n_ok, n_fail; /* blocks made durable, records that did not make it */
	bool t2_full, db_full; /* a write found no space; a row commit was rolled back for lack of space */
} tm_pdone;

/*
 * Steps 2 and 3 of the write order for the records whose bytes are durable
 * (res[k] == KVT_OK after the store's put): queue each row, then wait for
 * each commit, and only then mark the block clean (its NVMe slot set) and
 * ok. A row that cannot be queued or does not commit names nothing, so its
 * extent is freed at once. Returns the first failure or KVT_OK.
 */
static int tm_rows_commit(kvt_tm *tm, tm_pbatch *b, uint8_t (*hashes)[KVT_HASH_BYTES], bool *ok, tm_pdone *d)
{
	int rc = KVT_OK;
	for (uint32_t k = 0; k < b->n_w; k++) { /* queue: group-committed by the index's writer */
		b->tick[k] = 0;
		d->t2_full |= b->res[k] == KVT_EFULL;
		if (b->res[k] != KVT_OK) {
			if (rc == KVT_OK)
				rc = b->res[k];
			continue;
		}
		kvt_db_block_row row;
		pbatch_row(b, k, &row);
		int prc = tm_retain_put_row(tm->rt, tm->cfg.db, &row, &b->tick[k]);
		if (prc != KVT_OK) {
			tm_extent_free(tm, &b->loc[k]); /* no row will name it */
			b->res[k] = prc;
			b->tick[k] = 0;
			if (rc == KVT_OK)
				rc = prc;
		}
	}
	kvt_fault_point("tm.persist.rows_queued");
	for (uint32_t k = 0; k < b->n_w; k++) {
		if (b->res[k] != KVT_OK) {
			d->n_fail++;
			continue;
		}
		int wrc = kvt_db_wait(tm->cfg.db, b->tick[k]);
		if (wrc != KVT_OK) {
			tm_extent_free(tm, &b->loc[k]); /* rolled back: no row names it */
			d->db_full |= wrc == KVT_EFULL;
			d->n_fail++;
			if (rc == KVT_OK)
				rc = wrc;
			continue;
		}
		kvt_fault_point("tm.persist.row_committed");
		kvt_nvme_loc nl;
		nl = b->loc[k];
		(void)kvt_btable_set_nvme(tm->cfg.bt, hashes[b->widx[k]], &nl); /* acknowledged: clean, durable */
		ok[b->widx[k]] = true;
		d->n_ok++;
	}
	return rc;
}

/* The full flags and the demotion counters after a batch (dt: its seconds). */
static void pbatch_account(kvt_tm *tm, const tm_pbatch *b, const tm_pdone *d, double dt)
{
	const double now = kvt_now_s(), n_src = (double)(b->n_t0 + b->n_t1);
	pthread_mutex_lock(&tm->mu);
	if (d->t2_full) {
		tm->t2_full = true;
		tm->t2_full_t = now;
	} else if (d->n_ok) {
		tm->t2_full = false;
	}
	if (d->db_full) {
		tm->db_full = true;
		tm->db_full_t = now;
	} else if (d->n_ok) {
		tm->db_full = false;
	}
	tm->st.n_persisted += d->n_ok;
	tm->st.n_persist_failed += d->n_fail;
	/* Copies out of T1 (or straight out of T0) into T2. */
	const uint64_t n_src_tier[2] = { b->n_t0, b->n_t1 };
	const size_t src_bytes[2] = { tm->rec_bytes, tm->packed_bytes };
	for (int t = KVT_TIER_HBM; t <= KVT_TIER_HOST; t++) {
		if (!n_src_tier[t])
			continue;
		tm->st.tier[t].n_demotions += n_src_tier[t];
		tm->st.tier[t].demotion_bytes += n_src_tier[t] * src_bytes[t];
		tm->st.tier[t].demotion_s += dt * (double)n_src_tier[t] / n_src;
	}
	pthread_mutex_unlock(&tm->mu);
}

/*
 * Make n blocks (busy-held by the caller, n <= batch) durable: write their
 * records (step 1), commit their rows and mark them clean (steps 2-3,
 * tm_rows_commit). ok[i] says whether block i is durable afterwards (true
 * also for a block that already was). Returns the first failure (KVT_EFULL,
 * KVT_EIO) or KVT_OK.
 */
int tm_persist_held(kvt_tm *tm, tm_ctx *c, uint32_t n, uint8_t (*hashes)[KVT_HASH_BYTES], bool *ok)
{
	tm_pbatch b;
	tm_pdone d = { 0 };
	const double t_start = kvt_now_s();

	KVT_ASSERT(n <= tm->cfg.batch_blocks);
	if (pbatch_alloc(&b, n) != KVT_OK) {
		for (uint32_t i = 0; i < n; i++)
			ok[i] = false;
		return KVT_ENOMEM;
	}
	pbatch_collect(tm, c, &b, n, hashes, ok);
	int rc = KVT_OK;
	if (b.n_w && b.n_pack) {
		rc = tm_wait_compute(tm, c);
		if (rc == KVT_OK && tm->rec_codec == tm->cfg.t1_codec)
			rc = kvt_t1_mover_pack(c->mv, b.n_pack, b.pack_slots, b.pack_dst);
		for (uint32_t k = 0; rc == KVT_OK && tm->rec_codec != tm->cfg.t1_codec && k < b.n_pack; k++)
			rc = kvt_t1_mover_pack(c->mv_rec[tm->rec_codec], 1, &b.pack_slots[k], &b.pack_dst[k]);
	}
	if (b.n_w && rc == KVT_OK) {
		(void)tm->rs2->ops->put(tm->rs2, b.n_w, b.req, b.loc, b.res); /* step 1: bytes durable */
		kvt_fault_point("tm.persist.bytes_durable");
		rc = tm_rows_commit(tm, &b, hashes, ok, &d);
		pbatch_account(tm, &b, &d, kvt_now_s() - t_start);
	}
	pbatch_free(&b);
	return rc;
}

/* The block is still dirty and has bytes to write (in T0 or T1). */
static bool still_dirty(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	kvt_btable_entry e;
	return kvt_btable_get(tm->cfg.bt, h, &e) == KVT_OK && e.dirty && e.slot[KVT_TIER_NVME] < 0 &&
	       (e.slot[KVT_TIER_HBM] >= 0 || e.slot[KVT_TIER_HOST] >= 0);
}

/* Why T2 takes no write now: read-only (KVT_EIO), full (KVT_EFULL), or none configured. */
static int persist_refusal(kvt_tm *tm)
{
	if (!tm->cfg.t2)
		return KVT_EUNSUPPORTED;
	kvt_t2_stats s;
	kvt_t2_get_stats(tm->cfg.t2, &s);
	return s.read_only ? KVT_EIO : KVT_EFULL;
}

/* The write-through of one batch of due entries: [n] each (held: busy-acquired by this pass). */
typedef struct tm_dbatch {
	uint8_t (*h)[KVT_HASH_BYTES]; /* the entries' blocks */
	double *due_t;                /* when each became due */
	bool *ok;                     /* [n_held] durable afterwards, in held order */
	bool *held;                   /* taken by this pass (the others are busy: kept due) */
} tm_dbatch;

/*
 * Take the batch's entries out of the pending list's due prefix, from pos
 * (under tm->mu): the held ones written (or failed for good) leave it, the
 * busy ones and those that failed for lack of space stay due. Counts late
 * turns. Returns how many left the list.
 *
 * No space (T2 full, or the index rolling back for lack of space) is
 * transient: a block that did not make it stays due, to be retried once
 * space returns. Other failures (a read-only T2) drop it from the list; its
 * only copy then goes to T2 when T1 evicts it, if T2 takes writes.
 */
static uint32_t pend_settle(kvt_tm *tm, const tm_dbatch *b, uint32_t n, uint32_t *pos, int rc, double now)
{
	const bool keep_failed = rc == KVT_EFULL;
	uint32_t w = *pos, k = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (b->held[i] && !b->ok[k] && keep_failed && still_dirty(tm, b->h[i])) {
			k++;
			tm->pend[w++] = tm->pend[*pos + i];
			continue;
		}
		if (b->held[i]) {
			if (b->ok[k] && b->due_t[i] > 0) {
				tm->st.n_turn_late += now - b->due_t[i] > tm->cfg.end_turn_s;
				if (now - b->due_t[i] > tm->st.max_turn_s)
					tm->st.max_turn_s = now - b->due_t[i];
			}
			k++;
			continue;
		}
		tm->pend[w++] = tm->pend[*pos + i];
	}
	uint32_t removed = n - (w - *pos);
	memmove(&tm->pend[w], &tm->pend[*pos + n], (tm->n_pend - *pos - n) * sizeof(*tm->pend));
	tm->n_pend -= removed;
	tm->n_due -= removed;
	*pos = w;
	return removed;
}

/* Persist the n entries of b that no other thread is moving (held[i]); the first failure or KVT_OK. */
static int dbatch_write(kvt_tm *tm, tm_ctx *c, tm_dbatch *b, uint32_t n, bool *no_mem)
{
	uint8_t (*hh)[KVT_HASH_BYTES] = malloc(n * sizeof(*hh));
	uint32_t n_held = 0;
	*no_mem = !hh;
	if (!hh)
		return KVT_ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		b->held[i] = tm_busy_try(tm, b->h[i]);
		if (b->held[i])
			memcpy(hh[n_held++], b->h[i], KVT_HASH_BYTES);
	}
	int rc = KVT_OK;
	if (!tm_t2_writable(tm)) {
		rc = persist_refusal(tm);
		for (uint32_t i = 0; i < n_held; i++)
			b->ok[i] = false;
	} else if (n_held) {
		rc = tm_persist_held(tm, c, n_held, hh, b->ok);
	}
	for (uint32_t i = 0; i < n_held; i++)
		tm_busy_release(tm, hh[i]);
	free(hh);
	return rc;
}

/* Write the due prefix of the pending list through to T2, in batches. */
void tm_persist_due(kvt_tm *tm, tm_ctx *c)
{
	const uint32_t B = tm->cfg.batch_blocks;
	tm_dbatch b = { malloc(B * sizeof(*b.h)), malloc(B * sizeof(*b.due_t)), malloc(B * sizeof(*b.ok)),
			malloc(B * sizeof(*b.held)) };
	uint32_t pos = 0; /* due entries before pos were skipped (busy) this pass */
	while (b.h && b.due_t && b.ok && b.held) {
		pthread_mutex_lock(&tm->mu);
		uint32_t n = 0;
		while (pos + n < tm->n_due && n < B) {
			memcpy(b.h[n], tm->pend[pos + n].hash, KVT_HASH_BYTES);
			b.due_t[n] = tm->pend[pos + n].due_t;
			n++;
		}
		pthread_mutex_unlock(&tm->mu);
		if (!n)
			break;
		/* Take what is not being moved; come back for the rest next pass. */
		bool no_mem;
		int rc = dbatch_write(tm, c, &b, n, &no_mem);
		if (no_mem)
			break;
		/* Remove the handled entries (held ones) from the list; keep the busy ones due. */
		double now = kvt_now_s();
		pthread_mutex_lock(&tm->mu);
		if (rc != KVT_OK && tm->persist_err == KVT_OK)
			tm->persist_err = rc;
		uint32_t removed = pend_settle(tm, &b, n, &pos, rc, now);
		pthread_mutex_unlock(&tm->mu);
		if (!removed && pos >= tm->n_due)
			break;
	}
	free(b.h);
	free(b.due_t);
	free(b.ok);
	free(b.held);
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
		kvt_fault_point("tm.turn.answered");
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
