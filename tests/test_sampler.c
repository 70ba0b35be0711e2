/* ctest-labels: unit */
/*
 * tests/test_sampler.c — greedy, temperature, top-k and top-p sampling:
 * greedy is the argmax (lowest id on ties); a seed reproduces a run; top-k 1
 * and a tiny top-p are greedy; draws follow the softmax (checked on 20,000
 * seeded draws); tokens outside top-k or the nucleus are never drawn; bad
 * parameters are refused.
 */
#include "check.h"
#include "argmax_plain.h"
#include "sampler.h"

#include <stdlib.h>

#define V 8

/*
 * kvt_argmax (eight running maxima) against the plain loop: every length 0..70
 * (each tail) and some long ones, values drawn from a few levels so that ties
 * are common, with NaNs, both zeros and infinities mixed in, x[0] among them.
 */
static void test_argmax_lanes(void)
{
	static float x[70000];
	const float levels[] = { -1.0f, 0.0f, -0.0f, 2.0f, 2.0f, 3.5f, -INFINITY, INFINITY, NAN, -3.0f, 1e-30f };
	const uint32_t n_levels = sizeof(levels) / sizeof(levels[0]);
	uint32_t seed = 12345, n_checked = 0, n_nan0 = 0;
	for (int trial = 0; trial < 6000; trial++) {
		uint32_t n = trial < 4000 ? (uint32_t)(trial % 71) : 1000 + (uint32_t)(trial * 7919 % 69000);
		/* a trial's mix: only finite levels, or with infinities, or with NaNs too */
		uint32_t mix = (uint32_t)trial % 3, span = mix == 0 ? 6 : mix == 1 ? 8 : n_levels;
		for (uint32_t i = 0; i < n; i++) {
			seed = seed * 1664525u + 1013904223u;
			uint32_t r = seed >> 8;
			x[i] = r % 4 ? levels[r / 4 % 6] - (float)(r / 24 % 1000) : levels[r / 4 % span];
		}
		n_nan0 += n && isnan(x[0]);
		uint32_t got = (uint32_t)kvt_argmax(x, n), want = argmax_plain(x, n);
		CHECKF(got == want, "argmax of %u values (trial %d): %u, the plain loop %u", n, trial, got, want);
		n_checked++;
	}
	CHECK(n_checked == 6000 && n_nan0 > 0);
	/* a NaN first gives 0 (nothing compares greater than it), a NaN elsewhere is skipped */
	float nan_first[20] = { NAN, 5, 7 }, nan_mid[20] = { 1, NAN, 0.5f };
	nan_mid[19] = 3;
	CHECK_EQ_INT(kvt_argmax(nan_first, 20), 0);
	CHECK_EQ_INT(kvt_argmax(nan_mid, 20), 19);
	/* ties: the lowest index, also across lanes (9 and 17 share no lane with 3) */
	float tie[40] = { 0 };
	tie[9] = tie[17] = tie[3] = 4;
	CHECK_EQ_INT(kvt_argmax(tie, 40), 3);
}

int main(void)
{
	test_argmax_lanes();

	const float logits[V] = { 1.0f, 3.0f, 0.5f, 3.0f, -2.0f, 2.0f, 0.0f, 1.5f };
	kvt_sampler s;
	kvt_sampler_params p = { 0 };

	CHECK_EQ_INT(kvt_argmax(logits, V), 1);
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_OK);
	CHECK_EQ_INT(kvt_sampler_sample(&s, logits), 1);
	kvt_sampler_deinit(&s);

	/* draws follow softmax(logits / T) */
	p = (kvt_sampler_params){ .temp = 1.5f, .top_p = 1.0f, .seed = 42 };
	CHECK(kvt_sampler_init(&s, &p, V) == KVT_OK);
	int count[V] = { 0 };
	const int N = 20000;
	for (int i = 0; i < N; i++)
		count[kvt_sampler_sample(&s, logits)]++;
	kvt_sampler_deinit(&s);
	double z = 0, want[V];
	for (int i = 0; i < V; i++)
		z += want[i] = exp(logits[i] / 1.5);
	for (int i = 0; i < V; i++) {
		double pi = want[i] / z, got = (double)count[i] / N, sd = sqrt(pi * (1 - pi) / N);
		CHECKF(fabs(got - pi) < 5 * sd + 1e-4, "token %d: drawn %.4f, softmax %.4f", i, got, pi);
	}

	/* the same seed gives the same run; another seed another */
	int32_t a[64], b[64], c[64];
	for (int run = 0; run < 3; run++) {
		p.seed = run == 2 ? 43 : 42;
		kvt_sampler_init(&s, &p, V);
		for (int i = 0; i < 64; i++)
			(run == 0 ? a : run == 1 ? b : c)[i] = kvt_sampler_sample(&s, logits);
		kvt_sampler_deinit(&s);
	}
	CHECK(!memcmp(a, b, sizeof(a)));
	CHECK(memcmp(a, c, sizeof(a)) != 0);

	/* top-k: only the k best (ties 1 and 3, then 5) */
	p = (kvt_sampler_params){ .temp = 5.0f, .top_k = 3, .seed = 1 };
	kvt_sampler_init(&s, &p, V);
	for (int i = 0; i < 2000; i++) {
		int32_t t = kvt_sampler_sample(&s, logits);
		CHECKF(t == 1 || t == 3 || t == 5, "top-k 3 drew %d", t);
	}
	kvt_sampler_deinit(&s);
	p.top_k = 1;
	kvt_sampler_init(&s, &p, V);
	for (int i = 0; i < 100; i++)
		CHECK_EQ_INT(kvt_sampler_sample(&s, logits), 1);
	kvt_sampler_deinit(&s);

	/* top-p: the nucleus of softmax(logits) at T = 1 holding 0.6 is {1, 3} (0.33 each) */
	p = (kvt_sampler_params){ .temp = 1.0f, .top_p = 0.6f, .seed = 3 };
	kvt_sampler_init(&s, &p, V);
	int n1 = 0;
	for (int i = 0; i < 2000; i++) {
		int32_t t = kvt_sampler_sample(&s, logits);
		CHECKF(t == 1 || t == 3, "top-p 0.6 drew %d", t);
		n1 += t == 1;
	}
	CHECKF(n1 > 850 && n1 < 1150, "the two equal tokens drawn %d and %d times", n1, 2000 - n1);
	kvt_sampler_deinit(&s);
	p.top_p = 1e-6f;
	kvt_sampler_init(&s, &p, V);
	for (int i = 0; i < 100; i++)
		CHECK_EQ_INT(kvt_sampler_sample(&s, logits), 1);
	kvt_sampler_deinit(&s);

	/* bad parameters */
	check_log_capture();
	kvt_sampler_params bad[] = { { .temp = -1 }, { .temp = 1, .top_p = 1.5f }, { .temp = 1, .top_p = -0.1f },
				     { .temp = 1, .top_k = V + 1 }, { .temp = NAN } };
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		CHECKF(kvt_sampler_init(&s, &bad[i], V) == KVT_EINVAL, "bad case %zu accepted", i);
	CHECK_EQ_INT(check_log_n_errors, 5);
	CHECK(strstr(check_log_text, "sampler: bad parameters") != NULL);
	kvt_log_set_sink(NULL, NULL);
	return check_done("test_sampler");
}
