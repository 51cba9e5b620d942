/* delta_net.cu: the gated delta rule of Gated DeltaNet (DELTA_NET) and its backward
 * (DELTA_NET_BACK) on the device; see src/ops/delta_net.c for the maths and the packed
 * result [S_v, H_v, T + S_k, B] (outputs, then the new state's rows).
 *
 * Two kinds of kernel. Chunked (the backward's default, the second half of this file):
 * chunks of 64 tokens in the WY/UT form of src/ops/delta_net.c, whose chunked CPU backward
 * is the step-by-step specification; a block takes 16 or 32 value columns of one (value
 * head, sequence) and walks its chunks, the chunk's products (K K^T, Q K^T, K S, P U, their
 * adjoints) on tensor cores in three TF32 products a tile (F32-level precision), the
 * triangular solves by warp-synchronous substitution, the gates in log space (every
 * exponent G_r - G_s with s <= r). The backward keeps the state at each chunk start in
 * scratch and recomputes each chunk's quantities from it, last chunk first. Per token (the
 * first half, described below): the forward (chunked only when a node asks, see
 * chunked_plan), and a backward the chunked plan cannot hold in shared memory (S_k past
 * ~200) or whose node asks for the recurrence. Measured on the H200 (LATHE_CUDA_PROFILE,
 * 16 x 512 tokens of Qwen3.5-0.8B, a full fine-tune): DELTA_NET_BACK ~52 ms a node with the
 * per-token kernel, 20.5 with the first chunked one (products on CUDA cores), 21.4 with the
 * products on tensor cores, 16.1 once global reads were batched and the solves were
 * column-oriented; the row-wise fills came after that profile (the whole step went from
 * 9540 to 10244 tokens/s with them). What bounds it now, by Nsight Compute: instruction issue, at
 * 2 warps a scheduler (one 200 KiB block an SM) with most stalls on fixed-latency
 * dependencies; the three-product TF32 split is about half the instructions.
 *
 * The per-token kernels:
 *
 * The recurrence never mixes value columns: with S = [S_k][S_v] and column j,
 *   S[:, j] *= exp(g_t);  e_j = v_j - k_t . S[:, j];  S[:, j] += k_t beta_t e_j;
 *   o_j = scale q_t . S[:, j]
 * but within a column each token is a chain: the update needs k_t . S[:, j] of the decayed
 * column. The forward used to give a column one thread (S[:, j] in shared memory, 32
 * columns a block), so a token was three dependent loops of S_k steps, and the Qwen3.5-0.8B
 * shape (16 value heads, S_k = S_v = 128, batch 1) ran 64 warps on a 132-SM H200: a
 * 504-token prefill spent ~45 of its ~71 ms in the 18 DELTA_NET nodes (~2.5 ms each), and a
 * decode step ~16 us a node. Now a column is split over the 16 lanes of a half warp, lane r
 * owning key rows r, r + 16, ... (S_k / 16 of them, kept in registers), so a token is a
 * chain of S_k / 16 multiply-adds and a 4-step shuffle tree for each dot product; a block
 * of 128 threads takes 8 columns of one (value head, sequence), 1024 warps for that shape
 * (plan in delta_net_plan.c, which also sets the limit S_k <= 256). Warps never wait on
 * each other (no shared memory, no barrier), and each loads the next token's q, k, v, g and
 * beta while it computes this one. The dot products sum in another order than the CPU's
 * (partial sums by row, then the shuffle tree; multiply-adds fused), so the forward agrees
 * with both CPU paths to rounding, not bits. The node's path parameter is ignored here: the
 * device always runs the recurrence. Measured after the split (H200, LATHE_CUDA_PROFILE):
 * ~0.12 ms a node in that prefill (11350 prompt tokens/s for the whole model, 7116 before),
 * 7.7 us a node in decode.
 *
 * DELTA_NET_BACK follows the CPU's backward (recompute the states with a checkpoint every
 * seg ~ sqrt(T) tokens, then replay each segment, last first, keeping its per-token states
 * in scratch, and run the adjoint recurrence back through it), split over column chunks.
 * Why: one block per (key head, sequence) gave the Qwen3.5-0.8B shape (16 heads, S_k = S_v
 * = 128, batch 1) 16 blocks on a 132-SM H200, and LoRA training of all its layers ran at
 * ~780 tokens/s against ~3100 with only the top 4 layers training. The adjoint keeps the
 * columns apart too (dS[:, j] depends on column j alone), so a block now takes `cols`
 * columns (8..32, delta_net_plan.c) of one (value head, sequence), 128 blocks for that
 * shape, with several threads a column (each owns a strided set of key rows, so S, dS and
 * their copies in scratch are private to a thread; only sums cross threads). dv and dstate
 * are per column and written directly. What sums over columns (dq, dk by key row, dg and
 * dbeta by token) a block writes as its chunk's partial sums to scratch, and a second
 * kernel adds the partials over the chunks and over the value heads of a key head, in a
 * fixed order (value head, then chunk): deterministic, no atomics. Row sums over a chunk's
 * columns are shuffle trees within a warp, column sums over rows go through shared memory
 * in row-group order, so the backward agrees with the CPU to rounding, not bits. Measured
 * after the split: that LoRA job 2406 tokens/s (Q8_0 base 1969, full fine-tune 1415). Both
 * kernels pass the conformance suite, the GPU finite-difference checks and check-ref of the
 * 0.8B shape against transformers (logits 6.5e-6, 320 gradients within 2.1e-5). */
#include <math.h>
#include <mma.h>
#include <stdio.h>

#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/delta_net_plan.h"
#include "lathe/ops.h"

namespace wmma = nvcuda::wmma;

static const enum lt_op delta_net_ops[] = {LT_OP_DELTA_NET, LT_OP_DELTA_NET_BACK};

enum { SRC_Q, SRC_K, SRC_V, SRC_G, SRC_BETA, SRC_STATE, SRC_COUNT };

