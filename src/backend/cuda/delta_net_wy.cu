/* delta_net_wy.cu: DELTA_NET_BACK on the device split over chunks (the default; delta_net.cu
 * chooses with its one predicate, LATHE_DN_BACK=v1 keeps delta_net_chunk.cu's kernel), and
 * DELTA_NET from the same pieces (prep, fwd, then out; delta_net.cu takes it for CHUNKED
 * nodes and AUTO ones where cu_dn_wy_fwd_auto says so, LATHE_DN_FWD=token keeps the per-token
 * kernel).
 *
 * Same algebra as src/ops/delta_net.c's chunked CPU backward (cback_prepare, cback_chunk:
 * the step-by-step specification, chunks of DN_CHUNK = 64 tokens, the WY/UT form), but
 * reorganised the way flash-linear-attention's chunked gated delta rule backward is: what
 * does not depend on the state is computed once a chunk, in parallel over every chunk;
 * only the state and its gradient walk the chunks in order, each step a few products of
 * [64 x S_k] by [S_k x cv]; the rest of the adjoint is parallel over chunks again. Why: the
 * delta_net_chunk.cu kernel did all of a chunk's work inside the sequential walk, in one
 * 200 KiB block an SM (2 warps a scheduler, issue-bound), and each of a head's 4 column
 * blocks recomputed K K^T, Q K^T, the gates and the solves (16 ms a node at 16 x 512 tokens
 * of Qwen3.5-0.8B, a third of a training step).
 *
 * Within a chunk starting from S0 (rows r, s < 64; G_r the chunk's inclusive sum of g;
 * B = diag(beta); E_rs = e^{G_r - G_s}; El_r = e^{G_last - G_r}; eL = e^{G_last}):
 *   Ab = (K K^T) o E strictly lower,  P = (Q K^T) o E lower with the diagonal,
 *   T = (I + B Ab)^-1,  Uv = T B V,  Wk = T B diag(e^G) K,  U = Uv - Wk S0,
 *   O = diag(e^G) Q S0 + P U (times scale),  S_end = eL S0 + K^T diag(El) U.
 * Backward, with Do the output's gradient times scale and dS the end state's gradient:
 *   dR = T^T (P^T Do + diag(El) K dS)        (the CPU's dRHS)
 *   dS_start = eL dS + Q^T diag(e^G) Do - K^T diag(e^G beta) dR,
 * and the rest (dq, dk, dv, dbeta, the gates' dgam) is cback_chunk's, given S0, dS, U, dR.
 *
 * Kernels (DN_WY_THREADS = 512 threads each: their shared memory allows one block an SM, and
 * 16 warps hide more latency than 8 did, -11% on the backward on an H100; dn_wy_plan in
 * delta_net_plan.h sets the sizes):
 *   prep  a block a chunk: G, Ab, P, T (by substitution on the identity, so that every later
 *         solve is a product), Uv and Wk, and bwd's F = T^T P^T and G2 = T^T diag(El) K
 *         (so that its dR = F Do + G2 dS is one round of products) into scratch;
 *   fwd   a block a (sequence, value head, cv columns) walks forward: S0 of each chunk into
 *         scratch, U = Uv - Wk S0 over Uv, S0 advanced;
 *   bwd   the same blocks walk back: dS of each chunk's end into scratch, dR into scratch,
 *         dS carried to the chunk's start; the last one is dstate;
 *   out   (the forward alone) a block a (chunk, co value columns): O = scale [diag(e^G) Q | P]
 *         [S0; U], one product with K = skp + 64, stored straight into DELTA_NET's result;
 *         prep then skips Ab, F and G2 (a template flag), and fwd writes the state after the
 *         last chunk into the result's rows T.. (the same flag);
 *   grad  a block a chunk: M1 = Do U^T and M2 = -dR U^T (sums over all of S_v, so the block
 *         has every column), their gate terms, dv = B dR, dq = (M1 o E) K, dk = (M1 o E)^T Q
 *         + (M2 o B E) K + (M2 o B E)^T K; then the states' terms slice by slice of columns
 *         (dq += diag(e^G) Do S0^T, dk += diag(El) U dS^T - diag(e^G beta) dR S0^T, and the
 *         row sums the gates and dbeta need: Do.(Q S0), U.(K dS), dR.(K S0)); dg the suffix
 *         sums of dgam in the chunk. dq and dk add up in the block's registers over all
 *         their products (cb_acc64) and are stored once. A chunk's rows of dq and dk belong to
 *         one block, so with H_v = H_k they go straight into the result; with grouped heads
 *         they go to partials that delta_net.cu's reduction adds over the value heads of a
 *         key head.
 * Every product runs on tensor cores in three TF32 products (cb_mma, delta_net_mma.h), so the
 * precision stays F32's, or in one TF32 product for a node of LT_DELTA_NET_PREC_TF32 (the
 * kernels' template flag TF1: training on a device, whose other products round to BF16; at
 * Qwen3.5's widths its prep, walks and grad run delta_net_wy_bf16.cu's BF16 kernels); T's
 * substitution and the gates are plain F32 (exponents G_r - G_s with s <= r only). A tail chunk (T
 * not a multiple of 64) is padded with zero q, k, v, beta and g, which makes its extra rows of U
 * and dR zero (and of T the identity's). Scratch for 16 x 512 tokens, 16 heads, S_k = S_v = 128:
 * ~639 MB (dn_wy_plan's offsets), against the chunked kernel's ~670 MB.
 *
 * Not yet measured on the H200 when written: checked only against the recurrent oracle
 * (normalised squared errors ~1e-13) on a CPU emulation of these kernels (a thread per CUDA
 * thread, barriers, shuffles, wmma tiles with TF32 rounding) over tails, packed sequences,
 * grouped and ungrouped heads, S 16..128, T = 0; the forward likewise (outputs and final
 * state ~1e-13 to ~1e-12, out's columns 16, 32 and 64, zero and random initial states).
 * The forward's scratch at 16 x 512 tokens, 16 heads of 128: ~303 MB (G and beta, P, Wk, U,
 * S0 of every chunk; cu_dn_wy_fwd_plan_init lays them out). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/delta_net_wy_impl.h"
#include "lathe/ops.h"

/* ---- prep: a block a chunk ---- */

