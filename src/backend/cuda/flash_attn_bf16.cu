/* flash_attn_bf16.cu: FLASH_ATTN and FLASH_ATTN_BACK of LT_FLASH_ATTN_PREC_BF16 (training and
 * prefill, whose other products round to BF16) on the BF16 tensor cores (mma_bf16.h), in
 * FlashAttention-2's tiling: q, k, v, do as BF16 tiles in shared memory, the scores, the
 * probabilities and the accumulators in registers, F32 sums. src/ops/flash_attn.c says what
 * the ops compute; flash_attn.cu has the family's one predicate, which takes the same nodes
 * for this precision as for the others (D up to 256), and the F32 / TF32 kernels.
 *
 * Head dims are padded to DP = 64, 128 or 256 (zeros past D add nothing). Every block keeps
 * the tiles it reads in BF16, rows pitched DP + 8 (ldmatrix without bank conflicts), filled
 * from the sources in any type and strides.
 *
 * Forward, a block per (64 queries, query head, sequence), 4 warps of 16 query rows: for each
 * tile of 64 keys, S = Q K^T (16 x 64 a warp, in registers), scaled into log2 units with
 * dropped keys at -inf, the online softmax a row (the running maximum m and sum l, a row's
 * four lanes agreeing on m by two shuffles; l stays a lane's partial until the end), O = alpha
 * O + P V with P rounded to BF16 from the registers that hold it. O / l at the end (zeros for
 * a row with every key dropped, SOFT_MAX's rule). The STATS instance skips V and O and
 * writes each row's log-sum-exp in log2 units (m + log2 l, -inf for a row all dropped) and
 * D = do . o into scratch, for the backward.
 *
 * Backward, after STATS, in two kernels that each own the rows they write (no atomics, a
 * fixed order of sums):
 *   dq: a block per (64 queries, query head, sequence), 4 warps of 16 query rows, over the
 *     key tiles (32 keys at DP 256, so dq, S and dP fit the registers): P = 2^(S - lse),
 *     dP = dO V^T, dS = P o (dP - D), dq += dS K, dq scaled at the end.
 *   dk, dv: a block per (64 keys, key head, sequence), over the group's query heads and the
 *     query tiles that reach its keys. Each warp owns 16 keys (and at DP 256 half of the
 *     columns: 8 warps). Per query tile, first P^T and dS^T [64 keys x 64 queries] (K Q^T and
 *     V dO^T, each warp its keys and its share of the queries) go to shared memory as BF16;
 *     then dv += P^T dO and dk += dS^T q, dk scaled at the end.
 *
 * Key ranges: a query reads keys lo..hi (fb_keys_of: causal, the cache, packed examples'
 * positions), so a block walks only the key tiles its rows reach, and a dk/dv block only the
 * query tiles whose rows reach its keys: a packed step's examples cost what they would alone.
 *
 * Rounding: q, k, v, do, P and dS enter products as BF16 (relative error 2^-9); everything
 * else is F32. Against the CPU's F32 the results are about 1e-5 off in normalised squared
 * error (test_cuda_conformance's TOL_FA_BF16). */
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
    static constexpr size_t DQ = sizeof(__nv_bfloat16) * (2 * FB_BQ + 2 * BK_DQ) * LD + RED;
    /* K, V, Q, dO; P^T, dS^T; lse, D (float) and lo, hi (int64) of the tile's queries */
    static constexpr size_t DKV = sizeof(__nv_bfloat16) * (4 * 64 * LD + 2 * FB_BKV * LP) +
                                  FB_BQ * (2 * sizeof(float) + 2 * sizeof(int64_t)) + RED;
};

/* rows n0 .. n0 + rows - 1 of X [D, heads, n, S] at (head, s) into dst [rows][DP + 8] as
 * BF16, zeros past n and past D; the block together */
