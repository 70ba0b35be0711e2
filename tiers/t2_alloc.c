/*
 * tiers/t2_alloc.c — the T2 space allocator over 4 KiB units of the file.
 *
 * Design: a bitmap (one bit per unit, 1 = used) is the only truth; it makes
 * overlap checks at start-up (mark_used from index rows) exact and lets any
 * size of extent be carved, so a block that compresses to 60% takes 60% of
 * the units. On top of it, exact-size free lists (one per size in units, up to
 * 63 units; larger extents use the bitmap search only) make the common case —
 * a freed block's extent reused by a same-sized block — O(1) and keep the
 * file unfragmented. List entries are hints: each is re-checked against the
 * bitmap on pop (the rotor search may have taken part of it meanwhile).
 * The search is next-fit from a rotor, skipping full 64-unit words.
 *
 * Invariants: the reserved units (the superblock copies) are always used; n_used equals the
 * number of set bits; quar is a subset of used; a quarantined unit is never
 * handed out until it was freed by its owner and then
 * kvt_t2_alloc_release_quarantine ran.
 * Callers hold the store's mutex.
 */
#include "t2_int.h"

#include <stdlib.h>
#include <string.h>

static bool bit(const uint64_t *m, uint64_t i) { return (m[i >> 6] >> (i & 63)) & 1; }
static void set_range(uint64_t *m, uint64_t u, uint64_t k, bool v)
{
	for (uint64_t i = u; i < u + k; i++) {
		if (v)
			m[i >> 6] |= 1ull << (i & 63);
		else
			m[i >> 6] &= ~(1ull << (i & 63));
	}
}
static bool range_clear(const uint64_t *m, uint64_t u, uint64_t k)
{
	for (uint64_t i = u; i < u + k; i++)
		if (bit(m, i))
			return false;
	return true;
}

int kvt_t2_alloc_init(kvt_t2_alloc *a, uint64_t n_units, uint64_t n_reserved)
{
	KVT_ASSERT(n_reserved >= 1 && n_reserved < n_units);
	memset(a, 0, sizeof(*a));
	a->n_units = n_units;
	a->n_reserved = n_reserved;
	a->n_words = (n_units + 63) / 64;
	a->used = calloc(a->n_words, sizeof(uint64_t));
	a->quar = calloc(a->n_words, sizeof(uint64_t));
	if (!a->used || !a->quar) {
		kvt_t2_alloc_deinit(a);
		return KVT_ENOMEM;
	}
	/* the bits past n_units in the last word count as used, so searches stop there */
	for (uint64_t i = n_units; i < a->n_words * 64; i++)
		a->used[i >> 6] |= 1ull << (i & 63);
	set_range(a->used, 0, n_reserved, true);
	a->n_used = n_reserved;
	a->rotor = n_reserved;
	return KVT_OK;
}

void kvt_t2_alloc_deinit(kvt_t2_alloc *a)
{
	free(a->used);
	free(a->quar);
	free(a->qfreed);
	for (unsigned k = 0; k < KVT_T2_N_LISTS; k++)
		free(a->lists[k]);
	memset(a, 0, sizeof(*a));
}

static void take(kvt_t2_alloc *a, uint64_t u, uint64_t k)
{
	set_range(a->used, u, k, true);
	a->n_used += k;
	a->n_extents++;
}

/* Next-fit search for k clear bits from the rotor, wrapping once. */
static bool search(kvt_t2_alloc *a, uint64_t k, uint64_t *unit)
{
	uint64_t start = a->rotor < a->n_units ? a->rotor : a->n_reserved;
	for (int pass = 0; pass < 2; pass++) {
		uint64_t i = pass == 0 ? start : a->n_reserved, end = pass == 0 ? a->n_units : start + k;
		if (end > a->n_units)
			end = a->n_units;
		uint64_t run = 0;
		while (i < end) {
			if ((i & 63) == 0 && a->used[i >> 6] == ~0ull) {
				run = 0;
				i += 64;
				continue;
			}
			if (bit(a->used, i)) {
				run = 0;
			} else if (++run == k) {
				*unit = i + 1 - k;
				return true;
			}
			i++;
		}
	}
	return false;
}

