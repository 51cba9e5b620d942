/* softmax.c: SOFT_MAX over ne[0] (with scale, an optional additive mask and a causal mask)
 * and SOFT_MAX_BACK, with their CPU kernels.
 *
 * y = softmax(a * scale + mask), where the mask [ne0, ne1, m2, m3] is tiled over a's dims 2
 * and 3 (mask head i2 % m2, like the broadcasting of binary ops) and, when causal, key i0 of
 * query row i1 is dropped when i0 > i1 + (ne0 - ne1). A dropped key (causal, or a mask of
 * -inf) gets exactly 0, and a row with every key dropped is all zeros, not NaN.
 * SOFT_MAX_BACK takes dy and y and gives dx = y * (dy - sum(dy * y)), the gradient with
 * respect to the softmax's input (a * scale + mask); the scale's own factor is the backward
 * rule's to apply. Sources may have any strides; results are contiguous F32; threads take
 * whole rows.
 *
 * Backward rule: dz = SOFT_MAX_BACK(dy, y) with z = a * scale + mask, so da = scale * dz.
 * Dropped keys need nothing special: y is 0 there, so dz is too. The mask is normally a
 * constant and wants no gradient; one that does (a learned bias) gets dz summed over the
 * heads it was tiled across. y is the node itself, always contiguous. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

struct lt_tensor *lt_soft_max(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *mask,
                              float scale, bool causal)
{
    LT_REQUIRE("soft_max", a);
    if (a->type != LT_TYPE_F32) {
        lt_fail(LT_ERR_INVALID, "soft_max of '%s': %s, not f32", a->name, lt_type_name(a->type));
        return NULL;
    }
    if (mask && (mask->type != LT_TYPE_F32 || mask->ne[0] != a->ne[0] ||
                 mask->ne[1] != a->ne[1] || mask->ne[2] == 0 || mask->ne[3] == 0 ||
                 a->ne[2] % mask->ne[2] != 0 || a->ne[3] % mask->ne[3] != 0)) {
        lt_fail(LT_ERR_INVALID,
                "soft_max of '%s' [%lld, %lld, %lld, %lld]: mask '%s' (%s [%lld, %lld, %lld, "
                "%lld]) must be f32 with equal dims 0 and 1 and dims 2, 3 dividing a's",
                a->name, (long long)a->ne[0], (long long)a->ne[1], (long long)a->ne[2],
                (long long)a->ne[3], mask->name, lt_type_name(mask->type), (long long)mask->ne[0],
                (long long)mask->ne[1], (long long)mask->ne[2], (long long)mask->ne[3]);
        return NULL;
    }
    struct lt_tensor *srcs[2] = {a, mask};
    struct lt_tensor *t =
        lt_new_op_tensor(ctx, LT_OP_SOFT_MAX, LT_TYPE_F32, 4, a->ne, srcs, mask ? 2 : 1);
    if (!t)
        return NULL;
    lt_set_param_f32(t, 0, scale);
    lt_set_param_i32(t, 1, causal ? 1 : 0);
    return t;
}

struct lt_tensor *lt_soft_max_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *y)
{
    LT_REQUIRE("soft_max_back", grad, y);
    if (grad->type != LT_TYPE_F32 || y->type != LT_TYPE_F32 || !lt_same_shape(grad, y)) {
        lt_fail(LT_ERR_INVALID, "soft_max_back: '%s' (%s) and '%s' (%s) must be f32 of one shape",
                grad->name, lt_type_name(grad->type), y->name, lt_type_name(y->type));
        return NULL;
    }
    return lt_new_op_tensor(ctx, LT_OP_SOFT_MAX_BACK, LT_TYPE_F32, 4, y->ne,
                            (struct lt_tensor *[]){grad, y}, 2);
}

/* ---- CPU ---- */

static bool result_ok(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is not contiguous f32");
        return false;
    }
    return true;
}

static bool soft_max_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *mask = node->src[1];
    if (a->type != LT_TYPE_F32 || !lt_same_shape(a, node)) {
        snprintf(reason, reason_size, "source 0 is not f32 of the result's shape");
        return false;
    }
    if (mask && (mask->type != LT_TYPE_F32 || mask->ne[0] != a->ne[0] ||
                 mask->ne[1] != a->ne[1] || mask->ne[2] == 0 || mask->ne[3] == 0 ||
                 a->ne[2] % mask->ne[2] || a->ne[3] % mask->ne[3])) {
        snprintf(reason, reason_size, "source 1 (the mask) is not f32 that tiles over source 0");
        return false;
    }
    return result_ok(node, reason, reason_size);
}

