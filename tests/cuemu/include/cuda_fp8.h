/* tests/cuemu/include/cuda_fp8.h — the real header, after cuemu.h has kept cuda_runtime_api.h out. */
#pragma once
#include "cuemu.h"
#include_next <cuda_fp8.h>
