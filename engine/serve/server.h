/*
 * engine/serve/server.h — kvtierd's HTTP API (OpenAI-compatible, plus kvtier's
 * session, statistics and health endpoints) on libmicrohttpd, JSON through
 * jansson. The wire format is specified in docs/http-api.md.
 *
 * The server starts before the model is loaded: /health answers 503
 * ("loading") and every other route 503 until kvt_server_set_engine.
 *
 * Threads: a fixed pool of workers (epoll) serves every connection; nothing
 * waits on a worker. A request waiting for tokens or for a session resume
 * parks its connection (suspended) and the server's pump thread resumes it
 * when the scheduler has news, so a slow or idle client costs a connection
 * slot, not a thread. Slow clients are bounded by a global connection limit
 * (over it a new connection is closed at once), a per-address one (at it, the
 * address's connection that has waited longest for a request is closed to
 * make room; one with a request in flight never is), a header deadline and
 * an idle timeout. A client that went away is noticed within 0.1 s and its
 * request cancelled.
 */
#ifndef KVT_SERVER_H
#define KVT_SERVER_H

#include "scheduler.h"

struct kvt_tok;

typedef struct kvt_api_key {
	char tenant[KVT_NAME_MAX + 1]; /* the tenant requests with this key belong to */
	char key[256];                 /* the bearer token */
} kvt_api_key;

/* [cache] chunk_reuse: which spans of a chat prompt are reused at any position (docs/http-api.md, "Chunk reuse"). */
enum kvt_chunk_reuse {
	KVT_CHUNK_REUSE_OFF = 0,    /* markers are checked, then ignored: no spans */
	KVT_CHUNK_REUSE_MARKED = 1, /* the spans marked "kvtier": {"reuse": "anywhere"} (the config's default) */
	KVT_CHUNK_REUSE_TOOLS = 2,  /* those, plus the content of every role "tool" message */
};

typedef struct kvt_server_config {
	const char *host;              /* listen address, e.g. "127.0.0.1" (numeric IPv4 or IPv6) */
	uint16_t port;                 /* 0: an ephemeral port (read it with kvt_server_port) */
	const kvt_api_key *keys;       /* [n_keys]; no keys and no admin keys: no auth, tenant from "user" (else "default") */
	size_t n_keys;
	const kvt_api_key *admin_keys; /* [n_admin_keys]: keys that also see every tenant (global stats, other tenants' sessions) */
	size_t n_admin_keys;
	bool metrics_admin;            /* /metrics needs an admin key (else it is open to all) */
	uint32_t threads;              /* worker threads serving every connection (default 4) */
	uint32_t max_connections;      /* open connections, all clients together (default 1024); beyond: closed */
	uint32_t max_connections_per_ip; /* open connections from one address (default 64; 0: no limit); at it, its longest-waiting one without a request in flight is closed */
	double header_timeout_s;       /* from accept (or the last response) to the end of the next request (headers and body; default 15; 0: none) */
	uint32_t max_concurrent;       /* requests being generated or queued at once; beyond: 503 + Retry-After (default 32) */
	size_t max_header_bytes;       /* request line + headers (default 16 KiB) */
	size_t max_body_bytes;         /* request body (default 1 MiB): 413 beyond */
	uint32_t max_tokens_limit;     /* largest max_tokens accepted (default 4096) */
	uint32_t max_n;                /* largest n accepted (default 4) */
	uint32_t default_max_tokens;   /* max_tokens when absent (default 256) */
	int chunk_reuse;               /* enum kvt_chunk_reuse: chat spans for chunk reuse (default marked) */
	uint32_t chunk_min_tokens;     /* a span with fewer tokens is ordinary text (default 64; 0: none is) */
	double request_timeout_s;      /* idle connection timeout: no byte either way for this long (default 600; 0: none) */
	const char *model_id;          /* id reported by /v1/models and in responses */
	const char *kv_dtype;          /* T1/T2 record format for /v1/stats ("f16", "fp8", "int8"); NULL: "f16" */
	const char *cors_origins;      /* origins allowed cross-origin requests, comma/space separated (kvt_server_cors_parse); NULL or "": none */
	/* llama-server's native API (engine/serve/llama_api.c) */
	const char *model_path;        /* the model file as configured (GET /props model_path); borrowed, must outlive the server; NULL: model_id */
	const char *build_info;        /* GET /props build_info; borrowed (static); NULL: "kvtier" */
	uint32_t n_slots;              /* slots the slot API exposes, 1..KVT_SERVER_MAX_SLOTS (--parallel; default 1) */
	const char *slot_save_path;    /* directory of slot files (--slot-save-path); borrowed; NULL or "": save/restore refused */
} kvt_server_config;

#define KVT_SERVER_MAX_SLOTS 256       /* server.parallel at most */

void kvt_server_config_default(kvt_server_config *c);

#define KVT_SERVER_CORS_MAX 16         /* origins in server.cors_origins */
#define KVT_SERVER_ORIGIN_MAX 255      /* bytes of one origin */

/* The origins server.cors_origins allows (kvt_server_cors_parse). */
typedef struct kvt_cors_origins {
	char origin[KVT_SERVER_CORS_MAX][KVT_SERVER_ORIGIN_MAX + 1]; /* [n]: scheme://host[:port], as configured */
	uint32_t n;                    /* origins */
} kvt_cors_origins;

/*
 * Parse server.cors_origins: origins separated by commas and/or spaces, each
 * http:// or https:// + a host ([A-Za-z0-9.-], or an [IPv6] literal) +
 * optionally :port (1-65535), nothing after (no path, no '/'); at most
 * KVT_SERVER_CORS_MAX of at most KVT_SERVER_ORIGIN_MAX bytes. '*' and "null"
 * are refused (every site, every sandboxed page: an origin must be named).
 * out (NULL: only check) gets them. KVT_OK, or KVT_EINVAL with why (cap
 * bytes) naming the item and what is wrong with it.
 */
int kvt_server_cors_parse(const char *list, kvt_cors_origins *out, char *why, size_t why_cap);

typedef struct kvt_server kvt_server;

/* Bind and start serving (503 everywhere until set_engine). KVT_EINVAL, KVT_EIO (bind failed: logged). */
int kvt_server_start(const kvt_server_config *cfg, kvt_server **out);
uint16_t kvt_server_port(const kvt_server *srv);
/* The engine is ready: borrowed, must outlive the server (or kvt_server_stop first). */
void kvt_server_set_engine(kvt_server *srv, kvt_sched *sched, const struct kvt_tok *tok);
struct kvt_kvs;
struct kvt_resp;
/*
 * The key-value store and its Redis-protocol listener ([store]), for
 * /metrics, /v1/stats and the dashboard: borrowed, must outlive the server
 * (stop the server before closing them). NULL, NULL: none.
 */
void kvt_server_set_store(kvt_server *srv, struct kvt_kvs *kvs, struct kvt_resp *resp);
/* Refuse new work with 503 (health says "draining"); in-flight requests go on. */
void kvt_server_drain(kvt_server *srv);
/* Requests in flight now. */
uint32_t kvt_server_in_flight(kvt_server *srv);
/* Close the listener and every connection; frees. NULL is a no-op. */
void kvt_server_stop(kvt_server *srv);

#endif
