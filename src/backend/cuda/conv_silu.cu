/* conv_silu.cu: CONV_SILU and CONV_SILU_BACK on the device (see src/ops/conv_silu.c).
 *
 * x [C, T, S] F32 with unit-strided channels (cs_rows_ok: the forward's x may have any row
 * strides of whole floats, a slice of a fused projection as it lies; the backward's x and
 * gradient are contiguous), w [K, C] F32, F16 or BF16 with K <=
 * CS_MAX_K taps. A thread takes one channel of one sequence over CS_STEPS time steps and
 * walks them once, keeping the last K inputs (and, backward, the last K gradients g') in
 * registers; the lanes of a warp take neighbouring channels, so every read and write of a
 * warp covers 32 neighbouring floats of one time step. Each sum is the CPU's, in its
 * order, each product and sum rounded on its own (silu's exponential is the device's).
 *
 *   forward   y[c, t] = silu(p_t), p_t = sum_k w[k] x[t + k - (K - 1)]
 *   backward  g'_t = g_t s (1 + p_t (1 - s)), s = sigmoid(p_t) (p_t recomputed);
 *             d x[u] = sum_k w[k] g'[u + K - 1 - k] (terms past T are zero);
 *             d w[k] partials, a float a (sequence, step block, tap, channel) in scratch,
 *             then summed over the sequences and step blocks in order by a second kernel.
 *             d x is stored F32, or BF16 for a BF16 result (lt_conv_silu_back_as: each sum
 *             rounded once to nearest even, as the CPU rounds it), d w F32 either way.
 * Packed examples (an optional I32 source of each step's position within its example): a tap
 * that would reach back past the example's first step is skipped, as the CPU skips it
 * (conv_rows.h), in the forward's sum, d x's and d w's. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"
#include "lathe/ops.h"

static const enum lt_op conv_silu_ops[] = {LT_OP_CONV_SILU, LT_OP_CONV_SILU_BACK};

#define CS_MAX_K 8  /* taps a thread keeps in registers (Qwen3.5: 4) */
#define CS_STEPS 32 /* time steps a thread walks */
#define CS_THREADS 256

/* x's rows (one time step's channels) unit-strided, at strides of whole elements */
static bool cs_rows_ok(const struct lt_tensor *x)
{
    const size_t es = x->type == LT_TYPE_F32 ? sizeof(float) : 2;
    return x->nb[0] == es && x->nb[1] % es == 0 && x->nb[2] % es == 0 && x->view_offs % es == 0;
}

/* x: F32, or BF16 (a training step's q, k and v products store BF16) */
#define CS_X_TYPES (CU_TYPES_F32 | CU_TYPE_BIT(LT_TYPE_BF16))

/* element i of x as a float */
static __device__ __forceinline__ float cs_x(const float *x, size_t i)
{
    return x[i];
}
static __device__ __forceinline__ float cs_x(const __nv_bfloat16 *x, size_t i)
{
    return __bfloat162float(x[i]);
}

