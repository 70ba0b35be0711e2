/*
 * engine/serve/reply.c — a generation's reply (docs/http-api.md): the
 * scheduler's tokens turned into each choice's text, stop strings, logprobs
 * and tool calls; the non-streaming JSON body, or the SSE stream; usage.
 *
 * Design. A gen_job (server_int.h) holds the parsed request (request.h) and
 * its n choices. Whoever runs the connection polls the choices without
 * waiting (kvt_sched_next_lp with a 0 s wait) and, when nothing is new,
 * parks the connection (kvt_srv_park) until the scheduler's progress hook
 * wakes the pump: a non-streaming job from the access handler
 * (kvt_srv_gen_continue), a streaming one from the SSE content reader.
 *
 * Invariants:
 *  - every handle submitted is released exactly once (kvt_srv_job_release):
 *    at the end of a stream, as soon as the last byte is handed to MHD, else
 *    when the job is freed; the in-flight count goes back with it;
 *  - text that could be the start of a stop string is never sent (held back
 *    until it cannot be); a matched stop string cancels its choice and is
 *    cut from the text with everything after it;
 *  - with tools (chat), a tool call is sent whole, as one tool_calls delta;
 *  - after the headers went out, an engine failure or shutdown is one
 *    `data: {"error": ...}` event, then `data: [DONE]`.
 */
#define _GNU_SOURCE /* memmem */
#include "server_int.h"

#include "structured.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Give back what the job holds in the engine: its scheduler handles (each
 * one cancelled if still running; a finished sequence's T0 blocks go back),
 * its in-flight count, and its usage to its tenant. Once per job: at the end
 * of a stream, as soon as the last byte is handed to MHD (the response
 * itself may be freed much later), else from kvt_srv_job_free.
 */
void kvt_srv_job_release(gen_job *j)
{
	if (j->released)
		return;
	j->released = true;
	for (uint32_t i = 0; j->usage && j->ch && i < j->n; i++)
		if (j->ch[i].ended) {
			const kvt_sched_usage *u = &j->ch[i].usage;
			atomic_fetch_add(&j->usage->requests, 1);
			atomic_fetch_add(&j->usage->prompt_tokens, u->prompt_tokens);
			atomic_fetch_add(&j->usage->cached_tokens, u->cached_tokens);
			atomic_fetch_add(&j->usage->completion_tokens, u->completion_tokens);
		}
	for (uint32_t i = 0; j->ch && i < j->n; i++) {
		kvt_sched_release(j->ch[i].h); /* cancels if still running */
		j->ch[i].h = NULL;
	}
	if (j->counted)
		atomic_fetch_sub(&j->srv->in_flight, 1);
	j->counted = false;
	if (j->llama && j->slot >= 0) /* llama API: the slot is free again (a calloc'ed job of another API has llama false) */
		atomic_fetch_sub(&j->srv->slot_busy[j->slot], 1);
	j->slot = -1;
}

void kvt_srv_job_free(gen_job *j)
{
	if (!j)
		return;
	kvt_srv_job_release(j);
	for (uint32_t i = 0; j->ch && i < j->q.n; i++) { /* [q.n]: a choice not submitted may hold its lp */
		free(j->ch[i].text.p);
		free(j->ch[i].ids.p);
		json_decref(j->ch[i].lp);
	}
	free(j->ch);
	kvt_gen_request_deinit(&j->q);
	free(j->out.p);
	free(j);
}

/* Earliest match of any stop string in text[from..] (*which: the string); -1 if none. */
static long stop_find(const gen_job *j, const char *text, size_t n, size_t from, uint32_t *which)
{
	long best = -1;
	for (uint32_t s = 0; s < j->q.n_stops; s++) {
		const char *p = memmem(text + from, n - from, j->q.stops[s], j->q.stop_len[s]);
		if (p && (best < 0 || p - text < best)) {
			best = p - text;
			*which = s;
		}
	}
	return best;
}

/* Bytes at the end of text that could be the start of a stop string (held back). */
static size_t stop_holdback(const gen_job *j, const char *text, size_t n)
{
	size_t hold = 0;
	for (uint32_t s = 0; s < j->q.n_stops; s++) {
		size_t k = j->q.stop_len[s] - 1 < n ? j->q.stop_len[s] - 1 : n;
		for (; k > hold; k--)
			if (!memcmp(text + n - k, j->q.stops[s], k)) {
				hold = k;
				break;
			}
	}
	return hold;
}

