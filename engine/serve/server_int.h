/*
 * engine/serve/server_int.h — the HTTP layer's shared structs and calls,
 * between its three files:
 *
 *   server.c  the transport: libmicrohttpd, routing, API keys, parking
 *             (suspend/resume and the pump thread), connection limits, the
 *             header deadline, generation's parse -> submit -> reply;
 *   reply.c   a generation's reply: choices, stop strings, logprobs, tool
 *             calls, usage, the JSON body and the SSE stream;
 *   admin.c   every other endpoint: health, models, metrics, stats (global
 *             and a tenant's), sessions, resume, the dashboard;
 *   anthropic.c  Anthropic's Messages API (/v1/messages, count_tokens): the
 *             body mapped onto the chat request, the reply, the SSE events
 *             and the error shape of those routes.
 *
 * Nothing here is seen outside engine/serve (server.h is the API). Every
 * call runs on an MHD worker (the access handler or a content reader), except
 * kvt_srv_wake, which any thread may call.
 */
#ifndef KVT_SERVER_INT_H
#define KVT_SERVER_INT_H

#include "request.h"
#include "server.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#define SRV_WAIT_S 0.1          /* the pump's hang-up poll period */
#define SRV_IDS_CAP 64          /* token ids fetched per kvt_sched_next */
#define SRV_PATH_MAX 256        /* path kept for the log line */
#define SRV_JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(10))
#define SRV_RID_MAX 128         /* bytes of an X-Request-Id taken from the client */

struct kvt_server {
	struct MHD_Daemon *mhd;             /* the listener and its worker pool */
	kvt_server_config cfg;              /* copy; host/keys/model_id point into this struct */
	kvt_api_key *keys;                  /* [cfg.n_keys] copies, then [cfg.n_admin_keys] admin keys */
	struct tenant_usage *usage;         /* [n_usage]: one per tenant of a key (with keys only) */
	size_t n_usage;                     /* entries of usage */
	uint32_t *key_usage;                /* [n_keys + n_admin_keys]: each key's index in usage */
	char model_id[256];                 /* cfg.model_id copy */
	char kv_dtype[16];                  /* cfg.kv_dtype copy ("f16" when none) */
	kvt_cors_origins cors;              /* cfg.cors_origins parsed (cfg.cors_origins itself is not kept) */
	_Atomic(kvt_sched *) sched;         /* NULL until set_engine */
	_Atomic(const kvt_tok *) tok;       /* with sched */
	atomic_bool draining;               /* kvt_server_drain called */
	atomic_bool stopping;               /* kvt_server_stop running: blocked loops give up */
	atomic_uint in_flight;              /* generation requests admitted, not yet finished */
	uint16_t port;                      /* bound port */
	int64_t created;                    /* start time, unix seconds (/v1/models) */
	double t_start;                     /* start time, monotonic (uptime) */
	int wake_fd;                        /* eventfd: the scheduler or a resume thread has news (kvt_srv_wake) */
	atomic_uint_fast64_t wake_seq;      /* kvt_srv_wake calls so far (a parker's lost-wake check) */
	pthread_t pump;                     /* pump_main: resumes parked connections, cuts slow headers */
	bool pump_started;                  /* pump is joinable */
	atomic_bool pump_stop;              /* pump_main returns */
	pthread_mutex_t mu;                 /* parked, parks_closed, tracks */
	struct waiter *parked;              /* suspended connections (doubly linked) */
	bool parks_closed;                  /* stopping: nothing parks any more */
	struct conn_track *tracks;          /* every open connection (header deadline, per-address limit) */
	atomic_ullong n_header_cuts;        /* connections cut at the header deadline */
	atomic_ullong n_addr_evictions;     /* waiting connections closed to make room for a newer one from their address */
	atomic_ullong n_addr_refusals;      /* new connections closed: every one of their address's had a request in flight */
	_Atomic(struct kvt_kvs *) kvs;      /* the key-value store ([store]), NULL when off (kvt_server_set_store) */
	_Atomic(struct kvt_resp *) resp;    /* its Redis-protocol listener, NULL when off */
	double t_addr_log;                  /* when the per-address limit was last logged (monotonic; under mu) */
	atomic_uint n_resume_threads;       /* session resumes running on their threads */
	atomic_uint slot_busy[KVT_SERVER_MAX_SLOTS]; /* llama API: requests running in each slot (llama_api.c) */
};

