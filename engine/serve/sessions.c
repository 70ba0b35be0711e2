/*
 * engine/serve/sessions.c — the sessions (sessions.h; scheduler.h,
 * "sessions"): the row a finished turn leaves in the index, listing,
 * deletion, and resume, which pages a conversation's blocks back in through
 * the tiering manager.
 *
 * Design. A session is its token history (kvt_db_session), keyed by tenant
 * and id; its blocks are named by the tenant's chain over that history, so
 * where they are now is a question for the manager, asked with the chain:
 * kvt_tm_locate for a listing (it neither pins nor counts), a WARM
 * prefix-cache handle for a resume (tiers/manager.h). A resume waits on its
 * handle (woken as blocks arrive, reporting progress), and takes its tier
 * figures from the handle's own counts, so they are right while other
 * requests promote at the same time.
 *
 * Dependency: the scheduler -> the sessions -> the manager and the index.
 * This file sees only the sched_sessions the scheduler hands it (sessions.h)
 * and scheduler.h's public types, never the scheduler's internals; what it
 * needs back (the prefill rate, a turn's acknowledgement) goes through the
 * struct's callbacks.
 *
 * These calls run on the caller's thread (the HTTP server's; the
 * scheduler's for a turn's end); they never touch the model or the
 * scheduler's requests, only the manager, the index and, through the
 * prefill_rate callback (under the scheduler's lock), the prefill counters a
 * resume reports from.
 */
#include "sessions.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sessions_chain_root(const sched_sessions *ss, const char *tenant, uint8_t root[KVT_HASH_BYTES])
{
	uint8_t salt[KVT_HASH_BYTES];
	int rc = kvt_tenant_salt(ss->secret, ss->secret_bytes, sched_tenant(tenant), salt);
	if (rc)
		return rc;
	return kvt_hash_root(ss->model_fp, ss->layout_version, ss->block_tokens, salt, root);
}

bool sessions_model_changed(const sched_sessions *ss, const char *tenant, const char *id, const int32_t *toks,
			    uint32_t n_toks)
{
	const uint32_t bt = ss->block_tokens;
	kvt_db_session row;
	uint8_t root[KVT_HASH_BYTES], last[KVT_HASH_BYTES];
	if (!ss->db || !id || !id[0] || kvt_db_get_session(ss->db, sched_tenant(tenant), id, &row) != KVT_OK)
		return false;
	/* the stored history's full blocks, hashed as this daemon hashes them now */
	uint32_t n_full = row.n_tokens / bt, n = 0;
	bool changed = false;
	if (n_full && n_toks >= bt && !memcmp(row.tokens, toks, (size_t)bt * sizeof(int32_t)) &&
	    sessions_chain_root(ss, tenant, root) == KVT_OK) {
		uint8_t (*hh)[KVT_HASH_BYTES] = malloc((size_t)n_full * KVT_HASH_BYTES);
		if (hh && kvt_hash_chain(root, row.tokens, n_full * bt, bt, hh, n_full, &n) == KVT_OK && n == n_full) {
			memcpy(last, hh[n_full - 1], KVT_HASH_BYTES);
			changed = memcmp(last, row.last_hash, KVT_HASH_BYTES) != 0;
		}
		free(hh);
	}
	kvt_db_session_deinit(&row);
	return changed;
}

typedef struct turn_save {
	const sched_sessions *ss; /* the sessions (the scheduler's: turn_saved, owner) */
	kvt_sched_handle *h;      /* the turn (alive until turn_saved: the scheduler keeps it while saving) */
} turn_save;

/* The index's writer thread: the turn's row committed or failed. */
static void on_row_done(void *user, int rc)
{
	turn_save *t = user;
	if (rc)
		KVT_LOGE("sched: a session row did not commit (%s): its turn is not acknowledged", kvt_strerror(rc));
	t->ss->turn_saved(t->ss->owner, t->h, rc);
	free(t);
}

