/* quant_dot_avx2.c: the dot kernels of quant_dot.c and the activation quantiser in AVX2,
 * FMA and F16C, for x86-64 CPUs that have them (chosen at run time by lt_simd_best; the
 * rest of the library is built for baseline x86-64, so this file alone is compiled for
 * that target, by the pragma below).
 *
 * Per block the integer dot is done 32 products at once: unsigned weight values (0..63)
 * times signed activations with maddubs (pairs summed to int16: at most 2 * 63 * 127, no
 * saturation), then madd against ones, or against the sub-block scale, to int32 lanes;
 * Q8_0's signed weights go through the sign trick (|w| times x with w's sign). The eight
 * int32 lanes are converted to float and multiply-added with the block's scale product,
 * so no horizontal sum is needed until the end of the row. Sums are the same as the
 * portable kernels'; only the order of float additions differs.
 *
 * Kernels take up to LT_DOT_MAX_X activation rows: the weight block is loaded and
 * unpacked once for all. Each kernel body is an always-inline function of a constant row
 * count, called from a switch, so the accumulators stay in registers; it loops over the
 * weight rows itself, so a call covers many. */
#include "core/quant_dot_impl.h"

#ifdef LT_QD_HAVE_AVX2

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include <float.h>
#include <immintrin.h>
#include <math.h>

#define QD_INLINE static inline __attribute__((always_inline))
/* the loops over activation rows run a constant 1..4 times: unrolled, their accumulators
 * stay in registers */
#define QD_UNROLL _Pragma("GCC unroll 4")

QD_INLINE float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

QD_INLINE float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QD_INLINE int hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* unsigned bytes u times signed bytes s, summed in fours, times the int16 factor f */
QD_INLINE __m256i dot_us8(__m256i u, __m256i s, __m256i f)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), f);
}

/* 16 bytes of packed nibbles as 32 values: low nibbles (elements 0..15) then high ones */
QD_INLINE __m256i nibbles32(const uint8_t *qs)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* bit l of qh as byte l: 16 when set, else 0 (bit 4 of the 5-bit formats). Each byte
 * takes the qh byte holding its bit, then tests that bit. */
QD_INLINE __m256i bit4_bytes(uint32_t qh)
{
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(16));
}

QD_INLINE const struct lt_q8a_block *xrow(const void *x, size_t stride, int j)
{
    return (const struct lt_q8a_block *)((const char *)x + (size_t)j * stride);
}

QD_INLINE __m256i x_qs(const struct lt_q8a_block *a)
{
    return _mm256_loadu_si256((const __m256i *)a->qs);
}

/* ---- 32-element formats; kind says how the weight block reads ---- */

enum q32_kind { Q32_4_0, Q32_4_1, Q32_5_0, Q32_5_1, Q32_8_0 };

/* Block ib of one weight row against nx activation rows, into accumulator set h. The
 * block's scale and offset (Q4_1, Q5_1; else the scale twice) are converted together, and
 * multiply the activation block's d and ds (adjacent floats) in one go: lane 0 scales the
 * integer dot, lane 1 is the correction term, summed in lane 1 of corr. */
QD_INLINE void q32_block(const uint8_t *w, const struct lt_q8a_block *a0, size_t xs, int64_t ib,
                         const int nx, __m256 (*acc)[2], __m128 (*corr)[2], const int h,
                         const enum q32_kind kind)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const bool has_min = kind == Q32_4_1 || kind == Q32_5_1;
    uint32_t dm_bits;
    memcpy(&dm_bits, w, 4); /* d, then m (with a min) or the first bytes of the quants */
    const __m128i dm_h =
        has_min ? _mm_cvtsi32_si128((int)dm_bits) : _mm_set1_epi16((short)(dm_bits & 0xffff));
    const __m128 dm = _mm_cvtph_ps(dm_h);
    __m256i q;
    switch (kind) {
    case Q32_4_0: q = nibbles32(w + 2); break;
    case Q32_4_1: q = nibbles32(w + 4); break;
    case Q32_5_0: q = _mm256_or_si256(nibbles32(w + 6), bit4_bytes(qd_u32(w + 2))); break;
    case Q32_5_1: q = _mm256_or_si256(nibbles32(w + 8), bit4_bytes(qd_u32(w + 4))); break;
    default: /* Q8_0: signed; |q| is the unsigned operand */
        q = _mm256_loadu_si256((const __m256i *)(w + 2));
        break;
    }
    const __m256i qa = kind == Q32_8_0 ? _mm256_sign_epi8(q, q) : q;
    QD_UNROLL for (int j = 0; j < nx; j++)
    {
        const struct lt_q8a_block *a = xrow(a0, xs, j) + ib;
        __m256i y = x_qs(a);
        if (kind == Q32_8_0)
            y = _mm256_sign_epi8(y, q);
        const __m256 p = _mm256_cvtepi32_ps(dot_us8(qa, y, ones));
        const __m128 d_ds = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)&a->d));
        const __m128 prod = _mm_mul_ps(dm, d_ds); /* d * a->d, (m or d) * a->ds */
        acc[j][h] = _mm256_fmadd_ps(p, _mm256_broadcastss_ps(prod), acc[j][h]);
        if (kind != Q32_8_0)
            corr[j][h] = _mm_add_ps(corr[j][h], prod);
    }
}