/* Append decoded text and look for a stop string in the new part (plus the overlap). */
static void choice_add_text(gen_job *j, gen_choice *c, const char *s, size_t n)
{
	size_t before = c->text.n;
	kvt_sbuf_add(&c->text, s, n);
	if (!j->q.n_stops || c->stop_hit)
		return;
	size_t from = before >= j->q.max_stop_len ? before - j->q.max_stop_len + 1 : 0;
	long at = stop_find(j, c->text.p ? c->text.p : "", c->text.n, from, &c->stop_idx);
	if (at >= 0) {
		c->text.n = (size_t)at;
		c->text.p[at] = 0;
		c->stop_hit = true;
		kvt_sched_cancel(c->h);
	}
}

/*
 * Turn generated ids into text (and their logprobs, lps may be NULL). A
 * control or end-of-generation token (ignore_eos lets them through) is
 * counted and has its logprobs, but adds no text: "<|im_end|>" is a marker,
 * never content. KVT_OK, or KVT_EINVAL for an id the tokenizer rejects (logged).
 */
static int choice_feed(gen_job *j, gen_choice *c, const int32_t *ids, const kvt_token_lp *lps, uint32_t n)
{
	for (uint32_t i = 0; i < n && !c->stop_hit; i++) {
		const char *bytes;
		size_t len;
		if (kvt_tok_token_bytes(j->tok, ids[i], &bytes, &len) != KVT_OK) {
			KVT_LOGE("http %s: the engine returned token id %d, not in the vocabulary", j->id, ids[i]);
			return KVT_EINVAL;
		}
		const bool marker = kvt_tok_is_control(j->tok, ids[i]);
		char small[256];
		size_t cap = marker ? 0 : 3 * len + 3, got = 0;
		char *buf = cap <= sizeof(small) ? small : malloc(cap);
		if (!buf)
			return KVT_ENOMEM;
		/* NOTE: a marker leaves the decoder alone: a character cut by it still joins up after it */
		int rc = marker ? KVT_OK : kvt_tok_stream_push(j->tok, &c->ds, ids[i], buf, cap, &got);
		if (rc == KVT_OK) {
			c->n_tokens++;
			if (j->llama)
				kvt_sbuf_add(&c->ids, (const char *)&ids[i], sizeof(ids[i]));
			if (c->lp && lps && j->q.chat)
				json_array_append_new(c->lp, kvt_oai_lp_chat(j->tok, &lps[i]));
			else if (c->lp && lps)
				kvt_oai_lp_completion_add(c->lp, j->tok, &lps[i], j->q.n_echo + c->text.n);
			choice_add_text(j, c, buf, got);
		}
		if (buf != small)
			free(buf);
		if (rc != KVT_OK)
			return rc;
	}
	return KVT_OK;
}

/* The scheduler said the choice ended: flush the decoder (unless a stop string already cut the text). */
static void choice_end(gen_job *j, gen_choice *c, int finish, const kvt_sched_usage *u)
{
	c->ended = true;
	c->finish = finish;
	c->usage = *u;
	if (!c->stop_hit) {
		char tail[8];
		size_t got = 0;
		if (kvt_tok_stream_flush(&c->ds, tail, sizeof(tail), &got) == KVT_OK && got)
			choice_add_text(j, c, tail, got);
	}
}

static const char *choice_finish_reason(const gen_choice *c)
{
	if (c->stop_hit || c->finish == KVT_FINISH_STOP)
		return "stop";
	return "length";
}

/* The tool calls in an ended chat choice (NULL: none, or no tools); *content_len the text before them. */
static json_t *choice_tool_calls(const gen_job *j, const gen_choice *c, size_t *content_len)
{
	if (!j->q.chat || j->q.tools.choice == KVT_TOOLS_NONE || !c->ended)
		return NULL;
	return kvt_oai_tool_calls(&j->q.tools, c->text.p, c->text.n, content_len);
}

