/* cuda_bf16.h of the CPU emulation (tests/cuemu): bfloat16, the top half of an IEEE float,
 * rounded to nearest even (a NaN stays a NaN). */
#ifndef LATHE_CUEMU_CUDA_BF16_H
#define LATHE_CUEMU_CUDA_BF16_H
#include "cuemu_core.h"

struct __attribute__((aligned(2))) __nv_bfloat16 {
    unsigned short x;
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline float __bfloat162float(__nv_bfloat16 h)
{
    const uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        h.x = (unsigned short)((u >> 16) | 0x40); /* a quiet NaN */
    else
        h.x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}
static inline __nv_bfloat16 __float2bfloat16(float v)
{
    return __float2bfloat16_rn(v);
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
    return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
static inline float2 __bfloat1622float2(__nv_bfloat162 h)
{
    return float2{__bfloat162float(h.x), __bfloat162float(h.y)};
}
#endif
