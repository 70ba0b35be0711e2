/*
 * tests/remote/test_t3_client.c — the Redis Cluster client (tiers/t3_cluster.c)
 * against real redis-server processes: run under tests/remote/redis_cluster.py,
 * which starts a 3-master cluster and one password-protected single server on
 * loopback and passes their addresses in KVT_TEST_REDIS_* (skip without them).
 *
 * Covers: the key slot (spec vectors, and CLUSTER KEYSLOT of the live server
 * for 2000 random keys, hash tags included); pipelined SET/GET of many keys
 * spread over the three masters, each key landing on the master that owns its
 * slot; large values; a missing key; ASK during a slot migration and MOVED
 * after it (map refreshed); AUTH right and wrong in single mode; a dead port
 * and a stopped (SIGSTOP) server failing within the command timeout; the
 * breaker (a down node is not dialled again at once); recovery after SIGCONT.
 */
#include "check.h"
#include "t3_remote.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <unistd.h>

static char cluster_seeds[512], single_seed[128], single_pw[128];
static int ports[3];

static redisContext *raw(int port)
{
	redisContext *c = redisConnect("127.0.0.1", port);
	KVT_ASSERT(c && !c->err);
	return c;
}

static kvt_rc *make(const char *seeds, bool cluster, const char *pw, uint32_t timeout_ms, uint32_t depth)
{
	kvt_rc_config cfg = { .seeds = seeds, .cluster = cluster, .password = pw, .connect_timeout_ms = 500,
			      .command_timeout_ms = timeout_ms, .pipeline_depth = depth };
	kvt_rc *c = NULL;
	CHECK(kvt_rc_create(&cfg, &c) == KVT_OK);
	return c;
}

static void test_slots(void)
{
	CHECK_EQ_INT(kvt_rc_key_slot("123456789", 9), 0x31C3 & 0x3FFF); /* the CRC16 XMODEM check value */
	CHECK_EQ_INT(kvt_rc_key_slot("somekey", 7), 11058);
	CHECK_EQ_INT(kvt_rc_key_slot("foo{hash_tag}", 13), 2515);
	CHECK_EQ_INT(kvt_rc_key_slot("bar{hash_tag}", 13), 2515);
	CHECK_EQ_INT(kvt_rc_key_slot("{user1}.following", 17), 8106);
	/* The live server agrees on random keys, tags and empty tags included. */
	redisContext *r = raw(ports[0]);
	srand(7);
	int bad = 0;
	for (int i = 0; i < 2000; i++) {
		char k[64];
		int n = 1 + rand() % 40;
		for (int j = 0; j < n; j++)
			k[j] = "ab{}c:d0123456789"[rand() % 17];
		redisReply *rep = redisCommand(r, "CLUSTER KEYSLOT %b", k, (size_t)n);
		KVT_ASSERT(rep && rep->type == REDIS_REPLY_INTEGER);
		bad += rep->integer != kvt_rc_key_slot(k, (size_t)n);
		freeReplyObject(rep);
	}
	CHECK_EQ_INT(bad, 0);
	redisFree(r);
}

