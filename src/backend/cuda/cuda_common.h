/* cuda_common.h (internal, CUDA C++): what the op family files of the CUDA backend share:
 * the backend's context (device, stream, cuBLAS handle, scratch), status helpers that turn
 * CUDA and cuBLAS errors into LT_ERR_BACKEND, a by-value tensor description for kernels,
 * element loads and stores for F32/F16/BF16/I32, and the family interface.
 *
 * Invariants that are not obvious:
 * - Every family file exports exactly one precondition, cu_<family>_supported, and one
 *   launcher, cu_<family>_compute. supports_op calls the precondition; the launcher calls
 *   it again first and returns LT_ERR_UNSUPPORTED instead of launching, so a claim and a
 *   kernel cannot disagree. Preconditions look at types, shapes and strides only (never at
 *   data pointers): the scheduler asks before anything is allocated.
 * - Kernels take sources of any strides through struct cu_t (element strides in bytes) and
 *   read every element with the loads below, which need each element aligned to its size;
 *   cu_check_source refuses views whose offset or strides are not whole elements.
 * - Everything runs on the context's one stream; nothing here synchronises except scratch
 *   growth (which must not free memory a queued kernel still reads). While c->capturing
 *   (a node list being recorded as a CUDA graph) nothing may synchronise or allocate:
 *   cu_scratch fails instead of growing, and the list runs eagerly. */
#ifndef LATHE_BACKEND_CUDA_COMMON_H
#define LATHE_BACKEND_CUDA_COMMON_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/backend.h"
#include "lathe/status.h"
#include "lathe/tensor.h"

#define CU_REASON_MAX 160

/* Scratch slots: a launcher may hold one buffer per slot at once. */
enum cu_scratch_slot {
    CU_SCRATCH_B = 0, /* mul_mat: b converted */
    CU_SCRATCH_A,     /* mul_mat: a tile converted or dequantised */
    CU_SCRATCH_REDUCE, /* partial sums of reductions and losses */
    CU_SCRATCH_WORK,  /* anything else a kernel needs for one node */
    CU_SCRATCH_COUNT
};

struct cu_ctx {
    int device;
    int n_sm;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *scratch[CU_SCRATCH_COUNT];
    size_t scratch_size[CU_SCRATCH_COUNT];
    uint64_t scratch_epoch;   /* bumped by every scratch growth (kept CUDA graphs read it) */
    bool disabled[LT_OP_COUNT]; /* LATHE_CUDA_DISABLE_OPS */
    char name[32];
    struct cu_profile *profile; /* LATHE_CUDA_PROFILE=1: time per op, printed when freed */
    struct cu_graphs *graphs;   /* unchanged small-batch node lists replayed as CUDA graphs */
    bool capturing;             /* the stream is being captured: nothing may synchronise */
    /* LATHE_CUDA_CHECK_SCRATCH=1: a node asking for more scratch than its family's
     * scratch function said (scratch_said, per slot) fails instead of growing it */
    bool check_scratch;
    size_t scratch_said[CU_SCRATCH_COUNT];
    /* CU_COUNTERS ints, zeroed once when the context starts: a kernel whose blocks count
     * their arrivals (the last one finishes the node's work) takes them, and its last
     * block sets every counter it used back to zero, so the next launch (or a replayed
     * CUDA graph) finds them zero. One stream runs one node at a time. */
    int *counters;
    /* a device of compute capability 9.0 or more, unless LATHE_CUDA_PDL=0: the kernels
     * launched through cu_launch_pdl may start while the kernel before them finishes (see
     * there) */
    bool pdl;
};

#define CU_COUNTERS 16384

/* ---- status ---- */

/* LT_OK, or LT_ERR_BACKEND naming `what` and CUDA's error text. */
lt_status cu_check(cudaError_t e, const char *what);
/* LT_OK, or LT_ERR_BACKEND naming `what` and cuBLAS's status text. */
lt_status cu_check_blas(cublasStatus_t s, const char *what);
/* The launch error of the kernel just queued (bad configuration, no kernel image), if any. */
lt_status cu_launched(const char *kernel);
/* LT_ERR_UNSUPPORTED for a node the launcher's precondition refused. */
lt_status cu_refuse(const struct lt_tensor *node, const char *reason);