/* One weight row against nx activation rows. Even and odd blocks go to two accumulators
 * (and two corrections), so consecutive blocks' multiply-adds do not wait on each other;
 * the loop is unrolled by two so that the index is a constant. The order of additions is
 * the same for every nx (a row's result does not depend on the rows batched with it), at
 * the price of a few spills at nx = 3, 4. */
QD_INLINE void q32_row(int64_t K, const uint8_t *w, const void *x, size_t xs, const int nx,
                       float *res, const enum q32_kind kind, const size_t bsize)
{
    __m256 acc[LT_DOT_MAX_X][2];
    __m128 corr[LT_DOT_MAX_X][2];
    for (int j = 0; j < nx; j++) {
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
        corr[j][0] = corr[j][1] = _mm_setzero_ps();
    }
    const int64_t nb = K / 32;
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2, w += 2 * bsize) {
        q32_block(w, x, xs, ib, nx, acc, corr, 0, kind);
        q32_block(w + bsize, x, xs, ib + 1, nx, acc, corr, 1, kind);
    }
    if (ib < nb)
        q32_block(w, x, xs, ib, nx, acc, corr, 0, kind);
    for (int j = 0; j < nx; j++) {
        const float s = hsum_ps(_mm256_add_ps(acc[j][0], acc[j][1]));
        const float c = _mm_cvtss_f32(_mm_movehdup_ps(_mm_add_ps(corr[j][0], corr[j][1])));
        switch (kind) {
        case Q32_4_0: res[j] = s - 8.0f * c; break;
        case Q32_5_0: res[j] = s - 16.0f * c; break;
        case Q32_8_0: res[j] = s; break;
        default: res[j] = s + c; break;
        }
    }
}

QD_INLINE void q32_rows(int64_t K, const uint8_t *w, size_t ws, int64_t nw, const void *x,
                        size_t xs, const int nx, float *const *out, const enum q32_kind kind,
                        const size_t bsize)
{
    for (int64_t r = 0; r < nw; r++, w += ws) {
        float res[LT_DOT_MAX_X];
        q32_row(K, w, x, xs, nx, res, kind, bsize);
        for (int j = 0; j < nx; j++)
            out[j][r] = res[j];
    }
}

/* The row count made a constant for each body (so its accumulators stay in registers). */
QD_INLINE void q32_dot(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                       int nx, float *const *out, const enum q32_kind kind, const size_t bsize)
{
    switch (nx) {
    case 1: q32_rows(K, w, ws, nw, x, xs, 1, out, kind, bsize); break;
    case 2: q32_rows(K, w, ws, nw, x, xs, 2, out, kind, bsize); break;
    case 3: q32_rows(K, w, ws, nw, x, xs, 3, out, kind, bsize); break;
    default: q32_rows(K, w, ws, nw, x, xs, 4, out, kind, bsize); break;
    }
}

static void dot_q4_0(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    q32_dot(K, w, ws, nw, x, xs, nx, out, Q32_4_0, LT_BLOCK_Q4_0);
}

static void dot_q4_1(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    q32_dot(K, w, ws, nw, x, xs, nx, out, Q32_4_1, LT_BLOCK_Q4_1);
}

static void dot_q5_0(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    q32_dot(K, w, ws, nw, x, xs, nx, out, Q32_5_0, LT_BLOCK_Q5_0);
}

static void dot_q5_1(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    q32_dot(K, w, ws, nw, x, xs, nx, out, Q32_5_1, LT_BLOCK_Q5_1);
}

static void dot_q8_0(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    q32_dot(K, w, ws, nw, x, xs, nx, out, Q32_8_0, LT_BLOCK_Q8_0);
}

/* ---- quantised weights against F32 activations (the exact path: no activation rounding)
 * ----
 * Per 32 elements, sum(q * x) over the integer quants (converted to float in registers) is
 * multiplied by the scale once (Q4_K / Q5_K: the sub-block's d * sc; Q6_K: d * sc for each
 * half of 16), and the formats with a min add m * sum(x) (Q4_1, Q5_1) or take dmin * mn *
 * sum(x) off (Q4_K, Q5_K): the dequantised weights' dot up to float rounding, with nothing
 * written to memory, where the dequantise + BLAS path writes and rereads 4 bytes a weight.
 * The x block sums are computed once per call, for all the weight rows it covers. */

