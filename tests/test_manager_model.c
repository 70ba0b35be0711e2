/* ctest-labels: integration */
/*
 * tests/test_manager_model.c — DESIGN §8 invariant 2 through the tiering
 * manager, on a tiny synthetic Llama: a block promoted from any tier decodes
 * to the same tokens as before it was demoted (f16), or within the measured
 * error (FP8/INT8: reported, with the first token required to agree).
 *
 * The engine prefills a prompt of 4 full blocks plus one token, registers the
 * 4 blocks with the manager, and drops its own references. Then, per path:
 *   T1: the blocks are evicted from T0 (to T1) and promoted back;
 *   T2: they are flushed to NVMe, the manager, table and index are closed
 *       and reopened (a restart), recovered from the index, and promoted
 *       from the file;
 * and a new sequence made of the promoted slots (the cached prefix) decodes
 * greedily from the last prompt token. The reference decodes the same prompt
 * with no cache. Real pieces throughout (CPU device, SQLite index, T2 file).
 * Run on a synthetic Llama and a synthetic Gemma 3 (head_dim 32 over a width
 * of 64, a window of 8 on 5 of its 6 layers: the promoted prefix is mostly
 * outside the local layers' windows, so those read only its last block).
 */
#include "check.h"
#include "test_dev.h"
#include "gguf.h"
#include "fingerprint.h"
#include "manager.h"
#include "model.h"
#include "synth_model.h"

#include <unistd.h>

#define BT 16
#define N_BLOCKS 4
#define N_PROMPT (N_BLOCKS * BT + 1)
#define N_GEN 16

static char dir[] = "/tmp/kvt_tmm_XXXXXX";
static char model_path[300], t2_path[300], db_path[300];
static uint8_t model_fp[32] = { 9, 9 };
static kvt_dev *dev;
static kvt_model *m;
static kvt_t0_pool *t0;
static uint32_t V;

static int32_t argmax(const float *x)
{
	int32_t best = 0;
	for (uint32_t i = 1; i < V; i++)
		if (x[i] > x[best])
			best = (int32_t)i;
	return best;
}

/* Greedy tokens after feeding `first` to a sequence that already holds the prompt's full blocks. */
static int decode(kvt_seq *s, int32_t first, int32_t *out)
{
	float *logits = malloc(V * sizeof(float));
	int32_t t = first;
	int rc = KVT_OK;
	for (int i = 0; i < N_GEN && rc == KVT_OK; i++) {
		rc = kvt_model_forward(m, s, &t, 1, logits, 1);
		t = out[i] = argmax(logits);
	}
	free(logits);
	return rc;
}

typedef struct stack {
	kvt_btable *bt;
	kvt_t2_store *t2;
	kvt_db *db;
	kvt_tm *tm;
} stack;

static int stack_open(stack *st, int codec, bool reset)
{
	memset(st, 0, sizeof(*st));
	if (kvt_btable_create(BT, 0, &st->bt))
		return 1;
	kvt_t2_config tc = { .path = t2_path, .capacity_bytes = 8u << 20, .compress = true, .reset = reset,
			     .buffered_ok = true };
	memcpy(tc.model_fp, model_fp, 32);
	kvt_db_config dbc = { .path = db_path, .create = true };
	memcpy(dbc.ns.model_fp, model_fp, 32);
	dbc.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	dbc.ns.block_tokens = BT;
	if (kvt_t2_open(&tc, &st->t2) || kvt_db_open(&dbc, &st->db))
		return 1;
	kvt_tm_config c;
	kvt_tm_config_default(&c);
	c.dev = dev;
	c.t0 = t0;
	c.bt = st->bt;
	c.t2 = st->t2;
	c.db = st->db;
	c.t1_slots = 8;
	c.t1_codec = codec;
	c.high[KVT_TIER_HBM] = c.high[KVT_TIER_HOST] = c.high[KVT_TIER_NVME] = 1.0f;
	return kvt_tm_create(&c, &st->tm) != KVT_OK;
}