template <int DP>
static __device__ void fb_load(__nv_bfloat16 *dst, const struct cu_t &x, int64_t head, int64_t n0,
                               int64_t n, int64_t s, int rows, int64_t D)
{
    constexpr int HP = DP / 2, LD = DP + 8;
    for (int e = threadIdx.x; e < rows * HP; e += blockDim.x) {
        const int r = e / HP, i = 2 * (e % HP);
        float x0 = 0.0f, x1 = 0.0f;
        if (n0 + r < n) {
            const char *p = cu_ptr(x, i, head, n0 + r, s);
            if (i < D)
                x0 = cu_load(p, x.type);
            if (i + 1 < D)
                x1 = cu_load(p + x.nb[0], x.type);
        }
        *(__nv_bfloat162 *)(dst + r * LD + i) = __floats2bfloat162_rn(x0, x1);
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
 * into log2 units, the mask added, -inf where the key is dropped */
template <int NT>
static __device__ __forceinline__ void fb_mask(const struct fa_args &a, float (*S)[4],
                                               const int64_t *lo, const int64_t *hi, int64_t j0,
                                               int64_t t_row, int64_t h, int64_t s)
{
    const int64_t jl = j0 + 2 * (threadIdx.x & 3);
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int hh = i / 2;
            const int64_t j = jl + 8 * n + (i & 1);
            float z = -INFINITY;
            if (j >= lo[hh] && j <= hi[hh]) {
                z = S[n][i] * a.scale;
                if (a.has_mask)
                    z += cu_getf(a.mask, j, t_row + 8 * hh, h % a.mask.ne[2], s % a.mask.ne[3]);
                z *= FB_LOG2E;
            }
            S[n][i] = z;
        }
}

/* Forward (STATS: the log-sum-exp and D only). Block (query tile, h, s), 4 warps. */
template <int DP, bool STATS>
static __global__ void __launch_bounds__(128) fb_forward_kernel(struct fa_args a)
{
    using F = fb_dims<DP>;
    constexpr int LD = F::LD, BK = F::BK, NT = BK / 8, DT = STATS ? 2 : DP / 8;
    extern __shared__ __align__(128) float fb_sh[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fb_sh, *Ks = Qs + FB_BQ * LD, *Vs = Ks + BK * LD;
    int64_t *red = (int64_t *)(Vs + BK * LD);
    const int w = threadIdx.x / 32, g = (threadIdx.x & 31) / 4;
    const int64_t h = blockIdx.y, s = blockIdx.z, hk = h / (a.H / a.Hkv),
                  t0 = (int64_t)blockIdx.x * FB_BQ, t_row = t0 + 16 * w + g;
    fb_load<DP>(Qs, a.q, h, t0, a.T, s, FB_BQ, a.D);
    int64_t lo[2], hi[2], j_begin, j_end;
    fb_keys_of(a, t_row, s, lo[0], hi[0]);
    fb_keys_of(a, t_row + 8, s, lo[1], hi[1]);
    fb_key_tiles<BK>(a, t0, s, red, j_begin, j_end);
    float O[DT][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int64_t j0 = j_begin; j0 < j_end; j0 += BK) {
        __syncthreads(); /* the last tile's products have read Ks and Vs */
        fb_load<DP>(Ks, a.k, hk, j0, a.nk, s, BK, a.D);
        if (!STATS)
            fb_load<DP>(Vs, a.v, hk, j0, a.nk, s, BK, a.D);
        __syncthreads();
        float S[NT][4] = {};
        fb_qk<DP, NT>(S, Qs, Ks, 16 * w);
        fb_mask<NT>(a, S, lo, hi, j0, t_row, h, s);
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
        if (!STATS)
            fb_pv<DP, NT>(O, S, Vs);
    }
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
        /* D = do . o of the warp's 16 rows, the warp a row at a time */
        for (int r = 0; r < 16; r++) {
            const int64_t t = t0 + 16 * w + r;
            if (t >= a.T)
                break;
            float d = 0.0f;
            for (int64_t i = threadIdx.x & 31; i < a.D; i += 32)
                d += cu_getf(a.gdo, i, h, t, s) * cu_getf(a.o, i, h, t, s);
            for (int o = 16; o > 0; o >>= 1)
                d += __shfl_xor_sync(FB_FULL, d, o);
            if ((threadIdx.x & 31) == 0)
                a.dd[(s * a.H + h) * a.T + t] = d;
        }
        return;
    }
    const int c0 = 2 * (threadIdx.x & 3);
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int64_t t = t_row + 8 * hh;
        if (t >= a.T)
            continue;
        const float inv = l[hh] > 0.0f ? 1.0f / l[hh] : 0.0f;
        float *o = a.out + ((s * a.T + t) * a.H + h) * a.D;
#pragma unroll
        for (int d = 0; d < DT; d++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (8 * d + c0 + e < a.D)
                    o[8 * d + c0 + e] = O[d][2 * hh + e] * inv;
    }
}

/* dq: block (query tile, h, s), 4 warps of 16 query rows */
template <int DP> static __global__ void __launch_bounds__(128) fb_dq_kernel(struct fa_args a)
{
    using F = fb_dims<DP>;
    constexpr int LD = F::LD, BK = F::BK_DQ, NT = BK / 8, DT = DP / 8;
    extern __shared__ __align__(128) float fb_sh[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fb_sh, *dOs = Qs + FB_BQ * LD, *Ks = dOs + FB_BQ * LD,
                  *Vs = Ks + BK * LD;
    int64_t *red = (int64_t *)(Vs + BK * LD);
    const int w = threadIdx.x / 32, g = (threadIdx.x & 31) / 4;
    const int64_t h = blockIdx.y, s = blockIdx.z, hk = h / (a.H / a.Hkv),
                  t0 = (int64_t)blockIdx.x * FB_BQ, t_row = t0 + 16 * w + g;
    fb_load<DP>(Qs, a.q, h, t0, a.T, s, FB_BQ, a.D);
    fb_load<DP>(dOs, a.gdo, h, t0, a.T, s, FB_BQ, a.D);
    int64_t lo[2], hi[2], j_begin, j_end;
    float lse[2], dd[2];
    for (int hh = 0; hh < 2; hh++) {
        const int64_t t = t_row + 8 * hh;
        fb_keys_of(a, t, s, lo[hh], hi[hh]);
        const float x = t < a.T ? a.lse[(s * a.H + h) * a.T + t] : -INFINITY;
        lse[hh] = x == -INFINITY ? INFINITY : x; /* a row all dropped: every P 0 */
        dd[hh] = t < a.T ? a.dd[(s * a.H + h) * a.T + t] : 0.0f;
    }
    fb_key_tiles<BK>(a, t0, s, red, j_begin, j_end);
    float dQ[DT][4] = {};
    for (int64_t j0 = j_begin; j0 < j_end; j0 += BK) {
        __syncthreads();
        fb_load<DP>(Ks, a.k, hk, j0, a.nk, s, BK, a.D);
        fb_load<DP>(Vs, a.v, hk, j0, a.nk, s, BK, a.D);
        __syncthreads();
        float S[NT][4] = {}, dP[NT][4] = {};
        fb_qk<DP, NT>(S, Qs, Ks, 16 * w);
        fb_qk<DP, NT>(dP, dOs, Vs, 16 * w);
        fb_mask<NT>(a, S, lo, hi, j0, t_row, h, s);
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                S[n][i] = exp2f(S[n][i] - lse[i / 2]) * (dP[n][i] - dd[i / 2]);
        fb_pv<DP, NT>(dQ, S, Ks); /* dq += dS K */
    }
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
                    o[8 * d + c0 + e] = dQ[d][2 * hh + e] * a.scale;
    }
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

/* dk, dv: block (key tile, hk, s), 4 warps a 16-key strip each, times WN column shares */
template <int DP>
static __global__ void __launch_bounds__(32 * fb_dims<DP>::DKV_WARPS)
    fb_dkv_kernel(struct fa_args a)
{
    using F = fb_dims<DP>;
    constexpr int LD = F::LD, LP = F::LP, WN = F::WN, QC = FB_BQ / WN, DC = DP / WN;
    constexpr int NQ = QC / 8, ND = DC / 8;
    extern __shared__ __align__(128) float fb_sh[];
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)fb_sh, *Vs = Ks + FB_BKV * LD, *Qs = Vs + FB_BKV * LD,
                  *dOs = Qs + FB_BQ * LD, *Ps = dOs + FB_BQ * LD, *dSs = Ps + FB_BKV * LP;
    float *lse_s = (float *)(dSs + FB_BKV * LP), *dd_s = lse_s + FB_BQ;
    int64_t *lo_s = (int64_t *)(dd_s + FB_BQ), *hi_s = lo_s + FB_BQ, *red = hi_s + FB_BQ;
    const int w = threadIdx.x / 32, r = w % 4, c = w / 4, g = (threadIdx.x & 31) / 4,
              c0 = 2 * (threadIdx.x & 3);
    const int64_t hk = blockIdx.y, s = blockIdx.z, j0 = (int64_t)blockIdx.x * FB_BKV,
                  G = a.H / a.Hkv;
    fb_load<DP>(Ks, a.k, hk, j0, a.nk, s, FB_BKV, a.D);
    fb_load<DP>(Vs, a.v, hk, j0, a.nk, s, FB_BKV, a.D);
    int64_t t_begin, t_end;
    fb_query_tiles(a, j0, s, red, t_begin, t_end);
    float dK[ND][4] = {}, dV[ND][4] = {};
    for (int64_t h = hk * G; h < (hk + 1) * G; h++)
        for (int64_t t0 = t_begin; t0 < t_end; t0 += FB_BQ) {
            __syncthreads(); /* the last tile's products have read Qs, dOs, Ps and dSs */
            fb_load<DP>(Qs, a.q, h, t0, a.T, s, FB_BQ, a.D);
            fb_load<DP>(dOs, a.gdo, h, t0, a.T, s, FB_BQ, a.D);
            for (int e = threadIdx.x; e < FB_BQ; e += blockDim.x) {
                const int64_t t = t0 + e;
                fb_keys_of(a, t, s, lo_s[e], hi_s[e]);
                const float x = t < a.T ? a.lse[(s * a.H + h) * a.T + t] : -INFINITY;
                lse_s[e] = x == -INFINITY ? INFINITY : x;
                dd_s[e] = t < a.T ? a.dd[(s * a.H + h) * a.T + t] : 0.0f;
            }
            __syncthreads();
            /* P^T and dS^T of keys 16 r.. and queries QC c.. */
            float St[NQ][4] = {}, dPt[NQ][4] = {};
#pragma unroll
            for (int kk = 0; kk < DP; kk += 16) {
                uint32_t ka[4], va[4];
                mb_load_a(ka, Ks, LD, 16 * r, kk);
                mb_load_a(va, Vs, LD, 16 * r, kk);
#pragma unroll
                for (int n = 0; n < NQ; n += 2) {
                    uint32_t qb[4], ob[4];
                    mb_load_b_nk(qb, Qs, LD, kk, QC * c + 8 * n);
                    mb_load_b_nk(ob, dOs, LD, kk, QC * c + 8 * n);
                    mb_mma(St[n], ka, qb);
                    mb_mma(St[n + 1], ka, qb + 2);
                    mb_mma(dPt[n], va, ob);
                    mb_mma(dPt[n + 1], va, ob + 2);
                }
            }
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
                        p[e] =
                            j >= lo_s[qc] && j <= hi_s[qc] ? exp2f(z * FB_LOG2E - lse_s[qc]) : 0.0f;
                        ds[e] = p[e] * (dPt[n][2 * hh + e] - dd_s[qc]);
                    }
                    const int at = kr * LP + QC * c + 8 * n + c0;
                    *(__nv_bfloat162 *)(Ps + at) = __floats2bfloat162_rn(p[0], p[1]);
                    *(__nv_bfloat162 *)(dSs + at) = __floats2bfloat162_rn(ds[0], ds[1]);
                }
            __syncthreads();
            /* dv += P^T dO and dk += dS^T Q over keys 16 r.. and columns DC c.. */
#pragma unroll
            for (int kk = 0; kk < FB_BQ; kk += 16) {
                uint32_t pa[4], sa[4];
                mb_load_a(pa, Ps, LP, 16 * r, kk);
                mb_load_a(sa, dSs, LP, 16 * r, kk);
#pragma unroll
                for (int d = 0; d < ND; d += 2) {
                    uint32_t ob[4], qb[4];
                    mb_load_b_kn(ob, dOs, LD, kk, DC * c + 8 * d);
                    mb_load_b_kn(qb, Qs, LD, kk, DC * c + 8 * d);
                    mb_mma(dV[d], pa, ob);
                    mb_mma(dV[d + 1], pa, ob + 2);
                    mb_mma(dK[d], sa, qb);
                    mb_mma(dK[d + 1], sa, qb + 2);
                }
            }
        }
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

