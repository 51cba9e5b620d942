/* mmvq.cu: Q8_0 (and Q4_0, Q5_0) weights times few F32 columns (decode) through int8 dot
 * products, as llama.cpp's mmvq.
 *
 * Two kernels a product:
 *   1. mmvq_quantise_kernel: every column of b (N * B2 * B3 of them, K floats each, any
 *      strides) into int8 blocks of 32 in scratch, a warp a block: d = max|x| / 127 (IEEE
 *      division; 0 when below FLT_MIN, so 1 / d stays finite), q = round-to-nearest-even of
 *      x * (1 / d) (the reciprocal correctly rounded, then one rounded product), a block
 *      holding a nan or an infinity gets d = nan and q = 0. That is lt_q8a_quantise's rule
 *      (core/quant_dot.c) operation for operation, so the quantised columns are the CPU's
 *      bit for bit and the result differs from LATHE_MATMUL_DOT=int8 on the CPU only in
 *      the order of float additions; against the exact product it carries the activation
 *      rounding bounded in core/quant_dot.h (llama.cpp's mmvq rounds the same way). Layout:
 *      the quants of column c at xq + c * K (each column 16-byte aligned: K % 32 == 0),
 *      then (d, d * sum q) per block as float2 at xd + c * K / 32.
 *   2. mmvq_kernel<TYPE, NC, ROWS>: a block of NW warps takes ROWS output rows (NC = N
 *      columns; mmvq_shape: N = 1: 4 warps, 1 row, or 4 rows when M is large; N = 2..4: 4
 *      warps, 2 rows; N = 5..8: 2 warps, 2 rows). Four consecutive lanes share one weight block,
 * lane j taking its elements 8j .. 8j + 7 as 8 signed bytes in two words (mmvq_unpack: Q8_0's
 *      quants as they are; 4- and 5-bit quants unpacked, their offset of 8 or 16 taken off
 *      each byte) and the 8 activation quants under them (one 8-byte load), so a warp reads
 *      8 consecutive blocks (272 bytes of Q8_0) at once: 2 __dp4a per lane and block, then
 *      acc += (d_w * d_x) * (float)sum, the CPU int8 kernel's per-block form (here per
 *      quarter block; the CPU's Q4_0 takes its offset off through the block sum instead,
 *      the same sum in exact arithmetic). A Q8_0 block's quants sit at 2 + 34 kb bytes into
 *      the row, only 2-byte aligned (Q4_0's 18-byte and Q5_0's 22-byte blocks alike): a lane
 *      reads the three aligned words that hold its 8 bytes (the third is the second again
 *      when they happen to be 4-byte aligned, as in every other Q8_0 block) and
 *      funnel-shifts them into place: 3 loads without a branch instead of 4 half-word or 8
 *      byte loads, any byte alignment works, and every word read holds a byte of the lane's
 *      8, so none leaves the allocation. Partial sums go through shared memory to warp 0,
 *      which reduces and writes.
 * The row loop has no grid-stride: M / ROWS blocks in x, the B2 * B3 slices in y.
 * A decode step of one sequence adds two things (matmul.cu): RMS_NORM_MUL_MAT's quantisation
 * takes the column's weighted RMS norm first (each warp sums the whole column's squares),
 * and MUL_MAT_ACC's stores add the product to the result's old value (the residual). Both
 * are one column of one slice.
 *
 * Scratch: the CU_SCRATCH_B slot (b's conversion, which the few-columns path never does),
 * (K + K / 32 * 8) bytes a column. It grows, synchronising, only outside a CUDA graph
 * capture; inside one, a product larger than the eager run before it had cannot happen
 * (the capture records a node list that ran eagerly with the same shapes), and if it did,
 * cu_scratch fails and the list runs eagerly (cuda_graphs.cu). The quantise kernel of the
 * next product overwrites the slot only after this product's dot kernel, by stream order
 * (in a graph too: the capture keeps the stream's order). */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/mmvq.cuh"
#include "backend/cuda/quant.cuh"

#define MMVQ_QK 32 /* elements of a block, weights and activations alike */

bool cu_mmvq_enabled(void)
{
    static const bool on = [] {
        const char *env = getenv("LATHE_CUDA_MMVQ");
        return !(env && strcmp(env, "0") == 0);
    }();
    return on;
}

