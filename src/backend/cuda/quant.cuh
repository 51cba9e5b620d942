/* quant.cuh (internal, CUDA C++): GGUF's block-quantised formats read one element at a time
 * on the device, and cu_read, which reads an element of any type the device can read.
 *
 * The formulas mirror src/core/quant.c (the CPU's dequantisers, bit-exact with ggml's
 * reference): each product and each difference is rounded on its own (__fmul_rn,
 * __fsub_rn, __fadd_rn), because a fused multiply-add, which nvcc forms by default, would
 * change the last bit of "d * q - m". Blocks are read byte by byte: a block of 18, 22 or
 * 210 bytes leaves its f16 fields unaligned. Element e of a 256-element K-quant block is
 * written e = 128 i + 32 s + 16 h + l where quant.c's loops use those names. */
#ifndef LATHE_BACKEND_CUDA_QUANT_CUH
#define LATHE_BACKEND_CUDA_QUANT_CUH

#include "backend/cuda/cuda_common.h"

__host__ __device__ constexpr int cu_block_size(int type)
{
    return type == LT_TYPE_Q4_0 || type == LT_TYPE_Q4_1 || type == LT_TYPE_Q5_0 ||
                   type == LT_TYPE_Q5_1 || type == LT_TYPE_Q8_0 || type == LT_TYPE_Q8_1
               ? 32
           : type == LT_TYPE_Q2_K || type == LT_TYPE_Q3_K || type == LT_TYPE_Q4_K ||
                   type == LT_TYPE_Q5_K || type == LT_TYPE_Q6_K || type == LT_TYPE_Q8_K
               ? 256
               : 1;
}

/* Q4_K's and Q5_K's 6-bit scale and min of sub-block sb (0..7) from their 12 packed bytes */
__device__ __forceinline__ void cu_k4_scale_min(const uint8_t *sc, int sb, int &scale, int &min)
{
    if (sb < 4) {
        scale = sc[sb] & 63;
        min = sc[sb + 4] & 63;
    } else {
        scale = (sc[sb + 4] & 0x0f) | (sc[sb - 4] >> 6) << 4;
        min = (sc[sb + 4] >> 4) | (sc[sb] >> 6) << 4;
    }
}

__device__ __forceinline__ float cu_f16_at(const uint8_t *p)
{
    __half_raw r;
    r.x = (unsigned short)(p[0] | p[1] << 8);
    return __half2float(__half(r));
}

__device__ __forceinline__ float cu_mul(float a, float b) { return __fmul_rn(a, b); }

