/* ctest-labels: unit */
/*
 * tests/test_request.c — request parsing without a model (request.h): the
 * pure JSON -> kvt_gen_request step, and the prompt step on the tokenizer of
 * a synthetic GGUF (engine/model/synth_model.c: byte-level BPE, ChatML, no
 * weights read), written into a temporary directory and removed.
 *
 *  - every refusal of docs/http-api.md's field rules and error table that
 *    request parsing makes — malformed JSON, each field's type and range, the
 *    refused fields, response_format (json_object, json_schema strict, the
 *    schema subset and its limits), tools (auto / required / named / none,
 *    malformed ones), logprobs / top_logprobs, stop, n, the prompt and the
 *    messages, the context, cache control, user, session_id — is checked for
 *    its status (kvt_req_http_status), param, code and a message substring,
 *    by calling the real parser: a refusal that stops being refused fails;
 *  - object keys holding \u0000 load with their own bytes (order and
 *    duplicates as any key), and count where kvtier reads a key (logit_bias,
 *    cache_control, schema keywords and property names);
 *  - the context: a prompt with no room for one token is
 *    context_length_exceeded on its field, a max_tokens that does not fit is
 *    refused on max_tokens, a default one is cut to fit;
 *  - the order of the checks (which fault of two is reported);
 *  - accepted requests carry what was asked into the scheduler's request
 *    (sampling, seed, n, stop, logprobs, priority, session, tenant, grammar,
 *    tools, cache-control breakpoints, echo), null counts as absent, and the
 *    two content shapes (string, text parts) give the same prompt;
 *  - chunk reuse: the spans of marked messages and content parts (and of
 *    tool messages under chunk_reuse = tools) are the marked text's own
 *    tokens in the prompt, in prompt order; chunk_min_tokens, off, the
 *    16-span limit, bad marks and the top-level kvtier.chunk_recompute;
 *  - the tenant mapping of `user`, a resume's body.
 *
 * The HTTP side of the same refusals (status lines, the error object's type,
 * 401/404/405/413/503) is tests/test_server.c's.
 */
#include "check.h"
#include "gguf.h"
#include "grammar.h"
#include "request.h"
#include "synth_model.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static kvt_tok *TOK;
static kvt_req_limits LIM;

/* Bodies are written with ' for " (readable tables); no body here needs a literal '. */
static char *fix(const char *s)
{
	char *d = strdup(s);
	for (char *p = d; *p; p++)
		if (*p == '\'')
			*p = '"';
	return d;
}

/* Both steps, as the server runs them. rc of the first step that failed. */
static int run(bool chat, const char *body_text, kvt_gen_request *q, kvt_req_err *e)
{
	memset(e, 0, sizeof(*e));
	memset(q, 0, sizeof(*q));
	json_t *body = NULL;
	int rc = kvt_req_body_load(body_text, strlen(body_text), &body, e);
	if (rc == KVT_OK)
		rc = kvt_gen_request_parse(&LIM, chat, body, q, e);
	if (rc == KVT_OK)
		rc = kvt_gen_request_prompt(&LIM, TOK, body, q, e);
	json_decref(body);
	return rc;
}

/* A body that must be refused with 400, param (NULL: none), code (NULL: none) and a message holding substr. */
static void refuse_at(int line, bool chat, const char *raw, const char *param, const char *code, const char *substr)
{
	char *b = fix(raw);
	kvt_gen_request q;
	kvt_req_err e;
	int rc = run(chat, b, &q, &e);
	CHECKF(rc == KVT_EINVAL && kvt_req_http_status(rc) == 400, "line %d: rc %d for %s", line, rc, b);
	CHECKF(!strcmp(e.param, param ? param : ""), "line %d: param '%s', want '%s' (%s)", line, e.param,
	       param ? param : "", e.message);
	CHECKF(!strcmp(e.code, code ? code : ""), "line %d: code '%s', want '%s'", line, e.code, code ? code : "");
	CHECKF(strstr(e.message, substr) != NULL, "line %d: message '%s' lacks '%s'", line, e.message, substr);
	kvt_gen_request_deinit(&q);
	free(b);
}
#define REFUSE(chat, body, param, code, substr) refuse_at(__LINE__, chat, body, param, code, substr)
#define CMPL false
#define CHAT true

/* A body that must be accepted; q is the caller's to deinit. */
static bool accept_at(int line, bool chat, const char *raw, kvt_gen_request *q)
{
	char *b = fix(raw);
	kvt_req_err e;
	int rc = run(chat, b, q, &e);
	CHECKF(rc == KVT_OK, "line %d: rc %d (param '%s': %s) for %s", line, rc, e.param, e.message, b);
	free(b);
	return rc == KVT_OK;
}
#define ACCEPT(chat, body, q) accept_at(__LINE__, chat, body, q)

/* A generated body: prefix, n copies of item (each with %d = its index, comma-separated), suffix. */
static char *gen_body(const char *prefix, const char *item, int n, const char *suffix)
{
	size_t cap = strlen(prefix) + strlen(suffix) + (size_t)n * (strlen(item) + 16) + 1;
	char *s = malloc(cap), *p = s;
	p += sprintf(p, "%s", prefix);
	for (int i = 0; i < n; i++) {
		if (i)
			*p++ = ',';
		p += sprintf(p, item, i);
	}
	sprintf(p, "%s", suffix);
	return s;
}

static void test_json(void)
{
	REFUSE(CMPL, "{", NULL, "invalid_json", "malformed JSON body");
	REFUSE(CMPL, "", NULL, "invalid_json", "malformed JSON body");
	REFUSE(CMPL, "[1]", NULL, "invalid_json", "the body must be a JSON object");
	REFUSE(CMPL, "{'prompt': 'a', 'prompt': 'b'}", NULL, "invalid_json", "malformed JSON body");
	/* an integer beyond 64 bits in an ignored field: read again as reals, accepted */
	kvt_gen_request q;
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'metadata': {'x': 123456789012345678901234567890}, 'max_tokens': 3}", &q))
		CHECK_EQ_INT(q.sched.max_tokens, 3);
	kvt_gen_request_deinit(&q);
	/* strings may hold \u0000 */
	if (ACCEPT(CMPL, "{'prompt': 'a\\u0000b'}", &q))
		CHECK(q.n_ids >= 3);
	kvt_gen_request_deinit(&q);
}

/* A body (with ' for ") loaded as kvt_req_body_load does; NULL when refused. */
static json_t *load(const char *raw)
{
	char *b = fix(raw);
	json_t *v = NULL;
	kvt_req_err e;
	if (kvt_req_body_load(b, strlen(b), &v, &e) != KVT_OK)
		v = NULL;
	free(b);
	return v;
}

/* Object keys may hold \u0000 (JSON and OpenAI's schema allow it; jansson's reader alone refuses it). */
static void test_nul_keys(void)
{
	/* each key keeps its own bytes: NUL, U+FFFF (the re-spelling's escape, raw or escaped), '\\u0000' as text */
	json_t *v = load("{'a\\u0000': 1, 'a\\u0000\\u0000': 2, 'a\\uffff': 3, 'a\\uffff0': 4, '\\uFFFF1': 5, "
			 "'\xef\xbf\xbf" "0': 6, 'b\\\\u0000': 7, 'a': 8, 'v': 'x\\u0000\\uffff', 'o': [{'\\u0000': 9}]}");
	CHECK(v != NULL);
	if (v) {
		CHECK_EQ_INT(json_object_size(v), 10);
		static const struct {
			const char *k;
			size_t n;
			int want;
		} keys[] = { { "a\0", 2, 1 },		 { "a\0\0", 3, 2 }, { "a\xef\xbf\xbf", 4, 3 }, { "a\xef\xbf\xbf" "0", 5, 4 },
			     { "\xef\xbf\xbf" "1", 4, 5 }, { "\xef\xbf\xbf" "0", 4, 6 }, { "b\\u0000", 7, 7 }, { "a", 1, 8 } };
		for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
			CHECKF(json_integer_value(json_object_getn(v, keys[i].k, keys[i].n)) == keys[i].want, "key %zu", i);
		json_t *s = json_object_get(v, "v"); /* values are never re-spelled */
		CHECK(json_string_length(s) == 5 && !memcmp(json_string_value(s), "x\0\xef\xbf\xbf", 5));
		json_t *o = json_array_get(json_object_get(v, "o"), 0);
		CHECK(json_integer_value(json_object_getn(o, "\0", 1)) == 9);
		/* the keys' order is kept */
		const char *k;
		size_t n, i = 0;
		json_t *x;
		json_object_keylen_foreach(v, k, n, x)
		{
			if (i < sizeof(keys) / sizeof(keys[0]))
				CHECKF(n == keys[i].n && !memcmp(k, keys[i].k, n), "order: key %zu", i);
			i++;
		}
	}
	json_decref(v);
	/* duplicates are still refused, malformed bodies still malformed */
	REFUSE(CMPL, "{'prompt': 'hi', 'm': {'a\\u0000': 1, 'a\\u0000': 2}}", NULL, "invalid_json", "duplicate");
	REFUSE(CMPL, "{'prompt': 'hi', 'a\\u0000': ", NULL, "invalid_json", "malformed JSON body");
	/* a field name holding NUL is not that field: ignored, as other extra fields */
	kvt_gen_request q;
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'max_tokens\\u0000': 1000, 'metadata': {'k\\u0000': 'v'}, "
			 "'n': 2, 'x': 123456789012345678901234567890}", &q))
		CHECK(q.sched.max_tokens == LIM.default_max_tokens && q.n == 2);
	kvt_gen_request_deinit(&q);
	/* where kvtier reads a key, NUL counts: not a token id, not a cache_control field, not a schema keyword */
	REFUSE(CMPL, "{'prompt': 'hi', 'logit_bias': {'5\\u0000': 1}}", "logit_bias", NULL, "is not a token id");
	REFUSE(CMPL, "{'prompt': 'hi', 'cache_control': {'type': 'ephemeral', 'ttl\\u0000': '1h'}}", "cache_control", NULL,
	       "has an unknown field 'ttl'");
	const char *rf = "{'prompt': 'hi', 'response_format': {'type': 'json_schema', 'json_schema': {'name': 'x', "
			 "'schema': %s}}}";
	char b[512];
	snprintf(b, sizeof(b), rf, "{'type': 'object', 'type\\u0000': 'string'}");
	REFUSE(CMPL, b, "response_format.json_schema.schema", NULL, "schema keyword 'type\\u0000...' (at #) is not supported");
	snprintf(b, sizeof(b), rf, "{'$defs': {'a': {'type': 'string'}}, '$ref': '#/$defs/a\\u0000b'}");
	REFUSE(CMPL, b, "response_format.json_schema.schema", NULL, "'$ref' at # holds U+0000");
	/* a property name holding NUL is generated with it (and required by its whole name) */
	snprintf(b, sizeof(b), rf,
		 "{'type': 'object', 'properties': {'a\\u0000b': {'type': 'integer'}, 'a': {'type': 'integer'}}, "
		 "'required': ['a\\u0000b'], 'additionalProperties': false}");
	if (ACCEPT(CMPL, b, &q) && q.sched.grammar) {
		static const struct {
			const char *doc;
			bool ok;
		} docs[] = { { "{\"a\\u0000b\": 1}", true }, { "{\"a\\u0000b\": 1, \"a\": 2}", true },
			     { "{\"a\": 2}", false },		  { "{\"a\": 2, \"a\\u0000b\": 1}", false } };
		for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
			kvt_gmatch *m = NULL;
			CHECK(kvt_gmatch_create(q.sched.grammar, NULL, &m) == KVT_OK);
			bool ok = m && kvt_gmatch_feed(m, docs[i].doc, strlen(docs[i].doc)) && kvt_gmatch_can_end(m);
			CHECKF(ok == docs[i].ok, "the schema with a NUL property name %s %s", ok ? "takes" : "refuses",
			       docs[i].doc);
			kvt_gmatch_destroy(m);
		}
	}
	kvt_gen_request_deinit(&q);
}

