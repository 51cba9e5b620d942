/* delta_net_mma.h (internal, CUDA C++): the block-wide building blocks of the chunked CUDA
 * delta rule kernels (delta_net_chunk.cu, delta_net_wy.cu) and FLASH_ATTN (flash_attn.cu):
 * products of small shared- or global-memory matrices on tensor cores, in three TF32
 * products (F32-level precision) or one, and a fill of a shared tile from global memory with
 * many loads in flight. Every function here is called by the whole block together. wmma's
 * row_major and col_major name the operands' layouts; its fragments are no longer used. */
#ifndef LATHE_BACKEND_CUDA_DELTA_NET_MMA_H
#define LATHE_BACKEND_CUDA_DELTA_NET_MMA_H

#include <mma.h>

#include <type_traits>

namespace wmma = nvcuda::wmma;

/* Cm (+)= alpha diag(rs) A B over M x N x K on tensor cores, in three TF32 products
 * (A_hi B + A B_lo + A_lo B with A = A_hi + A_lo rounded to TF32 twice), which keeps about
 * F32's precision: one TF32 product would put the gradients ~1e-3 off. With TF1 it is that
 * one product (A and B rounded to TF32 to nearest, F32 accumulation): a third of the
 * tensor-core work and no split, for nodes that allow it (LT_DELTA_NET_PREC_TF32). A(m, k) is
 * A[m * lda + k] (LA row-major) or A[m + k * lda] (column-major), B(k, n) likewise; M and N
 * are multiples of 16, K of 8. Only rows m < m_valid and columns n < n_valid of Cm are
 * stored. The block calls it together; the caller synchronises before reading Cm, which must
 * not overlap A or B.
 *
 * The products are PTX's mma.sync m16n8k8 on TF32 operands, each lane loading its own
 * fragment elements with plain loads: A's row g and g + 8, columns t and t + 4 (g = lane / 4,
 * t = lane % 4), B's rows t and t + 4 of column g. wmma's loads took generic addresses (the
 * API cannot name shared memory) and its accumulators went out through shared memory to
 * reach their elements; here a lane knows its accumulator elements and stores them itself.
 * With leading dimensions of 4 mod 32 (the kernels pad their tiles so), A's row-major loads
 * and B's column-major ones touch 32 banks.
 *
 * A warp takes a strip of NT output tiles of 16 x 16 side by side (cb_strip_tiles picks NT
 * from M and N alone), with NT accumulators that share each A fragment: NT independent
 * chains of products in flight instead of one. Element (m, n) of Cm is always read and
 * written by the same lane of the same warp for the same M and N, so calls that accumulate
 * into one Cm of one shape need no barrier between them. */

/* A 16 x 16 accumulator tile as two m16n8 halves: x[4 h + i] is element
 * (g + 8 (i / 2), 8 h + 2 t + i % 2), g = lane / 4, t = lane % 4 (mma.sync's C layout). */
struct cb_tile {
    float x[8];
};

static __device__ __forceinline__ void cb_tile_zero(cb_tile &c)
{
#pragma unroll
    for (int i = 0; i < 8; i++)
        c.x[i] = 0.0f;
}

/* the tile's element i as (row, column) within the tile, for this lane */
static __device__ __forceinline__ int cb_tile_row(int i)
{
    return (threadIdx.x & 31) / 4 + 8 * (i % 4 / 2);
}
static __device__ __forceinline__ int cb_tile_col(int i)
{
    return 8 * (i / 4) + 2 * (threadIdx.x & 3) + i % 2;
}

/* d += a b on a 16 x 8 x 8 tile (mma.sync.m16n8k8, TF32 operands, F32 accumulation); a and
 * b hold TF32 values (their low 13 bits are not read) */
static __device__ __forceinline__ void cb_mma1688(float *d, const float *a, const float *b)
{
#ifdef LATHE_CUEMU_CORE_H
    cuemu_mma_m16n8k8_tf32(d, a, b);
#else
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
#endif
}

/* TF32 operands, rounded to nearest with ties away from zero as cvt.rna.tf32.f32 rounds:
 * half a TF32 unit (bit 12) added to the bits. The tensor cores read an operand's top 19
 * bits only, so that sum is already the rounded operand (an infinity or a NaN stays one);
 * cb_tf32 masks the rest off where the value itself is needed. cvt.rna.tf32.f32 is no
 * single Hopper instruction: ptxas made it a compare and a predicated add (Nsight Compute:
 * FSETP 13% and IMAD 26% of the grad kernel's instructions, HMMA 4%). */
static __device__ __forceinline__ float cb_tf32_operand(float x)
{
    return __uint_as_float(__float_as_uint(x) + 0x1000u);
}

