/* tests/cuemu/include/cuda_runtime.h — stands in for the real one under the CPU emulator (cuemu.h). */
#pragma once
#include "cuemu.h"
