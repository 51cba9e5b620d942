/* quant.c: GGUF's block-quantised formats: dequantisers for the legacy 32-element blocks
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1) and the 256-element K-quants (Q2_K..Q8_K), and the
 * round-to-nearest reference quantisers for the legacy formats.
 *
 * Invariants that are not obvious:
 * - Results are bit-exact with ggml's reference C and the gguf package's numpy code. That
 *   needs each product and each sum rounded to float on its own: a fused multiply-add
 *   (which GNU C mode allows the compiler to form on FMA targets) changes the last bit of
 *   "d * q + m" and, in a quantiser, can move a value across a rounding boundary. The
 *   pragmas below switch contraction off for this file.
 * - The order of the float operations copies the reference: (d * sc) * q, never
 *   d * (sc * q); "max / -8", never "-max / 8" (the sign of a zero d is stored).
 * - Blocks are byte arrays read through explicit little-endian loads: a block of 18 or 22
 *   bytes leaves its f16 fields unaligned, and GGUF is little-endian on every host.
 * - Dequantisers are the inner loop of quantised matmul on the CPU: each block is a few
 *   fixed-length loops over bytes with loop-invariant shifts, which the compiler vectorises. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/quant.h"
#include "lathe/tensor.h"

/* ---- little-endian field access ---- */

static inline uint32_t load_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline float bits_to_float(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* IEEE half at p to float, exactly. Shifting the exponent and mantissa into a float's
 * positions gives the half's value times 2^-112 (for subnormal halves too, as float
 * subnormals), so one multiplication by 2^112 finishes it; inf and nan are mapped by hand. */
static inline float load_f16(const uint8_t *p)
{
    uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    if (em >= 0x7c00u)
        return bits_to_float(sign | 0x7f800000u | (em & 0x3ffu) << 13);
    float mag = bits_to_float(em << 13) * 0x1p112f;
    uint32_t bits;
    memcpy(&bits, &mag, 4);
    return bits_to_float(bits | sign);
}

static inline float load_f32(const uint8_t *p) { return bits_to_float(load_u32(p)); }

static inline void store_f16(uint8_t *p, float f)
{
    uint16_t h = lt_fp32_to_fp16(f);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* ---- legacy formats: 32 elements a block; element j < 16 sits in the low nibble of
 * qs[j], element j + 16 in its high nibble; the 5-bit formats keep bit 4 of element j in
 * bit j of the little-endian u32 qh ---- */

void lt_dequant_q4_0(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK4_0; ib++, b += LT_BLOCK_Q4_0, dst += LT_QK4_0) {
        const float d = load_f16(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)((int)(qs[j] & 0x0f) - 8);
            dst[j + 16] = d * (float)((int)(qs[j] >> 4) - 8);
        }
    }
}

void lt_dequant_q4_1(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK4_1; ib++, b += LT_BLOCK_Q4_1, dst += LT_QK4_1) {
        const float d = load_f16(b);
        const float m = load_f16(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)(qs[j] & 0x0f) + m;
            dst[j + 16] = d * (float)(qs[j] >> 4) + m;
        }
    }
}

/* The 32 bits of qh (bytes at p) as bit 4 of each element: 0 or 16. Each qh byte is
 * copied into 8 lanes and tested against that lane's bit, so there is no per-element
 * shift count (SSE2 has none) and the test loop vectorises. */
static inline void unpack_bit4(const uint8_t *p, uint8_t hb[32])
{
    static const uint8_t lane_bit[32] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
                                         1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8_t rep[32];
    for (int k = 0; k < 4; k++)
        memset(rep + 8 * k, p[k], 8);
    for (int j = 0; j < 32; j++)
        hb[j] = (rep[j] & lane_bit[j]) ? 16 : 0;
}

void lt_dequant_q5_0(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK5_0; ib++, b += LT_BLOCK_Q5_0, dst += LT_QK5_0) {
        const float d = load_f16(b);
        uint8_t hb[32];
        unpack_bit4(b + 2, hb);
        const uint8_t *qs = b + 6;
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)((int)((qs[j] & 0x0f) | hb[j]) - 16);
            dst[j + 16] = d * (float)((int)((qs[j] >> 4) | hb[j + 16]) - 16);
        }
    }
}

