/*
 * engine/serve/resp_cmd.c — the Redis-protocol listener's commands: one
 * table (name, arity, whether it runs before AUTH, handler), each handler
 * appending exactly one reply. docs/store.md lists them with their replies.
 *
 * Design choices:
 *  - AUTH password, or AUTH username password: the password is a kvtier API
 *    key (server.api_keys, api_key_file or admin_keys) and its tenant becomes
 *    the connection's namespace. The username must be "default" (what
 *    clients send when only a password is configured) or the key's tenant;
 *    anything else is WRONGPASS. Every key is compared (constant time each),
 *    so the time does not say which matched.
 *  - With keys configured, only AUTH, HELLO and QUIT run before AUTH (PING
 *    too is NOAUTH, as in Redis).
 *  - RESP2 only: HELLO 2 answers the handshake; HELLO 3 gets -NOPROTO, on
 *    which redis-py (8.x defaults to RESP3) falls back to RESP2 and AUTH.
 *  - SET supports EX and PX; NX, XX, GET, KEEPTTL, EXAT and PXAT are refused
 *    with an error naming the option (nothing is stored).
 *  - A SET or DEL raises the connection's ticket to its own: the replies go
 *    out only once the store acknowledged it (resp.c, conn_flush).
 */
#include "resp_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/utsname.h>
#include <unistd.h>

typedef void (*cmd_fn)(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n);

/* Whether argument a is the word w (ASCII case-insensitive). */
static bool arg_is(const kvt_resp_arg *a, const char *w)
{
	size_t n = strlen(w);
	return a->len == n && strncasecmp((const char *)a->p, w, n) == 0;
}

/* A decimal integer argument (Redis's rules: no spaces, no '+', fits int64). */
static bool arg_ll(const kvt_resp_arg *a, long long *out)
{
	char s[24];
	if (a->len == 0 || a->len >= sizeof(s))
		return false;
	memcpy(s, a->p, a->len);
	s[a->len] = '\0';
	char *end;
	long long v = strtoll(s, &end, 10);
	if (*end || s[0] == '+' || s[0] == ' ' || (s[0] == '0' && a->len > 1) || (s[0] == '-' && s[1] == '0'))
		return false;
	*out = v;
	return true;
}

static void add_ticket(kvt_resp_conn *c, kvt_kvs_ticket t)
{
	if (t > c->ticket)
		c->ticket = t;
}

/* ---- connection commands ---- */

/* Match a presented (user, password) against every key: the tenant, or NULL. */
static const char *key_match(kvt_resp *r, const kvt_resp_arg *user, const kvt_resp_arg *pass)
{
	const char *tenant = NULL;
	for (size_t i = 0; i < r->n_keys; i++) { /* every key compared: the time does not say which matched */
		const kvt_api_key *k = &r->keys[i];
		size_t nk = strlen(k->key);
		unsigned diff = (unsigned)(pass->len ^ nk);
		for (size_t j = 0; j < pass->len; j++)
			diff |= pass->p[j] ^ (uint8_t)k->key[j % (nk ? nk : 1)];
		const char *t = k->tenant[0] ? k->tenant : "default";
		bool user_ok = !user || arg_is(user, "default") ||
			       (user->len == strlen(t) && memcmp(user->p, t, user->len) == 0);
		if (diff == 0 && nk && user_ok && !tenant)
			tenant = t;
	}
	return tenant;
}

/* Authenticate: true (namespace set) or false (WRONGPASS or the no-keys error appended). */
static bool do_auth(kvt_resp_conn *c, const kvt_resp_arg *user, const kvt_resp_arg *pass)
{
	if (c->r->n_keys == 0) {
		kvt_resp_out_str(&c->out, "-ERR AUTH <password> called without any password configured for the default "
					  "user. Are you sure your configuration is correct?\r\n");
		return false;
	}
	const char *t = key_match(c->r, user, pass);
	if (!t) {
		atomic_fetch_add(&c->r->auth_failures, 1);
		kvt_resp_out_str(&c->out, "-WRONGPASS invalid username-password pair or user is disabled.\r\n");
		return false;
	}
	snprintf(c->ns, sizeof(c->ns), "%s", t);
	c->authed = true;
	return true;
}

