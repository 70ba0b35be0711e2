/*
 * engine/serve/sched_chunks.c — chunk reuse (sched_int.h): the spans a
 * request marks (kvt_sched_req.chunks) looked up at admission, placed into
 * its sequence once the exact prefix is taken, prefilled by the blend, and
 * stored when they were not found.
 *
 * Design. A marked span is named by its own
 * tokens: its full blocks form a chain under the tenant's chunk root
 * (chunk_root), whatever precedes it. Admission looks each span up
 * (a SERVE handle, waited for at once); once the exact prefix is taken, the
 * blocks found are moved into the request's sequence at the span's position
 * (kvt_model_kv_move: their K was stored at chunk-relative positions, and
 * is turned by the span's start), and the handle is let go. The prompt is
 * prefilled as usual up to the first placed span; from there to the
 * prompt's last token kvt_model_forward_blend runs alone (the rows placed
 * are recomputed past the check layer only in the fraction asked for); the
 * last token runs in the batch as usual. Blocks from the first placed span
 * on are not registered under the chain: their K/V are not a plain
 * prefill's, and an exact prefix hit must be exact. A span not found is
 * stored once its positions are computed: its K/V moved to chunk-relative
 * positions (turned by -start) into fresh blocks, registered under the
 * chunk chain. A preempted request resumes without chunk reuse.
 *
 * Invariants: h->chunks is NULL or [req.n_chunks]; a span's lookup handle
 * (pfx) is held only from the lookup to the placing; h->blend_at is NO_BLEND
 * or the start of the first span placed, and h->reg_limit keeps the chain's
 * registration below it. Scheduler thread only; s->mu for the counters.
 */
#include "sched_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLEND_CHECK_LAYER 1u

struct sched_chunk {
	uint32_t start, n;                 /* the span in the prompt */
	uint32_t n_blocks;                 /* its full blocks */
	uint8_t (*hashes)[KVT_HASH_BYTES]; /* [n_blocks] their chain under the chunk root */
	kvt_tm_prefix *pfx;                /* the lookup, until placed (NULL: none) */
	uint32_t n_found;                  /* leading blocks found and placed */
	bool stored;                       /* the blocks not found were stored (or need not be) */
};
typedef struct sched_chunk sched_chunk;

/*
 * The tenant's chunk root: the parent of the first block of every span marked
 * for chunk reuse, one step from the chain root over a token run no prompt
 * can hold (negative ids), so a chunk chain never meets a prefix chain.
 */
static int chunk_root(kvt_sched *s, const char *tenant, uint8_t root[KVT_HASH_BYTES])
{
	static const int32_t marker[2] = { -0x6b767463 /* "kvtc" */, -1 };
	uint8_t r[KVT_HASH_BYTES];
	int rc = sessions_chain_root(&s->sess, tenant, r);
	return rc ? rc : kvt_hash_block(r, marker, 2, root);
}

/* Let go of the chunk lookups and chains (the handles' pins and T0 references). */
void sched_chunks_free(kvt_sched_handle *h)
{
	for (uint32_t i = 0; h->chunks && i < h->req.n_chunks; i++) {
		kvt_tm_prefix_release(h->s->cfg.tm, h->chunks[i].pfx);
		free(h->chunks[i].hashes);
	}
	free(h->chunks);
	h->chunks = NULL;
	h->blend_at = NO_BLEND;
}

/*
 * Look the marked spans up (admission, not for a preempted request): each
 * span's full blocks hashed under the chunk root, a SERVE handle acquired
 * and waited for at once (NOTE: a span found in T2 is read while the other
 * sequences wait; the spans are short next to a conversation's history).
 * A failure leaves the span unmarked (logged): it is prefilled as text.
 */
void sched_chunks_lookup(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	uint8_t croot[KVT_HASH_BYTES];
	if (!h->req.n_chunks || !s->cfg.tm || !s->cfg.cache || h->preempted)
		return;
	if (chunk_root(s, h->req.tenant, croot) || !(h->chunks = calloc(h->req.n_chunks, sizeof(*h->chunks)))) {
		KVT_LOGW("sched: chunk reuse skipped for a request (no chunk root or no memory)");
		return;
	}
	uint32_t span_tokens = 0;
	for (uint32_t i = 0; i < h->req.n_chunks; i++) {
		sched_chunk *c = &h->chunks[i];
		c->start = h->req.chunks[i].start;
		c->n = h->req.chunks[i].n;
		c->n_blocks = c->n / bt;
		span_tokens += c->n;
		uint32_t got = 0;
		if (!c->n_blocks || !(c->hashes = malloc((size_t)c->n_blocks * KVT_HASH_BYTES)) ||
		    kvt_hash_chain(croot, h->toks + c->start, c->n_blocks * bt, bt, c->hashes, c->n_blocks, &got) ||
		    got != c->n_blocks) {
			c->n_blocks = 0;
			c->stored = true;
			continue;
		}
		const kvt_tm_prefix_req pr = { .use = KVT_TM_PREFIX_SERVE,
					       .hashes = (const uint8_t(*)[KVT_HASH_BYTES])c->hashes,
					       .tokens = h->toks + c->start,
					       .n = c->n_blocks,
					       .root = croot,
					       .refresh = true };
		if (kvt_tm_prefix_acquire(s->cfg.tm, &pr, &c->pfx) == KVT_OK)
			kvt_tm_prefix_wait(s->cfg.tm, c->pfx, NULL, NULL);
		else
			c->pfx = NULL;
	}
	pthread_mutex_lock(&s->mu);
	h->usage.chunk_tokens = span_tokens;
	pthread_mutex_unlock(&s->mu);
}

