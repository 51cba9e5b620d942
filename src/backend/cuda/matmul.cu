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
 *   - quantised a: dequantised to F16 in tiles of rows, b converted to F16, as for F16
 *     (an activation beyond F16's range, 65504, would become inf).
 * a is used in place when its type is ct and one of its two inner strides is one element;
 * otherwise (other strides, or quantised) it is converted tile by tile into scratch, at
 * most TILE_BYTES at a time, each tile's products queued before the next tile overwrites
 * it (one stream keeps them in order). b is used in place when it is of type ct and one of
 * its inner strides is one element, else converted whole into scratch.
 *
 * Few columns (N <= MMV_MAX_N: decode) with a quantised a, or an F16 / BF16 a of at most
 * MMV_HALF_MAX_BYTES, take a kernel of our own instead (mmv): warps read a's rows once,
 * in their own type (16-byte loads for unsplit half rows, in warp teams of one or four rows
 * split over up to 8 warps when b's columns are unit-strided: mmv_half_kernel; element-wise
 * dequantisation otherwise, a warp a row), and sum their products with the F32 columns of b
 * in F32. It
 * converts nothing into scratch, which is what dominates a product with one token (a
 * dequantised weight would be written and read back whole), and it is more exact than the
 * tensor-core path (b is not rounded). It reads F32 b only: a half b (which the model
 * does not feed it: batches of 8 tokens or fewer keep F32 activations) goes to cuBLAS in
 * place. Measured on an H200 with one token: BF16 1024x3584 15 us against 20 us through
 * conversion + cuBLAS, but the 1024x248320 output head 287 us
 * against 137 us (mmv reads at ~1.8 TB/s, cuBLAS at ~3.7), hence the size limit for half
 * weights (32 MiB: the 0.8B model's stacked DeltaNet input projections, 16.8 MB, took three
 * kernels through cuBLAS, b's conversion, the product and a split-K reduction, ~15 us);
 * quantised weights have no cheaper path (dequantising a whole Q8_0 head into scratch costs
 * more than mmv's 1.0 ms).
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
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/mmvq.cuh"
#include "backend/cuda/quant.cuh"

static const enum lt_op matmul_ops[] = {LT_OP_MUL_MAT};

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
};

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

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
    p->mmv = use_mmv(a, b, p);
    /* a node autodiff differentiates keeps F32 activations, as on the CPU (src/ops/matmul.c:
     * its loss and gradients are the F32 ones; a forward piecewise constant in b would
     * defeat finite differences) */
    p->mmvq = p->mmv && !node->grad && cu_mmvq_takes(a->type, p->K);
    return true;
}

/* The precondition, and the plan when it holds (the launcher runs on that same plan). */
static bool cu_mm_supported_plan(const struct lt_tensor *node, struct cu_mm_plan *p, char *reason,
                                 size_t reason_size)
{
    if (node->op != LT_OP_MUL_MAT) {
        snprintf(reason, reason_size, "%s is not a matrix product", lt_op_name(node->op));
        return false;
    }
    /* b is F32, or F16 / BF16 when a is of that same type */
    const enum lt_type ta = node->src[0]->type, tb = node->src[1]->type;
    const uint64_t b_types = CU_TYPES_F32 | ((ta == LT_TYPE_F16 || ta == LT_TYPE_BF16) && tb == ta
                                                 ? CU_TYPE_BIT(ta)
                                                 : 0);
    if (!cu_check_source(node, 0, CU_TYPES_FLOAT | CU_TYPES_QUANT, reason, reason_size) ||
        !cu_check_source(node, 1, b_types, reason, reason_size) ||
        !cu_check_result_f32(node, reason, reason_size))
        return false;
    return cu_mm_plan_make(node, p, reason, reason_size);
}

bool cu_matmul_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    struct cu_mm_plan p;
    return cu_mm_supported_plan(node, &p, reason, reason_size);
}

/* ---- conversions into scratch ---- */