/* Q8_0, Q4_0 and Q5_0: weights without a minimum. Q4_1 and Q5_1 (w = d q + m) are not
 * taken although mmvq_unpack reads them: their rows share a mean (m is of one sign), so an
 * output is dominated by m * sum(x), whose activation rounding does not average out over
 * the outputs the way sum(w e) does: the normalised-error argument that bounds mmvq's
 * deviation (tests/gpu/test_cuda_conformance.c, TOL_MMVQ_SAME's comment) does not hold for
 * them, and a host emulation of this kernel reached 1e-4 against the exact product on
 * small random cases. They keep the exact F32-activation kernel until measured. */
bool cu_mmvq_takes(enum lt_type t, int64_t K)
{
    return cu_mmvq_enabled() && (t == LT_TYPE_Q8_0 || t == LT_TYPE_Q4_0 || t == LT_TYPE_Q5_0) &&
           K > 0 && K % MMVQ_QK == 0;
}

/* ---- 1. the activation columns to int8 blocks ---- */

/* With a norm weight nw (RMS_NORM_MUL_MAT, one column): each warp first takes the column's
 * weighted RMS norm factor, the squares summed in double over the whole column by its lanes
 * (every warp again: K floats from L2), and quantises (x f) nw instead of x, each product
 * rounded as RMS_NORM's. */
static __global__ void mmvq_quantise_kernel(struct cu_t b, int8_t *__restrict__ xq,
                                            float2 *__restrict__ xd, int64_t nblocks,
                                            const float *nw, float eps)
{
    cu_pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t K = b.ne[0], kblocks = K / MMVQ_QK, N = b.ne[1], B2 = b.ne[2];
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    float f = 1.0f;
    if (nw) { /* one column: the caller's plan */
        double s = 0.0;
        for (int64_t k = lane; k < K; k += 32) {
            const double v = (double)*(const float *)(b.data + k * b.nb[0]);
            s += v * v;
        }
        f = (float)(1.0 / sqrt(cu_warp_sum(s) / (double)K + (double)eps));
    }
    /* i (warp-uniform): block kb of column c = (i3 * B2 + i2) * N + n */
    for (int64_t i = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); i < nblocks;
         i += warps) {
        const int64_t kb = i % kblocks, c = i / kblocks;
        const int64_t n = c % N, i2 = (c / N) % B2, i3 = c / (N * B2);
        float x = *(const float *)(b.data + (kb * MMVQ_QK + lane) * b.nb[0] + n * b.nb[1] +
                                   i2 * b.nb[2] + i3 * b.nb[3]);
        if (nw)
            x = __fmul_rn(__fmul_rn(x, f), nw[kb * MMVQ_QK + lane]);
        const bool bad = __any_sync(0xffffffffu, !isfinite(x));
        float d = __int_as_float(0x7fc00000); /* nan */
        int q = 0;
        if (!bad) {
            const float amax = cu_warp_max(fabsf(x));
            const float d0 = __fdiv_rn(amax, 127.0f);
            d = d0 >= FLT_MIN ? d0 : 0.0f;
            const float id = d != 0.0f ? __frcp_rn(d) : 0.0f;
            q = __float2int_rn(__fmul_rn(x, id)); /* |x * id| <= ~127: no saturation */
        }
        int s = q;
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        xq[i * MMVQ_QK + lane] = (int8_t)q;
        if (lane == 0)
            xd[i] = make_float2(d, bad ? d : __fmul_rn(d, (float)s));
    }
}

/* ---- 2. the dot products ---- */

/* Bytes p .. p + 7 (any alignment) as two little-endian words, from the aligned words that
 * hold them. Without a branch: the third word is read again from the second's address when
 * p is 4-byte aligned (then the shift is 0 and it is not used), so no word past the last
 * one holding a byte of p .. p + 7 is read. */
static __device__ __forceinline__ void load8_any(const char *p, int &v0, int &v1)
{
    const uintptr_t addr = (uintptr_t)p;
    const uint32_t *w = (const uint32_t *)(addr & ~(uintptr_t)3);
    const unsigned sh = (unsigned)(addr & 3) * 8;
    const uint32_t w0 = __ldg(w), w1 = __ldg(w + 1), w2 = __ldg(w + (sh ? 2 : 1));
    v0 = (int)__funnelshift_r(w0, w1, sh);
    v1 = (int)__funnelshift_r(w1, w2, sh);
}

/* the f16 at p: one 2-byte load where every block is 2-byte aligned (EVEN: the weight's
 * address and strides are even, as in every weight lathe loads), else two byte loads */