static void stack_close(stack *st)
{
	kvt_tm_destroy(st->tm);
	kvt_db_close(st->db);
	kvt_t2_close(st->t2);
	kvt_btable_destroy(st->bt);
}

/* Promote the prompt's blocks and decode on them; returns the number of generated tokens equal to ref. */
static int decode_cached(stack *st, const uint8_t root[32], const int32_t *prompt, const int32_t *ref, int codec,
			 const char *path)
{
	kvt_btable_match mt[N_BLOCKS];
	uint8_t h[N_BLOCKS][32];
	int32_t slots[N_BLOCKS];
	int res[N_BLOCKS];
	uint32_t nh = 0, nm = 0;
	int32_t gen[N_GEN];
	CHECK(kvt_tm_lookup(st->tm, root, prompt, N_PROMPT, KVT_BT_PIN | KVT_BT_TOUCH, mt, N_BLOCKS, &nh, &nm) == KVT_OK);
	CHECKF(nm == N_BLOCKS, "%s: %u blocks matched", path, nm);
	for (uint32_t i = 0; i < nm; i++)
		memcpy(h[i], mt[i].hash, 32);
	CHECK(kvt_tm_promote(st->tm, nm, (const uint8_t(*)[32])h, slots, res) == KVT_OK);
	/* the cached prefix, as the engine builds it: the promoted slots (with their references) */
	kvt_seq s;
	CHECK(kvt_seq_init(&s, dev, t0, N_PROMPT + N_GEN) == KVT_OK);
	memcpy(s.blocks, slots, sizeof(slots));
	s.n_blocks = N_BLOCKS;
	s.n_tokens = N_BLOCKS * BT;
	s.n_synced = 0;
	CHECK(decode(&s, prompt[N_PROMPT - 1], gen) == KVT_OK);
	kvt_seq_deinit(&s);
	kvt_btable_unpin_n(st->bt, (const uint8_t(*)[32])h, nm);
	int same = 0;
	while (same < N_GEN && gen[same] == ref[same])
		same++;
	printf("  %s via %s: %d of %d greedy tokens equal before the first difference\n", kvt_kv_codec_name(codec), path,
	       same, N_GEN);
	if (codec == KVT_KV_CODEC_F16)
		CHECKF(same == N_GEN, "f16 via %s: tokens differ at %d", path, same);
	else
		CHECKF(same >= 1, "%s via %s: the first token differs", kvt_kv_codec_name(codec), path);
	return same;
}