/* Logprobs entries of c from `from` on, in the response's shape (chat {"content", "refusal"}, completions the four arrays). */
static json_t *choice_lp_json(const gen_job *j, const gen_choice *c, size_t from)
{
	if (!c->lp)
		return json_null();
	if (j->q.chat) {
		json_t *a = json_array();
		for (size_t k = from; k < json_array_size(c->lp); k++)
			json_array_append(a, json_array_get(c->lp, k));
		return json_pack("{s:o, s:n}", "content", a, "refusal");
	}
	json_t *o = json_object();
	const char *keys[] = { "tokens", "token_logprobs", "top_logprobs", "text_offset" };
	for (int i = 0; i < 4; i++) {
		json_t *src = json_object_get(c->lp, keys[i]), *a = json_array();
		for (size_t k = from; k < json_array_size(src); k++)
			json_array_append(a, json_array_get(src, k));
		json_object_set_new(o, keys[i], a);
	}
	return o;
}

static size_t choice_lp_count(const gen_job *j, const gen_choice *c)
{
	return !c->lp ? 0 : j->q.chat ? json_array_size(c->lp) : json_array_size(json_object_get(c->lp, "tokens"));
}

/*
 * A choice that failed: an engine error, cancelled by shutdown (not by us), or
 * a session turn whose row could not be made durable (never acknowledged).
 */
static bool choice_failed(const gen_choice *c)
{
	return c->ended && (c->finish == KVT_FINISH_UNSAVED ||
			    (!c->stop_hit && (c->finish == KVT_FINISH_ERROR || c->finish == KVT_FINISH_CANCELLED)));
}

/* How a failed choice is told: HTTP status, error type and code (NULL: none), message. */
static void choice_failure(const gen_choice *c, unsigned *status, const char **type, const char **code,
			   const char **msg)
{
	switch (c->finish) {
	case KVT_FINISH_CANCELLED:
		*status = 503, *type = "server_error", *code = "draining";
		*msg = "the request was cancelled: the server is shutting down";
		break;
	case KVT_FINISH_UNSAVED:
		*status = 507, *type = "insufficient_storage", *code = "insufficient_storage";
		*msg = "the reply was generated but the session could not be saved (the server's disk is full or its "
		       "index failed): the turn is not kept; retry once space returns, or send it without session_id";
		break;
	default:
		*status = 500, *type = "server_error", *code = NULL;
		*msg = "the engine failed while generating";
	}
}

static uint32_t choice_completion_tokens(const gen_choice *c)
{
	return c->stop_hit ? c->n_tokens : c->usage.completion_tokens;
}

/*
 * Poll every running choice once (the first one waits up to wait_s).
 * Returns KVT_OK; *progress says whether anything happened.
 */
static int job_poll(gen_job *j, double wait_s, bool *progress)
{
	int32_t ids[SRV_IDS_CAP];
	kvt_token_lp lps[SRV_IDS_CAP];
	bool waited = false;
	*progress = false;
	for (uint32_t i = 0; i < j->n; i++) {
		gen_choice *c = &j->ch[i];
		if (c->ended)
			continue;
		uint32_t n = 0;
		int finish = KVT_FINISH_NONE;
		kvt_sched_usage u;
		int rc = kvt_sched_next_lp(c->h, ids, j->q.sched.logprobs ? lps : NULL, SRV_IDS_CAP, &n, &finish, &u,
					   waited ? 0.0 : wait_s);
		waited = true;
		if (rc != KVT_OK)
			return rc;
		if (n) {
			*progress = true;
			if ((rc = choice_feed(j, c, ids, j->q.sched.logprobs ? lps : NULL, n)) != KVT_OK)
				return rc;
		}
		if (finish != KVT_FINISH_NONE) {
			*progress = true;
			choice_end(j, c, finish, &u);
		}
	}
	return KVT_OK;
}

static bool job_all_ended(const gen_job *j)
{
	for (uint32_t i = 0; i < j->n; i++)
		if (!j->ch[i].ended)
			return false;
	return true;
}

static void job_update_log(gen_job *j)
{
	if (!j->req)
		return;
	uint32_t n = 0;
	for (uint32_t i = 0; i < j->n; i++)
		n += j->ch[i].ended ? choice_completion_tokens(&j->ch[i]) : j->ch[i].n_tokens;
	atomic_store(&j->req->n_completion, n);
}