template <bool EVEN> static __device__ __forceinline__ float f16_at(const char *p)
{
    if (!EVEN)
        return cu_f16_at((const uint8_t *)p);
    __half_raw r;
    r.x = __ldg((const unsigned short *)p);
    return __half2float(__half(r));
}

/* Bytes p .. p + 3 (any alignment) as a little-endian word, the same way. */
static __device__ __forceinline__ uint32_t load4_any(const char *p)
{
    const uintptr_t addr = (uintptr_t)p;
    const uint32_t *w = (const uint32_t *)(addr & ~(uintptr_t)3);
    const unsigned sh = (unsigned)(addr & 3) * 8;
    return __funnelshift_r(__ldg(w), __ldg(w + (sh ? 1 : 0)), sh);
}

/* each byte of v (0..127) minus the same byte k of k4, as signed bytes, without borrows */
static __device__ __forceinline__ int sub_bytes(uint32_t v, uint32_t k4)
{
    return (int)(((v | 0x80808080u) - k4) ^ 0x80808080u);
}

/* bits 0..3 of b as bit 4 of bytes 0..3 */
static __device__ __forceinline__ uint32_t bit4_bytes(uint32_t b)
{
    return (b & 1u) << 4 | (b & 2u) << 11 | (b & 4u) << 18 | (b & 8u) << 25;
}

/* The weight types and their blocks (quant.h); MIN: w = d * q + m, whose m meets the
 * activation block's sum (d_x * sum q_x). */
template <int TYPE> struct mmvq_type;
template <> struct mmvq_type<LT_TYPE_Q4_0> {
    static constexpr int bytes = 18;
    static constexpr bool min = false;
};
template <> struct mmvq_type<LT_TYPE_Q4_1> {
    static constexpr int bytes = 20;
    static constexpr bool min = true;
};
template <> struct mmvq_type<LT_TYPE_Q5_0> {
    static constexpr int bytes = 22;
    static constexpr bool min = false;
};
template <> struct mmvq_type<LT_TYPE_Q5_1> {
    static constexpr int bytes = 24;
    static constexpr bool min = true;
};
template <> struct mmvq_type<LT_TYPE_Q8_0> {
    static constexpr int bytes = 34;
    static constexpr bool min = false;
};

/* Quarter j of the weight block at blk: its quants 8j .. 8j + 7 as signed bytes in v0, v1
 * (an offset like Q4_0's "q - 8" taken off each byte, so the integer dot is the block's
 * own), its scale d as the result and its minimum in m (MIN types). Element l of a 4- or
 * 5-bit block is the low nibble of qs[l] for l < 16, the high nibble of qs[l - 16] above,
 * bit 4 from bit l of qh (quant_dot.c's q5_value). */
template <int TYPE, bool EVEN>
static __device__ __forceinline__ float mmvq_unpack(const char *blk, int j, int &v0, int &v1,
                                                    float &m)
{
    m = 0.0f;
    if (TYPE == LT_TYPE_Q8_0) {
        load8_any(blk + 2 + 8 * j, v0, v1);
        return f16_at<EVEN>(blk);
    }
    constexpr int qs = TYPE == LT_TYPE_Q4_0   ? 2 /* the quants' offset in the block */
                       : TYPE == LT_TYPE_Q4_1 ? 4
                       : TYPE == LT_TYPE_Q5_0 ? 6
                                              : 8;
    int w0, w1;
    load8_any(blk + qs + 8 * (j & 1), w0, w1);
    const unsigned nib = 4 * (unsigned)(j >> 1);
    uint32_t q0 = ((uint32_t)w0 >> nib) & 0x0f0f0f0fu, q1 = ((uint32_t)w1 >> nib) & 0x0f0f0f0fu;
    if (TYPE == LT_TYPE_Q5_0 || TYPE == LT_TYPE_Q5_1) {
        const uint32_t qh = load4_any(blk + (TYPE == LT_TYPE_Q5_0 ? 2 : 4)) >> (8 * j);
        q0 |= bit4_bytes(qh & 0x0fu);
        q1 |= bit4_bytes((qh >> 4) & 0x0fu);
    }
    if (TYPE == LT_TYPE_Q4_0 || TYPE == LT_TYPE_Q5_0) {
        const uint32_t k4 = TYPE == LT_TYPE_Q4_0 ? 0x08080808u : 0x10101010u;
        v0 = sub_bytes(q0, k4);
        v1 = sub_bytes(q1, k4);
    } else {
        v0 = (int)q0;
        v1 = (int)q1;
        m = f16_at<EVEN>(blk + 2);
    }
    return f16_at<EVEN>(blk);
}

