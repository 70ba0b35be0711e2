/*
 * engine/serve/serve_int.c — the growable buffer and the request-error
 * record that every file of engine/serve uses (serve_int.h).
 */
#include "serve_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool kvt_sbuf_reserve(kvt_sbuf *b, size_t more)
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

void kvt_sbuf_add(kvt_sbuf *b, const char *s, size_t n)
{
	if (!kvt_sbuf_reserve(b, n))
		return;
	if (n) /* NOTE: s may be NULL when n is 0 (an empty body) */
		memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

void kvt_sbuf_puts(kvt_sbuf *b, const char *s)
{
	kvt_sbuf_add(b, s, strlen(s));
}

void kvt_sbuf_printf(kvt_sbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0) {
		b->failed = true;
		return;
	}
	if (!kvt_sbuf_reserve(b, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->n += (size_t)n;
}

int kvt_req_fail(kvt_req_err *e, const char *param, const char *code, const char *fmt, ...)
{
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	snprintf(e->code, sizeof(e->code), "%s", code ? code : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	return KVT_EINVAL;
}
