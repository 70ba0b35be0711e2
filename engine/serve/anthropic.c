/*
 * engine/serve/anthropic.c — Anthropic's Messages API on kvtierd
 * (docs/http-api.md, "Anthropic's Messages API"): POST /v1/messages and
 * POST /v1/messages/count_tokens, their reply, their SSE events and the
 * error shape of their routes.
 *
 * Design. A Messages body is mapped onto the body of a chat completion
 * (anth_translate), which then goes through the same pure steps as
 * /v1/chat/completions (request.h; kvt_anth_request is as pure, and
 * tests/test_request_anthropic.c runs it without a model): the same chat
 * template, the same tools format (structured.h), the same cache control
 * (cachectl.h), the same sessions and tenants. So a conversation sent
 * through either API makes the same prompt tokens and shares their cached
 * blocks. Only the reply differs: the job is marked KVT_SRV_API_ANTHROPIC
 * and reply.c hands its body and its events to this file.
 *
 * The mapping:
 *  - system (a string or text blocks) -> the first message, role "system";
 *  - a user message's text blocks -> a user message (a run of them per
 *    message, between tool results); each tool_result block -> a "tool"
 *    message (its text; is_error puts "Error: " first);
 *  - an assistant message's text blocks -> its content; its tool_use blocks
 *    -> tool_calls (input as JSON text);
 *  - tools {name, description, input_schema} -> function tools; tool_choice
 *    auto / any / tool / none -> "auto" / "required" / the named function /
 *    "none", disable_parallel_tool_use -> parallel_tool_calls false;
 *  - stop_sequences -> stop; metadata.user_id -> user (the tenant when no
 *    keys are configured); temperature, top_p, top_k, max_tokens, stream as
 *    they are; output_config.format -> response_format; kvtier's own fields
 *    (session_id, priority, seed, ignore_eos, min_p, the penalties,
 *    logit_bias, prompt_cache_key, kvtier) passed on.
 *  - cache_control on a text block stays on it (a breakpoint after that
 *    block); on a tool_result, a tool_use or any block of an assistant turn
 *    that calls tools, it marks that whole turn. kvtier writes the tools'
 *    description after the system text, so a breakpoint on a tool or on a
 *    system block (with tools) retains the whole system turn.
 *
 * What differs from Anthropic: no images, documents, thinking, server tools
 * or MCP (each refused with a 400 naming it); no prefill (a last assistant
 * message is refused); the model is whatever kvtierd serves, whatever
 * "model" says; usage.cache_read_input_tokens counts every prompt token
 * served from the cache (retained or not), and message_start's usage counts
 * the whole prompt as input_tokens (the split comes with message_delta);
 * a refusal found by the shared chat steps names the Messages field it came
 * from as best it can (messages and blocks renumbered); 503 answers become
 * 529 overloaded_error (loading, draining, queue full), with Retry-After.
 *
 * Invariants: usage.input_tokens + cache_creation_input_tokens +
 * cache_read_input_tokens is the prompt's token count (what count_tokens
 * says for the same body); a stream's events run message_start,
 * (content_block_start, [ping once], content_block_delta*,
 * content_block_stop)+, message_delta, message_stop — or end with one error
 * event.
 */
#include "server_int.h"

#include "cachectl.h"
#include "structured.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* the request: a Messages body onto a chat body                              */

/* Where a message of the chat body came from (refusals found later name the Messages field). */
typedef struct anth_origin {
	long msg;                  /* index in the Messages "messages"; -1: the system turn */
	size_t part0;              /* its parts' block indexes start at anth_tr.blocks[part0] */
} anth_origin;

/* A Messages body being mapped onto a chat body. */
typedef struct anth_tr {
	json_t *out;               /* the chat body (owned until handed back) */
	json_t *msgs;              /* out's "messages" (borrowed) */
	bool has_tools;            /* tools given: system and tool breakpoints retain the whole system turn */
	bool for_count;            /* count_tokens: max_tokens may be left out */
	double turn_ttl;           /* the system-turn breakpoint's TTL in seconds (0: none) */
	char turn_param[96];       /* the field that asked for it */
	uint32_t n_cc;             /* cache_control objects seen (at most KVT_SCHED_MAX_RETAIN) */
	anth_origin *orig;         /* [n_orig] one per chat message */
	size_t n_orig, cap_orig;   /* entries, allocated */
	size_t *blocks;            /* [n_blocks] the Messages block index of each chat content part */
	size_t n_blocks, cap_blocks; /* entries, allocated */
	kvt_req_err *e;            /* the refusal */
} anth_tr;

#define ANTH_STR(v) (json_is_string(v) ? json_string_value(v) : NULL)

static bool str_is(json_t *v, const char *s)
{
	return json_is_string(v) && !strcmp(json_string_value(v), s);
}

/* p (*cap elements of elem bytes) with room past n: p itself, a larger copy, or NULL (p intact). */
static void *grow(void *p, size_t *cap, size_t n, size_t elem)
{
	if (n < *cap)
		return p;
	size_t nc = *cap ? 2 * *cap : 16;
	void *q = realloc(p, nc * elem);
	if (q)
		*cap = nc;
	return q;
}

/* A chat message appended (taken), coming from Messages message `msg` (-1: system). */
static int tr_push(anth_tr *t, json_t *m, long msg)
{
	anth_origin *o = m ? grow(t->orig, &t->cap_orig, t->n_orig, sizeof(*o)) : NULL;
	if (!o) {
		json_decref(m);
		return KVT_ENOMEM;
	}
	t->orig = o;
	if (json_array_append_new(t->msgs, m))
		return KVT_ENOMEM;
	t->orig[t->n_orig++] = (anth_origin){ .msg = msg, .part0 = t->n_blocks };
	return KVT_OK;
}

/* The last chat message's next content part comes from block k. */
static int tr_part(anth_tr *t, size_t k)
{
	size_t *b = grow(t->blocks, &t->cap_blocks, t->n_blocks, sizeof(*b));
	if (!b)
		return KVT_ENOMEM;
	t->blocks = b;
	t->blocks[t->n_blocks++] = k;
	return KVT_OK;
}

/* One cache_control (param names it): checked and counted; *ttl_s its TTL. */
static int tr_cc(anth_tr *t, json_t *cc, const char *param, double *ttl_s)
{
	if (kvt_cachectl_one(cc, param, ttl_s, t->e))
		return KVT_EINVAL;
	if (++t->n_cc > KVT_SCHED_MAX_RETAIN)
		return kvt_req_fail(t->e, param, NULL, "at most %d blocks may carry cache_control ('%s' is one more)",
				    KVT_SCHED_MAX_RETAIN, param);
	return KVT_OK;
}

