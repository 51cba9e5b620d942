/* flash_attn.cu: FLASH_ATTN and FLASH_ATTN_BACK on the device (src/ops/flash_attn.c says
 * what they compute), in tiles: no T x T tensor exists, in memory or in scratch.
 *
 * Forward, a block per (query tile of BQ rows, query head, sequence), 256 threads: the
 * tile's queries stay in shared memory; the keys go by in tiles of FA_BK, each S = scale Q
 * K^T (tensor cores, delta_net_mma.h's cb_mma), the mask and the dropped keys, then the
 * online softmax a row (4 or more lanes a row: the running maximum m, the running sum l,
 * the factor alpha = e^(m_old - m_new) that rescales the row's output so far), then the
 * values' tile over the keys' and O = alpha O + P V. At the end O / l, and zeros for a row
 * with every key dropped (SOFT_MAX's rule). The STATS instance runs the same loop without
 * the values and writes each row's log-sum-exp (m + log l, -inf for a row all dropped) and
 * D = do . o into scratch, for the backward.
 *
 * Backward, in three kernels on one plan of square tiles of B rows (B = 64, 32 or 16, the
 * largest whose buffers fit): the STATS pass above; dq, a block per (query tile, query head,
 * sequence), over the key tiles: P = e^(S - lse), dP = do V^T, dS = P o (dP - D),
 * dq += scale dS K; dk and dv, a block per (key tile, key head, sequence), over the query
 * heads of the group and the query tiles that reach the tile: dv += P^T do, dk += scale
 * dS^T q. Each gradient has one block owning each of its rows, so nothing is added by
 * atomics and the sums' order is fixed.
 *
 * Products: in three TF32 products each (about F32's precision) for a node of
 * LT_FLASH_ATTN_PREC_F32, one for LT_FLASH_ATTN_PREC_TF32 (training on a device, whose
 * other products round to BF16). The exponentials, the maxima and the sums are F32. So a
 * result matches the CPU's (double sums) to float rounding in F32 mode.
 *
 * Limits (the one predicate, fa_plan_init, refuses past them, and the CPU takes the node):
 * D up to 256 (padded to a multiple of 16), a grid of at most 2^31 - 1 blocks. */
#include <math.h>
#include <stdio.h>

#include "backend/cuda/delta_net_mma.h"
#include "backend/cuda/flash_attn_impl.h"
#include "lathe/ops.h"

static const enum lt_op flash_attn_ops[] = {LT_OP_FLASH_ATTN, LT_OP_FLASH_ATTN_BACK};

/* sources: FLASH_ATTN's (FA_) and FLASH_ATTN_BACK's (FB_), one enum so they compare */
enum { FA_Q = 0, FA_K, FA_V, FA_MASK, FB_DO = 0, FB_Q, FB_K, FB_V, FB_O, FB_MASK };

#define FA_THREADS 256
#define FA_BK 64 /* the forward's key tile */
#define FA_MAX_D 256
#define FA_MAX_SHARED (226u << 10)

/* the shape of a node and its tiles */
struct fa_plan {
    int64_t D, H, Hkv, T, nk, S;
    int dp; /* D rounded up to 16 */
    int ld; /* dp + 4: rows of q, k, v, o, do tiles in shared memory */
    int bq; /* forward: query rows a block (64, 32 or 16) */
    int b;  /* backward: rows of each square tile (64, 32 or 16) */
    size_t shared_fwd, shared_stats, shared_dq, shared_dkv;
    int64_t q_tiles, bq_tiles, bk_tiles; /* ceil(T / bq), ceil(T / b), ceil(nk / b) */
};

/* the vectors of `rows`, then a 16 x 16 tile a warp (unread since a39b620; still counted,
 * since taking them out changes the plan's tile choices, which wants a device run first, as
 * delta_net_plan.c's wy_tail had when it dropped its own) */
static size_t fa_tail(int rows)
{
    return sizeof(float) * (size_t)(4 * rows + 8 * 256);
}

/* forward: Q [bq][ld], KV [FA_BK][ld], O [bq][ld] (not in STATS); S [bq][FA_BK + 4]; m, l,
 * alpha (and one more) [bq]; the warps' tiles */
