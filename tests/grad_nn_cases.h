/* grad_nn_cases.h: the finite-difference cases of mul_mat (matmul.c), rms_norm and
 * l2_norm (norm.c, with the viewed k_conv of Qwen3.5), rope (rope.c), soft_max
 * (softmax.c), cross_entropy (loss.c), a language-model head and a GQA attention block,
 * every trainable source contiguous, transposed, permuted and sliced. Each is a gradcheck
 * (gradcheck.h) and a check of its backward graph: every node one the CPU accepts, and the
 * kernels of the _BACK ops handed contiguous sources. test_grad_nn.c runs them on the CPU,
 * test_grad_sched.c and gpu/test_cuda_gradcheck.c through the scheduler. */
#ifndef LATHE_TESTS_GRAD_NN_CASES_H
#define LATHE_TESTS_GRAD_NN_CASES_H

#include <string.h>

#include "check.h"
#include "gradcheck.h"
#include "ops/op.h"

#define TOL 1e-2

/* The backward ops whose kernels read forward values: their sources must be contiguous. */
static bool reads_contiguous_only(enum lt_op op)
{
    return op == LT_OP_RMS_NORM_BACK || op == LT_OP_L2_NORM_BACK || op == LT_OP_ROPE_BACK ||
           op == LT_OP_SOFT_MAX_BACK || op == LT_OP_CROSS_ENTROPY_BACK || op == LT_OP_SQR;
    /* FLASH_ATTN_BACK reads any strides (its kernels take q, k, v, o and do as they are) */
}

static void nn_check_case(const char *name, gc_build_fn build, void *user,
                          const struct gc_input *in, int n_in)
{
    gradcheck(name, build, user, in, n_in, TOL);
    CHECK(gc_check_backward_graph(name, build, user, in, n_in, reads_contiguous_only, LT_OP_NONE,
                                  NULL) > 0,
          "%s: no backward nodes", name);
}

static struct gc_input f32_in(int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3,
                              enum gc_layout layout, bool trainable, float lo, float hi)
{
    return (struct gc_input){LT_TYPE_F32, {ne0, ne1, ne2, ne3}, layout, trainable, lo, hi};
}

/* ---- mul_mat ---- */

static struct lt_tensor *build_mul_mat(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_mul_mat(ctx, x[0], x[1]);
}

/* a [K, M, A2, A3] and b [K, N, B2, B3] over every pair of layouts, both trainable, then
 * each alone (both contiguous, both transposed) */
static void mul_mat_layouts(const char *what, int64_t K, int64_t M, int64_t N, const int64_t a23[2],
                            const int64_t b23[2])
{
    for (int la = 0; la < GC_LAYOUT_COUNT; la++)
        for (int lb = 0; lb < GC_LAYOUT_COUNT; lb++) {
            struct gc_input in[2] = {
                f32_in(K, M, a23[0], a23[1], la, true, -1, 1),
                f32_in(K, N, b23[0], b23[1], lb, true, -1, 1),
            };
            char name[128];
            snprintf(name, sizeof(name), "mul_mat %s, a %s, b %s", what, gc_layout_names[la],
                     gc_layout_names[lb]);
            nn_check_case(name, build_mul_mat, NULL, in, 2);
            if (la != lb || la > GC_TRANSPOSED)
                continue;
            for (int only = 0; only < 2; only++) {
                in[0].trainable = only == 0;
                in[1].trainable = only == 1;
                snprintf(name, sizeof(name), "mul_mat %s, %s, only %s trainable", what,
                         gc_layout_names[la], only == 0 ? "a" : "b");
                nn_check_case(name, build_mul_mat, NULL, in, 2);
            }
        }
}

static void test_mul_mat(void)
{
    mul_mat_layouts("[6,5] x [6,4]", 6, 5, 4, (int64_t[]){1, 1}, (int64_t[]){1, 1});
    mul_mat_layouts("K=37", 37, 5, 3, (int64_t[]){1, 1}, (int64_t[]){1, 1});
    mul_mat_layouts("K=37 heads", 37, 3, 2, (int64_t[]){2, 1}, (int64_t[]){4, 1});
    /* grouped heads: b heads 2h and 2h+1 share a head h */
    mul_mat_layouts("a [6,5,2,1] b [6,4,4,1]", 6, 5, 4, (int64_t[]){2, 1}, (int64_t[]){4, 1});
    /* both dims grouped (r2 = 2, r3 = 3), a with several heads in each */
    mul_mat_layouts("a [4,3,2,2] b [4,2,4,6]", 4, 3, 2, (int64_t[]){2, 2}, (int64_t[]){4, 6});
    /* one a head under every b head (the folded path of the kernel) */
    mul_mat_layouts("a [6,5,1,1] b [6,3,3,2]", 6, 5, 3, (int64_t[]){1, 1}, (int64_t[]){3, 2});
    /* a matrix-vector product (N = 1) and a single output row (M = 1) */
    mul_mat_layouts("N=1", 8, 5, 1, (int64_t[]){1, 1}, (int64_t[]){1, 1});
    mul_mat_layouts("M=1", 8, 1, 3, (int64_t[]){1, 1}, (int64_t[]){1, 1});
}

