/*
 * engine/serve/cachectl.c — the cache-control fields of a generation request
 * (see cachectl.h). Pure parsing and tokenizing: nothing here touches the
 * cache; the scheduler applies the result when the request ends. Refusals
 * fill the one request-error record (serve_int.h).
 */
#include "cachectl.h"

#include "structured.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kvt_cachectl_one(json_t *cc, const char *param, double *ttl_s, kvt_req_err *e)
{
	if (!json_is_object(cc))
		return kvt_req_fail(e, param, NULL, "'%s' must be an object {\"type\": \"ephemeral\", \"ttl\": \"5m\" | \"1h\"}", param);
	json_t *type = json_object_get(cc, "type"), *ttl = json_object_get(cc, "ttl");
	if (!json_is_string(type) || strcmp(json_string_value(type), "ephemeral"))
		return kvt_req_fail(e, param, NULL, "'%s.type' must be \"ephemeral\"", param);
	*ttl_s = 300;
	if (ttl && !json_is_null(ttl)) {
		const char *t = json_is_string(ttl) ? json_string_value(ttl) : NULL;
		if (t && !strcmp(t, "5m"))
			*ttl_s = 300;
		else if (t && !strcmp(t, "1h"))
			*ttl_s = 3600;
		else
			return kvt_req_fail(e, param, NULL, "'%s.ttl' must be \"5m\" or \"1h\"", param);
	}
	const char *key;
	size_t key_len;
	json_t *v;
	json_object_keylen_foreach(cc, key, key_len, v)
	{
		if (key_len != strlen(key) || (strcmp(key, "type") && strcmp(key, "ttl"))) /* a NUL in the key: neither */
			return kvt_req_fail(e, param, NULL, "'%s' has an unknown field '%.64s' (allowed: type, ttl)", param, key);
	}
	return KVT_OK;
}

static int add(kvt_cachectl *out, uint32_t tokens, double ttl_s, int tier, const char *param, kvt_req_err *e)
{
	if (out->n_retain == KVT_SCHED_MAX_RETAIN)
		return kvt_req_fail(e, param, NULL, "at most %d cache_control breakpoints (and prompt_cache_retention) per request",
			    KVT_SCHED_MAX_RETAIN);
	out->retain[out->n_retain++] = (kvt_sched_retain){ .tokens = tokens, .ttl_s = ttl_s, .tier = tier };
	return KVT_OK;
}

/*
 * Message k of msgs as the prompt builder renders it (request.c): a tool
 * result or an assistant turn with tool calls in the tools' format
 * (kvt_oai_message), else its text parts concatenated, up to `part` when
 * part >= 0. *owned: text to free (NULL: none).
 */
static int cut_message(json_t *msgs, size_t k, long part, kvt_chat_msg *cm, char **owned, kvt_req_err *e)
{
	json_t *m = json_array_get(msgs, k), *content = json_object_get(m, "content");
	bool special = false;
	const char *srole = NULL;
	if (kvt_oai_message(m, k, &special, &srole, owned, &cm->content_len, e))
		return KVT_EINVAL; /* not reached: the prompt builder read the same message */
	if (special) {
		cm->role = srole;
		cm->content = *owned;
		return KVT_OK;
	}
	const char *role = json_string_value(json_object_get(m, "role"));
	cm->role = role && !strcmp(role, "developer") ? "system" : role;
	if (json_is_string(content)) {
		cm->content = json_string_value(content);
		cm->content_len = json_string_length(content);
		return KVT_OK;
	}
	/* an array of text parts (validated by the prompt builder): concatenated, up to `part` */
	size_t n_parts = json_array_size(content);
	if (part >= 0 && (size_t)part + 1 < n_parts)
		n_parts = (size_t)part + 1;
	kvt_sbuf b = { 0 };
	kvt_sbuf_add(&b, "", 0);
	for (size_t p = 0; p < n_parts; p++) {
		json_t *t = json_object_get(json_array_get(content, p), "text");
		kvt_sbuf_add(&b, json_string_value(t), json_string_length(t));
	}
	*owned = b.p;
	if (b.failed)
		return kvt_req_fail(e, "messages", NULL, "out of memory");
	cm->content = b.p;
	cm->content_len = b.n;
	return KVT_OK;
}

/*
 * The tools' description put where the prompt builder puts it: after the
 * first system text, or a system turn of its own.
 */
static int cut_tools(kvt_chat_msg *cm, char **owned, size_t *n, const char *tools_text, kvt_req_err *e)
{
	size_t nt = strlen(tools_text);
	if (*n && cm[0].role && !strcmp(cm[0].role, "system")) {
		char *c = malloc(cm[0].content_len + 2 + nt + 1);
		if (!c)
			return kvt_req_fail(e, "messages", NULL, "out of memory");
		memcpy(c, cm[0].content, cm[0].content_len);
		memcpy(c + cm[0].content_len, "\n\n", 2);
		memcpy(c + cm[0].content_len + 2, tools_text, nt + 1);
		free(owned[0]);
		owned[0] = c;
		cm[0].content = c;
		cm[0].content_len += 2 + nt;
		return KVT_OK;
	}
	memmove(cm + 1, cm, *n * sizeof(*cm));
	memmove(owned + 1, owned, *n * sizeof(*owned));
	owned[0] = NULL;
	cm[0] = (kvt_chat_msg){ .role = "system", .content = tools_text, .content_len = nt };
	++*n;
	return KVT_OK;
}

