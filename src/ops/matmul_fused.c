/* matmul_fused.c: a product and what a decode step does with its result next, in one node
 * (inference only, no backward rules; include/lathe/ops.h):
 *   - MUL_MAT_GLU (lt_mul_mat_glu): a stacked gate and up product and its SwiGLU;
 *   - MUL_MAT_ADD_RMS_NORM (lt_mul_mat_add_rms_norm): a product added to the residual
 *     stream and the weighted RMS norm of the sum (ADD_RMS_NORM's two halves);
 *   - RMS_NORM_MUL_MAT (lt_rms_norm_mul_mat): a product of the weighted RMS norm of its
 *     columns, or that product's SwiGLU (the norm a product ahead no longer takes).
 * The CPU kernels are MUL_MAT's own (the op table's entry, on a copy of the node writing the
 * whole product into scratch) followed by SWIGLU's value of the two halves, or by
 * ADD_RMS_NORM's kernel (again the op table's), so each equals its unfused chain bit for
 * bit. A device runs each in one kernel where it can (src/backend/cuda/matmul.cu). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/op.h"

struct lt_tensor *lt_mul_mat_glu(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b)
{
    LT_REQUIRE("mul_mat_glu", a, b);
    struct lt_tensor *checked = lt_mul_mat(ctx, a, b); /* the product's checks */
    if (!checked)
        return NULL;
    if (b->type != LT_TYPE_F32 || a->ne[1] % 2 != 0 || a->ne[2] != 1 || a->ne[3] != 1 ||
        b->ne[2] != 1 || b->ne[3] != 1) {
        lt_fail(LT_ERR_INVALID,
                "mul_mat_glu: '%s' [%lld, %lld, %lld, %lld] and '%s' (%s) [%lld, %lld, %lld, "
                "%lld]: it takes a 2-d weight of an even row count and 2-d f32 columns",
                a->name, (long long)a->ne[0], (long long)a->ne[1], (long long)a->ne[2],
                (long long)a->ne[3], b->name, lt_type_name(b->type), (long long)b->ne[0],
                (long long)b->ne[1], (long long)b->ne[2], (long long)b->ne[3]);
        return NULL;
    }
    int64_t ne[2] = {a->ne[1] / 2, b->ne[1]};
    return lt_new_op_tensor(ctx, LT_OP_MUL_MAT_GLU, LT_TYPE_F32, 2, ne,
                            (struct lt_tensor *[]){a, b}, 2);
}

/* ---- the product both run first: [M, N] (M = a's rows, N = b's columns) into scratch,
 * by MUL_MAT's kernel on a copy of the node that writes there ---- */

struct lt_tensor lt_fused_product(const struct lt_tensor *node, void *data)
{
    struct lt_tensor t = *node;
    t.op = LT_OP_MUL_MAT;
    for (int i = 2; i < LT_MAX_SRC; i++)
        t.src[i] = NULL;
    t.view_src = NULL;
    t.view_offs = 0;
    t.data = data;
    t.ne[0] = node->src[0]->ne[1];
    t.ne[1] = node->src[1]->ne[1];
    t.ne[2] = t.ne[3] = 1;
    t.nb[0] = sizeof(float);
    for (int i = 1; i < LT_MAX_DIMS; i++)
        t.nb[i] = t.nb[i - 1] * (size_t)t.ne[i - 1];
    return t;
}

static size_t product_bytes(const struct lt_tensor *node)
{
    const struct lt_tensor t = lt_fused_product(node, NULL);
    return ((size_t)lt_nelements(&t) * sizeof(float) + 63) & ~(size_t)63;
}

static bool product_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor t = lt_fused_product(node, NULL);
    return lt_op_def(LT_OP_MUL_MAT)->cpu_supported(&t, reason, reason_size);
}

/* MUL_MAT's scratch after the product's own */
static size_t product_work_size(const struct lt_tensor *node, int nth)
{
    const struct lt_tensor t = lt_fused_product(node, NULL);
    return product_bytes(node) + lt_op_def(LT_OP_MUL_MAT)->cpu_work_size(&t, nth);
}

/* the product into the start of the scratch (every thread takes part; returns after the
 * barrier), and the parameters of what follows: the scratch after it */
