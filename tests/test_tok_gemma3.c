/*
 * tests/test_tok_gemma3.c — the SentencePiece vocabulary of Gemma 3 270M against llama.cpp.
 * ctest-labels: model
 *
 * Loads models/gemma-3-270m-q4_k_m.gguf (or $KVTIER_GEMMA3_MODEL; exit 77 when
 * absent; scripts/fetch_model.sh fetches it) and checks every line of
 * tests/ref/gemma3_tokenizer_ref.tsv, written by tests/ref/gen_gemma3_tok.py
 * with llama.cpp (llama-cpp-python 0.3.16):
 *   T: the ids of each string with and without special-token parsing match
 *      exactly, and decoding them (kvt_tok_token_bytes, and the streaming
 *      decoder fed one id at a time, so byte-fallback tokens must join into
 *      UTF-8 across tokens) gives the input back when it is valid UTF-8 and
 *      holds no U+2581 (which decodes as a space, as in llama.cpp);
 *   C/M/R: the text llama.cpp's own gemma chat template made for a
 *      conversation tokenizes (specials parsed) to the same ids, and
 *      kvt_tok_chat_encode of the same messages gives those ids too;
 *   E: the end-of-generation set is exactly llama.cpp's (EOS 1, <end_of_turn> 106);
 * one deliberate difference: the image markers <start_of_image>, <end_of_image>
 * and [multimodal] are USER_DEFINED in the GGUF, which llama.cpp splits out of
 * text even without special-token parsing; kvtier keeps them text there (a
 * chat message's text is text), so for a string holding one the
 * parse_special=false ids are checked to hold no marker and to decode back to
 * the string instead of against llama.cpp's. check_markers() checks the
 * markers themselves: one CONTROL token with specials parsed, text without,
 * and text in a chat message;
 * plus BOS/EOS/add_bos/add_eos as llama.cpp reports them, and it prints the
 * encode speed on ~100 KB of text (information, not an assertion).
 */
#define _GNU_SOURCE /* memmem */
#include "check.h"
#include "gguf.h"
#include "ref_read.h"
#include "tokenizer.h"

#define MAX_IDS 4096
#define MAX_TEXT 8192
#define MAX_MSGS 8

static const char *gemma3_path(void)
{
	static char buf[4096];
	const char *env = getenv("KVTIER_GEMMA3_MODEL");
	FILE *f;

	if (env && *env)
		return env;
	snprintf(buf, sizeof(buf), "%s/models/gemma-3-270m-q4_k_m.gguf", KVT_SOURCE_DIR);
	f = fopen(buf, "rb");
	if (!f)
		return NULL;
	fclose(f);
	return buf;
}

static bool same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
	return na == nb && (na == 0 || memcmp(a, b, na * sizeof(int32_t)) == 0);
}

/* The hex run at s, up to a tab, newline or NUL, into out; the byte count or -1. */
static long unhex(const char *s, unsigned char *out, size_t cap)
{
	return ref_unhex(s, strcspn(s, "\t\n"), out, cap);
}

/* ref_parse_ids, its count clamped at 0 (an over-long list reads as none, and then differs). */
static size_t parse_ids(const char *s, int32_t *ids, size_t cap, const char **end)
{
	int n = ref_parse_ids(s, ids, cap, end);

	return n > 0 ? (size_t)n : 0;
}

/* Gemma 3's image markers: USER_DEFINED in the GGUF, CONTROL in kvtier (see the top). */
static const char *const MARKERS[] = { "<start_of_image>", "<end_of_image>", "[multimodal]" };
#define N_MARKERS (sizeof(MARKERS) / sizeof(MARKERS[0]))

static bool holds_marker(const unsigned char *in, size_t n)
{
	for (size_t i = 0; i < N_MARKERS; i++)
		if (memmem(in, n, MARKERS[i], strlen(MARKERS[i])))
			return true;
	return false;
}

