/* test_quant_dot.c: dot products straight from quantised and half weight rows
 * (src/core/quant_dot*.c) and MUL_MAT's decode path that uses them (src/ops/matmul.c).
 *
 * References are plain loops written here, in double: weights through the dequantisers
 * (tested bit-exact against gguf-py by test_quant), activations as given. Checked:
 *   - the activation quantiser: scale = max|x| / 127, every |x - d q| <= d / 2, the sums
 *     it stores, nan/inf blocks, and scalar == AVX2 byte for byte;
 *   - each kernel, every level this CPU runs, 1..4 rows at once: against the dot of the
 *     dequantised weights with the dequantised activations (the integer arithmetic: only
 *     float rounding may differ), and against the exact F32 dot within the activation
 *     rounding bound of quant_dot.h (and an rms error under 1e-2 of the rms result);
 *   - scalar and AVX2 kernels agree to 1e-6 of sum |w x|;
 *   - MUL_MAT on 1 and 2 threads, b in every layout, heads grouped: small N within the
 *     bound, N past the dot path's limit as exact as BLAS; small N is the dot kernel's
 *     result, and exact instead when the node has a gradient (training).
 * LATHE_BENCH=1 adds timings: kernel vs dequantise+sgemm over N (printed, not asserted). */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "core/quant.h"
#include "core/quant_dot.h"
#include "ops/op.h"
#include "ops_nn_util.h"

static const enum lt_type dot_types[] = {LT_TYPE_Q4_0, LT_TYPE_Q4_1, LT_TYPE_Q5_0, LT_TYPE_Q5_1,
                                         LT_TYPE_Q8_0, LT_TYPE_Q4_K, LT_TYPE_Q5_K, LT_TYPE_Q6_K,
                                         LT_TYPE_F16,  LT_TYPE_BF16, LT_TYPE_F32};
#define N_DOT_TYPES (sizeof(dot_types) / sizeof(dot_types[0]))

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = lt_fp32_to_fp16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Random weight rows of `type`: random bytes with sane (finite, mixed-sign) f16 scales
 * for the block types, random values in [-1, 1] for the half and F32 types. */
static void random_weights(enum lt_type type, void *dst, int64_t K, int64_t rows)
{
    const struct lt_type_traits *tt = lt_type_traits(type);
    uint8_t *p = dst;
    size_t bytes = (size_t)(K / tt->block_size) * tt->type_size * (size_t)rows;
    if (type == LT_TYPE_F32) {
        for (size_t i = 0; i < bytes / 4; i++)
            ((float *)dst)[i] = nn_rand();
        return;
    }
    if (!tt->is_quantized) {
        for (size_t i = 0; i < bytes / 2; i++) {
            uint16_t h =
                type == LT_TYPE_F16 ? lt_fp32_to_fp16(nn_rand()) : lt_fp32_to_bf16(nn_rand());
            memcpy(p + 2 * i, &h, 2);
        }
        return;
    }
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)((nn_rand() + 1.0f) * 127.99f);
    for (uint8_t *b = p; b < p + bytes; b += tt->type_size) {
        float d = 0.01f * nn_rand(), m = 0.05f * nn_rand();
        switch (type) {
        case LT_TYPE_Q4_1:
        case LT_TYPE_Q5_1:
            put_f16(b, d);
            put_f16(b + 2, m);
            break;
        case LT_TYPE_Q4_K:
        case LT_TYPE_Q5_K:
            put_f16(b, 0.001f * nn_rand());
            put_f16(b + 2, 0.002f * nn_rand());
            break;
        case LT_TYPE_Q6_K: put_f16(b + 208, 0.001f * nn_rand()); break;
        default: /* Q4_0, Q5_0, Q8_0 */ put_f16(b, d); break;
        }
    }
}

/* Activations uniform in [-1, 1]; with spread, some blocks scaled far up or down and one
 * all zero (the bound must hold for those; the rms error is only judged without). */
static void random_acts(float *x, int64_t n, bool spread)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t blk = i / 32;
        float s = !spread ? 1.0f : blk % 7 == 3 ? 50.0f : blk % 11 == 5 ? 1e-3f : 1.0f;
        x[i] = spread && blk % 13 == 9 ? 0.0f : s * nn_rand();
    }
}

static double max_d(double a, double b)
{
    return a > b ? a : b;
}

/* ---- the activation quantiser ---- */

