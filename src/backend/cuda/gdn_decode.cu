/* gdn_decode.cu: GDN_DECODE on the device, one decode token of a Gated DeltaNet layer from
 * its projections to its gated norm in one launch (see src/ops/gdn_decode.c for what it
 * replaces and the layout of the result).
 *
 * Blocks take w value columns of one (value head h, sequence s): S_v is halved from the
 * whole head (at most 512) toward 16 columns until the blocks fill the device twice over
 * (plan_of: a decode token of Qwen3.5-0.8B, 16 value heads of 128, has 128 blocks of 16
 * columns; one block a head, 16 in all, took ~17 us a layer on the H200, most of the device
 * idle). A block has R row groups of w threads (up to 512 threads: w = 16 gives R = 32,
 * each thread 4 of the 128 rows):
 *   1. the block computes the conv and silu of its key head's q and k channels (h % H_k)
 *      into shared memory (every block of the head again: 2 S_k channels of K taps);
 *      without the caches, the first block of the value heads h < H_k (one per key head)
 *      also writes those channels' new conv state into the result;
 *   2. l2-normalises q and k (block sums in double), and every thread works out beta and
 *      the decay exp(g);
 *   3. thread (j, r) takes value column j and key rows r, r + R, ...: group 0 computes the
 *      conv and silu of v channel j (each v channel is its block's own, so its new conv
 *      state is written here, once); then the column of the delta rule in two walks down
 *      the thread's rows of S[:, j]: the first sums k . (decay S[:, j]), the second writes
 *      the new column and sums q . S'[:, j]; each walk's R partial sums are added in group
 *      order by group 0, which leaves o_j (times the scale) in the result's y;
 *   4. the last block of a (value head, sequence) to finish, known by counting the
 *      blocks' arrivals in one of the context's counters (cu_ctx's counters; it sets it back
 *      to zero), takes the rms_norm of o over S_v (a sum in double) and writes y =
 *      rms_norm(o) * norm_w * silu(z) over it. With more heads x sequences than counters a
 *      second kernel does this instead (a block per head and sequence;
 *      LATHE_CUDA_GDN_UNFUSED=1 forces it, for the tests). A second kernel always cost
 *      ~4 us a layer on the H200.
 * Each thread's first GDN_ROWS_REG rows of its state column are loaded into registers
 * first thing, so that their latency hides behind steps 1 and 2.
 * So every channel's new conv state is written exactly once, and nothing outside the
 * node's own result is written, but for the caches given seq_ids.
 *
 * Given seq_ids (read on the device) the states are the caches and sequence b reads slot
 * ids[b]; the second walk then writes the new column over the old one in the ssm cache,
 * each element by the thread that read it, and each block owns its columns of its value
 * head's slice of the slot, so nothing races (distinct ids, the caller's promise). The new
 * conv state goes over the old one in the conv cache: a v channel's by the thread that
 * reads it (no other does), a key head's q and k channels' (which every block of its H_v /
 * H_k value heads reads) by the last of those blocks to have read them (step 1), counted
 * in a second counter (or, unfused, by the norm kernel's block of value head hk). A block whose
 * id is outside [0, N) writes zeros for its y and returns, touching no slot.
 *
 * Rounding follows the CPU's order (each product and sum rounded on its own, __fmul_rn /
 * __fadd_rn, no fused multiply-add; the norm factors summed in double and rounded once);
 * the sums of squares are added in another order and CUDA's expf / log1pf are not glibc's,
 * so the device agrees with the CPU to rounding, not bits. Sources may have any strides
 * (whole elements). Limit: 2 S_k + (2 + R) w floats of shared memory a block, within the
 * 48 KiB a block gets without opting in (S_k = S_v = 128 in blocks of 16 columns takes
 * 3.2 KiB). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "lathe/ops.h"

static const enum lt_op gdn_decode_ops[] = {LT_OP_GDN_DECODE};

/* the sources, in lt_gdn_decode's argument order (src/ops/gdn_decode.c) */
enum {
    GDN_QKV,
    GDN_Z,
    GDN_BETA,
    GDN_ALPHA,
    GDN_CONV_STATE,
    GDN_SSM_STATE,
    GDN_CONV_W,
    GDN_DT,
    GDN_A,
    GDN_NORM_W,
    GDN_SEQ_IDS,
    GDN_SRC_COUNT
};

#define GDN_MAX_THREADS 512
#define GDN_SHARED_MAX (48 * 1024)
#define GDN_L2_EPS 1e-6f /* lt_l2_norm's eps in build_delta_layer */
#define GDN_ROWS_REG 4   /* state rows a thread holds in registers (S_k 128 in 32 groups) */

struct gdn_shape {
    int64_t sk, sv, hk, hv, c, k, s;
    int64_t n_slot; /* the caches' slots given seq_ids, else S */
};

static bool fits(const struct lt_tensor *t, int64_t n0, int64_t n1, int64_t n2, int64_t n3)
{
    return t->ne[0] == n0 && t->ne[1] == n1 && t->ne[2] == n2 && t->ne[3] == n3;
}

