/* ctest-labels: unit */
/*
 * tests/test_manager_share.c — the chunk share of the tiering manager
 * (manager.h, "Chunk share") over the real pieces: the CPU device, a T0
 * pool, the block table and a real T1 pool, small (8 T0 and 32 T1 slots);
 * no NVMe tier, so a block T1 evicts is dropped.
 *
 * Prefix blocks are chains under a conversation root (kvt_tm_register);
 * chunk blocks chains under a chunk root (kvt_tm_register_kind, as the
 * scheduler stores a document span). Each chain is pushed out of T0 into T1
 * (kvt_tm_reserve_t0) and T1 is kept at its watermarks (kvt_tm_maintain:
 * over 90% of its slots, evicted to 75%, 24 blocks).
 *  - flood of documents: T1 full of prefix blocks, then chunk chains far
 *    more than T1 holds. With chunk_share 0.5, once chunks hold half, chunk
 *    blocks go and the prefix blocks keep at least half of what T1 keeps
 *    after every pass that made room (at least 12 of the 24).
 *  - the reverse: T1 full of chunk blocks, then a flood of conversations;
 *    the chunk blocks keep their half.
 *  - share 0.25: the chunk blocks keep at most a quarter under a flood.
 *  - share 1 (chunks may take the whole tier): the same flood pushes every
 *    prefix block out, as plain LRU would: the baseline the share guards.
 * Each case prints the counts it measured, checks the manager's and the
 * table's invariants after every pass, and that evictions by kind add up.
 *  - T2: behind the same T1, a T2 file of 256 KiB (about 60 records, and
 *    the index, in a temp dir) takes what T1 evicts; 12 conversations, then
 *    a flood of 60 documents: after every pass that evicted from T2, chunk
 *    records hold at most half of what T2 keeps.
 *  - restart: with a T2 file and the index (2 MB, a temp dir), the blocks
 *    persisted come back from kvt_tm_recover with their kinds (the index
 *    row's kind, schema 5), counted per kind in T2; and again after the
 *    index is rebuilt from the T2 records alone (kvt_index_rebuild: the
 *    record's flags, KVT_T2_FLAG_CHUNK).
 */
#include "check.h"
#include "cli_index.h"
#include "test_dev.h"
#include "tm_fixture.h"
#include "manager.h"

#include <unistd.h>

#define BT 16     /* tokens per block */
#define N_T0 8    /* T0 slots */
#define N_T1 32   /* T1 slots */
#define CH_LEN 4  /* blocks per chain */
#define N_CHAINS 64 /* chains of each kind the cases draw from */

static const kvt_kv_layout shape = { .n_layers = 1, .n_kv_heads = 1, .head_dim = 32, .block_tokens = BT };
static uint8_t model_fp[32] = { 5, 7, 5 };
static uint8_t roots[KVT_BLOCK_KIND_COUNT][32];                         /* conversation root, chunk root */
static int32_t toks[KVT_BLOCK_KIND_COUNT][N_CHAINS][CH_LEN * BT];       /* each chain's tokens */
static uint8_t hashes[KVT_BLOCK_KIND_COUNT][N_CHAINS][CH_LEN][32];      /* their chained hashes */
static char dir[256], t2_path[300], db_path[300];                       /* the restart case's files */

typedef struct fixture {
	kvt_dev *dev;    /* the test device */
	kvt_t0_pool *t0; /* T0 */
	kvt_btable *bt;  /* the table */
	kvt_tm *tm;      /* the manager, with its T1 pool */
} fixture;

static void make_chains(void)
{
	check_rng rng = { 1234 };
	uint8_t salt[32] = { 0 };
	uint32_t n;
	for (int k = 0; k < KVT_BLOCK_KIND_COUNT; k++) {
		salt[0] = (uint8_t)k; /* the chunk root differs from the conversations' root */
		CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt, roots[k]) == KVT_OK);
		for (int c = 0; c < N_CHAINS; c++) {
			for (int i = 0; i < CH_LEN * BT; i++)
				toks[k][c][i] = (int32_t)(check_rng_u64(&rng) % 30000);
			CHECK(kvt_hash_chain(roots[k], toks[k][c], CH_LEN * BT, BT, hashes[k][c], CH_LEN, &n) == KVT_OK &&
			      n == CH_LEN);
		}
	}
}

