/*
 * engine/serve/admin.c — kvtierd's endpoints other than generation
 * (docs/http-api.md): /health, /v1/models, /metrics (Prometheus text),
 * /v1/stats (the global report, or a tenant key's own), /v1/sessions (list,
 * delete), POST /v1/sessions/{id}/resume (a report, or NDJSON progress) and
 * /dashboard.
 *
 * Design. Every handler runs on an MHD worker and answers at once, except
 * a resume: it reads NVMe for as long as it takes, so it runs on a thread of
 * its own and its connection parks (server.c's kvt_srv_park) until there is
 * news. server.c has already routed the request, checked its method, its API
 * key and that the engine is loaded; a handler checks its own arguments
 * (the tenant of ?tenant= / ?user=, a resume's body).
 *
 * Invariants:
 *  - a tenant key acts on its own tenant's sessions only (?tenant= is an
 *    admin key's: 403 otherwise);
 *  - a resume job is freed by the last of its two holders (its thread, the
 *    HTTP side), so a client that hangs up never waits for the resume;
 *    kvt_server_stop waits for every resume thread;
 *  - every resume holds one in-flight count, given back when it is freed.
 */
#define _GNU_SOURCE
#include "server_int.h"

#include "dashboard.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *tier_name[KVT_TM_N_TIERS] = { "hbm", "host", "nvme", "remote" };

/* ------------------------------------------------------------------------ */
/* health, models, metrics, stats                                             */

/*
 * 200 "ok", or 200 "degraded" with what is degraded (the index rolling back
 * for lack of space, a tier full or read-only): the daemon serves, but what it
 * acknowledges may not be durable yet. 503 while loading or draining.
 */
enum MHD_Result kvt_srv_handle_health(conn_req *r)
{
	kvt_server *srv = r->srv;
	kvt_sched *sched = atomic_load(&srv->sched);
	const char *st = !sched ? "loading" : atomic_load(&srv->draining) ? "draining" : "ok";
	if (strcmp(st, "ok"))
		return kvt_srv_reply_json(r, 503, json_pack("{s:s}", "status", st), true);
	kvt_sched_stats ss;
	kvt_sched_get_stats(sched, &ss);
	json_t *what = json_array();
	if (ss.index.degraded)
		json_array_append_new(what, json_string("index"));
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		if (ss.have_tiers && ss.tiers.tier[t].degraded)
			json_array_append_new(what, json_string(tier_name[t]));
	if (ss.have_tiers && ss.tiers.has_remote && ss.tiers.remote.degraded)
		json_array_append_new(what, json_string("remote")); /* served on without it: misses */
	if (!json_array_size(what)) {
		json_decref(what);
		return kvt_srv_reply_json(r, 200, json_pack("{s:s}", "status", "ok"), false);
	}
	return kvt_srv_reply_json(r, 200, json_pack("{s:s, s:o}", "status", "degraded", "degraded", what), false);
}

/*
 * The model object: OpenAI's fields, and vLLM's max_model_len (the context a
 * prompt and its reply share), which clients read to size their prompts.
 * Served only once the engine is set (the router answers 503 before).
 */
static json_t *model_json(kvt_server *srv)
{
	kvt_sched *sched = atomic_load(&srv->sched);
	return json_pack("{s:s, s:s, s:I, s:s, s:I}", "id", srv->model_id, "object", "model", "created",
			 (json_int_t)srv->created, "owned_by", "kvtier", "max_model_len",
			 (json_int_t)(sched ? kvt_sched_max_ctx(sched) : 0));
}

enum MHD_Result kvt_srv_handle_models(conn_req *r)
{
	return kvt_srv_reply_json(r, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_json(r->srv)), false);
}

/* GET /v1/models/{id}: the served model, or 404 model_not_found (id empty when it was too long). */
enum MHD_Result kvt_srv_handle_model(conn_req *r, const char *id)
{
	if (!id[0] || strcmp(id, r->srv->model_id))
		return kvt_srv_reply_error(r, 404, "model", "model_not_found", "no model '%s' (this server serves '%s')",
				   id[0] ? id : "(too long)", r->srv->model_id);
	return kvt_srv_reply_json(r, 200, model_json(r->srv), false);
}