/* the constructor's shape rule, again, for a node however it was made */
static bool gdn_shape_of(const struct lt_tensor *node, struct gdn_shape *d)
{
    const struct lt_tensor *const *src = node->src;
    d->hk = lt_get_param_i32(node, 1);
    d->sv = src[GDN_NORM_W]->ne[0];
    d->hv = src[GDN_BETA]->ne[0];
    d->s = src[GDN_BETA]->ne[1];
    d->c = src[GDN_QKV]->ne[0];
    d->k = src[GDN_CONV_W]->ne[0];
    if (d->hk < 1 || d->sv < 1 || d->hv < 1 || d->s < 1 || d->k < 2 || d->hv % d->hk != 0)
        return false;
    const int64_t key2 = d->c - d->sv * d->hv;
    if (key2 < 2 * d->hk || key2 % (2 * d->hk) != 0)
        return false;
    d->sk = key2 / (2 * d->hk);
    const bool caches = src[GDN_SEQ_IDS] != nullptr;
    d->n_slot = caches ? src[GDN_SSM_STATE]->ne[3] : d->s;
    if (d->n_slot < 1 || (caches && !fits(src[GDN_SEQ_IDS], d->s, 1, 1, 1)))
        return false;
    const int64_t n = d->sv * d->hv * d->s +
                      (caches ? 0 : (d->k - 1) * d->c * d->s + d->sv * d->sk * d->hv * d->s);
    return fits(src[GDN_NORM_W], d->sv, 1, 1, 1) && fits(src[GDN_BETA], d->hv, d->s, 1, 1) &&
           fits(src[GDN_ALPHA], d->hv, d->s, 1, 1) && fits(src[GDN_QKV], d->c, d->s, 1, 1) &&
           fits(src[GDN_Z], d->sv * d->hv, d->s, 1, 1) && fits(src[GDN_CONV_W], d->k, d->c, 1, 1) &&
           fits(src[GDN_CONV_STATE], d->k - 1, d->c, d->n_slot, 1) &&
           fits(src[GDN_SSM_STATE], d->sv, d->sk, d->hv, d->n_slot) &&
           fits(src[GDN_DT], d->hv, 1, 1, 1) && fits(src[GDN_A], d->hv, 1, 1, 1) &&
           lt_nelements(node) == n;
}

/* How a launch is cut (one function for the claim and the launcher): value columns a block
 * w (S_v halved from the whole head down to 16 until the blocks fill the device twice over,
 * at most 512), the blocks' row groups R (up to 512 threads, 32 groups, S_k), their threads
 * (w R rounded up to a warp) and the blocks of a head, split. */
struct gdn_plan {
    int64_t w, split;
    int groups, threads;
    size_t shared; /* q, k [S_k]; v, delta [w]; partial sums [R][w] */
};

#define GDN_FILL_BLOCKS 264 /* two blocks an SM of an H200 */

static struct gdn_plan plan_of(const struct gdn_shape &d)
{
    struct gdn_plan p;
    p.w = d.sv < GDN_MAX_THREADS ? d.sv : GDN_MAX_THREADS;
    while (p.w > 16 && (d.sv + p.w - 1) / p.w * d.hv * d.s < GDN_FILL_BLOCKS)
        p.w = (p.w + 1) / 2;
    p.split = (d.sv + p.w - 1) / p.w;
    int64_t r = GDN_MAX_THREADS / p.w;
    r = r > 32 ? 32 : r;
    r = r > d.sk ? d.sk : r;
    p.groups = r < 1 ? 1 : (int)r;
    p.threads = (int)((p.w * p.groups + 31) / 32 * 32);
    p.shared = sizeof(float) * (size_t)(2 * d.sk + 2 * p.w + p.groups * p.w);
    return p;
}

/* LATHE_CUDA_GDN_UNFUSED=1 in the environment (read once) */
static bool unfused_asked(void)
{
    const char *env = getenv("LATHE_CUDA_GDN_UNFUSED");
    return env && strcmp(env, "1") == 0;
}

/* whether the norm runs in the decode kernel's last block of each head (one launch; a
 * counter a value head and one a key head, a sequence, CU_COUNTERS of them) or in a second
 * kernel (more heads x sequences than counters) */
static bool gdn_fused(const struct gdn_shape &d)
{
    static const bool unfused = unfused_asked();
    return !unfused && (d.hv + d.hk) * d.s <= CU_COUNTERS;
}

bool cu_gdn_decode_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->op != LT_OP_GDN_DECODE) {
        snprintf(reason, reason_size, "%s is not GDN_DECODE", lt_op_name(node->op));
        return false;
    }
    for (int i = 0; i < GDN_SRC_COUNT; i++) {
        if (i == GDN_SEQ_IDS && !node->src[i])
            continue; /* no ids: the states are the sequences' own */
        const uint64_t types = i == GDN_CONV_W    ? CU_TYPES_FLOAT
                               : i == GDN_SEQ_IDS ? CU_TYPES_I32
                                                  : CU_TYPES_F32;
        if (!cu_check_source(node, i, types, reason, reason_size))
            return false;
    }
    const struct lt_tensor *ids = node->src[GDN_SEQ_IDS];
    if (ids && !lt_is_contiguous(ids)) {
        snprintf(reason, reason_size, "the sequence ids (source %d, %s) are not contiguous",
                 GDN_SEQ_IDS, lt_layout_name(ids));
        return false;
    }
    if (!cu_check_result_f32(node, reason, reason_size))
        return false;
    struct gdn_shape d;
    if (!gdn_shape_of(node, &d)) {
        snprintf(reason, reason_size, "the sources' and result's shapes do not fit");
        return false;
    }
    /* the kernel's own 32 doubles of reduction space come out of the same 48 KiB */
    const size_t shared_max = GDN_SHARED_MAX - 32 * sizeof(double);
    const struct gdn_plan p = plan_of(d);
    if (p.shared > shared_max) {
        snprintf(reason, reason_size,
                 "S_k %lld and S_v %lld need %zu bytes of shared memory a block (at most %zu)",
                 (long long)d.sk, (long long)d.sv, p.shared, shared_max);
        return false;
    }
    if (d.hv * d.s * p.split > INT32_MAX) {
        snprintf(reason, reason_size, "%lld value heads x %lld sequences: too many blocks",
                 (long long)d.hv, (long long)d.s);
        return false;
    }
    return true;
}

