/*
 * engine/serve/llama_api.c — llama.cpp's llama-server native API on kvtierd,
 * for clients and scripts switching from it (docs/http-api.md, "llama-server
 * API"): GET /props, GET /slots, POST /tokenize, /detokenize,
 * /apply-template, /completion, and POST /slots/{id}?action=save|restore|erase,
 * with llama-server's names, shapes and status codes; and the "timings"
 * object it adds to every generation (here on /v1/completions and
 * /v1/chat/completions too, through reply.c).
 *
 * Slots are sessions. --parallel N (server.parallel) exposes slots 0..N-1;
 * slot i is the session "slot-i" of the request's tenant (the key's, else
 * "default"). A /completion with id_slot runs as a turn of that session, so
 * the slot's history is its last prompt and reply, and its KV is whatever
 * the tiers hold for it; id_slot -1 takes the lowest idle slot (none idle:
 * no slot, the request still runs). The scheduler batches every request as
 * usual: a slot is a name, not a reserved place in the batch. Save writes a
 * snapshot (sessions_snapshot.c: the history plus the records of its cached blocks,
 * fingerprinted and checksummed), restore enters those blocks back into the
 * tiers so the next turn finds them cached, erase forgets the session.
 *
 * What differs from llama-server:
 *  - /completion is run by kvtier's completion path: its body is rewritten
 *    into a /v1/completions body (n_predict -> max_tokens, repeat_penalty ->
 *    repetition_penalty, logit_bias pairs -> an object, json_schema ->
 *    response_format), so a refusal names kvtier's field; the sampling fields
 *    kvtier has no sampler for (mirostat, dry_*, xtc_*, typical_p, n_probs,
 *    ...) are accepted and ignored, "grammar" (GBNF) is refused; n_predict -1
 *    means server.default_max_tokens cut to the context, 0 generates one
 *    token; cache_prompt is always on (kvtier caches every prompt); one prompt
 *    per request (a list of prompts is refused); "tokens" (the generated ids)
 *    is always filled, return_tokens or not; no "data: [DONE]" ends a stream,
 *    as in llama-server;
 *  - chat_template in /props names the template family kvtier renders
 *    (kvtier has no Jinja); the generation settings report llama-server's
 *    defaults that kvtier applies (temperature 0.8, top_k 40, top_p 0.95,
 *    min_p 0.05) and n_ctx;
 *  - save and restore act on the slot's committed session, whether or not a
 *    request runs in it (llama-server waits for the slot); a save holds the
 *    blocks the tiers have, a restore brings them into host memory;
 *  - errors have kvtier's error object (message, type, param, code).
 *
 * Every handler runs on an MHD worker thread and only reads the server and
 * the scheduler through their thread-safe calls.
 */
#include "server_int.h"

#include "tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LLAMA_SLOT_PREFIX "slot-"
#define LLAMA_FILENAME_MAX 255

/* llama-server's /completion defaults that kvtier's sampler has. */
#define LLAMA_DEF_TEMPERATURE 0.8
#define LLAMA_DEF_TOP_K 40
#define LLAMA_DEF_TOP_P 0.95
#define LLAMA_DEF_MIN_P 0.05

int kvt_llama_route(const char *path)
{
	static const char *const gets[] = { "/props", "/slots" };
	static const char *const posts[] = { "/completion", "/tokenize", "/detokenize", "/apply-template" };
	for (size_t i = 0; i < sizeof(gets) / sizeof(gets[0]); i++)
		if (!strcmp(path, gets[i]))
			return 1;
	for (size_t i = 0; i < sizeof(posts) / sizeof(posts[0]); i++)
		if (!strcmp(path, posts[i]))
			return 2;
	return strncmp(path, "/slots/", 7) == 0 && path[7] ? 2 : 0;
}

static uint32_t n_slots(const kvt_server *srv)
{
	uint32_t n = srv->cfg.n_slots;
	return n < 1 ? 1 : n > KVT_SERVER_MAX_SLOTS ? KVT_SERVER_MAX_SLOTS : n;
}

static void slot_session(int slot, char out[KVT_NAME_MAX + 1])
{
	snprintf(out, KVT_NAME_MAX + 1, LLAMA_SLOT_PREFIX "%d", slot);
}

