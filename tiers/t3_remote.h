/*
 * tiers/t3_remote.h — T3, the optional remote tier shared by several kvtierd
 * nodes: a Redis Cluster (or one Redis server) reached through hiredis.
 *
 * Two layers, one header:
 *
 *  - kvt_rc_* (tiers/t3_cluster.c): a small Redis Cluster client. hiredis 0.14
 *    (Debian 12) speaks to one server; Debian 12 packages no C cluster client,
 *    so routing is ours: the key slot is CRC16 (XMODEM: polynomial 0x1021,
 *    initial value 0) of the key, or of its hash tag (the bytes between the
 *    first '{' and the next '}', when at least one), modulo 16384; the slot
 *    map comes from CLUSTER SLOTS; a MOVED redirect updates the slot's entry
 *    and schedules a full refresh, an ASK redirect is followed once (ASKING,
 *    then the command) without touching the map. A batch of GET/SET (DEL, EXISTS) is
 *    grouped by node and pipelined, at most pipeline_depth commands in flight
 *    per node, connections are kept and reused. A node that refuses or drops
 *    a connection is skipped (its commands fail at once) for a back-off that
 *    doubles from 0.25 s to 5 s: the circuit breaker.
 *
 *  - kvt_t3_* (tiers/t3_remote.c): the tier. A block is stored as the T2
 *    record (t2_store.h: magic, version, model fingerprint, block hash,
 *    parent, tokens, codec, lengths, XXH3 over header and payload; sealed
 *    for offset 0, generation KVT_T3_GENERATION), without its zero padding,
 *    under "<prefix>b:<hex of the tenant-salted chain hash>". A read verifies
 *    what it got (checksum, model, hash); a record that fails is a miss,
 *    counted in n_corrupt, never served. A session (id, tenant, token
 *    history, last block hash) is stored under "<prefix>s:<tenant>/<id>" as a
 *    small checksummed record of its own.
 *
 * Failure is a miss, never an outage: every read returns within the command
 * timeout (a deadline over the whole pipelined round, not per reply); writes,
 * which never hold up a request, get max(command timeout, KVT_T3_WRITE_MIN_MS); an
 * unreachable or slow node fails its commands with KVT_EIO, and the tier is
 * "degraded" while any command failed within the last 2 s. Nothing here
 * retries on its own beyond one redirect per command.
 *
 * Thread rules: a kvt_rc client is driven by one thread at a time. kvt_t3 is
 * safe from any thread: it keeps a small pool of clients (one per concurrent
 * caller) and its counters under a mutex.
 */
#ifndef KVT_T3_REMOTE_H
#define KVT_T3_REMOTE_H

#include "index.h"
#include "t2_store.h"

#define KVT_RC_SLOTS 16384u
#define KVT_T3_GENERATION 3u      /* the generation T3 records are sealed for (their offset is 0) */
#define KVT_T3_WRITE_MIN_MS 2000u /* the least round deadline of a write (background: never a request's wait) */

/* ------------------------------------------------------------------------ */
/* The cluster client (tiers/t3_cluster.c)                                  */
/* ------------------------------------------------------------------------ */

typedef struct kvt_rc_config {
	const char *seeds;        /* "host:port[,host:port...]" (borrowed for create) */
	bool cluster;             /* true: Redis Cluster (slot map); false: the first seed is the one server */
	const char *user;         /* AUTH user (NULL or "": "AUTH password", the default user) */
	const char *password;     /* AUTH password (NULL: no AUTH); never logged */
	uint32_t connect_timeout_ms; /* per connection attempt */
	uint32_t command_timeout_ms; /* a whole kvt_rc_run round, at most */
	uint32_t pipeline_depth;  /* commands in flight per node (>= 1) */
} kvt_rc_config;

typedef struct kvt_rc kvt_rc;

/* What a command does besides GET and SET (kvt_rc_op.verb). */
enum kvt_rc_verb {
	KVT_RC_GET_SET = 0, /* GET, or SET when val is set */
	KVT_RC_DEL = 1,     /* DEL key: KVT_OK when a key was removed, KVT_ENOTFOUND when none was there */
	KVT_RC_EXISTS = 2,  /* EXISTS key: KVT_OK when it is there, KVT_ENOTFOUND when not */
};

