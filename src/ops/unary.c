/* unary.c: element-wise unary ops (scale, silu, sigmoid, softplus, exp, log, sqr, sqrt,
 * sin, cos, abs, neg, relu), swiglu, and silu's backward (SILU_BACK).
 *
 * Sources may have any strides (transposed, permuted, sliced, broadcast with nb = 0) and
 * be F32, F16 or BF16: a kernel reads each source row as ne0 floats, in place when it is
 * F32 with unit stride, otherwise converted into its thread's scratch. Results are
 * contiguous F32 of the first source's shape (swiglu's and scale's may be F16 or BF16,
 * lt_swiglu_as and lt_scale_as: computed in F32, rounded once to nearest even); threads
 * split the rows.
 *
 * Backward rules build each derivative from these same ops. They prefer the result y
 * (always contiguous) to the source x where the derivative can be written in y (exp,
 * sigmoid, sqrt, relu); where they must read x they read a contiguous copy when x is a
 * view (lt_ad_contiguous), so no backward kernel is handed a strided source. There is no
 * step or sign op: sign(x) is written with saturating sigmoids (see sign_of). */
#include <assert.h>
#include <math.h>
#include <stdio.h>

#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

/* ---- shared by the kernels of this file ---- */

/* Each source gets ne0 floats of scratch per thread. */
static size_t rows_work_size(const struct lt_tensor *node, int nth)
{
    int n_rows = (node->src[1] ? 2 : 1) + (node->type == LT_TYPE_F32 ? 0 : 1);
    return (size_t)nth * lt_scratch_floats(node->src[0]->ne[0]) * (size_t)n_rows * sizeof(float);
}

static bool check_source_float(const struct lt_tensor *node, int i, char *reason,
                               size_t reason_size)
{
    const struct lt_tensor *s = node->src[i];
    if (!s || !lt_type_is_float(s->type)) {
        snprintf(reason, reason_size, "source %d is %s, not f32, f16 or bf16", i,
                 s ? lt_type_name(s->type) : "missing");
        return false;
    }
    return true;
}

static bool check_result_f32(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is %s %s, not contiguous f32",
                 lt_type_name(node->type), lt_layout_name(node));
        return false;
    }
    return true;
}

/* ---- element-wise unary ---- */

static void unary_apply(enum lt_op op, float s, const float *x, float *y, int64_t n)
{
    switch (op) {
    case LT_OP_SCALE:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * s;
        break;
    case LT_OP_SILU:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] / (1.0f + expf(-x[i]));
        break;
    case LT_OP_SIGMOID:
        for (int64_t i = 0; i < n; i++)
            y[i] = 1.0f / (1.0f + expf(-x[i]));
        break;
    case LT_OP_SOFTPLUS:
        /* torch.nn.Softplus (beta 1, threshold 20): linear above the threshold */
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] > 20.0f ? x[i] : log1pf(expf(x[i]));
        break;
    case LT_OP_EXP:
        for (int64_t i = 0; i < n; i++)
            y[i] = expf(x[i]);
        break;
    case LT_OP_LOG:
        for (int64_t i = 0; i < n; i++)
            y[i] = logf(x[i]);
        break;
    case LT_OP_SQR:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * x[i];
        break;
    case LT_OP_SQRT:
        for (int64_t i = 0; i < n; i++)
            y[i] = sqrtf(x[i]);
        break;
    case LT_OP_SIN:
        for (int64_t i = 0; i < n; i++)
            y[i] = sinf(x[i]);
        break;
    case LT_OP_COS:
        for (int64_t i = 0; i < n; i++)
            y[i] = cosf(x[i]);
        break;
    case LT_OP_ABS:
        for (int64_t i = 0; i < n; i++)
            y[i] = fabsf(x[i]);
        break;
    case LT_OP_NEG:
        for (int64_t i = 0; i < n; i++)
            y[i] = -x[i];
        break;
    case LT_OP_RELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
    default: assert(!"unary_apply: not a unary op");
    }
}

