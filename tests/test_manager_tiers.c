/* ctest-labels: unit integration */
/*
 * tests/test_manager_tiers.c — the tiering manager over the real pieces: the
 * CPU device, the T0 pool, the index's block table and SQLite index, and the
 * T2 store on a real file in a temp dir (faults only through the store's
 * I/O ops table).
 *
 * For every codec (f16, fp8, int8):
 *  - round trip through every tier: T0 -> T1 (demotion by eviction) -> T0;
 *    T0 -> T2 (end-of-turn write-through) -> T1 -> T0; T1 -> T2 by
 *    write-back on T1 eviction -> T0. f16 comes back bit for bit, FP8 and
 *    INT8 within the bound documented in tiers.h (s: the scale of the
 *    element's group), on every element;
 *  - durability ordering: a block is clean in the table only once its row
 *    is in the index; after a restart (new table, reopened store and index,
 *    kvt_tm_recover) every persisted block promotes and matches.
 * Then, once (fp8):
 *  - eviction order: coldest leaf first, parents after children; a pinned
 *    block is never demoted and its slot stays held;
 *  - a flipped byte in a record: promotion says KVT_ECORRUPT, counts it, and
 *    the block's row is deleted (never served);
 *  - a failed fdatasync: the store turns read-only, flush says KVT_EIO, the
 *    manager reports T2 degraded and keeps serving from T0/T1;
 *  - bad configs are refused with a named error.
 * A turn's owner is told how far its chain is durable (kvt_tm_end_turn_chain's
 * done), once, with the rows committed, and at shutdown.
 * And an INT8 record of the old scale layout (one scale per token and head,
 * before INT8 took one per 32 dims) is a logged miss, never decoded.
 */
#include "check.h"
#include "test_dev.h"
#include "tm_fixture.h"
#include "manager.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

#define BT 16        /* tokens per block */
#define N_T0 8       /* T0 slots */
#define N_T1 6       /* T1 slots */
#define N_CHAIN 6    /* blocks in the test chain */

static const kvt_kv_layout shape = { .n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_tokens = BT };
static char dir[256], t2_path[300], db_path[300];
static uint8_t model_fp[32] = { 7, 7, 7 };
static uint64_t t2_capacity = 4u << 20; /* bytes of the T2 file */

static atomic_int sync_fail; /* next fdatasync fails */
static int f_fdatasync(void *ctx, int fd)
{
	if (atomic_exchange(&sync_fail, 0)) {
		errno = EIO;
		return -1;
	}
	return fdatasync(fd);
}
static const kvt_t2_io_ops fault_ops = { .fdatasync = f_fdatasync };

typedef tm_fx fixture;

static bool fx_t2_f16; /* kvt_tm_config.t2_f16 of the next fx_open */

static int fx_open(fixture *f, int codec, bool reset, int persist, float t1_high, float t1_low)
{
	memset(f, 0, sizeof(*f));
	if (tm_fx_base(&shape, N_T0, &f->dev, &f->t0, &f->bt))
		return 1;
	kvt_t2_config tc = { .path = t2_path, .capacity_bytes = t2_capacity, .io_mode = KVT_T2_IO_AUTO,
			     .compress = true, .reset = reset, .buffered_ok = true, .io = &fault_ops };
	memcpy(tc.model_fp, model_fp, 32);
	if (kvt_t2_open(&tc, &f->t2) || tm_fx_db_open(db_path, model_fp, BT, &f->db))
		return 1;
	kvt_tm_config c;
	tm_fx_config(&c, f->dev, f->t0, f->bt, f->t2, f->db, N_T1, codec);
	c.persist = persist;
	c.t2_f16 = fx_t2_f16;
	c.batch_blocks = 4;
	/* deterministic: the test drives eviction itself (watermarks never crossed, slow poll) */
	c.high[KVT_TIER_HBM] = c.high[KVT_TIER_NVME] = 1.0f;
	c.high[KVT_TIER_HOST] = t1_high;
	c.low[KVT_TIER_HOST] = t1_low;
	return kvt_tm_create(&c, &f->tm) != KVT_OK;
}

/* The test chain: tokens, hashes, and the fp16 contents of each block (KV-like magnitudes per head). */
static int32_t toks[N_CHAIN * BT];
static uint8_t root[32], hashes[N_CHAIN][32];
static uint16_t *data; /* [N_CHAIN][block elements] */
static size_t n_el;

static void make_chain(void)
{
	check_rng rng = { 99 };
	uint8_t salt[32] = { 0 };
	uint32_t n;
	for (int i = 0; i < N_CHAIN * BT; i++)
		toks[i] = (int32_t)(check_rng_u64(&rng) % 30000);
	CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt, root) == KVT_OK);
	CHECK(kvt_hash_chain(root, toks, N_CHAIN * BT, BT, hashes, N_CHAIN, &n) == KVT_OK && n == N_CHAIN);
	n_el = kvt_kv_block_bytes(&shape) / 2;
	data = malloc(N_CHAIN * n_el * 2);
	const uint32_t per = BT * shape.head_dim;
	for (int b = 0; b < N_CHAIN; b++)
		for (size_t v = 0; v < n_el / per; v++) {
			float mag = powf(10.0f, (float)(check_rng_u64(&rng) % 4) - 2.0f);
			for (uint32_t i = 0; i < per; i++)
				data[b * n_el + v * per + i] = kvt_f32_to_f16(check_rng_f32(&rng) * mag);
		}
}

static const uint8_t *parent_of(int b) { return b ? hashes[b - 1] : root; }

/* The engine computes a block: a fresh T0 slot, its bytes, register; the engine then drops its own ref. */
static void engine_compute_block(fixture *f, const uint8_t *hash, const uint8_t *parent, const int32_t *tokens,
				 const uint16_t *bytes)
{
	int32_t s;
	if (kvt_t0_alloc(f->t0, &s) != KVT_OK) {
		CHECK(kvt_tm_reserve_t0(f->tm, 1) == KVT_OK);
		CHECK(kvt_t0_alloc(f->t0, &s) == KVT_OK);
	}
	CHECK(kvt_dev_copy_h2d(f->dev, (char *)kvt_t0_layout(f->t0)->pool + (size_t)s * n_el * 2, bytes, n_el * 2) ==
	      KVT_OK);
	CHECK(kvt_tm_register(f->tm, hash, parent, tokens, s) == KVT_OK);
	CHECK_EQ_INT(kvt_t0_refcount(f->t0, s), 2);
	kvt_t0_unref(f->t0, s);
}

