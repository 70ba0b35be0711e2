/* ctest-labels: unit */
/*
 * tests/test_resp_parse.c — the Redis-protocol listener's request parser
 * (engine/serve/resp_parse.c, contract in resp_int.h).
 *
 *  - a stream of commands (multibulk, inline, empty ones, a SET whose value
 *    is 200 KiB, pipelined) gives the same commands whether fed whole, split
 *    in two at every byte, one byte at a time, or through the direct-read
 *    path in random chunk sizes;
 *  - SET's value (argument 2) comes in a kvt_kvs_val; a declared 1 GiB bulk
 *    with nothing after it allocates at most KVT_RESP_VAL_STEP;
 *  - each hostile input (negative or huge bulk length, a bulk over
 *    max_value, a key over KVT_KVS_KEY_MAX, a count over KVT_RESP_ARGS_MAX,
 *    a missing '$', a bulk without CRLF, a header without CRLF, a long or
 *    binary inline line) is refused with its message at every split, and
 *    never yields a command.
 */
#include "check.h"
#include "resp_int.h"

#include <stdlib.h>
#include <string.h>

#define MAXV (1u << 20) /* the parser's max_value here */

/* The commands seen, as "arg|arg|...\n" (a value longer than 32 bytes as "<len:sum>"). */
typedef struct seen {
	char text[8192];
	size_t n;
	int n_cmds;
	bool had_val;  /* a SET's value came in a kvt_kvs_val */
} seen;

static void record(kvt_resp_parser *p, seen *s)
{
	for (size_t i = 0; i < p->argc; i++) {
		const kvt_resp_arg *a = &p->argv[i];
		if (a->len > 32) {
			unsigned long sum = 0;
			for (size_t j = 0; j < a->len; j++)
				sum = sum * 31 + a->p[j];
			s->n += (size_t)snprintf(s->text + s->n, sizeof(s->text) - s->n, "<%zu:%lu>", a->len, sum);
		} else {
			s->n += (size_t)snprintf(s->text + s->n, sizeof(s->text) - s->n, "%.*s", (int)a->len, (const char *)a->p);
		}
		s->n += (size_t)snprintf(s->text + s->n, sizeof(s->text) - s->n, i + 1 < p->argc ? "|" : "\n");
	}
	if (p->val)
		s->had_val = true;
	s->n_cmds++;
	kvt_resp_parser_next(p);
}

/* Feed buf[0..n) as is: 0 or the error code. */
static int feed(kvt_resp_parser *p, const uint8_t *buf, size_t n, seen *s)
{
	size_t off = 0;
	while (off < n) {
		size_t used;
		int rc = kvt_resp_parse(p, buf + off, n - off, &used);
		off += used;
		if (rc < 0)
			return rc;
		if (rc == 1)
			record(p, s);
	}
	return 0;
}

/* Feed the stream cut at the given points (cuts[] ascending, in (0, n)). */
static int feed_cuts(const uint8_t *buf, size_t n, const size_t *cuts, size_t n_cuts, seen *s, const char **err)
{
	kvt_resp_parser p;
	kvt_resp_parser_init(&p, MAXV);
	memset(s, 0, sizeof(*s));
	size_t prev = 0;
	int rc = 0;
	for (size_t i = 0; i <= n_cuts && rc == 0; i++) {
		size_t end = i < n_cuts ? cuts[i] : n;
		rc = feed(&p, buf + prev, end - prev, s);
		prev = end;
	}
	static char why[64]; /* p.err may point into p */
	snprintf(why, sizeof(why), "%s", p.err ? p.err : "");
	*err = p.err ? why : NULL;
	kvt_resp_parser_deinit(&p);
	return rc;
}

/* Feed through the direct-read path where it offers itself, in chunks of pseudo-random sizes. */
static int feed_direct(const uint8_t *buf, size_t n, unsigned seed, seen *s)
{
	kvt_resp_parser p;
	kvt_resp_parser_init(&p, MAXV);
	memset(s, 0, sizeof(*s));
	size_t off = 0;
	int rc = 0;
	while (off < n && rc == 0) {
		seed = seed * 1103515245u + 12345u;
		size_t chunk = 1 + (seed >> 8) % 70000, room;
		if (chunk > n - off)
			chunk = n - off;
		uint8_t *d = kvt_resp_direct(&p, &room);
		if (d) {
			size_t k = chunk < room ? chunk : room;
			memcpy(d, buf + off, k);
			kvt_resp_direct_done(&p, k);
			off += k;
			continue;
		}
		rc = feed(&p, buf + off, chunk, s);
		off += chunk;
	}
	kvt_resp_parser_deinit(&p);
	return rc;
}

static size_t build_stream(uint8_t *buf, size_t cap, size_t big)
{
	size_t n = 0;
	n += (size_t)snprintf((char *)buf + n, cap - n,
			      "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n"
			      "*2\r\n$3\r\nget\r\n$1\r\nk\r\n"
			      "PING\r\n"
			      "*0\r\n"
			      "\r\n"
			      "  echo   a\tb \n"
			      "*-1\r\n"
			      "*1\r\n$4\r\nPING\r\n"
			      "*3\r\n$3\r\nset\r\n$0\r\n\r\n$0\r\n\r\n"
			      "*5\r\n$3\r\nSET\r\n$3\r\nbig\r\n$%zu\r\n",
			      big);
	for (size_t i = 0; i < big; i++)
		buf[n++] = (uint8_t)(i * 7 + 3);
	n += (size_t)snprintf((char *)buf + n, cap - n, "\r\n$2\r\nEX\r\n$2\r\n10\r\n*2\r\n$6\r\nEXISTS\r\n$3\r\nbig\r\n");
	return n;
}

