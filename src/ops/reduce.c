/* reduce.c: sum_rows and mean (over ne0, one value per row), sum (of every element) and
 * argmax (each row's largest element's index).
 *
 * Sources may have any strides and be F32, F16 or BF16. Every sum accumulates in double in
 * a fixed order, so a result does not depend on the number of threads: sum first writes
 * one double per row (threads split the rows), then thread 0 adds the rows in order.
 * Results are contiguous F32.
 *
 * Backward: every element of a row (of the tensor, for sum) moved the result by the same
 * amount, so the gradient is the result's gradient tiled back over the source's shape
 * (lt_repeat); mean scales it by 1 / ne0 first, on the smaller tensor. Only the source's
 * shape is used, never its data, so its layout does not matter. */
#include <math.h>
#include <stdio.h>

#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

static double row_sum(const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i];
    return s;
}

/* The row sums of a's rows [lo, hi) into out[lo..hi) (doubles). */
static void rows_sum(const struct lt_tensor *a, int64_t lo, int64_t hi, float *buf, double *out)
{
    const int64_t ne1 = a->ne[1], ne2 = a->ne[2];
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        out[r] = row_sum(lt_row_f32(a, i1, i2, i3, buf), a->ne[0]);
    }
}

/* sum_rows and mean: the per-thread row buffer, then (sum only) one double per row */
static size_t reduce_work_size(const struct lt_tensor *node, int nth)
{
    const struct lt_tensor *a = node->src[0];
    size_t w = (size_t)nth * lt_scratch_floats(a->ne[0]) * sizeof(float);
    if (node->op == LT_OP_SUM)
        w += (size_t)lt_nrows(a) * sizeof(double);
    return w;
}

static void sum_rows_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0];
    float *buf = (float *)p->wdata + (size_t)p->ith * lt_scratch_floats(a->ne[0]);
    const int64_t ne1 = a->ne[1], ne2 = a->ne[2];
    const double scale = node->op == LT_OP_MEAN && a->ne[0] > 0 ? 1.0 / (double)a->ne[0] : 1.0;
    float *y = node->data;
    int64_t lo, hi;
    lt_split_range(lt_nrows(a), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        y[r] = (float)(row_sum(lt_row_f32(a, i1, i2, i3, buf), a->ne[0]) * scale);
    }
}

static void sum_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0];
    const int64_t nr = lt_nrows(a);
    float *buf = (float *)p->wdata + (size_t)p->ith * lt_scratch_floats(a->ne[0]);
    double *sums = (double *)((float *)p->wdata + (size_t)p->nth * lt_scratch_floats(a->ne[0]));
    int64_t lo, hi;
    lt_split_range(nr, p->ith, p->nth, &lo, &hi);
    rows_sum(a, lo, hi, buf, sums);
    lt_compute_barrier(p);
    if (p->ith != 0)
        return;
    double s = 0.0;
    for (int64_t r = 0; r < nr; r++)
        s += sums[r];
    *(float *)node->data = (float)s;
}

static bool reduce_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *a = node->src[0];
    if (!a || !lt_type_is_float(a->type)) {
        snprintf(reason, reason_size, "source 0 is %s, not f32, f16 or bf16",
                 a ? lt_type_name(a->type) : "missing");
        return false;
    }
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is %s %s, not contiguous f32",
                 lt_type_name(node->type), lt_layout_name(node));
        return false;
    }
    int64_t expect = node->op == LT_OP_SUM ? 1 : lt_nrows(a);
    if (lt_nelements(node) != expect) {
        snprintf(reason, reason_size, "the result has %lld elements, not %lld",
                 (long long)lt_nelements(node), (long long)expect);
        return false;
    }
    return true;
}

static struct lt_tensor *reduce_new(struct lt_ctx *ctx, enum lt_op op, struct lt_tensor *a)
{
    LT_REQUIRE(lt_op_name(op), a);
    if (!lt_type_is_float(a->type)) {
        lt_fail(LT_ERR_INVALID, "%s of '%s': its type %s is not f32, f16 or bf16", lt_op_name(op),
                a->name, lt_type_name(a->type));
        return NULL;
    }
    if (op == LT_OP_SUM)
        return lt_new_op_tensor(ctx, op, LT_TYPE_F32, 1, (int64_t[]){1}, &a, 1);
    int64_t ne[LT_MAX_DIMS] = {1, a->ne[1], a->ne[2], a->ne[3]};
    return lt_new_op_tensor(ctx, op, LT_TYPE_F32, LT_MAX_DIMS, ne, &a, 1);
}

struct lt_tensor *lt_sum_rows(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return reduce_new(ctx, LT_OP_SUM_ROWS, a);
}

struct lt_tensor *lt_mean(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return reduce_new(ctx, LT_OP_MEAN, a);
}

