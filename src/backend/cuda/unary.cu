/* unary.cu: the element-wise unary ops (scale, silu, sigmoid, softplus, exp, log, sqr,
 * sqrt, sin, cos, abs, neg, relu), SWIGLU, SILU_BACK and SWIGLU_BACK on the device.
 *
 * Sources are F32, F16 or BF16 of any strides; results are contiguous F32 of source 0's
 * shape (SCALE's, SWIGLU's and SWIGLU_BACK's may be F16 or BF16, lt_scale_as, lt_swiglu_as
 * and lt_swiglu_back_as: rounded to nearest even from F32). The formulas
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

/* what a two-source kernel computes (apply_pair, glu_back_of) */
enum pair_kind { PK_SWIGLU, PK_SIGMOID_GLU, PK_SILU_BACK };

static int pair_kind(const struct lt_tensor *node)
{
    if (node->op == LT_OP_SILU_BACK)
        return PK_SILU_BACK;
    return lt_glu_of(node) == LT_GLU_SIGMOID ? PK_SIGMOID_GLU : PK_SWIGLU;
}

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
    /* SWIGLU's and SCALE's results may be half (lt_swiglu_as, lt_scale_as) */
    const bool half_ok = node->op == LT_OP_SWIGLU || node->op == LT_OP_SCALE;
    if (!cu_check_source(node, 0, CU_TYPES_FLOAT, reason, reason_size) ||
        (is_pair(node->op) && !cu_check_source(node, 1, CU_TYPES_FLOAT, reason, reason_size)) ||
        (half_ok ? !cu_check_result_float(node, reason, reason_size)
                 : !cu_check_result_f32(node, reason, reason_size)))
        return false;
    if (node->op == LT_OP_SWIGLU && !lt_glu_fits(node)) {
        snprintf(reason, reason_size, "op_params[0] %d is no gate activation",
                 (int)lt_get_param_i32(node, 0));
        return false;
    }
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

/* x: gate (SWIGLU) or the incoming gradient (SILU_BACK); u: up, or silu's input; kind a
 * pair_kind */
static __device__ __forceinline__ float apply_pair(int kind, float x, float u)
{
    if (kind == PK_SWIGLU)
        return x / (1.0f + expf(-x)) * u;
    if (kind == PK_SIGMOID_GLU) /* SIGMOID's value, then MUL's product */
        return u * (1.0f / (1.0f + expf(-x)));
    float s = 1.0f / (1.0f + expf(-u));
    return x * s * (1.0f + u * (1.0f - s));
}

/* any source layout; the result contiguous F32, or F16 / BF16 (a SCALE's, rounded to nearest
 * even as cu_store rounds) */
static __global__ void unary_kernel(int op, float s, struct cu_t a, struct cu_t out)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(out);
    const int es = out.type == LT_TYPE_F32 ? 4 : 2;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, out.ne, i0, i1, i2, i3);
        cu_store(out.data + f * es, out.type, apply(op, s, cu_get(a, i0, i1, i2, i3)));
    }
}

static __global__ void unary_flat_kernel(int op, float s, const float *a, float *y, int64_t n)
{
    cu_pdl_enter();
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        y[f] = apply(op, s, a[f]);
}

/* The flat kernels a float4 at a time, where the count is a multiple of 4 that fits 32 bits
 * and the pointers are 16-byte aligned (flat4_ok): one 4-byte load in flight a thread held
 * a training step's SILU, SWIGLU and their backwards near 2.1-2.4 TB/s. n4 = elements / 4. */
static __global__ void unary_flat4_kernel(int op, float s, const float4 *a, float4 *y, uint32_t n4)
{
    cu_pdl_enter();
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x) {
        const float4 x = a[f];
        y[f] =
            make_float4(apply(op, s, x.x), apply(op, s, x.y), apply(op, s, x.z), apply(op, s, x.w));
    }
}

static __device__ __forceinline__ float4 apply_pair4(int kind, float4 x, float4 u)
{
    return make_float4(apply_pair(kind, x.x, u.x), apply_pair(kind, x.y, u.y),
                       apply_pair(kind, x.z, u.z), apply_pair(kind, x.w, u.w));
}

template <int YT>
static __global__ void pair_flat4_kernel(int kind, const float4 *a, const float4 *b, char *y,
                                         uint32_t n4)
{
    cu_pdl_enter();
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x)
        cu_store4(y, YT, f, apply_pair4(kind, a[f], b[f]));
}

/* the pair on contiguous sources of float types ta and tb (F32, F16, BF16: a training step's
 * FFN gate and up written in BF16 by their products), four elements a thread */