/* ---- timings and the shapes of a completion ---------------------------- */

json_t *kvt_llama_timings(const kvt_sched_usage *u)
{
	const uint32_t prompt_n = u->prompt_tokens - (u->cached_tokens < u->prompt_tokens ? u->cached_tokens : u->prompt_tokens);
	double prompt_ms = (u->ttft_s - u->queue_s) * 1e3, predicted_ms = (u->total_s - u->ttft_s) * 1e3;
	if (prompt_ms < 0)
		prompt_ms = 0;
	if (predicted_ms < 0)
		predicted_ms = 0;
	const uint32_t predicted_n = u->completion_tokens;
	return json_pack("{s:i, s:i, s:f, s:f, s:f, s:i, s:f, s:f, s:f}", "cache_n", (json_int_t)u->cached_tokens,
			 "prompt_n", (json_int_t)prompt_n, "prompt_ms", prompt_ms, "prompt_per_token_ms",
			 prompt_n ? prompt_ms / prompt_n : 0.0, "prompt_per_second",
			 prompt_ms > 0 ? prompt_n * 1e3 / prompt_ms : 0.0, "predicted_n", (json_int_t)predicted_n,
			 "predicted_ms", predicted_ms, "predicted_per_token_ms",
			 predicted_n ? predicted_ms / predicted_n : 0.0, "predicted_per_second",
			 predicted_ms > 0 ? predicted_n * 1e3 / predicted_ms : 0.0);
}

/* The text of ids (the streaming decoder: whole characters, a broken one as U+FFFD); NULL: out of memory. */
static char *ids_text(const kvt_tok *tok, const int32_t *ids, size_t n, size_t *n_out)
{
	kvt_sbuf b = { 0 };
	kvt_tok_stream ds;
	kvt_tok_stream_init(&ds);
	char buf[1024];
	size_t k;
	kvt_sbuf_add(&b, "", 0);
	for (size_t i = 0; i < n; i++)
		if (kvt_tok_stream_push(tok, &ds, ids[i], buf, sizeof(buf), &k) == KVT_OK)
			kvt_sbuf_add(&b, buf, k);
	if (kvt_tok_stream_flush(&ds, buf, sizeof(buf), &k) == KVT_OK)
		kvt_sbuf_add(&b, buf, k);
	if (b.failed) {
		free(b.p);
		return NULL;
	}
	*n_out = b.n;
	return b.p;
}

/* The sampling settings a request ran with (llama-server's "params"), from the parsed request or the defaults. */
static json_t *params_json(const kvt_gen_request *q, uint32_t n_ctx)
{
	json_t *stop = json_array();
	for (uint32_t i = 0; q && i < q->n_stops; i++)
		json_array_append_new(stop, json_stringn(q->stops[i], q->stop_len[i]));
	const kvt_sampler_params *sp = q ? &q->sched.sample : NULL;
	return json_pack("{s:i, s:I, s:f, s:i, s:f, s:f, s:f, s:f, s:f, s:o, s:b, s:b, s:i, s:i}", "n_predict",
			 q && q->max_tokens_set ? (json_int_t)q->sched.max_tokens : (json_int_t)-1, "seed",
			 sp ? (json_int_t)sp->seed : (json_int_t)4294967295u, "temperature",
			 sp ? (double)sp->temp : LLAMA_DEF_TEMPERATURE, "top_k",
			 sp ? (json_int_t)sp->top_k : (json_int_t)LLAMA_DEF_TOP_K, "top_p",
			 sp ? (double)sp->top_p : LLAMA_DEF_TOP_P, "min_p", sp ? (double)sp->min_p : LLAMA_DEF_MIN_P,
			 "repeat_penalty", sp ? (double)sp->repetition_penalty : 1.0, "presence_penalty",
			 sp ? (double)sp->presence_penalty : 0.0, "frequency_penalty",
			 sp ? (double)sp->frequency_penalty : 0.0, "stop", stop, "ignore_eos", q && q->sched.ignore_eos,
			 "stream", q ? q->stream : true, "n_ctx", (json_int_t)n_ctx, "n_probs", 0);
}