static void test_sampling(void)
{
	REFUSE(CMPL, "{'prompt': 'hi', 'model': 5}", "model", NULL, "'model' must be a string");
	REFUSE(CMPL, "{'prompt': 'hi', 'max_tokens': 2.5}", "max_tokens", NULL, "'max_tokens' must be an integer");
	REFUSE(CMPL, "{'prompt': 'hi', 'max_tokens': '3'}", "max_tokens", NULL, "'max_tokens' must be an integer");
	REFUSE(CMPL, "{'prompt': 'hi', 'max_tokens': 0}", "max_tokens", NULL, "'max_tokens' must be in [1, 64] (got 0)");
	REFUSE(CMPL, "{'prompt': 'hi', 'max_tokens': 65}", "max_tokens", NULL, "must be in [1, 64]");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}], 'max_completion_tokens': 0}",
	       "max_completion_tokens", NULL, "'max_completion_tokens' must be in [1, 64]");
	REFUSE(CMPL, "{'prompt': 'hi', 'temperature': 'x'}", "temperature", NULL, "'temperature' must be a number");
	REFUSE(CMPL, "{'prompt': 'hi', 'temperature': 2.5}", "temperature", NULL, "'temperature' must be in [0, 2]");
	REFUSE(CMPL, "{'prompt': 'hi', 'temperature': -0.1}", "temperature", NULL, "in [0, 2]");
	REFUSE(CMPL, "{'prompt': 'hi', 'top_p': -0.01}", "top_p", NULL, "'top_p' must be in [0, 1]");
	REFUSE(CMPL, "{'prompt': 'hi', 'top_p': 1.5}", "top_p", NULL, "'top_p' must be in [0, 1]");
	REFUSE(CMPL, "{'prompt': 'hi', 'top_p': true}", "top_p", NULL, "'top_p' must be a number");
	REFUSE(CMPL, "{'prompt': 'hi', 'top_k': -1}", "top_k", NULL, "'top_k' must be in [0, ");
	char b[1024];
	snprintf(b, sizeof(b), "{'prompt': 'hi', 'top_k': %u}", LIM.n_vocab + 1);
	REFUSE(CMPL, b, "top_k", NULL, "'top_k' must be in");
	REFUSE(CMPL, "{'prompt': 'hi', 'min_p': 1.5}", "min_p", NULL, "'min_p' must be in [0, 1]");
	REFUSE(CMPL, "{'prompt': 'hi', 'min_p': 'x'}", "min_p", NULL, "'min_p' must be a number");
	REFUSE(CMPL, "{'prompt': 'hi', 'presence_penalty': 3}", "presence_penalty", NULL, "'presence_penalty' must be in [-2, 2]");
	REFUSE(CMPL, "{'prompt': 'hi', 'frequency_penalty': -3}", "frequency_penalty", NULL,
	       "'frequency_penalty' must be in [-2, 2]");
	REFUSE(CMPL, "{'prompt': 'hi', 'presence_penalty': 'x'}", "presence_penalty", NULL, "must be a number");
	REFUSE(CMPL, "{'prompt': 'hi', 'repetition_penalty': 0}", "repetition_penalty", NULL,
	       "'repetition_penalty' must be in (0, 10]");
	REFUSE(CMPL, "{'prompt': 'hi', 'repetition_penalty': 11}", "repetition_penalty", NULL, "(0, 10]");
	REFUSE(CMPL, "{'prompt': 'hi', 'seed': 1.5}", "seed", NULL, "'seed' must be an integer");
	REFUSE(CMPL, "{'prompt': 'hi', 'n': 0}", "n", NULL, "'n' must be in [1, 4] (got 0)");
	REFUSE(CMPL, "{'prompt': 'hi', 'n': 5}", "n", NULL, "'n' must be in [1, 4] (got 5)");
	REFUSE(CMPL, "{'prompt': 'hi', 'stream': 'yes'}", "stream", NULL, "'stream' must be a boolean");
	REFUSE(CMPL, "{'prompt': 'hi', 'ignore_eos': 1}", "ignore_eos", NULL, "'ignore_eos' must be a boolean");
	REFUSE(CMPL, "{'prompt': 'hi', 'parse_special': 'no'}", "parse_special", NULL, "'parse_special' must be a boolean");
	REFUSE(CMPL, "{'prompt': 'hi', 'echo': 'x'}", "echo", NULL, "'echo' must be a boolean");
	REFUSE(CMPL, "{'prompt': 'hi', 'priority': 101}", "priority", NULL, "'priority' must be in [-100, 100]");
	REFUSE(CMPL, "{'prompt': 'hi', 'priority': -101}", "priority", NULL, "'priority' must be in [-100, 100]");
	REFUSE(CMPL, "{'prompt': 'hi', 'session_id': 5}", "session_id", NULL, "'session_id' must be a string");
	REFUSE(CMPL, "{'prompt': 'hi', 'session_id': '.hidden'}", "session_id", NULL, "'session_id' must be 1-128 characters");
	REFUSE(CMPL, "{'prompt': 'hi', 'session_id': 'a b'}", "session_id", NULL, "'session_id' must be 1-128 characters");
	REFUSE(CMPL, "{'prompt': 'hi', 'stream_options': 5}", "stream_options", NULL, "'stream_options' must be an object");
	REFUSE(CMPL, "{'prompt': 'hi', 'stream_options': {'include_usage': 1}}", "stream_options.include_usage", NULL,
	       "'stream_options.include_usage' must be a boolean");
	/* the order of the checks: a type fault before a range fault, response_format before temperature's range */
	REFUSE(CMPL, "{'prompt': 'hi', 'temperature': 9, 'n': 'x'}", "n", NULL, "'n' must be an integer");
	REFUSE(CMPL, "{'prompt': 'hi', 'temperature': 9, 'response_format': 5}", "response_format", NULL,
	       "'response_format' must be an object with a 'type'");
	REFUSE(CMPL, "{'prompt': 5, 'stop': 5}", "stop", NULL, "'stop' must be a string or an array of strings");

	/* logit_bias */
	REFUSE(CMPL, "{'prompt': 'hi', 'logit_bias': [1]}", "logit_bias", NULL, "'logit_bias' must be an object");
	REFUSE(CMPL, "{'prompt': 'hi', 'logit_bias': {'x': 1}}", "logit_bias", NULL, "'logit_bias' key 'x' is not a token id");
	REFUSE(CMPL, "{'prompt': 'hi', 'logit_bias': {'-1': 1}}", "logit_bias", NULL, "is not a token id");
	REFUSE(CMPL, "{'prompt': 'hi', 'logit_bias': {'': 1}}", "logit_bias", NULL, "is not a token id");
	snprintf(b, sizeof(b), "{'prompt': 'hi', 'logit_bias': {'%u': 1}}", LIM.n_vocab);
	REFUSE(CMPL, b, "logit_bias", NULL, "is not a token id");
	REFUSE(CMPL, "{'prompt': 'hi', 'logit_bias': {'5': 101}}", "logit_bias", NULL, "'logit_bias[5]' must be a number in [-100, 100]");
	REFUSE(CMPL, "{'prompt': 'hi', 'logit_bias': {'5': 'a'}}", "logit_bias", NULL, "must be a number in [-100, 100]");
	char *big = gen_body("{'prompt': 'hi', 'logit_bias': {", "'%d': 1", KVT_SAMPLER_MAX_BIAS + 1, "}}");
	REFUSE(CMPL, big, "logit_bias", NULL, "'logit_bias' may hold at most 1024 entries");
	free(big);

	/* accepted: the values reach the scheduler's request */
	kvt_gen_request q;
	if (ACCEPT(CMPL, "{'prompt': 'hi'}", &q)) {
		CHECK(!q.chat && q.n == 1 && q.sched.max_tokens == LIM.default_max_tokens);
		CHECK(q.sched.sample.temp == 1.0f && q.sched.sample.top_p == 1.0f && q.sched.sample.top_k == 0);
		CHECK(q.sched.sample.repetition_penalty == 1.0f && q.sched.sample.n_bias == 0);
		CHECK(!q.have_seed && !q.stream && !q.sched.logprobs && !q.sched.has_priority && q.parse_special);
		CHECK(q.sched.grammar == NULL && q.n_stops == 0 && !q.echo_text && !q.sched.tenant[0]);
		CHECK(!strcmp(q.max_tokens_key, "max_tokens") && !q.sched.session_id[0] && q.sched.n_retain == 0);
		CHECK(q.n_ids > 0 && q.sched.prompt == q.ids && q.sched.n_prompt == q.n_ids);
	}
	kvt_gen_request_deinit(&q);
	snprintf(b, sizeof(b),
		 "{'prompt': 'hi', 'max_tokens': 2.0, 'temperature': 0, 'top_p': 0.5, 'top_k': %u, 'min_p': 0.25, "
		 "'seed': -7, 'n': 4, 'presence_penalty': -2, 'frequency_penalty': 2, 'repetition_penalty': 10, "
		 "'ignore_eos': true, 'priority': -100, 'logit_bias': {'5': -100, '7': 2.5}}",
		 LIM.n_vocab);
	if (ACCEPT(CMPL, b, &q)) {
		CHECK(q.sched.max_tokens == 2 && q.sched.sample.temp == 0.0f && q.sched.sample.top_p == 0.5f);
		CHECK(q.sched.sample.top_k == LIM.n_vocab && q.sched.sample.min_p == 0.25f);
		CHECK(q.have_seed && q.sched.sample.seed == (uint64_t)-7 && q.n == 4);
		CHECK(q.sched.sample.presence_penalty == -2.0f && q.sched.sample.frequency_penalty == 2.0f);
		CHECK(q.sched.sample.repetition_penalty == 10.0f && q.sched.ignore_eos);
		CHECK(q.sched.has_priority && q.sched.priority == -100);
		CHECK(q.sched.sample.n_bias == 2 && q.sched.sample.bias[0].id == 5 && q.sched.sample.bias[0].bias == -100.0f);
		CHECK(q.sched.sample.bias[1].id == 7 && q.sched.sample.bias[1].bias == 2.5f);
	}
	kvt_gen_request_deinit(&q);
	/* top_p 0 (OpenAI's range is [0, 1]): only the most likely token is kept, so greedy, whatever the temperature */
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'top_p': 0, 'temperature': 1.5}", &q))
		CHECK(q.sched.sample.temp == 0.0f && q.sched.sample.top_p == 1.0f);
	kvt_gen_request_deinit(&q);
	/* null counts as absent */
	if (ACCEPT(CMPL,
		   "{'prompt': 'hi', 'max_tokens': null, 'temperature': null, 'n': null, 'stop': null, 'seed': null, "
		   "'priority': null, 'logit_bias': null, 'response_format': null, 'stream_options': null, 'logprobs': null, "
		   "'suffix': null, 'audio': null, 'modalities': null, 'best_of': null, 'user': null, 'session_id': null, "
		   "'cache_control': null, 'prompt_cache_key': null, 'prompt_cache_retention': null}",
		   &q)) {
		CHECK(q.n == 1 && q.sched.max_tokens == LIM.default_max_tokens && !q.have_seed && !q.sched.has_priority);
		CHECK(!q.sched.logprobs && q.n_stops == 0 && q.sched.grammar == NULL && q.cc.n_retain == 0);
	}
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'stream': true, 'stream_options': {'include_usage': true}, 'session_id': 's.1',"
			 " 'user': 'alice'}", &q)) {
		CHECK(q.stream && q.include_usage && !strcmp(q.sched.session_id, "s.1") && !strcmp(q.sched.tenant, "alice"));
	}
	kvt_gen_request_deinit(&q);
}

