/*
 * bench/bench_index.c — the index's three figures, each as a ratio to a
 * baseline measured in the same run.
 *
 *   bench_index [--model M.gguf] [--threads N] [--resume-tokens N] [--dir D]
 *
 * 1. Prefix lookup of a 2,048-block conversation (block_tokens 16, 32,768
 *    tokens): kvt_btable_lookup with pin + touch (then unpin), median of 101
 *    runs, in us per block; baseline: computing the same 2,048 chained
 *    SHA-256 hashes alone. Target: <= 5 us per block.
 * 2. Durable inserts per second: kvt_db_put_block rows (chains of 64 blocks
 *    with SHA-256 hashes, so every index sees random keys) with group commit
 *    (one writer, up to 4096 rows per transaction) vs one transaction per row
 *    (max_batch 1), both synchronous=FULL on the same filesystem (--dir,
 *    default /tmp). Target ratio >= 50.
 * 3. Index time as a share of a resume: for a session of --resume-tokens
 *    tokens (default 512), the index work of a resume (session row read
 *    through the writer thread + chained hashes + prefix lookup with pin +
 *    unpin) against the engine's prefill of the same tokens on the model
 *    (what the resume saves). Also extrapolated to the 2,048-block
 *    conversation with the measured prefill rate (linear: a lower bound on
 *    prefill time, so the share printed is an upper bound). Target <= 1%.
 *    Skipped (reported) without a model file.
 */
#include "gguf.h"
#include "index.h"
#include "model.h"

#include <openssl/opensslv.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BT 16
#define N_BLOCKS 2048

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void machine_info(void)
{
	char line[256], cpu[256] = "?";
	FILE *f = fopen("/proc/cpuinfo", "r");
	while (f && fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "model name", 10)) {
			char *p = strchr(line, ':');
			snprintf(cpu, sizeof(cpu), "%s", p ? p + 2 : line);
			cpu[strcspn(cpu, "\n")] = '\0';
			break;
		}
	}
	if (f)
		fclose(f);
	printf("machine: %s, %ld CPUs online; SQLite %s; %s\n", cpu, sysconf(_SC_NPROCESSORS_ONLN), sqlite3_libversion(),
	       OPENSSL_VERSION_TEXT);
}

static void fill_tokens(int32_t *t, uint32_t n, uint64_t seed)
{
	uint64_t s = seed | 1;
	for (uint32_t i = 0; i < n; i++) {
		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		t[i] = (int32_t)(s % 49152);
	}
}

static kvt_btable *build_table(const uint8_t root[32], const int32_t *toks, uint32_t n_blocks)
{
	kvt_btable *bt;
	uint8_t(*h)[32] = malloc((size_t)n_blocks * 32);
	uint32_t n;
	if (!h || kvt_btable_create(BT, n_blocks, &bt) || kvt_hash_chain(root, toks, n_blocks * BT, BT, h, n_blocks, &n))
		exit(1);
	for (uint32_t i = 0; i < n; i++) {
		if (kvt_btable_insert(bt, h[i], i ? h[i - 1] : root, toks + (size_t)i * BT, NULL))
			exit(1);
		kvt_btable_set_slot(bt, h[i], KVT_TIER_HOST, (int32_t)i);
	}
	free(h);
	return bt;
}

/* Lookup (pin + touch) then unpin; returns seconds. */
static double lookup_once(kvt_btable *bt, const uint8_t root[32], const int32_t *toks, uint32_t n_tokens,
			  kvt_btable_match *m, uint8_t (*mh)[32], uint32_t *n_matched)
{
	uint32_t nh, nm;
	double t0 = kvt_now_s();
	if (kvt_btable_lookup(bt, root, toks, n_tokens, KVT_BT_PIN | KVT_BT_TOUCH, m, N_BLOCKS, &nh, &nm))
		exit(1);
	for (uint32_t i = 0; i < nm; i++)
		memcpy(mh[i], m[i].hash, 32);
	kvt_btable_unpin_n(bt, (const uint8_t(*)[32])mh, nm);
	double t = kvt_now_s() - t0;
	*n_matched = nm;
	return t;
}