void lt_dequant_q5_1(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK5_1; ib++, b += LT_BLOCK_Q5_1, dst += LT_QK5_1) {
        const float d = load_f16(b);
        const float m = load_f16(b + 2);
        uint8_t hb[32];
        unpack_bit4(b + 4, hb);
        const uint8_t *qs = b + 8;
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)((qs[j] & 0x0f) | hb[j]) + m;
            dst[j + 16] = d * (float)((qs[j] >> 4) | hb[j + 16]) + m;
        }
    }
}

void lt_dequant_q8_0(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK8_0; ib++, b += LT_BLOCK_Q8_0, dst += LT_QK8_0) {
        const float d = load_f16(b);
        const int8_t *qs = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; j++)
            dst[j] = d * (float)qs[j];
    }
}

/* Q8_1: d (f16), s = d * sum(qs) (f16, used only by dot products), qs[32] */
void lt_dequant_q8_1(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK8_1; ib++, b += LT_BLOCK_Q8_1, dst += LT_QK8_1) {
        const float d = load_f16(b);
        const int8_t *qs = (const int8_t *)(b + 4);
        for (int j = 0; j < 32; j++)
            dst[j] = d * (float)qs[j];
    }
}

/* ---- K-quants: 256 elements a block in sub-blocks of 16 or 32 that share a scale ---- */

/* Q2_K: scales[16] (low nibble: scale, high nibble: min, per 16 elements), qs[64], d, dmin.
 * Element 128*i + 32*s + l holds bits 2s..2s+1 of qs[32*i + l]. */
void lt_dequant_q2_k(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK_K; ib++, b += LT_BLOCK_Q2_K) {
        const uint8_t *scales = b;
        const uint8_t *qs = b + 16;
        const float d = load_f16(b + 80);
        const float dmin = load_f16(b + 82);
        for (int i = 0; i < 2; i++) {
            for (int s = 0; s < 4; s++) {
                for (int h = 0; h < 2; h++) {
                    const uint8_t sc = scales[8 * i + 2 * s + h];
                    const float dl = d * (float)(sc & 0x0f);
                    const float ml = dmin * (float)(sc >> 4);
                    const uint8_t *q = qs + 32 * i + 16 * h;
                    float *y = dst + 128 * i + 32 * s + 16 * h;
                    for (int l = 0; l < 16; l++)
                        y[l] = dl * (float)((q[l] >> (2 * s)) & 3) - ml;
                }
            }
        }
        dst += LT_QK_K;
    }
}

/* Q3_K: hmask[32], qs[64], scales[12] (sixteen 6-bit scales, offset by 32), d.
 * Element 128*i + 32*s + l: low two bits from qs as in Q2_K, and 4 is subtracted when bit
 * 4*i + s of hmask[l] is clear. Scale j: low nibble from byte j (j < 8) or the high
 * nibble of byte j - 8, top two bits from bits 2*(j/4) of byte 8 + j%4. */
void lt_dequant_q3_k(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK_K; ib++, b += LT_BLOCK_Q3_K) {
        const uint8_t *hmask = b;
        const uint8_t *qs = b + 32;
        const uint8_t *sc = b + 96;
        const float d = load_f16(b + 108);
        float dl[16];
        for (int j = 0; j < 16; j++) {
            int lo = j < 8 ? sc[j] & 0x0f : sc[j - 8] >> 4;
            int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
            dl[j] = d * (float)((lo | hi << 4) - 32);
        }
        for (int i = 0; i < 2; i++) {
            for (int s = 0; s < 4; s++) {
                const int bit = 4 * i + s;
                for (int h = 0; h < 2; h++) {
                    const float dj = dl[8 * i + 2 * s + h];
                    const uint8_t *q = qs + 32 * i + 16 * h;
                    const uint8_t *m = hmask + 16 * h;
                    float *y = dst + 128 * i + 32 * s + 16 * h;
                    for (int l = 0; l < 16; l++) {
                        int v = ((q[l] >> (2 * s)) & 3) - (((m[l] >> bit) & 1) ? 0 : 4);
                        y[l] = dj * (float)v;
                    }
                }
            }
        }
        dst += LT_QK_K;
    }
}

