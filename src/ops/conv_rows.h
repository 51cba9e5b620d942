/* conv_rows.h (internal): the causal depthwise conv's sums over one channel of one sequence,
 * shared by SSM_CONV (ssm_conv.c) and CONV_SILU (conv_silu.c), so the two forms of the
 * conv add the same terms in the same order. A row x holds the K - 1 inputs before the
 * first step, then the T steps' inputs (L = T + K - 1 floats, unit stride); w holds the
 * channel's K taps; g the gradient of the T outputs. Sums are in float, as written. */
#ifndef LATHE_OPS_CONV_ROWS_H
#define LATHE_OPS_CONV_ROWS_H

#include <stdint.h>

/* Packed sequences: pos (NULL: none) holds each step's position within its own sequence,
 * and output t's tap k reaches back K - 1 - k steps, so it counts only when that is at most
 * pos[t] (it would read the sequence before); a skipped term is one a sequence alone would
 * add as w[k] * 0, so the sums are that sequence's. */
static inline int64_t lt_conv_first_tap(const int32_t *pos, int64_t K, int64_t t)
{
    return pos && pos[t] < K - 1 ? K - 1 - pos[t] : 0;
}

/* output t: sum_k w[k] x[t + k] */
static inline float lt_conv_at(const float *x, const float *w, int64_t K, int64_t t,
                               const int32_t *pos)
{
    float acc = 0;
    for (int64_t k = lt_conv_first_tap(pos, K, t); k < K; k++)
        acc += w[k] * x[t + k];
    return acc;
}

/* d x[u] = sum_k w[k] g[u - k] over 0 <= u - k < T (k in order) for u in [u0, u1), into
 * out[(u - u0) * stride] */
static inline void lt_conv_back_x(const float *w, const float *g, int64_t K, int64_t T, int64_t u0,
                                  int64_t u1, float *out, int64_t stride, const int32_t *pos)
{
    for (int64_t u = u0; u < u1; u++) {
        const int64_t k_lo = u - (T - 1) > 0 ? u - (T - 1) : 0, k_hi = u < K - 1 ? u : K - 1;
        float acc = 0;
        for (int64_t k = k_lo; k <= k_hi; k++)
            if (k >= lt_conv_first_tap(pos, K, u - k))
                acc += w[k] * g[u - k];
        out[(u - u0) * stride] = acc;
    }
}

/* d w[k] += sum_t g[t] x[t + k] (t in order, then added) */
static inline void lt_conv_back_w(const float *g, const float *x, int64_t K, int64_t T, float *dw,
                                  const int32_t *pos)
{
    for (int64_t k = 0; k < K; k++) {
        float acc = 0;
        for (int64_t t = 0; t < T; t++)
            if (k >= lt_conv_first_tap(pos, K, t))
                acc += g[t] * x[t + k];
        dw[k] += acc;
    }
}

#endif