/* Element j of the block at b. */
__device__ __forceinline__ float cu_dequant(const uint8_t *b, int type, int j)
{
    switch (type) {
    case LT_TYPE_Q4_0: {
        const int q = j < 16 ? (b[2 + j] & 0x0f) : (b[2 + j - 16] >> 4);
        return cu_mul(cu_f16_at(b), (float)(q - 8));
    }
    case LT_TYPE_Q4_1: {
        const int q = j < 16 ? (b[4 + j] & 0x0f) : (b[4 + j - 16] >> 4);
        return __fadd_rn(cu_mul(cu_f16_at(b), (float)q), cu_f16_at(b + 2));
    }
    case LT_TYPE_Q5_0: {
        const int hb = (b[2 + j / 8] >> (j % 8)) & 1;
        const int lo = j < 16 ? (b[6 + j] & 0x0f) : (b[6 + j - 16] >> 4);
        return cu_mul(cu_f16_at(b), (float)((lo | hb << 4) - 16));
    }
    case LT_TYPE_Q5_1: {
        const int hb = (b[4 + j / 8] >> (j % 8)) & 1;
        const int lo = j < 16 ? (b[8 + j] & 0x0f) : (b[8 + j - 16] >> 4);
        return __fadd_rn(cu_mul(cu_f16_at(b), (float)(lo | hb << 4)), cu_f16_at(b + 2));
    }
    case LT_TYPE_Q8_0: return cu_mul(cu_f16_at(b), (float)(int8_t)b[2 + j]);
    case LT_TYPE_Q8_1: return cu_mul(cu_f16_at(b), (float)(int8_t)b[4 + j]);
    case LT_TYPE_Q2_K: {
        const int i = j / 128, s = (j % 128) / 32, h = (j % 32) / 16, l = j % 16;
        const uint8_t sc = b[8 * i + 2 * s + h];
        const float dl = cu_mul(cu_f16_at(b + 80), (float)(sc & 0x0f));
        const float ml = cu_mul(cu_f16_at(b + 82), (float)(sc >> 4));
        const int q = (b[16 + 32 * i + 16 * h + l] >> (2 * s)) & 3;
        return __fsub_rn(cu_mul(dl, (float)q), ml);
    }
    case LT_TYPE_Q3_K: {
        const int i = j / 128, s = (j % 128) / 32, h = (j % 32) / 16, l = j % 16;
        const uint8_t *sc = b + 96;
        const int js = 8 * i + 2 * s + h;
        const int lo = js < 8 ? sc[js] & 0x0f : sc[js - 8] >> 4;
        const int hi = (sc[8 + js % 4] >> (2 * (js / 4))) & 3;
        const float dl = cu_mul(cu_f16_at(b + 108), (float)((lo | hi << 4) - 32));
        const int q = ((b[32 + 32 * i + 16 * h + l] >> (2 * s)) & 3) -
                      (((b[16 * h + l] >> (4 * i + s)) & 1) ? 0 : 4);
        return cu_mul(dl, (float)q);
    }
    case LT_TYPE_Q4_K:
    case LT_TYPE_Q5_K: {
        const int sb = j / 32, l = j % 32;
        int scale, min;
        cu_k4_scale_min(b + 4, sb, scale, min);
        const float d1 = cu_mul(cu_f16_at(b), (float)scale);
        const float m1 = cu_mul(cu_f16_at(b + 2), (float)min);
        int q;
        if (type == LT_TYPE_Q4_K) {
            q = (b[16 + 32 * (sb / 2) + l] >> (4 * (sb % 2))) & 0x0f;
        } else {
            q = ((b[48 + 32 * (sb / 2) + l] >> (4 * (sb % 2))) & 0x0f) | ((b[16 + l] >> sb) & 1) << 4;
        }
        return __fsub_rn(cu_mul(d1, (float)q), m1);
    }
    case LT_TYPE_Q6_K: {
        const int i = j / 128, s = (j % 128) / 32, h = (j % 32) / 16, l = j % 16;
        const float ds = cu_mul(cu_f16_at(b + 208), (float)(int8_t)b[192 + 8 * i + 2 * s + h]);
        const int lo = (b[64 * i + 32 * (s % 2) + 16 * h + l] >> (4 * (s / 2))) & 0x0f;
        const int hi = (b[128 + 32 * i + 16 * h + l] >> (2 * s)) & 3;
        return cu_mul(ds, (float)((lo | hi << 4) - 32));
    }
    case LT_TYPE_Q8_K: {
        uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24;
        return cu_mul(__uint_as_float(u), (float)(int8_t)b[4 + j]);
    }
    default: return __int_as_float(0x7fc00000); /* not reachable past the preconditions */
    }
}

/* Element (i0..i3) of a tensor of any device-readable type, as float. */
__device__ __forceinline__ float cu_read(const struct cu_t &t, int64_t i0, int64_t i1, int64_t i2,
                                         int64_t i3)
{
    const int bs = cu_block_size(t.type);
    if (bs == 1)
        return cu_get(t, i0, i1, i2, i3);
    const uint8_t *blk = (const uint8_t *)cu_ptr(t, i0 / bs, i1, i2, i3);
    return cu_dequant(blk, t.type, (int)(i0 % bs));
}

#endif