/* A device buffer of at least `bytes` for `slot`, valid until the next call for that slot. */
lt_status cu_scratch(struct cu_ctx *c, enum cu_scratch_slot slot, size_t bytes, void **out);

/* ---- the family interface ---- */

typedef bool (*cu_supported_fn)(const struct lt_tensor *node, char *reason, size_t reason_size);
typedef lt_status (*cu_compute_fn)(struct cu_ctx *c, struct lt_tensor *node);
/* The scratch a node the family runs will ask cu_scratch for: need[slot] (zeroed by the
 * caller) becomes its largest request of each slot, computed by the function the launcher
 * asks with. Only for nodes the family supports; a family that takes none leaves it NULL. */
typedef void (*cu_scratch_fn)(const struct lt_tensor *node, size_t need[CU_SCRATCH_COUNT]);

struct cu_family {
    const char *name;
    const enum lt_op *ops; /* the ops this family runs */
    int n_ops;
    cu_supported_fn supported;
    cu_compute_fn compute;
    cu_scratch_fn scratch; /* NULL: the family takes no scratch */
};

/* whether p is aligned to `bytes` (a power of two): the float4 kernels' condition */
static inline bool cu_aligned(const void *p, size_t bytes)
{
    return ((uintptr_t)p & (bytes - 1)) == 0;
}

/* n F32 at src, in memory order, into dst of type (F16 or BF16, each rounded to nearest
 * even): four a thread where n and the pointers allow (copy.cu). Queues one kernel named
 * `what` and returns its launch status. CONT/CPY's flat conversions and mul_mat's rounding
 * of a flat F32 operand both go through it. */
lt_status cu_convert_f32_flat(struct cu_ctx *c, const float *src, char *dst, int64_t n, int type,
                              const char *what);

/* the number of elements of an array (a family's op list) */
#define CU_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

#define CU_DECLARE_FAMILY(fam)                                                                  \
    bool cu_##fam##_supported(const struct lt_tensor *node, char *reason, size_t reason_size); \
    lt_status cu_##fam##_compute(struct cu_ctx *c, struct lt_tensor *node);                \
    extern const struct cu_family cu_family_##fam

CU_DECLARE_FAMILY(fill);
CU_DECLARE_FAMILY(copy);
CU_DECLARE_FAMILY(binary);
CU_DECLARE_FAMILY(unary);
CU_DECLARE_FAMILY(reduce);
CU_DECLARE_FAMILY(norm);
CU_DECLARE_FAMILY(rope);
CU_DECLARE_FAMILY(softmax);
CU_DECLARE_FAMILY(matmul);
CU_DECLARE_FAMILY(ssm_conv);
CU_DECLARE_FAMILY(conv_silu);
CU_DECLARE_FAMILY(delta_net);
CU_DECLARE_FAMILY(gdn_decode);
CU_DECLARE_FAMILY(attn_decode);
CU_DECLARE_FAMILY(flash_attn);
CU_DECLARE_FAMILY(loss);
CU_DECLARE_FAMILY(linear_ce);
CU_DECLARE_FAMILY(optim);

/* ---- host-side checks shared by preconditions ---- */

bool cu_type_is_float(enum lt_type t); /* F32, F16, BF16 */
/* Types whose elements the device can read one at a time: float types, I32 and the
 * block-quantised types with a device dequantiser (quant.cuh). */
bool cu_type_readable(enum lt_type t);
/* Source i exists, has one of the types in `types` (a bit per enum lt_type value, see
 * CU_TYPES), and whole-element offset and strides (quantised: nb[0] is one block). */
bool cu_check_source(const struct lt_tensor *node, int i, uint64_t types, char *reason,
                     size_t reason_size);
/* The node is contiguous F32. */
bool cu_check_result_f32(const struct lt_tensor *node, char *reason, size_t reason_size);
/* The node is contiguous F32, F16 or BF16 (an element-wise op that may write a half
 * activation). */
bool cu_check_result_float(const struct lt_tensor *node, char *reason, size_t reason_size);