/* b (F32, F16 or BF16, any strides) into contiguous [K, N, B2, B3] of type ct */
static __global__ void convert_b_kernel(struct cu_t b, char *dst, int ct, int es)
{
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
    const int64_t K = a.ne[0], n = K * tl;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        cu_store(dst + f * es, ct, cu_read(a, f % K, m0 + f / K, a2, a3));
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
    const float alpha = 1.0f, beta = 0.0f;
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
    for (int64_t a3 = 0; a3 < p->A3; a3++)
        for (int64_t a2 = 0; a2 < p->A2; a2++)
            for (int64_t m0 = 0; m0 < p->M; m0 += p->tile) {
                const int64_t tl = p->M - m0 < p->tile ? p->M - m0 : p->tile;
                convert_a_kernel<<<cu_blocks(tl * p->K, 256), 256, 0, c->stream>>>(
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

/* ---- few columns: a warp per output row ---- */

/* The weight type is a template parameter (TYPE; -1: read from the tensor at run time, for
 * a type no instantiation names), so the dequantiser's switch, the block size and the
 * divisions by it are resolved at compile time: with the type read per element, the
 * measured decode products ran at 50-120 GB/s of weights on an H200. */
template <int TYPE> static __device__ __forceinline__ int mmv_type(const struct cu_t &a)
{
    return TYPE >= 0 ? TYPE : a.type;
}

/* element k of a row of a whose elements (or blocks) are nb0 apart */
static __device__ __forceinline__ float row_elem(const char *row, int type, int k, int64_t nb0)
{
    const int bs = cu_block_size(type);
    if (bs == 1)
        return cu_load(row + (int64_t)k * nb0, type);
    return cu_dequant((const uint8_t *)row + (int64_t)(k / bs) * nb0, type, k % bs);
}

/* 8 halves (F16 or BF16) held in u, as floats */
static __device__ __forceinline__ void unpack8(const uint4 u, int type, float *w)
{
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
    for (int e = 0; e < 4; e++) {
        const uint16_t lo = (uint16_t)(v[e] & 0xffffu), hi = (uint16_t)(v[e] >> 16);
        if (type == LT_TYPE_BF16) {
            w[2 * e] = __uint_as_float((uint32_t)lo << 16);
            w[2 * e + 1] = __uint_as_float((uint32_t)hi << 16);
        } else {
            __half_raw hl, hh;
            hl.x = lo;
            hh.x = hi;
            w[2 * e] = __half2float(__half(hl));
            w[2 * e + 1] = __half2float(__half(hh));
        }
    }
}

/* 8 halves (F16 or BF16) at p, 16-byte aligned, as floats */
static __device__ __forceinline__ void load8(const char *p, int type, float *w)
{
    unpack8(*(const uint4 *)p, type, w);
}

/* A warp's row: its lanes' partial sums acc[n] added across the warp, and lane 0 storing
 * the N <= NC results at dst[n M] */
template <int NC>
static __device__ __forceinline__ void mmv_row_out(float *acc, int lane, float *dst, int64_t N,
                                                   int64_t M)
{
#pragma unroll
    for (int n = 0; n < NC; n++)
        for (int o = 16; o > 0; o >>= 1)
            acc[n] += __shfl_xor_sync(0xffffffffu, acc[n], o);
    if (lane == 0)
        for (int n = 0; n < NC && n < N; n++)
            dst[n * M] = acc[n];
}

/* dst[m, n, i2, i3] for n < N <= NC: warp w takes output rows (m, i2, i3) w, w + warps, ...
 * VEC: unsplit F16 / BF16 rows read 8 elements (16 bytes) a lane at a time (b's columns
 * strided: mmv_half_kernel takes unit-strided ones). */
template <int TYPE, int NC, bool VEC>
static __global__ void mmv_kernel(struct cu_t a, struct cu_t b, float *dst, int64_t r2, int64_t r3)
{
    const int type = mmv_type<TYPE>(a);
    const int K = (int)a.ne[0];
    const int64_t M = a.ne[1], N = b.ne[1], B2 = b.ne[2];
    const int64_t rows = M * B2 * b.ne[3];
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
         r += warps) {
        const int64_t m = r % M, i2 = (r / M) % B2, i3 = r / (M * B2);
        const char *row = a.data + m * a.nb[1] + (i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3];
        const char *xb = b.data + i2 * b.nb[2] + i3 * b.nb[3];
        float acc[NC];
#pragma unroll
        for (int n = 0; n < NC; n++)
            acc[n] = 0.0f;
        if (VEC) {
#pragma unroll 4
            for (int k8 = lane; k8 < K / 8; k8 += 32) {
                float w[8];
                load8(row + (int64_t)k8 * 16, type, w);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const char *xk = xb + (int64_t)(8 * k8 + e) * b.nb[0];
#pragma unroll
                    for (int n = 0; n < NC; n++)
                        if (n < N)
                            acc[n] += w[e] * *(const float *)(xk + n * b.nb[1]);
                }
            }
        } else {
#pragma unroll 4
            for (int k = lane; k < K; k += 32) {
                const float w = row_elem(row, type, k, a.nb[0]);
                const char *xk = xb + (int64_t)k * b.nb[0];
#pragma unroll
                for (int n = 0; n < NC; n++)
                    if (n < N)
                        acc[n] += w * *(const float *)(xk + n * b.nb[1]);
            }
        }
        mmv_row_out<NC>(acc, lane, dst + (i3 * B2 + i2) * N * M + m, N, M);
    }
}

/* Unsplit F16 / BF16 rows against F32 columns whose floats are unit-strided and 16-byte
 * aligned (decode's products; run_mmv's half_cols). A team of WPR warps takes RW output
 * rows (RW > 1: one slice, B2 = B3 = 1); a block of 8 warps has 8 / WPR teams. Warp `part`
 * of a team takes the rows' 16-byte chunks part * 32 + lane, then every 32 * WPR-th: for
 * each of its RW rows it issues U chunk loads before using any (RW U loads in flight a
 * lane), then reads the columns' 8 floats under a chunk once for all RW rows. So a lane
 * keeps several loads in flight (one row of 1024 halves is only 4 chunks a lane) and the
 * columns are read from L1 once every RW rows. WPR > 1 spreads a product of few rows over
 * every SM (the 0.8B model's output and down projections have 1024); the WPR partial sums
 * meet in shared memory in part order. The weights stream through once (__ldcs: evict
 * first), so that the columns stay in L1. */
template <int NC> struct mmv_half_unroll {
    static constexpr int u = NC <= 2 ? 4 : 2; /* registers: RW U chunks, RW NC sums */
};

template <int TYPE, int NC, int RW, int WPR>
static __global__ void __launch_bounds__(256)
    mmv_half_kernel(struct cu_t a, struct cu_t b, float *dst, int64_t r2, int64_t r3)
{
    constexpr int TEAMS = 8 / WPR, RPB = TEAMS * RW, STEP = 32 * WPR, U = mmv_half_unroll<NC>::u;
    __shared__ float part_sum[8][RW][NC];
    const int K8 = (int)(a.ne[0] / 8);
    const int64_t M = a.ne[1], N = b.ne[1], B2 = b.ne[2];
    const int64_t rows = M * B2 * b.ne[3];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, part = w % WPR;
    /* every block takes the same number of turns: the barriers below are reached by all */
    for (int64_t r0 = (int64_t)blockIdx.x * RPB; r0 < rows; r0 += (int64_t)gridDim.x * RPB) {
        const int64_t rb = r0 + (int64_t)(w / WPR) * RW; /* the team's first row */
        float acc[RW][NC];
#pragma unroll
        for (int t = 0; t < RW; t++)
#pragma unroll
            for (int n = 0; n < NC; n++)
                acc[t][n] = 0.0f;
        if (rb < rows) {
            const int64_t i2 = (rb / M) % B2, i3 = rb / (M * B2);
            const char *xb = b.data + i2 * b.nb[2] + i3 * b.nb[3];
            const uint4 *row[RW];
#pragma unroll
            for (int t = 0; t < RW; t++) { /* rows past the end read the team's first again */
                const int64_t m = (rb + t < rows ? rb + t : rb) % M;
                row[t] = (const uint4 *)(a.data + m * a.nb[1] + (i2 / r2) * a.nb[2] +
                                         (i3 / r3) * a.nb[3]);
            }
            for (int k0 = part * 32 + lane; k0 < K8; k0 += U * STEP) {
                uint4 u[RW][U];
#pragma unroll
                for (int t = 0; t < RW; t++)
#pragma unroll
                    for (int i = 0; i < U; i++)
                        if (k0 + i * STEP < K8)
                            u[t][i] = __ldcs(row[t] + k0 + i * STEP);
#pragma unroll
                for (int i = 0; i < U; i++) {
                    const int k8 = k0 + i * STEP;
                    if (k8 >= K8)
                        break;
                    float wf[RW][8];
#pragma unroll
                    for (int t = 0; t < RW; t++)
                        unpack8(u[t][i], TYPE, wf[t]);
#pragma unroll
                    for (int n = 0; n < NC; n++)
                        if (n < N) {
                            const float4 *xk = (const float4 *)(xb + n * b.nb[1]) + 2 * k8;
                            const float4 x0 = __ldg(xk), x1 = __ldg(xk + 1);
#pragma unroll
                            for (int t = 0; t < RW; t++)
                                acc[t][n] += wf[t][0] * x0.x + wf[t][1] * x0.y + wf[t][2] * x0.z +
                                             wf[t][3] * x0.w + wf[t][4] * x1.x + wf[t][5] * x1.y +
                                             wf[t][6] * x1.z + wf[t][7] * x1.w;
                        }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < RW; t++)
#pragma unroll
            for (int n = 0; n < NC; n++)
                for (int o = 16; o > 0; o >>= 1)
                    acc[t][n] += __shfl_xor_sync(0xffffffffu, acc[t][n], o);
        if (WPR > 1) {
            if (lane == 0)
#pragma unroll
                for (int t = 0; t < RW; t++)
#pragma unroll
                    for (int n = 0; n < NC; n++)
                        part_sum[w][t][n] = acc[t][n];
            __syncthreads();
            if (part == 0)
#pragma unroll
                for (int t = 0; t < RW; t++)
#pragma unroll
                    for (int n = 0; n < NC; n++)
                        for (int p = 1; p < WPR; p++)
                            acc[t][n] += part_sum[w + p][t][n];
            __syncthreads(); /* part_sum is written again in the next turn */
        }
        if (part == 0 && lane == 0)
#pragma unroll
            for (int t = 0; t < RW; t++) {
                const int64_t r = rb + t;
                if (r >= rows)
                    break;
                const int64_t m = r % M, i2 = (r / M) % B2, i3 = r / (M * B2);
                for (int n = 0; n < NC && n < N; n++)
                    dst[((i3 * B2 + i2) * N + n) * M + m] = acc[t][n];
            }
    }
}

/* Q8_0 rows of K % 256 == 0 elements, 16-byte aligned (rows of whole 272-byte groups of 8
 * blocks), against unit-strided 16-byte aligned F32 columns: the warp stages 32 blocks
 * (1088 bytes) of its row in shared memory with 16-byte loads, then each lane takes one
 * block, the sum of its 32 products times its scale (the CPU's exact kernel's order of
 * work: sum(q x) per block, then d). The element kernel above reads a byte and the scale
 * per element: the 0.8B model's Q8_0 head ran at ~270 GB/s through it. */
#define Q8_BLOCK 34
template <int NC>
static __global__ void mmv_q8_0_kernel(struct cu_t a, struct cu_t b, float *dst, int64_t r2,
                                       int64_t r3)
{
    __shared__ uint4 stage[8][32 * Q8_BLOCK / 16];
    const int nblk = (int)(a.ne[0] / 32);
    const int64_t M = a.ne[1], N = b.ne[1], B2 = b.ne[2];
    const int64_t rows = M * B2 * b.ne[3];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + w; r < rows; r += warps) {
        const int64_t m = r % M, i2 = (r / M) % B2, i3 = r / (M * B2);
        const char *row = a.data + m * a.nb[1] + (i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3];
        const char *xb = b.data + i2 * b.nb[2] + i3 * b.nb[3];
        float acc[NC];
#pragma unroll
        for (int n = 0; n < NC; n++)
            acc[n] = 0.0f;
        for (int c0 = 0; c0 < nblk; c0 += 32) {
            const int nb = nblk - c0 < 32 ? nblk - c0 : 32; /* a multiple of 8 */
            const uint4 *src = (const uint4 *)(row + (int64_t)c0 * Q8_BLOCK);
            for (int i = lane; i < nb * Q8_BLOCK / 16; i += 32)
                stage[w][i] = src[i];
            __syncwarp();
            if (lane < nb) {
                const uint8_t *blk = (const uint8_t *)stage[w] + lane * Q8_BLOCK;
                const float d = cu_f16_at(blk);
                float q[32];
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const uint16_t u = *(const uint16_t *)(blk + 2 + 2 * j);
                    q[2 * j] = (float)(int8_t)(u & 0xff);
                    q[2 * j + 1] = (float)(int8_t)(u >> 8);
                }
#pragma unroll
                for (int n = 0; n < NC; n++)
                    if (n < N) {
                        const float4 *xk =
                            (const float4 *)(xb + n * b.nb[1]) + (int64_t)(c0 + lane) * 8;
                        float sum = 0.0f;
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            const float4 x = xk[j];
                            sum += q[4 * j] * x.x + q[4 * j + 1] * x.y + q[4 * j + 2] * x.z +
                                   q[4 * j + 3] * x.w;
                        }
                        acc[n] += d * sum;
                    }
            }
            __syncwarp();
        }
        mmv_row_out<NC>(acc, lane, dst + (i3 * B2 + i2) * N * M + m, N, M);
    }
}