/* c + a b written over c (MUL_MAT_ACC): c is a fresh node made from x[2] (the op writes
 * over its c, which a leaf evaluated again and again must not be) */
static struct lt_tensor *build_mul_mat_acc(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    struct lt_tensor *c = lt_scale(ctx, x[2], 1.0f);
    return c ? lt_mul_mat_acc(ctx, x[0], x[1], c) : NULL;
}

static void test_mul_mat_acc(void)
{
    for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
        struct gc_input in[3] = {f32_in(6, 5, 1, 1, l, true, -1, 1),
                                 f32_in(6, 4, 1, 1, GC_CONTIGUOUS, true, -1, 1),
                                 f32_in(5, 4, 1, 1, GC_CONTIGUOUS, true, -1, 1)};
        char name[64];
        snprintf(name, sizeof(name), "mul_mat_acc, a %s", gc_layout_names[l]);
        nn_check_case(name, build_mul_mat_acc, NULL, in, 3);
    }
}

/* x^T x: one tensor as both operands, so both contributions accumulate */
static struct lt_tensor *build_gram(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_mul_mat(ctx, x[0], x[0]);
}

static void test_mul_mat_same_source(void)
{
    for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
        struct gc_input in = f32_in(6, 4, 2, 1, l, true, -1, 1);
        char name[64];
        snprintf(name, sizeof(name), "mul_mat(x, x), %s", gc_layout_names[l]);
        nn_check_case(name, build_gram, NULL, &in, 1);
    }
}

/* A frozen weight of another type: x[0] holds its F32 values ([K, M], or [M, K] stored
 * for the transposed view), converted into `type` by a CPY in the graph. */
struct typed_a {
    enum lt_type type;
    bool transposed; /* a is the transposed view of [M, K] storage */
    bool row_slice;  /* a is rows 1..M of [K, M + 1] storage */
};

static struct lt_tensor *build_mul_mat_typed(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const struct typed_a *t = user;
    struct lt_tensor *v = x[0];
    struct lt_tensor *w = lt_new_tensor_4d(ctx, t->type, v->ne[0], v->ne[1], v->ne[2], v->ne[3]);
    lt_set_name(w, "w");
    struct lt_tensor *a = lt_cpy(ctx, v, w);
    if (a && t->transposed)
        a = lt_transpose(ctx, a);
    if (a && t->row_slice)
        a = lt_view_4d(ctx, a, a->ne[0], a->ne[1] - 1, a->ne[2], a->ne[3], a->nb[1], a->nb[2],
                       a->nb[3], a->nb[1]);
    return a ? lt_mul_mat(ctx, a, x[1]) : NULL;
}

static void test_mul_mat_frozen_types(void)
{
    const struct {
        enum lt_type type;
        int64_t K;
    } types[] = {{LT_TYPE_F16, 6}, {LT_TYPE_BF16, 6}, {LT_TYPE_F16, 37}, {LT_TYPE_Q8_0, 64}};
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (int form = 0; form < 3; form++) {
            struct typed_a t = {types[ti].type, form == 1, form == 2};
            bool quant = lt_type_traits(t.type)->is_quantized;
            if (quant && t.transposed)
                continue; /* mul_mat cannot read split blocks, forward or back */
            int64_t K = types[ti].K, M = 5;
            int64_t a2 = ti == 0 ? 2 : 1, b2 = ti == 0 ? 4 : 1; /* grouped heads for F16 */
            for (int lb = 0; lb < GC_LAYOUT_COUNT; lb++) {
                struct gc_input in[2] = {
                    t.transposed ? f32_in(M, K, a2, 1, GC_CONTIGUOUS, false, -1, 1)
                                 : f32_in(K, M + t.row_slice, a2, 1, GC_CONTIGUOUS, false, -1, 1),
                    f32_in(K, 3, b2, 1, lb, true, -1, 1),
                };
                char name[128];
                snprintf(name, sizeof(name), "mul_mat, frozen %s a (K=%lld%s), b %s",
                         lt_type_name(t.type), (long long)K,
                         t.transposed  ? ", transposed"
                         : t.row_slice ? ", row slice"
                                       : "",
                         gc_layout_names[lb]);
                gradcheck(name, build_mul_mat_typed, &t, in, 2, TOL);
                int n_cpy = 0;
                CHECK(gc_check_backward_graph(name, build_mul_mat_typed, &t, in, 2,
                                              reads_contiguous_only, LT_OP_CPY, &n_cpy) > 0,
                      "%s: no backward nodes", name);
                /* only a quantised a is dequantised for the backward product */
                CHECK(n_cpy == (quant ? 1 : 0), "%s: %d CPY nodes in the backward graph", name,
                      n_cpy);
            }
        }
}
/* A product joined along its contraction, [a0 ; a1] x [b0 ; b1] (MUL_MAT's rule takes each
 * part's gradients as the part's own product would, never the joined operand's): a0 [5, 4]
 * and a1 [3, 4] against b0 [5, 6] and b1 [3, 6]; user: whether a0 is frozen (a LoRA
 * target's weight, joined with its adapter's B) */