/* Block b of the test chain. */
static void engine_compute(fixture *f, int b)
{
	engine_compute_block(f, hashes[b], parent_of(b), toks + b * BT, data + b * n_el);
}

/* Compare a T0 slot with block b under codec's bound; returns elements out of bound. */
static int compare_slot(fixture *f, int codec, int32_t s, int b)
{
	uint16_t *out = malloc(n_el * 2);
	const uint16_t *in = data + b * n_el;
	int n_bad = 0;
	CHECK(kvt_dev_copy_d2h(f->dev, out, (char *)kvt_t0_layout(f->t0)->pool + (size_t)s * n_el * 2, n_el * 2) ==
	      KVT_OK);
	/* values per scale: the whole vector (FP8), 32 dims (INT8); f16 needs none */
	const uint32_t D = codec == KVT_KV_CODEC_F16 ? shape.head_dim : kvt_kv_group_dims(codec, shape.head_dim);
	for (size_t v = 0; v < n_el / D; v++) {
		float amax = 0;
		for (uint32_t d = 0; d < D; d++)
			amax = fmaxf(amax, fabsf(kvt_f16_to_f32(in[v * D + d])));
		for (uint32_t d = 0; d < D; d++) {
			size_t i = v * D + d;
			if (codec == KVT_KV_CODEC_F16) {
				n_bad += in[i] != out[i];
				continue;
			}
			double x = kvt_f16_to_f32(in[i]), y = kvt_f16_to_f32(out[i]);
			double r = fmax(ldexp(fabs(y), -11), 0x1p-25);
			double bound = codec == KVT_KV_CODEC_INT8 ? amax / 127.0 / 2 + r
								  : ldexp(fabs(x), -4) + ldexp(amax / 448.0, -10) + r;
			n_bad += fabs(y - x) > bound * (1 + 1e-6);
		}
	}
	free(out);
	return n_bad;
}

/* Promote blocks [b0, b1) and check their bytes; releases the caller refs. */
static void promote_check(fixture *f, int codec, int b0, int b1, const char *what)
{
	int32_t slots[N_CHAIN];
	int res[N_CHAIN];
	int rc = kvt_tm_promote(f->tm, (uint32_t)(b1 - b0), (const uint8_t(*)[32])hashes[b0], slots, res);
	CHECKF(rc == KVT_OK, "%s %s: promote %s", kvt_kv_codec_name(codec), what, kvt_strerror(rc));
	for (int b = b0; b < b1; b++) {
		if (res[b - b0] != KVT_OK)
			continue;
		int bad = compare_slot(f, codec, slots[b - b0], b);
		CHECKF(bad == 0, "%s %s: block %d: %d elements out of bound", kvt_kv_codec_name(codec), what, b, bad);
		kvt_t0_unref(f->t0, slots[b - b0]);
	}
}

static kvt_btable_entry ent(fixture *f, int b)
{
	kvt_btable_entry e;
	memset(&e, 0, sizeof(e));
	if (kvt_btable_get(f->bt, hashes[b], &e) != KVT_OK)
		e.slot[0] = e.slot[1] = e.slot[2] = -2;
	return e;
}

static uint64_t db_rows(fixture *f)
{
	uint64_t n = 0;
	CHECK(kvt_db_count_blocks(f->db, 0, &n) == KVT_OK);
	return n;
}

