/* test_ops_nn_matmul.c: MUL_MAT on the CPU against a plain triple loop in double, over a's
 * types (F32, F16, BF16, Q8_0), b F32 or (for F16 / BF16 a) of a's own type, every pair of layouts of a and b (contiguous, transposed,
 * permuted, sliced), grouped broadcast over dims 2 and 3, odd shapes, decode (N = 1) and
 * 1 and 2 threads; plus the constructor's refusals and a throughput figure. */
#include <time.h>

#include "core/quant.h"
#include "ops/op.h"
#include "ops_nn_util.h"

/* dst[m, n, i2, i3] = sum_k a[k, m, i2 / (B2 / A2), i3 / (B3 / A3)] * b[k, n, i2, i3] */
static void ref_mul_mat(const float *a, const int64_t ane[4], const float *b, const int64_t bne[4],
                        float *out)
{
    int64_t K = ane[0], M = ane[1], N = bne[1], r2 = bne[2] / ane[2], r3 = bne[3] / ane[3];
    int64_t one[4] = {M, N, bne[2], bne[3]};
    for (int64_t i3 = 0; i3 < bne[3]; i3++)
        for (int64_t i2 = 0; i2 < bne[2]; i2++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t m = 0; m < M; m++) {
                    double s = 0;
                    for (int64_t k = 0; k < K; k++)
                        s += (double)a[nn_idx(ane, k, m, i2 / r2, i3 / r3)] *
                             b[nn_idx(bne, k, n, i2, i3)];
                    out[nn_idx(one, m, n, i2, i3)] = (float)s;
                }
}

struct mm_case {
    int64_t K, M, N, a2, a3, b2, b3;
};

static const struct mm_case mm_cases[] = {
    {37, 13, 9, 2, 1, 4, 3},  /* odd shapes, grouped heads 4 vs 2, a3 broadcast over 3 */
    {37, 13, 1, 2, 1, 4, 1},  /* decode: N = 1, heads folded into one gemm per group */
    {16, 7, 5, 1, 1, 3, 2},   /* one a head for every b slice (folded into one gemm) */
    {1000, 150, 3, 1, 1, 1, 1}, /* K large: converted a goes in several tiles */
    {24, 70, 40, 2, 2, 2, 2}, /* N > 16: tall tiles, no broadcast */
};

static int mm_run_case(const struct mm_case *c, enum lt_type type, enum lt_type btype,
                       enum nn_layout la, enum nn_layout lb, int nth)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20});
    int64_t ane[4] = {c->K, c->M, c->a2, c->a3}, bne[4] = {c->K, c->N, c->b2, c->b3};
    int64_t one[4] = {c->M, c->N, c->b2, c->b3};
    float *ra = malloc(sizeof(float) * (size_t)nn_count(ane));
    float *rb = malloc(sizeof(float) * (size_t)nn_count(bne));
    float *ref = malloc(sizeof(float) * (size_t)nn_count(one));
    float *got = malloc(sizeof(float) * (size_t)nn_count(one));
    struct lt_tensor *a = nn_make(ctx, type, la, ane), *b = nn_make(ctx, btype, lb, bne);
    int bad = 0;
    if (!a || !b) {
        CHECK(a && b, "cannot make inputs: %s", lt_last_error());
        bad = 1;
        goto out;
    }
    nn_fill_rand(a, ra, 1.0f);
    nn_fill_rand(b, rb, 1.0f);
    struct lt_tensor *d = lt_mul_mat(ctx, a, b);
    char reason[LT_REASON_MAX] = "";
    bool ok = d && lt_cpu_supports_op(d, reason, sizeof(reason));
    CHECK(ok, "mul_mat %s a %s, %s b %s: %s %s", lt_type_name(type), nn_layout_names[la],
          lt_type_name(btype), nn_layout_names[lb], reason, lt_last_error());
    if (!ok || nn_run(ctx, d, nth) != LT_OK) {
        bad = 1;
        goto out;
    }
    ref_mul_mat(ra, ane, rb, bne, ref);
    lt_tensor_read_f32(d, got);
    long worst = 0;
    double r = check_max_ratio(got, ref, (long)nn_count(one), 1e-4 * sqrt((double)c->K), 1e-4,
                               &worst);
    CHECK(r <= 1.0,
          "mul_mat K=%lld M=%lld N=%lld %s a %s, %s b %s, %d threads: ratio %g at %ld (%g vs "
          "%g)",
          (long long)c->K, (long long)c->M, (long long)c->N, lt_type_name(type),
          nn_layout_names[la], lt_type_name(btype), nn_layout_names[lb], nth, r, worst,
          got[worst], ref[worst]);
    bad = !(r <= 1.0);
