/* linear_ce.cu: LINEAR_CE (the LM head and the mean cross-entropy in one) and
 * LINEAR_CE_BACK on the device; see src/ops/linear_ce.c for the maths and the masking.
 *
 * The tokens go a chunk at a time: cuBLAS makes the chunk's logits z = w^T h [V, nc] in
 * scratch (F32 out, F32 accumulation; a BF16 or F16 head multiplies the chunk's hidden
 * states rounded to its type, as mul_mat's BF16 products do), a block a token takes the
 * logsumexp of its column (max and exponentials in float, their sum in double:
 * CROSS_ENTROPY's exponentials in double cost more than the products here). The forward
 * keeps one double a token and a last kernel averages them. The logsumexp reads a column
 * once (a running max and rescaled sum a thread). The backward turns the chunk's logits into
 * d z in place (or, for a typed head, into the head's type only), then the products of the
 * parts asked for (op_params[1]): dh (the tokens' columns of dh [D, N]) = w d z, and
 * dw [D, V] += h d z^T. With the loss part (the loss autodiff seeds, folded into its
 * backward) the same kernel keeps each token's loss from the logits and log-sum-exp it has
 * anyway, and the forward's mean kernel averages them: the forward's logits product is not
 * run again. So the [V, N] logits never exist: a chunk holds at most LCE_CHUNK_FLOATS floats
 * of them (~1,080 tokens of a 248,320-token vocabulary).
 *
 * A typed head's backward takes the products over a group of LCE_GROUP_CHUNKS chunks of
 * half that size: the group's d z in the head's type (twice a chunk's), the same scratch in
 * all. Each group's dw product reads and writes all of dw (1 GB at Qwen3.5's head), and at
 * ~540 tokens that traffic, not the product, set its time (H100, 16 x 512 tokens: ~0.8 ms a
 * chunk against ~0.46 ms of arithmetic): groups of ~2,160 tokens make four passes over dw a
 * 16 x 512 step where ~1,080-token chunks made eight. Without dw (a LoRA job's frozen head)
 * the group serves dh's product alone. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"
#include "lathe/ops.h"

static const enum lt_op linear_ce_ops[] = {LT_OP_LINEAR_CE, LT_OP_LINEAR_CE_BACK};

#define LCE_CHUNK_FLOATS ((int64_t)1 << 28) /* 1 GiB of F32 logits a chunk */
#define LCE_GROUP_CHUNKS 4 /* a typed head's backward: logits chunks a group (lce_group) */
#define LCE_THREADS 512 /* a block a token's column (the loss and d z kernels) */

bool cu_linear_ce_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const bool back = node->op == LT_OP_LINEAR_CE_BACK;
    if (node->op != LT_OP_LINEAR_CE && !back) {
        snprintf(reason, reason_size, "%s is not the fused head and loss", lt_op_name(node->op));
        return false;
    }
    const int s0 = back ? 1 : 0;
    if (!cu_check_source(node, s0, CU_TYPES_FLOAT, reason, reason_size) ||
        !cu_check_source(node, s0 + 1, CU_TYPES_F32, reason, reason_size) ||
        !cu_check_source(node, s0 + 2, CU_TYPES_I32, reason, reason_size) ||
        (back && !cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size)) ||
        !cu_check_result_f32(node, reason, reason_size))
        return false;
    const struct lt_tensor *w = node->src[s0], *h = node->src[s0 + 1], *labels = node->src[s0 + 2];
    for (int i = s0; i < s0 + 3; i++)
        if (!lt_is_contiguous(node->src[i])) {
            snprintf(reason, reason_size, "source %d is not contiguous (cuBLAS reads it whole)", i);
            return false;
        }
    const int64_t D = w->ne[0], V = w->ne[1], N = h->ne[1];
    if (w->ne[2] != 1 || w->ne[3] != 1 || h->ne[0] != D || h->ne[2] != 1 || h->ne[3] != 1 ||
        lt_nelements(labels) != N || (!back && lt_nelements(node) != 1)) {
        snprintf(reason, reason_size, "the sources' and result's shapes do not fit");
        return false;
    }
    if (back && !lt_linear_cross_entropy_back_fits(node)) {
        snprintf(reason, reason_size,
                 "its parts (op_params[1] %#x) and the result's %lld elements do not fit the "
                 "sources",
                 (unsigned)lt_get_param_i32(node, 1), (long long)lt_nelements(node));
        return false;
    }
    if (D > 0x7fffffff || V > 0x7fffffff || N > 0x7fffffff) {
        snprintf(reason, reason_size, "a dimension is past cuBLAS's int");
        return false;
    }
    return true;
}

