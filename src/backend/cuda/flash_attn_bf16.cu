/* flash_attn_bf16.cu: FLASH_ATTN and FLASH_ATTN_BACK of LT_FLASH_ATTN_PREC_BF16 (training and
 * prefill, whose other products round to BF16) on the BF16 tensor cores (mma_bf16.h), in
 * FlashAttention-2's tiling: q, k, v, do as BF16 tiles in shared memory, the scores, the
 * probabilities and the accumulators in registers, F32 sums. src/ops/flash_attn.c says what
 * the ops compute; flash_attn.cu has the family's one predicate, which takes the same nodes
 * for this precision as for the others (D up to 256), and the F32 / TF32 kernels.
 *
 * Head dims are padded to DP = 64, 128 or 256 (zeros past D add nothing). A first kernel
 * stages q, k, v (and do) in scratch as BF16 rows of DP, [S][heads][rows][DP], rows padded to
 * a multiple of 64 with zeros: from there a tile is whole 16-byte rows, which the kernels copy
 * into shared memory asynchronously (cp.async), the next tile's copies in flight while the
 * current one is multiplied. (Read element by element from F32 views, each tile's loads
 * waited one after another: the first version spent most of its 1.5 ms a forward node at
 * 16 x 512 there, H100.) Tiles in shared memory have rows pitched DP + 8 (ldmatrix without
 * bank conflicts).
 *
 * Forward, a block per (64 queries, query head, sequence), 4 warps of 16 query rows: for each
 * tile of 64 keys (V's copy in flight during S, the next K's during P V), S = Q K^T (16 x 64 a
 * warp, in registers), scaled into log2 units with dropped keys at -inf, the online softmax a row
 * (the running maximum m and sum l, a row's four lanes agreeing on m by two shuffles; l stays a
 * lane's partial until the end), O = alpha O + P V with P rounded to BF16 from the registers that
 * hold it. O / l at the end (zeros for a row with every key dropped, SOFT_MAX's rule). The STATS
 * instance skips V and O and writes each row's log-sum-exp in log2 units (m + log2 l, -inf for a
 * row all dropped) into scratch, for the backward; fb_dot_kernel (a warp a row) D = do . o.
 *
 * Backward, after STATS, in two kernels that each own the rows they write (no atomics, a
 * fixed order of sums):
 *   dq: a block per (64 queries, query head, sequence), 4 warps of 16 query rows, over the
 *     key tiles (32 keys at DP 256, so dq, S and dP fit the registers; two buffers of K and
 *     V, the next tile's in flight): P = 2^(S - lse),
 *     dP = dO V^T, dS = P o (dP - D), dq += dS K, dq scaled at the end.
 *   dk, dv: a block per (64 keys, key head, sequence), over the group's query heads and the
 *     query tiles that reach its keys (two buffers of q and do). Each warp owns 16 keys (and
 *     at DP 256 half of the columns: 8 warps). Per query tile, first P^T and dS^T [64 keys x 64
 * queries] (K Q^T and V dO^T, each warp its keys and its share of the queries) go to shared memory
 * as BF16; then dv += P^T dO and dk += dS^T q, dk scaled at the end.
 *
 * Key ranges: a query reads keys lo..hi (fb_keys_of: causal, the cache, packed examples'
 * positions), so a block walks only the key tiles its rows reach, and a dk/dv block only the
 * query tiles whose rows reach its keys: a packed step's examples cost what they would alone.
 *
 * Rounding: q, k, v, do, P and dS enter products as BF16 (relative error 2^-9); everything
 * else is F32. Against the CPU's F32 the results are about 1e-5 off in normalised squared
 * error (test_cuda_conformance's TOL_FA_BF16). */
#include <cuda_pipeline.h>
#include <math.h>

#include "backend/cuda/flash_attn_impl.h"
#include "backend/cuda/mma_bf16.h"
#include "lathe/ops.h"

#define FB_BQ 64  /* query rows of a forward or dq block (4 warps of 16), and of a dk/dv tile */
#define FB_BKV 64 /* key rows of a dk/dv block */
#define FB_LOG2E 1.4426950408889634f
#define FB_FULL 0xffffffffu

/* the tiles of head dims padded to DP */
template <int DP> struct fb_dims {
    static constexpr int LD = DP + 8;                /* a BF16 tile's row pitch */
    static constexpr int BK = 64;                    /* the forward's key tile */
    static constexpr int BK_DQ = DP > 128 ? 32 : 64; /* dq's key tile */
    static constexpr int WN = DP > 128 ? 2 : 1;      /* dk/dv: warps that share 16 keys */
    static constexpr int DKV_WARPS = 4 * WN;
    static constexpr int LP = FB_BQ + 8; /* P^T's and dS^T's pitch */
    /* shared memory: the tiles, then 16 int64 for the block's reductions */
    static constexpr size_t RED = 16 * sizeof(int64_t);
    static constexpr size_t FWD = sizeof(__nv_bfloat16) * (FB_BQ + 2 * BK) * LD + RED;
    /* Q, dO; K, V twice */
    static constexpr size_t DQ = sizeof(__nv_bfloat16) * (2 * FB_BQ + 4 * BK_DQ) * LD + RED;
    /* K, V; Q, dO twice; P^T, dS^T; lse, D (float) and lo, hi (int64) of a tile's queries,
     * twice */
    static constexpr size_t DKV = sizeof(__nv_bfloat16) * (6 * 64 * LD + 2 * FB_BKV * LP) +
                                  2 * FB_BQ * (2 * sizeof(float) + 2 * sizeof(int64_t)) + RED;
};

