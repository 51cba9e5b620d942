/* conv_silu.c: CONV_SILU, Gated DeltaNet's causal depthwise conv1d and its silu in one op,
 * over a projection as it comes (channels innermost) with no carried state, and its
 * backward CONV_SILU_BACK: constructors, shape rules, the backward rule and CPU kernels.
 *
 * x [C, T, S] F32 or BF16 (any strides), w [K, C] F32, F16 or BF16; with x = 0 before t = 0,
 *   y[c, t, s] = silu(p), p = sum_k w[k, c] x[c, t + k - (K - 1), s] (k in order).
 * That is silu(ssm_conv(concat(zeros [K - 1, C, S], transpose(x)), w)), the form a session's
 * layer keeps (it carries the state), with the same sums (conv_rows.h, shared with
 * ssm_conv.c) and roundings; a training step has no state, and this form skips the concat,
 * the two transposed copies of the backward and the raw conv output (Qwen3.5-0.8B at
 * 16 x 512 tokens on the H200: the conv's nodes took 22 ms of two steps instead of 75).
 *
 * CONV_SILU_BACK(g, x, w) recomputes p, takes g' = g silu'(p) (SILU_BACK's expression) and
 * packs d x (x's shape, contiguous, channels innermost: the projection's gradient needs no
 * copy) and then d w (w's shape) into one flat tensor, viewed by lt_conv_silu_back_x
 * and _w. The result is F32, or BF16 (lt_conv_silu_back_as): d x rounded once to BF16, then
 * d w still in F32 from the next 4-byte boundary (lt_conv_silu_back_dw_offset). A device's
 * training step asks for BF16 where x is a BF16 product that the conv alone reads: that
 * product's rule would round d x to BF16 before its own products anyway, in a pass of its
 * own (CONT; 3.9 ms of a 16 x 512 step pair at Qwen3.5-0.8B, H100). d x[c, u] = sum_k w[k, c] g'[u
 * + K - 1 - k] over 0 <= u + K - 1 - k < T, k in order; d w[k, c] = sum_s sum_t g'[t] x[t + k - (K
 * - 1)], as SSM_CONV_BACK sums them. Threads split the channels: a channel's outputs and gradients
 * depend on it alone.
 *
 * Packed sequences (several examples one after another in a row of T steps): with pos (I32,
 * T x S, contiguous: each step's position within its own example, the positions a packed
 * training step ropes with), a tap reaching back past the example's first step counts as
 * zero, as it does before t = 0 (conv_rows.h), so each example's outputs and gradients are
 * its own alone. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/conv_rows.h"
#include "ops/grad.h"
#include "ops/op.h"

static bool shapes_ok(const struct lt_tensor *x, const struct lt_tensor *w, const char *what)
{
    if ((x->type != LT_TYPE_F32 && x->type != LT_TYPE_BF16) ||
        (w->type != LT_TYPE_F32 && w->type != LT_TYPE_F16 && w->type != LT_TYPE_BF16)) {
        lt_fail(LT_ERR_INVALID,
                "%s: '%s' is %s and weight '%s' %s (F32 or BF16 x; F32, F16 or BF16 w)", what,
                x->name, lt_type_name(x->type), w->name, lt_type_name(w->type));
        return false;
    }
    if (x->ne[3] != 1 || w->ne[2] != 1 || w->ne[3] != 1 || w->ne[1] != x->ne[0] || w->ne[0] < 1 ||
        x->ne[1] < 1) {
        lt_fail(LT_ERR_INVALID,
                "%s: '%s' [%lld, %lld, %lld, %lld] and weight '%s' [%lld, %lld] do not fit (x "
                "[channels, T, n_seqs], w [taps, channels], T >= 1)",
                what, x->name, (long long)x->ne[0], (long long)x->ne[1], (long long)x->ne[2],
                (long long)x->ne[3], w->name, (long long)w->ne[0], (long long)w->ne[1]);
        return false;
    }
    return true;
}

/* pos: NULL, or contiguous I32 of one element a step of x */
static bool pos_ok(const struct lt_tensor *x, const struct lt_tensor *pos, const char *what)
{
    if (pos && (pos->type != LT_TYPE_I32 || !lt_is_contiguous(pos) ||
                lt_nelements(pos) != x->ne[1] * x->ne[2])) {
        lt_fail(LT_ERR_INVALID, "%s: positions '%s' are not contiguous I32 of %lld x %lld steps",
                what, pos->name, (long long)x->ne[1], (long long)x->ne[2]);
        return false;
    }
    return true;
}

