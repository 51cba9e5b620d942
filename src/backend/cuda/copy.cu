/* copy.cu: the device kernels of src/ops/copy.c: cont, cpy, concat, repeat, get_rows,
 * set_rows, and the backward helpers acc, repeat_back and get_rows_back.
 *
 * Sources may have any strides and any type the device can read (float types, I32 and the
 * quantised types of quant.cuh, dequantised element by element); results other than
 * cont/cpy's are contiguous F32. cont/cpy copy element f of the source (flattened, i0
 * fastest) to element f of the destination, which is the CPU's row-by-row order whenever
 * the rows have one length; same-type copies move bytes (whole blocks for quantised
 * types), others convert through float into F32, F16, BF16 or I32.
 *
 * Two sums differ from the CPU in order only: get_rows_back adds repeated ids with atomics,
 * and acc adds overlapping windows with atomics; the CPU adds both in a fixed order. */
#include <stdio.h>

#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/quant.cuh"
#include "lathe/ops.h"

static const enum lt_op copy_ops[] = {LT_OP_CONT,   LT_OP_CPY,         LT_OP_CONCAT,
                                      LT_OP_REPEAT, LT_OP_GET_ROWS,    LT_OP_ACC,
                                      LT_OP_REPEAT_BACK, LT_OP_GET_ROWS_BACK, LT_OP_SET_ROWS};

/* Same-type copies move bytes of any type lathe lays out; conversions need a device reader
 * and a device writer. */
#define COPY_TYPES_ANY                                                                             \
    (CU_TYPES_READABLE | CU_TYPE_BIT(LT_TYPE_I8) | CU_TYPE_BIT(LT_TYPE_I16) |                      \
     CU_TYPE_BIT(LT_TYPE_I64) | CU_TYPE_BIT(LT_TYPE_F64))
#define COPY_TYPES_WRITABLE (CU_TYPES_FLOAT | CU_TYPES_I32)

static size_t get_param_size(const struct lt_tensor *t, int i)
{
    uint64_t lo = (uint32_t)t->op_params[i], hi = (uint32_t)t->op_params[i + 1];
    return (size_t)(lo | hi << 32);
}

/* ---- preconditions ---- */

static bool cpy_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *a = node->src[0];
    if (!a) {
        snprintf(reason, reason_size, "source 0 is missing");
        return false;
    }
    const struct lt_type_traits *ta = lt_type_traits(a->type), *td = lt_type_traits(node->type);
    if (!ta || !td) {
        snprintf(reason, reason_size, "unknown type");
        return false;
    }
    if (lt_nelements(a) != lt_nelements(node)) {
        snprintf(reason, reason_size, "source 0 has %lld elements, the result %lld",
                 (long long)lt_nelements(a), (long long)lt_nelements(node));
        return false;
    }
    const bool same = a->type == node->type;
    if (!cu_check_source(node, 0, same ? COPY_TYPES_ANY : CU_TYPES_READABLE, reason, reason_size))
        return false;
    if (!same && !(COPY_TYPES_WRITABLE & CU_TYPE_BIT(node->type))) {
        snprintf(reason, reason_size, "the device does not write %s", td->name);
        return false;
    }
    if ((ta->is_quantized || td->is_quantized) && a->ne[0] != node->ne[0]) {
        snprintf(reason, reason_size, "rows of %lld and %lld elements, and a type is quantised",
                 (long long)a->ne[0], (long long)node->ne[0]);
        return false;
    }
    /* the destination: whole elements (quantised: unsplit blocks) */
    bool ok = td->is_quantized ? node->nb[0] == td->type_size
                               : node->view_offs % td->type_size == 0;
    for (int k = 0; k < LT_MAX_DIMS && !td->is_quantized; k++)
        ok = ok && (node->ne[k] <= 1 || node->nb[k] % td->type_size == 0);
    if (!ok) {
        snprintf(reason, reason_size, "the destination (%s) is not aligned to its elements",
                 lt_layout_name(node));
        return false;
    }
    if (node->op == LT_OP_CONT && !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is %s", lt_layout_name(node));
        return false;
    }
    return true;
}

static bool shapes_concat_ok(const struct lt_tensor *node)
{
    int dim = lt_get_param_i32(node, 0);
    if (dim < 0 || dim >= LT_MAX_DIMS)
        return false;
    for (int k = 0; k < LT_MAX_DIMS; k++) {
        int64_t want = node->src[0]->ne[k] + (k == dim ? node->src[1]->ne[k] : 0);
        if (node->ne[k] != want || (k != dim && node->src[0]->ne[k] != node->src[1]->ne[k]))
            return false;
    }
    return true;
}

static bool acc_window_ok(const struct lt_tensor *node)
{
    const struct lt_tensor *b = node->src[1];
    size_t nb1 = get_param_size(node, 0), nb2 = get_param_size(node, 2),
           nb3 = get_param_size(node, 4), offset = get_param_size(node, 6);
    if (lt_nelements(b) == 0)
        return true;
    if (nb1 % 4 || nb2 % 4 || nb3 % 4 || offset % 4)
        return false;
    size_t end = offset + (size_t)b->ne[0] * 4 + (size_t)(b->ne[1] - 1) * nb1 +
                 (size_t)(b->ne[2] - 1) * nb2 + (size_t)(b->ne[3] - 1) * nb3;
    return end <= (size_t)lt_nelements(node) * 4;
}

/* A half result of CONCAT: along dim 0, both sources of its type, 2-d (one plane), each
 * source's elements adjacent (rows may lie apart), the result contiguous: concat_rows_kernel */