/* A session turn whose blocks are being written through: the row to tell how far they got. */
typedef struct turn_mark {
	kvt_db *db;                        /* borrowed: closed after the manager (kvt_stack_close) */
	char tenant[KVT_NAME_MAX + 1];     /* the row's key */
	char id[KVT_NAME_MAX + 1];
	uint8_t last_hash[KVT_HASH_BYTES]; /* the history it measured (the mark applies to that row only) */
	uint32_t block_tokens;             /* tokens per block */
} turn_mark;

/* The manager: the turn's blocks are written through as far as n_durable (any thread it names). */
static void on_blocks_durable(void *user, int rc, uint32_t n_durable)
{
	turn_mark *m = user;
	(void)rc; /* at shutdown (KVT_ESTOPPED) the count is as right, and the index still takes writes */
	int rm = n_durable ? kvt_db_mark_session_durable(m->db, m->tenant, m->id, m->last_hash,
							 n_durable * m->block_tokens, NULL, NULL, NULL)
			   : KVT_OK;
	if (rm)
		KVT_LOGW("sched: session \"%s\": how far its blocks are durable not recorded: %s", m->id,
			 kvt_strerror(rm));
	free(m);
}

/* This turn's blocks become due for write-through; with m, the row is told how far they got once they land. */
static void end_turn(const sched_sessions *ss, const uint8_t (*chain)[KVT_HASH_BYTES], uint32_t n_chain,
		     turn_mark *m)
{
	if (kvt_tm_end_turn_chain(ss->tm, n_chain, chain, m ? on_blocks_durable : NULL, m) == KVT_OK)
		return;
	KVT_LOGW("sched: a turn's blocks not marked due (out of memory): they persist at the next flush");
	free(m);
}

int sessions_turn_end(const sched_sessions *ss, const char *tenant, const char *id, const int32_t *toks,
		      uint32_t n_toks, const uint8_t (*chain)[KVT_HASH_BYTES], uint32_t n_chain,
		      const uint8_t root[KVT_HASH_BYTES], kvt_sched_handle *h)
{
	const bool blocks = ss->tm && ss->cache && n_chain;
	if (!id) {
		if (blocks)
			end_turn(ss, chain, n_chain, NULL);
		return KVT_OK;
	}
	kvt_db_session row;
	memset(&row, 0, sizeof(row));
	snprintf(row.id, sizeof(row.id), "%s", id);
	snprintf(row.tenant, sizeof(row.tenant), "%s", sched_tenant(tenant));
	row.tokens = (int32_t *)toks; /* borrowed: the put copies the history */
	row.n_tokens = n_toks;
	memcpy(row.last_hash, n_chain ? chain[n_chain - 1] : root, KVT_HASH_BYTES);
	/*
	 * NOTE: once the row is queued its commit may end the turn at once and the
	 * client may free h, and with it chain: what the end of turn needs is
	 * copied first.
	 */
	uint8_t(*own)[KVT_HASH_BYTES] = blocks ? malloc((size_t)n_chain * KVT_HASH_BYTES) : NULL;
	turn_mark *m = own ? malloc(sizeof(*m)) : NULL;
	if (own) {
		memcpy(own, chain, (size_t)n_chain * KVT_HASH_BYTES);
		row.durable_tokens = kvt_tm_durable_prefix(ss->tm, n_chain, chain) * ss->block_tokens;
	}
	if (m) {
		*m = (turn_mark){ .db = ss->db, .block_tokens = ss->block_tokens };
		snprintf(m->tenant, sizeof(m->tenant), "%s", row.tenant);
		snprintf(m->id, sizeof(m->id), "%s", row.id);
		memcpy(m->last_hash, row.last_hash, KVT_HASH_BYTES);
	}
	if (blocks && !own) /* no memory for the copy: the blocks go due now, from the caller's chain, unmarked */
		end_turn(ss, chain, n_chain, NULL);
	turn_save *t = malloc(sizeof(*t));
	int rc = t ? KVT_OK : KVT_ENOMEM;
	if (t) {
		*t = (turn_save){ .ss = ss, .h = h };
		if ((rc = kvt_db_put_session(ss->db, &row, on_row_done, t, NULL)))
			free(t);
	}
	if (rc)
		KVT_LOGE("sched: session \"%s\" not saved: %s", row.id, kvt_strerror(rc));
	int r3;
	if (ss->tm && (r3 = kvt_tm_remote_put_session(ss->tm, &row)))
		KVT_LOGW("sched: session \"%s\" not queued for T3: %s", row.id, kvt_strerror(r3));
	if (rc) { /* no row to mark */
		free(m);
		m = NULL;
	}
	if (own) /* after the row was queued: the mark follows it */
		end_turn(ss, (const uint8_t(*)[KVT_HASH_BYTES])own, n_chain, m);
	free(own);
	return rc;
}