json_t *kvt_srv_miss_json(const kvt_sched_usage *u)
{
	const kvt_tm_miss *m = &u->miss;
	if (!u->has_miss || m->reason == KVT_TM_MISS_NONE)
		return NULL; /* a full hit (or the cache off): nothing to explain */
	static const char *const tiers[KVT_TIER_COUNT] = { "hbm", "host", "nvme" };
	json_t *o = json_pack("{s:i, s:s}", "at_token", (json_int_t)m->at_token, "reason",
			      kvt_tm_miss_reason_name(m->reason));
	if (!o)
		return NULL;
	if (m->reason == KVT_TM_MISS_DIVERGED && m->cached_token >= 0) {
		json_object_set_new(o, "cached_token", json_integer(m->cached_token));
		json_object_set_new(o, "new_token", json_integer(m->new_token));
	}
	if (m->tier >= 0 && m->tier < KVT_TIER_COUNT)
		json_object_set_new(o, "tier", json_string(tiers[m->tier]));
	if (m->when_us)
		json_object_set_new(o, "at", json_real((double)m->when_us / 1e6));
	if (m->reason == KVT_TM_MISS_EVICTED || m->reason == KVT_TM_MISS_CAPACITY)
		json_object_set_new(o, "pressure", json_string(kvt_tm_pressure_name(m->pressure)));
	return o;
}

static json_t *usage_json(const gen_job *j)
{
	const kvt_sched_usage *u0 = &j->ch[0].usage;
	uint32_t completion = 0;
	for (uint32_t i = 0; i < j->n; i++)
		completion += choice_completion_tokens(&j->ch[i]);
	json_t *kv = json_pack("{s:{s:i, s:i, s:i, s:i}, s:f}", "cached_tokens_by_tier", "hbm",
			       (json_int_t)u0->cached_by_tier[KVT_TIER_HBM], "host",
			       (json_int_t)u0->cached_by_tier[KVT_TIER_HOST], "nvme",
			       (json_int_t)u0->cached_by_tier[KVT_TIER_NVME], "remote",
			       (json_int_t)u0->cached_by_tier[KVT_TM_TIER_REMOTE], "ttft_ms", u0->ttft_s * 1e3);
	if (kv && j->q.sched.session_id[0])
		json_object_set_new(kv, "session_id", json_string(j->q.sched.session_id));
	if (kv) { /* Anthropic's names for the tokens written to and read from retained cache */
		json_object_set_new(kv, "cache_creation_input_tokens", json_integer(u0->cache_creation_tokens));
		json_object_set_new(kv, "cache_read_input_tokens", json_integer(u0->cache_read_tokens));
		/* cached tokens whose K/V came through an 8-bit tier copy: not bit-exact (0 with an f16 tier.host) */
		json_object_set_new(kv, "lossy_cached_tokens", json_integer(u0->lossy_cached_tokens));
		/* chunk reuse: blended K/V computed in another context, never counted in cached_tokens */
		json_object_set_new(kv, "chunk_tokens", json_integer(u0->chunk_tokens));
		json_object_set_new(kv, "chunk_reused_tokens", json_integer(u0->chunk_reused_tokens));
		json_object_set_new(kv, "chunk_recomputed_tokens", json_integer(u0->chunk_recomputed_tokens));
		if (j->q.cc.n_retain)
			json_object_set_new(
				kv, "retention",
				json_pack("{s:i, s:i, s:i, s:b}", "requested_tokens", (json_int_t)u0->retain_requested_tokens,
					  "retained_tokens",
					  (json_int_t)(u0->retain_requested_tokens - u0->retain_denied_tokens),
					  "denied_tokens", (json_int_t)u0->retain_denied_tokens, "partial",
					  u0->retain_denied_tokens > 0));
		if (j->q.cc.cache_key[0])
			json_object_set_new(kv, "prompt_cache_key", json_string(j->q.cc.cache_key));
		json_t *miss = kvt_srv_miss_json(u0);
		if (miss)
			json_object_set_new(kv, "miss", miss);
	}
	return json_pack("{s:i, s:i, s:i, s:{s:i}, s:o*}", "prompt_tokens", (json_int_t)j->q.n_ids,
			 "completion_tokens", (json_int_t)completion, "total_tokens",
			 (json_int_t)(j->q.n_ids + completion), "prompt_tokens_details", "cached_tokens",
			 (json_int_t)u0->cached_tokens, "kvtier", kv);
}

