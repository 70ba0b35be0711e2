/*
 * tiers/manager.c — the tiering manager (see manager.h for the contract).
 *
 * Concurrency design:
 *  - tm->mu guards the job queue, the busy set, the pending list, flush
 *    generations and the counters. It is never held across I/O, device work
 *    or a kvt_db_wait.
 *  - The busy set names the blocks some thread is moving. Only one blocking
 *    acquisition is ever held at a time (a promotion or a registration holds
 *    exactly one); eviction and persistence only try-acquire and skip busy
 *    blocks, so no thread waits while holding a block another thread waits
 *    for: there is no cycle, hence no deadlock.
 *  - tm->maint_mu serializes maintenance passes (the thread's and
 *    kvt_tm_maintain's): a pass owns the due prefix of the pending list.
 *  - tm->pin_mu makes "pins == 0, so clear the slot" atomic against
 *    kvt_tm_pin / kvt_tm_lookup(KVT_BT_PIN). Lock order: pin_mu, then the
 *    table's own mutex (and the pools' mutexes); tm->mu is never taken with
 *    pin_mu held.
 *  - Each moving thread has a tm_ctx: its own mover (device stream + device
 *    staging) and a pinned host staging buffer. Workers own theirs; the
 *    maintenance thread owns one; calls on the engine's thread
 *    (kvt_tm_reserve_t0) share one under ctx_inline.mu.
 *
 * Slot ownership: for every block the table says is in T0 (T1), the manager
 * holds exactly one reference on that T0 (T1) slot, taken before the table
 * names the slot and dropped only after the table stops naming it. So a slot
 * the table names is never free, and a free slot is never named.
 */
#include "manager.h"
#include "tiers_int.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct tm_ctx {
	kvt_t1_mover *mv;      /* own stream and device staging */
	unsigned char *h_stage;/* [batch][packed_bytes], pinned host */
	pthread_mutex_t mu;    /* only used by the shared inline ctx */
} tm_ctx;

struct kvt_tm_ticket {
	uint32_t n;                       /* blocks */
	uint8_t (*hashes)[KVT_HASH_BYTES];/* [n] copies of the caller's hashes */
	int tier;                         /* target tier */
	bool take_refs;                   /* hand T0 references to the caller */
	bool collected;                   /* the caller took the references */
	int *results;                     /* [n] per block */
	int32_t *slots;                   /* [n] T0 slot (with a reference when take_refs and OK) */
	uint32_t next;                    /* next index a worker claims (tm->mu) */
	uint32_t n_done;                  /* indices finished (tm->mu) */
	kvt_tm_ticket *qnext;             /* job queue link (tm->mu) */
	uint32_t n_local;                 /* indices >= n_local are looked up in T3 (= n: none) */
	uint32_t n_claim;                 /* indices the workers claim (n, or n_local without T3) */
	uint8_t root[KVT_HASH_BYTES];     /* parent of hashes[0] (T3 blocks' chain check) */
	bool *pinned;                     /* [n] a pin taken for the caller on a block from T3, or NULL */
	uint64_t bytes_from[KVT_TM_N_TIERS]; /* bytes read for this ticket, by the tier they came from (tm->mu):
	                                        T2 records, T1 slots unpacked into T0, T3 records */
};

typedef struct tm_remote_q {
	uint8_t hash[KVT_HASH_BYTES]; /* a block to write to T3 */
	double retry_t;               /* not before this (a failed write's retry; 0: now) */
} tm_remote_q;

/* A turn whose durability its owner waits for (kvt_tm_end_turn_chain's done). */
typedef struct tm_turn_wait {
	struct tm_turn_wait *next;         /* list link, oldest first */
	uint32_t n;                        /* blocks in the chain */
	kvt_tm_durable_fn fn;              /* called once */
	void *user;                        /* its argument */
	uint8_t (*chain)[KVT_HASH_BYTES];  /* [n] the chain, in order */
	uint8_t (*sorted)[KVT_HASH_BYTES]; /* [n] the same, sorted (membership tests) */
} tm_turn_wait;

/* Turns waited for at most: past it the oldest is answered with what is durable then (a long full-disk spell). */
#define TM_MAX_TURN_WAITS 1024

typedef struct tm_pending {
	uint8_t hash[KVT_HASH_BYTES]; /* a registered block not yet known durable */
	double due_t;                 /* when it became due for write-through (0: not due) */
} tm_pending;

