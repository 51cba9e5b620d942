/* matmul.c: MUL_MAT, the matrix product, on the CPU through OpenBLAS.
 *
 * Seen row-major, one (i2, i3) slice is C = B * A^T: A is a's head as an M x K matrix (row
 * m is a[:, m]), B is b's slice as N x K, and C is dst's slice as N x M with ldc = M (dst
 * is always contiguous). Every layout is taken:
 *   - an F32 operand whose rows or columns are unit-strided goes to sgemm as it is (its
 *     other stride becomes the leading dimension, a transposed view becomes a transpose);
 *   - any other b is first copied, by all threads, into contiguous F32 scratch (then a
 *     barrier): strided F32, or an F16 / BF16 b, which a of the same type may meet (an
 *     activation a device multiplies without converting it; here it is only widened);
 *   - any other a (F16, BF16, quantised, or F32 with odd strides) is converted to F32 a
 *     tile of rows at a time, each thread its own tile in its own scratch, just before the
 *     sgemm that uses it, so the tile is still in cache and scratch stays small even for
 *     an output head of 150k rows.
 * Decode and small batches take another road (mm_dot_*): when at most MM_DOT_MAX_ROWS rows
 * of b share one head of a, a's rows are unit-strided (or, for F32/F16/BF16, its columns:
 * attention's V), and a is F32, F16, BF16 or a quantised type with a dot kernel
 * (core/quant_dot.h), each output is a dot product
 * straight from a's row, never converted to floats into memory: the b rows are read in
 * place (F32, F16, BF16 a, and by default the quantised formats with an F32-activation
 * AVX2 kernel: Q4_0..Q8_0, Q4_K..Q6_K; copied when strided), or, with
 * LATHE_MATMUL_DOT=int8, quantised to int8 blocks for quantised a (the result is then exact
 * up to that activation rounding, bounded in quant_dot.h), by each thread for itself, so
 * no barrier is needed. Output rows are divided
 * among the threads as below. Larger N (prefill, training) stays on BLAS, and so does a
 * node autodiff differentiates (training graphs keep F32 numerics).
 * Parallelism is ours, not OpenBLAS's: OpenBLAS is set to one thread once, and the output
 * is cut into units (a batch of b slices sharing one a head, times a range of m) that the
 * pool threads divide; no two threads write the same element of dst. The plan (forms,
 * folding, units, tile height) is a pure function of the node and nth, so every thread and
 * cpu_work_size compute the same one.
 *
 * The backward rule (MUL_MAT's and MUL_MAT_ACC's) is src/ops/matmul_grad.c. */
#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/quant_dot.h"
#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

/* b may be F16 or BF16 when a is of that same type (the result stays F32) */
static bool half_pair(enum lt_type ta, enum lt_type tb)
{
    return (tb == LT_TYPE_F16 || tb == LT_TYPE_BF16) && ta == tb;
}

static struct lt_tensor *mul_mat_new(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                                     enum lt_type type)
{
    LT_REQUIRE("mul_mat", a, b);
    const struct lt_type_traits *ta = lt_type_traits(a->type);
    if (!ta || !ta->to_float) {
        lt_fail(LT_ERR_INVALID, "mul_mat: '%s' is %s, which cannot be read", a->name,
                lt_type_name(a->type));
        return NULL;
    }
    if (b->type != LT_TYPE_F32 && !half_pair(a->type, b->type)) {
        lt_fail(LT_ERR_INVALID, "mul_mat: '%s' is %s, not f32 nor %s's own type (%s)", b->name,
                lt_type_name(b->type), a->name, lt_type_name(a->type));
        return NULL;
    }
    if (a->ne[0] != b->ne[0] || a->ne[2] == 0 || a->ne[3] == 0 || b->ne[2] % a->ne[2] != 0 ||
        b->ne[3] % a->ne[3] != 0) {
        lt_fail(LT_ERR_INVALID,
                "mul_mat: '%s' [%lld, %lld, %lld, %lld] and '%s' [%lld, %lld, %lld, %lld] do not "
                "fit (ne0 equal, b's dims 2 and 3 multiples of a's)",
                a->name, (long long)a->ne[0], (long long)a->ne[1], (long long)a->ne[2],
                (long long)a->ne[3], b->name, (long long)b->ne[0], (long long)b->ne[1],
                (long long)b->ne[2], (long long)b->ne[3]);
        return NULL;
    }
    if (type != LT_TYPE_F32 && (!half_pair(a->type, b->type) || type != a->type)) {
        lt_fail(LT_ERR_INVALID,
                "mul_mat of '%s' (%s) and '%s' (%s) into %s: a half result takes operands of "
                "its own type",
                a->name, lt_type_name(a->type), b->name, lt_type_name(b->type), lt_type_name(type));
        return NULL;
    }
    int64_t ne[4] = {a->ne[1], b->ne[1], b->ne[2], b->ne[3]};
    return lt_new_op_tensor(ctx, LT_OP_MUL_MAT, type, 4, ne, (struct lt_tensor *[]){a, b}, 2);
}

struct lt_tensor *lt_mul_mat(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b)
{
    return mul_mat_new(ctx, a, b, LT_TYPE_F32);
}