static double bench_inserts(const char *dir, uint32_t max_batch, uint32_t n_rows, const char *name)
{
	char path[512];
	kvt_db_config c;
	kvt_db *db;
	kvt_db_block_row r;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	memset(&c, 0, sizeof(c));
	c.path = path;
	c.create = true;
	c.max_batch = max_batch;
	memset(c.ns.model_fp, 7, 32);
	c.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	c.ns.block_tokens = BT;
	if (kvt_db_open(&c, &db))
		exit(1);
	memset(&r, 0, sizeof(r));
	r.n_tokens = BT;
	r.loc.extent_bytes = 376832;
	r.raw_bytes = 368640;
	double t0 = kvt_now_s();
	uint8_t prev[32] = { 0 }, chain_root[32];
	memset(chain_root, 0x5a, 32);
	for (uint32_t i = 0; i < n_rows; i++) {
		/* chains of 64 blocks with SHA-256 hashes (random keys), as real rows have */
		int32_t key[2] = { (int32_t)i, (int32_t)max_batch };
		memcpy(r.parent, i % 64 ? prev : chain_root, 32);
		kvt_hash_block(r.parent, key, 2, r.hash);
		memcpy(prev, r.hash, 32);
		r.loc.off = 4096 + (uint64_t)i * 376832;
		fill_tokens(r.tokens, BT, i + 1);
		if (kvt_db_put_block(db, &r, NULL, NULL, NULL))
			exit(1);
	}
	if (kvt_db_flush(db))
		exit(1);
	double t = kvt_now_s() - t0;
	kvt_db_stats st;
	kvt_db_get_stats(db, &st);
	printf("  %-28s %6u rows in %8.3f s = %9.0f rows/s (%llu transactions, largest %llu rows, mean COMMIT %.3f ms)\n",
	       max_batch == 1 ? "one transaction per row:" : "group commit:", n_rows, t, n_rows / t,
	       (unsigned long long)st.n_commits, (unsigned long long)st.max_batch_seen,
	       st.n_commits ? 1e3 * st.commit_s / st.n_commits : 0.0);
	kvt_db_close(db);
	unlink(path);
	return n_rows / t;
}

