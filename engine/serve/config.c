/*
 * engine/serve/config.c — kvtierd's INI configuration (engine/serve/config.h).
 *
 * Design: one table (keys[]) describes every key: its section, name, value
 * type, where it lives in kvt_config, its range or allowed values, and its
 * default. Defaults, parsing, kvt_config_set, the "unknown key" suggestion and
 * kvt_config_write all walk that table, so a key exists in exactly one place
 * and configs/kvtier.conf is checked against it by tests/test_config.c.
 *
 * Invariants:
 *  - Nothing is half-applied: a file is parsed into a private copy, which
 *    replaces the caller's config only when every line parsed; a single
 *    kvt_config_set changes nothing unless its value is good.
 *  - Every error is one line "WHERE: what is wrong (allowed: ...)", WHERE
 *    being "FILE:LINE" for a file and "[section] key" (or the caller's
 *    prefix, see kvt_config_set) for a flag.
 *  - Untrusted bytes: lines are bounded (KVT_CONFIG_LINE_MAX), numbers are
 *    parsed with overflow checks, strings are length-checked before copying.
 *  - kvt_config_write never prints API keys (the output goes to logs): it
 *    writes a comment naming the tenants instead, so the output still parses.
 */
#define _GNU_SOURCE
#include "config.h"
#include "index.h"
#include "scheduler.h"
#include "manager.h"
#include "t2_store.h"
#include "t3_remote.h"
#include "tokenizer.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KVT_CONFIG_LINE_MAX 8192       /* longest line accepted */
#define KVT_CONFIG_FILE_MAX (1u << 20) /* largest file accepted */
#define KVT_CONFIG_DEFAULT_PATH "/etc/kvtier/kvtier.conf"

/* ---- the key table ----------------------------------------------------------------- */

enum vtype {
	V_U32,      /* unsigned integer in [min, max] */
	V_SIZE,     /* bytes, K/M/G/T/P suffix, in [min, max]; stored as size_t */
	V_TIERCAP,  /* kvt_tier_config capacity: bytes, or "auto" when allow_auto */
	V_FRACTION, /* float in [min, max] (min_open: > min) */
	V_DURATION, /* double seconds, s/ms suffix, in [min, max] */
	V_BOOL,     /* true/false/yes/no/on/off/1/0 */
	V_ENUM,     /* one of names[], stored as int (values[]) */
	V_ENUMBOOL, /* one of names[], stored as bool (values[] 0/1) */
	V_STRING,   /* char[size] */
	V_LISTEN,   /* HOST:PORT into a char[256] host at off and a uint16_t port at size ("" allowed with allow_auto: off) */
	V_APIKEYS,  /* "tenant:key, ..." into a kvt_api_key[KVT_CONFIG_MAX_KEYS] at off, its count (size_t) at size */
	V_QUOTAS,   /* "tenant:SIZE, ..., *:SIZE" into a kvt_quota_list at off */
};

typedef struct key_def {
	const char *section;     /* "server", "tier.hbm", ... */
	const char *name;        /* key name */
	enum vtype type;         /* how the value is parsed */
	size_t off;              /* offset of the field in kvt_config */
	size_t size;             /* V_STRING: buffer bytes; V_APIKEYS: offset of the key count */
	double min, max;         /* numeric range (inclusive unless min_open) */
	bool min_open;           /* the range excludes min */
	bool allow_auto;         /* V_TIERCAP: "auto" accepted */
	const char *const *names; /* V_ENUM*: allowed values, NULL-terminated */
	const int *values;       /* V_ENUM*: the value of each name */
	const char *def;         /* the default, as the file would write it */
	const char *doc;         /* one-line description (kvt_config_write) */
} key_def;

static const char *const device_names[] = { "auto", "cuda", "cpu", NULL };
static const int device_values[] = { KVT_DEVICE_AUTO, KVT_DEVICE_CUDA, KVT_DEVICE_CPU };
static const char *const persist_names[] = { "end_of_turn", "write_back", NULL };
static const int persist_values[] = { KVT_PERSIST_END_OF_TURN, KVT_PERSIST_WRITE_BACK };
static const char *const dtype_names[] = { "f16", "fp8", "int8", "int8kv", NULL };
static const int dtype_values[] = { KVT_KV_CODEC_F16, KVT_KV_CODEC_FP8, KVT_KV_CODEC_INT8, KVT_KV_CODEC_INT8KV };
static const char *const nvdtype_names[] = { "same", "f16", NULL };
static const int nvdtype_values[] = { 0, 1 };
static const char *const io_names[] = { "auto", "uring", "threads", NULL };
static const int io_values[] = { KVT_T2_IO_AUTO, KVT_T2_IO_URING, KVT_T2_IO_THREADS };
static const char *const level_names[] = { "error", "warn", "info", "debug", NULL };
static const int level_values[] = { KVT_LOG_ERROR, KVT_LOG_WARN, KVT_LOG_INFO, KVT_LOG_DEBUG };
static const char *const metrics_names[] = { "open", "admin", NULL };
static const int metrics_values[] = { 0, 1 };
static const char *const policy_names[] = { "fair", "fifo", NULL };
static const int policy_values[] = { KVT_SCHED_FAIR, KVT_SCHED_FIFO };
static const char *const preempt_names[] = { "auto", "swap", "recompute", NULL };
static const int preempt_values[] = { KVT_CONFIG_PREEMPT_AUTO, KVT_PREEMPT_SWAP, KVT_PREEMPT_RECOMPUTE };
static const char *const promotion_names[] = { "auto", "layered", "sequential", NULL };
static const int promotion_values[] = { KVT_CONFIG_PROMOTION_AUTO, KVT_CONFIG_PROMOTION_LAYERED,
					KVT_CONFIG_PROMOTION_SEQUENTIAL };
static const char *const admission_names[] = { "prompt", "longest", NULL };
static const int admission_values[] = { 0, 1 };
static const char *const tier_names[] = { "hbm", "host", "nvme", NULL };
static const int tier_values[] = { KVT_TIER_HBM, KVT_TIER_HOST, KVT_TIER_NVME };
static const char *const remote_mode_names[] = { "cluster", "single", NULL };
static const int remote_mode_values[] = { 1, 0 };
static const char *const remote_write_names[] = { "write_through", "on_demote", NULL };
static const int remote_write_values[] = { KVT_T3_WRITE_THROUGH, KVT_T3_ON_DEMOTE };
static const char *const comp_names[] = { "none", "lz4", NULL };
static const char *const chat_names[] = { "auto", "chatml", "gemma", "mistral", "llama3", NULL };
static const int chat_values[] = { KVT_TOK_CHAT_AUTO, KVT_TOK_CHAT_CHATML, KVT_TOK_CHAT_GEMMA, KVT_TOK_CHAT_MISTRAL,
				   KVT_TOK_CHAT_LLAMA3 };
static const int comp_values[] = { 0, 1 };
static const char *const chunk_names[] = { "off", "marked", "tools", NULL };
static const char *const act_names[] = { "int16", "int8", NULL };
static const int act_values[] = { 0, 1 };
static const char *const fpv_names[] = { "auto", "v1", "v2", NULL };
static const int fpv_values[] = { 0, 1, 2 };
static const int chunk_values[] = { KVT_CHUNK_REUSE_OFF, KVT_CHUNK_REUSE_MARKED, KVT_CHUNK_REUSE_TOOLS };

#define OFF(f) offsetof(kvt_config, f)
#define U32(s, n, f, lo, hi, d, doc) { s, n, V_U32, OFF(f), 0, lo, hi, false, false, NULL, NULL, d, doc }
#define SIZE(s, n, f, lo, hi, d, doc) { s, n, V_SIZE, OFF(f), 0, lo, hi, false, false, NULL, NULL, d, doc }
#define DUR(s, n, f, lo, hi, open, d, doc) { s, n, V_DURATION, OFF(f), 0, lo, hi, open, false, NULL, NULL, d, doc }
#define BOOLK(s, n, f, d, doc) { s, n, V_BOOL, OFF(f), 0, 0, 0, false, false, NULL, NULL, d, doc }
#define ENUMK(s, n, f, nm, d, doc) { s, n, V_ENUM, OFF(f), 0, 0, 0, false, false, nm##_names, nm##_values, d, doc }
#define STR(s, n, f, d, doc) { s, n, V_STRING, OFF(f), sizeof(((kvt_config *)0)->f), 0, 0, false, false, NULL, NULL, d, doc }
#define TIER(s, t, capmin, automax, cap_d, hi_d, lo_d)                                                            \
	{ s, "capacity", V_TIERCAP, OFF(t.capacity_bytes), 0, capmin, 1125899906842624.0 /* 1 P */, false, automax, \
	  NULL, NULL, cap_d, "bytes of this tier" },                                                                 \
	{ s, "high_watermark", V_FRACTION, OFF(t.high), 0, 0, 1, true, false, NULL, NULL, hi_d,                     \
	  "demote down to low_watermark when use exceeds this fraction" },                                           \
	{ s, "low_watermark", V_FRACTION, OFF(t.low), 0, 0, 1, false, false, NULL, NULL, lo_d,                      \
	  "demotion stops at this fraction (< high_watermark)" }