/* The staged sources: BF16 [S][heads][rows][DP], rows padded to a multiple of 64 with
 * zeros (tp for q and do, nkp for k and v) */
struct fb_staged {
    const __nv_bfloat16 *q, *k, *v, *gdo;
    int64_t tp, nkp;
};

/* X [D, heads, n, S] (F32, F16 or BF16, any strides) -> dst [S][heads][np][DP] as BF16,
 * zeros past n and past D. Block (16 rows, head, sequence), DP / 4 threads a row (four
 * elements each: one float4 load where X is F32 with unit-stride, 16-byte aligned rows). */
template <int DP>
static __global__ void __launch_bounds__(256)
    fb_stage_kernel(struct cu_t x, __nv_bfloat16 *dst, int64_t np, int64_t D)
{
    cu_pdl_enter();
    constexpr int P = DP / 4, R = 256 / P;
    const int64_t hd = blockIdx.y, s = blockIdx.z;
    const int i = 4 * (int)(threadIdx.x % P);
    const bool vec =
        x.type == LT_TYPE_F32 && x.nb[0] == 4 && D % 4 == 0 &&
        ((uintptr_t)x.data | (uintptr_t)x.nb[1] | (uintptr_t)x.nb[2] | (uintptr_t)x.nb[3]) % 16 ==
            0;
    for (int rr = (int)threadIdx.x / P; rr < 16; rr += R) {
        const int64_t r = (int64_t)blockIdx.x * 16 + rr;
        if (r >= np)
            break;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < x.ne[2] && i < D) {
            const char *p = cu_ptr(x, i, hd, r, s);
            if (vec) {
                const float4 f = *(const float4 *)p;
                v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
            } else {
                for (int e = 0; e < 4 && i + e < D; e++)
                    v[e] = cu_load(p + e * x.nb[0], x.type);
            }
        }
        __nv_bfloat162 *o = (__nv_bfloat162 *)(dst + ((s * x.ne[1] + hd) * np + r) * DP + i);
        o[0] = __floats2bfloat162_rn(v[0], v[1]);
        o[1] = __floats2bfloat162_rn(v[2], v[3]);
    }
}

/* dd[(s H + h) T + t] = do . o over the row (F32 sources, any strides): a warp a row */
static __global__ void __launch_bounds__(256) fb_dot_kernel(struct fa_args a)
{
    cu_pdl_enter();
    const int64_t row = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    if (row >= a.S * a.H * a.T)
        return;
    const int64_t t = row % a.T, h = row / a.T % a.H, s = row / a.T / a.H;
    float d = 0.0f;
    for (int64_t i = threadIdx.x & 31; i < a.D; i += 32)
        d += cu_getf(a.gdo, i, h, t, s) * cu_getf(a.o, i, h, t, s);
    for (int o = 16; o > 0; o >>= 1)
        d += __shfl_xor_sync(FB_FULL, d, o);
    if ((threadIdx.x & 31) == 0)
        a.dd[row] = d;
}

/* rows rows of a staged source (src, rows of DP) into dst [rows][DP + 8] by asynchronous
 * 16-byte copies; the block together, each thread issuing all of its copies before any
 * lands. The caller commits, waits and synchronises before reading dst. */
template <int DP>
static __device__ __forceinline__ void fb_copy(__nv_bfloat16 *dst, const __nv_bfloat16 *src,
                                               int rows)
{
    constexpr int C = DP / 8, LD = DP + 8;
    for (int e = threadIdx.x; e < rows * C; e += blockDim.x) {
        const int r = e / C, c = 8 * (e % C);
        __pipeline_memcpy_async(dst + r * LD + c, src + r * DP + c, 16);
    }
}

/* the keys query t of sequence s reads, lo .. hi (hi < lo: none): fa_key_in as a range */
static __device__ __forceinline__ void fb_keys_of(const struct fa_args &a, int64_t t, int64_t s,
                                                  int64_t &lo, int64_t &hi)
{
    lo = 0, hi = -1;
    if (t >= a.T)
        return;
    const int64_t diag = t + (a.nk - a.T);
    hi = a.causal && diag < a.nk - 1 ? diag : a.nk - 1;
    lo = a.pos ? diag - a.pos[s * a.T + t] : 0;
    lo = lo < 0 ? 0 : lo;
}

/* the keys of this lane's two rows t_row and t_row + 8 (in 32 bits: the predicate keeps
 * n_kv and T under 2^31) */
