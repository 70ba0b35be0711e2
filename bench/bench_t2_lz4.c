/*
 * bench/bench_t2_lz4.c — LZ4 on REAL KV blocks of the default model: ratio and
 * speed, plain LZ4 against a byte shuffle (16-bit words split into low and
 * high byte planes) before LZ4, for each T1 block codec (fp16, FP8, INT8).
 *
 *   bench_t2_lz4 [--model M] [--text FILE] [--tokens N] [--threads T] [--reps R]
 *
 * It runs the model over an English text (default /usr/share/common-licenses/GPL-3)
 * so its KV blocks fill the T0 pool, copies every full block out (and packs
 * it with each T1 codec), and compresses each block on its own, as the store
 * does. Reported per codec and method: the ratio raw/compressed over all
 * blocks, what the store would keep (compression kept only where it saves
 * >= 15% and at least one 4 KiB unit; the on-disk ratio counts the 1280-byte
 * header and the 4 KiB extents), and the compress / decompress speeds
 * (LZ4_decompress_safe) as medians of R runs, each also given as a ratio to
 * memcpy of the same bytes measured in the same run.
 */
#include "dev.h"
#include "gguf.h"
#include "model.h"
#include "t2_int.h" /* the store's own byte shuffle, so the bench measures what it runs */
#include "t2_store.h"
#include "tokenizer.h"

#include <lz4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_d);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t extent(uint64_t payload)
{
	return (KVT_T2_HEADER_BYTES + payload + KVT_T2_UNIT_BYTES - 1) / KVT_T2_UNIT_BYTES * KVT_T2_UNIT_BYTES;
}

/* Measure one codec's blocks: [n][bytes] back to back. */
static void measure(const char *codec, const uint8_t *blocks, uint32_t n, size_t bytes, int reps)
{
	int cap = LZ4_compressBound((int)bytes);
	uint8_t *tmp = malloc(bytes), *out = malloc(bytes), *comp = malloc((size_t)cap);
	double *t_memcpy = calloc((size_t)reps, sizeof(double));
	volatile uint8_t sink = 0;

	/* baseline: memcpy of every block, same bytes */
	for (int r = 0; r < reps; r++) {
		double t0 = kvt_now_s();
		for (uint32_t b = 0; b < n; b++) {
			memcpy(out, blocks + (size_t)b * bytes, bytes);
			sink ^= out[b % bytes];
		}
		t_memcpy[r] = kvt_now_s() - t0;
	}
	double mc = median(t_memcpy, reps);
	double total = (double)n * (double)bytes;

	for (int shuf = 0; shuf < 2; shuf++) {
		uint64_t sum_c = 0, disk_raw = 0, disk_kept = 0;
		uint32_t n_kept = 0;
		double *tc = calloc((size_t)reps, sizeof(double)), *td = calloc((size_t)reps, sizeof(double));
		for (int r = 0; r < reps; r++) {
			double c_s = 0, d_s = 0;
			for (uint32_t b = 0; b < n; b++) {
				const uint8_t *src = blocks + (size_t)b * bytes;
				double t0 = kvt_now_s();
				const uint8_t *in = src;
				if (shuf) {
					kvt_t2_shuffle2(src, tmp, bytes);
					in = tmp;
				}
				int c = LZ4_compress_default((const char *)in, (char *)comp, (int)bytes, cap);
				double t1 = kvt_now_s();
				int d = LZ4_decompress_safe((const char *)comp, (char *)(shuf ? tmp : out), c, (int)bytes);
				if (shuf)
					kvt_t2_unshuffle2(tmp, out, bytes);
				double t2 = kvt_now_s();
				if (c <= 0 || d != (int)bytes || memcmp(out, src, bytes) != 0) {
					fprintf(stderr, "bench_t2_lz4: round trip failed (%s block %u)\n", codec, b);
					exit(1);
				}
				c_s += t1 - t0;
				d_s += t2 - t1;
				if (r == 0) {
					sum_c += (uint64_t)c;
					bool keep = (uint64_t)c <= bytes - bytes * 15 / 100 && extent((uint64_t)c) < extent(bytes);
					n_kept += keep;
					disk_raw += extent(bytes);
					disk_kept += keep ? extent((uint64_t)c) : extent(bytes);
				}
			}
			tc[r] = c_s;
			td[r] = d_s;
		}
		double mtc = median(tc, reps), mtd = median(td, reps);
		printf("| %s | %s | %u x %zu | %.3f | %u/%u | %.3f | %.0f (%.3fx memcpy) | %.0f (%.3fx memcpy) |\n", codec,
		       shuf ? "shuffle+LZ4" : "LZ4", n, bytes, total / (double)sum_c, n_kept, n,
		       (double)disk_raw / (double)disk_kept, total / mtc / 1e6, mc / mtc, total / mtd / 1e6, mc / mtd);
		free(tc);
		free(td);
	}
	printf("|   memcpy baseline | | | | | | %.0f MB/s | |\n", total / mc / 1e6);
	(void)sink;
	free(tmp);
	free(out);
	free(comp);
	free(t_memcpy);
}

