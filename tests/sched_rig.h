/*
 * tests/sched_rig.h — what the scheduler tests (test_sched, test_sched_fair)
 * share around a kvt_stack on a synthetic Llama: loading the model and its
 * tokenizer on the test device (reference kernels), the stack settings both
 * start from (fp16 T1, a 16 MiB buffered NVMe file, a fixed secret and model
 * fingerprint), collecting a request's tokens to its end, and the seeded
 * prompts of byte tokens, and writing the synthetic model itself. Each test sets what differs (T0/T1 sizes, reset,
 * the scheduler's knobs) and owns its paths.
 */
#ifndef KVT_TEST_SCHED_RIG_H
#define KVT_TEST_SCHED_RIG_H

#include "gguf.h"
#include "model.h"
#include "scheduler.h"
#include "stack.h"
#include "synth_model.h"
#include "test_dev.h"
#include "tokenizer.h"

#include <stdio.h>
#include <string.h>

#ifndef BT
#define BT 16
#endif

static const uint8_t sched_rig_secret[32] = "0123456789abcdef0123456789abcde";

/* The device, the model (max_batch 128, max_ctx) and its tokenizer from the GGUF at path; 0, or 1 on failure. */
static inline int sched_rig_load_ctx(const char *path, int n_threads, uint32_t max_ctx, kvt_dev **dev, kvt_model **m,
				     kvt_tok **tok)
{
	kvt_gguf *g = NULL;
	kvt_dev_config dc = { .kind = test_dev_kind(), .use_ref = true, .n_threads = n_threads };
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_batch = 128;
	mc.max_ctx = max_ctx;
	if (kvt_gguf_open(path, &g) || kvt_dev_create(&dc, dev) || kvt_model_load(*dev, g, &mc, m) ||
	    kvt_tok_create_from_gguf(g, tok))
		return 1;
	kvt_gguf_close(g);
	return 0;
}

/* sched_rig_load_ctx with a 512-token context. */
static inline int sched_rig_load(const char *path, int n_threads, kvt_dev **dev, kvt_model **m, kvt_tok **tok)
{
	return sched_rig_load_ctx(path, n_threads, 512, dev, m, tok);
}

/* The shared stack settings over a loaded model (borrowed; the paths must outlive kvt_stack_open). */
static inline void sched_rig_config(kvt_stack_config *c, kvt_dev *dev, kvt_model *m, kvt_tok *tok,
				    const char *db_path, const char *t2_path, uint32_t t0_slots, uint32_t t1_slots)
{
	kvt_stack_config_default(c);
	c->dev = dev;
	c->model = m;
	c->tok = tok;
	memset(c->model_fp, 0x5a, 32);
	c->block_tokens = BT;
	c->t0_slots = t0_slots;
	c->db_path = db_path;
	c->t2_path = t2_path;
	c->t2.capacity_bytes = 16u << 20;
	c->t2.buffered_ok = true;
	c->tm.t1_slots = t1_slots;
	c->tm.t1_codec = KVT_KV_CODEC_F16;
	c->sched.secret = sched_rig_secret;
	c->sched.secret_bytes = sizeof(sched_rig_secret);
}

/* Close the stack, then what sched_rig_load made. */
static inline void sched_rig_free(kvt_stack *st, kvt_dev *dev, kvt_model *m, kvt_tok *tok)
{
	kvt_stack_close(st);
	kvt_model_destroy(m);
	kvt_tok_destroy(tok);
	kvt_dev_destroy(dev);
}

/* The tests' model: the default synthetic Llama with an n_ctx-token context, written to path; kvt_synth_llama_write's result. */
static inline int sched_rig_write_model_ctx(const char *path, uint32_t n_ctx)
{
	kvt_synth_llama sc;
	kvt_synth_llama_default(&sc);
	sc.n_ctx = n_ctx;
	return kvt_synth_llama_write(&sc, path);
}

/* sched_rig_write_model_ctx with a 512-token context. */
static inline int sched_rig_write_model(const char *path) { return sched_rig_write_model_ctx(path, 512); }

typedef struct sched_result {
	int32_t out[512];     /* the generated ids */
	uint32_t n;           /* count */
	int finish;           /* KVT_FINISH_* */
	kvt_sched_usage u;    /* the final usage */
} sched_result;

/* Collect a submitted request to its end (releasing h); KVT_OK, or KVT_EIO if it never finished. */
static inline int sched_collect(kvt_sched_handle *h, sched_result *res)
{
	memset(res, 0, sizeof(*res));
	for (int spins = 0; spins < 100000; spins++) {
		uint32_t n = 0;
		kvt_sched_next(h, res->out + res->n, 512 - res->n, &n, &res->finish, &res->u, 0.5);
		res->n += n;
		if (res->finish)
			break;
	}
	kvt_sched_release(h);
	return res->finish ? KVT_OK : KVT_EIO;
}

/* n seeded pseudo-random byte tokens (ids 3 .. 252). */
static inline void sched_make_prompt(int32_t *p, uint32_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (uint32_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (int32_t)(3 + (x >> 8) % 250);
	}
}

#endif
