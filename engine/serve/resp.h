/*
 * engine/serve/resp.h — kvtierd's Redis-protocol (RESP2) listener: the
 * key-value store of tiers/kvstore.h served to clients that speak Redis
 * (LMCache's remote connectors in vLLM and SGLang: redis-py, and LMCache's
 * own native RESP client), so their KV lands in kvtier's tiers unchanged.
 * The subset served is specified in docs/store.md.
 *
 * Design: one accept thread and one thread per connection, on blocking
 * sockets (small stacks: KVT_RESP_STACK_BYTES). A connection reads what the
 * client sent, parses every command buffered (pipelining), runs each against
 * the store and appends its reply; the replies go out when no complete
 * command is left in what was read. Before they go out, every SET's and DEL's
 * ticket is waited on (kvt_kvs_wait), so pipelined writes share the store
 * writer's group commit and an +OK is never sent before the write it
 * acknowledges. A value is read straight into a kvt_kvs_val grown as its
 * bytes arrive (never allocated at the declared length up front), and a GET's
 * large value is written from the value's own buffer (writev, no copy).
 *
 * Invariants: a protocol error (bad framing, a length out of range, an inline
 * line too long) answers "-ERR Protocol error: ..." and closes the
 * connection, and never stores a part of a value; a SET is stored whole or
 * not at all. Over max_connections a new connection gets
 * "-ERR max number of clients reached" and is closed.
 *
 * Threads: start and stop from one thread; stats from any thread.
 */
#ifndef KVT_RESP_H
#define KVT_RESP_H

#include "kvstore.h"
#include "server.h"

#include <stdint.h>

#define KVT_RESP_STACK_BYTES (256u << 10)    /* stack of each connection thread */

typedef struct kvt_resp_config {
	const char *host;              /* numeric IPv4 or IPv6 listen address; borrowed for start only */
	uint16_t port;                 /* 0: an ephemeral port (kvt_resp_port) */
	kvt_kvs *kvs;                  /* the store; borrowed, must outlive the listener */
	const kvt_api_key *keys;       /* [n_keys]: AUTH passwords and their tenants (copied) */
	size_t n_keys;
	const kvt_api_key *admin_keys; /* [n_admin_keys]: also accepted; their tenant is the namespace (copied) */
	size_t n_admin_keys;
	uint32_t max_connections;      /* open connections at most (default 1024); beyond: refused */
	uint64_t max_value_bytes;      /* a larger declared bulk length is a protocol error (default 512 MiB) */
	const char *version;           /* INFO's kvtier_version; borrowed, static; NULL: "0" */
} kvt_resp_config;

void kvt_resp_config_default(kvt_resp_config *c);

/* The listener's counters (monotonic except conns_open). */
typedef struct kvt_resp_stats {
	uint64_t conns_open;       /* connections open now */
	uint64_t conns_total;      /* connections accepted (refused ones included) */
	uint64_t conns_refused;    /* closed at once: over max_connections */
	uint64_t commands;         /* commands run */
	uint64_t protocol_errors;  /* connections closed for a protocol error */
	uint64_t auth_failures;    /* AUTH with a wrong key, and commands refused with NOAUTH */
	uint64_t bytes_in;         /* bytes read from clients */
	uint64_t bytes_out;        /* bytes written to clients */
} kvt_resp_stats;

typedef struct kvt_resp kvt_resp;

/*
 * Bind host:port and start accepting. KVT_EINVAL (bad config: logged),
 * KVT_EIO (bind or listen failed: logged with errno), KVT_ENOMEM.
 */
int kvt_resp_start(const kvt_resp_config *cfg, kvt_resp **out);
/* The bound port. */
uint16_t kvt_resp_port(const kvt_resp *r);
void kvt_resp_stats_get(kvt_resp *r, kvt_resp_stats *st);
/*
 * Stop accepting, close every connection (a command being run finishes and
 * its reply is dropped), wait for their threads, free. NULL: no-op. Call it
 * before kvt_kvs_close.
 */
void kvt_resp_stop(kvt_resp *r);

#endif
