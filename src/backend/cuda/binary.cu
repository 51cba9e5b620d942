/* binary.cu: ADD, SUB, MUL and DIV on the device, b broadcast (tiled) over a:
 *   y[i0, i1, i2, i3] = a[i0, i1, i2, i3] op b[i0 % b.ne0, i1 % b.ne1, i2 % b.ne2, i3 % b.ne3]
 * Sources are F32, F16 or BF16 of any strides (broadcast views with nb = 0 included); the
 * result is contiguous of a's shape, F32, or F16 / BF16 (lt_mul_as: the value computed in
 * F32, rounded to nearest even, as the CPU does). A contiguous F32 a with a contiguous F32
 * b that is either a's shape or one row takes a path without index arithmetic. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"

static const enum lt_op binary_ops[] = {LT_OP_ADD, LT_OP_SUB, LT_OP_MUL, LT_OP_DIV};

bool cu_binary_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->op != LT_OP_ADD && node->op != LT_OP_SUB && node->op != LT_OP_MUL &&
        node->op != LT_OP_DIV) {
        snprintf(reason, reason_size, "%s is not a binary op", lt_op_name(node->op));
        return false;
    }
    if (!cu_check_source(node, 0, CU_TYPES_FLOAT, reason, reason_size) ||
        !cu_check_source(node, 1, CU_TYPES_FLOAT, reason, reason_size) ||
        !cu_check_result_float(node, reason, reason_size))
        return false;
    if (!lt_same_shape(node, node->src[0]) || !lt_can_repeat(node->src[1], node->src[0])) {
        snprintf(reason, reason_size, "source 1 cannot be broadcast over source 0");
        return false;
    }
    return true;
}

template <int OP> static __device__ __forceinline__ float apply(float x, float u)
{
    if (OP == LT_OP_ADD)
        return x + u;
    if (OP == LT_OP_SUB)
        return x - u;
    if (OP == LT_OP_MUL)
        return x * u;
    return x / u;
}

template <int OP>
static __global__ void binary_kernel(struct cu_t a, struct cu_t b, struct cu_t out)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(out);
    const int es = out.type == LT_TYPE_F32 ? 4 : 2;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, out.ne, i0, i1, i2, i3);
        cu_store(out.data + f * es, out.type,
                 apply<OP>(cu_get(a, i0, i1, i2, i3),
                           cu_get(b, i0 % b.ne[0], i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3])));
    }
}

/* a contiguous, b contiguous and repeating with period bn; y of type YT (F32, F16, BF16).
 * The period is taken in 32 bits where n allows: a 64-bit remainder is a long software
 * routine, which held a norm weight's broadcast product over 8192 tokens near 1.5 TB/s. */
template <int OP, int YT>
static __global__ void binary_flat_kernel(const float *a, const float *b, char *y, int64_t n,
                                          int64_t bn)
{
    cu_pdl_enter();
    const int es = YT == LT_TYPE_F32 ? 4 : 2;
    if (n <= 0x7fffffff) {
        const uint32_t n32 = (uint32_t)n, bn32 = (uint32_t)bn;
        for (uint32_t f = (uint32_t)cu_thread_index(); f < n32; f += (uint32_t)cu_thread_count())
            cu_store(y + (int64_t)f * es, YT, apply<OP>(a[f], b[bn32 == n32 ? f : f % bn32]));
        return;
    }
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        cu_store(y + f * es, YT, apply<OP>(a[f], b[bn == n ? f : f % bn]));
}

/* a contiguous F32, b contiguous F32 of a's shape but one element a row (b[f / n0]: the
 * L2 norm's and RMS norm's per-row factors in a training step's backward) */
template <int OP>
static __global__ void binary_rows_kernel(const float *a, const float *b, float *y, int64_t n,
                                          uint32_t n0)
{
    cu_pdl_enter();
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        y[f] = apply<OP>(a[f], b[f <= 0x7fffffff ? (uint32_t)f / n0 : f / n0]);
}

/* Four elements a thread, for the two paths above when the counts are multiples of 4, fit
 * 32 bits and the pointers are 16-byte aligned: a thread a float at a time (one 4-byte
 * load in flight) held a training step's products of [128, 16, 512, 16] near 3 TB/s, and
 * the per-row factors (a 32-bit division an element) near 1.7 TB/s. n4 = elements / 4;
 * flat: b repeats every bn4 float4s; rows: a row is n0q float4s, b one float a row. */
template <int OP, int YT>
static __global__ void binary_flat4_kernel(const float4 *a, const float4 *b, char *y, uint32_t n4,
                                           uint32_t bn4)
{
    cu_pdl_enter();
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x) {
        const float4 x = a[f], u = b[bn4 == n4 ? f : f % bn4];
        cu_store4(y, YT, f,
                  make_float4(apply<OP>(x.x, u.x), apply<OP>(x.y, u.y), apply<OP>(x.z, u.z),
                              apply<OP>(x.w, u.w)));
    }
}