/* One command of a batch. */
typedef struct kvt_rc_op {
	const char *key;          /* borrowed for the call */
	size_t key_bytes;
	const void *val;          /* SET: the value (borrowed); NULL: GET */
	size_t val_bytes;
	uint32_t ttl_s;           /* SET: EX seconds (0: no expiry) */
	uint8_t verb;             /* enum kvt_rc_verb (0, the default: GET or SET; val is ignored otherwise) */
	int rc;                   /* out: KVT_OK; KVT_ENOTFOUND (GET of a missing key); KVT_EIO (node down,
				     timeout, connection lost, cluster down); KVT_EFULL (OOM); KVT_EINVAL (another error
				     reply, logged) */
	const void *data;         /* out, GET and KVT_OK: the value, valid until kvt_rc_ops_release */
	size_t data_bytes;
	void *reply_;             /* internal: the reply holding data */
	uint16_t slot_;           /* internal */
	int16_t node_;            /* internal: the node the command goes to next */
	uint8_t asking_;          /* internal: send ASKING first */
	uint8_t tries_;           /* internal: redirects followed */
} kvt_rc_op;

/*
 * Create a client and load the slot map from the first seed that answers
 * (cluster mode). A cluster no seed answers for is not an error: the client
 * is created, its commands fail with KVT_EIO until a seed answers.
 * KVT_EINVAL (logged, naming the seed) for a malformed seed list; KVT_ENOMEM.
 */
int kvt_rc_create(const kvt_rc_config *cfg, kvt_rc **out);
void kvt_rc_destroy(kvt_rc *c); /* NULL is a no-op */

/* The cluster key slot of a key (hash tags included), 0..16383. */
uint16_t kvt_rc_key_slot(const void *key, size_t n);

/*
 * Run n commands: grouped by node, pipelined, redirects followed once each.
 * Every op gets its own rc. Returns within cfg.command_timeout_ms (plus one
 * connection attempt per node that is not connected). Returns KVT_OK when
 * every op ran (any rc), KVT_ENOMEM. Release the replies with
 * kvt_rc_ops_release.
 */
int kvt_rc_run(kvt_rc *c, kvt_rc_op *ops, uint32_t n);
/* kvt_rc_run with a round deadline of timeout_ms instead of cfg.command_timeout_ms. */
int kvt_rc_run_timeout(kvt_rc *c, kvt_rc_op *ops, uint32_t n, uint32_t timeout_ms);
void kvt_rc_ops_release(kvt_rc_op *ops, uint32_t n);

/* Counters of a client (tests). */
typedef struct kvt_rc_stats {
	uint32_t n_nodes;         /* nodes known (the slot map's masters, and seeds) */
	uint64_t n_moved;         /* MOVED redirects followed */
	uint64_t n_ask;           /* ASK redirects followed */
	uint64_t n_refresh;       /* slot map loads */
	uint64_t n_connects;      /* connections opened */
	uint64_t n_rounds;        /* pipelined rounds (one per node per pass) */
} kvt_rc_stats;
void kvt_rc_get_stats(const kvt_rc *c, kvt_rc_stats *st);

/* ------------------------------------------------------------------------ */
/* The tier (tiers/t3_remote.c)                                             */
/* ------------------------------------------------------------------------ */

enum kvt_t3_write {
	KVT_T3_WRITE_THROUGH = 0, /* a turn's new blocks are written at the end of the turn (default) */
	KVT_T3_ON_DEMOTE = 1,     /* a block is written when it leaves the last local tier holding it */
};

typedef struct kvt_t3_config {
	kvt_rc_config rc;         /* how to reach the servers */
	const char *prefix;       /* key prefix (borrowed for create; default "kvt:") */
	uint32_t ttl_s;           /* EX of every record (0: none; Redis' maxmemory-policy evicts) */
	int write_policy;         /* enum kvt_t3_write */
} kvt_t3_config;

void kvt_t3_config_default(kvt_t3_config *c);

#define KVT_T3_LAT_BUCKETS 12u
/* Upper bounds of the latency histogram buckets, seconds (the last is +inf). */
extern const double kvt_t3_lat_bounds[KVT_T3_LAT_BUCKETS];