/* The non-streaming response body. */
static json_t *job_result(gen_job *j)
{
	if (j->llama)
		return kvt_llama_result(j);
	if (j->api == KVT_SRV_API_ANTHROPIC)
		return kvt_srv_anth_result(j);
	json_t *choices = json_array();
	for (uint32_t i = 0; i < j->n; i++) {
		gen_choice *c = &j->ch[i];
		json_t *ch;
		const char *text = c->text.p ? c->text.p : "";
		size_t content_len = c->text.n;
		json_t *calls = choice_tool_calls(j, c, &content_len);
		const char *finish = calls && !strcmp(choice_finish_reason(c), "stop") ? "tool_calls" : choice_finish_reason(c);
		if (j->q.chat) {
			json_t *content = calls && !content_len ? json_null() : json_stringn(text, content_len);
			ch = json_pack("{s:i, s:{s:s, s:o, s:n}, s:o, s:s}", "index", (json_int_t)i, "message", "role",
				       "assistant", "content", content, "refusal", "logprobs", choice_lp_json(j, c, 0),
				       "finish_reason", finish);
			if (calls)
				json_object_set_new(json_object_get(ch, "message"), "tool_calls", calls);
		} else {
			kvt_sbuf t = { 0 };
			kvt_sbuf_add(&t, j->q.echo_text ? j->q.echo_text : "", j->q.n_echo);
			kvt_sbuf_add(&t, text, c->text.n);
			ch = json_pack("{s:i, s:s%, s:o, s:s}", "index", (json_int_t)i, "text", t.p ? t.p : "", t.n,
				       "logprobs", choice_lp_json(j, c, 0), "finish_reason", finish);
			free(t.p);
		}
		json_array_append_new(choices, ch);
	}
	/* llama-server's timings beside usage: clients switching from it read them */
	return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o, s:o}", "id", j->id, "object",
			 j->q.chat ? "chat.completion" : "text_completion", "created", (json_int_t)j->created, "model",
			 j->srv->model_id, "choices", choices, "usage", usage_json(j), "timings",
			 kvt_llama_timings(&j->ch[0].usage));
}

/* ---- SSE ---- */

static void sse_put(gen_job *j, json_t *v)
{
	char *s = v ? json_dumps(v, SRV_JSON_FLAGS) : NULL;
	json_decref(v);
	if (!s) {
		j->out.failed = true;
		return;
	}
	kvt_sbuf_add(&j->out, "data: ", 6);
	kvt_sbuf_add(&j->out, s, strlen(s));
	kvt_sbuf_add(&j->out, "\n\n", 2);
	free(s);
}

/*
 * One chunk for choice i: text (may be NULL), finish reason (may be NULL),
 * chat role delta, logprobs (NULL: null; the reference is taken), chat
 * tool_calls deltas (NULL: none; taken).
 */
static void sse_chunk(gen_job *j, uint32_t i, const char *text, size_t n, const char *finish, bool role, json_t *lp,
		      json_t *tool_calls)
{
	json_t *ch;
	if (j->llama) { /* llama-server's /completion chunks: no choices, no logprobs */
		json_decref(lp);
		json_decref(tool_calls);
		sse_put(j, kvt_llama_chunk(j, i, text, n, finish));
		return;
	}
	if (!lp)
		lp = json_null();
	if (j->q.chat) {
		json_t *delta = json_object();
		if (role) {
			json_object_set_new(delta, "role", json_string("assistant"));
			json_object_set_new(delta, "content", json_string(""));
		} else if (text) {
			json_object_set_new(delta, "content", json_stringn(text, n));
		}
		if (tool_calls)
			json_object_set_new(delta, "tool_calls", tool_calls);
		ch = json_pack("{s:i, s:o, s:o, s:s?}", "index", (json_int_t)i, "delta", delta, "logprobs", lp,
			       "finish_reason", finish);
	} else {
		ch = json_pack("{s:i, s:s%, s:o, s:s?}", "index", (json_int_t)i, "text", text ? text : "",
			       text ? n : 0, "logprobs", lp, "finish_reason", finish);
	}
	json_t *chunk = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", j->id, "object",
				  j->q.chat ? "chat.completion.chunk" : "text_completion", "created",
				  (json_int_t)j->created, "model", j->srv->model_id, "choices", ch);
	if (chunk && finish) /* the choice's last chunk carries llama-server's timings */
		json_object_set_new(chunk, "timings", kvt_llama_timings(&j->ch[i].usage));
	sse_put(j, chunk);
}

