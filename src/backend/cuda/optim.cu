/* optim.cu: the optimizer steps ADAMW and SGD on the device (see src/ops/optim.c).
 *
 * Each updates its parameter and moments in place (the node is a view of the parameter),
 * reads the hyper-parameters from a small F32 tensor in device memory (so a schedule can
 * change them without rebuilding the graph), and zeroes the gradient accumulator after
 * reading it. Every product and sum is rounded on its own, in the CPU's order, so a step
 * on the device gives the CPU's bits.
 *
 * A training graph steps all its tensors at once over flat buffers (src/opt/train_graph.c):
 * hundreds of millions of elements, 32 bytes each moved (four read, four written), so the
 * kernel is a pure stream: 16-byte loads and stores when the buffers allow them. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op optim_ops[] = {LT_OP_ADAMW, LT_OP_SGD};

bool cu_optim_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
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
struct adamw_hp {
    float lr, b1, b2, eps, decay, c1, c2, gs;
};

static __device__ __forceinline__ struct adamw_hp adamw_hp_load(const float *hp)
{
    struct adamw_hp h = {hp[0], hp[1], hp[2], hp[3], 0, hp[5], hp[6], hp[7]};
    h.decay = __fsub_rn(1.0f, __fmul_rn(hp[0], hp[4]));
    return h;
}

/* One element: the new w, m and v from the old ones and the accumulated gradient. */
static __device__ __forceinline__ void adamw_one(const struct adamw_hp &h, float &w, float acc,
                                                 float &m, float &v)
{
    const float g = __fmul_rn(acc, h.gs);
    m = __fadd_rn(__fmul_rn(h.b1, m), __fmul_rn(1.0f - h.b1, g));
    v = __fadd_rn(__fmul_rn(h.b2, v), __fmul_rn(__fmul_rn(1.0f - h.b2, g), g));
    const float mhat = __fdiv_rn(m, h.c1), vhat = __fdiv_rn(v, h.c2);
    w = __fsub_rn(__fmul_rn(w, h.decay),
                  __fdiv_rn(__fmul_rn(h.lr, mhat), __fadd_rn(__fsqrt_rn(vhat), h.eps)));
}

static __global__ void adamw_kernel(float *w, float *acc, float *m, float *v, const float *hp,
                                    int64_t n)
{
    cu_pdl_enter();
    const struct adamw_hp h = adamw_hp_load(hp);
    for (int64_t i = cu_thread_index(); i < n; i += cu_thread_count()) {
        float wi = w[i], mi = m[i], vi = v[i];
        adamw_one(h, wi, acc[i], mi, vi);
        acc[i] = 0.0f;
        m[i] = mi;
        v[i] = vi;
        w[i] = wi;
    }
}

/* The same over float4s: n4 = n / 4, every pointer 16-byte aligned. */
static __global__ void adamw_vec4_kernel(float4 *w, float4 *acc, float4 *m, float4 *v,
                                         const float *hp, int64_t n4)
{
    cu_pdl_enter();
    const struct adamw_hp h = adamw_hp_load(hp);
    for (int64_t i = cu_thread_index(); i < n4; i += cu_thread_count()) {
        float4 wi = w[i], gi = acc[i], mi = m[i], vi = v[i];
        adamw_one(h, wi.x, gi.x, mi.x, vi.x);
        adamw_one(h, wi.y, gi.y, mi.y, vi.y);
        adamw_one(h, wi.z, gi.z, mi.z, vi.z);
        adamw_one(h, wi.w, gi.w, mi.w, vi.w);
        acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        m[i] = mi;
        v[i] = vi;
        w[i] = wi;
    }
}

/* hp = [lr, weight_decay, grad_scale] */
static __global__ void sgd_kernel(float *w, float *acc, const float *hp, int64_t n)
{
    cu_pdl_enter();
    const float lr = hp[0], wd = hp[1], gs = hp[2];
    for (int64_t i = cu_thread_index(); i < n; i += cu_thread_count()) {
        const float g = __fmul_rn(acc[i], gs);
        acc[i] = 0.0f;
        w[i] = __fsub_rn(w[i], __fmul_rn(lr, __fadd_rn(g, __fmul_rn(wd, w[i]))));
    }
}

lt_status cu_optim_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_optim_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const int64_t n = lt_nelements(node->src[0]);
    if (n == 0)
        return LT_OK;
    float *w = (float *)node->src[0]->data, *acc = (float *)node->src[1]->data;
    if (node->op == LT_OP_ADAMW) {
        float *m = (float *)node->src[2]->data, *v = (float *)node->src[3]->data;
        const float *hp = (const float *)node->src[4]->data;
        if (n % 4 == 0 && cu_aligned(w, 16) && cu_aligned(acc, 16) && cu_aligned(m, 16) &&
            cu_aligned(v, 16)) {
            cu_launch_pdl(c, adamw_vec4_kernel, cu_blocks(n / 4, 256), 256, 0, (float4 *)w,
                          (float4 *)acc, (float4 *)m, (float4 *)v, hp, n / 4);
            return cu_launched("adamw_vec4");
        }
        cu_launch_pdl(c, adamw_kernel, cu_blocks(n, 256), 256, 0, w, acc, m, v, hp, n);
        return cu_launched("adamw");
    }
    cu_launch_pdl(c, sgd_kernel, cu_blocks(n, 256), 256, 0, w, acc,
                  (const float *)node->src[2]->data, n);
    return cu_launched("sgd");
}

const struct cu_family cu_family_optim = {"optim", optim_ops, CU_COUNT(optim_ops),
                                              cu_optim_supported, cu_optim_compute};