/* The 12-byte scale field of Q4_K and Q5_K: eight 6-bit scales and eight 6-bit mins.
 * j < 4: scale = sc[j] & 63, min = sc[j+4] & 63. j >= 4: the low four bits come from
 * sc[j+4] (scale: low nibble, min: high nibble), the top two from bits 6-7 of sc[j-4]
 * (scale) or sc[j] (min). */
static inline void k4_scale_min(const uint8_t *sc, int j, int *scale, int *min)
{
    if (j < 4) {
        *scale = sc[j] & 63;
        *min = sc[j + 4] & 63;
    } else {
        *scale = (sc[j + 4] & 0x0f) | (sc[j - 4] >> 6) << 4;
        *min = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
    }
}

/* Q4_K: d, dmin, scales[12], qs[128]. Sub-block j (32 elements) takes nibble j%2 of
 * qs[32*(j/2) + l]; element = d*scale_j * q - dmin*min_j. */
void lt_dequant_q4_k(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK_K; ib++, b += LT_BLOCK_Q4_K) {
        const float d = load_f16(b);
        const float dmin = load_f16(b + 2);
        const uint8_t *sc = b + 4;
        const uint8_t *qs = b + 16;
        for (int j = 0; j < 8; j++) {
            int scale, min;
            k4_scale_min(sc, j, &scale, &min);
            const float d1 = d * (float)scale;
            const float m1 = dmin * (float)min;
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++)
                dst[l] = d1 * (float)((q[l] >> shift) & 0x0f) - m1;
            dst += 32;
        }
    }
}

/* Q5_K: d, dmin, scales[12], qh[32], qs[128]: Q4_K plus bit j of qh[l] as bit 4. */
void lt_dequant_q5_k(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK_K; ib++, b += LT_BLOCK_Q5_K) {
        const float d = load_f16(b);
        const float dmin = load_f16(b + 2);
        const uint8_t *sc = b + 4;
        const uint8_t *qh = b + 16;
        const uint8_t *qs = b + 48;
        for (int j = 0; j < 8; j++) {
            int scale, min;
            k4_scale_min(sc, j, &scale, &min);
            const float d1 = d * (float)scale;
            const float m1 = dmin * (float)min;
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0x0f) | ((qh[l] >> j) & 1) << 4;
                dst[l] = d1 * (float)v - m1;
            }
            dst += 32;
        }
    }
}

/* Q6_K: ql[128], qh[64], scales[16] (int8), d. Element 128*i + 32*s + l: nibble s/2 of
 * ql[64*i + 32*(s%2) + l], bits 2s..2s+1 of qh[32*i + l] above it, minus 32; the scale
 * is per 16 elements. */
void lt_dequant_q6_k(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK_K; ib++, b += LT_BLOCK_Q6_K) {
        const uint8_t *ql = b;
        const uint8_t *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        const float d = load_f16(b + 208);
        for (int i = 0; i < 2; i++) {
            for (int s = 0; s < 4; s++) {
                const int lshift = 4 * (s / 2);
                for (int h = 0; h < 2; h++) {
                    const float ds = d * (float)scales[8 * i + 2 * s + h];
                    const uint8_t *lo = ql + 64 * i + 32 * (s % 2) + 16 * h;
                    const uint8_t *hi = qh + 32 * i + 16 * h;
                    float *y = dst + 128 * i + 32 * s + 16 * h;
                    for (int l = 0; l < 16; l++) {
                        int v = (((lo[l] >> lshift) & 0x0f) | ((hi[l] >> (2 * s)) & 3) << 4) - 32;
                        y[l] = ds * (float)v;
                    }
                }
            }
        }
        dst += LT_QK_K;
    }
}

/* Q8_K: d (f32), qs[256] (int8), bsums[16] (int16 sums of 16 qs, for dot products) */
void lt_dequant_q8_k(const void *restrict src, float *restrict dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t ib = 0; ib < n / LT_QK_K; ib++, b += LT_BLOCK_Q8_K, dst += LT_QK_K) {
        const float d = load_f32(b);
        const int8_t *qs = (const int8_t *)(b + 4);
        for (int j = 0; j < LT_QK_K; j++)
            dst[j] = d * (float)qs[j];
    }
}

