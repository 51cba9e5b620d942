/* test_cuda_conformance.c: every op of ops.h on the CUDA backend against the CPU backend,
 * over layouts (contiguous, transposed, permuted, sliced, broadcast) and types (F32; F16
 * and BF16 where an op takes them; quantised weights for mul_mat and get_rows), through
 * the scheduler with {CUDA0, CPU}. Where CUDA says yes the node must run there and match
 * the CPU (normalised error under 1e-5 for F32, 1e-9 for F32 products, 1e-2 for products
 * through BF16/F16, 1e-4 for products through dequantised weights); where it says no the
 * node must land on the
 * CPU and the graph still give the CPU's result. Also: LATHE_CUDA_DISABLE_OPS moves the
 * named ops to the CPU in a mixed graph, refusals and failed allocations come back as
 * statuses, and a table (op, layouts tried, yes/no, worst error) is printed.
 * Exits 77 (skipped) without a GPU. */
#include <stdlib.h>

#include "gpu/conformance.h"
#include "model/model_impl.h" /* LT_MB_GATE_RESET */

#define TOL_F32 1e-5
#define TOL_HALF 1e-2
#define TOL_QUANT 1e-4
/* F32 products: cuBLAS in F32 differs from the CPU in summation order only (~1e-14 here).
 * TF32 tensor cores (10-bit mantissas, ~1e-7 here) would still pass TOL_F32, and would put
 * every F32 model ~3e-4 off transformers in lathe check-ref: this bound catches them. */
#define TOL_MM_F32 1e-9
/* F16 / BF16 weights: the same weights on both sides; the device rounds F32 activations to
 * the weight's type for cuBLAS (BF16: ~1e-5 normalised) or reads them as they are (mmv).
 * TOL_HALF, the element-wise ops' bound, would let a product 5% off pass. */
#define TOL_MM_HALF 1e-4
static double mm_f32_worst;
/* Q8_0, Q4_0 and Q5_0 weights against at most 8 F32 columns run mmvq on CUDA (unless
 * LATHE_CUDA_MMVQ=0):
 * b is rounded to int8 blocks of 32, q_i = round(x_i / d_b) with d_b = max|x| / 127 in its
 * block, so |x_i - d_b q_i| <= d_b / 2 (the bound of core/quant_dot.h; the weights are used
 * exactly). Against the CPU's exact product an output is off by sum_i w_i e_i, the e_i
 * those roundings, independent of each other and of the weights, each of mean square at
 * most (d_b / 2)^2 (d_b^2 / 12 when uniform), so the normalised error is about
 * E[e^2] / E[x^2]: with b uniform in [-1, 1) (d_b <= 1 / 127, E[x^2] = 1 / 3) at most
 * 3 / (4 * 127^2) = 4.7e-5 and typically 1 / (4 * 127^2) = 1.6e-5, within TOL_QUANT (1e-4;
 * cases of a few dozen outputs scatter around that by some 20%). With
 * LATHE_MATMUL_DOT=int8 the CPU rounds b identically (the same scale, reciprocal and
 * rounding, bit for bit), and where its dot path takes the node too (at most 8 b rows a
 * weight head: N * r2 * r3 <= 8, src/ops/matmul.c) the two differ only in the order of
 * float additions (~1e-12 here), so such cases are held to TOL_MMVQ_SAME: a wrong scale,
 * rounding or block order would show as ~1e-5. */
#define TOL_MMVQ_SAME 1e-9
/* RMS_NORM_MUL_MAT of Q8_0 / Q4_0 / Q5_0 weights (mmvq, its quantisation taking the norm):
 * the normed column x f w, w in [0.5, 1.5], has a block's largest element up to 1.5 / sqrt(
 * E[w^2]) ~ 1.44 times further from its rms than x alone, so the bound above doubles (~1e-4),
 * and a GLU output silu(g) u carries the roundings of both its rows: up to about twice that
 * again. A run of the whole suite put one GLU case at 1.5e-4. */
#define TOL_QUANT_NORMED 4e-4
/* DELTA_NET(_BACK) of LT_DELTA_NET_PREC_TF32 against the CPU's F32: every operand of the
 * chunked kernels' products is rounded to TF32 (relative error up to 2^-11, ~2.8e-4 rms), so a
 * product of random terms is ~3e-4 off in relative terms and its normalised squared error
 * ~1e-7. The H200 measured at most 1.8e-7 over these cases (forward) and 1.5e-7 (backward):
 * 2e-6 leaves ten times that, and a wrong term or index is O(1). */
#define TOL_DN_TF32 2e-6
/* DELTA_NET(_BACK) of LT_DELTA_NET_PREC_BF16: the prep's, the walks' and the grad kernel's
 * operands rounded to BF16 (relative error up to 2^-9, 4x TF32's), the forward's out kernel's
 * to TF32. Measured on the CUDA emulation (which rounds as the device does): worst normalised
 * squared error 5.4e-6 forward, 5.8e-6 backward with a TF32 prep, 8.4e-6 both with the BF16
 * prep; a wrong term or index is O(1). */
#define TOL_DN_BF16 2e-5
/* FLASH_ATTN(_BACK) of LT_FLASH_ATTN_PREC_BF16: q, k, v, do, the probabilities and dS enter
 * the products rounded to BF16 (relative error up to 2^-9). Measured on the CUDA emulation
 * (which rounds exactly as the device): see TOL_FA_BF16's note in the session record; a
 * wrong term or index is O(1). */
#define TOL_FA_BF16 5e-5

static bool env_is(const char *name, const char *value)
{
    const char *e = getenv(name);
    return e && strcmp(e, value) == 0;
}

/* whether the CPU oracle and CUDA both take the int8 route for this product */
static bool mmvq_same_rounding(enum lt_type t, int64_t N, int a2, int b2, int a3, int b3)
{
    return (t == LT_TYPE_Q8_0 || t == LT_TYPE_Q4_0 || t == LT_TYPE_Q5_0) && N <= 8 &&
           !env_is("LATHE_CUDA_MMVQ", "0") && env_is("LATHE_MATMUL_DOT", "int8") &&
           N * (b2 / a2) * (b3 / a3) <= 8;
}

static struct params P(int l0, int l1, enum lt_type t0, enum lt_type t1)
{
    struct params p = {{l0, l1, L_CONTIG, L_CONTIG}, {t0, t1, LT_TYPE_F32, LT_TYPE_F32}, {0}, {0},
                       {0}};
    return p;
}

static char label_buf[256];
static const char *lbl(const char *a, const char *b)
{
    snprintf(label_buf, sizeof(label_buf), "%s%s%s", a, b && b[0] ? "/" : "", b ? b : "");
    return label_buf;
}

/* ---- copies ---- */

/* i[0]: 240 elements (four floats a store on CUDA) instead of 210. A zero fill (a memset on
 * CUDA) takes an input into its first half (ACC, as a view's gradient does), so that the
 * result is not all zeros and the half left must still read zero */
static struct lt_tensor *b_fill(struct build *b, const struct params *p)
{
    static const int64_t ne[2][4] = {{7, 5, 3, 2}, {8, 5, 3, 2}};
    const int64_t *n = ne[p->i[0] ? 1 : 0];
    struct lt_tensor like = {0};
    like.type = LT_TYPE_F32;
    memcpy(like.ne, n, sizeof(ne[0]));
    struct lt_tensor *f = lt_fill(b->ctx, &like, p->f[0]);
    if (p->f[0] != 0.0f || !f)
        return f;
    struct lt_tensor *x = mk(b, LT_TYPE_F32, L_CONTIG, n[0], n[1], n[2], 1, FILL_UNIFORM, -1, 1);
    return lt_acc(b->ctx, f, x, f->nb[1], f->nb[2], f->nb[3], 0);
}

static struct lt_tensor *b_cont(struct build *b, const struct params *p)
{
    int64_t ne0 = lt_type_traits(p->type[0])->is_quantized ? 256 : 9;
    float hi = p->type[0] == LT_TYPE_I32 ? 100.0f : 2.0f;
    struct lt_tensor *a = mk(b, p->type[0], p->lay[0], ne0, 6, 3, 2,
                             p->type[0] == LT_TYPE_I32 ? FILL_INT : FILL_UNIFORM, -hi, hi);
    return lt_cont(b->ctx, a);
}

static struct lt_tensor *b_cpy(struct build *b, const struct params *p)
{
    int64_t ne0 = lt_type_traits(p->type[0])->is_quantized ? 256 : 9;
    struct lt_tensor *a = mk(b, p->type[0], p->lay[0], ne0, 6, 3, 2, FILL_UNIFORM, -2, 2);
    struct lt_tensor *d;
    if (p->i[0]) /* a destination of another shape with as many elements */
        d = mk(b, p->type[1], p->lay[1], ne0 * 3, 2, 6, 1, FILL_NONE, 0, 0);
    else
        d = mk(b, p->type[1], p->lay[1], ne0, 6, 3, 2, FILL_NONE, 0, 0);
    return lt_cpy(b->ctx, a, d);
}

static struct lt_tensor *b_concat(struct build *b, const struct params *p)
{
    int dim = p->i[0];
    int64_t ne[4] = {6, 5, 3, 2};
    struct lt_tensor *x = mk(b, p->type[0], p->lay[0], ne[0], ne[1], ne[2], ne[3], FILL_UNIFORM, -1, 1);
    ne[dim] = dim == 3 ? 1 : 4;
    struct lt_tensor *y = mk(b, p->type[1], p->lay[1], ne[0], ne[1], ne[2], ne[3], FILL_UNIFORM, -1, 1);
    return lt_concat(b->ctx, x, y, dim);
}

/* CONCAT into a half result (lt_concat_as): along dim 0, i[1] x 8 + 3 i[2] elements of x
 * then 16 of y a row (i[2] = 1: lengths that rule out the kernel's 16-byte words), 7 rows;
 * a third type or a dim other than 0 (i[0]) is what the device refuses */
static struct lt_tensor *b_concat_half(struct build *b, const struct params *p)
{
    const int64_t na = p->i[1] * 8 + 3 * p->i[2], nb = 16 - 3 * p->i[2];
    const int dim = p->i[0];
    struct lt_tensor *x = mk(b, p->type[0], p->lay[0], na, 7, 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *y = mk(b, p->type[1], p->lay[1], dim == 0 ? nb : na, dim == 1 ? 5 : 7, 1, 1,
                             FILL_UNIFORM, -1, 1);
    return lt_concat_as(b->ctx, x, y, dim, p->type[2]);
}

static struct lt_tensor *b_repeat(struct build *b, const struct params *p)
{
    struct lt_tensor *a = mk(b, p->type[0], p->lay[0], 4, p->i[0] ? 5 : 1, 3, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor like = {0};
    like.type = LT_TYPE_F32;
    like.ne[0] = 8, like.ne[1] = 5, like.ne[2] = 3, like.ne[3] = 2;
    return lt_repeat(b->ctx, a, &like);
}

static struct lt_tensor *b_repeat_back(struct build *b, const struct params *p)
{
    struct lt_tensor *a = mk(b, p->type[0], p->lay[0], 8, 6, 4, 2, FILL_UNIFORM, -1, 1);
    struct lt_tensor like = {0};
    like.type = LT_TYPE_F32;
    for (int i = 0; i < 4; i++)
        like.ne[i] = p->ne[i];
    return lt_repeat_back(b->ctx, a, &like);
}

/* many tiles down to a row (a norm weight's gradient): p->i[0..2] is a's shape after ne0 */
static struct lt_tensor *b_repeat_back_tall(struct build *b, const struct params *p)
{
    struct lt_tensor *a = mk(b, p->type[0], p->lay[0], p->ne[0], p->i[0], p->i[1], p->i[2],
                             FILL_UNIFORM, -1, 1);
    struct lt_tensor like = {0};
    like.type = LT_TYPE_F32;
    like.ne[0] = p->ne[0], like.ne[1] = like.ne[2] = like.ne[3] = 1;
    return lt_repeat_back(b->ctx, a, &like);
}

static struct lt_tensor *b_get_rows(struct build *b, const struct params *p)
{
    int64_t n = lt_type_traits(p->type[0])->is_quantized ? 256 : 10;
    struct lt_tensor *a = mk(b, p->type[0], p->lay[0], n, 7, 2, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *ids = mk(b, LT_TYPE_I32, L_CONTIG, 5, 2, 1, 1, FILL_INT, 0, 7);
    return lt_get_rows(b->ctx, a, ids);
}

/* slices of a [5, 2, 3] source into rows {4, 0, 6} of a [10, 7] destination (p->type[1]) */
static struct lt_tensor *b_set_rows(struct build *b, const struct params *p)
{
    struct lt_tensor *src = mk(b, p->type[0], p->lay[0], 5, 2, 3, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *dst = mk(b, p->type[1], p->lay[1], 10, 7, 1, 1, FILL_UNIFORM, 2, 3);
    struct lt_tensor *ids = mk(b, LT_TYPE_I32, L_CONTIG, 3, 1, 1, 1, FILL_VALUES, 0, 0);
    static const float idv[3] = {4, 0, 6};
    b->in[b->n_in - 1].values = idv;
    return lt_set_rows(b->ctx, src, dst, ids);
}

static struct lt_tensor *b_get_rows_back(struct build *b, const struct params *p)
{
    struct lt_tensor *g = mk(b, p->type[0], p->lay[0], 8, 6, 2, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *ids = mk(b, LT_TYPE_I32, L_CONTIG, 6, 2, 1, 1, FILL_INT, 0, 5);
    if (p->i[0]) /* in place: the rows added to a tensor's values (a tied head's gradient) */
        return lt_get_rows_back_into(b->ctx, g, ids,
                                     mk(b, LT_TYPE_F32, L_CONTIG, 8, 5, 2, 1, FILL_UNIFORM, -1, 1));
    struct lt_tensor like = {0};
    like.type = LT_TYPE_F32;
    like.ne[0] = 8, like.ne[1] = 5, like.ne[2] = 2, like.ne[3] = 1;
    return lt_get_rows_back(b->ctx, g, ids, &like);
}

static struct lt_tensor *b_acc(struct build *b, const struct params *p)
{
    struct lt_tensor *a = mk(b, p->type[0], p->lay[0], 8, 6, 3, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *x = mk(b, p->type[1], p->lay[1], 3, 2, 2, 1, FILL_UNIFORM, -1, 1);
    size_t nb1 = p->i[0] ? 4 : 8 * 4; /* i[0]: rows of the window overlap */
    return lt_acc(b->ctx, a, x, nb1, 8 * 6 * 4, 8 * 6 * 3 * 4, (1 + 2 * 8) * 4);
}

/* rows of 8 floats into 16-float rows at a 16-byte offset: the float4 kernel (b contiguous
 * F32), or the element one when b is a view (layout l) */
static struct lt_tensor *b_acc4(struct build *b, const struct params *p)
{
    struct lt_tensor *a = mk(b, LT_TYPE_F32, L_CONTIG, 16, 6, 3, 2, FILL_UNIFORM, -1, 1);
    struct lt_tensor *x = mk(b, LT_TYPE_F32, p->lay[1], 8, 3, 2, 2, FILL_UNIFORM, -1, 1);
    return lt_acc(b->ctx, a, x, 16 * 4, 16 * 6 * 4, 16 * 6 * 3 * 4, (4 + 16) * 4);
}

static void test_copies(void)
{
    struct params p = P(0, 0, LT_TYPE_F32, LT_TYPE_F32);
    p.f[0] = 1.5f;
    run_case(LT_OP_FILL, "contig", TOL_F32, b_fill, &p);
    p.i[0] = 1;
    run_case(LT_OP_FILL, "contig/240", TOL_F32, b_fill, &p);
    p.f[0] = 0.0f; /* a memset on CUDA */
    run_case(LT_OP_FILL, "contig/240 zero", TOL_F32, b_fill, &p);
    p.i[0] = 0;
    run_case(LT_OP_FILL, "contig zero", TOL_F32, b_fill, &p);
    p.f[0] = 1.5f;
    static const enum lt_type cont_types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16, LT_TYPE_I32};
    for (int t = 0; t < 4; t++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, 0, cont_types[t], LT_TYPE_F32);
            run_case(LT_OP_CONT, lbl(layout_names[l], lt_type_name(cont_types[t])), TOL_F32, b_cont, &p);
        }
    p = P(L_SLICED, 0, LT_TYPE_Q8_0, LT_TYPE_F32);
    run_case(LT_OP_CONT, "sliced/q8_0", TOL_F32, b_cont, &p);
    p = P(L_CONTIG, 0, LT_TYPE_Q4_K, LT_TYPE_F32);
    run_case(LT_OP_CONT, "contig/q4_K", TOL_F32, b_cont, &p);

    static const enum lt_type pairs[][2] = {{LT_TYPE_F32, LT_TYPE_F16}, {LT_TYPE_F32, LT_TYPE_BF16},
                                            {LT_TYPE_F16, LT_TYPE_F32}, {LT_TYPE_BF16, LT_TYPE_F32},
                                            {LT_TYPE_F32, LT_TYPE_F32}, {LT_TYPE_F16, LT_TYPE_BF16},
                                            {LT_TYPE_F32, LT_TYPE_I32}};
    for (int t = 0; t < 7; t++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, l == L_TRANSPOSED ? L_TRANSPOSED : L_CONTIG, pairs[t][0], pairs[t][1]);
            char buf[32];
            snprintf(buf, sizeof(buf), "%s>%s", lt_type_name(pairs[t][0]), lt_type_name(pairs[t][1]));
            run_case(LT_OP_CPY, lbl(layout_names[l], buf), TOL_F32, b_cpy, &p);
        }
    p = P(L_PERMUTED, L_SLICED, LT_TYPE_F32, LT_TYPE_F16);
    run_case(LT_OP_CPY, "permut>sliced", TOL_F32, b_cpy, &p);
    p = P(L_TRANSPOSED, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
    p.i[0] = 1;
    run_case(LT_OP_CPY, "transp>reshaped", TOL_F32, b_cpy, &p);
    p = P(L_SLICED, L_CONTIG, LT_TYPE_Q8_0, LT_TYPE_Q8_0);
    run_case(LT_OP_CPY, "sliced/q8_0>q8_0", TOL_F32, b_cpy, &p);
    p = P(L_CONTIG, L_CONTIG, LT_TYPE_Q6_K, LT_TYPE_F32);
    run_case(LT_OP_CPY, "q6_K>f32", TOL_F32, b_cpy, &p);

    for (int dim = 0; dim < 4; dim++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, (l + 1) % L_COUNT, LT_TYPE_F32, dim == 1 ? LT_TYPE_F16 : LT_TYPE_F32);
            p.i[0] = dim;
            char buf[16];
            snprintf(buf, sizeof(buf), "dim%d", dim);
            run_case(LT_OP_CONCAT, lbl(layout_names[l], buf), TOL_F32, b_concat, &p);
        }
    /* half results: the LoRA joins of model_products.c (BF16 weight rows with B's, and x with
     * A x), the layouts and lengths the 16-byte words take and those they do not */
    static const struct {
        int l0, l1;
        enum lt_type t0, t1, t;
        int dim, k8, odd;
    } halves[] = {
        {L_CONTIG, L_CONTIG, LT_TYPE_BF16, LT_TYPE_BF16, LT_TYPE_BF16, 0, 128, 0},
        {L_CONTIG, L_CONTIG, LT_TYPE_BF16, LT_TYPE_BF16, LT_TYPE_BF16, 0, 4, 1},
        {L_SLICED, L_CONTIG, LT_TYPE_BF16, LT_TYPE_BF16, LT_TYPE_BF16, 0, 4, 0},
        {L_CONTIG, L_SLICED, LT_TYPE_F16, LT_TYPE_F16, LT_TYPE_F16, 0, 2, 0},
        {L_TRANSPOSED, L_CONTIG, LT_TYPE_BF16, LT_TYPE_BF16, LT_TYPE_BF16, 0, 2, 0},
        {L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_BF16, LT_TYPE_BF16, 0, 2, 0},
        {L_CONTIG, L_CONTIG, LT_TYPE_BF16, LT_TYPE_BF16, LT_TYPE_BF16, 1, 2, 0},
        {L_CONTIG, L_CONTIG, LT_TYPE_BF16, LT_TYPE_BF16, LT_TYPE_F32, 0, 4, 0},
    };
    for (size_t k = 0; k < sizeof(halves) / sizeof(halves[0]); k++) {
        p = P(halves[k].l0, halves[k].l1, halves[k].t0, halves[k].t1);
        p.type[2] = halves[k].t;
        p.i[0] = halves[k].dim;
        p.i[1] = halves[k].k8;
        p.i[2] = halves[k].odd;
        char buf[48];
        snprintf(buf, sizeof(buf), "%s,%s>%s dim%d K%lld", lt_type_name(halves[k].t0),
                 lt_type_name(halves[k].t1), lt_type_name(halves[k].t), halves[k].dim,
                 (long long)(halves[k].k8 * 8 + 3 * halves[k].odd));
        run_case(LT_OP_CONCAT, lbl(layout_names[halves[k].l0], buf), TOL_F32, b_concat_half, &p);
    }
    for (int l = 0; l < L_COUNT; l++) {
        p = P(l, 0, l == L_SLICED ? LT_TYPE_BF16 : LT_TYPE_F32, LT_TYPE_F32);
        p.i[0] = l % 2;
        run_case(LT_OP_REPEAT, layout_names[l], TOL_F32, b_repeat, &p);
    }
    static const int64_t likes[][4] = {{4, 3, 2, 1}, {8, 1, 1, 1}, {1, 1, 1, 1}, {8, 6, 4, 2}};
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, 0, LT_TYPE_F32, LT_TYPE_F32);
            memcpy(p.ne, likes[k], sizeof(p.ne));
            run_case(LT_OP_REPEAT_BACK, layout_names[l], TOL_F32, b_repeat_back, &p);
        }
    /* a column of blocks' partials (contiguous F32), or the generic kernels (other layouts):
     * 40 columns over 600 rows, 300 columns (more than a block's threads) over 291, and a
     * norm weight's gradient over 8192 tokens (8 rows a partial, 1024 partials a column) */
    static const int64_t talls[][4] = {{40, 300, 2, 1}, {300, 97, 3, 1}, {1024, 2048, 4, 1}};
    for (int k = 0; k < 3; k++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, 0, LT_TYPE_F32, LT_TYPE_F32);
            p.ne[0] = talls[k][0], p.i[0] = (int)talls[k][1], p.i[1] = (int)talls[k][2],
            p.i[2] = (int)talls[k][3];
            run_case(LT_OP_REPEAT_BACK, lbl(layout_names[l], "tall"), TOL_F32, b_repeat_back_tall,
                     &p);
        }
    static const enum lt_type rows_types[] = {
        LT_TYPE_F32,  LT_TYPE_F16,  LT_TYPE_BF16, LT_TYPE_Q4_0, LT_TYPE_Q4_1, LT_TYPE_Q5_0,
        LT_TYPE_Q5_1, LT_TYPE_Q8_0, LT_TYPE_Q2_K, LT_TYPE_Q3_K, LT_TYPE_Q4_K, LT_TYPE_Q5_K,
        LT_TYPE_Q6_K, LT_TYPE_Q8_K};
    for (int t = 0; t < 14; t++)
        for (int l = 0; l < L_COUNT; l++) {
            if (lt_type_traits(rows_types[t])->is_quantized && l != L_CONTIG && l != L_SLICED)
                continue;
            p = P(l, 0, rows_types[t], LT_TYPE_F32);
            run_case(LT_OP_GET_ROWS, lbl(layout_names[l], lt_type_name(rows_types[t])), TOL_F32,
                     b_get_rows, &p);
        }
    for (int l = 0; l < L_COUNT; l++) {
        p = P(l, 0, l == L_SLICED ? LT_TYPE_F16 : LT_TYPE_F32, LT_TYPE_F32);
        run_case(LT_OP_GET_ROWS_BACK, layout_names[l], TOL_F32, b_get_rows_back, &p);
        p.i[0] = 1;
        run_case(LT_OP_GET_ROWS_BACK, lbl(layout_names[l], "into"), TOL_F32, b_get_rows_back, &p);
    }
    static const enum lt_type set_types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16};
    for (int t = 0; t < 3; t++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, l == L_SLICED ? L_SLICED : L_CONTIG, l == L_PERMUTED ? LT_TYPE_BF16 : LT_TYPE_F32,
                  set_types[t]);
            run_case(LT_OP_SET_ROWS, lbl(layout_names[l], lt_type_name(set_types[t])), TOL_F32,
                     b_set_rows, &p);
        }
    for (int l = 0; l < L_COUNT; l++)
        for (int overlap = 0; overlap < 2; overlap++) {
            p = P(l, (l + 2) % L_COUNT, LT_TYPE_F32, l == L_PERMUTED ? LT_TYPE_BF16 : LT_TYPE_F32);
            p.i[0] = overlap;
            run_case(LT_OP_ACC, lbl(layout_names[l], overlap ? "overlap" : ""), TOL_F32, b_acc, &p);
        }
    for (int l = 0; l < L_COUNT; l++) {
        p = P(L_CONTIG, l, LT_TYPE_F32, LT_TYPE_F32);
        run_case(LT_OP_ACC, lbl("rows of 4", layout_names[l]), TOL_F32, b_acc4, &p);
    }
}

