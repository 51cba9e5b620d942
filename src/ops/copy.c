/* copy.c: ops that move values without arithmetic beyond sums: cont, cpy, concat, and the
 * backward helper acc; repeat.c has repeat and repeat_back, gather.c get_rows and
 * get_rows_back (copy_impl.h: what they share).
 *
 * cont keeps its source's type; cpy converts into dst's type and writes through dst's
 * strides. Its result is a view of dst (view_src, view_offs, data as a view's), but its op
 * is CPY with src[0] = a and src[1] = dst, so whoever reads the result runs after the copy.
 * Both copy rows in flattened order: row r of the source (rows counted i1 fastest) goes
 * to row r of the destination, which is what lets cpy write into a reshaped view. Every
 * other op here gives contiguous F32 and reads its sources, of any strides, row by row
 * through lt_row_to_f32.
 *
 * Backward rules (each beside its op, at the end of its section) move the gradient back
 * the way the values came: a slice of it for concat and acc, a sum for repeat (and a tile
 * for repeat_back), a scatter-add for get_rows (and a gather for get_rows_back). CPY sends
 * its gradient to the copied source only: the copy overwrites dst, so dst's old values do
 * not reach the result and get no gradient from it (see cpy_backward for views of a larger
 * tensor). A gradient is always F32, whatever the source's type: through a conversion
 * (cont or cpy to F16, say) it passes unchanged. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/copy_impl.h"
#include "ops/grad.h"
#include "ops/op.h"

/* ---- cont and cpy ---- */

/* Copies a (node->src[0]) into the destination `dst`, row r to row r. Same types copy
 * bytes (exact, also for I32 and quantised rows); others go through float. */
static void copy_rows(const struct lt_compute_params *p, const struct lt_tensor *a,
                      struct lt_tensor *dst)
{
    const struct lt_type_traits *ta = lt_type_traits(a->type), *td = lt_type_traits(dst->type);
    const bool same_type = a->type == dst->type;
    float *buf = (float *)p->wdata + (size_t)p->ith * lt_scratch_floats(a->ne[0]);
    int64_t lo, hi;
    lt_split_range(lt_nrows(a), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t a1, a2, a3, d1, d2, d3;
        row_index(a, r, &a1, &a2, &a3);
        row_index(dst, r, &d1, &d2, &d3);
        if (!same_type) {
            lt_row_to_f32(a, a1, a2, a3, buf);
            lt_row_from_f32(dst, d1, d2, d3, buf);
            continue;
        }
        const char *s = lt_elem_ptr(a, 0, a1, a2, a3);
        char *d = lt_elem_ptr(dst, 0, d1, d2, d3);
        if (ta->is_quantized || (a->nb[0] == ta->type_size && dst->nb[0] == td->type_size)) {
            memcpy(d, s, lt_row_size(a->type, a->ne[0]));
            continue;
        }
        for (int64_t i0 = 0; i0 < a->ne[0]; i0++)
            memcpy(d + i0 * dst->nb[0], s + i0 * a->nb[0], ta->type_size);
    }
}

/* Element by element in flattened order, for rows of different lengths (types that are
 * not block-quantised). */
static void copy_elements(const struct lt_compute_params *p, const struct lt_tensor *a,
                          struct lt_tensor *dst)
{
    const struct lt_type_traits *ta = lt_type_traits(a->type), *td = lt_type_traits(dst->type);
    const bool same_type = a->type == dst->type;
    int64_t lo, hi;
    lt_split_range(lt_nelements(a), p->ith, p->nth, &lo, &hi);
    if (lo >= hi)
        return;
    int64_t ia[LT_MAX_DIMS], id[LT_MAX_DIMS];
    int64_t fa = lo, fd = lo;
    for (int k = 0; k < LT_MAX_DIMS; k++) {
        ia[k] = fa % a->ne[k];
        fa /= a->ne[k];
        id[k] = fd % dst->ne[k];
        fd /= dst->ne[k];
    }
    for (int64_t f = lo; f < hi; f++) {
        const char *s = lt_elem_ptr(a, ia[0], ia[1], ia[2], ia[3]);
        char *d = lt_elem_ptr(dst, id[0], id[1], id[2], id[3]);
        if (same_type) {
            memcpy(d, s, ta->type_size);
        } else {
            float v;
            ta->to_float(s, &v, 1);
            td->from_float(&v, d, 1);
        }
        for (int k = 0; k < LT_MAX_DIMS && ++ia[k] == a->ne[k]; k++)
            ia[k] = 0;
        for (int k = 0; k < LT_MAX_DIMS && ++id[k] == dst->ne[k]; k++)
            id[k] = 0;
    }
}