/* Whether a node runs a chunked kernel, and its plan, whenever the plan fits (the
 * per-token kernels otherwise): DELTA_NET_BACK unless the node asks for the recurrent path;
 * DELTA_NET only when it asks for the chunked one, since the per-token forward measured
 * faster (3.2 against 4.2 ms a node at 16 x 512 tokens of Qwen3.5-0.8B, and a one-sequence
 * prefill has too few blocks for chunks). The precondition and the launcher both ask
 * here. */
static bool chunked_plan(const struct lt_tensor *node, struct dn_cback_plan *p)
{
    const int s0 = node->op == LT_OP_DELTA_NET_BACK ? 1 : 0;
    const struct lt_tensor *q = node->src[s0 + SRC_Q], *v = node->src[s0 + SRC_V];
    const int path = lt_get_param_i32(node, 1);
    if (s0 ? path == LT_DELTA_NET_PATH_RECURRENT : path != LT_DELTA_NET_PATH_CHUNKED)
        return false;
    char reason[CU_REASON_MAX];
    return dn_cback_plan_init(p, q->ne[0], v->ne[0], v->ne[1], q->ne[3], q->ne[2], reason,
                              sizeof(reason));
}

bool delta_net_cuda_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const bool back = node->op == LT_OP_DELTA_NET_BACK;
    if (node->op != LT_OP_DELTA_NET && !back) {
        snprintf(reason, reason_size, "%s is not a delta rule", lt_op_name(node->op));
        return false;
    }
    const int s0 = back ? 1 : 0; /* the backward's sources follow its gradient */
    for (int i = 0; i < SRC_COUNT + s0; i++)
        if (!cu_check_source(node, i, CU_TYPES_F32, reason, reason_size))
            return false;
    if (!cu_check_result_f32(node, reason, reason_size))
        return false;
    const struct lt_tensor *q = node->src[s0 + SRC_Q], *k = node->src[s0 + SRC_K],
                           *v = node->src[s0 + SRC_V], *g = node->src[s0 + SRC_G],
                           *beta = node->src[s0 + SRC_BETA], *st = node->src[s0 + SRC_STATE];
    const int64_t sk = q->ne[0], sv = v->ne[0], hk = q->ne[1], hv = v->ne[1], nt = q->ne[2],
                  nb = q->ne[3];
    bool ok = sk > 0 && sv > 0 && hk > 0 && hv % hk == 0 && lt_same_shape(q, k) &&
              v->ne[2] == nt && v->ne[3] == nb && g->ne[0] == hv && g->ne[1] == nt &&
              g->ne[2] == nb && g->ne[3] == 1 && lt_same_shape(g, beta) && st->ne[0] == sv &&
              st->ne[1] == sk && st->ne[2] == hv && st->ne[3] == nb;
    if (back) {
        const struct lt_tensor *gr = node->src[0];
        int64_t n = 0;
        for (int i = 0; i < SRC_COUNT; i++)
            n += lt_nelements(node->src[1 + i]);
        ok = ok && gr->ne[0] == sv && gr->ne[1] == hv && gr->ne[2] == nt + sk &&
             gr->ne[3] == nb && lt_nelements(node) == n;
    } else {
        ok = ok && node->ne[0] == sv && node->ne[1] == hv && node->ne[2] == nt + sk &&
             node->ne[3] == nb;
    }
    if (!ok) {
        snprintf(reason, reason_size, "the sources' and result's shapes do not fit");
        return false;
    }
    struct dn_cback_plan cplan;
    if (chunked_plan(node, &cplan))
        return true;
    if (!back) {
        struct dn_fwd_plan plan;
        return dn_fwd_plan_init(&plan, sk, sv, hv, nb, reason, reason_size);
    }
    struct dn_back_plan plan;
    return dn_back_plan_init(&plan, sk, sv, hv, nb, nt, reason, reason_size);
}

struct dn_srcs {
    struct cu_t q, k, v, g, beta, state;
};

/* The sum of v over the n lanes of this thread's group (n a power of two <= 32, the group
 * aligned in its warp), by a shuffle tree: every lane of the group gets the same value
 * (each level adds the same two numbers, in either order). The whole warp must call it
 * together. */
