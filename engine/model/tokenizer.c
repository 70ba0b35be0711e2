/*
 * engine/model/tokenizer.c — GPT-2 byte-level BPE and SentencePiece as
 * llama.cpp runs them for a GGUF whose tokenizer.ggml.model is "gpt2" / "llama".
 *
 * Pipeline of kvt_tok_encode():
 *   1. Special tokens are split out of the raw bytes exactly as llama.cpp's
 *      tokenizer_st_partition does: every CONTROL / USER_DEFINED / UNKNOWN
 *      token, longest text first, splits every remaining raw fragment at each
 *      of its occurrences. Without parse_special only USER_DEFINED tokens are
 *      split (CONTROL and UNKNOWN stay text), as in llama.cpp, less the
 *      modality markers kvtier makes CONTROL (tok_marker_texts).
 *   2. Each raw fragment is decoded the way llama.cpp's unicode_cpts_from_utf8
 *      does it: lenient (overlong forms and surrogates decode), and every byte
 *      that starts no sequence becomes U+FFFD. Strictly valid UTF-8 (the common
 *      case) passes through untouched. Two buffers of equal length come out:
 *      the "match" text (valid UTF-8, surrogates shown as U+FFFD, which has the
 *      same regex class) and the "emit" text (what llama.cpp re-encodes).
 *   3. The pre-tokenizer regexes of tokenizer.ggml.pre run with PCRE2 (UTF +
 *      UCP, JIT when available) on the match text. Each regex is applied to
 *      each piece the previous one produced, with the piece as the whole
 *      subject (lookaheads do not see past it); matches and the unmatched text
 *      between them both become pieces. The regex strings below are llama.cpp's
 *      verbatim; before compiling, \p{L}, \p{N}, \p{P}, \s and \S are
 *      rewritten to the character sets llama.cpp's own unicode tables give
 *      them (Unicode 15.1 categories, and White_Space for \s; PCRE2 10.42
 *      knows Unicode 14 and counts U+180E as a space). With those sets PCRE2
 *      gives the same pieces as llama.cpp's hand-written gpt2/llama3 splitters
 *      and its std::regex fallback (compared on every code point): a run of
 *      whitespace before a non-space leaves its last character to the next
 *      piece via \s+(?!\S), and what llama.cpp's splitter emits as "no
 *      match" is the unmatched text between PCRE2 matches.
 *   4. Each piece (emit bytes) is merged by BPE: one symbol per byte (the
 *      byte's GPT-2 bytes_to_unicode character), then repeatedly the adjacent
 *      pair with the lowest merge rank, leftmost first, with a binary heap and
 *      lazy invalidation, so a 10 KB piece costs O(n log n). Symbols carry
 *      token ids; a merge rank is found by (left id, right id) in a hash map.
 *      A symbol whose text is not a token falls back to llama.cpp's per-byte
 *      lookup. Pre-types with ignore_merges (llama3) first look the whole piece
 *      up in the vocabulary.
 *
 * SentencePiece (tokenizer.ggml.model "llama", llama.cpp's SPM tokenizer):
 * step 1 as above; steps 2-4 are replaced by tok_spm(): the fragment gets
 * a leading space when add_space_prefix is set and it opens the input or
 * follows a special token, every ' ' becomes U+2581, the text is cut into one
 * symbol per UTF-8 character (length from the lead byte alone, cut short at
 * the end, so stray bytes are one-byte symbols; no U+FFFD rewriting), and
 * adjacent symbols whose concatenation is a token merge, highest token score
 * first, leftmost first on ties (the same heap, keyed by an order-preserving
 * map of the float score). A final symbol that is not a token (only possible
 * for a single character, since merges only form tokens) becomes one <0xXX>
 * byte token per byte; a byte without one falls back to the one-character
 * token, then to UNK (llama.cpp throws there). Token types are not consulted
 * when merging, as in llama.cpp.
 *
 * Decoding: each token's raw bytes are computed once at creation (special
 * tokens: their text; others: the inverse byte map, characters outside it
 * copied verbatim), so kvt_tok_token_bytes() is a lookup. NOTE: llama.cpp
 * renders BYTE/UNUSED/UNDEFINED tokens of a gpt2 vocabulary as nothing; we
 * decode them like NORMAL ones (the encoder never produces them from text
 * unless a merge leads there). SentencePiece: NORMAL tokens with U+2581 as a
 * space, BYTE tokens <0xXX> as that byte, UNUSED/UNDEFINED as nothing (as
 * llama.cpp). The space add_space_prefix put in front is decoded too, as
 * llama.cpp's token_to_piece does for each token; see kvt_tok_add_space_prefix.
 *
 * Invariants: a kvt_tok never changes after kvt_tok_create() returns; every
 * call allocates its own scratch (and its own PCRE2 match data), so one
 * tokenizer serves any number of threads. Merges name tokens of the vocabulary
 * (checked at creation), so a symbol that is not a token never merges.
 *
 * Chat templates (a model's family, a conversation as a prompt string or as
 * ids) are chat_template.c; it shares struct kvt_tok and two helpers of this
 * file through tokenizer_int.h. Names: kvt_tok_* is the public API
 * (tokenizer.h, chat_template.h); the helpers private to the tokenizer's files
 * are tok_*.
 */
#define _GNU_SOURCE /* memmem */
#include "tokenizer_int.h"

#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- pre-tokenizers (regex lists from llama.cpp's llm_tokenizer_bpe) ---- */

#define KVT_TOK_RE_GPT2 \
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define KVT_TOK_RE_LLAMA3                                                                  \
	"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
	"\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define KVT_TOK_RE_QWEN2                                                                   \
	"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
	"\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

struct tok_pre {
	const char *const *names;                /* tokenizer.ggml.pre values, NULL-terminated */
	const char *regexes[KVT_TOK_MAX_REGEX];  /* llama.cpp's list, applied in order; NULL ends */
	bool ignore_merges;                      /* a piece that is a token is emitted whole */
	bool add_bos;                            /* llama.cpp's add_bos default for this type */
};

static const char *const tok_names_default[] = { "default", NULL };
static const char *const tok_names_gpt2[] = { "gpt-2", "phi-2", "mpt", "olmo", "jais", NULL };
static const char *const tok_names_smollm[] = { "smollm", "starcoder", "refact", "command-r",
						     "codeshell", "exaone", "minerva-7b", NULL };
static const char *const tok_names_llama3[] = { "llama3", "llama-v3", "llama-bpe", "falcon3",
						     "falcon-h1", "pixtral", "midm-2.0", "lfm2", NULL };
static const char *const tok_names_dbrx[] = { "dbrx", "smaug-bpe", NULL };
static const char *const tok_names_qwen2[] = { "qwen2", "deepseek-r1-qwen", "kormo", "megrez",
						    "stablelm2", NULL };

static const struct tok_pre tok_pres[] = {
	{ tok_names_default,
	  { "[\\p{P}\\$\\+<=>\\^~\\|]+", KVT_TOK_RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]" }, false, false },
	{ tok_names_gpt2, { KVT_TOK_RE_GPT2 }, false, false },
	{ tok_names_smollm, { "\\p{N}", KVT_TOK_RE_GPT2 }, false, false },
	{ tok_names_llama3, { KVT_TOK_RE_LLAMA3 }, true, true },
	{ tok_names_dbrx, { KVT_TOK_RE_LLAMA3 }, false, false },
	{ tok_names_qwen2, { KVT_TOK_RE_QWEN2 }, false, false },
};

/*
 * Class bodies that stand in for \p{L}, \p{N}, \p{P} and \s so that PCRE2
 * classifies code points as llama.cpp's unicode-data.cpp (Unicode 15.1) does.
 * The extra ranges are the letters, numbers and punctuation added after
 * Unicode 14 (PCRE2 10.42's tables; redundant, and harmless, with a newer
 * PCRE2); the whitespace set is llama.cpp's unicode_set_whitespace.
 */
#define KVT_TOK_CLASS_L                                                                   \
	"\\p{L}\\x{1123f}-\\x{11240}\\x{11f02}\\x{11f04}-\\x{11f10}\\x{11f12}-\\x{11f33}"    \
	"\\x{1342f}\\x{13441}-\\x{13446}\\x{1b132}\\x{1b155}\\x{1df25}-\\x{1df2a}"            \
	"\\x{1e030}-\\x{1e06d}\\x{1e4d0}-\\x{1e4eb}\\x{2b739}\\x{2ebf0}-\\x{2ee5d}"           \
	"\\x{31350}-\\x{323af}"
#define KVT_TOK_CLASS_N "\\p{N}\\x{11f50}-\\x{11f59}\\x{1d2c0}-\\x{1d2d3}\\x{1e4f0}-\\x{1e4f9}"
#define KVT_TOK_CLASS_P "\\p{P}\\x{11b00}-\\x{11b09}\\x{11f43}-\\x{11f4f}"
#define KVT_TOK_CLASS_WS                                                                  \
	"\\t\\n\\x{0b}\\f\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"   \
	"\\x{202f}\\x{205f}\\x{3000}"

/* ---- small helpers ---- */

static uint64_t tok_hash_bytes(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 0x100000001b3ULL;
	}
	return h ^ (h >> 29);
}