static void test_refused_fields(void)
{
	REFUSE(CMPL, "{'prompt': 'hi', 'best_of': 2}", "best_of", NULL, "'best_of' must be in [1, 1]");
	REFUSE(CMPL, "{'prompt': 'hi', 'suffix': 'x'}", "suffix", NULL, "'suffix' is not supported");
	REFUSE(CMPL, "{'prompt': 'hi', 'audio': {}}", "audio", NULL, "'audio' is not supported");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}], 'prediction': {'type': 'content'}}", "prediction",
	       NULL, "'prediction' is not supported");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}], 'web_search_options': {}}", "web_search_options",
	       NULL, "'web_search_options' is not supported");
	/* reasoning_effort: OpenAI's values are accepted (the model has no reasoning mode), others refused */
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}], 'reasoning_effort': 'maximal'}", "reasoning_effort",
	       NULL, "'reasoning_effort' must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\"");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}], 'reasoning_effort': 1}", "reasoning_effort", NULL,
	       "the model has no reasoning mode");
	REFUSE(CMPL, "{'prompt': 'hi', 'reasoning_effort': ''}", "reasoning_effort", NULL, "must be \"none\"");
	REFUSE(CMPL, "{'prompt': 'hi', 'reasoning_effort': 'none\\u0000'}", "reasoning_effort", NULL, "must be \"none\"");
	static const char *const efforts[] = { "none", "minimal", "low", "medium", "high", "xhigh" };
	for (size_t i = 0; i < sizeof(efforts) / sizeof(efforts[0]); i++) {
		char b[256];
		kvt_gen_request q, q0;
		snprintf(b, sizeof(b), "{'messages': [{'role': 'user', 'content': 'hi'}], 'reasoning_effort': '%s'}", efforts[i]);
		if (ACCEPT(CHAT, b, &q) && ACCEPT(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}]}", &q0))
			CHECKF(q.n_ids == q0.n_ids && !memcmp(q.ids, q0.ids, q.n_ids * sizeof(int32_t)) &&
				       q.sched.max_tokens == q0.sched.max_tokens && q.sched.grammar == NULL,
			       "reasoning_effort %s changes the request", efforts[i]);
		kvt_gen_request_deinit(&q);
		kvt_gen_request_deinit(&q0);
	}
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}], 'verbosity': 'low'}", "verbosity", NULL,
	       "'verbosity' is not supported");
	REFUSE(CMPL, "{'prompt': 'hi', 'modalities': ['text', 'audio']}", "modalities", NULL,
	       "'modalities' other than [\"text\"] is not supported");
	REFUSE(CMPL, "{'prompt': 'hi', 'modalities': 'text'}", "modalities", NULL, "is not supported");
	/* accepted: empty suffix, ["text"], best_of 1, the no-ops, chat's best_of (a completions field) */
	kvt_gen_request q;
	ACCEPT(CMPL, "{'prompt': 'hi', 'suffix': '', 'modalities': ['text'], 'best_of': 1, 'store': true, "
		     "'metadata': {'a': 'b'}, 'service_tier': 'auto', 'safety_identifier': 'x'}", &q);
	kvt_gen_request_deinit(&q);
	ACCEPT(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}], 'best_of': 3, 'parse_special': 'x', 'echo': 1}", &q);
	kvt_gen_request_deinit(&q);
}

static void test_logprobs(void)
{
	const char *m = "{'messages': [{'role': 'user', 'content': 'hi'}], ";
	char b[512];
	snprintf(b, sizeof(b), "%s'logprobs': 1}", m);
	REFUSE(CHAT, b, "logprobs", NULL, "'logprobs' must be a boolean");
	snprintf(b, sizeof(b), "%s'logprobs': true, 'top_logprobs': 21}", m);
	REFUSE(CHAT, b, "top_logprobs", NULL, "'top_logprobs' must be in [0, 20]");
	snprintf(b, sizeof(b), "%s'top_logprobs': 2}", m);
	REFUSE(CHAT, b, "top_logprobs", NULL, "'top_logprobs' needs 'logprobs': true");
	REFUSE(CMPL, "{'prompt': 'hi', 'logprobs': 21}", "logprobs", NULL, "'logprobs' must be in [0, 20]");
	REFUSE(CMPL, "{'prompt': 'hi', 'logprobs': true}", "logprobs", NULL, "'logprobs' must be an integer");
	REFUSE(CMPL, "{'prompt': 'hi', 'logprobs': 1, 'echo': true}", "echo", NULL,
	       "'echo' with 'logprobs' (the prompt's logprobs) is not supported");
	kvt_gen_request q;
	snprintf(b, sizeof(b), "%s'logprobs': true, 'top_logprobs': 20}", m);
	if (ACCEPT(CHAT, b, &q))
		CHECK(q.sched.logprobs && q.sched.top_logprobs == 20);
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'logprobs': 0}", &q))
		CHECK(q.sched.logprobs && q.sched.top_logprobs == 0);
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'logprobs': 3}", &q))
		CHECK(q.sched.logprobs && q.sched.top_logprobs == 3);
	kvt_gen_request_deinit(&q);
}

static void test_stop(void)
{
	REFUSE(CMPL, "{'prompt': 'hi', 'stop': 5}", "stop", NULL, "'stop' must be a string or an array of strings");
	REFUSE(CMPL, "{'prompt': 'hi', 'stop': ['a', 5]}", "stop", NULL, "'stop' must be a string or an array of strings");
	REFUSE(CMPL, "{'prompt': 'hi', 'stop': ['a', 'b', 'c', 'd', 'e']}", "stop", NULL, "'stop' may hold at most 4 strings");
	kvt_gen_request q;
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'stop': ['', 'ab', 'x\\u0000yz', 'q']}", &q)) {
		CHECK(q.n_stops == 3 && q.max_stop_len == 4); /* the empty one ignored */
		CHECK(q.stop_len[0] == 2 && !memcmp(q.stops[0], "ab", 2));
		CHECK(q.stop_len[1] == 4 && !memcmp(q.stops[1], "x\0yz", 4));
	}
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'stop': 'END'}", &q))
		CHECK(q.n_stops == 1 && q.stop_len[0] == 3);
	kvt_gen_request_deinit(&q);
}

