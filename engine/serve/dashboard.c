/*
 * engine/serve/dashboard.c — the live view (see dashboard.h). The page is
 * engine/serve/dashboard.html, compiled in by cmake/embed.cmake; the JSON
 * here is what it reads from /v1/stats beyond the tier counters: retention
 * per tier and per tenant, and the sessions table.
 */
#include "dashboard.h"

#include "kvt_dashboard_html.h"

#include <stdlib.h>
#include <string.h>

static const char *const tier_key[KVT_TIER_COUNT] = { "hbm", "host", "nvme" };

const char *kvt_dashboard_html(size_t *n_bytes)
{
	*n_bytes = sizeof(kvt_dashboard_page) - 1;
	return kvt_dashboard_page;
}

static json_t *by_tier(const uint64_t v[KVT_TIER_COUNT])
{
	return json_pack("{s:I, s:I, s:I}", tier_key[0], (json_int_t)v[0], tier_key[1], (json_int_t)v[1], tier_key[2],
			 (json_int_t)v[2]);
}

json_t *kvt_dashboard_retention(kvt_sched *s, const kvt_sched_stats *st, const char *tenant)
{
	const kvt_tm_retain_stats *rs = &st->tiers.retain;
	json_t *out = json_object(), *tiers = json_array(), *tenants = json_array();
	if (!out || !tiers || !tenants)
		goto oom;
	if (!tenant) {
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			json_array_append_new(tiers, json_pack("{s:s, s:I, s:I, s:I}", "name", tier_key[t], "blocks",
							       (json_int_t)rs->n_in_tier[t], "bytes",
							       (json_int_t)rs->bytes_in_tier[t], "floor_blocks",
							       (json_int_t)rs->n_by_floor[t]));
		json_object_set_new(out, "blocks", json_integer((json_int_t)rs->n_blocks));
		json_object_set_new(out, "bytes", json_integer((json_int_t)rs->bytes));
	}
	json_object_set_new(out, "tiers", tiers);
	tiers = NULL;
	kvt_tm_tenant_stats *ts = NULL;
	uint32_t n = 0;
	if (kvt_sched_tenants(s, &ts, &n) != KVT_OK)
		goto oom;
	for (uint32_t i = 0; i < n; i++) {
		const kvt_tm_tenant_stats *t = &ts[i];
		if (tenant && strcmp(tenant, t->tenant))
			continue;
		uint64_t blocks = 0, bytes = 0;
		for (int f = 0; f < KVT_TIER_COUNT; f++) {
			blocks += t->n_blocks[f];
			bytes += t->bytes[f];
		}
		json_array_append_new(
			tenants,
			json_pack("{s:s, s:I, s:I, s:o, s:o, s:I, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "tenant", t->tenant,
				  "blocks", (json_int_t)blocks, "bytes", (json_int_t)bytes, "blocks_by_floor",
				  by_tier(t->n_blocks), "bytes_by_floor", by_tier(t->bytes), "quota_bytes",
				  (json_int_t)t->quota.bytes, "quota_bytes_by_floor", by_tier(t->quota.tier_bytes),
				  "granted_blocks", (json_int_t)t->n_granted_blocks, "denied_blocks",
				  (json_int_t)t->n_denied_blocks, "quota_released", (json_int_t)t->n_quota_released,
				  "expired", (json_int_t)t->n_expired, "released", (json_int_t)t->n_released, "lost",
				  (json_int_t)t->n_lost, "hits", (json_int_t)t->n_hits));
	}
	free(ts);
	json_object_set_new(out, "tenants", tenants);
	return out;
oom:
	json_decref(out);
	json_decref(tiers);
	json_decref(tenants);
	return NULL;
}

json_t *kvt_dashboard_sessions(kvt_sched *s, size_t max)
{
	kvt_session_info *si = NULL;
	size_t n = 0;
	json_t *out = json_array();
	if (!out || kvt_sched_sessions(s, NULL, &si, &n) != KVT_OK)
		return out; /* no index, or it failed: an empty table (the failure is logged) */
	for (size_t i = 0; i < n && i < max; i++) {
		uint64_t in[KVT_TIER_COUNT];
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			in[t] = si[i].blocks_in[t];
		json_array_append_new(out, json_pack("{s:s, s:s, s:I, s:I, s:o, s:I, s:I, s:I}", "id", si[i].id, "tenant",
						     si[i].tenant, "tokens", (json_int_t)si[i].n_tokens, "blocks",
						     (json_int_t)si[i].n_blocks, "blocks_in", by_tier(in),
						     "blocks_missing", (json_int_t)si[i].blocks_missing, "durable_tokens",
						     (json_int_t)si[i].durable_tokens, "updated_us",
						     (json_int_t)si[i].updated_us));
	}
	free(si);
	return out;
}
