/*
 * tests/test_tok_unit.c — the BPE tokenizer on a small hand-built vocabulary.
 * ctest-labels: unit
 *
 * The vocabulary has one token per byte (ids 0..255 are the GPT-2
 * bytes_to_unicode characters of bytes 0..255, so id b decodes to byte b), a
 * few merges whose ranks make the expected splits easy to reason about, and
 * special tokens of each kind. Checked: pre-tokenizer pieces (digits, the
 * whitespace rule \s+(?!\S), contractions), merge order and ties, special
 * token splitting with and without parse_special (and llama.cpp's longest-
 * token-first order), ignore_merges, decoding of every byte, invalid UTF-8,
 * the streaming decoder, KVT_EFULL, chat formatting, bad vocabularies, a long
 * input and concurrent use from several threads.
 */
#include "check.h"
#include "tokenizer.h"

#include <pthread.h>

#define MAX_TOK 512
#define MAX_MERGE 64

/* A vocabulary under construction: encoded texts owned here. */
struct vocab {
	char *text[MAX_TOK];     /* encoded token texts */
	size_t len[MAX_TOK];     /* their byte lengths */
	int32_t type[MAX_TOK];   /* token types */
	uint32_t n;              /* tokens */
	char *merge[MAX_MERGE];  /* "left right", encoded */
	size_t merge_len[MAX_MERGE]; /* their byte lengths */
	uint32_t n_merges;       /* merges */
};

static uint32_t byte_cp(unsigned b)
{
	unsigned k = 0;

	if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae)
		return b;
	for (unsigned i = 0; i < b; i++)
		if (!((i >= 0x21 && i <= 0x7e) || (i >= 0xa1 && i <= 0xac) || i >= 0xae))
			k++;
	return 0x100 + k;
}

/* GPT-2 byte-encode raw bytes into out (room for 2 * n + 1); returns the length. */
static size_t encode_bytes(const char *raw, size_t n, char *out)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t cp = byte_cp((unsigned char)raw[i]);

		if (cp < 0x80) {
			out[k++] = (char)cp;
		} else {
			out[k++] = (char)(0xc0 | cp >> 6);
			out[k++] = (char)(0x80 | (cp & 0x3f));
		}
	}
	out[k] = '\0';
	return k;
}

static int32_t add_token(struct vocab *v, const char *text, size_t len, int32_t type)
{
	v->text[v->n] = malloc(len + 1);
	memcpy(v->text[v->n], text, len);
	v->text[v->n][len] = '\0';
	v->len[v->n] = len;
	v->type[v->n] = type;
	return (int32_t)v->n++;
}

/* A merge of two raw strings; adds the merged token unless it exists. Returns its id. */
static int32_t add_merge(struct vocab *v, const char *left, const char *right)
{
	char a[64], b[64], m[160], cat[128];
	size_t la = encode_bytes(left, strlen(left), a), lb = encode_bytes(right, strlen(right), b);

	snprintf(m, sizeof(m), "%s %s", a, b);
	v->merge[v->n_merges] = strdup(m);
	v->merge_len[v->n_merges++] = la + lb + 1;
	snprintf(cat, sizeof(cat), "%s%s", a, b);
	for (uint32_t i = 0; i < v->n; i++)
		if (v->len[i] == la + lb && memcmp(v->text[i], cat, la + lb) == 0)
			return (int32_t)i;
	return add_token(v, cat, la + lb, KVT_TOK_NORMAL);
}

static void free_vocab(struct vocab *v)
{
	for (uint32_t i = 0; i < v->n; i++)
		free(v->text[i]);
	for (uint32_t i = 0; i < v->n_merges; i++)
		free(v->merge[i]);
}

/* Ids of the test vocabulary (set by build_vocab). */
static int32_t id_hello, id_world, id_2sp, id_sp_b, id_bc, id_12, id_apos_t, id_aaaa, id_aa;
static int32_t id_eot_text, id_im_start, id_im_end, id_tool, id_xy, id_yzw, id_xyz;

