/*
 * engine/model/tokenizer.h — GPT-2 byte-level BPE, as stored in a GGUF.
 *
 * Encoding: special tokens (CONTROL, USER_DEFINED and UNKNOWN token types,
 * longest text first) are split out of the raw text first when parse_special
 * is set (USER_DEFINED ones always, as llama.cpp does); each remaining span is
 * split by the model's pre-tokenizer regexes (chosen by tokenizer.ggml.pre,
 * run with PCRE2 in UTF + UCP mode, each regex applied to the pieces the
 * previous one produced), each piece is mapped byte -> printable unicode
 * (GPT-2's bytes_to_unicode) and merged by BPE rank. The result matches
 * llama.cpp's tokenization of the same GGUF (checked by tests against
 * reference vectors produced with llama.cpp).
 *
 * Decoding maps a token back to raw bytes. A streaming decoder holds back an
 * incomplete UTF-8 sequence so streamed text never splits a character.
 *
 * A kvt_tok is immutable after creation and safe to share between threads.
 */
#ifndef KVT_TOKENIZER_H
#define KVT_TOKENIZER_H

#include "kvt.h"

struct kvt_gguf;

/* Token types as numbered by llama.cpp / GGUF tokenizer.ggml.token_type. */
enum kvt_tok_type {
	KVT_TOK_UNDEFINED = 0,
	KVT_TOK_NORMAL = 1,
	KVT_TOK_UNKNOWN = 2,
	KVT_TOK_CONTROL = 3,
	KVT_TOK_USER_DEFINED = 4,
	KVT_TOK_UNUSED = 5,
	KVT_TOK_BYTE = 6,
};

/* A vocabulary as plain arrays (borrowed for the duration of kvt_tok_create). */
typedef struct kvt_tok_vocab {
	uint32_t n_tokens;            /* vocabulary size */
	const char *const *tokens;    /* [n_tokens] token text, GPT-2 byte-encoded */
	const size_t *token_lens;     /* [n_tokens] byte lengths (tokens need not be NUL-terminated) */
	const int32_t *token_types;   /* [n_tokens] enum kvt_tok_type; NULL: all NORMAL */
	uint32_t n_merges;            /* merge rules, rank = index */
	const char *const *merges;    /* [n_merges] "left right" (one space) */
	const size_t *merge_lens;     /* [n_merges] byte lengths */
	const char *pre;              /* pre-tokenizer name (tokenizer.ggml.pre), NULL: "default" */
	int32_t bos_id;               /* -1 if none */
	int32_t eos_id;               /* -1 if none */
	int32_t eot_id;               /* end-of-turn (e.g. <|im_end|>), -1 if none */
	bool add_bos;                 /* tokenizer.ggml.add_bos_token */
	const char *chat_template;    /* tokenizer.chat_template, NULL if none */
} kvt_tok_vocab;

typedef struct kvt_tok kvt_tok;

/*
 * Build a tokenizer. KVT_EUNSUPPORTED (logged) for an unknown pre-tokenizer
 * name; KVT_ECORRUPT for a merge that names a token not in the vocabulary (or
 * has no "left right" form), two tokens with the same text, or a token id out
 * of range; KVT_EINVAL for an empty vocabulary; KVT_ENOMEM. Every failure is
 * logged. Tokens whose text llama.cpp treats as end of generation
 * (<|im_end|>, <|endoftext|>, <|eot_id|>, ...) become CONTROL and EOG.
 */
int kvt_tok_create(const kvt_tok_vocab *v, kvt_tok **out);
/*
 * Build from a GGUF's tokenizer.ggml.* keys. tokenizer.ggml.model must be
 * "gpt2" (else KVT_EUNSUPPORTED, logged with the model name found).
 */
int kvt_tok_create_from_gguf(const struct kvt_gguf *g, kvt_tok **out);
void kvt_tok_destroy(kvt_tok *t); /* NULL is a no-op */