struct lt_tensor *lt_conv_silu(struct lt_ctx *ctx, struct lt_tensor *x, struct lt_tensor *w)
{
    return lt_conv_silu_packed(ctx, x, w, NULL);
}

struct lt_tensor *lt_conv_silu_packed(struct lt_ctx *ctx, struct lt_tensor *x, struct lt_tensor *w,
                                      struct lt_tensor *pos)
{
    LT_REQUIRE("conv_silu", x, w);
    if (!shapes_ok(x, w, "conv_silu") || !pos_ok(x, pos, "conv_silu"))
        return NULL;
    struct lt_tensor *r = lt_new_op_tensor(ctx, LT_OP_CONV_SILU, LT_TYPE_F32, 3, x->ne,
                                           (struct lt_tensor *[]){x, w, pos}, pos ? 3 : 2);
    if (r)
        lt_format_name(r, "conv_silu(%s)", x->name);
    return r;
}

struct lt_tensor *lt_conv_silu_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *x,
                                    struct lt_tensor *w, struct lt_tensor *pos)
{
    return lt_conv_silu_back_as(ctx, grad, x, w, pos, LT_TYPE_F32);
}

/* d x's elements in the result, padded to a whole 4-byte word in a BF16 one */
static int64_t dx_slots(const struct lt_tensor *x, enum lt_type type)
{
    const int64_t nx = lt_nelements(x);
    return type == LT_TYPE_F32 ? nx : nx + (nx & 1);
}

size_t lt_conv_silu_back_dw_offset(const struct lt_tensor *r)
{
    return (size_t)dx_slots(r->src[1], r->type) * lt_type_traits(r->type)->type_size;
}

struct lt_tensor *lt_conv_silu_back_as(struct lt_ctx *ctx, struct lt_tensor *grad,
                                       struct lt_tensor *x, struct lt_tensor *w,
                                       struct lt_tensor *pos, enum lt_type type)
{
    LT_REQUIRE("conv_silu_back", grad, x, w);
    if (type != LT_TYPE_F32 && type != LT_TYPE_BF16) {
        lt_fail(LT_ERR_INVALID, "conv_silu_back of '%s' into %s: d x must be f32 or bf16", x->name,
                lt_type_name(type));
        return NULL;
    }
    if (!shapes_ok(x, w, "conv_silu_back") || !pos_ok(x, pos, "conv_silu_back"))
        return NULL;
    if (grad->type != LT_TYPE_F32 || !lt_same_shape(grad, x)) {
        lt_fail(LT_ERR_INVALID, "conv_silu_back: gradient '%s' (%s) is not F32 of x's shape",
                grad->name, lt_type_name(grad->type));
        return NULL;
    }
    /* d w's F32 elements take two slots each of a BF16 result */
    int64_t n = dx_slots(x, type) + lt_nelements(w) * (type == LT_TYPE_F32 ? 1 : 2);
    struct lt_tensor *r = lt_new_op_tensor(ctx, LT_OP_CONV_SILU_BACK, type, 1, &n,
                                           (struct lt_tensor *[]){grad, x, w, pos}, pos ? 4 : 3);
    if (r)
        lt_format_name(r, "conv_silu_back(%s)", x->name);
    return r;
}

