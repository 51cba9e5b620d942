/* delta_net_wy_impl.h (internal, CUDA C++): what the chunk-parallel DeltaNet kernels share
 * between delta_net_wy.cu (the plans' launchers and the kernels of one TF32 or three TF32
 * products) and delta_net_wy_bf16.cu (the kernels on BF16 tensor cores of
 * LT_DELTA_NET_PREC_BF16): the arguments every kernel is handed, the scratch layout's
 * accessors, the copies into shared memory, and the grad kernels' common pieces.
 * delta_net_wy.cu's head comment has the algebra. */
#ifndef LATHE_BACKEND_CUDA_DELTA_NET_WY_IMPL_H
#define LATHE_BACKEND_CUDA_DELTA_NET_WY_IMPL_H

#include <cuda_pipeline.h>
#include <math.h>

#include "backend/cuda/delta_net_impl.h"
#define CB_WARPS (DN_WY_THREADS / 32) /* the products' warps: every kernel here */
#include "backend/cuda/delta_net_mma.h"

#define WY_C DN_CHUNK
#define WY_LPR (DN_WY_THREADS / DN_CHUNK) /* lanes a chunk row in the row sums */
static_assert(WY_LPR * DN_CHUNK == DN_WY_THREADS && WY_LPR <= 32 && (WY_LPR & (WY_LPR - 1)) == 0,
              "the row sums take a power of two of lanes, within a warp, for each chunk row");
static_assert(DN_CHUNK == 64 && DN_CHUNK % (DN_WY_THREADS / 32) == 0,
              "T's substitution: two rows a lane, whole columns a warp");

/* FIX: the kernels compiled for one shape, Qwen3.5's (S_k = S_v = 128 and the plan's widths
 * for it: cv 64, cs 32, co 64), every width and leading dimension a constant. Each shared-
 * memory index and tensor-core fragment address then folds into an immediate offset: with
 * the widths read from the plan, integer multiply-adds were a third of the grad kernel's
 * instructions (Nsight Compute, 16 x 512 tokens). wy_fix says when a plan is that shape;
 * the launchers pick the kernels by it, any other shape runs the same code on the plan's
 * numbers. */
#define WYF_S 128 /* S_k = S_v = skp = svp */
#define WYF_CV 64
#define WYF_CS 32
#define WYF_CO 64

static inline bool wy_fix(const struct dn_wy_plan &P, const struct dn_red &L)
{
    return L.sk == WYF_S && L.sv == WYF_S && P.skp == WYF_S && P.svp == WYF_S && P.cv == WYF_CV &&
           P.cs == WYF_CS && P.ldk == WYF_S + 4 && P.ldw == WYF_S + 4 && P.ldv == WYF_CV + 4 &&
           P.lds == WYF_CS + 4 && P.ldc == DN_CHUNK + 4;
}

/* the forward's out kernel besides: its columns */
static inline bool wy_fix_out(const struct dn_wy_plan &P, const struct dn_red &L)
{
    return wy_fix(P, L) && P.co == WYF_CO && P.ldx == WYF_S + DN_CHUNK + 4 && P.ldy == WYF_CO + 4;
}

/* what every kernel is handed */
struct wy_args {
    struct dn_srcs s;
    struct cu_t grad;
    float *out; /* the flat result: dq, dk, dv, dg, dbeta, dstate */
    float *scr; /* the plan's scratch */
    struct dn_red L;
    struct dn_wy_plan P;
    float scale;
};

/* A walk's block: the state's column block c, the value head h with its key head hk, and
 * the sequence b (blockIdx.x = (b * H_v + h) * cb + c), of cb column blocks a head: the
 * plan's cblocks, or fewer for a wider walk (wy_wide's one a head) */