out:
    free(ra);
    free(rb);
    free(ref);
    free(got);
    lt_ctx_free(ctx);
    return bad;
}

/* a's type, b's type: F32 activations for every float weight, and half activations
 * meeting weights of their own type (what a model's prefill feeds a device) */
static const enum lt_type mm_types[][2] = {
    {LT_TYPE_F32, LT_TYPE_F32},  {LT_TYPE_F16, LT_TYPE_F32}, {LT_TYPE_BF16, LT_TYPE_F32},
    {LT_TYPE_F16, LT_TYPE_F16}, {LT_TYPE_BF16, LT_TYPE_BF16},
};

static void test_mul_mat_layouts(void)
{
    int runs = 0, bad = 0;
    for (size_t ci = 0; ci < sizeof(mm_cases) / sizeof(mm_cases[0]); ci++)
        for (size_t ti = 0; ti < sizeof(mm_types) / sizeof(mm_types[0]); ti++)
            for (int la = 0; la < NN_LAYOUT_COUNT; la++)
                for (int lb = 0; lb < NN_LAYOUT_COUNT; lb++)
                    for (int nth = 1; nth <= 2; nth++) {
                        bad += mm_run_case(&mm_cases[ci], mm_types[ti][0], mm_types[ti][1],
                                           (enum nn_layout)la, (enum nn_layout)lb, nth);
                        runs++;
                    }
    printf("mul_mat: %d layout/type/thread runs, %d bad\n", runs, bad);
}

/* Q8_0 blocks written by hand (scale f16, 32 int8), so the reference needs no quantiser. */
static void test_mul_mat_q8_0(void)
{
    const int64_t K = 64, M = 11, N = 5;
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_tensor *a = lt_new_tensor_3d(ctx, LT_TYPE_Q8_0, K, M, 2);
    int64_t bne[4] = {K, N, 4, 1}, ane[4] = {K, M, 2, 1}, one[4] = {M, N, 4, 1};
    float ra[64 * 11 * 2], rb[64 * 5 * 4], ref[11 * 5 * 4], got[11 * 5 * 4];
    uint8_t *blk = a->data;
    for (int64_t ib = 0; ib < K / 32 * M * 2; ib++, blk += LT_BLOCK_Q8_0) {
        uint16_t d = lt_fp32_to_fp16(0.01f + 0.001f * (float)(ib % 7));
        memcpy(blk, &d, 2);
        for (int j = 0; j < 32; j++) {
            int8_t q = (int8_t)(nn_rand() * 127.0f);
            blk[2 + j] = (uint8_t)q;
            ra[ib * 32 + j] = lt_fp16_to_fp32(d) * (float)q;
        }
    }
    float probe[32];
    lt_type_traits(LT_TYPE_Q8_0)->to_float(a->data, probe, 32);
    bool written = false;
    for (int j = 0; j < 32; j++)
        written |= probe[j] != 0.0f;
    if (!written) {
        printf("mul_mat q8_0: skipped (lt_dequant_q8_0 is not written yet)\n");
        lt_ctx_free(ctx);
        return;
    }
    for (int nth = 1; nth <= 2; nth++)
        for (int lb = 0; lb < NN_LAYOUT_COUNT; lb++) {
            struct lt_tensor *b = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lb, bne);
            nn_fill_rand(b, rb, 1.0f);
            struct lt_tensor *dst = lt_mul_mat(ctx, a, b);
            CHECK(dst && nn_run(ctx, dst, nth) == LT_OK, "%s", lt_last_error());
            if (!dst)
                continue;
            ref_mul_mat(ra, ane, rb, bne, ref);
            lt_tensor_read_f32(dst, got);
            double r = check_max_ratio(got, ref, (long)nn_count(one), 1e-4, 1e-4, NULL);
            CHECK(r <= 1.0, "mul_mat q8_0, b %s, %d threads: ratio %g", nn_layout_names[lb], nth,
                  r);
        }
    lt_ctx_free(ctx);
}

