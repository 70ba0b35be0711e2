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
 * Then the tier (tiers/t3_remote.c): block records round trip bit for bit;
 * another model's reader, a flipped byte, a truncated value and a record under
 * another block's key are counted misses (KVT_ECORRUPT), never served; a
 * prefix read stops at the first miss; sessions round trip, per tenant, and a
 * damaged one is refused; a dead cluster is a prompt KVT_EIO and "degraded".
 * With --failover, a master of a replicated cluster is killed: reads fail
 * (never a wrong value) until the replica takes over, then all come back.
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

/* The tier: block records round trip, and every bad record is a counted miss. */
static void test_tier(void)
{
	enum { N = 6, RAW = 368640, BT = 16 };
	uint8_t fp[KVT_HASH_BYTES], fp2[KVT_HASH_BYTES], root[KVT_HASH_BYTES];
	for (int i = 0; i < KVT_HASH_BYTES; i++)
		fp[i] = (uint8_t)i, fp2[i] = (uint8_t)(i + 1), root[i] = (uint8_t)(0xa0 + i);
	kvt_t3_config cfg;
	kvt_t3_config_default(&cfg);
	cfg.rc.seeds = cluster_seeds;
	cfg.rc.command_timeout_ms = 5000; /* not the timeout under test here (sanitizer builds are slow) */
	cfg.prefix = "t3tier:";
	kvt_t3 *t = NULL, *t2 = NULL;
	CHECK(kvt_t3_create(&cfg, fp, &t) == KVT_OK);
	CHECK(kvt_t3_create(&cfg, fp2, &t2) == KVT_OK);
	static kvt_t2_block_meta m[N], got[N];
	uint8_t(*h)[KVT_HASH_BYTES] = calloc(N, KVT_HASH_BYTES);
	uint8_t *pay = malloc((size_t)N * RAW), *back = malloc((size_t)N * RAW);
	const void *pp[N];
	void *bp[N];
	int res[N];
	for (int i = 0; i < N; i++) {
		memset(&m[i], 0, sizeof(m[i]));
		m[i].n_tokens = BT;
		for (int j = 0; j < BT; j++)
			m[i].tokens[j] = 1000 * i + j;
		memcpy(m[i].parent, i ? h[i - 1] : root, KVT_HASH_BYTES);
		KVT_ASSERT(kvt_hash_block(m[i].parent, m[i].tokens, BT, h[i]) == KVT_OK);
		memcpy(m[i].hash, h[i], KVT_HASH_BYTES);
		m[i].codec = 0;
		m[i].raw_bytes = RAW;
		for (int j = 0; j < RAW; j++)
			pay[(size_t)i * RAW + j] = (uint8_t)(j * 7 + i * 13 + j / 1001);
		pp[i] = pay + (size_t)i * RAW;
		bp[i] = back + (size_t)i * RAW;
	}
	CHECK(kvt_t3_put_blocks(t, N - 1, m, pp, res) == KVT_OK);
	int ok = 0;
	for (int i = 0; i < N - 1; i++)
		ok += res[i] == KVT_OK;
	CHECK_EQ_INT(ok, N - 1);
	memset(back, 0, (size_t)N * RAW);
	CHECK(kvt_t3_get_blocks(t, N, (const uint8_t(*)[KVT_HASH_BYTES])h, false, got, bp, RAW, res) == KVT_OK);
	ok = 0;
	for (int i = 0; i < N - 1; i++)
		ok += res[i] == KVT_OK && !memcmp(bp[i], pp[i], RAW) && got[i].n_tokens == BT &&
		      !memcmp(got[i].tokens, m[i].tokens, BT * 4) && !memcmp(got[i].parent, m[i].parent, 32);
	CHECK_EQ_INT(ok, N - 1);
	CHECK_EQ_INT(res[N - 1], KVT_ENOTFOUND); /* never written */
	kvt_t3_stats st;
	kvt_t3_get_stats(t, &st);
	CHECK_EQ_INT(st.hits, N - 1);
	CHECK_EQ_INT(st.misses, 1);
	CHECK_EQ_INT(st.n_writes, N - 1);
	CHECK(st.bytes_out >= (uint64_t)(N - 1) * RAW && st.bytes_out < (uint64_t)(N - 1) * (RAW + 4096));
	CHECK(!st.degraded);

	/* Another model's tier (same keys, as if the salt were shared) never accepts them. */
	CHECK(kvt_t3_get_blocks(t2, N - 1, (const uint8_t(*)[KVT_HASH_BYTES])h, false, got, bp, RAW, res) == KVT_OK);
	int n_corrupt = 0;
	for (int i = 0; i < N - 1; i++)
		n_corrupt += res[i] == KVT_ECORRUPT;
	CHECK_EQ_INT(n_corrupt, N - 1);

	/* A flipped payload byte, a truncated value, and a record under another block's key. */
	kvt_rc *c = make(cluster_seeds, true, NULL, 2000, 4);
	char key[128], key3[128];
	kvt_t3_block_key(t, h[1], key, sizeof(key));
	kvt_rc_op g = { .key = key, .key_bytes = strlen(key) };
	CHECK(kvt_rc_run(c, &g, 1) == KVT_OK && g.rc == KVT_OK);
	uint8_t *v = malloc(g.data_bytes);
	size_t vn = g.data_bytes;
	memcpy(v, g.data, vn);
	kvt_rc_ops_release(&g, 1);
	v[KVT_T2_HEADER_BYTES + 12345] ^= 0x40;
	kvt_t3_block_key(t, h[3], key3, sizeof(key3));
	kvt_rc_op w[3] = {
		{ .key = key, .key_bytes = strlen(key), .val = v, .val_bytes = vn },
		{ .key = key3, .key_bytes = strlen(key3), .val = pp[0], .val_bytes = 1000 },
	};
	CHECK(kvt_rc_run(c, w, 2) == KVT_OK && w[0].rc == KVT_OK && w[1].rc == KVT_OK);
	kvt_t3_get_stats(t, &st);
	uint64_t c0 = st.n_corrupt;
	check_log_capture();
	CHECK(kvt_t3_get_blocks(t, N - 1, (const uint8_t(*)[KVT_HASH_BYTES])h, false, got, bp, RAW, res) == KVT_OK);
	kvt_log_set_sink(NULL, NULL);
	CHECK_EQ_INT(res[0], KVT_OK);
	CHECK_EQ_INT(res[1], KVT_ECORRUPT);
	CHECK_EQ_INT(res[2], KVT_OK);
	CHECK_EQ_INT(res[3], KVT_ECORRUPT);
	CHECK(strstr(check_log_text, "checksum mismatch") != NULL);
	kvt_t3_get_stats(t, &st);
	CHECK_EQ_INT(st.n_corrupt - c0, 2);
	/* A record stored under another block's key: verified, but not this block. */
	kvt_t3_block_key(t, h[4], key3, sizeof(key3));
	kvt_rc_op g4 = { .key = key3, .key_bytes = strlen(key3) };
	CHECK(kvt_rc_run(c, &g4, 1) == KVT_OK && g4.rc == KVT_OK);
	kvt_rc_op w2 = { .key = key, .key_bytes = strlen(key), .val = g4.data, .val_bytes = g4.data_bytes };
	CHECK(kvt_rc_run(c, &w2, 1) == KVT_OK && w2.rc == KVT_OK);
	kvt_rc_ops_release(&g4, 1);
	CHECK(kvt_t3_get_blocks(t, 2, (const uint8_t(*)[KVT_HASH_BYTES])h, true, got, bp, RAW, res) == KVT_OK);
	CHECK_EQ_INT(res[0], KVT_OK);
	CHECK_EQ_INT(res[1], KVT_ECORRUPT);
	/* stop_at_miss: past the first miss nothing is decoded */
	CHECK(kvt_t3_get_blocks(t, 4, (const uint8_t(*)[KVT_HASH_BYTES])h, true, got, bp, RAW, res) == KVT_OK);
	CHECK(res[0] == KVT_OK && res[1] == KVT_ECORRUPT && res[2] == KVT_ENOTFOUND && res[3] == KVT_ENOTFOUND);
	free(v);
	/* bytes after the record: it is the whole value or it is nothing */
	kvt_t3_block_key(t, h[0], key, sizeof(key));
	kvt_rc_op g0 = { .key = key, .key_bytes = strlen(key) };
	CHECK(kvt_rc_run(c, &g0, 1) == KVT_OK && g0.rc == KVT_OK);
	v = malloc(g0.data_bytes + 5000);
	memcpy(v, g0.data, g0.data_bytes);
	memset(v + g0.data_bytes, 0, 5000);
	kvt_rc_op w0 = { .key = key, .key_bytes = strlen(key), .val = v, .val_bytes = g0.data_bytes + 5000 };
	kvt_rc_ops_release(&g0, 1);
	CHECK(kvt_rc_run(c, &w0, 1) == KVT_OK && w0.rc == KVT_OK);
	check_log_capture();
	CHECK(kvt_t3_get_blocks(t, 1, (const uint8_t(*)[KVT_HASH_BYTES])h, true, got, bp, RAW, res) == KVT_OK);
	kvt_log_set_sink(NULL, NULL);
	CHECK_EQ_INT(res[0], KVT_ECORRUPT);
	CHECK(strstr(check_log_text, "record longer than its extent") != NULL);
	free(v);

	/* Sessions: round trip; another tenant's name is another key; a bad record is a miss. */
	int32_t toks[100];
	for (int i = 0; i < 100; i++)
		toks[i] = 7 * i;
	kvt_db_session ses = { .id = "conv-1", .tenant = "acme", .tokens = toks, .n_tokens = 100 };
	memcpy(ses.last_hash, h[2], KVT_HASH_BYTES);
	CHECK(kvt_t3_put_session(t, &ses) == KVT_OK);
	kvt_db_session out;
	CHECK(kvt_t3_get_session(t, "acme", "conv-1", &out) == KVT_OK);
	CHECK(out.n_tokens == 100 && !memcmp(out.tokens, toks, sizeof(toks)) && !memcmp(out.last_hash, h[2], 32) &&
	      !strcmp(out.id, "conv-1") && !strcmp(out.tenant, "acme") && out.created > 0);
	kvt_db_session_deinit(&out);
	CHECK_EQ_INT(kvt_t3_get_session(t, "other", "conv-1", &out), KVT_ENOTFOUND);
	snprintf(key, sizeof(key), "t3tier:s:acme/conv-1");
	kvt_rc_op sg = { .key = key, .key_bytes = strlen(key) };
	CHECK(kvt_rc_run(c, &sg, 1) == KVT_OK && sg.rc == KVT_OK);
	v = malloc(sg.data_bytes);
	vn = sg.data_bytes;
	memcpy(v, sg.data, vn);
	kvt_rc_ops_release(&sg, 1);
	v[vn - 20] ^= 1;
	kvt_rc_op sw = { .key = key, .key_bytes = strlen(key), .val = v, .val_bytes = vn };
	CHECK(kvt_rc_run(c, &sw, 1) == KVT_OK && sw.rc == KVT_OK);
	CHECK_EQ_INT(kvt_t3_get_session(t, "acme", "conv-1", &out), KVT_ECORRUPT);
	free(v);
	kvt_rc_destroy(c);

	/* A dead cluster: every read is a miss with KVT_EIO, within the timeout, and the tier says degraded. */
	kvt_t3_config dead = cfg;
	dead.rc.seeds = "127.0.0.1:1";
	kvt_t3 *td = NULL;
	CHECK(kvt_t3_create(&dead, fp, &td) == KVT_OK);
	double t0 = kvt_now_s();
	CHECK(kvt_t3_get_blocks(td, 3, (const uint8_t(*)[KVT_HASH_BYTES])h, false, got, bp, RAW, res) == KVT_OK);
	CHECK(kvt_now_s() - t0 < 0.5);
	CHECK(res[0] == KVT_EIO && res[1] == KVT_EIO && res[2] == KVT_EIO);
	kvt_t3_get_stats(td, &st);
	CHECK(st.degraded);
	CHECK_EQ_INT(st.n_errors, 3);
	kvt_t3_destroy(td);
	check_log_capture();
	dead.rc.seeds = "127.0.0.1";
	CHECK_EQ_INT(kvt_t3_create(&dead, fp, &td), KVT_EINVAL);
	CHECK(strstr(check_log_text, "seed \"127.0.0.1\" is not host:port") != NULL);
	kvt_log_set_sink(NULL, NULL);

	kvt_t3_destroy(t);
	kvt_t3_destroy(t2);
	free(h);
	free(pay);
	free(back);
}