static float *product_run(const struct lt_compute_params *prm, const struct lt_tensor *node,
                          struct lt_compute_params *rest)
{
    float *prod = (float *)prm->wdata;
    struct lt_tensor t = lt_fused_product(node, prod);
    *rest = *prm;
    rest->wdata = (char *)prm->wdata + product_bytes(node);
    rest->wsize = prm->wsize - product_bytes(node);
    lt_op_def(LT_OP_MUL_MAT)->cpu_forward(rest, &t);
    lt_compute_barrier(prm);
    return prod;
}

/* ---- MUL_MAT_GLU on the CPU: the product [2 H, N], then SWIGLU's value of its halves ---- */

static bool mul_mat_glu_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    if (b->type != LT_TYPE_F32 || a->ne[1] != 2 * node->ne[0] || node->ne[1] != b->ne[1] ||
        lt_nelements(node) != node->ne[0] * node->ne[1] || a->ne[2] != 1 || a->ne[3] != 1 ||
        b->ne[2] != 1 || b->ne[3] != 1) {
        snprintf(reason, reason_size,
                 "the sources and result do not fit (a 2-d weight of 2 H rows, 2-d f32 columns, "
                 "[H, N] out)");
        return false;
    }
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is not contiguous f32");
        return false;
    }
    return product_supported(node, reason, reason_size);
}

/* the node's [H, N] = SWIGLU's value (unary.c) of the halves of the product [2 H, N] at prod,
 * this thread's share */
static void glu_of_halves(const struct lt_compute_params *prm, struct lt_tensor *node,
                          const float *prod)
{
    const int64_t H = node->ne[0];
    int64_t lo, hi;
    lt_split_range(lt_nelements(node), prm->ith, prm->nth, &lo, &hi);
    float *y = (float *)node->data;
    for (int64_t i = lo; i < hi; i++) {
        const float *col = prod + (i / H) * 2 * H;
        const float g = col[i % H], u = col[H + i % H];
        y[i] = g / (1.0f + expf(-g)) * u;
    }
}

static void mul_mat_glu_forward(const struct lt_compute_params *prm, struct lt_tensor *node)
{
    struct lt_compute_params rest;
    glu_of_halves(prm, node, product_run(prm, node, &rest));
}

/* inference only: no backward rule */
const struct lt_op_def lt_op_def_mul_mat_glu = {
    .name = "MUL_MAT_GLU",
    .n_src = 2,
    .cpu_supported = mul_mat_glu_supported,
    .cpu_work_size = product_work_size,
    .cpu_forward = mul_mat_glu_forward,
};

/* ---- MUL_MAT_ADD_RMS_NORM ---- */

struct lt_tensor *lt_mul_mat_add_rms_norm(struct lt_ctx *ctx, struct lt_tensor *a,
                                          struct lt_tensor *b, struct lt_tensor *x,
                                          struct lt_tensor *w, float eps)
{
    LT_REQUIRE("mul_mat_add_rms_norm", a, b, x, w);
    if (b->type != LT_TYPE_F32 || a->ne[2] != 1 || a->ne[3] != 1 || b->ne[2] != 1 ||
        b->ne[3] != 1) {
        lt_fail(LT_ERR_INVALID,
                "mul_mat_add_rms_norm: '%s' [%lld, %lld, %lld, %lld] and '%s' (%s): it takes a "
                "2-d weight and 2-d f32 columns",
                a->name, (long long)a->ne[0], (long long)a->ne[1], (long long)a->ne[2],
                (long long)a->ne[3], b->name, lt_type_name(b->type));
        return NULL;
    }
    struct lt_tensor *prod = lt_mul_mat(ctx, a, b); /* the product's checks */
    if (!prod)
        return NULL;
    /* ADD_RMS_NORM's checks of the residual, the weight and eps, on the product's shape */
    struct lt_tensor *checked = lt_add_rms_norm(ctx, x, prod, w, eps);
    if (!checked)
        return NULL;
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_MUL_MAT_ADD_RMS_NORM, LT_TYPE_F32, 3,
                                           checked->ne, (struct lt_tensor *[]){a, b, x, w}, 4);
    if (t)
        lt_set_param_f32(t, 0, eps);
    return t;
}

struct lt_tensor lt_fused_add_norm(const struct lt_tensor *node, void *prod, struct lt_tensor *p)
{
    *p = lt_fused_product(node, prod);
    p->op = LT_OP_NONE;
    for (int i = 0; i < LT_MAX_SRC; i++)
        p->src[i] = NULL;
    struct lt_tensor t = *node;
    t.op = LT_OP_ADD_RMS_NORM;
    for (int i = 0; i < LT_MAX_SRC; i++)
        t.src[i] = NULL;
    t.src[0] = node->src[2];
    t.src[1] = p;
    t.src[2] = node->src[3];
    return t;
}

