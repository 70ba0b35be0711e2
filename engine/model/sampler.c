/*
 * engine/model/sampler.c — greedy, temperature, top-k and top-p sampling.
 *
 * The candidate set is sorted only as far as needed: top-k keeps the k best
 * by partial selection; top-p first drops every token whose probability is
 * below (1 - top_p) / (n - 1) — none of those can be inside the nucleus —
 * and sorts what remains.
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

int32_t kvt_argmax(const float *x, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return (int32_t)best;
}

int kvt_sampler_init(kvt_sampler *s, const kvt_sampler_params *p, uint32_t n_vocab)
{
	if (!(p->temp >= 0) || !(p->top_p >= 0 && p->top_p <= 1) || p->top_k > n_vocab || !n_vocab) {
		KVT_LOGE("sampler: bad parameters: temperature %g, top_p %g, top_k %u (vocab %u)", p->temp, p->top_p,
			 p->top_k, n_vocab);
		return KVT_EINVAL;
	}
	s->p = *p;
	if (s->p.top_p == 0)
		s->p.top_p = 1;
	s->rng = p->seed ? p->seed : 0x9e3779b97f4a7c15ull;
	s->n_vocab = n_vocab;
	s->prob = malloc(n_vocab * sizeof(float));
	s->idx = malloc(n_vocab * sizeof(int32_t));
	if (!s->prob || !s->idx) {
		kvt_sampler_deinit(s);
		return KVT_ENOMEM;
	}
	return KVT_OK;
}

void kvt_sampler_deinit(kvt_sampler *s)
{
	free(s->prob);
	free(s->idx);
	s->prob = NULL;
	s->idx = NULL;
}

/* Uniform in [0, 1). */
static float rng_f32(uint64_t *st)
{
	*st ^= *st >> 12;
	*st ^= *st << 25;
	*st ^= *st >> 27;
	return (float)(((*st * 0x2545F4914F6CDD1Dull) >> 40) * (1.0 / 16777216.0));
}

static _Thread_local const float *tl_prob;

static int by_prob_desc(const void *a, const void *b)
{
	float pa = tl_prob[*(const int32_t *)a], pb = tl_prob[*(const int32_t *)b];
	if (pa != pb)
		return pa < pb ? 1 : -1;
	return *(const int32_t *)a - *(const int32_t *)b;
}

int32_t kvt_sampler_sample(kvt_sampler *s, const float *logits)
{
	const uint32_t n = s->n_vocab;
	float *prob = s->prob;
	int32_t *idx = s->idx;

	if (s->p.temp == 0)
		return kvt_argmax(logits, n);

	/* softmax at temperature */
	float mx = logits[kvt_argmax(logits, n)];
	double sum = 0;
	for (uint32_t i = 0; i < n; i++) {
		prob[i] = expf((logits[i] - mx) / s->p.temp);
		sum += prob[i];
	}
	for (uint32_t i = 0; i < n; i++)
		prob[i] = (float)(prob[i] / sum);

	/* candidates: everything that could survive the cuts */
	uint32_t n_cand = 0;
	float cutoff = (s->p.top_p < 1 && s->p.top_k == 0 && n > 1) ? (1.0f - s->p.top_p) / (float)(n - 1) : 0;
	for (uint32_t i = 0; i < n; i++)
		if (prob[i] >= cutoff)
			idx[n_cand++] = (int32_t)i;
	tl_prob = prob;
	qsort(idx, n_cand, sizeof(*idx), by_prob_desc);
	if (s->p.top_k && n_cand > s->p.top_k)
		n_cand = s->p.top_k;
	double mass = 0;
	uint32_t keep = 0;
	while (keep < n_cand) {
		mass += prob[idx[keep++]];
		if (mass >= s->p.top_p)
			break;
	}
	/* draw from the kept set, renormalised */
	float r = rng_f32(&s->rng) * (float)mass;
	double c = 0;
	for (uint32_t i = 0; i < keep; i++) {
		c += prob[idx[i]];
		if (r < c)
			return idx[i];
	}
	return idx[keep - 1];
}
