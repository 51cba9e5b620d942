/* delta_net.cu: the gated delta rule of Gated DeltaNet (DELTA_NET) on the device, run
 * recurrently token by token; see src/ops/delta_net.c for the maths and the packed result
 * [S_v, H_v, T + S_k, B] (outputs, then the new state's rows).
 *
 * The recurrence never mixes value columns: with S = [S_k][S_v] and column j,
 *   S[:, j] *= exp(g_t);  e_j = v_j - k_t . S[:, j];  S[:, j] += k_t beta_t e_j;
 *   o_j = scale q_t . S[:, j]
 * so a thread owns one column j of one (value head, sequence), kept in shared memory, and
 * a block of 32 threads shares the token's q and k. Every product and sum is rounded on
 * its own in the CPU's recurrent order, so the device matches the CPU's recurrent path up
 * to the rounding of exp(g) (the CPU's chunked path, its default for T > 1, agrees to
 * rounding). The node's path parameter is ignored here: the device always runs the
 * recurrence.
 *
 * DELTA_NET_BACK follows the CPU's backward (recompute the states with a checkpoint every
 * seg ~ sqrt(T) tokens, then replay each segment, last first, keeping its per-token states
 * in scratch, and run the adjoint recurrence back through it). A block takes one (key
 * head, sequence) and its value heads one after another, as a CPU thread does, so the
 * value heads that share a key head add into dq and dk in the CPU's order without atomics.
 * S and dS live in shared memory with rows padded by one float: the recurrence reads them
 * by column (thread j), the adjoint's dot products by row (thread i). Its sums are in
 * another order than the CPU's vectorised dots, so it agrees to rounding, not bits. */
#include <math.h>
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op delta_net_ops[] = {LT_OP_DELTA_NET, LT_OP_DELTA_NET_BACK};

#define DN_COLS 32     /* value columns (threads) per block */
#define DN_MAX_SK 256  /* shared memory: S_k * (DN_COLS + 2) floats */

enum { SRC_Q, SRC_K, SRC_V, SRC_G, SRC_BETA, SRC_STATE, SRC_COUNT };

/* shared memory of the backward: S and dS [S_k][S_v + 1], q and k [S_k], four [S_v] */
static size_t back_shared_bytes(int64_t sk, int64_t sv)
{
    return sizeof(float) * (size_t)(2 * sk * (sv + 1) + 2 * sk + 4 * sv);
}

#define DN_BACK_MAX_SHARED (200u << 10) /* of Hopper's 227 KiB a block may opt into */
#define DN_BACK_MAX_THREADS 512 /* 72 registers a thread: a block of 512 fits an SM */

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
    if (!back && sk > DN_MAX_SK) {
        snprintf(reason, reason_size, "S_k %lld is over the kernel's %d", (long long)sk,
                 DN_MAX_SK);
        return false;
    }
    if (back && (back_shared_bytes(sk, sv) > DN_BACK_MAX_SHARED ||
                 (sk > sv ? sk : sv) > DN_BACK_MAX_THREADS)) {
        snprintf(reason, reason_size, "S_k %lld x S_v %lld is over the backward kernel's limits",
                 (long long)sk, (long long)sv);
        return false;
    }
    return true;
}

struct dn_srcs {
    struct cu_t q, k, v, g, beta, state;
};

/* block: (value head h, sequence b, columns j0..j0+31); shared: S [S_k][32], q, k [S_k] */
static __global__ void delta_net_kernel(struct dn_srcs s, float *out, float scale)
{
    extern __shared__ float sh[];
    const int64_t sk = s.q.ne[0], sv = s.v.ne[0], hk_n = s.q.ne[1], hv = s.v.ne[1];
    const int64_t nt = s.q.ne[2], n_tiles = (sv + DN_COLS - 1) / DN_COLS;
    const int64_t h = blockIdx.x % hv, b = (blockIdx.x / hv) / n_tiles;
    const int64_t j = (blockIdx.x / hv) % n_tiles * DN_COLS + threadIdx.x, hk = h % hk_n;
    const bool active = j < sv;
    float *S = sh, *qs = sh + sk * DN_COLS, *ks = qs + sk;
    const int tj = threadIdx.x;
    const int64_t ne2 = nt + sk;
    if (active)
        for (int64_t i = 0; i < sk; i++)
            S[i * DN_COLS + tj] = cu_getf(s.state, j, i, h, b);
    for (int64_t t = 0; t < nt; t++) {
        __syncthreads(); /* the previous token's q and k are no longer read */
        for (int64_t i = tj; i < sk; i += DN_COLS) {
            qs[i] = cu_getf(s.q, i, hk, t, b);
            ks[i] = cu_getf(s.k, i, hk, t, b);
        }
        __syncthreads();
        if (!active)
            continue;
        const float a = expf(cu_getf(s.g, h, t, b, 0)), beta = cu_getf(s.beta, h, t, b, 0);
        float kv = 0.0f;
        for (int64_t i = 0; i < sk; i++) {
            float x = __fmul_rn(S[i * DN_COLS + tj], a);
            S[i * DN_COLS + tj] = x;
            kv = __fadd_rn(kv, __fmul_rn(ks[i], x));
        }
        const float delta = __fmul_rn(beta, __fsub_rn(cu_getf(s.v, j, h, t, b), kv));
        float o = 0.0f;
        for (int64_t i = 0; i < sk; i++) {
            float x = __fadd_rn(S[i * DN_COLS + tj], __fmul_rn(ks[i], delta));
            S[i * DN_COLS + tj] = x;
            o = __fadd_rn(o, __fmul_rn(qs[i], x));
        }
        out[((b * ne2 + t) * hv + h) * sv + j] = __fmul_rn(o, scale);
    }
    if (active)
        for (int64_t i = 0; i < sk; i++)
            out[((b * ne2 + nt + i) * hv + h) * sv + j] = S[i * DN_COLS + tj];
}