void sessions_stats(const sched_sessions *ss, uint64_t *n_sessions, kvt_db_stats *index)
{
	*n_sessions = 0;
	memset(index, 0, sizeof(*index));
	if (!ss->db)
		return;
	kvt_db_count_sessions(ss->db, n_sessions);
	kvt_db_get_stats(ss->db, index);
}

void sessions_flush(const sched_sessions *ss)
{
	int rc = ss->db ? kvt_db_flush(ss->db) : KVT_OK;
	if (rc)
		KVT_LOGE("sched: committing the index at shutdown: %s", kvt_strerror(rc));
}

/* The chain of a history's full blocks under the tenant's root: *out malloc'd ([n_full], NULL when 0). */
static int history_chain(const sched_sessions *ss, const char *tenant, const int32_t *toks, uint32_t n_toks,
			 uint8_t root[KVT_HASH_BYTES], uint8_t (**out)[KVT_HASH_BYTES], uint32_t *n_out)
{
	const uint32_t n_full = n_toks / ss->block_tokens;
	uint32_t n = 0;
	*out = NULL;
	*n_out = 0;
	int rc = sessions_chain_root(ss, tenant, root);
	if (rc || !n_full)
		return rc;
	uint8_t(*hh)[KVT_HASH_BYTES] = malloc((size_t)n_full * KVT_HASH_BYTES);
	if (!hh)
		return KVT_ENOMEM;
	if ((rc = kvt_hash_chain(root, toks, n_full * ss->block_tokens, ss->block_tokens, hh, n_full, &n))) {
		free(hh);
		return rc;
	}
	*out = hh;
	*n_out = n;
	return KVT_OK;
}

typedef struct sess_list {
	kvt_db_session *rows; /* tokens malloc'd copies */
	size_t n, cap;        /* rows, capacity */
	int rc;               /* the first failure (KVT_ENOMEM) */
} sess_list;

static int collect_session(void *ctx, const kvt_db_session *row)
{
	sess_list *l = ctx;
	if (l->n == l->cap) {
		size_t nc = l->cap ? 2 * l->cap : 16;
		kvt_db_session *r = realloc(l->rows, nc * sizeof(*r));
		if (!r)
			return l->rc = KVT_ENOMEM;
		l->rows = r;
		l->cap = nc;
	}
	kvt_db_session *d = &l->rows[l->n];
	*d = *row;
	d->tokens = malloc((row->n_tokens ? row->n_tokens : 1) * sizeof(int32_t));
	if (!d->tokens)
		return l->rc = KVT_ENOMEM;
	memcpy(d->tokens, row->tokens, (size_t)row->n_tokens * sizeof(int32_t));
	l->n++;
	return 0;
}

/* Where a history's full blocks are now: blocks_in by highest tier, missing. */
static int locate(const sched_sessions *ss, const char *tenant, const int32_t *toks, uint32_t n_toks,
		  kvt_session_info *info)
{
	uint8_t root[KVT_HASH_BYTES];
	uint8_t(*hh)[KVT_HASH_BYTES] = NULL;
	uint32_t n = 0, usable = 0;

	info->n_tokens = n_toks;
	info->n_blocks = n_toks / ss->block_tokens;
	memset(info->blocks_in, 0, sizeof(info->blocks_in));
	info->blocks_missing = info->n_blocks;
	if (!info->n_blocks || !ss->tm)
		return KVT_OK;
	int rc = history_chain(ss, tenant, toks, n_toks, root, &hh, &n);
	if (rc == KVT_OK)
		rc = kvt_tm_locate(ss->tm, (const uint8_t(*)[KVT_HASH_BYTES])hh, toks, n, info->blocks_in, &usable);
	free(hh);
	if (rc == KVT_OK)
		info->blocks_missing = info->n_blocks - usable;
	return rc;
}