struct lt_tensor *lt_mul_mat_as(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                                enum lt_type type)
{
    return mul_mat_new(ctx, a, b, type);
}

struct lt_tensor *lt_mul_mat_acc(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b,
                                 struct lt_tensor *c)
{
    return lt_mul_mat_acc_scaled(ctx, a, b, c, 1.0f);
}

float lt_mul_mat_acc_alpha(const struct lt_tensor *node)
{
    return node && node->op == LT_OP_MUL_MAT_ACC ? lt_get_param_f32(node, 0) : 1.0f;
}

struct lt_tensor *lt_mul_mat_acc_scaled(struct lt_ctx *ctx, struct lt_tensor *a,
                                        struct lt_tensor *b, struct lt_tensor *c, float alpha)
{
    LT_REQUIRE("mul_mat_acc", a, b, c);
    struct lt_tensor *checked = lt_mul_mat(ctx, a, b); /* the product's checks and shape */
    if (!checked)
        return NULL;
    if (c->type != LT_TYPE_F32 || !lt_is_contiguous(c) || !lt_same_shape(c, checked)) {
        lt_fail(LT_ERR_INVALID,
                "mul_mat_acc into '%s' (%s, %s, [%lld, %lld, %lld, %lld]): it takes contiguous "
                "f32 of the product's shape [%lld, %lld, %lld, %lld]",
                c->name, lt_type_name(c->type), lt_layout_name(c), (long long)c->ne[0],
                (long long)c->ne[1], (long long)c->ne[2], (long long)c->ne[3],
                (long long)checked->ne[0], (long long)checked->ne[1], (long long)checked->ne[2],
                (long long)checked->ne[3]);
        return NULL;
    }
    struct lt_tensor *t = lt_writer_over(ctx, c, LT_OP_MUL_MAT_ACC);
    if (!t)
        return NULL;
    t->src[0] = a;
    t->src[1] = b;
    t->src[2] = c;
    lt_set_param_f32(t, 0, alpha);
    return t;
}

/* ---- the plan ---- */

enum a_form {
    A_DIRECT_ROWS, /* F32, row m at stride lda floats: sgemm takes it transposed */
    A_DIRECT_COLS, /* F32, column k at stride lda floats (a transposed view) */
    A_TILE_ROWS,   /* elements of a row adjacent: to_float row by row */
    A_TILE_COLS,   /* rows adjacent (nb1 == type size): to_float along m, per k */
    A_TILE_GATHER, /* any other strides (not quantised): gather, then to_float */
};

enum b_form {
    B_ROWS, /* row n at stride ldb floats (possibly after copying) */
    B_COLS, /* column k at stride ldb floats (a transposed view) */
};

struct mm_plan {
    int64_t K, M, N, B2, B3, r2, r3;
    enum a_form a_form;
    int64_t lda;
    enum b_form b_form;
    bool b_copy; /* b is copied into contiguous scratch first */
    int64_t ldb;
    size_t b_nb2, b_nb3; /* b's slice strides in bytes (of the copy, if copied) */
    int fold;            /* 0: one b slice per batch; 1: r2 slices sharing a head; 2: all */
    int64_t n_batches, n_eff, chunks, tile;
    size_t b_copy_bytes, thread_bytes; /* scratch: the b copy, then one region per thread */
    /* the dot path (dot != NULL): units are a's heads times chunks of m */
    const struct lt_dot_kernel *dot;
    enum lt_simd simd;
    int64_t dot_rows;  /* rows of b per head of a: N * r2 * r3 */
    size_t dot_x_row;  /* bytes of one prepared b row (lt_q8a blocks or floats) */
    size_t dot_x_direct; /* F32 activations: b's rows are read in place, this far apart */
    bool dot_cols;       /* a's columns are unit-strided (a transposed view): dot_cols */
    int64_t a_heads;   /* a->ne[2] * a->ne[3] */
};

/* The dot path serves at most this many b rows per head of a: past it, converting a's
 * rows once and multiplying by BLAS is faster (bench/bench_cpu_decode.py and the dot
 * bench in tests/test_quant_dot.c measure where). */
#define MM_DOT_MAX_ROWS 8
/* Weight rows per kernel call: small enough that they stay in L1/L2 while more than
 * LT_DOT_MAX_X b rows pass over them. */
#define MM_DOT_ROW_BLOCK 16

#define SCRATCH_ALIGN 64

static size_t align_up(size_t n) { return (n + SCRATCH_ALIGN - 1) & ~(size_t)(SCRATCH_ALIGN - 1); }

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* An F32 matrix of `rows` rows of `cols` elements, element stride s0 and row stride s1
 * (bytes): can sgemm take it directly, and how? */
static bool f32_rows_ld(int64_t cols, int64_t rows, size_t s0, size_t s1, int64_t *ld)
{
    if (s0 != sizeof(float))
        return false;
    if (rows <= 1) {
        *ld = cols > 1 ? cols : 1;
        return true;
    }
    if (s1 % sizeof(float) != 0 || (int64_t)(s1 / sizeof(float)) < cols ||
        !fits_int((int64_t)(s1 / sizeof(float))))
        return false;
    *ld = (int64_t)(s1 / sizeof(float));
    return true;
}