/* whether mmv_q8_0_kernel takes a (Q8_0) and b: see its comment */
static bool q8_staged(const struct cu_mm_plan *p, const struct cu_t &av, const struct cu_t &bv)
{
    return av.type == LT_TYPE_Q8_0 && av.nb[0] == Q8_BLOCK && p->K % 256 == 0 &&
           (uintptr_t)av.data % 16 == 0 && (p->M <= 1 || av.nb[1] % 16 == 0) &&
           (p->A2 <= 1 || av.nb[2] % 16 == 0) && (p->A3 <= 1 || av.nb[3] % 16 == 0) &&
           bv.nb[0] == 4 && (uintptr_t)bv.data % 16 == 0 && (p->N <= 1 || bv.nb[1] % 16 == 0) &&
           (p->B2 <= 1 || bv.nb[2] % 16 == 0) && (p->B3 <= 1 || bv.nb[3] % 16 == 0);
}

static void mmv_q8_0_launch(struct cu_ctx *c, const struct cu_mm_plan *p, const struct cu_t &av,
                            const struct cu_t &bv, float *dst)
{
    const unsigned blocks = cu_blocks(p->M * p->B2 * p->B3, 8); /* 8 warps a block */
    if (p->N <= 1)
        mmv_q8_0_kernel<1><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
    else if (p->N <= 2)
        mmv_q8_0_kernel<2><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
    else if (p->N <= 4)
        mmv_q8_0_kernel<4><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
    else
        mmv_q8_0_kernel<8><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
}