/* K, Q [C][ldk]; V [C][ldw]; Ab, P, T [C][ldc]; vectors G, B; tiles. Scratch: G and beta,
 * Ab, P, F, G2, Uv (in U's place) and Wk; FORWARD (DELTA_NET's plan): G and beta, P, Uv and
 * Wk alone. */
template <bool FORWARD, bool TF1, bool FIX>
static __global__ void __launch_bounds__(DN_WY_THREADS, 1) dn_wy_prep_kernel(struct wy_args a)
{
    extern __shared__ __align__(128) float sh[];
    const int C = WY_C;
    const struct dn_red &L = a.L;
    const struct dn_wy_plan &P = a.P;
    const struct wy_chunk ck = wy_chunk_of(a, blockIdx.x);
    const int64_t ci = ck.ci, ch = ck.ch, h = ck.h, b = ck.b, hk = ck.hk, t0 = ck.t0;
    const int n = wy_len(L, ch), lk = FIX ? WYF_S + 4 : (int)P.ldk,
              lw = FIX ? WYF_S + 4 : (int)P.ldw, lc = C + 4, skp = FIX ? WYF_S : (int)P.skp,
              svp = FIX ? WYF_S : (int)P.svp, sk = FIX ? WYF_S : (int)L.sk,
              sv = FIX ? WYF_S : (int)L.sv;
    float *K = sh, *Q = K + C * lk, *V = Q + C * lk, *Ab = V + C * lw, *Pm = Ab + C * lc,
          *T = Pm + C * lc, *At = T + C * lc, *G = At + C * lc, *Bv = G + C, *eGv = Bv + C,
          *Elv = eGv + C;
    if (FIX && cu_rows16(a.s.k) && cu_rows16(a.s.q) && cu_rows16(a.s.v)) {
        wy_src_async(K, lk, a.s.k, hk, t0, b, n, WYF_S);
        wy_src_async(Q, lk, a.s.q, hk, t0, b, n, WYF_S);
        wy_src_async(V, lw, a.s.v, h, t0, b, n, WYF_S);
    } else {
        wy_fill(/* K's rows, then Q's (Q follows K) */
                2 * C, skp,
                [&](int r, int i) {
                    const int rr = r % C;
                    return rr < n && i < sk ? cu_getf(r < C ? a.s.k : a.s.q, i, hk, t0 + rr, b)
                                            : 0.0f;
                },
                [&](int r, int i, float x) { K[r * lk + i] = x; });
        wy_fill(
            C, svp,
            [&](int r, int j) { return r < n && j < sv ? cu_getf(a.s.v, j, h, t0 + r, b) : 0.0f; },
            [&](int r, int j, float x) { V[r * lw + j] = x; });
    }
    wy_gates(a.s, h, b, t0, n, G, Bv);
    wy_async_wait();
    __syncthreads();
    if (threadIdx.x < C) { /* a row's factors, once (they were an exponential an element) */
        eGv[threadIdx.x] = expf(G[threadIdx.x]);
        Elv[threadIdx.x] = expf(G[C - 1] - G[threadIdx.x]);
    }
    cb_mm<TF1>(Ab, lc, K, lk, 1, K, 1, lk, C, C, skp, 1.0f, false);
    cb_mm<TF1>(Pm, lc, Q, lk, 1, K, 1, lk, C, C, skp, 1.0f, false);
    __syncthreads();
    /* the gates and masks; T starts as the identity; then the rows of V and K scaled for
     * Uv = T (B V), Wk = T (B e^G K) (into Q's place: Q is done) and G2 = T^T (El K) */
    float *gab = FORWARD ? NULL : wy_cc(a, P.off_ab, ci), *gp = wy_cc(a, P.off_p, ci);
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        const int r = e / C, q = e % C;
        const float d = q <= r ? expf(G[r] - G[q]) : 0.0f;
        const float ab = q < r ? Ab[r * lc + q] * d : 0.0f, pv = Pm[r * lc + q] * d;
        At[q * lc + r] = Bv[r] * ab;
        Pm[r * lc + q] = pv;
        T[r * lc + q] = r == q ? 1.0f : 0.0f;
        if (!FORWARD)
            gab[e] = ab;
        gp[e] = pv;
    }
    for (int e = threadIdx.x; e < C * svp; e += blockDim.x) {
        const int r = e / svp, j = e % svp;
        V[r * lw + j] *= Bv[r];
    }
    for (int e = threadIdx.x; e < C * skp; e += blockDim.x) {
        const int r = e / skp, i = e % skp;
        const float x = K[r * lk + i];
        Q[r * lk + i] = x * Bv[r] * eGv[r];
        if (!FORWARD)
            K[r * lk + i] = x * Elv[r];
    }
    if (threadIdx.x < C) {
        float *gv = wy_vec(a, ci);
        gv[threadIdx.x] = G[threadIdx.x];
        gv[C + threadIdx.x] = Bv[threadIdx.x];
    }
    __syncthreads();
    wy_solve64(At, lc, T, lc);
    __syncthreads();
    /* Uv = T (B V), Wk = T (B e^G K); for bwd F = T^T P^T and G2 = T^T (El K) */
    cb_mm<TF1>(wy_rows_v(a, P.off_u, ci), svp, T, lc, 1, V, lw, 1, C, svp, C, 1.0f, false);
    cb_mm<TF1>(wy_rows_k(a, P.off_wk, ci), skp, T, lc, 1, Q, lk, 1, C, skp, C, 1.0f, false);
    if (FORWARD)
        return;
    cb_mm<TF1>(wy_cc(a, P.off_f, ci), C, T, 1, lc, Pm, 1, lc, C, C, C, 1.0f, false);
    cb_mm<TF1>(wy_rows_k(a, P.off_g2, ci), skp, T, 1, lc, K, lk, 1, C, skp, C, 1.0f, false);
}