/* sum of the 4 signed byte products of a and b, plus c */
static __device__ __forceinline__ int dp4a(int a, int b, int c)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 32; i += 8)
        c += (int)(int8_t)(a >> i) * (int)(int8_t)(b >> i);
    return c;
#endif
}

/* Warps and rows a block: llama.cpp's launch table for NVIDIA (mmvq.cu: calc_nwarps,
 * calc_rows_per_block), but one column over many rows takes four rows a block (rows_many):
 * a block of one row had each lane issue one quarter block's loads for a 1024-wide row (the
 * 0.8B model's) and end. Four rows keep four rows' loads in flight a lane and read the
 * column's quants once for the four. Measured on an H100 (bench_matmul's decode products,
 * Q8_0, one column): 1024 -> 8224 rows 707 -> 948 GB/s, 1024 -> 7168 677 -> 864, 1024 ->
 * 5120 594 -> 796; but 2048 -> 1024 388 -> 318 and 3584 -> 1024 542 -> 401, whose 256
 * blocks of four rows leave the SMs a few warps each: those keep one row a block
 * (mmvq_many_rows). */
template <int NC> struct mmvq_shape {
    static constexpr int warps = NC <= 4 ? 4 : 2;
    static constexpr int rows = NC == 1 ? 1 : 2;
    static constexpr int rows_many = NC == 1 ? 4 : rows;
};

/* whether M rows take mmvq_shape's rows_many: at least 8 blocks of four rows an SM */
static bool mmvq_many_rows(const struct cu_ctx *c, int64_t M)
{
    return M >= 32 * (int64_t)(c->n_sm > 0 ? c->n_sm : 1);
}

/* dst[(ch * NC + n) * M + m] for the rows m of this block and every slice ch = i3 * B2 + i2.
 * a: the weight's data and byte strides of rows and heads; xq, xd: the quantised columns.
 * GLU (MUL_MAT_GLU, one slice): the block's ROWS / 2 outputs h take rows h and M / 2 + h,
 * dst[n * M / 2 + h] = silu(row h's sum) * row M / 2 + h's. addend (not GLU; NULL: none): each
 * output stored as addend's element at its place plus the sum (MUL_MAT_ACC: addend is dst). */
