/* ctest-labels: unit */
/*
 * tests/test_config.c — kvtierd's configuration file (engine/serve/config.h).
 *
 *  - the built-in defaults are the documented ones;
 *  - configs/kvtier.conf parses to exactly the defaults, and lists every key
 *    kvt_config_write knows, in its section;
 *  - each class of error (unknown section, unknown key with a suggestion,
 *    duplicate key, bad number / size / fraction / duration / bool / enum,
 *    out of range, bad listen address, bad api_keys, syntax) names FILE:LINE,
 *    the key and the allowed values, and leaves the config unchanged;
 *  - sizes, durations, booleans, quoting and comments parse as documented;
 *  - kvt_config_find follows -c, then $KVTIER_CONFIG;
 *  - kvt_config_set applies one key or fails with the caller's prefix;
 *  - kvt_config_validate checks cross-key rules; kvt_config_write round-trips
 *    (API keys excepted: they are never printed).
 */
#include "check.h"
#include "config.h"
#include "scheduler.h"
#include "manager.h"
#include "t2_store.h"

#include <unistd.h>

static char g_dir[64], g_path[128];

/* Write text to the temp config file. */
static void put(const char *text)
{
	FILE *f = fopen(g_path, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	fputs(text, f);
	fclose(f);
}

/* Load text over the defaults; rc, with the error in err. The config must be unchanged on failure. */
static int load_text(const char *text, kvt_config *c, char *err, size_t cap)
{
	kvt_config before;
	put(text);
	kvt_config_default(c);
	memcpy(&before, c, sizeof(before));
	err[0] = '\0';
	int rc = kvt_config_load(c, g_path, err, cap);
	if (rc != KVT_OK)
		CHECKF(memcmp(&before, c, sizeof(before)) == 0, "a failed load changed the config (%s)", err);
	return rc;
}

/* The load of text fails at line `line` with every needle in the message. */
#define EXPECT_ERR(text, line, ...)                                                                      \
	do {                                                                                             \
		const char *needles[] = { __VA_ARGS__, NULL };                                           \
		char err_[1024], pre_[256];                                                              \
		kvt_config c_;                                                                          \
		CHECK_EQ_INT(load_text(text, &c_, err_, sizeof(err_)), KVT_EINVAL);                     \
		snprintf(pre_, sizeof(pre_), "%s:%d: ", g_path, line);                                   \
		CHECKF(strncmp(err_, pre_, strlen(pre_)) == 0, "want prefix \"%s\", got \"%s\"", pre_, err_); \
		for (int i_ = 0; needles[i_]; i_++)                                                      \
			CHECKF(strstr(err_, needles[i_]) != NULL, "\"%s\" not in \"%s\"", needles[i_], err_); \
	} while (0)

static void test_defaults(void)
{
	kvt_config c;
	kvt_config_default(&c);
	CHECK(strcmp(c.listen_host, "127.0.0.1") == 0 && c.listen_port == 8080);
	/* [store]: off by default */
	CHECK(!kvt_config_store_enabled(&c) && c.store_listen_port == 0);
	CHECK(c.store_share == 0.25f && c.store_max_value == (512u << 20) && c.store_durable);
	CHECK(c.store_exists_lease_s == 5 && c.store_max_connections == 1024);
	CHECK_EQ_INT(c.server_threads, 4);
	CHECK_EQ_INT(c.max_connections, 1024);
	CHECK_EQ_INT(c.max_connections_per_ip, 64);
	CHECK(c.header_timeout_s == 15);
	CHECK_EQ_INT(c.n_api_keys, 0);
	CHECK(c.api_key_file[0] == '\0' && c.secret_file[0] == '\0');
	CHECK_EQ_INT(c.max_concurrent, 32);
	CHECK_EQ_INT(c.max_queue, 64);
	CHECK_EQ_INT(c.max_header_bytes, 16 * 1024);
	CHECK_EQ_INT(c.max_body_bytes, 1024 * 1024);
	CHECK_EQ_INT(c.max_tokens_limit, 4096);
	CHECK_EQ_INT(c.default_max_tokens, 256);
	CHECK_EQ_INT(c.max_n, 4);
	CHECK(c.request_timeout_s == 600 && c.drain_timeout_s == 30);
	CHECK(strcmp(c.model_path, "models/SmolLM2-135M-Instruct.Q4_1.gguf") == 0);
	CHECK_EQ_INT(c.device, KVT_DEVICE_AUTO);
	CHECK_EQ_INT(c.model_threads, 0);
	CHECK_EQ_INT(c.max_ctx, 4096);
	CHECK_EQ_INT(c.max_batch, 256);
	CHECK_EQ_INT(c.block_tokens, 16);
	CHECK_EQ_INT(c.persist, KVT_PERSIST_END_OF_TURN);
	CHECK(c.end_turn_s == 1.0 && c.cache_enabled);
	CHECK_EQ_INT(c.max_running, 16);
	CHECK_EQ_INT(c.prefill_chunk, 256);
	CHECK_EQ_INT(c.chunk_reuse, KVT_CHUNK_REUSE_MARKED);
	CHECK_EQ_INT(c.chunk_min_tokens, 64);
	CHECK_EQ_INT(c.act_int8, 1); /* activations = int8 */
	CHECK(c.chunk_recompute == 0.15f && c.chunk_share == 0.5f);
	CHECK(c.hbm.capacity_auto && c.hbm.capacity_bytes == 0 && c.hbm.high == 0.90f && c.hbm.low == 0.75f);
	CHECK(c.host.capacity_auto && c.host.high == 0.90f && c.host.low == 0.80f);
	CHECK_EQ_INT(c.host_dtype, KVT_KV_CODEC_INT8KV);
	CHECK_EQ_INT(c.nvme_f16, 1); /* [tier.nvme] dtype = f16: the NVMe copy exact */
	CHECK(c.nvme.capacity_auto && c.nvme.capacity_bytes == 0 && c.nvme.high == 0.95f &&
	      c.nvme.low == 0.85f);
	/* the manager's own defaults agree */
	kvt_tm_config tm;
	kvt_tm_config_default(&tm);
	CHECK(tm.high[KVT_TIER_HBM] == c.hbm.high && tm.low[KVT_TIER_HBM] == c.hbm.low);
	CHECK(tm.high[KVT_TIER_HOST] == c.host.high && tm.low[KVT_TIER_HOST] == c.host.low);
	CHECK(tm.high[KVT_TIER_NVME] == c.nvme.high && tm.low[KVT_TIER_NVME] == c.nvme.low);
	CHECK(tm.t1_codec == c.host_dtype && tm.persist == c.persist && tm.end_turn_s == c.end_turn_s);
	CHECK(tm.n_io_threads == c.io_threads);
	kvt_sched_config sc;
	kvt_sched_config_default(&sc);
	CHECK(sc.chunk_recompute == c.chunk_recompute && sc.chunk_share == c.chunk_share);
	kvt_server_config srv;
	kvt_server_config_default(&srv);
	CHECK(srv.chunk_reuse == c.chunk_reuse && srv.chunk_min_tokens == c.chunk_min_tokens);
	CHECK(c.nvme_path[0] == '\0' && c.nvme_queue_depth == 32 && !c.nvme_compression);
	CHECK_EQ_INT(c.nvme_io, KVT_T2_IO_AUTO);
	CHECK_EQ_INT(c.io_threads, 2);
	CHECK(strcmp(c.data_dir, "./kvtier-data") == 0 && c.index_path[0] == '\0');
	CHECK(c.log_file[0] == '\0' && c.log_level == KVT_LOG_INFO);
	CHECK(c.source[0] == '\0');
	char err[512];
	CHECKF(kvt_config_validate(&c, err, sizeof(err)) == KVT_OK, "%s", err);
}

/* "section/key" of every "key = value" line in text, into out (space-separated, each followed by ' '). */
static void keys_of(const char *text, char *out, size_t cap)
{
	char sec[512] = "";
	size_t n = 0;
	out[0] = '\0';
	while (*text) {
		const char *e = strchr(text, '\n');
		size_t len = e ? (size_t)(e - text) : strlen(text);
		char line[512];
		snprintf(line, sizeof(line), "%.*s", (int)(len < 511 ? len : 511), text);
		if (line[0] == '[') {
			char *rb = strchr(line, ']');
			if (rb)
				*rb = '\0';
			snprintf(sec, sizeof(sec), "%s", line + 1);
		} else if (line[0] != '#' && line[0] && strchr(line, '=')) {
			char *sp = strpbrk(line, " =");
			*sp = '\0';
			n += (size_t)snprintf(out + n, cap - n, "%s/%s ", sec, line);
		}
		text += len + (e ? 1 : 0);
	}
}

static void test_shipped_file(void)
{
	char conf[512], err[1024];
	kvt_config c, d;
	snprintf(conf, sizeof(conf), "%s/configs/kvtier.conf", KVT_SOURCE_DIR);
	kvt_config_default(&c);
	kvt_config_default(&d);
	int rc = kvt_config_load(&c, conf, err, sizeof(err));
	CHECKF(rc == KVT_OK, "%s", err);
	CHECK(strcmp(c.source, conf) == 0);
	memset(c.source, 0, sizeof(c.source));
	CHECK(memcmp(&c, &d, sizeof(c)) == 0); /* exactly the built-in defaults */

	/* every key kvt_config_write knows is documented (set) in the shipped file, in its section */
	char *written = NULL, *shipped = NULL;
	size_t wn = 0, sn = 0;
	FILE *f = open_memstream(&written, &wn);
	CHECK_EQ_INT(kvt_config_write(&d, f), KVT_OK);
	fclose(f);
	f = fopen(conf, "r");
	CHECK(f != NULL);
	shipped = calloc(1, 1 << 20);
	if (f) {
		sn = fread(shipped, 1, (1 << 20) - 1, f);
		fclose(f);
	}
	(void)sn;
	static char wk[8192], sk[8192];
	keys_of(written, wk, sizeof(wk));
	keys_of(shipped, sk, sizeof(sk));
	int n_keys = 0;
	for (char *p = wk; *p;) {
		char *sp = strchr(p, ' ');
		char one[160];
		snprintf(one, sizeof(one), "%.*s ", (int)(sp - p), p);
		CHECKF(strstr(sk, one) != NULL, "kvtier.conf lacks %s", one);
		n_keys++;
		p = sp + 1;
	}
	CHECKF(n_keys >= 40, "only %d keys written", n_keys);
	CHECKF(strlen(wk) == strlen(sk), "the shipped file sets keys the writer does not know:\n%s\nvs\n%s", sk, wk);
	free(written);
	free(shipped);
}

static void test_errors(void)
{
	/* unknown section: the allowed list */
	EXPECT_ERR("[server]\nlisten = 127.0.0.1:1\n\n[tier.ssd]\n", 4, "unknown section [tier.ssd]",
		   "allowed: server, model, cache, scheduler, tenants, tier.hbm, tier.host, tier.nvme, tier.remote, store, index, log");
	/* unknown key: the closest key of the section */
	EXPECT_ERR("# c\n[cache]\nblok_tokens = 16\n", 3, "unknown key 'blok_tokens' in [cache]",
		   "did you mean 'block_tokens'?", "keys of [cache]: block_tokens, persist");
	EXPECT_ERR("[tier.host]\nhigh_watermrk = 0.9\n", 2, "did you mean 'high_watermark'?");
	/* the right key in the wrong section */
	EXPECT_ERR("[server]\nblock_tokens = 16\n", 2, "unknown key 'block_tokens' in [server]",
		   "did you mean 'block_tokens' in [cache]?");
	/* nothing close: no suggestion, but the list */
	EXPECT_ERR("[log]\nverbosity = 3\n", 2, "unknown key 'verbosity' in [log]", "keys of [log]: file, level");
	/* duplicate key */
	EXPECT_ERR("[model]\nthreads = 2\n[server]\nthreads = 4\n[model]\nthreads = 3\n", 6,
		   "duplicate key 'threads' in [model]", "first set on line 2");
	/* bad values of every type */
	EXPECT_ERR("[server]\nmax_queue = lots\n", 2, "[server] max_queue", "not a whole number", "allowed: 0 .. 1048576");
	EXPECT_ERR("[server]\nmax_queue = -1\n", 2, "not a whole number");
	EXPECT_ERR("[server]\nmax_queue = 99999999999999999999999\n", 2, "not a whole number");
	EXPECT_ERR("[cache]\nblock_tokens = 0\n", 2, "[cache] block_tokens = 0: out of range", "allowed: 1 .. 256");
	EXPECT_ERR("[cache]\nblock_tokens = 257\n", 2, "out of range", "allowed: 1 .. 256");
	EXPECT_ERR("[tier.nvme]\ncapacity = 8X\n", 2, "[tier.nvme] capacity = \"8X\": not a size", "K/M/G/T/P");
	EXPECT_ERR("[tier.nvme]\ncapacity = 2P\n", 2, "[tier.nvme] capacity = 2P: out of range", "0 .. 1P");
	EXPECT_ERR("[tier.nvme]\ncapacity = 99999999T\n", 2, "out of range");
	EXPECT_ERR("[server]\nmax_body_bytes = 12\n", 2, "[server] max_body_bytes = 12: out of range", "bytes 1K .. 1G");
	EXPECT_ERR("[tier.hbm]\nhigh_watermark = 1.5\n", 2, "[tier.hbm] high_watermark = 1.5: out of range",
		   "allowed: > 0 .. 1");
	EXPECT_ERR("[tier.hbm]\nhigh_watermark = 0\n", 2, "out of range");
	EXPECT_ERR("[tier.hbm]\nlow_watermark = half\n", 2, "not a fraction");
	EXPECT_ERR("[server]\ndrain_timeout = 10min\n", 2, "[server] drain_timeout = \"10min\": not a duration", "250ms");
	EXPECT_ERR("[server]\ndrain_timeout = 7200\n", 2, "out of range", "0 .. 3600 seconds");
	EXPECT_ERR("[cache]\nenabled = maybe\n", 2, "[cache] enabled = \"maybe\": not a boolean",
		   "true|false|yes|no|on|off|1|0");
	EXPECT_ERR("[model]\ndevice = tpu\n", 2, "[model] device = \"tpu\": unknown value", "allowed: auto|cuda|cpu");
	EXPECT_ERR("[model]\nchat_template = qwen\n", 2, "[model] chat_template = \"qwen\": unknown value",
		   "allowed: auto|chatml|gemma|mistral|llama3");
	EXPECT_ERR("[cache]\npersist = never\n", 2, "allowed: end_of_turn|write_back");
	EXPECT_ERR("[model]\nactivations = fp8\n", 2, "[model] activations = \"fp8\": unknown value", "allowed: int16|int8");
	{
		kvt_config c3;
		char e3[256];
		CHECKF(load_text("[model]\nactivations = int8\n", &c3, e3, sizeof(e3)) == KVT_OK, "%s", e3);
		CHECK_EQ_INT(c3.act_int8, 1);
	}
	EXPECT_ERR("[tier.host]\ndtype = bf16\n", 2, "allowed: f16|fp8|int8");
	EXPECT_ERR("[tier.nvme]\nio = aio\n", 2, "allowed: auto|uring|threads");
	EXPECT_ERR("[tier.nvme]\ncompression = zstd\n", 2, "allowed: none|lz4");
	EXPECT_ERR("[log]\nlevel = trace\n", 2, "allowed: error|warn|info|debug");
	/* listen */
	EXPECT_ERR("[server]\nlisten = localhost:8080\n", 2, "numeric IPv4", "127.0.0.1:8080");
	EXPECT_ERR("[server]\nlisten = 127.0.0.1\n", 2, "expected HOST:PORT");
	EXPECT_ERR("[server]\nlisten = 127.0.0.1:70000\n", 2, "0..65535");
	EXPECT_ERR("[server]\nlisten = ::1:80\n", 2, "needs brackets");
	/* [store] */
	EXPECT_ERR("[store]\nlisten = localhost:6379\n", 2, "[store] listen", "numeric IPv4");
	EXPECT_ERR("[store]\nlisten = 6379\n", 2, "[store] listen", "expected HOST:PORT");
	EXPECT_ERR("[store]\nshare = 0\n", 2, "[store] share = 0: out of range", "allowed: > 0 .. 0.9");
	EXPECT_ERR("[store]\nshare = 0.95\n", 2, "[store] share = 0.95: out of range");
	EXPECT_ERR("[store]\nshare = most\n", 2, "[store] share", "not a fraction");
	EXPECT_ERR("[store]\nmax_value = 1K\n", 2, "[store] max_value = 1K: out of range", "1M .. 16G");
	EXPECT_ERR("[store]\nmax_value = 32G\n", 2, "[store] max_value = 32G: out of range");
	EXPECT_ERR("[store]\ndurable = sometimes\n", 2, "[store] durable = \"sometimes\": not a boolean");
	EXPECT_ERR("[store]\nexists_lease = 2h\n", 2, "[store] exists_lease = \"2h\": not a duration");
	EXPECT_ERR("[store]\nexists_lease = 7200\n", 2, "[store] exists_lease = 7200: out of range");
	EXPECT_ERR("[store]\nmax_connections = 0\n", 2, "[store] max_connections = 0: out of range");
	EXPECT_ERR("[store]\nport = 6379\n", 2, "[store]", "port");
	{
		kvt_config c3;
		char e3[256];
		CHECKF(load_text("[store]\nlisten = 127.0.0.1:0\nshare = 0.5\nmax_value = 64M\ndurable = no\n"
				 "exists_lease = 250ms\nmax_connections = 300\n",
				 &c3, e3, sizeof(e3)) == KVT_OK,
		       "%s", e3);
		CHECK(kvt_config_store_enabled(&c3) && !strcmp(c3.store_listen_host, "127.0.0.1") && c3.store_listen_port == 0);
		CHECK(c3.store_share == 0.5f && c3.store_max_value == (64u << 20) && !c3.store_durable);
		CHECK(c3.store_exists_lease_s == 0.25 && c3.store_max_connections == 300);
		CHECKF(load_text("[store]\nlisten = \"\"\n", &c3, e3, sizeof(e3)) == KVT_OK, "%s", e3);
		CHECK(!kvt_config_store_enabled(&c3));
		CHECKF(load_text("[store]\nlisten = [::1]:6380\n", &c3, e3, sizeof(e3)) == KVT_OK, "%s", e3);
		CHECK(!strcmp(c3.store_listen_host, "::1") && c3.store_listen_port == 6380);
		CHECK(kvt_config_host_loopback(c3.store_listen_host) && !kvt_config_host_loopback("0.0.0.0") &&
		      !kvt_config_host_loopback(""));
	}
	/* api keys: the tenant name check, and the key is never echoed */
	EXPECT_ERR("[server]\napi_keys = \"alice:s3cret, .bob:other\"\n", 2, "[server] api_keys", "tenant \".bob\"",
		   "not a valid name");
	{
		char err[1024];
		kvt_config c;
		load_text("[server]\napi_keys = \"alice:s3cret, .bob:hunter2\"\n", &c, err, sizeof(err));
		CHECKF(strstr(err, "hunter2") == NULL && strstr(err, "s3cret") == NULL, "%s", err);
	}
	EXPECT_ERR("[server]\napi_keys = \"alice:k1, bob:k1\"\n", 2, "the same key is given twice");
	EXPECT_ERR("[server]\napi_keys = \"alice:k1, k2\"\n", 2, "entry 2 has no tenant");
	EXPECT_ERR("[server]\napi_keys = \"alice:\"\n", 2, "must be 1..255 bytes");
	EXPECT_ERR("[server]\napi_keys = \"a:1,b:2,c:3,d:4,e:5,f:6,g:7,h:8,i:9,j:10,k:11,l:12,m:13,n:14,o:15,p:16,q:17\"\n",
		   2, "more than 16 keys");
	/* retention quotas */
	EXPECT_ERR("[tenants]\nretain_quota = \"alice:64M, bob\"\n", 2, "[tenants] retain_quota", "is not tenant:SIZE");
	EXPECT_ERR("[tenants]\nretain_quota = \"alice:lots\"\n", 2, "not a size like 64M");
	EXPECT_ERR("[tenants]\nretain_quota_host = \"a/b:1M\"\n", 2, "[tenants] retain_quota_host", "neither * nor a tenant");
	EXPECT_ERR("[tenants]\nretain_quota = \"alice:1M, alice:2M\"\n", 2, "given twice");
	EXPECT_ERR("[tenants]\nretain_quota = \"alice:1M,\"\n", 2, "ends with a comma");
	EXPECT_ERR("[cache]\nretain_tier = ssd\n", 2, "[cache] retain_tier", "hbm|host|nvme");
	/* chunk reuse */
	EXPECT_ERR("[cache]\nchunk_reuse = all\n", 2, "[cache] chunk_reuse = \"all\": unknown value",
		   "allowed: off|marked|tools");
	EXPECT_ERR("[cache]\nchunk_min_tokens = 0\n", 2, "[cache] chunk_min_tokens = 0: out of range", "allowed: 1 .. 65536");
	EXPECT_ERR("[cache]\nchunk_min_tokens = 65537\n", 2, "out of range", "allowed: 1 .. 65536");
	EXPECT_ERR("[cache]\nchunk_min_tokens = many\n", 2, "not a whole number", "allowed: 1 .. 65536");
	EXPECT_ERR("[cache]\nchunk_recompute = 1.5\n", 2, "[cache] chunk_recompute = 1.5: out of range", "allowed: 0 .. 1");
	EXPECT_ERR("[cache]\nchunk_recompute = -0.1\n", 2, "out of range", "allowed: 0 .. 1");
	EXPECT_ERR("[cache]\nchunk_recompute = 15%\n", 2, "[cache] chunk_recompute = \"15%\": not a fraction",
		   "allowed: 0 .. 1");
	EXPECT_ERR("[cache]\nchunk_share = 2\n", 2, "[cache] chunk_share = 2: out of range", "allowed: 0 .. 1");
	EXPECT_ERR("[cache]\nchunk_share = half\n", 2, "not a fraction", "allowed: 0 .. 1");
	/* strings */
	{
		char text[8400];
		snprintf(text, sizeof(text), "[log]\nfile = /%05000d\n", 0);
		EXPECT_ERR(text, 2, "[log] file: value is 5001 bytes", "at most 4095");
	}
	EXPECT_ERR("[log]\nfile = \"/var/log/kvtier.log\n", 2, "unterminated quoted string");
	EXPECT_ERR("[log]\nfile = \"/a\" b\n", 2, "text after the closing quote");
	/* syntax */
	EXPECT_ERR("listen = 127.0.0.1:80\n", 1, "before any [section]");
	EXPECT_ERR("[server]\n\nthis line has no equals sign\n", 3, "expected \"key = value\"");
	EXPECT_ERR("[server\n", 1, "without ']'");
	EXPECT_ERR("[server] extra\n", 1, "text after the section header");
	EXPECT_ERR("[server]\n= 5\n", 2, "a value without a key name");
	{
		char text[9000];
		memset(text, 'x', sizeof(text));
		memcpy(text, "[log]\nfile = ", 13);
		text[sizeof(text) - 2] = '\n';
		text[sizeof(text) - 1] = '\0';
		EXPECT_ERR(text, 2, "line too long");
	}
	{
		/* a NUL byte */
		FILE *f = fopen(g_path, "wb");
		fwrite("[log]\nlevel = in\0fo\n", 1, 20, f);
		fclose(f);
		kvt_config c;
		char err[512], pre[256];
		kvt_config_default(&c);
		CHECK_EQ_INT(kvt_config_load(&c, g_path, err, sizeof(err)), KVT_EINVAL);
		snprintf(pre, sizeof(pre), "%s:2: a NUL byte", g_path);
		CHECKF(strncmp(err, pre, strlen(pre)) == 0, "%s", err);
	}
	/* nothing half-applied: the good lines before the bad one are not applied */
	{
		kvt_config c, d;
		char err[512];
		kvt_config_default(&d);
		CHECK_EQ_INT(load_text("[server]\nlisten = 0.0.0.0:9000\nthreads = 8\n[model]\ndevice = gpu\n", &c, err,
				       sizeof(err)),
			     KVT_EINVAL);
		CHECK(memcmp(&c, &d, sizeof(c)) == 0);
	}
	/* a missing file */
	{
		kvt_config c;
		char err[512], path[256];
		kvt_config_default(&c);
		snprintf(path, sizeof(path), "%s/absent.conf", g_dir);
		CHECK_EQ_INT(kvt_config_load(&c, path, err, sizeof(err)), KVT_ENOTFOUND);
		CHECKF(strstr(err, path) && strstr(err, "No such file"), "%s", err);
	}
}

static void test_values(void)
{
	kvt_config c;
	char err[1024];
	int rc = load_text("\xEF\xBB\xBF# a BOM, comments and blank lines\n"
			   "; semicolon comment\n"
			   "\n"
			   "[server]   # trailing comment\n"
			   "  listen = [::1]:9090   ; comment\n"
			   "api_keys = \"alice:k-1, bob.team:k_2\"\n"
			   "max_header_bytes = 32K\n"
			   "max_body_bytes = 1.5M\n"
			   "request_timeout = 250ms\n"
			   "drain_timeout = 2.5s\n"
			   "secret_file = \"/etc/kvtier/secret #1; x\"\n"
			   "api_key_file=/etc/kvtier/keys#not-a-comment\n"
			   "[model]\n"
			   "device = cpu\n"
			   "threads = 4\n"
			   "chat_template = gemma\n"
			   "[cache]\n"
			   "enabled = off\n"
			   "persist = write_back\n"
			   "end_of_turn_deadline = 0.5\n"
			   "block_tokens = 32\n"
			   "[tier.hbm]\n"
			   "capacity = 512M\n"
			   "[tier.host]\n"
			   "capacity = 2GiB\n"
			   "dtype = int8\n"
			   "high_watermark = 1\n"
			   "low_watermark = 0\n"
			   "[tier.nvme]\n"
			   "capacity = 0\n"
			   "compression = lz4\n"
			   "io = threads\n"
			   "path = \"\"\n"
			   "[index]\n"
			   "data_dir = \"/var/lib/kvtier\"\n"
			   "[log]\n"
			   "level = debug\n",
			   &c, err, sizeof(err));
	CHECKF(rc == KVT_OK, "%s", err);
	CHECK(strcmp(c.listen_host, "::1") == 0 && c.listen_port == 9090);
	CHECK_EQ_INT(c.n_api_keys, 2);
	CHECK(strcmp(c.api_keys[0].tenant, "alice") == 0 && strcmp(c.api_keys[0].key, "k-1") == 0);
	CHECK(strcmp(c.api_keys[1].tenant, "bob.team") == 0 && strcmp(c.api_keys[1].key, "k_2") == 0);
	CHECK_EQ_INT(c.max_header_bytes, 32768);
	CHECK_EQ_INT(c.max_body_bytes, 1572864);
	CHECK(fabs(c.request_timeout_s - 0.25) < 1e-12 && c.drain_timeout_s == 2.5);
	CHECK(strcmp(c.secret_file, "/etc/kvtier/secret #1; x") == 0);
	CHECK(strcmp(c.api_key_file, "/etc/kvtier/keys#not-a-comment") == 0);
	CHECK(c.device == KVT_DEVICE_CPU && c.model_threads == 4 && c.chat_template == 2 /* gemma */);
	CHECK(!c.cache_enabled && c.persist == KVT_PERSIST_WRITE_BACK && c.end_turn_s == 0.5 && c.block_tokens == 32);
	CHECK(!c.hbm.capacity_auto && c.hbm.capacity_bytes == 512ull << 20);
	CHECK(!c.host.capacity_auto && c.host.capacity_bytes == 2ull << 30 && c.host_dtype == KVT_KV_CODEC_INT8);
	CHECK(c.host.high == 1.0f && c.host.low == 0.0f);
	CHECK(c.nvme.capacity_bytes == 0 && c.nvme_compression && c.nvme_io == KVT_T2_IO_THREADS && !c.nvme_path[0]);
	CHECK(strcmp(c.data_dir, "/var/lib/kvtier") == 0 && c.log_level == KVT_LOG_DEBUG);
	CHECKF(kvt_config_validate(&c, err, sizeof(err)) == KVT_OK, "%s", err);

	/* a single bare key belongs to tenant "default" */
	rc = load_text("[server]\napi_keys = sk-only\n", &c, err, sizeof(err));
	CHECKF(rc == KVT_OK, "%s", err);
	CHECK(c.n_api_keys == 1 && strcmp(c.api_keys[0].tenant, "default") == 0 && strcmp(c.api_keys[0].key, "sk-only") == 0);

	/* every boolean spelling */
	static const char *const t[] = { "true", "yes", "on", "1", "TRUE", "On" }, *const f[] = { "false", "no", "off", "0", "No" };
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		err[0] = '\0';
		kvt_config_default(&c);
		c.cache_enabled = false;
		CHECK(kvt_config_set(&c, "cache", "enabled", t[i], err, sizeof(err)) == KVT_OK && c.cache_enabled);
	}
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		err[0] = '\0';
		CHECK(kvt_config_set(&c, "cache", "enabled", f[i], err, sizeof(err)) == KVT_OK && !c.cache_enabled);
	}
	/* sizes */
	static const struct { const char *s; uint64_t v; } sizes[] = {
		{ "0", 0 }, { "4096", 4096 }, { "1K", 1024 }, { "1k", 1024 }, { "64M", 64ull << 20 },
		{ "2G", 2ull << 30 }, { "3T", 3ull << 40 }, { "1.5G", 3ull << 29 }, { "10MiB", 10ull << 20 },
		{ "10MB", 10ull << 20 }, { "512B", 512 }, { "1P", 1ull << 50 }, { "0.5p", 1ull << 49 }, { "1PiB", 1ull << 50 },
	};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		err[0] = '\0';
		rc = kvt_config_set(&c, "tier.nvme", "capacity", sizes[i].s, err, sizeof(err));
		CHECKF(rc == KVT_OK && c.nvme.capacity_bytes == sizes[i].v, "%s -> %llu (%s)", sizes[i].s,
		       (unsigned long long)c.nvme.capacity_bytes, err);
	}
	static const char *const bad_sizes[] = { "", "K", "1.3K", "-1", "1KK", "1 G", "0x10", "1e3", "18446744073709551616",
						  "17179869184T", "16384P", "1PP", "1E" };
	for (size_t i = 0; i < sizeof(bad_sizes) / sizeof(bad_sizes[0]); i++) {
		err[0] = '\0';
		uint64_t before = c.nvme.capacity_bytes;
		CHECKF(kvt_config_set(&c, "tier.nvme", "capacity", bad_sizes[i], err, sizeof(err)) == KVT_EINVAL &&
			       c.nvme.capacity_bytes == before,
		       "\"%s\" accepted", bad_sizes[i]);
	}
	/* durations */
	static const struct { const char *s; double v; } durs[] = { { "30", 30 }, { "1.5", 1.5 }, { "1.5s", 1.5 },
								   { "250ms", 0.25 }, { "0", 0 } };
	for (size_t i = 0; i < sizeof(durs) / sizeof(durs[0]); i++) {
		err[0] = '\0';
		rc = kvt_config_set(&c, "server", "drain_timeout", durs[i].s, err, sizeof(err));
		CHECKF(rc == KVT_OK && fabs(c.drain_timeout_s - durs[i].v) < 1e-12, "%s (%s)", durs[i].s, err);
	}
	static const char *const bad_durs[] = { "", "s", "ms", "1h", "-1", "nan", "inf", "1 s" };
	for (size_t i = 0; i < sizeof(bad_durs) / sizeof(bad_durs[0]); i++) {
		err[0] = '\0';
		CHECKF(kvt_config_set(&c, "server", "drain_timeout", bad_durs[i], err, sizeof(err)) == KVT_EINVAL,
		       "\"%s\" accepted", bad_durs[i]);
	}
	/* request_timeout excludes 0 */
	err[0] = '\0';
	CHECK_EQ_INT(kvt_config_set(&c, "server", "request_timeout", "0", err, sizeof(err)), KVT_EINVAL);
	{
		kvt_config c2;
		int rc2 = load_text("[cache]\nchunk_reuse = tools\nchunk_min_tokens = 1\nchunk_recompute = 1\n"
				    "chunk_share = 0\n", &c2, err, sizeof(err));
		CHECKF(rc2 == KVT_OK, "%s", err);
		CHECK(c2.chunk_reuse == KVT_CHUNK_REUSE_TOOLS && c2.chunk_min_tokens == 1 && c2.chunk_recompute == 1.0f &&
		      c2.chunk_share == 0.0f);
		rc2 = load_text("[cache]\nchunk_reuse = off\nchunk_min_tokens = 65536\nchunk_recompute = 0\n", &c2, err,
				sizeof(err));
		CHECKF(rc2 == KVT_OK, "%s", err);
		CHECK(c2.chunk_reuse == KVT_CHUNK_REUSE_OFF && c2.chunk_min_tokens == 65536 && c2.chunk_recompute == 0.0f);
		CHECK_EQ_INT(kvt_config_set(&c2, "cache", "chunk_reuse", "marked", err, sizeof(err)), KVT_OK);
		CHECK_EQ_INT(c2.chunk_reuse, KVT_CHUNK_REUSE_MARKED);
		CHECK_EQ_INT(kvt_config_set(&c2, "cache", "chunk_share", "1.01", err, sizeof(err)), KVT_EINVAL);
		CHECK(c2.chunk_share == 0.5f);
	}
	{
		kvt_config c2;
		int rc2 = load_text("[cache]\nretain_tier = nvme\n[tenants]\nretain_quota = \"alice : 64M, *:1G\"\n"
			       "retain_quota_nvme = \"bob:1.5M\"\n", &c2, err, sizeof(err));
		CHECKF(rc2 == KVT_OK, "%s", err);
		CHECK_EQ_INT(c2.retain_tier, KVT_TIER_NVME);
		CHECK_EQ_INT(c2.retain_quota.n, 2);
		CHECK(!strcmp(c2.retain_quota.e[0].tenant, "alice") && c2.retain_quota.e[0].bytes == 64ull << 20);
		CHECK(!strcmp(c2.retain_quota.e[1].tenant, "*") && c2.retain_quota.e[1].bytes == 1ull << 30);
		CHECK_EQ_INT(c2.retain_quota_tier[KVT_TIER_NVME].n, 1);
		CHECK_EQ_INT(c2.retain_quota_tier[KVT_TIER_NVME].e[0].bytes, 1572864);
	}
}