static cudaDataType_t blas_type(enum lt_type t)
{
    return t == LT_TYPE_F16 ? CUDA_R_16F : t == LT_TYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* A thread's running max m and sum of e^(z - m) over its elements, taken a group at a time
 * (8 elements, or 1 at a ragged tail): the group's max raises m (the sum rescaled: rarely,
 * after the first few groups), the group's exponentials are summed in float (8 terms of at
 * most 1 each) and that into the double sum. -inf elements add nothing; a NaN makes the
 * sum NaN, as its term would. */
struct lse_acc {
    float m = -INFINITY;
    double sum = 0.0;
    bool nan = false;
    template <int K> __device__ __forceinline__ void add(const float (&x)[K])
    {
        float gm = -INFINITY;
#pragma unroll
        for (int i = 0; i < K; i++) {
            nan |= x[i] != x[i];
            gm = fmaxf(gm, x[i]);
        }
        if (gm == -INFINITY) /* all -inf (or NaN, flagged) */
            return;
        if (gm > m) {
            sum = m == -INFINITY ? 0.0 : sum * (double)expf(m - gm);
            m = gm;
        }
        float g = 0.0f;
#pragma unroll
        for (int i = 0; i < K; i++)
            g += expf(x[i] - m); /* -inf: 0; NaN: flagged */
        sum += (double)g;
    }
};

/* max and log(sum(exp(z - max))) of column z [V], for every thread of the block, in one
 * pass over z (running max and rescaled sum a thread), then the block takes the largest m
 * and adds the threads' sums scaled to it. A column of V % 4 == 0 floats (16-byte aligned:
 * chunks are whole columns from a cudaMalloc'd base) goes two float4 loads at a time, so a
 * thread has 32 bytes in flight: one float at a time left the 540 blocks of a chunk (a
 * block a token: few threads for the device) with little in flight to wait on. Two
 * passes (the max, then the sum) would read the 1 MB column of a 248,320-token vocabulary
 * twice, for every token of a training step. */
static __device__ void column_lse(const float *z, int64_t V, float *fs, double *ds, double *mx_out,
                                  double *lse_out)
{
    lse_acc acc;
    int64_t v = threadIdx.x;
    if ((V & 3) == 0) {
        const float4 *z4 = (const float4 *)z;
        const int64_t V4 = V >> 2, step = blockDim.x;
        for (; v + step < V4; v += 2 * step) {
            const float4 p = z4[v], q = z4[v + step];
            const float x[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
            acc.add(x);
        }
        for (; v < V4; v += step) {
            const float4 p = z4[v];
            const float x[4] = {p.x, p.y, p.z, p.w};
            acc.add(x);
        }
    } else {
        for (; v < V; v += blockDim.x) {
            const float x[1] = {z[v]};
            acc.add(x);
        }
    }
    const float mx = cu_block_max(acc.m, fs);
    double mine = acc.m == -INFINITY ? 0.0 : acc.sum * (double)expf(acc.m - mx);
    if (acc.nan)
        mine = __longlong_as_double(0x7ff8000000000000ll);
    *lse_out = log(cu_block_sum(mine, ds));
    *mx_out = mx;
}

/* tok[n0 + j] = the loss of token n0 + j (0 masked, NaN for a label >= V) */
static __global__ void lce_rows_kernel(const float *z, int64_t V, int64_t nc, const int32_t *labels,
                                       int64_t n0, double *tok)
{
    __shared__ float fs[32];
    __shared__ double ds[32];
    for (int64_t j = blockIdx.x; j < nc; j += gridDim.x) {
        const int32_t label = labels[n0 + j];
        if (label < 0 || label >= V) {
            if (threadIdx.x == 0)
                tok[n0 + j] = label < 0 ? 0.0 : __longlong_as_double(0x7ff8000000000000ll);
            continue;
        }
        double mx, lse;
        column_lse(z + j * V, V, fs, ds, &mx, &lse);
        if (threadIdx.x == 0)
            tok[n0 + j] = mx + lse - (double)z[j * V + label];
    }
}

static __global__ void lce_mean_kernel(const double *tok, const int32_t *labels, int64_t N,
                                       float *out)
{
    cu_pdl_enter();
    __shared__ double shared[32];
    double total = 0.0, valid = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        if (labels[n] < 0)
            continue;
        total += tok[n];
        valid += 1.0;
    }
    total = cu_block_sum(total, shared);
    valid = cu_block_sum(valid, shared);
    if (threadIdx.x == 0)
        *out = valid > 0.0 ? (float)(total / valid) : 0.0f;
}

