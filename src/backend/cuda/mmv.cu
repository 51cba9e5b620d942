/* mmv.cu: MUL_MAT of few columns (N <= 8: decode) by lathe's own kernels, which read the
 * weight's rows once in their own type and sum their products with the F32 columns of b in
 * F32 (matmul.cu decides when, mmv.cuh says what it passes):
 *   - mmv_half_kernel: unsplit F16 / BF16 rows against unit-strided columns, warp teams of
 *     one or four rows, a row split over up to 8 warps when rows are few;
 *   - mmv_q8_0_kernel (Q8_0 staged in shared memory, with LATHE_CUDA_MMVQ=0: by default
 *     mmvq.cu takes Q8_0) and mmv_q4k_kernel (Q4_K, a block a warp step): a warp a row;
 *   - mmv_kernel: any other weight or layout, a warp a row, element by element.
 * Each kernel's comment says what it was measured against. */
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/mmv.cuh"
#include "backend/cuda/quant.cuh"

/* The weight type is a template parameter (TYPE; -1: read from the tensor at run time, for
 * a type no instantiation names), so the dequantiser's switch, the block size and the
 * divisions by it are resolved at compile time: with the type read per element, the
 * measured decode products ran at 50-120 GB/s of weights on an H200. */
template <int TYPE> static __device__ __forceinline__ int mmv_type(const struct cu_t &a)
{
    return TYPE >= 0 ? TYPE : a.type;
}

/* element k of a row of a whose elements (or blocks) are nb0 apart */
static __device__ __forceinline__ float row_elem(const char *row, int type, int k, int64_t nb0)
{
    const int bs = cu_block_size(type);
    if (bs == 1)
        return cu_load(row + (int64_t)k * nb0, type);
    return cu_dequant((const uint8_t *)row + (int64_t)(k / bs) * nb0, type, k % bs);
}

/* 8 halves (F16 or BF16) held in u, as floats */
static __device__ __forceinline__ void unpack8(const uint4 u, int type, float *w)
{
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
    for (int e = 0; e < 4; e++) {
        const uint16_t lo = (uint16_t)(v[e] & 0xffffu), hi = (uint16_t)(v[e] >> 16);
        if (type == LT_TYPE_BF16) {
            w[2 * e] = __uint_as_float((uint32_t)lo << 16);
            w[2 * e + 1] = __uint_as_float((uint32_t)hi << 16);
        } else {
            __half_raw hl, hh;
            hl.x = lo;
            hh.x = hi;
            w[2 * e] = __half2float(__half(hl));
            w[2 * e + 1] = __half2float(__half(hh));
        }
    }
}

/* 8 halves (F16 or BF16) at p, 16-byte aligned, as floats */
static __device__ __forceinline__ void load8(const char *p, int type, float *w)
{
    unpack8(*(const uint4 *)p, type, w);
}

/* A warp's row: its lanes' partial sums acc[n] added across the warp, and lane 0 storing
 * the N <= NC results at dst[n M] */
template <int NC>
static __device__ __forceinline__ void mmv_row_out(float *acc, int lane, float *dst, int64_t N,
                                                   int64_t M)
{
#pragma unroll
    for (int n = 0; n < NC; n++)
        for (int o = 16; o > 0; o >>= 1)
            acc[n] += __shfl_xor_sync(0xffffffffu, acc[n], o);
    if (lane == 0)
        for (int n = 0; n < NC && n < N; n++)
            dst[n * M] = acc[n];
}

/* Output row r = (m, i2, i3) of the warp-a-row kernels: its row of a (a's dims 2 and 3
 * broadcast by r2, r3), b's columns for it, and where its results go (column n at out[n M]) */
struct mmv_row {
    const char *row, *xb;
    float *out;
};

static __device__ __forceinline__ mmv_row mmv_row_at(const struct cu_t &a, const struct cu_t &b,
                                                     float *dst, int64_t r, int64_t r2, int64_t r3)
{
    const int64_t M = a.ne[1], N = b.ne[1], B2 = b.ne[2];
    const int64_t m = r % M, i2 = (r / M) % B2, i3 = r / (M * B2);
    return {a.data + m * a.nb[1] + (i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3],
            b.data + i2 * b.nb[2] + i3 * b.nb[3], dst + (i3 * B2 + i2) * N * M + m};
}

/* the warps' grid-stride loop over output rows: this warp's first, and the step */
static __device__ __forceinline__ int64_t mmv_warp_first()
{
    return (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}
static __device__ __forceinline__ int64_t mmv_warp_step()
{
    return (int64_t)gridDim.x * (blockDim.x >> 5);
}

/* dst[m, n, i2, i3] for n < N <= NC: warp w takes output rows (m, i2, i3) w, w + warps, ...
 * VEC: unsplit F16 / BF16 rows read 8 elements (16 bytes) a lane at a time (b's columns
 * strided: mmv_half_kernel takes unit-strided ones). */
template <int TYPE, int NC, bool VEC>
static __global__ void mmv_kernel(struct cu_t a, struct cu_t b, float *dst, int64_t r2, int64_t r3)
{
    const int type = mmv_type<TYPE>(a);
    const int K = (int)a.ne[0];
    const int64_t N = b.ne[1], rows = a.ne[1] * b.ne[2] * b.ne[3];
    const int lane = threadIdx.x & 31;
    for (int64_t r = mmv_warp_first(); r < rows; r += mmv_warp_step()) {
        const mmv_row R = mmv_row_at(a, b, dst, r, r2, r3);
        const char *row = R.row, *xb = R.xb;
        float acc[NC];
#pragma unroll
        for (int n = 0; n < NC; n++)
            acc[n] = 0.0f;
        if (VEC) {
#pragma unroll 4
            for (int k8 = lane; k8 < K / 8; k8 += 32) {
                float w[8];
                load8(row + (int64_t)k8 * 16, type, w);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const char *xk = xb + (int64_t)(8 * k8 + e) * b.nb[0];
#pragma unroll
                    for (int n = 0; n < NC; n++)
                        if (n < N)
                            acc[n] += w[e] * *(const float *)(xk + n * b.nb[1]);
                }
            }
        } else {
#pragma unroll 4
            for (int k = lane; k < K; k += 32) {
                const float w = row_elem(row, type, k, a.nb[0]);
                const char *xk = xb + (int64_t)k * b.nb[0];
#pragma unroll
                for (int n = 0; n < NC; n++)
                    if (n < N)
                        acc[n] += w * *(const float *)(xk + n * b.nb[1]);
            }
        }
        mmv_row_out<NC>(acc, lane, R.out, N, a.ne[1]);
    }
}