static void rmdir_all(void)
{
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

static int run_arch(const char *arch)
{
	kvt_synth_llama sc;
	kvt_synth_llama_default(&sc);
	sc.n_ctx = 256;
	if (!strcmp(arch, "gemma3")) {
		sc.arch = "gemma3";
		sc.n_layer = 6;
		sc.head_dim = 32;
		sc.n_head_kv = 1;
		sc.sliding_window = 8;
	}
	printf("architecture: %s\n", arch);
	CHECK(kvt_synth_llama_write(&sc, model_path) == KVT_OK);
	CHECK(kvt_model_fingerprint(model_path, NULL, KVT_FP_CURRENT, model_fp, NULL) == KVT_OK); /* the chain's root, per file */
	kvt_gguf *g;
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.weight_dtype = KVT_DTYPE_F32;
	if (kvt_gguf_open(model_path, &g) || kvt_model_load(dev, g, &mc, &m))
		return 1;
	kvt_gguf_close(g);
	V = kvt_model_hparams_get(m)->n_vocab;
	kvt_kv_layout shape;
	kvt_model_kv_shape(m, BT, &shape);
	CHECK(kvt_t0_create(dev, &shape, 16, &t0) == KVT_OK);

	int32_t prompt[N_PROMPT], ref[N_GEN];
	check_rng rng = { 31337 };
	for (int i = 0; i < N_PROMPT; i++)
		prompt[i] = (int32_t)(check_rng_u64(&rng) % V);
	uint8_t root[32], salt[32] = { 0 }, hashes[N_BLOCKS][32];
	uint32_t n_h;
	CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt, root) == KVT_OK);
	CHECK(kvt_hash_chain(root, prompt, N_PROMPT, BT, hashes, N_BLOCKS, &n_h) == KVT_OK && n_h == N_BLOCKS);

	/* the reference: no cache, the whole prompt then greedy steps */
	kvt_seq a;
	CHECK(kvt_seq_init(&a, dev, t0, N_PROMPT + N_GEN) == KVT_OK);
	CHECK(kvt_model_forward(m, &a, prompt, N_PROMPT - 1, NULL, 0) == KVT_OK);
	CHECK(decode(&a, prompt[N_PROMPT - 1], ref) == KVT_OK);
	kvt_seq_deinit(&a);

	for (int codec = 0; codec < KVT_KV_CODEC_COUNT; codec++) {
		stack st;
		unlink(db_path);
		CHECK(stack_open(&st, codec, true) == 0);
		/* the engine prefills the full blocks and registers them, then lets go of its sequence */
		kvt_seq b;
		CHECK(kvt_seq_init(&b, dev, t0, N_PROMPT + N_GEN) == KVT_OK);
		CHECK(kvt_model_forward(m, &b, prompt, N_BLOCKS * BT, NULL, 0) == KVT_OK);
		for (int i = 0; i < N_BLOCKS; i++)
			CHECK(kvt_tm_register(st.tm, hashes[i], i ? hashes[i - 1] : root, prompt + i * BT, b.blocks[i]) ==
			      KVT_OK);
		kvt_seq_deinit(&b);

		/* T1 path: out of T0 (dirty, so copied to T1), back from T1 */
		CHECK(kvt_tm_reserve_t0(st.tm, kvt_t0_n_slots(t0)) == KVT_OK);
		decode_cached(&st, root, prompt, ref, codec, "T1");
		kvt_tm_stats ts;
		kvt_tm_get_stats(st.tm, &ts);
		CHECK_EQ_INT(ts.tier[KVT_TIER_HOST].hits, N_BLOCKS);

		/* T2 path: the turn ends (write-through), restart, recover, promote from the file */
		kvt_tm_end_turn(st.tm);
		CHECK(kvt_tm_flush(st.tm) == KVT_OK);
		stack_close(&st);
		CHECK_EQ_INT(kvt_t0_n_free(t0), kvt_t0_n_slots(t0));
		CHECK(stack_open(&st, codec, false) == 0);
		uint64_t n_rec = 0;
		CHECK(kvt_tm_recover(st.tm, &n_rec) == KVT_OK && n_rec == N_BLOCKS);
		decode_cached(&st, root, prompt, ref, codec, "T2 after a restart");
		kvt_tm_get_stats(st.tm, &ts);
		CHECK_EQ_INT(ts.tier[KVT_TIER_NVME].hits, N_BLOCKS);
		CHECK(kvt_tm_check(st.tm) == KVT_OK);
		stack_close(&st);
	}

	kvt_t0_destroy(t0);
	kvt_model_destroy(m);
	return 0;
}

int main(void)
{
	if (!mkdtemp(dir))
		return 1;
	snprintf(model_path, sizeof(model_path), "%s/synth.gguf", dir);
	snprintf(t2_path, sizeof(t2_path), "%s/kvtier.t2", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);
	kvt_dev_config dc = { .kind = test_dev_kind(), .n_threads = 2 };
	if (kvt_dev_create(&dc, &dev)) {
		rmdir_all();
		return dc.kind == KVT_DEV_CPU ? 1 : check_skip("test_manager_model", "the requested device is not available");
	}
	printf("device: %s\n", kvt_dev_name(dev));
	if (run_arch("llama") || run_arch("gemma3"))
		return 1;
	kvt_dev_destroy(dev);
	rmdir_all();
	return check_done("test_manager_model");
}