struct kvt_tm {
	kvt_tm_config cfg;             /* copy (borrowed handles inside) */
	kvt_t1_pool *t1;               /* owned */
	size_t block_bytes;            /* the block in fp16 (the compression baseline) */
	size_t packed_bytes;           /* T1 slot / T2 payload */
	pthread_mutex_t mu;            /* see the file comment */
	pthread_cond_t cv_work;        /* workers: a ticket queued, or stop */
	pthread_cond_t cv_done;        /* ticket progress, busy released, flush progress */
	pthread_cond_t cv_maint;       /* wakes the maintenance thread */
	pthread_mutex_t pin_mu;        /* pins vs eviction */
	pthread_mutex_t maint_mu;      /* one maintenance pass at a time (the thread, kvt_tm_maintain) */
	kvt_event *ev_compute;         /* recorded on the compute stream by kvt_tm_register */
	uint8_t (*busy)[KVT_HASH_BYTES];/* [cap_busy] blocks being moved */
	uint32_t n_busy, cap_busy;     /* entries, capacity */
	kvt_tm_ticket *q_head, *q_tail;/* tickets with unclaimed indices */
	tm_pending *pend;              /* [cap_pend] registered, not yet durable; due ones first */
	uint32_t n_pend, n_due, cap_pend; /* entries, due prefix, capacity */
	uint64_t flush_req, flush_done;/* flush generations */
	tm_turn_wait *waits;           /* turns whose owner waits for their blocks, oldest first (tm->mu) */
	uint32_t n_waits;              /* entries */
	int persist_err;               /* first persistence failure since the last flush began */
	bool maint_kick;               /* work for the maintenance thread */
	bool stop;                     /* threads exit */
	bool t2_full;                  /* the last T2 write found no space */
	double t2_full_t;              /* when */
	bool db_full;                  /* the last row commit was rolled back for lack of space */
	double db_full_t;              /* when */
	bool warned_codec;             /* logged a record of another codec once */
	pthread_t maint;               /* maintenance thread */
	pthread_t *workers;            /* [n_io_threads] */
	uint32_t n_workers;            /* started */
	bool maint_started;            /* maint is running */
	tm_ctx *wctx;                  /* [n_io_threads + 1]: workers, then maintenance */
	tm_ctx ctx_inline;             /* engine-thread calls */
	tm_foreign *foreign;           /* [n_foreign] other namespaces' records, least recently used first (tm->mu) */
	uint32_t n_foreign, next_foreign; /* entries, first not yet reclaimed (tm->mu) */
	kvt_tm_stats st;               /* counters (capacity/used filled by get_stats) */
	tm_retain *rt;                 /* the retention ledger (owned) */
	double sweep_t;                /* last expiry sweep of the ledger (maintenance) */
	/* T3 (cfg.t3): the write queue, its due prefix and the session copies (tm->mu) */
	tm_remote_q *rq;               /* [cap_rq] blocks to write, due ones first */
	uint32_t n_rq, n_rq_due, cap_rq;
	kvt_db_session *rs;            /* [cap_rs] sessions to write (owned copies) */
	uint32_t n_rs, cap_rs;
	bool remote_inflight;          /* the writer holds a batch */
	uint32_t remote_inflight_n;    /* entries in it (blocks, or 1 session) */
	bool warned_remote;            /* logged a T3 record of another codec once */
	pthread_cond_t cv_remote;      /* wakes the remote writer */
	pthread_t rwriter;             /* the remote writer thread */
	bool rwriter_started;
	struct tm_lay *lay;            /* kvt_tm_promote_layered's stream, events and staging; NULL until first use */
	bool lay_active;               /* a layered promotion is in flight (tm->mu) */
	kvt_tm_prefix *lay_owner;      /* the prefix handle whose layered promotion is in flight (tiers/prefix.c;
	                                  the compute-stream thread only) */
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

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

static bool busy_try(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	bool ok = false;
	pthread_mutex_lock(&tm->mu);
	if (busy_find(tm, h) < 0)
		ok = busy_add_locked(tm, h) == KVT_OK;
	pthread_mutex_unlock(&tm->mu);
	return ok;
}

static int busy_wait(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	pthread_mutex_lock(&tm->mu);
	while (busy_find(tm, h) >= 0)
		pthread_cond_wait(&tm->cv_done, &tm->mu);
	int rc = busy_add_locked(tm, h);
	pthread_mutex_unlock(&tm->mu);
	return rc;
}

static void busy_release(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	pthread_mutex_lock(&tm->mu);
	int i = busy_find(tm, h);
	KVT_ASSERT(i >= 0);
	memcpy(tm->busy[i], tm->busy[--tm->n_busy], KVT_HASH_BYTES);
	pthread_cond_broadcast(&tm->cv_done);
	pthread_mutex_unlock(&tm->mu);
}

/* The scale_layout a T2 record of this codec carries (manager.h). */
static uint8_t scale_layout_of(int codec)
{
	switch (codec) {
	case KVT_KV_CODEC_FP8: return KVT_TM_SCALE_LAYOUT_TOKEN_HEAD;
	case KVT_KV_CODEC_INT8: return KVT_TM_SCALE_LAYOUT_TOKEN_HEAD_32;
	}
	return 0;
}

static bool t2_writable(kvt_tm *tm)
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
static int wait_compute(kvt_tm *tm, tm_ctx *c)
{
	pthread_mutex_lock(&tm->mu);
	int rc = kvt_t1_mover_wait_event(c->mv, tm->ev_compute);
	pthread_mutex_unlock(&tm->mu);
	return rc;
}

/*
 * The block left tier: clear the table's slot if the block is (still)
 * unpinned, and drop the manager's reference. Returns true if it left.
 * If the block is then in no tier, it leaves the table when it can (a parent
 * of live children stays as metadata).
 */
static bool leave_tier(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES], int tier, bool *dropped, int *kind)
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
				if (busy_try(tm, cand[i]))
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

/* ------------------------------------------------------------------------ */
/* Persistence: T1/T0 -> T2, then the index row                             */
/* ------------------------------------------------------------------------ */

/*
 * Make n blocks (busy-held by the caller, n <= batch) durable: write their
 * records, put their rows, and once a row commits mark the block clean in
 * the table. ok[i] says whether block i is durable afterwards (true also for
 * a block that already was). Returns the first failure (KVT_EFULL, KVT_EIO)
 * or KVT_OK.
 */