/* *coef = grad_loss / n_valid (0 when no label is unmasked) */
static __global__ void lce_coef_kernel(const float *grad_loss, const int32_t *labels, int64_t N,
                                       double *coef)
{
    cu_pdl_enter();
    __shared__ double shared[32];
    double valid = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x)
        valid += labels[n] >= 0 ? 1.0 : 0.0;
    valid = cu_block_sum(valid, shared);
    if (threadIdx.x == 0)
        *coef = valid > 0.0 ? (double)*grad_loss / valid : 0.0;
}

/* z (the chunk's logits) into d z: in place, or only into zt of type t when zt is given
 * (the products read that copy, so the F32 one would be written for nothing). With tok, each
 * token's loss too, as lce_rows_kernel takes it from the same column. */
static __global__ void lce_grad_kernel(float *z, int64_t V, int64_t nc, const int32_t *labels,
                                       int64_t n0, const double *coef_p, double *tok, char *zt,
                                       int t, int es)
{
    __shared__ float fs[32];
    __shared__ double ds[32];
    const double coef = *coef_p;
    for (int64_t j = blockIdx.x; j < nc; j += gridDim.x) {
        float *zc = z + j * V;
        const int32_t label = labels[n0 + j];
        const bool masked = label < 0 || label >= V;
        double mx = 0.0, lse = 0.0;
        /* the label's logit, read before column_lse's barriers: after them the block writes
         * d z over the column */
        const float zl = tok && !masked && threadIdx.x == 0 ? zc[label] : 0.0f;
        if (!masked)
            column_lse(zc, V, fs, ds, &mx, &lse);
        if (tok && threadIdx.x == 0)
            tok[n0 + j] = label < 0    ? 0.0
                          : label >= V ? __longlong_as_double(0x7ff8000000000000ll)
                                       : mx + lse - (double)zl;
        const float shift = (float)(mx + lse);
        /* d z of logit x at vocabulary index v */
        auto dz = [&](float x, int64_t v) {
            if (masked)
                return 0.0f;
            const double p = coef * (double)expf(x - shift);
            return (float)(v == label ? p - coef : p); /* p - 1 in double */
        };
        if ((V & 3) == 0) { /* a float4 a thread at a time, as column_lse reads */
            float4 *z4 = (float4 *)zc;
            for (int64_t v4 = threadIdx.x; v4 < (V >> 2); v4 += blockDim.x) {
                const float4 x = z4[v4];
                const int64_t v = v4 * 4;
                const float d0 = dz(x.x, v), d1 = dz(x.y, v + 1), d2 = dz(x.z, v + 2),
                            d3 = dz(x.w, v + 3);
                if (zt) /* the products read the typed copy only */
                    cu_store4(zt, t, (size_t)((j * V + v) / 4), make_float4(d0, d1, d2, d3));
                else
                    z4[v4] = make_float4(d0, d1, d2, d3);
            }
            continue;
        }
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
            const float d = dz(zc[v], v);
            if (zt) /* the products read the typed copy only */
                cu_store(zt + (j * V + v) * es, t, d);
            else
                zc[v] = d;
        }
    }
}

static lt_status gemm(struct cu_ctx *c, cublasOperation_t oa, cublasOperation_t ob, int64_t m,
                      int64_t n, int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb,
                      cudaDataType_t t, float beta, float *out, int64_t ldc, const char *what)
{
    const float alpha = 1.0f;
    return cu_check_blas(cublasGemmEx(c->blas, oa, ob, (int)m, (int)n, (int)k, &alpha, a, t,
                                      (int)lda, b, t, (int)ldb, &beta, out, CUDA_R_32F, (int)ldc,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         what);
}

/* The tokens go in groups of ng, each group in logits chunks of nc (a typed head's backward:
 * LCE_GROUP_CHUNKS chunks a group; otherwise one, ng = nc). The scratch: a chunk's logits
 * [V, nc] F32, then (typed head) d z [V, ng] and h [D, ng] in the head's type (WORK);
 * doubles (REDUCE): forward, each token's loss; backward, the coefficient, then each token's
 * loss when the loss is a part */
struct lce_sizes {
    int64_t nc, ng;
    size_t zf, zt_bytes, ht_bytes, work, reduce;
};

static struct lce_sizes lce_sizes_of(const struct lt_tensor *node)
{
    const bool back = node->op == LT_OP_LINEAR_CE_BACK;
    const int s0 = back ? 1 : 0;
    const struct lt_tensor *w = node->src[s0], *h = node->src[s0 + 1];
    const int64_t D = w->ne[0], V = w->ne[1], N = h->ne[1];
    const bool typed = w->type != LT_TYPE_F32, grouped = typed && back;
    const int es = typed ? 2 : 4;
    struct lce_sizes z;
    /* grouped: half a chunk's F32 logits and twice its typed d z, the same bytes in all */
    z.nc = V > 0 ? LCE_CHUNK_FLOATS / V / (grouped ? 2 : 1) : N;
    const int64_t cap = lt_get_param_i32(node, 0); /* a test's smaller chunk, or 0 */
    z.nc = cap > 0 && cap < z.nc ? cap : z.nc;
    z.nc = z.nc < 1 ? 1 : z.nc > N ? N : z.nc;
    z.ng = grouped ? z.nc * LCE_GROUP_CHUNKS : z.nc;
    z.ng = z.ng > N ? (N > 0 ? N : 1) : z.ng;
    z.zf = (size_t)(V * z.nc);
    z.zt_bytes = grouped ? (size_t)(V * z.ng) * es : 0; /* the forward has no d z */
    z.ht_bytes = typed ? (size_t)(D * z.ng) * es : 0;
    z.work = z.zf * 4 + z.zt_bytes + z.ht_bytes;
    z.reduce = sizeof(double) * (size_t)(N + 1);
    return z;
}

static void linear_ce_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    const struct lce_sizes z = lce_sizes_of(node);
    need[CU_SCRATCH_WORK] = z.work;
    need[CU_SCRATCH_REDUCE] = z.reduce;
}

