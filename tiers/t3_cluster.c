/*
 * tiers/t3_cluster.c — a small Redis Cluster client on hiredis (contract in
 * t3_remote.h).
 *
 * Design: one client = one thread's connections. Nodes are a small array
 * (host, port, hiredis context or NULL, breaker state); the slot map is
 * 16384 node indices (-1: unknown). A round (kvt_rc_run) repeats passes until
 * every op has a result: a pass groups the ops still open by node, appends up
 * to pipeline_depth commands to each node, sends them all (so every node
 * works at once), then reads each node's replies in order. A MOVED reply points the slot at the named
 * node (added if new) and reopens the op for the next pass; ASK reopens it
 * with ASKING in front; a reply never arrives within the round's deadline,
 * or the connection breaks, and the node's open ops fail with KVT_EIO and
 * its connection is dropped (a pipeline cut midway cannot be resumed).
 *
 * Invariants: an op is sent at most 1 + KVT_RC_MAX_REDIRECTS times; a round
 * never outlives its deadline by more than one socket timeout (each read's
 * timeout is the time left); a node in back-off is not dialled.
 */
#include "t3_remote.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define KVT_RC_MAX_NODES 64
#define KVT_RC_MAX_REDIRECTS 3
#define KVT_RC_BACKOFF_MIN_S 0.25
#define KVT_RC_BACKOFF_MAX_S 5.0

typedef struct rc_node {
	char host[256];       /* address as the map or the seed list names it */
	int port;
	redisContext *ctx;    /* connected, or NULL */
	double down_until;    /* breaker: not dialled before this (kvt_now_s) */
	double backoff_s;     /* the next back-off (doubles on each failure) */
	uint32_t n_queued;    /* ops appended in the current pass (scratch) */
} rc_node;

struct kvt_rc {
	kvt_rc_config cfg;            /* copy; the strings below are ours */
	char *seeds, *user, *password;/* owned copies */
	rc_node nodes[KVT_RC_MAX_NODES];
	uint32_t n_nodes;
	uint32_t n_seeds;             /* nodes[0..n_seeds) are the seeds */
	int16_t slot_node[KVT_RC_SLOTS]; /* node index per slot, -1 unknown */
	bool need_refresh;            /* load the map before the next round */
	double refresh_t;             /* the last load attempt */
	kvt_rc_stats st;
};