static void test_mul_mat_refusals(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *a = lt_new_tensor_3d(ctx, LT_TYPE_F32, 8, 4, 2);
    struct lt_tensor *b = lt_new_tensor_3d(ctx, LT_TYPE_F32, 8, 3, 3);
    CHECK(lt_mul_mat(ctx, a, b) == NULL, "3 b heads over 2 a heads");
    CHECK(strstr(lt_last_error(), "mul_mat") != NULL);
    struct lt_tensor *b2 = lt_new_tensor_2d(ctx, LT_TYPE_F32, 9, 3);
    CHECK(lt_mul_mat(ctx, a, b2) == NULL, "K differs");
    struct lt_tensor *bh = lt_new_tensor_2d(ctx, LT_TYPE_F16, 8, 3);
    CHECK(lt_mul_mat(ctx, a, bh) == NULL, "b must be f32 or a's type");
    struct lt_tensor *abf = lt_new_tensor_2d(ctx, LT_TYPE_BF16, 8, 4);
    CHECK(lt_mul_mat(ctx, abf, bh) == NULL, "an f16 b with a bf16 a");
    struct lt_tensor *hh = lt_mul_mat(ctx, abf, lt_new_tensor_2d(ctx, LT_TYPE_BF16, 8, 3));
    CHECK(hh && hh->type == LT_TYPE_F32, "a bf16 b with a bf16 a gives f32");
    struct lt_tensor *ai = lt_new_tensor_2d(ctx, LT_TYPE_I8, 8, 3);
    struct lt_tensor *bb = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 3);
    CHECK(lt_mul_mat(ctx, ai, bb) == NULL, "i8 cannot be read");
    struct lt_tensor *ok = lt_mul_mat(ctx, a, lt_new_tensor_3d(ctx, LT_TYPE_F32, 8, 3, 4));
    CHECK(ok && ok->ne[0] == 4 && ok->ne[1] == 3 && ok->ne[2] == 4 && ok->type == LT_TYPE_F32);
    /* the plan is made without data (scratch can be sized before allocation) */
    size_t w = lt_op_def(LT_OP_MUL_MAT)->cpu_work_size(ok, 2);
    CHECK(w == 0, "contiguous f32 needs no scratch, got %zu", w);
    lt_ctx_free(ctx);
}

/* MUL_MAT_ACC: c + a b written over c (with 2 threads c - 0.75 a b, lt_mul_mat_acc_scaled),
 * against the plain loop plus c, over a's types and shapes (grouped heads, N = 1) on 1 and 2
 * threads; and its refusals */
static void test_mul_mat_acc(void)
{
    int bad = 0, runs = 0;
    for (size_t ci = 0; ci < sizeof(mm_cases) / sizeof(mm_cases[0]); ci++)
        for (size_t ti = 0; ti < sizeof(mm_types) / sizeof(mm_types[0]); ti++)
            for (int nth = 1; nth <= 2; nth++, runs++) {
                const struct mm_case *c = &mm_cases[ci];
                struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20});
                int64_t ane[4] = {c->K, c->M, c->a2, c->a3}, bne[4] = {c->K, c->N, c->b2, c->b3};
                int64_t one[4] = {c->M, c->N, c->b2, c->b3};
                const int64_t n = nn_count(one);
                float *ra = malloc(sizeof(float) * (size_t)nn_count(ane));
                float *rb = malloc(sizeof(float) * (size_t)nn_count(bne));
                float *rc = malloc(sizeof(float) * (size_t)n),
                      *ref = malloc(sizeof(float) * (size_t)n),
                      *got = malloc(sizeof(float) * (size_t)n);
                struct lt_tensor *a = nn_make(ctx, mm_types[ti][0], NN_CONTIG, ane);
                struct lt_tensor *b = nn_make(ctx, mm_types[ti][1], NN_CONTIG, bne);
                struct lt_tensor *cc = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, one);
                nn_fill_rand(a, ra, 1.0f);
                nn_fill_rand(b, rb, 1.0f);
                nn_fill_rand(cc, rc, 1.0f);
                /* the second thread count's runs scaled (lt_mul_mat_acc_scaled) */
                const float alpha = nth == 2 ? -0.75f : 1.0f;
                struct lt_tensor *d = nth == 2 ? lt_mul_mat_acc_scaled(ctx, a, b, cc, alpha)
                                               : lt_mul_mat_acc(ctx, a, b, cc);
                char reason[LT_REASON_MAX] = "";
                bool ok = d && d->view_src == cc && lt_cpu_supports_op(d, reason, sizeof(reason)) &&
                          nn_run(ctx, d, nth) == LT_OK;
                CHECK(ok, "mul_mat_acc %s: %s %s", lt_type_name(mm_types[ti][0]), reason,
                      lt_last_error());
                if (ok) {
                    ref_mul_mat(ra, ane, rb, bne, ref);
                    for (int64_t i = 0; i < n; i++)
                        ref[i] = alpha * ref[i] + rc[i];
                    lt_tensor_read_f32(cc, got); /* written over c */
                    long worst = 0;
                    double r =
                        check_max_ratio(got, ref, (long)n, 1e-4 * sqrt((double)c->K), 1e-4, &worst);
                    CHECK(r <= 1.0, "mul_mat_acc K=%lld M=%lld N=%lld %s, %d threads: ratio %g",
                          (long long)c->K, (long long)c->M, (long long)c->N,
                          lt_type_name(mm_types[ti][0]), nth, r);
                    bad += !(r <= 1.0);
                } else {
                    bad++;
                }
                free(ra);
                free(rb);
                free(rc);
                free(ref);
                free(got);
                lt_ctx_free(ctx);
            }
    printf("mul_mat_acc: %d runs, %d bad\n", runs, bad);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *a = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 4);
    struct lt_tensor *b = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 3);
    CHECK(lt_mul_mat_acc(ctx, a, b, lt_new_tensor_2d(ctx, LT_TYPE_F32, 3, 4)) == NULL,
          "c of another shape");
    CHECK(strstr(lt_last_error(), "mul_mat_acc") != NULL, "%s", lt_last_error());
    CHECK(lt_mul_mat_acc(ctx, a, b, lt_new_tensor_2d(ctx, LT_TYPE_F16, 4, 3)) == NULL, "f16 c");
    struct lt_tensor *big = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 3);
    CHECK(lt_mul_mat_acc(ctx, a, b, lt_view_2d(ctx, big, 4, 3, big->nb[1], 0)) == NULL,
          "a strided c");
    lt_ctx_free(ctx);
}

