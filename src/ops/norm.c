/* norm.c: RMS_NORM and L2_NORM over ne[0], and their backward ops RMS_NORM_BACK and
 * L2_NORM_BACK (dL/dx from dL/dy), with their CPU kernels.
 *
 * Both norms are y = x * r with r = (S + eps)^(-1/2), where S = sum(x^2) / n for RMS (n =
 * ne0) and S = sum(x^2) for L2; eps sits inside the root in both (HF/FLA's l2norm, not
 * F.normalize's clamp). The gradient is dx = r * g - r^3 * x * sum(g * x) / n (n = 1 for
 * L2). Sums run in double. Sources may have any strides; results are contiguous F32.
 * RMS_NORM may carry a weight (lt_rms_norm_mul): src[1], F32 [ne0], and the result y * w,
 * stored as F32, F16 or BF16, each product rounded as MUL rounds it; and then a gate
 * (lt_rms_norm_mul_gated, Qwen3.5's gated norm of the DeltaNet output): src[2], F32 or BF16
 * of x's shape (a device's training step stores the gate's product in BF16), the result
 * y * w * silu(z). Its backward rule is one RMS_NORM_MUL_BACK node, whose
 * result holds dx, dz (gated) and partial sums of dw over groups of rows (a REPEAT_BACK adds
 * them): one pass over x, z and the gradient where the chain of RMS_NORM, MUL by w, SILU and
 * MUL and their rules took about ten (a device's BF16 training step takes it, model_graph.c;
 * the F32 path keeps the chain).
 * ADD_RMS_NORM (inference only) is a residual sum and the weighted RMS norm of it in one
 * node: its result holds r = a + b, then rms_norm(r) * w, each rounded as ADD, RMS_NORM and
 * MUL round them.
 * Threads take whole rows, so no barrier is needed; a strided row is first gathered into
 * the thread's own scratch so the arithmetic loops see unit strides.
 *
 * Backward rules: RMS_NORM -> RMS_NORM_BACK, L2_NORM -> L2_NORM_BACK, each reading x and
 * dL/dy. The CPU kernels of the _BACK ops take any strides (norm_supported asks only for
 * f32 of the result's shape), but the rules still hand them a contiguous x: the forward x
 * is often a view (Qwen3.5's k_conv, sliced out of the conv output, is the l2_norm case
 * that crashed llama.cpp), and a device kernel that needs unit strides must be able to
 * run the backward pass too. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

enum norm_kind { NORM_RMS, NORM_L2 };

static struct lt_tensor *norm_new(struct lt_ctx *ctx, enum lt_op op, const char *what,
                                  struct lt_tensor *a, float eps)
{
    LT_REQUIRE(what, a);
    if (a->type != LT_TYPE_F32) {
        lt_fail(LT_ERR_INVALID, "%s of '%s': %s, not f32", what, a->name, lt_type_name(a->type));
        return NULL;
    }
    if (!(eps >= 0.0f)) {
        lt_fail(LT_ERR_INVALID, "%s of '%s': eps %g is not >= 0", what, a->name, (double)eps);
        return NULL;
    }
    struct lt_tensor *t =
        lt_new_op_tensor(ctx, op, LT_TYPE_F32, 4, a->ne, (struct lt_tensor *[]){a}, 1);
    if (t)
        lt_set_param_f32(t, 0, eps);
    return t;
}

struct lt_tensor *lt_rms_norm(struct lt_ctx *ctx, struct lt_tensor *a, float eps)
{
    return norm_new(ctx, LT_OP_RMS_NORM, "rms_norm", a, eps);
}

struct lt_tensor *lt_rms_norm_mul(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *w,
                                  float eps, enum lt_type type)
{
    LT_REQUIRE("rms_norm_mul", a, w);
    if (w->type != LT_TYPE_F32 || !lt_is_contiguous(w) || lt_nelements(w) != a->ne[0] ||
        w->ne[0] != a->ne[0]) {
        lt_fail(LT_ERR_INVALID, "rms_norm_mul of '%s': the weight '%s' is not f32 [%lld]", a->name,
                w->name, (long long)a->ne[0]);
        return NULL;
    }
    if (type != LT_TYPE_F32 && type != LT_TYPE_F16 && type != LT_TYPE_BF16) {
        lt_fail(LT_ERR_INVALID, "rms_norm_mul of '%s' into %s: only f32, f16 or bf16", a->name,
                lt_type_name(type));
        return NULL;
    }
    struct lt_tensor *t = norm_new(ctx, LT_OP_RMS_NORM, "rms_norm_mul", a, eps);
    if (t) {
        t->src[1] = w;
        t->type = type;
        t->nb[0] = lt_type_traits(type)->type_size;
        for (int k = 1; k < LT_MAX_DIMS; k++)
            t->nb[k] = t->nb[k - 1] * (size_t)t->ne[k - 1];
    }
    return t;
}

/* the gated norm's gate: F32, or BF16 (read as floats) */
static bool gate_type_ok(const struct lt_tensor *z)
{
    return z->type == LT_TYPE_F32 || z->type == LT_TYPE_BF16;
}