/* The formats; the first five are q32_kind's, so q32_signed reads their quants. */
enum fx_kind {
    FX_4_0 = Q32_4_0,
    FX_4_1 = Q32_4_1,
    FX_5_0 = Q32_5_0,
    FX_5_1 = Q32_5_1,
    FX_8_0 = Q32_8_0,
    FX_4_K,
    FX_5_K,
    FX_6_K
};

/* the 32 quants of a block, minus the format's offset (8 for Q4_0, 16 for Q5_0), as signed
 * bytes: elements 0..15 in the low lane, 16..31 in the high one */
QD_INLINE __m256i q32_signed(const uint8_t *w, const enum q32_kind kind)
{
    switch (kind) {
    case Q32_4_0: return _mm256_sub_epi8(nibbles32(w + 2), _mm256_set1_epi8(8));
    case Q32_4_1: return nibbles32(w + 4);
    case Q32_5_0:
        return _mm256_sub_epi8(_mm256_or_si256(nibbles32(w + 6), bit4_bytes(qd_u32(w + 2))),
                               _mm256_set1_epi8(16));
    case Q32_5_1: return _mm256_or_si256(nibbles32(w + 8), bit4_bytes(qd_u32(w + 4)));
    default: return _mm256_loadu_si256((const __m256i *)(w + 2));
    }
}

/* sum of 32 floats at xk */
QD_INLINE float sum32(const float *xk)
{
    return hsum_ps(_mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xk), _mm256_loadu_ps(xk + 8)),
                                 _mm256_add_ps(_mm256_loadu_ps(xk + 16), _mm256_loadu_ps(xk + 24))));
}

/* sum over 32 elements of q * x (q as 32 signed bytes), as two halves of 16 elements */
QD_INLINE void q32_times_x(__m256i q, const float *xk, __m256 *first, __m256 *second)
{
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    const __m256 q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    const __m256 q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    *first = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xk + 8), _mm256_mul_ps(q0, _mm256_loadu_ps(xk)));
    *second = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xk + 24),
                              _mm256_mul_ps(q2, _mm256_loadu_ps(xk + 16)));
}

/* Most blocks of 32 a row may have for its x block sums to be precomputed (8 KiB of stack
 * at four activation rows); longer rows sum each block as they go. */
#define FX_MAX_BLOCKS 512

/* Accumulators of one weight row against nx activation rows: the scaled sums in a vector,
 * the min terms in a float. xsum[j][b]: block b's sum of activation row j, or NULL. */
struct fx_acc {
    __m256 acc[LT_DOT_MAX_X];
    float macc[LT_DOT_MAX_X];
};

/* 32 quants q of scale s (and min term m, times the block sum, when has_min) at element k */
QD_INLINE void fx_part(struct fx_acc *a, const float *const *xr, const int nx,
                       float (*xsum)[FX_MAX_BLOCKS], int64_t k, __m256i q, __m256 s, float m,
                       bool has_min)
{
    QD_UNROLL for (int j = 0; j < nx; j++)
    {
        __m256 p0, p1;
        q32_times_x(q, xr[j] + k, &p0, &p1);
        a->acc[j] = _mm256_fmadd_ps(s, _mm256_add_ps(p0, p1), a->acc[j]);
        if (has_min)
            a->macc[j] += m * (xsum ? xsum[j][k / 32] : sum32(xr[j] + k));
    }
}

/* A Q6_K super-block at k0: per 32 elements, two scales of 16 */
QD_INLINE void fx_q6_k(struct fx_acc *a, const uint8_t *w, const float *const *xr, const int nx,
                       int64_t k0)
{
    const uint8_t *ql = w, *qh = w + 128;
    const int8_t *sc = (const int8_t *)(w + 192);
    const float d = f16_at(w + 208);
    for (int i = 0; i < 2; i++) {
        const __m256i hv = _mm256_loadu_si256((const __m256i *)(qh + 32 * i));
        for (int t = 0; t < 4; t++) {
            const __m256i lv = _mm256_loadu_si256((const __m256i *)(ql + 64 * i + 32 * (t % 2)));
            const __m256i lo =
                _mm256_and_si256(t / 2 ? _mm256_srli_epi16(lv, 4) : lv, _mm256_set1_epi8(0x0f));
            const __m256i hi = _mm256_slli_epi16(
                _mm256_and_si256(_mm256_srli_epi16(hv, 2 * t), _mm256_set1_epi8(3)), 4);
            const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
            const __m256 s0 = _mm256_set1_ps(d * (float)sc[8 * i + 2 * t]);
            const __m256 s1 = _mm256_set1_ps(d * (float)sc[8 * i + 2 * t + 1]);
            QD_UNROLL for (int j = 0; j < nx; j++)
            {
                __m256 p0, p1;
                q32_times_x(q, xr[j] + k0 + 128 * i + 32 * t, &p0, &p1);
                a->acc[j] = _mm256_fmadd_ps(s1, p1, _mm256_fmadd_ps(s0, p0, a->acc[j]));
            }
        }
    }
}