/* One node's run: its sources, its scratch and where its parts go */
struct lce_run {
    struct cu_ctx *c;
    const struct lt_tensor *w, *h;
    const int32_t *labels;
    int64_t D, V, N;
    bool back, typed;
    cudaDataType_t bt;
    float *z;       /* the chunk's logits, then (F32 head) its d z */
    char *zt, *ht;  /* typed head: the chunk's d z and h in its type; else NULL */
    double *coef;   /* backward: grad_loss / n_valid */
    double *tok;    /* each token's loss (forward; backward with the loss part); else NULL */
    float *dh, *dw; /* backward: the gradients asked for; else NULL */
    float *loss;    /* forward, or backward with the loss part: the mean loss; else NULL */
};

/* Tokens n0 .. n0 + m of the group that starts at g0 (whose h a typed head has in ht):
 * their logits, then forward each one's loss, backward d z (and each one's loss with the
 * loss part) */
/* token n's hidden state as the products read it: the group's copy in the head's type (the
 * group starts at g0), or h itself for an F32 head */
static const void *lce_h(const struct lce_run *r, int64_t g0, int64_t n)
{
    return r->typed ? (const void *)(r->ht + (n - g0) * r->D * 2)
                    : (const void *)((const float *)r->h->data + n * r->D);
}

static lt_status lce_chunk(const struct lce_run *r, int64_t g0, int64_t n0, int64_t m)
{
    const int64_t D = r->D, V = r->V;
    const void *hb = lce_h(r, g0, n0);
    lt_status st = gemm(r->c, CUBLAS_OP_T, CUBLAS_OP_N, V, m, D, r->w->data, D, hb, D, r->bt, 0.0f,
                        r->z, V, "cublasGemmEx (linear_ce logits)");
    if (st != LT_OK)
        return st;
    const unsigned grid = (unsigned)(m < 65535 ? m : 65535);
    cudaStream_t stream = r->c->stream;
    if (!r->back) {
        lce_rows_kernel<<<grid, LCE_THREADS, 0, stream>>>(r->z, V, m, r->labels, n0, r->tok);
        return cu_launched("linear_ce_rows");
    }
    char *zt = r->typed ? r->zt + (n0 - g0) * V * 2 : NULL;
    lce_grad_kernel<<<grid, LCE_THREADS, 0, stream>>>(r->z, V, m, r->labels, n0, r->coef, r->tok,
                                                      zt, (int)r->w->type, r->typed ? 2 : 4);
    return cu_launched("linear_ce_grad");
}

/* Tokens g0 .. g0 + mg, a chunk of nc at a time (lce_chunk), then the backward's products of
 * the gradients asked for over the whole group: dh (its columns of dh [D, N]) = w d z, and
 * dw [D, V] += h_group d z^T (the first group writes, the others add). A group of several
 * chunks (a typed head's backward) reads and writes dw once for all of them: each pass
 * over dw (1 GB F32 at Qwen3.5's head) took longer than a chunk's product. */
