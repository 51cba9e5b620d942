/* norm_epi.cuh (internal, CUDA C++): MUL_MAT_ADD_RMS_NORM's epilogue in the few-column
 * F16 / BF16 product kernel (mmv.cu's mmv_half_kernel), for one column (a decode step's
 * output and down projections; mmvq's had it too, and lost by it: matmul.cu says why). Each output
 * m is stored as res[m] + its product (the result's sum half, as ADD_RMS_NORM adds); then the
 * grid's last block to finish (the blocks count their arrivals in one of the context's counters,
 * cu_ctx) norms the whole column as ADD_RMS_NORM's kernel (norm.cu) does: the squares summed in
 * double, f = (sum / M + eps)^(-1/2) rounded to float, out[m] = (sum[m] f) w[m]. The norm's launch,
 * and its wait for the product, are gone; what is left is one block's pass over M floats
 * that are still in L2. matmul.cu decides when (cu_mmv_norm_takes). */
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
    /* up to CU_EPI_KEEP sums a thread are kept in registers between the two passes, with
     * their weights loaded beside them (one trip to L2 instead of two); more go to L2 again */
    float v[CU_EPI_KEEP], wv[CU_EPI_KEEP];
    double s = 0.0;
#pragma unroll
    for (int r = 0; r < CU_EPI_KEEP; r++) {
        const int64_t i = threadIdx.x + (int64_t)r * blockDim.x;
        v[r] = i < M ? __ldcg(sum + i) : 0.0f;
        wv[r] = i < M ? e.w[i] : 0.0f;
        s += (double)v[r] * (double)v[r];
    }
    for (int64_t i = threadIdx.x + (int64_t)CU_EPI_KEEP * blockDim.x; i < M; i += blockDim.x) {
        const double x = (double)__ldcg(sum + i);
        s += x * x;
    }
    s = cu_block_sum(s, shared);
    const float f = (float)(1.0 / sqrt(s / (double)M + (double)e.eps));
#pragma unroll
    for (int r = 0; r < CU_EPI_KEEP; r++) {
        const int64_t i = threadIdx.x + (int64_t)r * blockDim.x;
        if (i < M)
            e.out[i] = __fmul_rn(__fmul_rn(v[r], f), wv[r]);
    }
    for (int64_t i = threadIdx.x + (int64_t)CU_EPI_KEEP * blockDim.x; i < M; i += blockDim.x)
        e.out[i] = __fmul_rn(__fmul_rn(__ldcg(sum + i), f), e.w[i]);
    if (threadIdx.x == 0)
        *e.counter = 0;
}

#endif
