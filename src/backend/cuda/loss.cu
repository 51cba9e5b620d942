/* loss.cu: CROSS_ENTROPY (mean next-token loss) and CROSS_ENTROPY_BACK (dL/dlogits) on the
 * device.
 *
 * logits [V, N] F32 of any strides, labels I32 [N]; a label < 0 is masked (no loss, no
 * gradient), a label >= V makes the loss NaN and gets no gradient, and the mean is over
 * the unmasked rows (0 when there are none), as on the CPU (src/ops/loss.c). A block runs a
 * row: the max in float, the sum of exp(x - max) in double, the row loss in double. The
 * forward keeps one double per row in scratch and a second kernel adds them (in a tree
 * order, not the CPU's left-to-right one); the backward first counts the unmasked rows. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op loss_ops[] = {LT_OP_CROSS_ENTROPY, LT_OP_CROSS_ENTROPY_BACK};

bool cu_loss_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const bool back = node->op == LT_OP_CROSS_ENTROPY_BACK;
    if (node->op != LT_OP_CROSS_ENTROPY && !back) {
        snprintf(reason, reason_size, "%s is not a loss", lt_op_name(node->op));
        return false;
    }
    const int il = back ? 1 : 0;
    if (!cu_check_source(node, il, CU_TYPES_F32, reason, reason_size) ||
        !cu_check_source(node, il + 1, CU_TYPES_I32, reason, reason_size) ||
        (back && !cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size)))
        return false;
    const struct lt_tensor *logits = node->src[il], *labels = node->src[il + 1];
    if (logits->ne[2] != 1 || logits->ne[3] != 1 || labels->ne[0] != logits->ne[1] ||
        lt_nelements(labels) != logits->ne[1]) {
        snprintf(reason, reason_size, "the logits are not [V, N] or the labels not [N]");
        return false;
    }
    if (back && lt_nelements(node->src[0]) != 1) {
        snprintf(reason, reason_size, "source 0 (the loss gradient) is not one f32");
        return false;
    }
    if (!cu_check_result_f32(node, reason, reason_size))
        return false;
    if (back ? !lt_same_shape(node, logits) : lt_nelements(node) != 1) {
        snprintf(reason, reason_size, "the result is not of the right shape");
        return false;
    }
    return true;
}

static __device__ __forceinline__ int32_t label_at(const char *labels, int64_t stride, int64_t n)
{
    return *(const int32_t *)(labels + n * stride);
}

static __device__ __forceinline__ float logit(const struct cu_t &x, int64_t i, int64_t n)
{
    return *(const float *)(x.data + i * x.nb[0] + n * x.nb[1]);
}

/* max and sum(exp(x - max)) of row n, for every thread of the block */
static __device__ void row_lse(const struct cu_t &x, int64_t n, float *fshared, double *dshared,
                               double *mx_out, double *sum_out)
{
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < x.ne[0]; i += blockDim.x)
        mx = fmaxf(mx, logit(x, i, n));
    mx = cu_block_max(mx, fshared);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < x.ne[0]; i += blockDim.x)
        sum += exp((double)logit(x, i, n) - (double)mx);
    *sum_out = cu_block_sum(sum, dshared);
    *mx_out = mx;
}

static __global__ void ce_rows_kernel(struct cu_t x, const char *labels, int64_t lstride,
                                      double *row_loss)
{
    cu_pdl_enter();
    __shared__ float fshared[32];
    __shared__ double dshared[32];
    const int64_t V = x.ne[0], N = x.ne[1];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const int32_t label = label_at(labels, lstride, n);
        if (label < 0 || label >= V) {
            if (threadIdx.x == 0)
                row_loss[n] = label < 0 ? 0.0 : __longlong_as_double(0x7ff8000000000000ll);
            continue;
        }
        double mx, sum;
        row_lse(x, n, fshared, dshared, &mx, &sum);
        if (threadIdx.x == 0)
            row_loss[n] = mx + log(sum) - (double)logit(x, label, n);
    }
}

