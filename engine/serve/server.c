/*
 * engine/serve/server.c — kvtierd's HTTP layer: libmicrohttpd in thread-per-
 * connection mode, JSON through jansson, the wire format of docs/http-api.md.
 *
 * Design. Every connection has its own thread (MHD_USE_THREAD_PER_CONNECTION),
 * so a handler may block: a non-streaming completion submits its requests to
 * the scheduler and loops on kvt_sched_next (0.1 s at a time) on the
 * connection thread, polling the connection's socket for a hang-up between
 * waits (POLLRDHUP/POLLHUP/POLLERR: the request is cancelled). A streaming
 * completion is a callback response whose content reader does the same loop
 * and formats SSE chunks; when the client goes away the reader notices it (or
 * MHD does, on a failed send) and the response's free callback cancels and
 * releases the handles. A streamed session resume runs on a producer thread
 * whose progress lines the content reader hands out (NDJSON).
 *
 * Request life: MHD calls on_request once with no body (a conn_req is made;
 * a Content-Length over max_body_bytes is answered 413 at once), then with
 * each body piece (accumulated up to max_body_bytes, the rest discarded and
 * answered 413), then once more to answer. on_completed logs one INFO line
 * (method, path, status, tenant, tokens, ms) and frees the conn_req. Checks
 * run in this order: body size (413), route (404), method (405), API key
 * (401), engine loaded / draining (503), JSON and fields (400), capacity
 * (503 + Retry-After).
 *
 * Invariants:
 *  - every handle submitted is released exactly once: by the handler
 *    (non-streaming) or by the response's free callback (streaming); the
 *    in-flight count is taken before submit and given back after release;
 *  - text that could be the start of a stop string is never sent (held back
 *    until it cannot be); a matched stop string cancels its request and is
 *    cut from the text with everything after it;
 *  - every response carries a Content-Type; every error is the JSON error
 *    object with the status of the table in docs/http-api.md.
 */
#define _GNU_SOURCE /* POLLRDHUP, memmem */
#include "server.h"

#include "cachectl.h"
#include "dashboard.h"

#include "index.h"
#include "structured.h"
#include "tokenizer.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <openssl/evp.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SRV_WAIT_S 0.1          /* one kvt_sched_next wait; also the hang-up poll period */
#define SRV_IDS_CAP 64          /* token ids fetched per kvt_sched_next */
#define SRV_MAX_STOPS 4         /* stop strings per request */
#define SRV_PATH_MAX 256        /* path kept for the log line */
#define SRV_USER_MAX 256        /* bytes of a request's `user` (OpenAI's limit) */
#define SRV_JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(10))

struct kvt_server {
	struct MHD_Daemon *mhd;             /* the listener and its connection threads */
	kvt_server_config cfg;              /* copy; host/keys/model_id point into this struct */
	kvt_api_key *keys;                  /* [cfg.n_keys] copies, then [cfg.n_admin_keys] admin keys */
	struct tenant_usage *usage;         /* [n_usage]: one per tenant of a key (with keys only) */
	size_t n_usage;
	uint32_t *key_usage;                /* [n_keys + n_admin_keys]: each key's index in usage */
	char model_id[256];                 /* cfg.model_id copy */
	char kv_dtype[16];                  /* cfg.kv_dtype copy ("f16" when none) */
	_Atomic(kvt_sched *) sched;         /* NULL until set_engine */
	_Atomic(const kvt_tok *) tok;       /* with sched */
	atomic_bool draining;               /* kvt_server_drain called */
	atomic_bool stopping;               /* kvt_server_stop running: blocked loops give up */
	atomic_uint in_flight;              /* generation requests admitted, not yet finished */
	uint16_t port;                      /* bound port */
	int64_t created;                    /* start time, unix seconds (/v1/models) */
	double t_start;                     /* start time, monotonic (uptime) */
	int wake_fd;                        /* eventfd: the scheduler or a resume thread has news (srv_wake) */
	atomic_uint_fast64_t wake_seq;      /* srv_wake calls so far (a parker's lost-wake check) */
	pthread_t pump;                     /* pump_main: resumes parked connections, cuts slow headers */
	bool pump_started;                  /* pump is joinable */
	atomic_bool pump_stop;              /* pump_main returns */
	pthread_mutex_t mu;                 /* parked, parks_closed, tracks */
	struct waiter *parked;              /* suspended connections (doubly linked) */
	bool parks_closed;                  /* stopping: nothing parks any more */
	struct conn_track *tracks;          /* every open connection (header deadline) */
	atomic_ullong n_header_cuts;        /* connections cut at the header deadline */
	atomic_uint n_resume_threads;       /* session resumes running on their threads */
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

/* One open connection, for the header deadline (MHD_OPTION_NOTIFY_CONNECTION). */
typedef struct conn_track {
	int fd;                             /* the socket (shutdown at the deadline) */
	double t_phase;                     /* when it began waiting for a request (monotonic) */
	bool in_headers;                    /* between accept / the last response and the end of the next request's body */
	bool cut;                           /* shut down at the deadline already */
	struct conn_track *prev, *next;     /* srv->tracks links */
} conn_track;

/* One HTTP request, from its first header callback to on_completed. */
typedef struct conn_req {
	kvt_server *srv;                    /* owner */
	struct MHD_Connection *con;         /* the connection (valid until on_completed) */
	char method[16];                    /* request method */
	char path[SRV_PATH_MAX];            /* request path (truncated), for the log */
	char *body;                         /* [n_body + 1] NUL-terminated body, malloc'd */
	size_t n_body, cap_body;            /* bytes held, bytes allocated */
	bool too_large;                     /* body over max_body_bytes: answered 413 */
	bool bad_path;                      /* the path holds a control byte (%00..%1F, %7F): answered 400 */
	bool answered;                      /* a response was queued already */
	double t0;                          /* monotonic start */
	unsigned status;                    /* status sent, for the log */
	char tenant[KVT_NAME_MAX + 1];      /* tenant, once known */
	atomic_uint n_prompt, n_completion; /* tokens, for the log (a stream updates them) */
	bool admin;                         /* authenticated with an admin key */
	bool all_tenants;                   /* admin, ?tenant=*: every tenant's sessions */
	struct tenant_usage *usage;         /* the key's tenant's counters (NULL without keys) */
	struct gen_job *job;                /* a non-streaming generation parked between handler calls */
	struct resume_job *rj;              /* a non-streaming resume parked between handler calls */
} conn_req;

/* ------------------------------------------------------------------------ */
/* small helpers                                                              */

void kvt_server_config_default(kvt_server_config *c)
{
	memset(c, 0, sizeof(*c));
	c->host = "127.0.0.1";
	c->port = 8080;
	c->threads = 4;
	c->max_connections = 1024;
	c->max_connections_per_ip = 64;
	c->header_timeout_s = 15;
	c->max_concurrent = 32;
	c->max_header_bytes = 16 << 10;
	c->max_body_bytes = 1 << 20;
	c->max_tokens_limit = 4096;
	c->max_n = 4;
	c->default_max_tokens = 256;
	c->request_timeout_s = 600;
	c->model_id = "kvtier";
}

static const char *tier_name[KVT_TM_N_TIERS] = { "hbm", "host", "nvme", "remote" };

/* Requests need a key (any API key or admin key is configured). */
static bool auth_on(const kvt_server *srv)
{
	return srv->cfg.n_keys + srv->cfg.n_admin_keys > 0;
}

/* Random lowercase hex (n_bytes random bytes -> 2 * n_bytes chars + NUL). */
static void random_hex(char *out, size_t n_bytes)
{
	uint8_t b[32];
	if (n_bytes > sizeof(b))
		n_bytes = sizeof(b);
	size_t got = 0;
	while (got < n_bytes) {
		ssize_t r = getrandom(b + got, n_bytes - got, 0);
		if (r <= 0) { /* no entropy source: fall back to the clock (ids need only be unique) */
			uint64_t t = kvt_wall_us() ^ ((uint64_t)(uintptr_t)out << 17);
			for (; got < n_bytes; got++, t = t * 6364136223846793005ULL + 1442695040888963407ULL)
				b[got] = (uint8_t)(t >> 56);
			break;
		}
		got += (size_t)r;
	}
	for (size_t i = 0; i < n_bytes; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
	out[2 * n_bytes] = 0;
}

static uint64_t random_u64(void)
{
	uint64_t v = 0;
	if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
		v = kvt_wall_us() * 0x9E3779B97F4A7C15ULL;
	return v;
}

/* A growable byte string for text bodies (metrics, SSE chunks). */
typedef struct sbuf {
	char *p;      /* [cap] bytes, NUL-terminated at n */
	size_t n;     /* bytes held */
	size_t cap;   /* bytes allocated */
	bool failed;  /* an allocation failed: the content is incomplete */
} sbuf;

static bool sbuf_reserve(sbuf *b, size_t more)
{
	if (b->failed)
		return false;
	if (b->n + more + 1 <= b->cap)
		return true;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < b->n + more + 1)
		cap *= 2;
	char *p = realloc(b->p, cap);
	if (!p) {
		b->failed = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

static void sbuf_add(sbuf *b, const char *s, size_t n)
{
	if (!sbuf_reserve(b, n))
		return;
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

static void sbuf_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sbuf_printf(sbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || !sbuf_reserve(b, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->n += (size_t)n;
}

/* Did the peer hang up? (thread-per-connection: nobody else reads this socket now) */
static bool peer_gone(int fd)
{
	if (fd < 0)
		return false;
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };
	if (poll(&p, 1, 0) <= 0)
		return false;
	return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static int conn_fd(struct MHD_Connection *con)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
	return ci ? (int)ci->connect_fd : -1;
}

/* ------------------------------------------------------------------------ */
/* parking: waiting without a thread                                          */

/* News for parked connections (the scheduler's progress hook, resume threads). Any thread; never blocks. */
static void srv_wake(void *user)
{
	kvt_server *srv = user;
	atomic_fetch_add(&srv->wake_seq, 1);
	uint64_t one = 1;
	if (write(srv->wake_fd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is saturated, the pump wakes anyway */
	}
}

static void waiter_init(waiter *w, struct MHD_Connection *con)
{
	memset(w, 0, sizeof(*w));
	w->con = con;
	w->fd = conn_fd(con);
}

/* Under srv->mu: take w off the parked list and let MHD run its connection again. */
static void unpark_locked(kvt_server *srv, waiter *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else
		srv->parked = w->next;
	if (w->next)
		w->next->prev = w->prev;
	w->prev = w->next = NULL;
	w->parked = false;
	MHD_resume_connection(w->con);
}

/*
 * Park w's connection until the next news, unless there was news since
 * `seen` (a srv->wake_seq read before the caller last looked: it must look
 * again) or the server is stopping. Only from the access handler or a
 * content reader (MHD's rule for MHD_suspend_connection); the caller then
 * returns at once (MHD_YES, or 0 bytes from a reader). True when parked.
 */
static bool park(kvt_server *srv, waiter *w, uint64_t seen)
{
	pthread_mutex_lock(&srv->mu);
	bool ok = !srv->parks_closed && atomic_load(&srv->wake_seq) == seen;
	if (ok) {
		w->prev = NULL;
		w->next = srv->parked;
		if (srv->parked)
			srv->parked->prev = w;
		srv->parked = w;
		w->parked = true;
		MHD_suspend_connection(w->con);
	}
	pthread_mutex_unlock(&srv->mu);
	return ok;
}

/*
 * The pump: on news, resumes every parked connection (each looks and parks
 * again if its news was not for it); every SRV_WAIT_S, resumes the parked
 * ones whose client hung up (they cancel) and shuts down the sockets of
 * connections past the header deadline (MHD then closes them).
 */
static void *pump_main(void *arg)
{
	kvt_server *srv = arg;
	double last_sweep = kvt_now_s();
	while (!atomic_load(&srv->pump_stop)) {
		struct pollfd p = { .fd = srv->wake_fd, .events = POLLIN };
		bool news = poll(&p, 1, (int)(SRV_WAIT_S * 1000)) > 0 && (p.revents & POLLIN);
		if (news) {
			uint64_t v;
			if (read(srv->wake_fd, &v, sizeof(v)) < 0)
				news = false;
		}
		double now = kvt_now_s();
		bool sweep = now - last_sweep >= SRV_WAIT_S;
		if (sweep)
			last_sweep = now;
		if (!news && !sweep)
			continue;
		unsigned cut = 0;
		pthread_mutex_lock(&srv->mu);
		for (waiter *w = srv->parked, *next; w; w = next) {
			next = w->next;
			if (news || peer_gone(w->fd))
				unpark_locked(srv, w);
		}
		if (sweep && srv->cfg.header_timeout_s > 0)
			for (conn_track *t = srv->tracks; t; t = t->next)
				if (t->in_headers && !t->cut && now - t->t_phase > srv->cfg.header_timeout_s) {
					shutdown(t->fd, SHUT_RDWR); /* MHD sees the end and closes the connection */
					t->cut = true;
					cut++;
				}
		pthread_mutex_unlock(&srv->mu);
		if (cut) {
			atomic_fetch_add(&srv->n_header_cuts, cut);
			KVT_LOGI("http: %u connection(s) sent no complete request within server.header_timeout (%.0f s): closed",
				 cut, srv->cfg.header_timeout_s);
		}
	}
	return NULL;
}

static conn_track *track_of(struct MHD_Connection *con)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	return ci ? ci->socket_context : NULL;
}

/* A connection's request headers are in (false), or it waits for the next request (true). */
static void track_phase(kvt_server *srv, struct MHD_Connection *con, bool in_headers)
{
	conn_track *t = track_of(con);
	if (!t)
		return;
	pthread_mutex_lock(&srv->mu);
	t->in_headers = in_headers;
	t->t_phase = kvt_now_s();
	pthread_mutex_unlock(&srv->mu);
}

/* MHD_OPTION_NOTIFY_CONNECTION: every connection is tracked from accept to close. */
static void on_connection(void *cls, struct MHD_Connection *con, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	kvt_server *srv = cls;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		conn_track *t = calloc(1, sizeof(*t));
		if (!t)
			return; /* untracked: no header deadline for this one */
		t->fd = conn_fd(con);
		t->in_headers = true;
		t->t_phase = kvt_now_s();
		pthread_mutex_lock(&srv->mu);
		t->next = srv->tracks;
		if (srv->tracks)
			srv->tracks->prev = t;
		srv->tracks = t;
		pthread_mutex_unlock(&srv->mu);
		*socket_context = t;
		return;
	}
	conn_track *t = *socket_context;
	if (!t)
		return;
	/* NOTE: MHD closes the socket after this returns, so the pump never shuts down a reused fd */
	pthread_mutex_lock(&srv->mu);
	if (t->prev)
		t->prev->next = t->next;
	else
		srv->tracks = t->next;
	if (t->next)
		t->next->prev = t->prev;
	pthread_mutex_unlock(&srv->mu);
	free(t);
	*socket_context = NULL;
}

/* ------------------------------------------------------------------------ */
/* responses                                                                  */

static enum MHD_Result reply_buf(conn_req *r, unsigned status, const char *ctype, char *body, size_t n, bool retry)
{
	struct MHD_Response *resp = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
	if (retry)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED) {
		const char *allow = !strcmp(r->path, "/v1/completions") || !strcmp(r->path, "/v1/chat/completions") ||
					    strstr(r->path, "/resume") ?
				    "POST" :
			    !strncmp(r->path, "/v1/sessions/", 13) ? "DELETE" :
								     "GET, HEAD";
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
	}
	r->status = status;
	r->answered = true;
	enum MHD_Result ret = MHD_queue_response(r->con, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* Send a JSON value (stolen). */
static enum MHD_Result reply_json(conn_req *r, unsigned status, json_t *v, bool retry)
{
	char *s = v ? json_dumps(v, SRV_JSON_FLAGS) : NULL;
	json_decref(v);
	if (!s) {
		static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
					  "\"param\":null,\"code\":null}}";
		char *c = strdup(oom);
		return c ? reply_buf(r, 500, "application/json", c, strlen(c), false) : MHD_NO;
	}
	return reply_buf(r, status, "application/json", s, strlen(s), retry);
}

static json_t *error_object(const char *type, const char *param, const char *code, const char *msg)
{
	return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", msg, "type", type, "param", param, "code",
			 code);
}

/*
 * Make s valid UTF-8 in place: every byte that does not belong to a
 * well-formed sequence (RFC 3629: no overlong forms, no surrogates, nothing
 * above U+10FFFF; a sequence cut short by the end) becomes '?'.
 */
static void utf8_scrub(char *s)
{
	unsigned char *p = (unsigned char *)s;
	while (*p) {
		unsigned c = p[0];
		size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
		bool ok = n > 0;
		for (size_t i = 1; ok && i < n; i++)
			ok = (p[i] & 0xc0) == 0x80;
		if (ok && n > 1) {
			uint32_t cp = c & (0x7f >> n);
			for (size_t i = 1; i < n; i++)
				cp = cp << 6 | (p[i] & 0x3f);
			static const uint32_t min_of[5] = { 0, 0, 0x80, 0x800, 0x10000 };
			ok = cp >= min_of[n] && cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
		}
		if (!ok) {
			*p++ = '?';
			continue;
		}
		p += n;
	}
}

static enum MHD_Result reply_error(conn_req *r, unsigned status, const char *param, const char *code,
				   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result reply_error(conn_req *r, unsigned status, const char *param, const char *code,
				   const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	utf8_scrub(msg); /* messages quote the client's bytes (a path, an id): JSON strings must be UTF-8 */
	const char *type = status == 401 ? "authentication_error" : status == 403 ? "permission_error" :
			   status >= 500 ? "server_error" : "invalid_request_error";
	return reply_json(r, status, error_object(type, param, code, msg), status == 503);
}

/* ------------------------------------------------------------------------ */
/* request fields                                                             */

/*
 * Field validation: each getter returns 0 and sets *out (left alone when the
 * field is absent or null), or writes a message naming the field to err and
 * returns -1. The caller answers 400 with param = the field.
 */
typedef struct field_err {
	char param[64];   /* the field at fault */
	char msg[400];    /* what was wrong */
} field_err;

static int fail(field_err *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(field_err *e, const char *param, const char *fmt, ...)
{
	snprintf(e->param, sizeof(e->param), "%s", param);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	return -1;
}

/*
 * A JSON number that is a whole number: an integer, or a real with no
 * fraction within long long's range ("max_tokens": 2.0 is 2, as OpenAI takes it).
 */
static bool json_whole(const json_t *v, long long *out)
{
	if (json_is_integer(v)) {
		*out = json_integer_value(v);
		return true;
	}
	if (!json_is_real(v))
		return false;
	double d = json_real_value(v);
	if (!(d >= -0x1p63 && d < 0x1p63) || d != floor(d))
		return false;
	*out = (long long)d;
	return true;
}

static int get_int(json_t *o, const char *key, long long lo, long long hi, long long *out, field_err *e)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	long long x;
	if (!json_whole(v, &x))
		return fail(e, key, "'%s' must be an integer", key);
	if (x < lo || x > hi)
		return fail(e, key, "'%s' must be in [%lld, %lld] (got %lld)", key, lo, hi, x);
	*out = x;
	return 0;
}

static int get_num(json_t *o, const char *key, double *out, field_err *e)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v))
		return fail(e, key, "'%s' must be a number", key);
	*out = json_number_value(v);
	return 0;
}

static int get_bool(json_t *o, const char *key, bool *out, field_err *e)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_boolean(v))
		return fail(e, key, "'%s' must be a boolean", key);
	*out = json_is_true(v);
	return 0;
}