static void test_quantiser(void)
{
    enum { K = 32 * 40 };
    static float x[K];
    static struct lt_q8a_block y[K / 32], z[K / 32];
    random_acts(x, K, true);
    x[5 * 32 + 7] = NAN;
    x[6 * 32 + 31] = INFINITY;
    for (int i = 0; i < 32; i++) /* d = 1 and x = k + 1/2: ties, to even in both levels */
        x[8 * 32 + i] = (float)(i - 16) + 0.5f;
    x[8 * 32] = -127.0f;
    for (int i = 0; i < 32; i++) /* tiny (subnormal) values: 1 / d would overflow */
        x[10 * 32 + i] = 1e-39f * (float)(i % 3);
    lt_q8a_quantise(x, y, K, LT_SIMD_SCALAR);
    int bad_err = 0, bad_sum = 0;
    for (int b = 0; b < K / 32; b++) {
        const float *xb = x + 32 * b;
        if (b == 5 || b == 6) {
            CHECK(isnan(y[b].d) && isnan(y[b].ds), "block %d holds a nan/inf: d %g", b, y[b].d);
            continue;
        }
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        if (b == 10) {
            CHECK(y[b].d == 0.0f && y[b].ds == 0.0f && y[b].qs[1] == 0,
                  "a block below 127 * FLT_MIN is zero: d %g", y[b].d);
            continue;
        }
        CHECK(y[b].d == amax / 127.0f, "block %d: d %g, max/127 %g", b, y[b].d, amax / 127.0f);
        int s[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
            double e = fabs((double)xb[i] - (double)y[b].d * y[b].qs[i]);
            bad_err += e > 0.5 * y[b].d * (1 + 1e-6) + 1e-30;
            s[i / 16] += y[b].qs[i];
        }
        bad_sum +=
            s[0] != y[b].hs[0] || s[1] != y[b].hs[1] || y[b].ds != y[b].d * (float)(s[0] + s[1]);
    }
    CHECK(bad_err == 0, "%d elements off by more than d/2", bad_err);
    CHECK(bad_sum == 0, "%d blocks with wrong sums", bad_sum);
    CHECK(y[9].d == 0.0f && y[9].qs[3] == 0, "an all-zero block is d = 0, q = 0");
    CHECK(y[8].d == 1.0f && y[8].qs[18] == 2 && y[8].qs[19] == 4 && y[8].qs[15] == 0,
          "ties to even: 2.5 -> %d, 3.5 -> %d, -0.5 -> %d", y[8].qs[18], y[8].qs[19], y[8].qs[15]);
    if (lt_simd_available(LT_SIMD_AVX2)) {
        lt_q8a_quantise(x, z, K, LT_SIMD_AVX2);
        int diff = 0;
        for (int b = 0; b < K / 32; b++)
            diff += memcmp(y[b].qs, z[b].qs, 32) != 0 || y[b].hs[0] != z[b].hs[0] ||
                    y[b].hs[1] != z[b].hs[1] ||
                    !((y[b].d == z[b].d && y[b].ds == z[b].ds) || (isnan(y[b].d) && isnan(z[b].d)));
        CHECK(diff == 0, "scalar and avx2 quantisers differ in %d blocks", diff);
    } else {
        printf("quantiser: avx2 not available here, scalar only\n");
    }
}

/* ---- kernels ---- */

struct dot_case {
    enum lt_type type;
    int64_t K, rows;
    bool spread; /* activations from random_acts(spread) */
    void *w;
    float *wf; /* dequantised, rows x K */
    float x[LT_DOT_MAX_X][1536];
    struct lt_q8a_block xq[LT_DOT_MAX_X][1536 / 32];
};

