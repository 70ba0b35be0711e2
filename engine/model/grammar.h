/*
 * engine/model/grammar.h — grammar-constrained decoding: a context-free
 * grammar over bytes, matched by a pushdown automaton, and the vocabulary
 * mask it implies at each decode step.
 *
 * Three objects:
 *  - kvt_grammar: rules compiled once per request from a GBNF-like text
 *    (see grammar.c for the syntax); immutable, reference-counted, so every
 *    choice of a request and the scheduler may hold it.
 *  - kvt_vocab_trie: the byte strings of every token, as a trie, built once
 *    per vocabulary (the scheduler builds it when the model is loaded).
 *    Control tokens are not in it: a grammar never produces them. The
 *    end-of-generation tokens are kept aside: they are allowed exactly where
 *    the grammar may end.
 *  - kvt_gmatch: one sequence's position in the grammar (a set of parse
 *    stacks), advanced token by token.
 *
 * The state is a set of stacks of grammar positions (an Earley-free, depth-
 * first expansion as in llama.cpp's GBNF matcher): each stack's top is a byte
 * class to match next; an empty stack means the grammar may end here. A
 * token is allowed when all of its bytes advance the state without emptying
 * the set. The mask walks the trie once, advancing the stack set per trie
 * edge, so tokens that share a prefix share its work, and prunes a subtree as
 * soon as its first byte is in no top's class.
 *
 * Threads: a kvt_gmatch belongs to one thread; a kvt_grammar and a
 * kvt_vocab_trie are shared read-only.
 */
#ifndef KVT_GRAMMAR_H
#define KVT_GRAMMAR_H

#include "kvt.h"

struct kvt_tok;

typedef struct kvt_grammar kvt_grammar;
typedef struct kvt_vocab_trie kvt_vocab_trie;
typedef struct kvt_gmatch kvt_gmatch;

/*
 * Compile grammar text (len bytes; the rule named root is the start).
 * KVT_EINVAL with a message in err (cap err_cap, may be NULL) naming the
 * line and the fault: a syntax error, an undefined rule, a rule that can
 * start with itself (left recursion) or a repetition of something that
 * matches nothing. KVT_ENOMEM. The result holds one reference.
 */
int kvt_grammar_compile(const char *text, size_t len, const char *root, kvt_grammar **out, char *err,
			size_t err_cap);
kvt_grammar *kvt_grammar_ref(kvt_grammar *g); /* another reference; returns g */
void kvt_grammar_unref(kvt_grammar *g);       /* NULL is a no-op; the last one frees */

/* The token byte trie of a vocabulary (n_vocab ids; tok's EOG tokens kept aside). KVT_ENOMEM. */
int kvt_vocab_trie_create(const struct kvt_tok *tok, uint32_t n_vocab, kvt_vocab_trie **out);
void kvt_vocab_trie_destroy(kvt_vocab_trie *t); /* NULL is a no-op */

/* Counters of one matcher. */
typedef struct kvt_gmatch_stats {
	uint64_t n_tokens;      /* tokens advanced over */
	uint64_t n_masks;       /* vocabulary masks needed */
	uint64_t n_cached;      /* of those, found in the matcher's cache (the same state seen before) */
	uint64_t n_fast;        /* tokens taken without a mask (the sampled token was allowed) */
	double mask_s;          /* time spent computing masks */
} kvt_gmatch_stats;

/*
 * A matcher at the grammar's start, for the trie's vocabulary (t may be NULL:
 * then only kvt_gmatch_feed works, for tests). Borrowed g and t must outlive
 * it (the matcher takes no reference). KVT_ENOMEM.
 */
int kvt_gmatch_create(const kvt_grammar *g, const kvt_vocab_trie *t, kvt_gmatch **out);
void kvt_gmatch_destroy(kvt_gmatch *m); /* NULL is a no-op */
/* Would token id keep the output inside the grammar (EOG: may the grammar end here)? */
bool kvt_gmatch_allows(kvt_gmatch *m, int32_t id);
/*
 * The allowed tokens as a bitset allow[(n_vocab + 63) / 64] (bit id % 64 of
 * word id / 64). Returns how many are allowed (0 only for a grammar that can
 * neither go on nor end, which compile refuses).
 */
uint32_t kvt_gmatch_mask(kvt_gmatch *m, uint64_t *allow);
/* Take token id. KVT_EINVAL if it is not allowed (the state is unchanged). */
int kvt_gmatch_accept(kvt_gmatch *m, int32_t id);
/* Take raw bytes (tests; the prompt-free use). false if they leave the grammar (state unchanged). */
bool kvt_gmatch_feed(kvt_gmatch *m, const char *bytes, size_t n);
/* The grammar may end here. */
bool kvt_gmatch_can_end(const kvt_gmatch *m);
/* Nothing but the end can follow. */
bool kvt_gmatch_must_end(const kvt_gmatch *m);
void kvt_gmatch_get_stats(const kvt_gmatch *m, kvt_gmatch_stats *st);
/* Count a token taken without a mask (the sampler's fast path). */
void kvt_gmatch_count_fast(kvt_gmatch *m);

#endif