static bool f32_cols_ld(int64_t cols, int64_t rows, size_t s0, size_t s1, int64_t *ld)
{
    if (s1 != sizeof(float) || rows <= 1)
        return false;
    if (cols <= 1) {
        *ld = rows;
        return true;
    }
    if (s0 % sizeof(float) != 0 || (int64_t)(s0 / sizeof(float)) < rows ||
        !fits_int((int64_t)(s0 / sizeof(float))))
        return false;
    *ld = (int64_t)(s0 / sizeof(float));
    return true;
}

/* Storage roots are 64-byte aligned, so a view's float alignment is its offset's; the data
 * pointer is not used, so the plan can be made before data is placed. */
static bool floats_aligned(const struct lt_tensor *t)
{
    return t->view_offs % sizeof(float) == 0 && t->nb[2] % sizeof(float) == 0 &&
           t->nb[3] % sizeof(float) == 0;
}

/* The stride in bytes at which rows (i1, then the dims up to `last`) of b follow one
 * another when flattened into one index, or 0 when they do not lie at one stride. */
static size_t uniform_row_stride(const int64_t *ne, const size_t *nb, int last, size_t one_row)
{
    size_t s = 0;
    int64_t before = 1;
    for (int d = 1; d <= last; d++) {
        if (ne[d] == 1)
            continue;
        if (nb[d] == 0)
            return 0; /* a broadcast (stride 0) dimension: rows repeat, no single stride */
        if (s == 0)
            s = nb[d];
        else if (nb[d] != s * (size_t)before)
            return 0;
        before *= ne[d];
    }
    return s ? s : one_row;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* What the dot path may do, read once from LATHE_MATMUL_DOT: "exact" (the default: float
 * activations only: F32/F16/BF16 a, and quantised a with an F32-activation kernel
 * (lt_dot_kernel_f32x); other quantised a goes to dequantise + BLAS), "int8"
 * (quantised a meets int8 activations, as llama.cpp does: about 3x faster decode of a Q4_1
 * SmolLM2, but its greedy answers drift: "What is the capital of France?" stops saying
 * Paris, as llama.cpp's does too), "off" (everything to BLAS, for measuring). Correct
 * first: int8 is opt-in until it is shown not to change answers. */
enum mm_dot_mode { MM_DOT_INT8, MM_DOT_EXACT, MM_DOT_OFF };
static enum mm_dot_mode dot_mode = MM_DOT_EXACT;
static pthread_once_t dot_mode_once = PTHREAD_ONCE_INIT;

static void dot_mode_read(void)
{
    const char *env = getenv("LATHE_MATMUL_DOT");
    if (env && !strcmp(env, "int8"))
        dot_mode = MM_DOT_INT8;
    else if (env && !strcmp(env, "off"))
        dot_mode = MM_DOT_OFF;
}

/* Takes the dot path for node when it fits (see the file comment); fills p's dot fields.
 * A node that autodiff differentiates (node->grad: a training step or a gradient check)
 * never meets quantised activations: its loss and gradients must be the F32 ones, and a
 * forward that is piecewise constant in b would defeat finite differences. */
static bool mm_dot_plan(const struct lt_tensor *node, int nth, struct mm_plan *p)
{
    const struct lt_tensor *a = node->src[0];
    const struct lt_type_traits *ta = lt_type_traits(a->type);
    pthread_once(&dot_mode_once, dot_mode_read);
    enum lt_simd simd = lt_simd_best();
    const struct lt_dot_kernel *k = lt_dot_kernel(a->type, simd);
    int64_t rows = p->N * p->r2 * p->r3;
    /* exact numerics (the default, and every differentiated node): a kernel that reads the
     * activations as floats, where the weight type has one */
    if (k && k->quantised_x && (dot_mode == MM_DOT_EXACT || node->grad))
        k = lt_dot_kernel_f32x(a->type, simd);
    if (!k || dot_mode == MM_DOT_OFF)
        return false;
    bool by_cols = a->nb[0] != ta->type_size;
    if ((by_cols && (!k->dot_cols || a->nb[1] != ta->type_size)) || p->K <= 0 || p->M <= 0 ||
        p->K % k->k_multiple || rows <= 0 || rows > MM_DOT_MAX_ROWS)
        return false;
    const struct lt_tensor *b = node->src[1];
    p->dot = k;
    p->dot_cols = by_cols;
    p->simd = simd;
    p->dot_rows = rows;
    p->dot_x_row = align_up(lt_dot_x_row_size(k, p->K));
    p->a_heads = a->ne[2] * a->ne[3];
    int64_t g = gcd64(p->a_heads, nth);
    p->chunks = nth / g;
    if (p->chunks > p->M)
        p->chunks = p->M;
    /* F32 activations whose rows (for one head of a) lie at one stride are read in place */
    int64_t ne[4] = {1, p->N, p->r2, p->r3};
    if (!k->quantised_x && b->type == LT_TYPE_F32 && b->nb[0] == sizeof(float))
        p->dot_x_direct = uniform_row_stride(ne, b->nb, 3, (size_t)p->K * sizeof(float));
    /* otherwise the prepared rows, and for quantised a one b row as floats (b may be
     * strided) */
    if (!p->dot_x_direct)
        p->thread_bytes = (size_t)rows * p->dot_x_row +
                          (k->quantised_x ? align_up((size_t)p->K * sizeof(float)) : 0);
    return true;
}

static void mm_plan_make(const struct lt_tensor *node, int nth, struct mm_plan *p)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const struct lt_type_traits *ta = lt_type_traits(a->type);
    memset(p, 0, sizeof(*p));
    p->K = a->ne[0];
    p->M = a->ne[1];
    p->N = b->ne[1];
    p->B2 = b->ne[2];
    p->B3 = b->ne[3];
    p->r2 = b->ne[2] / a->ne[2];
    p->r3 = b->ne[3] / a->ne[3];
    if (mm_dot_plan(node, nth, p))
        return;

    /* a */
    bool a_al = a->type == LT_TYPE_F32 && floats_aligned(a);
    if (a_al && f32_rows_ld(p->K, p->M, a->nb[0], a->nb[1], &p->lda))
        p->a_form = A_DIRECT_ROWS;
    else if (a_al && f32_cols_ld(p->K, p->M, a->nb[0], a->nb[1], &p->lda))
        p->a_form = A_DIRECT_COLS;
    else if (a->nb[0] == ta->type_size || ta->is_quantized)
        p->a_form = A_TILE_ROWS;
    else if (a->nb[1] == ta->type_size && p->M > 1)
        p->a_form = A_TILE_COLS;
    else
        p->a_form = A_TILE_GATHER;

    /* b */
    bool b_al = b->type == LT_TYPE_F32 && floats_aligned(b);
    p->b_nb2 = b->nb[2];
    p->b_nb3 = b->nb[3];
    if (b_al && f32_rows_ld(p->K, p->N, b->nb[0], b->nb[1], &p->ldb)) {
        p->b_form = B_ROWS;
    } else if (b_al && f32_cols_ld(p->K, p->N, b->nb[0], b->nb[1], &p->ldb)) {
        p->b_form = B_COLS;
    } else {
        p->b_form = B_ROWS;
        p->b_copy = true;
        p->ldb = p->K > 0 ? p->K : 1;
        p->b_nb2 = (size_t)(p->K * p->N) * sizeof(float);
        p->b_nb3 = p->b_nb2 * (size_t)p->B2;
        p->b_copy_bytes = align_up((size_t)(p->K * p->N * p->B2 * p->B3) * sizeof(float));
    }

    /* fold b slices that share an a head into one taller B when their rows lie at one
     * stride: r2 grouped heads (GQA decode), or every slice when a has a single head */
    p->fold = 0;
    p->n_eff = p->N;
    p->n_batches = p->B2 * p->B3;
    if (p->b_form == B_ROWS && p->K > 0 && p->N > 0) {
        size_t one_row = (size_t)p->ldb * sizeof(float);
        int64_t ne[4] = {1, p->N, p->B2, p->B3};
        size_t nb[4] = {sizeof(float), p->N > 1 ? (size_t)p->ldb * sizeof(float) : 0, p->b_nb2,
                        p->b_nb3};
        if (p->N == 1)
            nb[1] = one_row;
        size_t s;
        if (a->ne[2] == 1 && a->ne[3] == 1 && p->B2 * p->B3 > 1 &&
            fits_int(p->N * p->B2 * p->B3) &&
            (s = uniform_row_stride(ne, nb, 3, one_row)) && s % sizeof(float) == 0 &&
            (int64_t)(s / sizeof(float)) >= p->K && fits_int((int64_t)(s / sizeof(float)))) {
            p->fold = 2;
            p->ldb = (int64_t)(s / sizeof(float));
            p->n_eff = p->N * p->B2 * p->B3;
            p->n_batches = 1;
        } else if (p->r2 > 1 && fits_int(p->N * p->r2)) {
            ne[2] = p->r2;
            if ((s = uniform_row_stride(ne, nb, 2, one_row)) && s % sizeof(float) == 0 &&
                (int64_t)(s / sizeof(float)) >= p->K && fits_int((int64_t)(s / sizeof(float)))) {
                p->fold = 1;
                p->ldb = (int64_t)(s / sizeof(float));
                p->n_eff = p->N * p->r2;
                p->n_batches = (p->B2 / p->r2) * p->B3;
            }
        }
    }

    /* units: n_batches x chunks of m, a multiple of nth where possible */
    int64_t g = p->n_batches > 0 ? gcd64(p->n_batches, nth) : nth;
    p->chunks = nth / g;
    if (p->chunks > p->M)
        p->chunks = p->M > 0 ? p->M : 1;

    /* tile height for converted a: small enough to stay in cache for a few b rows (decode),
     * tall enough that sgemm's packing of B is amortised for many (prefill, training) */
    int64_t kk = p->K > 0 ? p->K : 1;
    int64_t t = p->n_eff <= 16 ? 65536 / kk : (1 << 20) / kk;
    int64_t lo = p->n_eff <= 16 ? 16 : 64, hi = p->n_eff <= 16 ? 256 : 1024;
    t = t < lo ? lo : t > hi ? hi : t;
    p->tile = t < p->M ? t : (p->M > 0 ? p->M : 1);
    if (p->a_form == A_DIRECT_ROWS || p->a_form == A_DIRECT_COLS) {
        p->thread_bytes = 0;
    } else {
        size_t gather = p->a_form == A_TILE_GATHER ? (size_t)p->K * ta->type_size : 0;
        p->thread_bytes = align_up((size_t)(p->tile * p->K) * sizeof(float)) + align_up(gather);
    }
}

static size_t f32_product_bytes(const struct lt_tensor *node)
{
    return ((size_t)lt_nelements(node) * sizeof(float) + 63) & ~(size_t)63;
}

/* the node as the MUL_MAT writing its F32 product at `data` (a half result's, before its
 * rounding; MUL_MAT_ACC's, before its sum) */
static struct lt_tensor product_of(const struct lt_tensor *node, void *data)
{
    struct lt_tensor t = *node;
    t.op = LT_OP_MUL_MAT;
    t.type = LT_TYPE_F32;
    t.nb[0] = sizeof(float);
    for (int d = 1; d < LT_MAX_DIMS; d++)
        t.nb[d] = t.nb[d - 1] * (size_t)t.ne[d - 1];
    t.src[2] = NULL;
    t.view_src = NULL;
    t.view_offs = 0;
    t.data = data;
    return t;
}

static size_t mul_mat_f32_work_size(const struct lt_tensor *node, int nth)
{
    struct mm_plan p;
    mm_plan_make(node, nth, &p);
    return p.b_copy_bytes + (size_t)nth * p.thread_bytes;
}

/* a half result: the F32 product in scratch first, then rounded */
static size_t mul_mat_work_size(const struct lt_tensor *node, int nth)
{
    if (node->type == LT_TYPE_F32)
        return mul_mat_f32_work_size(node, nth);
    const struct lt_tensor t = product_of(node, NULL);
    return f32_product_bytes(node) + mul_mat_f32_work_size(&t, nth);
}

static bool mul_mat_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const struct lt_type_traits *ta = lt_type_traits(a->type);
    if (!ta || !ta->to_float) {
        snprintf(reason, reason_size, "source 0 is %s, which the CPU cannot read",
                 lt_type_name(a->type));
        return false;
    }
    if (ta->is_quantized && a->nb[0] != ta->type_size) {
        snprintf(reason, reason_size, "source 0 is quantised with split blocks");
        return false;
    }
    if (b->type != LT_TYPE_F32 && !half_pair(a->type, b->type)) {
        snprintf(reason, reason_size, "source 1 is %s, not f32 nor source 0's type (%s)",
                 lt_type_name(b->type), lt_type_name(a->type));
        return false;
    }
    if ((node->type != LT_TYPE_F32 && (!half_pair(a->type, b->type) || node->type != a->type)) ||
        !lt_is_contiguous(node)) {
        snprintf(reason, reason_size,
                 "the result is not contiguous f32 (nor of its half operands' type)");
        return false;
    }
    if (a->ne[0] != b->ne[0] || a->ne[2] == 0 || a->ne[3] == 0 || b->ne[2] % a->ne[2] ||
        b->ne[3] % a->ne[3] || node->ne[0] != a->ne[1] || node->ne[1] != b->ne[1] ||
        node->ne[2] != b->ne[2] || node->ne[3] != b->ne[3]) {
        snprintf(reason, reason_size, "the shapes of the sources and result do not fit");
        return false;
    }
    if (!fits_int(a->ne[0]) || !fits_int(a->ne[1]) || !fits_int(b->ne[1])) {
        snprintf(reason, reason_size, "a matrix dimension exceeds what BLAS takes (2^31 - 1)");
        return false;
    }
    return true;
}

