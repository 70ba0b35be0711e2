/*
 * engine/serve/resp.c — the Redis-protocol listener's transport: the accept
 * thread, one thread per connection, the read → parse → run → wait → flush
 * loop, the output buffer and the counters (resp.h has the design).
 *
 * Invariants:
 *  - replies go out in command order, and only after every SET/DEL ticket
 *    appended before them is acknowledged by the store (conn_flush waits on
 *    them first), so a client never sees +OK for a write the store may lose;
 *  - a connection is in r->conns from accept until its thread ends; its fd
 *    is closed under r->mu after it leaves the list, so kvt_resp_stop's
 *    shutdown() never reaches a reused descriptor;
 *  - a value being read is the parser's until its SET runs: a connection
 *    that closes or errs in the middle stores nothing.
 */
#define _GNU_SOURCE /* accept4 */
#include "resp_int.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define KVT_RESP_RBUF (64u << 10)       /* bytes read per recv */
#define KVT_RESP_OUT_FLUSH (1u << 20)   /* output bytes that make a flush before the input is all parsed */
#define KVT_RESP_BIG (64u << 10)        /* a GET value this large is sent from its own buffer */
#define KVT_RESP_IOV 64                 /* pieces per sendmsg */

void kvt_resp_config_default(kvt_resp_config *c)
{
	memset(c, 0, sizeof(*c));
	c->host = "127.0.0.1";
	c->max_connections = 1024;
	c->max_value_bytes = KVT_KVS_MAX_VALUE_DEFAULT;
}

/* ---- output ---- */

static bool out_grow(kvt_resp_out *o, size_t n)
{
	if (o->oom)
		return false;
	if (o->len + n <= o->cap)
		return true;
	size_t cap = o->cap ? o->cap : 4096;
	while (cap < o->len + n)
		cap *= 2;
	char *b = realloc(o->buf, cap);
	if (!b) {
		o->oom = true;
		return false;
	}
	o->buf = b;
	o->cap = cap;
	return true;
}

void kvt_resp_out_bytes(kvt_resp_out *o, const void *p, size_t n)
{
	if (!out_grow(o, n))
		return;
	memcpy(o->buf + o->len, p, n);
	o->len += n;
}

void kvt_resp_out_str(kvt_resp_out *o, const char *s)
{
	kvt_resp_out_bytes(o, s, strlen(s));
}

