/*
 * engine/serve/request.h — a generation request's JSON body (POST
 * /v1/completions, /v1/chat/completions; docs/http-api.md) turned into the
 * scheduler's request, as pure functions: no connection, no scheduler, no
 * clock, no randomness. The HTTP layer (server.c) calls them, then submits;
 * tests/test_request.c calls them with a synthetic tokenizer and no model.
 *
 * Two steps, in the order the HTTP layer has always checked the fields (so a
 * body with two faults is refused for the same one as before):
 *
 *   1. kvt_gen_request_parse: every field but the prompt — sampling, n, stop,
 *      logprobs, seed, session_id / user / priority, stream options,
 *      response_format, tools (chat), the refused fields, the top-level
 *      "kvtier" object (chunk_recompute). JSON only: the limits (vocabulary,
 *      context, configured maxima) come in a struct.
 *   2. kvt_gen_request_prompt: the prompt — chat messages through the chat
 *      template (only the template's markers are special tokens), or a
 *      completion's string / token-id prompt (null: a new document) — then
 *      the context check (a prompt that leaves no room for one token is code
 *      "context_length_exceeded" on the prompt's field; one that leaves too
 *      little for the max_tokens it gave is refused on max_tokens; a default
 *      max_tokens is cut to fit), the echo text, the cache-control
 *      breakpoints and the chat's chunk spans (which need the tokens).
 *
 * Errors: KVT_OK; KVT_EINVAL with the error record filled (a 400 naming the
 * field: kvt_req_http_status); KVT_ENOMEM where the old handler answered
 * 500. A field sent as null counts as absent everywhere.
 */
#ifndef KVT_REQUEST_H
#define KVT_REQUEST_H

#include "cachectl.h"
#include "scheduler.h"
#include "server.h"
#include "serve_int.h"
#include "structured.h"
#include "tokenizer.h"

#include <jansson.h>

#define KVT_REQ_MAX_STOPS 4 /* stop strings per request */
#define KVT_REQ_USER_MAX 256 /* bytes of a request's `user` (OpenAI's limit) */
#define KVT_REQ_TENANT_MAPPED "_u." /* the prefix of a tenant mapped from `user`; no literal tenant has it */
#define KVT_REQ_TENANT_HASH_BYTES 16 /* SHA-256 bytes in a mapped tenant (hex: 32 digits) */

/* What a request is checked against (the model's and the configuration's limits). */
typedef struct kvt_req_limits {
	uint32_t n_vocab;            /* the model's vocabulary: token ids, top_k, logit_bias keys */
	uint32_t max_ctx;            /* context: the prompt plus max_tokens must fit */
	uint32_t max_tokens_limit;   /* largest max_tokens (server.max_tokens_limit) */
	uint32_t max_n;              /* largest n (server.max_n) */
	uint32_t default_max_tokens; /* max_tokens when absent */
	int chunk_reuse;             /* enum kvt_chunk_reuse ([cache] chunk_reuse): which chat spans are chunks
	                                (0, off: none; markers are still checked) */
	uint32_t chunk_min_tokens;   /* a span with fewer tokens is ordinary text ([cache] chunk_min_tokens; 0: none is) */
	bool tenant_from_user;       /* no API keys: `user` names the tenant (kvt_req_tenant) */
} kvt_req_limits;

/* A parsed generation request: what the scheduler gets, and what the reply needs. */
typedef struct kvt_gen_request {
	bool chat;                          /* /v1/chat/completions (else /v1/completions) */
	bool stream;                        /* stream: server-sent events */
	bool include_usage;                 /* stream_options.include_usage */
	bool have_seed;                     /* seed given; else the caller draws one into sched.sample.seed */
	bool parse_special;                 /* completions: a string prompt's special-token text is parsed (default true) */
	bool echo;                          /* completions: echo */
	const char *max_tokens_key;         /* "max_tokens", or "max_completion_tokens" when a chat body has it (static) */
	bool max_tokens_set;                /* the body gave max_tokens_key; else the default, cut (step 2) to what
	                                       the context leaves after the prompt */
	uint32_t n;                         /* choices, 1..max_n; choice i samples with sched.sample.seed + i */
	kvt_sched_req sched;                /* the scheduler request of choice 0: prompt points into ids; grammar an owned
	                                       reference; tenant "" unless `user` named one; session_id and retain are
	                                       choice 0's alone */
	kvt_oai_tools tools;                /* chat: tools, tool_choice, parallel_tool_calls (owned) */
	char *stops[KVT_REQ_MAX_STOPS];     /* non-empty stop strings, malloc'd (may hold NUL bytes) */
	size_t stop_len[KVT_REQ_MAX_STOPS]; /* their bytes */
	uint32_t n_stops;                   /* entries of stops */
	size_t max_stop_len;                /* longest stop string */
	int32_t *ids;                       /* [n_ids] the prompt tokens (step 2), malloc'd */
	uint32_t n_ids;                     /* prompt tokens */
	char *echo_text;                    /* completions echo: the prompt's text, NUL-terminated (step 2),
	                                       malloc'd; NULL: no echo */
	size_t n_echo;                      /* its bytes */
	kvt_cachectl cc;                    /* cache control: the prefixes to retain, prompt_cache_key (step 2) */
} kvt_gen_request;