static uint64_t tok_hash_u64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ULL;
	return k ^ (k >> 33);
}

/* Smallest power of two >= 2 * n (at least 16); false on overflow. */
static bool tok_map_capacity(uint64_t n, uint64_t *cap)
{
	uint64_t c = 16;

	while (c < 2 * n) {
		if (c > UINT64_MAX / 4)
			return false;
		c *= 2;
	}
	*cap = c;
	return true;
}

/* Grow *p (elements of elem bytes) to hold at least need elements. */
int tok_reserve(void **p, size_t *cap, size_t need, size_t elem)
{
	size_t n = *cap ? *cap : 64;
	void *q;

	if (need <= *cap)
		return KVT_OK;
	while (n < need) {
		if (n > SIZE_MAX / 2)
			return KVT_ENOMEM;
		n *= 2;
	}
	if (n > SIZE_MAX / elem)
		return KVT_ENOMEM;
	q = realloc(*p, n * elem);
	if (!q)
		return KVT_ENOMEM;
	*p = q;
	*cap = n;
	return KVT_OK;
}

static const char *tok_text(const kvt_tok *t, int32_t id)
{
	return t->text_buf + t->text_off[id];
}

int32_t tok_find_text(const kvt_tok *t, const char *s, size_t n)
{
	uint64_t i = tok_hash_bytes(s, n) & t->text_map.mask;

	for (;; i = (i + 1) & t->text_map.mask) {
		int32_t id = t->text_map.slots[i];

		if (id < 0)
			return -1;
		if (t->text_len[id] == n && memcmp(tok_text(t, id), s, n) == 0)
			return id;
	}
}

/* Merge rank of the pair, or -1. */
static int64_t tok_find_pair(const kvt_tok *t, int32_t left, int32_t right)
{
	uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
	uint64_t i = tok_hash_u64(key) & t->pair_map.mask;

	for (;; i = (i + 1) & t->pair_map.mask) {
		if (t->pair_map.keys[i] == UINT64_MAX)
			return -1;
		if (t->pair_map.keys[i] == key)
			return t->pair_map.ranks[i];
	}
}

