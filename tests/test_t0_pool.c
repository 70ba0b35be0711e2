/* ctest-labels: unit */
/*
 * tests/test_t0_pool.c — the T0 block pool: slots handed out once, counts,
 * the free list, a full pool, and a concurrent alloc/ref/unref stress run
 * (meant for the ThreadSanitizer build) after which the pool's invariants
 * hold and every slot is free again.
 */
#include "check.h"
#include "tiers.h"

#include <pthread.h>

static kvt_t0_pool *pool;

static void *stress(void *arg)
{
	check_rng rng = { (unsigned long long)(uintptr_t)arg * 7919 + 1 };
	int32_t held[16];
	int n = 0;
	for (int i = 0; i < 20000; i++) {
		unsigned long long r = check_rng_u64(&rng) % 4;
		if (r == 0 && n < 16) {
			if (kvt_t0_alloc(pool, &held[n]) == KVT_OK)
				n++;
		} else if (r == 1 && n > 0 && n < 16) {
			kvt_t0_ref(pool, held[n - 1]); /* share a block, as a forked sequence does */
			held[n] = held[n - 1];
			n++;
		} else if (n > 0) {
			kvt_t0_unref(pool, held[--n]);
		}
	}
	while (n > 0)
		kvt_t0_unref(pool, held[--n]);
	return NULL;
}

int main(void)
{
	kvt_dev *dev;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = 1 };
	kvt_kv_layout shape = { .n_layers = 3, .n_kv_heads = 2, .head_dim = 64, .block_tokens = 16 };
	if (kvt_dev_create(&dc, &dev))
		return 1;
	CHECK(kvt_t0_create(dev, &shape, 8, &pool) == KVT_OK);
	CHECK_EQ_INT(kvt_t0_block_bytes(pool), 3 * 2 * 2 * 16 * 64 * 2);
	CHECK_EQ_INT(kvt_t0_n_free(pool), 8);

	/* every slot handed out once, then the pool is full */
	int32_t s[8], extra;
	unsigned seen = 0;
	for (int i = 0; i < 8; i++) {
		CHECK(kvt_t0_alloc(pool, &s[i]) == KVT_OK);
		CHECK(s[i] >= 0 && s[i] < 8 && !(seen & (1u << s[i])));
		seen |= 1u << s[i];
		CHECK_EQ_INT(kvt_t0_refcount(pool, s[i]), 1);
	}
	CHECK_EQ_INT(s[0], 0); /* slot 0 first */
	CHECK(kvt_t0_alloc(pool, &extra) == KVT_EFULL);
	CHECK(kvt_t0_check(pool) == KVT_OK);

	/* a shared slot stays taken until its last holder lets go */
	kvt_t0_ref(pool, s[3]);
	kvt_t0_unref(pool, s[3]);
	CHECK(kvt_t0_alloc(pool, &extra) == KVT_EFULL);
	kvt_t0_unref(pool, s[3]);
	CHECK_EQ_INT(kvt_t0_n_free(pool), 1);
	CHECK(kvt_t0_alloc(pool, &extra) == KVT_OK && extra == s[3]); /* LIFO reuse */
	for (int i = 0; i < 8; i++)
		kvt_t0_unref(pool, s[i]);
	CHECK_EQ_INT(kvt_t0_n_free(pool), 8);
	CHECK(kvt_t0_check(pool) == KVT_OK);

	/* bad shapes are refused */
	kvt_t0_pool *bad;
	kvt_kv_layout empty = { 0 };
	check_log_capture();
	CHECK(kvt_t0_create(dev, &empty, 8, &bad) == KVT_EINVAL);
	CHECK(kvt_t0_create(dev, &shape, 0, &bad) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "t0: empty pool shape") != NULL);
	kvt_log_set_sink(NULL, NULL);

	/* four threads allocating, sharing and freeing at once */
	pthread_t th[4];
	for (uintptr_t i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, stress, (void *)i);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	CHECK_EQ_INT(kvt_t0_n_free(pool), 8);
	CHECK(kvt_t0_check(pool) == KVT_OK);

	kvt_t0_destroy(pool);
	kvt_t0_destroy(NULL);
	kvt_dev_destroy(dev);
	return check_done("test_t0_pool");
}
