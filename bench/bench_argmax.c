/*
 * bench/bench_argmax.c — the greedy argmax over a vocabulary of logits: the
 * plain loop (`if (x[i] > x[best]) best = i`, what the reference backend
 * runs) against core's kvt_argmax_f32 (eight running maxima), alternating in
 * the same run, and whether they agree.
 *
 *   bench_argmax [--n 262144] [--calls 200] [--rounds 3]
 *
 * --n defaults to Gemma 3's vocabulary. Uniform random logits in [-10, 10)
 * from a fixed seed; prints microseconds a call for each, per round.
 */
#include "kvt.h"
#include "argmax_plain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	uint32_t n = 262144, calls = 200, rounds = 3;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--n"))
			n = (uint32_t)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--calls"))
			calls = (uint32_t)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--rounds"))
			rounds = (uint32_t)strtoul(argv[i + 1], NULL, 10);
		else {
			fprintf(stderr, "usage: bench_argmax [--n N] [--calls N] [--rounds N]\n");
			return 2;
		}
	}
	if (!n || !calls) {
		fprintf(stderr, "bench_argmax: --n and --calls must be positive\n");
		return 2;
	}
	float *x = malloc((size_t)n * sizeof(float));
	if (!x)
		return 1;
	uint32_t s = 1;
	for (uint32_t i = 0; i < n; i++) {
		s = s * 1664525u + 1013904223u;
		x[i] = (float)(s >> 8) / 16777216.0f * 20.0f - 10.0f;
	}
	uint32_t a = argmax_plain(x, n), b = kvt_argmax_f32(x, n);
	printf("bench_argmax: %u logits, %u calls a round; plain %u, lanes %u (%s)\n", n, calls, a, b,
	       a == b ? "same" : "DIFFERENT");
	for (uint32_t r = 0; r < rounds; r++) {
		volatile uint32_t sink = 0;
		double t = kvt_now_s();
		for (uint32_t k = 0; k < calls; k++)
			sink += argmax_plain(x, n);
		double tp = kvt_now_s() - t;
		t = kvt_now_s();
		for (uint32_t k = 0; k < calls; k++)
			sink += kvt_argmax_f32(x, n);
		double tl = kvt_now_s() - t;
		printf("round %u: plain %.1f us, lanes %.1f us (%.2fx)\n", r, tp / calls * 1e6, tl / calls * 1e6, tp / tl);
		(void)sink;
	}
	free(x);
	return a == b ? 0 : 1;
}