/* Encode code point cp as UTF-8 into o (room for 4); returns the length. */
static size_t tok_utf8_put(uint32_t cp, unsigned char *o)
{
	if (cp < 0x80) {
		o[0] = (unsigned char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (unsigned char)(0xc0 | cp >> 6);
		o[1] = (unsigned char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (unsigned char)(0xe0 | cp >> 12);
		o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
		o[2] = (unsigned char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (unsigned char)(0xf0 | cp >> 18);
	o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
	o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
	o[3] = (unsigned char)(0x80 | (cp & 0x3f));
	return 4;
}

/*
 * Strict UTF-8 decode of one character at s[0..n): its length, or 0 if the
 * bytes there are not a complete, shortest-form, non-surrogate character.
 */
static size_t tok_utf8_strict(const unsigned char *s, size_t n, uint32_t *cp)
{
	unsigned char b = s[0];

	if (b < 0x80) {
		*cp = b;
		return 1;
	}
	if (b >= 0xc2 && b <= 0xdf) {
		if (n < 2 || (s[1] & 0xc0) != 0x80)
			return 0;
		*cp = (uint32_t)(b & 0x1f) << 6 | (s[1] & 0x3f);
		return 2;
	}
	if (b >= 0xe0 && b <= 0xef) {
		if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80)
			return 0;
		if ((b == 0xe0 && s[1] < 0xa0) || (b == 0xed && s[1] > 0x9f))
			return 0;
		*cp = (uint32_t)(b & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
		return 3;
	}
	if (b >= 0xf0 && b <= 0xf4) {
		if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
			return 0;
		if ((b == 0xf0 && s[1] < 0x90) || (b == 0xf4 && s[1] > 0x8f))
			return 0;
		*cp = (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 |
		      (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
		return 4;
	}
	return 0;
}

static bool tok_utf8_valid(const unsigned char *s, size_t n)
{
	size_t i = 0;
	uint32_t cp;

	while (i < n) {
		if (s[i] < 0x80) {
			i++;
			continue;
		}
		size_t l = tok_utf8_strict(s + i, n - i, &cp);

		if (!l)
			return false;
		i += l;
	}
	return true;
}

/*
 * llama.cpp's lenient decode (unicode_cpt_from_utf8): the lead byte alone
 * decides the length, continuation bytes are only checked for their top bits,
 * overlong forms and surrogates are accepted. Returns the length consumed, or
 * 0 when llama.cpp would throw (the byte then becomes U+FFFD).
 */
static size_t tok_utf8_lenient(const unsigned char *s, size_t n, uint32_t *cp)
{
	unsigned char b = s[0];
	size_t len;

	if (b < 0x80) {
		*cp = b;
		return 1;
	}
	if (b < 0xc0)
		return 0;
	len = b < 0xe0 ? 2 : b < 0xf0 ? 3 : b < 0xf8 ? 4 : 0;
	if (!len || n < len)
		return 0;
	*cp = b & (0x7f >> len);
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		*cp = *cp << 6 | (s[i] & 0x3f);
	}
	return len;
}

/* ---- regexes ---- */

/*
 * Rewrite a llama.cpp regex for PCRE2: \p{L}, \p{N}, \p{P} and \s (in or
 * outside a class) and \S (outside a class) become the llama.cpp character
 * sets above. Returns a malloc'd string, or NULL when out of memory.
 */
static char *tok_re_expand(const char *src)
{
	/* Each rewrite consumes >= 2 source bytes and writes <= a class body + 3. */
	size_t cap = strlen(src) * (sizeof(KVT_TOK_CLASS_L) + 3) + 1;
	char *dst = malloc(cap);
	size_t n = 0;
	bool inside = false;

	if (!dst)
		return NULL;
	for (const char *p = src; *p;) {
		const char *body = NULL;
		size_t skip = 2;
		bool negate = false;

		if (p[0] == '\\' && p[1] == 'p' && strncmp(p, "\\p{L}", 5) == 0) {
			body = KVT_TOK_CLASS_L;
			skip = 5;
		} else if (p[0] == '\\' && strncmp(p, "\\p{N}", 5) == 0) {
			body = KVT_TOK_CLASS_N;
			skip = 5;
		} else if (p[0] == '\\' && strncmp(p, "\\p{P}", 5) == 0) {
			body = KVT_TOK_CLASS_P;
			skip = 5;
		} else if (p[0] == '\\' && p[1] == 's') {
			body = KVT_TOK_CLASS_WS;
		} else if (p[0] == '\\' && p[1] == 'S') {
			KVT_ASSERT(!inside); /* no pattern of the table has \S in a class */
			body = KVT_TOK_CLASS_WS;
			negate = true;
		}
		if (body) {
			size_t bl = strlen(body);

			if (!inside) {
				dst[n++] = '[';
				if (negate)
					dst[n++] = '^';
			}
			memcpy(dst + n, body, bl);
			n += bl;
			if (!inside)
				dst[n++] = ']';
			p += skip;
			continue;
		}
		if (p[0] == '\\' && p[1]) {
			dst[n++] = *p++;
			dst[n++] = *p++;
			continue;
		}
		if (*p == '[')
			inside = true;
		else if (*p == ']')
			inside = false;
		dst[n++] = *p++;
	}
	dst[n] = '\0';
	return dst;
}

static const struct tok_pre *tok_pre_find(const char *name)
{
	for (size_t i = 0; i < sizeof(tok_pres) / sizeof(tok_pres[0]); i++)
		for (const char *const *n = tok_pres[i].names; *n; n++)
			if (strcmp(*n, name) == 0)
				return &tok_pres[i];
	return NULL;
}

static int tok_compile(kvt_tok *t, const struct tok_pre *pre, const char *pre_name)
{
	/*
	 * NOTE: PCRE2's default match limit (10M) stops \s*[\r\n]+ on a
	 * whitespace run of a few MB. No pattern of the table nests quantifiers,
	 * so a match attempt is linear in the piece; lift the limit.
	 */
	t->mctx = pcre2_match_context_create(NULL);
	if (!t->mctx)
		return KVT_ENOMEM;
	pcre2_set_match_limit(t->mctx, UINT32_MAX);
	for (uint32_t i = 0; i < KVT_TOK_MAX_REGEX && pre->regexes[i]; i++) {
		char *src = tok_re_expand(pre->regexes[i]);
		int err;
		PCRE2_SIZE err_off;
		uint32_t n_cap;

		if (!src)
			return KVT_ENOMEM;
		t->re[i] = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
					 &err, &err_off, NULL);
		free(src);
		if (!t->re[i]) {
			PCRE2_UCHAR msg[128];

			pcre2_get_error_message(err, msg, sizeof(msg));
			KVT_LOGE("tokenizer: pre-tokenizer '%s': regex %u does not compile at %zu: %s",
				 pre_name, i, (size_t)err_off, (const char *)msg);
			return KVT_EUNSUPPORTED;
		}
		t->n_re = i + 1;
		/* NOTE: without JIT support PCRE2 interprets; same results, slower. */
		(void)pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE);
		if (pcre2_pattern_info(t->re[i], PCRE2_INFO_CAPTURECOUNT, &n_cap) == 0 &&
		    n_cap + 1 > t->max_match_pairs)
			t->max_match_pairs = n_cap + 1;
	}
	return KVT_OK;
}

/* ---- creation ---- */

/* Texts llama.cpp marks as end of generation (and forces to CONTROL). */
static const char *const tok_eog_texts[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
	"<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
};

/*
 * Texts that stand for input of another modality: Gemma 3's image markers
 * (and the audio ones of its family). Their GGUFs store them USER_DEFINED,
 * which llama.cpp splits out of any text, parse_special or not, so a chat
 * message holding "<start_of_image>" would carry an image marker. kvtier
 * makes them CONTROL: without parse_special (every chat message) they are
 * text, as DESIGN.md §5 wants of message text; with it they are still the
 * one token. A deliberate difference from llama.cpp (test_tok_gemma3).
 */
static const char *const tok_marker_texts[] = {
	"<start_of_image>", "<end_of_image>", "<image_soft_token>", "[multimodal]",
	"<start_of_audio>", "<end_of_audio>", "<audio_soft_token>",
};

static bool tok_is_special_type(int type)
{
	return type == KVT_TOK_CONTROL || type == KVT_TOK_USER_DEFINED || type == KVT_TOK_UNKNOWN;
}

static void tok_init_byte_map(kvt_tok *t)
{
	uint32_t k = 0;

	for (int i = 0; i < 0x144; i++)
		t->cp_byte[i] = -1;
	for (uint32_t b = 0; b < 256; b++) {
		bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;

		t->byte_cp[b] = printable ? b : 0x100 + k++;
		t->cp_byte[t->byte_cp[b]] = (int16_t)b;
	}
}

static int tok_copy_tokens(kvt_tok *t, const kvt_tok_vocab *v)
{
	uint64_t total = 0;

	for (uint32_t i = 0; i < v->n_tokens; i++) {
		if (!v->tokens[i] && v->token_lens[i]) {
			KVT_LOGE("tokenizer: token %u: NULL text", i);
			return KVT_EINVAL;
		}
		if (v->token_lens[i] > UINT32_MAX / 4 || !kvt_add_u64(total, v->token_lens[i] + 1, &total)) {
			KVT_LOGE("tokenizer: token %u: text of %zu bytes is too long", i, v->token_lens[i]);
			return KVT_ECORRUPT;
		}
	}
	if (total > SIZE_MAX / 4)
		return KVT_ENOMEM;
	t->text_buf = malloc(total ? total : 1);
	/* Decoded bytes are never longer than the text: each character gives at most its own bytes. */
	t->bytes_buf = malloc(total ? total : 1);
	if (!t->text_buf || !t->bytes_buf)
		return KVT_ENOMEM;
	size_t off = 0;

	for (uint32_t i = 0; i < v->n_tokens; i++) {
		t->text_off[i] = off;
		t->text_len[i] = (uint32_t)v->token_lens[i];
		if (v->token_lens[i])
			memcpy(t->text_buf + off, v->tokens[i], v->token_lens[i]);
		off += v->token_lens[i];
		t->text_buf[off++] = '\0';
	}
	return KVT_OK;
}

static int tok_build_text_map(kvt_tok *t)
{
	uint64_t cap;

	if (!tok_map_capacity(t->n_tokens, &cap) || cap > SIZE_MAX / sizeof(int32_t))
		return KVT_ENOMEM;
	t->text_map.slots = malloc(cap * sizeof(int32_t));
	if (!t->text_map.slots)
		return KVT_ENOMEM;
	t->text_map.mask = cap - 1;
	memset(t->text_map.slots, 0xff, cap * sizeof(int32_t));
	for (uint32_t id = 0; id < t->n_tokens; id++) {
		const char *s = tok_text(t, (int32_t)id);
		uint64_t i;

		/* NOTE: an empty token can never be produced from text (llama.cpp renames it). */
		if (!t->text_len[id])
			continue;
		if (tok_find_text(t, s, t->text_len[id]) >= 0) {
			KVT_LOGE("tokenizer: token %u '%s': duplicate text (also token %d)", id, s,
				 tok_find_text(t, s, t->text_len[id]));
			return KVT_ECORRUPT;
		}
		i = tok_hash_bytes(s, t->text_len[id]) & t->text_map.mask;
		while (t->text_map.slots[i] >= 0)
			i = (i + 1) & t->text_map.mask;
		t->text_map.slots[i] = (int32_t)id;
	}
	return KVT_OK;
}

/* Look up the token named by s[0..n) of merge rank; logs and returns -1 when absent. */
static int32_t tok_merge_side(const kvt_tok *t, uint32_t rank, const char *which, const char *s, size_t n)
{
	int32_t id = tok_find_text(t, s, n);

	if (id < 0)
		KVT_LOGE("tokenizer: merge %u: %s part '%.*s' is not in the vocabulary", rank, which,
			 (int)(n > 64 ? 64 : n), s);
	return id;
}

static int tok_build_merges(kvt_tok *t, const kvt_tok_vocab *v)
{
	uint64_t cap;
	char *cat = NULL;
	size_t cat_cap = 0;

	if (!tok_map_capacity(v->n_merges, &cap) || cap > SIZE_MAX / sizeof(uint64_t))
		return KVT_ENOMEM;
	t->pair_map.keys = malloc(cap * sizeof(uint64_t));
	t->pair_map.ranks = malloc(cap * sizeof(uint32_t));
	t->merge_result = malloc((v->n_merges ? v->n_merges : 1) * sizeof(int32_t));
	if (!t->pair_map.keys || !t->pair_map.ranks || !t->merge_result)
		return KVT_ENOMEM;
	t->pair_map.mask = cap - 1;
	memset(t->pair_map.keys, 0xff, cap * sizeof(uint64_t));
	t->n_merges = v->n_merges;
	for (uint32_t r = 0; r < v->n_merges; r++) {
		const char *m = v->merges[r] ? v->merges[r] : "";
		size_t n = v->merges[r] ? v->merge_lens[r] : 0, sp = 1;
		int32_t left, right;

		/* As llama.cpp: the separator is the first space after the first byte. */
		while (sp < n && m[sp] != ' ')
			sp++;
		if (sp >= n) {
			KVT_LOGE("tokenizer: merge %u: '%.*s' is not \"left right\"", r, (int)(n > 64 ? 64 : n), m);
			free(cat);
			return KVT_ECORRUPT;
		}
		left = tok_merge_side(t, r, "left", m, sp);
		right = tok_merge_side(t, r, "right", m + sp + 1, n - sp - 1);
		if (left < 0 || right < 0) {
			free(cat);
			return KVT_ECORRUPT;
		}
		if (tok_reserve((void **)&cat, &cat_cap, n, 1)) {
			free(cat);
			return KVT_ENOMEM;
		}
		memcpy(cat, m, sp);
		memcpy(cat + sp, m + sp + 1, n - sp - 1);
		t->merge_result[r] = tok_find_text(t, cat, n - 1);

		/* A repeated pair keeps its first (lowest) rank, like llama.cpp's emplace. */
		uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
		uint64_t i = tok_hash_u64(key) & t->pair_map.mask;

		while (t->pair_map.keys[i] != UINT64_MAX && t->pair_map.keys[i] != key)
			i = (i + 1) & t->pair_map.mask;
		if (t->pair_map.keys[i] == UINT64_MAX) {
			t->pair_map.keys[i] = key;
			t->pair_map.ranks[i] = r;
		}
	}
	free(cat);
	return KVT_OK;
}

static int tok_hex(unsigned char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The byte of a SentencePiece byte token's text "<0xXX>", or -1 if s[0..n) is not one. */
static int tok_spm_byte(const unsigned char *s, size_t n)
{
	if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || tok_hex(s[3]) < 0 || tok_hex(s[4]) < 0)
		return -1;
	return tok_hex(s[3]) << 4 | tok_hex(s[4]);
}

/* SentencePiece raw bytes of a non-special token of type ty and text s[0..n) into o; returns the length. */
static size_t tok_spm_piece(int ty, const unsigned char *s, size_t n, unsigned char *o)
{
	size_t k = 0;
	int b = tok_spm_byte(s, n);

	if (ty == KVT_TOK_BYTE && b >= 0) {
		o[0] = (unsigned char)b;
		return 1;
	}
	if (ty == KVT_TOK_UNUSED || ty == KVT_TOK_UNDEFINED)
		return 0;
	for (size_t i = 0; i < n;) {
		if (n - i >= 3 && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
			o[k++] = ' ';
			i += 3;
		} else {
			o[k++] = s[i++];
		}
	}
	return k;
}

/* Raw bytes of every token (see the file comment). */
static void tok_build_bytes(kvt_tok *t)
{
	size_t off = 0;

	for (uint32_t id = 0; id < t->n_tokens; id++) {
		const unsigned char *s = (const unsigned char *)tok_text(t, (int32_t)id);
		size_t n = t->text_len[id], i = 0;
		unsigned char *o = (unsigned char *)t->bytes_buf + off;
		size_t k = 0;

		t->bytes_off[id] = off;
		if (tok_is_special_type(t->types[id])) {
			memcpy(o, s, n);
			k = n;
		} else if (t->model == KVT_TOK_MODEL_SPM) {
			k = tok_spm_piece(t->types[id], s, n, o);
		} else {
			while (i < n) {
				uint32_t cp;
				size_t l = tok_utf8_strict(s + i, n - i, &cp);

				if (l && cp < 0x144 && t->cp_byte[cp] >= 0) {
					o[k++] = (unsigned char)t->cp_byte[cp];
				} else {
					if (!l)
						l = 1;
					memcpy(o + k, s + i, l);
					k += l;
				}
				i += l;
			}
		}
		t->bytes_len[id] = (uint32_t)k;
		off += k;
	}
}

static int tok_build_specials(kvt_tok *t)
{
	uint32_t n = 0;

	for (uint32_t id = 0; id < t->n_tokens; id++)
		if (tok_is_special_type(t->types[id]) && t->text_len[id])
			n++;
	t->specials = malloc((n ? n : 1) * sizeof(int32_t));
	if (!t->specials)
		return KVT_ENOMEM;
	for (uint32_t id = 0; id < t->n_tokens; id++)
		if (tok_is_special_type(t->types[id]) && t->text_len[id])
			t->specials[t->n_specials++] = (int32_t)id;
	/* Longest text first, ties by id (insertion sort: stable, and n is small in practice). */
	for (uint32_t i = 1; i < n; i++) {
		int32_t id = t->specials[i];
		uint32_t j = i;

		while (j > 0 && t->text_len[t->specials[j - 1]] < t->text_len[id]) {
			t->specials[j] = t->specials[j - 1];
			j--;
		}
		t->specials[j] = id;
	}
	return KVT_OK;
}

static int tok_check_id(const char *what, int32_t id, uint32_t n_tokens)
{
	if (id < -1 || (id >= 0 && (uint32_t)id >= n_tokens)) {
		KVT_LOGE("tokenizer: %s id %d is out of range (vocabulary of %u)", what, id, n_tokens);
		return KVT_ECORRUPT;
	}
	return KVT_OK;
}

int kvt_tok_create(const kvt_tok_vocab *v, kvt_tok **out)
{
	const bool spm = v->model == KVT_TOK_MODEL_SPM;
	/* NOTE: SentencePiece has no pre-tokenizer; tokenizer.ggml.pre is ignored, as in llama.cpp. */
	const char *pre_name = spm ? "default" : v->pre ? v->pre : "default";
	const struct tok_pre *pre = tok_pre_find(pre_name);
	kvt_tok *t;
	int rc;

	if (v->model != KVT_TOK_MODEL_BPE && !spm) {
		KVT_LOGE("tokenizer: model kind %d is not supported", v->model);
		return KVT_EUNSUPPORTED;
	}
	if (!pre) {
		KVT_LOGE("tokenizer: pre-tokenizer '%s' is not supported", pre_name);
		return KVT_EUNSUPPORTED;
	}
	if (v->n_tokens == 0 || v->n_tokens > INT32_MAX || !v->tokens || !v->token_lens ||
	    (v->n_merges && (!v->merges || !v->merge_lens))) {
		KVT_LOGE("tokenizer: vocabulary of %u tokens / %u merges is not usable", v->n_tokens,
			 v->n_merges);
		return KVT_EINVAL;
	}
	if ((rc = tok_check_id("bos", v->bos_id, v->n_tokens)) ||
	    (rc = tok_check_id("eos", v->eos_id, v->n_tokens)) ||
	    (rc = tok_check_id("eot", v->eot_id, v->n_tokens)) ||
	    (spm && (rc = tok_check_id("unk", v->unk_id, v->n_tokens))))
		return rc;
	t = calloc(1, sizeof(*t));
	if (!t)
		return KVT_ENOMEM;
	t->n_tokens = v->n_tokens;
	t->bos_id = v->bos_id;
	t->eos_id = v->eos_id;
	t->eot_id = v->eot_id;
	t->add_bos = v->add_bos;
	t->ignore_merges = pre->ignore_merges;
	t->model = v->model;
	t->unk_id = spm ? v->unk_id : -1;
	t->add_eos = spm && v->add_eos;
	t->add_space_prefix = spm && v->add_space_prefix;
	if (spm) {
		t->scores = malloc(v->n_tokens * sizeof(float));
		if (!t->scores) {
			rc = KVT_ENOMEM;
			goto fail;
		}
		for (uint32_t i = 0; i < v->n_tokens; i++)
			t->scores[i] = v->scores ? v->scores[i] : 0.0f;
	}
	t->text_off = malloc(v->n_tokens * sizeof(size_t));
	t->text_len = malloc(v->n_tokens * sizeof(uint32_t));
	t->bytes_off = malloc(v->n_tokens * sizeof(size_t));
	t->bytes_len = malloc(v->n_tokens * sizeof(uint32_t));
	t->types = malloc(v->n_tokens);
	t->eog = calloc(v->n_tokens, 1);
	if (!t->text_off || !t->text_len || !t->bytes_off || !t->bytes_len || !t->types || !t->eog) {
		rc = KVT_ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < v->n_tokens; i++) {
		int32_t ty = v->token_types ? v->token_types[i] : KVT_TOK_NORMAL;

		t->types[i] = (int8_t)(ty >= KVT_TOK_UNDEFINED && ty <= KVT_TOK_BYTE ? ty : KVT_TOK_UNDEFINED);
	}
	tok_init_byte_map(t);
	if ((rc = tok_copy_tokens(t, v)) || (rc = tok_build_text_map(t)) ||
	    (!spm && (rc = tok_build_merges(t, v))))
		goto fail;

	/* As llama.cpp: end-of-generation texts are EOG and CONTROL whatever their stored type. */
	for (size_t i = 0; i < sizeof(tok_eog_texts) / sizeof(tok_eog_texts[0]); i++) {
		int32_t id = tok_find_text(t, tok_eog_texts[i], strlen(tok_eog_texts[i]));

		if (id >= 0) {
			t->eog[id] = 1;
			t->types[id] = KVT_TOK_CONTROL;
		}
	}
	if (t->eos_id >= 0)
		t->eog[t->eos_id] = 1;
	if (t->eot_id >= 0)
		t->eog[t->eot_id] = 1;
	for (size_t i = 0; i < sizeof(tok_marker_texts) / sizeof(tok_marker_texts[0]); i++) {
		int32_t id = tok_find_text(t, tok_marker_texts[i], strlen(tok_marker_texts[i]));

		if (id >= 0 && t->types[id] == KVT_TOK_USER_DEFINED)
			t->types[id] = KVT_TOK_CONTROL;
	}

	for (uint32_t b = 0; b < 256; b++) {
		unsigned char enc[4];
		size_t l = tok_utf8_put(t->byte_cp[b], enc);

		if (spm) {
			static const char hex[] = "0123456789ABCDEF";
			const char name[6] = { '<', '0', 'x', hex[b >> 4], hex[b & 15], '>' };
			const char one = (char)b;

			/* As llama.cpp's byte_to_token: <0xXX>, else the one-byte text; then (our choice) UNK. */
			t->byte_token[b] = tok_find_text(t, name, 6);
			if (t->byte_token[b] < 0)
				t->byte_token[b] = tok_find_text(t, &one, 1);
			if (t->byte_token[b] < 0)
				t->byte_token[b] = t->unk_id;
			continue;
		}
		t->byte_token[b] = tok_find_text(t, (const char *)enc, l);
	}
	tok_build_bytes(t);
	if ((rc = tok_build_specials(t)) || (!spm && (rc = tok_compile(t, pre, pre_name))) ||
	    (rc = tok_chat_from_template(t, v->chat_template)))
		goto fail;
	*out = t;
	return KVT_OK;
fail:
	if (rc == KVT_ENOMEM)
		KVT_LOGE("tokenizer: out of memory building a vocabulary of %u tokens", v->n_tokens);
	kvt_tok_destroy(t);
	return rc;
}

void kvt_tok_destroy(kvt_tok *t)
{
	if (!t)
		return;
	for (uint32_t i = 0; i < t->n_re; i++)
		pcre2_code_free(t->re[i]);
	pcre2_match_context_free(t->mctx);
	free(t->text_buf);
	free(t->text_off);
	free(t->text_len);
	free(t->bytes_buf);
	free(t->bytes_off);
	free(t->bytes_len);
	free(t->types);
	free(t->eog);
	free(t->text_map.slots);
	free(t->pair_map.keys);
	free(t->pair_map.ranks);
	free(t->merge_result);
	free(t->specials);
	free(t->default_system);
	free(t->scores);
	free(t);
}

uint32_t kvt_tok_n_vocab(const kvt_tok *t)
{
	return t->n_tokens;
}

int32_t kvt_tok_bos(const kvt_tok *t)
{
	return t->bos_id;
}

int32_t kvt_tok_eos(const kvt_tok *t)
{
	return t->eos_id;
}

bool kvt_tok_is_eog(const kvt_tok *t, int32_t id)
{
	return id >= 0 && (uint32_t)id < t->n_tokens && t->eog[id];
}

bool kvt_tok_is_control(const kvt_tok *t, int32_t id)
{
	return kvt_tok_is_eog(t, id) || kvt_tok_token_type(t, id) == KVT_TOK_CONTROL;
}

int kvt_tok_token_type(const kvt_tok *t, int32_t id)
{
	return id >= 0 && (uint32_t)id < t->n_tokens ? t->types[id] : KVT_TOK_UNDEFINED;
}

bool kvt_tok_add_bos(const kvt_tok *t)
{
	return t->add_bos;
}

bool kvt_tok_add_eos(const kvt_tok *t)
{
	return t->add_eos;
}

bool kvt_tok_add_space_prefix(const kvt_tok *t)
{
	return t->add_space_prefix;
}

int kvt_tok_model(const kvt_tok *t)
{
	return t->model;
}

/* ---- encoding ---- */

/* A span of the input: raw text, or one special token. */
struct tok_frag {
	size_t off;  /* byte offset in the input (raw text) */
	size_t len;  /* bytes (raw text) */
	int32_t id;  /* special token id, or -1 for raw text */
};

/* A pre-tokenizer piece: a byte range of the current fragment's buffers. */
struct tok_span {
	size_t off; /* byte offset */
	size_t len; /* bytes */
};

/* A BPE symbol: a run of the piece's bytes, linked to its live neighbours. */
struct tok_sym {
	int32_t id;   /* token id of the run's text, -1 if it is not a token */
	uint32_t off; /* first byte in the piece */
	uint32_t len; /* bytes; 0 once merged into its left neighbour */
	int32_t prev; /* index of the live symbol before, -1 at the start */
	int32_t next; /* index of the live symbol after, -1 at the end */
};

/* A candidate merge of symbols left and right; stale once either changed. */
struct tok_bigram {
	uint32_t rank;  /* merge rank (lower merges first) */
	uint32_t left;  /* left symbol index (ties: leftmost first) */
	uint32_t right; /* right symbol index */
	uint32_t len;   /* left.len + right.len when queued */
};

/* Per-call working memory; nothing in it outlives kvt_tok_encode(). */
struct tok_work {
	struct tok_frag *frags[2];        /* special-token partition, double-buffered */
	size_t cap_frags[2];              /* capacities (elements) */
	unsigned char *mbuf;              /* match text of an invalid-UTF-8 fragment */
	unsigned char *ebuf;              /* emit text of it, same length and boundaries */
	size_t cap_mbuf, cap_ebuf;        /* capacities (bytes) */
	struct tok_span *spans[2];        /* pre-tokenizer pieces, double-buffered */
	size_t cap_spans[2];              /* capacities (elements) */
	struct tok_sym *syms;             /* BPE symbols of one piece */
	size_t cap_syms;                  /* capacity (elements) */
	struct tok_bigram *heap;          /* min-heap on (rank, left) */
	size_t cap_heap;                  /* capacity (elements) */
	char *enc;                        /* byte-encoded piece (ignore_merges lookups) */
	size_t cap_enc;                   /* capacity (bytes) */
	pcre2_match_data *md;             /* this call's match data */
	int32_t *out;                     /* caller's id buffer */
	size_t cap_out;                   /* its capacity */
	size_t n_out;                     /* ids produced so far (may exceed cap_out) */
};

static void tok_emit(struct tok_work *w, int32_t id)
{
	if (w->n_out < w->cap_out)
		w->out[w->n_out] = id;
	w->n_out++;
}

static bool tok_bigram_less(const struct tok_bigram *a, const struct tok_bigram *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void tok_heap_push(struct tok_bigram *h, size_t n, struct tok_bigram b)
{
	size_t i = n;

	while (i > 0) {
		size_t parent = (i - 1) / 2;

		if (!tok_bigram_less(&b, &h[parent]))
			break;
		h[i] = h[parent];
		i = parent;
	}
	h[i] = b;
}

/* Remove the minimum of a heap of n > 0 elements into *top. */
static void tok_heap_pop(struct tok_bigram *h, size_t n, struct tok_bigram *top)
{
	struct tok_bigram last = h[n - 1];
	size_t i = 0;

	*top = h[0];
	n--;
	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= n)
			break;
		if (c + 1 < n && tok_bigram_less(&h[c + 1], &h[c]))
			c++;
		if (!tok_bigram_less(&h[c], &last))
			break;
		h[i] = h[c];
		i = c;
	}
	h[i] = last;
}

/* Queue the pair (left, right) if the vocabulary merges it. */
static void tok_try_pair(const kvt_tok *t, struct tok_work *w, size_t *n_heap, int32_t left,
			 int32_t right)
{
	struct tok_sym *s = w->syms;
	int64_t rank;

	if (left < 0 || right < 0 || s[left].id < 0 || s[right].id < 0)
		return;
	rank = tok_find_pair(t, s[left].id, s[right].id);
	if (rank < 0)
		return;
	tok_heap_push(w->heap, *n_heap, (struct tok_bigram){
		.rank = (uint32_t)rank, .left = (uint32_t)left, .right = (uint32_t)right,
		.len = s[left].len + s[right].len });
	(*n_heap)++;
}

/* Heap key of a SentencePiece score: lower keys pop first, so higher scores merge first. */
static uint32_t tok_score_rank(float score)
{
	uint32_t u;

	memcpy(&u, &score, sizeof(u));
	u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* now increasing with the float's order */
	return ~u;
}

/* SentencePiece: queue symbols left and right if their concatenation is a token. */
static void tok_spm_try_pair(const kvt_tok *t, struct tok_work *w, size_t *n_heap, int32_t left,
			     int32_t right)
{
	const struct tok_sym *s = w->syms;
	int32_t id;

	if (left < 0 || right < 0)
		return;
	/* Live neighbours are adjacent in the escaped text, so their concatenation is a slice of it. */
	id = tok_find_text(t, w->enc + s[left].off, s[left].len + s[right].len);
	if (id < 0)
		return;
	tok_heap_push(w->heap, *n_heap, (struct tok_bigram){
		.rank = tok_score_rank(t->scores[id]), .left = (uint32_t)left, .right = (uint32_t)right,
		.len = s[left].len + s[right].len });
	(*n_heap)++;
}

/*
 * The merge loop BPE and SentencePiece share, over the n_sym linked symbols in
 * w->syms: queue every adjacent pair, then merge the best pair (lowest heap key,
 * leftmost on ties) until none is left, requeueing the merged symbol with its
 * new neighbours. spm chooses the pair rule (tok_spm_try_pair: the
 * concatenation is a token, keyed by its score; else tok_try_pair: the
 * merge table's rank, whose result id the merged symbol takes).
 *
 * NOTE: every merge removes one symbol and queues at most two pairs, so the
 * heap never holds more than 2 * n_sym entries.
 */
static void tok_merge(const kvt_tok *t, struct tok_work *w, size_t n_sym, bool spm)
{
	void (*try_pair)(const kvt_tok *, struct tok_work *, size_t *, int32_t, int32_t) =
		spm ? tok_spm_try_pair : tok_try_pair;
	size_t n_heap = 0;

	for (size_t i = 1; i < n_sym; i++)
		try_pair(t, w, &n_heap, (int32_t)i - 1, (int32_t)i);
	while (n_heap) {
		struct tok_bigram b;
		struct tok_sym *l, *r;

		tok_heap_pop(w->heap, n_heap--, &b);
		l = &w->syms[b.left];
		r = &w->syms[b.right];
		if (!l->len || !r->len || l->len + r->len != b.len)
			continue; /* stale: one side merged since it was queued */
		l->len += r->len;
		if (!spm)
			l->id = t->merge_result[b.rank];
		r->len = 0;
		l->next = r->next;
		if (r->next >= 0)
			w->syms[r->next].prev = (int32_t)b.left;
		try_pair(t, w, &n_heap, l->prev, (int32_t)b.left);
		try_pair(t, w, &n_heap, (int32_t)b.left, l->next);
	}
}

/* BPE-merge one piece of emit bytes p[0..n) and emit its token ids. */
static int tok_bpe(const kvt_tok *t, struct tok_work *w, const unsigned char *p, size_t n)
{
	int rc;

	if (n == 1) {
		if (t->byte_token[p[0]] >= 0)
			tok_emit(w, t->byte_token[p[0]]);
		return KVT_OK;
	}
	if (n > INT32_MAX)
		return KVT_ENOMEM;
	if (t->ignore_merges) {
		size_t k = 0;

		if ((rc = tok_reserve((void **)&w->enc, &w->cap_enc, 2 * n, 1)))
			return rc;
		for (size_t i = 0; i < n; i++)
			k += tok_utf8_put(t->byte_cp[p[i]], (unsigned char *)w->enc + k);
		int32_t id = tok_find_text(t, w->enc, k);

		if (id >= 0) {
			tok_emit(w, id);
			return KVT_OK;
		}
	}
	if ((rc = tok_reserve((void **)&w->syms, &w->cap_syms, n, sizeof(*w->syms))) ||
	    (rc = tok_reserve((void **)&w->heap, &w->cap_heap, 2 * n, sizeof(*w->heap))))
		return rc;
	for (size_t i = 0; i < n; i++)
		w->syms[i] = (struct tok_sym){ .id = t->byte_token[p[i]], .off = (uint32_t)i, .len = 1,
						   .prev = (int32_t)i - 1,
						   .next = i + 1 < n ? (int32_t)i + 1 : -1 };
	tok_merge(t, w, n, false);
	for (int32_t i = 0; i >= 0; i = w->syms[i].next) {
		const struct tok_sym *s = &w->syms[i];

		if (s->id >= 0) {
			tok_emit(w, s->id);
			continue;
		}
		/*
		 * llama.cpp's fallback for a run that is not a token: look each byte
		 * of its encoded text up alone. Only printable ASCII encodes to one
		 * byte, so only those can be found.
		 */
		for (uint32_t j = 0; j < s->len; j++) {
			unsigned char b = p[s->off + j];

			if (b >= 0x21 && b <= 0x7e && t->byte_token[b] >= 0)
				tok_emit(w, t->byte_token[b]);
		}
	}
	return KVT_OK;
}

/* Split every span of spans[0] (n_in of them) with regex re into spans[1]. */
static int tok_split(const kvt_tok *t, struct tok_work *w, const pcre2_code *re,
		     const unsigned char *m, size_t n_in, size_t *n_out)
{
	size_t n = 0;
	int rc;

	for (size_t k = 0; k < n_in; k++) {
		const struct tok_span sp = w->spans[0][k];
		const unsigned char *subj = m + sp.off;
		size_t gap = 0, pos = 0;

		while (pos < sp.len) {
			int mrc = pcre2_match(re, subj, sp.len, pos, PCRE2_NO_UTF_CHECK, w->md, t->mctx);
			PCRE2_SIZE *ov;

			if (mrc == PCRE2_ERROR_NOMATCH)
				break;
			if (mrc < 0) {
				PCRE2_UCHAR msg[128];

				pcre2_get_error_message(mrc, msg, sizeof(msg));
				KVT_LOGE("tokenizer: pre-tokenizer regex failed on a %zu-byte piece: %s",
					 (size_t)sp.len, (const char *)msg);
				return KVT_EINVAL;
			}
			ov = pcre2_get_ovector_pointer(w->md);
			/* Room for a gap and a match. */
			if ((rc = tok_reserve((void **)&w->spans[1], &w->cap_spans[1], n + 2,
					      sizeof(struct tok_span))))
				return rc;
			if (ov[1] == ov[0]) {
				/* An empty match yields no piece; step one character (stays in the gap). */
				pos = ov[0] + 1;
				while (pos < sp.len && (subj[pos] & 0xc0) == 0x80)
					pos++;
				continue;
			}
			if (ov[0] > gap)
				w->spans[1][n++] = (struct tok_span){ sp.off + gap, ov[0] - gap };
			w->spans[1][n++] = (struct tok_span){ sp.off + ov[0], ov[1] - ov[0] };
			gap = pos = ov[1];
		}
		if (gap < sp.len) {
			if ((rc = tok_reserve((void **)&w->spans[1], &w->cap_spans[1], n + 1,
					      sizeof(struct tok_span))))
				return rc;
			w->spans[1][n++] = (struct tok_span){ sp.off + gap, sp.len - gap };
		}
	}
	*n_out = n;
	return KVT_OK;
}

/*
 * Make the match and emit texts of a raw fragment (step 2 of the file
 * comment). Valid UTF-8 is used in place.
 */
static int tok_sanitize(struct tok_work *w, const unsigned char *s, size_t n,
			const unsigned char **m, const unsigned char **e, size_t *len)
{
	size_t k = 0;
	int rc;

	if (tok_utf8_valid(s, n)) {
		*m = *e = s;
		*len = n;
		return KVT_OK;
	}
	/* Each input byte gives at most 3 output bytes (U+FFFD); a 4-byte character gives 4. */
	if (n > SIZE_MAX / 3)
		return KVT_ENOMEM;
	if ((rc = tok_reserve((void **)&w->mbuf, &w->cap_mbuf, 3 * n, 1)) ||
	    (rc = tok_reserve((void **)&w->ebuf, &w->cap_ebuf, 3 * n, 1)))
		return rc;
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t l = tok_utf8_lenient(s + i, n - i, &cp);

		if (!l || cp > 0x10ffff) {
			/* NOTE: llama.cpp throws on a code point above U+10FFFF; we use U+FFFD. */
			cp = 0xfffd;
			if (!l)
				l = 1;
		}
		i += l;
		size_t el = tok_utf8_put(cp, w->ebuf + k);
		size_t ml = tok_utf8_put(cp >= 0xd800 && cp <= 0xdfff ? 0xfffd : cp, w->mbuf + k);

		KVT_DEBUG_ASSERT(el == ml);
		(void)ml;
		k += el;
	}
	*m = w->mbuf;
	*e = w->ebuf;
	*len = k;
	return KVT_OK;
}

/* Pre-tokenize and BPE one raw-text fragment. */
static int tok_encode_text(const kvt_tok *t, struct tok_work *w, const unsigned char *s, size_t n)
{
	const unsigned char *m, *e;
	size_t len, n_spans = 1;
	int rc;

	if ((rc = tok_sanitize(w, s, n, &m, &e, &len)) ||
	    (rc = tok_reserve((void **)&w->spans[0], &w->cap_spans[0], 1, sizeof(struct tok_span))))
		return rc;
	w->spans[0][0] = (struct tok_span){ 0, len };
	for (uint32_t r = 0; r < t->n_re; r++) {
		struct tok_span *tmp;
		size_t tmp_cap;

		if ((rc = tok_split(t, w, t->re[r], m, n_spans, &n_spans)))
			return rc;
		tmp = w->spans[0];
		w->spans[0] = w->spans[1];
		w->spans[1] = tmp;
		tmp_cap = w->cap_spans[0];
		w->cap_spans[0] = w->cap_spans[1];
		w->cap_spans[1] = tmp_cap;
	}
	for (size_t k = 0; k < n_spans; k++)
		if ((rc = tok_bpe(t, w, e + w->spans[0][k].off, w->spans[0][k].len)))
			return rc;
	return KVT_OK;
}

/* SentencePiece-encode one raw fragment s[0..n) (see the file comment); prefix: add the leading space. */
static int tok_spm(const kvt_tok *t, struct tok_work *w, const unsigned char *s, size_t n, bool prefix)
{
	static const uint8_t lead_len[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
	size_t k = 0, n_sym = 0;
	int rc;

	if (n > (SIZE_MAX - 3) / 3 || n >= INT32_MAX / 3)
		return KVT_ENOMEM;
	if ((rc = tok_reserve((void **)&w->enc, &w->cap_enc, 3 * n + 3, 1)))
		return rc;
	if (prefix) {
		memcpy(w->enc, "\xe2\x96\x81", 3);
		k = 3;
	}
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(w->enc + k, "\xe2\x96\x81", 3);
			k += 3;
		} else {
			w->enc[k++] = (char)s[i];
		}
	}
	if (!k)
		return KVT_OK;
	if ((rc = tok_reserve((void **)&w->syms, &w->cap_syms, k, sizeof(*w->syms))) ||
	    (rc = tok_reserve((void **)&w->heap, &w->cap_heap, 2 * k, sizeof(*w->heap))))
		return rc;
	for (size_t i = 0; i < k; n_sym++) {
		size_t l = lead_len[(unsigned char)w->enc[i] >> 4];

		if (l > k - i)
			l = k - i;
		w->syms[n_sym] = (struct tok_sym){ .id = -1, .off = (uint32_t)i, .len = (uint32_t)l,
						       .prev = (int32_t)n_sym - 1, .next = (int32_t)n_sym + 1 };
		i += l;
	}
	w->syms[n_sym - 1].next = -1;
	tok_merge(t, w, n_sym, true);
	for (int32_t i = 0; i >= 0; i = w->syms[i].next) {
		const struct tok_sym *y = &w->syms[i];
		int32_t id = tok_find_text(t, w->enc + y->off, y->len);

		if (id >= 0) {
			tok_emit(w, id);
			continue;
		}
		for (uint32_t j = 0; j < y->len; j++) {
			int32_t bt = t->byte_token[(unsigned char)w->enc[y->off + j]];

			if (bt >= 0)
				tok_emit(w, bt);
		}
	}
	return KVT_OK;
}