/* Ids that hold no control token (every marker is one) and decode, whole and streamed, to text[0..n). */
static bool text_ids(const kvt_tok *t, const int32_t *ids, size_t n_ids, const char *text, size_t n)
{
	static unsigned char back[MAX_TEXT];
	bool ok = true;

	for (size_t i = 0; i < n_ids; i++)
		ok = ok && kvt_tok_token_type(t, ids[i]) != KVT_TOK_CONTROL;
	for (int stream = 0; stream <= 1 && ok; stream++) {
		size_t k = ref_decode(t, ids, n_ids, stream, back, sizeof(back));

		ok = k == n && memcmp(back, text, n) == 0;
	}
	return ok;
}

static void check_string(const kvt_tok *t, const unsigned char *in, size_t n_in, const int32_t *want_sp,
			 size_t n_sp, const int32_t *want_nsp, size_t n_nsp, unsigned *n_cases, unsigned *n_roundtrip)
{
	static int32_t got[MAX_IDS];
	static unsigned char back[MAX_TEXT];
	size_t n_got = 0;

	for (int sp = 1; sp >= 0; sp--) {
		const int32_t *want = sp ? want_sp : want_nsp;
		size_t n_want = sp ? n_sp : n_nsp;
		int rc = kvt_tok_encode(t, (const char *)in, n_in, sp, got, MAX_IDS, &n_got);

		CHECK(rc == KVT_OK);
		if (!sp && holds_marker(in, n_in)) { /* the deliberate difference: the marker is text */
			CHECKF(rc == KVT_OK && text_ids(t, got, n_got, (const char *)in, n_in),
			       "a marker in \"%.*s\" is not text without parse_special", (int)n_in, (const char *)in);
			continue;
		}
		if (rc != KVT_OK || !same_ids(got, n_got, want, n_want)) {
			CHECKF(false, "ids differ (parse_special=%d) for \"%.*s\"", sp, (int)n_in, (const char *)in);
			ref_print_ids("kvtier  ", got, n_got);
			ref_print_ids("llama.cpp", want, n_want);
		} else {
			check_n_pass++;
		}
	}
	(*n_cases)++;
	/* Round trip of the parse_special ids: exact for valid UTF-8 without U+2581 (which reads back as ' '). */
	if (!ref_valid_utf8(in, n_in) || memmem(in, n_in, "\xe2\x96\x81", 3))
		return;
	for (int stream = 0; stream <= 1; stream++) {
		size_t k = ref_decode(t, want_sp, n_sp, stream, back, sizeof(back));

		CHECKF(k == n_in && memcmp(back, in, n_in) == 0, "%s decode of \"%.*s\" gives \"%.*s\"",
		       stream ? "streaming" : "whole", (int)n_in, (const char *)in, k == (size_t)-1 ? 0 : (int)k,
		       (const char *)back);
	}
	(*n_roundtrip)++;
}