static __device__ __forceinline__ void fb_row_keys(const struct fa_args &a, int64_t t_row,
                                                   int64_t s, int *lo, int *hi)
{
    for (int hh = 0; hh < 2; hh++) {
        int64_t l, h;
        fb_keys_of(a, t_row + 8 * hh, s, l, h);
        lo[hh] = (int)(l < a.nk ? l : a.nk), hi[hh] = (int)h;
    }
}

/* lo becomes the least and hi the greatest over the block; red: 2 int64 a warp */
static __device__ void fb_block_range(int64_t &lo, int64_t &hi, int64_t *red)
{
    long long l = lo, h = hi;
    for (int o = 16; o > 0; o >>= 1) {
        const long long lo2 = __shfl_xor_sync(FB_FULL, l, o), hi2 = __shfl_xor_sync(FB_FULL, h, o);
        l = lo2 < l ? lo2 : l;
        h = hi2 > h ? hi2 : h;
    }
    const int w = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads(); /* red's last readers are done */
    if ((threadIdx.x & 31) == 0)
        red[2 * w] = l, red[2 * w + 1] = h;
    __syncthreads();
    lo = red[0], hi = red[1];
    for (int i = 1; i < nw; i++) {
        lo = red[2 * i] < lo ? red[2 * i] : lo;
        hi = red[2 * i + 1] > hi ? red[2 * i + 1] : hi;
    }
}

/* the key tiles of width BK that queries t0 .. t0 + 63 read: [j_begin, j_end) */
template <int BK>
static __device__ void fb_key_tiles(const struct fa_args &a, int64_t t0, int64_t s, int64_t *red,
                                    int64_t &j_begin, int64_t &j_end)
{
    int64_t lo = a.nk, hi = -1;
    if (threadIdx.x < FB_BQ) {
        int64_t l, h;
        fb_keys_of(a, t0 + threadIdx.x, s, l, h);
        if (h >= l)
            lo = l, hi = h;
    }
    fb_block_range(lo, hi, red);
    j_begin = hi >= lo ? lo / BK * BK : 0;
    j_end = hi >= lo ? hi + 1 : 0;
}

/* S += Q K^T for the 16 query rows q0.. of Qs and the NT * 8 keys of Ks (the warp) */
template <int DP, int NT>
static __device__ __forceinline__ void fb_qk(float (*S)[4], const __nv_bfloat16 *Qs,
                                             const __nv_bfloat16 *Ks, int q0)
{
    constexpr int LD = DP + 8;
#pragma unroll
    for (int kk = 0; kk < DP; kk += 16) {
        uint32_t qa[4];
        mb_load_a(qa, Qs, LD, q0, kk);
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            uint32_t kb[4];
            mb_load_b_nk(kb, Ks, LD, kk, 8 * n);
            mb_mma(S[n], qa, kb);
            mb_mma(S[n + 1], qa, kb + 2);
        }
    }
}

/* O += P V: P the warp's 16 x (NT * 8) probabilities in S's registers, V the tile's rows in
 * Vs; O the warp's 16 x DP */
template <int DP, int NT>
static __device__ __forceinline__ void fb_pv(float (*O)[4], float (*P)[4], const __nv_bfloat16 *Vs)
{
    constexpr int LD = DP + 8;
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t pa[4];
        mb_a_of(pa, P[2 * kk], P[2 * kk + 1]);
#pragma unroll
        for (int d = 0; d < DP / 8; d += 2) {
            uint32_t vb[4];
            mb_load_b_kn(vb, Vs, LD, 16 * kk, 8 * d);
            mb_mma(O[d], pa, vb);
            mb_mma(O[d + 1], pa, vb + 2);
        }
    }
}

/* S (scores of the warp's rows t_row + 8 hh and keys j0 + 8 n + 2 (lane % 4) + e) -> scaled
 * into log2 units, the mask added, -inf where the key is dropped. A tile inside every row's
 * keys with no mask (most of a causal step's) is only scaled. */
template <int NT>
static __device__ __forceinline__ void fb_mask(const struct fa_args &a, float (*S)[4],
                                               const int *lo, const int *hi, int j0, int64_t t_row,
                                               int64_t h, int64_t s)
{
    const float sl2 = a.scale * FB_LOG2E;
    const int j_last = j0 + 8 * NT - 1;
    if (!a.has_mask &&
        __all_sync(FB_FULL, j0 >= lo[0] && j0 >= lo[1] && j_last <= hi[0] && j_last <= hi[1])) {
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                S[n][i] *= sl2;
        return;
    }
    const int jl = j0 + 2 * (int)(threadIdx.x & 3);
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int hh = i / 2, j = jl + 8 * n + (i & 1);
            float z = -INFINITY;
            if (j >= lo[hh] && j <= hi[hh]) {
                z = S[n][i] * sl2;
                if (a.has_mask)
                    z += FB_LOG2E *
                         cu_getf(a.mask, j, t_row + 8 * hh, h % a.mask.ne[2], s % a.mask.ne[3]);
            }
            S[n][i] = z;
        }
}