static const key_def keys[] = {
	{ "server", "listen", V_LISTEN, OFF(listen_host), OFF(listen_port), 0, 0, false, false, NULL, NULL, "127.0.0.1:8080",
	  "HOST:PORT to bind (numeric IPv4, or [IPv6]:PORT); port 0 = ephemeral" },
	U32("server", "threads", server_threads, 1, 1024, "4", "HTTP worker threads; every connection is served by one of them, none is held while a request waits"),
	U32("server", "max_connections", max_connections, 1, 1000000, "1024", "open connections, all clients together; beyond: closed at once"),
	U32("server", "max_connections_per_ip", max_connections_per_ip, 0, 1000000, "64", "open connections from one address (0 = no limit); at it, its longest-waiting idle one makes room"),
	DUR("server", "header_timeout", header_timeout_s, 0, 3600, false, "15", "a connection must send a request's headers within this (from accept, or from its last response; 0 = no limit)"),
	{ "server", "api_keys", V_APIKEYS, OFF(api_keys), OFF(n_api_keys), 0, 0, false, false, NULL, NULL, "",
	  "\"tenant:key, tenant2:key2\" or one bare key (tenant default); empty = no auth" },
	STR("server", "api_key_file", api_key_file, "", "file with one tenant:key per line (\"\" = none)"),
	{ "server", "admin_keys", V_APIKEYS, OFF(admin_keys), OFF(n_admin_keys), 0, 0, false, false, NULL, NULL, "",
	  "keys that also see every tenant's numbers and sessions (same syntax as api_keys); empty = none" },
	ENUMK("server", "metrics", metrics_admin, metrics, "open", "/metrics: open to all, or admin (an admin key)"),
	BOOLK("server", "allow_unauthenticated", allow_unauthenticated, "false",
	      "serve a non-loopback address with no API key (refused otherwise)"),
	U32("server", "max_concurrent_requests", max_concurrent, 1, 65536, "32", "requests queued or running; beyond: 503"),
	U32("server", "max_queue", max_queue, 0, 1048576, "64", "requests waiting for the scheduler"),
	SIZE("server", "max_header_bytes", max_header_bytes, 1024, 1048576, "16K", "request line + headers"),
	SIZE("server", "max_body_bytes", max_body_bytes, 1024, 1073741824.0, "1M", "request body; beyond: 413"),
	U32("server", "max_tokens_limit", max_tokens_limit, 1, 1048576, "4096", "largest max_tokens accepted"),
	U32("server", "default_max_tokens", default_max_tokens, 1, 1048576, "256", "max_tokens when absent"),
	U32("server", "max_n", max_n, 1, 128, "4", "largest n accepted"),
	DUR("server", "request_timeout", request_timeout_s, 0, 86400, true, "600", "idle connection timeout"),
	DUR("server", "drain_timeout", drain_timeout_s, 0, 3600, false, "30", "SIGTERM waits this long for in-flight requests"),
	STR("server", "secret_file", secret_file, "", "server secret for tenant salts (\"\" = DATA_DIR/secret)"),
	STR("server", "cors_origins", cors_origins, "", "origins a browser may call the API from, comma-separated (\"\" = none)"),
	U32("server", "parallel", n_slots, 1, KVT_SERVER_MAX_SLOTS, "1", "slots llama-server's slot API exposes (each a session slot-<id>; -np)"),
	STR("server", "slot_save_path", slot_save_path, "", "directory of llama-server slot snapshots (\"\" = slot save/restore off; --slot-save-path)"),

	STR("model", "path", model_path, "models/SmolLM2-135M-Instruct.Q4_1.gguf", "the GGUF model"),
	ENUMK("model", "device", device, device, "auto", "auto = CUDA when a GPU is present, else CPU"),
	U32("model", "threads", model_threads, 0, 1024, "0", "CPU backend worker threads (0 = auto: the CPUs the process may use, by affinity and cgroup quota)"),
	U32("model", "context", max_ctx, 0, 16777216, "4096", "tokens per sequence (0 = the model's trained context)"),
	U32("model", "batch", max_batch, 1, 65536, "256", "tokens per forward chunk"),
	ENUMK("model", "activations", act_int8, act, "int8",
	      "CPU: activations multiplying quantized weights are rounded to int8 as llama.cpp (the default, faster), or to int16"),
	ENUMK("model", "fingerprint", fp_version, fpv, "auto",
	      "fingerprint version naming the model in the cache: auto = the data directory's (v2 when new); nodes sharing a remote tier must agree"),
	ENUMK("model", "chat_template", chat_template, chat, "auto",
	      "chat prompt layout: auto = from the GGUF's template (none: by architecture), or forced"),
	BOOLK("model", "device_decode", device_decode, "true",
	      "CUDA: a step of greedy decode rows runs as one graph, tokens picked on the device (false: every op from the host)"),

	U32("cache", "block_tokens", block_tokens, 1, KVT_BLOCK_MAX_TOKENS, "16", "tokens per KV block"),
	ENUMK("cache", "persist", persist, persist, "end_of_turn", "when blocks reach NVMe"),
	DUR("cache", "end_of_turn_deadline", end_turn_s, 0, 3600, true, "1.0", "end_of_turn: a turn is durable within this"),
	BOOLK("cache", "enabled", cache_enabled, "true", "reuse cached prefixes (false: benchmark baseline)"),
	U32("cache", "max_running", max_running, 1, 1024, "16", "sequences per decode batch"),
	U32("cache", "prefill_chunk", prefill_chunk, 1, 65536, "256", "prompt tokens per scheduler step"),
	ENUMK("cache", "retain_tier", retain_tier, tier, "host", "floor tier of cache_control retention (kept there or above until the TTL)"),
	ENUMK("cache", "chunk_reuse", chunk_reuse, chunk, "marked",
	      "chat spans reused at any position: off, marked (kvtier.reuse anywhere), tools (also every role tool message's content)"),
	U32("cache", "chunk_min_tokens", chunk_min_tokens, 1, 65536, "64", "a marked span with fewer tokens is ordinary text"),
	{ "cache", "chunk_recompute", V_FRACTION, OFF(chunk_recompute), 0, 0, 1, false, false, NULL, NULL, "0.15",
	  "fraction of a reused chunk's tokens recomputed past the check layer (a request's kvtier.chunk_recompute overrides it)" },
	{ "cache", "chunk_share", V_FRACTION, OFF(chunk_share), 0, 0, 1, false, false, NULL, NULL, "0.5",
	  "share of each tier's blocks chunk blocks may hold before eviction takes them first" },

#define QUOTA(n, f, doc) { "tenants", n, V_QUOTAS, OFF(f), 0, 0, 0, false, false, NULL, NULL, "", doc }
	QUOTA("retain_quota", retain_quota, "retained bytes per tenant, all tiers: \"tenant:SIZE, *:SIZE\" (\"\" = no limit)"),
	QUOTA("retain_quota_hbm", retain_quota_tier[0], "retained bytes per tenant whose floor is hbm"),
	QUOTA("retain_quota_host", retain_quota_tier[1], "retained bytes per tenant whose floor is host"),
	QUOTA("retain_quota_nvme", retain_quota_tier[2], "retained bytes per tenant whose floor is nvme"),

	ENUMK("scheduler", "policy", sched_policy, policy, "fair", "how a step's prefill budget is shared: fair (priority, shortest remaining, aging) or fifo (oldest first)"),
	U32("scheduler", "aging_steps", aging_steps, 1, 1000000, "4", "fair: a prompt passed over this many steps goes first"),
	{ "scheduler", "head_share", V_FRACTION, OFF(head_share), 0, 0, 1, false, false, NULL, NULL, "0.8",
	  "fair: others' rows may delay the oldest prompt of the best priority by (1/head_share - 1) x its length, then it goes first (0 = no bound)" },
	DUR("scheduler", "priority_aging", priority_aging_s, 0, 86400, false, "5", "a waiting request gains one priority level per this (0 = never)"),
	ENUMK("scheduler", "preempt", preempt, preempt, "auto", "T0 full: how a preempted request resumes (auto = swap with tier.host dtype f16, else recompute)"),
	{ "scheduler", "admission", V_ENUMBOOL, OFF(admit_longest), 0, 0, 0, false, false, admission_names, admission_values,
	  "prompt", "admit when T0 holds the prompt's blocks (prompt) or the request at its longest (longest)" },
	STR("scheduler", "priorities", priorities, "", "default priorities: \"tenant:prio, ..., *:prio\" (-100..100, lower first)"),

	TIER("tier.hbm", hbm, 1, true, "auto", "0.90", "0.75"),
	TIER("tier.host", host, 1, true, "auto", "0.90", "0.80"),
	ENUMK("tier.host", "dtype", host_dtype, dtype, "int8kv", "host (and NVMe) record format"),
	ENUMK("tier.host", "promotion", host_promotion, promotion, "auto",
	      "a cached prefix from T1: layered (copy per layer group, prefill overlapping it), sequential, auto = layered on a GPU"),
	U32("tier.host", "promotion_groups", promotion_groups, 1, 256, "4", "layered: layer groups per promotion"),
	TIER("tier.nvme", nvme, 0, true, "auto", "0.95", "0.85"),
	STR("tier.nvme", "path", nvme_path, "", "T2 file or block device (\"\" = DATA_DIR/kvtier.t2)"),
	U32("tier.nvme", "queue_depth", nvme_queue_depth, 1, 1024, "32", "I/Os in flight"),
	{ "tier.nvme", "compression", V_ENUMBOOL, OFF(nvme_compression), 0, 0, 0, false, false, comp_names, comp_values,
	  "none", "LZ4 per record, kept where it saves >= 15%" },
	ENUMK("tier.nvme", "io", nvme_io, io, "auto", "auto = io_uring, else a thread pool"),
	ENUMK("tier.nvme", "dtype", nvme_f16, nvdtype, "f16",
	      "records written from T0: same = [tier.host] dtype, f16 = exact (T1 keeps its 8-bit copy)"),
	U32("tier.nvme", "io_threads", io_threads, 1, 16, "2", "promotion workers"),

	BOOLK("tier.remote", "enabled", remote_enabled, "false", "T3: a Redis Cluster (or server) shared by several nodes"),
	STR("tier.remote", "seeds", remote_seeds, "", "host:port of one or more servers, comma-separated"),
	ENUMK("tier.remote", "mode", remote_mode, remote_mode, "cluster", "cluster = Redis Cluster slot routing; single = one server"),
	STR("tier.remote", "user", remote_user, "", "AUTH user (\"\" = the default user)"),
	STR("tier.remote", "password_file", remote_password_file, "", "file holding the AUTH password (\"\" = no AUTH)"),
	DUR("tier.remote", "connect_timeout", remote_connect_timeout_s, 0, 60, true, "0.2", "one connection attempt"),
	DUR("tier.remote", "command_timeout", remote_command_timeout_s, 0, 60, true, "0.5", "one pipelined read round, at most"),
	STR("tier.remote", "prefix", remote_prefix, "kvt:", "prefix of every key"),
	U32("tier.remote", "pipeline_depth", remote_pipeline, 1, 4096, "64", "commands in flight per node"),
	ENUMK("tier.remote", "write_policy", remote_write, remote_write, "write_through", "when blocks are written to T3"),
	DUR("tier.remote", "ttl", remote_ttl_s, 0, 31536000, false, "0", "expiry of every record, seconds (0 = none)"),

	{ "store", "listen", V_LISTEN, OFF(store_listen_host), OFF(store_listen_port), 0, 0, false, true, NULL, NULL, "",
	  "HOST:PORT of the Redis-protocol key-value store (\"\" = off); a non-loopback address needs API keys" },
	{ "store", "share", V_FRACTION, OFF(store_share), 0, 0, 0.9, true, false, NULL, NULL, "0.25",
	  "fraction of [tier.host] and [tier.nvme] capacity that sizes the store's RAM and NVMe file (in addition to the KV cache's)" },
	SIZE("store", "max_value", store_max_value, 1048576, 17179869184.0, "512M", "the largest value; a larger SET closes the connection"),
	BOOLK("store", "durable", store_durable, "true", "SET answered once the value is on NVMe (false: at once, written behind)"),
	DUR("store", "exists_lease", store_exists_lease_s, 0, 3600, false, "5", "EXISTS keeps a found key from eviction this long (0 = no lease)"),
	U32("store", "max_connections", store_max_connections, 1, 1000000, "1024", "open store connections; beyond: refused"),

	STR("index", "data_dir", data_dir, "./kvtier-data", "holds the T2 file, the index and the secret"),
	STR("index", "path", index_path, "", "SQLite index (\"\" = DATA_DIR/index.sqlite)"),
	SIZE("index", "reserve", index_reserve_bytes, 0, 4294967296.0, "16M",
	     "disk space kept for session rows when the disk fills (0 = none)"),

	STR("log", "file", log_file, "", "log file (\"\" = stderr); reopened on SIGHUP"),
	ENUMK("log", "level", log_level, level, "info", "lines above this level are dropped"),
};
#define N_KEYS (sizeof(keys) / sizeof(keys[0]))

