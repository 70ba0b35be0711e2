/*
 * engine/serve/request.c — a generation request's JSON body into the
 * scheduler's request (request.h): field getters, the sampling and
 * output-control fields, the refused fields, the prompt (chat template or
 * completion prompt), the context check, the echo text, cache control, the
 * chunk spans.
 *
 * Design. Each getter reads one field: KVT_OK with *out set (left alone when
 * the field is absent or null), or KVT_EINVAL with the error record naming
 * the field. The checks run in the order the HTTP layer has always run them,
 * so which fault of a body with several is reported does not change.
 *
 * Object keys may hold U+0000 (kvt_req_body_load re-spells them for
 * jansson's reader and back): code here that reads a key's text reads it by
 * length.
 *
 * Invariants:
 *  - nothing here touches a connection, the scheduler, the clock or a random
 *    source: the same body and limits give the same request or refusal;
 *  - in chat, only the template's own markers are special tokens: message
 *    text is tokenized as text (kvt_tok_chat_encode);
 *  - every prompt token is in [0, n_vocab), the prompt leaves room for one
 *    token, and prompt + max_tokens fits the context, before KVT_OK;
 *  - chunk spans lie inside the prompt, in order, disjoint, at most
 *    KVT_SCHED_MAX_CHUNKS, and each is its marked text's own tokens (less at
 *    most a boundary token at either end, merged with its neighbour).
 */
#include "request.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* small helpers                                                              */

unsigned kvt_req_http_status(int rc)
{
	return rc == KVT_EINVAL ? 400 : 500;
}

void kvt_utf8_scrub(char *s)
{
	unsigned char *p = (unsigned char *)s;
	while (*p) {
		unsigned c = p[0];
		size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
		bool ok = n > 0;
		for (size_t i = 1; ok && i < n; i++)
			ok = (p[i] & 0xc0) == 0x80;
		if (ok && n > 1) { /* RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF */
			uint32_t cp = c & (0x7f >> n);
			for (size_t i = 1; i < n; i++)
				cp = cp << 6 | (p[i] & 0x3f);
			static const uint32_t min_of[5] = { 0, 0, 0x80, 0x800, 0x10000 };
			ok = cp >= min_of[n] && cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
		}
		if (!ok) {
			*p++ = '?';
			continue;
		}
		p += n;
	}
}

/*
 * A JSON number that is a whole number: an integer, or a real with no
 * fraction within long long's range ("max_tokens": 2.0 is 2, as OpenAI takes it).
 */
static bool json_whole(const json_t *v, long long *out)
{
	if (json_is_integer(v)) {
		*out = json_integer_value(v);
		return true;
	}
	if (!json_is_real(v))
		return false;
	double d = json_real_value(v);
	if (!(d >= -0x1p63 && d < 0x1p63) || d != floor(d))
		return false;
	*out = (long long)d;
	return true;
}

static bool present(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return v && !json_is_null(v);
}

static int get_int(json_t *o, const char *key, long long lo, long long hi, long long *out, kvt_req_err *e)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return KVT_OK;
	long long x;
	if (!json_whole(v, &x))
		return kvt_req_fail(e, key, NULL, "'%s' must be an integer", key);
	if (x < lo || x > hi)
		return kvt_req_fail(e, key, NULL, "'%s' must be in [%lld, %lld] (got %lld)", key, lo, hi, x);
	*out = x;
	return KVT_OK;
}

static int get_num(json_t *o, const char *key, double *out, kvt_req_err *e)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return KVT_OK;
	if (!json_is_number(v))
		return kvt_req_fail(e, key, NULL, "'%s' must be a number", key);
	*out = json_number_value(v);
	return KVT_OK;
}

static int get_bool(json_t *o, const char *key, bool *out, kvt_req_err *e)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return KVT_OK;
	if (!json_is_boolean(v))
		return kvt_req_fail(e, key, NULL, "'%s' must be a boolean", key);
	*out = json_is_true(v);
	return KVT_OK;
}

/* A string field; *n_out (when not NULL) gets its length, which counts any NUL bytes in it. */
static int get_str(json_t *o, const char *key, const char **out, size_t *n_out, kvt_req_err *e)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return KVT_OK;
	if (!json_is_string(v))
		return kvt_req_fail(e, key, NULL, "'%s' must be a string", key);
	*out = json_string_value(v);
	if (n_out)
		*n_out = json_string_length(v);
	return KVT_OK;
}

/*
 * Keys holding U+0000. JSON allows them, and so does OpenAI's schema, but
 * jansson's parser refuses them (its hashtable takes a key by length; its
 * reader does not). A body it refuses for that alone is read again with
 * every object key re-spelled one to one: U+0000 as KEY_ESC '0', KEY_ESC
 * itself as KEY_ESC '1'. KEY_ESC is U+FFFF, a noncharacter. The spelling is
 * prefix-free, so two keys stay two (duplicates are still caught) and each
 * spells back (keys_unspell) to its own bytes. Values are never touched.
 */
#define KEY_ESC "\xef\xbf\xbf" /* U+FFFF in UTF-8 */

static int hex4(const char *p)
{
	int v = 0;
	for (int i = 0; i < 4; i++) {
		int c = (unsigned char)p[i], d = isdigit(c) ? c - '0' : isxdigit(c) ? (tolower(c) - 'a' + 10) : -1;
		if (d < 0)
			return -1;
		v = v << 4 | d;
	}
	return v;
}

static bool has_esc(const char *key, size_t n)
{
	for (size_t i = 0; i + 3 <= n; i++)
		if (!memcmp(key + i, KEY_ESC, 3))
			return true;
	return false;
}

/* body (n bytes) with its object keys re-spelled (above) into b. */
static void keys_respell(const char *p, size_t n, kvt_sbuf *b)
{
	size_t i = 0;
	while (i < n) {
		if (p[i] != '"') {
			kvt_sbuf_add(b, p + i++, 1);
			continue;
		}
		size_t s = i++;
		while (i < n && p[i] != '"')
			i += p[i] == '\\' ? 2 : 1;
		size_t e = i < n ? i + 1 : n, j = e; /* e: past the closing quote */
		while (j < n && (p[j] == ' ' || p[j] == '\t' || p[j] == '\r' || p[j] == '\n'))
			j++;
		if (j >= n || p[j] != ':') { /* a value: as it is */
			kvt_sbuf_add(b, p + s, e - s);
			i = e;
			continue;
		}
		for (size_t k = s; k < e;) {
			int u = p[k] == '\\' && k + 6 <= e && p[k + 1] == 'u' ? hex4(p + k + 2) : -1;
			if (u == 0 || u == 0xffff) {
				kvt_sbuf_add(b, u ? KEY_ESC "1" : KEY_ESC "0", 4);
				k += 6;
			} else if (k + 3 <= e && !memcmp(p + k, KEY_ESC, 3)) {
				kvt_sbuf_add(b, KEY_ESC "1", 4);
				k += 3;
			} else {
				size_t step = p[k] == '\\' && k + 2 <= e ? 2 : 1;
				kvt_sbuf_add(b, p + k, step);
				k += step;
			}
		}
		i = e;
	}
}

