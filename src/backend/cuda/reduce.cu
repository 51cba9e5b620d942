/* reduce.cu: SUM_ROWS and MEAN (over ne0, one value per row) and SUM (of every element) on
 * the device. Sources are F32, F16 or BF16 of any strides; sums run in double, like the
 * CPU's, though in a tree order rather than the CPU's left-to-right one. SUM is two-stage
 * with a fixed grid, so its result does not vary from run to run. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op reduce_ops[] = {LT_OP_SUM_ROWS, LT_OP_MEAN, LT_OP_SUM};

#define SUM_BLOCKS 1024

bool cu_reduce_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->op != LT_OP_SUM_ROWS && node->op != LT_OP_MEAN && node->op != LT_OP_SUM) {
        snprintf(reason, reason_size, "%s is not a reduction", lt_op_name(node->op));
        return false;
    }
    if (!cu_check_source(node, 0, CU_TYPES_FLOAT, reason, reason_size) ||
        !cu_check_result_f32(node, reason, reason_size))
        return false;
    int64_t expect = node->op == LT_OP_SUM ? 1 : lt_nrows(node->src[0]);
    if (lt_nelements(node) != expect) {
        snprintf(reason, reason_size, "the result has %lld elements, not %lld",
                 (long long)lt_nelements(node), (long long)expect);
        return false;
    }
    return true;
}

/* y[r] = sum of row r * scale, a row a team (row_team; cu_warp_rows picks which) */
template <bool WARP> static __global__ void sum_rows_kernel(struct cu_t a, float *y, double scale)
{
    using T = row_team<WARP>;
    __shared__ double shared[32];
    const int64_t rows = a.ne[1] * a.ne[2] * a.ne[3];
    for (int64_t r = T::first(); r < rows; r += T::step()) {
        const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
        double s = 0.0;
        for (int64_t i0 = T::lane(); i0 < a.ne[0]; i0 += T::size())
            s += (double)cu_get(a, i0, i1, i2, i3);
        s = T::sum(s, shared);
        if (T::lane() == 0)
            y[r] = (float)(s * scale);
    }
}

/* stage 1: block b's share of every element into partial[b] */
static __global__ void sum_partial_kernel(struct cu_t a, double *partial)
{
    __shared__ double shared[32];
    const int64_t n = cu_nelements(a);
    double s = 0.0;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, a.ne, i0, i1, i2, i3);
        s += (double)cu_get(a, i0, i1, i2, i3);
    }
    s = cu_block_sum(s, shared);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

/* stage 2: one block adds the partials */
static __global__ void sum_final_kernel(const double *partial, int n, float *y)
{
    __shared__ double shared[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += partial[i];
    s = cu_block_sum(s, shared);
    if (threadIdx.x == 0)
        *y = (float)s;
}

/* threads per row block: a multiple of 32, no more than the row needs, at most 256 */
static int row_threads(int64_t ne0)
{
    int64_t t = (ne0 + 31) / 32 * 32;
    return t < 32 ? 32 : t > 256 ? 256 : (int)t;
}

/* SUM takes its blocks' partial sums; the row sums take nothing */
static void reduce_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    if (node->op == LT_OP_SUM)
        need[CU_SCRATCH_REDUCE] = SUM_BLOCKS * sizeof(double);
}

lt_status cu_reduce_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_reduce_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const struct lt_tensor *a = node->src[0];
    const int64_t n = lt_nelements(a);
    if (node->op != LT_OP_SUM) {
        int64_t rows = lt_nrows(a);
        if (rows == 0)
            return LT_OK;
        double scale = node->op == LT_OP_MEAN && a->ne[0] > 0 ? 1.0 / (double)a->ne[0] : 1.0;
        if (cu_warp_rows(a->ne[0], rows))
            sum_rows_kernel<true><<<cu_blocks(rows, 8), 256, 0, c->stream>>>(
                cu_view(a), (float *)node->data, scale);
        else
            sum_rows_kernel<false><<<cu_blocks(rows, 1), row_threads(a->ne[0]), 0, c->stream>>>(
                cu_view(a), (float *)node->data, scale);
        return cu_launched("sum_rows");
    }
    void *partial;
    lt_status st = cu_scratch(c, CU_SCRATCH_REDUCE, SUM_BLOCKS * sizeof(double), &partial);
    if (st != LT_OK)
        return st;
    int blocks = (int)cu_blocks(n, 256);
    blocks = blocks > SUM_BLOCKS ? SUM_BLOCKS : blocks;
    sum_partial_kernel<<<blocks, 256, 0, c->stream>>>(cu_view(a), (double *)partial);
    st = cu_launched("sum_partial");
    if (st != LT_OK)
        return st;
    sum_final_kernel<<<1, 256, 0, c->stream>>>((const double *)partial, blocks,
                                               (float *)node->data);
    return cu_launched("sum_final");
}

const struct cu_family cu_family_reduce = {
    "reduce",          reduce_ops,    CU_COUNT(reduce_ops), cu_reduce_supported,
    cu_reduce_compute, reduce_scratch};
