/*
 * engine/model/sampler.c — greedy, temperature, top-k, top-p and min-p
 * sampling; penalties, logit bias, the grammar mask and logprobs
 * (sampler.h gives the order).
 *
 * The candidate set is sorted only as far as needed: top-k keeps the k best
 * by partial selection; top-p first drops every token whose probability is
 * below (1 - top_p) / (n - 1) — none of those can be inside the nucleus —
 * and sorts what remains. Tokens of probability 0 (masked, banned) are never
 * candidates. Penalties touch only the tokens seen so far (kept as lists),
 * so a step costs O(n_vocab) for the softmax and nothing more.
 */
#include "sampler.h"

#include "grammar.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int32_t kvt_argmax(const float *x, uint32_t n)
{
	return (int32_t)kvt_argmax_f32(x, n);
}

int kvt_sampler_init(kvt_sampler *s, const kvt_sampler_params *p, uint32_t n_vocab)
{
	memset(s, 0, sizeof(*s));
	if (!(p->temp >= 0) || !(p->top_p >= 0 && p->top_p <= 1) || p->top_k > n_vocab || !n_vocab ||
	    !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty >= 0) ||
	    !(p->presence_penalty >= -2 && p->presence_penalty <= 2) ||
	    !(p->frequency_penalty >= -2 && p->frequency_penalty <= 2) || p->n_bias > KVT_SAMPLER_MAX_BIAS) {
		KVT_LOGE("sampler: bad parameters: temperature %g, top_p %g, top_k %u (vocab %u), min_p %g, "
			 "repetition %g, presence %g, frequency %g, %u biases",
			 p->temp, p->top_p, p->top_k, n_vocab, p->min_p, p->repetition_penalty, p->presence_penalty,
			 p->frequency_penalty, p->n_bias);
		return KVT_EINVAL;
	}
	for (uint32_t i = 0; i < p->n_bias; i++)
		if (p->bias[i].id < 0 || (uint32_t)p->bias[i].id >= n_vocab || !isfinite(p->bias[i].bias)) {
			KVT_LOGE("sampler: logit bias %u: token %d (vocab %u), bias %g", i, p->bias[i].id, n_vocab,
				 p->bias[i].bias);
			return KVT_EINVAL;
		}
	s->p = *p;
	if (s->p.top_p == 0)
		s->p.top_p = 1;
	if (s->p.repetition_penalty == 0)
		s->p.repetition_penalty = 1;
	s->rng = p->seed ? p->seed : 0x9e3779b97f4a7c15ull;
	s->n_vocab = n_vocab;
	s->prob = malloc(n_vocab * sizeof(float));
	s->idx = malloc(n_vocab * sizeof(int32_t));
	if (!s->prob || !s->idx)
		goto oom;
	if (s->p.presence_penalty != 0 || s->p.frequency_penalty != 0) {
		s->count = calloc(n_vocab, sizeof(uint32_t));
		s->gen = malloc(n_vocab * sizeof(int32_t));
		if (!s->count || !s->gen)
			goto oom;
	}
	if (s->p.repetition_penalty != 1) {
		s->seen = calloc(n_vocab, 1);
		s->seen_ids = malloc(n_vocab * sizeof(int32_t));
		if (!s->seen || !s->seen_ids)
			goto oom;
	}
	return KVT_OK;
oom:
	kvt_sampler_deinit(s);
	return KVT_ENOMEM;
}

void kvt_sampler_deinit(kvt_sampler *s)
{
	free(s->prob);
	free(s->idx);
	free(s->allow);
	free(s->raw);
	free(s->count);
	free(s->gen);
	free(s->seen);
	free(s->seen_ids);
	s->prob = NULL;
	s->idx = NULL;
	s->allow = NULL;
	s->raw = NULL;
	s->count = NULL;
	s->gen = NULL;
	s->seen = NULL;
	s->seen_ids = NULL;
}

static void mark_seen(kvt_sampler *s, int32_t id)
{
	if (s->seen && id >= 0 && (uint32_t)id < s->n_vocab && !s->seen[id]) {
		s->seen[id] = 1;
		s->seen_ids[s->n_seen++] = id;
	}
}