static int persist_held(kvt_tm *tm, tm_ctx *c, uint32_t n, uint8_t (*hashes)[KVT_HASH_BYTES], bool *ok)
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
		m->scale_layout = scale_layout_of(tm->cfg.t1_codec);
		m->raw_bytes = (uint32_t)tm->packed_bytes;
		m->flags = e[i].kind == KVT_BLOCK_CHUNK ? KVT_T2_FLAG_CHUNK : 0; /* rebuild-index and T3 keep the kind */
		req[n_w].meta = m;
		req[n_w].payload = src;
		widx[n_w++] = i;
	}
	if (!n_w)
		goto out;
	if (n_pack) {
		rc = wait_compute(tm, c);
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

/* ------------------------------------------------------------------------ */
/* Eviction                                                                 */
/* ------------------------------------------------------------------------ */

static uint32_t evict_t1(kvt_tm *tm, tm_ctx *c, uint32_t want_free);

/* Delete the rows of n busy-held T2 blocks, then free their extents. */
/* Let each of the n held blocks leave the tier (counted) and release it; how many left. */
static uint32_t leave_all(kvt_tm *tm, uint32_t n, uint8_t (*h)[KVT_HASH_BYTES], int tier)
{
	uint32_t n_left = 0;
	for (uint32_t i = 0; i < n; i++) {
		bool dropped;
		int kind = KVT_BLOCK_PREFIX;
		if (leave_tier(tm, h[i], tier, &dropped, &kind)) {
			count_leave(tm, tier, dropped, kind);
			n_left++;
		}
		busy_release(tm, h[i]);
	}
	return n_left;
}

static uint32_t evict_t2_held(kvt_tm *tm, uint32_t n, uint8_t (*h)[KVT_HASH_BYTES])
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
		uint64_t tk = 0;
		int rc = kvt_db_delete_block(tm->cfg.db, h[i], NULL, NULL, &tk);
		if (rc == KVT_OK)
			rc = kvt_db_wait(tm->cfg.db, tk);
		if (rc == KVT_OK) {
			/* The row is gone: nothing points at the extent any more. */
			kvt_t2_loc l;
			l = old;
			kvt_t2_free(tm->cfg.t2, &l);
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
	uint64_t tk = 0;
	int rc = kvt_db_delete_block_ns(tm->cfg.db, f.ns_id, f.hash, NULL, NULL, &tk);
	if (rc == KVT_OK)
		rc = kvt_db_wait(tm->cfg.db, tk);
	if (rc != KVT_OK) {
		KVT_LOGW("tm: deleting the index row of a namespace-%lld record failed (%s): its T2 extent stays "
			 "allocated", (long long)f.ns_id, kvt_strerror(rc));
		return false;
	}
	kvt_t2_loc l;
	l = f.loc;
	kvt_t2_free(tm->cfg.t2, &l); /* the row is gone: nothing points at the extent */
	pthread_mutex_lock(&tm->mu);
	tm->st.n_reclaimed++;
	tm->t2_full = false;
	pthread_mutex_unlock(&tm->mu);
	return true;
}

/* Free T2 space down to bytes_target used: other namespaces' records first, then our coldest leaves. */
static void remote_demote_held(kvt_tm *tm, tm_ctx *c, uint32_t n, uint8_t (*h)[KVT_HASH_BYTES], int leaving_tier);

static void evict_t2(kvt_tm *tm, tm_ctx *c, uint64_t bytes_target)
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
		remote_demote_held(tm, c, n, h, KVT_TIER_NVME);
		uint32_t gone = evict_t2_held(tm, n, h);
		for (uint32_t i = 0; i < n; i++)
			busy_release(tm, h[i]);
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
static uint32_t evict_t1(kvt_tm *tm, tm_ctx *c, uint32_t want_free)
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
		remote_demote_held(tm, c, n, h, KVT_TIER_HOST);
		if (n_dirty && t2_writable(tm))
			(void)persist_held(tm, c, n_dirty, dirty, ok);
		if (!leave_all(tm, n, h, KVT_TIER_HOST))
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
static uint32_t evict_t0(kvt_tm *tm, tm_ctx *c, uint32_t want_free, bool *saw_busy)
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
				evict_t1(tm, c, 1);
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
		remote_demote_held(tm, c, n_direct, direct, KVT_TIER_HBM); /* ON_DEMOTE, when T2 will not take them */
		if (n_direct && t2_writable(tm))
			(void)persist_held(tm, c, n_direct, direct, ok);
		if (n_copy) {
			double t0 = kvt_now_s();
			int rc = wait_compute(tm, c);
			if (rc == KVT_OK)
				rc = kvt_t1_mover_pack(c->mv, n_copy, src, hp);
			for (uint32_t k = 0; k < n_copy; k++) {
				if (rc == KVT_OK && kvt_btable_set_slot(tm->cfg.bt, h[idx[k]], KVT_TIER_HOST, dst[k]) == KVT_OK)
					continue;
				kvt_t1_unref(tm->t1, dst[k]);
			}
			if (rc != KVT_OK) {
				for (uint32_t i = 0; i < n; i++)
					busy_release(tm, h[i]);
				break; /* the device failed: logged by the op; keep T0 as it is */
			}
			pthread_mutex_lock(&tm->mu);
			tm->st.tier[KVT_TIER_HBM].n_demotions += n_copy;
			tm->st.tier[KVT_TIER_HBM].demotion_bytes += n_copy * tm->packed_bytes;
			tm->st.tier[KVT_TIER_HBM].demotion_s += kvt_now_s() - t0;
			pthread_mutex_unlock(&tm->mu);
		}
		if (!leave_all(tm, n, h, KVT_TIER_HBM))
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

/* ------------------------------------------------------------------------ */
/* Promotion                                                                */
/* ------------------------------------------------------------------------ */

static void count_lookup(kvt_tm *tm, int found_tier)
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
	uint64_t tk = 0;
	rc = kvt_db_delete_block(tm->cfg.db, h, NULL, NULL, &tk);
	if (rc == KVT_OK)
		rc = kvt_db_wait(tm->cfg.db, tk);
	if (rc == KVT_OK) {
		kvt_t2_loc l;
		l = old;
		kvt_t2_free(tm->cfg.t2, &l); /* stays quarantined in the store */
	}
	pthread_mutex_lock(&tm->mu);
	tm->st.tier[KVT_TIER_NVME].n_corrupt++;
	pthread_mutex_unlock(&tm->mu);
}

/*
 * Bring one block to tier (HBM or HOST). With take_ref, *t0_slot gets a T0
 * slot with a caller reference. The block is busy-held for the whole move.
 * bytes_from (may be NULL; updated under tm->mu) gets the bytes read for it
 * by the tier they came from: a T2 record's extent, a T1 slot unpacked into
 * T0 (a block read from T2 and unpacked counts as T2 only).
 */
