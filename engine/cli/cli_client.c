/*
 * engine/cli/cli_client.c — `kvtier resume`, `kvtier stats` and `kvtier sessions`
 * (engine/cli/cli_client.h): HTTP requests to kvtierd through libcurl, JSON
 * through jansson, and `stats --offline`, which reads a data directory's
 * index instead of asking a daemon.
 *
 * Design: one request helper (http_call) does every exchange and maps each
 * failure to one sysexits code and one stderr line naming the URL and the
 * cause; the commands only parse arguments and render JSON. The offline
 * report is built as the same JSON document /v1/stats returns (plus
 * "offline": true and the per-namespace detail), so one renderer prints both.
 *
 * Invariants: stdout carries data only; with --json it is the daemon's bytes
 * exactly as received (or the offline document). Responses are bounded
 * (RESP_MAX) before they are parsed. A session id must pass kvt_name_valid
 * before it goes into a URL, so it needs no escaping.
 */
#define _GNU_SOURCE
#include "cli_client.h"
#include "cli_index.h"
#include "config.h"
#include "index.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#define RESP_MAX (64u << 20) /* largest response body accepted */
#define URL_MAX 2048

/* ---- common options ------------------------------------------------------------------ */

typedef struct client_opts {
	const char *url;        /* --url, or NULL */
	const char *api_key;    /* --api-key, or $KVTIER_API_KEY, or NULL */
	const char *conf;       /* -c FILE, or NULL */
	bool json;              /* --json */
	char base[URL_MAX];     /* the daemon's base URL, no trailing '/' (resolve_url) */
} client_opts;

/*
 * Try argv[*i] as a common option; true if it was one (consumed, with its
 * value). *bad is set (and a message printed) when it lacks its value.
 */
static bool common_opt(const char *cmd, int argc, char **argv, int *i, client_opts *o, bool *bad)
{
	const char *a = argv[*i];
	const char **dst = NULL;
	if (!strcmp(a, "--json")) {
		o->json = true;
		return true;
	}
	if (!strcmp(a, "--url"))
		dst = &o->url;
	else if (!strcmp(a, "--api-key"))
		dst = &o->api_key;
	else if (!strcmp(a, "-c") || !strcmp(a, "--config"))
		dst = &o->conf;
	else
		return false;
	if (*i + 1 >= argc || !argv[*i + 1][0]) {
		fprintf(stderr, "kvtier %s: %s needs a value\n", cmd, a);
		*bad = true;
		return true;
	}
	*dst = argv[++*i];
	return true;
}

/* The base URL: --url, else http://LISTEN of the configuration. 0 or a sysexits code (printed). */
static int resolve_url(const char *cmd, client_opts *o)
{
	if (!o->api_key) {
		const char *env = getenv("KVTIER_API_KEY");
		if (env && env[0])
			o->api_key = env;
	}
	if (o->url) {
		size_t n = strlen(o->url);
		if (strncmp(o->url, "http://", 7) != 0 && strncmp(o->url, "https://", 8) != 0) {
			fprintf(stderr, "kvtier %s: --url '%s' must start with http:// or https://\n", cmd, o->url);
			return EX_USAGE;
		}
		while (n > 0 && o->url[n - 1] == '/')
			n--;
		if (n >= sizeof(o->base)) {
			fprintf(stderr, "kvtier %s: --url is too long\n", cmd);
			return EX_USAGE;
		}
		memcpy(o->base, o->url, n);
		o->base[n] = '\0';
		return 0;
	}
	kvt_config *c = malloc(sizeof(*c));
	if (!c) {
		fprintf(stderr, "kvtier %s: out of memory\n", cmd);
		return EX_OSERR;
	}
	kvt_config_default(c);
	const char *path = kvt_config_find(o->conf);
	if (path) {
		char err[1024];
		int rc = kvt_config_load(c, path, err, sizeof(err));
		if (rc != KVT_OK) {
			fprintf(stderr, "kvtier %s: %s\n", cmd, err);
			free(c);
			return EX_CONFIG;
		}
	}
	if (c->listen_port == 0) {
		fprintf(stderr, "kvtier %s: %s listens on an ephemeral port (listen = ...:0); pass --url\n", cmd,
			path ? path : "the configuration");
		free(c);
		return EX_USAGE;
	}
	/* A wildcard address is reached through loopback. */
	const char *host = c->listen_host;
	if (!strcmp(host, "0.0.0.0"))
		host = "127.0.0.1";
	else if (!strcmp(host, "::"))
		host = "::1";
	if (strchr(host, ':'))
		snprintf(o->base, sizeof(o->base), "http://[%s]:%u", host, c->listen_port);
	else
		snprintf(o->base, sizeof(o->base), "http://%s:%u", host, c->listen_port);
	free(c);
	return 0;
}

/* ---- one HTTP exchange --------------------------------------------------------------- */

typedef struct http_resp {
	char *body;        /* the response body (NUL-terminated), malloc'd */
	size_t n, cap;     /* bytes held, allocated */
	long status;       /* HTTP status */
	bool too_big;      /* the body passed RESP_MAX: the transfer was stopped */
	/* streaming: called for each complete line while the status is 200 */
	int (*on_line)(void *user, const char *line, size_t len);
	void *user;
	size_t line_start; /* offset of the first byte not yet handed to on_line */
	CURL *curl;        /* for the status inside the callback */
} http_resp;

static size_t on_data(char *p, size_t size, size_t nmemb, void *arg)
{
	http_resp *r = arg;
	size_t n = size * nmemb;
	if (r->n + n + 1 > RESP_MAX) {
		r->too_big = true;
		return 0; /* stops the transfer */
	}
	if (r->n + n + 1 > r->cap) {
		size_t cap = r->cap ? r->cap : 4096;
		while (cap < r->n + n + 1)
			cap *= 2;
		char *b = realloc(r->body, cap);
		if (!b)
			return 0;
		r->body = b;
		r->cap = cap;
	}
	memcpy(r->body + r->n, p, n);
	r->n += n;
	r->body[r->n] = '\0';
	if (r->on_line) {
		long st = 0;
		curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &st);
		if (st == 200) {
			char *nl;
			while ((nl = memchr(r->body + r->line_start, '\n', r->n - r->line_start)) != NULL) {
				size_t len = (size_t)(nl - (r->body + r->line_start));
				if (r->on_line(r->user, r->body + r->line_start, len) != 0)
					return 0;
				r->line_start += len + 1;
			}
		}
	}
	return n;
}

