/* ctest-labels: integration */
/*
 * tests/test_manager_layered.c — layer-wise promotion from T1
 * (kvt_tm_promote_layered) feeding a gated prefill (kvt_model_forward_gated),
 * on a tiny synthetic Llama of 6 layers.
 *
 * Per T1 codec (f16, fp8, int8): the engine prefills a prompt of 4 full
 * blocks, registers them and lets them go; they are evicted to T1. Then
 *   - sequential: kvt_tm_promote brings them back, the new turn's tokens are
 *     prefilled over them (every row's logits kept) and decoded greedily;
 *   - pipelined: back to T1 only, kvt_tm_promote_layered in 3 groups of 2
 *     layers (and, for f16, 6 groups of 1), the same prefill behind the gate,
 *     kvt_tm_layered_finish, the same decode;
 * and the logits and tokens must be identical (bit for bit: the same bytes
 * reach T0 either way). For f16 they must also equal a run that never left
 * T0. After the pipelined run the blocks are in T0 in the table and the
 * manager's invariants hold.
 *
 * Gating: the forward records the device's kernel-launch counter at each
 * group's wait. On the CUDA backend (the CPU emulator in CI) the test checks
 * that one device wait is issued per group, and that the waits fall exactly
 * before layers 0, 2 and 4 (equal launch counts between them, and the same
 * count from the last wait to the end as per group): layer l's work is issued
 * after, hence ordered after, group l / 2's event. On the CPU backend the
 * counters are zeros and events complete when recorded; only the results are
 * checked there.
 *
 * kvt_dev_copy_2d_async (the layered copies' strided copies for runs of
 * adjacent slots) is checked on its own first.
 *
 * Failures: a copy failing at group 1 (the manager's fault hook) fails the
 * call and gives everything back (T0 slots free, T1 references, busy blocks,
 * table unchanged: a sequential promotion then works); a block in no tier
 * is KVT_ENOTFOUND with nothing done; a second layered promotion in flight is
 * KVT_EBUSY; blocks already in T0 are taken without a copy.
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
#define N_LAYER 6
#define N_BLOCKS 4
#define N_PREFIX (N_BLOCKS * BT)
#define N_NEW 20
#define N_GEN 8

static char dir[] = "/tmp/kvt_tml_XXXXXX";
static char model_path[300];
static uint8_t model_fp[32] = { 7, 7 };
static kvt_dev *dev;
static kvt_model *m;
static kvt_t0_pool *t0;
static uint32_t V;
static int fail_group = -1; /* the fault hook fails this group's copies (-1: none) */

static int fault_hook(void *user, uint32_t group)
{
	(void)user;
	return (int)group == fail_group ? KVT_EDEVICE : KVT_OK;
}

static int32_t argmax(const float *x)
{
	int32_t best = 0;
	for (uint32_t i = 1; i < V; i++)
		if (x[i] > x[best])
			best = (int32_t)i;
	return best;
}

/* A new turn over a sequence holding the prefix: prefill the new tokens (behind gate), then greedy steps. */
static int turn(kvt_seq *s, const int32_t *new_toks, const kvt_model_gate *gate, float *logits, int32_t *gen)
{
	int rc = kvt_model_forward_gated(m, s, new_toks, N_NEW, logits, N_NEW, gate);
	int32_t t = argmax(logits + (size_t)(N_NEW - 1) * V);
	float *row = malloc(V * sizeof(float));
	for (int i = 0; i < N_GEN && rc == KVT_OK; i++) {
		gen[i] = t;
		rc = kvt_model_forward(m, s, &t, 1, row, 1);
		t = argmax(row);
	}
	free(row);
	return rc;
}

/* A sequence made of promoted slots (each with its reference): the cached prefix, as the engine builds it. */
static void seq_of(kvt_seq *s, const int32_t *slots)
{
	CHECK(kvt_seq_init(s, dev, t0, N_PREFIX + N_NEW + N_GEN + 1) == KVT_OK);
	memcpy(s->blocks, slots, N_BLOCKS * sizeof(int32_t));
	s->n_blocks = N_BLOCKS;
	s->n_tokens = N_PREFIX;
	s->n_synced = 0;
}