static struct lt_tensor *back_part(struct lt_ctx *ctx, struct lt_tensor *r, bool dw)
{
    LT_REQUIRE("conv_silu_back_x/_w", r);
    if (r->op != LT_OP_CONV_SILU_BACK) {
        lt_fail(LT_ERR_INVALID, "conv_silu_back_%s: '%s' is %s, not CONV_SILU_BACK", dw ? "w" : "x",
                r->name, lt_op_name(r->op));
        return NULL;
    }
    const struct lt_tensor *x = r->src[1], *w = r->src[2];
    const size_t es = lt_type_traits(r->type)->type_size;
    struct lt_tensor *v;
    if (dw) {
        v = lt_view_1d_as(ctx, r, LT_TYPE_F32, lt_nelements(w), lt_conv_silu_back_dw_offset(r));
        v = v ? lt_reshape_2d(ctx, v, w->ne[0], w->ne[1]) : NULL;
    } else {
        v = lt_view_3d(ctx, r, x->ne[0], x->ne[1], x->ne[2], es * (size_t)x->ne[0],
                       es * (size_t)(x->ne[0] * x->ne[1]), 0);
    }
    if (v)
        lt_format_name(v, "d %s", dw ? w->name : x->name);
    return v;
}

struct lt_tensor *lt_conv_silu_back_x(struct lt_ctx *ctx, struct lt_tensor *r)
{
    return back_part(ctx, r, false);
}

struct lt_tensor *lt_conv_silu_back_w(struct lt_ctx *ctx, struct lt_tensor *r)
{
    return back_part(ctx, r, true);
}

/* ---- CPU ---- */

/* per thread: a channel's inputs over time (history zeros, then T), its gradient, w's row,
 * and (backward) its d x over time before a BF16 result rounds it */
static size_t scratch_floats(const struct lt_tensor *x, const struct lt_tensor *w)
{
    size_t n = (size_t)(x->ne[1] + w->ne[0]) * 2 + (size_t)w->ne[0] + (size_t)x->ne[1];
    return (n + 15) & ~(size_t)15; /* each thread's part 64-byte aligned */
}

static size_t conv_silu_work_size(const struct lt_tensor *node, int nth)
{
    return sizeof(float) * scratch_floats(node->src[0], node->src[1]) * (size_t)nth;
}

static size_t conv_silu_back_work_size(const struct lt_tensor *node, int nth)
{
    return sizeof(float) * scratch_floats(node->src[1], node->src[2]) * (size_t)nth;
}

/* xp[0 .. K - 2] = 0, xp[K - 1 + t] = x[c, t, s] */
static void load_padded(const struct lt_tensor *x, int64_t c, int64_t s, int64_t K, float *xp)
{
    for (int64_t k = 0; k + 1 < K; k++)
        xp[k] = 0.0f;
    const char *p = (const char *)x->data + c * x->nb[0] + s * x->nb[2];
    void (*to_float)(const void *, float *, int64_t) = lt_type_traits(x->type)->to_float;
    for (int64_t t = 0; t < x->ne[1]; t++)
        to_float(p + t * x->nb[1], xp + K - 1 + t, 1);
}

static void conv_silu_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *x = node->src[0], *w = node->src[1];
    const int64_t K = w->ne[0], C = x->ne[0], T = x->ne[1], S = x->ne[2];
    const int32_t *pos = node->src[2] ? node->src[2]->data : NULL;
    float *xp = (float *)p->wdata + scratch_floats(x, w) * (size_t)p->ith;
    float *wr = xp + (T + K) * 2;
    int64_t c0, c1;
    lt_split_range(C, p->ith, p->nth, &c0, &c1);
    for (int64_t c = c0; c < c1; c++) {
        lt_row_to_f32(w, c, 0, 0, wr);
        for (int64_t s = 0; s < S; s++) {
            load_padded(x, c, s, K, xp);
            for (int64_t t = 0; t < T; t++) {
                const float v = lt_conv_at(xp, wr, K, t, pos ? pos + s * T : NULL);
                *(float *)lt_elem_ptr(node, c, t, s, 0) = v / (1.0f + expf(-v)); /* SILU's */
            }
        }
    }
}