static int promote_one(kvt_tm *tm, tm_ctx *c, const uint8_t h[KVT_HASH_BYTES], int tier, bool take_ref,
		       int32_t *t0_slot, uint64_t *bytes_from)
{
	kvt_btable_entry e;
	int rc = busy_wait(tm, h);
	if (rc)
		return rc;
	*t0_slot = -1;
	if (kvt_btable_get(tm->cfg.bt, h, &e) != KVT_OK) {
		count_lookup(tm, -1);
		rc = KVT_ENOTFOUND;
		goto done;
	}
	int found = e.slot[KVT_TIER_HBM] >= 0 ? KVT_TIER_HBM
		  : e.slot[KVT_TIER_HOST] >= 0 ? KVT_TIER_HOST
		  : e.slot[KVT_TIER_NVME] >= 0 ? KVT_TIER_NVME : -1;
	count_lookup(tm, found);
	if (found < 0) {
		rc = KVT_ENOTFOUND;
		goto done;
	}
	if (found <= tier)
		goto reached;
	int32_t s0 = -1;
	if (tier == KVT_TIER_HBM && kvt_t0_alloc(tm->cfg.t0, &s0) != KVT_OK) {
		/* T0 room first: evicting may write through the staging buffer, which may hold the bytes below */
		evict_t0(tm, c, 1, NULL);
		if (kvt_t0_alloc(tm->cfg.t0, &s0) != KVT_OK) {
			rc = KVT_EFULL;
			goto done;
		}
	}

	/* The packed bytes: the T1 slot, or read from T2 into a new T1 slot (or the staging buffer). */
	const void *packed;
	int32_t t1s = e.slot[KVT_TIER_HOST];
	if (t1s >= 0) {
		packed = kvt_t1_slot_ptr(tm->t1, t1s);
	} else {
		void *buf;
		if (kvt_t1_alloc(tm->t1, &t1s) != KVT_OK) {
			evict_t1(tm, c, 1);
			if (kvt_t1_alloc(tm->t1, &t1s) != KVT_OK)
				t1s = -1;
		}
		buf = t1s >= 0 ? kvt_t1_slot_ptr(tm->t1, t1s) : (void *)c->h_stage;
		kvt_t2_loc l;
		kvt_t2_block_meta m;
		l = e.nvme;
		double t_start = kvt_now_s();
		rc = kvt_t2_read(tm->cfg.t2, &l, h, &m, buf, tm->packed_bytes);
		/* NOTE: the scale layout must match as well as the codec and size: an INT8
		 * record of layout 1 may have exactly our size (head_dim 32) and would
		 * decode to wrong values without an error. */
		if (rc == KVT_OK && (m.codec != tm->cfg.t1_codec || m.scale_layout != scale_layout_of(tm->cfg.t1_codec) ||
				     m.raw_bytes != tm->packed_bytes || m.n_tokens != e.n_tokens ||
				     memcmp(m.tokens, e.tokens, e.n_tokens * sizeof(int32_t)))) {
			pthread_mutex_lock(&tm->mu);
			bool warn = !tm->warned_codec;
			tm->warned_codec = true;
			pthread_mutex_unlock(&tm->mu);
			if (warn)
				KVT_LOGW("tm: a T2 record holds codec %s, scale layout %u, %u bytes; this manager runs %s, "
					 "scale layout %u, %zu bytes: such records are misses", kvt_kv_codec_name(m.codec),
					 (unsigned)m.scale_layout, m.raw_bytes, kvt_kv_codec_name(tm->cfg.t1_codec),
					 (unsigned)scale_layout_of(tm->cfg.t1_codec), tm->packed_bytes);
			rc = KVT_ENOTFOUND;
		} else if (rc == KVT_ECORRUPT) {
			drop_corrupt(tm, h);
		} else if (rc == KVT_EFULL) {
			rc = KVT_ENOTFOUND; /* a record larger than our slots: not ours */
		}
		if (rc != KVT_OK) {
			if (t1s >= 0)
				kvt_t1_unref(tm->t1, t1s);
			goto fail;
		}
		if (t1s >= 0 && kvt_btable_set_slot(tm->cfg.bt, h, KVT_TIER_HOST, t1s) != KVT_OK) {
			kvt_t1_unref(tm->t1, t1s);
			t1s = -1;
		}
		pthread_mutex_lock(&tm->mu);
		if (t1s >= 0)
			tm->st.tier[KVT_TIER_HOST].n_promotions++;
		tm->st.tier[KVT_TIER_HOST].promotion_bytes += e.nvme.extent_bytes;
		tm->st.tier[KVT_TIER_HOST].promotion_s += kvt_now_s() - t_start;
		if (bytes_from)
			bytes_from[KVT_TIER_NVME] += e.nvme.extent_bytes;
		pthread_mutex_unlock(&tm->mu);
		packed = buf;
		if (tier == KVT_TIER_HOST && t1s < 0) {
			rc = KVT_EFULL; /* read and verified, but no T1 room to keep it */
			goto done;
		}
	}
	if (tier == KVT_TIER_HBM) {
		int32_t s = s0;
		s0 = -1; /* from here on, owned by the code below */
		double t_start = kvt_now_s();
		rc = kvt_t1_mover_unpack(c->mv, 1, &packed, &s);
		if (rc == KVT_OK)
			rc = kvt_btable_set_t0_unpacked(tm->cfg.bt, h, s, tm->cfg.t1_codec != KVT_KV_CODEC_F16);
		if (rc != KVT_OK) {
			kvt_t0_unref(tm->cfg.t0, s);
			goto done;
		}
		pthread_mutex_lock(&tm->mu);
		tm->st.tier[KVT_TIER_HBM].n_promotions++;
		tm->st.tier[KVT_TIER_HBM].promotion_bytes += tm->packed_bytes;
		tm->st.tier[KVT_TIER_HBM].promotion_s += kvt_now_s() - t_start;
		if (bytes_from && found == KVT_TIER_HOST)
			bytes_from[KVT_TIER_HOST] += tm->packed_bytes;
		pthread_mutex_unlock(&tm->mu);
		e.slot[KVT_TIER_HBM] = s;
	}
reached:
	if (take_ref && tier == KVT_TIER_HBM) {
		/* Busy-held: the slot cannot leave the table (nor be freed) before the ref is taken. */
		kvt_t0_ref(tm->cfg.t0, e.slot[KVT_TIER_HBM]);
		*t0_slot = e.slot[KVT_TIER_HBM];
	}
	(void)kvt_btable_touch(tm->cfg.bt, h);
	/* A hit on a durable block refreshes its row (queued, group-committed, not
	 * waited for), so the LRU order survives a restart (kvt_tm_recover). */
	if (tm->cfg.db && e.slot[KVT_TIER_NVME] >= 0) {
		kvt_btable_entry now;
		if (kvt_btable_get(tm->cfg.bt, h, &now) == KVT_OK)
			(void)kvt_db_touch_block(tm->cfg.db, h, kvt_wall_us(), now.hits, NULL, NULL, NULL);
	}
	rc = KVT_OK;
	goto done;
fail:
	if (s0 >= 0)
		kvt_t0_unref(tm->cfg.t0, s0);
done:
	busy_release(tm, h);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* T3, the remote tier (tiers/t3_remote.h)                                  */
/* ------------------------------------------------------------------------ */

/*
 * Reads: a ticket's indices [n_local, n) name blocks the table did not know
 * at submit time (kvt_tm_submit_remote). The first worker to reach them takes
 * them all and looks them up in T3 in one round (pipelined per node); the
 * run found from the first (verified: checksum, model, hash, tokens hashing
 * to it, the parent the chain expects, our codec) enters the table clean (T3
 * holds it: dropping the local copy loses nothing) with a T1 slot holding
 * the bytes, pinned for the caller when it takes references, and goes on to
 * T0 through promote_one. Anything else is a miss.
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
	const void **pay = malloc((size_t)n * sizeof(*pay));
	uint32_t *idx = malloc((size_t)n * sizeof(*idx));
	int *r = malloc((size_t)n * sizeof(*r));
	uint32_t n_w = 0, n_ok = 0;
	KVT_ASSERT(n <= tm->cfg.batch_blocks);
	for (uint32_t i = 0; i < n; i++)
		res[i] = KVT_ENOTFOUND;
	if (!e || !meta || !pay || !idx || !r) {
		for (uint32_t i = 0; i < n; i++)
			res[i] = KVT_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (kvt_btable_get(tm->cfg.bt, h[i], e) != KVT_OK)
			continue; /* gone */
		void *dst = c->h_stage + (size_t)n_w * tm->packed_bytes;
		int rc = KVT_ENOTFOUND;
		if (e->slot[KVT_TIER_HOST] >= 0) {
			memcpy(dst, kvt_t1_slot_ptr(tm->t1, e->slot[KVT_TIER_HOST]), tm->packed_bytes);
			rc = KVT_OK;
		} else if (e->slot[KVT_TIER_HBM] >= 0) {
			int32_t s = e->slot[KVT_TIER_HBM];
			rc = wait_compute(tm, c);
			if (rc == KVT_OK)
				rc = kvt_t1_mover_pack(c->mv, 1, &s, &dst);
		} else if (e->slot[KVT_TIER_NVME] >= 0 && tm->cfg.t2) {
			kvt_t2_loc l;
			l = e->nvme;
			rc = kvt_t2_read(tm->cfg.t2, &l, h[i], NULL, dst, tm->packed_bytes);
		}
		if (rc != KVT_OK) {
			res[i] = rc;
			continue;
		}
		kvt_t2_block_meta *m = &meta[n_w];
		memset(m, 0, sizeof(*m));
		memcpy(m->hash, e->hash, KVT_HASH_BYTES);
		memcpy(m->parent, e->parent, KVT_HASH_BYTES);
		m->n_tokens = e->n_tokens;
		memcpy(m->tokens, e->tokens, e->n_tokens * sizeof(int32_t));
		m->kv_dtype = KVT_DTYPE_F16;
		m->codec = (uint8_t)tm->cfg.t1_codec;
		m->scale_layout = scale_layout_of(tm->cfg.t1_codec);
		m->raw_bytes = (uint32_t)tm->packed_bytes;
		m->flags = e->kind == KVT_BLOCK_CHUNK ? KVT_T2_FLAG_CHUNK : 0;
		pay[n_w] = dst;
		idx[n_w++] = i;
	}
	if (n_w && kvt_t3_put_blocks(tm->cfg.t3, n_w, meta, pay, r) != KVT_OK)
		for (uint32_t j = 0; j < n_w; j++)
			r[j] = KVT_ENOMEM;
	for (uint32_t j = 0; j < n_w; j++) {
		res[idx[j]] = r[j];
		n_ok += r[j] == KVT_OK;
	}