/* ---- fwd: the states at the chunk starts ---- */

/* block (b * H_v + h) * cblocks + c: columns c * cv .. of value head h of sequence b.
 * S0 [skp][ldv]; Wk, K [C][ldk]; U [C][ldv]; vectors El; tiles. FORWARD (DELTA_NET): the
 * state after the last chunk goes to the result's rows T.. too. */
template <bool FORWARD, bool TF1, bool FIX>
static __global__ void __launch_bounds__(DN_WY_THREADS, 1) dn_wy_fwd_kernel(struct wy_args a)
{
    extern __shared__ __align__(128) float sh[];
    const int C = WY_C;
    const struct dn_red &L = a.L;
    const struct dn_wy_plan &P = a.P;
    const struct wy_walk w = wy_walk_of(a);
    const int64_t c = w.c, h = w.h, b = w.b, hk = w.hk;
    const int lk = FIX ? WYF_S + 4 : (int)P.ldk, lv = FIX ? WYF_CV + 4 : (int)P.ldv,
              skp = FIX ? WYF_S : (int)P.skp, cv = FIX ? WYF_CV : (int)P.cv,
              svp = FIX ? WYF_S : (int)P.svp, sk = FIX ? WYF_S : (int)L.sk,
              sv = FIX ? WYF_S : (int)L.sv, j0 = (int)c * cv;
    float *S0 = sh, *Wk = S0 + skp * lv, *K = Wk + C * lk, *U = K + C * lk, *El = U + C * lv;
    wy_fill(
        skp, cv,
        [&](int i, int jj) {
            return i < sk && j0 + jj < sv ? cu_getf(a.s.state, j0 + jj, i, h, b) : 0.0f;
        },
        [&](int i, int jj, float x) { S0[i * lv + jj] = x; });
    __syncthreads();
    for (int64_t ch = 0; ch < P.n_ch; ch++) {
        const int64_t ci = (b * L.hv + h) * P.n_ch + ch, t0 = ch * C;
        const int n = wy_len(L, ch);
        float *gs = wy_state(a, P.off_s0, ci), *gu = wy_rows_v(a, P.off_u, ci);
        const float *gwk = wy_rows_k(a, P.off_wk, ci), *gv = wy_vec(a, ci);
        cb_fill(
            skp, cv, [&](int i, int jj) { return S0[i * lv + jj]; },
            [&](int i, int jj, float x) { gs[(int64_t)i * svp + j0 + jj] = x; });
        wy_async(Wk, lk, gwk, skp, C, skp);
        wy_async(U, lv, gu + j0, svp, C, cv);
        wy_fill(
            C, skp,
            [&](int r, int i) { return r < n && i < sk ? cu_getf(a.s.k, i, hk, t0 + r, b) : 0.0f; },
            [&](int r, int i, float x) { K[r * lk + i] = TF1 ? cb_tf32(x) : x; });
        if (threadIdx.x < C)
            El[threadIdx.x] = expf(gv[C - 1] - gv[threadIdx.x]);
        const float eL = expf(gv[C - 1]);
        wy_async_wait();
        __syncthreads();
        /* U = Uv - Wk S0 */
        cb_mm<TF1>(U, lv, Wk, lk, 1, S0, lv, 1, C, cv, skp, -1.0f, true);
        __syncthreads();
        /* U to scratch; then S0 = eL S0 + K^T diag(El) U */
        for (int e = threadIdx.x; e < C * cv; e += blockDim.x) {
            const int r = e / cv, jj = e % cv;
            const float x = U[r * lv + jj];
            gu[r * svp + j0 + jj] = x;
            U[r * lv + jj] = TF1 ? cb_tf32(El[r] * x) : El[r] * x; /* an operand alone now */
        }
        for (int e = threadIdx.x; e < skp * cv; e += blockDim.x)
            S0[(e / cv) * lv + e % cv] *= eL;
        __syncthreads();
        cb_mm<TF1, true, true>(S0, lv, K, 1, lk, U, lv, 1, skp, cv, C, 1.0f, true);
        __syncthreads();
    }
    if (FORWARD) { /* S[i][j] at row T + i of DELTA_NET's result [S_v, H_v, T + S_k, B] */
        float *so = a.out + ((b * (L.nt + L.sk) + L.nt) * L.hv + h) * L.sv + j0;
        const int64_t ldo = L.hv * L.sv;
        for (int e = threadIdx.x; e < skp * cv; e += blockDim.x) {
            const int i = e / cv, jj = e % cv;
            if (i < sk && j0 + jj < sv)
                so[i * ldo + jj] = S0[i * lv + jj];
        }
    }
}

/* ---- bwd: the state gradients at the chunk ends ---- */

/* The blocks of fwd. dS [skp][ldv]; Q over K [2C][ldk]; F [C][ldc]; G2 [C][ldk];
 * Do [C][ldv]; Z [2C][ldv] (e^G Do over -e^G beta dR, the right side of dS's update by
 * [Q; K]^T); vectors eG, B; tiles. A chunk is two rounds of products: dR, then dS. */
