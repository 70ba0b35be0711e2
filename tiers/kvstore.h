/*
 * tiers/kvstore.h — the key-value store behind kvtierd's Redis-protocol
 * listener (engine/serve/resp*.c): opaque keys to opaque values of up to
 * max_value_bytes each, kept in kvtier's own tiers — host RAM first, an NVMe
 * file below — so vLLM and SGLang (through LMCache's remote connectors) keep
 * their KV across restarts.
 *
 * Where values live:
 *   - RAM: a value's bytes in one heap buffer (kvt_kvs_val, refcounted and
 *     immutable once stored), at most ram_bytes of them in all; the least
 *     recently used values leave RAM first (their NVMe copy stays).
 *   - NVMe: DATA_DIR/store.t2, a T2 file of its own (tiers/t2_store.h, reached
 *     through the record-store seam tiers/rstore.h), nvme_bytes large. A value
 *     is cut into records of at most KVT_KVS_CHUNK_BYTES, each checksummed by
 *     T2 and named by a hash of (namespace, key, version, chunk number); its
 *     index row in DATA_DIR/store.sqlite (WAL, synchronous=FULL) holds the
 *     value's length, its XXH3-64 and every chunk's location. When the file is
 *     full the least recently used values are evicted (row deleted and
 *     committed, then extents freed) until the new one fits: a SET is never
 *     refused for space. A value larger than the whole file stays in RAM only.
 *   - nvme_bytes 0: RAM only (nothing survives a restart).
 *
 * The write order (DESIGN.md §4), per batch of SETs and DELs, on the writer
 * thread: chunk records durable (one fdatasync per batch) → rows committed
 * (one transaction) → tickets acknowledged → old extents freed. A restart
 * (SIGTERM or kill -9) finds every acknowledged value whole; a value whose
 * rows never committed left only free extents; a GET returns the whole value
 * (its checksum verified) or a miss, never a part.
 *
 * durable (the default): a SET's ticket is acknowledged once the value is on
 * NVMe and its row committed. Not durable: acknowledged at once; the writer
 * persists it behind (a kill -9 loses what was not yet written, whole).
 * Either way the value is readable (GET, EXISTS) as soon as kvt_kvs_set returns.
 *
 * Namespaces: every key lives in a namespace (the tenant of the connection's
 * AUTH key; "default" without keys). The same key in two namespaces is two
 * values. Namespace names are 1..KVT_KVS_NS_MAX bytes.
 *
 * Expiry: a SET with ttl_ms > 0 expires that many ms later (a GET/EXISTS of an
 * expired key is a miss; the writer drops it from NVMe). The lease: EXISTS
 * that finds a key protects it from eviction for exists_lease_s, so the GET
 * that follows finds it (LMCache's native client reads "exists" then GET).
 *
 * Thread rules: every function may be called from any thread at once, except
 * open and close. Calls block: a GET from NVMe reads on the caller's thread; a
 * wait blocks until the writer acknowledged the ticket.
 */
#ifndef KVT_KVSTORE_H
#define KVT_KVSTORE_H

#include "kvt.h"
#include "t2_store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVT_KVS_NS_MAX 64u                  /* bytes of a namespace name */
#define KVT_KVS_KEY_MAX (64u << 10)         /* bytes of a key */
#define KVT_KVS_CHUNK_BYTES (4u << 20)      /* payload bytes of one NVMe record */
#define KVT_KVS_MAX_VALUE_DEFAULT (512ull << 20)
#define KVT_KVS_MAX_TENANTS 64u             /* namespaces a store holds (a SET in a 65th is KVT_EFULL) */

typedef struct kvt_kvs kvt_kvs;

typedef struct kvt_kvs_config {
	const char *dir;          /* directory of store.t2 and store.sqlite (created if missing); borrowed */
	uint64_t ram_bytes;       /* value bytes kept in RAM at most (>= 1 MiB) */
	uint64_t nvme_bytes;      /* store.t2 size for a new file (0: RAM only; an existing file keeps its size) */
	uint64_t max_value_bytes; /* largest value (0: KVT_KVS_MAX_VALUE_DEFAULT) */
	bool durable;             /* SET acknowledged once on NVMe (true) or at once, written behind (false) */
	double exists_lease_s;    /* EXISTS keeps a found key from eviction this long (0: no lease) */
	int io_mode;              /* enum kvt_t2_io_mode */
	const kvt_t2_io_ops *io;  /* fault injection on the file (NULL: real syscalls); borrowed */
} kvt_kvs_config;

/* Defaults: ram 256 MiB, nvme 0, max value 512 MiB, durable, lease 5 s, io auto. */
void kvt_kvs_config_default(kvt_kvs_config *c);

/*
 * Open (or create) the store in cfg->dir: the index rows are read, each
 * value's extents marked used (a row whose extents are bad is dropped and
 * logged). KVT_EINVAL (bad config; logged), KVT_EIO, KVT_ECORRUPT (the index
 * cannot be read: logged with the path), KVT_EBUSY (another process holds the
 * file), KVT_ENOMEM.
 */
