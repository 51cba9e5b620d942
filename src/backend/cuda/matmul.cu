/* matmul.cu: MUL_MAT on the device through cuBLAS.
 *
 * dst[m, n, i2, i3] = sum_k a[k, m, i2 / r2, i3 / r3] * b[k, n, i2, i3] (r2 = B2 / A2, r3 =
 * B3 / A3: consecutive b heads share one a head, as grouped-query attention does). In
 * cuBLAS's column-major terms one slice is C (M x N, ldc = M) = op(A) op(B), with a's
 * column m at stride nb1 (A transposed) or, for a transposed view, its rows as columns.
 *
 * The compute type of A and B (ct) follows a:
 *   - F32 a: F32 b, CUBLAS_COMPUTE_32F (no TF32: the CPU's float32 results within 1e-5);
 *   - F16 / BF16 a: b converted to a's type, tensor cores with F32 accumulation and an F32
 *     result (b is rounded to a's precision: ~1e-6 normalised error for BF16); a b already
 *     of a's type (the model's prefill activations, written so by the op producing them)
 *     is read as it is, which saves the conversion kernel;
 *   - quantised a: dequantised to F16 in tiles of rows (dequant_a_kernel, 32 elements a
 *     thread), b converted to F16, as for F16
 *     (an activation beyond F16's range, 65504, would become inf).
 * a is used in place when its type is ct and one of its two inner strides is one element;
 * otherwise (other strides, or quantised) it is converted tile by tile into scratch, at
 * most TILE_BYTES at a time, each tile's products queued before the next tile overwrites
 * it (one stream keeps them in order). b is used in place when it is of type ct and one of
 * its inner strides is one element, else converted whole into scratch.
 *
 * Few columns (N <= MMV_MAX_N: decode) with a quantised a, or an F16 / BF16 a of at most
 * MMV_HALF_MAX_BYTES, take kernels of our own instead (mmv.cu): they read a's rows once, in
 * their own type, and sum their products with the F32 columns of b in F32, converting
 * nothing into scratch (a dequantised weight would be written and read back whole) and
 * rounding nothing (the tensor-core path rounds b). They read F32 b only: a half b (which
 * the model does not feed them: batches of 8 tokens or fewer keep F32 activations) goes to
 * cuBLAS in place. Measured on an H200 with one token: the 1024x248320 output head took 287
 * us there against cuBLAS's 137 us, hence the size limit for half weights (32 MiB: the 0.8B
 * model's stacked DeltaNet input projections, 16.8 MB, took three kernels through cuBLAS,
 * b's conversion, the product and a split-K reduction, ~15 us); quantised weights have no
 * cheaper path (dequantising a whole Q8_0 head into scratch costs more than mmv's 1.0 ms).
 *
 * Q8_0 (and Q4_0, Q5_0) weights on that path go further by default (mmvq.cu): b's columns
 * are quantised once to int8 blocks of 32 (the CPU's LATHE_MATMUL_DOT=int8 rounding, bit
 * for bit) and each output is a sum of __dp4a integer dots scaled once per block, as
 * llama.cpp's mmvq does: 1.25 bytes of activation an element to read per weight row
 * instead of 4, four multiply-adds an instruction. It rounds the activations (error
 * bounded in core/quant_dot.h, ~1e-5 normalised for random data); LATHE_CUDA_MMVQ=0 keeps
 * the F32-activation mmv kernels, and so does a node autodiff differentiates (node->grad),
 * as on the CPU.
 *
 * Batches: for each i3, one strided-batched product over i2 when r2 == 1; when r2 > 1 the
 * r2 b slices of a head are folded into one product of N * r2 columns where they lie at
 * one stride (decode, or a converted b), else one strided-batched product per a head with
 * A's stride 0. The plan, the choice of mmv and mmvq included, is a pure function of the
 * node (and of LATHE_CUDA_MMVQ, read once), so the precondition and the launcher make the
 * same one. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/mmv.cuh"
#include "backend/cuda/mmvq.cuh"
#include "backend/cuda/quant.cuh"
#include "lathe/ops.h"

static const enum lt_op matmul_ops[] = {LT_OP_MUL_MAT, LT_OP_MUL_MAT_ACC, LT_OP_MUL_MAT_GLU,
                                        LT_OP_MUL_MAT_ADD_RMS_NORM, LT_OP_RMS_NORM_MUL_MAT};

#define TILE_BYTES ((size_t)64 << 20)
#define MMV_MAX_N 8
#define MMV_HALF_MAX_BYTES ((int64_t)32 << 20)
static_assert(MMV_MAX_N <= CU_MMVQ_MAX_N, "mmvq takes every column count mmv does");

struct cu_mm_plan {
    int64_t K, M, N, A2, A3, B2, B3, r2, r3;
    enum lt_type ct; /* element type of A and B as cuBLAS reads them */
    size_t es;       /* its size */
    bool a_direct;
    cublasOperation_t op_a;
    int64_t lda, sa2, sa3; /* in elements (direct a) */
    bool b_direct;
    cublasOperation_t op_b;
    int64_t ldb, sb2, sb3; /* in elements, of b or of its converted copy */
    bool fold;             /* the r2 b slices of a head lie at one stride */
    bool b_flat;           /* b converted in its own memory order (b_flat_ok), not to [K, N] */
    int64_t tile;          /* rows of a per converted tile */
    bool mmv;              /* few columns: our own kernel, not cuBLAS (use_mmv) */
    bool mmvq;             /* of which Q8_0 / Q4_0 / Q5_0 a meets int8 activations (mmvq.cu) */
    float beta;            /* 1 for MUL_MAT_ACC (the result, c's storage, is added to), else 0 */
    float alpha;           /* the product's factor: MUL_MAT_ACC's alpha, else 1 */
};

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* one column of one slice: a decode step's single sequence */
static bool one_column(const struct cu_mm_plan *p)
{
    return p->N == 1 && p->A2 == 1 && p->A3 == 1 && p->B2 == 1 && p->B3 == 1;
}