/* cont: the node is the destination; cpy: the node is a view of dst with dst's strides */
static void cpy_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0];
    if (lt_nelements(a) == 0)
        return;
    if (a->ne[0] == node->ne[0])
        copy_rows(p, a, node);
    else
        copy_elements(p, a, node);
}

static size_t cpy_work_size(const struct lt_tensor *node, int nth)
{
    return row_work_size(node->src[0]->ne[0], nth);
}

/* Can values of type `from` be copied into type `to`, rows of na and nd elements? */
static bool copy_possible(enum lt_type from, enum lt_type to, int64_t na, int64_t nd, char *why,
                          size_t why_size)
{
    const struct lt_type_traits *tf = lt_type_traits(from), *tt = lt_type_traits(to);
    if (!tf || !tt) {
        snprintf(why, why_size, "unknown type");
        return false;
    }
    if (na != nd && (tf->is_quantized || tt->is_quantized)) {
        snprintf(why, why_size, "rows of %lld and %lld elements, and %s is block-quantised",
                 (long long)na, (long long)nd, tf->is_quantized ? tf->name : tt->name);
        return false;
    }
    if (from == to)
        return true;
    if (!tf->to_float) {
        snprintf(why, why_size, "%s cannot be read", tf->name);
        return false;
    }
    if (!tt->from_float) {
        snprintf(why, why_size, "%s cannot be written", tt->name);
        return false;
    }
    return true;
}

static bool cpy_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *a = node->src[0];
    char why[LT_REASON_MAX];
    if (!a) {
        snprintf(reason, reason_size, "source 0 is missing");
        return false;
    }
    if (lt_nelements(a) != lt_nelements(node)) {
        snprintf(reason, reason_size, "source 0 has %lld elements, the result %lld",
                 (long long)lt_nelements(a), (long long)lt_nelements(node));
        return false;
    }
    if (!copy_possible(a->type, node->type, a->ne[0], node->ne[0], why, sizeof(why))) {
        snprintf(reason, reason_size, "copying %s into %s: %s", lt_type_name(a->type),
                 lt_type_name(node->type), why);
        return false;
    }
    if (node->op == LT_OP_CONT && !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is %s", lt_layout_name(node));
        return false;
    }
    return true;
}

struct lt_tensor *lt_cont(struct lt_ctx *ctx, struct lt_tensor *a)
{
    LT_REQUIRE("cont", a);
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_CONT, a->type, LT_MAX_DIMS, a->ne, &a, 1);
    if (t)
        lt_format_name(t, "%s (cont)", a->name);
    return t;
}

struct lt_tensor *lt_cont_as(struct lt_ctx *ctx, struct lt_tensor *a, enum lt_type type)
{
    LT_REQUIRE("cont_as", a);
    if (type != LT_TYPE_F32 && type != LT_TYPE_F16 && type != LT_TYPE_BF16) {
        lt_fail(LT_ERR_INVALID, "cont_as: '%s' into %s: only f32, f16 or bf16", a->name,
                lt_type_name(type));
        return NULL;
    }
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_CONT, type, LT_MAX_DIMS, a->ne, &a, 1);
    if (t)
        lt_format_name(t, "%s (%s)", a->name, lt_type_name(type));
    return t;
}