template <bool TF1, bool FIX>
static __global__ void __launch_bounds__(DN_WY_THREADS, 1) dn_wy_bwd_kernel(struct wy_args a)
{
    extern __shared__ __align__(128) float sh[];
    const int C = WY_C;
    const struct dn_red &L = a.L;
    const struct dn_wy_plan &P = a.P;
    const struct wy_walk w = wy_walk_of(a);
    const int64_t c = w.c, h = w.h, b = w.b, hk = w.hk;
    const int lk = FIX ? WYF_S + 4 : (int)P.ldk, lv = FIX ? WYF_CV + 4 : (int)P.ldv, lc = C + 4,
              skp = FIX ? WYF_S : (int)P.skp, cv = FIX ? WYF_CV : (int)P.cv,
              svp = FIX ? WYF_S : (int)P.svp, sk = FIX ? WYF_S : (int)L.sk,
              sv = FIX ? WYF_S : (int)L.sv, j0 = (int)c * cv;
    float *dS = sh, *QK = dS + skp * lv, *F = QK + 2 * C * lk, *G2 = F + C * lc,
          *Do = G2 + C * lk, *Z = Do + C * lv, *eG = Z + 2 * C * lv, *Bv = eG + C;
    float *Zb = Z + C * lv;
    /* the final state's gradient: rows T.. of grad */
    wy_fill(
        skp, cv,
        [&](int i, int jj) {
            return i < sk && j0 + jj < sv && a.grad.ne[2] > L.nt
                       ? cu_getf(a.grad, j0 + jj, h, L.nt + i, b)
                       : 0.0f;
        },
        [&](int i, int jj, float x) { dS[i * lv + jj] = x; });
    __syncthreads();
    for (int64_t ch = P.n_ch - 1; ch >= 0; ch--) {
        const int64_t ci = (b * L.hv + h) * P.n_ch + ch, t0 = ch * C;
        const int n = wy_len(L, ch);
        float *gds = wy_state(a, P.off_ds, ci), *gdr = wy_rows_v(a, P.off_dr, ci);
        const float *gf = wy_cc(a, P.off_f, ci), *gg2 = wy_rows_k(a, P.off_g2, ci),
                    *gv = wy_vec(a, ci);
        cb_fill(
            skp, cv, [&](int i, int jj) { return dS[i * lv + jj]; },
            [&](int i, int jj, float x) { gds[(int64_t)i * svp + j0 + jj] = x; });
        wy_fill( /* Q's rows, then K's */
            2 * C, skp,
            [&](int r, int i) {
                const int rr = r % C;
                return rr < n && i < sk ? cu_getf(r < C ? a.s.q : a.s.k, i, hk, t0 + rr, b)
                                        : 0.0f;
            },
            [&](int r, int i, float x) { QK[r * lk + i] = TF1 ? cb_tf32(x) : x; });
        wy_async(F, lc, gf, C, C, C);
        wy_async(G2, lk, gg2, skp, C, skp);
        wy_fill(
            C, cv,
            [&](int r, int jj) {
                return r < n && j0 + jj < sv ? a.scale * cu_getf(a.grad, j0 + jj, h, t0 + r, b)
                                             : 0.0f;
            },
            [&](int r, int jj, float x) { Do[r * lv + jj] = x; });
        if (threadIdx.x < C) {
            const int r = threadIdx.x;
            eG[r] = expf(gv[r]);
            Bv[r] = gv[C + r];
        }
        const float eL = expf(gv[C - 1]);
        wy_async_wait();
        __syncthreads();
        /* dR = T^T (P^T Do + diag(El) K dS) = F Do + G2 dS into Z's bottom (the same tiles
         * a warp: no barrier between); Z's top = diag(e^G) Do */
        cb_mm<TF1>(Zb, lv, F, lc, 1, Do, lv, 1, C, cv, C, 1.0f, false);
        cb_mm<TF1>(Zb, lv, G2, lk, 1, dS, lv, 1, C, cv, skp, 1.0f, true);
        for (int e = threadIdx.x; e < C * cv; e += blockDim.x) {
            const int r = e / cv, jj = e % cv;
            const float z = eG[r] * Do[r * lv + jj];
            Z[r * lv + jj] = TF1 ? cb_tf32(z) : z;
        }
        __syncthreads();
        /* dR to scratch, Z's bottom = -diag(e^G beta) dR, dS = eL dS */
        for (int e = threadIdx.x; e < C * cv; e += blockDim.x) {
            const int r = e / cv, jj = e % cv;
            const float x = Zb[r * lv + jj];
            gdr[r * svp + j0 + jj] = x;
            const float z = -eG[r] * Bv[r] * x;
            Zb[r * lv + jj] = TF1 ? cb_tf32(z) : z;
        }
        for (int e = threadIdx.x; e < skp * cv; e += blockDim.x)
            dS[(e / cv) * lv + e % cv] *= eL;
        __syncthreads();
        /* dS += [Q; K]^T Z = Q^T diag(e^G) Do - K^T diag(e^G beta) dR */
        cb_mm<TF1, true, true>(dS, lv, QK, 1, lk, Z, lv, 1, skp, cv, 2 * C, 1.0f, true);
        __syncthreads();
    }
    float *dstate = a.out + L.off_state;
    for (int e = threadIdx.x; e < skp * cv; e += blockDim.x) {
        const int i = e / cv, jj = e % cv;
        if (i < sk && j0 + jj < sv)
            dstate[((b * L.hv + h) * L.sk + i) * L.sv + j0 + jj] = dS[i * lv + jj];
    }
}

/* ---- grad: the rest of the adjoint, a block a chunk ---- */

/* Do, U, dR [C][ldw]; region A: M1, M2 [C][ldc], then the slices S0s, dSs [skp][lds] and
 * Y [C][lds]; region B: P, Ab [C][ldc], then Q, K [C][ldk]; vectors; tiles. The steps are
 * cback_chunk's (src/ops/delta_net.c), regrouped; each line's comment names its term. */