/* ---- the kernel ---- */

/* Row converters for the half types, the common weight types after F32: the type table's
 * to_float calls a scalar converter per element; these give the same (exact) values in
 * bulk, F16 with the CPU's F16C instructions where it has them. */
typedef void (*row_to_f32_fn)(const void *src, float *dst, int64_t n);

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

static void bf16_row(const void *src, float *dst, int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    /* SSE2 (every x86-64): interleaving zeros below each half gives h << 16 */
    const __m128i zero = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
        _mm_storeu_si128((__m128i *)(dst + i), _mm_unpacklo_epi16(zero, h));
        _mm_storeu_si128((__m128i *)(dst + i + 4), _mm_unpackhi_epi16(zero, h));
    }
#endif
    for (; i < n; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(&dst[i], &u, sizeof(u));
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx,f16c"))) static void f16_row_f16c(const void *src, float *dst,
                                                              int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        dst[i] = lt_fp16_to_fp32(s[i]);
}
#endif

static row_to_f32_fn f16_row = NULL; /* NULL: the type table's */

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void)
{
    openblas_set_num_threads(1);
#if defined(__x86_64__) && defined(__GNUC__)
    if (lt_simd_best() == LT_SIMD_AVX2) /* AVX2 level includes F16C */
        f16_row = f16_row_f16c;
#endif
}