/* Step 1: partition the input into raw fragments and special tokens. */
static int tok_partition(const kvt_tok *t, struct tok_work *w, const char *text, size_t len,
			 bool parse_special, size_t *n_frags)
{
	size_t n = 1;
	int rc;
	/*
	 * Which bytes, and which pairs of adjacent bytes, the input holds. Every
	 * fragment is a substring of the input, so a special whose first byte or
	 * first two bytes never occur there cannot split anything and is skipped
	 * unscanned (Gemma 3 has 6414 specials, most of them <unusedN>).
	 */
	uint64_t seen1[256 / 64] = { 0 }, seen2[65536 / 64] = { 0 };
	const unsigned char *u = (const unsigned char *)text;

	for (size_t i = 0; i < len; i++) {
		seen1[u[i] >> 6] |= 1ull << (u[i] & 63);
		if (i + 1 < len) {
			unsigned p = (unsigned)u[i] << 8 | u[i + 1];

			seen2[p >> 6] |= 1ull << (p & 63);
		}
	}
	if ((rc = tok_reserve((void **)&w->frags[0], &w->cap_frags[0], 1, sizeof(struct tok_frag))))
		return rc;
	w->frags[0][0] = (struct tok_frag){ 0, len, -1 };
	for (uint32_t k = 0; k < t->n_specials; k++) {
		int32_t id = t->specials[k];
		const char *stext = tok_text(t, id);
		const unsigned char *us = (const unsigned char *)stext;
		size_t slen = t->text_len[id], m = 0;
		struct tok_frag *tmp;
		size_t tmp_cap;

		if (!parse_special && t->types[id] != KVT_TOK_USER_DEFINED)
			continue;
		if (slen > len || !(seen1[us[0] >> 6] >> (us[0] & 63) & 1))
			continue;
		if (slen >= 2) {
			unsigned p = (unsigned)us[0] << 8 | us[1];

			if (!(seen2[p >> 6] >> (p & 63) & 1))
				continue;
		}
		for (size_t i = 0; i < n; i++) {
			struct tok_frag f = w->frags[0][i];

			while (f.id < 0 && f.len >= slen) {
				const char *hit = memmem(text + f.off, f.len, stext, slen);
				size_t left;

				if (!hit)
					break;
				left = (size_t)(hit - (text + f.off));
				if ((rc = tok_reserve((void **)&w->frags[1], &w->cap_frags[1], m + 2,
						      sizeof(struct tok_frag))))
					return rc;
				if (left)
					w->frags[1][m++] = (struct tok_frag){ f.off, left, -1 };
				w->frags[1][m++] = (struct tok_frag){ 0, 0, id };
				f.off += left + slen;
				f.len -= left + slen;
			}
			if (f.id >= 0 || f.len) {
				if ((rc = tok_reserve((void **)&w->frags[1], &w->cap_frags[1], m + 1,
						      sizeof(struct tok_frag))))
					return rc;
				w->frags[1][m++] = f;
			}
		}
		n = m;
		tmp = w->frags[0];
		w->frags[0] = w->frags[1];
		w->frags[1] = tmp;
		tmp_cap = w->cap_frags[0];
		w->cap_frags[0] = w->cap_frags[1];
		w->cap_frags[1] = tmp_cap;
	}
	*n_frags = n;
	return KVT_OK;
}

