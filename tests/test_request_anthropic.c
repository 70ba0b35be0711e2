/* ctest-labels: unit */
/*
 * tests/test_request_anthropic.c — Anthropic's Messages body mapped onto the
 * chat request (kvt_anth_request, engine/serve/anthropic.c) without a model:
 * the tokenizer of a synthetic GGUF (engine/model/synth_model.c), written into
 * a temporary directory and removed.
 *
 *  - the same conversation sent as a Messages body and as the chat body it
 *    stands for makes the same prompt tokens (plain, system blocks, tool_use
 *    and tool_result turns, tools), so both APIs share cached blocks;
 *  - the fields land where the chat route puts them: max_tokens, sampling,
 *    stop_sequences, metadata.user_id (the tenant), tool_choice (any / tool /
 *    none, disable_parallel_tool_use), kvtier's own fields;
 *  - cache_control: a text block's breakpoint is the chat content part's; a
 *    tool_result's covers its turn; a tool's covers the system turn with the
 *    tools' text; TTLs; a fifth is refused;
 *  - refusals name the Messages field, also those the shared chat steps find
 *    (messages and blocks renumbered back, tools' input_schema, stop_sequences,
 *    metadata.user_id);
 *  - count_tokens' body needs no max_tokens or model, and counts the same.
 */
#include "check.h"
#include "gguf.h"
#include "server_int.h"
#include "synth_model.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static kvt_tok *TOK;
static kvt_req_limits LIM;

/* Bodies are written with ' for " (readable tables). */
static char *fix(const char *s)
{
	char *d = strdup(s);
	for (char *p = d; *p; p++)
		if (*p == '\'')
			*p = '"';
	return d;
}

/* A Messages body through kvt_anth_request. */
static int run_anth(const char *raw, bool for_count, kvt_gen_request *q, kvt_req_err *e)
{
	char *b = fix(raw);
	json_t *body = NULL;
	memset(q, 0, sizeof(*q));
	memset(e, 0, sizeof(*e));
	int rc = kvt_req_body_load(b, strlen(b), &body, e);
	if (rc == KVT_OK)
		rc = kvt_anth_request(&LIM, TOK, body, for_count, q, e);
	json_decref(body);
	free(b);
	return rc;
}

/* A chat body through request.h's two steps, as the chat route runs them. */
static int run_chat(const char *raw, kvt_gen_request *q, kvt_req_err *e)
{
	char *b = fix(raw);
	json_t *body = NULL;
	memset(q, 0, sizeof(*q));
	memset(e, 0, sizeof(*e));
	int rc = kvt_req_body_load(b, strlen(b), &body, e);
	if (rc == KVT_OK)
		rc = kvt_gen_request_parse(&LIM, true, body, q, e);
	if (rc == KVT_OK)
		rc = kvt_gen_request_prompt(&LIM, TOK, body, q, e);
	json_decref(body);
	free(b);
	return rc;
}

static bool accept_at(int line, const char *raw, bool for_count, kvt_gen_request *q)
{
	kvt_req_err e;
	int rc = run_anth(raw, for_count, q, &e);
	CHECKF(rc == KVT_OK, "line %d: rc %d (param '%s': %s)", line, rc, e.param, e.message);
	return rc == KVT_OK;
}
#define ACCEPT(raw, q) accept_at(__LINE__, raw, false, q)

static void refuse_at(int line, const char *raw, const char *param, const char *substr)
{
	kvt_gen_request q;
	kvt_req_err e;
	int rc = run_anth(raw, false, &q, &e);
	CHECKF(rc == KVT_EINVAL, "line %d: rc %d", line, rc);
	CHECKF(!strcmp(e.param, param), "line %d: param '%s', want '%s' (%s)", line, e.param, param, e.message);
	CHECKF(strstr(e.message, substr) != NULL, "line %d: message '%s' lacks '%s'", line, e.message, substr);
	kvt_gen_request_deinit(&q);
}
#define REFUSE(raw, param, substr) refuse_at(__LINE__, raw, param, substr)

