/*
 * tests/fuzz_resp.c — libFuzzer target for the Redis-protocol request parser
 * (engine/serve/resp_parse.c): untrusted bytes from any client.
 *
 * The oracle: the input parsed whole and parsed in pieces (sizes from the
 * input's first byte; values read through the direct path where it offers
 * itself, as the listener does) give the same commands, byte for byte, and
 * the same outcome (refused or not, the same reason); every argument is
 * within its limit (SET's value up to max_value, any other up to
 * KVT_KVS_KEY_MAX); a value's buffer is never larger than twice the bytes
 * read into it plus KVT_RESP_VAL_STEP (nothing allocated from a declared
 * length alone). ASan and UBSan catch the rest.
 */
#include "resp_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FR_MAXV (256u << 10)

/* A running fr_digest of the commands seen (FNV-1a over lengths and bytes). */
typedef struct fr_digest {
	uint64_t h;
	size_t n_cmds;
	int rc;              /* the parse's final code (0: all consumed) */
	char err[64];
} fr_digest;

static void fr_mix(fr_digest *d, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		d->h = (d->h ^ b[i]) * 1099511628211ull;
}

static void fr_check_val(const kvt_resp_parser *p)
{
	if (p->val && p->val->cap > 2 * p->val->len + KVT_RESP_VAL_STEP)
		__builtin_trap(); /* a buffer sized from a declared length */
}

static void fr_take(kvt_resp_parser *p, fr_digest *d)
{
	if (p->argc < 1)
		__builtin_trap();
	for (size_t i = 0; i < p->argc; i++) {
		size_t cap = p->is_set && i == 2 ? FR_MAXV : KVT_KVS_KEY_MAX;
		if (p->argv[i].len > cap)
			__builtin_trap();
		fr_mix(d, &p->argv[i].len, sizeof(p->argv[i].len));
		fr_mix(d, p->argv[i].p, p->argv[i].len);
	}
	d->n_cmds++;
	kvt_resp_parser_next(p);
}

/* Feed buf[0..n) in pieces of `step` bytes (0: whole), through the direct path when direct. */
static void fr_run(const uint8_t *buf, size_t n, size_t step, bool direct, fr_digest *d)
{
	kvt_resp_parser p;
	kvt_resp_parser_init(&p, FR_MAXV);
	memset(d, 0, sizeof(*d));
	d->h = 1469598103934665603ull;
	size_t off = 0;
	while (off < n && d->rc == 0) {
		size_t k = step ? step : n - off, room;
		if (k > n - off)
			k = n - off;
		uint8_t *dst = direct ? kvt_resp_direct(&p, &room) : NULL;
		if (dst) {
			k = k < room ? k : room;
			memcpy(dst, buf + off, k);
			kvt_resp_direct_done(&p, k);
			off += k;
			fr_check_val(&p);
			continue;
		}
		size_t end = off + k;
		while (off < end && d->rc == 0) {
			size_t used;
			int rc = kvt_resp_parse(&p, buf + off, end - off, &used);
			off += used;
			fr_check_val(&p);
			if (rc == 1)
				fr_take(&p, d);
			else if (rc < 0)
				d->rc = rc;
		}
	}
	if (d->rc && p.err)
		snprintf(d->err, sizeof(d->err), "%s", p.err);
	kvt_resp_parser_deinit(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t step = (size_t)data[0] % 17 + 1;
	bool direct = data[0] & 0x80;
	fr_digest whole, pieces;
	fr_run(data + 1, size - 1, 0, false, &whole);
	fr_run(data + 1, size - 1, step, direct, &pieces);
	if (whole.h != pieces.h || whole.n_cmds != pieces.n_cmds || whole.rc != pieces.rc ||
	    strcmp(whole.err, pieces.err) != 0)
		__builtin_trap();
	return 0;
}
