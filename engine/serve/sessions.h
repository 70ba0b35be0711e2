/*
 * engine/serve/sessions.h — the sessions (sessions.c) inside engine/serve:
 * what the scheduler hands them and calls them for. The public calls
 * (kvt_sched_sessions, kvt_sched_session_*, scheduler.h) pass the
 * scheduler's sched_sessions through to the functions here.
 *
 * Direction of dependency: the scheduler (scheduler.c, sched_*.c) -> the
 * sessions -> the manager and the index. The scheduler fills a
 * sched_sessions when it is created and owns it; the sessions see that
 * struct and scheduler.h's public types, never the scheduler's state
 * (sched_int.h). The two things they need back from the scheduler come
 * through the callbacks in the struct: the prefill rate a resume reports
 * from, and a finished turn's acknowledgement once its row has committed.
 *
 * Threads: these calls run on the caller's thread (the HTTP server's, or the
 * scheduler's for sessions_turn_end); they touch only the manager and the
 * index, and the scheduler only through the callbacks, which take its lock.
 * The struct is written once, before the scheduler thread starts, and only
 * read after that.
 */
#ifndef KVT_SESSIONS_H
#define KVT_SESSIONS_H

#include "scheduler.h"

typedef struct sched_sessions {
	kvt_db *db;                /* borrowed (the scheduler's config); NULL: sessions are not kept */
	kvt_tm *tm;                /* borrowed; NULL: no tiers (a listing finds no blocks, a resume pages none in) */
	bool cache;                /* the prefix cache is on: a turn's blocks become due for write-through */
	uint32_t block_tokens;     /* tokens per block (the T0 pool's) */
	const uint8_t *model_fp;   /* [KVT_HASH_BYTES] the model fingerprint (chain roots), borrowed */
	uint32_t layout_version;   /* the KV layout version (chain roots) */
	const uint8_t *secret;     /* [secret_bytes] the server secret (tenant salts), borrowed */
	size_t secret_bytes;       /* 16..64 */
	kvt_sched *owner;          /* the scheduler, passed back to the callbacks (opaque here) */
	double (*prefill_rate)(kvt_sched *owner); /* prefill tokens/s measured or kept (0: none); takes its lock */
	void (*turn_saved)(kvt_sched *owner, kvt_sched_handle *h, int rc); /* a turn's row committed (rc KVT_OK)
	                                                                     or failed; any thread */
} sched_sessions;

/* The scheduler's sessions (scheduler.c): for the session files that take a kvt_sched (sessions_snapshot.c). */
const sched_sessions *kvt_sched_sessions_of(kvt_sched *s);

/* A request's tenant: "" or NULL is "default". */
static inline const char *sched_tenant(const char *t) { return t && t[0] ? t : "default"; }

/*
 * The tenant's chain root (model fingerprint, layout, block size, the
 * tenant's salt): the parent of every history's first block. The scheduler
 * names its blocks under it too. KVT_OK or kvt_hash_root's error.
 */
int sessions_chain_root(const sched_sessions *ss, const char *tenant, uint8_t root[KVT_HASH_BYTES]);

/*
 * The end of a finished turn: its blocks (chain[0..n_chain), when the cache
 * is on) become due for write-through, and with a session id the row it
 * leaves is queued first: the whole history, the hash of its last cached
 * block (root when none) and how far its blocks are durable now; once they
 * have landed a mark follows the row (kvt_db_mark_session_durable), so a
 * resume after a crash knows how much it re-prefills. The row also goes to
 * T3 when there is one. KVT_OK: queued (or no session), and
 * ss->turn_saved(ss->owner, h, rc) follows on the index's writer thread once
 * the row has committed (rc KVT_OK) or failed (KVT_EFULL: no space; KVT_EIO);
 * else the row was not queued (logged) and nothing follows. Borrows chain
 * only during the call (h may be gone when it returns).
 */
int sessions_turn_end(const sched_sessions *ss, const char *tenant, const char *id, const int32_t *toks,
		      uint32_t n_toks, const uint8_t (*chain)[KVT_HASH_BYTES], uint32_t n_chain,
		      const uint8_t root[KVT_HASH_BYTES], kvt_sched_handle *h);

/*
 * Whether session id's stored history begins as toks does (its first block)
 * but was hashed under another chain root than this daemon's (the model,
 * the KV layout or the server secret changed): a cache miss's
 * MODEL_CHANGED. false without such a session.
 */
bool sessions_model_changed(const sched_sessions *ss, const char *tenant, const char *id, const int32_t *toks,
			    uint32_t n_toks);

/* The sessions known and the index's counters (zero without an index). */
void sessions_stats(const sched_sessions *ss, uint64_t *n_sessions, kvt_db_stats *index);
/* Shutdown: commit everything queued to the index (the session rows of the last turns); a failure is logged. */
void sessions_flush(const sched_sessions *ss);

/* kvt_sched_sessions, kvt_sched_session_delete, _remote and _resume (scheduler.h), on the scheduler's sessions. */
int sessions_list(const sched_sessions *ss, const char *tenant, kvt_session_info **out, size_t *n);
int sessions_delete(const sched_sessions *ss, const char *tenant, const char *id);
int sessions_remote(const sched_sessions *ss, const char *tenant, const char *id);
int sessions_resume(const sched_sessions *ss, const char *tenant, const char *id, kvt_resume_progress_fn progress,
		    void *user, kvt_resume_report *rep);

#endif
