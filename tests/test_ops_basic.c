/* test_ops_basic.c: element-wise unary ops, swiglu, silu_back, the binary ops with
 * broadcasting (and mul, scale and swiglu writing F16 / BF16 results), and the reductions, on the
 * CPU backend with 1 and 2 threads, against plain reference loops, for contiguous, transposed,
 * permuted and sliced inputs (and broadcast second sources). Copies, rows and the backward helpers
 * are in test_ops_basic_copy.c. */
#include "test_ops_basic.h"

static const int64_t shape[4] = {7, 5, 3, 2};

/* ---- unary ---- */

struct unary_case {
    const char *name;
    struct lt_tensor *(*make)(struct lt_ctx *, struct lt_tensor *);
    double (*ref)(double);
    float lo, hi; /* input range */
};

static double ref_silu(double x)
{
    return x / (1.0 + exp(-x));
}
static double ref_sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}
static double ref_softplus(double x)
{
    return x > 20.0 ? x : log1p(exp(x));
}
static double ref_exp(double x)
{
    return exp(x);
}
static double ref_log(double x)
{
    return log(x);
}
static double ref_sqr(double x)
{
    return x * x;
}
static double ref_sqrt(double x)
{
    return sqrt(x);
}
static double ref_sin(double x)
{
    return sin(x);
}
static double ref_cos(double x)
{
    return cos(x);
}
static double ref_abs(double x)
{
    return fabs(x);
}
static double ref_neg(double x)
{
    return -x;
}
static double ref_relu(double x)
{
    return x > 0 ? x : 0;
}

static const struct unary_case unary_cases[] = {
    {"silu", lt_silu, ref_silu, -12, 12},
    {"sigmoid", lt_sigmoid, ref_sigmoid, -12, 12},
    {"softplus", lt_softplus, ref_softplus, -30, 30},
    {"exp", lt_exp, ref_exp, -6, 6},
    {"log", lt_log, ref_log, 0.01f, 20},
    {"sqr", lt_sqr, ref_sqr, -4, 4},
    {"sqrt", lt_sqrt, ref_sqrt, 0, 50},
    {"sin", lt_sin, ref_sin, -10, 10},
    {"cos", lt_cos, ref_cos, -10, 10},
    {"abs", lt_abs, ref_abs, -3, 3},
    {"neg", lt_neg, ref_neg, -3, 3},
    {"relu", lt_relu, ref_relu, -3, 3},
};

static void test_unary(struct ops_test *t)
{
    const enum lt_type types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16};
    char what[128];
    for (size_t c = 0; c < sizeof(unary_cases) / sizeof(unary_cases[0]); c++) {
        const struct unary_case *uc = &unary_cases[c];
        for (int l = 0; l < LAYOUT_COUNT; l++)
            for (int ty = 0; ty < 3; ty++) {
                if (ty > 0 && l != LAYOUT_TRANSPOSED)
                    continue; /* half types once, through a view */
                struct lt_tensor *x = input_new(t, types[ty], shape, l, uc->lo, uc->hi);
                float *xv = dense(x);
                int64_t n = lt_nelements(x);
                float *ref = malloc(sizeof(float) * (size_t)n);
                for (int64_t i = 0; i < n; i++)
                    ref[i] = (float)uc->ref(xv[i]);
                struct lt_tensor *y = uc->make(t->ctx, x);
                snprintf(what, sizeof(what), "%s of %s %s", uc->name, lt_type_name(types[ty]),
                         layout_names[l]);
                check_op(t, y, ref, 1e-6, 2e-6, what);
                CHECK(y && y->type == LT_TYPE_F32 && lt_is_contiguous(y), "%s: result", what);
                free(ref);
                free(xv);
            }
    }
    /* scale, and softplus right at its threshold */
    for (int l = 0; l < LAYOUT_COUNT; l++) {
        struct lt_tensor *x = input_new(t, LT_TYPE_F32, shape, l, -5, 5);
        float *xv = dense(x);
        float ref[210];
        for (int i = 0; i < 210; i++)
            ref[i] = xv[i] * -0.37f;
        snprintf(what, sizeof(what), "scale of %s", layout_names[l]);
        check_op(t, lt_scale(t->ctx, x, -0.37f), ref, 0, 1e-7, what);
        free(xv);
    }
    struct lt_tensor *x = lt_new_tensor_1d(t->ctx, LT_TYPE_F32, 5);
    lt_tensor_fill_f32(x, (float[]){19.5f, 20.0f, 20.5f, 88.0f, -100.0f});
    check_op(t, lt_softplus(t->ctx, x),
             (float[]){(float)log1p(exp(19.5)), (float)log1p(exp(20.0)), 20.5f, 88.0f,
                       (float)log1p(exp(-100.0))},
             0, 1e-6, "softplus at the threshold");
    /* a broadcast view (nb1 = 0: every row is the same memory) */
    struct lt_tensor *row =
        input_new(t, LT_TYPE_F32, (int64_t[]){7, 1, 3, 1}, LAYOUT_CONTIGUOUS, -2, 2);
    struct lt_tensor *bc = lt_view_3d(t->ctx, row, 7, 5, 3, 0, row->nb[2], 0);
    float *rv = dense(bc), bref[105], rsum[15];
    for (int i = 0; i < 105; i++)
        bref[i] = rv[i] * rv[i];
    for (int r = 0; r < 15; r++) {
        double s = 0;
        for (int i = 0; i < 7; i++)
            s += rv[r * 7 + i];
        rsum[r] = (float)s;
    }
    check_op(t, lt_sqr(t->ctx, bc), bref, 0, 1e-7, "sqr of a broadcast view");
    check_op(t, lt_sum_rows(t->ctx, bc), rsum, 1e-6, 1e-6, "sum_rows of a broadcast view");
    free(rv);
    struct lt_tensor *ints = lt_new_tensor_1d(t->ctx, LT_TYPE_I32, 4);
    lt_set_name(ints, "token ids");
    check_refused(lt_sqr(t->ctx, ints), "token ids", "sqr of i32");
}