/* Unsplit F16 / BF16 rows against F32 columns whose floats are unit-strided and 16-byte
 * aligned (decode's products; cu_mmv_run's half_cols). A team of WPR warps takes RW output
 * rows (RW > 1: one slice, B2 = B3 = 1); a block of 8 warps has 8 / WPR teams. Warp `part`
 * of a team takes the rows' 16-byte chunks part * 32 + lane, then every 32 * WPR-th: for
 * each of its RW rows it issues U chunk loads before using any (RW U loads in flight a
 * lane), then reads the columns' 8 floats under a chunk once for all RW rows. So a lane
 * keeps several loads in flight (one row of 1024 halves is only 4 chunks a lane) and the
 * columns are read from L1 once every RW rows. WPR > 1 spreads a product of few rows over
 * every SM (the 0.8B model's output and down projections have 1024); the WPR partial sums
 * meet in shared memory in part order. The weights stream through once (__ldcs: evict
 * first), so that the columns stay in L1. */
template <int NC> struct mmv_half_unroll {
    static constexpr int u = NC <= 2 ? 4 : 2; /* registers: RW U chunks, RW NC sums */
};

/* GLU (MUL_MAT_GLU, one slice): a team's output h is silu(a row h . b) * (a row H + h . b),
 * H = M / 2: its RW = 2 rows are h and H + h, and the walk over them is the same.
 * EPI (MUL_MAT_ADD_RMS_NORM, one slice, one column, RW 1): dst holds the residual plus each
 * output, and the last block norms them (norm_epi.cuh); with no norm weight (epi.w NULL:
 * MUL_MAT_ACC) dst holds the addend plus each output, and nothing follows.
 * NORM (RMS_NORM_MUL_MAT, one slice, one column): every block norms the column b first, as
 * RMS_NORM with the weight epi.w and epi.eps does (squares summed in double, each product
 * rounded), into dynamic shared memory (K floats), and its products read it there. */