/* CRC16, XMODEM variant: polynomial 0x1021, initial value 0, no reflection. */
static uint16_t crc16(const uint8_t *p, size_t n)
{
	uint16_t crc = 0;
	for (size_t i = 0; i < n; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc;
}

uint16_t kvt_rc_key_slot(const void *key, size_t n)
{
	const uint8_t *k = key;
	size_t s = 0;
	while (s < n && k[s] != '{')
		s++;
	if (s < n) {
		size_t e = s + 1;
		while (e < n && k[e] != '}')
			e++;
		if (e < n && e > s + 1) /* a non-empty tag: only it is hashed */
			return crc16(k + s + 1, e - s - 1) & (KVT_RC_SLOTS - 1);
	}
	return crc16(k, n) & (KVT_RC_SLOTS - 1);
}

static struct timeval tv_of(double s)
{
	if (s < 0.001)
		s = 0.001;
	struct timeval tv = { (time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6) };
	return tv;
}

static int node_find(kvt_rc *c, const char *host, int port)
{
	for (uint32_t i = 0; i < c->n_nodes; i++)
		if (c->nodes[i].port == port && !strcmp(c->nodes[i].host, host))
			return (int)i;
	return -1;
}

static int node_add(kvt_rc *c, const char *host, size_t host_len, int port)
{
	char h[256];
	if (host_len == 0 || host_len >= sizeof(h) || port <= 0 || port > 65535)
		return -1;
	memcpy(h, host, host_len);
	h[host_len] = 0;
	int i = node_find(c, h, port);
	if (i >= 0)
		return i;
	if (c->n_nodes == KVT_RC_MAX_NODES)
		return -1;
	rc_node *nd = &c->nodes[c->n_nodes];
	memset(nd, 0, sizeof(*nd));
	memcpy(nd->host, h, host_len + 1);
	nd->port = port;
	nd->backoff_s = KVT_RC_BACKOFF_MIN_S;
	return (int)c->n_nodes++;
}

static void node_drop(kvt_rc *c, rc_node *nd, bool failed)
{
	if (nd->ctx) {
		redisFree(nd->ctx);
		nd->ctx = NULL;
	}
	if (failed) {
		nd->down_until = kvt_now_s() + nd->backoff_s;
		nd->backoff_s = nd->backoff_s * 2 > KVT_RC_BACKOFF_MAX_S ? KVT_RC_BACKOFF_MAX_S : nd->backoff_s * 2;
		c->need_refresh = c->cfg.cluster; /* a failover may have moved its slots */
	}
}

/* Connect (and AUTH) unless connected; false when the node is down or in back-off. */
static bool node_connect(kvt_rc *c, rc_node *nd)
{
	if (nd->ctx)
		return true;
	if (kvt_now_s() < nd->down_until)
		return false;
	redisContext *ctx = redisConnectWithTimeout(nd->host, nd->port, tv_of(c->cfg.connect_timeout_ms / 1e3));
	if (!ctx || ctx->err) {
		KVT_LOGD("t3 %s:%d: cannot connect: %s", nd->host, nd->port, ctx ? ctx->errstr : "out of memory");
		if (ctx)
			redisFree(ctx);
		node_drop(c, nd, true);
		return false;
	}
	redisSetTimeout(ctx, tv_of(c->cfg.command_timeout_ms / 1e3));
	if (c->password) {
		redisReply *r;
		if (c->user && c->user[0])
			r = redisCommand(ctx, "AUTH %s %s", c->user, c->password);
		else
			r = redisCommand(ctx, "AUTH %s", c->password);
		bool ok = r && r->type == REDIS_REPLY_STATUS;
		if (!ok)
			KVT_LOGE("t3 %s:%d: AUTH refused: %s", nd->host, nd->port,
				 r && r->type == REDIS_REPLY_ERROR ? r->str : ctx->errstr);
		if (r)
			freeReplyObject(r);
		if (!ok) {
			redisFree(ctx);
			node_drop(c, nd, true);
			return false;
		}
	}
	nd->ctx = ctx;
	nd->backoff_s = KVT_RC_BACKOFF_MIN_S;
	c->st.n_connects++;
	return true;
}

/* Load the slot map from the first node that answers CLUSTER SLOTS. */
static void refresh_map(kvt_rc *c)
{
	c->refresh_t = kvt_now_s();
	for (uint32_t i = 0; i < c->n_nodes; i++) {
		rc_node *nd = &c->nodes[i];
		if (!node_connect(c, nd))
			continue;
		redisReply *r = redisCommand(nd->ctx, "CLUSTER SLOTS");
		if (!r) {
			node_drop(c, nd, true);
			continue;
		}
		if (r->type != REDIS_REPLY_ARRAY) {
			KVT_LOGW("t3 %s:%d: CLUSTER SLOTS refused: %s", nd->host, nd->port,
				 r->type == REDIS_REPLY_ERROR ? r->str : "not an array");
			freeReplyObject(r);
			continue;
		}
		for (uint32_t s = 0; s < KVT_RC_SLOTS; s++)
			c->slot_node[s] = -1;
		/* Each entry: start, end, then the master [ip, port, id, ...], then replicas. */
		for (size_t k = 0; k < r->elements; k++) {
			redisReply *e = r->element[k];
			if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
			    e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
			    e->element[2]->elements < 2 || e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
			    e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
				continue;
			long long lo = e->element[0]->integer, hi = e->element[1]->integer;
			redisReply *m = e->element[2];
			/* An empty address means "the node you asked". */
			const char *host = m->element[0]->len ? m->element[0]->str : nd->host;
			size_t host_len = m->element[0]->len ? m->element[0]->len : strlen(nd->host);
			int ni = node_add(c, host, host_len, (int)m->element[1]->integer);
			if (ni < 0 || lo < 0 || hi >= KVT_RC_SLOTS || lo > hi)
				continue;
			for (long long s = lo; s <= hi; s++)
				c->slot_node[s] = (int16_t)ni;
		}
		freeReplyObject(r);
		c->need_refresh = false;
		c->st.n_refresh++;
		return;
	}
}

int kvt_rc_create(const kvt_rc_config *cfg, kvt_rc **out)
{
	if (!cfg->seeds || !cfg->seeds[0]) {
		KVT_LOGE("t3: no seed addresses");
		return KVT_EINVAL;
	}
	if (cfg->pipeline_depth == 0 || cfg->command_timeout_ms == 0 || cfg->connect_timeout_ms == 0) {
		KVT_LOGE("t3: pipeline depth and timeouts must be > 0");
		return KVT_EINVAL;
	}
	kvt_rc *c = calloc(1, sizeof(*c));
	if (!c)
		return KVT_ENOMEM;
	c->cfg = *cfg;
	c->seeds = strdup(cfg->seeds);
	c->user = cfg->user ? strdup(cfg->user) : NULL;
	c->password = cfg->password ? strdup(cfg->password) : NULL;
	if (!c->seeds || (cfg->user && !c->user) || (cfg->password && !c->password)) {
		kvt_rc_destroy(c);
		return KVT_ENOMEM;
	}
	c->cfg.seeds = c->seeds;
	c->cfg.user = c->user;
	c->cfg.password = c->password;
	for (uint32_t s = 0; s < KVT_RC_SLOTS; s++)
		c->slot_node[s] = -1;
	/* seeds: host:port separated by commas (spaces allowed around them) */
	const char *p = cfg->seeds;
	while (*p) {
		while (*p == ' ' || *p == ',')
			p++;
		if (!*p)
			break;
		const char *e = p;
		while (*e && *e != ',' && *e != ' ')
			e++;
		const char *colon = NULL;
		for (const char *q = p; q < e; q++)
			if (*q == ':')
				colon = q;
		char *end = NULL;
		long port = colon ? strtol(colon + 1, &end, 10) : 0;
		if (!colon || end != e || node_add(c, p, (size_t)(colon - p), (int)port) < 0) {
			KVT_LOGE("t3: seed \"%.*s\" is not host:port (port 1..65535)", (int)(e - p), p);
			kvt_rc_destroy(c);
			return KVT_EINVAL;
		}
		p = e;
	}
	c->n_seeds = c->n_nodes;
	if (cfg->cluster)
		refresh_map(c);
	else
		for (uint32_t s = 0; s < KVT_RC_SLOTS; s++)
			c->slot_node[s] = 0;
	*out = c;
	return KVT_OK;
}

void kvt_rc_destroy(kvt_rc *c)
{
	if (!c)
		return;
	for (uint32_t i = 0; i < c->n_nodes; i++)
		if (c->nodes[i].ctx)
			redisFree(c->nodes[i].ctx);
	free(c->seeds);
	free(c->user);
	if (c->password) {
		/* NOTE: volatile so the wipe is not optimized away */
		volatile char *v = c->password;
		while (*v)
			*v++ = 0;
	}
	free(c->password);
	free(c);
}

void kvt_rc_get_stats(const kvt_rc *c, kvt_rc_stats *st)
{
	*st = c->st;
	st->n_nodes = c->n_nodes;
}

void kvt_rc_ops_release(kvt_rc_op *ops, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		if (ops[i].reply_)
			freeReplyObject(ops[i].reply_);
		ops[i].reply_ = NULL;
		ops[i].data = NULL;
		ops[i].data_bytes = 0;
	}
}