static size_t fa_shared_fwd(int bq, int ld, bool stats)
{
    return sizeof(float) * (size_t)(((stats ? 1 : 2) * bq + FA_BK) * ld + bq * (FA_BK + 4)) +
           fa_tail(bq);
}
/* dq: Q, dO, dQ, K, V [b][ld]; S, dP [b][b + 4] */
static size_t fa_shared_dq(int b, int ld)
{
    return sizeof(float) * (size_t)(5 * b * ld + 2 * b * (b + 4)) + fa_tail(b);
}
/* dk, dv: K, V, dK, dV, Q, dO [b][ld]; S, dP [b][b + 4] */
static size_t fa_shared_dkv(int b, int ld)
{
    return sizeof(float) * (size_t)(6 * b * ld + 2 * b * (b + 4)) + fa_tail(b);
}

static bool fa_plan_init(struct fa_plan *p, const struct lt_tensor *q, const struct lt_tensor *k,
                         char *reason, size_t reason_size)
{
    p->D = q->ne[0], p->H = q->ne[1], p->T = q->ne[2], p->S = q->ne[3];
    p->Hkv = k->ne[1], p->nk = k->ne[2];
    if (p->D > FA_MAX_D) {
        snprintf(reason, reason_size, "head dim %lld is over the kernels' %d", (long long)p->D,
                 FA_MAX_D);
        return false;
    }
    p->dp = (int)((p->D + 15) / 16 * 16);
    p->ld = p->dp + 4;
    p->bq = 64;
    while (p->bq > 16 && fa_shared_fwd(p->bq, p->ld, false) > FA_MAX_SHARED)
        p->bq /= 2;
    p->b = 64;
    while (p->b > 16 && (fa_shared_dq(p->b, p->ld) > FA_MAX_SHARED ||
                         fa_shared_dkv(p->b, p->ld) > FA_MAX_SHARED))
        p->b /= 2;
    p->shared_fwd = fa_shared_fwd(p->bq, p->ld, false);
    p->shared_stats = fa_shared_fwd(p->b, p->ld, true);
    p->shared_dq = fa_shared_dq(p->b, p->ld);
    p->shared_dkv = fa_shared_dkv(p->b, p->ld);
    p->q_tiles = (p->T + p->bq - 1) / p->bq;
    p->bq_tiles = (p->T + p->b - 1) / p->b;
    p->bk_tiles = (p->nk + p->b - 1) / p->b;
    if (p->shared_fwd > FA_MAX_SHARED || p->shared_dkv > FA_MAX_SHARED ||
        p->shared_dq > FA_MAX_SHARED) {
        snprintf(reason, reason_size, "head dim %lld needs more shared memory than %u",
                 (long long)p->D, FA_MAX_SHARED);
        return false;
    }
    if (p->T > 0x7fffff00 || p->nk > 0x7fffff00) {
        snprintf(reason, reason_size, "%lld queries or %lld keys: past the kernels' 32-bit rows",
                 (long long)p->T, (long long)p->nk);
        return false;
    }
    if (p->H > 65535 || p->S > 65535) {
        snprintf(reason, reason_size, "%lld heads or %lld sequences: over a grid's 65535",
                 (long long)p->H, (long long)p->S);
        return false;
    }
    const int64_t most = p->H * p->S * (p->q_tiles > p->bq_tiles ? p->q_tiles : p->bq_tiles);
    if (most > 0x7fffffff || p->Hkv * p->S * p->bk_tiles > 0x7fffffff) {
        snprintf(reason, reason_size, "too many tiles for one grid");
        return false;
    }
    return true;
}

/* the node's q and k (either op) */
static const struct lt_tensor *fa_q(const struct lt_tensor *n)
{
    return n->src[n->op == LT_OP_FLASH_ATTN ? FA_Q : FB_Q];
}
static const struct lt_tensor *fa_k(const struct lt_tensor *n)
{
    return n->src[n->op == LT_OP_FLASH_ATTN ? FA_K : FB_K];
}
static const struct lt_tensor *fa_mask(const struct lt_tensor *n)
{
    return n->src[n->op == LT_OP_FLASH_ATTN ? FA_MASK : FB_MASK];
}