static void test_response_format(void)
{
	const char *p = "response_format.json_schema.schema";
	REFUSE(CMPL, "{'prompt': 'hi', 'response_format': 'json'}", "response_format", NULL,
	       "'response_format' must be an object with a 'type'");
	REFUSE(CMPL, "{'prompt': 'hi', 'response_format': {'type': 'xml'}}", "response_format.type", NULL,
	       "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\" (got \"xml\")");
	REFUSE(CMPL, "{'prompt': 'hi', 'response_format': {'type': 'json_schema'}}", "response_format.json_schema", NULL,
	       "'response_format.json_schema' must be an object");
	REFUSE(CMPL, "{'prompt': 'hi', 'response_format': {'type': 'json_schema', 'json_schema': {'schema': {}}}}",
	       "response_format.json_schema.name", NULL, "must be a string of 1-64 characters");
	char b[1024];
	snprintf(b, sizeof(b),
		 "{'prompt': 'hi', 'response_format': {'type': 'json_schema', 'json_schema': {'name': '%065d'}}}", 0);
	REFUSE(CMPL, b, "response_format.json_schema.name", NULL, "1-64 characters");
	REFUSE(CMPL, "{'prompt': 'hi', 'response_format': {'type': 'json_schema', 'json_schema': {'name': 'x', 'strict': 'yes'}}}",
	       "response_format.json_schema.strict", NULL, "'response_format.json_schema.strict' must be a boolean");
#define RF(schema) "{'prompt': 'hi', 'response_format': {'type': 'json_schema', 'json_schema': {'name': 'x', 'strict': true, 'schema': " schema "}}}"
	REFUSE(CMPL, RF("{'type': 'string', 'format': 'date'}"), p, NULL, "schema keyword 'format' (at #) is not supported");
	REFUSE(CMPL, RF("{'type': 'object', 'properties': {'a': {'type': 'integer', 'minimum': 1}}}"), p, NULL,
	       "schema keyword 'minimum' (at #/properties/a)");
	REFUSE(CMPL, RF("{'type': 'object', 'additionalProperties': {'type': 'string'}}"), p, NULL,
	       "'additionalProperties' at #: only false or true is supported");
	REFUSE(CMPL, RF("{'type': 'object', 'properties': {'a': {}}, 'required': ['b']}"), p, NULL,
	       "'required' at # names 'b', which is not in 'properties'");
	REFUSE(CMPL, RF("{'type': 'widget'}"), p, NULL, "'type' at #: unknown type 'widget'");
	REFUSE(CMPL, RF("{'$ref': '#/$defs/missing'}"), p, NULL, "does not resolve");
	REFUSE(CMPL, RF("{'type': 'array', 'items': [{}, {}]}"), p, NULL, "an array of schemas (tuple) is not supported");
	REFUSE(CMPL, RF("{'type': 'array', 'minItems': 3, 'maxItems': 2}"), p, NULL, "'maxItems' at # is below 'minItems'");
	REFUSE(CMPL, RF("{'type': 'string', 'pattern': '(?=a)'}"), p, NULL, "a lookaround or named group is not supported");
	REFUSE(CMPL, RF("5"), p, NULL, "the schema at # must be an object");
	/* the limits */
	/* generated schemas: the body's head, then the schema, then "}}}" */
	char *s;
	const char *head = "{'prompt': 'hi', 'response_format': {'type': 'json_schema', 'json_schema': {'name': 'x', 'schema': ";
	char pre[512];
	snprintf(pre, sizeof(pre), "%s{'enum': [", head);
	s = gen_body(pre, "%d", 257, "]}}}}");
	REFUSE(CMPL, s, p, NULL, "'enum' at # must be an array of 1-256 values");
	free(s);
	s = gen_body(pre, "%d", 256, "]}}}}");
	kvt_gen_request q;
	if (ACCEPT(CMPL, s, &q)) /* 256 values: the limit, accepted */
		CHECK(q.sched.grammar != NULL);
	kvt_gen_request_deinit(&q);
	free(s);
	snprintf(pre, sizeof(pre), "%s{'anyOf': [", head);
	s = gen_body(pre, "{'const': %d}", 65, "]}}}}");
	REFUSE(CMPL, s, p, NULL, "'anyOf' at # must be an array of 1-64 schemas");
	free(s);
	snprintf(pre, sizeof(pre), "%s{'type': 'string', 'pattern': '", head);
	s = gen_body(pre, "a", 1025, "'}}}}");
	for (char *c = s + strlen(pre); *c == 'a' || *c == ','; c++) /* gen_body put commas between the a's */
		*c = 'a';
	REFUSE(CMPL, s, p, NULL, "'pattern' at # is longer than 1024 bytes");
	free(s);
	char pat[200] = "";
	for (int i = 0; i < 33; i++)
		strcat(pat, "(");
	strcat(pat, "a");
	for (int i = 0; i < 33; i++)
		strcat(pat, ")");
	snprintf(b, sizeof(b), RF("{'type': 'string', 'pattern': '%s'}"), pat);
	REFUSE(CMPL, b, p, NULL, "nesting groups deeper than 32");
	/* schemas nested 65 deep */
	char deep[4096];
	size_t k = 0;
	k += (size_t)snprintf(deep + k, sizeof(deep) - k, "%s", head);
	for (int i = 0; i < 65; i++)
		k += (size_t)snprintf(deep + k, sizeof(deep) - k, "{'type': 'array', 'items': ");
	k += (size_t)snprintf(deep + k, sizeof(deep) - k, "{'type': 'string'}");
	for (int i = 0; i < 65; i++)
		k += (size_t)snprintf(deep + k, sizeof(deep) - k, "}");
	snprintf(deep + k, sizeof(deep) - k, "}}}");
	REFUSE(CMPL, deep, p, NULL, "nests deeper than 64");

	/* accepted: text (no grammar), json_object, a strict schema, a schema-less json_schema */
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'response_format': {'type': 'text'}}", &q))
		CHECK(q.sched.grammar == NULL);
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'response_format': {'type': 'json_object'}}", &q))
		CHECK(q.sched.grammar != NULL);
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CHAT,
		   "{'messages': [{'role': 'user', 'content': 'hi'}], 'response_format': {'type': 'json_schema', 'json_schema': "
		   "{'name': 'person', 'strict': true, 'schema': {'type': 'object', 'properties': {'name': {'type': 'string', "
		   "'maxLength': 8}, 'tags': {'type': 'array', 'items': {'enum': ['a', 'b']}, 'maxItems': 3}, 'id': {'type': "
		   "'string', 'pattern': '^[a-z]{2}\\\\d+$'}, 'n': {'anyOf': [{'type': 'integer'}, {'type': 'null'}]}}, "
		   "'required': ['name'], 'additionalProperties': false, '$defs': {}, 'title': 't'}}}}",
		   &q))
		CHECK(q.sched.grammar != NULL);
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'response_format': {'type': 'json_schema', 'json_schema': {'name': 'any'}}}", &q))
		CHECK(q.sched.grammar != NULL);
	kvt_gen_request_deinit(&q);
#undef RF
}

static void test_tools(void)
{
	const char *m = "{'messages': [{'role': 'user', 'content': 'hi'}], ";
	const char *tool = "{'type': 'function', 'function': {'name': 'get', 'parameters': {'type': 'object', 'properties': "
			   "{'city': {'type': 'string'}}, 'required': ['city']}}}";
	char b[2048];
	snprintf(b, sizeof(b), "%s'tools': 'x'}", m);
	REFUSE(CHAT, b, "tools", NULL, "'tools' must be an array");
	snprintf(b, sizeof(b), "%s'tools': [{'type': 'retrieval'}]}", m);
	REFUSE(CHAT, b, "tools[0]", NULL, "'tools[0]' must be {\"type\": \"function\"");
	snprintf(b, sizeof(b), "%s'tools': [%s, {'type': 'function', 'function': {'name': 'a b'}}]}", m, tool);
	REFUSE(CHAT, b, "tools[1]", NULL, "'tools[1].function.name' must be 1-64 characters of [a-zA-Z0-9_-]");
	snprintf(b, sizeof(b), "%s'tools': [{'type': 'function', 'function': {'name': 'f', 'parameters': 5}}]}", m);
	REFUSE(CHAT, b, "tools[0]", NULL, "'tools[0].function.parameters' must be a JSON Schema object");
	snprintf(b, sizeof(b), "%s'tools': [%s, %s]}", m, tool, tool);
	REFUSE(CHAT, b, "tools[1]", NULL, "function 'get' is defined twice");
	snprintf(b, sizeof(b), "%s'tools': [%s], 'tool_choice': 'maybe'}", m, tool);
	REFUSE(CHAT, b, "tool_choice", NULL, "'tool_choice' must be \"none\", \"auto\", \"required\" or");
	snprintf(b, sizeof(b), "%s'tools': [%s], 'tool_choice': {'type': 'function', 'function': {'name': 'put'}}}", m, tool);
	REFUSE(CHAT, b, "tool_choice", NULL, "'tool_choice' names function 'put', which is not in 'tools'");
	snprintf(b, sizeof(b), "%s'tool_choice': 'required'}", m);
	REFUSE(CHAT, b, "tool_choice", NULL, "'tool_choice' is \"required\" but there are no 'tools'");
	snprintf(b, sizeof(b), "%s'tools': [%s], 'parallel_tool_calls': 'x'}", m, tool);
	REFUSE(CHAT, b, "parallel_tool_calls", NULL, "'parallel_tool_calls' must be a boolean");
	snprintf(b, sizeof(b), "%s'functions': [{'name': 'f'}]}", m);
	REFUSE(CHAT, b, "functions", NULL, "the deprecated forms");
	snprintf(b, sizeof(b), "%s'function_call': 'auto'}", m);
	REFUSE(CHAT, b, "function_call", NULL, "the deprecated forms");
	snprintf(b, sizeof(b),
		 "%s'tools': [{'type': 'function', 'function': {'name': 'f', 'parameters': {'type': 'object', 'properties': "
		 "{'a': {'type': 'string', 'format': 'email'}}}}}], 'tool_choice': 'required'}",
		 m);
	REFUSE(CHAT, b, "tools[0].function.parameters", NULL, "schema keyword 'format'");
	snprintf(b, sizeof(b), "%s'tools': [%s], 'tool_choice': 'required', 'response_format': {'type': 'json_object'}}", m,
		 tool);
	REFUSE(CHAT, b, "response_format", NULL, "'response_format' cannot be combined with a required or named 'tool_choice'");

	/* accepted: auto (no grammar, the tools described), required and named (a grammar), none (plain text) */
	kvt_gen_request plain, q;
	uint32_t n_plain = 0;
	if (ACCEPT(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}]}", &plain))
		n_plain = plain.n_ids;
	snprintf(b, sizeof(b), "%s'tools': [%s]}", m, tool);
	if (ACCEPT(CHAT, b, &q)) {
		CHECK(q.tools.choice == KVT_TOOLS_AUTO && q.tools.g == NULL && q.sched.grammar == NULL && q.tools.parallel);
		CHECK(q.n_ids > n_plain + 20); /* the tools' description is in the prompt */
	}
	kvt_gen_request_deinit(&q);
	snprintf(b, sizeof(b), "%s'tools': [%s], 'tool_choice': 'required', 'parallel_tool_calls': false}", m, tool);
	if (ACCEPT(CHAT, b, &q))
		CHECK(q.tools.choice == KVT_TOOLS_REQUIRED && q.sched.grammar != NULL && !q.tools.parallel);
	kvt_gen_request_deinit(&q);
	snprintf(b, sizeof(b), "%s'tools': [%s], 'tool_choice': {'type': 'function', 'function': {'name': 'get'}}}", m, tool);
	if (ACCEPT(CHAT, b, &q))
		CHECK(q.tools.choice == KVT_TOOLS_NAMED && !strcmp(q.tools.named, "get") && q.sched.grammar != NULL);
	kvt_gen_request_deinit(&q);
	snprintf(b, sizeof(b), "%s'tools': [%s], 'tool_choice': 'none'}", m, tool);
	if (ACCEPT(CHAT, b, &q)) { /* the tools are not rendered: the prompt is the plain one */
		CHECK(q.tools.choice == KVT_TOOLS_NONE && q.sched.grammar == NULL);
		CHECK(q.n_ids == n_plain && !memcmp(q.ids, plain.ids, n_plain * sizeof(int32_t)));
	}
	kvt_gen_request_deinit(&q);
	/* a tool conversation: an assistant turn with tool_calls (content null), then the tool's result */
	snprintf(b, sizeof(b),
		 "{'messages': [{'role': 'user', 'content': 'weather?'}, {'role': 'assistant', 'content': null, "
		 "'tool_calls': [{'id': 'c1', 'type': 'function', 'function': {'name': 'get', 'arguments': "
		 "'{\\'city\\': \\'Oslo\\'}'}}]}, {'role': 'tool', 'tool_call_id': 'c1', 'content': 'rain'}], 'tools': [%s]}",
		 tool);
	/* fix() turned \' into \": the arguments string holds escaped quotes */
	if (ACCEPT(CHAT, b, &q))
		CHECK(q.n_ids > n_plain);
	kvt_gen_request_deinit(&q);
	kvt_gen_request_deinit(&plain);
}