static const char smollm_template[] =
	"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
	"{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
	"<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
	"'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
	"{% endif %}";

static void build_vocab(struct vocab *v)
{
	memset(v, 0, sizeof(*v));
	for (unsigned b = 0; b < 256; b++) {
		char raw = (char)b, e[4];

		add_token(v, e, encode_bytes(&raw, 1, e), KVT_TOK_NORMAL);
	}
	add_merge(v, "h", "e");
	add_merge(v, "l", "l");
	add_merge(v, "he", "ll");
	id_hello = add_merge(v, "hell", "o");
	add_merge(v, " ", "w");
	add_merge(v, "o", "r");
	add_merge(v, " w", "or");
	add_merge(v, "l", "d");
	id_world = add_merge(v, " wor", "ld");
	id_2sp = add_merge(v, " ", " ");
	id_sp_b = add_merge(v, " ", "b");
	id_bc = add_merge(v, "b", "c");
	add_merge(v, "a", "b"); /* ranks after "b c": "abc" -> a + bc */
	id_12 = add_merge(v, "1", "2");
	id_apos_t = add_merge(v, "'", "t");
	id_aa = add_merge(v, "a", "a");
	id_aaaa = add_merge(v, "aa", "aa");
	id_eot_text = add_token(v, "<|endoftext|>", 13, KVT_TOK_CONTROL);
	id_im_start = add_token(v, "<|im_start|>", 12, KVT_TOK_CONTROL);
	/* Stored as NORMAL: llama.cpp (and kvtier) force it to CONTROL and EOG by its text. */
	id_im_end = add_token(v, "<|im_end|>", 10, KVT_TOK_NORMAL);
	id_tool = add_token(v, "<tool>", 6, KVT_TOK_USER_DEFINED);
	id_xy = add_token(v, "XY", 2, KVT_TOK_USER_DEFINED);
	id_yzw = add_token(v, "YZW", 3, KVT_TOK_USER_DEFINED);
	id_xyz = add_token(v, "xyz", 3, KVT_TOK_NORMAL); /* no merge reaches it */
}

static int make_tok(const struct vocab *v, const char *pre, const char *tmpl, kvt_tok **t)
{
	kvt_tok_vocab kv = {
		.n_tokens = v->n,
		.tokens = (const char *const *)v->text,
		.token_lens = v->len,
		.token_types = v->type,
		.n_merges = v->n_merges,
		.merges = (const char *const *)v->merge,
		.merge_lens = v->merge_len,
		.pre = pre,
		.bos_id = id_im_start,
		.eos_id = id_eot_text,
		.eot_id = -1,
		.add_bos = false,
		.chat_template = tmpl,
	};

	return kvt_tok_create(&kv, t);
}

/* Encode and compare with an expected id list (terminated by -1). */
static bool enc_is(const kvt_tok *t, const char *s, size_t len, bool special, const int32_t *want)
{
	int32_t got[256];
	size_t n, n_want = 0;
	int rc = kvt_tok_encode(t, s, len, special, got, 256, &n);

	while (want[n_want] >= 0)
		n_want++;
	if (rc == KVT_OK && n == n_want && memcmp(got, want, n * sizeof(int32_t)) == 0)
		return true;
	fprintf(stderr, "  encode(\"%.*s\") rc %d:", (int)len, s, rc);
	for (size_t i = 0; i < n && i < 256; i++)
		fprintf(stderr, " %d", got[i]);
	fprintf(stderr, " (want");
	for (size_t i = 0; i < n_want; i++)
		fprintf(stderr, " %d", want[i]);
	fprintf(stderr, ")\n");
	return false;
}

#define ENC_IS(t, s, special, ...) \
	CHECK(enc_is(t, s, sizeof(s) - 1, special, (const int32_t[]){ __VA_ARGS__, -1 }))