static __device__ __forceinline__ float cb_tf32(float x)
{
    return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
}

/* x as a TF32 operand (TF1), or split into its TF32 high part (x) and the rest (lo), both
 * operands */
template <bool TF1, int N> static __device__ __forceinline__ void cb_operand(float *x, float *lo)
{
#pragma unroll
    for (int i = 0; i < N; i++) {
        if (TF1) {
            x[i] = cb_tf32_operand(x[i]);
        } else {
            const float h = cb_tf32(x[i]);
            lo[i] = cb_tf32_operand(x[i] - h);
            x[i] = h;
        }
    }
}

/* tiles a warp's strip: the most of 4, 2, 1 that divides N's tiles and still leaves a strip
 * for each of CB_WARPS warps (1 when even single tiles leave warps idle). A function of M and
 * N alone, so that constant sizes pick their strips at compile time; every block that calls
 * these has CB_WARPS warps (a block of another size would still be right, only less even;
 * cb_acc64 needs exactly that many). A source whose blocks are larger defines CB_WARPS
 * before it includes this header. */
#ifndef CB_WARPS
#define CB_WARPS 8
#endif
static __device__ __forceinline__ int cb_strip_tiles(int M, int N)
{
    const int tm = M / 16, tn = N / 16;
    return tn % 4 == 0 && tm * (tn / 4) >= CB_WARPS   ? 4
           : tn % 2 == 0 && tm * (tn / 2) >= CB_WARPS ? 2
                                                      : 1;
}

/* c[u] += A(rows m0.., all K) B(all K, columns n_first + u n_step ..) for u < n_count (at
 * most NT): one A fragment a k-step, shared by the column tiles. TF1: A and B rounded to
 * TF32 once; else each split into a TF32 high part and the rest, three products (a_lo b,
 * a b_lo, a b), near F32. A and B row-major (LA, LB wmma::row_major) or column-major. PA, PB:
 * A, B hold TF32 values already (cb_tf32's, stored so by the kernel), which TF1 reads as
 * they are; the three-product split ignores them. */
template <typename LA, typename LB, bool TF1, int NT, bool PA = false, bool PB = false>
static __device__ __forceinline__ void cb_row_products(cb_tile *c, const float *A, int lda,
                                                       const float *B, int ldb, int m0, int K,
                                                       int n_first, int n_step, int n_count)
{
    const bool a_row = std::is_same<LA, wmma::row_major>::value,
               b_row = std::is_same<LB, wmma::row_major>::value;
    const int g = (threadIdx.x & 31) / 4, t = threadIdx.x & 3;
    /* A(m0 + g, t) and B(t, g): each k-step moves them 8 columns (rows) on */
    const float *Ag = a_row ? A + (m0 + g) * lda + t : A + (m0 + g) + t * lda;
    const int a8 = a_row ? 8 : 8 * lda, a_k4 = a_row ? 4 : 4 * lda, a_m8 = a_row ? 8 * lda : 8;
    const int b_k4 = b_row ? 4 * ldb : 4, b_n = b_row ? 1 : ldb;
    for (int k0 = 0; k0 < K; k0 += 8) {
        const float *Ak = Ag + (k0 / 8) * a8;
        float a[4] = {Ak[0], Ak[a_m8], Ak[a_k4], Ak[a_m8 + a_k4]}, a_lo[4];
        if (!TF1 || !PA)
            cb_operand<TF1, 4>(a, a_lo);
        const float *Bk = b_row ? B + (k0 + t) * ldb : B + k0 + t;
#pragma unroll
        for (int u = 0; u < NT; u++) {
            if (u >= n_count)
                break;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int n = n_first + n_step * u + 8 * hf + g;
                float b[2] = {Bk[n * b_n], Bk[n * b_n + b_k4]}, b_lo[2];
                if (!TF1 || !PB)
                    cb_operand<TF1, 2>(b, b_lo);
                float *d = c[u].x + 4 * hf;
                if (!TF1) {
                    cb_mma1688(d, a_lo, b);
                    cb_mma1688(d, a, b_lo);
                }
                cb_mma1688(d, a, b);
            }
        }
    }
}