/* Every object key under v spelled back (keys_respell's inverse), in place, the keys' order kept. */
static int keys_unspell(json_t *v)
{
	size_t k;
	json_t *x;
	if (json_is_array(v)) {
		json_array_foreach(v, k, x)
		{
			if (keys_unspell(x))
				return KVT_ENOMEM;
		}
		return KVT_OK;
	}
	if (!json_is_object(v))
		return KVT_OK;
	const char *key;
	size_t key_len, n = json_object_size(v), i = 0;
	bool spelled = false;
	json_object_keylen_foreach(v, key, key_len, x)
	{
		if (keys_unspell(x))
			return KVT_ENOMEM;
		spelled = spelled || has_esc(key, key_len);
	}
	if (!spelled)
		return KVT_OK;
	/* NOTE: json_object_update and json_deep_copy take keys as C strings (jansson 2.14): rebuilt by hand */
	struct {
		char *key; /* the key spelled back, malloc'd */
		size_t n;  /* its bytes */
		json_t *v; /* its value (a reference, handed to v again) */
	} *ent = calloc(n, sizeof(*ent));
	int rc = ent ? KVT_OK : KVT_ENOMEM;
	json_object_keylen_foreach(v, key, key_len, x)
	{
		if (rc || !(ent[i].key = malloc(key_len + 1))) {
			rc = KVT_ENOMEM;
			break;
		}
		size_t m = 0;
		for (size_t j = 0; j < key_len; j++) {
			bool esc = j + 4 <= key_len && !memcmp(key + j, KEY_ESC, 3);
			ent[i].key[m++] = esc ? (key[j + 3] == '0' ? '\0' : (char)0xef) : key[j];
			if (esc && key[j + 3] != '0') {
				memcpy(ent[i].key + m, &KEY_ESC[1], 2); /* the rest of U+FFFF after its first byte */
				m += 2;
			}
			j += esc ? 3 : 0;
		}
		ent[i].n = m;
		ent[i++].v = json_incref(x);
	}
	if (rc == KVT_OK) {
		json_object_clear(v);
		for (size_t j = 0; j < i && rc == KVT_OK; j++) {
			rc = json_object_setn_new_nocheck(v, ent[j].key, ent[j].n, ent[j].v) ? KVT_ENOMEM : KVT_OK;
			ent[j].v = NULL;
		}
	}
	for (size_t j = 0; ent && j < n; j++) {
		free(ent[j].key);
		json_decref(ent[j].v);
	}
	free(ent);
	return rc;
}

/* json_loadb with kvtier's flags; an integer beyond 64 bits makes it read every integer as a real. */
static json_t *body_parse(const char *p, size_t n, json_error_t *jerr)
{
	const size_t flags = JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL;
	json_t *v = json_loadb(p, n, flags, jerr);
	if (!v && json_error_code(jerr) == json_error_numeric_overflow)
		v = json_loadb(p, n, flags | JSON_DECODE_INT_AS_REAL, jerr);
	return v;
}

int kvt_req_body_load(const char *body, size_t n, json_t **out, kvt_req_err *e)
{
	json_error_t jerr;
	body = body ? body : "";
	json_t *v = body_parse(body, n, &jerr);
	if (!v && json_error_code(&jerr) == json_error_null_byte_in_key) {
		kvt_sbuf b = { 0 };
		kvt_sbuf_add(&b, "", 0);
		keys_respell(body, n, &b);
		v = b.failed ? NULL : body_parse(b.p, b.n, &jerr);
		free(b.p);
		if (b.failed || (v && keys_unspell(v))) {
			json_decref(v);
			return KVT_ENOMEM;
		}
	}
	if (!v)
		return kvt_req_fail(e, NULL, "invalid_json", "malformed JSON body: %s (line %d, column %d)", jerr.text,
				    jerr.line, jerr.column);
	if (!json_is_object(v)) {
		json_decref(v);
		return kvt_req_fail(e, NULL, "invalid_json", "the body must be a JSON object");
	}
	*out = v;
	return KVT_OK;
}

int kvt_req_tenant(const char *user, size_t n_user, char tenant[KVT_NAME_MAX + 1], kvt_req_err *e)
{
	if (!user || n_user == 0)
		return KVT_OK;
	if (n_user > KVT_REQ_USER_MAX)
		return kvt_req_fail(e, "user", NULL, "'user' must be at most %d bytes (got %zu)", KVT_REQ_USER_MAX, n_user);
	const size_t n_pre = sizeof(KVT_REQ_TENANT_MAPPED) - 1;
	/* NOTE: a literal name never starts with the mapped prefix: a `user` that does is mapped, so the spaces stay apart */
	if (n_user == strlen(user) && kvt_name_valid(user) && strncmp(user, KVT_REQ_TENANT_MAPPED, n_pre) != 0) {
		snprintf(tenant, KVT_NAME_MAX + 1, "%s", user);
		return KVT_OK;
	}
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned n_md = 0;
	if (!EVP_Digest(user, n_user, md, &n_md, EVP_sha256(), NULL) || n_md < KVT_REQ_TENANT_HASH_BYTES)
		return kvt_req_fail(e, "user", NULL, "'user' could not be hashed");
	memcpy(tenant, KVT_REQ_TENANT_MAPPED, n_pre);
	size_t n = n_pre, keep = n_user < 64 ? n_user : 64;
	for (size_t i = 0; i < keep; i++, n++) {
		unsigned char c = (unsigned char)user[i];
		tenant[n] = isalnum(c) || c == '-' || c == '_' || c == '.' ? (char)c : '_';
	}
	tenant[n++] = '-';
	for (int i = 0; i < KVT_REQ_TENANT_HASH_BYTES; i++, n += 2)
		snprintf(tenant + n, 3, "%02x", md[i]);
	KVT_DEBUG_ASSERT(kvt_name_valid(tenant));
	return KVT_OK;
}

int kvt_req_content(kvt_sbuf *b, json_t *content, const char *param, kvt_req_err *e)
{
	if (json_is_string(content)) {
		kvt_sbuf_add(b, json_string_value(content), json_string_length(content));
		return KVT_OK;
	}
	if (!json_is_array(content))
		return kvt_req_fail(e, param, NULL, "'%s' must be a string or an array of text parts", param);
	size_t k;
	json_t *part;
	json_array_foreach(content, k, part)
	{
		json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
		if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
		    !json_is_string(text))
			return kvt_req_fail(e, param, NULL, "'%s[%zu]' must be {\"type\": \"text\", \"text\": string}", param, k);
		kvt_sbuf_add(b, json_string_value(text), json_string_length(text));
	}
	return KVT_OK;
}

/* ------------------------------------------------------------------------ */
/* step 1: the fields                                                         */