/* A Q4_K or Q5_K super-block at k0: eight sub-blocks of a scale and a min */
QD_INLINE void fx_q45_k(struct fx_acc *a, const uint8_t *w, const float *const *xr, const int nx,
                        float (*xsum)[FX_MAX_BLOCKS], int64_t k0, const bool five)
{
    const float d = f16_at(w), dmin = f16_at(w + 2);
    const uint8_t *sc = w + 4, *qs = w + (five ? 48 : 16);
    const __m256i hv = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
    for (int sb = 0; sb < 8; sb++) {
        int scale, min;
        qd_k4_scale_min(sc, sb, &scale, &min);
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (sb / 2)));
        __m256i q = _mm256_and_si256(sb % 2 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
        if (five)
            q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, sb),
                                                                      _mm256_set1_epi8(1)),
                                                     4));
        fx_part(a, xr, nx, xsum, k0 + 32 * sb, q, _mm256_set1_ps(d * (float)scale),
                -(dmin * (float)min), true);
    }
}

QD_INLINE void fx_row(int64_t K, const uint8_t *w, const float *const *xr, const int nx,
                      float (*xsum)[FX_MAX_BLOCKS], float *res, const enum fx_kind kind,
                      const size_t bsize)
{
    struct fx_acc a;
    for (int j = 0; j < nx; j++) {
        a.acc[j] = _mm256_setzero_ps();
        a.macc[j] = 0.0f;
    }
    if (kind == FX_6_K || kind == FX_4_K || kind == FX_5_K) {
        for (int64_t k0 = 0; k0 < K; k0 += 256, w += bsize)
            if (kind == FX_6_K)
                fx_q6_k(&a, w, xr, nx, k0);
            else
                fx_q45_k(&a, w, xr, nx, xsum, k0, kind == FX_5_K);
    } else {
        const bool has_min = kind == FX_4_1 || kind == FX_5_1;
        for (int64_t k = 0; k < K; k += 32, w += bsize)
            fx_part(&a, xr, nx, xsum, k, q32_signed(w, (enum q32_kind)kind),
                    _mm256_set1_ps(f16_at(w)), has_min ? f16_at(w + 2) : 0.0f, has_min);
    }
    for (int j = 0; j < nx; j++)
        res[j] = hsum_ps(a.acc[j]) + a.macc[j];
}

QD_INLINE void fx_rows(int64_t K, const uint8_t *w, size_t ws, int64_t nw, const void *x,
                       size_t xs, const int nx, float *const *out, const enum fx_kind kind,
                       const size_t bsize)
{
    const float *xr[LT_DOT_MAX_X];
    float xsum[LT_DOT_MAX_X][FX_MAX_BLOCKS];
    const bool pre = (kind == FX_4_1 || kind == FX_5_1 || kind == FX_4_K || kind == FX_5_K) &&
                     K / 32 <= FX_MAX_BLOCKS;
    for (int j = 0; j < nx; j++) {
        xr[j] = (const float *)((const char *)x + (size_t)j * xs);
        for (int64_t b = 0; pre && b < K / 32; b++)
            xsum[j][b] = sum32(xr[j] + 32 * b);
    }
    for (int64_t r = 0; r < nw; r++, w += ws) {
        float res[LT_DOT_MAX_X];
        fx_row(K, w, xr, nx, pre ? xsum : NULL, res, kind, bsize);
        for (int j = 0; j < nx; j++)
            out[j][r] = res[j];
    }
}

QD_INLINE void fx_dot(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                      int nx, float *const *out, const enum fx_kind kind, const size_t bsize)
{
    switch (nx) {
    case 1: fx_rows(K, w, ws, nw, x, xs, 1, out, kind, bsize); break;
    case 2: fx_rows(K, w, ws, nw, x, xs, 2, out, kind, bsize); break;
    case 3: fx_rows(K, w, ws, nw, x, xs, 3, out, kind, bsize); break;
    default: fx_rows(K, w, ws, nw, x, xs, 4, out, kind, bsize); break;
    }
}