static const char *const sections[] = { "server", "model", "cache", "scheduler", "tenants", "tier.hbm", "tier.host",
					 "tier.nvme", "tier.remote", "store", "index", "log" };
#define N_SECTIONS (sizeof(sections) / sizeof(sections[0]))

/* ---- messages ------------------------------------------------------------------------ */

static void set_err(char *err, size_t cap, const char *where, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void set_err(char *err, size_t cap, const char *where, const char *fmt, ...)
{
	if (!err || cap == 0)
		return;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (where && where[0])
		snprintf(err, cap, "%s: %s", where, msg);
	else
		snprintf(err, cap, "%s", msg);
}

/* "a|b|c" of an enum's names. */
static void join_names(const char *const *names, char *out, size_t cap)
{
	size_t n = 0;
	out[0] = '\0';
	for (size_t i = 0; names[i]; i++)
		n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", i ? "|" : "", names[i]);
}

/* A number for messages: no trailing zeros. */
static void fmt_num(double v, char *out, size_t cap)
{
	snprintf(out, cap, "%.15g", v);
}

/* Bytes for messages: "16K", "1G", "1000". */
static void fmt_bytes(uint64_t v, char *out, size_t cap)
{
	static const char suf[] = "PTGMK";
	for (int i = 0; i < 5; i++) {
		uint64_t unit = 1ull << (10 * (5 - i));
		if (v && v % unit == 0) {
			snprintf(out, cap, "%llu%c", (unsigned long long)(v / unit), suf[i]);
			return;
		}
	}
	snprintf(out, cap, "%llu", (unsigned long long)v);
}

/* ---- value parsers (each: true and *out, or false) ------------------------------------- */

static bool parse_u64_dec(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	if (!isdigit((unsigned char)*s))
		return false;
	for (; isdigit((unsigned char)*s); s++) {
		if (!kvt_mul_u64(v, 10, &v) || !kvt_add_u64(v, (uint64_t)(*s - '0'), &v))
			return false;
	}
	if (*s)
		return false;
	*out = v;
	return true;
}

static bool parse_size(const char *s, uint64_t *out, bool *overflow);

/* "tenant:SIZE, tenant2:SIZE, *:SIZE" (empty: none). false with why set. */
static bool parse_quotas(const char *s, kvt_quota_list *out, char *why, size_t why_cap)
{
	memset(out, 0, sizeof(*out));
	const char *p = s;
	while (isspace((unsigned char)*p))
		p++;
	while (*p) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		char item[256];
		while (len && isspace((unsigned char)*p)) {
			p++;
			len--;
		}
		while (len && isspace((unsigned char)p[len - 1]))
			len--;
		if (len == 0 || len >= sizeof(item)) {
			snprintf(why, why_cap, "entry %zu is %s", out->n + 1, len ? "too long" : "empty");
			return false;
		}
		if (out->n == KVT_CONFIG_MAX_QUOTAS) {
			snprintf(why, why_cap, "more than %d entries", KVT_CONFIG_MAX_QUOTAS);
			return false;
		}
		memcpy(item, p, len);
		item[len] = '\0';
		char *c = strrchr(item, ':');
		if (!c) {
			snprintf(why, why_cap, "entry %zu (\"%.64s\") is not tenant:SIZE", out->n + 1, item);
			return false;
		}
		*c = '\0';
		const char *size = c + 1;
		while (isspace((unsigned char)*size))
			size++;
		for (char *t = c; t > item && isspace((unsigned char)t[-1]);)
			*--t = '\0';
		if (strcmp(item, "*") && !kvt_name_valid(item)) {
			snprintf(why, why_cap, "\"%.64s\" is neither * nor a tenant name (1..%d of [A-Za-z0-9._-])", item,
				 KVT_NAME_MAX);
			return false;
		}
		uint64_t v;
		bool overflow;
		if (!parse_size(size, &v, &overflow) || overflow) {
			snprintf(why, why_cap, "the size of \"%.64s\" (\"%.32s\") is not a size like 64M or 1G", item, size);
			return false;
		}
		for (size_t i = 0; i < out->n; i++)
			if (!strcmp(out->e[i].tenant, item)) {
				snprintf(why, why_cap, "tenant \"%.64s\" is given twice", item);
				return false;
			}
		memcpy(out->e[out->n].tenant, item, strlen(item) + 1); /* a name or "*": <= KVT_NAME_MAX bytes */
		out->e[out->n++].bytes = v;
		if (!e)
			break;
		p = e + 1;
		while (isspace((unsigned char)*p))
			p++;
		if (!*p) {
			snprintf(why, why_cap, "the list ends with a comma");
			return false;
		}
	}
	return true;
}