static const char *stop_type(const gen_choice *c)
{
	if (c->stop_hit)
		return "word";
	if (c->finish == KVT_FINISH_STOP)
		return "eos";
	if (c->finish == KVT_FINISH_LENGTH)
		return "limit";
	return "none";
}

/* The choice's generated ids from the first not yet sent (all for a final body) as a JSON array; marks them sent. */
static json_t *ids_json(gen_choice *c, bool from_sent)
{
	json_t *a = json_array();
	const int32_t *ids = (const int32_t *)(void *)c->ids.p;
	const size_t n = c->ids.n / sizeof(int32_t);
	for (size_t k = from_sent ? c->n_ids_sent : 0; k < n; k++)
		json_array_append_new(a, json_integer(ids[k]));
	c->n_ids_sent = n;
	return a;
}

/* The fields llama-server's final /completion object has; content given. */
static json_t *llama_final(const gen_job *j, gen_choice *c, const char *text, size_t n, bool stream)
{
	const kvt_sched_usage *u = &c->usage;
	size_t n_prompt = 0;
	char *prompt = ids_text(j->tok, j->q.ids, j->q.n_ids, &n_prompt);
	/* with one stop string the match is that one; with several, kvtier does not keep which (see the file comment) */
	const char *word = c->stop_hit && j->q.n_stops == 1 ? j->q.stops[0] : "";
	const size_t n_word = c->stop_hit && j->q.n_stops == 1 ? j->q.stop_len[0] : 0;
	json_t *v = json_pack("{s:i, s:s%, s:o, s:i, s:b, s:s, s:i, s:i, s:o, s:s%, s:b, s:b, s:s, s:s%, s:i, s:o}",
			      "index", 0, "content", text, n, "tokens", ids_json(c, stream), "id_slot", (json_int_t)j->slot, "stop", 1,
			      "model", j->srv->model_id, "tokens_predicted", (json_int_t)u->completion_tokens,
			      "tokens_evaluated", (json_int_t)u->prompt_tokens, "generation_settings",
			      params_json(&j->q, kvt_sched_max_ctx(atomic_load(&j->srv->sched))), "prompt",
			      prompt ? prompt : "", prompt ? n_prompt : 0, "has_new_line", memchr(text, '\n', n) != NULL,
			      "truncated", u->prompt_tokens + u->completion_tokens >= kvt_sched_max_ctx(atomic_load(&j->srv->sched)),
			      "stop_type", stop_type(c), "stopping_word", word, n_word, "tokens_cached",
			      (json_int_t)u->cached_tokens, "timings", kvt_llama_timings(u));
	free(prompt);
	return v;
}

json_t *kvt_llama_result(gen_job *j)
{
	gen_choice *c = &j->ch[0];
	return llama_final(j, c, c->text.p ? c->text.p : "", c->text.n, false);
}

json_t *kvt_llama_chunk(gen_job *j, uint32_t i, const char *text, size_t n, const char *finish)
{
	gen_choice *c = &j->ch[i];
	if (finish)
		return llama_final(j, c, "", 0, true);
	return json_pack("{s:i, s:s%, s:o, s:b, s:i, s:i, s:i}", "index", (json_int_t)i, "content", text ? text : "",
			 text ? n : 0, "tokens", ids_json(c, true), "stop", 0, "id_slot", (json_int_t)j->slot,
			 "tokens_predicted", (json_int_t)c->n_tokens, "tokens_evaluated", (json_int_t)j->q.n_ids);
}

/* ---- GET /props, GET /slots -------------------------------------------- */

/* One slot's state object (llama-server's /slots entry; /props' default_generation_settings is slot 0's). */
static json_t *slot_json(conn_req *r, kvt_sched *sched, int id)
{
	const bool busy = atomic_load(&r->srv->slot_busy[id]) > 0;
	char sid[KVT_NAME_MAX + 1];
	uint32_t n_tokens = 0;
	slot_session(id, sid);
	(void)kvt_slot_tokens(sched, r->tenant, sid, &n_tokens);
	return json_pack("{s:i, s:i, s:i, s:b, s:b, s:o, s:s, s:{s:b, s:b, s:i, s:i, s:s}, s:{s:s, s:i}}", "id",
			 (json_int_t)id, "id_task", -1, "n_ctx", (json_int_t)kvt_sched_max_ctx(sched), "speculative", 0,
			 "is_processing", busy, "params", params_json(NULL, kvt_sched_max_ctx(sched)), "prompt", "",
			 "next_token", "has_next_token", busy, "has_new_line", 0, "n_remain", -1, "n_decoded", 0,
			 "stopping_word", "", "kvtier", "session_id", sid, "n_tokens", (json_int_t)n_tokens);
}

