/*
 * tiers/slots.c — fixed-slot bookkeeping for the tier pools (tiers_int.h).
 */
#include "tiers_int.h"

#include <stdlib.h>

int kvt_slots_init(kvt_slots *s, const char *name, uint32_t n_slots)
{
	s->name = name;
	s->n_slots = n_slots;
	s->refs = calloc(n_slots, sizeof(*s->refs));
	s->free_stack = malloc(n_slots * sizeof(*s->free_stack));
	if (!s->refs || !s->free_stack) {
		free(s->refs);
		free(s->free_stack);
		return KVT_ENOMEM;
	}
	for (uint32_t i = 0; i < n_slots; i++) /* pushed in reverse: slot 0 comes out first */
		s->free_stack[i] = (int32_t)(n_slots - 1 - i);
	s->n_free = n_slots;
	pthread_mutex_init(&s->mu, NULL);
	return KVT_OK;
}

void kvt_slots_deinit(kvt_slots *s)
{
	pthread_mutex_destroy(&s->mu);
	free(s->refs);
	free(s->free_stack);
}

uint32_t kvt_slots_n_free(kvt_slots *s)
{
	pthread_mutex_lock(&s->mu);
	uint32_t n = s->n_free;
	pthread_mutex_unlock(&s->mu);
	return n;
}

int kvt_slots_alloc(kvt_slots *s, int32_t *slot)
{
	int rc = KVT_EFULL;

	pthread_mutex_lock(&s->mu);
	if (s->n_free) {
		int32_t i = s->free_stack[--s->n_free];
		KVT_ASSERT(s->refs[i] == 0);
		s->refs[i] = 1;
		*slot = i;
		rc = KVT_OK;
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void kvt_slots_ref(kvt_slots *s, int32_t slot)
{
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < s->n_slots);
	pthread_mutex_lock(&s->mu);
	KVT_ASSERT(s->refs[slot] > 0);
	s->refs[slot]++;
	pthread_mutex_unlock(&s->mu);
}

void kvt_slots_unref(kvt_slots *s, int32_t slot)
{
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < s->n_slots);
	pthread_mutex_lock(&s->mu);
	KVT_ASSERT(s->refs[slot] > 0);
	if (--s->refs[slot] == 0)
		s->free_stack[s->n_free++] = slot;
	pthread_mutex_unlock(&s->mu);
}

uint32_t kvt_slots_refcount(kvt_slots *s, int32_t slot)
{
	KVT_ASSERT(slot >= 0 && (uint32_t)slot < s->n_slots);
	pthread_mutex_lock(&s->mu);
	uint32_t n = s->refs[slot];
	pthread_mutex_unlock(&s->mu);
	return n;
}

int kvt_slots_check(kvt_slots *s)
{
	const uint32_t n = s->n_slots;
	unsigned char *listed = calloc(n, 1);
	uint32_t n_zero = 0;
	int rc = KVT_OK;

	if (!listed)
		return KVT_ENOMEM;
	pthread_mutex_lock(&s->mu);
	for (uint32_t i = 0; i < s->n_free; i++) {
		int32_t k = s->free_stack[i];
		if (k < 0 || (uint32_t)k >= n || listed[k] || s->refs[k]) {
			KVT_LOGE("%s slot %d: bad free-list entry %u (listed twice, out of range or in use)", s->name, k, i);
			rc = KVT_ECORRUPT;
			break;
		}
		listed[k] = 1;
	}
	for (uint32_t k = 0; k < n && rc == KVT_OK; k++)
		n_zero += s->refs[k] == 0;
	if (rc == KVT_OK && n_zero != s->n_free) {
		KVT_LOGE("%s: %u slots have no holder but %u are free", s->name, n_zero, s->n_free);
		rc = KVT_ECORRUPT;
	}
	pthread_mutex_unlock(&s->mu);
	free(listed);
	return rc;
}
