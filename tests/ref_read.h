/*
 * tests/ref_read.h — readers for the reference files under tests/ref/ that
 * the model and tokenizer tests share: hex-encoded bytes and lists of token
 * ids, as the generators there write them (no file I/O here; the callers own
 * the lines and their formats), and the two decoders a round trip checks.
 */
#ifndef KVT_TEST_REF_READ_H
#define KVT_TEST_REF_READ_H

#include "kvt.h"
#include "tokenizer.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Decode hex s[0..n) into out; the byte count, or -1 (odd length, a non-hex digit, over cap). */
static inline long ref_unhex(const char *s, size_t n, unsigned char *out, size_t cap)
{
	if (n % 2 || n / 2 > cap)
		return -1;
	for (size_t i = 0; i < n; i += 2) {
		int hi = kvt_hexval(s[i]), lo = kvt_hexval(s[i + 1]);

		if (hi < 0 || lo < 0)
			return -1;
		out[i / 2] = (unsigned char)(hi << 4 | lo);
	}
	return (long)(n / 2);
}

/*
 * Parse space-separated ids from s up to a tab, newline or NUL into ids; the
 * count, or -1 when there are more than cap. *end (when not NULL) gets where
 * it stopped.
 */
static inline int ref_parse_ids(const char *s, int32_t *ids, size_t cap, const char **end)
{
	size_t n = 0;

	while (*s && *s != '\t' && *s != '\n') {
		char *e;
		long v = strtol(s, &e, 10);

		if (e == s)
			break;
		if (n == cap)
			return -1;
		ids[n++] = (int32_t)v;
		s = e;
		while (*s == ' ')
			s++;
	}
	if (end)
		*end = s;
	return (int)n;
}

/* "  label [id id ...]" on stderr, for a mismatch report. */
static inline void ref_print_ids(const char *label, const int32_t *ids, size_t n)
{
	fprintf(stderr, "  %s [", label);
	for (size_t i = 0; i < n; i++)
		fprintf(stderr, "%s%d", i ? " " : "", ids[i]);
	fputs("]\n", stderr);
}

/* Strictly valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static inline bool ref_valid_utf8(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned char b = s[i];
		size_t l = b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 :
			   b >= 0xf0 && b <= 0xf4 ? 4 : 0;

		if (!l || i + l > n)
			return false;
		for (size_t j = 1; j < l; j++)
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
		if ((b == 0xe0 && s[i + 1] < 0xa0) || (b == 0xed && s[i + 1] > 0x9f) ||
		    (b == 0xf0 && s[i + 1] < 0x90) || (b == 0xf4 && s[i + 1] > 0x8f))
			return false;
		i += l;
	}
	return true;
}

/*
 * Decode ids into out with kvt_tok_token_bytes (whole) or the streaming
 * decoder fed one id at a time (stream); the length, or (size_t)-1 on an
 * error or past cap.
 */
static inline size_t ref_decode(const kvt_tok *t, const int32_t *ids, size_t n, bool stream, unsigned char *out,
				size_t cap)
{
	kvt_tok_stream st;
	char buf[1024];
	size_t k = 0, got;

	kvt_tok_stream_init(&st);
	for (size_t i = 0; i < n; i++) {
		const char *b;

		if (stream) {
			if (kvt_tok_stream_push(t, &st, ids[i], buf, sizeof(buf), &got) != KVT_OK)
				return (size_t)-1;
			b = buf;
		} else if (kvt_tok_token_bytes(t, ids[i], &b, &got) != KVT_OK) {
			return (size_t)-1;
		}
		if (k + got > cap)
			return (size_t)-1;
		memcpy(out + k, b, got);
		k += got;
	}
	if (stream) {
		if (kvt_tok_stream_flush(&st, buf, sizeof(buf), &got) != KVT_OK || k + got > cap)
			return (size_t)-1;
		memcpy(out + k, buf, got);
		k += got;
	}
	return k;
}

#endif