/* a weight of `type` [K, M] filled from random floats (quantised for a quantised type), the
 * floats in ra */
static struct lt_tensor *random_weight(struct lt_ctx *ctx, enum lt_type type, int64_t K, int64_t M,
                                       float *ra)
{
    int64_t ane[4] = {K, M, 1, 1};
    struct lt_tensor *a = nn_make(ctx, type, NN_CONTIG, ane);
    const struct lt_type_traits *tt = lt_type_traits(type);
    if (a && tt->is_quantized) {
        CHECK(tt->from_float != NULL, "%s has no quantiser", tt->name);
        for (int64_t i = 0; i < K * M; i++)
            ra[i] = nn_rand();
        if (tt->from_float)
            tt->from_float(ra, a->data, K * M);
    } else if (a) {
        nn_fill_rand(a, ra, 1.0f);
    }
    return a;
}

/* MUL_MAT_GLU: the stacked product's SwiGLU in one node equals SWIGLU of the two halves of
 * MUL_MAT's product bit for bit (its CPU kernel is MUL_MAT's, then SWIGLU's value), over
 * weight types (float, Q8_0, Q4_1), decode and wider column counts, 1 and 2 threads; and its
 * refusals (an odd row count, a 3-d weight, half columns) */
static void test_mul_mat_glu(void)
{
    static const enum lt_type types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16, LT_TYPE_Q8_0,
                                         LT_TYPE_Q4_1};
    static const int64_t ns[] = {1, 3, 8, 20};
    int runs = 0, bad = 0;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
            for (int nth = 1; nth <= 2; nth++, runs++) {
                const int64_t K = 256, H = 24, N = ns[ni];
                struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20});
                int64_t bne[4] = {K, N, 1, 1};
                float *ra = malloc(sizeof(float) * (size_t)(K * 2 * H));
                float *rb = malloc(sizeof(float) * (size_t)(K * N));
                float *want = malloc(sizeof(float) * (size_t)(H * N));
                float *got = malloc(sizeof(float) * (size_t)(H * N));
                struct lt_tensor *a = random_weight(ctx, types[ti], K, 2 * H, ra);
                struct lt_tensor *b = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, bne);
                nn_fill_rand(b, rb, 1.0f);
                struct lt_tensor *glu = lt_mul_mat_glu(ctx, a, b);
                struct lt_tensor *p = lt_mul_mat(ctx, a, b);
                struct lt_tensor *sw =
                    p ? lt_swiglu(ctx, lt_view_2d(ctx, p, H, N, p->nb[1], 0),
                                  lt_view_2d(ctx, p, H, N, p->nb[1], (size_t)H * sizeof(float)))
                      : NULL;
                char reason[LT_REASON_MAX] = "";
                bool ok = glu && sw && glu->op == LT_OP_MUL_MAT_GLU && glu->ne[0] == H &&
                          glu->ne[1] == N && lt_cpu_supports_op(glu, reason, sizeof(reason)) &&
                          nn_run(ctx, glu, nth) == LT_OK && nn_run(ctx, sw, nth) == LT_OK;
                CHECK(ok, "mul_mat_glu %s N=%lld: %s %s", lt_type_name(types[ti]), (long long)N,
                      reason, lt_last_error());
                if (ok) {
                    lt_tensor_read_f32(glu, got);
                    lt_tensor_read_f32(sw, want);
                    const bool same = memcmp(got, want, sizeof(float) * (size_t)(H * N)) == 0;
                    CHECK(same, "mul_mat_glu %s N=%lld, %d threads: not SWIGLU's values",
                          lt_type_name(types[ti]), (long long)N, nth);
                    bad += !same;
                } else {
                    bad++;
                }
                free(ra);
                free(rb);
                free(want);
                free(got);
                lt_ctx_free(ctx);
            }
    printf("mul_mat_glu: %d runs, %d bad\n", runs, bad);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *b = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 3);
    CHECK(lt_mul_mat_glu(ctx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 5), b) == NULL, "odd rows");
    CHECK(strstr(lt_last_error(), "mul_mat_glu") != NULL, "%s", lt_last_error());
    CHECK(lt_mul_mat_glu(ctx, lt_new_tensor_3d(ctx, LT_TYPE_F32, 8, 4, 2), b) == NULL,
          "a 3-d weight");
    CHECK(lt_mul_mat_glu(ctx, lt_new_tensor_2d(ctx, LT_TYPE_F16, 8, 4),
                         lt_new_tensor_2d(ctx, LT_TYPE_F16, 8, 3)) == NULL,
          "half columns");
    lt_ctx_free(ctx);
}