int kvt_kvs_open(const kvt_kvs_config *cfg, kvt_kvs **out);
/* Persist every value not yet written (not durable mode), stop the writer, close. NULL: no-op. */
void kvt_kvs_close(kvt_kvs *s);

/* A value: len bytes at data, refcounted; immutable once given to kvt_kvs_set. */
typedef struct kvt_kvs_val {
	uint8_t *data;
	size_t len;
	size_t cap;        /* bytes allocated at data (>= len) */
	int refs;          /* atomic */
} kvt_kvs_val;

/* A new value of cap bytes (len 0; fill data and set len). NULL on allocation failure. */
kvt_kvs_val *kvt_kvs_val_new(size_t cap);
/* Grow v's buffer to at least cap bytes (before it is stored): KVT_OK or KVT_ENOMEM (v unchanged). */
int kvt_kvs_val_reserve(kvt_kvs_val *v, size_t cap);
void kvt_kvs_val_ref(kvt_kvs_val *v);
void kvt_kvs_val_unref(kvt_kvs_val *v); /* NULL: no-op */

/* A write's place in the writer's order: kvt_kvs_wait blocks until it is acknowledged.
 * Tickets are acknowledged in the order they were handed out (batches are taken off one
 * queue in order), so waiting on the highest of several covers them all; 0 is always acknowledged. */
typedef uint64_t kvt_kvs_ticket;

/*
 * Store v (the reference is taken over: do not unref it) under (ns, key):
 * readable at once. *ticket (may be NULL) gets the write's ticket: wait on it
 * before answering the client. ttl_ms 0: no expiry. KVT_OK; KVT_EINVAL for a
 * bad namespace, an empty or too long key, or v->len > max_value_bytes (v
 * dropped); KVT_EFULL for a new namespace when KVT_KVS_MAX_TENANTS exist (each
 * namespace keeps its own keys; none is ever shared); KVT_ESTOPPED while closing.
 */
int kvt_kvs_set(kvt_kvs *s, const char *ns, const void *key, size_t klen, kvt_kvs_val *v, uint64_t ttl_ms,
		kvt_kvs_ticket *ticket);
/*
 * Block until ticket is acknowledged (durable: on NVMe with its row
 * committed). KVT_OK, or KVT_EIO when the write failed (the value stays in RAM
 * only; logged) — the listener still answers OK: the store is a cache.
 */
int kvt_kvs_wait(kvt_kvs *s, kvt_kvs_ticket ticket);

/*
 * Look (ns, key) up: KVT_OK with *out a reference to the whole value (unref
 * it), KVT_ENOTFOUND (absent, expired, or its NVMe copy failed verification:
 * counted, dropped), KVT_EIO (the read failed; counted as a miss).
 */
int kvt_kvs_get(kvt_kvs *s, const char *ns, const void *key, size_t klen, kvt_kvs_val **out);
/* Whether (ns, key) is there (1) or not (0); a found key gets the EXISTS lease. */
int kvt_kvs_exists(kvt_kvs *s, const char *ns, const void *key, size_t klen);
/* Remove (ns, key): 1 removed, 0 absent. *ticket as for set (the row's delete). */
int kvt_kvs_del(kvt_kvs *s, const char *ns, const void *key, size_t klen, kvt_kvs_ticket *ticket);

/* One namespace's figures (or the store's in total). */
typedef struct kvt_kvs_tenant_stats {
	char ns[KVT_KVS_NS_MAX + 1];
	uint64_t keys;          /* keys held now */
	uint64_t bytes;         /* their value bytes */
	uint64_t ram_bytes;     /* of those, held in RAM */
	uint64_t nvme_bytes;    /* of those, held on NVMe */
	uint64_t hits_ram;      /* GETs served from RAM */
	uint64_t hits_nvme;     /* GETs served from NVMe */
	uint64_t misses;        /* GETs that found nothing */
	uint64_t sets;          /* SETs */
	uint64_t dels;          /* DELs that removed a key */
	uint64_t evicted_ram;   /* values that left RAM for space (an NVMe copy kept) */
	uint64_t evicted;       /* values dropped for space (gone) */
	uint64_t expired;       /* values dropped at their expiry */
} kvt_kvs_tenant_stats;

typedef struct kvt_kvs_stats {
	kvt_kvs_tenant_stats total;
	kvt_kvs_tenant_stats tenant[KVT_KVS_MAX_TENANTS]; /* [n_tenants], by first use */
	uint32_t n_tenants;
	uint64_t ram_capacity;  /* ram_bytes */
	uint64_t nvme_capacity; /* bytes of store.t2 available to records (0: RAM only) */
	uint64_t nvme_used;     /* extent bytes in use */
	uint64_t writes_pending;/* SETs/DELs not yet acknowledged by the writer */
	uint64_t write_errors;  /* batches whose write or commit failed */
	uint64_t corrupt;       /* NVMe values that failed verification (dropped, never served) */
	uint64_t recovered;     /* values found on NVMe at open */
	uint64_t dropped_at_open; /* rows dropped at open (bad extents) */
} kvt_kvs_stats;

void kvt_kvs_stats_get(kvt_kvs *s, kvt_kvs_stats *st);

#endif
