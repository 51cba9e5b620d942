/* quant_dot.c: the portable dot kernels (quantised, half or F32 weight rows times
 * activation rows), the activation quantiser, and the choice of SIMD level at run time.
 * The AVX2 kernels are in quant_dot_avx2.c; both compute the same sums (see quant_dot.h
 * for the accuracy bound), differing only in the order of float additions.
 *
 * Every quantised kernel here follows one shape per activation block b (32 weights):
 *   acc  += (weight scale * d_b) * (float)(integer dot of the block's quantised values),
 *   corr += (weight offset or minimum) * ds_b   (ds_b = d_b * sum of the block's qs),
 * and returns acc plus (or minus) a multiple of corr. Weight values q are read unsigned
 * (0..15, 0..31, 0..63), so an offset like Q4_0's "q - 8" becomes the corr term; Q8_0 is
 * the one signed type. The integer dot of a block is exact: |q x| <= 127 * 127 * 32. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off") /* x * id then rounding, as the SIMD quantiser */
#endif

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/quant_dot_impl.h"

#ifdef LT_QD_HAVE_AVX2
#include <cpuid.h>
#endif

/* ---- activation quantiser ---- */

/* Round to nearest, ties to even, for |v| < 2^22: adding and removing 1.5 * 2^23 leaves
 * the float with no fraction bits (the default rounding mode decides, as the SIMD
 * rounding instruction does). */
static inline float round_even(float v)
{
    return (v + 0x1.8p23f) - 0x1.8p23f;
}

static void q8a_quantise_scalar(const float *x, struct lt_q8a_block *y, int64_t K)
{
    for (int64_t ib = 0; ib < K / LT_Q8A_BLOCK; ib++, x += LT_Q8A_BLOCK, y++) {
        float amax = 0.0f, bad = 0.0f;
        for (int i = 0; i < LT_Q8A_BLOCK; i++) {
            float a = fabsf(x[i]);
            amax = a > amax ? a : amax;
            bad += x[i] - x[i]; /* nan when x[i] is nan or infinite */
        }
        memset(y, 0, sizeof(*y));
        if (bad != 0.0f) { /* nan compares unequal to everything */
            y->d = y->ds = NAN;
            continue;
        }
        const float d = amax / 127.0f >= FLT_MIN ? amax / 127.0f : 0.0f; /* 1 / d finite */
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int s0 = 0, s1 = 0;
        for (int i = 0; i < LT_Q8A_BLOCK; i++) {
            int q = (int)round_even(x[i] * id);
            y->qs[i] = (int8_t)q;
            if (i < 16)
                s0 += q;
            else
                s1 += q;
        }
        y->d = d;
        y->hs[0] = (int16_t)s0;
        y->hs[1] = (int16_t)s1;
        y->ds = d * (float)(s0 + s1);
    }
}

/* ---- weight types with 32-element blocks ---- */

static inline const struct lt_q8a_block *xrow(const void *x, size_t stride, int j)
{
    return (const struct lt_q8a_block *)((const char *)x + (size_t)j * stride);
}

/* Q4_0: d, qs[16]; w = d * (q - 8) */
static void row_q4_0(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        const struct lt_q8a_block *a = xrow(x, xs, j);
        float acc = 0.0f, corr = 0.0f;
        for (int64_t ib = 0; ib < K / 32; ib++, b += LT_BLOCK_Q4_0, a++) {
            const float d = qd_f16(b);
            const uint8_t *qs = b + 2;
            int sumi = 0;
            for (int l = 0; l < 16; l++)
                sumi += (qs[l] & 0x0f) * a->qs[l] + (qs[l] >> 4) * a->qs[l + 16];
            acc += (d * a->d) * (float)sumi;
            corr += d * a->ds;
        }
        out[j] = acc - 8.0f * corr;
    }
}