/* ---- matrix products ---- */

/* ne: K, M, N; i[0]: A2, i[1]: B2 (multiple), i[2]: A3, i[3]: B3 */
static struct lt_tensor *b_mul_mat(struct build *b, const struct params *p)
{
    struct lt_tensor *a = mk(b, p->type[0], p->lay[0], p->ne[0], p->ne[1], p->i[0], p->i[2],
                             FILL_UNIFORM, -1, 1);
    struct lt_tensor *x = mk(b, p->type[1], p->lay[1], p->ne[0], p->ne[2], p->i[1], p->i[3],
                             FILL_UNIFORM, -1, 1);
    return lt_mul_mat(b->ctx, a, x);
}

/* b_mul_mat's product of two operands of one half type, stored in that type
 * (lt_mul_mat_as: a training step's FFN gate and up) */
static struct lt_tensor *b_mul_mat_half(struct build *b, const struct params *p)
{
    struct lt_tensor *a =
        mk(b, p->type[0], p->lay[0], p->ne[0], p->ne[1], p->i[0], p->i[2], FILL_UNIFORM, -1, 1);
    struct lt_tensor *x =
        mk(b, p->type[0], p->lay[1], p->ne[0], p->ne[2], p->i[1], p->i[3], FILL_UNIFORM, -1, 1);
    return lt_mul_mat_as(b->ctx, a, x, p->type[0]);
}

/* MUL_MAT_ACC: b_mul_mat's product added over c, contiguous F32 [M, N, B2, B3], scaled by
 * f[0] where it is set (lt_mul_mat_acc_scaled) */
static struct lt_tensor *b_mul_mat_acc(struct build *b, const struct params *p)
{
    struct lt_tensor *a =
        mk(b, p->type[0], p->lay[0], p->ne[0], p->ne[1], p->i[0], p->i[2], FILL_UNIFORM, -1, 1);
    struct lt_tensor *x =
        mk(b, p->type[1], p->lay[1], p->ne[0], p->ne[2], p->i[1], p->i[3], FILL_UNIFORM, -1, 1);
    struct lt_tensor *c =
        mk(b, LT_TYPE_F32, L_CONTIG, p->ne[1], p->ne[2], p->i[1], p->i[3], FILL_UNIFORM, -1, 1);
    return p->f[0] != 0.0f ? lt_mul_mat_acc_scaled(b->ctx, a, x, c, p->f[0])
                           : lt_mul_mat_acc(b->ctx, a, x, c);
}

static void mm_acc_case_scaled(enum lt_type t, enum lt_type tb, int la, int lb, int64_t K,
                               int64_t M, int64_t N, int a2, int b2, float alpha)
{
    struct params p = P(la, lb, t, tb);
    p.f[0] = alpha;
    p.ne[0] = K, p.ne[1] = M, p.ne[2] = N;
    p.i[0] = a2, p.i[1] = b2, p.i[2] = 1, p.i[3] = 1;
    const bool quant = lt_type_traits(t)->is_quantized;
    char buf[80];
    snprintf(buf, sizeof(buf), "%s%s%s/%s%s%s/N%lld%s", lt_type_name(t),
             tb == LT_TYPE_F32 ? "" : "x", tb == LT_TYPE_F32 ? "" : lt_type_name(tb),
             layout_names[la], la == lb ? "" : "+", la == lb ? "" : layout_names[lb], (long long)N,
             alpha != 0.0f ? "/scaled" : "");
    run_case(LT_OP_MUL_MAT_ACC, buf,
             t == LT_TYPE_F32 ? TOL_MM_F32
             : quant          ? TOL_QUANT
                              : TOL_MM_HALF,
             b_mul_mat_acc, &p);
}

static void mm_acc_case(enum lt_type t, enum lt_type tb, int la, int lb, int64_t K, int64_t M,
                        int64_t N, int a2, int b2)
{
    mm_acc_case_scaled(t, tb, la, lb, K, M, N, a2, b2, 0.0f);
}