static int fx_open(fixture *f, float chunk_share)
{
	memset(f, 0, sizeof(*f));
	if (tm_fx_base(&shape, N_T0, &f->dev, &f->t0, &f->bt))
		return 1;
	kvt_tm_config c;
	tm_fx_config(&c, f->dev, f->t0, f->bt, NULL, NULL, N_T1, KVT_KV_CODEC_F16);
	c.high[KVT_TIER_HBM] = 1.0f;
	c.high[KVT_TIER_HOST] = 0.9f;
	c.low[KVT_TIER_HOST] = 0.75f;
	c.batch_blocks = 4;
	c.chunk_share = chunk_share;
	return kvt_tm_create(&c, &f->tm) != KVT_OK;
}

static void fx_close(fixture *f)
{
	tm_fx_free(f->tm, NULL, NULL, f->bt, f->t0, f->dev);
}

/* Register chain c of kind k in T0 (the engine's own reference dropped), then push it into T1. */
static void add_chain(kvt_tm *tm, kvt_t0_pool *t0, int k, int c)
{
	for (int b = 0; b < CH_LEN; b++) {
		int32_t s;
		if (kvt_t0_alloc(t0, &s) != KVT_OK) {
			CHECK(kvt_tm_reserve_t0(tm, 1) == KVT_OK);
			CHECK(kvt_t0_alloc(t0, &s) == KVT_OK);
		}
		const uint8_t *parent = b ? hashes[k][c][b - 1] : roots[k];
		CHECK(kvt_tm_register_kind(tm, hashes[k][c][b], parent, toks[k][c] + b * BT, s, k) == KVT_OK);
		kvt_t0_unref(t0, s);
	}
	CHECK(kvt_tm_reserve_t0(tm, N_T0) == KVT_OK);
}

/* T1's blocks by kind, and its evictions so far (in all, and by kind). */
static void t1_counts(fixture *f, uint64_t n_kind[KVT_BLOCK_KIND_COUNT], uint64_t *n_evicted)
{
	kvt_tm_stats st;
	kvt_tm_get_stats(f->tm, &st);
	const kvt_tm_tier_stats *t1 = &st.tier[KVT_TIER_HOST];
	for (int k = 0; k < KVT_BLOCK_KIND_COUNT; k++)
		n_kind[k] = t1->n_blocks_by_kind[k];
	*n_evicted = t1->n_evictions;
	CHECK(t1->n_evictions_by_kind[KVT_BLOCK_PREFIX] + t1->n_evictions_by_kind[KVT_BLOCK_CHUNK] == t1->n_evictions);
	CHECK(t1->used_blocks == n_kind[KVT_BLOCK_PREFIX] + n_kind[KVT_BLOCK_CHUNK]); /* T1 holds table blocks only */
}

typedef struct flood_result {
	uint64_t min_kept;  /* the fewest blocks of the resident kind T1 held once the flood began */
	uint64_t final[KVT_BLOCK_KIND_COUNT]; /* T1's blocks by kind after the last pass that made room */
	uint32_t n_passes;  /* maintenance passes that made room */
	uint32_t n_bad;     /* passes after which a kind held more than its share of what T1 kept */
} flood_result;

/*
 * T1 filled with 7 chains (28 blocks) of kind `resident`, then n_flood
 * chains of the other kind, one at a time, each followed by a maintenance
 * pass. After every pass that made room, the flooding kind must hold at
 * most its share (floor(share x blocks kept)) and the resident kind the rest.
 */