static void test_find(void)
{
	char path[256];
	unsetenv("KVTIER_CONFIG");
	CHECK(strcmp(kvt_config_find("/x/explicit.conf"), "/x/explicit.conf") == 0);
	snprintf(path, sizeof(path), "%s/env.conf", g_dir);
	setenv("KVTIER_CONFIG", path, 1);
	CHECK(strcmp(kvt_config_find(NULL), path) == 0);
	CHECK(strcmp(kvt_config_find(""), path) == 0);
	CHECK(strcmp(kvt_config_find("/x/explicit.conf"), "/x/explicit.conf") == 0); /* -c wins */
	setenv("KVTIER_CONFIG", "", 1);
	const char *p = kvt_config_find(NULL);
	if (access("/etc/kvtier/kvtier.conf", F_OK) == 0)
		CHECK(p && strcmp(p, "/etc/kvtier/kvtier.conf") == 0);
	else
		CHECK(p == NULL);
	unsetenv("KVTIER_CONFIG");
}

static void test_set(void)
{
	kvt_config c, d;
	char err[512];
	kvt_config_default(&c);
	err[0] = '\0';
	CHECK_EQ_INT(kvt_config_set(&c, "server", "listen", "0.0.0.0:9000", err, sizeof(err)), KVT_OK);
	CHECK(strcmp(c.listen_host, "0.0.0.0") == 0 && c.listen_port == 9000);
	CHECK_EQ_INT(kvt_config_set(&c, "model", "path", "/models/x.gguf", err, sizeof(err)), KVT_OK);
	CHECK(strcmp(c.model_path, "/models/x.gguf") == 0);
	/* failures change nothing; the message names the key and leaves the place (the flag) to the caller */
	memcpy(&d, &c, sizeof(d));
	memset(err, 'x', sizeof(err)); /* err is output only */
	CHECK_EQ_INT(kvt_config_set(&c, "server", "listen", "nowhere", err, sizeof(err)), KVT_EINVAL);
	CHECKF(strncmp(err, "[server] listen = \"nowhere\": ", 29) == 0, "%s", err);
	err[0] = '\0';
	CHECK_EQ_INT(kvt_config_set(&c, "tier.host", "dtype", "fp4", err, sizeof(err)), KVT_EINVAL);
	CHECKF(strncmp(err, "[tier.host] dtype = \"fp4\": unknown value (allowed: f16|fp8|int8)", 63) == 0, "%s", err);
	err[0] = '\0';
	CHECK_EQ_INT(kvt_config_set(&c, "cache", "block_token", "8", err, sizeof(err)), KVT_EINVAL);
	CHECKF(strstr(err, "did you mean 'block_tokens'?") != NULL, "%s", err);
	err[0] = '\0';
	CHECK_EQ_INT(kvt_config_set(&c, "gpu", "x", "8", err, sizeof(err)), KVT_EINVAL);
	CHECKF(strstr(err, "unknown section [gpu]") != NULL, "%s", err);
	CHECK(memcmp(&c, &d, sizeof(c)) == 0);
}

