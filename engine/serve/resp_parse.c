/*
 * engine/serve/resp_parse.c — the incremental RESP2 request parser (the
 * contract is in resp_int.h).
 *
 * Design: a state machine fed any split of the input (one byte at a time
 * gives the same commands as the whole stream at once: tests/test_resp_parse.c
 * feeds every split). Nothing is allocated from a declared length alone: an
 * argument in the arena is at most KVT_KVS_KEY_MAX bytes, and SET's value
 * grows by doubling as its bytes arrive (KVT_RESP_VAL_STEP first), so a
 * client that declares 1 GiB and sends nothing costs 64 KiB.
 *
 * Limits (each a protocol error, like Redis's wording where Redis has one):
 * a multibulk count over KVT_RESP_ARGS_MAX ("invalid multibulk length"), a
 * bulk length negative or over its cap ("invalid bulk length"), a header that
 * does not start with '$' ("expected '$', got 'x'"), a bulk not followed by
 * CRLF, a header line without CRLF or over KVT_RESP_HDR_MAX bytes, the
 * arguments over KVT_RESP_ARENA_MAX bytes, an inline line over
 * KVT_RESP_INLINE_MAX or holding a control byte. A count of 0 or less is an
 * empty command and skipped (as Redis does).
 */
#include "resp_int.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

void kvt_resp_parser_init(kvt_resp_parser *p, uint64_t max_value)
{
	memset(p, 0, sizeof(*p));
	p->max_value = max_value ? max_value : KVT_KVS_MAX_VALUE_DEFAULT;
}

void kvt_resp_parser_deinit(kvt_resp_parser *p)
{
	kvt_kvs_val_unref(p->val);
	free(p->arena);
	free(p->arg_off);
	free(p->arg_len);
	free(p->argv);
	memset(p, 0, sizeof(*p));
}

void kvt_resp_parser_next(kvt_resp_parser *p)
{
	kvt_kvs_val_unref(p->val);
	p->val = NULL;
	if (p->arena_cap > (1u << 20)) { /* a large command's arena is not kept for the next */
		free(p->arena);
		p->arena = NULL;
		p->arena_cap = 0;
	}
	p->arena_len = 0;
	p->n_got = 0;
	p->n_args = 0;
	p->argc = 0;
	p->n_line = 0;
	p->is_set = false;
	p->in_val = false;
	p->state = RP_START;
}

static int fail(kvt_resp_parser *p, const char *why)
{
	p->err = why;
	return KVT_EINVAL;
}

/* Room for n more arena bytes (and a NUL). */
static int arena_reserve(kvt_resp_parser *p, size_t n)
{
	if (p->arena_len + n + 1 > KVT_RESP_ARENA_MAX)
		return fail(p, "Protocol error: command too large");
	if (p->arena_len + n + 1 <= p->arena_cap)
		return KVT_OK;
	size_t cap = p->arena_cap ? p->arena_cap : 4096;
	while (cap < p->arena_len + n + 1)
		cap *= 2;
	uint8_t *a = realloc(p->arena, cap);
	if (!a)
		return KVT_ENOMEM;
	p->arena = a;
	p->arena_cap = cap;
	return KVT_OK;
}

/* Room for argument n_got. */
static int args_reserve(kvt_resp_parser *p)
{
	if (p->n_got < p->arg_cap)
		return KVT_OK;
	size_t cap = p->arg_cap ? p->arg_cap * 2 : 8;
	size_t *o = realloc(p->arg_off, cap * sizeof(*o));
	if (!o)
		return KVT_ENOMEM;
	p->arg_off = o;
	size_t *l = realloc(p->arg_len, cap * sizeof(*l));
	if (!l)
		return KVT_ENOMEM;
	p->arg_len = l;
	p->arg_cap = cap;
	return KVT_OK;
}

/* Parse a header line's number: an optional '-' and 1..18 digits, nothing else. */
static bool parse_ll(const char *s, int64_t *out)
{
	bool neg = *s == '-';
	s += neg;
	if (!*s || strlen(s) > 18)
		return false;
	int64_t v = 0;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		v = v * 10 + (*s - '0');
	}
	*out = neg ? -v : v;
	return true;
}

/* Accumulate a header line up to CRLF: 1 complete (line NUL-terminated, CRLF cut), 0 more needed, < 0 error. */
static int take_line(kvt_resp_parser *p, const uint8_t *buf, size_t n, size_t *off, const char *why)
{
	while (*off < n) {
		uint8_t b = buf[(*off)++];
		if (b == '\n') {
			if (p->n_line < 2 || p->line[p->n_line - 1] != '\r')
				return fail(p, why);
			p->line[p->n_line - 1] = '\0';
			p->n_line = 0;
			return 1;
		}
		if (p->n_line >= KVT_RESP_HDR_MAX)
			return fail(p, why);
		p->line[p->n_line++] = (char)b;
	}
	return 0;
}