template <int TYPE, int NC, int RW, int WPR, bool GLU = false, bool EPI = false, bool NORM = false>
static __global__ void __launch_bounds__(256)
    mmv_half_kernel(struct cu_t a, struct cu_t b, float *dst, int64_t r2, int64_t r3,
                    struct cu_norm_epi epi)
{
    static_assert(!GLU || RW == 2, "a GLU team takes its gate row and its up row");
    static_assert(!EPI || (NC == 1 && RW == 1 && !GLU), "the epilogue norms one column");
    static_assert(!NORM || (NC == 1 && !EPI), "the prologue norms one column");
    constexpr int OUT = GLU ? 1 : RW; /* outputs a team */
    constexpr int TEAMS = 8 / WPR, RPB = TEAMS * OUT, STEP = 32 * WPR, U = mmv_half_unroll<NC>::u;
    __shared__ float part_sum[8][RW][NC];
    const int K8 = (int)(a.ne[0] / 8);
    const int64_t M = a.ne[1], N = b.ne[1], B2 = b.ne[2], H = M / 2;
    const int64_t rows = GLU ? H : M * B2 * b.ne[3]; /* outputs */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, part = w % WPR;
    { /* PDL (cuda_common.h): the rows of the block's first turn into L2 meanwhile */
        const int64_t r = (int64_t)blockIdx.x * RPB + (int64_t)(w / WPR) * OUT + (GLU ? 0 : lane);
        if (part == 0 && lane < RW && r < rows) {
            const int64_t m = GLU ? r + lane * H : r % M, i2 = GLU ? 0 : (r / M) % B2,
                          i3 = GLU ? 0 : r / (M * B2);
            cu_prefetch_l2_span(a.data + m * a.nb[1] + (i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3],
                                (int64_t)K8 * 16);
        }
    }
    /* NORM: the norm's weight (no kernel writes it) is loaded before the wait, up to
     * CU_EPI_KEEP elements a thread (K <= 2048), and the column's elements are kept in
     * registers between its sum of squares and the normed stores (one trip to L2 after the
     * wait, where loading both after it took two). On an H100 (2026-12-07), the 0.8B BF16
     * file's tg128 with RMS_NORM_MUL_MAT against LATHE_FUSE_NORM_MM=0: 719.7 against 743.2
     * with two trips, 780.3 / 773.0 against 725.2 / 724.2 / 727.1 with one */
    float wv[CU_EPI_KEEP];
    if (NORM)
        cu_norm_weights(epi.w, (int64_t)K8 * 8, wv);
    cu_pdl_enter();
    extern __shared__ float4 normed[]; /* NORM: the normed column, K floats */
    if (NORM) {
        __shared__ double red[32];
        cu_block_rms_norm((const float *)b.data, epi.w, wv, (float *)normed, (int64_t)K8 * 8,
                          epi.eps, red);
        __syncthreads();
    }
    /* every block takes the same number of turns: the barriers below are reached by all */
    for (int64_t r0 = (int64_t)blockIdx.x * RPB; r0 < rows; r0 += (int64_t)gridDim.x * RPB) {
        const int64_t rb = r0 + (int64_t)(w / WPR) * OUT; /* the team's first output */
        float acc[RW][NC];
#pragma unroll
        for (int t = 0; t < RW; t++)
#pragma unroll
            for (int n = 0; n < NC; n++)
                acc[t][n] = 0.0f;
        if (rb < rows) {
            const int64_t i2 = (rb / M) % B2, i3 = rb / (M * B2);
            const char *xb = b.data + i2 * b.nb[2] + i3 * b.nb[3];
            const uint4 *row[RW];
#pragma unroll
            for (int t = 0; t < RW; t++) { /* rows past the end read the team's first again */
                const int64_t m = GLU ? rb + t * H : (rb + t < rows ? rb + t : rb) % M;
                row[t] = (const uint4 *)(a.data + m * a.nb[1] + (i2 / r2) * a.nb[2] +
                                         (i3 / r3) * a.nb[3]);
            }
            for (int k0 = part * 32 + lane; k0 < K8; k0 += U * STEP) {
                uint4 u[RW][U];
#pragma unroll
                for (int t = 0; t < RW; t++)
#pragma unroll
                    for (int i = 0; i < U; i++)
                        if (k0 + i * STEP < K8)
                            u[t][i] = __ldcs(row[t] + k0 + i * STEP);
#pragma unroll
                for (int i = 0; i < U; i++) {
                    const int k8 = k0 + i * STEP;
                    if (k8 >= K8)
                        break;
                    float wf[RW][8];
#pragma unroll
                    for (int t = 0; t < RW; t++)
                        unpack8(u[t][i], TYPE, wf[t]);
#pragma unroll
                    for (int n = 0; n < NC; n++)
                        if (n < N) {
                            const float4 *xk = NORM ? normed + 2 * k8
                                                    : (const float4 *)(xb + n * b.nb[1]) + 2 * k8;
                            const float4 x0 = NORM ? xk[0] : __ldg(xk),
                                         x1 = NORM ? xk[1] : __ldg(xk + 1);
#pragma unroll
                            for (int t = 0; t < RW; t++)
                                acc[t][n] += wf[t][0] * x0.x + wf[t][1] * x0.y + wf[t][2] * x0.z +
                                             wf[t][3] * x0.w + wf[t][4] * x1.x + wf[t][5] * x1.y +
                                             wf[t][6] * x1.z + wf[t][7] * x1.w;
                        }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < RW; t++)
#pragma unroll
            for (int n = 0; n < NC; n++)
                for (int o = 16; o > 0; o >>= 1)
                    acc[t][n] += __shfl_xor_sync(0xffffffffu, acc[t][n], o);
        if (WPR > 1) {
            if (lane == 0)
#pragma unroll
                for (int t = 0; t < RW; t++)
#pragma unroll
                    for (int n = 0; n < NC; n++)
                        part_sum[w][t][n] = acc[t][n];
            __syncthreads();
            if (part == 0)
#pragma unroll
                for (int t = 0; t < RW; t++)
#pragma unroll
                    for (int n = 0; n < NC; n++)
                        for (int p = 1; p < WPR; p++)
                            acc[t][n] += part_sum[w + p][t][n];
            __syncthreads(); /* part_sum is written again in the next turn */
        }
        if (GLU && part == 0 && lane == 0 && rb < rows) {
            for (int n = 0; n < NC && n < N; n++) { /* SWIGLU's value (unary.cu) */
                const float g = acc[0][n];
                dst[n * H + rb] = g / (1.0f + expf(-g)) * acc[1][n];
            }
        } else if (!GLU && part == 0 && lane == 0)
#pragma unroll
            for (int t = 0; t < RW; t++) {
                const int64_t r = rb + t;
                if (r >= rows)
                    break;
                const int64_t m = r % M, i2 = (r / M) % B2, i3 = r / (M * B2);
                for (int n = 0; n < NC && n < N; n++)
                    dst[((i3 * B2 + i2) * N + n) * M + m] =
                        EPI ? cu_epi_sum(epi, m, acc[t][n]) : acc[t][n];
            }
    }
    if (EPI)
        cu_epi_finish(epi, dst, M);
}

/* Q8_0 rows of K % 256 == 0 elements, 16-byte aligned (rows of whole 272-byte groups of 8
 * blocks), against unit-strided 16-byte aligned F32 columns: the warp stages 32 blocks
 * (1088 bytes) of its row in shared memory with 16-byte loads, then each lane takes one
 * block, the sum of its 32 products times its scale (the CPU's exact kernel's order of
 * work: sum(q x) per block, then d). The element kernel above reads a byte and the scale
 * per element: the 0.8B model's Q8_0 head ran at ~270 GB/s through it. */
#define Q8_BLOCK 34
template <int NC>
static __global__ void mmv_q8_0_kernel(struct cu_t a, struct cu_t b, float *dst, int64_t r2,
                                       int64_t r3)
{
    __shared__ uint4 stage[8][32 * Q8_BLOCK / 16];
    const int nblk = (int)(a.ne[0] / 32);
    const int64_t N = b.ne[1], rows = a.ne[1] * b.ne[2] * b.ne[3];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int64_t r = mmv_warp_first(); r < rows; r += mmv_warp_step()) {
        const mmv_row R = mmv_row_at(a, b, dst, r, r2, r3);
        const char *row = R.row, *xb = R.xb;
        float acc[NC];
#pragma unroll
        for (int n = 0; n < NC; n++)
            acc[n] = 0.0f;
        for (int c0 = 0; c0 < nblk; c0 += 32) {
            const int nb = nblk - c0 < 32 ? nblk - c0 : 32; /* a multiple of 8 */
            const uint4 *src = (const uint4 *)(row + (int64_t)c0 * Q8_BLOCK);
            for (int i = lane; i < nb * Q8_BLOCK / 16; i += 32)
                stage[w][i] = src[i];
            __syncwarp();
            if (lane < nb) {
                const uint8_t *blk = (const uint8_t *)stage[w] + lane * Q8_BLOCK;
                const float d = cu_f16_at(blk);
                float q[32];
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const uint16_t u = *(const uint16_t *)(blk + 2 + 2 * j);
                    q[2 * j] = (float)(int8_t)(u & 0xff);
                    q[2 * j + 1] = (float)(int8_t)(u >> 8);
                }
#pragma unroll
                for (int n = 0; n < NC; n++)
                    if (n < N) {
                        const float4 *xk =
                            (const float4 *)(xb + n * b.nb[1]) + (int64_t)(c0 + lane) * 8;
                        float sum = 0.0f;
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            const float4 x = xk[j];
                            sum += q[4 * j] * x.x + q[4 * j + 1] * x.y + q[4 * j + 2] * x.z +
                                   q[4 * j + 3] * x.w;
                        }
                        acc[n] += d * sum;
                    }
            }
            __syncwarp();
        }
        mmv_row_out<NC>(acc, lane, R.out, N, a.ne[1]);
    }
}