static void test_set_get(void)
{
	enum { N = 600 };
	kvt_rc *c = make(cluster_seeds, true, NULL, 2000, 16);
	static char keys[N][32], vals[N][64];
	static kvt_rc_op ops[N];
	for (int i = 0; i < N; i++) {
		snprintf(keys[i], sizeof(keys[i]), "t3test:k%d", i);
		snprintf(vals[i], sizeof(vals[i]), "value-%d-%x", i, i * 2654435761u);
		ops[i] = (kvt_rc_op){ .key = keys[i], .key_bytes = strlen(keys[i]), .val = vals[i],
				      .val_bytes = strlen(vals[i]) };
	}
	CHECK(kvt_rc_run(c, ops, N) == KVT_OK);
	int n_ok = 0;
	for (int i = 0; i < N; i++)
		n_ok += ops[i].rc == KVT_OK;
	CHECK_EQ_INT(n_ok, N);
	kvt_rc_stats st;
	kvt_rc_get_stats(c, &st);
	CHECK_EQ_INT(st.n_nodes, 3);
	CHECK_EQ_INT(st.n_moved, 0); /* the map was right */
	CHECK(st.n_rounds >= 3 * (N / 3 / 16)); /* pipelined per node, 16 deep */
	/* Each key is on the master that owns its slot, and only there. */
	int misplaced = 0;
	for (int p = 0; p < 3; p++) {
		redisContext *r = raw(ports[p]);
		for (int i = 0; i < N; i += 7) {
			redisReply *rep = redisCommand(r, "CLUSTER COUNTKEYSINSLOT %d", (int)kvt_rc_key_slot(keys[i], strlen(keys[i])));
			redisReply *g = redisCommand(r, "GET %s", keys[i]);
			bool here = g->type == REDIS_REPLY_STRING;
			bool owns = g->type != REDIS_REPLY_ERROR; /* MOVED from the others */
			misplaced += here != owns || (here && strcmp(g->str, vals[i]));
			misplaced += owns && rep->integer < 1;
			freeReplyObject(rep);
			freeReplyObject(g);
		}
		redisFree(r);
	}
	CHECK_EQ_INT(misplaced, 0);
	/* GET them back (and a missing key) in one round. */
	for (int i = 0; i < N; i++)
		ops[i] = (kvt_rc_op){ .key = keys[i], .key_bytes = strlen(keys[i]) };
	ops[N - 1].key = "t3test:missing";
	ops[N - 1].key_bytes = strlen(ops[N - 1].key);
	CHECK(kvt_rc_run(c, ops, N) == KVT_OK);
	int same = 0;
	for (int i = 0; i < N - 1; i++)
		same += ops[i].rc == KVT_OK && ops[i].data_bytes == strlen(vals[i]) &&
			!memcmp(ops[i].data, vals[i], ops[i].data_bytes);
	CHECK_EQ_INT(same, N - 1);
	CHECK_EQ_INT(ops[N - 1].rc, KVT_ENOTFOUND);
	kvt_rc_ops_release(ops, N);

	/* Large values (a block record is ~370 KB), with an expiry. */
	enum { L = 24 };
	size_t big = 400 * 1024;
	char *b = malloc(big * L);
	for (size_t i = 0; i < big * L; i++)
		b[i] = (char)(i * 131 + i / 977);
	for (int i = 0; i < L; i++)
		ops[i] = (kvt_rc_op){ .key = keys[i], .key_bytes = strlen(keys[i]), .val = b + big * i,
				      .val_bytes = big, .ttl_s = 600 };
	CHECK(kvt_rc_run(c, ops, L) == KVT_OK);
	for (int i = 0; i < L; i++)
		ops[i] = (kvt_rc_op){ .key = keys[i], .key_bytes = strlen(keys[i]) };
	CHECK(kvt_rc_run(c, ops, L) == KVT_OK);
	same = 0;
	for (int i = 0; i < L; i++)
		same += ops[i].rc == KVT_OK && ops[i].data_bytes == big && !memcmp(ops[i].data, b + big * i, big);
	CHECK_EQ_INT(same, L);
	kvt_rc_ops_release(ops, L);
	free(b);
	kvt_rc_destroy(c);
}

/* The node id of the master on port p. */
static void node_id(int p, char *out, size_t cap)
{
	redisContext *r = raw(p);
	redisReply *rep = redisCommand(r, "CLUSTER MYID");
	snprintf(out, cap, "%s", rep->str);
	freeReplyObject(rep);
	redisFree(r);
}