static void unary_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0];
    const int64_t ne0 = node->ne[0], ne1 = node->ne[1], ne2 = node->ne[2];
    float s = node->op == LT_OP_SCALE ? lt_get_param_f32(node, 0) : 0.0f;
    const bool f32 = node->type == LT_TYPE_F32; /* else a half SCALE: through a scratch row */
    /* a thread's scratch: x's row, and a half result's row after it (rows_work_size) */
    float *buf = (float *)p->wdata + (size_t)p->ith * (f32 ? 1 : 2) * lt_scratch_floats(a->ne[0]);
    int64_t lo, hi;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float *x = lt_row_f32(a, i1, i2, i3, buf);
        float *y = f32 ? (float *)node->data + r * ne0 : buf + lt_scratch_floats(a->ne[0]);
        unary_apply(node->op, s, x, y, ne0);
        if (!f32)
            lt_row_from_f32(node, i1, i2, i3, y);
    }
}

/* a result of lt_scale_as: contiguous F16 or BF16 (the only unary op with a half result) */
static bool half_scale(const struct lt_tensor *node)
{
    return node->op == LT_OP_SCALE && (node->type == LT_TYPE_F16 || node->type == LT_TYPE_BF16) &&
           lt_is_contiguous(node);
}

static bool unary_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (!check_source_float(node, 0, reason, reason_size) ||
        (!half_scale(node) && !check_result_f32(node, reason, reason_size)))
        return false;
    if (!lt_same_shape(node, node->src[0])) {
        snprintf(reason, reason_size, "source 0 differs in shape from the result");
        return false;
    }
    return true;
}

static struct lt_tensor *unary_new_as(struct lt_ctx *ctx, enum lt_op op, struct lt_tensor *a,
                                      enum lt_type type)
{
    LT_REQUIRE(lt_op_name(op), a);
    if (!lt_type_is_float(a->type)) {
        lt_fail(LT_ERR_INVALID, "%s of '%s': its type %s is not f32, f16 or bf16", lt_op_name(op),
                a->name, lt_type_name(a->type));
        return NULL;
    }
    return lt_new_op_tensor(ctx, op, type, LT_MAX_DIMS, a->ne, &a, 1);
}

static struct lt_tensor *unary_new(struct lt_ctx *ctx, enum lt_op op, struct lt_tensor *a)
{
    return unary_new_as(ctx, op, a, LT_TYPE_F32);
}

struct lt_tensor *lt_scale(struct lt_ctx *ctx, struct lt_tensor *a, float s)
{
    return lt_scale_as(ctx, a, s, LT_TYPE_F32);
}

struct lt_tensor *lt_scale_as(struct lt_ctx *ctx, struct lt_tensor *a, float s, enum lt_type type)
{
    LT_REQUIRE("scale", a);
    if (type != LT_TYPE_F32 && type != LT_TYPE_F16 && type != LT_TYPE_BF16) {
        lt_fail(LT_ERR_INVALID, "scale of '%s' into %s: the result must be f32, f16 or bf16",
                a->name, lt_type_name(type));
        return NULL;
    }
    struct lt_tensor *t = unary_new_as(ctx, LT_OP_SCALE, a, type);
    if (t)
        lt_set_param_f32(t, 0, s);
    return t;
}

struct lt_tensor *lt_silu(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_SILU, a);
}

struct lt_tensor *lt_sigmoid(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_SIGMOID, a);
}

struct lt_tensor *lt_softplus(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_SOFTPLUS, a);
}

struct lt_tensor *lt_exp(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_EXP, a);
}

struct lt_tensor *lt_log(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_LOG, a);
}

struct lt_tensor *lt_sqr(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_SQR, a);
}

struct lt_tensor *lt_sqrt(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_SQRT, a);
}

struct lt_tensor *lt_sin(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_SIN, a);
}

struct lt_tensor *lt_cos(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_COS, a);
}

struct lt_tensor *lt_abs(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_ABS, a);
}