template <int YT>
static __global__ void pair_typed4_kernel(int kind, const char *a, int ta, const char *b, int tb,
                                          char *y, uint32_t n4)
{
    cu_pdl_enter();
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x)
        cu_store4(y, YT, f, apply_pair4(kind, cu_load4(a, ta, f), cu_load4(b, tb, f)));
}

/* Whether t's rows are whole float4s (cu_rows16, ne0 a multiple of 4), its float4s counted
 * in 32 bits. A strided view of whole rows passes (the gated attention's gate, every other
 * 256 floats of the query projection), which the element-wise kernels read an element at a
 * time. */
static bool rows4_ok(const struct lt_tensor *t)
{
    return cu_rows16(cu_view(t)) && t->ne[0] % 4 == 0 && t->ne[0] > 0 &&
           lt_nelements(t) / 4 <= 0x7fffffff;
}

/* float4 f4 of t (rows4_ok), in row-major order: row f4 / q, q = ne0 / 4 float4s a row */
static __device__ __forceinline__ float4 row4_get(const struct cu_t &t, uint32_t f4, uint32_t q)
{
    const uint32_t r = f4 / q, c = f4 - r * q, n1 = (uint32_t)t.ne[1], n2 = (uint32_t)t.ne[2];
    const uint32_t i1 = r % n1, i2 = (r / n1) % n2, i3 = r / n1 / n2;
    return ((const float4 *)(t.data + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]))[c];
}

/* the pair on sources of rows4_ok's layout, y contiguous of type YT */
template <int YT>
static __global__ void pair_rows4_kernel(int kind, struct cu_t a, struct cu_t b, char *y,
                                         uint32_t n4, uint32_t q)
{
    cu_pdl_enter();
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x)
        cu_store4(y, YT, f, apply_pair4(kind, row4_get(a, f, q), row4_get(b, f, q)));
}

static bool flat4_ok(int64_t n, const void *p0, const void *p1, const void *p2, const void *p3)
{
    return n % 4 == 0 && n <= 0x7fffffff && cu_aligned(p0, 16) && cu_aligned(p1, 16) &&
           cu_aligned(p2, 16) && cu_aligned(p3, 16);
}

static __global__ void pair_kernel(int kind, struct cu_t a, struct cu_t b, struct cu_t out)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(out);
    const int es = out.type == LT_TYPE_F32 ? 4 : 2;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, out.ne, i0, i1, i2, i3);
        cu_store(out.data + f * es, out.type,
                 apply_pair(kind, cu_get(a, i0, i1, i2, i3), cu_get(b, i0, i1, i2, i3)));
    }
}

/* the pair on contiguous F32 sources of the result's shape, y of type YT: flat, no index
 * arithmetic (SWIGLU and SILU_BACK over a training step's FFN activations) */
template <int YT>
static __global__ void pair_flat_kernel(int kind, const float *a, const float *b, char *y,
                                        int64_t n)
{
    cu_pdl_enter();
    const int es = YT == LT_TYPE_F32 ? 4 : 2;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        cu_store(y + f * es, YT, apply_pair(kind, a[f], b[f]));
}

/* SWIGLU_BACK: (d gate, d up) = (g up s (1 + x (1 - s)), g silu(x)), or with the sigmoid
 * (kind PK_SIGMOID_GLU) (g up s (1 - s), g s), the CPU's expressions; swiglu_back_at stores
 * element f's into elements f and n + f of y, of type t (F32, or F16 / BF16 rounded to
 * nearest even: gradients only half products read) */
static __device__ __forceinline__ float2 swiglu_back_of(int kind, float g, float x, float u)
{
    const float d = 1.0f + expf(-x), s = 1.0f / d;
    if (kind == PK_SIGMOID_GLU)
        return make_float2(g * u * s * (1.0f - s), g * s);
    return make_float2(g * u * s * (1.0f + x * (1.0f - s)), g * (x / d));
}

static __device__ __forceinline__ void swiglu_back_at(int kind, float g, float x, float u, char *y,
                                                      int t, int64_t n, int64_t f)
{
    const float2 r = swiglu_back_of(kind, g, x, u);
    const int64_t es = t == LT_TYPE_F32 ? 4 : 2;
    cu_store(y + f * es, t, r.x);
    cu_store(y + (n + f) * es, t, r.y);
}

static __global__ void swiglu_back_kernel(int kind, struct cu_t g, struct cu_t x, struct cu_t u,
                                          char *y, int t)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(x);
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, x.ne, i0, i1, i2, i3);
        swiglu_back_at(kind, cu_get(g, i0, i1, i2, i3), cu_get(x, i0, i1, i2, i3),
                       cu_get(u, i0, i1, i2, i3), y, t, n, f);
    }
}