template <int TYPE, int NC, int ROWS, bool EVEN, bool GLU = false>
static __global__ void __launch_bounds__(mmvq_shape<NC>::warps * 32)
    mmvq_kernel(const char *__restrict__ a, int64_t anb1, int64_t anb2, int64_t anb3, int64_t M,
                int nblk, int64_t r2, int64_t r3, int64_t B2, int64_t nch,
                const int8_t *__restrict__ xq, const float2 *__restrict__ xd, float *dst,
                const float *addend)
{
    constexpr int NW = mmvq_shape<NC>::warps;
    constexpr int PER_ITER = NW * 32 / 4; /* blocks a step of the whole thread block */
    constexpr int BYTES = mmvq_type<TYPE>::bytes;
    constexpr bool HAS_MIN = mmvq_type<TYPE>::min;
    __shared__ float part[NW - 1][NC][ROWS][32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = tid & 3; /* the quarter of the block: quants 8j .. 8j + 7 */
    static_assert(!GLU || ROWS % 2 == 0, "a GLU block takes gate and up rows in pairs");
    constexpr int OUT = GLU ? ROWS / 2 : ROWS; /* outputs a block */
    const int64_t K = (int64_t)nblk * MMVQ_QK, H = M / 2;
    const int64_t row0 = (int64_t)blockIdx.x * OUT; /* the block's first output */
    /* row r of the block (past the end: the last one, read, not written) */
    auto row_of = [&](int r) -> int64_t {
        if (!GLU)
            return row0 + r < M ? row0 + r : M - 1;
        const int64_t h = row0 + r % OUT < H ? row0 + r % OUT : H - 1;
        return (r < OUT ? 0 : H) + h;
    };
    if (tid < ROWS && blockIdx.y < nch) /* PDL (cuda_common.h) */
        cu_prefetch_l2_span(a + (blockIdx.y % B2 / r2) * anb2 + (blockIdx.y / B2 / r3) * anb3 +
                                row_of(tid) * anb1,
                            (int64_t)nblk * BYTES);
    cu_pdl_enter();
    for (int64_t ch = blockIdx.y; ch < nch; ch += gridDim.y) {
        const int64_t i2 = ch % B2, i3 = ch / B2;
        const char *ah = a + (i2 / r2) * anb2 + (i3 / r3) * anb3;
        const char *arow[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            arow[r] = ah + row_of(r) * anb1;
        const int8_t *xc = xq + ch * NC * K + 8 * j;
        const float2 *dc = xd + ch * NC * nblk;
        float acc[NC][ROWS];
#pragma unroll
        for (int n = 0; n < NC; n++)
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                acc[n][r] = 0.0f;
        for (int kb = tid >> 2; kb < nblk; kb += PER_ITER) {
            int u0[NC], u1[NC];
            float dx[NC], sx[NC];
#pragma unroll
            for (int n = 0; n < NC; n++) {
                const int2 u = __ldg((const int2 *)(xc + n * K + (int64_t)kb * MMVQ_QK));
                u0[n] = u.x;
                u1[n] = u.y;
                if (HAS_MIN) {
                    const float2 ds = __ldg(&dc[(int64_t)n * nblk + kb]);
                    dx[n] = ds.x;
                    sx[n] = j == 0 ? ds.y : 0.0f; /* the block's sum, once a block */
                } else {
                    dx[n] = __ldg(&dc[(int64_t)n * nblk + kb].x);
                }
            }
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const char *blk = arow[r] + (int64_t)kb * BYTES;
                int v0, v1;
                float mw;
                const float dw = mmvq_unpack<TYPE, EVEN>(blk, j, v0, v1, mw);
#pragma unroll
                for (int n = 0; n < NC; n++) {
                    const int s = dp4a(v1, u1[n], dp4a(v0, u0[n], 0));
                    acc[n][r] += __fmul_rn(dw, dx[n]) * (float)s;
                    if (HAS_MIN)
                        acc[n][r] += __fmul_rn(mw, sx[n]);
                }
            }
        }
        if (warp > 0)
#pragma unroll
            for (int n = 0; n < NC; n++)
#pragma unroll
                for (int r = 0; r < ROWS; r++)
                    part[warp - 1][n][r][lane] = acc[n][r];
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int n = 0; n < NC; n++)
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    float v = acc[n][r];
#pragma unroll
                    for (int w = 0; w < NW - 1; w++)
                        v += part[w][n][r][lane];
                    for (int o = 16; o > 0; o >>= 1)
                        v += __shfl_xor_sync(0xffffffffu, v, o);
                    acc[n][r] = v;
                }
            if (lane == 0 && GLU)
#pragma unroll
                for (int n = 0; n < NC; n++)
#pragma unroll
                    for (int r = 0; r < OUT; r++)
                        if (row0 + r < H) { /* SWIGLU's value (unary.cu) */
                            const float g = acc[n][r];
                            dst[(ch * NC + n) * H + row0 + r] =
                                g / (1.0f + expf(-g)) * acc[n][r + OUT];
                        }
            if (lane == 0 && !GLU)
#pragma unroll
                for (int n = 0; n < NC; n++)
#pragma unroll
                    for (int r = 0; r < ROWS; r++)
                        if (row0 + r < M) {
                            const int64_t o = (ch * NC + n) * M + row0 + r;
                            dst[o] = addend ? __fadd_rn(addend[o], acc[n][r]) : acc[n][r];
                        }
        }
        __syncthreads(); /* part is written again for the next slice */
    }
}