bool cu_conv_silu_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const bool back = node->op == LT_OP_CONV_SILU_BACK;
    if (node->op != LT_OP_CONV_SILU && !back) {
        snprintf(reason, reason_size, "%s is not the conv and silu", lt_op_name(node->op));
        return false;
    }
    const int ix = back ? 1 : 0;
    if ((back && !cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size)) ||
        !cu_check_source(node, ix, CS_X_TYPES, reason, reason_size) ||
        !cu_check_source(node, ix + 1, CU_TYPES_FLOAT, reason, reason_size))
        return false;
    /* the backward's result may be BF16 (d x rounded, d w F32 after it) */
    const bool half_dx = back && node->type == LT_TYPE_BF16;
    if (!half_dx && !cu_check_result_f32(node, reason, reason_size))
        return false;
    if (half_dx && !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is not contiguous");
        return false;
    }
    const struct lt_tensor *x = node->src[ix], *w = node->src[ix + 1], *pos = node->src[ix + 2];
    if (pos && !cu_check_source(node, ix + 2, CU_TYPES_I32, reason, reason_size))
        return false;
    if (pos && (!lt_is_contiguous(pos) || lt_nelements(pos) != x->ne[1] * x->ne[2])) {
        snprintf(reason, reason_size, "the positions are not contiguous, one a step");
        return false;
    }
    if (back ? !lt_is_contiguous(x) || !lt_is_contiguous(node->src[0]) : !cs_rows_ok(x)) {
        snprintf(reason, reason_size, "%s is not %s (the kernels read channels in rows)",
                 back && lt_is_contiguous(x) ? "the gradient" : "x",
                 back ? "contiguous" : "unit-strided in its channels");
        return false;
    }
    if (x->ne[3] != 1 || w->ne[1] != x->ne[0] || w->ne[2] != 1 || w->ne[3] != 1 || w->ne[0] < 1 ||
        w->ne[0] > CS_MAX_K) {
        snprintf(reason, reason_size, "x and w do not fit, or w has more than %d taps", CS_MAX_K);
        return false;
    }
    const int64_t nx = lt_nelements(x), nw = lt_nelements(w);
    const bool shape_ok =
        back ? lt_same_shape(node->src[0], x) &&
                   lt_nelements(node) ==
                       (node->type == LT_TYPE_F32 ? nx + nw : nx + (nx & 1) + 2 * nw)
             : lt_same_shape(node, x);
    if (!shape_ok) {
        snprintf(reason, reason_size, "the result's shape does not match its sources");
        return false;
    }
    if (x->ne[0] * w->ne[0] > 0x7fffffff || x->ne[1] > 0x7fffffff || x->ne[2] > 65535 ||
        (x->ne[1] + CS_STEPS - 1) / CS_STEPS > 65535) {
        snprintf(reason, reason_size, "too many channels, sequences or time steps for the grid");
        return false;
    }
    return true;
}

/* w[k, c] for the K taps, zeros past K */
template <int K> static __device__ __forceinline__ void load_w(struct cu_t w, int c, float *wk)
{
#pragma unroll
    for (int k = 0; k < K; k++)
        wk[k] = cu_get(w, k, c, 0, 0);
}

/* the sum from tap k0 on (the taps before reach past the example's start) */
template <int K>
static __device__ __forceinline__ float conv_of(const float *wk, const float *xw, int k0)
{
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (k >= k0)
            acc = __fadd_rn(acc, __fmul_rn(wk[k], xw[k]));
    return acc;
}

/* step i's first tap: K - 1 - its position when that is smaller than K - 1, else 0 */
static __device__ __forceinline__ int first_tap(const int32_t *pos, int K, size_t i)
{
    if (!pos)
        return 0;
    const int p = pos[i];
    return p < K - 1 ? K - 1 - p : 0;
}

/* Steps a thread loads before it computes any of them: its loads of x (and g) for a batch
 * are in flight together. One step at a time, a thread had one or two loads in flight, too
 * few for the device's bandwidth (the backward ran at ~1.5 TB/s on an H100, 142 us a node
 * of 2,048 channels by 16 x 512 steps). */
#define CS_BATCH 4

