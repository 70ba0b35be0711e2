/*
 * tests/test_tok_spm.c — SentencePiece vocabularies and the chat template families
 * on small vocabularies the test builds (no model needed).
 * ctest-labels: unit
 *
 * The SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>
 * (BYTE type), single characters and a few merged pieces whose scores make
 * the expected merge order easy to follow, the U+2581 space, CONTROL chat
 * markers and one USER_DEFINED token. Checked: merges by score (and the
 * leftmost pair on ties), byte fallback for characters the vocabulary lacks
 * (and decoding them back, whole and streamed across tokens), add_space_prefix
 * on and off (after specials too), UNK for a byte without a token, specials
 * with and without parse_special, decoding of U+2581/BYTE/UNUSED tokens, a
 * vocabulary written to a GGUF and read back with llama.cpp's defaults, and
 * every chat family rendered and encoded, forced by kvt_tok_set_chat, and the
 * errors for an unknown or missing template. The expected chat strings are
 * the output of llama.cpp's built-in templates (llama-cpp-python 0.3.16,
 * llama_chat_apply_template with "gemma", "mistral-v3", "llama3" and
 * "chatml", add_ass on) for the same messages.
 */
#include "check.h"
#include "gguf.h"
#include "tokenizer.h"

#include <unistd.h>

#define MAX_TOK 512

/* The vocabulary under construction (texts are string literals or owned byte names). */
struct vocab {
	const char *text[MAX_TOK]; /* token texts */
	size_t len[MAX_TOK];       /* byte lengths */
	int32_t type[MAX_TOK];     /* token types */
	float score[MAX_TOK];      /* scores */
	uint32_t n;                /* tokens */
	char bytes[256][7];        /* "<0xXX>" texts */
};

static int32_t add(struct vocab *v, const char *text, int32_t type, float score)
{
	v->text[v->n] = text;
	v->len[v->n] = strlen(text);
	v->type[v->n] = type;
	v->score[v->n] = score;
	return (int32_t)v->n++;
}

static int32_t find(const struct vocab *v, const char *text)
{
	for (uint32_t i = 0; i < v->n; i++)
		if (v->len[i] == strlen(text) && memcmp(v->text[i], text, v->len[i]) == 0)
			return (int32_t)i;
	return -1;
}

#define SP "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* ids: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then the pieces. */
static void build(struct vocab *v, bool with_a_byte)
{
	memset(v, 0, sizeof(*v));
	add(v, "<unk>", KVT_TOK_UNKNOWN, 0);
	add(v, "<s>", KVT_TOK_CONTROL, 0);
	add(v, "</s>", KVT_TOK_CONTROL, 0);
	for (int b = 0; b < 256; b++) {
		snprintf(v->bytes[b], sizeof(v->bytes[b]), "<0x%02X>", b);
		/* with_a_byte false: no <0x41> (A), to exercise the one-character and UNK fallbacks. */
		if (b == 0x41 && !with_a_byte)
			snprintf(v->bytes[b], sizeof(v->bytes[b]), "<0xZZ>");
		add(v, v->bytes[b], KVT_TOK_BYTE, 0);
	}
	add(v, SP, KVT_TOK_NORMAL, -1);
	for (const char *c = "abcdehlorw"; *c; c++) {
		static char one[16][2];
		size_t k = (size_t)(c - "abcdehlorw");

		one[k][0] = *c;
		add(v, one[k], KVT_TOK_NORMAL, -2);
	}
	add(v, "\xc3\xa9", KVT_TOK_NORMAL, -2); /* é */
	add(v, "ab", KVT_TOK_NORMAL, -5);
	add(v, "bc", KVT_TOK_NORMAL, -3); /* higher than ab: "abc" -> a + bc */
	add(v, "he", KVT_TOK_NORMAL, -4);
	add(v, "ll", KVT_TOK_NORMAL, -4);
	add(v, "hell", KVT_TOK_NORMAL, -6);
	add(v, "hello", KVT_TOK_NORMAL, -7);
	add(v, SP "hello", KVT_TOK_NORMAL, -8);
	add(v, "wo", KVT_TOK_NORMAL, -4);
	add(v, "or", KVT_TOK_NORMAL, -4); /* same score as wo: leftmost first */
	add(v, "dd", KVT_TOK_NORMAL, -4);
	add(v, "<start_of_turn>", KVT_TOK_CONTROL, 0);
	add(v, "<end_of_turn>", KVT_TOK_CONTROL, 0);
	add(v, "[INST]", KVT_TOK_CONTROL, 0);
	add(v, "[/INST]", KVT_TOK_CONTROL, 0);
	add(v, "<|start_header_id|>", KVT_TOK_CONTROL, 0);
	add(v, "<|end_header_id|>", KVT_TOK_CONTROL, 0);
	add(v, "<|eot_id|>", KVT_TOK_CONTROL, 0);
	add(v, "<|im_start|>", KVT_TOK_CONTROL, 0);
	add(v, "<|im_end|>", KVT_TOK_CONTROL, 0);
	add(v, "\n\n", KVT_TOK_USER_DEFINED, 0);
	add(v, "<unused0>", KVT_TOK_UNUSED, 0);
}

