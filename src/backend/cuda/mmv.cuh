/* mmv.cuh (internal, CUDA C++): the few-columns product by lathe's own kernels (mmv.cu).
 * matmul.cu decides when it runs (its plan, shared by the precondition and the launcher)
 * and calls it. */
#ifndef LATHE_BACKEND_CUDA_MMV_CUH
#define LATHE_BACKEND_CUDA_MMV_CUH

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/norm_epi.cuh"

/* What the kernels need of matmul.cu's plan: a [K, M, A2, A3], b [K, N, B2, B3] (N <= 8),
 * r2 = B2 / A2, r3 = B3 / A3. */
struct cu_mmv_shape {
    int64_t K, M, N, A2, A3, B2, B3, r2, r3;
};

/* dst[m, n, i2, i3] = sum_k a[k, m, i2 / r2, i3 / r3] * b[k, n, i2, i3] for F32 b of any
 * strides, a of any type the device reads; dst contiguous F32. Queues one kernel; takes no
 * scratch. */
lt_status cu_mmv_run(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct lt_tensor *a,
                     const struct lt_tensor *b, float *dst);

/* MUL_MAT_GLU by one kernel: dst[h, n] = silu(a row h . b col n) * (a row H + h . b col n)
 * for H = M / 2 (mmv_half_kernel's GLU form). It takes one slice of 1 to 8 columns of F32
 * floats one after another (columns 16-byte aligned), against unsplit F16 / BF16 rows of
 * whole 16-byte chunks: cu_mmv_glu_takes, which matmul.cu's claim and launcher both ask. */
bool cu_mmv_glu_takes(const struct cu_mmv_shape *p, const struct lt_tensor *a,
                      const struct lt_tensor *b);
lt_status cu_mmv_glu_run(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct lt_tensor *a,
                         const struct lt_tensor *b, float *dst);

/* MUL_MAT_ADD_RMS_NORM by one kernel (mmv_half_kernel with norm_epi.cuh's epilogue): dst [M]
 * = epi->res + a b, then epi->out = its weighted RMS norm, for one column of F32 floats
 * (16-byte aligned) against one slice of unsplit F16 / BF16 rows of whole 16-byte chunks:
 * cu_mmv_norm_takes, which matmul.cu's claim and launcher both ask. */
bool cu_mmv_norm_takes(const struct cu_mmv_shape *p, const struct lt_tensor *a,
                       const struct lt_tensor *b);
lt_status cu_mmv_norm_run(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct lt_tensor *a,
                          const struct lt_tensor *b, float *dst, const struct cu_norm_epi *epi);

/* RMS_NORM_MUL_MAT by one kernel (mmv_half_kernel's NORM form, each block norming the column
 * in shared memory first): dst = a (rms_norm(x) * norm->w) (norm->eps), or with glu its
 * SwiGLU as cu_mmv_glu_run's, for one column of F32 floats (16-byte aligned, contiguous)
 * against one slice of unsplit F16 / BF16 rows of whole 16-byte chunks, K floats within
 * CU_MMV_NORM_MAX_SHARED: cu_mmv_rnm_takes, which matmul.cu's claim and launcher both ask.
 * Only norm->w and norm->eps are read. */
#define CU_MMV_NORM_MAX_SHARED (32 * 1024)
bool cu_mmv_rnm_takes(const struct cu_mmv_shape *p, const struct lt_tensor *a,
                      const struct lt_tensor *x, bool glu);
lt_status cu_mmv_rnm_run(struct cu_ctx *c, const struct cu_mmv_shape *p, const struct lt_tensor *a,
                         const struct lt_tensor *x, float *dst, const struct cu_norm_epi *norm,
                         bool glu);

#endif
