/* ctest-labels: integration */
/*
 * tests/test_resp_listener.c — the Redis-protocol listener (engine/serve/resp.h)
 * in process, on loopback, over the real store (tiers/kvstore.h: a real T2
 * file and SQLite index in a temporary directory, 32 MiB of NVMe), so the
 * sanitizer builds (ASan+UBSan, TSan) run it: CI's daemon test
 * (tests/daemon/test_store.py) covers the same paths in kvtierd itself.
 *
 * Cases: 8 threads, each a connection sending pipelined SETs then GETs of
 * values from 1 byte to 300 KiB (the large ones sent from the value's buffer),
 * replies compared byte for byte; AUTH and tenants apart (NOAUTH, WRONGPASS);
 * hostile input closed with "-ERR Protocol error" while a good connection
 * goes on; a value cut short by a closed connection never stored; the
 * listener stopped with connections open (and one mid-value) before the
 * store closes; over max_connections a connection is refused.
 */
#include "check.h"
#include "resp.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static char dir[] = "/tmp/kvt_resp_listener_XXXXXX";
static uint16_t port;

static int dial(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001) };
	struct timeval tv = { 10, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static bool send_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
		if (w <= 0)
			return false;
		b += w;
		n -= (size_t)w;
	}
	return true;
}

/* Read exactly n bytes (false on close or timeout). */
static bool recv_all(int fd, void *p, size_t n)
{
	uint8_t *b = p;
	while (n) {
		ssize_t r = recv(fd, b, n, 0);
		if (r <= 0)
			return false;
		b += r;
		n -= (size_t)r;
	}
	return true;
}

/* Read until the peer closes (at most cap - 1 bytes, NUL-terminated); the byte count. */
static size_t recv_to_close(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	while (n + 1 < cap) {
		ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	buf[n] = '\0';
	return n;
}

/* Append "*N $.. args" for a command of argc arguments (lens[i] bytes at argv[i]). */
static size_t put_cmd(uint8_t *out, int argc, const char *const *argv, const size_t *lens)
{
	size_t n = (size_t)sprintf((char *)out, "*%d\r\n", argc);
	for (int i = 0; i < argc; i++) {
		n += (size_t)sprintf((char *)out + n, "$%zu\r\n", lens[i]);
		memcpy(out + n, argv[i], lens[i]);
		n += lens[i];
		memcpy(out + n, "\r\n", 2);
		n += 2;
	}
	return n;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 7u;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)(x >> 16);
	}
}

#define N_THREADS 8
#define N_KEYS 12

static size_t val_len(int i)
{
	static const size_t lens[] = { 1, 10, 100, 4096, 65535, 65536, 70000, 300 << 10 };
	return lens[i % 8];
}

/* One client: N_KEYS pipelined SETs, then a GET of each, compared byte for byte. */
static void *client_main(void *arg)
{
	int t = (int)(intptr_t)arg, fd = dial(), bad = 0;
	size_t cap = 8u << 20, n = 0;
	uint8_t *buf = malloc(cap), *val = malloc(300 << 10), *got = malloc((300 << 10) + 64);
	char key[32];
	n = (size_t)sprintf((char *)buf, "*2\r\n$4\r\nAUTH\r\n$5\r\nkey-%c\r\n", t % 2 ? 'b' : 'a');
	for (int i = 0; i < N_KEYS; i++) {
		snprintf(key, sizeof(key), "t%d:k%d", t, i);
		fill(val, val_len(i), (uint32_t)(t * 100 + i));
		const char *argv[3] = { "SET", key, (const char *)val };
		size_t lens[3] = { 3, strlen(key), val_len(i) };
		n += put_cmd(buf + n, 3, argv, lens);
	}
	bad += !send_all(fd, buf, n);
	char ok[5 * (N_KEYS + 1)]; /* AUTH's, then each SET's */
	bad += !recv_all(fd, ok, sizeof(ok));
	for (int i = 0; i <= N_KEYS; i++)
		bad += memcmp(ok + 5 * i, "+OK\r\n", 5) != 0;
	for (int i = 0; i < N_KEYS; i++) {
		snprintf(key, sizeof(key), "t%d:k%d", t, i);
		const char *argv[2] = { "GET", key };
		size_t lens[2] = { 3, strlen(key) };
		n = put_cmd(buf, 2, argv, lens);
		bad += !send_all(fd, buf, n);
		char head[32];
		int hn = snprintf(head, sizeof(head), "$%zu\r\n", val_len(i));
		fill(val, val_len(i), (uint32_t)(t * 100 + i));
		bad += !recv_all(fd, got, (size_t)hn + val_len(i) + 2);
		bad += memcmp(got, head, (size_t)hn) != 0 || memcmp(got + hn, val, val_len(i)) != 0 ||
		       memcmp(got + hn + val_len(i), "\r\n", 2) != 0;
	}
	close(fd);
	free(buf);
	free(val);
	free(got);
	return (void *)(intptr_t)bad;
}

