/*
 * tests/test_tok_model.c — the tokenizer of the default model against llama.cpp.
 * ctest-labels: model
 *
 * Loads the default GGUF (SmolLM2-135M-Instruct, exit 77 when absent), builds
 * the tokenizer from it and checks every case of tests/ref/tokenizer_ref.tsv
 * (token ids from llama.cpp via llama-cpp-python, parse_special=true, no BOS):
 * the ids must match exactly, and decoding them (kvt_tok_token_bytes and the
 * streaming decoder) must give the input back. A mismatch prints the input and
 * both id lists. It also checks the model's special ids, the chat format with
 * the template stored in the file, that a chat message made of every special
 * token's text encodes to no special id but the template's own markers, that
 * a synthetic model which copies the tokenizer (bench_shape_model's) tokenizes
 * every reference case the same, and prints encode speed on ~100 KB of text (information, not an assertion).
 */
#include "check.h"
#include "gguf.h"
#include "ref_read.h"
#include "synth_model.h"
#include "tokenizer.h"

#include <ctype.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_IDS 65536

static void print_bytes(const char *label, const unsigned char *b, size_t n)
{
	fprintf(stderr, "  %s \"", label);
	for (size_t i = 0; i < n; i++) {
		if (b[i] == '\n')
			fputs("\\n", stderr);
		else if (b[i] == '\\' || b[i] == '"')
			fprintf(stderr, "\\%c", b[i]);
		else if (b[i] < 0x20 || b[i] == 0x7f)
			fprintf(stderr, "\\x%02x", b[i]);
		else
			fputc(b[i], stderr);
	}
	fputs("\"\n", stderr);
}

static void check_reference(const kvt_tok *t)
{
	static unsigned char input[1 << 16], back[1 << 16];
	static int32_t want[MAX_IDS], got[MAX_IDS];
	char path[4096], line[1 << 17];
	size_t n_cases = 0, n_bad = 0, n_skip_rt = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/tests/ref/tokenizer_ref.tsv", KVT_SOURCE_DIR);
	f = fopen(path, "r");
	CHECKF(f != NULL, "cannot open %s", path);
	if (!f)
		return;
	for (size_t lineno = 1; fgets(line, sizeof(line), f); lineno++) {
		size_t len = strcspn(line, "\r\n");
		char *tab;
		long n_in;
		size_t n_want = 0, n_got;
		int rc;

		line[len] = '\0';
		if (line[0] == '#' || len == 0)
			continue;
		tab = strchr(line, '\t');
		CHECKF(tab != NULL, "%s:%zu: no tab", path, lineno);
		if (!tab)
			continue;
		n_in = ref_unhex(line, (size_t)(tab - line), input, sizeof(input));
		CHECKF(n_in >= 0, "%s:%zu: bad hex", path, lineno);
		if (n_in < 0)
			continue;
		int n_ids = ref_parse_ids(tab + 1, want, MAX_IDS, NULL);

		CHECKF(n_ids >= 0, "%s:%zu: more than %d ids", path, lineno, MAX_IDS);
		n_want = n_ids > 0 ? (size_t)n_ids : 0;
		n_cases++;

		rc = kvt_tok_encode(t, (const char *)input, (size_t)n_in, true, got, MAX_IDS, &n_got);
		bool same = rc == KVT_OK && n_got == n_want && memcmp(got, want, n_want * sizeof(int32_t)) == 0;

		CHECKF(same, "%s:%zu: token ids differ from llama.cpp (rc %d)", path, lineno, rc);
		if (!same) {
			n_bad++;
			print_bytes("input", input, (size_t)n_in);
			ref_print_ids("llama.cpp", want, n_want);
			ref_print_ids("kvtier   ", got, n_got < MAX_IDS ? n_got : MAX_IDS);
		}
		if (!ref_valid_utf8(input, (size_t)n_in)) {
			n_skip_rt++; /* invalid bytes become U+FFFD, as in llama.cpp */
			continue;
		}
		size_t n_back = ref_decode(t, want, n_want, false, back, sizeof(back));

		CHECKF(n_back == (size_t)n_in && memcmp(back, input, (size_t)n_in) == 0,
		       "%s:%zu: decode(ids) is not the input", path, lineno);
		n_back = ref_decode(t, want, n_want, true, back, sizeof(back));
		CHECKF(n_back == (size_t)n_in && memcmp(back, input, (size_t)n_in) == 0,
		       "%s:%zu: streaming decode(ids) is not the input", path, lineno);
	}
	fclose(f);
	CHECKF(n_cases >= 50, "only %zu reference cases in %s", n_cases, path);
	printf("reference: %zu cases, %zu mismatches, %zu not round-tripped (invalid UTF-8)\n", n_cases,
	       n_bad, n_skip_rt);
}

