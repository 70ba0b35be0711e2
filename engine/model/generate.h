/*
 * engine/model/generate.h — one request's generation loop: prefill, then decode
 * token by token, sampling each next token on the host.
 *
 * With the KV cache (the default) the prompt is run once and each step feeds
 * only the newest token. Greedy decoding with no penalties or bias, on a
 * backend with graphs, runs each step as kvt_model_decode (one graph launch,
 * the token picked on the device) unless host_decode asks otherwise. With no_kv_cache every step recomputes the whole
 * sequence from an empty KV — the textbook comparison: the tokens must be the
 * same, and positions_processed shows the work each way costs.
 */
#ifndef KVT_GENERATE_H
#define KVT_GENERATE_H

#include "model.h"
#include "sampler.h"

struct kvt_tok;

typedef struct kvt_gen_params {
	uint32_t n_predict;        /* tokens to generate at most */
	kvt_sampler_params sample; /* sampling */
	bool no_kv_cache;          /* recompute the whole sequence each step */
	bool stop_at_eog;          /* stop after an end-of-generation token */
	bool host_decode;          /* run every decode step from the host, even where kvt_model_decode could */
} kvt_gen_params;

typedef struct kvt_gen_stats {
	uint32_t n_prompt;             /* prompt tokens */
	uint32_t n_gen;                /* generated tokens */
	double prefill_s;              /* time to the first generated token */
	double decode_s;               /* time for the rest */
	uint64_t positions_processed;  /* token positions run through the model */
} kvt_gen_stats;

/* Called with each generated token; return non-zero to stop. */
typedef int (*kvt_gen_token_fn)(int32_t id, void *user);

/*
 * Generate after prompt[0..n_prompt) on sequence s (empty, or holding a
 * prefix of the prompt whose K/V are stored: only the rest is prefilled).
 * tok is used only for end-of-generation ids (may be NULL). Returns the
 * first error of the forward pass or sampler; stats are filled either way.
 */
int kvt_generate(kvt_model *m, kvt_seq *s, const struct kvt_tok *tok, const int32_t *prompt, uint32_t n_prompt,
		 const kvt_gen_params *p, kvt_gen_token_fn on_token, void *user, kvt_gen_stats *stats);

#endif