/* The breakpoint of the whole system turn (tools' and system blocks' with tools): the longest TTL asked. */
static void tr_turn(anth_tr *t, double ttl_s, const char *param)
{
	if (ttl_s > t->turn_ttl) {
		t->turn_ttl = ttl_s;
		snprintf(t->turn_param, sizeof(t->turn_param), "%s", param);
	}
}

/* A message-level breakpoint on chat message m: the longest TTL asked. */
static void msg_cc(json_t *m, double ttl_s)
{
	json_t *old = json_object_get(m, "cache_control");
	if (old && str_is(json_object_get(old, "ttl"), "1h"))
		return;
	json_object_set_new(m, "cache_control",
			    json_pack("{s:s, s:s}", "type", "ephemeral", "ttl", ttl_s > 300 ? "1h" : "5m"));
}

/*
 * A text block (param names it) as a chat content part: {"type": "text",
 * "text"} with its cache_control (when keep_cc; else *ttl_s gets it, 0:
 * none) and its "kvtier" chunk mark.
 */
static int text_part(anth_tr *t, json_t *blk, const char *param, bool keep_cc, json_t **part, double *ttl_s)
{
	char p[96];
	json_t *text = json_object_get(blk, "text"), *cc = json_object_get(blk, "cache_control"),
	       *kv = json_object_get(blk, "kvtier");
	*ttl_s = 0;
	if (!json_is_string(text)) {
		snprintf(p, sizeof(p), "%s.text", param);
		return kvt_req_fail(t->e, p, NULL, "'%s' must be a string", p);
	}
	snprintf(p, sizeof(p), "%s.cache_control", param);
	if (cc && !json_is_null(cc) && tr_cc(t, cc, p, ttl_s))
		return KVT_EINVAL;
	*part = json_pack("{s:s, s:O}", "type", "text", "text", text);
	if (!*part)
		return KVT_ENOMEM;
	if (keep_cc && *ttl_s > 0)
		json_object_set(*part, "cache_control", cc);
	if (kv && !json_is_null(kv))
		json_object_set(*part, "kvtier", kv);
	return KVT_OK;
}

/* A block's "type" (param names the block): KVT_OK with *type, else the refusal. */
static int block_type(anth_tr *t, json_t *blk, const char *param, const char **type)
{
	if (!json_is_object(blk))
		return kvt_req_fail(t->e, param, NULL, "'%s' must be a content block object", param);
	*type = ANTH_STR(json_object_get(blk, "type"));
	if (!*type)
		return kvt_req_fail(t->e, param, NULL, "'%s.type' must be a string", param);
	return KVT_OK;
}

static int unsupported_block(anth_tr *t, const char *param, const char *type, const char *allowed)
{
	return kvt_req_fail(t->e, param, NULL, "'%s': block type '%.40s' is not supported here (kvtier takes %s)", param,
			    type, allowed);
}

/* "system": a string, or an array of text blocks. */
static int tr_system(anth_tr *t, json_t *sys)
{
	if (!sys || json_is_null(sys))
		return KVT_OK;
	if (json_is_string(sys))
		return tr_push(t, json_pack("{s:s, s:O}", "role", "system", "content", sys), -1);
	if (!json_is_array(sys))
		return kvt_req_fail(t->e, "system", NULL, "'system' must be a string or an array of text blocks");
	json_t *parts = json_array();
	int rc = tr_push(t, json_pack("{s:s, s:o}", "role", "system", "content", parts), -1);
	size_t k;
	json_t *blk;
	json_array_foreach(sys, k, blk)
	{
		char param[48];
		const char *type;
		json_t *part = NULL;
		double ttl;
		snprintf(param, sizeof(param), "system[%zu]", k);
		if (rc || (rc = block_type(t, blk, param, &type)))
			return rc;
		if (strcmp(type, "text"))
			return unsupported_block(t, param, type, "text blocks in 'system'");
		if ((rc = text_part(t, blk, param, !t->has_tools, &part, &ttl)) || (rc = tr_part(t, k)))
			return rc;
		if (json_array_append_new(parts, part))
			return KVT_ENOMEM;
		if (t->has_tools && ttl > 0)
			tr_turn(t, ttl, param);
	}
	return rc;
}

/* One tool {name, description, input_schema, cache_control} -> {"type": "function", "function": {...}}. */
static int tr_tool(anth_tr *t, json_t *tool, size_t i, json_t *out)
{
	char param[64];
	snprintf(param, sizeof(param), "tools[%zu]", i);
	if (!json_is_object(tool))
		return kvt_req_fail(t->e, param, NULL, "'%s' must be an object {name, description, input_schema}", param);
	json_t *type = json_object_get(tool, "type"), *name = json_object_get(tool, "name"),
	       *desc = json_object_get(tool, "description"), *schema = json_object_get(tool, "input_schema"),
	       *cc = json_object_get(tool, "cache_control");
	if (type && !json_is_null(type) && !str_is(type, "custom"))
		return kvt_req_fail(t->e, param, NULL, "'%s.type' '%.40s': Anthropic's server tools are not supported (only "
				    "custom tools with an input_schema)", param, ANTH_STR(type) ? ANTH_STR(type) : "?");
	if (!json_is_string(name))
		return kvt_req_fail(t->e, param, NULL, "'%s.name' must be a string", param);
	if (desc && !json_is_null(desc) && !json_is_string(desc))
		return kvt_req_fail(t->e, param, NULL, "'%s.description' must be a string", param);
	if (!json_is_object(schema))
		return kvt_req_fail(t->e, param, NULL, "'%s.input_schema' must be a JSON Schema object", param);
	if (cc && !json_is_null(cc)) {
		double ttl;
		char p[80];
		snprintf(p, sizeof(p), "%s.cache_control", param);
		if (tr_cc(t, cc, p, &ttl))
			return KVT_EINVAL;
		tr_turn(t, ttl, p);
	}
	json_t *fn = json_pack("{s:O}", "name", name);
	if (fn && json_is_string(desc))
		json_object_set(fn, "description", desc);
	if (fn)
		json_object_set(fn, "parameters", schema);
	return json_array_append_new(out, json_pack("{s:s, s:o*}", "type", "function", "function", fn)) ? KVT_ENOMEM : KVT_OK;
}

