/* norm.cu: RMS_NORM and L2_NORM over ne0 and their backward ops on the device.
 *
 * y = x * r, r = (S + eps)^(-1/2), S = sum(x^2) / n (RMS) or sum(x^2) (L2); the backward
 * gives dx = r g - r^3 x sum(g x) / n (n = 1 for L2). As on the CPU (src/ops/norm.c) the
 * sums and r are computed in double and r is rounded to float before it scales; dx's two
 * products are rounded separately (no fused multiply-add) as the CPU's are. A block runs a
 * row; sources are F32 of any strides, results contiguous F32, except RMS_NORM with a
 * weight (src[1], F32 [ne0]: the inference fusion), whose result y * w is stored as F32,
 * F16 or BF16, each product rounded on its own as the CPU's are, and then by silu(z) with a
 * gate (src[2], F32 or BF16 of x's shape, any strides; the backward reads it the same way).
 * ADD_RMS_NORM (inference) writes the residual
 * sum a + b and then rms_norm(a + b) * w into its [ne0, ne1, 2] result. RMS_NORM_MUL_BACK
 * (the weighted norm's gradients: dx, dz, dw's partial sums, src/ops/norm.c's layout) gives
 * each part of the rows one warp (rows of up to 1,024, read as float4s where contiguous) or
 * one block, so a partial row is one warp's or block's sum, in a fixed order. */
#include <stdio.h>

#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "lathe/ops.h"

static const enum lt_op norm_ops[] = {LT_OP_RMS_NORM,      LT_OP_L2_NORM,
                                      LT_OP_RMS_NORM_BACK, LT_OP_L2_NORM_BACK,
                                      LT_OP_ADD_RMS_NORM,  LT_OP_RMS_NORM_MUL_BACK};

static bool is_back(enum lt_op op) { return op == LT_OP_RMS_NORM_BACK || op == LT_OP_L2_NORM_BACK; }

static bool add_norm_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (!cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size) ||
        !cu_check_source(node, 1, CU_TYPES_F32, reason, reason_size) ||
        !cu_check_source(node, 2, CU_TYPES_F32, reason, reason_size))
        return false;
    const struct lt_tensor *a = node->src[0], *b = node->src[1], *w = node->src[2];
    if (!lt_same_shape(a, b) || a->ne[0] != node->ne[0] || a->ne[1] != node->ne[1] ||
        a->ne[2] != 1 || a->ne[3] != 1 || node->ne[2] != 2 || node->ne[3] != 1) {
        snprintf(reason, reason_size, "the sources are not [ne0, ne1] of the [ne0, ne1, 2] result");
        return false;
    }
    if (!lt_is_contiguous(w) || lt_nelements(w) != node->ne[0]) {
        snprintf(reason, reason_size, "the weight (source 2) is not contiguous [ne0]");
        return false;
    }
    return cu_check_result_f32(node, reason, reason_size);
}

static bool norm_mul_back_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (!lt_rms_norm_mul_back_fits(node)) {
        snprintf(reason, reason_size,
                 "the sources or the result are not the shapes and f32 "
                 "types of a weighted norm's gradients");
        return false;
    }
    return cu_check_source(node, 0, CU_TYPES_F32, reason, reason_size) &&
           cu_check_source(node, 1, CU_TYPES_F32, reason, reason_size) &&
           cu_check_source(node, 2, CU_TYPES_F32, reason, reason_size) &&
           (!node->src[3] || cu_check_source(node, 3, CU_TYPES_F32 | CU_TYPE_BIT(LT_TYPE_BF16),
                                             reason, reason_size)) &&
           (!node->src[4] || cu_check_source(node, 4, CU_TYPES_F32, reason, reason_size)) &&
           cu_check_result_f32(node, reason, reason_size);
}

bool cu_norm_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->op == LT_OP_ADD_RMS_NORM)
        return add_norm_supported(node, reason, reason_size);
    if (node->op == LT_OP_RMS_NORM_MUL_BACK)
        return norm_mul_back_supported(node, reason, reason_size);
    if (node->op != LT_OP_RMS_NORM && node->op != LT_OP_L2_NORM && !is_back(node->op)) {
        snprintf(reason, reason_size, "%s is not a norm", lt_op_name(node->op));
        return false;
    }
    int n_src = is_back(node->op) ? 2 : 1;
    for (int i = 0; i < n_src; i++) {
        if (!cu_check_source(node, i, CU_TYPES_F32, reason, reason_size))
            return false;
        if (!lt_same_shape(node->src[i], node)) {
            snprintf(reason, reason_size, "source %d is not of the result's shape", i);
            return false;
        }
    }
    const struct lt_tensor *w = node->op == LT_OP_RMS_NORM ? node->src[1] : NULL;
    if (!w)
        return cu_check_result_f32(node, reason, reason_size);
    if (w->type != LT_TYPE_F32 || !lt_is_contiguous(w) || w->ne[0] != node->ne[0] ||
        lt_nelements(w) != node->ne[0]) {
        snprintf(reason, reason_size, "the weight (source 1) is not contiguous f32 [ne0]");
        return false;
    }
    if (node->src[2] &&
        (!cu_check_source(node, 2, CU_TYPES_F32 | CU_TYPE_BIT(LT_TYPE_BF16), reason, reason_size) ||
         !lt_same_shape(node->src[2], node))) {
        snprintf(reason, reason_size,
                 "the gate (source 2) is not f32 or bf16 of the result's shape");
        return false;
    }
    if (!(CU_TYPES_FLOAT & CU_TYPE_BIT(node->type)) || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is %s %s, not contiguous f32, f16 or bf16",
                 lt_type_name(node->type), lt_layout_name(node));
        return false;
    }
    return true;
}