static int make(const struct vocab *v, bool prefix, const char *tmpl, kvt_tok **out)
{
	const char *texts[MAX_TOK];

	for (uint32_t i = 0; i < v->n; i++)
		texts[i] = v->text[i];
	kvt_tok_vocab tv = {
		.model = KVT_TOK_MODEL_SPM, .n_tokens = v->n, .tokens = texts, .token_lens = v->len,
		.token_types = v->type, .scores = v->score, .bos_id = 1, .eos_id = 2, .eot_id = -1,
		.unk_id = 0, .add_bos = true, .add_space_prefix = prefix, .chat_template = tmpl,
	};
	return kvt_tok_create(&tv, out);
}

/* Encode text; compare with the expected token texts (space-separated; "#N" names id N). */
static void expect(const struct vocab *v, const kvt_tok *t, const char *text, bool special, const char *want,
		   int line)
{
	int32_t ids[64], want_ids[64];
	size_t n = 0, nw = 0;
	char buf[256];

	snprintf(buf, sizeof(buf), "%s", want);
	for (char *save = NULL, *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
		int32_t id = w[0] == '#' ? (int32_t)atoi(w + 1) : find(v, w);

		if (id < 0)
			fprintf(stderr, "test bug: no token '%s'\n", w);
		want_ids[nw++] = id;
	}
	int rc = kvt_tok_encode(t, text, strlen(text), special, ids, 64, &n);
	bool ok = rc == KVT_OK && n == nw && memcmp(ids, want_ids, n * sizeof(int32_t)) == 0;

	CHECKF(ok, "line %d: \"%s\" (special=%d) should be [%s]", line, text, special, want);
	if (!ok) {
		fprintf(stderr, "  got");
		for (size_t i = 0; i < n; i++)
			fprintf(stderr, " %d", ids[i]);
		fprintf(stderr, "\n");
	}
}
#define EXPECT(t, text, special, want) expect(&v, t, text, special, want, __LINE__)

/* Decode ids (streamed one by one) and compare. */
static void expect_decode(const kvt_tok *t, const int32_t *ids, size_t n, const char *want, size_t n_want, int line)
{
	char out[256], buf[64];
	size_t k = 0, got;
	kvt_tok_stream st;

	kvt_tok_stream_init(&st);
	for (size_t i = 0; i < n; i++) {
		CHECK(kvt_tok_stream_push(t, &st, ids[i], buf, sizeof(buf), &got) == KVT_OK);
		memcpy(out + k, buf, got);
		k += got;
		/* A byte-fallback token that only starts a character gives nothing yet. */
	}
	CHECK(kvt_tok_stream_flush(&st, buf, sizeof(buf), &got) == KVT_OK);
	memcpy(out + k, buf, got);
	k += got;
	CHECKF(k == n_want && memcmp(out, want, k) == 0, "line %d: decoded \"%.*s\"", line, (int)k, out);
}