template <typename LA, typename LB, bool TF1, int NT, bool PA, bool PB>
static __device__ __forceinline__ void
cb_mma_strips(float *Cm, int64_t ldc, const float *A, int lda, const float *B, int ldb, int M,
              int N, int K, float alpha, bool acc, const float *rs, int m_valid, int n_valid)
{
    const int warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    const int sn = N / (16 * NT), strips = (M / 16) * sn;
    for (int s = warp; s < strips; s += n_warps) {
        const int m0 = s / sn * 16, nb = s % sn * (16 * NT);
        /* the lanes' old values first, all in flight while the strip's products run (Cm
         * may be global: the chunk-parallel backward accumulates dq and dk there); Cm never
         * overlaps A or B */
        float old[NT][8];
#pragma unroll
        for (int u = 0; u < NT; u++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int m = m0 + cb_tile_row(i), n = nb + 16 * u + cb_tile_col(i);
                old[u][i] = acc && m < m_valid && n < n_valid ? Cm[m * ldc + n] : 0.0f;
            }
        cb_tile c[NT];
#pragma unroll
        for (int u = 0; u < NT; u++)
            cb_tile_zero(c[u]);
        cb_row_products<LA, LB, TF1, NT, PA, PB>(c, A, lda, B, ldb, m0, K, nb, 16, NT);
#pragma unroll
        for (int u = 0; u < NT; u++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int m = m0 + cb_tile_row(i), n = nb + 16 * u + cb_tile_col(i);
                if (m < m_valid && n < n_valid)
                    Cm[m * ldc + n] = old[u][i] + (rs ? alpha * rs[m] : alpha) * c[u].x[i];
            }
    }
}

template <typename LA, typename LB, bool TF1, bool PA = false, bool PB = false>
static __device__ __forceinline__ void
cb_mma(float *Cm, int64_t ldc, const float *A, int lda, const float *B, int ldb, int M, int N,
       int K, float alpha, bool acc, const float *rs, int m_valid, int n_valid)
{
    switch (cb_strip_tiles(M, N)) {
    case 4:
        cb_mma_strips<LA, LB, TF1, 4, PA, PB>(Cm, ldc, A, lda, B, ldb, M, N, K, alpha, acc, rs, m_valid,
                                      n_valid);
        break;
    case 2:
        cb_mma_strips<LA, LB, TF1, 2, PA, PB>(Cm, ldc, A, lda, B, ldb, M, N, K, alpha, acc, rs, m_valid,
                                      n_valid);
        break;
    default:
        cb_mma_strips<LA, LB, TF1, 1, PA, PB>(Cm, ldc, A, lda, B, ldb, M, N, K, alpha, acc, rs, m_valid,
                                      n_valid);
    }
}

/* cb_mma with A(m, k) = A[m * ar + k * ac] and B(k, n) = B[k * br + n * bc], one stride of
 * each 1 (which picks the layouts); TF1, PA and PB as cb_row_products' */
template <bool TF1 = false, bool PA = false, bool PB = false>
static __device__ __forceinline__ void
cb_mm(float *Cm, int64_t ldc, const float *A, int ar, int ac, const float *B, int br,
      int bc, int M, int N, int K, float alpha, bool acc, const float *rs = NULL,
      int m_valid = 1 << 30, int n_valid = 1 << 30)
{
    using RM = wmma::row_major;
    using CM = wmma::col_major;
    if (ac == 1 && bc == 1)
        cb_mma<RM, RM, TF1, PA, PB>(Cm, ldc, A, ar, B, br, M, N, K, alpha, acc, rs, m_valid, n_valid);
    else if (ac == 1)
        cb_mma<RM, CM, TF1, PA, PB>(Cm, ldc, A, ar, B, bc, M, N, K, alpha, acc, rs, m_valid, n_valid);
    else if (bc == 1)
        cb_mma<CM, RM, TF1, PA, PB>(Cm, ldc, A, ac, B, br, M, N, K, alpha, acc, rs, m_valid, n_valid);
    else
        cb_mma<CM, CM, TF1, PA, PB>(Cm, ldc, A, ac, B, bc, M, N, K, alpha, acc, rs, m_valid, n_valid);
}

/* A [64 x N] result (N a multiple of 16, at most 128) that a block of CB_WARPS warps (8 or
 * 16) builds in registers over several products, stored once at the end: warp w holds row
 * tile w % 4 and column tiles w / 4 + u CB_WARPS / 4 (u < CB_ACC_TILES, those below N / 16).
 * The chunk-parallel backward's dq and dk are sums of seven and more products each;
 * accumulated in the result, every product read and wrote them back through global memory. */
#define CB_ACC_TILES (32 / CB_WARPS)
static_assert(CB_WARPS == 8 || CB_WARPS == 16, "cb_acc64: 4 row tiles, 8 column tiles of 16");
struct cb_acc64 {
    cb_tile c[CB_ACC_TILES];
};

static __device__ __forceinline__ void cb_acc64_zero(cb_acc64 &acc)
{
#pragma unroll
    for (int u = 0; u < CB_ACC_TILES; u++)
        cb_tile_zero(acc.c[u]);
}

/* acc += A B over 64 x N x K, A and B as cb_mma's (TF1 likewise); the block calls it
 * together, and needs no barrier between calls on one acc */