/* ---- quantisers (round to nearest, as ggml's *_ref functions) ---- */

/* The signed value of largest magnitude; the first one on a tie. */
static inline float block_absmax_signed(const float *x, int k)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < k; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static inline void block_min_max(const float *x, int k, float *min, float *max)
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < k; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    *min = lo;
    *max = hi;
}

/* Truncation to int then clamping to qmax: the reference adds 0.5 (or the offset plus
 * 0.5) and truncates, so this is round-half-up on non-negative values. A nan (from a nan
 * or infinite input) becomes 0 rather than an undefined conversion. */
static inline int trunc_clamp(float v, int qmax)
{
    if (!(v >= 1.0f))
        return 0;
    return v >= (float)qmax ? qmax : (int)v;
}

void lt_quant_q4_0(const float *restrict src, void *restrict dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t ib = 0; ib < n / LT_QK4_0; ib++, b += LT_BLOCK_Q4_0, src += LT_QK4_0) {
        const float max = block_absmax_signed(src, LT_QK4_0);
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(b, d);
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp(src[j] * id + 8.5f, 15);
            int hi = trunc_clamp(src[j + 16] * id + 8.5f, 15);
            b[2 + j] = (uint8_t)(lo | hi << 4);
        }
    }
}

void lt_quant_q4_1(const float *restrict src, void *restrict dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t ib = 0; ib < n / LT_QK4_1; ib++, b += LT_BLOCK_Q4_1, src += LT_QK4_1) {
        float min, max;
        block_min_max(src, LT_QK4_1, &min, &max);
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(b, d);
        store_f16(b + 2, min);
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp((src[j] - min) * id + 0.5f, 15);
            int hi = trunc_clamp((src[j + 16] - min) * id + 0.5f, 15);
            b[4 + j] = (uint8_t)(lo | hi << 4);
        }
    }
}

/* Packs 32 five-bit values: low nibbles into qs, bit 4 of value j into bit j of qh. */
static inline void pack_q5(const int *q, uint8_t *qh_at, uint8_t *qs)
{
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0f) | (q[j + 16] & 0x0f) << 4);
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        qh_at[k] = (uint8_t)(qh >> (8 * k));
}

void lt_quant_q5_0(const float *restrict src, void *restrict dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t ib = 0; ib < n / LT_QK5_0; ib++, b += LT_BLOCK_Q5_0, src += LT_QK5_0) {
        const float max = block_absmax_signed(src, LT_QK5_0);
        const float d = max / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[LT_QK5_0];
        for (int j = 0; j < LT_QK5_0; j++)
            q[j] = trunc_clamp(src[j] * id + 16.5f, 31);
        store_f16(b, d);
        pack_q5(q, b + 2, b + 6);
    }
}

void lt_quant_q5_1(const float *restrict src, void *restrict dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t ib = 0; ib < n / LT_QK5_1; ib++, b += LT_BLOCK_Q5_1, src += LT_QK5_1) {
        float min, max;
        block_min_max(src, LT_QK5_1, &min, &max);
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[LT_QK5_1];
        for (int j = 0; j < LT_QK5_1; j++)
            q[j] = trunc_clamp((src[j] - min) * id + 0.5f, 31);
        store_f16(b, d);
        store_f16(b + 2, min);
        pack_q5(q, b + 4, b + 8);
    }
}

/* Round half away from zero (roundf), as the reference; |v| <= 127 up to rounding. */
static inline int8_t round_q8(float v)
{
    float r = roundf(v);
    if (!(r > -128.0f))
        return r != r ? 0 : -128;
    return r > 127.0f ? 127 : (int8_t)r;
}

void lt_quant_q8_0(const float *restrict src, void *restrict dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t ib = 0; ib < n / LT_QK8_0; ib++, b += LT_BLOCK_Q8_0, src += LT_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < LT_QK8_0; j++)
            amax = fabsf(src[j]) > amax ? fabsf(src[j]) : amax;
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(b, d);
        for (int j = 0; j < LT_QK8_0; j++)
            b[2 + j] = (uint8_t)round_q8(src[j] * id);
    }
}