void kvt_sampler_prompt(kvt_sampler *s, const int32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		mark_seen(s, ids[i]);
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

/* A draw from softmax(logits / temp) within the top_k / top_p / min_p cuts. */
static int32_t draw(kvt_sampler *s, const float *logits)
{
	const uint32_t n = s->n_vocab;
	float *prob = s->prob;
	int32_t *idx = s->idx;

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
		if (prob[i] > 0 && prob[i] >= cutoff)
			idx[n_cand++] = (int32_t)i;
	if (!n_cand) /* every probability underflowed but the best's: it is the choice */
		return kvt_argmax(logits, n);
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
	/* min_p: drop the kept tokens below min_p x the best one's probability */
	if (s->p.min_p > 0) {
		float floor_p = s->p.min_p * prob[idx[0]];
		while (keep > 1 && prob[idx[keep - 1]] < floor_p)
			mass -= prob[idx[--keep]];
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

int32_t kvt_sampler_sample(kvt_sampler *s, const float *logits)
{
	if (s->p.temp == 0)
		return kvt_argmax(logits, s->n_vocab);
	return draw(s, logits);
}

void kvt_logprobs(const float *logits, uint32_t n, int32_t id, uint32_t n_top, kvt_token_lp *lp)
{
	float mx = logits[kvt_argmax(logits, n)];
	double sum = 0;
	for (uint32_t i = 0; i < n; i++)
		sum += exp((double)logits[i] - mx);
	const double lse = mx + log(sum);
	if (n_top > KVT_MAX_TOP_LOGPROBS)
		n_top = KVT_MAX_TOP_LOGPROBS;
	if (n_top > n)
		n_top = n;
	/* the n_top best by insertion into a short sorted list (higher logit first, lower id on ties) */
	uint32_t k = 0;
	for (uint32_t i = 0; i < n && n_top; i++) {
		float v = logits[i];
		if (k == n_top && !(v > logits[lp->top_id[k - 1]]))
			continue;
		uint32_t j = k < n_top ? k++ : k - 1;
		while (j > 0 && v > logits[lp->top_id[j - 1]]) {
			lp->top_id[j] = lp->top_id[j - 1];
			j--;
		}
		lp->top_id[j] = (int32_t)i;
	}
	for (uint32_t j = 0; j < k; j++)
		lp->top_lp[j] = (float)(logits[lp->top_id[j]] - lse);
	lp->n_top = k;
	lp->id = id;
	lp->logprob = id >= 0 && (uint32_t)id < n ? (float)(logits[id] - lse) : -INFINITY;
}

/* Steps 2-4 of sampler.h, in place. */
static void penalise(kvt_sampler *s, float *logits)
{
	const float rp = s->p.repetition_penalty;
	for (uint32_t i = 0; rp != 1 && i < s->n_seen; i++) {
		float *x = &logits[s->seen_ids[i]];
		*x = *x > 0 ? *x / rp : *x * rp;
	}
	for (uint32_t i = 0; s->count && i < s->n_gen; i++) {
		int32_t id = s->gen[i];
		logits[id] -= s->p.presence_penalty + s->p.frequency_penalty * (float)s->count[id];
	}
	for (uint32_t i = 0; i < s->p.n_bias; i++) {
		float *x = &logits[s->p.bias[i].id];
		*x = s->p.bias[i].bias <= -100 ? -INFINITY : *x + s->p.bias[i].bias;
	}
}

static int32_t pick(kvt_sampler *s, const float *logits)
{
	return s->p.temp == 0 ? kvt_argmax(logits, s->n_vocab) : draw(s, logits);
}

bool kvt_sampler_plain_greedy(const kvt_sampler_params *p)
{
	return p->temp == 0 && !p->n_bias && p->presence_penalty == 0 && p->frequency_penalty == 0 &&
	       (p->repetition_penalty == 0 || p->repetition_penalty == 1);
}

int32_t kvt_sampler_next(kvt_sampler *s, float *logits, struct kvt_gmatch *g, kvt_token_lp *lp, uint32_t n_top)
{
	const uint32_t n = s->n_vocab;
	if (lp) { /* the raw row, before anything below changes it */
		if (!s->raw && !(s->raw = malloc((size_t)n * sizeof(float)))) {
			KVT_LOGE("sampler: out of memory for logprobs");
			return -1;
		}
		memcpy(s->raw, logits, (size_t)n * sizeof(float));
	}
	penalise(s, logits);
	int32_t tok;
	const bool exact_fast = s->p.temp == 0 || (s->p.top_k == 0 && s->p.top_p >= 1 && s->p.min_p == 0);
	if (g && exact_fast && (tok = pick(s, logits)) >= 0 && kvt_gmatch_allows(g, tok)) {
		kvt_gmatch_count_fast(g);
	} else if (g) {
		if (!s->allow && !(s->allow = malloc((size_t)(n + 63) / 64 * sizeof(uint64_t)))) {
			KVT_LOGE("sampler: out of memory for a grammar mask");
			return -1;
		}
		if (!kvt_gmatch_mask(g, s->allow)) {
			KVT_LOGE("sampler: the grammar allows no token here");
			return -1;
		}
		for (uint32_t i = 0; i < n; i++)
			if (!(s->allow[i >> 6] >> (i & 63) & 1))
				logits[i] = -INFINITY;
		tok = pick(s, logits);
		if (!(s->allow[tok >> 6] >> (tok & 63) & 1)) { /* only if every allowed logit is -inf (all banned) */
			KVT_LOGE("sampler: every token the grammar allows is banned by logit_bias");
			return -1;
		}
	} else {
		tok = pick(s, logits);
	}
	if (g && kvt_gmatch_accept(g, tok) != KVT_OK) {
		KVT_LOGE("sampler: the grammar refused token %d it allowed", tok);
		return -1;
	}
	if (lp)
		kvt_logprobs(s->raw, n, tok, n_top, lp);
	if (s->count) {
		if (!s->count[tok]++)
			s->gen[s->n_gen++] = tok;
	}
	mark_seen(s, tok);
	return tok;
}