/* logit_bias: token id (decimal string) -> bias in [-100, 100]. */
static int parse_bias(const kvt_req_limits *lim, json_t *v, kvt_sampler_params *sp, kvt_req_err *e)
{
	if (!json_is_object(v))
		return kvt_req_fail(e, "logit_bias", NULL, "'logit_bias' must be an object of token id -> bias");
	if (json_object_size(v) > KVT_SAMPLER_MAX_BIAS)
		return kvt_req_fail(e, "logit_bias", NULL, "'logit_bias' may hold at most %d entries", KVT_SAMPLER_MAX_BIAS);
	const char *key;
	size_t key_len;
	json_t *bv;
	json_object_keylen_foreach(v, key, key_len, bv)
	{
		char *end = NULL;
		long long id = strtoll(key, &end, 10);
		if (!key[0] || *end || end != key + key_len || id < 0 || id >= (long long)lim->n_vocab)
			return kvt_req_fail(e, "logit_bias", NULL, "'logit_bias' key '%.40s' is not a token id in [0, %u)", key,
					    lim->n_vocab);
		if (!json_is_number(bv) || !(json_number_value(bv) >= -100 && json_number_value(bv) <= 100))
			return kvt_req_fail(e, "logit_bias", NULL, "'logit_bias[%s]' must be a number in [-100, 100]", key);
		sp->bias[sp->n_bias++] = (kvt_logit_bias){ (int32_t)id, (float)json_number_value(bv) };
	}
	return KVT_OK;
}

/* Fields kvtier does not implement: refused rather than ignored (docs/http-api.md). */
static int parse_refused(bool chat, json_t *body, kvt_req_err *e)
{
	long long best_of = 1;
	if (!chat && get_int(body, "best_of", 1, 1, &best_of, e))
		return KVT_EINVAL;
	static const char *const refused[] = { "suffix", "audio", "prediction", "web_search_options", "verbosity" };
	json_t *v;
	for (size_t k = 0; k < sizeof(refused) / sizeof(refused[0]); k++)
		if ((v = json_object_get(body, refused[k])) && !json_is_null(v) && !(json_is_string(v) && !json_string_length(v)))
			return kvt_req_fail(e, refused[k], NULL, "'%s' is not supported", refused[k]);
	if ((v = json_object_get(body, "modalities")) && !json_is_null(v) &&
	    !(json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)) &&
	      !strcmp(json_string_value(json_array_get(v, 0)), "text")))
		return kvt_req_fail(e, "modalities", NULL, "'modalities' other than [\"text\"] is not supported");
	return KVT_OK;
}

/*
 * reasoning_effort: OpenAI's values are accepted. No model kvtier serves
 * reasons as kvtier lays its chat out (no template it renders has a thinking
 * turn), so "none" and "minimal" are what the model does anyway, and the
 * others change nothing (docs/http-api.md). Any other value is refused.
 */
static int parse_reasoning(json_t *body, kvt_req_err *e)
{
	static const char *const efforts[] = { "none", "minimal", "low", "medium", "high", "xhigh" };
	json_t *v = json_object_get(body, "reasoning_effort");
	if (!v || json_is_null(v))
		return KVT_OK;
	for (size_t k = 0; json_is_string(v) && k < sizeof(efforts) / sizeof(efforts[0]); k++)
		if (!strcmp(json_string_value(v), efforts[k]) && json_string_length(v) == strlen(efforts[k]))
			return KVT_OK;
	return kvt_req_fail(e, "reasoning_effort", NULL,
			    "'reasoning_effort' must be \"none\", \"minimal\", \"low\", \"medium\", \"high\" or \"xhigh\" "
			    "(the model has no reasoning mode: each means what it does without one)");
}

/* stop: a string or an array of at most KVT_REQ_MAX_STOPS strings; empty ones are ignored. */
static int parse_stop(json_t *v, kvt_gen_request *q, kvt_req_err *e)
{
	size_t k = 1;
	if (json_is_array(v)) {
		k = json_array_size(v);
		if (k > KVT_REQ_MAX_STOPS)
			return kvt_req_fail(e, "stop", NULL, "'stop' may hold at most %d strings", KVT_REQ_MAX_STOPS);
	} else if (!json_is_string(v)) {
		return kvt_req_fail(e, "stop", NULL, "'stop' must be a string or an array of strings");
	}
	for (size_t i = 0; i < k; i++) {
		json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
		if (!json_is_string(s))
			return kvt_req_fail(e, "stop", NULL, "'stop' must be a string or an array of strings");
		size_t len = json_string_length(s);
		if (len == 0)
			continue; /* an empty stop string would match everywhere: ignored */
		if (!(q->stops[q->n_stops] = malloc(len + 1)))
			return KVT_ENOMEM;
		memcpy(q->stops[q->n_stops], json_string_value(s), len + 1);
		q->stop_len[q->n_stops++] = len;
		if (len > q->max_stop_len)
			q->max_stop_len = len;
	}
	return KVT_OK;
}

/*
 * The top-level "kvtier" object, kvtier's own options (docs/http-api.md,
 * "Chunk reuse"): chunk_recompute (0..1) overrides [cache] chunk_recompute
 * for this request (else s->chunk_recompute is -1, the server's default).
 * A chunk mark ("reuse") belongs on a chat message or a content part, never
 * here; completions have no messages, so none at all.
 */
static int parse_kvtier(bool chat, json_t *body, kvt_sched_req *s, kvt_req_err *e)
{
	s->chunk_recompute = -1;
	json_t *o = json_object_get(body, "kvtier");
	if (!o || json_is_null(o))
		return KVT_OK;
	if (!json_is_object(o))
		return kvt_req_fail(e, "kvtier", NULL, "'kvtier' must be an object {\"chunk_recompute\": number}");
	const char *key;
	size_t key_len;
	json_t *v;
	json_object_keylen_foreach(o, key, key_len, v)
	{
		bool plain = key_len == strlen(key); /* a NUL in the key: no field of kvtier's */
		if (plain && !strcmp(key, "chunk_recompute")) {
			if (json_is_null(v))
				continue;
			if (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) <= 1))
				return kvt_req_fail(e, "kvtier.chunk_recompute", NULL,
						    "'kvtier.chunk_recompute' must be a number in [0, 1] (the fraction of a "
						    "reused chunk's tokens recomputed)");
			s->chunk_recompute = (float)json_number_value(v);
		} else if (plain && !strcmp(key, "reuse")) {
			if (json_is_null(v))
				continue;
			if (chat)
				return kvt_req_fail(e, "kvtier.reuse", NULL,
						    "'kvtier.reuse' goes on a chat message ('messages[i].kvtier') or a content "
						    "part ('messages[i].content[k].kvtier'), not at the top of the body");
			return kvt_req_fail(e, "kvtier.reuse", NULL,
					    "'kvtier.reuse': chunk marks are for chat messages (/v1/chat/completions: "
					    "'messages[i].kvtier' or 'messages[i].content[k].kvtier'); a completion's "
					    "prompt has none");
		} else {
			return kvt_req_fail(e, "kvtier", NULL, "'kvtier' has an unknown field '%.64s' (allowed: chunk_recompute)",
					    key);
		}
	}
	return KVT_OK;
}

