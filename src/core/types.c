/* types.c: per-type layout and conversions for the types of enum lt_type. */
#include <math.h>
#include <string.h>

#include "core/quant.h"
#include "lathe/tensor.h"

float lt_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t lt_fp32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        float a;
        memcpy(&a, &absx, 4);
        /* a * 2^24 rounded to nearest even gives the subnormal mantissa */
        float m = nearbyintf(a * 16777216.0f);
        return (uint16_t)(sign | (uint32_t)m);
    }
    uint32_t mant_odd = (absx >> 13) & 1;
    absx += 0xfffu + mant_odd; /* round to nearest even on the dropped 13 bits */
    return (uint16_t)(sign | (((absx >> 23) - 127 + 15) << 10) | ((absx >> 13) & 0x3ff));
}

float lt_bf16_to_fp32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t lt_fp32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* nan: keep it quiet */
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static void f32_to_float(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
static void f32_from_float(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

static void f16_to_float(const void *src, float *dst, int64_t n)
{
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = lt_fp16_to_fp32(s[i]);
}

static void f16_from_float(const float *src, void *dst, int64_t n)
{
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = lt_fp32_to_fp16(src[i]);
}

static void bf16_to_float(const void *src, float *dst, int64_t n)
{
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = lt_bf16_to_fp32(s[i]);
}

static void bf16_from_float(const float *src, void *dst, int64_t n)
{
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = lt_fp32_to_bf16(src[i]);
}

static void i32_to_float(const void *src, float *dst, int64_t n)
{
    const int32_t *s = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)s[i];
}

static void i32_from_float(const float *src, void *dst, int64_t n)
{
    int32_t *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = (int32_t)lrintf(src[i]);
}

static const struct lt_type_traits type_traits[LT_TYPE_COUNT] = {
    [LT_TYPE_F32] = {"f32", 1, 4, false, f32_to_float, f32_from_float},
    [LT_TYPE_F16] = {"f16", 1, 2, false, f16_to_float, f16_from_float},
    [LT_TYPE_BF16] = {"bf16", 1, 2, false, bf16_to_float, bf16_from_float},
    [LT_TYPE_I32] = {"i32", 1, 4, false, i32_to_float, i32_from_float},
    [LT_TYPE_I8] = {"i8", 1, 1, false, NULL, NULL},
    [LT_TYPE_I16] = {"i16", 1, 2, false, NULL, NULL},
    [LT_TYPE_I64] = {"i64", 1, 8, false, NULL, NULL},
    [LT_TYPE_F64] = {"f64", 1, 8, false, NULL, NULL},
    [LT_TYPE_Q4_0] = {"q4_0", LT_QK4_0, LT_BLOCK_Q4_0, true, lt_dequant_q4_0, lt_quant_q4_0},
    [LT_TYPE_Q4_1] = {"q4_1", LT_QK4_1, LT_BLOCK_Q4_1, true, lt_dequant_q4_1, lt_quant_q4_1},
    [LT_TYPE_Q5_0] = {"q5_0", LT_QK5_0, LT_BLOCK_Q5_0, true, lt_dequant_q5_0, lt_quant_q5_0},
    [LT_TYPE_Q5_1] = {"q5_1", LT_QK5_1, LT_BLOCK_Q5_1, true, lt_dequant_q5_1, lt_quant_q5_1},
    [LT_TYPE_Q8_0] = {"q8_0", LT_QK8_0, LT_BLOCK_Q8_0, true, lt_dequant_q8_0, lt_quant_q8_0},
    [LT_TYPE_Q8_1] = {"q8_1", LT_QK8_1, LT_BLOCK_Q8_1, true, lt_dequant_q8_1, NULL},
    [LT_TYPE_Q2_K] = {"q2_K", LT_QK_K, LT_BLOCK_Q2_K, true, lt_dequant_q2_k, NULL},
    [LT_TYPE_Q3_K] = {"q3_K", LT_QK_K, LT_BLOCK_Q3_K, true, lt_dequant_q3_k, NULL},
    [LT_TYPE_Q4_K] = {"q4_K", LT_QK_K, LT_BLOCK_Q4_K, true, lt_dequant_q4_k, NULL},
    [LT_TYPE_Q5_K] = {"q5_K", LT_QK_K, LT_BLOCK_Q5_K, true, lt_dequant_q5_k, NULL},
    [LT_TYPE_Q6_K] = {"q6_K", LT_QK_K, LT_BLOCK_Q6_K, true, lt_dequant_q6_k, NULL},
    [LT_TYPE_Q8_K] = {"q8_K", LT_QK_K, LT_BLOCK_Q8_K, true, lt_dequant_q8_k, NULL},
};

bool lt_type_valid(int t) { return t >= 0 && t < LT_TYPE_COUNT && type_traits[t].name != NULL; }

const struct lt_type_traits *lt_type_traits(enum lt_type t)
{
    return lt_type_valid((int)t) ? &type_traits[t] : NULL;
}

const char *lt_type_name(enum lt_type t) { return lt_type_valid((int)t) ? type_traits[t].name : "?"; }

size_t lt_row_size(enum lt_type t, int64_t n)
{
    const struct lt_type_traits *tt = lt_type_traits(t);
    return tt ? (size_t)(n / tt->block_size) * tt->type_size : 0;
}