static void dotf_q4_0(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                      int nx, float *const *out)
{
    fx_dot(K, w, ws, nw, x, xs, nx, out, FX_4_0, LT_BLOCK_Q4_0);
}

static void dotf_q4_1(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                      int nx, float *const *out)
{
    fx_dot(K, w, ws, nw, x, xs, nx, out, FX_4_1, LT_BLOCK_Q4_1);
}

static void dotf_q5_0(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                      int nx, float *const *out)
{
    fx_dot(K, w, ws, nw, x, xs, nx, out, FX_5_0, LT_BLOCK_Q5_0);
}

static void dotf_q5_1(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                      int nx, float *const *out)
{
    fx_dot(K, w, ws, nw, x, xs, nx, out, FX_5_1, LT_BLOCK_Q5_1);
}

static void dotf_q8_0(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                      int nx, float *const *out)
{
    fx_dot(K, w, ws, nw, x, xs, nx, out, FX_8_0, LT_BLOCK_Q8_0);
}

static void dotf_q4_k(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                      int nx, float *const *out)
{
    fx_dot(K, w, ws, nw, x, xs, nx, out, FX_4_K, LT_BLOCK_Q4_K);
}

static void dotf_q5_k(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                      int nx, float *const *out)
{
    fx_dot(K, w, ws, nw, x, xs, nx, out, FX_5_K, LT_BLOCK_Q5_K);
}

static void dotf_q6_k(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                      int nx, float *const *out)
{
    fx_dot(K, w, ws, nw, x, xs, nx, out, FX_6_K, LT_BLOCK_Q6_K);
}

const struct lt_dot_kernel lt_dot_kernels_f32x_avx2[LT_TYPE_COUNT] = {
    [LT_TYPE_Q4_0] = {dotf_q4_0, NULL, false, LT_QK4_0},
    [LT_TYPE_Q4_1] = {dotf_q4_1, NULL, false, LT_QK4_1},
    [LT_TYPE_Q5_0] = {dotf_q5_0, NULL, false, LT_QK5_0},
    [LT_TYPE_Q5_1] = {dotf_q5_1, NULL, false, LT_QK5_1},
    [LT_TYPE_Q8_0] = {dotf_q8_0, NULL, false, LT_QK8_0},
    [LT_TYPE_Q4_K] = {dotf_q4_k, NULL, false, LT_QK_K},
    [LT_TYPE_Q5_K] = {dotf_q5_k, NULL, false, LT_QK_K},
    [LT_TYPE_Q6_K] = {dotf_q6_k, NULL, false, LT_QK_K},
};

/* ---- K-quants ---- */

/* Q4_K (five_bits false) and Q5_K (true): sub-blocks 2p and 2p + 1 share 32 bytes of qs
 * (low and high nibbles: h = 0, 1); Q5_K's bit 4 of sub-block s is bit s of qh[l]. The
 * sums go to accumulator set ai (h and ai are constants in every call). */
QD_INLINE void q45k_sub(const uint8_t *w, const struct lt_q8a_block *a0, size_t xs, int64_t ib,
                        int p, const int h, const int nx, __m256 (*acc)[2], float (*corr)[2],
                        const int ai, const bool five_bits)
{
    const int s = 2 * p + h;
    const float d = f16_at(w), dmin = f16_at(w + 2);
    int sc, mn;
    qd_k4_scale_min(w + 4, s, &sc, &mn);
    __m256i q = _mm256_loadu_si256((const __m256i *)(w + (five_bits ? 48 : 16) + 32 * p));
    if (h)
        q = _mm256_srli_epi16(q, 4);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0x0f));
    if (five_bits) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 16));
        const __m256i bit = _mm256_set1_epi8((char)(1 << s));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    const __m256i f = _mm256_set1_epi16((short)sc);
    const float dm = dmin * (float)mn;
    QD_UNROLL for (int j = 0; j < nx; j++)
    {
        const struct lt_q8a_block *a = xrow(a0, xs, j) + ib * 8 + s;
        const __m256 pr = _mm256_cvtepi32_ps(dot_us8(q, x_qs(a), f));
        acc[j][ai] = _mm256_fmadd_ps(pr, _mm256_set1_ps(d * a->d), acc[j][ai]);
        corr[j][ai] += dm * a->ds;
    }
}