/* "tool_choice": {"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}. */
static int tr_tool_choice(anth_tr *t, json_t *tc)
{
	if (!tc || json_is_null(tc))
		return KVT_OK;
	json_t *type = json_object_get(tc, "type"), *name = json_object_get(tc, "name"),
	       *dp = json_object_get(tc, "disable_parallel_tool_use");
	if (!json_is_object(tc) || !json_is_string(type))
		return kvt_req_fail(t->e, "tool_choice", NULL, "'tool_choice' must be an object {\"type\": \"auto\" | \"any\" | "
				    "\"tool\" | \"none\"}");
	json_t *v = NULL;
	if ((str_is(type, "any") || str_is(type, "tool")) && !t->has_tools)
		return kvt_req_fail(t->e, "tool_choice", NULL, "'tool_choice' of type \"%s\" needs 'tools'",
				    json_string_value(type));
	if (str_is(type, "auto") || str_is(type, "none"))
		v = json_incref(type);
	else if (str_is(type, "any"))
		v = json_string("required");
	else if (str_is(type, "tool") && json_is_string(name))
		v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
	else if (str_is(type, "tool"))
		return kvt_req_fail(t->e, "tool_choice.name", NULL, "'tool_choice.name' must be a string with type \"tool\"");
	else
		return kvt_req_fail(t->e, "tool_choice.type", NULL, "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or "
				    "\"none\"");
	if (dp && !json_is_null(dp) && !json_is_boolean(dp)) {
		json_decref(v);
		return kvt_req_fail(t->e, "tool_choice.disable_parallel_tool_use", NULL,
				    "'tool_choice.disable_parallel_tool_use' must be a boolean");
	}
	if (json_is_true(dp))
		json_object_set_new(t->out, "parallel_tool_calls", json_false());
	return json_object_set_new(t->out, "tool_choice", v) ? KVT_ENOMEM : KVT_OK;
}

static int tr_tools(anth_tr *t, json_t *tools)
{
	if (!tools || json_is_null(tools))
		return KVT_OK;
	if (!json_is_array(tools))
		return kvt_req_fail(t->e, "tools", NULL, "'tools' must be an array of tools {name, description, input_schema}");
	json_t *out = json_array();
	if (!out || json_object_set_new(t->out, "tools", out))
		return KVT_ENOMEM;
	size_t i;
	json_t *tool;
	json_array_foreach(tools, i, tool)
	{
		int rc = tr_tool(t, tool, i, out);
		if (rc)
			return rc;
	}
	return KVT_OK;
}

/* A tool_result block as a "tool" message: its text (a string or text blocks), "Error: " first when is_error. */
static int tr_tool_result(anth_tr *t, json_t *blk, const char *param, long msg)
{
	char p[96];
	json_t *id = json_object_get(blk, "tool_use_id"), *content = json_object_get(blk, "content"),
	       *err = json_object_get(blk, "is_error"), *cc = json_object_get(blk, "cache_control");
	snprintf(p, sizeof(p), "%s.tool_use_id", param);
	if (!json_is_string(id))
		return kvt_req_fail(t->e, p, NULL, "'%s' must be a string", p);
	snprintf(p, sizeof(p), "%s.is_error", param);
	if (err && !json_is_null(err) && !json_is_boolean(err))
		return kvt_req_fail(t->e, p, NULL, "'%s' must be a boolean", p);
	json_t *parts = json_array();
	if (!parts)
		return KVT_ENOMEM;
	if (json_is_true(err))
		json_array_append_new(parts, json_pack("{s:s, s:s}", "type", "text", "text", "Error: "));
	double ttl = 0, inner;
	snprintf(p, sizeof(p), "%s.content", param);
	if (json_is_string(content)) {
		json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", content));
	} else if (json_is_array(content)) {
		size_t k;
		json_t *b;
		json_array_foreach(content, k, b)
		{
			char bp[128];
			const char *type;
			json_t *part = NULL;
			snprintf(bp, sizeof(bp), "%s[%zu]", p, k);
			int rc = block_type(t, b, bp, &type);
			if (!rc && strcmp(type, "text"))
				rc = unsupported_block(t, bp, type, "text blocks in a tool_result");
			if (rc || (rc = text_part(t, b, bp, false, &part, &inner))) {
				json_decref(parts);
				return rc;
			}
			ttl = inner > ttl ? inner : ttl;
			json_array_append_new(parts, part);
		}
	} else if (content && !json_is_null(content)) {
		json_decref(parts);
		return kvt_req_fail(t->e, p, NULL, "'%s' must be a string or an array of text blocks", p);
	}
	snprintf(p, sizeof(p), "%s.cache_control", param);
	if (cc && !json_is_null(cc) && tr_cc(t, cc, p, &inner)) {
		json_decref(parts);
		return KVT_EINVAL;
	}
	ttl = cc && !json_is_null(cc) && inner > ttl ? inner : ttl;
	json_t *m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", parts);
	if (m && ttl > 0)
		msg_cc(m, ttl);
	return tr_push(t, m, msg);
}

/* A user message's content blocks: runs of text blocks as user messages, each tool_result a tool message. */
static int tr_user_blocks(anth_tr *t, json_t *content, long i)
{
	json_t *run = NULL; /* the user message the text blocks go into (borrowed from t->msgs) */
	size_t k;
	json_t *blk;
	json_array_foreach(content, k, blk)
	{
		char param[64];
		const char *type;
		int rc;
		snprintf(param, sizeof(param), "messages[%ld].content[%zu]", i, k);
		if ((rc = block_type(t, blk, param, &type)))
			return rc;
		if (!strcmp(type, "tool_result")) {
			run = NULL;
			if ((rc = tr_tool_result(t, blk, param, i)))
				return rc;
			continue;
		}
		if (strcmp(type, "text"))
			return unsupported_block(t, param, type, "text and tool_result blocks in a user message");
		if (!run) {
			if ((rc = tr_push(t, json_pack("{s:s, s:[]}", "role", "user", "content"), i)))
				return rc;
			run = json_array_get(t->msgs, json_array_size(t->msgs) - 1);
		}
		json_t *part = NULL;
		double ttl;
		if ((rc = text_part(t, blk, param, true, &part, &ttl)) || (rc = tr_part(t, k)))
			return rc;
		if (json_array_append_new(json_object_get(run, "content"), part))
			return KVT_ENOMEM;
	}
	return KVT_OK;
}

