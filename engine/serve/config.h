/*
 * engine/serve/config.h — kvtierd's configuration: one INI file, every key with a
 * default (configs/kvtier.conf documents them all).
 *
 * Lookup: -c FILE, else $KVTIER_CONFIG, else /etc/kvtier/kvtier.conf when it
 * exists, else the built-in defaults. Command-line flags override the file
 * for the common keys (kvt_config_set). An unknown section or key, a
 * duplicate key, or a bad value fails with "FILE:LINE: ..." naming the key and
 * the allowed values; nothing is half-applied.
 *
 * Syntax: "[section]" lines, "key = value" lines, '#' or ';' comments (whole
 * lines, or after whitespace), blank lines. Values: integers, sizes with an
 * optional K/M/G/T suffix (powers of 1024: "64M", "2G"; "auto" where noted),
 * fractions in [0, 1], durations in seconds ("1.5", or with s/ms suffix),
 * booleans (true/false/yes/no/on/off/1/0), enums, strings (optionally "quoted").
 */
#ifndef KVT_CONFIG_H
#define KVT_CONFIG_H

#include "kvt.h"
#include "server.h"

#include <stdio.h>

#define KVT_CONFIG_MAX_KEYS 16
#define KVT_CONFIG_PATH_MAX 4096

#define KVT_CONFIG_MAX_QUOTAS 64

/* One "tenant:SIZE" entry of a [tenants] quota list ("*" = every tenant not named). */
typedef struct kvt_quota_entry {
	char tenant[KVT_NAME_MAX + 1]; /* a tenant name, or "*" */
	uint64_t bytes;                /* the most retained bytes (0 = no limit) */
} kvt_quota_entry;

/* A quota list: retain_quota (all tiers) or retain_quota_<tier>. */
typedef struct kvt_quota_list {
	kvt_quota_entry e[KVT_CONFIG_MAX_QUOTAS]; /* [n] */
	size_t n;
} kvt_quota_list;

enum kvt_device_choice { KVT_DEVICE_AUTO = 0, KVT_DEVICE_CUDA = 1, KVT_DEVICE_CPU = 2 };

typedef struct kvt_tier_config {
	uint64_t capacity_bytes; /* 0 with capacity_auto: sized by the daemon (see each tier) */
	bool capacity_auto;      /* "auto" */
	float high;              /* high watermark, fraction (0, 1] */
	float low;               /* low watermark, < high */
} kvt_tier_config;