void kvt_resp_out_fmt(kvt_resp_out *o, const char *fmt, ...)
{
	char small[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n < sizeof(small)) {
		kvt_resp_out_bytes(o, small, (size_t)n);
		return;
	}
	if (!out_grow(o, (size_t)n + 1))
		return;
	va_start(ap, fmt);
	vsnprintf(o->buf + o->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	o->len += (size_t)n;
}

void kvt_resp_out_bulk(kvt_resp_out *o, const void *p, size_t n)
{
	kvt_resp_out_fmt(o, "$%zu\r\n", n);
	kvt_resp_out_bytes(o, p, n);
	kvt_resp_out_bytes(o, "\r\n", 2);
}

static bool out_piece(kvt_resp_out *o, kvt_kvs_val *v, size_t off, size_t len)
{
	if (o->n_pieces == o->cap_pieces) {
		size_t cap = o->cap_pieces ? o->cap_pieces * 2 : 16;
		kvt_resp_piece *p = realloc(o->pieces, cap * sizeof(*p));
		if (!p) {
			o->oom = true;
			return false;
		}
		o->pieces = p;
		o->cap_pieces = cap;
	}
	o->pieces[o->n_pieces++] = (kvt_resp_piece){ v, off, len };
	return true;
}

/* The buffer's bytes since the last cut become a piece. */
static bool out_cut(kvt_resp_out *o)
{
	if (o->len == o->cut)
		return true;
	bool ok = out_piece(o, NULL, o->cut, o->len - o->cut);
	o->cut = o->len;
	return ok;
}

void kvt_resp_out_val(kvt_resp_out *o, kvt_kvs_val *v)
{
	if (v->len < KVT_RESP_BIG) {
		kvt_resp_out_bulk(o, v->data, v->len);
		return;
	}
	kvt_resp_out_fmt(o, "$%zu\r\n", v->len);
	if (o->oom || !out_cut(o))
		return;
	kvt_kvs_val_ref(v);
	if (!out_piece(o, v, 0, v->len)) {
		kvt_kvs_val_unref(v);
		return;
	}
	kvt_resp_out_bytes(o, "\r\n", 2);
}

static void out_reset(kvt_resp_out *o)
{
	for (size_t i = 0; i < o->n_pieces; i++)
		kvt_kvs_val_unref(o->pieces[i].v);
	o->n_pieces = 0;
	o->len = o->cut = 0;
	if (o->cap > KVT_RESP_OUT_FLUSH) { /* a large reply's buffer is not kept */
		free(o->buf);
		o->buf = NULL;
		o->cap = 0;
	}
}

static void out_free(kvt_resp_out *o)
{
	out_reset(o);
	free(o->buf);
	free(o->pieces);
	memset(o, 0, sizeof(*o));
}

/* ---- a connection ---- */

/* Send pieces [i, n) from offset skip into piece i: KVT_OK or KVT_EIO (the client went away). */
static int send_pieces(kvt_resp_conn *c, size_t i, size_t skip)
{
	kvt_resp_out *o = &c->out;
	while (i < o->n_pieces) {
		struct iovec iov[KVT_RESP_IOV];
		int k = 0;
		for (size_t j = i; j < o->n_pieces && k < KVT_RESP_IOV; j++, k++) {
			kvt_resp_piece *p = &o->pieces[j];
			const uint8_t *base = p->v ? p->v->data : (const uint8_t *)o->buf;
			size_t s = j == i ? skip : 0;
			iov[k] = (struct iovec){ (void *)(base + p->off + s), p->len - s };
		}
		struct msghdr m = { .msg_iov = iov, .msg_iovlen = (size_t)k };
		ssize_t w = sendmsg(c->fd, &m, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return KVT_EIO;
		atomic_fetch_add(&c->r->bytes_out, (uint64_t)w);
		size_t left = (size_t)w;
		while (i < o->n_pieces && left >= o->pieces[i].len - skip) {
			left -= o->pieces[i].len - skip;
			skip = 0;
			i++;
		}
		skip += left;
	}
	return KVT_OK;
}

/* Wait for every write since the last flush, then send every reply. */
static int conn_flush(kvt_resp_conn *c)
{
	if (c->ticket) /* a failed write stays in RAM: still +OK (kvstore.h) */
		(void)kvt_kvs_wait(c->r->cfg.kvs, c->ticket);
	c->ticket = 0;
	if (c->out.oom || !out_cut(&c->out))
		return KVT_ENOMEM;
	int rc = send_pieces(c, 0, 0);
	out_reset(&c->out);
	return rc;
}

/* The input was not RESP: the error, then close. */
static void conn_protocol_error(kvt_resp_conn *c)
{
	atomic_fetch_add(&c->r->protocol_errors, 1);
	kvt_resp_out_fmt(&c->out, "-ERR %s\r\n", c->p.err ? c->p.err : "Protocol error");
	(void)conn_flush(c);
}

/* Parse and run what buf holds: KVT_OK (go on reading), < 0 close. */
static int conn_feed(kvt_resp_conn *c, const uint8_t *buf, size_t n)
{
	size_t off = 0;
	while (off < n && !c->quit) {
		size_t used;
		int rc = kvt_resp_parse(&c->p, buf + off, n - off, &used);
		off += used;
		if (rc < 0) {
			if (rc == KVT_EINVAL)
				conn_protocol_error(c);
			return rc;
		}
		if (rc == 0)
			continue;
		atomic_fetch_add(&c->r->commands, 1);
		kvt_resp_cmd_run(c);
		kvt_resp_parser_next(&c->p);
		if ((c->out.len > KVT_RESP_OUT_FLUSH || c->out.n_pieces > KVT_RESP_IOV) && conn_flush(c) < 0)
			return KVT_EIO;
	}
	return conn_flush(c);
}

/* One read: straight into a large value, or into rbuf and parsed. KVT_OK, or < 0: close. */
static int conn_read(kvt_resp_conn *c)
{
	size_t room;
	uint8_t *direct = kvt_resp_direct(&c->p, &room);
	for (;;) {
		ssize_t n = direct ? recv(c->fd, direct, room, 0) : recv(c->fd, c->rbuf, KVT_RESP_RBUF, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return KVT_EIO;
		atomic_fetch_add(&c->r->bytes_in, (uint64_t)n);
		if (direct) {
			kvt_resp_direct_done(&c->p, (size_t)n);
			return KVT_OK;
		}
		return conn_feed(c, c->rbuf, (size_t)n);
	}
}

static void conn_free(kvt_resp_conn *c)
{
	kvt_resp_parser_deinit(&c->p);
	out_free(&c->out);
	free(c->rbuf);
	free(c);
}

static void *conn_main(void *arg)
{
	kvt_resp_conn *c = arg;
	kvt_resp *r = c->r;
	while (!c->quit && !atomic_load(&r->stopping))
		if (conn_read(c) < 0)
			break;
	pthread_mutex_lock(&r->mu);
	if (c->prev)
		c->prev->next = c->next;
	else
		r->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	close(c->fd);
	r->n_conns--;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	conn_free(c);
	return NULL;
}

/* ---- the listener ---- */

static kvt_resp_conn *conn_new(kvt_resp *r, int fd)
{
	kvt_resp_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->rbuf = malloc(KVT_RESP_RBUF);
	if (!c->rbuf) {
		free(c);
		return NULL;
	}
	c->r = r;
	c->fd = fd;
	c->id = atomic_fetch_add(&r->next_id, 1) + 1;
	c->authed = r->n_keys == 0;
	snprintf(c->ns, sizeof(c->ns), "default");
	kvt_resp_parser_init(&c->p, r->cfg.max_value_bytes);
	return c;
}

/* A new connection: its thread, or refused (over the limit, or no memory/thread). */
static void on_accept(kvt_resp *r, int fd)
{
	static const char full[] = "-ERR max number of clients reached\r\n";
	int one = 1;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	atomic_fetch_add(&r->conns_total, 1);
	pthread_mutex_lock(&r->mu);
	kvt_resp_conn *c = r->n_conns < r->cfg.max_connections ? conn_new(r, fd) : NULL;
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setstacksize(&at, KVT_RESP_STACK_BYTES);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	if (c && pthread_create(&t, &at, conn_main, c) == 0) {
		c->next = r->conns;
		if (r->conns)
			r->conns->prev = c;
		r->conns = c;
		r->n_conns++;
		c = NULL;
		fd = -1;
	}
	pthread_attr_destroy(&at);
	pthread_mutex_unlock(&r->mu);
	if (fd >= 0) {
		atomic_fetch_add(&r->conns_refused, 1);
		(void)send(fd, full, sizeof(full) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
		close(fd);
	}
	if (c)
		conn_free(c);
}

static void *accept_main(void *arg)
{
	kvt_resp *r = arg;
	struct pollfd pf[2] = { { .fd = r->lfd, .events = POLLIN }, { .fd = r->wake_fd, .events = POLLIN } };
	while (!atomic_load(&r->stopping)) {
		if (poll(pf, 2, -1) < 0 && errno != EINTR)
			break;
		if (atomic_load(&r->stopping) || pf[1].revents)
			break;
		if (!(pf[0].revents & POLLIN))
			continue;
		int fd = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE) /* out of descriptors: do not spin */
				poll(NULL, 0, 10);
			continue;
		}
		on_accept(r, fd);
	}
	return NULL;
}

/* Bind and listen on host:port. */
static int listen_on(kvt_resp *r, const char *host, uint16_t port)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICHOST | AI_PASSIVE | AI_NUMERICSERV }, *ai = NULL;
	char ps[8];
	snprintf(ps, sizeof(ps), "%u", port);
	int gai = getaddrinfo(host, ps, &hints, &ai);
	if (gai != 0) {
		KVT_LOGE("store listener: bad address %s: %s", host, gai_strerror(gai));
		return KVT_EINVAL;
	}
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	if (fd >= 0)
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 511) < 0) {
		KVT_LOGE("store listener: cannot listen on %s:%u: %s", host, port, strerror(errno));
		if (fd >= 0)
			close(fd);
		freeaddrinfo(ai);
		return KVT_EIO;
	}
	freeaddrinfo(ai);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
		r->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
							 : ((struct sockaddr_in *)&ss)->sin_port);
	r->lfd = fd;
	return KVT_OK;
}

