/* gather.c: GET_ROWS (rows picked by I32 ids) and GET_ROWS_BACK (their scatter-add, the
 * gradient), with their CPU kernels and backward rules: a scatter-add for get_rows and a
 * gather for get_rows_back; and SET_ROWS, rows written at I32 ids into existing storage
 * (inference only: a decode step's cache stores). Every result is contiguous F32; sources of any strides are read
 * row by row (copy.c says more about the copy family). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/copy_impl.h"
#include "ops/grad.h"
#include "ops/op.h"

/* ---- get_rows ---- */

/* Result row (i1, i2, i3) is row ids[i1, i2, i3] of a's matrix (i2, i3). An id outside
 * a's rows gives a row of NaN: the kernel cannot fail, and NaN cannot go unnoticed. */
static void get_rows_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *ids = node->src[1];
    const int64_t ne0 = node->ne[0];
    int64_t lo, hi;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1, i2, i3;
        row_index(node, r, &i1, &i2, &i3);
        int64_t id = *(const int32_t *)lt_elem_ptr(ids, i1, i2, i3, 0);
        float *y = (float *)node->data + r * ne0;
        if (id < 0 || id >= a->ne[1]) {
            for (int64_t i = 0; i < ne0; i++)
                y[i] = NAN;
            continue;
        }
        lt_row_to_f32(a, id, i2, i3, y);
    }
}

static bool rows_ids_supported(const struct lt_tensor *node, const struct lt_tensor *ids,
                               char *reason, size_t reason_size)
{
    if (!ids || ids->type != LT_TYPE_I32) {
        snprintf(reason, reason_size, "source 1 (the ids) is %s, not i32",
                 ids ? lt_type_name(ids->type) : "missing");
        return false;
    }
    return check_result_f32(node, reason, reason_size);
}

static bool get_rows_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *ids = node->src[1];
    if (!check_source_readable(node, 0, reason, reason_size) ||
        !rows_ids_supported(node, ids, reason, reason_size))
        return false;
    if (node->ne[0] != a->ne[0] || node->ne[1] != ids->ne[0] || node->ne[2] != ids->ne[1] ||
        node->ne[3] != ids->ne[2] || a->ne[2] != ids->ne[1] || a->ne[3] != ids->ne[2]) {
        snprintf(reason, reason_size, "the result's shape does not match its sources");
        return false;
    }
    return true;
}

/* ids [k, ne2, ne3] against rows [n, rows, ne2, ne3] */
static bool ids_match(const struct lt_tensor *ids, const struct lt_tensor *rows)
{
    return ids->ne[1] == rows->ne[2] && ids->ne[2] == rows->ne[3] && ids->ne[3] == 1;
}

struct lt_tensor *lt_get_rows(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *ids)
{
    LT_REQUIRE("get_rows", a, ids);
    if (!type_readable(a->type)) {
        lt_fail(LT_ERR_INVALID, "GET_ROWS of '%s': type %s cannot be read", a->name,
                lt_type_name(a->type));
        return NULL;
    }
    if (ids->type != LT_TYPE_I32) {
        lt_fail(LT_ERR_INVALID, "GET_ROWS of '%s' with ids '%s' of type %s (not i32)", a->name,
                ids->name, lt_type_name(ids->type));
        return NULL;
    }
    if (!ids_match(ids, a))
        return fail_shapes(LT_OP_GET_ROWS, a, ids,
                           "ids must be [k, ne2, ne3] of the rows' ne2, ne3");
    int64_t ne[LT_MAX_DIMS] = {a->ne[0], ids->ne[0], a->ne[2], a->ne[3]};
    return lt_new_op_tensor(ctx, LT_OP_GET_ROWS, LT_TYPE_F32, LT_MAX_DIMS, ne,
                            (struct lt_tensor *[]){a, ids}, 2);
}

/* get_rows: the table's gradient is the result's rows added back at their ids (repeated
 * ids accumulate). A table that is frozen (a quantised or F16 embedding matrix, not
 * trainable) does not want a gradient, so none is built; the ids never do. The ids are
 * read contiguous, like every forward source a backward kernel reads. */