QD_INLINE void q45k_row(int64_t K, const uint8_t *w, const void *x, size_t xs, const int nx,
                        float *res, const bool five_bits)
{
    __m256 acc[LT_DOT_MAX_X][2];
    float corr[LT_DOT_MAX_X][2];
    for (int j = 0; j < nx; j++) {
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
        corr[j][0] = corr[j][1] = 0.0f;
    }
    const size_t bsize = five_bits ? LT_BLOCK_Q5_K : LT_BLOCK_Q4_K;
    for (int64_t ib = 0; ib < K / LT_QK_K; ib++, w += bsize) {
        for (int p = 0; p < 4; p++) {
            q45k_sub(w, x, xs, ib, p, 0, nx, acc, corr, 0, five_bits);
            q45k_sub(w, x, xs, ib, p, 1, nx, acc, corr, 1, five_bits);
        }
    }
    for (int j = 0; j < nx; j++)
        res[j] = hsum_ps(_mm256_add_ps(acc[j][0], acc[j][1])) - (corr[j][0] + corr[j][1]);
}

QD_INLINE void q45k_rows(int64_t K, const uint8_t *w, size_t ws, int64_t nw, const void *x,
                         size_t xs, const int nx, float *const *out, const bool five_bits)
{
    for (int64_t r = 0; r < nw; r++, w += ws) {
        float res[LT_DOT_MAX_X];
        q45k_row(K, w, x, xs, nx, res, five_bits);
        for (int j = 0; j < nx; j++)
            out[j][r] = res[j];
    }
}

QD_INLINE void q45k_dot(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                        int nx, float *const *out, const bool five_bits)
{
    switch (nx) {
    case 1: q45k_rows(K, w, ws, nw, x, xs, 1, out, five_bits); break;
    case 2: q45k_rows(K, w, ws, nw, x, xs, 2, out, five_bits); break;
    case 3: q45k_rows(K, w, ws, nw, x, xs, 3, out, five_bits); break;
    default: q45k_rows(K, w, ws, nw, x, xs, 4, out, five_bits); break;
    }
}

static void dot_q4_k(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    q45k_dot(K, w, ws, nw, x, xs, nx, out, false);
}

static void dot_q5_k(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    q45k_dot(K, w, ws, nw, x, xs, nx, out, true);
}

/* Q6_K: in half i, 32-element group s takes nibble s / 2 of ql[64 i + 32 (s % 2) + l] and
 * bits 2s, 2s + 1 of qh[32 i + l] (moved to bits 4, 5 by 16-bit shifts; the bits a shift
 * carries in from the neighbouring byte are masked off). Its two scales (per 16) multiply
 * the int16 pair sums of each half: low 128-bit lane, then high. s is a constant in every
 * call; groups alternate between two accumulators. */
QD_INLINE void q6k_group(const uint8_t *w, const struct lt_q8a_block *a0, size_t xs, int64_t ib,
                         int i, const int s, const int nx, __m256 (*acc)[2], float (*corr)[2])
{
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(w + 64 * i + 32 * (s % 2)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * i));
    const __m256i lo =
        s < 2 ? _mm256_and_si256(ql, low4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), low4);
    const __m256i hi = s == 0   ? _mm256_slli_epi16(qh, 4)
                       : s == 1 ? _mm256_slli_epi16(qh, 2)
                       : s == 2 ? qh
                                : _mm256_srli_epi16(qh, 2);
    const __m256i q = _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
    const int8_t *scales = (const int8_t *)(w + 192);
    const int sa = scales[8 * i + 2 * s], sb = scales[8 * i + 2 * s + 1];
    const __m256i f = _mm256_set_m128i(_mm_set1_epi16((short)sb), _mm_set1_epi16((short)sa));
    const float d = f16_at(w + 208);
    QD_UNROLL for (int j = 0; j < nx; j++)
    {
        const struct lt_q8a_block *a = xrow(a0, xs, j) + ib * 8 + 4 * i + s;
        const __m256 p = _mm256_cvtepi32_ps(dot_us8(q, x_qs(a), f));
        const float da = d * a->d;
        const int h = s & 1;
        acc[j][h] = _mm256_fmadd_ps(p, _mm256_set1_ps(da), acc[j][h]);
        corr[j][h] += da * (float)(sa * a->hs[0] + sb * a->hs[1]);
    }
}

QD_INLINE void q6k_row(int64_t K, const uint8_t *w, const void *x, size_t xs, const int nx,
                       float *res)
{
    __m256 acc[LT_DOT_MAX_X][2];
    float corr[LT_DOT_MAX_X][2];
    for (int j = 0; j < nx; j++) {
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
        corr[j][0] = corr[j][1] = 0.0f;
    }
    for (int64_t ib = 0; ib < K / LT_QK_K; ib++, w += LT_BLOCK_Q6_K) {
        for (int i = 0; i < 2; i++) {
            q6k_group(w, x, xs, ib, i, 0, nx, acc, corr);
            q6k_group(w, x, xs, ib, i, 1, nx, acc, corr);
            q6k_group(w, x, xs, ib, i, 2, nx, acc, corr);
            q6k_group(w, x, xs, ib, i, 3, nx, acc, corr);
        }
    }
    for (int j = 0; j < nx; j++)
        res[j] = hsum_ps(_mm256_add_ps(acc[j][0], acc[j][1])) - 32.0f * (corr[j][0] + corr[j][1]);
}

