/*
 * engine/model/generate.c — the single-request generation loop (see generate.h).
 */
#include "generate.h"

#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

int kvt_generate(kvt_model *m, kvt_seq *s, const kvt_tok *tok, const int32_t *prompt, uint32_t n_prompt,
		 const kvt_gen_params *p, kvt_gen_token_fn on_token, void *user, kvt_gen_stats *st)
{
	const uint32_t V = kvt_model_hparams_get(m)->n_vocab;
	const uint32_t n_max = n_prompt + p->n_predict;
	kvt_sampler smp;
	float *logits = malloc(V * sizeof(float));
	int32_t *seq = malloc((n_max ? n_max : 1) * sizeof(int32_t));
	int rc;

	memset(st, 0, sizeof(*st));
	st->n_prompt = n_prompt;
	if (!logits || !seq) {
		rc = KVT_ENOMEM;
		goto out_nosmp;
	}
	if (n_prompt == 0 || s->n_tokens >= n_prompt) {
		KVT_LOGE("generate: need a prompt longer than the %u cached tokens (got %u)", s->n_tokens, n_prompt);
		rc = KVT_EINVAL;
		goto out_nosmp;
	}
	if ((rc = kvt_sampler_init(&smp, &p->sample, V)))
		goto out_nosmp;
	memcpy(seq, prompt, n_prompt * sizeof(int32_t));

	/* the device picks as the host would: greedy, nothing else to apply */
	const bool on_device = !p->host_decode && !p->no_kv_cache && kvt_sampler_plain_greedy(&p->sample) &&
			       kvt_dev_graphs_supported(s->dev);
	int32_t picked = -1; /* the device's pick for the next step, or -1: sample from logits */
	double t0 = kvt_now_s(), t1 = t0;
	uint32_t n = n_prompt;
	/* prefill: only what the sequence does not already hold */
	const uint32_t n_cached = s->n_tokens;
	rc = kvt_model_forward(m, s, prompt + n_cached, n_prompt - n_cached, logits, 1);
	st->positions_processed += n_prompt - n_cached;
	while (rc == KVT_OK && st->n_gen < p->n_predict) {
		int32_t next = picked >= 0 ? picked : kvt_sampler_sample(&smp, logits);
		if (st->n_gen == 0)
			t1 = kvt_now_s();
		seq[n++] = next;
		st->n_gen++;
		if (on_token && on_token(next, user))
			break;
		if (p->stop_at_eog && tok && kvt_tok_is_eog(tok, next))
			break;
		if (st->n_gen == p->n_predict)
			break;
		if (p->no_kv_cache) {
			kvt_seq_reset(s);
			rc = kvt_model_forward(m, s, seq, n, logits, 1);
			st->positions_processed += n;
		} else if (on_device) {
			rc = kvt_model_decode(m, 1, &s, &seq[n - 1], NULL, NULL, &picked);
			st->positions_processed += 1;
		} else {
			rc = kvt_model_forward(m, s, &seq[n - 1], 1, logits, 1);
			st->positions_processed += 1;
		}
	}
	double t2 = kvt_now_s();
	st->prefill_s = (st->n_gen ? t1 : t2) - t0;
	st->decode_s = st->n_gen ? t2 - t1 : 0;
	kvt_sampler_deinit(&smp);
out_nosmp:
	free(logits);
	free(seq);
	return rc;
}