/* What one tenant's requests used (with API keys: a tenant key sees its own). */
typedef struct tenant_usage {
	char tenant[KVT_NAME_MAX + 1];      /* the tenant */
	atomic_ullong requests;             /* completions finished (each choice counts) */
	atomic_ullong prompt_tokens;        /* their prompt tokens */
	atomic_ullong cached_tokens;        /* of those, served from the cache */
	atomic_ullong completion_tokens;    /* tokens generated */
} tenant_usage;

/*
 * A connection parked until there is news (MHD_suspend_connection): a
 * generation waiting for tokens, a session resume waiting for its thread.
 * The object that waits (gen_job, resume_job) embeds it.
 */
typedef struct waiter {
	struct MHD_Connection *con;         /* the connection to suspend and resume */
	int fd;                             /* its socket (hang-up polls) */
	bool parked;                        /* in srv->parked, suspended (under srv->mu) */
	struct waiter *prev, *next;         /* srv->parked links */
} waiter;

/* One open connection, for the header deadline and the per-address limit (MHD_OPTION_NOTIFY_CONNECTION). */
typedef struct conn_track {
	int fd;                             /* the socket (shutdown at the deadline, or to make room) */
	uint8_t addr[16];                   /* the client's address: IPv4 in bytes 0-3 (an IPv4-mapped IPv6 one too), else IPv6 */
	bool v6;                            /* addr is an IPv6 address */
	double t_phase;                     /* when it began waiting for a request (monotonic) */
	bool in_headers;                    /* between accept / the last response and the end of the next request's body */
	bool cut;                           /* shut down already (deadline or limit): no longer counted */
	struct conn_track *prev, *next;     /* srv->tracks links */
} conn_track;

/* One HTTP request, from its first header callback to on_completed. */
typedef struct conn_req {
	kvt_server *srv;                    /* owner */
	struct MHD_Connection *con;         /* the connection (valid until on_completed) */
	char method[16];                    /* request method */
	char path[SRV_PATH_MAX];            /* request path (truncated), for the log */
	kvt_sbuf body;                      /* the request body so far (at most max_body_bytes) */
	bool too_large;                     /* body over max_body_bytes: answered 413 */
	bool bad_path;                      /* the path holds a control byte (%00..%1F, %7F): answered 400 */
	bool answered;                      /* a response was queued already */
	double t0;                          /* monotonic start */
	char rid[SRV_RID_MAX + 1];          /* X-Request-Id: the client's when sane (request_id_of), else generated */
	unsigned status;                    /* status sent, for the log */
	char tenant[KVT_NAME_MAX + 1];      /* tenant, once known */
	atomic_uint n_prompt, n_completion; /* tokens, for the log (a stream updates them) */
	bool admin;                         /* authenticated with an admin key */
	bool all_tenants;                   /* admin, ?tenant=*: every tenant's sessions */
	struct tenant_usage *usage;         /* the key's tenant's counters (NULL without keys) */
	struct gen_job *job;                /* a non-streaming generation parked between handler calls */
	struct resume_job *rj;              /* a non-streaming resume parked between handler calls (admin.c) */
} conn_req;