/* ---- swiglu and silu_back: two same-shape sources ---- */

/* out's values after its graph runs on one CPU thread (NULL when it cannot); free() them */
static float *run_dense(struct ops_test *t, struct lt_tensor *out)
{
    struct lt_graph *g = out ? lt_graph_new(t->ctx, 64) : NULL;
    if (!g || lt_graph_build(g, out) != LT_OK || lt_cpu_graph_compute(t->cpu[0], g) != LT_OK)
        return NULL;
    return dense(out);
}

static void test_pairs(struct ops_test *t)
{
    char what[128];
    for (int la = 0; la < LAYOUT_COUNT; la++)
        for (int lb = 0; lb < LAYOUT_COUNT; lb++) {
            struct lt_tensor *a = input_new(t, LT_TYPE_F32, shape, la, -8, 8);
            struct lt_tensor *b =
                input_new(t, lb == 1 ? LT_TYPE_F16 : LT_TYPE_F32, shape, lb, -8, 8);
            float *av = dense(a), *bv = dense(b);
            float ref_swiglu[210], ref_back[210], ref_sig[210];
            for (int i = 0; i < 210; i++) {
                double g = av[i], u = bv[i];
                ref_swiglu[i] = (float)(g / (1 + exp(-g)) * u);
                ref_sig[i] = (float)(u / (1 + exp(-g)));
                /* silu_back(grad = a, x = b) */
                double s = 1 / (1 + exp(-u));
                ref_back[i] = (float)(g * (s + u * s * (1 - s)));
            }
            snprintf(what, sizeof(what), "swiglu of %s and %s", layout_names[la], layout_names[lb]);
            check_op(t, lt_swiglu(t->ctx, a, b), ref_swiglu, 1e-6, 4e-6, what);
            snprintf(what, sizeof(what), "sigmoid glu of %s and %s", layout_names[la],
                     layout_names[lb]);
            check_op(t, lt_glu_as(t->ctx, a, b, LT_GLU_SIGMOID, LT_TYPE_F32), ref_sig, 1e-6, 4e-6,
                     what);
            snprintf(what, sizeof(what), "silu_back of %s and %s", layout_names[la],
                     layout_names[lb]);
            check_op(t, lt_silu_back(t->ctx, a, b), ref_back, 1e-6, 4e-6, what);
            free(av);
            free(bv);
        }
    struct lt_tensor *g = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 8, 3), "ffn_gate");
    struct lt_tensor *u = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 8, 4), "ffn_up");
    check_refused(lt_swiglu(t->ctx, g, u), "ffn_up", "swiglu of different shapes");
    check_refused(lt_silu_back(t->ctx, g, u), "ffn_gate", "silu_back of different shapes");
    check_refused(lt_swiglu_back(t->ctx, g, g, u), "ffn_up", "swiglu_back of different shapes");
    check_refused(lt_glu_as(t->ctx, g, g, (enum lt_glu)7, LT_TYPE_F32), "no gate activation",
                  "glu of an unknown activation");
    /* the value of the two-node form it replaces in Qwen3.5's gated attention, bit for bit */
    struct lt_tensor *x = input_new(t, LT_TYPE_F32, shape, 0, -8, 8),
                     *o = input_new(t, LT_TYPE_F32, shape, 2, -3, 3);
    struct lt_tensor *two = lt_mul(t->ctx, o, lt_sigmoid(t->ctx, x)),
                     *one = lt_glu_as(t->ctx, x, o, LT_GLU_SIGMOID, LT_TYPE_F32);
    float *v2 = run_dense(t, two), *v1 = run_dense(t, one);
    CHECK(v1 && v2 && memcmp(v1, v2, 210 * sizeof(float)) == 0,
          "sigmoid glu equals mul(up, sigmoid(gate)) bit for bit");
    free(v1);
    free(v2);
}

