/* ssm_conv.cu: SSM_CONV (the causal depthwise conv1d of Gated DeltaNet) and SSM_CONV_BACK
 * on the device (see src/ops/ssm_conv.c).
 *
 * sx [d_conv - 1 + T, channels, n_seqs] F32 of any strides (time innermost), w
 * [d_conv, channels] F32, F16 or BF16; y[c, t, s] = sum_k w[k, c] sx[t + k, c, s]. A thread
 * computes one output (forward), one element of d sx, or one element of d w, summing in
 * float in the CPU's order with each product and sum rounded on its own, so the device
 * gives the CPU's bits. SSM_CONV_BACK's result packs d sx (sx's shape) and then d w (w's
 * shape), both contiguous. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op ssm_conv_ops[] = {LT_OP_SSM_CONV, LT_OP_SSM_CONV_BACK};

#define SSM_BACK_MAX_K 8 /* the most taps the register-walking kernels below keep */

bool cu_ssm_conv_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const bool back = node->op == LT_OP_SSM_CONV_BACK;
    if (node->op != LT_OP_SSM_CONV && !back) {
        snprintf(reason, reason_size, "%s is not a conv", lt_op_name(node->op));
        return false;
    }
    const int is = back ? 1 : 0;
    if ((back && !cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size)) ||
        !cu_check_source(node, is, CU_TYPES_F32, reason, reason_size) ||
        !cu_check_source(node, is + 1, CU_TYPES_FLOAT, reason, reason_size) ||
        !cu_check_result_f32(node, reason, reason_size))
        return false;
    const struct lt_tensor *sx = node->src[is], *w = node->src[is + 1];
    if (sx->ne[3] != 1 || w->ne[2] != 1 || w->ne[3] != 1 || w->ne[1] != sx->ne[1] ||
        w->ne[0] < 1 || sx->ne[0] < w->ne[0]) {
        snprintf(reason, reason_size, "sx and w do not fit");
        return false;
    }
    const int64_t n_t = sx->ne[0] - w->ne[0] + 1;
    bool shape_ok;
    if (back) {
        const struct lt_tensor *g = node->src[0];
        shape_ok = g->ne[0] == sx->ne[1] && g->ne[1] == n_t && g->ne[2] == sx->ne[2] &&
                   g->ne[3] == 1 && lt_nelements(node) == lt_nelements(sx) + lt_nelements(w);
    } else {
        shape_ok = node->ne[0] == sx->ne[1] && node->ne[1] == n_t && node->ne[2] == sx->ne[2] &&
                   node->ne[3] == 1;
    }
    if (!shape_ok) {
        snprintf(reason, reason_size, "the result's shape does not match its sources");
        return false;
    }
    return true;
}

/* y [C, T, S] contiguous */
static __global__ void ssm_conv_kernel(struct cu_t sx, struct cu_t w, float *y, int64_t n_t)
{
    cu_pdl_enter();
    const int64_t n_c = sx.ne[1], n = n_c * n_t * sx.ne[2], d_conv = w.ne[0];
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        const int64_t c = f % n_c, t = (f / n_c) % n_t, s = f / (n_c * n_t);
        float acc = 0.0f;
        for (int64_t k = 0; k < d_conv; k++)
            acc = __fadd_rn(acc, __fmul_rn(cu_get(w, k, c, 0, 0), cu_getf(sx, t + k, c, s, 0)));
        y[f] = acc;
    }
}

/* The forward for d_conv <= SSM_BACK_MAX_K, by tiles: a block of 32 x 8 threads takes 32
 * channels by 32 time steps of one sequence. sx (time innermost) is read into shared
 * memory a channel row at a time, 32 neighbouring steps by a warp, and y (channels
 * innermost) is written 32 neighbouring channels by a warp; the sums are the thread-an-
 * output kernel's, in the same order (the CPU's bits). That kernel read sx a row apart
 * between neighbouring threads: 0.74 ms a node at 16 x 512 tokens of 6144 channels. */