bool cu_flash_attn_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const bool fwd = node->op == LT_OP_FLASH_ATTN;
    if (!fwd && node->op != LT_OP_FLASH_ATTN_BACK) {
        snprintf(reason, reason_size, "%s is not FLASH_ATTN", lt_op_name(node->op));
        return false;
    }
    const int q = fwd ? FA_Q : FB_Q;
    for (int i = q; i < q + 3; i++)
        if (!cu_check_source(node, i, CU_TYPES_FLOAT, reason, reason_size))
            return false;
    if (!fwd && (!cu_check_source(node, FB_DO, CU_TYPES_F32, reason, reason_size) ||
                 !cu_check_source(node, FB_O, CU_TYPES_F32, reason, reason_size)))
        return false;
    const struct lt_tensor *mask = fa_mask(node);
    if (mask && !cu_check_source(node, fwd ? FA_MASK : FB_MASK, CU_TYPES_F32 | CU_TYPES_I32, reason,
                                 reason_size))
        return false;
    if (mask && mask->type == LT_TYPE_I32 &&
        (!lt_is_contiguous(mask) || lt_nelements(mask) != fa_q(node)->ne[2] * fa_q(node)->ne[3])) {
        snprintf(reason, reason_size, "the positions are not contiguous i32 [T * S]");
        return false;
    }
    struct fa_plan p;
    if (!fa_plan_init(&p, fa_q(node), fa_k(node), reason, reason_size))
        return false;
    return cu_check_result_f32(node, reason, reason_size);
}

/* ---- device ---- */

/* the tile's rows r < rows of X [D, heads, n, S] at (head, first row n0) into dst [rows][ld]
 * (zeros past n and past D) */
static __device__ void fa_load_rows(float *dst, int ld, const struct cu_t &x, int64_t head,
                                    int64_t n0, int64_t n, int64_t s, int rows, int dp, int64_t D)
{
    for (int e = threadIdx.x; e < rows * dp; e += blockDim.x) {
        const int r = e / dp, i = e % dp;
        dst[r * ld + i] = n0 + r < n && i < D ? cu_get(x, i, head, n0 + r, s) : 0.0f;
    }
}

/* S [rows][ls] (scores, scaled) -> the mask added and the dropped keys at -inf, for queries
 * t0.. and keys j0.. */
static __device__ void fa_mask_scores(const struct fa_args &a, float *Sm, int ls, int rows,
                                      int cols, int64_t t0, int64_t j0, int64_t h, int64_t s)
{
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
        const int r = e / cols, c = e % cols;
        const int64_t t = t0 + r, j = j0 + c;
        float z = -INFINITY;
        if (fa_key_in(a, t, j, s)) {
            z = Sm[r * ls + c];
            if (a.has_mask)
                z += cu_getf(a.mask, j, t, h % a.mask.ne[2], s % a.mask.ne[3]);
        }
        Sm[r * ls + c] = z;
    }
}