static void test_validate(void)
{
	kvt_config c;
	char err[512];
	kvt_config_default(&c);
	c.host.low = 0.9f;
	CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_EINVAL);
	CHECKF(strstr(err, "[tier.host] low_watermark 0.9") && strstr(err, "must be below high_watermark 0.9"), "%s", err);
	/* [store] listen on [server] listen's address */
	kvt_config_default(&c);
	snprintf(c.store_listen_host, sizeof(c.store_listen_host), "127.0.0.1");
	c.store_listen_port = 8080;
	CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_EINVAL);
	CHECKF(strstr(err, "[store] listen 127.0.0.1:8080 is [server] listen too"), "%s", err);
	c.store_listen_port = 6379;
	CHECKF(kvt_config_validate(&c, err, sizeof(err)) == KVT_OK, "%s", err);
	/* [scheduler] priorities: one message naming the entry and what is wrong */
	static const struct { const char *text, *needle; } bad_prio[] = {
		{ "vip:-10, batch:101", "entry 2: priority \"101\" is not a whole number in -100..100" },
		{ "vip", "entry 1 (\"vip\") has no \":priority\"" },
		{ "../x:1", "tenant \"../x\" is not a valid name" },
		{ "a:1, a:2", "tenant \"a\" is given twice" },
		{ "a:1,", "trailing comma" },
		{ "a:1x", "priority \"1x\"" },
	};
	for (size_t i = 0; i < sizeof(bad_prio) / sizeof(bad_prio[0]); i++) {
		kvt_config_default(&c);
		snprintf(c.priorities, sizeof(c.priorities), "%s", bad_prio[i].text);
		CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_EINVAL);
		CHECKF(strstr(err, "[scheduler] priorities: ") && strstr(err, bad_prio[i].needle), "%s: %s",
		       bad_prio[i].text, err);
	}
	{
		kvt_sched_config sc;
		char why[256];
		kvt_sched_config_default(&sc);
		CHECK(kvt_sched_parse_priorities(" vip:-10 , batch:20, *:5", &sc, why, sizeof(why)) == KVT_OK);
		CHECK(sc.n_tenant_priority == 2 && sc.default_priority == 5 && sc.tenant_priority[0].priority == -10 &&
		      !strcmp(sc.tenant_priority[1].tenant, "batch") && sc.tenant_priority[1].priority == 20);
	}
	/* [server] cors_origins: each origin checked, the bad one named */
	static const struct { const char *text, *needle; } bad_cors[] = {
		{ "*", "origin \"*\": name each origin" },
		{ "http://a.example, null", "origin \"null\": name each origin" },
		{ "localhost:3000", "origin \"localhost:3000\": not http:// or https://" },
		{ "http://localhost:3000/", "has a path or a trailing '/'" },
		{ "https://chat.example.com/app", "has a path" },
		{ "http://localhost:0", "a bad port (1-65535)" },
		{ "http://localhost:99999", "a bad port" },
		{ "http://", "no host" },
		{ "http://a_b.example", "a character outside a host name" },
		{ "http://[::1", "a bad [IPv6] host" },
		{ "http://[]:80", "a bad [IPv6] host" },
	};
	for (size_t i = 0; i < sizeof(bad_cors) / sizeof(bad_cors[0]); i++) {
		kvt_config_default(&c);
		snprintf(c.cors_origins, sizeof(c.cors_origins), "%s", bad_cors[i].text);
		CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_EINVAL);
		CHECKF(strstr(err, "[server] cors_origins: ") && strstr(err, bad_cors[i].needle), "%s: %s", bad_cors[i].text,
		       err);
	}
	{
		kvt_cors_origins co;
		char why[160];
		CHECK(kvt_server_cors_parse(" http://localhost:3000,https://chat.example.com  http://[::1]:8080,", &co, why,
					    sizeof(why)) == KVT_OK);
		CHECK(co.n == 3 && !strcmp(co.origin[0], "http://localhost:3000") &&
		      !strcmp(co.origin[1], "https://chat.example.com") && !strcmp(co.origin[2], "http://[::1]:8080"));
		CHECK(kvt_server_cors_parse("", &co, why, sizeof(why)) == KVT_OK && co.n == 0);
		char many[1024] = "";
		for (int k = 0; k < 17; k++)
			snprintf(many + strlen(many), sizeof(many) - strlen(many), "http://h%d.example,", k);
		CHECK(kvt_server_cors_parse(many, &co, why, sizeof(why)) == KVT_EINVAL);
		CHECKF(strstr(why, "origin \"http://h16.example\": one too many (at most 16 origins)"), "%s", why);
	}
	kvt_config_default(&c);
	c.default_max_tokens = 5000;
	CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_EINVAL);
	CHECKF(strstr(err, "default_max_tokens 5000 exceeds max_tokens_limit 4096") != NULL, "%s", err);
	kvt_config_default(&c);
	c.max_ctx = 8;
	CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_EINVAL);
	CHECKF(strstr(err, "context 8 is smaller than [cache] block_tokens 16") != NULL, "%s", err);
	kvt_config_default(&c);
	c.max_concurrent = 100; /* no longer tied to threads: a waiting request holds no thread */
	CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_OK);
	c.max_connections_per_ip = 2000;
	CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_EINVAL);
	CHECKF(strstr(err, "max_connections_per_ip 2000 exceeds max_connections 1024") != NULL, "%s", err);
	kvt_config_default(&c);
	c.nvme.capacity_bytes = 4096;
	CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_EINVAL);
	kvt_config_default(&c);
	c.block_tokens = 0;
	CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_EINVAL);
	/* each line is fine by itself: validate catches the pair (the caller names the file) */
	put("[tier.nvme]\nhigh_watermark = 0.5\nlow_watermark = 0.6\n");
	kvt_config_default(&c);
	CHECK_EQ_INT(kvt_config_load(&c, g_path, err, sizeof(err)), KVT_OK);
	CHECK_EQ_INT(kvt_config_validate(&c, err, sizeof(err)), KVT_EINVAL);
	CHECKF(strcmp(err, "[tier.nvme] low_watermark 0.6 must be below high_watermark 0.5") == 0, "%s", err);
}