/* r = (S + eps)^(-1/2) of row (i1, i2, i3) of x; every thread of the team gets it */
template <bool WARP>
static __device__ double norm_factor(const struct cu_t &x, int64_t i1, int64_t i2, int64_t i3,
                                     bool rms, float eps, double *shared)
{
    using T = row_team<WARP>;
    double s = 0.0;
    for (int64_t i0 = T::lane(); i0 < x.ne[0]; i0 += T::size()) {
        double v = (double)cu_getf(x, i0, i1, i2, i3);
        s += v * v;
    }
    s = T::sum(s, shared);
    if (rms && x.ne[0] > 0)
        s /= (double)x.ne[0];
    return 1.0 / sqrt(s + (double)eps);
}

/* silu(z) as SWIGLU computes it */
static __device__ __forceinline__ float silu_of(float z)
{
    return z / (1.0f + expf(-z));
}

/* w (NULL: none) scales each normed element, then silu(z) with gated, the result stored as
 * out_type */
template <bool WARP>
static __global__ void norm_kernel(struct cu_t x, char *y, const float *w, struct cu_t z,
                                   bool gated, int out_type, bool rms, float eps)
{
    cu_pdl_enter();
    using T = row_team<WARP>;
    __shared__ double shared[32];
    const int64_t rows = x.ne[1] * x.ne[2] * x.ne[3];
    const int es = out_type == LT_TYPE_F32 ? 4 : 2;
    for (int64_t r = T::first(); r < rows; r += T::step()) {
        const int64_t i1 = r % x.ne[1], i2 = (r / x.ne[1]) % x.ne[2], i3 = r / (x.ne[1] * x.ne[2]);
        const float f = (float)norm_factor<WARP>(x, i1, i2, i3, rms, eps, shared);
        for (int64_t i0 = T::lane(); i0 < x.ne[0]; i0 += T::size()) {
            float v = __fmul_rn(cu_getf(x, i0, i1, i2, i3), f);
            if (w)
                v = __fmul_rn(v, w[i0]);
            if (gated)
                v = __fmul_rn(v, silu_of(cu_get(z, i0, i1, i2, i3)));
            cu_store(y + (r * x.ne[0] + i0) * es, out_type, v);
        }
    }
}

/* a block a row r: sum[r] = a + b, then out[r] = (sum * f) * w, f from sum's squares. A
 * decode step's rows are few and short (1,024), so the block is as wide as the row (up to
 * 1,024 threads) and each thread keeps its first ADD_NORM_KEEP sums in registers for the
 * second pass: at 256 threads each thread walked 4 dependent loads, then read its sums back */
#define ADD_NORM_KEEP 4
/* sum[i0] = a + b at (i0, r), returned */
static __device__ __forceinline__ float add_at(const struct cu_t &a, const struct cu_t &b,
                                               float *sum, int64_t i0, int64_t r)
{
    const float v = __fadd_rn(cu_getf(a, i0, r, 0, 0), cu_getf(b, i0, r, 0, 0));
    sum[i0] = v;
    return v;
}

static __global__ void __launch_bounds__(1024)
    add_norm_kernel(struct cu_t a, struct cu_t b, const float *w, float *y, float eps)
{
    cu_pdl_enter();
    __shared__ double shared[32];
    const int64_t n = a.ne[0], rows = a.ne[1], bd = blockDim.x, tail = ADD_NORM_KEEP * bd;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float *sum = y + r * n, *out = y + (rows + r) * n;
        float keep[ADD_NORM_KEEP];
        double s = 0.0;
#pragma unroll
        for (int k = 0; k < ADD_NORM_KEEP; k++) {
            const int64_t i0 = threadIdx.x + k * bd;
            keep[k] = i0 < n ? add_at(a, b, sum, i0, r) : 0.0f;
            s += (double)keep[k] * (double)keep[k];
        }
        for (int64_t i0 = threadIdx.x + tail; i0 < n; i0 += bd) {
            const float v = add_at(a, b, sum, i0, r);
            s += (double)v * (double)v;
        }
        s = cu_block_sum(s, shared);
        const float f = (float)(1.0 / sqrt(s / (double)n + (double)eps));
#pragma unroll /* constant indices: keep stays in registers */
        for (int k = 0; k < ADD_NORM_KEEP; k++) {
            const int64_t i0 = threadIdx.x + k * bd;
            if (i0 < n)
                out[i0] = __fmul_rn(__fmul_rn(keep[k], f), w[i0]);
        }
        for (int64_t i0 = threadIdx.x + tail; i0 < n; i0 += bd)
            out[i0] = __fmul_rn(__fmul_rn(sum[i0], f), w[i0]);
    }
}