static cudaDataType_t cuda_type(enum lt_type t)
{
    return t == LT_TYPE_F16 ? CUDA_R_16F : t == LT_TYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* A matrix of `cols` columns of `rows` elements, element stride s0 and column stride s1
 * (bytes): can cuBLAS read it as it is (false: op N, true: op T via *trans)? */
static bool direct_ld(int64_t rows, int64_t cols, size_t s0, size_t s1, size_t es,
                      bool *trans_out, int64_t *ld)
{
    /* columns of unit-strided elements */
    if (s0 == es && (cols <= 1 || (s1 % es == 0 && (int64_t)(s1 / es) >= rows))) {
        *trans_out = false;
        *ld = cols <= 1 ? (rows > 1 ? rows : 1) : (int64_t)(s1 / es);
        return fits_int(*ld);
    }
    /* rows of unit-strided elements: the matrix transposed */
    if (s1 == es && cols > 1 && (rows <= 1 || (s0 % es == 0 && (int64_t)(s0 / es) >= cols))) {
        *trans_out = true;
        *ld = rows <= 1 ? cols : (int64_t)(s0 / es);
        return fits_int(*ld);
    }
    return false;
}

/* An F32 b that a half product converts: when it is one matrix whose elements fill its
 * memory span exactly (contiguous, or a transposed view of a contiguous matrix: the weight
 * gradients' g^T in training), it is converted in its own memory order by a flat kernel and
 * cuBLAS reads the copy with b's own orientation (strides halved). Converting it to [K, N]
 * read a transposed b 8192 rows apart a warp (~0.3 ms of the 0.5 ms of a Qwen3.5-0.8B
 * [6144 x 1024] weight gradient over 16 x 512 tokens). */
static bool b_flat_ok(const struct lt_tensor *b, const struct cu_mm_plan *p)
{
    if (b->type != LT_TYPE_F32 || p->ct == LT_TYPE_F32 || b->ne[2] != 1 || b->ne[3] != 1 ||
        p->K < 2 || p->N < 2)
        return false;
    return (b->nb[0] == 4 && b->nb[1] == 4 * (size_t)b->ne[0]) ||
           (b->nb[1] == 4 && b->nb[0] == 4 * (size_t)b->ne[1]);
}

/* few columns (see the file comment): a's shape and type only, never its data */
static bool use_mmv(const struct lt_tensor *a, const struct lt_tensor *b, const struct cu_mm_plan *p)
{
    if (p->N > MMV_MAX_N || a->type == LT_TYPE_F32 || b->type != LT_TYPE_F32)
        return false;
    return lt_type_traits(a->type)->is_quantized ||
           p->K * p->M * p->A2 * p->A3 * 2 <= MMV_HALF_MAX_BYTES;
}

static bool cu_mm_plan_make(const struct lt_tensor *node, struct cu_mm_plan *p, char *reason,
                            size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const struct lt_type_traits *ta = lt_type_traits(a->type);
    memset(p, 0, sizeof(*p));
    p->alpha = 1.0f;
    p->K = a->ne[0];
    p->M = a->ne[1];
    p->N = b->ne[1];
    p->A2 = a->ne[2];
    p->A3 = a->ne[3];
    p->B2 = b->ne[2];
    p->B3 = b->ne[3];
    if (p->A2 == 0 || p->A3 == 0 || p->K != b->ne[0] || p->B2 % p->A2 || p->B3 % p->A3 ||
        node->ne[0] != p->M || node->ne[1] != p->N || node->ne[2] != p->B2 ||
        node->ne[3] != p->B3) {
        snprintf(reason, reason_size, "the shapes of the sources and result do not fit");
        return false;
    }
    p->r2 = p->B2 / p->A2;
    p->r3 = p->B3 / p->A3;
    if (!fits_int(p->K) || !fits_int(p->M) || !fits_int(p->N) || !fits_int(p->B2)) {
        snprintf(reason, reason_size, "a matrix dimension exceeds what cuBLAS takes (2^31 - 1)");
        return false;
    }
    p->ct = ta->is_quantized ? LT_TYPE_F16 : a->type;
    p->es = p->ct == LT_TYPE_F32 ? 4 : 2;

    /* a: K x M, column m at nb1 (op T), or its transpose (op N) */
    bool trans;
    p->a_direct = a->type == p->ct && direct_ld(p->K, p->M, a->nb[0], a->nb[1], p->es, &trans,
                                                &p->lda);
    if (p->a_direct) {
        p->op_a = trans ? CUBLAS_OP_N : CUBLAS_OP_T;
        p->sa2 = (int64_t)(a->nb[2] / p->es);
        p->sa3 = (int64_t)(a->nb[3] / p->es);
    } else {
        int64_t t = (int64_t)(TILE_BYTES / (p->es * (size_t)(p->K > 0 ? p->K : 1)));
        if (t > 64)
            t -= t % 64;
        p->tile = t < 1 ? 1 : t > p->M ? (p->M > 0 ? p->M : 1) : t;
        p->op_a = CUBLAS_OP_T;
        p->lda = p->K > 0 ? p->K : 1;
    }

    /* b: K x N, column n at nb1 (op N), or its transpose (op T) */
    p->b_direct = b->type == p->ct && direct_ld(p->K, p->N, b->nb[0], b->nb[1], p->es, &trans,
                                                &p->ldb);
    if (p->b_direct) {
        p->op_b = trans ? CUBLAS_OP_T : CUBLAS_OP_N;
        p->sb2 = (int64_t)(b->nb[2] / p->es);
        p->sb3 = (int64_t)(b->nb[3] / p->es);
    } else if (b_flat_ok(b, p) && direct_ld(p->K, p->N, b->nb[0] / 4 * p->es,
                                            b->nb[1] / 4 * p->es, p->es, &trans, &p->ldb)) {
        p->b_flat = true;
        p->op_b = trans ? CUBLAS_OP_T : CUBLAS_OP_N;
        p->sb2 = p->sb3 = p->K * p->N;
    } else {
        p->op_b = CUBLAS_OP_N;
        p->ldb = p->K > 0 ? p->K : 1;
        p->sb2 = p->K * p->N;
        p->sb3 = p->sb2 * p->B2;
    }
    p->fold = p->r2 > 1 && p->op_b == CUBLAS_OP_N &&
              (p->N == 1 ? p->sb2 == p->ldb : p->sb2 == p->N * p->ldb) && fits_int(p->N * p->r2);
    /* MUL_MAT_ACC adds into its result through cuBLAS's beta, or for one column (one slice)
     * of F16 / BF16 rows through mmv_half_kernel's epilogue, of Q8_0 / Q4_0 / Q5_0 rows
     * through mmvq's (a decode step's output and down projections added to the residual,
     * whose norm the product after takes: RMS_NORM_MUL_MAT) */
    const struct cu_mmv_shape ms = {p->K, p->M, p->N, p->A2, p->A3, p->B2, p->B3, p->r2, p->r3};
    p->alpha = lt_mul_mat_acc_alpha(node); /* a scaled product: cuBLAS's alpha alone */
    p->mmv = use_mmv(a, b, p) && p->alpha == 1.0f &&
             (node->op != LT_OP_MUL_MAT_ACC || cu_mmv_norm_takes(&ms, a, b) ||
              (!node->grad && one_column(p) && cu_mmvq_takes(a->type, p->K)));
    /* a node autodiff differentiates keeps F32 activations, as on the CPU (src/ops/matmul.c:
     * its loss and gradients are the F32 ones; a forward piecewise constant in b would
     * defeat finite differences) */
    p->mmvq = p->mmv && !node->grad && cu_mmvq_takes(a->type, p->K);
    p->beta = node->op == LT_OP_MUL_MAT_ACC ? 1.0f : 0.0f;
    return true;
}

/* The precondition, and the plan when it holds (the launcher runs on that same plan). */
static bool cu_mm_supported_plan(const struct lt_tensor *node, struct cu_mm_plan *p, char *reason,
                                 size_t reason_size)
{
    if (node->op != LT_OP_MUL_MAT && node->op != LT_OP_MUL_MAT_ACC) {
        snprintf(reason, reason_size, "%s is not a matrix product", lt_op_name(node->op));
        return false;
    }
    /* MUL_MAT_ACC: the result is c's storage, added to by cuBLAS (beta = 1) */
    const struct lt_tensor *c = node->op == LT_OP_MUL_MAT_ACC ? node->src[2] : NULL;
    if (node->op == LT_OP_MUL_MAT_ACC) {
        if (!cu_check_source(node, 2, CU_TYPES_F32, reason, reason_size))
            return false;
        if (!lt_is_contiguous(c) || !lt_same_shape(c, node) ||
            node->view_src != lt_storage_root((struct lt_tensor *)c)) {
            snprintf(reason, reason_size,
                     "source 2 is not the contiguous f32 the result is written over");
            return false;
        }
    }
    /* b is F32, or F16 / BF16 when a is of that same type */
    const enum lt_type ta = node->src[0]->type, tb = node->src[1]->type;
    const uint64_t b_types = CU_TYPES_F32 | ((ta == LT_TYPE_F16 || ta == LT_TYPE_BF16) && tb == ta
                                                 ? CU_TYPE_BIT(ta)
                                                 : 0);
    if (!cu_check_source(node, 0, CU_TYPES_FLOAT | CU_TYPES_QUANT, reason, reason_size) ||
        !cu_check_source(node, 1, b_types, reason, reason_size))
        return false;
    if (node->type == LT_TYPE_F32)
        return cu_check_result_f32(node, reason, reason_size) &&
               cu_mm_plan_make(node, p, reason, reason_size);
    /* a half result (lt_mul_mat_as): one cuBLAS product of operands of its type as they lie,
     * writing it rounded (a training step's FFN gate and up) */
    const bool half = node->op == LT_OP_MUL_MAT && (ta == LT_TYPE_F16 || ta == LT_TYPE_BF16) &&
                      tb == ta && node->type == ta && lt_is_contiguous(node) &&
                      cu_mm_plan_make(node, p, reason, reason_size) && p->a_direct && p->b_direct &&
                      !p->mmv && p->A2 == 1 && p->A3 == 1 && p->B2 == 1 && p->B3 == 1;
    if (!half)
        snprintf(reason, reason_size,
                 "a %s result takes one product of 2-d %s operands that cuBLAS reads as they lie",
                 lt_type_name(node->type), lt_type_name(node->type));
    return half;
}

/* ---- MUL_MAT_GLU: a stacked gate and up product [2 H, N] and its SwiGLU [H, N] ----
 * One kernel (cu_mmv_glu_run: both rows of an output in one warp team, its SwiGLU in the
 * epilogue) where the product's plan takes mmv and cu_mmv_glu_takes holds (a decode step's
 * F16 / BF16 FFN); otherwise the product into scratch by this file's own launcher, then
 * SWIGLU over its halves by unary.cu's (so whatever MUL_MAT and SWIGLU take, this takes). */

/* the SWIGLU of the product's halves (lt_fused_product) into the node (*gate and *up: the
 * halves' views) */
static struct lt_tensor glu_swiglu(const struct lt_tensor *node, const struct lt_tensor *prod,
                                   struct lt_tensor *gate, struct lt_tensor *up)
{
    const int64_t H = node->ne[0];
    *gate = *prod;
    gate->ne[0] = H;
    gate->op = LT_OP_NONE;
    gate->src[0] = gate->src[1] = NULL;
    *up = *gate;
    up->data = prod->data ? (char *)prod->data + H * sizeof(float) : NULL;
    struct lt_tensor sw = *node;
    sw.op = LT_OP_SWIGLU;
    sw.src[0] = gate;
    sw.src[1] = up;
    sw.src[2] = NULL;
    lt_set_param_i32(&sw, 0, LT_GLU_SILU);
    return sw;
}

/* the claim's and the launcher's precondition; *p is the product's plan */
static bool glu_supported_plan(const struct lt_tensor *node, struct cu_mm_plan *p, char *reason,
                               size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    if (!a || !b || b->type != LT_TYPE_F32 || a->ne[1] != 2 * node->ne[0] ||
        node->ne[1] != b->ne[1] || a->ne[2] != 1 || a->ne[3] != 1 || b->ne[2] != 1 ||
        b->ne[3] != 1 || node->ne[2] != 1 || node->ne[3] != 1) {
        snprintf(reason, reason_size,
                 "the sources and result do not fit (a 2-d weight of 2 H rows, 2-d f32 columns, "
                 "[H, N] out)");
        return false;
    }
    if (!cu_check_result_f32(node, reason, reason_size))
        return false;
    const struct lt_tensor t = lt_fused_product(node, NULL);
    if (!cu_mm_supported_plan(&t, p, reason, reason_size))
        return false;
    struct lt_tensor gate, up;
    const struct lt_tensor sw = glu_swiglu(node, &t, &gate, &up);
    return cu_unary_supported(&sw, reason, reason_size);
}

/* the one kernel's case (mmvq: its two, the quantisation and the fused product) */
static bool glu_fused(const struct lt_tensor *node, const struct cu_mm_plan *p)
{
    const struct cu_mmv_shape ms = {p->K, p->M, p->N, p->A2, p->A3, p->B2, p->B3, p->r2, p->r3};
    return p->mmvq || (p->mmv && cu_mmv_glu_takes(&ms, node->src[0], node->src[1]));
}

/* the bytes of a fused node's product [M, N] (lt_fused_product) */
static size_t fused_product_bytes(const struct lt_tensor *node)
{
    const struct lt_tensor t = lt_fused_product(node, NULL);
    return (size_t)lt_nelements(&t) * sizeof(float);
}

/* a fused node's product into CU_SCRATCH_WORK by MUL_MAT's own launcher (the fused nodes'
 * path where they have no one-kernel form); *t is the product's tensor */
static lt_status fused_product_run(struct cu_ctx *c, const struct lt_tensor *node,
                                   struct lt_tensor *t)
{
    void *prod;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK, fused_product_bytes(node), &prod);
    if (st != LT_OK)
        return st;
    *t = lt_fused_product(node, prod);
    return cu_matmul_compute(c, t);
}