/* the staged rows of head hd of sequence s, np rows a head */
static __device__ __forceinline__ const __nv_bfloat16 *
fb_rows(const __nv_bfloat16 *x, int64_t s, int64_t heads, int64_t hd, int64_t np, int dp)
{
    return x + ((s * heads + hd) * np) * dp;
}

/* What a block of 64 queries (the forward and dq: block (query tile, h, s), 4 warps of 16
 * rows) knows of itself: its head, key head and sequence, its first row and this lane's
 * (t_row and t_row + 8), their keys lo..hi, the staged k and v rows of its key head, and the
 * key tiles of width BK that its rows reach, [j_begin, j_end). The block together. */
struct fb_qblock {
    int64_t h, s, hk, t0, t_row, j_begin, j_end;
    int lo[2], hi[2];
    const __nv_bfloat16 *kg, *vg;
};

template <int DP, int BK>
static __device__ struct fb_qblock fb_qblock_of(const struct fa_args &a, const struct fb_staged &x,
                                                int64_t *red)
{
    struct fb_qblock b;
    b.h = blockIdx.y, b.s = blockIdx.z, b.hk = b.h / (a.H / a.Hkv);
    b.t0 = (int64_t)blockIdx.x * FB_BQ;
    b.t_row = b.t0 + 16 * (threadIdx.x / 32) + (threadIdx.x & 31) / 4;
    b.kg = fb_rows(x.k, b.s, a.Hkv, b.hk, x.nkp, DP);
    b.vg = fb_rows(x.v, b.s, a.Hkv, b.hk, x.nkp, DP);
    fb_row_keys(a, b.t_row, b.s, b.lo, b.hi);
    fb_key_tiles<BK>(a, b.t0, b.s, red, b.j_begin, b.j_end);
    return b;
}

/* the backward's log-sum-exp of row t of head h (+inf for a row all dropped or past T, so
 * that every P of it is 0) and its D = do . o (0 past T) */
static __device__ __forceinline__ void fb_row_stats(const struct fa_args &a, int64_t h, int64_t s,
                                                    int64_t t, float &lse, float &dd)
{
    const float v = t < a.T ? a.lse[(s * a.H + h) * a.T + t] : -INFINITY;
    lse = v == -INFINITY ? INFINITY : v;
    dd = t < a.T ? a.dd[(s * a.H + h) * a.T + t] : 0.0f;
}

/* this lane's elements of a warp's 16 x DP accumulators R (rows t_row and t_row + 8) times
 * f[hh] into out [S][T][H][D] at head h: rows past T and columns past D are not stored */
template <int DT>
static __device__ __forceinline__ void fb_store_rows(const struct fa_args &a, const float (*R)[4],
                                                     const float *f, int64_t t_row, int64_t h,
                                                     int64_t s)
{
    const int c0 = 2 * (threadIdx.x & 3);
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int64_t t = t_row + 8 * hh;
        if (t >= a.T)
            continue;
        float *o = a.out + ((s * a.T + t) * a.H + h) * a.D;
#pragma unroll
        for (int d = 0; d < DT; d++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (8 * d + c0 + e < a.D)
                    o[8 * d + c0 + e] = R[d][2 * hh + e] * f[hh];
    }
}

/* Forward (STATS: the log-sum-exp and D only). Block (query tile, h, s), 4 warps. */
template <int DP, bool STATS>
static __global__ void __launch_bounds__(128)
    fb_forward_kernel(struct fa_args a, struct fb_staged x)
{
    using F = fb_dims<DP>;
    constexpr int LD = F::LD, BK = F::BK, NT = BK / 8, DT = STATS ? 2 : DP / 8;
    extern __shared__ __align__(128) float fb_sh[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fb_sh, *Ks = Qs + FB_BQ * LD, *Vs = Ks + BK * LD;
    int64_t *red = (int64_t *)(Vs + BK * LD);
    const int w = threadIdx.x / 32;
    const struct fb_qblock b = fb_qblock_of<DP, BK>(a, x, red);
    const int64_t h = b.h, s = b.s, t0 = b.t0, t_row = b.t_row, j_begin = b.j_begin,
                  j_end = b.j_end;
    const __nv_bfloat16 *kg = b.kg, *vg = b.vg;
    const int *lo = b.lo, *hi = b.hi;
    fb_copy<DP>(Qs, fb_rows(x.q, s, a.H, h, x.tp, DP) + t0 * DP, FB_BQ);
    if (j_begin < j_end)
        fb_copy<DP>(Ks, kg + j_begin * DP, BK);
    __pipeline_commit();
    float O[DT][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int64_t j0 = j_begin; j0 < j_end; j0 += BK) {
        if (!STATS)
            fb_copy<DP>(Vs, vg + j0 * DP, BK);
        __pipeline_commit();
        __pipeline_wait_prior(1); /* Q and this tile's K */
        __syncthreads();
        float S[NT][4] = {};
        fb_qk<DP, NT>(S, Qs, Ks, 16 * w);
        fb_mask<NT>(a, S, lo, hi, (int)j0, t_row, h, s);
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < NT; n++)
                mx = fmaxf(mx, fmaxf(S[n][2 * hh], S[n][2 * hh + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(FB_FULL, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(FB_FULL, mx, 2));
            const float mn = fmaxf(m[hh], mx), ref = mn == -INFINITY ? 0.0f : mn;
            const float alpha = exp2f(m[hh] - ref);
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = exp2f(S[n][2 * hh + e] - ref);
                    S[n][2 * hh + e] = p;
                    sum += p;
                }
            m[hh] = mn;
            l[hh] = l[hh] * alpha + sum;
            if (!STATS)
#pragma unroll
                for (int d = 0; d < DT; d++)
                    O[d][2 * hh] *= alpha, O[d][2 * hh + 1] *= alpha;
        }
        __pipeline_wait_prior(0); /* this tile's V */
        __syncthreads();          /* and every warp is done with Ks */
        if (j0 + BK < j_end)
            fb_copy<DP>(Ks, kg + (j0 + BK) * DP, BK);
        __pipeline_commit();
        if (!STATS)
            fb_pv<DP, NT>(O, S, Vs);
        __syncthreads(); /* every warp is done with Vs */
    }
    __pipeline_wait_prior(0); /* Q's copy, when no key tile waited for it */
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        l[hh] += __shfl_xor_sync(FB_FULL, l[hh], 1);
        l[hh] += __shfl_xor_sync(FB_FULL, l[hh], 2);
    }
    if (STATS) {
        if ((threadIdx.x & 3) == 0)
            for (int hh = 0; hh < 2; hh++)
                if (t_row + 8 * hh < a.T)
                    a.lse[(s * a.H + h) * a.T + t_row + 8 * hh] =
                        l[hh] > 0.0f ? m[hh] + log2f(l[hh]) : -INFINITY;
        return;
    }
    const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
    fb_store_rows<DT>(a, O, inv, t_row, h, s);
}