static struct lt_tensor *build_joined_product(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_mul_mat(ctx, lt_concat(ctx, x[0], x[1], 0), lt_concat(ctx, x[2], x[3], 0));
}

static void test_joined_product(void)
{
    for (int frozen = 0; frozen < 2; frozen++) {
        struct gc_input in[4] = {{LT_TYPE_F32, {5, 4, 1, 1}, GC_CONTIGUOUS, !frozen, -1, 1},
                                 {LT_TYPE_F32, {3, 4, 1, 1}, GC_CONTIGUOUS, true, -1, 1},
                                 {LT_TYPE_F32, {5, 6, 1, 1}, GC_CONTIGUOUS, true, -1, 1},
                                 {LT_TYPE_F32, {3, 6, 1, 1}, GC_CONTIGUOUS, true, -1, 1}};
        nn_check_case(frozen ? "joined product, first weight part frozen" : "joined product",
                      build_joined_product, NULL, in, 4);
    }
}

/* ---- rms_norm, l2_norm ---- */

struct norm_case {
    bool l2;
    float eps;
};

static struct lt_tensor *build_norm(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const struct norm_case *c = user;
    return c->l2 ? lt_l2_norm(ctx, x[0], c->eps) : lt_rms_norm(ctx, x[0], c->eps);
}

static void test_norms(void)
{
    const struct norm_case cases[] = {{false, 1e-6f}, {false, 0.5f}, {true, 1e-6f}, {true, 0.5f}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            struct gc_input in = f32_in(8, 3, 2, 2, l, true, -2, 2);
            char name[96];
            snprintf(name, sizeof(name), "%s eps %g, %s", cases[i].l2 ? "l2_norm" : "rms_norm",
                     (double)cases[i].eps, gc_layout_names[l]);
            nn_check_case(name, build_norm, (void *)&cases[i], &in, 1);
        }
    /* ne0 = 1: the norm of a single element (a large eps, or the slope is ~0), and an odd
     * row length */
    for (int l2 = 0; l2 < 2; l2++)
        for (int64_t n = 1; n <= 7; n += 6) {
            struct norm_case c = {l2 != 0, n == 1 ? 0.5f : 1e-3f};
            struct gc_input in = f32_in(n, 4, 1, 1, GC_TRANSPOSED, true, 0.5f, 2);
            char name[96];
            snprintf(name, sizeof(name), "%s of rows of %lld", l2 ? "l2_norm" : "rms_norm",
                     (long long)n);
            nn_check_case(name, build_norm, &c, &in, 1);
        }
}

/* rms_norm(x) * w, and * silu(z) (Qwen3.5's gated norm), x, w and z all trainable: the fused
 * node's rule (one RMS_NORM_MUL_BACK, dw summed from its partial rows; parts of several rows
 * are test_ops_nn's and the conformance suite's). */
static struct lt_tensor *build_norm_mul(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const bool gated = *(const bool *)user;
    return gated ? lt_rms_norm_mul_gated(ctx, x[0], x[1], x[2], 1e-5f, LT_TYPE_F32)
                 : lt_rms_norm_mul(ctx, x[0], x[1], 1e-5f, LT_TYPE_F32);
}