static void metric_head(kvt_sbuf *b, const char *name, const char *type, const char *help)
{
	kvt_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* v[KVT_TM_N_TIERS]: the remote tier's value (last) is printed only when one is configured. */
static int metric_n_tiers = KVT_TIER_COUNT;
static void metric_tiers(kvt_sbuf *b, const char *name, const char *type, const char *help, const uint64_t *v)
{
	metric_head(b, name, type, help);
	for (int t = 0; t < metric_n_tiers; t++)
		kvt_sbuf_printf(b, "%s{tier=\"%s\"} %llu\n", name, tier_name[t], (unsigned long long)v[t]);
}

static void metric_one(kvt_sbuf *b, const char *name, const char *type, const char *help, uint64_t v)
{
	metric_head(b, name, type, help);
	kvt_sbuf_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

static const char *const kind_name[KVT_BLOCK_KIND_COUNT] = { "prefix", "chunk" };

/* The chunk share (manager.h, "Chunk share"): chunk blocks per local tier, evictions by kind, the share. */
static void metric_kinds(kvt_sbuf *b, const kvt_tm_stats *ts)
{
	metric_head(b, "kvtier_tier_chunk_blocks", "gauge",
		    "Chunk blocks (document spans, chunk reuse) present in the tier; the rest of its blocks are prefix blocks.");
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvt_sbuf_printf(b, "kvtier_tier_chunk_blocks{tier=\"%s\"} %llu\n", tier_name[t],
			    (unsigned long long)ts->tier[t].n_blocks_by_kind[KVT_BLOCK_CHUNK]);
	metric_head(b, "kvtier_tier_prefix_blocks", "gauge", "Prefix blocks (conversations' chains) present in the tier.");
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvt_sbuf_printf(b, "kvtier_tier_prefix_blocks{tier=\"%s\"} %llu\n", tier_name[t],
			    (unsigned long long)ts->tier[t].n_blocks_by_kind[KVT_BLOCK_PREFIX]);
	metric_head(b, "kvtier_evictions_total", "counter", "Blocks that left the tier to make room, by block kind.");
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		for (int k = 0; k < KVT_BLOCK_KIND_COUNT; k++)
			kvt_sbuf_printf(b, "kvtier_evictions_total{tier=\"%s\",kind=\"%s\"} %llu\n", tier_name[t],
				    kind_name[k], (unsigned long long)ts->tier[t].n_evictions_by_kind[k]);
	metric_head(b, "kvtier_chunk_share", "gauge", "The most of each tier's blocks chunk blocks keep when it makes room.");
	kvt_sbuf_printf(b, "kvtier_chunk_share %g\n", (double)ts->chunk_share);
}

/* Why prompts missed the cache (usage.kvtier.miss), counted once per prompt by reason. */
static void metric_misses(kvt_sbuf *b, const kvt_tm_stats *ts)
{
	metric_head(b, "kvtier_cache_misses_total", "counter",
		    "Prompts whose cached prefix ended before their last token, by the reason usage.kvtier.miss gave.");
	for (int k = KVT_TM_MISS_NONE + 1; k < KVT_TM_MISS_COUNT; k++)
		kvt_sbuf_printf(b, "kvtier_cache_misses_total{reason=\"%s\"} %llu\n", kvt_tm_miss_reason_name(k),
			    (unsigned long long)ts->n_miss[k]);
	metric_one(b, "kvtier_cache_miss_tombstones", "gauge",
		   "Blocks remembered as gone from every tier (to explain later misses; bounded, not kept across restarts).",
		   ts->n_tombstones);
}

/* The misses by reason, as /v1/stats's engine.misses_by_reason. */
static json_t *stats_misses(const kvt_tm_stats *ts)
{
	json_t *o = json_object();
	for (int k = KVT_TM_MISS_NONE + 1; o && k < KVT_TM_MISS_COUNT; k++)
		json_object_set_new(o, kvt_tm_miss_reason_name(k), json_integer((json_int_t)ts->n_miss[k]));
	return o;
}

/* The scheduler's chunk reuse counters (full-block tokens of marked spans). */
static void metric_chunks(kvt_sbuf *b, const kvt_sched_stats *st)
{
	metric_one(b, "kvtier_chunk_lookup_tokens_total", "counter",
		   "Tokens of marked document spans looked up as chunks (outside the exact cached prefix).",
		   st->chunk_lookup_tokens);
	metric_one(b, "kvtier_chunk_hits_tokens_total", "counter", "Of those, tokens found cached (a chunk hit).",
		   st->chunk_hit_tokens);
	metric_tiers(b, "kvtier_chunk_hits_by_tier_tokens_total", "counter",
		     "Chunk tokens found, by the tier each block was found in.", st->chunk_hits_by_tier);
	metric_tiers(b, "kvtier_chunk_bytes_read_total", "counter", "Bytes read for chunk lookups, by source tier.",
		     st->chunk_bytes_from);
	metric_one(b, "kvtier_chunk_stored_tokens_total", "counter", "Chunk tokens not found, computed and stored.",
		   st->chunk_stored_tokens);
	metric_one(b, "kvtier_chunk_reused_tokens_total", "counter", "Found chunk tokens blended in as found.",
		   st->chunk_reused_tokens);
	metric_one(b, "kvtier_chunk_recomputed_tokens_total", "counter",
		   "Found chunk tokens recomputed (the recompute fraction).", st->chunk_recomputed_tokens);
	metric_one(b, "kvtier_chunk_blends_total", "counter", "Prefills that blended found chunks in.", st->chunk_blends);
}

/* The scheduler's queue, preemptions and TTFT by priority. */
static void metric_sched(kvt_sbuf *b, const kvt_sched_stats *st)
{
	metric_one(b, "kvtier_scheduler_steps_total", "counter", "Scheduler steps (batches) run.", st->steps);
	metric_one(b, "kvtier_scheduler_device_steps_total", "counter",
		   "Scheduler steps run as one device decode call (graph launch, tokens picked on the device).",
		   st->device_steps);
	metric_head(b, "kvtier_queue_wait_seconds", "summary",
		    "Time from submit (or preemption) to admission; quantiles over the last 1024.");
	kvt_sbuf_printf(b, "kvtier_queue_wait_seconds{quantile=\"0.5\"} %.9g\nkvtier_queue_wait_seconds{quantile=\"0.99\"} %.9g\n",
		    st->queue_wait_p50_s, st->queue_wait_p99_s);
	kvt_sbuf_printf(b, "kvtier_queue_wait_seconds_sum %.9g\nkvtier_queue_wait_seconds_count %llu\n", st->queue_wait_sum_s,
		    (unsigned long long)st->queue_waits);
	metric_head(b, "kvtier_preemptions_total", "counter", "Sequences preempted because T0 was full, by how they resume.");
	kvt_sbuf_printf(b, "kvtier_preemptions_total{mode=\"swap\"} %llu\nkvtier_preemptions_total{mode=\"recompute\"} %llu\n",
		    (unsigned long long)st->preempt_swap, (unsigned long long)st->preempt_recompute);
	metric_one(b, "kvtier_preempted_tokens_total", "counter", "Tokens of KV the preempted sequences let go.",
		   st->preempt_tokens);
	metric_one(b, "kvtier_preempt_recomputed_tokens_total", "counter", "Tokens prefilled again on resuming.",
		   st->resume_recomputed_tokens);
	metric_head(b, "kvtier_ttft_by_priority_seconds", "summary", "Time to first token by request priority.");
	for (int i = 0; i < KVT_PRIORITY_LEVELS; i++)
		if (st->ttft_by_priority_n[i])
			kvt_sbuf_printf(b,
				    "kvtier_ttft_by_priority_seconds_sum{priority=\"%d\"} %.9g\n"
				    "kvtier_ttft_by_priority_seconds_count{priority=\"%d\"} %llu\n",
				    i + KVT_PRIORITY_MIN, st->ttft_by_priority_sum_s[i], i + KVT_PRIORITY_MIN,
				    (unsigned long long)st->ttft_by_priority_n[i]);
}

enum MHD_Result kvt_srv_handle_metrics(conn_req *r, kvt_sched *sched)
{
	kvt_sched_stats st;
	kvt_sched_get_stats(sched, &st);
	kvt_sbuf b = { 0 };
	uint64_t v[KVT_TM_N_TIERS];
	/* NOTE: a per-call value would be cleaner; every /metrics of one daemon has the same tiers */
	metric_n_tiers = st.tiers.has_remote ? KVT_TM_N_TIERS : KVT_TIER_COUNT;
#define TIERS(field)                                          \
	do {                                                  \
		for (int t_ = 0; t_ < KVT_TIER_COUNT; t_++) \
			v[t_] = (uint64_t)(st.tiers.tier[t_].field); \
		v[KVT_TM_TIER_REMOTE] = (uint64_t)(st.tiers.remote.field); \
	} while (0)
	TIERS(capacity_bytes);
	metric_tiers(&b, "kvtier_tier_capacity_bytes", "gauge", "Capacity of the tier in bytes.", v);
	TIERS(used_bytes);
	metric_tiers(&b, "kvtier_tier_used_bytes", "gauge", "Bytes in use in the tier.", v);
	TIERS(used_blocks);
	metric_tiers(&b, "kvtier_tier_blocks", "gauge", "Blocks held by the tier.", v);
	TIERS(hits);
	metric_tiers(&b, "kvtier_tier_hits_total", "counter", "Blocks asked for that were found first in the tier.", v);
	TIERS(misses);
	metric_tiers(&b, "kvtier_tier_misses_total", "counter", "Blocks asked for that the tier did not hold.", v);
	TIERS(n_promotions);
	metric_tiers(&b, "kvtier_tier_promotions_total", "counter", "Blocks copied into the tier from the one below.", v);
	TIERS(promotion_bytes);
	metric_tiers(&b, "kvtier_tier_promotion_bytes_total", "counter", "Bytes read from the lower tier for promotions.", v);
	TIERS(n_demotions);
	metric_tiers(&b, "kvtier_tier_demotions_total", "counter", "Blocks copied out of the tier to the one below.", v);
	TIERS(demotion_bytes);
	metric_tiers(&b, "kvtier_tier_demotion_bytes_total", "counter", "Bytes written to the lower tier for demotions.", v);
	TIERS(n_evictions);
	metric_tiers(&b, "kvtier_tier_evictions_total", "counter", "Blocks that left the tier to make room.", v);
	TIERS(n_corrupt);
	metric_tiers(&b, "kvtier_tier_corrupt_blocks_total", "counter", "Records that failed verification.", v);
	TIERS(degraded);
	metric_tiers(&b, "kvtier_tier_degraded", "gauge", "1 when the tier is full or read-only.", v);
#undef TIERS
	metric_kinds(&b, &st.tiers);
	metric_misses(&b, &st.tiers);
	metric_chunks(&b, &st);
	metric_one(&b, "kvtier_index_degraded", "gauge",
		   "1 while index transactions roll back for lack of space (their writes are kept and retried).",
		   st.index.degraded);
	metric_one(&b, "kvtier_index_rolled_back_total", "counter", "Index transactions rolled back for lack of space.",
		   st.index.n_full);
	metric_one(&b, "kvtier_index_kept_session_writes", "gauge", "Session writes kept for the next index transaction.",
		   st.index.n_carried);
	metric_one(&b, "kvtier_index_bad_session_rows_total", "counter", "Session rows that do not decode, skipped.",
		   st.index.n_bad_sessions);
	metric_one(&b, "kvtier_requests_total", "counter", "Requests finished.", st.requests);
	metric_one(&b, "kvtier_requests_running", "gauge", "Sequences running now.", st.running);
	metric_one(&b, "kvtier_requests_queued", "gauge", "Requests waiting.", st.queued);
	metric_one(&b, "kvtier_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", st.prompt_tokens);
	metric_one(&b, "kvtier_completion_tokens_total", "counter", "Tokens generated.", st.completion_tokens);
	metric_one(&b, "kvtier_prefix_cache_queries_tokens_total", "counter", "Tokens looked up in the prefix cache.",
		   st.prefix_queries_tokens);
	metric_one(&b, "kvtier_prefix_cache_hits_tokens_total", "counter", "Tokens found in the prefix cache.",
		   st.prefix_hits_tokens);
	metric_tiers(&b, "kvtier_cached_tokens_total", "counter", "Prompt tokens served from the cache, by tier.",
		     st.cached_by_tier);
	metric_one(&b, "kvtier_lossy_cached_tokens_total", "counter",
		   "Cached prompt tokens whose K/V came back through an 8-bit record (not bit-exact; "
		   "usage.kvtier.lossy_cached_tokens summed).",
		   st.lossy_cached_tokens);
	if (st.tiers.has_remote) {
		const kvt_t3_stats *r3 = &st.tiers.t3;
		metric_one(&b, "kvtier_remote_read_bytes_total", "counter", "Record bytes read from T3.", r3->bytes_in);
		metric_one(&b, "kvtier_remote_written_bytes_total", "counter", "Record bytes written to T3.", r3->bytes_out);
		metric_one(&b, "kvtier_remote_errors_total", "counter",
			   "T3 commands that failed (node down, timeout, OOM, error reply): misses.", r3->n_errors);
		metric_one(&b, "kvtier_remote_write_queue", "gauge", "Blocks and sessions waiting to be written to T3.",
			   st.tiers.n_remote_queued);
		metric_one(&b, "kvtier_remote_write_skipped_total", "counter", "Blocks never written to T3 (queue full).",
			   st.tiers.n_remote_skipped);
		metric_head(&b, "kvtier_remote_round_seconds", "histogram", "Latency of one pipelined T3 round.");
		uint64_t c3 = 0;
		for (unsigned i = 0; i < KVT_T3_LAT_BUCKETS; i++) {
			c3 += r3->lat[i];
			if (i == KVT_T3_LAT_BUCKETS - 1)
				kvt_sbuf_printf(&b, "kvtier_remote_round_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)c3);
			else
				kvt_sbuf_printf(&b, "kvtier_remote_round_seconds_bucket{le=\"%g\"} %llu\n", kvt_t3_lat_bounds[i],
					    (unsigned long long)c3);
		}
		kvt_sbuf_printf(&b, "kvtier_remote_round_seconds_sum %.9g\nkvtier_remote_round_seconds_count %llu\n",
			    r3->lat_sum_s, (unsigned long long)c3);
	}
	metric_head(&b, "kvtier_ttft_seconds", "histogram", "Time to first token.");
	uint64_t cum = 0;
	for (int i = 0; i < KVT_TTFT_BUCKETS; i++) {
		cum += st.ttft_bucket[i];
		if (i == KVT_TTFT_BUCKETS - 1)
			kvt_sbuf_printf(&b, "kvtier_ttft_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
		else
			kvt_sbuf_printf(&b, "kvtier_ttft_seconds_bucket{le=\"%g\"} %llu\n", kvt_ttft_bucket_le[i],
				    (unsigned long long)cum);
	}
	kvt_sbuf_printf(&b, "kvtier_ttft_seconds_sum %.9g\nkvtier_ttft_seconds_count %llu\n", st.ttft_sum_s,
		    (unsigned long long)cum);
	metric_sched(&b, &st);
	metric_head(&b, "kvtier_http_connections_closed_total", "counter",
		    "Connections the server closed before a request: header deadline passed; address at "
		    "max_connections_per_ip (address_limit: the longest-waiting idle one made room; address_busy: the new one, "
		    "all had a request in flight).");
	kvt_sbuf_printf(&b,
		    "kvtier_http_connections_closed_total{reason=\"header_deadline\"} %llu\n"
		    "kvtier_http_connections_closed_total{reason=\"address_limit\"} %llu\n"
		    "kvtier_http_connections_closed_total{reason=\"address_busy\"} %llu\n",
		    (unsigned long long)atomic_load(&r->srv->n_header_cuts),
		    (unsigned long long)atomic_load(&r->srv->n_addr_evictions),
		    (unsigned long long)atomic_load(&r->srv->n_addr_refusals));
	kvt_srv_metrics_store(r->srv, &b);
	if (b.failed) {
		free(b.p);
		return kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
	}
	return kvt_srv_reply_buf(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.n, false);
}

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0.0;
}

/* The scheduler's queue, preemption and per-priority numbers (/v1/stats "scheduler"). */
static json_t *stats_sched(const kvt_sched_stats *st)
{
	json_t *by_prio = json_array();
	for (int i = 0; i < KVT_PRIORITY_LEVELS; i++)
		if (st->ttft_by_priority_n[i])
			json_array_append_new(by_prio,
					      json_pack("{s:i, s:I, s:f}", "priority", i + KVT_PRIORITY_MIN, "requests",
							(json_int_t)st->ttft_by_priority_n[i], "ttft_mean_ms",
							st->ttft_by_priority_sum_s[i] * 1e3 / (double)st->ttft_by_priority_n[i]));
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:{s:I, s:I, s:I, s:I, s:I}, s:o}", "steps",
			 (json_int_t)st->steps, "device_steps", (json_int_t)st->device_steps, "queue_depth", (json_int_t)st->queued, "running_peak",
			 (json_int_t)st->running_peak, "admissions", (json_int_t)st->queue_waits, "admissions_backfilled",
			 (json_int_t)st->admit_backfills, "queue_wait_mean_ms",
			 ratio(st->queue_wait_sum_s * 1e3, (double)st->queue_waits), "queue_wait_p50_ms",
			 st->queue_wait_p50_s * 1e3, "queue_wait_p99_ms", st->queue_wait_p99_s * 1e3, "preemptions", "swap",
			 (json_int_t)st->preempt_swap, "recompute", (json_int_t)st->preempt_recompute, "tokens_held",
			 (json_int_t)st->preempt_tokens, "tokens_swapped_in", (json_int_t)st->resume_swapped_in_tokens,
			 "tokens_recomputed", (json_int_t)st->resume_recomputed_tokens, "ttft_by_priority", by_prio);
}

/* Per-tier figures {hbm, host, nvme, remote} of a KVT_TM_N_TIERS array. */
static json_t *by_tier(const uint64_t *v)
{
	return json_pack("{s:I, s:I, s:I, s:I}", "hbm", (json_int_t)v[KVT_TIER_HBM], "host", (json_int_t)v[KVT_TIER_HOST],
			 "nvme", (json_int_t)v[KVT_TIER_NVME], "remote", (json_int_t)v[KVT_TM_TIER_REMOTE]);
}

/* Chunk reuse (/v1/stats "chunks"): the scheduler's counters, in full-block tokens of marked spans, and the share. */
static json_t *stats_chunks(const kvt_sched_stats *st)
{
	return json_pack("{s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o}", "share",
			 st->have_tiers ? (double)st->tiers.chunk_share : 0.0, "lookup_tokens",
			 (json_int_t)st->chunk_lookup_tokens, "hit_tokens", (json_int_t)st->chunk_hit_tokens,
			 "miss_tokens", (json_int_t)(st->chunk_lookup_tokens - st->chunk_hit_tokens), "stored_tokens",
			 (json_int_t)st->chunk_stored_tokens, "reused_tokens", (json_int_t)st->chunk_reused_tokens,
			 "recomputed_tokens", (json_int_t)st->chunk_recomputed_tokens, "blends",
			 (json_int_t)st->chunk_blends, "hit_tokens_by_tier", by_tier(st->chunk_hits_by_tier),
			 "bytes_read_by_tier", by_tier(st->chunk_bytes_from));
}

/*
 * The bytes of the "Key:   N kB" lines of a /proc file named in keys, into
 * bytes (0 where the file or a key is missing: an older kernel).
 */
static void proc_kb_lines(const char *path, const char *const *keys, int n, uint64_t *bytes)
{
	char line[256];
	FILE *f = fopen(path, "r");
	for (int i = 0; i < n; i++)
		bytes[i] = 0;
	while (f && fgets(line, sizeof(line), f))
		for (int i = 0; i < n; i++)
			if (!strncmp(line, keys[i], strlen(keys[i])))
				bytes[i] = strtoull(line + strlen(keys[i]), NULL, 10) * 1024;
	if (f)
		fclose(f);
}

/*
 * The process's memory (/proc/self/status: VmRSS and its anonymous and file
 * parts, VmLck) against what it is for: the weights and the KV held in T0 and
 * T1. other_bytes is the rest (buffers, code, allocator slack), negative where
 * weight pages were never read in. rss_file_huge_bytes: the file pages mapped
 * as 2 MiB pages (smaps_rollup's FilePmdMapped). A model file left in the page
 * cache by a write stays in 4 KiB pages, and the CPU backend decoded from it
 * ~6% slower (bench/README.md, tenth stop).
 */
static json_t *stats_memory(const kvt_sched_stats *st)
{
	static const char *const keys[] = { "VmRSS:", "RssAnon:", "RssFile:", "VmLck:" }, *const pmd = "FilePmdMapped:";
	uint64_t b[4], file_huge;
	proc_kb_lines("/proc/self/status", keys, 4, b);
	proc_kb_lines("/proc/self/smaps_rollup", &pmd, 1, &file_huge);
	const uint64_t kv = st->tiers.tier[KVT_TIER_HBM].used_bytes + st->tiers.tier[KVT_TIER_HOST].used_bytes;
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "rss_bytes", (json_int_t)b[0],
			 "rss_anon_bytes", (json_int_t)b[1], "rss_file_bytes", (json_int_t)b[2], "rss_file_huge_bytes",
			 (json_int_t)file_huge, "locked_bytes", (json_int_t)b[3], "weight_bytes",
			 (json_int_t)st->weight_bytes, "weight_mapped_bytes", (json_int_t)st->weight_mapped_bytes,
			 "kv_held_bytes", (json_int_t)kv, "other_bytes",
			 (json_int_t)b[0] - (json_int_t)st->weight_bytes - (json_int_t)kv);
}

