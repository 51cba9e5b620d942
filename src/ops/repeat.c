/* repeat.c: REPEAT (a tensor tiled to a larger shape) and REPEAT_BACK (the sum of every
 * tile, its gradient), with their CPU kernels and backward rules: a sum for repeat, a tile
 * for repeat_back. Every result is contiguous F32; sources of any strides are read row by
 * row (copy.c says more about the copy family). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/copy_impl.h"
#include "ops/grad.h"
#include "ops/op.h"

/* ---- repeat ---- */

static void repeat_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0];
    const int64_t ne0 = node->ne[0], ane0 = a->ne[0];
    if (lt_nelements(node) == 0)
        return;
    int64_t lo, hi;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1, i2, i3;
        row_index(node, r, &i1, &i2, &i3);
        float *y = (float *)node->data + r * ne0;
        lt_row_to_f32(a, i1 % a->ne[1], i2 % a->ne[2], i3 % a->ne[3], y);
        for (int64_t j = ane0; j < ne0; j += ane0)
            memcpy(y + j, y, (size_t)ane0 * sizeof(float));
    }
}

static bool repeat_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (!check_source_readable(node, 0, reason, reason_size) ||
        !check_result_f32(node, reason, reason_size))
        return false;
    if (!lt_can_repeat(node->src[0], node)) {
        snprintf(reason, reason_size, "source 0 does not tile the result");
        return false;
    }
    return true;
}

struct lt_tensor *lt_repeat(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *like)
{
    LT_REQUIRE("repeat", a, like);
    if (!type_readable(a->type)) {
        lt_fail(LT_ERR_INVALID, "REPEAT of '%s': type %s cannot be read", a->name,
                lt_type_name(a->type));
        return NULL;
    }
    if (!lt_can_repeat(a, like))
        return fail_shapes(LT_OP_REPEAT, a, like, "the first does not tile the second");
    return lt_new_op_tensor(ctx, LT_OP_REPEAT, LT_TYPE_F32, LT_MAX_DIMS, like->ne, &a, 1);
}

/* repeat: every tile of a moved the result, so a's gradient is the sum of the tiles */
static lt_status repeat_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0];
    if (!lt_ad_wants(ad, a))
        return LT_OK;
    return lt_ad_add(ad, a, lt_repeat_back(lt_ad_ctx(ad), node->grad, a));
}

/* ---- repeat_back: the sum of every tile ---- */

/* Thread ith owns result rows; for each it adds up, in a fixed order, every row of a that
 * tiles onto it, in double. */
static void repeat_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0];
    const int64_t ne0 = node->ne[0], ane0 = a->ne[0];
    float *buf =
        (float *)p->wdata + (size_t)p->ith * (lt_scratch_floats(ane0) + 2 * lt_scratch_floats(ne0));
    double *acc = (double *)(buf + lt_scratch_floats(ane0));
    const int64_t t1 = a->ne[1] / node->ne[1], t2 = a->ne[2] / node->ne[2],
                  t3 = a->ne[3] / node->ne[3];
    int64_t lo, hi;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t j1, j2, j3;
        row_index(node, r, &j1, &j2, &j3);
        for (int64_t i = 0; i < ne0; i++)
            acc[i] = 0.0;
        for (int64_t k3 = 0; k3 < t3; k3++)
            for (int64_t k2 = 0; k2 < t2; k2++)
                for (int64_t k1 = 0; k1 < t1; k1++) {
                    lt_row_to_f32(a, j1 + k1 * node->ne[1], j2 + k2 * node->ne[2],
                                  j3 + k3 * node->ne[3], buf);
                    for (int64_t j = 0; j < ane0; j += ne0)
                        for (int64_t i = 0; i < ne0; i++)
                            acc[i] += (double)buf[j + i];
                }
        float *y = (float *)node->data + r * ne0;
        for (int64_t i = 0; i < ne0; i++)
            y[i] = (float)acc[i];
    }
}

static size_t repeat_back_work_size(const struct lt_tensor *node, int nth)
{
    /* a row of a, then ne0 doubles */
    return (size_t)nth *
           (lt_scratch_floats(node->src[0]->ne[0]) + 2 * lt_scratch_floats(node->ne[0])) *
           sizeof(float);
}

static bool repeat_back_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (!check_source_readable(node, 0, reason, reason_size) ||
        !check_result_f32(node, reason, reason_size))
        return false;
    if (!lt_can_repeat(node, node->src[0])) {
        snprintf(reason, reason_size, "the result does not tile source 0");
        return false;
    }
    return true;
}

struct lt_tensor *lt_repeat_back(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *like)
{
    LT_REQUIRE("repeat_back", a, like);
    if (!type_readable(a->type)) {
        lt_fail(LT_ERR_INVALID, "REPEAT_BACK of '%s': type %s cannot be read", a->name,
                lt_type_name(a->type));
        return NULL;
    }
    if (!lt_can_repeat(like, a))
        return fail_shapes(LT_OP_REPEAT_BACK, a, like, "the second does not tile the first");
    return lt_new_op_tensor(ctx, LT_OP_REPEAT_BACK, LT_TYPE_F32, LT_MAX_DIMS, like->ne, &a, 1);
}

/* repeat_back: every element of a went into one sum, so a's gradient is the result's
 * gradient tiled back over a */
static lt_status repeat_back_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0];
    if (!lt_ad_wants(ad, a))
        return LT_OK;
    return lt_ad_add(ad, a, lt_repeat(lt_ad_ctx(ad), node->grad, a));
}

/* ---- the table ---- */

const struct lt_op_def lt_op_def_repeat = {.name = "REPEAT",
                                           .n_src = 1,
                                           .cpu_supported = repeat_supported,
                                           .cpu_forward = repeat_forward,
                                           .backward = repeat_backward};
const struct lt_op_def lt_op_def_repeat_back = {.name = "REPEAT_BACK",
                                                .n_src = 1,
                                                .cpu_supported = repeat_back_supported,
                                                .cpu_work_size = repeat_back_work_size,
                                                .cpu_forward = repeat_back_forward,
                                                .backward = repeat_back_backward};
