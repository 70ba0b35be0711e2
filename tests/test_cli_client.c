/* ctest-labels: integration */
/*
 * tests/test_cli_client.c — the `kvtier` daemon client commands (resume,
 * stats, sessions) as a user runs them, where no daemon is needed:
 *
 *  - an unreachable daemon (a closed port, from --url, -c FILE or
 *    $KVTIER_CONFIG) exits EX_UNAVAILABLE with a message naming the URL;
 *  - bad arguments exit EX_USAGE, a bad configuration EX_CONFIG (FILE:LINE);
 *  - `stats --offline` on a real data directory (a T2 file and an index
 *    built here with the T2 and index APIs) reports the rows, bytes and
 *    sessions the index holds (chunk blocks apart), as JSON with the
 *    /v1/stats top-level keys and as a table; a missing index is EX_NOINPUT, a locked one EX_IOERR.
 *
 * Talking to a live daemon is covered by the daemon's end-to-end tests.
 */
#include "check.h"
#include "index.h"
#include "t2_store.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <unistd.h>

static char dir[64], err_path[128];
static char out[1 << 16], err[1 << 16];

/* Run `[ENV] kvtier ARGS`, capture stdout into out and stderr into err; exit status. */
static int run(const char *env, const char *args)
{
	char cmd[4096];
	snprintf(cmd, sizeof(cmd), "env -u KVTIER_CONFIG -u KVTIER_API_KEY %s %s/kvtier %s", env ? env : "",
		 KVT_BINARY_DIR, args);
	return check_run_capture(cmd, err_path, out, sizeof(out), err, sizeof(err));
}

/* A loopback TCP port nobody listens on (bound, then closed). */
static int closed_port(void)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
		return 1;
	close(fd);
	return ntohs(sa.sin_port);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static void test_unreachable(void)
{
	char args[1024], want[512], conf[256], env[512], text[256];
	int port = closed_port();

	snprintf(args, sizeof(args), "stats --url http://127.0.0.1:%d/", port);
	CHECK_EQ_INT(run(NULL, args), EX_UNAVAILABLE);
	snprintf(want, sizeof(want), "kvtier stats: cannot reach the daemon at http://127.0.0.1:%d (", port);
	CHECKF(strstr(err, want) && strstr(err, "); is kvtierd running?"), "stderr: %s", err);
	CHECKF(out[0] == '\0', "stdout: %s", out);

	/* the URL from -c FILE's server.listen; a wildcard address goes through loopback */
	snprintf(conf, sizeof(conf), "%s/client.conf", dir);
	snprintf(text, sizeof(text), "[server]\nlisten = 0.0.0.0:%d\n", port);
	write_file(conf, text);
	snprintf(args, sizeof(args), "sessions -c %s", conf);
	CHECK_EQ_INT(run(NULL, args), EX_UNAVAILABLE);
	snprintf(want, sizeof(want), "kvtier sessions: cannot reach the daemon at http://127.0.0.1:%d (", port);
	CHECKF(strstr(err, want) != NULL, "stderr: %s", err);
	snprintf(args, sizeof(args), "resume chat-42 --json -c %s --api-key k", conf);
	CHECK_EQ_INT(run(NULL, args), EX_UNAVAILABLE);
	snprintf(want, sizeof(want), "kvtier resume: cannot reach the daemon at http://127.0.0.1:%d (", port);
	CHECKF(strstr(err, want) != NULL, "stderr: %s", err);

	/* ... or from $KVTIER_CONFIG; an IPv6 listen address is bracketed */
	snprintf(text, sizeof(text), "[server]\nlisten = [::1]:%d\n", port);
	write_file(conf, text);
	snprintf(env, sizeof(env), "KVTIER_CONFIG=%s", conf);
	CHECK_EQ_INT(run(env, "stats --json"), EX_UNAVAILABLE);
	snprintf(want, sizeof(want), "cannot reach the daemon at http://[::1]:%d (", port);
	CHECKF(strstr(err, want) != NULL, "stderr: %s", err);

	/* a bad configuration: FILE:LINE, EX_CONFIG */
	write_file(conf, "[server]\nlisten = nowhere\n");
	snprintf(args, sizeof(args), "stats -c %s", conf);
	CHECK_EQ_INT(run(NULL, args), EX_CONFIG);
	snprintf(want, sizeof(want), "%s:2: [server] listen", conf);
	CHECKF(strstr(err, want) != NULL, "stderr: %s", err);
	/* an ephemeral port cannot be reached by configuration */
	write_file(conf, "[server]\nlisten = 127.0.0.1:0\n");
	CHECK_EQ_INT(run(NULL, args), EX_USAGE);
	CHECKF(strstr(err, "pass --url") != NULL, "stderr: %s", err);
}

