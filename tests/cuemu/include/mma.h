/* mma.h of the CPU emulation (tests/cuemu): nvcuda::wmma for F32/TF32 fragments.
 *
 * A fragment of an R x C tile holds R * C / 32 elements a lane, as on the device, in a
 * layout of the emulation's own: element e of lane l is the tile's element l * n + e in row
 * order (n elements a lane). Loads, stores and fills touch each lane's own elements;
 * mma_sync is a warp collective (every lane publishes its fragments, and the last lane to
 * reach the warp's barrier computes the tile for all of them). TF32 operands enter a product
 * with their low 13 mantissa bits dropped, as the tensor cores read them; accumulation is
 * in float. */
#ifndef LATHE_CUEMU_MMA_H
#define LATHE_CUEMU_MMA_H
#include "cuemu_core.h"

void **cuemu_warp_ptrs(int lane); /* four pointer slots a lane (cuemu.cc) */

namespace nvcuda
{
namespace wmma
{
struct row_major {
};
struct col_major {
};
struct matrix_a {
};
struct matrix_b {
};
struct accumulator {
};
namespace precision
{
struct tf32 {
};
} // namespace precision
enum layout_t { mem_row_major, mem_col_major };

/* round to TF32 (10 mantissa bits), to nearest with ties away from zero */
static inline float __float_to_tf32(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + 0x1000u) & 0xffffe000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

static inline float cuemu_tf32_operand(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u &= 0xffffe000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

template <typename Use, int M, int N, int K> struct cuemu_shape;
template <int M, int N, int K> struct cuemu_shape<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K;
};
template <int M, int N, int K> struct cuemu_shape<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N;
};
template <int M, int N, int K> struct cuemu_shape<accumulator, M, N, K> {
    static constexpr int rows = M, cols = N;
};

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(std::is_same<T, float>::value || std::is_same<T, precision::tf32>::value,
                  "the emulation has F32 and TF32 fragments only");
    static constexpr int rows = cuemu_shape<Use, M, N, K>::rows;
    static constexpr int cols = cuemu_shape<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols / 32;
    float x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, float v)
{
    for (int e = 0; e < f.num_elements; e++)
        f.x[e] = v;
}

/* element (r, c) of a tile in memory: row-major or column-major with leading dimension ld */
template <typename P> static inline float cuemu_at(const P *p, unsigned ld, int r, int c, bool row)
{
    return (float)(row ? p[(size_t)r * ld + c] : p[r + (size_t)c * ld]);
}

template <typename Use, int M, int N, int K, typename T, typename L, typename P>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const P *p, unsigned ld)
{
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator's load names a layout");
    const bool row = std::is_same<L, row_major>::value;
    const int lane = cuemu_lane();
    for (int e = 0; e < f.num_elements; e++) {
        const int i = lane * f.num_elements + e;
        f.x[e] = cuemu_at(p, ld, i / f.cols, i % f.cols, row);
    }
}

template <int M, int N, int K, typename P>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const P *p,
                                    unsigned ld, layout_t l)
{
    const int lane = cuemu_lane();
    for (int e = 0; e < f.num_elements; e++) {
        const int i = lane * f.num_elements + e;
        f.x[e] = cuemu_at(p, ld, i / f.cols, i % f.cols, l == mem_row_major);
    }
}

template <int M, int N, int K>
static inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f,
                                     unsigned ld, layout_t l)
{
    const int lane = cuemu_lane();
    for (int e = 0; e < f.num_elements; e++) {
        const int i = lane * f.num_elements + e, r = i / f.cols, c = i % f.cols;
        p[l == mem_row_major ? (size_t)r * ld + c : r + (size_t)c * ld] = f.x[e];
    }
}

/* the whole tile's d = a b + c, run by the warp's last lane to arrive (cuemu_sync_warp_do)
 * from every lane's published fragments: slots a, b, c, d */