template <typename LA, typename LB, bool TF1, bool PA, bool PB>
static __device__ __forceinline__ void cb_acc64_mma(cb_acc64 &acc, const float *A, int lda,
                                                    const float *B, int ldb, int N, int K)
{
    constexpr int step = CB_WARPS / 4;
    const int warp = threadIdx.x / 32, u0 = warp / 4, tn = N / 16;
    cb_row_products<LA, LB, TF1, CB_ACC_TILES, PA, PB>(acc.c, A, lda, B, ldb, warp % 4 * 16, K,
                                                       u0 * 16, 16 * step,
                                                       tn > u0 ? (tn - u0 + step - 1) / step : 0);
}

/* cb_acc64_mma with A(m, k) = A[m * ar + k * ac] and B(k, n) = B[k * br + n * bc], one
 * stride of each 1 (as cb_mm) */
template <bool TF1, bool PA = false, bool PB = false>
static __device__ __forceinline__ void cb_acc64_mm(cb_acc64 &acc, const float *A, int ar, int ac,
                                                   const float *B, int br, int bc, int N, int K)
{
    using RM = wmma::row_major;
    using CM = wmma::col_major;
    if (ac == 1 && bc == 1)
        cb_acc64_mma<RM, RM, TF1, PA, PB>(acc, A, ar, B, br, N, K);
    else if (ac == 1)
        cb_acc64_mma<RM, CM, TF1, PA, PB>(acc, A, ar, B, bc, N, K);
    else if (bc == 1)
        cb_acc64_mma<CM, RM, TF1, PA, PB>(acc, A, ac, B, br, N, K);
    else
        cb_acc64_mma<CM, CM, TF1, PA, PB>(acc, A, ac, B, bc, N, K);
}

/* Cm[m * ldc + n] = acc(m, n) for m < m_valid, n < n_valid, each lane its own elements; the
 * block calls it together */
static __device__ __forceinline__ void cb_acc64_store(cb_acc64 &acc, float *Cm,
                                                      int64_t ldc, int N, int m_valid, int n_valid)
{
    constexpr int step = CB_WARPS / 4;
    const int warp = threadIdx.x / 32, m0 = warp % 4 * 16, u0 = warp / 4, tn = N / 16;
#pragma unroll
    for (int u = 0; u < CB_ACC_TILES; u++) {
        if (u0 + step * u >= tn)
            break;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int m = m0 + cb_tile_row(i), n = (u0 + step * u) * 16 + cb_tile_col(i);
            if (m < m_valid && n < n_valid)
                Cm[m * ldc + n] = acc.c[u].x[i];
        }
    }
}

/* st(r, c, ld(r, c)) for every r < rows, c < cols: warp w takes rows w, w + 8, ..., lane l
 * columns l, l + 32, ... (a row's global reads coalesced), CB_INFLIGHT rows of loads in
 * flight before their stores. A plain loop would wait out a global load's latency (~1 us
 * from HBM) per element, since the compiler cannot move a load past a store it cannot
 * prove apart; the first chunked kernels lost most of their time so (21 ms a
 * DELTA_NET_BACK at 16 x 512 tokens of Qwen3.5-0.8B), and a flat index's division by a
 * runtime width cost more instructions than the load. */
#define CB_INFLIGHT 8
template <typename Ld, typename St>
static __device__ __forceinline__ void cb_fill(int rows, int cols, Ld ld, St st)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int r0 = warp; r0 < rows; r0 += nw * CB_INFLIGHT)
        for (int c = lane; c < cols; c += 32) {
            float v[CB_INFLIGHT];
#pragma unroll
            for (int k = 0; k < CB_INFLIGHT; k++) {
                const int r = r0 + k * nw;
                v[k] = r < rows ? ld(r, c) : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < CB_INFLIGHT; k++) {
                const int r = r0 + k * nw;
                if (r < rows)
                    st(r, c, v[k]);
            }
        }
}

/* One pivot q of a unit lower triangular substitution on a warp's CPW columns, lane l
 * holding rows l and l + 32 of each (u0, u1): row q is final, so it is broadcast, and the
 * lane's rows take away their multiples a0, a1 of it (delta_net_chunk.cu's cb_solve_cols,
 * delta_net_wy_impl.h's wy_solve64) */
template <int CPW>
static __device__ __forceinline__ void cb_pivot(float (&u0)[CPW], float (&u1)[CPW], float a0,
                                                float a1, int q)
{
#pragma unroll
    for (int k = 0; k < CPW; k++) {
        const float uq = __shfl_sync(0xffffffffu, q < 32 ? u0[k] : u1[k], q & 31);
        u0[k] = fmaf(-a0, uq, u0[k]);
        u1[k] = fmaf(-a1, uq, u1[k]);
    }
}

#endif