/* A tool_use block as a tool call {id, type, function {name, arguments}}; input as JSON text. */
static int tr_tool_use(anth_tr *t, json_t *blk, const char *param, json_t *calls)
{
	char p[96];
	json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name"), *input = json_object_get(blk, "input");
	snprintf(p, sizeof(p), "%s.%s", param, !json_is_string(id) ? "id" : !json_is_string(name) ? "name" : "input");
	if (!json_is_string(id) || !json_is_string(name))
		return kvt_req_fail(t->e, p, NULL, "'%s' must be a string", p);
	if (!json_is_object(input))
		return kvt_req_fail(t->e, p, NULL, "'%s' must be an object", p);
	/* NOTE: ", " and ": " as the model writes JSON, so the next turn likely renders the bytes it generated */
	char *args = json_dumps(input, 0);
	json_t *call = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name", name,
					"arguments", args)
			    : NULL;
	free(args);
	return !call || json_array_append_new(calls, call) ? KVT_ENOMEM : KVT_OK;
}

/*
 * An assistant message's blocks: text (the content) and tool_use (the
 * calls). With calls, the text is one string and any cache_control marks
 * the whole turn; without, the text blocks are parts keeping theirs.
 */
static int tr_assistant_blocks(anth_tr *t, json_t *content, long i)
{
	bool calls_in = false;
	for (size_t k = 0; k < json_array_size(content); k++)
		calls_in = calls_in || str_is(json_object_get(json_array_get(content, k), "type"), "tool_use");
	json_t *parts = json_array(), *calls = json_array();
	json_t *m = json_pack("{s:s, s:o, s:o}", "role", "assistant", "content", parts, "tool_calls", calls);
	int rc = tr_push(t, m, i);
	double turn_ttl = 0;
	size_t k;
	json_t *blk;
	json_array_foreach(content, k, blk)
	{
		char param[64];
		const char *type;
		json_t *part = NULL;
		double ttl = 0;
		snprintf(param, sizeof(param), "messages[%ld].content[%zu]", i, k);
		if (rc || (rc = block_type(t, blk, param, &type)))
			return rc;
		if (!strcmp(type, "tool_use")) {
			json_t *cc = json_object_get(blk, "cache_control");
			char p[96];
			snprintf(p, sizeof(p), "%s.cache_control", param);
			if ((rc = tr_tool_use(t, blk, param, calls)) || (cc && !json_is_null(cc) && (rc = tr_cc(t, cc, p, &ttl))))
				return rc;
		} else if (!strcmp(type, "text")) {
			if ((rc = text_part(t, blk, param, !calls_in, &part, &ttl)) || (rc = tr_part(t, k)))
				return rc;
			json_array_append_new(parts, part);
		} else {
			return unsupported_block(t, param, type, "text and tool_use blocks in an assistant message");
		}
		turn_ttl = calls_in && ttl > turn_ttl ? ttl : turn_ttl;
	}
	if (rc)
		return rc;
	if (!calls_in) {
		json_object_del(m, "tool_calls");
		return KVT_OK;
	}
	kvt_sbuf b = { 0 };
	kvt_sbuf_add(&b, "", 0);
	for (k = 0; k < json_array_size(parts); k++) {
		json_t *x = json_object_get(json_array_get(parts, k), "text");
		kvt_sbuf_add(&b, json_string_value(x), json_string_length(x));
	}
	rc = b.failed ? KVT_ENOMEM : json_object_set_new(m, "content", b.n ? json_stringn(b.p, b.n) : json_null());
	free(b.p);
	if (turn_ttl > 0)
		msg_cc(m, turn_ttl);
	return rc ? KVT_ENOMEM : KVT_OK;
}

static int tr_messages(anth_tr *t, json_t *msgs)
{
	if (!json_is_array(msgs) || !json_array_size(msgs))
		return kvt_req_fail(t->e, "messages", NULL, "'messages' must be a non-empty array of {role, content}");
	size_t n = json_array_size(msgs), i;
	json_t *m;
	json_array_foreach(msgs, i, m)
	{
		char param[48];
		json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
		bool user = str_is(role, "user");
		int rc;
		snprintf(param, sizeof(param), "messages[%zu]", i);
		if (!json_is_object(m))
			return kvt_req_fail(t->e, param, NULL, "'%s' must be an object {role, content}", param);
		snprintf(param, sizeof(param), "messages[%zu].role", i);
		if (!user && !str_is(role, "assistant"))
			return kvt_req_fail(t->e, param, NULL, "'%s' must be \"user\" or \"assistant\"", param);
		if (!user && i + 1 == n)
			return kvt_req_fail(t->e, param, NULL, "'%s': a last assistant message (a prefill to continue) is not "
					    "supported; end with a user message", param);
		snprintf(param, sizeof(param), "messages[%zu].content", i);
		if (json_is_string(content)) {
			rc = tr_push(t, json_pack("{s:O, s:O}", "role", role, "content", content), (long)i);
		} else if (!json_is_array(content) || !json_array_size(content)) {
			rc = kvt_req_fail(t->e, param, NULL, "'%s' must be a string or a non-empty array of content blocks", param);
		} else {
			rc = user ? tr_user_blocks(t, content, (long)i) : tr_assistant_blocks(t, content, (long)i);
		}
		if (rc)
			return rc;
	}
	return KVT_OK;
}

/* kvtier's own fields, passed on as the chat route takes them. */
static const char *const PASS_ON[] = { "max_tokens", "temperature", "top_p", "top_k", "stream", "cache_control",
				       "session_id", "priority", "seed", "ignore_eos", "min_p", "repetition_penalty",
				       "presence_penalty", "frequency_penalty", "logit_bias", "prompt_cache_key", "kvtier" };

/* The fields read elsewhere here (the rest of Anthropic's are refused by name). */
static const char *const MAPPED[] = { "model", "messages", "system", "tools", "tool_choice", "stop_sequences",
				      "metadata", "service_tier", "thinking", "anthropic_version", "output_config" };

static bool in_list(const char *key, size_t key_len, const char *const *list, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (key_len == strlen(list[i]) && !strcmp(key, list[i]))
			return true;
	return false;
}

/* Every top-level field: known (mapped or passed on), or refused by name. */
static int tr_fields(anth_tr *t, json_t *body)
{
	const char *key;
	size_t key_len;
	json_t *v;
	json_object_keylen_foreach(body, key, key_len, v)
	{
		if (in_list(key, key_len, PASS_ON, sizeof(PASS_ON) / sizeof(PASS_ON[0]))) {
			if (json_object_set(t->out, key, v))
				return KVT_ENOMEM;
		} else if (!in_list(key, key_len, MAPPED, sizeof(MAPPED) / sizeof(MAPPED[0])) && !json_is_null(v)) {
			char k[48];
			snprintf(k, sizeof(k), "%.40s", key);
			kvt_utf8_scrub(k);
			return kvt_req_fail(t->e, k, NULL, "'%s' is not supported by kvtier's Messages API (docs/http-api.md)", k);
		}
	}
	return KVT_OK;
}

