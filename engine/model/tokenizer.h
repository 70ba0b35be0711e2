/*
 * engine/model/tokenizer.h — the GGUF vocabularies: GPT-2 byte-level BPE
 * (tokenizer.ggml.model = gpt2) and SentencePiece (= llama).
 *
 * Encoding: special tokens (CONTROL, USER_DEFINED and UNKNOWN token types,
 * longest text first) are split out of the raw text first when parse_special
 * is set (USER_DEFINED ones always, as llama.cpp does, except the image and
 * audio markers such as Gemma's <start_of_image>, which kvtier makes CONTROL
 * so that message text holding them stays text); each remaining span is
 * split by the model's pre-tokenizer regexes (chosen by tokenizer.ggml.pre,
 * run with PCRE2 in UTF + UCP mode, each regex applied to the pieces the
 * previous one produced), each piece is mapped byte -> printable unicode
 * (GPT-2's bytes_to_unicode) and merged by BPE rank. The result matches
 * llama.cpp's tokenization of the same GGUF (checked by tests against
 * reference vectors produced with llama.cpp).
 *
 * SentencePiece (KVT_TOK_MODEL_SPM) shares step one (specials); each raw
 * fragment then gets a leading space when add_space_prefix is set and it is the
 * first fragment or follows a special token, every space becomes U+2581, and
 * the text is merged by token score (highest first, leftmost on ties) from one
 * symbol per UTF-8 character; a symbol that is not a token becomes its bytes'
 * <0xXX> byte-fallback tokens. As llama.cpp's SPM tokenizer does it.
 *
 * Decoding maps a token back to raw bytes (SentencePiece: U+2581 -> space,
 * <0xXX> -> that byte). A streaming decoder holds back an
 * incomplete UTF-8 sequence so streamed text never splits a character.
 *
 * A kvt_tok is immutable after creation and safe to share between threads.
 *
 * Chat formatting with the model's template is declared in chat_template.h,
 * which this header includes, so every caller of the tokenizer has it.
 */
#ifndef KVT_TOKENIZER_H
#define KVT_TOKENIZER_H

#include "kvt.h"

#include "chat_template.h" /* the chat API: the tokenizer's callers see it through this header */

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

/* Which algorithm a vocabulary uses (tokenizer.ggml.model). */
enum kvt_tok_model {
	KVT_TOK_MODEL_BPE = 0, /* "gpt2": byte-level BPE with merge ranks and pre-tokenizer regexes */
	KVT_TOK_MODEL_SPM = 1, /* "llama": SentencePiece, merges by score, byte fallback */
};

/* A vocabulary as plain arrays (borrowed for the duration of kvt_tok_create). */
typedef struct kvt_tok_vocab {
	int model;                    /* enum kvt_tok_model (0, BPE, when left zero) */
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
	/* SentencePiece only (ignored for BPE): */
	const float *scores;          /* [n_tokens] tokenizer.ggml.scores; NULL: all 0 */
	int32_t unk_id;               /* used for a byte with no <0xXX> token; -1 if none */
	bool add_eos;                 /* tokenizer.ggml.add_eos_token */
	bool add_space_prefix;        /* tokenizer.ggml.add_space_prefix */
} kvt_tok_vocab;

typedef struct kvt_tok kvt_tok;

/*
 * Build a tokenizer. KVT_EUNSUPPORTED (logged) for an unknown pre-tokenizer
 * name; KVT_ECORRUPT for a merge that names a token not in the vocabulary (or
 * has no "left right" form), two tokens with the same text, or a token id out
 * of range; KVT_EINVAL for an empty vocabulary; KVT_ENOMEM. Every failure is
 * logged. Tokens whose text llama.cpp treats as end of generation
 * (<|im_end|>, <|endoftext|>, <|eot_id|>, ...) become CONTROL and EOG; the
 * USER_DEFINED image and audio markers (<start_of_image>, <end_of_image>,
 * [multimodal], ...) become CONTROL.
 */