/* Q4_K rows (blocks of 256 elements in 144 bytes: f16 d and dmin, 12 bytes of eight 6-bit
 * scales and mins, 128 bytes of 4-bit quants) whose blocks are 4-byte aligned, against
 * unit-strided 16-byte aligned F32 columns: a warp a row, one block a step of the warp, lane
 * l taking quant bytes 32 j + 4 i .. + 3 of it (j = l / 8, i = l % 8): their low nibbles are
 * elements 64 j + 4 i .. + 3 of sub-block 2 j, their high ones the same 32 further on, of
 * sub-block 2 j + 1. So the warp reads a block's quants in one 128-byte load, its scales
 * and d once (every lane the same words), and each element is dequantised as
 * cu_dequant does it (d scale q - dmin min, each product rounded), so only the order of the
 * sums differs from the element kernel's. MMV_Q4K_U blocks' words are loaded before any is
 * used. The element kernel (mmv_kernel) reads a byte and the scales per element. */
#define Q4K_BLOCK 144
#define MMV_Q4K_U 4
static __device__ __forceinline__ void q4k_scale_min(const uint32_t sc[3], int sb, int &scale,
                                                     int &min)
{
    const uint8_t *b = (const uint8_t *)sc;
    if (sb < 4) {
        scale = b[sb] & 63;
        min = b[sb + 4] & 63;
    } else {
        scale = (b[sb + 4] & 0x0f) | (b[sb - 4] >> 6) << 4;
        min = (b[sb + 4] >> 4) | (b[sb] >> 6) << 4;
    }
}