struct gdn_srcs {
    struct cu_t qkv, z, beta, alpha, conv_state, ssm_state, conv_w, dt, a, norm_w;
    const int32_t *ids; /* [S], contiguous; NULL: sequence b's states are slot b */
};

/* silu of the conv of channel c of sequence b, whose carried inputs are in slot `slot`
 * (ssm_conv.c's order: taps summed from the oldest input); writes the channel's new conv
 * state (its last K - 1 inputs) into the result's part when conv_new is given, or over the
 * old one in the conv cache when in_place (each input after it was read) */
static __device__ float conv_silu(const struct gdn_srcs &s, int64_t c, int64_t b, int64_t slot,
                                  float *conv_new, bool in_place)
{
    const int64_t K = s.conv_w.ne[0], C = s.qkv.ne[0];
    float acc = 0.0f;
    for (int64_t t = 0; t < K; t++) {
        const float x =
            t < K - 1 ? cu_getf(s.conv_state, t, c, slot, 0) : cu_getf(s.qkv, c, b, 0, 0);
        acc = __fadd_rn(acc, __fmul_rn(cu_get(s.conv_w, t, c, 0, 0), x));
        if (conv_new && t > 0)
            conv_new[(b * C + c) * (K - 1) + t - 1] = x;
        if (in_place && t > 0)
            *(float *)cu_ptr(s.conv_state, t - 1, c, slot, 0) = x;
    }
    return acc / (1.0f + expf(-acc));
}

/* The new conv state of key head hk's q and k channels of sequence b over the old one in
 * the conv cache's slot: each channel's inputs moved one step back and this token's qkv
 * appended. Run by one block once every block reading those channels has read them. */
static __device__ void qk_conv_store(const struct gdn_srcs &s, int64_t n_k_heads, int64_t hk,
                                     int64_t b, int64_t slot)
{
    const int64_t sk = s.ssm_state.ne[1], K = s.conv_w.ne[0];
    for (int64_t i = threadIdx.x; i < 2 * sk; i += blockDim.x) {
        const int64_t c = i < sk ? hk * sk + i : n_k_heads * sk + hk * sk + (i - sk);
        for (int64_t t = 0; t < K - 1; t++) {
            const float x =
                t < K - 2 ? cu_getf(s.conv_state, t + 1, c, slot, 0) : cu_getf(s.qkv, c, b, 0, 0);
            *(float *)cu_ptr(s.conv_state, t, c, slot, 0) = x;
        }
    }
}

/* the R partial sums of column jj ([R][w]), added in group order */
static __device__ __forceinline__ float group_sum(const float *part, int64_t w, int64_t jj,
                                                  int n_groups)
{
    float acc = part[jj];
    for (int g = 1; g < n_groups; g++)
        acc = __fadd_rn(acc, part[g * w + jj]);
    return acc;
}

/* 4. y = rms_norm(o) * norm_w * silu(z) over the S_v of value head h of sequence b, o being
 * what the walks left in y, by the whole block (a skipped sequence's zeros stay zeros). L2
 * loads (__ldcg): in the fused kernel other blocks wrote most of y. */
static __device__ void gdn_norm(const struct gdn_srcs &s, float *out, float eps, int64_t h,
                                int64_t b, double *red)
{
    const int64_t sv = s.ssm_state.ne[0], hv = s.ssm_state.ne[2];
    float *y = out + (b * hv + h) * sv;
    double so = 0.0;
    for (int64_t j = threadIdx.x; j < sv; j += blockDim.x) {
        const double o = (double)__ldcg(y + j);
        so += o * o;
    }
    so = cu_block_sum(so, red) / (double)sv; /* its barriers order the reads before the writes */
    const float f = (float)(1.0 / sqrt(so + (double)eps));
    for (int64_t j = threadIdx.x; j < sv; j += blockDim.x) {
        const float zj = cu_getf(s.z, h * sv + j, b, 0, 0);
        const float zs = zj / (1.0f + expf(-zj));
        const float on = __fmul_rn(__fmul_rn(__ldcg(y + j), f), cu_getf(s.norm_w, j, 0, 0, 0));
        y[j] = __fmul_rn(on, zs);
    }
}

/* the unfused form's second kernel: block (h, b); given the caches, the blocks of the
 * value heads h < H_k also store key head h's q and k conv state (the first kernel, which
 * read it, has finished) */
static __global__ void gdn_norm_kernel(struct gdn_srcs s, float *out, float eps, int64_t n_k_heads)
{
    cu_pdl_enter();
    __shared__ double red[32];
    const int64_t hv = s.ssm_state.ne[2], h = blockIdx.x % hv, b = blockIdx.x / hv;
    gdn_norm(s, out, eps, h, b, red);
    const int64_t slot = s.ids ? (int64_t)s.ids[b] : -1;
    if (h < n_k_heads && slot >= 0 && slot < s.ssm_state.ne[3])
        qk_conv_store(s, n_k_heads, h, b, slot);
}