int kvt_gen_request_parse(const kvt_req_limits *lim, bool chat, json_t *body, kvt_gen_request *q, kvt_req_err *e)
{
	memset(q, 0, sizeof(*q));
	q->chat = chat;
	q->parse_special = true;
	kvt_sched_req *s = &q->sched;
	long long max_tokens = lim->default_max_tokens, top_k = 0, n = 1, seed = 0, priority = 0, top_lp = 0;
	double temp = 1.0, top_p = 1.0, presence = 0, frequency = 0, repetition = 1, min_p = 0;
	const char *model = NULL, *user = NULL, *session = NULL;
	size_t n_user = 0;
	bool want_lp = false;
	json_t *v;
	int rc;

	q->max_tokens_key = chat && present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
	q->max_tokens_set = present(body, q->max_tokens_key);
	if (get_str(body, "model", &model, NULL, e) || get_str(body, "user", &user, &n_user, e) ||
	    get_int(body, q->max_tokens_key, 1, lim->max_tokens_limit, &max_tokens, e) ||
	    get_num(body, "temperature", &temp, e) || get_num(body, "top_p", &top_p, e) ||
	    get_int(body, "top_k", 0, lim->n_vocab, &top_k, e) || get_int(body, "seed", LLONG_MIN, LLONG_MAX, &seed, e) ||
	    get_int(body, "n", 1, lim->max_n, &n, e) || get_bool(body, "stream", &q->stream, e) ||
	    get_bool(body, "ignore_eos", &s->ignore_eos, e) || get_str(body, "session_id", &session, NULL, e) ||
	    get_int(body, "priority", KVT_PRIORITY_MIN, KVT_PRIORITY_MAX, &priority, e) ||
	    (!chat && get_bool(body, "parse_special", &q->parse_special, e)))
		return KVT_EINVAL;
	q->have_seed = present(body, "seed");
	s->has_priority = present(body, "priority");
	if (get_num(body, "presence_penalty", &presence, e) || get_num(body, "frequency_penalty", &frequency, e) ||
	    get_num(body, "repetition_penalty", &repetition, e) || get_num(body, "min_p", &min_p, e) ||
	    (!chat && get_bool(body, "echo", &q->echo, e)))
		return KVT_EINVAL;
	if (!(presence >= -2 && presence <= 2) || !(frequency >= -2 && frequency <= 2)) {
		const char *f = presence >= -2 && presence <= 2 ? "frequency_penalty" : "presence_penalty";
		return kvt_req_fail(e, f, NULL, "'%s' must be in [-2, 2]", f);
	}
	if (!(repetition > 0 && repetition <= 10))
		return kvt_req_fail(e, "repetition_penalty", NULL, "'repetition_penalty' must be in (0, 10]");
	if (!(min_p >= 0 && min_p <= 1))
		return kvt_req_fail(e, "min_p", NULL, "'min_p' must be in [0, 1]");
	if (chat) { /* logprobs: true, top_logprobs: 0..20 */
		if (get_bool(body, "logprobs", &want_lp, e) ||
		    get_int(body, "top_logprobs", 0, KVT_MAX_TOP_LOGPROBS, &top_lp, e))
			return KVT_EINVAL;
		if (top_lp && !want_lp)
			return kvt_req_fail(e, "top_logprobs", NULL, "'top_logprobs' needs 'logprobs': true");
	} else if (present(body, "logprobs")) { /* completions: logprobs: N */
		if (get_int(body, "logprobs", 0, KVT_MAX_TOP_LOGPROBS, &top_lp, e))
			return KVT_EINVAL;
		want_lp = true;
		if (q->echo)
			return kvt_req_fail(e, "echo", NULL, "'echo' with 'logprobs' (the prompt's logprobs) is not supported");
	}
	if ((v = json_object_get(body, "logit_bias")) && !json_is_null(v) && parse_bias(lim, v, &s->sample, e))
		return KVT_EINVAL;
	if (parse_refused(chat, body, e) || parse_reasoning(body, e) ||
	    kvt_oai_response_format(json_object_get(body, "response_format"), &s->grammar, e))
		return KVT_EINVAL;
	if (!(temp >= 0 && temp <= 2))
		return kvt_req_fail(e, "temperature", NULL, "'temperature' must be in [0, 2]");
	if (!(top_p >= 0 && top_p <= 1))
		return kvt_req_fail(e, "top_p", NULL, "'top_p' must be in [0, 1]");
	if (top_p == 0) { /* the smallest set reaching probability 0 is the most likely token: greedy */
		temp = 0;
		top_p = 1;
	}
	if ((v = json_object_get(body, "stream_options")) && !json_is_null(v)) {
		if (!json_is_object(v))
			return kvt_req_fail(e, "stream_options", NULL, "'stream_options' must be an object");
		json_t *iu = json_object_get(v, "include_usage");
		if (iu && !json_is_null(iu) && !json_is_boolean(iu))
			return kvt_req_fail(e, "stream_options.include_usage", NULL,
					    "'stream_options.include_usage' must be a boolean");
		q->include_usage = json_is_true(iu);
	}
	if (session && !kvt_name_valid(session))
		return kvt_req_fail(e, "session_id", NULL,
				    "'session_id' must be 1-128 characters of [A-Za-z0-9._-], not starting with '.'");
	if (lim->tenant_from_user && kvt_req_tenant(user, n_user, s->tenant, e))
		return KVT_EINVAL;
	if (chat && kvt_oai_tools_parse(body, &q->tools, e))
		return KVT_EINVAL;
	if (s->grammar && q->tools.g)
		return kvt_req_fail(e, "response_format", NULL,
				    "'response_format' cannot be combined with a required or named 'tool_choice'");
	if (q->tools.g)
		s->grammar = kvt_grammar_ref(q->tools.g);
	if ((v = json_object_get(body, "stop")) && !json_is_null(v) && (rc = parse_stop(v, q, e)) != KVT_OK)
		return rc;
	if (parse_kvtier(chat, body, s, e))
		return KVT_EINVAL;

	q->n = (uint32_t)n;
	s->max_tokens = (uint32_t)max_tokens;
	s->sample.temp = (float)temp;
	s->sample.top_p = (float)top_p;
	s->sample.top_k = (uint32_t)top_k;
	s->sample.seed = (uint64_t)seed;
	s->sample.presence_penalty = (float)presence;
	s->sample.frequency_penalty = (float)frequency;
	s->sample.repetition_penalty = (float)repetition;
	s->sample.min_p = (float)min_p;
	s->logprobs = want_lp;
	s->top_logprobs = (uint32_t)top_lp;
	s->priority = (int)priority;
	snprintf(s->session_id, sizeof(s->session_id), "%s", session ? session : "");
	return KVT_OK;
}

int kvt_req_resume_parse(json_t *body, bool *stream, const char **user, size_t *n_user, kvt_req_err *e)
{
	if (get_bool(body, "stream", stream, e) || get_str(body, "user", user, n_user, e))
		return KVT_EINVAL;
	return KVT_OK;
}

/* ------------------------------------------------------------------------ */
/* step 2: the prompt                                                         */

