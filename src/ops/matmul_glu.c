/* matmul_glu.c: MUL_MAT_GLU (inference only), a stacked gate and up product and its SwiGLU
 * in one node (lt_mul_mat_glu, include/lathe/ops.h). The CPU kernel is MUL_MAT's own (the op
 * table's entry, on a copy of the node writing the whole product into scratch) followed by
 * SWIGLU's value of the two halves, so it equals the unfused chain bit for bit. A device
 * runs it in one kernel where it can (src/backend/cuda/matmul.cu). */
#include <math.h>
#include <stdio.h>

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

/* ---- MUL_MAT_GLU on the CPU: the product [2 H, N] into scratch (MUL_MAT's kernel, on a
 * copy of the node that writes there), then SWIGLU's value of its halves ---- */

/* the node as the MUL_MAT writing its whole [2 H, N] product, contiguous, at `data` */
static struct lt_tensor glu_product_of(const struct lt_tensor *node, void *data)
{
    struct lt_tensor t = *node;
    t.op = LT_OP_MUL_MAT;
    t.src[2] = NULL;
    t.view_src = NULL;
    t.view_offs = 0;
    t.data = data;
    t.ne[0] = node->src[0]->ne[1];
    t.nb[0] = sizeof(float);
    for (int i = 1; i < LT_MAX_DIMS; i++)
        t.nb[i] = t.nb[i - 1] * (size_t)t.ne[i - 1];
    return t;
}

static size_t glu_product_bytes(const struct lt_tensor *node)
{
    return ((size_t)lt_nelements(node) * 2 * sizeof(float) + 63) & ~(size_t)63;
}

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
    const struct lt_tensor t = glu_product_of(node, NULL);
    return lt_op_def(LT_OP_MUL_MAT)->cpu_supported(&t, reason, reason_size);
}

static size_t mul_mat_glu_work_size(const struct lt_tensor *node, int nth)
{
    const struct lt_tensor t = glu_product_of(node, NULL);
    return glu_product_bytes(node) + lt_op_def(LT_OP_MUL_MAT)->cpu_work_size(&t, nth);
}

static void mul_mat_glu_forward(const struct lt_compute_params *prm, struct lt_tensor *node)
{
    float *prod = (float *)prm->wdata;
    struct lt_tensor t = glu_product_of(node, prod);
    struct lt_compute_params q = *prm;
    q.wdata = (char *)prm->wdata + glu_product_bytes(node);
    q.wsize = prm->wsize - glu_product_bytes(node);
    lt_op_def(LT_OP_MUL_MAT)->cpu_forward(&q, &t);
    lt_compute_barrier(prm);
    const int64_t H = node->ne[0];
    int64_t lo, hi;
    lt_split_range(lt_nelements(node), prm->ith, prm->nth, &lo, &hi);
    float *y = (float *)node->data;
    for (int64_t i = lo; i < hi; i++) {
        const float *col = prod + (i / H) * 2 * H;
        const float g = col[i % H], u = col[H + i % H];
        y[i] = g / (1.0f + expf(-g)) * u; /* SWIGLU's value (unary.c) */
    }
}

/* inference only: no backward rule */
const struct lt_op_def lt_op_def_mul_mat_glu = {
    .name = "MUL_MAT_GLU",
    .n_src = 2,
    .cpu_supported = mul_mat_glu_supported,
    .cpu_work_size = mul_mat_glu_work_size,
    .cpu_forward = mul_mat_glu_forward,
};
