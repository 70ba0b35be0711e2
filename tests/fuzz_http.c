/*
 * tests/fuzz_http.c — libFuzzer target for the request path: everything
 * kvtierd's HTTP layer does once libmicrohttpd has a request — routing, the
 * API key, query arguments, the JSON body and its mapping to a scheduler
 * request, generation, sessions, resume, statistics, the replies.
 *
 * A real kvt_server runs in this process, on loopback, on the synthetic
 * model of srv_engine.h (started at the first input, stopped at exit), with
 * two tenant keys and an admin key, metrics for admins, max_tokens at most 8
 * and n at most 2 so that a generation is short. Each input is one request:
 *   byte 0   the route: < 0xf0 picks one of http_routes[] (index mod its count);
 *            >= 0xf0 takes the path from the input, up to the first '\n'
 *   byte 1   the key: mod 4 picks none, alice's, bob's, the admin's
 *   then     the query string, up to the first '\n' ("" = none)
 *   the rest the body (sent with a Content-Length when not empty)
 * Bytes of the path and query outside 0x21..0x7e go out percent-escaped, so
 * every input is a well-formed HTTP/1.1 request (the raw-socket fuzz of the
 * live daemon, tests/daemon/test_daemon.py rawfuzz, sends malformed ones).
 *
 * Invariants (a violation aborts: a libFuzzer finding):
 *  - an answer comes, with status 200, 4xx or 503 — 529 on Anthropic's
 *    /v1/messages routes, their 503 — (never another 5xx);
 *  - a JSON error (4xx, 503, 529) is an object with error.message and error.type;
 *  - /health answers 200 after every input (the server lives on).
 * Any memory error in the server's threads is reported by the sanitizers.
 *
 * Build (CMake does it in the ASan build when clang is present): every C
 * source of core, gpu (no CUDA), index, tiers, engine/model and engine/serve
 * but kvtierd_main.c. test_fuzz_replay replays tests/data/http_corpus and
 * tests/data/http_regress through it without libFuzzer.
 */
#define _GNU_SOURCE
#include "server.h"
#include "srv_engine.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct {
	const char *method, *path;
} http_routes[] = {
	{ "POST", "/v1/completions" },      { "POST", "/v1/chat/completions" }, { "GET", "/v1/models" },
	{ "GET", "/v1/models/synth-fuzz" }, { "GET", "/v1/stats" },            { "GET", "/metrics" },
	{ "GET", "/health" },               { "GET", "/v1/sessions" },         { "POST", "/v1/sessions/s1/resume" },
	{ "DELETE", "/v1/sessions/s1" },    { "POST", "/v1/sessions/s2/resume" }, { "GET", "/v1/completions" },
	{ "HEAD", "/v1/models" },           { "PUT", "/v1/chat/completions" },
};
static const char *const http_keys[] = { NULL, "key-alice", "key-bob", "key-admin" };

static struct {
	bool up;
	char dir[64];
	engine e;
	kvt_server *srv;
	uint16_t port;
} FH;

static void fuzz_http_stop(void)
{
	if (!FH.up)
		return;
	kvt_server_stop(FH.srv);
	engine_close(&FH.e);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", FH.dir);
	if (system(cmd) != 0)
		fprintf(stderr, "fuzz_http: could not remove %s\n", FH.dir);
	FH.up = false;
}

static void fuzz_http_start(void)
{
	static const kvt_api_key tenant_keys[2] = { { "alice", "key-alice" }, { "bob", "key-bob" } };
	static const kvt_api_key admin_keys[1] = { { "ops", "key-admin" } };
	snprintf(FH.dir, sizeof(FH.dir), "/tmp/kvt_fuzz_http_XXXXXX");
	kvt_log_set_level(KVT_LOG_ERROR);
	signal(SIGPIPE, SIG_IGN); /* a server that answers early and closes must not kill the fuzzer */
	if (!mkdtemp(FH.dir) || engine_open(&FH.e, FH.dir)) {
		fprintf(stderr, "fuzz_http: cannot build the engine in %s\n", FH.dir);
		abort();
	}
	kvt_server_config sc;
	kvt_server_config_default(&sc);
	sc.port = 0;
	sc.model_id = "synth-fuzz";
	sc.keys = tenant_keys;
	sc.n_keys = 2;
	sc.admin_keys = admin_keys;
	sc.n_admin_keys = 1;
	sc.metrics_admin = true;
	sc.max_tokens_limit = 8;
	sc.default_max_tokens = 4;
	sc.max_n = 2;
	sc.max_body_bytes = 64 << 10;
	if (kvt_server_start(&sc, &FH.srv) != KVT_OK)
		abort();
	FH.port = kvt_server_port(FH.srv);
	kvt_server_set_engine(FH.srv, FH.e.sched, FH.e.tok);
	FH.up = true;
	atexit(fuzz_http_stop);
}

/* Append s[0..n) to out (cap), percent-escaping what is not a printable non-space. */
static size_t put_escaped(char *out, size_t o, size_t cap, const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n && o + 4 < cap; i++) {
		if (s[i] > 0x20 && s[i] < 0x7f)
			out[o++] = (char)s[i];
		else
			o += (size_t)snprintf(out + o, cap - o, "%%%02X", s[i]);
	}
	return o;
}