#define SSM_TILE 32
static __global__ void ssm_conv_tile_kernel(struct cu_t sx, struct cu_t w, float *y, int64_t n_t)
{
    cu_pdl_enter();
    __shared__ float xs[SSM_TILE + SSM_BACK_MAX_K - 1][SSM_TILE + 1]; /* [time][channel] */
    const int64_t n_c = sx.ne[1], c0 = (int64_t)blockIdx.x * SSM_TILE,
                  t0 = (int64_t)blockIdx.y * SSM_TILE, s = blockIdx.z;
    const int d_conv = (int)w.ne[0], tx = threadIdx.x, ty = threadIdx.y;
    const int rows = SSM_TILE + d_conv - 1;
    for (int cc = ty; cc < SSM_TILE; cc += blockDim.y)
        for (int tt = tx; tt < rows; tt += SSM_TILE) {
            const int64_t c = c0 + cc, t = t0 + tt;
            xs[tt][cc] = c < n_c && t < sx.ne[0] ? cu_getf(sx, t, c, s, 0) : 0.0f;
        }
    const int64_t c = c0 + tx;
    float wk[SSM_BACK_MAX_K];
#pragma unroll
    for (int k = 0; k < SSM_BACK_MAX_K; k++)
        wk[k] = k < d_conv && c < n_c ? cu_get(w, k, c, 0, 0) : 0.0f;
    __syncthreads();
    if (c >= n_c)
        return;
    for (int tt = ty; tt < SSM_TILE; tt += blockDim.y) {
        const int64_t t = t0 + tt;
        if (t >= n_t)
            break;
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < SSM_BACK_MAX_K; k++)
            if (k < d_conv)
                acc = __fadd_rn(acc, __fmul_rn(wk[k], xs[tt + k][tx]));
        y[(s * n_t + t) * n_c + c] = acc;
    }
}

/* d sx [L, C, S] contiguous: d sx[u, c, s] = sum_k w[k, c] grad[c, u - k, s], 0 <= u-k < T */
static __global__ void ssm_conv_back_sx_kernel(struct cu_t g, struct cu_t sx, struct cu_t w,
                                               float *dsx)
{
    cu_pdl_enter();
    const int64_t n_l = sx.ne[0], n_c = sx.ne[1], n = cu_nelements(sx), d_conv = w.ne[0];
    const int64_t n_t = n_l - d_conv + 1;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        const int64_t u = f % n_l, c = (f / n_l) % n_c, s = f / (n_l * n_c);
        const int64_t k_lo = u - (n_t - 1) > 0 ? u - (n_t - 1) : 0;
        const int64_t k_hi = u < d_conv - 1 ? u : d_conv - 1;
        float acc = 0.0f;
        for (int64_t k = k_lo; k <= k_hi; k++)
            acc = __fadd_rn(acc, __fmul_rn(cu_get(w, k, c, 0, 0), cu_getf(g, c, u - k, s, 0)));
        dsx[f] = acc;
    }
}

/* d w [d_conv, C] contiguous: d w[k, c] = sum_s (sum_t grad[c, t, s] sx[t + k, c, s]) */
static __global__ void ssm_conv_back_w_kernel(struct cu_t g, struct cu_t sx, struct cu_t w,
                                              float *dw)
{
    cu_pdl_enter();
    const int64_t d_conv = w.ne[0], n_c = sx.ne[1], n = d_conv * n_c;
    const int64_t n_t = sx.ne[0] - d_conv + 1;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        const int64_t k = f % d_conv, c = f / d_conv;
        float total = 0.0f;
        for (int64_t s = 0; s < sx.ne[2]; s++) {
            float acc = 0.0f;
            for (int64_t t = 0; t < n_t; t++)
                acc = __fadd_rn(acc, __fmul_rn(cu_getf(g, c, t, s, 0), cu_getf(sx, t + k, c, s, 0)));
            total = __fadd_rn(total, acc);
        }
        dw[f] = total;
    }
}

/* The backward for d_conv <= SSM_BACK_MAX_K: a thread takes one (channel, sequence) and
 * walks its time steps once, keeping the last d_conv gradients in registers. At step u it
 * writes d sx[u] = sum_k w[k] g[u - k] and adds sx[u] g[u - k] into its d w[k] partial
 * (term t = u - k of sum_t g[t] sx[t + k]); terms out of range are zeros, which leave the
 * CPU's sums bit for bit. Lanes take neighbouring channels and walk in tiles of 32 steps
 * (below), so every global read and write of a warp covers 32 neighbouring floats: reading
 * sx and writing d sx a row apart between lanes took 1.22 ms a node at 16 x 512 tokens of
 * Qwen3.5-0.8B's 6144 channels. Partials [n_seqs][d_conv][channels] are summed over the sequences in order by
 * ssm_conv_back_w_sum_kernel. The one-thread-an-element kernels above serve larger d_conv:
 * their d w thread walked every (sequence, time) of a channel alone, 2 ms a node at 16 x
 * 512 tokens of Qwen3.5-0.8B's 6144 channels. */
#define SSM_WALK_WARPS 2
static __global__ void ssm_conv_back_walk_kernel(struct cu_t g, struct cu_t sx, struct cu_t w,
                                                 float *dsx, float *part)
{
    cu_pdl_enter();
    /* a warp's tiles of 32 steps by its 32 channels: sx and d sx (time innermost) pass
     * through shared memory so that a warp reads and writes 32 neighbouring steps of a
     * channel row at once, g (channels innermost) is read a tile ahead of its use; the
     * arithmetic is the plain walk's, step by step */
    __shared__ float xs[SSM_WALK_WARPS][SSM_TILE][SSM_TILE + 1]; /* [step][channel] */
    __shared__ float gs[SSM_WALK_WARPS][SSM_TILE][SSM_TILE + 1];
    __shared__ float ys[SSM_WALK_WARPS][SSM_TILE][SSM_TILE + 1];
    const int64_t n_l = sx.ne[0], n_c = sx.ne[1], d_conv = w.ne[0];
    const int64_t n_t = n_l - d_conv + 1;
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int64_t c_base = ((int64_t)blockIdx.x * SSM_WALK_WARPS + wp) * SSM_TILE,
                  s = blockIdx.y, c = c_base + lane;
    float(*X)[SSM_TILE + 1] = xs[wp], (*G)[SSM_TILE + 1] = gs[wp], (*Y)[SSM_TILE + 1] = ys[wp];
    float wk[SSM_BACK_MAX_K], gw[SSM_BACK_MAX_K], acc[SSM_BACK_MAX_K];
#pragma unroll
    for (int k = 0; k < SSM_BACK_MAX_K; k++) {
        wk[k] = k < d_conv && c < n_c ? cu_get(w, k, c, 0, 0) : 0.0f;
        gw[k] = acc[k] = 0.0f;
    }
    for (int64_t u0 = 0; u0 < n_l; u0 += SSM_TILE) {
        for (int r = 0; r < SSM_TILE; r++) {
            const int64_t cr = c_base + r, t = u0 + lane;
            X[lane][r] = cr < n_c && t < n_l ? cu_getf(sx, t, cr, s, 0) : 0.0f;
            const int64_t ug = u0 + r;
            G[r][lane] = c < n_c && ug < n_t ? cu_getf(g, c, ug, s, 0) : 0.0f;
        }
        __syncwarp();
        const int steps = n_l - u0 < SSM_TILE ? (int)(n_l - u0) : SSM_TILE;
        for (int j = 0; j < steps; j++) {
#pragma unroll
            for (int k = SSM_BACK_MAX_K - 1; k > 0; k--)
                gw[k] = gw[k - 1];
            gw[0] = G[j][lane];
            const float x = X[j][lane];
            float y = 0.0f;
#pragma unroll
            for (int k = 0; k < SSM_BACK_MAX_K; k++)
                if (k < d_conv) {
                    y = __fadd_rn(y, __fmul_rn(wk[k], gw[k]));
                    acc[k] = __fadd_rn(acc[k], __fmul_rn(gw[k], x));
                }
            Y[j][lane] = y;
        }
        __syncwarp();
        for (int r = 0; r < SSM_TILE; r++) {
            const int64_t cr = c_base + r, t = u0 + lane;
            if (cr < n_c && t < n_l)
                dsx[(s * n_c + cr) * n_l + t] = Y[lane][r];
        }
        __syncwarp();
    }
    if (c < n_c) {
#pragma unroll
        for (int k = 0; k < SSM_BACK_MAX_K; k++)
            if (k < d_conv)
                part[(s * d_conv + k) * n_c + c] = acc[k];
    }
}

/* d w[k, c] = the partials of (k, c) summed over the sequences, in order */
static __global__ void ssm_conv_back_w_sum_kernel(const float *part, float *dw, int64_t d_conv,
                                                  int64_t n_c, int64_t n_s)
{
    cu_pdl_enter();
    for (int64_t f = cu_thread_index(); f < d_conv * n_c; f += cu_thread_count()) {
        const int64_t k = f % d_conv, c = f / d_conv;
        float total = 0.0f;
        for (int64_t s = 0; s < n_s; s++)
            total = __fadd_rn(total, part[(s * d_conv + k) * n_c + c]);
        dw[f] = total;
    }
}

/* The backward's walk (short kernels, some sequences) takes d w's partials: a float per
 * (sequence, tap, channel); otherwise nothing */