/* PDL (cuda_common.h): before its wait, a block asks L2 for what it reads that the product
 * ahead does not write: its columns of the state, the conv state and conv weights of its
 * channels, and the norm's weight. Hints only (cu_prefetch_l2 changes no value), so a slot
 * id read here is only an address, kept inside the cache. Without PDL they are issued just
 * before the loads, and cost a few instructions. */
static __device__ void gdn_prefetch(const struct gdn_srcs &s, int64_t n_k_heads, int64_t w,
                                    int64_t split)
{
    const int64_t sv = s.ssm_state.ne[0], sk = s.ssm_state.ne[1], hv = s.ssm_state.ne[2];
    const int64_t K = s.conv_w.ne[0];
    const int64_t hb = blockIdx.x / split, h = hb % hv, b = hb / hv, hk = h % n_k_heads;
    const int64_t j0 = blockIdx.x % split * w, cols = sv - j0 < w ? sv - j0 : w;
    const int64_t slot = s.ids ? (int64_t)s.ids[b] : b;
    if (slot < 0 || slot >= s.ssm_state.ne[3])
        return;
    const int t = threadIdx.x;
    if (s.ssm_state.nb[0] == (int64_t)sizeof(float))
        for (int64_t i = t; i < sk; i += blockDim.x)
            cu_prefetch_l2_span(cu_ptr(s.ssm_state, j0, i, h, slot), cols * (int64_t)sizeof(float));
    /* channel runs [c, c + n): the key head's q and k, the block's v */
    const int64_t c0[3] = {hk * sk, n_k_heads * sk + hk * sk, 2 * n_k_heads * sk + h * sv + j0};
    const int64_t n[3] = {sk, sk, cols};
    if (t < 3 && s.conv_state.nb[0] == (int64_t)sizeof(float) &&
        s.conv_state.nb[1] == (K - 1) * (int64_t)sizeof(float))
        cu_prefetch_l2_span(cu_ptr(s.conv_state, 0, c0[t], slot, 0),
                            n[t] * (K - 1) * (int64_t)sizeof(float));
    if (t >= 32 && t < 35 && s.conv_w.nb[1] == K * s.conv_w.nb[0])
        cu_prefetch_l2_span(cu_ptr(s.conv_w, 0, c0[t - 32], 0, 0), n[t - 32] * s.conv_w.nb[1]);
    if (t == 64 && s.norm_w.nb[0] == (int64_t)sizeof(float))
        cu_prefetch_l2_span(s.norm_w.data, sv * (int64_t)sizeof(float));
}

/* block: columns [j0, j0 + w) of value head h of sequence b, blockIdx = (b H_v + h) split +
 * part, j0 = part w (see the file comment); shared: q, k [S_k], v, delta [w], partial sums
 * [R][w]. y gets the raw o (times the scale); FUSED: the head's last block finishes it,
 * else gdn_norm_kernel does. */