/* The command is complete: argv from the arena and the value. */
static int finish(kvt_resp_parser *p)
{
	if (p->argv_cap < p->n_got) {
		kvt_resp_arg *a = realloc(p->argv, p->n_got * sizeof(*a));
		if (!a)
			return KVT_ENOMEM;
		p->argv = a;
		p->argv_cap = p->n_got;
	}
	for (size_t i = 0; i < p->n_got; i++) {
		if (p->arg_off[i] == (size_t)-1)
			p->argv[i] = (kvt_resp_arg){ p->val->data, p->val->len };
		else
			p->argv[i] = (kvt_resp_arg){ p->arena + p->arg_off[i], p->arg_len[i] };
	}
	p->argc = p->n_got;
	return 1;
}

/* "*N\r\n" read: the command's argument count. */
static int on_count(kvt_resp_parser *p)
{
	int64_t ll;
	if (!parse_ll(p->line + 1, &ll) || ll > (int64_t)KVT_RESP_ARGS_MAX)
		return fail(p, "Protocol error: invalid multibulk length");
	if (ll <= 0) { /* an empty command: skipped */
		p->state = RP_START;
		return 0;
	}
	p->n_args = ll;
	p->state = RP_BULKHDR;
	return 0;
}

/* "$N\r\n" read: where the bulk's bytes go. */
static int on_bulk_header(kvt_resp_parser *p)
{
	int64_t ll;
	p->in_val = p->is_set && p->n_got == 2;
	uint64_t cap = p->in_val ? p->max_value : KVT_KVS_KEY_MAX;
	if (!parse_ll(p->line + 1, &ll) || ll < 0 || (uint64_t)ll > cap)
		return fail(p, "Protocol error: invalid bulk length");
	int rc = args_reserve(p);
	if (rc < 0)
		return rc;
	p->bulk_len = (uint64_t)ll;
	p->bulk_got = 0;
	if (p->in_val) {
		size_t first = p->bulk_len < KVT_RESP_VAL_STEP ? (size_t)p->bulk_len : KVT_RESP_VAL_STEP;
		p->val = kvt_kvs_val_new(first ? first : 1);
		if (!p->val)
			return KVT_ENOMEM;
		p->arg_off[p->n_got] = (size_t)-1;
	} else {
		rc = arena_reserve(p, (size_t)p->bulk_len);
		if (rc < 0)
			return rc;
		p->arg_off[p->n_got] = p->arena_len;
	}
	p->arg_len[p->n_got] = (size_t)p->bulk_len;
	p->state = p->bulk_len ? RP_BULK : RP_BULK_CRLF;
	p->n_crlf = 0;
	return 0;
}

/* Make room in the value for more bytes (doubling, at most its declared length): bytes free at val->data + len. */
static int val_room(kvt_resp_parser *p, size_t *room)
{
	kvt_kvs_val *v = p->val;
	if (v->cap == v->len) {
		uint64_t want = (uint64_t)v->cap * 2;
		if (want < v->cap + KVT_RESP_VAL_STEP)
			want = v->cap + KVT_RESP_VAL_STEP;
		if (want > p->bulk_len)
			want = p->bulk_len;
		if (kvt_kvs_val_reserve(v, (size_t)want) != KVT_OK)
			return KVT_ENOMEM;
	}
	uint64_t left = p->bulk_len - p->bulk_got;
	*room = v->cap - v->len < left ? v->cap - v->len : (size_t)left;
	return KVT_OK;
}

/* Bulk bytes: into the value or the arena. */
static int take_bulk(kvt_resp_parser *p, const uint8_t *buf, size_t n, size_t *off)
{
	while (*off < n && p->bulk_got < p->bulk_len) {
		size_t k = n - *off, room;
		if (p->in_val) {
			if (val_room(p, &room) < 0)
				return KVT_ENOMEM;
			k = k < room ? k : room;
			memcpy(p->val->data + p->val->len, buf + *off, k);
			p->val->len += k;
		} else {
			uint64_t left = p->bulk_len - p->bulk_got;
			k = k < left ? k : (size_t)left;
			memcpy(p->arena + p->arena_len, buf + *off, k);
			p->arena_len += k;
		}
		p->bulk_got += k;
		*off += k;
	}
	if (p->bulk_got == p->bulk_len)
		p->state = RP_BULK_CRLF;
	return 0;
}

