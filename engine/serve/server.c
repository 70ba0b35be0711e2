/*
 * engine/serve/server.c — kvtierd's HTTP transport (server.h): the
 * libmicrohttpd daemon, routing, API keys, parking, connection limits and
 * the header deadline; generation's parse -> submit -> reply. The wire
 * format is docs/http-api.md; the other endpoints are admin.c's, a
 * generation's reply is reply.c's, request parsing is request.c's.
 *
 * Design. MHD runs an internal epoll listener with a fixed pool of worker
 * threads (MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL,
 * MHD_OPTION_THREAD_POOL_SIZE = server.threads) and suspend/resume
 * (MHD_ALLOW_SUSPEND_RESUME). No handler blocks a worker: a request that
 * waits — a generation for its tokens, a session resume for its thread —
 * parks its connection (kvt_srv_park: MHD_suspend_connection, the waiter
 * on srv->parked) and returns. The pump thread (pump_main) sleeps on an
 * eventfd that the scheduler's progress hook and the resume threads write
 * (kvt_srv_wake); on news it resumes every parked connection, each of which
 * looks and parks again if the news was not its own. Every SRV_WAIT_S it
 * also resumes the parked connections whose client hung up (they cancel)
 * and shuts down the sockets of connections that sent no complete request
 * within server.header_timeout. Slow clients are further bounded by a global
 * connection limit and the idle timeout (MHD options), and by a per-address
 * limit kept here (addr_make_room): at it, the address's connection that has
 * waited longest for a request makes room for the new one.
 *
 * Request life: MHD calls on_request once with no body (a conn_req is made;
 * a Content-Length over max_body_bytes is answered 413 at once), then with
 * each body piece (accumulated up to max_body_bytes, the rest discarded and
 * answered 413), then once more to answer — and again each time a parked
 * connection is resumed (r->job, r->rj). on_completed logs one INFO line
 * (method, path, status, tenant, tokens, ms, request id) and frees the
 * conn_req. Checks run in this order: body size (413), route (404), CORS
 * preflight from an allowed origin (204), method (405), API key (401), engine
 * loaded / draining (503), JSON and fields (400), capacity (503 +
 * Retry-After).
 *
 * Invariants:
 *  - a connection is suspended only under srv->mu and only while it is on
 *    srv->parked; a parker that missed news since it last looked (wake_seq)
 *    does not park; kvt_server_stop resumes every parked connection and lets
 *    nothing park again before it stops MHD;
 *  - every handle submitted is released exactly once (reply.c); the
 *    in-flight count is taken before submit and given back after release;
 *  - every response goes out through kvt_srv_queue, so it carries the
 *    request's X-Request-Id (and, for an allowed Origin, the CORS headers);
 *    every one but the 204 preflight carries a Content-Type; every error is
 *    the JSON error object, with request_id, and the status of the table in
 *    docs/http-api.md.
 */
#define _GNU_SOURCE /* POLLRDHUP, strcasestr */
#include "server_int.h"

#include "index.h"
#include "structured.h"
#include "tokenizer.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

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
	c->chunk_reuse = KVT_CHUNK_REUSE_MARKED;
	c->chunk_min_tokens = 64;
	c->request_timeout_s = 600;
	c->model_id = "kvtier";
	c->n_slots = 1;
}

/* Requests need a key (any API key or admin key is configured). */
bool kvt_srv_auth_on(const kvt_server *srv)
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

/*
 * Did the peer hang up? Called for a connection whose request is in and
 * whose answer is not (parked, or a content reader between chunks): MHD
 * reads nothing from its socket then, so a readable hang-up is the client's.
 */
bool kvt_srv_peer_gone(int fd)
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

/*
 * The request's id (X-Request-Id) into out: the client's when it is sane —
 * 1..SRV_RID_MAX bytes of printable ASCII with no space, '"' or '\\', so it
 * goes into a header, a log line and a JSON string as it is — else 32 random
 * hex digits.
 */