int kvt_tok_create(const kvt_tok_vocab *v, kvt_tok **out);
/*
 * Build from a GGUF's tokenizer.ggml.* keys. tokenizer.ggml.model must be
 * "gpt2" or "llama" (else KVT_EUNSUPPORTED, logged with the model name found).
 * For "llama" the defaults are llama.cpp's: BOS 1, EOS 2, UNK 0, add_bos on,
 * add_eos off, add_space_prefix on, each overridden by its key when present.
 */
int kvt_tok_create_from_gguf(const struct kvt_gguf *g, kvt_tok **out);
void kvt_tok_destroy(kvt_tok *t); /* NULL is a no-op */

uint32_t kvt_tok_n_vocab(const kvt_tok *t);
int32_t kvt_tok_bos(const kvt_tok *t);
int32_t kvt_tok_eos(const kvt_tok *t);
/* True for EOS, EOT and any other end-of-generation control token. */
bool kvt_tok_is_eog(const kvt_tok *t, int32_t id);
/*
 * True for a CONTROL token (after the overrides of kvt_tok_create) or an
 * end-of-generation one: a marker, not text. Generated text never shows it
 * (its decoded text would be the marker's name, e.g. "<|im_end|>").
 */
bool kvt_tok_is_control(const kvt_tok *t, int32_t id);
bool kvt_tok_add_bos(const kvt_tok *t);
/* tokenizer.ggml.add_eos_token (SentencePiece; false for BPE). Prompts for generation never end in EOS. */
bool kvt_tok_add_eos(const kvt_tok *t);
/*
 * SentencePiece add_space_prefix: the encoder puts a space before text that
 * opens the input or follows a special token. Decoding a whole text from its
 * start then drops that space with kvt_tok_stream.strip_space, as llama.cpp's
 * detokenize does; generated tokens are decoded as they are (llama.cpp's
 * per-token pieces), so a reply's first " Hello" keeps its space.
 */
bool kvt_tok_add_space_prefix(const kvt_tok *t);
/* enum kvt_tok_model of the vocabulary. */
int kvt_tok_model(const kvt_tok *t);
/* enum kvt_tok_type of id after the EOG overrides (KVT_TOK_UNDEFINED out of range). */
int kvt_tok_token_type(const kvt_tok *t, int32_t id);

/*
 * Tokenize len bytes of text. With parse_special, CONTROL/USER_DEFINED token
 * texts found in the input become those tokens; otherwise CONTROL texts are
 * ordinary text (USER_DEFINED ones are still split out, as in llama.cpp; the
 * modality markers made CONTROL are not).
 * BOS is never added here (callers decide via kvt_tok_add_bos()).
 * Writes at most cap ids to out; *n_out is always set to the number of ids the
 * full encoding has, and KVT_EFULL is returned when it exceeds cap.
 * Invalid UTF-8 input is never rejected: as in llama.cpp, each byte that does
 * not start a sequence becomes U+FFFD before pre-tokenization, so decoding
 * gives back valid UTF-8 input exactly but not invalid bytes.
 */
int kvt_tok_encode(const kvt_tok *t, const char *text, size_t len, bool parse_special,
		   int32_t *out, size_t cap, size_t *n_out);

/*
 * The raw bytes a token stands for (specials: their text; SentencePiece: U+2581
 * as a space, <0xXX> as its byte, UNUSED/UNDEFINED as nothing). KVT_EINVAL if
 * id is out of range.
 */
int kvt_tok_token_bytes(const kvt_tok *t, int32_t id, const char **bytes, size_t *len);

/* Streaming decode: feed ids, get only complete UTF-8 characters out. */
typedef struct kvt_tok_stream {
	unsigned char pending[8]; /* bytes of an incomplete UTF-8 character held back */
	size_t n_pending;          /* how many */
	bool strip_space;          /* drop one leading ' ' of the next token's bytes (then cleared); init: false */
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

#endif