/* The Messages body and the chat body make the same prompt tokens. */
static void same_prompt_at(int line, const char *anth, const char *chat)
{
	kvt_gen_request a, c;
	kvt_req_err e;
	int rc = run_anth(anth, false, &a, &e);
	CHECKF(rc == KVT_OK, "line %d: messages body: rc %d (%s: %s)", line, rc, e.param, e.message);
	int rc2 = run_chat(chat, &c, &e);
	CHECKF(rc2 == KVT_OK, "line %d: chat body: rc %d (%s: %s)", line, rc2, e.param, e.message);
	if (rc == KVT_OK && rc2 == KVT_OK)
		CHECKF(a.n_ids == c.n_ids && !memcmp(a.ids, c.ids, a.n_ids * sizeof(*a.ids)),
		       "line %d: prompts differ (%u vs %u tokens)", line, a.n_ids, c.n_ids);
	kvt_gen_request_deinit(&a);
	kvt_gen_request_deinit(&c);
}
#define SAME_PROMPT(anth, chat) same_prompt_at(__LINE__, anth, chat)

#define TOOL_A "{'name': 'get_weather', 'description': 'Weather.', 'input_schema': {'type': 'object', " \
	       "'properties': {'city': {'type': 'string'}}}}"
#define TOOL_O "{'type': 'function', 'function': {'name': 'get_weather', 'description': 'Weather.', 'parameters': " \
	       "{'type': 'object', 'properties': {'city': {'type': 'string'}}}}}"

static void test_same_prompt(void)
{
	SAME_PROMPT("{'model': 'm', 'max_tokens': 8, 'messages': [{'role': 'user', 'content': 'hi'}]}",
		    "{'messages': [{'role': 'user', 'content': 'hi'}]}");
	SAME_PROMPT("{'model': 'm', 'max_tokens': 8, 'system': [{'type': 'text', 'text': 'Be '}, {'type': 'text', "
		    "'text': 'brief.'}], 'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi'}]}, "
		    "{'role': 'assistant', 'content': 'hello'}, {'role': 'user', 'content': 'bye'}]}",
		    "{'messages': [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}, "
		    "{'role': 'assistant', 'content': 'hello'}, {'role': 'user', 'content': 'bye'}]}");
	/* a tool conversation: tool_use -> tool_calls (input as JSON text), tool_result -> a tool message */
	SAME_PROMPT("{'model': 'm', 'max_tokens': 8, 'system': 'S', 'tools': [" TOOL_A "], 'messages': ["
		    "{'role': 'user', 'content': 'weather?'}, {'role': 'assistant', 'content': [{'type': 'text', "
		    "'text': 'Let me look.'}, {'type': 'tool_use', 'id': 'toolu_1', 'name': 'get_weather', 'input': "
		    "{'city': 'Paris'}}]}, {'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': "
		    "'toolu_1', 'content': 'sunny'}, {'type': 'text', 'text': 'and?'}]}]}",
		    "{'tools': [" TOOL_O "], 'messages': [{'role': 'system', 'content': 'S'}, {'role': 'user', "
		    "'content': 'weather?'}, {'role': 'assistant', 'content': 'Let me look.', 'tool_calls': [{'id': "
		    "'toolu_1', 'type': 'function', 'function': {'name': 'get_weather', 'arguments': "
		    "'{\\'city\\': \\'Paris\\'}'}}]}, {'role': 'tool', 'tool_call_id': 'toolu_1', 'content': 'sunny'}, "
		    "{'role': 'user', 'content': 'and?'}]}");
	/* is_error puts "Error: " before the result's text (a string or text blocks) */
	SAME_PROMPT("{'model': 'm', 'max_tokens': 8, 'tools': [" TOOL_A "], 'messages': [{'role': 'user', 'content': "
		    "'w?'}, {'role': 'assistant', 'content': [{'type': 'tool_use', 'id': 'a', 'name': 'get_weather', "
		    "'input': {}}]}, {'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': 'a', "
		    "'is_error': true, 'content': [{'type': 'text', 'text': 'no city'}]}]}]}",
		    "{'tools': [" TOOL_O "], 'messages': [{'role': 'user', 'content': 'w?'}, {'role': 'assistant', "
		    "'content': null, 'tool_calls': [{'id': 'a', 'type': 'function', 'function': {'name': "
		    "'get_weather', 'arguments': '{}'}}]}, {'role': 'tool', 'tool_call_id': 'a', 'content': "
		    "'Error: no city'}]}");
}