/* The daemon's error message from an error body ({"error": {"message": ...}}), or the raw text. */
static void error_message(const http_resp *r, char *out, size_t cap)
{
	json_t *j = r->body ? json_loadb(r->body, r->n, 0, NULL) : NULL;
	const char *m = j ? json_string_value(json_object_get(json_object_get(j, "error"), "message")) : NULL;
	if (!m && j)
		m = json_string_value(json_object_get(j, "status"));
	if (m)
		snprintf(out, cap, "%s", m);
	else if (r->body && r->n)
		snprintf(out, cap, "%.200s", r->body);
	else
		snprintf(out, cap, "no message");
	for (char *p = out; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	json_decref(j);
}

typedef struct http_req {
	const char *cmd;    /* "stats", ... for messages */
	const char *method; /* "GET" or "POST" */
	const char *path;   /* "/v1/stats" */
	const char *body;   /* POST body or NULL */
	double timeout_s;   /* whole transfer (0 = none) */
	bool resume;        /* 404 means an unknown session */
	const char *what;   /* the session id, for resume's 404 message */
} http_req;

static bool g_curl_ready;

/*
 * Do one request. On a 200 the body is in r (and, streaming, was handed to
 * on_line); returns 0. Otherwise prints one line and returns the exit code.
 */
static int http_call(const client_opts *o, const http_req *q, http_resp *r)
{
	char url[URL_MAX + 256], errbuf[CURL_ERROR_SIZE], auth[320];
	struct curl_slist *hdr = NULL;
	CURLcode cc;
	int ret = 0;

	if (!g_curl_ready) {
		if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
			fprintf(stderr, "kvtier %s: libcurl failed to initialise\n", q->cmd);
			return EX_SOFTWARE;
		}
		g_curl_ready = true;
	}
	snprintf(url, sizeof(url), "%s%s", o->base, q->path);
	CURL *c = curl_easy_init();
	if (!c) {
		fprintf(stderr, "kvtier %s: libcurl failed to initialise\n", q->cmd);
		return EX_SOFTWARE;
	}
	r->curl = c;
	errbuf[0] = '\0';
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
	if (q->timeout_s > 0)
		curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(q->timeout_s * 1000));
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(c, CURLOPT_USERAGENT, "kvtier-cli");
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
	if (o->api_key) {
		snprintf(auth, sizeof(auth), "Authorization: Bearer %.256s", o->api_key);
		hdr = curl_slist_append(hdr, auth);
	}
	if (q->body) {
		hdr = curl_slist_append(hdr, "Content-Type: application/json");
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, q->body);
	}
	if (!strcmp(q->method, "POST") && !q->body)
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
	hdr = curl_slist_append(hdr, "Accept: application/json, application/x-ndjson");
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);

	cc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	if (cc != CURLE_OK && !(cc == CURLE_WRITE_ERROR && r->status != 0)) {
		long os_errno = 0;
		curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &os_errno);
		const char *why = os_errno ? strerror((int)os_errno) : errbuf[0] ? errbuf : curl_easy_strerror(cc);
		if (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_OPERATION_TIMEDOUT ||
		    cc == CURLE_GOT_NOTHING || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR) {
			if (r->status == 0)
				fprintf(stderr, "kvtier %s: cannot reach the daemon at %s (%s); is kvtierd running?\n",
					q->cmd, o->base, why);
			else
				fprintf(stderr, "kvtier %s: the connection to %s broke during %s %s (%s)\n", q->cmd,
					o->base, q->method, q->path, why);
			ret = EX_UNAVAILABLE;
		} else {
			fprintf(stderr, "kvtier %s: %s %s failed: %s\n", q->cmd, q->method, url,
				errbuf[0] ? errbuf : curl_easy_strerror(cc));
			ret = EX_UNAVAILABLE;
		}
		goto out;
	}
	if (r->too_big) {
		fprintf(stderr, "kvtier %s: the response to %s %s exceeds %u MiB\n", q->cmd, q->method, url,
			RESP_MAX >> 20);
		ret = EX_DATAERR;
		goto out;
	}
	if (cc == CURLE_WRITE_ERROR && r->status == 200) {
		ret = EX_DATAERR; /* on_line refused a line: it printed why */
		goto out;
	}
	if (r->status != 200) {
		char msg[512];
		error_message(r, msg, sizeof(msg));
		if (r->status == 401) {
			fprintf(stderr, "kvtier %s: %s refused the API key (401: %s); pass --api-key or set KVTIER_API_KEY\n",
				q->cmd, o->base, msg);
			ret = EX_NOPERM;
		} else if (r->status == 404 && q->resume) {
			fprintf(stderr, "kvtier %s: unknown session '%s' (404: %s)\n", q->cmd, q->what, msg);
			ret = EX_NOINPUT;
		} else if (r->status == 404) {
			fprintf(stderr, "kvtier %s: %s answered 404 for %s %s (%s); is it a kvtierd?\n", q->cmd, o->base,
				q->method, q->path, msg);
			ret = EX_UNAVAILABLE;
		} else if (r->status == 503) {
			fprintf(stderr, "kvtier %s: the daemon at %s is unavailable (503: %s)\n", q->cmd, o->base, msg);
			ret = EX_UNAVAILABLE;
		} else {
			fprintf(stderr, "kvtier %s: %s %s failed with HTTP %ld: %s\n", q->cmd, q->method, url, r->status,
				msg);
			ret = EX_SOFTWARE;
		}
		goto out;
	}
out:
	curl_slist_free_all(hdr);
	curl_easy_cleanup(c);
	r->curl = NULL;
	return ret;
}

static void resp_free(http_resp *r)
{
	free(r->body);
	memset(r, 0, sizeof(*r));
}

/* ---- rendering helpers ------------------------------------------------------------------ */

static double num(const json_t *o, const char *key)
{
	return json_number_value(json_object_get(o, key)); /* 0 when absent or not a number */
}

/* "why prompts missed": engine.misses_by_reason (usage.kvtier.miss), the reasons seen, in reason order. */
static void print_misses(const json_t *m)
{
	if (!json_is_object(m))
		return;
	const char *key;
	json_t *v;
	char line[512] = "";
	size_t n = 0;
	double total = 0;
	json_object_foreach((json_t *)m, key, v)
		total += json_number_value(v);
	json_object_foreach((json_t *)m, key, v)
		if (json_number_value(v) > 0 && n < sizeof(line))
			n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%s %.0f", n ? ", " : "", key, json_number_value(v));
	printf("  %-24s %.0f prompts%s%s\n", "cache misses", total, n ? ": " : "", line);
}

static void fmt_bytes(double b, char *out, size_t cap)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	int u = 0;
	while (b >= 1024 && u < 5) {
		b /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(out, cap, "%.0f B", b);
	else
		snprintf(out, cap, "%.2f %s", b, units[u]);
}

static void fmt_count(double v, char *out, size_t cap)
{
	snprintf(out, cap, "%.0f", v);
}