template <bool TF1, bool FIX>
static __global__ void __launch_bounds__(DN_WY_THREADS, 1) dn_wy_grad_kernel(struct wy_args a)
{
    extern __shared__ __align__(128) float sh[];
    __shared__ double red[32];
    const int C = WY_C;
    const struct dn_red &L = a.L;
    const struct dn_wy_plan &P = a.P;
    const struct wy_chunk ck = wy_chunk_of(a, blockIdx.x);
    const int64_t ci = ck.ci, ch = ck.ch, h = ck.h, b = ck.b, hk = ck.hk, t0 = ck.t0;
    const int n = wy_len(L, ch), lk = FIX ? WYF_S + 4 : (int)P.ldk,
              lw = FIX ? WYF_S + 4 : (int)P.ldw, lc = C + 4, ls = FIX ? WYF_CS + 4 : (int)P.lds,
              skp = FIX ? WYF_S : (int)P.skp, svp = FIX ? WYF_S : (int)P.svp,
              cs = FIX ? WYF_CS : (int)P.cs, sk = FIX ? WYF_S : (int)L.sk,
              sv = FIX ? WYF_S : (int)L.sv;
    const int reg_a = 2 * C * lc > 2 * skp * ls + C * ls ? 2 * C * lc : 2 * skp * ls + C * ls;
    const int reg_b = 2 * C * lk > 2 * C * lc ? 2 * C * lk : 2 * C * lc;
    float *Do = sh, *U = Do + C * lw, *dR = U + C * lw, *RA = dR + C * lw, *RB = RA + reg_a;
    float *M1 = RA, *M2 = RA + C * lc, *S0s = RA, *dSs = RA + skp * ls, *Y = RA + 2 * skp * ls;
    float *Pm = RB, *Ab = RB + C * lc, *Q = RB, *K = RB + C * lk;
    float *G = RB + reg_b, *eG = G + C, *El = eG + C, *Bv = El + C, *mEB = Bv + C,
          *dgam = mEB + C, *dB = dgam + C, *aq = dB + C, *au = aq + C, *aw = au + C,
          *av = aw + C;
    static_assert(DN_WY_VECS >= 11, "grad keeps 11 vectors");
    const wy_grad_dest dst = wy_grad_dest_of(a, b, h, hk, t0);
    wy_grad_vectors(wy_vec(a, ci), G, eG, El, Bv, mEB);
    if (threadIdx.x < C)
        aq[threadIdx.x] = au[threadIdx.x] = aw[threadIdx.x] = av[threadIdx.x] = 0.0f;
    const float *gu = wy_rows_v(a, P.off_u, ci), *gdr = wy_rows_v(a, P.off_dr, ci);
    const float *gp = wy_cc(a, P.off_p, ci), *gab = wy_cc(a, P.off_ab, ci);
    wy_async(U, lw, gu, svp, C, svp);
    wy_async(dR, lw, gdr, svp, C, svp);
    wy_async(Pm, lc, gp, C, C, C);
    wy_async(Ab, lc, gab, C, C, C);
    wy_fill(
        C, svp,
        [&](int r, int j) {
            return r < n && j < sv ? a.scale * cu_getf(a.grad, j, h, t0 + r, b) : 0.0f;
        },
        [&](int r, int j, float x) { Do[r * lw + j] = x; });
    wy_async_wait();
    __syncthreads();
    /* O = P U: M1 = Do U^T (dP on s <= r); A = B Ab with RHS's solve: M2 = dA = -dR U^T */
    cb_mm<TF1>(M1, lc, Do, lw, 1, U, 1, lw, C, C, svp, 1.0f, false);
    cb_mm<TF1>(M2, lc, dR, lw, 1, U, 1, lw, C, C, svp, -1.0f, false);
    /* dX = B dR is dv; and dR . V, dbeta's part of dR . X (X = V - e^G W), a warp a row */
    {
        /* the chunk's rows of dv, H_v S_v apart: one 64-bit base, 32-bit offsets in it (the
         * flat index in 64 bits took ~30 instructions an element) */
        float *dv = a.out + L.off_v + ((b * L.nt + t0) * L.hv + h) * L.sv;
        const int ldo = (int)(L.hv * L.sv);
        for (unsigned e = threadIdx.x; e < (unsigned)(n * sv); e += blockDim.x) {
            const int r = (int)(e / (unsigned)sv), j = (int)(e % (unsigned)sv);
            dv[r * ldo + j] = Bv[r] * dR[r * lw + j];
        }
    }
    {
        /* a warp's 8 rows at once, so that their loads of V are in flight together (one
         * row at a time waited out a global load's latency 8 times) */
        constexpr int NW = DN_WY_THREADS / 32, RW = C / NW;
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        float x[RW];
#pragma unroll
        for (int q = 0; q < RW; q++) {
            const int r = warp + NW * q;
            x[q] = 0.0f;
            if (r < n)
                for (int j = lane; j < sv; j += 32)
                    x[q] = fmaf(dR[r * lw + j], cu_getf(a.s.v, j, h, t0 + r, b), x[q]);
        }
#pragma unroll
        for (int q = 0; q < RW; q++) {
            for (int o = 16; o > 0; o >>= 1)
                x[q] += __shfl_xor_sync(0xffffffffu, x[q], o);
            if (lane == 0 && warp + NW * q < n)
                av[warp + NW * q] = x[q];
        }
    }
    __syncthreads();
    wy_gate_terms(M1, M2, Pm, Ab, lc, Bv, dgam, dB);
    __syncthreads();
    /* M1 o E on s <= r (dQK), M2 o B E on s < r (dKK) */
    for (int e = threadIdx.x; e < C * C; e += blockDim.x) {
        const int r = e / C, q = e % C;
        const float d = q <= r ? expf(G[r] - G[q]) : 0.0f;
        const float m1 = q <= r ? M1[r * lc + q] * d : 0.0f,
                    m2 = q < r ? M2[r * lc + q] * Bv[r] * d : 0.0f;
        /* stored as TF32 under TF1: product operands alone from here (PA, PB below) */
        M1[r * lc + q] = TF1 ? cb_tf32(m1) : m1;
        M2[r * lc + q] = TF1 ? cb_tf32(m2) : m2;
    }
    /* Q, K over P and Ab (last read before the barrier above) */
    wy_fill( /* Q's rows, then K's (K follows Q) */
        2 * C, skp,
        [&](int r, int i) {
            const int rr = r % C;
            return rr < n && i < sk ? cu_getf(r < C ? a.s.q : a.s.k, i, hk, t0 + rr, b) : 0.0f;
        },
        [&](int r, int i, float x) { Q[r * lk + i] = TF1 ? cb_tf32(x) : x; });
    __syncthreads();
    /* dq = dQK K, dk = dQK^T Q + dKK K + dKK^T K, then the states' terms below: every
     * product of dq and of dk adds into the block's registers (cb_acc64), which go to the
     * result once at the end */
    cb_acc64 DQ, DK;
    cb_acc64_zero(DQ);
    cb_acc64_zero(DK);
    cb_acc64_mm<TF1, true, true>(DQ, M1, lc, 1, K, lk, 1, skp, C);
    cb_acc64_mm<TF1, true, true>(DK, M1, 1, lc, Q, lk, 1, skp, C);
    cb_acc64_mm<TF1, true, true>(DK, M2, lc, 1, K, lk, 1, skp, C);
    cb_acc64_mm<TF1, true, true>(DK, M2, 1, lc, K, lk, 1, skp, C);
    __syncthreads();
    /* the states' terms, cs columns at a time (over M1 and M2) */
    const float *gs0 = wy_state(a, P.off_s0, ci), *gds = wy_state(a, P.off_ds, ci);
    double ss = 0.0; /* <dS, S0> */
    for (int j0 = 0; j0 < svp; j0 += cs) {
        wy_async(S0s, ls, gs0 + j0, svp, skp, cs);
        wy_async(dSs, ls, gds + j0, svp, skp, cs);
        wy_async_wait();
        __syncthreads();
        for (unsigned e = threadIdx.x; e < (unsigned)(skp * cs); e += blockDim.x) {
            const int i = (int)(e / (unsigned)cs), jj = (int)(e % (unsigned)cs);
            ss += (double)dSs[i * ls + jj] * S0s[i * ls + jj];
        }
        /* Do_r . (Q S0)_r */
        cb_mm<TF1, true>(Y, ls, Q, lk, 1, S0s, ls, 1, C, cs, skp, 1.0f, false);
        __syncthreads();
        {
            const float x = wy_row_dot(Do + j0, lw, Y, ls, cs);
            if (threadIdx.x % WY_LPR == 0)
                aq[threadIdx.x / WY_LPR] += x;
        }
        __syncthreads();
        /* U_r . (K dS)_r */
        cb_mm<TF1, true>(Y, ls, K, lk, 1, dSs, ls, 1, C, cs, skp, 1.0f, false);
        __syncthreads();
        {
            const float x = wy_row_dot(U + j0, lw, Y, ls, cs);
            if (threadIdx.x % WY_LPR == 0)
                au[threadIdx.x / WY_LPR] += x;
        }
        __syncthreads();
        /* dR_r . W_r, W = K S0 */
        cb_mm<TF1, true>(Y, ls, K, lk, 1, S0s, ls, 1, C, cs, skp, 1.0f, false);
        __syncthreads();
        {
            const float x = wy_row_dot(dR + j0, lw, Y, ls, cs);
            if (threadIdx.x % WY_LPR == 0)
                aw[threadIdx.x / WY_LPR] += x;
        }
        __syncthreads();
        /* the slice's columns of Do, U and dR are read once more, by the products below:
         * their rows scaled there by e^G, El and -e^G beta */
        for (int e = threadIdx.x; e < C * cs; e += blockDim.x) {
            const int r = e / cs, j = j0 + e % cs;
            Do[r * lw + j] *= eG[r];
            U[r * lw + j] *= El[r];
            dR[r * lw + j] *= mEB[r];
        }
        __syncthreads();
        /* dq += diag(e^G) Do S0^T; dk += diag(El) U dS^T (the end state's term) and
         * dW S0^T with dW = -diag(e^G beta) dR */
        cb_acc64_mm<TF1>(DQ, Do + j0, lw, 1, S0s, 1, ls, skp, cs);
        cb_acc64_mm<TF1>(DK, U + j0, lw, 1, dSs, 1, ls, skp, cs);
        cb_acc64_mm<TF1>(DK, dR + j0, lw, 1, S0s, 1, ls, skp, cs);
        __syncthreads(); /* before the next slice lands over S0s and dSs */
    }
    cb_acc64_store(DQ, dst.dq, dst.ld, skp, n, sk);
    cb_acc64_store(DK, dst.dk, dst.ld, skp, n, sk);
    ss = cu_block_sum(ss, red); /* synchronises the block */
    if (threadIdx.x == 0)
        wy_gate_grads(dst, n, G, eG, El, mEB, dgam, dB, aq, au, aw, av, ss);
}

