/* binary.c: element-wise add, sub, mul and div, with b broadcast (tiled) over a.
 *
 * dst[i0, i1, i2, i3] = a[i0, i1, i2, i3] op b[i0 % b.ne0, i1 % b.ne1, i2 % b.ne2, i3 % b.ne3]
 * Both sources may have any strides (transposed, permuted, sliced, or broadcast views with
 * nb = 0) and be F32, F16 or BF16: each row is read as ne0 floats, in place when it is F32
 * with unit stride, otherwise converted into the thread's scratch. The result is
 * contiguous, of a's shape, F32, or F16 / BF16 when built so (lt_mul_as: an activation
 * that only half-precision weights multiply is written in their type at once, rounded to
 * nearest even from the F32 value); threads split its rows.
 *
 * Backward: b was tiled over a, so b's gradient is the sum over its tiles (lt_repeat_back
 * down to b's shape). Where a rule reads a forward source in a kernel (the other operand of
 * MUL, the divisor of DIV), it reads a contiguous copy when the source is a view
 * (lt_ad_contiguous): the backward graph hands no kernel a strided source, so a device
 * whose element-wise kernels need unit strides can run all of it. */
#include <assert.h>
#include <stdio.h>

#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

/* y[i] = x[i] op u[i] over n elements */
static void binary_apply(enum lt_op op, const float *x, const float *u, float *y, int64_t n)
{
    switch (op) {
    case LT_OP_ADD:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] + u[i];
        break;
    case LT_OP_SUB:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] - u[i];
        break;
    case LT_OP_MUL:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * u[i];
        break;
    case LT_OP_DIV:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] / u[i];
        break;
    default: assert(!"binary_apply: not a binary op");
    }
}

/* Scratch floats of one thread: a row of a and of b, and of the result when it is not F32 */
static size_t binary_thread_floats(const struct lt_tensor *node)
{
    return lt_scratch_floats(node->ne[0]) + lt_scratch_floats(node->src[1]->ne[0]) +
           (node->type == LT_TYPE_F32 ? 0 : lt_scratch_floats(node->ne[0]));
}

static void binary_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const int64_t ne0 = node->ne[0], ne1 = node->ne[1], ne2 = node->ne[2];
    const int64_t bne0 = b->ne[0];
    const bool f32 = node->type == LT_TYPE_F32;
    float *abuf = (float *)p->wdata + (size_t)p->ith * binary_thread_floats(node);
    float *bbuf = abuf + lt_scratch_floats(ne0);
    float *ybuf = bbuf + lt_scratch_floats(bne0); /* a half result's row, before rounding */
    int64_t lo, hi;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float *x = lt_row_f32(a, i1, i2, i3, abuf);
        const float *u = lt_row_f32(b, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3], bbuf);
        float *y = f32 ? (float *)node->data + r * ne0 : ybuf;
        /* b's row is tiled along the row in whole copies (bne0 divides ne0) */
        for (int64_t j = 0; j < ne0; j += bne0)
            binary_apply(node->op, x + j, u, y + j, bne0);
        if (!f32)
            lt_row_from_f32(node, i1, i2, i3, y);
    }
}

static size_t binary_work_size(const struct lt_tensor *node, int nth)
{
    return (size_t)nth * binary_thread_floats(node) * sizeof(float);
}

static bool binary_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    for (int i = 0; i < 2; i++) {
        const struct lt_tensor *s = node->src[i];
        if (!s || !lt_type_is_float(s->type)) {
            snprintf(reason, reason_size, "source %d is %s, not f32, f16 or bf16", i,
                     s ? lt_type_name(s->type) : "missing");
            return false;
        }
    }
    if (!lt_type_is_float(node->type) || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is %s %s, not contiguous f32, f16 or bf16",
                 lt_type_name(node->type), lt_layout_name(node));
        return false;
    }
    if (!lt_same_shape(node, node->src[0]) || !lt_can_repeat(node->src[1], node->src[0])) {
        snprintf(reason, reason_size, "source 1 cannot be broadcast over source 0");
        return false;
    }
    return true;
}

static struct lt_tensor *binary_new(struct lt_ctx *ctx, enum lt_op op, struct lt_tensor *a,
                                    struct lt_tensor *b, enum lt_type type)
{
    LT_REQUIRE(lt_op_name(op), a, b);
    if (!lt_type_is_float(a->type) || !lt_type_is_float(b->type)) {
        lt_fail(LT_ERR_INVALID, "%s of '%s' (%s) and '%s' (%s): types must be f32, f16 or bf16",
                lt_op_name(op), a->name, lt_type_name(a->type), b->name, lt_type_name(b->type));
        return NULL;
    }
    if (!lt_can_repeat(b, a)) {
        lt_fail(LT_ERR_INVALID,
                "%s of '%s' [%lld %lld %lld %lld] and '%s' [%lld %lld %lld %lld]: the second "
                "cannot be broadcast over the first",
                lt_op_name(op), a->name, (long long)a->ne[0], (long long)a->ne[1],
                (long long)a->ne[2], (long long)a->ne[3], b->name, (long long)b->ne[0],
                (long long)b->ne[1], (long long)b->ne[2], (long long)b->ne[3]);
        return NULL;
    }
    if (!lt_type_is_float(type)) {
        lt_fail(LT_ERR_INVALID, "%s of '%s' and '%s' into %s: the result must be f32, f16 or bf16",
                lt_op_name(op), a->name, b->name, lt_type_name(type));
        return NULL;
    }
    return lt_new_op_tensor(ctx, op, type, LT_MAX_DIMS, a->ne, (struct lt_tensor *[]){a, b}, 2);
}