struct lt_tensor *lt_neg(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_NEG, a);
}

struct lt_tensor *lt_relu(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return unary_new(ctx, LT_OP_RELU, a);
}

/* ---- two same-shape sources: swiglu and silu's backward ---- */

static void pair_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const int64_t ne0 = node->ne[0], ne1 = node->ne[1], ne2 = node->ne[2];
    const bool f32 = node->type == LT_TYPE_F32;
    float *buf = (float *)p->wdata + (size_t)p->ith * (f32 ? 2 : 3) * lt_scratch_floats(ne0);
    int64_t lo, hi;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float *x = lt_row_f32(a, i1, i2, i3, buf);
        const float *u = lt_row_f32(b, i1, i2, i3, buf + lt_scratch_floats(ne0));
        float *y = f32 ? (float *)node->data + r * ne0 : buf + 2 * lt_scratch_floats(ne0);
        if (node->op == LT_OP_SWIGLU && lt_glu_of(node) == LT_GLU_SIGMOID) {
            /* x: gate, u: up; SIGMOID's value, then MUL's product */
            for (int64_t i = 0; i < ne0; i++)
                y[i] = u[i] * (1.0f / (1.0f + expf(-x[i])));
        } else if (node->op == LT_OP_SWIGLU) {
            for (int64_t i = 0; i < ne0; i++)
                y[i] = x[i] / (1.0f + expf(-x[i])) * u[i];
        } else {
            /* SILU_BACK: x: the incoming gradient, u: silu's input.
             * d/du [u s(u)] = s(u) (1 + u (1 - s(u))) */
            for (int64_t i = 0; i < ne0; i++) {
                float s = 1.0f / (1.0f + expf(-u[i]));
                y[i] = x[i] * s * (1.0f + u[i] * (1.0f - s));
            }
        }
        if (!f32)
            lt_row_from_f32(node, i1, i2, i3, y);
    }
}

static bool pair_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (!check_source_float(node, 0, reason, reason_size) ||
        !check_source_float(node, 1, reason, reason_size))
        return false;
    if (node->op == LT_OP_SWIGLU && !lt_glu_fits(node)) {
        snprintf(reason, reason_size, "op_params[0] %d is no gate activation",
                 (int)lt_get_param_i32(node, 0));
        return false;
    }
    if (node->op == LT_OP_SWIGLU && lt_type_is_float(node->type) && node->type != LT_TYPE_F32) {
        if (!lt_is_contiguous(node)) {
            snprintf(reason, reason_size, "the result is %s %s, not contiguous",
                     lt_type_name(node->type), lt_layout_name(node));
            return false;
        }
    } else if (!check_result_f32(node, reason, reason_size)) {
        return false;
    }
    if (!lt_same_shape(node, node->src[0]) || !lt_same_shape(node, node->src[1])) {
        snprintf(reason, reason_size, "the sources differ in shape from the result");
        return false;
    }
    return true;
}