template <int TYPE, int NC, int ROWS, bool GLU>
static void mmvq_go(struct cu_ctx *c, const struct lt_tensor *a, int64_t M, int nblk, int64_t r2,
                    int64_t r3, int64_t B2, int64_t nch, const int8_t *xq, const float2 *xd,
                    float *dst, const float *addend)
{
    constexpr int NW = mmvq_shape<NC>::warps, OUT = GLU ? ROWS / 2 : ROWS;
    const int64_t outs = GLU ? M / 2 : M;
    const dim3 grid((unsigned)((outs + OUT - 1) / OUT), (unsigned)(nch < 65535 ? nch : 65535));
    const uintptr_t odd_bits =
        ((uintptr_t)a->data | (uintptr_t)a->nb[1] | (uintptr_t)a->nb[2] | (uintptr_t)a->nb[3]) & 1;
    if (!odd_bits) /* every block 2-byte aligned */
        cu_launch_pdl(c, mmvq_kernel<TYPE, NC, ROWS, true, GLU>, grid, NW * 32, 0,
                      (const char *)a->data, (int64_t)a->nb[1], (int64_t)a->nb[2],
                      (int64_t)a->nb[3], M, nblk, r2, r3, B2, nch, xq, xd, dst, addend);
    else
        cu_launch_pdl(c, mmvq_kernel<TYPE, NC, ROWS, false, GLU>, grid, NW * 32, 0,
                      (const char *)a->data, (int64_t)a->nb[1], (int64_t)a->nb[2],
                      (int64_t)a->nb[3], M, nblk, r2, r3, B2, nch, xq, xd, dst, addend);
}

/* GLU: rows in pairs (a gate row and its up row), so one row a block becomes two */
template <int TYPE, int NC, bool GLU>
static void mmvq_launch(struct cu_ctx *c, const struct lt_tensor *a, int64_t M, int nblk,
                        int64_t r2, int64_t r3, int64_t B2, int64_t nch, const int8_t *xq,
                        const float2 *xd, float *dst, const float *addend)
{
    constexpr int many = mmvq_shape<NC>::rows_many, few = mmvq_shape<NC>::rows;
    constexpr int few_glu = few < 2 ? 2 : few;
    if (mmvq_many_rows(c, M))
        mmvq_go<TYPE, NC, many, GLU>(c, a, M, nblk, r2, r3, B2, nch, xq, xd, dst, addend);
    else
        mmvq_go<TYPE, NC, GLU ? few_glu : few, GLU>(c, a, M, nblk, r2, r3, B2, nch, xq, xd, dst,
                                                    addend);
}

template <int TYPE, bool GLU>
static void mmvq_columns(struct cu_ctx *c, const struct lt_tensor *a, int64_t N, int64_t M,
                         int nblk, int64_t r2, int64_t r3, int64_t B2, int64_t nch,
                         const int8_t *xq, const float2 *xd, float *dst, const float *addend)
{
    switch (N) {
    case 1: mmvq_launch<TYPE, 1, GLU>(c, a, M, nblk, r2, r3, B2, nch, xq, xd, dst, addend); break;
    case 2: mmvq_launch<TYPE, 2, GLU>(c, a, M, nblk, r2, r3, B2, nch, xq, xd, dst, addend); break;
    case 3: mmvq_launch<TYPE, 3, GLU>(c, a, M, nblk, r2, r3, B2, nch, xq, xd, dst, addend); break;
    case 4: mmvq_launch<TYPE, 4, GLU>(c, a, M, nblk, r2, r3, B2, nch, xq, xd, dst, addend); break;
    case 5: mmvq_launch<TYPE, 5, GLU>(c, a, M, nblk, r2, r3, B2, nch, xq, xd, dst, addend); break;
    case 6: mmvq_launch<TYPE, 6, GLU>(c, a, M, nblk, r2, r3, B2, nch, xq, xd, dst, addend); break;
    case 7: mmvq_launch<TYPE, 7, GLU>(c, a, M, nblk, r2, r3, B2, nch, xq, xd, dst, addend); break;
    default: mmvq_launch<TYPE, 8, GLU>(c, a, M, nblk, r2, r3, B2, nch, xq, xd, dst, addend); break;
    }
}

/* the scratch's layout: b's columns as int8 [cols][K], then from *d_off (16-byte aligned)
 * a float2 a block of 32; returns the bytes */
static size_t scratch_layout(const struct lt_tensor *a, const struct lt_tensor *b, size_t *d_off)
{
    const int64_t K = a->ne[0], cols = b->ne[1] * b->ne[2] * b->ne[3], nblk = K / MMVQ_QK;
    *d_off = ((size_t)(cols * K) + 15) & ~(size_t)15;
    return *d_off + (size_t)(cols * nblk) * sizeof(float2);
}

size_t cu_mmvq_scratch_bytes(const struct lt_tensor *a, const struct lt_tensor *b)
{
    size_t d_off;
    return scratch_layout(a, b, &d_off);
}

/* What a product adds to mmvq's two kernels: the norm its quantisation takes (nw, eps; one
 * column), and the addend of its stores (not with glu) */
struct mmvq_extra {
    const float *nw;
    float eps;
    const float *addend;
};