template <bool FUSED>
static __global__ void __launch_bounds__(GDN_MAX_THREADS)
    gdn_decode_kernel(struct gdn_srcs s, float *out, int64_t n_k_heads, int64_t w, int64_t split,
                      int n_groups, float eps, int *counters)
{
    gdn_prefetch(s, n_k_heads, w, split);
    cu_pdl_enter();
    extern __shared__ float sh[];
    __shared__ double red[32];
    const int64_t sv = s.ssm_state.ne[0], sk = s.ssm_state.ne[1], hv = s.ssm_state.ne[2],
                  n_slot = s.ssm_state.ne[3], ns = s.qkv.ne[1], C = s.qkv.ne[0], K = s.conv_w.ne[0];
    const int64_t part_i = blockIdx.x % split, hb = blockIdx.x / split;
    const int64_t h = hb % hv, b = hb / hv, hk = h % n_k_heads, j0 = part_i * w;
    const int64_t slot = s.ids ? (int64_t)s.ids[b] : b;
    float *q = sh, *k = sh + sk, *vj = sh + 2 * sk, *dj = vj + w, *part = dj + w;
    float *conv_new = out + sv * hv * ns;
    float *y = out + (b * hv + h) * sv;
    /* thread (jj, r): column j0 + jj, rows r, r + R, ...; threads past w R only join the
     * barriers and sums */
    const int64_t jj = threadIdx.x % w, r = threadIdx.x / w, j = j0 + jj;
    const bool col = r < n_groups && j < sv;
    /* without the caches, the q and k channels' new conv state goes to the result, written
     * by the first part of the first value head reading it (with them, qk_conv_store
     * writes it once every reader is done) */
    const bool qk_writer = !s.ids && h < n_k_heads && part_i == 0;

    if (slot < 0 || slot >= n_slot) {
        /* a skipped sequence (only given the caches, so the result has no conv part): zeros
         * for y (the whole block returns, before any barrier) */
        if (col && r == 0)
            y[j] = 0.0f;
        return;
    }

    /* the thread's first GDN_ROWS_REG rows of its state column, loaded before anything
     * else so that their latency overlaps the conv and the norms (the rest, when S_k >
     * GDN_ROWS_REG R, are read in the walks) */
    const char *st = cu_ptr(s.ssm_state, 0, 0, h, slot);
    const int64_t nb0 = s.ssm_state.nb[0], nb1 = s.ssm_state.nb[1];
    float sreg[GDN_ROWS_REG];
#pragma unroll
    for (int t = 0; t < GDN_ROWS_REG; t++) {
        const int64_t i = r + (int64_t)t * n_groups;
        sreg[t] = col && i < sk ? *(const float *)(st + j * nb0 + i * nb1) : 0.0f;
    }

    /* 1. q and k of key head hk */
    for (int64_t i = threadIdx.x; i < 2 * sk; i += blockDim.x) {
        const int64_t c = i < sk ? hk * sk + i : n_k_heads * sk + hk * sk + (i - sk);
        sh[i] = conv_silu(s, c, b, slot, qk_writer ? conv_new : nullptr, false);
    }
    __syncthreads();
    if (FUSED && s.ids) {
        /* given the caches: this block is done reading key head hk's q and k inputs; the
         * last of the split H_v / H_k blocks reading them (counted in counters[H_v S + b H_k
         * + hk]) stores their new conv state, while the others go on */
        __shared__ bool last_k;
        int *kc = counters + hv * ns + b * n_k_heads + hk;
        __threadfence();
        if (threadIdx.x == 0)
            last_k = atomicAdd(kc, 1) == (int)(split * (hv / n_k_heads)) - 1;
        __syncthreads();
        if (last_k) {
            __threadfence();
            qk_conv_store(s, n_k_heads, hk, b, slot);
            if (threadIdx.x == 0)
                *kc = 0;
        }
    }

    /* 2. l2 norms (cu_block_sum's barriers also order the reads above before the writes
     * below), beta and the decay */
    double sq = 0.0, skk = 0.0;
    for (int64_t i = threadIdx.x; i < sk; i += blockDim.x) {
        sq += (double)q[i] * (double)q[i];
        skk += (double)k[i] * (double)k[i];
    }
    sq = cu_block_sum(sq, red);
    skk = cu_block_sum(skk, red);
    const float fq = (float)(1.0 / sqrt(sq + (double)GDN_L2_EPS));
    const float fk = (float)(1.0 / sqrt(skk + (double)GDN_L2_EPS));
    for (int64_t i = threadIdx.x; i < sk; i += blockDim.x) {
        q[i] = __fmul_rn(q[i], fq);
        k[i] = __fmul_rn(k[i], fk);
    }
    const float beta = 1.0f / (1.0f + expf(-cu_getf(s.beta, h, b, 0, 0)));
    const float x = __fadd_rn(cu_getf(s.alpha, h, b, 0, 0), cu_getf(s.dt, h, 0, 0, 0));
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    const float decay = expf(__fmul_rn(sp, cu_getf(s.a, h, 0, 0, 0)));
    const float scale = 1.0f / sqrtf((float)sk);
    __syncthreads();

    /* 3. v channel j and column j of the delta rule; the new column goes to the result's
     * state part [S_k][S_v], or over the old one in the cache */
    char *st_new =
        s.ids ? (char *)st : (char *)(conv_new + (K - 1) * C * ns + (b * hv + h) * sk * sv);
    const int64_t wb0 = s.ids ? nb0 : (int64_t)sizeof(float),
                  wb1 = s.ids ? nb1 : (int64_t)sizeof(float) * sv;
    const int64_t i_mem = r + (int64_t)GDN_ROWS_REG * n_groups; /* the first row not in sreg */
    if (col && r == 0)
        vj[jj] = conv_silu(s, 2 * n_k_heads * sk + h * sv + j, b, slot, s.ids ? nullptr : conv_new,
                           s.ids != nullptr);
    if (col) {
        const char *c0 = st + j * nb0;
        float kv = 0.0f;
#pragma unroll
        for (int t = 0; t < GDN_ROWS_REG; t++) {
            const int64_t i = r + (int64_t)t * n_groups;
            if (i < sk)
                kv = __fadd_rn(kv, __fmul_rn(k[i], __fmul_rn(sreg[t], decay)));
        }
        for (int64_t i = i_mem; i < sk; i += n_groups) {
            const float si = __fmul_rn(*(const float *)(c0 + i * nb1), decay);
            kv = __fadd_rn(kv, __fmul_rn(k[i], si));
        }
        part[r * w + jj] = kv;
    }
    __syncthreads();
    if (col && r == 0)
        dj[jj] = __fmul_rn(beta, __fsub_rn(vj[jj], group_sum(part, w, jj, n_groups)));
    __syncthreads();
    if (col) {
        const char *c0 = st + j * nb0;
        char *c_new = st_new + j * wb0;
        const float d = dj[jj];
        float acc = 0.0f;
#pragma unroll
        for (int t = 0; t < GDN_ROWS_REG; t++) {
            const int64_t i = r + (int64_t)t * n_groups;
            if (i < sk) {
                const float si = __fadd_rn(__fmul_rn(sreg[t], decay), __fmul_rn(k[i], d));
                *(float *)(c_new + i * wb1) = si;
                acc = __fadd_rn(acc, __fmul_rn(q[i], si));
            }
        }
        for (int64_t i = i_mem; i < sk; i += n_groups) {
            const float si =
                __fadd_rn(__fmul_rn(*(const float *)(c0 + i * nb1), decay), __fmul_rn(k[i], d));
            *(float *)(c_new + i * wb1) = si;
            acc = __fadd_rn(acc, __fmul_rn(q[i], si));
        }
        part[r * w + jj] = acc;
    }
    __syncthreads();
    if (col && r == 0)
        y[j] = __fmul_rn(group_sum(part, w, jj, n_groups), scale);
    if (!FUSED)
        return;
    /* the head's last block to finish (counted in counters[b H_v + h]) takes its norm, and
     * sets the counter back to zero for the next launch */
    __shared__ bool last;
    __threadfence(); /* this block's y before its arrival is counted */
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(&counters[hb], 1) == (int)split - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence(); /* the other blocks' y, seen through their count, before it is read */
    gdn_norm(s, out, eps, h, b, red);
    if (threadIdx.x == 0)
        counters[hb] = 0;
}