static void round_trips(int codec)
{
	fixture f;
	CHECK(fx_open(&f, codec, true, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);

	/* 1. T0 -> T1 -> T0: three blocks registered, evicted from T0 (copied to T1), promoted back. */
	for (int b = 0; b < 3; b++)
		engine_compute(&f, b);
	CHECK(kvt_tm_reserve_t0(f.tm, N_T0) == KVT_OK);
	for (int b = 0; b < 3; b++) {
		kvt_btable_entry e = ent(&f, b);
		CHECK(e.slot[KVT_TIER_HBM] < 0 && e.slot[KVT_TIER_HOST] >= 0 && e.dirty);
	}
	promote_check(&f, codec, 0, 3, "T1->T0");
	kvt_tm_stats st;
	kvt_tm_get_stats(f.tm, &st);
	CHECK_EQ_INT(st.tier[KVT_TIER_HBM].n_demotions, 3);
	CHECK_EQ_INT(st.tier[KVT_TIER_HBM].n_promotions, 3);
	CHECK_EQ_INT(st.tier[KVT_TIER_HOST].hits, 3);
	CHECK_EQ_INT(st.tier[KVT_TIER_HBM].misses, 3);
	CHECK(kvt_tm_check(f.tm) == KVT_OK);

	/* 2. end of turn: write-through of the turn's blocks; clean only with the row committed */
	for (int b = 3; b < 5; b++)
		engine_compute(&f, b);
	CHECK_EQ_INT(db_rows(&f), 0);
	double t_end = kvt_now_s();
	kvt_tm_end_turn(f.tm);
	/* The maintenance thread persists within end_turn_s (1 s). That bound is a
	 * latency, measured and printed here and counted by the manager
	 * (n_turn_late), not asserted: a shared CI disk's fdatasync can stall for
	 * seconds. What is asserted is that the turn becomes durable, rows and all. */
	bool all_clean = false;
	while (!all_clean && kvt_now_s() - t_end < 60.0) {
		all_clean = true;
		for (int b = 0; b < 5; b++)
			all_clean &= !ent(&f, b).dirty;
		if (!all_clean)
			usleep(2000);
	}
	double dt = kvt_now_s() - t_end;
	CHECKF(all_clean, "end of turn: not durable after %.3f s", dt);
	CHECK_EQ_INT(db_rows(&f), 5); /* every clean block has its row */
	kvt_tm_get_stats(f.tm, &st);
	CHECK(st.max_turn_s > 0); /* the manager timed the turn */
	printf("%s: end of turn -> durable in %.3f s (manager: max %.3f s, %llu late of the 1 s bound)\n",
	       kvt_kv_codec_name(codec), dt, st.max_turn_s, (unsigned long long)st.n_turn_late);
	for (int b = 0; b < 5; b++)
		CHECK(ent(&f, b).slot[KVT_TIER_NVME] == 0);

	/* 3. T2 -> T1 -> T0: drop the T0 and T1 copies (clean: no I/O), then promote from the file */
	kvt_t2_stats s0, s1;
	kvt_t2_get_stats(f.t2, &s0);
	CHECK(kvt_tm_reserve_t0(f.tm, N_T0) == KVT_OK);
	kvt_t2_get_stats(f.t2, &s1);
	CHECK_EQ_INT(s1.n_writes, s0.n_writes); /* dropping clean T0 copies wrote nothing */
	for (int b = 0; b < 5; b++)
		CHECK(ent(&f, b).slot[KVT_TIER_HBM] < 0);
	kvt_tm_maintain(f.tm); /* nothing over a watermark: no change */
	promote_check(&f, codec, 0, 5, "T2->T0");
	kvt_tm_get_stats(f.tm, &st);
	CHECK(st.tier[KVT_TIER_NVME].hits == 2); /* blocks 3 and 4 were only in T0 and T2 */
	CHECK(st.tier[KVT_TIER_HOST].n_promotions == 2);
	CHECK(st.tier[KVT_TIER_NVME].compression_ratio > 0.0); /* fp16 bytes / extent bytes: below 1 for these 8 KiB blocks (1280-byte header, 4 KiB units) */
	CHECK(kvt_tm_check(f.tm) == KVT_OK);

	/* 4. write-back: a dirty block only in T1 goes to T2 when T1 must make room */
	engine_compute(&f, 5);
	CHECK(kvt_tm_reserve_t0(f.tm, N_T0) == KVT_OK); /* block 5 -> T1 (dirty), others dropped from T0 */
	kvt_btable_entry e5 = ent(&f, 5);
	CHECK(e5.slot[KVT_TIER_HOST] >= 0 && e5.dirty && e5.slot[KVT_TIER_NVME] < 0);
	/* fill T1 from T2 until block 5, the coldest T1 leaf, must go */
	kvt_tm_ticket *t;
	CHECK(kvt_tm_prefetch(f.tm, 5, (const uint8_t(*)[32])hashes[0], KVT_TIER_HOST, &t) == KVT_OK);
	CHECK(kvt_tm_ticket_wait(f.tm, t) == KVT_OK);
	CHECK(kvt_tm_ticket_done(f.tm, t, NULL));
	kvt_tm_ticket_free(f.tm, t);
	CHECK_EQ_INT(kvt_t1_n_free(kvt_tm_t1(f.tm)), 0);
	CHECK(kvt_tm_check(f.tm) == KVT_OK);
	/* block 5 is still dirty: the shutdown flush makes it durable (checked after the restart) */
	tm_fx_close(&f);

	/* 5. restart: a new table from the index; every persisted block promotes and matches */
	CHECK(fx_open(&f, codec, false, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	uint64_t n_rec = 0;
	CHECK(kvt_tm_recover(f.tm, &n_rec) == KVT_OK);
	CHECKF(n_rec == N_CHAIN, "recovered %llu blocks", (unsigned long long)n_rec); /* block 5 flushed at shutdown */
	kvt_btable_match m[N_CHAIN];
	uint32_t nh = 0, nm = 0;
	CHECK(kvt_tm_lookup(f.tm, root, toks, N_CHAIN * BT, KVT_BT_PIN, m, N_CHAIN, &nh, &nm) == KVT_OK);
	CHECK_EQ_INT(nm, N_CHAIN);
	promote_check(&f, codec, 0, N_CHAIN, "after restart");
	kvt_btable_unpin_n(f.bt, (const uint8_t(*)[32])hashes, nm);
	tm_fx_close(&f);
}

/* Eviction order across two chains: the coldest T0 leaf goes first; a parent only once it is a leaf. */
static void eviction_order(void)
{
	fixture f;
	CHECK(fx_open(&f, KVT_KV_CODEC_FP8, true, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	for (int b = 0; b < 4; b++)
		engine_compute(&f, b);
	/* a second chain of two blocks forks at the root: T0 leaves are now 3 and alt[1] */
	int32_t alt_toks[2 * BT];
	uint8_t alt[2][32];
	uint32_t n_alt;
	for (int i = 0; i < 2 * BT; i++)
		alt_toks[i] = 40000 + i;
	CHECK(kvt_hash_chain(root, alt_toks, 2 * BT, BT, alt, 2, &n_alt) == KVT_OK);
	engine_compute_block(&f, alt[0], root, alt_toks, data);
	engine_compute_block(&f, alt[1], alt[0], alt_toks + BT, data + n_el);
	CHECK(kvt_btable_touch(f.bt, hashes[3]) == KVT_OK); /* alt[1] is the colder leaf */
	uint32_t free_a = kvt_t0_n_free(f.t0);
	CHECK(kvt_tm_reserve_t0(f.tm, free_a + 1) == KVT_OK);
	kvt_btable_entry ea;
	CHECK(kvt_btable_get(f.bt, alt[1], &ea) == KVT_OK && ea.slot[KVT_TIER_HBM] < 0 && ea.slot[KVT_TIER_HOST] >= 0);
	CHECK(ent(&f, 3).slot[KVT_TIER_HBM] >= 0);
	CHECK(kvt_btable_touch(f.bt, alt[0]) == KVT_OK); /* now alt[0] is the hottest, and a leaf in T0: 3 goes next */
	CHECK(kvt_tm_reserve_t0(f.tm, free_a + 2) == KVT_OK);
	CHECK(ent(&f, 3).slot[KVT_TIER_HBM] < 0);
	CHECK(kvt_btable_get(f.bt, alt[0], &ea) == KVT_OK && ea.slot[KVT_TIER_HBM] >= 0);
	/* bring 3 back to T0; with the chain pinned, only the fork can leave T0 */
	int32_t s3;
	int r3;
	CHECK(kvt_tm_promote(f.tm, 1, (const uint8_t(*)[32])hashes[3], &s3, &r3) == KVT_OK);
	kvt_t0_unref(f.t0, s3);
	CHECK(kvt_tm_pin(f.tm, hashes[3]) == KVT_OK);
	CHECK(kvt_tm_pin(f.tm, hashes[0]) == KVT_OK);
	CHECK(kvt_tm_reserve_t0(f.tm, N_T0) == KVT_EFULL); /* alt[0] goes; the pinned chain stays */
	CHECK(kvt_btable_get(f.bt, alt[0], &ea) == KVT_OK && ea.slot[KVT_TIER_HBM] < 0);
	CHECK(kvt_tm_unpin(f.tm, hashes[0]) == KVT_OK);
	CHECK(kvt_tm_unpin(f.tm, hashes[3]) == KVT_OK);

	CHECK(kvt_tm_check(f.tm) == KVT_OK);
	tm_fx_close(&f);
}

/* Eviction order, pinning, write-back, corrupt records, a failed fsync, bad configs. */
static void policy_and_faults(void)
{
	const int codec = KVT_KV_CODEC_FP8;
	fixture f;
	CHECK(fx_open(&f, codec, true, KVT_PERSIST_WRITE_BACK, 0.99f, 0.5f) == 0);
	for (int b = 0; b < 4; b++)
		engine_compute(&f, b);
	/* the chain 0 <- 1 <- 2 <- 3: leaves go first even when a parent is colder */
	CHECK(kvt_btable_touch(f.bt, hashes[3]) == KVT_OK);
	CHECK(kvt_btable_touch(f.bt, hashes[0]) == KVT_OK); /* 0 is now the hottest, yet a parent */
	CHECK(kvt_tm_pin(f.tm, hashes[3]) == KVT_OK);
	/* pin block 3 (the leaf): it must stay, and so must its parents (not leaves in T0) */
	int32_t slot3 = ent(&f, 3).slot[KVT_TIER_HBM];
	CHECK(kvt_tm_reserve_t0(f.tm, N_T0) == KVT_EFULL);
	for (int b = 0; b < 4; b++)
		CHECK(ent(&f, b).slot[KVT_TIER_HBM] >= 0);
	CHECK(kvt_t0_refcount(f.t0, slot3) == 1);
	/* and its slot is never handed out: take every free T0 slot */
	int32_t taken[N_T0];
	uint32_t n_taken = 0;
	while (n_taken < N_T0 && kvt_t0_alloc(f.t0, &taken[n_taken]) == KVT_OK) {
		CHECK(taken[n_taken] != slot3);
		n_taken++;
	}
	while (n_taken)
		kvt_t0_unref(f.t0, taken[--n_taken]);
	CHECK(kvt_tm_unpin(f.tm, hashes[3]) == KVT_OK);
	/* now exactly one block can go per free slot asked: the leaf, then its parent */
	uint32_t free0 = kvt_t0_n_free(f.t0);
	CHECK(kvt_tm_reserve_t0(f.tm, free0 + 1) == KVT_OK);
	CHECK(ent(&f, 3).slot[KVT_TIER_HBM] < 0 && ent(&f, 2).slot[KVT_TIER_HBM] >= 0);
	CHECK(kvt_tm_reserve_t0(f.tm, free0 + 2) == KVT_OK);
	CHECK(ent(&f, 2).slot[KVT_TIER_HBM] < 0 && ent(&f, 1).slot[KVT_TIER_HBM] >= 0);
	/* a block pinned while in T1 is not dropped from T1 either */
	CHECK(kvt_tm_pin(f.tm, hashes[3]) == KVT_OK);
	CHECK(kvt_tm_reserve_t0(f.tm, N_T0) == KVT_OK); /* 1 and 0 go to T1 too */
	CHECK_EQ_INT(kvt_t1_n_free(kvt_tm_t1(f.tm)), N_T1 - 4);

	/* write-back: lower T1's watermarks and let maintenance evict: the dirty blocks go to T2 first */
	CHECK_EQ_INT(db_rows(&f), 0);
	for (int b = 4; b < 6; b++)
		engine_compute(&f, b);
	CHECK(kvt_tm_reserve_t0(f.tm, N_T0) == KVT_OK); /* T1 now full: 6 blocks */
	CHECK_EQ_INT(kvt_t1_n_free(kvt_tm_t1(f.tm)), 0);
	/* T1 is over its high watermark: maintenance evicts down to the low one. Only leaves of T1 can go
	 * (5, then 4); 3 is pinned, and 0..2 are its parents: so two blocks leave, each written back first */
	kvt_tm_maintain(f.tm);
	CHECK_EQ_INT(db_rows(&f), 2);
	for (int b = 0; b < 6; b++) {
		kvt_btable_entry e = ent(&f, b);
		if (b >= 4)
			CHECK(e.slot[KVT_TIER_HOST] < 0 && !e.dirty && e.slot[KVT_TIER_NVME] == 0);
		else
			CHECK(e.slot[KVT_TIER_HOST] >= 0 && e.dirty);
	}
	kvt_tm_stats st;
	kvt_tm_get_stats(f.tm, &st);
	CHECK_EQ_INT(st.tier[KVT_TIER_HOST].n_evictions, 2);
	CHECK_EQ_INT(st.tier[KVT_TIER_HOST].n_demotions, 2);
	CHECK_EQ_INT(st.tier[KVT_TIER_HOST].n_dropped, 0);
	CHECK(kvt_tm_unpin(f.tm, hashes[3]) == KVT_OK);
	CHECK(kvt_tm_flush(f.tm) == KVT_OK); /* WRITE_BACK: flush writes every dirty block */
	CHECK_EQ_INT(db_rows(&f), 6);
	for (int b = 0; b < 6; b++)
		CHECK(!ent(&f, b).dirty && ent(&f, b).slot[KVT_TIER_NVME] == 0);

	/* a flipped byte in block 2's record's payload */
	{
		kvt_btable_entry e2 = ent(&f, 2);
		tm_fx_close(&f);
		int fd = open(t2_path, O_RDWR);
		CHECK(fd >= 0);
		uint8_t byte;
		off_t off = (off_t)e2.nvme.off + KVT_T2_HEADER_BYTES + 100;
		CHECK(pread(fd, &byte, 1, off) == 1);
		byte ^= 0x10;
		CHECK(pwrite(fd, &byte, 1, off) == 1);
		CHECK(fsync(fd) == 0);
		close(fd);
	}
	/* restart, so nothing is cached above T2; block 2's record is then read and rejected */
	CHECK(fx_open(&f, codec, false, KVT_PERSIST_WRITE_BACK, 0.99f, 0.5f) == 0);
	uint64_t n_rec;
	CHECK(kvt_tm_recover(f.tm, &n_rec) == KVT_OK && n_rec == 6);
	check_log_capture();
	int32_t slots[6];
	int res[6];
	CHECK(kvt_tm_promote(f.tm, 6, (const uint8_t(*)[32])hashes[0], slots, res) == KVT_ECORRUPT);
	kvt_log_set_sink(NULL, NULL);
	for (int b = 0; b < 6; b++) {
		CHECKF(res[b] == (b == 2 ? KVT_ECORRUPT : KVT_OK), "block %d: %s", b, kvt_strerror(res[b]));
		if (res[b] == KVT_OK) {
			CHECK(compare_slot(&f, codec, slots[b], b) == 0);
			kvt_t0_unref(f.t0, slots[b]);
		}
	}
	kvt_tm_get_stats(f.tm, &st);
	CHECK(st.tier[KVT_TIER_NVME].n_corrupt >= 1);
	CHECK_EQ_INT(db_rows(&f), 5);
	CHECK(ent(&f, 2).slot[KVT_TIER_NVME] < 0);

	/* a failed fdatasync: the store turns read-only; flush fails; T2 reads and T0/T1 keep serving */
	engine_compute(&f, 2); /* recompute block 2 (its record was rejected) */
	atomic_store(&sync_fail, 1);
	check_log_capture();
	CHECK(kvt_tm_flush(f.tm) == KVT_EIO);
	kvt_log_set_sink(NULL, NULL);
	kvt_tm_get_stats(f.tm, &st);
	CHECK(st.t2_read_only && st.tier[KVT_TIER_NVME].degraded);
	CHECK(ent(&f, 2).dirty); /* not durable: no row for it */
	CHECK_EQ_INT(db_rows(&f), 5);
	CHECK(kvt_tm_reserve_t0(f.tm, N_T0) == KVT_OK); /* block 2 -> T1; the rest were clean */
	CHECK(kvt_tm_promote(f.tm, 6, (const uint8_t(*)[32])hashes[0], slots, res) == KVT_OK);
	for (int b = 0; b < 6; b++) {
		CHECK(compare_slot(&f, codec, slots[b], b) == 0);
		kvt_t0_unref(f.t0, slots[b]);
	}
	CHECK(kvt_tm_check(f.tm) == KVT_OK);
	check_log_capture();
	tm_fx_close(&f); /* shutdown flush fails (read-only): logged, not fatal */
	kvt_log_set_sink(NULL, NULL);

	/* a full T2 (a tiny file): flush says KVT_EFULL, T2 reports degraded, and nothing else stops */
	unlink(t2_path);
	unlink(db_path);
	t2_capacity = 6 * 4096; /* two superblock copies + 4 units: two fp8 records of 2 units */
	CHECK(fx_open(&f, codec, true, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	for (int b = 0; b < 6; b++)
		engine_compute(&f, b);
	CHECK(kvt_tm_flush(f.tm) == KVT_EFULL);
	kvt_tm_get_stats(f.tm, &st);
	CHECK(st.tier[KVT_TIER_NVME].degraded && !st.t2_read_only);
	CHECK_EQ_INT(st.n_persisted, 2);
	CHECK_EQ_INT(db_rows(&f), 2);
	CHECK(kvt_tm_reserve_t0(f.tm, N_T0) == KVT_OK); /* T0 -> T1 still works; the durable two are just dropped */
	CHECK(kvt_tm_promote(f.tm, 6, (const uint8_t(*)[32])hashes[0], slots, res) == KVT_OK);
	for (int b = 0; b < 6; b++) {
		CHECK(compare_slot(&f, codec, slots[b], b) == 0);
		kvt_t0_unref(f.t0, slots[b]);
	}
	CHECK(kvt_tm_check(f.tm) == KVT_OK);
	check_log_capture();
	tm_fx_close(&f); /* the shutdown flush is refused for lack of space: logged */
	kvt_log_set_sink(NULL, NULL);
	t2_capacity = 4u << 20;

	/* bad configs are named */
	kvt_tm_config c;
	kvt_tm *tm;
	kvt_dev *dev;
	kvt_t0_pool *t0;
	kvt_btable *bt;
	kvt_dev_config dc = { .kind = test_dev_kind(), .n_threads = 1 };
	CHECK(kvt_dev_create(&dc, &dev) == KVT_OK && kvt_t0_create(dev, &shape, 4, &t0) == KVT_OK &&
	      kvt_btable_create(BT, 0, &bt) == KVT_OK);
	kvt_tm_config_default(&c);
	c.dev = dev;
	c.t0 = t0;
	c.bt = bt;
	check_log_capture();
	c.low[KVT_TIER_HOST] = 0.95f;
	CHECK(kvt_tm_create(&c, &tm) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "t1 watermarks high 0.9 low 0.95") != NULL);
	c.low[KVT_TIER_HOST] = 0.5f;
	c.t1_codec = 9;
	CHECK(kvt_tm_create(&c, &tm) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "t1_codec 9 is not f16, fp8, int8, int8kv1 or int8kv") != NULL);
	c.t1_codec = KVT_KV_CODEC_INT8;
	c.t2 = (kvt_t2_store *)1; /* any non-NULL store without an index */
	CHECK(kvt_tm_create(&c, &tm) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "needs the index") != NULL);
	c.t2 = NULL;
	{
		kvt_kv_layout s8 = shape;
		s8.codec = KVT_KV_CODEC_FP8;
		kvt_t0_pool *p8;
		CHECK(kvt_t0_create(dev, &s8, 4, &p8) == KVT_OK);
		c.t0 = p8; /* an 8-bit T0 pool with an INT8 T1 */
		CHECK(kvt_tm_create(&c, &tm) == KVT_EINVAL);
		CHECK(strstr(check_log_text, "T0 keeps fp8 blocks; T1 must use the same codec, not int8") != NULL);
		c.t0 = t0;
		kvt_t0_destroy(p8);
	}
	kvt_log_set_sink(NULL, NULL);
	/* no T2: flush is unsupported, the rest works */
	c.t2 = NULL;
	CHECK(kvt_tm_create(&c, &tm) == KVT_OK);
	CHECK(kvt_tm_flush(tm) == KVT_EUNSUPPORTED);
	kvt_tm_destroy(tm);
	kvt_tm_destroy(NULL);
	kvt_btable_destroy(bt);
	kvt_t0_destroy(t0);
	kvt_dev_destroy(dev);
}

/*
 * An INT8 record of scale layout 1 (one scale per token and KV head: INT8's
 * format before it took a scale per 32 dims) is a miss, logged, and never
 * decoded. With this test's head_dim of 32 the old record even has exactly
 * the current size, so only scale_layout tells the two apart. A record of the
 * current layout in the same store promotes as usual.
 */
static void old_int8_layout_is_miss(void)
{
	fixture f;
	const int codec = KVT_KV_CODEC_INT8;
	CHECK(fx_open(&f, codec, true, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	engine_compute(&f, 0); /* block 0: written by the manager, layout 2 */
	CHECK(kvt_tm_flush(f.tm) == KVT_OK);
	/* block 1: an old record (layout 1) with its durable row, written as a manager of before did */
	const size_t pb = kvt_kv_packed_bytes(&shape, codec);
	const uint32_t n_vec = shape.n_layers * 2 * shape.n_kv_heads * BT;
	CHECK_EQ_INT(pb, (size_t)n_vec * (shape.head_dim + 4)); /* one group: the old size */
	uint8_t *payload = calloc(1, pb);
	kvt_t2_block_meta m;
	memset(&m, 0, sizeof(m));
	memcpy(m.hash, hashes[1], 32);
	memcpy(m.parent, hashes[0], 32);
	m.n_tokens = BT;
	memcpy(m.tokens, toks + BT, BT * sizeof(int32_t));
	m.kv_dtype = KVT_DTYPE_F16;
	m.codec = (uint8_t)codec;
	m.scale_layout = KVT_TM_SCALE_LAYOUT_TOKEN_HEAD;
	m.raw_bytes = (uint32_t)pb;
	kvt_t2_write_req req = { .meta = &m, .payload = payload };
	kvt_t2_loc loc;
	int wres = -1;
	CHECK(kvt_t2_write_batch(f.t2, 1, &req, &loc, &wres) == KVT_OK && wres == KVT_OK);
	kvt_db_block_row row;
	memset(&row, 0, sizeof(row));
	memcpy(row.hash, m.hash, 32);
	memcpy(row.parent, m.parent, 32);
	row.n_tokens = BT;
	memcpy(row.tokens, m.tokens, BT * sizeof(int32_t));
	row.loc = loc;
	row.kv_dtype = m.kv_dtype;
	row.codec = m.codec;
	row.scale_layout = m.scale_layout;
	row.raw_bytes = m.raw_bytes;
	row.last_use = kvt_wall_us();
	uint64_t tick = 0;
	CHECK(kvt_db_put_block(f.db, &row, NULL, NULL, &tick) == KVT_OK);
	CHECK(kvt_db_wait(f.db, tick) == KVT_OK);
	free(payload);
	tm_fx_close(&f);

	/* restart: both rows recover; block 0 promotes, block 1 is a miss with a log line */
	CHECK(fx_open(&f, codec, false, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	uint64_t n_rec = 0;
	CHECK(kvt_tm_recover(f.tm, &n_rec) == KVT_OK);
	CHECK_EQ_INT(n_rec, 2);
	int32_t slots[2] = { -1, -1 };
	int res[2] = { -1, -1 };
	check_log_capture();
	CHECK(kvt_tm_promote(f.tm, 2, (const uint8_t(*)[32])hashes[0], slots, res) == KVT_ENOTFOUND);
	CHECKF(strstr(check_log_text, "codec int8, scale layout 1") != NULL &&
		       strstr(check_log_text, "scale layout 2") != NULL &&
		       strstr(check_log_text, "such records are misses") != NULL,
	       "log: %s", check_log_text);
	kvt_log_set_sink(NULL, NULL);
	CHECK_EQ_INT(res[0], KVT_OK);
	CHECK_EQ_INT(res[1], KVT_ENOTFOUND);
	if (res[0] == KVT_OK) {
		CHECK(compare_slot(&f, codec, slots[0], 0) == 0);
		kvt_t0_unref(f.t0, slots[0]);
	}
	CHECK(ent(&f, 1).slot[KVT_TIER_HBM] < 0 && ent(&f, 1).slot[KVT_TIER_HOST] < 0); /* nothing decoded */
	CHECK(kvt_tm_check(f.tm) == KVT_OK);
	tm_fx_close(&f);
}

/*
 * The LRU order survives a restart: a block used after it was persisted (a
 * promotion hit refreshes its row) comes back warmer than one that was not,
 * so after the restart the unused one is the first the NVMe tier gives up.
 */
static void lru_survives_restart(void)
{
	fixture f;
	uint8_t r[2][32], h[2][32], salt[32] = { 0 };
	for (int i = 0; i < 2; i++) { /* two one-block chains (other tenants), X = 0 and Y = 1 */
		salt[0] = (uint8_t)(10 + i);
		CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt, r[i]) == KVT_OK);
		CHECK(kvt_hash_block(r[i], toks + i * BT, BT, h[i]) == KVT_OK);
	}
	CHECK(fx_open(&f, KVT_KV_CODEC_F16, true, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	for (int i = 0; i < 2; i++) { /* X durable before Y: X's row is the older */
		engine_compute_block(&f, h[i], r[i], toks + i * BT, data + i * n_el);
		CHECK(kvt_tm_flush(f.tm) == KVT_OK);
		usleep(2000);
	}
	tm_fx_close(&f);
	/* restart, use X (from T2), restart again */
	uint64_t n = 0;
	CHECK(fx_open(&f, KVT_KV_CODEC_F16, false, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	CHECK(kvt_tm_recover(f.tm, &n) == KVT_OK && n == 2);
	int32_t slot = -1;
	int res = -1;
	CHECK(kvt_tm_promote(f.tm, 1, (const uint8_t(*)[32])h, &slot, &res) == KVT_OK && res == KVT_OK);
	if (slot >= 0)
		kvt_t0_unref(f.t0, slot);
	tm_fx_close(&f);
	CHECK(fx_open(&f, KVT_KV_CODEC_F16, false, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	CHECK(kvt_tm_recover(f.tm, &n) == KVT_OK && n == 2);
	uint8_t cold[2][32];
	uint32_t nc = 0;
	CHECK(kvt_btable_coldest(f.bt, KVT_TIER_NVME, 2, cold, &nc) == KVT_OK && nc == 2);
	CHECKF(nc == 2 && !memcmp(cold[0], h[1], 32) && !memcmp(cold[1], h[0], 32),
	       "after the restart the unused block (Y) must be the coldest, the used one (X) next");
	/* and the other way round (so no fixed order, by hash or by row, passes both): use Y */
	usleep(2000);
	CHECK(kvt_tm_promote(f.tm, 1, (const uint8_t(*)[32])h[1], &slot, &res) == KVT_OK && res == KVT_OK);
	if (slot >= 0)
		kvt_t0_unref(f.t0, slot);
	tm_fx_close(&f);
	CHECK(fx_open(&f, KVT_KV_CODEC_F16, false, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	CHECK(kvt_tm_recover(f.tm, &n) == KVT_OK && n == 2);
	nc = 0;
	CHECK(kvt_btable_coldest(f.bt, KVT_TIER_NVME, 2, cold, &nc) == KVT_OK && nc == 2);
	CHECKF(nc == 2 && !memcmp(cold[0], h[0], 32) && !memcmp(cold[1], h[1], 32),
	       "after Y was used and the daemon restarted, X must be the coldest");
	tm_fx_close(&f);
}

/* kvt_tm_end_turn_chain's done: what it was told, and the rows committed when it was told. */
typedef struct turn_told {
	atomic_int n_calls;   /* times called (must end at 1) */
	atomic_int rc;        /* its rc */
	atomic_uint n_durable;/* its count */
	fixture *f;           /* for the row count */
	atomic_int rows;      /* index rows when it was called */
} turn_told;

static void on_turn_durable(void *user, int rc, uint32_t n_durable)
{
	turn_told *t = user;
	atomic_store(&t->rc, rc);
	atomic_store(&t->n_durable, n_durable);
	uint64_t n = 0; /* no CHECK here: this is the manager's thread */
	atomic_store(&t->rows, kvt_db_count_blocks(t->f->db, 0, &n) == KVT_OK ? (int)n : -1);
	atomic_fetch_add(&t->n_calls, 1);
}

static bool told_within(turn_told *t, double s)
{
	double t0 = kvt_now_s();
	while (!atomic_load(&t->n_calls) && kvt_now_s() - t0 < s)
		usleep(2000);
	return atomic_load(&t->n_calls) > 0;
}

/*
 * A turn's owner is told how far its chain is durable once none of its
 * blocks waits for write-through: with the rows committed by then, stopping
 * at the first block that was never registered; once; at once without
 * write-through; with KVT_ESTOPPED (and the flushed count) at shutdown.
 */
static void turn_durable_told(void)
{
	fixture f;
	turn_told t = { .f = &f };
	CHECK(fx_open(&f, KVT_KV_CODEC_F16, true, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	for (int b = 0; b < 4; b++)
		engine_compute(&f, b);
	CHECK_EQ_INT(kvt_tm_durable_prefix(f.tm, N_CHAIN, (const uint8_t(*)[32])hashes), 0);
	CHECK(kvt_tm_end_turn_chain(f.tm, 4, (const uint8_t(*)[32])hashes, on_turn_durable, &t) == KVT_OK);
	CHECKF(told_within(&t, 60.0), "end of turn: not told within 60 s");
	usleep(50000);
	CHECK_EQ_INT(atomic_load(&t.n_calls), 1);
	CHECK_EQ_INT(atomic_load(&t.rc), KVT_OK);
	CHECK_EQ_INT(atomic_load(&t.n_durable), 4);
	CHECK_EQ_INT(atomic_load(&t.rows), 4); /* told only with the rows committed */
	CHECK_EQ_INT(kvt_tm_durable_prefix(f.tm, N_CHAIN, (const uint8_t(*)[32])hashes), 4);

	/* a chain whose block 5 was never computed: durable as far as block 4 */
	turn_told t2 = { .f = &f };
	engine_compute(&f, 4);
	CHECK(kvt_tm_end_turn_chain(f.tm, N_CHAIN, (const uint8_t(*)[32])hashes, on_turn_durable, &t2) == KVT_OK);
	CHECKF(told_within(&t2, 60.0), "second turn: not told within 60 s");
	CHECK_EQ_INT(atomic_load(&t2.n_durable), 5);

	/* shutdown before the maintenance pass: told once, with what the shutdown flush made durable */
	turn_told t3 = { .f = &f };
	engine_compute(&f, 5);
	CHECK(kvt_tm_end_turn_chain(f.tm, N_CHAIN, (const uint8_t(*)[32])hashes, on_turn_durable, &t3) == KVT_OK);
	tm_fx_close(&f);
	CHECK_EQ_INT(atomic_load(&t3.n_calls), 1);
	CHECK(atomic_load(&t3.rc) == KVT_OK || atomic_load(&t3.rc) == KVT_ESTOPPED);
	CHECK_EQ_INT(atomic_load(&t3.n_durable), N_CHAIN);
	unlink(db_path);

	/* write-back: nothing is written through at a turn's end, so it is told at once, with what is durable */
	turn_told t4 = { .f = &f };
	CHECK(fx_open(&f, KVT_KV_CODEC_F16, true, KVT_PERSIST_WRITE_BACK, 1.0f, 0.5f) == 0);
	engine_compute(&f, 0);
	CHECK(kvt_tm_end_turn_chain(f.tm, 1, (const uint8_t(*)[32])hashes, on_turn_durable, &t4) == KVT_OK);
	CHECK_EQ_INT(atomic_load(&t4.n_calls), 1);
	CHECK_EQ_INT(atomic_load(&t4.n_durable), 0);
	tm_fx_close(&f);
}

/* Relative L2 error of slot s against block b's computed K/V. */
static double slot_rel_l2(fixture *f, int32_t s, int b)
{
	uint16_t *out = malloc(n_el * 2);
	CHECK(kvt_dev_copy_d2h(f->dev, out, (char *)kvt_t0_layout(f->t0)->pool + (size_t)s * n_el * 2, n_el * 2) ==
	      KVT_OK);
	double e2 = 0, s2 = 0;
	for (size_t i = 0; i < n_el; i++) {
		double a = kvt_f16_to_f32(data[b * n_el + i]), y = kvt_f16_to_f32(out[i]);
		e2 += (a - y) * (a - y);
		s2 += a * a;
	}
	free(out);
	return sqrt(e2 / s2);
}

/* A promoted slot of a record of codec old against its bound (the INT8KV formats: relative L2 under 1%). */
static bool old_slot_ok(fixture *f, int old, int32_t s, int b)
{
	if (old == KVT_KV_CODEC_INT8KV1 || old == KVT_KV_CODEC_INT8KV)
		return slot_rel_l2(f, s, b) < 0.01;
	return compare_slot(f, old, s, b) == 0;
}

/*
 * Versioned records (manager.h, "Versioning"): a data dir written by a
 * manager of FP8, INT8 or INT8KV1 (the formats of earlier builds) resumes
 * under an INT8KV manager:
 * each record decodes with its own codec straight into T0 (within that
 * codec's bound, marked lossy, not kept in T1). With t2_f16 the records
 * written from T0 are f16 while T1 runs INT8KV, and a restart's promotion
 * gives the computed K/V back bit for bit, not lossy.
 */
static void old_formats_resume(void)
{
	static const int olds[] = { KVT_KV_CODEC_FP8, KVT_KV_CODEC_INT8, KVT_KV_CODEC_INT8KV1, KVT_KV_CODEC_F16 };
	for (int k = 0; k < 4; k++) {
		const int old = olds[k];
		fixture f;
		fx_t2_f16 = old == KVT_KV_CODEC_F16; /* f16 records from an INT8KV manager's T0 */
		unlink(db_path);
		CHECK(fx_open(&f, fx_t2_f16 ? KVT_KV_CODEC_INT8KV : old, true, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
		engine_compute(&f, 0);
		engine_compute(&f, 1);
		CHECK(kvt_tm_flush(f.tm) == KVT_OK);
		tm_fx_close(&f);
		fx_t2_f16 = false;
		/* the upgrade: the same data dir under an INT8KV manager */
		CHECK(fx_open(&f, KVT_KV_CODEC_INT8KV, false, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
		uint64_t n_rec = 0;
		CHECK(kvt_tm_recover(f.tm, &n_rec) == KVT_OK);
		CHECK_EQ_INT(n_rec, 2);
		/* a record of another format exports as this manager's own (decoded, packed again) */
		uint8_t *ex_t2 = NULL, *ex_t0 = NULL;
		size_t n_t2 = 0, n_t0 = 0;
		CHECKF(kvt_tm_block_export(f.tm, model_fp, hashes[0], &ex_t2, &n_t2) == KVT_OK, "export of a %s record",
		       kvt_kv_codec_name(old));
		int32_t slots[2] = { -1, -1 };
		int res[2] = { -1, -1 };
		CHECKF(kvt_tm_promote(f.tm, 2, (const uint8_t(*)[32])hashes[0], slots, res) == KVT_OK,
		       "records of %s under an int8kv manager", kvt_kv_codec_name(old));
		for (int b = 0; b < 2; b++) {
			if (res[b] != KVT_OK)
				continue;
			CHECKF(old_slot_ok(&f, old, slots[b], b), "%s record, block %d: out of its bound",
			       kvt_kv_codec_name(old), b);
			kvt_btable_entry e = ent(&f, b);
			CHECK(e.t0_lossy == (old != KVT_KV_CODEC_F16));
			CHECK(e.slot[KVT_TIER_HOST] < 0); /* another format: not kept in the INT8KV T1 */
			kvt_t0_unref(f.t0, slots[b]);
		}
		/* ... the same bytes as the block's T0 copy (unpacked from that record) packed as int8kv */
		CHECK(kvt_tm_block_export(f.tm, model_fp, hashes[0], &ex_t0, &n_t0) == KVT_OK);
		CHECK(ex_t2 && ex_t0 && n_t2 == n_t0 && !memcmp(ex_t2, ex_t0, n_t0));
		free(ex_t2);
		free(ex_t0);
		CHECK(kvt_tm_check(f.tm) == KVT_OK);
		tm_fx_close(&f);
	}
	/* and INT8KV's own records round-trip through T1 and T2 within its bound */
	unlink(db_path);
	fixture f;
	CHECK(fx_open(&f, KVT_KV_CODEC_INT8KV, true, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	engine_compute(&f, 0);
	CHECK(kvt_tm_flush(f.tm) == KVT_OK);
	tm_fx_close(&f);
	CHECK(fx_open(&f, KVT_KV_CODEC_INT8KV, false, KVT_PERSIST_END_OF_TURN, 1.0f, 0.5f) == 0);
	uint64_t n_rec = 0;
	CHECK(kvt_tm_recover(f.tm, &n_rec) == KVT_OK);
	int32_t s0 = -1;
	int r0 = -1;
	CHECK(kvt_tm_promote(f.tm, 1, (const uint8_t(*)[32])hashes[0], &s0, &r0) == KVT_OK);
	if (r0 == KVT_OK) {
		CHECK(ent(&f, 0).slot[KVT_TIER_HOST] >= 0 && ent(&f, 0).t0_lossy); /* its own format: kept in T1 */
		const double rel = slot_rel_l2(&f, s0, 0);
		CHECKF(rel < 0.01, "int8kv T2 round trip: relative L2 %g", rel);
		kvt_t0_unref(f.t0, s0);
	}
	tm_fx_close(&f);
}

int main(void)
{
	kvt_dev *probe;
	kvt_dev_config pc = { .kind = test_dev_kind(), .n_threads = 1 };
	if (kvt_dev_create(&pc, &probe))
		return pc.kind == KVT_DEV_CPU ? 1 : check_skip("test_manager_tiers", "the requested device is not available");
	printf("device: %s\n", kvt_dev_name(probe));
	kvt_dev_destroy(probe);
	snprintf(dir, sizeof(dir), "/tmp/kvt_tm_XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(t2_path, sizeof(t2_path), "%s/kvtier.t2", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);
	make_chain();
	for (int codec = 0; codec < KVT_KV_POOL_CODEC_COUNT; codec++) {
		unlink(db_path);
		round_trips(codec);
	}
	unlink(db_path);
	eviction_order();
	unlink(db_path);
	policy_and_faults();
	unlink(db_path);
	old_int8_layout_is_miss();
	unlink(db_path);
	old_formats_resume();
	unlink(db_path);
	lru_survives_restart();
	unlink(db_path);
	turn_durable_told();
	free(data);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return check_done("test_manager_tiers");
}