template <bool WARP>
static __global__ void norm_back_kernel(struct cu_t g, struct cu_t x, float *dx, bool rms,
                                        float eps)
{
    cu_pdl_enter();
    using T = row_team<WARP>;
    __shared__ double shared[32];
    const int64_t rows = x.ne[1] * x.ne[2] * x.ne[3];
    for (int64_t r = T::first(); r < rows; r += T::step()) {
        const int64_t i1 = r % x.ne[1], i2 = (r / x.ne[1]) % x.ne[2], i3 = r / (x.ne[1] * x.ne[2]);
        const double f = norm_factor<WARP>(x, i1, i2, i3, rms, eps, shared);
        double dot = 0.0;
        for (int64_t i0 = T::lane(); i0 < x.ne[0]; i0 += T::size())
            dot += (double)cu_getf(g, i0, i1, i2, i3) * (double)cu_getf(x, i0, i1, i2, i3);
        dot = T::sum(dot, shared);
        if (rms && x.ne[0] > 0)
            dot /= (double)x.ne[0];
        const float fa = (float)f, fb = (float)(f * f * f * dot);
        for (int64_t i0 = T::lane(); i0 < x.ne[0]; i0 += T::size())
            dx[r * x.ne[0] + i0] = __fsub_rn(__fmul_rn(fa, cu_getf(g, i0, i1, i2, i3)),
                                             __fmul_rn(fb, cu_getf(x, i0, i1, i2, i3)));
    }
}

/* what RMS_NORM_MUL_BACK's kernels are handed */
struct nmb_args {
    struct cu_t g, x, z;
    const float *w;
    const float *c; /* dx's addend (contiguous, x's shape), or NULL */
    bool gated;
    float *dx, *dz, *dw;
    int64_t parts;
    float eps;
};

/* d = 1 + e^-z, so that silu(z) = z / d and sigmoid(z) = 1 / d; 1 without a gate */
static __device__ __forceinline__ float nmb_d(bool gated, float zv)
{
    return gated ? 1.0f + expf(-zv) : 1.0f;
}

/* h = g w, times s = silu(z) with a gate: dx's term, and the row's sum of h x */
static __device__ __forceinline__ float nmb_h(bool gated, float gv, float wv, float sv)
{
    const float gw = __fmul_rn(gv, wv);
    return gated ? __fmul_rn(gw, sv) : gw;
}

/* One element, given its g, x, w, z, d = nmb_d(z) and the row's fa = f and fb: sets dx (plus
 * the addend *c where c is given: c + dx, as ADD(c, dx) sums it) and dz, returns the row's
 * term of dw, g (x f) silu(z). The CPU's expressions (src/ops/norm.c), each product rounded;
 * every kernel of RMS_NORM_MUL_BACK computes its elements here. */
static __device__ __forceinline__ float nmb_out(bool gated, float gv, float xv, float wv, float zv,
                                                float d, float fa, float fb, const float *c,
                                                float *dx, float *dz)
{
    const float sv = gated ? zv / d : 1.0f, xf = __fmul_rn(xv, fa);
    const float dxv = __fsub_rn(__fmul_rn(fa, nmb_h(gated, gv, wv, sv)), __fmul_rn(fb, xv));
    *dx = c ? __fadd_rn(*c, dxv) : dxv;
    if (!gated)
        return __fmul_rn(gv, xf); /* times silu = 1: the same bits */
    const float sg = 1.0f / d;
    *dz = __fmul_rn(__fmul_rn(gv, __fmul_rn(xf, wv)),
                    __fmul_rn(sg, __fadd_rn(1.0f, __fmul_rn(zv, __fsub_rn(1.0f, sg)))));
    return __fmul_rn(__fmul_rn(gv, xf), sv);
}

/* the same, reading element i0 of row (i1, i2, i3) (flat row r) of strided sources */
static __device__ __forceinline__ float nmb_elem(const struct nmb_args &a, int64_t r, int64_t i0,
                                                 int64_t i1, int64_t i2, int64_t i3, float fa,
                                                 float fb)
{
    const int64_t at = r * a.x.ne[0] + i0;
    const float zv = a.gated ? cu_get(a.z, i0, i1, i2, i3) : 0.0f;
    return nmb_out(a.gated, cu_getf(a.g, i0, i1, i2, i3), cu_getf(a.x, i0, i1, i2, i3), a.w[i0], zv,
                   nmb_d(a.gated, zv), fa, fb, a.c ? a.c + at : nullptr, a.dx + at, a.dz + at);
}

/* The start of row r (flattened over dims 1..3) of t */
static __device__ __forceinline__ const char *row_at(const struct cu_t &t, int64_t i1, int64_t i2,
                                                     int64_t i3)
{
    return t.data + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

/* RMS_NORM_MUL_BACK, rows of at most 32 C: a warp a part of the rows, lane l holding columns
 * l + 32 k (k < C) of x, g, z and silu(z) in registers between the two sums and the stores,
 * and its columns' dw terms over the part's rows; it writes the part's row itself (no
 * barrier, a fixed order). */
template <int C, bool GATED>
static __global__ void __launch_bounds__(256) norm_mul_back_warp_kernel(struct nmb_args a)
{
    cu_pdl_enter();
    const int64_t n = a.x.ne[0], rows = a.x.ne[1] * a.x.ne[2] * a.x.ne[3];
    const int lane = (int)(threadIdx.x & 31);
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t p = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); p < a.parts;
         p += warps) {
        float acc[C];
#pragma unroll
        for (int k = 0; k < C; k++)
            acc[k] = 0.0f;
        for (int64_t r = p * rows / a.parts; r < (p + 1) * rows / a.parts; r++) {
            const int64_t i1 = r % a.x.ne[1], i2 = (r / a.x.ne[1]) % a.x.ne[2],
                          i3 = r / (a.x.ne[1] * a.x.ne[2]);
            const char *xr = row_at(a.x, i1, i2, i3), *gr = row_at(a.g, i1, i2, i3);
            const char *zr = GATED ? row_at(a.z, i1, i2, i3) : nullptr;
            float xv[C], gv[C], zv[C], dv[C];
            double s = 0.0, dot = 0.0;
#pragma unroll
            for (int k = 0; k < C; k++) {
                const int64_t i0 = lane + 32 * k;
                const bool in = i0 < n;
                xv[k] = in ? *(const float *)(xr + i0 * a.x.nb[0]) : 0.0f;
                gv[k] = in ? *(const float *)(gr + i0 * a.g.nb[0]) : 0.0f;
                zv[k] = GATED && in ? cu_load(zr + i0 * a.z.nb[0], a.z.type) : 0.0f;
                dv[k] = nmb_d(GATED, zv[k]);
                const float h =
                    in ? nmb_h(GATED, gv[k], a.w[i0], GATED ? zv[k] / dv[k] : 1.0f) : 0.0f;
                s += (double)xv[k] * (double)xv[k];
                dot += (double)h * (double)xv[k];
            }
            s = cu_warp_sum(s);
            dot = cu_warp_sum(dot);
            const double f = 1.0 / sqrt(s / (double)n + (double)a.eps);
            const float fa = (float)f, fb = (float)(f * f * f * (dot / (double)n));
#pragma unroll
            for (int k = 0; k < C; k++) {
                const int64_t i0 = lane + 32 * k;
                if (i0 < n)
                    acc[k] = __fadd_rn(acc[k], nmb_out(GATED, gv[k], xv[k], a.w[i0], zv[k], dv[k],
                                                       fa, fb, a.c ? a.c + r * n + i0 : nullptr,
                                                       a.dx + r * n + i0, a.dz + r * n + i0));
            }
        }
#pragma unroll
        for (int k = 0; k < C; k++) {
            const int64_t i0 = lane + 32 * k;
            if (i0 < n)
                a.dw[p * n + i0] = acc[k];
        }
    }
}

/* component j of v; j is a constant once unrolled, so v stays in registers */
static __device__ __forceinline__ float &f4_at(float4 &v, int j)
{
    return ((float *)&v)[j];
}

/* Blocks of 256 an SM for norm_mul_back_rows_kernel<V4, GATED>: the most whose share of
 * registers (64 a thread at 4 blocks, 85 at 3, 128 at 2) holds its values without spilling.
 * ptxas -v for sm_90 gave 58, 61, 64 and 128 registers ungated at V4 = 1, 2, 4 and 8, and
 * 64, 80, 122 and 206 gated. */
static constexpr int nmb_rows_blocks(int v4, bool gated)
{
    return gated ? (v4 == 1 ? 4 : v4 == 2 ? 3 : v4 == 4 ? 2 : 1) : (v4 <= 4 ? 4 : 2);
}

/* x's rows for norm_mul_back_rows_kernel, in floats: row r = (i1, i2, i3) starts at
 * i1 s1 + i2 s2 + i3 s3 (a contiguous x has s1 = n, s2 = n ne1, s3 = n ne1 ne2). x may be a
 * view whose rows are contiguous but whose sequences are apart, as the DeltaNet output's rows
 * of DELTA_NET's result are (180 us a node for its gated norm's gradients at 16 x 512 tokens
 * through the strided warp kernel, H100). */
struct nmb_rows_x {
    int64_t ne1, ne2, s1, s2, s3;
};

static __device__ __forceinline__ int64_t nmb_x_row(const struct nmb_rows_x &xs, int64_t r)
{
    const int64_t i1 = r % xs.ne1, i2 = (r / xs.ne1) % xs.ne2, i3 = r / (xs.ne1 * xs.ne2);
    return i1 * xs.s1 + i2 * xs.s2 + i3 * xs.s3;
}

/* RMS_NORM_MUL_BACK on contiguous rows (norm_mul_back_rows_fit): as the warp kernel, a warp
 * a part, but lane l holds float4s l + 32 k (k < V4) of a row of n <= 128 V4 floats,
 * addressed by one 64-bit offset a row and 32-bit ones within it, and the lanes' sums of
 * dw's terms over the part wait in shared memory, so registers hold x, g (and z) alone. The
 * warp kernel's 64-bit index arithmetic an element and divisions a row, with its sums in
 * registers, took 196 registers for rows of 1024: a block an SM, 210 us and 485 GB/s for
 * Qwen3.5-0.8B's hidden norms in a training step (Nsight Compute on an H100). */
