/* backend_cuda.h: the CUDA backend (one GPU, one stream).
 *
 * Buffers are plain cudaMalloc memory; copies to and from the host go through
 * tensor_set/tensor_get (synchronous for the caller). Every CUDA or cuBLAS failure is
 * returned as LT_ERR_BACKEND with the library's own error text; nothing aborts.
 *
 * What the backend can run is decided op family by op family (src/backend/cuda/<family>.cu,
 * each exporting one precondition that both supports_op and the launcher call). Setting
 * LATHE_CUDA_DISABLE_OPS to a comma-separated list of op names (as lt_op_name gives them,
 * e.g. "SQR,ACC") before the backend is made makes it refuse those ops, with the reason
 * "disabled by LATHE_CUDA_DISABLE_OPS".
 *
 * A small-batch node list (every matrix product over at most 64 activation columns, as in
 * decode) of 32 nodes or more that comes back unchanged (the same nodes, shapes, op
 * parameters and addresses; a session's kept decode step does) is recorded once by stream
 * capture and then replayed as one CUDA graph. Results are those of the eager launches (the
 * same kernels in the same order). LATHE_CUDA_GRAPHS=0 (when the backend is made) turns
 * this off.
 *
 * Without a CUDA build (no nvcc) or without a usable GPU, lt_backend_cuda_new returns NULL
 * and lt_last_error says why; GPU tests exit 77 (skipped) then. */
#ifndef LATHE_BACKEND_CUDA_H
#define LATHE_BACKEND_CUDA_H

#include "lathe/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend for GPU `device` (0-based), named "CUDA<device>". NULL + lt_fail when there
 * is no driver, no such device, or the device cannot be initialised. */
struct lt_backend *lt_backend_cuda_new(int device);

/* Number of CUDA devices the driver reports (0 when there is no driver or no CUDA build). */
int lt_backend_cuda_device_count(void);

/* True when be is a CUDA backend. */
bool lt_backend_is_cuda(const struct lt_backend *be);

/* How be's small-batch node lists ran since it was made: launched as a graph (a kept one
 * replayed, or one just instantiated), instantiated (recorded and kept), or run eagerly
 * (seen for the first time, or a capture that needed something a capture can't do, such as
 * growing scratch memory). All zero when graphs are off or be is not a CUDA backend. */
struct lt_cuda_graph_stats {
    long launched, instantiated, eager;
};
void lt_backend_cuda_graph_stats(const struct lt_backend *be, struct lt_cuda_graph_stats *out);

#ifdef __cplusplus
}
#endif
#endif
