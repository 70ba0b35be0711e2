/* ctest-labels: unit integration */
/*
 * tests/test_manager_stress.c — the tiering manager under concurrent load,
 * meant for the ThreadSanitizer build: four "engine" threads look up (with
 * pins), promote, compute and register blocks of shared prefix chains, end
 * turns, prefetch, flush and run maintenance passes of their own, while the manager's maintenance thread demotes (tight
 * watermarks on every tier), writes through to T2 and evicts from it, and its
 * I/O threads promote. Real pieces throughout: CPU device, T0 pool, the
 * index's table and SQLite index, the T2 store on a temp file.
 *
 * Every block's bytes are a function of its hash and T1 is f16, so every
 * promoted block must come back bit for bit, whatever path it took. At the
 * end: the manager's, the table's and the pools' invariants hold, a flush
 * makes every block durable, and every T0/T1 slot is released at shutdown.
 *
 * The engine threads drive the compute stream (filling and reading T0 slots,
 * registering) one at a time under one mutex, as one engine thread would.
 */
#include "check.h"
#include "test_dev.h"
#include "manager.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#define BT 8
#define N_CHAINS 5
#define CHAIN_BLOCKS 8
#define N_THREADS 4
#define N_ITERS 400

static const kvt_kv_layout shape = { .n_layers = 2, .n_kv_heads = 1, .head_dim = 32, .block_tokens = BT };
static kvt_dev *dev;
static kvt_t0_pool *t0;
static kvt_btable *bt;
static kvt_tm *tm;
static pthread_mutex_t engine_mu = PTHREAD_MUTEX_INITIALIZER;
static int32_t toks[N_CHAINS][CHAIN_BLOCKS * BT];
static uint8_t root[32], hashes[N_CHAINS][CHAIN_BLOCKS][32];
static size_t n_el;
static atomic_int n_bad, n_promoted, n_registered;

static void block_bytes_of(const uint8_t h[32], uint16_t *out)
{
	check_rng r;
	memcpy(&r.s, h, 8);
	r.s |= 1;
	for (size_t i = 0; i < n_el; i++)
		out[i] = kvt_f32_to_f16(check_rng_f32(&r) * 4.0f);
}

static char *slot_ptr(int32_t s) { return (char *)kvt_t0_layout(t0)->pool + (size_t)s * n_el * 2; }