static lt_status get_rows_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0], *ids = node->src[1], *acc = a->grad;
    if (!lt_ad_wants(ad, a))
        return LT_OK;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    /* an accumulator only a reads (a tied LM head's gradient): the rows go into it in place,
     * where a dense scatter and an ADD each took a pass over the whole table */
    if (acc && lt_ad_grad_owned(ad, a) && acc->type == LT_TYPE_F32 && lt_is_contiguous(acc))
        return lt_ad_rows_into(ad, a, node->grad, lt_ad_contiguous(ad, ids), acc);
    /* a fresh scatter is a's own: a head's gradient handed over later takes its rows in place
     * (lt_ad_add_owned) */
    struct lt_tensor *d = lt_get_rows_back(ctx, node->grad, lt_ad_contiguous(ad, ids), a);
    lt_status st = lt_ad_add(ad, a, d);
    if (st == LT_OK && !acc && d && a->grad == d)
        lt_ad_set_owned_grad(ad, a, d);
    return st;
}

/* ---- get_rows_back: scatter-add ---- */

/* Threads first zero their share of the rows (not in place: lt_get_rows_back_into); then
 * each adds every grad row into its own slice of columns, so repeated ids never race and
 * always add up in the same order. Ids outside the result's rows are skipped. */
static void get_rows_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *grad = node->src[0], *ids = node->src[1];
    const int64_t ne0 = node->ne[0];
    if (!node->src[2]) {
        int64_t lo, hi;
        lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
        memset((float *)node->data + lo * ne0, 0, (size_t)(hi - lo) * (size_t)ne0 * sizeof(float));
        lt_compute_barrier(p);
    }
    int64_t c0, c1;
    lt_split_range(ne0, p->ith, p->nth, &c0, &c1);
    if (c0 >= c1)
        return;
    float *buf = (float *)p->wdata + (size_t)p->ith * lt_scratch_floats(ne0);
    for (int64_t r = 0; r < lt_nrows(grad); r++) {
        int64_t i1, i2, i3;
        row_index(grad, r, &i1, &i2, &i3);
        int64_t id = *(const int32_t *)lt_elem_ptr(ids, i1, i2, i3, 0);
        if (id < 0 || id >= node->ne[1])
            continue;
        const float *g = buf;
        if (grad->type == LT_TYPE_F32 && grad->nb[0] == sizeof(float))
            g = (const float *)lt_elem_ptr(grad, 0, i1, i2, i3);
        else
            lt_row_to_f32(grad, i1, i2, i3, buf);
        float *y = lt_elem_ptr(node, 0, id, i2, i3);
        for (int64_t i = c0; i < c1; i++)
            y[i] += g[i];
    }
}

static size_t get_rows_back_work_size(const struct lt_tensor *node, int nth)
{
    return row_work_size(node->ne[0], nth);
}

static bool get_rows_back_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (!check_source_readable(node, 0, reason, reason_size) ||
        !rows_ids_supported(node, node->src[1], reason, reason_size))
        return false;
    if (!lt_get_rows_back_fits(node)) {
        snprintf(reason, reason_size,
                 "the result's shape does not match its sources, or it adds in place into a "
                 "tensor other than contiguous f32 storage of its result");
        return false;
    }
    return true;
}

bool lt_get_rows_back_fits(const struct lt_tensor *node)
{
    const struct lt_tensor *grad = node->src[0], *ids = node->src[1], *into = node->src[2];
    if (node->op != LT_OP_GET_ROWS_BACK || !grad || !ids || grad->ne[0] != node->ne[0] ||
        grad->ne[1] != ids->ne[0] || grad->ne[2] != node->ne[2] || grad->ne[3] != node->ne[3] ||
        !ids_match(ids, node))
        return false;
    if (!into)
        return true;
    const struct lt_tensor *root = into->view_src ? into->view_src : into;
    const size_t offs = into->view_src ? into->view_offs : 0;
    return into->type == LT_TYPE_F32 && node->type == LT_TYPE_F32 && lt_is_contiguous(into) &&
           lt_is_contiguous(node) && lt_same_shape(into, node) && node->view_src == root &&
           node->view_offs == offs;
}