static void test_norm_mul(void)
{
    for (int gi = 0; gi < 2; gi++) {
        bool gated = gi == 1;
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            struct gc_input in[3] = {f32_in(8, 3, 2, 2, l, true, -2, 2),
                                     f32_in(8, 1, 1, 1, GC_CONTIGUOUS, true, -1.5f, 1.5f),
                                     f32_in(8, 3, 2, 2, (l + 1) % GC_LAYOUT_COUNT, true, -3, 3)};
            char name[96];
            snprintf(name, sizeof(name), "rms_norm_mul%s, x %s", gated ? "_gated" : "",
                     gc_layout_names[l]);
            nn_check_case(name, build_norm_mul, &gated, in, gated ? 3 : 2);
        }
    }
}

/* A residual block over the weighted norm: x + rms_norm(x) * w * v (v a trainable
 * [8, 3, 2, 2], the norm's reader), x and w trainable. The residual sum hands its gradient to
 * x before the norm's rule runs, which then adds it inside its RMS_NORM_MUL_BACK
 * (lt_rms_norm_mul_back_add): no ADD node sums x's two gradients. */
static struct lt_tensor *build_norm_residual(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    struct lt_tensor *nx = lt_rms_norm_mul(ctx, x[0], x[1], 1e-5f, LT_TYPE_F32);
    return lt_add(ctx, x[0], lt_mul(ctx, nx, x[2]));
}

static void test_norm_residual(void)
{
    for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
        struct gc_input in[3] = {f32_in(8, 3, 2, 2, l, true, -2, 2),
                                 f32_in(8, 1, 1, 1, GC_CONTIGUOUS, true, -1.5f, 1.5f),
                                 f32_in(8, 3, 2, 2, GC_CONTIGUOUS, true, -1, 1)};
        char name[96];
        snprintf(name, sizeof(name), "x + rms_norm_mul(x) * v, x %s", gc_layout_names[l]);
        nn_check_case(name, build_norm_residual, NULL, in, 3);
        int n_add = -1, n_back = -1;
        CHECK(gc_check_backward_graph(name, build_norm_residual, NULL, in, 3, reads_contiguous_only,
                                      LT_OP_ADD, &n_add) > 0 &&
                  gc_check_backward_graph(name, build_norm_residual, NULL, in, 3,
                                          reads_contiguous_only, LT_OP_RMS_NORM_MUL_BACK,
                                          &n_back) > 0,
              "%s: backward graph", name);
        CHECK(n_add == 0 && n_back == 1, "%s: %d ADD and %d RMS_NORM_MUL_BACK nodes backward", name,
              n_add, n_back);
    }
}

/* Qwen3.5's Gated DeltaNet: q, k and v are channel slices of one conv output [3 * 8, T];
 * k_conv [4, 2, T] (head_dim 4, 2 heads) is the middle third, a non-contiguous view whose
 * l2 norm is trained through. */
static struct lt_tensor *k_conv_of(struct lt_ctx *ctx, struct lt_tensor *conv)
{
    struct lt_tensor *k_conv =
        lt_view_3d(ctx, conv, 4, 2, conv->ne[1], 4 * sizeof(float), conv->nb[1], 8 * sizeof(float));
    return k_conv ? lt_set_name(k_conv, "k_conv-22") : NULL;
}

static struct lt_tensor *build_k_conv_l2(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_l2_norm(ctx, k_conv_of(ctx, x[0]), 1e-6f);
}

/* the same with the fused rule (lt_l2_norm_fused_back: a device's BF16 training step) */
static struct lt_tensor *build_k_conv_l2_fused(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_l2_norm_fused_back(ctx, k_conv_of(ctx, x[0]), 1e-6f);
}

static void test_l2_norm_of_k_conv(void)
{
    struct gc_input in = f32_in(24, 5, 1, 1, GC_CONTIGUOUS, true, -1, 1);
    const char *name = "l2_norm of k_conv sliced from the conv output";
    gradcheck(name, build_k_conv_l2, NULL, &in, 1, TOL);
    /* the rule is llama.cpp's graph (SQR of x among primitives), but SQR reads a
     * contiguous copy of the view */
    int n_sqr = 0;
    CHECK(gc_check_backward_graph(name, build_k_conv_l2, NULL, &in, 1, reads_contiguous_only,
                                  LT_OP_SQR, &n_sqr) > 0);
    CHECK(n_sqr == 1, "%d SQR nodes", n_sqr);
    /* the fused rule: one L2_NORM_BACK over contiguous copies, no SQR */
    const char *fname = "l2_norm of k_conv, fused backward";
    gradcheck(fname, build_k_conv_l2_fused, NULL, &in, 1, TOL);
    int n_back = 0;
    CHECK(gc_check_backward_graph(fname, build_k_conv_l2_fused, NULL, &in, 1, reads_contiguous_only,
                                  LT_OP_L2_NORM_BACK, &n_back) > 0);
    CHECK(n_back == 1, "%d L2_NORM_BACK nodes", n_back);
    CHECK(gc_check_backward_graph(fname, build_k_conv_l2_fused, NULL, &in, 1, reads_contiguous_only,
                                  LT_OP_SQR, &n_sqr) > 0 &&
              n_sqr == 0,
          "%d SQR nodes in the fused rule's graph", n_sqr);
}

