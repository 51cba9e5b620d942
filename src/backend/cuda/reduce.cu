/* reduce.cu: SUM_ROWS and MEAN (over ne0, one value per row) and SUM (of every element) on
 * the device. Sources are F32, F16 or BF16 of any strides; sums run in double, like the
 * CPU's, though in a tree order rather than the CPU's left-to-right one. SUM is two-stage
 * with a fixed grid, so its result does not vary from run to run. ARGMAX picks each row's
 * largest element (the lowest index among equals, -1 for a NaN), the CPU's answer exactly:
 * the order of the comparisons cannot change which index wins. */
#include <limits.h>
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op reduce_ops[] = {LT_OP_SUM_ROWS, LT_OP_MEAN, LT_OP_SUM, LT_OP_ARGMAX};

#define SUM_BLOCKS 1024

/* ARGMAX: F32 rows, contiguous within a row (rows may lie apart), the first n of each, into
 * a contiguous I32 result of one element a row */
static bool argmax_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (!cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size))
        return false;
    const struct lt_tensor *a = node->src[0];
    const int64_t n = lt_get_param_i32(node, 0);
    if (a->nb[0] != sizeof(float)) {
        snprintf(reason, reason_size, "source 0's rows are not contiguous (%s)", lt_layout_name(a));
        return false;
    }
    if (n < 1 || n > a->ne[0]) {
        snprintf(reason, reason_size, "the first %lld of rows of %lld", (long long)n,
                 (long long)a->ne[0]);
        return false;
    }
    if (node->type != LT_TYPE_I32 || !lt_is_contiguous(node) || lt_nelements(node) != lt_nrows(a)) {
        snprintf(reason, reason_size, "the result is not contiguous i32 of %lld",
                 (long long)lt_nrows(a));
        return false;
    }
    return true;
}

bool cu_reduce_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->op == LT_OP_ARGMAX)
        return argmax_supported(node, reason, reason_size);
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
    cu_pdl_enter();
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
    cu_pdl_enter();
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
    cu_pdl_enter();
    __shared__ double shared[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += partial[i];
    s = cu_block_sum(s, shared);
    if (threadIdx.x == 0)
        *y = (float)s;
}

/* (value, index) v, i wins over bv, bi: larger, or equal and at a lower index (a NaN never
 * wins: it is counted apart) */
static __device__ __forceinline__ void argmax_take(float &bv, int &bi, float v, int i)
{
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

static __device__ __forceinline__ void argmax_warp(float &bv, int &bi)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_take(bv, bi, ov, oi);
    }
}

#define ARGMAX_THREADS 1024
/* A row of at least ARGMAX_SPLIT elements, in a batch of at most ARGMAX_SPLIT_ROWS rows (a
 * decode step's vocabularies), is cut into parts of ARGMAX_PART elements, a block each, whose
 * winners a second kernel compares: a block a row of 248,320 took 36 us on the H200, the
 * device almost idle. */
#define ARGMAX_SPLIT 65536
#define ARGMAX_SPLIT_ROWS 64
#define ARGMAX_PART 16384
#define ARGMAX_NAN INT_MIN /* a part's index when it saw a NaN */

/* the parts a row is cut into (1: the block of a row writes y itself) */
static int64_t argmax_parts(int64_t n, int64_t rows)
{
    return n >= ARGMAX_SPLIT && rows <= ARGMAX_SPLIT_ROWS ? (n + ARGMAX_PART - 1) / ARGMAX_PART
                                                          : 1;
}

/* the parts' winners, value and index, of an ARGMAX node's rows (0: not cut) */
static size_t argmax_scratch_bytes(const struct lt_tensor *node)
{
    const int64_t rows = lt_nrows(node->src[0]),
                  parts = argmax_parts(lt_get_param_i32(node, 0), rows);
    return parts > 1 ? (size_t)(rows * parts) * (sizeof(float) + sizeof(int)) : 0;
}

/* y[r]: the lowest index of row r's largest element among its first n, -1 when one of them
 * is NaN. Block (r, part) takes the row's elements [part len, (part + 1) len) (len = n
 * with one part): each thread takes every blockDim-th element, four loads in flight, then
 * the warps and the block agree. With one part the block writes y[r]; otherwise its winner
 * (ARGMAX_NAN: it saw a NaN) goes to pv, pi [r parts + part] for argmax_final_kernel. */