#define ONE_USER "'messages': [{'role': 'user', 'content': 'hi'}]"

static void test_fields(void)
{
	kvt_gen_request q;
	if (ACCEPT("{'model': 'm', 'max_tokens': 9, 'temperature': 0.5, 'top_p': 0.9, 'top_k': 7, 'stop_sequences': "
		   "['x', 'yz'], 'metadata': {'user_id': 'alice'}, 'session_id': 'conv-1', 'priority': 2, 'seed': 5, "
		   "'stream': true, 'anthropic_version': 'vertex-2023-10-16', " ONE_USER "}", &q)) {
		CHECK_EQ_INT(q.sched.max_tokens, 9);
		CHECK(q.sched.sample.temp == 0.5f && q.sched.sample.top_p == 0.9f && q.sched.sample.top_k == 7);
		CHECK(q.n_stops == 2 && !strcmp(q.stops[1], "yz"));
		CHECK(!strcmp(q.sched.tenant, "alice") && !strcmp(q.sched.session_id, "conv-1"));
		CHECK(q.sched.priority == 2 && q.have_seed && q.sched.sample.seed == 5 && q.stream && q.n == 1);
	}
	kvt_gen_request_deinit(&q);
	static const struct {
		const char *tc;  /* tool_choice */
		int choice;      /* enum kvt_tool_choice */
		bool parallel;   /* parallel_tool_calls */
	} tcs[] = { { "{'type': 'auto'}", KVT_TOOLS_AUTO, true },
		    { "{'type': 'any'}", KVT_TOOLS_REQUIRED, true },
		    { "{'type': 'any', 'disable_parallel_tool_use': true}", KVT_TOOLS_REQUIRED, false },
		    { "{'type': 'tool', 'name': 'get_weather'}", KVT_TOOLS_NAMED, true },
		    { "{'type': 'none'}", KVT_TOOLS_NONE, true } };
	for (size_t i = 0; i < sizeof(tcs) / sizeof(tcs[0]); i++) {
		char b[1024];
		snprintf(b, sizeof(b), "{'model': 'm', 'max_tokens': 9, 'tools': [" TOOL_A "], 'tool_choice': %s, " ONE_USER "}",
			 tcs[i].tc);
		if (accept_at(__LINE__, b, false, &q)) {
			CHECKF(q.tools.choice == tcs[i].choice && q.tools.parallel == tcs[i].parallel, "tool_choice %s", tcs[i].tc);
			CHECK((q.sched.grammar != NULL) == (tcs[i].choice >= KVT_TOOLS_REQUIRED));
		}
		kvt_gen_request_deinit(&q);
	}
	/* output_config.format: a grammar, as response_format's json_schema */
	if (ACCEPT("{'model': 'm', 'max_tokens': 9, 'output_config': {'effort': 'low', 'format': {'type': 'json_schema', "
		   "'schema': {'type': 'object', 'properties': {'a': {'type': 'integer'}}}}}, " ONE_USER "}", &q))
		CHECK(q.sched.grammar != NULL);
	kvt_gen_request_deinit(&q);
	/* count_tokens: no model, no max_tokens; the same prompt */
	kvt_gen_request c;
	kvt_req_err e;
	CHECK(run_anth("{" ONE_USER "}", true, &c, &e) == KVT_OK);
	if (ACCEPT("{'model': 'm', 'max_tokens': 9, " ONE_USER "}", &q))
		CHECK(c.n_ids == q.n_ids && c.n_ids > 0);
	kvt_gen_request_deinit(&q);
	kvt_gen_request_deinit(&c);
}

