/*
 * bench/bench_swa_kv.c — what dropping the sliding-window layers' K/V of
 * blocks outside every window would save in the host (T1) and NVMe (T2)
 * tiers, for a model whose GGUF has local layers (Gemma 3).
 *
 * A conversation of n tokens holds n / block_tokens full blocks. The next
 * query sits at position n or later and a local layer's window there starts
 * at n - window + 1, so a block ending before that position is never read by
 * a local layer again: only its global layers' K/V still matter. The bytes
 * are the real record sizes of the store (kvt_kv_packed_bytes of the model's
 * block shape, per codec; T2 stores the T1 record, before optional LZ4), so
 * the figures are exact for uncompressed records. Baseline, in the same run:
 * the store as it is, every layer of every block kept.
 *
 * A prefix store can be asked to continue from any point where a request
 * once ended (a regenerated or edited turn, a shared system prompt): such a
 * point q needs the local K/V of positions q - window + 1 .. q - 1. The second
 * table keeps those for every turn boundary of a conversation of equal turns
 * (the only blocks dropped are those no turn end reaches back to).
 *
 *   bench_swa_kv [--model PATH] [--block-tokens N]
 *   (default: models/gemma-3-270m-q4_k_m.gguf, 16-token blocks)
 */
#include "dev.h"
#include "gguf.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	const char *path = "models/gemma-3-270m-q4_k_m.gguf";
	uint32_t bt = 16;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--model"))
			path = argv[i + 1];
		else if (!strcmp(argv[i], "--block-tokens"))
			bt = (uint32_t)atoi(argv[i + 1]);
	}
	kvt_gguf *g;
	kvt_model_hparams hp;
	if (!bt || kvt_gguf_open(path, &g))
		return 1;
	int rc = kvt_model_read_hparams(g, &hp);
	kvt_gguf_close(g);
	if (rc)
		return 1;
	uint32_t n_local = 0;
	for (uint32_t l = 0; l < hp.n_layer; l++)
		n_local += kvt_model_layer_is_local(&hp, l);
	printf("model: %s (%s): %u layers, %u local (window %u tokens), %u KV heads x %u dims; %u-token blocks\n",
	       path, hp.arch, hp.n_layer, n_local, hp.n_swa, hp.n_head_kv, hp.head_dim, bt);
	if (!n_local) {
		printf("no sliding-window layers: nothing to drop\n");
		return 0;
	}
	kvt_kv_layout full = { .n_layers = hp.n_layer, .n_kv_heads = hp.n_head_kv, .head_dim = hp.head_dim,
			       .block_tokens = bt };
	kvt_kv_layout global = full;
	global.n_layers = hp.n_layer - n_local; /* a block that kept only its global layers */
	static const uint32_t convs[] = { 512, 1024, 2048, 4096, 8192, 32768 };
	printf("\n%-6s %7s %7s %14s %14s %8s\n", "codec", "tokens", "blocks", "kept (bytes)", "dropped to", "ratio");
	for (int c = 0; c < KVT_KV_CODEC_COUNT; c++) {
		const size_t b_full = kvt_kv_packed_bytes(&full, c), b_glob = kvt_kv_packed_bytes(&global, c);
		for (size_t i = 0; i < sizeof(convs) / sizeof(*convs); i++) {
			const uint64_t n = convs[i], n_blk = n / bt;
			/* block b covers [b*bt, (b+1)*bt): out of every future window when (b+1)*bt <= n - window + 1 */
			const uint64_t first_needed = n + 1 > hp.n_swa ? n + 1 - hp.n_swa : 0;
			const uint64_t n_out = first_needed / bt < n_blk ? first_needed / bt : n_blk;
			const uint64_t kept = n_blk * b_full, dropped = n_out * b_glob + (n_blk - n_out) * b_full;
			printf("%-6s %7llu %7llu %14llu %14llu %7.3fx\n", kvt_kv_codec_name(c), (unsigned long long)n,
			       (unsigned long long)n_blk, (unsigned long long)kept, (unsigned long long)dropped,
			       (double)dropped / (double)kept);
		}
	}
	/* turn-aware: block b is kept whole when [b*bt, (b+1)*bt) meets [q - window + 1, q) for a turn end q */
	static const uint32_t turns[] = { 128, 512, 1024, 2048, 8192 };
	const uint64_t n = 8192, n_blk = n / bt;
	const size_t b_full = kvt_kv_packed_bytes(&full, KVT_KV_CODEC_F16), b_glob = kvt_kv_packed_bytes(&global, KVT_KV_CODEC_F16);
	printf("\n%llu tokens, f16, local K/V kept for the window before every turn end:\n%-10s %14s %14s %8s\n",
	       (unsigned long long)n, "turn", "kept (bytes)", "dropped to", "ratio");
	for (size_t i = 0; i < sizeof(turns) / sizeof(*turns); i++) {
		uint64_t bytes = 0;
		for (uint64_t b = 0; b < n_blk; b++) {
			bool need = false;
			for (uint64_t q = turns[i]; q <= n && !need; q += turns[i]) {
				const uint64_t lo = q + 1 > hp.n_swa ? q + 1 - hp.n_swa : 0;
				need = b * bt < q && (b + 1) * bt > lo;
			}
			bytes += need ? b_full : b_glob;
		}
		printf("%-10u %14llu %14llu %7.3fx\n", turns[i], (unsigned long long)(n_blk * b_full),
		       (unsigned long long)bytes, (double)bytes / (double)(n_blk * b_full));
	}
	return 0;
}