static void test_write_roundtrip(void)
{
	kvt_config c, d;
	char err[1024];
	/* non-defaults everywhere, including awkward strings */
	int rc = load_text("[server]\nlisten = [::]:0\napi_keys = \"a:b\"\nmax_body_bytes = 12345\ndrain_timeout = 0.1\n"
			   "secret_file = \" lead#ing;\\\"q\\\\ \"\n[model]\ndevice = cuda\ncontext = 0\n"
			   "[cache]\nend_of_turn_deadline = 0.3\npersist = write_back\n"
			   "[tier.hbm]\ncapacity = 3G\nhigh_watermark = 0.7\nlow_watermark = 0.33\n"
			   "[tier.host]\ndtype = f16\n[tier.nvme]\ncompression = lz4\nio = uring\npath = /dev/nvme0n1\n"
			   "[log]\nfile = \"\"\nlevel = warn\n",
			   &c, err, sizeof(err));
	CHECKF(rc == KVT_OK, "%s", err);
	CHECK(strcmp(c.secret_file, " lead#ing;\"q\\ ") == 0);
	char wpath[256];
	snprintf(wpath, sizeof(wpath), "%s/written.conf", g_dir);
	FILE *f = fopen(wpath, "w");
	CHECK_EQ_INT(kvt_config_write(&c, f), KVT_OK);
	fclose(f);
	kvt_config_default(&d);
	rc = kvt_config_load(&d, wpath, err, sizeof(err));
	CHECKF(rc == KVT_OK, "%s", err);
	/* API keys are not written (secrets): the tenants appear in a comment only */
	CHECK_EQ_INT(d.n_api_keys, 0);
	memcpy(d.api_keys, c.api_keys, sizeof(d.api_keys));
	d.n_api_keys = c.n_api_keys;
	memcpy(d.source, c.source, sizeof(d.source));
	CHECK(memcmp(&c, &d, sizeof(c)) == 0);
	f = fopen(wpath, "r");
	char text[8192];
	size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
	text[n] = '\0';
	if (f)
		fclose(f);
	CHECK(strstr(text, "tenants: a") != NULL && strstr(text, ":b") == NULL);
	CHECK(strstr(text, "capacity = 3G\n") && strstr(text, "high_watermark = 0.7\n") && strstr(text, "low_watermark = 0.33\n"));
	unlink(wpath);
}

