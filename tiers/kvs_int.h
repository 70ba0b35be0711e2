/*
 * tiers/kvs_int.h — the key-value store's insides (kvstore.h), shared by
 * kvs.c (the map, RAM, the API), kvs_writer.c (the writer thread: NVMe,
 * eviction, the write order) and kvs_sql.c (the SQLite index). Private.
 *
 * Locking: one mutex (mu) guards the map, the LRU list, every entry's fields,
 * the op queue and the counters. free_lock (a rwlock) orders extent frees
 * against NVMe reads: a GET holds it shared from before it copies an entry's
 * locations until its read is done; the writer frees extents only while it
 * holds it exclusively (and never while holding mu), so no read meets a
 * reused extent. Lock order: free_lock, then mu.
 *
 * An entry's life: made by set (version = a new number), in the map and the
 * LRU list while live; "dead" once unlinked (deleted, evicted, expired,
 * replaced by nothing) but kept while refs > 0 (queued ops hold one). Its NVMe
 * copy (locs, n_locs) is the one its committed row names; only the writer
 * changes it. A value is in RAM (ram != NULL) and/or on NVMe (n_locs > 0);
 * a live entry with neither does not exist.
 */
#ifndef KVT_KVS_INT_H
#define KVT_KVS_INT_H

#include "kvstore.h"
#include "rstore.h"

#include <pthread.h>
#include <sqlite3.h>

typedef struct kvs_ent {
	struct kvs_ent *hnext;             /* hash bucket chain */
	struct kvs_ent *lprev, *lnext;     /* LRU list: head most recent */
	uint64_t hv;                       /* hash of (tenant, key) */
	uint8_t id[32];                    /* BLAKE3(ns, 0, key): names its records */
	uint8_t *key;
	uint32_t klen;
	uint16_t tenant;                   /* index into kvt_kvs.ten */
	bool dead;                         /* unlinked from map and LRU */
	bool too_big;                      /* larger than the NVMe file: RAM only */
	int refs;                          /* the map's, queued ops', readers' */
	int pending;                       /* ops queued for it */
	uint64_t version;                  /* of the value now set */
	uint64_t len;                      /* value bytes */
	kvt_kvs_val *ram;                  /* RAM copy (one ref) or NULL */
	/* the NVMe copy (the committed row's) */
	kvt_t2_loc *locs;                  /* [n_locs] */
	uint32_t n_locs;
	uint64_t nvme_version;             /* version the NVMe copy holds */
	uint64_t nvme_len;                 /* its value bytes */
	uint64_t nvme_sum;                 /* its XXH3-64 */
	uint64_t expires_ms;               /* wall clock ms; 0: never */
	double lease_until;                /* monotonic s: EXISTS lease */
} kvs_ent;

enum kvs_op_kind { KVS_OP_SET = 1, KVS_OP_DEL = 2 };

typedef struct kvs_op {
	struct kvs_op *next;
	int kind;
	kvs_ent *e;          /* a ref */
	uint64_t version;    /* SET: the version to persist */
	uint64_t bytes;      /* SET: its value bytes (counted in pending_bytes) */
	kvt_kvs_ticket ticket;
} kvs_op;

/* Extents to free once no read can meet them. */
typedef struct kvs_freelist {
	kvt_t2_loc *locs;
	size_t n, cap;
} kvs_freelist;

struct kvt_kvs {
	kvt_kvs_config cfg;
	char *dir;
	pthread_mutex_t mu;
	pthread_cond_t cv_ack;      /* acked moved, or pending bytes fell */
	pthread_cond_t cv_work;     /* ops queued, or stopping */
	pthread_rwlock_t free_lock;
	/* map */
	kvs_ent **buckets;
	size_t n_buckets, n_ents;
	kvs_ent *lru_head, *lru_tail;
	uint64_t ram_used;          /* bytes of RAM copies */
	uint64_t pending_bytes;     /* bytes of SET values not yet written */
	uint64_t next_version;
	/* tenants */
	kvt_kvs_tenant_stats ten[KVT_KVS_MAX_TENANTS];
	uint32_t n_ten;
	/* NVMe */
	kvt_t2_store *t2;           /* NULL: RAM only */
	kvt_rstore rs;
	sqlite3 *db;
	sqlite3_stmt *st_put, *st_del, *st_begin, *st_commit, *st_rollback;
	/* the writer */
	pthread_t writer;
	bool writer_on;
	bool stopping;
	kvs_op *q_head, *q_tail;
	uint64_t q_len;
	kvt_kvs_ticket next_ticket; /* last handed out */
	kvt_kvs_ticket acked;       /* every ticket <= acked is acknowledged */
	kvt_kvs_ticket fail_lo, fail_hi; /* the last failed batch's tickets */
	double next_sweep;
	/* counters */
	uint64_t write_errors, corrupt, recovered, dropped_at_open;
};

/* kvs.c */
double kvs_mono(void);
uint64_t kvs_wall_ms(void);
void kvs_ent_unref_locked(kvt_kvs *s, kvs_ent *e);
void kvs_unlink_locked(kvt_kvs *s, kvs_ent *e);   /* live → dead (drops its RAM copy; counts leave the tenant) */
void kvs_nvme_account_locked(kvt_kvs *s, kvs_ent *e, int sign); /* add/remove e's NVMe bytes from its tenant */
int kvs_tenant_find_or_add_locked(kvt_kvs *s, const char *ns);
int kvs_insert_loaded(kvt_kvs *s, const char *ns, const uint8_t *key, uint32_t klen, uint64_t version, uint64_t len,
		      uint64_t sum, uint64_t expires_ms, kvt_t2_loc *locs, uint32_t n_locs);
void kvs_id(const char *ns, const void *key, size_t klen, uint8_t out[32]);
void kvs_chunk_hash(const uint8_t id[32], uint64_t version, uint32_t idx, uint8_t out[32]);
uint32_t kvs_n_chunks(uint64_t len);

/* kvs_sql.c */
int kvs_sql_open(kvt_kvs *s, const char *path);
void kvs_sql_close(kvt_kvs *s);
int kvs_sql_begin(kvt_kvs *s);
int kvs_sql_commit(kvt_kvs *s);
void kvs_sql_rollback(kvt_kvs *s);
int kvs_sql_put(kvt_kvs *s, const kvs_ent *e, uint64_t version, uint64_t len, uint64_t sum, uint64_t expires_ms,
		const kvt_t2_loc *locs,
		uint32_t n_locs);
int kvs_sql_del(kvt_kvs *s, const kvs_ent *e);
/* Read every row into the map (marking extents used); rows that cannot be kept are deleted. */
int kvs_sql_load(kvt_kvs *s);

/* kvs_writer.c */
int kvs_writer_start(kvt_kvs *s);
void kvs_writer_stop(kvt_kvs *s); /* drains the queue first */
/* Queue an op (takes a ref on e); returns its ticket. Under mu. */
kvt_kvs_ticket kvs_queue_locked(kvt_kvs *s, int kind, kvs_ent *e);
void kvs_freelist_add(kvs_freelist *fl, const kvt_t2_loc *locs, uint32_t n);
void kvs_free_extents(kvt_kvs *s, kvs_freelist *fl); /* takes free_lock exclusively; not under mu */

#endif