static row_to_f32_fn row_converter(enum lt_type type)
{
    if (type == LT_TYPE_BF16)
        return bf16_row;
    if (type == LT_TYPE_F16 && f16_row)
        return f16_row;
    return lt_type_traits(type)->to_float;
}

/* Copies b (any strides, F32 or half) into contiguous F32 scratch, rows split among the
 * threads. */
static void copy_b(const struct lt_compute_params *prm, const struct lt_tensor *b, float *dst)
{
    int64_t K = b->ne[0], rows = b->ne[1] * b->ne[2] * b->ne[3];
    int64_t lo, hi;
    lt_split_range(rows, prm->ith, prm->nth, &lo, &hi);
    size_t s0 = b->nb[0];
    for (int64_t r = lo; r < hi; r++) {
        int64_t i1 = r % b->ne[1], i2 = (r / b->ne[1]) % b->ne[2], i3 = r / (b->ne[1] * b->ne[2]);
        const char *src = (const char *)b->data + i1 * b->nb[1] + i2 * b->nb[2] + i3 * b->nb[3];
        float *d = dst + r * K;
        if (b->type != LT_TYPE_F32) {
            lt_row_to_f32(b, i1, i2, i3, d);
            continue;
        }
        for (int64_t k = 0; k < K; k++)
            memcpy(&d[k], src + k * s0, sizeof(float));
    }
}