/* dq: block (query tile, h, s), 4 warps of 16 query rows */
template <int DP>
static __global__ void __launch_bounds__(128) fb_dq_kernel(struct fa_args a, struct fb_staged x)
{
    using F = fb_dims<DP>;
    constexpr int LD = F::LD, BK = F::BK_DQ, NT = BK / 8, DT = DP / 8;
    extern __shared__ __align__(128) float fb_sh[];
    /* Qs, dOs [FB_BQ][LD]; then K, V [BK][LD] of buffer 0, then of buffer 1 */
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fb_sh, *dOs = Qs + FB_BQ * LD, *KV = dOs + FB_BQ * LD;
    int64_t *red = (int64_t *)(KV + 4 * BK * LD);
    const int w = threadIdx.x / 32;
    const struct fb_qblock b = fb_qblock_of<DP, BK>(a, x, red);
    const int64_t h = b.h, s = b.s, t0 = b.t0, t_row = b.t_row, j_begin = b.j_begin,
                  j_end = b.j_end;
    const __nv_bfloat16 *kg = b.kg, *vg = b.vg;
    const int *lo = b.lo, *hi = b.hi;
    float lse[2], dd[2];
    for (int hh = 0; hh < 2; hh++)
        fb_row_stats(a, h, s, t_row + 8 * hh, lse[hh], dd[hh]);
    fb_copy<DP>(Qs, fb_rows(x.q, s, a.H, h, x.tp, DP) + t0 * DP, FB_BQ);
    fb_copy<DP>(dOs, fb_rows(x.gdo, s, a.H, h, x.tp, DP) + t0 * DP, FB_BQ);
    if (j_begin < j_end) {
        fb_copy<DP>(KV, kg + j_begin * DP, BK);
        fb_copy<DP>(KV + BK * LD, vg + j_begin * DP, BK);
    }
    __pipeline_commit();
    float dQ[DT][4] = {};
    int buf = 0;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += BK, buf ^= 1) {
        if (j0 + BK < j_end) { /* the next tile into the other buffer */
            __nv_bfloat16 *nx = KV + (buf ^ 1) * 2 * BK * LD;
            fb_copy<DP>(nx, kg + (j0 + BK) * DP, BK);
            fb_copy<DP>(nx + BK * LD, vg + (j0 + BK) * DP, BK);
        }
        __pipeline_commit();
        __pipeline_wait_prior(1); /* this tile's K and V (and Q, dO) */
        __syncthreads();
        const __nv_bfloat16 *Ks = KV + buf * 2 * BK * LD, *Vs = Ks + BK * LD;
        float S[NT][4] = {}, dP[NT][4] = {};
        fb_qk<DP, NT>(S, Qs, Ks, 16 * w);
        fb_qk<DP, NT>(dP, dOs, Vs, 16 * w);
        fb_mask<NT>(a, S, lo, hi, (int)j0, t_row, h, s);
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                S[n][i] = exp2f(S[n][i] - lse[i / 2]) * (dP[n][i] - dd[i / 2]);
        fb_pv<DP, NT>(dQ, S, Ks); /* dq += dS K */
        __syncthreads();          /* every warp is done with this buffer before its refill */
    }
    __pipeline_wait_prior(0);
    const float sc[2] = {a.scale, a.scale};
    fb_store_rows<DT>(a, dQ, sc, t_row, h, s);
}