/* ---- rope ---- */

struct rope_case {
    int n_dims;
    enum lt_rope_mode mode;
    float base;
};

static struct lt_tensor *build_rope(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const struct rope_case *c = user;
    return lt_rope(ctx, x[0], x[1], c->n_dims, c->mode, c->base);
}

static void test_rope(void)
{
    const struct rope_case cases[] = {
        {8, LT_ROPE_NORMAL, 10000.0f},
        {8, LT_ROPE_NEOX, 10000.0f},
        {4, LT_ROPE_NORMAL, 100.0f}, /* partial rotary: dims 4..7 pass through */
        {4, LT_ROPE_NEOX, 1e6f},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            struct gc_input in[2] = {
                f32_in(8, 2, 3, 2, l, true, -2, 2),
                {LT_TYPE_I32, {3, 1, 1, 1}, GC_CONTIGUOUS, false, 0, 60},
            };
            char name[96];
            snprintf(name, sizeof(name), "rope n_dims %d %s, %s", cases[i].n_dims,
                     cases[i].mode == LT_ROPE_NEOX ? "neox" : "normal", gc_layout_names[l]);
            nn_check_case(name, build_rope, (void *)&cases[i], in, 2);
        }
}

/* ---- soft_max ---- */

struct soft_max_case {
    float scale;
    bool causal;
    int mask;      /* 0: none; 1: [6, 4, 1, 1]; 2: [6, 4, 2, 1] */
    bool mask_inf; /* some mask entries -inf, and row 0 entirely */
    bool mask_trainable;
};

static struct lt_tensor *build_soft_max(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const struct soft_max_case *c = user;
    struct lt_tensor *mask = c->mask ? x[1] : NULL;
    if (mask && c->mask_inf) {
        float *m = mask->data; /* contiguous */
        for (int64_t r = 0; r < lt_nrows(mask); r++)
            for (int64_t i = 0; i < mask->ne[0]; i++)
                if (r % mask->ne[1] == 0 || (i + r) % 3 == 0)
                    m[r * mask->ne[0] + i] = -INFINITY;
    }
    return lt_soft_max(ctx, x[0], mask, c->scale, c->causal);
}

static void test_soft_max(void)
{
    const struct soft_max_case cases[] = {
        {1.0f, false, 0, false, false}, {0.7f, false, 0, false, false},
        {0.7f, true, 0, false, false},  {0.5f, false, 1, false, false},
        {1.3f, true, 2, false, false},  {0.7f, true, 1, true, false},
        {0.7f, false, 2, true, false},  {0.6f, true, 1, false, true},
        {1.0f, false, 2, false, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            const struct soft_max_case *c = &cases[i];
            struct gc_input in[2] = {
                f32_in(6, 4, 2, 2, l, true, -2, 2),
                f32_in(6, 4, c->mask == 2 ? 2 : 1, 1, GC_CONTIGUOUS, c->mask_trainable, -1, 1),
            };
            char name[128];
            snprintf(name, sizeof(name), "soft_max scale %g%s%s%s%s, %s", (double)c->scale,
                     c->causal ? " causal" : "",
                     c->mask ? (c->mask == 1 ? " mask [6,4,1,1]" : " mask [6,4,2,1]") : "",
                     c->mask_inf ? " with -inf" : "", c->mask_trainable ? " (trainable)" : "",
                     gc_layout_names[l]);
            nn_check_case(name, build_soft_max, (void *)c, in, c->mask ? 2 : 1);
        }
}

/* ---- cross_entropy ---- */

static struct lt_tensor *build_ce(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const int32_t *labels = user;
    memcpy(x[1]->data, labels, sizeof(int32_t) * (size_t)x[1]->ne[0]);
    /* scaled, so the incoming gradient is not sum(y * w)'s w alone */
    return lt_scale(ctx, lt_cross_entropy(ctx, x[0], x[1]), 3.0f);
}

static void test_cross_entropy(void)
{
    static const int32_t some_masked[5] = {3, -1, 0, 6, 2};
    static const int32_t all_masked[5] = {-1, -1, -1, -1, -1};
    for (int m = 0; m < 2; m++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            struct gc_input in[2] = {
                f32_in(8, 5, 1, 1, l, true, -3, 3),
                {LT_TYPE_I32, {5, 1, 1, 1}, GC_CONTIGUOUS, false, 0, 1},
            };
            char name[96];
            snprintf(name, sizeof(name), "cross_entropy%s, %s", m ? ", every label masked" : "",
                     gc_layout_names[l]);
            nn_check_case(name, build_ce, (void *)(m ? all_masked : some_masked), in, 2);
        }
}

/* The head of a language model: cross_entropy(output^T rms_norm(x)) */
static struct lt_tensor *build_lm_head(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    static const int32_t labels[4] = {1, 6, -1, 0};
    (void)user;
    memcpy(x[2]->data, labels, sizeof(labels));
    struct lt_tensor *h = lt_rms_norm(ctx, x[0], 1e-6f);
    return lt_cross_entropy(ctx, lt_mul_mat(ctx, x[1], h), x[2]);
}

static void test_lm_head(void)
{
    for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
        struct gc_input in[3] = {
            f32_in(6, 4, 1, 1, l, true, -2, 2),
            f32_in(6, 7, 1, 1, l, true, -1, 1),
            {LT_TYPE_I32, {4, 1, 1, 1}, GC_CONTIGUOUS, false, 0, 1},
        };
        char name[64];
        snprintf(name, sizeof(name), "lm head, %s", gc_layout_names[l]);
        nn_check_case(name, build_lm_head, NULL, in, 3);
    }
}