#define CU_TYPE_BIT(t) ((uint64_t)1 << (t))
#define CU_TYPES_FLOAT (CU_TYPE_BIT(LT_TYPE_F32) | CU_TYPE_BIT(LT_TYPE_F16) | CU_TYPE_BIT(LT_TYPE_BF16))
#define CU_TYPES_F32 CU_TYPE_BIT(LT_TYPE_F32)
#define CU_TYPES_I32 CU_TYPE_BIT(LT_TYPE_I32)
#define CU_TYPES_QUANT                                                                             \
    (CU_TYPE_BIT(LT_TYPE_Q4_0) | CU_TYPE_BIT(LT_TYPE_Q4_1) | CU_TYPE_BIT(LT_TYPE_Q5_0) |          \
     CU_TYPE_BIT(LT_TYPE_Q5_1) | CU_TYPE_BIT(LT_TYPE_Q8_0) | CU_TYPE_BIT(LT_TYPE_Q8_1) |          \
     CU_TYPE_BIT(LT_TYPE_Q2_K) | CU_TYPE_BIT(LT_TYPE_Q3_K) | CU_TYPE_BIT(LT_TYPE_Q4_K) |          \
     CU_TYPE_BIT(LT_TYPE_Q5_K) | CU_TYPE_BIT(LT_TYPE_Q6_K) | CU_TYPE_BIT(LT_TYPE_Q8_K))
#define CU_TYPES_READABLE (CU_TYPES_FLOAT | CU_TYPES_I32 | CU_TYPES_QUANT)

/* ---- what kernels are handed ---- */

/* A tensor as a kernel sees it: storage address, element counts and byte strides. For
 * quantised types ne[0] counts elements and nb[0] is the stride of one block. */
struct cu_t {
    char *data;
    int64_t ne[4];
    int64_t nb[4];
    int type;
};

static inline struct cu_t cu_view(const struct lt_tensor *t)
{
    struct cu_t v;
    v.data = (char *)t->data;
    for (int i = 0; i < 4; i++) {
        v.ne[i] = t->ne[i];
        v.nb[i] = (int64_t)t->nb[i];
    }
    v.type = (int)t->type;
    return v;
}

/* Whether t's rows are whole runs of 16 bytes: F32, unit element stride, the data and the row,
 * plane and batch strides on 16 bytes, so a kernel may read a row a float4 at a time (that
 * ne0 is a multiple of 4 is the caller's to check). A choice among a launcher's kernels, never
 * a claim; host and device code ask it alike. */
static inline __host__ __device__ bool cu_rows16(const struct cu_t &t)
{
    return t.type == LT_TYPE_F32 && t.nb[0] == 4 &&
           (((uintptr_t)t.data | (uintptr_t)t.nb[1] | (uintptr_t)t.nb[2] | (uintptr_t)t.nb[3]) &
            15) == 0;
}

/* Blocks for a grid-stride loop over n items, threads per block given. */
static inline unsigned cu_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1)
        b = 1;
    if (b > 65535 * 4)
        b = 65535 * 4;
    return (unsigned)b;
}

/* ---- device: element access ---- */

#ifdef __CUDACC__

__device__ __forceinline__ float cu_load(const char *p, int type)
{
    switch (type) {
    case LT_TYPE_F16: return __half2float(*(const __half *)p);
    case LT_TYPE_BF16: return __bfloat162float(*(const __nv_bfloat16 *)p);
    case LT_TYPE_I32: return (float)*(const int32_t *)p;
    default: return *(const float *)p;
    }
}

__device__ __forceinline__ void cu_store(char *p, int type, float v)
{
    switch (type) {
    case LT_TYPE_F16: *(__half *)p = __float2half_rn(v); break;
    case LT_TYPE_BF16: *(__nv_bfloat16 *)p = __float2bfloat16_rn(v); break;
    case LT_TYPE_I32: *(int32_t *)p = __float2int_rn(v); break;
    default: *(float *)p = v; break;
    }
}

/* Four floats into elements 4 f4 .. 4 f4 + 3 of y, of float type `type`: one 16-byte store
 * (F32) or one 8-byte store (F16, BF16: each rounded to nearest even, as cu_store rounds);
 * y aligned to four of its elements. The float4 kernels' stores. */
__device__ __forceinline__ void cu_store4(char *y, int type, size_t f4, float4 v)
{
    if (type == LT_TYPE_F32) {
        ((float4 *)y)[f4] = v;
        return;
    }
    uint2 u;
    if (type == LT_TYPE_BF16) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y),
                             hi = __floats2bfloat162_rn(v.z, v.w);
        u.x = *(const uint32_t *)&lo, u.y = *(const uint32_t *)&hi;
    } else {
        const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
        u.x = *(const uint32_t *)&lo, u.y = *(const uint32_t *)&hi;
    }
    ((uint2 *)y)[f4] = u;
}

