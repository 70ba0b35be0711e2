/*
 * engine/serve/serve_int.h — what the files of engine/serve share and no
 * caller outside it sees: the one growable buffer (kvt_sbuf) and the one
 * request-error record (kvt_req_err).
 *
 * Design. Request parsing (request.c), structured outputs (structured.c),
 * cache control (cachectl.c) and the HTTP layer (server.c, reply.c,
 * admin.c) each build text and each refuse bad fields; they do both the same
 * way, so a refusal found three calls deep reaches the 400 unchanged.
 *
 *  - kvt_sbuf: a NUL-terminated byte string that grows by doubling. An
 *    allocation failure sets `failed` and makes every later append a no-op,
 *    so a builder appends freely and checks once at the end.
 *  - kvt_req_err: the OpenAI error object's fields a request error fills
 *    (param, code, message); the HTTP layer adds the status and the type.
 *    A function that refuses a request fills it with kvt_req_fail and
 *    returns KVT_EINVAL; every other failure is a negative KVT_E* with the
 *    record untouched.
 */
#ifndef KVT_SERVE_INT_H
#define KVT_SERVE_INT_H

#include "kvt.h"

#include <stdbool.h>
#include <stddef.h>

/* A growable byte string (text bodies, SSE chunks, grammar text, prompts). */
typedef struct kvt_sbuf {
	char *p;      /* [cap] bytes, NUL-terminated at n; NULL until the first append; malloc'd, the owner frees */
	size_t n;     /* bytes held */
	size_t cap;   /* bytes allocated */
	bool failed;  /* an allocation failed: the content is incomplete */
} kvt_sbuf;

/* Room for `more` bytes and the NUL. False (and b->failed) when it cannot be had. */
bool kvt_sbuf_reserve(kvt_sbuf *b, size_t more);
/* Append n bytes of s (may hold NUL bytes); kvt_sbuf_add(b, "", 0) makes b->p non-NULL. */
void kvt_sbuf_add(kvt_sbuf *b, const char *s, size_t n);
/* Append a C string. */
void kvt_sbuf_puts(kvt_sbuf *b, const char *s);
/* Append formatted text (any length). */
void kvt_sbuf_printf(kvt_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A refused request: the error object's param, code and message ("" = null). */
typedef struct kvt_req_err {
	char param[64];     /* the field at fault, e.g. "messages[2].content" */
	char code[32];      /* a machine-readable code ("" for most 400s) */
	char message[400];  /* what was wrong, naming the field */
} kvt_req_err;

/*
 * Fill e (param may be NULL: no field; code NULL: none) and return
 * KVT_EINVAL, so a refusal reads `return kvt_req_fail(e, "n", NULL, ...)`.
 */
int kvt_req_fail(kvt_req_err *e, const char *param, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif
