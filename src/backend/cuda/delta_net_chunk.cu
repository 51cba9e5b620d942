/* delta_net_chunk.cu: the chunked CUDA kernels of the gated delta rule: DELTA_NET_BACK by
 * default, DELTA_NET when a node asks (delta_net.cu chooses, with the one predicate).
 *
 * Chunks of 64 tokens in the WY/UT form of src/ops/delta_net.c, whose chunked CPU backward
 * is the step-by-step specification. A block takes 16 or 32 value columns of one (value
 * head, sequence) and walks its chunks: the chunk's products (K K^T, Q K^T, K S, P U, their
 * adjoints) on tensor cores in three TF32 products a tile (F32-level precision), the
 * triangular solves by warp-synchronous substitution, the gates in log space (every
 * exponent G_r - G_s with s <= r). The backward keeps the state at each chunk start in
 * scratch and recomputes each chunk's quantities from it, last chunk first; its partial
 * dq, dk, dg, dbeta go through delta_net.cu's reduction.
 *
 * Measured on the H200 (LATHE_CUDA_PROFILE, 16 x 512 tokens of Qwen3.5-0.8B, a full
 * fine-tune): DELTA_NET_BACK ~52 ms a node with the per-token kernel, 20.5 with the first
 * chunked one (products on CUDA cores), 21.4 with the products on tensor cores, 16.1 once
 * global reads were batched and the solves were column-oriented; the row-wise fills came
 * after that profile (the whole step went from 9540 to 10244 tokens/s with them). What
 * bounds it now, by Nsight Compute: instruction issue, at 2 warps a scheduler (one 200 KiB
 * block an SM) with most stalls on fixed-latency dependencies; the three-product TF32 split
 * is about half the instructions.
 *
 * DELTA_NET_BACK now runs delta_net_wy.cu's kernels by default (the work split over chunks
 * instead of walked in one block); this kernel stays for shapes that plan refuses and for
 * comparison (LATHE_DN_BACK=v1). The products and fills are in delta_net_mma.h. */
#include <math.h>
#include <stdio.h>

#include "backend/cuda/delta_net_impl.h"
#include "backend/cuda/delta_net_mma.h"
#include "lathe/ops.h"

/* one block's shared memory (dn_cback_plan: K, Q [C][ldk]; S0, dS [skp][ldv]; W, U, Do,
 * dU, Y [C][ldv]; Ab, P, M [C][ldc]; vectors of C; the warps' tiles) and where it stands */
struct cb_block {
    float *K, *Q, *S0, *dS, *W, *U, *Do, *dU, *Y, *Ab, *P, *M;
    float *G, *eG, *B, *El, *dgam, *dgc, *dB;
    int skp, cv, lk, lv, lc;
    int64_t h, hk, b, j0; /* value head, key head, sequence, first column */
};

#define CB_C DN_CHUNK
static_assert(DN_CBACK_THREADS == 4 * DN_CHUNK, "the row sums take 4 lanes a chunk row");

static __device__ bool cb_col_ok(const struct cb_block &w, const struct dn_red &L, int jj)
{
    return w.j0 + jj < L.sv;
}

/* X = (I + diag(B) Ab)^-1 X, or (transposed) (I + diag(B) Ab)^-T X, in place on the
 * block's columns of X [C][ldv] (Ab strictly lower, zero elsewhere). A warp takes cv / 8
 * columns at once, lane l holding rows l and l + 32 of each in registers, and walks the
 * pivots q in order (backward for the transpose): row q is final, so it is broadcast and
 * every other row takes its multiple away. A step is a shuffle and two multiply-adds a
 * column, where the first kernels summed each row over 8 lanes (three shuffles deep) with
 * a __syncwarp between rows. */
template <int CPW>
static __device__ void cb_solve_cols(const struct cb_block &w, float *X, bool transposed)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, lc = w.lc, lv = w.lv;
    const int n_warps = DN_CBACK_THREADS / 32;
    float u0[CPW], u1[CPW];
#pragma unroll
    for (int k = 0; k < CPW; k++) {
        const int j = warp + k * n_warps;
        u0[k] = X[lane * lv + j];
        u1[k] = X[(lane + 32) * lv + j];
    }
    const float b0 = w.B[lane], b1 = w.B[lane + 32];
    for (int step = 0; step < CB_C; step++) {
        const int q = transposed ? CB_C - 1 - step : step;
        /* forward: row r takes B_r Ab[r][q] u_q; transposed: row r takes B_q Ab[q][r] u_q */
        const float a0 = transposed ? w.B[q] * w.Ab[q * lc + lane] : b0 * w.Ab[lane * lc + q];
        const float a1 =
            transposed ? w.B[q] * w.Ab[q * lc + lane + 32] : b1 * w.Ab[(lane + 32) * lc + q];
        cb_pivot<CPW>(u0, u1, a0, a1, q);
    }
#pragma unroll
    for (int k = 0; k < CPW; k++) {
        const int j = warp + k * n_warps;
        X[lane * lv + j] = u0[k];
        X[(lane + 32) * lv + j] = u1[k];
    }
}

static __device__ void cb_solve(const struct cb_block &w, float *X, bool transposed)
{
    static_assert(DN_CHUNK == 64 && DN_CBACK_THREADS == 256, "two rows a lane, 8 warps");
    if (w.cv == 32)
        cb_solve_cols<4>(w, X, transposed);
    else
        cb_solve_cols<2>(w, X, transposed);
}

/* The chunk [t0, t0 + n) from the state in w.S0: K, Q (rows past n zero), G, e^G, B,
 * e^{G_last - G} (El), W = K S0, Ab, P, and U = (I + diag(B) Ab)^-1 diag(B) (V - e^G W). */
static __device__ void cb_prepare(const struct cb_block &w, const struct dn_srcs &s,
                                  const struct dn_red &L, int64_t t0, int n)
{
    const int C = CB_C, lk = w.lk, lv = w.lv, lc = w.lc;
    const int skp = w.skp, cv = w.cv;
    for (int which = 0; which < 2; which++) {
        const struct cu_t &src = which ? s.q : s.k;
        float *dst = which ? w.Q : w.K;
        cb_fill(
            C, skp,
            [&](int r, int i) {
                return r < n && i < L.sk ? cu_getf(src, i, w.hk, t0 + r, w.b) : 0.0f;
            },
            [&](int r, int i, float x) { dst[r * lk + i] = x; });
    }
    cb_fill(
        C, cv,
        [&](int r, int jj) {
            return r < n && cb_col_ok(w, L, jj) ? cu_getf(s.v, w.j0 + jj, w.h, t0 + r, w.b) : 0.0f;
        },
        [&](int r, int jj, float x) { w.U[r * lv + jj] = x; });
    if (threadIdx.x < C) { /* G: the inclusive sum of g, each warp's 32 by a shuffle scan */
        const int r = threadIdx.x;
        float x = r < n ? cu_getf(s.g, w.h, t0 + r, w.b, 0) : 0.0f;
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, x, o);
            if ((r & 31) >= o)
                x += y;
        }
        w.G[r] = x;
    }
    __syncthreads();
    if (threadIdx.x >= 32 && threadIdx.x < C)
        w.G[threadIdx.x] += w.G[31];
    __syncthreads();
    if (threadIdx.x < C) {
        const int r = threadIdx.x;
        w.eG[r] = expf(w.G[r]);
        w.El[r] = expf(w.G[C - 1] - w.G[r]);
        w.B[r] = r < n ? cu_getf(s.beta, w.h, t0 + r, w.b, 0) : 0.0f;
    }
    cb_mm(w.W, lv, w.K, lk, 1, w.S0, lv, 1, C, w.cv, w.skp, 1.0f, false);
    cb_mm(w.Ab, lc, w.K, lk, 1, w.K, 1, lk, C, C, w.skp, 1.0f, false);
    cb_mm(w.P, lc, w.Q, lk, 1, w.K, 1, lk, C, C, w.skp, 1.0f, false);
    __syncthreads();
    for (int e = threadIdx.x; e < C * w.cv; e += blockDim.x) {
        const int r = e / w.cv, jj = e % w.cv;
        w.U[r * lv + jj] = w.B[r] * (w.U[r * lv + jj] - w.eG[r] * w.W[r * lv + jj]);
    }
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        const int r = e / C, q = e % C;
        const float d = q <= r ? expf(w.G[r] - w.G[q]) : 0.0f;
        w.Ab[r * lc + q] *= q < r ? d : 0.0f;
        w.P[r * lc + q] *= d;
    }
    __syncthreads();
    cb_solve(w, w.U, false);
    __syncthreads();
}

