/* unary.cu: the element-wise unary ops (scale, silu, sigmoid, softplus, exp, log, sqr,
 * sqrt, sin, cos, abs, neg, relu), SWIGLU, SILU_BACK and SWIGLU_BACK on the device.
 *
 * Sources are F32, F16 or BF16 of any strides; results are contiguous F32 of source 0's
 * shape (SWIGLU's and SWIGLU_BACK's may be F16 or BF16, lt_swiglu_as and lt_swiglu_back_as:
 * rounded to nearest even from F32). The formulas
 * are the CPU's (src/ops/unary.c) with CUDA's IEEE-accurate float functions (no fast math):
 * softplus is linear above 20 like torch.nn.Softplus. */
#include <stdio.h>

#include "backend/cuda/cuda_common.h"
#include "lathe/ops.h"

static const enum lt_op unary_ops[] = {
    LT_OP_SCALE, LT_OP_SILU,   LT_OP_SIGMOID,   LT_OP_SOFTPLUS,   LT_OP_EXP, LT_OP_LOG,
    LT_OP_SQR,   LT_OP_SQRT,   LT_OP_SIN,       LT_OP_COS,        LT_OP_ABS, LT_OP_NEG,
    LT_OP_RELU,  LT_OP_SWIGLU, LT_OP_SILU_BACK, LT_OP_SWIGLU_BACK};

static bool is_pair(enum lt_op op) { return op == LT_OP_SWIGLU || op == LT_OP_SILU_BACK; }

bool cu_unary_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    bool known = false;
    for (enum lt_op op : unary_ops)
        known = known || op == node->op;
    if (!known) {
        snprintf(reason, reason_size, "%s is not a unary op", lt_op_name(node->op));
        return false;
    }
    if (node->op == LT_OP_SWIGLU_BACK) { /* [g, gate, up] -> [d gate; d up] */
        for (int i = 0; i < 3; i++)
            if (!cu_check_source(node, i, CU_TYPES_FLOAT, reason, reason_size))
                return false;
        if (!cu_check_result_float(node, reason, reason_size))
            return false;
        if (!lt_swiglu_back_fits(node)) {
            snprintf(reason, reason_size, "the sources' and result's shapes do not fit");
            return false;
        }
        return true;
    }
    if (!cu_check_source(node, 0, CU_TYPES_FLOAT, reason, reason_size) ||
        (is_pair(node->op) && !cu_check_source(node, 1, CU_TYPES_FLOAT, reason, reason_size)) ||
        (node->op == LT_OP_SWIGLU ? !cu_check_result_float(node, reason, reason_size)
                                  : !cu_check_result_f32(node, reason, reason_size)))
        return false;
    if (!lt_same_shape(node, node->src[0]) ||
        (is_pair(node->op) && !lt_same_shape(node, node->src[1]))) {
        snprintf(reason, reason_size, "the sources differ in shape from the result");
        return false;
    }
    return true;
}

static __device__ __forceinline__ float apply(int op, float s, float x)
{
    switch (op) {
    case LT_OP_SCALE: return x * s;
    case LT_OP_SILU: return x / (1.0f + expf(-x));
    case LT_OP_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case LT_OP_SOFTPLUS: return x > 20.0f ? x : log1pf(expf(x));
    case LT_OP_EXP: return expf(x);
    case LT_OP_LOG: return logf(x);
    case LT_OP_SQR: return x * x;
    case LT_OP_SQRT: return sqrtf(x);
    case LT_OP_SIN: return sinf(x);
    case LT_OP_COS: return cosf(x);
    case LT_OP_ABS: return fabsf(x);
    case LT_OP_NEG: return -x;
    default: return x > 0.0f ? x : 0.0f; /* RELU */
    }
}

/* x: gate (SWIGLU) or the incoming gradient (SILU_BACK); u: up, or silu's input */
static __device__ __forceinline__ float apply_pair(int op, float x, float u)
{
    if (op == LT_OP_SWIGLU)
        return x / (1.0f + expf(-x)) * u;
    float s = 1.0f / (1.0f + expf(-u));
    return x * s * (1.0f + u * (1.0f - s));
}

static __global__ void unary_kernel(int op, float s, struct cu_t a, struct cu_t out)
{
    const int64_t n = cu_nelements(out);
    float *y = (float *)out.data;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, out.ne, i0, i1, i2, i3);
        y[f] = apply(op, s, cu_get(a, i0, i1, i2, i3));
    }
}

static __global__ void unary_flat_kernel(int op, float s, const float *a, float *y, int64_t n)
{
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        y[f] = apply(op, s, a[f]);
}

/* The flat kernels a float4 at a time, where the count is a multiple of 4 that fits 32 bits
 * and the pointers are 16-byte aligned (flat4_ok): one 4-byte load in flight a thread held
 * a training step's SILU, SWIGLU and their backwards near 2.1-2.4 TB/s. n4 = elements / 4. */
