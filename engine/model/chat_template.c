/*
 * engine/model/chat_template.c — the chat template families (ChatML, Gemma,
 * Mistral, Llama 3): which one a model uses, and a conversation rendered as a
 * prompt string or as token ids.
 *
 * Design: no Jinja. A stored tokenizer.chat_template is recognised by its
 * markers, as llama.cpp's llm_chat_detect_template does, and each family is
 * rendered by hand the way llama.cpp's built-in templates render it (which
 * follow each family's published Jinja template); a GGUF without a template
 * gets its family from general.architecture. One walk per family produces the
 * conversation as a run of pieces, markers and text, so the string
 * (kvt_tok_chat_format) and the ids (kvt_tok_chat_encode) cannot disagree.
 *
 * Invariants: only a family's own markers become control tokens; every other
 * piece (roles, message contents) is encoded with no special tokens parsed,
 * so a message cannot close its turn or open a forged one. The chat fields of
 * a kvt_tok are set at creation (tok_chat_from_template, tok_chat_from_arch)
 * or by kvt_tok_set_chat before the tokenizer is shared; formatting only
 * reads them.
 */
#include "tokenizer_int.h"

#include "gguf.h"

#include <stdlib.h>
#include <string.h>

static const char *const tok_chat_names[] = { "auto", "chatml", "gemma", "mistral", "llama3" };

/* ---- the family of a model (at creation) ---- */

/* Copy a Jinja string-literal fragment, undoing its backslash escapes. */
static char *tok_jinja_unescape(const char *s, size_t n)
{
	char *o = malloc(n + 1);
	size_t k = 0;

	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '\\' && i + 1 < n) {
			char c = s[++i];

			o[k++] = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
			continue;
		}
		o[k++] = s[i];
	}
	o[k] = '\0';
	return o;
}

/*
 * The family of a stored template, recognised by its markers as llama.cpp's
 * llm_chat_detect_template does; KVT_TOK_CHAT_AUTO for none (or no template).
 */
static int tok_chat_detect(const char *tmpl)
{
	if (!tmpl)
		return KVT_TOK_CHAT_AUTO;
	if (strstr(tmpl, "<|im_start|>"))
		return KVT_TOK_CHAT_CHATML;
	if (strstr(tmpl, "<start_of_turn>"))
		return KVT_TOK_CHAT_GEMMA;
	if (strstr(tmpl, "<|start_header_id|>") && strstr(tmpl, "<|end_header_id|>"))
		return KVT_TOK_CHAT_LLAMA3;
	if (strstr(tmpl, "[INST]"))
		return KVT_TOK_CHAT_MISTRAL;
	return KVT_TOK_CHAT_AUTO;
}

/*
 * ChatML detection and the default system prompt: a template literal
 * "<|im_start|>system" + newline (real or the escape \n) + text + "<|im_end|>"
 * whose text holds no quote or Jinja expression is the prompt the template
 * inserts when the first message is not a system message (SmolLM2, Qwen2.5).
 */
int tok_chat_from_template(kvt_tok *t, const char *tmpl)
{
	static const char head[] = "<|im_start|>system";
	const char *p;

	t->chat = tok_chat_detect(tmpl);
	t->chat_unknown = tmpl && t->chat == KVT_TOK_CHAT_AUTO;
	if (t->chat != KVT_TOK_CHAT_CHATML)
		return KVT_OK;
	for (p = strstr(tmpl, head); p; p = strstr(p + 1, head)) {
		const char *s = p + sizeof(head) - 1, *e;
		bool literal = true;

		if (s[0] == '\n')
			s += 1;
		else if (s[0] == '\\' && s[1] == 'n')
			s += 2;
		else
			continue;
		e = strstr(s, "<|im_end|>");
		if (!e || e == s)
			continue;
		for (const char *q = s; q < e; q++) {
			if (*q == '\\') {
				q++;
				continue;
			}
			if (*q == '\'' || *q == '"' || (*q == '{' && (q[1] == '{' || q[1] == '%')))
				literal = false;
		}
		if (!literal)
			continue;
		t->default_system = tok_jinja_unescape(s, (size_t)(e - s));
		return t->default_system ? KVT_OK : KVT_ENOMEM;
	}
	return KVT_OK;
}