/* ---- swiglu_back: both gradients of swiglu, d gate then d up, over the layouts ---- */

static void test_swiglu_back(struct ops_test *t)
{
    char what[160];
    for (int lg = 0; lg < LAYOUT_COUNT; lg++)
        for (int lx = 0; lx < LAYOUT_COUNT; lx++) {
            const int lu = (lg + lx) % LAYOUT_COUNT;
            struct lt_tensor *g = input_new(t, LT_TYPE_F32, shape, lg, -2, 2);
            struct lt_tensor *x =
                input_new(t, lx == 1 ? LT_TYPE_BF16 : LT_TYPE_F32, shape, lx, -8, 8);
            struct lt_tensor *u = input_new(t, LT_TYPE_F32, shape, lu, -3, 3);
            float *gv = dense(g), *xv = dense(x), *uv = dense(u);
            float ref[420], ref_sig[420];
            for (int i = 0; i < 210; i++) {
                double s = 1 / (1 + exp(-(double)xv[i]));
                ref[i] = (float)(gv[i] * uv[i] * (s + xv[i] * s * (1 - s)));
                ref[210 + i] = (float)(gv[i] * xv[i] * s);
                ref_sig[i] = (float)(gv[i] * uv[i] * s * (1 - s));
                ref_sig[210 + i] = (float)(gv[i] * s);
            }
            snprintf(what, sizeof(what), "sigmoid glu_back of %s, %s, %s", layout_names[lg],
                     layout_names[lx], layout_names[lu]);
            check_op(t, lt_glu_back_as(t->ctx, g, x, u, LT_GLU_SIGMOID, LT_TYPE_F32), ref_sig, 1e-6,
                     4e-6, what);
            snprintf(what, sizeof(what), "swiglu_back of %s, %s, %s", layout_names[lg],
                     layout_names[lx], layout_names[lu]);
            struct lt_tensor *r = lt_swiglu_back(t->ctx, g, x, u);
            check_op(t, r, ref, 1e-6, 4e-6, what);
            struct lt_tensor *dg = lt_swiglu_back_gate(t->ctx, r),
                             *du = lt_swiglu_back_up(t->ctx, r);
            CHECK(dg && du && lt_same_shape(dg, x) && lt_same_shape(du, x) &&
                      du->view_offs - dg->view_offs == 210 * sizeof(float),
                  "%s: the two views are gate-shaped halves", what);
            free(gv);
            free(xv);
            free(uv);
        }
}

/* ---- binary ---- */

enum bcast_kind {
    BCAST_SAME,     /* b has a's shape, in layout lb */
    BCAST_ROWS,     /* b [7, 1, 3, 1] */
    BCAST_COLS,     /* b [1, 5, 1, 2] */
    BCAST_SCALAR,   /* b [1, 1, 1, 1] */
    BCAST_TILE0,    /* b [7, 5, 3, 1] repeated over ne3 */
    BCAST_NB0_VIEW, /* b a [7, 5, 3, 2] view with nb1 = 0 of a [7, 1, 3, 2] tensor */
    BCAST_COUNT
};

static const char *const bcast_names[BCAST_COUNT] = {"same shape", "[7 1 3 1]", "[1 5 1 2]",
                                                     "[1 1 1 1]",  "[7 5 3 1]", "an nb1 = 0 view"};