static void test_prompt(void)
{
	REFUSE(CMPL, "{}", "prompt", NULL, "'prompt' is required");
	/* null is OpenAI's default prompt: a new document (the BOS token, or EOS where the model has no BOS) */
	kvt_gen_request q;
	if (ACCEPT(CMPL, "{'prompt': null, 'echo': true}", &q)) {
		int32_t start = kvt_tok_bos(TOK) >= 0 ? kvt_tok_bos(TOK) : kvt_tok_eos(TOK);
		CHECK(start >= 0 && q.n_ids == 1 && q.ids[0] == start && q.sched.n_prompt == 1 && q.echo_text);
	}
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': null, 'cache_control': {'type': 'ephemeral'}, 'max_tokens': 3}", &q))
		CHECK(q.n_ids == 1 && q.sched.max_tokens == 3);
	kvt_gen_request_deinit(&q);
	REFUSE(CMPL, "{'prompt': 5}", "prompt", NULL, "'prompt' must be a string or an array of token ids");
	REFUSE(CMPL, "{'prompt': []}", "prompt", NULL, "'prompt' is empty");
	REFUSE(CMPL, "{'prompt': ['a', 'b']}", "prompt", NULL, "'prompt' as an array of strings must have exactly one element");
	REFUSE(CMPL, "{'prompt': [1, 2.5]}", "prompt", NULL, "'prompt[1]' must be a token id (integer)");
	REFUSE(CMPL, "{'prompt': [1, -1]}", "prompt", NULL, "'prompt[1]' = -1 is not a token id");
	char b[4096];
	snprintf(b, sizeof(b), "{'prompt': [%u]}", LIM.n_vocab);
	REFUSE(CMPL, b, "prompt", NULL, "is not a token id (the vocabulary has");
	REFUSE(CMPL, "{'prompt': '', 'parse_special': true}", "prompt", NULL, "the prompt is empty");
	/*
	 * The context (128 for these). A prompt that leaves no room for one token
	 * is OpenAI's context_length_exceeded on the prompt's field; one that fits
	 * with too large a max_tokens is refused on max_tokens; an absent max_tokens
	 * is cut to what the context leaves.
	 */
	LIM.max_ctx = 128;
	char *ids = gen_body("{'max_tokens': 64, 'prompt': [", "1", 65, "]}");
	REFUSE(CMPL, ids, "max_tokens", NULL,
	       "the prompt (65 tokens) plus 'max_tokens' (64) exceeds the context (128 tokens): 'max_tokens' may be at most 63");
	free(ids);
	ids = gen_body("{'max_tokens': 64, 'prompt': [", "1", 64, "]}");
	if (ACCEPT(CMPL, ids, &q)) /* exactly the context */
		CHECK(q.n_ids == 64 && q.ids[63] == 1);
	kvt_gen_request_deinit(&q);
	free(ids);
	ids = gen_body("{'max_tokens': 1, 'prompt': [", "1", 128, "]}");
	REFUSE(CMPL, ids, "prompt", "context_length_exceeded",
	       "the prompt is too long: 128 tokens, and the model's context is 128 tokens");
	free(ids);
	ids = gen_body("{'prompt': [", "1", 500, "]}");
	REFUSE(CMPL, ids, "prompt", "context_length_exceeded", "500 tokens, and the model's context is 128 tokens");
	free(ids);
	ids = gen_body("{'max_tokens': 1, 'prompt': [", "1", 127, "]}");
	if (ACCEPT(CMPL, ids, &q)) /* one token left: fits */
		CHECK(q.n_ids == 127 && q.sched.max_tokens == 1);
	kvt_gen_request_deinit(&q);
	free(ids);
	ids = gen_body("{'prompt': [", "1", 120, "]}");
	if (ACCEPT(CMPL, ids, &q)) /* no max_tokens: the default (16), cut to the 8 tokens left */
		CHECK(q.n_ids == 120 && !q.max_tokens_set && q.sched.max_tokens == 8);
	kvt_gen_request_deinit(&q);
	free(ids);
	ids = gen_body("{'prompt': [", "1", 100, "]}");
	if (ACCEPT(CMPL, ids, &q)) /* the default fits: as it is */
		CHECK(q.sched.max_tokens == LIM.default_max_tokens);
	kvt_gen_request_deinit(&q);
	free(ids);
	char *long_msg = gen_body("{'max_completion_tokens': 64, 'messages': [{'role': 'user', 'content': '", "x y", 20, "'}]}");
	REFUSE(CHAT, long_msg, "max_completion_tokens", NULL, "plus 'max_completion_tokens' (64) exceeds the context");
	free(long_msg);
	long_msg = gen_body("{'max_completion_tokens': 1, 'messages': [{'role': 'user', 'content': '", "x y", 40, "'}]}");
	REFUSE(CHAT, long_msg, "messages", "context_length_exceeded", "the prompt is too long: ");
	free(long_msg);
	LIM.max_ctx = 2048;

	/* accepted: a token-id prompt as given, a one-string array as the string, BOS as the model asks */
	if (ACCEPT(CMPL, "{'prompt': [5, 6, 7]}", &q))
		CHECK(q.n_ids == 3 && q.ids[0] == 5 && q.ids[2] == 7);
	kvt_gen_request_deinit(&q);
	kvt_gen_request q2;
	if (ACCEPT(CMPL, "{'prompt': 'hello'}", &q) && ACCEPT(CMPL, "{'prompt': ['hello']}", &q2)) {
		CHECK(q.n_ids == q2.n_ids && !memcmp(q.ids, q2.ids, q.n_ids * sizeof(int32_t)));
		CHECK(!kvt_tok_add_bos(TOK) || q.ids[0] == kvt_tok_bos(TOK));
	}
	kvt_gen_request_deinit(&q);
	kvt_gen_request_deinit(&q2);
	/* parse_special: a completion's special-token text is one token, or plain text with false */
	if (ACCEPT(CMPL, "{'prompt': '<|im_end|>'}", &q) && ACCEPT(CMPL, "{'prompt': '<|im_end|>', 'parse_special': false}", &q2))
		CHECK(q.n_ids < q2.n_ids && q.ids[q.n_ids - 1] == kvt_tok_eos(TOK));
	kvt_gen_request_deinit(&q);
	kvt_gen_request_deinit(&q2);
	/* echo: the prompt's text */
	if (ACCEPT(CMPL, "{'prompt': 'say hi', 'echo': true}", &q))
		CHECK(q.echo_text && q.n_echo == 6 && !strcmp(q.echo_text, "say hi"));
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': [104, 105], 'echo': true}", &q)) /* token ids: their bytes */
		CHECK(q.echo_text && q.n_echo >= 1);
	kvt_gen_request_deinit(&q);
}

static void test_messages(void)
{
	REFUSE(CHAT, "{}", "messages", NULL, "'messages' must be a non-empty array");
	REFUSE(CHAT, "{'messages': []}", "messages", NULL, "'messages' must be a non-empty array");
	REFUSE(CHAT, "{'messages': {'role': 'user'}}", "messages", NULL, "'messages' must be a non-empty array");
	REFUSE(CHAT, "{'messages': [5]}", "messages[0]", NULL, "'messages[0]' must be an object with role and content");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'a'}, {'role': 'bot', 'content': 'b'}]}", "messages[1].role",
	       NULL, "'messages[1].role' must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\"");
	REFUSE(CHAT, "{'messages': [{'content': 'a'}]}", "messages[0].role", NULL, "must be \"system\"");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 5}]}", "messages[0].content", NULL,
	       "'messages[0].content' must be a string or an array of text parts");
	REFUSE(CHAT, "{'messages': [{'role': 'user'}]}", "messages[0].content", NULL, "must be a string or an array");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': [{'type': 'image_url', 'image_url': {}}]}]}",
	       "messages[0].content", NULL, "'messages[0].content[0]' must be {\"type\": \"text\", \"text\": string}");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': ['a']}]}", "messages[0].content", NULL,
	       "'messages[0].content[0]' must be");
	REFUSE(CHAT, "{'messages': [{'role': 'tool', 'tool_call_id': 5, 'content': 'r'}]}", "messages[0].tool_call_id", NULL,
	       "'messages[0].tool_call_id' must be a string");
	REFUSE(CHAT, "{'messages': [{'role': 'tool', 'content': 5}]}", "messages[0].content", NULL,
	       "'messages[0].content' must be a string or an array of text parts");
	REFUSE(CHAT, "{'messages': [{'role': 'assistant', 'tool_calls': 'x'}]}", "messages[0].tool_calls", NULL,
	       "'messages[0].tool_calls' must be an array");
	REFUSE(CHAT, "{'messages': [{'role': 'assistant', 'tool_calls': [{'function': {}}]}]}", "messages[0].tool_calls", NULL,
	       "'messages[0].tool_calls[0]' must be {\"id\", \"type\": \"function\"");
	REFUSE(CHAT, "{'messages': [{'role': 'assistant', 'content': 5, 'tool_calls': []}]}", "messages[0].content", NULL,
	       "must be a string or an array of text parts");

	/* one content parser: a string and the same text in parts give the same prompt; developer is system */
	kvt_gen_request a, b;
	if (ACCEPT(CHAT, "{'messages': [{'role': 'system', 'content': 'be brief'}, {'role': 'user', 'content': 'hello there'}]}",
		   &a) &&
	    ACCEPT(CHAT,
		   "{'messages': [{'role': 'developer', 'content': [{'type': 'text', 'text': 'be '}, {'type': 'text', "
		   "'text': 'brief'}]}, {'role': 'user', 'content': [{'type': 'text', 'text': 'hello there'}]}]}",
		   &b)) {
		CHECK(a.n_ids == b.n_ids && !memcmp(a.ids, b.ids, a.n_ids * sizeof(int32_t)));
		CHECK(a.chat && !strcmp(a.max_tokens_key, "max_tokens"));
	}
	kvt_gen_request_deinit(&a);
	kvt_gen_request_deinit(&b);
	/* message text is never parsed for special tokens: no forged turn */
	if (ACCEPT(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}]}", &a) &&
	    ACCEPT(CHAT, "{'messages': [{'role': 'user', 'content': 'hi<|im_end|>'}]}", &b)) {
		uint32_t ea = 0, eb = 0;
		for (uint32_t i = 0; i < a.n_ids; i++)
			ea += a.ids[i] == kvt_tok_eos(TOK);
		for (uint32_t i = 0; i < b.n_ids; i++)
			eb += b.ids[i] == kvt_tok_eos(TOK);
		CHECK(ea == eb && b.n_ids > a.n_ids);
	}
	kvt_gen_request_deinit(&a);
	kvt_gen_request_deinit(&b);
	if (ACCEPT(CHAT, "{'messages': [{'role': 'user', 'content': 'hi'}], 'max_completion_tokens': 5, 'max_tokens': 9}", &a))
		CHECK(a.sched.max_tokens == 5 && !strcmp(a.max_tokens_key, "max_completion_tokens"));
	kvt_gen_request_deinit(&a);
	if (ACCEPT(CHAT, "{'messages': [{'role': 'user', 'content': 'a\\u0000b'}, {'role': 'user', 'content': []}]}", &a))
		CHECK(a.n_ids > 0);
	kvt_gen_request_deinit(&a);
}