template <int NC>
static __global__ void mmv_q4k_kernel(struct cu_t a, struct cu_t b, float *dst, int64_t r2,
                                      int64_t r3)
{
    const int nblk = (int)(a.ne[0] / 256);
    const int64_t M = a.ne[1], N = b.ne[1], B2 = b.ne[2];
    const int64_t rows = M * B2 * b.ne[3];
    const int lane = threadIdx.x & 31, j = lane >> 3, i = lane & 7;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
         r += warps) {
        const int64_t m = r % M, i2 = (r / M) % B2, i3 = r / (M * B2);
        const char *row = a.data + m * a.nb[1] + (i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3];
        const char *xb = b.data + i2 * b.nb[2] + i3 * b.nb[3];
        float acc[NC];
#pragma unroll
        for (int n = 0; n < NC; n++)
            acc[n] = 0.0f;
        for (int kb0 = 0; kb0 < nblk; kb0 += MMV_Q4K_U) {
            uint32_t q4[MMV_Q4K_U], dd[MMV_Q4K_U], sc[MMV_Q4K_U][3];
#pragma unroll
            for (int u = 0; u < MMV_Q4K_U; u++)
                if (kb0 + u < nblk) {
                    const uint32_t *blk = (const uint32_t *)(row + (int64_t)(kb0 + u) * Q4K_BLOCK);
                    dd[u] = __ldg(blk);
                    sc[u][0] = __ldg(blk + 1);
                    sc[u][1] = __ldg(blk + 2);
                    sc[u][2] = __ldg(blk + 3);
                    q4[u] = __ldcs(blk + 4 + 8 * j + i);
                }
#pragma unroll
            for (int u = 0; u < MMV_Q4K_U; u++) {
                if (kb0 + u >= nblk)
                    break;
                const uint8_t *dh = (const uint8_t *)&dd[u];
                const float d = cu_f16_at(dh), dmin = cu_f16_at(dh + 2);
                int s_lo, m_lo, s_hi, m_hi;
                q4k_scale_min(sc[u], 2 * j, s_lo, m_lo);
                q4k_scale_min(sc[u], 2 * j + 1, s_hi, m_hi);
                const float d_lo = __fmul_rn(d, (float)s_lo), mn_lo = __fmul_rn(dmin, (float)m_lo);
                const float d_hi = __fmul_rn(d, (float)s_hi), mn_hi = __fmul_rn(dmin, (float)m_hi);
                float w_lo[4], w_hi[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const uint32_t byte = q4[u] >> (8 * e);
                    w_lo[e] = __fsub_rn(__fmul_rn(d_lo, (float)(byte & 0x0f)), mn_lo);
                    w_hi[e] = __fsub_rn(__fmul_rn(d_hi, (float)((byte >> 4) & 0x0f)), mn_hi);
                }
                const int64_t k0 = (int64_t)(kb0 + u) * 256 + 64 * j + 4 * i;
#pragma unroll
                for (int n = 0; n < NC; n++)
                    if (n < N) {
                        const float *xn = (const float *)(xb + n * b.nb[1]) + k0;
                        const float4 xl = __ldg((const float4 *)xn),
                                     xh = __ldg((const float4 *)(xn + 32));
                        acc[n] += w_lo[0] * xl.x + w_lo[1] * xl.y + w_lo[2] * xl.z +
                                  w_lo[3] * xl.w + w_hi[0] * xh.x + w_hi[1] * xh.y +
                                  w_hi[2] * xh.z + w_hi[3] * xh.w;
                    }
            }
        }
        mmv_row_out<NC>(acc, lane, dst + (i3 * B2 + i2) * N * M + m, N, M);
    }
}