static void request_id_of(struct MHD_Connection *con, char out[SRV_RID_MAX + 1])
{
	const char *v = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "X-Request-Id");
	size_t n = 0;
	for (; v && v[n] && n <= SRV_RID_MAX; n++)
		if ((unsigned char)v[n] <= ' ' || (unsigned char)v[n] >= 0x7f || v[n] == '"' || v[n] == '\\')
			break;
	if (v && n > 0 && n <= SRV_RID_MAX && !v[n]) {
		memcpy(out, v, n + 1);
		return;
	}
	random_hex(out, 16);
}

/* ------------------------------------------------------------------------ */
/* parking: waiting without a thread                                          */

/* News for parked connections (the scheduler's progress hook, resume threads). Any thread; never blocks. */
void kvt_srv_wake(void *user)
{
	kvt_server *srv = user;
	atomic_fetch_add(&srv->wake_seq, 1);
	uint64_t one = 1;
	if (write(srv->wake_fd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is saturated, the pump wakes anyway */
	}
}

void kvt_srv_waiter_init(waiter *w, struct MHD_Connection *con)
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
bool kvt_srv_park(kvt_server *srv, waiter *w, uint64_t seen)
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
			if (news || kvt_srv_peer_gone(w->fd))
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

/* The client's address into t (IPv4-mapped IPv6 as IPv4, so a dual-stack listener counts one client once). */
static void track_addr(struct MHD_Connection *con, conn_track *t)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(con, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	const struct sockaddr *sa = ci ? ci->client_addr : NULL;
	if (sa && sa->sa_family == AF_INET) {
		memcpy(t->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
		if (IN6_IS_ADDR_V4MAPPED(a)) {
			memcpy(t->addr, a->s6_addr + 12, 4);
		} else {
			memcpy(t->addr, a->s6_addr, 16);
			t->v6 = true;
		}
	}
}

/*
 * Under srv->mu, for a new connection t (not listed yet): when its address
 * holds server.max_connections_per_ip connections already, shut down the one
 * of them that has waited longest for a request (in_headers: idle, or still
 * sending one) — never one with a request in flight — or, when every one has
 * a request in flight, t itself. An address cannot lock itself out (every
 * local client is 127.0.0.1, every proxied one the proxy): idle connections
 * make room for new ones instead of refusing them. Returns 1 when one was
 * closed to make room, -1 when t was refused, 0 when there was room.
 */
static int addr_make_room(kvt_server *srv, conn_track *t)
{
	uint32_t n = 0;
	conn_track *oldest = NULL;
	for (conn_track *o = srv->tracks; o; o = o->next) {
		if (o->cut || o->v6 != t->v6 || memcmp(o->addr, t->addr, sizeof(t->addr)))
			continue;
		n++;
		if (o->in_headers && (!oldest || o->t_phase < oldest->t_phase))
			oldest = o;
	}
	if (n < srv->cfg.max_connections_per_ip)
		return 0;
	conn_track *c = oldest ? oldest : t;
	shutdown(c->fd, SHUT_RDWR); /* MHD sees the end and closes the connection */
	c->cut = true;
	atomic_fetch_add(oldest ? &srv->n_addr_evictions : &srv->n_addr_refusals, 1);
	return oldest ? 1 : -1;
}

/* MHD_OPTION_NOTIFY_CONNECTION: every connection is tracked from accept to close. */
static void on_connection(void *cls, struct MHD_Connection *con, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	kvt_server *srv = cls;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		conn_track *t = calloc(1, sizeof(*t));
		if (!t)
			return; /* untracked: no header deadline and no address count for this one */
		t->fd = conn_fd(con);
		track_addr(con, t);
		t->in_headers = true;
		t->t_phase = kvt_now_s();
		int room = 0;
		bool log = false;
		pthread_mutex_lock(&srv->mu);
		if (srv->cfg.max_connections_per_ip && (room = addr_make_room(srv, t)) != 0 &&
		    t->t_phase - srv->t_addr_log >= 1.0) {
			srv->t_addr_log = t->t_phase; /* at most one line a second: an attacker reconnects in a loop */
			log = true;
		}
		t->next = srv->tracks;
		if (srv->tracks)
			srv->tracks->prev = t;
		srv->tracks = t;
		pthread_mutex_unlock(&srv->mu);
		*socket_context = t;
		if (log) {
			char a[INET6_ADDRSTRLEN];
			if (!inet_ntop(t->v6 ? AF_INET6 : AF_INET, t->addr, a, sizeof(a)))
				snprintf(a, sizeof(a), "?");
			KVT_LOGI("http: %s is at server.max_connections_per_ip (%u): %s (%llu closed to make room, %llu refused "
				 "so far)",
				 a, srv->cfg.max_connections_per_ip,
				 room > 0 ? "closed its connection that waited longest for a request" :
					    "every one has a request in flight: the new one is closed",
				 (unsigned long long)atomic_load(&srv->n_addr_evictions),
				 (unsigned long long)atomic_load(&srv->n_addr_refusals));
		}
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

/* The request's Origin when server.cors_origins allows it, else NULL. */
static const char *cors_origin(const conn_req *r)
{
	const kvt_cors_origins *c = &r->srv->cors;
	if (!c->n)
		return NULL;
	const char *o = MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, "Origin");
	for (uint32_t i = 0; o && i < c->n; i++)
		if (!strcasecmp(o, c->origin[i]))
			return o;
	return NULL;
}

enum MHD_Result kvt_srv_queue(conn_req *r, unsigned status, struct MHD_Response *resp)
{
	MHD_add_response_header(resp, "X-Request-Id", r->rid);
	if (kvt_srv_anth_route(r)) /* Anthropic's clients read the id from request-id */
		MHD_add_response_header(resp, "request-id", r->rid);
	if (r->srv->cors.n) {
		/* the answer depends on the Origin: a cache must not hand one origin's to another */
		MHD_add_response_header(resp, "Vary", "Origin");
		const char *o = cors_origin(r);
		if (o) {
			MHD_add_response_header(resp, "Access-Control-Allow-Origin", o);
			MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
		}
	}
	r->status = status;
	r->answered = true;
	enum MHD_Result ret = MHD_queue_response(r->con, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

enum MHD_Result kvt_srv_reply_buf(conn_req *r, unsigned status, const char *ctype, char *body, size_t n, bool retry)
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
					    strstr(r->path, "/resume") || kvt_srv_anth_route(r) ?
				    "POST" :
			    !strncmp(r->path, "/v1/sessions/", 13) ? "DELETE" :
								     "GET, HEAD";
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
	}
	return kvt_srv_queue(r, status, resp);
}

/* Send a JSON value (stolen). */
enum MHD_Result kvt_srv_reply_json(conn_req *r, unsigned status, json_t *v, bool retry)
{
	if (status >= 400 && v && kvt_srv_anth_route(r)) /* Anthropic's routes answer in Anthropic's error shape */
		v = kvt_srv_anth_error(r, v, &status);
	char *s = v ? json_dumps(v, SRV_JSON_FLAGS) : NULL;
	json_decref(v);
	if (!s) {
		size_t cap = 128 + sizeof(r->rid);
		char *c = malloc(cap);
		if (!c)
			return MHD_NO;
		/* the id needs no escaping: request_id_of keeps no '"', '\\' or control byte */
		int n = snprintf(c, cap,
				 "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
				 "\"code\":null,\"request_id\":\"%s\"}}",
				 r->rid);
		return kvt_srv_reply_buf(r, 500, "application/json", c, (size_t)n, false);
	}
	return kvt_srv_reply_buf(r, status, "application/json", s, strlen(s), retry);
}

json_t *kvt_srv_error_object(const char *rid, const char *type, const char *param, const char *code, const char *msg)
{
	json_t *v = json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", msg, "type", type, "param", param,
			      "code", code);
	if (v && rid)
		json_object_set_new(json_object_get(v, "error"), "request_id", json_string(rid));
	return v;
}

enum MHD_Result kvt_srv_reply_error(conn_req *r, unsigned status, const char *param, const char *code,
				   const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	kvt_utf8_scrub(msg); /* messages quote the client's bytes (a path, an id): JSON strings must be UTF-8 */
	const char *type = status == 401 ? "authentication_error" : status == 403 ? "permission_error" :
			   status >= 500 ? "server_error" : "invalid_request_error";
	return kvt_srv_reply_json(r, status, kvt_srv_error_object(r->rid, type, param, code, msg), status == 503);
}

enum MHD_Result kvt_srv_reply_req_error(conn_req *r, unsigned status, const kvt_req_err *e)
{
	return kvt_srv_reply_error(r, status, e->param[0] ? e->param : NULL, e->code[0] ? e->code : NULL, "%s",
				   e->message);
}

bool kvt_srv_in_flight_take(kvt_server *srv)
{
	unsigned cur = atomic_load(&srv->in_flight);
	do {
		if (cur >= srv->cfg.max_concurrent)
			return false;
	} while (!atomic_compare_exchange_weak(&srv->in_flight, &cur, cur + 1));
	return true;
}

/*
 * The answer to kvt_sched_submit's failure: KVT_ESTOPPED when it is draining
 * (kvt_sched_drain ran: it admits nothing new), a 503 "draining" as a drain
 * noticed by dispatch is; KVT_EFULL its queue limit (503 "overloaded");
 * KVT_EINVAL a request it refused (logged there).
 */
static enum MHD_Result submit_error(conn_req *r, int rc)
{
	switch (rc) {
	case KVT_EFULL:
		return kvt_srv_reply_error(r, 503, NULL, "overloaded", "the request queue is full; retry shortly");
	case KVT_ESTOPPED: /* draining */
		return kvt_srv_reply_error(r, 503, NULL, "draining", "the server is shutting down");
	case KVT_EINVAL:
		return kvt_srv_reply_error(r, 400, NULL, NULL, "the engine refused the request (see the server log)");
	default:
		return kvt_srv_reply_error(r, 500, NULL, NULL, "the engine could not take the request (%s)",
					   kvt_strerror(rc));
	}
}

/* A parse step's failure: the refusal (400) or out of memory (500). */
static enum MHD_Result parse_error(conn_req *r, int rc, const kvt_req_err *e)
{
	if (kvt_req_http_status(rc) == 400)
		return kvt_srv_reply_req_error(r, 400, e);
	return kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
}

/* The job's choices: each one's text decoder and (logprobs asked) its entries. KVT_OK or KVT_ENOMEM. */
static int job_choices(gen_job *j)
{
	if (!(j->ch = calloc(j->q.n, sizeof(*j->ch))))
		return KVT_ENOMEM;
	for (uint32_t i = 0; i < j->q.n; i++) {
		kvt_tok_stream_init(&j->ch[i].ds);
		if (j->q.sched.logprobs && !(j->ch[i].lp = j->q.chat ? json_array() : kvt_oai_lp_completion_new()))
			return KVT_ENOMEM;
	}
	return KVT_OK;
}

/*
 * One scheduler request per choice: choice i samples with seed + i; the
 * session's history is choice 0's turn, and the choices share the prompt, so
 * choice 0 alone retains it. KVT_OK, or kvt_sched_submit's error with j->n
 * the choices submitted before it (released with the job).
 */
static int job_submit(gen_job *j, kvt_sched *sched)
{
	for (uint32_t i = 0; i < j->q.n; i++) {
		kvt_sched_req q = j->q.sched;
		q.sample.seed = j->q.sched.sample.seed + i;
		if (i > 0) {
			q.session_id[0] = 0;
			q.n_retain = 0;
			memset(q.retain, 0, sizeof(q.retain));
		}
		int rc = kvt_sched_submit(sched, &q, &j->ch[i].h);
		if (rc != KVT_OK) {
			j->ch[i].h = NULL;
			return rc;
		}
		j->n = i + 1;
	}
	return KVT_OK;
}

/*
 * POST /v1/completions and /v1/chat/completions: parse the body (pure,
 * request.h), then run it (kvt_srv_gen_start). The job owns the parsed
 * request from here on.
 */
enum MHD_Result kvt_srv_generate(conn_req *r, kvt_sched *sched, const kvt_tok *tok, bool chat, int llama_slot)
{
	const kvt_req_limits lim = kvt_srv_req_limits(r->srv, sched);
	kvt_req_err e = { { 0 }, { 0 }, { 0 } };
	gen_job *j = calloc(1, sizeof(*j));
	if (!j)
		return kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
	j->srv = r->srv;
	j->llama = llama_slot != KVT_SRV_NOT_LLAMA;
	j->slot = llama_slot >= 0 ? llama_slot : -1;
	if (j->slot >= 0) /* given back by kvt_srv_job_release */
		atomic_fetch_add(&r->srv->slot_busy[j->slot], 1);
	json_t *body = NULL;
	int rc = kvt_req_body_load(r->body.p, r->body.n, &body, &e);
	if (rc == KVT_OK) {
		rc = kvt_gen_request_parse(&lim, chat, body, &j->q, &e);
		if (j->q.sched.tenant[0]) /* `user` named it (no API keys): the log names it too */
			snprintf(r->tenant, sizeof(r->tenant), "%s", j->q.sched.tenant);
	}
	if (rc == KVT_OK)
		rc = kvt_gen_request_prompt(&lim, tok, body, &j->q, &e);
	json_decref(body);
	if (rc != KVT_OK) {
		kvt_srv_job_free(j);
		return parse_error(r, rc, &e);
	}
	kvt_srv_job_init(r, tok, chat ? "chatcmpl-" : "cmpl-", KVT_SRV_API_OPENAI, j);
	return kvt_srv_gen_start(r, sched, j);
}

/* The limits a generation request is checked against: the model's and the configuration's. */
kvt_req_limits kvt_srv_req_limits(const kvt_server *srv, kvt_sched *sched)
{
	const kvt_server_config *cfg = &srv->cfg;
	return (kvt_req_limits){ .n_vocab = kvt_sched_n_vocab(sched),
				 .max_ctx = kvt_sched_max_ctx(sched),
				 .max_tokens_limit = cfg->max_tokens_limit,
				 .max_n = cfg->max_n,
				 .default_max_tokens = cfg->default_max_tokens,
				 .chunk_reuse = cfg->chunk_reuse,
				 .chunk_min_tokens = cfg->chunk_min_tokens,
				 .tenant_from_user = !kvt_srv_auth_on(srv) };
}

/* A job whose request j->q is parsed: its owner, connection, reply shape (api) and id (id_prefix + random hex). */
void kvt_srv_job_init(conn_req *r, const kvt_tok *tok, const char *id_prefix, int api, gen_job *j)
{
	j->srv = r->srv;
	j->tok = tok;
	j->req = r;
	j->usage = r->usage;
	j->api = api;
	j->created = (int64_t)time(NULL);
	memcpy(j->rid, r->rid, sizeof(j->rid));
	kvt_srv_waiter_init(&j->w, r->con);
	char hex[25];
	random_hex(hex, 12);
	snprintf(j->id, sizeof(j->id), "%s%s", id_prefix, hex);
	atomic_store(&r->n_prompt, j->q.n_ids);
}

/*
 * Run a job (taken; kvt_srv_job_init'ed): take an in-flight slot, submit one
 * scheduler request per choice, then reply (reply.c): an SSE stream, or the
 * connection parks until every choice ended.
 */
enum MHD_Result kvt_srv_gen_start(conn_req *r, kvt_sched *sched, gen_job *j)
{
	kvt_server *srv = r->srv;
	enum MHD_Result ret;
	int rc;
	if (atomic_load(&srv->draining)) {
		ret = kvt_srv_reply_error(r, 503, NULL, "draining", "the server is shutting down");
		goto out;
	}
	if (!kvt_srv_in_flight_take(srv)) {
		ret = kvt_srv_reply_error(r, 503, NULL, "overloaded", "too many requests in flight (%u); retry shortly",
					  srv->cfg.max_concurrent);
		goto out;
	}
	j->counted = true;
	if (job_choices(j) != KVT_OK) {
		ret = kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
		goto out;
	}
	if (!j->q.have_seed)
		j->q.sched.sample.seed = random_u64() >> 1;
	snprintf(j->q.sched.tenant, sizeof(j->q.sched.tenant), "%s", r->tenant);
	if ((rc = job_submit(j, sched)) != KVT_OK) {
		ret = submit_error(r, rc); /* kvt_srv_job_free releases the ones submitted */
		goto out;
	}
	if (j->q.stream)
		return kvt_srv_gen_stream(r, j); /* the response owns the job now */
	r->job = j; /* non-streaming: park the connection until the choices end */
	return kvt_srv_gen_continue(r);
out:
	kvt_srv_job_free(j);
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
	R_LLAMA_GET,      /* llama-server's GET /props, /slots (llama_api.c) */
	R_LLAMA_POST,     /* llama-server's POST /completion, /tokenize, /detokenize, /apply-template, /slots/{id} */
	R_MESSAGES,       /* /v1/messages: Anthropic's Messages API (anthropic.c) */
	R_COUNT_TOKENS,   /* /v1/messages/count_tokens (anthropic.c) */
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
		{ "/v1/messages", R_MESSAGES },
		{ "/v1/messages/count_tokens", R_COUNT_TOKENS },
	};
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		if (!strcmp(path, fixed[i].path))
			return fixed[i].r;
	switch (kvt_llama_route(path)) {
	case 1:
		return R_LLAMA_GET;
	case 2:
		return R_LLAMA_POST;
	}
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
	case R_LLAMA_POST:
	case R_MESSAGES:
	case R_COUNT_TOKENS:
		return "POST";
	case R_SESSION:
		return "DELETE";
	default:
		return "GET";
	}
}