/* One choice of a completion: its scheduler request and its text. */
typedef struct gen_choice {
	kvt_sched_handle *h;        /* the scheduler request; NULL once released */
	kvt_tok_stream ds;          /* streaming UTF-8 decoder */
	kvt_sbuf text;              /* the choice's text so far (cut at a matched stop string) */
	size_t n_sent;              /* bytes of text already sent (streaming) */
	uint32_t n_tokens;          /* tokens turned into text (up to the stop match) */
	bool stop_hit;              /* a stop string matched: cancelled, text final */
	uint32_t stop_idx;          /* with stop_hit: which of q.stops matched */
	bool ended;                 /* the scheduler said why it ended; usage valid */
	int finish;                 /* KVT_FINISH_* from the scheduler once ended */
	bool role_sent;             /* chat streaming: the role delta went out */
	bool finish_sent;           /* streaming: the finish chunk went out */
	bool echo_sent;             /* streaming: the echoed prompt went out */
	json_t *lp;                 /* logprobs so far (NULL: not asked): chat, an array of content entries; completions, the logprobs object */
	size_t lp_sent;             /* streaming: entries of lp already sent */
	kvt_sched_usage usage;      /* from the scheduler once ended */
	kvt_sbuf ids;               /* llama job: the generated token ids, int32 (its "tokens") */
	size_t n_ids_sent;          /* llama stream: ids already sent in a chunk */
} gen_choice;

/* The API whose shapes a generation's reply takes (gen_job.api). */
enum kvt_srv_api {
	KVT_SRV_API_OPENAI = 0,     /* /v1/completions, /v1/chat/completions */
	KVT_SRV_API_ANTHROPIC = 1,  /* /v1/messages (anthropic.c) */
};

/* An Anthropic Messages stream's progress (anthropic.c). */
typedef struct anth_sse {
	bool started;               /* message_start went out */
	bool text_open;             /* a text block is open: index n_blocks - 1 */
	bool pinged;                /* the ping went out */
	uint32_t n_blocks;          /* content blocks started so far */
} anth_sse;

/* A completion in progress: the parsed request, its n choices, the SSE output. */
typedef struct gen_job {
	kvt_server *srv;            /* owner */
	const kvt_tok *tok;         /* the tokenizer (borrowed, the server's) */
	conn_req *req;              /* the HTTP request (for its log counters); only used while it lives */
	kvt_gen_request q;          /* the parsed request (owned): chat, stream, stops, tools, echo, cache control */
	char id[48];                /* "cmpl-..." / "chatcmpl-..." */
	char rid[SRV_RID_MAX + 1];  /* the request's X-Request-Id (for an error object in the stream) */
	int64_t created;            /* unix seconds */
	uint32_t n;                 /* choices submitted (q.n once all are) */
	gen_choice *ch;             /* [q.n] */
	waiter w;                   /* parks the connection while no tokens come */
	tenant_usage *usage;        /* the tenant's counters, added to when the job ends (NULL: none) */
	kvt_sbuf out;               /* SSE bytes not yet handed to MHD */
	size_t out_off;             /* of those, already handed */
	bool done;                  /* everything (incl. [DONE]) is in out */
	bool counted;               /* holds one in_flight count */
	bool released;              /* kvt_srv_job_release ran: no handle, no count held */
	bool llama;                 /* llama-server's POST /completion: its body and chunk shapes (llama_api.c) */
	int slot;                   /* llama: the slot whose srv->slot_busy count the job holds (-1: none) */
	int api;                    /* enum kvt_srv_api: the shape of the reply */
	anth_sse anth;              /* KVT_SRV_API_ANTHROPIC streaming: the events sent so far */
} gen_job;

/* ---- server.c ---- */