template <int V4, bool GATED>
static __global__ void __launch_bounds__(256, nmb_rows_blocks(V4, GATED))
    norm_mul_back_rows_kernel(const float *__restrict__ g, const float *__restrict__ x,
                              const char *__restrict__ z, int z_type, const float *__restrict__ w,
                              const float *__restrict__ cadd, float *__restrict__ dx,
                              float *__restrict__ dz, float *__restrict__ dw, int n, int64_t rows,
                              int64_t parts, float eps, struct nmb_rows_x xs)
{
    __shared__ float4 dw_sums[8][32 * V4]; /* a warp's; each lane touches its own float4s */
    const int lane = (int)(threadIdx.x & 31), n4 = n / 4;
    const int64_t p = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const float4 *w4 = (const float4 *)w, zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 *sums = dw_sums[threadIdx.x >> 5] + lane; /* float4 c of the row is sums[32 k] */
    if (p >= parts)
        return;
#pragma unroll
    for (int k = 0; k < V4; k++)
        sums[32 * k] = zero;
    const int64_t end = (p + 1) * rows / parts;
    for (int64_t r = p * rows / parts; r < end; r++) {
        const int64_t row = r * n;
        const float4 *xr = (const float4 *)(x + nmb_x_row(xs, r)), *gr = (const float4 *)(g + row);
        /* the gate's row: F32 or BF16 (cu_load4: one 16- or 8-byte load a float4) */
        const char *zr = GATED ? z + row * (z_type == LT_TYPE_F32 ? 4 : 2) : nullptr;
        float4 xv[V4], gv[V4], zv[V4];
#pragma unroll
        for (int k = 0; k < V4; k++) {
            const int c = lane + 32 * k;
            xv[k] = c < n4 ? xr[c] : zero;
            gv[k] = c < n4 ? gr[c] : zero;
            zv[k] = GATED && c < n4 ? cu_load4(zr, z_type, (size_t)c) : zero;
        }
        double s = 0.0, dot = 0.0;
#pragma unroll
        for (int k = 0; k < V4; k++) {
            const int c = lane + 32 * k;
            float4 wv = c < n4 ? __ldg(w4 + c) : zero;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float xj = f4_at(xv[k], j), zj = f4_at(zv[k], j), d = nmb_d(GATED, zj);
                const float h = nmb_h(GATED, f4_at(gv[k], j), f4_at(wv, j), GATED ? zj / d : 1.0f);
                s += (double)xj * (double)xj;
                dot += (double)h * (double)xj;
            }
        }
        s = cu_warp_sum(s);
        dot = cu_warp_sum(dot);
        const double f = 1.0 / sqrt(s / (double)n + (double)eps);
        const float fa = (float)f, fb = (float)(f * f * f * (dot / (double)n));
#pragma unroll
        for (int k = 0; k < V4; k++) {
            /* predicated, not a branch past a lane's last float4: the loads of w would wait
             * one by one */
            const int c = lane + 32 * k;
            const bool in = c < n4;
            float4 wv = in ? __ldg(w4 + c) : zero, sum = sums[32 * k], dx4, dz4;
            float4 cv = in && cadd ? ((const float4 *)(cadd + row))[c] : zero; /* the addend */
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float zj = f4_at(zv[k], j);
                f4_at(sum, j) =
                    __fadd_rn(f4_at(sum, j),
                              nmb_out(GATED, f4_at(gv[k], j), f4_at(xv[k], j), f4_at(wv, j), zj,
                                      nmb_d(GATED, zj), fa, fb, cadd ? &f4_at(cv, j) : nullptr,
                                      &f4_at(dx4, j), &f4_at(dz4, j)));
            }
            sums[32 * k] = sum;
            if (in)
                ((float4 *)(dx + row))[c] = dx4;
            if (GATED && in)
                ((float4 *)(dz + row))[c] = dz4;
        }
    }
#pragma unroll
    for (int k = 0; k < V4; k++) {
        const int c = lane + 32 * k;
        if (c < n4)
            ((float4 *)(dw + p * n))[c] = sums[32 * k];
    }
}

/* Rows longer than 1,024: a block a part, a row at a time; each thread keeps its first
 * NMB_KEEP columns' dw terms in registers, the rest in the partial row itself (which only
 * that thread touches) */
#define NMB_KEEP 8
static __global__ void __launch_bounds__(256) norm_mul_back_block_kernel(struct nmb_args a)
{
    cu_pdl_enter();
    using T = row_team<false>;
    __shared__ double shared[32];
    const int64_t n = a.x.ne[0], rows = a.x.ne[1] * a.x.ne[2] * a.x.ne[3];
    for (int64_t p = blockIdx.x; p < a.parts; p += gridDim.x) {
        float *dwp = a.dw + p * n;
        float acc[NMB_KEEP];
#pragma unroll
        for (int k = 0; k < NMB_KEEP; k++)
            acc[k] = 0.0f;
        for (int64_t i0 = T::lane() + NMB_KEEP * T::size(); i0 < n; i0 += T::size())
            dwp[i0] = 0.0f;
        for (int64_t r = p * rows / a.parts; r < (p + 1) * rows / a.parts; r++) {
            const int64_t i1 = r % a.x.ne[1], i2 = (r / a.x.ne[1]) % a.x.ne[2],
                          i3 = r / (a.x.ne[1] * a.x.ne[2]);
            double s = 0.0, dot = 0.0;
            for (int64_t i0 = T::lane(); i0 < n; i0 += T::size()) {
                const float xv = cu_getf(a.x, i0, i1, i2, i3), gv = cu_getf(a.g, i0, i1, i2, i3);
                const float sv = a.gated ? silu_of(cu_get(a.z, i0, i1, i2, i3)) : 1.0f;
                s += (double)xv * (double)xv;
                dot += (double)nmb_h(a.gated, gv, a.w[i0], sv) * (double)xv;
            }
            s = T::sum(s, shared);
            dot = T::sum(dot, shared);
            const double f = 1.0 / sqrt(s / (double)n + (double)a.eps);
            const float fa = (float)f, fb = (float)(f * f * f * (dot / (double)n));
#pragma unroll
            for (int k = 0; k < NMB_KEEP; k++) {
                const int64_t i0 = T::lane() + (int64_t)k * T::size();
                if (i0 < n)
                    acc[k] = __fadd_rn(acc[k], nmb_elem(a, r, i0, i1, i2, i3, fa, fb));
            }
            for (int64_t i0 = T::lane() + NMB_KEEP * T::size(); i0 < n; i0 += T::size())
                dwp[i0] = __fadd_rn(dwp[i0], nmb_elem(a, r, i0, i1, i2, i3, fa, fb));
        }
#pragma unroll
        for (int k = 0; k < NMB_KEEP; k++) {
            const int64_t i0 = T::lane() + (int64_t)k * T::size();
            if (i0 < n)
                dwp[i0] = acc[k];
        }
    }
}