typedef struct kvt_t3_stats {
	uint64_t hits;            /* blocks asked for and served (verified) */
	uint64_t misses;          /* blocks asked for that T3 did not have (or failed to give) */
	uint64_t bytes_in;        /* record bytes read */
	uint64_t bytes_out;       /* record bytes written */
	uint64_t n_writes;        /* records written */
	uint64_t n_corrupt;       /* records that failed verification (counted misses) */
	uint64_t n_errors;        /* commands that failed: node down, timeout, OOM, error reply */
	uint64_t n_sessions_put;  /* session records written */
	uint64_t n_sessions_got;  /* session records read */
	uint64_t lat[KVT_T3_LAT_BUCKETS]; /* rounds by latency (kvt_t3_lat_bounds) */
	double lat_sum_s;         /* sum of round latencies */
	bool degraded;            /* a command failed within the last 2 s */
} kvt_t3_stats;

typedef struct kvt_t3 kvt_t3;

/*
 * Create the tier for records of the model model_fp. Connects lazily.
 * KVT_EINVAL (logged, naming the field) for a bad config; KVT_ENOMEM.
 */
int kvt_t3_create(const kvt_t3_config *cfg, const uint8_t model_fp[KVT_HASH_BYTES], kvt_t3 **out);
void kvt_t3_destroy(kvt_t3 *t); /* NULL is a no-op */
int kvt_t3_write_policy(const kvt_t3 *t);

/*
 * Read n blocks in one pipelined round per node. results[i]: KVT_OK (metas[i]
 * and payloads[i], payload_cap bytes, hold the verified record);
 * KVT_ENOTFOUND; KVT_ECORRUPT (the record failed verification: counted, a
 * miss); KVT_EIO (unreachable, timeout). stop_at_miss: the caller wants a
 * prefix, so blocks after the first that is not KVT_OK are not decoded (their
 * result is KVT_ENOTFOUND). Returns KVT_OK or KVT_ENOMEM.
 */
int kvt_t3_get_blocks(kvt_t3 *t, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], bool stop_at_miss,
		      kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results);

/* Write n records (metas[i], payloads[i] of metas[i].raw_bytes). results[i] as kvt_rc_op.rc. */
int kvt_t3_put_blocks(kvt_t3 *t, uint32_t n, const kvt_t2_block_meta *metas, const void *const *payloads,
		      int *results);
/*
 * kvt_t3_put_blocks for records given as T2 write requests (reqs[i].meta,
 * reqs[i].payload), as the record-store seam (rstore.h) passes them.
 * KVT_EINVAL (logged, no result set) when a meta cannot be a record;
 * KVT_ENOMEM; else KVT_OK with results[i] as kvt_rc_op.rc.
 */
int kvt_t3_put_records(kvt_t3 *t, uint32_t n, const kvt_t2_write_req *reqs, int *results);
/*
 * Delete the records of n blocks (DEL), or ask whether each is there (EXISTS;
 * no bytes travel, nothing is verified: a key holding a corrupt record counts
 * as there). results[i]: KVT_OK (deleted / there), KVT_ENOTFOUND, KVT_EIO
 * (unreachable, timeout). Returns KVT_OK or KVT_ENOMEM.
 */
int kvt_t3_delete_blocks(kvt_t3 *t, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int *results);
int kvt_t3_has_blocks(kvt_t3 *t, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], int *results);

/* Store / fetch a session. get: KVT_OK (*out filled; kvt_db_session_deinit it), KVT_ENOTFOUND, KVT_EIO,
 * KVT_ECORRUPT (a record that fails its checksum or names another session: counted). */
int kvt_t3_put_session(kvt_t3 *t, const kvt_db_session *s);
int kvt_t3_get_session(kvt_t3 *t, const char *tenant, const char *id, kvt_db_session *out);

void kvt_t3_get_stats(kvt_t3 *t, kvt_t3_stats *st);

/* The key of a block ("<prefix>b:<64 hex>"), for tests and tools; cap >= strlen(prefix) + 67. */
void kvt_t3_block_key(const kvt_t3 *t, const uint8_t hash[KVT_HASH_BYTES], char *out, size_t cap);

#endif
