/* ctest-labels: unit */
/*
 * tests/test_schema_ws.c — the whitespace the JSON grammars of structured
 * outputs allow (structured.h: response_format json_schema and json_object,
 * the tools grammar), matched byte by byte without a vocabulary.
 *
 * Allowed: compact JSON, one space after ":" and ",", json.dumps-style
 * output indented by 2 or 4 spaces or a tab per level, "{ }" and "[ ]".
 * Refused at the first bad byte: whitespace before ":" or ",", a second
 * space or a newline after ":", two newlines, an indent of more than 4
 * bytes per level (a closing bracket one level less), and past the deepest
 * level with its own bound (6) more than 24 — the gaps where a weak model
 * spent its max_tokens ("\n,\n", "\"a\"\n:\n"). Each document is fed to a
 * fresh matcher and must also be able to end there.
 */
#include "check.h"
#include "structured.h"

#include <jansson.h>

/* A grammar from a response_format written with ' for " (NULL and a failed check if refused). */
static kvt_grammar *rf_grammar(const char *rf_text)
{
	char *t = strdup(rf_text);
	for (char *p = t; *p; p++)
		if (*p == '\'')
			*p = '"';
	json_error_t je;
	json_t *rf = json_loads(t, 0, &je);
	free(t);
	kvt_grammar *g = NULL;
	kvt_req_err e = { 0 };
	CHECKF(rf && kvt_oai_response_format(rf, &g, &e) == KVT_OK, "%s: %s", rf_text, e.message);
	json_decref(rf);
	return g;
}

/* Does g accept the whole of doc (and may it end there)? */
static bool accepts(const kvt_grammar *g, const char *doc)
{
	kvt_gmatch *m;
	if (!g || kvt_gmatch_create(g, NULL, &m))
		return false;
	bool ok = kvt_gmatch_feed(m, doc, strlen(doc)) && kvt_gmatch_can_end(m);
	kvt_gmatch_destroy(m);
	return ok;
}

#define ACCEPT(g, doc) CHECKF(accepts(g, doc), "refused: %s", doc)
#define REFUSE(g, doc) CHECKF(!accepts(g, doc), "accepted: %s", doc)

static const char PERSON[] = "{'type': 'json_schema', 'json_schema': {'name': 'p', 'schema': {'type': 'object', "
			     "'properties': {'name': {'type': 'string'}, 'age': {'type': 'integer'}, 'tags': "
			     "{'type': 'array', 'items': {'type': 'string'}}}, 'required': ['name', 'age'], "
			     "'additionalProperties': false}}}";

