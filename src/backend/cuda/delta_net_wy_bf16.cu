/* delta_net_wy_bf16.cu: the chunk-parallel DeltaNet kernels on BF16 tensor cores, for nodes of
 * LT_DELTA_NET_PREC_BF16 at Qwen3.5's widths (S_k = S_v = 128): the backward's grad kernel
 * and both state walks. Same algebra and scratch layout as their TF32 twins in
 * delta_net_wy.cu, whose launchers take these through wy_bf16_grad, wy_bf16_bwd and
 * wy_bf16_fwd (delta_net_wy_impl.h). */
#include <stdint.h>

#include "backend/cuda/delta_net_wy_impl.h"
#include "backend/cuda/mma_bf16.h"

/* ---- grad on BF16 tensor cores (LT_DELTA_NET_PREC_BF16, Qwen3.5's widths alone) ---- */

/* The grad kernel's algebra with every product's operands in shared memory as BF16 (F32
 * accumulation), read by ldmatrix and multiplied by mma.sync m16n8k16: one load instruction
 * feeds a 16 x 16 operand tile where the TF32 kernel above issues 4 to 8, and a k-step covers
 * 16 rows instead of 8. The TF32 kernel is issue-bound (Nsight Compute: one block of 16 warps
 * an SM, ~1.3 instructions a cycle, a third of them loads from shared memory). Each warp owns
 * one output strip of every product: rows 16 (w % 4).., columns (w / 4) times the strip's
 * width, so dq and dk build up in the same lanes' registers over all their products, and the
 * states' terms scale their rows in registers (diag(e^G) Do S0^T is e^G times Do S0^T's rows)
 * instead of from scaled copies. The row sums of the states' terms (Do . Q S0, U . K dS,
 * dR . K S0) come from the products' registers too, a partial a column strip, added in a
 * fixed order. What stays F32: the gate terms (M1, M2 with P and Ab), dv, dR . V, <dS, S0>. */
#define GB_C DN_CHUNK
#define GB_S WYF_S
#define GB_PB (GB_S + 8) /* BF16 pitch of 128-wide rows: 16 bytes mod 128, no bank conflicts */
#define GB_PC (GB_C + 8) /* of 64-wide rows */
#define GB_LF (GB_C + 4) /* F32 pitch of 64-wide rows */
/* shared bytes: Do, U, dR, Q, K [C][PB]; M1e, M2e [C][PC]; a region of either M1, M2, P, Ab
 * (F32 [C][LF]) or S0, dS (BF16 [S][PB]); 8 vectors of C; 3 x 4 row partials of C */
#define GB_REGION                                                                                  \
    (4 * GB_C * GB_LF * 4 > 2 * GB_S * GB_PB * 2 ? 4 * GB_C * GB_LF * 4 : 2 * GB_S * GB_PB * 2)
#define GB_SHARED                                                                                  \
    (5 * GB_C * GB_PB * 2 + 2 * GB_C * GB_PC * 2 + GB_REGION + 8 * GB_C * 4 + 12 * GB_C * 4)
static_assert(GB_SHARED <= DN_CBACK_MAX_SHARED, "grad's BF16 kernel fits one block an SM");
static_assert(DN_WY_THREADS == 512, "grad's BF16 kernel: 16 warps, 4 row strips by 4 column");

typedef __nv_bfloat16 gb_t;

/* c[u] (16 x 8 tiles at columns n0 + 8 u, u < NT) += A(rows m0.., k < K) B(k < K, those
 * columns); A(m, k) = A[m][k], or A[k][m] with AT; B(k, n) = B[k][n], or B[n][k] with BNK */
template <int NT, bool AT, bool BNK>
static __device__ __forceinline__ void gb_mm(float (*c)[4], const gb_t *A, int lda, const gb_t *B,
                                             int ldb, int m0, int n0, int K)
{
#pragma unroll 4
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t af[4];
        if (AT)
            mb_load_a_km(af, A, lda, m0, k0);
        else
            mb_load_a(af, A, lda, m0, k0);
#pragma unroll
        for (int u = 0; u < NT; u += 2) {
            uint32_t bf[4];
            if (BNK)
                mb_load_b_nk(bf, B, ldb, k0, n0 + 8 * u);
            else
                mb_load_b_kn(bf, B, ldb, k0, n0 + 8 * u);
            mb_mma(c[u], af, bf);
            mb_mma(c[u + 1], af, bf + 2);
        }
    }
}

template <int NT> static __device__ __forceinline__ void gb_zero(float (*c)[4])
{
#pragma unroll
    for (int u = 0; u < NT; u++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            c[u][i] = 0.0f;
}

/* X[r][j] (pitch PITCH) = BF16 of ld(r, j) for r < rows (a multiple of 16), j < W (a
 * multiple of 64) in pairs, WY_INFLIGHT / 2 pairs of a warp in flight: warp w takes rows w,
 * w + 16, ..., lane l the pairs l, l + 32, ... */
template <int W, int PITCH, typename Ld>
static __device__ __forceinline__ void gb_fill_w(gb_t *X, int rows, Ld ld)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = DN_WY_THREADS / 32;
    constexpr int GROUPS = W / 64;
    const int items = (rows / nw) * GROUPS;
    for (int it0 = 0; it0 < items; it0 += WY_INFLIGHT / 2) {
        float v[WY_INFLIGHT / 2][2];
#pragma unroll
        for (int k = 0; k < WY_INFLIGHT / 2; k++) {
            const int it = it0 + k, r = warp + it / GROUPS * nw, j = 2 * (lane + it % GROUPS * 32);
            v[k][0] = it < items ? ld(r, j) : 0.0f;
            v[k][1] = it < items ? ld(r, j + 1) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < WY_INFLIGHT / 2; k++) {
            const int it = it0 + k, r = warp + it / GROUPS * nw, j = 2 * (lane + it % GROUPS * 32);
            if (it < items)
                *(uint32_t *)(X + r * PITCH + j) = mb_pack(v[k][0], v[k][1]);
        }
    }
}