/* A string field; *n_out (when not NULL) gets its length, which counts any NUL bytes in it. */
static int get_str(json_t *o, const char *key, const char **out, size_t *n_out, field_err *e)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return fail(e, key, "'%s' must be a string", key);
	*out = json_string_value(v);
	if (n_out)
		*n_out = json_string_length(v);
	return 0;
}

/*
 * The request body as a JSON object, or NULL with *ret the 400 sent. Strings
 * may hold \u0000 (OpenAI's schema allows it; json_string_length has their
 * length). An integer beyond 64 bits (in a field kvtier ignores, such as
 * metadata) makes the whole body parse again with every integer read as a
 * real: the fields kvtier reads take whole reals (json_whole), and only a
 * seed beyond 2^53 then loses precision.
 */
static json_t *load_body(conn_req *r, enum MHD_Result *ret)
{
	json_error_t jerr;
	const size_t flags = JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL;
	json_t *body = json_loadb(r->body ? r->body : "", r->n_body, flags, &jerr);
	if (!body && json_error_code(&jerr) == json_error_numeric_overflow)
		body = json_loadb(r->body ? r->body : "", r->n_body, flags | JSON_DECODE_INT_AS_REAL, &jerr);
	if (!body) {
		*ret = reply_error(r, 400, NULL, "invalid_json", "malformed JSON body: %s (line %d, column %d)", jerr.text,
				   jerr.line, jerr.column);
		return NULL;
	}
	if (!json_is_object(body)) {
		json_decref(body);
		*ret = reply_error(r, 400, NULL, "invalid_json", "the body must be a JSON object");
		return NULL;
	}
	return body;
}

/* ------------------------------------------------------------------------ */
/* generation                                                                 */

/* One choice of a completion: its scheduler request and its text. */
typedef struct gen_choice {
	kvt_sched_handle *h;        /* the scheduler request; NULL once released */
	kvt_tok_stream ds;          /* streaming UTF-8 decoder */
	sbuf text;                  /* the choice's text so far (cut at a matched stop string) */
	size_t n_sent;              /* bytes of text already sent (streaming) */
	uint32_t n_tokens;          /* tokens turned into text (up to the stop match) */
	bool stop_hit;              /* a stop string matched: cancelled, text final */
	bool ended;                 /* the scheduler said why it ended; usage valid */
	int finish;                 /* KVT_FINISH_* from the scheduler once ended */
	bool role_sent;             /* chat streaming: the role delta went out */
	bool finish_sent;           /* streaming: the finish chunk went out */
	bool echo_sent;             /* streaming: the echoed prompt went out */
	json_t *lp;                 /* logprobs so far (NULL: not asked): chat, an array of content entries; completions, the logprobs object */
	size_t lp_sent;             /* streaming: entries of lp already sent */
	kvt_sched_usage usage;      /* from the scheduler once ended */
} gen_choice;

/* A completion in progress: n choices, the stop strings, the SSE output. */
typedef struct gen_job {
	kvt_server *srv;            /* owner */
	const kvt_tok *tok;         /* the tokenizer */
	conn_req *req;              /* the HTTP request (for its log counters); only used while it lives */
	bool chat;                  /* chat.completion shapes */
	bool stream;                /* SSE */
	bool include_usage;         /* stream_options.include_usage */
	bool logprobs;              /* logprobs asked (chat logprobs: true, completions logprobs: N) */
	kvt_oai_tools tools;        /* chat: tools, tool_choice, parallel_tool_calls */
	char *echo;                 /* completions echo: the prompt's text (malloc'd); NULL: no echo */
	size_t n_echo;              /* its bytes */
	char id[48];                /* "cmpl-..." / "chatcmpl-..." */
	int64_t created;            /* unix seconds */
	char session_id[KVT_NAME_MAX + 1]; /* "" if none */
	kvt_cachectl cc;            /* cache-control fields: the prefixes to retain, prompt_cache_key */
	char *stops[SRV_MAX_STOPS]; /* stop strings (malloc'd) */
	size_t stop_len[SRV_MAX_STOPS];
	uint32_t n_stops;
	size_t max_stop_len;        /* longest stop string */
	uint32_t n_prompt;          /* prompt tokens */
	uint32_t n;                 /* choices */
	gen_choice *ch;             /* [n] */
	waiter w;                   /* parks the connection while no tokens come */
	tenant_usage *usage;        /* the tenant's counters, added to when the job ends (NULL: none) */
	sbuf out;                   /* SSE bytes not yet handed to MHD */
	size_t out_off;             /* of those, already handed */
	bool done;                  /* everything (incl. [DONE]) is in out */
	bool counted;               /* holds one in_flight count */
	bool released;              /* job_release ran: no handle, no count held */
} gen_job;

/*
 * Give back what the job holds in the engine: its scheduler handles (each
 * one cancelled if still running; a finished sequence's T0 blocks go back),
 * its in-flight count, and its usage to its tenant. Once per job: at the end
 * of a stream, as soon as the last byte is handed to MHD (the response
 * itself may be freed much later), else from job_free.
 */
static void job_release(gen_job *j)
{
	if (j->released)
		return;
	j->released = true;
	for (uint32_t i = 0; j->usage && j->ch && i < j->n; i++)
		if (j->ch[i].ended) {
			const kvt_sched_usage *u = &j->ch[i].usage;
			atomic_fetch_add(&j->usage->requests, 1);
			atomic_fetch_add(&j->usage->prompt_tokens, u->prompt_tokens);
			atomic_fetch_add(&j->usage->cached_tokens, u->cached_tokens);
			atomic_fetch_add(&j->usage->completion_tokens, u->completion_tokens);
		}
	for (uint32_t i = 0; j->ch && i < j->n; i++) {
		kvt_sched_release(j->ch[i].h); /* cancels if still running */
		j->ch[i].h = NULL;
	}
	if (j->counted)
		atomic_fetch_sub(&j->srv->in_flight, 1);
	j->counted = false;
}

static void job_free(gen_job *j)
{
	if (!j)
		return;
	job_release(j);
	for (uint32_t i = 0; j->ch && i < j->n; i++) {
		free(j->ch[i].text.p);
		json_decref(j->ch[i].lp);
	}
	free(j->ch);
	kvt_oai_tools_deinit(&j->tools);
	free(j->echo);
	for (uint32_t i = 0; i < j->n_stops; i++)
		free(j->stops[i]);
	free(j->out.p);
	free(j);
}

/* Earliest match of any stop string in text[from..]; -1 if none. */
static long stop_find(const gen_job *j, const char *text, size_t n, size_t from)
{
	long best = -1;
	for (uint32_t s = 0; s < j->n_stops; s++) {
		const char *p = memmem(text + from, n - from, j->stops[s], j->stop_len[s]);
		if (p && (best < 0 || p - text < best))
			best = p - text;
	}
	return best;
}

/* Bytes at the end of text that could be the start of a stop string (held back). */
static size_t stop_holdback(const gen_job *j, const char *text, size_t n)
{
	size_t hold = 0;
	for (uint32_t s = 0; s < j->n_stops; s++) {
		size_t k = j->stop_len[s] - 1 < n ? j->stop_len[s] - 1 : n;
		for (; k > hold; k--)
			if (!memcmp(text + n - k, j->stops[s], k)) {
				hold = k;
				break;
			}
	}
	return hold;
}

/* Append decoded text and look for a stop string in the new part (plus the overlap). */
static void choice_add_text(gen_job *j, gen_choice *c, const char *s, size_t n)
{
	size_t before = c->text.n;
	sbuf_add(&c->text, s, n);
	if (!j->n_stops || c->stop_hit)
		return;
	size_t from = before >= j->max_stop_len ? before - j->max_stop_len + 1 : 0;
	long at = stop_find(j, c->text.p ? c->text.p : "", c->text.n, from);
	if (at >= 0) {
		c->text.n = (size_t)at;
		c->text.p[at] = 0;
		c->stop_hit = true;
		kvt_sched_cancel(c->h);
	}
}

/* Turn generated ids into text (and their logprobs, lps may be NULL). KVT_OK, or KVT_EINVAL for an id the tokenizer rejects (logged). */
static int choice_feed(gen_job *j, gen_choice *c, const int32_t *ids, const kvt_token_lp *lps, uint32_t n)
{
	for (uint32_t i = 0; i < n && !c->stop_hit; i++) {
		const char *bytes;
		size_t len;
		if (kvt_tok_token_bytes(j->tok, ids[i], &bytes, &len) != KVT_OK) {
			KVT_LOGE("http %s: the engine returned token id %d, not in the vocabulary", j->id, ids[i]);
			return KVT_EINVAL;
		}
		char small[256];
		size_t cap = 3 * len + 3, got = 0;
		char *buf = cap <= sizeof(small) ? small : malloc(cap);
		if (!buf)
			return KVT_ENOMEM;
		int rc = kvt_tok_stream_push(j->tok, &c->ds, ids[i], buf, cap, &got);
		if (rc == KVT_OK) {
			c->n_tokens++;
			if (c->lp && lps && j->chat)
				json_array_append_new(c->lp, kvt_oai_lp_chat(j->tok, &lps[i]));
			else if (c->lp && lps)
				kvt_oai_lp_completion_add(c->lp, j->tok, &lps[i], j->n_echo + c->text.n);
			choice_add_text(j, c, buf, got);
		}
		if (buf != small)
			free(buf);
		if (rc != KVT_OK)
			return rc;
	}
	return KVT_OK;
}

/* The scheduler said the choice ended: flush the decoder (unless a stop string already cut the text). */
static void choice_end(gen_job *j, gen_choice *c, int finish, const kvt_sched_usage *u)
{
	c->ended = true;
	c->finish = finish;
	c->usage = *u;
	if (!c->stop_hit) {
		char tail[8];
		size_t got = 0;
		if (kvt_tok_stream_flush(&c->ds, tail, sizeof(tail), &got) == KVT_OK && got)
			choice_add_text(j, c, tail, got);
	}
}

static const char *choice_finish_reason(const gen_choice *c)
{
	if (c->stop_hit || c->finish == KVT_FINISH_STOP)
		return "stop";
	return "length";
}

/* The tool calls in an ended chat choice (NULL: none, or no tools); *content_len the text before them. */
static json_t *choice_tool_calls(const gen_job *j, const gen_choice *c, size_t *content_len)
{
	if (!j->chat || j->tools.choice == KVT_TOOLS_NONE || !c->ended)
		return NULL;
	return kvt_oai_tool_calls(&j->tools, c->text.p, c->text.n, content_len);
}

/* Logprobs entries of c from `from` on, in the response's shape (chat {"content", "refusal"}, completions the four arrays). */
static json_t *choice_lp_json(const gen_job *j, const gen_choice *c, size_t from)
{
	if (!c->lp)
		return json_null();
	if (j->chat) {
		json_t *a = json_array();
		for (size_t k = from; k < json_array_size(c->lp); k++)
			json_array_append(a, json_array_get(c->lp, k));
		return json_pack("{s:o, s:n}", "content", a, "refusal");
	}
	json_t *o = json_object();
	const char *keys[] = { "tokens", "token_logprobs", "top_logprobs", "text_offset" };
	for (int i = 0; i < 4; i++) {
		json_t *src = json_object_get(c->lp, keys[i]), *a = json_array();
		for (size_t k = from; k < json_array_size(src); k++)
			json_array_append(a, json_array_get(src, k));
		json_object_set_new(o, keys[i], a);
	}
	return o;
}

static size_t choice_lp_count(const gen_job *j, const gen_choice *c)
{
	return !c->lp ? 0 : j->chat ? json_array_size(c->lp) : json_array_size(json_object_get(c->lp, "tokens"));
}

/* A choice that failed (engine error, or cancelled by shutdown and not by us). */
static bool choice_failed(const gen_choice *c)
{
	return c->ended && !c->stop_hit && (c->finish == KVT_FINISH_ERROR || c->finish == KVT_FINISH_CANCELLED);
}

static uint32_t choice_completion_tokens(const gen_choice *c)
{
	return c->stop_hit ? c->n_tokens : c->usage.completion_tokens;
}

/*
 * Poll every running choice once (the first one waits up to wait_s).
 * Returns KVT_OK; *progress says whether anything happened.
 */
static int job_poll(gen_job *j, double wait_s, bool *progress)
{
	int32_t ids[SRV_IDS_CAP];
	kvt_token_lp lps[SRV_IDS_CAP];
	bool waited = false;
	*progress = false;
	for (uint32_t i = 0; i < j->n; i++) {
		gen_choice *c = &j->ch[i];
		if (c->ended)
			continue;
		uint32_t n = 0;
		int finish = KVT_FINISH_NONE;
		kvt_sched_usage u;
		int rc = kvt_sched_next_lp(c->h, ids, j->logprobs ? lps : NULL, SRV_IDS_CAP, &n, &finish, &u,
					   waited ? 0.0 : wait_s);
		waited = true;
		if (rc != KVT_OK)
			return rc;
		if (n) {
			*progress = true;
			if ((rc = choice_feed(j, c, ids, j->logprobs ? lps : NULL, n)) != KVT_OK)
				return rc;
		}
		if (finish != KVT_FINISH_NONE) {
			*progress = true;
			choice_end(j, c, finish, &u);
		}
	}
	return KVT_OK;
}

static bool job_all_ended(const gen_job *j)
{
	for (uint32_t i = 0; i < j->n; i++)
		if (!j->ch[i].ended)
			return false;
	return true;
}

