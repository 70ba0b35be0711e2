/*
 * tiers/tm_snapshot.c — blocks out of the tiers as self-checking records, and
 * records back into the tiers: what a slot snapshot (llama-server's
 * POST /slots/{id}?action=save|restore, engine/serve/sessions_snapshot.c) is made of.
 *
 * Design. A block leaves as the record T2 and T3 already store (t2_store.h:
 * magic, version, model fingerprint, hash, parent, tokens, codec, lengths,
 * XXH3 over header and payload), uncompressed, without its padding and
 * sealed for offset 0 and generation KVT_TM_SNAPSHOT_GENERATION, so it is
 * checked by the one record verifier. Its bytes come from wherever the block
 * is: T1 as it is, T0 packed through the inline mover, T2 read and verified
 * (as the T3 writer does in tm_remote.c).
 *
 * A record comes back under the hash the caller names, not the one it holds:
 * the chain hash is salted per tenant with the server secret, so a snapshot
 * restored by another daemon (another data dir, another secret) or into
 * another tenant is named by that daemon's chain over the same tokens. It is
 * entered as T3's blocks are (tm_remote.c, remote_enter/remote_fill_t1): a
 * table entry, then a T1 slot holding the bytes; unlike a T3 block it stays
 * dirty (nothing durable holds it here) and joins the pending list, so the
 * write order takes it to T2 like any registered block.
 *
 * Invariants: a record is entered only after it verified (checksum, model
 * fingerprint) and fits this manager (codec, scale layout, payload size,
 * block_tokens, the tokens the caller expects); a block already known keeps
 * its copies (the record is dropped, not merged); every move holds the
 * block's busy entry.
 */
#include "t2_int.h"
#include "tm_int.h"

#define KVT_TM_SNAPSHOT_GENERATION 5u /* the generation snapshot records are sealed for (their offset is 0) */

/* The packed bytes of the busy-held block e into dst, through the inline context (the engine's thread). */
static int block_bytes(kvt_tm *tm, const kvt_btable_entry *e, void *dst)
{
	tm_ctx *c = &tm->ctx_inline;
	pthread_mutex_lock(&c->mu);
	int rc = tm_block_packed(tm, c, e, c->h_stage); /* pinned: the mover's D2H target */
	if (rc == KVT_OK)
		memcpy(dst, c->h_stage, tm->packed_bytes);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int kvt_tm_block_export(kvt_tm *tm, const uint8_t model_fp[KVT_HASH_BYTES], const uint8_t h[KVT_HASH_BYTES],
			uint8_t **rec_out, size_t *n_out)
{
	const size_t ext = kvt_t2_round_up((uint64_t)KVT_T2_HEADER_BYTES + tm->packed_bytes, KVT_T2_UNIT_BYTES);
	kvt_btable_entry *e = malloc(sizeof(*e));
	kvt_t2_block_meta *m = malloc(sizeof(*m));
	uint8_t *pay = malloc(tm->packed_bytes), *rec = malloc(ext);
	int rc = KVT_ENOMEM;
	if (!e || !m || !pay || !rec)
		goto out;
	if ((rc = tm_busy_wait(tm, h)) != KVT_OK)
		goto out;
	rc = kvt_btable_get(tm->cfg.bt, h, e);
	if (rc == KVT_OK)
		rc = block_bytes(tm, e, pay);
	tm_busy_release(tm, h);
	if (rc != KVT_OK)
		goto out;
	tm_record_meta(tm, e, m);
	kvt_t2_sized sz;
	kvt_t2_loc loc;
	kvt_t2_record_pack(m, pay, KVT_T2_COMP_NONE, NULL, rec, ext, &sz);
	kvt_t2_record_seal(m, model_fp, &sz, 0, KVT_TM_SNAPSHOT_GENERATION, rec, &loc);
	*n_out = KVT_T2_HEADER_BYTES + sz.stored_bytes;
	*rec_out = rec;
	rec = NULL;
out:
	free(e);
	free(m);
	free(pay);
	free(rec);
	return rc;
}

/* Does a verified record fit this manager and the block the caller expects? why says what does not. */
static bool record_fits(const kvt_tm *tm, const kvt_t2_block_meta *m, const int32_t *tokens, uint32_t n_tokens,
			const char **why)
{
	if (m->codec != tm->cfg.t1_codec || m->scale_layout != tm_scale_layout_of(tm->cfg.t1_codec)) {
		*why = "the record's KV codec is not this daemon's [tier.host] dtype";
		return false;
	}
	if (m->raw_bytes != tm->packed_bytes || m->n_tokens != kvt_btable_block_tokens(tm->cfg.bt)) {
		*why = "the record's block size (bytes or tokens) is not this daemon's";
		return false;
	}
	if (m->n_tokens != n_tokens || memcmp(m->tokens, tokens, n_tokens * sizeof(int32_t))) {
		*why = "the record's tokens are not the history's";
		return false;
	}
	return true;
}

/* A new block joins the pending list (not yet durable), as kvt_tm_register does. */
static int pend_add(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	pthread_mutex_lock(&tm->mu);
	int rc = tm_pend_add_locked(tm, h);
	tm->st.n_registered += rc == KVT_OK;
	pthread_mutex_unlock(&tm->mu);
	return rc;
}

/* Enter block h (parent, the record's tokens and kind) with a T1 slot holding payload. */
static int block_enter(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES], const uint8_t parent[KVT_HASH_BYTES],
		       const kvt_t2_block_meta *m, const void *payload)
{
	bool created = false;
	const int kind = m->flags & KVT_T2_FLAG_CHUNK ? KVT_BLOCK_CHUNK : KVT_BLOCK_PREFIX;
	int rc = tm_busy_wait(tm, h);
	if (rc != KVT_OK)
		return rc;
	rc = kvt_btable_insert(tm->cfg.bt, h, parent, m->tokens, &created);
	if (rc == KVT_OK && created)
		rc = kvt_btable_set_kind(tm->cfg.bt, h, kind);
	if (rc == KVT_OK && created) {
		int32_t s1 = -1;
		if (kvt_t1_alloc(tm->t1, &s1) != KVT_OK) {
			pthread_mutex_lock(&tm->ctx_inline.mu);
			tm_evict_t1(tm, &tm->ctx_inline, 1, KVT_TM_PRESSURE_ROOM);
			pthread_mutex_unlock(&tm->ctx_inline.mu);
			rc = kvt_t1_alloc(tm->t1, &s1);
		}
		if (rc == KVT_OK) {
			memcpy(kvt_t1_slot_ptr(tm->t1, s1), payload, tm->packed_bytes);
			if ((rc = kvt_btable_set_slot(tm->cfg.bt, h, KVT_TIER_HOST, s1)) != KVT_OK)
				kvt_t1_unref(tm->t1, s1);
		}
		if (rc == KVT_OK)
			rc = pend_add(tm, h);
		if (rc != KVT_OK)
			(void)kvt_btable_remove(tm->cfg.bt, h);
	}
	tm_busy_release(tm, h);
	return rc;
}