static void check_reference(const kvt_tok *t)
{
	static unsigned char in[MAX_TEXT];
	static int32_t a[MAX_IDS], b[MAX_IDS];
	static char line[1 << 16];
	static kvt_chat_msg msgs[MAX_MSGS];
	static char *contents[MAX_MSGS];
	static char roles[MAX_MSGS][16];
	char path[4096];
	unsigned n_cases = 0, n_round = 0, n_chats = 0;
	size_t n_msgs = 0, want_msgs = 0;
	bool saw_eog = false;
	FILE *f;

	snprintf(path, sizeof(path), "%s/tests/ref/gemma3_tokenizer_ref.tsv", KVT_SOURCE_DIR);
	f = fopen(path, "r");
	CHECKF(f != NULL, "cannot open %s", path);
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		const char *p;
		long n;

		if (line[0] == '#')
			continue;
		if (line[0] == 'T' && line[1] == ' ') {
			n = unhex(line + 2, in, sizeof(in));
			CHECK(n >= 0);
			p = strchr(line, '\t');
			CHECK(p != NULL);
			if (n < 0 || !p)
				continue;
			size_t na = parse_ids(p + 1, a, MAX_IDS, &p);
			CHECK(*p == '\t');
			size_t nb = parse_ids(p + 1, b, MAX_IDS, &p);
			check_string(t, in, (size_t)n, a, na, b, nb, &n_cases, &n_round);
		} else if (line[0] == 'M') {
			want_msgs = (size_t)strtoul(line + 2, NULL, 10);
			CHECK(want_msgs > 0 && want_msgs <= MAX_MSGS);
			for (size_t i = 0; i < n_msgs; i++)
				free(contents[i]);
			n_msgs = 0;
		} else if (line[0] == 'R' && n_msgs < MAX_MSGS) {
			char *tab = strchr(line, '\t');

			CHECK(tab != NULL);
			if (!tab)
				continue;
			snprintf(roles[n_msgs], sizeof(roles[n_msgs]), "%.*s", (int)(tab - line - 2), line + 2);
			n = unhex(tab + 1, in, sizeof(in));
			CHECK(n >= 0);
			contents[n_msgs] = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
			memcpy(contents[n_msgs], in, (size_t)(n > 0 ? n : 0));
			msgs[n_msgs] = (kvt_chat_msg){ .role = roles[n_msgs], .content = contents[n_msgs] };
			n_msgs++;
		} else if (line[0] == 'C') {
			size_t n_got = 0;
			int32_t *ids = NULL;

			n = unhex(line + 2, in, sizeof(in));
			p = strchr(line, '\t');
			CHECK(n > 0 && p != NULL && n_msgs == want_msgs);
			if (n <= 0 || !p)
				continue;
			size_t na = parse_ids(p + 1, a, MAX_IDS, &p);
			/* The rendered text, tokenized by us with specials parsed. */
			CHECK(kvt_tok_encode(t, (const char *)in, (size_t)n, true, b, MAX_IDS, &n_got) == KVT_OK);
			CHECKF(same_ids(b, n_got, a, na), "chat text %u: ids differ", n_chats);
			/* Our own chat template on the same messages (no BOS, as the reference). */
			int rc = kvt_tok_chat_encode(t, msgs, n_msgs, true, &ids, &n_got);

			CHECKF(rc == KVT_OK, "chat %u: kvt_tok_chat_encode rc %d", n_chats, rc);
			if (rc == KVT_OK && !same_ids(ids, n_got, a, na)) {
				CHECKF(false, "chat %u: kvt_tok_chat_encode ids differ", n_chats);
				ref_print_ids("kvtier  ", ids, n_got);
				ref_print_ids("llama.cpp", a, na);
			}
			free(ids);
			n_chats++;
		} else if (line[0] == 'E') {
			size_t ne = parse_ids(line + 2, a, MAX_IDS, &p);
			size_t k = 0, mismatches = 0;

			for (uint32_t id = 0; id < kvt_tok_n_vocab(t); id++) {
				bool want = k < ne && a[k] == (int32_t)id;

				if (want)
					k++;
				if (kvt_tok_is_eog(t, (int32_t)id) != want && mismatches++ < 5)
					fprintf(stderr, "  EOG differs for id %u (llama.cpp: %d)\n", id, want);
			}
			CHECKF(mismatches == 0 && k == ne, "%zu EOG mismatches", mismatches);
			saw_eog = true;
		}
	}
	fclose(f);
	for (size_t i = 0; i < n_msgs; i++)
		free(contents[i]);
	CHECKF(n_cases >= 50, "only %u strings in the reference", n_cases);
	CHECK(n_chats >= 1);
	CHECK(saw_eog);
	printf("gemma3 tokenizer: %u strings (%u round trips), %u chats against llama.cpp\n", n_cases, n_round,
	       n_chats);
}

/*
 * The image markers: with specials parsed each is its one token, CONTROL (so a
 * grammar never writes it and a reply never shows it); without, and in a chat
 * message (whose text is always text), they are text that decodes back.
 */