/* MUL_MAT_GLU: a [K, 2 H] (ne[1] = H) of type[0] in lay[0], F32 columns [K, N] in lay[1] */
static struct lt_tensor *b_mul_mat_glu(struct build *b, const struct params *p)
{
    struct lt_tensor *a =
        mk(b, p->type[0], p->lay[0], p->ne[0], 2 * p->ne[1], 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *x =
        mk(b, LT_TYPE_F32, p->lay[1], p->ne[0], p->ne[2], 1, 1, FILL_UNIFORM, -1, 1);
    return lt_mul_mat_glu(b->ctx, a, x);
}

static void mm_glu_case(enum lt_type t, int la, int lb, int64_t K, int64_t H, int64_t N)
{
    struct params p = P(la, lb, t, LT_TYPE_F32);
    p.ne[0] = K, p.ne[1] = H, p.ne[2] = N;
    const bool quant = lt_type_traits(t)->is_quantized;
    char buf[64];
    snprintf(buf, sizeof(buf), "%s/%s%s%s/K%lld/N%lld", lt_type_name(t), layout_names[la],
             la == lb ? "" : "+", la == lb ? "" : layout_names[lb], (long long)K, (long long)N);
    run_case(LT_OP_MUL_MAT_GLU, buf,
             t == LT_TYPE_F32 ? TOL_MM_F32
             : quant          ? TOL_QUANT
                              : TOL_MM_HALF,
             b_mul_mat_glu, &p);
}

/* MUL_MAT_ADD_RMS_NORM: a [K, M] of type[0] in lay[0], F32 columns [K, N] in lay[1], the
 * residual [M, N] in lay[1] too, the norm's weight [M] */
static struct lt_tensor *b_mul_mat_add_rms_norm(struct build *b, const struct params *p)
{
    struct lt_tensor *a =
        mk(b, p->type[0], p->lay[0], p->ne[0], p->ne[1], 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *x =
        mk(b, LT_TYPE_F32, p->lay[1], p->ne[0], p->ne[2], 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *r =
        mk(b, LT_TYPE_F32, p->lay[1], p->ne[1], p->ne[2], 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *w = mk(b, LT_TYPE_F32, L_CONTIG, p->ne[1], 1, 1, 1, FILL_UNIFORM, 0.5f, 1.5f);
    return lt_mul_mat_add_rms_norm(b->ctx, a, x, r, w, 1e-6f);
}

static void mm_norm_case(enum lt_type t, int la, int lb, int64_t K, int64_t M, int64_t N)
{
    struct params p = P(la, lb, t, LT_TYPE_F32);
    p.ne[0] = K, p.ne[1] = M, p.ne[2] = N;
    const bool quant = lt_type_traits(t)->is_quantized;
    char buf[64];
    snprintf(buf, sizeof(buf), "%s/%s%s%s/K%lld/M%lld/N%lld", lt_type_name(t), layout_names[la],
             la == lb ? "" : "+", la == lb ? "" : layout_names[lb], (long long)K, (long long)M,
             (long long)N);
    run_case(LT_OP_MUL_MAT_ADD_RMS_NORM, buf,
             t == LT_TYPE_F32 ? TOL_MM_F32
             : quant          ? TOL_QUANT
                              : TOL_MM_HALF,
             b_mul_mat_add_rms_norm, &p);
}

/* RMS_NORM_MUL_MAT: a [K, M] of type[0] in lay[0] (i[0]: glu, M = 2 ne[1]; else M = ne[1]),
 * F32 columns [K, N] in lay[1], the norm's weight [K] */
static struct lt_tensor *b_rms_norm_mul_mat(struct build *b, const struct params *p)
{
    const int64_t M = p->i[0] ? 2 * p->ne[1] : p->ne[1];
    struct lt_tensor *a = mk(b, p->type[0], p->lay[0], p->ne[0], M, 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *x =
        mk(b, LT_TYPE_F32, p->lay[1], p->ne[0], p->ne[2], 1, 1, FILL_UNIFORM, -2, 2);
    struct lt_tensor *w = mk(b, LT_TYPE_F32, L_CONTIG, p->ne[0], 1, 1, 1, FILL_UNIFORM, 0.5f, 1.5f);
    return lt_rms_norm_mul_mat(b->ctx, a, x, w, 1e-6f, p->i[0] != 0);
}

static void mm_rnm_case(enum lt_type t, int la, int lb, int64_t K, int64_t M, int64_t N, int glu)
{
    struct params p = P(la, lb, t, LT_TYPE_F32);
    p.ne[0] = K, p.ne[1] = M, p.ne[2] = N, p.i[0] = glu;
    const bool quant = lt_type_traits(t)->is_quantized;
    char buf[64];
    snprintf(buf, sizeof(buf), "%s/%s%s%s/K%lld/M%lld/N%lld%s", lt_type_name(t), layout_names[la],
             la == lb ? "" : "+", la == lb ? "" : layout_names[lb], (long long)K, (long long)M,
             (long long)N, glu ? " glu" : "");
    run_case(LT_OP_RMS_NORM_MUL_MAT, buf,
             t == LT_TYPE_F32 ? TOL_MM_F32
             : quant          ? TOL_QUANT_NORMED
                              : TOL_MM_HALF,
             b_rms_norm_mul_mat, &p);
}

/* a of type t, b of type tb: F32, or t itself for F16 / BF16 (cuBLAS reads it in place) */
static void mm_case_b(enum lt_type t, enum lt_type tb, int la, int lb, int64_t K, int64_t M,
                      int64_t N, int a2, int b2, int a3, int b3)
{
    struct params p = P(la, lb, t, tb);
    p.ne[0] = K, p.ne[1] = M, p.ne[2] = N;
    p.i[0] = a2, p.i[1] = b2, p.i[2] = a3, p.i[3] = b3;
    const bool quant = lt_type_traits(t)->is_quantized;
    double tol = t == LT_TYPE_F32 ? TOL_MM_F32 : quant ? TOL_QUANT : TOL_MM_HALF;
    if (tb == LT_TYPE_F32 && mmvq_same_rounding(t, N, a2, b2, a3, b3))
        tol = TOL_MMVQ_SAME;
    char buf[64];
    snprintf(buf, sizeof(buf), "%s%s%s/%s%s%s", lt_type_name(t), tb == LT_TYPE_F32 ? "" : "x",
             tb == LT_TYPE_F32 ? "" : lt_type_name(tb), layout_names[la], la == lb ? "" : "+",
             la == lb ? "" : layout_names[lb]);
    if (b2 > a2 || b3 > a3)
        snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "/grp");
    if (N == 1)
        snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "/N1");
    double err = run_case(LT_OP_MUL_MAT, buf, tol, b_mul_mat, &p);
    if (t == LT_TYPE_F32 && (err != err || err > mm_f32_worst))
        mm_f32_worst = err != err ? INFINITY : err;
}

static void mm_case(enum lt_type t, int la, int lb, int64_t K, int64_t M, int64_t N, int a2,
                    int b2, int a3, int b3)
{
    mm_case_b(t, LT_TYPE_F32, la, lb, K, M, N, a2, b2, a3, b3);
}

/* N <= 8 with a quantised a, or a small F16 / BF16 one, runs the backend's own kernel
 * (mmv), more columns (or larger half weights) run cuBLAS: both are covered for every
 * layout. */
static void test_matmul(void)
{
    static const enum lt_type halfs[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16};
    /* half results (lt_mul_mat_as): 2-d operands as they lie go to one cuBLAS product;
     * batched ones are refused (the CPU runs them). Both sides round the F32 sums once, which
     * differ in order: TOL_MM_HALF */
    static const struct {
        int la, lb;
        int64_t n, a2, b2;
    } hr[] = {{L_CONTIG, L_CONTIG, 40, 1, 1}, {L_TRANSPOSED, L_CONTIG, 40, 1, 1},
              {L_CONTIG, L_SLICED, 40, 1, 1}, {L_CONTIG, L_TRANSPOSED, 19, 1, 1},
              {L_CONTIG, L_CONTIG, 3, 1, 1},  {L_CONTIG, L_CONTIG, 12, 2, 2}};
    for (int t = 1; t < 3; t++)
        for (size_t k = 0; k < sizeof(hr) / sizeof(hr[0]); k++) {
            struct params p = P(hr[k].la, hr[k].lb, halfs[t], halfs[t]);
            p.ne[0] = 64, p.ne[1] = 48, p.ne[2] = hr[k].n;
            p.i[0] = (int)hr[k].a2, p.i[1] = (int)hr[k].b2, p.i[2] = 1, p.i[3] = 1;
            char buf[64];
            snprintf(buf, sizeof(buf), "%s>%s/%s+%s/N%lld%s", lt_type_name(halfs[t]),
                     lt_type_name(halfs[t]), layout_names[hr[k].la], layout_names[hr[k].lb],
                     (long long)hr[k].n, hr[k].a2 > 1 ? " batched" : "");
            run_case(LT_OP_MUL_MAT, buf, TOL_MM_HALF, b_mul_mat_half, &p);
        }
    for (int t = 0; t < 3; t++) {
        for (int la = 0; la < L_COUNT; la++)
            for (int lb = 0; lb < L_COUNT; lb++) {
                if (la != lb && la != L_CONTIG && lb != L_CONTIG)
                    continue;
                mm_case(halfs[t], la, lb, 64, 48, 19, 1, 1, 1, 1);
                mm_case(halfs[t], la, lb, 64, 48, 3, 1, 1, 1, 1);
            }
        mm_case(halfs[t], L_CONTIG, L_CONTIG, 64, 48, 1, 1, 1, 1, 1);
        for (int n = 5; n <= 12; n += 7) {
            mm_case(halfs[t], L_CONTIG, L_CONTIG, 32, 16, n, 2, 2, 1, 2);   /* batched, r3 = 2 */
            mm_case(halfs[t], L_CONTIG, L_CONTIG, 32, 16, n, 2, 6, 1, 1);   /* grouped, r2 = 3 */
            mm_case(halfs[t], L_CONTIG, L_PERMUTED, 32, 16, n, 2, 6, 2, 2); /* grouped, no fold */
            mm_case(halfs[t], L_PERMUTED, L_PERMUTED, 32, 16, n, 2, 8, 5, 5); /* by b head */
            mm_case(halfs[t], L_TRANSPOSED, L_SLICED, 32, 16, n, 3, 6, 1, 2);
        }
        mm_case(halfs[t], L_PERMUTED, L_CONTIG, 32, 16, 1, 2, 6, 1, 1); /* grouped decode */
        mm_case(halfs[t], L_CONTIG, L_CONTIG, 96, 1, 7, 1, 1, 1, 1);    /* M = 1 */
        mm_case(halfs[t], L_CONTIG, L_CONTIG, 96, 1, 10, 1, 1, 1, 1);
        mm_case(halfs[t], L_CONTIG, L_CONTIG, 1, 9, 7, 1, 1, 1, 1); /* K = 1 */
        mm_case(halfs[t], L_CONTIG, L_CONTIG, 1, 9, 10, 1, 1, 1, 1);
        mm_case(halfs[t], L_CONTIG, L_CONTIG, 60, 9, 2, 1, 1, 1, 1); /* K not a multiple of 8 */
        /* half weights over 16 MiB take cuBLAS even for few columns */
        mm_case(halfs[t], L_CONTIG, L_CONTIG, 4096, 2100, 2, 1, 1, 1, 1);
    }
    /* Decode's half products (mmv_half_kernel): the 0.8B model's input widths with few rows,
     * so that 2, 4 and 8 warps share a row (K = 4096: 8), the last block's rows past M; a
     * row that ends inside a run of 32 chunks (K = 1040); slices with grouped heads; 1 to 8
     * columns */
    for (int t = 1; t < 3; t++) {
        static const int64_t hk[] = {1024, 2048, 3584, 4096, 1040},
                             hm[] = {1001, 999, 1000, 33, 45};
        static const int64_t hn[] = {1, 2, 3, 8, 5};
        for (int i = 0; i < 5; i++)
            mm_case(halfs[t], L_CONTIG, L_CONTIG, hk[i], hm[i], hn[i], 1, 1, 1, 1);
        mm_case(halfs[t], L_CONTIG, L_CONTIG, 2048, 7, 3, 2, 4, 1, 1);
        mm_case(halfs[t], L_CONTIG, L_SLICED, 3584, 13, 1, 1, 1, 1, 1);
    }
    /* MUL_MAT_ACC (a LoRA target's base product added into its adapter's output): BF16 x
     * BF16 as training has it, a transposed b (a weight gradient's layout), F32 and F16, a
     * quantised a (converted tiles), grouped heads, and few columns (cuBLAS all the same) */
    mm_acc_case(LT_TYPE_BF16, LT_TYPE_BF16, L_CONTIG, L_CONTIG, 64, 48, 19, 1, 1);
    mm_acc_case(LT_TYPE_BF16, LT_TYPE_BF16, L_TRANSPOSED, L_TRANSPOSED, 64, 48, 19, 1, 1);
    mm_acc_case(LT_TYPE_BF16, LT_TYPE_F32, L_CONTIG, L_PERMUTED, 64, 48, 19, 1, 1);
    mm_acc_case(LT_TYPE_F32, LT_TYPE_F32, L_CONTIG, L_SLICED, 64, 48, 19, 1, 1);
    mm_acc_case(LT_TYPE_F16, LT_TYPE_F16, L_CONTIG, L_CONTIG, 32, 16, 12, 2, 6);
    mm_acc_case(LT_TYPE_Q8_0, LT_TYPE_F32, L_CONTIG, L_CONTIG, 96, 40, 17, 1, 1);
    mm_acc_case(LT_TYPE_BF16, LT_TYPE_BF16, L_CONTIG, L_CONTIG, 1024, 300, 1, 1, 1);
    mm_acc_case(LT_TYPE_BF16, LT_TYPE_F32, L_CONTIG, L_CONTIG, 256, 100, 3, 1, 1);
    mm_acc_case(LT_TYPE_Q8_0, LT_TYPE_F32, L_CONTIG, L_CONTIG, 1024, 64, 2, 1, 1);
    /* scaled (a LoRA A's gradient accumulated with its scale): cuBLAS's alpha, also where
     * the unscaled one-column product takes the few-column kernel */
    mm_acc_case_scaled(LT_TYPE_BF16, LT_TYPE_BF16, L_TRANSPOSED, L_CONTIG, 64, 48, 19, 1, 1, 1.5f);
    mm_acc_case_scaled(LT_TYPE_F32, LT_TYPE_F32, L_CONTIG, L_SLICED, 64, 48, 19, 1, 1, -0.75f);
    mm_acc_case_scaled(LT_TYPE_BF16, LT_TYPE_BF16, L_CONTIG, L_CONTIG, 1024, 300, 1, 1, 1, 2.0f);
    mm_acc_case_scaled(LT_TYPE_Q8_0, LT_TYPE_F32, L_CONTIG, L_CONTIG, 96, 40, 17, 1, 1, 0.5f);
    /* one F32 column of F16 / BF16 rows (Q8_0 / Q4_0 / Q5_0: mmvq): the product's epilogue
     * adds into the result
     * (a decode step's output and down projections before RMS_NORM_MUL_MAT; four rows a
     * team past one wave of the one-row kernel) */
    for (int t = 1; t < 3; t++) {
        mm_acc_case(halfs[t], LT_TYPE_F32, L_CONTIG, L_CONTIG, 2048, 1024, 1, 1, 1);
        mm_acc_case(halfs[t], LT_TYPE_F32, L_CONTIG, L_CONTIG, 3584, 1024, 1, 1, 1);
        mm_acc_case(halfs[t], LT_TYPE_F32, L_CONTIG, L_CONTIG, 256, 9000, 1, 1, 1);
    }
    mm_acc_case(LT_TYPE_Q8_0, LT_TYPE_F32, L_CONTIG, L_CONTIG, 2048, 1024, 1, 1, 1);
    mm_acc_case(LT_TYPE_Q8_0, LT_TYPE_F32, L_CONTIG, L_CONTIG, 256, 5000, 1, 1, 1);
    mm_acc_case(LT_TYPE_Q4_0, LT_TYPE_F32, L_CONTIG, L_CONTIG, 256, 45, 1, 1, 1);
    mm_acc_case(LT_TYPE_Q5_0, LT_TYPE_F32, L_CONTIG, L_CONTIG, 256, 45, 1, 1, 1);
    /* RMS_NORM_MUL_MAT (a decode step's input projections and FFN after MUL_MAT_ACC): one
     * column of F16 / BF16 rows in the one kernel (one and four rows a team, warps a team 1
     * to 8, glu), and through the norm, the product and SWIGLU: more columns, strided
     * columns, a sliced weight, F32 and quantised weights */
    for (int t = 1; t < 3; t++) {
        for (int glu = 0; glu < 2; glu++) {
            mm_rnm_case(halfs[t], L_CONTIG, L_CONTIG, 1024, 500, 1, glu);
            mm_rnm_case(halfs[t], L_CONTIG, L_CONTIG, 256, 9000, 1, glu);
            mm_rnm_case(halfs[t], L_CONTIG, L_CONTIG, 3584, 40, 1, glu);
            mm_rnm_case(halfs[t], L_CONTIG, L_CONTIG, 512, 40, 3, glu);
            mm_rnm_case(halfs[t], L_CONTIG, L_TRANSPOSED, 512, 40, 1, glu);
            mm_rnm_case(halfs[t], L_SLICED, L_CONTIG, 512, 40, 1, glu);
        }
    }
    for (int glu = 0; glu < 2; glu++) {
        mm_rnm_case(LT_TYPE_F32, L_CONTIG, L_CONTIG, 256, 40, 1, glu);
        mm_rnm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 1024, 48, 1, glu);
        mm_rnm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 256, 5000, 1, glu); /* four rows a block */
        mm_rnm_case(LT_TYPE_Q8_0, L_CONTIG, L_TRANSPOSED, 512, 37, 1, glu);
        mm_rnm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 512, 37, 3, glu);
        mm_rnm_case(LT_TYPE_Q4_0, L_CONTIG, L_CONTIG, 256, 45, 1, glu);
        mm_rnm_case(LT_TYPE_Q5_0, L_CONTIG, L_CONTIG, 256, 45, 1, glu);
        mm_rnm_case(LT_TYPE_Q4_K, L_CONTIG, L_CONTIG, 512, 24, 1, glu);
    }
    /* MUL_MAT_GLU (a decode step's FFN): F16 / BF16 rows against 1 to 8 aligned columns in
     * the one kernel (its warps a team 1 to 8: K 1024 / 3584, H 500 / 37 / 1024), more
     * columns, strided columns and a sliced weight through the product and SWIGLU, F32 and
     * quantised weights likewise (the element kernel, dequantised tiles); Q8_0, Q4_0 and
     * Q5_0 over 1 to 8 columns through mmvq's GLU form (one and four rows a block, any
     * columns' strides) */
    for (int t = 1; t < 3; t++) {
        static const int64_t gn[] = {1, 2, 3, 5, 8};
        for (int i = 0; i < 5; i++)
            mm_glu_case(halfs[t], L_CONTIG, L_CONTIG, 1024, 500, gn[i]);
        mm_glu_case(halfs[t], L_CONTIG, L_CONTIG, 3584, 37, 1);
        mm_glu_case(halfs[t], L_CONTIG, L_CONTIG, 256, 1024, 2);
        mm_glu_case(halfs[t], L_CONTIG, L_CONTIG, 1024, 60, 9);
        mm_glu_case(halfs[t], L_CONTIG, L_CONTIG, 256, 40, 20);
        mm_glu_case(halfs[t], L_CONTIG, L_TRANSPOSED, 512, 40, 3);
        mm_glu_case(halfs[t], L_SLICED, L_CONTIG, 512, 40, 1);
        mm_glu_case(halfs[t], L_CONTIG, L_SLICED, 512, 40, 4);
    }
    mm_glu_case(LT_TYPE_F32, L_CONTIG, L_CONTIG, 256, 40, 1);
    mm_glu_case(LT_TYPE_F32, L_CONTIG, L_CONTIG, 256, 40, 12);
    mm_glu_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 1024, 48, 1);
    mm_glu_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 1024, 48, 6);
    mm_glu_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 256, 2200, 1); /* four rows a block */
    mm_glu_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 256, 2201, 1);
    mm_glu_case(LT_TYPE_Q8_0, L_CONTIG, L_TRANSPOSED, 512, 37, 3);
    mm_glu_case(LT_TYPE_Q4_0, L_CONTIG, L_CONTIG, 256, 45, 2);
    mm_glu_case(LT_TYPE_Q5_0, L_CONTIG, L_SLICED, 256, 45, 8);
    mm_glu_case(LT_TYPE_Q4_K, L_CONTIG, L_CONTIG, 512, 24, 2);
    mm_glu_case(LT_TYPE_Q4_0, L_CONTIG, L_CONTIG, 256, 24, 12);
    /* MUL_MAT_ADD_RMS_NORM (a decode step's output and down projections): one column of F16
     * / BF16 rows (warps a team 1 to 8: M 1024 / 40 / 3000, K 2048 / 3584 / 256) in the one
     * kernel with its last-block norm, back to back (the counter set back to zero); Q8_0,
     * Q4_0, Q5_0 (mmvq's product: one and four rows a block), more columns, a transposed
     * residual and columns, a sliced weight, F32 and other quantised weights through the
     * product and ADD_RMS_NORM */
    for (int t = 1; t < 3; t++) {
        mm_norm_case(halfs[t], L_CONTIG, L_CONTIG, 2048, 1024, 1);
        mm_norm_case(halfs[t], L_CONTIG, L_CONTIG, 3584, 1024, 1);
        mm_norm_case(halfs[t], L_CONTIG, L_CONTIG, 256, 3000, 1);
        mm_norm_case(halfs[t], L_CONTIG, L_CONTIG, 1024, 40, 1);
        mm_norm_case(halfs[t], L_CONTIG, L_CONTIG, 512, 40, 3);
        mm_norm_case(halfs[t], L_CONTIG, L_TRANSPOSED, 512, 40, 1);
        mm_norm_case(halfs[t], L_SLICED, L_CONTIG, 512, 40, 1);
    }
    mm_norm_case(LT_TYPE_F32, L_CONTIG, L_CONTIG, 256, 40, 1);
    mm_norm_case(LT_TYPE_F32, L_CONTIG, L_CONTIG, 256, 40, 12);
    mm_norm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 2048, 1024, 1);
    mm_norm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 256, 5000, 1); /* four rows a block */
    mm_norm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 512, 37, 3);
    mm_norm_case(LT_TYPE_Q8_0, L_CONTIG, L_TRANSPOSED, 512, 37, 1);
    mm_norm_case(LT_TYPE_Q4_0, L_CONTIG, L_CONTIG, 256, 45, 1);
    mm_norm_case(LT_TYPE_Q5_0, L_CONTIG, L_CONTIG, 256, 45, 1);
    mm_norm_case(LT_TYPE_Q4_K, L_CONTIG, L_CONTIG, 512, 24, 1);
    static const enum lt_type quants[] = {LT_TYPE_Q4_0, LT_TYPE_Q4_1, LT_TYPE_Q5_0, LT_TYPE_Q5_1,
                                          LT_TYPE_Q8_0, LT_TYPE_Q2_K, LT_TYPE_Q3_K, LT_TYPE_Q4_K,
                                          LT_TYPE_Q5_K, LT_TYPE_Q6_K, LT_TYPE_Q8_K};
    for (int t = 0; t < 11; t++) {
        int64_t K = lt_type_traits(quants[t])->block_size == 256 ? 512 : 96;
        mm_case(quants[t], L_CONTIG, L_CONTIG, K, 40, 17, 1, 1, 1, 1);
        mm_case(quants[t], L_SLICED, L_TRANSPOSED, K, 40, 1, 1, 1, 1, 1);
        mm_case(quants[t], L_SLICED, L_PERMUTED, K, 40, 6, 1, 1, 1, 1);
        mm_case(quants[t], L_CONTIG, L_CONTIG, K, 24, 3, 2, 4, 1, 1);
        mm_case(quants[t], L_CONTIG, L_CONTIG, K, 24, 12, 2, 4, 1, 1);
    }
    /* Q8_0 rows of whole 256-element groups against aligned unit-strided columns take the
     * staged kernel when LATHE_CUDA_MMVQ=0 (mmvq otherwise): part of a chunk of 32 blocks,
     * more than one chunk, 1 to 8 columns, a sliced weight, grouped heads */
    mm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 512, 40, 1, 1, 1, 1, 1);
    mm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 1280, 33, 3, 1, 1, 1, 1);
    mm_case(LT_TYPE_Q8_0, L_SLICED, L_CONTIG, 1280, 20, 8, 1, 1, 1, 1);
    mm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 768, 24, 5, 2, 4, 1, 1);
    /* Decode through mmvq (see TOL_MMVQ_SAME; with LATHE_CUDA_MMVQ=0 the cases above and
     * these run the F32-activation kernels instead): the 0.8B model's shapes (K = 1024,
     * 3584) with 1, 2 and 8 columns and an odd M (a block of 2 rows ends past it); every
     * column count 1..8 (one kernel each); rows of an odd number of blocks (the quants at
     * every alignment mod 4) from a sliced weight, with strided columns; grouped heads;
     * Q4_0 and Q5_0 with 1 and 8 columns */
    static const int64_t dec_k[] = {1024, 3584}, dec_n[] = {1, 2, 8};
    for (int k = 0; k < 2; k++)
        for (int n = 0; n < 3; n++)
            mm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, dec_k[k], 1001, dec_n[n], 1, 1, 1, 1);
    mm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 1024, 1000, 4, 1, 1, 1, 1);
    /* one column over rows enough for four a block (mmvq_many_rows: 32 an SM; the last
     * block's rows past M) */
    mm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 256, 4301, 1, 1, 1, 1, 1);
    mm_case(LT_TYPE_Q4_0, L_CONTIG, L_CONTIG, 256, 4301, 1, 1, 1, 1, 1);
    for (int n = 1; n <= 8; n++)
        mm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 256, 37, n, 1, 1, 1, 1);
    mm_case(LT_TYPE_Q8_0, L_SLICED, L_TRANSPOSED, 160, 45, 3, 1, 1, 1, 1);
    mm_case(LT_TYPE_Q8_0, L_SLICED, L_PERMUTED, 224, 31, 7, 1, 1, 1, 1);
    mm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 256, 37, 2, 2, 4, 1, 2); /* r2 = r3 = 2 */
    mm_case(LT_TYPE_Q8_0, L_SLICED, L_SLICED, 96, 29, 1, 3, 6, 1, 1);  /* r2 = 2, 3 heads */
    for (int n = 0; n < 3; n += 2) { /* Q4_0, Q5_0 (4- and 5-bit quants unpacked) */
        mm_case(LT_TYPE_Q4_0, L_CONTIG, L_CONTIG, 1024, 1001, dec_n[n], 1, 1, 1, 1);
        mm_case(LT_TYPE_Q5_0, L_CONTIG, L_CONTIG, 1024, 1001, dec_n[n], 1, 1, 1, 1);
        mm_case(LT_TYPE_Q4_0, L_SLICED, L_CONTIG, 160, 45, dec_n[n], 1, 1, 1, 1);
        mm_case(LT_TYPE_Q5_0, L_SLICED, L_CONTIG, 160, 45, dec_n[n], 1, 1, 1, 1);
    }
    /* Q4_K decode through its own kernel (mmv_q4k_kernel): the 0.8B model's input widths,
     * 1, 2, 5 and 8 columns, an odd M, a sliced weight, grouped heads (also above) */
    for (int n = 0; n < 3; n++) {
        mm_case(LT_TYPE_Q4_K, L_CONTIG, L_CONTIG, 1024, 1001, dec_n[n], 1, 1, 1, 1);
        mm_case(LT_TYPE_Q4_K, L_CONTIG, L_CONTIG, 3584, 77, dec_n[n], 1, 1, 1, 1);
    }
    mm_case(LT_TYPE_Q4_K, L_SLICED, L_CONTIG, 1280, 45, 5, 1, 1, 1, 1);
    mm_case(LT_TYPE_Q4_K, L_CONTIG, L_CONTIG, 768, 24, 1, 2, 4, 1, 2);
    /* taller than one dequantised tile (64 MiB of F16 is 8192 rows of 4096): two tiles */
    mm_case(LT_TYPE_Q8_0, L_CONTIG, L_CONTIG, 4096, 8200, 12, 1, 1, 1, 1);
    /* half activations meeting weights of their own type (a model's prefill): b in place
     * when one of its inner strides is one element, converted otherwise; few columns skip
     * mmv (it reads F32 b) for cuBLAS */
    for (int t = 1; t < 3; t++) {
        for (int la = 0; la < L_COUNT; la++)
            for (int lb = 0; lb < L_COUNT; lb++) {
                if (la != lb && la != L_CONTIG && lb != L_CONTIG)
                    continue;
                mm_case_b(halfs[t], halfs[t], la, lb, 64, 48, 19, 1, 1, 1, 1);
                mm_case_b(halfs[t], halfs[t], la, lb, 64, 48, 3, 1, 1, 1, 1);
            }
        mm_case_b(halfs[t], halfs[t], L_CONTIG, L_CONTIG, 64, 48, 1, 1, 1, 1, 1);
        mm_case_b(halfs[t], halfs[t], L_CONTIG, L_CONTIG, 32, 16, 12, 2, 2, 1, 2);
        mm_case_b(halfs[t], halfs[t], L_CONTIG, L_CONTIG, 32, 16, 12, 2, 6, 1, 1);
        mm_case_b(halfs[t], halfs[t], L_CONTIG, L_PERMUTED, 32, 16, 12, 2, 6, 2, 2);
        mm_case_b(halfs[t], halfs[t], L_TRANSPOSED, L_SLICED, 32, 16, 12, 3, 6, 1, 2);
        mm_case_b(halfs[t], halfs[t], L_CONTIG, L_CONTIG, 1024, 384, 64, 1, 1, 1, 1);
    }
}

/* ---- element-wise ---- */

static struct lt_tensor *b_binary(struct build *b, const struct params *p)
{
    enum lt_op op = (enum lt_op)p->i[0];
    float lo = op == LT_OP_DIV ? 0.5f : -2.0f;
    struct lt_tensor *x = mk(b, p->type[0], p->lay[0], 8, 6, 3, 2, FILL_UNIFORM, -2, 2);
    int64_t bne[4] = {8, 6, 3, 2};
    switch (p->i[1]) {
    case 1: bne[1] = bne[2] = bne[3] = 1; break; /* one row */
    case 2: bne[0] = 1, bne[2] = 1; break;       /* a column per row */
    case 3: bne[0] = 4, bne[1] = 3, bne[3] = 1; break;
    case 4: bne[0] = 1; break; /* an element a row (a norm's factor) */
    default: break;
    }
    struct lt_tensor *y = mk(b, p->type[1], p->lay[1], bne[0], bne[1], bne[2], bne[3],
                             FILL_UNIFORM, lo, 2);
    switch (op) {
    case LT_OP_ADD: return lt_add(b->ctx, x, y);
    case LT_OP_SUB: return lt_sub(b->ctx, x, y);
    case LT_OP_MUL: return lt_mul_as(b->ctx, x, y, p->type[2]); /* type[2]: the result's */
    default: return lt_div(b->ctx, x, y);
    }
}

static const enum lt_op unary_list[] = {LT_OP_SCALE, LT_OP_SILU, LT_OP_SIGMOID, LT_OP_SOFTPLUS,
                                        LT_OP_EXP,   LT_OP_LOG,  LT_OP_SQR,     LT_OP_SQRT,
                                        LT_OP_SIN,   LT_OP_COS,  LT_OP_ABS,     LT_OP_NEG,
                                        LT_OP_RELU};

static struct lt_tensor *b_unary(struct build *b, const struct params *p)
{
    enum lt_op op = (enum lt_op)p->i[0];
    float lo = -3, hi = 3;
    if (op == LT_OP_LOG || op == LT_OP_SQRT)
        lo = 0.05f;
    if (op == LT_OP_SOFTPLUS)
        lo = -30, hi = 30;
    struct lt_tensor *x =
        mk(b, p->type[0], p->lay[0], 9, 6, 3, p->ne[3] ? p->ne[3] : 2, FILL_UNIFORM, lo, hi);
    struct lt_ctx *c = b->ctx;
    switch (op) {
    case LT_OP_SCALE: /* type[2]: the result's (0: F32; a half one is lt_scale_as's) */
        return p->type[2] ? lt_scale_as(c, x, -0.37f, p->type[2]) : lt_scale(c, x, -0.37f);
    case LT_OP_SILU: return lt_silu(c, x);
    case LT_OP_SIGMOID: return lt_sigmoid(c, x);
    case LT_OP_SOFTPLUS: return lt_softplus(c, x);
    case LT_OP_EXP: return lt_exp(c, x);
    case LT_OP_LOG: return lt_log(c, x);
    case LT_OP_SQR: return lt_sqr(c, x);
    case LT_OP_SQRT: return lt_sqrt(c, x);
    case LT_OP_SIN: return lt_sin(c, x);
    case LT_OP_COS: return lt_cos(c, x);
    case LT_OP_ABS: return lt_abs(c, x);
    case LT_OP_NEG: return lt_neg(c, x);
    default: return lt_relu(c, x);
    }
}

static struct lt_tensor *b_pair(struct build *b, const struct params *p)
{
    const int64_t n3 = p->ne[3] ? p->ne[3] : 2;
    struct lt_tensor *x = mk(b, p->type[0], p->lay[0], 9, 6, 3, n3, FILL_UNIFORM, -4, 4);
    struct lt_tensor *y = mk(b, p->type[1], p->lay[1], 9, 6, 3, n3, FILL_UNIFORM, -4, 4);
    return p->i[0] == LT_OP_SWIGLU ? lt_glu_as(b->ctx, x, y, (enum lt_glu)p->i[1], p->type[2])
                                   : lt_silu_back(b->ctx, x, y);
}

/* SWIGLU_BACK: the gradient, gate and up in layouts lay[0..2], the gate of type type[1], up
 * of type[3], the result of type type[2] (0: F32), the gate's activation i[1] (enum lt_glu) */
static struct lt_tensor *b_swiglu_back(struct build *b, const struct params *p)
{
    const int64_t n3 = p->ne[3] ? p->ne[3] : 2; /* 1: 162 elements, the scalar flat kernel */
    struct lt_tensor *g = mk(b, LT_TYPE_F32, p->lay[0], 9, 6, 3, n3, FILL_UNIFORM, -2, 2);
    struct lt_tensor *x = mk(b, p->type[1], p->lay[1], 9, 6, 3, n3, FILL_UNIFORM, -4, 4);
    struct lt_tensor *u = mk(b, p->type[3], p->lay[2], 9, 6, 3, n3, FILL_UNIFORM, -4, 4);
    return lt_glu_back_as(b->ctx, g, x, u, (enum lt_glu)p->i[1],
                          p->type[2] ? p->type[2] : LT_TYPE_F32);
}

/* SWIGLU (i[0] 0) or SWIGLU_BACK (1) of activation i[1], the gate every other half row of a
 * [32, 6, 3, 2] tensor (Qwen3.5's gated attention's gate: a strided view of whole float4
 * rows, which the row kernels take), up and the gradient in layouts lay[1] and lay[0], the
 * result of type type[2] */
static struct lt_tensor *b_glu_rows(struct build *b, const struct params *p)
{
    struct lt_tensor *qg = mk(b, LT_TYPE_F32, L_CONTIG, 32, 6, 3, 2, FILL_UNIFORM, -4, 4);
    struct lt_tensor *gate =
        lt_view_4d(b->ctx, qg, 16, 6, 3, 2, qg->nb[1], qg->nb[2], qg->nb[3], 16 * sizeof(float));
    struct lt_tensor *u = mk(b, LT_TYPE_F32, p->lay[1], 16, 6, 3, 2, FILL_UNIFORM, -4, 4);
    if (p->i[0] == 0)
        return lt_glu_as(b->ctx, gate, u, (enum lt_glu)p->i[1], p->type[2]);
    struct lt_tensor *g = mk(b, LT_TYPE_F32, p->lay[0], 16, 6, 3, 2, FILL_UNIFORM, -2, 2);
    return lt_glu_back_as(b->ctx, g, gate, u, (enum lt_glu)p->i[1], p->type[2]);
}

static struct lt_tensor *b_reduce(struct build *b, const struct params *p)
{
    struct lt_tensor *x = mk(b, p->type[0], p->lay[0], p->ne[0], p->ne[1] ? p->ne[1] : 6, 3, 2,
                             FILL_UNIFORM, -1, 2);
    if (p->i[0] == LT_OP_SUM)
        return lt_sum(b->ctx, x);
    return p->i[0] == LT_OP_MEAN ? lt_mean(b->ctx, x) : lt_sum_rows(b->ctx, x);
}

/* ARGMAX: ne[1] x 2 x 2 rows of ne[0] in layout lay[0], the first i[1] of each (0: all);
 * filled with small integers (ties), or with i[2] 1 values a fifth of them -inf, or with
 * i[2] 2 the ties with a NaN in every third row */
static struct lt_tensor *b_argmax(struct build *b, const struct params *p)
{
    static float vals[9 * 6 * 2 * 2];
    const int64_t ne0 = p->ne[0], ne1 = p->ne[1] ? p->ne[1] : 6;
    struct lt_tensor *x;
    if (p->i[2] == 3) {
        /* vocabulary rows (248,320, in the device's parts of 16,384): integers with ties
         * across parts; a NaN late in rows 1 and 3 (-1), rows 0 and 2 clean */
        static float big[248320 * 4];
        uint64_t r = 7;
        for (int k = 0; k < 248320 * 4; k++)
            big[k] = floorf(rng_unit(&r) * 50 - 3);
        big[248320 + 240000] = NAN;
        big[3 * 248320 + 17000] = NAN;
        x = mk(b, LT_TYPE_F32, p->lay[0], 248320, 1, 2, 2, FILL_VALUES, 0, 0);
        b->in[b->n_in - 1].values = big;
    } else if (p->i[2] == 2) {
        uint64_t r = 99;
        for (int k = 0; k < 9 * 6 * 2 * 2; k++)
            vals[k] = (k / 9) % 3 == 0 && k % 9 == (k / 9) % 9 ? NAN : floorf(rng_unit(&r) * 7 - 3);
        x = mk(b, LT_TYPE_F32, p->lay[0], 9, 6, 2, 2, FILL_VALUES, 0, 0);
        b->in[b->n_in - 1].values = vals;
    } else {
        x = mk(b, LT_TYPE_F32, p->lay[0], ne0, ne1, 2, 2, p->i[2] ? FILL_MASK : FILL_INT,
               p->i[2] ? -2 : -3, p->i[2] ? 2 : 4);
    }
    return lt_argmax(b->ctx, x, p->i[1] ? p->i[1] : x->ne[0]);
}

static void test_elementwise(void)
{
    static const enum lt_op bins[] = {LT_OP_ADD, LT_OP_SUB, LT_OP_MUL, LT_OP_DIV};
    static const char *const bcast[] = {"same", "row", "col", "tile", "per-row"};
    struct params p;
    for (int o = 0; o < 4; o++)
        for (int l = 0; l < L_COUNT; l++)
            for (int k = 0; k < 5; k++) {
                enum lt_type ta = l == L_SLICED && k == 0 ? LT_TYPE_BF16 : LT_TYPE_F32;
                enum lt_type tb = l == L_PERMUTED && k == 1 ? LT_TYPE_F16 : LT_TYPE_F32;
                p = P(l, k == 0 ? (l + 3) % L_COUNT : L_CONTIG, ta, tb);
                p.i[0] = bins[o], p.i[1] = k;
                run_case(bins[o], lbl(layout_names[l], bcast[k]), TOL_F32, b_binary, &p);
            }
    /* both contiguous F32 of a's shape: the float4 flat kernel (F32 out, and MUL's half) */
    for (int o = 0; o < 4; o++) {
        p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
        p.i[0] = bins[o], p.i[1] = 0;
        run_case(bins[o], lbl("contig", "same"), TOL_F32, b_binary, &p);
    }
    for (int h = 0; h < 2; h++) {
        p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
        p.type[2] = h ? LT_TYPE_F16 : LT_TYPE_BF16;
        p.i[0] = LT_OP_MUL, p.i[1] = 0;
        run_case(LT_OP_MUL, lbl("contig same", lt_type_name(p.type[2])), TOL_F32, b_binary, &p);
    }
    /* MUL writing a half activation (the model's norms and gates): CPU and device round the
     * same F32 product to nearest even */
    static const enum lt_type half_out[] = {LT_TYPE_BF16, LT_TYPE_F16};
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < L_COUNT; l++)
            for (int k = 0; k < 2; k++) {
                p = P(l, k == 0 ? (l + 3) % L_COUNT : L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
                p.type[2] = half_out[h];
                p.i[0] = LT_OP_MUL, p.i[1] = k;
                run_case(LT_OP_MUL, lbl(layout_names[l], lt_type_name(half_out[h])), TOL_F32,
                         b_binary, &p);
            }
    for (int u = 0; u < 13; u++)
        for (int l = 0; l < L_COUNT; l++) {
            enum lt_type t = l == L_SLICED ? LT_TYPE_F16 : l == L_BROADCAST ? LT_TYPE_BF16 : LT_TYPE_F32;
            p = P(l, 0, t, LT_TYPE_F32);
            p.i[0] = unary_list[u];
            run_case(unary_list[u], lbl(layout_names[l], t == LT_TYPE_F32 ? "" : lt_type_name(t)),
                     TOL_F32, b_unary, &p);
        }
    /* SCALE writing a half result (a LoRA adapter's A rounded with its scale): every layout
     * of an F32 source, and contiguous half sources */
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < L_COUNT + 1; l++) {
            const bool half_src = l == L_COUNT;
            p = P(half_src ? L_CONTIG : l, 0, half_src ? half_out[1 - h] : LT_TYPE_F32,
                  LT_TYPE_F32);
            p.type[2] = half_out[h];
            p.i[0] = LT_OP_SCALE;
            run_case(
                LT_OP_SCALE,
                lbl(half_src ? "contig, half source" : layout_names[l], lt_type_name(half_out[h])),
                TOL_F32, b_unary, &p);
        }
    static const enum lt_op pairs[] = {LT_OP_SWIGLU, LT_OP_SILU_BACK};
    for (int o = 0; o < 2; o++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, (l + 1) % L_COUNT, LT_TYPE_F32, l == L_CONTIG ? LT_TYPE_BF16 : LT_TYPE_F32);
            p.i[0] = pairs[o];
            run_case(pairs[o], layout_names[l], TOL_F32, b_pair, &p);
        }
    /* contiguous F32 of 162 elements (not a multiple of 4): the scalar flat kernels, where
     * the cases above (324) take the float4 ones */
    for (int u = 0; u < 13; u++) {
        p = P(L_CONTIG, 0, LT_TYPE_F32, LT_TYPE_F32);
        p.i[0] = unary_list[u], p.ne[3] = 1;
        run_case(unary_list[u], "contig 162", TOL_F32, b_unary, &p);
    }
    for (int o = 0; o < 2; o++) {
        p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
        p.i[0] = pairs[o], p.ne[3] = 1;
        run_case(pairs[o], "contig 162", TOL_F32, b_pair, &p);
    }
    p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
    p.lay[2] = L_CONTIG, p.ne[3] = 1;
    run_case(LT_OP_SWIGLU_BACK, "contig 162", TOL_F32, b_swiglu_back, &p);
    /* SWIGLU_BACK: every layout of the gradient against rotations of the others' (contiguous
     * F32 all three: the flat kernel; else the indexed one), a BF16 gate */
    for (int l = 0; l < L_COUNT + 2; l++) {
        const bool flat = l == L_COUNT, bf16 = l == L_COUNT + 1; /* all contiguous */
        const int l0 = l < L_COUNT ? l : L_CONTIG;
        p = P(l0, l < L_COUNT ? (l + 1) % L_COUNT : L_CONTIG, LT_TYPE_F32,
              bf16 ? LT_TYPE_BF16 : LT_TYPE_F32);
        p.lay[2] = l < L_COUNT ? (l + 2) % L_COUNT : L_CONTIG;
        run_case(LT_OP_SWIGLU_BACK,
                 lbl(layout_names[l0], flat   ? "all contiguous f32"
                                       : bf16 ? "bf16 gate"
                                              : "rotated"),
                 TOL_F32, b_swiglu_back, &p);
    }
    /* SWIGLU and SWIGLU_BACK over contiguous BF16 / F16 gate and up (the FFN's products
     * storing half results): the typed float4 kernels; 324 elements */
    for (int h = 0; h < 2; h++) {
        const enum lt_type ht = h ? LT_TYPE_F16 : LT_TYPE_BF16;
        p = P(L_CONTIG, L_CONTIG, ht, ht);
        p.i[0] = LT_OP_SWIGLU, p.type[2] = LT_TYPE_BF16;
        run_case(LT_OP_SWIGLU, lbl("contig 324", lt_type_name(ht)), TOL_HALF, b_pair, &p);
        p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, ht);
        p.lay[2] = L_CONTIG, p.type[2] = LT_TYPE_BF16, p.type[3] = ht;
        run_case(LT_OP_SWIGLU_BACK, lbl("contig 324", lt_type_name(ht)), TOL_HALF, b_swiglu_back,
                 &p);
    }
    /* SWIGLU_BACK writing half gradients (a device's training step: the FFN's gate and up
     * products read them): strided sources (the indexed kernel), all contiguous with 162
     * elements (the scalar flat kernel) and with 324 (float4s); TOL_HALF as SWIGLU's below */
    for (int h = 0; h < 2; h++)
        for (int v = 0; v < 3; v++) {
            p = P(v ? L_CONTIG : L_SLICED, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
            p.lay[2] = L_CONTIG, p.ne[3] = v == 1 ? 1 : 2;
            p.type[2] = h ? LT_TYPE_F16 : LT_TYPE_BF16;
            run_case(LT_OP_SWIGLU_BACK,
                     lbl(v == 0   ? "strided g"
                         : v == 1 ? "contig 162"
                                  : "contig 324",
                         lt_type_name(p.type[2])),
                     TOL_HALF, b_swiglu_back, &p);
        }
    /* the sigmoid gate (Qwen3.5's gated attention output), forward and backward, every layout;
     * then the gate a strided view of whole rows: F32 and BF16 results with up contiguous (the
     * float4 row kernels), and up sliced (the indexed ones) */
    for (int l = 0; l < L_COUNT; l++) {
        p = P(l, (l + 1) % L_COUNT, LT_TYPE_F32, LT_TYPE_F32);
        p.i[0] = LT_OP_SWIGLU, p.i[1] = LT_GLU_SIGMOID, p.lay[2] = (l + 2) % L_COUNT;
        run_case(LT_OP_SWIGLU, lbl(layout_names[l], "sigmoid"), TOL_F32, b_pair, &p);
        run_case(LT_OP_SWIGLU_BACK, lbl(layout_names[l], "sigmoid"), TOL_F32, b_swiglu_back, &p);
    }
    for (int k = 0; k < 2; k++)
        for (int a = 0; a < 2; a++)
            for (int v = 0; v < 3; v++) {
                p = P(L_CONTIG, v == 2 ? L_SLICED : L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
                p.i[0] = k, p.i[1] = a ? LT_GLU_SIGMOID : LT_GLU_SILU;
                p.type[2] = v == 1 ? LT_TYPE_BF16 : LT_TYPE_F32;
                run_case(k ? LT_OP_SWIGLU_BACK : LT_OP_SWIGLU,
                         lbl(a ? "gate rows, sigmoid" : "gate rows, silu", v == 0   ? "f32"
                                                                           : v == 1 ? "bf16"
                                                                                    : "sliced up"),
                         v == 1 ? TOL_HALF : TOL_F32, b_glu_rows, &p);
            }
    /* SWIGLU writing a half activation (ffn_down's input): expf may differ in the last bit
     * between CPU and device, which can move a rounding by one half ulp */
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, (l + 1) % L_COUNT, LT_TYPE_F32, LT_TYPE_F32);
            p.type[2] = h ? LT_TYPE_F16 : LT_TYPE_BF16;
            p.i[0] = LT_OP_SWIGLU;
            run_case(LT_OP_SWIGLU, lbl(layout_names[l], lt_type_name(p.type[2])), TOL_HALF,
                     b_pair, &p);
        }
    /* 36 rows of 9, 1000 and 3000: a block a row on CUDA; then (cu_warp_rows) 4,200 rows of
     * 128 and of 1000, a warp a row, as a training step's */
    static const enum lt_op reds[] = {LT_OP_SUM_ROWS, LT_OP_MEAN, LT_OP_SUM};
    for (int o = 0; o < 3; o++)
        for (int l = 0; l < L_COUNT; l++)
            for (int big = 0; big < 3; big++) {
                p = P(l, 0, l == L_SLICED ? LT_TYPE_F16 : LT_TYPE_F32, LT_TYPE_F32);
                p.i[0] = reds[o];
                p.ne[0] = big == 2 ? 3000 : big ? 1000 : 9;
                run_case(reds[o],
                         lbl(layout_names[l], big == 2 ? "longer"
                                              : big    ? "long"
                                                       : ""),
                         TOL_F32, b_reduce, &p);
            }
    for (int o = 0; o < 2; o++)
        for (int l = 0; l < L_COUNT; l++)
            for (int big = 0; big < 2; big++) {
                p = P(l, 0, l == L_SLICED ? LT_TYPE_F16 : LT_TYPE_F32, LT_TYPE_F32);
                p.i[0] = reds[o];
                p.ne[0] = big ? 1000 : 128;
                p.ne[1] = 700;
                run_case(reds[o], lbl(layout_names[l], big ? "many rows long" : "many rows"),
                         TOL_F32, b_reduce, &p);
            }
    /* ARGMAX, exactly the CPU's index: rows with contiguous elements (contiguous, a slice),
     * of 9, 1000 and a vocabulary's 248,320 (4 rows, a decode batch's), all of each or all
     * but the last 5, ties or -inf; then NaN rows (-1), of 9 and of a vocabulary */
    static const int argmax_lays[] = {L_CONTIG, L_SLICED};
    for (int l = 0; l < 2; l++)
        for (int len = 0; len < 3; len++)
            for (int v = 0; v < 4; v++) {
                p = P(argmax_lays[l], 0, LT_TYPE_F32, LT_TYPE_F32);
                p.ne[0] = len == 2 ? 248320 : len ? 1000 : 9;
                p.ne[1] = len == 2 ? 1 : 6;
                p.i[1] = v & 1 ? (int)p.ne[0] - 5 : 0;
                p.i[2] = v >> 1;
                run_case(LT_OP_ARGMAX,
                         lbl(layout_names[argmax_lays[l]], len == 2 ? "vocab"
                                                           : len    ? "long"
                                                                    : ""),
                         0.0, b_argmax, &p);
            }
    for (int l = 0; l < 2; l++)
        for (int big = 0; big < 2; big++) {
            p = P(argmax_lays[l], 0, LT_TYPE_F32, LT_TYPE_F32);
            p.i[2] = big ? 3 : 2;
            run_case(LT_OP_ARGMAX, lbl(layout_names[argmax_lays[l]], big ? "vocab NaN" : "NaN"),
                     0.0, b_argmax, &p);
        }
}

/* ---- normalisation, rope, softmax ---- */

static struct lt_tensor *b_norm(struct build *b, const struct params *p)
{
    enum lt_op op = (enum lt_op)p->i[0];
    const int64_t n = p->ne[0], n1 = p->ne[1] ? p->ne[1] : 6; /* n1 * 6 rows */
    struct lt_tensor *x = mk(b, LT_TYPE_F32, p->lay[0], n, n1, 3, 2, FILL_UNIFORM, -2, 2);
    float eps = 1e-6f;
    switch (op) {
    case LT_OP_RMS_NORM:
        if (p->type[1] != LT_TYPE_COUNT) /* with a weight, stored as type[1] */
            return lt_rms_norm_mul(b->ctx, x, mk(b, LT_TYPE_F32, L_CONTIG, n, 1, 1, 1, FILL_UNIFORM,
                                                 -2, 2),
                                   eps, p->type[1]);
        return lt_rms_norm(b->ctx, x, eps);
    case LT_OP_L2_NORM: return lt_l2_norm(b->ctx, x, eps);
    default: break;
    }
    struct lt_tensor *g = mk(b, LT_TYPE_F32, p->lay[1], n, n1, 3, 2, FILL_UNIFORM, -1, 1);
    return op == LT_OP_RMS_NORM_BACK ? lt_rms_norm_back(b->ctx, g, x, eps)
                                     : lt_l2_norm_back(b->ctx, g, x, eps);
}

/* i[0]: RMS_NORM (with a weight, stored as type[1]) or RMS_NORM_MUL_BACK; i[1]: the gate z
 * (1: F32, 2: BF16, as a device's training step stores the gate's product);
 * x in lay[0], the gradient and z in lay[1]; ne[0] a row, ne[1] x 6 rows. i[2]: x is instead
 * the first 3 of 4 blocks of ne[1] rows along dim 2 (rows contiguous, blocks apart), as a
 * DeltaNet layer's output rows are a view of DELTA_NET's result. i[3]: the backward adds a
 * contiguous addend into dx (lt_rms_norm_mul_back_add: a residual stream's gradient) */
static struct lt_tensor *b_norm_mul(struct build *b, const struct params *p)
{
    const int64_t n = p->ne[0], n1 = p->ne[1] ? p->ne[1] : 6;
    struct lt_tensor *x;
    if (p->i[2]) {
        struct lt_tensor *big = mk(b, LT_TYPE_F32, L_CONTIG, n, n1, 4, 2, FILL_UNIFORM, -2, 2);
        x = lt_view_4d(b->ctx, big, n, n1, 3, 2, big->nb[1], big->nb[2], big->nb[3], 0);
    } else
        x = mk(b, LT_TYPE_F32, p->lay[0], n, n1, 3, 2, FILL_UNIFORM, -2, 2);
    struct lt_tensor *w = mk(b, LT_TYPE_F32, L_CONTIG, n, 1, 1, 1, FILL_UNIFORM, -2, 2);
    struct lt_tensor *z = p->i[1] ? mk(b, p->i[1] == 2 ? LT_TYPE_BF16 : LT_TYPE_F32, p->lay[1], n,
                                       n1, 3, 2, FILL_UNIFORM, -4, 4)
                                  : NULL;
    if (p->i[0] == LT_OP_RMS_NORM)
        return z ? lt_rms_norm_mul_gated(b->ctx, x, w, z, 1e-6f, p->type[1])
                 : lt_rms_norm_mul(b->ctx, x, w, 1e-6f, p->type[1]);
    struct lt_tensor *g = mk(b, LT_TYPE_F32, p->lay[1], n, n1, 3, 2, FILL_UNIFORM, -1, 1);
    struct lt_tensor *c =
        p->i[3] ? mk(b, LT_TYPE_F32, L_CONTIG, n, n1, 3, 2, FILL_UNIFORM, -3, 3) : NULL;
    return lt_rms_norm_mul_back_add(b->ctx, g, x, w, z, 1e-6f, c);
}

/* i[0]: gate; i[1]: k_new and v_new given (k_new in lay[0]); type[1]: the caches' type;
 * lay[0]: q's layout */