/* model, max_tokens, temperature, stop_sequences: checked, then mapped. */
static int tr_scalars(anth_tr *t, json_t *body)
{
	json_t *v;
	/* NOTE: Anthropic's newest API dropped temperature, top_p and top_k; older clients send them, so they are kept */
	if (!json_is_string(json_object_get(body, "model")) && !t->for_count)
		return kvt_req_fail(t->e, "model", NULL, "'model' is required (a string; kvtierd serves its one model)");
	v = json_object_get(body, "max_tokens");
	if ((!v || json_is_null(v)) && !t->for_count)
		return kvt_req_fail(t->e, "max_tokens", NULL, "'max_tokens' is required");
	v = json_object_get(body, "temperature");
	if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) >= 0 && json_number_value(v) <= 1))
		return kvt_req_fail(t->e, "temperature", NULL, "'temperature' must be a number in [0, 1]");
	v = json_object_get(body, "stop_sequences");
	if (v && !json_is_null(v)) {
		bool ok = json_is_array(v) && json_array_size(v) <= KVT_REQ_MAX_STOPS;
		for (size_t k = 0; ok && k < json_array_size(v); k++)
			ok = json_is_string(json_array_get(v, k));
		if (!ok)
			return kvt_req_fail(t->e, "stop_sequences", NULL, "'stop_sequences' must be an array of at most %d strings",
					    KVT_REQ_MAX_STOPS);
		json_object_set(t->out, "stop", v);
	}
	return KVT_OK;
}

/* metadata (user_id -> user), thinking (only disabled), service_tier (accepted): checked, then mapped. */
static int tr_meta(anth_tr *t, json_t *body)
{
	json_t *v = json_object_get(body, "metadata");
	if (v && !json_is_null(v)) {
		json_t *u = json_object_get(v, "user_id");
		if (!json_is_object(v) || json_object_size(v) > (u ? 1u : 0u))
			return kvt_req_fail(t->e, "metadata", NULL, "'metadata' must be an object {\"user_id\": string}");
		if (u && !json_is_null(u) && !json_is_string(u))
			return kvt_req_fail(t->e, "metadata.user_id", NULL, "'metadata.user_id' must be a string");
		if (json_is_string(u))
			json_object_set(t->out, "user", u);
	}
	v = json_object_get(body, "thinking");
	if (v && !json_is_null(v) && !str_is(json_object_get(v, "type"), "disabled"))
		return kvt_req_fail(t->e, "thinking", NULL, "'thinking' (extended thinking) is not supported: the model has no "
				    "reasoning mode; leave it out or send {\"type\": \"disabled\"}");
	v = json_object_get(body, "service_tier");
	if (v && !json_is_null(v) && !str_is(v, "auto") && !str_is(v, "standard_only"))
		return kvt_req_fail(t->e, "service_tier", NULL, "'service_tier' must be \"auto\" or \"standard_only\"");
	return KVT_OK;
}

/*
 * output_config: effort (accepted; the model has no reasoning mode, so each
 * means what it does without one) and format {"type": "json_schema",
 * "schema"} -> response_format (structured outputs, structured.h).
 */
static int tr_output(anth_tr *t, json_t *oc)
{
	if (!oc || json_is_null(oc))
		return KVT_OK;
	static const char *const efforts[] = { "low", "medium", "high", "xhigh", "max" };
	json_t *effort = json_object_get(oc, "effort"), *fmt = json_object_get(oc, "format");
	if (!json_is_object(oc))
		return kvt_req_fail(t->e, "output_config", NULL, "'output_config' must be an object {effort, format}");
	bool ok = !effort || json_is_null(effort);
	for (size_t k = 0; !ok && k < sizeof(efforts) / sizeof(efforts[0]); k++)
		ok = str_is(effort, efforts[k]);
	if (!ok)
		return kvt_req_fail(t->e, "output_config.effort", NULL, "'output_config.effort' must be \"low\", \"medium\", "
				    "\"high\", \"xhigh\" or \"max\"");
	if (json_object_size(oc) > (size_t)(effort != NULL) + (fmt != NULL))
		return kvt_req_fail(t->e, "output_config", NULL, "'output_config' takes only 'effort' and 'format'");
	if (!fmt || json_is_null(fmt))
		return KVT_OK;
	json_t *schema = json_object_get(fmt, "schema");
	if (!str_is(json_object_get(fmt, "type"), "json_schema") || !json_is_object(schema))
		return kvt_req_fail(t->e, "output_config.format", NULL, "'output_config.format' must be {\"type\": "
				    "\"json_schema\", \"schema\": object}");
	json_t *rf = json_pack("{s:s, s:{s:s, s:O, s:b}}", "type", "json_schema", "json_schema", "name", "output", "schema",
			       schema, "strict", 1);
	return !rf || json_object_set_new(t->out, "response_format", rf) ? KVT_ENOMEM : KVT_OK;
}

static void tr_free(anth_tr *t)
{
	json_decref(t->out);
	free(t->orig);
	free(t->blocks);
	memset(t, 0, sizeof(*t));
}

/* A Messages body into t->out, a chat body. KVT_OK; KVT_EINVAL with t->e; KVT_ENOMEM. Free t whatever the result. */
static int anth_translate(json_t *body, bool for_count, anth_tr *t, kvt_req_err *e)
{
	memset(t, 0, sizeof(*t));
	t->e = e;
	t->for_count = for_count;
	if (!(t->out = json_object()))
		return KVT_ENOMEM;
	t->msgs = json_array();
	if (!t->msgs || json_object_set_new(t->out, "messages", t->msgs)) {
		t->msgs = NULL; /* NOTE: json_object_set_new took (and dropped) it */
		return KVT_ENOMEM;
	}
	json_t *tools = json_object_get(body, "tools");
	t->has_tools = json_is_array(tools) && json_array_size(tools) > 0;
	int rc = tr_fields(t, body);
	if (!rc)
		rc = tr_scalars(t, body);
	if (!rc)
		rc = tr_meta(t, body);
	if (!rc)
		rc = tr_output(t, json_object_get(body, "output_config"));
	if (!rc)
		rc = tr_tools(t, tools);
	if (!rc)
		rc = tr_tool_choice(t, json_object_get(body, "tool_choice"));
	if (!rc)
		rc = tr_system(t, json_object_get(body, "system"));
	if (!rc)
		rc = tr_messages(t, json_object_get(body, "messages"));
	return rc;
}