static struct lt_tensor *pair_new(struct lt_ctx *ctx, enum lt_op op, struct lt_tensor *a,
                                  struct lt_tensor *b, enum lt_type type)
{
    LT_REQUIRE(lt_op_name(op), a, b);
    if (!lt_type_is_float(a->type) || !lt_type_is_float(b->type)) {
        lt_fail(LT_ERR_INVALID, "%s of '%s' (%s) and '%s' (%s): types must be f32, f16 or bf16",
                lt_op_name(op), a->name, lt_type_name(a->type), b->name, lt_type_name(b->type));
        return NULL;
    }
    if (!lt_same_shape(a, b)) {
        lt_fail(LT_ERR_INVALID,
                "%s of '%s' [%lld %lld %lld %lld] and '%s' [%lld %lld %lld %lld]: shapes differ",
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

struct lt_tensor *lt_swiglu(struct lt_ctx *ctx, struct lt_tensor *gate, struct lt_tensor *up)
{
    return pair_new(ctx, LT_OP_SWIGLU, gate, up, LT_TYPE_F32);
}

struct lt_tensor *lt_swiglu_as(struct lt_ctx *ctx, struct lt_tensor *gate, struct lt_tensor *up,
                               enum lt_type type)
{
    return pair_new(ctx, LT_OP_SWIGLU, gate, up, type);
}

struct lt_tensor *lt_glu_as(struct lt_ctx *ctx, struct lt_tensor *gate, struct lt_tensor *up,
                            enum lt_glu act, enum lt_type type)
{
    if (act != LT_GLU_SILU && act != LT_GLU_SIGMOID) {
        lt_fail(LT_ERR_INVALID, "glu of '%s': %d is no gate activation", gate ? gate->name : "?",
                (int)act);
        return NULL;
    }
    struct lt_tensor *r = pair_new(ctx, LT_OP_SWIGLU, gate, up, type);
    if (r)
        lt_set_param_i32(r, 0, (int32_t)act);
    return r;
}

enum lt_glu lt_glu_of(const struct lt_tensor *node)
{
    return (enum lt_glu)lt_get_param_i32(node, 0);
}

bool lt_glu_fits(const struct lt_tensor *node)
{
    const int32_t act = lt_get_param_i32(node, 0);
    return (node->op == LT_OP_SWIGLU || node->op == LT_OP_SWIGLU_BACK) &&
           (act == LT_GLU_SILU || act == LT_GLU_SIGMOID);
}

struct lt_tensor *lt_silu_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *x)
{
    return pair_new(ctx, LT_OP_SILU_BACK, grad, x, LT_TYPE_F32);
}

/* ---- swiglu's backward: both gradients in one pass ---- */

struct lt_tensor *lt_swiglu_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *gate,
                                 struct lt_tensor *up)
{
    return lt_swiglu_back_as(ctx, grad, gate, up, LT_TYPE_F32);
}

struct lt_tensor *lt_swiglu_back_as(struct lt_ctx *ctx, struct lt_tensor *grad,
                                    struct lt_tensor *gate, struct lt_tensor *up, enum lt_type type)
{
    return lt_glu_back_as(ctx, grad, gate, up, LT_GLU_SILU, type);
}

struct lt_tensor *lt_glu_back_as(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *gate,
                                 struct lt_tensor *up, enum lt_glu act, enum lt_type type)
{
    LT_REQUIRE("swiglu_back", grad, gate, up);
    if (act != LT_GLU_SILU && act != LT_GLU_SIGMOID) {
        lt_fail(LT_ERR_INVALID, "swiglu_back of '%s': %d is no gate activation", gate->name,
                (int)act);
        return NULL;
    }
    if (!lt_type_is_float(type)) {
        lt_fail(LT_ERR_INVALID, "swiglu_back of '%s' into %s: the result must be f32, f16 or bf16",
                gate->name, lt_type_name(type));
        return NULL;
    }
    const struct lt_tensor *src[3] = {grad, gate, up};
    for (int i = 0; i < 3; i++)
        if (!lt_type_is_float(src[i]->type) || !lt_same_shape(src[i], gate)) {
            lt_fail(LT_ERR_INVALID,
                    "swiglu_back: '%s' (%s [%lld %lld %lld %lld]) is not a float tensor of the "
                    "gate '%s''s shape",
                    src[i]->name, lt_type_name(src[i]->type), (long long)src[i]->ne[0],
                    (long long)src[i]->ne[1], (long long)src[i]->ne[2], (long long)src[i]->ne[3],
                    gate->name);
            return NULL;
        }
    int64_t ne[4] = {gate->ne[0], gate->ne[1], gate->ne[2], 2 * gate->ne[3]};
    struct lt_tensor *r = lt_new_op_tensor(ctx, LT_OP_SWIGLU_BACK, type, 4, ne,
                                           (struct lt_tensor *[]){grad, gate, up}, 3);
    if (r) {
        lt_set_param_i32(r, 0, (int32_t)act);
        lt_format_name(r, "swiglu_back(%s)", gate->name);
    }
    return r;
}

/* half `which` (0: d gate, 1: d up) of a SWIGLU_BACK result, shaped like gate */
static struct lt_tensor *swiglu_back_half(struct lt_ctx *ctx, struct lt_tensor *r, int which)
{
    LT_REQUIRE("swiglu_back_part", r);
    if (r->op != LT_OP_SWIGLU_BACK) {
        lt_fail(LT_ERR_INVALID, "swiglu_back_part: '%s' is %s, not SWIGLU_BACK", r->name,
                lt_op_name(r->op));
        return NULL;
    }
    const int64_t ne3 = r->ne[3] / 2;
    struct lt_tensor *t = lt_view_4d(ctx, r, r->ne[0], r->ne[1], r->ne[2], ne3, r->nb[1], r->nb[2],
                                     r->nb[3], (size_t)which * (size_t)ne3 * r->nb[3]);
    if (t)
        lt_format_name(t, "d %s", r->src[1 + which]->name);
    return t;
}

struct lt_tensor *lt_swiglu_back_gate(struct lt_ctx *ctx, struct lt_tensor *r)
{
    return swiglu_back_half(ctx, r, 0);
}

struct lt_tensor *lt_swiglu_back_up(struct lt_ctx *ctx, struct lt_tensor *r)
{
    return swiglu_back_half(ctx, r, 1);
}

/* d gate = g up s (1 + x (1 - s)) and d up = g silu(x), s = sigmoid(x), x the gate: the
 * values of the four-node form (silu_back(g * up, gate) and g * silu(gate)), in one pass */
static void swiglu_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *g = node->src[0], *gate = node->src[1], *up = node->src[2];
    const int64_t ne0 = gate->ne[0], ne1 = gate->ne[1], ne2 = gate->ne[2], ne3 = gate->ne[3];
    const int64_t rows = lt_nrows(gate), sf = (int64_t)lt_scratch_floats(ne0);
    const bool f32 = node->type == LT_TYPE_F32, sigmoid = lt_glu_of(node) == LT_GLU_SIGMOID;
    float *buf = (float *)p->wdata + (size_t)p->ith * 5 * (size_t)sf;
    int64_t lo, hi;
    lt_split_range(rows, p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float *gr = lt_row_f32(g, i1, i2, i3, buf);
        const float *x = lt_row_f32(gate, i1, i2, i3, buf + sf);
        const float *u = lt_row_f32(up, i1, i2, i3, buf + 2 * sf);
        float *dg = f32 ? (float *)node->data + r * ne0 : buf + 3 * sf;
        float *du = f32 ? (float *)node->data + (rows + r) * ne0 : buf + 4 * sf;
        if (sigmoid) {
            for (int64_t i = 0; i < ne0; i++) {
                const float s = 1.0f / (1.0f + expf(-x[i]));
                dg[i] = gr[i] * u[i] * s * (1.0f - s);
                du[i] = gr[i] * s;
            }
        } else {
            for (int64_t i = 0; i < ne0; i++) {
                const float d = 1.0f + expf(-x[i]), gu = gr[i] * u[i], s = 1.0f / d;
                dg[i] = gu * s * (1.0f + x[i] * (1.0f - s));
                du[i] = gr[i] * (x[i] / d);
            }
        }
        if (!f32) { /* d up's rows follow d gate's: dim 3 offset by gate's ne3 */
            lt_row_from_f32(node, i1, i2, i3, dg);
            lt_row_from_f32(node, i1, i2, i3 + ne3, du);
        }
    }
}