static void job_update_log(gen_job *j)
{
	if (!j->req)
		return;
	uint32_t n = 0;
	for (uint32_t i = 0; i < j->n; i++)
		n += j->ch[i].ended ? choice_completion_tokens(&j->ch[i]) : j->ch[i].n_tokens;
	atomic_store(&j->req->n_completion, n);
}

static json_t *usage_json(const gen_job *j)
{
	const kvt_sched_usage *u0 = &j->ch[0].usage;
	uint32_t completion = 0;
	for (uint32_t i = 0; i < j->n; i++)
		completion += choice_completion_tokens(&j->ch[i]);
	json_t *kv = json_pack("{s:{s:i, s:i, s:i, s:i}, s:f}", "cached_tokens_by_tier", "hbm",
			       (json_int_t)u0->cached_by_tier[KVT_TIER_HBM], "host",
			       (json_int_t)u0->cached_by_tier[KVT_TIER_HOST], "nvme",
			       (json_int_t)u0->cached_by_tier[KVT_TIER_NVME], "remote",
			       (json_int_t)u0->cached_by_tier[KVT_TM_TIER_REMOTE], "ttft_ms", u0->ttft_s * 1e3);
	if (kv && j->session_id[0])
		json_object_set_new(kv, "session_id", json_string(j->session_id));
	if (kv) { /* Anthropic's names for the tokens written to and read from retained cache */
		json_object_set_new(kv, "cache_creation_input_tokens", json_integer(u0->cache_creation_tokens));
		json_object_set_new(kv, "cache_read_input_tokens", json_integer(u0->cache_read_tokens));
		if (j->cc.n_retain)
			json_object_set_new(
				kv, "retention",
				json_pack("{s:i, s:i, s:i, s:b}", "requested_tokens", (json_int_t)u0->retain_requested_tokens,
					  "retained_tokens",
					  (json_int_t)(u0->retain_requested_tokens - u0->retain_denied_tokens),
					  "denied_tokens", (json_int_t)u0->retain_denied_tokens, "partial",
					  u0->retain_denied_tokens > 0));
		if (j->cc.cache_key[0])
			json_object_set_new(kv, "prompt_cache_key", json_string(j->cc.cache_key));
	}
	return json_pack("{s:i, s:i, s:i, s:{s:i}, s:o*}", "prompt_tokens", (json_int_t)j->n_prompt,
			 "completion_tokens", (json_int_t)completion, "total_tokens",
			 (json_int_t)(j->n_prompt + completion), "prompt_tokens_details", "cached_tokens",
			 (json_int_t)u0->cached_tokens, "kvtier", kv);
}

/* The non-streaming response body. */
static json_t *job_result(gen_job *j)
{
	json_t *choices = json_array();
	for (uint32_t i = 0; i < j->n; i++) {
		gen_choice *c = &j->ch[i];
		json_t *ch;
		const char *text = c->text.p ? c->text.p : "";
		size_t content_len = c->text.n;
		json_t *calls = choice_tool_calls(j, c, &content_len);
		const char *finish = calls && !strcmp(choice_finish_reason(c), "stop") ? "tool_calls" : choice_finish_reason(c);
		if (j->chat) {
			json_t *content = calls && !content_len ? json_null() : json_stringn(text, content_len);
			ch = json_pack("{s:i, s:{s:s, s:o, s:n}, s:o, s:s}", "index", (json_int_t)i, "message", "role",
				       "assistant", "content", content, "refusal", "logprobs", choice_lp_json(j, c, 0),
				       "finish_reason", finish);
			if (calls)
				json_object_set_new(json_object_get(ch, "message"), "tool_calls", calls);
		} else {
			sbuf t = { 0 };
			sbuf_add(&t, j->echo ? j->echo : "", j->n_echo);
			sbuf_add(&t, text, c->text.n);
			ch = json_pack("{s:i, s:s%, s:o, s:s}", "index", (json_int_t)i, "text", t.p ? t.p : "", t.n,
				       "logprobs", choice_lp_json(j, c, 0), "finish_reason", finish);
			free(t.p);
		}
		json_array_append_new(choices, ch);
	}
	return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", j->id, "object",
			 j->chat ? "chat.completion" : "text_completion", "created", (json_int_t)j->created, "model",
			 j->srv->model_id, "choices", choices, "usage", usage_json(j));
}

/* ---- SSE ---- */

static void sse_put(gen_job *j, json_t *v)
{
	char *s = v ? json_dumps(v, SRV_JSON_FLAGS) : NULL;
	json_decref(v);
	if (!s) {
		j->out.failed = true;
		return;
	}
	sbuf_add(&j->out, "data: ", 6);
	sbuf_add(&j->out, s, strlen(s));
	sbuf_add(&j->out, "\n\n", 2);
	free(s);
}

/*
 * One chunk for choice i: text (may be NULL), finish reason (may be NULL),
 * chat role delta, logprobs (NULL: null; the reference is taken), chat
 * tool_calls deltas (NULL: none; taken).
 */
static void sse_chunk(gen_job *j, uint32_t i, const char *text, size_t n, const char *finish, bool role, json_t *lp,
		      json_t *tool_calls)
{
	json_t *ch;
	if (!lp)
		lp = json_null();
	if (j->chat) {
		json_t *delta = json_object();
		if (role) {
			json_object_set_new(delta, "role", json_string("assistant"));
			json_object_set_new(delta, "content", json_string(""));
		} else if (text) {
			json_object_set_new(delta, "content", json_stringn(text, n));
		}
		if (tool_calls)
			json_object_set_new(delta, "tool_calls", tool_calls);
		ch = json_pack("{s:i, s:o, s:o, s:s?}", "index", (json_int_t)i, "delta", delta, "logprobs", lp,
			       "finish_reason", finish);
	} else {
		ch = json_pack("{s:i, s:s%, s:o, s:s?}", "index", (json_int_t)i, "text", text ? text : "",
			       text ? n : 0, "logprobs", lp, "finish_reason", finish);
	}
	sse_put(j, json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", j->id, "object",
			     j->chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)j->created,
			     "model", j->srv->model_id, "choices", ch));
}

/* Move whatever text can be sent now into SSE chunks; finish chunks for ended choices. */
static void sse_emit(gen_job *j)
{
	for (uint32_t i = 0; i < j->n; i++) {
		gen_choice *c = &j->ch[i];
		if (c->finish_sent)
			continue;
		if (j->chat && !c->role_sent) {
			sse_chunk(j, i, NULL, 0, NULL, true, NULL, NULL);
			c->role_sent = true;
		}
		if (j->echo && !c->echo_sent) {
			sse_chunk(j, i, j->echo, j->n_echo, NULL, false, NULL, NULL);
			c->echo_sent = true;
		}
		if (choice_failed(c))
			continue; /* reported once every choice ended */
		size_t ready = c->text.n, content_len = c->text.n;
		json_t *calls = choice_tool_calls(j, c, &content_len);
		if (!c->stop_hit && !c->ended)
			ready -= stop_holdback(j, c->text.p, c->text.n);
		if (j->chat && j->tools.choice != KVT_TOOLS_NONE) /* a tool call is sent whole, as a tool_calls delta */
			ready = c->ended ? content_len : kvt_oai_content_ready(c->text.p, ready);
		if (ready > c->n_sent) {
			size_t n_lp = choice_lp_count(j, c);
			sse_chunk(j, i, c->text.p + c->n_sent, ready - c->n_sent, NULL, false,
				  c->lp ? choice_lp_json(j, c, c->lp_sent) : NULL, NULL);
			c->lp_sent = n_lp;
			c->n_sent = ready;
		}
		if (c->ended) {
			const char *finish = choice_finish_reason(c);
			if (calls) {
				size_t k;
				json_t *call;
				json_array_foreach(calls, k, call)
					json_object_set_new(call, "index", json_integer((json_int_t)k));
				size_t n_lp = choice_lp_count(j, c);
				sse_chunk(j, i, NULL, 0, NULL, false, c->lp ? choice_lp_json(j, c, c->lp_sent) : NULL, calls);
				c->lp_sent = n_lp;
				calls = NULL;
				if (!strcmp(finish, "stop"))
					finish = "tool_calls";
			}
			sse_chunk(j, i, j->chat ? NULL : "", 0, finish, false,
				  c->lp && c->lp_sent < choice_lp_count(j, c) ? choice_lp_json(j, c, c->lp_sent) : NULL, NULL);
			c->finish_sent = true;
		}
		json_decref(calls);
	}
	if (job_all_ended(j) && !j->done) {
		for (uint32_t i = 0; i < j->n; i++)
			if (choice_failed(&j->ch[i])) {
				bool shutdown = j->ch[i].finish == KVT_FINISH_CANCELLED;
				sse_put(j, error_object("server_error", NULL, shutdown ? "draining" : NULL,
							shutdown ? "the request was cancelled: the server is shutting down" :
								   "the engine failed while generating"));
				break;
			}
		if (j->include_usage)
			sse_put(j, json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", j->id, "object",
					     j->chat ? "chat.completion.chunk" : "text_completion", "created",
					     (json_int_t)j->created, "model", j->srv->model_id, "choices", "usage",
					     usage_json(j)));
		sbuf_add(&j->out, "data: [DONE]\n\n", 14);
		j->done = true;
	}
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	gen_job *j = cls;
	for (;;) {
		if (j->out.failed)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (j->out_off < j->out.n) {
			size_t k = j->out.n - j->out_off < max ? j->out.n - j->out_off : max;
			memcpy(buf, j->out.p + j->out_off, k);
			j->out_off += k;
			if (j->out_off == j->out.n)
				j->out_off = j->out.n = 0;
			return (ssize_t)k;
		}
		if (j->done) {
			job_release(j); /* NOTE: MHD may free the response (sse_free) much later */
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		if (atomic_load(&j->srv->stopping) || peer_gone(j->w.fd))
			return MHD_CONTENT_READER_END_WITH_ERROR; /* the free callback cancels */
		uint64_t seen = atomic_load(&j->srv->wake_seq);
		bool progress;
		int rc = job_poll(j, 0, &progress);
		if (rc != KVT_OK) {
			sse_put(j, error_object("server_error", NULL, NULL, "the engine failed while generating"));
			sbuf_add(&j->out, "data: [DONE]\n\n", 14);
			j->done = true;
			continue;
		}
		if (progress) {
			job_update_log(j);
			sse_emit(j);
			continue;
		}
		if (park(j->srv, &j->w, seen))
			return 0; /* resumed on news; MHD calls again */
	}
}

static void sse_free(void *cls)
{
	job_free(cls);
}

/* ---- request parsing ---- */

/* ids (malloc'd, n of them) with BOS put first when the model asks; frees ids on failure. */
static int with_bos(const kvt_tok *tok, int32_t *ids, size_t n, int32_t **out, uint32_t *n_out)
{
	size_t bos = kvt_tok_add_bos(tok) && kvt_tok_bos(tok) >= 0 ? 1 : 0;
	if (n + bos > UINT32_MAX) {
		free(ids);
		return KVT_EINVAL;
	}
	if (bos) {
		int32_t *p = realloc(ids, (n + 1) * sizeof(*p));
		if (!p) {
			free(ids);
			return KVT_ENOMEM;
		}
		memmove(p + 1, p, n * sizeof(*p));
		p[0] = kvt_tok_bos(tok);
		ids = p;
	}
	*out = ids;
	*n_out = (uint32_t)(n + bos);
	return KVT_OK;
}

/* Tokenize text into a malloc'd array, BOS first when the model asks. */
static int tokenize(const kvt_tok *tok, const char *text, size_t len, bool parse_special, int32_t **out,
		    uint32_t *n_out)
{
	size_t cap = len + 8, n = 0;
	for (int attempt = 0; attempt < 2; attempt++) {
		int32_t *ids = malloc((cap + 1) * sizeof(*ids));
		if (!ids)
			return KVT_ENOMEM;
		int rc = kvt_tok_encode(tok, text, len, parse_special, ids, cap, &n);
		if (rc == KVT_OK)
			return with_bos(tok, ids, n, out, n_out);
		free(ids);
		if (rc != KVT_EFULL)
			return rc;
		cap = n;
	}
	return KVT_EFULL;
}

/* The "content" of a chat message: a string, or an array of {"type": "text", "text": ...} parts. */
static int message_content(json_t *content, size_t idx, char **out, size_t *n_out, field_err *e)
{
	char param[64];
	snprintf(param, sizeof(param), "messages[%zu].content", idx);
	if (json_is_string(content)) { /* may hold NUL bytes: copied by length */
		size_t n = json_string_length(content);
		if (!(*out = malloc(n + 1)))
			return fail(e, param, "out of memory");
		memcpy(*out, json_string_value(content), n + 1);
		*n_out = n;
		return 0;
	}
	if (!json_is_array(content))
		return fail(e, param, "'%s' must be a string or an array of text parts", param);
	sbuf b = { 0 };
	sbuf_add(&b, "", 0);
	size_t k;
	json_t *part;
	json_array_foreach(content, k, part)
	{
		json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
		if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
		    !json_is_string(text)) {
			free(b.p);
			return fail(e, param, "'%s[%zu]' must be {\"type\": \"text\", \"text\": string}", param, k);
		}
		sbuf_add(&b, json_string_value(text), json_string_length(text));
	}
	if (b.failed) {
		free(b.p);
		return fail(e, param, "out of memory");
	}
	*out = b.p;
	*n_out = b.n;
	return 0;
}

/*
 * messages -> prompt ids through the chat template: only the template's own
 * markers are special tokens; every message's text is tokenized as text.
 */
