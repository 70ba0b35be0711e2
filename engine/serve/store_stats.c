/*
 * engine/serve/store_stats.c — the key-value store (tiers/kvstore.h) and its
 * Redis-protocol listener (resp.h) in the HTTP API: the kvtier_store_*
 * families of /metrics, the "store" object of /v1/stats (every tenant's row
 * for an admin key or without keys; a tenant key sees its own row only), and
 * the server's handle on both (kvt_server_set_store).
 *
 * Invariant: the handles are read atomically and set once, before the store
 * opens for clients; kvtierd stops the HTTP server before it closes the
 * store, so a reader never sees a closed one.
 */
#include "server_int.h"
#include "resp.h"
#include "serve_int.h"

#include <stdlib.h>
#include <string.h>

void kvt_server_set_store(kvt_server *srv, kvt_kvs *kvs, kvt_resp *resp)
{
	atomic_store(&srv->resp, resp);
	atomic_store(&srv->kvs, kvs);
}

/* One per-tenant family: name{tenant="..."} v for each row. */
typedef uint64_t (*row_field)(const kvt_kvs_tenant_stats *t);
#define FIELD(f) static uint64_t get_##f(const kvt_kvs_tenant_stats *t) { return t->f; }
FIELD(keys)
FIELD(bytes)
FIELD(ram_bytes)
FIELD(nvme_bytes)
FIELD(misses)
FIELD(sets)
FIELD(dels)
FIELD(evicted_ram)
FIELD(evicted)
FIELD(expired)
#undef FIELD

static void per_tenant(kvt_sbuf *b, const kvt_kvs_stats *st, const char *name, const char *type, const char *help,
		       row_field f)
{
	kvt_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
	for (uint32_t i = 0; i < st->n_tenants && i < KVT_KVS_MAX_TENANTS; i++)
		kvt_sbuf_printf(b, "%s{tenant=\"%s\"} %llu\n", name, st->tenant[i].ns, (unsigned long long)f(&st->tenant[i]));
}

static void one(kvt_sbuf *b, const char *name, const char *type, const char *help, uint64_t v)
{
	kvt_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name, (unsigned long long)v);
}

static void metrics_tenants(kvt_sbuf *b, const kvt_kvs_stats *st)
{
	per_tenant(b, st, "kvtier_store_keys", "gauge", "Keys held, by tenant.", get_keys);
	per_tenant(b, st, "kvtier_store_value_bytes", "gauge", "Bytes of the values held, by tenant.", get_bytes);
	per_tenant(b, st, "kvtier_store_ram_bytes", "gauge", "Of those, bytes held in RAM.", get_ram_bytes);
	per_tenant(b, st, "kvtier_store_nvme_bytes", "gauge", "Of those, bytes held on NVMe.", get_nvme_bytes);
	kvt_sbuf_printf(b, "# HELP kvtier_store_hits_total GETs that found their key, by the tier that served it.\n"
			   "# TYPE kvtier_store_hits_total counter\n");
	for (uint32_t i = 0; i < st->n_tenants && i < KVT_KVS_MAX_TENANTS; i++)
		kvt_sbuf_printf(b,
				"kvtier_store_hits_total{tenant=\"%s\",tier=\"ram\"} %llu\n"
				"kvtier_store_hits_total{tenant=\"%s\",tier=\"nvme\"} %llu\n",
				st->tenant[i].ns, (unsigned long long)st->tenant[i].hits_ram, st->tenant[i].ns,
				(unsigned long long)st->tenant[i].hits_nvme);
	per_tenant(b, st, "kvtier_store_misses_total", "counter", "GETs that found nothing.", get_misses);
	per_tenant(b, st, "kvtier_store_sets_total", "counter", "SETs stored.", get_sets);
	per_tenant(b, st, "kvtier_store_dels_total", "counter", "DELs that removed a key.", get_dels);
	per_tenant(b, st, "kvtier_store_evicted_ram_total", "counter", "Values that left RAM for space (an NVMe copy kept).",
		   get_evicted_ram);
	per_tenant(b, st, "kvtier_store_evicted_total", "counter", "Values dropped for space (gone).", get_evicted);
	per_tenant(b, st, "kvtier_store_expired_total", "counter", "Values dropped at their expiry.", get_expired);
}

static void metrics_listener(kvt_sbuf *b, kvt_resp *resp)
{
	kvt_resp_stats ls;
	kvt_resp_stats_get(resp, &ls);
	one(b, "kvtier_store_connections", "gauge", "Redis-protocol connections open.", ls.conns_open);
	one(b, "kvtier_store_connections_total", "counter", "Redis-protocol connections accepted.", ls.conns_total);
	one(b, "kvtier_store_connections_refused_total", "counter", "Connections closed at once: over [store] max_connections.",
	    ls.conns_refused);
	one(b, "kvtier_store_commands_total", "counter", "Redis-protocol commands run.", ls.commands);
	one(b, "kvtier_store_protocol_errors_total", "counter", "Connections closed for a protocol error.", ls.protocol_errors);
	one(b, "kvtier_store_auth_failures_total", "counter", "AUTH with a wrong key, and commands refused before AUTH.",
	    ls.auth_failures);
	kvt_sbuf_printf(b,
			"# HELP kvtier_store_net_bytes_total Bytes read from and written to store clients.\n"
			"# TYPE kvtier_store_net_bytes_total counter\n"
			"kvtier_store_net_bytes_total{direction=\"in\"} %llu\nkvtier_store_net_bytes_total{direction=\"out\"} %llu\n",
			(unsigned long long)ls.bytes_in, (unsigned long long)ls.bytes_out);
}