static int cmp_updated_desc(const void *a, const void *b)
{
	const kvt_session_info *x = a, *y = b;
	return (x->updated_us < y->updated_us) - (x->updated_us > y->updated_us);
}

int sessions_list(const sched_sessions *ss, const char *tenant, kvt_session_info **out, size_t *n)
{
	sess_list l = { 0 };
	int rc = KVT_OK;

	*out = NULL;
	*n = 0;
	if (!ss->db)
		return KVT_OK;
	if (tenant && tenant[0] && (rc = kvt_name_check("tenant", tenant)))
		return rc;
	rc = kvt_db_list_sessions(ss->db, tenant && tenant[0] ? tenant : NULL, collect_session, &l);
	if (!rc)
		rc = l.rc;
	kvt_session_info *info = rc ? NULL : calloc(l.n ? l.n : 1, sizeof(*info));
	if (!rc && !info)
		rc = KVT_ENOMEM;
	for (size_t i = 0; i < l.n; i++) {
		if (!rc) {
			snprintf(info[i].id, sizeof(info[i].id), "%s", l.rows[i].id);
			snprintf(info[i].tenant, sizeof(info[i].tenant), "%s", l.rows[i].tenant);
			info[i].updated_us = l.rows[i].updated * 1000000;
			info[i].durable_tokens = l.rows[i].durable_tokens;
			rc = locate(ss, l.rows[i].tenant, l.rows[i].tokens, l.rows[i].n_tokens, &info[i]);
		}
		free(l.rows[i].tokens);
	}
	free(l.rows);
	if (rc) {
		free(info);
		return rc;
	}
	qsort(info, l.n, sizeof(*info), cmp_updated_desc);
	*out = info;
	*n = l.n;
	return KVT_OK;
}

int sessions_delete(const sched_sessions *ss, const char *tenant, const char *id)
{
	kvt_db_session row;
	uint64_t ticket = 0;
	int rc;

	if (!ss->db)
		return KVT_ENOTFOUND;
	memset(&row, 0, sizeof(row)); /* get writes it only on success */
	/* An unreadable row (KVT_ECORRUPT, logged) can still be deleted: that is how an operator clears it. */
	if ((rc = kvt_db_get_session(ss->db, sched_tenant(tenant), id, &row)) && rc != KVT_ECORRUPT)
		return rc;
	if (rc == KVT_OK && ss->tm && row.n_tokens >= ss->block_tokens) { /* its retention ends with it */
		uint8_t root[KVT_HASH_BYTES];
		uint8_t(*hh)[KVT_HASH_BYTES] = NULL;
		uint32_t n = 0;
		if (history_chain(ss, tenant, row.tokens, row.n_tokens, root, &hh, &n) == KVT_OK)
			(void)kvt_tm_release(ss->tm, n, (const uint8_t(*)[KVT_HASH_BYTES])hh);
		free(hh);
	}
	kvt_db_session_deinit(&row);
	if ((rc = kvt_db_delete_session(ss->db, sched_tenant(tenant), id, NULL, NULL, &ticket)))
		return rc;
	return kvt_db_wait(ss->db, ticket);
}

int sessions_remote(const sched_sessions *ss, const char *tenant, const char *id)
{
	kvt_db_session row;
	if (!ss->tm || !kvt_tm_has_remote(ss->tm))
		return KVT_ENOTFOUND;
	int rc = kvt_tm_remote_get_session(ss->tm, sched_tenant(tenant), id, &row);
	if (rc == KVT_OK)
		kvt_db_session_deinit(&row);
	return rc;
}