static void schema_gaps(void)
{
	kvt_grammar *g = rf_grammar(PERSON);
	/* the shapes a pretty-printer writes */
	ACCEPT(g, "{\"name\":\"Ada\",\"age\":3}");
	ACCEPT(g, "{\"name\": \"Ada\", \"age\": 3}");
	ACCEPT(g, "{ \"name\": \"Ada\", \"age\": 3 }");
	ACCEPT(g, "{\n  \"name\": \"Ada\",\n  \"age\": 3\n}");
	ACCEPT(g, "{\n    \"name\": \"Ada\",\n    \"age\": 3\n}");
	ACCEPT(g, "{\n\t\"name\": \"Ada\",\n\t\"age\": 3\n}");
	ACCEPT(g, "{\n  \"name\": \"Ada\",\n  \"age\": 3,\n  \"tags\": [\n    \"a\",\n    \"b\"\n  ]\n}");
	ACCEPT(g, "{\n    \"name\": \"Ada\",\n    \"age\": 3,\n    \"tags\": [\n        \"a\"\n    ]\n}");
	ACCEPT(g, "{\"name\": \"Ada\", \"age\": 3, \"tags\": []}");
	ACCEPT(g, "{\"name\": \"Ada\", \"age\": 3, \"tags\": [ ]}");
	ACCEPT(g, "{\"name\": \"  spaces\\n inside \", \"age\": 3}"); /* a string's contents are the model's */
	/* the gaps that burned tokens */
	REFUSE(g, "{\"name\"\n:\n\"Ada\", \"age\": 3}");
	REFUSE(g, "{\"name\" : \"Ada\", \"age\": 3}");
	REFUSE(g, "{\"name\": \"Ada\"\n,\n\"age\": 3}");
	REFUSE(g, "{\"name\": \"Ada\" , \"age\": 3}");
	REFUSE(g, "{\"name\":  \"Ada\", \"age\": 3}");
	REFUSE(g, "{\"name\":\n\"Ada\", \"age\": 3}");
	REFUSE(g, "{\n\n  \"name\": \"Ada\", \"age\": 3}");
	REFUSE(g, "{  \"name\": \"Ada\", \"age\": 3}");
	REFUSE(g, "{\n     \"name\": \"Ada\", \"age\": 3}");               /* 5 at level 1 */
	REFUSE(g, "{\n                        \"name\": \"Ada\", \"age\": 3}"); /* main's 24 */
	REFUSE(g, "{\"name\": \"Ada\", \"age\": 3\n  }");                  /* "}" of level 1: no indent */
	REFUSE(g, "{\"name\": \"Ada\", \"age\": 3, \"tags\": [\n         \"a\"]}"); /* 9 at level 2 */
	REFUSE(g, "{\"name\": \"Ada\", \"age\": 3}\n");                     /* nothing after the document */
	kvt_grammar_unref(g);

	/* an object with nothing required: "{}", "{ }", and no gap twice */
	g = rf_grammar("{'type': 'json_schema', 'json_schema': {'name': 'o', 'schema': {'type': 'object', "
		       "'properties': {'a': {'type': 'integer'}}}}}");
	ACCEPT(g, "{}");
	ACCEPT(g, "{ }");
	ACCEPT(g, "{\n  \"a\": 1\n}");
	REFUSE(g, "{  }");
	REFUSE(g, "{\n}");
	kvt_grammar_unref(g);

	/* a recursive $ref: each level has its own bound, the deepest ones share 24 */
	g = rf_grammar("{'type': 'json_schema', 'json_schema': {'name': 't', 'schema': {'$defs': {'n': {'type': "
		       "'object', 'properties': {'k': {'$ref': '#/$defs/n'}}}}, '$ref': '#/$defs/n'}}}");
	char doc[1024], *p = doc;
	for (int l = 1; l <= 8; l++)
		p += sprintf(p, "{\n%*s\"k\": ", 4 * (l < 6 ? l : 6), "");
	p += sprintf(p, "{}");
	for (int l = 8; l >= 1; l--)
		p += sprintf(p, "\n%*s}", 4 * ((l < 6 ? l : 6) - 1), "");
	ACCEPT(g, doc);
	REFUSE(g, "{\n  \"k\": {\n           \"k\": {}}}"); /* 11 at level 2 */
	kvt_grammar_unref(g);
}

static void json_object_gaps(void)
{
	kvt_grammar *g = rf_grammar("{'type': 'json_object'}");
	ACCEPT(g, "{}");
	ACCEPT(g, "{\"a\":[1,{\"b\":null}]}");
	ACCEPT(g, "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ]\n}");
	ACCEPT(g, "{\n\t\"a\": [\n\t\t1\n\t]\n}");
	REFUSE(g, "{\n  \"Ada\"\n:\n-1.1\n,\n\"Ada\"\n:\n-1.1\n}"); /* what SmolLM2 wrote under ignore_eos */
	REFUSE(g, "{\"a\": [1\n, 2]}");
	REFUSE(g, "{\"a\": [\n\n1]}");
	REFUSE(g, "[1]"); /* json_object: an object */
	kvt_grammar_unref(g);
}

static void tool_gaps(void)
{
	json_error_t je;
	json_t *body = json_loads("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\": "
				  "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
				  "\"required\": [\"city\"]}}}], \"tool_choice\": \"required\", "
				  "\"parallel_tool_calls\": false}",
				  0, &je);
	kvt_oai_tools t;
	kvt_req_err e = { 0 };
	CHECKF(body && kvt_oai_tools_parse(body, &t, &e) == KVT_OK && t.g, "tools: %s", e.message);
	/* the arguments are a member of the call's object: level 1, their members level 2 */
	ACCEPT(t.g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>");
	ACCEPT(t.g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\n    \"city\": \"Rome\"\n  }}\n</tool_call>");
	REFUSE(t.g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\"\n:\"Rome\"}}\n</tool_call>");
	REFUSE(t.g, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\n         \"city\": \"Rome\"}}\n</tool_call>");
	kvt_oai_tools_deinit(&t);
	json_decref(body);
}

int main(void)
{
	schema_gaps();
	json_object_gaps();
	tool_gaps();
	return check_done("test_schema_ws");
}
