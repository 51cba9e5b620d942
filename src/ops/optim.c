/* optim.c: optimizer steps as graph ops, ADAMW and SGD.
 *
 * Each step updates its parameter (and moment tensors) in place: the node is a view of
 * the parameter, like CPY, so the scheduler gives it no storage of its own and readers
 * of the node see the updated values. Hyper-parameters come from a small F32 tensor, not
 * op_params, so a learning-rate schedule changes them without rebuilding the graph:
 *   ADAMW hp = [lr, beta1, beta2, eps, weight_decay, 1 - beta1^t, 1 - beta2^t, grad_scale]
 *   SGD   hp = [lr, weight_decay, grad_scale]
 * The gradient source is an accumulator summed over micro-batches: a step reads it times
 * grad_scale (1 / micro-batches for a mean) and then resets it to zero for the next one,
 * so no separate zeroing pass has to be ordered after the step.
 * AdamW follows PyTorch's torch.optim.AdamW: decoupled decay p -= lr*wd*p, then the
 * bias-corrected Adam step. */
#include <math.h>

#include "lathe/ops.h"
#include "ops/op.h"

static struct lt_tensor *in_place_node(struct lt_ctx *ctx, enum lt_op op, struct lt_tensor *p,
                                       struct lt_tensor *const *srcs, int n)
{
    struct lt_tensor *t = lt_view_4d(ctx, p, p->ne[0], p->ne[1], p->ne[2], p->ne[3], p->nb[1],
                                     p->nb[2], p->nb[3], 0);
    if (!t)
        return NULL;
    t->op = op;
    for (int i = 0; i < LT_MAX_SRC; i++)
        t->src[i] = i < n ? srcs[i] : NULL;
    lt_format_name(t, "%s (%s step)", p->name, op == LT_OP_ADAMW ? "adamw" : "sgd");
    return t;
}

static bool all_f32_contiguous(struct lt_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++)
        if (ts[i]->type != LT_TYPE_F32 || !lt_is_contiguous(ts[i]))
            return false;
    return true;
}

struct lt_tensor *lt_adamw_step(struct lt_ctx *ctx, struct lt_tensor *param, struct lt_tensor *grad,
                                struct lt_tensor *m, struct lt_tensor *v, struct lt_tensor *hp)
{
    LT_REQUIRE("adamw_step", param, grad, m, v, hp);
    struct lt_tensor *srcs[5] = {param, grad, m, v, hp};
    if (!lt_same_shape(param, grad) || !lt_same_shape(param, m) || !lt_same_shape(param, v) ||
        lt_nelements(hp) < 8 || !all_f32_contiguous(srcs, 5)) {
        lt_fail(LT_ERR_INVALID,
                "adamw step for '%s': parameter, gradient and moments must be contiguous F32 of "
                "one shape, hyper-parameters F32 [8]",
                param->name);
        return NULL;
    }
    return in_place_node(ctx, LT_OP_ADAMW, param, srcs, 5);
}

struct lt_tensor *lt_sgd_step(struct lt_ctx *ctx, struct lt_tensor *param, struct lt_tensor *grad,
                              struct lt_tensor *hp)
{
    LT_REQUIRE("sgd_step", param, grad, hp);
    struct lt_tensor *srcs[3] = {param, grad, hp};
    if (!lt_same_shape(param, grad) || lt_nelements(hp) < 3 || !all_f32_contiguous(srcs, 3)) {
        lt_fail(LT_ERR_INVALID,
                "sgd step for '%s': parameter and gradient must be contiguous F32 of one shape",
                param->name);
        return NULL;
    }
    return in_place_node(ctx, LT_OP_SGD, param, srcs, 3);
}

static void adamw_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    float *w = node->src[0]->data;
    float *acc = node->src[1]->data;
    float *m = node->src[2]->data, *v = node->src[3]->data;
    const float *hp = node->src[4]->data;
    const float lr = hp[0], b1 = hp[1], b2 = hp[2], eps = hp[3], wd = hp[4];
    const float c1 = hp[5], c2 = hp[6], gs = hp[7];
    int64_t lo, hi;
    lt_split_range(lt_nelements(node), p->ith, p->nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        float g = acc[i] * gs;
        acc[i] = 0.0f;
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        float mhat = m[i] / c1, vhat = v[i] / c2;
        w[i] = w[i] * (1.0f - lr * wd) - lr * mhat / (sqrtf(vhat) + eps);
    }
}

static void sgd_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    float *w = node->src[0]->data;
    float *acc = node->src[1]->data;
    const float *hp = node->src[2]->data;
    int64_t lo, hi;
    lt_split_range(lt_nelements(node), p->ith, p->nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        float g = acc[i] * hp[2];
        acc[i] = 0.0f;
        w[i] -= hp[0] * (g + hp[1] * w[i]);
    }
}

const struct lt_op_def lt_op_def_adamw = {.name = "ADAMW", .n_src = 5, .cpu_forward = adamw_forward};
const struct lt_op_def lt_op_def_sgd = {.name = "SGD", .n_src = 3, .cpu_forward = sgd_forward};