static int chat_prompt(const kvt_tok *tok, json_t *msgs, const char *tools_text, int32_t **ids, uint32_t *n_ids,
		       field_err *e)
{
	if (!json_is_array(msgs) || json_array_size(msgs) == 0)
		return fail(e, "messages", "'messages' must be a non-empty array");
	size_t n = json_array_size(msgs), n_cm = n + 1;
	kvt_chat_msg *cm = calloc(n_cm, sizeof(*cm));
	char **texts = calloc(n_cm, sizeof(*texts));
	int ret = -1;
	if (!cm || !texts) {
		fail(e, "messages", "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role");
		char param[64];
		snprintf(param, sizeof(param), "messages[%zu].role", i);
		if (!json_is_object(m)) {
			snprintf(param, sizeof(param), "messages[%zu]", i);
			fail(e, param, "'%s' must be an object with role and content", param);
			goto out;
		}
		kvt_oai_err oe;
		const char *r = NULL;
		int k = kvt_oai_message(m, i, &r, &texts[i], &cm[i].content_len, &oe);
		if (k < 0) {
			fail(e, oe.param, "%s", oe.msg);
			goto out;
		}
		if (k == 1) { /* an assistant turn with tool calls, or a tool's result */
			cm[i].role = r;
			cm[i].content = texts[i];
			continue;
		}
		r = json_is_string(role) ? json_string_value(role) : NULL;
		if (!r || (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") && strcmp(r, "assistant"))) {
			fail(e, param, "'%s' must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\"", param);
			goto out;
		}
		if (!strcmp(r, "developer")) /* OpenAI's newer name for the system role */
			r = "system";
		json_t *content = json_object_get(m, "content");
		if (message_content(content, i, &texts[i], &cm[i].content_len, e))
			goto out;
		cm[i].role = r;
		cm[i].content = texts[i];
	}
	/* the tools' description: appended to the first system message, or a system message of its own */
	if (tools_text) {
		size_t nt = strlen(tools_text);
		if (!strcmp(cm[0].role, "system")) {
			char *c = malloc(cm[0].content_len + 2 + nt + 1);
			if (!c) {
				fail(e, "messages", "out of memory");
				goto out;
			}
			memcpy(c, cm[0].content, cm[0].content_len);
			memcpy(c + cm[0].content_len, "\n\n", 2);
			memcpy(c + cm[0].content_len + 2, tools_text, nt + 1);
			free(texts[0]);
			texts[0] = c;
			cm[0].content = c;
			cm[0].content_len += 2 + nt;
		} else {
			memmove(cm + 1, cm, n * sizeof(*cm));
			memmove(texts + 1, texts, n * sizeof(*texts));
			if (!(texts[0] = strdup(tools_text))) {
				fail(e, "messages", "out of memory");
				goto out;
			}
			cm[0] = (kvt_chat_msg){ .role = "system", .content = texts[0], .content_len = nt };
			n++;
		}
	}
	int32_t *chat_ids = NULL;
	size_t n_chat = 0;
	int rc = kvt_tok_chat_encode(tok, cm, n, true, &chat_ids, &n_chat);
	if (rc == KVT_OK && (rc = with_bos(tok, chat_ids, n_chat, ids, n_ids)) == KVT_OK)
		ret = 0;
	else
		fail(e, "messages", "the messages cannot be formatted with this model's chat template (%s)",
		     kvt_strerror(rc));
out:
	for (size_t i = 0; texts && i < n_cm; i++)
		free(texts[i]);
	free(texts);
	free(cm);
	return ret;
}

/* Fill the prompt ids of a completion request. */
static int completion_prompt(const kvt_tok *tok, uint32_t n_vocab, json_t *prompt, bool parse_special, int32_t **ids,
			     uint32_t *n, field_err *e)
{
	if (!prompt || json_is_null(prompt))
		return fail(e, "prompt", "'prompt' is required");
	if (json_is_array(prompt) && json_array_size(prompt) == 1 && json_is_string(json_array_get(prompt, 0)))
		prompt = json_array_get(prompt, 0);
	if (json_is_string(prompt)) {
		int rc = tokenize(tok, json_string_value(prompt), json_string_length(prompt), parse_special, ids, n);
		if (rc != KVT_OK)
			return fail(e, "prompt", "'prompt' could not be tokenized (%s)", kvt_strerror(rc));
		return 0;
	}
	if (!json_is_array(prompt))
		return fail(e, "prompt", "'prompt' must be a string or an array of token ids");
	size_t k = json_array_size(prompt);
	if (k == 0)
		return fail(e, "prompt", "'prompt' is empty");
	if (k > UINT32_MAX)
		return fail(e, "prompt", "'prompt' is too long");
	int32_t *v = malloc(k * sizeof(*v));
	if (!v)
		return fail(e, "prompt", "out of memory");
	for (size_t i = 0; i < k; i++) {
		json_t *t = json_array_get(prompt, i);
		long long x;
		if (!json_whole(t, &x)) {
			free(v);
			return fail(e, "prompt",
				    json_is_string(t) ? "'prompt' as an array of strings must have exactly one element" :
							"'prompt[%zu]' must be a token id (integer)",
				    i);
		}
		if (x < 0 || x >= (long long)n_vocab) {
			free(v);
			return fail(e, "prompt", "'prompt[%zu]' = %lld is not a token id (the vocabulary has %u)", i,
				    x, n_vocab);
		}
		v[i] = (int32_t)x;
	}
	*ids = v;
	*n = (uint32_t)k;
	return 0;
}

/* The tenant of a request: the key's (auth) or "user" (no keys) or "default". */
/*
 * The tenant that `user` names when no API keys are configured (with keys,
 * the key's tenant, set by authenticate). OpenAI's `user` is a free-form
 * end-user identifier of up to 256 bytes (emails are common): one that is a
 * valid name (kvt_name_valid) is the tenant as it is; any other maps to its
 * [A-Za-z0-9._-] bytes (others as '_', at most 64, a leading '.' as '_') + '-'
 * + 16 hex digits of its SHA-256, so two users do not share a tenant by the
 * mapping. An empty user is the default tenant.
 */
static int request_tenant(conn_req *r, const char *user, size_t n_user, field_err *e)
{
	if (auth_on(r->srv) || !user || n_user == 0)
		return 0; /* with keys: set by auth */
	if (n_user > SRV_USER_MAX)
		return fail(e, "user", "'user' must be at most %d bytes (got %zu)", SRV_USER_MAX, n_user);
	if (n_user == strlen(user) && kvt_name_valid(user)) {
		snprintf(r->tenant, sizeof(r->tenant), "%s", user);
		return 0;
	}
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned n_md = 0;
	if (!EVP_Digest(user, n_user, md, &n_md, EVP_sha256(), NULL) || n_md < 8)
		return fail(e, "user", "'user' could not be hashed");
	size_t n = 0, keep = n_user < 64 ? n_user : 64;
	for (; n < keep; n++) {
		unsigned char c = (unsigned char)user[n];
		r->tenant[n] = isalnum(c) || c == '-' || c == '_' || (c == '.' && n > 0) ? (char)c : '_';
	}
	r->tenant[n++] = '-';
	for (int i = 0; i < 8; i++, n += 2)
		snprintf(r->tenant + n, 3, "%02x", md[i]);
	KVT_DEBUG_ASSERT(kvt_name_valid(r->tenant));
	return 0;
}

static bool in_flight_take(kvt_server *srv)
{
	unsigned cur = atomic_load(&srv->in_flight);
	do {
		if (cur >= srv->cfg.max_concurrent)
			return false;
	} while (!atomic_compare_exchange_weak(&srv->in_flight, &cur, cur + 1));
	return true;
}

/*
 * A non-streaming generation, each time MHD runs its connection: take what
 * the scheduler has; park until news while a choice runs; answer once all
 * ended. A client that hung up (the pump resumes it) is cancelled.
 */
static enum MHD_Result gen_continue(conn_req *r)
{
	gen_job *j = r->job;
	enum MHD_Result ret;
	for (;;) {
		if (atomic_load(&r->srv->stopping) || peer_gone(j->w.fd)) {
			KVT_LOGI("http %s: client went away; cancelled", j->id);
			ret = MHD_NO; /* close the connection; job_free cancels */
			r->status = 499;
			break;
		}
		uint64_t seen = atomic_load(&r->srv->wake_seq);
		bool progress;
		int rc = job_poll(j, 0, &progress);
		if (rc != KVT_OK) {
			ret = reply_error(r, 500, NULL, NULL, "the engine failed while generating (%s)", kvt_strerror(rc));
			break;
		}
		if (!job_all_ended(j)) {
			if (progress || !park(r->srv, &j->w, seen))
				continue;
			return MHD_YES; /* parked: MHD calls on_request again when resumed */
		}
		job_update_log(j);
		ret = MHD_YES;
		for (uint32_t i = 0; i < j->n && ret == MHD_YES && !r->answered; i++)
			if (choice_failed(&j->ch[i]))
				ret = j->ch[i].finish == KVT_FINISH_CANCELLED ?
					      reply_error(r, 503, NULL, "draining",
							  "the request was cancelled: the server is shutting down") :
					      reply_error(r, 500, NULL, NULL, "the engine failed while generating");
		if (!r->answered)
			ret = reply_json(r, 200, job_result(j), false);
		break;
	}
	r->job = NULL;
	job_free(j);
	return ret;
}

static enum MHD_Result handle_generate(conn_req *r, kvt_sched *sched, const kvt_tok *tok, bool chat)
{
	kvt_server *srv = r->srv;
	const kvt_server_config *cfg = &srv->cfg;
	field_err e = { { 0 }, { 0 } };
	enum MHD_Result ret;
	json_t *body = load_body(r, &ret);
	if (!body)
		return ret;
	uint32_t n_vocab = kvt_sched_n_vocab(sched), max_ctx = kvt_sched_max_ctx(sched);
	long long max_tokens = cfg->default_max_tokens, top_k = 0, n = 1, seed = 0, priority = 0, top_lp = 0;
	double temp = 1.0, top_p = 1.0, presence = 0, frequency = 0, repetition = 1, min_p = 0;
	bool stream = false, include_usage = false, ignore_eos = false, have_seed = false, parse_special = true;
	bool want_lp = false, echo = false;
	kvt_grammar *grammar = NULL;
	kvt_logit_bias *bias = NULL;
	uint32_t n_bias = 0;
	kvt_oai_err oe;
	const char *model = NULL, *user = NULL, *session = NULL;
	size_t n_user = 0;
	int32_t *ids = NULL;
	uint32_t n_ids = 0;
	gen_job *j = NULL;
	json_t *v;

	const char *mt_key = chat && json_object_get(body, "max_completion_tokens") &&
					     !json_is_null(json_object_get(body, "max_completion_tokens")) ?
				     "max_completion_tokens" :
				     "max_tokens";
	if (get_str(body, "model", &model, NULL, &e) || get_str(body, "user", &user, &n_user, &e) ||
	    get_int(body, mt_key, 1, cfg->max_tokens_limit, &max_tokens, &e) || get_num(body, "temperature", &temp, &e) ||
	    get_num(body, "top_p", &top_p, &e) || get_int(body, "top_k", 0, n_vocab, &top_k, &e) ||
	    get_int(body, "seed", LLONG_MIN, LLONG_MAX, &seed, &e) ||
	    get_int(body, "n", 1, cfg->max_n, &n, &e) || get_bool(body, "stream", &stream, &e) ||
	    get_bool(body, "ignore_eos", &ignore_eos, &e) || get_str(body, "session_id", &session, NULL, &e) ||
	    get_int(body, "priority", KVT_PRIORITY_MIN, KVT_PRIORITY_MAX, &priority, &e) ||
	    (!chat && get_bool(body, "parse_special", &parse_special, &e)))
		goto bad;
	have_seed = (v = json_object_get(body, "seed")) && !json_is_null(v);
	const bool have_priority = (v = json_object_get(body, "priority")) && !json_is_null(v);
	if (get_num(body, "presence_penalty", &presence, &e) || get_num(body, "frequency_penalty", &frequency, &e) ||
	    get_num(body, "repetition_penalty", &repetition, &e) || get_num(body, "min_p", &min_p, &e) ||
	    (!chat && get_bool(body, "echo", &echo, &e)))
		goto bad;
	if (!(presence >= -2 && presence <= 2) || !(frequency >= -2 && frequency <= 2)) {
		fail(&e, presence >= -2 && presence <= 2 ? "frequency_penalty" : "presence_penalty",
		     "'%s' must be in [-2, 2]", presence >= -2 && presence <= 2 ? "frequency_penalty" : "presence_penalty");
		goto bad;
	}
	if (!(repetition > 0 && repetition <= 10)) {
		fail(&e, "repetition_penalty", "'repetition_penalty' must be in (0, 10]");
		goto bad;
	}
	if (!(min_p >= 0 && min_p <= 1)) {
		fail(&e, "min_p", "'min_p' must be in [0, 1]");
		goto bad;
	}
	if (chat) { /* logprobs: true, top_logprobs: 0..20 */
		if (get_bool(body, "logprobs", &want_lp, &e) || get_int(body, "top_logprobs", 0, KVT_MAX_TOP_LOGPROBS, &top_lp, &e))
			goto bad;
		if (top_lp && !want_lp) {
			fail(&e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
			goto bad;
		}
	} else if ((v = json_object_get(body, "logprobs")) && !json_is_null(v)) { /* completions: logprobs: N */
		if (get_int(body, "logprobs", 0, KVT_MAX_TOP_LOGPROBS, &top_lp, &e))
			goto bad;
		want_lp = true;
		if (echo) {
			fail(&e, "echo", "'echo' with 'logprobs' (the prompt's logprobs) is not supported");
			goto bad;
		}
	}
	if ((v = json_object_get(body, "logit_bias")) && !json_is_null(v)) {
		if (!json_is_object(v)) {
			fail(&e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
			goto bad;
		}
		if (json_object_size(v) > KVT_SAMPLER_MAX_BIAS) {
			fail(&e, "logit_bias", "'logit_bias' may hold at most %d entries", KVT_SAMPLER_MAX_BIAS);
			goto bad;
		}
		if (!(bias = calloc(json_object_size(v) + 1, sizeof(*bias))))
			goto oom;
		const char *key;
		json_t *bv;
		json_object_foreach(v, key, bv)
		{
			char *end = NULL;
			long long id = strtoll(key, &end, 10);
			if (!key[0] || *end || id < 0 || id >= (long long)n_vocab) {
				fail(&e, "logit_bias", "'logit_bias' key '%.40s' is not a token id in [0, %u)", key, n_vocab);
				goto bad;
			}
			if (!json_is_number(bv) || !(json_number_value(bv) >= -100 && json_number_value(bv) <= 100)) {
				fail(&e, "logit_bias", "'logit_bias[%s]' must be a number in [-100, 100]", key);
				goto bad;
			}
			bias[n_bias++] = (kvt_logit_bias){ (int32_t)id, (float)json_number_value(bv) };
		}
	}
	/* fields kvtier does not implement: refused rather than ignored (docs/http-api.md) */
	{
		long long best_of = 1;
		if (!chat && get_int(body, "best_of", 1, 1, &best_of, &e))
			goto bad;
		const char *refused[] = { "suffix", "audio", "prediction", "web_search_options", "reasoning_effort",
					  "verbosity" };
		for (size_t k = 0; k < sizeof(refused) / sizeof(refused[0]); k++)
			if ((v = json_object_get(body, refused[k])) && !json_is_null(v) &&
			    !(json_is_string(v) && !json_string_length(v))) {
				fail(&e, refused[k], "'%s' is not supported", refused[k]);
				goto bad;
			}
		if ((v = json_object_get(body, "modalities")) && !json_is_null(v) &&
		    !(json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)) &&
		      !strcmp(json_string_value(json_array_get(v, 0)), "text"))) {
			fail(&e, "modalities", "'modalities' other than [\"text\"] is not supported");
			goto bad;
		}
	}
	if (kvt_oai_response_format(json_object_get(body, "response_format"), &grammar, &oe)) {
		fail(&e, oe.param, "%s", oe.msg);
		goto bad;
	}
	if (!(temp >= 0 && temp <= 2)) {
		fail(&e, "temperature", "'temperature' must be in [0, 2]");
		goto bad;
	}
	if (!(top_p > 0 && top_p <= 1)) {
		fail(&e, "top_p", "'top_p' must be in (0, 1]");
		goto bad;
	}
	if ((v = json_object_get(body, "stream_options")) && !json_is_null(v)) {
		if (!json_is_object(v)) {
			fail(&e, "stream_options", "'stream_options' must be an object");
			goto bad;
		}
		json_t *iu = json_object_get(v, "include_usage");
		if (iu && !json_is_null(iu) && !json_is_boolean(iu)) {
			fail(&e, "stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
			goto bad;
		}
		include_usage = json_is_true(iu);
	}
	if (session && !kvt_name_valid(session)) {
		fail(&e, "session_id", "'session_id' must be 1-128 characters of [A-Za-z0-9._-], not starting with '.'");
		goto bad;
	}
	if (request_tenant(r, user, n_user, &e))
		goto bad;

	j = calloc(1, sizeof(*j));
	if (!j)
		goto oom;
	j->srv = srv;
	j->tok = tok;
	j->req = r;
	j->chat = chat;
	j->stream = stream;
	j->include_usage = include_usage;
	j->logprobs = want_lp;
	if (chat && kvt_oai_tools_parse(body, &j->tools, &oe)) {
		fail(&e, oe.param, "%s", oe.msg);
		goto bad;
	}
	if (grammar && j->tools.g) {
		fail(&e, "response_format", "'response_format' cannot be combined with a required or named 'tool_choice'");
		goto bad;
	}
	if (j->tools.g)
		grammar = kvt_grammar_ref(j->tools.g);
	j->created = (int64_t)time(NULL);
	waiter_init(&j->w, r->con);
	j->usage = r->usage;
	snprintf(j->session_id, sizeof(j->session_id), "%s", session ? session : "");
	{
		char hex[25];
		random_hex(hex, 12);
		snprintf(j->id, sizeof(j->id), "%s%s", chat ? "chatcmpl-" : "cmpl-", hex);
	}
	if ((v = json_object_get(body, "stop")) && !json_is_null(v)) {
		size_t k = 1;
		if (json_is_array(v)) {
			k = json_array_size(v);
			if (k > SRV_MAX_STOPS) {
				fail(&e, "stop", "'stop' may hold at most %d strings", SRV_MAX_STOPS);
				goto bad;
			}
		} else if (!json_is_string(v)) {
			fail(&e, "stop", "'stop' must be a string or an array of strings");
			goto bad;
		}
		for (size_t i = 0; i < k; i++) {
			json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
			if (!json_is_string(s)) {
				fail(&e, "stop", "'stop' must be a string or an array of strings");
				goto bad;
			}
			size_t len = json_string_length(s);
			if (len == 0)
				continue; /* an empty stop string would match everywhere: ignored */
			if (!(j->stops[j->n_stops] = malloc(len + 1)))
				goto oom;
			memcpy(j->stops[j->n_stops], json_string_value(s), len + 1);
			j->stop_len[j->n_stops++] = len;
			if (len > j->max_stop_len)
				j->max_stop_len = len;
		}
	}

	if (chat) {
		char *tools_text = kvt_oai_tools_prompt(&j->tools);
		int cr = chat_prompt(tok, json_object_get(body, "messages"), tools_text, &ids, &n_ids, &e);
		free(tools_text);
		if (cr)
			goto bad;
	} else if (completion_prompt(tok, n_vocab, json_object_get(body, "prompt"), parse_special, &ids, &n_ids, &e)) {
		goto bad;
	}
	if (n_ids == 0) {
		fail(&e, chat ? "messages" : "prompt", "the prompt is empty");
		goto bad;
	}
	for (uint32_t i = 0; i < n_ids; i++)
		if (ids[i] < 0 || (uint32_t)ids[i] >= n_vocab) { /* a tokenizer bigger than the model */
			fail(&e, chat ? "messages" : "prompt", "the prompt has token id %d, outside the model's vocabulary (%u)",
			     ids[i], n_vocab);
			goto bad;
		}
	if ((uint64_t)n_ids + (uint64_t)max_tokens > max_ctx) {
		fail(&e, mt_key, "the prompt (%u tokens) plus '%s' (%lld) exceeds the context (%u tokens)", n_ids,
		     mt_key, max_tokens, max_ctx);
		goto bad;
	}
	if (echo) { /* the prompt as text, ahead of each choice's text */
		json_t *pr = json_object_get(body, "prompt");
		if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
			pr = json_array_get(pr, 0);
		sbuf t = { 0 };
		if (json_is_string(pr)) {
			sbuf_add(&t, json_string_value(pr), json_string_length(pr));
		} else {
			for (uint32_t i = 0; i < n_ids; i++) {
				const char *b;
				size_t nb;
				if (kvt_tok_token_bytes(tok, ids[i], &b, &nb) == KVT_OK)
					sbuf_add(&t, b, nb);
			}
		}
		sbuf_add(&t, "", 0);
		if (t.failed) {
			free(t.p);
			goto oom;
		}
		if (!json_is_string(pr))
			utf8_scrub(t.p);
		j->echo = t.p;
		j->n_echo = json_is_string(pr) ? t.n : strlen(t.p);
	}
	if (kvt_cachectl_parse(tok, body, chat, ids, n_ids, &j->cc, e.param, sizeof(e.param), e.msg, sizeof(e.msg)))
		goto bad;
	j->n_prompt = n_ids;
	atomic_store(&r->n_prompt, n_ids);

	if (atomic_load(&srv->draining)) {
		ret = reply_error(r, 503, NULL, "draining", "the server is shutting down");
		goto out;
	}
	if (!in_flight_take(srv)) {
		ret = reply_error(r, 503, NULL, "overloaded", "too many requests in flight (%u); retry shortly",
				  cfg->max_concurrent);
		goto out;
	}
	j->counted = true;
	if (!(j->ch = calloc((size_t)n, sizeof(*j->ch))))
		goto oom;
	if (!have_seed)
		seed = (long long)(random_u64() >> 1);
	for (uint32_t i = 0; i < (uint32_t)n; i++) {
		kvt_sched_req q;
		memset(&q, 0, sizeof(q));
		q.prompt = ids;
		q.n_prompt = n_ids;
		q.max_tokens = (uint32_t)max_tokens;
		q.sample.temp = (float)temp;
		q.sample.top_p = (float)top_p;
		q.sample.top_k = (uint32_t)top_k;
		q.sample.seed = (uint64_t)seed + i;
		q.sample.presence_penalty = (float)presence;
		q.sample.frequency_penalty = (float)frequency;
		q.sample.repetition_penalty = (float)repetition;
		q.sample.min_p = (float)min_p;
		q.sample.n_bias = n_bias;
		if (n_bias)
			memcpy(q.sample.bias, bias, n_bias * sizeof(*bias));
		q.grammar = grammar;
		q.logprobs = want_lp;
		q.top_logprobs = (uint32_t)top_lp;
		q.ignore_eos = ignore_eos;
		q.has_priority = have_priority;
		q.priority = (int)priority;
		if (want_lp && !(j->ch[i].lp = chat ? json_array() : kvt_oai_lp_completion_new()))
			goto oom;
		snprintf(q.tenant, sizeof(q.tenant), "%s", r->tenant);
		if (i == 0 && session) /* the session's history is the first choice's turn */
			snprintf(q.session_id, sizeof(q.session_id), "%s", session);
		if (i == 0) { /* the choices share the prompt: one retains it */
			memcpy(q.retain, j->cc.retain, sizeof(q.retain));
			q.n_retain = j->cc.n_retain;
		}
		kvt_tok_stream_init(&j->ch[i].ds);
		int rc = kvt_sched_submit(sched, &q, &j->ch[i].h);
		if (rc != KVT_OK) {
			j->ch[i].h = NULL;
			j->n = i; /* job_free releases the ones submitted */
			if (rc == KVT_EFULL)
				ret = reply_error(r, 503, NULL, "overloaded", "the request queue is full; retry shortly");
			else if (rc == KVT_EIO)
				ret = reply_error(r, 503, NULL, "draining", "the server is shutting down");
			else if (rc == KVT_EINVAL)
				ret = reply_error(r, 400, NULL, NULL, "the engine refused the request (see the server log)");
			else
				ret = reply_error(r, 500, NULL, NULL, "the engine could not take the request (%s)",
						  kvt_strerror(rc));
			goto out;
		}
		j->n = i + 1;
	}

	if (stream) {
		struct MHD_Response *resp =
			MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 << 10, sse_reader, j, sse_free);
		if (!resp)
			goto oom;
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
		MHD_add_response_header(resp, "X-Accel-Buffering", "no"); /* a proxy (nginx) must not hold events back */
		r->status = 200;
		r->answered = true;
		ret = MHD_queue_response(r->con, 200, resp);
		MHD_destroy_response(resp);
		j = NULL; /* the response owns it now */
		goto out;
	}

	/* non-streaming: park the connection until the choices end (gen_continue) */
	r->job = j;
	j = NULL;
	ret = gen_continue(r);
	goto out;

oom:
	ret = reply_error(r, 500, NULL, NULL, "out of memory");
	goto out;
bad:
	ret = reply_error(r, 400, e.param[0] ? e.param : NULL, NULL, "%s", e.msg);
out:
	job_free(j);
	free(ids);
	free(bias);
	kvt_grammar_unref(grammar);
	json_decref(body);
	return ret;
}

/* ------------------------------------------------------------------------ */
/* health, models, metrics, stats                                             */

/*
 * 200 "ok", or 200 "degraded" with what is degraded (the index rolling back
 * for lack of space, a tier full or read-only): the daemon serves, but what it
 * acknowledges may not be durable yet. 503 while loading or draining.
 */
static enum MHD_Result handle_health(conn_req *r)
{
	kvt_server *srv = r->srv;
	kvt_sched *sched = atomic_load(&srv->sched);
	const char *st = !sched ? "loading" : atomic_load(&srv->draining) ? "draining" : "ok";
	if (strcmp(st, "ok"))
		return reply_json(r, 503, json_pack("{s:s}", "status", st), true);
	kvt_sched_stats ss;
	kvt_sched_get_stats(sched, &ss);
	json_t *what = json_array();
	if (ss.index.degraded)
		json_array_append_new(what, json_string("index"));
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		if (ss.have_tiers && ss.tiers.tier[t].degraded)
			json_array_append_new(what, json_string(tier_name[t]));
	if (ss.have_tiers && ss.tiers.has_remote && ss.tiers.remote.degraded)
		json_array_append_new(what, json_string("remote")); /* served on without it: misses */
	if (!json_array_size(what)) {
		json_decref(what);
		return reply_json(r, 200, json_pack("{s:s}", "status", "ok"), false);
	}
	return reply_json(r, 200, json_pack("{s:s, s:o}", "status", "degraded", "degraded", what), false);
}

static json_t *model_json(const kvt_server *srv)
{
	return json_pack("{s:s, s:s, s:I, s:s}", "id", srv->model_id, "object", "model", "created",
			 (json_int_t)srv->created, "owned_by", "kvtier");
}

static enum MHD_Result handle_models(conn_req *r)
{
	return reply_json(r, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_json(r->srv)), false);
}