/* Converts rows [m0, m0 + tl) of a's head at `head` into tile: tl x K for A_TILE_ROWS and
 * A_TILE_GATHER, K x tl for A_TILE_COLS. */
static void convert_a_tile(const struct mm_plan *p, const struct lt_tensor *a, const char *head,
                           int64_t m0, int64_t tl, float *tile, void *gather)
{
    const struct lt_type_traits *ta = lt_type_traits(a->type);
    row_to_f32_fn to_float = row_converter(a->type);
    int64_t K = p->K;
    size_t s0 = a->nb[0], s1 = a->nb[1];
    switch (p->a_form) {
    case A_TILE_ROWS:
        for (int64_t m = 0; m < tl; m++)
            to_float(head + (m0 + m) * s1, tile + m * K, K);
        break;
    case A_TILE_COLS:
        for (int64_t k = 0; k < K; k++)
            to_float(head + k * s0 + m0 * s1, tile + k * tl, tl);
        break;
    case A_TILE_GATHER:
        for (int64_t m = 0; m < tl; m++) {
            const char *row = head + (m0 + m) * s1;
            float *out = tile + m * K;
            if (a->type == LT_TYPE_F32) {
                for (int64_t k = 0; k < K; k++)
                    memcpy(&out[k], row + k * s0, sizeof(float));
            } else if (ta->type_size == 2) {
                uint16_t *g = gather;
                for (int64_t k = 0; k < K; k++)
                    memcpy(&g[k], row + k * s0, 2);
                to_float(g, out, K);
            } else {
                char *g = gather;
                for (int64_t k = 0; k < K; k++)
                    memcpy(g + (size_t)k * ta->type_size, row + k * s0, ta->type_size);
                to_float(g, out, K);
            }
        }
        break;
    default:
        break;
    }
}

/* C[n_eff x mlen] (ldc) = B * A^T for one unit, with A given as (ap, lda, transposed?) */
static void gemm_unit(const struct mm_plan *p, const float *bp, const float *ap, int64_t lda,
                      bool a_rows, int64_t mlen, float *cp)
{
    if (p->K == 0) {
        for (int64_t n = 0; n < p->n_eff; n++)
            memset(cp + n * p->M, 0, (size_t)mlen * sizeof(float));
        return;
    }
    if (p->n_eff == 1) {
        int incx = p->b_form == B_ROWS ? 1 : (int)p->ldb;
        if (a_rows)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)mlen, (int)p->K, 1.0f, ap, (int)lda, bp,
                        incx, 0.0f, cp, 1);
        else
            cblas_sgemv(CblasRowMajor, CblasTrans, (int)p->K, (int)mlen, 1.0f, ap, (int)lda, bp,
                        incx, 0.0f, cp, 1);
        return;
    }
    cblas_sgemm(CblasRowMajor, p->b_form == B_ROWS ? CblasNoTrans : CblasTrans,
                a_rows ? CblasTrans : CblasNoTrans, (int)p->n_eff, (int)mlen, (int)p->K, 1.0f, bp,
                (int)p->ldb, ap, (int)lda, 0.0f, cp, (int)p->M);
}

/* Prepares the b rows that meet head (i2a, i3a) of a: row r is b's (i1, i2, i3) with
 * i1 = r % N and the group index r / N running over i2 first; quantised (or copied as
 * floats) into xs, one row every p->dot_x_row bytes. f32 is room for one row of floats. */
static void mm_dot_prepare(const struct mm_plan *p, const struct lt_tensor *b, int64_t i2a,
                           int64_t i3a, char *xs, float *f32)
{
    for (int64_t r = 0; r < p->dot_rows; r++) {
        int64_t i1 = r % p->N, grp = r / p->N;
        int64_t i2 = i2a * p->r2 + grp % p->r2, i3 = i3a * p->r3 + grp / p->r2;
        const char *src = (const char *)b->data + i1 * b->nb[1] + i2 * b->nb[2] + i3 * b->nb[3];
        char *x = xs + r * p->dot_x_row;
        float *row = p->dot->quantised_x ? f32 : (float *)x;
        if (b->type != LT_TYPE_F32) {
            lt_row_to_f32(b, i1, i2, i3, row); /* a half b (only ever with a half a) */
        } else if (b->nb[0] == sizeof(float) && p->dot->quantised_x) {
            row = (float *)src; /* read in place (b's rows are float aligned) */
        } else if (b->nb[0] == sizeof(float)) {
            memcpy(row, src, (size_t)p->K * sizeof(float));
        } else {
            for (int64_t k = 0; k < p->K; k++)
                memcpy(&row[k], src + k * b->nb[0], sizeof(float));
        }
        if (p->dot->quantised_x)
            lt_q8a_quantise(row, (struct lt_q8a_block *)x, p->K, p->simd);
    }
}