static bool soft_max_back_supported(const struct lt_tensor *node, char *reason,
                                    size_t reason_size)
{
    for (int i = 0; i < 2; i++) {
        if (node->src[i]->type != LT_TYPE_F32 || !lt_same_shape(node->src[i], node)) {
            snprintf(reason, reason_size, "source %d is not f32 of the result's shape", i);
            return false;
        }
    }
    return result_ok(node, reason, reason_size);
}

/* Row r (flattened over dims 1..3) of t, as floats into out. */
static void load_row(const struct lt_tensor *t, int64_t i1, int64_t i2, int64_t i3, float *out)
{
    const char *row = (const char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
    if (t->nb[0] == sizeof(float)) {
        memcpy(out, row, (size_t)t->ne[0] * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < t->ne[0]; i++)
        memcpy(&out[i], row + i * t->nb[0], sizeof(float));
}

static size_t soft_max_work_size(const struct lt_tensor *node, int nth)
{
    return (size_t)nth * (size_t)node->ne[0] * sizeof(float);
}

static void soft_max_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *mask = node->src[1];
    float scale = lt_get_param_f32(node, 0);
    bool causal = lt_get_param_i32(node, 1) != 0;
    int64_t ne0 = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2], lo, hi;
    float *mrow = (float *)p->wdata + (size_t)p->ith * (size_t)ne0;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        float *y = (float *)node->data + r * ne0;
        load_row(a, i1, i2, i3, y);
        /* keys [0, n_keep) take part; the rest are dropped */
        int64_t n_keep = ne0;
        if (causal) {
            n_keep = i1 + (ne0 - ne1) + 1;
            n_keep = n_keep < 0 ? 0 : n_keep > ne0 ? ne0 : n_keep;
        }
        if (mask)
            load_row(mask, i1, i2 % mask->ne[2], i3 % mask->ne[3], mrow);
        float mx = -INFINITY;
        for (int64_t i = 0; i < n_keep; i++) {
            y[i] = y[i] * scale + (mask ? mrow[i] : 0.0f);
            mx = y[i] > mx ? y[i] : mx;
        }
        if (mx == -INFINITY) { /* every key dropped */
            memset(y, 0, (size_t)ne0 * sizeof(float));
            continue;
        }
        double sum = 0;
        for (int64_t i = 0; i < n_keep; i++) {
            y[i] = expf(y[i] - mx);
            sum += y[i];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n_keep; i++)
            y[i] *= inv;
        for (int64_t i = n_keep; i < ne0; i++)
            y[i] = 0.0f;
    }
}

static void soft_max_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *grad = node->src[0], *yt = node->src[1];
    int64_t ne0 = node->ne[0], ne1 = node->ne[1], ne2 = node->ne[2], lo, hi;
    float *y = (float *)p->wdata + (size_t)p->ith * (size_t)ne0;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        float *dx = (float *)node->data + r * ne0;
        load_row(grad, i1, i2, i3, dx);
        load_row(yt, i1, i2, i3, y);
        double dot = 0;
        for (int64_t i = 0; i < ne0; i++)
            dot += (double)dx[i] * y[i];
        float d = (float)dot;
        for (int64_t i = 0; i < ne0; i++)
            dx[i] = y[i] * (dx[i] - d);
    }
}

/* ---- backward rule ---- */

static lt_status soft_max_rule(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0], *mask = node->src[1];
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    bool want_a = lt_ad_wants(ad, a), want_mask = mask && lt_ad_wants(ad, mask);
    if (!want_a && !want_mask)
        return LT_OK;
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad);
    if (!g)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the gradient of '%s'", node->name);
    struct lt_tensor *dz = lt_soft_max_back(ctx, g, node);
    float scale = lt_get_param_f32(node, 0);
    lt_status st = LT_OK;
    if (want_a)
        st = lt_ad_add(ad, a, dz && scale != 1.0f ? lt_scale(ctx, dz, scale) : dz);
    if (st == LT_OK && want_mask)
        st = lt_ad_add(ad, mask, dz && !lt_same_shape(dz, mask) ? lt_repeat_back(ctx, dz, mask)
                                                                  : dz);
    return st;
}

const struct lt_op_def lt_op_def_soft_max = {
    .name = "SOFT_MAX",
    .n_src = 2,
    .cpu_supported = soft_max_supported,
    .cpu_work_size = soft_max_work_size,
    .cpu_forward = soft_max_forward,
    .backward = soft_max_rule,
};

const struct lt_op_def lt_op_def_soft_max_back = {
    .name = "SOFT_MAX_BACK",
    .n_src = 2,
    .cpu_supported = soft_max_back_supported,
    .cpu_work_size = soft_max_work_size,
    .cpu_forward = soft_max_back_forward,
};