struct wy_walk {
    int64_t c, h, b, hk;
};
static __device__ __forceinline__ struct wy_walk wy_walk_of(const struct wy_args &a, int64_t cb)
{
    const int64_t x = blockIdx.x, h = x / cb % a.L.hv;
    return {x % cb, h, x / cb / a.L.hv, h % a.L.hk};
}
static __device__ __forceinline__ struct wy_walk wy_walk_of(const struct wy_args &a)
{
    return wy_walk_of(a, a.P.cblocks);
}

/* A chunk's block: chunk ci = (b * H_v + h) * n_ch + ch, of value head h (key head hk) of
 * sequence b, from token t0 = ch * DN_CHUNK */
struct wy_chunk {
    int64_t ci, ch, h, b, hk, t0;
};
static __device__ __forceinline__ struct wy_chunk wy_chunk_of(const struct wy_args &a, int64_t ci)
{
    const int64_t ch = ci % a.P.n_ch, h = ci / a.P.n_ch % a.L.hv;
    return {ci, ch, h, ci / a.P.n_ch / a.L.hv, h % a.L.hk, ch * WY_C};
}

/* a chunk's pieces of scratch (ci: (b * H_v + h) * n_ch + c) */
static __device__ __forceinline__ float *wy_vec(const struct wy_args &a, int64_t ci)
{
    return a.scr + a.P.off_vec + ci * 2 * WY_C; /* G [C], then beta [C] */
}
static __device__ __forceinline__ float *wy_cc(const struct wy_args &a, int64_t off, int64_t ci)
{
    return a.scr + off + ci * WY_C * WY_C; /* Ab, P or T, [C][C] */
}
static __device__ __forceinline__ float *wy_rows_k(const struct wy_args &a, int64_t off, int64_t ci)
{
    return a.scr + off + ci * WY_C * a.P.skp; /* Wk or G2, [C][skp] */
}
static __device__ __forceinline__ float *wy_rows_v(const struct wy_args &a, int64_t off, int64_t ci)
{
    return a.scr + off + ci * WY_C * a.P.svp; /* U or dR, [C][svp] */
}
static __device__ __forceinline__ float *wy_state(const struct wy_args &a, int64_t off, int64_t ci)
{
    return a.scr + off + ci * a.P.skp * a.P.svp; /* S0 or dS, [skp][svp] */
}

/* dst[r * ld + c] = src[r * sld + c] for r < rows, c < cols, from scratch into shared
 * memory by asynchronous 16-byte copies (cols, ld, sld multiples of 4 floats, both sides
 * 16-byte aligned: every scratch width and column offset here is a multiple of 16 floats).
 * Every thread issues all of its copies before any lands, so a fill waits one latency, not
 * one a batch of loads as cb_fill does; the caller ends with wy_async_wait() and a barrier. */
static __device__ __forceinline__ void wy_async(float *dst, int ld, const float *src, int64_t sld,
                                                int rows, int cols)
{
    const unsigned q = (unsigned)cols / 4, n = (unsigned)rows * q;
    for (unsigned e = threadIdx.x; e < n; e += blockDim.x) {
        const int r = (int)(e / q), c = (int)(e % q) * 4;
        __pipeline_memcpy_async(dst + r * ld + c, src + r * sld + c, 16);
    }
}

static __device__ __forceinline__ void wy_async_wait()
{
    __pipeline_commit();
    __pipeline_wait_prior(0);
}

/* X[r][i] (pitch ld) = t(i, h, t0 + r, b) for r < n, i < width (a multiple of 4, at most
 * ne0), zeros for rows n..WY_C, by 16-byte asynchronous copies (cu_rows16(t), the same for every
 * thread of a block: the kernels read any strides otherwise); the
 * caller ends with wy_async_wait() and a barrier. The prep and out kernels' loads of q, k
 * and v element by element (cu_getf's strides and type a float) were most of their
 * instructions (Nsight Compute, 16 x 512 tokens, H100: 70% of out's). */