/*
 * A failover (the cluster of 3 masters with a replica each): the master of a
 * key is killed; meanwhile reads fail (KVT_EIO, never a wrong value); once the
 * replica is promoted the client finds it (the map reloaded) and every value
 * reads back.
 */
static void test_failover(const char *fseeds)
{
	enum { N = 60 };
	kvt_rc *c = make(fseeds, true, NULL, 500, 8);
	static char keys[N][32], vals[N][32];
	kvt_rc_op ops[N];
	for (int i = 0; i < N; i++) {
		snprintf(keys[i], sizeof(keys[i]), "fo:k%d", i);
		snprintf(vals[i], sizeof(vals[i]), "fo-value-%d", i);
		ops[i] = (kvt_rc_op){ .key = keys[i], .key_bytes = strlen(keys[i]), .val = vals[i], .val_bytes = strlen(vals[i]) };
	}
	CHECK(kvt_rc_run(c, ops, N) == KVT_OK);
	int n_ok = 0;
	for (int i = 0; i < N; i++)
		n_ok += ops[i].rc == KVT_OK;
	CHECK_EQ_INT(n_ok, N);
	/* the master that holds keys[0]: a replica answers MOVED to a plain GET */
	pid_t pid = 0;
	for (const char *p = fseeds; p && *p && !pid;) {
		int port = atoi(strchr(p, ':') + 1);
		redisContext *r = raw(port);
		redisReply *g = redisCommand(r, "GET %s", keys[0]);
		if (g->type == REDIS_REPLY_STRING) {
			freeReplyObject(redisCommand(r, "WAIT 1 5000")); /* its replica has every key */
			redisReply *info = redisCommand(r, "INFO server");
			const char *pp = strstr(info->str, "process_id:");
			pid = pp ? (pid_t)atoi(pp + 11) : 0;
			freeReplyObject(info);
		}
		freeReplyObject(g);
		redisFree(r);
		p = strchr(p, ',');
		p = p ? p + 1 : NULL;
	}
	CHECK(pid > 0);
	if (pid <= 0) {
		kvt_rc_destroy(c);
		return;
	}
	kvt_rc_stats st0, st1;
	kvt_rc_get_stats(c, &st0);
	kill(pid, SIGKILL);
	double t0 = kvt_now_s(), t_back = 0;
	int wrong = 0, n_eio = 0;
	while (kvt_now_s() - t0 < 30) {
		for (int i = 0; i < N; i++)
			ops[i] = (kvt_rc_op){ .key = keys[i], .key_bytes = strlen(keys[i]) };
		CHECK(kvt_rc_run(c, ops, N) == KVT_OK);
		int good = 0;
		for (int i = 0; i < N; i++) {
			if (ops[i].rc == KVT_OK)
				good += ops[i].data_bytes == strlen(vals[i]) && !memcmp(ops[i].data, vals[i], ops[i].data_bytes);
			wrong += ops[i].rc == KVT_OK &&
				 (ops[i].data_bytes != strlen(vals[i]) || memcmp(ops[i].data, vals[i], ops[i].data_bytes));
			n_eio += ops[i].rc == KVT_EIO;
		}
		kvt_rc_ops_release(ops, N);
		if (good == N) {
			t_back = kvt_now_s() - t0;
			break;
		}
		usleep(100 * 1000);
	}
	kvt_rc_get_stats(c, &st1);
	CHECKF(t_back > 0, "the keys of the killed master never came back through its replica");
	CHECK_EQ_INT(wrong, 0);
	CHECK(n_eio > 0);                      /* the gap was seen, as misses */
	CHECK(st1.n_refresh > st0.n_refresh); /* and the map reloaded to find the new master */
	printf("failover: every key back after %.1f s (%d reads failed meanwhile)\n", t_back, n_eio);
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
	test_tier();
	const char *fo = getenv("KVT_TEST_REDIS_FAILOVER");
	if (fo)
		test_failover(fo);
	else
		printf("test_t3_client: no failover cluster (redis_cluster.py --failover): that part not run\n");
	return check_done("test_t3_client");
}