struct lt_tensor *lt_rms_norm_mul_gated(struct lt_ctx *ctx, struct lt_tensor *a,
                                        struct lt_tensor *w, struct lt_tensor *z, float eps,
                                        enum lt_type type)
{
    LT_REQUIRE("rms_norm_mul_gated", a, w, z);
    if (!gate_type_ok(z) || !lt_same_shape(z, a)) {
        lt_fail(LT_ERR_INVALID,
                "rms_norm_mul_gated of '%s': the gate '%s' is not f32 or bf16 of its shape",
                a->name, z->name);
        return NULL;
    }
    struct lt_tensor *t = lt_rms_norm_mul(ctx, a, w, eps, type);
    if (t)
        t->src[2] = z;
    return t;
}

int64_t lt_rms_norm_mul_back_parts(const struct lt_tensor *x)
{
    const int64_t rows = lt_nrows(x), want = x->ne[0] > 0 ? LT_NORM_DW_ELEMENTS / x->ne[0] : 1;
    const int64_t parts = want < 1 ? 1 : want;
    return rows < parts ? rows : parts;
}

struct lt_tensor *lt_rms_norm_mul_back(struct lt_ctx *ctx, struct lt_tensor *grad,
                                       struct lt_tensor *x, struct lt_tensor *w,
                                       struct lt_tensor *z, float eps)
{
    return lt_rms_norm_mul_back_add(ctx, grad, x, w, z, eps, NULL);
}

/* c, RMS_NORM_MUL_BACK's optional addend of dx: F32, contiguous, x's shape */
static bool addend_fits(const struct lt_tensor *c, const struct lt_tensor *x)
{
    return !c || (c->type == LT_TYPE_F32 && lt_is_contiguous(c) && lt_same_shape(c, x));
}

struct lt_tensor *lt_rms_norm_mul_back_add(struct lt_ctx *ctx, struct lt_tensor *grad,
                                           struct lt_tensor *x, struct lt_tensor *w,
                                           struct lt_tensor *z, float eps, struct lt_tensor *c)
{
    LT_REQUIRE("rms_norm_mul_back", grad, x, w);
    if (!addend_fits(c, x)) {
        lt_fail(LT_ERR_INVALID,
                "rms_norm_mul_back of '%s': the addend '%s' is not contiguous f32 of its shape",
                x->name, c->name);
        return NULL;
    }
    if (grad->type != LT_TYPE_F32 || x->type != LT_TYPE_F32 || !lt_same_shape(grad, x) ||
        (z && (!gate_type_ok(z) || !lt_same_shape(z, x)))) {
        lt_fail(LT_ERR_INVALID,
                "rms_norm_mul_back: '%s', '%s'%s%s must be of one shape, f32 (the gate f32 or "
                "bf16)",
                grad->name, x->name, z ? " and " : "", z ? z->name : "");
        return NULL;
    }
    if (w->type != LT_TYPE_F32 || !lt_is_contiguous(w) || lt_nelements(w) != x->ne[0]) {
        lt_fail(LT_ERR_INVALID, "rms_norm_mul_back of '%s': the weight '%s' is not f32 [%lld]",
                x->name, w->name, (long long)x->ne[0]);
        return NULL;
    }
    if (!(eps >= 0.0f)) {
        lt_fail(LT_ERR_INVALID, "rms_norm_mul_back of '%s': eps %g is not >= 0", x->name,
                (double)eps);
        return NULL;
    }
    const int64_t rows = lt_nrows(x), parts = lt_rms_norm_mul_back_parts(x);
    int64_t ne[2] = {x->ne[0], rows * (z ? 2 : 1) + parts};
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_RMS_NORM_MUL_BACK, LT_TYPE_F32, 2, ne,
                                           (struct lt_tensor *[]){grad, x, w, z, c},
                                           c   ? 5
                                           : z ? 4
                                               : 3);
    if (t) {
        lt_set_param_f32(t, 0, eps);
        lt_set_param_i32(t, 1, (int32_t)parts);
    }
    return t;
}

bool lt_rms_norm_mul_back_fits(const struct lt_tensor *node)
{
    const struct lt_tensor *g = node->src[0], *x = node->src[1], *w = node->src[2],
                           *z = node->src[3];
    if (node->op != LT_OP_RMS_NORM_MUL_BACK || !g || !x || !w)
        return false;
    const int64_t rows = lt_nrows(x), parts = lt_rms_norm_mul_back_parts(x);
    return g->type == LT_TYPE_F32 && x->type == LT_TYPE_F32 && lt_same_shape(g, x) &&
           (!z || (gate_type_ok(z) && lt_same_shape(z, x))) && w->type == LT_TYPE_F32 &&
           lt_is_contiguous(w) && lt_nelements(w) == x->ne[0] && node->type == LT_TYPE_F32 &&
           addend_fits(node->src[4], x) && lt_is_contiguous(node) && node->ne[0] == x->ne[0] &&
           node->ne[1] == rows * (z ? 2 : 1) + parts && node->ne[2] == 1 && node->ne[3] == 1 &&
           lt_get_param_i32(node, 1) == parts;
}

/* part 0: dx (x's shape), 1: dz, 2: the partial sums of dw [ne0, parts] */
static struct lt_tensor *norm_mul_back_part(struct lt_ctx *ctx, struct lt_tensor *r, int part)
{
    const struct lt_tensor *x = r->src[1];
    const int64_t rows = lt_nrows(x);
    const size_t row = (size_t)x->ne[0] * sizeof(float);
    if (part < 2)
        return lt_view_4d(ctx, r, x->ne[0], x->ne[1], x->ne[2], x->ne[3], row, row * x->ne[1],
                          row * x->ne[1] * x->ne[2], (size_t)part * rows * row);
    return lt_view_2d(ctx, r, x->ne[0], lt_get_param_i32(r, 1), row,
                      (size_t)rows * (r->src[3] ? 2 : 1) * row);
}

struct lt_tensor *lt_add_rms_norm(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                                  struct lt_tensor *w, float eps)
{
    LT_REQUIRE("add_rms_norm", a, b, w);
    if (a->type != LT_TYPE_F32 || b->type != LT_TYPE_F32 || !lt_same_shape(a, b) ||
        a->ne[2] != 1 || a->ne[3] != 1) {
        lt_fail(LT_ERR_INVALID, "add_rms_norm of '%s' and '%s': not two f32 matrices of one shape",
                a->name, b->name);
        return NULL;
    }
    if (w->type != LT_TYPE_F32 || !lt_is_contiguous(w) || w->ne[0] != a->ne[0] ||
        lt_nelements(w) != a->ne[0]) {
        lt_fail(LT_ERR_INVALID, "add_rms_norm of '%s': the weight '%s' is not f32 [%lld]", a->name,
                w->name, (long long)a->ne[0]);
        return NULL;
    }
    if (!(eps >= 0.0f)) {
        lt_fail(LT_ERR_INVALID, "add_rms_norm of '%s': eps %g is not >= 0", a->name, (double)eps);
        return NULL;
    }
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_ADD_RMS_NORM, LT_TYPE_F32, 3,
                                           (int64_t[]){a->ne[0], a->ne[1], 2},
                                           (struct lt_tensor *[]){a, b, w}, 3);
    if (t)
        lt_set_param_f32(t, 0, eps);
    return t;
}

static struct lt_tensor *add_rms_norm_part(struct lt_ctx *ctx, struct lt_tensor *r, int part)
{
    if (!r || (r->op != LT_OP_ADD_RMS_NORM && r->op != LT_OP_MUL_MAT_ADD_RMS_NORM)) {
        lt_fail(LT_ERR_INVALID, "add_rms_norm_%s of '%s', not an ADD_RMS_NORM",
                part ? "out" : "sum", r ? r->name : "(null)");
        return NULL;
    }
    return lt_view_2d(ctx, r, r->ne[0], r->ne[1], r->nb[1], (size_t)part * r->nb[2]);
}