static struct lt_tensor *bcast_input(struct ops_test *t, enum bcast_kind kind, enum layout lb,
                                     enum lt_type type, float lo, float hi)
{
    static const int64_t shapes[BCAST_COUNT][4] = {{7, 5, 3, 2}, {7, 1, 3, 1}, {1, 5, 1, 2},
                                                   {1, 1, 1, 1}, {7, 5, 3, 1}, {7, 1, 3, 2}};
    if (kind == BCAST_SAME)
        return input_new(t, type, shape, lb, lo, hi);
    if (kind != BCAST_NB0_VIEW)
        return input_new(t, type, shapes[kind], LAYOUT_CONTIGUOUS, lo, hi);
    struct lt_tensor *base = input_new(t, type, shapes[kind], LAYOUT_CONTIGUOUS, lo, hi);
    return lt_view_4d(t->ctx, base, 7, 5, 3, 2, 0, base->nb[2], base->nb[3], 0);
}

static double binary_ref(int op, double x, double y)
{
    switch (op) {
    case 0: return x + y;
    case 1: return x - y;
    case 2: return x * y;
    default: return x / y;
    }
}

static void test_binary(struct ops_test *t)
{
    struct lt_tensor *(*const make[4])(struct lt_ctx *, struct lt_tensor *,
                                       struct lt_tensor *) = {lt_add, lt_sub, lt_mul, lt_div};
    const char *names[4] = {"add", "sub", "mul", "div"};
    char what[160];
    for (int op = 0; op < 4; op++)
        for (int la = 0; la < LAYOUT_COUNT; la++)
            for (int kind = 0; kind < BCAST_COUNT; kind++)
                for (int lb = 0; lb < (kind == BCAST_SAME ? LAYOUT_COUNT : 1); lb++) {
                    /* one half-precision pair per op */
                    bool half = la == LAYOUT_SLICED && kind == BCAST_SAME && lb == LAYOUT_PERMUTED;
                    struct lt_tensor *a =
                        input_new(t, half ? LT_TYPE_BF16 : LT_TYPE_F32, shape, la, -3, 3);
                    struct lt_tensor *b =
                        bcast_input(t, kind, lb, half ? LT_TYPE_F16 : LT_TYPE_F32, 0.5f, 2.5f);
                    float *av = dense(a), *bv = dense(b);
                    float ref[210];
                    for (int64_t i3 = 0; i3 < 2; i3++)
                        for (int64_t i2 = 0; i2 < 3; i2++)
                            for (int64_t i1 = 0; i1 < 5; i1++)
                                for (int64_t i0 = 0; i0 < 7; i0++) {
                                    int64_t j = flat(b->ne, i0 % b->ne[0], i1 % b->ne[1],
                                                     i2 % b->ne[2], i3 % b->ne[3]);
                                    int64_t i = flat(shape, i0, i1, i2, i3);
                                    ref[i] = (float)binary_ref(op, av[i], bv[j]);
                                }
                    snprintf(what, sizeof(what), "%s of %s %s and %s %s (%s)", names[op],
                             lt_type_name(a->type), layout_names[la], lt_type_name(b->type),
                             kind == BCAST_SAME ? layout_names[lb] : "broadcast",
                             bcast_names[kind]);
                    check_op(t, make[op](t->ctx, a, b), ref, 1e-6, 1e-6, what);
                    free(av);
                    free(bv);
                }
    struct lt_tensor *a = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 7, 5), "attn_out");
    struct lt_tensor *b = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 3, 5), "residual");
    check_refused(lt_add(t->ctx, a, b), "residual", "add of [7 5] and [3 5]");
    check_refused(lt_mul(t->ctx, b, a), "attn_out", "mul of [3 5] and [7 5]");
    struct lt_tensor *z = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 0, 5), "empty");
    check_refused(lt_sub(t->ctx, a, z), "empty", "sub with a zero dimension");
    struct lt_tensor *ids = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_I32, 7, 5), "ids");
    check_refused(lt_div(t->ctx, a, ids), "ids", "div by i32");
}

/* ---- half results (lt_mul_as, lt_swiglu_as: a model's activations for half weights;
 * lt_scale_as: a LoRA adapter's scaled A) ---- */

static float round_to(enum lt_type type, float v)
{
    return type == LT_TYPE_BF16 ? lt_bf16_to_fp32(lt_fp32_to_bf16(v))
                                : lt_fp16_to_fp32(lt_fp32_to_fp16(v));
}

/* MUL and SCALE into F16 / BF16 are the F32 products rounded once to nearest even, exactly;
 * SWIGLU's is within half a unit of the last place of the type (its expf may differ from
 * libm's double exp in the last F32 bit, which can move a rounding) */