/* Move whatever text can be sent now into SSE chunks; finish chunks for ended choices. */
static void sse_emit(gen_job *j)
{
	if (j->api == KVT_SRV_API_ANTHROPIC) {
		kvt_srv_anth_sse_emit(j);
		return;
	}
	for (uint32_t i = 0; i < j->n; i++) {
		gen_choice *c = &j->ch[i];
		if (c->finish_sent)
			continue;
		if (j->q.chat && !c->role_sent) {
			sse_chunk(j, i, NULL, 0, NULL, true, NULL, NULL);
			c->role_sent = true;
		}
		if (j->q.echo_text && !c->echo_sent) {
			sse_chunk(j, i, j->q.echo_text, j->q.n_echo, NULL, false, NULL, NULL);
			c->echo_sent = true;
		}
		if (choice_failed(c))
			continue; /* reported once every choice ended */
		size_t ready = c->text.n, content_len = c->text.n;
		json_t *calls = choice_tool_calls(j, c, &content_len);
		if (!c->stop_hit && !c->ended)
			ready -= stop_holdback(j, c->text.p, c->text.n);
		if (j->q.chat && j->q.tools.choice != KVT_TOOLS_NONE) /* a tool call is sent whole, as a tool_calls delta */
			ready = c->ended ? content_len : kvt_oai_content_ready(c->text.p, ready);
		if (ready > c->n_sent) {
			size_t n_lp = choice_lp_count(j, c);
			sse_chunk(j, i, c->text.p + c->n_sent, ready - c->n_sent, NULL, false,
				  c->lp ? choice_lp_json(j, c, c->lp_sent) : NULL, NULL);
			c->lp_sent = n_lp;
			c->n_sent = ready;
		}
		if (c->ended) {
			const char *finish = choice_finish_reason(c);
			if (calls) {
				size_t k;
				json_t *call;
				json_array_foreach(calls, k, call)
					json_object_set_new(call, "index", json_integer((json_int_t)k));
				size_t n_lp = choice_lp_count(j, c);
				sse_chunk(j, i, NULL, 0, NULL, false, c->lp ? choice_lp_json(j, c, c->lp_sent) : NULL, calls);
				c->lp_sent = n_lp;
				calls = NULL;
				if (!strcmp(finish, "stop"))
					finish = "tool_calls";
			}
			sse_chunk(j, i, j->q.chat ? NULL : "", 0, finish, false,
				  c->lp && c->lp_sent < choice_lp_count(j, c) ? choice_lp_json(j, c, c->lp_sent) : NULL, NULL);
			c->finish_sent = true;
		}
		json_decref(calls);
	}
	if (job_all_ended(j) && !j->done) {
		for (uint32_t i = 0; i < j->n; i++)
			if (choice_failed(&j->ch[i])) {
				unsigned status;
				const char *type, *code, *msg;
				choice_failure(&j->ch[i], &status, &type, &code, &msg);
				sse_put(j, kvt_srv_error_object(j->rid, type, NULL, code, msg));
				break;
			}
		if (j->q.include_usage)
			sse_put(j, json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", j->id, "object",
					     j->q.chat ? "chat.completion.chunk" : "text_completion", "created",
					     (json_int_t)j->created, "model", j->srv->model_id, "choices", "usage",
					     usage_json(j)));
		if (!j->llama) /* llama-server ends a /completion stream with its stop chunk */
			kvt_sbuf_add(&j->out, "data: [DONE]\n\n", 14);
		j->done = true;
	}
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	gen_job *j = cls;
	for (;;) {
		if (j->out.failed)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (j->out_off < j->out.n) {
			size_t k = j->out.n - j->out_off < max ? j->out.n - j->out_off : max;
			memcpy(buf, j->out.p + j->out_off, k);
			j->out_off += k;
			if (j->out_off == j->out.n)
				j->out_off = j->out.n = 0;
			return (ssize_t)k;
		}
		if (j->done) {
			kvt_srv_job_release(j); /* NOTE: MHD may free the response (sse_free) much later */
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		if (atomic_load(&j->srv->stopping) || kvt_srv_peer_gone(j->w.fd))
			return MHD_CONTENT_READER_END_WITH_ERROR; /* the free callback cancels */
		uint64_t seen = atomic_load(&j->srv->wake_seq);
		bool progress;
		int rc = job_poll(j, 0, &progress);
		if (rc != KVT_OK && j->api == KVT_SRV_API_ANTHROPIC) {
			kvt_srv_anth_sse_fail(j, "the engine failed while generating");
			continue;
		}
		if (rc != KVT_OK) {
			sse_put(j, kvt_srv_error_object(j->rid, "server_error", NULL, NULL, "the engine failed while generating"));
			if (!j->llama)
				kvt_sbuf_add(&j->out, "data: [DONE]\n\n", 14);
			j->done = true;
			continue;
		}
		if (progress) {
			job_update_log(j);
			sse_emit(j);
			continue;
		}
		if (kvt_srv_park(j->srv, &j->w, seen))
			return 0; /* resumed on news; MHD calls again */
	}
}