static lt_status glu_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    struct cu_mm_plan p;
    if (!glu_supported_plan(node, &p, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    if (lt_nelements(node) == 0)
        return LT_OK;
    if (p.K > 0 && glu_fused(node, &p) && p.mmvq)
        return cu_mmvq_glu_run(c, node->src[0], node->src[1], (float *)node->data);
    if (p.K > 0 && glu_fused(node, &p)) {
        const struct cu_mmv_shape ms = {p.K, p.M, p.N, p.A2, p.A3, p.B2, p.B3, p.r2, p.r3};
        return cu_mmv_glu_run(c, &ms, node->src[0], node->src[1], (float *)node->data);
    }
    struct lt_tensor t;
    lt_status st = fused_product_run(c, node, &t);
    if (st != LT_OK)
        return st;
    struct lt_tensor gate, up;
    struct lt_tensor sw = glu_swiglu(node, &t, &gate, &up);
    return cu_unary_compute(c, &sw);
}

/* ---- MUL_MAT_ADD_RMS_NORM: a product [M, N], the residual added and the sum normed ----
 * One kernel (mmv_half_kernel with norm_epi.cuh's epilogue) for one column of F16 / BF16
 * weights whose product takes mmv (cu_mmv_norm_takes) and a contiguous residual: a decode
 * step's output and down projections; otherwise the product into scratch by this file's
 * own launcher, then ADD_RMS_NORM by norm.cu's (so whatever MUL_MAT and ADD_RMS_NORM take,
 * this takes). Q8_0 (mmvq) had the epilogue too and lost by it: on an H100, tg128 of the
 * 0.8B Q8_0 file 577.6 tokens/s with it, 653.1 without (2026-12-07): its 1,024-row products
 * run a row a block, so 1,024 blocks counted in and a last block's serial norm. */

/* the claim's and the launcher's precondition; *p is the product's plan */
static bool man_supported_plan(const struct lt_tensor *node, struct cu_mm_plan *p, char *reason,
                               size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    if (!a || !b || !node->src[2] || !node->src[3] || b->type != LT_TYPE_F32 || a->ne[2] != 1 ||
        a->ne[3] != 1 || b->ne[2] != 1 || b->ne[3] != 1 || node->ne[0] != a->ne[1] ||
        node->ne[1] != b->ne[1]) {
        snprintf(reason, reason_size,
                 "the sources and result do not fit (a 2-d weight of M rows, 2-d f32 columns, "
                 "[M, N, 2] out)");
        return false;
    }
    const struct lt_tensor t = lt_fused_product(node, NULL);
    if (!cu_mm_supported_plan(&t, p, reason, reason_size))
        return false;
    struct lt_tensor pt;
    const struct lt_tensor an = lt_fused_add_norm(node, t.data, &pt);
    return cu_norm_supported(&an, reason, reason_size);
}

/* the one kernel's case */
static bool man_fused(const struct lt_tensor *node, const struct cu_mm_plan *p)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1], *x = node->src[2];
    const struct cu_mmv_shape ms = {p->K, p->M, p->N, p->A2, p->A3, p->B2, p->B3, p->r2, p->r3};
    return p->K > 0 && p->N == 1 && lt_is_contiguous(x) && p->M <= INT_MAX && p->mmv &&
           cu_mmv_norm_takes(&ms, a, b);
}