static bool mul_mat_add_rms_norm_supported(const struct lt_tensor *node, char *reason,
                                           size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    if (b->type != LT_TYPE_F32 || a->ne[2] != 1 || a->ne[3] != 1 || b->ne[2] != 1 ||
        b->ne[3] != 1 || node->ne[0] != a->ne[1] || node->ne[1] != b->ne[1]) {
        snprintf(reason, reason_size,
                 "the sources and result do not fit (a 2-d weight of M rows, 2-d f32 columns, "
                 "[M, N, 2] out)");
        return false;
    }
    struct lt_tensor p;
    const struct lt_tensor t = lt_fused_add_norm(node, NULL, &p);
    return product_supported(node, reason, reason_size) &&
           lt_op_def(LT_OP_ADD_RMS_NORM)->cpu_supported(&t, reason, reason_size);
}

static size_t mul_mat_add_rms_norm_work_size(const struct lt_tensor *node, int nth)
{
    struct lt_tensor p;
    const struct lt_tensor t = lt_fused_add_norm(node, NULL, &p);
    const size_t prod = product_work_size(node, nth),
                 norm = product_bytes(node) + lt_op_def(LT_OP_ADD_RMS_NORM)->cpu_work_size(&t, nth);
    return prod > norm ? prod : norm;
}

static void mul_mat_add_rms_norm_forward(const struct lt_compute_params *prm,
                                         struct lt_tensor *node)
{
    struct lt_compute_params rest;
    float *prod = product_run(prm, node, &rest);
    struct lt_tensor p, t = lt_fused_add_norm(node, prod, &p);
    lt_op_def(LT_OP_ADD_RMS_NORM)->cpu_forward(&rest, &t);
}

/* inference only: no backward rule */
const struct lt_op_def lt_op_def_mul_mat_add_rms_norm = {
    .name = "MUL_MAT_ADD_RMS_NORM",
    .n_src = 4,
    .cpu_supported = mul_mat_add_rms_norm_supported,
    .cpu_work_size = mul_mat_add_rms_norm_work_size,
    .cpu_forward = mul_mat_add_rms_norm_forward,
};

/* ---- RMS_NORM_MUL_MAT ---- */

struct lt_tensor *lt_rms_norm_mul_mat(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *x,
                                      struct lt_tensor *w, float eps, bool glu)
{
    LT_REQUIRE("rms_norm_mul_mat", a, x, w);
    if (x->type != LT_TYPE_F32 || a->ne[2] != 1 || a->ne[3] != 1 || x->ne[2] != 1 ||
        x->ne[3] != 1 || (glu && a->ne[1] % 2 != 0)) {
        lt_fail(LT_ERR_INVALID,
                "rms_norm_mul_mat: '%s' [%lld, %lld, %lld, %lld] and '%s' (%s): it takes a "
                "2-d weight (of an even row count for glu) and 2-d f32 columns",
                a->name, (long long)a->ne[0], (long long)a->ne[1], (long long)a->ne[2],
                (long long)a->ne[3], x->name, lt_type_name(x->type));
        return NULL;
    }
    /* the norm's checks (the weight), then the product's, on the normed columns' shape */
    struct lt_tensor *h = lt_rms_norm_mul(ctx, x, w, eps, LT_TYPE_F32);
    if (!h || !lt_mul_mat(ctx, a, h))
        return NULL;
    int64_t ne[2] = {glu ? a->ne[1] / 2 : a->ne[1], x->ne[1]};
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_RMS_NORM_MUL_MAT, LT_TYPE_F32, 2, ne,
                                           (struct lt_tensor *[]){a, x, w}, 3);
    if (t) {
        lt_set_param_f32(t, 0, eps);
        lt_set_param_i32(t, 1, glu ? 1 : 0);
    }
    return t;
}