/* f(C) with C, the columns a lane for rows of n <= 1,024 a warp, as a compile-time constant
 * (std::integral_constant): one place picks the instance of the warp kernels */
template <typename F> static void lane_columns(int64_t n, F f)
{
    if (n <= 128)
        f(std::integral_constant<int, 4>{});
    else if (n <= 256)
        f(std::integral_constant<int, 8>{});
    else if (n <= 512)
        f(std::integral_constant<int, 16>{});
    else
        f(std::integral_constant<int, 32>{});
}

template <int C> static void norm_mul_back_warps(struct cu_ctx *c, const struct nmb_args &a)
{
    const unsigned blocks = (unsigned)cu_blocks(a.parts, 8); /* 8 warps a block, a part each */
    if (a.gated)
        cu_launch_pdl(c, norm_mul_back_warp_kernel<C, true>, blocks, 256, 0, a);
    else
        cu_launch_pdl(c, norm_mul_back_warp_kernel<C, false>, blocks, 256, 0, a);
}

/* Whether norm_mul_back_rows_kernel takes the node: g (and z) contiguous, x's rows
 * contiguous and each on 16 bytes (nmb_rows_x), rows of at most 1024 floats, a multiple of
 * 4, and every buffer on 16 bytes (float4s). A choice among this file's kernels, not a
 * claim: cu_norm_supported still takes any strides, which the warp and block kernels run. */
static bool norm_mul_back_rows_fit(const struct lt_tensor *node)
{
    const struct lt_tensor *x = node->src[1];
    const int64_t n = x->ne[0];
    if (n % 4 != 0 || n > 1024 || (uintptr_t)node->data % 16 != 0)
        return false;
    if (!cu_rows16(cu_view(x)))
        return false;
    for (int i = 0; i < 5; i++) { /* g, w, z and the addend c */
        const struct lt_tensor *t = node->src[i];
        if (i != 1 && t && (!lt_is_contiguous(t) || (uintptr_t)t->data % 16 != 0))
            return false;
    }
    return true;
}

template <int V4> static void norm_mul_back_rows(struct cu_ctx *c, const struct nmb_args &a)
{
    /* 8 warps a block, a part each, and no grid stride: rows of 4 floats or more make at most
     * LT_NORM_DW_ELEMENTS / 4 parts, 2^17 blocks */
    const unsigned blocks = (unsigned)((a.parts + 7) / 8);
    const float *g = (const float *)a.g.data, *x = (const float *)a.x.data;
    const char *z = a.z.data;
    const int n = (int)a.x.ne[0];
    const int64_t rows = a.x.ne[1] * a.x.ne[2] * a.x.ne[3];
    const struct nmb_rows_x xs = {a.x.ne[1] > 0 ? a.x.ne[1] : 1, a.x.ne[2] > 0 ? a.x.ne[2] : 1,
                                  a.x.nb[1] / 4, a.x.nb[2] / 4, a.x.nb[3] / 4};
    if (a.gated)
        norm_mul_back_rows_kernel<V4, true><<<blocks, 256, 0, c->stream>>>(
            g, x, z, (int)a.z.type, a.w, a.c, a.dx, a.dz, a.dw, n, rows, a.parts, a.eps, xs);
    else
        norm_mul_back_rows_kernel<V4, false><<<blocks, 256, 0, c->stream>>>(
            g, x, z, (int)a.z.type, a.w, a.c, a.dx, a.dz, a.dw, n, rows, a.parts, a.eps, xs);
}

static lt_status norm_mul_back_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    const struct lt_tensor *x = node->src[1];
    const int64_t n = x->ne[0], rows = lt_nrows(x);
    struct nmb_args a;
    a.g = cu_view(node->src[0]);
    a.x = cu_view(x);
    a.w = (const float *)node->src[2]->data;
    a.c = node->src[4] ? (const float *)node->src[4]->data : NULL;
    a.gated = node->src[3] != NULL;
    a.z = a.gated ? cu_view(node->src[3]) : a.x;
    a.dx = (float *)node->data;
    a.dz = a.dx + rows * n;
    a.dw = a.dx + (a.gated ? 2 : 1) * rows * n;
    a.parts = lt_get_param_i32(node, 1);
    a.eps = lt_get_param_f32(node, 0);
    if (a.parts <= 0 || n == 0)
        return LT_OK;
    if (norm_mul_back_rows_fit(node)) /* C columns a lane are C / 4 float4s */
        lane_columns(n, [&](auto k) { norm_mul_back_rows<decltype(k)::value / 4>(c, a); });
    else if (n <= 1024)
        lane_columns(n, [&](auto k) { norm_mul_back_warps<decltype(k)::value>(c, a); });
    else {
        const int64_t t = (n + 31) / 32 * 32;
        const int threads = t > 256 ? 256 : (int)t;
        const unsigned blocks = a.parts < 65535 ? (unsigned)a.parts : 65535u;
        cu_launch_pdl(c, norm_mul_back_block_kernel, blocks, threads, 0, a);
    }
    return cu_launched("norm_mul_back");
}