static struct lt_tensor *b_attn_decode(struct build *b, const struct params *p)
{
    static const float ids[3] = {2, 0, 1}, pos[3] = {40, 0, 63};
    const int64_t D = p->ne[0];
    struct lt_tensor *q = mk(b, LT_TYPE_F32, p->lay[0], D, 4, 3, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *k = mk(b, p->type[1], L_CONTIG, D, 2, 64, 3, FILL_UNIFORM, -1, 1);
    struct lt_tensor *v = mk(b, p->type[1], L_CONTIG, D, 2, 64, 3, FILL_UNIFORM, -1, 1);
    struct lt_tensor *ti = mk(b, LT_TYPE_I32, L_CONTIG, 3, 1, 1, 1, FILL_VALUES, 0, 0);
    b->in[b->n_in - 1].values = ids;
    struct lt_tensor *tp = mk(b, LT_TYPE_I32, L_CONTIG, 3, 1, 1, 1, FILL_VALUES, 0, 0);
    b->in[b->n_in - 1].values = pos;
    struct lt_tensor *g =
        p->i[0] ? mk(b, LT_TYPE_F32, L_TRANSPOSED, D, 4, 3, 1, FILL_UNIFORM, -2, 2) : NULL;
    struct lt_tensor *kn = NULL, *vn = NULL;
    if (p->i[1]) { /* this token's keys and values, stored by the op (the caches compared) */
        kn = mk(b, LT_TYPE_F32, p->lay[0], D, 2, 1, 3, FILL_UNIFORM, -1, 1);
        vn = mk(b, LT_TYPE_F32, L_CONTIG, D, 2, 1, 3, FILL_UNIFORM, -1, 1);
        b->extra[b->n_extra++] = k;
        b->extra[b->n_extra++] = v;
    }
    return lt_attn_decode(b->ctx, q, k, v, ti, tp, g, 1.0f / sqrtf((float)D), kn, vn);
}

/* ne: D, T, n_kv, S; i[0]: H, i[1]: Hkv, i[2]: causal (bit 0), mask (bits 1-2: 0 none, 1
 * [n_kv, T, 1, S] with -inf entries and a query row all -inf, 2 [n_kv, T, H, 1], 3 I32
 * positions of packed examples in the mask's place), i[3]:
 * the backward; f[0]: the precision (an lt_flash_attn_prec); type[1]: k and v; lay[0]: q's
 * and do's layout */
static float fa_mask_vals[16 * 512 * 512];
static struct lt_tensor *b_flash_attn(struct build *b, const struct params *p)
{
    const int64_t D = p->ne[0], T = p->ne[1], nk = p->ne[2], S = p->ne[3], H = p->i[0],
                  Hkv = p->i[1];
    const int mask = (p->i[2] >> 1) & 3;
    struct lt_tensor *q = mk(b, LT_TYPE_F32, p->lay[0], D, H, T, S, FILL_UNIFORM, -1, 1);
    struct lt_tensor *k = mk(b, p->type[1], L_CONTIG, D, Hkv, nk, S, FILL_UNIFORM, -1, 1);
    struct lt_tensor *v = mk(b, p->type[1], L_TRANSPOSED, D, Hkv, nk, S, FILL_UNIFORM, -1, 1);
    struct lt_tensor *m = NULL;
    if (mask == 3) { /* packed examples: positions restarting where (7 t + s) % 23 == 0 */
        static float pos_vals[16 * 512];
        if (T * S > (int64_t)(sizeof(pos_vals) / sizeof(float)))
            return NULL;
        for (int64_t sq = 0; sq < S; sq++)
            for (int64_t t = 0, at = 0; t < T; t++, at++) {
                if (t == 0 || (7 * t + sq) % 23 == 0)
                    at = 0;
                pos_vals[sq * T + t] = (float)at;
            }
        m = mk(b, LT_TYPE_I32, L_CONTIG, T * S, 1, 1, 1, FILL_VALUES, 0, 0);
        b->in[b->n_in - 1].values = pos_vals;
    } else if (mask) {
        const int64_t m2 = mask == 2 ? H : 1, m3 = mask == 2 ? 1 : S, n = nk * T * m2 * m3;
        if (n > (int64_t)(sizeof(fa_mask_vals) / sizeof(float)))
            return NULL;
        for (int64_t e = 0; e < n; e++)
            fa_mask_vals[e] = (mask == 1 && (e / nk % T == 2 || e % 7 == 3))
                                  ? -INFINITY
                                  : 0.5f * sinf(0.37f * (float)e);
        m = mk(b, LT_TYPE_F32, L_CONTIG, nk, T, m2, m3, FILL_VALUES, 0, 0);
        b->in[b->n_in - 1].values = fa_mask_vals;
    }
    struct lt_tensor *o =
        lt_flash_attn(b->ctx, q, k, v, m, 1.0f / sqrtf((float)D), (p->i[2] & 1) != 0);
    lt_flash_attn_set_prec(o, (enum lt_flash_attn_prec)(int)p->f[0]);
    if (!p->i[3])
        return o;
    struct lt_tensor *g = mk(b, LT_TYPE_F32, p->lay[0], D, H, T, S, FILL_UNIFORM, -1, 1);
    return lt_flash_attn_back(b->ctx, g, o);
}

static struct lt_tensor *b_add_norm(struct build *b, const struct params *p)
{
    int64_t n = p->ne[0];
    struct lt_tensor *x = mk(b, LT_TYPE_F32, p->lay[0], n, 6, 1, 1, FILL_UNIFORM, -2, 2);
    struct lt_tensor *u = mk(b, LT_TYPE_F32, p->lay[1], n, 6, 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *w = mk(b, LT_TYPE_F32, L_CONTIG, n, 1, 1, 1, FILL_UNIFORM, -2, 2);
    return lt_add_rms_norm(b->ctx, x, u, w, 1e-6f);
}

/* i[0]: op, i[1]: n_dims, i[2]: mode; f[0]: base; ne[0..2] the shape when set (else
 * [16, 3, 5, 2]) */
static struct lt_tensor *b_rope(struct build *b, const struct params *p)
{
    const int64_t n0 = p->ne[0] ? p->ne[0] : 16, n1 = p->ne[0] ? p->ne[1] : 3,
                  n2 = p->ne[0] ? p->ne[2] : 5, n3 = p->ne[0] ? 1 : 2;
    struct lt_tensor *x = mk(b, LT_TYPE_F32, p->lay[0], n0, n1, n2, n3, FILL_UNIFORM, -1, 1);
    struct lt_tensor *pos = mk(b, LT_TYPE_I32, L_CONTIG, n2, 1, 1, 1, FILL_INT, 0, 3000);
    if (p->i[0] == LT_OP_ROPE)
        return lt_rope(b->ctx, x, pos, p->i[1], (enum lt_rope_mode)p->i[2], p->f[0]);
    return lt_rope_back(b->ctx, x, pos, p->i[1], (enum lt_rope_mode)p->i[2], p->f[0]);
}

/* RMS_NORM_ROPE: x as b_rope's (i[3] 1: the query half of [q, gate] rows, a strided view),
 * a weight [ne0], i[1] n_dims, i[2] mode, f[0] the base */
static struct lt_tensor *b_rms_norm_rope(struct build *b, const struct params *p)
{
    const int64_t n0 = p->ne[0] ? p->ne[0] : 16, n1 = p->ne[0] ? p->ne[1] : 3,
                  n2 = p->ne[0] ? p->ne[2] : 5, n3 = p->ne[0] ? 1 : 2;
    struct lt_tensor *x;
    if (p->i[3]) {
        struct lt_tensor *qg =
            mk(b, LT_TYPE_F32, L_CONTIG, 2 * n0, n1, n2, n3, FILL_UNIFORM, -2, 2);
        x = lt_view_4d(b->ctx, qg, n0, n1, n2, n3, qg->nb[1], qg->nb[2], qg->nb[3], 0);
    } else {
        x = mk(b, LT_TYPE_F32, p->lay[0], n0, n1, n2, n3, FILL_UNIFORM, -2, 2);
    }
    struct lt_tensor *w = mk(b, LT_TYPE_F32, L_CONTIG, n0, 1, 1, 1, FILL_UNIFORM, 0.5, 1.5);
    struct lt_tensor *pos = mk(b, LT_TYPE_I32, L_CONTIG, n2, 1, 1, 1, FILL_INT, 0, 3000);
    return lt_rms_norm_rope(b->ctx, x, w, 1e-6f, pos, p->i[1], (enum lt_rope_mode)p->i[2], p->f[0]);
}

/* i[0]: mask (0 none, 1 tiled, 2 full); i[1]: causal; f[0]: scale */
static struct lt_tensor *b_soft_max(struct build *b, const struct params *p)
{
    struct lt_tensor *x = mk(b, LT_TYPE_F32, p->lay[0], 12, 5, 4, 2, FILL_UNIFORM, -3, 3);
    struct lt_tensor *m = NULL;
    if (p->i[0])
        m = mk(b, LT_TYPE_F32, p->lay[1], 12, 5, p->i[0] == 1 ? 2 : 4, p->i[0] == 1 ? 1 : 2,
               FILL_MASK, -2, 0);
    return lt_soft_max(b->ctx, x, m, p->f[0], p->i[1] != 0);
}

static struct lt_tensor *b_soft_max_back(struct build *b, const struct params *p)
{
    struct lt_tensor *g = mk(b, LT_TYPE_F32, p->lay[0], 12, 5, 4, 2, FILL_UNIFORM, -1, 1);
    struct lt_tensor *y = mk(b, LT_TYPE_F32, p->lay[1], 12, 5, 4, 2, FILL_UNIFORM, 0, 0.3f);
    return lt_soft_max_back(b->ctx, g, y);
}

static void test_nn(void)
{
    static const enum lt_op norms[] = {LT_OP_RMS_NORM, LT_OP_L2_NORM, LT_OP_RMS_NORM_BACK,
                                       LT_OP_L2_NORM_BACK};
    struct params p;
    for (int o = 0; o < 4; o++)
        for (int l = 0; l < L_COUNT; l++)
            for (int big = 0; big < 2; big++) {
                p = P(l, (l + 1) % L_COUNT, LT_TYPE_F32, LT_TYPE_COUNT);
                p.i[0] = norms[o];
                p.ne[0] = big ? 1000 : 13;
                run_case(norms[o], lbl(layout_names[l], big ? "long" : ""), TOL_F32, b_norm, &p);
            }
    /* many short rows (4,200 of 128, and of 1000): a warp a row on CUDA (norm.cu's
     * cu_warp_rows), as a training step's DeltaNet norms; the weighted RMS_NORM to BF16 too */
    for (int o = 0; o < 5; o++)
        for (int l = 0; l < L_COUNT; l++)
            for (int big = 0; big < 2; big++) {
                const bool weighted = o == 4;
                p = P(l, (l + 1) % L_COUNT, LT_TYPE_F32, weighted ? LT_TYPE_BF16 : LT_TYPE_COUNT);
                p.i[0] = weighted ? LT_OP_RMS_NORM : norms[o];
                p.ne[0] = big ? 1000 : 128;
                p.ne[1] = 700;
                run_case((enum lt_op)p.i[0],
                         lbl(layout_names[l], weighted
                                                  ? (big ? "many rows bf16 long" : "many rows bf16")
                                              : big ? "many rows long"
                                                    : "many rows"),
                         weighted ? TOL_HALF : TOL_F32, b_norm, &p);
            }
    /* ATTN_DECODE: F32 and F16 caches, with and without the gate, q in each layout */
    for (int t = 0; t < 2; t++)
        for (int gated = 0; gated < 2; gated++)
            for (int l = 0; l < L_COUNT; l++) {
                p = P(l, 0, LT_TYPE_F32, t ? LT_TYPE_F16 : LT_TYPE_F32);
                p.ne[0] = l == L_CONTIG ? 256 : 16;
                p.i[0] = gated;
                char buf[32];
                snprintf(buf, sizeof(buf), "%s%s", t ? "f16" : "f32", gated ? "/gate" : "");
                run_case(LT_OP_ATTN_DECODE, lbl(layout_names[l], buf), TOL_F32, b_attn_decode, &p);
            }
    /* ... storing this token's keys and values (k_new in each layout), the caches compared */
    for (int t = 0; t < 2; t++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, 0, LT_TYPE_F32, t ? LT_TYPE_F16 : LT_TYPE_F32);
            p.ne[0] = l == L_CONTIG ? 256 : 16;
            p.i[0] = 1, p.i[1] = 1;
            run_case(LT_OP_ATTN_DECODE, lbl(layout_names[l], t ? "f16/store" : "f32/store"),
                     TOL_F32, b_attn_decode, &p);
        }
    /* FLASH_ATTN and its backward: q in every layout on a small causal shape; grouped heads,
     * a cache longer than the queries, masks with -inf (a query with every key dropped) and
     * a mask a head; tails of every tile size; Qwen3.5-0.8B's heads (D 256, 8 over 2) at F32
     * and TF32; every shape also at BF16 (flash_attn_bf16.cu: D padded to 64, 128 and 256);
     * BF16 and F16 keys and values; D 300 (refused: the CPU takes it); the 0.8B training
     * step's attention (16 x 512 tokens, a packed mask) */
    char fbuf[96];
    static const int64_t fa_shapes[][8] = {/* D, T, n_kv, S, H, Hkv, causal | mask << 1, layouts */
                                           {16, 5, 5, 1, 2, 2, 1, L_COUNT},
                                           {64, 70, 100, 2, 4, 2, 1 | 1 << 1, 2},
                                           {40, 33, 33, 1, 2, 1, 2 << 1, 1},
                                           {128, 65, 65, 2, 2, 2, 1, 1},
                                           {256, 130, 130, 2, 8, 2, 1, 1},
                                           {32, 17, 200, 1, 4, 4, 1 | 1 << 1, 1},
                                           {300, 4, 4, 1, 1, 1, 1, 1},
                                           {256, 512, 512, 16, 8, 2, 1 | 1 << 1, 1},
                                           {64, 150, 150, 2, 4, 2, 1 | 3 << 1, 2},
                                           {256, 512, 512, 16, 8, 2, 1 | 3 << 1, 1}};
    for (size_t c = 0; c < sizeof(fa_shapes) / sizeof(fa_shapes[0]); c++)
        for (int back = 0; back < 2; back++)
            for (int l = 0; l < (int)fa_shapes[c][7]; l++)
                for (int pr = 0; pr < 3; pr++)
                    for (int kt = 0; kt < (c == 1 ? 3 : 1); kt++) {
                        if (pr == LT_FLASH_ATTN_PREC_TF32 && fa_shapes[c][0] != 256)
                            continue;
                        static const enum lt_type kts[] = {LT_TYPE_F32, LT_TYPE_BF16, LT_TYPE_F16};
                        p = P(l, L_CONTIG, LT_TYPE_F32, kts[kt]);
                        p.ne[0] = fa_shapes[c][0], p.ne[1] = fa_shapes[c][1];
                        p.ne[2] = fa_shapes[c][2], p.ne[3] = fa_shapes[c][3];
                        p.i[0] = (int)fa_shapes[c][4], p.i[1] = (int)fa_shapes[c][5];
                        p.i[2] = (int)fa_shapes[c][6], p.i[3] = back;
                        p.f[0] = (float)pr;
                        snprintf(fbuf, sizeof(fbuf), "D%lld T%lld nk%lld S%lld H%d/%d%s%s%s %s%s",
                                 (long long)p.ne[0], (long long)p.ne[1], (long long)p.ne[2],
                                 (long long)p.ne[3], p.i[0], p.i[1], p.i[2] & 1 ? " causal" : "",
                                 p.i[2] >> 1 == 1   ? " mask -inf"
                                 : p.i[2] >> 1 == 2 ? " mask/head"
                                 : p.i[2] >> 1 == 3 ? " positions"
                                                    : "",
                                 pr == LT_FLASH_ATTN_PREC_TF32   ? " tf32"
                                 : pr == LT_FLASH_ATTN_PREC_BF16 ? " bf16"
                                                                 : "",
                                 lt_type_name(kts[kt]), "");
                        run_case(back ? LT_OP_FLASH_ATTN_BACK : LT_OP_FLASH_ATTN,
                                 lbl(layout_names[l], fbuf),
                                 pr == LT_FLASH_ATTN_PREC_TF32   ? TOL_DN_TF32
                                 : pr == LT_FLASH_ATTN_PREC_BF16 ? TOL_FA_BF16
                                                                 : TOL_F32,
                                 b_flash_attn, &p);
                    }
    /* ADD_RMS_NORM (the residual sum and its weighted norm), each pair of layouts; rows of
     * 13, 1024 (a thread an element) and 5000 (past the 4 elements a thread keeps) */
    for (int l = 0; l < L_COUNT; l++)
        for (int big = 0; big < 3; big++) {
            p = P(l, (l + 1) % L_COUNT, LT_TYPE_F32, LT_TYPE_F32);
            p.ne[0] = big == 2 ? 5000 : big ? 1024 : 13;
            run_case(LT_OP_ADD_RMS_NORM,
                     lbl(layout_names[l], big == 2 ? "longer" : big ? "long" : ""), TOL_F32,
                     b_add_norm, &p);
        }
    /* RMS_NORM with a weight (the inference fusion), stored as F32, F16 or BF16 */
    static const enum lt_type norm_out[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16};
    for (int t = 0; t < 3; t++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, 0, LT_TYPE_F32, norm_out[t]);
            p.i[0] = LT_OP_RMS_NORM;
            p.ne[0] = t == 1 ? 1000 : 13;
            run_case(LT_OP_RMS_NORM, lbl(layout_names[l], lt_type_name(norm_out[t])),
                     t ? TOL_HALF : TOL_F32, b_norm, &p);
        }
    /* the weighted norm with the gate (forward to F32 and BF16) and RMS_NORM_MUL_BACK with and
     * without it, its sources all contiguous (the float4 kernel where rows are a multiple of 4
     * up to 1024) and in pairs of other layouts (the strided warp kernel, the block kernel past
     * 1024): 13 x 36 in every pair; 4,200 rows of 128 (a part a row); 300 rows of 256 and 500
     * (2 and 4 float4s a lane, lanes past the row's end at 500) and of 1500 (a block a part);
     * 4,200 rows of 1000 (some parts of two rows); the 0.8B training step's gated norm
     * (131,076 rows of 128, parts of four) and hidden norms (8,196 rows of 1024, of two) */
    static const int64_t nm_shapes[][3] = {/* ne0, ne1 (x 6 rows), pairs of layouts */
                                           {13, 6, L_COUNT}, {128, 700, 2},  {256, 50, 1},
                                           {500, 50, 1},     {1000, 700, 1}, {1500, 50, 1},
                                           {128, 21846, 1},  {1024, 1366, 1}};
    for (size_t c = 0; c < sizeof(nm_shapes) / sizeof(nm_shapes[0]); c++)
        for (int o = 0; o < 3; o++)
            for (int gated = 0; gated < 2; gated++)
                for (int l = 0; l <= (int)nm_shapes[c][2]; l++) {
                    if (o < 2 && !gated && c > 0)
                        continue; /* the plain weighted norm's shapes are above */
                    /* l = 0: every source contiguous; then x in layout l - 1, g and z in l */
                    const int lx = l ? l - 1 : L_CONTIG, lg = l ? l % L_COUNT : L_CONTIG;
                    const enum lt_op op = o < 2 ? LT_OP_RMS_NORM : LT_OP_RMS_NORM_MUL_BACK;
                    p = P(lx, lg, LT_TYPE_F32, o == 1 ? LT_TYPE_BF16 : LT_TYPE_F32);
                    p.i[0] = op, p.i[1] = gated;
                    p.ne[0] = nm_shapes[c][0], p.ne[1] = nm_shapes[c][1];
                    snprintf(fbuf, sizeof(fbuf), "%lld x %lld%s%s", (long long)p.ne[0],
                             (long long)p.ne[1] * 6, gated ? " gate" : "", o == 1 ? " bf16" : "");
                    run_case(op, lbl(l ? layout_names[lx] : "all contig", fbuf),
                             o == 1 ? TOL_HALF : TOL_F32, b_norm_mul, &p);
                }
    /* the weighted norm's gradients with an addend in dx (the residual stream's gradient):
     * the float4 kernel (contiguous rows of 1024 and 128), the strided warp kernel (a
     * transposed x) and the block kernel (rows of 1500), gated and not */
    static const int64_t add_shapes[][3] = {
        {1024, 20, L_CONTIG}, {128, 50, L_CONTIG}, {13, 6, L_TRANSPOSED}, {1500, 10, L_CONTIG}};
    for (size_t c = 0; c < sizeof(add_shapes) / sizeof(add_shapes[0]); c++)
        for (int gated = 0; gated < 2; gated++) {
            p = P((int)add_shapes[c][2], L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
            p.i[0] = LT_OP_RMS_NORM_MUL_BACK, p.i[1] = gated, p.i[3] = 1;
            p.ne[0] = add_shapes[c][0], p.ne[1] = add_shapes[c][1];
            snprintf(fbuf, sizeof(fbuf), "%lld x %lld%s, addend", (long long)p.ne[0],
                     (long long)p.ne[1] * 6, gated ? " gate" : "");
            run_case(LT_OP_RMS_NORM_MUL_BACK, lbl(layout_names[add_shapes[c][2]], fbuf), TOL_F32,
                     b_norm_mul, &p);
        }
    /* a BF16 gate, forward (to F32 and BF16) and backward: every layout pair at 13 x 36,
     * the float4 kernels (rows of 128, contiguous and x transposed), the block kernel (rows
     * of 1500), and x's rows apart (DELTA_NET's output) */
    static const int64_t bz_shapes[][3] = {{13, 6, L_COUNT}, {128, 700, 1}, {1500, 50, 0}};
    for (size_t c = 0; c < sizeof(bz_shapes) / sizeof(bz_shapes[0]); c++)
        for (int o = 0; o < 3; o++)
            for (int l = 0; l <= (int)bz_shapes[c][2]; l++) {
                const int lx = l ? l - 1 : L_CONTIG, lg = l ? l % L_COUNT : L_CONTIG;
                const enum lt_op op = o < 2 ? LT_OP_RMS_NORM : LT_OP_RMS_NORM_MUL_BACK;
                p = P(lx, lg, LT_TYPE_F32, o == 1 ? LT_TYPE_BF16 : LT_TYPE_F32);
                p.i[0] = op, p.i[1] = 2;
                p.ne[0] = bz_shapes[c][0], p.ne[1] = bz_shapes[c][1];
                snprintf(fbuf, sizeof(fbuf), "%lld x %lld bf16 gate%s", (long long)p.ne[0],
                         (long long)p.ne[1] * 6, o == 1 ? " bf16" : "");
                run_case(op, lbl(l ? layout_names[lx] : "all contig", fbuf),
                         o == 1 ? TOL_HALF : TOL_F32, b_norm_mul, &p);
            }
    p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
    p.i[0] = LT_OP_RMS_NORM_MUL_BACK, p.i[1] = 2, p.i[2] = 1;
    p.ne[0] = 128, p.ne[1] = 700;
    run_case(LT_OP_RMS_NORM_MUL_BACK, lbl("rows apart", "128 x 4200 bf16 gate"), TOL_F32,
             b_norm_mul, &p);
    /* the weighted norm's gradients with x's rows contiguous but their blocks apart (the
     * float4 kernel reads such an x by its strides), gated and not */
    for (int gated = 0; gated < 2; gated++) {
        p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
        p.i[0] = LT_OP_RMS_NORM_MUL_BACK, p.i[1] = gated, p.i[2] = 1;
        p.ne[0] = 128, p.ne[1] = 700;
        run_case(LT_OP_RMS_NORM_MUL_BACK,
                 lbl("rows apart", gated ? "128 x 4200 gate" : "128 x 4200"), TOL_F32, b_norm_mul,
                 &p);
    }
    static const enum lt_op ropes[] = {LT_OP_ROPE, LT_OP_ROPE_BACK};
    for (int o = 0; o < 2; o++)
        for (int l = 0; l < L_COUNT; l++)
            for (int mode = 0; mode < 2; mode++)
                for (int partial = 0; partial < 2; partial++) {
                    p = P(l, 0, LT_TYPE_F32, LT_TYPE_F32);
                    p.i[0] = ropes[o];
                    p.i[1] = partial ? 8 : 16;
                    p.i[2] = mode ? LT_ROPE_NEOX : LT_ROPE_NORMAL;
                    p.f[0] = partial ? 1e6f : 1e4f;
                    run_case(ropes[o], lbl(layout_names[l], mode ? "neox" : "normal"), TOL_F32,
                             b_rope, &p);
                }
    /* Qwen3.5's queries: 8 heads of 256, the first 64 dims turned (a token's 2048 elements
     * over one block's threads, several each) */
    for (int o = 0; o < 2; o++) {
        p = P(L_CONTIG, 0, LT_TYPE_F32, LT_TYPE_F32);
        p.i[0] = ropes[o], p.i[1] = 64, p.i[2] = LT_ROPE_NEOX, p.f[0] = 1e7f;
        p.ne[0] = 256, p.ne[1] = 8, p.ne[2] = 40;
        run_case(ropes[o], "256 x 8 x 40, 64 dims", TOL_F32, b_rope, &p);
    }
    /* RMS_NORM_ROPE (a decode step's query and key norms and rotation): every layout, both
     * modes, part and all of the head turned; Qwen3.5's query view (256 of each 512-float
     * row, 8 heads, 64 dims turned) and key (2 heads), one and four tokens; a head_dim of 80
     * (not a warp's multiple) */
    for (int l = 0; l < L_COUNT; l++)
        for (int mode = 0; mode < 2; mode++)
            for (int partial = 0; partial < 2; partial++) {
                p = P(l, 0, LT_TYPE_F32, LT_TYPE_F32);
                p.i[1] = partial ? 8 : 16;
                p.i[2] = mode ? LT_ROPE_NEOX : LT_ROPE_NORMAL;
                p.f[0] = partial ? 1e6f : 1e4f;
                run_case(LT_OP_RMS_NORM_ROPE, lbl(layout_names[l], mode ? "neox" : "normal"),
                         TOL_F32, b_rms_norm_rope, &p);
            }
    for (int t = 1; t <= 4; t += 3)
        for (int kq = 0; kq < 2; kq++) {
            p = P(L_CONTIG, 0, LT_TYPE_F32, LT_TYPE_F32);
            p.i[1] = 64, p.i[2] = LT_ROPE_NEOX, p.i[3] = kq == 0, p.f[0] = 1e7f;
            p.ne[0] = 256, p.ne[1] = kq == 0 ? 8 : 2, p.ne[2] = t;
            run_case(LT_OP_RMS_NORM_ROPE, kq == 0 ? "query view 256 x 8" : "key 256 x 2", TOL_F32,
                     b_rms_norm_rope, &p);
        }
    p = P(L_SLICED, 0, LT_TYPE_F32, LT_TYPE_F32);
    p.i[1] = 80, p.i[2] = LT_ROPE_NEOX, p.f[0] = 1e4f;
    p.ne[0] = 80, p.ne[1] = 5, p.ne[2] = 3;
    run_case(LT_OP_RMS_NORM_ROPE, "80 x 5 x 3, sliced", TOL_F32, b_rms_norm_rope, &p);
    for (int l = 0; l < L_COUNT; l++)
        for (int mask = 0; mask < 3; mask++)
            for (int causal = 0; causal < 2; causal++) {
                p = P(l, (l + mask) % L_COUNT, LT_TYPE_F32, LT_TYPE_F32);
                p.i[0] = mask, p.i[1] = causal, p.f[0] = 0.125f;
                run_case(LT_OP_SOFT_MAX, lbl(layout_names[l], causal ? "causal" : ""), TOL_F32,
                         b_soft_max, &p);
            }
    for (int l = 0; l < L_COUNT; l++) {
        p = P(l, (l + 2) % L_COUNT, LT_TYPE_F32, LT_TYPE_F32);
        run_case(LT_OP_SOFT_MAX_BACK, layout_names[l], TOL_F32, b_soft_max_back, &p);
    }
}

/* ---- recurrent, loss, optimizer ---- */

/* sx [d_conv - 1 + T, C, S] = [3 + 6, 10, 2], w [4, 10] */
/* ne[0..2]: steps (d_conv - 1 + T), channels, sequences (0: 9, 10, 2); d_conv 4 */
static struct lt_tensor *b_ssm_conv(struct build *b, const struct params *p)
{
    const int64_t L = p->ne[0] ? p->ne[0] : 9, C = p->ne[0] ? p->ne[1] : 10,
                  S = p->ne[0] ? p->ne[2] : 2;
    struct lt_tensor *sx = mk(b, LT_TYPE_F32, p->lay[0], L, C, S, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *w = mk(b, p->type[1], p->lay[1], 4, C, 1, 1, FILL_UNIFORM, -1, 1);
    if (!p->i[0])
        return lt_ssm_conv(b->ctx, sx, w);
    struct lt_tensor *g = mk(b, LT_TYPE_F32, p->lay[2], C, L - 3, S, 1, FILL_UNIFORM, -1, 1);
    return lt_ssm_conv_back(b->ctx, g, sx, w);
}

/* CONV_SILU (i[0] 0) or its backward: x [C, T, S] of type[0] in lay[0] (ne[0..2]), w [i[1] taps, C]
 * of type[1] in lay[1], the gradient in lay[2]; i[2] 1: packed examples, each step's position
 * within its example (examples of 1, 2, 3, ... steps, then the rest of the row); type[2] BF16:
 * the backward's d x in BF16 (lt_conv_silu_back_as), compared as its two views */
static struct lt_tensor *b_conv_silu(struct build *b, const struct params *p)
{
    static float pos_vals[4096];
    const int64_t C = p->ne[0], T = p->ne[1], S = p->ne[2];
    struct lt_tensor *x = mk(b, p->type[0], p->lay[0], C, T, S, 1, FILL_UNIFORM, -2, 2);
    struct lt_tensor *w = mk(b, p->type[1], p->lay[1], p->i[1], C, 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *pos = NULL;
    if (p->i[2] && T * S <= 4096) {
        for (int64_t s = 0; s < S; s++)
            for (int64_t t = 0, len = 1 + s, at = 0; t < T; t++, at++) {
                if (at == len) { /* the next example, one step longer */
                    at = 0;
                    len++;
                }
                pos_vals[s * T + t] = (float)at;
            }
        pos = mk(b, LT_TYPE_I32, L_CONTIG, T, S, 1, 1, FILL_VALUES, 0, 0);
        b->in[b->n_in - 1].values = pos_vals;
    }
    if (!p->i[0])
        return lt_conv_silu_packed(b->ctx, x, w, pos);
    struct lt_tensor *g = mk(b, LT_TYPE_F32, p->lay[2], C, T, S, 1, FILL_UNIFORM, -1, 1);
    if (p->type[2] != LT_TYPE_BF16)
        return lt_conv_silu_back(b->ctx, g, x, w, pos);
    struct lt_tensor *r = lt_conv_silu_back_as(b->ctx, g, x, w, pos, LT_TYPE_BF16);
    b->out_as = r ? lt_conv_silu_back_x(b->ctx, r) : NULL;
    b->extra[b->n_extra++] = r ? lt_conv_silu_back_w(b->ctx, r) : NULL;
    return b->out_as && b->extra[0] ? r : NULL;
}

/* f[1] of a DELTA_NET case: 0 F32, 1 TF32, 2 BF16 */
static enum lt_delta_net_prec dn_prec_of(const struct params *p)
{
    return p->f[1] == 2.0f   ? LT_DELTA_NET_PREC_BF16
           : p->f[1] != 0.0f ? LT_DELTA_NET_PREC_TF32
                             : LT_DELTA_NET_PREC_F32;
}

/* ne: S_k, S_v, T, B; i[0]: H_k, i[1]: H_v, i[2]: path, i[3]: backward; f[0] nonzero: the
 * initial state is zeros (a sequence with no state before it); f[1]: the node's precision
 * (dn_prec_of); f[2] nonzero: packed examples, the gate -30 lower (a packed
 * training step's reset, LT_MB_GATE_RESET) at steps 40, 100 and 300 and 301 (an example of
 * one step) of every sequence and head; f[3] nonzero: the backward's gradient is the
 * output's alone, [S_v, H_v, T, B] (a training step's) */
static struct lt_tensor *b_delta_net(struct build *b, const struct params *p)
{
    const int64_t sk = p->ne[0], sv = p->ne[1], nt = p->ne[2], nb = p->ne[3], hk = p->i[0],
                  hv = p->i[1];
    /* |k|^2 about 1 at most (the model's keys are unit vectors), so that the rule contracts
     * and long sequences stay bounded */
    const float qk = fminf(0.3f, sqrtf(3.0f / (float)sk));
    struct lt_tensor *q = mk(b, LT_TYPE_F32, p->lay[0], sk, hk, nt, nb, FILL_UNIFORM, -qk, qk);
    struct lt_tensor *k = mk(b, LT_TYPE_F32, p->lay[1], sk, hk, nt, nb, FILL_UNIFORM, -qk, qk);
    struct lt_tensor *v = mk(b, LT_TYPE_F32, p->lay[0], sv, hv, nt, nb, FILL_UNIFORM, -1, 1);
    struct lt_tensor *g;
    static float g_vals[1 << 17];
    if (p->f[2] != 0.0f && hv * nt * nb <= (int64_t)(sizeof(g_vals) / sizeof(g_vals[0]))) {
        uint64_t r = 0x9e3779b97f4a7c15ull;
        for (int64_t s = 0; s < nb; s++)
            for (int64_t t = 0; t < nt; t++)
                for (int64_t h = 0; h < hv; h++) {
                    const bool reset = t == 40 || t == 100 || t == 300 || t == 301;
                    g_vals[(s * nt + t) * hv + h] =
                        -1.0f + 0.99f * rng_unit(&r) + (reset ? LT_MB_GATE_RESET : 0.0f);
                }
        g = mk(b, LT_TYPE_F32, L_CONTIG, hv, nt, nb, 1, FILL_VALUES, 0, 0);
        b->in[b->n_in - 1].values = g_vals;
    } else {
        g = mk(b, LT_TYPE_F32, L_CONTIG, hv, nt, nb, 1, FILL_UNIFORM, -1.0f, -0.01f);
    }
    struct lt_tensor *beta = mk(b, LT_TYPE_F32, L_CONTIG, hv, nt, nb, 1, FILL_UNIFORM, 0, 1);
    const float st_hi = p->f[0] != 0.0f ? 0.0f : 0.5f;
    struct lt_tensor *st =
        mk(b, LT_TYPE_F32, p->lay[1], sv, sk, hv, nb, FILL_UNIFORM, -st_hi, st_hi);
    if (p->i[3]) { /* f[3] nonzero: the output's gradient alone (the final state's zero) */
        struct lt_tensor *gr = mk(b, LT_TYPE_F32, L_CONTIG, sv, hv, p->f[3] != 0.0f ? nt : nt + sk,
                                  nb, FILL_UNIFORM, -1, 1);
        struct lt_tensor *r = lt_delta_net_back(b->ctx, gr, q, k, v, g, beta, st, 0.25f);
        lt_delta_net_set_path(r, (enum lt_delta_net_path)p->i[2]);
        lt_delta_net_set_prec(r, dn_prec_of(p));
        return r;
    }
    struct lt_tensor *r = lt_delta_net(b->ctx, q, k, v, g, beta, st, 0.25f);
    lt_delta_net_set_path(r, (enum lt_delta_net_path)p->i[2]);
    lt_delta_net_set_prec(r, dn_prec_of(p));
    return r;
}

/* GDN_DECODE: ne[0] S_k = S_v, ne[1] S (1 or 3); i[0] H_k (H_v = 2 H_k, so value heads
 * share key heads; i[2] = 1: H_v = H_k, Qwen3.5-0.8B's); K = 4; qkv and conv_state in layout
 * lay[0], the ssm state in lay[1], conv_w of type[1]. i[1]: the states are caches of S + 2 slots
 * read at seq_ids and both caches are written in place (compared as extras): 1 ids {2} / {3, 0, 4},
 * 2 with ids outside the caches ({3, -1, 5}: those sequences skipped, zeros) */
static struct lt_tensor *b_gdn_decode(struct build *b, const struct params *p)
{
    const int64_t sk = p->ne[0], sv = p->ne[0], ns = p->ne[1], hk = p->i[0];
    const int64_t hv = p->i[2] ? hk : 2 * hk, K = 4;
    const int64_t C = 2 * sk * hk + sv * hv, slots = p->i[1] ? ns + 2 : ns;
    struct lt_tensor *qkv = mk(b, LT_TYPE_F32, p->lay[0], C, ns, 1, 1, FILL_UNIFORM, -2, 2);
    struct lt_tensor *z = mk(b, LT_TYPE_F32, L_CONTIG, sv * hv, ns, 1, 1, FILL_UNIFORM, -2, 2);
    struct lt_tensor *beta = mk(b, LT_TYPE_F32, L_CONTIG, hv, ns, 1, 1, FILL_UNIFORM, -3, 3);
    struct lt_tensor *alpha = mk(b, LT_TYPE_F32, L_CONTIG, hv, ns, 1, 1, FILL_UNIFORM, -3, 3);
    /* a cache written in place cannot be a broadcast view (the constructor refuses one) */
    const int cs_lay = p->i[1] && p->lay[0] == L_BROADCAST ? L_CONTIG : p->lay[0];
    struct lt_tensor *cs = mk(b, LT_TYPE_F32, cs_lay, K - 1, C, slots, 1, FILL_UNIFORM, -2, 2);
    struct lt_tensor *ss =
        mk(b, LT_TYPE_F32, p->lay[1], sv, sk, hv, slots, FILL_UNIFORM, -0.5f, 0.5f);
    struct lt_tensor *w = mk(b, p->type[1], L_CONTIG, K, C, 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *dt = mk(b, LT_TYPE_F32, L_CONTIG, hv, 1, 1, 1, FILL_UNIFORM, -1, 1);
    /* a holds -exp(A_log) */
    struct lt_tensor *a = mk(b, LT_TYPE_F32, L_CONTIG, hv, 1, 1, 1, FILL_UNIFORM, -2.5f, -0.4f);
    struct lt_tensor *nw = mk(b, LT_TYPE_F32, L_CONTIG, sv, 1, 1, 1, FILL_UNIFORM, 0.5f, 1.5f);
    struct lt_tensor *ids = NULL;
    if (p->i[1]) {
        static const float one[1] = {2}, three[3] = {3, 0, 4}, outside[3] = {3, -1, 5};
        ids = mk(b, LT_TYPE_I32, L_CONTIG, ns, 1, 1, 1, FILL_VALUES, 0, 0);
        b->in[b->n_in - 1].values = p->i[1] == 2 ? outside : ns == 1 ? one : three;
        b->extra[b->n_extra++] = ss;
        b->extra[b->n_extra++] = cs;
    }
    return lt_gdn_decode(b->ctx, qkv, z, beta, alpha, cs, ss, w, dt, a, nw, hk, 1e-6f, ids);
}

/* logits [50, 7]; labels with one masked; i[0]: backward */
static struct lt_tensor *b_cross_entropy(struct build *b, const struct params *p)
{
    struct lt_tensor *x = mk(b, LT_TYPE_F32, p->lay[0], p->ne[0], 7, 1, 1, FILL_UNIFORM, -4, 4);
    struct lt_tensor *y = mk(b, LT_TYPE_I32, L_CONTIG, 7, 1, 1, 1, FILL_INT, -1, (float)p->ne[0]);
    if (!p->i[0])
        return lt_cross_entropy(b->ctx, x, y);
    static const float g[1] = {0.7f};
    return lt_cross_entropy_back(b->ctx, mk_values(b, 1, g), x, y);
}

/* LINEAR_CE: head [64, V] of type[1], hidden [64, 37], labels with masked ones; i[0]:
 * backward; i[1]: tokens a chunk (0: the default); i[2]: the backward's parts (0: dh and dw
 * through lt_linear_cross_entropy_back). Each part of the backward is compared on its own
 * too (extra), so the loss, orders of magnitude above the gradients' elements, cannot hide
 * their errors. */
static struct lt_tensor *b_linear_ce(struct build *b, const struct params *p)
{
    struct lt_tensor *w = mk(b, p->type[1], L_CONTIG, 64, p->ne[0], 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *h = mk(b, LT_TYPE_F32, L_CONTIG, 64, 37, 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *y = mk(b, LT_TYPE_I32, L_CONTIG, 37, 1, 1, 1, FILL_INT, -1, (float)p->ne[0]);
    struct lt_tensor *r;
    if (!p->i[0]) {
        r = lt_linear_cross_entropy(b->ctx, w, h, y);
    } else {
        static const float g[1] = {0.7f};
        struct lt_tensor *gl = mk_values(b, 1, g);
        r = p->i[2] ? lt_linear_cross_entropy_back_parts(b->ctx, gl, w, h, y, (unsigned)p->i[2])
                    : lt_linear_cross_entropy_back(b->ctx, gl, w, h, y);
        const unsigned parts = p->i[2] ? (unsigned)p->i[2] : LT_LINEAR_CE_DH | LT_LINEAR_CE_DW;
        if (r && (parts & LT_LINEAR_CE_DH))
            b->extra[b->n_extra++] = lt_linear_cross_entropy_back_h(b->ctx, r);
        if (r && (parts & LT_LINEAR_CE_DW))
            b->extra[b->n_extra++] = lt_linear_cross_entropy_back_w(b->ctx, r);
        if (r && (parts & LT_LINEAR_CE_LOSS))
            b->extra[b->n_extra++] = lt_linear_cross_entropy_back_loss(b->ctx, r);
    }
    lt_linear_cross_entropy_set_chunk(r, p->i[1]);
    return r;
}

/* On the device alone, the backward with the loss part (what a training graph runs in place
 * of LINEAR_CE) against LINEAR_CE and the backward without it, in one graph: the same loss
 * bit for bit (the same logits product and the same column kernel), the same dh and dw bit
 * for bit; F32 and BF16 heads, in one chunk, in four and in 13 (a BF16 head's backward: four
 * groups of chunks) */
static void test_linear_ce_fused_loss(void)
{
    enum { D = 64, V = 3000, N = 37 };
    for (int t = 0; t < 2; t++)
        for (int chunk = 0; chunk < 3; chunk++) {
            static const int chunk_tokens[] = {0, 10, 3};
            struct lt_ctx *ctx =
                lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
            const enum lt_type wt = t ? LT_TYPE_BF16 : LT_TYPE_F32;
            struct lt_tensor *w = lt_new_tensor_2d(ctx, wt, D, V);
            struct lt_tensor *h = lt_new_tensor_2d(ctx, LT_TYPE_F32, D, N);
            struct lt_tensor *y = lt_new_tensor_1d(ctx, LT_TYPE_I32, N);
            struct lt_tensor *gl = lt_new_tensor_1d(ctx, LT_TYPE_F32, 1);
            const unsigned grads = LT_LINEAR_CE_DH | LT_LINEAR_CE_DW;
            struct lt_tensor *loss = lt_linear_cross_entropy(ctx, w, h, y);
            struct lt_tensor *fused =
                lt_linear_cross_entropy_back_parts(ctx, gl, w, h, y, grads | LT_LINEAR_CE_LOSS);
            struct lt_tensor *plain = lt_linear_cross_entropy_back_parts(ctx, gl, w, h, y, grads);
            struct lt_tensor *outs[3] = {loss, fused, plain};
            struct lt_graph *g = lt_graph_new(ctx, 64);
            struct lt_sched *s = lt_sched_new(&g_cuda, 1);
            lt_status st = g && s ? LT_OK : LT_ERR_NOMEM;
            for (int i = 0; i < 3 && st == LT_OK; i++) {
                lt_linear_cross_entropy_set_chunk(outs[i], chunk_tokens[chunk]);
                outs[i]->flags |= LT_FLAG_OUTPUT;
                st = lt_graph_build(g, outs[i]);
            }
            if (st == LT_OK)
                st = lt_sched_place(s, g, true, NULL);
            if (st == LT_OK)
                st = lt_sched_alloc(s, g);
            /* the inputs: a head of values BF16 holds exactly, labels with masked ones */
            static float wv[D * V], hv[D * N];
            static int32_t yv[N];
            for (int i = 0; i < D * V; i++)
                wv[i] = (float)((i * 37) % 17 - 8) / 16.0f;
            for (int i = 0; i < D * N; i++)
                hv[i] = (float)((i * 11) % 13 - 6) / 8.0f;
            for (int i = 0; i < N; i++)
                yv[i] = i % 5 == 1 ? -1 : (i * 613) % V;
            static uint16_t wb[D * V];
            for (int i = 0; i < D * V; i++)
                wb[i] = lt_fp32_to_bf16(wv[i]);
            const float g07 = 0.7f;
            if (st == LT_OK)
                st = lt_tensor_set(w, t ? (void *)wb : (void *)wv, 0, lt_nbytes(w));
            if (st == LT_OK)
                st = lt_tensor_set(h, hv, 0, sizeof(hv));
            if (st == LT_OK)
                st = lt_tensor_set(y, yv, 0, sizeof(yv));
            if (st == LT_OK)
                st = lt_tensor_set(gl, &g07, 0, sizeof(g07));
            if (st == LT_OK)
                st = lt_sched_compute(s, g);
            const size_t n_grads = (size_t)(D * N + D * V);
            float *a = malloc(sizeof(float) * (n_grads + 1)), *b = malloc(sizeof(float) * n_grads);
            float l = NAN;
            if (st == LT_OK && a && b) {
                st = lt_tensor_get(fused, a, 0, sizeof(float) * (n_grads + 1));
                if (st == LT_OK)
                    st = lt_tensor_get(plain, b, 0, sizeof(float) * n_grads);
                if (st == LT_OK)
                    st = lt_tensor_get(loss, &l, 0, sizeof(l));
            }
            CHECK(st == LT_OK && a && b, "linear_ce fused loss on CUDA: %s", lt_last_error());
            if (st == LT_OK && a && b) {
                CHECK(a[n_grads] == l && l > 0,
                      "LINEAR_CE_BACK's loss %.9g, LINEAR_CE's %.9g (%s head, chunk %d)",
                      (double)a[n_grads], (double)l, lt_type_name(wt), chunk_tokens[chunk]);
                CHECK(!memcmp(a, b, sizeof(float) * n_grads),
                      "LINEAR_CE_BACK's dh and dw with the loss differ from without (%s head)",
                      lt_type_name(wt));
                printf("linear_ce on CUDA, %s head, chunk %d: the backward's loss %.7f is "
                       "LINEAR_CE's\n",
                       lt_type_name(wt), chunk_tokens[chunk], (double)l);
            }
            free(a);
            free(b);
            lt_sched_free(s);
            lt_ctx_free(ctx);
        }
}

static struct lt_tensor *b_optim(struct build *b, const struct params *p)
{
    static const float adamw_hp[8] = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.271f, 0.002997f, 0.5f};
    static const float sgd_hp[3] = {0.1f, 0.01f, 0.5f};
    /* i[1]: the row length: 33 (the scalar kernel), or a multiple of 4 (the float4 one) */
    const int64_t n0 = p->i[1] ? p->i[1] : 33;
    struct lt_tensor *w = mk(b, LT_TYPE_F32, L_CONTIG, n0, 7, 1, 1, FILL_UNIFORM, -1, 1);
    struct lt_tensor *g = mk(b, LT_TYPE_F32, L_CONTIG, n0, 7, 1, 1, FILL_UNIFORM, -1, 1);
    b->extra[b->n_extra++] = g;
    if (p->i[0] == LT_OP_SGD)
        return lt_sgd_step(b->ctx, w, g, mk_values(b, 3, sgd_hp));
    struct lt_tensor *m = mk(b, LT_TYPE_F32, L_CONTIG, n0, 7, 1, 1, FILL_UNIFORM, -0.1f, 0.1f);
    struct lt_tensor *v = mk(b, LT_TYPE_F32, L_CONTIG, n0, 7, 1, 1, FILL_UNIFORM, 0, 0.01f);
    b->extra[b->n_extra++] = m;
    b->extra[b->n_extra++] = v;
    return lt_adamw_step(b->ctx, w, g, m, v, mk_values(b, 8, adamw_hp));
}

static void test_recurrent_loss_optim(void)
{
    struct params p;
    static const enum lt_type wt[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16};
    for (int back = 0; back < 2; back++)
        for (int l = 0; l < L_COUNT; l++)
            for (int t = 0; t < 3; t++) {
                if (t && l != L_CONTIG)
                    continue;
                p = P(l, t ? L_CONTIG : (l + 1) % L_COUNT, LT_TYPE_F32, wt[t]);
                p.lay[2] = (l + 2) % L_COUNT;
                p.i[0] = back;
                run_case(back ? LT_OP_SSM_CONV_BACK : LT_OP_SSM_CONV,
                         lbl(layout_names[l], t ? lt_type_name(wt[t]) : ""), TOL_F32, b_ssm_conv, &p);
            }
    /* several tiles of 32 steps and of 32 (forward) / 64 (backward) channels, tails in both */
    for (int back = 0; back < 2; back++)
        for (int l = 0; l < L_COUNT; l++) {
            p = P(l, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
            p.lay[2] = (l + 2) % L_COUNT;
            p.i[0] = back;
            p.ne[0] = 73, p.ne[1] = 77, p.ne[2] = 3;
            run_case(back ? LT_OP_SSM_CONV_BACK : LT_OP_SSM_CONV, lbl(layout_names[l], "tiles"),
                     TOL_F32, b_ssm_conv, &p);
        }
    /* CONV_SILU and its backward: every layout of x (the forward takes x whose channels are
     * unit-strided at any row strides, sliced and broadcast rows too, the backward
     * contiguous x and gradient; the others are its honest no), weight types; shapes with
     * tails of the
     * 256-channel blocks and 32-step walks, fewer steps than taps, 1 and 8 taps */
    static const int64_t cs_shapes[][4] = {
        {10, 9, 2, 4}, {300, 70, 3, 4}, {33, 2, 2, 4}, {64, 65, 1, 1}, {40, 33, 2, 8}};
    for (int back = 0; back < 2; back++) {
        for (int l = 0; l < L_COUNT; l++)
            for (int t = 0; t < 3; t++) {
                if (t && l != L_CONTIG)
                    continue;
                p = P(l, t ? L_CONTIG : (l + 1) % L_COUNT, LT_TYPE_F32, wt[t]);
                p.lay[2] = l == L_CONTIG ? L_CONTIG : (l + 2) % L_COUNT;
                p.i[0] = back, p.i[1] = 4;
                p.ne[0] = 10, p.ne[1] = 9, p.ne[2] = 2;
                run_case(back ? LT_OP_CONV_SILU_BACK : LT_OP_CONV_SILU,
                         lbl(layout_names[l], t ? lt_type_name(wt[t]) : ""), TOL_F32, b_conv_silu,
                         &p);
            }
        for (size_t k = 0; k < sizeof(cs_shapes) / sizeof(cs_shapes[0]); k++) {
            p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_BF16);
            p.lay[2] = L_CONTIG;
            p.i[0] = back, p.i[1] = (int)cs_shapes[k][3];
            p.ne[0] = cs_shapes[k][0], p.ne[1] = cs_shapes[k][1], p.ne[2] = cs_shapes[k][2];
            char what[48];
            snprintf(what, sizeof(what), "C%lld T%lld S%lld K%d", (long long)p.ne[0],
                     (long long)p.ne[1], (long long)p.ne[2], p.i[1]);
            run_case(back ? LT_OP_CONV_SILU_BACK : LT_OP_CONV_SILU, what, TOL_F32, b_conv_silu, &p);
            /* the same rows as packed examples (positions restarting) */
            p.i[2] = 1;
            snprintf(what, sizeof(what), "C%lld T%lld S%lld K%d packed", (long long)p.ne[0],
                     (long long)p.ne[1], (long long)p.ne[2], p.i[1]);
            run_case(back ? LT_OP_CONV_SILU_BACK : LT_OP_CONV_SILU, what, TOL_F32, b_conv_silu, &p);
        }
        /* x in BF16 (a training step's q, k and v products store BF16): contiguous, and a
         * sliced view of whole elements (the forward's rows at strides; the backward refuses
         * it: it reads x contiguous), packed; the same values on both sides */
        for (int l = 0; l < 2; l++) {
            p = P(l ? L_SLICED : L_CONTIG, L_CONTIG, LT_TYPE_BF16, LT_TYPE_BF16);
            p.lay[2] = L_CONTIG;
            p.i[0] = back, p.i[1] = 4, p.i[2] = l;
            p.ne[0] = 40, p.ne[1] = 33, p.ne[2] = 2;
            run_case(back ? LT_OP_CONV_SILU_BACK : LT_OP_CONV_SILU,
                     lbl(layout_names[p.lay[0]], "bf16 x"), TOL_F32, b_conv_silu, &p);
        }
    }
    /* the backward's d x in BF16 (a training step's q, k, v products): F32 and BF16 x, an
     * even and an odd count of d x (d w then starts past a pad), packed or not */
    static const int64_t cs_half[][4] = {{40, 33, 2, 4}, {11, 9, 1, 4}, {300, 70, 3, 4}};
    for (size_t k = 0; k < sizeof(cs_half) / sizeof(cs_half[0]); k++) {
        p = P(L_CONTIG, L_CONTIG, k == 1 ? LT_TYPE_F32 : LT_TYPE_BF16, LT_TYPE_F32);
        p.lay[2] = L_CONTIG;
        p.type[2] = LT_TYPE_BF16;
        p.i[0] = 1, p.i[1] = (int)cs_half[k][3], p.i[2] = k != 1;
        p.ne[0] = cs_half[k][0], p.ne[1] = cs_half[k][1], p.ne[2] = cs_half[k][2];
        char what[64];
        snprintf(what, sizeof(what), "bf16 d x, C%lld T%lld S%lld%s", (long long)p.ne[0],
                 (long long)p.ne[1], (long long)p.ne[2], p.i[2] ? " packed" : "");
        run_case(LT_OP_CONV_SILU_BACK, what, TOL_F32, b_conv_silu, &p);
    }
    /* the forward: CHUNKED runs the chunk-parallel kernels (delta_net_wy.cu; the CPU its
     * chunked path), RECURRENT the per-token kernel (the CPU its recurrence), and CHUNKED
     * under LATHE_DN_FWD=v1 the chunked kernel of delta_net_chunk.cu ("v1"). The longer
     * shapes contiguous only */
    const char *dn_fwd_env = getenv("LATHE_DN_FWD");
    char dn_fwd_saved[32] = "";
    if (dn_fwd_env)
        snprintf(dn_fwd_saved, sizeof(dn_fwd_saved), "%s", dn_fwd_env);
    static const int64_t dims[][4] = {{16, 12, 5, 2},   {16, 12, 1, 2},   {128, 128, 40, 1},
                                      {16, 12, 63, 2},  {16, 12, 65, 2},  {20, 40, 150, 2},
                                      {128, 128, 150, 2}, {16, 12, 2048, 1}};
    static const int heads[][2] = {{2, 4}, {1, 3}, {2, 4}, {2, 4}, {2, 4}, {1, 2}, {2, 4}, {1, 2}};
    for (int d = 0; d < 8; d++)
        for (int l = 0; l < L_COUNT; l++)
            for (int path = 0; path < 3; path++) {
                if (d >= 2 && l != L_CONTIG)
                    continue;
                p = P(l, (l + 1) % L_COUNT, LT_TYPE_F32, LT_TYPE_F32);
                memcpy(p.ne, dims[d], sizeof(p.ne));
                p.i[0] = heads[d][0], p.i[1] = heads[d][1];
                p.i[2] = path == 1 ? LT_DELTA_NET_PATH_RECURRENT : LT_DELTA_NET_PATH_CHUNKED;
                static const char *const fwd_names[] = {"chunked", "recur", "v1"};
                char what[48];
                snprintf(what, sizeof(what), "%lldx%lld T%lld B%lld %s", (long long)dims[d][0],
                         (long long)dims[d][1], (long long)dims[d][2], (long long)dims[d][3],
                         fwd_names[path]);
                if (path == 2)
                    setenv("LATHE_DN_FWD", "v1", 1);
                run_case(LT_OP_DELTA_NET, lbl(layout_names[l], what), TOL_F32, b_delta_net, &p);
                if (path == 2) {
                    if (dn_fwd_env)
                        setenv("LATHE_DN_FWD", dn_fwd_saved, 1);
                    else
                        unsetenv("LATHE_DN_FWD");
                }
            }
    /* the forward as models build it (AUTO): the chunk-parallel kernels where
     * cu_dn_wy_fwd_auto says so (T >= 64), the per-token kernel elsewhere; around one chunk, two
     * chunks and a long tail, two sequences packed side by side, grouped heads (H_v = 2 H_k), with
     * an initial state and without (zeros). Both S 16 x 12 (padded) and S 128 x 128, with 64 value
     * heads, go by chunks from T 64; then Qwen3.5-0.8B's training shape (16 x 512 tokens, 16 heads
     * of 128) */
    static const int64_t auto_t[] = {1, 63, 64, 65, 150, 512};
    static const int64_t auto_s[][3] = {{16, 12, 32}, {128, 128, 32}}; /* S_k, S_v, H_k */
    for (int si = 0; si < 2; si++)
        for (int ti = 0; ti < 6; ti++)
            for (int zero = 0; zero < 2; zero++) {
                p = P(L_CONTIG, L_TRANSPOSED, LT_TYPE_F32, LT_TYPE_F32);
                const int64_t ne[4] = {auto_s[si][0], auto_s[si][1], auto_t[ti], 2};
                memcpy(p.ne, ne, sizeof(p.ne));
                p.i[0] = (int)auto_s[si][2], p.i[1] = 2 * (int)auto_s[si][2];
                p.i[2] = LT_DELTA_NET_PATH_AUTO;
                p.f[0] = (float)zero;
                char what[64];
                snprintf(what, sizeof(what), "%lldx%lld H%d/%d T%lld B2 auto%s", (long long)ne[0],
                         (long long)ne[1], p.i[0], p.i[1], (long long)ne[2],
                         zero ? " no-state" : "");
                run_case(LT_OP_DELTA_NET, lbl(layout_names[L_CONTIG], what), TOL_F32, b_delta_net,
                         &p);
            }
    /* Qwen3.5-0.8B's heads by chunks: its training shape, and a one-sequence prefill (the
     * state walk at 64 columns, 32 blocks) with a tail, q and v sliced views */
    static const struct {
        int64_t t, b;
        int lay;
    } qshapes[] = {{512, 16, L_CONTIG}, {150, 1, L_SLICED}};
    for (int qi = 0; qi < 2; qi++)
        for (int zero = 0; zero < 2; zero++) {
            p = P(qshapes[qi].lay, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
            const int64_t ne[4] = {128, 128, qshapes[qi].t, qshapes[qi].b};
            memcpy(p.ne, ne, sizeof(p.ne));
            p.i[0] = 16, p.i[1] = 16, p.i[2] = LT_DELTA_NET_PATH_AUTO;
            p.f[0] = (float)zero;
            char what[64];
            snprintf(what, sizeof(what), "128x128 H16/16 T%lld B%lld auto%s", (long long)ne[2],
                     (long long)ne[3], zero ? " no-state" : "");
            run_case(LT_OP_DELTA_NET, lbl(layout_names[qshapes[qi].lay], what), TOL_F32,
                     b_delta_net, &p);
        }
    /* the backward: the chunk-parallel kernels (AUTO; LATHE_DN_BACK=v1 for the chunked
     * one) around the chunk size of 64, two sequences packed side by side, and a long one;
     * grouped heads (H_v = 2 H_k or 3 H_k: partials and the reduction) and H_v = H_k (dq,
     * dk written directly), Qwen3.5-0.8B's training shape (16 x 512 tokens, 16 heads of
     * 128), and the kernels compiled for its widths (delta_net_wy.cu's FIX) on a tail and
     * grouped heads (128 value heads of 128 in all); the per-token kernel (RECURRENT) on the first
     * three. The CPU runs its recurrent oracle for all. */
    static const int64_t bdims[][4] = {{16, 12, 5, 2},      {16, 12, 1, 2},     {128, 128, 40, 1},
                                       {16, 12, 63, 2},     {16, 12, 64, 2},    {16, 12, 65, 2},
                                       {20, 40, 150, 2},    {128, 128, 150, 2}, {16, 12, 2048, 1},
                                       {16, 12, 130, 2},    {128, 128, 150, 2}, {128, 128, 200, 3},
                                       {128, 128, 512, 16}, {128, 128, 150, 4}};
    static const int bheads[][2] = {{2, 4}, {1, 3}, {2, 4}, {2, 4}, {2, 4}, {2, 4},   {1, 2},
                                    {2, 4}, {1, 2}, {2, 2}, {4, 4}, {4, 8}, {16, 16}, {16, 32}};
    /* path 2: AUTO again with LATHE_DN_BACK=v1, the chunked kernel the chunk-parallel ones
     * replaced (the shapes it had before these cases were added) */
    const char *dn_back_env = getenv("LATHE_DN_BACK");
    char dn_back_saved[32] = "";
    if (dn_back_env)
        snprintf(dn_back_saved, sizeof(dn_back_saved), "%s", dn_back_env);
    for (int d = 0; d < (int)(sizeof(bdims) / sizeof(bdims[0])); d++)
        for (int l = 0; l < L_COUNT; l++)
            for (int path = 0; path < 3; path++) {
                if ((d >= 2 && l != L_CONTIG) || (path == 1 && d >= 3) || (path == 2 && d >= 9))
                    continue;
                p = P(l, (l + 1) % L_COUNT, LT_TYPE_F32, LT_TYPE_F32);
                memcpy(p.ne, bdims[d], sizeof(p.ne));
                p.i[0] = bheads[d][0], p.i[1] = bheads[d][1], p.i[3] = 1;
                p.i[2] = path == 1 ? LT_DELTA_NET_PATH_RECURRENT : LT_DELTA_NET_PATH_AUTO;
                static const char *const path_names[] = {"chunk-par", "token", "v1"};
                char what[48];
                snprintf(what, sizeof(what), "%lldx%lld H%d/%d T%lld B%lld %s",
                         (long long)bdims[d][0], (long long)bdims[d][1], bheads[d][0],
                         bheads[d][1], (long long)bdims[d][2], (long long)bdims[d][3],
                         path_names[path]);
                if (path == 2)
                    setenv("LATHE_DN_BACK", "v1", 1);
                run_case(LT_OP_DELTA_NET_BACK, lbl(layout_names[l], what), TOL_F32, b_delta_net,
                         &p);
                if (path == 2) {
                    if (dn_back_env)
                        setenv("LATHE_DN_BACK", dn_back_saved, 1);
                    else
                        unsetenv("LATHE_DN_BACK");
                }
            }
    /* the backward of the output's gradient alone (a training step's: the final state's
     * gradient zero, its rows absent): the chunk-parallel kernels at F32, TF32 and BF16 (0.8B's
     * heads), the per-token kernel and LATHE_DN_BACK=v1's chunked one */
    static const struct {
        int64_t ne[4];
        int hk, hv, path; /* path: 0 chunk-parallel, 1 per token, 2 v1 */
        float prec;
    } odims[] = {{{16, 12, 65, 2}, 2, 4, 0, 0.0f},   {{16, 12, 65, 2}, 2, 4, 0, 1.0f},
                 {{128, 128, 150, 2}, 2, 4, 0, 2.0f}, {{16, 12, 5, 2}, 2, 4, 1, 0.0f},
                 {{16, 12, 65, 2}, 2, 4, 2, 0.0f}};
    for (int d = 0; d < (int)(sizeof(odims) / sizeof(odims[0])); d++) {
        p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
        memcpy(p.ne, odims[d].ne, sizeof(p.ne));
        p.i[0] = odims[d].hk, p.i[1] = odims[d].hv, p.i[3] = 1;
        p.i[2] = odims[d].path == 1 ? LT_DELTA_NET_PATH_RECURRENT : LT_DELTA_NET_PATH_AUTO;
        p.f[1] = odims[d].prec, p.f[3] = 1.0f;
        static const char *const opath[] = {"chunk-par", "token", "v1"};
        char what[64];
        snprintf(what, sizeof(what), "%lldx%lld H%d/%d T%lld B%lld %s%s output grad",
                 (long long)p.ne[0], (long long)p.ne[1], p.i[0], p.i[1], (long long)p.ne[2],
                 (long long)p.ne[3], opath[odims[d].path],
                 odims[d].prec == 2.0f   ? " bf16"
                 : odims[d].prec != 0.0f ? " tf32"
                                         : "");
        if (odims[d].path == 2)
            setenv("LATHE_DN_BACK", "v1", 1);
        run_case(LT_OP_DELTA_NET_BACK, lbl(layout_names[L_CONTIG], what),
                 odims[d].prec == 2.0f   ? TOL_DN_BF16
                 : odims[d].prec != 0.0f ? TOL_DN_TF32
                                         : TOL_F32,
                 b_delta_net, &p);
        if (odims[d].path == 2) {
            if (dn_back_env)
                setenv("LATHE_DN_BACK", dn_back_saved, 1);
            else
                unsetenv("LATHE_DN_BACK");
        }
    }
    /* LT_DELTA_NET_PREC_TF32 (training on a device): the chunk-parallel forward and backward
     * in one TF32 product instead of three, against the CPU's F32 under TOL_DN_TF32: tails,
     * packed sequences, grouped heads, an initial state and none, Qwen3.5-0.8B's shape, its
     * widths on a tail with grouped heads */
    static const int64_t tdims[][4] = {{16, 12, 65, 2},    {20, 40, 150, 2},    {128, 128, 150, 2},
                                       {128, 128, 200, 3}, {128, 128, 512, 16}, {128, 128, 150, 4}};
    static const int theads[][2] = {{2, 4}, {1, 2}, {2, 4}, {4, 8}, {16, 16}, {16, 32}};
    for (int back = 0; back < 2; back++)
        for (int d = 0; d < (int)(sizeof(tdims) / sizeof(tdims[0])); d++)
            for (int zero = 0; zero < 2; zero++) {
                p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
                memcpy(p.ne, tdims[d], sizeof(p.ne));
                p.i[0] = theads[d][0], p.i[1] = theads[d][1], p.i[3] = back;
                p.i[2] = back ? LT_DELTA_NET_PATH_AUTO : LT_DELTA_NET_PATH_CHUNKED;
                p.f[0] = (float)zero, p.f[1] = 1.0f;
                char what[64];
                snprintf(what, sizeof(what), "%lldx%lld H%d/%d T%lld B%lld tf32%s",
                         (long long)tdims[d][0], (long long)tdims[d][1], theads[d][0], theads[d][1],
                         (long long)tdims[d][2], (long long)tdims[d][3], zero ? " no-state" : "");
                run_case(back ? LT_OP_DELTA_NET_BACK : LT_OP_DELTA_NET,
                         lbl(layout_names[L_CONTIG], what), TOL_DN_TF32, b_delta_net, &p);
            }
    /* packed examples (training's padding-free packing): the gate reset of -30 inside chunks
     * (steps 40, 100 and 300) and an example of one step (300), forward (chunked and
     * per-token) and backward, at F32 and TF32, on 128 x 128 heads and on Qwen3.5-0.8B's
     * training shape */
    static const int64_t pdims[][4] = {{128, 128, 150, 2}, {128, 128, 512, 16}};
    static const int pheads[][2] = {{2, 4}, {16, 16}};
    for (int back = 0; back < 2; back++)
        for (int d = 0; d < 2; d++)
            for (int v = 0; v < 3; v++) { /* chunked F32, chunked TF32, per-token */
                if (back && v == 2)
                    continue;
                p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
                memcpy(p.ne, pdims[d], sizeof(p.ne));
                p.i[0] = pheads[d][0], p.i[1] = pheads[d][1], p.i[3] = back;
                p.i[2] = v == 2 ? LT_DELTA_NET_PATH_RECURRENT
                         : back ? LT_DELTA_NET_PATH_AUTO
                                : LT_DELTA_NET_PATH_CHUNKED;
                p.f[0] = 1.0f, p.f[1] = v == 1 ? 1.0f : 0.0f, p.f[2] = 1.0f;
                char what[64];
                snprintf(what, sizeof(what), "%lldx%lld H%d/%d T%lld B%lld %s reset",
                         (long long)pdims[d][0], (long long)pdims[d][1], pheads[d][0], pheads[d][1],
                         (long long)pdims[d][2], (long long)pdims[d][3],
                         v == 2 ? "token"
                         : v    ? "tf32"
                                : "chunked");
                run_case(back ? LT_OP_DELTA_NET_BACK : LT_OP_DELTA_NET,
                         lbl(layout_names[L_CONTIG], what), v == 1 ? TOL_DN_TF32 : TOL_F32,
                         b_delta_net, &p);
            }
    /* LT_DELTA_NET_PREC_BF16 (training on a device): the forward's and the backward's state
     * walks and the backward's grad kernel on BF16 tensor cores at Qwen3.5's widths (128 x
     * 128; the others run TF32), forward and backward against the CPU's F32 under
     * TOL_DN_BF16: a tail, grouped heads, an initial state and none, the 0.8B training
     * shape, packed examples */
    static const int64_t fdims[][4] = {{128, 128, 150, 2},
                                       {128, 128, 200, 3},
                                       {128, 128, 512, 16},
                                       {128, 128, 150, 4},
                                       {20, 40, 150, 2}};
    static const int fheads[][2] = {{2, 4}, {4, 8}, {16, 16}, {16, 32}, {1, 2}};
    for (int back = 0; back < 2; back++)
        for (int d = 0; d < (int)(sizeof(fdims) / sizeof(fdims[0])); d++)
            for (int v = 0; v < 3; v++) { /* zero state, a state, packed */
                p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
                memcpy(p.ne, fdims[d], sizeof(p.ne));
                p.i[0] = fheads[d][0], p.i[1] = fheads[d][1], p.i[3] = back;
                p.i[2] = back ? LT_DELTA_NET_PATH_AUTO : LT_DELTA_NET_PATH_CHUNKED;
                p.f[0] = v != 1 ? 1.0f : 0.0f, p.f[1] = 2.0f, p.f[2] = v == 2 ? 1.0f : 0.0f;
                char what[64];
                snprintf(what, sizeof(what), "%lldx%lld H%d/%d T%lld B%lld bf16%s",
                         (long long)fdims[d][0], (long long)fdims[d][1], fheads[d][0], fheads[d][1],
                         (long long)fdims[d][2], (long long)fdims[d][3],
                         v == 0   ? " no-state"
                         : v == 2 ? " reset"
                                  : "");
                run_case(back ? LT_OP_DELTA_NET_BACK : LT_OP_DELTA_NET,
                         lbl(layout_names[L_CONTIG], what), TOL_DN_BF16, b_delta_net, &p);
            }
    /* the BF16 walks of a head's 128 columns a block (LATHE_DN_WIDE=1, the default from 128
     * (sequence, head) pairs) against blocks of 64 (=0): the same bits, forward and backward,
     * with a state and packed examples */
    const char *only_op = getenv("LATHE_CONF_OP");
    if (!only_op || !*only_op || strcmp(only_op, "DELTA_NET") == 0 ||
        strcmp(only_op, "DELTA_NET_BACK") == 0) {
        const char *wide_env = getenv("LATHE_DN_WIDE");
        char wide_saved[8] = "";
        if (wide_env)
            snprintf(wide_saved, sizeof(wide_saved), "%s", wide_env);
        for (int back = 0; back < 2; back++)
            for (int v = 1; v < 3; v++) {
                p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
                memcpy(p.ne, fdims[0], sizeof(p.ne));
                p.i[0] = fheads[0][0], p.i[1] = fheads[0][1], p.i[3] = back;
                p.i[2] = back ? LT_DELTA_NET_PATH_AUTO : LT_DELTA_NET_PATH_CHUNKED;
                p.f[0] = 0.0f, p.f[1] = 2.0f, p.f[2] = v == 2 ? 1.0f : 0.0f;
                struct lt_backend *both[2] = {g_cuda, g_cpu};
                struct run_result r[2];
                for (int wide = 0; wide < 2; wide++) {
                    setenv("LATHE_DN_WIDE", wide ? "1" : "0", 1);
                    r[wide] =
                        run_on(both, 2, b_delta_net, &p, 0x71de0000u + back * 2 + v, NULL, NULL, 0);
                }
                CHECK(r[0].ok && r[1].ok && r[0].n_out == r[1].n_out &&
                          memcmp(r[0].out, r[1].out, sizeof(float) * (size_t)r[0].n_out) == 0,
                      "%s bf16 %s: the walks of 128 columns differ from those of 64",
                      back ? "DELTA_NET_BACK" : "DELTA_NET", v == 2 ? "packed" : "with a state");
                run_result_free(&r[0]);
                run_result_free(&r[1]);
            }
        if (wide_env)
            setenv("LATHE_DN_WIDE", wide_saved, 1);
        else
            unsetenv("LATHE_DN_WIDE");
    }
    /* the same with q and v sliced, k transposed: rows the BF16 prep cannot copy four floats
     * at a time (its element-wise fill) */
    for (int back = 0; back < 2; back++) {
        p = P(L_SLICED, L_TRANSPOSED, LT_TYPE_F32, LT_TYPE_F32);
        memcpy(p.ne, fdims[0], sizeof(p.ne));
        p.i[0] = fheads[0][0], p.i[1] = fheads[0][1], p.i[3] = back;
        p.i[2] = back ? LT_DELTA_NET_PATH_AUTO : LT_DELTA_NET_PATH_CHUNKED;
        p.f[0] = 0.0f, p.f[1] = 2.0f;
        run_case(back ? LT_OP_DELTA_NET_BACK : LT_OP_DELTA_NET,
                 lbl(layout_names[L_SLICED], "128x128 H2/4 T150 B2 bf16"), TOL_DN_BF16, b_delta_net,
                 &p);
    }

    /* GDN_DECODE (one decode token, conv to gated norm): S in {1, 3}, H_k in {1, 2} with
     * H_v = 2 H_k, S_k = S_v in {16, 128}, contiguous, with the states as the sequences' own
     * or as caches read at seq_ids and written in place; the small shape over the layouts
     * (in place: the conv cache in each, the ssm cache sliced, as its dim 0 must be
     * adjacent); ids outside the caches; S_k = S_v = 100 (a ragged last block of columns);
     * the conv weight in F16 and BF16 */
    for (int cache = 0; cache < 2; cache++)
        for (int big = 0; big < 2; big++)
            for (int ns = 1; ns <= 3; ns += 2)
                for (int hk = 1; hk <= 2; hk++) {
                    p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
                    p.ne[0] = big ? 128 : 16, p.ne[1] = ns, p.i[0] = hk, p.i[1] = cache;
                    char what[40];
                    snprintf(what, sizeof(what), "%lld S%d Hk%d%s", (long long)p.ne[0], ns, hk,
                             cache ? " cache" : "");
                    run_case(LT_OP_GDN_DECODE, lbl("contig", what), TOL_F32, b_gdn_decode, &p);
                }
    /* S_k = S_v = 128 (CUDA's whole-head kernel) with H_v = H_k: each key head's conv state
     * read by one block, which writes it in place */
    for (int cache = 0; cache < 3; cache++)
        for (int ns = cache == 2 ? 3 : 1; ns <= 3; ns += 2) { /* S 1 outside: all zeros */
            p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
            p.ne[0] = 128, p.ne[1] = ns, p.i[0] = 3, p.i[1] = cache, p.i[2] = 1;
            char what[48];
            snprintf(what, sizeof(what), "128 S%d Hv=Hk 3%s", ns,
                     cache == 1   ? " cache"
                     : cache == 2 ? " ids outside"
                                  : "");
            run_case(LT_OP_GDN_DECODE, lbl("contig", what), TOL_F32, b_gdn_decode, &p);
        }
    for (int l = 1; l < L_COUNT; l++) {
        p = P(l, L_SLICED, LT_TYPE_F32, LT_TYPE_F32);
        p.ne[0] = 16, p.ne[1] = 3, p.i[0] = 2, p.i[1] = 1;
        run_case(LT_OP_GDN_DECODE, lbl(layout_names[l], "cache"), TOL_F32, b_gdn_decode, &p);
    }
    p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
    p.ne[0] = 16, p.ne[1] = 3, p.i[0] = 2, p.i[1] = 2;
    run_case(LT_OP_GDN_DECODE, "contig/cache ids outside", TOL_F32, b_gdn_decode, &p);
    /* S_v = 100: blocks of 13 columns, the last one of 9 */
    for (int cache = 0; cache < 3; cache++) {
        p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, LT_TYPE_F32);
        p.ne[0] = 100, p.ne[1] = cache ? 3 : 1, p.i[0] = 1, p.i[1] = cache;
        run_case(LT_OP_GDN_DECODE, cache == 0 ? "contig/100 S1" : cache == 1 ? "contig/100 cache" : "contig/100 ids outside", TOL_F32, b_gdn_decode, &p);
    }
    for (int l = 1; l < L_COUNT; l++) {
        p = P(l, (l + 1) % L_COUNT, LT_TYPE_F32, LT_TYPE_F32);
        p.ne[0] = 16, p.ne[1] = 3, p.i[0] = 2;
        run_case(LT_OP_GDN_DECODE, layout_names[l], TOL_F32, b_gdn_decode, &p);
    }
    for (int t = 1; t < 3; t++) {
        p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, wt[t]);
        p.ne[0] = 16, p.ne[1] = 3, p.i[0] = 2;
        run_case(LT_OP_GDN_DECODE, lbl("contig", lt_type_name(wt[t])), TOL_F32, b_gdn_decode, &p);
    }