template <int M, int N, int K, bool TF, int NA, int NB> static void cuemu_mma_tile(void)
{
    constexpr int ND = M * N / 32;
    float A[M][K], B[K][N], D[M][N];
    for (int l = 0; l < 32; l++) {
        void **s = cuemu_warp_ptrs(l);
        const float *ax = (const float *)s[0], *bx = (const float *)s[1], *cx = (const float *)s[2];
        for (int e = 0; e < NA; e++) {
            const int i = l * NA + e;
            A[i / K][i % K] = TF ? cuemu_tf32_operand(ax[e]) : ax[e];
        }
        for (int e = 0; e < NB; e++) {
            const int i = l * NB + e;
            B[i / N][i % N] = TF ? cuemu_tf32_operand(bx[e]) : bx[e];
        }
        for (int e = 0; e < ND; e++) {
            const int i = l * ND + e;
            D[i / N][i % N] = cx[e];
        }
    }
    for (int r = 0; r < M; r++)
        for (int k = 0; k < K; k++)
            for (int c = 0; c < N; c++)
                D[r][c] += A[r][k] * B[k][c];
    for (int l = 0; l < 32; l++) {
        float *dx = (float *)cuemu_warp_ptrs(l)[3];
        for (int e = 0; e < ND; e++) {
            const int i = l * ND + e;
            dx[e] = D[i / N][i % N];
        }
    }
}

template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float> &d,
                            const fragment<matrix_a, M, N, K, TA, LA> &a,
                            const fragment<matrix_b, M, N, K, TB, LB> &b,
                            const fragment<accumulator, M, N, K, float> &c)
{
    constexpr bool tf = std::is_same<TA, precision::tf32>::value;
    void **mine = cuemu_warp_ptrs(cuemu_lane());
    mine[0] = (void *)a.x;
    mine[1] = (void *)b.x;
    mine[2] = (void *)c.x;
    mine[3] = (void *)d.x;
    cuemu_sync_warp_do(
        cuemu_mma_tile<M, N, K, tf, fragment<matrix_a, M, N, K, TA, LA>::num_elements,
                       fragment<matrix_b, M, N, K, TB, LB>::num_elements>);
}

/* d = A B + d over a 16 x 8 x K tile, run by the warp's last lane: OPS(l, A, B) fills A [16][K]
 * and B [K][8] with lane l's operand registers (slots 0 and 1); the accumulators (slot 3) are
 * in mma.sync's C layout (g = lane / 4, t = lane % 4): D(g, 2t), D(g, 2t + 1), D(g + 8, 2t),
 * D(g + 8, 2t + 1) */
template <int K, void (*OPS)(int, float (*)[K], float (*)[8])> static void cuemu_mma_m16n8(void)
{
    float A[16][K], B[K][8], D[16][8];
    for (int l = 0; l < 32; l++) {
        const float *d = (const float *)cuemu_warp_ptrs(l)[3];
        const int g = l / 4, t = l % 4;
        OPS(l, A, B);
        D[g][2 * t] = d[0];
        D[g][2 * t + 1] = d[1];
        D[g + 8][2 * t] = d[2];
        D[g + 8][2 * t + 1] = d[3];
    }
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < K; k++)
            for (int c = 0; c < 8; c++)
                D[r][c] += A[r][k] * B[k][c];
    for (int l = 0; l < 32; l++) {
        float *d = (float *)cuemu_warp_ptrs(l)[3];
        const int g = l / 4, t = l % 4;
        d[0] = D[g][2 * t];
        d[1] = D[g][2 * t + 1];
        d[2] = D[g + 8][2 * t];
        d[3] = D[g + 8][2 * t + 1];
    }
}

/* PTX's mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, d = a b + d, in its fragment
 * layout (g = lane / 4, t = lane % 4): a = A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4);
 * b = B(t, g), B(t + 4, g). The delta rule's and FLASH_ATTN's F32 kernels call it through
 * delta_net_mma.h's cb_mma1688. */
static void cuemu_tf32_operands(int l, float (*A)[8], float (*B)[8])
{
    void **s = cuemu_warp_ptrs(l);
    const float *a = (const float *)s[0], *b = (const float *)s[1];
    const int g = l / 4, t = l % 4;
    A[g][t] = cuemu_tf32_operand(a[0]);
    A[g + 8][t] = cuemu_tf32_operand(a[1]);
    A[g][t + 4] = cuemu_tf32_operand(a[2]);
    A[g + 8][t + 4] = cuemu_tf32_operand(a[3]);
    B[t][g] = cuemu_tf32_operand(b[0]);
    B[t + 4][g] = cuemu_tf32_operand(b[1]);
}
} // namespace wmma
} // namespace nvcuda

