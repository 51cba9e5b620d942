/* ssm_conv.c: the causal depthwise conv1d of Gated DeltaNet (SSM_CONV) and its backward
 * (SSM_CONV_BACK): constructors, shape rules, the backward rule and CPU kernels.
 *
 * sx [L = d_conv - 1 + T, channels, n_seqs] has time innermost and may be any strided F32
 * view (usually a concat of the carried state with a transposed projection); w
 * [d_conv, channels] is F32, F16 or BF16. Both kernels split the channels over threads: a
 * channel's outputs and both of its gradients depend on that channel alone, so no two
 * threads ever write the same element and no reduction across threads is needed.
 *
 * SSM_CONV_BACK packs d sx (contiguous, sx's shape) and then d w (contiguous, w's shape)
 * into one flat F32 tensor; lt_ssm_conv_back_sx / _w are views of the two parts. */
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/conv_rows.h"
#include "ops/grad.h"
#include "ops/op.h"

static bool weight_type_ok(enum lt_type t)
{
    return t == LT_TYPE_F32 || t == LT_TYPE_F16 || t == LT_TYPE_BF16;
}

/* shape rule shared by the forward and the backward; writes d_conv and T */
static bool conv_shapes_ok(const struct lt_tensor *sx, const struct lt_tensor *w,
                           const char *what, int64_t *d_conv, int64_t *n_t)
{
    if (!weight_type_ok(w->type)) {
        lt_fail(LT_ERR_INVALID, "%s: weight '%s' is %s (F32, F16 or BF16 expected)", what,
                w->name, lt_type_name(w->type));
        return false;
    }
    if (sx->ne[3] != 1 || w->ne[2] != 1 || w->ne[3] != 1 || w->ne[1] != sx->ne[1] ||
        w->ne[0] < 1 || sx->ne[0] < w->ne[0]) {
        lt_fail(LT_ERR_INVALID,
                "%s: '%s' [%lld, %lld, %lld, %lld] and weight '%s' [%lld, %lld, %lld, %lld] do not "
                "fit (sx [d_conv - 1 + T, channels, n_seqs], w [d_conv, channels], T >= 1)",
                what, sx->name, (long long)sx->ne[0], (long long)sx->ne[1], (long long)sx->ne[2],
                (long long)sx->ne[3], w->name, (long long)w->ne[0], (long long)w->ne[1],
                (long long)w->ne[2], (long long)w->ne[3]);
        return false;
    }
    *d_conv = w->ne[0];
    *n_t = sx->ne[0] - w->ne[0] + 1;
    return true;
}

struct lt_tensor *lt_ssm_conv(struct lt_ctx *ctx, struct lt_tensor *sx, struct lt_tensor *w)
{
    LT_REQUIRE("ssm_conv", sx, w);
    int64_t d_conv, n_t;
    if (!conv_shapes_ok(sx, w, "ssm_conv", &d_conv, &n_t))
        return NULL;
    int64_t ne[3] = {sx->ne[1], n_t, sx->ne[2]};
    struct lt_tensor *r =
        lt_new_op_tensor(ctx, LT_OP_SSM_CONV, LT_TYPE_F32, 3, ne, (struct lt_tensor *[]){sx, w}, 2);
    if (r)
        lt_format_name(r, "ssm_conv(%s)", sx->name);
    return r;
}

struct lt_tensor *lt_ssm_conv_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *sx,
                                   struct lt_tensor *w)
{
    LT_REQUIRE("ssm_conv_back", grad, sx, w);
    int64_t d_conv, n_t;
    if (!conv_shapes_ok(sx, w, "ssm_conv_back", &d_conv, &n_t))
        return NULL;
    if (grad->ne[0] != sx->ne[1] || grad->ne[1] != n_t || grad->ne[2] != sx->ne[2] ||
        grad->ne[3] != 1) {
        lt_fail(LT_ERR_INVALID,
                "ssm_conv_back: gradient '%s' [%lld, %lld, %lld] is not the result's shape "
                "[%lld, %lld, %lld]",
                grad->name, (long long)grad->ne[0], (long long)grad->ne[1],
                (long long)grad->ne[2], (long long)sx->ne[1], (long long)n_t,
                (long long)sx->ne[2]);
        return NULL;
    }
    int64_t n = lt_nelements(sx) + lt_nelements(w);
    struct lt_tensor *r = lt_new_op_tensor(ctx, LT_OP_SSM_CONV_BACK, LT_TYPE_F32, 1, &n,
                                           (struct lt_tensor *[]){grad, sx, w}, 3);
    if (r)
        lt_format_name(r, "ssm_conv_back(%s)", sx->name);
    return r;
}

