/*
 * engine/serve/priorities.c — the per-tenant default priorities of
 * [scheduler] priorities ("tenant:prio, ..., *:prio") parsed into a
 * scheduler config (kvt_sched_parse_priorities, scheduler.h).
 *
 * A file of its own, apart from scheduler.c, because the config loader
 * validates the list with it and must not need the scheduler's engine
 * (tests/fuzz_config.c links config.c with only what it reads).
 */
#include "scheduler.h"

#include "index.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvt_sched_parse_priorities(const char *text, kvt_sched_config *c, char *why, size_t why_cap)
{
	kvt_tenant_priority tp[KVT_SCHED_MAX_TENANT_PRIO];
	uint32_t n = 0;
	int def = c->default_priority;
	const char *p = text;
	for (uint32_t idx = 1; *p; idx++) {
		while (*p == ' ' || *p == '\t')
			p++;
		if (!*p)
			break;
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		char item[KVT_NAME_MAX + 32];
		while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
			len--;
		if (!len || len >= sizeof(item)) {
			snprintf(why, why_cap, "entry %u is %s", idx, len ? "too long" : "empty");
			return KVT_EINVAL;
		}
		memcpy(item, p, len);
		item[len] = '\0';
		char *colon = strchr(item, ':'), *end = NULL;
		if (!colon) {
			snprintf(why, why_cap, "entry %u (\"%s\") has no \":priority\"", idx, item);
			return KVT_EINVAL;
		}
		*colon = '\0';
		errno = 0;
		long v = strtol(colon + 1, &end, 10);
		if (end == colon + 1 || *end || errno || v < KVT_PRIORITY_MIN || v > KVT_PRIORITY_MAX) {
			snprintf(why, why_cap, "entry %u: priority \"%s\" is not a whole number in %d..%d", idx, colon + 1,
				 KVT_PRIORITY_MIN, KVT_PRIORITY_MAX);
			return KVT_EINVAL;
		}
		if (!strcmp(item, "*")) {
			def = (int)v;
		} else {
			if (!kvt_name_valid(item)) {
				snprintf(why, why_cap, "entry %u: tenant \"%s\" is not a valid name", idx, item);
				return KVT_EINVAL;
			}
			if (n == KVT_SCHED_MAX_TENANT_PRIO) {
				snprintf(why, why_cap, "more than %d tenants", KVT_SCHED_MAX_TENANT_PRIO);
				return KVT_EINVAL;
			}
			for (uint32_t i = 0; i < n; i++) {
				if (!strcmp(tp[i].tenant, item)) {
					snprintf(why, why_cap, "tenant \"%s\" is given twice", item);
					return KVT_EINVAL;
				}
			}
			memcpy(tp[n].tenant, item, strlen(item) + 1); /* kvt_name_valid: <= KVT_NAME_MAX bytes */
			tp[n].priority = (int)v;
			n++;
		}
		if (!e)
			break;
		p = e + 1;
		if (!*p) {
			snprintf(why, why_cap, "trailing comma");
			return KVT_EINVAL;
		}
	}
	memcpy(c->tenant_priority, tp, n * sizeof(tp[0]));
	c->n_tenant_priority = n;
	c->default_priority = def;
	return KVT_OK;
}