/* ---- the whole-head kernel: a block a (value head, sequence), everything before the wait ----
 *
 * Where it fits (head_fits: S_v = 128, S_k = 32 GDN_HEAD_RPT, K <= 4, the state's rows
 * contiguous and 16-byte aligned), a block of 1024 threads takes a whole value head of one
 * sequence, so no block waits on another (no counter, no second pass over y, but for the
 * key heads' conv state when H_v > H_k given the caches). Warp w holds rows w, w + 32, ...
 * of the head's state, lane l its columns 4l .. 4l + 3: GDN_HEAD_RPT float4 loads a thread.
 * Those loads, the conv inputs carried in the conv state, the conv weights, dt, a and the
 * norm weight are all issued before the PDL wait: none of them is written by the kernel
 * just ahead (the input projection), and every kernel before that one has finished by the
 * time this one starts (each kernel triggers its dependents only after its own wait; see
 * cuda_common.h), so what they wrote is in L2, read through it (__ldcg). After the wait a
 * thread reads one qkv channel (threads 0 .. 2 S_k + S_v - 1: q, k, then v), z, beta and
 * alpha, and the rest is arithmetic and six barriers: the conv and silu, the l2 norms (warp
 * sums in double), the two walks over the registers (each column's 32 warp partial sums
 * added in warp order by its thread), the gated norm. Its rounding is the generic kernel's,
 * term by term; only the order of the sums differs. One block a head took ~18 us a layer
 * when it read its state after the wait (the file comment); the generic kernel's 128 blocks
 * still took ~18 us (Nsight Compute, H100, 2026-12-07), most of it waiting on memory
 * between its phases. This one takes 10.5 us there, and tg128 of the 0.8B files went from
 * 640.7 to 719.7 tokens/s (BF16) and 674.5 to 760.9 (Q8_0) against LATHE_CUDA_GDN_HEAD=0
 * (H100, one run each). */
#define GDN_HEAD_SV 128
#define GDN_HEAD_RPT 4 /* rows a thread: S_k = 128 */
#define GDN_HEAD_THREADS 1024
#define GDN_HEAD_KMAX 4

/* LATHE_CUDA_GDN_HEAD=0 in the environment (read once): the generic kernel everywhere */
static bool head_off(void)
{
    const char *env = getenv("LATHE_CUDA_GDN_HEAD");
    return env && strcmp(env, "0") == 0;
}

static bool head_fits(const struct lt_tensor *node, const struct gdn_shape &d)
{
    static const bool off = head_off() || unfused_asked();
    const struct lt_tensor *ss = node->src[GDN_SSM_STATE];
    const bool caches = node->src[GDN_SEQ_IDS] != nullptr;
    const int64_t state_at = d.sv * d.hv * d.s + (d.k - 1) * d.c * d.s; /* floats into the result */
    return !off && d.sv == GDN_HEAD_SV && d.sk == 32 * GDN_HEAD_RPT && d.k <= GDN_HEAD_KMAX &&
           ss->nb[0] == (int64_t)sizeof(float) && ss->nb[1] % 16 == 0 && ss->nb[2] % 16 == 0 &&
           ss->nb[3] % 16 == 0 && (uintptr_t)ss->data % 16 == 0 &&
           (caches ? d.hv == d.hk || (d.hv + d.hk) * d.s <= CU_COUNTERS
                   : state_at % 4 == 0 && (uintptr_t)node->data % 16 == 0);
}

/* the new conv state of channel c (inputs `tap` carried, this token's x) over the old one
 * in the cache's slot, or into the result's conv part (conv_new) */
static __device__ void conv_store(const struct gdn_srcs &s, int64_t c, int64_t b, int64_t slot,
                                  const float *tap, float x, float *conv_new)
{
    const int64_t K = s.conv_w.ne[0], C = s.qkv.ne[0];
    for (int64_t t = 0; t < K - 1; t++) {
        const float v = t < K - 2 ? tap[t + 1] : x;
        if (conv_new)
            conv_new[(b * C + c) * (K - 1) + t] = v;
        else
            *(float *)cu_ptr(s.conv_state, t, c, slot, 0) = v;
    }
}

static __device__ __forceinline__ float4 f4_mul(float4 a, float f)
{
    return make_float4(__fmul_rn(a.x, f), __fmul_rn(a.y, f), __fmul_rn(a.z, f), __fmul_rn(a.w, f));
}

/* acc + k (s decay), element by element, each operation rounded */
static __device__ __forceinline__ float4 f4_kv(float4 acc, float k, float4 sd)
{
    return make_float4(__fadd_rn(acc.x, __fmul_rn(k, sd.x)), __fadd_rn(acc.y, __fmul_rn(k, sd.y)),
                       __fadd_rn(acc.z, __fmul_rn(k, sd.z)), __fadd_rn(acc.w, __fmul_rn(k, sd.w)));
}

