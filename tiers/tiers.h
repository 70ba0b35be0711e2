/*
 * tiers/tiers.h — the KV block pools. For now T0: the device block pool the
 * engine's paged attention reads (host memory on the CPU backend).
 *
 * A T0 slot holds one block record (all layers, K and V, fp16, the layout of
 * kvt_kv_layout). Slots are carved once at creation from one device
 * allocation; nothing is allocated afterwards. Each slot has a reference
 * count: kvt_t0_alloc hands out a slot with count 1, kvt_t0_ref adds a
 * holder (a second sequence sharing a prefix block), kvt_t0_unref drops one
 * and returns the slot to the free list at zero. A slot with a non-zero count
 * is never handed out again.
 *
 * Thread rules: all calls are safe from any thread (one mutex; the hot path
 * takes it once per block, not per token).
 */
#ifndef KVT_TIERS_H
#define KVT_TIERS_H

#include "dev.h"

typedef struct kvt_t0_pool kvt_t0_pool;

/*
 * Create a pool of n_slots blocks shaped like *shape (its pool and n_slots
 * fields are ignored) in device memory of d (borrowed; must outlive the
 * pool). KVT_ENOMEM when the device cannot hold it.
 */
int kvt_t0_create(kvt_dev *d, const kvt_kv_layout *shape, uint32_t n_slots, kvt_t0_pool **out);
void kvt_t0_destroy(kvt_t0_pool *p); /* NULL is a no-op */

/* The full layout, pool pointer included, for the device ops. */
const kvt_kv_layout *kvt_t0_layout(const kvt_t0_pool *p);
size_t kvt_t0_block_bytes(const kvt_t0_pool *p);
uint32_t kvt_t0_n_slots(const kvt_t0_pool *p);
uint32_t kvt_t0_n_free(const kvt_t0_pool *p);

/* Take a free slot (count 1). KVT_EFULL when none is free (not logged: callers evict). */
int kvt_t0_alloc(kvt_t0_pool *p, int32_t *slot);
/* Add a holder to a slot in use. */
void kvt_t0_ref(kvt_t0_pool *p, int32_t slot);
/* Drop a holder; at zero the slot is free again. */
void kvt_t0_unref(kvt_t0_pool *p, int32_t slot);
uint32_t kvt_t0_refcount(const kvt_t0_pool *p, int32_t slot);
/*
 * Walk the pool and check its invariants: every free-list entry is a slot in
 * range with count 0, listed once, and the slots with count 0 are exactly
 * those listed. KVT_ECORRUPT (logged, naming the slot) if not. Debug and test
 * builds call it; it takes the pool's mutex.
 */
int kvt_t0_check(const kvt_t0_pool *p);

#endif