static int copy_keys(kvt_resp *r, const kvt_resp_config *cfg)
{
	r->n_keys = cfg->n_keys + cfg->n_admin_keys;
	if (!r->n_keys)
		return KVT_OK;
	r->keys = calloc(r->n_keys, sizeof(*r->keys));
	if (!r->keys)
		return KVT_ENOMEM;
	for (size_t i = 0; i < cfg->n_keys; i++)
		r->keys[i] = cfg->keys[i];
	for (size_t i = 0; i < cfg->n_admin_keys; i++)
		r->keys[cfg->n_keys + i] = cfg->admin_keys[i];
	return KVT_OK;
}

int kvt_resp_start(const kvt_resp_config *cfg, kvt_resp **out)
{
	if (!cfg->kvs || !cfg->host || !cfg->max_connections) {
		KVT_LOGE("store listener: no store, address or connection limit");
		return KVT_EINVAL;
	}
	kvt_resp *r = calloc(1, sizeof(*r));
	if (!r)
		return KVT_ENOMEM;
	r->cfg = *cfg;
	r->cfg.host = NULL;
	snprintf(r->version, sizeof(r->version), "%s", cfg->version ? cfg->version : "0");
	r->lfd = -1;
	r->t_start = kvt_now_s();
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	r->wake_fd = eventfd(0, EFD_CLOEXEC);
	int rc = r->wake_fd < 0 ? KVT_EIO : copy_keys(r, cfg);
	if (rc == KVT_OK)
		rc = listen_on(r, cfg->host, cfg->port);
	if (rc == KVT_OK && pthread_create(&r->acceptor, NULL, accept_main, r) != 0)
		rc = KVT_ENOMEM;
	if (rc != KVT_OK) {
		kvt_resp_stop(r);
		return rc;
	}
	r->acceptor_started = true;
	*out = r;
	return KVT_OK;
}