static lt_status man_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    struct cu_mm_plan p;
    if (!man_supported_plan(node, &p, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    if (lt_nelements(node) == 0)
        return LT_OK;
    float *sum = (float *)node->data;
    if (man_fused(node, &p)) {
        const struct cu_norm_epi epi = {(const float *)node->src[2]->data,
                                        (const float *)node->src[3]->data, sum + p.M, c->counters,
                                        lt_get_param_f32(node, 0)};
        const struct cu_mmv_shape ms = {p.K, p.M, p.N, p.A2, p.A3, p.B2, p.B3, p.r2, p.r3};
        return cu_mmv_norm_run(c, &ms, node->src[0], node->src[1], sum, &epi);
    }
    struct lt_tensor t;
    lt_status st = fused_product_run(c, node, &t);
    if (st != LT_OK)
        return st;
    struct lt_tensor pt;
    struct lt_tensor an = lt_fused_add_norm(node, t.data, &pt);
    return cu_norm_compute(c, &an);
}

/* ---- RMS_NORM_MUL_MAT: the weighted RMS norm of the columns, their product [M, N], or its
 * SwiGLU [M / 2, N] ----
 * One kernel (mmv_half_kernel's NORM form: each block norms the column in shared memory,
 * then its products, with GLU's epilogue for glu) for one contiguous column against F16 /
 * BF16 rows whose product takes mmv (cu_mmv_rnm_takes), or mmvq's two with the norm in the
 * quantisation for Q8_0 / Q4_0 / Q5_0 rows: a decode step's input projections and FFN,
 * after MUL_MAT_ACC added the residual; otherwise the norm into scratch by
 * norm.cu's launcher, the product by this file's (into scratch for glu), then SWIGLU by
 * unary.cu's (so whatever RMS_NORM, MUL_MAT and SWIGLU take, this takes). */

static bool rnm_glu(const struct lt_tensor *node)
{
    return lt_get_param_i32(node, 1) != 0;
}

/* the one kernel's case (mmvq: its two, the quantisation taking the norm) */
static bool rnm_fused(const struct lt_tensor *node, const struct cu_mm_plan *p)
{
    const struct lt_tensor *a = node->src[0], *x = node->src[1], *w = node->src[2];
    const struct cu_mmv_shape ms = {p->K, p->M, p->N, p->A2, p->A3, p->B2, p->B3, p->r2, p->r3};
    if (p->K <= 0 || !p->mmv || !lt_is_contiguous(x) || w->type != LT_TYPE_F32 ||
        !lt_is_contiguous(w) || lt_nelements(w) != p->K)
        return false;
    if (p->mmvq)
        return one_column(p) && (!rnm_glu(node) || p->M % 2 == 0);
    return cu_mmv_rnm_takes(&ms, a, x, rnm_glu(node));
}

/* the claim's and the launcher's precondition; *p is the product's plan */
static bool rnm_supported_plan(const struct lt_tensor *node, struct cu_mm_plan *p, char *reason,
                               size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *x = node->src[1];
    const bool glu = rnm_glu(node);
    if (!a || !x || !node->src[2] || x->type != LT_TYPE_F32 || a->ne[2] != 1 || a->ne[3] != 1 ||
        x->ne[2] != 1 || x->ne[3] != 1 || node->ne[0] * (glu ? 2 : 1) != a->ne[1] ||
        node->ne[1] != x->ne[1] || node->ne[2] != 1 || node->ne[3] != 1) {
        snprintf(reason, reason_size,
                 "the sources and result do not fit (a 2-d weight of M rows, 2-d f32 columns, "
                 "[M, N] or [M / 2, N] out)");
        return false;
    }
    if (!cu_check_result_f32(node, reason, reason_size))
        return false;
    struct lt_tensor h = lt_fused_norm(node, NULL);
    struct lt_tensor t = lt_fused_norm_product(node, &h, NULL);
    if (!cu_mm_supported_plan(&t, p, reason, reason_size))
        return false;
    if (rnm_fused(node, p))
        return true;
    if (!cu_norm_supported(&h, reason, reason_size))
        return false;
    struct lt_tensor gate, up;
    const struct lt_tensor sw = glu_swiglu(node, &t, &gate, &up);
    return !glu || cu_unary_supported(&sw, reason, reason_size);
}

/* scratch (CU_SCRATCH_WORK) of the unfused path: the normed columns, then the product (glu) */
static size_t rnm_norm_bytes(const struct lt_tensor *node)
{
    return ((size_t)node->src[1]->ne[0] * (size_t)node->src[1]->ne[1] * sizeof(float) + 255) &
           ~(size_t)255;
}

static lt_status rnm_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    struct cu_mm_plan p;
    if (!rnm_supported_plan(node, &p, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    if (lt_nelements(node) == 0)
        return LT_OK;
    const bool glu = rnm_glu(node);
    if (rnm_fused(node, &p) && p.mmvq)
        return cu_mmvq_rnm_run(c, node->src[0], node->src[1], (const float *)node->src[2]->data,
                               lt_get_param_f32(node, 0), glu, (float *)node->data);
    if (rnm_fused(node, &p)) {
        const struct cu_norm_epi norm = {NULL, (const float *)node->src[2]->data, NULL, NULL,
                                         lt_get_param_f32(node, 0)};
        const struct cu_mmv_shape ms = {p.K, p.M, p.N, p.A2, p.A3, p.B2, p.B3, p.r2, p.r3};
        return cu_mmv_rnm_run(c, &ms, node->src[0], node->src[1], (float *)node->data, &norm, glu);
    }
    void *work;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK,
                              rnm_norm_bytes(node) + (glu ? fused_product_bytes(node) : 0), &work);
    if (st != LT_OK)
        return st;
    struct lt_tensor h = lt_fused_norm(node, work);
    if ((st = cu_norm_compute(c, &h)) != LT_OK)
        return st;
    struct lt_tensor t =
        lt_fused_norm_product(node, &h, glu ? (char *)work + rnm_norm_bytes(node) : node->data);
    if ((st = cu_matmul_compute(c, &t)) != LT_OK || !glu)
        return st;
    struct lt_tensor gate, up;
    struct lt_tensor sw = glu_swiglu(node, &t, &gate, &up);
    return cu_unary_compute(c, &sw);
}

bool cu_matmul_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    struct cu_mm_plan p;
    if (node->op == LT_OP_RMS_NORM_MUL_MAT)
        return rnm_supported_plan(node, &p, reason, reason_size);
    if (node->op == LT_OP_MUL_MAT_GLU)
        return glu_supported_plan(node, &p, reason, reason_size);
    if (node->op == LT_OP_MUL_MAT_ADD_RMS_NORM)
        return man_supported_plan(node, &p, reason, reason_size);
    return cu_mm_supported_plan(node, &p, reason, reason_size);
}