static void fmt_duration(double s, char *out, size_t cap)
{
	long t = (long)s;
	if (s < 60)
		snprintf(out, cap, "%.0fs", s);
	else if (s < 3600)
		snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
	else if (s < 86400)
		snprintf(out, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
	else
		snprintf(out, cap, "%ldd%02ldh", t / 86400, (t / 3600) % 24);
}

/* ---- stats ------------------------------------------------------------------------------- */

/* Print one row of the tier table: label, then one cell per tier. */
static void tier_row(const char *label, json_t *const t[3], void (*cell)(const json_t *tier, char *out, size_t cap))
{
	printf("  %-20s", label);
	for (int i = 0; i < 3; i++) {
		char buf[96] = "-";
		if (t[i])
			cell(t[i], buf, sizeof(buf));
		printf(" %22s", buf);
	}
	printf("\n");
}

static void c_capacity(const json_t *t, char *o, size_t n) { fmt_bytes(num(t, "capacity_bytes"), o, n); }
static void c_used(const json_t *t, char *o, size_t n)
{
	char b[48];
	double cap = num(t, "capacity_bytes"), used = num(t, "used_bytes");
	fmt_bytes(used, b, sizeof(b));
	if (cap > 0)
		snprintf(o, n, "%s (%.0f%%)", b, 100 * used / cap);
	else
		snprintf(o, n, "%s", b);
}
static void c_blocks(const json_t *t, char *o, size_t n)
{
	if (num(t, "capacity_blocks") > 0)
		snprintf(o, n, "%.0f / %.0f", num(t, "blocks"), num(t, "capacity_blocks"));
	else
		fmt_count(num(t, "blocks"), o, n);
}
static void c_hit(const json_t *t, char *o, size_t n)
{
	snprintf(o, n, "%.1f%% of %.0f", 100 * num(t, "hit_rate"), num(t, "hits") + num(t, "misses"));
}
static void move_cell(const json_t *t, const char *what, char *o, size_t n)
{
	char k1[48], k2[48], b[48];
	snprintf(k1, sizeof(k1), "%s_bytes", what);
	snprintf(k2, sizeof(k2), "%s_mb_s", what);
	char k0[48];
	snprintf(k0, sizeof(k0), "%ss", what);
	fmt_bytes(num(t, k1), b, sizeof(b));
	snprintf(o, n, "%.0f, %s", num(t, k0), b);
}
static void c_prom(const json_t *t, char *o, size_t n) { move_cell(t, "promotion", o, n); }
static void c_dem(const json_t *t, char *o, size_t n) { move_cell(t, "demotion", o, n); }
static void c_prom_rate(const json_t *t, char *o, size_t n) { snprintf(o, n, "%.1f MB/s", num(t, "promotion_mb_s")); }
static void c_dem_rate(const json_t *t, char *o, size_t n) { snprintf(o, n, "%.1f MB/s", num(t, "demotion_mb_s")); }
static void c_evict(const json_t *t, char *o, size_t n)
{
	snprintf(o, n, "%.0f (+%.0f dropped)", num(t, "evictions"), num(t, "dropped"));
}
static void c_chunks(const json_t *t, char *o, size_t n)
{
	double c = num(t, "chunk_blocks"), all = c + num(t, "prefix_blocks");
	if (!json_object_get(t, "chunk_blocks")) {
		snprintf(o, n, "-");
		return;
	}
	snprintf(o, n, "%.0f of %.0f (%.0f%%)", c, all, all > 0 ? 100 * c / all : 0.0);
}
static void c_evict_kind(const json_t *t, char *o, size_t n)
{
	json_t *k = json_object_get(t, "evictions_by_kind");
	snprintf(o, n, "%.0f / %.0f", num(k, "prefix"), num(k, "chunk"));
}
static void c_comp(const json_t *t, char *o, size_t n)
{
	double r = num(t, "compression_ratio");
	snprintf(o, n, "%.2fx", r > 0 ? r : 1.0);
}
static void c_dtype(const json_t *t, char *o, size_t n)
{
	const char *s = json_string_value(json_object_get(t, "dtype"));
	snprintf(o, n, "%s", s && s[0] ? s : "-");
}
static void c_corrupt(const json_t *t, char *o, size_t n) { fmt_count(num(t, "corrupt"), o, n); }
static void c_degraded(const json_t *t, char *o, size_t n)
{
	snprintf(o, n, "%s", json_is_true(json_object_get(t, "degraded")) ? "YES" : "no");
}

static bool g_stats_tenants; /* --tenants: the retention table per tenant */

/* The retention lines of a report: in all and, with --tenants (or a tenant's own view), per tenant. */
static void render_retention(json_t *ret, bool tenants)
{
	if (!json_is_object(ret))
		return;
	json_t *tiers = json_object_get(ret, "tiers"), *ts = json_object_get(ret, "tenants");
	if (json_is_array(tiers) && json_array_size(tiers)) {
		char b[48];
		fmt_bytes(num(ret, "bytes"), b, sizeof(b));
		printf("\n  retention: %.0f blocks, %s (as quotas count them); by floor tier:", num(ret, "blocks"), b);
		for (size_t i = 0; i < json_array_size(tiers); i++) {
			json_t *t = json_array_get(tiers, i);
			printf(" %s %.0f", json_string_value(json_object_get(t, "name")), num(t, "floor_blocks"));
		}
		printf("\n");
	}
	if (!tenants || !json_is_array(ts))
		return;
	printf("\n  %-24s %8s %12s %12s %8s %8s %9s %8s %9s %8s\n", "tenant", "blocks", "retained", "quota", "granted",
	       "denied", "released", "expired", "quota-out", "hits");
	for (size_t i = 0; i < json_array_size(ts); i++) {
		json_t *t = json_array_get(ts, i);
		char b[48], q[48];
		fmt_bytes(num(t, "bytes"), b, sizeof(b));
		if (num(t, "quota_bytes") > 0)
			fmt_bytes(num(t, "quota_bytes"), q, sizeof(q));
		else
			snprintf(q, sizeof(q), "none");
		printf("  %-24.24s %8.0f %12s %12s %8.0f %8.0f %9.0f %8.0f %9.0f %8.0f\n",
		       json_string_value(json_object_get(t, "tenant")), num(t, "blocks"), b, q, num(t, "granted_blocks"),
		       num(t, "denied_blocks"), num(t, "released"), num(t, "expired"), num(t, "quota_released"),
		       num(t, "hits"));
	}
	if (!json_array_size(ts))
		printf("  (no tenant holds or has held retention)\n");
}

static void c_retained(const json_t *t, char *o, size_t n)
{
	char b[48];
	fmt_bytes(num(t, "bytes"), b, sizeof(b));
	snprintf(o, n, "%.0f, %s", num(t, "blocks"), b);
}

/* Render a /v1/stats document (or the offline one). EX_DATAERR (printed) when it is not one. */
/*
 * The key-value store ([store], the Redis-protocol listener): its totals,
 * one line per tenant (a tenant key's view holds its own row only) and the
 * listener's counters. Nothing when the daemon runs no store.
 */
static void render_store(const json_t *st)
{
	if (!json_is_object(st))
		return;
	json_t *tot = json_object_get(st, "total"), *rows = json_object_get(st, "tenants");
	json_t *ls = json_object_get(st, "listener");
	char ram[48], ramcap[48], nv[48], nvcap[48];
	printf("\n  store (Redis protocol)\n");
	if (json_is_object(tot)) {
		fmt_bytes(num(tot, "ram_bytes"), ram, sizeof(ram));
		fmt_bytes(num(st, "ram_capacity"), ramcap, sizeof(ramcap));
		fmt_bytes(num(st, "nvme_used"), nv, sizeof(nv));
		fmt_bytes(num(st, "nvme_capacity"), nvcap, sizeof(nvcap));
		printf("  %-24s %.0f keys; RAM %s of %s, NVMe %s of %s; %.0f writes pending, %.0f failed, %.0f corrupt\n",
		       "total", num(tot, "keys"), ram, ramcap, nv, nvcap, num(st, "writes_pending"), num(st, "write_errors"),
		       num(st, "corrupt"));
	}
	for (size_t i = 0; i < json_array_size(rows); i++) {
		json_t *x = json_array_get(rows, i);
		char b[48], label[80];
		fmt_bytes(num(x, "bytes"), b, sizeof(b));
		snprintf(label, sizeof(label), "tenant %s", json_string_value(json_object_get(x, "tenant")));
		printf("  %-24s %.0f keys (%s); GET %.0f hits (RAM %.0f, NVMe %.0f), %.0f misses; %.0f SET, %.0f DEL; "
		       "%.0f evicted, %.0f expired\n",
		       label, num(x, "keys"), b, num(x, "hits_ram") + num(x, "hits_nvme"), num(x, "hits_ram"),
		       num(x, "hits_nvme"), num(x, "misses"), num(x, "sets"), num(x, "dels"), num(x, "evicted"),
		       num(x, "expired"));
	}
	if (json_is_object(ls)) {
		char bi[48], bo[48];
		fmt_bytes(num(ls, "bytes_in"), bi, sizeof(bi));
		fmt_bytes(num(ls, "bytes_out"), bo, sizeof(bo));
		printf("  %-24s %.0f open (%.0f accepted, %.0f refused); %.0f commands; %s in, %s out; %.0f protocol "
		       "errors, %.0f auth failures\n",
		       "connections", num(ls, "connections"), num(ls, "connections_total"), num(ls, "connections_refused"),
		       num(ls, "commands"), bi, bo, num(ls, "protocol_errors"), num(ls, "auth_failures"));
	}
}

static int render_stats(json_t *j, const char *source)
{
	json_t *tiers = json_object_get(j, "tiers"), *eng = json_object_get(j, "engine");
	json_t *t[3] = { NULL, NULL, NULL };
	static const char *const names[3] = { "hbm", "host", "nvme" };
	json_t *tenant = json_object_get(j, "tenant"), *u = json_object_get(j, "usage");
	if (json_is_object(j) && json_is_string(tenant) && json_is_object(u) && !tiers) {
		/* a tenant key's view: its own sessions and usage (global numbers need an admin key) */
		printf("tenant %s: %.0f sessions; %.0f requests, %.0f prompt tokens (%.0f from the cache), %.0f generated\n",
		       json_string_value(tenant), num(j, "sessions"), num(u, "requests"), num(u, "prompt_tokens"),
		       num(u, "cached_tokens"), num(u, "completion_tokens"));
		render_retention(json_object_get(j, "retention"), true);
		render_store(json_object_get(j, "store"));
		printf("(the tiers and engine numbers need an admin key: server.admin_keys)\n");
		return 0;
	}
	if (!json_is_object(j) || !json_is_array(tiers)) {
		fprintf(stderr, "kvtier stats: the response from %s is not a statistics report (no \"tiers\" array)\n",
			source);
		return EX_DATAERR;
	}
	for (size_t i = 0; i < json_array_size(tiers); i++) {
		json_t *x = json_array_get(tiers, i);
		const char *nm = json_string_value(json_object_get(x, "name"));
		for (int k = 0; k < 3; k++)
			if (nm && !strcmp(nm, names[k]))
				t[k] = x;
	}
	bool offline = json_is_true(json_object_get(j, "offline"));
	const char *model = json_string_value(json_object_get(j, "model"));
	char up[32];
	fmt_duration(num(j, "uptime_s"), up, sizeof(up));
	if (offline)
		printf("kvtier stats (offline, from the index in %s)\n", source);
	else
		printf("kvtier stats: %s, model %s, up %s, %.0f sessions\n", source, model ? model : "?", up,
		       num(j, "sessions"));
	printf("\n  %-20s %22s %22s %22s\n", "tier", "hbm", "host", "nvme");
	tier_row("capacity", t, c_capacity);
	tier_row("used", t, c_used);
	tier_row("blocks", t, c_blocks);
	if (!offline) {
		tier_row("hit rate", t, c_hit);
		tier_row("promotions", t, c_prom);
		tier_row("  rate", t, c_prom_rate);
		tier_row("demotions", t, c_dem);
		tier_row("  rate", t, c_dem_rate);
		tier_row("evictions", t, c_evict);
		tier_row("  prefix / chunk", t, c_evict_kind);
	}
	json_t *ch = json_object_get(j, "chunks");
	if ((t[0] && json_object_get(t[0], "chunk_blocks")) || (t[2] && json_object_get(t[2], "chunk_blocks"))) {
		char label[40];
		if (json_is_object(ch))
			snprintf(label, sizeof(label), "chunks (share %.0f%%)", 100 * num(ch, "share"));
		else
			snprintf(label, sizeof(label), "chunks");
		tier_row(label, t, c_chunks);
	}
	json_t *ret = json_object_get(j, "retention");
	json_t *rt_tiers = json_object_get(ret, "tiers");
	if (json_is_array(rt_tiers) && json_array_size(rt_tiers) == 3) {
		json_t *rt[3];
		for (int k = 0; k < 3; k++)
			rt[k] = json_array_get(rt_tiers, k);
		tier_row("retained", rt, c_retained);
	}
	tier_row("compression", t, c_comp);
	tier_row("dtype", t, c_dtype);
	if (!offline) {
		tier_row("corrupt blocks", t, c_corrupt);
		tier_row("degraded", t, c_degraded);
	}
	if (offline) {
		json_t *ns = json_object_get(j, "namespaces");
		printf("\n  sessions: %.0f\n", num(j, "sessions"));
		printf("\n  %-6s %-8s %12s %14s %10s  %s\n", "ns", "tokens/b", "blocks", "T2 bytes", "sessions", "model");
		for (size_t i = 0; i < json_array_size(ns); i++) {
			json_t *x = json_array_get(ns, i);
			char b[48], s[32];
			fmt_bytes(num(x, "used_bytes"), b, sizeof(b));
			json_t *sv = json_object_get(x, "sessions");
			if (json_is_number(sv))
				snprintf(s, sizeof(s), "%.0f", json_number_value(sv));
			else
				snprintf(s, sizeof(s), "?");
			printf("  %-6.0f %-8.0f %12.0f %14s %10s  %s\n", num(x, "id"), num(x, "block_tokens"),
			       num(x, "blocks"), b, s,
			       json_is_true(json_object_get(x, "this_model")) ? "the T2 file's model" : "another model");
		}
		render_retention(ret, g_stats_tenants);
		return 0;
	}
	render_retention(ret, g_stats_tenants);
	render_store(json_object_get(j, "store"));
	json_t *r3 = json_object_get(j, "remote");
	if (json_is_object(r3)) { /* T3, shared with other nodes: its own lines (no capacity of ours to show) */
		json_t *rt = NULL;
		for (size_t i = 0; i < json_array_size(tiers); i++) {
			const char *nm = json_string_value(json_object_get(json_array_get(tiers, i), "name"));
			if (nm && !strcmp(nm, "remote"))
				rt = json_array_get(tiers, i);
		}
		char bi[48], bo[48];
		fmt_bytes(num(r3, "bytes_in"), bi, sizeof(bi));
		fmt_bytes(num(r3, "bytes_out"), bo, sizeof(bo));
		printf("\n  remote (T3)%s\n", json_is_true(json_object_get(r3, "degraded")) ? ": DEGRADED (misses, not outages)" : "");
		printf("  %-24s %.0f hits, %.0f misses (%.1f%%)\n", "lookups", num(rt, "hits"), num(rt, "misses"),
		       100 * num(rt, "hit_rate"));
		printf("  %-24s %s in, %s out; %.0f blocks written, %.0f queued\n", "bytes", bi, bo, num(r3, "writes"),
		       num(r3, "write_queue"));
		printf("  %-24s %.0f errors, %.0f corrupt records (counted misses)\n", "failures", num(r3, "errors"),
		       num(r3, "corrupt"));
		printf("  %-24s %.0f written, %.0f read\n", "sessions", num(r3, "sessions_written"), num(r3, "sessions_read"));
	}
	if (json_is_object(eng)) {
		double prompt = num(eng, "prompt_tokens"), cached = num(eng, "cached_tokens");
		json_t *bt = json_object_get(eng, "cached_tokens_by_tier");
		printf("\n  engine\n");
		printf("  %-24s %.0f (%.0f failed; %.0f running, %.0f queued)\n", "requests", num(eng, "requests"),
		       num(eng, "requests_failed"), num(eng, "running"), num(eng, "queued"));
		printf("  %-24s %.0f\n", "prompt tokens", prompt);
		printf("  %-24s %.0f (%.1f%% of prompt tokens; hbm %.0f, host %.0f, nvme %.0f", "cached tokens", cached,
		       prompt > 0 ? 100 * cached / prompt : 0.0, num(bt, "hbm"), num(bt, "host"), num(bt, "nvme"));
		if (json_is_object(r3))
			printf(", remote %.0f", num(bt, "remote"));
		printf(")\n");
		printf("  %-24s %.0f (%.1f%% of cached tokens: came back through an 8-bit record, not bit-exact)\n",
		       "lossy cached tokens", num(eng, "lossy_cached_tokens"),
		       cached > 0 ? 100 * num(eng, "lossy_cached_tokens") / cached : 0.0);
		printf("  %-24s %.1f%% (cached / reusable %.0f)\n", "cache efficiency", 100 * num(eng, "cache_efficiency"),
		       num(eng, "reusable_tokens"));
		printf("  %-24s %.0f\n", "prefill tokens saved", num(eng, "prefill_tokens_saved"));
		print_misses(json_object_get(eng, "misses_by_reason"));
		if (json_is_object(ch)) {
			json_t *hb = json_object_get(ch, "hit_tokens_by_tier"), *rb = json_object_get(ch, "bytes_read_by_tier");
			char bh[48], bn[48], br[48];
			fmt_bytes(num(rb, "host"), bh, sizeof(bh));
			fmt_bytes(num(rb, "nvme"), bn, sizeof(bn));
			fmt_bytes(num(rb, "remote"), br, sizeof(br));
			printf("  %-24s %.0f hit, %.0f missed of %.0f tokens looked up; %.0f reused, %.0f recomputed, %.0f "
			       "stored; %.0f blends\n",
			       "chunk reuse", num(ch, "hit_tokens"), num(ch, "miss_tokens"), num(ch, "lookup_tokens"),
			       num(ch, "reused_tokens"), num(ch, "recomputed_tokens"), num(ch, "stored_tokens"),
			       num(ch, "blends"));
			printf("  %-24s hbm %.0f, host %.0f, nvme %.0f, remote %.0f tokens; read host %s, nvme %s, remote %s\n",
			       "  hits by tier", num(hb, "hbm"), num(hb, "host"), num(hb, "nvme"), num(hb, "remote"), bh, bn, br);
		}
		printf("  %-24s %.0f\n", "completion tokens", num(eng, "completion_tokens"));
		printf("  %-24s %.1f ms / %.1f ms\n", "TTFT p50 / p99", num(eng, "ttft_p50_ms"), num(eng, "ttft_p99_ms"));
		printf("  %-24s %.1f tokens/s (prefill %.1f tokens/s)\n", "decode", num(eng, "decode_tokens_per_s"),
		       num(eng, "prefill_tokens_per_s"));
	}
	json_t *mem = json_object_get(j, "memory");
	if (json_is_object(mem)) {
		char rss[48], an[48], fi[48], fh[48], lk[48], w[48], wm[48], kv[48], ot[48];
		fmt_bytes(num(mem, "rss_bytes"), rss, sizeof(rss));
		fmt_bytes(num(mem, "rss_anon_bytes"), an, sizeof(an));
		fmt_bytes(num(mem, "rss_file_bytes"), fi, sizeof(fi));
		fmt_bytes(num(mem, "rss_file_huge_bytes"), fh, sizeof(fh));
		fmt_bytes(num(mem, "locked_bytes"), lk, sizeof(lk));
		fmt_bytes(num(mem, "weight_bytes"), w, sizeof(w));
		fmt_bytes(num(mem, "weight_mapped_bytes"), wm, sizeof(wm));
		fmt_bytes(num(mem, "kv_held_bytes"), kv, sizeof(kv));
		const double other = num(mem, "other_bytes");
		fmt_bytes(other < 0 ? -other : other, ot, sizeof(ot));
		printf("\n  memory\n");
		printf("  %-24s %s (anonymous %s, file %s of which %s in 2 MiB pages, locked %s)\n", "RSS", rss, an, fi, fh,
		       lk);
		printf("  %-24s weights %s (%s mapped from the file) + KV held in hbm and host %s, %s%s beyond\n",
		       "RSS for", w, wm, kv, other < 0 ? "-" : "", ot);
	}
	json_t *sc = json_object_get(j, "scheduler");
	if (json_is_object(sc)) {
		json_t *pre = json_object_get(sc, "preemptions");
		printf("\n  scheduler\n");
		printf("  %-24s %.0f (%.0f as one device decode call)\n", "steps", num(sc, "steps"), num(sc, "device_steps"));
		printf("  %-24s %.0f now (%.0f admitted; peak %.0f running)\n", "queue depth", num(sc, "queue_depth"),
		       num(sc, "admissions"), num(sc, "running_peak"));
		printf("  %-24s %.1f ms mean, %.1f ms p50, %.1f ms p99\n", "queue wait", num(sc, "queue_wait_mean_ms"),
		       num(sc, "queue_wait_p50_ms"), num(sc, "queue_wait_p99_ms"));
		printf("  %-24s %.0f swap, %.0f recompute (%.0f tokens let go; %.0f swapped back in, %.0f prefilled again)\n",
		       "preemptions", num(pre, "swap"), num(pre, "recompute"), num(pre, "tokens_held"),
		       num(pre, "tokens_swapped_in"), num(pre, "tokens_recomputed"));
		json_t *bp = json_object_get(sc, "ttft_by_priority");
		for (size_t i = 0; i < json_array_size(bp); i++) {
			json_t *x = json_array_get(bp, i);
			char label[40];
			snprintf(label, sizeof(label), "TTFT priority %.0f", num(x, "priority"));
			printf("  %-24s %.1f ms mean over %.0f requests\n", label, num(x, "ttft_mean_ms"), num(x, "requests"));
		}
	}
	json_t *p = json_object_get(j, "persist");
	if (json_is_object(p))
		printf("\n  persist: %.0f registered, %.0f persisted, %.0f failed%s\n", num(p, "registered"),
		       num(p, "persisted"), num(p, "failed"),
		       json_is_true(json_object_get(p, "read_only")) ? ", READ-ONLY (NVMe writes stopped)" : "");
	if (json_is_object(p) && num(p, "lost_at_start") > 0)
		printf("  LOST at start-up: %.0f blocks the index listed were gone from the NVMe file (see the log)\n",
		       num(p, "lost_at_start"));
	if (json_is_object(p) && num(p, "skipped_at_start") > 0)
		printf("  SKIPPED at start-up: %.0f bad index rows (extent invalid or shared, see the log); run kvtier fsck "
		       "with the daemon stopped\n",
		       num(p, "skipped_at_start"));
	json_t *ix = json_object_get(j, "index");
	if (json_is_object(ix)) {
		printf("  index: %s; %.0f commits, %.0f rolled back for lack of space, %.0f session writes kept, "
		       "%.0f bad session rows skipped\n",
		       json_is_true(json_object_get(ix, "degraded"))
			       ? "DEGRADED (rolling back for lack of space; kept writes retried)"
			       : "ok",
		       num(ix, "commits"), num(ix, "rolled_back"), num(ix, "kept_session_writes"),
		       num(ix, "bad_session_rows"));
	}
	return 0;
}

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	g_interrupted = 1;
}