enum MHD_Result kvt_srv_handle_stats(conn_req *r, kvt_sched *sched)
{
	kvt_server *srv = r->srv;
	kvt_sched_stats st;
	kvt_sched_get_stats(sched, &st);
	json_t *tiers = json_array();
	const char *rec_dtype = srv->kv_dtype;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		const kvt_tm_tier_stats *ts = &st.tiers.tier[t];
		json_t *tier = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:f, s:I, s:I, s:f, s:I, s:I, s:f, s:s,"
					 " s:I, s:b}",
					 "name", tier_name[t], "capacity_bytes", (json_int_t)ts->capacity_bytes, "used_bytes",
					 (json_int_t)ts->used_bytes, "capacity_blocks", (json_int_t)ts->capacity_blocks,
					 "blocks", (json_int_t)ts->used_blocks, "hits", (json_int_t)ts->hits, "misses",
					 (json_int_t)ts->misses, "hit_rate", ratio((double)ts->hits, (double)(ts->hits + ts->misses)),
					 "promotions", (json_int_t)ts->n_promotions, "promotion_bytes",
					 (json_int_t)ts->promotion_bytes, "promotion_mb_s",
					 ratio((double)ts->promotion_bytes / 1e6, ts->promotion_s), "demotions",
					 (json_int_t)ts->n_demotions, "demotion_bytes", (json_int_t)ts->demotion_bytes,
					 "demotion_mb_s", ratio((double)ts->demotion_bytes / 1e6, ts->demotion_s), "evictions",
					 (json_int_t)ts->n_evictions, "dropped", (json_int_t)ts->n_dropped, "compression_ratio",
					 st.have_tiers ? ts->compression_ratio : 1.0, "dtype",
					 t == KVT_TIER_HBM ? "f16" : rec_dtype, "corrupt", (json_int_t)ts->n_corrupt, "degraded",
					 (int)ts->degraded);
		/* the chunk share (manager.h): the table's blocks in the tier by kind, evictions by kind */
		json_object_set_new(tier, "chunk_blocks", json_integer((json_int_t)ts->n_blocks_by_kind[KVT_BLOCK_CHUNK]));
		json_object_set_new(tier, "prefix_blocks", json_integer((json_int_t)ts->n_blocks_by_kind[KVT_BLOCK_PREFIX]));
		json_object_set_new(tier, "evictions_by_kind",
				    json_pack("{s:I, s:I}", "prefix", (json_int_t)ts->n_evictions_by_kind[KVT_BLOCK_PREFIX],
					      "chunk", (json_int_t)ts->n_evictions_by_kind[KVT_BLOCK_CHUNK]));
		json_array_append_new(tiers, tier);
	}
	json_t *remote = json_null();
	if (st.tiers.has_remote) {
		const kvt_tm_tier_stats *ts = &st.tiers.remote;
		const kvt_t3_stats *r3 = &st.tiers.t3;
		json_t *lat = json_array();
		for (unsigned i = 0; i < KVT_T3_LAT_BUCKETS; i++)
			json_array_append_new(lat, json_integer((json_int_t)r3->lat[i]));
		json_array_append_new(
			tiers, json_pack("{s:s, s:I, s:I, s:f, s:I, s:I, s:f, s:I, s:I, s:s, s:I, s:b}", "name", "remote",
					 "hits", (json_int_t)ts->hits, "misses", (json_int_t)ts->misses, "hit_rate",
					 ratio((double)ts->hits, (double)(ts->hits + ts->misses)), "promotions",
					 (json_int_t)ts->n_promotions, "promotion_bytes", (json_int_t)ts->promotion_bytes,
					 "promotion_mb_s", ratio((double)ts->promotion_bytes / 1e6, ts->promotion_s),
					 "demotions", (json_int_t)ts->n_demotions, "demotion_bytes", (json_int_t)r3->bytes_out,
					 "dtype", rec_dtype, "corrupt", (json_int_t)ts->n_corrupt, "degraded",
					 (int)ts->degraded));
		remote = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:o, s:b}", "bytes_in",
				   (json_int_t)r3->bytes_in, "bytes_out", (json_int_t)r3->bytes_out, "writes",
				   (json_int_t)r3->n_writes, "errors", (json_int_t)r3->n_errors, "corrupt",
				   (json_int_t)r3->n_corrupt, "sessions_written", (json_int_t)r3->n_sessions_put,
				   "sessions_read", (json_int_t)r3->n_sessions_got, "write_queue",
				   (json_int_t)st.tiers.n_remote_queued, "write_skipped", (json_int_t)st.tiers.n_remote_skipped,
				   "write_refused", (json_int_t)st.tiers.n_remote_failed, "round_seconds_sum", r3->lat_sum_s,
				   "round_seconds_buckets", lat, "degraded", (int)r3->degraded);
	}
	json_t *engine = json_pack(
		"{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:f, s:f, s:f, s:f, s:{s:I, s:I, s:I, s:I}}",
		"requests",
		(json_int_t)st.requests, "requests_failed", (json_int_t)st.requests_failed, "running",
		(json_int_t)st.running, "queued", (json_int_t)st.queued, "prompt_tokens", (json_int_t)st.prompt_tokens,
		"cached_tokens", (json_int_t)st.cached_tokens, "lossy_cached_tokens", (json_int_t)st.lossy_cached_tokens,
		"reusable_tokens", (json_int_t)st.reusable_tokens,
		"cache_efficiency", ratio((double)st.cached_tokens, (double)st.reusable_tokens), "prefill_tokens_saved",
		(json_int_t)st.cached_tokens, "completion_tokens", (json_int_t)st.completion_tokens, "ttft_p50_ms",
		st.ttft_p50_s * 1e3, "ttft_p99_ms", st.ttft_p99_s * 1e3, "prefill_tokens_per_s",
		ratio((double)st.prefill_tokens, st.prefill_s), "decode_tokens_per_s",
		ratio((double)st.completion_tokens, st.decode_s), "cached_tokens_by_tier", "hbm",
		(json_int_t)st.cached_by_tier[KVT_TIER_HBM], "host", (json_int_t)st.cached_by_tier[KVT_TIER_HOST], "nvme",
		(json_int_t)st.cached_by_tier[KVT_TIER_NVME], "remote", (json_int_t)st.cached_by_tier[KVT_TM_TIER_REMOTE]);
	if (engine)
		json_object_set_new(engine, "misses_by_reason", stats_misses(&st.tiers));
	json_t *persist = json_pack("{s:I, s:I, s:I, s:b, s:b, s:I, s:I, s:I, s:I}", "registered",
				    (json_int_t)st.tiers.n_registered, "persisted", (json_int_t)st.tiers.n_persisted,
				    "failed", (json_int_t)st.tiers.n_persist_failed, "read_only", (int)st.tiers.t2_read_only,
				    "degraded", (int)(st.index.degraded || st.tiers.tier[KVT_TIER_NVME].degraded),
				    "lost_at_start", (json_int_t)st.tiers.n_lost, "skipped_at_start",
				    (json_int_t)st.tiers.n_skipped, "other_namespace_records",
				    (json_int_t)st.tiers.n_foreign, "other_namespace_reclaimed", (json_int_t)st.tiers.n_reclaimed);
	json_t *index = json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:I}", "degraded", (int)st.index.degraded,
				  "commits", (json_int_t)st.index.n_commits, "failed_writes", (json_int_t)st.index.n_failed,
				  "rolled_back", (json_int_t)st.index.n_full, "kept_session_writes",
				  (json_int_t)st.index.n_carried, "bad_session_rows", (json_int_t)st.index.n_bad_sessions,
				  "reserve_bytes", (json_int_t)st.index.reserve_bytes, "reserve_in_use",
				  (int)st.index.reserve_in_use, "reserve_refused_block_rows",
				  (json_int_t)st.index.n_reserve_refused);
	return kvt_srv_reply_json(r, 200,
			  json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:I, s:f, s:s, s:o*, s:o*, s:o*}", "tiers", tiers,
				    "engine", engine, "scheduler", stats_sched(&st), "memory", stats_memory(&st), "persist",
				    persist, "index", index, "remote", remote, "chunks", stats_chunks(&st),
				    "sessions", (json_int_t)st.sessions, "uptime_s", kvt_now_s() - srv->t_start, "model",
				    srv->model_id, "retention", kvt_dashboard_retention(sched, &st, NULL), "sessions_table",
				    kvt_dashboard_sessions(sched, 100), "store", kvt_srv_stats_store(srv, NULL)),
			  false);
}