int kvt_cachectl_chat_cut(const kvt_tok *tok, json_t *msgs, const char *tools_text, size_t n_msgs, long part,
			  const int32_t *ids, uint32_t n_ids, uint32_t *out, kvt_req_err *e)
{
	kvt_chat_msg *cm = calloc(n_msgs + 1, sizeof(*cm));
	char **owned = calloc(n_msgs + 1, sizeof(*owned)); /* texts made here, per message */
	int32_t *pid = NULL;
	size_t np = 0, n = n_msgs;
	int ret = KVT_EINVAL;
	if (!cm || !owned) {
		kvt_req_fail(e, "messages", NULL, "out of memory");
		goto out;
	}
	for (size_t k = 0; k < n_msgs; k++)
		if (cut_message(msgs, k, k + 1 == n_msgs ? part : -1, &cm[k], &owned[k], e))
			goto out;
	if (tools_text && cut_tools(cm, owned, &n, tools_text, e))
		goto out;
	int rc = kvt_tok_chat_encode(tok, cm, n, false, &pid, &np);
	if (rc != KVT_OK) {
		kvt_req_fail(e, "messages", NULL, "the messages up to a cache_control breakpoint cannot be formatted (%s)",
			     kvt_strerror(rc));
		goto out;
	}
	/* The full prompt may start with a BOS the template does not produce. */
	uint32_t off = n_ids && np && kvt_tok_add_bos(tok) && ids[0] == kvt_tok_bos(tok) && pid[0] != ids[0] ? 1 : 0;
	uint32_t l = 0;
	while (off + l < n_ids && l < np && ids[off + l] == pid[l])
		l++;
	*out = off + l;
	ret = KVT_OK;
out:
	for (size_t k = 0; owned && k <= n_msgs; k++)
		free(owned[k]);
	free(owned);
	free(pid);
	free(cm);
	return ret;
}

int kvt_cachectl_parse(const kvt_tok *tok, json_t *body, bool chat, const char *tools_text, const int32_t *ids,
		       uint32_t n_ids, kvt_cachectl *out, kvt_req_err *e)
{
	double ttl;
	json_t *v;
	memset(out, 0, sizeof(*out));

	if ((v = json_object_get(body, "prompt_cache_key")) && !json_is_null(v)) {
		if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > KVT_CACHECTL_KEY_MAX ||
		    strlen(json_string_value(v)) != json_string_length(v))
			return kvt_req_fail(e, "prompt_cache_key", NULL, "'prompt_cache_key' must be a string of 1-%d bytes",
				    KVT_CACHECTL_KEY_MAX);
		snprintf(out->cache_key, sizeof(out->cache_key), "%s", json_string_value(v));
	}
	if (chat) {
		json_t *msgs = json_object_get(body, "messages");
		for (size_t i = 0; i < json_array_size(msgs); i++) {
			json_t *m = json_array_get(msgs, i), *content = json_object_get(m, "content");
			char p[96];
			uint32_t at;
			if (json_is_array(content))
				for (size_t k = 0; k < json_array_size(content); k++) {
					json_t *cc = json_object_get(json_array_get(content, k), "cache_control");
					if (!cc || json_is_null(cc))
						continue;
					snprintf(p, sizeof(p), "messages[%zu].content[%zu].cache_control", i, k);
					if (kvt_cachectl_one(cc, p, &ttl, e) ||
					    kvt_cachectl_chat_cut(tok, msgs, tools_text, i + 1, (long)k, ids, n_ids, &at, e) ||
					    add(out, at, ttl, -1, p, e))
						return KVT_EINVAL;
				}
			json_t *cc = json_object_get(m, "cache_control");
			if (!cc || json_is_null(cc))
				continue;
			snprintf(p, sizeof(p), "messages[%zu].cache_control", i);
			if (kvt_cachectl_one(cc, p, &ttl, e) ||
			    kvt_cachectl_chat_cut(tok, msgs, tools_text, i + 1, -1, ids, n_ids, &at, e) ||
			    add(out, at, ttl, -1, p, e))
				return KVT_EINVAL;
		}
	}
	if ((v = json_object_get(body, "cache_control")) && !json_is_null(v)) {
		/* the whole prompt: its last element (completions' only way, chat's automatic one) */
		if (kvt_cachectl_one(v, "cache_control", &ttl, e) || add(out, n_ids, ttl, -1, "cache_control", e))
			return KVT_EINVAL;
	}
	if ((v = json_object_get(body, "prompt_cache_retention")) && !json_is_null(v)) {
		const char *s = json_is_string(v) ? json_string_value(v) : NULL;
		if (s && !strcmp(s, "24h")) {
			if (add(out, n_ids, 24 * 3600.0, KVT_TIER_NVME, "prompt_cache_retention", e))
				return KVT_EINVAL;
		} else if (!s || strcmp(s, "in_memory")) {
			return kvt_req_fail(e, "prompt_cache_retention", NULL, "'prompt_cache_retention' must be \"in_memory\" or \"24h\"");
		}
	}
	return KVT_OK;
}
