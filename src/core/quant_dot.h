/* quant_dot.h (internal): dot products straight from quantised (and half) weight rows, for
 * the matrix-vector products of decode and small batches.
 *
 * A weight row of a block-quantised type is never turned into floats. Instead the
 * activation row (F32) is quantised once, in blocks of 32, to int8 with one float scale a
 * block (an "lt_q8a" row), and each weight block meets the activation block under it in an
 * integer dot product; only one float multiply-add a block (two with the weight's minimum)
 * remains. F16, BF16 and F32 weight rows meet the F32 activations as they are (no
 * activation quantisation), converted to float in registers.
 *
 * Accuracy. Activation block b (32 elements) is stored as q_i = round(x_i / d_b) with
 * d_b = max|x_i| / 127, so |x_i - d_b q_i| <= d_b / 2. The weights are used exactly (as
 * the dequantisers give them). The dot of a weight row w with x is therefore off from the
 * exact sum(w_i x_i) by at most
 *     sum over blocks b of (d_b / 2) * sum_{i in b} |w_i|          (activation rounding)
 *   + a few float roundings of the block partial sums              (~1e-6 relative),
 * typically a few 1e-3 of the result for random data (the errors are independent and
 * partly cancel), which is what llama.cpp's Q8 activations give too. F32/F16/BF16 rows
 * carry only float rounding (sum order differs from a sequential loop). tests/test_quant_dot.c
 * checks the bound above per output, and that the scalar and SIMD kernels agree to 1e-6.
 *
 * Each kernel exists as portable C and, on x86-64, as AVX2+FMA(+F16C) code compiled with
 * target attributes and chosen at run time (lt_simd_best); the library itself is built
 * for baseline x86-64. */
#ifndef LATHE_CORE_QUANT_DOT_H
#define LATHE_CORE_QUANT_DOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/tensor.h"

#define LT_Q8A_BLOCK 32

/* One block of a quantised activation row: x_i ~ d * qs[i]. ds = d * (hs[0] + hs[1])
 * (the block sum of the quantised values, for weights with an offset or a minimum); hs[h]
 * is the integer sum of qs[16h .. 16h + 15] (Q6_K scales per 16). 48 bytes, so qs stays
 * 16-byte aligned in a row that is. */
struct lt_q8a_block {
    float d;
    float ds;
    int16_t hs[2];
    int32_t pad;
    int8_t qs[LT_Q8A_BLOCK];
};

enum lt_simd {
    LT_SIMD_SCALAR, /* portable C */
    LT_SIMD_AVX2,   /* x86-64 with AVX2, FMA and F16C */
    LT_SIMD_COUNT
};

/* The best level this CPU runs, decided once: LT_SIMD_AVX2 where the CPU has AVX2, FMA
 * and F16C, unless the environment says LATHE_SIMD=scalar. */
enum lt_simd lt_simd_best(void);
/* Whether `level` can run here (LT_SIMD_SCALAR always can). */
bool lt_simd_available(enum lt_simd level);
const char *lt_simd_name(enum lt_simd level);

/* The most activation rows one kernel call takes (each weight block is unpacked once for
 * all of them). */
#define LT_DOT_MAX_X 4

/* out[j][r] = dot(weight row r, activation row j) for r < nw, j < nx <= LT_DOT_MAX_X; rows
 * have K elements. Weight row r starts at w + r * w_stride bytes; activation row j at
 * x + j * x_stride bytes: lt_q8a blocks (K / 32 of them) when the kernel's quantised_x is
 * set, else K floats. Many weight rows a call keep the call and setup cost off each row
 * (a decode row of K = 576 is only 18 blocks). */
typedef void (*lt_dot_fn)(int64_t K, const void *w, size_t w_stride, int64_t nw, const void *x,
                          size_t x_stride, int nx, float *const *out);

/* The same products for weights stored the other way round (a transposed view: element
 * (k, m) at a + k * a_stride bytes + m elements): out[j][m] = sum over k < K of
 * x_j[k] * a(k, m), for m < M, j < nx <= LT_DOT_MAX_X, x rows K floats x_stride bytes
 * apart. Attention's product with V in decode has this shape. */
typedef void (*lt_dot_cols_fn)(int64_t K, int64_t M, const void *a, size_t a_stride,
                               const void *x, size_t x_stride, int nx, float *const *out);

struct lt_dot_kernel {
    lt_dot_fn dot;
    lt_dot_cols_fn dot_cols; /* F32, F16, BF16 only (NULL for block types) */
    bool quantised_x;        /* activations as lt_q8a rows (else F32) */
    int64_t k_multiple;      /* K must be a multiple of this (the weight's block size) */
};

/* The kernel for weights of `type` at `level`, or NULL when there is none (Q2_K, Q3_K,
 * Q8_1, Q8_K: those take the dequantise+BLAS path). F32 weights have one too (small
 * products skip BLAS's packing). A level this CPU cannot run also gives NULL. */
const struct lt_dot_kernel *lt_dot_kernel(enum lt_type type, enum lt_simd level);

/* A kernel for weights of `type` that takes F32 activations as they are (quantised_x
 * false), or NULL: for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K at AVX2, the
 * quants converted in registers and multiplied with the floats, scales and mins applied
 * per block (no activation rounding, so the exact path may use it); for float weights,
 * lt_dot_kernel's own. */
const struct lt_dot_kernel *lt_dot_kernel_f32x(enum lt_type type, enum lt_simd level);

/* Bytes of one activation row of K elements for kernel k (lt_q8a blocks or floats). */
size_t lt_dot_x_row_size(const struct lt_dot_kernel *k, int64_t K);

/* Quantises K floats (K a multiple of 32) into K / 32 lt_q8a blocks. Scalar and SIMD
 * give identical blocks (round to nearest even of x * (1 / d) in both). A block holding
 * a nan or an infinity gets d = nan and qs = 0, so the dots it enters are nan, as the
 * exact sum would be (or would be infinite). A block whose max |x| is below 127 * FLT_MIN
 * (~1.5e-36) is taken as zero (its 1 / d would overflow). */
void lt_q8a_quantise(const float *x, struct lt_q8a_block *y, int64_t K, enum lt_simd level);

#endif