static bool in_tier(kvt_btable *bt, const uint8_t h[32], int tier)
{
	kvt_btable_entry e;
	return kvt_btable_get(bt, h, &e) == KVT_OK && e.slot[tier] >= 0;
}

static void pin_all(kvt_tm *tm, uint8_t (*h)[32])
{
	for (int i = 0; i < N_BLOCKS; i++)
		CHECK(kvt_tm_pin(tm, h[i]) == KVT_OK);
}

/* Every block in T1 and not in T0. */
static void to_t1(kvt_tm *tm, kvt_btable *bt, uint8_t (*h)[32])
{
	CHECK(kvt_tm_reserve_t0(tm, kvt_t0_n_slots(t0)) == KVT_OK);
	for (int i = 0; i < N_BLOCKS; i++)
		CHECK(!in_tier(bt, h[i], KVT_TIER_HBM) && in_tier(bt, h[i], KVT_TIER_HOST));
}

/* The pipelined turn in n_groups groups; checks the groups, the gate's waits and the table after. */
static void pipelined(kvt_tm *tm, kvt_btable *bt, uint8_t (*h)[32], uint32_t n_groups, uint32_t want_lpg,
		      const int32_t *new_toks, float *logits, int32_t *gen)
{
	int32_t slots[N_BLOCKS];
	kvt_tm_layered *lp = NULL;
	to_t1(tm, bt, h);
	pin_all(tm, h);
	kvt_dev_counters cp0, cp1;
	kvt_dev_counters_get(dev, &cp0);
	CHECK(kvt_tm_promote_layered(tm, N_BLOCKS, (const uint8_t(*)[32])h, n_groups, slots, &lp) == KVT_OK);
	kvt_dev_counters_get(dev, &cp1);
	CHECK_EQ_INT(kvt_tm_layered_n_copied(lp), N_BLOCKS);
	if (kvt_dev_kind(dev) == KVT_DEV_CUDA) /* at least one copy per group; runs of adjacent slots take one per range */
		printf("    layered copy: %llu copies for %d blocks in %u groups\n",
		       (unsigned long long)(cp1.copies - cp0.copies), N_BLOCKS, N_LAYER / want_lpg);
	CHECK(kvt_dev_kind(dev) != KVT_DEV_CUDA || cp1.copies - cp0.copies >= N_LAYER / want_lpg);
	/* not in the table's T0 before finish: no one else may read slots still being filled */
	for (int i = 0; i < N_BLOCKS; i++)
		CHECK(!in_tier(bt, h[i], KVT_TIER_HBM));
	/* one layered promotion at a time */
	int32_t other[N_BLOCKS];
	kvt_tm_layered *lp2 = NULL;
	CHECK_EQ_INT(kvt_tm_promote_layered(tm, N_BLOCKS, (const uint8_t(*)[32])h, 1, other, &lp2), KVT_EBUSY);
	CHECK(lp2 == NULL);

	kvt_event *const *ev;
	uint32_t ng, lpg;
	kvt_tm_layered_groups(lp, &ev, &ng, &lpg);
	CHECK_EQ_INT(lpg, want_lpg);
	CHECK_EQ_INT(ng, N_LAYER / want_lpg);
	uint64_t at[N_LAYER];
	memset(at, 0, sizeof(at));
	kvt_model_gate gate = { .events = ev, .n_groups = ng, .layers_per_group = lpg, .launches_at_wait = at };
	kvt_seq s;
	seq_of(&s, slots);
	kvt_dev_counters c0, c1;
	kvt_dev_counters_get(dev, &c0);
	int rc = kvt_model_forward_gated(m, &s, new_toks, N_NEW, logits, N_NEW, &gate);
	kvt_dev_counters_get(dev, &c1);
	CHECK(rc == KVT_OK);
	if (kvt_dev_kind(dev) == KVT_DEV_CUDA) {
		CHECKF(c1.event_waits - c0.event_waits == ng, "%llu device waits for %u groups",
		       (unsigned long long)(c1.event_waits - c0.event_waits), ng);
		/* the waits sit at equal distances, before the first launch of layers 0, lpg, 2 lpg, ... */
		CHECK(at[0] > c0.kernel_launches); /* after the embedding */
		uint64_t per = ng > 1 ? at[1] - at[0] : 0;
		for (uint32_t g = 1; g < ng; g++)
			CHECKF(at[g] - at[g - 1] == per && per > 0, "group %u waits %llu launches after group %u (%llu before)",
			       g, (unsigned long long)(at[g] - at[g - 1]), g - 1, (unsigned long long)per);
		/* after the last wait: its group's layers (per), then the logits (norm, GEMM) */
		if (ng > 1)
			CHECKF(c1.kernel_launches - at[ng - 1] >= per && c1.kernel_launches - at[ng - 1] <= per + 4,
			       "%llu launches after the last wait (a group is %llu)",
			       (unsigned long long)(c1.kernel_launches - at[ng - 1]), (unsigned long long)per);
		printf("    gate: %u waits, %llu launches per group of %u layers\n", ng, (unsigned long long)per, lpg);
	}
	CHECK(kvt_tm_layered_finish(tm, lp) == KVT_OK);
	for (int i = 0; i < N_BLOCKS; i++)
		CHECK(in_tier(bt, h[i], KVT_TIER_HBM) && in_tier(bt, h[i], KVT_TIER_HOST));
	/* the rest of the turn (decode) on the promoted prefix */
	int32_t t = argmax(logits + (size_t)(N_NEW - 1) * V);
	float *row = malloc(V * sizeof(float));
	for (int i = 0; i < N_GEN; i++) {
		gen[i] = t;
		CHECK(kvt_model_forward(m, &s, &t, 1, row, 1) == KVT_OK);
		t = argmax(row);
	}
	free(row);
	kvt_seq_deinit(&s);
	kvt_btable_unpin_n(bt, (const uint8_t(*)[32])h, N_BLOCKS);
	CHECK(kvt_tm_check(tm) == KVT_OK);
}