/* a of `type` in blocks of `block` bytes, K a multiple of 256, its rows `align`-byte aligned;
 * b's floats unit-strided, its columns 16-byte aligned: what the block kernels below load */
static bool mmv_blocks_fit(const struct cu_mmv_shape *p, const struct cu_t &av,
                           const struct cu_t &bv, int type, size_t block, unsigned align)
{
    return av.type == type && av.nb[0] == block && p->K % 256 == 0 &&
           (uintptr_t)av.data % align == 0 && (p->M <= 1 || av.nb[1] % align == 0) &&
           (p->A2 <= 1 || av.nb[2] % align == 0) && (p->A3 <= 1 || av.nb[3] % align == 0) &&
           bv.nb[0] == 4 && (uintptr_t)bv.data % 16 == 0 && (p->N <= 1 || bv.nb[1] % 16 == 0) &&
           (p->B2 <= 1 || bv.nb[2] % 16 == 0) && (p->B3 <= 1 || bv.nb[3] % 16 == 0);
}

/* whether mmv_q8_0_kernel takes a (Q8_0) and b: see its comment */
static bool q8_staged(const struct cu_mmv_shape *p, const struct cu_t &av, const struct cu_t &bv)
{
    return mmv_blocks_fit(p, av, bv, LT_TYPE_Q8_0, Q8_BLOCK, 16);
}

/* Q4_K rows (blocks of 256 elements in 144 bytes: f16 d and dmin, 12 bytes of eight 6-bit
 * scales and mins, 128 bytes of 4-bit quants) whose blocks are 4-byte aligned, against
 * unit-strided 16-byte aligned F32 columns: a warp a row, one block a step of the warp, lane
 * l taking quant bytes 32 j + 4 i .. + 3 of it (j = l / 8, i = l % 8): their low nibbles are
 * elements 64 j + 4 i .. + 3 of sub-block 2 j, their high ones the same 32 further on, of
 * sub-block 2 j + 1. So the warp reads a block's quants in one 128-byte load, its scales
 * and d once (every lane the same words), and each element is dequantised as
 * cu_dequant does it (d scale q - dmin min, each product rounded), so only the order of the
 * sums differs from the element kernel's. MMV_Q4K_U blocks' words are loaded before any is
 * used. The element kernel (mmv_kernel) reads a byte and the scales per element. */
