/* softmax.cu: SOFT_MAX (with scale, optional additive mask tiled over dims 2 and 3, and
 * the causal mask) and SOFT_MAX_BACK on the device, a block per row.
 *
 * As on the CPU (src/ops/softmax.c): a dropped key (causal, or a -inf mask) gets exactly
 * 0, and a row with every key dropped is all zeros, not NaN; exponentials are rounded to
 * float and summed in double; x * scale + mask is two roundings (no fused multiply-add).
 * Each thread touches the same elements of its row in every pass, so the result buffer
 * holds the intermediate values without extra synchronisation. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op softmax_ops[] = {LT_OP_SOFT_MAX, LT_OP_SOFT_MAX_BACK};

bool cu_softmax_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->op != LT_OP_SOFT_MAX && node->op != LT_OP_SOFT_MAX_BACK) {
        snprintf(reason, reason_size, "%s is not a softmax", lt_op_name(node->op));
        return false;
    }
    if (node->op == LT_OP_SOFT_MAX_BACK) {
        for (int i = 0; i < 2; i++) {
            if (!cu_check_source(node, i, CU_TYPES_F32, reason, reason_size))
                return false;
            if (!lt_same_shape(node->src[i], node)) {
                snprintf(reason, reason_size, "source %d is not of the result's shape", i);
                return false;
            }
        }
        return cu_check_result_f32(node, reason, reason_size);
    }
    if (!cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size))
        return false;
    const struct lt_tensor *a = node->src[0], *mask = node->src[1];
    if (!lt_same_shape(a, node)) {
        snprintf(reason, reason_size, "source 0 is not of the result's shape");
        return false;
    }
    if (mask) {
        if (!cu_check_source(node, 1, CU_TYPES_F32, reason, reason_size))
            return false;
        if (mask->ne[0] != a->ne[0] || mask->ne[1] != a->ne[1] || mask->ne[2] == 0 ||
            mask->ne[3] == 0 || a->ne[2] % mask->ne[2] || a->ne[3] % mask->ne[3]) {
            snprintf(reason, reason_size, "source 1 (the mask) does not tile over source 0");
            return false;
        }
    }
    return cu_check_result_f32(node, reason, reason_size);
}

static __global__ void soft_max_kernel(struct cu_t a, struct cu_t mask, bool has_mask, float *out,
                                       float scale, bool causal)
{
    cu_pdl_enter();
    __shared__ double dshared[32];
    __shared__ float fshared[32];
    const int64_t ne0 = a.ne[0], ne1 = a.ne[1], rows = a.ne[1] * a.ne[2] * a.ne[3];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % a.ne[2], i3 = r / (ne1 * a.ne[2]);
        float *y = out + r * ne0;
        int64_t n_keep = ne0;
        if (causal) {
            n_keep = i1 + (ne0 - ne1) + 1;
            n_keep = n_keep < 0 ? 0 : n_keep > ne0 ? ne0 : n_keep;
        }
        float mx = -INFINITY;
        for (int64_t i = threadIdx.x; i < n_keep; i += blockDim.x) {
            float v = __fmul_rn(cu_getf(a, i, i1, i2, i3), scale);
            if (has_mask)
                v = __fadd_rn(v, cu_getf(mask, i, i1, i2 % mask.ne[2], i3 % mask.ne[3]));
            y[i] = v;
            mx = fmaxf(mx, v);
        }
        mx = cu_block_max(mx, fshared);
        if (mx == -INFINITY) { /* every key dropped */
            for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x)
                y[i] = 0.0f;
            continue;
        }
        double sum = 0.0;
        for (int64_t i = threadIdx.x; i < n_keep; i += blockDim.x) {
            float e = expf(y[i] - mx);
            y[i] = e;
            sum += (double)e;
        }
        const float inv = (float)(1.0 / cu_block_sum(sum, dshared));
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x)
            y[i] = i < n_keep ? y[i] * inv : 0.0f;
    }
}

static __global__ void soft_max_back_kernel(struct cu_t dy, struct cu_t yt, float *dx)
{
    cu_pdl_enter();
    __shared__ double shared[32];
    const int64_t ne0 = yt.ne[0], ne1 = yt.ne[1], rows = yt.ne[1] * yt.ne[2] * yt.ne[3];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % yt.ne[2], i3 = r / (ne1 * yt.ne[2]);
        double dot = 0.0;
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x)
            dot += (double)cu_getf(dy, i, i1, i2, i3) * (double)cu_getf(yt, i, i1, i2, i3);
        const float d = (float)cu_block_sum(dot, shared);
        for (int64_t i = threadIdx.x; i < ne0; i += blockDim.x)
            dx[r * ne0 + i] = cu_getf(yt, i, i1, i2, i3) * (cu_getf(dy, i, i1, i2, i3) - d);
    }
}

lt_status cu_softmax_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_softmax_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const int64_t rows = lt_nrows(node);
    if (rows == 0 || node->ne[0] == 0)
        return LT_OK;
    int64_t t = (node->ne[0] + 31) / 32 * 32;
    const int threads = t > 256 ? 256 : (int)t;
    if (node->op == LT_OP_SOFT_MAX_BACK) {
        cu_launch_pdl(c, soft_max_back_kernel, cu_blocks(rows, 1), threads, 0,
                      cu_view(node->src[0]), cu_view(node->src[1]), (float *)node->data);
        return cu_launched("soft_max_back");
    }
    const struct lt_tensor *mask = node->src[1];
    struct cu_t mv = mask ? cu_view(mask) : cu_view(node->src[0]);
    cu_launch_pdl(c, soft_max_kernel, cu_blocks(rows, 1), threads, 0, cu_view(node->src[0]), mv,
                  mask != NULL, (float *)node->data, lt_get_param_f32(node, 0),
                  lt_get_param_i32(node, 1) != 0);
    return cu_launched("soft_max");
}

const struct cu_family cu_family_softmax = {"softmax", softmax_ops, CU_COUNT(softmax_ops),
                                                cu_softmax_supported, cu_softmax_compute};