/* GET /v1/models/{id}: the served model, or 404 model_not_found (id empty when it was too long). */
static enum MHD_Result handle_model(conn_req *r, const char *id)
{
	if (!id[0] || strcmp(id, r->srv->model_id))
		return reply_error(r, 404, "model", "model_not_found", "no model '%s' (this server serves '%s')",
				   id[0] ? id : "(too long)", r->srv->model_id);
	return reply_json(r, 200, model_json(r->srv), false);
}

static void metric_head(sbuf *b, const char *name, const char *type, const char *help)
{
	sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* v[KVT_TM_N_TIERS]: the remote tier's value (last) is printed only when one is configured. */
static int metric_n_tiers = KVT_TIER_COUNT;
static void metric_tiers(sbuf *b, const char *name, const char *type, const char *help, const uint64_t *v)
{
	metric_head(b, name, type, help);
	for (int t = 0; t < metric_n_tiers; t++)
		sbuf_printf(b, "%s{tier=\"%s\"} %llu\n", name, tier_name[t], (unsigned long long)v[t]);
}

static void metric_one(sbuf *b, const char *name, const char *type, const char *help, uint64_t v)
{
	metric_head(b, name, type, help);
	sbuf_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

/* The scheduler's queue, preemptions and TTFT by priority. */
static void metric_sched(sbuf *b, const kvt_sched_stats *st)
{
	metric_one(b, "kvtier_scheduler_steps_total", "counter", "Scheduler steps (batches) run.", st->steps);
	metric_one(b, "kvtier_scheduler_device_steps_total", "counter",
		   "Scheduler steps run as one device decode call (graph launch, tokens picked on the device).",
		   st->device_steps);
	metric_head(b, "kvtier_queue_wait_seconds", "summary",
		    "Time from submit (or preemption) to admission; quantiles over the last 1024.");
	sbuf_printf(b, "kvtier_queue_wait_seconds{quantile=\"0.5\"} %.9g\nkvtier_queue_wait_seconds{quantile=\"0.99\"} %.9g\n",
		    st->queue_wait_p50_s, st->queue_wait_p99_s);
	sbuf_printf(b, "kvtier_queue_wait_seconds_sum %.9g\nkvtier_queue_wait_seconds_count %llu\n", st->queue_wait_sum_s,
		    (unsigned long long)st->queue_waits);
	metric_head(b, "kvtier_preemptions_total", "counter", "Sequences preempted because T0 was full, by how they resume.");
	sbuf_printf(b, "kvtier_preemptions_total{mode=\"swap\"} %llu\nkvtier_preemptions_total{mode=\"recompute\"} %llu\n",
		    (unsigned long long)st->preempt_swap, (unsigned long long)st->preempt_recompute);
	metric_one(b, "kvtier_preempted_tokens_total", "counter", "Tokens of KV the preempted sequences let go.",
		   st->preempt_tokens);
	metric_one(b, "kvtier_preempt_recomputed_tokens_total", "counter", "Tokens prefilled again on resuming.",
		   st->resume_recomputed_tokens);
	metric_head(b, "kvtier_ttft_by_priority_seconds", "summary", "Time to first token by request priority.");
	for (int i = 0; i < KVT_PRIORITY_LEVELS; i++)
		if (st->ttft_by_priority_n[i])
			sbuf_printf(b,
				    "kvtier_ttft_by_priority_seconds_sum{priority=\"%d\"} %.9g\n"
				    "kvtier_ttft_by_priority_seconds_count{priority=\"%d\"} %llu\n",
				    i + KVT_PRIORITY_MIN, st->ttft_by_priority_sum_s[i], i + KVT_PRIORITY_MIN,
				    (unsigned long long)st->ttft_by_priority_n[i]);
}

static enum MHD_Result handle_metrics(conn_req *r, kvt_sched *sched)
{
	kvt_sched_stats st;
	kvt_sched_get_stats(sched, &st);
	sbuf b = { 0 };
	uint64_t v[KVT_TM_N_TIERS];
	/* NOTE: a per-call value would be cleaner; every /metrics of one daemon has the same tiers */
	metric_n_tiers = st.tiers.has_remote ? KVT_TM_N_TIERS : KVT_TIER_COUNT;
#define TIERS(field)                                          \
	do {                                                  \
		for (int t_ = 0; t_ < KVT_TIER_COUNT; t_++) \
			v[t_] = (uint64_t)(st.tiers.tier[t_].field); \
		v[KVT_TM_TIER_REMOTE] = (uint64_t)(st.tiers.remote.field); \
	} while (0)
	TIERS(capacity_bytes);
	metric_tiers(&b, "kvtier_tier_capacity_bytes", "gauge", "Capacity of the tier in bytes.", v);
	TIERS(used_bytes);
	metric_tiers(&b, "kvtier_tier_used_bytes", "gauge", "Bytes in use in the tier.", v);
	TIERS(used_blocks);
	metric_tiers(&b, "kvtier_tier_blocks", "gauge", "Blocks held by the tier.", v);
	TIERS(hits);
	metric_tiers(&b, "kvtier_tier_hits_total", "counter", "Blocks asked for that were found first in the tier.", v);
	TIERS(misses);
	metric_tiers(&b, "kvtier_tier_misses_total", "counter", "Blocks asked for that the tier did not hold.", v);
	TIERS(n_promotions);
	metric_tiers(&b, "kvtier_tier_promotions_total", "counter", "Blocks copied into the tier from the one below.", v);
	TIERS(promotion_bytes);
	metric_tiers(&b, "kvtier_tier_promotion_bytes_total", "counter", "Bytes read from the lower tier for promotions.", v);
	TIERS(n_demotions);
	metric_tiers(&b, "kvtier_tier_demotions_total", "counter", "Blocks copied out of the tier to the one below.", v);
	TIERS(demotion_bytes);
	metric_tiers(&b, "kvtier_tier_demotion_bytes_total", "counter", "Bytes written to the lower tier for demotions.", v);
	TIERS(n_evictions);
	metric_tiers(&b, "kvtier_tier_evictions_total", "counter", "Blocks that left the tier to make room.", v);
	TIERS(n_corrupt);
	metric_tiers(&b, "kvtier_tier_corrupt_blocks_total", "counter", "Records that failed verification.", v);
	TIERS(degraded);
	metric_tiers(&b, "kvtier_tier_degraded", "gauge", "1 when the tier is full or read-only.", v);
#undef TIERS
	metric_one(&b, "kvtier_index_degraded", "gauge",
		   "1 while index transactions roll back for lack of space (their writes are kept and retried).",
		   st.index.degraded);
	metric_one(&b, "kvtier_index_rolled_back_total", "counter", "Index transactions rolled back for lack of space.",
		   st.index.n_full);
	metric_one(&b, "kvtier_index_kept_session_writes", "gauge", "Session writes kept for the next index transaction.",
		   st.index.n_carried);
	metric_one(&b, "kvtier_index_bad_session_rows_total", "counter", "Session rows that do not decode, skipped.",
		   st.index.n_bad_sessions);
	metric_one(&b, "kvtier_requests_total", "counter", "Requests finished.", st.requests);
	metric_one(&b, "kvtier_requests_running", "gauge", "Sequences running now.", st.running);
	metric_one(&b, "kvtier_requests_queued", "gauge", "Requests waiting.", st.queued);
	metric_one(&b, "kvtier_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", st.prompt_tokens);
	metric_one(&b, "kvtier_completion_tokens_total", "counter", "Tokens generated.", st.completion_tokens);
	metric_one(&b, "kvtier_prefix_cache_queries_tokens_total", "counter", "Tokens looked up in the prefix cache.",
		   st.prefix_queries_tokens);
	metric_one(&b, "kvtier_prefix_cache_hits_tokens_total", "counter", "Tokens found in the prefix cache.",
		   st.prefix_hits_tokens);
	metric_tiers(&b, "kvtier_cached_tokens_total", "counter", "Prompt tokens served from the cache, by tier.",
		     st.cached_by_tier);
	if (st.tiers.has_remote) {
		const kvt_t3_stats *r3 = &st.tiers.t3;
		metric_one(&b, "kvtier_remote_read_bytes_total", "counter", "Record bytes read from T3.", r3->bytes_in);
		metric_one(&b, "kvtier_remote_written_bytes_total", "counter", "Record bytes written to T3.", r3->bytes_out);
		metric_one(&b, "kvtier_remote_errors_total", "counter",
			   "T3 commands that failed (node down, timeout, OOM, error reply): misses.", r3->n_errors);
		metric_one(&b, "kvtier_remote_write_queue", "gauge", "Blocks and sessions waiting to be written to T3.",
			   st.tiers.n_remote_queued);
		metric_one(&b, "kvtier_remote_write_skipped_total", "counter", "Blocks never written to T3 (queue full).",
			   st.tiers.n_remote_skipped);
		metric_head(&b, "kvtier_remote_round_seconds", "histogram", "Latency of one pipelined T3 round.");
		uint64_t c3 = 0;
		for (unsigned i = 0; i < KVT_T3_LAT_BUCKETS; i++) {
			c3 += r3->lat[i];
			if (i == KVT_T3_LAT_BUCKETS - 1)
				sbuf_printf(&b, "kvtier_remote_round_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)c3);
			else
				sbuf_printf(&b, "kvtier_remote_round_seconds_bucket{le=\"%g\"} %llu\n", kvt_t3_lat_bounds[i],
					    (unsigned long long)c3);
		}
		sbuf_printf(&b, "kvtier_remote_round_seconds_sum %.9g\nkvtier_remote_round_seconds_count %llu\n",
			    r3->lat_sum_s, (unsigned long long)c3);
	}
	metric_head(&b, "kvtier_ttft_seconds", "histogram", "Time to first token.");
	uint64_t cum = 0;
	for (int i = 0; i < KVT_TTFT_BUCKETS; i++) {
		cum += st.ttft_bucket[i];
		if (i == KVT_TTFT_BUCKETS - 1)
			sbuf_printf(&b, "kvtier_ttft_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
		else
			sbuf_printf(&b, "kvtier_ttft_seconds_bucket{le=\"%g\"} %llu\n", kvt_ttft_bucket_le[i],
				    (unsigned long long)cum);
	}
	sbuf_printf(&b, "kvtier_ttft_seconds_sum %.9g\nkvtier_ttft_seconds_count %llu\n", st.ttft_sum_s,
		    (unsigned long long)cum);
	metric_sched(&b, &st);
	if (b.failed) {
		free(b.p);
		return reply_error(r, 500, NULL, NULL, "out of memory");
	}
	return reply_buf(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.n, false);
}

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0.0;
}

/* The scheduler's queue, preemption and per-priority numbers (/v1/stats "scheduler"). */
static json_t *stats_sched(const kvt_sched_stats *st)
{
	json_t *by_prio = json_array();
	for (int i = 0; i < KVT_PRIORITY_LEVELS; i++)
		if (st->ttft_by_priority_n[i])
			json_array_append_new(by_prio,
					      json_pack("{s:i, s:I, s:f}", "priority", i + KVT_PRIORITY_MIN, "requests",
							(json_int_t)st->ttft_by_priority_n[i], "ttft_mean_ms",
							st->ttft_by_priority_sum_s[i] * 1e3 / (double)st->ttft_by_priority_n[i]));
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:{s:I, s:I, s:I, s:I, s:I}, s:o}", "steps",
			 (json_int_t)st->steps, "device_steps", (json_int_t)st->device_steps, "queue_depth", (json_int_t)st->queued, "running_peak",
			 (json_int_t)st->running_peak, "admissions", (json_int_t)st->queue_waits, "queue_wait_mean_ms",
			 ratio(st->queue_wait_sum_s * 1e3, (double)st->queue_waits), "queue_wait_p50_ms",
			 st->queue_wait_p50_s * 1e3, "queue_wait_p99_ms", st->queue_wait_p99_s * 1e3, "preemptions", "swap",
			 (json_int_t)st->preempt_swap, "recompute", (json_int_t)st->preempt_recompute, "tokens_held",
			 (json_int_t)st->preempt_tokens, "tokens_swapped_in", (json_int_t)st->resume_swapped_in_tokens,
			 "tokens_recomputed", (json_int_t)st->resume_recomputed_tokens, "ttft_by_priority", by_prio);
}

static enum MHD_Result handle_stats(conn_req *r, kvt_sched *sched)
{
	kvt_server *srv = r->srv;
	kvt_sched_stats st;
	kvt_sched_get_stats(sched, &st);
	json_t *tiers = json_array();
	const char *rec_dtype = srv->kv_dtype;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		const kvt_tm_tier_stats *ts = &st.tiers.tier[t];
		json_array_append_new(
			tiers,
			json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:f, s:I, s:I, s:f, s:I, s:I, s:f, s:s,"
				  " s:I, s:b}",
				  "name", tier_name[t], "capacity_bytes", (json_int_t)ts->capacity_bytes, "used_bytes",
				  (json_int_t)ts->used_bytes, "capacity_blocks", (json_int_t)ts->capacity_blocks,
				  "blocks", (json_int_t)ts->used_blocks, "hits", (json_int_t)ts->hits, "misses",
				  (json_int_t)ts->misses, "hit_rate", ratio((double)ts->hits, (double)(ts->hits + ts->misses)),
				  "promotions", (json_int_t)ts->n_promotions, "promotion_bytes",
				  (json_int_t)ts->promotion_bytes, "promotion_mb_s",
				  ratio((double)ts->promotion_bytes / 1e6, ts->promotion_s), "demotions",
				  (json_int_t)ts->n_demotions, "demotion_bytes", (json_int_t)ts->demotion_bytes,
				  "demotion_mb_s", ratio((double)ts->demotion_bytes / 1e6, ts->demotion_s), "evictions",
				  (json_int_t)ts->n_evictions, "dropped", (json_int_t)ts->n_dropped, "compression_ratio",
				  st.have_tiers ? ts->compression_ratio : 1.0, "dtype",
				  t == KVT_TIER_HBM ? "f16" : rec_dtype, "corrupt", (json_int_t)ts->n_corrupt, "degraded",
				  (int)ts->degraded));
	}
	json_t *remote = json_null();
	if (st.tiers.has_remote) {
		const kvt_tm_tier_stats *ts = &st.tiers.remote;
		const kvt_t3_stats *r3 = &st.tiers.t3;
		json_t *lat = json_array();
		for (unsigned i = 0; i < KVT_T3_LAT_BUCKETS; i++)
			json_array_append_new(lat, json_integer((json_int_t)r3->lat[i]));
		json_array_append_new(
			tiers, json_pack("{s:s, s:I, s:I, s:f, s:I, s:I, s:f, s:I, s:I, s:s, s:I, s:b}", "name", "remote",
					 "hits", (json_int_t)ts->hits, "misses", (json_int_t)ts->misses, "hit_rate",
					 ratio((double)ts->hits, (double)(ts->hits + ts->misses)), "promotions",
					 (json_int_t)ts->n_promotions, "promotion_bytes", (json_int_t)ts->promotion_bytes,
					 "promotion_mb_s", ratio((double)ts->promotion_bytes / 1e6, ts->promotion_s),
					 "demotions", (json_int_t)ts->n_demotions, "demotion_bytes", (json_int_t)r3->bytes_out,
					 "dtype", rec_dtype, "corrupt", (json_int_t)ts->n_corrupt, "degraded",
					 (int)ts->degraded));
		remote = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:o, s:b}", "bytes_in",
				   (json_int_t)r3->bytes_in, "bytes_out", (json_int_t)r3->bytes_out, "writes",
				   (json_int_t)r3->n_writes, "errors", (json_int_t)r3->n_errors, "corrupt",
				   (json_int_t)r3->n_corrupt, "sessions_written", (json_int_t)r3->n_sessions_put,
				   "sessions_read", (json_int_t)r3->n_sessions_got, "write_queue",
				   (json_int_t)st.tiers.n_remote_queued, "write_skipped", (json_int_t)st.tiers.n_remote_skipped,
				   "write_refused", (json_int_t)st.tiers.n_remote_failed, "round_seconds_sum", r3->lat_sum_s,
				   "round_seconds_buckets", lat, "degraded", (int)r3->degraded);
	}
	json_t *engine = json_pack(
		"{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:f, s:f, s:f, s:f, s:{s:I, s:I, s:I, s:I}}", "requests",
		(json_int_t)st.requests, "requests_failed", (json_int_t)st.requests_failed, "running",
		(json_int_t)st.running, "queued", (json_int_t)st.queued, "prompt_tokens", (json_int_t)st.prompt_tokens,
		"cached_tokens", (json_int_t)st.cached_tokens, "reusable_tokens", (json_int_t)st.reusable_tokens,
		"cache_efficiency", ratio((double)st.cached_tokens, (double)st.reusable_tokens), "prefill_tokens_saved",
		(json_int_t)st.cached_tokens, "completion_tokens", (json_int_t)st.completion_tokens, "ttft_p50_ms",
		st.ttft_p50_s * 1e3, "ttft_p99_ms", st.ttft_p99_s * 1e3, "prefill_tokens_per_s",
		ratio((double)st.prefill_tokens, st.prefill_s), "decode_tokens_per_s",
		ratio((double)st.completion_tokens, st.decode_s), "cached_tokens_by_tier", "hbm",
		(json_int_t)st.cached_by_tier[KVT_TIER_HBM], "host", (json_int_t)st.cached_by_tier[KVT_TIER_HOST], "nvme",
		(json_int_t)st.cached_by_tier[KVT_TIER_NVME], "remote", (json_int_t)st.cached_by_tier[KVT_TM_TIER_REMOTE]);
	json_t *persist = json_pack("{s:I, s:I, s:I, s:b, s:b, s:I, s:I, s:I, s:I}", "registered",
				    (json_int_t)st.tiers.n_registered, "persisted", (json_int_t)st.tiers.n_persisted,
				    "failed", (json_int_t)st.tiers.n_persist_failed, "read_only", (int)st.tiers.t2_read_only,
				    "degraded", (int)(st.index.degraded || st.tiers.tier[KVT_TIER_NVME].degraded),
				    "lost_at_start", (json_int_t)st.tiers.n_lost, "skipped_at_start",
				    (json_int_t)st.tiers.n_skipped, "other_namespace_records",
				    (json_int_t)st.tiers.n_foreign, "other_namespace_reclaimed", (json_int_t)st.tiers.n_reclaimed);
	json_t *index = json_pack("{s:b, s:I, s:I, s:I, s:I, s:I}", "degraded", (int)st.index.degraded, "commits",
				  (json_int_t)st.index.n_commits, "failed_writes", (json_int_t)st.index.n_failed,
				  "rolled_back", (json_int_t)st.index.n_full, "kept_session_writes",
				  (json_int_t)st.index.n_carried, "bad_session_rows", (json_int_t)st.index.n_bad_sessions);
	return reply_json(r, 200,
			  json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:I, s:f, s:s, s:o*, s:o*}", "tiers", tiers, "engine", engine,
				    "scheduler", stats_sched(&st), "persist", persist, "index", index, "remote", remote,
				    "sessions", (json_int_t)st.sessions, "uptime_s", kvt_now_s() - srv->t_start, "model",
				    srv->model_id, "retention", kvt_dashboard_retention(sched, &st, NULL), "sessions_table",
				    kvt_dashboard_sessions(sched, 100)),
			  false);
}