static void test_cache_control(void)
{
	const char *u = "{'role': 'user', 'content': 'hello'}";
	char b[2048];
	REFUSE(CMPL, "{'prompt': 'hi', 'cache_control': 5}", "cache_control", NULL,
	       "'cache_control' must be an object {\"type\": \"ephemeral\"");
	REFUSE(CMPL, "{'prompt': 'hi', 'cache_control': {'type': 'persistent'}}", "cache_control", NULL,
	       "'cache_control.type' must be \"ephemeral\"");
	REFUSE(CMPL, "{'prompt': 'hi', 'cache_control': {'type': 'ephemeral', 'ttl': '2h'}}", "cache_control", NULL,
	       "'cache_control.ttl' must be \"5m\" or \"1h\"");
	REFUSE(CMPL, "{'prompt': 'hi', 'cache_control': {'type': 'ephemeral', 'scope': 'x'}}", "cache_control", NULL,
	       "'cache_control' has an unknown field 'scope' (allowed: type, ttl)");
	snprintf(b, sizeof(b), "{'messages': [{'role': 'user', 'content': 'a', 'cache_control': {'type': 'x'}}]}");
	REFUSE(CHAT, b, "messages[0].cache_control", NULL, "'messages[0].cache_control.type' must be \"ephemeral\"");
	snprintf(b, sizeof(b),
		 "{'messages': [%s, {'role': 'user', 'content': [{'type': 'text', 'text': 'a', 'cache_control': 1}]}]}", u);
	REFUSE(CHAT, b, "messages[1].content[0].cache_control", NULL, "'messages[1].content[0].cache_control' must be an object");
	const char *cc = "'cache_control': {'type': 'ephemeral'}";
	snprintf(b, sizeof(b),
		 "{'messages': [{'role': 'system', 'content': 's', %s}, {'role': 'user', 'content': 'a', %s}, {'role': "
		 "'assistant', 'content': 'b', %s}, {'role': 'user', 'content': 'c', %s}], %s}",
		 cc, cc, cc, cc, cc);
	REFUSE(CHAT, b, "cache_control", NULL, "at most 4 cache_control breakpoints (and prompt_cache_retention) per request");
	REFUSE(CMPL, "{'prompt': 'hi', 'prompt_cache_retention': 'forever'}", "prompt_cache_retention", NULL,
	       "'prompt_cache_retention' must be \"in_memory\" or \"24h\"");
	REFUSE(CMPL, "{'prompt': 'hi', 'prompt_cache_retention': 24}", "prompt_cache_retention", NULL, "must be \"in_memory\"");
	REFUSE(CMPL, "{'prompt': 'hi', 'prompt_cache_key': ''}", "prompt_cache_key", NULL,
	       "'prompt_cache_key' must be a string of 1-256 bytes");
	REFUSE(CMPL, "{'prompt': 'hi', 'prompt_cache_key': 5}", "prompt_cache_key", NULL, "1-256 bytes");
	REFUSE(CMPL, "{'prompt': 'hi', 'prompt_cache_key': 'a\\u0000b'}", "prompt_cache_key", NULL, "1-256 bytes");
	char *key = gen_body("{'prompt': 'hi', 'prompt_cache_key': '", "k", 257, "'}");
	for (char *c = key + 38; *c == 'k' || *c == ','; c++)
		*c = 'k';
	REFUSE(CMPL, key, "prompt_cache_key", NULL, "1-256 bytes");
	free(key);

	kvt_gen_request q;
	if (ACCEPT(CMPL, "{'prompt': 'hello world', 'cache_control': {'type': 'ephemeral', 'ttl': '1h'}, "
			 "'prompt_cache_retention': '24h', 'prompt_cache_key': 'team-a'}", &q)) {
		CHECK(q.cc.n_retain == 2 && q.sched.n_retain == 2 && !strcmp(q.cc.cache_key, "team-a"));
		CHECK(q.sched.retain[0].tokens == q.n_ids && q.sched.retain[0].ttl_s == 3600 && q.sched.retain[0].tier == -1);
		CHECK(q.sched.retain[1].tokens == q.n_ids && q.sched.retain[1].ttl_s == 86400 &&
		      q.sched.retain[1].tier == KVT_TIER_NVME);
	}
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'prompt_cache_retention': 'in_memory', 'cache_control': {'type': 'ephemeral'}}", &q))
		CHECK(q.cc.n_retain == 1 && q.sched.retain[0].ttl_s == 300);
	kvt_gen_request_deinit(&q);
	/* a breakpoint on the first message: a prefix of the prompt, shorter than it */
	snprintf(b, sizeof(b),
		 "{'messages': [{'role': 'system', 'content': [{'type': 'text', 'text': 'you are terse', 'cache_control': "
		 "{'type': 'ephemeral'}}]}, {'role': 'user', 'content': 'tell me about the weather today'}]}");
	if (ACCEPT(CHAT, b, &q))
		CHECK(q.cc.n_retain == 1 && q.sched.retain[0].tokens > 0 && q.sched.retain[0].tokens < q.n_ids);
	kvt_gen_request_deinit(&q);
}

/* ------------------------------------------------------------------------ */
/* chunk reuse: the marks, the spans they give, the top-level kvtier object   */

#define DOC_A "The quick brown fox jumps over the lazy dog near the river bank, twice a day."
#define DOC_B "Kvtier keeps the attention keys and values of every conversation it served."
#define DOC_C "{\"city\": \"Paris\", \"temperature\": 21, \"sky\": \"clear\", \"wind\": \"light\"}"
#define MARK "'kvtier': {'reuse': 'anywhere'}"

/* The tokens of text alone, as text (a span's own tokenization): *n of them, malloc'd. */
static int32_t *text_ids(const char *text, uint32_t *n)
{
	size_t cap = strlen(text) + 8, got = 0;
	int32_t *r = malloc(cap * sizeof(*r));
	CHECK(r && kvt_tok_encode(TOK, text, strlen(text), false, r, cap, &got) == KVT_OK);
	*n = (uint32_t)got;
	return r;
}

/*
 * Span i of q holds text: ids[start..start+n) are text's own tokens, whole
 * (exact) or less a first and/or last token merged at a boundary.
 */
static void span_is_at(int line, const kvt_gen_request *q, uint32_t i, const char *text, bool exact)
{
	CHECKF(i < q->sched.n_chunks, "line %d: span %u of %u", line, i, q->sched.n_chunks);
	if (i >= q->sched.n_chunks)
		return;
	uint32_t m, start = q->sched.chunks[i].start, n = q->sched.chunks[i].n;
	int32_t *r = text_ids(text, &m);
	CHECKF(start + n <= q->n_ids && n >= 1, "line %d: span %u [%u, +%u) of %u ids", line, i, start, n, q->n_ids);
	bool same = false;
	for (uint32_t a = 0; a < 2 && !same; a++)
		for (uint32_t b = 0; b < 2 && !same; b++)
			same = (!exact || (a == 0 && b == 0)) && m >= a + b && n == m - a - b && start + n <= q->n_ids &&
			       !memcmp(q->ids + start, r + a, n * sizeof(*r));
	CHECKF(same, "line %d: span %u [%u, +%u) is not the %u tokens of \"%.40s...\"", line, i, start, n, m, text);
	free(r);
}
#define SPAN_IS(q, i, text) span_is_at(__LINE__, q, i, text, true)