/* Forward (STATS: the log-sum-exp and D only). Block (tile, h, s): tile = blockIdx.x. */
template <bool TF1, bool STATS>
static __global__ void __launch_bounds__(FA_THREADS, 1) fa_forward_kernel(struct fa_args a)
{
    extern __shared__ __align__(128) float sh[];
    const int R = a.rows, ld = a.ld, ls = FA_BK + 4, dp = a.dp;
    const int64_t tile = blockIdx.x, h = blockIdx.y, s = blockIdx.z, hk = h / (a.H / a.Hkv),
                  t0 = tile * R;
    float *Q = sh, *KV = Q + R * ld, *O = KV + FA_BK * ld; /* O: absent in STATS */
    float *Sm = STATS ? O : O + R * ld, *m = Sm + R * ls, *l = m + R, *al = l + R;
    fa_load_rows(Q, ld, a.q, h, t0, a.T, s, R, dp, a.D);
    for (int e = threadIdx.x; e < R; e += blockDim.x)
        m[e] = -INFINITY, l[e] = 0.0f;
    if (!STATS)
        for (int e = threadIdx.x; e < R * dp; e += blockDim.x)
            O[e / dp * ld + e % dp] = 0.0f;
    const int64_t j_end = fa_key_end(a, t0, R);
    const int lpr = FA_THREADS / R; /* lanes a row, consecutive, a power of two */
    for (int64_t j0 = 0; j0 < j_end; j0 += FA_BK) {
        __syncthreads(); /* the last tile's P V has read KV and S */
        fa_load_rows(KV, ld, a.k, hk, j0, a.nk, s, FA_BK, dp, a.D);
        __syncthreads();
        cb_mma<wmma::row_major, wmma::col_major, TF1>(Sm, ls, Q, ld, KV, ld, R, FA_BK, dp, a.scale,
                                                      false, NULL, R, FA_BK);
        __syncthreads();
        fa_mask_scores(a, Sm, ls, R, FA_BK, t0, j0, h, s);
        __syncthreads();
        if (!STATS)
            fa_load_rows(KV, ld, a.v, hk, j0, a.nk, s, FA_BK, dp, a.D);
        {
            /* the online softmax: lpr lanes a row */
            const int r = threadIdx.x / lpr, q = threadIdx.x % lpr;
            float mx = -INFINITY;
            for (int c = q; c < FA_BK; c += lpr)
                mx = fmaxf(mx, Sm[r * ls + c]);
            for (int o = lpr / 2; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_old = m[r], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int c = q; c < FA_BK; c += lpr) {
                const float z = Sm[r * ls + c];
                const float p = z == -INFINITY ? 0.0f : expf(z - m_new);
                Sm[r * ls + c] = p;
                sum += p;
            }
            for (int o = lpr / 2; o > 0; o >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (q == 0) {
                const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                l[r] = l[r] * alpha + sum;
                m[r] = m_new;
                al[r] = alpha;
            }
        }
        if (STATS)
            continue;
        __syncthreads();
        for (int e = threadIdx.x; e < R * dp; e += blockDim.x)
            O[e / dp * ld + e % dp] *= al[e / dp];
        __syncthreads();
        cb_mma<wmma::row_major, wmma::row_major, TF1>(O, ld, Sm, ls, KV, ld, R, dp, FA_BK, 1.0f,
                                                      true, NULL, R, dp);
    }
    __syncthreads();
    if (STATS) {
        /* lse = m + log l, and D = do . o (lpr lanes a row) */
        const int r = threadIdx.x / lpr, q = threadIdx.x % lpr;
        const int64_t t = t0 + r;
        float d = 0.0f;
        if (t < a.T)
            for (int64_t i = q; i < a.D; i += lpr)
                d += cu_getf(a.gdo, i, h, t, s) * cu_getf(a.o, i, h, t, s);
        for (int o = lpr / 2; o > 0; o >>= 1)
            d += __shfl_xor_sync(0xffffffffu, d, o);
        if (q == 0 && t < a.T) {
            const int64_t row = (s * a.H + h) * a.T + t;
            a.lse[row] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
            a.dd[row] = d;
        }
        return;
    }
    float *o = a.out;
    for (int e = threadIdx.x; e < R * (int)a.D; e += blockDim.x) {
        const int r = e / (int)a.D, i = e % (int)a.D;
        const int64_t t = t0 + r;
        if (t < a.T)
            o[((s * a.T + t) * a.H + h) * a.D + i] = l[r] > 0.0f ? O[r * ld + i] / l[r] : 0.0f;
    }
}

/* P = e^(S - lse) over S [b][ls] (scores with the mask and -inf for dropped keys) of
 * queries t0.. of head h: zeros for dropped keys and rows all dropped */
static __device__ void fa_probs(const struct fa_args &a, float *Sm, int ls, int b, int64_t t0,
                                int64_t h, int64_t s)
{
    for (int e = threadIdx.x; e < b * b; e += blockDim.x) {
        const int r = e / b, c = e % b;
        const int64_t t = t0 + r;
        const float z = Sm[r * ls + c], lse = t < a.T ? a.lse[(s * a.H + h) * a.T + t] : -INFINITY;
        Sm[r * ls + c] = z == -INFINITY || lse == -INFINITY ? 0.0f : expf(z - lse);
    }
}

/* dS = P o (dP - D) in dP's place */
static __device__ void fa_dscores(const struct fa_args &a, const float *Pm, float *dP, int ls,
                                  int b, int64_t t0, int64_t h, int64_t s)
{
    for (int e = threadIdx.x; e < b * b; e += blockDim.x) {
        const int r = e / b, c = e % b;
        const int64_t t = t0 + r;
        const float d = t < a.T ? a.dd[(s * a.H + h) * a.T + t] : 0.0f;
        dP[r * ls + c] = Pm[r * ls + c] * (dP[r * ls + c] - d);
    }
}

/* One (query tile, key tile) of the backward, the block together: from the tiles Q, dO
 * (rows t0..) and K, V (rows j0..) in shared memory, P = e^(scale Q K^T + mask - lse) into
 * Sm and dS = P o (dO V^T - D) into dP, both [b][b + 4]; the caller synchronises before
 * and reads them after a barrier */
template <bool TF1>
static __device__ void fa_tile_back(const struct fa_args &a, const float *Q, const float *dO,
                                    const float *K, const float *V, float *Sm, float *dP,
                                    int64_t t0, int64_t j0, int64_t h, int64_t s)
{
    const int B = a.rows, ld = a.ld, ls = B + 4, dp = a.dp;
    cb_mma<wmma::row_major, wmma::col_major, TF1>(Sm, ls, Q, ld, K, ld, B, B, dp, a.scale, false,
                                                  NULL, B, B);
    cb_mma<wmma::row_major, wmma::col_major, TF1>(dP, ls, dO, ld, V, ld, B, B, dp, 1.0f, false,
                                                  NULL, B, B);
    __syncthreads();
    fa_mask_scores(a, Sm, ls, B, B, t0, j0, h, s);
    __syncthreads();
    fa_probs(a, Sm, ls, B, t0, h, s);
    __syncthreads();
    fa_dscores(a, Sm, dP, ls, B, t0, h, s);
    __syncthreads();
}

/* dq: block (query tile, h, s) */
template <bool TF1>
static __global__ void __launch_bounds__(FA_THREADS, 1) fa_dq_kernel(struct fa_args a)
{
    extern __shared__ __align__(128) float sh[];
    const int B = a.rows, ld = a.ld, ls = B + 4, dp = a.dp;
    const int64_t h = blockIdx.y, s = blockIdx.z, hk = h / (a.H / a.Hkv), t0 = blockIdx.x * B;
    float *Q = sh, *dO = Q + B * ld, *dQ = dO + B * ld, *K = dQ + B * ld, *V = K + B * ld,
          *Sm = V + B * ld, *dP = Sm + B * ls;
    fa_load_rows(Q, ld, a.q, h, t0, a.T, s, B, dp, a.D);
    fa_load_rows(dO, ld, a.gdo, h, t0, a.T, s, B, dp, a.D);
    for (int e = threadIdx.x; e < B * dp; e += blockDim.x)
        dQ[e / dp * ld + e % dp] = 0.0f;
    const int64_t j_end = fa_key_end(a, t0, B);
    for (int64_t j0 = 0; j0 < j_end; j0 += B) {
        __syncthreads();
        fa_load_rows(K, ld, a.k, hk, j0, a.nk, s, B, dp, a.D);
        fa_load_rows(V, ld, a.v, hk, j0, a.nk, s, B, dp, a.D);
        __syncthreads();
        fa_tile_back<TF1>(a, Q, dO, K, V, Sm, dP, t0, j0, h, s);
        cb_mma<wmma::row_major, wmma::row_major, TF1>(dQ, ld, dP, ls, K, ld, B, dp, B, a.scale,
                                                      true, NULL, B, dp);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < B * (int)a.D; e += blockDim.x) {
        const int r = e / (int)a.D, i = e % (int)a.D;
        const int64_t t = t0 + r;
        if (t < a.T)
            a.out[((s * a.T + t) * a.H + h) * a.D + i] = dQ[r * ld + i];
    }
}

/* dk, dv: block (key tile, hk, s), over the group's query heads and the query tiles that
 * reach the key tile */
template <bool TF1>
static __global__ void __launch_bounds__(FA_THREADS, 1) fa_dkv_kernel(struct fa_args a)
{
    extern __shared__ __align__(128) float sh[];
    const int B = a.rows, ld = a.ld, ls = B + 4, dp = a.dp;
    const int64_t hk = blockIdx.y, s = blockIdx.z, j0 = blockIdx.x * (int64_t)B, G = a.H / a.Hkv;
    float *K = sh, *V = K + B * ld, *dK = V + B * ld, *dV = dK + B * ld, *Q = dV + B * ld,
          *dO = Q + B * ld, *Sm = dO + B * ld, *dP = Sm + B * ls;
    fa_load_rows(K, ld, a.k, hk, j0, a.nk, s, B, dp, a.D);
    fa_load_rows(V, ld, a.v, hk, j0, a.nk, s, B, dp, a.D);
    for (int e = threadIdx.x; e < B * dp; e += blockDim.x)
        dK[e / dp * ld + e % dp] = dV[e / dp * ld + e % dp] = 0.0f;
    /* causal: query t reaches key j0 when j0 <= t + (nk - T) */
    int64_t t_first = a.causal ? j0 - (a.nk - a.T) : 0;
    t_first = t_first < 0 ? 0 : t_first / B * B;
    for (int64_t h = hk * G; h < (hk + 1) * G; h++)
        for (int64_t t0 = t_first; t0 < a.T; t0 += B) {
            __syncthreads();
            fa_load_rows(Q, ld, a.q, h, t0, a.T, s, B, dp, a.D);
            fa_load_rows(dO, ld, a.gdo, h, t0, a.T, s, B, dp, a.D);
            __syncthreads();
            fa_tile_back<TF1>(a, Q, dO, K, V, Sm, dP, t0, j0, h, s);
            /* dv += P^T do, dk += scale dS^T q: the tiles read as column-major */
            cb_mma<wmma::col_major, wmma::row_major, TF1>(dV, ld, Sm, ls, dO, ld, B, dp, B, 1.0f,
                                                          true, NULL, B, dp);
            cb_mma<wmma::col_major, wmma::row_major, TF1>(dK, ld, dP, ls, Q, ld, B, dp, B, a.scale,
                                                          true, NULL, B, dp);
        }
    __syncthreads();
    const int64_t n_q = a.D * a.H * a.T * a.S, n_k = a.D * a.Hkv * a.nk * a.S;
    for (int e = threadIdx.x; e < B * (int)a.D; e += blockDim.x) {
        const int r = e / (int)a.D, i = e % (int)a.D;
        const int64_t j = j0 + r;
        if (j < a.nk) {
            const int64_t at = ((s * a.nk + j) * a.Hkv + hk) * a.D + i;
            a.out[n_q + at] = dK[r * ld + i];
            a.out[n_q + n_k + at] = dV[r * ld + i];
        }
    }
}

/* ---- host ---- */

/* the backward's lse and D (2 S H T floats), rounded up to 256 bytes; then, at
 * LT_FLASH_ATTN_PREC_BF16, the staged BF16 sources */
static size_t fa_stats_bytes(const struct lt_tensor *node, const struct fa_plan &p)
{
    const size_t n = 2 * sizeof(float) * (size_t)(p.S * p.H * p.T);
    return node->op == LT_OP_FLASH_ATTN_BACK ? (n + 255) / 256 * 256 : 0;
}

static size_t fa_scratch_bytes(const struct lt_tensor *node, const struct fa_plan &p)
{
    const bool bf16 = lt_get_param_i32(node, 2) == LT_FLASH_ATTN_PREC_BF16;
    return fa_stats_bytes(node, p) +
           (bf16 ? cu_flash_attn_bf16_staged_bytes(p.D, p.H, p.Hkv, p.T, p.nk, p.S,
                                                   node->op == LT_OP_FLASH_ATTN_BACK)
                 : 0);
}

static void fa_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    struct fa_plan p;
    char reason[CU_REASON_MAX];
    if (fa_plan_init(&p, fa_q(node), fa_k(node), reason, sizeof(reason)))
        need[CU_SCRATCH_WORK] = fa_scratch_bytes(node, p);
}

