/*
 * engine/serve/ — the serving daemon: the scheduler (continuous batching, the
 * prefix cache, sessions; scheduler.h), the HTTP API (server.h), kvtierd's
 * configuration (config.h), the stack that wires model, tiers and index
 * together (this header), sd_notify (sdnotify.h) and kvtierd's main. It may
 * use engine/model/ and everything below it; it never includes a header of
 * engine/cli/ (cmake/check_layout.cmake fails the build if it does).
 *
 * engine/serve/stack.h — the serving stack over a loaded model, built one way for
 * the daemon and the tests: the T0 block pool, the block table, the SQLite
 * index, the NVMe store, the tiering manager (recovered from the index) and
 * the scheduler.
 *
 * Every piece is optional past T0 and the scheduler: no index path, no
 * sessions and no NVMe tier; no NVMe path, no NVMe tier; t1_slots 0, no
 * tiering manager (every prompt is prefilled).
 */
#ifndef KVT_STACK_H
#define KVT_STACK_H

#include "manager.h"
#include "scheduler.h"

/* One tenant's retention quota ("*": every tenant not named). */
typedef struct kvt_stack_quota {
	char tenant[KVT_NAME_MAX + 1]; /* a tenant name or "*" */
	kvt_tm_quota quota;            /* 0 fields: no limit */
} kvt_stack_quota;

typedef struct kvt_stack_config {
	kvt_dev *dev;              /* borrowed */
	kvt_model *model;          /* borrowed */
	const struct kvt_tok *tok; /* borrowed */
	uint8_t model_fp[KVT_HASH_BYTES];
	uint32_t block_tokens;     /* tokens per block */
	uint32_t t0_slots;         /* T0 pool size in blocks */
	const char *db_path;       /* the SQLite index; NULL: none (no sessions, no NVMe tier) */
	const char *journal_path;  /* the index's session journal; NULL: none */
	const char *reserve_path;  /* the index's reserve for session rows; NULL: none */
	uint64_t reserve_bytes;    /* its size (0: none) */
	const char *t2_path;       /* the NVMe tier's file; NULL: none */
	kvt_t2_config t2;          /* capacity, queue depth, io mode, compression, reset (path, model_fp,
				      max_raw_bytes are filled in) */
	kvt_tm_config tm;          /* t1_slots (0: no manager), t1_codec, watermarks, persist, threads
				      (the handles are filled in) */
	kvt_sched_config sched;    /* max_running, max_queue, prefill_chunk, cache, secret (handles filled in) */
	const kvt_stack_quota *quotas; /* [n_quotas] retention quotas, set before recovery; borrowed */
	size_t n_quotas;
	bool remote;               /* a remote tier (T3) with the settings below (needs the manager) */
	kvt_t3_config t3;          /* seeds, mode, AUTH, timeouts, prefix, pipeline depth, policy, ttl */
} kvt_stack_config;

/* Defaults: tm and sched at their defaults, no index, no NVMe tier. */
void kvt_stack_config_default(kvt_stack_config *c);

typedef struct kvt_stack {
	kvt_t0_pool *t0;
	kvt_btable *bt;
	kvt_db *db;
	kvt_t2_store *t2;
	kvt_t3 *t3;                /* the remote tier, or NULL */
	kvt_tm *tm;
	kvt_sched *sched;
	uint64_t n_recovered;      /* durable blocks found in the index at start */
} kvt_stack;

/* Build it all (on failure nothing is left open; the failing part logged why). */
int kvt_stack_open(const kvt_stack_config *c, kvt_stack *out);
/* Stop the scheduler, flush the cache to NVMe, commit the index, close. */
void kvt_stack_close(kvt_stack *s);

#endif