/* the product (glu false) or MUL_MAT_GLU's (glu: one slice, M even) */
static lt_status mmvq_run(struct cu_ctx *c, const struct lt_tensor *a, const struct lt_tensor *b,
                          float *dst, int64_t r2, int64_t r3, bool glu,
                          const struct mmvq_extra &ex = {})
{
    const int64_t K = a->ne[0], M = a->ne[1], N = b->ne[1], B2 = b->ne[2];
    const int64_t nch = B2 * b->ne[3], cols = N * nch, nblk = K / MMVQ_QK;
    if (!cu_mmvq_takes(a->type, K) || N < 1 || N > CU_MMVQ_MAX_N || M < 1 || nch < 1 ||
        b->type != LT_TYPE_F32 || b->ne[0] != K || nblk > INT32_MAX || M > INT32_MAX ||
        (ex.nw && cols != 1) || (ex.addend && glu))
        return lt_fail(LT_ERR_BACKEND, "%s: mul_mat mmvq called outside its plan", c->name);
    size_t d_off;
    void *scratch;
    lt_status st = cu_scratch(c, CU_SCRATCH_B, scratch_layout(a, b, &d_off), &scratch);
    if (st != LT_OK)
        return st;
    int8_t *xq = (int8_t *)scratch;
    float2 *xd = (float2 *)((char *)scratch + d_off);
    const int64_t nblocks = cols * nblk;
    cu_launch_pdl(c, mmvq_quantise_kernel, cu_blocks(nblocks, 8), 256, 0, cu_view(b), xq, xd,
                  nblocks, ex.nw, ex.eps);
    st = cu_launched("mul_mat mmvq quantise");
    if (st != LT_OK)
        return st;
    if (glu && (M % 2 != 0 || nch != 1))
        return lt_fail(LT_ERR_BACKEND, "%s: mul_mat_glu mmvq called outside its plan", c->name);
    switch (a->type) {
    case LT_TYPE_Q4_0:
        glu ? mmvq_columns<LT_TYPE_Q4_0, true>(c, a, N, M, (int)nblk, r2, r3, B2, nch, xq, xd, dst,
                                               ex.addend)
            : mmvq_columns<LT_TYPE_Q4_0, false>(c, a, N, M, (int)nblk, r2, r3, B2, nch, xq, xd, dst,
                                                ex.addend);
        break;
    case LT_TYPE_Q5_0:
        glu ? mmvq_columns<LT_TYPE_Q5_0, true>(c, a, N, M, (int)nblk, r2, r3, B2, nch, xq, xd, dst,
                                               ex.addend)
            : mmvq_columns<LT_TYPE_Q5_0, false>(c, a, N, M, (int)nblk, r2, r3, B2, nch, xq, xd, dst,
                                                ex.addend);
        break;
    default:
        glu ? mmvq_columns<LT_TYPE_Q8_0, true>(c, a, N, M, (int)nblk, r2, r3, B2, nch, xq, xd, dst,
                                               ex.addend)
            : mmvq_columns<LT_TYPE_Q8_0, false>(c, a, N, M, (int)nblk, r2, r3, B2, nch, xq, xd, dst,
                                                ex.addend);
        break;
    }
    return cu_launched(glu ? "mul_mat_glu mmvq" : "mul_mat mmvq");
}

lt_status cu_mmvq_run(struct cu_ctx *c, const struct lt_tensor *a, const struct lt_tensor *b,
                      float *dst, int64_t r2, int64_t r3)
{
    return mmvq_run(c, a, b, dst, r2, r3, false);
}

lt_status cu_mmvq_glu_run(struct cu_ctx *c, const struct lt_tensor *a, const struct lt_tensor *b,
                          float *dst)
{
    return mmvq_run(c, a, b, dst, 1, 1, true);
}

lt_status cu_mmvq_acc_run(struct cu_ctx *c, const struct lt_tensor *a, const struct lt_tensor *b,
                          float *dst)
{
    return mmvq_run(c, a, b, dst, 1, 1, false, mmvq_extra{nullptr, 0.0f, dst});
}

lt_status cu_mmvq_rnm_run(struct cu_ctx *c, const struct lt_tensor *a, const struct lt_tensor *x,
                          const float *nw, float eps, bool glu, float *dst)
{
    return mmvq_run(c, a, x, dst, 1, 1, glu, mmvq_extra{nw, eps, nullptr});
}