struct lt_tensor *lt_cpy(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *dst)
{
    LT_REQUIRE("cpy", a, dst);
    char why[LT_REASON_MAX];
    if (lt_nelements(a) != lt_nelements(dst))
        return fail_shapes(LT_OP_CPY, a, dst, "element counts differ");
    if (!copy_possible(a->type, dst->type, a->ne[0], dst->ne[0], why, sizeof(why))) {
        lt_fail(LT_ERR_INVALID, "CPY of '%s' (%s) into '%s' (%s): %s", a->name,
                lt_type_name(a->type), dst->name, lt_type_name(dst->type), why);
        return NULL;
    }
    struct lt_tensor *t = lt_writer_over(ctx, dst, LT_OP_CPY);
    if (!t)
        return NULL;
    t->src[0] = a;
    t->src[1] = dst;
    lt_format_name(t, "%s (copy of %s)", dst->name, a->name);
    return t;
}

/* cont: the values pass unchanged, so does the gradient */
static lt_status cont_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0];
    if (!lt_ad_wants(ad, a))
        return LT_OK;
    /* node's gradient, when it is an accumulator node alone reads, has no reader after this
     * rule: it is handed over (a tied LM head's BF16 copy hands its gradient to the table,
     * with which the embedding's rows then add up in place) */
    if (lt_ad_grad_owned(ad, node))
        return lt_ad_add_owned(ad, a, node->grad);
    return lt_ad_add(ad, a, node->grad);
}

/* cpy: the result holds a's values in dst's shape, element r (flattened, i0 fastest) from
 * element r of a, so a's gradient is the result's (contiguous) gradient reshaped to a.
 *
 * dst gets nothing from this node: its old values are overwritten and never reach the
 * result. When dst is a window of a larger tensor (a KV cache slot, a slice of a state),
 * the elements outside the window are not part of this node's value either; they reach
 * the loss only through other readers of that tensor, whose rules send them their own
 * gradients. The one thing autodiff cannot see is a reader that takes the copied values
 * through another view of dst's storage rather than through this node: it has no graph
 * edge to the copy, so its gradient goes to the storage, not to a. A training graph must
 * therefore read what it copied through the CPY result (as it must anyway, to be ordered
 * after the copy). */
static lt_status cpy_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0], *g = node->grad;
    if (!lt_ad_wants(ad, a))
        return LT_OK;
    if (!lt_same_shape(a, node)) {
        g = lt_ad_contiguous(ad, g);
        if (!g)
            return lt_fail(LT_ERR_NOMEM, "out of memory for the gradient of '%s'", a->name);
        g = lt_reshape_4d(lt_ad_ctx(ad), g, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
    }
    return lt_ad_add(ad, a, g);
}

/* ---- concat ---- */

static void concat_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const int dim = lt_get_param_i32(node, 0);
    /* an F32 result's rows are written in place; a half one's go through the scratch row */
    const bool f32 = node->type == LT_TYPE_F32;
    float *buf = f32 ? NULL : (float *)p->wdata + (size_t)p->ith * lt_scratch_floats(node->ne[0]);
    int64_t lo, hi;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i[LT_MAX_DIMS] = {0};
        row_index(node, r, &i[1], &i[2], &i[3]);
        const int64_t o1 = i[1], o2 = i[2], o3 = i[3];
        float *y = f32 ? (float *)node->data + r * node->ne[0] : buf;
        if (dim == 0) {
            lt_row_to_f32(a, i[1], i[2], i[3], y);
            lt_row_to_f32(b, i[1], i[2], i[3], y + a->ne[0]);
        } else if (i[dim] < a->ne[dim]) {
            lt_row_to_f32(a, i[1], i[2], i[3], y);
        } else {
            i[dim] -= a->ne[dim];
            lt_row_to_f32(b, i[1], i[2], i[3], y);
        }
        if (!f32)
            lt_row_from_f32(node, o1, o2, o3, buf);
    }
}

static size_t concat_work_size(const struct lt_tensor *node, int nth)
{
    return node->type == LT_TYPE_F32 ? 0 : row_work_size(node->ne[0], nth);
}