/* Decode ids by concatenating kvt_tok_token_bytes. */
static size_t decode(const kvt_tok *t, const int32_t *ids, size_t n, char *out)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		const char *b;
		size_t len;

		if (kvt_tok_token_bytes(t, ids[i], &b, &len) != KVT_OK)
			return (size_t)-1;
		memcpy(out + k, b, len);
		k += len;
	}
	return k;
}

static void test_pieces(const kvt_tok *sm, const kvt_tok *g2)
{
	ENC_IS(sm, "hello", true, id_hello);
	ENC_IS(sm, "hello world", true, id_hello, id_world);
	/* smollm splits every digit first; gpt-2 keeps "123" one piece. */
	ENC_IS(sm, "123", true, '1', '2', '3');
	ENC_IS(g2, "123", true, id_12, '3');
	/* \s+(?!\S): the last space of a run goes with the next word. */
	ENC_IS(sm, "a   b", true, 'a', id_2sp, id_sp_b);
	ENC_IS(sm, "a   ", true, 'a', id_2sp, ' ');
	ENC_IS(sm, "a\n\nb", true, 'a', '\n', '\n', 'b');
	ENC_IS(sm, "a \tb", true, 'a', ' ', '\t', 'b');
	/* Contractions are their own piece. */
	ENC_IS(sm, "don't", true, 'd', 'o', 'n', id_apos_t);
	/* Lowest rank first ("b c" before "a b"), ties leftmost first. */
	ENC_IS(sm, "abc", true, 'a', id_bc);
	ENC_IS(sm, "aaaaa", true, id_aaaa, 'a');
	ENC_IS(sm, "", true, -1);
}

static void test_specials(const kvt_tok *sm)
{
	int32_t ids[64];
	size_t n;

	ENC_IS(sm, "<|im_start|>hello<|im_end|>", true, id_im_start, id_hello, id_im_end);
	CHECK(kvt_tok_encode(sm, "<|im_start|>hello", 17, false, ids, 64, &n) == KVT_OK);
	CHECK(n > 2 && ids[0] == '<');
	for (size_t i = 0; i < n && i < 64; i++)
		CHECK(ids[i] != id_im_start);
	/* USER_DEFINED tokens are split even without parse_special (as llama.cpp). */
	ENC_IS(sm, "<tool>hello", false, id_tool, id_hello);
	ENC_IS(sm, "<tool>hello", true, id_tool, id_hello);
	/* Longest special first over the whole text: YZW wins over the earlier XY. */
	ENC_IS(sm, "XYZW", true, 'X', id_yzw);
	ENC_IS(sm, "XYXY", true, id_xy, id_xy);
	ENC_IS(sm, "<|im_end|><|im_end|>", true, id_im_end, id_im_end);
	/* Forced to CONTROL by its text: plain text without parse_special. */
	CHECK(kvt_tok_encode(sm, "<|im_end|>", 10, false, ids, 64, &n) == KVT_OK && n == 10);
	CHECK(kvt_tok_is_eog(sm, id_im_end));
	CHECK(kvt_tok_is_eog(sm, id_eot_text)); /* eos */
	CHECK(!kvt_tok_is_eog(sm, id_im_start));
	CHECK(!kvt_tok_is_eog(sm, -1) && !kvt_tok_is_eog(sm, 1 << 30));
	CHECK_EQ_INT(kvt_tok_bos(sm), id_im_start);
	CHECK_EQ_INT(kvt_tok_eos(sm), id_eot_text);
	CHECK(!kvt_tok_add_bos(sm));
}

static void test_ignore_merges(const struct vocab *v, const kvt_tok *g2)
{
	kvt_tok *l3 = NULL;

	CHECK(make_tok(v, "llama3", NULL, &l3) == KVT_OK);
	if (l3)
		ENC_IS(l3, "xyz", true, id_xyz);
	ENC_IS(g2, "xyz", true, 'x', 'y', 'z');
	kvt_tok_destroy(l3);
}