/* Checks every available level's kernel on c against the references. */
static void check_kernels(struct dot_case *c)
{
    const int64_t K = c->K;
    double worst_bound = 0, worst_int = 0, worst_lvl = 0, err2 = 0, ref2 = 0;
    size_t ws = lt_row_size(c->type, K);
    for (int nx = 1; nx <= LT_DOT_MAX_X; nx++) {
        /* all rows in one call, and the last rows again on their own */
        float all[LT_SIMD_COUNT][LT_DOT_MAX_X][8], one[LT_SIMD_COUNT][LT_DOT_MAX_X][8];
        for (int lvl = 0; lvl < LT_SIMD_COUNT; lvl++) {
            const struct lt_dot_kernel *k = lt_dot_kernel(c->type, (enum lt_simd)lvl);
            if (!k)
                continue;
            const void *xs = k->quantised_x ? (const void *)c->xq : (const void *)c->x;
            size_t stride = k->quantised_x ? sizeof(c->xq[0]) : sizeof(c->x[0]);
            float *o[LT_DOT_MAX_X], *o1[LT_DOT_MAX_X];
            for (int j = 0; j < nx; j++) {
                o[j] = all[lvl][j];
                o1[j] = one[lvl][j] + c->rows - 1;
            }
            k->dot(K, c->w, ws, c->rows, xs, stride, nx, o);
            k->dot(K, (const char *)c->w + (c->rows - 1) * ws, ws, 1, xs, stride, nx, o1);
            for (int j = 0; j < nx; j++)
                CHECK(memcmp(&all[lvl][j][c->rows - 1], &one[lvl][j][c->rows - 1], 4) == 0,
                      "%s %s: a row alone = the row among others", lt_type_name(c->type),
                      lt_simd_name((enum lt_simd)lvl));
            /* and the last activation row alone = it among nx (batch invariance) */
            float alone[8], *oa = alone;
            k->dot(K, c->w, ws, c->rows, (const char *)xs + (nx - 1) * stride, stride, 1, &oa);
            CHECK(memcmp(alone, all[lvl][nx - 1], sizeof(float) * (size_t)c->rows) == 0,
                  "%s %s: activation row %d alone = among %d", lt_type_name(c->type),
                  lt_simd_name((enum lt_simd)lvl), nx - 1, nx);
        }
        for (int64_t r = 0; r < c->rows; r++) {
            const float *wf = c->wf + r * K;
            float got[LT_SIMD_COUNT][LT_DOT_MAX_X];
            for (int lvl = 0; lvl < LT_SIMD_COUNT; lvl++)
                for (int j = 0; j < nx; j++)
                    got[lvl][j] = all[lvl][j][r];
            bool quant = lt_dot_kernel(c->type, LT_SIMD_SCALAR)->quantised_x;
            for (int j = 0; j < nx; j++) {
                double exact = 0, deq = 0, mag = 0, bound = 0;
                for (int64_t b = 0; b < K / 32; b++) {
                    double wabs = 0;
                    for (int i = 0; i < 32; i++) {
                        int64_t k = 32 * b + i;
                        double xh = quant ? (double)c->xq[j][b].d * c->xq[j][b].qs[i] : c->x[j][k];
                        exact += (double)wf[k] * c->x[j][k];
                        deq += (double)wf[k] * xh;
                        mag += fabs((double)wf[k] * xh);
                        wabs += fabs((double)wf[k]);
                    }
                    if (quant) {
                        float amax = 0;
                        for (int i = 0; i < 32; i++)
                            amax = fmaxf(amax, fabsf(c->x[j][32 * b + i]));
                        bound += 0.5 * (amax / 127.0) * wabs;
                    }
                }
                for (int64_t k = K / 32 * 32; k < K; k++) { /* half types' tails */
                    exact += (double)wf[k] * c->x[j][k];
                    deq += (double)wf[k] * c->x[j][k];
                    mag += fabs((double)wf[k] * c->x[j][k]);
                }
                double fl = 2e-6 * mag + 1e-30; /* float rounding of the partial sums */
                for (int lvl = 0; lvl < LT_SIMD_COUNT; lvl++) {
                    if (!lt_dot_kernel(c->type, (enum lt_simd)lvl))
                        continue;
                    double g = got[lvl][j];
                    worst_int = max_d(worst_int, fabs(g - deq) / fl);
                    worst_bound = max_d(worst_bound, fabs(g - exact) / (bound + fl));
                    err2 += (g - exact) * (g - exact);
                    ref2 += exact * exact;
                    if (g != g)
                        worst_int = worst_bound = INFINITY;
                }
                if (lt_dot_kernel(c->type, LT_SIMD_AVX2))
                    worst_lvl = max_d(worst_lvl,
                                      fabs((double)got[LT_SIMD_AVX2][j] - got[LT_SIMD_SCALAR][j]) /
                                          (1e-6 * mag + 1e-30));
            }
        }
    }
    double rel = sqrt(err2 / ref2);
    const char *tn = lt_type_name(c->type);
    CHECK(worst_int <= 1.0, "%s K=%lld: off the dequantised-activation dot by %g x 2e-6", tn,
          (long long)K, worst_int);
    CHECK(worst_bound <= 1.0, "%s K=%lld: %g x the activation rounding bound", tn, (long long)K,
          worst_bound);
    CHECK(c->spread || rel < 1e-2, "%s K=%lld: rms error %g of the rms output", tn, (long long)K,
          rel);
    CHECK(worst_lvl <= 1.0, "%s K=%lld: scalar and avx2 differ by %g x 1e-6 sum|wx|", tn,
          (long long)K, worst_lvl);
    printf("dot %-5s K=%-5lld %-7s rms error %.2e of rms y, %.2f of the bound; avx2-scalar %.2f of "
           "1e-6\n",
           tn, (long long)K, c->spread ? "spread" : "uniform", rel, worst_bound, worst_lvl);
}