int kvt_t2_alloc_get(kvt_t2_alloc *a, uint64_t k, uint64_t *unit)
{
	KVT_ASSERT(k > 0);
	if (k < KVT_T2_N_LISTS) {
		while (a->list_n[k] > 0) {
			uint64_t u = a->lists[k][--a->list_n[k]];
			if (u + k <= a->n_units && range_clear(a->used, u, k)) {
				take(a, u, k);
				*unit = u;
				return KVT_OK;
			}
		}
	}
	if (k > a->n_units - a->n_used || !search(a, k, unit))
		return KVT_EFULL;
	take(a, *unit, k);
	a->rotor = *unit + k;
	return KVT_OK;
}

bool kvt_t2_alloc_mark(kvt_t2_alloc *a, uint64_t unit, uint64_t k)
{
	if (unit < a->n_reserved || k == 0 || unit >= a->n_units || k > a->n_units - unit || !range_clear(a->used, unit, k))
		return false;
	take(a, unit, k);
	return true;
}

bool kvt_t2_alloc_is_used(const kvt_t2_alloc *a, uint64_t unit, uint64_t k)
{
	if (unit < a->n_reserved || k == 0 || unit >= a->n_units || k > a->n_units - unit)
		return false;
	for (uint64_t i = unit; i < unit + k; i++)
		if (!bit(a->used, i))
			return false;
	return true;
}

/* Remember a freed k-unit extent for exact-size reuse (a hint; losing it is harmless). */
static void list_push(kvt_t2_alloc *a, uint64_t unit, uint64_t k)
{
	if (k >= KVT_T2_N_LISTS)
		return;
	if (a->list_n[k] == a->list_cap[k]) {
		uint32_t cap = a->list_cap[k] ? a->list_cap[k] * 2 : 64;
		uint64_t *p = realloc(a->lists[k], cap * sizeof(uint64_t));
		if (!p)
			return;
		a->lists[k] = p;
		a->list_cap[k] = cap;
	}
	a->lists[k][a->list_n[k]++] = unit;
}

bool kvt_t2_alloc_put(kvt_t2_alloc *a, uint64_t unit, uint64_t k)
{
	KVT_ASSERT(kvt_t2_alloc_is_used(a, unit, k));
	if (bit(a->quar, unit)) {
		/* no longer a record, but its units stay out of allocation until
		 * release_quarantine; remembered so release frees only freed ones.
		 * A second free of it is a caller bug: ignored. */
		for (uint32_t i = 0; i < a->n_qfreed; i++)
			if (a->qfreed[i].unit == unit)
				return false;
		a->n_extents--;
		if (a->n_qfreed == a->qfreed_cap) {
			uint32_t cap = a->qfreed_cap ? a->qfreed_cap * 2 : 16;
			void *p = realloc(a->qfreed, cap * sizeof(*a->qfreed));
			if (!p)
				return false; /* kept quarantined for good: safe, only space lost */
			a->qfreed = p;
			a->qfreed_cap = cap;
		}
		a->qfreed[a->n_qfreed].unit = unit;
		a->qfreed[a->n_qfreed].k = k;
		a->n_qfreed++;
		return false;
	}
	set_range(a->used, unit, k, false);
	a->n_used -= k;
	a->n_extents--;
	list_push(a, unit, k);
	return true;
}

void kvt_t2_alloc_quarantine(kvt_t2_alloc *a, uint64_t unit, uint64_t k)
{
	/* only an extent we hold (a loc that was never ours quarantines nothing) */
	if (!kvt_t2_alloc_is_used(a, unit, k) || bit(a->quar, unit))
		return;
	set_range(a->quar, unit, k, true);
	a->n_quar_ext++;
}

void kvt_t2_alloc_release_quarantine(kvt_t2_alloc *a)
{
	for (uint32_t i = 0; i < a->n_qfreed; i++) {
		uint64_t u = a->qfreed[i].unit, k = a->qfreed[i].k;
		if (!bit(a->quar, u))
			continue;
		set_range(a->quar, u, k, false);
		set_range(a->used, u, k, false);
		a->n_used -= k;
		a->n_quar_ext--;
		list_push(a, u, k);
	}
	a->n_qfreed = 0;
}