/* ------------------------------------------------------------------------ */
/* sessions                                                                   */

/* The tenant `user` names when no API keys are configured (with keys: the key's, set by auth). */
static int request_tenant(conn_req *r, const char *user, size_t n_user, kvt_req_err *e)
{
	if (kvt_srv_auth_on(r->srv))
		return KVT_OK;
	return kvt_req_tenant(user, n_user, r->tenant, e);
}

/*
 * The tenant of a request without a body: ?user=NAME without keys. With
 * keys, the key's tenant; an admin key may name another with ?tenant=NAME,
 * or every tenant with ?tenant=* where allow_all (a listing). KVT_OK, or
 * KVT_EINVAL with e: a 400, or with code "admin_key_required" a 403 (a
 * tenant key asks for another tenant).
 */
static int query_tenant_ex(conn_req *r, bool allow_all, kvt_req_err *e)
{
	const char *t = MHD_lookup_connection_value(r->con, MHD_GET_ARGUMENT_KIND, "tenant");
	if (kvt_srv_auth_on(r->srv) && t) {
		if (!r->admin)
			return kvt_req_fail(e, "tenant", "admin_key_required",
					    "only an admin key (server.admin_keys) may act on another tenant's sessions");
		if (!strcmp(t, "*") && allow_all) {
			r->all_tenants = true;
			return KVT_OK;
		}
		if (!kvt_name_valid(t))
			return kvt_req_fail(e, "tenant", NULL, "'tenant' must be a tenant name%s", allow_all ? " or *" : "");
		snprintf(r->tenant, sizeof(r->tenant), "%s", t);
		return KVT_OK;
	}
	const char *user = MHD_lookup_connection_value(r->con, MHD_GET_ARGUMENT_KIND, "user");
	return request_tenant(r, user, user ? strlen(user) : 0, e);
}