static void test_usage(void)
{
	static const struct { const char *args, *needle; } bad[] = {
		{ "resume", "which session?" },
		{ "resume a b", "one session at a time" },
		{ "resume ../etc", "is not a session id" },
		{ "resume .hidden", "is not a session id" },
		{ "resume s --bogus", "unknown option '--bogus'" },
		{ "resume s --url", "--url needs a value" },
		{ "resume s --url ftp://x", "must start with http://" },
		{ "stats --bogus", "unknown argument '--bogus'" },
		{ "stats --watch 0", "not a number of seconds" },
		{ "stats --watch abc", "not a number of seconds" },
		{ "stats --offline", "--offline needs --data-dir" },
		{ "stats --data-dir /tmp", "--data-dir goes with --offline" },
		{ "stats --offline --data-dir /tmp --watch", "do not apply" },
		{ "stats --api-key", "--api-key needs a value" },
		{ "sessions extra", "unknown argument 'extra'" },
		{ "sessions -c", "-c needs a value" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int st = run(NULL, bad[i].args);
		CHECKF(st == EX_USAGE, "kvtier %s: exit %d", bad[i].args, st);
		CHECKF(strstr(err, bad[i].needle) != NULL, "kvtier %s: stderr: %s", bad[i].args, err);
		if (!strstr(bad[i].args, "ftp:")) /* a bad --url value is named alone */
			CHECKF(strstr(err, "usage:") != NULL, "kvtier %s: no usage line: %s", bad[i].args, err);
	}
	CHECK_EQ_INT(run(NULL, "stats --help"), 0);
	CHECK(strstr(out, "kvtier stats --offline --data-dir DIR") != NULL);
	CHECK_EQ_INT(run(NULL, "--help"), 0);
	CHECK(strstr(out, "kvtier resume SESSION") && strstr(out, "kvtier sessions"));
}

static kvt_db_config ns_cfg(const char *path, uint8_t fp_byte, uint32_t block_tokens)
{
	kvt_db_config c;
	memset(&c, 0, sizeof(c));
	c.path = path;
	memset(c.ns.model_fp, fp_byte, 32);
	c.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	c.ns.block_tokens = block_tokens;
	c.create = true;
	return c;
}

static void put_rows(kvt_db *db, int n, int first, uint8_t codec)
{
	for (int i = 0; i < n; i++) {
		kvt_db_block_row r;
		memset(&r, 0, sizeof(r));
		r.hash[0] = (uint8_t)(first + i + 1);
		r.hash[31] = codec;
		memset(r.parent, 0xEE, 32);
		r.n_tokens = 4;
		for (int k = 0; k < 4; k++)
			r.tokens[k] = (first + i) * 4 + k;
		r.loc.off = (uint64_t)(first + i + 1) * 8192;
		r.loc.extent_bytes = 8192;
		r.loc.stored_bytes = 4500;
		r.loc.generation = (uint64_t)(first + i + 1);
		r.kv_dtype = 1;
		r.codec = codec;
		r.raw_bytes = 9000;
		r.last_use = 1;
		r.kind = first + i == 1 ? KVT_BLOCK_CHUNK : KVT_BLOCK_PREFIX; /* one of model A's rows is a chunk block */
		CHECK_EQ_INT(kvt_db_put_block(db, &r, NULL, NULL, NULL), KVT_OK);
	}
}

static void put_session(kvt_db *db, const char *tenant, const char *id)
{
	int32_t toks[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	kvt_db_session s;
	memset(&s, 0, sizeof(s));
	snprintf(s.id, sizeof(s.id), "%s", id);
	snprintf(s.tenant, sizeof(s.tenant), "%s", tenant);
	s.tokens = toks;
	s.n_tokens = 8;
	CHECK_EQ_INT(kvt_db_put_session(db, &s, NULL, NULL, NULL), KVT_OK);
}

static void test_offline(void)
{
	char data[256], t2[512], idx[512], args[1024];
	snprintf(data, sizeof(data), "%s/data", dir);
	mkdir(data, 0700);
	CHECK_EQ_INT(kvt_index_paths(data, t2, idx, sizeof(t2)), KVT_OK);

	/* no index yet */
	snprintf(args, sizeof(args), "stats --offline --data-dir %s", data);
	CHECK_EQ_INT(run(NULL, args), EX_NOINPUT);
	CHECKF(strstr(err, "no index at") && strstr(err, idx), "stderr: %s", err);

	/* a T2 file of model A (fingerprint 0xA1...) */
	kvt_t2_config tc;
	memset(&tc, 0, sizeof(tc));
	tc.path = t2;
	tc.capacity_bytes = 1u << 20;
	tc.io_mode = KVT_T2_IO_THREADS;
	tc.buffered_ok = true;
	tc.max_raw_bytes = 16384;
	tc.n_io_ctx = 1;
	tc.staging_cap_bytes = 1u << 20;
	memset(tc.model_fp, 0xA1, 32);
	kvt_t2_store *store = NULL;
	CHECK_EQ_INT(kvt_t2_open(&tc, &store), KVT_OK);
	kvt_t2_close(store);
	struct stat st;
	CHECK(stat(t2, &st) == 0);

	/* the index: model A, 4-token blocks: 3 fp8 rows and 2 sessions; model B: 2 rows, 1 session */
	kvt_db *db = NULL;
	kvt_db_config c = ns_cfg(idx, 0xA1, 4);
	CHECK_EQ_INT(kvt_db_open(&c, &db), KVT_OK);
	if (!db)
		return;
	put_rows(db, 3, 0, 1);
	put_session(db, "alice", "chat-1");
	put_session(db, "bob", "chat-2");
	CHECK_EQ_INT(kvt_db_flush(db), KVT_OK);
	int64_t ns_a = kvt_db_ns_id(db);
	kvt_db_close(db);
	c = ns_cfg(idx, 0xB2, 4);
	CHECK_EQ_INT(kvt_db_open(&c, &db), KVT_OK);
	if (!db)
		return;
	put_rows(db, 2, 10, 2);
	put_session(db, "carol", "other");
	CHECK_EQ_INT(kvt_db_flush(db), KVT_OK);
	int64_t ns_b = kvt_db_ns_id(db);
	kvt_db_close(db);

	snprintf(args, sizeof(args), "stats --offline --data-dir %s --json", data);
	CHECK_EQ_INT(run(NULL, args), 0);
	json_error_t je;
	json_t *j = json_loads(out, 0, &je);
	CHECKF(j != NULL, "not JSON (%s): %s", je.text, out);
	if (j) {
		json_t *tiers = json_object_get(j, "tiers"), *nvme = json_array_get(tiers, 2);
		CHECK(json_is_true(json_object_get(j, "offline")));
		CHECK(json_is_object(json_object_get(j, "engine")) && json_is_object(json_object_get(j, "persist")));
		CHECK(json_integer_value(json_object_get(json_object_get(j, "engine"), "requests")) == 0);
		CHECK(json_is_number(json_object_get(j, "uptime_s")) && json_is_string(json_object_get(j, "model")));
		CHECK_EQ_INT(json_array_size(tiers), 3);
		CHECK(!strcmp(json_string_value(json_object_get(json_array_get(tiers, 0), "name")), "hbm"));
		CHECK(!strcmp(json_string_value(json_object_get(json_array_get(tiers, 1), "name")), "host"));
		CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(tiers, 0), "blocks")), 0);
		CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(tiers, 1), "used_bytes")), 0);
		CHECK(!strcmp(json_string_value(json_object_get(nvme, "name")), "nvme"));
		CHECK_EQ_INT(json_integer_value(json_object_get(nvme, "blocks")), 3);           /* model A's rows */
		CHECK_EQ_INT(json_integer_value(json_object_get(nvme, "chunk_blocks")), 1);
		CHECK_EQ_INT(json_integer_value(json_object_get(nvme, "prefix_blocks")), 2);
		CHECK_EQ_INT(json_integer_value(json_object_get(nvme, "used_bytes")), 5 * 8192); /* every extent */
		CHECK_EQ_INT(json_integer_value(json_object_get(nvme, "capacity_bytes")), st.st_size);
		CHECK(fabs(json_number_value(json_object_get(nvme, "compression_ratio")) - 2.0) < 1e-9);
		CHECK(!strcmp(json_string_value(json_object_get(nvme, "dtype")), "fp8"));
		CHECK(json_is_false(json_object_get(nvme, "degraded")));
		CHECK_EQ_INT(json_integer_value(json_object_get(j, "sessions")), 2);
		json_t *ns = json_object_get(j, "namespaces");
		CHECK_EQ_INT(json_array_size(ns), 2);
		for (size_t i = 0; i < json_array_size(ns); i++) {
			json_t *x = json_array_get(ns, i);
			int64_t id = json_integer_value(json_object_get(x, "id"));
			CHECK(id == ns_a || id == ns_b);
			CHECK_EQ_INT(json_integer_value(json_object_get(x, "block_tokens")), 4);
			if (id == ns_a) {
				CHECK_EQ_INT(json_integer_value(json_object_get(x, "blocks")), 3);
				CHECK_EQ_INT(json_integer_value(json_object_get(x, "sessions")), 2);
				CHECK(json_is_true(json_object_get(x, "this_model")));
			} else {
				CHECK_EQ_INT(json_integer_value(json_object_get(x, "blocks")), 2);
				CHECK(json_is_null(json_object_get(x, "sessions"))); /* another model: not reachable */
				CHECK(json_is_false(json_object_get(x, "this_model")));
				CHECK(!strcmp(json_string_value(json_object_get(x, "dtype")), "int8"));
			}
		}
		char hex[65];
		memset(hex, 'a', 64);
		for (int i = 0; i < 64; i += 2)
			hex[i + 1] = '1';
		hex[64] = '\0';
		CHECK(!strcmp(json_string_value(json_object_get(j, "model_fingerprint")), hex));
		json_decref(j);
	}

	/* the table */
	snprintf(args, sizeof(args), "stats --offline --data-dir %s", data);
	CHECK_EQ_INT(run(NULL, args), 0);
	if (getenv("KVT_TEST_VERBOSE"))
		printf("%s", out);
	CHECKF(strstr(out, "offline") && strstr(out, "nvme") && strstr(out, "sessions: 2") && strstr(out, "fp8") &&
		       strstr(out, "40.00 KiB") && strstr(out, "another model") && strstr(out, "1 of 3 (33%)"),
	       "stdout: %s", out);

	/* the index held by another process (a running daemon): EX_IOERR naming the remedy */
	c = ns_cfg(idx, 0xA1, 4);
	CHECK_EQ_INT(kvt_db_open(&c, &db), KVT_OK);
	if (db) {
		put_session(db, "alice", "chat-3"); /* takes the exclusive lock */
		CHECK_EQ_INT(kvt_db_flush(db), KVT_OK);
		int rc = run(NULL, args);
		CHECKF(rc == EX_IOERR, "exit %d, stderr: %s", rc, err);
		CHECKF(strstr(err, "drop --offline") != NULL, "stderr: %s", err);
		kvt_db_close(db);
	}
	/* a garbage index */
	snprintf(args, sizeof(args), "stats --offline --data-dir %s", dir);
	char bad_idx[512];
	snprintf(bad_idx, sizeof(bad_idx), "%s/index.sqlite", dir);
	write_file(bad_idx, "this is not a database, but it is long enough to look like a file header......\n");
	int rc = run(NULL, args);
	CHECKF(rc == EX_DATAERR, "exit %d, stderr: %s", rc, err);
	unlink(bad_idx);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/kvt_cli_client_XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(err_path, sizeof(err_path), "%s/stderr", dir);
	test_unreachable();
	test_usage();
	test_offline();
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return check_done("test_cli_client");
}