/* the query tiles that reach keys j0 .. j0 + FB_BKV - 1: [t_begin, t_end) */
static __device__ void fb_query_tiles(const struct fa_args &a, int64_t j0, int64_t s, int64_t *red,
                                      int64_t &t_begin, int64_t &t_end)
{
    const int64_t j_last = j0 + FB_BKV - 1;
    int64_t lo = a.T, hi = -1;
    /* causal: no query before j0 - (n_kv - T) reads a key of the tile */
    int64_t t = a.causal ? j0 - (a.nk - a.T) : 0;
    for (t = (t < 0 ? 0 : t) + threadIdx.x; t < a.T; t += blockDim.x) {
        int64_t l, h;
        fb_keys_of(a, t, s, l, h);
        if (l <= j_last && h >= j0 && h >= l) {
            lo = t < lo ? t : lo;
            hi = t;
        }
    }
    fb_block_range(lo, hi, red);
    t_begin = hi >= lo ? lo / FB_BQ * FB_BQ : 0;
    t_end = hi >= lo ? hi + 1 : 0;
}

/* C1 += A1 B1 and C2 += A2 B2 (the warp): A1, A2 rows m0.. (16) of X[m][k] (pitch lda), over
 * k < K; B1, B2 columns n0.. (8 NT) of X[n][k], or of X[k][n] with KN (pitch ldb) */
template <int K, int NT, bool KN>
static __device__ __forceinline__ void
fb_mma_pair(float (*C1)[4], float (*C2)[4], const __nv_bfloat16 *A1, const __nv_bfloat16 *A2,
            int lda, int m0, const __nv_bfloat16 *B1, const __nv_bfloat16 *B2, int ldb, int n0)
{
#pragma unroll
    for (int kk = 0; kk < K; kk += 16) {
        uint32_t a1[4], a2[4];
        mb_load_a(a1, A1, lda, m0, kk);
        mb_load_a(a2, A2, lda, m0, kk);
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            uint32_t b1[4], b2[4];
            if (KN) {
                mb_load_b_kn(b1, B1, ldb, kk, n0 + 8 * n);
                mb_load_b_kn(b2, B2, ldb, kk, n0 + 8 * n);
            } else {
                mb_load_b_nk(b1, B1, ldb, kk, n0 + 8 * n);
                mb_load_b_nk(b2, B2, ldb, kk, n0 + 8 * n);
            }
            mb_mma(C1[n], a1, b1);
            mb_mma(C1[n + 1], a1, b1 + 2);
            mb_mma(C2[n], a2, b2);
            mb_mma(C2[n + 1], a2, b2 + 2);
        }
    }
}

/* A dk/dv block's buffer of one query tile: q and do's rows, and what P^T and dS^T need of
 * each query */
struct fb_qtile {
    __nv_bfloat16 *Qs, *dOs; /* [FB_BQ][DP + 8] */
    float *lse, *dd;         /* [FB_BQ]: the log-sum-exp (+inf for a row all dropped), D */
    int64_t *lo, *hi;        /* [FB_BQ]: the keys each query reads */
};

/* buffer b of a dk/dv block's shared memory (after K, V, P^T and dS^T) */
template <int DP> static __device__ struct fb_qtile fb_qtile_at(__nv_bfloat16 *base, int b)
{
    constexpr int LD = DP + 8;
    struct fb_qtile q;
    q.Qs = base + b * 2 * FB_BQ * LD;
    q.dOs = q.Qs + FB_BQ * LD;
    float *f = (float *)(base + 4 * FB_BQ * LD) + b * 2 * FB_BQ;
    q.lse = f, q.dd = f + FB_BQ;
    int64_t *i = (int64_t *)((float *)(base + 4 * FB_BQ * LD) + 4 * FB_BQ) + b * 2 * FB_BQ;
    q.lo = i, q.hi = i + FB_BQ;
    return q;
}

/* starts filling q's buffer with query tile t0 of head h: the rows' copies (uncommitted) and
 * the per-query values */
template <int DP>
static __device__ void fb_qtile_fill(const struct fb_qtile &q, const struct fa_args &a,
                                     const struct fb_staged &x, int64_t h, int64_t t0, int64_t s)
{
    fb_copy<DP>(q.Qs, fb_rows(x.q, s, a.H, h, x.tp, DP) + t0 * DP, FB_BQ);
    fb_copy<DP>(q.dOs, fb_rows(x.gdo, s, a.H, h, x.tp, DP) + t0 * DP, FB_BQ);
    for (int e = threadIdx.x; e < FB_BQ; e += blockDim.x) {
        const int64_t t = t0 + e;
        fb_keys_of(a, t, s, q.lo[e], q.hi[e]);
        fb_row_stats(a, h, s, t, q.lse[e], q.dd[e]);
    }
}