/* The breakpoints of a Messages body and a chat body are the same (tokens, TTL). */
static void same_breakpoints_at(int line, const char *anth, const char *chat, uint32_t n_retain)
{
	kvt_gen_request a, c;
	kvt_req_err e;
	int rc = run_anth(anth, false, &a, &e), rc2 = run_chat(chat, &c, &e);
	CHECKF(rc == KVT_OK && rc2 == KVT_OK, "line %d: rc %d, %d (%s: %s)", line, rc, rc2, e.param, e.message);
	CHECKF(a.sched.n_retain == n_retain && c.sched.n_retain == n_retain, "line %d: %u and %u breakpoints, want %u",
	       line, a.sched.n_retain, c.sched.n_retain, n_retain);
	for (uint32_t k = 0; rc == KVT_OK && rc2 == KVT_OK && k < n_retain && k < a.sched.n_retain; k++)
		CHECKF(a.sched.retain[k].tokens == c.sched.retain[k].tokens && a.sched.retain[k].ttl_s == c.sched.retain[k].ttl_s
		       && a.sched.retain[k].tokens > 0 && a.sched.retain[k].tokens < a.n_ids,
		       "line %d: breakpoint %u: %u tokens %.0f s vs %u tokens %.0f s (prompt %u)", line, k,
		       a.sched.retain[k].tokens, a.sched.retain[k].ttl_s, c.sched.retain[k].tokens, c.sched.retain[k].ttl_s,
		       a.n_ids);
	kvt_gen_request_deinit(&a);
	kvt_gen_request_deinit(&c);
}
#define SAME_BREAKPOINTS(anth, chat, n) same_breakpoints_at(__LINE__, anth, chat, n)

#define CC5 "'cache_control': {'type': 'ephemeral'}"
#define CC1H "'cache_control': {'type': 'ephemeral', 'ttl': '1h'}"

