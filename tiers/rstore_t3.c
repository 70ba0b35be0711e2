/*
 * tiers/rstore_t3.c — the record-store seam (rstore.h) over T3, the Redis
 * Cluster tier (t3_remote.h): each op is one call into kvt_t3, which keeps
 * every rule (record format, verification, keys, timeouts, the client pool).
 *
 * Mapping: put is kvt_t3_put_records (locs zeroed: the key is the block
 * hash); get is kvt_t3_get_blocks; exists is kvt_t3_has_blocks (EXISTS);
 * del is kvt_t3_delete_blocks (DEL); iterate is KVT_EUNSUPPORTED (the
 * cluster client has no SCAN); stats is kvt_t3_get_stats.
 * Invariant: the view holds nothing but the tier pointer.
 */
#include "rstore.h"

#include <stdlib.h>
#include <string.h>

static int t3_put(kvt_rstore *rs, uint32_t n, const kvt_rstore_rec *recs, kvt_rstore_loc *locs, int *results)
{
	if (locs)
		memset(locs, 0, (size_t)n * sizeof(*locs));
	int rc = kvt_t3_put_records(rs->impl, n, recs, results);
	return rc ? kvt_rstore_fill(n, results, rc) : kvt_rstore_first_error(n, results);
}

static int t3_get(kvt_rstore *rs, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], const kvt_rstore_loc *locs,
		  bool stop_at_miss, kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results)
{
	(void)locs; /* keyed by the hash */
	if (!hashes && n) {
		KVT_LOGE("t3: get without hashes");
		return kvt_rstore_fill(n, results, KVT_EINVAL);
	}
	kvt_t2_block_meta *own = NULL;
	if (!metas && n && !(metas = own = malloc((size_t)n * sizeof(*own)))) /* kvt_t3 always decodes the meta */
		return kvt_rstore_fill(n, results, KVT_ENOMEM);
	int rc = kvt_t3_get_blocks(rs->impl, n, hashes, stop_at_miss, metas, payloads, payload_cap, results);
	free(own);
	return rc ? kvt_rstore_fill(n, results, rc) : kvt_rstore_first_error(n, results);
}

static int t3_exists(kvt_rstore *rs, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], const kvt_rstore_loc *locs,
		     int *results)
{
	(void)locs;
	if (!hashes && n)
		return kvt_rstore_fill(n, results, KVT_EINVAL);
	int rc = kvt_t3_has_blocks(rs->impl, n, hashes, results);
	return rc ? kvt_rstore_fill(n, results, rc) : kvt_rstore_first_error(n, results);
}

static int t3_del(kvt_rstore *rs, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], const kvt_rstore_loc *locs,
		  int *results)
{
	(void)locs;
	if (!hashes && n)
		return kvt_rstore_fill(n, results, KVT_EINVAL);
	int rc = kvt_t3_delete_blocks(rs->impl, n, hashes, results);
	return rc ? kvt_rstore_fill(n, results, rc) : kvt_rstore_first_error(n, results);
}

static int t3_iterate(kvt_rstore *rs, kvt_rstore_visit_fn fn, void *ctx)
{
	(void)rs, (void)fn, (void)ctx;
	return KVT_EUNSUPPORTED;
}

static void t3_stats(kvt_rstore *rs, kvt_rstore_stats *st)
{
	kvt_t3_stats s;
	kvt_t3_get_stats(rs->impl, &s);
	*st = (kvt_rstore_stats){
		.held_known = false,
		.n_puts = s.n_writes,
		.bytes_put = s.bytes_out,
		.n_gets = s.hits + s.misses,
		.bytes_got = s.bytes_in,
		.n_corrupt = s.n_corrupt,
		.n_errors = s.n_errors,
		.degraded = s.degraded,
	};
}

static const kvt_rstore_ops t3_ops = {
	.put = t3_put,
	.get = t3_get,
	.exists = t3_exists,
	.del = t3_del,
	.iterate = t3_iterate,
	.stats = t3_stats,
};

void kvt_rstore_t3_init(kvt_rstore *rs, kvt_t3 *t)
{
	*rs = (kvt_rstore){ .ops = &t3_ops, .impl = t, .name = "t3" };
}