static void mm_dot_forward(const struct lt_compute_params *prm, const struct mm_plan *p,
                           struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    char *xs = (char *)prm->wdata + (size_t)prm->ith * p->thread_bytes;
    float *f32 = (float *)(xs + (size_t)p->dot_rows * p->dot_x_row);
    int64_t units = p->a_heads * p->chunks, ulo, uhi, prepared = -1;
    lt_split_range(units, prm->ith, prm->nth, &ulo, &uhi);
    for (int64_t u = ulo; u < uhi; u++) {
        int64_t head = u / p->chunks, chunk = u % p->chunks;
        int64_t i2a = head % a->ne[2], i3a = head / a->ne[2];
        const char *x = xs;
        size_t x_stride = p->dot_x_row;
        if (p->dot_x_direct) {
            x = (const char *)b->data + i2a * p->r2 * b->nb[2] + i3a * p->r3 * b->nb[3];
            x_stride = p->dot_x_direct;
        } else if (head != prepared) {
            mm_dot_prepare(p, b, i2a, i3a, xs, f32);
            prepared = head;
        }
        int64_t m0, m1;
        lt_split_range(p->M, (int)chunk, (int)p->chunks, &m0, &m1);
        float *out[MM_DOT_MAX_ROWS]; /* where row r's results go, from m0 on */
        for (int64_t r = 0; r < p->dot_rows; r++) {
            int64_t i1 = r % p->N, grp = r / p->N;
            int64_t i2 = i2a * p->r2 + grp % p->r2, i3 = i3a * p->r3 + grp / p->r2;
            out[r] = (float *)((char *)node->data + i1 * node->nb[1] + i2 * node->nb[2] +
                               i3 * node->nb[3]) +
                     m0;
        }
        const char *wrows = (const char *)a->data + i2a * a->nb[2] + i3a * a->nb[3] + m0 * a->nb[1];
        if (p->dot_cols) { /* all of [m0, m1) per call: a's rows run along m */
            for (int64_t r0 = 0; r0 < p->dot_rows; r0 += LT_DOT_MAX_X) {
                int nx = (int)(p->dot_rows - r0 < LT_DOT_MAX_X ? p->dot_rows - r0 : LT_DOT_MAX_X);
                const char *acols = (const char *)a->data + i2a * a->nb[2] + i3a * a->nb[3] +
                                    m0 * a->nb[1];
                p->dot->dot_cols(p->K, m1 - m0, acols, a->nb[0], x + r0 * x_stride, x_stride, nx,
                                 out + r0);
            }
            continue;
        }
        /* a block of weight rows per call, all b rows (up to LT_DOT_MAX_X at once) each:
         * the block stays in cache while the b rows beyond the first LT_DOT_MAX_X meet it */
        for (int64_t mb = 0; mb < m1 - m0; mb += MM_DOT_ROW_BLOCK) {
            int64_t nw = m1 - m0 - mb < MM_DOT_ROW_BLOCK ? m1 - m0 - mb : MM_DOT_ROW_BLOCK;
            for (int64_t r0 = 0; r0 < p->dot_rows; r0 += LT_DOT_MAX_X) {
                int nx = (int)(p->dot_rows - r0 < LT_DOT_MAX_X ? p->dot_rows - r0 : LT_DOT_MAX_X);
                float *o[LT_DOT_MAX_X];
                for (int j = 0; j < nx; j++)
                    o[j] = out[r0 + j] + mb;
                p->dot->dot(p->K, wrows + mb * a->nb[1], a->nb[1], nw, x + r0 * x_stride,
                            x_stride, nx, o);
            }
        }
    }
}