/* thread j < S_v: the sum over the 32 warps' partial sums of column j, in warp order */
static __device__ __forceinline__ float head_col_sum(const float *part, int j)
{
    float acc = part[j];
    for (int w = 1; w < 32; w++)
        acc = __fadd_rn(acc, part[w * GDN_HEAD_SV + j]);
    return acc;
}

template <int RPT>
static __global__ void __launch_bounds__(GDN_HEAD_THREADS, 1)
    gdn_head_kernel(struct gdn_srcs s, float *out, int64_t n_k_heads, float eps, int *counters)
{
    constexpr int SV = GDN_HEAD_SV, SK = 32 * RPT, KM = GDN_HEAD_KMAX;
    __shared__ float q[SK], k[SK], v[SV], dj[SV];
    __shared__ __align__(16) float part[32 * SV];
    __shared__ double red[32];
    const int t = threadIdx.x, lane = t & 31, w = t >> 5;
    const int64_t hv = s.ssm_state.ne[2], n_slot = s.ssm_state.ne[3], ns = s.qkv.ne[1];
    const int64_t C = s.qkv.ne[0], K = s.conv_w.ne[0];
    const int64_t h = blockIdx.x % hv, b = blockIdx.x / hv, hk = h % n_k_heads;
    const int64_t slot = s.ids ? (int64_t)__ldcg(s.ids + b) : b;
    const bool live = slot >= 0 && slot < n_slot;

    /* before the wait: the state, this thread's channel's carried inputs and weights */
    const int64_t nb1 = s.ssm_state.nb[1];
    const char *st = live ? cu_ptr(s.ssm_state, 0, 0, h, slot) : nullptr;
    float4 sr[RPT];
#pragma unroll
    for (int r = 0; r < RPT; r++)
        sr[r] = live ? __ldcg((const float4 *)(st + (w + 32 * r) * nb1) + lane)
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const int64_t ch = t < SK            ? hk * SK + t
                       : t < 2 * SK      ? n_k_heads * SK + hk * SK + (t - SK)
                       : t < 2 * SK + SV ? 2 * n_k_heads * SK + h * SV + (t - 2 * SK)
                                         : -1;
    float tap[KM - 1], wt[KM];
#pragma unroll
    for (int i = 0; i < KM; i++) {
        wt[i] = live && ch >= 0 && i < K ? cu_get(s.conv_w, i, ch, 0, 0) : 0.0f;
        if (i < KM - 1)
            tap[i] = live && ch >= 0 && i < K - 1
                         ? __ldcg((const float *)cu_ptr(s.conv_state, i, ch, slot, 0))
                         : 0.0f;
    }
    const float a_h = cu_getf(s.a, h, 0, 0, 0), dt_h = cu_getf(s.dt, h, 0, 0, 0);
    const float nw = t < SV ? cu_getf(s.norm_w, t, 0, 0, 0) : 0.0f;
    cu_pdl_enter();

    float *y = out + (b * hv + h) * SV;
    if (!live) { /* a skipped sequence (only given the caches): zeros, no slot touched */
        if (t < SV)
            y[t] = 0.0f;
        return;
    }
    const float x = ch >= 0 ? cu_getf(s.qkv, ch, b, 0, 0) : 0.0f;
    const float zt = t < SV ? cu_getf(s.z, h * SV + t, b, 0, 0) : 0.0f;
    const float bt = cu_getf(s.beta, h, b, 0, 0), al = cu_getf(s.alpha, h, b, 0, 0);

    /* the conv and silu of the thread's channel (ssm_conv.c's order), its new conv state */
    float cv = 0.0f;
    if (ch >= 0) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < KM; i++)
            if (i < K)
                acc = __fadd_rn(acc, __fmul_rn(wt[i], i < K - 1 ? tap[i] : x));
        cv = acc / (1.0f + expf(-acc));
        float *conv_new = s.ids ? nullptr : out + SV * hv * ns;
        const bool own = t >= 2 * SK || (s.ids ? hv == n_k_heads : h < n_k_heads);
        if (own) /* v: the block's own; q and k: the only reader's, or the result's writer */
            conv_store(s, ch, b, slot, tap, x, conv_new);
    }

    /* the l2 norms of q (warps 0 .. RPT - 1) and k (RPT .. 2 RPT - 1), beta, the decay */
    const double sq = cu_warp_sum(t < 2 * SK ? (double)cv * (double)cv : 0.0);
    if (lane == 0)
        red[w] = sq;
    __syncthreads();
    double sqq = 0.0, skk = 0.0;
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        sqq += red[i];
        skk += red[RPT + i];
    }
    if (t < SK)
        q[t] = __fmul_rn(cv, (float)(1.0 / sqrt(sqq + (double)GDN_L2_EPS)));
    else if (t < 2 * SK)
        k[t - SK] = __fmul_rn(cv, (float)(1.0 / sqrt(skk + (double)GDN_L2_EPS)));
    else if (t < 2 * SK + SV)
        v[t - 2 * SK] = cv;
    const float beta = 1.0f / (1.0f + expf(-bt));
    const float xa = __fadd_rn(al, dt_h);
    const float sp = xa > 20.0f ? xa : log1pf(expf(xa));
    const float decay = expf(__fmul_rn(sp, a_h));
    const float scale = 1.0f / sqrtf((float)SK);
    __syncthreads();

    /* walk 1: k . (decay S[:, j]) */
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < RPT; r++)
        acc = f4_kv(acc, k[w + 32 * r], f4_mul(sr[r], decay));
    ((float4 *)part)[w * (SV / 4) + lane] = acc;
    __syncthreads();
    if (t < SV)
        dj[t] = __fmul_rn(beta, __fsub_rn(v[t], head_col_sum(part, t)));
    __syncthreads();

    /* walk 2: the new column, S' = decay S + k delta, and q . S'[:, j] */
    const float4 d = ((const float4 *)dj)[lane];
    char *st_new = s.ids ? (char *)st
                         : (char *)(out + SV * hv * ns + (K - 1) * C * ns + (b * hv + h) * SK * SV);
    const int64_t nb1_new = s.ids ? nb1 : (int64_t)sizeof(float) * SV;
    acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < RPT; r++) {
        const int i = w + 32 * r;
        const float4 sd = f4_mul(sr[r], decay);
        const float ki = k[i], qi = q[i];
        const float4 sn =
            make_float4(__fadd_rn(sd.x, __fmul_rn(ki, d.x)), __fadd_rn(sd.y, __fmul_rn(ki, d.y)),
                        __fadd_rn(sd.z, __fmul_rn(ki, d.z)), __fadd_rn(sd.w, __fmul_rn(ki, d.w)));
        ((float4 *)(st_new + i * nb1_new))[lane] = sn;
        acc = f4_kv(acc, qi, sn);
    }
    ((float4 *)part)[w * (SV / 4) + lane] = acc;
    __syncthreads();

    /* the gated norm: y = rms_norm(o) norm_w silu(z), o = (q . S') scale */
    const float o = t < SV ? __fmul_rn(head_col_sum(part, t), scale) : 0.0f;
    const double so = cu_warp_sum((double)o * (double)o);
    if (lane == 0 && w < SV / 32)
        red[w] = so;
    __syncthreads();
    if (t < SV) {
        double sum = 0.0;
        for (int i = 0; i < SV / 32; i++)
            sum += red[i];
        const float f = (float)(1.0 / sqrt(sum / (double)SV + (double)eps));
        const float zs = zt / (1.0f + expf(-zt));
        y[t] = __fmul_rn(__fmul_rn(__fmul_rn(o, f), nw), zs);
    }

    if (s.ids && hv != n_k_heads) {
        /* the key head's q and k channels, read by its H_v / H_k value heads: the last of
         * their blocks to get here (counters[H_v S + b H_k + hk]) stores their new conv state */
        __shared__ bool last_k;
        int *kc = counters + hv * ns + b * n_k_heads + hk;
        if (t == 0) {
            __threadfence();
            last_k = atomicAdd(kc, 1) == (int)(hv / n_k_heads) - 1;
        }
        __syncthreads();
        if (last_k) {
            __threadfence();
            if (t < 2 * SK)
                conv_store(s, ch, b, slot, tap, x, nullptr);
            if (t == 0)
                *kc = 0;
        }
    }
}