static void *engine(void *arg)
{
	check_rng rng = { (unsigned long long)(uintptr_t)arg * 7777 + 5 };
	uint16_t *want = malloc(n_el * 2), *got = malloc(n_el * 2);
	kvt_btable_match m[CHAIN_BLOCKS];
	int32_t slots[CHAIN_BLOCKS];
	int res[CHAIN_BLOCKS];
	uint8_t (*mh)[32] = malloc(CHAIN_BLOCKS * 32);
	for (int it = 0; it < N_ITERS; it++) {
		int c = (int)(check_rng_u64(&rng) % N_CHAINS);
		uint32_t L = 1 + (uint32_t)(check_rng_u64(&rng) % CHAIN_BLOCKS), nh = 0, nm = 0;
		int lrc = kvt_tm_lookup(tm, root, toks[c], L * BT, KVT_BT_PIN | KVT_BT_TOUCH, m, CHAIN_BLOCKS, &nh, &nm);
		if (lrc) {
			fprintf(stderr, "lookup: %s\n", kvt_strerror(lrc));
			atomic_fetch_add(&n_bad, 1);
			continue;
		}
		for (uint32_t i = 0; i < nm; i++)
			memcpy(mh[i], m[i].hash, 32);
		/* promote the cached prefix and check every byte */
		uint32_t n_ok = 0;
		if (nm) {
			(void)kvt_tm_promote(tm, nm, (const uint8_t(*)[32])mh, slots, res);
			for (uint32_t i = 0; i < nm; i++) {
				if (res[i] != KVT_OK)
					break; /* a dropped block (no room anywhere): recompute from here */
				block_bytes_of(mh[i], want);
				pthread_mutex_lock(&engine_mu);
				kvt_dev_copy_d2h(dev, got, slot_ptr(slots[i]), n_el * 2);
				pthread_mutex_unlock(&engine_mu);
				if (memcmp(want, got, n_el * 2)) {
					fprintf(stderr, "chain %d block %u: wrong bytes in T0 slot %d\n", c, i, slots[i]);
					atomic_fetch_add(&n_bad, 1);
				}
				atomic_fetch_add(&n_promoted, 1);
				n_ok++;
			}
			for (uint32_t i = 0; i < nm; i++)
				if (res[i] == KVT_OK)
					kvt_t0_unref(t0, slots[i]);
		}
		/* compute the rest of the prefix and register it */
		for (uint32_t b = n_ok; b < L; b++) {
			int32_t s;
			if (kvt_t0_alloc(t0, &s) != KVT_OK && (kvt_tm_reserve_t0(tm, 1) != KVT_OK || kvt_t0_alloc(t0, &s) != KVT_OK))
				break; /* everything pinned by the other threads right now */
			block_bytes_of(hashes[c][b], want);
			pthread_mutex_lock(&engine_mu);
			kvt_dev_copy_h2d(dev, slot_ptr(s), want, n_el * 2);
			int rc = kvt_tm_register(tm, hashes[c][b], b ? hashes[c][b - 1] : root, toks[c] + b * BT, s);
			pthread_mutex_unlock(&engine_mu);
			if (rc != KVT_OK) {
				fprintf(stderr, "register chain %d block %u: %s\n", c, b, kvt_strerror(rc));
				atomic_fetch_add(&n_bad, 1);
			}
			atomic_fetch_add(&n_registered, 1);
			kvt_t0_unref(t0, s);
		}
		kvt_btable_unpin_n(bt, (const uint8_t(*)[32])mh, nm);
		uint64_t r = check_rng_u64(&rng) % 16;
		if (r < 2) {
			kvt_tm_end_turn(tm);
		} else if (r == 2) {
			kvt_tm_maintain(tm); /* a pass beside the manager's own thread */
		} else if (r == 3 && it % 50 == 0) {
			int frc = kvt_tm_flush(tm); /* T2 is small: full (KVT_EFULL) is a legitimate answer */
			if (frc != KVT_OK && frc != KVT_EFULL) {
				fprintf(stderr, "flush: %s\n", kvt_strerror(frc));
				atomic_fetch_add(&n_bad, 1);
			}
		} else if (r < 6) {
			/* resume another chain: prefetch it to T1 and poll, or wait */
			kvt_tm_ticket *t;
			int c2 = (int)(check_rng_u64(&rng) % N_CHAINS);
			if (kvt_tm_prefetch(tm, CHAIN_BLOCKS, (const uint8_t(*)[32])hashes[c2], KVT_TIER_HOST, &t) == KVT_OK) {
				uint32_t n_done;
				while (!kvt_tm_ticket_done(tm, t, &n_done) && (check_rng_u64(&rng) & 1))
					usleep(100);
				kvt_tm_ticket_free(tm, t);
			}
		}
	}
	free(want);
	free(got);
	free(mh);
	return NULL;
}