static lt_status lce_group(const struct lce_run *r, int64_t g0, int64_t mg, int64_t nc)
{
    const int64_t D = r->D, V = r->V;
    lt_status st = LT_OK;
    if (r->typed)
        st = cu_convert_f32_flat(r->c, (const float *)r->h->data + g0 * D, r->ht, D * mg,
                                 (int)r->w->type, "linear_ce_convert");
    for (int64_t n0 = g0; n0 < g0 + mg && st == LT_OK; n0 += nc)
        st = lce_chunk(r, g0, n0, g0 + mg - n0 < nc ? g0 + mg - n0 : nc);
    if (st != LT_OK || !r->back)
        return st;
    const void *dz = r->typed ? (const void *)r->zt : (const void *)r->z, *hb = lce_h(r, g0, g0);
    if (r->dh)
        st = gemm(r->c, CUBLAS_OP_N, CUBLAS_OP_N, D, mg, V, r->w->data, D, dz, V, r->bt, 0.0f,
                  r->dh + g0 * D, D, "cublasGemmEx (linear_ce dh)");
    if (st == LT_OK && r->dw) /* the first group writes dw, the others add */
        st = gemm(r->c, CUBLAS_OP_N, CUBLAS_OP_T, D, V, mg, hb, D, dz, V, r->bt, g0 ? 1.0f : 0.0f,
                  r->dw, D, "cublasGemmEx (linear_ce dw)");
    return st;
}

/* part p of the backward's result, NULL when not asked for */
static float *lce_part(struct lt_tensor *node, enum lt_linear_ce_part p)
{
    const int64_t at = lt_linear_cross_entropy_part_at(node, p);
    return at < 0 ? NULL : (float *)node->data + at;
}

lt_status cu_linear_ce_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_linear_ce_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const bool back = node->op == LT_OP_LINEAR_CE_BACK;
    const int s0 = back ? 1 : 0;
    struct lce_run r = {c, node->src[s0], node->src[s0 + 1],
                        (const int32_t *)node->src[s0 + 2]->data};
    r.D = r.w->ne[0], r.V = r.w->ne[1], r.N = r.h->ne[1];
    r.back = back;
    r.typed = r.w->type != LT_TYPE_F32;
    r.bt = blas_type(r.w->type);
    const struct lce_sizes zs = lce_sizes_of(node);
    void *work, *red;
    lt_status st = cu_scratch(c, CU_SCRATCH_WORK, zs.work, &work);
    if (st == LT_OK)
        st = cu_scratch(c, CU_SCRATCH_REDUCE, zs.reduce, &red);
    if (st != LT_OK)
        return st;
    r.z = (float *)work;
    r.zt = zs.zt_bytes ? (char *)(r.z + zs.zf) : NULL;
    r.ht = r.typed ? (char *)(r.z + zs.zf) + zs.zt_bytes : NULL;
    if (back) { /* REDUCE: the coefficient, then the tokens' losses */
        r.coef = (double *)red;
        r.dh = lce_part(node, LT_LINEAR_CE_DH);
        r.dw = lce_part(node, LT_LINEAR_CE_DW);
        r.loss = lce_part(node, LT_LINEAR_CE_LOSS);
        r.tok = r.loss ? r.coef + 1 : NULL;
    } else {
        r.tok = (double *)red;
        r.loss = (float *)node->data;
    }
    if (back && r.N > 0) {
        cu_launch_pdl(c, lce_coef_kernel, 1, 256, 0, (const float *)node->src[0]->data, r.labels,
                      r.N, r.coef);
        if ((st = cu_launched("linear_ce_coef")) != LT_OK)
            return st;
    }
    for (int64_t g0 = 0; g0 < r.N && r.V > 0 && st == LT_OK; g0 += zs.ng)
        st = lce_group(&r, g0, r.N - g0 < zs.ng ? r.N - g0 : zs.ng, zs.nc);
    if (st == LT_OK && back && (r.N == 0 || r.V == 0)) { /* nothing to add: zero gradients */
        const int64_t n_grads = lt_nelements(node) - (r.loss ? 1 : 0); /* they come first */
        st = cu_check(cudaMemsetAsync(node->data, 0, sizeof(float) * (size_t)n_grads, c->stream),
                      "zeroing linear_ce_back");
    }
    if (st != LT_OK || !r.loss)
        return st;
    cu_launch_pdl(c, lce_mean_kernel, 1, 256, 0, r.tok, r.labels, r.N, r.loss);
    return cu_launched("linear_ce_mean");
}

const struct cu_family cu_family_linear_ce = {
    "linear_ce",          linear_ce_ops,    CU_COUNT(linear_ce_ops), cu_linear_ce_supported,
    cu_linear_ce_compute, linear_ce_scratch};