/* ---- out: the forward's outputs, a block a (chunk, co value columns) ---- */

/* block ci * cob + c: chunk ci, columns c * co .. X = [diag(e^G) Q | P] [C][ldx]; Y = [S0; U]
 * over the block's columns [skp + C][ldy]; vectors eG; tiles. O = scale X Y, one product
 * (K = skp + C), stored by the tiles straight into DELTA_NET's result: rows past the chunk's
 * tokens and columns past S_v are not stored. Small enough for two blocks an SM at S_k =
 * S_v = 128 (co 64: ~111 KiB). */
template <bool TF1, bool FIX>
static __global__ void __launch_bounds__(DN_WY_THREADS, 1) dn_wy_out_kernel(struct wy_args a)
{
    extern __shared__ __align__(128) float sh[];
    const int C = WY_C;
    const struct dn_red &L = a.L;
    const struct dn_wy_plan &P = a.P;
    const struct wy_chunk ck = wy_chunk_of(a, blockIdx.x / P.cob);
    const int64_t ci = ck.ci, ch = ck.ch, h = ck.h, b = ck.b, hk = ck.hk, t0 = ck.t0;
    const int n = wy_len(L, ch), lx = FIX ? WYF_S + C + 4 : (int)P.ldx,
              ly = FIX ? WYF_CO + 4 : (int)P.ldy, skp = FIX ? WYF_S : (int)P.skp,
              co = FIX ? WYF_CO : (int)P.co, sk = FIX ? WYF_S : (int)L.sk,
              sv = FIX ? WYF_S : (int)L.sv, j0 = (int)(blockIdx.x % P.cob) * co;
    float *X = sh, *Y = X + C * lx, *eG = Y + (skp + C) * ly;
    const float *gv = wy_vec(a, ci);
    /* P to X's right, the columns' S0 and U to Y (j0 + co <= svp: scratch has them) */
    wy_async(X + skp, lx, wy_cc(a, P.off_p, ci), C, C, C);
    const int svp = FIX ? WYF_S : (int)P.svp;
    wy_async(Y, ly, wy_state(a, P.off_s0, ci) + j0, svp, skp, co);
    wy_async(Y + skp * ly, ly, wy_rows_v(a, P.off_u, ci) + j0, svp, C, co);
    if (threadIdx.x < C)
        eG[threadIdx.x] = expf(gv[threadIdx.x]);
    __syncthreads();
    const bool rows = FIX && cu_rows16(a.s.q);
    if (rows) /* Q to X's left, scaled below */
        wy_src_async(X, lx, a.s.q, hk, t0, b, n, WYF_S);
    else
        wy_fill(/* diag(e^G) Q to X's left (zeros past the tokens and S_k) */
                C, skp,
                [&](int r, int i) {
                    return r < n && i < sk ? cu_getf(a.s.q, i, hk, t0 + r, b) : 0.0f;
                },
                [&](int r, int i, float x) { X[r * lx + i] = eG[r] * x; });
    wy_async_wait();
    __syncthreads();
    if (rows) {
        for (int e = threadIdx.x; e < C * WYF_S; e += blockDim.x) {
            const int r = e / WYF_S, i = e % WYF_S;
            X[r * lx + i] = eG[r] * X[r * lx + i];
        }
        __syncthreads();
    }
    float *o = a.out + ((b * (L.nt + L.sk) + t0) * L.hv + h) * L.sv + j0;
    cb_mm<TF1>(o, L.hv * L.sv, X, lx, 1, Y, ly, 1, C, co, skp + C, a.scale, false, NULL, n,
               sv - j0);
}