static __global__ void unary_flat4_kernel(int op, float s, const float4 *a, float4 *y, uint32_t n4)
{
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x) {
        const float4 x = a[f];
        y[f] =
            make_float4(apply(op, s, x.x), apply(op, s, x.y), apply(op, s, x.z), apply(op, s, x.w));
    }
}

template <int YT>
static __global__ void pair_flat4_kernel(int op, const float4 *a, const float4 *b, char *y,
                                         uint32_t n4)
{
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x) {
        const float4 x = a[f], u = b[f];
        cu_store4(y, YT, f,
                  make_float4(apply_pair(op, x.x, u.x), apply_pair(op, x.y, u.y),
                              apply_pair(op, x.z, u.z), apply_pair(op, x.w, u.w)));
    }
}

static bool flat4_ok(int64_t n, const void *p0, const void *p1, const void *p2, const void *p3)
{
    return n % 4 == 0 && n <= 0x7fffffff && cu_aligned(p0, 16) && cu_aligned(p1, 16) &&
           cu_aligned(p2, 16) && cu_aligned(p3, 16);
}

static __global__ void pair_kernel(int op, struct cu_t a, struct cu_t b, struct cu_t out)
{
    const int64_t n = cu_nelements(out);
    const int es = out.type == LT_TYPE_F32 ? 4 : 2;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, out.ne, i0, i1, i2, i3);
        cu_store(out.data + f * es, out.type,
                 apply_pair(op, cu_get(a, i0, i1, i2, i3), cu_get(b, i0, i1, i2, i3)));
    }
}

/* the pair on contiguous F32 sources of the result's shape, y of type YT: flat, no index
 * arithmetic (SWIGLU and SILU_BACK over a training step's FFN activations) */
template <int YT>
static __global__ void pair_flat_kernel(int op, const float *a, const float *b, char *y, int64_t n)
{
    const int es = YT == LT_TYPE_F32 ? 4 : 2;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        cu_store(y + f * es, YT, apply_pair(op, a[f], b[f]));
}

/* SWIGLU_BACK: (d gate, d up) = (g up s (1 + x (1 - s)), g silu(x)), the CPU's
 * expressions; swiglu_back_at stores element f's into elements f and n + f of y, of type t
 * (F32, or F16 / BF16 rounded to nearest even: gradients only half products read) */
static __device__ __forceinline__ float2 swiglu_back_of(float g, float x, float u)
{
    const float d = 1.0f + expf(-x), s = 1.0f / d;
    return make_float2(g * u * s * (1.0f + x * (1.0f - s)), g * (x / d));
}

static __device__ __forceinline__ void swiglu_back_at(float g, float x, float u, char *y, int t,
                                                      int64_t n, int64_t f)
{
    const float2 r = swiglu_back_of(g, x, u);
    const int64_t es = t == LT_TYPE_F32 ? 4 : 2;
    cu_store(y + f * es, t, r.x);
    cu_store(y + (n + f) * es, t, r.y);
}

static __global__ void swiglu_back_kernel(struct cu_t g, struct cu_t x, struct cu_t u, char *y,
                                          int t)
{
    const int64_t n = cu_nelements(x);
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, x.ne, i0, i1, i2, i3);
        swiglu_back_at(cu_get(g, i0, i1, i2, i3), cu_get(x, i0, i1, i2, i3),
                       cu_get(u, i0, i1, i2, i3), y, t, n, f);
    }
}

/* contiguous F32 sources: no index arithmetic (a training step's FFN activations) */
static __global__ void swiglu_back_flat_kernel(const float *g, const float *x, const float *u,
                                               char *y, int t, int64_t n)
{
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        swiglu_back_at(g[f], x[f], u[f], y, t, n, f);
}

static __global__ void swiglu_back_flat4_kernel(const float4 *g, const float4 *x, const float4 *u,
                                                char *y, int t, uint32_t n4)
{
    char *yu = y + (size_t)n4 * 4 * (t == LT_TYPE_F32 ? 4 : 2); /* d up's half */
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x) {
        const float4 gv = g[f], xv = x[f], uv = u[f];
        const float2 r0 = swiglu_back_of(gv.x, xv.x, uv.x), r1 = swiglu_back_of(gv.y, xv.y, uv.y),
                     r2 = swiglu_back_of(gv.z, xv.z, uv.z), r3 = swiglu_back_of(gv.w, xv.w, uv.w);
        cu_store4(y, t, f, make_float4(r0.x, r1.x, r2.x, r3.x));
        cu_store4(yu, t, f, make_float4(r0.y, r1.y, r2.y, r3.y));
    }
}

