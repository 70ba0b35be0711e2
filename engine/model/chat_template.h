/*
 * engine/model/chat_template.h — chat formatting with a model's template: the
 * template families, which one a tokenizer uses, and a conversation as a
 * prompt string or as token ids (engine/model/chat_template.c).
 *
 * tokenizer.h includes this header, so a caller of the tokenizer sees the chat
 * API without naming it; it takes the kvt_tok of tokenizer.h and nothing else
 * of the tokenizer.
 */
#ifndef KVT_CHAT_TEMPLATE_H
#define KVT_CHAT_TEMPLATE_H

#include "kvt.h"

typedef struct kvt_tok kvt_tok; /* tokenizer.h */

/* The chat template families (kvt_tok_chat_name gives "auto", "chatml", ...). */
enum kvt_tok_chat {
	KVT_TOK_CHAT_AUTO = 0,    /* the stored template decides; as a kind: none recognised */
	KVT_TOK_CHAT_CHATML = 1,  /* <|im_start|>role ... <|im_end|> (Qwen, SmolLM2) */
	KVT_TOK_CHAT_GEMMA = 2,   /* <start_of_turn>role ... <end_of_turn>, system folded into the user turn */
	KVT_TOK_CHAT_MISTRAL = 3, /* [INST] ... [/INST] answer</s> */
	KVT_TOK_CHAT_LLAMA3 = 4,  /* <|start_header_id|>role<|end_header_id|> ... <|eot_id|> */
};

/* Parse "auto", "chatml", "gemma", "mistral" or "llama3" into *kind; KVT_EINVAL (not logged) otherwise. */
int kvt_tok_chat_parse(const char *name, int *kind);
/* The name of an enum kvt_tok_chat value ("?" out of range). */
const char *kvt_tok_chat_name(int kind);
/*
 * The family chat formatting uses: recognised from tokenizer.chat_template by
 * its markers, or, when the GGUF has none, chosen by general.architecture
 * (gemma* -> gemma, qwen2/qwen3 -> chatml; logged), else KVT_TOK_CHAT_AUTO
 * (then formatting fails with KVT_EUNSUPPORTED and a log line saying why).
 */
int kvt_tok_chat_kind(const kvt_tok *t);
/*
 * Force a family ([model] chat_template); KVT_TOK_CHAT_AUTO keeps the
 * model's. Call before the tokenizer is shared between threads (it is the one
 * change a kvt_tok allows after creation). KVT_EINVAL (logged) for a bad kind.
 */
int kvt_tok_set_chat(kvt_tok *t, int kind);
typedef struct kvt_chat_msg {
	const char *role;    /* "system", "user", "assistant" */
	const char *content; /* UTF-8 text */
	size_t content_len;  /* bytes of content, which may hold NUL bytes; 0: strlen(content) */
} kvt_chat_msg;

/*
 * Format messages into a prompt string (malloc'd, NUL-terminated, caller
 * frees) in the family kvt_tok_chat_kind() gives (layouts in chat_template.c:
 * llama.cpp's built-in renderings of each family's template). ChatML includes
 * SmolLM2's default system prompt when the first message is not a system
 * message (the template text is read for it); add_generation_prompt opens the
 * assistant's turn. No BOS. KVT_EUNSUPPORTED (logged) when the model has no
 * template or one of no known family; KVT_EINVAL for a NULL role/content.
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
 * marker is not in the vocabulary (Mistral's [INST] and [/INST], plain text
 * in v1 vocabularies, are then encoded as text).
 */
int kvt_tok_chat_encode(const kvt_tok *t, const kvt_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
			int32_t **ids, size_t *n_ids);

#endif
