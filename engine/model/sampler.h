/*
 * engine/model/sampler.h — choosing the next token from logits, on the host.
 *
 * temperature 0 is greedy (argmax, lowest id on ties). Otherwise: logits are
 * divided by the temperature, cut to the top_k most likely (0: no cut), then
 * to the smallest set whose probability reaches top_p (1: no cut), and one
 * token is drawn with a seeded xorshift generator, so a seed reproduces a
 * run exactly.
 */
#ifndef KVT_SAMPLER_H
#define KVT_SAMPLER_H

#include "kvt.h"

typedef struct kvt_sampler_params {
	float temp;     /* 0: greedy */
	float top_p;    /* (0, 1]; 0 or 1 disables */
	uint32_t top_k; /* 0 disables */
	uint64_t seed;  /* generator seed */
} kvt_sampler_params;

typedef struct kvt_sampler {
	kvt_sampler_params p;  /* parameters */
	uint64_t rng;          /* xorshift64* state */
	uint32_t n_vocab;      /* logits per call */
	float *prob;           /* [n_vocab] scratch */
	int32_t *idx;          /* [n_vocab] scratch */
} kvt_sampler;

/* KVT_EINVAL (logged) for temp < 0, top_p outside [0, 1], top_k > n_vocab. */
int kvt_sampler_init(kvt_sampler *s, const kvt_sampler_params *p, uint32_t n_vocab);
void kvt_sampler_deinit(kvt_sampler *s);
/* The next token for one row of n_vocab logits (host memory). */
int32_t kvt_sampler_sample(kvt_sampler *s, const float *logits);
/* Index of the largest logit, lowest on ties. */
int32_t kvt_argmax(const float *x, uint32_t n);

#endif
