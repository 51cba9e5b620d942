/* rope.cu: ROPE and ROPE_BACK (the inverse rotation) on the device.
 *
 * a [head_dim, n_head, n_tokens, ne3] F32 of any strides, pos I32 [n_tokens]. Pair j of the
 * first n_dims dims ((j, j + n_dims/2) for NEOX, (2j, 2j+1) for NORMAL) turns by
 * float(pos) * inv_freq[j]; the rest pass through. Angles are rounded exactly as the CPU
 * (src/ops/rope.c) rounds them, after Hugging Face: inv_freq = 1 / float(base^(2j/n_dims))
 * with the exponent a float quotient, the angle a float product, cos and sin taken in
 * double and rounded to float, once a token and pair (rope_kernel); the rotation's products
 * are rounded separately. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"
#include "lathe/ops.h"

static const enum lt_op rope_ops[] = {LT_OP_ROPE, LT_OP_ROPE_BACK, LT_OP_RMS_NORM_ROPE};

#define NR_SHARED_MAX (48 * 1024) /* RMS_NORM_ROPE's row and its angles, a block */

/* RMS_NORM_ROPE (one block a row: the row, then its pairs' angles, in shared memory) */
static bool norm_rope_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (!cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size) ||
        !cu_check_source(node, 1, CU_TYPES_F32, reason, reason_size) ||
        !cu_check_source(node, 2, CU_TYPES_I32, reason, reason_size) ||
        !cu_check_result_f32(node, reason, reason_size))
        return false;
    const struct lt_tensor *x = node->src[0], *w = node->src[1], *pos = node->src[2];
    if (!lt_same_shape(x, node) || !lt_is_contiguous(w) || lt_nelements(w) != x->ne[0] ||
        w->ne[0] != x->ne[0] || lt_nelements(pos) != x->ne[2] || pos->ne[0] != x->ne[2]) {
        snprintf(reason, reason_size,
                 "the sources do not fit (x of the result's shape, weight f32 [head_dim] "
                 "contiguous, positions i32 [n_tokens])");
        return false;
    }
    const int n_dims = lt_get_param_i32(node, 0), mode = lt_get_param_i32(node, 1);
    if (n_dims <= 0 || n_dims % 2 || n_dims > x->ne[0] ||
        (mode != LT_ROPE_NORMAL && mode != LT_ROPE_NEOX)) {
        snprintf(reason, reason_size, "n_dims %d or mode %d is not valid", n_dims, mode);
        return false;
    }
    if ((size_t)(x->ne[0] + n_dims) * sizeof(float) > NR_SHARED_MAX || lt_nrows(node) > INT32_MAX) {
        snprintf(reason, reason_size,
                 "head_dim %lld is past a block's shared memory, or the rows past 2^31",
                 (long long)x->ne[0]);
        return false;
    }
    return true;
}

bool cu_rope_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->op == LT_OP_RMS_NORM_ROPE)
        return norm_rope_supported(node, reason, reason_size);
    if (node->op != LT_OP_ROPE && node->op != LT_OP_ROPE_BACK) {
        snprintf(reason, reason_size, "%s is not a rope", lt_op_name(node->op));
        return false;
    }
    if (!cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size) ||
        !cu_check_source(node, 1, CU_TYPES_I32, reason, reason_size) ||
        !cu_check_result_f32(node, reason, reason_size))
        return false;
    const struct lt_tensor *a = node->src[0], *pos = node->src[1];
    if (!lt_same_shape(a, node)) {
        snprintf(reason, reason_size, "source 0 is not of the result's shape");
        return false;
    }
    if (lt_nelements(pos) != a->ne[2] || pos->ne[0] != a->ne[2]) {
        snprintf(reason, reason_size, "source 1 is not i32 [n_tokens]");
        return false;
    }
    if (a->ne[0] * a->ne[1] > INT32_MAX || a->ne[2] * a->ne[3] > INT32_MAX) {
        snprintf(reason, reason_size,
                 "a token's elements or the tokens are past 2^31 (a block "
                 "a token, its elements counted in int)");
        return false;
    }
    int n_dims = lt_get_param_i32(node, 0), mode = lt_get_param_i32(node, 1);
    if (n_dims <= 0 || n_dims % 2 || n_dims > a->ne[0] ||
        (mode != LT_ROPE_NORMAL && mode != LT_ROPE_NEOX)) {
        snprintf(reason, reason_size, "n_dims %d or mode %d is not valid", n_dims, mode);
        return false;
    }
    return true;
}