/* "64M", "2G", "1P", "16384", "1.5G" (a fraction times a suffix), optional B/iB. *overflow tells a too-big number. */
static bool parse_size(const char *s, uint64_t *out, bool *overflow)
{
	*overflow = false;
	char num[64];
	size_t n = 0;
	while (s[n] && (isdigit((unsigned char)s[n]) || s[n] == '.'))
		n++;
	if (n == 0 || n >= sizeof(num))
		return false;
	memcpy(num, s, n);
	num[n] = '\0';
	const char *suf = s + n;
	uint64_t mul = 1;
	switch (*suf) {
	case '\0': case 'B': break;
	case 'K': case 'k': mul = 1ull << 10; suf++; break;
	case 'M': case 'm': mul = 1ull << 20; suf++; break;
	case 'G': case 'g': mul = 1ull << 30; suf++; break;
	case 'T': case 't': mul = 1ull << 40; suf++; break;
	case 'P': case 'p': mul = 1ull << 50; suf++; break;
	default: return false;
	}
	if (*suf && strcmp(suf, "B") != 0 && (mul == 1 || strcmp(suf, "iB") != 0))
		return false;
	if (strchr(num, '.')) {
		char *end;
		errno = 0;
		double v = strtod(num, &end);
		if (errno || *end || !(v >= 0))
			return false;
		if (v * (double)mul >= 1.8e19) {
			*overflow = true;
			return false;
		}
		double bytes = v * (double)mul;
		if (bytes != floor(bytes))
			return false; /* "1.3K" is not a whole number of bytes */
		*out = (uint64_t)bytes;
		return true;
	}
	uint64_t v = 0;
	for (const char *p = num; *p; p++) { /* num holds digits only here */
		if (!kvt_mul_u64(v, 10, &v) || !kvt_add_u64(v, (uint64_t)(*p - '0'), &v)) {
			*overflow = true;
			return false;
		}
	}
	if (!kvt_mul_u64(v, mul, &v)) {
		*overflow = true;
		return false;
	}
	*out = v;
	return true;
}

static bool parse_double(const char *s, double *out)
{
	char *end;
	if (!*s || isspace((unsigned char)*s))
		return false;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v))
		return false;
	*out = v;
	return true;
}

/* "1.5", "1.5s", "250ms". */
static bool parse_duration(const char *s, double *out)
{
	char num[64];
	size_t n = strlen(s);
	double scale = 1;
	if (n >= 2 && strcmp(s + n - 2, "ms") == 0) {
		n -= 2;
		scale = 1e-3;
	} else if (n >= 1 && s[n - 1] == 's') {
		n -= 1;
	}
	if (n == 0 || n >= sizeof(num))
		return false;
	memcpy(num, s, n);
	num[n] = '\0';
	double v;
	if (!parse_double(num, &v))
		return false;
	*out = v * scale;
	return true;
}

static bool parse_bool(const char *s, bool *out)
{
	static const char *const t[] = { "true", "yes", "on", "1" }, *const f[] = { "false", "no", "off", "0" };
	for (int i = 0; i < 4; i++) {
		if (strcasecmp(s, t[i]) == 0) {
			*out = true;
			return true;
		}
		if (strcasecmp(s, f[i]) == 0) {
			*out = false;
			return true;
		}
	}
	return false;
}

/* HOST:PORT or [V6]:PORT; the host must be numeric (the server binds it as is). */
static bool parse_listen(const char *s, char *host, size_t host_cap, uint16_t *port, const char **why)
{
	const char *colon;
	char h[256];
	size_t hn;
	if (s[0] == '[') {
		const char *rb = strchr(s, ']');
		if (!rb || rb[1] != ':') {
			*why = "expected [IPv6]:PORT";
			return false;
		}
		hn = (size_t)(rb - s - 1);
		if (hn == 0 || hn >= sizeof(h)) {
			*why = "empty or overlong address";
			return false;
		}
		memcpy(h, s + 1, hn);
		colon = rb + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || colon == s) {
			*why = "expected HOST:PORT";
			return false;
		}
		hn = (size_t)(colon - s);
		if (hn >= sizeof(h)) {
			*why = "overlong address";
			return false;
		}
		memcpy(h, s, hn);
	}
	h[hn] = '\0';
	unsigned char buf[sizeof(struct in6_addr)];
	bool v6 = strchr(h, ':') != NULL;
	if (inet_pton(v6 ? AF_INET6 : AF_INET, h, buf) != 1) {
		*why = "the host must be a numeric IPv4 address or a bracketed IPv6 address";
		return false;
	}
	if (v6 && s[0] != '[') {
		*why = "an IPv6 address needs brackets: [ADDR]:PORT";
		return false;
	}
	uint64_t p;
	if (!parse_u64_dec(colon + 1, &p) || p > 65535) {
		*why = "the port must be a whole number in 0..65535";
		return false;
	}
	if (hn + 1 > host_cap) {
		*why = "overlong address";
		return false;
	}
	memcpy(host, h, hn + 1);
	*port = (uint16_t)p;
	return true;
}

/*
 * "tenant:key, tenant2:key2" or one bare key. Keys: 1..255 bytes, no
 * whitespace or commas. Writes *n keys into out (KVT_CONFIG_MAX_KEYS).
 */
static bool parse_api_keys(const char *s, kvt_api_key *out, size_t *n_out, char *why, size_t why_cap)
{
	size_t n = 0;
	const char *p = s;
	while (isspace((unsigned char)*p))
		p++;
	if (!*p) {
		*n_out = 0;
		return true;
	}
	while (*p) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		char item[512];
		while (len && isspace((unsigned char)*p)) {
			p++;
			len--;
		}
		while (len && isspace((unsigned char)p[len - 1]))
			len--;
		if (len == 0) {
			snprintf(why, why_cap, "empty entry in the list (expected \"tenant:key, tenant2:key2\")");
			return false;
		}
		if (len >= sizeof(item)) {
			snprintf(why, why_cap, "entry %zu is too long", n + 1);
			return false;
		}
		if (n == KVT_CONFIG_MAX_KEYS) {
			snprintf(why, why_cap, "more than %d keys", KVT_CONFIG_MAX_KEYS);
			return false;
		}
		memcpy(item, p, len);
		item[len] = '\0';
		char *c = strchr(item, ':');
		const char *tenant = "default", *key = item;
		if (c) {
			*c = '\0';
			tenant = item;
			key = c + 1;
		} else if (n > 0 || e) {
			snprintf(why, why_cap, "entry %zu has no tenant (a list needs \"tenant:key\" entries)", n + 1);
			return false;
		}
		if (!kvt_name_valid(tenant)) {
			snprintf(why, why_cap,
				 "tenant \"%.64s\" is not a valid name (1..%d of [A-Za-z0-9._-], not starting with '.')",
				 tenant, KVT_NAME_MAX);
			return false;
		}
		size_t kl = strlen(key);
		if (kl == 0 || kl >= sizeof(out[0].key)) {
			snprintf(why, why_cap, "the key of tenant \"%.64s\" must be 1..%zu bytes", tenant,
				 sizeof(out[0].key) - 1);
			return false;
		}
		for (size_t i = 0; i < kl; i++) {
			if (isspace((unsigned char)key[i]) || (unsigned char)key[i] < 0x21 || key[i] == '"') {
				snprintf(why, why_cap, "the key of tenant \"%.64s\" contains whitespace or a quote", tenant);
				return false;
			}
		}
		for (size_t i = 0; i < n; i++) {
			if (strcmp(out[i].key, key) == 0) {
				snprintf(why, why_cap, "the same key is given twice (tenants \"%.64s\" and \"%.64s\")",
					 out[i].tenant, tenant);
				return false;
			}
		}
		memcpy(out[n].tenant, tenant, strlen(tenant) + 1); /* kvt_name_valid: <= KVT_NAME_MAX bytes */
		memcpy(out[n].key, key, kl + 1);
		n++;
		if (!e)
			break;
		p = e + 1;
		if (!*p) {
			snprintf(why, why_cap, "trailing comma");
			return false;
		}
	}
	*n_out = n;
	return true;
}