/*
 * NOTE: libFuzzer's -timeout runs an interval timer (SIGALRM) in this
 * process, so connect, write and poll here return EINTR now and then. Each
 * call is retried, and the answer deadline is measured, not counted in
 * polls: a poll cut short by the signal once looked like a server that had
 * stopped answering (the socket held the whole answer).
 */
static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Connect to the server (EINTR: the connect goes on; wait for it). */
static int dial(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(FH.port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
		return fd;
	if (errno == EINTR) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int err = 0;
		socklen_t len = sizeof(err);
		while (poll(&p, 1, 15000) < 0 && errno == EINTR)
			;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0 && (p.revents & POLLOUT))
			return fd;
	}
	fprintf(stderr, "fuzz_http: cannot connect to the server: %s\n", strerror(errno));
	close(fd);
	return -1;
}

/* Write all of buf; false when the server stopped reading (it may have answered already). */
static bool send_all(int fd, const void *buf, size_t n)
{
	const char *p = buf;
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		p += w;
		n -= (size_t)w;
	}
	return true;
}

/* Send one request, read the whole answer (Connection: close); its status, 0 when none came. */
static int exchange(const char *head, size_t n_head, const uint8_t *body, size_t n_body, char *resp, size_t cap,
		    size_t *n_resp)
{
	int fd = dial();
	if (fd < 0)
		abort(); /* the server is gone */
	if (send_all(fd, head, n_head) && n_body && !send_all(fd, body, n_body)) {
		/* the server may answer (413) and stop reading before the body is in: read its answer */
	}
	size_t n = 0;
	const double deadline = now_s() + 15;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		double left = deadline - now_s();
		int pr = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0) {
			fprintf(stderr, "fuzz_http: no answer within 15 s (%zu bytes so far)\n", n);
			break;
		}
		ssize_t r = read(fd, resp + n, cap - 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (size_t)r;
		if (n == cap - 1)
			break;
	}
	close(fd);
	resp[n] = '\0';
	*n_resp = n;
	int status = 0;
	if (sscanf(resp, "HTTP/1.%*d %d", &status) != 1)
		status = 0;
	return status;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!FH.up)
		fuzz_http_start();
	if (size < 2)
		return 0;
	const uint8_t *p = data + 2, *end = data + size;
	char head[8192];
	size_t o = 0;
	const char *method = "GET";
	if (data[0] >= 0xf0) {
		const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		method = data[0] & 1 ? "POST" : "GET";
		o += (size_t)snprintf(head + o, sizeof(head) - o, "%s /", method);
		o = put_escaped(head, o, sizeof(head) - 1024, p, n < 2048 ? n : 2048);
		p += n + (nl ? 1 : 0);
	} else {
		size_t r = data[0] % (sizeof(http_routes) / sizeof(http_routes[0]));
		method = http_routes[r].method;
		o += (size_t)snprintf(head + o, sizeof(head) - o, "%s %s", method, http_routes[r].path);
	}
	const uint8_t *nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
	size_t nq = nl ? (size_t)(nl - p) : 0;
	if (nq) {
		head[o++] = '?';
		o = put_escaped(head, o, sizeof(head) - 1024, p, nq < 2048 ? nq : 2048);
	}
	if (nl)
		p = nl + 1;
	const uint8_t *body = p;
	size_t n_body = (size_t)(end - p);
	o += (size_t)snprintf(head + o, sizeof(head) - o, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
	const char *key = http_keys[data[1] % 4];
	if (key)
		o += (size_t)snprintf(head + o, sizeof(head) - o, "Authorization: Bearer %s\r\n", key);
	if (n_body)
		o += (size_t)snprintf(head + o, sizeof(head) - o,
				      "Content-Type: application/json\r\nContent-Length: %zu\r\n", n_body);
	o += (size_t)snprintf(head + o, sizeof(head) - o, "\r\n");

	static char resp[1 << 20];
	size_t n_resp = 0;
	int status = exchange(head, o, body, n_body, resp, sizeof(resp), &n_resp);
	if (status == 0 || (status >= 500 && status != 503 && status != 529) || status < 200) {
		fprintf(stderr, "fuzz_http: %.*s -> status %d:\n%.2000s\n", (int)(o < 2000 ? o : 2000), head, status, resp);
		abort();
	}
	const char *sep = strstr(resp, "\r\n\r\n");
	bool json = strcasestr(resp, "\r\nContent-Type: application/json") != NULL;
	if (status >= 400 && json && strcmp(method, "HEAD")) {
		if (!sep || !strstr(sep, "\"error\":{") || !strstr(sep, "\"message\":") || !strstr(sep, "\"type\":")) {
			fprintf(stderr, "fuzz_http: %.*s -> %d without an error object:\n%.2000s\n", (int)o, head, status,
				resp);
			abort();
		}
	}
	static const char health[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
	static char hresp[4096];
	if (exchange(health, sizeof(health) - 1, NULL, 0, hresp, sizeof(hresp), &n_resp) != 200) {
		fprintf(stderr, "fuzz_http: /health fails after %.*s:\n%.1000s\n", (int)o, head, hresp);
		abort();
	}
	return 0;
}