struct lt_tensor lt_fused_norm(const struct lt_tensor *node, void *data)
{
    const struct lt_tensor *x = node->src[1];
    struct lt_tensor t = *node;
    t.op = LT_OP_RMS_NORM;
    for (int i = 0; i < LT_MAX_SRC; i++)
        t.src[i] = NULL;
    t.src[0] = node->src[1];
    t.src[1] = node->src[2];
    t.view_src = NULL;
    t.view_offs = 0;
    t.data = data;
    t.type = LT_TYPE_F32;
    for (int i = 0; i < LT_MAX_DIMS; i++)
        t.ne[i] = i < 2 ? x->ne[i] : 1;
    t.nb[0] = sizeof(float);
    for (int i = 1; i < LT_MAX_DIMS; i++)
        t.nb[i] = t.nb[i - 1] * (size_t)t.ne[i - 1];
    memset(t.op_params, 0, sizeof(t.op_params));
    lt_set_param_f32(&t, 0, lt_get_param_f32(node, 0));
    return t;
}

struct lt_tensor lt_fused_norm_product(const struct lt_tensor *node, struct lt_tensor *h,
                                       void *data)
{
    struct lt_tensor p = lt_fused_product(node, data);
    p.src[1] = h;
    return p;
}

static size_t bytes64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* scratch: the normed columns, the product [M, N] (glu), then the larger of the norm's and
 * the product's own */
static size_t normed_bytes(const struct lt_tensor *node)
{
    return bytes64((size_t)node->src[1]->ne[0] * (size_t)node->src[1]->ne[1] * sizeof(float));
}

static size_t rms_norm_mul_mat_prod_bytes(const struct lt_tensor *node)
{
    return lt_get_param_i32(node, 1) ? product_bytes(node) : 0;
}

static bool rms_norm_mul_mat_supported(const struct lt_tensor *node, char *reason,
                                       size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *x = node->src[1];
    const bool glu = lt_get_param_i32(node, 1) != 0;
    if (x->type != LT_TYPE_F32 || a->ne[2] != 1 || a->ne[3] != 1 || x->ne[2] != 1 ||
        x->ne[3] != 1 || node->ne[0] * (glu ? 2 : 1) != a->ne[1] || node->ne[1] != x->ne[1]) {
        snprintf(reason, reason_size,
                 "the sources and result do not fit (a 2-d weight of M rows, 2-d f32 columns, "
                 "[M, N] or [M / 2, N] out)");
        return false;
    }
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is not contiguous f32");
        return false;
    }
    struct lt_tensor h = lt_fused_norm(node, NULL);
    const struct lt_tensor p = lt_fused_norm_product(node, &h, NULL);
    return lt_op_def(LT_OP_RMS_NORM)->cpu_supported(&h, reason, reason_size) &&
           lt_op_def(LT_OP_MUL_MAT)->cpu_supported(&p, reason, reason_size);
}

static size_t rms_norm_mul_mat_work_size(const struct lt_tensor *node, int nth)
{
    struct lt_tensor h = lt_fused_norm(node, NULL);
    const struct lt_tensor p = lt_fused_norm_product(node, &h, NULL);
    const size_t norm = lt_op_def(LT_OP_RMS_NORM)->cpu_work_size(&h, nth),
                 prod = lt_op_def(LT_OP_MUL_MAT)->cpu_work_size(&p, nth);
    return normed_bytes(node) + rms_norm_mul_mat_prod_bytes(node) + (norm > prod ? norm : prod);
}

static void rms_norm_mul_mat_forward(const struct lt_compute_params *prm, struct lt_tensor *node)
{
    const bool glu = lt_get_param_i32(node, 1) != 0;
    const size_t skip = normed_bytes(node) + rms_norm_mul_mat_prod_bytes(node);
    struct lt_compute_params rest = *prm;
    rest.wdata = (char *)prm->wdata + skip;
    rest.wsize = prm->wsize - skip;
    struct lt_tensor h = lt_fused_norm(node, prm->wdata);
    lt_op_def(LT_OP_RMS_NORM)->cpu_forward(&rest, &h);
    lt_compute_barrier(prm);
    float *prod = glu ? (float *)((char *)prm->wdata + normed_bytes(node)) : (float *)node->data;
    struct lt_tensor p = lt_fused_norm_product(node, &h, prod);
    lt_op_def(LT_OP_MUL_MAT)->cpu_forward(&rest, &p);
    if (!glu)
        return;
    lt_compute_barrier(prm);
    glu_of_halves(prm, node, prod);
}

/* inference only: no backward rule */
const struct lt_op_def lt_op_def_rms_norm_mul_mat = {
    .name = "RMS_NORM_MUL_MAT",
    .n_src = 3,
    .cpu_supported = rms_norm_mul_mat_supported,
    .cpu_work_size = rms_norm_mul_mat_work_size,
    .cpu_forward = rms_norm_mul_mat_forward,
};