/* The same head through LINEAR_CE (the head and the loss in one op), the head's rows
 * contiguous (contiguous or a slice), the hidden states in every layout, the head F32 or
 * frozen BF16 (whose gradient still flows to the hidden states) */
static struct lt_tensor *build_linear_ce(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    static const int32_t labels[4] = {1, 6, -1, 0};
    const bool bf16 = user != NULL;
    memcpy(x[2]->data, labels, sizeof(labels));
    struct lt_tensor *h = lt_rms_norm(ctx, x[0], 1e-6f);
    struct lt_tensor *w = bf16 ? lt_cont_as(ctx, x[1], LT_TYPE_BF16) : x[1];
    return lt_scale(ctx, lt_linear_cross_entropy(ctx, w, h, x[2]), 3.0f);
}

static void test_linear_ce(void)
{
    static const enum gc_layout wl[] = {GC_CONTIGUOUS, GC_SLICED};
    /* A device multiplies a BF16 head on its BF16 matrix units, rounding h to BF16 first:
     * the loss is then a step function of h at the finite differences' scale (the rounding
     * step is 2^-8 of h), and its straight-through gradient cannot be held to them. The
     * device's LINEAR_CE_BACK is held to the CPU's instead (the conformance suite); here
     * the BF16 head runs on the CPU alone. */
    const int n_bf16 = gc_device.n_backends > 0 && !gc_device.backends[0]->is_host ? 1 : 2;
    for (int l = 0; l < GC_LAYOUT_COUNT; l++)
        for (int bf16 = 0; bf16 < n_bf16; bf16++) {
            struct gc_input in[3] = {
                f32_in(6, 4, 1, 1, l, true, -2, 2),
                f32_in(6, 7, 1, 1, wl[l % 2], !bf16, -1, 1),
                {LT_TYPE_I32, {4, 1, 1, 1}, GC_CONTIGUOUS, false, 0, 1},
            };
            char name[64];
            snprintf(name, sizeof(name), "linear_ce%s, h %s", bf16 ? " (bf16 head)" : "",
                     gc_layout_names[l]);
            nn_check_case(name, build_linear_ce, bf16 ? (void *)1 : NULL, in, 3);
        }
}

/* A tied embedding: one table gives the hidden states (get_rows) and is LINEAR_CE's head
 * (itself, or its BF16 copy as a device's step reads it, user non-NULL). Its gradient is the
 * head's with the embedding's rows added in place: one GET_ROWS_BACK into the head's part,
 * no dense scatter and no ADD, whichever rule runs first (the copy's comes last). */