static int query_tenant(conn_req *r, kvt_req_err *e)
{
	return query_tenant_ex(r, false, e);
}

/* The answer to a query_tenant_ex failure: 403 for another tenant's sessions with a tenant key, else 400. */
static enum MHD_Result tenant_error(conn_req *r, const kvt_req_err *e)
{
	return kvt_srv_reply_req_error(r, !strcmp(e->code, "admin_key_required") ? 403 : 400, e);
}

static json_t *tiers3(const uint32_t v[KVT_TIER_COUNT])
{
	return json_pack("{s:I, s:I, s:I}", "hbm", (json_int_t)v[KVT_TIER_HBM], "host", (json_int_t)v[KVT_TIER_HOST],
			 "nvme", (json_int_t)v[KVT_TIER_NVME]);
}

enum MHD_Result kvt_srv_handle_sessions(conn_req *r, kvt_sched *sched)
{
	kvt_req_err e = { { 0 }, { 0 }, { 0 } };
	int trc = query_tenant_ex(r, true, &e);
	if (trc)
		return tenant_error(r, &e);
	kvt_session_info *si = NULL;
	size_t n = 0;
	int rc = kvt_sched_sessions(sched, r->all_tenants ? NULL : r->tenant, &si, &n);
	if (rc != KVT_OK)
		return kvt_srv_reply_error(r, 500, NULL, NULL, "listing the sessions failed (%s)", kvt_strerror(rc));
	json_t *data = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:I, s:o, s:I, s:I, s:I}", "id", si[i].id, "tenant",
						      si[i].tenant, "tokens", (json_int_t)si[i].n_tokens, "blocks",
						      (json_int_t)si[i].n_blocks, "blocks_in", tiers3(si[i].blocks_in),
						      "blocks_missing", (json_int_t)si[i].blocks_missing, "durable_tokens",
						      (json_int_t)si[i].durable_tokens, "updated",
						      (json_int_t)(si[i].updated_us / 1000000)));
	free(si);
	return kvt_srv_reply_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", data), false);
}

