/* grad_basic_cases.h: the finite-difference cases of the element-wise and reduction ops
 * (binary.c, unary.c, reduce.c): unary ops, swiglu, binary ops with b broadcast over a,
 * and the reductions, each source contiguous, transposed, permuted and sliced. Each case
 * is a gradcheck (gradcheck.h) and a layout check of its backward graph (grad_basic.h).
 * test_grad_basic.c runs them on the CPU, test_grad_sched.c and gpu/test_cuda_gradcheck.c
 * through the scheduler.
 *
 * gradcheck's sliced layout starts the window ne0 / 2 elements in, in bytes: shapes here
 * keep ne0 even so every float stays aligned. */
#ifndef LATHE_TESTS_GRAD_BASIC_CASES_H
#define LATHE_TESTS_GRAD_BASIC_CASES_H

#include "grad_basic.h"

static const int64_t X_NE[4] = {6, 4, 3, 2};

/* ---- unary ---- */

typedef struct lt_tensor *(*unary_fn)(struct lt_ctx *ctx, struct lt_tensor *a);

struct unary_case {
    const char *name;
    unary_fn fn;
    float lo, hi; /* inputs stay where f is smooth (no kink or pole within a step) */
};

static struct lt_tensor *scale_fn(struct lt_ctx *ctx, struct lt_tensor *a)
{
    return lt_scale(ctx, a, -0.7f);
}

static const struct unary_case unary_cases[] = {
    {"scale", scale_fn, -2, 2},
    {"silu", lt_silu, -4, 4},
    {"sigmoid", lt_sigmoid, -4, 4},
    {"softplus", lt_softplus, -4, 4},
    {"softplus above its threshold", lt_softplus, 20.5f, 24},
    {"exp", lt_exp, -2, 2},
    {"log", lt_log, 0.3f, 3},
    {"sqr", lt_sqr, -2, 2},
    {"sqrt", lt_sqrt, 0.3f, 3},
    {"sin", lt_sin, -3, 3},
    {"cos", lt_cos, -3, 3},
    {"abs of positives", lt_abs, 0.1f, 2},
    {"abs of negatives", lt_abs, -2, -0.1f},
    {"neg", lt_neg, -2, 2},
    {"relu of positives", lt_relu, 0.1f, 2},
    {"relu of negatives", lt_relu, -2, -0.1f},
};

static struct lt_tensor *build_unary(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const struct unary_case *c = user;
    return c->fn(ctx, x[0]);
}

static void test_unary(void)
{
    for (size_t i = 0; i < sizeof(unary_cases) / sizeof(unary_cases[0]); i++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            const struct unary_case *c = &unary_cases[i];
            struct gc_input in = {LT_TYPE_F32, {X_NE[0], X_NE[1], X_NE[2], X_NE[3]}, l, true, c->lo,
                                  c->hi};
            char name[96];
            snprintf(name, sizeof(name), "%s, %s", c->name, gc_layout_names[l]);
            check_case(name, build_unary, (void *)c, &in, 1);
        }
}

/* ---- swiglu ---- */

static struct lt_tensor *build_swiglu(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_swiglu(ctx, x[0], x[1]);
}

static struct lt_tensor *build_sigmoid_glu(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_glu_as(ctx, x[0], x[1], LT_GLU_SIGMOID, LT_TYPE_F32);
}

static void test_swiglu(void)
{
    for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
        struct gc_input in[2] = {
            {LT_TYPE_F32, {X_NE[0], X_NE[1], X_NE[2], X_NE[3]}, l, true, -4, 4},
            {LT_TYPE_F32, {X_NE[0], X_NE[1], X_NE[2], X_NE[3]}, l, true, -2, 2},
        };
        char name[64];
        snprintf(name, sizeof(name), "swiglu, %s", gc_layout_names[l]);
        check_case(name, build_swiglu, NULL, in, 2);
        /* only one of the two trainable */
        in[0].trainable = false;
        snprintf(name, sizeof(name), "swiglu (up only), %s", gc_layout_names[l]);
        check_case(name, build_swiglu, NULL, in, 2);
        in[0].trainable = true;
        snprintf(name, sizeof(name), "sigmoid glu, %s", gc_layout_names[l]);
        check_case(name, build_sigmoid_glu, NULL, in, 2);
        in[1].trainable = false;
        snprintf(name, sizeof(name), "sigmoid glu (gate only), %s", gc_layout_names[l]);
        check_case(name, build_sigmoid_glu, NULL, in, 2);
    }
}

/* ---- binary, with b broadcast over a ---- */