#define Q4K_BLOCK 144
#define MMV_Q4K_U 4
template <int NC>
static __global__ void mmv_q4k_kernel(struct cu_t a, struct cu_t b, float *dst, int64_t r2,
                                      int64_t r3)
{
    const int nblk = (int)(a.ne[0] / 256);
    const int64_t N = b.ne[1], rows = a.ne[1] * b.ne[2] * b.ne[3];
    const int lane = threadIdx.x & 31, j = lane >> 3, i = lane & 7;
    for (int64_t r = mmv_warp_first(); r < rows; r += mmv_warp_step()) {
        const mmv_row R = mmv_row_at(a, b, dst, r, r2, r3);
        const char *row = R.row, *xb = R.xb;
        float acc[NC];
#pragma unroll
        for (int n = 0; n < NC; n++)
            acc[n] = 0.0f;
        for (int kb0 = 0; kb0 < nblk; kb0 += MMV_Q4K_U) {
            uint32_t q4[MMV_Q4K_U], dd[MMV_Q4K_U], sc[MMV_Q4K_U][3];
#pragma unroll
            for (int u = 0; u < MMV_Q4K_U; u++)
                if (kb0 + u < nblk) {
                    const uint32_t *blk = (const uint32_t *)(row + (int64_t)(kb0 + u) * Q4K_BLOCK);
                    dd[u] = __ldg(blk);
                    sc[u][0] = __ldg(blk + 1);
                    sc[u][1] = __ldg(blk + 2);
                    sc[u][2] = __ldg(blk + 3);
                    q4[u] = __ldcs(blk + 4 + 8 * j + i);
                }
#pragma unroll
            for (int u = 0; u < MMV_Q4K_U; u++) {
                if (kb0 + u >= nblk)
                    break;
                const uint8_t *dh = (const uint8_t *)&dd[u];
                const float d = cu_f16_at(dh), dmin = cu_f16_at(dh + 2);
                int s_lo, m_lo, s_hi, m_hi;
                cu_k4_scale_min((const uint8_t *)sc[u], 2 * j, s_lo, m_lo);
                cu_k4_scale_min((const uint8_t *)sc[u], 2 * j + 1, s_hi, m_hi);
                const float d_lo = __fmul_rn(d, (float)s_lo), mn_lo = __fmul_rn(dmin, (float)m_lo);
                const float d_hi = __fmul_rn(d, (float)s_hi), mn_hi = __fmul_rn(dmin, (float)m_hi);
                float w_lo[4], w_hi[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const uint32_t byte = q4[u] >> (8 * e);
                    w_lo[e] = __fsub_rn(__fmul_rn(d_lo, (float)(byte & 0x0f)), mn_lo);
                    w_hi[e] = __fsub_rn(__fmul_rn(d_hi, (float)((byte >> 4) & 0x0f)), mn_hi);
                }
                const int64_t k0 = (int64_t)(kb0 + u) * 256 + 64 * j + 4 * i;
#pragma unroll
                for (int n = 0; n < NC; n++)
                    if (n < N) {
                        const float *xn = (const float *)(xb + n * b.nb[1]) + k0;
                        const float4 xl = __ldg((const float4 *)xn),
                                     xh = __ldg((const float4 *)(xn + 32));
                        acc[n] += w_lo[0] * xl.x + w_lo[1] * xl.y + w_lo[2] * xl.z +
                                  w_lo[3] * xl.w + w_hi[0] * xh.x + w_hi[1] * xh.y +
                                  w_hi[2] * xh.z + w_hi[3] * xh.w;
                    }
            }
        }
        mmv_row_out<NC>(acc, lane, R.out, N, a.ne[1]);
    }
}

/* whether mmv_q4k_kernel takes a (Q4_K) and b: see its comment */
static bool q4k_words(const struct cu_mmv_shape *p, const struct cu_t &av, const struct cu_t &bv)
{
    return mmv_blocks_fit(p, av, bv, LT_TYPE_Q4_K, Q4K_BLOCK, 4);
}

/* The warp-a-row kernels, one instantiation for 1, 2, 4 and 8 columns: the smallest that
 * holds N, 8 warps (8 rows) a block, a grid-stride loop over the rows. */
typedef void (*mmv_rows_kernel)(struct cu_t, struct cu_t, float *, int64_t, int64_t);

static void mmv_rows_launch(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                            const struct cu_t &bv, float *dst, const mmv_rows_kernel k[4])
{
    const int i = p->N <= 1 ? 0 : p->N <= 2 ? 1 : p->N <= 4 ? 2 : 3;
    k[i]<<<cu_blocks(p->M * p->B2 * p->B3, 8), 256, 0, c->stream>>>(av, bv, dst, p->r2, p->r3);
}

template <int TYPE, bool VEC>
static void mmv_launch(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                       const struct cu_t &bv, float *dst)
{
    static const mmv_rows_kernel k[4] = {mmv_kernel<TYPE, 1, VEC>, mmv_kernel<TYPE, 2, VEC>,
                                         mmv_kernel<TYPE, 4, VEC>, mmv_kernel<TYPE, 8, VEC>};
    mmv_rows_launch(c, p, av, bv, dst, k);
}

static const mmv_rows_kernel q8_staged_kernels[4] = {mmv_q8_0_kernel<1>, mmv_q8_0_kernel<2>,
                                                     mmv_q8_0_kernel<4>, mmv_q8_0_kernel<8>};
static const mmv_rows_kernel q4k_kernels[4] = {mmv_q4k_kernel<1>, mmv_q4k_kernel<2>,
                                               mmv_q4k_kernel<4>, mmv_q4k_kernel<8>};

/* b's columns as mmv_half_kernel reads them: floats one after another, every column of
 * every slice 16-byte aligned */
static bool half_cols(const struct cu_mmv_shape *p, const struct cu_t &bv)
{
    return bv.nb[0] == 4 && (uintptr_t)bv.data % 16 == 0 && (p->N <= 1 || bv.nb[1] % 16 == 0) &&
           (p->B2 <= 1 || bv.nb[2] % 16 == 0) && (p->B3 <= 1 || bv.nb[3] % 16 == 0);
}