static void test_redirects(void)
{
	kvt_rc *c = make(cluster_seeds, true, NULL, 2000, 8);
	/* A key on the master of ports[0], moved to ports[1] slot by slot. */
	char key[64];
	uint16_t slot = 0;
	redisContext *a = raw(ports[0]), *b = raw(ports[1]);
	for (int i = 0;; i++) {
		snprintf(key, sizeof(key), "t3mig:%d", i);
		slot = kvt_rc_key_slot(key, strlen(key));
		redisReply *g = redisCommand(a, "GET %s", key);
		bool owns = g->type != REDIS_REPLY_ERROR;
		freeReplyObject(g);
		if (owns)
			break;
	}
	kvt_rc_op op = { .key = key, .key_bytes = strlen(key), .val = "before", .val_bytes = 6 };
	CHECK(kvt_rc_run(c, &op, 1) == KVT_OK && op.rc == KVT_OK);
	char ida[64], idb[64];
	node_id(ports[0], ida, sizeof(ida));
	node_id(ports[1], idb, sizeof(idb));
	/* Migrating: A still has the key; a key A lacks is redirected with ASK. */
	freeReplyObject(redisCommand(b, "CLUSTER SETSLOT %d IMPORTING %s", (int)slot, ida));
	freeReplyObject(redisCommand(a, "CLUSTER SETSLOT %d MIGRATING %s", (int)slot, idb));
	char key2[80];
	for (int i = 0;; i++) { /* another key of the same slot, through a hash tag */
		snprintf(key2, sizeof(key2), "{%s}x%d", key, i);
		if (kvt_rc_key_slot(key2, strlen(key2)) == slot)
			break;
	}
	/* NOTE: {key} hashes exactly as key, so i = 0 already matches */
	kvt_rc_op op2 = { .key = key2, .key_bytes = strlen(key2), .val = "asked", .val_bytes = 5 };
	CHECK(kvt_rc_run(c, &op2, 1) == KVT_OK);
	CHECK_EQ_INT(op2.rc, KVT_OK);
	kvt_rc_stats st;
	kvt_rc_get_stats(c, &st);
	CHECK_EQ_INT(st.n_ask, 1);
	/* Finish the migration: MIGRATE the old key, then the slot belongs to B. */
	redisReply *m = redisCommand(a, "MIGRATE 127.0.0.1 %d %s 0 5000", ports[1], key);
	CHECK(m && m->type == REDIS_REPLY_STATUS);
	freeReplyObject(m);
	for (int p = 0; p < 3; p++) {
		redisContext *r = raw(ports[p]);
		freeReplyObject(redisCommand(r, "CLUSTER SETSLOT %d NODE %s", (int)slot, idb));
		redisFree(r);
	}
	kvt_rc_op g = { .key = key, .key_bytes = strlen(key) };
	CHECK(kvt_rc_run(c, &g, 1) == KVT_OK);
	CHECK(g.rc == KVT_OK && g.data_bytes == 6 && !memcmp(g.data, "before", 6));
	kvt_rc_ops_release(&g, 1);
	kvt_rc_get_stats(c, &st);
	CHECK_EQ_INT(st.n_moved, 1);
	uint64_t refresh = st.n_refresh;
	usleep(150 * 1000);
	kvt_rc_op g2 = { .key = key2, .key_bytes = strlen(key2) };
	CHECK(kvt_rc_run(c, &g2, 1) == KVT_OK);
	CHECK(g2.rc == KVT_OK && g2.data_bytes == 5 && !memcmp(g2.data, "asked", 5));
	kvt_rc_ops_release(&g2, 1);
	kvt_rc_get_stats(c, &st);
	CHECK(st.n_refresh == refresh + 1); /* the map was reloaded after the MOVED */
	CHECK_EQ_INT(st.n_moved, 1);        /* and it was right: no second redirect */
	redisFree(a);
	redisFree(b);
	kvt_rc_destroy(c);
}

static void test_single_auth(void)
{
	kvt_rc *bad = make(single_seed, false, "not-the-password", 1000, 4);
	kvt_rc_op op = { .key = "s:k", .key_bytes = 3, .val = "v", .val_bytes = 1 };
	check_log_capture();
	CHECK(kvt_rc_run(bad, &op, 1) == KVT_OK);
	CHECK_EQ_INT(op.rc, KVT_EIO);
	CHECK(strstr(check_log_text, "AUTH refused") != NULL);
	CHECK(strstr(check_log_text, "not-the-password") == NULL); /* never logged */
	kvt_log_set_sink(NULL, NULL);
	kvt_rc_destroy(bad);
	kvt_rc *c = make(single_seed, false, single_pw, 1000, 4);
	CHECK(kvt_rc_run(c, &op, 1) == KVT_OK);
	CHECK_EQ_INT(op.rc, KVT_OK);
	kvt_rc_op g = { .key = "s:k", .key_bytes = 3 };
	CHECK(kvt_rc_run(c, &g, 1) == KVT_OK);
	CHECK(g.rc == KVT_OK && g.data_bytes == 1 && ((const char *)g.data)[0] == 'v');
	kvt_rc_ops_release(&g, 1);
	kvt_rc_destroy(c);
}