struct lt_tensor *lt_get_rows_back(struct lt_ctx *ctx, struct lt_tensor *grad,
                                   struct lt_tensor *ids, struct lt_tensor *like)
{
    LT_REQUIRE("get_rows_back", grad, ids, like);
    if (!lt_type_is_float(grad->type)) {
        lt_fail(LT_ERR_INVALID, "GET_ROWS_BACK of '%s': type %s is not f32, f16 or bf16",
                grad->name, lt_type_name(grad->type));
        return NULL;
    }
    if (ids->type != LT_TYPE_I32) {
        lt_fail(LT_ERR_INVALID, "GET_ROWS_BACK with ids '%s' of type %s (not i32)", ids->name,
                lt_type_name(ids->type));
        return NULL;
    }
    if (grad->ne[0] != like->ne[0] || grad->ne[2] != like->ne[2] || grad->ne[3] != like->ne[3])
        return fail_shapes(LT_OP_GET_ROWS_BACK, grad, like, "rows and batches differ");
    if (grad->ne[1] != ids->ne[0] || !ids_match(ids, like))
        return fail_shapes(LT_OP_GET_ROWS_BACK, grad, ids, "ids must be [k, ne2, ne3] of grad");
    return lt_new_op_tensor(ctx, LT_OP_GET_ROWS_BACK, LT_TYPE_F32, LT_MAX_DIMS, like->ne,
                            (struct lt_tensor *[]){grad, ids}, 2);
}

struct lt_tensor *lt_get_rows_back_into(struct lt_ctx *ctx, struct lt_tensor *grad,
                                        struct lt_tensor *ids, struct lt_tensor *into)
{
    LT_REQUIRE("get_rows_back_into", grad, ids, into);
    if (into->type != LT_TYPE_F32 || !lt_is_contiguous(into)) {
        lt_fail(LT_ERR_INVALID, "GET_ROWS_BACK into '%s' (%s, %s): it takes contiguous f32",
                into->name, lt_type_name(into->type), lt_layout_name(into));
        return NULL;
    }
    if (!lt_get_rows_back(ctx, grad, ids, into)) /* the checks */
        return NULL;
    struct lt_tensor *t = lt_writer_over(ctx, into, LT_OP_GET_ROWS_BACK);
    if (!t)
        return NULL;
    t->src[0] = grad;
    t->src[1] = ids;
    t->src[2] = into;
    return t;
}

/* get_rows_back: result row ids[r] received grad row r, so grad's gradient is the
 * result's gradient gathered at the ids. (An id outside the rows was skipped forward;
 * get_rows gives NaN for it, which cannot go unnoticed.) */
static lt_status get_rows_back_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *grad = node->src[0], *ids = node->src[1];
    if (!lt_ad_wants(ad, grad))
        return LT_OK;
    return lt_ad_add(ad, grad, lt_get_rows(lt_ad_ctx(ad), node->grad, lt_ad_contiguous(ad, ids)));
}

/* ---- set_rows: rows written at ids ---- */

/* src [a, b, k], ids [k], and the rows of dst (or of the node, a view of dst with its
 * strides): [a * b, rows], elements adjacent within a row. */
static bool set_rows_layout_ok(const struct lt_tensor *src, const struct lt_tensor *dst,
                               const struct lt_tensor *ids)
{
    return src->ne[0] * src->ne[1] == dst->ne[0] && src->ne[2] == ids->ne[0] &&
           src->ne[3] == 1 && dst->ne[2] == 1 && dst->ne[3] == 1 && ids->ne[1] == 1 &&
           ids->ne[2] == 1 && ids->ne[3] == 1 && lt_type_is_float(dst->type) &&
           dst->nb[0] == lt_type_traits(dst->type)->type_size;
}