/* ---- conversions into scratch ---- */

/* b (F32, F16 or BF16, any strides) into contiguous [K, N, B2, B3] of type ct */
static __global__ void convert_b_kernel(struct cu_t b, char *dst, int ct, int es)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(b);
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, b.ne, i0, i1, i2, i3);
        cu_store(dst + f * es, ct, cu_get(b, i0, i1, i2, i3));
    }
}

/* rows [m0, m0 + tl) of a's head (a2, a3), any readable type, into contiguous [K, tl] */
static __global__ void convert_a_kernel(struct cu_t a, int64_t a2, int64_t a3, int64_t m0,
                                        int64_t tl, char *dst, int ct, int es)
{
    cu_pdl_enter();
    const int64_t K = a.ne[0], n = K * tl;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        cu_store(dst + f * es, ct, cu_read(a, f % K, m0 + f / K, a2, a3));
}

/* Quantised rows [m0, m0 + tl) of a's head (a2, a3) into contiguous F16 [K, tl], 32
 * elements a thread (one block of a 32-element format, an eighth of a K-quant's block):
 * convert_a_kernel's values bit for bit (cu_dequant, then cu_store's rounding to F16), with
 * one division a thread instead of one an element, the block's address found once, and
 * four 16-byte stores. K is a multiple of 32 (every quantised row is whole blocks). */
