/* quant_dot_impl.h (internal to quant_dot*.c): what the portable and the SIMD dot kernels
 * share: little-endian field reads of the weight blocks and the kernel tables.
 *
 * Block layouts are those of quant.h (GGUF's); offsets are spelled out here once. */
#ifndef LATHE_CORE_QUANT_DOT_IMPL_H
#define LATHE_CORE_QUANT_DOT_IMPL_H

#include <stdint.h>
#include <string.h>

#include "core/quant.h"
#include "core/quant_dot.h"

/* IEEE half at p (little-endian, maybe unaligned) to float, exactly: exponent and
 * mantissa shifted into a float's places are the value times 2^-112 (subnormals too). */
static inline float qd_f16(const uint8_t *p)
{
    uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    uint32_t sign = (h & 0x8000u) << 16, em = h & 0x7fffu, bits;
    float f;
    if (em >= 0x7c00u) {
        bits = sign | 0x7f800000u | (em & 0x3ffu) << 13;
    } else {
        bits = em << 13;
        memcpy(&f, &bits, 4);
        f *= 0x1p112f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    memcpy(&f, &bits, 4);
    return f;
}

static inline float qd_bf16(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint32_t qd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Scale and min of sub-block j (0..7) from the 12-byte field of Q4_K and Q5_K. */
static inline void qd_k4_scale_min(const uint8_t *sc, int j, int *scale, int *min)
{
    if (j < 4) {
        *scale = sc[j] & 63;
        *min = sc[j + 4] & 63;
    } else {
        *scale = (sc[j + 4] & 0x0f) | (sc[j - 4] >> 6) << 4;
        *min = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
    }
}

/* Kernel tables, indexed by enum lt_type; entries without .dot have no kernel. */
extern const struct lt_dot_kernel lt_dot_kernels_scalar[LT_TYPE_COUNT];
#if defined(__x86_64__) && defined(__GNUC__)
#define LT_QD_HAVE_AVX2 1
extern const struct lt_dot_kernel lt_dot_kernels_avx2[LT_TYPE_COUNT];
extern const struct lt_dot_kernel lt_dot_kernels_f32x_avx2[LT_TYPE_COUNT];
void lt_q8a_quantise_avx2(const float *x, struct lt_q8a_block *y, int64_t K);
#endif

#endif
