/* ctest-labels: integration */
/*
 * tests/test_sched_layered.c — the scheduler resuming a conversation whose
 * prefix is in T1, with the layer-wise promotion (kvt_sched_config
 * layer_groups: kvt_tm_promote_layered + the gated prefill) against the
 * sequential one (layer_groups 0), on a synthetic Llama of 6 layers with the
 * real manager and SQLite index (no NVMe tier: the prefix can only be in T0
 * or T1).
 *
 * Per T1 codec (f16, int8): a first turn is served and its blocks are pushed
 * to T1 (kvt_tm_reserve_t0); the second turn (the history plus a new
 * message) is served from that cached prefix. Its cached tokens must come
 * from T1, the layered run must have promoted layer group by layer group
 * (the scheduler's and the manager's counters), and its tokens must equal
 * the sequential run's (and, for f16, a run with no cache at all). The
 * manager's invariants hold after each run.
 */
#include "check.h"
#include "test_dev.h"
#include "gguf.h"
#include "manager.h"
#include "model.h"
#include "scheduler.h"
#include "stack.h"
#include "synth_model.h"
#include "tokenizer.h"

#include <unistd.h>

#define BT 16
#define N_FIRST 70
#define N_MSG 11
#define GEN1 9
#define GEN2 12

static char dir[] = "/tmp/kvt_tsl_XXXXXX";
static char model_path[300], db_path[300];
static const uint8_t secret[32] = "0123456789abcdef0123456789abcde";

typedef struct result {
	int32_t out[64];
	uint32_t n;
	int finish;
	kvt_sched_usage u;
} result;

static int run(kvt_sched *s, const int32_t *p, uint32_t n, uint32_t max_tokens, result *res)
{
	kvt_sched_req q;
	memset(&q, 0, sizeof(q));
	q.prompt = p;
	q.n_prompt = n;
	q.max_tokens = max_tokens;
	q.ignore_eos = true;
	snprintf(q.tenant, sizeof(q.tenant), "alice");
	kvt_sched_handle *h;
	int rc = kvt_sched_submit(s, &q, &h);
	if (rc)
		return rc;
	memset(res, 0, sizeof(*res));
	for (int spins = 0; spins < 100000 && !res->finish; spins++) {
		uint32_t got = 0;
		kvt_sched_next(h, res->out + res->n, 64 - res->n, &got, &res->finish, &res->u, 0.5);
		res->n += got;
	}
	kvt_sched_release(h);
	return res->finish == KVT_FINISH_LENGTH ? KVT_OK : KVT_EIO;
}