static void test_clients(void)
{
	pthread_t th[N_THREADS];
	for (int t = 0; t < N_THREADS; t++)
		pthread_create(&th[t], NULL, client_main, (void *)(intptr_t)t);
	int bad = 0;
	for (int t = 0; t < N_THREADS; t++) {
		void *r;
		pthread_join(th[t], &r);
		bad += (int)(intptr_t)r;
	}
	CHECK_EQ_INT(bad, 0);
}

/* Send text, read exactly the expected reply. */
static bool exchange(int fd, const char *send_text, const char *want)
{
	size_t n = strlen(want);
	char got[512];
	if (!send_all(fd, send_text, strlen(send_text)) || n >= sizeof(got) || !recv_all(fd, got, n))
		return false;
	got[n] = '\0';
	if (memcmp(got, want, n) != 0)
		fprintf(stderr, "sent %s: got %s, want %s\n", send_text, got, want);
	return memcmp(got, want, n) == 0;
}

static void test_auth(void)
{
	int fd = dial();
	CHECK(exchange(fd, "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "-NOAUTH Authentication required.\r\n"));
	CHECK(exchange(fd, "*2\r\n$4\r\nAUTH\r\n$3\r\nbad\r\n",
		       "-WRONGPASS invalid username-password pair or user is disabled.\r\n"));
	CHECK(exchange(fd, "*3\r\n$4\r\nAUTH\r\n$1\r\nb\r\n$5\r\nkey-a\r\n",
		       "-WRONGPASS invalid username-password pair or user is disabled.\r\n"));
	CHECK(exchange(fd, "*3\r\n$4\r\nAUTH\r\n$1\r\na\r\n$5\r\nkey-a\r\n", "+OK\r\n"));
	CHECK(exchange(fd, "SET shared from-a\r\n", "+OK\r\n"));
	int fb = dial();
	CHECK(exchange(fb, "AUTH key-b\r\n", "+OK\r\n"));
	CHECK(exchange(fb, "GET shared\r\n", "$-1\r\n"));
	CHECK(exchange(fb, "SET shared from-b\r\nEXISTS shared nope shared\r\n", "+OK\r\n:2\r\n"));
	CHECK(exchange(fd, "GET shared\r\n", "$6\r\nfrom-a\r\n"));
	CHECK(exchange(fb, "DEL shared shared\r\nGET shared\r\n", ":1\r\n$-1\r\n"));
	CHECK(exchange(fd, "GET shared\r\nHELLO 3\r\n", "$6\r\nfrom-a\r\n-NOPROTO sorry, this protocol version is not supported.\r\n"));
	CHECK(exchange(fd, "SET x y NX\r\nSET x y EX 0\r\nSELECT 1\r\nFLUSHALL\r\n",
		       "-ERR SET option 'nx' is not supported by kvtier\r\n-ERR invalid expire time in 'set' command\r\n"
		       "-ERR DB index is out of range\r\n-ERR unknown command 'FLUSHALL'\r\n"));
	CHECK(exchange(fd, "PING\r\nECHO hi\r\nQUIT\r\n", "+PONG\r\n$2\r\nhi\r\n+OK\r\n"));
	char rest[16];
	CHECK(recv_to_close(fd, rest, sizeof(rest)) == 0); /* QUIT closed it */
	close(fd);
	close(fb);
}

static void test_hostile(void)
{
	static const char *const in[] = { "*1\r\n$-5\r\n", "*2\r\n$3\r\nGET\r\n$1073741824\r\n", "*99999999\r\n",
					  "*1\r\n+PING\r\n", "*1\r\n$4\r\nPINGxx", "AUTH key-a\r\n\x01\x02\r\n" };
	int good = dial();
	CHECK(exchange(good, "AUTH key-a\r\nSET keep v\r\n", "+OK\r\n+OK\r\n"));
	for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
		int fd = dial();
		char got[256];
		CHECK(send_all(fd, in[i], strlen(in[i])));
		recv_to_close(fd, got, sizeof(got));
		CHECKF(strstr(got, "-ERR Protocol error: ") != NULL, "input %zu: %s", i, got);
		close(fd);
	}
	/* a SET cut short: the connection closes after half its value; nothing stored */
	int fd = dial();
	const char *half = "AUTH key-a\r\n*3\r\n$3\r\nSET\r\n$3\r\ncut\r\n$200000\r\n";
	uint8_t *part = calloc(1, 100000);
	CHECK(send_all(fd, half, strlen(half)) && send_all(fd, part, 100000));
	char ok[5];
	CHECK(recv_all(fd, ok, 5) && !memcmp(ok, "+OK\r\n", 5));
	close(fd);
	free(part);
	usleep(100 * 1000);
	CHECK(exchange(good, "EXISTS cut\r\nGET keep\r\n", ":0\r\n$1\r\nv\r\n"));
	close(good);
}

int main(void)
{
	if (!mkdtemp(dir))
		return check_skip("test_resp_listener", "no temporary directory");
	kvt_kvs_config kc;
	kvt_kvs_config_default(&kc);
	kc.dir = dir;
	kc.ram_bytes = 16u << 20;
	kc.nvme_bytes = 32u << 20;
	kvt_kvs *kvs = NULL;
	CHECK(kvt_kvs_open(&kc, &kvs) == KVT_OK);
	kvt_api_key keys[2] = { { "a", "key-a" }, { "b", "key-b" } };
	kvt_resp_config rc;
	kvt_resp_config_default(&rc);
	rc.port = 0;
	rc.kvs = kvs;
	rc.keys = keys;
	rc.n_keys = 2;
	rc.max_connections = 40;
	rc.max_value_bytes = 4u << 20;
	kvt_resp *r = NULL;
	CHECK(kvs && kvt_resp_start(&rc, &r) == KVT_OK);
	if (!r)
		return check_done("test_resp_listener");
	port = kvt_resp_port(r);
	test_clients();
	test_auth();
	test_hostile();
	/* over max_connections: 40 held open, the 41st refused (once the earlier connections' threads ended) */
	kvt_resp_stats st;
	for (int i = 0; i < 500; i++) {
		kvt_resp_stats_get(r, &st);
		if (st.conns_open == 0)
			break;
		usleep(10 * 1000);
	}
	CHECK_EQ_INT(st.conns_open, 0);
	int held[40], n_held = 0;
	for (int i = 0; i < 40; i++)
		if ((held[n_held] = dial()) >= 0)
			n_held++;
	usleep(200 * 1000);
	int extra = dial();
	char got[128];
	recv_to_close(extra, got, sizeof(got));
	CHECKF(!strcmp(got, "-ERR max number of clients reached\r\n"), "%s", got);
	close(extra);
	kvt_resp_stats_get(r, &st);
	CHECK(st.conns_open == 40 && st.conns_refused == 1 && st.protocol_errors == 6 && st.auth_failures >= 3);
	CHECK(st.commands > 100 && st.bytes_in > (1u << 20) && st.bytes_out > (1u << 20));
	/* stop with every held connection open, one of them in the middle of a value */
	const char *mid = "AUTH key-a\r\n*3\r\n$3\r\nSET\r\n$3\r\nmid\r\n$100000\r\nabc";
	send_all(held[0], mid, strlen(mid));
	usleep(100 * 1000);
	kvt_resp_stop(r);
	for (int i = 0; i < n_held; i++)
		close(held[i]);
	CHECK_EQ_INT(kvt_kvs_exists(kvs, "a", "mid", 3), 0);
	CHECK_EQ_INT(kvt_kvs_exists(kvs, "a", "keep", 4), 1);
	kvt_kvs_close(kvs);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	return check_done("test_resp_listener");
}
