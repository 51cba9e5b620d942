/* delta_net.cu: the gated delta rule of Gated DeltaNet (DELTA_NET) and its backward
 * (DELTA_NET_BACK) on the device; see src/ops/delta_net.c for the maths and the packed
 * result [S_v, H_v, T + S_k, B] (outputs, then the new state's rows).
 *
 * Three kinds of kernel: the chunk-parallel ones (delta_net_wy.cu: the backward's default,
 * and the forward's for training and long prefills, or when a node asks for chunks),
 * the chunked ones (delta_net_chunk.cu: the backward where the former's plan does not fit
 * or LATHE_DN_BACK=v1 asks, the forward under LATHE_DN_FWD=v1 when a node asks) and the
 * per-token ones here, which run decode, short prefills, a forward or backward neither
 * chunked plan can hold in shared memory (S_k past ~128 / ~200) and a node that asks for the
 * recurrence (see chunked_plan).
 * delta_net_impl.h is what they share.
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
 * with both CPU paths to rounding, not bits. Measured after the split (H200,
 * LATHE_CUDA_PROFILE): ~0.12 ms a node in that prefill (11350 prompt tokens/s for the whole model, 7116 before),
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/delta_net_impl.h"
#include "lathe/ops.h"

static const enum lt_op delta_net_ops[] = {LT_OP_DELTA_NET, LT_OP_DELTA_NET_BACK};

/* Which kernel runs a node, and its plan. DELTA_NET_BACK: the chunk-parallel kernels
 * (delta_net_wy.cu) whenever their plan fits, else the chunked one (delta_net_chunk.cu) whenever
 * its plan fits, else the per-token one; LATHE_DN_BACK=v1 skips the first, for comparison,
 * and a node that asks for the recurrent path gets the per-token kernel.
 * DELTA_NET: the chunk-parallel forward (delta_net_wy.cu) when the node's path is CHUNKED,
 * or AUTO where cu_dn_wy_fwd_auto says so (T >= 64: see delta_net_plan.h for why), and its
 * plan fits (S_k, S_v <= 128); else, for CHUNKED, the chunked kernel of delta_net_chunk.cu where
 * its plan fits; else the per-token kernel (RECURRENT, decode, prefills under a chunk, S_k past
 * 128). The per-token kernel
 * took 3.1 ms a node at 16 x 512 tokens of Qwen3.5-0.8B (and the older chunked one, which
 * did all of a chunk's work in its sequential walk, 4.2 ms).
 * LATHE_DN_FWD=token keeps the per-token kernel for every DELTA_NET node, LATHE_DN_FWD=v1
 * the choice before the chunk-parallel forward (CHUNKED: delta_net_chunk.cu's kernel; AUTO:
 * the per-token one), LATHE_DN_FWD=wy the chunk-parallel forward for AUTO nodes of any
 * length where its plan fits (a T past the rule's 64 is the default's choice), for comparison. The
 * precondition and the launcher both ask here (the environment is read each time, so both see the
 * same answer). */
enum dn_kind { DN_KIND_TOKEN, DN_KIND_CHUNKED, DN_KIND_WY };

struct dn_plans {
    struct dn_cback_plan chunked;
    struct dn_wy_plan wy;
};

static bool back_v1_requested(void)
{
    const char *e = getenv("LATHE_DN_BACK");
    return e && strcmp(e, "v1") == 0;
}

/* LATHE_DN_FWD: 0 unset (the default), 1 "token", 2 "v1", 3 "wy" */
static int fwd_env(void)
{
    const char *e = getenv("LATHE_DN_FWD");
    if (!e)
        return 0;
    return strcmp(e, "token") == 0 ? 1 : strcmp(e, "v1") == 0 ? 2 : strcmp(e, "wy") == 0 ? 3 : 0;
}