static void cmd_auth(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	if (do_auth(c, n == 3 ? &a[1] : NULL, &a[n - 1]))
		kvt_resp_out_str(&c->out, "+OK\r\n");
}

static void cmd_ping(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	if (n == 1)
		kvt_resp_out_str(&c->out, "+PONG\r\n");
	else
		kvt_resp_out_bulk(&c->out, a[1].p, a[1].len);
}

static void cmd_echo(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	(void)n;
	kvt_resp_out_bulk(&c->out, a[1].p, a[1].len);
}

static void cmd_quit(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	(void)a, (void)n;
	kvt_resp_out_str(&c->out, "+OK\r\n");
	c->quit = true;
}

static void cmd_select(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	long long db;
	(void)n;
	if (!arg_ll(&a[1], &db))
		kvt_resp_out_str(&c->out, "-ERR value is not an integer or out of range\r\n");
	else if (db != 0)
		kvt_resp_out_str(&c->out, "-ERR DB index is out of range\r\n");
	else
		kvt_resp_out_str(&c->out, "+OK\r\n");
}

static void cmd_client(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	if (arg_is(&a[1], "setinfo") && n == 4) {
		kvt_resp_out_str(&c->out, "+OK\r\n");
	} else if (arg_is(&a[1], "setname") && n == 3) {
		size_t k = a[2].len < sizeof(c->name) - 1 ? a[2].len : sizeof(c->name) - 1;
		memcpy(c->name, a[2].p, k);
		c->name[k] = '\0';
		kvt_resp_out_str(&c->out, "+OK\r\n");
	} else if (arg_is(&a[1], "getname") && n == 2) {
		if (c->name[0])
			kvt_resp_out_bulk(&c->out, c->name, strlen(c->name));
		else
			kvt_resp_out_str(&c->out, "$-1\r\n");
	} else if (arg_is(&a[1], "id") && n == 2) {
		kvt_resp_out_fmt(&c->out, ":%llu\r\n", (unsigned long long)c->id);
	} else {
		kvt_resp_out_str(&c->out, "-ERR unknown subcommand or wrong number of arguments for 'CLIENT'. Try "
					  "CLIENT HELP.\r\n");
	}
}

static void hello_reply(kvt_resp_conn *c)
{
	kvt_resp_out_str(&c->out, "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n"
				  "$5\r\nproto\r\n:2\r\n$2\r\nid\r\n");
	kvt_resp_out_fmt(&c->out, ":%llu\r\n", (unsigned long long)c->id);
	kvt_resp_out_str(&c->out, "$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"
				  "$7\r\nmodules\r\n*0\r\n");
}

/* HELLO [protover [AUTH user pass] [SETNAME name]]: RESP2 only. */
static void cmd_hello(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	long long v = 2;
	if (n > 1 && !arg_ll(&a[1], &v)) {
		kvt_resp_out_str(&c->out, "-ERR Protocol version is not an integer or out of range\r\n");
		return;
	}
	if (v != 2) {
		kvt_resp_out_str(&c->out, "-NOPROTO sorry, this protocol version is not supported.\r\n");
		return;
	}
	size_t i = 2;
	for (; i < n; i++) {
		if (arg_is(&a[i], "auth") && i + 2 < n) {
			if (!do_auth(c, &a[i + 1], &a[i + 2]))
				return;
			i += 2;
		} else if (arg_is(&a[i], "setname") && i + 1 < n) {
			i++;
		} else {
			kvt_resp_out_str(&c->out, "-ERR Syntax error in HELLO option\r\n");
			return;
		}
	}
	if (!c->authed) {
		atomic_fetch_add(&c->r->auth_failures, 1);
		kvt_resp_out_str(&c->out, "-NOAUTH HELLO must be called with the client already authenticated, otherwise "
					  "the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the "
					  "client and select the RESP protocol version at the same time\r\n");
		return;
	}
	hello_reply(c);
}

