/*
 * tests/srv_engine.h — the serving stack the HTTP tests and the request-path
 * fuzzer run kvtierd's server on: a synthetic Llama GGUF written into dir (a
 * directory of the caller's, which also gets the SQLite index), the CPU
 * backend, a T0 pool of 256 blocks of 16 tokens, 32 T1 slots, sessions, a
 * fixed server secret. No NVMe tier. engine_open returns 0, or 1 on failure.
 */
#ifndef KVT_TEST_SRV_ENGINE_H
#define KVT_TEST_SRV_ENGINE_H

#include "fingerprint.h"
#include "gguf.h"
#include "model.h"
#include "stack.h"
#include "synth_model.h"
#include "tokenizer.h"

#include <stdio.h>
#include <string.h>

#ifndef BT
#define BT 16
#endif

typedef struct engine {
	kvt_dev *dev;        /* CPU */
	kvt_model *m;
	kvt_tok *tok;
	kvt_stack st;   /* index, tiers, scheduler */
	kvt_sched *sched; /* st's */
	uint32_t n_vocab;
} engine;

static inline int engine_open(engine *e, const char *dir)
{
	char model_path[300], db_path[300];
	snprintf(model_path, sizeof(model_path), "%s/synth.gguf", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);
	kvt_synth_llama sl;
	kvt_synth_llama_default(&sl);
	sl.n_ctx = 512;
	if (kvt_synth_llama_write(&sl, model_path))
		return 1;
	kvt_gguf *g;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = 2 };
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.weight_dtype = KVT_DTYPE_F32;
	uint8_t fp[32];
	if (kvt_dev_create(&dc, &e->dev) || kvt_gguf_open(model_path, &g))
		return 1;
	if (kvt_model_load(e->dev, g, &mc, &e->m) || kvt_tok_create_from_gguf(g, &e->tok) ||
	    kvt_model_fingerprint_gguf(g, KVT_FP_CURRENT, 0, fp))
		return 1;
	kvt_gguf_close(g);
	e->n_vocab = kvt_model_hparams_get(e->m)->n_vocab;
	kvt_stack_config c;
	kvt_stack_config_default(&c);
	static const uint8_t secret[32] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };
	c.dev = e->dev;
	c.model = e->m;
	c.tok = e->tok;
	memcpy(c.model_fp, fp, 32);
	c.block_tokens = BT;
	c.t0_slots = 256;
	c.db_path = db_path;
	c.tm.t1_slots = 32;
	c.sched.secret = secret;
	c.sched.secret_bytes = sizeof(secret);
	if (kvt_stack_open(&c, &e->st))
		return 1;
	e->sched = e->st.sched;
	return 0;
}

static inline void engine_close(engine *e)
{
	kvt_stack_close(&e->st);
	kvt_tok_destroy(e->tok);
	kvt_model_destroy(e->m);
	kvt_dev_destroy(e->dev);
}

#endif