static void flood(float share, int resident, int n_flood, flood_result *r)
{
	const int other = 1 - resident;
	const float share_of[KVT_BLOCK_KIND_COUNT] = { 1.0f - share, share };
	fixture f;
	uint64_t n[KVT_BLOCK_KIND_COUNT], ev0, ev1;
	memset(r, 0, sizeof(*r));
	CHECK(fx_open(&f, share) == 0);
	for (int c = 0; c < 7; c++)
		add_chain(f.tm, f.t0, resident, c);
	kvt_tm_maintain(f.tm);
	t1_counts(&f, n, &ev0);
	CHECKF(n[resident] == 7 * CH_LEN && n[other] == 0 && ev0 == 0, "T1 holds %llu + %llu blocks, %llu evicted",
	       (unsigned long long)n[resident], (unsigned long long)n[other], (unsigned long long)ev0);
	r->min_kept = n[resident];
	for (int c = 0; c < n_flood && c < N_CHAINS; c++) {
		add_chain(f.tm, f.t0, other, c);
		t1_counts(&f, n, &ev0);
		kvt_tm_maintain(f.tm);
		t1_counts(&f, n, &ev1);
		CHECK(kvt_tm_check(f.tm) == KVT_OK);
		if (n[resident] < r->min_kept)
			r->min_kept = n[resident];
		if (ev1 == ev0)
			continue;
		r->n_passes++;
		r->final[resident] = n[resident];
		r->final[other] = n[other];
		const uint64_t kept = n[resident] + n[other];
		if (n[other] > (uint64_t)(share_of[other] * (double)kept)) {
			r->n_bad++;
			printf("  share %.2f: after pass %u, %llu of %llu T1 blocks are of the flooding kind\n", share,
			       r->n_passes, (unsigned long long)n[other], (unsigned long long)kept);
		}
	}
	kvt_tm_stats st;
	kvt_tm_get_stats(f.tm, &st);
	const kvt_tm_tier_stats *t1 = &st.tier[KVT_TIER_HOST];
	printf("share %.2f, T1 of %d blocks full of %s blocks, %d %s chains (%d blocks) arrive: %u passes made room; "
	       "fewest %s blocks kept %llu; after the last pass %llu prefix + %llu chunk blocks (at the end %llu + %llu); "
	       "T1 evicted %llu prefix, %llu chunk blocks\n",
	       share, N_T1, resident == KVT_BLOCK_PREFIX ? "prefix" : "chunk", n_flood,
	       other == KVT_BLOCK_PREFIX ? "prefix" : "chunk", n_flood * CH_LEN, r->n_passes,
	       resident == KVT_BLOCK_PREFIX ? "prefix" : "chunk", (unsigned long long)r->min_kept,
	       (unsigned long long)r->final[KVT_BLOCK_PREFIX], (unsigned long long)r->final[KVT_BLOCK_CHUNK],
	       (unsigned long long)n[KVT_BLOCK_PREFIX], (unsigned long long)n[KVT_BLOCK_CHUNK],
	       (unsigned long long)t1->n_evictions_by_kind[KVT_BLOCK_PREFIX],
	       (unsigned long long)t1->n_evictions_by_kind[KVT_BLOCK_CHUNK]);
	CHECK(st.chunk_share == share);
	fx_close(&f);
}

/* A T2 file and the index in the temp dir (reset: made anew), and a manager over them; 0, or 1 on failure. */
static int fx_open_t2(tm_fx *f, bool reset, uint64_t capacity_bytes)
{
	memset(f, 0, sizeof(*f));
	if (tm_fx_base(&shape, N_T0, &f->dev, &f->t0, &f->bt))
		return 1;
	kvt_t2_config tc = { .path = t2_path, .capacity_bytes = capacity_bytes, .io_mode = KVT_T2_IO_AUTO, .reset = reset,
			     .buffered_ok = true };
	memcpy(tc.model_fp, model_fp, 32);
	tc.max_raw_bytes = (uint32_t)kvt_kv_packed_bytes(&shape, KVT_KV_CODEC_F16); /* sizes capacity_blocks */
	if (kvt_t2_open(&tc, &f->t2) || tm_fx_db_open(db_path, model_fp, BT, &f->db))
		return 1;
	kvt_tm_config c;
	tm_fx_config(&c, f->dev, f->t0, f->bt, f->t2, f->db, N_T1, KVT_KV_CODEC_F16);
	c.high[KVT_TIER_HOST] = 0.9f;
	c.low[KVT_TIER_HOST] = 0.75f;
	c.batch_blocks = 4;
	return kvt_tm_create(&c, &f->tm) != KVT_OK;
}