static enum MHD_Result handle_props(conn_req *r, kvt_sched *sched, const kvt_tok *tok)
{
	const kvt_server_config *c = &r->srv->cfg;
	json_t *v = json_pack("{s:o, s:i, s:s, s:s, s:s, s:s, s:{}, s:{s:b, s:b}, s:b, s:{s:b}}",
			      "default_generation_settings", slot_json(r, sched, 0), "total_slots",
			      (json_int_t)n_slots(r->srv), "model_path", c->model_path ? c->model_path : r->srv->model_id,
			      "model_alias", r->srv->model_id, "build_info", c->build_info ? c->build_info : "kvtier",
			      "chat_template", kvt_tok_chat_name(kvt_tok_chat_kind(tok)), "chat_template_caps",
			      "modalities", "vision", 0, "audio", 0, "is_sleeping", 0, "kvtier", "slot_save",
			      c->slot_save_path && c->slot_save_path[0]);
	return kvt_srv_reply_json(r, 200, v, false);
}

static enum MHD_Result handle_slots(conn_req *r, kvt_sched *sched)
{
	const char *fail = MHD_lookup_connection_value(r->con, MHD_GET_ARGUMENT_KIND, "fail_on_no_slot");
	json_t *a = json_array();
	bool idle = false;
	for (uint32_t i = 0; i < n_slots(r->srv); i++) {
		idle |= atomic_load(&r->srv->slot_busy[i]) == 0;
		json_array_append_new(a, slot_json(r, sched, (int)i));
	}
	if (fail && strcmp(fail, "0") && !idle) {
		json_decref(a);
		return kvt_srv_reply_error(r, 503, NULL, "no_slot_available", "no slot available");
	}
	return kvt_srv_reply_json(r, 200, a, false);
}

/* ---- POST /tokenize, /detokenize, /apply-template ---------------------- */

/* The body as a JSON object, or a 400 queued (*ret). */
static json_t *load_body(conn_req *r, enum MHD_Result *ret)
{
	kvt_req_err e = { { 0 }, { 0 }, { 0 } };
	json_t *body = NULL;
	if (kvt_req_body_load(r->body.p, r->body.n, &body, &e) != KVT_OK) {
		*ret = kvt_srv_reply_req_error(r, 400, &e);
		return NULL;
	}
	return body;
}

/* A boolean field (absent or null: def); false with a 400 queued for another type. */
static bool get_flag(conn_req *r, json_t *body, const char *key, bool def, bool *out, enum MHD_Result *ret)
{
	json_t *v = json_object_get(body, key);
	*out = def;
	if (!v || json_is_null(v))
		return true;
	if (!json_is_boolean(v)) {
		*ret = kvt_srv_reply_error(r, 400, key, NULL, "'%s' must be a boolean", key);
		return false;
	}
	*out = json_is_true(v);
	return true;
}

/* One token with its piece: a string when its bytes are valid UTF-8 alone, else their values. */
static json_t *token_piece(const kvt_tok *tok, int32_t id)
{
	const char *bytes = "";
	size_t len = 0;
	(void)kvt_tok_token_bytes(tok, id, &bytes, &len);
	json_t *piece = json_stringn(bytes, len); /* NULL: not valid UTF-8 */
	if (!piece) {
		piece = json_array();
		for (size_t i = 0; i < len; i++)
			json_array_append_new(piece, json_integer((unsigned char)bytes[i]));
	}
	return json_pack("{s:i, s:o}", "id", (json_int_t)id, "piece", piece);
}