/* whether mmv_q4k_kernel takes a (Q4_K) and b: see its comment */
static bool q4k_words(const struct cu_mm_plan *p, const struct cu_t &av, const struct cu_t &bv)
{
    return av.type == LT_TYPE_Q4_K && av.nb[0] == Q4K_BLOCK && p->K % 256 == 0 &&
           (uintptr_t)av.data % 4 == 0 && (p->M <= 1 || av.nb[1] % 4 == 0) &&
           (p->A2 <= 1 || av.nb[2] % 4 == 0) && (p->A3 <= 1 || av.nb[3] % 4 == 0) &&
           bv.nb[0] == 4 && (uintptr_t)bv.data % 16 == 0 && (p->N <= 1 || bv.nb[1] % 16 == 0) &&
           (p->B2 <= 1 || bv.nb[2] % 16 == 0) && (p->B3 <= 1 || bv.nb[3] % 16 == 0);
}

static void mmv_q4k_launch(struct cu_ctx *c, const struct cu_mm_plan *p, const struct cu_t &av,
                           const struct cu_t &bv, float *dst)
{
    const unsigned blocks = cu_blocks(p->M * p->B2 * p->B3, 8); /* 8 warps a block */
    if (p->N <= 1)
        mmv_q4k_kernel<1><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
    else if (p->N <= 2)
        mmv_q4k_kernel<2><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
    else if (p->N <= 4)
        mmv_q4k_kernel<4><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
    else
        mmv_q4k_kernel<8><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
}

template <int TYPE, bool VEC>
static void mmv_launch(struct cu_ctx *c, const struct cu_mm_plan *p, const struct cu_t &av,
                       const struct cu_t &bv, float *dst)
{
    const int64_t rows = p->M * p->B2 * p->B3;
    const unsigned blocks = cu_blocks(rows, 8); /* 8 warps a block */
    if (p->N <= 1)
        mmv_kernel<TYPE, 1, VEC><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
    else if (p->N <= 2)
        mmv_kernel<TYPE, 2, VEC><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
    else if (p->N <= 4)
        mmv_kernel<TYPE, 4, VEC><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
    else
        mmv_kernel<TYPE, 8, VEC><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
}

/* b's columns as mmv_half_kernel reads them: floats one after another, every column of
 * every slice 16-byte aligned */
static bool half_cols(const struct cu_mm_plan *p, const struct cu_t &bv)
{
    return bv.nb[0] == 4 && (uintptr_t)bv.data % 16 == 0 && (p->N <= 1 || bv.nb[1] % 16 == 0) &&
           (p->B2 <= 1 || bv.nb[2] % 16 == 0) && (p->B3 <= 1 || bv.nb[3] % 16 == 0);
}