/* RMS_NORM_MUL_MAT: the product (or its SwiGLU) of the weighted RMS norm of the columns in
 * one node equals the chain RMS_NORM (weighted), MUL_MAT (, SWIGLU) bit for bit, over weight
 * types, column counts and 1 and 2 threads; and its refusals */
static void test_rms_norm_mul_mat(void)
{
    static const enum lt_type types[] = {LT_TYPE_F32, LT_TYPE_BF16, LT_TYPE_Q8_0};
    static const int64_t ns[] = {1, 3, 9};
    int runs = 0, bad = 0;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
            for (int glu = 0; glu < 2; glu++)
                for (int nth = 1; nth <= 2; nth++, runs++) {
                    const int64_t K = 256, M = 48, N = ns[ni], O = glu ? M / 2 : M;
                    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20});
                    int64_t xne[4] = {K, N, 1, 1}, wne[4] = {K, 1, 1, 1};
                    float *ra = malloc(sizeof(float) * (size_t)(K * M));
                    float *rx = malloc(sizeof(float) * (size_t)(K * N));
                    float *rw = malloc(sizeof(float) * (size_t)K);
                    float *want = malloc(sizeof(float) * (size_t)(O * N));
                    float *got = malloc(sizeof(float) * (size_t)(O * N));
                    struct lt_tensor *a = random_weight(ctx, types[ti], K, M, ra);
                    struct lt_tensor *x = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, xne);
                    struct lt_tensor *w = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, wne);
                    nn_fill_rand(x, rx, 2.0f);
                    nn_fill_rand(w, rw, 1.0f);
                    struct lt_tensor *f = lt_rms_norm_mul_mat(ctx, a, x, w, 1e-6f, glu);
                    struct lt_tensor *p =
                        lt_mul_mat(ctx, a, lt_rms_norm_mul(ctx, x, w, 1e-6f, LT_TYPE_F32));
                    struct lt_tensor *ref =
                        !glu || !p ? p
                                   : lt_swiglu(ctx, lt_view_2d(ctx, p, O, N, p->nb[1], 0),
                                               lt_view_2d(ctx, p, O, N, p->nb[1],
                                                          (size_t)O * sizeof(float)));
                    char reason[LT_REASON_MAX] = "";
                    bool ok = f && ref && f->op == LT_OP_RMS_NORM_MUL_MAT && f->ne[0] == O &&
                              f->ne[1] == N && lt_cpu_supports_op(f, reason, sizeof(reason)) &&
                              nn_run(ctx, f, nth) == LT_OK && nn_run(ctx, ref, nth) == LT_OK;
                    CHECK(ok, "rms_norm_mul_mat %s N=%lld glu %d: %s %s", lt_type_name(types[ti]),
                          (long long)N, glu, reason, lt_last_error());
                    if (ok) {
                        lt_tensor_read_f32(f, got);
                        lt_tensor_read_f32(ref, want);
                        const bool same = memcmp(got, want, sizeof(float) * (size_t)(O * N)) == 0;
                        CHECK(same,
                              "rms_norm_mul_mat %s N=%lld glu %d, %d threads: not the chain's",
                              lt_type_name(types[ti]), (long long)N, glu, nth);
                        bad += !same;
                    } else {
                        bad++;
                    }
                    free(ra);
                    free(rx);
                    free(rw);
                    free(want);
                    free(got);
                    lt_ctx_free(ctx);
                }
    printf("rms_norm_mul_mat: %d runs, %d bad\n", runs, bad);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *x = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 3),
                     *w = lt_new_tensor_1d(ctx, LT_TYPE_F32, 8);
    CHECK(lt_rms_norm_mul_mat(ctx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 5), x, w, 1e-6f, true) ==
              NULL,
          "odd rows for glu");
    CHECK(strstr(lt_last_error(), "rms_norm_mul_mat") != NULL, "%s", lt_last_error());
    CHECK(lt_rms_norm_mul_mat(ctx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 4), x,
                              lt_new_tensor_1d(ctx, LT_TYPE_F32, 7), 1e-6f, false) == NULL,
          "a weight of the wrong length");
    CHECK(lt_rms_norm_mul_mat(ctx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 4),
                              lt_new_tensor_2d(ctx, LT_TYPE_F16, 8, 3), w, 1e-6f, false) == NULL,
          "half columns");
    lt_ctx_free(ctx);
}