/* Requests need a key (any API key or admin key is configured). */
bool kvt_srv_auth_on(const kvt_server *srv);
/* Constant-time compare of a presented key (na bytes) with a configured one. */
bool kvt_srv_key_equal(const char *a, size_t na, const char *b);
/* The presented bearer key: an API key (its tenant) or an admin key (r->admin). False: none, or unknown. */
bool kvt_srv_authenticate(conn_req *r);
/* Take one in-flight slot; false at server.max_concurrent. */
bool kvt_srv_in_flight_take(kvt_server *srv);
/* News for parked connections (the scheduler's progress hook, resume threads). Any thread; never blocks. */
void kvt_srv_wake(void *user);
void kvt_srv_waiter_init(waiter *w, struct MHD_Connection *con);
/*
 * Park w's connection until the next news, unless there was news since
 * `seen` (a srv->wake_seq read before the caller last looked) or the server
 * is stopping. Only from the access handler or a content reader; the caller
 * then returns at once. True when parked.
 */
bool kvt_srv_park(kvt_server *srv, waiter *w, uint64_t seen);
/* Did the peer hang up? (poll for POLLRDHUP/POLLHUP/POLLERR; never reads) */
bool kvt_srv_peer_gone(int fd);
/*
 * Queue resp (the caller's reference is dropped) with what every response
 * carries: X-Request-Id, and for an allowed Origin (server.cors_origins) the
 * CORS headers. Marks r answered with status.
 */
enum MHD_Result kvt_srv_queue(conn_req *r, unsigned status, struct MHD_Response *resp);
/* Queue a response of body (malloc'd, taken), with Retry-After: 1 when retry. */
enum MHD_Result kvt_srv_reply_buf(conn_req *r, unsigned status, const char *ctype, char *body, size_t n, bool retry);
/* Queue a JSON response (v taken; NULL: a 500 "out of memory"). */
enum MHD_Result kvt_srv_reply_json(conn_req *r, unsigned status, json_t *v, bool retry);
/* The error object {"error": {message, type, param, code, request_id}} (param, code may be NULL; rid NULL: no request_id). */
json_t *kvt_srv_error_object(const char *rid, const char *type, const char *param, const char *code, const char *msg);
/* Queue an error with the status's type (401, 403, 5xx, else invalid_request_error); 503 adds Retry-After. */
enum MHD_Result kvt_srv_reply_error(conn_req *r, unsigned status, const char *param, const char *code, const char *fmt,
				    ...) __attribute__((format(printf, 5, 6)));
/* Queue a refused request's error: e's param, code ("" = null) and message, with status. */
enum MHD_Result kvt_srv_reply_req_error(conn_req *r, unsigned status, const kvt_req_err *e);
/* The limits a generation request is checked against (the model's, the configuration's). */
kvt_req_limits kvt_srv_req_limits(const kvt_server *srv, kvt_sched *sched);
/* A job whose request j->q is parsed: owner, connection, reply shape (enum kvt_srv_api), id (id_prefix + hex). */
void kvt_srv_job_init(conn_req *r, const kvt_tok *tok, const char *id_prefix, int api, gen_job *j);
/* Run an initialised job (taken): in-flight slot, submit, then the stream or the parked reply. */
enum MHD_Result kvt_srv_gen_start(conn_req *r, kvt_sched *sched, gen_job *j);

/* A generation's body is llama-server's POST /completion (kvt_srv_generate's llama_slot): no slot, or none at all. */
#define KVT_SRV_LLAMA_NO_SLOT (-1)
#define KVT_SRV_NOT_LLAMA (-2)
/*
 * POST /v1/completions, /v1/chat/completions (llama_slot KVT_SRV_NOT_LLAMA),
 * and llama-server's /completion, whose body llama_api.c has rewritten into
 * r->body as a /v1/completions one (llama_slot: its slot, or
 * KVT_SRV_LLAMA_NO_SLOT): parse, submit, reply.
 */
enum MHD_Result kvt_srv_generate(conn_req *r, kvt_sched *sched, const struct kvt_tok *tok, bool chat, int llama_slot);

/* ---- reply.c ---- */