/* One GET /v1/stats, printed. */
static int stats_once(const client_opts *o, bool clear)
{
	http_resp r;
	memset(&r, 0, sizeof(r));
	http_req q = { .cmd = "stats", .method = "GET", .path = "/v1/stats", .timeout_s = 30 };
	int ret = http_call(o, &q, &r);
	if (ret == 0) {
		json_error_t je;
		json_t *j = json_loadb(r.body ? r.body : "", r.n, 0, &je);
		if (!j) {
			fprintf(stderr, "kvtier stats: malformed JSON from %s/v1/stats: %s (line %d)\n", o->base, je.text,
				je.line);
			ret = EX_DATAERR;
		} else if (o->json) {
			fwrite(r.body, 1, r.n, stdout);
			if (r.n && r.body[r.n - 1] != '\n')
				fputc('\n', stdout);
		} else {
			if (clear)
				fputs("\033[H\033[2J", stdout);
			ret = render_stats(j, o->base);
		}
		json_decref(j);
	}
	fflush(stdout);
	resp_free(&r);
	return ret;
}

/* ---- stats --offline --------------------------------------------------------------------- */

typedef struct ns_acc {
	int64_t id;             /* namespace id */
	uint32_t block_tokens;  /* tokens per block of its rows */
	uint64_t blocks;        /* rows */
	uint64_t extent_bytes;  /* T2 bytes reserved */
	uint64_t stored_bytes;  /* T2 payload bytes stored */
	uint64_t raw_bytes;     /* payload bytes before compression */
	uint64_t chunk_blocks;  /* of the rows, chunk blocks (kind 1; the rest are prefix blocks) */
	int codec;              /* the rows' codec (-1 none yet, -2 mixed) */
	int64_t sessions;       /* sessions, -1 unknown */
	bool this_model;        /* the namespace belongs to the T2 file's model */
} ns_acc;