static void test_cache_control(void)
{
	/* a text block's breakpoint is its content part's */
	SAME_BREAKPOINTS("{'model': 'm', 'max_tokens': 8, 'system': [{'type': 'text', 'text': 'Long system text.', " CC5
			 "}], 'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'first', " CC1H "}, "
			 "{'type': 'text', 'text': 'second'}]}]}",
			 "{'messages': [{'role': 'system', 'content': [{'type': 'text', 'text': 'Long system text.', " CC5
			 "}]}, {'role': 'user', 'content': [{'type': 'text', 'text': 'first', " CC1H "}, {'type': 'text', "
			 "'text': 'second'}]}]}",
			 2);
	/* a tool_result's covers its turn: the tool message, rendered as the prompt renders it */
	SAME_BREAKPOINTS("{'model': 'm', 'max_tokens': 8, 'messages': [{'role': 'user', 'content': 'w?'}, {'role': "
			 "'assistant', 'content': [{'type': 'tool_use', 'id': 'a', 'name': 'f', 'input': {}, " CC5 "}]}, "
			 "{'role': 'user', 'content': [{'type': 'tool_result', 'tool_use_id': 'a', 'content': 'sunny', " CC1H
			 "}, {'type': 'text', 'text': 'and?'}]}]}",
			 "{'messages': [{'role': 'user', 'content': 'w?'}, {'role': 'assistant', 'content': null, "
			 "'tool_calls': [{'id': 'a', 'type': 'function', 'function': {'name': 'f', 'arguments': '{}'}}], " CC5
			 "}, {'role': 'tool', 'tool_call_id': 'a', 'content': 'sunny', " CC1H "}, {'role': 'user', "
			 "'content': 'and?'}]}",
			 2);
	kvt_gen_request q, s;
	kvt_req_err e;
	/* a tool's covers the system turn and the tools' text: past the system text alone, before the user's */
	if (ACCEPT("{'model': 'm', 'max_tokens': 8, 'system': 'Sys.', 'tools': [{'name': 'f', 'input_schema': {'type': "
		   "'object'}, " CC1H "}], 'messages': [{'role': 'user', 'content': 'hello there'}]}", &q) &&
	    run_chat("{'messages': [{'role': 'system', 'content': 'Sys.', " CC5 "}, {'role': 'user', 'content': "
		     "'hello there'}]}", &s, &e) == KVT_OK) {
		CHECK(q.sched.n_retain == 1 && q.sched.retain[0].ttl_s == 3600);
		CHECKF(q.sched.retain[0].tokens > s.sched.retain[0].tokens + 20 && q.sched.retain[0].tokens < q.n_ids - 3,
		       "the system turn with tools: %u tokens (system alone %u, prompt %u)", q.sched.retain[0].tokens,
		       s.sched.retain[0].tokens, q.n_ids);
	}
	kvt_gen_request_deinit(&q);
	kvt_gen_request_deinit(&s);
	/* with tools, a system block's and a tool's make one breakpoint, in prompt order before a message's */
	if (ACCEPT("{'model': 'm', 'max_tokens': 8, 'system': [{'type': 'text', 'text': 'Sys.', " CC5 "}], 'tools': [{'name': "
		   "'f', 'input_schema': {'type': 'object'}, " CC5 "}], 'messages': [{'role': 'user', 'content': [{'type': "
		   "'text', 'text': 'hello there', " CC1H "}]}]}", &q)) {
		CHECK_EQ_INT(q.sched.n_retain, 2);
		CHECK(q.sched.retain[0].tokens < q.sched.retain[1].tokens && q.sched.retain[0].ttl_s == 300 &&
		      q.sched.retain[1].ttl_s == 3600);
	}
	kvt_gen_request_deinit(&q);
	REFUSE("{'model': 'm', 'max_tokens': 8, 'system': [{'type': 'text', 'text': 'a', " CC5 "}, {'type': 'text', 'text': "
	       "'b', " CC5 "}, {'type': 'text', 'text': 'c', " CC5 "}, {'type': 'text', 'text': 'd', " CC5 "}], 'messages': "
	       "[{'role': 'user', 'content': [{'type': 'text', 'text': 'e', " CC5 "}]}]}",
	       "messages[0].content[0].cache_control", "at most 4");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'e', "
	       "'cache_control': {'type': 'ephemeral', 'ttl': '2h'}}]}]}",
	       "messages[0].content[0].cache_control", ".ttl' must be \"5m\" or \"1h\"");
}