static void test_decode(const kvt_tok *sm)
{
	static char text[1 << 20], back[1 << 20];
	static int32_t ids[1 << 19];
	const char *b;
	size_t len, n = 0, n_ids;

	for (int32_t id = 0; id < 256; id++)
		CHECK(kvt_tok_token_bytes(sm, id, &b, &len) == KVT_OK && len == 1 && (unsigned char)b[0] == id);
	CHECK(kvt_tok_token_bytes(sm, id_world, &b, &len) == KVT_OK && len == 6 && memcmp(b, " world", 6) == 0);
	CHECK(kvt_tok_token_bytes(sm, id_im_start, &b, &len) == KVT_OK && len == 12 &&
	      memcmp(b, "<|im_start|>", 12) == 0);
	CHECK(kvt_tok_token_bytes(sm, -1, &b, &len) == KVT_EINVAL);
	CHECK(kvt_tok_token_bytes(sm, (int32_t)kvt_tok_n_vocab(sm), &b, &len) == KVT_EINVAL);

	/* Every ASCII byte, then code points across all UTF-8 lengths, round-trip. */
	for (int c = 0; c < 128; c++)
		text[n++] = (char)c;
	for (uint32_t cp = 0x80; cp < 0x110000; cp += cp < 0x800 ? 1 : 37) {
		if (cp >= 0xd800 && cp < 0xe000)
			continue;
		if (cp < 0x800) {
			text[n++] = (char)(0xc0 | cp >> 6);
		} else if (cp < 0x10000) {
			text[n++] = (char)(0xe0 | cp >> 12);
			text[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		} else {
			text[n++] = (char)(0xf0 | cp >> 18);
			text[n++] = (char)(0x80 | ((cp >> 12) & 0x3f));
			text[n++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		}
		text[n++] = (char)(0x80 | (cp & 0x3f));
	}
	CHECK(kvt_tok_encode(sm, text, n, false, ids, sizeof(ids) / sizeof(ids[0]), &n_ids) == KVT_OK);
	CHECK(decode(sm, ids, n_ids, back) == n && memcmp(back, text, n) == 0);

	/* Invalid UTF-8 becomes U+FFFD (EF BF BD), as llama.cpp does; never rejected. */
	ENC_IS(sm, "\xff", true, 0xef, 0xbf, 0xbd);
	ENC_IS(sm, "a\xc3", true, 'a', 0xef, 0xbf, 0xbd);
	ENC_IS(sm, "\x80\x80", true, 0xef, 0xbf, 0xbd, 0xef, 0xbf, 0xbd);
	ENC_IS(sm, "\xc0\x80", true, 0);             /* overlong NUL decodes, as llama.cpp */
	ENC_IS(sm, "\xed\xa0\x80", true, 0xed, 0xa0, 0x80); /* a surrogate passes through */
	ENC_IS(sm, "\xf0\x9f\x98", true, 0xef, 0xbf, 0xbd, 0xef, 0xbf, 0xbd, 0xef, 0xbf, 0xbd);
}

/* Push one id; returns the bytes produced (-1 on error) into out. */
static long push(const kvt_tok *t, kvt_tok_stream *st, int32_t id, char *out, size_t cap)
{
	size_t n;

	return kvt_tok_stream_push(t, st, id, out, cap, &n) == KVT_OK ? (long)n : -1;
}

static void test_stream(const kvt_tok *sm)
{
	kvt_tok_stream st;
	char out[64];
	size_t n;

	/* A 4-byte emoji split into byte tokens comes out whole on its last byte. */
	kvt_tok_stream_init(&st);
	CHECK(push(sm, &st, 0xf0, out, sizeof(out)) == 0);
	CHECK(push(sm, &st, 0x9f, out, sizeof(out)) == 0);
	CHECK(push(sm, &st, 0x98, out, sizeof(out)) == 0);
	CHECK(st.n_pending == 3);
	CHECK(push(sm, &st, 0x80, out, sizeof(out)) == 4 && memcmp(out, "\xf0\x9f\x98\x80", 4) == 0);
	CHECK(push(sm, &st, id_world, out, sizeof(out)) == 6 && memcmp(out, " world", 6) == 0);
	CHECK(kvt_tok_stream_flush(&st, out, sizeof(out), &n) == KVT_OK && n == 0);

	/* Bytes that cannot start a character: U+FFFD each. */
	CHECK(push(sm, &st, 0xff, out, sizeof(out)) == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0);
	CHECK(push(sm, &st, 0x80, out, sizeof(out)) == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0);
	/* A truncated character: one U+FFFD, then the next byte on its own. */
	CHECK(push(sm, &st, 0xf0, out, sizeof(out)) == 0);
	CHECK(push(sm, &st, 'a', out, sizeof(out)) == 4 && memcmp(out, "\xef\xbf\xbd" "a", 4) == 0);
	/* E0 80 is an overlong form: E0 is cut short, 80 starts nothing. */
	CHECK(push(sm, &st, 0xe0, out, sizeof(out)) == 0);
	CHECK(push(sm, &st, 0x80, out, sizeof(out)) == 6 &&
	      memcmp(out, "\xef\xbf\xbd\xef\xbf\xbd", 6) == 0);
	/* Held back at the end of the stream: flushed as U+FFFD. */
	CHECK(push(sm, &st, 0xe2, out, sizeof(out)) == 0);
	CHECK(push(sm, &st, 0x82, out, sizeof(out)) == 0);
	CHECK(kvt_tok_stream_flush(&st, out, sizeof(out), &n) == KVT_OK && n == 3 &&
	      memcmp(out, "\xef\xbf\xbd", 3) == 0);
	CHECK(st.n_pending == 0);

	/* KVT_EFULL leaves the stream as it was; a retry with room succeeds. */
	kvt_tok_stream_init(&st);
	CHECK(push(sm, &st, 0xc3, out, sizeof(out)) == 0);
	CHECK(kvt_tok_stream_push(sm, &st, 0xa9, out, 1, &n) == KVT_EFULL);
	CHECK(st.n_pending == 1);
	CHECK(push(sm, &st, 0xa9, out, sizeof(out)) == 2 && memcmp(out, "\xc3\xa9", 2) == 0);
	CHECK(kvt_tok_stream_push(sm, &st, -5, out, sizeof(out), &n) == KVT_EINVAL);
	CHECK(push(sm, &st, 0xe2, out, sizeof(out)) == 0);
	CHECK(kvt_tok_stream_flush(&st, out, 2, &n) == KVT_EFULL);
}

static void test_efull(const kvt_tok *sm)
{
	int32_t ids[4] = { -7, -7, -7, -7 };
	size_t n = 99;

	CHECK(kvt_tok_encode(sm, "hello world", 11, true, ids, 1, &n) == KVT_EFULL);
	CHECK(n == 2 && ids[0] == id_hello && ids[1] == -7);
	CHECK(kvt_tok_encode(sm, "hello world", 11, true, NULL, 0, &n) == KVT_EFULL && n == 2);
	CHECK(kvt_tok_encode(sm, "hello world", 11, true, ids, 2, &n) == KVT_OK && n == 2);
	CHECK(kvt_tok_encode(sm, NULL, 0, true, ids, 2, &n) == KVT_OK && n == 0);
}

static void test_chat(const struct vocab *v, const kvt_tok *sm)
{
	kvt_chat_msg user[] = { { "user", "Hi", 0 } };
	kvt_chat_msg with_sys[] = { { "system", "Be brief.", 0 }, { "user", "Hi", 0 }, { "assistant", "Hello!", 0 } };
	kvt_chat_msg bad[] = { { "user", NULL, 0 } };
	kvt_tok *plain = NULL, *escaped = NULL, *other = NULL, *none = NULL;
	char *s = NULL;

	CHECK(kvt_tok_chat_format(sm, user, 1, true, &s) == KVT_OK);
	CHECKF(s && strcmp(s, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
			      "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
			      "<|im_start|>assistant\n") == 0, "got \"%s\"", s);
	free(s);
	s = NULL;
	CHECK(kvt_tok_chat_format(sm, with_sys, 3, false, &s) == KVT_OK);
	CHECKF(s && strcmp(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
			      "<|im_start|>assistant\nHello!<|im_end|>\n") == 0, "got \"%s\"", s);
	free(s);
	s = NULL;
	CHECK(kvt_tok_chat_format(sm, NULL, 0, true, &s) == KVT_OK);
	CHECK(s && strcmp(s, "<|im_start|>assistant\n") == 0);
	free(s);
	s = NULL;
	CHECK(kvt_tok_chat_format(sm, bad, 1, true, &s) == KVT_EINVAL && s == NULL);

	/* Plain ChatML (no default system prompt in the template). */
	CHECK(make_tok(v, "smollm", "{% for message in messages %}{{'<|im_start|>' + message['role'] + "
				    "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}", &plain) == KVT_OK);
	if (plain) {
		CHECK(kvt_tok_chat_format(plain, user, 1, false, &s) == KVT_OK);
		CHECK(s && strcmp(s, "<|im_start|>user\nHi<|im_end|>\n") == 0);
		free(s);
		s = NULL;
	}
	/* The default prompt written with Jinja escapes instead of raw newlines. */
	CHECK(make_tok(v, "smollm", "{{ '<|im_start|>system\\nYou\\'re \\\"nice\\\"<|im_end|>\\n' }}", &escaped) ==
	      KVT_OK);
	if (escaped) {
		CHECK(kvt_tok_chat_format(escaped, user, 1, false, &s) == KVT_OK);
		CHECKF(s && strcmp(s, "<|im_start|>system\nYou're \"nice\"<|im_end|>\n"
				      "<|im_start|>user\nHi<|im_end|>\n") == 0, "got \"%s\"", s);
		free(s);
		s = NULL;
	}
	/* A template of no known family, or no template: unsupported. */
	CHECK(make_tok(v, "smollm", "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}{% endfor %}",
		       &other) == KVT_OK);
	if (other)
		CHECK(kvt_tok_chat_format(other, user, 1, true, &s) == KVT_EUNSUPPORTED && s == NULL);
	CHECK(make_tok(v, "smollm", NULL, &none) == KVT_OK);
	if (none)
		CHECK(kvt_tok_chat_format(none, user, 1, true, &s) == KVT_EUNSUPPORTED && s == NULL);
	kvt_tok_destroy(plain);
	kvt_tok_destroy(escaped);
	kvt_tok_destroy(other);
	kvt_tok_destroy(none);
}

static void test_bad_vocab(struct vocab *v)
{
	kvt_tok *t = (kvt_tok *)&t; /* must stay untouched on failure */
	kvt_tok *const sentinel = t;
	char *saved;
	size_t saved_len;
	int32_t saved_type;
	kvt_tok_vocab kv;

	CHECK(make_tok(v, "no-such-pre", NULL, &t) == KVT_EUNSUPPORTED && t == sentinel);

	/* A merge naming a token that is not in the vocabulary. */
	saved = v->merge[3];
	saved_len = v->merge_len[3];
	v->merge[3] = "hell q\xc4\xa0zz";
	v->merge_len[3] = strlen(v->merge[3]);
	CHECK(make_tok(v, "smollm", NULL, &t) == KVT_ECORRUPT && t == sentinel);
	v->merge[3] = "hello"; /* no separator */
	v->merge_len[3] = 5;
	CHECK(make_tok(v, "smollm", NULL, &t) == KVT_ECORRUPT && t == sentinel);
	v->merge[3] = saved;
	v->merge_len[3] = saved_len;

	/* Two tokens with the same text. */
	saved = v->text[id_xyz];
	saved_type = v->type[id_xyz];
	v->text[id_xyz] = "hello";
	v->len[id_xyz] = 5;
	CHECK(make_tok(v, "smollm", NULL, &t) == KVT_ECORRUPT && t == sentinel);
	v->text[id_xyz] = saved;
	v->len[id_xyz] = 3;
	v->type[id_xyz] = saved_type;

	/* A special id out of range. */
	kv = (kvt_tok_vocab){ .n_tokens = v->n, .tokens = (const char *const *)v->text,
			      .token_lens = v->len, .n_merges = v->n_merges,
			      .merges = (const char *const *)v->merge, .merge_lens = v->merge_len,
			      .pre = "smollm", .bos_id = (int32_t)v->n, .eos_id = -1, .eot_id = -1 };
	CHECK(kvt_tok_create(&kv, &t) == KVT_ECORRUPT && t == sentinel);
	kvt_tok_destroy(NULL);
}

static void test_long(const kvt_tok *sm)
{
	size_t len = 10 * 1024, n = 0;
	char *text = malloc(len);
	int32_t *ids = malloc(len * sizeof(int32_t));
	double t0;

	if (!text || !ids) {
		CHECK(!"out of memory");
		free(text);
		free(ids);
		return;
	}
	memset(text, 'a', len);
	t0 = kvt_now_s();
	CHECK(kvt_tok_encode(sm, text, len, true, ids, len, &n) == KVT_OK);
	CHECK(n == len / 4);
	for (size_t i = 0; i < n && i < len; i++)
		if (ids[i] != id_aaaa) {
			CHECKF(0, "id %zu is %d", i, ids[i]);
			break;
		}
	printf("10 KB run of 'a': %zu tokens in %.2f ms\n", n, (kvt_now_s() - t0) * 1e3);
	CHECK(id_aa != id_aaaa);
	free(text);
	free(ids);
}

struct thread_arg {
	const kvt_tok *t;   /* shared tokenizer */
	const char *text;   /* shared input */
	size_t len;         /* its length */
	int32_t ids[4096];  /* this thread's result */
	size_t n;           /* ids produced */
	int rc;             /* last encode result */
};

static void *thread_main(void *p)
{
	struct thread_arg *a = p;

	for (int i = 0; i < 50; i++)
		a->rc = kvt_tok_encode(a->t, a->text, a->len, true, a->ids, 4096, &a->n);
	return NULL;
}

static void test_threads(const kvt_tok *sm)
{
	static const char text[] = "<|im_start|>hello world  123 don't <tool>abc aaaaa\xff XYZW<|im_end|>";
	static struct thread_arg args[4];
	int32_t want[4096];
	size_t n_want;
	pthread_t th[4];

	CHECK(kvt_tok_encode(sm, text, sizeof(text) - 1, true, want, 4096, &n_want) == KVT_OK);
	for (int i = 0; i < 4; i++) {
		args[i] = (struct thread_arg){ .t = sm, .text = text, .len = sizeof(text) - 1 };
		CHECK(pthread_create(&th[i], NULL, thread_main, &args[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		CHECK(args[i].rc == KVT_OK && args[i].n == n_want &&
		      memcmp(args[i].ids, want, n_want * sizeof(int32_t)) == 0);
	}
}

int main(void)
{
	struct vocab v;
	kvt_tok *sm = NULL, *g2 = NULL;

	build_vocab(&v);
	CHECK(make_tok(&v, "smollm", smollm_template, &sm) == KVT_OK);
	CHECK(make_tok(&v, "gpt-2", NULL, &g2) == KVT_OK);
	if (sm && g2) {
		CHECK_EQ_INT(kvt_tok_n_vocab(sm), v.n);
		test_pieces(sm, g2);
		test_specials(sm);
		test_ignore_merges(&v, g2);
		test_decode(sm);
		test_stream(sm);
		test_efull(sm);
		test_chat(&v, sm);
		test_long(sm);
		test_threads(sm);
	}
	test_bad_vocab(&v);
	kvt_tok_destroy(sm);
	kvt_tok_destroy(g2);
	free_vocab(&v);
	return check_done("test_tok_unit");
}
