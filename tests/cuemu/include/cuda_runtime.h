/* cuda_runtime.h of the CPU emulation (tests/cuemu): see cuemu_core.h. */
#ifndef LATHE_CUEMU_CUDA_RUNTIME_H
#define LATHE_CUEMU_CUDA_RUNTIME_H
#include "cuemu_core.h"
#endif