static __device__ __forceinline__ void wy_src_async(float *X, int ld, const struct cu_t &t,
                                                    int64_t h, int64_t t0, int64_t b, int n,
                                                    int width)
{
    const unsigned q = (unsigned)width / 4, total = WY_C * q;
    const char *base = t.data + h * t.nb[1] + t0 * t.nb[2] + b * t.nb[3];
    for (unsigned e = threadIdx.x; e < total; e += blockDim.x) {
        const int r = (int)(e / q), c = (int)(e % q) * 4;
        if (r < n)
            __pipeline_memcpy_async(X + r * ld + c, base + r * t.nb[2] + c * 4, 16);
        else
            *(float4 *)(X + r * ld + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* cb_fill's contract (st(r, c, ld(r, c)) for r < rows, c < cols; warp w takes rows w,
 * w + 8, ..., lane l columns l, l + 32, ...) with WY_INFLIGHT (row, column group) items of
 * a warp in flight at once instead of CB_INFLIGHT rows of one column group: a chunk's keys
 * and queries together ([128 x 128]) are one round of loads a warp, not eight. For the
 * sources (any strides). */
#define WY_INFLIGHT 32
template <typename Ld, typename St>
static __device__ __forceinline__ void wy_fill(int rows, int cols, Ld ld, St st)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int groups = (cols + 31) / 32, my_rows = warp < rows ? (rows - 1 - warp) / nw + 1 : 0;
    const int items = my_rows * groups;
    for (int it0 = 0; it0 < items; it0 += WY_INFLIGHT) {
        float v[WY_INFLIGHT];
#pragma unroll
        for (int k = 0; k < WY_INFLIGHT; k++) {
            const int it = it0 + k, r = warp + it / groups * nw, c = lane + it % groups * 32;
            v[k] = it < items && c < cols ? ld(r, c) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < WY_INFLIGHT; k++) {
            const int it = it0 + k, r = warp + it / groups * nw, c = lane + it % groups * 32;
            if (it < items && c < cols)
                st(r, c, v[k]);
        }
    }
}

/* tokens in chunk ch (at most C) */
static __device__ __forceinline__ int wy_len(const struct dn_red &L, int64_t ch)
{
    const int64_t left = L.nt - ch * WY_C;
    return (int)(left < WY_C ? left : WY_C);
}

/* the sum of a row's partials over its WY_LPR lanes (every lane of the row gets it) */
static __device__ __forceinline__ float wy_row_sum(float x)
{
#pragma unroll
    for (int o = 1; o < WY_LPR; o <<= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Row r = threadIdx.x / WY_LPR of X . row r of Y over n columns, summed over the row's lanes
 * (every one gets it); the whole block calls it. */
static __device__ __forceinline__ float wy_row_dot(const float *X, int lx, const float *Y, int ly,
                                                   int n)
{
    const int r = threadIdx.x / WY_LPR, l = threadIdx.x % WY_LPR;
    float x = 0.0f;
    for (int j = l; j < n; j += WY_LPR)
        x = fmaf(X[r * lx + j], Y[r * ly + j], x);
    return wy_row_sum(x);
}

/* X = (I + diag(B) Ab)^-1 X in place on the 64 columns of X [C][lx], given At [C][lc] with
 * At[q][r] = B_r Ab_rq (Ab strictly lower, zeros elsewhere): a warp takes 8 columns, lane l
 * holding rows l and l + 32 of each in registers, and walks the pivots q in order: row q is
 * final, so it is broadcast and every row below takes its multiple away (as
 * delta_net_chunk.cu's cb_solve_cols). At is Ab's transpose so that a pivot's multipliers
 * are one row, read without bank conflicts (Ab's column at a pitch of 68 floats was a 4-way
 * conflict a load, and a product a load besides). */
static __device__ __forceinline__ void wy_solve64(const float *At, int lc, float *X, int lx)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    constexpr int CPW = WY_C / (DN_WY_THREADS / 32);
    float u0[CPW], u1[CPW];
#pragma unroll
    for (int k = 0; k < CPW; k++) {
        const int j = warp * CPW + k;
        u0[k] = X[lane * lx + j];
        u1[k] = X[(lane + 32) * lx + j];
    }
    for (int q = 0; q < WY_C; q++)
        cb_pivot<CPW>(u0, u1, At[q * lc + lane], At[q * lc + lane + 32], q);
#pragma unroll
    for (int k = 0; k < CPW; k++) {
        const int j = warp * CPW + k;
        X[lane * lx + j] = u0[k];
        X[(lane + 32) * lx + j] = u1[k];
    }
}

/* G (the chunk's inclusive sum of g, zeros past the tokens: G stays at its last value) and
 * beta (zeros past the tokens) of chunk [t0, t0 + n) into G and Bv; the block calls it and
 * finds them after its next barrier. Each warp scans its 32 by shuffles, then the second
 * half adds the first's total. */
static __device__ __forceinline__ void wy_gates(const struct dn_srcs &s, int64_t h, int64_t b,
                                                int64_t t0, int n, float *G, float *Bv)
{
    if (threadIdx.x < WY_C) {
        const int r = threadIdx.x;
        float x = r < n ? cu_getf(s.g, h, t0 + r, b, 0) : 0.0f;
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, x, o);
            if ((r & 31) >= o)
                x += y;
        }
        G[r] = x;
        Bv[r] = r < n ? cu_getf(s.beta, h, t0 + r, b, 0) : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x >= 32 && threadIdx.x < WY_C)
        G[threadIdx.x] += G[31];
}