static bool concat_rows_ok(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    const bool ok = lt_get_param_i32(node, 0) == 0 && a->type == node->type &&
                    b->type == node->type && lt_is_contiguous(node) && node->ne[2] == 1 &&
                    node->ne[3] == 1 && a->nb[0] == 2 && b->nb[0] == 2 && a->nb[1] % 2 == 0 &&
                    b->nb[1] % 2 == 0 && a->ne[1] == node->ne[1] && b->ne[1] == node->ne[1] &&
                    a->ne[0] + b->ne[0] == node->ne[0];
    if (!ok)
        snprintf(reason, reason_size,
                 "a %s result takes a concat along dim 0 of two 2-d %s sources with adjacent "
                 "elements",
                 lt_type_name(node->type), lt_type_name(node->type));
    return ok;
}

bool cu_copy_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    switch (node->op) {
    case LT_OP_CONT:
    case LT_OP_CPY: return cpy_supported(node, reason, reason_size);
    case LT_OP_CONCAT:
        if (!cu_check_source(node, 0, CU_TYPES_READABLE, reason, reason_size) ||
            !cu_check_source(node, 1, CU_TYPES_READABLE, reason, reason_size))
            return false;
        if (node->type == LT_TYPE_F16 || node->type == LT_TYPE_BF16)
            return concat_rows_ok(node, reason, reason_size);
        if (!cu_check_result_f32(node, reason, reason_size))
            return false;
        if (!shapes_concat_ok(node)) {
            snprintf(reason, reason_size, "the result's shape does not match its sources");
            return false;
        }
        return true;
    case LT_OP_REPEAT:
        if (!cu_check_source(node, 0, CU_TYPES_READABLE, reason, reason_size) ||
            !cu_check_result_f32(node, reason, reason_size))
            return false;
        if (!lt_can_repeat(node->src[0], node)) {
            snprintf(reason, reason_size, "source 0 does not tile the result");
            return false;
        }
        return true;
    case LT_OP_REPEAT_BACK:
        if (!cu_check_source(node, 0, CU_TYPES_READABLE, reason, reason_size) ||
            !cu_check_result_f32(node, reason, reason_size))
            return false;
        if (!lt_can_repeat(node, node->src[0])) {
            snprintf(reason, reason_size, "the result does not tile source 0");
            return false;
        }
        return true;
    case LT_OP_GET_ROWS: {
        if (!cu_check_source(node, 0, CU_TYPES_READABLE, reason, reason_size) ||
            !cu_check_source(node, 1, CU_TYPES_I32, reason, reason_size) ||
            !cu_check_result_f32(node, reason, reason_size))
            return false;
        const struct lt_tensor *a = node->src[0], *ids = node->src[1];
        if (node->ne[0] != a->ne[0] || node->ne[1] != ids->ne[0] || node->ne[2] != ids->ne[1] ||
            node->ne[3] != ids->ne[2] || a->ne[2] != ids->ne[1] || a->ne[3] != ids->ne[2]) {
            snprintf(reason, reason_size, "the result's shape does not match its sources");
            return false;
        }
        return true;
    }
    case LT_OP_GET_ROWS_BACK: {
        if (!cu_check_source(node, 0, CU_TYPES_READABLE, reason, reason_size) ||
            !cu_check_source(node, 1, CU_TYPES_I32, reason, reason_size) ||
            !cu_check_result_f32(node, reason, reason_size))
            return false;
        if (!lt_get_rows_back_fits(node)) {
            snprintf(reason, reason_size,
                     "the result's shape does not match its sources, or it adds in place into "
                     "a tensor other than contiguous f32 storage of its result");
            return false;
        }
        return true;
    }
    case LT_OP_SET_ROWS: {
        if (!cu_check_source(node, 0, CU_TYPES_READABLE, reason, reason_size) ||
            !cu_check_source(node, 2, CU_TYPES_I32, reason, reason_size))
            return false;
        const struct lt_tensor *src = node->src[0], *ids = node->src[2];
        bool ok = src->ne[0] * src->ne[1] == node->ne[0] && src->ne[2] == ids->ne[0] &&
                  src->ne[3] == 1 && node->ne[2] == 1 && node->ne[3] == 1 && ids->ne[1] == 1 &&
                  ids->ne[2] == 1 && ids->ne[3] == 1;
        if (!ok) {
            snprintf(reason, reason_size, "the slices are not [a, b, k] into a 2-D destination");
            return false;
        }
        if (!(CU_TYPES_FLOAT & CU_TYPE_BIT(node->type)) ||
            node->nb[0] != lt_type_traits(node->type)->type_size ||
            node->view_offs % lt_type_traits(node->type)->type_size ||
            node->nb[1] % lt_type_traits(node->type)->type_size) {
            snprintf(reason, reason_size, "the destination is %s %s, not f32/f16/bf16 rows",
                     lt_type_name(node->type), lt_layout_name(node));
            return false;
        }
        return true;
    }
    case LT_OP_ACC:
        if (!cu_check_source(node, 0, CU_TYPES_READABLE, reason, reason_size) ||
            !cu_check_source(node, 1, CU_TYPES_READABLE, reason, reason_size) ||
            !cu_check_result_f32(node, reason, reason_size))
            return false;
        if (!lt_same_shape(node, node->src[0])) {
            snprintf(reason, reason_size, "source 0 differs in shape from the result");
            return false;
        }
        if (!acc_window_ok(node)) {
            snprintf(reason, reason_size, "the window of source 1 is not inside the result");
            return false;
        }
        return true;
    default:
        snprintf(reason, reason_size, "%s is not a copy op", lt_op_name(node->op));
        return false;
    }
}

