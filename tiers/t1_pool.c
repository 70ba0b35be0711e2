/*
 * tiers/t1_pool.c — T1, the pinned host pool of packed blocks.
 *
 * One kvt_dev_host_alloc carved into n_slots slots of kvt_kv_packed_bytes
 * each (rounded up to 64 bytes so every slot starts on a cache line; the
 * copies and the T2 writer read whole slots). Invariants as T0: a slot is on
 * the free list iff its count is 0; the free list is a LIFO stack; ref/unref
 * of a free slot is a programmer error and aborts.
 */
#include "tiers.h"
#include "tiers_int.h"

#include <stdlib.h>

struct kvt_t1_pool {
	kvt_dev *dev;          /* borrowed */
	int codec;             /* enum kvt_kv_codec of every slot */
	size_t slot_bytes;     /* packed block bytes */
	size_t stride_bytes;   /* slot_bytes rounded up to 64 */
	uint32_t n_slots;      /* slots in the pool */
	unsigned char *h_base; /* [n_slots][stride_bytes], pinned host */
	kvt_slots slots;       /* counts and the free list */
};

int kvt_t1_create(kvt_dev *d, const kvt_kv_layout *shape, int codec, uint32_t n_slots, kvt_t1_pool **out)
{
	kvt_t1_pool *p;
	uint64_t total;
	int rc;

	if (!n_slots || !shape->n_layers || !shape->n_kv_heads || !shape->head_dim || !shape->block_tokens) {
		KVT_LOGE("t1: empty pool shape (%u slots)", n_slots);
		return KVT_EINVAL;
	}
	if (codec < 0 || codec >= KVT_KV_CODEC_COUNT) {
		KVT_LOGE("t1: codec %d is not f16, fp8 or int8", codec);
		return KVT_EINVAL;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return KVT_ENOMEM;
	p->dev = d;
	p->codec = codec;
	p->n_slots = n_slots;
	p->slot_bytes = kvt_kv_packed_bytes(shape, codec);
	p->stride_bytes = (p->slot_bytes + 63) & ~(size_t)63;
	if (!kvt_mul_u64(p->stride_bytes, n_slots, &total) || total > SIZE_MAX) {
		KVT_LOGE("t1: %u slots of %zu bytes overflow", n_slots, p->slot_bytes);
		free(p);
		return KVT_EINVAL;
	}
	if ((rc = kvt_slots_init(&p->slots, "t1", n_slots))) {
		free(p);
		return rc;
	}
	if ((rc = kvt_dev_host_alloc(d, (size_t)total, (void **)&p->h_base))) {
		kvt_slots_deinit(&p->slots);
		free(p);
		return rc;
	}
	*out = p;
	return KVT_OK;
}

void kvt_t1_destroy(kvt_t1_pool *p)
{
	if (!p)
		return;
	kvt_dev_host_free(p->dev, p->h_base);
	kvt_slots_deinit(&p->slots);
	free(p);
}

int kvt_t1_codec(const kvt_t1_pool *p) { return p->codec; }
size_t kvt_t1_slot_bytes(const kvt_t1_pool *p) { return p->slot_bytes; }
uint32_t kvt_t1_n_slots(const kvt_t1_pool *p) { return p->n_slots; }

void *kvt_t1_slot_ptr(const kvt_t1_pool *p, int32_t slot)
{
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < p->n_slots);
	return p->h_base + (size_t)slot * p->stride_bytes;
}

uint32_t kvt_t1_n_free(const kvt_t1_pool *p) { return kvt_slots_n_free((kvt_slots *)&p->slots); }
int kvt_t1_alloc(kvt_t1_pool *p, int32_t *slot) { return kvt_slots_alloc(&p->slots, slot); }
void kvt_t1_ref(kvt_t1_pool *p, int32_t slot) { kvt_slots_ref(&p->slots, slot); }
void kvt_t1_unref(kvt_t1_pool *p, int32_t slot) { kvt_slots_unref(&p->slots, slot); }
uint32_t kvt_t1_refcount(const kvt_t1_pool *p, int32_t slot) { return kvt_slots_refcount((kvt_slots *)&p->slots, slot); }
int kvt_t1_check(const kvt_t1_pool *p) { return kvt_slots_check((kvt_slots *)&p->slots); }
