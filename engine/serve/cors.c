/*
 * engine/serve/cors.c — server.cors_origins: the list of origins that may
 * make cross-origin requests (server.h, kvt_server_cors_parse).
 *
 * Design: a pure parser with no server state, so the config validation
 * (config.c, and the config fuzzer built from it alone) and the server's
 * start-up check the same rules. How a listed origin is answered (the
 * Access-Control-* headers, the OPTIONS preflight) is the server's
 * (server.c).
 */
#include "server.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* What is wrong with one origin of server.cors_origins (n bytes at o), or NULL. */
static const char *origin_problem(const char *o, size_t n)
{
	if ((n == 1 && o[0] == '*') || (n == 4 && !strncasecmp(o, "null", 4)))
		return "name each origin ('*' and null are not accepted)";
	if (n > KVT_SERVER_ORIGIN_MAX)
		return "longer than 255 bytes";
	size_t i = n >= 7 && !strncasecmp(o, "http://", 7) ? 7 : n >= 8 && !strncasecmp(o, "https://", 8) ? 8 : 0;
	if (!i)
		return "not http:// or https://";
	size_t host = i;
	if (i < n && o[i] == '[') { /* an IPv6 literal */
		size_t a = ++i;
		while (i < n && (isxdigit((unsigned char)o[i]) || o[i] == ':' || o[i] == '.'))
			i++;
		if (i == a || i == n || o[i] != ']')
			return "a bad [IPv6] host";
		i++;
	} else {
		while (i < n && (isalnum((unsigned char)o[i]) || o[i] == '.' || o[i] == '-'))
			i++;
	}
	if (i == host)
		return "no host";
	if (i < n && o[i] == ':') {
		unsigned long port = 0;
		size_t d = ++i;
		while (i < n && isdigit((unsigned char)o[i]) && i - d < 6)
			port = port * 10 + (unsigned long)(o[i++] - '0');
		if (i == d || port == 0 || port > 65535)
			return "a bad port (1-65535)";
	}
	if (i < n)
		return o[i] == '/' ? "has a path or a trailing '/' (an origin is scheme://host[:port])" :
				     "a character outside a host name";
	return NULL;
}

int kvt_server_cors_parse(const char *list, kvt_cors_origins *out, char *why, size_t why_cap)
{
	kvt_cors_origins tmp;
	kvt_cors_origins *c = out ? out : &tmp;
	c->n = 0;
	for (const char *p = list ? list : ""; *p;) {
		while (*p == ',' || *p == ' ' || *p == '\t')
			p++;
		size_t n = strcspn(p, ", \t");
		if (!n)
			break;
		const char *bad = origin_problem(p, n);
		if (!bad && c->n == KVT_SERVER_CORS_MAX)
			bad = "one too many (at most 16 origins)";
		if (bad) {
			snprintf(why, why_cap, "origin \"%.*s\": %s", (int)(n < 64 ? n : 64), p, bad);
			return KVT_EINVAL;
		}
		memcpy(c->origin[c->n], p, n);
		c->origin[c->n++][n] = 0;
		p += n;
	}
	return KVT_OK;
}