/* x[c, t, s] at x[s ld2 + t ld1 + c] (floats); y contiguous */
template <int K, typename XT>
static __global__ void conv_silu_kernel(const XT *__restrict__ x, struct cu_t w,
                                        const int32_t *__restrict__ pos, float *__restrict__ y,
                                        int C, int T, size_t ld1, size_t ld2)
{
    cu_pdl_enter();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    const int t0 = blockIdx.z * CS_STEPS, t1 = min(t0 + CS_STEPS, T);
    const size_t base = (size_t)blockIdx.y * T * C + c; /* y[c, t, s] = y[base + t C] */
    const size_t xbase = (size_t)blockIdx.y * ld2 + c;
    float wk[K], xw[K];
    load_w<K>(w, c, wk);
#pragma unroll
    for (int k = 0; k + 1 < K; k++) {
        const int t = t0 + k - (K - 1);
        xw[k] = t >= 0 ? cs_x(x, xbase + (size_t)t * ld1) : 0.0f;
    }
    for (int tb = t0; tb < t1; tb += CS_BATCH) {
        float xb[CS_BATCH];
#pragma unroll
        for (int i = 0; i < CS_BATCH; i++)
            xb[i] = tb + i < t1 ? cs_x(x, xbase + (size_t)(tb + i) * ld1) : 0.0f;
#pragma unroll
        for (int i = 0; i < CS_BATCH; i++) {
            const int t = tb + i;
            if (t >= t1)
                break;
            xw[K - 1] = xb[i];
            const float p = conv_of<K>(wk, xw, first_tap(pos, K, (size_t)blockIdx.y * T + t));
            y[base + (size_t)t * C] = p / (1.0f + expf(-p));
#pragma unroll
            for (int k = 0; k + 1 < K; k++)
                xw[k] = xw[k + 1];
        }
    }
}

/* One step t of the backward's walk (conv_silu_back_kernel), given x[t] and g[t] (unread
 * past T): g'_t and its first tap into the window gw, fw; d w's terms while t < u1; d x at
 * u = t - (K - 1) once u >= u0. */
static __device__ __forceinline__ void cs_put(float *dx, size_t i, float v)
{
    dx[i] = v;
}
static __device__ __forceinline__ void cs_put(__nv_bfloat16 *dx, size_t i, float v)
{
    dx[i] = __float2bfloat16_rn(v);
}

template <int K, typename DT>
static __device__ __forceinline__ void
back_step(int t, int T, int u0, int u1, float xt, float gt, const int32_t *pos, size_t row0,
          const float *wk, float *xw, float *gw, int *fw, float *dwk, DT *dx, size_t base, int C)
{
    float gp = 0.0f; /* g' past T: no term */
    int k0 = 0;
    if (t < T) {
        k0 = first_tap(pos, K, row0 + t);
        xw[K - 1] = xt;
        const float p = conv_of<K>(wk, xw, k0);
        const float sg = 1.0f / (1.0f + expf(-p));
        gp = gt * sg * (1.0f + p * (1.0f - sg));
        if (t < u1) {
#pragma unroll
            for (int k = 0; k < K; k++)
                if (k >= k0)
                    dwk[k] = __fadd_rn(dwk[k], __fmul_rn(gp, xw[k]));
        }
#pragma unroll
        for (int k = 0; k + 1 < K; k++)
            xw[k] = xw[k + 1];
    }
#pragma unroll
    for (int k = 0; k + 1 < K; k++) {
        gw[k] = gw[k + 1];
        fw[k] = fw[k + 1];
    }
    gw[K - 1] = gp;
    fw[K - 1] = k0;
    const int u = t - (K - 1);
    if (u >= u0) { /* g'[u + K - 1 - k] = gw[K - 1 - k], its tap k counting from fw */
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++)
            if (k >= fw[K - 1 - k])
                acc = __fadd_rn(acc, __fmul_rn(wk[k], gw[K - 1 - k]));
        cs_put(dx, base + (size_t)u * C, acc);
    }
}