/*
 * The request body as a JSON object. Strings and object keys may hold
 * \u0000 (OpenAI's schema allows both; a key's bytes are read by length,
 * json_object_keylen_foreach: json_object_foreach's key stops at the NUL).
 * An integer beyond 64 bits (in a field kvtier ignores, such as metadata)
 * makes the whole body parse again with every integer read as a real: the
 * fields kvtier reads take whole reals, and only a seed beyond 2^53 then
 * loses precision. KVT_OK with *out (the caller's reference); KVT_EINVAL
 * with e (code "invalid_json") for malformed JSON or a body that is not an
 * object; KVT_ENOMEM.
 */
int kvt_req_body_load(const char *body, size_t n, json_t **out, kvt_req_err *e);

/*
 * Step 1 (see the top): every field but the prompt into *q (zeroed first).
 * KVT_OK; KVT_EINVAL with e; KVT_ENOMEM. q->sched.tenant is set as soon as
 * `user` has been read, so it holds the tenant even when a later field is
 * refused (the request log names it). Deinit q whatever the result.
 */
int kvt_gen_request_parse(const kvt_req_limits *lim, bool chat, json_t *body, kvt_gen_request *q, kvt_req_err *e);

/*
 * Step 2: the prompt of body (the same body as step 1, which succeeded) with
 * tok (borrowed), then the context check, the echo text, the cache control
 * and (chat) the chunk spans. Sets q->ids, n_ids, sched.prompt,
 * sched.n_prompt, echo_text, cc, sched.retain and sched.chunks / n_chunks.
 * KVT_OK; KVT_EINVAL with e; KVT_ENOMEM.
 *
 * Chunk spans (docs/http-api.md, "Chunk reuse"): a message or a content
 * part marked "kvtier": {"reuse": "anywhere"} ("prefix", null or {}: not
 * marked; any other mark a 400 naming it), and under chunk_reuse = tools the
 * content of every role "tool" message not marked "prefix" and with no part
 * marked. Each span is its text's own tokens found in the prompt (a span
 * not found, or shorter than lim->chunk_min_tokens, is ordinary text); in
 * prompt order, disjoint. More than KVT_SCHED_MAX_CHUNKS marks is a 400 on
 * the first one over, whatever the mode; tool messages past the limit are
 * ordinary text, the earliest first. chunk_reuse = off: the marks are
 * checked, and no span is made.
 */
int kvt_gen_request_prompt(const kvt_req_limits *lim, const kvt_tok *tok, json_t *body, kvt_gen_request *q,
			   kvt_req_err *e);

/*
 * A session resume's optional body (POST /v1/sessions/{id}/resume):
 * "stream" (bool) and "user" (string; *user points into body, *n_user its
 * bytes). Fields left alone when absent. KVT_OK, or KVT_EINVAL with e.
 */
int kvt_req_resume_parse(json_t *body, bool *stream, const char **user, size_t *n_user, kvt_req_err *e);

/*
 * The chat prompt a body's "messages" (and "tools") make, as text: what
 * /v1/chat/completions would tokenize, without BOS (llama-server's
 * POST /apply-template). *out malloc'd. KVT_OK; KVT_EINVAL with e; KVT_ENOMEM.
 */
int kvt_req_chat_text(const kvt_tok *tok, json_t *body, char **out, kvt_req_err *e);
/* Free what q holds (the prompt, the stops, the echo, the grammar, the tools). A zeroed q is fine. */
void kvt_gen_request_deinit(kvt_gen_request *q);

/*
 * The tenant that `user` (n_user bytes, may hold NUL bytes) names when no
 * API keys are configured. Two spaces that never meet: a literal name is a
 * valid name (kvt_name_valid) that does not start with KVT_REQ_TENANT_MAPPED,
 * taken as it is; every other `user` (an email, text with spaces, or one that
 * starts with the prefix) is mapped to KVT_REQ_TENANT_MAPPED + its first 64
 * bytes with those outside [A-Za-z0-9._-] as '_' + '-' + 32 hex digits (128
 * bits) of its SHA-256. So a literal never equals a mapped name, and two
 * users share a mapped one only through a SHA-256 collision. An empty or NULL
 * user leaves tenant as it is. KVT_OK; KVT_EINVAL with e (param "user") over
 * KVT_REQ_USER_MAX bytes.
 */
int kvt_req_tenant(const char *user, size_t n_user, char tenant[KVT_NAME_MAX + 1], kvt_req_err *e);

/*
 * A chat message's "content" appended to b: a string (copied by length: it
 * may hold NUL bytes), or an array of {"type": "text", "text": string} parts
 * (other fields, such as cache_control and kvtier, are read elsewhere),
 * concatenated. KVT_OK; KVT_EINVAL with e (param as given) for another
 * shape. An allocation failure shows in b->failed.
 */
int kvt_req_content(kvt_sbuf *b, json_t *content, const char *param, kvt_req_err *e);

/* The HTTP status for a failed request step: 400 for KVT_EINVAL (a refusal), 500 otherwise. */
unsigned kvt_req_http_status(int rc);

/* Make s valid UTF-8 in place: a byte outside a well-formed sequence becomes '?'. */
void kvt_utf8_scrub(char *s);

#endif
