/*
 * engine/cli/kvtier_main.c — the `kvtier` command line.
 *
 *   kvtier generate -m MODEL -p PROMPT [-n N] [--temp T] [--top-p P] [--top-k K]
 *                   [--seed S] [--chat] [--chat-template NAME] [--no-kv-cache] [--threads N]
 *                   [--weights f16|f32] [--activations int8|int16] [--device auto|cpu|cuda]
 *   kvtier size --model M [--context N] [--hbm BYTES --host BYTES --nvme BYTES]
 *   kvtier fsck (--data-dir DIR | -c FILE) [--dry-run]           (engine/cli/cli_index.c)
 *   kvtier rebuild-index (--data-dir DIR | -c FILE) [--model M]  (engine/cli/cli_index.c)
 *   kvtier resume SESSION [--json]                   (engine/cli/cli_client.c)
 *   kvtier stats [--json] [--watch [S]] | --offline --data-dir DIR
 *   kvtier sessions [--json]
 *   kvtier --version | --help
 *
 * The --help text, like the man page kvtier(1), is generated from
 * docs/manual.toml (kvt_manual.h); --version from the build (kvt_version.h).
 *
 * generate streams text as it is produced (never splitting a UTF-8
 * character), then prints token counts and prefill/decode speeds to stderr.
 * Exit status: 0 success, 1 runtime failure, 2 bad usage; the daemon client
 * commands (resume, stats, sessions) use <sysexits.h> codes (cli_client.h).
 */
#include "cli_client.h"
#include "cli_index.h"
#include "generate.h"
#include "gguf.h"
#include "kvt_manual.h"
#include "kvt_version.h"
#include "model.h"
#include "tokenizer.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK_TOKENS 16

static void usage(FILE *f)
{
	fputs(KVT_HELP_KVTIER, f);
}

/* Parse helpers: print what was wrong and return false. */
static bool parse_u64(const char *opt, const char *s, uint64_t max, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v > max) {
		fprintf(stderr, "kvtier: %s: '%s' is not a whole number in 0..%" PRIu64 "\n", opt, s, max);
		return false;
	}
	*out = v;
	return true;
}

static bool parse_f32(const char *opt, const char *s, float lo, float hi, float *out)
{
	char *end;
	errno = 0;
	float v = strtof(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi)) {
		fprintf(stderr, "kvtier: %s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
		return false;
	}
	*out = v;
	return true;
}

static bool parse_bytes(const char *opt, const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	uint64_t mul = 1;
	if (*end) {
		switch (*end) {
		case 'K': case 'k': mul = 1ull << 10; break;
		case 'M': case 'm': mul = 1ull << 20; break;
		case 'G': case 'g': mul = 1ull << 30; break;
		case 'T': case 't': mul = 1ull << 40; break;
		case 'P': case 'p': mul = 1ull << 50; break;
		default: mul = 0;
		}
		end++;
		if (!strcmp(end, "iB") || !strcmp(end, "B"))
			end += strlen(end);
	}
	if (errno || end == s || *end || mul == 0 || !(v >= 0) || v * (double)mul > 1.8e19) {
		fprintf(stderr, "kvtier: %s: '%s' is not a byte size (e.g. 512M, 80G, 2T)\n", opt, s);
		return false;
	}
	*out = (uint64_t)(v * (double)mul);
	return true;
}

/* ---- generate ---- */

typedef struct stream_ctx {
	const kvt_tok *tok;     /* borrowed */
	kvt_tok_stream st;      /* UTF-8 hold-back state */
} stream_ctx;

static int print_token(int32_t id, void *user)
{
	stream_ctx *c = user;
	char buf[512];
	size_t n;
	const char *bytes;
	size_t len;

	if (kvt_tok_is_eog(c->tok, id))
		return 0; /* the end-of-turn marker is not part of the text */
	if (kvt_tok_token_bytes(c->tok, id, &bytes, &len) == KVT_OK && len + 8 > sizeof(buf)) {
		fwrite(bytes, 1, len, stdout); /* a token longer than the buffer: pass it through */
	} else if (kvt_tok_stream_push(c->tok, &c->st, id, buf, sizeof(buf), &n) == KVT_OK) {
		fwrite(buf, 1, n, stdout);
	}
	fflush(stdout);
	return 0;
}