static void test_chunks(void)
{
	kvt_req_limits saved = LIM;
	char b[8192];
	uint32_t n_a;
	free(text_ids(DOC_A, &n_a));
	LIM.chunk_reuse = KVT_CHUNK_REUSE_MARKED;
	LIM.chunk_min_tokens = 8;
	CHECK(n_a >= 16);
	kvt_gen_request q;

	/* a message marked whole: its content's tokens; kvtier.chunk_recompute absent: -1 (the server's default) */
	snprintf(b, sizeof(b), "{'messages': [{'role': 'system', 'content': 'be brief'}, {'role': 'user', 'content': '%s', "
		 "%s}, {'role': 'user', 'content': 'and so?'}]}", DOC_A, MARK);
	if (ACCEPT(CHAT, b, &q)) {
		CHECK_EQ_INT(q.sched.n_chunks, 1);
		SPAN_IS(&q, 0, DOC_A);
		CHECK(q.sched.chunk_recompute < 0);
	}
	kvt_gen_request_deinit(&q);
	/* a content part marked: that part's text alone */
	snprintf(b, sizeof(b), "{'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'Read this:\\n'}, "
		 "{'type': 'text', 'text': '%s', %s}, {'type': 'text', 'text': '\\nThanks.'}]}]}", DOC_B, MARK);
	if (ACCEPT(CHAT, b, &q)) {
		CHECK_EQ_INT(q.sched.n_chunks, 1);
		SPAN_IS(&q, 0, DOC_B);
	}
	kvt_gen_request_deinit(&q);
	/* several, in prompt order and disjoint; the same text twice is two spans */
	snprintf(b, sizeof(b), "{'messages': [{'role': 'user', 'content': '%s', %s}, {'role': 'assistant', 'content': 'ok'}, "
		 "{'role': 'user', 'content': [{'type': 'text', 'text': 'now: '}, {'type': 'text', 'text': '%s', %s}]}, "
		 "{'role': 'user', 'content': '%s', %s}]}", DOC_A, MARK, DOC_B, MARK, DOC_A, MARK);
	if (ACCEPT(CHAT, b, &q)) {
		CHECK_EQ_INT(q.sched.n_chunks, 3);
		SPAN_IS(&q, 0, DOC_A);
		SPAN_IS(&q, 1, DOC_B);
		SPAN_IS(&q, 2, DOC_A);
		for (uint32_t i = 1; i < q.sched.n_chunks; i++)
			CHECK(q.sched.chunks[i].start >= q.sched.chunks[i - 1].start + q.sched.chunks[i - 1].n);
	}
	kvt_gen_request_deinit(&q);
	/* a part whose text merges with the one before it: found less its merged token, or ordinary text */
	snprintf(b, sizeof(b), "{'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'Kv'}, "
		 "{'type': 'text', 'text': 'tier%s', %s}]}]}", &DOC_B[6], MARK);
	if (ACCEPT(CHAT, b, &q) && q.sched.n_chunks) {
		char t[256];
		snprintf(t, sizeof(t), "tier%s", &DOC_B[6]);
		span_is_at(__LINE__, &q, 0, t, false);
	}
	kvt_gen_request_deinit(&q);
	/* the system message with the tools' description appended: the content alone */
	snprintf(b, sizeof(b), "{'messages': [{'role': 'system', 'content': '%s', %s}, {'role': 'user', 'content': 'hi'}], "
		 "'tools': [{'type': 'function', 'function': {'name': 'f', 'parameters': {'type': 'object'}}}]}", DOC_A, MARK);
	if (ACCEPT(CHAT, b, &q)) {
		CHECK_EQ_INT(q.sched.n_chunks, 1);
		SPAN_IS(&q, 0, DOC_A);
	}
	kvt_gen_request_deinit(&q);
	/* empty content, "reuse": "prefix", null, {}: no span */
	snprintf(b, sizeof(b), "{'messages': [{'role': 'user', 'content': '', %s}, {'role': 'user', 'content': '%s', "
		 "'kvtier': {'reuse': 'prefix'}}, {'role': 'user', 'content': '%s', 'kvtier': null}, {'role': 'user', "
		 "'content': [{'type': 'text', 'text': '%s', 'kvtier': {'reuse': null}}], 'kvtier': {}}]}", MARK, DOC_A, DOC_A,
		 DOC_B);
	if (ACCEPT(CHAT, b, &q))
		CHECK_EQ_INT(q.sched.n_chunks, 0);
	kvt_gen_request_deinit(&q);

	/* chunk_min_tokens: a shorter span is ordinary text */
	snprintf(b, sizeof(b), "{'messages': [{'role': 'user', 'content': '%s', %s}]}", DOC_A, MARK);
	LIM.chunk_min_tokens = n_a + 1;
	if (ACCEPT(CHAT, b, &q))
		CHECK_EQ_INT(q.sched.n_chunks, 0);
	kvt_gen_request_deinit(&q);
	LIM.chunk_min_tokens = n_a;
	if (ACCEPT(CHAT, b, &q)) {
		CHECK_EQ_INT(q.sched.n_chunks, 1);
		SPAN_IS(&q, 0, DOC_A);
	}
	kvt_gen_request_deinit(&q);
	LIM.chunk_min_tokens = 8;

	/* chunk_reuse = off: no spans, the marks still checked */
	LIM.chunk_reuse = KVT_CHUNK_REUSE_OFF;
	snprintf(b, sizeof(b), "{'messages': [{'role': 'user', 'content': '%s', %s}]}", DOC_A, MARK);
	if (ACCEPT(CHAT, b, &q))
		CHECK_EQ_INT(q.sched.n_chunks, 0);
	kvt_gen_request_deinit(&q);
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'a', 'kvtier': {'reuse': 'always'}}]}",
	       "messages[0].kvtier.reuse", NULL, "must be \"anywhere\"");

	/* chunk_reuse = tools: every tool message's content too (not one marked "prefix", nor one with a part marked) */
	const char *calls = "{'role': 'user', 'content': 'weather?'}, {'role': 'assistant', 'tool_calls': [{'id': 'c1', "
			    "'type': 'function', 'function': {'name': 'get', 'arguments': '{}'}}]}";
	snprintf(b, sizeof(b), "{'messages': [%s, {'role': 'tool', 'tool_call_id': 'c1', 'content': '%s'}]}", calls,
		 "{\\\"city\\\": \\\"Paris\\\", \\\"temperature\\\": 21, \\\"sky\\\": \\\"clear\\\", \\\"wind\\\": \\\"light\\\"}");
	LIM.chunk_reuse = KVT_CHUNK_REUSE_MARKED;
	if (ACCEPT(CHAT, b, &q))
		CHECK_EQ_INT(q.sched.n_chunks, 0);
	kvt_gen_request_deinit(&q);
	LIM.chunk_reuse = KVT_CHUNK_REUSE_TOOLS;
	if (ACCEPT(CHAT, b, &q)) {
		CHECK_EQ_INT(q.sched.n_chunks, 1);
		SPAN_IS(&q, 0, DOC_C);
	}
	kvt_gen_request_deinit(&q);
	snprintf(b, sizeof(b), "{'messages': [%s, {'role': 'tool', 'content': '%s', 'kvtier': {'reuse': 'prefix'}}]}", calls,
		 DOC_A);
	if (ACCEPT(CHAT, b, &q))
		CHECK_EQ_INT(q.sched.n_chunks, 0);
	kvt_gen_request_deinit(&q);
	snprintf(b, sizeof(b), "{'messages': [%s, {'role': 'tool', 'content': [{'type': 'text', 'text': 'result: '}, "
		 "{'type': 'text', 'text': '%s', %s}]}]}", calls, DOC_B, MARK);
	if (ACCEPT(CHAT, b, &q)) {
		CHECK_EQ_INT(q.sched.n_chunks, 1);
		SPAN_IS(&q, 0, DOC_B);
	}
	kvt_gen_request_deinit(&q);
	/* marked mode: a tool message marked whole is its content (inside the template's tool_response wrapper) */
	LIM.chunk_reuse = KVT_CHUNK_REUSE_MARKED;
	snprintf(b, sizeof(b), "{'messages': [%s, {'role': 'tool', 'content': '%s', %s}]}", calls, DOC_A, MARK);
	if (ACCEPT(CHAT, b, &q)) {
		CHECK_EQ_INT(q.sched.n_chunks, 1);
		SPAN_IS(&q, 0, DOC_A);
	}
	kvt_gen_request_deinit(&q);

	/* more than 16 marks: 400 on the 17th; more tool messages than that under tools: the latest 16 kept */
	char *many = gen_body("{'messages': [", "{'role': 'user', 'content': 'document number %d of the shelf', "
			      "'kvtier': {'reuse': 'anywhere'}}", KVT_SCHED_MAX_CHUNKS + 1, "]}");
	REFUSE(CHAT, many, "messages[16].kvtier", NULL, "at most 16 chunk marks");
	free(many);
	many = gen_body("{'messages': [{'role': 'user', 'content': [", "{'type': 'text', 'text': 'part %d. ', "
			"'kvtier': {'reuse': 'anywhere'}}", KVT_SCHED_MAX_CHUNKS + 1, "]}]}");
	REFUSE(CHAT, many, "messages[0].content[16].kvtier", NULL, "at most 16 chunk marks");
	free(many);
	LIM.chunk_reuse = KVT_CHUNK_REUSE_TOOLS;
	many = gen_body("{'messages': [", "{'role': 'tool', 'content': 'tool result number %d: the sky is clear'}",
			KVT_SCHED_MAX_CHUNKS + 4, "]}");
	if (ACCEPT(CHAT, many, &q)) {
		CHECK_EQ_INT(q.sched.n_chunks, KVT_SCHED_MAX_CHUNKS);
		SPAN_IS(&q, 0, "tool result number 4: the sky is clear");
		SPAN_IS(&q, KVT_SCHED_MAX_CHUNKS - 1, "tool result number 19: the sky is clear");
	}
	kvt_gen_request_deinit(&q);
	free(many);
	/* ... and a marked message is kept before them */
	snprintf(b, sizeof(b), "{'messages': [{'role': 'user', 'content': '%s', %s}, ", DOC_A, MARK);
	many = gen_body(b, "{'role': 'tool', 'content': 'tool result number %d: the sky is clear'}",
			KVT_SCHED_MAX_CHUNKS + 4, "]}");
	if (ACCEPT(CHAT, many, &q)) {
		CHECK_EQ_INT(q.sched.n_chunks, KVT_SCHED_MAX_CHUNKS);
		SPAN_IS(&q, 0, DOC_A);
		SPAN_IS(&q, 1, "tool result number 5: the sky is clear");
	}
	kvt_gen_request_deinit(&q);
	free(many);
	LIM.chunk_reuse = KVT_CHUNK_REUSE_MARKED;

	/* bad marks: 400 naming the field */
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'a', 'kvtier': 5}]}", "messages[0].kvtier", NULL,
	       "'messages[0].kvtier' must be an object {\"reuse\": \"anywhere\" | \"prefix\"}");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'a'}, {'role': 'user', 'content': 'b', 'kvtier': "
	       "{'reuse': 'everywhere'}}]}", "messages[1].kvtier.reuse", NULL,
	       "'messages[1].kvtier.reuse' must be \"anywhere\"");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'a', 'kvtier': {'reuse': true}}]}",
	       "messages[0].kvtier.reuse", NULL, "must be \"anywhere\"");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'a', 'kvtier': {'reuse': 'anywhere', 'ttl': 5}}]}",
	       "messages[0].kvtier", NULL, "'messages[0].kvtier' has an unknown field 'ttl' (allowed: reuse)");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'a', 'kvtier': {'reuse\\u0000': 'anywhere'}}]}",
	       "messages[0].kvtier", NULL, "has an unknown field 'reuse'");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'a'}, {'type': 'text', 'text': "
	       "'b', 'kvtier': {'reuse': 'Anywhere'}}]}]}", "messages[0].content[1].kvtier.reuse", NULL,
	       "must be \"anywhere\"");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'a', 'kvtier': []}]}]}",
	       "messages[0].content[0].kvtier", NULL, "must be an object");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'a', " MARK "}], " MARK "}]}",
	       "messages[0].content[0].kvtier", NULL, "marks a part of a message marked as a whole ('messages[0].kvtier')");

	/* the top-level kvtier object: chunk_recompute overrides the server's default */
	if (ACCEPT(CHAT, "{'messages': [{'role': 'user', 'content': 'a'}], 'kvtier': {'chunk_recompute': 0.3}}", &q))
		CHECK(q.sched.chunk_recompute == 0.3f);
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CHAT, "{'messages': [{'role': 'user', 'content': 'a'}], 'kvtier': {'chunk_recompute': 1}}", &q))
		CHECK(q.sched.chunk_recompute == 1.0f);
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': 'a', 'kvtier': {'chunk_recompute': 0}}", &q))
		CHECK(q.sched.chunk_recompute == 0.0f && q.sched.n_chunks == 0);
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': 'a', 'kvtier': {'chunk_recompute': null, 'reuse': null}}", &q))
		CHECK(q.sched.chunk_recompute < 0);
	kvt_gen_request_deinit(&q);
	if (ACCEPT(CMPL, "{'prompt': 'a', 'kvtier': null}", &q))
		CHECK(q.sched.chunk_recompute < 0);
	kvt_gen_request_deinit(&q);
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'a'}], 'kvtier': {'chunk_recompute': 1.5}}",
	       "kvtier.chunk_recompute", NULL, "'kvtier.chunk_recompute' must be a number in [0, 1]");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'a'}], 'kvtier': {'chunk_recompute': -0.01}}",
	       "kvtier.chunk_recompute", NULL, "must be a number in [0, 1]");
	REFUSE(CMPL, "{'prompt': 'a', 'kvtier': {'chunk_recompute': '0.2'}}", "kvtier.chunk_recompute", NULL,
	       "must be a number in [0, 1]");
	REFUSE(CMPL, "{'prompt': 'a', 'kvtier': 'fast'}", "kvtier", NULL, "'kvtier' must be an object");
	REFUSE(CMPL, "{'prompt': 'a', 'kvtier': {'recompute': 0.2}}", "kvtier", NULL,
	       "'kvtier' has an unknown field 'recompute' (allowed: chunk_recompute)");
	REFUSE(CMPL, "{'prompt': 'a', 'kvtier': {'reuse': 'anywhere'}}", "kvtier.reuse", NULL,
	       "chunk marks are for chat messages");
	REFUSE(CHAT, "{'messages': [{'role': 'user', 'content': 'a'}], 'kvtier': {'reuse': 'anywhere'}}", "kvtier.reuse",
	       NULL, "goes on a chat message ('messages[i].kvtier') or a content part");

	LIM = saved;
}