void kvt_srv_metrics_store(kvt_server *srv, kvt_sbuf *b)
{
	kvt_kvs *kvs = atomic_load(&srv->kvs);
	kvt_resp *resp = atomic_load(&srv->resp);
	if (!kvs)
		return;
	kvt_kvs_stats *st = malloc(sizeof(*st));
	if (!st) {
		b->failed = true;
		return;
	}
	kvt_kvs_stats_get(kvs, st);
	metrics_tenants(b, st);
	kvt_sbuf_printf(b, "# HELP kvtier_store_capacity_bytes The store's RAM and NVMe capacity.\n"
			   "# TYPE kvtier_store_capacity_bytes gauge\n"
			   "kvtier_store_capacity_bytes{tier=\"ram\"} %llu\nkvtier_store_capacity_bytes{tier=\"nvme\"} %llu\n",
			(unsigned long long)st->ram_capacity, (unsigned long long)st->nvme_capacity);
	one(b, "kvtier_store_nvme_used_bytes", "gauge", "Extent bytes of the store's NVMe file in use.", st->nvme_used);
	one(b, "kvtier_store_writes_pending", "gauge", "SETs and DELs not yet acknowledged by the writer.", st->writes_pending);
	one(b, "kvtier_store_write_errors_total", "counter", "Write batches whose write or commit failed.", st->write_errors);
	one(b, "kvtier_store_corrupt_total", "counter", "NVMe values that failed verification (dropped, never served).",
	    st->corrupt);
	one(b, "kvtier_store_recovered", "gauge", "Values found on NVMe when the store opened.", st->recovered);
	free(st);
	if (resp)
		metrics_listener(b, resp);
}

static json_t *tenant_json(const kvt_kvs_tenant_stats *t)
{
	return json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "tenant", t->ns, "keys",
			 (json_int_t)t->keys, "bytes", (json_int_t)t->bytes, "ram_bytes", (json_int_t)t->ram_bytes,
			 "nvme_bytes", (json_int_t)t->nvme_bytes, "hits_ram", (json_int_t)t->hits_ram, "hits_nvme",
			 (json_int_t)t->hits_nvme, "misses", (json_int_t)t->misses, "sets", (json_int_t)t->sets, "dels",
			 (json_int_t)t->dels, "evicted_ram", (json_int_t)t->evicted_ram, "evicted", (json_int_t)t->evicted,
			 "expired", (json_int_t)t->expired);
}

static json_t *listener_json(kvt_resp *resp)
{
	kvt_resp_stats ls;
	kvt_resp_stats_get(resp, &ls);
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "connections", (json_int_t)ls.conns_open,
			 "connections_total", (json_int_t)ls.conns_total, "connections_refused", (json_int_t)ls.conns_refused,
			 "commands", (json_int_t)ls.commands, "protocol_errors", (json_int_t)ls.protocol_errors,
			 "auth_failures", (json_int_t)ls.auth_failures, "bytes_in", (json_int_t)ls.bytes_in, "bytes_out",
			 (json_int_t)ls.bytes_out);
}

json_t *kvt_srv_stats_store(kvt_server *srv, const char *tenant)
{
	kvt_kvs *kvs = atomic_load(&srv->kvs);
	kvt_resp *resp = atomic_load(&srv->resp);
	if (!kvs)
		return json_null();
	kvt_kvs_stats *st = malloc(sizeof(*st));
	if (!st)
		return NULL;
	kvt_kvs_stats_get(kvs, st);
	json_t *rows = json_array();
	for (uint32_t i = 0; i < st->n_tenants && i < KVT_KVS_MAX_TENANTS; i++)
		if (!tenant || !strcmp(st->tenant[i].ns, tenant))
			json_array_append_new(rows, tenant_json(&st->tenant[i]));
	json_t *o;
	if (tenant) /* a tenant's view: its own row, nothing about the others or the store as a whole */
		o = json_pack("{s:o}", "tenants", rows);
	else
		o = json_pack("{s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o*}", "total", tenant_json(&st->total),
			      "tenants", rows, "ram_capacity", (json_int_t)st->ram_capacity, "nvme_capacity",
			      (json_int_t)st->nvme_capacity, "nvme_used", (json_int_t)st->nvme_used, "writes_pending",
			      (json_int_t)st->writes_pending, "write_errors", (json_int_t)st->write_errors, "corrupt",
			      (json_int_t)st->corrupt, "recovered", (json_int_t)st->recovered, "dropped_at_open",
			      (json_int_t)st->dropped_at_open, "listener", resp ? listener_json(resp) : NULL);
	free(st);
	return o;
}
