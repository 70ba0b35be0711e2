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

#include <pthread.h>
#include <stdlib.h>

struct kvt_t1_pool {
	kvt_dev *dev;          /* borrowed */
	int codec;             /* enum kvt_kv_codec of every slot */
	size_t slot_bytes;     /* packed block bytes */
	size_t stride_bytes;   /* slot_bytes rounded up to 64 */
	uint32_t n_slots;      /* slots in the pool */
	unsigned char *h_base; /* [n_slots][stride_bytes], pinned host */
	uint32_t *refs;        /* [n_slots] holders per slot */
	int32_t *free_stack;   /* [n_slots] free slot numbers, top at n_free - 1 */
	uint32_t n_free;       /* entries on free_stack */
	pthread_mutex_t mu;    /* guards refs, free_stack, n_free */
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
	p->refs = calloc(n_slots, sizeof(*p->refs));
	p->free_stack = malloc(n_slots * sizeof(*p->free_stack));
	if (!p->refs || !p->free_stack) {
		rc = KVT_ENOMEM;
		goto fail;
	}
	rc = kvt_dev_host_alloc(d, (size_t)total, (void **)&p->h_base);
	if (rc)
		goto fail;
	for (uint32_t i = 0; i < n_slots; i++)
		p->free_stack[i] = (int32_t)(n_slots - 1 - i);
	p->n_free = n_slots;
	pthread_mutex_init(&p->mu, NULL);
	*out = p;
	return KVT_OK;
fail:
	free(p->refs);
	free(p->free_stack);
	free(p);
	return rc;
}

void kvt_t1_destroy(kvt_t1_pool *p)
{
	if (!p)
		return;
	kvt_dev_host_free(p->dev, p->h_base);
	pthread_mutex_destroy(&p->mu);
	free(p->refs);
	free(p->free_stack);
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

uint32_t kvt_t1_n_free(const kvt_t1_pool *p)
{
	kvt_t1_pool *mp = (kvt_t1_pool *)p;
	pthread_mutex_lock(&mp->mu);
	uint32_t n = p->n_free;
	pthread_mutex_unlock(&mp->mu);
	return n;
}

int kvt_t1_alloc(kvt_t1_pool *p, int32_t *slot)
{
	int rc = KVT_EFULL;

	pthread_mutex_lock(&p->mu);
	if (p->n_free) {
		int32_t s = p->free_stack[--p->n_free];
		KVT_ASSERT(p->refs[s] == 0);
		p->refs[s] = 1;
		*slot = s;
		rc = KVT_OK;
	}
	pthread_mutex_unlock(&p->mu);
	return rc;
}

void kvt_t1_ref(kvt_t1_pool *p, int32_t slot)
{
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < p->n_slots);
	pthread_mutex_lock(&p->mu);
	KVT_ASSERT(p->refs[slot] > 0);
	p->refs[slot]++;
	pthread_mutex_unlock(&p->mu);
}

void kvt_t1_unref(kvt_t1_pool *p, int32_t slot)
{
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < p->n_slots);
	pthread_mutex_lock(&p->mu);
	KVT_ASSERT(p->refs[slot] > 0);
	if (--p->refs[slot] == 0)
		p->free_stack[p->n_free++] = slot;
	pthread_mutex_unlock(&p->mu);
}

uint32_t kvt_t1_refcount(const kvt_t1_pool *p, int32_t slot)
{
	kvt_t1_pool *mp = (kvt_t1_pool *)p;
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < p->n_slots);
	pthread_mutex_lock(&mp->mu);
	uint32_t n = p->refs[slot];
	pthread_mutex_unlock(&mp->mu);
	return n;
}

int kvt_t1_check(const kvt_t1_pool *p)
{
	kvt_t1_pool *mp = (kvt_t1_pool *)p;
	const uint32_t n = p->n_slots;
	unsigned char *listed = calloc(n, 1);
	uint32_t n_zero = 0;
	int rc = KVT_OK;

	if (!listed)
		return KVT_ENOMEM;
	pthread_mutex_lock(&mp->mu);
	for (uint32_t i = 0; i < p->n_free; i++) {
		int32_t s = p->free_stack[i];
		if (s < 0 || (uint32_t)s >= n || listed[s] || p->refs[s]) {
			KVT_LOGE("t1 slot %d: bad free-list entry %u (listed twice, out of range or in use)", s, i);
			rc = KVT_ECORRUPT;
			break;
		}
		listed[s] = 1;
	}
	for (uint32_t s = 0; s < n && rc == KVT_OK; s++)
		n_zero += p->refs[s] == 0;
	if (rc == KVT_OK && n_zero != p->n_free) {
		KVT_LOGE("t1: %u slots have no holder but %u are free", n_zero, p->n_free);
		rc = KVT_ECORRUPT;
	}
	pthread_mutex_unlock(&mp->mu);
	free(listed);
	return rc;
}