/* RMS_NORM or L2_NORM without a weight (BACK false), or their backward (BACK true), on
 * contiguous rows (norm_rows_fit): a warp a row, lane l holding float4s l + 32 k (k < V4)
 * of x (and g) in registers between the sums and the stores. norm_kernel and
 * norm_back_kernel read each element through cu_getf twice (three times backward), with a
 * division a row: 111 and 115 us for Qwen3.5-0.8B's q and k norms of 16 x 512 tokens
 * (rows of 128; 64 MiB a tensor), under half of the device's bandwidth (H100). Values,
 * sums and roundings are theirs. */
template <int V4, bool BACK>
static __global__ void __launch_bounds__(256)
    norm_rows_kernel(const float *__restrict__ x, const float *__restrict__ g,
                     float *__restrict__ y, int n, int64_t rows, bool rms, float eps)
{
    cu_pdl_enter();
    const int lane = (int)(threadIdx.x & 31), n4 = n / 4;
    const int64_t r = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 *xr = (const float4 *)(x + r * n), *gr = (const float4 *)(g + r * n);
    float4 xv[V4], gv[V4];
    double s = 0.0, dot = 0.0;
#pragma unroll
    for (int k = 0; k < V4; k++) {
        const int c = lane + 32 * k;
        xv[k] = c < n4 ? xr[c] : zero;
        gv[k] = BACK && c < n4 ? gr[c] : zero;
    }
#pragma unroll
    for (int k = 0; k < V4; k++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const double xj = (double)f4_at(xv[k], j);
            s += xj * xj;
            if (BACK)
                dot += (double)f4_at(gv[k], j) * xj;
        }
    }
    s = cu_warp_sum(s);
    if (rms)
        s /= (double)n;
    const double f = 1.0 / sqrt(s + (double)eps);
    float fa = (float)f, fb = 0.0f;
    if (BACK) {
        dot = cu_warp_sum(dot);
        if (rms)
            dot /= (double)n;
        fb = (float)(f * f * f * dot);
    }
    float4 *yr = (float4 *)(y + r * n);
#pragma unroll
    for (int k = 0; k < V4; k++) {
        const int c = lane + 32 * k;
        float4 o;
#pragma unroll
        for (int j = 0; j < 4; j++)
            f4_at(o, j) =
                BACK ? __fsub_rn(__fmul_rn(fa, f4_at(gv[k], j)), __fmul_rn(fb, f4_at(xv[k], j)))
                     : __fmul_rn(f4_at(xv[k], j), fa);
        if (c < n4)
            yr[c] = o;
    }
}

/* Whether norm_rows_kernel takes a plain norm or its backward: x (and g) and the result
 * contiguous F32 on 16 bytes, rows of at most 1024 floats, a multiple of 4. A choice among
 * this file's kernels, not a claim (cu_norm_supported takes any strides). */
static bool norm_rows_fit(const struct lt_tensor *node)
{
    const int64_t n = node->ne[0];
    if (n % 4 != 0 || n > 1024 || node->type != LT_TYPE_F32 || !lt_is_contiguous(node) ||
        (uintptr_t)node->data % 16 != 0)
        return false;
    if (node->op == LT_OP_RMS_NORM && (node->src[1] || node->src[2]))
        return false;
    for (int i = 0; i < (is_back(node->op) ? 2 : 1); i++) {
        const struct lt_tensor *t = node->src[i];
        if (!lt_is_contiguous(t) || (uintptr_t)t->data % 16 != 0)
            return false;
    }
    return true;
}

template <int V4> static void norm_rows(struct cu_ctx *c, const struct lt_tensor *node, bool rms)
{
    const bool back = is_back(node->op);
    const int64_t rows = lt_nrows(node);
    const unsigned blocks = (unsigned)((rows + 7) / 8); /* 8 warps, 8 rows, a block */
    const float *x = (const float *)node->src[back ? 1 : 0]->data,
                *g = back ? (const float *)node->src[0]->data : nullptr;
    const float eps = lt_get_param_f32(node, 0);
    if (back)
        cu_launch_pdl(c, norm_rows_kernel<V4, true>, blocks, 256, 0, x, g, (float *)node->data,
                      (int)node->ne[0], rows, rms, eps);
    else
        cu_launch_pdl(c, norm_rows_kernel<V4, false>, blocks, 256, 0, x, g, (float *)node->data,
                      (int)node->ne[0], rows, rms, eps);
}

/* RMS_NORM with a weight (and gate), rows of at most 32 C: a warp a row, its values kept in
 * registers between the sum and the stores (norm_kernel reads them twice) */