static __device__ __forceinline__ float group_sum(float v, int n)
{
    for (int o = n >> 1; o > 0; o >>= 1)
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* One token's inputs as the forward's thread (r, j) reads them: k and q at its key rows
 * r, r + DN_FWD_ROW_GROUPS, ... (0 past S_k), g, beta and v_j (0 past S_v). */
template <int N> struct dn_token {
    float k[N], q[N], g, beta, v;
};

/* The forward's sources of one (value head, sequence) at token 0, as this thread reads them:
 * pointers to its first row of q and k, to v_j, g and beta. */
struct dn_fwd_ptrs {
    const char *q, *k, *v, *g, *beta;
};

template <int N>
static __device__ __forceinline__ void dn_load_token(struct dn_token<N> &x, const struct dn_srcs &s,
                                                     const struct dn_fwd_ptrs &p, int64_t t, int r,
                                                     bool active)
{
    const int64_t sk = s.q.ne[0];
    const char *q = p.q + t * s.q.nb[2], *k = p.k + t * s.k.nb[2];
#pragma unroll
    for (int m = 0; m < N; m++) {
        const bool own = r + m * DN_FWD_ROW_GROUPS < sk;
        x.q[m] = own ? *(const float *)(q + m * DN_FWD_ROW_GROUPS * s.q.nb[0]) : 0.0f;
        x.k[m] = own ? *(const float *)(k + m * DN_FWD_ROW_GROUPS * s.k.nb[0]) : 0.0f;
    }
    x.g = *(const float *)(p.g + t * s.g.nb[1]);
    x.beta = *(const float *)(p.beta + t * s.beta.nb[1]);
    x.v = active ? *(const float *)(p.v + t * s.v.nb[2]) : 0.0f;
}

/* block: columns c * DN_FWD_COLS .. of value head h of sequence b (block (b * H_v + h) *
 * chunks + c); thread (jj, r) = (threadIdx / DN_FWD_ROW_GROUPS, threadIdx %
 * DN_FWD_ROW_GROUPS) keeps S[i][j] of column j = c * DN_FWD_COLS + jj at the N key rows
 * i = r + m * DN_FWD_ROW_GROUPS in registers (0 past S_k or S_v, so it adds nothing); the
 * dot products over a column are shuffle trees over its DN_FWD_ROW_GROUPS lanes. No shared
 * memory and no block barrier: every warp runs its two columns alone, reading the next
 * token's inputs while it computes this one's. */
template <int N>
static __global__ void __launch_bounds__(DN_FWD_THREADS)
delta_net_kernel(struct dn_srcs s, float *out, float scale, int64_t chunks)
{
    const int64_t sk = s.q.ne[0], sv = s.v.ne[0], hv = s.v.ne[1], nt = s.q.ne[2];
    const int r = (int)(threadIdx.x % DN_FWD_ROW_GROUPS),
              jj = (int)(threadIdx.x / DN_FWD_ROW_GROUPS);
    const int64_t c = blockIdx.x % chunks, h = (blockIdx.x / chunks) % hv,
                  b = blockIdx.x / chunks / hv, hk = h % s.q.ne[1], j = c * DN_FWD_COLS + jj;
    const bool active = j < sv; /* every lane still shuffles with its warp */
    const int64_t jl = active ? j : 0, ne2 = nt + sk;
    float S[N];
    const char *st = cu_ptr(s.state, jl, r, h, b);
#pragma unroll
    for (int m = 0; m < N; m++) {
        const bool own = active && r + m * DN_FWD_ROW_GROUPS < sk;
        S[m] = own ? *(const float *)(st + m * DN_FWD_ROW_GROUPS * s.state.nb[1]) : 0.0f;
    }
    const struct dn_fwd_ptrs p = {cu_ptr(s.q, r, hk, 0, b), cu_ptr(s.k, r, hk, 0, b),
                                  cu_ptr(s.v, jl, h, 0, b), cu_ptr(s.g, h, 0, b, 0),
                                  cu_ptr(s.beta, h, 0, b, 0)};
    float *o_out = out + (b * ne2 * hv + h) * sv + jl; /* token t at o_out[t * hv * sv] */
    struct dn_token<N> cur, next;
    if (nt > 0)
        dn_load_token(cur, s, p, 0, r, active);
    for (int64_t t = 0; t < nt; t++) {
        /* the next token's loads are in flight while this one computes (the last reloads
         * itself) */
        dn_load_token(next, s, p, t + 1 < nt ? t + 1 : t, r, active);
        const float a = expf(cur.g);
        float kv = 0.0f;
#pragma unroll
        for (int m = 0; m < N; m++) {
            S[m] *= a;
            kv = fmaf(cur.k[m], S[m], kv);
        }
        kv = group_sum(kv, DN_FWD_ROW_GROUPS);
        const float d = cur.beta * (cur.v - kv);
        float o = 0.0f;
#pragma unroll
        for (int m = 0; m < N; m++) {
            S[m] = fmaf(cur.k[m], d, S[m]);
            o = fmaf(cur.q[m], S[m], o);
        }
        o = group_sum(o, DN_FWD_ROW_GROUPS);
        if (active && r == 0)
            o_out[t * hv * sv] = o * scale;
        cur = next;
    }
    float *s_out = o_out + nt * hv * sv; /* the new state's row i at s_out[i * hv * sv] */
#pragma unroll
    for (int m = 0; m < N; m++) {
        const int64_t i = r + m * DN_FWD_ROW_GROUPS;
        if (active && i < sk)
            s_out[i * hv * sv] = S[m];
    }
}

template <int N>
static lt_status launch_forward(struct cuda_ctx *c, const struct dn_fwd_plan &p,
                                const struct dn_srcs &s, float *out, float scale)
{
    delta_net_kernel<N><<<(unsigned)p.blocks, DN_FWD_THREADS, 0, c->stream>>>(s, out, scale,
                                                                               p.chunks);
    return cu_launched("delta_net");
}

static lt_status launch_back(struct cuda_ctx *c, struct lt_tensor *node);
static lt_status launch_cback(struct cuda_ctx *c, struct lt_tensor *node,
                              const struct dn_cback_plan &P);
static lt_status launch_cfwd(struct cuda_ctx *c, struct lt_tensor *node,
                             const struct dn_cback_plan &P);

lt_status delta_net_cuda_compute(struct cuda_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!delta_net_cuda_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    struct dn_cback_plan cplan;
    const bool chunked = chunked_plan(node, &cplan);
    if (node->op == LT_OP_DELTA_NET_BACK)
        return chunked ? launch_cback(c, node, cplan) : launch_back(c, node);
    if (chunked)
        return launch_cfwd(c, node, cplan);
    struct dn_srcs s = {cu_view(node->src[SRC_Q]),    cu_view(node->src[SRC_K]),
                        cu_view(node->src[SRC_V]),    cu_view(node->src[SRC_G]),
                        cu_view(node->src[SRC_BETA]), cu_view(node->src[SRC_STATE])};
    struct dn_fwd_plan p;
    if (!dn_fwd_plan_init(&p, s.q.ne[0], s.v.ne[0], s.v.ne[1], s.q.ne[3], reason, sizeof(reason)))
        return cu_refuse(node, reason);
    if (p.blocks == 0)
        return LT_OK;
    float *out = (float *)node->data;
    const float scale = lt_get_param_f32(node, 0);
    switch (p.rows) {
    case 1: return launch_forward<1>(c, p, s, out, scale);
    case 2: return launch_forward<2>(c, p, s, out, scale);
    case 4: return launch_forward<4>(c, p, s, out, scale);
    case 8: return launch_forward<8>(c, p, s, out, scale);
    case 16: return launch_forward<16>(c, p, s, out, scale);
    default: return cu_refuse(node, "no forward kernel for this many key rows a thread");
    }
}

/* ---- backward ---- */

struct dn_back_layout {
    int64_t sk, sv, hk, hv, nt, nb;
    int64_t off_q, off_k, off_v, off_g, off_beta, off_state; /* in the flat result */
    struct dn_back_plan p;
};

/* The sum of each column's partials over the row groups, in row-group order. */
static __device__ __forceinline__ float column_sum(const float *colpart, int64_t row_groups,
                                                   int64_t cols, int jj)
{
    float x = 0.0f;
    for (int64_t q = 0; q < row_groups; q++)
        x = __fadd_rn(x, colpart[q * cols + jj]);
    return x;
}

/* One recurrent step of (h, b) at token t on this block's columns of S: the thread (r, jj)
 * updates its own elements S[i][jj], i = r, r + row_groups, ... e (optional, global)
 * receives v - S~^T k of each column (0 for a column past S_v). Shared ks and colpart are
 * overwritten. */
static __device__ void back_step(const struct dn_srcs &s, const struct dn_back_plan &P, float *S,
                                 float *ks, float *colpart, int64_t h, int64_t hk, int64_t t,
                                 int64_t b, int64_t j, bool active, int r, int jj, float *e)
{
    const int64_t sk = s.q.ne[0], C = P.cols, R = P.row_groups;
    __syncthreads(); /* ks and colpart are no longer read */
    for (int64_t i = threadIdx.x; i < sk; i += blockDim.x)
        ks[i] = cu_getf(s.k, i, hk, t, b);
    __syncthreads();
    const float a = expf(cu_getf(s.g, h, t, b, 0)), beta = cu_getf(s.beta, h, t, b, 0);
    float kv = 0.0f;
    for (int64_t i = r; i < sk; i += R) {
        float x = __fmul_rn(S[i * C + jj], a);
        S[i * C + jj] = x;
        kv = __fadd_rn(kv, __fmul_rn(ks[i], x));
    }
    colpart[r * C + jj] = kv;
    __syncthreads();
    kv = column_sum(colpart, R, C, jj);
    const float ej = active ? __fsub_rn(cu_getf(s.v, j, h, t, b), kv) : 0.0f;
    if (e && r == 0)
        e[jj] = ej;
    const float d = __fmul_rn(beta, ej);
    for (int64_t i = r; i < sk; i += R)
        S[i * C + jj] = __fadd_rn(S[i * C + jj], __fmul_rn(ks[i], d));
}

/* block: columns c * cols .. of value head h of sequence b (block (b * H_v + h) * chunks + c);
 * thread (r, jj) = (threadIdx / cols, threadIdx % cols) owns column j = c * cols + jj of S
 * and dS at key rows r, r + row_groups, ... Writes dv and dstate of its columns, and its
 * chunk's partial dq, dk, dg, dbeta of every token to part (reduced by the next kernel). */
static __global__ void __launch_bounds__(DN_BACK_THREADS)
delta_net_back_kernel(struct dn_srcs s, struct cu_t grad, float *out, float *work, float *part,
                      struct dn_back_layout L, float scale)
{
    extern __shared__ float sh[];
    __shared__ double red[32];
    const struct dn_back_plan &P = L.p;
    const int64_t sk = L.sk, sv = L.sv, nt = L.nt, C = P.cols, R = P.row_groups;
    const int64_t rows = (sk + R - 1) / R; /* the same count for every thread: shuffles */
    const int jj = (int)(threadIdx.x % C), r = (int)(threadIdx.x / C);
    const int64_t c = blockIdx.x % P.chunks, h = (blockIdx.x / P.chunks) % L.hv,
                  b = blockIdx.x / P.chunks / L.hv, hk = h % L.hk, j = c * C + jj;
    const bool active = j < sv; /* a column past S_v keeps zeros and adds nothing */
    float *S = sh, *dS = S + sk * C, *qs = dS + sk * C, *ks = qs + sk, *dqs = ks + sk,
          *dks = dqs + sk, *colpart = dks + sk;
    float *ckpt = work + blockIdx.x * P.work_per_block;
    float *prev = ckpt + P.n_seg * sk * C, *E = prev + P.seg * sk * C;
    float *mine = part + blockIdx.x * P.part_per_block;
    float *dv = out + L.off_v, *dstate = out + L.off_state;

    for (int64_t i = r; i < sk; i += R)
        S[i * C + jj] = active ? cu_getf(s.state, j, i, h, b) : 0.0f;
    /* forward again, keeping the state before every seg-th token */
    for (int64_t t = 0; t < nt; t++) {
        if (t % P.seg == 0)
            for (int64_t i = r; i < sk; i += R)
                ckpt[((t / P.seg) * sk + i) * C + jj] = S[i * C + jj];
        back_step(s, P, S, ks, colpart, h, hk, t, b, j, active, r, jj, NULL);
    }
    /* the gradient of the final state: rows T.. of grad */
    for (int64_t i = r; i < sk; i += R)
        dS[i * C + jj] = active ? cu_getf(grad, j, h, nt + i, b) : 0.0f;
    for (int64_t t0 = nt > 0 ? (nt - 1) / P.seg * P.seg : -1; t0 >= 0; t0 -= P.seg) {
        const int64_t n = nt - t0 < P.seg ? nt - t0 : P.seg;
        for (int64_t i = r; i < sk; i += R)
            S[i * C + jj] = ckpt[((t0 / P.seg) * sk + i) * C + jj];
        for (int64_t q = 0; q < n; q++) {
            for (int64_t i = r; i < sk; i += R)
                prev[(q * sk + i) * C + jj] = S[i * C + jj];
            back_step(s, P, S, ks, colpart, h, hk, t0 + q, b, j, active, r, jj, E + q * C);
        }
        for (int64_t q = n - 1; q >= 0; q--) {
            const int64_t t = t0 + q, tok = b * nt + t;
            const float *pv = prev + q * sk * C;
            float *mp = mine + t * P.part_per_token;
            const float a = expf(cu_getf(s.g, h, t, b, 0)), beta = cu_getf(s.beta, h, t, b, 0);
            __syncthreads(); /* qs, ks, colpart no longer read; E of this segment written */
            for (int64_t i = threadIdx.x; i < sk; i += blockDim.x) {
                qs[i] = cu_getf(s.q, i, hk, t, b);
                ks[i] = cu_getf(s.k, i, hk, t, b);
            }
            const float dout = active ? cu_getf(grad, j, h, t, b) : 0.0f, ev = E[q * C + jj],
                        delta = __fmul_rn(beta, ev);
            __syncthreads();
            /* o = scale S^T q with S = a prev + k delta^T: dq, dS += scale q dout^T, and
             * dk = dS delta; by row, summed over the chunk's columns */
            for (int64_t m = 0; m < rows; m++) {
                const int64_t i = r + m * R;
                const bool ok = active && i < sk;
                float o = 0.0f, d = 0.0f;
                if (ok) {
                    const float sq = __fmul_rn(scale, qs[i]);
                    const float row = __fadd_rn(__fmul_rn(a, pv[i * C + jj]), __fmul_rn(ks[i], delta));
                    o = __fmul_rn(row, dout);
                    const float x = __fadd_rn(dS[i * C + jj], __fmul_rn(sq, dout));
                    dS[i * C + jj] = x;
                    d = __fmul_rn(x, delta);
                }
                o = group_sum(o, (int)C);
                d = group_sum(d, (int)C);
                if (jj == 0 && i < sk) {
                    dqs[i] = __fmul_rn(scale, o);
                    dks[i] = d;
                }
            }
            /* delta = beta (v - S~^T k): ddelta = dS^T k, then dv, dbeta; by column */
            float dd = 0.0f;
            if (active)
                for (int64_t i = r; i < sk; i += R)
                    dd = __fadd_rn(dd, __fmul_rn(ks[i], dS[i * C + jj]));
            colpart[r * C + jj] = dd;
            __syncthreads();
            dd = column_sum(colpart, R, C, jj);
            if (active && r == 0)
                dv[(tok * L.hv + h) * sv + j] = __fmul_rn(beta, dd);
            const float dkv = -__fmul_rn(beta, dd);
            const double db = cu_block_sum(r == 0 ? (double)__fmul_rn(dd, ev) : 0.0, red);
            /* kv = S~^T k with S~ = a prev: dS~ = dS + k dkv^T, dk += S~ dkv,
             * dg = <dS~, S~>, and the gradient of prev is a dS~; by row */
            float gsum = 0.0f;
            for (int64_t m = 0; m < rows; m++) {
                const int64_t i = r + m * R;
                const bool ok = active && i < sk;
                float d = 0.0f;
                if (ok) {
                    const float row = __fmul_rn(a, pv[i * C + jj]);
                    const float x = __fadd_rn(dS[i * C + jj], __fmul_rn(ks[i], dkv));
                    d = __fmul_rn(row, dkv);
                    gsum = __fadd_rn(gsum, __fmul_rn(x, row));
                    dS[i * C + jj] = __fmul_rn(x, a);
                }
                d = group_sum(d, (int)C);
                if (jj == 0 && i < sk) {
                    mp[i] = dqs[i];
                    mp[sk + i] = __fadd_rn(dks[i], d);
                }
            }
            const double dgs = cu_block_sum((double)gsum, red);
            if (threadIdx.x == 0) {
                mp[2 * sk] = (float)dgs;
                mp[2 * sk + 1] = (float)db;
            }
        }
    }
    if (active)
        for (int64_t i = r; i < sk; i += R)
            dstate[((b * L.hv + h) * sk + i) * sv + j] = dS[i * C + jj];
}

/* ---- backward, chunked ---- */

/* The dims and output offsets both backward kernels and the reduction read. */
struct dn_red {
    int64_t sk, sv, hk, hv, nt, nb;
    int64_t off_q, off_k, off_v, off_g, off_beta, off_state; /* in the flat result */
    int64_t chunks, part_per_block, part_per_token;           /* the blocks' partials */
};

/* Cm (+)= alpha diag(rs) A B over M x N x K on tensor cores, in three TF32 products
 * (A_hi B + A B_lo + A_lo B with A = A_hi + A_lo rounded to TF32 twice), which keeps about
 * F32's precision: one TF32 product would put the gradients ~1e-3 off. A(m, k) is
 * A[m * lda + k] (LA row-major) or A[m + k * lda] (column-major), B(k, n) likewise; M and N
 * are multiples of 16, K of 8, lda and ldb of 4, and every operand 32-byte aligned. A warp
 * takes a 16 x 16 output tile at a time, through its 256 floats of tmp, and stores only rows
 * m < m_valid and columns n < n_valid. The block calls it together; the caller
 * synchronises before reading Cm. */
template <typename F> static __device__ __forceinline__ void cb_split(F &hi, F &lo)
{
#pragma unroll
    for (int i = 0; i < hi.num_elements; i++) {
        const float x = hi.x[i], h = wmma::__float_to_tf32(x);
        lo.x[i] = wmma::__float_to_tf32(x - h);
        hi.x[i] = h;
    }
}

template <typename LA, typename LB>
static __device__ void cb_mma(float *Cm, int64_t ldc, const float *A, int lda, const float *B,
                              int ldb, int M, int N, int K, float alpha, bool acc, const float *rs,
                              int m_valid, int n_valid, float *tmp)
{
    const bool a_row = std::is_same<LA, wmma::row_major>::value,
               b_row = std::is_same<LB, wmma::row_major>::value;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    const int tn = N / 16, tiles = (M / 16) * tn;
    float *t = tmp + warp * 256;
    for (int tile = warp; tile < tiles; tile += n_warps) {
        const int m0 = tile / tn * 16, n0 = tile % tn * 16;
        wmma::fragment<wmma::accumulator, 16, 16, 8, float> c;
        wmma::fill_fragment(c, 0.0f);
        for (int k0 = 0; k0 < K; k0 += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> a, a_lo;
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> b, b_lo;
            wmma::load_matrix_sync(a, a_row ? A + m0 * lda + k0 : A + m0 + k0 * lda, lda);
            wmma::load_matrix_sync(b, b_row ? B + k0 * ldb + n0 : B + k0 + n0 * ldb, ldb);
            cb_split(a, a_lo);
            cb_split(b, b_lo);
            wmma::mma_sync(c, a_lo, b, c);
            wmma::mma_sync(c, a, b_lo, c);
            wmma::mma_sync(c, a, b, c);
        }
        wmma::store_matrix_sync(t, c, 16, wmma::mem_row_major);
        __syncwarp();
        /* the lane's 8 old values first (all in flight at once: Cm may be global), then
         * the sums */
        float old[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int e = lane + 32 * j, m = m0 + e / 16, n = n0 + e % 16;
            old[j] = acc && m < m_valid && n < n_valid ? Cm[m * ldc + n] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int e = lane + 32 * j, m = m0 + e / 16, n = n0 + e % 16;
            if (m < m_valid && n < n_valid)
                Cm[m * ldc + n] = old[j] + (rs ? alpha * rs[m] : alpha) * t[e];
        }
        __syncwarp();
    }
}

/* cb_mma with A(m, k) = A[m * ar + k * ac] and B(k, n) = B[k * br + n * bc], one stride of
 * each 1 (which picks the layouts) */
static __device__ void cb_mm(float *tmp, float *Cm, int64_t ldc, const float *A, int ar, int ac,
                             const float *B, int br, int bc, int M, int N, int K, float alpha,
                             bool acc, const float *rs = NULL, int m_valid = 1 << 30,
                             int n_valid = 1 << 30)
{
    using RM = wmma::row_major;
    using CM = wmma::col_major;
    if (ac == 1 && bc == 1)
        cb_mma<RM, RM>(Cm, ldc, A, ar, B, br, M, N, K, alpha, acc, rs, m_valid, n_valid, tmp);
    else if (ac == 1)
        cb_mma<RM, CM>(Cm, ldc, A, ar, B, bc, M, N, K, alpha, acc, rs, m_valid, n_valid, tmp);
    else if (bc == 1)
        cb_mma<CM, RM>(Cm, ldc, A, ac, B, br, M, N, K, alpha, acc, rs, m_valid, n_valid, tmp);
    else
        cb_mma<CM, CM>(Cm, ldc, A, ac, B, bc, M, N, K, alpha, acc, rs, m_valid, n_valid, tmp);
}

/* one block's shared memory (dn_cback_plan: K, Q [C][ldk]; S0, dS [skp][ldv]; W, U, Do,
 * dU, Y [C][ldv]; Ab, P, M [C][ldc]; vectors of C; the warps' tiles) and where it stands */
struct cb_block {
    float *K, *Q, *S0, *dS, *W, *U, *Do, *dU, *Y, *Ab, *P, *M;
    float *G, *eG, *B, *El, *dgam, *dgc, *dB;
    float *tmp; /* a 16 x 16 tile a warp (cb_mma) */
    int skp, cv, lk, lv, lc;
    int64_t h, hk, b, j0; /* value head, key head, sequence, first column */
};

#define CB_C DN_CHUNK
static_assert(DN_CBACK_THREADS == 4 * DN_CHUNK, "the row sums take 4 lanes a chunk row");

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
#pragma unroll
        for (int k = 0; k < CPW; k++) {
            const float uq = __shfl_sync(0xffffffffu, q < 32 ? u0[k] : u1[k], q & 31);
            u0[k] = fmaf(-a0, uq, u0[k]);
            u1[k] = fmaf(-a1, uq, u1[k]);
        }
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
    cb_mm(w.tmp, w.W, lv, w.K, lk, 1, w.S0, lv, 1, C, w.cv, w.skp, 1.0f, false);
    cb_mm(w.tmp, w.Ab, lc, w.K, lk, 1, w.K, 1, lk, C, C, w.skp, 1.0f, false);
    cb_mm(w.tmp, w.P, lc, w.Q, lk, 1, w.K, 1, lk, C, C, w.skp, 1.0f, false);
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
    cb_mm(w.tmp, w.S0, lv, w.K, 1, w.lk, w.Y, lv, 1, w.skp, w.cv, C, 1.0f, true);
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
    cb_mm(w.tmp, w.dU, lv, w.P, 1, lc, w.Do, lv, 1, C, cv, C, 1.0f, false);
    cb_mm(w.tmp, w.M, lc, w.Do, lv, 1, w.U, 1, lv, C, C, cv, 1.0f, false);
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
    cb_mm(w.tmp, dQ, ppt, w.M, lc, 1, w.K, lk, 1, C, w.skp, C, 1.0f, false, NULL, n, sk);
    cb_mm(w.tmp, dK, ppt, w.M, 1, lc, w.Q, lk, 1, C, w.skp, C, 1.0f, false, NULL, n, sk);
    /* O += diag(e^G) Q S0: dQ += diag(e^G) Do S0^T; dgam_r += e^G_r Do_r . (Q S0)_r */
    cb_mm(w.tmp, w.Y, lv, w.Q, lk, 1, w.S0, lv, 1, C, cv, w.skp, 1.0f, false);
    __syncthreads();
    {
        const float x = cb_row_dot(w.Do, w.Y, lv, cv);
        if (threadIdx.x % 4 == 0)
            w.dgam[threadIdx.x / 4] += w.eG[threadIdx.x / 4] * x;
    }
    cb_mm(w.tmp, dQ, ppt, w.Do, lv, 1, w.S0, 1, lv, C, w.skp, cv, 1.0f, true, w.eG, n, sk);
    __syncthreads();
    /* the end state: dU += diag(El) K dS, dK += diag(El) U dS^T, gate terms */
    cb_mm(w.tmp, w.Y, lv, w.K, lk, 1, w.dS, lv, 1, C, cv, w.skp, 1.0f, false);
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
    cb_mm(w.tmp, dK, ppt, w.U, lv, 1, w.dS, 1, lv, C, w.skp, cv, 1.0f, true, w.El, n, sk);
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
    cb_mm(w.tmp, w.M, lc, w.dU, lv, 1, w.U, 1, lv, C, C, cv, -1.0f, false);
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
    cb_mm(w.tmp, dK, ppt, w.M, lc, 1, w.K, lk, 1, C, w.skp, C, 1.0f, true, NULL, n, sk);
    cb_mm(w.tmp, dK, ppt, w.M, 1, lc, w.K, lk, 1, C, w.skp, C, 1.0f, true, NULL, n, sk);
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
    cb_mm(w.tmp, dK, ppt, w.dU, lv, 1, w.S0, 1, lv, C, w.skp, cv, 1.0f, true, NULL, n, sk);
    /* the start state's gradient: e^{G_last} dS + Q^T diag(e^G) Do + K^T dW */
    for (int e = threadIdx.x; e < C * cv; e += blockDim.x)
        w.Do[(e / cv) * lv + e % cv] *= w.eG[e / cv];
    for (int e = threadIdx.x; e < w.skp * cv; e += blockDim.x)
        w.dS[(e / cv) * lv + e % cv] *= w.eG[C - 1];
    __syncthreads();
    cb_mm(w.tmp, w.dS, lv, w.Q, 1, lk, w.Do, lv, 1, w.skp, cv, C, 1.0f, true);
    __syncthreads();
    cb_mm(w.tmp, w.dS, lv, w.K, 1, lk, w.dU, lv, 1, w.skp, cv, C, 1.0f, true);
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
    x += C; /* the plan's eighth vector keeps tmp 32-byte aligned */
    w.tmp = x;
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
    extern __shared__ __align__(128) float sh[];
    const int C = CB_C;
    struct cb_block w = cb_block_of(sh, L, P);
    const int lv = w.lv, cv = w.cv;
    cb_load_state(w, s.state, L);
    for (int64_t ch = 0; ch < P.n_ch; ch++) {
        const int64_t t0 = ch * C;
        const int n = (int)(L.nt - t0 < C ? L.nt - t0 : C);
        cb_prepare(w, s, L, t0, n);
        cb_mm(w.tmp, w.Y, lv, w.Q, w.lk, 1, w.S0, lv, 1, C, cv, w.skp, 1.0f, false);
        cb_mm(w.tmp, w.Do, lv, w.P, w.lc, 1, w.U, lv, 1, C, cv, C, 1.0f, false);
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
            return i < L.sk && cb_col_ok(w, L, jj) ? cu_getf(grad, w.j0 + jj, w.h, L.nt + i, w.b)
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

/* dq, dk [S_k, H_k, T, B] and dg, dbeta [H_v, T, B] from the blocks' partials (either
 * backward kernel's): each sums over the value heads h = hk, hk + H_k, ... of its key head
 * and over the column chunks, in that order. */
static __global__ void delta_net_back_reduce_kernel(const float *part, float *out, struct dn_red L)
{
    const int64_t sk = L.sk, nt = L.nt, n_qk = L.nb * nt * L.hk * sk, n_g = L.nb * nt * L.hv;
    for (int64_t f = cu_thread_index(); f < 2 * n_qk + n_g; f += cu_thread_count()) {
        if (f < 2 * n_qk) {
            const int64_t w = f / n_qk, e = f % n_qk; /* w: 0 dq, 1 dk */
            const int64_t i = e % sk, hk = e / sk % L.hk, t = e / sk / L.hk % nt,
                          b = e / sk / L.hk / nt;
            double acc = 0.0;
            for (int64_t h = hk; h < L.hv; h += L.hk)
                for (int64_t c = 0; c < L.chunks; c++)
                    acc += part[((b * L.hv + h) * L.chunks + c) * L.part_per_block +
                                t * L.part_per_token + w * sk + i];
            out[(w ? L.off_k : L.off_q) + e] = (float)acc;
        } else {
            const int64_t e = f - 2 * n_qk, h = e % L.hv, t = e / L.hv % nt, b = e / L.hv / nt;
            double dg = 0.0, db = 0.0;
            for (int64_t c = 0; c < L.chunks; c++) {
                const float *x = part + ((b * L.hv + h) * L.chunks + c) * L.part_per_block +
                                 t * L.part_per_token + 2 * sk;
                dg += x[0];
                db += x[1];
            }
            out[L.off_g + e] = (float)dg;
            out[L.off_beta + e] = (float)db;
        }
    }
}

static lt_status launch_reduce(struct cuda_ctx *c, const float *part, float *out,
                               const struct dn_red &R)
{
    const int64_t n_red = 2 * R.nb * R.nt * R.hk * R.sk + R.nb * R.nt * R.hv;
    if (n_red == 0)
        return LT_OK;
    int64_t grid = (n_red + 255) / 256;
    if (grid > (int64_t)c->n_sm * 8)
        grid = (int64_t)c->n_sm * 8;
    delta_net_back_reduce_kernel<<<(unsigned)grid, 256, 0, c->stream>>>(part, out, R);
    return cu_launched("delta_net_back_reduce");
}

/* the dims and offsets of a DELTA_NET_BACK node */
static struct dn_red red_of(const struct lt_tensor *node)
{
    struct dn_red R;
    const struct lt_tensor *q = node->src[1 + SRC_Q], *v = node->src[1 + SRC_V];
    R.sk = q->ne[0], R.sv = v->ne[0], R.hk = q->ne[1], R.hv = v->ne[1], R.nt = q->ne[2],
    R.nb = q->ne[3];
    R.off_q = 0;
    R.off_k = R.off_q + lt_nelements(node->src[1 + SRC_Q]);
    R.off_v = R.off_k + lt_nelements(node->src[1 + SRC_K]);
    R.off_g = R.off_v + lt_nelements(node->src[1 + SRC_V]);
    R.off_beta = R.off_g + lt_nelements(node->src[1 + SRC_G]);
    R.off_state = R.off_beta + lt_nelements(node->src[1 + SRC_BETA]);
    R.chunks = R.part_per_block = R.part_per_token = 0;
    return R;
}

/* the dims of a DELTA_NET node, in dn_red's shape (no partials) */
static struct dn_red fwd_dims_of(const struct lt_tensor *node)
{
    struct dn_red R = {};
    const struct lt_tensor *q = node->src[SRC_Q], *v = node->src[SRC_V];
    R.sk = q->ne[0], R.sv = v->ne[0], R.hk = q->ne[1], R.hv = v->ne[1], R.nt = q->ne[2],
    R.nb = q->ne[3];
    return R;
}

static lt_status launch_cfwd(struct cuda_ctx *c, struct lt_tensor *node,
                             const struct dn_cback_plan &P)
{
    struct dn_srcs s = {cu_view(node->src[SRC_Q]),    cu_view(node->src[SRC_K]),
                        cu_view(node->src[SRC_V]),    cu_view(node->src[SRC_G]),
                        cu_view(node->src[SRC_BETA]), cu_view(node->src[SRC_STATE])};
    if (P.blocks == 0)
        return LT_OK;
    lt_status st = cu_check(cudaFuncSetAttribute(delta_net_cfwd_kernel,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)P.shared_bytes),
                            "raising delta_net's shared memory");
    if (st != LT_OK)
        return st;
    delta_net_cfwd_kernel<<<(unsigned)P.blocks, DN_CBACK_THREADS, P.shared_bytes, c->stream>>>(
        s, (float *)node->data, fwd_dims_of(node), P, lt_get_param_f32(node, 0));
    return cu_launched("delta_net_chunked");
}

/* The chunked backward: one buffer holds every block's partials, then every block's
 * chunk-start states. */
static lt_status launch_cback(struct cuda_ctx *c, struct lt_tensor *node,
                              const struct dn_cback_plan &P)
{
    struct dn_srcs s = {cu_view(node->src[1 + SRC_Q]),    cu_view(node->src[1 + SRC_K]),
                        cu_view(node->src[1 + SRC_V]),    cu_view(node->src[1 + SRC_G]),
                        cu_view(node->src[1 + SRC_BETA]), cu_view(node->src[1 + SRC_STATE])};
    struct dn_red R = red_of(node);
    R.chunks = P.chunks, R.part_per_block = P.part_per_block, R.part_per_token = P.part_per_token;
    if (P.blocks == 0)
        return LT_OK;
    const int64_t n_part = P.blocks * P.part_per_block;
    void *scratch;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK,
                              sizeof(float) * (size_t)(n_part + P.blocks * P.ckpt_per_block),
                              &scratch);
    if (st != LT_OK)
        return st;
    float *part = (float *)scratch, *ckpt = part + n_part;
    st = cu_check(cudaFuncSetAttribute(delta_net_cback_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)P.shared_bytes),
                  "raising delta_net_back's shared memory");
    if (st != LT_OK)
        return st;
    delta_net_cback_kernel<<<(unsigned)P.blocks, DN_CBACK_THREADS, P.shared_bytes, c->stream>>>(
        s, cu_view(node->src[0]), (float *)node->data, ckpt, part, R, P,
        lt_get_param_f32(node, 0));
    st = cu_launched("delta_net_back_chunked");
    if (st != LT_OK)
        return st;
    return launch_reduce(c, part, (float *)node->data, R);
}

