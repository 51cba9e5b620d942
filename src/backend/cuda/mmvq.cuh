/* mmvq.cuh (internal, CUDA C++): the few-columns product of a Q8_0 (Q4_0, Q5_0) weight
 * with int8 activations (mmvq.cu): the F32 activation columns are quantised once into int8
 * blocks of 32 with a float scale each (the CPU's lt_q8a rounding, core/quant_dot.h), then
 * each output is a sum of integer dot products (__dp4a) scaled once per block. matmul.cu
 * decides when it runs (its plan, shared by the precondition and the launcher) and calls
 * it. */
#ifndef LATHE_BACKEND_CUDA_MMVQ_CUH
#define LATHE_BACKEND_CUDA_MMVQ_CUH

#include "backend/cuda/cuda_common.h"

/* The most columns (b's ne[1]) one launch takes: one kernel instantiation per count. */
#define CU_MMVQ_MAX_N 8

/* Whether the int8 path is on: LATHE_CUDA_MMVQ=0 turns it off (read once). */
bool cu_mmvq_enabled(void);

/* Whether mmvq takes weights of type t with rows of K elements (the caller has already
 * chosen the few-columns path: F32 b, at most CU_MMVQ_MAX_N columns). A function of the
 * type, the shape and the switch only, so a precondition may call it. */
bool cu_mmvq_takes(enum lt_type t, int64_t K);

/* dst[m, n, i2, i3] = sum_k a[k, m, i2 / r2, i3 / r3] * b[k, n, i2, i3] for a taken by
 * cu_mmvq_takes and F32 b of any strides with ne[1] <= CU_MMVQ_MAX_N; dst contiguous F32.
 * Uses the CU_SCRATCH_B slot for the quantised columns (nothing else of the product
 * holds it). Queues two kernels; no synchronisation unless the scratch grows. */
/* The CU_SCRATCH_B bytes cu_mmvq_run takes for b: the int8 columns, then a float2 a block. */
size_t cu_mmvq_scratch_bytes(const struct lt_tensor *a, const struct lt_tensor *b);

lt_status cu_mmvq_run(struct cu_ctx *c, const struct lt_tensor *a, const struct lt_tensor *b,
                      float *dst, int64_t r2, int64_t r3);
/* MUL_MAT_GLU by the same two kernels: a [K, 2 H] (one slice) as above and b [K, N], dst [H,
 * N] = silu(rows 0 .. H - 1's products) * rows H .. 2 H - 1's, each output's two rows in one
 * block. Scratch as cu_mmvq_run's. */
lt_status cu_mmvq_glu_run(struct cu_ctx *c, const struct lt_tensor *a, const struct lt_tensor *b,
                          float *dst);
/* MUL_MAT_ACC of one column and one slice: dst [M] += a b (dst is the addend too, each output
 * stored as its old value plus the sum). */
lt_status cu_mmvq_acc_run(struct cu_ctx *c, const struct lt_tensor *a, const struct lt_tensor *b,
                          float *dst);
/* RMS_NORM_MUL_MAT of one column x [K] (one slice): the quantisation takes x's weighted RMS
 * norm (nw [K], eps) first; dst as cu_mmvq_run's, or with glu cu_mmvq_glu_run's. */
lt_status cu_mmvq_rnm_run(struct cu_ctx *c, const struct lt_tensor *a, const struct lt_tensor *x,
                          const float *nw, float eps, bool glu, float *dst);

#endif