static lt_status launch_swiglu_back(struct cu_ctx *c, struct lt_tensor *node)
{
    const struct lt_tensor *g = node->src[0], *x = node->src[1], *u = node->src[2];
    const int64_t n = lt_nelements(x);
    if (n == 0)
        return LT_OK;
    const unsigned blocks = cu_blocks(n, 256);
    bool flat = true;
    for (int i = 0; i < 3; i++)
        flat = flat && node->src[i]->type == LT_TYPE_F32 && lt_is_contiguous(node->src[i]);
    if (flat && flat4_ok(n, g->data, x->data, u->data, node->data)) {
        const uint32_t n4 = (uint32_t)(n / 4);
        swiglu_back_flat4_kernel<<<cu_blocks(n4, 256), 256, 0, c->stream>>>(
            (const float4 *)g->data, (const float4 *)x->data, (const float4 *)u->data,
            (char *)node->data, (int)node->type, n4);
        return cu_launched("swiglu_back_flat4");
    }
    if (flat)
        swiglu_back_flat_kernel<<<blocks, 256, 0, c->stream>>>(
            (const float *)g->data, (const float *)x->data, (const float *)u->data,
            (char *)node->data, (int)node->type, n);
    else
        swiglu_back_kernel<<<blocks, 256, 0, c->stream>>>(cu_view(g), cu_view(x), cu_view(u),
                                                          (char *)node->data, (int)node->type);
    return cu_launched("swiglu_back");
}

lt_status cu_unary_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_unary_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    if (node->op == LT_OP_SWIGLU_BACK)
        return launch_swiglu_back(c, node);
    const struct lt_tensor *a = node->src[0];
    const int64_t n = lt_nelements(node);
    if (n == 0)
        return LT_OK;
    const unsigned blocks = cu_blocks(n, 256);
    if (is_pair(node->op) && a->type == LT_TYPE_F32 && node->src[1]->type == LT_TYPE_F32 &&
        lt_is_contiguous(a) && lt_is_contiguous(node->src[1]) && lt_is_contiguous(node) &&
        lt_same_shape(a, node) && lt_same_shape(node->src[1], node)) {
        const float *ad = (const float *)a->data, *bd = (const float *)node->src[1]->data;
        char *y = (char *)node->data;
        if (flat4_ok(n, ad, bd, y, y)) {
            const uint32_t n4 = (uint32_t)(n / 4);
            const unsigned b4 = cu_blocks(n4, 256);
            const float4 *a4 = (const float4 *)ad, *b4p = (const float4 *)bd;
            if (node->type == LT_TYPE_BF16)
                pair_flat4_kernel<LT_TYPE_BF16>
                    <<<b4, 256, 0, c->stream>>>((int)node->op, a4, b4p, y, n4);
            else if (node->type == LT_TYPE_F16)
                pair_flat4_kernel<LT_TYPE_F16>
                    <<<b4, 256, 0, c->stream>>>((int)node->op, a4, b4p, y, n4);
            else
                pair_flat4_kernel<LT_TYPE_F32>
                    <<<b4, 256, 0, c->stream>>>((int)node->op, a4, b4p, y, n4);
            return cu_launched("swiglu/silu_back flat4");
        }
        if (node->type == LT_TYPE_BF16)
            pair_flat_kernel<LT_TYPE_BF16><<<blocks, 256, 0, c->stream>>>((int)node->op, ad, bd, y, n);
        else if (node->type == LT_TYPE_F16)
            pair_flat_kernel<LT_TYPE_F16><<<blocks, 256, 0, c->stream>>>((int)node->op, ad, bd, y, n);
        else
            pair_flat_kernel<LT_TYPE_F32><<<blocks, 256, 0, c->stream>>>((int)node->op, ad, bd, y, n);
        return cu_launched("swiglu/silu_back flat");
    }
    if (is_pair(node->op)) {
        pair_kernel<<<blocks, 256, 0, c->stream>>>((int)node->op, cu_view(a),
                                                    cu_view(node->src[1]), cu_view(node));
        return cu_launched("swiglu/silu_back");
    }
    const float s = node->op == LT_OP_SCALE ? lt_get_param_f32(node, 0) : 0.0f;
    if (a->type == LT_TYPE_F32 && lt_is_contiguous(a) &&
        flat4_ok(n, a->data, node->data, node->data, node->data)) {
        const uint32_t n4 = (uint32_t)(n / 4);
        unary_flat4_kernel<<<cu_blocks(n4, 256), 256, 0, c->stream>>>(
            (int)node->op, s, (const float4 *)a->data, (float4 *)node->data, n4);
        return cu_launched("unary_flat4");
    }
    if (a->type == LT_TYPE_F32 && lt_is_contiguous(a)) {
        unary_flat_kernel<<<blocks, 256, 0, c->stream>>>((int)node->op, s, (const float *)a->data,
                                                          (float *)node->data, n);
        return cu_launched("unary_flat");
    }
    unary_kernel<<<blocks, 256, 0, c->stream>>>((int)node->op, s, cu_view(a), cu_view(node));
    return cu_launched("unary");
}

const struct cu_family cu_family_unary = {"unary", unary_ops, CU_COUNT(unary_ops),
                                              cu_unary_supported, cu_unary_compute};