static void test_kernels(void)
{
    static struct dot_case c;
    const int64_t Ks[] = {256, 1536, 40}; /* 40: half types only (a tail past 16s) */
    for (size_t t = 0; t < N_DOT_TYPES; t++) {
        for (size_t ki = 0; ki < 6; ki++) {
            enum lt_type type = dot_types[t];
            c.spread = ki >= 3;
            const struct lt_type_traits *tt = lt_type_traits(type);
            int64_t K = Ks[ki % 3];
            if (K % tt->block_size)
                continue;
            c.type = type;
            c.K = K;
            c.rows = 6;
            c.w = malloc(lt_row_size(type, K) * (size_t)c.rows);
            c.wf = malloc(sizeof(float) * (size_t)(K * c.rows));
            random_weights(type, c.w, K, c.rows);
            for (int64_t r = 0; r < c.rows; r++)
                tt->to_float((const char *)c.w + r * (int64_t)lt_row_size(type, K), c.wf + r * K,
                             K);
            for (int j = 0; j < LT_DOT_MAX_X; j++) {
                random_acts(c.x[j], K, c.spread);
                if (K % 32 == 0)
                    lt_q8a_quantise(c.x[j], c.xq[j], K, LT_SIMD_SCALAR);
            }
            check_kernels(&c);
            free(c.w);
            free(c.wf);
        }
    }
    /* a nan activation makes a nan result, as the exact sum would */
    uint8_t w[LT_BLOCK_Q4_0 * 2];
    random_weights(LT_TYPE_Q4_0, w, 64, 1);
    float x[64];
    struct lt_q8a_block xq[2];
    random_acts(x, 64, false);
    x[40] = NAN;
    for (int lvl = 0; lvl < LT_SIMD_COUNT; lvl++) {
        const struct lt_dot_kernel *k = lt_dot_kernel(LT_TYPE_Q4_0, (enum lt_simd)lvl);
        if (!k)
            continue;
        float out = 0, *o = &out;
        lt_q8a_quantise(x, xq, 64, (enum lt_simd)lvl);
        k->dot(64, w, sizeof(w), 1, xq, sizeof(xq), 1, &o);
        CHECK(isnan(out), "%s: nan in, %g out", lt_simd_name((enum lt_simd)lvl), out);
    }
    CHECK(lt_dot_kernel(LT_TYPE_Q2_K, LT_SIMD_SCALAR) == NULL &&
              lt_dot_kernel(LT_TYPE_Q8_K, LT_SIMD_SCALAR) == NULL,
          "q2_K and q8_K have no dot kernel (they take BLAS)");
}

static double mm_check(const float *af, const int64_t ane[4], const float *bf, const int64_t bne[4],
                       const float *got, bool quant, double rtol);

/* The column kernels (a stored transposed): every level against a double loop, over
 * widths that take the 16-wide, 8-wide and scalar parts, and MUL_MAT on a transposed a. */