template <int K, typename XT, typename DT>
static __global__ void __launch_bounds__(CS_THREADS, 4)
    conv_silu_back_kernel(const float *__restrict__ g, const XT *__restrict__ x, struct cu_t w,
                          const int32_t *__restrict__ pos, DT *__restrict__ dx,
                          float *__restrict__ part, int C, int T)
{
    cu_pdl_enter();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    const int s = blockIdx.y, j = blockIdx.z, u0 = j * CS_STEPS, u1 = min(u0 + CS_STEPS, T);
    const size_t base = (size_t)s * T * C + c;
    /* gw and fw: g' of the last K outputs and each one's first tap */
    float wk[K], xw[K], gw[K], dwk[K];
    int fw[K];
    load_w<K>(w, c, wk);
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int t = u0 + k - (K - 1);
        xw[k] = k + 1 < K && t >= 0 ? cs_x(x, base + (size_t)t * C) : 0.0f;
        gw[k] = 0.0f;
        fw[k] = 0;
        dwk[k] = 0.0f;
    }
    const int end = u1 + K - 1, last = min(end, T); /* steps walked; those read */
    for (int tb = u0; tb < end; tb += CS_BATCH) {
        float xb[CS_BATCH], gb[CS_BATCH];
#pragma unroll
        for (int i = 0; i < CS_BATCH; i++) {
            const bool in = tb + i < last;
            xb[i] = in ? cs_x(x, base + (size_t)(tb + i) * C) : 0.0f;
            gb[i] = in ? g[base + (size_t)(tb + i) * C] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < CS_BATCH; i++) {
            if (tb + i >= end)
                break;
            back_step<K>(tb + i, T, u0, u1, xb[i], gb[i], pos, (size_t)s * T, wk, xw, gw, fw, dwk,
                         dx, base, C);
        }
    }
    const size_t pb = (((size_t)s * gridDim.z + j) * K) * C + c;
#pragma unroll
    for (int k = 0; k < K; k++)
        part[pb + (size_t)k * C] = dwk[k];
}

/* d w[k, c] (contiguous [K, C]: k innermost) = the partials of (k, c) over sequences and
 * step blocks, summed in CS_DW_SPLIT runs of neighbouring partials, then the runs in order.
 * A block is 32 neighbouring channels of one tap (x) by the runs (y), so a warp's reads of
 * a partial row are 32 neighbouring floats. The first form (a thread a (k, c), k innermost:
 * reads K floats apart, 8,192 threads each walking every partial) took most of
 * CONV_SILU_BACK's 156 us a node at 16 x 512 tokens of 2,048 channels (H100). */
#define CS_DW_SPLIT 8
static __global__ void __launch_bounds__(32 * CS_DW_SPLIT)
    conv_silu_dw_kernel(const float *__restrict__ part, float *__restrict__ dw, int K, int C,
                        int blocks)
{
    cu_pdl_enter();
    __shared__ float runs[CS_DW_SPLIT][32];
    const int c = blockIdx.x * 32 + threadIdx.x, k = blockIdx.y, y = threadIdx.y;
    const int per = (blocks + CS_DW_SPLIT - 1) / CS_DW_SPLIT, b0 = y * per,
              b1 = min(b0 + per, blocks);
    float run = 0.0f;
    if (c < C) {
        const float *p = part + (size_t)k * C + c;
        const size_t stride = (size_t)K * C;
#pragma unroll 4
        for (int b = b0; b < b1; b++)
            run = __fadd_rn(run, p[(size_t)b * stride]);
    }
    runs[y][threadIdx.x] = run;
    __syncthreads();
    if (y != 0 || c >= C)
        return;
    float total = runs[0][threadIdx.x];
#pragma unroll
    for (int i = 1; i < CS_DW_SPLIT; i++)
        total = __fadd_rn(total, runs[i][threadIdx.x]);
    dw[(size_t)c * K + k] = total;
}

/* the backward's partials: a float a (sequence, step block, tap, channel) */
static size_t part_bytes(const struct lt_tensor *node)
{
    const struct lt_tensor *x = node->src[1];
    return sizeof(float) * (size_t)(x->ne[2] * ((x->ne[1] + CS_STEPS - 1) / CS_STEPS) *
                                    node->src[2]->ne[0] * x->ne[0]);
}

static void conv_silu_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    if (node->op == LT_OP_CONV_SILU_BACK && lt_nelements(node->src[1]) > 0)
        need[CU_SCRATCH_WORK] = part_bytes(node);
}

