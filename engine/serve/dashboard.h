/*
 * engine/serve/dashboard.h — the live view of the tiers: the JSON that
 * /v1/stats adds for it (retention per tier and per tenant, the sessions
 * table) and GET /dashboard, one self-contained page (HTML, CSS and JS in
 * this binary; it fetches nothing but /v1/stats from the daemon that served
 * it) that polls /v1/stats and draws tier occupancy, hits and promotions by
 * tier over the last minutes, TTFT p50/p99, queue depth, retained bytes by
 * tenant and the sessions.
 */
#ifndef KVT_DASHBOARD_H
#define KVT_DASHBOARD_H

#include "scheduler.h"

#include <jansson.h>

/* The page (NUL-terminated, static storage). */
const char *kvt_dashboard_html(size_t *n_bytes);

/*
 * The "retention" object of /v1/stats: retained blocks and bytes per tier
 * and by floor, and per tenant (only `tenant` when not NULL: a tenant key
 * sees its own). NULL on allocation failure.
 */
json_t *kvt_dashboard_retention(kvt_sched *s, const kvt_sched_stats *st, const char *tenant);

/* The "sessions_table" array of /v1/stats: at most max sessions of every tenant, newest first. */
json_t *kvt_dashboard_sessions(kvt_sched *s, size_t max);

#endif