static void test_cols(void)
{
    const enum lt_type types[] = {LT_TYPE_F32, LT_TYPE_F16, LT_TYPE_BF16};
    const int64_t Ms[] = {64, 29, 5}, Ks[] = {1, 37, 130};
    double worst = 0;
    for (int t = 0; t < 3; t++)
        for (int mi = 0; mi < 3; mi++)
            for (int ki = 0; ki < 3; ki++) {
                int64_t M = Ms[mi], K = Ks[ki], stride = M + 3; /* a row of a: M + 3 */
                size_t es = lt_type_traits(types[t])->type_size;
                char *a = malloc(es * (size_t)(stride * K));
                float *af = malloc(sizeof(float) * (size_t)(stride * K));
                float x[LT_DOT_MAX_X][130], y[LT_DOT_MAX_X][64];
                random_weights(types[t], a, stride * K, 1);
                lt_type_traits(types[t])->to_float(a, af, stride * K);
                for (int j = 0; j < LT_DOT_MAX_X; j++)
                    random_acts(x[j], K, false);
                for (int nx = 1; nx <= LT_DOT_MAX_X; nx++)
                    for (int lvl = 0; lvl < LT_SIMD_COUNT; lvl++) {
                        const struct lt_dot_kernel *k = lt_dot_kernel(types[t], (enum lt_simd)lvl);
                        if (!k)
                            continue;
                        float *o[LT_DOT_MAX_X];
                        for (int j = 0; j < nx; j++)
                            o[j] = y[j];
                        k->dot_cols(K, M, a, (size_t)stride * es, x, sizeof(x[0]), nx, o);
                        for (int j = 0; j < nx; j++)
                            for (int64_t m = 0; m < M; m++) {
                                double s = 0, mag = 0;
                                for (int64_t kk = 0; kk < K; kk++) {
                                    s += (double)x[j][kk] * af[kk * stride + m];
                                    mag += fabs((double)x[j][kk] * af[kk * stride + m]);
                                }
                                worst = max_d(worst, fabs(y[j][m] - s) / (2e-6 * mag + 1e-30));
                            }
                    }
                free(a);
                free(af);
            }
    CHECK(worst <= 1.0, "column kernels off by %g x 2e-6 of sum |w x|", worst);

    /* MUL_MAT with a transposed: a [K, M] viewed from storage [M, K] */
    for (int t = 0; t < 3; t++)
        for (int nth = 1; nth <= 2; nth++) {
            int64_t ane[4] = {45, 21, 2, 1}, bne[4] = {45, 3, 4, 1};
            struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 4 << 20});
            struct lt_tensor *a = nn_make(ctx, types[t], NN_TRANSPOSED, ane);
            struct lt_tensor *b = nn_make(ctx, LT_TYPE_F32, NN_CONTIG, bne);
            float af[45 * 21 * 2], bf[45 * 3 * 4], got[21 * 3 * 4];
            nn_fill_rand(a, af, 1.0f);
            nn_fill_rand(b, bf, 1.0f);
            struct lt_tensor *d = lt_mul_mat(ctx, a, b);
            CHECK(d && nn_run(ctx, d, nth) == LT_OK, "%s", lt_last_error());
            lt_tensor_read_f32(d, got);
            double r = mm_check(af, ane, bf, bne, got, false, 2e-6 * sqrt(45.0));
            CHECK(r <= 1.0, "mul_mat %s a transposed, %d threads: %g x allowed",
                  lt_type_name(types[t]), nth, r);
            lt_ctx_free(ctx);
        }
}

/* ---- MUL_MAT through the backend ---- */

/* max |got - ref| / allowed over the outputs; ref and allowed from plain loops: the exact
 * product, and the activation rounding bound (when quant) plus float rounding. */
static double mm_check(const float *af, const int64_t ane[4], const float *bf, const int64_t bne[4],
                       const float *got, bool quant, double rtol)
{
    int64_t K = ane[0], M = ane[1], N = bne[1], r2 = bne[2] / ane[2], r3 = bne[3] / ane[3];
    int64_t one[4] = {M, N, bne[2], bne[3]};
    double worst = 0;
    for (int64_t i3 = 0; i3 < bne[3]; i3++)
        for (int64_t i2 = 0; i2 < bne[2]; i2++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t m = 0; m < M; m++) {
                    double s = 0, mag = 0, bound = 0, wabs = 0;
                    float amax = 0;
                    for (int64_t k = 0; k < K; k++) {
                        double w = af[nn_idx(ane, k, m, i2 / r2, i3 / r3)];
                        double x = bf[nn_idx(bne, k, n, i2, i3)];
                        s += w * x;
                        mag += fabs(w * x);
                        wabs += fabs(w);
                        amax = fmaxf(amax, fabsf((float)x));
                        if (k % 32 == 31) {
                            bound += 0.5 * (amax / 127.0) * wabs;
                            wabs = amax = 0;
                        }
                    }
                    double allowed = (quant ? bound : 0) + rtol * mag + 1e-30;
                    double g = got[nn_idx(one, m, n, i2, i3)];
                    double r = fabs(g - s) / allowed;
                    worst = r > worst || g != g ? (g != g ? INFINITY : r) : worst;
                }
    return worst;
}