typedef struct ret_acc {
	char tenant[KVT_NAME_MAX + 1];        /* the tenant of the retained rows */
	uint64_t blocks[KVT_TIER_COUNT];      /* rows retained now, by floor tier */
	uint64_t bytes[KVT_TIER_COUNT];       /* their payload bytes before compression */
} ret_acc;

typedef struct offline_ctx {
	ns_acc *v;    /* namespaces seen */
	size_t n, cap;
	ret_acc *r;   /* tenants with rows retained now (deadline ahead) */
	size_t n_r, cap_r;
	uint64_t now_us; /* the wall clock the deadlines are compared with */
} offline_ctx;

static int offline_row(void *arg, const kvt_db_block_row *row)
{
	offline_ctx *c = arg;
	ns_acc *a = NULL;
	for (size_t i = 0; i < c->n; i++)
		if (c->v[i].id == row->ns_id)
			a = &c->v[i];
	if (!a) {
		if (c->n == c->cap) {
			size_t cap = c->cap ? 2 * c->cap : 8;
			ns_acc *v = realloc(c->v, cap * sizeof(*v));
			if (!v)
				return KVT_ENOMEM;
			c->v = v;
			c->cap = cap;
		}
		a = &c->v[c->n++];
		memset(a, 0, sizeof(*a));
		a->id = row->ns_id;
		a->block_tokens = row->n_tokens;
		a->codec = -1;
		a->sessions = -1;
	}
	a->blocks++;
	a->chunk_blocks += row->kind == KVT_BLOCK_CHUNK;
	a->extent_bytes += row->loc.extent_bytes;
	a->stored_bytes += row->loc.stored_bytes;
	a->raw_bytes += row->raw_bytes;
	if (a->codec == -1)
		a->codec = row->codec;
	else if (a->codec != row->codec)
		a->codec = -2;
	if (row->retain_until_us > c->now_us && row->retain_tenant[0] && row->retain_floor < KVT_TIER_COUNT) {
		ret_acc *t = NULL;
		for (size_t i = 0; i < c->n_r && !t; i++)
			if (!strcmp(c->r[i].tenant, row->retain_tenant))
				t = &c->r[i];
		if (!t) {
			if (c->n_r == c->cap_r) {
				size_t cap = c->cap_r ? 2 * c->cap_r : 8;
				ret_acc *v = realloc(c->r, cap * sizeof(*v));
				if (!v)
					return KVT_ENOMEM;
				c->r = v;
				c->cap_r = cap;
			}
			t = &c->r[c->n_r++];
			memset(t, 0, sizeof(*t));
			memcpy(t->tenant, row->retain_tenant, sizeof(t->tenant));
		}
		t->blocks[row->retain_floor]++;
		t->bytes[row->retain_floor] += row->raw_bytes;
	}
	return 0;
}

