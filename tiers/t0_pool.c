/*
 * tiers/t0_pool.c — T0, the device block pool: one device allocation cut
 * into fixed slots of one block record each, with the slot bookkeeping of
 * tiers_int.h (a count per slot, a LIFO free list).
 */
#include "tiers.h"
#include "tiers_int.h"

#include <stdlib.h>

struct kvt_t0_pool {
	kvt_dev *dev;          /* borrowed */
	kvt_kv_layout layout;  /* pool points at the device allocation */
	size_t block_bytes;    /* bytes per slot */
	kvt_slots slots;       /* counts and the free list */
};

int kvt_t0_create(kvt_dev *d, const kvt_kv_layout *shape, uint32_t n_slots, kvt_t0_pool **out)
{
	kvt_t0_pool *p;
	uint64_t total;
	int rc;

	if (!n_slots || !shape->n_layers || !shape->n_kv_heads || !shape->head_dim || !shape->block_tokens) {
		KVT_LOGE("t0: empty pool shape (%u slots)", n_slots);
		return KVT_EINVAL;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return KVT_ENOMEM;
	p->dev = d;
	p->layout = *shape;
	p->layout.n_slots = n_slots;
	p->block_bytes = kvt_kv_block_bytes(&p->layout);
	if (!kvt_mul_u64(p->block_bytes, n_slots, &total) || total > SIZE_MAX) {
		KVT_LOGE("t0: %u slots of %zu bytes overflow", n_slots, p->block_bytes);
		free(p);
		return KVT_EINVAL;
	}
	if ((rc = kvt_slots_init(&p->slots, "t0", n_slots))) {
		free(p);
		return rc;
	}
	if ((rc = kvt_dev_alloc(d, (size_t)total, &p->layout.pool))) {
		kvt_slots_deinit(&p->slots);
		free(p);
		return rc;
	}
	*out = p;
	return KVT_OK;
}

void kvt_t0_destroy(kvt_t0_pool *p)
{
	if (!p)
		return;
	kvt_dev_free(p->dev, p->layout.pool);
	kvt_slots_deinit(&p->slots);
	free(p);
}

const kvt_kv_layout *kvt_t0_layout(const kvt_t0_pool *p) { return &p->layout; }
size_t kvt_t0_block_bytes(const kvt_t0_pool *p) { return p->block_bytes; }
uint32_t kvt_t0_n_slots(const kvt_t0_pool *p) { return p->layout.n_slots; }

uint32_t kvt_t0_n_free(const kvt_t0_pool *p) { return kvt_slots_n_free((kvt_slots *)&p->slots); }
int kvt_t0_alloc(kvt_t0_pool *p, int32_t *slot) { return kvt_slots_alloc(&p->slots, slot); }
void kvt_t0_ref(kvt_t0_pool *p, int32_t slot) { kvt_slots_ref(&p->slots, slot); }
void kvt_t0_unref(kvt_t0_pool *p, int32_t slot) { kvt_slots_unref(&p->slots, slot); }
uint32_t kvt_t0_refcount(const kvt_t0_pool *p, int32_t slot) { return kvt_slots_refcount((kvt_slots *)&p->slots, slot); }
int kvt_t0_check(const kvt_t0_pool *p) { return kvt_slots_check((kvt_slots *)&p->slots); }
