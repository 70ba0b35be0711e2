/*
 * engine/model/sampler.h — choosing the next token from logits, on the host.
 *
 * temperature 0 is greedy (argmax, lowest id on ties). Otherwise: logits are
 * divided by the temperature, cut to the top_k most likely (0: no cut), then
 * to the smallest set whose probability reaches top_p (1: no cut), then
 * tokens below min_p times the most likely one's probability are dropped,
 * and one token is drawn with a seeded xorshift generator, so a seed
 * reproduces a run exactly.
 *
 * kvt_sampler_next is the serving path. On one row of logits, in this order:
 *  1. logprobs (when asked) from the raw logits: log-softmax of what the model
 *     computed for the position, before penalties, bias, grammar and
 *     temperature (vLLM's default, "raw logprobs");
 *  2. repetition_penalty over the prompt and generated tokens (a logit > 0
 *     divided by it, one < 0 multiplied, as CTRL / Hugging Face define it);
 *  3. presence and frequency penalties over the generated tokens (OpenAI:
 *     logit -= presence * (count > 0) + frequency * count);
 *  4. logit_bias added (-100 bans the token: it is never chosen);
 *  5. the grammar mask (grammar.h): tokens that would leave the grammar get
 *     -inf; end-of-generation only where the grammar may end;
 *  6. temperature, top_k, top_p, min_p and the draw, as above.
 * The grammar mask costs a walk of the vocabulary trie, so when the result
 * cannot depend on it — greedy, or a draw with no top_k / top_p / min_p cut,
 * where drawing from the full distribution and keeping an allowed token is
 * drawing from the masked one — the token is chosen first and the mask
 * computed only if the grammar refuses it.
 */
#ifndef KVT_SAMPLER_H
#define KVT_SAMPLER_H

#include "kvt.h"

struct kvt_gmatch;

#define KVT_SAMPLER_MAX_BIAS 1024 /* logit_bias entries */
#define KVT_MAX_TOP_LOGPROBS 20

typedef struct kvt_logit_bias {
	int32_t id;                /* token id */
	float bias;                /* added to the logit; <= -100 bans */
} kvt_logit_bias;

typedef struct kvt_sampler_params {
	float temp;                /* 0: greedy */
	float top_p;               /* (0, 1]; 0 or 1 disables */
	uint32_t top_k;            /* 0 disables */
	uint64_t seed;             /* generator seed */
	float min_p;               /* [0, 1]; 0 disables */
	float presence_penalty;    /* [-2, 2]; 0 disables */
	float frequency_penalty;   /* [-2, 2]; 0 disables */
	float repetition_penalty;  /* > 0; 0 or 1 disables */
	uint32_t n_bias;           /* entries of bias */
	kvt_logit_bias bias[KVT_SAMPLER_MAX_BIAS]; /* [n_bias] */
} kvt_sampler_params;

/* The log-probabilities of one chosen token (raw: before any processing). */
typedef struct kvt_token_lp {
	int32_t id;                /* the chosen token */
	float logprob;             /* its log-probability */
	uint32_t n_top;            /* entries of top (what was asked, at most 20) */
	int32_t top_id[KVT_MAX_TOP_LOGPROBS]; /* the most likely tokens, most likely first (lowest id on ties) */
	float top_lp[KVT_MAX_TOP_LOGPROBS];
} kvt_token_lp;

typedef struct kvt_sampler {
	kvt_sampler_params p;  /* parameters */
	uint64_t rng;          /* xorshift64* state */
	uint32_t n_vocab;      /* logits per call */
	float *prob;           /* [n_vocab] scratch */
	int32_t *idx;          /* [n_vocab] scratch */
	uint64_t *allow;       /* [(n_vocab + 63) / 64] grammar mask scratch (NULL until first needed) */
	float *raw;            /* [n_vocab] the raw row, for logprobs (NULL until first needed) */
	uint32_t *count;       /* [n_vocab] times each token was generated (NULL: no presence/frequency penalty) */
	int32_t *gen;          /* [n_gen] distinct generated tokens (with count) */
	uint32_t n_gen;
	uint8_t *seen;         /* [n_vocab] in the prompt or generated (NULL: no repetition penalty) */
	int32_t *seen_ids;     /* [n_seen] distinct tokens of seen */
	uint32_t n_seen;
} kvt_sampler;

/*
 * Whether p is plain greedy: temperature 0 and no penalties or bias, so the
 * next token is the argmax of the raw logits (lowest id on ties) and picking
 * it changes no sampler state: a device's argmax may pick it instead.
 */
bool kvt_sampler_plain_greedy(const kvt_sampler_params *p);

/*
 * KVT_EINVAL (logged) for temp < 0, top_p or min_p outside [0, 1], top_k >
 * n_vocab, a repetition penalty < 0, a penalty outside [-2, 2], a bias
 * token out of range or n_bias over the limit.
 */
int kvt_sampler_init(kvt_sampler *s, const kvt_sampler_params *p, uint32_t n_vocab);
void kvt_sampler_deinit(kvt_sampler *s);
/* The next token for one row of n_vocab logits (host memory); no penalties, bias or grammar. */
int32_t kvt_sampler_sample(kvt_sampler *s, const float *logits);
/* The prompt, for the repetition penalty (call once, before the first next). */
void kvt_sampler_prompt(kvt_sampler *s, const int32_t *ids, uint32_t n);
/*
 * The serving path (see the top of the file): the next token for one row of
 * logits, which is used as scratch (modified). g (may be NULL) constrains
 * the choice and is advanced over it. lp (may be NULL) gets the raw
 * log-probabilities, with n_top (<= 20) alternatives. Returns the token;
 * -1 when the grammar allows nothing (cannot happen for a compiled grammar
 * over a byte-complete vocabulary; logged).
 */
int32_t kvt_sampler_next(kvt_sampler *s, float *logits, struct kvt_gmatch *g, kvt_token_lp *lp, uint32_t n_top);
/* log-softmax of logits at id, and the n_top best (raw, lp filled). */
void kvt_logprobs(const float *logits, uint32_t n, int32_t id, uint32_t n_top, kvt_token_lp *lp);
/* Index of the largest logit, lowest on ties. */
int32_t kvt_argmax(const float *x, uint32_t n);

#endif