/* ------------------------------------------------------------------------ */
/* sessions                                                                   */

/* The tenant of a body-less request with no API keys: ?user=NAME, else "default". */
/*
 * The tenant of a request without a body: ?user=NAME without keys. With
 * keys, the key's tenant; an admin key may name another with ?tenant=NAME,
 * or every tenant with ?tenant=* where allow_all (a listing). -1 with e set
 * (400); -2 when a tenant key asks for another tenant (403).
 */
static int query_tenant_ex(conn_req *r, bool allow_all, field_err *e)
{
	const char *t = MHD_lookup_connection_value(r->con, MHD_GET_ARGUMENT_KIND, "tenant");
	if (auth_on(r->srv) && t) {
		if (!r->admin)
			return -2;
		if (!strcmp(t, "*") && allow_all) {
			r->all_tenants = true;
			return 0;
		}
		if (!kvt_name_valid(t))
			return fail(e, "tenant", "'tenant' must be a tenant name%s", allow_all ? " or *" : "");
		snprintf(r->tenant, sizeof(r->tenant), "%s", t);
		return 0;
	}
	const char *user = MHD_lookup_connection_value(r->con, MHD_GET_ARGUMENT_KIND, "user");
	return request_tenant(r, user, user ? strlen(user) : 0, e);
}

static int query_tenant(conn_req *r, field_err *e)
{
	return query_tenant_ex(r, false, e);
}

/* The answer to a query_tenant_ex failure. */
static enum MHD_Result tenant_error(conn_req *r, int rc, const field_err *e)
{
	if (rc == -2)
		return reply_error(r, 403, "tenant", "admin_key_required",
				   "only an admin key (server.admin_keys) may act on another tenant's sessions");
	return reply_error(r, 400, e->param, NULL, "%s", e->msg);
}

static json_t *tiers3(const uint32_t v[KVT_TIER_COUNT])
{
	return json_pack("{s:I, s:I, s:I}", "hbm", (json_int_t)v[KVT_TIER_HBM], "host", (json_int_t)v[KVT_TIER_HOST],
			 "nvme", (json_int_t)v[KVT_TIER_NVME]);
}

static enum MHD_Result handle_sessions(conn_req *r, kvt_sched *sched)
{
	field_err e = { { 0 }, { 0 } };
	int trc = query_tenant_ex(r, true, &e);
	if (trc)
		return tenant_error(r, trc, &e);
	kvt_session_info *si = NULL;
	size_t n = 0;
	int rc = kvt_sched_sessions(sched, r->all_tenants ? NULL : r->tenant, &si, &n);
	if (rc != KVT_OK)
		return reply_error(r, 500, NULL, NULL, "listing the sessions failed (%s)", kvt_strerror(rc));
	json_t *data = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:I, s:o, s:I, s:I}", "id", si[i].id, "tenant",
						      si[i].tenant, "tokens", (json_int_t)si[i].n_tokens, "blocks",
						      (json_int_t)si[i].n_blocks, "blocks_in", tiers3(si[i].blocks_in),
						      "blocks_missing", (json_int_t)si[i].blocks_missing, "updated",
						      (json_int_t)(si[i].updated_us / 1000000)));
	free(si);
	return reply_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", data), false);
}

static enum MHD_Result handle_session_delete(conn_req *r, kvt_sched *sched, const char *id)
{
	field_err e = { { 0 }, { 0 } };
	int trc = query_tenant(r, &e);
	if (trc)
		return tenant_error(r, trc, &e);
	int rc = kvt_sched_session_delete(sched, r->tenant, id);
	if (rc == KVT_ENOTFOUND)
		return reply_error(r, 404, "id", "not_found", "no session '%s'", id);
	if (rc == KVT_EFULL)
		return reply_error(r, 503, NULL, NULL,
				   "deleting session '%s': the index is out of disk space; the deletion is kept and "
				   "commits once space returns", id);
	if (rc != KVT_OK)
		return reply_error(r, rc == KVT_EINVAL ? 400 : 500, NULL, NULL, "deleting session '%s' failed (%s)", id,
				   kvt_strerror(rc));
	return reply_json(r, 200, json_pack("{s:s, s:b}", "id", id, "deleted", 1), false);
}

static json_t *resume_json(const kvt_resume_report *rep)
{
	json_t *tok = tiers3(rep->tokens_from);
	if (tok)
		json_object_set_new(tok, "remote", json_integer((json_int_t)rep->tokens_from[KVT_TM_TIER_REMOTE]));
	return json_pack("{s:s, s:I, s:I, s:o, s:{s:I, s:I, s:I, s:I}, s:I, s:f, s:f, s:b, s:b}", "id", rep->id,
			 "tokens", (json_int_t)rep->n_tokens, "blocks", (json_int_t)rep->n_blocks, "restored_tokens", tok,
			 "restored_bytes", "hbm", (json_int_t)rep->bytes_from[KVT_TIER_HBM], "host",
			 (json_int_t)rep->bytes_from[KVT_TIER_HOST], "nvme", (json_int_t)rep->bytes_from[KVT_TIER_NVME],
			 "remote", (json_int_t)rep->bytes_from[KVT_TM_TIER_REMOTE], "missing_tokens",
			 (json_int_t)rep->tokens_missing, "seconds", rep->seconds, "prefill_seconds_avoided", rep->prefill_s,
			 "prefill_measured", (int)rep->prefill_measured, "session_from_remote", (int)rep->from_remote);
}

/*
 * A session resume runs on a thread of its own (it reads NVMe for as long as
 * it takes), never on an HTTP worker. Streamed, the content reader hands out
 * its NDJSON lines; not streamed, the connection parks until the report is
 * in (resume_continue). The thread and the HTTP side each hold a reference;
 * the last to let go frees it, so a client that hangs up never waits for the
 * resume to end. kvt_server_stop waits for every resume thread.
 */