static void test_tenant_and_resume(void)
{
	char t[KVT_NAME_MAX + 1] = "default";
	kvt_req_err e;
	memset(&e, 0, sizeof(e));
	CHECK(kvt_req_tenant(NULL, 0, t, &e) == KVT_OK && !strcmp(t, "default"));
	CHECK(kvt_req_tenant("", 0, t, &e) == KVT_OK && !strcmp(t, "default"));
	CHECK(kvt_req_tenant("alice", 5, t, &e) == KVT_OK && !strcmp(t, "alice"));
	CHECK(kvt_req_tenant("ann@example.com", 15, t, &e) == KVT_OK);
	CHECKF(!strcmp(t, "_u.ann_example.com-71d4f55f72fa128dfb468a1a3901507c"), "%s", t); /* sha256: 71d4f55f... */
	char t2[KVT_NAME_MAX + 1];
	CHECK(kvt_req_tenant("ann#example.com", 15, t2, &e) == KVT_OK && strcmp(t, t2) != 0); /* same mapped bytes, other hash */
	CHECK(kvt_req_tenant(".x", 2, t, &e) == KVT_OK && !strncmp(t, "_u..x-", 6) && kvt_name_valid(t));
	/*
	 * A mapped name and a literal one never meet: a mapped name sent as `user`
	 * is mapped again (it has the prefix), so it is another tenant; the name
	 * the old mapping gave ann@example.com is a literal now, another tenant too.
	 */
	static const char *const users[] = { "ann@example.com", "bob smith", ".hidden", "_u.x", "a\x01b" };
	for (size_t i = 0; i < sizeof(users) / sizeof(users[0]); i++) {
		char m[KVT_NAME_MAX + 1], again[KVT_NAME_MAX + 1];
		CHECK(kvt_req_tenant(users[i], strlen(users[i]), m, &e) == KVT_OK && kvt_name_valid(m));
		CHECK(kvt_req_tenant(m, strlen(m), again, &e) == KVT_OK);
		CHECKF(strcmp(m, again) != 0 && strcmp(m, users[i]) != 0, "user '%s' -> tenant '%s'; '%s' as user -> '%s'",
		       users[i], m, m, again);
	}
	CHECK(kvt_req_tenant("ann_example.com-71d4f55f72fa128d", 32, t2, &e) == KVT_OK &&
	      !strcmp(t2, "ann_example.com-71d4f55f72fa128d"));
	CHECK(kvt_req_tenant("ann@example.com", 15, t, &e) == KVT_OK && strcmp(t, t2) != 0);
	char longest[KVT_REQ_USER_MAX + 1];
	memset(longest, '@', KVT_REQ_USER_MAX);
	longest[KVT_REQ_USER_MAX] = 0;
	CHECK(kvt_req_tenant(longest, KVT_REQ_USER_MAX, t, &e) == KVT_OK && kvt_name_valid(t) && strlen(t) == 3 + 64 + 1 + 32);
	char big[300];
	memset(big, 'a', sizeof(big));
	big[257] = 0;
	int rc = kvt_req_tenant(big, 257, t, &e);
	CHECK(rc == KVT_EINVAL && kvt_req_http_status(rc) == 400 && !strcmp(e.param, "user"));
	CHECK(strstr(e.message, "'user' must be at most 256 bytes (got 257)") != NULL);
	CHECK(kvt_req_tenant(big, 256, t, &e) == KVT_OK);
	/* through the request: an over-long user is refused; a free-form one maps; with API keys it is not read */
	char *b = gen_body("{'prompt': 'hi', 'user': '", "u", 257, "'}");
	for (char *c = b + 26; *c == 'u' || *c == ','; c++)
		*c = 'u';
	REFUSE(CMPL, b, "user", NULL, "'user' must be at most 256 bytes");
	LIM.tenant_from_user = false;
	kvt_gen_request q;
	if (ACCEPT(CMPL, b, &q))
		CHECK(q.sched.tenant[0] == 0);
	kvt_gen_request_deinit(&q);
	LIM.tenant_from_user = true;
	free(b);
	REFUSE(CMPL, "{'prompt': 'hi', 'user': 5}", "user", NULL, "'user' must be a string");
	if (ACCEPT(CMPL, "{'prompt': 'hi', 'user': 'bob smith'}", &q))
		CHECK(!strncmp(q.sched.tenant, "_u.bob_smith-", 13) && kvt_name_valid(q.sched.tenant));
	kvt_gen_request_deinit(&q);
	/* the tenant is set before a later field is refused (the request log names it) */
	json_t *body = json_loads("{\"prompt\": \"hi\", \"user\": \"carol\", \"stop\": 5}", 0, NULL);
	CHECK(kvt_gen_request_parse(&LIM, false, body, &q, &e) == KVT_EINVAL && !strcmp(q.sched.tenant, "carol"));
	kvt_gen_request_deinit(&q);
	json_decref(body);

	/* a resume's body */
	bool stream = false;
	const char *user = NULL;
	size_t n_user = 0;
	body = json_loads("{\"stream\": true, \"user\": \"dave\"}", 0, NULL);
	CHECK(kvt_req_resume_parse(body, &stream, &user, &n_user, &e) == KVT_OK && stream && n_user == 4 &&
	      !strcmp(user, "dave"));
	json_decref(body);
	body = json_loads("{\"stream\": \"yes\"}", 0, NULL);
	CHECK(kvt_req_resume_parse(body, &stream, &user, &n_user, &e) == KVT_EINVAL && !strcmp(e.param, "stream") &&
	      strstr(e.message, "'stream' must be a boolean"));
	json_decref(body);
	body = json_loads("{\"user\": 7}", 0, NULL);
	CHECK(kvt_req_resume_parse(body, &stream, &user, &n_user, &e) == KVT_EINVAL && !strcmp(e.param, "user"));
	json_decref(body);
	/* statuses */
	CHECK(kvt_req_http_status(KVT_EINVAL) == 400 && kvt_req_http_status(KVT_ENOMEM) == 500);
}

int main(void)
{
	char dir[] = "/tmp/kvt_req_XXXXXX", path[64];
	if (!mkdtemp(dir))
		return check_skip("test_request", "no temporary directory");
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
		return check_done("test_request");
	LIM = (kvt_req_limits){ .n_vocab = kvt_synth_llama_n_vocab(),
				.max_ctx = 2048, /* the synthetic vocabulary has few merges: a tool prompt is ~400 tokens */
				.max_tokens_limit = 64,
				.max_n = 4,
				.default_max_tokens = 16,
				.chunk_reuse = KVT_CHUNK_REUSE_MARKED,
				.chunk_min_tokens = 64,
				.tenant_from_user = true };
	CHECK(kvt_tok_n_vocab(TOK) == LIM.n_vocab);

	test_json();
	test_nul_keys();
	test_sampling();
	test_refused_fields();
	test_logprobs();
	test_stop();
	test_response_format();
	test_tools();
	test_prompt();
	test_messages();
	test_cache_control();
	test_chunks();
	test_tenant_and_resume();

	kvt_tok_destroy(TOK);
	return check_done("test_request");
}
