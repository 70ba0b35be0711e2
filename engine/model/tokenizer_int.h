/*
 * engine/model/tokenizer_int.h — internals shared by the tokenizer's files
 * (not part of the public API):
 *   tokenizer.c      vocabularies, encoding and decoding (BPE, SentencePiece);
 *   chat_template.c  the chat template families: detection, formatting and
 *                    encoding a conversation.
 *
 * struct kvt_tok is defined here so that chat_template.c can read and set the
 * chat fields it owns (chat, chat_unknown, default_system); every other field
 * belongs to tokenizer.c, which creates and destroys the whole object. The
 * helpers below are the few each file lends the other; they have no kvt_
 * prefix because nothing outside these two files may call them.
 */
#ifndef KVT_TOKENIZER_INT_H
#define KVT_TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"

#define KVT_TOK_MAX_REGEX 4

/* Open-addressing map from token text to id; slots hold ids, -1 is empty. */
struct tok_text_map {
	int32_t *slots; /* [mask + 1] token id or -1 */
	uint64_t mask;  /* capacity - 1, capacity a power of two >= 2 * n_tokens */
};

/* Open-addressing map from (left id, right id) to merge rank. */
struct tok_pair_map {
	uint64_t *keys;  /* [mask + 1] (left << 32 | right), UINT64_MAX is empty */
	uint32_t *ranks; /* [mask + 1] merge rank of the key in the same slot */
	uint64_t mask;   /* capacity - 1, a power of two >= 2 * n_merges */
};

struct kvt_tok {
	uint32_t n_tokens;            /* vocabulary size (<= INT32_MAX) */
	char *text_buf;               /* every token text, each followed by a NUL */
	size_t *text_off;             /* [n_tokens] offset of token i's text in text_buf */
	uint32_t *text_len;           /* [n_tokens] bytes of token i's text */
	char *bytes_buf;              /* every token's decoded raw bytes */
	size_t *bytes_off;            /* [n_tokens] offset of token i's raw bytes in bytes_buf */
	uint32_t *bytes_len;          /* [n_tokens] length of token i's raw bytes */
	int8_t *types;                /* [n_tokens] enum kvt_tok_type after EOG overrides */
	uint8_t *eog;                 /* [n_tokens] 1 for end-of-generation tokens */
	struct tok_text_map text_map; /* token text -> id */
	struct tok_pair_map pair_map; /* (left, right) -> merge rank */
	uint32_t n_merges;            /* merge rules */
	int32_t *merge_result;        /* [n_merges] id of left+right, -1 if not a token */
	int32_t byte_token[256];      /* id of the token for one raw byte, -1 if none */
	uint32_t byte_cp[256];        /* bytes_to_unicode: raw byte -> code point */
	int16_t cp_byte[0x144];       /* inverse: code point (< 0x144) -> byte, -1 if none */
	int32_t *specials;            /* [n_specials] CONTROL/USER_DEFINED/UNKNOWN ids, longest first */
	uint32_t n_specials;          /* special tokens with non-empty text */
	pcre2_code *re[KVT_TOK_MAX_REGEX]; /* compiled pre-tokenizer regexes */
	pcre2_match_context *mctx;    /* shared, read-only: the match limit */
	uint32_t n_re;                /* how many */
	uint32_t max_match_pairs;     /* ovector pairs the largest regex needs */
	bool ignore_merges;           /* llama3: a piece that is a token is emitted whole */
	int32_t bos_id;               /* -1 if none */
	int32_t eos_id;               /* -1 if none */
	int32_t eot_id;               /* -1 if none */
	bool add_bos;                 /* callers should prepend BOS */
	int model;                    /* enum kvt_tok_model */
	float *scores;                /* [n_tokens] SentencePiece merge scores (NULL for BPE) */
	int32_t unk_id;               /* SentencePiece: a byte with no token becomes this; -1 if none */
	bool add_eos;                 /* SentencePiece: tokenizer.ggml.add_eos_token */
	bool add_space_prefix;        /* SentencePiece: a space before a fragment that opens the text */
	int chat;                     /* enum kvt_tok_chat: the template family chat formatting uses */
	bool chat_unknown;            /* a template was stored but none of the families matched it */
	char *default_system;         /* ChatML default system prompt from the template, or NULL */
};

/* ---- tokenizer.c ---- */

/* The id of the token whose text is s[0..n), or -1. */
int32_t tok_find_text(const kvt_tok *t, const char *s, size_t n);
/* Grow *p (elements of elem bytes) to hold at least need elements: KVT_OK or KVT_ENOMEM (not logged). */
int tok_reserve(void **p, size_t *cap, size_t need, size_t elem);

/* ---- chat_template.c ---- */

/*
 * Set t's chat family from its stored template (NULL: none), and, for ChatML,
 * the default system prompt the template inserts. At creation; KVT_ENOMEM.
 */
int tok_chat_from_template(kvt_tok *t, const char *tmpl);
/*
 * A GGUF without tokenizer.chat_template: choose the family by
 * general.architecture (gemma* -> gemma, qwen2/qwen3 -> chatml; logged), else
 * leave t's as it is.
 */
void tok_chat_from_arch(kvt_tok *t, const struct kvt_gguf *g);

#endif