/* the loader gb_fill_w takes for a chunk's rows of a source: t(i, hd, t0 + r, b) for r < n,
 * zeros past the tokens */
struct gb_rows {
    const struct cu_t *t;
    int64_t hd, t0, b;
    int n;
    __device__ __forceinline__ float operator()(int r, int i) const
    {
        return r < n ? cu_getf(*t, i, hd, t0 + r, b) : 0.0f;
    }
};

/* this lane's partial of row sums sum_j X[r][j] Y(r, j) over its strip (Y the product's tiles
 * at columns n0..), rows m0 + g and m0 + g + 8, summed over the 4 lanes of a row; lane t = 0
 * stores them at part[row] */
template <int NT>
static __device__ __forceinline__ void gb_row_part(const float (*y)[4], const gb_t *X, int m0,
                                                   int n0, float *part)
{
    const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int u = 0; u < NT; u++) {
        const int j = n0 + 8 * u + 2 * t;
        /* a register of two BF16s: the low one is the lower column; a BF16 is an F32's top half */
        const uint32_t x0 = *(const uint32_t *)(X + (m0 + g) * GB_PB + j),
                       x1 = *(const uint32_t *)(X + (m0 + g + 8) * GB_PB + j);
        s0 = fmaf(__uint_as_float(x0 << 16), y[u][0],
                  fmaf(__uint_as_float(x0 & 0xffff0000u), y[u][1], s0));
        s1 = fmaf(__uint_as_float(x1 << 16), y[u][2],
                  fmaf(__uint_as_float(x1 & 0xffff0000u), y[u][3], s1));
    }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, o);
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
    }
    if (t == 0) {
        part[m0 + g] = s0;
        part[m0 + g + 8] = s1;
    }
}

/* acc[u] += rs(row) c[u] for this lane's rows m0 + g, m0 + g + 8 */
template <int NT>
static __device__ __forceinline__ void gb_add_rows(float (*acc)[4], const float (*c)[4],
                                                   const float *rs, int m0)
{
    const int g = (threadIdx.x & 31) / 4;
    const float r0 = rs[m0 + g], r1 = rs[m0 + g + 8];
#pragma unroll
    for (int u = 0; u < NT; u++) {
        acc[u][0] = fmaf(r0, c[u][0], acc[u][0]);
        acc[u][1] = fmaf(r0, c[u][1], acc[u][1]);
        acc[u][2] = fmaf(r1, c[u][2], acc[u][2]);
        acc[u][3] = fmaf(r1, c[u][3], acc[u][3]);
    }
}