/* ---- kernels ---- */

/* a and d in units of `es` bytes (elements, or blocks for quantised types) */
static __global__ void copy_same_kernel(struct cu_t a, struct cu_t d, int64_t n, int es)
{
    cu_pdl_enter();
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3, j0, j1, j2, j3;
        cu_unravel(f, a.ne, i0, i1, i2, i3);
        cu_unravel(f, d.ne, j0, j1, j2, j3);
        const char *s = cu_ptr(a, i0, i1, i2, i3);
        char *t = (char *)cu_ptr(d, j0, j1, j2, j3);
        switch (es) {
        case 1: *t = *s; break;
        case 2: *(uint16_t *)t = *(const uint16_t *)s; break;
        case 4: *(uint32_t *)t = *(const uint32_t *)s; break;
        case 8: *(uint64_t *)t = *(const uint64_t *)s; break;
        default:
            for (int k = 0; k < es; k++)
                t[k] = s[k];
        }
    }
}

static __global__ void copy_convert_kernel(struct cu_t a, struct cu_t d, int64_t n)
{
    cu_pdl_enter();
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3, j0, j1, j2, j3;
        cu_unravel(f, a.ne, i0, i1, i2, i3);
        cu_unravel(f, d.ne, j0, j1, j2, j3);
        cu_store((char *)cu_ptr(d, j0, j1, j2, j3), d.type, cu_read(a, i0, i1, i2, i3));
    }
}

/* contiguous to contiguous, element f to element f (TA, TD: F32, F16 or BF16) */
template <int TA, int TD>
static __global__ void convert_flat_kernel(const char *a, char *d, int64_t n)
{
    cu_pdl_enter();
    const int ea = TA == LT_TYPE_F32 ? 4 : 2, ed = TD == LT_TYPE_F32 ? 4 : 2;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count())
        cu_store(d + f * ed, TD, cu_load(a + f * ea, TA));
}

/* F32 to F16 or BF16, contiguous, a float4 a thread (n4 = elements / 4; the source 16-byte
 * aligned, the destination 8). An element a thread held a training step's BF16 roundings of
 * its gradients (the products' operands) near 2.1 TB/s. */
static __global__ void f32_flat4_kernel(const float4 *a, char *d, uint32_t n4, int type)
{
    cu_pdl_enter();
    for (uint32_t f = blockIdx.x * blockDim.x + threadIdx.x; f < n4; f += gridDim.x * blockDim.x)
        cu_store4(d, type, f, a[f]);
}

lt_status cu_convert_f32_flat(struct cu_ctx *c, const float *src, char *dst, int64_t n, int type,
                              const char *what)
{
    if (n % 4 == 0 && n / 4 <= 0xffffffff && cu_aligned(src, 16) && cu_aligned(dst, 8))
        cu_launch_pdl(c, f32_flat4_kernel, cu_blocks(n / 4, 256), 256, 0, (const float4 *)src, dst,
                      (uint32_t)(n / 4), type);
    else if (type == LT_TYPE_BF16)
        cu_launch_pdl(c, convert_flat_kernel<LT_TYPE_F32, LT_TYPE_BF16>, cu_blocks(n, 256), 256, 0,
                      (const char *)src, dst, n);
    else
        cu_launch_pdl(c, convert_flat_kernel<LT_TYPE_F32, LT_TYPE_F16>, cu_blocks(n, 256), 256, 0,
                      (const char *)src, dst, n);
    return cu_launched(what);
}

/* f(ta, td) with each of the float types ta, td (F32, F16 or BF16) as a compile-time
 * constant (std::integral_constant): one place picks the instance of a kernel templated on
 * its source and destination types */
template <typename F> static void float_types(int ta, int td, F f)
{
    auto with_td = [&](auto a) {
        if (td == LT_TYPE_BF16)
            f(a, std::integral_constant<int, LT_TYPE_BF16>{});
        else if (td == LT_TYPE_F16)
            f(a, std::integral_constant<int, LT_TYPE_F16>{});
        else
            f(a, std::integral_constant<int, LT_TYPE_F32>{});
    };
    if (ta == LT_TYPE_BF16)
        with_td(std::integral_constant<int, LT_TYPE_BF16>{});
    else if (ta == LT_TYPE_F16)
        with_td(std::integral_constant<int, LT_TYPE_F16>{});
    else
        with_td(std::integral_constant<int, LT_TYPE_F32>{});
}

/* CONCAT along dim 0 of two 2-byte sources into a result of their type (a LoRA target's
 * BF16 weight and adapter, or its input and the adapter's A x): a block a result row, the
 * two source rows copied as 16-byte words where every row start allows, else as 2-byte
 * elements. Sources' rows may lie apart (nb1), their elements may not (concat_rows_ok). */
static __global__ void concat_rows_kernel(const char *a, size_t nba, int64_t na, const char *b,
                                          size_t nbb, int64_t nb, char *y, int64_t rows, bool words)
{
    cu_pdl_enter();
    const int64_t ny = na + nb;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const char *ar = a + (size_t)r * nba, *br = b + (size_t)r * nbb;
        char *yr = y + (size_t)r * (size_t)ny * 2;
        if (words) {
            for (int64_t i = threadIdx.x; i < na / 8; i += blockDim.x)
                ((uint4 *)yr)[i] = __ldg((const uint4 *)ar + i);
            for (int64_t i = threadIdx.x; i < nb / 8; i += blockDim.x)
                ((uint4 *)(yr + na * 2))[i] = __ldg((const uint4 *)br + i);
        } else {
            for (int64_t i = threadIdx.x; i < ny; i += blockDim.x)
                ((unsigned short *)yr)[i] =
                    i < na ? ((const unsigned short *)ar)[i] : ((const unsigned short *)br)[i - na];
        }
    }
}