/* ---- grad's pieces that both its kernels (TF32 and BF16) share ---- */

/* where a chunk's dq, dk rows (ld apart), dg and dbeta (ldg apart) go: the result with
 * H_v = H_k, else the (value head, sequence)'s partials */
struct wy_grad_dest {
    float *dq, *dk, *dg, *dbeta;
    int64_t ld, ldg;
};

static __device__ __forceinline__ wy_grad_dest wy_grad_dest_of(const struct wy_args &a, int64_t b,
                                                               int64_t h, int64_t hk, int64_t t0)
{
    const struct dn_red &L = a.L;
    wy_grad_dest d;
    if (a.P.direct) {
        const int64_t row = (b * L.nt + t0) * L.hk + hk;
        d.dq = a.out + L.off_q + row * L.sk;
        d.dk = a.out + L.off_k + row * L.sk;
        d.ld = L.hk * L.sk;
        d.dg = a.out + L.off_g + (b * L.nt + t0) * L.hv + h;
        d.dbeta = a.out + L.off_beta + (b * L.nt + t0) * L.hv + h;
        d.ldg = L.hv;
    } else {
        float *mine = a.scr + a.P.off_part + ((b * L.hv + h) * L.nt + t0) * a.P.part_per_token;
        d.dq = mine;
        d.dk = mine + L.sk;
        d.ld = a.P.part_per_token;
        d.dg = mine + 2 * L.sk;
        d.dbeta = d.dg + 1;
        d.ldg = a.P.part_per_token;
    }
    return d;
}

/* the chunk's vectors from its G and beta in scratch: G, e^G, El, beta, -e^G beta (threads
 * below C; the caller synchronises) */
static __device__ __forceinline__ void wy_grad_vectors(const float *gv, float *G, float *eG,
                                                       float *El, float *Bv, float *mEB)
{
    if (threadIdx.x < WY_C) {
        const int r = threadIdx.x;
        G[r] = gv[r];
        eG[r] = expf(gv[r]);
        El[r] = expf(gv[WY_C - 1] - gv[r]);
        Bv[r] = gv[WY_C + r];
        mEB[r] = -eG[r] * Bv[r];
    }
}

