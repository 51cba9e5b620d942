/* mma_bf16.h (internal, CUDA C++): warp-level products on BF16 tensor cores, for kernels that
 * keep their accumulators in registers (flash_attn_bf16.cu).
 *
 * mma.sync m16n8k16 multiplies a 16 x 16 BF16 tile A by a 16 x 8 BF16 tile B into a 16 x 8
 * F32 tile, each lane holding fixed elements of the three (g = lane / 4, t = lane % 4; a
 * register's low half holds the lower column or row):
 *   A: four registers, A(g, 2t..2t+1), A(g + 8, 2t..), A(g, 2t + 8..), A(g + 8, 2t + 8..);
 *   B: two registers, B(2t..2t+1, g), B(2t + 8..2t + 9, g);
 *   C: four floats, C(g, 2t), C(g, 2t + 1), C(g + 8, 2t), C(g + 8, 2t + 1).
 * So a product's C tiles, two side by side (16 x 16), are already the A registers of a next
 * product over those 16 columns once rounded to BF16 (mb_pack): attention's P V and dS K
 * take P and dS straight from the registers that computed them.
 *
 * ldmatrix loads four 8 x 8 BF16 matrices from shared memory in one instruction, each lane
 * naming one matrix row (16 bytes, 16-byte aligned): lane l names row l % 8 of matrix l / 8,
 * and register j gets matrix j's row l / 4 at columns 2 (l % 4) and the next, the element
 * layout of A's and B's registers above. With .trans it gets the column instead, which reads
 * a matrix stored the other way round. The three loads below name their rows so:
 *   mb_load_a: A (16 x 16) from X[m][k] (rows m); mb_load_a_km from X[k][m];
 *   mb_load_b_nk: two B tiles (k 16 x n 16) from X[n][k] (K of S = Q K^T: rows are keys);
 *   mb_load_b_kn: two B tiles from X[k][n] (V of O = P V: rows are the keys summed over).
 * A row pitch of 8 mod 64 BF16 elements (16 bytes mod 128) puts the 8 rows of a matrix on
 * 8 different groups of 4 banks: no conflicts.
 *
 * On the CPU emulation (tests/cuemu) both are warp collectives of its own. */
#ifndef LATHE_BACKEND_CUDA_MMA_BF16_H
#define LATHE_BACKEND_CUDA_MMA_BF16_H

#include <cuda_bf16.h>
#include <stdint.h>

#ifdef LATHE_CUEMU_CORE_H
#include <mma.h>
#endif

/* d += a b (16 x 8 x 16, BF16 operands, F32 accumulation) */
static __device__ __forceinline__ void mb_mma(float *d, const uint32_t *a, const uint32_t *b)
{
#ifdef LATHE_CUEMU_CORE_H
    cuemu_mma_m16n8k16_bf16(d, a, b);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* four 8 x 8 matrices from shared memory; row: this lane's row (see above) */
template <bool TRANS>
static __device__ __forceinline__ void mb_ldsm4(uint32_t *r, const __nv_bfloat16 *row)
{
#ifdef LATHE_CUEMU_CORE_H
    cuemu_ldmatrix_x4(r, row, TRANS);
#else
    const unsigned at = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
#endif
}

static __device__ __forceinline__ int mb_lane(void)
{
    return (int)(threadIdx.x & 31);
}

/* A's registers for rows m0.. and columns k0.. of X (pitch ld elements) */
static __device__ __forceinline__ void mb_load_a(uint32_t *a, const __nv_bfloat16 *X, int ld,
                                                 int m0, int k0)
{
    const int l = mb_lane();
    mb_ldsm4<false>(a, X + (m0 + l % 8 + 8 * (l / 8 % 2)) * ld + k0 + 8 * (l / 16));
}

/* A's registers for rows m0.. and columns k0.. of A(m, k) = X[k][m] (A stored transposed) */
static __device__ __forceinline__ void mb_load_a_km(uint32_t *a, const __nv_bfloat16 *X, int ld,
                                                    int m0, int k0)
{
    const int l = mb_lane();
    mb_ldsm4<true>(a, X + (k0 + l % 8 + 8 * (l / 16)) * ld + m0 + 8 * (l / 8 % 2));
}

/* B's registers of two tiles, columns n0..n0+7 (b[0..1]) and n0+8.. (b[2..3]), rows k0..k0+15,
 * with B(k, n) = X[n][k] */
static __device__ __forceinline__ void mb_load_b_nk(uint32_t *b, const __nv_bfloat16 *X, int ld,
                                                    int k0, int n0)
{
    const int l = mb_lane();
    mb_ldsm4<false>(b, X + (n0 + l % 8 + 8 * (l / 16)) * ld + k0 + 8 * (l / 8 % 2));
}

/* the same with B(k, n) = X[k][n] */
static __device__ __forceinline__ void mb_load_b_kn(uint32_t *b, const __nv_bfloat16 *X, int ld,
                                                    int k0, int n0)
{
    const int l = mb_lane();
    mb_ldsm4<true>(b, X + (k0 + l % 8 + 8 * (l / 8 % 2)) * ld + n0 + 8 * (l / 16));
}

/* two floats as one register of BF16s (x low) */
static __device__ __forceinline__ uint32_t mb_pack(float x, float y)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

/* A's registers from two C tiles side by side (columns 0..7 in c0, 8..15 in c1) */
static __device__ __forceinline__ void mb_a_of(uint32_t *a, const float *c0, const float *c1)
{
    a[0] = mb_pack(c0[0], c0[1]);
    a[1] = mb_pack(c0[2], c0[3]);
    a[2] = mb_pack(c1[0], c1[1]);
    a[3] = mb_pack(c1[2], c1[3]);
}

#endif