static __global__ void concat_kernel(struct cu_t a, struct cu_t b, struct cu_t out, int dim)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(out);
    float *y = (float *)out.data;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i[4];
        cu_unravel(f, out.ne, i[0], i[1], i[2], i[3]);
        float v;
        if (i[dim] < a.ne[dim]) {
            v = cu_read(a, i[0], i[1], i[2], i[3]);
        } else {
            i[dim] -= a.ne[dim];
            v = cu_read(b, i[0], i[1], i[2], i[3]);
        }
        y[f] = v;
    }
}

static __global__ void repeat_kernel(struct cu_t a, struct cu_t out)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(out);
    float *y = (float *)out.data;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, out.ne, i0, i1, i2, i3);
        y[f] = cu_read(a, i0 % a.ne[0], i1 % a.ne[1], i2 % a.ne[2], i3 % a.ne[3]);
    }
}

/* Output element (j0..j3) of repeat_back: the sum, in double, of every tile's element. The
 * CPU adds tiles k3, k2, k1 outermost and k0 innermost; so does this. */
static __device__ double repeat_back_sum(const struct cu_t &a, const struct cu_t &out,
                                         int64_t j0, int64_t j1, int64_t j2, int64_t j3,
                                         int64_t t_lo, int64_t t_step)
{
    const int64_t t0 = a.ne[0] / out.ne[0], t1 = a.ne[1] / out.ne[1], t2 = a.ne[2] / out.ne[2],
                  t3 = a.ne[3] / out.ne[3];
    const int64_t n_tiles = t0 * t1 * t2 * t3;
    double acc = 0.0;
    for (int64_t t = t_lo; t < n_tiles; t += t_step) {
        int64_t k0 = t % t0, k1 = (t / t0) % t1, k2 = (t / (t0 * t1)) % t2, k3 = t / (t0 * t1 * t2);
        acc += (double)cu_read(a, j0 + k0 * out.ne[0], j1 + k1 * out.ne[1], j2 + k2 * out.ne[2],
                               j3 + k3 * out.ne[3]);
    }
    return acc;
}

/* few tiles: a thread per output element, the tiles in repeat_back_sum's order by nested
 * loops (its divisions of a tile's index, in 64 bits, cost more than the reads: 213 us for
 * the 4 tiles of a grouped-query gradient of 64 MB in a training step) */
static __global__ void repeat_back_thread_kernel(struct cu_t a, struct cu_t out)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(out);
    const int64_t t0 = a.ne[0] / out.ne[0], t1 = a.ne[1] / out.ne[1], t2 = a.ne[2] / out.ne[2],
                  t3 = a.ne[3] / out.ne[3];
    float *y = (float *)out.data;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t j0, j1, j2, j3;
        cu_unravel(f, out.ne, j0, j1, j2, j3);
        double acc = 0.0;
        for (int64_t k3 = 0; k3 < t3; k3++)
            for (int64_t k2 = 0; k2 < t2; k2++)
                for (int64_t k1 = 0; k1 < t1; k1++)
                    for (int64_t k0 = 0; k0 < t0; k0++)
                        acc += (double)cu_read(a, j0 + k0 * out.ne[0], j1 + k1 * out.ne[1],
                                               j2 + k2 * out.ne[2], j3 + k3 * out.ne[3]);
        y[f] = (float)acc;
    }
}

/* many tiles: a block per output element */
static __global__ void repeat_back_block_kernel(struct cu_t a, struct cu_t out)
{
    cu_pdl_enter();
    __shared__ double shared[32];
    const int64_t n = cu_nelements(out);
    float *y = (float *)out.data;
    for (int64_t f = blockIdx.x; f < n; f += gridDim.x) {
        int64_t j0, j1, j2, j3;
        cu_unravel(f, out.ne, j0, j1, j2, j3);
        double s = cu_block_sum(repeat_back_sum(a, out, j0, j1, j2, j3, threadIdx.x, blockDim.x),
                                shared);
        if (threadIdx.x == 0)
            y[f] = (float)s;
    }
}

static __device__ __forceinline__ int32_t id_at(const struct cu_t &ids, int64_t i1, int64_t i2,
                                                int64_t i3)
{
    return *(const int32_t *)(ids.data + i1 * ids.nb[0] + i2 * ids.nb[1] + i3 * ids.nb[2]);
}

static __global__ void get_rows_kernel(struct cu_t a, struct cu_t ids, struct cu_t out)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(out);
    float *y = (float *)out.data;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, out.ne, i0, i1, i2, i3);
        int64_t id = id_at(ids, i1, i2, i3);
        y[f] = id < 0 || id >= a.ne[1] ? __int_as_float(0x7fc00000)
                                       : cu_read(a, i0, id, i2, i3);
    }
}