/* the gate terms of dP (row r gets M1_rs P_rs, column s loses it) and of dA (dbeta_r +=
 * sum_s M2_rs Ab_rs; row r gets beta_r M2_rs Ab_rs, column s loses it) into dgam and dB,
 * from M1, M2, P, Ab [C][lc]; the whole block calls it */
static __device__ __forceinline__ void wy_gate_terms(const float *M1, const float *M2,
                                                     const float *Pm, const float *Ab, int lc,
                                                     const float *Bv, float *dgam, float *dB)
{
    const int r = threadIdx.x / WY_LPR, l = threadIdx.x % WY_LPR;
    float x1 = 0.0f, y1 = 0.0f, x2 = 0.0f, y2 = 0.0f;
    for (int q = l; q <= r; q += WY_LPR)
        x1 = fmaf(M1[r * lc + q], Pm[r * lc + q], x1);
    for (int q = r + l; q < WY_C; q += WY_LPR)
        y1 = fmaf(M1[q * lc + r], Pm[q * lc + r], y1);
    for (int q = l; q < r; q += WY_LPR)
        x2 = fmaf(M2[r * lc + q], Ab[r * lc + q], x2);
    for (int q = r + 1 + l; q < WY_C; q += WY_LPR)
        y2 = fmaf(Bv[q] * M2[q * lc + r], Ab[q * lc + r], y2);
    x1 = wy_row_sum(x1);
    y1 = wy_row_sum(y1);
    x2 = wy_row_sum(x2);
    y2 = wy_row_sum(y2);
    if (l == 0) {
        dgam[r] = x1 - y1 + Bv[r] * x2 - y2;
        dB[r] = x2;
    }
}

/* dg (the suffix sums of dgam and the states' terms) and dbeta of the chunk's n rows, by
 * one thread: aq, au, aw are the row sums Do . (Q S0), U . (K dS), dR . (K S0), av dR . V,
 * ss <dS, S0> */
static __device__ __forceinline__ void
wy_gate_grads(const wy_grad_dest &d, int n, const float *G, const float *eG, const float *El,
              const float *mEB, const float *dgam, const float *dB, const float *aq,
              const float *au, const float *aw, const float *av, double ss)
{
    const int C = WY_C;
    /* the end state: x_r = El_r u_r . (K dS)_r goes to the last row and leaves row r;
     * e^{G_last} <dS, S0> to the last row */
    float tail = expf(G[C - 1]) * (float)ss;
    for (int r = 0; r < C; r++)
        tail += El[r] * au[r];
    float acc = 0.0f;
    for (int r = C - 1; r >= 0; r--) {
        /* O's state term e^G_r Do_r.(Q S0)_r; -x_r; dW_r . W_r = -e^G_r beta_r dR_r . W_r */
        float g = dgam[r] + eG[r] * aq[r] - El[r] * au[r] + mEB[r] * aw[r];
        if (r == C - 1)
            g += tail;
        acc += g;
        if (r < n) {
            d.dg[r * d.ldg] = acc;
            /* dbeta: the dA terms, then dR . X = dR . V - e^G_r dR . W */
            d.dbeta[r * d.ldg] = dB[r] + av[r] - eG[r] * aw[r];
        }
    }
}

/* The BF16 kernels (delta_net_wy_bf16.cu), each with the shared memory it asks for: grad
 * (S_k = S_v = 128), bwd and fwd (those widths and 64 columns a walk, or 128 with wide: a
 * block a head, wy_wide; fwd's FORWARD as dn_wy_fwd_kernel's), prep (those widths; FORWARD as
 * dn_wy_prep_kernel's) */
struct wy_kernel {
    void (*fn)(struct wy_args);
    size_t shared;
};
struct wy_kernel wy_bf16_grad(void);
struct wy_kernel wy_bf16_bwd(bool wide);
struct wy_kernel wy_bf16_fwd(bool forward, bool wide);
struct wy_kernel wy_bf16_prep(bool forward);

#endif