static inline void cuemu_mma_m16n8k8_tf32(float *d, const float *a, const float *b)
{
    void **mine = cuemu_warp_ptrs(cuemu_lane());
    mine[0] = (void *)a;
    mine[1] = (void *)b;
    mine[3] = (void *)d;
    cuemu_sync_warp_do(nvcuda::wmma::cuemu_mma_m16n8<8, nvcuda::wmma::cuemu_tf32_operands>);
}

/* ---- BF16 operands: mma.sync m16n8k16 and ldmatrix (src/backend/cuda/mma_bf16.h) ---- */

/* the BF16 value in the low (hi = false) or high half of a 32-bit register */
static inline float cuemu_bf16_half(uint32_t r, bool hi)
{
    const uint32_t u = (hi ? r >> 16 : r & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* PTX's mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32's operands, in its fragment
 * layout (g = lane / 4, t = lane % 4; a register's low half holds the lower column or row):
 * a = A(g, 2t..2t+1), A(g + 8, 2t..), A(g, 2t + 8..), A(g + 8, 2t + 8..); b = B(2t..2t+1,
 * g), B(2t + 8..2t + 9, g). Products of BF16 values are exact in float; the sum is float's. */
static void cuemu_bf16_operands(int l, float (*A)[16], float (*B)[8])
{
    void **s = cuemu_warp_ptrs(l);
    const uint32_t *a = (const uint32_t *)s[0], *b = (const uint32_t *)s[1];
    const int g = l / 4, t = l % 4;
    for (int h = 0; h < 2; h++) {
        A[g][2 * t + h] = cuemu_bf16_half(a[0], h);
        A[g + 8][2 * t + h] = cuemu_bf16_half(a[1], h);
        A[g][2 * t + 8 + h] = cuemu_bf16_half(a[2], h);
        A[g + 8][2 * t + 8 + h] = cuemu_bf16_half(a[3], h);
        B[2 * t + h][g] = cuemu_bf16_half(b[0], h);
        B[2 * t + 8 + h][g] = cuemu_bf16_half(b[1], h);
    }
}

static inline void cuemu_mma_m16n8k16_bf16(float *d, const uint32_t *a, const uint32_t *b)
{
    void **mine = cuemu_warp_ptrs(cuemu_lane());
    mine[0] = (void *)a;
    mine[1] = (void *)b;
    mine[3] = (void *)d;
    cuemu_sync_warp_do(nvcuda::wmma::cuemu_mma_m16n8<16, cuemu_bf16_operands>);
}

/* PTX's ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane l gives the address of row
 * l % 8 of 8 x 8 matrix l / 8 (8 consecutive 16-bit elements); register j of lane l gets
 * matrix j's row l / 4, elements 2 (l % 4) and the next (low half first), or with .trans its
 * column l / 4, rows 2 (l % 4) and the next. */
template <bool TRANS> static void cuemu_ldmatrix_x4_all(void)
{
    for (int l = 0; l < 32; l++) {
        uint32_t *r = (uint32_t *)cuemu_warp_ptrs(l)[1];
        for (int j = 0; j < 4; j++) {
            uint16_t e[2];
            for (int h = 0; h < 2; h++) {
                const int row = TRANS ? 2 * (l % 4) + h : l / 4,
                          col = TRANS ? l / 4 : 2 * (l % 4) + h;
                memcpy(&e[h], (const uint16_t *)cuemu_warp_ptrs(8 * j + row)[0] + col, 2);
            }
            r[j] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
        }
    }
}

static inline void cuemu_ldmatrix_x4(uint32_t *r, const void *row, bool trans)
{
    void **mine = cuemu_warp_ptrs(cuemu_lane());
    mine[0] = (void *)row;
    mine[1] = (void *)r;
    cuemu_sync_warp_do(trans ? cuemu_ldmatrix_x4_all<true> : cuemu_ldmatrix_x4_all<false>);
}
#endif
