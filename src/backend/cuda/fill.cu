/* fill.cu: FILL on the device: every element of a contiguous F32 result set to the node's
 * constant (op_params[0]). */
#include <string.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op fill_ops[] = {LT_OP_FILL};

bool cu_fill_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    return cu_check_result_f32(node, reason, reason_size);
}

static __global__ void fill_kernel(float *d, int64_t n, float v)
{
    cu_pdl_enter();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        d[i] = v;
}

/* four floats a store (a result on 16 bytes, n a multiple of 4) */
static __global__ void fill4_kernel(float4 *d, int64_t n4, float v)
{
    cu_pdl_enter();
    const float4 x = make_float4(v, v, v, v);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x)
        d[i] = x;
}

/* A zero (+0.0: all bits clear) is a memset, others four floats a store where the result
 * allows: the one-float kernel wrote a training step's zero gradients at ~1.3 TB/s (66 us
 * for the 84 MB of a DeltaNet result's gradient at 16 x 512 tokens, H100). */
lt_status cu_fill_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_fill_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    int64_t n = lt_nelements(node);
    if (n == 0)
        return LT_OK;
    const float v = lt_get_param_f32(node, 0);
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    if (bits == 0)
        return cu_check(cudaMemsetAsync(node->data, 0, (size_t)n * sizeof(float), c->stream),
                        "zeroing a fill");
    if (n % 4 == 0 && (uintptr_t)node->data % 16 == 0)
        cu_launch_pdl(c, fill4_kernel, cu_blocks(n / 4, 256), 256, 0, (float4 *)node->data, n / 4,
                      v);
    else
        cu_launch_pdl(c, fill_kernel, cu_blocks(n, 256), 256, 0, (float *)node->data, n, v);
    return cu_launched("fill");
}

const struct cu_family cu_family_fill = {"fill", fill_ops, CU_COUNT(fill_ops),
                                             cu_fill_supported, cu_fill_compute};