int kvt_tok_encode(const kvt_tok *t, const char *text, size_t len, bool parse_special,
		   int32_t *out, size_t cap, size_t *n_out)
{
	struct tok_work w = { .out = out, .cap_out = cap };
	size_t n_frags = 0;
	int rc = KVT_OK;

	*n_out = 0;
	if (!len)
		return KVT_OK;
	if (!text) {
		KVT_LOGE("tokenizer: encode: NULL text of %zu bytes", len);
		return KVT_EINVAL;
	}
	w.md = pcre2_match_data_create(t->max_match_pairs ? t->max_match_pairs : 1, NULL);
	if (!w.md) {
		rc = KVT_ENOMEM;
		goto done;
	}
	if ((rc = tok_partition(t, &w, text, len, parse_special, &n_frags)))
		goto done;
	bool after_special = true; /* SentencePiece: the input's start counts as after a special token */

	for (size_t i = 0; i < n_frags; i++) {
		const struct tok_frag f = w.frags[0][i];

		if (f.id >= 0) {
			tok_emit(&w, f.id);
			after_special = true;
			continue;
		}
		if (t->model == KVT_TOK_MODEL_SPM)
			rc = tok_spm(t, &w, (const unsigned char *)text + f.off, f.len,
				     t->add_space_prefix && after_special);
		else
			rc = tok_encode_text(t, &w, (const unsigned char *)text + f.off, f.len);
		if (rc)
			goto done;
		after_special = false;
	}
done:
	if (rc == KVT_ENOMEM)
		KVT_LOGE("tokenizer: out of memory encoding %zu bytes", len);
	pcre2_match_data_free(w.md);
	free(w.frags[0]);
	free(w.frags[1]);
	free(w.mbuf);
	free(w.ebuf);
	free(w.spans[0]);
	free(w.spans[1]);
	free(w.syms);
	free(w.heap);
	free(w.enc);
	if (rc)
		return rc;
	*n_out = w.n_out;
	return w.n_out > cap ? KVT_EFULL : KVT_OK;
}