/* ---- applying one key ----------------------------------------------------------------- */

static void range_text(const key_def *k, char *out, size_t cap)
{
	char lo[48], hi[48];
	fmt_num(k->min, lo, sizeof(lo));
	fmt_num(k->max, hi, sizeof(hi));
	snprintf(out, cap, "%s%s .. %s%s", k->min_open ? "> " : "", lo, hi, k->min_open ? "" : "");
}

/* Apply value to key k of c. On failure writes "where: ..." to err and leaves c alone. */
static int apply_key(kvt_config *c, const key_def *k, const char *value, const char *where, char *err, size_t cap)
{
	char *base = (char *)c;
	char allowed[256], range[256];
	const char *sec = k->section, *name = k->name;

	switch (k->type) {
	case V_U32: {
		uint64_t v;
		range_text(k, range, sizeof(range));
		if (!parse_u64_dec(value, &v)) {
			set_err(err, cap, where, "[%s] %s = \"%s\": not a whole number (allowed: %s)", sec, name, value,
				range);
			return KVT_EINVAL;
		}
		if ((double)v < k->min || (double)v > k->max) {
			set_err(err, cap, where, "[%s] %s = %s: out of range (allowed: %s)", sec, name, value, range);
			return KVT_EINVAL;
		}
		*(uint32_t *)(base + k->off) = (uint32_t)v;
		return KVT_OK;
	}
	case V_SIZE:
	case V_TIERCAP: {
		uint64_t v;
		bool overflow;
		char lo[48], hi[48];
		fmt_bytes((uint64_t)k->min, lo, sizeof(lo));
		fmt_bytes((uint64_t)k->max, hi, sizeof(hi));
		snprintf(range, sizeof(range), "%sbytes %s .. %s, with an optional K/M/G/T/P suffix (powers of 1024)",
			 k->allow_auto ? "\"auto\", or " : "", lo, hi);
		if (k->type == V_TIERCAP && strcasecmp(value, "auto") == 0) {
			if (!k->allow_auto) {
				set_err(err, cap, where, "[%s] %s = auto: not accepted for this tier (allowed: %s)", sec,
					name, range);
				return KVT_EINVAL;
			}
			kvt_tier_config *t = (kvt_tier_config *)(base + k->off);
			t->capacity_bytes = 0;
			t->capacity_auto = true;
			return KVT_OK;
		}
		if (!parse_size(value, &v, &overflow)) {
			if (overflow) {
				set_err(err, cap, where, "[%s] %s = %s: out of range (allowed: %s)", sec, name, value, range);
				return KVT_EINVAL;
			}
			set_err(err, cap, where, "[%s] %s = \"%s\": not a size (allowed: %s)", sec, name, value, range);
			return KVT_EINVAL;
		}
		if ((double)v < k->min || (double)v > k->max || (k->type == V_SIZE && v > SIZE_MAX)) {
			set_err(err, cap, where, "[%s] %s = %s: out of range (allowed: %s)", sec, name, value, range);
			return KVT_EINVAL;
		}
		if (k->type == V_SIZE) {
			*(size_t *)(base + k->off) = (size_t)v;
		} else {
			kvt_tier_config *t = (kvt_tier_config *)(base + k->off);
			t->capacity_bytes = v;
			t->capacity_auto = false;
		}
		return KVT_OK;
	}
	case V_FRACTION:
	case V_DURATION: {
		double v;
		bool ok = k->type == V_FRACTION ? parse_double(value, &v) : parse_duration(value, &v);
		range_text(k, range, sizeof(range));
		if (!ok) {
			set_err(err, cap, where, "[%s] %s = \"%s\": not a %s (allowed: %s%s)", sec, name, value,
				k->type == V_FRACTION ? "fraction" : "duration", range,
				k->type == V_DURATION ? " seconds; e.g. 1.5, 1.5s, 250ms" : "");
			return KVT_EINVAL;
		}
		if ((k->min_open ? !(v > k->min) : !(v >= k->min)) || !(v <= k->max)) {
			set_err(err, cap, where, "[%s] %s = %s: out of range (allowed: %s%s)", sec, name, value, range,
				k->type == V_DURATION ? " seconds" : "");
			return KVT_EINVAL;
		}
		if (k->type == V_FRACTION)
			*(float *)(base + k->off) = (float)v;
		else
			*(double *)(base + k->off) = v;
		return KVT_OK;
	}
	case V_BOOL: {
		bool v;
		if (!parse_bool(value, &v)) {
			set_err(err, cap, where, "[%s] %s = \"%s\": not a boolean (allowed: true|false|yes|no|on|off|1|0)",
				sec, name, value);
			return KVT_EINVAL;
		}
		*(bool *)(base + k->off) = v;
		return KVT_OK;
	}
	case V_ENUM:
	case V_ENUMBOOL:
		for (size_t i = 0; k->names[i]; i++) {
			if (strcmp(value, k->names[i]) == 0) {
				if (k->type == V_ENUM)
					*(int *)(base + k->off) = k->values[i];
				else
					*(bool *)(base + k->off) = k->values[i] != 0;
				return KVT_OK;
			}
		}
		join_names(k->names, allowed, sizeof(allowed));
		set_err(err, cap, where, "[%s] %s = \"%s\": unknown value (allowed: %s)", sec, name, value, allowed);
		return KVT_EINVAL;
	case V_STRING: {
		size_t n = strlen(value);
		if (n >= k->size) {
			set_err(err, cap, where, "[%s] %s: value is %zu bytes (allowed: at most %zu)", sec, name, n,
				k->size - 1);
			return KVT_EINVAL;
		}
		memset(base + k->off, 0, k->size); /* no stale bytes after the NUL: configs compare with memcmp */
		memcpy(base + k->off, value, n + 1);
		return KVT_OK;
	}
	case V_LISTEN: {
		const char *why = NULL;
		char host[sizeof(c->listen_host)];
		uint16_t port = 0;
		memset(host, 0, sizeof(host));
		if (!(k->allow_auto && !value[0]) && !parse_listen(value, host, sizeof(host), &port, &why)) {
			set_err(err, cap, where,
				"[%s] %s = \"%s\": %s (allowed: HOST:PORT with a numeric host, e.g. 127.0.0.1:8080, "
				"0.0.0.0:8080, [::1]:8080)",
				sec, name, value, why);
			return KVT_EINVAL;
		}
		memcpy(base + k->off, host, sizeof(host));
		*(uint16_t *)(base + k->size) = port;
		return KVT_OK;
	}
	case V_APIKEYS: {
		kvt_api_key tmp[KVT_CONFIG_MAX_KEYS];
		size_t n = 0;
		char why[256];
		if (!parse_api_keys(value, tmp, &n, why, sizeof(why))) {
			/* NOTE: never echo the value: it holds secrets. */
			set_err(err, cap, where,
				"[%s] %s: %s (allowed: \"tenant:key, tenant2:key2\" or one bare key; tenants 1..%d of "
				"[A-Za-z0-9._-]; at most %d keys)",
				sec, name, why, KVT_NAME_MAX, KVT_CONFIG_MAX_KEYS);
			return KVT_EINVAL;
		}
		kvt_api_key *dst = (kvt_api_key *)(base + k->off);
		memset(dst, 0, KVT_CONFIG_MAX_KEYS * sizeof(*dst));
		memcpy(dst, tmp, n * sizeof(tmp[0]));
		*(size_t *)(base + k->size) = n;
		return KVT_OK;
	}
	case V_QUOTAS: {
		kvt_quota_list tmp;
		char why[256];
		if (!parse_quotas(value, &tmp, why, sizeof(why))) {
			set_err(err, cap, where, "[%s] %s: %s (allowed: \"tenant:SIZE, tenant2:SIZE, *:SIZE\", at most %d)",
				sec, name, why, KVT_CONFIG_MAX_QUOTAS);
			return KVT_EINVAL;
		}
		memcpy(base + k->off, &tmp, sizeof(tmp));
		return KVT_OK;
	}
	}
	KVT_ASSERT(0);
	return KVT_EINVAL;
}

