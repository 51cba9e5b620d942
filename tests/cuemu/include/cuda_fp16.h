/* cuda_fp16.h of the CPU emulation (tests/cuemu): IEEE half, converted by the host
 * compiler's _Float16 (round to nearest even). */
#ifndef LATHE_CUEMU_CUDA_FP16_H
#define LATHE_CUEMU_CUDA_FP16_H
#include "cuemu_core.h"

struct __half_raw {
    unsigned short x;
};
struct __attribute__((aligned(2))) __half {
    unsigned short x;
    __half() = default;
    __half(__half_raw r) : x(r.x) {}
};
struct __attribute__((aligned(4))) __half2 {
    __half x, y;
};

static inline float __half2float(__half h)
{
    _Float16 f;
    memcpy(&f, &h.x, 2);
    return (float)f;
}
static inline __half __float2half_rn(float v)
{
    const _Float16 f = (_Float16)v;
    __half h;
    memcpy(&h.x, &f, 2);
    return h;
}
static inline __half __float2half(float v)
{
    return __float2half_rn(v);
}
static inline __half2 __floats2half2_rn(float a, float b)
{
    return __half2{__float2half_rn(a), __float2half_rn(b)};
}
static inline float2 __half22float2(__half2 h)
{
    return float2{__half2float(h.x), __half2float(h.y)};
}
#endif