static lt_status launch_back(struct cuda_ctx *c, struct lt_tensor *node)
{
    struct dn_srcs s = {cu_view(node->src[1 + SRC_Q]),    cu_view(node->src[1 + SRC_K]),
                        cu_view(node->src[1 + SRC_V]),    cu_view(node->src[1 + SRC_G]),
                        cu_view(node->src[1 + SRC_BETA]), cu_view(node->src[1 + SRC_STATE])};
    struct dn_back_layout L;
    L.sk = s.q.ne[0], L.sv = s.v.ne[0], L.hk = s.q.ne[1], L.hv = s.v.ne[1], L.nt = s.q.ne[2],
    L.nb = s.q.ne[3];
    char reason[CU_REASON_MAX];
    if (!dn_back_plan_init(&L.p, L.sk, L.sv, L.hv, L.nb, L.nt, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    L.off_q = 0;
    L.off_k = L.off_q + lt_nelements(node->src[1 + SRC_Q]);
    L.off_v = L.off_k + lt_nelements(node->src[1 + SRC_K]);
    L.off_g = L.off_v + lt_nelements(node->src[1 + SRC_V]);
    L.off_beta = L.off_g + lt_nelements(node->src[1 + SRC_G]);
    L.off_state = L.off_beta + lt_nelements(node->src[1 + SRC_BETA]);
    if (L.p.blocks == 0)
        return LT_OK;
    /* one buffer: every block's partials, then every block's checkpoints and states */
    const int64_t n_part = L.p.blocks * L.p.part_per_block;
    void *scratch;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK,
                              sizeof(float) * (size_t)(n_part + L.p.blocks * L.p.work_per_block),
                              &scratch);
    if (st != LT_OK)
        return st;
    float *part = (float *)scratch, *work = part + n_part;
    st = cu_check(cudaFuncSetAttribute(delta_net_back_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)L.p.shared_bytes),
                  "raising delta_net_back's shared memory");
    if (st != LT_OK)
        return st;
    delta_net_back_kernel<<<(unsigned)L.p.blocks, (unsigned)L.p.threads, L.p.shared_bytes,
                            c->stream>>>(s, cu_view(node->src[0]), (float *)node->data, work,
                                         part, L, lt_get_param_f32(node, 0));
    st = cu_launched("delta_net_back");
    if (st != LT_OK)
        return st;
    struct dn_red R = red_of(node);
    R.chunks = L.p.chunks, R.part_per_block = L.p.part_per_block,
    R.part_per_token = L.p.part_per_token;
    return launch_reduce(c, part, (float *)node->data, R);
}

const struct cuda_family cuda_family_delta_net = {"delta_net", delta_net_ops,
                                                  CU_COUNT(delta_net_ops), delta_net_cuda_supported,
                                                  delta_net_cuda_compute};