/* How mmv_half_kernel is cut: RW = 4 rows a team for a product of one slice and more than
 * one column, or of one column and more rows than one wave of the one-row kernel takes
 * (wave1, 0: not asked; the 0.8B model's input projection, 8,224 rows, took 1.56 waves of
 * 5 blocks an SM at 48 registers; four rows a team take it in one, so that every block's
 * rows are asked of L2 before the PDL wait; tg128 of the BF16 file 719.7 against 704.1 with
 * LATHE_CUDA_MMV_RW=1, one run each on an H100, within that machine's run-to-run spread),
 * else 1; then WPR warps a team, doubled from 1 while
 * the teams are fewer than 8 warps an SM's worth and each warp keeps at least two 32-chunk runs of
 * a row. LATHE_CUDA_MMV_RW=1|4 and LATHE_CUDA_MMV_WPR=1|2|4|8 fix them (read once a process; for
 * bench_matmul's comparisons; RW 4 is taken only for one slice). Measured on an H100
 * (bench_matmul's decode products, BF16, GB/s of weights, RW 4 against 1): 8 columns,
 * 1024 -> 8224 rows 877 against 570, 1024 -> 7168 797 / 507, 1024 -> 5120 611 / 506,
 * 2048 -> 1024 388 / 408, 3584 -> 1024 477 / 480; one column, 1024 -> 8224 1589 / 1571,
 * 1024 -> 5120 1186 / 1363, 2048 -> 1024 684 / 850, 3584 -> 1024 976 / 1157: the columns
 * read once for four rows pay for more columns only. */
static int env_choice(const char *name)
{
    const char *env = getenv(name);
    const int v = env ? atoi(env) : 0;
    return v == 1 || v == 2 || v == 4 || v == 8 ? v : 0;
}

static void mmv_half_cut(const struct cu_ctx *c, const struct cu_mmv_shape *p, int64_t wave1,
                         int *rw, int *wpr)
{
    static const int fixed_rw = env_choice("LATHE_CUDA_MMV_RW"),
                     fixed_wpr = env_choice("LATHE_CUDA_MMV_WPR");
    const int64_t rows = p->M * p->B2 * p->B3;
    const bool one_slice = p->B2 * p->B3 == 1;
    const bool four = p->N > 1 || (wave1 > 0 && rows > wave1);
    *rw = one_slice && (fixed_rw == 4 || (fixed_rw != 1 && four)) ? 4 : 1;
    if (fixed_wpr) {
        *wpr = fixed_wpr;
        return;
    }
    const int64_t runs = p->K / 8 / 32, teams = (rows + *rw - 1) / *rw;
    const int64_t want = 8 * (int64_t)(c->n_sm > 0 ? c->n_sm : 1);
    *wpr = 1;
    while (*wpr < 8 && teams * *wpr < want && runs >= 4 * *wpr)
        *wpr *= 2;
}

template <int TYPE, int NC, int RW, int WPR, bool EPI = false>
static void mmv_half_go(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                        const struct cu_t &bv, float *dst, const struct cu_norm_epi &epi = {})
{
    constexpr int RPB = 8 / WPR * RW;
    const int64_t groups = (p->M * p->B2 * p->B3 + RPB - 1) / RPB;
    const unsigned blocks = (unsigned)(groups < 65535 * 4 ? groups : 65535 * 4);
    cu_launch_pdl(c, mmv_half_kernel<TYPE, NC, RW, WPR, false, EPI>, blocks, 256, 0, av, bv, dst,
                  p->r2, p->r3, epi);
}

/* MUL_MAT_GLU's kernel: RW 2 (the gate row and the up row), WPR doubled as mmv_half_cut does
 * over the H outputs' teams */
template <int TYPE, int NC, int WPR>
static void mmv_glu_go(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                       const struct cu_t &bv, float *dst)
{
    constexpr int RPB = 8 / WPR;
    const int64_t groups = (p->M / 2 + RPB - 1) / RPB;
    const unsigned blocks = (unsigned)(groups < 65535 * 4 ? groups : 65535 * 4);
    cu_launch_pdl(c, mmv_half_kernel<TYPE, NC, 2, WPR, true>, blocks, 256, 0, av, bv, dst, p->r2,
                  p->r3, cu_norm_epi{});
}

/* GLU's warps a team: mmv_half_cut's rule over its H = M / 2 teams */
static int mmv_glu_cut(const struct cu_ctx *c, const struct cu_mmv_shape *p)
{
    const int64_t runs = p->K / 8 / 32, teams = p->M / 2;
    const int64_t want = 8 * (int64_t)(c->n_sm > 0 ? c->n_sm : 1);
    int wpr = 1;
    while (wpr < 8 && teams * wpr < want && runs >= 4 * wpr)
        wpr *= 2;
    return wpr;
}

template <int TYPE, int NC>
static void mmv_glu_wpr(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                        const struct cu_t &bv, float *dst)
{
    switch (mmv_glu_cut(c, p)) {
    case 1: mmv_glu_go<TYPE, NC, 1>(c, p, av, bv, dst); break;
    case 2: mmv_glu_go<TYPE, NC, 2>(c, p, av, bv, dst); break;
    case 4: mmv_glu_go<TYPE, NC, 4>(c, p, av, bv, dst); break;
    default: mmv_glu_go<TYPE, NC, 8>(c, p, av, bv, dst); break;
    }
}

/* f(NC) for the smallest of 1, 2, 4, 8 columns that holds N, as a compile-time constant
 * (std::integral_constant): the one place the half kernels' column count is picked */
template <typename F> static void by_columns(int64_t N, F f)
{
    if (N <= 1)
        f(std::integral_constant<int, 1>{});
    else if (N <= 2)
        f(std::integral_constant<int, 2>{});
    else if (N <= 4)
        f(std::integral_constant<int, 4>{});
    else
        f(std::integral_constant<int, 8>{});
}