static void test_half_results(struct ops_test *t)
{
    static const enum lt_type types[] = {LT_TYPE_BF16, LT_TYPE_F16};
    char what[160];
    for (int ti = 0; ti < 2; ti++)
        for (int la = 0; la < LAYOUT_COUNT; la++)
            for (int kind = 0; kind < BCAST_COUNT; kind += BCAST_COUNT - 1) {
                enum lt_type type = types[ti];
                struct lt_tensor *a = input_new(t, LT_TYPE_F32, shape, la, -3, 3);
                struct lt_tensor *b = bcast_input(t, (enum bcast_kind)kind, LAYOUT_CONTIGUOUS,
                                                  LT_TYPE_F32, 0.5f, 2.5f);
                struct lt_tensor *u =
                    input_new(t, LT_TYPE_F32, shape, (la + 1) % LAYOUT_COUNT, -3, 3);
                float *av = dense(a), *bv = dense(b), *uv = dense(u);
                float ref_mul[210], ref_swiglu[210], ref_scale[210];
                for (int64_t i3 = 0; i3 < 2; i3++)
                    for (int64_t i2 = 0; i2 < 3; i2++)
                        for (int64_t i1 = 0; i1 < 5; i1++)
                            for (int64_t i0 = 0; i0 < 7; i0++) {
                                int64_t j = flat(b->ne, i0 % b->ne[0], i1 % b->ne[1], i2 % b->ne[2],
                                                 i3 % b->ne[3]);
                                int64_t i = flat(shape, i0, i1, i2, i3);
                                ref_mul[i] = round_to(type, av[i] * bv[j]);
                                ref_scale[i] = round_to(type, av[i] * 1.5f);
                                double g = av[i];
                                ref_swiglu[i] = round_to(type, (float)(g / (1 + exp(-g)) * uv[i]));
                            }
                snprintf(what, sizeof(what), "mul of %s and %s into %s", layout_names[la],
                         bcast_names[kind], lt_type_name(type));
                struct lt_tensor *m = lt_mul_as(t->ctx, a, b, type);
                CHECK(m && m->type == type, "%s: the result's type", what);
                check_op(t, m, ref_mul, 0, 0, what);
                snprintf(what, sizeof(what), "swiglu of %s into %s", layout_names[la],
                         lt_type_name(type));
                check_op(t, lt_swiglu_as(t->ctx, a, u, type), ref_swiglu, 1e-6,
                         type == LT_TYPE_BF16 ? 1.0 / 256 : 1.0 / 2048, what);
                snprintf(what, sizeof(what), "scale of %s into %s", layout_names[la],
                         lt_type_name(type));
                struct lt_tensor *sc = lt_scale_as(t->ctx, a, 1.5f, type);
                CHECK(sc && sc->type == type, "%s: the result's type", what);
                check_op(t, sc, ref_scale, 0, 0, what);
                free(av);
                free(bv);
                free(uv);
            }
    /* long rows of a transposed source on two threads: each thread reads its rows into its
     * own scratch and rounds through a second row after it (a thread's rows once overlapped
     * the next thread's: caught on a 16-core machine, not by the small cases above) */
    for (int rep = 0; rep < 4; rep++) {
        const int64_t ne[4] = {2048, 48, 1, 1};
        struct lt_tensor *x = input_new(t, LT_TYPE_F32, ne, LAYOUT_TRANSPOSED, -3, 3);
        float *xv = dense(x), *ref = malloc(sizeof(float) * 2048 * 48);
        for (int64_t i = 0; i < 2048 * 48; i++)
            ref[i] = round_to(LT_TYPE_BF16, xv[i] * 1.5f);
        check_op(t, lt_scale_as(t->ctx, x, 1.5f, LT_TYPE_BF16), ref, 0, 0,
                 "scale of a transposed [2048, 48] into bf16");
        free(xv);
        free(ref);
    }
    struct lt_tensor *a = lt_set_name(lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 7, 5), "normed");
    check_refused(lt_mul_as(t->ctx, a, a, LT_TYPE_Q8_0), "normed", "mul into q8_0");
    check_refused(lt_swiglu_as(t->ctx, a, a, LT_TYPE_I32), "normed", "swiglu into i32");
    check_refused(lt_scale_as(t->ctx, a, 2.0f, LT_TYPE_Q8_0), "normed", "scale into q8_0");
}

/* ---- reductions ---- */