/* How mmv_half_kernel is cut: RW = 4 rows a team for a product of one slice and more than
 * one column, else 1; then WPR warps a team, doubled from 1 while the teams are fewer than 8
 * warps an SM's worth and each warp keeps at least two 32-chunk runs of a row.
 * LATHE_CUDA_MMV_RW=1|4 and LATHE_CUDA_MMV_WPR=1|2|4|8 fix them (read once a process; for
 * bench_matmul's comparisons; RW 4 is taken only for one slice). Measured on an H100
 * (bench_matmul's decode products, BF16, GB/s of weights, RW 4 against 1): 8 columns,
 * 1024 -> 8224 rows 877 against 570, 1024 -> 7168 797 / 507, 1024 -> 5120 611 / 506,
 * 2048 -> 1024 388 / 408, 3584 -> 1024 477 / 480; one column, 1024 -> 8224 1589 / 1571,
 * 1024 -> 5120 1186 / 1363, 2048 -> 1024 684 / 850, 3584 -> 1024 976 / 1157: the columns
 * read once for four rows pay for more columns only. */
static int env_choice(const char *name)
{
    const char *env = getenv(name);
    const int v = env ? atoi(env) : 0;
    return v == 1 || v == 2 || v == 4 || v == 8 ? v : 0;
}

static void mmv_half_cut(const struct cu_ctx *c, const struct cu_mm_plan *p, int *rw, int *wpr)
{
    static const int fixed_rw = env_choice("LATHE_CUDA_MMV_RW"),
                     fixed_wpr = env_choice("LATHE_CUDA_MMV_WPR");
    const int64_t rows = p->M * p->B2 * p->B3;
    const bool one_slice = p->B2 * p->B3 == 1;
    *rw = one_slice && (fixed_rw == 4 || (fixed_rw != 1 && p->N > 1)) ? 4 : 1;
    if (fixed_wpr) {
        *wpr = fixed_wpr;
        return;
    }
    const int64_t runs = p->K / 8 / 32, teams = (rows + *rw - 1) / *rw;
    const int64_t want = 8 * (int64_t)(c->n_sm > 0 ? c->n_sm : 1);
    *wpr = 1;
    while (*wpr < 8 && teams * *wpr < want && runs >= 4 * *wpr)
        *wpr *= 2;
}

template <int TYPE, int NC, int RW, int WPR>
static void mmv_half_go(struct cu_ctx *c, const struct cu_mm_plan *p, const struct cu_t &av,
                        const struct cu_t &bv, float *dst)
{
    constexpr int RPB = 8 / WPR * RW;
    const int64_t groups = (p->M * p->B2 * p->B3 + RPB - 1) / RPB;
    const unsigned blocks = (unsigned)(groups < 65535 * 4 ? groups : 65535 * 4);
    mmv_half_kernel<TYPE, NC, RW, WPR><<<blocks, 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
}

template <int TYPE, int NC, int RW>
static void mmv_half_wpr(struct cu_ctx *c, const struct cu_mm_plan *p, const struct cu_t &av,
                         const struct cu_t &bv, float *dst, int wpr)
{
    switch (wpr) {
    case 1: mmv_half_go<TYPE, NC, RW, 1>(c, p, av, bv, dst); break;
    case 2: mmv_half_go<TYPE, NC, RW, 2>(c, p, av, bv, dst); break;
    case 4: mmv_half_go<TYPE, NC, RW, 4>(c, p, av, bv, dst); break;
    default: mmv_half_go<TYPE, NC, RW, 8>(c, p, av, bv, dst); break;
    }
}

template <int TYPE, int NC>
static void mmv_half_rw(struct cu_ctx *c, const struct cu_mm_plan *p, const struct cu_t &av,
                        const struct cu_t &bv, float *dst)
{
    int rw, wpr;
    mmv_half_cut(c, p, &rw, &wpr);
    if (rw == 4)
        mmv_half_wpr<TYPE, NC, 4>(c, p, av, bv, dst, wpr);
    else
        mmv_half_wpr<TYPE, NC, 1>(c, p, av, bv, dst, wpr);
}

template <int TYPE>
static void mmv_half_launch(struct cu_ctx *c, const struct cu_mm_plan *p, const struct cu_t &av,
                            const struct cu_t &bv, float *dst)
{
    if (p->N <= 1)
        mmv_half_rw<TYPE, 1>(c, p, av, bv, dst);
    else if (p->N <= 2)
        mmv_half_rw<TYPE, 2>(c, p, av, bv, dst);
    else if (p->N <= 4)
        mmv_half_rw<TYPE, 4>(c, p, av, bv, dst);
    else
        mmv_half_rw<TYPE, 8>(c, p, av, bv, dst);
}