typedef struct kvt_config {
	/* [server] */
	char listen_host[256];         /* listen = HOST:PORT (default 127.0.0.1:8080; [v6]:port accepted) */
	uint16_t listen_port;
	uint32_t server_threads;       /* threads = HTTP worker threads (default 4) */
	uint32_t max_connections;      /* max_connections: open connections in all (default 1024) */
	uint32_t max_connections_per_ip; /* max_connections_per_ip (default 64; 0 = no limit) */
	double header_timeout_s;       /* header_timeout: seconds to send a request's headers (default 15; 0 = none) */
	kvt_api_key api_keys[KVT_CONFIG_MAX_KEYS]; /* api_keys = "tenant:key, tenant2:key2" or one bare key (tenant "default") */
	size_t n_api_keys;
	char api_key_file[KVT_CONFIG_PATH_MAX]; /* api_key_file = path of a file with one "tenant:key" per line ("" = none) */
	kvt_api_key admin_keys[KVT_CONFIG_MAX_KEYS]; /* admin_keys: same syntax; these also see every tenant */
	size_t n_admin_keys;
	int metrics_admin;             /* metrics = open|admin (0/1): /metrics needs an admin key when 1 */
	bool allow_unauthenticated;    /* allow_unauthenticated: serve a non-loopback address with no key */
	uint32_t max_concurrent;       /* max_concurrent_requests (default 32) */
	uint32_t max_queue;            /* max_queue (default 64) */
	size_t max_header_bytes;       /* max_header_bytes (default 16K) */
	size_t max_body_bytes;         /* max_body_bytes (default 1M) */
	uint32_t max_tokens_limit;     /* max_tokens_limit (default 4096) */
	uint32_t default_max_tokens;   /* default_max_tokens (default 256) */
	uint32_t max_n;                /* max_n (default 4) */
	double request_timeout_s;      /* request_timeout (default 600) */
	double drain_timeout_s;        /* drain_timeout: SIGTERM waits this long for in-flight requests (default 30) */
	char secret_file[KVT_CONFIG_PATH_MAX]; /* secret_file: server secret for tenant salts ("" = DATA_DIR/secret, created 0600 with 32 random bytes) */
	char cors_origins[KVT_SERVER_CORS_MAX * (KVT_SERVER_ORIGIN_MAX + 2)]; /* cors_origins: origins allowed cross-origin requests, comma-separated (kvt_server_cors_parse; "" = none) */
	uint32_t n_slots;              /* parallel: slots llama-server's slot API exposes (default 1; -np) */
	char slot_save_path[KVT_CONFIG_PATH_MAX]; /* slot_save_path: directory of slot snapshot files ("" = slot save/restore off) */

	/* [model] */
	char model_path[KVT_CONFIG_PATH_MAX]; /* path (default models/SmolLM2-135M-Instruct-Q4_1.gguf... see conf) */
	int device;                    /* device = auto|cuda|cpu (enum kvt_device_choice) */
	int act_int8;                  /* activations = int16 (0) | int8 (1): kvt_dev_config.act_int8 */
	int fp_version;                /* fingerprint = auto (0: the data dir's, KVT_FP_CURRENT when new) | v1 | v2 */
	uint32_t model_threads;        /* threads: CPU backend worker threads (0 = all cores, default 0) */
	uint32_t max_ctx;              /* context = tokens per sequence (0 = the model's trained context, default 4096) */
	uint32_t max_batch;            /* batch = tokens per forward chunk (default 256) */
	int chat_template;             /* chat_template = auto|chatml|gemma|mistral|llama3 (enum kvt_tok_chat) */
	bool device_decode;            /* device_decode: greedy decode-only steps as one CUDA graph, tokens picked on the device (default true) */

	/* [cache] */
	uint32_t block_tokens;         /* block_tokens (default 16; 1..256) */
	int persist;                   /* persist = end_of_turn|write_back (enum kvt_persist) */
	double end_turn_s;             /* end_of_turn_deadline (default 1.0) */
	bool cache_enabled;            /* enabled (default true) */
	uint32_t max_running;          /* max_running: sequences per decode batch (default 16) */
	uint32_t prefill_chunk;        /* prefill_chunk (default 256) */
	int retain_tier;               /* retain_tier = hbm|host|nvme: floor of cache_control retention (default host) */
	int chunk_reuse;               /* chunk_reuse = off|marked|tools (enum kvt_chunk_reuse; default marked) */
	uint32_t chunk_min_tokens;     /* chunk_min_tokens: a marked span with fewer tokens is ordinary text (default 64) */
	float chunk_recompute;         /* chunk_recompute: fraction of a reused chunk's tokens recomputed (default 0.15) */
	float chunk_share;             /* chunk_share: share of each tier's blocks chunk blocks may hold (default 0.5) */

	/* [tenants] retention quotas, "tenant:SIZE, ..., *:SIZE" (tiers/manager.h, "Retention") */
	kvt_quota_list retain_quota;   /* retain_quota: retained bytes in all tiers */
	kvt_quota_list retain_quota_tier[3]; /* retain_quota_hbm / _host / _nvme: retained bytes whose floor is that tier */

	/* [scheduler] */
	int sched_policy;              /* policy = fair|fifo (enum kvt_sched_policy; default fair) */
	uint32_t aging_steps;          /* aging_steps: fair: a prompt passed over this many steps goes first (default 4) */
	float head_share;              /* head_share: fair: others' rows may delay the head prompt by (1/x - 1) times its length (default 0.8) */
	double priority_aging_s;       /* priority_aging: a waiting request gains one priority level per this (default 5; 0 = never) */
	int preempt;                   /* preempt = auto|swap|recompute (KVT_CONFIG_PREEMPT_AUTO, enum kvt_preempt_mode) */
	bool admit_longest;            /* admission = prompt|longest (default prompt) */
	char priorities[1024];         /* priorities = "tenant:prio, ..., *:prio" (default "") */

	/* [tier.hbm] capacity = bytes of T0 blocks (auto: GPU 4G; CPU the running batch's KV, kvtierd_main.c) */
	kvt_tier_config hbm;
	/* [tier.host] capacity (auto: 2G), watermarks, dtype = f16|fp8|int8 (default fp8) */
	kvt_tier_config host;
	int host_dtype;                /* enum kvt_kv_codec */
	int nvme_f16;                  /* [tier.nvme] dtype: 0 same (as host_dtype), 1 f16 (records from T0 exact) */
	int host_promotion;            /* promotion = auto|layered|sequential (KVT_CONFIG_PROMOTION_*) */
	uint32_t promotion_groups;     /* promotion_groups (default 4) */
	/* [tier.nvme] */
	kvt_tier_config nvme;          /* capacity (default 8G; 0 disables T2) */
	char nvme_path[KVT_CONFIG_PATH_MAX]; /* path ("" = DATA_DIR/kvtier.t2) */
	uint32_t nvme_queue_depth;     /* queue_depth (default 32) */
	bool nvme_compression;         /* compression = lz4|none (default none: real KV barely compresses) */
	int nvme_io;                   /* io = auto|uring|threads */
	uint32_t io_threads;           /* io_threads: promotion workers (default 2) */

	/* [tier.remote] T3, a Redis Cluster shared by several nodes (tiers/t3_remote.h) */
	bool remote_enabled;           /* enabled (default false) */
	char remote_seeds[1024];       /* seeds = "host:port, host:port" (required when enabled) */
	int remote_mode;               /* mode = cluster|single (1/0: kvt_rc_config.cluster) */
	char remote_user[256];         /* user: AUTH user ("" = the default user) */
	char remote_password_file[KVT_CONFIG_PATH_MAX]; /* password_file: the AUTH password ("" = no AUTH); never printed */
	double remote_connect_timeout_s; /* connect_timeout (default 0.2) */
	double remote_command_timeout_s; /* command_timeout: one pipelined round, at most (default 0.2) */
	char remote_prefix[65];        /* prefix of every key (default "kvt:") */
	uint32_t remote_pipeline;      /* pipeline_depth: commands in flight per node (default 64) */
	int remote_write;              /* write_policy = write_through|on_demote (enum kvt_t3_write) */
	double remote_ttl_s;           /* ttl: expiry of every record, whole seconds (0 = none, default) */

	/* [store] the Redis-protocol key-value store (engine/serve/resp.h over tiers/kvstore.h; docs/store.md) */
	char store_listen_host[256];   /* listen = HOST:PORT ("" = off, the default; port 0 = ephemeral) */
	uint16_t store_listen_port;
	float store_share;             /* share: fraction of [tier.host] and [tier.nvme] capacity sizing the store's RAM and file (default 0.25) */
	size_t store_max_value;        /* max_value: the largest value (default 512M) */
	bool store_durable;            /* durable: SET answered once on NVMe (default true) */
	double store_exists_lease_s;   /* exists_lease: EXISTS keeps a found key from eviction this long (default 5) */
	uint32_t store_max_connections; /* max_connections (default 1024) */

	/* [index] */
	char data_dir[KVT_CONFIG_PATH_MAX];   /* data_dir (default ./kvtier-data) */
	char index_path[KVT_CONFIG_PATH_MAX]; /* path ("" = DATA_DIR/index.sqlite) */
	size_t index_reserve_bytes;           /* reserve (default 16M; 0 = none): disk space kept for session rows */

	/* [log] */
	char log_file[KVT_CONFIG_PATH_MAX];   /* file ("" = stderr); reopened on SIGHUP */
	int log_level;                 /* level = error|warn|info|debug (the core log levels) */

	/* bookkeeping */
	char source[KVT_CONFIG_PATH_MAX];     /* the file the config came from ("" = built-in defaults) */
} kvt_config;