/* Thread ith writes slices ith, ith + nth, ... of src: distinct ids never race; a
 * repeated id keeps one of its slices (the session never repeats one). */
static void set_rows_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *src = node->src[0], *ids = node->src[2];
    float *buf = (float *)p->wdata + (size_t)p->ith * lt_scratch_floats(node->ne[0]);
    for (int64_t r = p->ith; r < src->ne[2]; r += p->nth) {
        int64_t id = *(const int32_t *)lt_elem_ptr(ids, r, 0, 0, 0);
        if (id < 0 || id >= node->ne[1])
            continue;
        for (int64_t i1 = 0; i1 < src->ne[1]; i1++)
            lt_row_to_f32(src, i1, r, 0, buf + i1 * src->ne[0]);
        lt_row_from_f32(node, id, 0, 0, buf);
    }
}

static size_t set_rows_work_size(const struct lt_tensor *node, int nth)
{
    return row_work_size(node->ne[0], nth);
}

static bool set_rows_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *src = node->src[0], *ids = node->src[2];
    if (!check_source_readable(node, 0, reason, reason_size))
        return false;
    if (!ids || ids->type != LT_TYPE_I32) {
        snprintf(reason, reason_size, "source 2 (the ids) is %s, not i32",
                 ids ? lt_type_name(ids->type) : "missing");
        return false;
    }
    if (!set_rows_layout_ok(src, node, ids)) {
        snprintf(reason, reason_size,
                      "the slices are not [a, b, k] into a 2-D f32/f16/bf16 destination [a * b, "
                 "rows] of adjacent elements");
        return false;
    }
    return true;
}

struct lt_tensor *lt_set_rows(struct lt_ctx *ctx, struct lt_tensor *src, struct lt_tensor *dst,
                              struct lt_tensor *ids)
{
    LT_REQUIRE("set_rows", src, dst, ids);
    if (!type_readable(src->type)) {
        lt_fail(LT_ERR_INVALID, "SET_ROWS of '%s': type %s cannot be read", src->name,
                lt_type_name(src->type));
        return NULL;
    }
    if (ids->type != LT_TYPE_I32) {
        lt_fail(LT_ERR_INVALID, "SET_ROWS into '%s' with ids '%s' of type %s (not i32)",
                dst->name, ids->name, lt_type_name(ids->type));
        return NULL;
    }
    if (!set_rows_layout_ok(src, dst, ids))
        return fail_shapes(LT_OP_SET_ROWS, src, dst,
                           "src must be [a, b, k], ids [k] and dst [a * b, rows] of f32, f16 "
                           "or bf16 with adjacent elements");
    /* a view of dst with dst's own strides, made into the write (as lt_cpy does) */
    struct lt_tensor *t = lt_view_2d(ctx, dst, dst->ne[0], dst->ne[1], dst->nb[1], 0);
    if (!t)
        return NULL;
    t->op = LT_OP_SET_ROWS;
    t->src[0] = src;
    t->src[1] = dst;
    t->src[2] = ids;
    lt_format_name(t, "%s (rows of %s)", dst->name, src->name);
    return t;
}

/* ---- the table ---- */

const struct lt_op_def lt_op_def_get_rows = {.name = "GET_ROWS",
                                             .n_src = 2,
                                             .cpu_supported = get_rows_supported,
                                             .cpu_forward = get_rows_forward,
                                             .backward = get_rows_backward};
const struct lt_op_def lt_op_def_set_rows = {.name = "SET_ROWS",
                                             .n_src = 3,
                                             .cpu_supported = set_rows_supported,
                                             .cpu_work_size = set_rows_work_size,
                                             .cpu_forward = set_rows_forward};
const struct lt_op_def lt_op_def_get_rows_back = {.name = "GET_ROWS_BACK",
                                                  .n_src = 3,
                                                  .cpu_supported = get_rows_back_supported,
                                                  .cpu_work_size = get_rows_back_work_size,
                                                  .cpu_forward = get_rows_back_forward,
                                                  .backward = get_rows_back_backward};