struct binary_case {
    const char *name;
    struct lt_tensor *(*fn)(struct lt_ctx *ctx, struct lt_tensor *a, struct lt_tensor *b);
    float b_lo, b_hi;
};

static const struct binary_case binary_cases[] = {
    {"add", lt_add, -2, 2},
    {"sub", lt_sub, -2, 2},
    {"mul", lt_mul, -2, 2},
    {"div", lt_div, 0.5f, 2},
};

static const int64_t A_NE[4] = {4, 6, 2, 2};
/* b's shapes: a's own, then broadcast: along rows, along ne0 and ne2 (tiles of width 2),
 * one row for everything, and ne0-tiles only */
static const int64_t B_NE[][4] = {
    {4, 6, 2, 2}, {4, 1, 2, 1}, {2, 6, 1, 2}, {2, 1, 1, 1}, {4, 3, 2, 1},
};

static struct lt_tensor *build_binary(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const struct binary_case *c = user;
    return c->fn(ctx, x[0], x[1]);
}

static struct lt_tensor *build_binary_self(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const struct binary_case *c = user;
    return c->fn(ctx, x[0], x[0]);
}

static void test_binary(void)
{
    const int n_b = (int)(sizeof(B_NE) / sizeof(B_NE[0]));
    for (size_t i = 0; i < sizeof(binary_cases) / sizeof(binary_cases[0]); i++) {
        const struct binary_case *c = &binary_cases[i];
        for (int l = 0; l < GC_LAYOUT_COUNT; l++)
            for (int bs = 0; bs < n_b; bs++) {
                struct gc_input in[2] = {
                    {LT_TYPE_F32, {A_NE[0], A_NE[1], A_NE[2], A_NE[3]}, l, true, -2, 2},
                    {LT_TYPE_F32,
                     {B_NE[bs][0], B_NE[bs][1], B_NE[bs][2], B_NE[bs][3]},
                     l,
                     true,
                     c->b_lo,
                     c->b_hi},
                };
                char name[96];
                snprintf(name, sizeof(name), "%s, %s, b [%lld %lld %lld %lld]", c->name,
                         gc_layout_names[l], (long long)B_NE[bs][0], (long long)B_NE[bs][1],
                         (long long)B_NE[bs][2], (long long)B_NE[bs][3]);
                check_case(name, build_binary, (void *)c, in, 2);
            }
        /* a broadcast scalar b, and each source alone trainable */
        for (int which = 0; which < 3; which++) {
            struct gc_input in[2] = {
                {LT_TYPE_F32,
                 {A_NE[0], A_NE[1], A_NE[2], A_NE[3]},
                 GC_TRANSPOSED,
                 which != 2,
                 -2,
                 2},
                {LT_TYPE_F32, {1, 1, 1, 1}, GC_CONTIGUOUS, which != 1, c->b_lo, c->b_hi},
            };
            char name[96];
            snprintf(name, sizeof(name), "%s, scalar b, %s", c->name,
                     which == 0   ? "both trainable"
                     : which == 1 ? "a only"
                                  : "b only");
            check_case(name, build_binary, (void *)c, in, 2);
        }
        /* a op a: both contributions reach the same tensor */
        struct gc_input self = {
            LT_TYPE_F32, {A_NE[0], A_NE[1], A_NE[2], A_NE[3]}, GC_SLICED, true, c->b_lo, c->b_hi};
        char name[64];
        snprintf(name, sizeof(name), "%s of a with itself", c->name);
        gradcheck(name, build_binary_self, (void *)c, &self, 1, TOL);
    }
}

/* ---- reductions ---- */

static struct lt_tensor *build_reduce(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    enum lt_op op = *(const enum lt_op *)user;
    return op == LT_OP_SUM_ROWS ? lt_sum_rows(ctx, x[0])
           : op == LT_OP_MEAN   ? lt_mean(ctx, x[0])
                                : lt_sum(ctx, x[0]);
}

static void test_reduce(void)
{
    static const enum lt_op ops[3] = {LT_OP_SUM_ROWS, LT_OP_MEAN, LT_OP_SUM};
    for (int o = 0; o < 3; o++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            struct gc_input in = {
                LT_TYPE_F32, {X_NE[0], X_NE[1], X_NE[2], X_NE[3]}, l, true, -2, 2};
            char name[64];
            snprintf(name, sizeof(name), "%s, %s", lt_op_name(ops[o]), gc_layout_names[l]);
            check_case(name, build_reduce, (void *)&ops[o], &in, 1);
        }
}

#endif