template <int TYPE>
static void mmv_glu_launch(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                           const struct cu_t &bv, float *dst)
{
    by_columns(p->N, [&](auto nc) { mmv_glu_wpr<TYPE, decltype(nc)::value>(c, p, av, bv, dst); });
}

template <int TYPE, int NC, int RW, bool EPI = false>
static void mmv_half_wpr(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                         const struct cu_t &bv, float *dst, int wpr,
                         const struct cu_norm_epi &epi = {})
{
    switch (wpr) {
    case 1: mmv_half_go<TYPE, NC, RW, 1, EPI>(c, p, av, bv, dst, epi); break;
    case 2: mmv_half_go<TYPE, NC, RW, 2, EPI>(c, p, av, bv, dst, epi); break;
    case 4: mmv_half_go<TYPE, NC, RW, 4, EPI>(c, p, av, bv, dst, epi); break;
    default: mmv_half_go<TYPE, NC, RW, 8, EPI>(c, p, av, bv, dst, epi); break;
    }
}

/* rows one wave of mmv_half_kernel<TYPE, 1, 1, 1> takes on c's device (its blocks of 8 rows
 * an SM, asked of the runtime once a type, times the SMs) */
template <int TYPE> static int64_t mmv_half_wave(const struct cu_ctx *c)
{
    static int per_sm = 0;
    if (per_sm == 0) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &n, mmv_half_kernel<TYPE, 1, 1, 1, false, false>, 256, 0) != cudaSuccess ||
            n < 1)
            n = 1;
        per_sm = n;
    }
    return (int64_t)per_sm * 8 * (c->n_sm > 0 ? c->n_sm : 1);
}

template <int TYPE, int NC>
static void mmv_half_rw(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                        const struct cu_t &bv, float *dst)
{
    int rw, wpr;
    mmv_half_cut(c, p, NC == 1 ? mmv_half_wave<TYPE>(c) : 0, &rw, &wpr);
    if (rw == 4)
        mmv_half_wpr<TYPE, NC, 4>(c, p, av, bv, dst, wpr);
    else
        mmv_half_wpr<TYPE, NC, 1>(c, p, av, bv, dst, wpr);
}

template <int TYPE>
static void mmv_half_launch(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                            const struct cu_t &bv, float *dst)
{
    by_columns(p->N, [&](auto nc) { mmv_half_rw<TYPE, decltype(nc)::value>(c, p, av, bv, dst); });
}

/* unsplit F16 / BF16 rows of whole 16-byte chunks, 16-byte aligned: what
 * mmv_half_kernel reads (and mmv_kernel's VEC form) */
static bool half_rows(const struct cu_mmv_shape *p, const struct lt_tensor *a)
{
    return (a->type == LT_TYPE_F16 || a->type == LT_TYPE_BF16) && a->nb[0] == 2 && p->K % 8 == 0 &&
           (uintptr_t)a->data % 16 == 0 && (p->M <= 1 || a->nb[1] % 16 == 0) &&
           (p->A2 <= 1 || a->nb[2] % 16 == 0) && (p->A3 <= 1 || a->nb[3] % 16 == 0);
}

bool cu_mmv_glu_takes(const struct cu_mmv_shape *p, const struct lt_tensor *a,
                      const struct lt_tensor *b)
{
    return p->N >= 1 && p->N <= 8 && p->M % 2 == 0 && p->A2 == 1 && p->A3 == 1 && p->B2 == 1 &&
           p->B3 == 1 && half_rows(p, a) && half_cols(p, cu_view(b));
}

lt_status cu_mmv_glu_run(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct lt_tensor *a,
                         const struct lt_tensor *b, float *dst)
{
    const struct cu_t av = cu_view(a), bv = cu_view(b);
    if (a->type == LT_TYPE_F16)
        mmv_glu_launch<LT_TYPE_F16>(c, p, av, bv, dst);
    else
        mmv_glu_launch<LT_TYPE_BF16>(c, p, av, bv, dst);
    return cu_launched("mul_mat_glu mmv");
}

bool cu_mmv_norm_takes(const struct cu_mmv_shape *p, const struct lt_tensor *a,
                       const struct lt_tensor *b)
{
    return p->N == 1 && p->A2 == 1 && p->A3 == 1 && p->B2 == 1 && p->B3 == 1 && half_rows(p, a) &&
           half_cols(p, cu_view(b));
}

lt_status cu_mmv_norm_run(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct lt_tensor *a,
                          const struct lt_tensor *b, float *dst, const struct cu_norm_epi *epi)
{
    const struct cu_t av = cu_view(a), bv = cu_view(b);
    int rw, wpr;
    mmv_half_cut(c, p, 0, &rw, &wpr); /* one column, one slice: rw is 1 */
    if (a->type == LT_TYPE_F16)
        mmv_half_wpr<LT_TYPE_F16, 1, 1, true>(c, p, av, bv, dst, wpr, *epi);
    else
        mmv_half_wpr<LT_TYPE_BF16, 1, 1, true>(c, p, av, bv, dst, wpr, *epi);
    return cu_launched("mul_mat_add_rms_norm mmv");
}

/* RMS_NORM_MUL_MAT's kernel: the product's cut (GLU's or one column's), NORM, K floats of
 * dynamic shared memory */