static int cmd_generate(int argc, char **argv)
{
	const char *model_path = NULL, *prompt = NULL;
	uint64_t n_predict = 64, top_k = 0, seed = 0, threads = 0;
	float temp = 0, top_p = 1;
	bool chat = false, no_kv = false, use_ref = false, act_int8 = true;
	int weights = KVT_DTYPE_F16, device = KVT_DEV_AUTO, chat_kind = KVT_TOK_CHAT_AUTO;
	bool keep_quantized = true;

	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		bool takes = true;
		if (!strcmp(a, "--chat")) { chat = true; takes = false; }
		else if (!strcmp(a, "--no-kv-cache")) { no_kv = true; takes = false; }
		else if (!strcmp(a, "--ref")) { use_ref = true; takes = false; }
		else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
		if (!takes)
			continue;
		if (!v) {
			fprintf(stderr, "kvtier: %s needs a value (or is unknown)\n", a);
			usage(stderr);
			return 2;
		}
		i++;
		if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = v;
		else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = v;
		else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { if (!parse_u64(a, v, 1u << 20, &n_predict)) return 2; }
		else if (!strcmp(a, "--temp")) { if (!parse_f32(a, v, 0, 100, &temp)) return 2; }
		else if (!strcmp(a, "--top-p")) { if (!parse_f32(a, v, 1e-6f, 1, &top_p)) return 2; }
		else if (!strcmp(a, "--top-k")) { if (!parse_u64(a, v, 1u << 24, &top_k)) return 2; }
		else if (!strcmp(a, "--seed")) { if (!parse_u64(a, v, UINT64_MAX, &seed)) return 2; }
		else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) { if (!parse_u64(a, v, 1024, &threads)) return 2; }
		else if (!strcmp(a, "--weights")) {
			keep_quantized = !strcmp(v, "native");
			if (!strcmp(v, "f16") || keep_quantized) weights = KVT_DTYPE_F16;
			else if (!strcmp(v, "f32")) weights = KVT_DTYPE_F32;
			else { fprintf(stderr, "kvtier: --weights: '%s' is not native, f16 or f32\n", v); return 2; }
		} else if (!strcmp(a, "--activations")) {
			if (!strcmp(v, "int8")) act_int8 = true;
			else if (!strcmp(v, "int16")) act_int8 = false;
			else { fprintf(stderr, "kvtier: --activations: '%s' is not int16 or int8\n", v); return 2; }
		} else if (!strcmp(a, "--chat-template")) {
			if (kvt_tok_chat_parse(v, &chat_kind)) {
				fprintf(stderr, "kvtier: --chat-template: '%s' is not auto, chatml, gemma, mistral or llama3\n", v);
				return 2;
			}
		} else if (!strcmp(a, "--device")) {
			if (!strcmp(v, "auto")) device = KVT_DEV_AUTO;
			else if (!strcmp(v, "cpu")) device = KVT_DEV_CPU;
			else if (!strcmp(v, "cuda")) device = KVT_DEV_CUDA;
			else { fprintf(stderr, "kvtier: --device: '%s' is not auto, cpu or cuda\n", v); return 2; }
		} else {
			fprintf(stderr, "kvtier: unknown option %s\n", a);
			usage(stderr);
			return 2;
		}
	}
	if (!model_path || !prompt) {
		fprintf(stderr, "kvtier: generate needs -m MODEL and -p PROMPT\n");
		usage(stderr);
		return 2;
	}

	kvt_gguf *g = NULL;
	kvt_tok *tok = NULL;
	kvt_dev *dev = NULL;
	kvt_model *m = NULL;
	kvt_t0_pool *pool = NULL;
	kvt_seq seq = { 0 };
	int32_t *ids = NULL;
	char *text = NULL;
	int rc, status = 1;

	if ((rc = kvt_gguf_open(model_path, &g)) || (rc = kvt_tok_create_from_gguf(g, &tok)) ||
	    (rc = kvt_tok_set_chat(tok, chat_kind)))
		goto out;
	kvt_dev_config dc = { .kind = device, .n_threads = (int)threads, .use_ref = use_ref, .act_int8 = act_int8 };
	if ((rc = kvt_dev_create(&dc, &dev)))
		goto out;
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.weight_dtype = weights;
	mc.keep_quantized = keep_quantized;
	mc.map_weights = true; /* g stays open until the model is destroyed (out:) */
	double tl = kvt_now_s();
	if ((rc = kvt_model_load(dev, g, &mc, &m)))
		goto out;
	tl = kvt_now_s() - tl;

	if (chat) {
		kvt_chat_msg msg = { .role = "user", .content = prompt };
		if ((rc = kvt_tok_chat_format(tok, &msg, 1, true, &text)))
			goto out;
	}
	const char *in = chat ? text : prompt;
	size_t n_ids = 0, len = strlen(in);
	const size_t extra = kvt_tok_add_bos(tok) ? 1 : 0;
	kvt_tok_encode(tok, in, len, true, NULL, 0, &n_ids);
	ids = malloc((n_ids + extra + 1) * sizeof(int32_t));
	if (!ids) {
		rc = KVT_ENOMEM;
		goto out;
	}
	if (extra)
		ids[0] = kvt_tok_bos(tok);
	if ((rc = kvt_tok_encode(tok, in, len, true, ids + extra, n_ids, &n_ids)))
		goto out;
	n_ids += extra;
	if (n_ids == 0) {
		fprintf(stderr, "kvtier: the prompt encodes to no tokens\n");
		status = 2;
		goto out;
	}
	const uint32_t max_ctx = kvt_model_max_ctx(m);
	if (n_ids + n_predict > max_ctx) {
		fprintf(stderr, "kvtier: %zu prompt + %" PRIu64 " generated tokens exceed the context of %u\n",
			n_ids, n_predict, max_ctx);
		status = 2;
		goto out;
	}
	kvt_kv_layout shape;
	kvt_model_kv_shape(m, BLOCK_TOKENS, &shape);
	uint32_t n_slots = (uint32_t)((n_ids + n_predict + BLOCK_TOKENS - 1) / BLOCK_TOKENS) + 1;
	if ((rc = kvt_t0_create(dev, &shape, n_slots, &pool)) || (rc = kvt_seq_init(&seq, dev, pool, max_ctx)))
		goto out;

	fprintf(stderr, "kvtier: %s on %s, %s weights (%.0f MiB, loaded in %.2f s)\n", model_path,
		kvt_dev_name(dev), keep_quantized ? "native (quantized kept)" : weights == KVT_DTYPE_F16 ? "fp16" : "fp32",
		kvt_model_weight_bytes(m) / 1048576.0, tl);
	fwrite(in, 1, len, stdout);
	fflush(stdout);

	stream_ctx sc = { .tok = tok };
	kvt_tok_stream_init(&sc.st);
	kvt_gen_params gp = { .n_predict = (uint32_t)n_predict, .no_kv_cache = no_kv, .stop_at_eog = true,
			      .sample = { .temp = temp, .top_p = top_p, .top_k = (uint32_t)top_k, .seed = seed } };
	kvt_gen_stats gs;
	rc = kvt_generate(m, &seq, tok, ids, (uint32_t)n_ids, &gp, print_token, &sc, &gs);
	char tail[64];
	size_t n_tail = 0;
	kvt_tok_stream_flush(&sc.st, tail, sizeof(tail), &n_tail);
	fwrite(tail, 1, n_tail, stdout);
	printf("\n");
	fflush(stdout);
	if (rc)
		goto out;
	fprintf(stderr, "kvtier: prompt %u tokens, generated %u tokens\n", gs.n_prompt, gs.n_gen);
	fprintf(stderr, "kvtier: prefill %.1f tokens/s (%.3f s), decode %.1f tokens/s (%.3f s)\n",
		gs.prefill_s > 0 ? gs.n_prompt / gs.prefill_s : 0.0, gs.prefill_s,
		gs.decode_s > 0 && gs.n_gen > 1 ? (gs.n_gen - 1) / gs.decode_s : 0.0, gs.decode_s);
	/* With the cache, each position is computed once; without, every step recomputes all. */
	uint64_t with_cache = gs.n_prompt + (gs.n_gen ? gs.n_gen - 1 : 0);
	uint64_t without = gs.n_prompt;
	for (uint32_t i = 1; i < gs.n_gen; i++)
		without += gs.n_prompt + i;
	fprintf(stderr, "kvtier: token positions processed: %" PRIu64 " (%s); with KV cache %" PRIu64
		", without %" PRIu64 "\n", gs.positions_processed, no_kv ? "no KV cache" : "KV cache",
		with_cache, without);
	status = 0;