static void test_mul_mat(void)
{
    struct {
        enum lt_type type;
        int64_t K, M, N, a2, b2;
    } cases[] = {
        {LT_TYPE_Q4_1, 64, 37, 1, 1, 1},  {LT_TYPE_Q4_1, 64, 37, 3, 1, 2},
        {LT_TYPE_Q4_0, 96, 19, 1, 2, 6}, /* GQA: 3 b heads per a head */
        {LT_TYPE_Q8_0, 64, 21, 8, 1, 1}, /* the dot path's limit */
        {LT_TYPE_Q8_0, 64, 21, 9, 1, 1}, /* past it: BLAS, exact */
        {LT_TYPE_Q5_0, 64, 9, 2, 1, 1},   {LT_TYPE_Q5_1, 64, 9, 2, 1, 1},
        {LT_TYPE_Q4_K, 256, 13, 2, 1, 1}, {LT_TYPE_Q5_K, 256, 13, 1, 1, 1},
        {LT_TYPE_Q6_K, 512, 11, 5, 1, 1}, {LT_TYPE_F16, 40, 17, 2, 3, 6},
        {LT_TYPE_BF16, 72, 5, 1, 1, 2},   {LT_TYPE_F32, 33, 7, 2, 2, 4},
    };
    int runs = 0, bad = 0;
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const enum lt_type type = cases[ci].type;
        int64_t ane[4] = {cases[ci].K, cases[ci].M, cases[ci].a2, 1};
        int64_t bne[4] = {cases[ci].K, cases[ci].N, cases[ci].b2, 1};
        int64_t one[4] = {cases[ci].M, cases[ci].N, cases[ci].b2, 1};
        bool dot_path = cases[ci].N * (bne[2] / ane[2]) <= 8;
        bool quant = dot_path && lt_type_traits(type)->is_quantized;
        for (int lb = 0; lb < NN_LAYOUT_COUNT; lb++)
            for (int nth = 1; nth <= 2; nth++) {
                struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 4 << 20});
                struct lt_tensor *a = lt_new_tensor_4d(ctx, type, ane[0], ane[1], ane[2], 1);
                struct lt_tensor *b = nn_make(ctx, LT_TYPE_F32, (enum nn_layout)lb, bne);
                float *af = malloc(sizeof(float) * (size_t)nn_count(ane));
                float *bf = malloc(sizeof(float) * (size_t)nn_count(bne));
                float *got = malloc(sizeof(float) * (size_t)nn_count(one));
                random_weights(type, a->data, ane[0], ane[1] * ane[2]);
                lt_type_traits(type)->to_float(a->data, af, nn_count(ane));
                nn_fill_rand(b, bf, 1.0f);
                struct lt_tensor *d = lt_mul_mat(ctx, a, b);
                lt_status st = d ? nn_run(ctx, d, nth) : LT_ERR_INVALID;
                CHECK(st == LT_OK, "%s", lt_last_error());
                if (st == LT_OK) {
                    lt_tensor_read_f32(d, got);
                    double r = mm_check(af, ane, bf, bne, got, quant, 2e-6 * sqrt((double)ane[0]));
                    bad += !(r <= 1.0);
                    CHECK(r <= 1.0,
                          "mul_mat %s K=%lld M=%lld N=%lld heads %lld/%lld, b %s, %d "
                          "threads: %g x allowed",
                          lt_type_name(type), (long long)ane[0], (long long)ane[1],
                          (long long)bne[1], (long long)ane[2], (long long)bne[2],
                          nn_layout_names[lb], nth, r);
                }
                runs++;
                free(af);
                free(bf);
                free(got);
                lt_ctx_free(ctx);
            }
    }
    printf("mul_mat: %d runs (simd %s), %d bad\n", runs, lt_simd_name(lt_simd_best()), bad);
}

/* ---- optional timings ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One thread, K x M weights of `type`, N activation rows: the dot kernel (quantising the
 * rows first) against dequantising every row and one sgemm. */