static struct lt_tensor *build_tied(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    static const int32_t ids[4] = {3, 0, 3, 6}, labels[4] = {1, 6, -1, 0};
    memcpy(x[1]->data, ids, sizeof(ids));
    memcpy(x[2]->data, labels, sizeof(labels));
    struct lt_tensor *h = lt_rms_norm(ctx, lt_get_rows(ctx, x[0], x[1]), 1e-6f);
    struct lt_tensor *w = user ? lt_cont_as(ctx, x[0], LT_TYPE_BF16) : x[0];
    return lt_scale(ctx, lt_linear_cross_entropy(ctx, w, h, x[2]), 3.0f);
}

static void test_tied_embedding(void)
{
    struct gc_input in[3] = {
        f32_in(6, 7, 1, 1, GC_CONTIGUOUS, true, -1, 1),
        {LT_TYPE_I32, {4, 1, 1, 1}, GC_CONTIGUOUS, false, 0, 1},
        {LT_TYPE_I32, {4, 1, 1, 1}, GC_CONTIGUOUS, false, 0, 1},
    };
    /* finite differences through the F32 head (a BF16 one is a step function at their
     * scale: test_linear_ce) */
    nn_check_case("tied embedding", build_tied, NULL, in, 3);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 4 << 20});
        struct lt_tensor *x[3], *storage[3];
        for (int i = 0; i < 3; i++)
            x[i] = gc_make_input(ctx, &in[i], &storage[i]);
        struct lt_tensor *loss = build_tied(ctx, x, bf16 ? (void *)1 : NULL);
        struct lt_graph *g = lt_graph_new(ctx, 256);
        lt_status st = g && loss ? lt_graph_build(g, loss) : LT_ERR_NOMEM;
        const int n_forward = g ? g->n_nodes : 0;
        if (st == LT_OK)
            st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
        CHECK(st == LT_OK, "tied embedding%s: autodiff: %s", bf16 ? " (bf16 head)" : "",
              lt_last_error());
        int adds = 0, dense = 0;
        for (int i = n_forward; st == LT_OK && i < g->n_nodes; i++) {
            adds += g->nodes[i]->op == LT_OP_ADD;
            dense += g->nodes[i]->op == LT_OP_GET_ROWS_BACK && !g->nodes[i]->src[2];
        }
        const struct lt_tensor *d = x[0]->grad;
        CHECK(st != LT_OK ||
                  (d && d->op == LT_OP_GET_ROWS_BACK && d->src[2] && adds == 0 && dense == 0),
              "tied embedding%s: the table's gradient is %s (into the head's: %s), %d ADD, %d "
              "dense scatters",
              bf16 ? " (bf16 head)" : "", d ? lt_op_name(d->op) : "none",
              d && d->src[2] ? "yes" : "no", adds, dense);
        lt_ctx_free(ctx);
    }
}

/* ---- an attention block with grouped KV heads ---- */

#define ATT_D 4   /* head_dim */
#define ATT_H 4   /* query heads */
#define ATT_HKV 2 /* KV heads: query heads 2h and 2h + 1 read KV head h */
#define ATT_E 8   /* n_embd */
#define ATT_T 5

/* x [E, T], wq [E, D*H], wk and wv [E, D*H_kv], pos [T]: the model's attention with a
 * Qwen3.5-style k norm, the KV heads shared by the mul_mats' grouped broadcast. */
static struct lt_tensor *build_attention(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    struct lt_tensor *xin = x[0], *pos = x[4];
    struct lt_tensor *q = lt_reshape_3d(ctx, lt_mul_mat(ctx, x[1], xin), ATT_D, ATT_H, ATT_T);
    struct lt_tensor *k = lt_reshape_3d(ctx, lt_mul_mat(ctx, x[2], xin), ATT_D, ATT_HKV, ATT_T);
    struct lt_tensor *v = lt_reshape_3d(ctx, lt_mul_mat(ctx, x[3], xin), ATT_D, ATT_HKV, ATT_T);
    k = lt_rms_norm(ctx, k, 1e-6f);
    q = lt_rope(ctx, q, pos, ATT_D, LT_ROPE_NEOX, 10000.0f);
    k = lt_rope(ctx, k, pos, ATT_D, LT_ROPE_NEOX, 10000.0f);
    struct lt_tensor *qp = lt_permute(ctx, q, 0, 2, 1, 3); /* [D, T, H] */
    struct lt_tensor *kp = lt_permute(ctx, k, 0, 2, 1, 3); /* [D, T, H_kv] */
    struct lt_tensor *kq = lt_mul_mat(ctx, kp, qp);        /* [T_k, T_q, H] */
    struct lt_tensor *p = lt_soft_max(ctx, kq, NULL, 0.5f, true);
    struct lt_tensor *vt = lt_permute(ctx, v, 1, 2, 0, 3); /* [T, D, H_kv] */
    struct lt_tensor *o = lt_mul_mat(ctx, vt, p);          /* [D, T_q, H] */
    return lt_cont(ctx, lt_permute(ctx, o, 0, 2, 1, 3));   /* [D, H, T] */
}