struct lt_tensor *lt_add_rms_norm_sum(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("add_rms_norm_sum", r);
    return add_rms_norm_part(ctx, r, 0);
}

struct lt_tensor *lt_add_rms_norm_out(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("add_rms_norm_out", r);
    return add_rms_norm_part(ctx, r, 1);
}

struct lt_tensor *lt_l2_norm(struct lt_ctx *ctx, struct lt_tensor *a, float eps)
{
    return norm_new(ctx, LT_OP_L2_NORM, "l2_norm", a, eps);
}

/* op param 1 of L2_NORM: 1 when its backward rule is the fused L2_NORM_BACK */
#define L2_FUSED_BACK 1

struct lt_tensor *lt_l2_norm_fused_back(struct lt_ctx *ctx, struct lt_tensor *a, float eps)
{
    struct lt_tensor *t = norm_new(ctx, LT_OP_L2_NORM, "l2_norm", a, eps);
    if (t)
        lt_set_param_i32(t, L2_FUSED_BACK, 1);
    return t;
}

static struct lt_tensor *norm_back_new(struct lt_ctx *ctx, enum lt_op op, const char *what,
                                       struct lt_tensor *grad, struct lt_tensor *x, float eps)
{
    LT_REQUIRE(what, grad, x);
    if (grad->type != LT_TYPE_F32 || x->type != LT_TYPE_F32 || !lt_same_shape(grad, x)) {
        lt_fail(LT_ERR_INVALID, "%s: '%s' (%s) and '%s' (%s) must be f32 of one shape", what,
                grad->name, lt_type_name(grad->type), x->name, lt_type_name(x->type));
        return NULL;
    }
    struct lt_tensor *t =
        lt_new_op_tensor(ctx, op, LT_TYPE_F32, 4, x->ne, (struct lt_tensor *[]){grad, x}, 2);
    if (t)
        lt_set_param_f32(t, 0, eps);
    return t;
}

struct lt_tensor *lt_rms_norm_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *x,
                                   float eps)
{
    return norm_back_new(ctx, LT_OP_RMS_NORM_BACK, "rms_norm_back", grad, x, eps);
}

struct lt_tensor *lt_l2_norm_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *x,
                                  float eps)
{
    return norm_back_new(ctx, LT_OP_L2_NORM_BACK, "l2_norm_back", grad, x, eps);
}

/* ---- CPU ---- */

/* the weight of a fused RMS_NORM (src[1]): NULL when there is none */
static const struct lt_tensor *norm_weight(const struct lt_tensor *node)
{
    return node->op == LT_OP_RMS_NORM ? node->src[1] : NULL;
}

/* ... and its gate (src[2]) */
static const struct lt_tensor *norm_gate(const struct lt_tensor *node)
{
    return node->op == LT_OP_RMS_NORM ? node->src[2] : NULL;
}

/* silu(z) as SWIGLU computes it */
static inline float silu_of(float z)
{
    return z / (1.0f + expf(-z));
}

static bool norm_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *w = norm_weight(node);
    int n_src = node->op == LT_OP_RMS_NORM ? 1 : lt_op_def(node->op)->n_src;
    for (int i = 0; i < n_src; i++) {
        const struct lt_tensor *s = node->src[i];
        if (s->type != LT_TYPE_F32 || !lt_same_shape(s, node)) {
            snprintf(reason, reason_size, "source %d is not f32 of the result's shape", i);
            return false;
        }
    }
    if (w && (w->type != LT_TYPE_F32 || !lt_is_contiguous(w) || w->ne[0] != node->ne[0] ||
              lt_nelements(w) != node->ne[0])) {
        snprintf(reason, reason_size, "the weight (source 1) is not contiguous f32 [ne0]");
        return false;
    }
    const struct lt_tensor *z = norm_gate(node);
    if (z && (!w || !gate_type_ok(z) || !lt_same_shape(z, node))) {
        snprintf(reason, reason_size,
                 "the gate (source 2) is not f32 or bf16 of the result's shape, "
                 "after a weight");
        return false;
    }
    bool type_ok = w ? lt_type_is_float(node->type) : node->type == LT_TYPE_F32;
    if (!type_ok || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is %s %s, not contiguous %s",
                 lt_type_name(node->type), lt_layout_name(node), w ? "f32, f16 or bf16" : "f32");
        return false;
    }
    return true;
}