static void run_codec(int codec, const uint8_t root[32], const int32_t *prompt, const int32_t *new_toks,
		      const float *ref_logits, const int32_t *ref_gen, uint8_t (*h)[32])
{
	kvt_btable *bt;
	kvt_tm *tm;
	CHECK(kvt_btable_create(BT, 0, &bt) == KVT_OK);
	kvt_tm_config c;
	kvt_tm_config_default(&c);
	c.dev = dev;
	c.t0 = t0;
	c.bt = bt;
	c.t1_slots = 8;
	c.t1_codec = codec;
	c.batch_blocks = 2; /* the sequential path moves 2 blocks at a time; the layered staging its minimum */
	c.layered_fault = fault_hook;
	c.high[KVT_TIER_HBM] = c.high[KVT_TIER_HOST] = c.high[KVT_TIER_NVME] = 1.0f;
	CHECK(kvt_tm_create(&c, &tm) == KVT_OK);
	printf("  t1 %s\n", kvt_kv_codec_name(codec));

	kvt_seq b;
	CHECK(kvt_seq_init(&b, dev, t0, N_PREFIX) == KVT_OK);
	CHECK(kvt_model_forward(m, &b, prompt, N_PREFIX, NULL, 0) == KVT_OK);
	for (int i = 0; i < N_BLOCKS; i++)
		CHECK(kvt_tm_register(tm, h[i], i ? h[i - 1] : root, prompt + i * BT, b.blocks[i]) == KVT_OK);
	kvt_seq_deinit(&b);

	const size_t n_log = (size_t)N_NEW * V;
	float *seq_logits = malloc(n_log * sizeof(float)), *pipe_logits = malloc(n_log * sizeof(float));
	int32_t seq_gen[N_GEN], pipe_gen[N_GEN], slots[N_BLOCKS];
	int res[N_BLOCKS];

	/* sequential: promote, then prefill */
	to_t1(tm, bt, h);
	pin_all(tm, h);
	CHECK(kvt_tm_promote(tm, N_BLOCKS, (const uint8_t(*)[32])h, slots, res) == KVT_OK);
	kvt_seq s;
	seq_of(&s, slots);
	CHECK(turn(&s, new_toks, NULL, seq_logits, seq_gen) == KVT_OK);
	kvt_seq_deinit(&s);
	kvt_btable_unpin_n(bt, (const uint8_t(*)[32])h, N_BLOCKS);
	if (codec == KVT_KV_CODEC_F16) {
		CHECKF(!memcmp(seq_logits, ref_logits, n_log * sizeof(float)), "f16 sequential: logits differ from T0's");
		CHECK(!memcmp(seq_gen, ref_gen, sizeof(seq_gen)));
	}

	/* pipelined, 3 groups of 2 layers (4 asked: 2 is the smallest divisor of 6 >= ceil(6 / 4)) */
	kvt_tm_stats st0, st1;
	kvt_tm_get_stats(tm, &st0);
	pipelined(tm, bt, h, 4, 2, new_toks, pipe_logits, pipe_gen);
	kvt_tm_get_stats(tm, &st1);
	CHECKF(!memcmp(seq_logits, pipe_logits, n_log * sizeof(float)), "%s: pipelined logits differ from sequential",
	       kvt_kv_codec_name(codec));
	CHECK(!memcmp(seq_gen, pipe_gen, sizeof(seq_gen)));
	CHECK_EQ_INT(st1.n_layered - st0.n_layered, N_BLOCKS);
	CHECK_EQ_INT(st1.n_layered_calls - st0.n_layered_calls, 1);
	CHECK_EQ_INT(st1.tier[KVT_TIER_HBM].n_promotions - st0.tier[KVT_TIER_HBM].n_promotions, N_BLOCKS);
	CHECK_EQ_INT(st1.tier[KVT_TIER_HOST].hits - st0.tier[KVT_TIER_HOST].hits, N_BLOCKS);
	if (codec == KVT_KV_CODEC_F16) { /* one group per layer, and a single group */
		memset(pipe_logits, 0, n_log * sizeof(float));
		pipelined(tm, bt, h, N_LAYER, 1, new_toks, pipe_logits, pipe_gen);
		CHECK(!memcmp(seq_logits, pipe_logits, n_log * sizeof(float)) && !memcmp(seq_gen, pipe_gen, sizeof(seq_gen)));
		memset(pipe_logits, 0, n_log * sizeof(float));
		pipelined(tm, bt, h, 1, N_LAYER, new_toks, pipe_logits, pipe_gen);
		CHECK(!memcmp(seq_logits, pipe_logits, n_log * sizeof(float)) && !memcmp(seq_gen, pipe_gen, sizeof(seq_gen)));
	}

	/* blocks already in T0 (after the pipelined run): taken as they are, no copy */
	kvt_tm_layered *lp = NULL;
	pin_all(tm, h);
	CHECK(kvt_tm_promote_layered(tm, N_BLOCKS, (const uint8_t(*)[32])h, 3, slots, &lp) == KVT_OK);
	CHECK_EQ_INT(kvt_tm_layered_n_copied(lp), 0);
	CHECK(kvt_tm_layered_finish(tm, lp) == KVT_OK);
	for (int i = 0; i < N_BLOCKS; i++)
		kvt_t0_unref(t0, slots[i]);
	kvt_btable_unpin_n(bt, (const uint8_t(*)[32])h, N_BLOCKS);

	/* a failed copy (group 1 of 3): nothing promoted, everything given back */
	to_t1(tm, bt, h);
	const uint32_t free0 = kvt_t0_n_free(t0);
	uint32_t t1_refs[N_BLOCKS];
	for (int i = 0; i < N_BLOCKS; i++) {
		kvt_btable_entry e;
		CHECK(kvt_btable_get(bt, h[i], &e) == KVT_OK);
		t1_refs[i] = kvt_t1_refcount(kvt_tm_t1(tm), e.slot[KVT_TIER_HOST]);
	}
	kvt_tm_get_stats(tm, &st0);
	fail_group = 1;
	lp = NULL;
	CHECK_EQ_INT(kvt_tm_promote_layered(tm, N_BLOCKS, (const uint8_t(*)[32])h, 3, slots, &lp), KVT_EDEVICE);
	fail_group = -1;
	CHECK(lp == NULL);
	kvt_tm_get_stats(tm, &st1);
	CHECK_EQ_INT(st1.n_layered_failed - st0.n_layered_failed, 1);
	CHECK_EQ_INT(st1.n_layered - st0.n_layered, 0);
	CHECK_EQ_INT(kvt_t0_n_free(t0), free0);
	for (int i = 0; i < N_BLOCKS; i++) {
		kvt_btable_entry e;
		CHECK(kvt_btable_get(bt, h[i], &e) == KVT_OK && e.slot[KVT_TIER_HBM] < 0 && e.slot[KVT_TIER_HOST] >= 0);
		CHECK_EQ_INT(kvt_t1_refcount(kvt_tm_t1(tm), e.slot[KVT_TIER_HOST]), t1_refs[i]);
	}
	CHECK(kvt_tm_check(tm) == KVT_OK);
	/* nothing stored was lost: the sequential path still serves the same turn */
	pin_all(tm, h);
	CHECK(kvt_tm_promote(tm, N_BLOCKS, (const uint8_t(*)[32])h, slots, res) == KVT_OK);
	seq_of(&s, slots);
	CHECK(turn(&s, new_toks, NULL, pipe_logits, pipe_gen) == KVT_OK);
	CHECK(!memcmp(seq_logits, pipe_logits, n_log * sizeof(float)) && !memcmp(seq_gen, pipe_gen, sizeof(seq_gen)));
	kvt_seq_deinit(&s);
	kvt_btable_unpin_n(bt, (const uint8_t(*)[32])h, N_BLOCKS);

	/* a block in no tier: KVT_ENOTFOUND, nothing done */
	uint8_t bad[2][32];
	memcpy(bad[0], h[0], 32);
	memset(bad[1], 0xab, 32);
	const uint32_t free1 = kvt_t0_n_free(t0);
	lp = NULL;
	CHECK_EQ_INT(kvt_tm_promote_layered(tm, 2, (const uint8_t(*)[32])bad, 3, slots, &lp), KVT_ENOTFOUND);
	CHECK(lp == NULL && kvt_t0_n_free(t0) == free1);
	/* bad arguments */
	CHECK_EQ_INT(kvt_tm_promote_layered(tm, N_BLOCKS, (const uint8_t(*)[32])h, 0, slots, &lp), KVT_EINVAL);
	kvt_model_gate bad_gate = { .events = NULL, .n_groups = 1, .layers_per_group = 1 };
	kvt_seq q;
	CHECK(kvt_seq_init(&q, dev, t0, N_NEW) == KVT_OK);
	CHECK_EQ_INT(kvt_model_forward_gated(m, &q, new_toks, 1, NULL, 0, &bad_gate), KVT_EINVAL);
	CHECK_EQ_INT(q.n_tokens, 0);
	kvt_seq_deinit(&q);
	CHECK(kvt_tm_check(tm) == KVT_OK);

	free(seq_logits);
	free(pipe_logits);
	kvt_tm_destroy(tm);
	kvt_btable_destroy(bt);
	CHECK_EQ_INT(kvt_t0_n_free(t0), kvt_t0_n_slots(t0));
}

