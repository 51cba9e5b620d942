/* cuda_verdict.h (internal, C and C++): the CUDA backend's verdict on a node without a
 * device. Preconditions look at types, shapes and strides only, so the same answer that
 * CUDA0's supports_op gives can be had on a machine with no GPU; CPU-side tests use it to
 * emulate CUDA's placement (which nodes fall back, which copies the scheduler makes) in a
 * gap backend that computes on the CPU. In a build without CUDA it returns false with the
 * reason "no CUDA build". */
#ifndef LATHE_BACKEND_CUDA_VERDICT_H
#define LATHE_BACKEND_CUDA_VERDICT_H

#include <stdbool.h>
#include <stddef.h>

#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What CUDA0's supports_op says about node, LATHE_CUDA_DISABLE_OPS aside. */
bool lt_cuda_verdict(const struct lt_tensor *node, char *reason, size_t reason_size);

/* True in a build with the CUDA backend compiled in (nvcc was found). */
bool lt_cuda_compiled(void);

#ifdef __cplusplus
}
#endif
#endif