/* The node a redirect names ("MOVED 3999 127.0.0.1:6381"): its index, or -1. */
static int redirect_node(kvt_rc *c, const char *msg, size_t len)
{
	const char *sp = memchr(msg, ' ', len);
	if (!sp)
		return -1;
	sp = memchr(sp + 1, ' ', len - (size_t)(sp + 1 - msg));
	if (!sp)
		return -1;
	const char *addr = sp + 1, *end = msg + len, *colon = NULL;
	for (const char *q = addr; q < end; q++)
		if (*q == ':')
			colon = q;
	if (!colon)
		return -1;
	int port = atoi(colon + 1);
	return node_add(c, addr, (size_t)(colon - addr), port);
}

static bool starts(const redisReply *r, const char *w)
{
	size_t n = strlen(w);
	return r->len >= n && !memcmp(r->str, w, n) && (r->len == n || r->str[n] == ' ');
}

/* Take a reply for op (which stays open when redirected). */
static void take_reply(kvt_rc *c, kvt_rc_op *op, redisReply *r)
{
	if (r->type == REDIS_REPLY_ERROR) {
		bool moved = starts(r, "MOVED"), ask = starts(r, "ASK");
		if ((moved || ask) && op->tries_ < KVT_RC_MAX_REDIRECTS && c->cfg.cluster) {
			int ni = redirect_node(c, r->str, r->len);
			if (ni >= 0) {
				op->tries_++;
				op->node_ = (int16_t)ni;
				op->asking_ = ask;
				if (moved) {
					c->slot_node[op->slot_] = (int16_t)ni;
					c->need_refresh = true;
					c->st.n_moved++;
				} else {
					c->st.n_ask++;
				}
				freeReplyObject(r);
				return; /* still open */
			}
		}
		if (starts(r, "OOM"))
			op->rc = KVT_EFULL;
		else if (moved || ask || starts(r, "CLUSTERDOWN") || starts(r, "TRYAGAIN") || starts(r, "LOADING") ||
			 starts(r, "MASTERDOWN"))
			op->rc = KVT_EIO;
		else {
			KVT_LOGW("t3: key \"%.*s\": %s", (int)op->key_bytes, op->key, r->str);
			op->rc = KVT_EINVAL;
		}
		if (moved || ask)
			c->need_refresh = true;
		freeReplyObject(r);
		return;
	}
	if (op->verb != KVT_RC_GET_SET) { /* DEL, EXISTS: the number of keys */
		op->rc = r->type != REDIS_REPLY_INTEGER ? KVT_EINVAL : r->integer > 0 ? KVT_OK : KVT_ENOTFOUND;
		freeReplyObject(r);
		return;
	}
	if (op->val) {
		op->rc = r->type == REDIS_REPLY_STATUS ? KVT_OK : KVT_EINVAL;
		freeReplyObject(r);
		return;
	}
	if (r->type == REDIS_REPLY_NIL) {
		op->rc = KVT_ENOTFOUND;
		freeReplyObject(r);
		return;
	}
	if (r->type != REDIS_REPLY_STRING) {
		op->rc = KVT_EINVAL;
		freeReplyObject(r);
		return;
	}
	op->rc = KVT_OK;
	op->reply_ = r;
	op->data = r->str;
	op->data_bytes = r->len;
}