static struct fa_args fa_args_of(const struct lt_tensor *node, const struct fa_plan &p)
{
    const bool fwd = node->op == LT_OP_FLASH_ATTN;
    const int q = fwd ? FA_Q : FB_Q;
    struct fa_args a = {};
    a.q = cu_view(node->src[q]);
    a.k = cu_view(node->src[q + 1]);
    a.v = cu_view(node->src[q + 2]);
    const struct lt_tensor *mask = fa_mask(node);
    a.has_mask = mask && mask->type == LT_TYPE_F32;
    a.pos = mask && mask->type == LT_TYPE_I32 ? (const int32_t *)mask->data : NULL;
    a.mask = cu_view(a.has_mask ? mask : node->src[q]);
    if (!fwd) {
        a.gdo = cu_view(node->src[FB_DO]);
        a.o = cu_view(node->src[FB_O]);
    }
    a.causal = lt_get_param_i32(node, 1) != 0;
    a.scale = lt_get_param_f32(node, 0);
    a.D = p.D, a.H = p.H, a.Hkv = p.Hkv, a.T = p.T, a.nk = p.nk, a.S = p.S;
    a.dp = p.dp, a.ld = p.ld;
    a.out = (float *)node->data;
    return a;
}

typedef void (*fa_kernel)(struct fa_args);