/* ------------------------------------------------------------------------ */
/* refusals of the shared chat steps, in the Messages body's names            */

/* Replace every `from` in s (cap bytes) with `to`. */
static void replace_all(char *s, size_t cap, const char *from, const char *to)
{
	size_t nf = strlen(from), nt = strlen(to);
	char *p = s;
	while (nf && (p = strstr(p, from))) {
		size_t rest = strlen(p + nf);
		if ((size_t)(p - s) + nt + rest + 1 > cap)
			return;
		memmove(p + nt, p + nf, rest + 1);
		memcpy(p, to, nt);
		p += nt;
	}
}

/* A name of the chat body in e (param and message) renamed; the longest names first. */
static void rename_field(kvt_req_err *e, const char *from, const char *to)
{
	replace_all(e->param, sizeof(e->param), from, to);
	replace_all(e->message, sizeof(e->message), from, to);
}

/*
 * Which chat message a refusal names (its param "messages[N]..."), with its
 * content part, renamed to the Messages field it came from.
 */
static void rename_messages(const anth_tr *t, kvt_req_err *e)
{
	size_t n, k;
	int used = 0;
	if (sscanf(e->param, "messages[%zu]%n", &n, &used) != 1 || n >= t->n_orig)
		return;
	const anth_origin *o = &t->orig[n];
	char from[64], to[64];
	if (sscanf(e->param + used, ".content[%zu]", &k) == 1 && o->part0 + k < t->n_blocks) {
		snprintf(from, sizeof(from), "messages[%zu].content[%zu]", n, k);
		if (o->msg < 0)
			snprintf(to, sizeof(to), "system[%zu]", t->blocks[o->part0 + k]);
		else
			snprintf(to, sizeof(to), "messages[%ld].content[%zu]", o->msg, t->blocks[o->part0 + k]);
		rename_field(e, from, to);
	}
	snprintf(from, sizeof(from), "messages[%zu]", n);
	if (o->msg < 0)
		snprintf(to, sizeof(to), "system");
	else
		snprintf(to, sizeof(to), "messages[%ld]", o->msg);
	rename_field(e, from, to);
}

static void anth_rename(const anth_tr *t, kvt_req_err *e)
{
	rename_messages(t, e);
	rename_field(e, ".function.parameters", ".input_schema");
	rename_field(e, ".function.name", ".name");
	rename_field(e, "parallel_tool_calls", "tool_choice.disable_parallel_tool_use");
	if (!strcmp(e->param, "stop")) {
		rename_field(e, "'stop'", "'stop_sequences'");
		snprintf(e->param, sizeof(e->param), "stop_sequences");
	}
	if (!strcmp(e->param, "user")) {
		rename_field(e, "'user'", "'metadata.user_id'");
		snprintf(e->param, sizeof(e->param), "metadata.user_id");
	}
}

/* ------------------------------------------------------------------------ */
/* the handlers                                                               */

/*
 * The system-turn breakpoint (tools, or system blocks with tools): the
 * prefix through the first system turn (system text and tools), added to
 * the request's breakpoints in prompt order.
 */
static int add_turn_breakpoint(const anth_tr *t, const kvt_tok *tok, kvt_gen_request *q, kvt_req_err *e)
{
	if (t->turn_ttl <= 0)
		return KVT_OK;
	char *tools_text = kvt_oai_tools_prompt(&q->tools);
	size_t n_msgs = t->n_orig && t->orig[0].msg < 0 ? 1 : 0;
	uint32_t at = 0;
	int rc = tools_text || n_msgs ? kvt_cachectl_chat_cut(tok, t->msgs, tools_text, n_msgs, -1, q->ids, q->n_ids, &at, e)
				      : KVT_OK;
	free(tools_text);
	if (rc || !at)
		return rc;
	kvt_cachectl *cc = &q->cc;
	if (cc->n_retain == KVT_SCHED_MAX_RETAIN)
		return kvt_req_fail(e, t->turn_param, NULL, "at most %d cache_control breakpoints per request",
				    KVT_SCHED_MAX_RETAIN);
	uint32_t i = cc->n_retain++;
	for (; i > 0 && cc->retain[i - 1].tokens > at; i--)
		cc->retain[i] = cc->retain[i - 1];
	cc->retain[i] = (kvt_sched_retain){ .tokens = at, .ttl_s = t->turn_ttl, .tier = -1 };
	memcpy(q->sched.retain, cc->retain, sizeof(q->sched.retain));
	q->sched.n_retain = cc->n_retain;
	return KVT_OK;
}

int kvt_anth_request(const kvt_req_limits *lim, const kvt_tok *tok, json_t *body, bool for_count,
		     kvt_gen_request *q, kvt_req_err *e)
{
	anth_tr t;
	int rc = anth_translate(body, for_count, &t, e);
	if (rc == KVT_OK) {
		rc = kvt_gen_request_parse(lim, true, t.out, q, e);
		if (rc == KVT_OK)
			rc = kvt_gen_request_prompt(lim, tok, t.out, q, e);
		if (rc == KVT_EINVAL)
			anth_rename(&t, e);
	}
	if (rc == KVT_OK)
		rc = add_turn_breakpoint(&t, tok, q, e);
	tr_free(&t);
	return rc;
}

/* Load and parse a Messages body into a new job (*out, initialised). KVT_OK; else rc with e. */
static int anth_prepare(conn_req *r, kvt_sched *sched, const kvt_tok *tok, bool for_count, gen_job **out,
			kvt_req_err *e)
{
	const kvt_req_limits lim = kvt_srv_req_limits(r->srv, sched);
	gen_job *j = calloc(1, sizeof(*j));
	json_t *body = NULL;
	int rc = j ? kvt_req_body_load(r->body.p, r->body.n, &body, e) : KVT_ENOMEM;
	if (rc == KVT_OK) {
		rc = kvt_anth_request(&lim, tok, body, for_count, &j->q, e);
		if (j->q.sched.tenant[0]) /* metadata.user_id named it (no API keys): the log names it too */
			snprintf(r->tenant, sizeof(r->tenant), "%s", j->q.sched.tenant);
	}
	json_decref(body);
	if (rc != KVT_OK) {
		kvt_srv_job_free(j);
		return rc;
	}
	kvt_srv_job_init(r, tok, "msg_", KVT_SRV_API_ANTHROPIC, j);
	*out = j;
	return KVT_OK;
}