/* The methods a route answers (Allow, Access-Control-Allow-Methods). */
static const char *route_allow(enum route rt)
{
	const char *m = route_method(rt);
	return strcmp(m, "GET") ? m : "GET, HEAD";
}

/* A header list a preflight asks for (Access-Control-Request-Headers) is echoed when it holds only tokens. */
static bool header_list_sane(const char *h)
{
	size_t n = 0;
	for (; h[n]; n++)
		if (!isalnum((unsigned char)h[n]) && !strchr("-_., ", h[n]))
			return false;
	return n > 0 && n <= 1024;
}

/*
 * OPTIONS from an allowed origin (server.cors_origins): the CORS preflight,
 * 204 with the route's methods and the headers asked for (a browser sends no
 * key on a preflight, so none is checked; the request that follows is).
 */
static enum MHD_Result reply_preflight(conn_req *r, enum route rt)
{
	struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
	if (!resp)
		return MHD_NO;
	const char *h = MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, "Access-Control-Request-Headers");
	MHD_add_response_header(resp, "Access-Control-Allow-Methods", route_allow(rt));
	MHD_add_response_header(resp, "Access-Control-Allow-Headers",
				h && header_list_sane(h) ? h : "Authorization, Content-Type, X-Request-Id");
	MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
	MHD_add_response_header(resp, "Vary", "Access-Control-Request-Method, Access-Control-Request-Headers");
	return kvt_srv_queue(r, MHD_HTTP_NO_CONTENT, resp); /* adds Access-Control-Allow-Origin */
}