/* MUL_MAT_ADD_RMS_NORM: the product added to a residual and normed in one node equals
 * ADD_RMS_NORM of the residual and MUL_MAT's product bit for bit (both halves), over weight
 * types, column counts, a contiguous and a transposed residual, 1 and 2 threads; and its
 * refusals (a 3-d weight, a residual of another shape, half columns) */
static void test_mul_mat_add_rms_norm(void)
{
    static const enum lt_type types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16, LT_TYPE_Q8_0,
                                         LT_TYPE_Q4_1};
    static const int64_t ns[] = {1, 3, 9};
    int runs = 0, bad = 0;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
            for (int lay = 0; lay < 2; lay++)
                for (int nth = 1; nth <= 2; nth++, runs++) {
                    const int64_t K = 256, M = 40, N = ns[ni];
                    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20});
                    int64_t bne[4] = {K, N, 1, 1}, xne[4] = {M, N, 1, 1}, wne[4] = {M, 1, 1, 1};
                    float *ra = malloc(sizeof(float) * (size_t)(K * M));
                    float *rb = malloc(sizeof(float) * (size_t)(K * N));
                    float *rx = malloc(sizeof(float) * (size_t)(M * N));
                    float *rw = malloc(sizeof(float) * (size_t)M);
                    float *want = malloc(sizeof(float) * (size_t)(2 * M * N));
                    float *got = malloc(sizeof(float) * (size_t)(2 * M * N));
                    struct lt_tensor *a = random_weight(ctx, types[ti], K, M, ra);
                    struct lt_tensor *b = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, bne);
                    struct lt_tensor *x =
                        nn_make(ctx, LT_TYPE_F32, lay ? NN_TRANSPOSED : NN_CONTIG, xne);
                    struct lt_tensor *w = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, wne);
                    nn_fill_rand(b, rb, 1.0f);
                    nn_fill_rand(x, rx, 1.0f);
                    nn_fill_rand(w, rw, 1.0f);
                    struct lt_tensor *f = lt_mul_mat_add_rms_norm(ctx, a, b, x, w, 1e-6f);
                    struct lt_tensor *p = lt_mul_mat(ctx, a, b);
                    struct lt_tensor *r = p ? lt_add_rms_norm(ctx, x, p, w, 1e-6f) : NULL;
                    char reason[LT_REASON_MAX] = "";
                    bool ok = f && r && f->op == LT_OP_MUL_MAT_ADD_RMS_NORM && f->ne[0] == M &&
                              f->ne[1] == N && f->ne[2] == 2 &&
                              lt_cpu_supports_op(f, reason, sizeof(reason)) &&
                              nn_run(ctx, f, nth) == LT_OK && nn_run(ctx, r, nth) == LT_OK;
                    CHECK(ok, "mul_mat_add_rms_norm %s N=%lld: %s %s", lt_type_name(types[ti]),
                          (long long)N, reason, lt_last_error());
                    if (ok) {
                        lt_tensor_read_f32(f, got);
                        lt_tensor_read_f32(r, want);
                        const bool same =
                            memcmp(got, want, sizeof(float) * (size_t)(2 * M * N)) == 0;
                        CHECK(same,
                              "mul_mat_add_rms_norm %s N=%lld %s, %d threads: not "
                              "ADD_RMS_NORM's values",
                              lt_type_name(types[ti]), (long long)N,
                              nn_layout_names[lay ? NN_TRANSPOSED : NN_CONTIG], nth);
                        bad += !same;
                    } else {
                        bad++;
                    }
                    free(ra);
                    free(rb);
                    free(rx);
                    free(rw);
                    free(want);
                    free(got);
                    lt_ctx_free(ctx);
                }
    printf("mul_mat_add_rms_norm: %d runs, %d bad\n", runs, bad);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *b = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 3);
    struct lt_tensor *x = lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 3);
    struct lt_tensor *w = lt_new_tensor_1d(ctx, LT_TYPE_F32, 4);
    CHECK(lt_mul_mat_add_rms_norm(ctx, lt_new_tensor_3d(ctx, LT_TYPE_F32, 8, 4, 2), b, x, w,
                                  1e-6f) == NULL,
          "a 3-d weight");
    CHECK(strstr(lt_last_error(), "mul_mat_add_rms_norm") != NULL, "%s", lt_last_error());
    CHECK(lt_mul_mat_add_rms_norm(ctx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 5), b, x, w, 1e-6f) ==
              NULL,
          "a residual of another shape");
    CHECK(lt_mul_mat_add_rms_norm(ctx, lt_new_tensor_2d(ctx, LT_TYPE_F16, 8, 4),
                                  lt_new_tensor_2d(ctx, LT_TYPE_F16, 8, 3), x, w, 1e-6f) == NULL,
          "half columns");
    struct lt_tensor *ok =
        lt_mul_mat_add_rms_norm(ctx, lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 4), b, x, w, 1e-6f);
    CHECK(ok && lt_add_rms_norm_out(ctx, ok) != NULL && lt_add_rms_norm_sum(ctx, ok) != NULL,
          "its halves as ADD_RMS_NORM's: %s", lt_last_error());
    lt_ctx_free(ctx);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Throughput of the shapes inference and training hit (printed, not asserted), on
 * LATHE_BENCH threads. */