int main(void)
{
	char dir[] = "/tmp/kvt_tms_XXXXXX", t2_path[300], db_path[300];
	uint8_t model_fp[32] = { 1, 2, 3 }, salt[32] = { 0 };
	kvt_dev_config dc = { .kind = test_dev_kind(), .n_threads = 1 };
	if (kvt_dev_create(&dc, &dev))
		return dc.kind == KVT_DEV_CPU ? 1 : check_skip("test_manager_stress", "the requested device is not available");
	if (!mkdtemp(dir))
		return 1;
	snprintf(t2_path, sizeof(t2_path), "%s/kvtier.t2", dir);
	snprintf(db_path, sizeof(db_path), "%s/index.sqlite", dir);
	CHECK(kvt_t0_create(dev, &shape, 24, &t0) == KVT_OK);
	CHECK(kvt_btable_create(BT, 0, &bt) == KVT_OK);
	n_el = kvt_t0_block_bytes(t0) / 2;
	kvt_t2_store *t2;
	/* 32 record units of 4 KiB for 40 distinct blocks: T2 eviction and a full T2 happen too */
	kvt_t2_config tc = { .path = t2_path, .capacity_bytes = 33 * 4096, .io_mode = KVT_T2_IO_AUTO, .buffered_ok = true };
	memcpy(tc.model_fp, model_fp, 32);
	CHECK(kvt_t2_open(&tc, &t2) == KVT_OK);
	kvt_db *db;
	kvt_db_config dbc = { .path = db_path, .create = true };
	memcpy(dbc.ns.model_fp, model_fp, 32);
	dbc.ns.layout_version = KVT_KV_LAYOUT_VERSION;
	dbc.ns.block_tokens = BT;
	CHECK(kvt_db_open(&dbc, &db) == KVT_OK);

	check_rng rng = { 4242 };
	CHECK(kvt_hash_root(model_fp, KVT_KV_LAYOUT_VERSION, BT, salt, root) == KVT_OK);
	for (int c = 0; c < N_CHAINS; c++) {
		uint32_t n;
		for (int i = 0; i < CHAIN_BLOCKS * BT; i++)
			toks[c][i] = (int32_t)(check_rng_u64(&rng) % 1000);
		toks[c][0] = c % 3; /* some chains share nothing, a few start alike */
		CHECK(kvt_hash_chain(root, toks[c], CHAIN_BLOCKS * BT, BT, hashes[c], CHAIN_BLOCKS, &n) == KVT_OK);
	}

	kvt_tm_config c;
	kvt_tm_config_default(&c);
	c.dev = dev;
	c.t0 = t0;
	c.bt = bt;
	c.t2 = t2;
	c.db = db;
	c.t1_slots = 12;
	c.t1_codec = KVT_KV_CODEC_F16;
	c.high[KVT_TIER_HBM] = 0.6f;
	c.low[KVT_TIER_HBM] = 0.3f;
	c.high[KVT_TIER_HOST] = 0.7f;
	c.low[KVT_TIER_HOST] = 0.4f;
	c.high[KVT_TIER_NVME] = 0.7f;
	c.low[KVT_TIER_NVME] = 0.4f;
	c.batch_blocks = 4;
	c.n_io_threads = 2;
	c.poll_s = 0.002;
	CHECK(kvt_tm_create(&c, &tm) == KVT_OK);

	pthread_t th[N_THREADS];
	for (uintptr_t i = 0; i < N_THREADS; i++)
		pthread_create(&th[i], NULL, engine, (void *)i);
	for (int i = 0; i < N_THREADS; i++)
		pthread_join(th[i], NULL);

	CHECKF(atomic_load(&n_bad) == 0, "%d blocks came back wrong or failed", atomic_load(&n_bad));
	kvt_tm_stats st;
	kvt_tm_get_stats(tm, &st);
	printf("  %d promoted, %d registered; T0 evictions %llu, T1 evictions %llu (dropped %llu), T2 evictions %llu, "
	       "persisted %llu, T2 hits %llu; end of turn -> durable max %.3f s (%llu late)\n",
	       atomic_load(&n_promoted), atomic_load(&n_registered),
	       (unsigned long long)st.tier[KVT_TIER_HBM].n_evictions, (unsigned long long)st.tier[KVT_TIER_HOST].n_evictions,
	       (unsigned long long)st.tier[KVT_TIER_HOST].n_dropped, (unsigned long long)st.tier[KVT_TIER_NVME].n_evictions,
	       (unsigned long long)st.n_persisted, (unsigned long long)st.tier[KVT_TIER_NVME].hits, st.max_turn_s,
	       (unsigned long long)st.n_turn_late);
	CHECK(atomic_load(&n_promoted) > 0);
	CHECK(st.tier[KVT_TIER_HBM].n_evictions > 0 && st.tier[KVT_TIER_HOST].n_evictions > 0);
	CHECK(st.n_persisted > 0 && st.tier[KVT_TIER_NVME].n_evictions > 0);
	int frc = kvt_tm_flush(tm);
	CHECKF(frc == KVT_OK || frc == KVT_EFULL, "flush: %s", kvt_strerror(frc));
	CHECK(kvt_tm_check(tm) == KVT_OK);
	kvt_tm_destroy(tm);
	/* shutdown released every slot the manager held: nothing is left in T0 */
	CHECK_EQ_INT(kvt_t0_n_free(t0), 24);
	kvt_btable_stats bs;
	kvt_btable_get_stats(bt, &bs);
	CHECK_EQ_INT(bs.n_in_tier[KVT_TIER_HBM], 0);
	CHECK_EQ_INT(bs.n_in_tier[KVT_TIER_HOST], 0);
	CHECK_EQ_INT(bs.n_pinned, 0);
	CHECK(kvt_btable_check(bt) == KVT_OK);

	kvt_db_close(db);
	kvt_t2_close(t2);
	kvt_btable_destroy(bt);
	kvt_t0_destroy(t0);
	kvt_dev_destroy(dev);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return check_done("test_manager_stress");
}