template <int TY>
static __global__ void dequant_a_kernel(struct cu_t a, int64_t a2, int64_t a3, int64_t m0,
                                        int64_t tl, __half *dst)
{
    constexpr int BS = cu_block_size(TY);
    const int64_t runs = a.ne[0] / 32, n = runs * tl;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        const int64_t r = f / runs, e0 = (f - r * runs) * 32;
        const uint8_t *blk = (const uint8_t *)cu_ptr(a, e0 / BS, m0 + r, a2, a3);
        const int j0 = (int)(e0 % BS);
        uint4 out[4];
        __half *h = (__half *)out;
#pragma unroll
        for (int j = 0; j < 32; j++)
            h[j] = __float2half_rn(cu_dequant(blk, TY, j0 + j));
        uint4 *d = (uint4 *)(dst + r * a.ne[0] + e0);
#pragma unroll
        for (int i = 0; i < 4; i++)
            d[i] = out[i];
    }
}

/* dequant_a_kernel's instance for a's type, NULL for a type it has none of (the generic
 * convert_a_kernel then runs) */
typedef void (*dequant_a_fn)(struct cu_t, int64_t, int64_t, int64_t, int64_t, __half *);
static dequant_a_fn dequant_a_of(int type)
{
    switch (type) {
    case LT_TYPE_Q4_0: return dequant_a_kernel<LT_TYPE_Q4_0>;
    case LT_TYPE_Q4_1: return dequant_a_kernel<LT_TYPE_Q4_1>;
    case LT_TYPE_Q5_0: return dequant_a_kernel<LT_TYPE_Q5_0>;
    case LT_TYPE_Q5_1: return dequant_a_kernel<LT_TYPE_Q5_1>;
    case LT_TYPE_Q8_0: return dequant_a_kernel<LT_TYPE_Q8_0>;
    case LT_TYPE_Q2_K: return dequant_a_kernel<LT_TYPE_Q2_K>;
    case LT_TYPE_Q3_K: return dequant_a_kernel<LT_TYPE_Q3_K>;
    case LT_TYPE_Q4_K: return dequant_a_kernel<LT_TYPE_Q4_K>;
    case LT_TYPE_Q5_K: return dequant_a_kernel<LT_TYPE_Q5_K>;
    case LT_TYPE_Q6_K: return dequant_a_kernel<LT_TYPE_Q6_K>;
    default: return NULL;
    }
}

/* ---- products ---- */

struct gemm_args {
    cublasOperation_t op_a, op_b;
    int64_t m, n, k;
    const void *a;
    int64_t lda, sa;
    const void *b;
    int64_t ldb, sb;
    float *c;
    int64_t ldc, sc, batch;
};