/* Give back what the job holds in the engine (handles, in-flight count, usage to the tenant). Once. */
void kvt_srv_job_release(gen_job *j);
/* Release and free the job; NULL is a no-op. */
void kvt_srv_job_free(gen_job *j);
/*
 * A non-streaming generation (r->job), each time MHD runs its connection:
 * take what the scheduler has; park until news while a choice runs; answer
 * once all ended. Frees the job unless it parked.
 */
enum MHD_Result kvt_srv_gen_continue(conn_req *r);
/* A streaming generation: queue the SSE response, which takes the job. */
enum MHD_Result kvt_srv_gen_stream(conn_req *r, gen_job *j);
/* For anthropic.c: what reply.c knows of a choice and a job. */
bool kvt_srv_choice_failed(const gen_choice *c);
void kvt_srv_choice_failure(const gen_choice *c, unsigned *status, const char **type, const char **code,
			    const char **msg);
uint32_t kvt_srv_choice_completion_tokens(const gen_choice *c);
/* Bytes at the end of text that could be the start of a stop string (held back while streaming). */
size_t kvt_srv_stop_holdback(const gen_job *j, const char *text, size_t n);
bool kvt_srv_job_all_ended(const gen_job *j);
/* The OpenAI usage object of the job (its "kvtier" member is Anthropic's usage.kvtier too). */
json_t *kvt_srv_usage_json(const gen_job *j);

/* ---- anthropic.c ---- */

/*
 * A Messages body (borrowed) into q, pure as request.h's steps are (and
 * through them): mapped onto a chat body, parsed, its prompt built, the
 * system-turn breakpoint added. for_count: count_tokens' body (max_tokens
 * and model optional). KVT_OK; KVT_EINVAL with e naming the Messages field;
 * KVT_ENOMEM. q->sched.tenant as kvt_gen_request_parse leaves it. Deinit q
 * whatever the result.
 */
int kvt_anth_request(const kvt_req_limits *lim, const kvt_tok *tok, json_t *body, bool for_count,
		     kvt_gen_request *q, kvt_req_err *e);

/* POST /v1/messages: the body mapped onto the chat request, then generated as /v1/chat/completions is. */
enum MHD_Result kvt_srv_handle_messages(conn_req *r, kvt_sched *sched, const kvt_tok *tok);
/* POST /v1/messages/count_tokens: {"input_tokens": N}, the prompt the template makes. */
enum MHD_Result kvt_srv_handle_count_tokens(conn_req *r, kvt_sched *sched, const kvt_tok *tok);
/* Is r on one of Anthropic's routes (/v1/messages and below)? Their errors take Anthropic's shape. */
bool kvt_srv_anth_route(const conn_req *r);
/*
 * An error body of ours (v, taken) in Anthropic's shape, {"type": "error",
 * "error": {"type", "message"}, "request_id"}; *status becomes Anthropic's
 * (503 -> 529 overloaded_error). Returns the new body (NULL: out of memory).
 */
json_t *kvt_srv_anth_error(const conn_req *r, json_t *v, unsigned *status);
/* The non-streaming Messages body of an ended job. */
json_t *kvt_srv_anth_result(gen_job *j);
/* Move what can be sent now into Anthropic's SSE events (j->out); the closing events once all ended. */
void kvt_srv_anth_sse_emit(gen_job *j);
/* The engine failed mid-stream: an error event, then the stream ends (j->done). */
void kvt_srv_anth_sse_fail(gen_job *j, const char *msg);

/* ---- admin.c ---- */