typedef struct resume_job {
	kvt_server *srv;                  /* owner */
	kvt_sched *sched;                 /* borrowed */
	char tenant[KVT_NAME_MAX + 1];    /* the caller's tenant */
	char id[KVT_NAME_MAX + 1];        /* the session */
	bool stream;                      /* NDJSON progress lines (else one JSON report) */
	atomic_int refs;                  /* the thread + the HTTP side */
	pthread_mutex_t mu;               /* guards out, out_off, done, rc, rep */
	sbuf out;                         /* NDJSON not yet handed to MHD (stream) */
	size_t out_off;                   /* of those, already handed */
	bool done;                        /* the last line is in out / the report is in */
	int rc;                           /* kvt_sched_session_resume's result, once done */
	kvt_resume_report rep;            /* its report, once done */
	waiter w;                         /* parks the connection while nothing is new */
} resume_job;

static void resume_unref(resume_job *rj)
{
	if (atomic_fetch_sub(&rj->refs, 1) != 1)
		return;
	atomic_fetch_sub(&rj->srv->in_flight, 1);
	pthread_mutex_destroy(&rj->mu);
	free(rj->out.p);
	free(rj);
}

static void resume_put(resume_job *rj, json_t *v, bool last)
{
	char *s = v ? json_dumps(v, SRV_JSON_FLAGS) : NULL;
	json_decref(v);
	pthread_mutex_lock(&rj->mu);
	if (s) {
		sbuf_add(&rj->out, s, strlen(s));
		sbuf_add(&rj->out, "\n", 1);
	} else {
		rj->out.failed = true;
	}
	if (last)
		rj->done = true;
	pthread_mutex_unlock(&rj->mu);
	srv_wake(rj->srv);
	free(s);
}

static void resume_progress(void *user, uint32_t done, uint32_t total)
{
	resume_put(user, json_pack("{s:s, s:I, s:I}", "event", "progress", "blocks_done", (json_int_t)done,
				   "blocks_total", (json_int_t)total),
		   false);
}

static void *resume_main(void *arg)
{
	resume_job *rj = arg;
	kvt_server *srv = rj->srv;
	kvt_resume_report rep;
	memset(&rep, 0, sizeof(rep));
	int rc = kvt_sched_session_resume(rj->sched, rj->tenant, rj->id, rj->stream ? resume_progress : NULL, rj, &rep);
	if (rj->stream) {
		json_t *v;
		if (rc == KVT_OK) {
			v = resume_json(&rep);
			if (v)
				json_object_set_new(v, "event", json_string("done"));
		} else {
			v = json_pack("{s:s, s:o}", "event", "error", "error",
				      error_object(rc == KVT_ENOTFOUND ? "invalid_request_error" : "server_error", NULL,
						   rc == KVT_ENOTFOUND ? "not_found" : NULL,
						   rc == KVT_ENOTFOUND ? "the session is gone" : kvt_strerror(rc)));
		}
		resume_put(rj, v, true);
	} else {
		pthread_mutex_lock(&rj->mu);
		rj->rc = rc;
		rj->rep = rep;
		rj->done = true;
		pthread_mutex_unlock(&rj->mu);
		srv_wake(srv);
	}
	resume_unref(rj);
	atomic_fetch_sub(&srv->n_resume_threads, 1); /* last: kvt_server_stop may free srv after this */
	return NULL;
}

static ssize_t resume_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	resume_job *rj = cls;
	for (;;) {
		uint64_t seen = atomic_load(&rj->srv->wake_seq);
		pthread_mutex_lock(&rj->mu);
		if (rj->out.failed) {
			pthread_mutex_unlock(&rj->mu);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		if (rj->out_off < rj->out.n) {
			size_t k = rj->out.n - rj->out_off < max ? rj->out.n - rj->out_off : max;
			memcpy(buf, rj->out.p + rj->out_off, k);
			rj->out_off += k;
			if (rj->out_off == rj->out.n)
				rj->out_off = rj->out.n = 0;
			pthread_mutex_unlock(&rj->mu);
			return (ssize_t)k;
		}
		bool done = rj->done;
		pthread_mutex_unlock(&rj->mu);
		if (done)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (peer_gone(rj->w.fd) || atomic_load(&rj->srv->stopping))
			return MHD_CONTENT_READER_END_WITH_ERROR; /* the resume runs to its end on its thread */
		if (park(rj->srv, &rj->w, seen))
			return 0;
	}
}

static void resume_free(void *cls)
{
	resume_unref(cls);
}

/* A non-streamed resume, each time MHD runs its connection: park until the report is in, then answer. */
static enum MHD_Result resume_continue(conn_req *r)
{
	resume_job *rj = r->rj;
	enum MHD_Result ret;
	for (;;) {
		uint64_t seen = atomic_load(&r->srv->wake_seq);
		pthread_mutex_lock(&rj->mu);
		bool done = rj->done;
		pthread_mutex_unlock(&rj->mu);
		if (done) {
			const char *id = rj->id;
			if (rj->rc == KVT_ENOTFOUND)
				ret = reply_error(r, 404, "id", "not_found", "no session '%s'", id);
			else if (rj->rc != KVT_OK)
				ret = reply_error(r, rj->rc == KVT_EINVAL ? 400 : 500, NULL, NULL,
						  "resuming session '%s' failed (%s)", id, kvt_strerror(rj->rc));
			else
				ret = reply_json(r, 200, resume_json(&rj->rep), false);
			break;
		}
		if (peer_gone(rj->w.fd) || atomic_load(&r->srv->stopping)) {
			ret = MHD_NO; /* the resume runs to its end on its thread */
			r->status = 499;
			break;
		}
		if (park(r->srv, &rj->w, seen))
			return MHD_YES;
	}
	r->rj = NULL;
	resume_unref(rj);
	return ret;
}

static enum MHD_Result handle_resume(conn_req *r, kvt_sched *sched, const char *id)
{
	field_err e = { { 0 }, { 0 } };
	bool stream = false;
	const char *user = NULL;
	size_t n_user = 0;
	json_t *body = NULL;
	if (r->n_body) {
		enum MHD_Result ret;
		if (!(body = load_body(r, &ret)))
			return ret;
		if (get_bool(body, "stream", &stream, &e) || get_str(body, "user", &user, &n_user, &e)) {
			json_decref(body);
			return reply_error(r, 400, e.param, NULL, "%s", e.msg);
		}
	}
	int bad = user && !auth_on(r->srv) ? request_tenant(r, user, n_user, &e) : query_tenant(r, &e);
	json_decref(body); /* user points into body: used above only */
	if (bad)
		return tenant_error(r, bad, &e);

	if (stream) { /* answer 404 before the 200 header when the session is unknown */
		kvt_session_info *si = NULL;
		size_t n = 0;
		bool found = false;
		int rc = kvt_sched_sessions(sched, r->tenant, &si, &n);
		if (rc != KVT_OK)
			return reply_error(r, 500, NULL, NULL, "listing the sessions failed (%s)", kvt_strerror(rc));
		for (size_t i = 0; i < n && !found; i++)
			found = !strcmp(si[i].id, id);
		free(si);
		/* another node's conversation: T3 may have it (asked within its command timeout) */
		if (!found && kvt_sched_session_remote(sched, r->tenant, id) == KVT_OK)
			found = true;
		if (!found)
			return reply_error(r, 404, "id", "not_found", "no session '%s'", id);
	}
	if (!in_flight_take(r->srv))
		return reply_error(r, 503, NULL, "overloaded", "too many requests in flight (%u); retry shortly",
				   r->srv->cfg.max_concurrent);
	resume_job *rj = calloc(1, sizeof(*rj));
	if (!rj) {
		atomic_fetch_sub(&r->srv->in_flight, 1);
		return reply_error(r, 500, NULL, NULL, "out of memory");
	}
	rj->srv = r->srv;
	rj->sched = sched;
	rj->stream = stream;
	atomic_init(&rj->refs, 2);
	waiter_init(&rj->w, r->con);
	snprintf(rj->tenant, sizeof(rj->tenant), "%s", r->tenant);
	snprintf(rj->id, sizeof(rj->id), "%.*s", KVT_NAME_MAX, id);
	pthread_mutex_init(&rj->mu, NULL);
	struct MHD_Response *resp = NULL;
	if (stream && !(resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, resume_reader, rj, resume_free))) {
		atomic_store(&rj->refs, 1);
		resume_unref(rj);
		return reply_error(r, 500, NULL, NULL, "out of memory");
	}
	pthread_t th;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	atomic_fetch_add(&r->srv->n_resume_threads, 1);
	int prc = pthread_create(&th, &at, resume_main, rj);
	pthread_attr_destroy(&at);
	if (prc != 0) {
		atomic_fetch_sub(&r->srv->n_resume_threads, 1);
		atomic_store(&rj->refs, 1); /* the HTTP side's alone */
		if (resp)
			MHD_destroy_response(resp); /* calls resume_free */
		else
			resume_unref(rj);
		return reply_error(r, 500, NULL, NULL, "could not start the resume thread");
	}
	if (!stream) {
		r->rj = rj;
		return resume_continue(r);
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-ndjson");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
	MHD_add_response_header(resp, "X-Accel-Buffering", "no");
	r->status = 200;
	r->answered = true;
	enum MHD_Result ret = MHD_queue_response(r->con, 200, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* ------------------------------------------------------------------------ */
/* routing                                                                    */

enum route {
	R_NONE = 0,
	R_HEALTH,
	R_METRICS,
	R_MODELS,
	R_MODEL,          /* /v1/models/{id} */
	R_COMPLETIONS,
	R_CHAT,
	R_STATS,
	R_SESSIONS,
	R_SESSION,        /* /v1/sessions/{id} */
	R_SESSION_RESUME, /* /v1/sessions/{id}/resume */
	R_DASHBOARD,      /* /dashboard: the live view (dashboard.h) */
};

/* Which route a path names; *id (sessions) points into a buffer of the caller. */
static enum route route_of(const char *path, char *id, size_t id_cap)
{
	static const struct { const char *path; enum route r; } fixed[] = {
		{ "/health", R_HEALTH },
		{ "/metrics", R_METRICS },
		{ "/v1/models", R_MODELS },
		{ "/v1/completions", R_COMPLETIONS },
		{ "/v1/chat/completions", R_CHAT },
		{ "/v1/stats", R_STATS },
		{ "/v1/sessions", R_SESSIONS },
		{ "/dashboard", R_DASHBOARD },
	};
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		if (!strcmp(path, fixed[i].path))
			return fixed[i].r;
	if (!strncmp(path, "/v1/models/", 11)) { /* a model id may hold '/' (org/name) */
		size_t len = strlen(path + 11);
		if (len == 0 || len >= id_cap)
			return len ? R_MODEL : R_NONE; /* too long for any id: answered as an unknown model */
		memcpy(id, path + 11, len + 1);
		return R_MODEL;
	}
	if (strncmp(path, "/v1/sessions/", 13) != 0)
		return R_NONE;
	const char *s = path + 13, *slash = strchr(s, '/');
	size_t len = slash ? (size_t)(slash - s) : strlen(s);
	if (len == 0 || len > KVT_NAME_MAX || len >= id_cap)
		return R_NONE;
	memcpy(id, s, len);
	id[len] = 0;
	if (!slash)
		return R_SESSION;
	return !strcmp(slash, "/resume") ? R_SESSION_RESUME : R_NONE;
}

static const char *route_method(enum route rt)
{
	switch (rt) {
	case R_COMPLETIONS:
	case R_CHAT:
	case R_SESSION_RESUME:
		return "POST";
	case R_SESSION:
		return "DELETE";
	default:
		return "GET";
	}
}

/* Constant-time compare of a presented key with a configured one. */
static bool key_equal(const char *a, size_t na, const char *b)
{
	size_t nb = strlen(b);
	unsigned diff = (unsigned)(na ^ nb);
	for (size_t i = 0; i < na; i++)
		diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (nb ? nb : 1)];
	return diff == 0 && nb > 0;
}

/* The presented key: an API key (its tenant) or an admin key (r->admin). False: none, or unknown. */
static bool authenticate(conn_req *r)
{
	kvt_server *srv = r->srv;
	const char *h = MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!h || strncasecmp(h, "Bearer ", 7) != 0)
		return false;
	const char *k = h + 7;
	while (*k == ' ')
		k++;
	size_t nk = strlen(k);
	while (nk && k[nk - 1] == ' ')
		nk--;
	bool ok = false;
	size_t n_all = srv->cfg.n_keys + srv->cfg.n_admin_keys;
	for (size_t i = 0; i < n_all; i++) /* every key compared: the time does not say which matched */
		if (key_equal(k, nk, srv->keys[i].key) && !ok) {
			ok = true;
			r->admin = i >= srv->cfg.n_keys;
			r->usage = &srv->usage[srv->key_usage[i]];
			snprintf(r->tenant, sizeof(r->tenant), "%s", srv->keys[i].tenant[0] ? srv->keys[i].tenant : "default");
		}
	return ok;
}

/* GET /v1/stats for a tenant key: its own sessions and usage, nothing of the others'. */
static enum MHD_Result handle_tenant_stats(conn_req *r, kvt_sched *sched)
{
	kvt_session_info *si = NULL;
	size_t n = 0;
	int rc = kvt_sched_sessions(sched, r->tenant, &si, &n);
	free(si);
	if (rc != KVT_OK)
		return reply_error(r, 500, NULL, NULL, "listing the sessions failed (%s)", kvt_strerror(rc));
	const tenant_usage *u = r->usage;
	kvt_sched_stats st;
	kvt_sched_get_stats(sched, &st);
	return reply_json(r, 200,
			  json_pack("{s:s, s:I, s:{s:I, s:I, s:I, s:I}, s:s, s:o*}", "tenant", r->tenant, "sessions",
				    (json_int_t)n, "usage", "requests", (json_int_t)atomic_load(&u->requests),
				    "prompt_tokens", (json_int_t)atomic_load(&u->prompt_tokens), "cached_tokens",
				    (json_int_t)atomic_load(&u->cached_tokens), "completion_tokens",
				    (json_int_t)atomic_load(&u->completion_tokens), "model", r->srv->model_id,
				    "retention", kvt_dashboard_retention(sched, &st, r->tenant)),
			  false);
}

/*
 * GET /dashboard: the page, behind an admin key when keys are configured. A
 * browser cannot add a header to a page it navigates to, so the key may also
 * come as ?key= (the page then sends it as a bearer token on every poll).
 */
static enum MHD_Result handle_dashboard(conn_req *r)
{
	kvt_server *srv = r->srv;
	if (auth_on(srv)) {
		const char *q = MHD_lookup_connection_value(r->con, MHD_GET_ARGUMENT_KIND, "key");
		bool ok = authenticate(r);
		if (!ok && q) {
			size_t n_all = srv->cfg.n_keys + srv->cfg.n_admin_keys, nq = strlen(q);
			for (size_t i = 0; i < n_all; i++)
				if (key_equal(q, nq, srv->keys[i].key) && !ok) {
					ok = true;
					r->admin = i >= srv->cfg.n_keys;
				}
		}
		if (!ok)
			return reply_error(r, 401, NULL, "invalid_api_key",
					   "the dashboard needs an admin key (Authorization: Bearer KEY, or /dashboard?key=KEY)");
		if (!r->admin)
			return reply_error(r, 403, NULL, "admin_key_required", "the dashboard needs an admin key (server.admin_keys)");
	}
	size_t n;
	const char *page = kvt_dashboard_html(&n);
	struct MHD_Response *resp = MHD_create_response_from_buffer(n, (void *)page, MHD_RESPMEM_PERSISTENT);
	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	/* Nothing from anywhere else: the page's own script and style, and requests to this daemon only. */
	MHD_add_response_header(resp, "Content-Security-Policy",
				"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
				"connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'");
	MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
	r->status = 200;
	r->answered = true;
	enum MHD_Result ret = MHD_queue_response(r->con, 200, resp);
	MHD_destroy_response(resp);
	return ret;
}