out:
	if (rc && status == 1)
		fprintf(stderr, "kvtier: generate failed (%s)\n", kvt_strerror(rc));
	kvt_seq_deinit(&seq);
	kvt_t0_destroy(pool);
	kvt_model_destroy(m);
	kvt_dev_destroy(dev);
	kvt_tok_destroy(tok);
	kvt_gguf_close(g);
	free(ids);
	free(text);
	return status;
}

/* ---- size ---- */

static void print_bytes(uint64_t b)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)b;
	int u = 0;
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	printf("%8.2f %-3s", v, units[u]);
}

static int cmd_size(int argc, char **argv)
{
	const char *model_path = NULL;
	uint64_t ctx = 0, cap[3] = { 0, 0, 0 };
	static const char *const tier_opt[3] = { "--hbm", "--host", "--nvme" };

	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		}
		if (!v) {
			fprintf(stderr, "kvtier: %s needs a value (or is unknown)\n", a);
			return 2;
		}
		i++;
		bool known = false;
		for (int t = 0; t < 3; t++) {
			if (!strcmp(a, tier_opt[t])) {
				if (!parse_bytes(a, v, &cap[t]))
					return 2;
				known = true;
			}
		}
		if (known)
			continue;
		if (!strcmp(a, "-m") || !strcmp(a, "--model"))
			model_path = v;
		else if (!strcmp(a, "--context") || !strcmp(a, "-c")) {
			if (!parse_u64(a, v, 1u << 30, &ctx))
				return 2;
		} else {
			fprintf(stderr, "kvtier: unknown option %s\n", a);
			return 2;
		}
	}
	if (!model_path) {
		fprintf(stderr, "kvtier: size needs --model MODEL\n");
		return 2;
	}
	kvt_gguf *g;
	kvt_model_hparams hp;
	if (kvt_gguf_open(model_path, &g))
		return 1;
	int rc = kvt_model_read_hparams(g, &hp);
	kvt_gguf_close(g);
	if (rc)
		return 1;
	if (ctx == 0)
		ctx = hp.n_ctx_train;

	/*
	 * Per token, K and V for every layer and KV head: a block record of each
	 * codec (kvt_kv_packed_bytes, what T1 and T2 store) over its tokens. fp16:
	 * 2 bytes per value; FP8 E4M3 and INT8: 1 byte per value plus their fp32
	 * scales (kv_codec.h: one per token, head and K/V for FP8; one per 32 dims
	 * for INT8 where head_dim allows); INT8KV: 1 byte per value plus, per
	 * block, an fp16 minimum and a one-byte scale per K channel and a
	 * one-byte scale per V token and 16 dims.
	 */
	const kvt_kv_layout kl = { .n_layers = hp.n_layer, .n_kv_heads = hp.n_head_kv, .head_dim = hp.head_dim,
				   .block_tokens = BLOCK_TOKENS };
	const struct { const char *name; uint64_t per_tok; } dt[4] = {
		{ "fp16", kvt_kv_packed_bytes(&kl, KVT_KV_CODEC_F16) / BLOCK_TOKENS },
		{ "fp8", kvt_kv_packed_bytes(&kl, KVT_KV_CODEC_FP8) / BLOCK_TOKENS },
		{ "int8", kvt_kv_packed_bytes(&kl, KVT_KV_CODEC_INT8) / BLOCK_TOKENS },
		{ "int8kv", kvt_kv_packed_bytes(&kl, KVT_KV_CODEC_INT8KV) / BLOCK_TOKENS } };

	printf("model: %s (%s, %u layers, %u KV heads x %u dims)\n", model_path, hp.arch, hp.n_layer,
	       hp.n_head_kv, hp.head_dim);
	printf("block: %u tokens; context: %" PRIu64 " tokens\n\n", BLOCK_TOKENS, ctx);
	printf("dtype   bytes/token    bytes/block       one context\n");
	for (int d = 0; d < 4; d++) {
		printf("%-6s %12" PRIu64 " %14" PRIu64 "   ", dt[d].name, dt[d].per_tok, dt[d].per_tok * BLOCK_TOKENS);
		print_bytes(dt[d].per_tok * ((ctx + BLOCK_TOKENS - 1) / BLOCK_TOKENS * BLOCK_TOKENS));
		printf("\n");
	}
	if (cap[0] || cap[1] || cap[2]) {
		printf("\ntier    capacity      dtype      tokens       contexts\n");
		/* hbm holds fp16; host and nvme hold each quantized dtype */
		for (int t = 0; t < 3; t++) {
			if (!cap[t])
				continue;
			for (int d = 0; d < 4; d++) {
				if (t == 0 && d > 0)
					break;
				uint64_t blocks = cap[t] / (dt[d].per_tok * BLOCK_TOKENS);
				uint64_t toks = blocks * BLOCK_TOKENS;
				printf("%-6s ", tier_opt[t] + 2);
				print_bytes(cap[t]);
				printf("  %-6s %12" PRIu64 " %12.1f\n", dt[d].name, toks, (double)toks / (double)ctx);
			}
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	umask(077); /* rebuild-index writes a new index: private, as kvtierd's files are */
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "generate"))
		return cmd_generate(argc - 2, argv + 2);
	if (!strcmp(argv[1], "size"))
		return cmd_size(argc - 2, argv + 2);
	if (!strcmp(argv[1], "fsck"))
		return kvt_cli_fsck(argc - 1, argv + 1);
	if (!strcmp(argv[1], "rebuild-index"))
		return kvt_cli_rebuild_index(argc - 1, argv + 1);
	if (!strcmp(argv[1], "resume"))
		return kvt_cli_resume(argc - 1, argv + 1);
	if (!strcmp(argv[1], "stats"))
		return kvt_cli_stats(argc - 1, argv + 1);
	if (!strcmp(argv[1], "sessions"))
		return kvt_cli_sessions(argc - 1, argv + 1);
	if (!strcmp(argv[1], "--version")) {
		printf("kvtier %s\ncommit: %s\nbuild: %s (%s)\nbackends: %s\n", KVT_VERSION, KVT_GIT_COMMIT,
		       KVT_BUILD_TYPE, KVT_BUILD_OPTIONS, KVT_BACKENDS);
		return 0;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	fprintf(stderr, "kvtier: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