enum MHD_Result kvt_srv_handle_session_delete(conn_req *r, kvt_sched *sched, const char *id)
{
	kvt_req_err e = { { 0 }, { 0 }, { 0 } };
	int trc = query_tenant(r, &e);
	if (trc)
		return tenant_error(r, &e);
	int rc = kvt_sched_session_delete(sched, r->tenant, id);
	if (rc == KVT_ENOTFOUND)
		return kvt_srv_reply_error(r, 404, "id", "not_found", "no session '%s'", id);
	if (rc == KVT_EFULL)
		return kvt_srv_reply_error(r, 503, NULL, NULL,
				   "deleting session '%s': the index is out of disk space; the deletion is kept and "
				   "commits once space returns", id);
	if (rc != KVT_OK)
		return kvt_srv_reply_error(r, rc == KVT_EINVAL ? 400 : 500, NULL, NULL, "deleting session '%s' failed (%s)", id,
				   kvt_strerror(rc));
	return kvt_srv_reply_json(r, 200, json_pack("{s:s, s:b}", "id", id, "deleted", 1), false);
}

static json_t *resume_json(const kvt_resume_report *rep)
{
	json_t *tok = tiers3(rep->tokens_from);
	if (tok)
		json_object_set_new(tok, "remote", json_integer((json_int_t)rep->tokens_from[KVT_TM_TIER_REMOTE]));
	return json_pack("{s:s, s:I, s:I, s:o, s:{s:I, s:I, s:I, s:I}, s:I, s:I, s:I, s:f, s:f, s:b, s:b}", "id", rep->id,
			 "tokens", (json_int_t)rep->n_tokens, "blocks", (json_int_t)rep->n_blocks, "restored_tokens", tok,
			 "restored_bytes", "hbm", (json_int_t)rep->bytes_from[KVT_TIER_HBM], "host",
			 (json_int_t)rep->bytes_from[KVT_TIER_HOST], "nvme", (json_int_t)rep->bytes_from[KVT_TIER_NVME],
			 "remote", (json_int_t)rep->bytes_from[KVT_TM_TIER_REMOTE], "missing_tokens",
			 (json_int_t)rep->tokens_missing, "durable_tokens", (json_int_t)rep->durable_tokens,
			 "durable_lost_tokens", (json_int_t)rep->durable_lost_tokens, "seconds", rep->seconds, "prefill_seconds_avoided", rep->prefill_s,
			 "prefill_measured", (int)rep->prefill_measured, "session_from_remote", (int)rep->from_remote);
}