static void t2_flood(void)
{
	tm_fx f;
	kvt_tm_stats st;
	uint32_t n_passes = 0, n_bad = 0;
	uint64_t min_prefix = UINT64_MAX, last[KVT_BLOCK_KIND_COUNT] = { 0 };
	CHECK(fx_open_t2(&f, true, 256u << 10) == 0);
	for (int c = 0; c < 12; c++) {
		add_chain(f.tm, f.t0, KVT_BLOCK_PREFIX, c);
		kvt_tm_maintain(f.tm);
	}
	for (int c = 0; c < 60; c++) {
		add_chain(f.tm, f.t0, KVT_BLOCK_CHUNK, c);
		kvt_tm_get_stats(f.tm, &st);
		uint64_t ev0 = st.tier[KVT_TIER_NVME].n_evictions;
		kvt_tm_maintain(f.tm);
		CHECK(kvt_tm_check(f.tm) == KVT_OK);
		kvt_tm_get_stats(f.tm, &st);
		const kvt_tm_tier_stats *t2 = &st.tier[KVT_TIER_NVME];
		uint64_t p = t2->n_blocks_by_kind[KVT_BLOCK_PREFIX], ch = t2->n_blocks_by_kind[KVT_BLOCK_CHUNK];
		CHECK(t2->used_blocks == p + ch); /* the records are the table's (one namespace) */
		CHECK(t2->n_evictions_by_kind[KVT_BLOCK_PREFIX] + t2->n_evictions_by_kind[KVT_BLOCK_CHUNK] ==
		      t2->n_evictions);
		if (t2->n_evictions == ev0)
			continue;
		n_passes++;
		last[KVT_BLOCK_PREFIX] = p;
		last[KVT_BLOCK_CHUNK] = ch;
		if (p < min_prefix)
			min_prefix = p;
		n_bad += ch > (p + ch) / 2;
	}
	const kvt_tm_tier_stats *t2 = &st.tier[KVT_TIER_NVME];
	printf("T2 of %llu records: 12 prefix chains, then 60 chunk chains: %u passes evicted from T2; after the last "
	       "%llu prefix + %llu chunk records (fewest prefix %llu); T2 evicted %llu prefix, %llu chunk blocks\n",
	       (unsigned long long)t2->capacity_blocks, n_passes, (unsigned long long)last[KVT_BLOCK_PREFIX],
	       (unsigned long long)last[KVT_BLOCK_CHUNK], (unsigned long long)min_prefix,
	       (unsigned long long)t2->n_evictions_by_kind[KVT_BLOCK_PREFIX],
	       (unsigned long long)t2->n_evictions_by_kind[KVT_BLOCK_CHUNK]);
	CHECK(n_passes >= 5);
	CHECK_EQ_INT(n_bad, 0);
	CHECK(last[KVT_BLOCK_PREFIX] >= last[KVT_BLOCK_CHUNK] && last[KVT_BLOCK_CHUNK] > 0);
	tm_fx_close(&f);
}

/* Recover the index into a fresh manager: every block back, of its kind. */
static void recover_kinds(const char *what)
{
	tm_fx f;
	kvt_tm_stats st;
	uint64_t n = 0;
	CHECK(fx_open_t2(&f, false, 2u << 20) == 0);
	CHECK(kvt_tm_recover(f.tm, &n) == KVT_OK);
	CHECK_EQ_INT(n, 5 * CH_LEN);
	kvt_tm_get_stats(f.tm, &st);
	const uint64_t *by_kind = st.tier[KVT_TIER_NVME].n_blocks_by_kind;
	printf("%s: %llu blocks recovered, %llu prefix + %llu chunk blocks in T2\n", what, (unsigned long long)n,
	       (unsigned long long)by_kind[KVT_BLOCK_PREFIX], (unsigned long long)by_kind[KVT_BLOCK_CHUNK]);
	CHECK(by_kind[KVT_BLOCK_PREFIX] == 3 * CH_LEN && by_kind[KVT_BLOCK_CHUNK] == 2 * CH_LEN);
	kvt_btable_entry e;
	CHECK(kvt_btable_get(f.bt, hashes[KVT_BLOCK_CHUNK][1][CH_LEN - 1], &e) == KVT_OK && e.kind == KVT_BLOCK_CHUNK);
	CHECK(kvt_btable_get(f.bt, hashes[KVT_BLOCK_PREFIX][2][0], &e) == KVT_OK && e.kind == KVT_BLOCK_PREFIX);
	CHECK(kvt_btable_check(f.bt) == KVT_OK);
	tm_fx_close(&f);
}

