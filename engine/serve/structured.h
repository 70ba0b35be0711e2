/*
 * engine/serve/structured.h — what the OpenAI API asks of the output beyond
 * text: structured outputs (response_format), tool calls and logprobs, in
 * the wire shapes of docs/http-api.md. Request parsing (request.c) calls
 * these while it reads a request, the reply (reply.c) while it writes the
 * response; errors fill the one request-error record (serve_int.h); the engine side
 * is one kvt_grammar per request (grammar.h), so a constraint changes the
 * choice of tokens only, never the KV.
 *
 * JSON Schema is compiled into grammar text for the subset OpenAI's strict
 * mode supports (see structured.c); a keyword outside it is refused with
 * the keyword and where it is named, never ignored.
 *
 * Tools are rendered in one generic format (the default model's chat
 * template has no tool syntax): a description in the system message, calls
 * written by the model as
 *
 *   <tool_call>
 *   {"name": "NAME", "arguments": {...}}
 *   </tool_call>
 *
 * and tool results given back as user turns wrapped in <tool_response>.
 */
#ifndef KVT_STRUCTURED_H
#define KVT_STRUCTURED_H

#include "grammar.h"
#include "sampler.h"
#include "serve_int.h"

#include <jansson.h>

struct kvt_tok;

/*
 * Grammar text for a JSON Schema (malloc'd, rule "root"). param names the
 * field in errors. KVT_OK, or KVT_EINVAL with e filled for a schema outside the subset.
 */
int kvt_schema_grammar(json_t *schema, const char *param, char **text, kvt_req_err *e);

/* response_format (may be NULL / null): *g the grammar, NULL for "text". KVT_OK, or KVT_EINVAL with e. */
int kvt_oai_response_format(json_t *rf, kvt_grammar **g, kvt_req_err *e);

enum kvt_tool_choice {
	KVT_TOOLS_NONE = 0,     /* no tools, or tool_choice "none": plain text */
	KVT_TOOLS_AUTO = 1,     /* the model decides; calls parsed from its text */
	KVT_TOOLS_REQUIRED = 2, /* at least one call, enforced by the grammar */
	KVT_TOOLS_NAMED = 3,    /* a call of one function, enforced */
};

typedef struct kvt_oai_tools {
	json_t *tools;          /* the request's tools array (own reference), NULL if none */
	int choice;             /* enum kvt_tool_choice */
	char named[65];         /* KVT_TOOLS_NAMED: the function */
	bool parallel;          /* parallel_tool_calls (default true): more than one call allowed */
	kvt_grammar *g;         /* REQUIRED / NAMED: the calls' grammar (owned) */
} kvt_oai_tools;

/* tools, tool_choice, parallel_tool_calls of a chat body. KVT_OK, or KVT_EINVAL with e. */
int kvt_oai_tools_parse(json_t *body, kvt_oai_tools *t, kvt_req_err *e);
void kvt_oai_tools_deinit(kvt_oai_tools *t);
/* The tools' description for the system message (malloc'd); NULL when there is none to give. */
char *kvt_oai_tools_prompt(const kvt_oai_tools *t);

/*
 * The template role and text of a chat message that is not plain text: an
 * assistant turn with tool_calls (content may be null), a "tool" result.
 * KVT_OK with *special true and *role, *text (malloc'd), *n_text set if m is
 * such a message, *special false if it is not (the caller handles it);
 * KVT_EINVAL with e for a malformed one.
 */
int kvt_oai_message(json_t *m, size_t idx, bool *special, const char **role, char **text, size_t *n_text,
		    kvt_req_err *e);

/*
 * The tool calls in generated text: an array of {"id", "type": "function",
 * "function": {"name", "arguments"}} (arguments a JSON string), NULL if the
 * text holds none that parse. *content_len: the text before the first call.
 */
json_t *kvt_oai_tool_calls(const kvt_oai_tools *t, const char *text, size_t n, size_t *content_len);
/* Streaming: the bytes of text that may be sent as content now (the rest could be, or is, a tool call). */
size_t kvt_oai_content_ready(const char *text, size_t n);

/* Logprobs in OpenAI's shapes. A chat "content" entry for one token. */
json_t *kvt_oai_lp_chat(const struct kvt_tok *tok, const kvt_token_lp *lp);
/* A completions logprobs object ({"tokens": [], ...}) and one token added to it at text_offset. */
json_t *kvt_oai_lp_completion_new(void);
void kvt_oai_lp_completion_add(json_t *o, const struct kvt_tok *tok, const kvt_token_lp *lp, size_t text_offset);

#endif