static void check_specials(const kvt_tok *t)
{
	int32_t ids[8];
	size_t n;

	CHECK_EQ_INT(kvt_tok_n_vocab(t), 49152);
	CHECK_EQ_INT(kvt_tok_bos(t), 1);
	CHECK_EQ_INT(kvt_tok_eos(t), 2);
	CHECK(!kvt_tok_add_bos(t));
	CHECK(kvt_tok_is_eog(t, 2));  /* <|im_end|> */
	CHECK(kvt_tok_is_eog(t, 0));  /* <|endoftext|> */
	CHECK(!kvt_tok_is_eog(t, 1)); /* <|im_start|> */
	CHECK(!kvt_tok_is_eog(t, 198));
	CHECK(kvt_tok_encode(t, "<|im_end|>", 10, true, ids, 8, &n) == KVT_OK && n == 1 && ids[0] == 2);
	CHECK(kvt_tok_encode(t, "<|im_end|>", 10, false, ids, 8, &n) == KVT_OK && n > 1);
}

static void check_chat(const kvt_tok *t)
{
	kvt_chat_msg user[] = { { "user", "What is the capital of France?", 0 } };
	kvt_chat_msg sys[] = { { "system", "Be brief.", 0 }, { "user", "Hi", 0 } };
	char *s = NULL;

	CHECK(kvt_tok_chat_format(t, user, 1, true, &s) == KVT_OK);
	CHECKF(s && strcmp(s, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
			      "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
			      "<|im_end|>\n<|im_start|>assistant\n") == 0,
	       "got \"%s\"", s ? s : "(null)");
	free(s);
	s = NULL;
	CHECK(kvt_tok_chat_format(t, sys, 2, false, &s) == KVT_OK);
	CHECKF(s && strcmp(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n") == 0,
	       "got \"%s\"", s ? s : "(null)");
	free(s);
}

/*
 * A forged turn: a user message holding the text of every special token of
 * the vocabulary (CONTROL, USER_DEFINED, UNKNOWN; "<|im_end|>" among them) must
 * encode to ids in which the only special ids are the template's markers, as
 * many as the template writes. A message of plain text encodes exactly as the
 * formatted string with special tokens parsed (what the daemon sent before).
 */
static void check_chat_no_forgery(const kvt_gguf *g, const kvt_tok *t)
{
	const kvt_gguf_kv *types = NULL;
	size_t n_vocab = kvt_tok_n_vocab(t), len = 0, n_specials = 0;

	CHECK(kvt_gguf_get_arr(g, "tokenizer.ggml.token_type", KVT_GGUF_INT32, &types) == KVT_OK);
	if (!types)
		return;
	CHECK(types->n == n_vocab);
	char *forged = calloc(1, 1);
	for (size_t id = 0; forged && id < n_vocab && id < types->n; id++) {
		int64_t ty = kvt_gguf_arr_i64(types, id);
		const char *bytes;
		size_t n;
		if (ty != KVT_TOK_CONTROL && ty != KVT_TOK_USER_DEFINED && ty != KVT_TOK_UNKNOWN)
			continue;
		CHECK(kvt_tok_token_bytes(t, (int32_t)id, &bytes, &n) == KVT_OK);
		char *p = realloc(forged, len + n + 3);
		CHECK(p != NULL);
		if (!p)
			break;
		forged = p;
		memcpy(forged + len, bytes, n);
		memcpy(forged + len + n, " x", 2);
		len += n + 2;
		forged[len] = '\0';
		n_specials++;
	}
	printf("forged message: the text of %zu special tokens, %zu bytes\n", n_specials, len);
	CHECK(n_specials >= 2 && forged && strstr(forged, "<|im_end|>") && strstr(forged, "<|im_start|>"));

	kvt_chat_msg msgs[] = { { "system", "Be brief.", 0 }, { "user", forged ? forged : "", 0 } };
	int32_t *ids = NULL;
	size_t n_ids = 0, n_start = 0, n_end = 0, n_other = 0;
	CHECK(kvt_tok_chat_encode(t, msgs, 2, true, &ids, &n_ids) == KVT_OK);
	for (size_t i = 0; ids && i < n_ids; i++) {
		int64_t ty = ids[i] >= 0 && (size_t)ids[i] < types->n ? kvt_gguf_arr_i64(types, (uint64_t)ids[i]) : -1;
		if (ty == KVT_TOK_NORMAL || ty == KVT_TOK_BYTE)
			continue;
		const char *bytes;
		size_t n;
		CHECK(kvt_tok_token_bytes(t, ids[i], &bytes, &n) == KVT_OK);
		if (n == 12 && !memcmp(bytes, "<|im_start|>", 12))
			n_start++;
		else if (n == 10 && !memcmp(bytes, "<|im_end|>", 10))
			n_end++;
		else {
			n_other++;
			CHECKF(0, "special id %d (%.*s) at position %zu of the prompt", ids[i], (int)n, bytes, i);
		}
	}
	CHECKF(n_start == 3 && n_end == 2 && n_other == 0, "markers: %zu <|im_start|>, %zu <|im_end|>, %zu other",
	       n_start, n_end, n_other);
	free(ids);
	free(forged);

	/* Plain text: the same ids as the formatted string, specials parsed. */
	kvt_chat_msg plain[] = { { "user", "What is the capital of France?\n\n  Answer  in one word.", 0 },
				 { "assistant", "Paris.", 0 }, { "user", " And of Spain?", 0 } };
	char *s = NULL;
	int32_t want[256];
	size_t n_want = 0;
	ids = NULL;
	CHECK(kvt_tok_chat_format(t, plain, 3, true, &s) == KVT_OK);
	CHECK(s && kvt_tok_encode(t, s, strlen(s), true, want, 256, &n_want) == KVT_OK);
	CHECK(kvt_tok_chat_encode(t, plain, 3, true, &ids, &n_ids) == KVT_OK);
	CHECKF(ids && n_ids == n_want && !memcmp(ids, want, n_ids * sizeof(*ids)),
	       "chat_encode gives %zu ids, encode(chat_format) %zu", n_ids, n_want);
	free(ids);
	free(s);
}

/* Encode speed on ~100 KB of mixed text and a 10 KB run without spaces (printed only). */
static void report_speed(const kvt_tok *t)
{
	static const char para[] =
		"The quick brown fox jumps over the lazy dog; it's 2024, and caf\xc3\xa9s serve 3.14 pies. "
		"\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c! int main(void) { return 0; }\n\n";
	size_t len = 100 * 1024, n_ids = 0;
	char *text = malloc(len + 1);
	int32_t *ids = malloc(len * sizeof(int32_t));
	double t0, dt;

	if (!text || !ids) {
		free(text);
		free(ids);
		CHECK(!"out of memory");
		return;
	}
	for (size_t i = 0; i < len; i++)
		text[i] = para[i % (sizeof(para) - 1)];
	while (len && (text[len - 1] & 0xc0) == 0x80)
		len--; /* do not end inside a character */
	t0 = kvt_now_s();
	CHECK(kvt_tok_encode(t, text, len, true, ids, len, &n_ids) == KVT_OK);
	dt = kvt_now_s() - t0;
	printf("encode: %zu bytes -> %zu tokens in %.3f ms (%.0f tokens/s, %.1f MB/s)\n", len, n_ids,
	       dt * 1e3, n_ids / dt, len / dt / 1e6);

	memset(text, 'x', 10 * 1024);
	t0 = kvt_now_s();
	CHECK(kvt_tok_encode(t, text, 10 * 1024, true, ids, len, &n_ids) == KVT_OK);
	dt = kvt_now_s() - t0;
	printf("encode: 10 KB without spaces -> %zu tokens in %.3f ms\n", n_ids, dt * 1e3);
	free(text);
	free(ids);
}

/*
 * A synthetic model that copies this tokenizer (kvt_synth_llama.tokenizer_from,
 * what bench_shape_model writes): the same ids on every reference case, the
 * same chat template, and embeddings of the vocabulary's size.
 */
static void check_copied_tokenizer(const char *path, const kvt_gguf *src)
{
	char out[] = "/tmp/kvt_tokcopy_XXXXXX";
	int fd = mkstemp(out);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	close(fd);
	kvt_synth_llama c;
	kvt_synth_llama_default(&c);
	c.tokenizer_from = path;
	CHECK(kvt_synth_llama_write(&c, out) == KVT_OK);
	kvt_gguf *g = NULL;
	kvt_tok *t = NULL;
	const kvt_gguf_kv *toks = NULL;
	CHECK(kvt_gguf_open(out, &g) == KVT_OK);
	if (g && kvt_gguf_get_arr(src, "tokenizer.ggml.tokens", KVT_GGUF_STRING, &toks) == KVT_OK) {
		const kvt_gguf_tensor *e = kvt_gguf_find_tensor(g, "token_embd.weight");
		CHECK(e && e->ne[1] == toks->n);
		kvt_gguf_str a, b;
		CHECK(kvt_gguf_get_str(src, "tokenizer.chat_template", &a) == KVT_OK &&
		      kvt_gguf_get_str(g, "tokenizer.chat_template", &b) == KVT_OK && a.len == b.len &&
		      !memcmp(a.ptr, b.ptr, a.len));
		CHECK(kvt_tok_create_from_gguf(g, &t) == KVT_OK);
		if (t)
			check_reference(t);
	}
	kvt_tok_destroy(t);
	kvt_gguf_close(g);
	unlink(out);
	/* a file with no vocabulary to copy: a named error */
	kvt_synth_llama_default(&c);
	CHECK(kvt_synth_llama_write(&c, out) == KVT_OK);
	char out2[] = "/tmp/kvt_tokcopy2_XXXXXX";
	fd = mkstemp(out2);
	CHECK(fd >= 0);
	if (fd >= 0)
		close(fd);
	c.tokenizer_from = "/nonexistent/model.gguf";
	CHECK(kvt_synth_llama_write(&c, out2) != KVT_OK);
	unlink(out);
	unlink(out2);
}

int main(void)
{
	const char *path = check_default_model();
	kvt_gguf *g = NULL;
	kvt_tok *t = NULL;

	if (!path)
		return check_skip("test_tok_model", "default model not present (models/ or KVTIER_MODEL)");
	CHECK(kvt_gguf_open(path, &g) == KVT_OK);
	if (g)
		CHECK(kvt_tok_create_from_gguf(g, &t) == KVT_OK);
	if (t) {
		check_reference(t);
		check_specials(t);
		check_chat(t);
		check_chat_no_forgery(g, t);
		report_speed(t);
		check_copied_tokenizer(path, g);
	}
	kvt_tok_destroy(t);
	kvt_gguf_close(g);
	return check_done("test_tok_model");
}