static enum MHD_Result handle_tokenize(conn_req *r, const kvt_tok *tok)
{
	enum MHD_Result ret = MHD_YES;
	json_t *body = load_body(r, &ret), *content = json_object_get(body, "content");
	bool add_special, parse_special, pieces;
	if (!body)
		return ret;
	if (!get_flag(r, body, "add_special", false, &add_special, &ret) ||
	    !get_flag(r, body, "parse_special", true, &parse_special, &ret) ||
	    !get_flag(r, body, "with_pieces", false, &pieces, &ret))
		goto out;
	if (!json_is_string(content)) {
		ret = kvt_srv_reply_error(r, 400, "content", NULL, "'content' (the text to tokenize) must be a string");
		goto out;
	}
	const char *text = json_string_value(content);
	size_t n_text = json_string_length(content), n = 0;
	(void)kvt_tok_encode(tok, text, n_text, parse_special, NULL, 0, &n);
	const bool bos = add_special && kvt_tok_add_bos(tok) && kvt_tok_bos(tok) >= 0;
	int32_t *ids = malloc((n + 2) * sizeof(*ids));
	if (!ids || kvt_tok_encode(tok, text, n_text, parse_special, ids + bos, n + 1, &n) != KVT_OK) {
		free(ids);
		ret = kvt_srv_reply_error(r, 500, NULL, NULL, "tokenizing failed");
		goto out;
	}
	if (bos)
		ids[0] = kvt_tok_bos(tok);
	json_t *a = json_array();
	for (size_t i = 0; i < n + bos; i++)
		json_array_append_new(a, pieces ? token_piece(tok, ids[i]) : json_integer(ids[i]));
	free(ids);
	ret = kvt_srv_reply_json(r, 200, json_pack("{s:o}", "tokens", a), false);
out:
	json_decref(body);
	return ret;
}

static enum MHD_Result handle_detokenize(conn_req *r, const kvt_tok *tok)
{
	enum MHD_Result ret = MHD_YES;
	json_t *body = load_body(r, &ret), *tokens = json_object_get(body, "tokens");
	if (!body)
		return ret;
	size_t n = json_array_size(tokens), n_text = 0;
	int32_t *ids = malloc((n + 1) * sizeof(*ids));
	if (!ids) {
		ret = kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
		goto out;
	}
	if (tokens && !json_is_array(tokens) && !json_is_null(tokens)) {
		ret = kvt_srv_reply_error(r, 400, "tokens", NULL, "'tokens' must be an array of token ids");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *t = json_array_get(tokens, i);
		json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
		if (id < 0 || id >= (json_int_t)kvt_tok_n_vocab(tok)) {
			ret = kvt_srv_reply_error(r, 400, "tokens", NULL, "tokens[%zu] is not a token id in [0, %u)", i,
						  kvt_tok_n_vocab(tok));
			goto out;
		}
		ids[i] = (int32_t)id;
	}
	char *text = ids_text(tok, ids, n, &n_text);
	ret = text ? kvt_srv_reply_json(r, 200, json_pack("{s:s%}", "content", text, n_text), false)
		   : kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
	free(text);
out:
	free(ids);
	json_decref(body);
	return ret;
}

static enum MHD_Result handle_apply_template(conn_req *r, const kvt_tok *tok)
{
	enum MHD_Result ret = MHD_YES;
	json_t *body = load_body(r, &ret);
	if (!body)
		return ret;
	kvt_req_err e = { { 0 }, { 0 }, { 0 } };
	char *prompt = NULL;
	int rc = kvt_req_chat_text(tok, body, &prompt, &e);
	if (rc == KVT_OK)
		ret = kvt_srv_reply_json(r, 200, json_pack("{s:s}", "prompt", prompt), false);
	else
		ret = kvt_req_http_status(rc) == 400 ? kvt_srv_reply_req_error(r, 400, &e)
						     : kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
	free(prompt);
	json_decref(body);
	return ret;
}

/* ---- POST /completion --------------------------------------------------- */

/* A number field as given, else def (absent or null). false: not a number (400 queued). */
static bool copy_num(conn_req *r, json_t *in, json_t *out, const char *from, const char *to, double def,
		     enum MHD_Result *ret)
{
	json_t *v = json_object_get(in, from);
	if (!v || json_is_null(v)) {
		if (!isnan(def)) /* a default to apply */
			json_object_set_new(out, to, json_real(def));
		return true;
	}
	if (!json_is_number(v)) {
		*ret = kvt_srv_reply_error(r, 400, from, NULL, "'%s' must be a number", from);
		return false;
	}
	json_object_set(out, to, v);
	return true;
}

