/* optim.cu: the optimizer steps ADAMW and SGD on the device (see src/ops/optim.c).
 *
 * Each updates its parameter and moments in place (the node is a view of the parameter),
 * reads the hyper-parameters from a small F32 tensor in device memory (so a schedule can
 * change them without rebuilding the graph), and zeroes the gradient accumulator after
 * reading it. Every product and sum is rounded on its own, in the CPU's order, so a step
 * on the device gives the CPU's bits. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op optim_ops[] = {LT_OP_ADAMW, LT_OP_SGD};

bool optim_cuda_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const bool adamw = node->op == LT_OP_ADAMW;
    if (!adamw && node->op != LT_OP_SGD) {
        snprintf(reason, reason_size, "%s is not an optimizer step", lt_op_name(node->op));
        return false;
    }
    const int n_src = adamw ? 5 : 3;
    for (int i = 0; i < n_src; i++) {
        if (!cu_check_source(node, i, CU_TYPES_F32, reason, reason_size))
            return false;
        if (!lt_is_contiguous(node->src[i])) {
            snprintf(reason, reason_size, "source %d is %s, not contiguous", i,
                     lt_layout_name(node->src[i]));
            return false;
        }
        if (i < n_src - 1 && !lt_same_shape(node->src[i], node->src[0])) {
            snprintf(reason, reason_size, "source %d differs in shape from the parameter", i);
            return false;
        }
    }
    if (lt_nelements(node->src[n_src - 1]) < (adamw ? 8 : 3)) {
        snprintf(reason, reason_size, "the hyper-parameters have %lld values, not %d",
                 (long long)lt_nelements(node->src[n_src - 1]), adamw ? 8 : 3);
        return false;
    }
    return true;
}

/* hp = [lr, beta1, beta2, eps, weight_decay, 1 - beta1^t, 1 - beta2^t, grad_scale] */
static __global__ void adamw_kernel(float *w, float *acc, float *m, float *v, const float *hp,
                                    int64_t n)
{
    const float lr = hp[0], b1 = hp[1], b2 = hp[2], eps = hp[3], wd = hp[4];
    const float c1 = hp[5], c2 = hp[6], gs = hp[7];
    const float decay = __fsub_rn(1.0f, __fmul_rn(lr, wd));
    for (int64_t i = cu_thread_index(); i < n; i += cu_thread_count()) {
        const float g = __fmul_rn(acc[i], gs);
        acc[i] = 0.0f;
        const float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(1.0f - b1, g));
        const float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(1.0f - b2, g), g));
        m[i] = mi;
        v[i] = vi;
        const float mhat = __fdiv_rn(mi, c1), vhat = __fdiv_rn(vi, c2);
        w[i] = __fsub_rn(__fmul_rn(w[i], decay),
                         __fdiv_rn(__fmul_rn(lr, mhat), __fadd_rn(__fsqrt_rn(vhat), eps)));
    }
}

/* hp = [lr, weight_decay, grad_scale] */
static __global__ void sgd_kernel(float *w, float *acc, const float *hp, int64_t n)
{
    const float lr = hp[0], wd = hp[1], gs = hp[2];
    for (int64_t i = cu_thread_index(); i < n; i += cu_thread_count()) {
        const float g = __fmul_rn(acc[i], gs);
        acc[i] = 0.0f;
        w[i] = __fsub_rn(w[i], __fmul_rn(lr, __fadd_rn(g, __fmul_rn(wd, w[i]))));
    }
}

lt_status optim_cuda_compute(struct cuda_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!optim_cuda_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const int64_t n = lt_nelements(node->src[0]);
    if (n == 0)
        return LT_OK;
    float *w = (float *)node->src[0]->data, *acc = (float *)node->src[1]->data;
    if (node->op == LT_OP_ADAMW) {
        adamw_kernel<<<cu_blocks(n, 256), 256, 0, c->stream>>>(
            w, acc, (float *)node->src[2]->data, (float *)node->src[3]->data,
            (const float *)node->src[4]->data, n);
        return cu_launched("adamw");
    }
    sgd_kernel<<<cu_blocks(n, 256), 256, 0, c->stream>>>(w, acc, (const float *)node->src[2]->data,
                                                         n);
    return cu_launched("sgd");
}

const struct cuda_family cuda_family_optim = {"optim", optim_ops, 2, optim_cuda_supported,
                                              optim_cuda_compute};
