/*
 * tests/argmax_plain.h — the plain argmax loop, the oracle that core's
 * kvt_argmax_f32 (eight running maxima) must agree with: test_sampler checks
 * them against each other, bench_argmax times them side by side.
 */
#ifndef KVT_TEST_ARGMAX_PLAIN_H
#define KVT_TEST_ARGMAX_PLAIN_H

#include <stdint.h>

static inline uint32_t argmax_plain(const float *x, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

#endif