static void bench_mul_mat(int nth)
{
    struct lt_backend *cpu = lt_backend_cpu_new(nth);
    struct {
        enum lt_type type;
        int64_t K, M, N;
    } shapes[] = {
        {LT_TYPE_F32, 576, 1536, 1},   {LT_TYPE_F16, 576, 1536, 1}, {LT_TYPE_BF16, 576, 1536, 1},
        {LT_TYPE_F32, 576, 1536, 128}, {LT_TYPE_F16, 576, 1536, 128},
        /* a 1.5B model's FFN: weights far larger than the caches */
        {LT_TYPE_F32, 1536, 8960, 1},  {LT_TYPE_F16, 1536, 8960, 1}, {LT_TYPE_BF16, 1536, 8960, 1},
        {LT_TYPE_F32, 1536, 8960, 64}, {LT_TYPE_BF16, 1536, 8960, 64},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
        struct lt_tensor *a = lt_new_tensor_2d(ctx, shapes[i].type, shapes[i].K, shapes[i].M);
        struct lt_tensor *b = lt_new_tensor_2d(ctx, LT_TYPE_F32, shapes[i].K, shapes[i].N);
        memset(a->data, 0, lt_nbytes(a));
        memset(b->data, 0, lt_nbytes(b));
        struct lt_tensor *d = lt_mul_mat(ctx, a, b);
        struct lt_graph *g = lt_graph_new(ctx, 8);
        lt_graph_build(g, d);
        int reps = shapes[i].N == 1 ? 20 : 2;
        double dt = INFINITY; /* the best of 5 trials: the machine is shared */
        for (int trial = 0; trial < 5; trial++) {
            double t0 = now_s();
            for (int r = 0; r < reps; r++)
                lt_cpu_graph_compute(cpu, g);
            double t = (now_s() - t0) / reps;
            dt = t < dt ? t : dt;
        }
        double gflops = 2.0 * shapes[i].K * shapes[i].M * shapes[i].N / dt * 1e-9;
        double gbs = (double)lt_nbytes(a) / dt * 1e-9;
        printf("bench mul_mat %s K=%lld M=%lld N=%lld, %d threads: %.3f ms, %.1f GFLOP/s, %.1f "
               "GB/s of weights\n",
               lt_type_name(shapes[i].type), (long long)shapes[i].K, (long long)shapes[i].M,
               (long long)shapes[i].N, nth, dt * 1e3, gflops, gbs);
        lt_ctx_free(ctx);
    }
    lt_backend_free(cpu);
}