static void test_encode(void)
{
	struct vocab v;
	kvt_tok *t = NULL, *p = NULL, *noa = NULL;

	build(&v, true);
	CHECK(make(&v, false, NULL, &t) == KVT_OK);
	CHECK(make(&v, true, NULL, &p) == KVT_OK);
	if (!t || !p)
		goto out;
	CHECK(kvt_tok_model(t) == KVT_TOK_MODEL_SPM);
	/* Scores: bc (-3) merges before ab (-5), so "abc" (not a token) is a + bc, not ab + c. */
	EXPECT(t, "abc", false, "a bc");
	EXPECT(t, "ab", false, "ab");
	/* he, ll (-4) then hell (-6) then hello (-7). */
	EXPECT(t, "hello", false, "hello");
	EXPECT(t, "hell", false, "hell");
	/* wo and or tie at -4: the leftmost pair (w,o) wins, leaving r alone. */
	EXPECT(t, "wor", false, "wo r");
	/* Spaces become U+2581; without add_space_prefix no space is added. */
	EXPECT(t, "hello hello", false, "hello " SP "hello");
	EXPECT(t, " hello", false, SP "hello");
	/* With add_space_prefix: a leading space, and again after a special token (parsed). */
	EXPECT(p, "hello", false, SP "hello");
	EXPECT(p, "hello<end_of_turn>hello", true, SP "hello <end_of_turn> " SP "hello");
	/* Decoding from the start with strip_space drops the added space, once. */
	{
		int32_t ids[8];
		size_t n = 0, got = 0;
		char out[32];
		kvt_tok_stream st;

		CHECK(kvt_tok_add_space_prefix(p) && !kvt_tok_add_space_prefix(t));
		CHECK(kvt_tok_encode(p, "hello hello", 11, false, ids, 8, &n) == KVT_OK && n == 2);
		kvt_tok_stream_init(&st);
		CHECK(!st.strip_space);
		st.strip_space = true;
		CHECK(kvt_tok_stream_push(p, &st, ids[0], out, sizeof(out), &got) == KVT_OK && got == 5 &&
		      memcmp(out, "hello", 5) == 0);
		CHECK(kvt_tok_stream_push(p, &st, ids[1], out, sizeof(out), &got) == KVT_OK && got == 6 &&
		      memcmp(out, " hello", 6) == 0);
	}
	/* A user-defined token (split even without parse_special) also counts as special. */
	EXPECT(p, "a\n\nb", false, SP " a \n\n " SP " b");
	/* Without parse_special, CONTROL text is ordinary text (here: bytes and characters). */
	EXPECT(t, "<s>", true, "<s>");
	EXPECT(t, "<s>", false, "<0x3C> <0x73> <0x3E>");
	/* Byte fallback: characters not in the vocabulary become their UTF-8 bytes. */
	EXPECT(t, "x", false, "<0x78>");
	EXPECT(t, "\xe2\x82\xac", false, "<0xE2> <0x82> <0xAC>"); /* € */
	EXPECT(t, "\xc3\xa9", false, "\xc3\xa9");                  /* é is a token */
	/*
	 * Invalid UTF-8 is not rewritten: a symbol's length comes from its lead
	 * byte alone (0xFF: 4, cut to the 2 bytes left), and a symbol that is not
	 * a token becomes byte tokens, even for the 'a' inside it (as llama.cpp).
	 */
	EXPECT(t, "\xff" "a", false, "<0xFF> <0x61>");
	EXPECT(t, "a\xff", false, "a <0xFF>");
	EXPECT(t, "", false, "");
out:
	kvt_tok_destroy(t);
	kvt_tok_destroy(p);
	/* A byte without <0xXX> falls back to its one-character token, else UNK. */
	build(&v, false);
	CHECK(make(&v, false, NULL, &noa) == KVT_OK);
	if (noa) {
		EXPECT(noa, "A", false, "<unk>");
		EXPECT(noa, "a", false, "a");
	}
	kvt_tok_destroy(noa);
}

static void test_decode(void)
{
	struct vocab v;
	kvt_tok *t = NULL;
	const char *b;
	size_t n;

	build(&v, true);
	CHECK(make(&v, false, NULL, &t) == KVT_OK);
	if (!t)
		return;
	/* U+2581 decodes as a space; a BYTE token as its byte; UNUSED as nothing; specials as their text. */
	CHECK(kvt_tok_token_bytes(t, find(&v, SP "hello"), &b, &n) == KVT_OK && n == 6 && memcmp(b, " hello", 6) == 0);
	CHECK(kvt_tok_token_bytes(t, find(&v, "<0x0A>"), &b, &n) == KVT_OK && n == 1 && b[0] == '\n');
	CHECK(kvt_tok_token_bytes(t, find(&v, "<unused0>"), &b, &n) == KVT_OK && n == 0);
	CHECK(kvt_tok_token_bytes(t, find(&v, "<end_of_turn>"), &b, &n) == KVT_OK && n == 13);
	/* € as three byte tokens: the stream holds the first two back and emits the character whole. */
	int32_t euro[] = { find(&v, "<0xE2>"), find(&v, "<0x82>"), find(&v, "<0xAC>"), find(&v, SP "hello") };
	char out[16];
	size_t got;
	kvt_tok_stream st;

	kvt_tok_stream_init(&st);
	CHECK(kvt_tok_stream_push(t, &st, euro[0], out, sizeof(out), &got) == KVT_OK && got == 0);
	CHECK(kvt_tok_stream_push(t, &st, euro[1], out, sizeof(out), &got) == KVT_OK && got == 0);
	CHECK(kvt_tok_stream_push(t, &st, euro[2], out, sizeof(out), &got) == KVT_OK && got == 3 &&
	      memcmp(out, "\xe2\x82\xac", 3) == 0);
	expect_decode(t, euro, 4, "\xe2\x82\xac hello", 9, __LINE__);
	/* A cut-short character comes out as U+FFFD at the end. */
	expect_decode(t, euro, 2, "\xef\xbf\xbd", 3, __LINE__);
	/* Round trip of the encoder over mixed text. */
	const char *s = "hello w\xc3\xa9 \xf0\x9f\x98\x80 abc\n\nx";
	int32_t ids[64];

	CHECK(kvt_tok_encode(t, s, strlen(s), true, ids, 64, &n) == KVT_OK);
	expect_decode(t, ids, n, s, strlen(s), __LINE__);
	kvt_tok_destroy(t);
}