static void check_markers(const kvt_tok *t)
{
	static int32_t ids[MAX_IDS];
	int32_t marker_id[N_MARKERS];
	size_t n_ids = 0;

	for (size_t i = 0; i < N_MARKERS; i++) {
		const char *m = MARKERS[i];

		CHECK(kvt_tok_encode(t, m, strlen(m), true, ids, MAX_IDS, &n_ids) == KVT_OK);
		marker_id[i] = n_ids == 1 ? ids[0] : -1;
		CHECKF(n_ids == 1 && kvt_tok_token_type(t, ids[0]) == KVT_TOK_CONTROL && kvt_tok_is_control(t, ids[0]) &&
			       !kvt_tok_is_eog(t, ids[0]),
		       "%s with specials parsed: %zu ids, first of type %d", m, n_ids,
		       n_ids ? kvt_tok_token_type(t, ids[0]) : -1);
		CHECK(kvt_tok_encode(t, m, strlen(m), false, ids, MAX_IDS, &n_ids) == KVT_OK);
		CHECKF(n_ids > 1 && text_ids(t, ids, n_ids, m, strlen(m)), "%s without parse_special: %zu ids", m, n_ids);
	}
	static const char content[] = "look <start_of_image> at [multimodal] this<end_of_image>";
	kvt_chat_msg msg = { .role = "user", .content = content };
	int32_t *chat = NULL;
	size_t n_chat = 0;

	CHECK(kvt_tok_chat_encode(t, &msg, 1, true, &chat, &n_chat) == KVT_OK);
	for (size_t i = 0; i < n_chat; i++)
		for (size_t k = 0; k < N_MARKERS; k++)
			CHECKF(chat[i] != marker_id[k], "the chat message's %s became the marker token", MARKERS[k]);
	/* the message's text, tokenized as text, is in the prompt as it is */
	CHECK(kvt_tok_encode(t, content, strlen(content), false, ids, MAX_IDS, &n_ids) == KVT_OK);
	bool found = false;
	for (size_t i = 0; chat && !found && i + n_ids <= n_chat; i++)
		found = same_ids(chat + i, n_ids, ids, n_ids);
	CHECKF(found, "the chat prompt does not hold the message's text tokens");
	free(chat);
}

/* Encode speed on ~100 KB of mixed text, with and without special parsing (information, not an assertion). */
static void report_speed(const kvt_tok *t)
{
	static const char unit[] = "The quick brown fox jumps over the lazy dog. Caf\xc3\xa9 na\xc3\xafve, "
				   "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 int main(void) { return 0; }\n\n";
	size_t n_unit = sizeof(unit) - 1, n = 0, n_ids = 0;
	char *text = malloc(100 * 1024 + n_unit);
	int32_t *ids = malloc(100 * 1024 * sizeof(int32_t));

	if (!text || !ids) {
		free(text);
		free(ids);
		return;
	}
	while (n < 100 * 1024) {
		memcpy(text + n, unit, n_unit);
		n += n_unit;
	}
	for (int sp = 1; sp >= 0; sp--) {
		double t0 = kvt_now_s();

		CHECK(kvt_tok_encode(t, text, n, sp, ids, 100 * 1024, &n_ids) == KVT_OK);
		printf("encode: %zu bytes (parse_special=%d) -> %zu tokens in %.1f ms\n", n, sp, n_ids,
		       (kvt_now_s() - t0) * 1e3);
	}
	free(text);
	free(ids);
}

int main(void)
{
	const char *path = gemma3_path();
	kvt_gguf *g = NULL;
	kvt_tok *t = NULL;

	if (!path)
		return check_skip("test_tok_gemma3", "models/gemma-3-270m-q4_k_m.gguf not present (scripts/fetch_model.sh)");
	CHECK(kvt_gguf_open(path, &g) == KVT_OK);
	if (g)
		CHECK(kvt_tok_create_from_gguf(g, &t) == KVT_OK);
	if (t) {
		CHECK(kvt_tok_model(t) == KVT_TOK_MODEL_SPM);
		CHECK_EQ_INT(kvt_tok_n_vocab(t), 262144);
		CHECK_EQ_INT(kvt_tok_bos(t), 2);
		CHECK_EQ_INT(kvt_tok_eos(t), 1);
		CHECK(kvt_tok_add_bos(t));
		CHECK(!kvt_tok_add_eos(t));
		CHECK_EQ_INT(kvt_tok_token_type(t, 105), KVT_TOK_CONTROL);
		/* No tokenizer.chat_template in this GGUF: auto picks gemma by architecture. */
		CHECK_EQ_INT(kvt_tok_chat_kind(t), KVT_TOK_CHAT_GEMMA);
		check_reference(t);
		check_markers(t);
		report_speed(t);
	}
	kvt_tok_destroy(t);
	kvt_gguf_close(g);
	return check_done("test_tok_gemma3");
}