static void mul_mat_f32_forward(const struct lt_compute_params *prm, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    struct mm_plan p;
    mm_plan_make(node, prm->nth, &p);
    if (p.dot) {
        mm_dot_forward(prm, &p, node);
        return;
    }
    pthread_once(&blas_once, blas_single_thread);

    char *scratch = prm->wdata;
    const char *bbase = b->data;
    if (p.b_copy) {
        copy_b(prm, b, (float *)scratch);
        bbase = scratch;
        lt_compute_barrier(prm);
    }
    if (p.M == 0 || p.n_eff == 0)
        return;
    float *tile = (float *)(scratch + p.b_copy_bytes + (size_t)prm->ith * p.thread_bytes);
    void *gather = (char *)tile + align_up((size_t)(p.tile * p.K) * sizeof(float));

    int64_t units = p.n_batches * p.chunks, ulo, uhi;
    lt_split_range(units, prm->ith, prm->nth, &ulo, &uhi);
    for (int64_t u = ulo; u < uhi; u++) {
        int64_t batch = u / p.chunks, chunk = u % p.chunks;
        int64_t i2, i3;
        if (p.fold == 2) {
            i2 = i3 = 0;
        } else if (p.fold == 1) {
            int64_t groups = p.B2 / p.r2;
            i2 = (batch % groups) * p.r2;
            i3 = batch / groups;
        } else {
            i2 = batch % p.B2;
            i3 = batch / p.B2;
        }
        const char *ahead = (const char *)a->data + (i2 / p.r2) * a->nb[2] + (i3 / p.r3) * a->nb[3];
        const float *bp = (const float *)(bbase + i2 * p.b_nb2 + i3 * p.b_nb3);
        float *cbase = (float *)((char *)node->data + i2 * node->nb[2] + i3 * node->nb[3]);
        int64_t m0, m1;
        lt_split_range(p.M, (int)chunk, (int)p.chunks, &m0, &m1);
        if (p.a_form == A_DIRECT_ROWS) {
            gemm_unit(&p, bp, (const float *)ahead + m0 * p.lda, p.lda, true, m1 - m0, cbase + m0);
            continue;
        }
        if (p.a_form == A_DIRECT_COLS) {
            gemm_unit(&p, bp, (const float *)ahead + m0, p.lda, false, m1 - m0, cbase + m0);
            continue;
        }
        for (int64_t t0 = m0; t0 < m1; t0 += p.tile) {
            int64_t tl = m1 - t0 < p.tile ? m1 - t0 : p.tile;
            convert_a_tile(&p, a, ahead, t0, tl, tile, gather);
            if (p.a_form == A_TILE_COLS)
                gemm_unit(&p, bp, tile, tl, false, tl, cbase + t0);
            else
                gemm_unit(&p, bp, tile, p.K > 0 ? p.K : 1, true, tl, cbase + t0);
        }
    }
}

/* ---- products through F32 scratch on the CPU: MUL_MAT's kernel on a copy of the node that
 * writes there, then a half result rounded from it, or MUL_MAT_ACC's added into c ---- */

/* the node's F32 product in scratch (the start of wdata; f32_product_bytes), and this
 * thread's share [*lo, *hi) of its elements, after a barrier */
static float *product_in_scratch(const struct lt_compute_params *prm, struct lt_tensor *node,
                                 int64_t *lo, int64_t *hi)
{
    float *prod = (float *)prm->wdata;
    struct lt_tensor t = product_of(node, prod);
    struct lt_compute_params q = *prm;
    q.wdata = (char *)prm->wdata + f32_product_bytes(node);
    q.wsize = prm->wsize - f32_product_bytes(node);
    mul_mat_f32_forward(&q, &t);
    lt_compute_barrier(prm);
    lt_split_range(lt_nelements(node), prm->ith, prm->nth, lo, hi);
    return prod;
}

static void mul_mat_forward(const struct lt_compute_params *prm, struct lt_tensor *node)
{
    if (node->type == LT_TYPE_F32) {
        mul_mat_f32_forward(prm, node);
        return;
    }
    int64_t lo, hi;
    const float *prod = product_in_scratch(prm, node, &lo, &hi);
    const struct lt_type_traits *tt = lt_type_traits(node->type);
    if (hi > lo)
        tt->from_float(prod + lo, (char *)node->data + (size_t)lo * tt->type_size, hi - lo);
}

static bool mul_mat_acc_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *c = node->src[2];
    if (!c || c->type != LT_TYPE_F32 || !lt_is_contiguous(c) || !lt_same_shape(c, node) ||
        node->view_src != lt_storage_root((struct lt_tensor *)c)) {
        snprintf(reason, reason_size,
                 "source 2 is not the contiguous f32 the result is written over");
        return false;
    }
    return mul_mat_supported(node, reason, reason_size);
}

static size_t mul_mat_acc_work_size(const struct lt_tensor *node, int nth)
{
    const struct lt_tensor t = product_of(node, NULL);
    return f32_product_bytes(node) + mul_mat_work_size(&t, nth);
}

static void mul_mat_acc_forward(const struct lt_compute_params *prm, struct lt_tensor *node)
{
    int64_t lo, hi;
    const float *prod = product_in_scratch(prm, node, &lo, &hi);
    float *y = (float *)node->data; /* c's storage: contiguous */
    const float alpha = lt_mul_mat_acc_alpha(node);
    for (int64_t i = lo; i < hi; i++)
        y[i] += alpha * prod[i];
}

const struct lt_op_def lt_op_def_mul_mat = {
    .name = "MUL_MAT",
    .n_src = 2,
    .cpu_supported = mul_mat_supported,
    .cpu_work_size = mul_mat_work_size,
    .cpu_forward = mul_mat_forward,
    .backward = lt_mul_mat_backward,
};

/* the rule: c's gradient is the result's; a's and b's as MUL_MAT's */
const struct lt_op_def lt_op_def_mul_mat_acc = {
    .name = "MUL_MAT_ACC",
    .n_src = 3,
    .cpu_supported = mul_mat_acc_supported,
    .cpu_work_size = mul_mat_acc_work_size,
    .cpu_forward = mul_mat_acc_forward,
    .backward = lt_mul_mat_backward,
};