static void append_op(rc_node *nd, kvt_rc_op *op)
{
	char ex[24];
	const char *argv[5];
	size_t len[5];
	int argc;
	if (op->asking_)
		redisAppendCommand(nd->ctx, "ASKING");
	if (op->verb != KVT_RC_GET_SET) {
		argv[0] = op->verb == KVT_RC_DEL ? "DEL" : "EXISTS", len[0] = strlen(argv[0]);
		argv[1] = op->key, len[1] = op->key_bytes;
		argc = 2;
	} else if (op->val) {
		argv[0] = "SET", len[0] = 3;
		argv[1] = op->key, len[1] = op->key_bytes;
		argv[2] = op->val, len[2] = op->val_bytes;
		argc = 3;
		if (op->ttl_s) {
			snprintf(ex, sizeof(ex), "%u", op->ttl_s);
			argv[3] = "EX", len[3] = 2;
			argv[4] = ex, len[4] = strlen(ex);
			argc = 5;
		}
	} else {
		argv[0] = "GET", len[0] = 3;
		argv[1] = op->key, len[1] = op->key_bytes;
		argc = 2;
	}
	redisAppendCommandArgv(nd->ctx, argc, argv, len);
}

int kvt_rc_run(kvt_rc *c, kvt_rc_op *ops, uint32_t n)
{
	return kvt_rc_run_timeout(c, ops, n, c->cfg.command_timeout_ms);
}

/* Open every op of a round: no result, no reply, routed by its key's slot. */
static void round_open(kvt_rc *c, kvt_rc_op *ops, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		kvt_rc_op *op = &ops[i];
		op->rc = 1; /* open */
		op->reply_ = NULL;
		op->data = NULL;
		op->data_bytes = 0;
		op->tries_ = 0;
		op->asking_ = 0;
		op->slot_ = c->cfg.cluster ? kvt_rc_key_slot(op->key, op->key_bytes) : 0;
		op->node_ = c->slot_node[op->slot_];
	}
}

/* The ops still open that can go on (a node serves the slot, time is left); the rest fail KVT_EIO. */
static uint32_t round_count_open(kvt_rc *c, kvt_rc_op *ops, uint32_t n, double deadline)
{
	uint32_t n_open = 0;
	for (uint32_t i = 0; i < n; i++) {
		kvt_rc_op *op = &ops[i];
		if (op->rc != 1)
			continue;
		if (op->node_ < 0 && c->cfg.cluster && kvt_now_s() - c->refresh_t > 0.1) {
			refresh_map(c);
			op->node_ = c->slot_node[op->slot_];
		}
		if (op->node_ < 0 || kvt_now_s() >= deadline) {
			op->rc = KVT_EIO; /* no node serves the slot, or out of time */
			continue;
		}
		n_open++;
	}
	return n_open;
}

/*
 * One pass: per node, up to pipeline_depth open ops, in op order, appended
 * to its connection (dialled if need be). order[j] is the op appended j-th,
 * sent[j] the node it went to. Returns how many were appended.
 */
