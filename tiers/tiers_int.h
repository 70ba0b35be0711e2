/*
 * tiers/tiers_int.h — internals shared by the tier pools (not for engine/).
 *
 * kvt_slots is the bookkeeping of a pool of fixed slots, shared by T0 and T1:
 * a reference count per slot and a LIFO stack of the free ones (recently
 * freed slots are reused first, which keeps a GPU's L2 and a CPU's caches
 * warm). Invariant: a slot is on the stack iff its count is 0. ref/unref of
 * a free slot is a programmer error and aborts. One mutex; every call is
 * safe from any thread.
 */
#ifndef KVT_TIERS_INT_H
#define KVT_TIERS_INT_H

#include "kvt.h"

#include <pthread.h>

typedef struct kvt_slots {
	const char *name;      /* "t0" or "t1", for messages */
	uint32_t n_slots;      /* slots */
	uint32_t *refs;        /* [n_slots] holders per slot */
	int32_t *free_stack;   /* [n_slots] free slot numbers, top at n_free - 1 */
	uint32_t n_free;       /* entries on free_stack */
	pthread_mutex_t mu;    /* guards refs, free_stack, n_free */
} kvt_slots;

/* Every slot free; slot 0 is handed out first. KVT_ENOMEM. */
int kvt_slots_init(kvt_slots *s, const char *name, uint32_t n_slots);
void kvt_slots_deinit(kvt_slots *s);
uint32_t kvt_slots_n_free(kvt_slots *s);
int kvt_slots_alloc(kvt_slots *s, int32_t *slot); /* KVT_EFULL when none is free */
void kvt_slots_ref(kvt_slots *s, int32_t slot);
void kvt_slots_unref(kvt_slots *s, int32_t slot);
uint32_t kvt_slots_refcount(kvt_slots *s, int32_t slot);
/* Walk the invariants: KVT_ECORRUPT (logged, naming the slot) if broken. */
int kvt_slots_check(kvt_slots *s);

#endif