static void test_refusals(void)
{
	REFUSE("{'max_tokens': 8, " ONE_USER "}", "model", "required");
	REFUSE("{'model': 'm', " ONE_USER "}", "max_tokens", "required");
	REFUSE("{'model': 'm', 'max_tokens': 65, " ONE_USER "}", "max_tokens", "'max_tokens' must be in [1, 64]");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'temperature': 1.5, " ONE_USER "}", "temperature", "[0, 1]");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'top_k': -1, " ONE_USER "}", "top_k", "'top_k'");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'stop_sequences': ['a', 'b', 'c', 'd', 'e'], " ONE_USER "}",
	       "stop_sequences", "at most 4");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'metadata': {'user_id': 'x', 'other': 1}, " ONE_USER "}", "metadata",
	       "user_id");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'n': 2, " ONE_USER "}", "n", "'n' is not supported");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'thinking': {'type': 'enabled', 'budget_tokens': 1024}, " ONE_USER "}",
	       "thinking", "not supported");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'messages': []}", "messages", "non-empty");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'messages': [{'role': 'system', 'content': 'x'}]}", "messages[0].role",
	       "\"user\" or \"assistant\"");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'messages': [{'role': 'user', 'content': 'x'}, {'role': 'assistant', "
	       "'content': 'y'}]}", "messages[1].role", "prefill");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'messages': [{'role': 'user', 'content': [{'type': 'image', 'source': "
	       "{}}]}]}", "messages[0].content[0]", "'image' is not supported");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'messages': [{'role': 'user', 'content': [{'type': 'text'}]}]}",
	       "messages[0].content[0].text", "must be a string");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'tools': [{'name': 'web', 'type': 'web_search_20250305'}], " ONE_USER "}",
	       "tools[0]", "server tools");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'tools': [{'name': 'f'}], " ONE_USER "}", "tools[0]",
	       "'tools[0].input_schema' must be a JSON Schema object");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'tool_choice': {'type': 'tool'}, 'tools': [" TOOL_A "], " ONE_USER "}",
	       "tool_choice.name", "must be a string");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'tool_choice': {'type': 'any'}, " ONE_USER "}", "tool_choice",
	       "'tool_choice' of type \"any\" needs 'tools'");
	/* found by the shared chat steps, named in the Messages body's terms */
	REFUSE("{'model': 'm', 'max_tokens': 8, 'tools': [{'name': 'bad name', 'input_schema': {'type': 'object'}}], "
	       ONE_USER "}", "tools[0]", "'tools[0].name' must be 1-64 characters");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'tools': [{'name': 'f', 'input_schema': {'type': 'object', 'properties': "
	       "{'a': {'type': 'integer', 'minimum': 1}}}}], 'tool_choice': {'type': 'any'}, " ONE_USER "}",
	       "tools[0].input_schema", "minimum");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'tool_choice': {'type': 'tool', 'name': 'nope'}, 'tools': [" TOOL_A "], "
	       ONE_USER "}", "tool_choice", "'nope'");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'system': 'S', 'messages': [{'role': 'user', 'content': 'w?'}, {'role': "
	       "'assistant', 'content': [{'type': 'tool_use', 'id': 'a', 'name': 'f', 'input': {}}]}, {'role': 'user', "
	       "'content': [{'type': 'tool_result', 'tool_use_id': 'a', 'content': 'x'}, {'type': 'text', 'text': 'y'}, "
	       "{'type': 'text', 'text': 'z', 'kvtier': {'reuse': 'bogus'}}]}]}",
	       "messages[2].content[2].kvtier.reuse", "'messages[2].content[2].kvtier.reuse' must be");
	REFUSE("{'model': 'm', 'max_tokens': 8, 'system': [{'type': 'text', 'text': 'a'}, {'type': 'text', 'text': 'b', "
	       "'kvtier': {'reuse': 7}}], " ONE_USER "}", "system[1].kvtier.reuse", "'system[1].kvtier.reuse' must be");
	char big[600];
	memset(big, 'u', 300);
	big[300] = 0;
	char body[900];
	snprintf(body, sizeof(body), "{'model': 'm', 'max_tokens': 8, 'metadata': {'user_id': 'a b %s'}, " ONE_USER "}", big);
	REFUSE(body, "metadata.user_id", "'metadata.user_id' must be at most 256 bytes");
}

int main(void)
{
	char dir[] = "/tmp/kvt_anth_XXXXXX", path[64];
	if (!mkdtemp(dir))
		return check_skip("test_request_anthropic", "no temporary directory");
	snprintf(path, sizeof(path), "%s/synth.gguf", dir);
	kvt_synth_llama sl;
	kvt_synth_llama_default(&sl);
	sl.n_layer = 1;
	kvt_gguf *g = NULL;
	int rc = kvt_synth_llama_write(&sl, path);
	if (rc == KVT_OK)
		rc = kvt_gguf_open(path, &g);
	if (rc == KVT_OK) {
		rc = kvt_tok_create_from_gguf(g, &TOK);
		kvt_gguf_close(g);
	}
	unlink(path);
	rmdir(dir);
	CHECK(rc == KVT_OK);
	if (rc != KVT_OK)
		return check_done("test_request_anthropic");
	LIM = (kvt_req_limits){ .n_vocab = kvt_synth_llama_n_vocab(),
				.max_ctx = 2048,
				.max_tokens_limit = 64,
				.max_n = 4,
				.default_max_tokens = 16,
				.chunk_reuse = KVT_CHUNK_REUSE_MARKED,
				.chunk_min_tokens = 64,
				.tenant_from_user = true };
	test_same_prompt();
	test_fields();
	test_cache_control();
	test_refusals();
	kvt_tok_destroy(TOK);
	return check_done("test_request_anthropic");
}