/*
 * A session resume runs on a thread of its own (it reads NVMe for as long as
 * it takes), never on an HTTP worker. Streamed, the content reader hands out
 * its NDJSON lines; not streamed, the connection parks until the report is
 * in (resume_continue). The thread and the HTTP side each hold a reference;
 * the last to let go frees it, so a client that hangs up never waits for the
 * resume to end. kvt_server_stop waits for every resume thread.
 */
typedef struct resume_job {
	kvt_server *srv;                  /* owner */
	kvt_sched *sched;                 /* borrowed */
	char tenant[KVT_NAME_MAX + 1];    /* the caller's tenant */
	char id[KVT_NAME_MAX + 1];        /* the session */
	char rid[SRV_RID_MAX + 1];        /* the request's X-Request-Id (for an error line) */
	bool stream;                      /* NDJSON progress lines (else one JSON report) */
	atomic_int refs;                  /* the thread + the HTTP side */
	pthread_mutex_t mu;               /* guards out, out_off, done, rc, rep */
	kvt_sbuf out;                         /* NDJSON not yet handed to MHD (stream) */
	size_t out_off;                   /* of those, already handed */
	bool done;                        /* the last line is in out / the report is in */
	int rc;                           /* kvt_sched_session_resume's result, once done */
	kvt_resume_report rep;            /* its report, once done */
	waiter w;                         /* parks the connection while nothing is new */
} resume_job;

void kvt_srv_resume_unref(resume_job *rj)
{
	if (atomic_fetch_sub(&rj->refs, 1) != 1)
		return;
	atomic_fetch_sub(&rj->srv->in_flight, 1);
	pthread_mutex_destroy(&rj->mu);
	free(rj->out.p);
	free(rj);
}

static void resume_put(resume_job *rj, json_t *v, bool last)
{
	char *s = v ? json_dumps(v, SRV_JSON_FLAGS) : NULL;
	json_decref(v);
	pthread_mutex_lock(&rj->mu);
	if (s) {
		kvt_sbuf_add(&rj->out, s, strlen(s));
		kvt_sbuf_add(&rj->out, "\n", 1);
	} else {
		rj->out.failed = true;
	}
	if (last)
		rj->done = true;
	pthread_mutex_unlock(&rj->mu);
	kvt_srv_wake(rj->srv);
	free(s);
}

static void resume_progress(void *user, uint32_t done, uint32_t total)
{
	resume_put(user, json_pack("{s:s, s:I, s:I}", "event", "progress", "blocks_done", (json_int_t)done,
				   "blocks_total", (json_int_t)total),
		   false);
}

static void *resume_main(void *arg)
{
	resume_job *rj = arg;
	kvt_server *srv = rj->srv;
	kvt_resume_report rep;
	memset(&rep, 0, sizeof(rep));
	int rc = kvt_sched_session_resume(rj->sched, rj->tenant, rj->id, rj->stream ? resume_progress : NULL, rj, &rep);
	if (rj->stream) {
		json_t *v;
		if (rc == KVT_OK) {
			v = resume_json(&rep);
			if (v)
				json_object_set_new(v, "event", json_string("done"));
		} else {
			v = json_pack("{s:s, s:o}", "event", "error", "error",
				      kvt_srv_error_object(rj->rid, rc == KVT_ENOTFOUND ? "invalid_request_error" : "server_error", NULL,
						   rc == KVT_ENOTFOUND ? "not_found" : NULL,
						   rc == KVT_ENOTFOUND ? "the session is gone" : kvt_strerror(rc)));
		}
		resume_put(rj, v, true);
	} else {
		pthread_mutex_lock(&rj->mu);
		rj->rc = rc;
		rj->rep = rep;
		rj->done = true;
		pthread_mutex_unlock(&rj->mu);
		kvt_srv_wake(srv);
	}
	kvt_srv_resume_unref(rj);
	atomic_fetch_sub(&srv->n_resume_threads, 1); /* last: kvt_server_stop may free srv after this */
	return NULL;
}

static ssize_t resume_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	resume_job *rj = cls;
	for (;;) {
		uint64_t seen = atomic_load(&rj->srv->wake_seq);
		pthread_mutex_lock(&rj->mu);
		if (rj->out.failed) {
			pthread_mutex_unlock(&rj->mu);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		if (rj->out_off < rj->out.n) {
			size_t k = rj->out.n - rj->out_off < max ? rj->out.n - rj->out_off : max;
			memcpy(buf, rj->out.p + rj->out_off, k);
			rj->out_off += k;
			if (rj->out_off == rj->out.n)
				rj->out_off = rj->out.n = 0;
			pthread_mutex_unlock(&rj->mu);
			return (ssize_t)k;
		}
		bool done = rj->done;
		pthread_mutex_unlock(&rj->mu);
		if (done)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (kvt_srv_peer_gone(rj->w.fd) || atomic_load(&rj->srv->stopping))
			return MHD_CONTENT_READER_END_WITH_ERROR; /* the resume runs to its end on its thread */
		if (kvt_srv_park(rj->srv, &rj->w, seen))
			return 0;
	}
}

static void resume_free(void *cls)
{
	kvt_srv_resume_unref(cls);
}

/* A non-streamed resume, each time MHD runs its connection: park until the report is in, then answer. */
enum MHD_Result kvt_srv_resume_continue(conn_req *r)
{
	resume_job *rj = r->rj;
	enum MHD_Result ret;
	for (;;) {
		uint64_t seen = atomic_load(&r->srv->wake_seq);
		pthread_mutex_lock(&rj->mu);
		bool done = rj->done;
		pthread_mutex_unlock(&rj->mu);
		if (done) {
			const char *id = rj->id;
			if (rj->rc == KVT_ENOTFOUND)
				ret = kvt_srv_reply_error(r, 404, "id", "not_found", "no session '%s'", id);
			else if (rj->rc != KVT_OK)
				ret = kvt_srv_reply_error(r, rj->rc == KVT_EINVAL ? 400 : 500, NULL, NULL,
						  "resuming session '%s' failed (%s)", id, kvt_strerror(rj->rc));
			else
				ret = kvt_srv_reply_json(r, 200, resume_json(&rj->rep), false);
			break;
		}
		if (kvt_srv_peer_gone(rj->w.fd) || atomic_load(&r->srv->stopping)) {
			ret = MHD_NO; /* the resume runs to its end on its thread */
			r->status = 499;
			break;
		}
		if (kvt_srv_park(r->srv, &rj->w, seen))
			return MHD_YES;
	}
	r->rj = NULL;
	kvt_srv_resume_unref(rj);
	return ret;
}