static void cmd_command(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	(void)a, (void)n;
	kvt_resp_out_str(&c->out, "*0\r\n"); /* no command table: clients fall back to their own */
}

/* ---- the store ---- */

static void cmd_get(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	(void)n;
	kvt_kvs_val *v = NULL;
	if (a[1].len && kvt_kvs_get(c->r->cfg.kvs, c->ns, a[1].p, a[1].len, &v) == KVT_OK) {
		kvt_resp_out_val(&c->out, v);
		kvt_kvs_val_unref(v);
	} else {
		kvt_resp_out_str(&c->out, "$-1\r\n");
	}
}

/* SET's options from a[3..n): the TTL in ms (0: none), or false with the error appended. */
static bool set_options(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n, uint64_t *ttl_ms)
{
	static const char *const refused[] = { "nx", "xx", "get", "keepttl", "exat", "pxat" };
	*ttl_ms = 0;
	for (size_t i = 3; i < n; i++) {
		for (size_t k = 0; k < sizeof(refused) / sizeof(refused[0]); k++)
			if (arg_is(&a[i], refused[k])) {
				kvt_resp_out_fmt(&c->out, "-ERR SET option '%s' is not supported by kvtier\r\n", refused[k]);
				return false;
			}
		bool ex = arg_is(&a[i], "ex"), px = arg_is(&a[i], "px");
		long long t;
		if (!(ex || px) || i + 1 >= n || *ttl_ms) {
			kvt_resp_out_str(&c->out, "-ERR syntax error\r\n");
			return false;
		}
		if (!arg_ll(&a[++i], &t)) {
			kvt_resp_out_str(&c->out, "-ERR value is not an integer or out of range\r\n");
			return false;
		}
		if (t <= 0 || (ex && t > (long long)(UINT64_MAX / 2000))) {
			kvt_resp_out_str(&c->out, "-ERR invalid expire time in 'set' command\r\n");
			return false;
		}
		*ttl_ms = ex ? (uint64_t)t * 1000 : (uint64_t)t;
	}
	return true;
}

static void cmd_set(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	uint64_t ttl_ms;
	if (!set_options(c, a, n, &ttl_ms))
		return;
	kvt_kvs_val *v = c->p.val; /* the multibulk value, read into its own buffer */
	if (v) {
		c->p.val = NULL;
	} else { /* an inline SET: its value is in the arena */
		v = kvt_kvs_val_new(a[2].len ? a[2].len : 1);
		if (!v) {
			kvt_resp_out_str(&c->out, "-OOM command not allowed when used memory > 'maxmemory'.\r\n");
			return;
		}
		memcpy(v->data, a[2].p, a[2].len);
		v->len = a[2].len;
	}
	kvt_kvs_ticket t = 0;
	int rc = kvt_kvs_set(c->r->cfg.kvs, c->ns, a[1].p, a[1].len, v, ttl_ms, &t);
	if (rc == KVT_OK) {
		add_ticket(c, t);
		kvt_resp_out_str(&c->out, "+OK\r\n");
	} else if (rc == KVT_ESTOPPED) {
		kvt_resp_out_str(&c->out, "-ERR kvtier is shutting down\r\n");
	} else if (rc == KVT_EFULL) {
		kvt_resp_out_str(&c->out, "-ERR the store holds its most namespaces (64); this key's namespace is new\r\n");
	} else {
		kvt_resp_out_str(&c->out, "-ERR invalid key or value (empty key, or a value over [store] max_value)\r\n");
	}
}

static void cmd_exists(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	long long found = 0;
	for (size_t i = 1; i < n; i++)
		found += a[i].len && kvt_kvs_exists(c->r->cfg.kvs, c->ns, a[i].p, a[i].len) == 1;
	kvt_resp_out_fmt(&c->out, ":%lld\r\n", found);
}