template <int TYPE, int RW, int WPR, bool GLU>
static void mmv_rnm_go(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                       const struct cu_t &bv, float *dst, const struct cu_norm_epi &epi)
{
    constexpr int RPB = 8 / WPR * (GLU ? 1 : RW);
    const int64_t groups = ((GLU ? p->M / 2 : p->M) + RPB - 1) / RPB;
    const unsigned blocks = (unsigned)(groups < 65535 * 4 ? groups : 65535 * 4);
    cu_launch_pdl(c, mmv_half_kernel<TYPE, 1, RW, WPR, GLU, false, true>, blocks, 256,
                  (size_t)p->K * sizeof(float), av, bv, dst, p->r2, p->r3, epi);
}

template <int TYPE, int RW, bool GLU>
static void mmv_rnm_wpr(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                        const struct cu_t &bv, float *dst, const struct cu_norm_epi &epi, int wpr)
{
    switch (wpr) {
    case 1: mmv_rnm_go<TYPE, RW, 1, GLU>(c, p, av, bv, dst, epi); break;
    case 2: mmv_rnm_go<TYPE, RW, 2, GLU>(c, p, av, bv, dst, epi); break;
    case 4: mmv_rnm_go<TYPE, RW, 4, GLU>(c, p, av, bv, dst, epi); break;
    default: mmv_rnm_go<TYPE, RW, 8, GLU>(c, p, av, bv, dst, epi); break;
    }
}

template <int TYPE>
static void mmv_rnm_launch(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct cu_t &av,
                           const struct cu_t &bv, float *dst, const struct cu_norm_epi &epi,
                           bool glu)
{
    if (glu) {
        mmv_rnm_wpr<TYPE, 2, true>(c, p, av, bv, dst, epi, mmv_glu_cut(c, p));
        return;
    }
    int rw, wpr;
    mmv_half_cut(c, p, mmv_half_wave<TYPE>(c), &rw, &wpr);
    if (rw == 4)
        mmv_rnm_wpr<TYPE, 4, false>(c, p, av, bv, dst, epi, wpr);
    else
        mmv_rnm_wpr<TYPE, 1, false>(c, p, av, bv, dst, epi, wpr);
}

bool cu_mmv_rnm_takes(const struct cu_mmv_shape *p, const struct lt_tensor *a,
                      const struct lt_tensor *x, bool glu)
{
    return cu_mmv_norm_takes(p, a, x) && (!glu || p->M % 2 == 0) &&
           p->K * (int64_t)sizeof(float) <= CU_MMV_NORM_MAX_SHARED;
}

lt_status cu_mmv_rnm_run(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct lt_tensor *a,
                         const struct lt_tensor *x, float *dst, const struct cu_norm_epi *norm,
                         bool glu)
{
    const struct cu_t av = cu_view(a), xv = cu_view(x);
    if (a->type == LT_TYPE_F16)
        mmv_rnm_launch<LT_TYPE_F16>(c, p, av, xv, dst, *norm, glu);
    else
        mmv_rnm_launch<LT_TYPE_BF16>(c, p, av, xv, dst, *norm, glu);
    return cu_launched("rms_norm_mul_mat mmv");
}

lt_status cu_mmv_run(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct lt_tensor *a,
                     const struct lt_tensor *b, float *dst)
{
    const struct cu_t av = cu_view(a), bv = cu_view(b);
    const bool vec = half_rows(p, a);
    switch (a->type) {
    case LT_TYPE_F16:
        vec &&half_cols(p, bv) ? mmv_half_launch<LT_TYPE_F16>(c, p, av, bv, dst)
        : vec                  ? mmv_launch<LT_TYPE_F16, true>(c, p, av, bv, dst)
                               : mmv_launch<LT_TYPE_F16, false>(c, p, av, bv, dst);
        break;
    case LT_TYPE_BF16:
        vec &&half_cols(p, bv) ? mmv_half_launch<LT_TYPE_BF16>(c, p, av, bv, dst)
        : vec                  ? mmv_launch<LT_TYPE_BF16, true>(c, p, av, bv, dst)
                               : mmv_launch<LT_TYPE_BF16, false>(c, p, av, bv, dst);
        break;
    case LT_TYPE_Q4_0: mmv_launch<LT_TYPE_Q4_0, false>(c, p, av, bv, dst); break;
    case LT_TYPE_Q4_1: mmv_launch<LT_TYPE_Q4_1, false>(c, p, av, bv, dst); break;
    case LT_TYPE_Q5_0: mmv_launch<LT_TYPE_Q5_0, false>(c, p, av, bv, dst); break;
    case LT_TYPE_Q5_1: mmv_launch<LT_TYPE_Q5_1, false>(c, p, av, bv, dst); break;
    case LT_TYPE_Q8_0:
        q8_staged(p, av, bv) ? mmv_rows_launch(c, p, av, bv, dst, q8_staged_kernels)
                             : mmv_launch<LT_TYPE_Q8_0, false>(c, p, av, bv, dst);
        break;
    case LT_TYPE_Q4_K:
        q4k_words(p, av, bv) ? mmv_rows_launch(c, p, av, bv, dst, q4k_kernels)
                             : mmv_launch<LT_TYPE_Q4_K, false>(c, p, av, bv, dst);
        break;
    case LT_TYPE_Q5_K: mmv_launch<LT_TYPE_Q5_K, false>(c, p, av, bv, dst); break;
    case LT_TYPE_Q6_K: mmv_launch<LT_TYPE_Q6_K, false>(c, p, av, bv, dst); break;
    default: mmv_launch<-1, false>(c, p, av, bv, dst); break; /* Q2_K, Q3_K, Q8_K, ... */
    }
    return cu_launched("mul_mat mmv");
}
