/* norm_epi.cuh (internal, CUDA C++): MUL_MAT_ADD_RMS_NORM's epilogue in the few-column
 * F16 / BF16 product kernel (mmv.cu's mmv_half_kernel), for one column (a decode step's
 * output and down projections; mmvq's had it too, and lost by it: matmul.cu says why). Each output
 * m is stored as res[m] + its product (the result's sum half, as ADD_RMS_NORM adds); then the
 * grid's last block to finish (the blocks count their arrivals in one of the context's counters,
 * cu_ctx) norms the whole column as ADD_RMS_NORM's kernel (norm.cu) does: the squares summed in
 * double, f = (sum / M + eps)^(-1/2) rounded to float, out[m] = (sum[m] f) w[m]. The norm's launch,
 * and its wait for the product, are gone; what is left is one block's pass over M floats
 * that are still in L2. matmul.cu decides when (cu_mmv_norm_takes). With no norm weight
 * (e.w NULL) the same epilogue is MUL_MAT_ACC's: each output stored over its old value plus
 * the product, nothing after. The block-wide norm (cu_block_rms_norm) also serves
 * RMS_NORM_MUL_MAT's prologue in the same kernel, where every block norms the column first. */
#ifndef LATHE_BACKEND_CUDA_NORM_EPI_CUH
#define LATHE_BACKEND_CUDA_NORM_EPI_CUH

#include "backend/cuda/cuda_common.h"

#define CU_EPI_KEEP 8 /* sums a thread of the last block keeps: M <= 2048 at 256 threads */

struct cu_norm_epi {
    const float *res; /* the residual [M], contiguous */
    const float *w;   /* the norm's weight [M] */
    float *out;       /* the normed half [M] */
    int *counter;     /* zero before the launch; the last block sets it back to zero */
    float eps;
};

/* the sum half's value of output m whose product is v */
static __device__ __forceinline__ float cu_epi_sum(const struct cu_norm_epi &e, int64_t m, float v)
{
    return __fadd_rn(e.res[m], v);
}

/* The weights w[i] of a thread's first CU_EPI_KEEP elements (i = threadIdx.x + r blockDim.x;
 * 0 past n) into wv, ahead of cu_block_rms_norm: a PDL kernel may load them before its wait
 * when no kernel writes w (a norm's weight). */
static __device__ __forceinline__ void cu_norm_weights(const float *w, int64_t n, float *wv)
{
#pragma unroll
    for (int r = 0; r < CU_EPI_KEEP; r++) {
        const int64_t i = threadIdx.x + (int64_t)r * blockDim.x;
        wv[r] = i < n ? w[i] : 0.0f;
    }
}

/* By a whole block, reached together: dst[i] = (x[i] f) w[i] for i < n, f = (sum x^2 / n +
 * eps)^(-1/2) from the squares summed in double and rounded to float once, each product
 * rounded (ADD_RMS_NORM's and RMS_NORM's formula). x is read through L2 (__ldcg: other
 * blocks or the kernel ahead wrote it); a thread's first CU_EPI_KEEP elements stay in
 * registers between the two passes, with their weights wv (cu_norm_weights), the rest are
 * read again. red: 32 doubles of shared memory. */
static __device__ void cu_block_rms_norm(const float *x, const float *w, const float *wv,
                                         float *dst, int64_t n, float eps, double *red)
{
    float v[CU_EPI_KEEP];
    double s = 0.0;
#pragma unroll
    for (int r = 0; r < CU_EPI_KEEP; r++) {
        const int64_t i = threadIdx.x + (int64_t)r * blockDim.x;
        v[r] = i < n ? __ldcg(x + i) : 0.0f;
        s += (double)v[r] * (double)v[r];
    }
    for (int64_t i = threadIdx.x + (int64_t)CU_EPI_KEEP * blockDim.x; i < n; i += blockDim.x) {
        const double xi = (double)__ldcg(x + i);
        s += xi * xi;
    }
    s = cu_block_sum(s, red);
    const float f = (float)(1.0 / sqrt(s / (double)n + (double)eps));
#pragma unroll
    for (int r = 0; r < CU_EPI_KEEP; r++) {
        const int64_t i = threadIdx.x + (int64_t)r * blockDim.x;
        if (i < n)
            dst[i] = __fmul_rn(__fmul_rn(v[r], f), wv[r]);
    }
    for (int64_t i = threadIdx.x + (int64_t)CU_EPI_KEEP * blockDim.x; i < n; i += blockDim.x)
        dst[i] = __fmul_rn(__fmul_rn(__ldcg(x + i), f), w[i]);
}

/* Called once by every thread of every block, after the block's last store of a sum (sum:
 * the M sums, the kernel's dst). A block that is not the last returns at once, and every
 * block when there is no norm (e.w NULL: MUL_MAT_ACC's addend, res, is dst itself). */
static __device__ void cu_epi_finish(const struct cu_norm_epi &e, const float *sum, int64_t M)
{
    if (!e.w) /* MUL_MAT_ACC: the sums alone */
        return;
    __shared__ int last;
    __shared__ double shared[32];
    __threadfence(); /* this block's sums, visible to the last block */
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(e.counter, 1) == (int)(gridDim.x * gridDim.y) - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    float wv[CU_EPI_KEEP];
    cu_norm_weights(e.w, M, wv);
    cu_block_rms_norm(sum, e.w, wv, e.out, M, e.eps, shared);
    if (threadIdx.x == 0)
        *e.counter = 0;
}

#endif