/* The CRLF after a bulk: the argument is complete (and perhaps the command). */
static int take_crlf(kvt_resp_parser *p, const uint8_t *buf, size_t n, size_t *off)
{
	while (*off < n && p->n_crlf < 2) {
		if (buf[*off] != (p->n_crlf ? '\n' : '\r'))
			return fail(p, "Protocol error: expected CRLF after a bulk string");
		(*off)++;
		p->n_crlf++;
	}
	if (p->n_crlf < 2)
		return 0;
	if (!p->in_val)
		p->arena[p->arena_len++] = '\0';
	if (p->n_got == 0)
		p->is_set = p->arg_len[0] == 3 && strncasecmp((const char *)p->arena + p->arg_off[0], "set", 3) == 0;
	p->n_got++;
	p->in_val = false;
	if (p->n_got == (size_t)p->n_args)
		return finish(p);
	p->state = RP_BULKHDR;
	return 0;
}

/* A complete inline line (in the arena, NUL-terminated, CR cut): split at spaces and tabs. */
static int split_inline(kvt_resp_parser *p)
{
	size_t i = 0, end = p->arena_len;
	while (i < end) {
		while (i < end && (p->arena[i] == ' ' || p->arena[i] == '\t'))
			p->arena[i++] = '\0';
		if (i == end)
			break;
		int rc = args_reserve(p);
		if (rc < 0)
			return rc;
		p->arg_off[p->n_got] = i;
		while (i < end && p->arena[i] != ' ' && p->arena[i] != '\t')
			i++;
		p->arg_len[p->n_got] = i - p->arg_off[p->n_got];
		p->n_got++;
	}
	if (p->n_got == 0) { /* a blank line: nothing to run */
		kvt_resp_parser_next(p);
		return 0;
	}
	p->n_args = (int64_t)p->n_got;
	return finish(p);
}

/* Inline bytes up to '\n'. */
static int take_inline(kvt_resp_parser *p, const uint8_t *buf, size_t n, size_t *off)
{
	while (*off < n) {
		uint8_t b = buf[(*off)++];
		if (b == '\n') {
			if (p->arena_len && p->arena[p->arena_len - 1] == '\r')
				p->arena_len--;
			p->arena[p->arena_len] = '\0';
			return split_inline(p);
		}
		if (b < 0x20 && b != '\t' && b != '\r')
			return fail(p, "Protocol error: invalid inline request");
		if (p->arena_len >= KVT_RESP_INLINE_MAX)
			return fail(p, "Protocol error: too big inline request");
		int rc = arena_reserve(p, 1);
		if (rc < 0)
			return rc;
		p->arena[p->arena_len++] = b;
	}
	return 0;
}

/* One step of the state machine from buf[*off]: 1 command complete, 0 go on (or out of bytes), < 0 error. */
static int step(kvt_resp_parser *p, const uint8_t *buf, size_t n, size_t *off)
{
	int rc;
	switch (p->state) {
	case RP_START:
		p->state = buf[*off] == '*' ? RP_COUNT : RP_INLINE;
		return p->state == RP_INLINE ? arena_reserve(p, 1) : 0;
	case RP_COUNT:
		rc = take_line(p, buf, n, off, "Protocol error: invalid multibulk length");
		return rc == 1 ? on_count(p) : rc;
	case RP_BULKHDR:
		if (p->n_line == 0 && buf[*off] != '$') {
			static const char fmt[] = "Protocol error: expected '$', got ' '";
			memcpy(p->err_buf, fmt, sizeof(fmt));
			p->err_buf[sizeof(fmt) - 3] = buf[*off] >= 0x20 && buf[*off] < 0x7f ? (char)buf[*off] : '?';
			return fail(p, p->err_buf);
		}
		rc = take_line(p, buf, n, off, "Protocol error: invalid bulk length");
		return rc == 1 ? on_bulk_header(p) : rc;
	case RP_BULK:
		return take_bulk(p, buf, n, off);
	case RP_BULK_CRLF:
		return take_crlf(p, buf, n, off);
	default:
		return take_inline(p, buf, n, off);
	}
}

int kvt_resp_parse(kvt_resp_parser *p, const uint8_t *buf, size_t n, size_t *used)
{
	size_t off = 0;
	int rc = 0;
	while (off < n && rc == 0)
		rc = step(p, buf, n, &off);
	*used = off;
	return rc;
}

uint8_t *kvt_resp_direct(kvt_resp_parser *p, size_t *room)
{
	if (p->state != RP_BULK || !p->in_val || p->bulk_len - p->bulk_got < KVT_RESP_DIRECT_MIN)
		return NULL;
	if (val_room(p, room) < 0)
		return NULL;
	return p->val->data + p->val->len;
}

void kvt_resp_direct_done(kvt_resp_parser *p, size_t n)
{
	p->val->len += n;
	p->bulk_got += n;
	if (p->bulk_got == p->bulk_len)
		p->state = RP_BULK_CRLF;
}