/*
 * No tokenizer.chat_template (the Gemma 3 270M GGUF has none): choose the
 * family the architecture's models are trained on, and say so.
 */
void tok_chat_from_arch(kvt_tok *t, const struct kvt_gguf *g)
{
	kvt_gguf_str arch;

	if (kvt_gguf_get_str(g, "general.architecture", &arch) != KVT_OK)
		return;
	if (arch.len >= 5 && memcmp(arch.ptr, "gemma", 5) == 0)
		t->chat = KVT_TOK_CHAT_GEMMA;
	else if ((arch.len == 5 && memcmp(arch.ptr, "qwen2", 5) == 0) ||
		 (arch.len == 5 && memcmp(arch.ptr, "qwen3", 5) == 0))
		t->chat = KVT_TOK_CHAT_CHATML;
	else
		return;
	KVT_LOGI("%s: no tokenizer.chat_template; using the %s chat template for architecture %.*s",
		 kvt_gguf_path(g), tok_chat_names[t->chat], (int)(arch.len > 32 ? 32 : arch.len), arch.ptr);
}

/* ---- a conversation as pieces: the string and the ids ---- */

/*
 * A conversation as a run of pieces: the template's own markers
 * (<|im_start|>, <start_of_turn>, [INST], <|eot_id|>, ...) and text (roles,
 * newlines, message contents). kvt_tok_chat_format joins them into a string;
 * kvt_tok_chat_encode turns markers into their token ids and encodes the text
 * between two markers as one fragment with no special tokens parsed, so a
 * message cannot carry a control token in its text.
 *
 * The families, as llama.cpp's built-in templates render them (which follow
 * each family's published Jinja template):
 *   chatml   <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n
 *            (content as is; SmolLM2/Qwen's default system prompt, see above)
 *   gemma    <start_of_turn>role\ncontent<end_of_turn>\n ... <start_of_turn>model\n
 *            (assistant is "model"; contents trimmed; system messages, trimmed and
 *            joined, open the next user turn followed by "\n\n")
 *   mistral  [INST] system\n\nuser[/INST] assistant</s>[INST] ...
 *            (Mistral's v3 layout: contents as is, assistant trimmed; a marker the
 *            vocabulary lacks, as [INST] in v1 vocabularies, is encoded as text)
 *   llama3   <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ...
 *            <|start_header_id|>assistant<|end_header_id|>\n\n (contents trimmed)
 * BOS is never part of it: callers add it as kvt_tok_add_bos() says.
 */
typedef int (*tok_chat_piece_fn)(void *ctx, bool marker, const char *s, size_t len);

/* Bytes of message i's content, and (trim) the same without leading/trailing isspace() bytes. */
static void tok_chat_content(const kvt_chat_msg *m, bool trim, const char **s, size_t *n)
{
	const char *p = m->content;
	size_t len = m->content_len ? m->content_len : strlen(p);

	/* isspace() in the C locale, as llama.cpp's trim. */
	while (trim && len && (p[0] == ' ' || (p[0] >= '\t' && p[0] <= '\r'))) {
		p++;
		len--;
	}
	while (trim && len && (p[len - 1] == ' ' || (p[len - 1] >= '\t' && p[len - 1] <= '\r')))
		len--;
	*s = p;
	*n = len;
}

#define KVT_CHAT_PUT(marker, str, len)                                     \
	do {                                                               \
		if ((rc = fn(ctx, (marker), (str), (len))))                 \
			return rc;                                         \
	} while (0)
#define KVT_CHAT_LIT(marker, lit) KVT_CHAT_PUT(marker, lit, sizeof(lit) - 1)

static int tok_chat_chatml(const kvt_tok *t, const kvt_chat_msg *msgs, size_t n_msgs, bool add_gen,
			   tok_chat_piece_fn fn, void *ctx)
{
	bool add_system = n_msgs && t->default_system && strcmp(msgs[0].role, "system") != 0;
	int rc;

	for (size_t i = add_system ? 0 : 1; i <= n_msgs; i++) {
		const char *role = i ? msgs[i - 1].role : "system";
		const char *content = t->default_system;
		size_t n_content = content ? strlen(content) : 0;

		if (i)
			tok_chat_content(&msgs[i - 1], false, &content, &n_content);
		KVT_CHAT_LIT(true, "<|im_start|>");
		KVT_CHAT_PUT(false, role, strlen(role));
		KVT_CHAT_LIT(false, "\n");
		KVT_CHAT_PUT(false, content, n_content);
		KVT_CHAT_LIT(true, "<|im_end|>");
		KVT_CHAT_LIT(false, "\n");
	}
	if (add_gen) {
		KVT_CHAT_LIT(true, "<|im_start|>");
		KVT_CHAT_LIT(false, "assistant\n");
	}
	return KVT_OK;
}