static __global__ void __launch_bounds__(DN_WY_THREADS, 1) dn_wy_grad_bf16_kernel(struct wy_args a)
{
    extern __shared__ __align__(128) float sh[];
    __shared__ double red[32];
    constexpr int C = GB_C, S = GB_S, PB = GB_PB, PC = GB_PC, LF = GB_LF;
    const struct dn_red &L = a.L;
    const struct dn_wy_plan &P = a.P;
    const struct wy_chunk ck = wy_chunk_of(a, blockIdx.x);
    const int64_t ci = ck.ci, ch = ck.ch, h = ck.h, b = ck.b, hk = ck.hk, t0 = ck.t0;
    const int n = wy_len(L, ch);
    gb_t *Do = (gb_t *)sh, *U = Do + C * PB, *dR = U + C * PB, *Q = dR + C * PB, *K = Q + C * PB,
         *M1e = K + C * PB, *M2e = M1e + C * PC;
    float *R = (float *)(M2e + C * PC);
    float *M1 = R, *M2 = M1 + C * LF, *Pm = M2 + C * LF, *Ab = Pm + C * LF;
    gb_t *S0 = (gb_t *)R, *dS = S0 + S * PB;
    float *G = R + GB_REGION / 4, *eG = G + C, *El = eG + C, *Bv = El + C, *mEB = Bv + C,
          *dgam = mEB + C, *dB = dgam + C, *av = dB + C, *part = av + C; /* part [3][4][C] */
    const wy_grad_dest dst = wy_grad_dest_of(a, b, h, hk, t0);
    wy_grad_vectors(wy_vec(a, ci), G, eG, El, Bv, mEB);
    const float *gu = wy_rows_v(a, P.off_u, ci), *gdr = wy_rows_v(a, P.off_dr, ci);
    wy_async(Pm, LF, wy_cc(a, P.off_p, ci), C, C, C);
    wy_async(Ab, LF, wy_cc(a, P.off_ab, ci), C, C, C);
    gb_fill_w<S, PB>(Do, C, [&](int r, int j) {
        return r < n ? a.scale * cu_getf(a.grad, j, h, t0 + r, b) : 0.0f;
    });
    gb_fill_w<S, PB>(U, C, [&](int r, int j) { return gu[r * S + j]; });
    gb_fill_w<S, PB>(dR, C, [&](int r, int j) { return gdr[r * S + j]; });
    gb_fill_w<S, PB>(Q, C, gb_rows{&a.s.q, hk, t0, b, n});
    gb_fill_w<S, PB>(K, C, gb_rows{&a.s.k, hk, t0, b, n});
    wy_async_wait();
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int m0 = warp % 4 * 16, cg = warp / 4;
    /* dv = B dR and dR . V (dbeta's part), from the F32 rows in scratch, a warp's 4 rows at
     * once */
    {
        float *dv = a.out + L.off_v + ((b * L.nt + t0) * L.hv + h) * L.sv;
        const int ldo = (int)(L.hv * L.sv);
        constexpr int RW = C / (DN_WY_THREADS / 32);
        float x[RW];
#pragma unroll
        for (int q = 0; q < RW; q++) {
            const int r = warp + 16 * q;
            x[q] = 0.0f;
            if (r < n)
                for (int j = lane; j < S; j += 32) {
                    const float d = gdr[r * S + j];
                    dv[r * ldo + j] = Bv[r] * d;
                    x[q] = fmaf(d, cu_getf(a.s.v, j, h, t0 + r, b), x[q]);
                }
        }
#pragma unroll
        for (int q = 0; q < RW; q++) {
            for (int o = 16; o > 0; o >>= 1)
                x[q] += __shfl_xor_sync(0xffffffffu, x[q], o);
            if (lane == 0)
                av[warp + 16 * q] = warp + 16 * q < n ? x[q] : 0.0f;
        }
    }
    /* M1 = Do U^T, M2 = -dR U^T (64 x 64: a warp's strip is 16 x 16), F32 for the gate terms */
    {
        float c1[2][4], c2[2][4];
        gb_zero<2>(c1);
        gb_zero<2>(c2);
        gb_mm<2, false, true>(c1, Do, PB, U, PB, m0, cg * 16, S);
        gb_mm<2, false, true>(c2, dR, PB, U, PB, m0, cg * 16, S);
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = m0 + g + 8 * (i / 2), q = cg * 16 + 8 * u + 2 * t + i % 2;
                M1[r * LF + q] = c1[u][i];
                M2[r * LF + q] = -c2[u][i];
            }
    }
    __syncthreads();
    wy_gate_terms(M1, M2, Pm, Ab, LF, Bv, dgam, dB);
    /* M1 o E on s <= r (dQK), M2 o B E on s < r (dKK), as BF16 operands */
    for (int e = threadIdx.x; e < C * C / 2; e += blockDim.x) {
        const int r = e / (C / 2), q = 2 * (e % (C / 2));
        float m1[2], m2[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int s = q + i;
            const float d = s <= r ? expf(G[r] - G[s]) : 0.0f;
            m1[i] = s <= r ? M1[r * LF + s] * d : 0.0f;
            m2[i] = s < r ? M2[r * LF + s] * Bv[r] * d : 0.0f;
        }
        *(uint32_t *)(M1e + r * PC + q) = mb_pack(m1[0], m1[1]);
        *(uint32_t *)(M2e + r * PC + q) = mb_pack(m2[0], m2[1]);
    }
    __syncthreads();
    /* S0 and dS over the region (M1, M2, P, Ab are read), as BF16; <dS, S0> in F32 */
    double ss = 0.0;
    {
        const float *gs0 = wy_state(a, P.off_s0, ci), *gds = wy_state(a, P.off_ds, ci);
        constexpr int QUADS = S * S / 4 / DN_WY_THREADS, BATCH = 4;
#pragma unroll
        for (int q0 = 0; q0 < QUADS; q0 += BATCH) {
            float4 x[BATCH], y[BATCH];
#pragma unroll
            for (int k = 0; k < BATCH; k++) {
                const int e = (q0 + k) * DN_WY_THREADS + threadIdx.x;
                x[k] = ((const float4 *)gs0)[e];
                y[k] = ((const float4 *)gds)[e];
            }
#pragma unroll
            for (int k = 0; k < BATCH; k++) {
                const int e = (q0 + k) * DN_WY_THREADS + threadIdx.x, i = e / (S / 4),
                          j = 4 * (e % (S / 4));
                ss += (double)x[k].x * y[k].x + (double)x[k].y * y[k].y + (double)x[k].z * y[k].z +
                      (double)x[k].w * y[k].w;
                uint2 px, py;
                px.x = mb_pack(x[k].x, x[k].y);
                px.y = mb_pack(x[k].z, x[k].w);
                py.x = mb_pack(y[k].x, y[k].y);
                py.y = mb_pack(y[k].z, y[k].w);
                *(uint2 *)(S0 + i * PB + j) = px;
                *(uint2 *)(dS + i * PB + j) = py;
            }
        }
    }
    /* dq = dQK K, dk = dQK^T Q + dKK K + dKK^T K (a warp's strip: 16 x 32) */
    const int n0 = cg * 32;
    float DQ[4][4], DK[4][4], Y[4][4];
    gb_zero<4>(DQ);
    gb_zero<4>(DK);
    gb_mm<4, false, false>(DQ, M1e, PC, K, PB, m0, n0, C);
    gb_mm<4, true, false>(DK, M1e, PC, Q, PB, m0, n0, C);
    gb_mm<4, false, false>(DK, M2e, PC, K, PB, m0, n0, C);
    gb_mm<4, true, false>(DK, M2e, PC, K, PB, m0, n0, C);
    __syncthreads(); /* S0 and dS have landed */
    /* the states' terms: row sums Do . (Q S0), U . (K dS), dR . (K S0); then dq += diag(e^G)
     * Do S0^T, dk += diag(El) U dS^T - diag(e^G beta) dR S0^T */
    gb_zero<4>(Y);
    gb_mm<4, false, false>(Y, Q, PB, S0, PB, m0, n0, S);
    gb_row_part<4>(Y, Do, m0, n0, part + (0 * 4 + cg) * C);
    gb_zero<4>(Y);
    gb_mm<4, false, false>(Y, K, PB, dS, PB, m0, n0, S);
    gb_row_part<4>(Y, U, m0, n0, part + (1 * 4 + cg) * C);
    gb_zero<4>(Y);
    gb_mm<4, false, false>(Y, K, PB, S0, PB, m0, n0, S);
    gb_row_part<4>(Y, dR, m0, n0, part + (2 * 4 + cg) * C);
    gb_zero<4>(Y);
    gb_mm<4, false, true>(Y, Do, PB, S0, PB, m0, n0, S);
    gb_add_rows<4>(DQ, Y, eG, m0);
    gb_zero<4>(Y);
    gb_mm<4, false, true>(Y, U, PB, dS, PB, m0, n0, S);
    gb_add_rows<4>(DK, Y, El, m0);
    gb_zero<4>(Y);
    gb_mm<4, false, true>(Y, dR, PB, S0, PB, m0, n0, S);
    gb_add_rows<4>(DK, Y, mEB, m0);
    /* dq, dk to the result (rows < n, columns < S_k = 128: all) */
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = m0 + g + 8 * hf, i = n0 + 8 * u + 2 * t;
            if (r < n) {
                *(float2 *)(dst.dq + r * dst.ld + i) =
                    make_float2(DQ[u][2 * hf], DQ[u][2 * hf + 1]);
                *(float2 *)(dst.dk + r * dst.ld + i) =
                    make_float2(DK[u][2 * hf], DK[u][2 * hf + 1]);
            }
        }
    ss = cu_block_sum(ss, red); /* synchronises the block: the partials are in */
    /* a row's sums over the 4 column strips, in order, into the first strip's place */
    if (threadIdx.x < 3 * C) {
        const int k = threadIdx.x / C, r = threadIdx.x % C;
        float x = 0.0f;
        for (int c = 0; c < 4; c++)
            x += part[(k * 4 + c) * C + r];
        part[k * 4 * C + r] = x;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        wy_gate_grads(dst, n, G, eG, El, mEB, dgam, dB, part, part + 4 * C, part + 8 * C, av, ss);
}