/* ids (malloc'd, n of them) with BOS put first when the model asks; frees ids on failure. */
static int with_bos(const kvt_tok *tok, int32_t *ids, size_t n, int32_t **out, uint32_t *n_out)
{
	size_t bos = kvt_tok_add_bos(tok) && kvt_tok_bos(tok) >= 0 ? 1 : 0;
	if (n + bos > UINT32_MAX) {
		free(ids);
		return KVT_EINVAL;
	}
	if (bos) {
		int32_t *p = realloc(ids, (n + 1) * sizeof(*p));
		if (!p) {
			free(ids);
			return KVT_ENOMEM;
		}
		memmove(p + 1, p, n * sizeof(*p));
		p[0] = kvt_tok_bos(tok);
		ids = p;
	}
	*out = ids;
	*n_out = (uint32_t)(n + bos);
	return KVT_OK;
}

/* Tokenize text into a malloc'd array (*n_out ids; room for one more), no BOS. */
static int encode(const kvt_tok *tok, const char *text, size_t len, bool parse_special, int32_t **out, size_t *n_out)
{
	size_t cap = len + 8, n = 0;
	for (int attempt = 0; attempt < 2; attempt++) {
		int32_t *ids = malloc((cap + 1) * sizeof(*ids));
		if (!ids)
			return KVT_ENOMEM;
		int rc = kvt_tok_encode(tok, text, len, parse_special, ids, cap, &n);
		if (rc == KVT_OK) {
			*out = ids;
			*n_out = n;
			return KVT_OK;
		}
		free(ids);
		if (rc != KVT_EFULL)
			return rc;
		cap = n;
	}
	return KVT_EFULL;
}

/* Tokenize text into a malloc'd array, BOS first when the model asks. */
static int tokenize(const kvt_tok *tok, const char *text, size_t len, bool parse_special, int32_t **out,
		    uint32_t *n_out)
{
	int32_t *ids = NULL;
	size_t n = 0;
	int rc = encode(tok, text, len, parse_special, &ids, &n);
	return rc == KVT_OK ? with_bos(tok, ids, n, out, n_out) : rc;
}

/* The messages of a chat body as the template's input: cm[0..*n_out) over texts (both [n + 1], caller frees). */
static int chat_messages(json_t *msgs, const char *tools_text, kvt_chat_msg *cm, char **texts, size_t *n_out,
			 kvt_req_err *e)
{
	size_t n = json_array_size(msgs);
	int ret = KVT_EINVAL;
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role");
		char param[64];
		snprintf(param, sizeof(param), "messages[%zu].role", i);
		if (!json_is_object(m)) {
			snprintf(param, sizeof(param), "messages[%zu]", i);
			kvt_req_fail(e, param, NULL, "'%s' must be an object with role and content", param);
			goto out;
		}
		const char *r = NULL;
		bool special;
		if (kvt_oai_message(m, i, &special, &r, &texts[i], &cm[i].content_len, e))
			goto out;
		if (special) { /* an assistant turn with tool calls, or a tool's result */
			cm[i].role = r;
			cm[i].content = texts[i];
			continue;
		}
		r = json_is_string(role) ? json_string_value(role) : NULL;
		if (!r || (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") && strcmp(r, "assistant"))) {
			kvt_req_fail(e, param, NULL,
				     "'%s' must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\"", param);
			goto out;
		}
		if (!strcmp(r, "developer")) /* OpenAI's newer name for the system role */
			r = "system";
		snprintf(param, sizeof(param), "messages[%zu].content", i);
		kvt_sbuf b = { 0 };
		kvt_sbuf_add(&b, "", 0);
		if (kvt_req_content(&b, json_object_get(m, "content"), param, e)) {
			free(b.p);
			goto out;
		}
		if (b.failed) {
			free(b.p);
			kvt_req_fail(e, param, NULL, "out of memory");
			goto out;
		}
		texts[i] = b.p;
		cm[i].content_len = b.n;
		cm[i].role = r;
		cm[i].content = texts[i];
	}
	/* the tools' description: appended to the first system message, or a system message of its own */
	if (tools_text) {
		size_t nt = strlen(tools_text);
		if (!strcmp(cm[0].role, "system")) {
			char *c = malloc(cm[0].content_len + 2 + nt + 1);
			if (!c) {
				kvt_req_fail(e, "messages", NULL, "out of memory");
				goto out;
			}
			memcpy(c, cm[0].content, cm[0].content_len);
			memcpy(c + cm[0].content_len, "\n\n", 2);
			memcpy(c + cm[0].content_len + 2, tools_text, nt + 1);
			free(texts[0]);
			texts[0] = c;
			cm[0].content = c;
			cm[0].content_len += 2 + nt;
		} else {
			memmove(cm + 1, cm, n * sizeof(*cm));
			memmove(texts + 1, texts, n * sizeof(*texts));
			if (!(texts[0] = strdup(tools_text))) {
				kvt_req_fail(e, "messages", NULL, "out of memory");
				goto out;
			}
			cm[0] = (kvt_chat_msg){ .role = "system", .content = texts[0], .content_len = nt };
			n++;
		}
	}
	*n_out = n;
	ret = KVT_OK;
out:
	return ret;
}

/*
 * The messages as the template lays them out: token ids (ids, with BOS as the
 * model asks) or, with text non-NULL, the prompt string (no BOS).
 */
static int chat_render(const kvt_tok *tok, json_t *msgs, const char *tools_text, int32_t **ids, uint32_t *n_ids,
		       char **text, kvt_req_err *e)
{
	if (!json_is_array(msgs) || json_array_size(msgs) == 0)
		return kvt_req_fail(e, "messages", NULL, "'messages' must be a non-empty array");
	size_t n = 0, n_cm = json_array_size(msgs) + 1;
	kvt_chat_msg *cm = calloc(n_cm, sizeof(*cm));
	char **texts = calloc(n_cm, sizeof(*texts));
	int ret = KVT_EINVAL;
	if (!cm || !texts)
		kvt_req_fail(e, "messages", NULL, "out of memory");
	else if (chat_messages(msgs, tools_text, cm, texts, &n, e) == KVT_OK) {
		int32_t *chat_ids = NULL;
		size_t n_chat = 0;
		int rc = text ? kvt_tok_chat_format(tok, cm, n, true, text)
			      : kvt_tok_chat_encode(tok, cm, n, true, &chat_ids, &n_chat);
		if (rc == KVT_OK && !text)
			rc = with_bos(tok, chat_ids, n_chat, ids, n_ids);
		if (rc == KVT_OK)
			ret = KVT_OK;
		else
			kvt_req_fail(e, "messages", NULL,
				     "the messages cannot be formatted with this model's chat template (%s)",
				     kvt_strerror(rc));
	}
	for (size_t i = 0; texts && i < n_cm; i++)
		free(texts[i]);
	free(texts);
	free(cm);
	return ret;
}

/*
 * messages -> prompt ids through the chat template: only the template's own
 * markers are special tokens; every message's text is tokenized as text.
 */
static int chat_prompt(const kvt_tok *tok, json_t *msgs, const char *tools_text, int32_t **ids, uint32_t *n_ids,
		       kvt_req_err *e)
{
	return chat_render(tok, msgs, tools_text, ids, n_ids, NULL, e);
}

