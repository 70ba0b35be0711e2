/*
 * core/argmax.c — the index of the largest float, as the plain loop gives it
 * but with eight running maxima instead of one.
 *
 * The plain loop `best = 0; for i: if (x[i] > x[best]) best = i` waits on
 * the last comparison at every element (a load and a compare that depend on
 * best): 1.1 ms for Gemma 3's 262,144 logits on an EPYC, 2.7% of its decode
 * step under perf. Lane l here keeps the best of the elements i = l mod 8,
 * all eight started from x[0], and the lanes are merged at the end: 0.22 ms
 * for the same logits (bench/bench_argmax).
 *
 * Why it is the same index: the plain loop moves only to a strictly larger
 * value, so it ends on the first element equal (==) to the maximum of the
 * non-NaN values, NaNs never taken (a NaN compares false) — and on 0 when
 * x[0] is a NaN (so do all eight lanes here). Each lane ends on the first of
 * its elements equal to its own maximum; the largest lane maximum is the
 * overall one, and of the lanes holding it the smallest index is the first
 * overall. +0 and -0 compare
 * equal in both. test_sampler checks it against the plain loop.
 */
#include "kvt.h"

uint32_t kvt_argmax_f32(const float *x, uint32_t n)
{
	enum { LANES = 8 };
	if (n == 0)
		return 0;
	float bv[LANES];
	uint32_t bi[LANES];
	for (int l = 0; l < LANES; l++)
		bv[l] = x[0], bi[l] = 0;
	uint32_t i = 0;
	for (; i + LANES <= n; i += LANES)
		for (int l = 0; l < LANES; l++)
			if (x[i + l] > bv[l])
				bv[l] = x[i + l], bi[l] = i + (uint32_t)l;
	for (int l = 0; i < n; i++, l++)
		if (x[i] > bv[l])
			bv[l] = x[i], bi[l] = i;
	uint32_t best = bi[0];
	float v = bv[0];
	for (int l = 1; l < LANES; l++)
		if (bv[l] > v || (bv[l] == v && bi[l] < best))
			v = bv[l], best = bi[l];
	return best;
}