/* one gather row per strided source, per thread */
static size_t norm_work_size(const struct lt_tensor *node, int nth)
{
    return (size_t)nth * (size_t)lt_op_def(node->op)->n_src * (size_t)node->ne[0] * sizeof(float);
}

/* Row r (flattened over dims 1..3) of t as unit-strided floats: in place, or gathered. */
static const float *row_f32(const struct lt_tensor *t, int64_t r, float *buf)
{
    int64_t i1 = r % t->ne[1], i2 = (r / t->ne[1]) % t->ne[2], i3 = r / (t->ne[1] * t->ne[2]);
    const char *row = (const char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
    if (t->type == LT_TYPE_BF16) { /* a gate stored in BF16: widened */
        for (int64_t i = 0; i < t->ne[0]; i++) {
            uint16_t h;
            memcpy(&h, row + i * t->nb[0], sizeof(h));
            buf[i] = lt_bf16_to_fp32(h);
        }
        return buf;
    }
    if (t->nb[0] == sizeof(float))
        return (const float *)row;
    for (int64_t i = 0; i < t->ne[0]; i++)
        memcpy(&buf[i], row + i * t->nb[0], sizeof(float));
    return buf;
}

/* r = (S + eps)^(-1/2), S = sum(x^2) (/ n for RMS) */
static double norm_factor(enum norm_kind kind, const float *x, int64_t n, float eps)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    if (kind == NORM_RMS && n > 0)
        s /= (double)n;
    return 1.0 / sqrt(s + (double)eps);
}

static void norm_forward(const struct lt_compute_params *p, struct lt_tensor *node,
                         enum norm_kind kind)
{
    const struct lt_tensor *a = node->src[0];
    int64_t n = node->ne[0], lo, hi;
    float eps = lt_get_param_f32(node, 0);
    /* norm_work_size's share: n_src rows a thread (the second for RMS_NORM's weighted row) */
    float *buf = (float *)p->wdata + (size_t)p->ith * (size_t)lt_op_def(node->op)->n_src * (size_t)n;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    const struct lt_tensor *wt = norm_weight(node), *zt = norm_gate(node);
    const float *w = wt ? (const float *)wt->data : NULL;
    float *ybuf = buf + n, *zbuf = buf + 2 * n; /* a weighted row before its conversion */
    for (int64_t r = lo; r < hi; r++) {
        const float *x = row_f32(a, r, buf);
        float f = (float)norm_factor(kind, x, n, eps);
        if (!w) {
            float *y = (float *)node->data + r * n;
            for (int64_t i = 0; i < n; i++)
                y[i] = x[i] * f;
            continue;
        }
        float *y = node->type == LT_TYPE_F32 ? (float *)node->data + r * n : ybuf;
        const float *z = zt ? row_f32(zt, r, zbuf) : NULL;
        for (int64_t i = 0; i < n; i++) {
            float v = x[i] * f;
            y[i] = v * w[i];
            if (z)
                y[i] = y[i] * silu_of(z[i]);
        }
        if (node->type != LT_TYPE_F32) /* as MUL stores a half result */
            lt_row_from_f32(node, r % node->ne[1], (r / node->ne[1]) % node->ne[2],
                            r / (node->ne[1] * node->ne[2]), ybuf);
    }
}

static void norm_backward(const struct lt_compute_params *p, struct lt_tensor *node,
                          enum norm_kind kind)
{
    const struct lt_tensor *grad = node->src[0], *xt = node->src[1];
    int64_t n = node->ne[0], lo, hi;
    float eps = lt_get_param_f32(node, 0);
    float *gbuf = (float *)p->wdata + (size_t)p->ith * 2 * (size_t)n, *xbuf = gbuf + n;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const float *g = row_f32(grad, r, gbuf);
        const float *x = row_f32(xt, r, xbuf);
        float *dx = (float *)node->data + r * n;
        double f = norm_factor(kind, x, n, eps), dot = 0;
        for (int64_t i = 0; i < n; i++)
            dot += (double)g[i] * x[i];
        if (kind == NORM_RMS && n > 0)
            dot /= (double)n;
        float fa = (float)f, fb = (float)(f * f * f * dot);
        for (int64_t i = 0; i < n; i++)
            dx[i] = fa * g[i] - fb * x[i];
    }
}

static void rms_norm_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    norm_forward(p, node, NORM_RMS);
}

static void l2_norm_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    norm_forward(p, node, NORM_L2);
}

static void rms_norm_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    norm_backward(p, node, NORM_RMS);
}