static void conv_silu_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *grad = node->src[0], *x = node->src[1], *w = node->src[2];
    const int64_t K = w->ne[0], C = x->ne[0], T = x->ne[1], S = x->ne[2];
    const int32_t *pos0 = node->src[3] ? node->src[3]->data : NULL;
    const bool f32 = node->type == LT_TYPE_F32; /* else d x in BF16 (lt_conv_silu_back_as) */
    float *dx = f32 ? node->data : NULL;
    uint16_t *dxh = f32 ? NULL : node->data;
    float *dw = (float *)((char *)node->data + lt_conv_silu_back_dw_offset(node));
    float *xp = (float *)p->wdata + scratch_floats(x, w) * (size_t)p->ith;
    float *gr = xp + T + K;
    float *wr = gr + T + K;
    float *dxr = wr + K; /* a BF16 result's d x over time, before rounding */
    int64_t c0, c1;
    lt_split_range(C, p->ith, p->nth, &c0, &c1);
    for (int64_t c = c0; c < c1; c++) {
        lt_row_to_f32(w, c, 0, 0, wr);
        float *dwc = dw + c * K;
        for (int64_t k = 0; k < K; k++)
            dwc[k] = 0;
        for (int64_t s = 0; s < S; s++) {
            const int32_t *pos = pos0 ? pos0 + s * T : NULL;
            load_padded(x, c, s, K, xp);
            for (int64_t t = 0; t < T; t++) { /* g' = g silu'(p), SILU_BACK's expression */
                const float u = lt_conv_at(xp, wr, K, t, pos);
                const float sg = 1.0f / (1.0f + expf(-u));
                gr[t] =
                    *(const float *)lt_elem_ptr(grad, c, t, s, 0) * sg * (1.0f + u * (1.0f - sg));
            }
            /* input u sits at K - 1 + u of xp: d x of the new inputs only */
            if (f32) {
                lt_conv_back_x(wr, gr, K, T, K - 1, T + K - 1, dx + s * T * C + c, C, pos);
            } else {
                lt_conv_back_x(wr, gr, K, T, K - 1, T + K - 1, dxr, 1, pos);
                for (int64_t t = 0; t < T; t++)
                    dxh[s * T * C + t * C + c] = lt_fp32_to_bf16(dxr[t]);
            }
            lt_conv_back_w(gr, xp, K, T, dwc, pos);
        }
    }
}

/* ---- backward rule ---- */

static lt_status conv_silu_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *x = node->src[0], *w = node->src[1];
    if (!lt_ad_wants(ad, x) && !lt_ad_wants(ad, w))
        return LT_OK;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad);
    /* d x in BF16 where x is a BF16 product only this node reads (see the head comment) */
    const enum lt_type tx = lt_ad_wants(ad, x) && lt_ad_grad_type(ad, x, node) == LT_TYPE_BF16
                                ? LT_TYPE_BF16
                                : LT_TYPE_F32;
    struct lt_tensor *r = g ? lt_conv_silu_back_as(ctx, g, x, w, node->src[2], tx) : NULL;
    if (!r)
        return lt_fail(LT_ERR_INVALID, "cannot build the gradient of '%s': %s", node->name,
                       lt_last_error());
    lt_status st = LT_OK;
    if (lt_ad_wants(ad, x))
        st = lt_ad_add(ad, x, lt_conv_silu_back_x(ctx, r));
    if (st == LT_OK && lt_ad_wants(ad, w))
        st = lt_ad_add(ad, w, lt_conv_silu_back_w(ctx, r));
    return st;
}

const struct lt_op_def lt_op_def_conv_silu = {
    .name = "CONV_SILU",
    .n_src = 3,
    .cpu_work_size = conv_silu_work_size,
    .cpu_forward = conv_silu_forward,
    .backward = conv_silu_backward,
};

const struct lt_op_def lt_op_def_conv_silu_back = {
    .name = "CONV_SILU_BACK",
    .n_src = 4,
    .cpu_work_size = conv_silu_back_work_size,
    .cpu_forward = conv_silu_back_forward,
};