/* b broadcast along its columns (and heads): a view whose dim 1 (and 2) has stride 0 over
 * one stored row, as a repeated activation is. Small N takes the dot-product path, larger N
 * sgemm; both must read the single row, not rows past it. */
static void test_mul_mat_broadcast_b(void)
{
    static const enum lt_type types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16};
    static const int64_t ns[] = {1, 3, 8, 19};
    for (int t = 0; t < 3; t++)
        for (int ni = 0; ni < 4; ni++)
            for (int heads = 1; heads <= 2; heads++)
                for (int nth = 1; nth <= 2; nth++) {
                    const int64_t K = 64, M = 24, N = ns[ni];
                    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 4 << 20});
                    int64_t ane[4] = {K, M, 1, 1};
                    float *ra = malloc(sizeof(float) * (size_t)(K * M));
                    struct lt_tensor *a = nn_make(ctx, types[t], NN_CONTIG, ane);
                    struct lt_tensor *row = lt_new_tensor_4d(ctx, LT_TYPE_F32, K, 1, 1, 1);
                    struct lt_tensor *b =
                        row ? lt_view_4d(ctx, row, K, N, heads, 1, 0, 0, row->nb[3], 0) : NULL;
                    struct lt_tensor *d = a && b ? lt_mul_mat(ctx, a, b) : NULL;
                    CHECK(d != NULL, "broadcast b: %s", lt_last_error());
                    if (d) {
                        nn_fill_rand(a, ra, 1.0f);
                        for (int64_t k = 0; k < K; k++)
                            ((float *)row->data)[k] = (float)sin(0.37 * (double)k);
                    }
                    if (d && nn_run(ctx, d, nth) == LT_OK) {
                        double worst = 0;
                        for (int64_t h = 0; h < heads; h++)
                            for (int64_t n = 0; n < N; n++)
                                for (int64_t m = 0; m < M; m++) {
                                    double ref = 0;
                                    for (int64_t k = 0; k < K; k++)
                                        ref += (double)ra[m * K + k] * ((float *)row->data)[k];
                                    float got = ((float *)d->data)[(h * N + n) * M + m];
                                    double e = fabs(got - ref) / (1 + fabs(ref));
                                    worst = e > worst || e != e ? e : worst;
                                }
                        CHECK(worst < 2e-2, "mul_mat %s a, b broadcast over %lld columns x %d "
                              "heads, %d threads: worst error %g", lt_type_name(types[t]),
                              (long long)N, heads, nth, worst);
                    } else if (d) {
                        CHECK(0, "broadcast b: %s", lt_last_error());
                    }
                    free(ra);
                    lt_ctx_free(ctx);
                }
}

int main(void)
{
    nn_backends_init();
    test_mul_mat_layouts();
    test_mul_mat_q8_0();
    test_mul_mat_broadcast_b();
    test_mul_mat_refusals();
    test_mul_mat_acc();
    test_mul_mat_glu();
    test_rms_norm_mul_mat();
    test_mul_mat_add_rms_norm();
    if (getenv("LATHE_BENCH"))
        bench_mul_mat(atoi(getenv("LATHE_BENCH")) > 0 ? atoi(getenv("LATHE_BENCH")) : 2);
    nn_backends_free();
    return check_summary();
}