/* Element i0 (< n_dims) of a rotated row: its pair j, its partner, whether it is the pair's
 * first (NEOX pairs (j, j + half), NORMAL (2j, 2j + 1)); and its value from its own (v) and
 * its partner's (vo), each product rounded */
struct rope_pair {
    int j, other;
    bool first;
};

static __device__ __forceinline__ rope_pair pair_of(int i0, int half, bool neox)
{
    const bool first = neox ? i0 < half : i0 % 2 == 0;
    return {neox ? (first ? i0 : i0 - half) : i0 / 2,
            neox ? (first ? i0 + half : i0 - half) : (first ? i0 + 1 : i0 - 1), first};
}

/* pair j's cos and sin at position p (the CPU's rounding of the angle: rope.c) */
static __device__ __forceinline__ void pair_angle(int j, int n_dims, float base, float p, float *cs,
                                                  float *sn)
{
    const float e = (float)(2 * j) / (float)n_dims;
    const float inv_freq = 1.0f / (float)pow((double)base, (double)e);
    const float angle = p * inv_freq;
    *cs = (float)cos((double)angle);
    *sn = (float)sin((double)angle);
}

static __device__ __forceinline__ float rotated(float v, float vo, float cs, float sn, bool first)
{
    return first ? __fsub_rn(__fmul_rn(v, cs), __fmul_rn(vo, sn))
                 : __fadd_rn(__fmul_rn(vo, sn), __fmul_rn(v, cs));
}

/* One block a token (i2, i3): first its pairs' cos and sin, once each in shared memory (a
 * pair's angle depends on the token's position and the pair alone: every head and both
 * elements of the pair share it, where each element took its own pow, cos and sin in
 * double before, ~1.3 TB/s on a training step's queries), then the token's ne0 x ne1
 * elements, rotated or passed through; the same values as before, bit for bit. */
static __global__ void rope_kernel(struct cu_t a, const char *pos, int64_t pos_stride, float *y,
                                   int n_dims, bool neox, float base, float sign)
{
    cu_pdl_enter();
    extern __shared__ float cs_sn[]; /* [half] cos, then [half] sign * sin */
    const int half = n_dims / 2;
    const int64_t i2 = blockIdx.x % a.ne[2], i3 = blockIdx.x / a.ne[2];
    const float p = (float)*(const int32_t *)(pos + i2 * pos_stride);
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        pair_angle(j, n_dims, base, p, &cs_sn[j], &cs_sn[half + j]);
        cs_sn[half + j] *= sign;
    }
    __syncthreads();
    const int ne0 = (int)a.ne[0], per = ne0 * (int)a.ne[1];
    float *yt = y + (i3 * a.ne[2] + i2) * per;
    for (int k = threadIdx.x; k < per; k += blockDim.x) {
        const int i0 = k % ne0, i1 = k / ne0;
        const float x = cu_getf(a, i0, i1, i2, i3);
        if (i0 >= n_dims) {
            yt[k] = x;
            continue;
        }
        const rope_pair q = pair_of(i0, half, neox);
        yt[k] = rotated(x, cu_getf(a, q.other, i1, i2, i3), cs_sn[q.j], cs_sn[half + q.j], q.first);
    }
}

/* One block a row (i1, i2, i3): the row into shared memory with its squares summed (in
 * double), then each element times the norm factor, times the weight, each product rounded
 * (norm.cu's norm_kernel), then the rotation of rope_kernel out of shared memory. */