int main(int argc, char **argv)
{
	const char *model = getenv("KVTIER_MODEL"), *text = "/usr/share/common-licenses/GPL-3";
	int n_tok = 2048, threads = 2, reps = 5;
	if (!model)
		model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--model")) model = argv[i + 1];
		else if (!strcmp(argv[i], "--text")) text = argv[i + 1];
		else if (!strcmp(argv[i], "--tokens")) n_tok = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
		else {
			fprintf(stderr, "usage: bench_t2_lz4 [--model M] [--text FILE] [--tokens N] [--threads T] [--reps R]\n");
			return 2;
		}
	}
	if (n_tok < 16 || reps < 1 || reps > 100) {
		fprintf(stderr, "bench_t2_lz4: --tokens >= 16 and --reps in 1..100\n");
		return 2;
	}
	FILE *f = fopen(text, "rb");
	if (!f) {
		fprintf(stderr, "bench_t2_lz4: cannot open %s\n", text);
		return 1;
	}
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)len + 1);
	if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
		fprintf(stderr, "bench_t2_lz4: short read of %s\n", text);
		return 1;
	}
	buf[len] = 0;
	fclose(f);

	kvt_gguf *g;
	kvt_dev *dev;
	kvt_model *m;
	kvt_tok *tok;
	kvt_dev_config dc = { .kind = KVT_DEV_CPU, .n_threads = threads };
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_batch = 512;
	mc.max_ctx = (uint32_t)n_tok;
	if (kvt_gguf_open(model, &g) || kvt_tok_create_from_gguf(g, &tok) || kvt_dev_create(&dc, &dev) ||
	    kvt_model_load(dev, g, &mc, &m)) {
		fprintf(stderr, "bench_t2_lz4: cannot load %s (scripts/fetch_model.sh fetches it)\n", model);
		return 1;
	}
	kvt_gguf_close(g);
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)len);
	size_t n_ids = 0;
	if (kvt_tok_encode(tok, buf, (size_t)len, false, ids, (size_t)len, &n_ids)) {
		fprintf(stderr, "bench_t2_lz4: tokenizing %s failed\n", text);
		return 1;
	}
	if (n_ids > (size_t)n_tok)
		n_ids = (size_t)n_tok;
	n_ids = n_ids / 16 * 16;

	kvt_kv_layout shape;
	kvt_t0_pool *pool;
	kvt_model_kv_shape(m, 16, &shape);
	uint32_t n_blocks = (uint32_t)(n_ids / 16);
	if (kvt_t0_create(dev, &shape, n_blocks + 1, &pool))
		return 1;
	kvt_seq s;
	kvt_seq_init(&s, dev, pool, (uint32_t)n_ids);
	double t0 = kvt_now_s();
	if (kvt_model_forward(m, &s, ids, (uint32_t)n_ids, NULL, 0)) {
		fprintf(stderr, "bench_t2_lz4: forward failed\n");
		return 1;
	}
	double t_fwd = kvt_now_s() - t0;

	struct utsname u;
	uname(&u);
	printf("bench_t2_lz4: %s %s, model %s, text %s: %zu tokens -> %u blocks of 16 tokens (prefill %.1f s)\n",
	       u.machine, u.release, model, text, n_ids, n_blocks, t_fwd);
	printf("layout: %u layers x %u kv heads x %u dims; LZ4 %s, acceleration 1; medians of %d runs\n\n",
	       shape.n_layers, shape.n_kv_heads, shape.head_dim, LZ4_versionString(), reps);
	printf("| codec | method | blocks x bytes | ratio raw/LZ4 | blocks kept compressed | on-disk ratio (store rule) | compress MB/s | decompress MB/s |\n");
	printf("|---|---|---|---|---|---|---|---|\n");

	const kvt_kv_layout *pl = kvt_t0_layout(pool);
	for (int codec = 0; codec < KVT_KV_CODEC_COUNT; codec++) {
		size_t bytes = kvt_kv_packed_bytes(pl, codec);
		uint8_t *h = malloc((size_t)n_blocks * bytes);
		void *d_dst;
		if (kvt_dev_alloc(dev, (size_t)n_blocks * bytes, &d_dst))
			return 1;
		kvt_kv_pack_args pa = { .kv = pl, .codec = codec, .n_blocks = n_blocks, .h_slots = s.blocks, .dst = d_dst };
		if (kvt_dev_kv_pack(dev, NULL, &pa) || kvt_dev_sync(dev) ||
		    kvt_dev_copy_d2h(dev, h, d_dst, (size_t)n_blocks * bytes)) {
			fprintf(stderr, "bench_t2_lz4: pack %s failed\n", kvt_kv_codec_name(codec));
			return 1;
		}
		measure(kvt_kv_codec_name(codec), h, n_blocks, bytes, reps);
		kvt_dev_free(dev, d_dst);
		free(h);
	}
	kvt_seq_deinit(&s);
	kvt_t0_destroy(pool);
	kvt_model_destroy(m);
	kvt_tok_destroy(tok);
	kvt_dev_destroy(dev);
	free(ids);
	free(buf);
	return 0;
}
