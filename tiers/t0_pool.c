/*
 * tiers/t0_pool.c — T0, the device block pool.
 *
 * Invariants: a slot is on the free list iff its count is 0; the free list
 * is a LIFO stack (recently freed slots are reused first, which keeps the
 * working set of a GPU's L2 and a CPU's caches warm); ref/unref of a free
 * slot is a programmer error and aborts.
 */
#include "tiers.h"

#include <pthread.h>
#include <stdlib.h>

struct kvt_t0_pool {
	kvt_dev *dev;          /* borrowed */
	kvt_kv_layout layout;  /* pool points at the device allocation */
	size_t block_bytes;    /* bytes per slot */
	uint32_t *refs;        /* [n_slots] holders per slot */
	int32_t *free_stack;   /* [n_slots] free slot numbers, top at n_free - 1 */
	uint32_t n_free;       /* entries on free_stack */
	pthread_mutex_t mu;    /* guards refs, free_stack, n_free */
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
	p->refs = calloc(n_slots, sizeof(*p->refs));
	p->free_stack = malloc(n_slots * sizeof(*p->free_stack));
	if (!p->refs || !p->free_stack) {
		rc = KVT_ENOMEM;
		goto fail;
	}
	rc = kvt_dev_alloc(d, (size_t)total, &p->layout.pool);
	if (rc)
		goto fail;
	/* push in reverse so slot 0 is handed out first */
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

void kvt_t0_destroy(kvt_t0_pool *p)
{
	if (!p)
		return;
	kvt_dev_free(p->dev, p->layout.pool);
	pthread_mutex_destroy(&p->mu);
	free(p->refs);
	free(p->free_stack);
	free(p);
}

const kvt_kv_layout *kvt_t0_layout(const kvt_t0_pool *p) { return &p->layout; }
size_t kvt_t0_block_bytes(const kvt_t0_pool *p) { return p->block_bytes; }
uint32_t kvt_t0_n_slots(const kvt_t0_pool *p) { return p->layout.n_slots; }

uint32_t kvt_t0_n_free(const kvt_t0_pool *p)
{
	kvt_t0_pool *mp = (kvt_t0_pool *)p;
	pthread_mutex_lock(&mp->mu);
	uint32_t n = p->n_free;
	pthread_mutex_unlock(&mp->mu);
	return n;
}

int kvt_t0_alloc(kvt_t0_pool *p, int32_t *slot)
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

void kvt_t0_ref(kvt_t0_pool *p, int32_t slot)
{
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < p->layout.n_slots);
	pthread_mutex_lock(&p->mu);
	KVT_ASSERT(p->refs[slot] > 0);
	p->refs[slot]++;
	pthread_mutex_unlock(&p->mu);
}

void kvt_t0_unref(kvt_t0_pool *p, int32_t slot)
{
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < p->layout.n_slots);
	pthread_mutex_lock(&p->mu);
	KVT_ASSERT(p->refs[slot] > 0);
	if (--p->refs[slot] == 0)
		p->free_stack[p->n_free++] = slot;
	pthread_mutex_unlock(&p->mu);
}

uint32_t kvt_t0_refcount(const kvt_t0_pool *p, int32_t slot)
{
	kvt_t0_pool *mp = (kvt_t0_pool *)p;
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < p->layout.n_slots);
	pthread_mutex_lock(&mp->mu);
	uint32_t n = p->refs[slot];
	pthread_mutex_unlock(&mp->mu);
	return n;
}

int kvt_t0_check(const kvt_t0_pool *p)
{
	kvt_t0_pool *mp = (kvt_t0_pool *)p;
	const uint32_t n = p->layout.n_slots;
	unsigned char *listed = calloc(n, 1);
	uint32_t n_zero = 0;
	int rc = KVT_OK;

	if (!listed)
		return KVT_ENOMEM;
	pthread_mutex_lock(&mp->mu);
	for (uint32_t i = 0; i < p->n_free && rc == KVT_OK; i++) {
		int32_t s = p->free_stack[i];
		if (s < 0 || (uint32_t)s >= n || listed[s] || p->refs[s]) {
			KVT_LOGE("t0 slot %d: bad free-list entry %u (listed twice, out of range or in use)", s, i);
			rc = KVT_ECORRUPT;
			break;
		}
		listed[s] = 1;
	}
	for (uint32_t s = 0; s < n && rc == KVT_OK; s++)
		n_zero += p->refs[s] == 0;
	if (rc == KVT_OK && n_zero != p->n_free) {
		KVT_LOGE("t0: %u slots have no holder but %u are free", n_zero, p->n_free);
		rc = KVT_ECORRUPT;
	}
	pthread_mutex_unlock(&mp->mu);
	free(listed);
	return rc;
}