static bool concat_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    int dim = lt_get_param_i32(node, 0);
    if (!check_source_readable(node, 0, reason, reason_size) ||
        !check_source_readable(node, 1, reason, reason_size))
        return false;
    if (!lt_is_contiguous(node) ||
        (node->type != LT_TYPE_F32 && node->type != LT_TYPE_F16 && node->type != LT_TYPE_BF16)) {
        snprintf(reason, reason_size, "the result is %s %s, not contiguous f32, f16 or bf16",
                 lt_type_name(node->type), lt_layout_name(node));
        return false;
    }
    if (dim < 0 || dim >= LT_MAX_DIMS) {
        snprintf(reason, reason_size, "concat along dimension %d", dim);
        return false;
    }
    for (int k = 0; k < LT_MAX_DIMS; k++) {
        int64_t want = node->src[0]->ne[k] + (k == dim ? node->src[1]->ne[k] : 0);
        if (node->ne[k] != want) {
            snprintf(reason, reason_size, "the result's shape does not match its sources");
            return false;
        }
    }
    return true;
}

struct lt_tensor *lt_concat_as(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                               int dim, enum lt_type type)
{
    LT_REQUIRE("concat", a, b);
    if (dim < 0 || dim >= LT_MAX_DIMS) {
        lt_fail(LT_ERR_INVALID, "CONCAT of '%s' and '%s' along dimension %d (0 to %d)", a->name,
                b->name, dim, LT_MAX_DIMS - 1);
        return NULL;
    }
    if (!type_readable(a->type) || !type_readable(b->type)) {
        lt_fail(LT_ERR_INVALID, "CONCAT of '%s' (%s) and '%s' (%s): a type cannot be read", a->name,
                lt_type_name(a->type), b->name, lt_type_name(b->type));
        return NULL;
    }
    if (type != LT_TYPE_F32 && type != LT_TYPE_F16 && type != LT_TYPE_BF16) {
        lt_fail(LT_ERR_INVALID, "CONCAT of '%s' and '%s' into %s: only f32, f16 or bf16", a->name,
                b->name, lt_type_name(type));
        return NULL;
    }
    int64_t ne[LT_MAX_DIMS];
    for (int k = 0; k < LT_MAX_DIMS; k++) {
        if (k != dim && a->ne[k] != b->ne[k])
            return fail_shapes(LT_OP_CONCAT, a, b, "shapes differ outside the concat dimension");
        ne[k] = a->ne[k] + (k == dim ? b->ne[k] : 0);
    }
    struct lt_tensor *t =
        lt_new_op_tensor(ctx, LT_OP_CONCAT, type, LT_MAX_DIMS, ne, (struct lt_tensor *[]){a, b}, 2);
    if (t)
        lt_set_param_i32(t, 0, dim);
    return t;
}

struct lt_tensor *lt_concat(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b, int dim)
{
    return lt_concat_as(ctx, a, b, dim, LT_TYPE_F32);
}

/* concat: each source's gradient is its window of the result's gradient (a view, which
 * lt_ad_add copies to a contiguous tensor) */
static lt_status concat_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *g = node->grad;
    const int dim = lt_get_param_i32(node, 0);
    size_t offset = 0;
    for (int i = 0; i < 2; i++) {
        struct lt_tensor *s = node->src[i];
        if (lt_ad_wants(ad, s)) {
            lt_status st = lt_ad_add(ad, s,
                                     lt_view_4d(lt_ad_ctx(ad), g, s->ne[0], s->ne[1], s->ne[2],
                                                s->ne[3], g->nb[1], g->nb[2], g->nb[3], offset));
            if (st != LT_OK)
                return st;
        }
        offset = (size_t)s->ne[dim] * g->nb[dim];
    }
    return LT_OK;
}

/* ---- acc: a copy of a with b added into a window ---- */

/* Do the windows of b's rows lie apart (each stride spans the dimension inside it)? */
static bool acc_rows_disjoint(const struct lt_tensor *b, size_t nb1, size_t nb2, size_t nb3)
{
    return (b->ne[1] == 1 || nb1 >= (size_t)b->ne[0] * sizeof(float)) &&
           (b->ne[2] == 1 || nb2 >= nb1 * (size_t)b->ne[1]) &&
           (b->ne[3] == 1 || nb3 >= nb2 * (size_t)b->ne[2]);
}

/* op_params: nb1, nb2, nb3 and offset of the window, in bytes of the (contiguous F32)
 * result, two slots each. Threads copy a's rows, wait, then add b's rows, split between
 * them when the rows' windows lie apart and all on thread 0 when they may overlap (then
 * overlapping elements receive the sum of every row that covers them). */