/* ---- defaults, lookup --------------------------------------------------------------------- */

void kvt_config_default(kvt_config *c)
{
	char err[256];
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < N_KEYS; i++) {
		int rc = apply_key(c, &keys[i], keys[i].def, "default", err, sizeof(err));
		KVT_ASSERT(rc == KVT_OK); /* the table's defaults are programmer-owned */
	}
}

static bool section_known(const char *s)
{
	for (size_t i = 0; i < N_SECTIONS; i++)
		if (strcmp(sections[i], s) == 0)
			return true;
	return false;
}

static const key_def *find_key(const char *section, const char *name)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (strcmp(keys[i].section, section) == 0 && strcmp(keys[i].name, name) == 0)
			return &keys[i];
	return NULL;
}

/* Levenshtein distance, capped inputs (key names are short). */
static size_t edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	size_t row[64];
	if (la > 63 || lb > 63)
		return 64;
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t prev = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t cur = row[j];
			size_t sub = prev + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
			size_t m = row[j] + 1 < row[j - 1] + 1 ? row[j] + 1 : row[j - 1] + 1;
			row[j] = m < sub ? m : sub;
			prev = cur;
		}
	}
	return row[lb];
}

/* "unknown key" message: the closest key of this section, or the same key elsewhere, and the section's keys. */
static void unknown_key(const char *section, const char *name, const char *where, char *err, size_t cap)
{
	const key_def *best = NULL, *elsewhere = NULL;
	size_t best_d = (size_t)-1;
	char list[1024];
	size_t n = 0;
	list[0] = '\0';
	for (size_t i = 0; i < N_KEYS; i++) {
		if (strcmp(keys[i].section, section) != 0) {
			if (!elsewhere && strcmp(keys[i].name, name) == 0)
				elsewhere = &keys[i];
			continue;
		}
		n += (size_t)snprintf(list + n, n < sizeof(list) ? sizeof(list) - n : 0, "%s%s", n ? ", " : "",
				      keys[i].name);
		size_t d = edit_distance(name, keys[i].name);
		if (d < best_d) {
			best_d = d;
			best = &keys[i];
		}
	}
	/* A suggestion only when it is plausibly a typo: at most a third of the name changed. */
	size_t limit = strlen(name) / 3 + 1;
	if (elsewhere && !(best && best_d == 0))
		set_err(err, cap, where, "unknown key '%s' in [%s] (did you mean '%s' in [%s]?; keys of [%s]: %s)", name,
			section, name, elsewhere->section, section, list);
	else if (best && best_d <= limit)
		set_err(err, cap, where, "unknown key '%s' in [%s] (did you mean '%s'?; keys of [%s]: %s)", name, section,
			best->name, section, list);
	else
		set_err(err, cap, where, "unknown key '%s' in [%s] (keys of [%s]: %s)", name, section, section, list);
}

const char *kvt_config_find(const char *explicit_path)
{
	if (explicit_path && explicit_path[0])
		return explicit_path;
	const char *env = getenv("KVTIER_CONFIG");
	if (env && env[0])
		return env;
	if (access(KVT_CONFIG_DEFAULT_PATH, F_OK) == 0)
		return KVT_CONFIG_DEFAULT_PATH;
	return NULL;
}

/* ---- the file parser ------------------------------------------------------------------------ */

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	size_t n = strlen(s);
	while (n && isspace((unsigned char)s[n - 1]))
		s[--n] = '\0';
	return s;
}

/*
 * The value part of "key = value": a comment starts at '#' or ';' preceded by
 * whitespace; a value in double quotes keeps everything inside (\" and \\
 * escapes). On error sets *why.
 */
static bool parse_value(char *v, const char **why)
{
	char *s = v; /* rewritten in place */
	while (isspace((unsigned char)*s))
		s++;
	if (*s == '"') {
		char *w = v, *r = s + 1;
		for (;;) {
			if (!*r) {
				*why = "unterminated quoted string";
				return false;
			}
			if (*r == '"')
				break;
			if (*r == '\\' && (r[1] == '"' || r[1] == '\\'))
				r++;
			*w++ = *r++;
		}
		char *rest = r + 1;
		while (isspace((unsigned char)*rest))
			rest++;
		if (*rest && *rest != '#' && *rest != ';') {
			*why = "text after the closing quote";
			return false;
		}
		*w = '\0';
		return true;
	}
	/* unquoted: cut at a comment marker that follows whitespace */
	char *p = s;
	for (; *p; p++) {
		if ((*p == '#' || *p == ';') && p > s && isspace((unsigned char)p[-1])) {
			*p = '\0';
			break;
		}
		if ((*p == '#' || *p == ';') && p == s) {
			*p = '\0';
			break;
		}
	}
	memmove(v, s, strlen(s) + 1);
	trim(v);
	return true;
}

int kvt_config_load(kvt_config *c, const char *path, char *err, size_t cap)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		int e = errno;
		set_err(err, cap, path, "cannot open the configuration file: %s", strerror(e));
		return e == ENOENT ? KVT_ENOTFOUND : KVT_EIO;
	}
	kvt_config *tmp = malloc(sizeof(*tmp));
	char *line = NULL;
	size_t line_cap = 0;
	bool seen[N_KEYS];
	unsigned seen_line[N_KEYS];
	char section[64] = "", where[KVT_CONFIG_PATH_MAX + 32];
	unsigned lineno = 0;
	size_t total = 0;
	int rc = KVT_OK;

	if (!tmp) {
		set_err(err, cap, path, "out of memory");
		rc = KVT_ENOMEM;
		goto out;
	}
	memcpy(tmp, c, sizeof(*tmp));
	memset(seen, 0, sizeof(seen));
	memset(seen_line, 0, sizeof(seen_line));

	ssize_t got;
	while ((got = getline(&line, &line_cap, f)) >= 0) {
		size_t len = (size_t)got;
		lineno++;
		snprintf(where, sizeof(where), "%s:%u", path, lineno);
		total += len;
		if (total > KVT_CONFIG_FILE_MAX) {
			set_err(err, cap, where, "file too large (allowed: at most %u bytes)", KVT_CONFIG_FILE_MAX);
			rc = KVT_EINVAL;
			goto out;
		}
		if (len > KVT_CONFIG_LINE_MAX) {
			set_err(err, cap, where, "line too long (allowed: at most %d bytes)", KVT_CONFIG_LINE_MAX);
			rc = KVT_EINVAL;
			goto out;
		}
		if (strlen(line) != len) {
			set_err(err, cap, where, "a NUL byte in the line (not a text file?)");
			rc = KVT_EINVAL;
			goto out;
		}
		char *s = trim(line);
		if (lineno == 1 && (unsigned char)s[0] == 0xEF && (unsigned char)s[1] == 0xBB &&
		    (unsigned char)s[2] == 0xBF)
			s = trim(s + 3); /* a UTF-8 byte order mark */
		if (!*s || *s == '#' || *s == ';')
			continue;
		if (*s == '[') {
			char *rb = strchr(s, ']');
			if (!rb) {
				set_err(err, cap, where, "section header without ']' (expected [section])");
				rc = KVT_EINVAL;
				goto out;
			}
			char *rest = trim(rb + 1);
			if (*rest && *rest != '#' && *rest != ';') {
				set_err(err, cap, where, "text after the section header");
				rc = KVT_EINVAL;
				goto out;
			}
			*rb = '\0';
			char *name = trim(s + 1);
			if (!section_known(name)) {
				char list[256];
				size_t n = 0;
				for (size_t i = 0; i < N_SECTIONS; i++)
					n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", sections[i]);
				set_err(err, cap, where, "unknown section [%.64s] (allowed: %s)", name, list);
				rc = KVT_EINVAL;
				goto out;
			}
			snprintf(section, sizeof(section), "%s", name);
			continue;
		}
		char *eq = strchr(s, '=');
		if (!eq) {
			set_err(err, cap, where, "expected \"key = value\", \"[section]\" or a comment");
			rc = KVT_EINVAL;
			goto out;
		}
		*eq = '\0';
		char *name = trim(s);
		char *value = eq + 1;
		if (!*name) {
			set_err(err, cap, where, "a value without a key name");
			rc = KVT_EINVAL;
			goto out;
		}
		if (!section[0]) {
			set_err(err, cap, where, "key '%.64s' before any [section] (allowed sections: server, model, cache, "
				"tier.hbm, tier.host, tier.nvme, tier.remote, index, log)", name);
			rc = KVT_EINVAL;
			goto out;
		}
		const key_def *k = find_key(section, name);
		if (!k) {
			char nm[65];
			snprintf(nm, sizeof(nm), "%s", name);
			unknown_key(section, nm, where, err, cap);
			rc = KVT_EINVAL;
			goto out;
		}
		size_t ki = (size_t)(k - keys);
		if (seen[ki]) {
			set_err(err, cap, where, "duplicate key '%s' in [%s] (first set on line %u; each key may be set once)",
				k->name, k->section, seen_line[ki]);
			rc = KVT_EINVAL;
			goto out;
		}
		const char *why = NULL;
		if (!parse_value(value, &why)) {
			set_err(err, cap, where, "[%s] %s: %s", k->section, k->name, why);
			rc = KVT_EINVAL;
			goto out;
		}
		if ((rc = apply_key(tmp, k, value, where, err, cap)) != KVT_OK)
			goto out;
		seen[ki] = true;
		seen_line[ki] = lineno;
	}
	if (ferror(f)) {
		set_err(err, cap, path, "read error: %s", strerror(errno));
		rc = KVT_EIO;
		goto out;
	}
	snprintf(tmp->source, sizeof(tmp->source), "%s", path);
	memcpy(c, tmp, sizeof(*c));
