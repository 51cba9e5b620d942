/* rope.c: ROPE (rotary position embedding) and ROPE_BACK (its adjoint, the inverse
 * rotation), with their CPU kernels.
 *
 * a [head_dim, n_head, n_tokens, ne3] any strides; pos I32 [n_tokens]. Pair j of the first
 * n_dims dims ((j, j + n_dims/2) for NEOX, (2j, 2j+1) for NORMAL) turns by the angle
 * pos * inv_freq[j]; dims >= n_dims pass through. The angle is rounded the way Hugging Face
 * computes it, in float32: inv_freq[j] = 1 / base^((2j) / n_dims) (each step rounded to
 * float), angle = float(pos) * inv_freq[j] rounded to float; only cos and sin are taken in
 * double. An exact float64 angle would differ from HF by up to pos * 2^-24 radians (1e-3
 * at 16k positions); matching its rounding keeps us within ~1e-6 of HF's outputs.
 * Threads take ranges of rows; each keeps its own cos/sin table for the current position.
 *
 * Backward rule: ROPE -> ROPE_BACK of dL/dy with the same positions and parameters (a
 * rotation's adjoint is its inverse); the positions are integers and get no gradient. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

static struct lt_tensor *rope_new(struct lt_ctx *ctx, enum lt_op op, const char *what,
                                  struct lt_tensor *a, struct lt_tensor *pos, int n_dims,
                                  enum lt_rope_mode mode, float freq_base)
{
    LT_REQUIRE(what, a, pos);
    if (a->type != LT_TYPE_F32) {
        lt_fail(LT_ERR_INVALID, "%s of '%s': %s, not f32", what, a->name, lt_type_name(a->type));
        return NULL;
    }
    if (pos->type != LT_TYPE_I32 || pos->ne[0] != a->ne[2] || lt_nelements(pos) != a->ne[2]) {
        lt_fail(LT_ERR_INVALID, "%s of '%s': positions '%s' must be i32 [%lld] (one per token)",
                what, a->name, pos->name, (long long)a->ne[2]);
        return NULL;
    }
    if (n_dims <= 0 || n_dims % 2 != 0 || n_dims > a->ne[0]) {
        lt_fail(LT_ERR_INVALID, "%s of '%s': n_dims %d must be even, > 0 and <= head_dim %lld",
                what, a->name, n_dims, (long long)a->ne[0]);
        return NULL;
    }
    if (mode != LT_ROPE_NORMAL && mode != LT_ROPE_NEOX) {
        lt_fail(LT_ERR_INVALID, "%s of '%s': unknown mode %d", what, a->name, (int)mode);
        return NULL;
    }
    if (!(freq_base > 0.0f) || isinf(freq_base)) {
        lt_fail(LT_ERR_INVALID, "%s of '%s': frequency base %g", what, a->name, (double)freq_base);
        return NULL;
    }
    struct lt_tensor *t =
        lt_new_op_tensor(ctx, op, LT_TYPE_F32, 4, a->ne, (struct lt_tensor *[]){a, pos}, 2);
    if (!t)
        return NULL;
    lt_set_param_i32(t, 0, n_dims);
    lt_set_param_i32(t, 1, (int32_t)mode);
    lt_set_param_f32(t, 2, freq_base);
    return t;
}

struct lt_tensor *lt_rope(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *pos,
                          int n_dims, enum lt_rope_mode mode, float freq_base)
{
    return rope_new(ctx, LT_OP_ROPE, "rope", a, pos, n_dims, mode, freq_base);
}

struct lt_tensor *lt_rope_back(struct lt_ctx *ctx, struct lt_tensor *grad, struct lt_tensor *pos,
                               int n_dims, enum lt_rope_mode mode, float freq_base)
{
    return rope_new(ctx, LT_OP_ROPE_BACK, "rope_back", grad, pos, n_dims, mode, freq_base);
}

/* ---- CPU ---- */