int kvt_tm_block_import(kvt_tm *tm, const uint8_t model_fp[KVT_HASH_BYTES], const uint8_t *rec, size_t n,
			const uint8_t h[KVT_HASH_BYTES], const uint8_t parent[KVT_HASH_BYTES], const int32_t *tokens,
			uint32_t n_tokens, const char **why)
{
	/*
	 * Verified at the size the record says it is (bounded), so a record of
	 * another codec or block shape is named as such by record_fits rather
	 * than failing on its length.
	 */
	size_t cap = tm->packed_bytes;
	if (n >= KVT_T2_MIN_HEADER_BYTES) {
		const uint8_t *r = rec + 128; /* raw bytes (t2_store.h) */
		size_t raw = (size_t)r[0] | (size_t)r[1] << 8 | (size_t)r[2] << 16 | (size_t)r[3] << 24;
		if (raw > cap && raw <= KVT_T2_MAX_RAW_BYTES)
			cap = raw;
	}
	kvt_t2_block_meta *m = malloc(sizeof(*m));
	uint8_t *pay = malloc(cap), *scratch = malloc(cap);
	const uint64_t limit = kvt_t2_round_up((uint64_t)KVT_T2_HEADER_BYTES + cap, KVT_T2_UNIT_BYTES);
	int rc = KVT_ENOMEM;
	*why = "out of memory";
	if (!m || !pay || !scratch)
		goto out;
	rc = kvt_t2_record_verify_unpadded(rec, n, limit, 0, model_fp, NULL, m, pay, cap, scratch, why);
	if (rc == KVT_EFULL) {
		rc = KVT_ECORRUPT;
		*why = "a record larger than this daemon's block";
	}
	if (rc != KVT_OK)
		goto out;
	if (!record_fits(tm, m, tokens, n_tokens, why)) {
		rc = KVT_EINVAL;
		goto out;
	}
	if ((rc = block_enter(tm, h, parent, m, pay)) != KVT_OK)
		*why = rc == KVT_EFULL ? "no room in the host tier" : "the block could not be entered";
out:
	free(m);
	free(pay);
	free(scratch);
	return rc;
}

size_t kvt_tm_record_max_bytes(const kvt_tm *tm)
{
	return KVT_T2_HEADER_BYTES + tm->packed_bytes;
}