/* grad [n, k, ne2, ne3] rows added into out's rows at ids (out zeroed first) */
static __global__ void get_rows_back_kernel(struct cu_t grad, struct cu_t ids, struct cu_t out)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(grad);
    float *y = (float *)out.data;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, grad.ne, i0, i1, i2, i3);
        int64_t id = id_at(ids, i1, i2, i3);
        if (id < 0 || id >= out.ne[1])
            continue;
        atomicAdd(&y[((i3 * out.ne[2] + i2) * out.ne[1] + id) * out.ne[0] + i0],
                  cu_read(grad, i0, i1, i2, i3));
    }
}

/* slice i2 of src [a, b, k] into row ids[i2] of out [a * b, rows] (ids outside out's rows
 * write nothing) */
static __global__ void set_rows_kernel(struct cu_t src, struct cu_t ids, struct cu_t out)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(src), row = src.ne[0] * src.ne[1];
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        const int64_t j = f % row, i2 = f / row;
        const int64_t id = *(const int32_t *)(ids.data + i2 * ids.nb[0]);
        if (id < 0 || id >= out.ne[1])
            continue;
        cu_store((char *)cu_ptr(out, j, id, 0, 0), out.type,
                 cu_read(src, j % src.ne[0], j / src.ne[0], i2, 0));
    }
}

static __global__ void read_all_kernel(struct cu_t a, struct cu_t out)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(out);
    float *y = (float *)out.data;
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, out.ne, i0, i1, i2, i3);
        y[f] = cu_read(a, i0, i1, i2, i3);
    }
}

/* b added into the window (strides in floats) of out; atomics when windows may overlap */
static __global__ void acc_add_kernel(struct cu_t b, float *window, int64_t s1, int64_t s2,
                                      int64_t s3, bool atomic)
{
    cu_pdl_enter();
    const int64_t n = cu_nelements(b);
    for (int64_t f = cu_thread_index(); f < n; f += cu_thread_count()) {
        int64_t i0, i1, i2, i3;
        cu_unravel(f, b.ne, i0, i1, i2, i3);
        float *y = window + i0 + i1 * s1 + i2 * s2 + i3 * s3;
        float v = cu_read(b, i0, i1, i2, i3);
        if (atomic)
            atomicAdd(y, v);
        else
            *y += v;
    }
}

/* The same for b contiguous F32 of fewer than 2^31 elements, rows of a multiple of 4 and
 * a window whose rows start 16-byte aligned, windows apart: a float4 a thread and 32-bit
 * index arithmetic (the element kernel's 64-bit divisions held Qwen3.5's three conv-output
 * slices at ~1.4 TB/s, 140 us each at 16 x 512 tokens). nq = b's elements / 4, n0q its row's. */
static __global__ void acc_add4_kernel(const float4 *b, float *window, int n0q, int n1, int n2,
                                       int64_t s1, int64_t s2, int64_t s3, int nq)
{
    cu_pdl_enter();
    for (int g = blockIdx.x * blockDim.x + threadIdx.x; g < nq; g += gridDim.x * blockDim.x) {
        const int r = g / n0q, q = g - r * n0q, i1 = r % n1, r2 = r / n1, i2 = r2 % n2,
                  i3 = r2 / n2;
        float4 *y = (float4 *)(window + i1 * s1 + i2 * s2 + i3 * s3) + q;
        const float4 v = b[g];
        float4 w = *y;
        w.x += v.x, w.y += v.y, w.z += v.z, w.w += v.w;
        *y = w;
    }
}

/* A copy through 32 x 32 tiles of (i0, i1): out(i0, i1, i2, i3) = a(...) for i0 < split,
 * else b(i0 - split, ...) (concat on dim 0; split = ne[0] for a plain copy). Lanes read
 * along i1 and write along i0, so a source that is a transposed view (dim 1 its fastest)
 * is read whole by a warp, as the result is written: the element-per-thread kernels read
 * such a source 32 rows apart a warp (1.5 ms for Qwen3.5's conv input at 16 x 512 tokens,
 * the q, k, v channels turned time-innermost). Block (32, 8); grid (i0 tiles, i1 tiles,
 * ne[2] * ne[3]). Sources non-quantised. */
#define TILE 32
static __global__ void tile_copy_kernel(struct cu_t a, struct cu_t b, int64_t split,
                                        struct cu_t out)
{
    cu_pdl_enter();
    __shared__ float tile[TILE][TILE + 1];
    const int64_t n0 = out.ne[0], n1 = out.ne[1];
    const int64_t i2 = blockIdx.z % out.ne[2], i3 = blockIdx.z / out.ne[2];
    const int64_t base0 = (int64_t)blockIdx.x * TILE, base1 = (int64_t)blockIdx.y * TILE;
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        const int64_t i0 = base0 + j, i1 = base1 + threadIdx.x;
        if (i0 < n0 && i1 < n1)
            tile[j][threadIdx.x] =
                i0 < split ? cu_read(a, i0, i1, i2, i3) : cu_read(b, i0 - split, i1, i2, i3);
    }
    __syncthreads();
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        const int64_t i0 = base0 + threadIdx.x, i1 = base1 + j;
        if (i0 < n0 && i1 < n1)
            cu_store((char *)cu_ptr(out, i0, i1, i2, i3), out.type, tile[threadIdx.x][j]);
    }
}

/* A source whose rows (dim 0) are unit-strided, any strides above, into a contiguous result
 * of the same shape (TA, TD: F32, F16 or BF16): a warp a row, its lanes along the row (both
 * sides coalesced), the row's index arithmetic once a row. The element-per-thread kernels
 * unravel every element through four 64-bit divisions: ~0.85 TB/s on the H200 for the
 * DeltaNet's q, k and output views and the conv input's gradient at 16 x 512 tokens. */