/* S0 = e^{G_last} S0 + K^T diag(El) U */
static __device__ void cb_advance(const struct cb_block &w)
{
    const int C = CB_C, lv = w.lv;
    for (int e = threadIdx.x; e < C * w.cv; e += blockDim.x) {
        const int r = e / w.cv, jj = e % w.cv;
        w.Y[r * lv + jj] = w.El[r] * w.U[r * lv + jj];
    }
    for (int e = threadIdx.x; e < w.skp * w.cv; e += blockDim.x)
        w.S0[(e / w.cv) * lv + e % w.cv] *= w.eG[C - 1];
    __syncthreads();
    cb_mm(w.S0, lv, w.K, 1, w.lk, w.Y, lv, 1, w.skp, w.cv, C, 1.0f, true);
    __syncthreads();
}

/* Row r = threadIdx.x / 4 of X . row r of Y over the block's columns, summed over the 4
 * lanes of the row (every one gets it); the whole block calls it (DN_CBACK_THREADS = 4 C). */
static __device__ float cb_row_dot(const float *X, const float *Y, int lv, int cv)
{
    const int r = threadIdx.x / 4, l = threadIdx.x % 4;
    float x = 0.0f;
    for (int jj = l; jj < cv; jj += 4)
        x = fmaf(X[r * lv + jj], Y[r * lv + jj], x);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* The sums over row r = threadIdx.x / 4 of M o Z on columns q <= r - strict (into *row),
 * and over column r on rows q >= r + strict (into *col), 4 lanes a row; every lane of the
 * row gets them. The whole block calls it. */
static __device__ void cb_tri_sums(const float *M, const float *Z, int lc, int strict, float *row,
                                   float *col)
{
    const int r = threadIdx.x / 4, l = threadIdx.x % 4;
    float x = 0.0f, y = 0.0f;
    for (int q = l; q <= r - strict; q += 4)
        x = fmaf(M[r * lc + q], Z[r * lc + q], x);
    for (int q = r + strict + l; q < CB_C; q += 4)
        y = fmaf(M[q * lc + r], Z[q * lc + r], y);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    y += __shfl_xor_sync(0xffffffffu, y, 1);
    *row = x + __shfl_xor_sync(0xffffffffu, x, 2);
    *col = y + __shfl_xor_sync(0xffffffffu, y, 2);
}

/* The adjoint of the chunk [t0, t0 + n) after cb_prepare (src/ops/delta_net.c,
 * cback_chunk, step for step): w.dS from the gradient of the chunk's end state to that of
 * its start state; dv of the block's columns into out, the chunk's partial dq, dk, dg and
 * dbeta into the block's rows of part (mine). */
static __device__ void cb_chunk(const struct cb_block &w, const struct dn_srcs &s,
                                const struct cu_t &grad, const struct dn_red &L, float *out,
                                float *mine, double *red, int64_t t0, int n, float scale)
{
    const int C = CB_C, lk = w.lk, lv = w.lv, lc = w.lc, cv = w.cv, sk = (int)L.sk;
    const int ppt = (int)L.part_per_token;
    float *dQ = mine + t0 * ppt, *dK = dQ + sk;
    cb_fill(
        C, cv,
        [&](int r, int jj) {
            return r < n && cb_col_ok(w, L, jj) ? scale * cu_getf(grad, w.j0 + jj, w.h, t0 + r, w.b)
                                                : 0.0f;
        },
        [&](int r, int jj, float x) { w.Do[r * lv + jj] = x; });
    __syncthreads();
    /* O = P U: dU = P^T Do; dP = Do U^T on q <= r, its gate terms, then dQK */
    cb_mm(w.dU, lv, w.P, 1, lc, w.Do, lv, 1, C, cv, C, 1.0f, false);
    cb_mm(w.M, lc, w.Do, lv, 1, w.U, 1, lv, C, C, cv, 1.0f, false);
    __syncthreads();
    {
        float row, col;
        cb_tri_sums(w.M, w.P, lc, 0, &row, &col);
        if (threadIdx.x % 4 == 0)
            w.dgam[threadIdx.x / 4] = row - col;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        const int r = e / C, q = e % C;
        w.M[r * lc + q] = q <= r ? w.M[r * lc + q] * expf(w.G[r] - w.G[q]) : 0.0f;
    }
    __syncthreads();
    cb_mm(dQ, ppt, w.M, lc, 1, w.K, lk, 1, C, w.skp, C, 1.0f, false, NULL, n, sk);
    cb_mm(dK, ppt, w.M, 1, lc, w.Q, lk, 1, C, w.skp, C, 1.0f, false, NULL, n, sk);
    /* O += diag(e^G) Q S0: dQ += diag(e^G) Do S0^T; dgam_r += e^G_r Do_r . (Q S0)_r */
    cb_mm(w.Y, lv, w.Q, lk, 1, w.S0, lv, 1, C, cv, w.skp, 1.0f, false);
    __syncthreads();
    {
        const float x = cb_row_dot(w.Do, w.Y, lv, cv);
        if (threadIdx.x % 4 == 0)
            w.dgam[threadIdx.x / 4] += w.eG[threadIdx.x / 4] * x;
    }
    cb_mm(dQ, ppt, w.Do, lv, 1, w.S0, 1, lv, C, w.skp, cv, 1.0f, true, w.eG, n, sk);
    __syncthreads();
    /* the end state: dU += diag(El) K dS, dK += diag(El) U dS^T, gate terms */
    cb_mm(w.Y, lv, w.K, lk, 1, w.dS, lv, 1, C, cv, w.skp, 1.0f, false);
    __syncthreads();
    {
        const int r = threadIdx.x / 4;
        const float x = w.El[r] * cb_row_dot(w.U, w.Y, lv, cv);
        if (threadIdx.x % 4 == 0) {
            w.dgam[r] -= x;
            w.dgc[r] = x;
        }
    }
    for (int e = threadIdx.x; e < C * cv; e += blockDim.x) {
        const int r = e / cv, jj = e % cv;
        w.dU[r * lv + jj] += w.El[r] * w.Y[r * lv + jj];
    }
    cb_mm(dK, ppt, w.U, lv, 1, w.dS, 1, lv, C, w.skp, cv, 1.0f, true, w.El, n, sk);
    double ss = 0.0;
    for (int e = threadIdx.x; e < w.skp * cv; e += blockDim.x)
        ss += (double)w.dS[(e / cv) * lv + e % cv] * w.S0[(e / cv) * lv + e % cv];
    ss = cu_block_sum(ss, red); /* synchronises the block */
    if (threadIdx.x == 0) {
        float x = w.eG[C - 1] * (float)ss;
        for (int r = 0; r < C; r++)
            x += w.dgc[r];
        w.dgam[C - 1] += x;
    }
    __syncthreads();
    cb_solve(w, w.dU, true); /* dRHS = (I + diag(B) Ab)^-T dU */
    __syncthreads();
    /* dA = -dRHS U^T below the diagonal, A = diag(B) Ab: dB, gate terms, dKK into M */
    cb_mm(w.M, lc, w.dU, lv, 1, w.U, 1, lv, C, C, cv, -1.0f, false);
    __syncthreads();
    /* with M = dA: dB_r = sum_q dA_rq Ab_rq; the gates get B_r dA_rq Ab_rq at r, less at
     * q; Y takes X = V - diag(e^G) W for dB's other term */
    cb_fill(
        C, cv,
        [&](int r, int jj) {
            return r < n && cb_col_ok(w, L, jj) ? cu_getf(s.v, w.j0 + jj, w.h, t0 + r, w.b) : 0.0f;
        },
        [&](int r, int jj, float v) { w.Y[r * lv + jj] = v - w.eG[r] * w.W[r * lv + jj]; });
    {
        float db, unused; /* the column sums need B_r inside: the next pass */
        cb_tri_sums(w.M, w.Ab, lc, 1, &db, &unused);
        const int r = threadIdx.x / 4;
        if (threadIdx.x % 4 == 0) {
            w.dB[r] = db;
            w.dgam[r] += w.B[r] * db;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        const int r = e / C, q = e % C;
        w.M[r * lc + q] = q < r ? w.M[r * lc + q] * w.B[r] : 0.0f; /* B_r dA_rq */
    }
    __syncthreads();
    {
        float row, col;
        cb_tri_sums(w.M, w.Ab, lc, 1, &row, &col);
        const float x = cb_row_dot(w.dU, w.Y, lv, cv); /* dRHS_r . X_r */
        const int r = threadIdx.x / 4;
        if (threadIdx.x % 4 == 0) {
            w.dgam[r] -= col;
            w.dB[r] += x;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        const int r = e / C, q = e % C;
        w.M[r * lc + q] = q < r ? w.M[r * lc + q] * expf(w.G[r] - w.G[q]) : 0.0f;
    }
    __syncthreads();
    cb_mm(dK, ppt, w.M, lc, 1, w.K, lk, 1, C, w.skp, C, 1.0f, true, NULL, n, sk);
    cb_mm(dK, ppt, w.M, 1, lc, w.K, lk, 1, C, w.skp, C, 1.0f, true, NULL, n, sk);
    /* dX = B dRHS is dv; dW = -e^G dX (into dU) */
    float *dv = out + L.off_v;
    for (int e = threadIdx.x; e < C * cv; e += blockDim.x) {
        const int r = e / cv, jj = e % cv;
        const float x = w.B[r] * w.dU[r * lv + jj];
        if (r < n && cb_col_ok(w, L, jj))
            dv[(((w.b * L.nt) + t0 + r) * L.hv + w.h) * L.sv + w.j0 + jj] = x;
        w.dU[r * lv + jj] = -w.eG[r] * x;
    }
    __syncthreads();
    {
        const float x = cb_row_dot(w.dU, w.W, lv, cv);
        if (threadIdx.x % 4 == 0)
            w.dgam[threadIdx.x / 4] += x;
    }
    cb_mm(dK, ppt, w.dU, lv, 1, w.S0, 1, lv, C, w.skp, cv, 1.0f, true, NULL, n, sk);
    /* the start state's gradient: e^{G_last} dS + Q^T diag(e^G) Do + K^T dW */
    for (int e = threadIdx.x; e < C * cv; e += blockDim.x)
        w.Do[(e / cv) * lv + e % cv] *= w.eG[e / cv];
    for (int e = threadIdx.x; e < w.skp * cv; e += blockDim.x)
        w.dS[(e / cv) * lv + e % cv] *= w.eG[C - 1];
    __syncthreads();
    cb_mm(w.dS, lv, w.Q, 1, lk, w.Do, lv, 1, w.skp, cv, C, 1.0f, true);
    __syncthreads();
    cb_mm(w.dS, lv, w.K, 1, lk, w.dU, lv, 1, w.skp, cv, C, 1.0f, true);
    if (threadIdx.x == 0) { /* dg: the sum of dgam from each row on */
        float acc = 0.0f;
        for (int r = C - 1; r >= 0; r--) {
            acc += w.dgam[r];
            if (r < n) {
                mine[(t0 + r) * ppt + 2 * sk] = acc;
                mine[(t0 + r) * ppt + 2 * sk + 1] = w.dB[r];
            }
        }
    }
    __syncthreads();
}

/* block (b * H_v + h) * chunks + c: its place and its shared memory (sh) */
static __device__ struct cb_block cb_block_of(float *sh, const struct dn_red &L,
                                              const struct dn_cback_plan &P)
{
    const int C = CB_C;
    struct cb_block w;
    w.skp = (int)P.skp, w.cv = (int)P.cv, w.lk = (int)P.ldk, w.lv = (int)P.ldv, w.lc = (int)P.ldc;
    const int64_t c = blockIdx.x % P.chunks;
    w.h = (blockIdx.x / P.chunks) % L.hv, w.b = blockIdx.x / P.chunks / L.hv;
    w.hk = w.h % L.hk, w.j0 = c * P.cv;
    float *x = sh;
    w.K = x, x += C * w.lk;
    w.Q = x, x += C * w.lk;
    w.S0 = x, x += w.skp * w.lv;
    w.dS = x, x += w.skp * w.lv;
    float **rows[] = {&w.W, &w.U, &w.Do, &w.dU, &w.Y};
    for (int i = 0; i < 5; i++)
        *rows[i] = x, x += C * w.lv;
    w.Ab = x, x += C * w.lc;
    w.P = x, x += C * w.lc;
    w.M = x, x += C * w.lc;
    float **vecs[] = {&w.G, &w.eG, &w.B, &w.El, &w.dgam, &w.dgc, &w.dB};
    for (int i = 0; i < 7; i++)
        *vecs[i] = x, x += C;
    return w;
}

/* S0 = the state's columns of the block (zeros past S_k and S_v) */
static __device__ void cb_load_state(const struct cb_block &w, const struct cu_t &state,
                                     const struct dn_red &L)
{
    const int cv = w.cv;
    cb_fill(
        w.skp, cv,
        [&](int i, int jj) {
            return i < L.sk && cb_col_ok(w, L, jj) ? cu_getf(state, w.j0 + jj, i, w.h, w.b) : 0.0f;
        },
        [&](int i, int jj, float x) { w.S0[i * w.lv + jj] = x; });
    __syncthreads();
}

/* The chunked forward (the CPU's forward_chunk on the same chunk algebra): each chunk is
 * prepared from the state, its outputs are scale (diag(e^G) Q S0 + P U), and the state
 * advances. out is DELTA_NET's packed result. */
static __global__ void __launch_bounds__(DN_CBACK_THREADS, 1)
delta_net_cfwd_kernel(struct dn_srcs s, float *out, struct dn_red L, struct dn_cback_plan P,
                      float scale)
{
    cu_pdl_enter();
    extern __shared__ __align__(128) float sh[];
    const int C = CB_C;
    struct cb_block w = cb_block_of(sh, L, P);
    const int lv = w.lv, cv = w.cv;
    cb_load_state(w, s.state, L);
    for (int64_t ch = 0; ch < P.n_ch; ch++) {
        const int64_t t0 = ch * C;
        const int n = (int)(L.nt - t0 < C ? L.nt - t0 : C);
        cb_prepare(w, s, L, t0, n);
        cb_mm(w.Y, lv, w.Q, w.lk, 1, w.S0, lv, 1, C, cv, w.skp, 1.0f, false);
        cb_mm(w.Do, lv, w.P, w.lc, 1, w.U, lv, 1, C, cv, C, 1.0f, false);
        __syncthreads();
        for (int e = threadIdx.x; e < C * cv; e += blockDim.x) {
            const int r = e / cv, jj = e % cv;
            if (r < n && cb_col_ok(w, L, jj))
                out[((w.b * (L.nt + L.sk) + t0 + r) * L.hv + w.h) * L.sv + w.j0 + jj] =
                    scale * fmaf(w.eG[r], w.Y[r * lv + jj], w.Do[r * lv + jj]);
        }
        __syncthreads();
        cb_advance(w);
    }
    for (int e = threadIdx.x; e < w.skp * cv; e += blockDim.x) {
        const int i = e / cv, jj = e % cv;
        if (i < L.sk && cb_col_ok(w, L, jj))
            out[((w.b * (L.nt + L.sk) + L.nt + i) * L.hv + w.h) * L.sv + w.j0 + jj] =
                w.S0[i * lv + jj];
    }
}

/* block: columns c * cv .. of value head h of sequence b (block (b * H_v + h) * chunks + c).
 * A pass over the chunks keeps the state at each chunk start in ckpt; then each chunk,
 * last first, is prepared again from its start state and run backward. */
static __global__ void __launch_bounds__(DN_CBACK_THREADS, 1)
delta_net_cback_kernel(struct dn_srcs s, struct cu_t grad, float *out, float *ckpt_all,
                       float *part, struct dn_red L, struct dn_cback_plan P, float scale)
{
    cu_pdl_enter();
    extern __shared__ __align__(128) float sh[];
    __shared__ double red[32];
    const int C = CB_C;
    struct cb_block w = cb_block_of(sh, L, P);
    float *ckpt = ckpt_all + blockIdx.x * P.ckpt_per_block;
    float *mine = part + blockIdx.x * P.part_per_block;
    const int n_st = w.skp * w.cv;
    cb_load_state(w, s.state, L);
    for (int64_t ch = 0; ch < P.n_ch; ch++) {
        const int64_t t0 = ch * C;
        for (int e = threadIdx.x; e < n_st; e += blockDim.x)
            ckpt[ch * n_st + e] = w.S0[(e / w.cv) * w.lv + e % w.cv];
        cb_prepare(w, s, L, t0, (int)(L.nt - t0 < C ? L.nt - t0 : C));
        cb_advance(w);
    }
    const int cv = w.cv;
    cb_fill(
        w.skp, cv,
        [&](int i, int jj) {
            return i < L.sk && cb_col_ok(w, L, jj) && grad.ne[2] > L.nt
                       ? cu_getf(grad, w.j0 + jj, w.h, L.nt + i, w.b)
                                                   : 0.0f;
        },
        [&](int i, int jj, float x) { w.dS[i * w.lv + jj] = x; });
    for (int64_t ch = P.n_ch - 1; ch >= 0; ch--) {
        const int64_t t0 = ch * C;
        __syncthreads();
        const float *from = ckpt + ch * n_st;
        cb_fill(
            w.skp, cv, [&](int i, int jj) { return from[i * cv + jj]; },
            [&](int i, int jj, float x) { w.S0[i * w.lv + jj] = x; });
        __syncthreads();
        const int n = (int)(L.nt - t0 < C ? L.nt - t0 : C);
        cb_prepare(w, s, L, t0, n);
        cb_chunk(w, s, grad, L, out, mine, red, t0, n, scale);
    }
    float *dstate = out + L.off_state;
    for (int e = threadIdx.x; e < n_st; e += blockDim.x) {
        const int i = e / w.cv, jj = e % w.cv;
        if (i < L.sk && cb_col_ok(w, L, jj))
            dstate[((w.b * L.hv + w.h) * L.sk + i) * L.sv + w.j0 + jj] = w.dS[i * w.lv + jj];
    }
}

lt_status cu_dn_launch_chunked_forward(struct cu_ctx *c, struct lt_tensor *node,
                                    const struct dn_cback_plan &P)
{
    struct dn_srcs s = dn_srcs_of(node, 0);
    if (P.blocks == 0)
        return LT_OK;
    lt_status st = cu_check(cudaFuncSetAttribute(delta_net_cfwd_kernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)P.shared_bytes),
                            "raising delta_net's shared memory");
    if (st != LT_OK)
        return st;
    cu_launch_pdl(c, delta_net_cfwd_kernel, (unsigned)P.blocks, DN_CBACK_THREADS, P.shared_bytes, s,
                  (float *)node->data, cu_dn_red_of(node), P, lt_get_param_f32(node, 0));
    return cu_launched("delta_net_chunked");
}

/* The chunked backward: one buffer holds every block's partials, then every block's
 * chunk-start states. */
lt_status cu_dn_launch_chunked_backward(struct cu_ctx *c, struct lt_tensor *node,
                                     const struct dn_cback_plan &P)
{
    struct dn_srcs s = dn_srcs_of(node, 1);
    struct dn_red R = cu_dn_red_of(node);
    R.chunks = P.chunks, R.part_per_block = P.part_per_block, R.part_per_token = P.part_per_token;
    if (P.blocks == 0)
        return LT_OK;
    const int64_t n_part = P.blocks * P.part_per_block;
    void *scratch;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK, dn_cback_scratch_bytes(&P), &scratch);
    if (st != LT_OK)
        return st;
    float *part = (float *)scratch, *ckpt = part + n_part;
    st = cu_check(cudaFuncSetAttribute(delta_net_cback_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)P.shared_bytes),
                  "raising delta_net_back's shared memory");
    if (st != LT_OK)
        return st;
    cu_launch_pdl(c, delta_net_cback_kernel, (unsigned)P.blocks, DN_CBACK_THREADS, P.shared_bytes,
                  s, cu_view(node->src[0]), (float *)node->data, ckpt, part, R, P,
                  lt_get_param_f32(node, 0));
    st = cu_launched("delta_net_back_chunked");
    if (st != LT_OK)
        return st;
    return cu_dn_launch_reduce(c, part, (float *)node->data, R);
}