static bool swiglu_back_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    for (int i = 0; i < 3; i++)
        if (!check_source_float(node, i, reason, reason_size))
            return false;
    if (!lt_type_is_float(node->type) || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is %s %s, not contiguous f32, f16 or bf16",
                 lt_type_name(node->type), lt_layout_name(node));
        return false;
    }
    if (!lt_swiglu_back_fits(node)) {
        snprintf(reason, reason_size, "the sources' and result's shapes do not fit");
        return false;
    }
    return true;
}

bool lt_swiglu_back_fits(const struct lt_tensor *node)
{
    const struct lt_tensor *x = node->src[1];
    return node->op == LT_OP_SWIGLU_BACK && lt_glu_fits(node) && node->src[0] && x &&
           node->src[2] && lt_same_shape(x, node->src[0]) && lt_same_shape(x, node->src[2]) &&
           node->ne[0] == x->ne[0] && node->ne[1] == x->ne[1] && node->ne[2] == x->ne[2] &&
           node->ne[3] == 2 * x->ne[3];
}

static size_t swiglu_back_work_size(const struct lt_tensor *node, int nth)
{
    return (size_t)nth * 5 * lt_scratch_floats(node->src[1]->ne[0]) * sizeof(float);
}

/* ---- backward rules ---- */

