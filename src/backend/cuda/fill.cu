/* fill.cu: FILL on the device: every element of a contiguous F32 result set to the node's
 * constant (op_params[0]). */
#include "backend/cuda/cuda_common.h"

static const enum lt_op fill_ops[] = {LT_OP_FILL};

bool cu_fill_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    return cu_check_result_f32(node, reason, reason_size);
}

static __global__ void fill_kernel(float *d, int64_t n, float v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        d[i] = v;
}

lt_status cu_fill_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_fill_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    int64_t n = lt_nelements(node);
    if (n == 0)
        return LT_OK;
    fill_kernel<<<cu_blocks(n, 256), 256, 0, c->stream>>>((float *)node->data, n,
                                                           lt_get_param_f32(node, 0));
    return cu_launched("fill");
}

const struct cu_family cu_family_fill = {"fill", fill_ops, CU_COUNT(fill_ops),
                                             cu_fill_supported, cu_fill_compute};