uint32_t kvt_tok_n_vocab(const kvt_tok *t);
int32_t kvt_tok_bos(const kvt_tok *t);
int32_t kvt_tok_eos(const kvt_tok *t);
/* True for EOS, EOT and any other end-of-generation control token. */
bool kvt_tok_is_eog(const kvt_tok *t, int32_t id);
bool kvt_tok_add_bos(const kvt_tok *t);
/* enum kvt_tok_type of id after the EOG overrides (KVT_TOK_UNDEFINED out of range). */
int kvt_tok_token_type(const kvt_tok *t, int32_t id);

/*
 * Tokenize len bytes of text. With parse_special, CONTROL/USER_DEFINED token
 * texts found in the input become those tokens; otherwise CONTROL texts are
 * ordinary text (USER_DEFINED ones are still split out, as in llama.cpp).
 * BOS is never added here (callers decide via kvt_tok_add_bos()).
 * Writes at most cap ids to out; *n_out is always set to the number of ids the
 * full encoding has, and KVT_EFULL is returned when it exceeds cap.
 * Invalid UTF-8 input is never rejected: as in llama.cpp, each byte that does
 * not start a sequence becomes U+FFFD before pre-tokenization, so decoding
 * gives back valid UTF-8 input exactly but not invalid bytes.
 */
int kvt_tok_encode(const kvt_tok *t, const char *text, size_t len, bool parse_special,
		   int32_t *out, size_t cap, size_t *n_out);

/* The raw bytes a token stands for (specials: their text). KVT_EINVAL if id is out of range. */
int kvt_tok_token_bytes(const kvt_tok *t, int32_t id, const char **bytes, size_t *len);

/* Streaming decode: feed ids, get only complete UTF-8 characters out. */
typedef struct kvt_tok_stream {
	unsigned char pending[8]; /* bytes of an incomplete UTF-8 character held back */
	size_t n_pending;          /* how many */
} kvt_tok_stream;

void kvt_tok_stream_init(kvt_tok_stream *s);
/*
 * Append the text of token id. Writes up to cap bytes to out and sets *n_out.
 * A byte that cannot start a character, and a held-back character cut short,
 * each come out as one U+FFFD. cap >= the token's byte length + 8 is enough
 * for valid UTF-8; cap >= 3 * length + 3 is always enough. KVT_EFULL when out
 * is too small (nothing consumed, s unchanged); KVT_EINVAL for a bad id.
 */
int kvt_tok_stream_push(const kvt_tok *t, kvt_tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out);
/* At the end of a stream: an incomplete character held back comes out as one U+FFFD (cap >= 3). */
int kvt_tok_stream_flush(kvt_tok_stream *s, char *out, size_t cap, size_t *n_out);

/* Chat formatting with the model's template. */
typedef struct kvt_chat_msg {
	const char *role;    /* "system", "user", "assistant" */
	const char *content; /* UTF-8 text */
	size_t content_len;  /* bytes of content, which may hold NUL bytes; 0: strlen(content) */
} kvt_chat_msg;

/*
 * Format messages into a prompt string (malloc'd, NUL-terminated, caller
 * frees) following the GGUF's chat template. Recognised templates: ChatML
 * (<|im_start|>role\ncontent<|im_end|>\n), including SmolLM2's default system
 * prompt when the first message is not a system message (the template text
 * is read for it), and add_generation_prompt appends "<|im_start|>assistant\n".
 * KVT_EUNSUPPORTED (logged) for a template we cannot interpret;
 * KVT_EINVAL for a NULL role/content.
 */
int kvt_tok_chat_format(const kvt_tok *t, const kvt_chat_msg *msgs, size_t n_msgs,
			bool add_generation_prompt, char **out);

/*
 * The same conversation as token ids (malloc'd, caller frees; no BOS): the
 * template's markers become their token ids, and all other text — roles and
 * every message's content — is encoded without parsing special tokens, so
 * "<|im_end|>" inside a message is text, never the control token (a user
 * cannot close their turn and open a forged one). Text without special tokens
 * encodes exactly as kvt_tok_encode(parse_special) of kvt_tok_chat_format's
 * string. Errors as kvt_tok_chat_format; KVT_EUNSUPPORTED (logged) when a
 * marker is not in the vocabulary.
 */
int kvt_tok_chat_encode(const kvt_tok *t, const kvt_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
			int32_t **ids, size_t *n_ids);

#endif