uint16_t kvt_resp_port(const kvt_resp *r)
{
	return r->port;
}

void kvt_resp_stats_get(kvt_resp *r, kvt_resp_stats *st)
{
	pthread_mutex_lock(&r->mu);
	st->conns_open = r->n_conns;
	pthread_mutex_unlock(&r->mu);
	st->conns_total = atomic_load(&r->conns_total);
	st->conns_refused = atomic_load(&r->conns_refused);
	st->commands = atomic_load(&r->commands);
	st->protocol_errors = atomic_load(&r->protocol_errors);
	st->auth_failures = atomic_load(&r->auth_failures);
	st->bytes_in = atomic_load(&r->bytes_in);
	st->bytes_out = atomic_load(&r->bytes_out);
}

void kvt_resp_stop(kvt_resp *r)
{
	if (!r)
		return;
	atomic_store(&r->stopping, true);
	if (r->wake_fd >= 0) {
		uint64_t one = 1;
		ssize_t w = write(r->wake_fd, &one, sizeof(one));
		(void)w;
	}
	if (r->acceptor_started)
		pthread_join(r->acceptor, NULL);
	if (r->lfd >= 0)
		close(r->lfd);
	pthread_mutex_lock(&r->mu);
	for (kvt_resp_conn *c = r->conns; c; c = c->next)
		shutdown(c->fd, SHUT_RDWR);
	while (r->n_conns > 0)
		pthread_cond_wait(&r->cv, &r->mu);
	pthread_mutex_unlock(&r->mu);
	if (r->wake_fd >= 0)
		close(r->wake_fd);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
	free(r->keys);
	free(r);
}
