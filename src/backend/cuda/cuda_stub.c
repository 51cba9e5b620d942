/* cuda_stub.c: the CUDA backend's entry points in a build without CUDA (no nvcc when the
 * build was configured), so that callers, GPU tests and benchmarks compile and link
 * everywhere and learn at run time that there is no GPU backend. With CUDA, the real
 * definitions are in cuda_backend.cu and this file is empty. */
#include <stdio.h>

#include "backend/cuda/cuda_verdict.h"
#include "lathe/backend_cuda.h"

#ifndef LATHE_HAVE_CUDA

struct lt_backend *lt_backend_cuda_new(int device)
{
    lt_fail(LT_ERR_UNSUPPORTED, "CUDA device %d: lathe was built without CUDA (no nvcc)", device);
    return NULL;
}

int lt_backend_cuda_device_count(void) { return 0; }

bool lt_backend_is_cuda(const struct lt_backend *be)
{
    (void)be;
    return false;
}

void lt_backend_cuda_graph_stats(const struct lt_backend *be, struct lt_cuda_graph_stats *out)
{
    (void)be;
    *out = (struct lt_cuda_graph_stats){0};
}

bool lt_cuda_verdict(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    (void)node;
    snprintf(reason, reason_size, "no CUDA build");
    return false;
}

bool lt_cuda_compiled(void) { return false; }

#endif