static enum MHD_Result prepare_error(conn_req *r, int rc, const kvt_req_err *e)
{
	if (kvt_req_http_status(rc) == 400)
		return kvt_srv_reply_req_error(r, 400, e);
	return kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
}

static void anth_sse_begin(gen_job *j);

enum MHD_Result kvt_srv_handle_messages(conn_req *r, kvt_sched *sched, const kvt_tok *tok)
{
	kvt_req_err e = { { 0 }, { 0 }, { 0 } };
	gen_job *j = NULL;
	int rc = anth_prepare(r, sched, tok, false, &j, &e);
	if (rc != KVT_OK)
		return prepare_error(r, rc, &e);
	if (j->q.stream)
		anth_sse_begin(j); /* message_start goes out with the headers, before the first token */
	return kvt_srv_gen_start(r, sched, j);
}

enum MHD_Result kvt_srv_handle_count_tokens(conn_req *r, kvt_sched *sched, const kvt_tok *tok)
{
	kvt_req_err e = { { 0 }, { 0 }, { 0 } };
	gen_job *j = NULL;
	int rc = anth_prepare(r, sched, tok, true, &j, &e);
	if (rc != KVT_OK)
		return prepare_error(r, rc, &e);
	json_t *v = json_pack("{s:i}", "input_tokens", (json_int_t)j->q.n_ids);
	kvt_srv_job_free(j);
	return kvt_srv_reply_json(r, 200, v, false);
}

/* ------------------------------------------------------------------------ */
/* errors                                                                     */

bool kvt_srv_anth_route(const conn_req *r)
{
	return !strncmp(r->path, "/v1/messages", 12) && (r->path[12] == 0 || r->path[12] == '/');
}

/* Anthropic's error type for an HTTP status (503 -> 529 overloaded_error). */
static const char *anth_error_type(unsigned *status)
{
	switch (*status) {
	case 401:
		return "authentication_error";
	case 403:
		return "permission_error";
	case 404:
		return "not_found_error";
	case 413:
		return "request_too_large";
	case 429:
		return "rate_limit_error";
	case 503:
	case 529:
		*status = 529;
		return "overloaded_error";
	default:
		return *status >= 500 ? "api_error" : "invalid_request_error";
	}
}

json_t *kvt_srv_anth_error(const conn_req *r, json_t *v, unsigned *status)
{
	json_t *err = json_object_get(v, "error");
	const char *msg = ANTH_STR(json_object_get(err, "message")), *param = ANTH_STR(json_object_get(err, "param"));
	const char *type = anth_error_type(status);
	kvt_sbuf b = { 0 };
	/* Anthropic's error has no param: the field goes first in the message unless the message names it */
	if (param && *param && msg && !strstr(msg, param))
		kvt_sbuf_printf(&b, "%s: ", param);
	kvt_sbuf_puts(&b, msg ? msg : "error");
	json_t *out = b.failed ? NULL : json_pack("{s:s, s:{s:s, s:s}, s:s}", "type", "error", "error", "type", type,
						  "message", b.p, "request_id", r->rid);
	free(b.p);
	json_decref(v);
	return out;
}

/* ------------------------------------------------------------------------ */
/* the reply                                                                  */

/*
 * Anthropic's usage. Tokens served from the cache are read; of the rest,
 * those newly retained are written (the scheduler's cache_creation_tokens,
 * at most what is left), split into 1h and 5m by the 1h breakpoints' reach;
 * the rest are input. final false (message_start): the whole prompt is input.
 */
static json_t *anth_usage(const gen_job *j, bool final)
{
	uint32_t prompt = j->q.n_ids, read = 0, made = 0, reach_1h = 0, out = 0;
	if (final) {
		const kvt_sched_usage *u = &j->ch[0].usage;
		read = u->cached_tokens < prompt ? u->cached_tokens : prompt;
		made = u->cache_creation_tokens < prompt - read ? u->cache_creation_tokens : prompt - read;
		out = kvt_srv_choice_completion_tokens(&j->ch[0]);
	}
	for (uint32_t k = 0; k < j->q.cc.n_retain; k++)
		if (j->q.cc.retain[k].ttl_s >= 3600 && j->q.cc.retain[k].tokens > reach_1h)
			reach_1h = j->q.cc.retain[k].tokens;
	uint32_t end_1h = reach_1h < read + made ? reach_1h : read + made;
	uint32_t made_1h = end_1h > read ? end_1h - read : 0;
	json_t *v = json_pack("{s:i, s:i, s:i, s:{s:i, s:i}, s:i, s:s}", "input_tokens", (json_int_t)(prompt - read - made),
			      "cache_creation_input_tokens", (json_int_t)made, "cache_read_input_tokens", (json_int_t)read,
			      "cache_creation", "ephemeral_5m_input_tokens", (json_int_t)(made - made_1h),
			      "ephemeral_1h_input_tokens", (json_int_t)made_1h, "output_tokens", (json_int_t)out,
			      "service_tier", "standard");
	if (v && final) {
		json_t *oai = kvt_srv_usage_json(j);
		json_t *kv = json_object_get(oai, "kvtier");
		if (kv)
			json_object_set(v, "kvtier", kv);
		json_decref(oai);
	}
	return v;
}

/* Are tool calls looked for in the text? */
static bool tools_on(const gen_job *j)
{
	return j->q.tools.choice != KVT_TOOLS_NONE && j->q.tools.tools;
}

/* The tool calls of the ended choice c (NULL: none); *content_len the text before them. */
static json_t *anth_calls(const gen_job *j, const gen_choice *c, size_t *content_len)
{
	*content_len = c->text.n;
	if (!tools_on(j) || !c->ended)
		return NULL;
	return kvt_oai_tool_calls(&j->q.tools, c->text.p, c->text.n, content_len);
}

/* A tool call as a tool_use block: "toolu_" + the call id's digits, the arguments parsed. */
static json_t *tool_use_block(json_t *call)
{
	const char *id = ANTH_STR(json_object_get(call, "id"));
	json_t *fn = json_object_get(call, "function");
	const char *args = ANTH_STR(json_object_get(fn, "arguments"));
	json_t *input = args ? json_loads(args, JSON_DECODE_ANY, NULL) : NULL;
	if (!json_is_object(input)) {
		json_decref(input);
		input = json_object();
	}
	char tid[48];
	snprintf(tid, sizeof(tid), "toolu_%s", id && !strncmp(id, "call_", 5) ? id + 5 : id ? id : "0");
	return json_pack("{s:s, s:s, s:O, s:o}", "type", "tool_use", "id", tid, "name", json_object_get(fn, "name"), "input",
			 input);
}