/* kvt_dev_copy_2d_async, which the layered copies use for runs of adjacent slots: rows land where they should. */
static void test_copy_2d(void)
{
	enum { ROW = 48, SP = 80, DP = 64, ROWS = 5 };
	unsigned char *h, *d, back[DP * ROWS];
	kvt_stream *st;
	CHECK(kvt_dev_host_alloc(dev, SP * ROWS, (void **)&h) == KVT_OK && kvt_dev_alloc(dev, DP * ROWS, (void **)&d) == KVT_OK);
	CHECK(kvt_dev_stream_create(dev, &st) == KVT_OK);
	for (int i = 0; i < SP * ROWS; i++)
		h[i] = (unsigned char)(i * 7 + 1);
	memset(back, 0xee, sizeof(back));
	CHECK(kvt_dev_copy_h2d(dev, d, back, sizeof(back)) == KVT_OK);
	CHECK(kvt_dev_copy_2d_async(dev, st, d, DP, h + 3, SP, ROW, ROWS, KVT_COPY_H2D) == KVT_OK);
	CHECK(kvt_dev_stream_sync(dev, st) == KVT_OK);
	CHECK(kvt_dev_copy_d2h(dev, back, d, sizeof(back)) == KVT_OK);
	bool ok = true;
	for (int r = 0; r < ROWS; r++)
		for (int i = 0; i < DP; i++)
			ok = ok && back[r * DP + i] == (i < ROW ? h[3 + r * SP + i] : 0xee);
	CHECKF(ok, "a strided copy put bytes where they do not belong");
	CHECK_EQ_INT(kvt_dev_copy_2d_async(dev, st, d, ROW - 1, h, SP, ROW, 2, KVT_COPY_H2D), KVT_EINVAL);
	kvt_dev_stream_destroy(dev, st);
	kvt_dev_free(dev, d);
	kvt_dev_host_free(dev, h);
}