static void test_stream(void)
{
	size_t big = 200u << 10, cap = big + 4096;
	uint8_t *buf = malloc(cap);
	size_t n = build_stream(buf, cap, big);
	seen whole, s;
	const char *err;
	CHECK(feed_cuts(buf, n, NULL, 0, &whole, &err) == 0);
	CHECK_EQ_INT(whole.n_cmds, 8);
	CHECK(whole.had_val);
	CHECKF(!strncmp(whole.text, "SET|k|hello\nget|k\nPING\necho|a|b\nPING\nset||\nSET|big|<", 46), "%s", whole.text);
	CHECK(strstr(whole.text, "|EX|10\nEXISTS|big\n") != NULL);
	/* two pieces, cut at every byte of the small commands and every 997th of the value */
	int bad = 0;
	for (size_t cut = 1; cut < n; cut += cut < 400 || cut > n - 400 ? 1 : 997) {
		if (feed_cuts(buf, n, &cut, 1, &s, &err) != 0 || strcmp(s.text, whole.text))
			bad++;
	}
	CHECK_EQ_INT(bad, 0);
	/* one byte at a time (the small commands; the value too) */
	size_t *cuts = malloc(n * sizeof(*cuts));
	for (size_t i = 0; i + 1 < n; i++)
		cuts[i] = i + 1;
	CHECK(feed_cuts(buf, n, cuts, n - 1, &s, &err) == 0);
	CHECK(!strcmp(s.text, whole.text));
	free(cuts);
	for (unsigned seed = 1; seed <= 20; seed++) {
		CHECK(feed_direct(buf, n, seed, &s) == 0);
		CHECK(!strcmp(s.text, whole.text));
	}
	free(buf);
}

/* A client that declares 1 GiB and sends a few bytes: the value's buffer stays small. */
static void test_no_upfront_alloc(void)
{
	kvt_resp_parser p;
	kvt_resp_parser_init(&p, 2ull << 30);
	static const char in[] = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1073741824\r\nabcdef";
	size_t used;
	CHECK(kvt_resp_parse(&p, (const uint8_t *)in, sizeof(in) - 1, &used) == 0);
	CHECK(used == sizeof(in) - 1);
	CHECK(p.val != NULL);
	CHECKF(p.val && p.val->cap <= KVT_RESP_VAL_STEP, "cap %zu", p.val ? p.val->cap : 0);
	size_t room;
	uint8_t *d = kvt_resp_direct(&p, &room);
	CHECK(d != NULL && room <= KVT_RESP_VAL_STEP);
	kvt_resp_parser_deinit(&p);
}

/* Each hostile input: refused with its message at every split, no command from it. */
static void hostile(const char *in, size_t n, const char *want, int cmds_before)
{
	seen s;
	const char *err;
	int bad = 0;
	for (size_t cut = 0; cut < n; cut++) {
		int rc = feed_cuts((const uint8_t *)in, n, &cut, cut ? 1 : 0, &s, &err);
		if (rc != KVT_EINVAL || !err || !strstr(err, want) || s.n_cmds != cmds_before) {
			if (!bad)
				fprintf(stderr, "hostile %.20s cut %zu: rc %d err %s cmds %d\n", in, cut, rc, err ? err : "-",
					s.n_cmds);
			bad++;
		}
	}
	CHECKF(bad == 0, "%s", want);
}

static void test_hostile(void)
{
#define H(lit, want, before) hostile(lit, sizeof(lit) - 1, want, before)
	H("*1\r\n$-5\r\n", "invalid bulk length", 0);
	H("*1\r\n$99999999999999999999\r\n", "invalid bulk length", 0);
	H("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1048577\r\n", "invalid bulk length", 0); /* over max_value (1 MiB) */
	H("*2\r\n$3\r\nGET\r\n$65537\r\n", "invalid bulk length", 0);             /* a key over KVT_KVS_KEY_MAX */
	H("*3\r\n$3\r\nDEL\r\n$1\r\nk\r\n$70000\r\n", "invalid bulk length", 0);
	H("*1048577\r\n", "invalid multibulk length", 0);
	H("*x\r\n", "invalid multibulk length", 0);
	H("*1\r\n+PING\r\n", "expected '$', got '+'", 0);
	H("*1\r\n$4\r\nPINGxx", "expected CRLF", 0);
	H("*1\r\n$4\n", "invalid bulk length", 0);
	H("*1\r\n$12345678901234567890123456\r\n", "invalid bulk length", 0);
	H("PING\r\n\x01\x02garbage\r\n", "invalid inline request", 1);
	H("*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$-1\r\n", "invalid bulk length", 1);
#undef H
	size_t n = KVT_RESP_INLINE_MAX + 10;
	char *longline = malloc(n);
	memset(longline, 'a', n);
	seen s;
	const char *err;
	CHECK(feed_cuts((const uint8_t *)longline, n, NULL, 0, &s, &err) == KVT_EINVAL);
	CHECK(err && strstr(err, "too big inline request"));
	free(longline);
}

/* A partial value is never a command: a SET cut short leaves nothing complete. */
static void test_partial(void)
{
	static const char in[] = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\n01234";
	seen s;
	const char *err;
	CHECK(feed_cuts((const uint8_t *)in, sizeof(in) - 1, NULL, 0, &s, &err) == 0);
	CHECK_EQ_INT(s.n_cmds, 0);
}

int main(void)
{
	test_stream();
	test_no_upfront_alloc();
	test_hostile();
	test_partial();
	return check_done("test_resp_parse");
}