static __global__ void norm_rope_kernel(struct cu_t x, const float *w, const char *pos,
                                        int64_t pos_stride, float *y, int n_dims, bool neox,
                                        float base, float eps)
{
    cu_pdl_enter();
    extern __shared__ float nr_sh[]; /* [ne0] the row, [half] cos, [half] sin */
    __shared__ double red[32];
    const int ne0 = (int)x.ne[0], half = n_dims / 2;
    float *row = nr_sh, *cs = nr_sh + ne0, *sn = cs + half;
    const int64_t r = blockIdx.x, i1 = r % x.ne[1], i2 = (r / x.ne[1]) % x.ne[2],
                  i3 = r / (x.ne[1] * x.ne[2]);
    const float p = (float)*(const int32_t *)(pos + i2 * pos_stride);
    for (int j = threadIdx.x; j < half; j += blockDim.x)
        pair_angle(j, n_dims, base, p, &cs[j], &sn[j]);
    double s = 0.0;
    for (int i0 = threadIdx.x; i0 < ne0; i0 += blockDim.x) {
        const float v = cu_getf(x, i0, i1, i2, i3);
        row[i0] = v;
        s += (double)v * (double)v;
    }
    s = cu_block_sum(s, red);
    const float f = (float)(1.0 / sqrt(s / (double)ne0 + (double)eps));
    for (int i0 = threadIdx.x; i0 < ne0; i0 += blockDim.x)
        row[i0] = __fmul_rn(__fmul_rn(row[i0], f), w[i0]);
    __syncthreads();
    float *yr = y + r * ne0;
    for (int i0 = threadIdx.x; i0 < ne0; i0 += blockDim.x) {
        const float v = row[i0];
        if (i0 >= n_dims) {
            yr[i0] = v;
            continue;
        }
        const rope_pair q = pair_of(i0, half, neox);
        yr[i0] = rotated(v, row[q.other], cs[q.j], sn[q.j], q.first);
    }
}

lt_status cu_rope_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    if (node->op == LT_OP_RMS_NORM_ROPE) {
        char reason[CU_REASON_MAX];
        if (!norm_rope_supported(node, reason, sizeof(reason)))
            return cu_refuse(node, reason);
        const int64_t rows = lt_nrows(node);
        if (rows == 0 || node->ne[0] == 0)
            return LT_OK;
        const struct lt_tensor *x = node->src[0], *pos = node->src[2];
        const int n_dims = lt_get_param_i32(node, 0);
        const int64_t t = (x->ne[0] + 31) / 32 * 32;
        cu_launch_pdl(c, norm_rope_kernel, (unsigned)rows, (unsigned)(t < 256 ? t : 256),
                      (size_t)(x->ne[0] + n_dims) * sizeof(float), cu_view(x),
                      (const float *)node->src[1]->data, (const char *)pos->data,
                      (int64_t)pos->nb[0], (float *)node->data, n_dims,
                      lt_get_param_i32(node, 1) == LT_ROPE_NEOX, lt_get_param_f32(node, 2),
                      lt_get_param_f32(node, 3));
        return cu_launched("rms_norm_rope");
    }
    char reason[CU_REASON_MAX];
    if (!cu_rope_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const int64_t n = lt_nelements(node);
    if (n == 0)
        return LT_OK;
    const struct lt_tensor *a = node->src[0], *pos = node->src[1];
    const int n_dims = lt_get_param_i32(node, 0);
    cu_launch_pdl(c, rope_kernel, (unsigned)(a->ne[2] * a->ne[3]), 256,
                  (size_t)n_dims * sizeof(float), cu_view(a), (const char *)pos->data,
                  (int64_t)pos->nb[0], (float *)node->data, n_dims,
                  lt_get_param_i32(node, 1) == LT_ROPE_NEOX, lt_get_param_f32(node, 2),
                  node->op == LT_OP_ROPE_BACK ? -1.0f : 1.0f);
    return cu_launched("rope");
}

const struct cu_family cu_family_rope = {"rope", rope_ops, CU_COUNT(rope_ops),
                                             cu_rope_supported, cu_rope_compute};
