/* ssm_conv.cu: SSM_CONV (the causal depthwise conv1d of Gated DeltaNet) and SSM_CONV_BACK
 * on the device (see src/ops/ssm_conv.c).
 *
 * sx [d_conv - 1 + T, channels, n_seqs] F32 of any strides (time innermost), w
 * [d_conv, channels] F32, F16 or BF16; y[c, t, s] = sum_k w[k, c] sx[t + k, c, s]. A thread
 * computes one output (forward), one element of d sx, or one element of d w, summing in
 * float in the CPU's order with each product and sum rounded on its own, so the device
 * gives the CPU's bits. SSM_CONV_BACK's result packs d sx (sx's shape) and then d w (w's
 * shape), both contiguous. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op ssm_conv_ops[] = {LT_OP_SSM_CONV, LT_OP_SSM_CONV_BACK};

bool ssm_conv_cuda_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const bool back = node->op == LT_OP_SSM_CONV_BACK;
    if (node->op != LT_OP_SSM_CONV && !back) {
        snprintf(reason, reason_size, "%s is not a conv", lt_op_name(node->op));
        return false;
    }
    const int is = back ? 1 : 0;
    if ((back && !cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size)) ||
        !cu_check_source(node, is, CU_TYPES_F32, reason, reason_size) ||
        !cu_check_source(node, is + 1, CU_TYPES_FLOAT, reason, reason_size) ||
        !cu_check_result_f32(node, reason, reason_size))
        return false;
    const struct lt_tensor *sx = node->src[is], *w = node->src[is + 1];
    if (sx->ne[3] != 1 || w->ne[2] != 1 || w->ne[3] != 1 || w->ne[1] != sx->ne[1] ||
        w->ne[0] < 1 || sx->ne[0] < w->ne[0]) {
        snprintf(reason, reason_size, "sx and w do not fit");
        return false;
    }
    const int64_t n_t = sx->ne[0] - w->ne[0] + 1;
    bool shape_ok;
    if (back) {
        const struct lt_tensor *g = node->src[0];
        shape_ok = g->ne[0] == sx->ne[1] && g->ne[1] == n_t && g->ne[2] == sx->ne[2] &&
                   g->ne[3] == 1 && lt_nelements(node) == lt_nelements(sx) + lt_nelements(w);
    } else {
        shape_ok = node->ne[0] == sx->ne[1] && node->ne[1] == n_t && node->ne[2] == sx->ne[2] &&
                   node->ne[3] == 1;
    }
    if (!shape_ok) {
        snprintf(reason, reason_size, "the result's shape does not match its sources");
        return false;
    }
    return true;
}

/* y [C, T, S] contiguous */
static __global__ void ssm_conv_kernel(struct cu_t sx, struct cu_t w, float *y, int64_t n_t)
{
    const int64_t n_c = sx.ne[1], n = n_c * n_t * sx.ne[2], d_conv = w.ne[0];
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        const int64_t c = f % n_c, t = (f / n_c) % n_t, s = f / (n_c * n_t);
        float acc = 0.0f;
        for (int64_t k = 0; k < d_conv; k++)
            acc = __fadd_rn(acc, __fmul_rn(cu_get(w, k, c, 0, 0), cu_getf(sx, t + k, c, s, 0)));
        y[f] = acc;
    }
}

/* d sx [L, C, S] contiguous: d sx[u, c, s] = sum_k w[k, c] grad[c, u - k, s], 0 <= u-k < T */
static __global__ void ssm_conv_back_sx_kernel(struct cu_t g, struct cu_t sx, struct cu_t w,
                                               float *dsx)
{
    const int64_t n_l = sx.ne[0], n_c = sx.ne[1], n = cu_nelements(sx), d_conv = w.ne[0];
    const int64_t n_t = n_l - d_conv + 1;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        const int64_t u = f % n_l, c = (f / n_l) % n_c, s = f / (n_l * n_c);
        const int64_t k_lo = u - (n_t - 1) > 0 ? u - (n_t - 1) : 0;
        const int64_t k_hi = u < d_conv - 1 ? u : d_conv - 1;
        float acc = 0.0f;
        for (int64_t k = k_lo; k <= k_hi; k++)
            acc = __fadd_rn(acc, __fmul_rn(cu_get(w, k, c, 0, 0), cu_getf(g, c, u - k, s, 0)));
        dsx[f] = acc;
    }
}

/* d w [d_conv, C] contiguous: d w[k, c] = sum_s (sum_t grad[c, t, s] sx[t + k, c, s]) */
static __global__ void ssm_conv_back_w_kernel(struct cu_t g, struct cu_t sx, struct cu_t w,
                                              float *dw)
{
    const int64_t d_conv = w.ne[0], n_c = sx.ne[1], n = d_conv * n_c;
    const int64_t n_t = sx.ne[0] - d_conv + 1;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        const int64_t k = f % d_conv, c = f / d_conv;
        float total = 0.0f;
        for (int64_t s = 0; s < sx.ne[2]; s++) {
            float acc = 0.0f;
            for (int64_t t = 0; t < n_t; t++)
                acc = __fadd_rn(acc, __fmul_rn(cu_getf(g, c, t, s, 0), cu_getf(sx, t + k, c, s, 0)));
            total = __fadd_rn(total, acc);
        }
        dw[f] = total;
    }
}

lt_status ssm_conv_cuda_compute(struct cuda_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!ssm_conv_cuda_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    if (node->op == LT_OP_SSM_CONV) {
        const struct lt_tensor *sx = node->src[0], *w = node->src[1];
        const int64_t n = lt_nelements(node);
        if (n == 0)
            return LT_OK;
        ssm_conv_kernel<<<cu_blocks(n, 256), 256, 0, c->stream>>>(
            cu_view(sx), cu_view(w), (float *)node->data, sx->ne[0] - w->ne[0] + 1);
        return cu_launched("ssm_conv");
    }
    const struct lt_tensor *g = node->src[0], *sx = node->src[1], *w = node->src[2];
    const int64_t nsx = lt_nelements(sx), nw = lt_nelements(w);
    float *dsx = (float *)node->data;
    if (nsx > 0) {
        ssm_conv_back_sx_kernel<<<cu_blocks(nsx, 256), 256, 0, c->stream>>>(
            cu_view(g), cu_view(sx), cu_view(w), dsx);
        lt_status st = cu_launched("ssm_conv_back_sx");
        if (st != LT_OK)
            return st;
    }
    if (nw == 0)
        return LT_OK;
    ssm_conv_back_w_kernel<<<cu_blocks(nw, 128), 128, 0, c->stream>>>(cu_view(g), cu_view(sx),
                                                                      cu_view(w), dsx + nsx);
    return cu_launched("ssm_conv_back_w");
}

const struct cuda_family cuda_family_ssm_conv = {"ssm_conv", ssm_conv_ops, 2,
                                                 ssm_conv_cuda_supported, ssm_conv_cuda_compute};