static lt_status run_mmv(struct cu_ctx *c, const struct cu_mm_plan *p, const struct lt_tensor *a,
                         const struct lt_tensor *b, float *dst)
{
    const struct cu_t av = cu_view(a), bv = cu_view(b);
    const bool vec = (a->type == LT_TYPE_F16 || a->type == LT_TYPE_BF16) && a->nb[0] == 2 &&
                     p->K % 8 == 0 && (uintptr_t)a->data % 16 == 0 &&
                     (p->M <= 1 || a->nb[1] % 16 == 0) && (p->A2 <= 1 || a->nb[2] % 16 == 0) &&
                     (p->A3 <= 1 || a->nb[3] % 16 == 0);
    switch (a->type) {
    case LT_TYPE_F16:
        vec &&half_cols(p, bv) ? mmv_half_launch<LT_TYPE_F16>(c, p, av, bv, dst)
        : vec                  ? mmv_launch<LT_TYPE_F16, true>(c, p, av, bv, dst)
                               : mmv_launch<LT_TYPE_F16, false>(c, p, av, bv, dst);
        break;
    case LT_TYPE_BF16:
        vec &&half_cols(p, bv) ? mmv_half_launch<LT_TYPE_BF16>(c, p, av, bv, dst)
        : vec                  ? mmv_launch<LT_TYPE_BF16, true>(c, p, av, bv, dst)
                               : mmv_launch<LT_TYPE_BF16, false>(c, p, av, bv, dst);
        break;
    case LT_TYPE_Q4_0: mmv_launch<LT_TYPE_Q4_0, false>(c, p, av, bv, dst); break;
    case LT_TYPE_Q4_1: mmv_launch<LT_TYPE_Q4_1, false>(c, p, av, bv, dst); break;
    case LT_TYPE_Q5_0: mmv_launch<LT_TYPE_Q5_0, false>(c, p, av, bv, dst); break;
    case LT_TYPE_Q5_1: mmv_launch<LT_TYPE_Q5_1, false>(c, p, av, bv, dst); break;
    case LT_TYPE_Q8_0:
        q8_staged(p, av, bv) ? mmv_q8_0_launch(c, p, av, bv, dst)
                             : mmv_launch<LT_TYPE_Q8_0, false>(c, p, av, bv, dst);
        break;
    case LT_TYPE_Q4_K:
        q4k_words(p, av, bv) ? mmv_q4k_launch(c, p, av, bv, dst)
                             : mmv_launch<LT_TYPE_Q4_K, false>(c, p, av, bv, dst);
        break;
    case LT_TYPE_Q5_K: mmv_launch<LT_TYPE_Q5_K, false>(c, p, av, bv, dst); break;
    case LT_TYPE_Q6_K: mmv_launch<LT_TYPE_Q6_K, false>(c, p, av, bv, dst); break;
    default: mmv_launch<-1, false>(c, p, av, bv, dst); break; /* Q2_K, Q3_K, Q8_K, ... */
    }
    return cu_launched("mul_mat mmv");
}

static void matmul_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    struct cu_mm_plan p;
    char reason[CU_REASON_MAX];
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
    char reason[CU_REASON_MAX];
    struct cu_mm_plan p;
    if (!cu_mm_supported_plan(node, &p, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    if (lt_nelements(node) == 0)
        return LT_OK;
    if (p.K == 0)
        return cu_check(cudaMemsetAsync(node->data, 0, lt_nbytes(node), c->stream),
                        "zeroing an empty product");
    if (p.mmvq)
        return cu_mmvq_run(c, a, b, (float *)node->data, p.r2, p.r3);
    if (p.mmv)
        return run_mmv(c, &p, a, b, (float *)node->data);
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
        convert_b_kernel<<<cu_blocks(nb_, 256), 256, 0, c->stream>>>(cu_view(b), (char *)bc,
                                                                     (int)p.ct, (int)p.es);
        st = cu_launched("mul_mat convert_b");
        if (st != LT_OK)
            return st;
        bbase = (const char *)bc;
    }
    if (p.a_direct)
        return run_direct(c, &p, a, bbase, (float *)node->data);
    return run_tiled(c, &p, a, bbase, (float *)node->data);
}

const struct cu_family cu_family_matmul = {
    "matmul",          matmul_ops,    CU_COUNT(matmul_ops), cu_matmul_supported,
    cu_matmul_compute, matmul_scratch};
