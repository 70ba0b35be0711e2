/*
 * engine/serve/resp_info.c — the Redis-protocol listener's INFO: the fields
 * Redis clients and tools read (redis_version, redis_mode, connected_clients,
 * used_memory, maxmemory, keyspace_hits/misses, evicted_keys, db0:keys=...),
 * filled from the store's figures and the listener's counters, plus kvtier's
 * own (kvtier_*). A connection sees its own namespace's key and hit counts,
 * never another tenant's; connection and byte counters are the listener's.
 */
#include "resp_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Whether INFO's arguments a[1..n) ask for section s (none, "all", "default", "everything": every one). */
static bool wants(const kvt_resp_arg *a, size_t n, const char *s)
{
	if (n < 2)
		return true;
	for (size_t i = 1; i < n; i++) {
		size_t k = strlen(s);
		if ((a[i].len == k && strncasecmp((const char *)a[i].p, s, k) == 0) ||
		    (a[i].len == 3 && strncasecmp((const char *)a[i].p, "all", 3) == 0) ||
		    (a[i].len == 7 && strncasecmp((const char *)a[i].p, "default", 7) == 0) ||
		    (a[i].len == 10 && strncasecmp((const char *)a[i].p, "everything", 10) == 0))
			return true;
	}
	return false;
}

static void human(char *out, size_t cap, uint64_t b)
{
	static const char u[] = "BKMGT";
	double v = (double)b;
	int i = 0;
	while (v >= 1024 && i < 4) {
		v /= 1024;
		i++;
	}
	snprintf(out, cap, i ? "%.2f%c" : "%.0f%c", v, u[i]);
}

static void info_server(kvt_resp_conn *c, kvt_resp_out *o)
{
	kvt_resp *r = c->r;
	uint64_t up = (uint64_t)(kvt_now_s() - r->t_start);
	kvt_resp_out_fmt(o,
			 "# Server\r\nredis_version:7.2.0\r\nredis_mode:standalone\r\nos:Linux\r\narch_bits:%zu\r\n"
			 "process_id:%ld\r\ntcp_port:%u\r\nuptime_in_seconds:%llu\r\nuptime_in_days:%llu\r\n"
			 "kvtier_version:%s\r\n\r\n",
			 sizeof(void *) * 8, (long)getpid(), r->port, (unsigned long long)up,
			 (unsigned long long)(up / 86400), r->version);
}

static void info_body(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n, const kvt_kvs_stats *st,
		      kvt_resp_out *o)
{
	kvt_resp_stats ls;
	kvt_kvs_tenant_stats row;
	char used[32], cap[32];
	kvt_resp_stats_get(c->r, &ls);
	kvt_resp_ns_row(c, st, &row);
	human(used, sizeof(used), st->total.ram_bytes);
	human(cap, sizeof(cap), st->ram_capacity);
	if (wants(a, n, "server"))
		info_server(c, o);
	if (wants(a, n, "clients"))
		kvt_resp_out_fmt(o, "# Clients\r\nconnected_clients:%llu\r\nmaxclients:%u\r\n\r\n",
				 (unsigned long long)ls.conns_open, c->r->cfg.max_connections);
	if (wants(a, n, "memory"))
		kvt_resp_out_fmt(o,
				 "# Memory\r\nused_memory:%llu\r\nused_memory_human:%s\r\nmaxmemory:%llu\r\n"
				 "maxmemory_human:%s\r\nmaxmemory_policy:allkeys-lru\r\n\r\n",
				 (unsigned long long)st->total.ram_bytes, used, (unsigned long long)st->ram_capacity, cap);
	if (wants(a, n, "persistence"))
		kvt_resp_out_fmt(o,
				 "# Persistence\r\nloading:0\r\naof_enabled:0\r\nkvtier_nvme_capacity:%llu\r\n"
				 "kvtier_nvme_used:%llu\r\nkvtier_writes_pending:%llu\r\nkvtier_write_errors:%llu\r\n\r\n",
				 (unsigned long long)st->nvme_capacity, (unsigned long long)st->nvme_used,
				 (unsigned long long)st->writes_pending, (unsigned long long)st->write_errors);
	if (wants(a, n, "stats"))
		kvt_resp_out_fmt(o,
				 "# Stats\r\ntotal_connections_received:%llu\r\ntotal_commands_processed:%llu\r\n"
				 "rejected_connections:%llu\r\ntotal_net_input_bytes:%llu\r\ntotal_net_output_bytes:%llu\r\n"
				 "keyspace_hits:%llu\r\nkeyspace_misses:%llu\r\nevicted_keys:%llu\r\nexpired_keys:%llu\r\n\r\n",
				 (unsigned long long)ls.conns_total, (unsigned long long)ls.commands,
				 (unsigned long long)ls.conns_refused, (unsigned long long)ls.bytes_in,
				 (unsigned long long)ls.bytes_out, (unsigned long long)(row.hits_ram + row.hits_nvme),
				 (unsigned long long)row.misses, (unsigned long long)row.evicted,
				 (unsigned long long)row.expired);
	if (wants(a, n, "replication"))
		kvt_resp_out_str(o, "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\r\n");
	if (wants(a, n, "keyspace")) {
		kvt_resp_out_str(o, "# Keyspace\r\n");
		if (row.keys)
			kvt_resp_out_fmt(o, "db0:keys=%llu,expires=0,avg_ttl=0\r\n", (unsigned long long)row.keys);
	}
}

void kvt_resp_info(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n)
{
	kvt_kvs_stats *st = malloc(sizeof(*st));
	kvt_resp_out body = { 0 };
	if (!st) {
		kvt_resp_out_str(&c->out, "-ERR out of memory\r\n");
		return;
	}
	kvt_kvs_stats_get(c->r->cfg.kvs, st);
	info_body(c, a, n, st, &body);
	free(st);
	if (body.oom)
		kvt_resp_out_str(&c->out, "-ERR out of memory\r\n");
	else
		kvt_resp_out_bulk(&c->out, body.buf ? body.buf : "", body.len);
	free(body.buf);
	free(body.pieces);
}