static void acc_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const size_t nb1 = get_param_size(node, 0), nb2 = get_param_size(node, 2),
                 nb3 = get_param_size(node, 4), offset = get_param_size(node, 6);
    int64_t lo, hi;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi && a->data != node->data; r++) { /* in place: a is there */
        int64_t i1, i2, i3;
        row_index(node, r, &i1, &i2, &i3);
        lt_row_to_f32(a, i1, i2, i3, (float *)node->data + r * node->ne[0]);
    }
    lt_compute_barrier(p);
    float *buf = (float *)p->wdata + (size_t)p->ith * lt_scratch_floats(b->ne[0]);
    if (acc_rows_disjoint(b, nb1, nb2, nb3))
        lt_split_range(lt_nrows(b), p->ith, p->nth, &lo, &hi);
    else
        lt_split_range(lt_nrows(b), p->ith, 1, &lo, &hi); /* thread 0 takes every row */
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1, i2, i3;
        row_index(b, r, &i1, &i2, &i3);
        lt_row_to_f32(b, i1, i2, i3, buf);
        float *y = (float *)((char *)node->data + offset + (size_t)i1 * nb1 + (size_t)i2 * nb2 +
                             (size_t)i3 * nb3);
        for (int64_t i = 0; i < b->ne[0]; i++)
            y[i] += buf[i];
    }
}

static size_t acc_work_size(const struct lt_tensor *node, int nth)
{
    return row_work_size(node->src[1]->ne[0], nth);
}

/* The window's last byte, or false when a stride or the offset is not whole floats. */
static bool acc_window_end(const struct lt_tensor *b, size_t nb1, size_t nb2, size_t nb3,
                           size_t offset, size_t *end)
{
    if (nb1 % sizeof(float) || nb2 % sizeof(float) || nb3 % sizeof(float) || offset % sizeof(float))
        return false;
    *end = offset + (size_t)b->ne[0] * sizeof(float) + (size_t)(b->ne[1] - 1) * nb1 +
           (size_t)(b->ne[2] - 1) * nb2 + (size_t)(b->ne[3] - 1) * nb3;
    return true;
}

static bool acc_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *b = node->src[1];
    size_t end;
    if (!check_source_readable(node, 0, reason, reason_size) ||
        !check_source_readable(node, 1, reason, reason_size) ||
        !check_result_f32(node, reason, reason_size))
        return false;
    if (!lt_same_shape(node, node->src[0])) {
        snprintf(reason, reason_size, "source 0 differs in shape from the result");
        return false;
    }
    if (lt_nelements(b) > 0 &&
        (!acc_window_end(b, get_param_size(node, 0), get_param_size(node, 2),
                         get_param_size(node, 4), get_param_size(node, 6), &end) ||
         end > (size_t)lt_nelements(node) * sizeof(float))) {
        snprintf(reason, reason_size, "the window of source 1 is not inside the result");
        return false;
    }
    return true;
}

struct lt_tensor *lt_acc(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b, size_t nb1,
                         size_t nb2, size_t nb3, size_t offset)
{
    LT_REQUIRE("acc", a, b);
    size_t end;
    if (!lt_type_is_float(a->type) || !lt_type_is_float(b->type)) {
        lt_fail(LT_ERR_INVALID, "ACC of '%s' (%s) and '%s' (%s): types must be f32, f16 or bf16",
                a->name, lt_type_name(a->type), b->name, lt_type_name(b->type));
        return NULL;
    }
    if (lt_nelements(b) > 0) {
        if (!acc_window_end(b, nb1, nb2, nb3, offset, &end)) {
            lt_fail(LT_ERR_INVALID,
                    "ACC of '%s' into '%s': strides %zu %zu %zu and offset %zu are not whole "
                    "floats",
                    b->name, a->name, nb1, nb2, nb3, offset);
            return NULL;
        }
        if (end > (size_t)lt_nelements(a) * sizeof(float)) {
            lt_fail(LT_ERR_INVALID,
                    "ACC of '%s' into '%s': the window (strides %zu %zu %zu, offset %zu) ends at "
                    "byte %zu, past the %zu bytes of the result",
                    b->name, a->name, nb1, nb2, nb3, offset, end,
                    (size_t)lt_nelements(a) * sizeof(float));
            return NULL;
        }
    }
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_ACC, LT_TYPE_F32, LT_MAX_DIMS, a->ne,
                                           (struct lt_tensor *[]){a, b}, 2);
    if (!t)
        return NULL;
    set_param_size(t, 0, nb1);
    set_param_size(t, 2, nb2);
    set_param_size(t, 4, nb3);
    set_param_size(t, 6, offset);
    return t;
}