int kvt_req_chat_text(const kvt_tok *tok, json_t *body, char **out, kvt_req_err *e)
{
	kvt_oai_tools tools;
	memset(&tools, 0, sizeof(tools));
	int rc = kvt_oai_tools_parse(body, &tools, e);
	if (rc == KVT_OK) {
		char *tools_text = kvt_oai_tools_prompt(&tools);
		rc = chat_render(tok, json_object_get(body, "messages"), tools_text, NULL, NULL, out, e);
		free(tools_text);
	}
	kvt_oai_tools_deinit(&tools);
	return rc;
}

/*
 * The prompt ids of a completion request: a string (or an array of one), or
 * an array of token ids. null is OpenAI's default prompt, the document
 * separator: generation starts as at the start of a new document, so the
 * prompt is the model's BOS token (its EOS where it has none).
 */
static int completion_prompt(const kvt_tok *tok, uint32_t n_vocab, json_t *prompt, bool parse_special, int32_t **ids,
			     uint32_t *n, kvt_req_err *e)
{
	if (!prompt)
		return kvt_req_fail(e, "prompt", NULL, "'prompt' is required (null: a new document)");
	if (json_is_null(prompt)) {
		int32_t start = kvt_tok_bos(tok) >= 0 ? kvt_tok_bos(tok) : kvt_tok_eos(tok);
		if (start < 0 || !(*ids = malloc(sizeof(**ids))))
			return kvt_req_fail(e, "prompt", NULL, start < 0 ? "'prompt': null needs a BOS or EOS token, and this "
							       "model has neither" : "out of memory");
		**ids = start;
		*n = 1;
		return KVT_OK;
	}
	if (json_is_array(prompt) && json_array_size(prompt) == 1 && json_is_string(json_array_get(prompt, 0)))
		prompt = json_array_get(prompt, 0);
	if (json_is_string(prompt)) {
		int rc = tokenize(tok, json_string_value(prompt), json_string_length(prompt), parse_special, ids, n);
		if (rc != KVT_OK)
			return kvt_req_fail(e, "prompt", NULL, "'prompt' could not be tokenized (%s)", kvt_strerror(rc));
		return KVT_OK;
	}
	if (!json_is_array(prompt))
		return kvt_req_fail(e, "prompt", NULL, "'prompt' must be a string or an array of token ids");
	size_t k = json_array_size(prompt);
	if (k == 0)
		return kvt_req_fail(e, "prompt", NULL, "'prompt' is empty");
	if (k > UINT32_MAX)
		return kvt_req_fail(e, "prompt", NULL, "'prompt' is too long");
	int32_t *v = malloc(k * sizeof(*v));
	if (!v)
		return kvt_req_fail(e, "prompt", NULL, "out of memory");
	for (size_t i = 0; i < k; i++) {
		json_t *t = json_array_get(prompt, i);
		long long x;
		if (!json_whole(t, &x)) {
			free(v);
			if (json_is_string(t))
				return kvt_req_fail(e, "prompt", NULL, "'prompt' as an array of strings must have exactly one element");
			return kvt_req_fail(e, "prompt", NULL, "'prompt[%zu]' must be a token id (integer)", i);
		}
		if (x < 0 || x >= (long long)n_vocab) {
			free(v);
			return kvt_req_fail(e, "prompt", NULL, "'prompt[%zu]' = %lld is not a token id (the vocabulary has %u)",
					    i, x, n_vocab);
		}
		v[i] = (int32_t)x;
	}
	*ids = v;
	*n = (uint32_t)k;
	return KVT_OK;
}

/* Completions echo: the prompt as text (a string as sent; token ids decoded, made valid UTF-8). */
static int echo_text(const kvt_tok *tok, json_t *pr, kvt_gen_request *q)
{
	if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
		pr = json_array_get(pr, 0);
	kvt_sbuf t = { 0 };
	if (json_is_string(pr)) {
		kvt_sbuf_add(&t, json_string_value(pr), json_string_length(pr));
	} else {
		for (uint32_t i = 0; i < q->n_ids; i++) {
			const char *b;
			size_t nb;
			if (kvt_tok_token_bytes(tok, q->ids[i], &b, &nb) == KVT_OK)
				kvt_sbuf_add(&t, b, nb);
		}
	}
	kvt_sbuf_add(&t, "", 0);
	if (t.failed) {
		free(t.p);
		return KVT_ENOMEM;
	}
	if (!json_is_string(pr))
		kvt_utf8_scrub(t.p);
	q->echo_text = t.p;
	q->n_echo = json_is_string(pr) ? t.n : strlen(t.p);
	return KVT_OK;
}

/*
 * Chunk reuse (docs/http-api.md, "Chunk reuse"): the spans of a chat prompt
 * whose KV is stored by their own tokens and blended in wherever they land.
 *
 * A span is the token run of its text inside the templated prompt: the text
 * (a message's whole content, or one content part's text) is tokenized alone,
 * as text, and that run is looked for in the prompt's ids from the end of the
 * span before it. The template and the text around it can merge across the
 * span's first or last token, so the run is tried whole, then without its
 * first token, without its last, without both. The search is linear
 * (Knuth-Morris-Pratt): a prompt cannot make it quadratic. A run found
 * earlier than its message (the same text quoted before) is the same tokens,
 * so as good a chunk. A span not found, or shorter than chunk_min_tokens,
 * is ordinary text.
 */
typedef struct chunk_cand {
	size_t msg;         /* index in messages */
	long part;          /* content part; -1: the whole content */
	bool marked;        /* marked "reuse": "anywhere" (else a tool message under chunk_reuse = tools) */
} chunk_cand;

/* A span found, with where it came from (chunk_cand.marked). */
typedef struct chunk_span {
	kvt_sched_chunk c;  /* tokens of the prompt */
	bool marked;        /* an explicit mark (kept first when there are too many) */
} chunk_span;

/*
 * One "kvtier" mark of a message or content part (param names it). KVT_OK
 * with *anywhere ("reuse": "anywhere") and *prefix ("reuse": "prefix": the
 * default, not a chunk; under chunk_reuse = tools it leaves a tool message
 * out) set; both false for an absent or empty mark. KVT_EINVAL with e.
 */
static int chunk_mark(json_t *o, const char *param, bool *anywhere, bool *prefix, kvt_req_err *e)
{
	*anywhere = *prefix = false;
	json_t *kv = json_object_get(o, "kvtier");
	if (!kv || json_is_null(kv))
		return KVT_OK;
	if (!json_is_object(kv))
		return kvt_req_fail(e, param, NULL, "'%s' must be an object {\"reuse\": \"anywhere\" | \"prefix\"}", param);
	const char *key;
	size_t key_len;
	json_t *v;
	json_object_keylen_foreach(kv, key, key_len, v)
	{
		if (key_len != strlen(key) || strcmp(key, "reuse"))
			return kvt_req_fail(e, param, NULL, "'%s' has an unknown field '%.64s' (allowed: reuse)", param, key);
		if (json_is_null(v))
			continue;
		const char *r = json_is_string(v) && json_string_length(v) == strlen(json_string_value(v))
					? json_string_value(v)
					: "";
		*anywhere = !strcmp(r, "anywhere");
		*prefix = !strcmp(r, "prefix");
		if (!*anywhere && !*prefix) {
			char p[112];
			snprintf(p, sizeof(p), "%s.reuse", param);
			return kvt_req_fail(e, p, NULL, "'%s' must be \"anywhere\" (a chunk, reused at any position) or "
					    "\"prefix\" (the default)", p);
		}
	}
	return KVT_OK;
}