template <int OP>
static __global__ void binary_rows4_kernel(const float4 *a, const float *b, float4 *y, uint32_t n4,
                                           uint32_t n0q)
{
    cu_pdl_enter();
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x) {
        const float4 x = a[f];
        const float u = b[f / n0q];
        y[f] =
            make_float4(apply<OP>(x.x, u), apply<OP>(x.y, u), apply<OP>(x.z, u), apply<OP>(x.w, u));
    }
}

template <int OP> static lt_status launch(struct cu_ctx *c, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const int64_t n = lt_nelements(node);
    if (n == 0)
        return LT_OK;
    const bool flat = a->type == LT_TYPE_F32 && b->type == LT_TYPE_F32 && lt_is_contiguous(a) &&
                      lt_is_contiguous(b) &&
                      (lt_same_shape(a, b) ||
                       (b->ne[0] == a->ne[0] && b->ne[1] == 1 && b->ne[2] == 1 && b->ne[3] == 1));
    const int64_t bn = lt_nelements(b);
    if (flat && n % 4 == 0 && bn % 4 == 0 && n <= 0x7fffffff && cu_aligned(a->data, 16) &&
        cu_aligned(b->data, 16) && cu_aligned(node->data, 16)) {
        const float4 *ad = (const float4 *)a->data, *bd = (const float4 *)b->data;
        char *y = (char *)node->data;
        const uint32_t n4 = (uint32_t)(n / 4), bn4 = (uint32_t)(bn / 4);
        const unsigned blocks = cu_blocks(n4, 256);
        if (node->type == LT_TYPE_BF16)
            cu_launch_pdl(c, binary_flat4_kernel<OP, LT_TYPE_BF16>, blocks, 256, 0, ad, bd, y, n4,
                          bn4);
        else if (node->type == LT_TYPE_F16)
            cu_launch_pdl(c, binary_flat4_kernel<OP, LT_TYPE_F16>, blocks, 256, 0, ad, bd, y, n4,
                          bn4);
        else
            cu_launch_pdl(c, binary_flat4_kernel<OP, LT_TYPE_F32>, blocks, 256, 0, ad, bd, y, n4,
                          bn4);
        return cu_launched("binary_flat4");
    }
    if (flat) {
        const float *ad = (const float *)a->data, *bd = (const float *)b->data;
        char *y = (char *)node->data;
        const unsigned blocks = cu_blocks(n, 256);
        if (node->type == LT_TYPE_BF16)
            cu_launch_pdl(c, binary_flat_kernel<OP, LT_TYPE_BF16>, blocks, 256, 0, ad, bd, y, n,
                          bn);
        else if (node->type == LT_TYPE_F16)
            cu_launch_pdl(c, binary_flat_kernel<OP, LT_TYPE_F16>, blocks, 256, 0, ad, bd, y, n, bn);
        else
            cu_launch_pdl(c, binary_flat_kernel<OP, LT_TYPE_F32>, blocks, 256, 0, ad, bd, y, n, bn);
        return cu_launched("binary_flat");
    }
    if (a->type == LT_TYPE_F32 && b->type == LT_TYPE_F32 && node->type == LT_TYPE_F32 &&
        lt_is_contiguous(a) && lt_is_contiguous(b) && b->ne[0] == 1 && a->ne[0] > 1 &&
        a->ne[0] <= 0x7fffffff && b->ne[1] == a->ne[1] && b->ne[2] == a->ne[2] &&
        b->ne[3] == a->ne[3]) {
        if (a->ne[0] % 4 == 0 && n <= 0x7fffffff && cu_aligned(a->data, 16) &&
            cu_aligned(node->data, 16)) {
            const uint32_t n4 = (uint32_t)(n / 4);
            cu_launch_pdl(c, binary_rows4_kernel<OP>, cu_blocks(n4, 256), 256, 0,
                          (const float4 *)a->data, (const float *)b->data, (float4 *)node->data, n4,
                          (uint32_t)(a->ne[0] / 4));
            return cu_launched("binary_rows4");
        }
        cu_launch_pdl(c, binary_rows_kernel<OP>, cu_blocks(n, 256), 256, 0, (const float *)a->data,
                      (const float *)b->data, (float *)node->data, n, (uint32_t)a->ne[0]);
        return cu_launched("binary_rows");
    }
    cu_launch_pdl(c, binary_kernel<OP>, cu_blocks(n, 256), 256, 0, cu_view(a), cu_view(b),
                  cu_view(node));
    return cu_launched("binary");
}

lt_status cu_binary_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_binary_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    switch (node->op) {
    case LT_OP_ADD: return launch<LT_OP_ADD>(c, node);
    case LT_OP_SUB: return launch<LT_OP_SUB>(c, node);
    case LT_OP_MUL: return launch<LT_OP_MUL>(c, node);
    default: return launch<LT_OP_DIV>(c, node);
    }
}

const struct cu_family cu_family_binary = {"binary", binary_ops, CU_COUNT(binary_ops),
                                               cu_binary_supported, cu_binary_compute};