QD_INLINE void q6k_rows(int64_t K, const uint8_t *w, size_t ws, int64_t nw, const void *x,
                        size_t xs, const int nx, float *const *out)
{
    for (int64_t r = 0; r < nw; r++, w += ws) {
        float res[LT_DOT_MAX_X];
        q6k_row(K, w, x, xs, nx, res);
        for (int j = 0; j < nx; j++)
            out[j][r] = res[j];
    }
}

static void dot_q6_k(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    switch (nx) {
    case 1: q6k_rows(K, w, ws, nw, x, xs, 1, out); break;
    case 2: q6k_rows(K, w, ws, nw, x, xs, 2, out); break;
    case 3: q6k_rows(K, w, ws, nw, x, xs, 3, out); break;
    default: q6k_rows(K, w, ws, nw, x, xs, 4, out); break;
    }
}

/* ---- half and F32 weights: 16 at a time, converted in registers, two accumulators a
 * row ---- */

enum half_kind { HALF_F16, HALF_BF16, HALF_F32 };

/* 8 weights from element k on, as floats */
QD_INLINE __m256 half8(const uint8_t *w, int64_t k, const enum half_kind kind)
{
    if (kind == HALF_F32)
        return _mm256_loadu_ps((const float *)w + k);
    const __m128i h = _mm_loadu_si128((const __m128i *)(w + 2 * k));
    if (kind == HALF_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

QD_INLINE float half1(const uint8_t *w, int64_t k, const enum half_kind kind)
{
    if (kind == HALF_F32)
        return ((const float *)w)[k];
    uint16_t h;
    memcpy(&h, w + 2 * k, 2);
    return kind == HALF_BF16 ? qd_bf16(h) : _cvtsh_ss(h);
}

QD_INLINE void half_row(int64_t K, const uint8_t *w, const void *x, size_t xs, const int nx,
                        float *res, const enum half_kind kind)
{
    __m256 acc0[LT_DOT_MAX_X], acc1[LT_DOT_MAX_X];
    const float *xr[LT_DOT_MAX_X];
    for (int j = 0; j < nx; j++) {
        acc0[j] = acc1[j] = _mm256_setzero_ps();
        xr[j] = (const float *)((const char *)x + (size_t)j * xs);
    }
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m256 w0 = half8(w, k, kind), w1 = half8(w, k + 8, kind);
        QD_UNROLL for (int j = 0; j < nx; j++)
        {
            acc0[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr[j] + k), acc0[j]);
            acc1[j] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr[j] + k + 8), acc1[j]);
        }
    }
    for (int j = 0; j < nx; j++) {
        float s = hsum_ps(_mm256_add_ps(acc0[j], acc1[j]));
        for (int64_t t = k; t < K; t++)
            s += half1(w, t, kind) * xr[j][t];
        res[j] = s;
    }
}

QD_INLINE void half_rows(int64_t K, const uint8_t *w, size_t ws, int64_t nw, const void *x,
                         size_t xs, const int nx, float *const *out, const enum half_kind kind)
{
    for (int64_t r = 0; r < nw; r++, w += ws) {
        float res[LT_DOT_MAX_X];
        half_row(K, w, x, xs, nx, res, kind);
        for (int j = 0; j < nx; j++)
            out[j][r] = res[j];
    }
}

QD_INLINE void half_dot(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                        int nx, float *const *out, const enum half_kind kind)
{
    switch (nx) {
    case 1: half_rows(K, w, ws, nw, x, xs, 1, out, kind); break;
    case 2: half_rows(K, w, ws, nw, x, xs, 2, out, kind); break;
    case 3: half_rows(K, w, ws, nw, x, xs, 3, out, kind); break;
    default: half_rows(K, w, ws, nw, x, xs, 4, out, kind); break;
    }
}

static void dot_f16(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                    int nx, float *const *out)
{
    half_dot(K, w, ws, nw, x, xs, nx, out, HALF_F16);
}

static void dot_bf16(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                     int nx, float *const *out)
{
    half_dot(K, w, ws, nw, x, xs, nx, out, HALF_BF16);
}

static void dot_f32(int64_t K, const void *w, size_t ws, int64_t nw, const void *x, size_t xs,
                    int nx, float *const *out)
{
    half_dot(K, w, ws, nw, x, xs, nx, out, HALF_F32);
}

/* ---- half and F32 weights in columns: 16 (then 8) outputs at a time, every k ---- */