/* tier.nvme capacity against the free space (issue 13 item 2) */
static void test_nvme_capacity(void)
{
	kvt_config c;
	char err[1024];
	uint64_t v = 1;
	const uint64_t M = 1ull << 20, G = 1ull << 30;
	kvt_config_default(&c);
	CHECK(c.nvme.capacity_auto); /* the default is auto, not 8G */
	/* auto: half the free space, capped at 8G, floored at 64M, rounded down to 1M */
	CHECK(kvt_config_nvme_capacity(&c.nvme, 100 * G, 0, &v, err, sizeof(err)) == KVT_OK && v == 8 * G);
	CHECK(kvt_config_nvme_capacity(&c.nvme, 10 * G, 0, &v, err, sizeof(err)) == KVT_OK && v == 5 * G);
	CHECK(kvt_config_nvme_capacity(&c.nvme, 301 * M + 12345, 0, &v, err, sizeof(err)) == KVT_OK && v == 150 * M);
	CHECK(kvt_config_nvme_capacity(&c.nvme, 100 * M, 0, &v, err, sizeof(err)) == KVT_OK && v == 64 * M);
	err[0] = 0;
	CHECK(kvt_config_nvme_capacity(&c.nvme, 10 * M, 0, &v, err, sizeof(err)) == KVT_EFULL);
	CHECKF(strstr(err, "10485760 bytes free") && strstr(err, "64M") && strstr(err, "capacity = 0"), "%s", err);
	/* an existing file keeps its size, whatever is free */
	CHECK(kvt_config_nvme_capacity(&c.nvme, 0, 8 * G, &v, err, sizeof(err)) == KVT_OK && v == 8 * G);
	/* explicit: refused when larger than the free space, with both numbers */
	CHECK(kvt_config_set(&c, "tier.nvme", "capacity", "8G", err, sizeof(err)) == KVT_OK);
	err[0] = 0;
	CHECK(kvt_config_nvme_capacity(&c.nvme, 3 * G, 0, &v, err, sizeof(err)) == KVT_EFULL);
	CHECKF(strstr(err, "8G (8589934592 bytes)") && strstr(err, "3221225472 bytes"), "%s", err);
	CHECK(kvt_config_nvme_capacity(&c.nvme, 9 * G, 0, &v, err, sizeof(err)) == KVT_OK && v == 8 * G);
	CHECK(kvt_config_nvme_capacity(&c.nvme, 1 * G, 8 * G, &v, err, sizeof(err)) == KVT_OK && v == 8 * G);
	/* 0: no NVMe tier */
	CHECK(kvt_config_set(&c, "tier.nvme", "capacity", "0", err, sizeof(err)) == KVT_OK);
	CHECK(kvt_config_nvme_capacity(&c.nvme, 0, 0, &v, err, sizeof(err)) == KVT_OK && v == 0);
}

int main(void)
{
	snprintf(g_dir, sizeof(g_dir), "/tmp/kvt_config_XXXXXX");
	if (!mkdtemp(g_dir))
		return 1;
	snprintf(g_path, sizeof(g_path), "%s/kvtier.conf", g_dir);
	test_defaults();
	test_shipped_file();
	test_errors();
	test_values();
	test_find();
	test_set();
	test_validate();
	test_write_roundtrip();
	test_nvme_capacity();
	unlink(g_path);
	rmdir(g_dir);
	return check_done("test_config");
}