/* ---- decoding ---- */

int kvt_tok_token_bytes(const kvt_tok *t, int32_t id, const char **bytes, size_t *len)
{
	if (id < 0 || (uint32_t)id >= t->n_tokens) {
		KVT_LOGE("tokenizer: token id %d is out of range (vocabulary of %u)", id, t->n_tokens);
		return KVT_EINVAL;
	}
	*bytes = t->bytes_buf + t->bytes_off[id];
	*len = t->bytes_len[id];
	return KVT_OK;
}

void kvt_tok_stream_init(kvt_tok_stream *s)
{
	memset(s, 0, sizeof(*s));
}

/* Length of the UTF-8 character a lead byte starts; 0 if it cannot start one. */
static size_t tok_utf8_lead_len(unsigned char b)
{
	if (b < 0x80)
		return 1;
	if (b >= 0xc2 && b <= 0xdf)
		return 2;
	if (b >= 0xe0 && b <= 0xef)
		return 3;
	if (b >= 0xf0 && b <= 0xf4)
		return 4;
	return 0;
}

/* Whether b may follow the held-back bytes p[0..n) of a character. */
static bool tok_utf8_continues(const unsigned char *p, size_t n, unsigned char b)
{
	if ((b & 0xc0) != 0x80)
		return false;
	if (n == 1) {
		if ((p[0] == 0xe0 && b < 0xa0) || (p[0] == 0xed && b > 0x9f) ||
		    (p[0] == 0xf0 && b < 0x90) || (p[0] == 0xf4 && b > 0x8f))
			return false;
	}
	return true;
}