int main(int argc, char **argv)
{
	const char *model = getenv("KVTIER_MODEL"), *dir = "/tmp";
	int threads = 0;
	uint32_t resume_tokens = 512;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--model"))
			model = argv[i + 1];
		else if (!strcmp(argv[i], "--threads"))
			threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--resume-tokens"))
			resume_tokens = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--dir"))
			dir = argv[i + 1];
		else {
			fprintf(stderr, "usage: bench_index [--model M.gguf] [--threads N] [--resume-tokens N] [--dir D]\n");
			return 2;
		}
	}
	if (!model || !*model)
		model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
	if (resume_tokens < BT || resume_tokens > N_BLOCKS * BT) {
		fprintf(stderr, "bench_index: --resume-tokens must be in %d..%d\n", BT, N_BLOCKS * BT);
		return 2;
	}
	machine_info();

	/* ---- 1. prefix lookup ---- */
	static int32_t toks[N_BLOCKS * BT + 7];
	uint8_t fp[32], salt[32], root[32];
	memset(fp, 0x11, 32);
	memset(salt, 0x22, 32);
	kvt_hash_root(fp, KVT_KV_LAYOUT_VERSION, BT, salt, root);
	fill_tokens(toks, N_BLOCKS * BT + 7, 42);
	kvt_btable *bt = build_table(root, toks, N_BLOCKS);
	kvt_btable_match *m = malloc(sizeof(*m) * N_BLOCKS);
	uint8_t(*mh)[32] = malloc(32 * N_BLOCKS);
	uint8_t(*hh)[32] = malloc(32 * N_BLOCKS);
	double t_look[101], t_hash[101];
	uint32_t nm = 0, n;
	for (int r = -5; r < 101; r++) { /* 5 warm-ups */
		double t = lookup_once(bt, root, toks, N_BLOCKS * BT + 7, m, mh, &nm);
		double t0 = kvt_now_s();
		kvt_hash_chain(root, toks, N_BLOCKS * BT, BT, hh, N_BLOCKS, &n);
		double th = kvt_now_s() - t0;
		if (r >= 0) {
			t_look[r] = t;
			t_hash[r] = th;
		}
	}
	if (nm != N_BLOCKS) {
		fprintf(stderr, "bench_index: lookup matched %u of %d blocks\n", nm, N_BLOCKS);
		return 1;
	}
	double look = median(t_look, 101), hash = median(t_hash, 101);
	printf("\n1. prefix lookup, %d-block conversation (%d tokens), pin + touch + unpin, median of 101:\n",
	       N_BLOCKS, N_BLOCKS * BT);
	printf("  lookup %.3f ms = %.3f us/block (target <= 5 us/block: %.2fx of the target)\n", look * 1e3,
	       look * 1e6 / N_BLOCKS, look * 1e6 / N_BLOCKS / 5.0);
	printf("  baseline, the chained SHA-256 alone: %.3f us/block; lookup / hashing = %.2fx\n",
	       hash * 1e6 / N_BLOCKS, look / hash);

	/* ---- 2. durable inserts ---- */
	printf("\n2. durable index inserts (synchronous=FULL, WAL) in %s:\n", dir);
	double one = bench_inserts(dir, 1, 300, "bench_one.sqlite");
	double grp = bench_inserts(dir, 0, 20000, "bench_group.sqlite");
	printf("  group commit / one per row = %.1fx (target >= 50x)\n", grp / one);

	/* ---- 3. index share of a resume ---- */
	printf("\n3. index time as a share of a resume (%u tokens, %u full blocks):\n", resume_tokens, resume_tokens / BT);
	char ipath[512];
	snprintf(ipath, sizeof(ipath), "%s/bench_resume.sqlite", dir);
	kvt_db_config c;
	kvt_db *db;
	memset(&c, 0, sizeof(c));
	c.path = ipath;
	c.create = true;
	memcpy(c.ns.model_fp, fp, 32);
	c.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	c.ns.block_tokens = BT;
	if (kvt_db_open(&c, &db))
		return 1;
	kvt_db_session s;
	memset(&s, 0, sizeof(s));
	snprintf(s.id, sizeof(s.id), "conv-1");
	snprintf(s.tenant, sizeof(s.tenant), "tenant-a");
	s.tokens = toks;
	s.n_tokens = resume_tokens;
	if (kvt_db_put_session(db, &s, NULL, NULL, NULL) || kvt_db_flush(db))
		return 1;
	double t_idx[31];
	for (int r = -3; r < 31; r++) {
		kvt_db_session g;
		uint8_t rt[32];
		double t0 = kvt_now_s();
		if (kvt_db_get_session(db, "tenant-a", "conv-1", &g))
			return 1;
		kvt_hash_root(fp, KVT_KV_LAYOUT_VERSION, BT, salt, rt);
		lookup_once(bt, rt, g.tokens, g.n_tokens, m, mh, &nm);
		double t = kvt_now_s() - t0;
		kvt_db_session_deinit(&g);
		if (r >= 0)
			t_idx[r] = t;
	}
	double idx = median(t_idx, 31);
	kvt_db_close(db);
	unlink(ipath);
	printf("  index work (session read + hashes + lookup/pin/unpin): %.3f ms (%u blocks matched)\n", idx * 1e3, nm);
	if (access(model, R_OK) != 0) {
		printf("  prefill: model %s not found; pass --model (share not measured)\n", model);
	} else {
		kvt_gguf *g;
		kvt_dev *dev;
		kvt_model *mdl;
		kvt_t0_pool *pool;
		kvt_kv_layout shape;
		kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = threads };
		kvt_model_config mc;
		kvt_model_config_default(&mc);
		mc.max_ctx = resume_tokens + 16;
		if (kvt_gguf_open(model, &g) || kvt_dev_create(&dc, &dev) || kvt_model_load(dev, g, &mc, &mdl))
			return 1;
		kvt_gguf_close(g);
		kvt_model_kv_shape(mdl, BT, &shape);
		if (kvt_t0_create(dev, &shape, mc.max_ctx / BT + 2, &pool))
			return 1;
		uint32_t V = kvt_model_hparams_get(mdl)->n_vocab;
		float *logits = malloc(V * sizeof(float));
		kvt_seq sq;
		kvt_seq_init(&sq, dev, pool, mc.max_ctx);
		int32_t *ptoks = malloc(resume_tokens * sizeof(int32_t));
		for (uint32_t i = 0; i < resume_tokens; i++)
			ptoks[i] = toks[i] % (int32_t)V;
		double t_pre[2];
		for (int r = -1; r < 2; r++) {
			kvt_seq_reset(&sq);
			double t0 = kvt_now_s();
			if (kvt_model_forward(mdl, &sq, ptoks, resume_tokens, logits, 1))
				return 1;
			if (r >= 0)
				t_pre[r] = kvt_now_s() - t0;
		}
		double pre = median(t_pre, 2);
		printf("  prefill of the same %u tokens on %s (%s, %d threads): %.1f ms (%.0f tok/s)\n", resume_tokens, model,
		       kvt_dev_name(dev), kvt_dev_n_threads(dev), pre * 1e3, resume_tokens / pre);
		printf("  index / prefill = %.4f%% (target <= 1%%)\n", 100.0 * idx / pre);
		double pre_full = pre * (double)(N_BLOCKS * BT) / resume_tokens;
		printf("  2,048-block conversation: lookup %.3f ms vs prefill >= %.1f s at that rate: <= %.4f%%\n", look * 1e3,
		       pre_full, 100.0 * look / pre_full);
		free(ptoks);
		free(logits);
		kvt_seq_deinit(&sq);
		kvt_t0_destroy(pool);
		kvt_model_destroy(mdl);
		kvt_dev_destroy(dev);
	}
	free(m);
	free(mh);
	free(hh);
	kvt_btable_destroy(bt);
	return 0;
}