static void restart(void)
{
	tm_fx f;
	CHECK(fx_open_t2(&f, true, 2u << 20) == 0);
	for (int c = 0; c < 3; c++)
		add_chain(f.tm, f.t0, KVT_BLOCK_PREFIX, c);
	for (int c = 0; c < 2; c++)
		add_chain(f.tm, f.t0, KVT_BLOCK_CHUNK, c);
	CHECK(kvt_tm_flush(f.tm) == KVT_OK);
	kvt_tm_stats st;
	kvt_tm_get_stats(f.tm, &st);
	CHECK(st.tier[KVT_TIER_NVME].n_blocks_by_kind[KVT_BLOCK_PREFIX] == 3 * CH_LEN &&
	      st.tier[KVT_TIER_NVME].n_blocks_by_kind[KVT_BLOCK_CHUNK] == 2 * CH_LEN);
	tm_fx_close(&f);
	recover_kinds("restart");
	/* the index lost: rebuilt from the records, the kinds come from their flags */
	kvt_rebuild_stats rs;
	CHECK(kvt_index_rebuild(dir, model_fp, &rs) == KVT_OK);
	CHECK_EQ_INT(rs.n_rows, 5 * CH_LEN);
	recover_kinds("rebuild-index, then restart");
}

int main(void)
{
	int probe_rc = test_dev_probe("test_manager_share");
	if (probe_rc >= 0)
		return probe_rc;
	make_chains();
	flood_result r;
	const uint64_t low = (uint64_t)(0.75f * N_T1); /* T1 keeps 24 blocks after a pass */

	/* documents flood conversations: chunks are held to half, the prefix blocks keep theirs */
	flood(0.5f, KVT_BLOCK_PREFIX, 40, &r);
	CHECK(r.n_passes >= 10);
	CHECK_EQ_INT(r.n_bad, 0);
	CHECKF(r.min_kept >= low / 2, "prefix blocks fell to %llu (half of %llu kept is %llu)",
	       (unsigned long long)r.min_kept, (unsigned long long)low, (unsigned long long)(low / 2));
	CHECK(r.final[KVT_BLOCK_PREFIX] == low / 2 && r.final[KVT_BLOCK_CHUNK] == low / 2); /* chunks got their half */

	/* the reverse: conversations flood documents */
	flood(0.5f, KVT_BLOCK_CHUNK, 40, &r);
	CHECK(r.n_passes >= 10);
	CHECK_EQ_INT(r.n_bad, 0);
	CHECKF(r.min_kept >= low / 2, "chunk blocks fell to %llu (half of %llu kept is %llu)",
	       (unsigned long long)r.min_kept, (unsigned long long)low, (unsigned long long)(low / 2));
	CHECK(r.final[KVT_BLOCK_CHUNK] == low / 2 && r.final[KVT_BLOCK_PREFIX] == low / 2);

	/* a quarter for documents */
	flood(0.25f, KVT_BLOCK_PREFIX, 40, &r);
	CHECK_EQ_INT(r.n_bad, 0);
	CHECK(r.min_kept >= low * 3 / 4);
	CHECK(r.final[KVT_BLOCK_CHUNK] == low / 4 && r.final[KVT_BLOCK_PREFIX] == low * 3 / 4);

	/* share 1: nothing holds the documents back; every prefix block goes, as with plain LRU */
	flood(1.0f, KVT_BLOCK_PREFIX, 40, &r);
	CHECK_EQ_INT(r.final[KVT_BLOCK_PREFIX], 0);

	/* a bad share is refused */
	fixture f;
	check_log_capture();
	CHECK(fx_open(&f, 1.5f) == 1);
	CHECK(strstr(check_log_text, "chunk_share 1.5") != NULL);
	kvt_log_set_sink(NULL, NULL);
	tm_fx_free(NULL, NULL, NULL, f.bt, f.t0, f.dev);

	snprintf(dir, sizeof(dir), "/tmp/kvt_tmshare_XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(t2_path, sizeof(t2_path), "%s/kvtier.t2", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);
	t2_flood();
	unlink(t2_path);
	unlink(db_path);
	restart();
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return check_done("test_manager_share");
}
