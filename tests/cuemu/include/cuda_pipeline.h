/* cuda_pipeline.h of the CPU emulation (tests/cuemu): an asynchronous copy has landed when
 * its call returns, so commit and wait have nothing left to do. */
#ifndef LATHE_CUEMU_CUDA_PIPELINE_H
#define LATHE_CUEMU_CUDA_PIPELINE_H
#include "cuemu_core.h"
static inline void __pipeline_memcpy_async(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}
static inline void __pipeline_commit(void) {}
static inline void __pipeline_wait_prior(size_t n)
{
    (void)n;
}
#endif