static void l2_norm_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    norm_backward(p, node, NORM_L2);
}

/* RMS_NORM_MUL_BACK. Row r: h = g w s (s = silu(z), or 1), f and dot = sum(h x) / n as
 * RMS_NORM_BACK's, dx = f h - f^3 dot x (plus the addend c, c + dx as ADD(c, dx) sums it);
 * dz = g (x f) w silu'(z); and part p of the rows
 * (rows p * rows / parts up to the next's) adds g (x f) s into dw's partial row p. Threads
 * take whole parts, so each partial row is one thread's, in row order, whatever the count. */
static void rms_norm_mul_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *gt = node->src[0], *xt = node->src[1], *zt = node->src[3];
    const float *w = (const float *)node->src[2]->data;
    const float *c = node->src[4] ? (const float *)node->src[4]->data : NULL; /* dx's addend */
    const int64_t n = xt->ne[0], rows = lt_nrows(xt), parts = lt_get_param_i32(node, 1);
    const float eps = lt_get_param_f32(node, 0);
    float *gbuf = (float *)p->wdata + (size_t)p->ith * 3 * (size_t)n, *xbuf = gbuf + n,
          *zbuf = xbuf + n;
    const size_t rows_bytes = ((size_t)p->nth * 3 * (size_t)n * sizeof(float) + 7) & ~(size_t)7;
    double *acc = (double *)((char *)p->wdata + rows_bytes) + (size_t)p->ith * (size_t)n;
    float *dx = (float *)node->data, *dz = dx + rows * n, *dw = dx + (zt ? 2 : 1) * rows * n;
    int64_t lo, hi;
    lt_split_range(parts, p->ith, p->nth, &lo, &hi);
    for (int64_t q = lo; q < hi; q++) {
        for (int64_t i = 0; i < n; i++)
            acc[i] = 0.0;
        for (int64_t r = q * rows / parts; r < (q + 1) * rows / parts; r++) {
            const float *g = row_f32(gt, r, gbuf), *x = row_f32(xt, r, xbuf);
            const float *z = zt ? row_f32(zt, r, zbuf) : NULL;
            const double fd = norm_factor(NORM_RMS, x, n, eps);
            const float f = (float)fd;
            double dot = 0;
            for (int64_t i = 0; i < n; i++) {
                const float h = z ? (g[i] * w[i]) * silu_of(z[i]) : g[i] * w[i];
                dot += (double)h * x[i];
            }
            dot /= (double)n;
            const float fb = (float)(fd * fd * fd * dot);
            for (int64_t i = 0; i < n; i++) {
                const float s = z ? silu_of(z[i]) : 1.0f, xf = x[i] * f;
                const float h = z ? (g[i] * w[i]) * s : g[i] * w[i];
                const float d = f * h - fb * x[i];
                dx[r * n + i] = c ? c[r * n + i] + d : d;
                acc[i] += (double)((g[i] * xf) * s);
                if (z) {
                    const float sg = 1.0f / (1.0f + expf(-z[i]));
                    dz[r * n + i] = (g[i] * (xf * w[i])) * (sg * (1.0f + z[i] * (1.0f - sg)));
                }
            }
        }
        for (int64_t i = 0; i < n; i++)
            dw[q * n + i] = (float)acc[i];
    }
}

static bool rms_norm_mul_back_supported(const struct lt_tensor *node, char *reason,
                                        size_t reason_size)
{
    if (!lt_rms_norm_mul_back_fits(node)) {
        snprintf(reason, reason_size,
                 "the sources are not f32 gradient, x (and gate) of one shape and a contiguous "
                 "f32 [ne0] weight, or the result not the contiguous f32 [ne0, rows (x2) + "
                 "parts] they give");
        return false;
    }
    return true;
}

/* three gather rows a thread, then a row of double sums a thread */
static size_t rms_norm_mul_back_work_size(const struct lt_tensor *node, int nth)
{
    const size_t n = (size_t)node->src[1]->ne[0];
    return (size_t)nth * n * (3 * sizeof(float) + sizeof(double)) + sizeof(double);
}