/* The offline "retention": rows whose deadline is still ahead, per floor tier and tenant. */
static json_t *offline_retention(const offline_ctx *c)
{
	uint64_t floor_blocks[KVT_TIER_COUNT] = { 0 }, blocks = 0, bytes = 0;
	static const char *const names[KVT_TIER_COUNT] = { "hbm", "host", "nvme" };
	json_t *tenants = json_array(), *tiers = json_array();
	for (size_t i = 0; i < c->n_r; i++) {
		const ret_acc *t = &c->r[i];
		uint64_t tb = 0, tbytes = 0;
		for (int f = 0; f < KVT_TIER_COUNT; f++) {
			floor_blocks[f] += t->blocks[f];
			tb += t->blocks[f];
			tbytes += t->bytes[f];
		}
		blocks += tb;
		bytes += tbytes;
		json_array_append_new(tenants, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "tenant",
							 t->tenant, "blocks", (json_int_t)tb, "bytes", (json_int_t)tbytes,
							 "quota_bytes", (json_int_t)0, "granted_blocks", (json_int_t)0,
							 "denied_blocks", (json_int_t)0, "released", (json_int_t)0,
							 "expired", (json_int_t)0, "quota_released", (json_int_t)0));
	}
	for (int f = 0; f < KVT_TIER_COUNT; f++) /* offline every retained row is in NVMe (where the rows point) */
		json_array_append_new(tiers, json_pack("{s:s, s:I, s:I, s:I}", "name", names[f], "blocks",
						       (json_int_t)(f == KVT_TIER_NVME ? blocks : 0), "bytes",
						       (json_int_t)(f == KVT_TIER_NVME ? bytes : 0), "floor_blocks",
						       (json_int_t)floor_blocks[f]));
	return json_pack("{s:I, s:I, s:o, s:o}", "blocks", (json_int_t)blocks, "bytes", (json_int_t)bytes, "tiers",
			 tiers, "tenants", tenants);
}

static json_t *tier_json(const char *name, const char *dtype)
{
	return json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:f, s:I, s:I, s:f, s:I, s:I, s:f, s:s,"
			 " s:I, s:b}",
			 "name", name, "capacity_bytes", (json_int_t)0, "used_bytes", (json_int_t)0, "capacity_blocks",
			 (json_int_t)0, "blocks", (json_int_t)0, "hits", (json_int_t)0, "misses", (json_int_t)0,
			 "hit_rate", 0.0, "promotions", (json_int_t)0, "promotion_bytes", (json_int_t)0,
			 "promotion_mb_s", 0.0, "demotions", (json_int_t)0, "demotion_bytes", (json_int_t)0,
			 "demotion_mb_s", 0.0, "evictions", (json_int_t)0, "dropped", (json_int_t)0,
			 "compression_ratio", 1.0, "dtype", dtype, "corrupt", (json_int_t)0, "degraded", 0);
}

/* Build the offline report of dir. 0 and *out, or a sysexits code (printed). */
static int offline_report(const char *dir, json_t **out)
{
	char t2_path[4096], idx_path[4096];
	offline_ctx oc = { .now_us = kvt_wall_us() };
	kvt_datadir_lock *lock = NULL;
	kvt_db *db = NULL;
	kvt_db_config cfg;
	uint8_t fp[32];
	bool have_fp = false;
	struct stat st;
	uint64_t t2_size = 0;
	int rc, ret = 0;

	if (kvt_index_paths(dir, t2_path, idx_path, sizeof(t2_path)) != KVT_OK)
		return EX_USAGE;
	if (stat(idx_path, &st) != 0) {
		fprintf(stderr, "kvtier stats: no index at %s (%s); is --data-dir the daemon's data_dir?\n", idx_path,
			strerror(errno));
		return EX_NOINPUT;
	}
	/*
	 * The directory's lock, as fsck and rebuild-index take it: a running
	 * daemon holds it and its index (SQLite EXCLUSIVE), and this report may
	 * add an empty namespace row (below), so it is not read-only enough to
	 * run beside one. The daemon answers the same question: drop --offline.
	 */
	rc = kvt_datadir_lock_take(dir, "kvtier stats --offline", &lock);
	if (rc != KVT_OK) {
		if (rc == KVT_EBUSY)
			fprintf(stderr, "kvtier stats: %s is in use (the line above names the holder); if it is kvtierd, "
					"ask it instead (drop --offline)\n",
				dir);
		else
			fprintf(stderr, "kvtier stats: cannot lock %s (%s)\n", dir, kvt_strerror(rc));
		return rc == KVT_EBUSY ? EX_TEMPFAIL : EX_IOERR;
	}
	if (stat(t2_path, &st) == 0) {
		t2_size = (uint64_t)st.st_size;
		have_fp = kvt_t2_file_model_fp(t2_path, fp) == KVT_OK;
	}

	/* 1. every block row of every namespace, through an admin handle (no namespace: it writes nothing) */
	memset(&cfg, 0, sizeof(cfg));
	cfg.path = idx_path;
	cfg.create = false;
	rc = kvt_db_open(&cfg, &db);
	if (rc == KVT_OK)
		rc = kvt_db_for_each_block(db, KVT_DB_ALL_NS, offline_row, &oc);
	kvt_db_close(db);
	db = NULL;
	if (rc != KVT_OK) {
		fprintf(stderr, "kvtier stats: cannot read the index %s (%s)%s\n", idx_path, kvt_strerror(rc),
			rc == KVT_EIO ? "; if kvtierd is running it holds the index: ask it (drop --offline)" : "");
		ret = rc == KVT_ECORRUPT ? EX_DATAERR : rc == KVT_ENOTFOUND ? EX_NOINPUT : EX_IOERR;
		goto out;
	}

	/*
	 * 2. sessions: a handle sees only its own namespace's sessions, and a
	 * namespace is (model, layout, block size). The T2 file names the model;
	 * a namespace of the same id under that triple is the one the rows are in.
	 * NOTE: when the triple is not a namespace yet, opening it adds an empty
	 * namespace row (kvt_db_open has no read-only mode); it holds nothing.
	 */
	for (size_t i = 0; have_fp && i < oc.n; i++) {
		ns_acc *a = &oc.v[i];
		if (a->block_tokens < 1 || a->block_tokens > KVT_BLOCK_MAX_TOKENS)
			continue;
		memset(&cfg, 0, sizeof(cfg));
		cfg.path = idx_path;
		memcpy(cfg.ns.model_fp, fp, 32);
		cfg.ns.layout_version = KVT_KV_LAYOUT_VERSION;
		cfg.ns.block_tokens = a->block_tokens;
		if (kvt_db_open(&cfg, &db) != KVT_OK)
			continue;
		if (kvt_db_ns_id(db) == a->id) {
			uint64_t n = 0;
			if (kvt_db_count_sessions(db, &n) == KVT_OK)
				a->sessions = (int64_t)n;
			a->this_model = true;
		}
		kvt_db_close(db);
		db = NULL;
	}

	uint64_t blocks = 0, used = 0, stored = 0, raw = 0, chunks = 0;
	int64_t sessions = 0;
	int codec = -1;
	json_t *nss = json_array();
	for (size_t i = 0; i < oc.n; i++) {
		const ns_acc *a = &oc.v[i];
		if (a->this_model) {
			blocks += a->blocks;
			chunks += a->chunk_blocks;
			stored += a->stored_bytes;
			raw += a->raw_bytes;
			codec = codec == -1 ? a->codec : codec == a->codec ? codec : -2;
		}
		used += a->extent_bytes; /* extents of any model occupy the file */
		if (a->sessions > 0)
			sessions += a->sessions;
		json_array_append_new(
			nss, json_pack("{s:I, s:i, s:I, s:I, s:I, s:I, s:o, s:s, s:b}", "id", (json_int_t)a->id,
				       "block_tokens", (int)a->block_tokens, "blocks", (json_int_t)a->blocks, "used_bytes",
				       (json_int_t)a->extent_bytes, "stored_bytes", (json_int_t)a->stored_bytes,
				       "raw_bytes", (json_int_t)a->raw_bytes, "sessions",
				       a->sessions >= 0 ? json_integer(a->sessions) : json_null(), "dtype",
				       a->codec >= 0 ? kvt_kv_codec_name(a->codec) : a->codec == -2 ? "mixed" : "",
				       "this_model", a->this_model));
	}
	if (!have_fp) { /* no T2 file to name the model: count every namespace's rows */
		for (size_t i = 0; i < oc.n; i++) {
			blocks += oc.v[i].blocks;
			chunks += oc.v[i].chunk_blocks;
			stored += oc.v[i].stored_bytes;
			raw += oc.v[i].raw_bytes;
		}
	}
	json_t *nvme = tier_json("nvme", codec >= 0 ? kvt_kv_codec_name(codec) : codec == -2 ? "mixed" : "");
	json_object_set_new(nvme, "capacity_bytes", json_integer((json_int_t)t2_size));
	json_object_set_new(nvme, "used_bytes", json_integer((json_int_t)used));
	json_object_set_new(nvme, "blocks", json_integer((json_int_t)blocks));
	json_object_set_new(nvme, "chunk_blocks", json_integer((json_int_t)chunks));
	json_object_set_new(nvme, "prefix_blocks", json_integer((json_int_t)(blocks - chunks)));
	json_object_set_new(nvme, "compression_ratio", json_real(stored ? (double)raw / (double)stored : 1.0));
	json_t *eng = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:f, s:f, s:f, s:f,"
				" s:{s:I, s:I, s:I}}",
				"requests", (json_int_t)0, "requests_failed", (json_int_t)0, "running", (json_int_t)0,
				"queued", (json_int_t)0, "prompt_tokens", (json_int_t)0, "cached_tokens", (json_int_t)0,
				"reusable_tokens", (json_int_t)0, "cache_efficiency", 0.0, "prefill_tokens_saved",
				(json_int_t)0, "completion_tokens", (json_int_t)0, "ttft_p50_ms", 0.0, "ttft_p99_ms", 0.0,
				"prefill_tokens_per_s", 0.0, "decode_tokens_per_s", 0.0, "cached_tokens_by_tier", "hbm",
				(json_int_t)0, "host", (json_int_t)0, "nvme", (json_int_t)0);
	char fphex[65] = "";
	if (have_fp)
		kvt_hash_hex(fp, fphex);
	json_t *j = json_pack("{s:[o, o, o], s:o, s:{s:I, s:I, s:I, s:b}, s:I, s:f, s:s, s:b, s:s, s:s, s:o}", "tiers",
			      tier_json("hbm", "f16"), tier_json("host", ""), nvme, "engine", eng, "persist",
			      "registered", (json_int_t)0, "persisted", (json_int_t)blocks, "failed", (json_int_t)0,
			      "read_only", 0, "sessions", (json_int_t)sessions, "uptime_s", 0.0, "model", fphex,
			      "offline", 1, "data_dir", dir, "model_fingerprint", fphex, "namespaces", nss);
	if (j)
		json_object_set_new(j, "retention", offline_retention(&oc));
	if (!j) {
		fprintf(stderr, "kvtier stats: out of memory building the report\n");
		ret = EX_OSERR;
		goto out;
	}
	*out = j;