static void test_attention(void)
{
    for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
        struct gc_input in[5] = {
            f32_in(ATT_E, ATT_T, 1, 1, l, true, -1, 1),
            f32_in(ATT_E, ATT_D * ATT_H, 1, 1, l, true, -0.5f, 0.5f),
            f32_in(ATT_E, ATT_D * ATT_HKV, 1, 1, GC_CONTIGUOUS, true, -0.5f, 0.5f),
            f32_in(ATT_E, ATT_D * ATT_HKV, 1, 1, l, true, -0.5f, 0.5f),
            {LT_TYPE_I32, {ATT_T, 1, 1, 1}, GC_CONTIGUOUS, false, 0, 20},
        };
        char name[64];
        snprintf(name, sizeof(name), "GQA attention, %s", gc_layout_names[l]);
        nn_check_case(name, build_attention, NULL, in, 5);
    }
}

/* ---- flash_attn ---- */

struct flash_case {
    int64_t D, H, Hkv, T, nk, S;
    bool causal;
    int mask; /* 0: none; 1: [nk, T, 1, S] with -inf entries and a row all -inf; 2: [nk, T, H, 1];
                 3: I32 positions [T * S] of packed examples */
};

/* packed examples' positions, row by row: 0, 1, 2, 0, 1, 0, ... restarting at each example */
static const int32_t flash_pos[2][6] = {{0, 1, 2, 0, 1, 0}, {0, 0, 1, 2, 3, 0}};

/* q [D, H, T, S], k and v [D, Hkv, nk, S] */
static struct lt_tensor *build_flash(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const struct flash_case *c = user;
    struct lt_tensor *mask = c->mask ? x[3] : NULL;
    if (mask && c->mask == 1) {
        float *m = mask->data; /* contiguous */
        for (int64_t r = 0; r < lt_nrows(mask); r++)
            for (int64_t i = 0; i < mask->ne[0]; i++)
                if (r == 1 || (i + 2 * r) % 5 == 0)
                    m[r * mask->ne[0] + i] = -INFINITY;
    }
    if (mask && c->mask == 3)
        for (int64_t i = 0; i < lt_nelements(mask); i++)
            ((int32_t *)mask->data)[i] = flash_pos[i / c->T % 2][i % c->T];
    return lt_flash_attn(ctx, x[0], x[1], x[2], mask, 0.6f, c->causal);
}

static void test_flash_attn(void)
{
    const struct flash_case cases[] = {
        {4, 2, 2, 5, 5, 1, true, 0},  /* causal, no groups */
        {4, 4, 2, 3, 5, 2, true, 1},  /* groups, a cache longer than the queries, -inf mask */
        {6, 2, 1, 4, 6, 2, false, 2}, /* one key head, a mask a head */
        {4, 4, 2, 6, 6, 2, true, 3},  /* packed examples by their positions */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            const struct flash_case *c = &cases[i];
            struct gc_input in[4] = {
                f32_in(c->D, c->H, c->T, c->S, l, true, -1, 1),
                f32_in(c->D, c->Hkv, c->nk, c->S, (l + 1) % GC_LAYOUT_COUNT, true, -1, 1),
                f32_in(c->D, c->Hkv, c->nk, c->S, l, true, -1, 1),
                f32_in(c->nk, c->T, c->mask == 2 ? c->H : 1, c->mask == 2 ? 1 : c->S, GC_CONTIGUOUS,
                       false, -1, 1),
            };
            if (c->mask == 3)
                in[3] = (struct gc_input){
                    LT_TYPE_I32, {c->T * c->S, 1, 1, 1}, GC_CONTIGUOUS, false, 0, 1};
            char name[128];
            snprintf(name, sizeof(name), "flash_attn D%lld H%lld/%lld T%lld nk%lld S%lld%s%s, %s",
                     (long long)c->D, (long long)c->H, (long long)c->Hkv, (long long)c->T,
                     (long long)c->nk, (long long)c->S, c->causal ? " causal" : "",
                     c->mask == 1   ? " mask -inf"
                     : c->mask == 2 ? " mask a head"
                     : c->mask == 3 ? " positions"
                                    : "",
                     gc_layout_names[l]);
            nn_check_case(name, build_flash, (void *)c, in, c->mask ? 4 : 3);
        }
}
#endif