static int tok_chat_gemma(const kvt_chat_msg *msgs, size_t n_msgs, bool add_gen, tok_chat_piece_fn fn,
			  void *ctx)
{
	size_t first_system = n_msgs; /* systems not yet folded into a user turn: [first_system, i) */
	int rc;

	for (size_t i = 0; i < n_msgs; i++) {
		const char *role = msgs[i].role, *c;
		size_t n_c;

		if (strcmp(role, "system") == 0) {
			if (first_system == n_msgs)
				first_system = i;
			continue;
		}
		bool model = strcmp(role, "assistant") == 0;

		if (model)
			role = "model";
		KVT_CHAT_LIT(true, "<start_of_turn>");
		KVT_CHAT_PUT(false, role, strlen(role));
		KVT_CHAT_LIT(false, "\n");
		if (!model && first_system < n_msgs) {
			bool any = false;

			for (size_t j = first_system; j < i; j++) {
				if (strcmp(msgs[j].role, "system") != 0)
					continue;
				tok_chat_content(&msgs[j], true, &c, &n_c);
				KVT_CHAT_PUT(false, c, n_c);
				any = any || n_c;
			}
			/* NOTE: as llama.cpp, an all-blank system prompt adds nothing, not even "\n\n". */
			if (any)
				KVT_CHAT_LIT(false, "\n\n");
			first_system = n_msgs;
		}
		tok_chat_content(&msgs[i], true, &c, &n_c);
		KVT_CHAT_PUT(false, c, n_c);
		KVT_CHAT_LIT(true, "<end_of_turn>");
		KVT_CHAT_LIT(false, "\n");
	}
	if (add_gen) {
		KVT_CHAT_LIT(true, "<start_of_turn>");
		KVT_CHAT_LIT(false, "model\n");
	}
	return KVT_OK;
}

static int tok_chat_mistral(const kvt_chat_msg *msgs, size_t n_msgs, tok_chat_piece_fn fn, void *ctx)
{
	bool in_turn = false;
	int rc;

	for (size_t i = 0; i < n_msgs; i++) {
		const char *c;
		size_t n_c;

		if (!in_turn) {
			KVT_CHAT_LIT(true, "[INST]");
			KVT_CHAT_LIT(false, " ");
			in_turn = true;
		}
		if (strcmp(msgs[i].role, "system") == 0) {
			tok_chat_content(&msgs[i], false, &c, &n_c);
			KVT_CHAT_PUT(false, c, n_c);
			KVT_CHAT_LIT(false, "\n\n");
		} else if (strcmp(msgs[i].role, "user") == 0) {
			tok_chat_content(&msgs[i], false, &c, &n_c);
			KVT_CHAT_PUT(false, c, n_c);
			KVT_CHAT_LIT(true, "[/INST]");
		} else {
			tok_chat_content(&msgs[i], true, &c, &n_c);
			KVT_CHAT_LIT(false, " ");
			KVT_CHAT_PUT(false, c, n_c);
			KVT_CHAT_LIT(true, "</s>");
			in_turn = false;
		}
	}
	/* The generation prompt is the open turn itself: nothing to add. */
	return KVT_OK;
}

static int tok_chat_llama3(const kvt_chat_msg *msgs, size_t n_msgs, bool add_gen, tok_chat_piece_fn fn,
			   void *ctx)
{
	int rc;

	for (size_t i = 0; i < n_msgs; i++) {
		const char *c;
		size_t n_c;

		tok_chat_content(&msgs[i], true, &c, &n_c);
		KVT_CHAT_LIT(true, "<|start_header_id|>");
		KVT_CHAT_PUT(false, msgs[i].role, strlen(msgs[i].role));
		KVT_CHAT_LIT(true, "<|end_header_id|>");
		KVT_CHAT_LIT(false, "\n\n");
		KVT_CHAT_PUT(false, c, n_c);
		KVT_CHAT_LIT(true, "<|eot_id|>");
	}
	if (add_gen) {
		KVT_CHAT_LIT(true, "<|start_header_id|>");
		KVT_CHAT_LIT(false, "assistant");
		KVT_CHAT_LIT(true, "<|end_header_id|>");
		KVT_CHAT_LIT(false, "\n\n");
	}
	return KVT_OK;
}