out:
	free(oc.v);
	free(oc.r);
	kvt_datadir_lock_release(lock);
	return ret;
}

/* ---- commands ------------------------------------------------------------------------------ */

static void usage_stats(FILE *f)
{
	fprintf(f, "usage: kvtier stats [--json] [--tenants] [--watch [SECONDS]] [--url URL] [--api-key KEY] [-c FILE]\n"
		   "       kvtier stats --offline --data-dir DIR [--json] [--tenants]\n"
		   "  --offline reads the index of a stopped daemon; while kvtierd holds DIR it is refused (exit 75)\n");
}

int kvt_cli_stats(int argc, char **argv)
{
	client_opts o;
	const char *data_dir = NULL;
	bool offline = false, watch = false, bad = false;
	double every = 2;
	memset(&o, 0, sizeof(o));
	for (int i = 1; i < argc && !bad; i++) {
		const char *a = argv[i];
		if (common_opt("stats", argc, argv, &i, &o, &bad))
			continue;
		if (!strcmp(a, "--offline")) {
			offline = true;
		} else if (!strcmp(a, "--tenants")) {
			g_stats_tenants = true;
		} else if (!strcmp(a, "--data-dir")) {
			if (i + 1 >= argc || !argv[i + 1][0]) {
				fprintf(stderr, "kvtier stats: --data-dir needs a value\n");
				bad = true;
			} else {
				data_dir = argv[++i];
			}
		} else if (!strcmp(a, "--watch")) {
			watch = true;
			if (i + 1 < argc && argv[i + 1][0] != '-') {
				char *end;
				errno = 0;
				double v = strtod(argv[i + 1], &end);
				if (errno || *end || !(v >= 0.1 && v <= 86400)) {
					fprintf(stderr, "kvtier stats: --watch '%s' is not a number of seconds in 0.1..86400\n",
						argv[i + 1]);
					bad = true;
				}
				every = v;
				i++;
			}
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage_stats(stdout);
			return 0;
		} else {
			fprintf(stderr, "kvtier stats: unknown argument '%s'\n", a);
			bad = true;
		}
	}
	if (!bad && offline && !data_dir) {
		fprintf(stderr, "kvtier stats: --offline needs --data-dir DIR\n");
		bad = true;
	}
	if (!bad && data_dir && !offline) {
		fprintf(stderr, "kvtier stats: --data-dir goes with --offline\n");
		bad = true;
	}
	if (!bad && offline && (watch || o.url || o.api_key)) {
		fprintf(stderr, "kvtier stats: --offline reads the index; --watch, --url and --api-key do not apply\n");
		bad = true;
	}
	if (bad) {
		usage_stats(stderr);
		return EX_USAGE;
	}
	if (offline) {
		json_t *j = NULL;
		int ret = offline_report(data_dir, &j);
		if (ret)
			return ret;
		if (o.json) {
			char *s = json_dumps(j, JSON_COMPACT);
			if (s)
				printf("%s\n", s);
			free(s);
		} else {
			ret = render_stats(j, data_dir);
		}
		json_decref(j);
		return ret;
	}
	int ret = resolve_url("stats", &o);
	if (ret)
		return ret;
	if (!watch)
		return stats_once(&o, false);

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigint;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	bool tty = isatty(STDOUT_FILENO);
	while (!g_interrupted) {
		ret = stats_once(&o, tty && !o.json);
		if (ret == EX_USAGE || ret == EX_NOPERM || ret == EX_DATAERR)
			return ret; /* will not get better by waiting */
		/* an unreachable daemon is shown and retried: --watch is a monitor */
		struct timespec ts = { (time_t)every, (long)((every - floor(every)) * 1e9) };
		while (nanosleep(&ts, &ts) != 0 && !g_interrupted)
			;
	}
	return 0;
}

/* ---- sessions ------------------------------------------------------------------------------- */

int kvt_cli_sessions(int argc, char **argv)
{
	client_opts o;
	bool bad = false;
	memset(&o, 0, sizeof(o));
	for (int i = 1; i < argc && !bad; i++) {
		if (common_opt("sessions", argc, argv, &i, &o, &bad))
			continue;
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			printf("usage: kvtier sessions [--json] [--url URL] [--api-key KEY] [-c FILE]\n");
			return 0;
		}
		fprintf(stderr, "kvtier sessions: unknown argument '%s'\n", argv[i]);
		bad = true;
	}
	if (bad) {
		fprintf(stderr, "usage: kvtier sessions [--json] [--url URL] [--api-key KEY] [-c FILE]\n");
		return EX_USAGE;
	}
	int ret = resolve_url("sessions", &o);
	if (ret)
		return ret;
	http_resp r;
	memset(&r, 0, sizeof(r));
	http_req q = { .cmd = "sessions", .method = "GET", .path = "/v1/sessions", .timeout_s = 30 };
	if ((ret = http_call(&o, &q, &r)) != 0) {
		resp_free(&r);
		return ret;
	}
	json_error_t je;
	json_t *j = json_loadb(r.body ? r.body : "", r.n, 0, &je);
	json_t *data = json_object_get(j, "data");
	if (!j || !json_is_array(data)) {
		fprintf(stderr, "kvtier sessions: malformed response from %s/v1/sessions: %s\n", o.base,
			j ? "no \"data\" array" : je.text);
		json_decref(j);
		resp_free(&r);
		return EX_DATAERR;
	}
	if (o.json) {
		fwrite(r.body, 1, r.n, stdout);
		if (r.n && r.body[r.n - 1] != '\n')
			fputc('\n', stdout);
	} else {
		printf("%-32s %-16s %8s %8s %7s %6s %6s %6s %8s  %s\n", "SESSION", "TENANT", "TOKENS", "DURABLE", "BLOCKS",
		       "HBM", "HOST", "NVME", "MISSING", "UPDATED");
		for (size_t i = 0; i < json_array_size(data); i++) {
			json_t *s = json_array_get(data, i), *in = json_object_get(s, "blocks_in");
			const char *id = json_string_value(json_object_get(s, "id"));
			const char *tenant = json_string_value(json_object_get(s, "tenant"));
			time_t upd = (time_t)num(s, "updated");
			char when[32] = "-";
			struct tm tmv;
			if (upd > 0 && localtime_r(&upd, &tmv))
				strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tmv);
			printf("%-32s %-16s %8.0f %8.0f %7.0f %6.0f %6.0f %6.0f %8.0f  %s\n", id ? id : "?",
			       tenant ? tenant : "?", num(s, "tokens"), num(s, "durable_tokens"), num(s, "blocks"),
			       num(in, "hbm"), num(in, "host"), num(in, "nvme"), num(s, "blocks_missing"), when);
		}
		printf("%zu session%s\n", json_array_size(data), json_array_size(data) == 1 ? "" : "s");
	}
	json_decref(j);
	resp_free(&r);
	return 0;
}