static lt_status launch_back(struct cuda_ctx *c, struct lt_tensor *node);

lt_status delta_net_cuda_compute(struct cuda_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!delta_net_cuda_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    if (node->op == LT_OP_DELTA_NET_BACK)
        return launch_back(c, node);
    struct dn_srcs s = {cu_view(node->src[SRC_Q]),    cu_view(node->src[SRC_K]),
                        cu_view(node->src[SRC_V]),    cu_view(node->src[SRC_G]),
                        cu_view(node->src[SRC_BETA]), cu_view(node->src[SRC_STATE])};
    const int64_t sk = s.q.ne[0], sv = s.v.ne[0], hv = s.v.ne[1], nb = s.q.ne[3];
    const int64_t blocks = hv * nb * ((sv + DN_COLS - 1) / DN_COLS);
    if (blocks == 0)
        return LT_OK;
    if (blocks > 0x7fffffff)
        return cu_refuse(node, "too many heads and sequences for one grid");
    const size_t shared = sizeof(float) * (size_t)sk * (DN_COLS + 2);
    delta_net_kernel<<<(unsigned)blocks, DN_COLS, shared, c->stream>>>(
        s, (float *)node->data, lt_get_param_f32(node, 0));
    return cu_launched("delta_net");
}

/* ---- backward ---- */

struct dn_back_layout {
    int64_t sk, sv, hk, hv, nt, nb, seg, n_seg;
    int64_t off_q, off_k, off_v, off_g, off_beta, off_state; /* in the flat result */
    int64_t scratch_per_block;                                 /* floats */
};

static int64_t back_segment(int64_t nt)
{
    int64_t seg = (int64_t)ceil(sqrt((double)nt));
    return seg < 1 ? 1 : seg;
}

/* One recurrent step of (h, b) at token t on S (column j per thread); e (optional, global)
 * receives v - S~^T k. Shared ks is overwritten. */
static __device__ void back_step(const struct dn_srcs &s, float *S, int64_t sp, float *ks,
                                 int64_t h, int64_t hk, int64_t t, int64_t b, float *e)
{
    const int64_t sk = s.q.ne[0], sv = s.v.ne[0];
    __syncthreads();
    for (int64_t i = threadIdx.x; i < sk; i += blockDim.x)
        ks[i] = cu_getf(s.k, i, hk, t, b);
    __syncthreads();
    const float a = expf(cu_getf(s.g, h, t, b, 0)), beta = cu_getf(s.beta, h, t, b, 0);
    for (int64_t j = threadIdx.x; j < sv; j += blockDim.x) {
        float kv = 0.0f;
        for (int64_t i = 0; i < sk; i++) {
            float x = __fmul_rn(S[i * sp + j], a);
            S[i * sp + j] = x;
            kv = __fadd_rn(kv, __fmul_rn(ks[i], x));
        }
        const float ej = __fsub_rn(cu_getf(s.v, j, h, t, b), kv);
        if (e)
            e[j] = ej;
        const float d = __fmul_rn(beta, ej);
        for (int64_t i = 0; i < sk; i++)
            S[i * sp + j] = __fadd_rn(S[i * sp + j], __fmul_rn(ks[i], d));
    }
    __syncthreads();
}