#undef KVT_CHAT_LIT
#undef KVT_CHAT_PUT

static int tok_chat_walk(const kvt_tok *t, const kvt_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
			 tok_chat_piece_fn fn, void *ctx)
{
	if (t->chat == KVT_TOK_CHAT_AUTO) {
		if (t->chat_unknown)
			KVT_LOGE("tokenizer: the model's chat template is none of chatml, gemma, mistral, llama3 "
				 "(no <|im_start|>, <start_of_turn>, <|start_header_id|> or [INST] in it); "
				 "set [model] chat_template to one of them");
		else
			KVT_LOGE("tokenizer: the model has no chat template; set [model] chat_template to "
				 "chatml, gemma, mistral or llama3");
		return KVT_EUNSUPPORTED;
	}
	if (n_msgs && !msgs) {
		KVT_LOGE("tokenizer: chat: NULL message array of %zu messages", n_msgs);
		return KVT_EINVAL;
	}
	for (size_t i = 0; i < n_msgs; i++)
		if (!msgs[i].role || !msgs[i].content) {
			KVT_LOGE("tokenizer: chat message %zu: NULL %s", i, msgs[i].role ? "content" : "role");
			return KVT_EINVAL;
		}
	switch (t->chat) {
	case KVT_TOK_CHAT_CHATML:
		return tok_chat_chatml(t, msgs, n_msgs, add_generation_prompt, fn, ctx);
	case KVT_TOK_CHAT_GEMMA:
		return tok_chat_gemma(msgs, n_msgs, add_generation_prompt, fn, ctx);
	case KVT_TOK_CHAT_MISTRAL:
		return tok_chat_mistral(msgs, n_msgs, fn, ctx);
	default:
		return tok_chat_llama3(msgs, n_msgs, add_generation_prompt, fn, ctx);
	}
}

struct tok_chat_str {
	char *buf;  /* NULL while counting */
	size_t len; /* bytes so far */
};

static int tok_chat_str_piece(void *ctx, bool marker, const char *s, size_t len)
{
	struct tok_chat_str *c = ctx;

	if (len > SIZE_MAX - 1 - c->len)
		return KVT_ENOMEM;
	if (c->buf)
		memcpy(c->buf + c->len, s, len);
	c->len += len;
	return KVT_OK;
}

int kvt_tok_chat_parse(const char *name, int *kind)
{
	for (int i = 0; i < (int)(sizeof(tok_chat_names) / sizeof(tok_chat_names[0])); i++)
		if (name && strcmp(name, tok_chat_names[i]) == 0) {
			*kind = i;
			return KVT_OK;
		}
	return KVT_EINVAL;
}

const char *kvt_tok_chat_name(int kind)
{
	return kind >= 0 && kind < (int)(sizeof(tok_chat_names) / sizeof(tok_chat_names[0]))
		       ? tok_chat_names[kind]
		       : "?";
}

int kvt_tok_chat_kind(const kvt_tok *t)
{
	return t->chat;
}

int kvt_tok_set_chat(kvt_tok *t, int kind)
{
	if (kind < KVT_TOK_CHAT_AUTO || kind > KVT_TOK_CHAT_LLAMA3) {
		KVT_LOGE("tokenizer: chat template kind %d is not one of auto, chatml, gemma, mistral, llama3", kind);
		return KVT_EINVAL;
	}
	if (kind == KVT_TOK_CHAT_AUTO)
		return KVT_OK;
	if (kind != t->chat)
		KVT_LOGI("tokenizer: chat template forced to %s (the model's: %s)", tok_chat_names[kind],
			 t->chat_unknown ? "unrecognised" : t->chat ? tok_chat_names[t->chat] : "none");
	t->chat = kind;
	t->chat_unknown = false;
	return KVT_OK;
}