static lt_status gemm(struct cu_ctx *c, const struct cu_mm_plan *p, const struct gemm_args *g)
{
    const float alpha = p->alpha, beta = p->beta;
    const cudaDataType_t t = cuda_type(p->ct);
    if (g->batch == 1)
        return cu_check_blas(cublasGemmEx(c->blas, g->op_a, g->op_b, (int)g->m, (int)g->n,
                                          (int)g->k, &alpha, g->a, t, (int)g->lda, g->b, t,
                                          (int)g->ldb, &beta, g->c, CUDA_R_32F, (int)g->ldc,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                             "cublasGemmEx (mul_mat)");
    return cu_check_blas(cublasGemmStridedBatchedEx(
                             c->blas, g->op_a, g->op_b, (int)g->m, (int)g->n, (int)g->k, &alpha,
                             g->a, t, (int)g->lda, g->sa, g->b, t, (int)g->ldb, g->sb, &beta, g->c,
                             CUDA_R_32F, (int)g->ldc, g->sc, (int)g->batch, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT),
                         "cublasGemmStridedBatchedEx (mul_mat)");
}

/* The products of every b slice that reads a's head (a2, a3), with that head given as
 * (ah, lda, sa2-less) and output rows [m0, m0 + mlen). b slices i2 of the head are
 * [a2 * r2, (a2 + 1) * r2); when head_all, a2 spans every head through A's stride sa2. */
static lt_status head_products(struct cu_ctx *c, const struct cu_mm_plan *p, const char *ah,
                               int64_t lda, int64_t a2, int64_t i3, const char *bbase,
                               float *cbase, int64_t m0, int64_t mlen)
{
    const int64_t MN = p->M * p->N;
    struct gemm_args g;
    g.op_a = p->op_a;
    g.op_b = p->op_b;
    g.m = mlen;
    g.k = p->K;
    g.a = ah;
    g.lda = lda;
    g.ldb = p->ldb;
    g.ldc = p->M;
    g.b = bbase + ((size_t)i3 * p->sb3 + (size_t)(a2 * p->r2) * p->sb2) * p->es;
    g.c = cbase + (size_t)i3 * MN * p->B2 + (size_t)(a2 * p->r2) * MN + m0;
    if (p->r2 == 1 || p->fold) {
        g.n = p->N * p->r2;
        g.batch = 1;
        g.sa = g.sb = g.sc = 0;
    } else {
        g.n = p->N;
        g.sa = 0;
        g.sb = p->sb2;
        g.sc = MN;
        g.batch = p->r2;
    }
    return gemm(c, p, &g);
}

static lt_status run_direct(struct cu_ctx *c, const struct cu_mm_plan *p, const struct lt_tensor *a,
                            const char *bbase, float *cbase)
{
    const int64_t MN = p->M * p->N;
    for (int64_t i3 = 0; i3 < p->B3; i3++) {
        const char *a3p = (const char *)a->data + (size_t)(i3 / p->r3) * a->nb[3];
        lt_status st;
        if (p->r2 == 1 && p->B2 > 1) {
            /* every head at once: A, B and C advance together over i2 */
            struct gemm_args g = {p->op_a, p->op_b, p->M, p->N, p->K, a3p, p->lda, p->sa2,
                                  bbase + (size_t)i3 * p->sb3 * p->es,
                                  p->ldb, p->sb2, cbase + (size_t)i3 * MN * p->B2, p->M, MN,
                                  p->B2};
            st = gemm(c, p, &g);
        } else {
            st = LT_OK;
            for (int64_t a2 = 0; a2 < p->A2 && st == LT_OK; a2++)
                st = head_products(c, p, a3p + (size_t)a2 * p->sa2 * p->es, p->lda, a2, i3, bbase,
                                   cbase, 0, p->M);
        }
        if (st != LT_OK)
            return st;
    }
    return LT_OK;
}

/* scratch: a converted tile of a (CU_SCRATCH_A), b converted whole (CU_SCRATCH_B) */
static size_t tile_bytes(const struct cu_mm_plan *p)
{
    return (size_t)p->tile * (size_t)p->K * p->es;
}
static size_t b_converted_bytes(const struct lt_tensor *b, const struct cu_mm_plan *p)
{
    return (size_t)lt_nelements(b) * p->es;
}

static lt_status run_tiled(struct cu_ctx *c, const struct cu_mm_plan *p, const struct lt_tensor *a,
                           const char *bbase, float *cbase)
{
    void *tile;
    lt_status st = cu_scratch(c, CU_SCRATCH_A, tile_bytes(p), &tile);
    if (st != LT_OK)
        return st;
    const dequant_a_fn dq = dequant_a_of(a->type);
    for (int64_t a3 = 0; a3 < p->A3; a3++)
        for (int64_t a2 = 0; a2 < p->A2; a2++)
            for (int64_t m0 = 0; m0 < p->M; m0 += p->tile) {
                const int64_t tl = p->M - m0 < p->tile ? p->M - m0 : p->tile;
                if (dq) /* a quantised a: ct is F16, K whole blocks (a multiple of 32) */
                    dq<<<cu_blocks(tl * p->K / 32, 256), 256, 0, c->stream>>>(
                        cu_view(a), a2, a3, m0, tl, (__half *)tile);
                else
                    cu_launch_pdl(c, convert_a_kernel, cu_blocks(tl * p->K, 256), 256, 0,
                                  cu_view(a), a2, a3, m0, tl, (char *)tile, (int)p->ct, (int)p->es);
                st = cu_launched("mul_mat convert_a");
                for (int64_t i3 = a3 * p->r3; i3 < (a3 + 1) * p->r3 && st == LT_OK; i3++)
                    st = head_products(c, p, (const char *)tile, p->lda, a2, i3, bbase, cbase, m0,
                                       tl);
                if (st != LT_OK)
                    return st;
            }
    return LT_OK;
}

static void matmul_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    struct cu_mm_plan p;
    char reason[CU_REASON_MAX];
    if (node->op == LT_OP_MUL_MAT_GLU) {
        if (!glu_supported_plan(node, &p, reason, sizeof(reason)) || lt_nelements(node) == 0)
            return;
        if (p.K > 0 && glu_fused(node, &p)) {
            if (p.mmvq)
                need[CU_SCRATCH_B] = cu_mmvq_scratch_bytes(node->src[0], node->src[1]);
            return;
        }
        const struct lt_tensor t = lt_fused_product(node, NULL);
        matmul_scratch(&t, need);
        need[CU_SCRATCH_WORK] = fused_product_bytes(node);
        return;
    }
    if (node->op == LT_OP_RMS_NORM_MUL_MAT) {
        if (!rnm_supported_plan(node, &p, reason, sizeof(reason)) || lt_nelements(node) == 0)
            return;
        if (rnm_fused(node, &p)) {
            if (p.mmvq)
                need[CU_SCRATCH_B] = cu_mmvq_scratch_bytes(node->src[0], node->src[1]);
            return;
        }
        struct lt_tensor h = lt_fused_norm(node, NULL);
        struct lt_tensor t = lt_fused_norm_product(node, &h, NULL);
        matmul_scratch(&t, need);
        need[CU_SCRATCH_WORK] =
            rnm_norm_bytes(node) + (rnm_glu(node) ? fused_product_bytes(node) : 0);
        return;
    }
    if (node->op == LT_OP_MUL_MAT_ADD_RMS_NORM) {
        if (!man_supported_plan(node, &p, reason, sizeof(reason)) || lt_nelements(node) == 0)
            return;
        const struct lt_tensor t = lt_fused_product(node, NULL);
        matmul_scratch(&t, need); /* the product's (mmvq's columns, fused or not) */
        if (!man_fused(node, &p))
            need[CU_SCRATCH_WORK] = fused_product_bytes(node);
        return;
    }
    if (!cu_mm_supported_plan(node, &p, reason, sizeof(reason)) || lt_nelements(node) == 0 ||
        p.K == 0)
        return;
    if (p.mmvq)
        need[CU_SCRATCH_B] = cu_mmvq_scratch_bytes(node->src[0], node->src[1]);
    if (p.mmvq || p.mmv)
        return;
    if (p.b_flat || !p.b_direct)
        need[CU_SCRATCH_B] = b_converted_bytes(node->src[1], &p);
    if (!p.a_direct)
        need[CU_SCRATCH_A] = tile_bytes(&p);
}