static bool add_rms_norm_supported(const struct lt_tensor *node, char *reason,
                                   size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1], *w = node->src[2];
    if (a->type != LT_TYPE_F32 || b->type != LT_TYPE_F32 || !lt_same_shape(a, b) ||
        a->ne[0] != node->ne[0] || a->ne[1] != node->ne[1] || a->ne[2] != 1 || a->ne[3] != 1) {
        snprintf(reason, reason_size, "sources 0 and 1 are not f32 [ne0, ne1] of the result");
        return false;
    }
    if (w->type != LT_TYPE_F32 || !lt_is_contiguous(w) || lt_nelements(w) != node->ne[0]) {
        snprintf(reason, reason_size, "the weight (source 2) is not contiguous f32 [ne0]");
        return false;
    }
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node) || node->ne[2] != 2) {
        snprintf(reason, reason_size, "the result is not contiguous f32 [ne0, ne1, 2]");
        return false;
    }
    return true;
}

/* two gather rows (a and b) per thread */
static size_t add_rms_norm_work_size(const struct lt_tensor *node, int nth)
{
    return (size_t)nth * 2 * (size_t)node->ne[0] * sizeof(float);
}

static void add_rms_norm_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const float *w = (const float *)node->src[2]->data;
    const int64_t n = node->ne[0], rows = node->ne[1];
    const float eps = lt_get_param_f32(node, 0);
    float *abuf = (float *)p->wdata + (size_t)p->ith * 2 * (size_t)n, *bbuf = abuf + n;
    int64_t lo, hi;
    lt_split_range(rows, p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const float *x = row_f32(a, r, abuf), *u = row_f32(b, r, bbuf);
        float *sum = (float *)node->data + r * n, *y = sum + rows * n;
        for (int64_t i = 0; i < n; i++)
            sum[i] = x[i] + u[i];
        float f = (float)norm_factor(NORM_RMS, sum, n, eps);
        for (int64_t i = 0; i < n; i++) {
            float v = sum[i] * f;
            y[i] = v * w[i];
        }
    }
}

/* ---- backward rules ---- */

typedef struct lt_tensor *(*norm_back_fn)(struct lt_ctx *ctx, struct lt_tensor *grad,
                                          struct lt_tensor *x, float eps);

static lt_status norm_rule(struct lt_autodiff *ad, struct lt_tensor *node, norm_back_fn back)
{
    struct lt_tensor *x = node->src[0];
    if (!lt_ad_wants(ad, x))
        return LT_OK;
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad), *xc = lt_ad_contiguous(ad, x);
    if (!g || !xc)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the gradient of '%s'", x->name);
    return lt_ad_add(ad, x, back(lt_ad_ctx(ad), g, xc, lt_get_param_f32(node, 0)));
}

/* With a weight (and a gate): one RMS_NORM_MUL_BACK node reading the sources as they are
 * (its kernels take any strides), dw the REPEAT_BACK of its partial rows */
static lt_status rms_norm_mul_rule(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *x = node->src[0], *w = node->src[1], *z = node->src[2];
    const bool want_x = lt_ad_wants(ad, x), want_w = lt_ad_wants(ad, w),
               want_z = z && lt_ad_wants(ad, z);
    if (!want_x && !want_w && !want_z)
        return LT_OK;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad);
    /* x's gradient so far (a residual stream's, handed on by the next residual sum) is added
     * into dx by the node itself; dx's rows then are x's whole gradient so far */
    struct lt_tensor *c = want_x && x->grad && addend_fits(x->grad, x) ? x->grad : NULL;
    struct lt_tensor *r =
        g ? lt_rms_norm_mul_back_add(ctx, g, x, w, z, lt_get_param_f32(node, 0), c) : NULL;
    if (!r)
        return lt_fail(LT_ERR_INVALID, "cannot build the gradient of '%s': %s", node->name,
                       lt_last_error());
    lt_status st = LT_OK;
    if (want_x && c) /* not owned: a view of the node's result */
        st = lt_ad_take_grad(ad, x, norm_mul_back_part(ctx, r, 0), false);
    else if (want_x)
        st = lt_ad_add(ad, x, norm_mul_back_part(ctx, r, 0));
    if (st == LT_OK && want_z)
        st = lt_ad_add(ad, z, norm_mul_back_part(ctx, r, 1));
    if (st == LT_OK && want_w) {
        struct lt_tensor *parts = norm_mul_back_part(ctx, r, 2);
        struct lt_tensor *like =
            parts ? lt_view_2d(ctx, parts, parts->ne[0], 1, parts->nb[1], 0) : NULL;
        struct lt_tensor *dw = like ? lt_repeat_back(ctx, parts, like) : NULL;
        st = lt_ad_add(ad, w,
                       dw ? lt_reshape_4d(ctx, dw, w->ne[0], w->ne[1], w->ne[2], w->ne[3]) : NULL);
    }
    return st;
}

