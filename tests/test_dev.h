/*
 * tests/test_dev.h — the device a test runs on: the CPU backend, or the one
 * KVTIER_TEST_DEVICE names (cuda or auto) for a run on a GPU or on the CUDA
 * backend's CPU emulator (tests/cuemu: the *_emu tests set it to cuda).
 */
#ifndef KVT_TEST_DEV_H
#define KVT_TEST_DEV_H

#include "dev.h"

#include <stdlib.h>
#include <string.h>

static inline int test_dev_kind(void)
{
	const char *e = getenv("KVTIER_TEST_DEVICE");
	return e && !strcmp(e, "cuda") ? KVT_DEV_CUDA : e && !strcmp(e, "auto") ? KVT_DEV_AUTO : KVT_DEV_CPU;
}

#endif