lt_status cu_matmul_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    if (node->op == LT_OP_RMS_NORM_MUL_MAT)
        return rnm_compute(c, node);
    if (node->op == LT_OP_MUL_MAT_GLU)
        return glu_compute(c, node);
    if (node->op == LT_OP_MUL_MAT_ADD_RMS_NORM)
        return man_compute(c, node);
    char reason[CU_REASON_MAX];
    struct cu_mm_plan p;
    if (!cu_mm_supported_plan(node, &p, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    if (lt_nelements(node) == 0)
        return LT_OK;
    if (p.K == 0) /* an empty product: zero, or nothing added */
        return p.beta != 0.0f ? LT_OK
                              : cu_check(cudaMemsetAsync(node->data, 0, lt_nbytes(node), c->stream),
                                         "zeroing an empty product");
    if (p.mmvq)
        return node->op == LT_OP_MUL_MAT_ACC
                   ? cu_mmvq_acc_run(c, a, b, (float *)node->data)
                   : cu_mmvq_run(c, a, b, (float *)node->data, p.r2, p.r3);
    if (p.mmv) {
        const struct cu_mmv_shape ms = {p.K, p.M, p.N, p.A2, p.A3, p.B2, p.B3, p.r2, p.r3};
        if (node->op == LT_OP_MUL_MAT_ACC) { /* the addend is the result's own storage */
            const struct cu_norm_epi acc = {(const float *)node->data, NULL, NULL, NULL, 0.0f};
            return cu_mmv_norm_run(c, &ms, a, b, (float *)node->data, &acc);
        }
        return cu_mmv_run(c, &ms, a, b, (float *)node->data);
    }
    const char *bbase = (const char *)b->data;
    if (p.b_flat) {
        void *bc;
        const int64_t nb_ = lt_nelements(b);
        lt_status st = cu_scratch(c, CU_SCRATCH_B, b_converted_bytes(b, &p), &bc);
        if (st != LT_OK)
            return st;
        st = cu_convert_f32_flat(c, (const float *)b->data, (char *)bc, nb_, (int)p.ct,
                                 "mul_mat convert_b (flat)");
        if (st != LT_OK)
            return st;
        bbase = (const char *)bc;
    } else if (!p.b_direct) {
        void *bc;
        const int64_t nb_ = lt_nelements(b);
        lt_status st = cu_scratch(c, CU_SCRATCH_B, b_converted_bytes(b, &p), &bc);
        if (st != LT_OK)
            return st;
        cu_launch_pdl(c, convert_b_kernel, cu_blocks(nb_, 256), 256, 0, cu_view(b), (char *)bc,
                      (int)p.ct, (int)p.es);
        st = cu_launched("mul_mat convert_b");
        if (st != LT_OK)
            return st;
        bbase = (const char *)bc;
    }
    if (node->type != LT_TYPE_F32) { /* cu_mm_supported_plan: one direct 2-d product */
        const float alpha = 1.0f, beta = 0.0f;
        const cudaDataType_t t = cuda_type(p.ct);
        return cu_check_blas(cublasGemmEx(c->blas, p.op_a, p.op_b, (int)p.M, (int)p.N, (int)p.K,
                                          &alpha, a->data, t, (int)p.lda, b->data, t, (int)p.ldb,
                                          &beta, node->data, t, (int)p.M, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT),
                             "cublasGemmEx (mul_mat, half result)");
    }
    if (p.a_direct)
        return run_direct(c, &p, a, bbase, (float *)node->data);
    return run_tiled(c, &p, a, bbase, (float *)node->data);
}

const struct cu_family cu_family_matmul = {
    "matmul",          matmul_ops,    CU_COUNT(matmul_ops), cu_matmul_supported,
    cu_matmul_compute, matmul_scratch};
