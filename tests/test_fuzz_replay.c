/* ctest-labels: unit fuzz */
/*
 * tests/test_fuzz_replay.c — the libFuzzer targets for the T2 parsers
 * (tests/fuzz_t2.c) and the configuration parser (tests/fuzz_config.c),
 * replayed without libFuzzer over their checked-in inputs, so every build
 * (the gcc ASan+UBSan one included) runs them even where clang is absent:
 *   tests/data/t2_corpus/, tests/data/t2_regress/        through fuzz_t2
 *   tests/data/config_corpus/, tests/data/config_regress/ through fuzz_config
 *   tests/data/http_corpus/, tests/data/http_regress/     through fuzz_http (a live
 *   server in this process; http_regress/ may be empty: no finding yet)
 *   tests/data/resp_corpus/, tests/data/resp_regress/     through fuzz_resp (the
 *   Redis-protocol parser; resp_regress/ may be empty: no finding yet)
 * A *_regress/ file is an input that once crashed a fuzzer (or broke one of
 * its invariants); the targets abort on a finding, so a regression fails this
 * test by crashing it. Each directory must hold at least one file: a corpus
 * that went missing is a failure, not a silent pass.
 */
#define _GNU_SOURCE
#include "check.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

#define LLVMFuzzerTestOneInput fuzz_t2_one
#include "fuzz_t2.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_config_one
#include "fuzz_config.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_http_one
#include "fuzz_http.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_resp_one
#include "fuzz_resp.c"
#undef LLVMFuzzerTestOneInput

/* Feed every file of tests/data/NAME to fn; how many. */
static int replay_ex(const char *name, int (*fn)(const uint8_t *, size_t), bool may_be_empty)
{
	char dir[1024], path[2048];
	snprintf(dir, sizeof(dir), "%s/tests/data/%s", KVT_SOURCE_DIR, name);
	DIR *d = opendir(dir);
	CHECKF(d != NULL, "no directory %s", dir);
	if (!d)
		return 0;
	struct dirent *e;
	int n = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		FILE *f = fopen(path, "rb");
		CHECKF(f != NULL, "cannot open %s", path);
		if (!f)
			continue;
		fseek(f, 0, SEEK_END);
		long len = ftell(f);
		fseek(f, 0, SEEK_SET);
		uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
		CHECK(buf != NULL && fread(buf, 1, (size_t)len, f) == (size_t)len);
		fclose(f);
		fn(buf, (size_t)len); /* aborts on a finding */
		free(buf);
		n++;
	}
	closedir(d);
	printf("%s: %d inputs replayed\n", name, n);
	CHECKF(n > 0 || may_be_empty, "%s holds no inputs", dir);
	return n;
}

static int replay(const char *name, int (*fn)(const uint8_t *, size_t))
{
	return replay_ex(name, fn, false);
}

int main(void)
{
	replay("t2_corpus", fuzz_t2_one);
	replay("t2_regress", fuzz_t2_one);
	replay("config_corpus", fuzz_config_one);
	replay("config_regress", fuzz_config_one);
	replay("http_corpus", fuzz_http_one);
	replay_ex("http_regress", fuzz_http_one, true);
	replay("resp_corpus", fuzz_resp_one);
	replay_ex("resp_regress", fuzz_resp_one, true);
	kvt_log_set_sink(NULL, NULL);
	return check_done("test_fuzz_replay");
}