template <int C, bool GATED>
static __global__ void __launch_bounds__(256)
    norm_mul_warp_kernel(struct cu_t x, const float *w, struct cu_t z, char *y, int out_type,
                         float eps)
{
    cu_pdl_enter();
    const int64_t n = x.ne[0], rows = x.ne[1] * x.ne[2] * x.ne[3];
    const int lane = (int)(threadIdx.x & 31), es = out_type == LT_TYPE_F32 ? 4 : 2;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
         r += warps) {
        const int64_t i1 = r % x.ne[1], i2 = (r / x.ne[1]) % x.ne[2], i3 = r / (x.ne[1] * x.ne[2]);
        const char *xr = row_at(x, i1, i2, i3), *zr = GATED ? row_at(z, i1, i2, i3) : nullptr;
        float xv[C], zv[C];
        double s = 0.0;
#pragma unroll
        for (int k = 0; k < C; k++) {
            const int64_t i0 = lane + 32 * k;
            xv[k] = i0 < n ? *(const float *)(xr + i0 * x.nb[0]) : 0.0f;
            zv[k] = GATED && i0 < n ? cu_load(zr + i0 * z.nb[0], z.type) : 0.0f;
            s += (double)xv[k] * (double)xv[k];
        }
        s = cu_warp_sum(s);
        const float f = (float)(1.0 / sqrt(s / (double)n + (double)eps));
#pragma unroll
        for (int k = 0; k < C; k++) {
            const int64_t i0 = lane + 32 * k;
            if (i0 >= n)
                continue;
            float v = __fmul_rn(__fmul_rn(xv[k], f), w[i0]);
            if (GATED)
                v = __fmul_rn(v, silu_of(zv[k]));
            cu_store(y + (r * n + i0) * es, out_type, v);
        }
    }
}

template <int C> static void norm_mul_warps(struct cu_ctx *c, const struct lt_tensor *node)
{
    const struct lt_tensor *z = node->src[2];
    const struct cu_t xv = cu_view(node->src[0]), zv = z ? cu_view(z) : xv;
    const unsigned blocks = (unsigned)cu_blocks(lt_nrows(node), 8);
    const float *w = (const float *)node->src[1]->data;
    const float eps = lt_get_param_f32(node, 0);
    if (z)
        cu_launch_pdl(c, norm_mul_warp_kernel<C, true>, blocks, 256, 0, xv, w, zv,
                      (char *)node->data, (int)node->type, eps);
    else
        cu_launch_pdl(c, norm_mul_warp_kernel<C, false>, blocks, 256, 0, xv, w, zv,
                      (char *)node->data, (int)node->type, eps);
}

lt_status cu_norm_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_norm_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const int64_t rows = lt_nrows(node);
    if (rows == 0 || node->ne[0] == 0)
        return LT_OK;
    if (node->op == LT_OP_RMS_NORM_MUL_BACK)
        return norm_mul_back_compute(c, node);
    const bool rms = node->op == LT_OP_RMS_NORM || node->op == LT_OP_RMS_NORM_BACK;
    const float eps = lt_get_param_f32(node, 0);
    int64_t t = (node->ne[0] + 31) / 32 * 32;
    const int threads = t > 256 ? 256 : (int)t;
    if (node->op == LT_OP_ADD_RMS_NORM) {
        const int wide = t > 1024 ? 1024 : (int)t;
        cu_launch_pdl(c, add_norm_kernel, cu_blocks(node->ne[1], 1), wide, 0, cu_view(node->src[0]),
                      cu_view(node->src[1]), (const float *)node->src[2]->data, (float *)node->data,
                      eps);
        return cu_launched("add_norm");
    }
    const bool warp = cu_warp_rows(node->ne[0], rows);
    const unsigned warp_blocks = cu_blocks(rows, 8); /* 8 warps, 8 rows, a block */
    if (node->op == LT_OP_RMS_NORM && node->src[1] && warp) {
        lane_columns(node->ne[0], [&](auto k) { norm_mul_warps<decltype(k)::value>(c, node); });
        return cu_launched("norm_mul");
    }
    if (warp && rows / 8 < 0x7fffffff && norm_rows_fit(node)) { /* C columns: C / 4 float4s */
        lane_columns(node->ne[0], [&](auto k) { norm_rows<decltype(k)::value / 4>(c, node, rms); });
        return cu_launched(is_back(node->op) ? "norm_back_rows" : "norm_rows");
    }
    if (!is_back(node->op)) {
        const struct lt_tensor *w = node->op == LT_OP_RMS_NORM ? node->src[1] : NULL;
        const struct lt_tensor *z = node->op == LT_OP_RMS_NORM ? node->src[2] : NULL;
        const struct cu_t xv = cu_view(node->src[0]), zv = z ? cu_view(z) : xv;
        const float *wd = w ? (const float *)w->data : NULL;
        if (warp)
            cu_launch_pdl(c, norm_kernel<true>, warp_blocks, 256, 0, xv, (char *)node->data, wd, zv,
                          z != NULL, (int)node->type, rms, eps);
        else
            cu_launch_pdl(c, norm_kernel<false>, cu_blocks(rows, 1), threads, 0, xv,
                          (char *)node->data, wd, zv, z != NULL, (int)node->type, rms, eps);
        return cu_launched("norm");
    }
    if (warp)
        cu_launch_pdl(c, norm_back_kernel<true>, warp_blocks, 256, 0, cu_view(node->src[0]),
                      cu_view(node->src[1]), (float *)node->data, rms, eps);
    else
        cu_launch_pdl(c, norm_back_kernel<false>, cu_blocks(rows, 1), threads, 0,
                      cu_view(node->src[0]), cu_view(node->src[1]), (float *)node->data, rms, eps);
    return cu_launched("norm_back");
}

const struct cu_family cu_family_norm = {"norm", norm_ops, CU_COUNT(norm_ops),
                                             cu_norm_supported, cu_norm_compute};