static void sse_free(void *cls)
{
	kvt_srv_job_free(cls);
}

/*
 * A non-streaming generation, each time MHD runs its connection: take what
 * the scheduler has; park until news while a choice runs; answer once all
 * ended. A client that hung up (the pump resumes it) is cancelled.
 */
enum MHD_Result kvt_srv_gen_continue(conn_req *r)
{
	gen_job *j = r->job;
	enum MHD_Result ret;
	for (;;) {
		if (atomic_load(&r->srv->stopping) || kvt_srv_peer_gone(j->w.fd)) {
			KVT_LOGI("http %s: client went away; cancelled", j->id);
			ret = MHD_NO; /* close the connection; kvt_srv_job_free cancels */
			r->status = 499;
			break;
		}
		uint64_t seen = atomic_load(&r->srv->wake_seq);
		bool progress;
		int rc = job_poll(j, 0, &progress);
		if (rc != KVT_OK) {
			ret = kvt_srv_reply_error(r, 500, NULL, NULL, "the engine failed while generating (%s)", kvt_strerror(rc));
			break;
		}
		if (!job_all_ended(j)) {
			if (progress || !kvt_srv_park(r->srv, &j->w, seen))
				continue;
			return MHD_YES; /* parked: MHD calls on_request again when resumed */
		}
		job_update_log(j);
		ret = MHD_YES;
		for (uint32_t i = 0; i < j->n && ret == MHD_YES && !r->answered; i++)
			if (choice_failed(&j->ch[i])) {
				unsigned status;
				const char *type, *code, *msg;
				choice_failure(&j->ch[i], &status, &type, &code, &msg);
				ret = kvt_srv_reply_json(r, status, kvt_srv_error_object(r->rid, type, NULL, code, msg),
							 status == 503);
			}
		if (!r->answered)
			ret = kvt_srv_reply_json(r, 200, job_result(j), false);
		break;
	}
	r->job = NULL;
	kvt_srv_job_free(j);
	return ret;
}

enum MHD_Result kvt_srv_gen_stream(conn_req *r, gen_job *j)
{
	struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 << 10, sse_reader, j, sse_free);
	if (!resp) {
		kvt_srv_job_free(j);
		return kvt_srv_reply_error(r, 500, NULL, NULL, "out of memory");
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
	MHD_add_response_header(resp, "X-Accel-Buffering", "no"); /* a proxy (nginx) must not hold events back */
	return kvt_srv_queue(r, 200, resp);
}

/* ---- for anthropic.c ---- */

bool kvt_srv_choice_failed(const gen_choice *c)
{
	return choice_failed(c);
}

void kvt_srv_choice_failure(const gen_choice *c, unsigned *status, const char **type, const char **code,
			    const char **msg)
{
	choice_failure(c, status, type, code, msg);
}

uint32_t kvt_srv_choice_completion_tokens(const gen_choice *c)
{
	return choice_completion_tokens(c);
}

size_t kvt_srv_stop_holdback(const gen_job *j, const char *text, size_t n)
{
	return stop_holdback(j, text, n);
}

bool kvt_srv_job_all_ended(const gen_job *j)
{
	return job_all_ended(j);
}

json_t *kvt_srv_usage_json(const gen_job *j)
{
	return usage_json(j);
}