/* contiguous F32 sources: no index arithmetic (a training step's FFN activations) */
static __global__ void swiglu_back_flat_kernel(int kind, const float *g, const float *x,
                                               const float *u, char *y, int t, int64_t n)
{
    cu_pdl_enter();
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        swiglu_back_at(kind, g[f], x[f], u[f], y, t, n, f);
}

/* float4 f of both gradients: d gate's into y, d up's into yu */
static __device__ __forceinline__ void swiglu_back4(int kind, float4 gv, float4 xv, float4 uv,
                                                    char *y, char *yu, int t, uint32_t f)
{
    const float2 r0 = swiglu_back_of(kind, gv.x, xv.x, uv.x),
                 r1 = swiglu_back_of(kind, gv.y, xv.y, uv.y),
                 r2 = swiglu_back_of(kind, gv.z, xv.z, uv.z),
                 r3 = swiglu_back_of(kind, gv.w, xv.w, uv.w);
    cu_store4(y, t, f, make_float4(r0.x, r1.x, r2.x, r3.x));
    cu_store4(yu, t, f, make_float4(r0.y, r1.y, r2.y, r3.y));
}

/* contiguous sources of float types tg, tx and tu, four elements a thread */
static __global__ void swiglu_back_typed4_kernel(int kind, const char *g, int tg, const char *x,
                                                 int tx, const char *u, int tu, char *y, int t,
                                                 uint32_t n4)
{
    cu_pdl_enter();
    char *yu = y + (size_t)n4 * 4 * (t == LT_TYPE_F32 ? 4 : 2); /* d up's half */
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x)
        swiglu_back4(kind, cu_load4(g, tg, f), cu_load4(x, tx, f), cu_load4(u, tu, f), y, yu, t, f);
}

static __global__ void swiglu_back_flat4_kernel(int kind, const float4 *g, const float4 *x,
                                                const float4 *u, char *y, int t, uint32_t n4)
{
    cu_pdl_enter();
    char *yu = y + (size_t)n4 * 4 * (t == LT_TYPE_F32 ? 4 : 2); /* d up's half */
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x)
        swiglu_back4(kind, g[f], x[f], u[f], y, yu, t, f);
}

/* sources of rows4_ok's layout (the gated attention's strided gate), q float4s a row */
static __global__ void swiglu_back_rows4_kernel(int kind, struct cu_t g, struct cu_t x,
                                                struct cu_t u, char *y, int t, uint32_t n4,
                                                uint32_t q)
{
    cu_pdl_enter();
    char *yu = y + (size_t)n4 * 4 * (t == LT_TYPE_F32 ? 4 : 2);
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x)
        swiglu_back4(kind, row4_get(g, f, q), row4_get(x, f, q), row4_get(u, f, q), y, yu, t, f);
}

static lt_status launch_swiglu_back(struct cu_ctx *c, struct lt_tensor *node)
{
    const struct lt_tensor *g = node->src[0], *x = node->src[1], *u = node->src[2];
    const int64_t n = lt_nelements(x);
    if (n == 0)
        return LT_OK;
    const unsigned blocks = cu_blocks(n, 256);
    const int kind = pair_kind(node);
    bool flat = true;
    for (int i = 0; i < 3; i++)
        flat = flat && node->src[i]->type == LT_TYPE_F32 && lt_is_contiguous(node->src[i]);
    if (flat && flat4_ok(n, g->data, x->data, u->data, node->data)) {
        const uint32_t n4 = (uint32_t)(n / 4);
        cu_launch_pdl(c, swiglu_back_flat4_kernel, cu_blocks(n4, 256), 256, 0, kind,
                      (const float4 *)g->data, (const float4 *)x->data, (const float4 *)u->data,
                      (char *)node->data, (int)node->type, n4);
        return cu_launched("swiglu_back_flat4");
    }
    bool typed = !flat;
    for (int i = 0; i < 3; i++)
        typed = typed && lt_is_contiguous(node->src[i]);
    if (typed && flat4_ok(n, g->data, x->data, u->data, node->data)) {
        const uint32_t n4 = (uint32_t)(n / 4);
        cu_launch_pdl(c, swiglu_back_typed4_kernel, cu_blocks(n4, 256), 256, 0, kind,
                      (const char *)g->data, (int)g->type, (const char *)x->data, (int)x->type,
                      (const char *)u->data, (int)u->type, (char *)node->data, (int)node->type, n4);
        return cu_launched("swiglu_back_typed4");
    }
    if (flat) {
        cu_launch_pdl(c, swiglu_back_flat_kernel, blocks, 256, 0, kind, (const float *)g->data,
                      (const float *)x->data, (const float *)u->data, (char *)node->data,
                      (int)node->type, n);
    } else if (rows4_ok(g) && rows4_ok(x) && rows4_ok(u) && cu_aligned(node->data, 16)) {
        const uint32_t n4 = (uint32_t)(n / 4), q = (uint32_t)(x->ne[0] / 4);
        cu_launch_pdl(c, swiglu_back_rows4_kernel, cu_blocks(n4, 256), 256, 0, kind, cu_view(g),
                      cu_view(x), cu_view(u), (char *)node->data, (int)node->type, n4, q);
        return cu_launched("swiglu_back_rows4");
    } else {
        cu_launch_pdl(c, swiglu_back_kernel, blocks, 256, 0, kind, cu_view(g), cu_view(x),
                      cu_view(u), (char *)node->data, (int)node->type);
    }
    return cu_launched("swiglu_back");
}