/* llama-server's logit_bias ([[id, bias | false], ...], or an object) as kvtier's object. */
static bool copy_logit_bias(conn_req *r, json_t *in, json_t *out, enum MHD_Result *ret)
{
	json_t *lb = json_object_get(in, "logit_bias");
	if (!lb || json_is_null(lb) || json_is_object(lb)) {
		if (lb && json_is_object(lb))
			json_object_set(out, "logit_bias", lb);
		return true;
	}
	json_t *o = json_object();
	size_t i;
	json_t *pair;
	json_array_foreach(lb, i, pair)
	{
		json_t *id = json_array_get(pair, 0), *b = json_array_get(pair, 1);
		if (!json_is_integer(id) || !(json_is_number(b) || json_is_false(b))) {
			json_decref(o);
			*ret = kvt_srv_reply_error(r, 400, "logit_bias", NULL,
						   "'logit_bias' pairs must be [token id, bias or false] (token strings are "
						   "not supported)");
			return false;
		}
		char key[24];
		snprintf(key, sizeof(key), "%lld", (long long)json_integer_value(id));
		json_object_set_new(o, key, json_real(json_is_false(b) ? -100.0 : json_number_value(b)));
	}
	json_object_set_new(out, "logit_bias", o);
	return true;
}

/* The sampling fields, with llama-server's defaults where kvtier's differ. */
static bool copy_sampling(conn_req *r, json_t *in, json_t *out, enum MHD_Result *ret)
{
	const double none = NAN;
	if (!copy_num(r, in, out, "temperature", "temperature", LLAMA_DEF_TEMPERATURE, ret) ||
	    !copy_num(r, in, out, "top_p", "top_p", LLAMA_DEF_TOP_P, ret) ||
	    !copy_num(r, in, out, "min_p", "min_p", LLAMA_DEF_MIN_P, ret) ||
	    !copy_num(r, in, out, "presence_penalty", "presence_penalty", none, ret) ||
	    !copy_num(r, in, out, "frequency_penalty", "frequency_penalty", none, ret) ||
	    !copy_num(r, in, out, "repeat_penalty", "repetition_penalty", none, ret) || !copy_logit_bias(r, in, out, ret))
		return false;
	json_t *t = json_object_get(out, "temperature"), *k = json_object_get(in, "top_k");
	if (json_number_value(t) < 0) /* llama-server: a negative temperature is greedy */
		json_object_set_new(out, "temperature", json_real(0));
	if (k && !json_is_null(k) && !json_is_integer(k)) {
		*ret = kvt_srv_reply_error(r, 400, "top_k", NULL, "'top_k' must be an integer");
		return false;
	}
	json_int_t top_k = k && json_is_integer(k) ? json_integer_value(k) : LLAMA_DEF_TOP_K;
	json_object_set_new(out, "top_k", json_integer(top_k < 0 ? 0 : top_k));
	return true;
}

/* n_predict, seed, stop, stream, ignore_eos, json_schema; grammar refused. */
static bool copy_control(conn_req *r, json_t *in, json_t *out, enum MHD_Result *ret)
{
	json_t *np = json_object_get(in, "n_predict"), *seed = json_object_get(in, "seed"), *g = json_object_get(in, "grammar");
	if (g && !json_is_null(g) && !(json_is_string(g) && !json_string_length(g))) {
		*ret = kvt_srv_reply_error(r, 400, "grammar", NULL,
					   "GBNF grammars are not supported by kvtier; use json_schema (or response_format)");
		return false;
	}
	if (np && !json_is_null(np)) {
		if (!json_is_integer(np)) {
			*ret = kvt_srv_reply_error(r, 400, "n_predict", NULL, "'n_predict' must be an integer");
			return false;
		}
		json_int_t v = json_integer_value(np);
		if (v >= 0) /* -1 (infinity): the default, cut to the context */
			json_object_set_new(out, "max_tokens", json_integer(v ? v : 1));
	}
	if (json_is_integer(seed) && json_integer_value(seed) >= 0)
		json_object_set(out, "seed", seed);
	static const char *const pass[] = { "stop", "stream", "ignore_eos", "prompt" };
	for (size_t i = 0; i < sizeof(pass) / sizeof(pass[0]); i++)
		if (json_object_get(in, pass[i]))
			json_object_set(out, pass[i], json_object_get(in, pass[i]));
	json_t *schema = json_object_get(in, "json_schema");
	if (schema && !json_is_null(schema))
		json_object_set_new(out, "response_format",
				    json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema", "name",
					      "json_schema", "schema", schema));
	return true;
}