/* sigmoid(S x) is exactly 1 for x > 17 / S and exactly 0 for x < -17 / S (1 + e^-17
 * rounds to 1 in float; e^+inf gives 1 / inf = 0, never NaN), so with S = 1e38
 *   sign(x) = sigmoid(S x) - sigmoid(-S x)
 * is exactly -1, 0 or +1 for every float except the |x| < 2e-37 around 0, where it ramps
 * through 0 smoothly; sign(0) = 0, as torch's sgn. S x saturates to +-inf past |x| > 3.4,
 * which the sigmoid takes. */
#define SIGN_SLOPE 1e38f
static struct lt_tensor *sign_of(struct lt_ctx *ctx, struct lt_tensor *x)
{
    return lt_sub(ctx, lt_sigmoid(ctx, lt_scale(ctx, x, SIGN_SLOPE)),
                  lt_sigmoid(ctx, lt_scale(ctx, x, -SIGN_SLOPE)));
}

/* dx = g * f'(x), for g = node->grad and y = node = f(x) */
static lt_status unary_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *x = node->src[0], *g = node->grad, *y = node, *dx = NULL;
    if (!lt_ad_wants(ad, x))
        return LT_OK;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    switch (node->op) {
    case LT_OP_SCALE: dx = lt_scale(ctx, g, lt_get_param_f32(node, 0)); break;
    case LT_OP_SILU: dx = lt_silu_back(ctx, g, lt_ad_contiguous(ad, x)); break;
    /* y' = y (1 - y) */
    case LT_OP_SIGMOID:
        dx = lt_mul(ctx, g, lt_mul(ctx, y, lt_sub(ctx, lt_fill(ctx, y, 1.0f), y)));
        break;
    /* sigmoid(x); above the threshold 20 the forward is x, and sigmoid(x > 20) is 1 in
     * float, so the one formula holds on both sides */
    case LT_OP_SOFTPLUS: dx = lt_mul(ctx, g, lt_sigmoid(ctx, lt_ad_contiguous(ad, x))); break;
    case LT_OP_EXP: dx = lt_mul(ctx, g, y); break;
    case LT_OP_LOG: dx = lt_div(ctx, g, lt_ad_contiguous(ad, x)); break;
    case LT_OP_SQR: dx = lt_scale(ctx, lt_mul(ctx, g, lt_ad_contiguous(ad, x)), 2.0f); break;
    /* 1 / (2 sqrt(x)) = 0.5 / y */
    case LT_OP_SQRT: dx = lt_scale(ctx, lt_div(ctx, g, y), 0.5f); break;
    case LT_OP_SIN: dx = lt_mul(ctx, g, lt_cos(ctx, lt_ad_contiguous(ad, x))); break;
    case LT_OP_COS: dx = lt_neg(ctx, lt_mul(ctx, g, lt_sin(ctx, lt_ad_contiguous(ad, x)))); break;
    case LT_OP_ABS: dx = lt_mul(ctx, g, sign_of(ctx, lt_ad_contiguous(ad, x))); break;
    case LT_OP_NEG: dx = lt_neg(ctx, g); break;
    /* step(x) = sign(y) as y = relu(x) >= 0; 0 at x = 0, as torch */
    case LT_OP_RELU: dx = lt_mul(ctx, g, sign_of(ctx, y)); break;
    default:
        return lt_fail(LT_ERR_INVALID, "no unary backward rule for %s '%s'", lt_op_name(node->op),
                       node->name);
    }
    return lt_ad_add(ad, x, dx);
}