out:
	fclose(f);
	free(tmp);
	free(line);
	return rc;
}

int kvt_config_set(kvt_config *c, const char *section, const char *key, const char *value, char *err, size_t cap)
{
	/* No place prefix: the caller names the flag ("kvtierd: --listen: <err>"). */
	const char *where = NULL;
	if (!section || !key || !value) {
		set_err(err, cap, where, "missing section, key or value");
		return KVT_EINVAL;
	}
	if (!section_known(section)) {
		set_err(err, cap, where, "unknown section [%.64s] (allowed: server, model, cache, tier.hbm, tier.host, "
			"tier.nvme, tier.remote, store, index, log)", section);
		return KVT_EINVAL;
	}
	const key_def *k = find_key(section, key);
	if (!k) {
		char nm[65];
		snprintf(nm, sizeof(nm), "%s", key);
		unknown_key(section, nm, where, err, cap);
		return KVT_EINVAL;
	}
	/* apply_key checks the whole value before it writes its field(s): a bad value changes nothing */
	return apply_key(c, k, value, where, err, cap);
}

/* ---- the NVMe tier's size against the disk ------------------------------------------------------ */

int kvt_config_nvme_capacity(const kvt_tier_config *t, uint64_t free_bytes, uint64_t existing_bytes,
			     uint64_t *out, char *err, size_t cap)
{
	char want[48], avail[48];
	if (!t->capacity_auto && t->capacity_bytes == 0) {
		*out = 0; /* no NVMe tier */
		return KVT_OK;
	}
	if (existing_bytes) {
		/* The store keeps an existing file's size: it needs no new space. */
		*out = t->capacity_auto ? existing_bytes : t->capacity_bytes;
		return KVT_OK;
	}
	if (t->capacity_auto) {
		uint64_t v = free_bytes / 2;
		if (v > KVT_NVME_AUTO_MAX)
			v = KVT_NVME_AUTO_MAX;
		v = v / (1u << 20) * (1u << 20);
		if (v < KVT_NVME_AUTO_MIN)
			v = KVT_NVME_AUTO_MIN;
		if (v > free_bytes) {
			fmt_bytes(KVT_NVME_AUTO_MIN, want, sizeof(want));
			set_err(err, cap, NULL,
				"[tier.nvme] capacity = auto: the file system has %llu bytes free, less than the %s the "
				"NVMe tier needs at least; free some space, or set capacity = 0 (no NVMe tier)",
				(unsigned long long)free_bytes, want);
			return KVT_EFULL;
		}
		*out = v;
		return KVT_OK;
	}
	if (t->capacity_bytes > free_bytes) {
		fmt_bytes(t->capacity_bytes, want, sizeof(want));
		snprintf(avail, sizeof(avail), "%.1f MiB", (double)free_bytes / 1048576.0);
		set_err(err, cap, NULL,
			"[tier.nvme] capacity = %s (%llu bytes) is larger than the free space of its file system (%llu "
			"bytes, %s): lower it, or use capacity = auto",
			want, (unsigned long long)t->capacity_bytes, (unsigned long long)free_bytes, avail);
		return KVT_EFULL;
	}
	*out = t->capacity_bytes;
	return KVT_OK;
}

/* ---- cross-key rules ------------------------------------------------------------------------ */

bool kvt_config_listen_loopback(const kvt_config *c)
{
	return kvt_config_host_loopback(c->listen_host);
}

bool kvt_config_store_enabled(const kvt_config *c)
{
	return c->store_listen_host[0] != '\0';
}

bool kvt_config_host_loopback(const char *host)
{
	struct in_addr a4;
	struct in6_addr a6;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6) ||
		       (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
	return false;
}

