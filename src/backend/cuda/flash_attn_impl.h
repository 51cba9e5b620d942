/* flash_attn_impl.h (internal, CUDA C++): what the files of the CUDA FLASH_ATTN share.
 * flash_attn.cu has the family (one predicate for claim and launcher: fa_plan_init) and the
 * F32 / TF32 kernels, which keep their tiles in F32 shared memory; flash_attn_bf16.cu the
 * kernels of LT_FLASH_ATTN_PREC_BF16, which keep BF16 tiles and their accumulators in
 * registers. Both read the node through struct fa_args and drop keys by fa_key_in. */
#ifndef LATHE_BACKEND_CUDA_FLASH_ATTN_IMPL_H
#define LATHE_BACKEND_CUDA_FLASH_ATTN_IMPL_H

#include "backend/cuda/cuda_common.h"

struct fa_args {
    struct cu_t q, k, v, mask, gdo, o; /* gdo, o: the backward's */
    bool has_mask, causal;
    const int32_t *pos; /* I32 positions in the mask's place (packed examples), or NULL */
    float scale;
    int64_t D, H, Hkv, T, nk, S;
    int dp, ld, rows; /* the F32 kernels' padded D, tile pitch and tile rows */
    float *out;       /* the result: o, or the flat dq | dk | dv */
    float *lse, *dd;  /* scratch [S][H][T] each (the stats pass writes, the backward reads) */
};

/* whether key j takes part for query t of sequence s (before the mask's value): inside the
 * cache, when causal not past t + (n_kv - T), and with positions not before the query's
 * example */
static __device__ __forceinline__ bool fa_key_in(const struct fa_args &a, int64_t t, int64_t j,
                                                 int64_t s)
{
    return j < a.nk && t < a.T && (!a.causal || j <= t + (a.nk - a.T)) &&
           (!a.pos || j >= t + (a.nk - a.T) - a.pos[s * a.T + t]);
}

/* the last key a tile of queries t0 .. t0 + rows - 1 reads, plus one */
static __device__ __forceinline__ int64_t fa_key_end(const struct fa_args &a, int64_t t0, int rows)
{
    if (!a.causal)
        return a.nk;
    int64_t t_last = t0 + rows - 1 < a.T - 1 ? t0 + rows - 1 : a.T - 1;
    int64_t e = t_last + (a.nk - a.T) + 1;
    return e < 0 ? 0 : e > a.nk ? a.nk : e;
}

/* FLASH_ATTN (forward) or FLASH_ATTN_BACK of LT_FLASH_ATTN_PREC_BF16 (flash_attn_bf16.cu):
 * every node the family's predicate takes. a: the node's sources and result, lse and dd
 * set for the backward (scratch of 2 S H T floats); staged: scratch of
 * cu_flash_attn_bf16_staged_bytes, 16-byte aligned, for q, k, v (and do) as BF16. */
lt_status cu_flash_attn_bf16(struct cu_ctx *c, const struct lt_tensor *node, struct fa_args a,
                             void *staged);
size_t cu_flash_attn_bf16_staged_bytes(int64_t D, int64_t H, int64_t Hkv, int64_t T, int64_t nk,
                                       int64_t S, bool back);

#endif