/* Q4_1: d, m, qs[16]; w = d * q + m */
static void row_q4_1(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        const struct lt_q8a_block *a = xrow(x, xs, j);
        float acc = 0.0f, corr = 0.0f;
        for (int64_t ib = 0; ib < K / 32; ib++, b += LT_BLOCK_Q4_1, a++) {
            const float d = qd_f16(b), m = qd_f16(b + 2);
            const uint8_t *qs = b + 4;
            int sumi = 0;
            for (int l = 0; l < 16; l++)
                sumi += (qs[l] & 0x0f) * a->qs[l] + (qs[l] >> 4) * a->qs[l + 16];
            acc += (d * a->d) * (float)sumi;
            corr += m * a->ds;
        }
        out[j] = acc + corr;
    }
}

/* The 5-bit value of element l (0..31): nibble from qs, bit 4 from bit l of qh. */
static inline int q5_value(const uint8_t *qs, uint32_t qh, int l)
{
    int lo = l < 16 ? qs[l] & 0x0f : qs[l - 16] >> 4;
    return lo | (int)((qh >> l) & 1) << 4;
}

/* Q5_0: d, qh (u32), qs[16]; w = d * (q - 16) */
static void row_q5_0(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        const struct lt_q8a_block *a = xrow(x, xs, j);
        float acc = 0.0f, corr = 0.0f;
        for (int64_t ib = 0; ib < K / 32; ib++, b += LT_BLOCK_Q5_0, a++) {
            const float d = qd_f16(b);
            const uint32_t qh = qd_u32(b + 2);
            int sumi = 0;
            for (int l = 0; l < 32; l++)
                sumi += q5_value(b + 6, qh, l) * a->qs[l];
            acc += (d * a->d) * (float)sumi;
            corr += d * a->ds;
        }
        out[j] = acc - 16.0f * corr;
    }
}

/* Q5_1: d, m, qh (u32), qs[16]; w = d * q + m */
static void row_q5_1(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        const struct lt_q8a_block *a = xrow(x, xs, j);
        float acc = 0.0f, corr = 0.0f;
        for (int64_t ib = 0; ib < K / 32; ib++, b += LT_BLOCK_Q5_1, a++) {
            const float d = qd_f16(b), m = qd_f16(b + 2);
            const uint32_t qh = qd_u32(b + 4);
            int sumi = 0;
            for (int l = 0; l < 32; l++)
                sumi += q5_value(b + 8, qh, l) * a->qs[l];
            acc += (d * a->d) * (float)sumi;
            corr += m * a->ds;
        }
        out[j] = acc + corr;
    }
}

/* Q8_0: d, qs[32] (int8); w = d * q */
static void row_q8_0(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        const struct lt_q8a_block *a = xrow(x, xs, j);
        float acc = 0.0f;
        for (int64_t ib = 0; ib < K / 32; ib++, b += LT_BLOCK_Q8_0, a++) {
            const float d = qd_f16(b);
            const int8_t *qs = (const int8_t *)(b + 2);
            int sumi = 0;
            for (int l = 0; l < 32; l++)
                sumi += qs[l] * a->qs[l];
            acc += (d * a->d) * (float)sumi;
        }
        out[j] = acc;
    }
}

/* ---- K-quants: 256-element super-blocks; each 32-element sub-block is one activation
 * block ---- */

/* Q4_K: d, dmin, scales[12], qs[128]; sub-block s: w = d * sc_s * q - dmin * m_s, q the
 * nibble s % 2 of qs[32 * (s / 2) + l] */
static void row_q4_k(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        const struct lt_q8a_block *a = xrow(x, xs, j);
        float acc = 0.0f, corr = 0.0f;
        for (int64_t ib = 0; ib < K / LT_QK_K; ib++, b += LT_BLOCK_Q4_K) {
            const float d = qd_f16(b), dmin = qd_f16(b + 2);
            for (int s = 0; s < 8; s++, a++) {
                int sc, mn;
                qd_k4_scale_min(b + 4, s, &sc, &mn);
                const uint8_t *q = b + 16 + 32 * (s / 2);
                const int shift = 4 * (s % 2);
                int sumi = 0;
                for (int l = 0; l < 32; l++)
                    sumi += ((q[l] >> shift) & 0x0f) * a->qs[l];
                acc += (d * a->d) * (float)(sc * sumi);
                corr += (dmin * (float)mn) * a->ds;
            }
        }
        out[j] = acc - corr;
    }
}