QD_INLINE void cols_n(int64_t K, const uint8_t *a, size_t as, int64_t m0, const float *const *xr,
                      const int nx, float *const *out, const int nv, const enum half_kind kind)
{
    __m256 acc[LT_DOT_MAX_X][2];
    for (int j = 0; j < nx; j++)
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++, a += as) {
        const __m256 w0 = half8(a, m0, kind);
        const __m256 w1 = nv == 2 ? half8(a, m0 + 8, kind) : w0;
        QD_UNROLL for (int j = 0; j < nx; j++)
        {
            const __m256 xb = _mm256_broadcast_ss(xr[j] + k);
            acc[j][0] = _mm256_fmadd_ps(w0, xb, acc[j][0]);
            if (nv == 2)
                acc[j][1] = _mm256_fmadd_ps(w1, xb, acc[j][1]);
        }
    }
    for (int j = 0; j < nx; j++) {
        _mm256_storeu_ps(out[j] + m0, acc[j][0]);
        if (nv == 2)
            _mm256_storeu_ps(out[j] + m0 + 8, acc[j][1]);
    }
}

QD_INLINE void cols_rows(int64_t K, int64_t M, const uint8_t *a, size_t as, const void *x,
                         size_t xs, const int nx, float *const *out, const enum half_kind kind)
{
    const float *xr[LT_DOT_MAX_X];
    for (int j = 0; j < nx; j++)
        xr[j] = (const float *)((const char *)x + (size_t)j * xs);
    int64_t m = 0;
    for (; m + 16 <= M; m += 16)
        cols_n(K, a, as, m, xr, nx, out, 2, kind);
    for (; m + 8 <= M; m += 8)
        cols_n(K, a, as, m, xr, nx, out, 1, kind);
    for (; m < M; m++)
        for (int j = 0; j < nx; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++)
                s += xr[j][k] * half1(a + k * as, m, kind);
            out[j][m] = s;
        }
}

QD_INLINE void cols_dot(int64_t K, int64_t M, const void *a, size_t as, const void *x, size_t xs,
                        int nx, float *const *out, const enum half_kind kind)
{
    switch (nx) {
    case 1: cols_rows(K, M, a, as, x, xs, 1, out, kind); break;
    case 2: cols_rows(K, M, a, as, x, xs, 2, out, kind); break;
    case 3: cols_rows(K, M, a, as, x, xs, 3, out, kind); break;
    default: cols_rows(K, M, a, as, x, xs, 4, out, kind); break;
    }
}

static void cols_f32(int64_t K, int64_t M, const void *a, size_t as, const void *x, size_t xs,
                     int nx, float *const *out)
{
    cols_dot(K, M, a, as, x, xs, nx, out, HALF_F32);
}

static void cols_f16(int64_t K, int64_t M, const void *a, size_t as, const void *x, size_t xs,
                     int nx, float *const *out)
{
    cols_dot(K, M, a, as, x, xs, nx, out, HALF_F16);
}

static void cols_bf16(int64_t K, int64_t M, const void *a, size_t as, const void *x, size_t xs,
                      int nx, float *const *out)
{
    cols_dot(K, M, a, as, x, xs, nx, out, HALF_BF16);
}

const struct lt_dot_kernel lt_dot_kernels_avx2[LT_TYPE_COUNT] = {
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

/* ---- activation quantiser: the same blocks as the portable one (same scale, the same
 * product x * id, rounded to nearest even) ---- */

void lt_q8a_quantise_avx2(const float *x, struct lt_q8a_block *y, int64_t K)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t ib = 0; ib < K / LT_Q8A_BLOCK; ib++, x += LT_Q8A_BLOCK, y++) {
        __m256 v[4], mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_and_ps(v[i], abs_mask));
            bad = _mm256_add_ps(bad, _mm256_sub_ps(v[i], v[i]));
        }
        memset(y, 0, sizeof(*y));
        if (_mm256_movemask_ps(_mm256_cmp_ps(bad, bad, _CMP_UNORD_Q))) {
            y->d = y->ds = NAN;
            continue;
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f >= FLT_MIN ? amax / 127.0f : 0.0f; /* 1 / d finite */
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvtps_epi32(_mm256_round_ps(
                _mm256_mul_ps(v[i], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const int s0 = hsum_i32(_mm256_add_epi32(q[0], q[1]));
        const int s1 = hsum_i32(_mm256_add_epi32(q[2], q[3]));
        __m256i p =
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, order);
        _mm256_storeu_si256((__m256i *)y->qs, p);
        y->d = d;
        y->hs[0] = (int16_t)s0;
        y->hs[1] = (int16_t)s1;
        y->ds = d * (float)(s0 + s1);
    }
}

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* LT_QD_HAVE_AVX2 */