out:
	free(e);
	free(meta);
	free(pay);
	free(idx);
	free(r);
	return n_ok;
}

/* ON_DEMOTE: the n busy-held blocks that are about to leave the last local tier holding them go to T3 first. */
static void remote_demote_held(kvt_tm *tm, tm_ctx *c, uint32_t n, uint8_t (*h)[KVT_HASH_BYTES], int leaving_tier)
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
			if (leaving_tier != KVT_TIER_NVME && e->dirty && t2_writable(tm))
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
static void remote_queue_locked(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
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

static void *remote_main(void *arg)
{
	kvt_tm *tm = arg;
	tm_ctx *c = &tm->wctx[tm->cfg.n_io_threads + 1];
	const uint32_t B = tm->cfg.batch_blocks;
	uint8_t (*h)[KVT_HASH_BYTES] = malloc(B * sizeof(*h)), (*hb)[KVT_HASH_BYTES] = malloc(B * sizeof(*hb));
	int *res = malloc(B * sizeof(*res));
	if (!h || !hb || !res) {
		free(h);
		free(hb);
		free(res);
		return NULL;
	}
	pthread_mutex_lock(&tm->mu);
	for (;;) {
		double now = kvt_now_s();
		/* due entries ready now (a failed batch waits for its retry time) */
		bool ready = tm->n_rs > 0 || (tm->n_rq_due > 0 && tm->rq[0].retry_t <= now);
		if (!ready) {
			if (tm->stop)
				break;
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			long ns = ts.tv_nsec + 100L * 1000 * 1000;
			ts.tv_sec += ns / 1000000000L;
			ts.tv_nsec = ns % 1000000000L;
			pthread_cond_timedwait(&tm->cv_remote, &tm->mu, &ts);
			continue;
		}
		/* sessions first: they are small, and a resume elsewhere starts from them */
		if (tm->n_rs) {
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
			continue;
		}
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
		pthread_mutex_unlock(&tm->mu);
		/* Take what no other thread is moving; the rest goes back to the queue for a moment. */
		uint32_t n_got = 0, n_busy = 0;
		for (uint32_t i = 0; i < n; i++) {
			if (busy_try(tm, h[i]))
				memmove(h[n_got++], h[i], KVT_HASH_BYTES);
			else
				memcpy(hb[n_busy++], h[i], KVT_HASH_BYTES);
		}
		uint32_t n_ok = n_got ? remote_put_held(tm, c, n_got, h, res) : 0;
		for (uint32_t i = 0; i < n_got; i++)
			busy_release(tm, h[i]);
		pthread_mutex_lock(&tm->mu);
		tm->remote_inflight = false;
		tm->remote_inflight_n = 0;
		tm->st.remote.n_demotions += n_ok;
		/* no server (or busy): back to the front of the due queue, for a retry */
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
		pthread_cond_broadcast(&tm->cv_done);
	}
	pthread_mutex_unlock(&tm->mu);
	free(h);
	free(hb);
	free(res);
	return NULL;
}

/*
 * Look up the ticket's blocks [lo, n) in T3 and bring the run found to the
 * ticket's tier (see the section comment). Fills results/slots/pinned.
 */
static void remote_fetch(kvt_tm *tm, tm_ctx *c, kvt_tm_ticket *t, uint32_t lo)
{
	const uint32_t m = t->n - lo;
	kvt_t2_block_meta *meta = malloc((size_t)m * sizeof(*meta));
	uint8_t *buf = malloc((size_t)m * tm->packed_bytes);
	void **pay = malloc((size_t)m * sizeof(*pay));
	int *res = malloc((size_t)m * sizeof(*res));
	kvt_btable_entry *e = malloc(sizeof(*e));
	double t_start = kvt_now_s();
	uint32_t n_hit = 0;
	for (uint32_t j = 0; j < m; j++)
		t->results[lo + j] = KVT_ENOTFOUND;
	if (!meta || !buf || !pay || !res || !e)
		goto out;
	for (uint32_t j = 0; j < m; j++)
		pay[j] = buf + (size_t)j * tm->packed_bytes;
	if (kvt_t3_get_blocks(tm->cfg.t3, m, (const uint8_t(*)[KVT_HASH_BYTES])t->hashes + lo, true, meta, pay,
			      tm->packed_bytes, res) != KVT_OK)
		goto out;
	for (uint32_t j = 0; j < m; j++) {
		const uint8_t *h = t->hashes[lo + j];
		const uint8_t *parent = lo + j ? t->hashes[lo + j - 1] : t->root;
		if (res[j] != KVT_OK)
			break;
		if (meta[j].codec != tm->cfg.t1_codec || meta[j].scale_layout != scale_layout_of(tm->cfg.t1_codec) ||
		    meta[j].raw_bytes != tm->packed_bytes || meta[j].n_tokens != kvt_btable_block_tokens(tm->cfg.bt) ||
		    memcmp(meta[j].parent, parent, KVT_HASH_BYTES)) {
			pthread_mutex_lock(&tm->mu);
			bool warn = !tm->warned_remote;
			tm->warned_remote = true;
			pthread_mutex_unlock(&tm->mu);
			if (warn)
				KVT_LOGW("tm: a T3 record holds codec %s, scale layout %u, %u bytes, %u tokens (or another "
					 "parent); this node runs %s, %zu bytes: such records are misses (nodes sharing T3 "
					 "must share model, block_tokens and [tier.host] dtype)",
					 kvt_kv_codec_name(meta[j].codec), (unsigned)meta[j].scale_layout, meta[j].raw_bytes,
					 meta[j].n_tokens, kvt_kv_codec_name(tm->cfg.t1_codec), tm->packed_bytes);
			break;
		}
		/* Enter it (a concurrent registration may have been first: then ours is a spare copy), of the
		 * kind its record says, before it enters a tier. */
		if (busy_wait(tm, h) != KVT_OK)
			break;
		bool created = false, ok = false;
		const int kind = meta[j].flags & KVT_T2_FLAG_CHUNK ? KVT_BLOCK_CHUNK : KVT_BLOCK_PREFIX;
		if (kvt_btable_insert(tm->cfg.bt, h, parent, meta[j].tokens, &created) == KVT_OK &&
		    (!created || kvt_btable_set_kind(tm->cfg.bt, h, kind) == KVT_OK) &&
		    kvt_btable_get(tm->cfg.bt, h, e) == KVT_OK) {
			ok = e->slot[KVT_TIER_HBM] >= 0 || e->slot[KVT_TIER_HOST] >= 0 || e->slot[KVT_TIER_NVME] >= 0;
			if (!ok) {
				int32_t s1;
				if (kvt_t1_alloc(tm->t1, &s1) != KVT_OK) {
					evict_t1(tm, c, 1);
					if (kvt_t1_alloc(tm->t1, &s1) != KVT_OK)
						s1 = -1;
				}
				if (s1 >= 0) {
					memcpy(kvt_t1_slot_ptr(tm->t1, s1), pay[j], tm->packed_bytes);
					if (kvt_btable_set_slot(tm->cfg.bt, h, KVT_TIER_HOST, s1) == KVT_OK) {
						ok = true;
						if (created)
							(void)kvt_btable_set_dirty(tm->cfg.bt, h, false); /* T3 holds it */
					} else {
						kvt_t1_unref(tm->t1, s1);
					}
				}
			}
			if (ok && t->take_refs && kvt_tm_pin(tm, h) == KVT_OK)
				t->pinned[lo + j] = true;
			if (!ok && created)
				(void)kvt_btable_remove(tm->cfg.bt, h);
		}
		busy_release(tm, h);
		if (!ok)
			break;
		n_hit++;
		int32_t slot = -1;
		/* promote_one counts a local hit in T1: the lookup that mattered was T3's, counted below */
		int rc = promote_one(tm, c, h, t->tier, t->take_refs, &slot, NULL); /* its bytes are T3's (below) */
		t->results[lo + j] = rc;
		t->slots[lo + j] = slot;
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
	free(e);
}

/* ------------------------------------------------------------------------ */
/* Threads                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct tm_worker_arg {
	kvt_tm *tm;
	tm_ctx *ctx;
} tm_worker_arg;

static void *worker_main(void *arg)
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
			int rc = promote_one(tm, c, t->hashes[i], t->tier, t->take_refs, &slot, bytes);
			pthread_mutex_lock(&tm->mu);
			for (int b = 0; b < KVT_TM_N_TIERS; b++)
				t->bytes_from[b] += bytes[b];
			t->results[i] = rc;
			t->slots[i] = slot;
		} else {
			remote_fetch(tm, c, t, i);
			pthread_mutex_lock(&tm->mu);
		}
		t->n_done += k;
		pthread_cond_broadcast(&tm->cv_done);
	}
	pthread_mutex_unlock(&tm->mu);
	return NULL;
}

/* The block is still dirty and has bytes to write (in T0 or T1). */
static bool still_dirty(kvt_tm *tm, const uint8_t h[KVT_HASH_BYTES])
{
	kvt_btable_entry e;
	return kvt_btable_get(tm->cfg.bt, h, &e) == KVT_OK && e.dirty && e.slot[KVT_TIER_NVME] < 0 &&
	       (e.slot[KVT_TIER_HBM] >= 0 || e.slot[KVT_TIER_HOST] >= 0);
}

/* Write the due prefix of the pending list through to T2, in batches. */
static void persist_due(kvt_tm *tm, tm_ctx *c)
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
			held[i] = busy_try(tm, h[i]);
			if (held[i])
				memcpy(hh[n_held++], h[i], KVT_HASH_BYTES);
		}
		int rc = KVT_OK;
		bool *okh = ok;
		if (!t2_writable(tm)) {
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
			rc = persist_held(tm, c, n_held, hh, okh);
		}
		for (uint32_t i = 0; i < n_held; i++)
			busy_release(tm, hh[i]);
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

static void maintain_locked(kvt_tm *tm, tm_ctx *c);

static int hash_cmp(const void *a, const void *b) { return memcmp(a, b, KVT_HASH_BYTES); }

/* Leading blocks of a chain whose bytes are durable in T2 with their row committed. */
static uint32_t durable_prefix(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES])
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
		if (bsearch(tm->pend[i].hash, w->sorted, w->n, KVT_HASH_BYTES, hash_cmp))
			return true;
	return false;
}