/* One candidate more (param: its mark, for the refusal past KVT_SCHED_MAX_CHUNKS marks). */
static int cand_add(chunk_cand **c, size_t *n, size_t *cap, size_t *n_marked, chunk_cand x, const char *param,
		    kvt_req_err *e)
{
	if (x.marked && ++*n_marked > KVT_SCHED_MAX_CHUNKS)
		return kvt_req_fail(e, param, NULL, "at most %d chunk marks (\"kvtier\": {\"reuse\": \"anywhere\"}) per request",
				    KVT_SCHED_MAX_CHUNKS);
	if (*n == *cap) {
		size_t nc = *cap ? 2 * *cap : 8;
		chunk_cand *p = realloc(*c, nc * sizeof(*p));
		if (!p)
			return KVT_ENOMEM;
		*c = p;
		*cap = nc;
	}
	(*c)[(*n)++] = x;
	return KVT_OK;
}

/*
 * The marks of every message and content part (already a valid chat body)
 * into *out (malloc'd, *n_out of them, in prompt order), with the tool
 * messages chunk_reuse = tools adds (not one with a part marked, nor one
 * marked "prefix"). Marks are checked whatever the mode. KVT_OK; KVT_EINVAL
 * with e (a bad mark, a part marked inside a message marked whole, more than
 * KVT_SCHED_MAX_CHUNKS marks); KVT_ENOMEM.
 */
static int chunk_cands(const kvt_req_limits *lim, json_t *msgs, chunk_cand **out, size_t *n_out, kvt_req_err *e)
{
	size_t n = 0, cap = 0, n_marked = 0;
	chunk_cand *c = NULL;
	char param[96];
	int rc = KVT_OK;
	for (size_t i = 0; i < json_array_size(msgs) && rc == KVT_OK; i++) {
		json_t *m = json_array_get(msgs, i), *content = json_object_get(m, "content");
		bool whole, prefix, any_part = false;
		snprintf(param, sizeof(param), "messages[%zu].kvtier", i);
		if ((rc = chunk_mark(m, param, &whole, &prefix, e)) != KVT_OK)
			break;
		/* a message marked whole has no part marked, so its parts' candidates and its own never mix */
		for (size_t k = 0; json_is_array(content) && k < json_array_size(content) && rc == KVT_OK; k++) {
			bool part, part_prefix;
			snprintf(param, sizeof(param), "messages[%zu].content[%zu].kvtier", i, k);
			if ((rc = chunk_mark(json_array_get(content, k), param, &part, &part_prefix, e)) != KVT_OK)
				break;
			if (part && whole)
				rc = kvt_req_fail(e, param, NULL, "'%s' marks a part of a message marked as a whole "
						  "('messages[%zu].kvtier')", param, i);
			else if (part)
				rc = cand_add(&c, &n, &cap, &n_marked, (chunk_cand){ i, (long)k, true }, param, e);
			any_part = any_part || part;
		}
		if (rc != KVT_OK)
			break;
		const char *role = json_string_value(json_object_get(m, "role"));
		bool tool = lim->chunk_reuse == KVT_CHUNK_REUSE_TOOLS && role && !strcmp(role, "tool") && !prefix && !any_part;
		snprintf(param, sizeof(param), "messages[%zu].kvtier", i);
		if (whole || tool)
			rc = cand_add(&c, &n, &cap, &n_marked, (chunk_cand){ i, -1, whole }, param, e);
	}
	if (rc != KVT_OK) {
		free(c);
		return rc;
	}
	*out = c;
	*n_out = n;
	return KVT_OK;
}

/*
 * The first run r[0..m) in ids[from..n) (Knuth-Morris-Pratt; fail: [m]
 * scratch): true with *at. Each id of ids read takes one from *budget; at 0
 * the search gives up (false).
 */
static bool run_find(const int32_t *ids, uint32_t n, uint32_t from, const int32_t *r, uint32_t m, uint32_t *fail,
		     uint64_t *budget, uint32_t *at)
{
	if (m == 0 || from > n || n - from < m)
		return false;
	fail[0] = 0; /* fail[i]: the longest proper prefix of r[0..i] that is also its suffix */
	for (uint32_t i = 1, k = 0; i < m; i++) {
		while (k && r[i] != r[k])
			k = fail[k - 1];
		if (r[i] == r[k])
			k++;
		fail[i] = k;
	}
	for (uint32_t i = from, k = 0; i < n; i++) {
		if (*budget == 0)
			return false;
		--*budget;
		while (k && ids[i] != r[k])
			k = fail[k - 1];
		if (ids[i] == r[k] && ++k == m) {
			*at = i + 1 - m;
			return true;
		}
	}
	return false;
}

/*
 * The tokens of one candidate's text in ids[from..n_ids): KVT_OK with *found,
 * and *out (the run found, whole or less its first and/or last token: see
 * above) when it is; KVT_ENOMEM. budget: as run_find's.
 */
static int chunk_find(const kvt_tok *tok, json_t *msgs, const chunk_cand *cd, const int32_t *ids, uint32_t n_ids,
		      uint32_t from, uint64_t *budget, kvt_sched_chunk *out, bool *found)
{
	json_t *content = json_object_get(json_array_get(msgs, cd->msg), "content");
	kvt_sbuf b = { 0 };
	kvt_sbuf_add(&b, "", 0);
	if (cd->part >= 0) {
		json_t *t = json_object_get(json_array_get(content, (size_t)cd->part), "text");
		kvt_sbuf_add(&b, json_string_value(t), json_string_length(t));
	} else if (content && !json_is_null(content)) {
		kvt_req_err ignored; /* the prompt builder read the same content */
		kvt_req_content(&b, content, "", &ignored);
	}
	int32_t *r = NULL;
	uint32_t *fail = NULL;
	size_t m = 0;
	int rc = b.failed ? KVT_ENOMEM : encode(tok, b.p, b.n, false, &r, &m);
	free(b.p);
	*found = false;
	if (rc == KVT_OK && m > 0 && m <= n_ids && !(fail = malloc(m * sizeof(*fail))))
		rc = KVT_ENOMEM;
	static const uint32_t cut[4][2] = { { 0, 0 }, { 1, 0 }, { 0, 1 }, { 1, 1 } }; /* tokens off the front, the back */
	for (int v = 0; rc == KVT_OK && fail && v < 4 && !*found; v++) {
		uint32_t at, len = (uint32_t)m - cut[v][0] - cut[v][1];
		if (m > cut[v][0] + cut[v][1] && run_find(ids, n_ids, from, r + cut[v][0], len, fail, budget, &at)) {
			*out = (kvt_sched_chunk){ .start = at, .n = len };
			*found = true;
		}
	}
	free(fail);
	free(r);
	return rc == KVT_ENOMEM ? KVT_ENOMEM : KVT_OK; /* text that does not tokenize: not found */
}