static uint32_t pass_queue(kvt_rc *c, kvt_rc_op *ops, uint32_t n, uint32_t *order, int16_t *sent)
{
	for (uint32_t k = 0; k < c->n_nodes; k++)
		c->nodes[k].n_queued = 0;
	uint32_t n_order = 0;
	for (uint32_t i = 0; i < n; i++) {
		kvt_rc_op *op = &ops[i];
		if (op->rc != 1)
			continue;
		rc_node *nd = &c->nodes[op->node_];
		if (nd->n_queued >= c->cfg.pipeline_depth)
			continue;
		if (!nd->ctx && !node_connect(c, nd)) {
			op->rc = KVT_EIO;
			continue;
		}
		append_op(nd, op);
		nd->n_queued++;
		sent[n_order] = op->node_;
		order[n_order++] = i;
	}
	return n_order;
}

/*
 * Send every node its commands before reading any reply: hiredis
 * writes a context's buffer only when asked for a reply, so reading
 * node 0 first would leave the other nodes idle until their turn.
 * (A failed write shows again at the first read of that node.)
 */
static void pass_send(kvt_rc *c, double deadline)
{
	for (uint32_t k = 0; k < c->n_nodes; k++) {
		rc_node *nd = &c->nodes[k];
		int done = 0;
		double left = deadline - kvt_now_s();
		if (!nd->n_queued || !nd->ctx || left <= 0)
			continue;
		redisSetTimeout(nd->ctx, tv_of(left));
		while (!done && redisBufferWrite(nd->ctx, &done) == REDIS_OK && kvt_now_s() < deadline)
			;
	}
}

/* The reply of op from nd (the ASKING reply before it skipped), or NULL with *broken set. */
static void *pass_read_reply(rc_node *nd, const kvt_rc_op *op, double deadline, bool *broken)
{
	void *r = NULL;
	double left = deadline - kvt_now_s();
	if (*broken || left <= 0) {
		*broken = true;
		return NULL;
	}
	redisSetTimeout(nd->ctx, tv_of(left));
	if (op->asking_) { /* the ASKING reply comes first */
		if (redisGetReply(nd->ctx, &r) != REDIS_OK)
			r = NULL, *broken = true;
		else
			freeReplyObject(r), r = NULL;
	}
	if (!*broken && redisGetReply(nd->ctx, &r) != REDIS_OK)
		r = NULL, *broken = true;
	return r;
}

/* Read back node k's replies in the order appended; a broken node fails its ops and is dropped. */
static void pass_read_node(kvt_rc *c, uint32_t k, kvt_rc_op *ops, const uint32_t *order, const int16_t *sent,
			   uint32_t n_order, double deadline)
{
	rc_node *nd = &c->nodes[k];
	c->st.n_rounds++;
	bool broken = false;
	for (uint32_t j = 0; j < n_order; j++) {
		kvt_rc_op *op = &ops[order[j]];
		/* NOTE: an op's node_ changes inside take_reply (a redirect), so
		 * the pass remembers where each op was sent. */
		if (sent[j] != (int16_t)k)
			continue;
		void *r = pass_read_reply(nd, op, deadline, &broken);
		if (broken) {
			op->rc = KVT_EIO;
			continue;
		}
		op->asking_ = 0;
		take_reply(c, op, r);
	}
	if (broken) {
		KVT_LOGD("t3 %s:%d: %s", nd->host, nd->port,
			 nd->ctx && nd->ctx->err ? nd->ctx->errstr : "round deadline passed");
		node_drop(c, nd, true);
	}
}

int kvt_rc_run_timeout(kvt_rc *c, kvt_rc_op *ops, uint32_t n, uint32_t timeout_ms)
{
	const double deadline = kvt_now_s() + timeout_ms / 1e3;
	uint32_t *order = malloc((n ? n : 1) * sizeof(*order));
	int16_t *sent = malloc((n ? n : 1) * sizeof(*sent)); /* [n_order] the node order[j] went to */
	if (!order || !sent) {
		free(order);
		free(sent);
		return KVT_ENOMEM;
	}
	if (c->cfg.cluster && c->need_refresh && kvt_now_s() - c->refresh_t > 0.1)
		refresh_map(c);
	round_open(c, ops, n);
	while (round_count_open(c, ops, n, deadline)) {
		uint32_t n_order = pass_queue(c, ops, n, order, sent);
		pass_send(c, deadline);
		for (uint32_t k = 0; k < c->n_nodes; k++)
			if (c->nodes[k].n_queued)
				pass_read_node(c, k, ops, order, sent, n_order, deadline);
	}
	free(order);
	free(sent);
	return KVT_OK;
}