lt_status cu_gdn_decode_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_gdn_decode_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    struct gdn_shape d;
    gdn_shape_of(node, &d);
    struct gdn_srcs s = {cu_view(node->src[GDN_QKV]),
                         cu_view(node->src[GDN_Z]),
                         cu_view(node->src[GDN_BETA]),
                         cu_view(node->src[GDN_ALPHA]),
                         cu_view(node->src[GDN_CONV_STATE]),
                         cu_view(node->src[GDN_SSM_STATE]),
                         cu_view(node->src[GDN_CONV_W]),
                         cu_view(node->src[GDN_DT]),
                         cu_view(node->src[GDN_A]),
                         cu_view(node->src[GDN_NORM_W]),
                         nullptr};
    if (node->src[GDN_SEQ_IDS])
        s.ids = (const int32_t *)node->src[GDN_SEQ_IDS]->data;
    const float eps = lt_get_param_f32(node, 0);
    if (head_fits(node, d)) {
        cu_launch_pdl(c, gdn_head_kernel<GDN_HEAD_RPT>, (unsigned)(d.hv * d.s), GDN_HEAD_THREADS, 0,
                      s, (float *)node->data, d.hk, eps, c->counters);
        return cu_launched("gdn_decode (whole heads)");
    }
    const struct gdn_plan p = plan_of(d);
    const unsigned blocks = (unsigned)(d.hv * d.s * p.split);
    if (gdn_fused(d)) {
        cu_launch_pdl(c, gdn_decode_kernel<true>, blocks, p.threads, p.shared, s,
                      (float *)node->data, d.hk, p.w, p.split, p.groups, eps, c->counters);
        return cu_launched("gdn_decode");
    }
    cu_launch_pdl(c, gdn_decode_kernel<false>, blocks, p.threads, p.shared, s, (float *)node->data,
                  d.hk, p.w, p.split, p.groups, eps, nullptr);
    lt_status st = cu_launched("gdn_decode");
    if (st != LT_OK)
        return st;
    const int64_t nt = (d.sv + 31) / 32 * 32;
    cu_launch_pdl(c, gdn_norm_kernel, (unsigned)(d.hv * d.s), (unsigned)(nt < 1024 ? nt : 1024), 0,
                  s, (float *)node->data, eps, d.hk);
    return cu_launched("gdn_decode's norm");
}

const struct cu_family cu_family_gdn_decode = {
    "gdn_decode", gdn_decode_ops, CU_COUNT(gdn_decode_ops), cu_gdn_decode_supported,
    cu_gdn_decode_compute};