/*
 * The exact prefix is in the sequence (its first n_tokens): move each span's
 * found blocks to the span's place, turned by its start, and let the lookups
 * go. A span that starts inside the exact prefix is left to it. The first
 * span placed is where the blend starts.
 */
void sched_chunks_place(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	uint64_t found = 0, looked = 0, by_tier[KVT_TM_N_TIERS] = { 0 }, bytes[KVT_TM_N_TIERS] = { 0 };
	for (uint32_t i = 0; h->chunks && i < h->req.n_chunks; i++) {
		sched_chunk *c = &h->chunks[i];
		if (!c->pfx)
			continue;
		if (c->start < h->seq.n_tokens) { /* the exact prefix covers (some of) it: nothing to reuse or store */
			c->stored = true;
			kvt_tm_prefix_release(s->cfg.tm, c->pfx);
			c->pfx = NULL;
			continue;
		}
		looked += (uint64_t)c->n_blocks * bt;
		kvt_tm_prefix_counts pc;
		kvt_seq cs;
		uint32_t k = 0;
		if (kvt_seq_init(&cs, s->cfg.dev, s->cfg.t0, c->n_blocks * bt) == KVT_OK) {
			k = kvt_tm_prefix_take(s->cfg.tm, c->pfx, cs.blocks);
			cs.n_blocks = k;
			cs.n_tokens = k * bt;
			cs.n_synced = 0; /* kvt_model_kv_move brings the device table in step */
			int rc = k ? kvt_model_kv_move(s->cfg.model, &cs, 0, &h->seq, c->start, k * bt, (int32_t)c->start)
				   : KVT_OK;
			if (k && rc != KVT_OK) {
				KVT_LOGW("sched: a found chunk of %u blocks could not be placed (%s): prefilled as text", k,
					 kvt_strerror(rc));
				k = 0;
			}
			kvt_seq_deinit(&cs);
		}
		kvt_tm_prefix_get_counts(s->cfg.tm, c->pfx, &pc);
		for (int t = 0; t < KVT_TM_N_TIERS; t++) {
			by_tier[t] += (uint64_t)pc.blocks_from[t] * bt;
			bytes[t] += pc.bytes_from[t];
		}
		kvt_tm_prefix_release(s->cfg.tm, c->pfx);
		c->pfx = NULL;
		c->n_found = k;
		found += (uint64_t)k * bt;
		if (k && h->blend_at == NO_BLEND)
			h->blend_at = c->start;
	}
	if (h->blend_at != NO_BLEND)
		h->reg_limit = h->blend_at / bt;
	pthread_mutex_lock(&s->mu);
	s->st.chunk_lookup_tokens += looked;
	s->st.chunk_hit_tokens += found;
	for (int t = 0; t < KVT_TM_N_TIERS; t++) {
		s->st.chunk_hits_by_tier[t] += by_tier[t];
		s->st.chunk_bytes_from[t] += bytes[t];
	}
	pthread_mutex_unlock(&s->mu);
}

/*
 * Store the blocks of the spans not found once the sequence holds their
 * K/V: moved to chunk-relative positions into fresh blocks (turned by
 * -start) and registered under the chunk chain as chunk blocks; the manager
 * keeps them like any block (its own T0 reference; T1, T2, T3 as they cool),
 * within the chunk share of each tier (kvt_sched_config.chunk_share;
 * manager.h, "Chunk share").
 */