/* whether the switch `name` is set to "0" (read at each launch, as LATHE_DN_BACK is) */
static bool wy_env_off(const char *name)
{
    const char *e = getenv(name);
    return e && strcmp(e, "0") == 0;
}

/* whether a node of LT_DELTA_NET_PREC_BF16 at S_k = S_v = 128 takes the BF16 kernels (with
 * 64 columns a walk for the walks): LATHE_DN_BF16=0 keeps the TF32 ones (one TF32 product),
 * which is how a device run compares the two */
static bool wy_bf16(int32_t prec, const struct dn_wy_plan &P, const struct dn_red &L)
{
    return prec == LT_DELTA_NET_PREC_BF16 && !wy_env_off("LATHE_DN_BF16") && L.sk == WYF_S &&
           L.sv == WYF_S && P.skp == WYF_S && P.svp == WYF_S;
}

/* whether such a node's prep is the BF16 one too: LATHE_DN_PREP_BF16=0 keeps the TF32 prep
 * beside the BF16 walks and grad (a device run's before / after) */
static bool wy_prep16(int32_t prec, const struct dn_wy_plan &P, const struct dn_red &L)
{
    return wy_bf16(prec, P, L) && !wy_env_off("LATHE_DN_PREP_BF16");
}

/* Whether the BF16 fwd walk takes a head's 128 columns in one block (dn_wy_fwd_bf16_kernel's
 * wide form) where the plan has two blocks of 64: with at least DN_WY_WIDE_MIN_HEADS
 * (sequence, value head) pairs, so that the halved grid still fills an H100's 132 SMs (16 x
 * 512 tokens of 16 heads: 256). LATHE_DN_WIDE=0 keeps the blocks of 64 (a device run's
 * before / after; the same sums either way), =1 takes 128 whatever the count (the tests'
 * small cases). */
#define DN_WY_WIDE_MIN_HEADS 128
static bool wy_wide(const struct dn_wy_plan &P)
{
    const char *e = getenv("LATHE_DN_WIDE");
    const bool shape = P.cv == WYF_CV && P.svp == 2 * WYF_CV && P.cblocks == 2;
    if (e && (strcmp(e, "0") == 0 || strcmp(e, "1") == 0))
        return shape && e[0] == '1';
    return shape && P.state_blocks / P.cblocks >= DN_WY_WIDE_MIN_HEADS;
}

/* kernel K's instance for the node's precision (tf1) and shape (fix); WY_PICK_F for the
 * kernels whose first template argument is FORWARD */
#define WY_PICK(K)                                                                                 \
    (fix ? (tf1 ? K<true, true> : K<false, true>) : (tf1 ? K<true, false> : K<false, false>))
#define WY_PICK_F(K, F)                                                                            \
    (fix ? (tf1 ? K<F, true, true> : K<F, false, true>)                                            \
         : (tf1 ? K<F, true, false> : K<F, false, false>))

/* The chunk-parallel backward: prep, fwd, bwd, grad (and the reduction of the partials
 * with grouped heads) on the context's stream, in one scratch buffer of the plan's layout. */
