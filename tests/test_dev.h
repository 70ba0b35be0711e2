/*
 * tests/test_dev.h — the device a test runs on: the CPU backend, or the one
 * KVTIER_TEST_DEVICE names (cuda or auto) for a run on a GPU or on the CUDA
 * backend's CPU emulator (tests/cuemu: the *_emu tests set it to cuda).
 */
#ifndef KVT_TEST_DEV_H
#define KVT_TEST_DEV_H

#include "check.h"
#include "dev.h"

#include <stdlib.h>
#include <string.h>

static inline int test_dev_kind(void)
{
	const char *e = getenv("KVTIER_TEST_DEVICE");
	return e && !strcmp(e, "cuda") ? KVT_DEV_CUDA : e && !strcmp(e, "auto") ? KVT_DEV_AUTO : KVT_DEV_CPU;
}

/*
 * Whether the test device can be created: -1 when it can (the probe is
 * destroyed again), else the test's exit code: 1 for the CPU (always there),
 * the skip code for a device this machine lacks.
 */
static inline int test_dev_probe(const char *test)
{
	kvt_dev *probe;
	kvt_dev_config pc = { .kind = test_dev_kind(), .n_threads = 1 };
	if (kvt_dev_create(&pc, &probe))
		return pc.kind == KVT_DEV_CPU ? 1 : check_skip(test, "the requested device is not available");
	kvt_dev_destroy(probe);
	return -1;
}

#endif