int kvt_tok_chat_format(const kvt_tok *t, const kvt_chat_msg *msgs, size_t n_msgs,
			bool add_generation_prompt, char **out)
{
	struct tok_chat_str c = { 0 };
	int rc = tok_chat_walk(t, msgs, n_msgs, add_generation_prompt, tok_chat_str_piece, &c);

	if (rc == KVT_OK && !(c.buf = malloc(c.len + 1)))
		rc = KVT_ENOMEM;
	if (rc == KVT_ENOMEM)
		KVT_LOGE("tokenizer: chat: out of memory for a %zu-byte prompt", c.len);
	if (rc)
		return rc;
	c.len = 0;
	rc = tok_chat_walk(t, msgs, n_msgs, add_generation_prompt, tok_chat_str_piece, &c);
	KVT_ASSERT(rc == KVT_OK); /* the same walk that just counted */
	c.buf[c.len] = '\0';
	*out = c.buf;
	return KVT_OK;
}

struct tok_chat_ids {
	const kvt_tok *t; /* borrowed: the tokenizer encoding the text */
	char *text;       /* text since the last marker (malloc'd) */
	size_t n_text;    /* bytes in text */
	size_t cap_text;  /* bytes allocated for text */
	int32_t *ids;     /* the prompt so far (malloc'd) */
	size_t n_ids;     /* ids in ids */
	size_t cap_ids;   /* ids allocated */
};

/* Encode the pending text (no special tokens parsed) onto the ids. */
static int tok_chat_ids_flush(struct tok_chat_ids *c)
{
	for (size_t want = c->n_text + 8;;) {
		size_t n = 0;
		int rc;

		if ((rc = tok_reserve((void **)&c->ids, &c->cap_ids, c->n_ids + want, sizeof(int32_t))))
			return rc;
		rc = kvt_tok_encode(c->t, c->text, c->n_text, false, c->ids + c->n_ids, c->cap_ids - c->n_ids, &n);
		if (rc == KVT_OK) {
			c->n_ids += n;
			c->n_text = 0;
			return KVT_OK;
		}
		if (rc != KVT_EFULL)
			return rc;
		want = n;
	}
}

static int tok_chat_ids_piece(void *ctx, bool marker, const char *s, size_t len)
{
	struct tok_chat_ids *c = ctx;
	int rc;

	if (!marker) {
		if (len > SIZE_MAX / 2 - c->n_text)
			return KVT_ENOMEM;
		if ((rc = tok_reserve((void **)&c->text, &c->cap_text, c->n_text + len, 1)))
			return rc;
		memcpy(c->text + c->n_text, s, len);
		c->n_text += len;
		return KVT_OK;
	}
	int32_t id = tok_find_text(c->t, s, len);
	if (id < 0 && c->t->chat == KVT_TOK_CHAT_MISTRAL)
		return tok_chat_ids_piece(ctx, false, s, len); /* [INST] is text in v1 vocabularies */
	if (id < 0) {
		KVT_LOGE("tokenizer: chat: the template's marker %.*s is not a token of the vocabulary", (int)len, s);
		return KVT_EUNSUPPORTED;
	}
	if ((rc = tok_chat_ids_flush(c)) ||
	    (rc = tok_reserve((void **)&c->ids, &c->cap_ids, c->n_ids + 1, sizeof(int32_t))))
		return rc;
	c->ids[c->n_ids++] = id;
	return KVT_OK;
}

int kvt_tok_chat_encode(const kvt_tok *t, const kvt_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
			int32_t **ids, size_t *n_ids)
{
	struct tok_chat_ids c = { .t = t };
	int rc = tok_chat_walk(t, msgs, n_msgs, add_generation_prompt, tok_chat_ids_piece, &c);

	if (rc == KVT_OK)
		rc = tok_chat_ids_flush(&c);
	if (rc == KVT_OK && !c.ids) /* nothing to encode: an empty, freeable array */
		rc = tok_reserve((void **)&c.ids, &c.cap_ids, 1, sizeof(int32_t));
	free(c.text);
	if (rc) {
		if (rc == KVT_ENOMEM)
			KVT_LOGE("tokenizer: chat: out of memory encoding %zu messages", n_msgs);
		free(c.ids);
		return rc;
	}
	*ids = c.ids;
	*n_ids = c.n_ids;
	return KVT_OK;
}