template <int TA, int TD>
static __global__ void copy_rows_kernel(struct cu_t a, char *d, int64_t rows)
{
    cu_pdl_enter();
    const int ea = TA == LT_TYPE_F32 ? 4 : 2, ed = TD == LT_TYPE_F32 ? 4 : 2;
    const int lane = threadIdx.x & 31;
    const int64_t n0 = a.ne[0], warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
         r += warps) {
        const int64_t i1 = r % a.ne[1], i23 = r / a.ne[1], i2 = i23 % a.ne[2], i3 = i23 / a.ne[2];
        const char *src = a.data + i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3];
        char *dst = d + r * n0 * ed;
        for (int64_t i0 = lane; i0 < n0; i0 += 32)
            cu_store(dst + i0 * ed, TD, cu_load(src + i0 * ea, TA));
    }
}

/* whether t (non-quantised) is walked faster along dim 1 than along dim 0 */
static bool dim1_faster(const struct lt_tensor *t)
{
    return lt_type_traits(t->type)->block_size == 1 && t->ne[0] > 1 && t->ne[1] > 1 &&
           t->nb[1] < t->nb[0];
}

static lt_status launch_tile_copy(struct cu_ctx *c, const struct lt_tensor *a,
                                  const struct lt_tensor *b, int64_t split, struct lt_tensor *out)
{
    const int64_t planes = out->ne[2] * out->ne[3];
    if (planes > 0x7fffffff || (out->ne[1] + TILE - 1) / TILE > 65535)
        return LT_ERR_UNSUPPORTED; /* the caller takes the element kernels */
    dim3 grid((unsigned)((out->ne[0] + TILE - 1) / TILE), (unsigned)((out->ne[1] + TILE - 1) / TILE),
              (unsigned)planes);
    cu_launch_pdl(c, tile_copy_kernel, grid, dim3(TILE, 8), 0, cu_view(a), cu_view(b ? b : a),
                  split, cu_view(out));
    return cu_launched("tile_copy");
}

/* ---- launchers ---- */

static lt_status launch_cpy(struct cu_ctx *c, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0];
    int64_t n = lt_nelements(a);
    if (n == 0)
        return LT_OK;
    struct cu_t av = cu_view(a), dv = cu_view(node);
    if (dim1_faster(a) && lt_same_shape(a, node) && lt_type_traits(node->type)->block_size == 1) {
        lt_status st = launch_tile_copy(c, a, NULL, a->ne[0], node);
        if (st != LT_ERR_UNSUPPORTED)
            return st;
    }
    const bool flat_types = (a->type == LT_TYPE_F32 || a->type == LT_TYPE_F16 ||
                             a->type == LT_TYPE_BF16) &&
                            (node->type == LT_TYPE_F32 || node->type == LT_TYPE_F16 ||
                             node->type == LT_TYPE_BF16);
    if (flat_types && lt_is_contiguous(a) && lt_is_contiguous(node)) {
        /* element order is the same: no index arithmetic (a training step's BF16
         * roundings of its activations ran at ~0.5 TB/s through the generic kernel) */
        if (a->type == node->type)
            return cu_check(cudaMemcpyAsync(node->data, a->data,
                                            (size_t)n * lt_type_traits(a->type)->type_size,
                                            cudaMemcpyDeviceToDevice, c->stream),
                            "copying a contiguous tensor");
        if (a->type == LT_TYPE_F32)
            return cu_convert_f32_flat(c, (const float *)a->data, (char *)node->data, n,
                                       node->type, "copy_convert_flat");
        float_types(a->type, node->type, [&](auto ta, auto td) {
            cu_launch_pdl(c, convert_flat_kernel<decltype(ta)::value, decltype(td)::value>,
                          cu_blocks(n, 256), 256, 0, (const char *)a->data, (char *)node->data, n);
        });
        return cu_launched("copy_convert_flat");
    }
    if (flat_types && lt_same_shape(a, node) && lt_is_contiguous(node) && a->ne[0] >= 32 &&
        a->nb[0] == lt_type_traits(a->type)->type_size) {
        const int64_t rows = n / a->ne[0];
        /* 8 warps, 8 rows, a block */
        float_types(a->type, node->type, [&](auto ta, auto td) {
            cu_launch_pdl(c, copy_rows_kernel<decltype(ta)::value, decltype(td)::value>,
                          cu_blocks(rows, 8), 256, 0, av, (char *)node->data, rows);
        });
        return cu_launched("copy_rows");
    }
    if (a->type != node->type) {
        cu_launch_pdl(c, copy_convert_kernel, cu_blocks(n, 256), 256, 0, av, dv, n);
        return cu_launched("copy_convert");
    }
    const struct lt_type_traits *tt = lt_type_traits(a->type);
    av.ne[0] /= tt->block_size;
    dv.ne[0] /= tt->block_size;
    n /= tt->block_size;
    cu_launch_pdl(c, copy_same_kernel, cu_blocks(n, 256), 256, 0, av, dv, n, (int)tt->type_size);
    return cu_launched("copy_same");
}

/* REPEAT_BACK of contiguous F32 a [n0, rows] down to [n0] (a norm weight's gradient):
 * block b sums rows [b * per, (b + 1) * per) of each column into part[b][col] (a warp
 * reads 32 neighbouring floats of a row), then a thread a column adds the blocks' partials
 * in order. A block per output element read a's column at a stride of n0 floats
 * (0.12 TB/s on the H200 for Qwen3.5's 128-wide DeltaNet norm over 8192 tokens). */