static bool rope_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *pos = node->src[1];
    int n_dims = lt_get_param_i32(node, 0), mode = lt_get_param_i32(node, 1);
    if (a->type != LT_TYPE_F32 || !lt_same_shape(a, node)) {
        snprintf(reason, reason_size, "source 0 is not f32 of the result's shape");
        return false;
    }
    if (pos->type != LT_TYPE_I32 || lt_nelements(pos) != a->ne[2] || pos->ne[0] != a->ne[2]) {
        snprintf(reason, reason_size, "source 1 is not i32 [n_tokens]");
        return false;
    }
    if (n_dims <= 0 || n_dims % 2 || n_dims > a->ne[0] ||
        (mode != LT_ROPE_NORMAL && mode != LT_ROPE_NEOX)) {
        snprintf(reason, reason_size, "n_dims %d or mode %d is not valid", n_dims, mode);
        return false;
    }
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is not contiguous f32");
        return false;
    }
    return true;
}

/* per thread: inv_freq, cos, sin, n_dims / 2 each */
static size_t rope_work_size(const struct lt_tensor *node, int nth)
{
    return (size_t)nth * 3 * (size_t)(lt_get_param_i32(node, 0) / 2) * sizeof(float);
}

static void rope_run(const struct lt_compute_params *p, struct lt_tensor *node, bool inverse)
{
    const struct lt_tensor *a = node->src[0], *pos = node->src[1];
    int n_dims = lt_get_param_i32(node, 0), mode = lt_get_param_i32(node, 1);
    float base = lt_get_param_f32(node, 2);
    int64_t half = n_dims / 2, hd = a->ne[0];
    float *inv_freq = (float *)p->wdata + (size_t)p->ith * 3 * (size_t)half;
    float *cs = inv_freq + half, *sn = cs + half;
    for (int64_t j = 0; j < half; j++) {
        float e = (float)(2 * j) / (float)n_dims;
        inv_freq[j] = 1.0f / (float)pow((double)base, (double)e);
    }
    /* the adjoint of a rotation is the rotation the other way */
    float sign = inverse ? -1.0f : 1.0f;
    /* NEOX pairs (j, j + half), NORMAL pairs (2j, 2j + 1) */
    int64_t step = mode == LT_ROPE_NEOX ? 1 : 2, other = mode == LT_ROPE_NEOX ? half : 1;

    int64_t lo, hi, cur_i2 = -1;
    lt_split_range(lt_nrows(node), p->ith, p->nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % a->ne[1], i2 = (r / a->ne[1]) % a->ne[2], i3 = r / (a->ne[1] * a->ne[2]);
        if (i2 != cur_i2) {
            int32_t ps;
            memcpy(&ps, (const char *)pos->data + i2 * pos->nb[0], sizeof(ps));
            for (int64_t j = 0; j < half; j++) {
                float angle = (float)ps * inv_freq[j];
                cs[j] = (float)cos((double)angle);
                sn[j] = sign * (float)sin((double)angle);
            }
            cur_i2 = i2;
        }
        const char *row = (const char *)a->data + i1 * a->nb[1] + i2 * a->nb[2] + i3 * a->nb[3];
        float *y = (float *)node->data + r * hd;
        size_t s0 = a->nb[0];
        if (s0 == sizeof(float)) {
            memcpy(y, row, (size_t)hd * sizeof(float));
        } else {
            for (int64_t i = 0; i < hd; i++)
                memcpy(&y[i], row + i * s0, sizeof(float));
        }
        for (int64_t j = 0; j < half; j++) {
            float *p0 = &y[j * step], *p1 = p0 + other;
            float x0 = *p0, x1 = *p1;
            *p0 = x0 * cs[j] - x1 * sn[j];
            *p1 = x0 * sn[j] + x1 * cs[j];
        }
    }
}

static void rope_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    rope_run(p, node, false);
}

static void rope_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    rope_run(p, node, true);
}

/* ---- backward rule ---- */

static lt_status rope_rule(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0];
    if (!lt_ad_wants(ad, a))
        return LT_OK;
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad), *pos = lt_ad_contiguous(ad, node->src[1]);
    if (!g || !pos)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the gradient of '%s'", a->name);
    return lt_ad_add(ad, a,
                     lt_rope_back(lt_ad_ctx(ad), g, pos, lt_get_param_i32(node, 0),
                                  (enum lt_rope_mode)lt_get_param_i32(node, 1),
                                  lt_get_param_f32(node, 2)));
}

/* ---- RMS_NORM_ROPE: RMS_NORM (with its weight) and ROPE in one node; on the CPU the two
 * ops' own kernels, the norm into scratch, then the rotation out of it ---- */