struct lt_tensor *lt_ssm_conv_back_sx(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("ssm_conv_back_sx", r);
    if (r->op != LT_OP_SSM_CONV_BACK) {
        lt_fail(LT_ERR_INVALID, "ssm_conv_back_sx: '%s' is %s, not SSM_CONV_BACK", r->name,
                lt_op_name(r->op));
        return NULL;
    }
    const struct lt_tensor *sx = r->src[1];
    size_t nb1 = sizeof(float) * (size_t)sx->ne[0];
    struct lt_tensor *v =
        lt_view_3d(ctx, r, sx->ne[0], sx->ne[1], sx->ne[2], nb1, nb1 * (size_t)sx->ne[1], 0);
    if (v)
        lt_format_name(v, "d %s", sx->name);
    return v;
}

struct lt_tensor *lt_ssm_conv_back_w(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("ssm_conv_back_w", r);
    if (r->op != LT_OP_SSM_CONV_BACK) {
        lt_fail(LT_ERR_INVALID, "ssm_conv_back_w: '%s' is %s, not SSM_CONV_BACK", r->name,
                lt_op_name(r->op));
        return NULL;
    }
    const struct lt_tensor *sx = r->src[1], *w = r->src[2];
    struct lt_tensor *v = lt_view_2d(ctx, r, w->ne[0], w->ne[1], sizeof(float) * (size_t)w->ne[0],
                                     sizeof(float) * (size_t)lt_nelements(sx));
    if (v)
        lt_format_name(v, "d %s", w->name);
    return v;
}

/* ---- CPU ---- */

static bool need_f32(const struct lt_tensor *t, int i, char *reason, size_t reason_size)
{
    if (t->type == LT_TYPE_F32)
        return true;
    snprintf(reason, reason_size, "source %d is %s; the CPU kernel reads F32", i,
             lt_type_name(t->type));
    return false;
}

static bool ssm_conv_cpu_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    return need_f32(node->src[0], 0, reason, reason_size);
}

static bool ssm_conv_back_cpu_supported(const struct lt_tensor *node, char *reason,
                                        size_t reason_size)
{
    return need_f32(node->src[0], 0, reason, reason_size) &&
           need_f32(node->src[1], 1, reason, reason_size);
}

/* per thread: one sx row, one w row, one gradient column (all as floats) */
static size_t conv_scratch_floats(const struct lt_tensor *sx, const struct lt_tensor *w)
{
    size_t n = (size_t)sx->ne[0] * 2 + (size_t)w->ne[0];
    return (n + 15) & ~(size_t)15; /* keep each thread's part 64-byte aligned */
}

static size_t ssm_conv_work_size(const struct lt_tensor *node, int nth)
{
    return sizeof(float) * conv_scratch_floats(node->src[0], node->src[1]) * (size_t)nth;
}

static size_t ssm_conv_back_work_size(const struct lt_tensor *node, int nth)
{
    return sizeof(float) * conv_scratch_floats(node->src[1], node->src[2]) * (size_t)nth;
}

/* sx[:, c, s] as L contiguous floats */
static void load_sx_row(const struct lt_tensor *sx, int64_t c, int64_t s, float *out)
{
    const char *p = (const char *)sx->data + c * sx->nb[1] + s * sx->nb[2];
    if (sx->nb[0] == sizeof(float)) {
        memcpy(out, p, sizeof(float) * (size_t)sx->ne[0]);
        return;
    }
    for (int64_t t = 0; t < sx->ne[0]; t++)
        out[t] = *(const float *)(p + t * sx->nb[0]);
}