static bool tok_put_bytes(char *out, size_t cap, size_t *k, const void *b, size_t n)
{
	if (cap - *k < n)
		return false;
	memcpy(out + *k, b, n);
	*k += n;
	return true;
}

int kvt_tok_stream_push(const kvt_tok *t, kvt_tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out)
{
	static const unsigned char fffd[3] = { 0xef, 0xbf, 0xbd };
	kvt_tok_stream st = *s;
	const unsigned char *b;
	size_t n, k = 0;
	int rc;

	if ((rc = kvt_tok_token_bytes(t, id, (const char **)&b, &n)))
		return rc;
	/* As llama.cpp's detokenize: only the first token may lose its space, whatever it holds. */
	if (st.strip_space && n && b[0] == ' ') {
		b++;
		n--;
	}
	st.strip_space = false;
	for (size_t i = 0; i < n;) {
		unsigned char c = b[i];

		if (st.n_pending) {
			if (tok_utf8_continues(st.pending, st.n_pending, c)) {
				st.pending[st.n_pending++] = c;
				i++;
				if (st.n_pending == tok_utf8_lead_len(st.pending[0])) {
					if (!tok_put_bytes(out, cap, &k, st.pending, st.n_pending))
						return KVT_EFULL;
					st.n_pending = 0;
				}
				continue;
			}
			/* A truncated character: one U+FFFD, then c starts afresh. */
			if (!tok_put_bytes(out, cap, &k, fffd, 3))
				return KVT_EFULL;
			st.n_pending = 0;
			continue;
		}
		size_t need = tok_utf8_lead_len(c);

		i++;
		if (need == 1) {
			if (!tok_put_bytes(out, cap, &k, &c, 1))
				return KVT_EFULL;
		} else if (need == 0) {
			if (!tok_put_bytes(out, cap, &k, fffd, 3))
				return KVT_EFULL;
		} else {
			st.pending[0] = c;
			st.n_pending = 1;
		}
	}
	*s = st;
	*n_out = k;
	return KVT_OK;
}

int kvt_tok_stream_flush(kvt_tok_stream *s, char *out, size_t cap, size_t *n_out)
{
	if (!s->n_pending) {
		*n_out = 0;
		return KVT_OK;
	}
	if (cap < 3)
		return KVT_EFULL;
	memcpy(out, "\xef\xbf\xbd", 3);
	s->n_pending = 0;
	*n_out = 3;
	return KVT_OK;
}

/* ---- GGUF ---- */

static char *tok_strndup(const char *s, size_t n)
{
	char *d = malloc(n + 1);

	if (d) {
		memcpy(d, s, n);
		d[n] = '\0';
	}
	return d;
}