enum MHD_Result kvt_srv_handle_health(conn_req *r);
enum MHD_Result kvt_srv_handle_models(conn_req *r);
enum MHD_Result kvt_srv_handle_model(conn_req *r, const char *id);
enum MHD_Result kvt_srv_handle_metrics(conn_req *r, kvt_sched *sched);
enum MHD_Result kvt_srv_handle_stats(conn_req *r, kvt_sched *sched);
enum MHD_Result kvt_srv_handle_tenant_stats(conn_req *r, kvt_sched *sched);
struct kvt_sbuf;
/* store_stats.c: the kvtier_store_* families (nothing when the store is off). */
void kvt_srv_metrics_store(kvt_server *srv, struct kvt_sbuf *b);
/* store_stats.c: /v1/stats' "store" object (tenant NULL: every row and the totals; else that tenant's row); null when off. */
json_t *kvt_srv_stats_store(kvt_server *srv, const char *tenant);
enum MHD_Result kvt_srv_handle_sessions(conn_req *r, kvt_sched *sched);
enum MHD_Result kvt_srv_handle_session_delete(conn_req *r, kvt_sched *sched, const char *id);
enum MHD_Result kvt_srv_handle_resume(conn_req *r, kvt_sched *sched, const char *id);
enum MHD_Result kvt_srv_handle_dashboard(conn_req *r);
/* A non-streamed resume (r->rj), each time MHD runs its connection: park until the report is in, then answer. */
enum MHD_Result kvt_srv_resume_continue(conn_req *r);
/* Drop one reference to a resume job (the last frees it and gives back its in-flight count). */
void kvt_srv_resume_unref(struct resume_job *rj);

/* ---- llama_api.c: llama-server's native endpoints ---- */

/* A llama-server route: 0 none, 1 GET (/props, /slots), 2 POST (/completion, /tokenize, /detokenize, /apply-template, /slots/{id}). */
int kvt_llama_route(const char *path);
/* Answer a llama-server route (kvt_llama_route said it is one, the method and key are checked). */
enum MHD_Result kvt_llama_handle(conn_req *r, kvt_sched *sched, const struct kvt_tok *tok);
/* llama-server's "timings" of a finished request (prompt_*, predicted_*, cache_n). */
json_t *kvt_llama_timings(const kvt_sched_usage *u);
/* The llama job's non-streaming body (content, stop_type, tokens_*, timings, ...). */
json_t *kvt_llama_result(gen_job *j);
/* One SSE chunk of a llama job: {"content", "stop": false, ...}; with finish, the final one (stop: true, timings). */
json_t *kvt_llama_chunk(gen_job *j, uint32_t i, const char *text, size_t n, const char *finish);

/* usage.kvtier.miss: why the cached prefix ended (reply.c; NULL on a full hit or with the cache off). */
json_t *kvt_srv_miss_json(const kvt_sched_usage *u);

/* ---- sessions_snapshot.c: slot snapshots (llama-server's slot save / restore) ---- */

typedef struct kvt_slot_io {
	uint32_t n_tokens;          /* tokens of the slot's history saved or restored */
	uint32_t n_blocks;          /* KV blocks in the file */
	uint64_t n_bytes;           /* bytes written or read */
} kvt_slot_io;
/*
 * Save session id (tenant's) to path: its token history and the records of
 * the leading blocks the tiers hold; no session is an empty slot (0 tokens).
 * KVT_OK with *out; else err (cap bytes) says why (KVT_EIO, KVT_ENOMEM, the
 * tiers' read errors).
 */
int kvt_slot_save(kvt_sched *s, const char *tenant, const char *id, const char *path, kvt_slot_io *out, char *err,
		  size_t cap);
/*
 * Restore path into session id: verify (KVT_ECORRUPT: not a slot file,
 * damaged, altered; KVT_EINVAL: another model, block size or layout;
 * KVT_ENOTFOUND: no file), enter the blocks into the tiers under this
 * daemon's chain, write the session row. KVT_OK with *out; else err says why.
 */
int kvt_slot_restore(kvt_sched *s, const char *tenant, const char *id, const char *path, kvt_slot_io *out,
		     char *err, size_t cap);
/* Tokens of session id's history (0 when there is none). KVT_OK, or the index's error. */
int kvt_slot_tokens(kvt_sched *s, const char *tenant, const char *id, uint32_t *n_tokens);

#endif