struct lt_tensor *lt_sum(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return reduce_new(ctx, LT_OP_SUM, a);
}

/* ---- backward rule (sum_rows, mean, sum) ---- */

static lt_status reduce_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0], *g = node->grad;
    if (!lt_ad_wants(ad, a))
        return LT_OK;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    if (node->op == LT_OP_MEAN)
        g = lt_scale(ctx, g, a->ne[0] > 0 ? 1.0f / (float)a->ne[0] : 1.0f);
    return lt_ad_add(ad, a, lt_repeat(ctx, g, a));
}

const struct lt_op_def lt_op_def_sum_rows = {.name = "SUM_ROWS",
                                             .n_src = 1,
                                             .cpu_supported = reduce_supported,
                                             .cpu_work_size = reduce_work_size,
                                             .cpu_forward = sum_rows_forward,
                                             .backward = reduce_backward};
const struct lt_op_def lt_op_def_mean = {.name = "MEAN",
                                         .n_src = 1,
                                         .cpu_supported = reduce_supported,
                                         .cpu_work_size = reduce_work_size,
                                         .cpu_forward = sum_rows_forward,
                                         .backward = reduce_backward};
const struct lt_op_def lt_op_def_sum = {.name = "SUM",
                                        .n_src = 1,
                                        .cpu_supported = reduce_supported,
                                        .cpu_work_size = reduce_work_size,
                                        .cpu_forward = sum_forward,
                                        .backward = reduce_backward};

/* ---- argmax: I32 [ne1, ne2, ne3], a row's largest of its first n ---- */

/* The index of the largest of x[0..n), the lowest among equals; -1 if one is NaN: the
 * sampler's greedy pick (pick_greedy_plain) as an op. */
static int32_t row_argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    float bv = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i])
            return -1;
        if (x[i] > bv) {
            bv = x[i];
            best = i;
        }
    }
    return (int32_t)best;
}

static void argmax_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0];
    const int64_t n = lt_get_param_i32(node, 0), ne1 = a->ne[1], ne2 = a->ne[2];
    int32_t *y = node->data;
    int64_t lo, hi;
    lt_split_range(lt_nrows(a), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float *x =
            (const float *)((const char *)a->data + i1 * a->nb[1] + i2 * a->nb[2] + i3 * a->nb[3]);
        y[r] = row_argmax(x, n);
    }
}

/* A source of F32 rows (its rows may be apart: a slice), the first n of each read, into a
 * contiguous I32 result of one element a row: what the constructor makes. */
static bool argmax_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *a = node->src[0];
    const int64_t n = lt_get_param_i32(node, 0);
    if (!a || a->type != LT_TYPE_F32 || a->nb[0] != sizeof(float)) {
        snprintf(reason, reason_size, "source 0 is %s %s, not f32 with contiguous rows",
                 a ? lt_type_name(a->type) : "missing", a ? lt_layout_name(a) : "");
        return false;
    }
    if (n < 1 || n > a->ne[0] || n > INT32_MAX) {
        snprintf(reason, reason_size, "%lld of rows of %lld", (long long)n, (long long)a->ne[0]);
        return false;
    }
    if (node->type != LT_TYPE_I32 || !lt_is_contiguous(node) || lt_nelements(node) != lt_nrows(a)) {
        snprintf(reason, reason_size, "the result is %s %s of %lld, not contiguous i32 of %lld",
                 lt_type_name(node->type), lt_layout_name(node), (long long)lt_nelements(node),
                 (long long)lt_nrows(a));
        return false;
    }
    return true;
}

struct lt_tensor *lt_argmax(struct lt_ctx *ctx, struct lt_tensor *a, int64_t n)
{
    LT_REQUIRE("ARGMAX", a);
    if (a->type != LT_TYPE_F32 || a->nb[0] != sizeof(float)) {
        lt_fail(LT_ERR_INVALID, "ARGMAX of '%s': %s %s, not f32 with contiguous rows", a->name,
                lt_type_name(a->type), lt_layout_name(a));
        return NULL;
    }
    if (n < 1 || n > a->ne[0] || n > INT32_MAX) {
        lt_fail(LT_ERR_INVALID, "ARGMAX of '%s': the first %lld of rows of %lld", a->name,
                (long long)n, (long long)a->ne[0]);
        return NULL;
    }
    int64_t ne[LT_MAX_DIMS] = {a->ne[1], a->ne[2], a->ne[3], 1};
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_ARGMAX, LT_TYPE_I32, 3, ne, &a, 1);
    if (t)
        lt_set_param_i32(t, 0, (int32_t)n);
    return t;
}

const struct lt_op_def lt_op_def_argmax = {
    .name = "ARGMAX", .n_src = 1, .cpu_supported = argmax_supported, .cpu_forward = argmax_forward};