/* ---- bwd on BF16 tensor cores (LT_DELTA_NET_PREC_BF16, Qwen3.5's widths, 64 columns) ---- */

/* The bwd walk with the state gradient dS in the warps' registers (F32) for the whole walk:
 * warp w owns rows 16 (w % 8).. and columns 32 (w / 8).. of the block's [128 x 64], so the
 * update dS = eL dS + [Q; K]^T Z scales and adds into the same registers every chunk, and
 * each chunk's products (dR = F Do + G2 dS, then that update) read BF16 operands by
 * ldmatrix: dS itself as a BF16 copy the warps write next to its F32 store to scratch. CV
 * columns a block: the plan's 64, or a head's 128 (wy_wide), as the fwd walk below. */
#define BW_PF (GB_C + 8) /* BF16 pitch of F's 64-wide rows */
/* shared bytes: dS [S][CV + 8]; Q over K [2C][PB]; F [C][PF]; G2 [C][PB]; Z [2C][CV + 8]
 * (e^G Do over -e^G beta dR); Do [C][CV + 8]; vectors eG, mEB */
#define BW_SHARED(CV)                                                                              \
    (GB_S * ((CV) + 8) * 2 + 2 * GB_C * GB_PB * 2 + GB_C * BW_PF * 2 + GB_C * GB_PB * 2 +          \
     3 * GB_C * ((CV) + 8) * 2 + 2 * GB_C * 4)

/* A BF16 walk's warp of a block of CV state columns (64, or 128 for the wide fwd walk): its
 * lane's group g and thread t in the mma fragments, its strip of the [128 x CV] state (rows
 * sm0.. 16, columns sn0.. CV / 2) and of a chunk's [64 x CV] product (rows rm0.. 16, columns
 * rn0.. CV / 4). */
struct bw_warp {
    int g, t, sm0, sn0, rm0, rn0;
};
template <int CV = WYF_CV> static __device__ __forceinline__ struct bw_warp bw_warp_of(void)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    return {lane / 4,      lane % 4,           warp % 8 * 16, warp / 8 * (CV / 2),
            warp % 4 * 16, warp / 4 * (CV / 4)};
}

/* a walk's state strip in registers (rows sm0 + g (+ 8), columns sn0 + 8 u + 2 t (+ 1), u <
 * CV / 16) to scratch as F32 (the block's columns from j0 of a [S][S] state) and to X
 * [S][CV + 8] as BF16 */
template <int CV = WYF_CV>
static __device__ __forceinline__ void bw_store_state(const float (*st)[4], float *gs, gb_t *X,
                                                      int sm0, int sn0, int j0)
{
    const int g = (threadIdx.x & 31) / 4, t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < CV / 16; u++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int i = sm0 + g + 8 * hf, jj = sn0 + 8 * u + 2 * t;
            *(float2 *)(gs + i * GB_S + j0 + jj) = make_float2(st[u][2 * hf], st[u][2 * hf + 1]);
            *(uint32_t *)(X + i * (CV + 8) + jj) = mb_pack(st[u][2 * hf], st[u][2 * hf + 1]);
        }
}