static void test_reduce(struct ops_test *t)
{
    char what[128];
    for (int l = 0; l < LAYOUT_COUNT; l++)
        for (int half = 0; half < 2; half++) {
            if (half && l != LAYOUT_PERMUTED)
                continue;
            struct lt_tensor *x = input_new(t, half ? LT_TYPE_F16 : LT_TYPE_F32, shape, l, -2, 3);
            float *xv = dense(x);
            float rows[30], means[30];
            double total = 0;
            for (int r = 0; r < 30; r++) {
                double s = 0;
                for (int i = 0; i < 7; i++)
                    s += xv[r * 7 + i];
                rows[r] = (float)s;
                means[r] = (float)(s / 7);
                total += s;
            }
            float tot = (float)total;
            struct lt_tensor *sr = lt_sum_rows(t->ctx, x), *mn = lt_mean(t->ctx, x);
            CHECK(sr && sr->ne[0] == 1 && sr->ne[1] == 5 && sr->ne[2] == 3 && sr->ne[3] == 2);
            snprintf(what, sizeof(what), "sum_rows of %s %s", lt_type_name(x->type),
                     layout_names[l]);
            check_op(t, sr, rows, 1e-6, 1e-6, what);
            snprintf(what, sizeof(what), "mean of %s %s", lt_type_name(x->type), layout_names[l]);
            check_op(t, mn, means, 1e-6, 1e-6, what);
            snprintf(what, sizeof(what), "sum of %s %s", lt_type_name(x->type), layout_names[l]);
            struct lt_tensor *s = lt_sum(t->ctx, x);
            CHECK(s && lt_nelements(s) == 1);
            check_op(t, s, &tot, 1e-6, 1e-6, what);
            free(xv);
        }
    /* accuracy: 300000 values near 1 (a float accumulator would drift by ~1e-4) */
    struct lt_tensor *big = lt_new_tensor_2d(t->ctx, LT_TYPE_F32, 3001, 100);
    float *bv = (float *)big->data;
    double total = 0;
    float rows[100];
    for (int r = 0; r < 100; r++) {
        double s = 0;
        for (int i = 0; i < 3001; i++) {
            bv[r * 3001 + i] = 1.0f + rnd(t, 0, 1e-3f);
            s += bv[r * 3001 + i];
        }
        rows[r] = (float)s;
        total += s;
    }
    float tot = (float)total;
    check_op(t, lt_sum(t->ctx, big), &tot, 0, 1e-7, "sum of 300100 values");
    check_op(t, lt_sum_rows(t->ctx, big), rows, 0, 1e-7, "sum_rows of 3001-wide rows");
    struct lt_tensor *ids = lt_set_name(lt_new_tensor_1d(t->ctx, LT_TYPE_I32, 4), "positions");
    check_refused(lt_sum(t->ctx, ids), "positions", "sum of i32");
    check_refused(lt_mean(t->ctx, ids), "positions", "mean of i32");
}

/* ---- what the CPU says it cannot run ---- */

static void test_verdicts(struct ops_test *t)
{
    char reason[256] = "";
    struct lt_tensor *a = lt_new_tensor_1d(t->ctx, LT_TYPE_F32, 8);
    struct lt_tensor *i = lt_new_tensor_1d(t->ctx, LT_TYPE_I32, 8);
    /* hand-made nodes that no constructor would make */
    struct lt_tensor *add =
        lt_new_op_tensor(t->ctx, LT_OP_ADD, LT_TYPE_F32, 1, a->ne, (struct lt_tensor *[]){a, i}, 2);
    CHECK(!lt_cpu_supports_op(add, reason, sizeof(reason)) && strstr(reason, "source 1"),
          "ADD with an i32 source: '%s'", reason);
    struct lt_tensor *sqr = lt_new_op_tensor(t->ctx, LT_OP_SQR, LT_TYPE_F16, 1, a->ne, &a, 1);
    CHECK(!lt_cpu_supports_op(sqr, reason, sizeof(reason)) && strstr(reason, "result"),
          "SQR into f16: '%s'", reason);
    CHECK(lt_cpu_graph_compute(t->cpu[1], &(struct lt_graph){.n_nodes = 1, .nodes = &sqr}) ==
          LT_ERR_UNSUPPORTED);
    lt_clear_error();
}

int main(void)
{
    struct ops_test t;
    ops_test_init(&t);
    test_unary(&t);
    test_pairs(&t);
    test_swiglu_back(&t);
    test_binary(&t);
    test_half_results(&t);
    test_reduce(&t);
    test_verdicts(&t);
    ops_test_free(&t);
    return check_summary();
}