struct lt_tensor *lt_rms_norm_rope(struct lt_ctx *ctx, struct lt_tensor *x, struct lt_tensor *w,
                                   float eps, struct lt_tensor *pos, int n_dims,
                                   enum lt_rope_mode mode, float freq_base)
{
    LT_REQUIRE("rms_norm_rope", x, w, pos);
    /* the two ops' checks, on the nodes the fused one stands for */
    struct lt_tensor *n = lt_rms_norm_mul(ctx, x, w, eps, LT_TYPE_F32);
    if (!n || !lt_rope(ctx, n, pos, n_dims, mode, freq_base))
        return NULL;
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_RMS_NORM_ROPE, LT_TYPE_F32, 4, x->ne,
                                           (struct lt_tensor *[]){x, w, pos}, 3);
    if (!t)
        return NULL;
    lt_set_param_i32(t, 0, n_dims);
    lt_set_param_i32(t, 1, (int32_t)mode);
    lt_set_param_f32(t, 2, freq_base);
    lt_set_param_f32(t, 3, eps);
    return t;
}

/* the RMS_NORM the node stands for, writing contiguous F32 at data */
static struct lt_tensor norm_part(const struct lt_tensor *node, void *data)
{
    struct lt_tensor t = *node;
    t.op = LT_OP_RMS_NORM;
    t.src[0] = node->src[0];
    t.src[1] = node->src[1];
    t.src[2] = NULL;
    memset(t.op_params, 0, sizeof(t.op_params));
    lt_set_param_f32(&t, 0, lt_get_param_f32(node, 3));
    t.view_src = NULL;
    t.view_offs = 0;
    t.data = data;
    return t;
}

/* the ROPE of that norm into the node */
static struct lt_tensor rope_part(const struct lt_tensor *node, struct lt_tensor *normed)
{
    struct lt_tensor t = *node;
    t.op = LT_OP_ROPE;
    t.src[0] = normed;
    t.src[1] = node->src[2];
    t.src[2] = NULL;
    lt_set_param_f32(&t, 3, 0.0f);
    return t;
}

static size_t normed_bytes(const struct lt_tensor *node)
{
    return ((size_t)lt_nelements(node) * sizeof(float) + 63) & ~(size_t)63;
}

static bool rms_norm_rope_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    struct lt_tensor n = norm_part(node, NULL);
    const struct lt_tensor r = rope_part(node, &n);
    const struct lt_op_def *nd = lt_op_def(LT_OP_RMS_NORM), *rd = lt_op_def(LT_OP_ROPE);
    if (!node->src[1] || !node->src[2]) {
        snprintf(reason, reason_size, "the weight or the positions are missing");
        return false;
    }
    return nd->cpu_supported(&n, reason, reason_size) && rd->cpu_supported(&r, reason, reason_size);
}

static size_t rms_norm_rope_work_size(const struct lt_tensor *node, int nth)
{
    struct lt_tensor n = norm_part(node, NULL);
    const struct lt_tensor r = rope_part(node, &n);
    const size_t a = lt_op_def(LT_OP_RMS_NORM)->cpu_work_size(&n, nth), b = rope_work_size(&r, nth);
    return normed_bytes(node) + (a > b ? a : b);
}

static void rms_norm_rope_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    struct lt_tensor n = norm_part(node, p->wdata);
    struct lt_tensor r = rope_part(node, &n);
    struct lt_compute_params q = *p;
    q.wdata = (char *)p->wdata + normed_bytes(node);
    q.wsize = p->wsize - normed_bytes(node);
    lt_op_def(LT_OP_RMS_NORM)->cpu_forward(&q, &n);
    lt_compute_barrier(p);
    rope_forward(&q, &r);
}

const struct lt_op_def lt_op_def_rms_norm_rope = {
    .name = "RMS_NORM_ROPE",
    .n_src = 3,
    .cpu_supported = rms_norm_rope_supported,
    .cpu_work_size = rms_norm_rope_work_size,
    .cpu_forward = rms_norm_rope_forward,
};

const struct lt_op_def lt_op_def_rope = {
    .name = "ROPE",
    .n_src = 2,
    .cpu_supported = rope_supported,
    .cpu_work_size = rope_work_size,
    .cpu_forward = rope_forward,
    .backward = rope_rule,
};

const struct lt_op_def lt_op_def_rope_back = {
    .name = "ROPE_BACK",
    .n_src = 2,
    .cpu_supported = rope_supported,
    .cpu_work_size = rope_work_size,
    .cpu_forward = rope_back_forward,
};