int kvt_config_validate(const kvt_config *c, char *err, size_t cap)
{
	const char *where = NULL; /* the caller names the file (or the flags) */
	static const char *const tn[3] = { "tier.hbm", "tier.host", "tier.nvme" };
	const kvt_tier_config *t[3] = { &c->hbm, &c->host, &c->nvme };
	for (int i = 0; i < 3; i++) {
		if (!(t[i]->low < t[i]->high)) {
			set_err(err, cap, where, "[%s] low_watermark %g must be below high_watermark %g", tn[i],
				(double)t[i]->low, (double)t[i]->high);
			return KVT_EINVAL;
		}
		if (!(t[i]->high > 0 && t[i]->high <= 1) || !(t[i]->low >= 0)) {
			set_err(err, cap, where, "[%s] watermarks must be fractions: 0 <= low < high <= 1", tn[i]);
			return KVT_EINVAL;
		}
	}
	if (!c->hbm.capacity_auto && c->hbm.capacity_bytes == 0) {
		set_err(err, cap, where, "[tier.hbm] capacity must be \"auto\" or > 0 (the engine decodes from it)");
		return KVT_EINVAL;
	}
	if (!c->host.capacity_auto && c->host.capacity_bytes == 0) {
		set_err(err, cap, where, "[tier.host] capacity must be \"auto\" or > 0");
		return KVT_EINVAL;
	}
	if (c->nvme.capacity_bytes != 0 && c->nvme.capacity_bytes < (1u << 20)) {
		set_err(err, cap, where, "[tier.nvme] capacity %llu: must be 0 (no NVMe tier) or at least 1M",
			(unsigned long long)c->nvme.capacity_bytes);
		return KVT_EINVAL;
	}
	if (c->block_tokens < 1 || c->block_tokens > KVT_BLOCK_MAX_TOKENS) {
		set_err(err, cap, where, "[cache] block_tokens %u out of range (allowed: 1 .. %d)", c->block_tokens,
			KVT_BLOCK_MAX_TOKENS);
		return KVT_EINVAL;
	}
	if (c->max_ctx != 0 && c->max_ctx < c->block_tokens) {
		set_err(err, cap, where, "[model] context %u is smaller than [cache] block_tokens %u", c->max_ctx,
			c->block_tokens);
		return KVT_EINVAL;
	}
	{
		kvt_sched_config sc; /* only the priorities are read and written: no engine defaults needed */
		char why[256];
		memset(&sc, 0, sizeof(sc));
		if (kvt_sched_parse_priorities(c->priorities, &sc, why, sizeof(why))) {
			set_err(err, cap, where,
				"[scheduler] priorities: %s (allowed: \"tenant:prio, ..., *:prio\", prio %d..%d)", why,
				KVT_PRIORITY_MIN, KVT_PRIORITY_MAX);
			return KVT_EINVAL;
		}
	}
	if (c->default_max_tokens > c->max_tokens_limit) {
		set_err(err, cap, where, "[server] default_max_tokens %u exceeds max_tokens_limit %u",
			c->default_max_tokens, c->max_tokens_limit);
		return KVT_EINVAL;
	}
	if (c->metrics_admin && !c->n_admin_keys) {
		set_err(err, cap, where, "[server] metrics = admin needs at least one key in admin_keys");
		return KVT_EINVAL;
	}
	if (kvt_config_store_enabled(c) && c->store_listen_port != 0 && c->store_listen_port == c->listen_port &&
	    !strcmp(c->store_listen_host, c->listen_host)) {
		set_err(err, cap, where, "[store] listen %s:%u is [server] listen too: give the store its own port",
			c->store_listen_host, c->store_listen_port);
		return KVT_EINVAL;
	}
	char why[160];
	if (kvt_server_cors_parse(c->cors_origins, NULL, why, sizeof(why)) != KVT_OK) {
		set_err(err, cap, where, "[server] cors_origins: %s", why);
		return KVT_EINVAL;
	}
	if (c->max_connections_per_ip > c->max_connections) {
		set_err(err, cap, where, "[server] max_connections_per_ip %u exceeds max_connections %u",
			c->max_connections_per_ip, c->max_connections);
		return KVT_EINVAL;
	}
	if (c->remote_enabled && !c->remote_seeds[0]) {
		set_err(err, cap, where, "[tier.remote] enabled = true needs seeds (host:port, comma-separated)");
		return KVT_EINVAL;
	}
	if (c->remote_ttl_s != (double)(uint32_t)c->remote_ttl_s) {
		set_err(err, cap, where, "[tier.remote] ttl %g: must be whole seconds", c->remote_ttl_s);
		return KVT_EINVAL;
	}
	for (const char *q = c->remote_prefix; *q; q++)
		if ((unsigned char)*q <= ' ' || *q == 0x7f || *q == '{' || *q == '}') {
			set_err(err, cap, where, "[tier.remote] prefix \"%.64s\": no spaces, control characters or braces "
				"(a brace would make a hash tag and put every key in one slot)", c->remote_prefix);
			return KVT_EINVAL;
		}
	if (!c->data_dir[0]) {
		set_err(err, cap, where, "[index] data_dir must not be empty");
		return KVT_EINVAL;
	}
	if (c->n_api_keys > KVT_CONFIG_MAX_KEYS) {
		set_err(err, cap, where, "[server] api_keys: more than %d keys", KVT_CONFIG_MAX_KEYS);
		return KVT_EINVAL;
	}
	for (size_t i = 0; i < c->n_api_keys; i++) {
		if (!kvt_name_valid(c->api_keys[i].tenant) || !c->api_keys[i].key[0]) {
			set_err(err, cap, where, "[server] api_keys: entry %zu has a bad tenant or an empty key", i + 1);
			return KVT_EINVAL;
		}
	}
	for (size_t i = 0; i < c->n_admin_keys; i++) {
		if (!kvt_name_valid(c->admin_keys[i].tenant) || !c->admin_keys[i].key[0]) {
			set_err(err, cap, where, "[server] admin_keys: entry %zu has a bad tenant or an empty key", i + 1);
			return KVT_EINVAL;
		}
		for (size_t j = 0; j < c->n_api_keys; j++)
			if (!strcmp(c->admin_keys[i].key, c->api_keys[j].key)) {
				set_err(err, cap, where,
					"[server] admin_keys: entry %zu is also a key of api_keys (tenant \"%.64s\"); "
					"a key is either an admin's or a tenant's",
					i + 1, c->api_keys[j].tenant);
				return KVT_EINVAL;
			}
	}
	if (c->device < KVT_DEVICE_AUTO || c->device > KVT_DEVICE_CPU || c->persist < 0 || c->persist > 1 ||
	    c->host_dtype < 0 || c->host_dtype >= KVT_KV_CODEC_COUNT || c->nvme_io < KVT_T2_IO_AUTO ||
	    c->nvme_io > KVT_T2_IO_THREADS || c->log_level < KVT_LOG_ERROR || c->log_level > KVT_LOG_DEBUG ||
	    c->remote_mode < 0 || c->remote_mode > 1 || c->remote_write < KVT_T3_WRITE_THROUGH ||
	    c->remote_write > KVT_T3_ON_DEMOTE || c->chat_template < KVT_TOK_CHAT_AUTO ||
	    c->chat_template > KVT_TOK_CHAT_LLAMA3) {
		set_err(err, cap, where, "an enum field holds a value outside its enum");
		return KVT_EINVAL;
	}
	return KVT_OK;
}

/* ---- writing ----------------------------------------------------------------------------------- */

static void write_size(FILE *f, uint64_t v)
{
	static const char suf[] = "TGMK";
	for (int i = 0; i < 4; i++) {
		uint64_t unit = 1ull << (10 * (4 - i));
		if (v && v % unit == 0) {
			fprintf(f, "%llu%c", (unsigned long long)(v / unit), suf[i]);
			return;
		}
	}
	fprintf(f, "%llu", (unsigned long long)v);
}

static void write_string(FILE *f, const char *s)
{
	bool quote = !s[0] || strpbrk(s, "#;\"\\") || isspace((unsigned char)s[0]) ||
		     isspace((unsigned char)s[strlen(s) - 1]);
	if (!quote) {
		fputs(s, f);
		return;
	}
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		fputc(*s, f);
	}
	fputc('"', f);
}

static const char *enum_name(const key_def *k, int v)
{
	for (size_t i = 0; k->names[i]; i++)
		if (k->values[i] == v)
			return k->names[i];
	return "?";
}

int kvt_config_write(const kvt_config *c, FILE *f)
{
	const char *base = (const char *)c;
	const char *cur = "";
	fprintf(f, "# kvtier effective configuration (%s%s)\n", c->source[0] ? "from " : "built-in defaults",
		c->source[0] ? c->source : "");
	for (size_t i = 0; i < N_KEYS; i++) {
		const key_def *k = &keys[i];
		if (strcmp(cur, k->section) != 0) {
			fprintf(f, "\n[%s]\n", k->section);
			cur = k->section;
		}
		if (k->type == V_APIKEYS) {
			/* NOTE: keys are secrets and this output goes to logs: name the tenants only. */
			const kvt_api_key *ks = (const kvt_api_key *)(base + k->off);
			size_t nk = *(const size_t *)(base + k->size);
			if (nk == 0) {
				fprintf(f, "%s = \"\"\n", k->name);
			} else {
				fprintf(f, "# %s: %zu key(s) configured, not printed; tenants:", k->name, nk);
				for (size_t j = 0; j < nk; j++)
					fprintf(f, "%s %s", j ? "," : "", ks[j].tenant);
				fputc('\n', f);
			}
			continue;
		}
		fprintf(f, "%s = ", k->name);
		switch (k->type) {
		case V_U32: fprintf(f, "%u", *(const uint32_t *)(base + k->off)); break;
		case V_SIZE: write_size(f, *(const size_t *)(base + k->off)); break;
		case V_TIERCAP: {
			const kvt_tier_config *t = (const kvt_tier_config *)(base + k->off);
			if (t->capacity_auto)
				fputs("auto", f);
			else
				write_size(f, t->capacity_bytes);
			break;
		}
		case V_FRACTION: {
			/* the shortest text that reads back as the same float */
			float v = *(const float *)(base + k->off);
			char buf[32];
			for (int prec = 2; prec <= 9; prec++) {
				snprintf(buf, sizeof(buf), "%.*g", prec, (double)v);
				if (strtof(buf, NULL) == v)
					break;
			}
			fputs(buf, f);
			break;
		}
		case V_DURATION: {
			double v = *(const double *)(base + k->off);
			char buf[40];
			for (int prec = 6; prec <= 17; prec++) {
				snprintf(buf, sizeof(buf), "%.*g", prec, v);
				if (strtod(buf, NULL) == v)
					break;
			}
			fputs(buf, f);
			break;
		}
		case V_BOOL: fputs(*(const bool *)(base + k->off) ? "true" : "false", f); break;
		case V_ENUM: fputs(enum_name(k, *(const int *)(base + k->off)), f); break;
		case V_ENUMBOOL: fputs(enum_name(k, *(const bool *)(base + k->off) ? 1 : 0), f); break;
		case V_STRING: write_string(f, base + k->off); break;
		case V_LISTEN: {
			const char *h = (const char *)(base + k->off);
			unsigned port = *(const uint16_t *)(base + k->size);
			if (!h[0])
				fputs("\"\"", f);
			else if (strchr(h, ':'))
				fprintf(f, "[%s]:%u", h, port);
			else
				fprintf(f, "%s:%u", h, port);
			break;
		}
		case V_APIKEYS: break;
		case V_QUOTAS: {
			const kvt_quota_list *q = (const kvt_quota_list *)(base + k->off);
			fputc('"', f);
			for (size_t j = 0; j < q->n; j++) {
				fprintf(f, "%s%s:", j ? ", " : "", q->e[j].tenant);
				write_size(f, q->e[j].bytes);
			}
			fputc('"', f);
			break;
		}
		}
		fputc('\n', f);
	}
	return ferror(f) ? KVT_EIO : KVT_OK;
}