static bool back_walks(const struct lt_tensor *node)
{
    const struct lt_tensor *sx = node->src[1], *w = node->src[2];
    return node->op == LT_OP_SSM_CONV_BACK && w->ne[0] <= SSM_BACK_MAX_K && lt_nelements(sx) > 0 &&
           sx->ne[2] <= 65535;
}

static size_t walk_part_bytes(const struct lt_tensor *node)
{
    const struct lt_tensor *sx = node->src[1], *w = node->src[2];
    return sizeof(float) * (size_t)(sx->ne[2] * w->ne[0] * sx->ne[1]);
}

static void ssm_conv_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    if (back_walks(node))
        need[CU_SCRATCH_WORK] = walk_part_bytes(node);
}

static lt_status ssm_conv_back_walk(struct cu_ctx *c, struct lt_tensor *node)
{
    const struct lt_tensor *g = node->src[0], *sx = node->src[1], *w = node->src[2];
    const int64_t n_c = sx->ne[1], n_s = sx->ne[2], d_conv = w->ne[0];
    float *dsx = (float *)node->data;
    void *part;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK, walk_part_bytes(node), &part);
    if (st != LT_OK)
        return st;
    const dim3 grid((unsigned)((n_c + SSM_WALK_WARPS * SSM_TILE - 1) / (SSM_WALK_WARPS * SSM_TILE)),
                    (unsigned)n_s);
    cu_launch_pdl(c, ssm_conv_back_walk_kernel, grid, SSM_WALK_WARPS * 32, 0, cu_view(g),
                  cu_view(sx), cu_view(w), dsx, (float *)part);
    st = cu_launched("ssm_conv_back_walk");
    if (st != LT_OK)
        return st;
    cu_launch_pdl(c, ssm_conv_back_w_sum_kernel, cu_blocks(d_conv * n_c, 256), 256, 0,
                  (const float *)part, dsx + lt_nelements(sx), d_conv, n_c, n_s);
    return cu_launched("ssm_conv_back_w_sum");
}

lt_status cu_ssm_conv_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_ssm_conv_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    if (node->op == LT_OP_SSM_CONV) {
        const struct lt_tensor *sx = node->src[0], *w = node->src[1];
        const int64_t n = lt_nelements(node);
        if (n == 0)
            return LT_OK;
        const int64_t n_t = sx->ne[0] - w->ne[0] + 1;
        if (w->ne[0] <= SSM_BACK_MAX_K && sx->ne[2] <= 65535 &&
            (n_t + SSM_TILE - 1) / SSM_TILE <= 65535) {
            const dim3 grid((unsigned)((sx->ne[1] + SSM_TILE - 1) / SSM_TILE),
                            (unsigned)((n_t + SSM_TILE - 1) / SSM_TILE), (unsigned)sx->ne[2]);
            cu_launch_pdl(c, ssm_conv_tile_kernel, grid, dim3(SSM_TILE, 8), 0, cu_view(sx),
                          cu_view(w), (float *)node->data, n_t);
            return cu_launched("ssm_conv_tile");
        }
        cu_launch_pdl(c, ssm_conv_kernel, cu_blocks(n, 256), 256, 0, cu_view(sx), cu_view(w),
                      (float *)node->data, n_t);
        return cu_launched("ssm_conv");
    }
    const struct lt_tensor *g = node->src[0], *sx = node->src[1], *w = node->src[2];
    const int64_t nsx = lt_nelements(sx), nw = lt_nelements(w);
    if (back_walks(node))
        return ssm_conv_back_walk(c, node);
    float *dsx = (float *)node->data;
    if (nsx > 0) {
        cu_launch_pdl(c, ssm_conv_back_sx_kernel, cu_blocks(nsx, 256), 256, 0, cu_view(g),
                      cu_view(sx), cu_view(w), dsx);
        lt_status st = cu_launched("ssm_conv_back_sx");
        if (st != LT_OK)
            return st;
    }
    if (nw == 0)
        return LT_OK;
    cu_launch_pdl(c, ssm_conv_back_w_kernel, cu_blocks(nw, 128), 128, 0, cu_view(g), cu_view(sx),
                  cu_view(w), dsx + nsx);
    return cu_launched("ssm_conv_back_w");
}

const struct cu_family cu_family_ssm_conv = {
    "ssm_conv",          ssm_conv_ops,    CU_COUNT(ssm_conv_ops), cu_ssm_conv_supported,
    cu_ssm_conv_compute, ssm_conv_scratch};
