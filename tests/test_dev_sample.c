/* ctest-labels: unit */
/*
 * tests/test_dev_sample.c — the device sampling op (dev.h: kvt_dev_sample)
 * on the CPU reference, against its definition:
 *   - with no limits, a grid of draws u = (j + 0.5) / N inverts the softmax's
 *     CDF, so each token is picked about N * p_i times;
 *   - top_k keeps exactly the k largest, top_p the smallest set of largest
 *     tokens holding at least p of the mass, and a tiny temperature is argmax;
 *   - NaN logits are never picked, a row of -inf gives -1, bad arguments are
 *     refused with a message.
 */
#include "check.h"
#include "dev.h"

static kvt_dev *d;

static int32_t draw(const float *x, uint32_t n, float temp, uint32_t k, float p, float u)
{
	kvt_sample_args a = { .n_rows = 1, .n_cols = n, .x = x, .temperature = temp, .top_k = k, .top_p = p, .u = &u };
	int32_t out = -2;
	a.out = &out;
	void *ws = malloc(kvt_dev_sample_workspace_bytes(d, &a) + 1);
	CHECK(kvt_dev_sample(d, &a, ws) == KVT_OK);
	free(ws);
	return out;
}

int main(void)
{
	kvt_dev_config c = { .kind = KVT_DEV_CPU, .use_ref = true };
	if (kvt_dev_create(&c, &d))
		return 1;
	enum { V = 50, N = 20000 };
	float x[V];
	check_rng rng = { 99 };
	for (int i = 0; i < V; i++)
		x[i] = check_rng_f32(&rng) * 4;
	double p[V], z = 0;
	int best = 0;
	for (int i = 0; i < V; i++) {
		p[i] = exp(x[i]);
		z += p[i];
		best = x[i] > x[best] ? i : best;
	}
	int cnt[V] = { 0 };
	for (int j = 0; j < N; j++) {
		int32_t t = draw(x, V, 1.0f, 0, 1.0f, (j + 0.5f) / N);
		CHECK(t >= 0 && t < V);
		if (t >= 0 && t < V)
			cnt[t]++;
	}
	int off = 0;
	for (int i = 0; i < V; i++)
		off += fabs(cnt[i] - N * p[i] / z) > 1.5;
	CHECKF(off == 0, "%d tokens drawn off their softmax share", off);

	/* top_k: only the k largest ever come out; top_k 1 and a tiny temperature are argmax */
	int order[V];
	for (int i = 0; i < V; i++)
		order[i] = i;
	for (int i = 0; i < V; i++) /* selection sort, descending */
		for (int j = i + 1; j < V; j++)
			if (x[order[j]] > x[order[i]]) {
				int t = order[i];
				order[i] = order[j];
				order[j] = t;
			}
	bool in_k = true;
	for (int j = 0; j < 500; j++) {
		int32_t t = draw(x, V, 1.0f, 3, 1.0f, (j + 0.5f) / 500);
		in_k &= t == order[0] || t == order[1] || t == order[2];
	}
	CHECK(in_k);
	CHECK(draw(x, V, 1.0f, 1, 1.0f, 0.99f) == best);
	CHECK(draw(x, V, 1e-6f, 0, 1.0f, 0.99f) == best);
	CHECK(draw(x, V, 1.0f, 0, 1e-6f, 0.99f) == best);

	/* top_p: the smallest descending prefix with mass >= p */
	const float pp = 0.5f;
	double mass = 0;
	int n_keep = 0;
	while (mass < pp * z)
		mass += p[order[n_keep++]];
	bool in_p = true, reached_last = false;
	for (int j = 0; j < 1000; j++) {
		int32_t t = draw(x, V, 1.0f, 0, pp, (j + 0.5f) / 1000);
		bool ok = false;
		for (int i = 0; i < n_keep; i++)
			ok |= t == order[i];
		in_p &= ok;
		reached_last |= t == order[n_keep - 1];
	}
	CHECK(in_p && reached_last);

	/* NaN never drawn; all -inf gives -1 */
	float y[4] = { NAN, 1.0f, NAN, 0.5f };
	for (int j = 0; j < 50; j++) {
		int32_t t = draw(y, 4, 1.0f, 0, 1.0f, j / 50.0f);
		CHECK(t == 1 || t == 3);
	}
	float ninf[3] = { -INFINITY, -INFINITY, -INFINITY };
	CHECK(draw(ninf, 3, 1.0f, 0, 1.0f, 0.5f) == -1);

	/* bad arguments */
	float u = 0.5f;
	int32_t out;
	kvt_sample_args bad = { .n_rows = 1, .n_cols = V, .x = x, .temperature = 0, .top_p = 1, .u = &u, .out = &out };
	check_log_capture();
	char one[8];
	CHECK(kvt_dev_sample(d, &bad, one) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "temperature 0") != NULL);
	kvt_log_set_sink(NULL, NULL);
	kvt_dev_destroy(d);
	return check_done("test_dev_sample");
}