/* Both turns on a fresh stack; the second turn's result in *second. */
static void conversation(int codec, uint32_t layer_groups, bool cache, const int32_t *msg1, const int32_t *msg2,
			 result *second, uint64_t *n_layered)
{
	kvt_gguf *g = NULL;
	kvt_dev *dev;
	kvt_model *m;
	kvt_tok *tok;
	kvt_dev_config dc = { .kind = test_dev_kind(), .use_ref = true, .n_threads = 2 };
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_batch = 128;
	mc.max_ctx = 256;
	unlink(db_path);
	CHECK(kvt_gguf_open(model_path, &g) == KVT_OK && kvt_dev_create(&dc, &dev) == KVT_OK &&
	      kvt_model_load(dev, g, &mc, &m) == KVT_OK && kvt_tok_create_from_gguf(g, &tok) == KVT_OK);
	kvt_gguf_close(g);
	kvt_stack_config c;
	kvt_stack_config_default(&c);
	c.dev = dev;
	c.model = m;
	c.tok = tok;
	memset(c.model_fp, 0x3c, 32);
	c.block_tokens = BT;
	c.t0_slots = 40;
	c.db_path = db_path;
	c.tm.t1_slots = 32;
	c.tm.t1_codec = codec;
	c.sched.secret = secret;
	c.sched.secret_bytes = sizeof(secret);
	c.sched.max_running = 4;
	c.sched.prefill_chunk = 48;
	c.sched.cache = cache;
	c.sched.layer_groups = layer_groups;
	kvt_stack st;
	CHECK(kvt_stack_open(&c, &st) == KVT_OK);

	int32_t hist[N_FIRST + GEN1 + N_MSG];
	result first;
	memcpy(hist, msg1, N_FIRST * sizeof(int32_t));
	CHECK(run(st.sched, hist, N_FIRST, GEN1, &first) == KVT_OK && first.n == GEN1);
	memcpy(hist + N_FIRST, first.out, GEN1 * sizeof(int32_t));
	memcpy(hist + N_FIRST + GEN1, msg2, N_MSG * sizeof(int32_t));
	/* the conversation's blocks leave T0 (T1 keeps them) */
	CHECK(kvt_tm_reserve_t0(st.tm, kvt_t0_n_slots(st.t0)) == KVT_OK);
	CHECK(run(st.sched, hist, N_FIRST + GEN1 + N_MSG, GEN2, second) == KVT_OK && second->n == GEN2);
	const uint32_t want_cached = cache ? (N_FIRST + GEN1) / BT * BT : 0;
	CHECKF(second->u.cached_tokens == want_cached, "%u cached tokens, expected %u", second->u.cached_tokens,
	       want_cached);
	CHECK_EQ_INT(second->u.cached_by_tier[KVT_TIER_HOST], want_cached);
	kvt_sched_stats ss;
	kvt_sched_get_stats(st.sched, &ss);
	kvt_tm_stats ts;
	kvt_tm_get_stats(st.tm, &ts);
	*n_layered = ts.n_layered;
	CHECK_EQ_INT(ss.layered_promotions, layer_groups && cache ? 1 : 0);
	CHECK_EQ_INT(ts.n_layered, layer_groups && cache ? want_cached / BT : 0);
	CHECK(kvt_tm_check(st.tm) == KVT_OK);
	CHECK(kvt_sched_drain(st.sched, 5.0) == 0);
	kvt_stack_close(&st);
	kvt_model_destroy(m);
	kvt_tok_destroy(tok);
	kvt_dev_destroy(dev);
}

int main(void)
{
	kvt_dev *probe;
	kvt_dev_config pc = { .kind = test_dev_kind() };
	if (kvt_dev_create(&pc, &probe))
		return pc.kind == KVT_DEV_CPU ? 1 : check_skip("test_sched_layered", "the requested device is not available");
	printf("device: %s\n", kvt_dev_name(probe));
	kvt_dev_destroy(probe);
	CHECK(mkdtemp(dir) != NULL);
	snprintf(model_path, sizeof(model_path), "%s/m.gguf", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);
	kvt_synth_llama sc;
	kvt_synth_llama_default(&sc);
	sc.n_layer = 6;
	sc.n_ctx = 256;
	CHECK(kvt_synth_llama_write(&sc, model_path) == KVT_OK);
	int32_t msg1[N_FIRST], msg2[N_MSG];
	uint32_t x = 12345;
	for (int i = 0; i < N_FIRST; i++)
		msg1[i] = (int32_t)(3 + ((x = x * 1103515245u + 12345u) >> 8) % 250);
	for (int i = 0; i < N_MSG; i++)
		msg2[i] = (int32_t)(3 + ((x = x * 1103515245u + 12345u) >> 8) % 250);

	result none, seq, lay;
	uint64_t n_lay = 0;
	conversation(KVT_KV_CODEC_F16, 0, false, msg1, msg2, &none, &n_lay);
	static const int codecs[] = { KVT_KV_CODEC_F16, KVT_KV_CODEC_INT8 };
	for (int ci = 0; ci < 2; ci++) {
		const int codec = codecs[ci];
		conversation(codec, 0, true, msg1, msg2, &seq, &n_lay);
		conversation(codec, 3, true, msg1, msg2, &lay, &n_lay);
		CHECKF(!memcmp(seq.out, lay.out, GEN2 * sizeof(int32_t)), "%s T1: layered tokens differ from sequential",
		       kvt_kv_codec_name(codec));
		if (codec == KVT_KV_CODEC_F16)
			CHECKF(!memcmp(none.out, lay.out, GEN2 * sizeof(int32_t)), "f16 T1: layered tokens differ from no cache");
		printf("  %s T1: %llu blocks promoted layer group by layer group; tokens equal to sequential%s\n",
		       kvt_kv_codec_name(codec), (unsigned long long)n_lay,
		       codec == KVT_KV_CODEC_F16 ? " and to no cache" : "");
	}
	unlink(model_path);
	unlink(db_path);
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	return check_done("test_sched_layered");
}