/*
 * Step 2's chunk spans into q->sched.chunks (chat; prompt ids built): the
 * candidates found, at least chunk_min_tokens long, in prompt order. Past
 * KVT_SCHED_MAX_CHUNKS (only the tool messages chunk_reuse = tools adds can
 * take it there) the earliest added ones are ordinary text: a conversation's
 * older tool results are the likeliest to be in its cached prefix already.
 *
 * NOTE: a candidate found costs the ids from the span before it to its end;
 * one not found costs four scans to the prompt's end, and chunk_reuse = tools
 * may have a candidate for every few tokens. So all the searches together
 * read at most CHUNK_SEARCH_PASSES times the prompt; the candidates left when
 * that runs out are ordinary text.
 */
#define CHUNK_SEARCH_PASSES 16
static int chunk_spans(const kvt_req_limits *lim, const kvt_tok *tok, json_t *body, kvt_gen_request *q,
		       kvt_req_err *e)
{
	json_t *msgs = json_object_get(body, "messages");
	chunk_cand *cands = NULL;
	size_t n_cands = 0;
	int rc = chunk_cands(lim, msgs, &cands, &n_cands, e);
	if (rc != KVT_OK)
		return rc;
	chunk_span *sp = lim->chunk_reuse != KVT_CHUNK_REUSE_OFF && n_cands ? malloc(n_cands * sizeof(*sp)) : NULL;
	size_t n_sp = 0;
	uint32_t from = 0;
	uint64_t budget = (uint64_t)CHUNK_SEARCH_PASSES * q->n_ids;
	if (lim->chunk_reuse != KVT_CHUNK_REUSE_OFF && n_cands && !sp)
		rc = KVT_ENOMEM;
	for (size_t i = 0; sp && i < n_cands && rc == KVT_OK; i++) {
		kvt_sched_chunk c;
		bool found;
		if ((rc = chunk_find(tok, msgs, &cands[i], q->ids, q->n_ids, from, &budget, &c, &found)) != KVT_OK)
			break;
		if (!found) {
			if (cands[i].part >= 0)
				KVT_LOGD("request: messages[%zu].content[%ld]: its tokens are not one run of the prompt; "
					 "ordinary text, not a chunk", cands[i].msg, cands[i].part);
			else
				KVT_LOGD("request: messages[%zu]: its tokens are not one run of the prompt; ordinary text, "
					 "not a chunk", cands[i].msg);
			continue;
		}
		from = c.start + c.n;
		if (c.n < lim->chunk_min_tokens)
			continue;
		sp[n_sp++] = (chunk_span){ .c = c, .marked = cands[i].marked };
	}
	free(cands);
	if (rc != KVT_OK) {
		free(sp);
		return rc;
	}
	/* NOTE: at most KVT_SCHED_MAX_CHUNKS spans are marked (chunk_cands), so the ones dropped are all added ones */
	size_t drop = n_sp > KVT_SCHED_MAX_CHUNKS ? n_sp - KVT_SCHED_MAX_CHUNKS : 0;
	q->sched.n_chunks = 0;
	for (size_t i = 0; i < n_sp; i++) {
		if (!sp[i].marked && drop) {
			drop--;
			continue;
		}
		q->sched.chunks[q->sched.n_chunks++] = sp[i].c;
	}
	free(sp);
	return KVT_OK;
}

int kvt_gen_request_prompt(const kvt_req_limits *lim, const kvt_tok *tok, json_t *body, kvt_gen_request *q,
			   kvt_req_err *e)
{
	const char *field = q->chat ? "messages" : "prompt";
	int rc;
	if (q->chat) {
		char *tools_text = kvt_oai_tools_prompt(&q->tools);
		rc = chat_prompt(tok, json_object_get(body, "messages"), tools_text, &q->ids, &q->n_ids, e);
		free(tools_text);
	} else {
		rc = completion_prompt(tok, lim->n_vocab, json_object_get(body, "prompt"), q->parse_special, &q->ids,
				       &q->n_ids, e);
	}
	if (rc != KVT_OK)
		return rc;
	if (q->n_ids == 0)
		return kvt_req_fail(e, field, NULL, "the prompt is empty");
	for (uint32_t i = 0; i < q->n_ids; i++)
		if (q->ids[i] < 0 || (uint32_t)q->ids[i] >= lim->n_vocab) /* a tokenizer bigger than the model */
			return kvt_req_fail(e, field, NULL, "the prompt has token id %d, outside the model's vocabulary (%u)",
					    q->ids[i], lim->n_vocab);
	/* the prompt must leave room for one token (OpenAI's context_length_exceeded); then max_tokens must fit */
	if (q->n_ids >= lim->max_ctx)
		return kvt_req_fail(e, field, "context_length_exceeded",
				    "the prompt is too long: %u tokens, and the model's context is %u tokens (the prompt "
				    "must leave room for at least one generated token); shorten the %s",
				    q->n_ids, lim->max_ctx, field);
	if ((uint64_t)q->n_ids + q->sched.max_tokens > lim->max_ctx) {
		if (q->max_tokens_set)
			return kvt_req_fail(e, q->max_tokens_key, NULL,
					    "the prompt (%u tokens) plus '%s' (%u) exceeds the context (%u tokens): "
					    "'%s' may be at most %u for this prompt",
					    q->n_ids, q->max_tokens_key, q->sched.max_tokens, lim->max_ctx,
					    q->max_tokens_key, lim->max_ctx - q->n_ids);
		q->sched.max_tokens = lim->max_ctx - q->n_ids; /* the default: what the context leaves */
	}
	if (q->echo && (rc = echo_text(tok, json_object_get(body, "prompt"), q)) != KVT_OK)
		return rc;
	char *tools_text = q->chat ? kvt_oai_tools_prompt(&q->tools) : NULL;
	rc = kvt_cachectl_parse(tok, body, q->chat, tools_text, q->ids, q->n_ids, &q->cc, e);
	free(tools_text);
	if (rc != KVT_OK)
		return rc;
	if (q->chat && (rc = chunk_spans(lim, tok, body, q, e)) != KVT_OK)
		return rc;
	q->sched.prompt = q->ids;
	q->sched.n_prompt = q->n_ids;
	memcpy(q->sched.retain, q->cc.retain, sizeof(q->sched.retain));
	q->sched.n_retain = q->cc.n_retain;
	return KVT_OK;
}

void kvt_gen_request_deinit(kvt_gen_request *q)
{
	if (!q)
		return;
	kvt_grammar_unref(q->sched.grammar);
	kvt_oai_tools_deinit(&q->tools);
	for (uint32_t i = 0; i < q->n_stops; i++)
		free(q->stops[i]);
	free(q->ids);
	free(q->echo_text);
	memset(q, 0, sizeof(*q));
}