static void cmd_del(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	long long removed = 0;
	for (size_t i = 1; i < n; i++) {
		kvt_kvs_ticket t = 0;
		if (a[i].len && kvt_kvs_del(c->r->cfg.kvs, c->ns, a[i].p, a[i].len, &t) == 1) {
			removed++;
			add_ticket(c, t);
		}
	}
	kvt_resp_out_fmt(&c->out, ":%lld\r\n", removed);
}

void kvt_resp_ns_row(const kvt_resp_conn *c, const kvt_kvs_stats *st, kvt_kvs_tenant_stats *row)
{
	memset(row, 0, sizeof(*row));
	for (uint32_t i = 0; i < st->n_tenants && i < KVT_KVS_MAX_TENANTS; i++)
		if (!strcmp(st->tenant[i].ns, c->ns))
			*row = st->tenant[i];
}

static void cmd_dbsize(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	(void)a, (void)n;
	kvt_kvs_stats *st = malloc(sizeof(*st));
	kvt_kvs_tenant_stats row;
	if (!st) {
		kvt_resp_out_str(&c->out, "-ERR out of memory\r\n");
		return;
	}
	kvt_kvs_stats_get(c->r->cfg.kvs, st);
	kvt_resp_ns_row(c, st, &row);
	free(st);
	kvt_resp_out_fmt(&c->out, ":%llu\r\n", (unsigned long long)row.keys);
}

static const struct cmd {
	const char *name;
	int min_args, max_args;    /* the name included; max -1: any number */
	bool open;                 /* runs before AUTH */
	cmd_fn fn;
} cmds[] = {
	{ "get", 2, 2, false, cmd_get },
	{ "set", 3, -1, false, cmd_set },
	{ "exists", 2, -1, false, cmd_exists },
	{ "del", 2, -1, false, cmd_del },
	{ "unlink", 2, -1, false, cmd_del },
	{ "auth", 2, 3, true, cmd_auth },
	{ "hello", 1, -1, true, cmd_hello },
	{ "quit", 1, -1, true, cmd_quit },
	{ "ping", 1, 2, false, cmd_ping },
	{ "echo", 2, 2, false, cmd_echo },
	{ "select", 2, 2, false, cmd_select },
	{ "client", 2, -1, false, cmd_client },
	{ "info", 1, -1, false, kvt_resp_info },
	{ "command", 1, -1, false, cmd_command },
	{ "dbsize", 1, 1, false, cmd_dbsize },
};

/* "-ERR unknown command 'name'": the name cut and made printable (it goes back into a status line). */
static void unknown(kvt_resp_conn *c, const kvt_resp_arg *a)
{
	char name[64];
	size_t k = a->len < sizeof(name) - 1 ? a->len : sizeof(name) - 1;
	for (size_t i = 0; i < k; i++)
		name[i] = a->p[i] >= 0x20 && a->p[i] < 0x7f ? (char)a->p[i] : ' ';
	name[k] = '\0';
	kvt_resp_out_fmt(&c->out, "-ERR unknown command '%s'\r\n", name);
}

void kvt_resp_cmd_run(kvt_resp_conn *c)
{
	const kvt_resp_arg *a = c->p.argv;
	size_t n = c->p.argc;
	const struct cmd *k = NULL;
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]) && !k; i++)
		if (arg_is(&a[0], cmds[i].name))
			k = &cmds[i];
	if (!k) {
		unknown(c, &a[0]);
		return;
	}
	if (!c->authed && !k->open) {
		atomic_fetch_add(&c->r->auth_failures, 1);
		kvt_resp_out_str(&c->out, "-NOAUTH Authentication required.\r\n");
		return;
	}
	if ((int)n < k->min_args || (k->max_args >= 0 && (int)n > k->max_args)) {
		kvt_resp_out_fmt(&c->out, "-ERR wrong number of arguments for '%s' command\r\n", k->name);
		return;
	}
	k->fn(c, a, n);
}