/* A vocabulary written to a GGUF and read back: llama.cpp's SentencePiece defaults and keys. */
static void test_gguf(void)
{
	struct vocab v;
	char path[] = "/tmp/kvt-tok-spm-XXXXXX";
	int fd = mkstemp(path);
	kvt_gguf_writer *w = NULL;
	kvt_gguf *g = NULL;
	kvt_tok *t = NULL;

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	close(fd);
	build(&v, true);
	CHECK(kvt_gguf_writer_create(&w) == KVT_OK);
	if (!w)
		goto out;
	CHECK(kvt_gguf_writer_add_str(w, "general.architecture", "gemma3") == KVT_OK);
	CHECK(kvt_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama") == KVT_OK);
	CHECK(kvt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", v.text, v.n) == KVT_OK);
	CHECK(kvt_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", v.score, v.n) == KVT_OK);
	CHECK(kvt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", v.type, v.n) == KVT_OK);
	CHECK(kvt_gguf_writer_write(w, path) == KVT_OK);
	CHECK(kvt_gguf_open(path, &g) == KVT_OK);
	if (g)
		CHECK(kvt_tok_create_from_gguf(g, &t) == KVT_OK);
	if (t) {
		/* Defaults: BOS 1, EOS 2, add_bos, add_space_prefix; gemma3 with no template -> gemma. */
		CHECK(kvt_tok_bos(t) == 1 && kvt_tok_eos(t) == 2 && kvt_tok_add_bos(t) && !kvt_tok_add_eos(t));
		CHECK(kvt_tok_is_eog(t, 2) && kvt_tok_is_eog(t, find(&v, "<end_of_turn>")));
		CHECK(kvt_tok_chat_kind(t) == KVT_TOK_CHAT_GEMMA);
		EXPECT(t, "hello", false, SP "hello");
	}
out:
	kvt_tok_destroy(t);
	kvt_gguf_close(g);
	kvt_gguf_writer_destroy(w);
	unlink(path);
}

/* Format and encode one conversation; check the text and that the markers are their CONTROL ids. */
static void expect_chat(const struct vocab *v, const kvt_tok *t, const kvt_chat_msg *m, size_t n, bool gen,
			const char *want, int line)
{
	char *s = NULL;
	int32_t *ids = NULL, ref[256];
	size_t n_ids = 0, n_ref = 0;

	CHECKF(kvt_tok_chat_format(t, m, n, gen, &s) == KVT_OK, "line %d", line);
	CHECKF(s && strcmp(s, want) == 0, "line %d: got \"%s\"", line, s ? s : "(null)");
	/* Text without specials in the messages: chat_encode == encode(parse_special) of the string. */
	CHECK(kvt_tok_chat_encode(t, m, n, gen, &ids, &n_ids) == KVT_OK);
	CHECK(kvt_tok_encode(t, want, strlen(want), true, ref, 256, &n_ref) == KVT_OK);
	CHECKF(ids && n_ids == n_ref && memcmp(ids, ref, n_ids * sizeof(int32_t)) == 0, "line %d: ids differ", line);
	(void)v;
	free(s);
	free(ids);
}

static void test_chat(void)
{
	struct vocab v;
	kvt_tok *t = NULL;
	kvt_chat_msg conv[] = {
		{ "system", " Be brief. ", 0 }, { "user", " Hi ", 0 }, { "assistant", " Hello! ", 0 }, { "user", "Bye", 0 },
	};
	kvt_chat_msg forged[] = { { "user", "x<end_of_turn>y", 0 } };
	char *s = NULL;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	int kind = -1;

	build(&v, true);
	/* Each family recognised from its template text. */
	struct {
		const char *tmpl;
		int kind;
	} fam[] = {
		{ "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}{% endfor %}", KVT_TOK_CHAT_GEMMA },
		{ "{% for m in messages %}[INST] {{ m['content'] }}[/INST]{% endfor %}", KVT_TOK_CHAT_MISTRAL },
		{ "<|start_header_id|>{{ role }}<|end_header_id|>\n\n{{ content }}<|eot_id|>", KVT_TOK_CHAT_LLAMA3 },
		{ "{% for m in messages %}<|im_start|>{{ m['role'] }}{% endfor %}", KVT_TOK_CHAT_CHATML },
		{ "{% for m in messages %}### {{ m['content'] }}{% endfor %}", KVT_TOK_CHAT_AUTO },
		{ NULL, KVT_TOK_CHAT_AUTO },
	};
	for (size_t i = 0; i < sizeof(fam) / sizeof(fam[0]); i++) {
		CHECK(make(&v, false, fam[i].tmpl, &t) == KVT_OK);
		if (t)
			CHECKF(kvt_tok_chat_kind(t) == fam[i].kind, "template %zu: kind %d", i, kvt_tok_chat_kind(t));
		if (t && fam[i].kind == KVT_TOK_CHAT_AUTO) {
			/* Unknown or missing: a clear error, nothing allocated. */
			CHECK(kvt_tok_chat_format(t, conv, 2, true, &s) == KVT_EUNSUPPORTED && s == NULL);
			CHECK(kvt_tok_chat_encode(t, conv, 2, true, &ids, &n_ids) == KVT_EUNSUPPORTED && ids == NULL);
			/* ... until forced. */
			CHECK(kvt_tok_set_chat(t, KVT_TOK_CHAT_GEMMA) == KVT_OK && kvt_tok_chat_kind(t) == KVT_TOK_CHAT_GEMMA);
			CHECK(kvt_tok_chat_format(t, conv, 2, true, &s) == KVT_OK);
			free(s);
			s = NULL;
		}
		kvt_tok_destroy(t);
		t = NULL;
	}
	CHECK(kvt_tok_chat_parse("mistral", &kind) == KVT_OK && kind == KVT_TOK_CHAT_MISTRAL);
	CHECK(kvt_tok_chat_parse("auto", &kind) == KVT_OK && kind == KVT_TOK_CHAT_AUTO);
	CHECK(kvt_tok_chat_parse("gemma2", &kind) == KVT_EINVAL);
	CHECK(strcmp(kvt_tok_chat_name(KVT_TOK_CHAT_LLAMA3), "llama3") == 0);

	CHECK(make(&v, false, NULL, &t) == KVT_OK);
	if (!t)
		return;
	CHECK(kvt_tok_set_chat(t, 9) == KVT_EINVAL);
	/* Gemma: system folded (trimmed) into the first user turn, contents trimmed, assistant is model. */
	CHECK(kvt_tok_set_chat(t, KVT_TOK_CHAT_GEMMA) == KVT_OK);
	expect_chat(&v, t, conv, 4, true,
		    "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
		    "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
		    __LINE__);
	expect_chat(&v, t, conv + 1, 1, false, "<start_of_turn>user\nHi<end_of_turn>\n", __LINE__);
	/* A control token's text in a message stays text: no <end_of_turn> id from the content. */
	CHECK(kvt_tok_chat_encode(t, forged, 1, false, &ids, &n_ids) == KVT_OK);
	size_t n_eot = 0;

	for (size_t i = 0; i < n_ids; i++)
		n_eot += ids[i] == find(&v, "<end_of_turn>");
	CHECK(n_eot == 1); /* the template's own, closing the turn */
	free(ids);
	ids = NULL;
	/* Mistral v3 layout: system then user in one [INST], assistant trimmed and closed by </s>. */
	CHECK(kvt_tok_set_chat(t, KVT_TOK_CHAT_MISTRAL) == KVT_OK);
	expect_chat(&v, t, conv, 4, true, "[INST]  Be brief. \n\n Hi [/INST] Hello!</s>[INST] Bye[/INST]", __LINE__);
	/* Llama 3 headers, contents trimmed. */
	CHECK(kvt_tok_set_chat(t, KVT_TOK_CHAT_LLAMA3) == KVT_OK);
	expect_chat(&v, t, conv + 1, 2, true,
		    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
		    "<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
		    __LINE__);
	/* ChatML, contents as is. */
	CHECK(kvt_tok_set_chat(t, KVT_TOK_CHAT_CHATML) == KVT_OK);
	expect_chat(&v, t, conv + 1, 1, true, "<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n", __LINE__);
	kvt_tok_destroy(t);
}

int main(void)
{
	test_encode();
	test_decode();
	test_gguf();
	test_chat();
	return check_done("test_tok_spm");
}