#define RB_COLS_BLOCKS 1024
static __global__ void repeat_back_cols_kernel(const float *a, int64_t n0, int64_t rows,
                                               int64_t per, double *part)
{
    cu_pdl_enter();
    const int64_t r0 = blockIdx.x * per, r1 = r0 + per < rows ? r0 + per : rows;
    for (int64_t col = threadIdx.x; col < n0; col += blockDim.x) {
        double s = 0.0;
        for (int64_t r = r0; r < r1; r++)
            s += (double)a[r * n0 + col];
        part[blockIdx.x * n0 + col] = s;
    }
}

/* y[col] = the sum of the nblk partials of col: a block takes 32 columns, its warp w the
 * partials w, w + 8, ... of each (in order), then warp 0 adds the 8 warps' sums in order.
 * A thread a column walking all the partials was a chain of 1024 dependent loads on 4
 * blocks (77 us of a norm weight's 32 MB gradient). */
#define RB_SUM_WARPS 8
static __global__ void repeat_back_sum_kernel(const double *part, int64_t n0, int64_t nblk,
                                              float *y)
{
    cu_pdl_enter();
    __shared__ double sums[RB_SUM_WARPS][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t col = blockIdx.x * 32 + lane;
    double s = 0.0;
    if (col < n0)
        for (int64_t b = warp; b < nblk; b += RB_SUM_WARPS)
            s += part[b * n0 + col];
    sums[warp][lane] = s;
    __syncthreads();
    if (warp == 0 && col < n0) {
        double t = 0.0;
        for (int w = 0; w < RB_SUM_WARPS; w++)
            t += sums[w][lane];
        y[col] = (float)t;
    }
}

/* REPEAT_BACK of many rows into one short row goes by column partials: `used` blocks of
 * `per` rows each, a double a (block, column) in scratch; 0 for the other kernels */
static int64_t repeat_back_col_blocks(const struct lt_tensor *node, int64_t *per)
{
    const struct lt_tensor *a = node->src[0];
    const int64_t n = lt_nelements(node), tiles = n > 0 ? lt_nelements(a) / n : 0;
    if (n == 0 ||
        !(tiles > 64 && a->type == LT_TYPE_F32 && lt_is_contiguous(a) && node->ne[0] == a->ne[0] &&
          node->ne[1] == 1 && node->ne[2] == 1 && node->ne[3] == 1 && n <= 8192))
        return 0;
    const int64_t nblk = tiles < RB_COLS_BLOCKS ? tiles : RB_COLS_BLOCKS;
    *per = (tiles + nblk - 1) / nblk;
    return (tiles + *per - 1) / *per;
}

static void copy_scratch(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT])
{
    int64_t per = 0, used = node->op == LT_OP_REPEAT_BACK ? repeat_back_col_blocks(node, &per) : 0;
    if (used > 0)
        need[CU_SCRATCH_REDUCE] = sizeof(double) * (size_t)(used * lt_nelements(node));
}

static lt_status launch_repeat_back(struct cu_ctx *c, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0];
    int64_t n = lt_nelements(node), tiles = n > 0 ? lt_nelements(a) / n : 0;
    if (n == 0)
        return LT_OK;
    int64_t per = 0;
    const int64_t used = repeat_back_col_blocks(node, &per);
    if (used > 0) {
        const int64_t rows = tiles;
        void *part;
        lt_status st = cu_scratch(c, CU_SCRATCH_REDUCE, sizeof(double) * (size_t)(used * n), &part);
        if (st != LT_OK)
            return st;
        const int threads = n >= 256 ? 256 : (int)((n + 31) / 32 * 32);
        cu_launch_pdl(c, repeat_back_cols_kernel, (unsigned)used, threads, 0,
                      (const float *)a->data, n, rows, per, (double *)part);
        if ((st = cu_launched("repeat_back_cols")) != LT_OK)
            return st;
        cu_launch_pdl(c, repeat_back_sum_kernel, (unsigned)((n + 31) / 32), 32 * RB_SUM_WARPS, 0,
                      (const double *)part, n, used, (float *)node->data);
        return cu_launched("repeat_back_sum");
    }
    if (tiles <= 64) {
        cu_launch_pdl(c, repeat_back_thread_kernel, cu_blocks(n, 256), 256, 0, cu_view(a),
                      cu_view(node));
        return cu_launched("repeat_back_thread");
    }
    cu_launch_pdl(c, repeat_back_block_kernel, cu_blocks(n, 1), 256, 0, cu_view(a), cu_view(node));
    return cu_launched("repeat_back_block");
}