static void bench(enum lt_type type, int64_t K, int64_t M)
{
    size_t rs = lt_row_size(type, K);
    char *w = malloc(rs * (size_t)M);
    float *wf = malloc(sizeof(float) * (size_t)(K * M));
    float *x = malloc(sizeof(float) * (size_t)(K * 16)),
          *y = malloc(sizeof(float) * (size_t)(M * 16));
    struct lt_q8a_block *xq = malloc(sizeof(*xq) * (size_t)(K / 32 * 16));
    random_weights(type, w, K, M);
    random_acts(x, K * 16, false);
    enum lt_simd lv = lt_simd_best();
    const struct lt_dot_kernel *k = lt_dot_kernel(type, lv);
    for (int N = 1; N <= 16; N *= 2) {
        double best_dot = INFINITY, best_blas = INFINITY;
        for (int trial = 0; trial < 5; trial++) {
            double t0 = now_s();
            for (int n = 0; n < N && k->quantised_x; n++)
                lt_q8a_quantise(x + n * K, xq + n * (K / 32), K, lv);
            const void *xs = k->quantised_x ? (const void *)xq : (const void *)x;
            size_t stride = lt_dot_x_row_size(k, K);
            for (int64_t m = 0; m < M; m += 16)
                for (int n0 = 0; n0 < N; n0 += LT_DOT_MAX_X) {
                    int nx = N - n0 < LT_DOT_MAX_X ? N - n0 : LT_DOT_MAX_X;
                    float *o[LT_DOT_MAX_X];
                    for (int j = 0; j < nx; j++)
                        o[j] = y + (n0 + j) * M + m;
                    k->dot(K, w + m * (int64_t)rs, rs, M - m < 16 ? M - m : 16,
                           (const char *)xs + n0 * stride, stride, nx, o);
                }
            double t1 = now_s();
            lt_type_traits(type)->to_float(w, wf, K * M);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, (int)M, (int)K, 1.0f, x, (int)K,
                        wf, (int)K, 0.0f, y, (int)M);
            double t2 = now_s();
            best_dot = fmin(best_dot, t1 - t0);
            best_blas = fmin(best_blas, t2 - t1);
        }
        printf("bench %s K=%lld M=%lld N=%2d (%s): dot %.3f ms, dequantise+sgemm %.3f ms\n",
               lt_type_name(type), (long long)K, (long long)M, N, lt_simd_name(lv), best_dot * 1e3,
               best_blas * 1e3);
    }
    free(w);
    free(wf);
    free(x);
    free(y);
    free(xq);
}

/* Which road MUL_MAT takes: small N with quantised a is the kernel's result exactly (the
 * int8 activations, not BLAS); the same node given a gradient (as autodiff does in a
 * training graph) is the exact F32 product instead. */
static void test_mul_mat_roads(void)
{
    const char *mode = getenv("LATHE_MATMUL_DOT");
    if (mode && strcmp(mode, "int8")) {
        printf("mul_mat roads: skipped (LATHE_MATMUL_DOT=%s)\n", mode);
        return;
    }
    enum { K = 128, M = 40, N = 3 };
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 4 << 20});
    struct lt_tensor *a = lt_new_tensor_2d(ctx, LT_TYPE_Q4_1, K, M);
    struct lt_tensor *b = lt_new_tensor_2d(ctx, LT_TYPE_F32, K, N);
    static float af[K * M], bf[K * N], got[M * N], kern[N][M];
    random_weights(LT_TYPE_Q4_1, a->data, K, M);
    lt_type_traits(LT_TYPE_Q4_1)->to_float(a->data, af, K * M);
    nn_fill_rand(b, bf, 1.0f);
    struct lt_q8a_block xq[N][K / 32];
    float *o[N];
    for (int n = 0; n < N; n++) {
        lt_q8a_quantise(bf + n * K, xq[n], K, lt_simd_best());
        o[n] = kern[n];
    }
    lt_dot_kernel(LT_TYPE_Q4_1, lt_simd_best())
        ->dot(K, a->data, lt_row_size(LT_TYPE_Q4_1, K), M, xq, sizeof(xq[0]), N, o);
    int64_t ane[4] = {K, M, 1, 1}, bne[4] = {K, N, 1, 1};
    for (int nth = 1; nth <= 2; nth++) {
        struct lt_tensor *d = lt_mul_mat(ctx, a, b);
        CHECK(d && nn_run(ctx, d, nth) == LT_OK, "%s", lt_last_error());
        lt_tensor_read_f32(d, got);
        CHECK(memcmp(got, kern, sizeof(got)) == 0, "%d threads: N = %d is the dot kernel's", nth,
              N);
        double r = mm_check(af, ane, bf, bne, got, false, 1e-5);
        CHECK(r > 1.0, "and not the exact product (%g x 1e-5 of sum |w x| off)", r);
        struct lt_tensor *dg = lt_mul_mat(ctx, a, b);
        dg->grad = lt_dup_tensor(ctx, dg); /* what autodiff gives a node it differentiates */
        CHECK(nn_run(ctx, dg, nth) == LT_OK, "%s", lt_last_error());
        lt_tensor_read_f32(dg, got);
        r = mm_check(af, ane, bf, bne, got, false, 1e-5);
        CHECK(r <= 1.0, "%d threads: with a gradient it is exact (%g x 1e-5 of sum |w x|)", nth, r);
    }
    lt_ctx_free(ctx);
}

/* ---- F32-activation kernels of the exact path (lt_dot_kernel_f32x) ---- */