/* block: (key head hk, sequence b); its value heads h = hk, hk + H_k, ... in turn */
static __global__ void __launch_bounds__(DN_BACK_MAX_THREADS)
delta_net_back_kernel(struct dn_srcs s, struct cu_t grad, float *out,
                                             float *scratch, struct dn_back_layout L, float scale)
{
    extern __shared__ float sh[];
    __shared__ double red[32];
    const int64_t sk = L.sk, sv = L.sv, nt = L.nt, sp = sv + 1, tid = threadIdx.x,
                  nth = blockDim.x;
    const int64_t hk = blockIdx.x % L.hk, b = blockIdx.x / L.hk;
    float *S = sh, *dS = S + sk * sp, *qs = dS + sk * sp, *ks = qs + sk, *dout = ks + sk,
          *delta = dout + sv, *ev = delta + sv, *dkv = ev + sv;
    float *ckpt = scratch + blockIdx.x * L.scratch_per_block;
    float *prev = ckpt + L.n_seg * sk * sv, *E = prev + L.seg * sk * sv;
    float *dq = out + L.off_q, *dk = out + L.off_k, *dv = out + L.off_v, *dg = out + L.off_g,
          *dbeta = out + L.off_beta, *dstate = out + L.off_state;

    /* dq and dk of this key head start at zero; thread i owns element i throughout */
    for (int64_t t = 0; t < nt; t++)
        for (int64_t i = tid; i < sk; i += nth) {
            dq[((b * nt + t) * L.hk + hk) * sk + i] = 0.0f;
            dk[((b * nt + t) * L.hk + hk) * sk + i] = 0.0f;
        }
    for (int64_t h = hk; h < L.hv; h += L.hk) {
        __syncthreads();
        for (int64_t x = tid; x < sk * sv; x += nth)
            S[x / sv * sp + x % sv] = cu_getf(s.state, x % sv, x / sv, h, b);
        /* forward again, keeping the state before every seg-th token */
        for (int64_t t = 0; t < nt; t++) {
            if (t % L.seg == 0) {
                __syncthreads();
                for (int64_t x = tid; x < sk * sv; x += nth)
                    ckpt[(t / L.seg) * sk * sv + x] = S[x / sv * sp + x % sv];
            }
            back_step(s, S, sp, ks, h, hk, t, b, NULL);
        }
        /* the gradient of the final state: rows T.. of grad */
        for (int64_t x = tid; x < sk * sv; x += nth)
            dS[x / sv * sp + x % sv] = cu_getf(grad, x % sv, h, nt + x / sv, b);
        for (int64_t t0 = nt > 0 ? (nt - 1) / L.seg * L.seg : -1; t0 >= 0; t0 -= L.seg) {
            const int64_t n = nt - t0 < L.seg ? nt - t0 : L.seg;
            __syncthreads();
            for (int64_t x = tid; x < sk * sv; x += nth)
                S[x / sv * sp + x % sv] = ckpt[(t0 / L.seg) * sk * sv + x];
            for (int64_t r = 0; r < n; r++) {
                __syncthreads();
                for (int64_t x = tid; x < sk * sv; x += nth)
                    prev[r * sk * sv + x] = S[x / sv * sp + x % sv];
                back_step(s, S, sp, ks, h, hk, t0 + r, b, E + r * sv);
            }
            for (int64_t r = n - 1; r >= 0; r--) {
                const int64_t t = t0 + r, tok = b * nt + t;
                const float *pv = prev + r * sk * sv;
                const float a = expf(cu_getf(s.g, h, t, b, 0)), beta = cu_getf(s.beta, h, t, b, 0);
                __syncthreads();
                for (int64_t i = tid; i < sk; i += nth) {
                    qs[i] = cu_getf(s.q, i, hk, t, b);
                    ks[i] = cu_getf(s.k, i, hk, t, b);
                }
                for (int64_t j = tid; j < sv; j += nth) {
                    dout[j] = cu_getf(grad, j, h, t, b);
                    ev[j] = E[r * sv + j];
                    delta[j] = __fmul_rn(beta, ev[j]);
                }
                __syncthreads();
                /* o = scale S^T q with S = a prev + k delta^T: dq, dS += scale q dout^T, and
                 * dk = dS delta; by row (thread i) */
                float my_dq = 0.0f, my_dk = 0.0f; /* blockDim >= S_k: one row a thread */
                for (int64_t i = tid; i < sk; i += nth) {
                    float o = 0.0f, d = 0.0f;
                    const float sq = __fmul_rn(scale, qs[i]);
                    for (int64_t j = 0; j < sv; j++) {
                        float row = __fadd_rn(__fmul_rn(a, pv[i * sv + j]), __fmul_rn(ks[i], delta[j]));
                        o = __fadd_rn(o, __fmul_rn(row, dout[j]));
                        float x = __fadd_rn(dS[i * sp + j], __fmul_rn(sq, dout[j]));
                        dS[i * sp + j] = x;
                        d = __fadd_rn(d, __fmul_rn(x, delta[j]));
                    }
                    my_dq = __fmul_rn(scale, o);
                    my_dk = d;
                }
                __syncthreads();
                /* delta = beta (v - S~^T k): ddelta = dS^T k, then dv, dbeta; by column */
                double part = 0.0;
                for (int64_t j = tid; j < sv; j += nth) {
                    float dd = 0.0f;
                    for (int64_t i = 0; i < sk; i++)
                        dd = __fadd_rn(dd, __fmul_rn(ks[i], dS[i * sp + j]));
                    dv[(tok * L.hv + h) * sv + j] = __fmul_rn(beta, dd);
                    dkv[j] = -__fmul_rn(beta, dd);
                    part += (double)__fmul_rn(dd, ev[j]);
                }
                const double db = cu_block_sum(part, red); /* synchronises: dkv is ready */
                /* kv = S~^T k with S~ = a prev: dS~ = dS + k dkv^T, dk += S~ dkv,
                 * dg = <dS~, S~>, and the gradient of prev is a dS~; by row */
                part = 0.0;
                for (int64_t i = tid; i < sk; i += nth) {
                    float d = 0.0f, gsum = 0.0f;
                    for (int64_t j = 0; j < sv; j++) {
                        const float row = __fmul_rn(a, pv[i * sv + j]);
                        const float x = __fadd_rn(dS[i * sp + j], __fmul_rn(ks[i], dkv[j]));
                        d = __fadd_rn(d, __fmul_rn(row, dkv[j]));
                        gsum = __fadd_rn(gsum, __fmul_rn(x, row));
                        dS[i * sp + j] = __fmul_rn(x, a);
                    }
                    part += (double)gsum;
                    my_dk = __fadd_rn(my_dk, d);
                    dq[(tok * L.hk + hk) * sk + i] = __fadd_rn(dq[(tok * L.hk + hk) * sk + i], my_dq);
                    dk[(tok * L.hk + hk) * sk + i] = __fadd_rn(dk[(tok * L.hk + hk) * sk + i], my_dk);
                }
                const double dgs = cu_block_sum(part, red);
                if (tid == 0) {
                    dg[tok * L.hv + h] = (float)dgs;
                    dbeta[tok * L.hv + h] = (float)db;
                }
            }
        }
        __syncthreads();
        for (int64_t x = tid; x < sk * sv; x += nth)
            dstate[(b * L.hv + h) * sk * sv + x] = dS[x / sv * sp + x % sv];
    }
}