/* Q5_K: d, dmin, scales[12], qh[32], qs[128]: Q4_K plus bit s of qh[l] as bit 4 */
static void row_q5_k(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        const struct lt_q8a_block *a = xrow(x, xs, j);
        float acc = 0.0f, corr = 0.0f;
        for (int64_t ib = 0; ib < K / LT_QK_K; ib++, b += LT_BLOCK_Q5_K) {
            const float d = qd_f16(b), dmin = qd_f16(b + 2);
            const uint8_t *qh = b + 16;
            for (int s = 0; s < 8; s++, a++) {
                int sc, mn;
                qd_k4_scale_min(b + 4, s, &sc, &mn);
                const uint8_t *q = b + 48 + 32 * (s / 2);
                const int shift = 4 * (s % 2);
                int sumi = 0;
                for (int l = 0; l < 32; l++)
                    sumi += (((q[l] >> shift) & 0x0f) | ((qh[l] >> s) & 1) << 4) * a->qs[l];
                acc += (d * a->d) * (float)(sc * sumi);
                corr += (dmin * (float)mn) * a->ds;
            }
        }
        out[j] = acc - corr;
    }
}

/* Q6_K: ql[128], qh[64], scales[16] (int8, one per 16 elements), d; element
 * 128 i + 32 s + l: w = d * sc * (q - 32), q = nibble s / 2 of ql[64 i + 32 (s % 2) + l]
 * with bits 2s, 2s + 1 of qh[32 i + l] above it */
static void row_q6_k(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const uint8_t *b = w;
        const struct lt_q8a_block *a = xrow(x, xs, j);
        float acc = 0.0f, corr = 0.0f;
        for (int64_t ib = 0; ib < K / LT_QK_K; ib++, b += LT_BLOCK_Q6_K) {
            const int8_t *scales = (const int8_t *)(b + 192);
            const float d = qd_f16(b + 208);
            for (int i = 0; i < 2; i++) {
                for (int s = 0; s < 4; s++, a++) {
                    const uint8_t *lo = b + 64 * i + 32 * (s % 2), *hi = b + 128 + 32 * i;
                    const int sa = scales[8 * i + 2 * s], sb = scales[8 * i + 2 * s + 1];
                    int half[2] = {0, 0};
                    for (int l = 0; l < 32; l++) {
                        int q = ((lo[l] >> (4 * (s / 2))) & 0x0f) | ((hi[l] >> (2 * s)) & 3) << 4;
                        half[l / 16] += q * a->qs[l];
                    }
                    const float da = d * a->d;
                    acc += da * (float)(sa * half[0] + sb * half[1]);
                    corr += da * (float)(sa * a->hs[0] + sb * a->hs[1]);
                }
            }
        }
        out[j] = acc - 32.0f * corr;
    }
}

/* ---- half and F32 weights times F32 activations ---- */

static void row_f16(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const uint8_t *h = w;
        const float *a = (const float *)((const char *)x + (size_t)j * xs);
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++)
            acc += qd_f16(h + 2 * k) * a[k];
        out[j] = acc;
    }
}

static void row_bf16(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const uint16_t *h = w;
        const float *a = (const float *)((const char *)x + (size_t)j * xs);
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++)
            acc += qd_bf16(h[k]) * a[k];
        out[j] = acc;
    }
}

static void row_f32(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out)
{
    for (int j = 0; j < nx; j++) {
        const float *h = w;
        const float *a = (const float *)((const char *)x + (size_t)j * xs);
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++)
            acc += h[k] * a[k];
        out[j] = acc;
    }
}