static enum dn_kind chunked_plan(const struct lt_tensor *node, struct dn_plans *p)
{
    const int s0 = node->op == LT_OP_DELTA_NET_BACK ? 1 : 0;
    const struct lt_tensor *q = node->src[s0 + SRC_Q], *v = node->src[s0 + SRC_V];
    const int path = lt_get_param_i32(node, 1);
    char reason[CU_REASON_MAX];
    if (!s0) {
        const int env = fwd_env();
        if (env == 1 || path == LT_DELTA_NET_PATH_RECURRENT)
            return DN_KIND_TOKEN;
        const bool chunked = path == LT_DELTA_NET_PATH_CHUNKED;
        const bool auto_wy = env == 3 || cu_dn_wy_fwd_auto(v->ne[1], q->ne[3], q->ne[2]);
        if ((env == 0 || env == 3) && (chunked || auto_wy) &&
            cu_dn_wy_fwd_plan_init(&p->wy, q->ne[0], v->ne[0], q->ne[1], v->ne[1], q->ne[3],
                                   q->ne[2], reason, sizeof(reason)))
            return DN_KIND_WY;
        if (!chunked)
            return DN_KIND_TOKEN;
    } else if (path == LT_DELTA_NET_PATH_RECURRENT) {
        return DN_KIND_TOKEN;
    }
    if (s0 && !back_v1_requested() &&
        cu_dn_wy_plan_init(&p->wy, q->ne[0], v->ne[0], q->ne[1], v->ne[1], q->ne[3], q->ne[2], reason,
                        sizeof(reason)))
        return DN_KIND_WY;
    return cu_dn_cback_plan_init(&p->chunked, q->ne[0], v->ne[0], v->ne[1], q->ne[3], q->ne[2],
                              reason, sizeof(reason))
               ? DN_KIND_CHUNKED
               : DN_KIND_TOKEN;
}

bool cu_delta_net_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
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
        /* the whole result's gradient, or the output's alone (the final state's zero) */
        ok = ok && gr->ne[0] == sv && gr->ne[1] == hv &&
             (gr->ne[2] == nt + sk || gr->ne[2] == nt) && gr->ne[3] == nb &&
             lt_nelements(node) == n;
    } else {
        ok = ok && node->ne[0] == sv && node->ne[1] == hv && node->ne[2] == nt + sk &&
             node->ne[3] == nb;
    }
    if (!ok) {
        snprintf(reason, reason_size, "the sources' and result's shapes do not fit");
        return false;
    }
    struct dn_plans plans;
    if (chunked_plan(node, &plans) != DN_KIND_TOKEN)
        return true;
    if (!back) {
        struct dn_fwd_plan plan;
        return cu_dn_fwd_plan_init(&plan, sk, sv, hv, nb, reason, reason_size);
    }
    struct dn_back_plan plan;
    return cu_dn_back_plan_init(&plan, sk, sv, hv, nb, nt, reason, reason_size);
}

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
    cu_pdl_enter();
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
static lt_status launch_forward(struct cu_ctx *c, const struct dn_fwd_plan &p,
                                const struct dn_srcs &s, float *out, float scale)
{
    cu_launch_pdl(c, delta_net_kernel<N>, (unsigned)p.blocks, DN_FWD_THREADS, 0, s, out, scale,
                  p.chunks);
    return cu_launched("delta_net");
}

static lt_status launch_back(struct cu_ctx *c, struct lt_tensor *node);

/* what the launcher chosen below asks for: the same plans, the same kind */
static void delta_net_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    struct dn_plans plans;
    const enum dn_kind kind = chunked_plan(node, &plans);
    const bool back = node->op == LT_OP_DELTA_NET_BACK;
    if (kind == DN_KIND_WY) {
        need[CU_SCRATCH_WORK] = dn_wy_scratch_bytes(&plans.wy);
    } else if (kind == DN_KIND_CHUNKED) {
        need[CU_SCRATCH_WORK] = back ? dn_cback_scratch_bytes(&plans.chunked) : 0;
    } else if (back) {
        const struct dn_red R = cu_dn_red_of(node);
        struct dn_back_plan p;
        char reason[CU_REASON_MAX];
        if (cu_dn_back_plan_init(&p, R.sk, R.sv, R.hv, R.nb, R.nt, reason, sizeof(reason)))
            need[CU_SCRATCH_WORK] = dn_back_scratch_bytes(&p);
    }
}

lt_status cu_delta_net_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_delta_net_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    struct dn_plans plans;
    const enum dn_kind kind = chunked_plan(node, &plans);
    if (node->op == LT_OP_DELTA_NET_BACK) {
        switch (kind) {
        case DN_KIND_WY: return cu_dn_launch_wy_backward(c, node, plans.wy);
        case DN_KIND_CHUNKED: return cu_dn_launch_chunked_backward(c, node, plans.chunked);
        default: return launch_back(c, node);
        }
    }
    if (kind == DN_KIND_WY)
        return cu_dn_launch_wy_forward(c, node, plans.wy);
    if (kind == DN_KIND_CHUNKED)
        return cu_dn_launch_chunked_forward(c, node, plans.chunked);
    struct dn_srcs s = dn_srcs_of(node, 0);
    struct dn_fwd_plan p;
    if (!cu_dn_fwd_plan_init(&p, s.q.ne[0], s.v.ne[0], s.v.ne[1], s.q.ne[3], reason, sizeof(reason)))
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
    cu_pdl_enter();
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
        dS[i * C + jj] = active && grad.ne[2] > nt ? cu_getf(grad, j, h, nt + i, b) : 0.0f;
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