/* dk, dv: block (key tile, hk, s), 4 warps a 16-key strip each, times WN column shares */
template <int DP>
static __global__ void __launch_bounds__(32 * fb_dims<DP>::DKV_WARPS)
    fb_dkv_kernel(struct fa_args a, struct fb_staged x)
{
    using F = fb_dims<DP>;
    constexpr int LD = F::LD, LP = F::LP, WN = F::WN, QC = FB_BQ / WN, DC = DP / WN;
    constexpr int NQ = QC / 8, ND = DC / 8;
    extern __shared__ __align__(128) float fb_sh[];
    /* K, V [FB_BKV][LD]; P^T, dS^T [FB_BKV][LP]; then the two query tiles' buffers */
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)fb_sh, *Vs = Ks + FB_BKV * LD, *Ps = Vs + FB_BKV * LD,
                  *dSs = Ps + FB_BKV * LP, *qbase = dSs + FB_BKV * LP;
    int64_t *red = (int64_t *)((float *)(qbase + 4 * FB_BQ * LD) + 4 * FB_BQ) + 4 * FB_BQ;
    const int w = threadIdx.x / 32, r = w % 4, c = w / 4, g = (threadIdx.x & 31) / 4,
              c0 = 2 * (threadIdx.x & 3);
    const int64_t hk = blockIdx.y, s = blockIdx.z, j0 = (int64_t)blockIdx.x * FB_BKV,
                  G = a.H / a.Hkv;
    int64_t t_begin, t_end;
    fb_query_tiles(a, j0, s, red, t_begin, t_end);
    const int64_t n_t = (t_end - t_begin + FB_BQ - 1) / FB_BQ, items = G * n_t;
    fb_copy<DP>(Ks, fb_rows(x.k, s, a.Hkv, hk, x.nkp, DP) + j0 * DP, FB_BKV);
    fb_copy<DP>(Vs, fb_rows(x.v, s, a.Hkv, hk, x.nkp, DP) + j0 * DP, FB_BKV);
    if (items > 0)
        fb_qtile_fill<DP>(fb_qtile_at<DP>(qbase, 0), a, x, hk * G, t_begin, s);
    __pipeline_commit();
    float dK[ND][4] = {}, dV[ND][4] = {};
    for (int64_t it = 0; it < items; it++) {
        const int64_t h = hk * G + it / n_t, t0 = t_begin + it % n_t * FB_BQ;
        if (it + 1 < items) /* the next query tile into the other buffer */
            fb_qtile_fill<DP>(fb_qtile_at<DP>(qbase, (int)((it + 1) & 1)), a, x,
                              hk * G + (it + 1) / n_t, t_begin + (it + 1) % n_t * FB_BQ, s);
        __pipeline_commit();
        __pipeline_wait_prior(1); /* this tile's q and do (and K, V) */
        __syncthreads();
        const struct fb_qtile q = fb_qtile_at<DP>(qbase, (int)(it & 1));
        /* P^T and dS^T of keys 16 r.. and queries QC c.. */
        float St[NQ][4] = {}, dPt[NQ][4] = {};
        fb_mma_pair<DP, NQ, false>(St, dPt, Ks, Vs, LD, 16 * r, q.Qs, q.dOs, LD, QC * c);
#pragma unroll
        for (int n = 0; n < NQ; n++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int kr = 16 * r + g + 8 * hh;
                const int64_t j = j0 + kr;
                float p[2], ds[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int qc = QC * c + 8 * n + c0 + e;
                    float z = St[n][2 * hh + e] * a.scale;
                    if (a.has_mask && j < a.nk && t0 + qc < a.T)
                        z += cu_getf(a.mask, j, t0 + qc, h % a.mask.ne[2], s % a.mask.ne[3]);
                    p[e] = j >= q.lo[qc] && j <= q.hi[qc] ? exp2f(z * FB_LOG2E - q.lse[qc]) : 0.0f;
                    ds[e] = p[e] * (dPt[n][2 * hh + e] - q.dd[qc]);
                }
                const int at = kr * LP + QC * c + 8 * n + c0;
                *(__nv_bfloat162 *)(Ps + at) = __floats2bfloat162_rn(p[0], p[1]);
                *(__nv_bfloat162 *)(dSs + at) = __floats2bfloat162_rn(ds[0], ds[1]);
            }
        __syncthreads();
        /* dv += P^T dO and dk += dS^T Q over keys 16 r.. and columns DC c.. */
        fb_mma_pair<FB_BQ, ND, true>(dV, dK, Ps, dSs, LP, 16 * r, q.dOs, q.Qs, LD, DC * c);
        __syncthreads(); /* every warp is done with this buffer, P^T and dS^T */
    }
    __pipeline_wait_prior(0);
    const int64_t n_q = a.D * a.H * a.T * a.S, n_k = a.D * a.Hkv * a.nk * a.S;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int64_t j = j0 + 16 * r + g + 8 * hh;
        if (j >= a.nk)
            continue;
        float *dk = a.out + n_q + ((s * a.nk + j) * a.Hkv + hk) * a.D, *dv = dk + n_k;
