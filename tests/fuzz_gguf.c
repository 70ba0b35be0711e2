/*
 * tests/fuzz_gguf.c — libFuzzer target for the GGUF reader.
 *
 * Each input is parsed from memory (kvt_gguf_open_mem, the same parser as
 * kvt_gguf_open); when it opens, every key, array element and tensor is read
 * and every supported tensor up to 16M elements is dequantized, so the
 * sanitizers see any access the reader's checks let through. Errors go to a
 * silent log sink.
 *
 * Build and run: CMake builds it with clang (-fsanitize=fuzzer,address,undefined)
 * in a build with AddressSanitizer when clang is found, and ctest -L fuzz runs
 * it for KVT_FUZZ_SECONDS on a scratch corpus (tests/fuzz_run.sh). By hand:
 *   clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -Icore -Iengine/model -Itests \
 *     tests/fuzz_gguf.c engine/model/gguf.c engine/model/gguf_quant.c core/log.c core/half.c \
 *     -lm -lpthread -o fuzz_gguf
 *   mkdir -p corpus && ./fuzz_gguf -max_total_time=60 corpus
 * A crashing input goes into tests/data/gguf_regress/, which
 * test_gguf_corrupt replays.
 */
#include "gguf.h"
#include "gguf_walk.h"

#include <stdlib.h>
#include <string.h>

static void quiet(int level, const char *msg, void *user)
{
	(void)level;
	(void)msg;
	(void)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	volatile double sink = 0;
	kvt_gguf *g = NULL;

	if (!init) {
		kvt_log_set_sink(quiet, NULL);
		init = 1;
	}
	if (kvt_gguf_open_mem(data, size, "fuzz", &g) != KVT_OK)
		return 0;
	sink = gguf_walk(g);
	(void)sink;
	kvt_gguf_close(g);
	return 0;
}