/* Constant-time compare of a presented key with a configured one. */
bool kvt_srv_key_equal(const char *a, size_t na, const char *b)
{
	size_t nb = strlen(b);
	unsigned diff = (unsigned)(na ^ nb);
	for (size_t i = 0; i < na; i++)
		diff |= (unsigned char)a[i] ^ (unsigned char)b[i % (nb ? nb : 1)];
	return diff == 0 && nb > 0;
}

/*
 * The presented key (Authorization: Bearer KEY, else Anthropic's x-api-key:
 * KEY): an API key (its tenant) or an admin key (r->admin). False: none, or unknown.
 */
bool kvt_srv_authenticate(conn_req *r)
{
	kvt_server *srv = r->srv;
	const char *h = MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	const char *x = MHD_lookup_connection_value(r->con, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's header */
	if ((!h || strncasecmp(h, "Bearer ", 7) != 0) && !x)
		return false;
	const char *k = h && !strncasecmp(h, "Bearer ", 7) ? h + 7 : x;
	while (*k == ' ')
		k++;
	size_t nk = strlen(k);
	while (nk && k[nk - 1] == ' ')
		nk--;
	bool ok = false;
	size_t n_all = srv->cfg.n_keys + srv->cfg.n_admin_keys;
	for (size_t i = 0; i < n_all; i++) /* every key compared: the time does not say which matched */
		if (kvt_srv_key_equal(k, nk, srv->keys[i].key) && !ok) {
			ok = true;
			r->admin = i >= srv->cfg.n_keys;
			r->usage = &srv->usage[srv->key_usage[i]];
			snprintf(r->tenant, sizeof(r->tenant), "%s", srv->keys[i].tenant[0] ? srv->keys[i].tenant : "default");
		}
	return ok;
}

static enum MHD_Result dispatch(conn_req *r)
{
	kvt_server *srv = r->srv;
	char id[sizeof(srv->model_id) + 1]; /* a session id or a model id */
	enum route rt = route_of(r->path, id, sizeof(id));
	if (rt == R_NONE)
		return kvt_srv_reply_error(r, 404, NULL, "not_found", "no route %s %s", r->method, r->path);
	if (!strcmp(r->method, MHD_HTTP_METHOD_OPTIONS) && cors_origin(r))
		return reply_preflight(r, rt);
	const char *want = route_method(rt);
	bool head_ok = !strcmp(want, "GET") && !strcmp(r->method, "HEAD");
	if (strcmp(r->method, want) && !head_ok)
		return kvt_srv_reply_error(r, 405, NULL, "method_not_allowed", "%s does not accept %s (use %s)", r->path,
				   r->method, want);
	if (rt == R_HEALTH)
		return kvt_srv_handle_health(r);
	if (rt == R_DASHBOARD)
		return kvt_srv_handle_dashboard(r);
	bool need_key = kvt_srv_auth_on(srv) && (rt != R_METRICS || srv->cfg.metrics_admin);
	if (need_key && !kvt_srv_authenticate(r))
		return kvt_srv_reply_error(r, 401, NULL, "invalid_api_key",
					   "a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)");
	if (rt == R_METRICS && need_key && !r->admin)
		return kvt_srv_reply_error(r, 403, NULL, "admin_key_required",
				   "/metrics needs an admin key (server.metrics = admin)");
	kvt_sched *sched = atomic_load(&srv->sched);
	const kvt_tok *tok = atomic_load(&srv->tok);
	if (!sched)
		return kvt_srv_reply_error(r, 503, NULL, "loading", "the model is loading; retry shortly");
	bool new_work = rt == R_COMPLETIONS || rt == R_CHAT || rt == R_SESSION_RESUME || rt == R_MESSAGES;
	if (new_work && atomic_load(&srv->draining))
		return kvt_srv_reply_error(r, 503, NULL, "draining", "the server is shutting down");
	if ((rt == R_SESSION || rt == R_SESSION_RESUME) && !kvt_name_valid(id))
		return kvt_srv_reply_error(r, 400, "id", NULL,
				   "the session id must be 1-128 characters of [A-Za-z0-9._-], not starting with '.'");
	switch (rt) {
	case R_METRICS:
		return kvt_srv_handle_metrics(r, sched);
	case R_MODELS:
		return kvt_srv_handle_models(r);
	case R_MODEL:
		return kvt_srv_handle_model(r, id);
	case R_COMPLETIONS:
		return kvt_srv_generate(r, sched, tok, false, KVT_SRV_NOT_LLAMA);
	case R_CHAT:
		return kvt_srv_generate(r, sched, tok, true, KVT_SRV_NOT_LLAMA);
	case R_STATS:
		return kvt_srv_auth_on(srv) && !r->admin ? kvt_srv_handle_tenant_stats(r, sched) : kvt_srv_handle_stats(r, sched);
	case R_SESSIONS:
		return kvt_srv_handle_sessions(r, sched);
	case R_SESSION:
		return kvt_srv_handle_session_delete(r, sched, id);
	case R_SESSION_RESUME:
		return kvt_srv_handle_resume(r, sched, id);
	case R_LLAMA_GET:
	case R_LLAMA_POST:
		return kvt_llama_handle(r, sched, tok);
	case R_MESSAGES:
		return kvt_srv_handle_messages(r, sched, tok);
	case R_COUNT_TOKENS:
		return kvt_srv_handle_count_tokens(r, sched, tok);
	default:
		return kvt_srv_reply_error(r, 404, NULL, "not_found", "no route %s %s", r->method, r->path);
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
		request_id_of(con, r->rid);
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
				return kvt_srv_reply_error(r, 413, NULL, "request_too_large", "the body (%llu bytes) is over the limit of %zu bytes",
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
		if (r->body.n + n > srv->cfg.max_body_bytes) {
			r->too_large = true; /* discard the rest, answer 413 at the end */
			free(r->body.p);
			r->body = (kvt_sbuf){ 0 };
			return MHD_YES;
		}
		kvt_sbuf_add(&r->body, upload_data, n);
		if (r->body.failed)
			return MHD_NO;
		return MHD_YES;
	}
	if (r->answered)
		return MHD_YES;
	track_phase(srv, con, false); /* headers and body are in: no read deadline until the next request */
	if (r->job) /* resumed from parking */
		return kvt_srv_gen_continue(r);
	if (r->rj)
		return kvt_srv_resume_continue(r);
	if (r->too_large)
		return kvt_srv_reply_error(r, 413, NULL, "request_too_large", "the body is over the limit of %zu bytes",
				   srv->cfg.max_body_bytes);
	if (r->bad_path)
		return kvt_srv_reply_error(r, 400, NULL, "invalid_path",
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
	KVT_LOGI("http %s %s %u tenant=%s tokens=%u+%u ms=%.1f id=%s%s", r->method, r->path, status, r->tenant,
		 atomic_load(&r->n_prompt), atomic_load(&r->n_completion), (kvt_now_s() - r->t0) * 1e3, r->rid,
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
	kvt_srv_job_free(r->job);               /* set only if the connection ended while a generation was parked */
	if (r->rj)
		kvt_srv_resume_unref(r->rj);
	free(r->body.p);
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
	if (cfg->chunk_reuse < KVT_CHUNK_REUSE_OFF || cfg->chunk_reuse > KVT_CHUNK_REUSE_TOOLS) {
		KVT_LOGE("http: chunk_reuse %d is not off, marked or tools", cfg->chunk_reuse);
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
	char why[160];
	if (kvt_server_cors_parse(cfg->cors_origins, &srv->cors, why, sizeof(why)) != KVT_OK) {
		KVT_LOGE("http: server.cors_origins: %s", why);
		free(srv);
		return KVT_EINVAL;
	}
	srv->cfg.cors_origins = NULL; /* not kept: srv->cors holds them */
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
	kvt_sched_set_progress(sched, kvt_srv_wake, srv); /* parked generations wake on the scheduler's news */
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