template <int K, typename XT> static lt_status launch(struct cu_ctx *c, struct lt_tensor *node)
{
    const bool back = node->op == LT_OP_CONV_SILU_BACK;
    const struct lt_tensor *x = node->src[back ? 1 : 0], *w = node->src[back ? 2 : 1],
                           *pn = node->src[back ? 3 : 2];
    const int32_t *pos = pn ? (const int32_t *)pn->data : NULL;
    const int C = (int)x->ne[0], T = (int)x->ne[1], S = (int)x->ne[2];
    const int steps = (T + CS_STEPS - 1) / CS_STEPS;
    const dim3 grid((unsigned)((C + CS_THREADS - 1) / CS_THREADS), (unsigned)S, (unsigned)steps);
    if (!back) {
        cu_launch_pdl(c, conv_silu_kernel<K, XT>, grid, CS_THREADS, 0, (const XT *)x->data,
                      cu_view(w), pos, (float *)node->data, C, T, x->nb[1] / sizeof(XT),
                      x->nb[2] / sizeof(XT));
        return cu_launched("conv_silu");
    }
    void *part;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK, part_bytes(node), &part);
    if (st != LT_OK)
        return st;
    const float *g = (const float *)node->src[0]->data;
    if (node->type == LT_TYPE_BF16)
        cu_launch_pdl(c, conv_silu_back_kernel<K, XT, __nv_bfloat16>, grid, CS_THREADS, 0, g,
                      (const XT *)x->data, cu_view(w), pos, (__nv_bfloat16 *)node->data,
                      (float *)part, C, T);
    else
        cu_launch_pdl(c, conv_silu_back_kernel<K, XT, float>, grid, CS_THREADS, 0, g,
                      (const XT *)x->data, cu_view(w), pos, (float *)node->data, (float *)part, C,
                      T);
    if ((st = cu_launched("conv_silu_back")) != LT_OK)
        return st;
    float *dw = (float *)((char *)node->data + lt_conv_silu_back_dw_offset(node));
    cu_launch_pdl(c, conv_silu_dw_kernel, dim3((unsigned)((C + 31) / 32), (unsigned)K),
                  dim3(32, CS_DW_SPLIT), 0, (const float *)part, dw, K, C, S * steps);
    return cu_launched("conv_silu_back_dw");
}

/* launch for K taps (1 .. CS_MAX_K) and x's element type XT */
template <typename XT> static lt_status launch_taps(struct cu_ctx *c, struct lt_tensor *node, int K)
{
    switch (K) {
    case 1: return launch<1, XT>(c, node);
    case 2: return launch<2, XT>(c, node);
    case 3: return launch<3, XT>(c, node);
    case 4: return launch<4, XT>(c, node);
    case 5: return launch<5, XT>(c, node);
    case 6: return launch<6, XT>(c, node);
    case 7: return launch<7, XT>(c, node);
    default: return launch<8, XT>(c, node);
    }
}

lt_status cu_conv_silu_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_conv_silu_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const bool back = node->op == LT_OP_CONV_SILU_BACK;
    const struct lt_tensor *x = node->src[back ? 1 : 0], *w = node->src[back ? 2 : 1];
    if (lt_nelements(x) == 0) /* no time steps or channels: d w is zero */
        return lt_nelements(node) == 0
                   ? LT_OK
                   : cu_check(cudaMemsetAsync(node->data, 0, lt_nbytes(node), c->stream),
                              "zeroing conv_silu_back");
    return x->type == LT_TYPE_BF16 ? launch_taps<__nv_bfloat16>(c, node, (int)w->ne[0])
                                   : launch_taps<float>(c, node, (int)w->ne[0]);
}

const struct cu_family cu_family_conv_silu = {
    "conv_silu",          conv_silu_ops,    CU_COUNT(conv_silu_ops), cu_conv_silu_supported,
    cu_conv_silu_compute, conv_silu_scratch};
