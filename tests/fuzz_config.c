/*
 * tests/fuzz_config.c — libFuzzer target for kvtierd's configuration parser.
 *
 * Each input is a configuration file: written to a memfd and loaded through
 * its /proc/self/fd path by kvt_config_load (the daemon's own code path, file
 * reading included). When it loads, kvt_config_validate runs, and
 * kvt_config_write prints the effective configuration, which must load again
 * (abort = a finding). On failure the message must
 * be a NUL-terminated line inside its buffer.
 *
 * Build and run: CMake builds it with clang (-fsanitize=fuzzer,address,undefined)
 * when clang is found; ctest -L fuzz runs it for KVT_FUZZ_SECONDS on a scratch
 * corpus seeded from tests/data/config_corpus/. By hand:
 *   build-asan/fuzz_config -max_total_time=60 CORPUS tests/data/config_corpus
 * A crashing input goes into tests/data/config_regress/, which
 * test_fuzz_replay replays under the gcc ASan build (with the corpus).
 */
#define _GNU_SOURCE /* memfd_create */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int fuzz_config_fd = -1, fuzz_config_fd2 = -1;

/* Replace the memfd's contents with n bytes; 0 on success. */
static int fuzz_config_fill(int fd, const void *data, size_t n)
{
	if (ftruncate(fd, 0) != 0)
		return -1;
	return n == 0 || pwrite(fd, data, n, 0) == (ssize_t)n ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static kvt_config c, d;
	static char err[1024], path[64], path2[64];
	if (fuzz_config_fd < 0) {
		fuzz_config_fd = memfd_create("fuzz_config", MFD_CLOEXEC);
		fuzz_config_fd2 = memfd_create("fuzz_config_out", MFD_CLOEXEC);
		if (fuzz_config_fd < 0 || fuzz_config_fd2 < 0)
			abort();
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fuzz_config_fd);
		snprintf(path2, sizeof(path2), "/proc/self/fd/%d", fuzz_config_fd2);
	}
	if (fuzz_config_fill(fuzz_config_fd, data, size))
		return 0;
	kvt_config_default(&c);
	memset(err, 0x5a, sizeof(err));
	if (kvt_config_load(&c, path, err, sizeof(err)) != KVT_OK) {
		if (!memchr(err, '\0', sizeof(err)))
			abort(); /* the message overran its buffer */
		return 0;
	}
	(void)kvt_config_validate(&c, err, sizeof(err));

	/* --print-config's output loads back */
	FILE *f = fopen(path2, "w");
	if (!f)
		return 0;
	int wrc = kvt_config_write(&c, f);
	fclose(f);
	if (wrc != KVT_OK)
		return 0;
	kvt_config_default(&d);
	if (kvt_config_load(&d, path2, err, sizeof(err)) != KVT_OK) {
		fprintf(stderr, "fuzz_config: the written configuration does not load: %s\n", err);
		abort();
	}
	return 0;
}