/*
 * Answer the turns none of whose blocks waits for write-through any more
 * (every turn when all: shutdown), and the oldest past TM_MAX_TURN_WAITS,
 * each with its chain's durable prefix then. The callbacks run here, outside
 * tm->mu.
 */
static void turn_waits_answer(kvt_tm *tm, bool all)
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
		      durable_prefix(tm, w->n, (const uint8_t(*)[KVT_HASH_BYTES])w->chain));
		free(w->chain);
		free(w->sorted);
		free(w);
	}
}

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
		persist_due(tm, c);
	bool writable = t2_writable(tm);
	pthread_mutex_lock(&tm->mu);
	if (tm->flush_done < flush_target && (tm->n_due == 0 || !writable)) {
		tm->flush_done = flush_target;
		pthread_cond_broadcast(&tm->cv_done);
	}
	/* WRITE_BACK keeps every registered block on the list: drop those no longer dirty now and then. */
	uint32_t n_pend = tm->n_pend;
	pthread_mutex_unlock(&tm->mu);
	turn_waits_answer(tm, false);
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
		evict_t0(tm, c, n0 - (uint32_t)(tm->cfg.low[KVT_TIER_HBM] * n0), NULL);
	uint32_t n1 = kvt_t1_n_slots(tm->t1), used1 = n1 - kvt_t1_n_free(tm->t1);
	if (used1 > tm->cfg.high[KVT_TIER_HOST] * n1)
		evict_t1(tm, c, n1 - (uint32_t)(tm->cfg.low[KVT_TIER_HOST] * n1));
	if (tm->cfg.t2) {
		kvt_t2_stats s;
		kvt_t2_get_stats(tm->cfg.t2, &s);
		if (s.used_bytes > tm->cfg.high[KVT_TIER_NVME] * (double)s.capacity_bytes)
			evict_t2(tm, c, (uint64_t)(tm->cfg.low[KVT_TIER_NVME] * (double)s.capacity_bytes));
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

static void kick(kvt_tm *tm)
{
	pthread_mutex_lock(&tm->mu);
	tm->maint_kick = true;
	pthread_cond_signal(&tm->cv_maint);
	pthread_mutex_unlock(&tm->mu);
}

/* ------------------------------------------------------------------------ */
/* Public API                                                               */
/* ------------------------------------------------------------------------ */

void kvt_tm_config_default(kvt_tm_config *c)
{
	memset(c, 0, sizeof(*c));
	c->t1_slots = 256;
	c->t1_codec = KVT_KV_CODEC_FP8;
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
	int rc = kvt_t1_mover_create(tm->cfg.dev, tm->cfg.t0, tm->cfg.t1_codec, tm->cfg.batch_blocks, &c->mv);
	if (rc == KVT_OK)
		rc = kvt_dev_host_alloc(tm->cfg.dev, tm->packed_bytes * tm->cfg.batch_blocks, (void **)&c->h_stage);
	pthread_mutex_init(&c->mu, NULL);
	return rc;
}

static void ctx_deinit(kvt_tm *tm, tm_ctx *c)
{
	kvt_t1_mover_destroy(c->mv);
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
		KVT_LOGE("tm config: t1_codec %d is not f16, fp8 or int8", c->t1_codec);
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
	tm->block_bytes = kvt_kv_packed_bytes(kvt_t0_layout(cfg->t0), KVT_KV_CODEC_F16);
	tm->packed_bytes = kvt_kv_packed_bytes(kvt_t0_layout(cfg->t0), cfg->t1_codec);
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
		rc = tm_retain_create(&rc_cfg, &tm->rt);
	}
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
		if (pthread_create(&tm->workers[i], NULL, worker_main, a)) {
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
		if (pthread_create(&tm->rwriter, NULL, remote_main, tm)) {
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

static void lay_destroy(kvt_tm *tm); /* the layered promotion's resources (at the end of this file) */

/* Release every T0/T1 slot the manager holds (shutdown). */
static void release_tier(kvt_tm *tm, int tier)
{
	uint8_t h[64][KVT_HASH_BYTES];
	uint32_t n;
	while (kvt_btable_coldest(tm->cfg.bt, tier, 64, h, &n) == KVT_OK && n) {
		uint32_t n_left = 0;
		for (uint32_t i = 0; i < n; i++) {
			bool dropped;
			int kind;
			n_left += leave_tier(tm, h[i], tier, &dropped, &kind);
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
	turn_waits_answer(tm, true);
	if (tm->t1) {
		release_tier(tm, KVT_TIER_HBM);
		release_tier(tm, KVT_TIER_HOST);
	}
	if (tm->wctx)
		for (uint32_t i = 0; i <= tm->cfg.n_io_threads + 1; i++)
			if (tm->wctx[i].mv || tm->wctx[i].h_stage)
				ctx_deinit(tm, &tm->wctx[i]);
	if (tm->ctx_inline.mv || tm->ctx_inline.h_stage)
		ctx_deinit(tm, &tm->ctx_inline);
	kvt_dev_event_destroy(tm->cfg.dev, tm->ev_compute);
	lay_destroy(tm);
	kvt_t1_destroy(tm->t1);
	tm_retain_destroy(tm->rt);
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
	int rc = busy_wait(tm, hash);
	if (rc)
		return rc;
	rc = kvt_btable_insert(tm->cfg.bt, hash, parent, tokens, &created);
	/* The kind before the T0 slot: the block is counted in its kind's share from the start. A known block
	 * takes the kind it is registered with (one that came from T3, or a rebuilt index, came as a prefix). */
	if (rc == KVT_OK)
		rc = kvt_btable_set_kind(tm->cfg.bt, hash, kind);
	if (rc) {
		busy_release(tm, hash);
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
		if (tm->n_pend == tm->cap_pend) {
			uint32_t cap = tm->cap_pend ? 2 * tm->cap_pend : 256;
			void *p = realloc(tm->pend, cap * sizeof(*tm->pend));
			if (p) {
				tm->pend = p;
				tm->cap_pend = cap;
			}
		}
		if (tm->n_pend < tm->cap_pend) {
			memcpy(tm->pend[tm->n_pend].hash, hash, KVT_HASH_BYTES);
			tm->pend[tm->n_pend].due_t = 0;
			tm->n_pend++;
		} else {
			rc = KVT_ENOMEM;
		}
		tm->st.n_registered += created;
		if (created && tm->cfg.t3 && kvt_t3_write_policy(tm->cfg.t3) == KVT_T3_WRITE_THROUGH)
			remote_queue_locked(tm, hash);
		pthread_mutex_unlock(&tm->mu);
	}
	busy_release(tm, hash);
	/* T0 use may have crossed the high watermark. */
	uint32_t n0 = kvt_t0_n_slots(tm->cfg.t0);
	if (n0 - kvt_t0_n_free(tm->cfg.t0) > tm->cfg.high[KVT_TIER_HBM] * n0)
		kick(tm);
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
		count_lookup(tm, -1); /* the first full block past the cached prefix */
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
		count_lookup(tm, -1); /* the first full block past the cached prefix */
	*n_matched = nm;
	return KVT_OK;
}

int kvt_tm_submit(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int tier, bool take_refs,
		  kvt_tm_ticket **out)
{
	return kvt_tm_submit_remote(tm, n, hashes, n, NULL, tier, take_refs, out);
}

bool kvt_tm_has_remote(const kvt_tm *tm) { return tm->cfg.t3 != NULL; }

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

kvt_tm_prefix **tm_lay_owner(kvt_tm *tm) { return &tm->lay_owner; }
size_t tm_packed_bytes(const kvt_tm *tm) { return tm->packed_bytes; }
kvt_t0_pool *tm_t0(kvt_tm *tm) { return tm->cfg.t0; }
kvt_btable *tm_bt(kvt_tm *tm) { return tm->cfg.bt; }
bool tm_lossy(const kvt_tm *tm) { return tm->cfg.t1_codec != KVT_KV_CODEC_F16; }

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

int kvt_tm_reserve_t0(kvt_tm *tm, uint32_t n_free)
{
	if (kvt_t0_n_free(tm->cfg.t0) >= n_free)
		return KVT_OK;
	/* A T0 block another thread is moving is skipped by eviction; that is transient, so retry for those. */
	const double deadline = kvt_now_s() + 2.0;
	for (;;) {
		bool saw_busy = false;
		pthread_mutex_lock(&tm->ctx_inline.mu);
		uint32_t got = evict_t0(tm, &tm->ctx_inline, n_free, &saw_busy);
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
		if (!bsearch(a + (size_t)i * elem, hs, n_hs, KVT_HASH_BYTES, hash_cmp))
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
	return durable_prefix(tm, n, hashes);
}

int kvt_tm_end_turn_chain(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], kvt_tm_durable_fn done,
			  void *user)
{
	const bool eot = tm->cfg.persist == KVT_PERSIST_END_OF_TURN && tm->cfg.t2;
	if (!n || (!tm->cfg.t3 && !eot)) {
		if (done) /* nothing is written through for it: what is durable now is all it gets */
			done(user, KVT_OK, durable_prefix(tm, n, hashes));
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
	qsort(hs, n, KVT_HASH_BYTES, hash_cmp);
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
		done(user, KVT_OK, durable_prefix(tm, n, hashes));
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

void kvt_tm_maintain(kvt_tm *tm)
{
	pthread_mutex_lock(&tm->ctx_inline.mu);
	maintain(tm, &tm->ctx_inline);
	pthread_mutex_unlock(&tm->ctx_inline.mu);
}

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
}

/* ------------------------------------------------------------------------ */
/* Retention (the ledger is tiers/retain.c)                                 */
/* ------------------------------------------------------------------------ */

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
		kick(tm); /* what was kept over the watermark may go now */
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

/* ------------------------------------------------------------------------ */
/* Layer-wise promotion from T1 (manager.h, kvt_tm_promote_layered)         */
/* ------------------------------------------------------------------------ */

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

static void lay_destroy(kvt_tm *tm)
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
	lay_destroy(tm);
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
	const size_t scales_per_layer = vec_per_layer * (l->head_dim / kvt_kv_group_dims(codec, l->head_dim)) * sizeof(float);
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

/* Free the promotion's arrays and itself, and let the next layered promotion start. */
static void lay_free(kvt_tm *tm, kvt_tm_layered *p)
{
	pthread_mutex_lock(&tm->mu);
	tm->lay_active = false;
	pthread_mutex_unlock(&tm->mu);
	free(p->hashes);
	free(p->t0);
	free(p->t1);
	free(p->units);
	free(p->src);
	free(p->found);
	free(p->order);
	free(p);
}

/* Give back what the promotion holds: the caller's slots (when drop_t0), our T1 references, the blocks. */
static void lay_release(kvt_tm *tm, kvt_tm_layered *p, uint32_t n_held, bool drop_t0)
{
	for (uint32_t i = 0; i < n_held; i++) {
		if (drop_t0 && p->t0[i] >= 0)
			kvt_t0_unref(tm->cfg.t0, p->t0[i]);
		if (p->t1[i] >= 0)
			kvt_t1_unref(tm->t1, p->t1[i]);
		busy_release(tm, p->hashes[i]);
	}
	lay_free(tm, p);
}

int kvt_tm_promote_layered(kvt_tm *tm, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], uint32_t n_groups,
			   int32_t *t0_slots, kvt_tm_layered **out)
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
	pthread_mutex_lock(&tm->mu);
	bool busy = tm->lay_active;
	tm->lay_active = true;
	pthread_mutex_unlock(&tm->mu);
	if (busy)
		return KVT_EBUSY;
	kvt_tm_layered *p = calloc(1, sizeof(*p));
	int rc = KVT_ENOMEM;
	uint32_t n_held = 0, n_need = 0;
	if (!p || !(p->hashes = malloc((size_t)n * KVT_HASH_BYTES)) || !(p->t0 = malloc(n * sizeof(int32_t))) ||
	    !(p->t1 = malloc(n * sizeof(int32_t))) || !(p->units = malloc(n * sizeof(int32_t))) ||
	    !(p->src = malloc(n * sizeof(*p->src))) || !(p->found = malloc(n)) ||
	    !(p->order = malloc(n * sizeof(int64_t))) || (rc = lay_init(tm)))
		goto fail;
	memcpy(p->hashes, hashes, (size_t)n * KVT_HASH_BYTES);
	p->n = n;
	for (uint32_t i = 0; i < n; i++)
		p->t0[i] = p->t1[i] = -1;
	p->layers_per_group = lay_group_layers(l->n_layers, n_groups);
	p->n_groups = l->n_layers / p->layers_per_group;

	/* T0 room first, holding nothing (reserving may wait for blocks other threads move). */
	for (uint32_t i = 0; i < n; i++) {
		kvt_btable_entry e;
		n_need += kvt_btable_get(tm->cfg.bt, hashes[i], &e) == KVT_OK && e.slot[KVT_TIER_HBM] < 0;
	}
	if (n_need && kvt_tm_reserve_t0(tm, n_need) != KVT_OK) {
		rc = KVT_EFULL;
		goto fail;
	}
	/* Hold every block; never wait while holding (manager.c's no-cycle rule): a busy one means "not now". */
	for (; n_held < n; n_held++) {
		if (!busy_try(tm, hashes[n_held])) {
			rc = KVT_EBUSY;
			goto fail;
		}
	}
	int8_t *found = p->found;
	for (uint32_t i = 0; i < n; i++) {
		kvt_btable_entry e;
		if (kvt_btable_get(tm->cfg.bt, hashes[i], &e) != KVT_OK ||
		    (e.slot[KVT_TIER_HBM] < 0 && e.slot[KVT_TIER_HOST] < 0)) {
			rc = KVT_ENOTFOUND;
			goto fail;
		}
		if (e.slot[KVT_TIER_HBM] >= 0) { /* busy-held: the slot cannot leave the table before the ref */
			found[i] = KVT_TIER_HBM;
			kvt_t0_ref(tm->cfg.t0, e.slot[KVT_TIER_HBM]);
			p->t0[i] = e.slot[KVT_TIER_HBM];
			continue;
		}
		found[i] = KVT_TIER_HOST;
		p->t1[i] = e.slot[KVT_TIER_HOST];
		kvt_t1_ref(tm->t1, p->t1[i]);
		p->units[p->n_copied++] = (int32_t)i; /* for now: the block's index */
	}
	/*
	 * The copies go in T1 slot order (any order is correct: each block's
	 * bytes go to its own slot), and the T0 slots are taken in that order, so
	 * that slots adjacent in T1 (a history demoted together) make runs that
	 * one strided copy moves (lay_run).
	 */
	lay_sort_by_t1(p);
	for (uint32_t k = 0; k < p->n_copied; k++) {
		const uint32_t i = (uint32_t)p->units[k];
		if (kvt_t0_alloc(tm->cfg.t0, &p->t0[i])) {
			p->t0[i] = -1;
			rc = KVT_EFULL;
			goto fail;
		}
		p->units[k] = p->t0[i];
		p->src[k] = kvt_t1_slot_ptr(tm->t1, p->t1[i]);
	}

	/* The copies, group after group, each followed by its event. */
	tm_lay *ly = tm->lay;
	p->events = ly->events;
	p->t_start = kvt_now_s();
	pthread_mutex_lock(&tm->mu); /* after the engine's writes (as the movers: wait_compute) */
	rc = kvt_dev_stream_wait_event(tm->cfg.dev, ly->stream, tm->ev_compute);
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
		goto fail;
	}
	for (uint32_t i = 0; i < n; i++)
		count_lookup(tm, found[i]);
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
	if (p->hashes && p->t0 && p->t1) {
		lay_release(tm, p, n_held, true);
	} else {
		lay_free(tm, p);
	}
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