static void test_failures(void)
{
	/* Nothing listens: fails at once, and the breaker keeps the next round from dialling. */
	kvt_rc *c = make("127.0.0.1:1", false, NULL, 300, 4);
	kvt_rc_op op = { .key = "k", .key_bytes = 1 };
	CHECK(kvt_rc_run(c, &op, 1) == KVT_OK);
	CHECK_EQ_INT(op.rc, KVT_EIO);
	CHECK(kvt_rc_run(c, &op, 1) == KVT_OK);
	CHECK_EQ_INT(op.rc, KVT_EIO);
	kvt_rc_stats st;
	kvt_rc_get_stats(c, &st);
	CHECK_EQ_INT(st.n_connects, 0);
	kvt_rc_destroy(c);
	CHECK(kvt_rc_create(&(kvt_rc_config){ .seeds = "localhost", .connect_timeout_ms = 1, .command_timeout_ms = 1,
					      .pipeline_depth = 1 }, &c) == KVT_EINVAL);

	/* A stopped server: the round ends within the command timeout; it works again after SIGCONT. */
	c = make(single_seed, false, single_pw, 300, 4);
	kvt_rc_op s = { .key = "s:slow", .key_bytes = 6, .val = "1", .val_bytes = 1 };
	CHECK(kvt_rc_run(c, &s, 1) == KVT_OK && s.rc == KVT_OK);
	redisContext *r = redisConnect("127.0.0.1", atoi(strchr(single_seed, ':') + 1));
	redisReply *rep = redisCommand(r, "AUTH %s", single_pw);
	freeReplyObject(rep);
	rep = redisCommand(r, "INFO server");
	const char *pp = strstr(rep->str, "process_id:");
	pid_t pid = pp ? (pid_t)atoi(pp + 11) : 0;
	freeReplyObject(rep);
	redisFree(r);
	CHECK(pid > 0);
	kill(pid, SIGSTOP);
	double t0 = kvt_now_s();
	kvt_rc_op g = { .key = "s:slow", .key_bytes = 6 };
	CHECK(kvt_rc_run(c, &g, 1) == KVT_OK);
	double dt = kvt_now_s() - t0;
	CHECK_EQ_INT(g.rc, KVT_EIO);
	CHECKF(dt < 0.3 + 0.25, "a round against a stopped server took %.3f s (timeout 0.3 s)", dt);
	kill(pid, SIGCONT);
	usleep(300 * 1000); /* past the first back-off */
	CHECK(kvt_rc_run(c, &g, 1) == KVT_OK);
	CHECK_EQ_INT(g.rc, KVT_OK);
	kvt_rc_ops_release(&g, 1);
	kvt_rc_destroy(c);
}

int main(void)
{
	const char *cs = getenv("KVT_TEST_REDIS_CLUSTER"), *ss = getenv("KVT_TEST_REDIS_SINGLE"),
		   *pw = getenv("KVT_TEST_REDIS_SINGLE_PASSWORD"), *ps = getenv("KVT_TEST_REDIS_PORTS");
	if (!cs || !ss || !pw || !ps)
		return check_skip("test_t3_client", "run under tests/remote/redis_cluster.py --single");
	snprintf(cluster_seeds, sizeof(cluster_seeds), "%s", cs);
	snprintf(single_seed, sizeof(single_seed), "%s", ss);
	snprintf(single_pw, sizeof(single_pw), "%s", pw);
	if (sscanf(ps, "%d,%d,%d", &ports[0], &ports[1], &ports[2]) != 3)
		return check_skip("test_t3_client", "KVT_TEST_REDIS_PORTS needs three ports");
	test_slots();
	test_set_get();
	test_redirects();
	test_single_auth();
	test_failures();
	return check_done("test_t3_client");
}