static lt_status fa_launch(struct cu_ctx *c, fa_kernel k, dim3 grid, size_t shared,
                           const struct fa_args &a, const char *name)
{
    lt_status st =
        cu_check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared),
                 "raising flash_attn's shared memory");
    if (st != LT_OK)
        return st;
    k<<<grid, FA_THREADS, shared, c->stream>>>(a);
    return cu_launched(name);
}

lt_status cu_flash_attn_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_flash_attn_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    struct fa_plan p;
    fa_plan_init(&p, fa_q(node), fa_k(node), reason, sizeof(reason));
    const bool tf1 = lt_get_param_i32(node, 2) == LT_FLASH_ATTN_PREC_TF32;
    struct fa_args a = fa_args_of(node, p);
    if (p.D == 0 || p.H == 0 || p.T == 0 || p.S == 0) {
        if (node->op == LT_OP_FLASH_ATTN_BACK && lt_nelements(node) > 0)
            return cu_check(cudaMemsetAsync(node->data, 0, lt_nbytes(node), c->stream),
                            "zeroing flash_attn_back's result");
        return LT_OK;
    }
    void *scratch = NULL;
    const size_t need = fa_scratch_bytes(node, p);
    if (need) {
        lt_status st = cu_scratch(c, CU_SCRATCH_WORK, need, &scratch);
        if (st != LT_OK)
            return st;
    }
    if (lt_get_param_i32(node, 2) == LT_FLASH_ATTN_PREC_BF16) {
        if (node->op == LT_OP_FLASH_ATTN_BACK) {
            a.lse = (float *)scratch;
            a.dd = a.lse + p.S * p.H * p.T;
        }
        return cu_flash_attn_bf16(c, node, a, (char *)scratch + fa_stats_bytes(node, p));
    }
    if (node->op == LT_OP_FLASH_ATTN) {
        a.rows = p.bq;
        return fa_launch(c, tf1 ? fa_forward_kernel<true, false> : fa_forward_kernel<false, false>,
                         dim3((unsigned)p.q_tiles, (unsigned)p.H, (unsigned)p.S), p.shared_fwd, a,
                         "flash_attn");
    }
    a.lse = (float *)scratch;
    a.dd = a.lse + p.S * p.H * p.T;
    a.rows = p.b;
    lt_status st =
        fa_launch(c, tf1 ? fa_forward_kernel<true, true> : fa_forward_kernel<false, true>,
                  dim3((unsigned)p.bq_tiles, (unsigned)p.H, (unsigned)p.S), p.shared_stats, a,
                  "flash_attn_back_stats");
    if (st == LT_OK)
        st = fa_launch(c, tf1 ? fa_dq_kernel<true> : fa_dq_kernel<false>,
                       dim3((unsigned)p.bq_tiles, (unsigned)p.H, (unsigned)p.S), p.shared_dq, a,
                       "flash_attn_back_dq");
    if (st == LT_OK && p.nk > 0)
        st = fa_launch(c, tf1 ? fa_dkv_kernel<true> : fa_dkv_kernel<false>,
                       dim3((unsigned)p.bk_tiles, (unsigned)p.Hkv, (unsigned)p.S), p.shared_dkv, a,
                       "flash_attn_back_dkv");
    return st;
}

const struct cu_family cu_family_flash_attn = {
    "flash_attn",          flash_attn_ops, CU_COUNT(flash_attn_ops), cu_flash_attn_supported,
    cu_flash_attn_compute, fa_scratch};