/* id_slot: a slot (>= 0), or -1 for the lowest idle one (none idle: KVT_SRV_LLAMA_NO_SLOT). false: 400 queued. */
static bool pick_slot(conn_req *r, json_t *in, int *slot, enum MHD_Result *ret)
{
	json_t *v = json_object_get(in, "id_slot");
	json_int_t id = v && json_is_integer(v) ? json_integer_value(v) : -1;
	if (v && !json_is_null(v) && (!json_is_integer(v) || id < -1 || id >= (json_int_t)n_slots(r->srv))) {
		*ret = kvt_srv_reply_error(r, 400, "id_slot", NULL, "'id_slot' must be -1 or a slot id in [0, %u)",
					   n_slots(r->srv));
		return false;
	}
	*slot = (int)id;
	for (uint32_t i = 0; id < 0 && i < n_slots(r->srv) && *slot < 0; i++)
		if (atomic_load(&r->srv->slot_busy[i]) == 0)
			*slot = (int)i;
	return true;
}

static enum MHD_Result handle_completion(conn_req *r, kvt_sched *sched, const kvt_tok *tok)
{
	enum MHD_Result ret = MHD_YES;
	json_t *in = load_body(r, &ret), *out = json_object();
	int slot = KVT_SRV_LLAMA_NO_SLOT;
	char *text = NULL;
	if (!in)
		goto done;
	json_t *p = json_object_get(in, "prompt");
	if (json_is_array(p) && json_array_size(p) > 1 && !json_is_integer(json_array_get(p, 0))) {
		ret = kvt_srv_reply_error(r, 400, "prompt", NULL, "one prompt per request: a string or an array of token ids");
		goto done;
	}
	if (!out || !copy_sampling(r, in, out, &ret) || !copy_control(r, in, out, &ret) || !pick_slot(r, in, &slot, &ret))
		goto done;
	if (slot >= 0) {
		char sid[KVT_NAME_MAX + 1];
		slot_session(slot, sid);
		json_object_set_new(out, "session_id", json_string(sid));
	}
	if (!(text = json_dumps(out, JSON_COMPACT))) {
		ret = kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
		goto done;
	}
	/* the rewritten body is what kvtier's completion path parses */
	free(r->body.p);
	r->body = (kvt_sbuf){ .p = text, .n = strlen(text), .cap = strlen(text) + 1 };
	text = NULL;
	ret = kvt_srv_generate(r, sched, tok, false, slot);
done:
	free(text);
	json_decref(in);
	json_decref(out);
	return ret;
}

/* ---- POST /slots/{id}?action=save|restore|erase ------------------------- */

/* llama-server's filename rule: a plain name, no separator, no "..", no control byte. */
static bool filename_ok(const char *f)
{
	size_t n = strlen(f);
	if (n == 0 || n > LLAMA_FILENAME_MAX || !strcmp(f, ".") || strstr(f, ".."))
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)f[i] < 0x20 || f[i] == '/' || f[i] == '\\' || f[i] == ':' || f[i] == 0x7f)
			return false;
	return true;
}

/* The status of a failed save or restore: the file's fault is the client's (400), the rest the server's. */
static unsigned slot_status(int rc)
{
	return rc == KVT_ECORRUPT || rc == KVT_EINVAL || rc == KVT_ENOTFOUND ? 400 : 500;
}