/* An optional token id key: *id keeps its default when absent, -1 when out of range (warned). */
static int tok_gguf_id(const struct kvt_gguf *g, const char *key, uint32_t n_tokens, int32_t *id)
{
	uint32_t v;
	int rc = kvt_gguf_get_u32(g, key, &v);

	if (rc == KVT_ENOTFOUND)
		return KVT_OK;
	if (rc)
		return rc;
	if (v >= n_tokens) {
		KVT_LOGW("%s: %s = %u is out of range (vocabulary of %u); ignored", kvt_gguf_path(g), key, v,
			 n_tokens);
		*id = -1;
		return KVT_OK;
	}
	*id = (int32_t)v;
	return KVT_OK;
}

int kvt_tok_create_from_gguf(const struct kvt_gguf *g, kvt_tok **out)
{
	const char *path = kvt_gguf_path(g);
	kvt_gguf_str model, s;
	const kvt_gguf_kv *toks, *types = NULL, *merges = NULL, *scores = NULL;
	kvt_tok_vocab v = { .bos_id = -1, .eos_id = -1, .eot_id = -1, .unk_id = -1 };
	float *score_arr = NULL;
	bool spm;
	const char **tok_ptr = NULL, **merge_ptr = NULL;
	size_t *tok_len = NULL, *merge_len = NULL;
	int32_t *type_arr = NULL;
	char *pre = NULL, *tmpl = NULL;
	const struct tok_pre *pre_info;
	int rc;

	rc = kvt_gguf_get_str(g, "tokenizer.ggml.model", &model);
	if (rc == KVT_ENOTFOUND) {
		KVT_LOGE("%s: no tokenizer.ggml.model: the file has no tokenizer", path);
		return KVT_EUNSUPPORTED;
	}
	if (rc)
		return rc;
	spm = model.len == 5 && memcmp(model.ptr, "llama", 5) == 0;
	if (!spm && (model.len != 4 || memcmp(model.ptr, "gpt2", 4) != 0)) {
		KVT_LOGE("%s: tokenizer model '%.*s' is not supported (gpt2: BPE, llama: SentencePiece)", path,
			 (int)(model.len > 64 ? 64 : model.len), model.ptr);
		return KVT_EUNSUPPORTED;
	}
	if ((rc = kvt_gguf_get_arr(g, "tokenizer.ggml.tokens", KVT_GGUF_STRING, &toks)) ||
	    (!spm && (rc = kvt_gguf_get_arr(g, "tokenizer.ggml.merges", KVT_GGUF_STRING, &merges)))) {
		if (rc == KVT_ENOTFOUND) {
			KVT_LOGE("%s: %s tokenizer without tokenizer.ggml.tokens%s", path, spm ? "llama" : "gpt2",
				 spm ? "" : " or .merges");
			rc = KVT_ECORRUPT;
		}
		return rc;
	}
	if (toks->n == 0 || toks->n > INT32_MAX || (merges && merges->n > UINT32_MAX)) {
		KVT_LOGE("%s: tokenizer of %llu tokens / %llu merges is not usable", path,
			 (unsigned long long)toks->n, merges ? (unsigned long long)merges->n : 0ULL);
		return KVT_ECORRUPT;
	}
	if (spm) {
		rc = kvt_gguf_get_arr(g, "tokenizer.ggml.scores", KVT_GGUF_FLOAT32, &scores);
		if (rc && rc != KVT_ENOTFOUND)
			return rc;
		if (!rc && scores->n != toks->n) {
			KVT_LOGE("%s: tokenizer.ggml.scores has %llu entries for %llu tokens", path,
				 (unsigned long long)scores->n, (unsigned long long)toks->n);
			return KVT_ECORRUPT;
		}
		if (rc == KVT_ENOTFOUND)
			scores = NULL; /* all 0, as llama.cpp */
	}
	rc = kvt_gguf_get_arr(g, "tokenizer.ggml.token_type", KVT_GGUF_INT32, &types);
	if (rc && rc != KVT_ENOTFOUND)
		return rc;
	if (!rc && types->n != toks->n) {
		KVT_LOGE("%s: tokenizer.ggml.token_type has %llu entries for %llu tokens", path,
			 (unsigned long long)types->n, (unsigned long long)toks->n);
		return KVT_ECORRUPT;
	}
	v.n_tokens = (uint32_t)toks->n;
	v.n_merges = merges ? (uint32_t)merges->n : 0;
	v.model = spm ? KVT_TOK_MODEL_SPM : KVT_TOK_MODEL_BPE;
	tok_ptr = malloc(v.n_tokens * sizeof(*tok_ptr));
	tok_len = malloc(v.n_tokens * sizeof(*tok_len));
	merge_ptr = malloc((v.n_merges ? v.n_merges : 1) * sizeof(*merge_ptr));
	merge_len = malloc((v.n_merges ? v.n_merges : 1) * sizeof(*merge_len));
	type_arr = types ? malloc(v.n_tokens * sizeof(*type_arr)) : NULL;
	score_arr = scores ? malloc(v.n_tokens * sizeof(*score_arr)) : NULL;
	if (!tok_ptr || !tok_len || !merge_ptr || !merge_len || (types && !type_arr) || (scores && !score_arr)) {
		KVT_LOGE("%s: out of memory reading a tokenizer of %u tokens", path, v.n_tokens);
		rc = KVT_ENOMEM;
		goto done;
	}
	for (uint32_t i = 0; i < v.n_tokens; i++) {
		tok_ptr[i] = toks->v.arr.strs[i].ptr;
		tok_len[i] = (size_t)toks->v.arr.strs[i].len;
		if (types)
			type_arr[i] = (int32_t)kvt_gguf_arr_i64(types, i);
		if (scores)
			score_arr[i] = (float)kvt_gguf_arr_f64(scores, i);
	}
	v.scores = score_arr;
	for (uint32_t i = 0; i < v.n_merges; i++) {
		merge_ptr[i] = merges->v.arr.strs[i].ptr;
		merge_len[i] = (size_t)merges->v.arr.strs[i].len;
	}
	v.tokens = tok_ptr;
	v.token_lens = tok_len;
	v.token_types = type_arr;
	v.merges = merge_ptr;
	v.merge_lens = merge_len;

	rc = kvt_gguf_get_str(g, "tokenizer.ggml.pre", &s);
	if (rc == KVT_OK) {
		if (!(pre = tok_strndup(s.ptr, (size_t)s.len))) {
			KVT_LOGE("%s: out of memory reading tokenizer.ggml.pre", path);
			rc = KVT_ENOMEM;
			goto done;
		}
		v.pre = pre;
	} else if (rc != KVT_ENOTFOUND) {
		goto done;
	}
	pre_info = tok_pre_find(v.pre ? v.pre : "default");
	v.add_bos = spm || (pre_info && pre_info->add_bos);
	/* llama.cpp's SentencePiece defaults, each overridden by its key below when present. */
	v.add_space_prefix = spm;
	if (spm) {
		v.bos_id = 1 < v.n_tokens ? 1 : -1;
		v.eos_id = 2 < v.n_tokens ? 2 : -1;
		v.unk_id = 0;
	}
	if (((rc = kvt_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &v.add_bos)) && rc != KVT_ENOTFOUND) ||
	    ((rc = kvt_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &v.add_eos)) && rc != KVT_ENOTFOUND) ||
	    ((rc = kvt_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &v.add_space_prefix)) &&
	     rc != KVT_ENOTFOUND))
		goto done;
	if ((rc = tok_gguf_id(g, "tokenizer.ggml.bos_token_id", v.n_tokens, &v.bos_id)) ||
	    (rc = tok_gguf_id(g, "tokenizer.ggml.eos_token_id", v.n_tokens, &v.eos_id)) ||
	    (rc = tok_gguf_id(g, "tokenizer.ggml.eot_token_id", v.n_tokens, &v.eot_id)) ||
	    (rc = tok_gguf_id(g, "tokenizer.ggml.unknown_token_id", v.n_tokens, &v.unk_id)))
		goto done;
	if (v.eot_id < 0) {
		for (uint32_t i = 0; i < v.n_tokens && v.eot_id < 0; i++)
			if ((tok_len[i] == 10 && memcmp(tok_ptr[i], "<|im_end|>", 10) == 0) ||
			    (tok_len[i] == 10 && memcmp(tok_ptr[i], "<|eot_id|>", 10) == 0) ||
			    (tok_len[i] == 13 && memcmp(tok_ptr[i], "<end_of_turn>", 13) == 0))
				v.eot_id = (int32_t)i;
	}
	rc = kvt_gguf_get_str(g, "tokenizer.chat_template", &s);
	if (rc == KVT_OK) {
		if (!(tmpl = tok_strndup(s.ptr, (size_t)s.len))) {
			KVT_LOGE("%s: out of memory reading tokenizer.chat_template", path);
			rc = KVT_ENOMEM;
			goto done;
		}
		v.chat_template = tmpl;
	} else if (rc != KVT_ENOTFOUND) {
		goto done;
	}
	rc = kvt_tok_create(&v, out);
	if (rc == KVT_OK && !v.chat_template)
		tok_chat_from_arch(*out, g);
done:
	free(tok_ptr);
	free(tok_len);
	free(merge_ptr);
	free(merge_len);
	free(type_arr);
	free(score_arr);
	free(pre);
	free(tmpl);
	return rc;
}
