/*
 * engine/serve/cachectl.h — the cache-control fields of a generation request
 * (docs/http-api.md, "Cache control"), turned into the prefixes the
 * scheduler retains (kvt_sched_req.retain).
 *
 *  - Anthropic's "cache_control": {"type": "ephemeral", "ttl": "5m" | "1h"}
 *    on a chat message, on a content part of one, or at the top of the body
 *    (chat or completions: the whole prompt, i.e. its last element). The
 *    prefix up to and including that part is retained for the TTL (default
 *    5m) in the configured floor tier ([cache] retain_tier). At most 4
 *    breakpoints, as Anthropic allows.
 *  - OpenAI's "prompt_cache_retention": "in_memory" (the default caching,
 *    nothing retained) or "24h" (the whole prompt retained for 24 h with
 *    NVMe as its floor).
 *  - OpenAI's "prompt_cache_key": a string of at most 256 bytes, echoed in
 *    usage.kvtier and the request log. kvtier is one node: there is nothing
 *    to route, and blocks are shared by prefix within a tenant keyed or not.
 *
 * Where a breakpoint falls in tokens: the messages up to it are formatted
 * with the chat template on their own, as the prompt builder formats them
 * (tool turns, and the tools' description in the first system turn), and
 * the breakpoint is the length of the part of that which the full prompt
 * shares (so the template's markers around the cut do not matter).
 */
#ifndef KVT_CACHECTL_H
#define KVT_CACHECTL_H

#include "scheduler.h"
#include "serve_int.h"
#include "tokenizer.h"

#include <jansson.h>

#define KVT_CACHECTL_KEY_MAX 256

typedef struct kvt_cachectl {
	kvt_sched_retain retain[KVT_SCHED_MAX_RETAIN]; /* breakpoints, in prompt order */
	uint32_t n_retain;                             /* entries */
	char cache_key[KVT_CACHECTL_KEY_MAX + 1];      /* prompt_cache_key ("" = none) */
} kvt_cachectl;

/*
 * Read the cache-control fields of body (already validated as a chat or a
 * completions request whose prompt is ids[0..n_ids); tools_text: the tools'
 * description the chat prompt holds, NULL for none). KVT_OK; KVT_EINVAL
 * with e filled (the field at fault, what is wrong) for a 400.
 */
int kvt_cachectl_parse(const kvt_tok *tok, json_t *body, bool chat, const char *tools_text, const int32_t *ids,
		       uint32_t n_ids, kvt_cachectl *out, kvt_req_err *e);

/* One "cache_control" object (param names it): *ttl_s set (300 or 3600); KVT_OK, or KVT_EINVAL with e. */
int kvt_cachectl_one(json_t *cc, const char *param, double *ttl_s, kvt_req_err *e);

/*
 * Where a chat breakpoint falls: the tokens of ids (the full prompt) that
 * the first n_msgs messages of msgs share with it, the last of them cut
 * after content part `part` (-1: whole), rendered as the prompt builder
 * renders them (tool turns in the tools' format, tools_text after the first
 * system text or as a system turn of its own; n_msgs 0 with tools_text: the
 * tools' turn alone). KVT_OK with *out; KVT_EINVAL with e.
 */
int kvt_cachectl_chat_cut(const kvt_tok *tok, json_t *msgs, const char *tools_text, size_t n_msgs, long part,
			  const int32_t *ids, uint32_t n_ids, uint32_t *out, kvt_req_err *e);

#endif