lt_status cu_dn_launch_wy_backward(struct cu_ctx *c, struct lt_tensor *node,
                                const struct dn_wy_plan &P)
{
    struct wy_args a;
    a.s = dn_srcs_of(node, 1);
    a.grad = cu_view(node->src[0]);
    a.out = (float *)node->data;
    a.L = cu_dn_red_of(node);
    a.P = P;
    a.scale = lt_get_param_f32(node, 0);
    if (P.state_blocks == 0)
        return LT_OK;
    void *scratch;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK, dn_wy_scratch_bytes(&P), &scratch);
    if (st != LT_OK)
        return st;
    a.scr = (float *)scratch;
    const int32_t prec = lt_get_param_i32(node, 2);
    const bool tf1 = prec != LT_DELTA_NET_PREC_F32, fix = wy_fix(P, a.L),
               bf16 = wy_bf16(prec, P, a.L), walk16 = bf16 && P.cv == WYF_CV,
               prep16 = wy_prep16(prec, P, a.L), wide = walk16 && wy_wide(P);
    struct {
        void (*fn)(struct wy_args);
        size_t shared;
        int64_t blocks;
        const char *name;
    } ks[] = {{prep16 ? wy_bf16_prep(false).fn : WY_PICK_F(dn_wy_prep_kernel, false),
               prep16 ? wy_bf16_prep(false).shared : P.shared_prep, P.chunks,
               "delta_net_back_prep"},
              {walk16 ? wy_bf16_fwd(false, wide).fn : WY_PICK_F(dn_wy_fwd_kernel, false),
               walk16 ? wy_bf16_fwd(false, wide).shared : P.shared_fwd,
               wide ? P.state_blocks / P.cblocks : P.state_blocks, "delta_net_back_fwd"},
              {walk16 ? wy_bf16_bwd(wide).fn : WY_PICK(dn_wy_bwd_kernel),
               walk16 ? wy_bf16_bwd(wide).shared : P.shared_bwd,
               wide ? P.state_blocks / P.cblocks : P.state_blocks, "delta_net_back_bwd"},
              {bf16 ? wy_bf16_grad().fn : WY_PICK(dn_wy_grad_kernel),
               bf16 ? wy_bf16_grad().shared : P.shared_grad, P.chunks, "delta_net_back_grad"}};
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
        st = cu_check(cudaFuncSetAttribute(ks[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)ks[i].shared),
                      "raising delta_net_back's shared memory");
        if (st != LT_OK)
            return st;
    }
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
        if (ks[i].blocks == 0) /* no tokens: bwd alone copies the final state's gradient */
            continue;
        ks[i].fn<<<(unsigned)ks[i].blocks, DN_WY_THREADS, ks[i].shared, c->stream>>>(a);
        st = cu_launched(ks[i].name);
        if (st != LT_OK)
            return st;
    }
    if (P.direct || P.chunks == 0)
        return LT_OK;
    struct dn_red R = a.L;
    R.chunks = 1, R.part_per_block = P.part_per_block, R.part_per_token = P.part_per_token;
    return cu_dn_launch_reduce(c, a.scr + P.off_part, (float *)node->data, R);
}

/* The chunk-parallel forward: prep and fwd (the forward's parts of them), then out, on the
 * context's stream, in one scratch buffer of the forward's plan (cu_dn_wy_fwd_plan_init). */
lt_status cu_dn_launch_wy_forward(struct cu_ctx *c, struct lt_tensor *node,
                               const struct dn_wy_plan &P)
{
    struct wy_args a = {};
    a.s = dn_srcs_of(node, 0);
    a.out = (float *)node->data;
    a.L = cu_dn_red_of(node);
    a.P = P;
    a.scale = lt_get_param_f32(node, 0);
    if (P.state_blocks == 0)
        return LT_OK;
    void *scratch = NULL;
    if (P.scratch_floats > 0) {
        lt_status st = cu_scratch(c, CU_SCRATCH_WORK, dn_wy_scratch_bytes(&P), &scratch);
        if (st != LT_OK)
            return st;
    }
    a.scr = (float *)scratch;
    const int32_t prec = lt_get_param_i32(node, 2);
    const bool tf1 = prec != LT_DELTA_NET_PREC_F32, fix = wy_fix(P, a.L),
               fix_out = wy_fix_out(P, a.L), bf16 = wy_bf16(prec, P, a.L) && P.cv == WYF_CV,
               prep16 = wy_prep16(prec, P, a.L), wide = bf16 && wy_wide(P);
    struct {
        void (*fn)(struct wy_args);
        size_t shared;
        int64_t blocks;
        const char *name;
    } ks[] = {{prep16 ? wy_bf16_prep(true).fn : WY_PICK_F(dn_wy_prep_kernel, true),
               prep16 ? wy_bf16_prep(true).shared : P.shared_prep, P.chunks, "delta_net_prep"},
              {bf16 ? wy_bf16_fwd(true, wide).fn : WY_PICK_F(dn_wy_fwd_kernel, true),
               bf16 ? wy_bf16_fwd(true, wide).shared : P.shared_fwd,
               wide ? P.state_blocks / P.cblocks : P.state_blocks, "delta_net_fwd"},
              {fix_out ? (tf1 ? dn_wy_out_kernel<true, true> : dn_wy_out_kernel<false, true>)
                       : (tf1 ? dn_wy_out_kernel<true, false> : dn_wy_out_kernel<false, false>),
               P.shared_out, P.out_blocks, "delta_net_out"}};
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
        lt_status st =
            cu_check(cudaFuncSetAttribute(ks[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)ks[i].shared),
                     "raising delta_net's shared memory");
        if (st != LT_OK)
            return st;
    }
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
        if (ks[i].blocks == 0) /* no tokens: fwd alone copies the initial state */
            continue;
        ks[i].fn<<<(unsigned)ks[i].blocks, DN_WY_THREADS, ks[i].shared, c->stream>>>(a);
        lt_status st = cu_launched(ks[i].name);
        if (st != LT_OK)
            return st;
    }
    return LT_OK;
}