static __global__ void ce_mean_kernel(const double *row_loss, const char *labels, int64_t lstride,
                                      int64_t N, float *out)
{
    cu_pdl_enter();
    __shared__ double shared[32];
    double total = 0.0, valid = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        if (label_at(labels, lstride, n) < 0)
            continue;
        total += row_loss[n];
        valid += 1.0;
    }
    total = cu_block_sum(total, shared);
    valid = cu_block_sum(valid, shared);
    if (threadIdx.x == 0)
        *out = valid > 0.0 ? (float)(total / valid) : 0.0f;
}

static __global__ void ce_count_kernel(const char *labels, int64_t lstride, int64_t N,
                                       double *n_valid)
{
    cu_pdl_enter();
    __shared__ double shared[32];
    double valid = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x)
        valid += label_at(labels, lstride, n) >= 0 ? 1.0 : 0.0;
    valid = cu_block_sum(valid, shared);
    if (threadIdx.x == 0)
        *n_valid = valid;
}

static __global__ void ce_back_kernel(const float *grad_loss, struct cu_t x, const char *labels,
                                      int64_t lstride, const double *n_valid, float *d)
{
    cu_pdl_enter();
    __shared__ float fshared[32];
    __shared__ double dshared[32];
    const int64_t V = x.ne[0], N = x.ne[1];
    const double coef = *n_valid > 0.0 ? (double)*grad_loss / *n_valid : 0.0;
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        float *dr = d + n * V;
        const int32_t label = label_at(labels, lstride, n);
        if (label < 0 || label >= V) {
            for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
                dr[i] = 0.0f;
            continue;
        }
        double mx, sum;
        row_lse(x, n, fshared, dshared, &mx, &sum);
        const double c = coef / sum;
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
            double p = c * exp((double)logit(x, i, n) - mx);
            /* p - 1 in double: p near 1 would lose its digits if rounded to float first */
            dr[i] = (float)(i == label ? p - coef : p);
        }
    }
}

/* a double a token: its loss (forward) or its coefficient (backward) */
static size_t loss_reduce_bytes(const struct lt_tensor *node)
{
    const int64_t N = node->src[node->op == LT_OP_CROSS_ENTROPY_BACK ? 1 : 0]->ne[1];
    return (size_t)(N > 0 ? N : 1) * sizeof(double);
}

static void loss_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    need[CU_SCRATCH_REDUCE] = loss_reduce_bytes(node);
}

lt_status cu_loss_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_loss_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const bool back = node->op == LT_OP_CROSS_ENTROPY_BACK;
    const struct lt_tensor *logits = node->src[back ? 1 : 0], *labels = node->src[back ? 2 : 1];
    const int64_t N = logits->ne[1];
    const char *lab = (const char *)labels->data;
    const int64_t ls = (int64_t)labels->nb[0];
    void *scratch;
    lt_status st = cu_scratch(c, CU_SCRATCH_REDUCE, loss_reduce_bytes(node), &scratch);
    if (st != LT_OK)
        return st;
    if (!back) {
        if (N > 0) {
            cu_launch_pdl(c, ce_rows_kernel, cu_blocks(N, 1), 256, 0, cu_view(logits), lab, ls,
                          (double *)scratch);
            st = cu_launched("cross_entropy_rows");
            if (st != LT_OK)
                return st;
        }
        cu_launch_pdl(c, ce_mean_kernel, 1, 256, 0, (const double *)scratch, lab, ls, N,
                      (float *)node->data);
        return cu_launched("cross_entropy_mean");
    }
    if (N == 0 || logits->ne[0] == 0)
        return LT_OK;
    cu_launch_pdl(c, ce_count_kernel, 1, 256, 0, lab, ls, N, (double *)scratch);
    st = cu_launched("cross_entropy_count");
    if (st != LT_OK)
        return st;
    cu_launch_pdl(c, ce_back_kernel, cu_blocks(N, 1), 256, 0, (const float *)node->src[0]->data,
                  cu_view(logits), lab, ls, (const double *)scratch, (float *)node->data);
    return cu_launched("cross_entropy_back");
}

const struct cu_family cu_family_loss = {
    "loss", loss_ops, CU_COUNT(loss_ops), cu_loss_supported, cu_loss_compute, loss_scratch};