#pragma unroll
        for (int d = 0; d < ND; d++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = DC * c + 8 * d + c0 + e;
                if (col < a.D) {
                    dk[col] = dK[d][2 * hh + e] * a.scale;
                    dv[col] = dV[d][2 * hh + e];
                }
            }
    }
}

/* ---- host ---- */

static int fb_dp(int64_t D)
{
    return D <= 64 ? 64 : D <= 128 ? 128 : 256;
}

static int64_t fb_pad64(int64_t n)
{
    return (n + 63) / 64 * 64;
}

size_t cu_flash_attn_bf16_staged_bytes(int64_t D, int64_t H, int64_t Hkv, int64_t T, int64_t nk,
                                       int64_t S, bool back)
{
    const int64_t rows = (back ? 2 : 1) * S * H * fb_pad64(T) + 2 * S * Hkv * fb_pad64(nk);
    return sizeof(__nv_bfloat16) * (size_t)(rows * fb_dp(D));
}

typedef void (*fb_kernel)(struct fa_args, struct fb_staged);

static lt_status fb_launch(struct cu_ctx *c, fb_kernel k, dim3 grid, int threads, size_t shared,
                           const struct fa_args &a, const struct fb_staged &x, const char *name)
{
    lt_status st =
        cu_check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared),
                 "raising flash_attn_bf16's shared memory");
    if (st != LT_OK)
        return st;
    k<<<grid, threads, shared, c->stream>>>(a, x);
    return cu_launched(name);
}

/* x [D, heads, n, S] into dst as fb_stage_kernel lays it out, np rows a head */
template <int DP>
static lt_status fb_stage(struct cu_ctx *c, const struct cu_t &x, __nv_bfloat16 *dst, int64_t np,
                          int64_t D)
{
    if (x.ne[3] * x.ne[1] * np == 0)
        return LT_OK;
    cu_launch_pdl(c, fb_stage_kernel<DP>,
                  dim3((unsigned)((np + 15) / 16), (unsigned)x.ne[1], (unsigned)x.ne[3]), 256, 0, x,
                  dst, np, D);
    return cu_launched("flash_attn_bf16_stage");
}

template <int DP>
static lt_status fb_run(struct cu_ctx *c, const struct lt_tensor *node, const struct fa_args &a,
                        __nv_bfloat16 *staged)
{
    using F = fb_dims<DP>;
    const bool back = node->op == LT_OP_FLASH_ATTN_BACK;
    struct fb_staged x;
    x.tp = fb_pad64(a.T), x.nkp = fb_pad64(a.nk);
    __nv_bfloat16 *q = staged, *k = q + a.S * a.H * x.tp * DP, *v = k + a.S * a.Hkv * x.nkp * DP,
                  *gdo = v + a.S * a.Hkv * x.nkp * DP;
    x.q = q, x.k = k, x.v = v, x.gdo = back ? gdo : NULL;
    lt_status st = fb_stage<DP>(c, a.q, q, x.tp, a.D);
    if (st == LT_OK)
        st = fb_stage<DP>(c, a.k, k, x.nkp, a.D);
    if (st == LT_OK)
        st = fb_stage<DP>(c, a.v, v, x.nkp, a.D);
    if (st == LT_OK && back)
        st = fb_stage<DP>(c, a.gdo, gdo, x.tp, a.D);
    if (st != LT_OK)
        return st;
    const dim3 queries((unsigned)((a.T + FB_BQ - 1) / FB_BQ), (unsigned)a.H, (unsigned)a.S);
    if (!back)
        return fb_launch(c, fb_forward_kernel<DP, false>, queries, 128, F::FWD, a, x,
                         "flash_attn_bf16");
    const int64_t rows = a.S * a.H * a.T;
    cu_launch_pdl(c, fb_dot_kernel, (unsigned)((rows + 7) / 8), 256, 0, a);
    st = cu_launched("flash_attn_bf16_dot");
    if (st == LT_OK)
        st = fb_launch(c, fb_forward_kernel<DP, true>, queries, 128, F::FWD, a, x,
                       "flash_attn_bf16_stats");
    if (st == LT_OK)
        st = fb_launch(c, fb_dq_kernel<DP>, queries, 128, F::DQ, a, x, "flash_attn_bf16_dq");
    if (st == LT_OK && a.nk > 0)
        st = fb_launch(
            c, fb_dkv_kernel<DP>,
            dim3((unsigned)((a.nk + FB_BKV - 1) / FB_BKV), (unsigned)a.Hkv, (unsigned)a.S),
            32 * F::DKV_WARPS, F::DKV, a, x, "flash_attn_bf16_dkv");
    return st;
}

lt_status cu_flash_attn_bf16(struct cu_ctx *c, const struct lt_tensor *node, struct fa_args a,
                             void *staged)
{
    __nv_bfloat16 *x = (__nv_bfloat16 *)staged;
    switch (fb_dp(a.D)) {
    case 64: return fb_run<64>(c, node, a, x);
    case 128: return fb_run<128>(c, node, a, x);
    default: return fb_run<256>(c, node, a, x);
    }
}