static __global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(struct cu_t a, int n, int parts, int len, int32_t *y, float *pv, int *pi)
{
    cu_pdl_enter();
    __shared__ float wv[32];
    __shared__ int wi[32];
    __shared__ int any_nan;
    const int64_t rows = a.ne[1] * a.ne[2] * a.ne[3];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int bd = blockDim.x;
    for (int64_t u = blockIdx.x; u < rows * parts; u += gridDim.x) {
        const int64_t r = u / parts;
        const int part = (int)(u % parts), lo = part * len, hi = n - lo < len ? n : lo + len;
        const int64_t i1 = r % a.ne[1], i2 = (r / a.ne[1]) % a.ne[2], i3 = r / (a.ne[1] * a.ne[2]);
        const float *x = (const float *)(a.data + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
        float bv = -INFINITY;
        int bi = INT_MAX;
        bool nan = false;
        int i = lo + threadIdx.x;
        for (; i + 3 * bd < hi; i += 4 * bd) {
            const float v0 = x[i], v1 = x[i + bd], v2 = x[i + 2 * bd], v3 = x[i + 3 * bd];
            nan = nan || v0 != v0 || v1 != v1 || v2 != v2 || v3 != v3;
            argmax_take(bv, bi, v0, i);
            argmax_take(bv, bi, v1, i + bd);
            argmax_take(bv, bi, v2, i + 2 * bd);
            argmax_take(bv, bi, v3, i + 3 * bd);
        }
        for (; i < hi; i += bd) {
            const float v = x[i];
            nan = nan || v != v;
            argmax_take(bv, bi, v, i);
        }
        argmax_warp(bv, bi);
        nan = __any_sync(0xffffffffu, nan);
        if (threadIdx.x == 0)
            any_nan = 0;
        __syncthreads();
        if (lane == 0) {
            wv[warp] = bv;
            wi[warp] = bi;
            if (nan)
                any_nan = 1;
        }
        __syncthreads();
        if (warp == 0) {
            bv = lane < n_warps ? wv[lane] : -INFINITY;
            bi = lane < n_warps ? wi[lane] : INT_MAX;
            argmax_warp(bv, bi);
            if (lane == 0 && parts == 1)
                y[r] = any_nan ? -1 : bi;
            else if (lane == 0) {
                pv[u] = bv;
                pi[u] = any_nan ? ARGMAX_NAN : bi;
            }
        }
        __syncthreads(); /* before the next row's writes to the shared words */
    }
}

/* a warp a row: the winner of its parts' winners (lower index on ties, -1 after a NaN) */
static __global__ void argmax_final_kernel(const float *pv, const int *pi, int parts, int64_t rows,
                                           int32_t *y)
{
    cu_pdl_enter();
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) /* the whole warp leaves together */
        return;
    float bv = -INFINITY;
    int bi = INT_MAX;
    bool nan = false;
    for (int k = lane; k < parts; k += 32) {
        const int i = pi[r * parts + k];
        nan = nan || i == ARGMAX_NAN;
        if (i != ARGMAX_NAN)
            argmax_take(bv, bi, pv[r * parts + k], i);
    }
    argmax_warp(bv, bi);
    nan = __any_sync(0xffffffffu, nan);
    if (lane == 0)
        y[r] = nan ? -1 : bi;
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
    if (node->op == LT_OP_ARGMAX)
        need[CU_SCRATCH_REDUCE] = argmax_scratch_bytes(node);
}

lt_status cu_reduce_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_reduce_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const struct lt_tensor *a = node->src[0];
    const int64_t n = lt_nelements(a);
    if (node->op == LT_OP_ARGMAX) {
        const int64_t rows = lt_nrows(a);
        if (rows == 0)
            return LT_OK;
        const int n_arg = (int)lt_get_param_i32(node, 0);
        const int64_t parts = argmax_parts(n_arg, rows), blocks = rows * parts;
        int32_t *y = (int32_t *)node->data;
        float *pv = nullptr; /* the parts' winners (cut rows only) */
        int *pi = nullptr;
        lt_status st = LT_OK;
        if (parts > 1) {
            void *partial;
            if ((st = cu_scratch(c, CU_SCRATCH_REDUCE, argmax_scratch_bytes(node), &partial)) !=
                LT_OK)
                return st;
            pv = (float *)partial;
            pi = (int *)(pv + blocks);
        }
        cu_launch_pdl(c, argmax_kernel, (unsigned)(blocks < 65535 ? blocks : 65535), ARGMAX_THREADS,
                      0, cu_view(a), n_arg, (int)parts, parts > 1 ? ARGMAX_PART : n_arg, y, pv, pi);
        if ((st = cu_launched("argmax")) != LT_OK || parts == 1)
            return st;
        cu_launch_pdl(c, argmax_final_kernel, (unsigned)((rows + 7) / 8), 256, 0, pv, pi,
                      (int)parts, rows, y);
        return cu_launched("argmax_final");
    }
    if (node->op != LT_OP_SUM) {
        int64_t rows = lt_nrows(a);
        if (rows == 0)
            return LT_OK;
        double scale = node->op == LT_OP_MEAN && a->ne[0] > 0 ? 1.0 / (double)a->ne[0] : 1.0;
        if (cu_warp_rows(a->ne[0], rows))
            cu_launch_pdl(c, sum_rows_kernel<true>, cu_blocks(rows, 8), 256, 0, cu_view(a),
                          (float *)node->data, scale);
        else
            cu_launch_pdl(c, sum_rows_kernel<false>, cu_blocks(rows, 1), row_threads(a->ne[0]), 0,
                          cu_view(a), (float *)node->data, scale);
        return cu_launched("sum_rows");
    }
    void *partial;
    lt_status st = cu_scratch(c, CU_SCRATCH_REDUCE, SUM_BLOCKS * sizeof(double), &partial);
    if (st != LT_OK)
        return st;
    int blocks = (int)cu_blocks(n, 256);
    blocks = blocks > SUM_BLOCKS ? SUM_BLOCKS : blocks;
    cu_launch_pdl(c, sum_partial_kernel, blocks, 256, 0, cu_view(a), (double *)partial);
    st = cu_launched("sum_partial");
    if (st != LT_OK)
        return st;
    cu_launch_pdl(c, sum_final_kernel, 1, 256, 0, (const double *)partial, blocks,
                  (float *)node->data);
    return cu_launched("sum_final");
}

const struct cu_family cu_family_reduce = {
    "reduce",          reduce_ops,    CU_COUNT(reduce_ops), cu_reduce_supported,
    cu_reduce_compute, reduce_scratch};