/* The session row: the index's, else (another node's conversation) T3's, kept here from then on. */
static int session_get(const sched_sessions *ss, const char *tenant, const char *id, kvt_db_session *row,
		       bool *from_remote)
{
	int rc = kvt_db_get_session(ss->db, sched_tenant(tenant), id, row);
	if (rc == KVT_ENOTFOUND && ss->tm && kvt_tm_has_remote(ss->tm) &&
	    kvt_tm_remote_get_session(ss->tm, sched_tenant(tenant), id, row) == KVT_OK) {
		rc = KVT_OK;
		*from_remote = true;
		row->durable_tokens = 0; /* another node's: none of its blocks is known durable here */
		int rp = kvt_db_put_session(ss->db, row, NULL, NULL, NULL);
		if (rp)
			KVT_LOGW("sched: session \"%s\" from T3 not saved here: %s", id, kvt_strerror(rp));
	}
	return rc;
}

int sessions_resume(const sched_sessions *ss, const char *tenant, const char *id, kvt_resume_progress_fn progress,
		    void *user, kvt_resume_report *rep)
{
	kvt_db_session row;
	uint8_t root[KVT_HASH_BYTES];
	uint8_t(*hh)[KVT_HASH_BYTES] = NULL;
	kvt_tm_prefix *p = NULL;
	kvt_tm_prefix_counts c = { 0 };
	uint32_t n_chain = 0;

	memset(rep, 0, sizeof(*rep));
	snprintf(rep->id, sizeof(rep->id), "%s", id);
	if (!ss->db)
		return KVT_ENOTFOUND;
	double t0 = kvt_now_s();
	int rc = session_get(ss, tenant, id, &row, &rep->from_remote);
	if (rc)
		return rc;
	rep->n_tokens = row.n_tokens;
	rep->n_blocks = row.n_tokens / ss->block_tokens;
	if (ss->tm && rep->n_blocks) {
		if ((rc = history_chain(ss, tenant, row.tokens, row.n_tokens, root, &hh, &n_chain)))
			goto out;
		/* to T0 as far as it has room, the rest to T1; blocks past the local ones from T3 when there is one */
		const kvt_tm_prefix_req pr = { .use = KVT_TM_PREFIX_WARM,
					       .hashes = (const uint8_t(*)[KVT_HASH_BYTES])hh,
					       .tokens = row.tokens,
					       .n = n_chain,
					       .root = root };
		if ((rc = kvt_tm_prefix_acquire(ss->tm, &pr, &p)))
			goto out;
		kvt_tm_prefix_get_counts(ss->tm, p, &c);
	}
	if (progress)
		progress(user, 0, c.n_usable);
	if (p) {
		if ((rc = kvt_tm_prefix_wait(ss->tm, p, progress, user)))
			goto out;
		kvt_tm_prefix_get_counts(ss->tm, p, &c);
		for (int t = 0; t < KVT_TM_N_TIERS; t++) {
			rep->tokens_from[t] = c.blocks_from[t] * ss->block_tokens;
			rep->bytes_from[t] = c.bytes_from[t];
		}
		if (progress && c.n_usable)
			progress(user, c.n_served, c.n_served);
	}
	const uint32_t n_served = c.n_served;
	rep->tokens_missing = row.n_tokens - n_served * ss->block_tokens;
	rep->durable_tokens = row.durable_tokens;
	if (row.durable_tokens > n_served * ss->block_tokens) {
		rep->durable_lost_tokens = row.durable_tokens - n_served * ss->block_tokens;
		KVT_LOGW("sched: session \"%s\": its row says %u tokens durable but %u were found; the %u past them "
			 "(evicted from T2 or damaged) are prefilled again",
			 id, row.durable_tokens, n_served * ss->block_tokens, rep->durable_lost_tokens);
	}
	rep->seconds = kvt_now_s() - t0;
	double rate = ss->prefill_rate(ss->owner);
	rep->prefill_s = rate > 0 ? (double)(n_served * ss->block_tokens) / rate : 0;
	rep->prefill_measured = false;
out:
	kvt_tm_prefix_release(ss->tm, p);
	free(hh);
	kvt_db_session_deinit(&row);
	return rc;
}
