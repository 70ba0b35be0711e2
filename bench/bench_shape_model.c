/*
 * bench/bench_shape_model.c — writes a GGUF of a real model's shape with
 * random weights and a real tokenizer, for benchmarks at real scale.
 *
 *   bench_shape_model SHAPE TYPE TOKENIZER_GGUF OUT [--layers N]
 *
 * SHAPE: llama3.2-1b (16 layers, width 2048, FFN 8192, 32 query / 8 KV heads of
 *        64, tied embeddings, Llama 3 RoPE) or llama3-8b (32 layers, width 4096,
 *        FFN 14336, 32 / 8 heads of 128, untied output).
 * TYPE:  q8_0 or q4_k_m (Q4_K with attn_v and ffn_down in Q6_K, as a Q4_K_M file).
 * The tokenizer (vocabulary, merges, special ids, chat template) is copied from
 * TOKENIZER_GGUF (bench/bench_scale.py passes the default model), so the file
 * tokenizes and templates real text; the embeddings take that vocabulary's size.
 * Weights come from a fixed seed (engine/model/synth_model.h): the same file
 * every time. --layers N writes fewer blocks of the same width (a quick run).
 * The whole file is built in memory first (about its size); exit 0, or 1 with
 * the reason on stderr.
 */
#include "gguf.h"
#include "synth_model.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int usage(void)
{
	fprintf(stderr, "usage: bench_shape_model llama3.2-1b|llama3-8b q8_0|q4_k_m TOKENIZER_GGUF OUT [--layers N]\n");
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 5 && argc != 7)
		return usage();
	kvt_synth_llama c;
	kvt_synth_llama_default(&c);
	c.n_ctx = 16384;
	c.rope_base = 500000.0f;
	c.n_head = 32;
	c.n_head_kv = 8;
	c.seed = 20261202;
	if (!strcmp(argv[1], "llama3.2-1b")) {
		c.n_layer = 16;
		c.n_embd = 2048;
		c.n_ff = 8192;
		c.tied_embeddings = true;
		c.llama3_rope = 1;
	} else if (!strcmp(argv[1], "llama3-8b")) {
		c.n_layer = 32;
		c.n_embd = 4096;
		c.n_ff = 14336;
		c.tied_embeddings = false;
	} else {
		fprintf(stderr, "bench_shape_model: shape '%s' is not llama3.2-1b or llama3-8b\n", argv[1]);
		return usage();
	}
	if (!strcmp(argv[2], "q8_0")) {
		c.weight_type = KVT_GGML_Q8_0;
	} else if (!strcmp(argv[2], "q4_k_m")) {
		c.weight_type = KVT_GGML_Q4_K;
		c.q4_k_m_mix = true;
	} else {
		fprintf(stderr, "bench_shape_model: type '%s' is not q8_0 or q4_k_m\n", argv[2]);
		return usage();
	}
	if (argc == 7) {
		char *end = NULL;
		long n = strtol(argv[6], &end, 10);
		if (strcmp(argv[5], "--layers") || !end || *end || n < 1 || n > (long)c.n_layer) {
			fprintf(stderr, "bench_shape_model: --layers takes 1..%u, not '%s'\n", c.n_layer, argv[6]);
			return usage();
		}
		c.n_layer = (uint32_t)n;
	}
	c.tokenizer_from = argv[3];
	int rc = kvt_synth_llama_write(&c, argv[4]);
	if (rc) {
		fprintf(stderr, "bench_shape_model: writing %s failed: %s\n", argv[4], kvt_strerror(rc));
		return 1;
	}
	/*
	 * Written back and dropped from the page cache: a write leaves 4 KiB folios,
	 * which a mapping reads ~6% slower than the large folios a read brings in
	 * (bench/README.md, tenth stop), so the benchmarks start from a read.
	 */
	int fd = open(argv[4], O_RDONLY);
	if (fd >= 0) {
		(void)fdatasync(fd);
		(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
	return 0;
}