/*
 * stop_reason and stop_sequence of an ended choice; tool calls cut short by
 * max_tokens are "max_tokens", as the OpenAI route's are "length".
 */
static void anth_stop(const gen_job *j, const gen_choice *c, bool calls, const char **reason, json_t **seq)
{
	*seq = json_null();
	bool stopped = c->stop_hit || c->finish == KVT_FINISH_STOP;
	if (calls && stopped)
		*reason = "tool_use";
	else if (c->stop_hit && c->stop_idx < j->q.n_stops) {
		*reason = "stop_sequence";
		json_decref(*seq);
		*seq = json_stringn(j->q.stops[c->stop_idx], j->q.stop_len[c->stop_idx]);
	} else
		*reason = c->finish == KVT_FINISH_STOP ? "end_turn" : "max_tokens";
}

/* The message object; content (taken) NULL: empty. */
static json_t *anth_message(const gen_job *j, json_t *content, const char *reason, json_t *seq, json_t *usage)
{
	return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s?, s:o, s:o}", "id", j->id, "type", "message", "role", "assistant",
			 "model", j->srv->model_id, "content", content ? content : json_array(), "stop_reason", reason,
			 "stop_sequence", seq ? seq : json_null(), "usage", usage);
}

json_t *kvt_srv_anth_result(gen_job *j)
{
	const gen_choice *c = &j->ch[0];
	size_t content_len;
	json_t *calls = anth_calls(j, c, &content_len), *content = json_array(), *seq, *call;
	const char *reason;
	if (content_len || !calls)
		json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text", c->text.p ? c->text.p : "",
							 content_len));
	size_t k;
	json_array_foreach(calls, k, call)
		json_array_append_new(content, tool_use_block(call));
	anth_stop(j, c, calls != NULL, &reason, &seq);
	json_decref(calls);
	return anth_message(j, content, reason, seq, anth_usage(j, true));
}

/* ---- SSE ---- */

/* One event: "event: NAME\ndata: JSON\n\n" (v taken). */
static void anth_event(gen_job *j, const char *name, json_t *v)
{
	char *s = v ? json_dumps(v, SRV_JSON_FLAGS) : NULL;
	json_decref(v);
	if (!s) {
		j->out.failed = true;
		return;
	}
	kvt_sbuf_printf(&j->out, "event: %s\ndata: %s\n\n", name, s);
	free(s);
}

static void anth_sse_begin(gen_job *j)
{
	if (j->anth.started)
		return;
	j->anth.started = true;
	anth_event(j, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message",
						 anth_message(j, NULL, NULL, NULL, anth_usage(j, false))));
}

/* content_block_start of a new block (block taken); the ping follows the first one. */
static void block_start(gen_job *j, json_t *block)
{
	anth_event(j, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
						       (json_int_t)j->anth.n_blocks++, "content_block", block));
	if (!j->anth.pinged) {
		j->anth.pinged = true;
		anth_event(j, "ping", json_pack("{s:s}", "type", "ping"));
	}
}

static void block_delta(gen_job *j, json_t *delta)
{
	anth_event(j, "content_block_delta", json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index",
						       (json_int_t)j->anth.n_blocks - 1, "delta", delta));
}

static void block_stop(gen_job *j)
{
	anth_event(j, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index",
						      (json_int_t)j->anth.n_blocks - 1));
}

/* Text c may send now past what it sent: a text_delta (the text block opened first). */
static void sse_text(gen_job *j, gen_choice *c, size_t content_len)
{
	size_t ready = c->text.n;
	if (!c->stop_hit && !c->ended)
		ready -= kvt_srv_stop_holdback(j, c->text.p, c->text.n);
	if (tools_on(j)) /* a tool call is sent as its own block once whole */
		ready = c->ended ? content_len : kvt_oai_content_ready(c->text.p, ready);
	if (ready <= c->n_sent)
		return;
	if (!j->anth.text_open) {
		block_start(j, json_pack("{s:s, s:s}", "type", "text", "text", ""));
		j->anth.text_open = true;
	}
	block_delta(j, json_pack("{s:s, s:s%}", "type", "text_delta", "text", c->text.p + c->n_sent, ready - c->n_sent));
	c->n_sent = ready;
}

/* The ended choice's closing events: the text block closed, a block per tool call, message_delta, message_stop. */
static void sse_finish(gen_job *j, gen_choice *c, json_t *calls)
{
	if (!j->anth.n_blocks && !calls) { /* no text at all: one empty text block, as the body has */
		block_start(j, json_pack("{s:s, s:s}", "type", "text", "text", ""));
		j->anth.text_open = true;
	}
	if (j->anth.text_open)
		block_stop(j);
	j->anth.text_open = false;
	size_t k;
	json_t *call;
	json_array_foreach(calls, k, call)
	{
		json_t *b = tool_use_block(call);
		const char *args = ANTH_STR(json_object_get(json_object_get(call, "function"), "arguments"));
		json_object_set_new(b, "input", json_object()); /* the input comes as input_json_delta */
		block_start(j, b);
		block_delta(j, json_pack("{s:s, s:s}", "type", "input_json_delta", "partial_json", args ? args : "{}"));
		block_stop(j);
	}
	const char *reason;
	json_t *seq;
	anth_stop(j, c, calls != NULL, &reason, &seq);
	anth_event(j, "message_delta", json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta",
						 "stop_reason", reason, "stop_sequence", seq, "usage", anth_usage(j, true)));
	anth_event(j, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

void kvt_srv_anth_sse_fail(gen_job *j, const char *msg)
{
	unsigned status = 500;
	anth_event(j, "error", json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
					 anth_error_type(&status), "message", msg));
	j->done = true;
}

void kvt_srv_anth_sse_emit(gen_job *j)
{
	gen_choice *c = &j->ch[0];
	if (j->done)
		return;
	anth_sse_begin(j);
	if (kvt_srv_choice_failed(c)) {
		unsigned status;
		const char *type, *code, *msg;
		kvt_srv_choice_failure(c, &status, &type, &code, &msg);
		anth_event(j, "error", json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
						 anth_error_type(&status), "message", msg));
		j->done = true;
		return;
	}
	size_t content_len;
	json_t *calls = anth_calls(j, c, &content_len);
	sse_text(j, c, content_len);
	if (c->ended) {
		sse_finish(j, c, calls);
		j->done = true;
	}
	json_decref(calls);
}