static enum MHD_Result slot_file_action(conn_req *r, kvt_sched *sched, int id, bool save, const char *sid)
{
	enum MHD_Result ret = MHD_YES;
	const char *dir = r->srv->cfg.slot_save_path;
	if (!dir || !dir[0])
		return kvt_srv_reply_error(r, 501, NULL, "not_supported",
					   "slot save and restore need --slot-save-path (server.slot_save_path)");
	json_t *body = load_body(r, &ret), *fn = json_object_get(body, "filename");
	if (!body)
		return ret;
	if (!json_is_string(fn) || !filename_ok(json_string_value(fn))) {
		json_decref(body);
		return kvt_srv_reply_error(r, 400, "filename", NULL,
					   "'filename' must be a plain file name (no path separator, no '..')");
	}
	const char *f = json_string_value(fn);
	char path[4096 + LLAMA_FILENAME_MAX + 2], err[512] = "";
	snprintf(path, sizeof(path), "%s/%s", dir, f);
	kvt_slot_io io;
	double t0 = kvt_now_s();
	int rc = save ? kvt_slot_save(sched, r->tenant, sid, path, &io, err, sizeof(err))
		      : kvt_slot_restore(sched, r->tenant, sid, path, &io, err, sizeof(err));
	double ms = (kvt_now_s() - t0) * 1e3;
	if (rc != KVT_OK) {
		KVT_LOGW("slot %d %s %s: %s", id, save ? "save" : "restore", f, err);
		ret = kvt_srv_reply_error(r, slot_status(rc), "filename", NULL, "slot %d: %s", id, err);
	} else {
		json_t *v = json_pack("{s:i, s:s, s:i, s:I, s:{s:f}, s:{s:i}}", "id_slot", (json_int_t)id, "filename", f,
				      save ? "n_saved" : "n_restored", (json_int_t)io.n_tokens, save ? "n_written" : "n_read",
				      (json_int_t)io.n_bytes, "timings", save ? "save_ms" : "restore_ms", ms, "kvtier",
				      "n_blocks", (json_int_t)io.n_blocks);
		ret = kvt_srv_reply_json(r, 200, v, false);
	}
	json_decref(body);
	return ret;
}

static enum MHD_Result handle_slot_action(conn_req *r, kvt_sched *sched)
{
	const char *s = r->path + 7, *action = MHD_lookup_connection_value(r->con, MHD_GET_ARGUMENT_KIND, "action");
	char *end = NULL;
	long id = strtol(s, &end, 10);
	if (!*s || *end || id < 0 || id >= (long)n_slots(r->srv) || s[0] == '+' || s[0] == '-' || s[0] == ' ')
		return kvt_srv_reply_error(r, 400, "id_slot", NULL, "no slot %s (slots 0..%u; --parallel sets how many)",
					   s, n_slots(r->srv) - 1);
	char sid[KVT_NAME_MAX + 1];
	slot_session((int)id, sid);
	if (action && !strcmp(action, "save"))
		return slot_file_action(r, sched, (int)id, true, sid);
	if (action && !strcmp(action, "restore"))
		return slot_file_action(r, sched, (int)id, false, sid);
	if (!action || strcmp(action, "erase"))
		return kvt_srv_reply_error(r, 400, "action", NULL, "invalid action: use ?action=save, restore or erase");
	uint32_t n = 0;
	(void)kvt_slot_tokens(sched, r->tenant, sid, &n);
	int rc = kvt_sched_session_delete(sched, r->tenant, sid);
	if (rc != KVT_OK && rc != KVT_ENOTFOUND)
		return kvt_srv_reply_error(r, 500, NULL, NULL, "slot %ld: erase failed (%s)", id, kvt_strerror(rc));
	return kvt_srv_reply_json(r, 200, json_pack("{s:i, s:i}", "id_slot", (json_int_t)id, "n_erased", (json_int_t)n),
				  false);
}

enum MHD_Result kvt_llama_handle(conn_req *r, kvt_sched *sched, const kvt_tok *tok)
{
	const char *p = r->path;
	if (!strcmp(p, "/props"))
		return handle_props(r, sched, tok);
	if (!strcmp(p, "/slots"))
		return handle_slots(r, sched);
	if (!strcmp(p, "/tokenize"))
		return handle_tokenize(r, tok);
	if (!strcmp(p, "/detokenize"))
		return handle_detokenize(r, tok);
	if (!strcmp(p, "/apply-template"))
		return handle_apply_template(r, tok);
	if (!strcmp(p, "/completion"))
		return handle_completion(r, sched, tok);
	return handle_slot_action(r, sched);
}