    static const enum lt_type lce_types[] = {LT_TYPE_F32, LT_TYPE_BF16};
    /* the backward's part sets: dh and dw through the two-part constructor, then each set
     * the rule builds (a frozen head: dh; frozen hidden states: dw; with the loss when the
     * loss is autodiff's seed) */
    enum { DH = LT_LINEAR_CE_DH, DW = LT_LINEAR_CE_DW, LOSS = LT_LINEAR_CE_LOSS };
    static const int lce_parts[] = {0, DH, DW, DH | LOSS, DW | LOSS, DH | DW | LOSS};
    static const char *const lce_part_names[] = {"",         "/dh",      "/dw",
                                                 "/dh+loss", "/dw+loss", "/dh+dw+loss"};
    /* V 3000: the float4 column kernels; 3001 (not a multiple of 4): the element ones */
    for (int back = 0; back < 2; back++)
        for (int k = 0; k < (back ? 6 : 1); k++)
            for (int t = 0; t < 2; t++)
                for (int chunk = 0; chunk < 6; chunk++) {
                    /* 37 tokens in one chunk, in chunks of 10, or of 3: a BF16 head's
                     * backward takes its products a group of 4 chunks at a time, so one
                     * group of 4 chunks or 4 groups */
                    static const int chunk_tokens[] = {0, 10, 3};
                    p = P(L_CONTIG, L_CONTIG, LT_TYPE_F32, lce_types[t]);
                    p.ne[0] = chunk < 3 ? 3000 : 3001;
                    p.i[0] = back;
                    p.i[1] = chunk_tokens[chunk % 3];
                    p.i[2] = lce_parts[k];
                    char what[48];
                    snprintf(what, sizeof(what), "V%d%s/chunk%d%s", (int)p.ne[0], t ? "/bf16" : "",
                             p.i[1], lce_part_names[k]);
                    run_case(back ? LT_OP_LINEAR_CE_BACK : LT_OP_LINEAR_CE, what,
                             t ? TOL_HALF : TOL_F32, b_linear_ce, &p);
                }
    test_linear_ce_fused_loss();
    static const int ce_layouts[] = {L_CONTIG, L_TRANSPOSED, L_SLICED};
    for (int back = 0; back < 2; back++)
        for (int l = 0; l < 3; l++)
            for (int big = 0; big < 2; big++) {
                p = P(ce_layouts[l], 0, LT_TYPE_F32, LT_TYPE_F32);
                p.i[0] = back;
                p.ne[0] = big ? 3000 : 50;
                run_case(back ? LT_OP_CROSS_ENTROPY_BACK : LT_OP_CROSS_ENTROPY,
                         lbl(layout_names[ce_layouts[l]], big ? "V3000" : ""), TOL_F32,
                         b_cross_entropy, &p);
            }
    static const int widths[] = {0, 64, 150000};
    for (int k = 0; k < 3; k++) {
        p = P(L_CONTIG, 0, LT_TYPE_F32, LT_TYPE_F32);
        p.i[1] = widths[k];
        p.i[0] = LT_OP_ADAMW;
        run_case(LT_OP_ADAMW, lbl("contig", k == 0 ? "" : k == 1 ? "vec4" : "vec4 1M"), TOL_F32,
                 b_optim, &p);
        p.i[0] = LT_OP_SGD;
        run_case(LT_OP_SGD, lbl("contig", k == 0 ? "" : k == 1 ? "w64" : "1M"), TOL_F32, b_optim,
                 &p);
    }
}

/* ---- the backend itself ---- */

/* y = scale(add(sqr(x), x)) with SQR and ACC disabled: SQR runs on the CPU, the rest on
 * CUDA, and the result is the CPU's. */
static void test_disabled_ops(void)
{
    setenv("LATHE_CUDA_DISABLE_OPS", "SQR, acc", 1);
    struct lt_backend *gapped = lt_backend_cuda_new(0);
    unsetenv("LATHE_CUDA_DISABLE_OPS");
    CHECK(gapped != NULL, "a second CUDA backend: %s", lt_last_error());
    if (!gapped)
        return;
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *x = lt_new_tensor_2d(ctx, LT_TYPE_F32, 37, 5);
    struct lt_tensor *sq = lt_sqr(ctx, x), *sum = lt_add(ctx, sq, x), *y = lt_scale(ctx, sum, 2.0f);
    y->flags |= LT_FLAG_OUTPUT;
    char reason[160] = "";
    CHECK(!lt_backend_supports_op(gapped, sq, reason, sizeof(reason)), "SQR is disabled");
    CHECK(strcmp(reason, "disabled by LATHE_CUDA_DISABLE_OPS") == 0, "reason: '%s'", reason);
    CHECK(lt_backend_supports_op(gapped, sum, reason, sizeof(reason)), "ADD is not disabled");
    CHECK(lt_backend_supports_op(g_cuda, sq, reason, sizeof(reason)), "the plain backend runs SQR");
    struct lt_graph *g = lt_graph_new(ctx, 16);
    struct lt_backend *bes[2] = {gapped, g_cpu};
    struct lt_sched *s = lt_sched_new(bes, 2);
    CHECK(lt_graph_build(g, y) == LT_OK && lt_sched_place(s, g, false, NULL) == LT_OK, "place");
    for (int i = 0; i < g->n_nodes; i++) {
        int want = g->nodes[i] == sq ? 1 : 0;
        CHECK(lt_sched_node_backend(s, i) == want, "%s on backend %d",
              lt_op_name(g->nodes[i]->op), lt_sched_node_backend(s, i));
    }
    CHECK(lt_sched_n_fallback(s) == 1, "one fallback, not %d", lt_sched_n_fallback(s));
    lt_sched_print(s, stdout);
    float xs[37 * 5], got[37 * 5];
    for (int i = 0; i < 37 * 5; i++)
        xs[i] = (float)(i % 11) * 0.25f - 1.0f;
    lt_status st = lt_sched_alloc(s, g);
    if (st == LT_OK)
        st = lt_tensor_set(x, xs, 0, sizeof(xs));
    if (st == LT_OK)
        st = lt_sched_compute(s, g);
    if (st == LT_OK)
        st = lt_tensor_get(y, got, 0, sizeof(got));
    CHECK(st == LT_OK, "running the mixed graph: %s", lt_last_error());
    int bad = 0;
    for (int i = 0; i < 37 * 5 && st == LT_OK; i++)
        bad += got[i] != 2.0f * (xs[i] * xs[i] + xs[i]);
    CHECK(bad == 0, "%d values of the mixed graph differ from 2 (x^2 + x)", bad);
    /* compute refuses what the verdict refuses, with a status, not a crash */
    st = lt_backend_compute(gapped, &sq, 1);
    CHECK(st == LT_ERR_UNSUPPORTED, "computing a disabled op gave %s", lt_status_name(st));
    lt_sched_free(s);
    lt_ctx_free(ctx);
    lt_backend_free(gapped);
}

static void test_backend_errors(void)
{
    size_t free_b = 0, total_b = 0;
    CHECK(lt_backend_memory(g_cuda, &free_b, &total_b) == LT_OK && total_b > 0 && free_b <= total_b,
          "memory: %zu free of %zu", free_b, total_b);
    printf("%s: %.1f GiB free of %.1f GiB\n", g_cuda->name, free_b / 1073741824.0,
           total_b / 1073741824.0);
    struct lt_buffer *buf = NULL;
    lt_status st = lt_backend_buffer_alloc(g_cuda, (size_t)1 << 50, &buf);
    CHECK(st == LT_ERR_NOMEM, "a 1 PiB buffer gave %s", lt_status_name(st));
    CHECK(strstr(lt_last_error(), "does not fit") != NULL,
          "a 1 PiB buffer is refused before cudaMalloc: %s", lt_last_error());
    printf("refused as expected: %s\n", lt_last_error());
    st = lt_backend_buffer_alloc(g_cuda, 1 << 20, &buf);
    CHECK(st == LT_OK, "a 1 MiB buffer after a failed one: %s", lt_last_error());
    if (st == LT_OK)
        lt_buffer_free(buf);
    CHECK(lt_backend_is_cuda(g_cuda) && !lt_backend_is_cuda(g_cpu), "lt_backend_is_cuda");
    CHECK(strcmp(g_cuda->name, "CUDA0") == 0, "name %s", g_cuda->name);
}

/* Arguments, when given, name the groups to run (errors copies matmul elementwise nn
 * recurrent disabled), so that a failing group can be run alone. */
static bool want(int argc, char **argv, const char *group)
{
    if (argc < 2)
        return true;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], group) == 0)
            return true;
    return false;
}

int main(int argc, char **argv)
{
    /* a node asking its family for more scratch than the family told admission fails */
    setenv("LATHE_CUDA_CHECK_SCRATCH", "1", 0);
    g_cuda = lt_backend_cuda_new(0);
    if (!g_cuda) {
        printf("skipped: no CUDA backend (%s)\n", lt_last_error());
        return 77;
    }
    g_cpu = lt_backend_cpu_new(4);
    if (!g_cpu) {
        fprintf(stderr, "no CPU backend: %s\n", lt_last_error());
        return 1;
    }
    if (want(argc, argv, "errors"))
        test_backend_errors();
    if (want(argc, argv, "copies"))
        test_copies();
    if (want(argc, argv, "matmul"))
        test_matmul();
    if (want(argc, argv, "elementwise"))
        test_elementwise();
    if (want(argc, argv, "nn"))
        test_nn();
    if (want(argc, argv, "recurrent"))
        test_recurrent_loss_optim();
    if (want(argc, argv, "disabled"))
        test_disabled_ops();
    print_table();
    printf("MUL_MAT with F32 weights: worst normalised error %.3g (limit %.0e; TF32 would be "
           "~1e-7)\n",
           mm_f32_worst, TOL_MM_F32);
    lt_backend_free(g_cpu);
    lt_backend_free(g_cuda);
    return check_summary();
}