enum MHD_Result kvt_srv_handle_resume(conn_req *r, kvt_sched *sched, const char *id)
{
	kvt_req_err e = { { 0 }, { 0 }, { 0 } };
	bool stream = false;
	const char *user = NULL;
	size_t n_user = 0;
	json_t *body = NULL;
	if (r->body.n) {
		if (kvt_req_body_load(r->body.p, r->body.n, &body, &e) ||
		    kvt_req_resume_parse(body, &stream, &user, &n_user, &e)) {
			json_decref(body);
			return kvt_srv_reply_req_error(r, 400, &e);
		}
	}
	int bad = user && !kvt_srv_auth_on(r->srv) ? request_tenant(r, user, n_user, &e) : query_tenant(r, &e);
	json_decref(body); /* user points into body: used above only */
	if (bad)
		return tenant_error(r, &e);

	if (stream) { /* answer 404 before the 200 header when the session is unknown */
		kvt_session_info *si = NULL;
		size_t n = 0;
		bool found = false;
		int rc = kvt_sched_sessions(sched, r->tenant, &si, &n);
		if (rc != KVT_OK)
			return kvt_srv_reply_error(r, 500, NULL, NULL, "listing the sessions failed (%s)", kvt_strerror(rc));
		for (size_t i = 0; i < n && !found; i++)
			found = !strcmp(si[i].id, id);
		free(si);
		/* another node's conversation: T3 may have it (asked within its command timeout) */
		if (!found && kvt_sched_session_remote(sched, r->tenant, id) == KVT_OK)
			found = true;
		if (!found)
			return kvt_srv_reply_error(r, 404, "id", "not_found", "no session '%s'", id);
	}
	if (!kvt_srv_in_flight_take(r->srv))
		return kvt_srv_reply_error(r, 503, NULL, "overloaded", "too many requests in flight (%u); retry shortly",
				   r->srv->cfg.max_concurrent);
	resume_job *rj = calloc(1, sizeof(*rj));
	if (!rj) {
		atomic_fetch_sub(&r->srv->in_flight, 1);
		return kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
	}
	rj->srv = r->srv;
	rj->sched = sched;
	rj->stream = stream;
	atomic_init(&rj->refs, 2);
	kvt_srv_waiter_init(&rj->w, r->con);
	snprintf(rj->tenant, sizeof(rj->tenant), "%s", r->tenant);
	snprintf(rj->id, sizeof(rj->id), "%.*s", KVT_NAME_MAX, id);
	memcpy(rj->rid, r->rid, sizeof(rj->rid));
	pthread_mutex_init(&rj->mu, NULL);
	struct MHD_Response *resp = NULL;
	if (stream && !(resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, resume_reader, rj, resume_free))) {
		atomic_store(&rj->refs, 1);
		kvt_srv_resume_unref(rj);
		return kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
	}
	pthread_t th;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	atomic_fetch_add(&r->srv->n_resume_threads, 1);
	int prc = pthread_create(&th, &at, resume_main, rj);
	pthread_attr_destroy(&at);
	if (prc != 0) {
		atomic_fetch_sub(&r->srv->n_resume_threads, 1);
		atomic_store(&rj->refs, 1); /* the HTTP side's alone */
		if (resp)
			MHD_destroy_response(resp); /* calls resume_free */
		else
			kvt_srv_resume_unref(rj);
		return kvt_srv_reply_error(r, 500, NULL, NULL, "could not start the resume thread");
	}
	if (!stream) {
		r->rj = rj;
		return kvt_srv_resume_continue(r);
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-ndjson");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
	MHD_add_response_header(resp, "X-Accel-Buffering", "no");
	return kvt_srv_queue(r, 200, resp);
}

/* GET /v1/stats for a tenant key: its own sessions and usage, nothing of the others'. */
enum MHD_Result kvt_srv_handle_tenant_stats(conn_req *r, kvt_sched *sched)
{
	kvt_session_info *si = NULL;
	size_t n = 0;
	int rc = kvt_sched_sessions(sched, r->tenant, &si, &n);
	free(si);
	if (rc != KVT_OK)
		return kvt_srv_reply_error(r, 500, NULL, NULL, "listing the sessions failed (%s)", kvt_strerror(rc));
	const tenant_usage *u = r->usage;
	kvt_sched_stats st;
	kvt_sched_get_stats(sched, &st);
	return kvt_srv_reply_json(r, 200,
			  json_pack("{s:s, s:I, s:{s:I, s:I, s:I, s:I}, s:s, s:o*, s:o*}", "tenant", r->tenant, "sessions",
				    (json_int_t)n, "usage", "requests", (json_int_t)atomic_load(&u->requests),
				    "prompt_tokens", (json_int_t)atomic_load(&u->prompt_tokens), "cached_tokens",
				    (json_int_t)atomic_load(&u->cached_tokens), "completion_tokens",
				    (json_int_t)atomic_load(&u->completion_tokens), "model", r->srv->model_id,
				    "retention", kvt_dashboard_retention(sched, &st, r->tenant), "store",
				    kvt_srv_stats_store(r->srv, r->tenant)),
			  false);
}

/*
 * GET /dashboard: the page, behind an admin key when keys are configured. A
 * browser cannot add a header to a page it navigates to, so the key may also
 * come as ?key= (the page then sends it as a bearer token on every poll).
 */
enum MHD_Result kvt_srv_handle_dashboard(conn_req *r)
{
	kvt_server *srv = r->srv;
	if (kvt_srv_auth_on(srv)) {
		const char *q = MHD_lookup_connection_value(r->con, MHD_GET_ARGUMENT_KIND, "key");
		bool ok = kvt_srv_authenticate(r);
		if (!ok && q) {
			size_t n_all = srv->cfg.n_keys + srv->cfg.n_admin_keys, nq = strlen(q);
			for (size_t i = 0; i < n_all; i++)
				if (kvt_srv_key_equal(q, nq, srv->keys[i].key) && !ok) {
					ok = true;
					r->admin = i >= srv->cfg.n_keys;
				}
		}
		if (!ok)
			return kvt_srv_reply_error(r, 401, NULL, "invalid_api_key",
					   "the dashboard needs an admin key (Authorization: Bearer KEY, or /dashboard?key=KEY)");
		if (!r->admin)
			return kvt_srv_reply_error(r, 403, NULL, "admin_key_required", "the dashboard needs an admin key (server.admin_keys)");
	}
	size_t n;
	const char *page = kvt_dashboard_html(&n);
	struct MHD_Response *resp = MHD_create_response_from_buffer(n, (void *)page, MHD_RESPMEM_PERSISTENT);
	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	/* Nothing from anywhere else: the page's own script and style, and requests to this daemon only. */
	MHD_add_response_header(resp, "Content-Security-Policy",
				"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
				"connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'");
	MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
	return kvt_srv_queue(r, 200, resp);
}