/* dq, dk [S_k, H_k, T, B] and dg, dbeta [H_v, T, B] from the blocks' partials (either
 * backward kernel's): each sums over the value heads h = hk, hk + H_k, ... of its key head
 * and over the column chunks, in that order. */
static __global__ void delta_net_back_reduce_kernel(const float *part, float *out, struct dn_red L)
{
    cu_pdl_enter();
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

lt_status cu_dn_launch_reduce(struct cu_ctx *c, const float *part, float *out,
                           const struct dn_red &R)
{
    const int64_t n_red = 2 * R.nb * R.nt * R.hk * R.sk + R.nb * R.nt * R.hv;
    if (n_red == 0)
        return LT_OK;
    int64_t grid = (n_red + 255) / 256;
    if (grid > (int64_t)c->n_sm * 8)
        grid = (int64_t)c->n_sm * 8;
    cu_launch_pdl(c, delta_net_back_reduce_kernel, (unsigned)grid, 256, 0, part, out, R);
    return cu_launched("delta_net_back_reduce");
}

struct dn_red cu_dn_red_of(const struct lt_tensor *node)
{
    struct dn_red R = {};
    const int s0 = node->op == LT_OP_DELTA_NET_BACK ? 1 : 0;
    const struct lt_tensor *q = node->src[s0 + SRC_Q], *v = node->src[s0 + SRC_V];
    R.sk = q->ne[0], R.sv = v->ne[0], R.hk = q->ne[1], R.hv = v->ne[1], R.nt = q->ne[2],
    R.nb = q->ne[3];
    if (!s0)
        return R;
    R.off_q = 0;
    R.off_k = R.off_q + lt_nelements(node->src[1 + SRC_Q]);
    R.off_v = R.off_k + lt_nelements(node->src[1 + SRC_K]);
    R.off_g = R.off_v + lt_nelements(node->src[1 + SRC_V]);
    R.off_beta = R.off_g + lt_nelements(node->src[1 + SRC_G]);
    R.off_state = R.off_beta + lt_nelements(node->src[1 + SRC_BETA]);
    return R;
}

static lt_status launch_back(struct cu_ctx *c, struct lt_tensor *node)
{
    struct dn_srcs s = dn_srcs_of(node, 1);
    struct dn_red R = cu_dn_red_of(node);
    struct dn_back_layout L = {R.sk,    R.sv,    R.hk,    R.hv,   R.nt,       R.nb,
                               R.off_q, R.off_k, R.off_v, R.off_g, R.off_beta, R.off_state};
    char reason[CU_REASON_MAX];
    if (!cu_dn_back_plan_init(&L.p, L.sk, L.sv, L.hv, L.nb, L.nt, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    if (L.p.blocks == 0)
        return LT_OK;
    /* one buffer: every block's partials, then every block's checkpoints and states */
    const int64_t n_part = L.p.blocks * L.p.part_per_block;
    void *scratch;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK, dn_back_scratch_bytes(&L.p), &scratch);
    if (st != LT_OK)
        return st;
    float *part = (float *)scratch, *work = part + n_part;
    st = cu_check(cudaFuncSetAttribute(delta_net_back_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)L.p.shared_bytes),
                  "raising delta_net_back's shared memory");
    if (st != LT_OK)
        return st;
    cu_launch_pdl(c, delta_net_back_kernel, (unsigned)L.p.blocks, (unsigned)L.p.threads,
                  L.p.shared_bytes, s, cu_view(node->src[0]), (float *)node->data, work, part, L,
                  lt_get_param_f32(node, 0));
    st = cu_launched("delta_net_back");
    if (st != LT_OK)
        return st;
    R.chunks = L.p.chunks, R.part_per_block = L.p.part_per_block,
    R.part_per_token = L.p.part_per_token;
    return cu_dn_launch_reduce(c, part, (float *)node->data, R);
}

const struct cu_family cu_family_delta_net = {
    "delta_net",          delta_net_ops,    CU_COUNT(delta_net_ops), cu_delta_net_supported,
    cu_delta_net_compute, delta_net_scratch};
