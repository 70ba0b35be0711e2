/*
 * tiers/rstore_t2.c — the record-store seam (rstore.h) over the T2 file
 * (t2_store.h): each op is one call into kvt_t2_store, which keeps every
 * rule (record format, verification, write order, quarantine, locking).
 *
 * Mapping: put is kvt_t2_write_batch (a record's KVT_OK means durable);
 * get is kvt_t2_read_batch_live (a loc whose extent is not in use is a miss);
 * exists is kvt_t2_holds; del is kvt_t2_holds then kvt_t2_free (so deleting
 * what is not there is KVT_ENOTFOUND, not the store's caller-bug log line);
 * iterate is kvt_t2_scan; stats is kvt_t2_get_stats.
 * Invariant: the view holds nothing but the store pointer.
 */
#include "rstore.h"

static int t2_put(kvt_rstore *rs, uint32_t n, const kvt_rstore_rec *recs, kvt_rstore_loc *locs, int *results)
{
	return kvt_t2_write_batch(rs->impl, n, recs, locs, results);
}

static int t2_get(kvt_rstore *rs, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], const kvt_rstore_loc *locs,
		  bool stop_at_miss, kvt_t2_block_meta *metas, void *const *payloads, size_t payload_cap, int *results)
{
	(void)stop_at_miss; /* a hint: T2 reads the whole batch at queue depth */
	if (!locs && n) {
		KVT_LOGE("t2 %s: get without locs", kvt_t2_file_path(rs->impl));
		return kvt_rstore_fill(n, results, KVT_EINVAL);
	}
	return kvt_t2_read_batch_live(rs->impl, n, locs, hashes, metas, payloads, payload_cap, results);
}

static int t2_exists(kvt_rstore *rs, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], const kvt_rstore_loc *locs,
		     int *results)
{
	(void)hashes; /* nothing is read */
	if (!locs && n)
		return kvt_rstore_fill(n, results, KVT_EINVAL);
	for (uint32_t i = 0; i < n; i++)
		results[i] = kvt_t2_holds(rs->impl, &locs[i]);
	return kvt_rstore_first_error(n, results);
}

static int t2_del(kvt_rstore *rs, uint32_t n, const uint8_t (*hashes)[KVT_HASH_BYTES], const kvt_rstore_loc *locs,
		  int *results)
{
	(void)hashes;
	if (!locs && n)
		return kvt_rstore_fill(n, results, KVT_EINVAL);
	for (uint32_t i = 0; i < n; i++) {
		results[i] = kvt_t2_holds(rs->impl, &locs[i]);
		if (results[i] == KVT_OK)
			kvt_t2_free(rs->impl, &locs[i]);
	}
	return kvt_rstore_first_error(n, results);
}

static int t2_iterate(kvt_rstore *rs, kvt_rstore_visit_fn fn, void *ctx)
{
	return kvt_t2_scan(rs->impl, fn, ctx);
}

static void t2_stats(kvt_rstore *rs, kvt_rstore_stats *st)
{
	kvt_t2_stats s;
	kvt_t2_get_stats(rs->impl, &s);
	*st = (kvt_rstore_stats){
		.held_known = true,
		.n_records = s.n_records,
		.used_bytes = s.used_bytes,
		.capacity_bytes = s.capacity_bytes,
		.n_puts = s.n_writes,
		.bytes_put = s.bytes_written,
		.n_gets = s.n_reads,
		.bytes_got = s.bytes_read,
		.n_corrupt = s.n_corrupt,
		.n_full = s.n_enospc,
		.n_errors = 0,
		.degraded = s.degraded,
		.read_only = s.read_only,
	};
}

static const kvt_rstore_ops t2_ops = {
	.put = t2_put,
	.get = t2_get,
	.exists = t2_exists,
	.del = t2_del,
	.iterate = t2_iterate,
	.stats = t2_stats,
};

void kvt_rstore_t2_init(kvt_rstore *rs, kvt_t2_store *s)
{
	*rs = (kvt_rstore){ .ops = &t2_ops, .impl = s, .name = "t2" };
}