/* ---- weights in columns ---- */

static inline float elem(const uint8_t *p, int64_t m, enum lt_type type)
{
    if (type == LT_TYPE_F32) {
        float f;
        memcpy(&f, p + 4 * m, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * m, 2);
    return type == LT_TYPE_BF16 ? qd_bf16(h) : qd_f16(p + 2 * m);
}

static inline void cols(int64_t K, int64_t M, const void *a, size_t as, const void *x, size_t xs,
                        int nx, float *const *out, enum lt_type type)
{
    for (int j = 0; j < nx; j++) {
        const float *xr = (const float *)((const char *)x + (size_t)j * xs);
        for (int64_t m = 0; m < M; m++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc += xr[k] * elem((const uint8_t *)a + k * as, m, type);
            out[j][m] = acc;
        }
    }
}

static void cols_f32(int64_t K, int64_t M, const void *a, size_t as, const void *x, size_t xs,
                     int nx, float *const *out)
{
    cols(K, M, a, as, x, xs, nx, out, LT_TYPE_F32);
}

static void cols_f16(int64_t K, int64_t M, const void *a, size_t as, const void *x, size_t xs,
                     int nx, float *const *out)
{
    cols(K, M, a, as, x, xs, nx, out, LT_TYPE_F16);
}

static void cols_bf16(int64_t K, int64_t M, const void *a, size_t as, const void *x, size_t xs,
                      int nx, float *const *out)
{
    cols(K, M, a, as, x, xs, nx, out, LT_TYPE_BF16);
}

/* ---- many weight rows ---- */

typedef void (*row_fn)(int64_t K, const void *w, const void *x, size_t xs, int nx, float *out);

static inline void rows(row_fn f, int64_t K, const void *w, size_t ws, int64_t nw, const void *x,
                        size_t xs, int nx, float *const *out)
{
    float res[LT_DOT_MAX_X];
    for (int64_t r = 0; r < nw; r++) {
        f(K, (const char *)w + r * ws, x, xs, nx, res);
        for (int j = 0; j < nx; j++)
            out[j][r] = res[j];
    }
}

static void dot_q4_0(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    rows(row_q4_0, K, w, ws, nw, x, xs, nx, out);
}

static void dot_q4_1(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    rows(row_q4_1, K, w, ws, nw, x, xs, nx, out);
}

static void dot_q5_0(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    rows(row_q5_0, K, w, ws, nw, x, xs, nx, out);
}

static void dot_q5_1(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    rows(row_q5_1, K, w, ws, nw, x, xs, nx, out);
}

static void dot_q8_0(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    rows(row_q8_0, K, w, ws, nw, x, xs, nx, out);
}

static void dot_q4_k(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    rows(row_q4_k, K, w, ws, nw, x, xs, nx, out);
}

static void dot_q5_k(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    rows(row_q5_k, K, w, ws, nw, x, xs, nx, out);
}

static void dot_q6_k(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    rows(row_q6_k, K, w, ws, nw, x, xs, nx, out);
}

static void dot_f16(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                    int nx, float *const *out)
{
    rows(row_f16, K, w, ws, nw, x, xs, nx, out);
}

static void dot_f32(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                    int nx, float *const *out)
{
    rows(row_f32, K, w, ws, nw, x, xs, nx, out);
}

static void dot_bf16(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    rows(row_bf16, K, w, ws, nw, x, xs, nx, out);
}

const struct lt_dot_kernel lt_dot_kernels_scalar[LT_TYPE_COUNT] = {
    [LT_TYPE_Q4_0] = {dot_q4_0, NULL, true, LT_QK4_0},
    [LT_TYPE_Q4_1] = {dot_q4_1, NULL, true, LT_QK4_1},
    [LT_TYPE_Q5_0] = {dot_q5_0, NULL, true, LT_QK5_0},
    [LT_TYPE_Q5_1] = {dot_q5_1, NULL, true, LT_QK5_1},
    [LT_TYPE_Q8_0] = {dot_q8_0, NULL, true, LT_QK8_0},
    [LT_TYPE_Q4_K] = {dot_q4_k, NULL, true, LT_QK_K},
    [LT_TYPE_Q5_K] = {dot_q5_k, NULL, true, LT_QK_K},
    [LT_TYPE_Q6_K] = {dot_q6_k, NULL, true, LT_QK_K},
    [LT_TYPE_F16] = {dot_f16, cols_f16, false, 1},
    [LT_TYPE_BF16] = {dot_bf16, cols_bf16, false, 1},
    [LT_TYPE_F32] = {dot_f32, cols_f32, false, 1},
};

/* ---- the choice of level ---- */

static enum lt_simd simd_best = LT_SIMD_SCALAR;
static bool simd_ok[LT_SIMD_COUNT] = {true};
static pthread_once_t simd_once = PTHREAD_ONCE_INIT;

static void simd_detect(void)
{
#ifdef LT_QD_HAVE_AVX2
    /* __builtin_cpu_supports checks that the OS saves the AVX registers too; F16C (which
     * not every compiler's builtin knows) is CPUID leaf 1, ECX bit 29 */
    unsigned eax, ebx, ecx = 0, edx;
    bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
    __builtin_cpu_init();
    simd_ok[LT_SIMD_AVX2] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#endif
    const char *env = getenv("LATHE_SIMD");
    bool scalar_only = env && !strcmp(env, "scalar");
    simd_best = simd_ok[LT_SIMD_AVX2] && !scalar_only ? LT_SIMD_AVX2 : LT_SIMD_SCALAR;
}

enum lt_simd lt_simd_best(void)
{
    pthread_once(&simd_once, simd_detect);
    return simd_best;
}

bool lt_simd_available(enum lt_simd level)
{
    pthread_once(&simd_once, simd_detect);
    return level >= 0 && level < LT_SIMD_COUNT && simd_ok[level];
}

const char *lt_simd_name(enum lt_simd level)
{
    return level == LT_SIMD_AVX2 ? "avx2" : level == LT_SIMD_SCALAR ? "scalar" : "?";
}

const struct lt_dot_kernel *lt_dot_kernel(enum lt_type type, enum lt_simd level)
{
    if ((int)type < 0 || type >= LT_TYPE_COUNT || !lt_simd_available(level))
        return NULL;
    const struct lt_dot_kernel *k = &lt_dot_kernels_scalar[type];
#ifdef LT_QD_HAVE_AVX2
    if (level == LT_SIMD_AVX2)
        k = &lt_dot_kernels_avx2[type];
#endif
    return k->dot ? k : NULL;
}

const struct lt_dot_kernel *lt_dot_kernel_f32x(enum lt_type type, enum lt_simd level)
{
    if ((int)type < 0 || type >= LT_TYPE_COUNT || !lt_simd_available(level))
        return NULL;
#ifdef LT_QD_HAVE_AVX2
    if (level == LT_SIMD_AVX2 && lt_dot_kernels_f32x_avx2[type].dot)
        return &lt_dot_kernels_f32x_avx2[type];
#endif
    const struct lt_dot_kernel *k = lt_dot_kernel(type, level);
    return k && !k->quantised_x ? k : NULL;
}

size_t lt_dot_x_row_size(const struct lt_dot_kernel *k, int64_t K)
{
    return k->quantised_x ? (size_t)(K / LT_Q8A_BLOCK) * sizeof(struct lt_q8a_block)
                          : (size_t)K * sizeof(float);
}

void lt_q8a_quantise(const float *x, struct lt_q8a_block *y, int64_t K, enum lt_simd level)
{
#ifdef LT_QD_HAVE_AVX2
    if (level == LT_SIMD_AVX2 && lt_simd_available(LT_SIMD_AVX2)) {
        lt_q8a_quantise_avx2(x, y, K);
        return;
    }
#endif
    q8a_quantise_scalar(x, y, K);
}
