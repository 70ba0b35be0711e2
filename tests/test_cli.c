/* ctest-labels: integration */
/*
 * tests/test_cli.c — the `kvtier` binary as a user runs it, on a synthetic
 * model written by the test.
 *
 *  - generate streams the same text with and without the KV cache, and
 *    reports how many token positions each way processed;
 *  - size prints the bytes per token and block the layout implies, and the
 *    tokens each tier holds;
 *  - bad usage exits 2 and bad files exit 1, each with a message naming the
 *    problem.
 */
#include "check.h"
#include "synth_model.h"

#include <sys/wait.h>
#include <unistd.h>

static char dir[64], model[128], err_path[128];
static char out[1 << 16], err[1 << 16];

/* Run `kvtier ARGS`, capture stdout into out and stderr into err; exit status. */
static int run(const char *args)
{
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "%s/kvtier %s", KVT_BINARY_DIR, args);
	return check_run_capture(cmd, err_path, out, sizeof(out), err, sizeof(err));
}

int main(void)
{
	char args[1024], cached[sizeof(out)];
	snprintf(dir, sizeof(dir), "/tmp/kvt_cli_XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(model, sizeof(model), "%s/synth.gguf", dir);
	snprintf(err_path, sizeof(err_path), "%s/stderr", dir);
	kvt_synth_llama cfg;
	kvt_synth_llama_default(&cfg); /* 2 layers, 2 KV heads of 16 dims */
	cfg.tied_embeddings = false;
	if (kvt_synth_llama_write(&cfg, model))
		return 1;

	/* generate: same text both ways; positions 5 + 19 with cache, 5 + 6 + ... + 24 without */
	snprintf(args, sizeof(args), "generate -m %s -p 'hello world' -n 20 --threads 2", model);
	CHECK_EQ_INT(run(args), 0);
	strcpy(cached, out);
	CHECKF(strncmp(out, "hello world", 11) == 0 && strlen(out) > 12, "output: %s", out);
	CHECKF(strstr(err, "generated 20 tokens") != NULL, "stderr: %s", err);
	CHECKF(strstr(err, "prefill") && strstr(err, "decode") && strstr(err, "tokens/s"), "stderr: %s", err);
	snprintf(args, sizeof(args), "generate -m %s -p 'hello world' -n 20 --threads 2 --no-kv-cache", model);
	CHECK_EQ_INT(run(args), 0);
	CHECKF(strcmp(out, cached) == 0, "with cache \"%s\", without \"%s\"", cached, out);
	const char *pp = strstr(err, "token positions processed: ");
	unsigned long long with = 0, without = 0, n_prompt = 0;
	const char *pr = strstr(err, "prompt ");
	CHECK(pr && sscanf(pr, "prompt %llu tokens", &n_prompt) == 1);
	CHECK(pp && sscanf(strstr(pp, "with KV cache "), "with KV cache %llu, without %llu", &with, &without) == 2);
	unsigned long long want_without = 0;
	for (unsigned long long i = 0; i < 20; i++)
		want_without += n_prompt + i;
	CHECK_EQ_INT(with, n_prompt + 19);
	CHECK_EQ_INT(without, want_without);
	unsigned long long done = 0;
	CHECK(pp && sscanf(pp, "token positions processed: %llu", &done) == 1 && done == want_without);

	/* sampling is reproducible by seed; --chat formats with the template */
	snprintf(args, sizeof(args), "generate -m %s -p hi -n 12 --temp 0.8 --top-p 0.9 --top-k 40 --seed 7", model);
	CHECK_EQ_INT(run(args), 0);
	strcpy(cached, out);
	CHECK_EQ_INT(run(args), 0);
	CHECK(strcmp(out, cached) == 0);
	snprintf(args, sizeof(args), "generate -m %s -p hi -n 4 --chat", model);
	CHECK_EQ_INT(run(args), 0);
	CHECKF(strstr(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") != NULL, "chat: %s", out);

	/* size: 2 (K,V) x 2 layers x 2 heads x 16 dims x 2 bytes = 256 B/token, 4096 B/block;
	 * fp8/int8: 128 B + 8 fp32 scales = 160 B/token. 1 MiB of HBM = 256 blocks = 4096 tokens. */
	snprintf(args, sizeof(args), "size --model %s --context 1000 --hbm 1M --host 2MiB --nvme 1G", model);
	CHECK_EQ_INT(run(args), 0);
	CHECKF(strstr(out, "fp16            256           4096") != NULL, "size: %s", out);
	CHECKF(strstr(out, "fp8             160           2560") != NULL, "size: %s", out);
	CHECKF(strstr(out, "hbm        1.00 MiB  fp16           4096") != NULL, "size: %s", out);
	CHECKF(strstr(out, "host       2.00 MiB  int8          13104") != NULL, "size: %s", out);
	/* head_dim 64: INT8 keeps a scale per 32 dims, FP8 one per vector: 2 x 2 x 2 x 64 = 512 B of codes
	 * a token, plus 16 (int8) or 8 (fp8) fp32 scales */
	char model64[160];
	snprintf(model64, sizeof(model64), "%s/synth64.gguf", dir);
	kvt_synth_llama c64;
	kvt_synth_llama_default(&c64);
	c64.n_head = 2; /* 2 heads of 64 dims, as many KV heads */
	c64.n_embd = 128;
	CHECK(kvt_synth_llama_write(&c64, model64) == KVT_OK);
	snprintf(args, sizeof(args), "size --model %s --context 1000", model64);
	CHECK_EQ_INT(run(args), 0);
	CHECKF(strstr(out, "2 KV heads x 64 dims") != NULL, "size: %s", out);
	CHECKF(strstr(out, "fp8             544") != NULL, "size: %s", out);
	CHECKF(strstr(out, "int8            576") != NULL, "size: %s", out);
	unlink(model64);

	/* bad usage and bad input */
	struct { const char *args; int code; const char *msg; } bad[] = {
		{ "frobnicate", 2, "unknown command 'frobnicate'" },
		{ "generate -p hi", 2, "needs -m MODEL and -p PROMPT" },
		{ "generate -m /nonexistent/m.gguf -p hi", 1, "/nonexistent/m.gguf" },
		{ "generate -m M -p hi -n lots", 2, "-n: 'lots' is not a whole number" },
		{ "generate -m M -p hi --temp -1", 2, "--temp: '-1' is not a number" },
		{ "generate -m M -p hi --weights f8", 2, "--weights: 'f8' is not native, f16 or f32" },
		{ "generate -m M -p hi --bogus 1", 2, "unknown option --bogus" },
		{ "size --model M --hbm 12Q", 2, "--hbm: '12Q' is not a byte size" },
		{ "size", 2, "size needs --model MODEL" },
		{ "generate -m M -p hi -n 100000", 2, "exceed the context of 512" },
		{ "generate -m ERR -p hi", 1, "bad magic" },
	};
	char junk[128];
	snprintf(junk, sizeof(junk), "%s/junk.gguf", dir);
	FILE *f = fopen(junk, "w");
	fputs("this is not a model file at all", f);
	fclose(f);
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		char a[1024], *m = strstr(bad[i].args, " M "), *e = strstr(bad[i].args, " ERR ");
		if (m)
			snprintf(a, sizeof(a), "%.*s %s%s", (int)(m - bad[i].args), bad[i].args, model, m + 2);
		else if (e)
			snprintf(a, sizeof(a), "%.*s %s%s", (int)(e - bad[i].args), bad[i].args, junk, e + 4);
		else
			snprintf(a, sizeof(a), "%s", bad[i].args);
		int code = run(a);
		CHECKF(code == bad[i].code, "'%s': exit %d, want %d", a, code, bad[i].code);
		CHECKF(strstr(err, bad[i].msg) != NULL, "'%s': stderr \"%s\" lacks \"%s\"", a, err, bad[i].msg);
	}
	unlink(junk);
	unlink(model);
	unlink(err_path);
	rmdir(dir);
	return check_done("test_cli");
}