static lt_status launch_back(struct cuda_ctx *c, struct lt_tensor *node)
{
    struct dn_srcs s = {cu_view(node->src[1 + SRC_Q]),    cu_view(node->src[1 + SRC_K]),
                        cu_view(node->src[1 + SRC_V]),    cu_view(node->src[1 + SRC_G]),
                        cu_view(node->src[1 + SRC_BETA]), cu_view(node->src[1 + SRC_STATE])};
    struct dn_back_layout L;
    L.sk = s.q.ne[0], L.sv = s.v.ne[0], L.hk = s.q.ne[1], L.hv = s.v.ne[1], L.nt = s.q.ne[2],
    L.nb = s.q.ne[3];
    L.seg = back_segment(L.nt);
    L.n_seg = L.nt > 0 ? (L.nt + L.seg - 1) / L.seg : 1;
    L.off_q = 0;
    L.off_k = L.off_q + lt_nelements(node->src[1 + SRC_Q]);
    L.off_v = L.off_k + lt_nelements(node->src[1 + SRC_K]);
    L.off_g = L.off_v + lt_nelements(node->src[1 + SRC_V]);
    L.off_beta = L.off_g + lt_nelements(node->src[1 + SRC_G]);
    L.off_state = L.off_beta + lt_nelements(node->src[1 + SRC_BETA]);
    L.scratch_per_block = (L.n_seg + L.seg) * L.sk * L.sv + L.seg * L.sv;
    const int64_t blocks = L.hk * L.nb;
    if (blocks == 0)
        return LT_OK;
    void *scratch;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK,
                              sizeof(float) * (size_t)(blocks * L.scratch_per_block), &scratch);
    if (st != LT_OK)
        return st;
    const size_t shared = back_shared_bytes(L.sk, L.sv);
    st = cu_check(cudaFuncSetAttribute(delta_net_back_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared),
                  "raising delta_net_back's shared memory");
    if (st != LT_OK)
        return st;
    int64_t threads = (L.sk > L.sv ? L.sk : L.sv);
    threads = (threads + 31) / 32 * 32;
    delta_net_back_kernel<<<(unsigned)blocks, (unsigned)threads, shared, c->stream>>>(
        s, cu_view(node->src[0]), (float *)node->data, (float *)scratch, L,
        lt_get_param_f32(node, 0));
    return cu_launched("delta_net_back");
}

const struct cuda_family cuda_family_delta_net = {"delta_net", delta_net_ops, 2,
                                                  delta_net_cuda_supported,
                                                  delta_net_cuda_compute};