int main(void)
{
	if (!mkdtemp(dir))
		return 1;
	snprintf(model_path, sizeof(model_path), "%s/synth.gguf", dir);
	kvt_dev_config dc = { .kind = test_dev_kind(), .n_threads = 2 };
	if (kvt_dev_create(&dc, &dev)) {
		unlink(model_path);
		rmdir(dir);
		return dc.kind == KVT_DEV_CPU ? 1 : check_skip("test_manager_layered", "the requested device is not available");
	}
	printf("device: %s\n", kvt_dev_name(dev));
	test_copy_2d();
	kvt_synth_llama sc;
	kvt_synth_llama_default(&sc);
	sc.n_layer = N_LAYER;
	sc.n_ctx = 256;
	CHECK(kvt_synth_llama_write(&sc, model_path) == KVT_OK);
	CHECK(kvt_model_fingerprint(model_path, NULL, KVT_FP_CURRENT, model_fp, NULL) == KVT_OK);
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

	int32_t prompt[N_PREFIX], new_toks[N_NEW], ref_gen[N_GEN];
	check_rng rng = { 4242 };
	for (int i = 0; i < N_PREFIX; i++)
		prompt[i] = (int32_t)(check_rng_u64(&rng) % V);
	for (int i = 0; i < N_NEW; i++)
		new_toks[i] = (int32_t)(check_rng_u64(&rng) % V);
	uint8_t root[32], salt[32] = { 0 }, h[N_BLOCKS][32];
	uint32_t n_h;
	CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt, root) == KVT_OK);
	CHECK(kvt_hash_chain(root, prompt, N_PREFIX, BT, h, N_BLOCKS, &n_h) == KVT_OK && n_h == N_BLOCKS);

	/* the reference: the prefix never left T0 */
	float *ref_logits = malloc((size_t)N_NEW * V * sizeof(float));
	kvt_seq a;
	CHECK(kvt_seq_init(&a, dev, t0, N_PREFIX + N_NEW + N_GEN + 1) == KVT_OK);
	CHECK(kvt_model_forward(m, &a, prompt, N_PREFIX, NULL, 0) == KVT_OK);
	CHECK(turn(&a, new_toks, NULL, ref_logits, ref_gen) == KVT_OK);
	kvt_seq_deinit(&a);

	for (int codec = 0; codec < KVT_KV_CODEC_COUNT; codec++)
		run_codec(codec, root, prompt, new_toks, ref_logits, ref_gen, h);

	free(ref_logits);
	kvt_t0_destroy(t0);
	kvt_model_destroy(m);
	kvt_dev_destroy(dev);
	unlink(model_path);
	rmdir(dir);
	return check_done("test_manager_layered");
}