typedef void (*fb_kernel)(struct fa_args);

static lt_status fb_launch(struct cu_ctx *c, fb_kernel k, dim3 grid, int threads, size_t shared,
                           const struct fa_args &a, const char *name)
{
    lt_status st =
        cu_check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared),
                 "raising flash_attn_bf16's shared memory");
    if (st != LT_OK)
        return st;
    k<<<grid, threads, shared, c->stream>>>(a);
    return cu_launched(name);
}

template <int DP>
static lt_status fb_run(struct cu_ctx *c, const struct lt_tensor *node, const struct fa_args &a)
{
    using F = fb_dims<DP>;
    const dim3 queries((unsigned)((a.T + FB_BQ - 1) / FB_BQ), (unsigned)a.H, (unsigned)a.S);
    if (node->op == LT_OP_FLASH_ATTN)
        return fb_launch(c, fb_forward_kernel<DP, false>, queries, 128, F::FWD, a,
                         "flash_attn_bf16");
    lt_status st =
        fb_launch(c, fb_forward_kernel<DP, true>, queries, 128, F::FWD, a, "flash_attn_bf16_stats");
    if (st == LT_OK)
        st = fb_launch(c, fb_dq_kernel<DP>, queries, 128, F::DQ, a, "flash_attn_bf16_dq");
    if (st == LT_OK && a.nk > 0)
        st = fb_launch(
            c, fb_dkv_kernel<DP>,
            dim3((unsigned)((a.nk + FB_BKV - 1) / FB_BKV), (unsigned)a.Hkv, (unsigned)a.S),
            32 * F::DKV_WARPS, F::DKV, a, "flash_attn_bf16_dkv");
    return st;
}

lt_status cu_flash_attn_bf16(struct cu_ctx *c, const struct lt_tensor *node, struct fa_args a)
{
    if (a.D <= 64)
        return fb_run<64>(c, node, a);
    if (a.D <= 128)
        return fb_run<128>(c, node, a);
    return fb_run<256>(c, node, a);
}