static void ssm_conv_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *sx = node->src[0], *w = node->src[1];
    const int64_t d_conv = w->ne[0], n_c = sx->ne[1], n_t = node->ne[1], n_s = sx->ne[2];
    float *x = (float *)p->wdata + conv_scratch_floats(sx, w) * (size_t)p->ith;
    float *wr = x + sx->ne[0];
    int64_t c0, c1;
    lt_split_range(n_c, p->ith, p->nth, &c0, &c1);
    for (int64_t c = c0; c < c1; c++) {
        lt_row_to_f32(w, c, 0, 0, wr);
        for (int64_t s = 0; s < n_s; s++) {
            load_sx_row(sx, c, s, x);
            for (int64_t t = 0; t < n_t; t++)
                *(float *)lt_elem_ptr(node, c, t, s, 0) = lt_conv_at(x, wr, d_conv, t, NULL);
        }
    }
}

/* d sx[u, c, s] = sum_k w[k, c] grad[c, u - k, s] over 0 <= u - k < T;
 * d w[k, c]    = sum_{s, t} grad[c, t, s] sx[t + k, c, s] */
static void ssm_conv_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *grad = node->src[0], *sx = node->src[1], *w = node->src[2];
    const int64_t d_conv = w->ne[0], n_l = sx->ne[0], n_c = sx->ne[1], n_s = sx->ne[2];
    const int64_t n_t = n_l - d_conv + 1;
    float *dsx = node->data;
    float *dw = dsx + lt_nelements(sx);
    float *x = (float *)p->wdata + conv_scratch_floats(sx, w) * (size_t)p->ith;
    float *gr = x + n_l; /* n_t <= n_l */
    float *wr = gr + n_l;
    int64_t c0, c1;
    lt_split_range(n_c, p->ith, p->nth, &c0, &c1);
    for (int64_t c = c0; c < c1; c++) {
        lt_row_to_f32(w, c, 0, 0, wr);
        float *dwc = dw + c * d_conv;
        for (int64_t k = 0; k < d_conv; k++)
            dwc[k] = 0;
        for (int64_t s = 0; s < n_s; s++) {
            load_sx_row(sx, c, s, x);
            for (int64_t t = 0; t < n_t; t++)
                gr[t] = *(const float *)lt_elem_ptr(grad, c, t, s, 0);
            lt_conv_back_x(wr, gr, d_conv, n_t, 0, n_l, dsx + (s * n_c + c) * n_l, 1, NULL);
            lt_conv_back_w(gr, x, d_conv, n_t, dwc, NULL);
        }
    }
}

/* ---- backward rule ---- */

static lt_status ssm_conv_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *sx = node->src[0], *w = node->src[1];
    if (!lt_ad_wants(ad, sx) && !lt_ad_wants(ad, w))
        return LT_OK;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    struct lt_tensor *r = lt_ssm_conv_back(ctx, node->grad, sx, w);
    if (!r)
        return lt_fail(LT_ERR_INVALID, "cannot build the gradient of '%s': %s", node->name,
                       lt_last_error());
    lt_status st = LT_OK;
    if (lt_ad_wants(ad, sx))
        st = lt_ad_add(ad, sx, lt_ssm_conv_back_sx(ctx, r));
    if (st == LT_OK && lt_ad_wants(ad, w))
        st = lt_ad_add(ad, w, lt_ssm_conv_back_w(ctx, r));
    return st;
}

const struct lt_op_def lt_op_def_ssm_conv = {
    .name = "SSM_CONV",
    .n_src = 2,
    .cpu_supported = ssm_conv_cpu_supported,
    .cpu_work_size = ssm_conv_work_size,
    .cpu_forward = ssm_conv_forward,
    .backward = ssm_conv_backward,
};

const struct lt_op_def lt_op_def_ssm_conv_back = {
    .name = "SSM_CONV_BACK",
    .n_src = 3,
    .cpu_supported = ssm_conv_back_cpu_supported,
    .cpu_work_size = ssm_conv_back_work_size,
    .cpu_forward = ssm_conv_back_forward,
};