static enum MHD_Result dispatch(conn_req *r)
{
	kvt_server *srv = r->srv;
	char id[sizeof(srv->model_id) + 1]; /* a session id or a model id */
	enum route rt = route_of(r->path, id, sizeof(id));
	if (rt == R_NONE)
		return reply_error(r, 404, NULL, "not_found", "no route %s %s", r->method, r->path);
	const char *want = route_method(rt);
	bool head_ok = !strcmp(want, "GET") && !strcmp(r->method, "HEAD");
	if (strcmp(r->method, want) && !head_ok)
		return reply_error(r, 405, NULL, "method_not_allowed", "%s does not accept %s (use %s)", r->path,
				   r->method, want);
	if (rt == R_HEALTH)
		return handle_health(r);
	if (rt == R_DASHBOARD)
		return handle_dashboard(r);
	bool need_key = auth_on(srv) && (rt != R_METRICS || srv->cfg.metrics_admin);
	if (need_key && !authenticate(r))
		return reply_error(r, 401, NULL, "invalid_api_key", "a valid API key is required (Authorization: Bearer KEY)");
	if (rt == R_METRICS && need_key && !r->admin)
		return reply_error(r, 403, NULL, "admin_key_required",
				   "/metrics needs an admin key (server.metrics = admin)");
	kvt_sched *sched = atomic_load(&srv->sched);
	const kvt_tok *tok = atomic_load(&srv->tok);
	if (!sched)
		return reply_error(r, 503, NULL, "loading", "the model is loading; retry shortly");
	bool new_work = rt == R_COMPLETIONS || rt == R_CHAT || rt == R_SESSION_RESUME;
	if (new_work && atomic_load(&srv->draining))
		return reply_error(r, 503, NULL, "draining", "the server is shutting down");
	if ((rt == R_SESSION || rt == R_SESSION_RESUME) && !kvt_name_valid(id))
		return reply_error(r, 400, "id", NULL,
				   "the session id must be 1-128 characters of [A-Za-z0-9._-], not starting with '.'");
	switch (rt) {
	case R_METRICS:
		return handle_metrics(r, sched);
	case R_MODELS:
		return handle_models(r);
	case R_MODEL:
		return handle_model(r, id);
	case R_COMPLETIONS:
		return handle_generate(r, sched, tok, false);
	case R_CHAT:
		return handle_generate(r, sched, tok, true);
	case R_STATS:
		return auth_on(srv) && !r->admin ? handle_tenant_stats(r, sched) : handle_stats(r, sched);
	case R_SESSIONS:
		return handle_sessions(r, sched);
	case R_SESSION:
		return handle_session_delete(r, sched, id);
	case R_SESSION_RESUME:
		return handle_resume(r, sched, id);
	default:
		return reply_error(r, 404, NULL, "not_found", "no route %s %s", r->method, r->path);
	}
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *con, const char *url, const char *method,
				  const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	kvt_server *srv = cls;
	conn_req *r = *con_cls;
	if (!r) {
		if (!(r = calloc(1, sizeof(*r))))
			return MHD_NO;
		r->srv = srv;
		r->con = con;
		r->t0 = kvt_now_s();
		snprintf(r->method, sizeof(r->method), "%s", method);
		snprintf(r->path, sizeof(r->path), "%s", url);
		snprintf(r->tenant, sizeof(r->tenant), "default");
		*con_cls = r;
		for (char *p = r->path; *p; p++) /* an escaped newline must not forge a log line */
			if ((unsigned char)*p < 0x20 || *p == 0x7f)
				*p = '?';
		for (const unsigned char *p = (const unsigned char *)url; *p && !r->bad_path; p++)
			r->bad_path = *p < 0x20 || *p == 0x7f;
		const char *cl = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (cl) {
			char *end;
			unsigned long long v = strtoull(cl, &end, 10);
			if (end != cl && v > srv->cfg.max_body_bytes) {
				/* answered before the body is read: MHD then skips the body and closes */
				r->too_large = true;
				return reply_error(r, 413, NULL, "request_too_large", "the body (%llu bytes) is over the limit of %zu bytes",
						   v, srv->cfg.max_body_bytes);
			}
		}
		return MHD_YES;
	}
	if (*upload_data_size) {
		size_t n = *upload_data_size;
		*upload_data_size = 0;
		if (r->answered || r->too_large)
			return MHD_YES;
		if (r->n_body + n > srv->cfg.max_body_bytes) {
			r->too_large = true; /* discard the rest, answer 413 at the end */
			free(r->body);
			r->body = NULL;
			r->n_body = r->cap_body = 0;
			return MHD_YES;
		}
		if (r->n_body + n + 1 > r->cap_body) {
			size_t cap = r->cap_body ? r->cap_body : 4096;
			while (cap < r->n_body + n + 1)
				cap *= 2;
			char *p = realloc(r->body, cap);
			if (!p)
				return MHD_NO;
			r->body = p;
			r->cap_body = cap;
		}
		memcpy(r->body + r->n_body, upload_data, n);
		r->n_body += n;
		r->body[r->n_body] = 0;
		return MHD_YES;
	}
	if (r->answered)
		return MHD_YES;
	track_phase(srv, con, false); /* headers and body are in: no read deadline until the next request */
	if (r->job) /* resumed from parking */
		return gen_continue(r);
	if (r->rj)
		return resume_continue(r);
	if (r->too_large)
		return reply_error(r, 413, NULL, "request_too_large", "the body is over the limit of %zu bytes",
				   srv->cfg.max_body_bytes);
	if (r->bad_path)
		return reply_error(r, 400, NULL, "invalid_path",
				   "the request path holds a control character (an escaped byte %%00-%%1F or %%7F)");
	return dispatch(r);
}

/*
 * URL unescaping for libmicrohttpd (the path and each query argument): %XX
 * decoded as usual, except that %00 becomes 0x01. A NUL would cut the C
 * string short ("/v1/models%00x" routed as "/v1/models"); 0x01 is a control
 * byte, which on_request answers with 400 in a path, and which fails the name
 * check in a session id. Returns the new length.
 */
static size_t unescape_url(void *cls, struct MHD_Connection *con, char *s)
{
	char *w = s;
	for (const char *p = s; *p; p++, w++) {
		int hi, lo;
		if (p[0] == '%' && (hi = kvt_hexval(p[1])) >= 0 && (lo = kvt_hexval(p[2])) >= 0) {
			*w = (char)(hi << 4 | lo);
			if (!*w)
				*w = 0x01;
			p += 2;
		} else {
			*w = *p;
		}
	}
	*w = '\0';
	return (size_t)(w - s);
}

/* The client asked to close the connection after this request (Connection: close). */
static bool wants_close(struct MHD_Connection *con)
{
	const char *c = MHD_lookup_connection_value(con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONNECTION);
	return c && strcasestr(c, "close");
}

static void on_completed(void *cls, struct MHD_Connection *con, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	conn_req *r = *con_cls;
	if (!r)
		return;
	*con_cls = NULL;
	unsigned status = r->status ? r->status : 499; /* nothing sent: the client went away */
	KVT_LOGI("http %s %s %u tenant=%s tokens=%u+%u ms=%.1f%s", r->method, r->path, status, r->tenant,
		 atomic_load(&r->n_prompt), atomic_load(&r->n_completion), (kvt_now_s() - r->t0) * 1e3,
		 toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection closed early)");
	track_phase(r->srv, con, true); /* a keep-alive connection now waits for its next request's headers */
	if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && wants_close(con)) {
		/*
		 * NOTE: the whole response is out; shutting the socket down ends it
		 * for the client now, whenever MHD gets to closing the connection.
		 * (It was added for a fuzz finding that turned out to be the
		 * harness's own poll cut short by libFuzzer's SIGALRM, see
		 * tests/fuzz_http.c; it costs one syscall and is kept.)
		 */
		int fd = conn_fd(con);
		if (fd >= 0)
			shutdown(fd, SHUT_RDWR);
	}
	job_free(r->job);               /* set only if the connection ended while a generation was parked */
	if (r->rj)
		resume_unref(r->rj);
	free(r->body);
	free(r);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char line[512];
	vsnprintf(line, sizeof(line), fmt, ap);
	size_t n = strlen(line);
	while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
		line[--n] = 0;
	KVT_LOGW("http: %s", line);
}

/* ------------------------------------------------------------------------ */
/* lifecycle                                                                  */

/* Copy the keys (API keys, then admin keys) and make one usage record per tenant they name. */
static int server_keys(kvt_server *srv, const kvt_server_config *cfg)
{
	size_t n_all = cfg->n_keys + cfg->n_admin_keys;
	srv->cfg.keys = srv->cfg.admin_keys = NULL;
	if (!n_all)
		return KVT_OK;
	srv->keys = calloc(n_all, sizeof(*srv->keys));
	srv->key_usage = calloc(n_all, sizeof(*srv->key_usage));
	srv->usage = calloc(n_all, sizeof(*srv->usage));
	if (!srv->keys || !srv->key_usage || !srv->usage)
		return KVT_ENOMEM;
	if (cfg->n_keys) /* either list may be empty (and NULL: memcpy must not see it) */
		memcpy(srv->keys, cfg->keys, cfg->n_keys * sizeof(*srv->keys));
	if (cfg->n_admin_keys)
		memcpy(srv->keys + cfg->n_keys, cfg->admin_keys, cfg->n_admin_keys * sizeof(*srv->keys));
	for (size_t i = 0; i < n_all; i++) {
		const char *t = srv->keys[i].tenant[0] ? srv->keys[i].tenant : "default";
		size_t u = 0;
		while (u < srv->n_usage && strcmp(srv->usage[u].tenant, t))
			u++;
		if (u == srv->n_usage)
			snprintf(srv->usage[srv->n_usage++].tenant, sizeof(srv->usage[0].tenant), "%s", t);
		srv->key_usage[i] = (uint32_t)u;
	}
	srv->cfg.keys = srv->keys;
	srv->cfg.admin_keys = srv->keys + cfg->n_keys;
	return KVT_OK;
}

static void server_free_keys(kvt_server *srv)
{
	if (srv->keys)
		memset(srv->keys, 0, (srv->cfg.n_keys + srv->cfg.n_admin_keys) * sizeof(*srv->keys)); /* secrets */
	free(srv->keys);
	free(srv->key_usage);
	free(srv->usage);
}

int kvt_server_start(const kvt_server_config *cfg, kvt_server **out)
{
	if (!cfg || !out || !cfg->host) {
		KVT_LOGE("http: no configuration or no host");
		return KVT_EINVAL;
	}
	if ((cfg->n_keys && !cfg->keys) || (cfg->n_admin_keys && !cfg->admin_keys)) {
		KVT_LOGE("http: n_keys = %zu, n_admin_keys = %zu but no keys", cfg->n_keys, cfg->n_admin_keys);
		return KVT_EINVAL;
	}
	if (cfg->metrics_admin && !cfg->n_admin_keys) {
		KVT_LOGE("http: /metrics for admins only, but no admin key is configured");
		return KVT_EINVAL;
	}
	if (!cfg->max_connections || !cfg->max_concurrent || !cfg->max_header_bytes || !cfg->max_tokens_limit ||
	    !cfg->max_n || !cfg->default_max_tokens || cfg->default_max_tokens > cfg->max_tokens_limit) {
		KVT_LOGE("http: max_connections, max_concurrent, max_header_bytes, max_tokens_limit, max_n and "
			 "default_max_tokens must be > 0, default_max_tokens <= max_tokens_limit");
		return KVT_EINVAL;
	}
	for (size_t i = 0; i < cfg->n_keys + cfg->n_admin_keys; i++) {
		const kvt_api_key *k = i < cfg->n_keys ? &cfg->keys[i] : &cfg->admin_keys[i - cfg->n_keys];
		if (!k->key[0] || (k->tenant[0] && !kvt_name_valid(k->tenant))) {
			KVT_LOGE("http: %s key %zu: empty key or bad tenant name '%s'", i < cfg->n_keys ? "API" : "admin",
				 i < cfg->n_keys ? i : i - cfg->n_keys, k->tenant);
			return KVT_EINVAL;
		}
	}
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	bool v6 = false;
	struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
	if (inet_pton(AF_INET, cfg->host, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons(cfg->port);
	} else if (inet_pton(AF_INET6, cfg->host, &a6->sin6_addr) == 1) {
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons(cfg->port);
		v6 = true;
	} else {
		KVT_LOGE("http: listen host '%s' is not a numeric IPv4 or IPv6 address", cfg->host);
		return KVT_EINVAL;
	}

	kvt_server *srv = calloc(1, sizeof(*srv));
	if (!srv)
		return KVT_ENOMEM;
	srv->cfg = *cfg;
	snprintf(srv->model_id, sizeof(srv->model_id), "%s", cfg->model_id && *cfg->model_id ? cfg->model_id : "kvtier");
	srv->cfg.model_id = srv->model_id;
	snprintf(srv->kv_dtype, sizeof(srv->kv_dtype), "%s", cfg->kv_dtype && *cfg->kv_dtype ? cfg->kv_dtype : "f16");
	srv->cfg.kv_dtype = srv->kv_dtype;
	srv->cfg.host = NULL; /* not kept */
	if (server_keys(srv, cfg) != KVT_OK) {
		server_free_keys(srv);
		free(srv);
		return KVT_ENOMEM;
	}
	srv->created = (int64_t)time(NULL);
	srv->t_start = kvt_now_s();
	/*
	 * MHD keeps the request line, the headers and its read/write buffers in
	 * one per-connection pool: headers that do not fit are answered 431. The
	 * pool is the header limit plus room for the buffers.
	 */
	size_t pool = cfg->max_header_bytes + (32 << 10);
	unsigned timeout = cfg->request_timeout_s > 0 ? (unsigned)cfg->request_timeout_s : 0;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
			 (v6 ? MHD_USE_DUAL_STACK : 0);
	pthread_mutex_init(&srv->mu, NULL);
	srv->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (srv->wake_fd < 0 || pthread_create(&srv->pump, NULL, pump_main, srv) != 0) {
		KVT_LOGE("http: cannot start the pump (eventfd or thread): %s", strerror(errno));
		if (srv->wake_fd >= 0)
			close(srv->wake_fd);
		pthread_mutex_destroy(&srv->mu);
		server_free_keys(srv);
		free(srv);
		return KVT_EIO;
	}
	srv->pump_started = true;
	srv->mhd = MHD_start_daemon(flags, cfg->port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log,
				    srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE,
				    (unsigned)cfg->threads, MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
				    MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_ip,
				    MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool, MHD_OPTION_CONNECTION_TIMEOUT, timeout,
				    MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION,
				    on_connection, srv, MHD_OPTION_UNESCAPE_CALLBACK, unescape_url, NULL, MHD_OPTION_END);
	if (!srv->mhd) {
		KVT_LOGE("http: cannot listen on %s port %u (address in use, or not permitted?)", cfg->host,
			 (unsigned)cfg->port);
		atomic_store(&srv->pump_stop, true);
		pthread_join(srv->pump, NULL);
		close(srv->wake_fd);
		pthread_mutex_destroy(&srv->mu);
		server_free_keys(srv);
		free(srv);
		return KVT_EIO;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->mhd, MHD_DAEMON_INFO_BIND_PORT);
	srv->port = di ? di->port : cfg->port;
	KVT_LOGI("http: listening on %s%s%s:%u (%u worker threads, %u connections, %u per address, header deadline %.0f s)",
		 v6 ? "[" : "", cfg->host, v6 ? "]" : "", (unsigned)srv->port, cfg->threads, cfg->max_connections,
		 cfg->max_connections_per_ip, cfg->header_timeout_s);
	*out = srv;
	return KVT_OK;
}

uint16_t kvt_server_port(const kvt_server *srv)
{
	return srv ? srv->port : 0;
}

void kvt_server_set_engine(kvt_server *srv, kvt_sched *sched, const struct kvt_tok *tok)
{
	kvt_sched_set_progress(sched, srv_wake, srv); /* parked generations wake on the scheduler's news */
	atomic_store(&srv->tok, tok);
	atomic_store(&srv->sched, sched); /* last: a request that sees sched sees tok */
}

void kvt_server_drain(kvt_server *srv)
{
	if (srv)
		atomic_store(&srv->draining, true);
}

uint32_t kvt_server_in_flight(kvt_server *srv)
{
	return srv ? atomic_load(&srv->in_flight) : 0;
}

void kvt_server_stop(kvt_server *srv)
{
	if (!srv)
		return;
	atomic_store(&srv->stopping, true); /* handlers and readers end their requests */
	kvt_sched *sched = atomic_load(&srv->sched);
	if (sched)
		kvt_sched_set_progress(sched, NULL, NULL);
	pthread_mutex_lock(&srv->mu); /* MHD must not be stopped with a connection suspended */
	srv->parks_closed = true;
	while (srv->parked)
		unpark_locked(srv, srv->parked);
	pthread_mutex_unlock(&srv->mu);
	MHD_stop_daemon(srv->mhd); /* closes the sockets, joins the workers */
	while (atomic_load(&srv->n_resume_threads)) /* they end on their own (a resume is bounded) */
		usleep(10000);
	atomic_store(&srv->pump_stop, true);
	pthread_join(srv->pump, NULL);
	close(srv->wake_fd);
	pthread_mutex_destroy(&srv->mu);
	server_free_keys(srv);
	free(srv);
}