bool lt_acc_window(const struct lt_tensor *node, size_t nb[3], size_t *offset)
{
    if (!node || node->op != LT_OP_ACC)
        return false;
    nb[0] = get_param_size(node, 0);
    nb[1] = get_param_size(node, 2);
    nb[2] = get_param_size(node, 4);
    *offset = get_param_size(node, 6);
    return true;
}

struct lt_tensor *lt_acc_inplace(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                                 size_t nb1, size_t nb2, size_t nb3, size_t offset)
{
    LT_REQUIRE("acc_inplace", a, b);
    if (a && (a->type != LT_TYPE_F32 || !lt_is_contiguous(a))) {
        lt_fail(LT_ERR_INVALID, "ACC in place into '%s' (%s, %s): it takes contiguous f32",
                a->name, lt_type_name(a->type), lt_layout_name(a));
        return NULL;
    }
    struct lt_tensor *checked = lt_acc(ctx, a, b, nb1, nb2, nb3, offset); /* the checks */
    if (!checked)
        return NULL;
    struct lt_tensor *t = lt_writer_over(ctx, a, LT_OP_ACC);
    if (!t)
        return NULL;
    t->src[0] = a;
    t->src[1] = b;
    memcpy(t->op_params, checked->op_params, sizeof(t->op_params));
    return t;
}

/* acc: a passes whole, so its gradient is the result's; b's is the window of the
 * result's gradient it was added into, read through the same strides (the gradient is
 * contiguous F32 of the result's shape, as the result is), then made contiguous. Where
 * windows of b's rows overlap, each element of b still gets the gradient of the one
 * result element it was added to. */
static lt_status acc_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0], *b = node->src[1], *g = node->grad;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    lt_status st = LT_OK;
    if (lt_ad_wants(ad, a))
        st = lt_ad_add(ad, a, g);
    if (st == LT_OK && lt_ad_wants(ad, b)) {
        struct lt_tensor *w =
            lt_view_4d(ctx, g, b->ne[0], b->ne[1], b->ne[2], b->ne[3], get_param_size(node, 0),
                       get_param_size(node, 2), get_param_size(node, 4), get_param_size(node, 6));
        st = lt_ad_add(ad, b, lt_ad_contiguous(ad, w));
    }
    return st;
}

/* ---- the table ---- */

const struct lt_op_def lt_op_def_cont = {.name = "CONT",
                                         .n_src = 1,
                                         .cpu_supported = cpy_supported,
                                         .cpu_work_size = cpy_work_size,
                                         .cpu_forward = cpy_forward,
                                         .backward = cont_backward};
const struct lt_op_def lt_op_def_cpy = {.name = "CPY",
                                        .n_src = 2,
                                        .cpu_supported = cpy_supported,
                                        .cpu_work_size = cpy_work_size,
                                        .cpu_forward = cpy_forward,
                                        .backward = cpy_backward};
const struct lt_op_def lt_op_def_concat = {.name = "CONCAT",
                                           .n_src = 2,
                                           .cpu_supported = concat_supported,
                                           .cpu_work_size = concat_work_size,
                                           .cpu_forward = concat_forward,
                                           .backward = concat_backward};
const struct lt_op_def lt_op_def_acc = {.name = "ACC",
                                        .n_src = 2,
                                        .cpu_supported = acc_supported,
                                        .cpu_work_size = acc_work_size,
                                        .cpu_forward = acc_forward,
                                        .backward = acc_backward};