/* Elements 4 f4 .. 4 f4 + 3 of x, of float type `type`, as floats: cu_store4's inverse (one
 * 16- or 8-byte load; x aligned to four of its elements) */
__device__ __forceinline__ float4 cu_load4(const char *x, int type, size_t f4)
{
    if (type == LT_TYPE_F32)
        return ((const float4 *)x)[f4];
    const uint2 u = ((const uint2 *)x)[f4];
    if (type == LT_TYPE_BF16) {
        const float2 lo = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x),
                     hi = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
        return make_float4(lo.x, lo.y, hi.x, hi.y);
    }
    const float2 lo = __half22float2(*(const __half2 *)&u.x),
                 hi = __half22float2(*(const __half2 *)&u.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

__device__ __forceinline__ const char *cu_ptr(const struct cu_t &t, int64_t i0, int64_t i1,
                                              int64_t i2, int64_t i3)
{
    return t.data + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

/* Element (i0..i3) of a non-quantised tensor as float. */
__device__ __forceinline__ float cu_get(const struct cu_t &t, int64_t i0, int64_t i1, int64_t i2,
                                        int64_t i3)
{
    return cu_load(cu_ptr(t, i0, i1, i2, i3), t.type);
}

/* F32 element (i0..i3). */
__device__ __forceinline__ float cu_getf(const struct cu_t &t, int64_t i0, int64_t i1,
                                         int64_t i2, int64_t i3)
{
    return *(const float *)cu_ptr(t, i0, i1, i2, i3);
}

/* Grid-stride loops: for (int64_t i = cu_thread_index(); i < n; i += cu_thread_count()) */
__device__ __forceinline__ int64_t cu_thread_index()
{
    return blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t cu_thread_count() { return (int64_t)gridDim.x * blockDim.x; }

__host__ __device__ __forceinline__ int64_t cu_nelements(const struct cu_t &t)
{
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
}

/* Flat index f (i0 fastest) of shape ne into its coordinates. */
__device__ __forceinline__ void cu_unravel(int64_t f, const int64_t *ne, int64_t &i0, int64_t &i1,
                                           int64_t &i2, int64_t &i3)
{
    if (f <= 0x7fffffff && ne[0] <= 0x7fffffff && ne[1] <= 0x7fffffff && ne[2] <= 0x7fffffff) {
        /* in 32 bits (every tensor a step holds): a 64-bit division is a long software
         * routine, and three of them an element held the generic kernels near 1 TB/s */
        uint32_t g = (uint32_t)f;
        const uint32_t n0 = (uint32_t)ne[0], n1 = (uint32_t)ne[1], n2 = (uint32_t)ne[2];
        i0 = g % n0;
        g /= n0;
        i1 = g % n1;
        g /= n1;
        i2 = g % n2;
        i3 = g / n2;
        return;
    }
    i0 = f % ne[0];
    f /= ne[0];
    i1 = f % ne[1];
    f /= ne[1];
    i2 = f % ne[2];
    i3 = f / ne[2];
}

/* Sum of a double over a warp (every lane gets it). */
__device__ __forceinline__ double cu_warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread
 * gets the result. `shared` holds 32 doubles; the block must reach this call together. */
__device__ __forceinline__ double cu_block_sum(double v, double *shared)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = cu_warp_sum(v);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : 0.0;
    return cu_warp_sum(v);
}

/* Who takes a row of a row-wise kernel: a block (WARP false: long rows, or few of them, as
 * decode's) or a warp of a 256-thread block (many short rows, as a training step's 131,072
 * rows of 128 in the DeltaNet's norms: a block a row left most of its threads idle and paid
 * two barriers a reduction, ~5x the time to read the rows). Rows r = first(), first() +
 * step(), ...; the team's threads walk a row from lane() by size(); sum() gives every thread
 * of the team the team's sum (`shared`: 32 doubles, used by a block). */
template <bool WARP> struct row_team {
    static __device__ __forceinline__ int64_t first()
    {
        return WARP ? (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5) : blockIdx.x;
    }
    static __device__ __forceinline__ int64_t step()
    {
        return WARP ? (int64_t)gridDim.x * (blockDim.x >> 5) : gridDim.x;
    }
    static __device__ __forceinline__ int lane()
    {
        return WARP ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
    }
    static __device__ __forceinline__ int size() { return WARP ? 32 : (int)blockDim.x; }
    static __device__ __forceinline__ double sum(double v, double *shared)
    {
        return WARP ? cu_warp_sum(v) : cu_block_sum(v, shared);
    }
};

/* Whether a row-wise kernel gives each row a warp (row_team<true>, 256-thread blocks of 8
 * rows: cu_blocks(rows, 8) of them) rather than a block: rows of at most 1024 elements, and
 * enough of them to fill the device (a training step's); decode's few rows keep a block. */
static inline bool cu_warp_rows(int64_t ne0, int64_t rows) { return ne0 <= 1024 && rows >= 4096; }

__device__ __forceinline__ float cu_block_max(float v, float *shared)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = cu_warp_max(v);
    __syncthreads();
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : -INFINITY;
    return cu_warp_max(v);
}

/* ---- programmatic dependent launch (PDL, compute capability 9.0) ----
 *
 * A kernel queued by cu_launch_pdl with c->pdl set may be started by the device as soon as
 * every block of the kernel before it in the stream has passed cu_pdl_trigger (or exited),
 * not when that kernel has finished: its blocks then wait in cu_pdl_wait until the kernel
 * before has finished and its writes are visible. The rule every such kernel keeps: no
 * thread reads or writes memory another kernel may write, or that a kernel before it may
 * still read, before it has passed cu_pdl_wait. What may come first is only work on what
 * no kernel writes (a weight's bytes, prefetched into L2 by cu_prefetch_l2, a hint that
 * changes no value). Each such kernel calls cu_pdl_trigger after its wait, so at most one
 * kernel waits ahead of the one running. Replayed in a CUDA graph (decode), the weights of
 * the next product stream in while the kernel before it runs. A kernel launched otherwise
 * (<<<>>>, cuBLAS) waits for the whole stream before it, as always; the two instructions
 * do nothing in a kernel launched without the attribute, before sm_90 and on the CPU
 * emulation (which runs launches one after another). */
static __device__ __forceinline__ void cu_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(LATHE_CUEMU_CORE_H)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void cu_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(LATHE_CUEMU_CORE_H)
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* a PDL kernel's first statement (after its prefetches, if any): the wait, then the trigger */
static __device__ __forceinline__ void cu_pdl_enter()
{
    cu_pdl_wait();
    cu_pdl_trigger();
}

/* asks L2 to fetch `bytes` at p (both multiples of 16): a hint, no value changes */
static __device__ __forceinline__ void cu_prefetch_l2(const void *p, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(LATHE_CUEMU_CORE_H)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    (void)p;
    (void)bytes;
#endif
}

/* cu_prefetch_l2 over the whole 16-byte runs inside [p, p + bytes) */
static __device__ __forceinline__ void cu_prefetch_l2_span(const void *p, int64_t bytes)
{
    const uintptr_t b = ((uintptr_t)p + 15) & ~(uintptr_t)15,
                    e = ((uintptr_t)p + bytes) & ~(uintptr_t)15;
    if (bytes > 0 && e > b && e - b <= 0xffffffffu)
        cu_prefetch_l2((const void *)b, (uint32_t)(e - b));
}

/* Queues kernel k on c's stream, with the PDL attribute when c->pdl (see above: k must keep
 * the rule). Its launch error is left for cu_launched, as a <<<>>> launch's. */
template <typename... P, typename... A>
static inline void cu_launch_pdl(const struct cu_ctx *c, void (*k)(P...), dim3 grid, dim3 block,
                                 size_t shared, A... args)
{
#ifdef LATHE_CUEMU_CORE_H
    k *cuemu_cfg(grid, block, shared, c->stream)(((P)args)...);
#else
    if (c->pdl) {
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = shared;
        cfg.stream = c->stream;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        (void)cudaLaunchKernelEx(&cfg, k, ((P)args)...);
        return;
    }
    k<<<grid, block, shared, c->stream>>>(((P)args)...);
#endif
}

#endif /* __CUDACC__ */

#endif