/* a pair (SWIGLU, SILU_BACK) into its contiguous result of type YT: float4s of contiguous
 * F32 sources, their floats, float4s of whole rows (rows4_ok), or elements of any layout */
template <int YT> static lt_status launch_pair(struct cu_ctx *c, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const int64_t n = lt_nelements(node);
    const int kind = pair_kind(node);
    char *y = (char *)node->data;
    const bool flat = a->type == LT_TYPE_F32 && b->type == LT_TYPE_F32 && lt_is_contiguous(a) &&
                      lt_is_contiguous(b);
    if (!flat && lt_is_contiguous(a) && lt_is_contiguous(b) &&
        flat4_ok(n, a->data, b->data, y, y)) {
        const uint32_t n4 = (uint32_t)(n / 4);
        cu_launch_pdl(c, pair_typed4_kernel<YT>, cu_blocks(n4, 256), 256, 0, kind,
                      (const char *)a->data, (int)a->type, (const char *)b->data, (int)b->type, y,
                      n4);
        return cu_launched("swiglu/silu_back typed float4s");
    }
    if ((flat && flat4_ok(n, a->data, b->data, y, y)) ||
        (!flat && rows4_ok(a) && rows4_ok(b) && cu_aligned(y, 16))) {
        const uint32_t n4 = (uint32_t)(n / 4);
        if (flat)
            cu_launch_pdl(c, pair_flat4_kernel<YT>, cu_blocks(n4, 256), 256, 0, kind,
                          (const float4 *)a->data, (const float4 *)b->data, y, n4);
        else
            cu_launch_pdl(c, pair_rows4_kernel<YT>, cu_blocks(n4, 256), 256, 0, kind, cu_view(a),
                          cu_view(b), y, n4, (uint32_t)(a->ne[0] / 4));
        return cu_launched("swiglu/silu_back float4s");
    }
    if (flat)
        cu_launch_pdl(c, pair_flat_kernel<YT>, cu_blocks(n, 256), 256, 0, kind,
                      (const float *)a->data, (const float *)b->data, y, n);
    else
        cu_launch_pdl(c, pair_kernel, cu_blocks(n, 256), 256, 0, kind, cu_view(a), cu_view(b),
                      cu_view(node));
    return cu_launched("swiglu/silu_back");
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
    if (is_pair(node->op))
        return node->type == LT_TYPE_BF16  ? launch_pair<LT_TYPE_BF16>(c, node)
               : node->type == LT_TYPE_F16 ? launch_pair<LT_TYPE_F16>(c, node)
                                           : launch_pair<LT_TYPE_F32>(c, node);
    const float s = node->op == LT_OP_SCALE ? lt_get_param_f32(node, 0) : 0.0f;
    const bool f32 = node->type == LT_TYPE_F32; /* else a half SCALE: the indexed kernel */
    if (f32 && a->type == LT_TYPE_F32 && lt_is_contiguous(a) &&
        flat4_ok(n, a->data, node->data, node->data, node->data)) {
        const uint32_t n4 = (uint32_t)(n / 4);
        cu_launch_pdl(c, unary_flat4_kernel, cu_blocks(n4, 256), 256, 0, (int)node->op, s,
                      (const float4 *)a->data, (float4 *)node->data, n4);
        return cu_launched("unary_flat4");
    }
    if (f32 && a->type == LT_TYPE_F32 && lt_is_contiguous(a)) {
        cu_launch_pdl(c, unary_flat_kernel, blocks, 256, 0, (int)node->op, s,
                      (const float *)a->data, (float *)node->data, n);
        return cu_launched("unary_flat");
    }
    cu_launch_pdl(c, unary_kernel, blocks, 256, 0, (int)node->op, s, cu_view(a), cu_view(node));
    return cu_launched("unary");
}

const struct cu_family cu_family_unary = {"unary", unary_ops, CU_COUNT(unary_ops),
                                              cu_unary_supported, cu_unary_compute};