#define KVT_CONFIG_PROMOTION_AUTO (-1)      /* promotion = auto: layered on CUDA, sequential on the CPU backend */
#define KVT_CONFIG_PROMOTION_SEQUENTIAL 0
#define KVT_CONFIG_PROMOTION_LAYERED 1
#define KVT_CONFIG_PREEMPT_AUTO (-1) /* preempt = auto: swap when T1 is lossless (f16), else recompute */

/* The built-in defaults. */
void kvt_config_default(kvt_config *c);

/*
 * Parse a file over the defaults already in *c. On failure returns KVT_EINVAL
 * (or KVT_ENOTFOUND / KVT_EIO for an unreadable file) and writes one message
 * "FILE:LINE: what is wrong (allowed: ...)" to err (cap bytes); *c is left
 * unchanged on failure.
 */
int kvt_config_load(kvt_config *c, const char *path, char *err, size_t cap);

/*
 * Which file to read: explicit (from -c; may be NULL), else $KVTIER_CONFIG,
 * else /etc/kvtier/kvtier.conf if it exists, else NULL (defaults only).
 * Returns a pointer to explicit, getenv's string or a static string.
 */
const char *kvt_config_find(const char *explicit_path);

/*
 * Set one key as the file would ("section", "key", "value"), e.g. from a
 * flag: kvt_config_set(c, "server", "listen", "0.0.0.0:9000", err, cap).
 * Errors as kvt_config_load, with "--flag" context supplied by the caller
 * in err's prefix.
 */