void sched_chunks_store(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t bt = s->block_tokens;
	uint8_t croot[KVT_HASH_BYTES];
	uint64_t stored = 0;
	for (uint32_t i = 0; h->chunks && i < h->req.n_chunks; i++) {
		sched_chunk *c = &h->chunks[i];
		if (c->stored || c->pfx || c->start + c->n_blocks * bt > h->seq.n_tokens)
			continue;
		c->stored = true;
		const uint32_t from = c->n_found, n = c->n_blocks - from;
		kvt_seq cs;
		if (!n || chunk_root(s, h->req.tenant, croot) ||
		    kvt_seq_init(&cs, s->cfg.dev, s->cfg.t0, c->n_blocks * bt) != KVT_OK)
			continue;
		/* the blocks not found sit at chunk-relative positions from * bt on; cs holds them from its block `from` */
		cs.n_tokens = 0;
		int rc = kvt_model_kv_move(s->cfg.model, &h->seq, c->start + from * bt, &cs, from * bt, n * bt,
					   -(int32_t)c->start);
		if (rc == KVT_OK)
			for (uint32_t j = from; j < c->n_blocks; j++) {
				const uint8_t *parent = j ? c->hashes[j - 1] : croot;
				if ((rc = kvt_tm_register_kind(s->cfg.tm, c->hashes[j], parent, h->toks + c->start + j * bt,
							       cs.blocks[j], KVT_BLOCK_CHUNK)))
					break;
				stored += bt;
			}
		if (rc)
			KVT_LOGW("sched: a chunk's blocks were not stored: %s", kvt_strerror(rc));
		/* no turn's chain names them: they become due for write-through (T2, T3) now, as a turn's blocks do */
		else if (kvt_tm_end_turn_chain(s->cfg.tm, n, (const uint8_t(*)[KVT_HASH_BYTES])c->hashes + from, NULL, NULL))
			KVT_LOGW("sched: a chunk's blocks go to NVMe only when evicted (no memory to mark them due)");
		kvt_seq_deinit(&cs);
	}
	if (stored) {
		pthread_mutex_lock(&s->mu);
		s->st.chunk_stored_tokens += stored;
		pthread_mutex_unlock(&s->mu);
	}
}

/*
 * The blend (the opening comment): the prompt from blend_at to its last token but one,
 * placed rows marked, through kvt_model_forward_blend, alone. The last
 * prompt token then runs in the batch and samples as usual. A failure (no
 * room in T0) falls back to the plain prefill from blend_at: the rows it
 * computes overwrite whatever was placed.
 */
void sched_chunks_blend(kvt_sched *s, kvt_sched_handle *h)
{
	const uint32_t from = h->blend_at, to = h->n_fill - 1, bt = s->block_tokens;
	h->blend_at = NO_BLEND;
	if (to <= from) {
		h->reg_limit = UINT32_MAX;
		return;
	}
	uint8_t *placed = calloc(to - from, 1);
	if (!placed)
		return;
	for (uint32_t i = 0; i < h->req.n_chunks; i++) {
		const sched_chunk *c = &h->chunks[i];
		for (uint32_t p = c->start; c->n_found && p < c->start + c->n_found * bt && p < to; p++)
			if (p >= from)
				placed[p - from] = 1;
	}
	const float r = h->req.chunk_recompute >= 0 ? h->req.chunk_recompute : s->cfg.chunk_recompute;
	const kvt_blend_params bp = { .recompute = r, .check_layer = BLEND_CHECK_LAYER };
	kvt_blend_result res = { 0 };
	const uint32_t need = (to + bt - 1) / bt;
	if (need > h->seq.n_blocks && s->cfg.tm)
		kvt_tm_reserve_t0(s->cfg.tm, need - h->seq.n_blocks);
	double t0 = kvt_now_s();
	int rc = kvt_model_forward_blend(s->cfg.model, &h->seq, h->toks + from, to - from, placed, &bp, NULL, 0, &res);
	double dt = kvt_now_s() - t0;
	free(placed);
	if (rc != KVT_OK) {
		KVT_LOGW("sched: a blended prefill of %u tokens failed (%s): prefilling them plainly", to - from,
			 kvt_strerror(rc));
		h->reg_limit = UINT32_MAX;
		return;
	}
	KVT_LOGD("sched: blend: %u tokens from %u, %u placed, %u of them recomputed (r %.2f), %.1f ms", to - from, from,
		 res.n_placed, res.n_recomputed, r, dt * 1e3);
	pthread_mutex_lock(&s->mu);
	h->usage.chunk_reused_tokens += res.n_placed - res.n_recomputed;
	h->usage.chunk_recomputed_tokens += res.n_recomputed;
	s->st.chunk_reused_tokens += res.n_placed - res.n_recomputed;
	s->st.chunk_recomputed_tokens += res.n_recomputed;
	s->st.chunk_blends++;
	s->st.prefill_tokens += to - from;
	s->st.prefill_s += dt;
	s->st.steps++;
	pthread_mutex_unlock(&s->mu);
	sched_chunks_store(s, h);
}