/* ---- resume --------------------------------------------------------------------------------- */

typedef struct resume_ctx {
	bool json;        /* print each line to stdout */
	bool bar;         /* draw a progress bar on stderr */
	bool bar_drawn;   /* something is on the bar's line */
	const char *id;   /* the session */
	const char *base; /* for messages */
	json_t *report;   /* the "done" line (or a plain report) */
	double t0;        /* start, for the bar */
	bool failed;      /* the stream reported an error event */
} resume_ctx;

static void draw_bar(resume_ctx *c, double done, double total)
{
	const int width = 30;
	int fill = total > 0 ? (int)(width * done / total + 0.5) : 0;
	if (fill > width)
		fill = width;
	char bar[64];
	for (int i = 0; i < width; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[width] = '\0';
	fprintf(stderr, "\rresuming %.32s [%s] %.0f/%.0f blocks %.1fs", c->id, bar, done, total, kvt_now_s() - c->t0);
	fflush(stderr);
	c->bar_drawn = true;
}

static int resume_line(void *user, const char *line, size_t len)
{
	resume_ctx *c = user;
	while (len && (line[len - 1] == '\r' || line[len - 1] == ' '))
		len--;
	if (len == 0)
		return 0;
	json_error_t je;
	json_t *j = json_loadb(line, len, 0, &je);
	if (!j || !json_is_object(j)) {
		if (c->bar_drawn)
			fputc('\n', stderr);
		fprintf(stderr, "kvtier resume: malformed progress line from %s: %s: \"%.80s\"\n", c->base,
			j ? "not an object" : je.text, line);
		json_decref(j);
		return 1;
	}
	if (c->json) {
		fwrite(line, 1, len, stdout);
		fputc('\n', stdout);
		fflush(stdout);
	}
	const char *ev = json_string_value(json_object_get(j, "event"));
	if (ev && !strcmp(ev, "progress")) {
		if (c->bar)
			draw_bar(c, num(j, "blocks_done"), num(j, "blocks_total"));
		json_decref(j);
		return 0;
	}
	if (ev && !strcmp(ev, "error")) {
		char msg[512];
		const char *m = json_string_value(json_object_get(j, "message"));
		if (!m)
			m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
		snprintf(msg, sizeof(msg), "%s", m ? m : "no message");
		if (c->bar_drawn)
			fputc('\n', stderr);
		c->bar_drawn = false;
		fprintf(stderr, "kvtier resume: the daemon at %s failed to resume '%s': %s\n", c->base, c->id, msg);
		c->failed = true;
		json_decref(j);
		return 1;
	}
	/* "done", or a plain report from a server that does not stream */
	json_decref(c->report);
	c->report = j;
	return 0;
}

static void print_report(const json_t *r, const char *id)
{
	static const char *const tiers[4] = { "hbm", "host", "nvme", "remote" };
	json_t *tok = json_object_get(r, "restored_tokens"), *bytes = json_object_get(r, "restored_bytes");
	double total_tok = 0, total_b = 0;
	const char *rid = json_string_value(json_object_get(r, "id"));
	printf("session %s: %.0f tokens, %.0f blocks%s\n", rid ? rid : id, num(r, "tokens"), num(r, "blocks"),
	       json_is_true(json_object_get(r, "session_from_remote")) ? " (session from T3)" : "");
	/* the remote line only when T3 gave something */
	for (int i = 0; i < (num(tok, "remote") > 0 ? 4 : 3); i++) {
		char b[48];
		fmt_bytes(num(bytes, tiers[i]), b, sizeof(b));
		printf("  restored from %-5s %10.0f tokens %14s\n", tiers[i], num(tok, tiers[i]), b);
		total_tok += num(tok, tiers[i]);
		total_b += num(bytes, tiers[i]);
	}
	char b[48];
	fmt_bytes(total_b, b, sizeof(b));
	printf("  restored in all     %10.0f tokens %14s in %.3f s\n", total_tok, b, num(r, "seconds"));
	if (num(r, "missing_tokens") > 0)
		printf("  missing             %10.0f tokens (recomputed by the next request)\n", num(r, "missing_tokens"));
	printf("  durable on NVMe     %10.0f tokens (as the session row says)\n", num(r, "durable_tokens"));
	if (num(r, "durable_lost_tokens") > 0)
		printf("  lost since          %10.0f tokens (durable once, now evicted or damaged; recomputed)\n",
		       num(r, "durable_lost_tokens"));
	printf("  re-prefill avoided  %10.3f s (%s)\n", num(r, "prefill_seconds_avoided"),
	       json_is_true(json_object_get(r, "prefill_measured")) ? "measured" : "estimated");
}

int kvt_cli_resume(int argc, char **argv)
{
	client_opts o;
	const char *id = NULL;
	bool bad = false;
	memset(&o, 0, sizeof(o));
	for (int i = 1; i < argc && !bad; i++) {
		if (common_opt("resume", argc, argv, &i, &o, &bad))
			continue;
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			printf("usage: kvtier resume SESSION [--json] [--url URL] [--api-key KEY] [-c FILE]\n");
			return 0;
		}
		if (argv[i][0] == '-') {
			fprintf(stderr, "kvtier resume: unknown option '%s'\n", argv[i]);
			bad = true;
		} else if (id) {
			fprintf(stderr, "kvtier resume: one session at a time ('%s' and '%s')\n", id, argv[i]);
			bad = true;
		} else {
			id = argv[i];
		}
	}
	if (!bad && !id) {
		fprintf(stderr, "kvtier resume: which session? (kvtier sessions lists them)\n");
		bad = true;
	}
	if (!bad && !kvt_name_valid(id)) {
		fprintf(stderr, "kvtier resume: '%.64s' is not a session id (1..%d of [A-Za-z0-9._-], not starting with '.')\n",
			id, KVT_NAME_MAX);
		bad = true;
	}
	if (bad) {
		fprintf(stderr, "usage: kvtier resume SESSION [--json] [--url URL] [--api-key KEY] [-c FILE]\n");
		return EX_USAGE;
	}
	int ret = resolve_url("resume", &o);
	if (ret)
		return ret;

	char path[64 + KVT_NAME_MAX];
	snprintf(path, sizeof(path), "/v1/sessions/%s/resume", id);
	resume_ctx rc = { .json = o.json, .bar = !o.json && isatty(STDERR_FILENO), .id = id, .base = o.base,
			  .t0 = kvt_now_s() };
	http_resp r;
	memset(&r, 0, sizeof(r));
	r.on_line = resume_line;
	r.user = &rc;
	http_req q = { .cmd = "resume", .method = "POST", .path = path, .body = "{\"stream\":true}", .resume = true,
		       .what = id };
	ret = http_call(&o, &q, &r);
	if (rc.failed)
		ret = EX_SOFTWARE;
	if (ret == 0 && r.line_start < r.n) /* a last line without its newline */
		ret = resume_line(&rc, r.body + r.line_start, r.n - r.line_start) ? EX_DATAERR : 0;
	if (rc.bar_drawn)
		fputc('\n', stderr);
	if (ret == 0 && !rc.report) {
		fprintf(stderr, "kvtier resume: %s ended the stream without a report\n", o.base);
		ret = EX_DATAERR;
	}
	if (ret == 0 && !o.json)
		print_report(rc.report, id);
	json_decref(rc.report);
	resp_free(&r);
	return ret;
}