int kvt_config_set(kvt_config *c, const char *section, const char *key, const char *value, char *err, size_t cap);

/* Check cross-key rules (low < high, ...). KVT_EINVAL with a message. */
int kvt_config_validate(const kvt_config *c, char *err, size_t cap);

/* Whether listen_host is a loopback address (127.0.0.0/8, ::1). */
bool kvt_config_listen_loopback(const kvt_config *c);
/* Whether host (numeric) is a loopback address; "" is not. */
bool kvt_config_host_loopback(const char *host);
/* Whether [store] listen is set (the Redis-protocol store is on). */
bool kvt_config_store_enabled(const kvt_config *c);
/*
 * The NVMe tier's size for a T2 file on a file system with free_bytes free
 * (statvfs f_bavail), where the file now has existing_bytes (0: no file yet).
 *  - capacity 0: 0 (no NVMe tier).
 *  - an existing file keeps its size (the store reuses it and needs no new
 *    space): *out = existing_bytes for auto, the configured size otherwise.
 *  - auto: half the free space, at most KVT_NVME_AUTO_MAX (8 GiB), rounded
 *    down to 1 MiB and at least KVT_NVME_AUTO_MIN (64 MiB); KVT_EFULL when
 *    even that does not fit.
 *  - an explicit size larger than the free space: KVT_EFULL, and err names
 *    both numbers.
 * Pure: the caller measures the file system (kvtierd logs the choice).
 */
#define KVT_NVME_AUTO_MAX (8ull << 30)
#define KVT_NVME_AUTO_MIN (64ull << 20)
int kvt_config_nvme_capacity(const kvt_tier_config *t, uint64_t free_bytes, uint64_t existing_bytes,
			     uint64_t *out, char *err, size_t cap);

/* Write the effective configuration as an INI file (for --print-config and the log). */
int kvt_config_write(const kvt_config *c, FILE *f);

#endif