struct lt_tensor *lt_add(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b)
{
    return binary_new(ctx, LT_OP_ADD, a, b, LT_TYPE_F32);
}

struct lt_tensor *lt_sub(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b)
{
    return binary_new(ctx, LT_OP_SUB, a, b, LT_TYPE_F32);
}

struct lt_tensor *lt_mul(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b)
{
    return binary_new(ctx, LT_OP_MUL, a, b, LT_TYPE_F32);
}

struct lt_tensor *lt_mul_as(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                            enum lt_type type)
{
    return binary_new(ctx, LT_OP_MUL, a, b, type);
}

struct lt_tensor *lt_div(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b)
{
    return binary_new(ctx, LT_OP_DIV, a, b, LT_TYPE_F32);
}

/* ---- backward rules ---- */

/* The gradient g of the result (a's shape) summed down to the shape of b, which was tiled
 * over it. NULL stays NULL (a constructor failed; lt_ad_add reports it). */
static struct lt_tensor *sum_to_shape(struct lt_ctx *ctx, struct lt_tensor *g, struct lt_tensor *b)
{
    if (!g || lt_same_shape(g, b))
        return g;
    return lt_repeat_back(ctx, g, b);
}

/* y = a + b: da = g, db = sum of g over b's tiles */
static lt_status add_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0], *b = node->src[1], *g = node->grad;
    lt_status st = LT_OK;
    if (lt_ad_wants(ad, a))
        st = lt_ad_add(ad, a, g);
    if (st == LT_OK && lt_ad_wants(ad, b))
        st = lt_ad_add(ad, b, sum_to_shape(lt_ad_ctx(ad), g, b));
    return st;
}

/* y = a - b: da = g, db = -(sum of g over b's tiles), negated after the sum (fewer
 * elements) */
static lt_status sub_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0], *b = node->src[1], *g = node->grad;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    lt_status st = LT_OK;
    if (lt_ad_wants(ad, a))
        st = lt_ad_add(ad, a, g);
    if (st == LT_OK && lt_ad_wants(ad, b))
        st = lt_ad_add(ad, b, lt_neg(ctx, sum_to_shape(ctx, g, b)));
    return st;
}

/* y = a * b: da = g * b (b tiled again by the kernel), db = sum of g * a over b's tiles */
static lt_status mul_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0], *b = node->src[1], *g = node->grad;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    lt_status st = LT_OK;
    if (lt_ad_wants(ad, a))
        st = lt_ad_add(ad, a, lt_mul(ctx, g, lt_ad_contiguous(ad, b)));
    if (st == LT_OK && lt_ad_wants(ad, b))
        st = lt_ad_add(ad, b, sum_to_shape(ctx, lt_mul(ctx, g, lt_ad_contiguous(ad, a)), b));
    return st;
}

/* y = a / b: da = g / b; db = -g a / b^2 = -(g / b) * y, summed over b's tiles. Both
 * share t = g / b, and y (the node, contiguous) stands in for a / b. */
static lt_status div_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0], *b = node->src[1];
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    if (!lt_ad_wants(ad, a) && !lt_ad_wants(ad, b))
        return LT_OK;
    struct lt_tensor *t = lt_div(ctx, node->grad, lt_ad_contiguous(ad, b));
    lt_status st = LT_OK;
    if (lt_ad_wants(ad, a))
        st = lt_ad_add(ad, a, t);
    if (st == LT_OK && lt_ad_wants(ad, b))
        st = lt_ad_add(ad, b, lt_neg(ctx, sum_to_shape(ctx, lt_mul(ctx, t, node), b)));
    return st;
}

const struct lt_op_def lt_op_def_add = {.name = "ADD",
                                        .n_src = 2,
                                        .cpu_supported = binary_supported,
                                        .cpu_work_size = binary_work_size,
                                        .cpu_forward = binary_forward,
                                        .backward = add_backward};
const struct lt_op_def lt_op_def_sub = {.name = "SUB",
                                        .n_src = 2,
                                        .cpu_supported = binary_supported,
                                        .cpu_work_size = binary_work_size,
                                        .cpu_forward = binary_forward,
                                        .backward = sub_backward};
const struct lt_op_def lt_op_def_mul = {.name = "MUL",
                                        .n_src = 2,
                                        .cpu_supported = binary_supported,
                                        .cpu_work_size = binary_work_size,
                                        .cpu_forward = binary_forward,
                                        .backward = mul_backward};
const struct lt_op_def lt_op_def_div = {.name = "DIV",
                                        .n_src = 2,
                                        .cpu_supported = binary_supported,
                                        .cpu_work_size = binary_work_size,
                                        .cpu_forward = binary_forward,
                                        .backward = div_backward};