/* y = silu(gate) * up: d gate = silu'(gate) * (g * up), d up = g * silu(gate), both from
 * one SWIGLU_BACK node (one pass over g, gate and up instead of four nodes' seven); with
 * the sigmoid, s = sigmoid(gate): d gate = g up s (1 - s), d up = g s (where a SIGMOID and
 * a MUL took five nodes). gate and up are read as they lie (the gated attention's gate is
 * a strided view of the query projection). When
 * gate and up are half-precision products that only this node reads (a device's training
 * step), the node writes both gradients in that type: their products would round them to
 * it anyway, each with a pass of its own (CONT). */
static lt_status swiglu_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *gate = node->src[0], *up = node->src[1];
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    if (!lt_ad_wants(ad, gate) && !lt_ad_wants(ad, up))
        return LT_OK;
    const enum lt_type tg = lt_ad_grad_type(ad, gate, node), tu = lt_ad_grad_type(ad, up, node);
    struct lt_tensor *r = lt_glu_back_as(ctx, lt_ad_contiguous(ad, node->grad), gate, up,
                                         lt_glu_of(node), tg == tu ? tg : LT_TYPE_F32);
    if (!r)
        return lt_fail(LT_ERR_INVALID, "cannot build the gradient of '%s': %s", node->name,
                       lt_last_error());
    lt_status st = LT_OK;
    if (lt_ad_wants(ad, gate))
        st = lt_ad_add(ad, gate, lt_swiglu_back_gate(ctx, r));
    if (st == LT_OK && lt_ad_wants(ad, up))
        st = lt_ad_add(ad, up, lt_swiglu_back_up(ctx, r));
    return st;
}

/* ---- the table ---- */

#define UNARY_DEF(sym, str)                                                                        \
    const struct lt_op_def lt_op_def_##sym = {.name = str,                                         \
                                              .n_src = 1,                                          \
                                              .cpu_supported = unary_supported,                    \
                                              .cpu_work_size = rows_work_size,                     \
                                              .cpu_forward = unary_forward,                        \
                                              .backward = unary_backward}

UNARY_DEF(scale, "SCALE");
UNARY_DEF(silu, "SILU");
UNARY_DEF(sigmoid, "SIGMOID");
UNARY_DEF(softplus, "SOFTPLUS");
UNARY_DEF(exp, "EXP");
UNARY_DEF(log, "LOG");
UNARY_DEF(sqr, "SQR");
UNARY_DEF(sqrt, "SQRT");
UNARY_DEF(sin, "SIN");
UNARY_DEF(cos, "COS");
UNARY_DEF(abs, "ABS");
UNARY_DEF(neg, "NEG");
UNARY_DEF(relu, "RELU");

const struct lt_op_def lt_op_def_swiglu = {.name = "SWIGLU",
                                           .n_src = 2,
                                           .cpu_supported = pair_supported,
                                           .cpu_work_size = rows_work_size,
                                           .cpu_forward = pair_forward,
                                           .backward = swiglu_backward};
const struct lt_op_def lt_op_def_silu_back = {.name = "SILU_BACK",
                                              .n_src = 2,
                                              .cpu_supported = pair_supported,
                                              .cpu_work_size = rows_work_size,
                                              .cpu_forward = pair_forward};
const struct lt_op_def lt_op_def_swiglu_back = {.name = "SWIGLU_BACK",
                                                .n_src = 3,
                                                .cpu_supported = swiglu_back_supported,
                                                .cpu_work_size = swiglu_back_work_size,
                                                .cpu_forward = swiglu_back_forward};