template <int CV>
static __global__ void __launch_bounds__(DN_WY_THREADS, 1) dn_wy_bwd_bf16_kernel(struct wy_args a)
{
    extern __shared__ __align__(128) float sh[];
    constexpr int C = GB_C, S = GB_S, PB = GB_PB, PV = CV + 8, PF = BW_PF, NS = CV / 16,
                  NU = CV / 32;
    const struct dn_red &L = a.L;
    const struct dn_wy_plan &P = a.P;
    const struct wy_walk w = wy_walk_of(a, P.svp / CV); /* column blocks of CV */
    const int64_t c = w.c, h = w.h, b = w.b, hk = w.hk;
    const int j0 = (int)c * CV;
    gb_t *dSb = (gb_t *)sh, *QK = dSb + S * PV, *F = QK + 2 * C * PB, *G2 = F + C * PF,
         *Z = G2 + C * PB;
    gb_t *Do = Z + 2 * C * PV;
    float *eG = (float *)(Do + C * PV), *mEB = eG + C;
    /* this warp's strips: of dS (16 x CV / 2) and of dR (16 x CV / 4) */
    const struct bw_warp wp = bw_warp_of<CV>();
    const int g = wp.g, t = wp.t, sm0 = wp.sm0, sn0 = wp.sn0, rm0 = wp.rm0, rn0 = wp.rn0;
    float DS[NS][4];
#pragma unroll
    for (int u = 0; u < NS; u++)
#pragma unroll
        for (int i = 0; i < 4; i++) /* the final state's gradient: rows T.. of grad (or 0) */
            DS[u][i] = a.grad.ne[2] > L.nt ? cu_getf(a.grad, j0 + sn0 + 8 * u + 2 * t + i % 2, h,
                                                     L.nt + sm0 + g + 8 * (i / 2), b)
                                           : 0.0f;
    for (int64_t ch = P.n_ch - 1; ch >= 0; ch--) {
        const int64_t ci = (b * L.hv + h) * P.n_ch + ch, t0 = ch * C;
        const int n = wy_len(L, ch);
        float *gds = wy_state(a, P.off_ds, ci), *gdr = wy_rows_v(a, P.off_dr, ci);
        const float *gf = wy_cc(a, P.off_f, ci), *gg2 = wy_rows_k(a, P.off_g2, ci),
                    *gv = wy_vec(a, ci);
        /* dS at the chunk's end: F32 to scratch, BF16 for G2 dS */
        bw_store_state<CV>(DS, gds, dSb, sm0, sn0, j0);
        if (threadIdx.x < C) {
            const int r = threadIdx.x;
            eG[r] = expf(gv[r]);
            mEB[r] = -eG[r] * gv[C + r];
        }
        gb_fill_w<S, PB>(QK, 2 * C, [&](int r, int i) {
            const int rr = r % C;
            return rr < n ? cu_getf(r < C ? a.s.q : a.s.k, i, hk, t0 + rr, b) : 0.0f;
        });
        gb_fill_w<S, PB>(G2, C, [&](int r, int i) { return gg2[r * S + i]; });
        gb_fill_w<C, PF>(F, C, [&](int r, int q) { return gf[r * C + q]; });
        __syncthreads(); /* eG */
        {
            /* Do (the output's gradient times scale) and Z's top e^G Do: pairs of columns,
             * a warp a row at a time, 4 pairs of a thread in flight (all 8 of the wide
             * walk's at once spilled 72 bytes a thread; this way 20 remain, its dS and dR
             * strips taking 48 registers) */
            constexpr int NP = C * CV / 2 / DN_WY_THREADS, NF = 4;
            static_assert(NP % NF == 0, "whole rounds of pairs");
#pragma unroll
            for (int k0 = 0; k0 < NP; k0 += NF) {
                float v[NF][2];
#pragma unroll
                for (int k = 0; k < NF; k++) {
                    const int e = (k0 + k) * DN_WY_THREADS + threadIdx.x, r = e / (CV / 2),
                              jj = 2 * (e % (CV / 2));
                    v[k][0] = r < n ? a.scale * cu_getf(a.grad, j0 + jj, h, t0 + r, b) : 0.0f;
                    v[k][1] = r < n ? a.scale * cu_getf(a.grad, j0 + jj + 1, h, t0 + r, b) : 0.0f;
                }
#pragma unroll
                for (int k = 0; k < NF; k++) {
                    const int e = (k0 + k) * DN_WY_THREADS + threadIdx.x, r = e / (CV / 2),
                              jj = 2 * (e % (CV / 2));
                    *(uint32_t *)(Do + r * PV + jj) = mb_pack(v[k][0], v[k][1]);
                    *(uint32_t *)(Z + r * PV + jj) = mb_pack(eG[r] * v[k][0], eG[r] * v[k][1]);
                }
            }
        }
        __syncthreads();
        /* dR = T^T (P^T Do + diag(El) K dS) = F Do + G2 dS */
        float R[NU][4];
        gb_zero<NU>(R);
        gb_mm<NU, false, false>(R, F, PF, Do, PV, rm0, rn0, C);
        gb_mm<NU, false, false>(R, G2, PB, dSb, PV, rm0, rn0, S);
        const float eL = expf(gv[C - 1]);
#pragma unroll
        for (int u = 0; u < NU; u++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int r = rm0 + g + 8 * hf, jj = rn0 + 8 * u + 2 * t;
                *(float2 *)(gdr + r * S + j0 + jj) = make_float2(R[u][2 * hf], R[u][2 * hf + 1]);
                *(uint32_t *)(Z + (C + r) * PV + jj) =
                    mb_pack(mEB[r] * R[u][2 * hf], mEB[r] * R[u][2 * hf + 1]);
            }
        __syncthreads();
        /* dS = eL dS + [Q; K]^T Z */
#pragma unroll
        for (int u = 0; u < NS; u++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                DS[u][i] *= eL;
        gb_mm<NS, true, false>(DS, QK, PB, Z, PV, sm0, sn0, 2 * C);
        __syncthreads(); /* before the next chunk's operands land */
    }
    float *dstate = a.out + L.off_state;
#pragma unroll
    for (int u = 0; u < NS; u++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            dstate[((b * L.hv + h) * L.sk + sm0 + g + 8 * (i / 2)) * L.sv + j0 + sn0 + 8 * u +
                   2 * t + i % 2] = DS[u][i];
}

/* ---- fwd on BF16 tensor cores (LT_DELTA_NET_PREC_BF16, Qwen3.5's widths, 64 columns) ---- */

/* The fwd walk with the state in the warps' registers (F32) for the whole walk, as the bwd
 * one above: warp w owns rows 16 (w % 8).. and columns CV / 2 (w / 8).. of the block's
 * [128 x CV]; U = Uv - Wk S0 starts from Uv in the registers of its strip (16 x CV / 4 a
 * warp) and reads S0 as a BF16 copy; S = eL S + K^T diag(El) U adds into the state's
 * registers. FORWARD (DELTA_NET): the state after the last chunk goes to the result's rows
 * T.. too. CV: the plan's 64 columns a block, or the wide walk's 128 (every column of a
 * head: wy_wide), which loads each chunk's Wk and K once where two blocks of 64 loaded them
 * twice, and walks half as many blocks (at 16 x 512 tokens, 16 heads: 256 blocks against 512,
 * two rounds of an H100's 132 SMs against four, each round a sequential walk of 8 chunks).
 * Each output element's products and sums are the same in either width. */
/* shared bytes: S0 [S][CV + 8]; Wk, K [C][PB]; El U [C][CV + 8]; vector El */
#define FW_SHARED(CV)                                                                              \
    (GB_S * ((CV) + 8) * 2 + 2 * GB_C * GB_PB * 2 + GB_C * ((CV) + 8) * 2 + GB_C * 4)

template <bool FORWARD, int CV>
static __global__ void __launch_bounds__(DN_WY_THREADS, 1) dn_wy_fwd_bf16_kernel(struct wy_args a)
{
    extern __shared__ __align__(128) float sh[];
    constexpr int C = GB_C, S = GB_S, PB = GB_PB, PV = CV + 8, NS = CV / 16, NU = CV / 32;
    const struct dn_red &L = a.L;
    const struct dn_wy_plan &P = a.P;
    const struct wy_walk w = wy_walk_of(a, P.svp / CV); /* column blocks of CV */
    const int64_t c = w.c, h = w.h, b = w.b, hk = w.hk;
    const int j0 = (int)c * CV;
    gb_t *S0b = (gb_t *)sh, *Wk = S0b + S * PV, *K = Wk + C * PB, *UE = K + C * PB;
    float *El = (float *)(UE + C * PV);
    const struct bw_warp wp = bw_warp_of<CV>();
    const int g = wp.g, t = wp.t, sm0 = wp.sm0, sn0 = wp.sn0, rm0 = wp.rm0, rn0 = wp.rn0;
    float SS[NS][4];
#pragma unroll
    for (int u = 0; u < NS; u++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            SS[u][i] =
                cu_getf(a.s.state, j0 + sn0 + 8 * u + 2 * t + i % 2, sm0 + g + 8 * (i / 2), h, b);
    for (int64_t ch = 0; ch < P.n_ch; ch++) {
        const int64_t ci = (b * L.hv + h) * P.n_ch + ch, t0 = ch * C;
        const int n = wy_len(L, ch);
        float *gs = wy_state(a, P.off_s0, ci), *gu = wy_rows_v(a, P.off_u, ci);
        const float *gwk = wy_rows_k(a, P.off_wk, ci), *gv = wy_vec(a, ci);
        /* S0: F32 to scratch, BF16 for Wk S0 */
        bw_store_state<CV>(SS, gs, S0b, sm0, sn0, j0);
        if (threadIdx.x < C)
            El[threadIdx.x] = expf(gv[C - 1] - gv[threadIdx.x]);
        gb_fill_w<S, PB>(Wk, C, [&](int r, int i) { return gwk[r * S + i]; });
        gb_fill_w<S, PB>(K, C, gb_rows{&a.s.k, hk, t0, b, n});
        /* this warp's strip of Uv */
        float2 uv[NU][2];
#pragma unroll
        for (int u = 0; u < NU; u++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                uv[u][hf] =
                    *(const float2 *)(gu + (rm0 + g + 8 * hf) * S + j0 + rn0 + 8 * u + 2 * t);
        __syncthreads();
        /* U = Uv - Wk S0: to scratch, and El U as the state update's operand */
        float W[NU][4];
        gb_zero<NU>(W);
        gb_mm<NU, false, false>(W, Wk, PB, S0b, PV, rm0, rn0, S);
#pragma unroll
        for (int u = 0; u < NU; u++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int r = rm0 + g + 8 * hf, jj = rn0 + 8 * u + 2 * t;
                const float x0 = uv[u][hf].x - W[u][2 * hf], x1 = uv[u][hf].y - W[u][2 * hf + 1];
                *(float2 *)(gu + r * S + j0 + jj) = make_float2(x0, x1);
                *(uint32_t *)(UE + r * PV + jj) = mb_pack(El[r] * x0, El[r] * x1);
            }
        __syncthreads();
        /* S = eL S + K^T diag(El) U */
        const float eL = expf(gv[C - 1]);
#pragma unroll
        for (int u = 0; u < NS; u++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                SS[u][i] *= eL;
        gb_mm<NS, true, false>(SS, K, PB, UE, PV, sm0, sn0, C);
        __syncthreads(); /* before the next chunk's operands land */
    }
    if (FORWARD) { /* S[i][j] at row T + i of DELTA_NET's result [S_v, H_v, T + S_k, B] */
        float *so = a.out + ((b * (L.nt + L.sk) + L.nt) * L.hv + h) * L.sv + j0;
        const int64_t ldo = L.hv * L.sv;
#pragma unroll
        for (int u = 0; u < NS; u++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                so[(sm0 + g + 8 * (i / 2)) * ldo + sn0 + 8 * u + 2 * t + i % 2] = SS[u][i];
    }
}

/* ---- prep on BF16 tensor cores ---- */

/* The prep kernel's algebra (delta_net_wy.cu) with its six products on BF16 tensor cores
 * (F32 accumulation): Ab = K K^T and P = Q K^T, then Uv = T (B V), Wk = T (B e^G K) and,
 * backward, F = T^T P^T and G2 = T^T (El K). The TF32 kernel spent about a third of its
 * instructions in its products (Nsight Compute, 16 x 512 tokens, H100, after its loads went
 * to cp.async) and a quarter in the element-wise passes between them; here the operands are
 * rounded to BF16 once, scaled as they arrive from the sources (the gates come first), Ab and
 * P are gated and masked in the registers of the product that made them and leave from
 * there, and every product reads its tiles by ldmatrix. What stays F32: the gates, T's
 * substitution (on At, Ab's transpose scaled by beta, as the TF32 kernel's) and every value
 * written to scratch. Each warp owns rows 16 (w % 4).. and, of a product of 64 columns,
 * columns 16 (w / 4)..; of one of 128, columns 32 (w / 4).. */
#define PB_SHARED                                                                                  \
    (5 * GB_C * GB_PB * 2 + 2 * GB_C * GB_PC * 2 + 2 * GB_C * GB_LF * 4 + 4 * GB_C * 4)
static_assert(PB_SHARED <= DN_CBACK_MAX_SHARED, "prep's BF16 kernel fits one block an SM");

/* the F32 tiles c (NT of 16 x 8 at columns n0 + 8 u, rows m0..) into dst [..][ld] */
template <int NT>
static __device__ __forceinline__ void pb_store(float *dst, int ld, const float (*c)[4], int m0,
                                                int n0)
{
    const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int u = 0; u < NT; u++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            *(float2 *)(dst + (m0 + g + 8 * hf) * ld + n0 + 8 * u + 2 * t) =
                make_float2(c[u][2 * hf], c[u][2 * hf + 1]);
}

/* four floats as BF16s at X (8 bytes) */
static __device__ __forceinline__ void pb_put4(gb_t *X, float4 v)
{
    *(uint2 *)X = make_uint2(mb_pack(v.x, v.y), mb_pack(v.z, v.w));
}

static __device__ __forceinline__ float4 pb_scale(float4 v, float f)
{
    return make_float4(v.x * f, v.y * f, v.z * f, v.w * f);
}

/* K, Q, V of the chunk's n tokens into Kb, Qb, Vb (B V), BK (B e^G K) and, backward, EK
 * (El K), BF16 [C][PB], zeros past the tokens: by float4 loads where the sources' rows allow
 * (cu_rows16), each thread's 12 in flight at once, else element by element */
template <bool FORWARD>
static __device__ __forceinline__ void pb_operands(const struct wy_args &a, int64_t h, int64_t hk,
                                                   int64_t b, int64_t t0, int n, const float *Bv,
                                                   const float *eG, const float *El, gb_t *Kb,
                                                   gb_t *Qb, gb_t *Vb, gb_t *BK, gb_t *EK)
{
    constexpr int C = GB_C, S = GB_S, PB = GB_PB, Q4 = S / 4, ITEMS = 3 * C * Q4 / DN_WY_THREADS;
    if (cu_rows16(a.s.k) && cu_rows16(a.s.q) && cu_rows16(a.s.v)) {
        float4 v[ITEMS];
#pragma unroll
        for (int k = 0; k < ITEMS; k++) {
            const int e = threadIdx.x + k * DN_WY_THREADS, which = e / (C * Q4),
                      r = e % (C * Q4) / Q4, c4 = e % Q4;
            const struct cu_t &src = which == 0 ? a.s.k : which == 1 ? a.s.q : a.s.v;
            const int64_t head = which == 2 ? h : hk;
            v[k] = r < n ? *(const float4 *)(src.data + head * src.nb[1] + (t0 + r) * src.nb[2] +
                                             b * src.nb[3] + c4 * 16)
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < ITEMS; k++) {
            const int e = threadIdx.x + k * DN_WY_THREADS, which = e / (C * Q4),
                      r = e % (C * Q4) / Q4, at = r * PB + 4 * (e % Q4);
            if (which == 0) {
                pb_put4(Kb + at, v[k]);
                pb_put4(BK + at, pb_scale(pb_scale(v[k], Bv[r]), eG[r]));
                if (!FORWARD)
                    pb_put4(EK + at, pb_scale(v[k], El[r]));
            } else if (which == 1) {
                pb_put4(Qb + at, v[k]);
            } else {
                pb_put4(Vb + at, pb_scale(v[k], Bv[r]));
            }
        }
        return;
    }
    auto key = gb_rows{&a.s.k, hk, t0, b, n};
    gb_fill_w<S, PB>(Kb, C, key);
    gb_fill_w<S, PB>(BK, C, [&](int r, int i) { return key(r, i) * Bv[r] * eG[r]; });
    if (!FORWARD)
        gb_fill_w<S, PB>(EK, C, [&](int r, int i) { return key(r, i) * El[r]; });
    gb_fill_w<S, PB>(Qb, C, gb_rows{&a.s.q, hk, t0, b, n});
    gb_fill_w<S, PB>(Vb, C, [&](int r, int j) {
        return r < n ? cu_getf(a.s.v, j, h, t0 + r, b) * Bv[r] : 0.0f;
    });
}

template <bool FORWARD>
static __global__ void __launch_bounds__(DN_WY_THREADS, 1) dn_wy_prep_bf16_kernel(struct wy_args a)
{
    extern __shared__ __align__(128) float sh[];
    constexpr int C = GB_C, S = GB_S, PB = GB_PB, PC = GB_PC, LF = GB_LF;
    const struct dn_red &L = a.L;
    const struct dn_wy_plan &P = a.P;
    const struct wy_chunk ck = wy_chunk_of(a, blockIdx.x);
    const int64_t ci = ck.ci, ch = ck.ch, h = ck.h, b = ck.b, hk = ck.hk, t0 = ck.t0;
    const int n = wy_len(L, ch);
    gb_t *Kb = (gb_t *)sh, *Qb = Kb + C * PB, *Vb = Qb + C * PB, *BK = Vb + C * PB,
         *EK = BK + C * PB, *Tb = EK + C * PB, *Pb = Tb + C * PC;
    float *At = (float *)(Pb + C * PC), *T = At + C * LF, *G = T + C * LF, *Bv = G + C,
          *eG = Bv + C, *El = eG + C;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane / 4, t = lane % 4;
    const int m0 = 16 * (warp % 4), n16 = 16 * (warp / 4), n32 = 32 * (warp / 4);
    wy_gates(a.s, h, b, t0, n, G, Bv);
    __syncthreads();
    if (threadIdx.x < C) {
        const int r = threadIdx.x;
        eG[r] = expf(G[r]);
        El[r] = expf(G[C - 1] - G[r]);
        float *gv = wy_vec(a, ci);
        gv[r] = G[r];
        gv[C + r] = Bv[r];
    }
    for (int e = threadIdx.x; e < C * C; e += blockDim.x)
        T[e / C * LF + e % C] = e / C == e % C ? 1.0f : 0.0f;
    __syncthreads();
    pb_operands<FORWARD>(a, h, hk, b, t0, n, Bv, eG, El, Kb, Qb, Vb, BK, EK);
    __syncthreads();
    { /* Ab = K K^T and P = Q K^T, gated and masked in registers: At, P to scratch (and Ab) */
        float cA[2][4], cP[2][4];
        gb_zero<2>(cA);
        gb_zero<2>(cP);
        gb_mm<2, false, true>(cA, Kb, PB, Kb, PB, m0, n16, S);
        gb_mm<2, false, true>(cP, Qb, PB, Kb, PB, m0, n16, S);
        float *gab = FORWARD ? NULL : wy_cc(a, P.off_ab, ci), *gp = wy_cc(a, P.off_p, ci);
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int r = m0 + g + 8 * hf, q = n16 + 8 * u + 2 * t;
                float ab[2], pv[2];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const float d = q + j <= r ? expf(G[r] - G[q + j]) : 0.0f;
                    ab[j] = q + j < r ? cA[u][2 * hf + j] * d : 0.0f;
                    pv[j] = cP[u][2 * hf + j] * d;
                    At[(q + j) * LF + r] = Bv[r] * ab[j];
                }
                *(float2 *)(gp + r * C + q) = make_float2(pv[0], pv[1]);
                if (!FORWARD) {
                    *(float2 *)(gab + r * C + q) = make_float2(ab[0], ab[1]);
                    *(uint32_t *)(Pb + r * PC + q) = mb_pack(pv[0], pv[1]);
                }
            }
    }
    __syncthreads();
    wy_solve64(At, LF, T, LF);
    __syncthreads();
    for (int e = threadIdx.x; e < C * C / 2; e += blockDim.x) {
        const int r = 2 * e / C, q = 2 * e % C;
        *(uint32_t *)(Tb + r * PC + q) = mb_pack(T[r * LF + q], T[r * LF + q + 1]);
    }
    __syncthreads();
    float c4[4][4];
    gb_zero<4>(c4); /* Uv = T (B V) */
    gb_mm<4, false, false>(c4, Tb, PC, Vb, PB, m0, n32, C);
    pb_store<4>(wy_rows_v(a, P.off_u, ci), S, c4, m0, n32);
    gb_zero<4>(c4); /* Wk = T (B e^G K) */
    gb_mm<4, false, false>(c4, Tb, PC, BK, PB, m0, n32, C);
    pb_store<4>(wy_rows_k(a, P.off_wk, ci), S, c4, m0, n32);
    if (FORWARD)
        return;
    float c2[2][4];
    gb_zero<2>(c2); /* F = T^T P^T */
    gb_mm<2, true, true>(c2, Tb, PC, Pb, PC, m0, n16, C);
    pb_store<2>(wy_cc(a, P.off_f, ci), C, c2, m0, n16);
    gb_zero<4>(c4); /* G2 = T^T (El K) */
    gb_mm<4, true, false>(c4, Tb, PC, EK, PB, m0, n32, C);
    pb_store<4>(wy_rows_k(a, P.off_g2, ci), S, c4, m0, n32);
}

struct wy_kernel wy_bf16_prep(bool forward)
{
    return {forward ? dn_wy_prep_bf16_kernel<true> : dn_wy_prep_bf16_kernel<false>,
            (size_t)PB_SHARED};
}

struct wy_kernel wy_bf16_grad(void)
{
    return {dn_wy_grad_bf16_kernel, (size_t)GB_SHARED};
}

struct wy_kernel wy_bf16_bwd(bool wide)
{
    if (wide)
        return {dn_wy_bwd_bf16_kernel<2 * WYF_CV>, (size_t)BW_SHARED(2 * WYF_CV)};
    return {dn_wy_bwd_bf16_kernel<WYF_CV>, (size_t)BW_SHARED(WYF_CV)};
}

struct wy_kernel wy_bf16_fwd(bool forward, bool wide)
{
    if (wide)
        return {forward ? dn_wy_fwd_bf16_kernel<true, 2 * WYF_CV>
                        : dn_wy_fwd_bf16_kernel<false, 2 * WYF_CV>,
                (size_t)FW_SHARED(2 * WYF_CV)};
    return {forward ? dn_wy_fwd_bf16_kernel<true, WYF_CV> : dn_wy_fwd_bf16_kernel<false, WYF_CV>,
            (size_t)FW_SHARED(WYF_CV)};
}