static lt_status rms_norm_rule(struct lt_autodiff *ad, struct lt_tensor *node)
{
    if (node->src[1])
        return rms_norm_mul_rule(ad, node);
    return norm_rule(ad, node, lt_rms_norm_back);
}

/* L2_NORM's rule is built from primitives, as llama.cpp's is:
 *   s = sum_rows(sqr(x)), t = sqrt(s + eps), y = x / t, dx = (g - y * sum_rows(g * y)) / t
 * This is the very graph that crashed llama.cpp (SQR of a viewed k_conv on a device whose
 * SQR kernel wanted a contiguous source), kept on purpose with the one change that
 * matters: SQR reads a contiguous copy of x, never the view. So a device that can run
 * these primitives trains Qwen3.5 with no special kernel, and LATHE_CUDA_DISABLE_OPS=SQR
 * shows the refusal on the real model's graph. L2_NORM_BACK stays as the fused form, the
 * rule of lt_l2_norm_fused_back's nodes (a device's BF16 training step: the primitives cost
 * ~30 ms of a 16 x 512 full fine-tune's 585 over 2 steps on an H100, about 5%). */
static lt_status l2_norm_rule(struct lt_autodiff *ad, struct lt_tensor *node)
{
    if (lt_get_param_i32(node, L2_FUSED_BACK) == 1) /* lt_l2_norm_fused_back */
        return norm_rule(ad, node, lt_l2_norm_back);
    struct lt_tensor *x = node->src[0];
    if (!lt_ad_wants(ad, x))
        return LT_OK;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad), *xc = lt_ad_contiguous(ad, x);
    if (!g || !xc)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the gradient of '%s'", x->name);
    struct lt_tensor *s = lt_sum_rows(ctx, lt_sqr(ctx, xc));
    struct lt_tensor *t = s ? lt_sqrt(ctx, lt_add(ctx, s, lt_fill(ctx, s, lt_get_param_f32(node, 0))))
                            : NULL;
    struct lt_tensor *y = t ? lt_div(ctx, xc, t) : NULL;
    struct lt_tensor *dot = y ? lt_sum_rows(ctx, lt_mul(ctx, g, y)) : NULL;
    struct lt_tensor *dx = dot ? lt_div(ctx, lt_sub(ctx, g, lt_mul(ctx, y, dot)), t) : NULL;
    return lt_ad_add(ad, x, dx);
}

const struct lt_op_def lt_op_def_rms_norm = {
    .name = "RMS_NORM",
    .n_src = 3, /* the weight and the gate are optional */
    .cpu_supported = norm_supported,
    .cpu_work_size = norm_work_size,
    .cpu_forward = rms_norm_forward,
    .backward = rms_norm_rule,
};

const struct lt_op_def lt_op_def_add_rms_norm = {
    .name = "ADD_RMS_NORM",
    .n_src = 3,
    .cpu_supported = add_rms_norm_supported,
    .cpu_work_size = add_rms_norm_work_size,
    .cpu_forward = add_rms_norm_forward,
};

const struct lt_op_def lt_op_def_l2_norm = {
    .name = "L2_NORM",
    .n_src = 1,
    .cpu_supported = norm_supported,
    .cpu_work_size = norm_work_size,
    .cpu_forward = l2_norm_forward,
    .backward = l2_norm_rule,
};

const struct lt_op_def lt_op_def_rms_norm_back = {
    .name = "RMS_NORM_BACK",
    .n_src = 2,
    .cpu_supported = norm_supported,
    .cpu_work_size = norm_work_size,
    .cpu_forward = rms_norm_back_forward,
};

const struct lt_op_def lt_op_def_rms_norm_mul_back = {
    .name = "RMS_NORM_MUL_BACK",
    .n_src = 4, /* the gate is optional */
    .cpu_supported = rms_norm_mul_back_supported,
    .cpu_work_size = rms_norm_mul_back_work_size,
    .cpu_forward = rms_norm_mul_back_forward,
};

const struct lt_op_def lt_op_def_l2_norm_back = {
    .name = "L2_NORM_BACK",
    .n_src = 2,
    .cpu_supported = norm_supported,
    .cpu_work_size = norm_work_size,
    .cpu_forward = l2_norm_back_forward,
};