static void test_f32x_kernels(void)
{
    static const enum lt_type q32[] = {LT_TYPE_Q4_0, LT_TYPE_Q4_1, LT_TYPE_Q5_0, LT_TYPE_Q5_1,
                                       LT_TYPE_Q8_0, LT_TYPE_Q4_K, LT_TYPE_Q5_K, LT_TYPE_Q6_K};
    /* K up to 16640: past 512 blocks of 32 the kernels sum x's blocks as they go */
    static float x[LT_DOT_MAX_X][16640], wf[8 * 16640];
    static uint8_t w[8 * 16640 * 2];
    const int64_t rows = 8;
    for (size_t t = 0; t < sizeof(q32) / sizeof(q32[0]); t++) {
        const struct lt_dot_kernel *k = lt_dot_kernel_f32x(q32[t], LT_SIMD_AVX2);
        CHECK(lt_dot_kernel_f32x(q32[t], LT_SIMD_SCALAR) == NULL,
              "%s: no scalar F32-activation kernel (dequantise + BLAS instead)",
              lt_type_name(q32[t]));
        if (!k) {
            CHECK(!lt_simd_available(LT_SIMD_AVX2), "%s: an AVX2 kernel", lt_type_name(q32[t]));
            continue;
        }
        CHECK(!k->quantised_x && k->k_multiple == lt_type_traits(q32[t])->block_size,
              "%s: F32 activations, whole blocks", lt_type_name(q32[t]));
        static const int64_t Ks[] = {256, 1536, 16640};
        for (int ki = 0; ki < 3; ki++) {
            const int64_t K = Ks[ki];
            const size_t ws = lt_row_size(q32[t], K);
            random_weights(q32[t], w, K, rows);
            for (int64_t r = 0; r < rows; r++)
                lt_type_traits(q32[t])->to_float(w + r * ws, wf + r * K, K);
            for (int j = 0; j < LT_DOT_MAX_X; j++)
                random_acts(x[j], K, j == 1);
            double worst = 0;
            for (int nx = 1; nx <= LT_DOT_MAX_X; nx++) {
                float got[LT_DOT_MAX_X][8], *o[LT_DOT_MAX_X];
                for (int j = 0; j < nx; j++)
                    o[j] = got[j];
                k->dot(K, w, ws, rows, x, sizeof(x[0]), nx, o);
                for (int j = 0; j < nx; j++)
                    for (int64_t r = 0; r < rows; r++) {
                        double ref = 0, mag = 0;
                        for (int64_t i = 0; i < K; i++) {
                            ref += (double)wf[r * K + i] * x[j][i];
                            mag += fabs((double)wf[r * K + i] * x[j][i]);
                        }
                        /* float sums, and d * q + m possibly fused (one rounding apart) */
                        double e = fabs(got[j][r] - ref) / (2e-6 * mag + 1e-30);
                        worst = e > worst || e != e ? e : worst;
                    }
            }
            CHECK(worst <= 1.0, "%s K=%lld: F32-activation dot off by %g x 2e-6 sum|wx|",
                  lt_type_name(q32[t]), (long long)K, worst);
            printf("dot f32x %-5s K=%-5lld %.2f of 2e-6 sum|wx|\n", lt_type_name(q32[t]),
                   (long long)K, worst);
        }
    }
    CHECK(lt_dot_kernel_f32x(LT_TYPE_Q2_K, LT_SIMD_AVX2) == NULL &&
              lt_dot_kernel_f32x(LT_TYPE_F16, LT_SIMD_SCALAR) ==
                  lt_dot_kernel(LT_TYPE_F16, LT_SIMD_SCALAR),
          "Q2_K has none; float weights' own kernel reads floats already");
}

int main(void)
{
    /* int8 activations are opt-in (src/ops/matmul.c); this test exercises them */
    setenv("LATHE_MATMUL_DOT", "int8", 0);
    nn_backends_init();
    printf("simd: %s\n", lt_simd_name(lt_simd_best()));
    test_quantiser();
    test_kernels();
    test_f32x_kernels();
    test_mul_mat();
    test_mul_mat_roads();
    test_cols();
    if (getenv("LATHE_BENCH")) {
        openblas_set_num_threads(1);
        bench(LT_TYPE_Q4_1, 576, 1536);
        bench(LT_TYPE_Q8_0, 576, 1536);
        bench(LT_TYPE_Q4_K, 1536, 576);
        bench(LT_TYPE_Q5_K, 1536, 576);
        bench(LT_TYPE_Q6_K, 1536, 576);
        bench(LT_TYPE_F16, 576, 1536);
    }
    nn_backends_free();
    return check_summary();
}