static lt_status launch_acc(struct cu_ctx *c, struct lt_tensor *node)
{
    const struct lt_tensor *a = node->src[0], *b = node->src[1];
    int64_t n = lt_nelements(node), nb_ = lt_nelements(b);
    if (n > 0 && a->data != node->data) { /* in place (lt_acc_inplace): a is there */
        cu_launch_pdl(c, read_all_kernel, cu_blocks(n, 256), 256, 0, cu_view(a), cu_view(node));
        lt_status st = cu_launched("acc_copy");
        if (st != LT_OK)
            return st;
    }
    if (nb_ == 0)
        return LT_OK;
    const size_t nb1 = get_param_size(node, 0), nb2 = get_param_size(node, 2),
                 nb3 = get_param_size(node, 4), offset = get_param_size(node, 6);
    /* windows of b's rows lie apart when each stride spans the dimension inside it */
    const bool apart = (b->ne[1] == 1 || nb1 >= (size_t)b->ne[0] * 4) &&
                       (b->ne[2] == 1 || nb2 >= nb1 * (size_t)b->ne[1]) &&
                       (b->ne[3] == 1 || nb3 >= nb2 * (size_t)b->ne[2]);
    float *window = (float *)((char *)node->data + offset);
    if (apart && b->type == LT_TYPE_F32 && lt_is_contiguous(b) && nb_ < INT32_MAX &&
        b->ne[0] % 4 == 0 && nb1 % 16 == 0 && nb2 % 16 == 0 && nb3 % 16 == 0 &&
        cu_aligned(window, 16) && cu_aligned(b->data, 16)) {
        cu_launch_pdl(c, acc_add4_kernel, cu_blocks(nb_ / 4, 256), 256, 0, (const float4 *)b->data,
                      window, (int)(b->ne[0] / 4), (int)b->ne[1], (int)b->ne[2], (int64_t)(nb1 / 4),
                      (int64_t)(nb2 / 4), (int64_t)(nb3 / 4), (int)(nb_ / 4));
        return cu_launched("acc_add4");
    }
    cu_launch_pdl(c, acc_add_kernel, cu_blocks(nb_, 256), 256, 0, cu_view(b), window,
                  (int64_t)(nb1 / 4), (int64_t)(nb2 / 4), (int64_t)(nb3 / 4), !apart);
    return cu_launched("acc_add");
}

lt_status cu_copy_compute(struct cu_ctx *c, struct lt_tensor *node)
{
    char reason[CU_REASON_MAX];
    if (!cu_copy_supported(node, reason, sizeof(reason)))
        return cu_refuse(node, reason);
    const int64_t n = lt_nelements(node);
    const unsigned blocks = cu_blocks(n, 256);
    switch (node->op) {
    case LT_OP_CONT:
    case LT_OP_CPY: return launch_cpy(c, node);
    case LT_OP_CONCAT:
        if (n == 0)
            return LT_OK;
        if (node->type != LT_TYPE_F32) { /* concat_rows_ok, by the check above */
            const struct lt_tensor *a = node->src[0], *b = node->src[1];
            const int64_t na = a->ne[0], nb = b->ne[0];
            const bool words = na % 8 == 0 && nb % 8 == 0 && a->nb[1] % 16 == 0 &&
                               b->nb[1] % 16 == 0 && (uintptr_t)a->data % 16 == 0 &&
                               (uintptr_t)b->data % 16 == 0 && (uintptr_t)node->data % 16 == 0;
            const int64_t rows = node->ne[1];
            cu_launch_pdl(c, concat_rows_kernel, (unsigned)(rows < 65535 ? rows : 65535), 128, 0,
                          (const char *)a->data, a->nb[1], na, (const char *)b->data, b->nb[1], nb,
                          (char *)node->data, rows, words);
            return cu_launched("concat_rows");
        }
        if (lt_get_param_i32(node, 0) == 0 &&
            (dim1_faster(node->src[0]) || dim1_faster(node->src[1]))) {
            lt_status st = launch_tile_copy(c, node->src[0], node->src[1], node->src[0]->ne[0], node);
            if (st != LT_ERR_UNSUPPORTED)
                return st;
        }
        cu_launch_pdl(c, concat_kernel, blocks, 256, 0, cu_view(node->src[0]),
                      cu_view(node->src[1]), cu_view(node), lt_get_param_i32(node, 0));
        return cu_launched("concat");
    case LT_OP_REPEAT:
        if (n == 0)
            return LT_OK;
        cu_launch_pdl(c, repeat_kernel, blocks, 256, 0, cu_view(node->src[0]), cu_view(node));
        return cu_launched("repeat");
    case LT_OP_REPEAT_BACK: return launch_repeat_back(c, node);
    case LT_OP_GET_ROWS:
        if (n == 0)
            return LT_OK;
        cu_launch_pdl(c, get_rows_kernel, blocks, 256, 0, cu_view(node->src[0]),
                      cu_view(node->src[1]), cu_view(node));
        return cu_launched("get_rows");
    case LT_OP_GET_ROWS_BACK: {
        if (n == 0)
            return LT_OK;
        lt_status st = node->src[2]
                           ? LT_OK /* in place: the rows add to what is there */
                           : cu_check(cudaMemsetAsync(node->data, 0, (size_t)n * 4, c->stream),
                                      "zeroing get_rows_back's result");
        int64_t ng = lt_nelements(node->src[0]);
        if (st != LT_OK || ng == 0)
            return st;
        cu_launch_pdl(c, get_rows_back_kernel, cu_blocks(ng, 256), 256, 0, cu_view(node->src[0]),
                      cu_view(node->src[1]), cu_view(node));
        return cu_launched("get_rows_back");
    }
    case LT_OP_SET_ROWS: {
        const int64_t ns = lt_nelements(node->src[0]);
        if (ns == 0)
            return LT_OK;
        cu_launch_pdl(c, set_rows_kernel, cu_blocks(ns, 256), 256, 0, cu_view(node->src[0]),
                      cu_view(node->src[2]), cu_view(node));
        return cu_launched("set_rows");
    }
    case LT_OP_ACC: return launch_acc(c, node);
    default: return cu_refuse(node, "not a copy op");
    }
}

const struct cu_family cu_family_copy = {
    "copy", copy_ops, CU_COUNT(copy_ops), cu_copy_supported, cu_copy_compute, copy_scratch};
