/* cuemu_core.h: the CUDA backend's kernels run on the CPU, for machines without a GPU.
 *
 * The backend's .cu files are compiled by the host C++ compiler against these headers (in
 * place of the toolkit's cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, cuda_pipeline.h, mma.h
 * and cublas_v2.h), after cuemu_prep.cmake has rewritten the two pieces of CUDA syntax that
 * C++ cannot parse: a launch `k<<<g, b, s, st>>>(args)` becomes `k * cuemu_cfg(g, b, s,
 * st)(args)`, and `extern __shared__ T name[];` becomes a pointer to the block's dynamic
 * shared memory. Nothing of this is part of lathe itself: it is a test tool.
 *
 * How a launch runs (cuemu.cc): the blocks one after another, each block's threads as
 * fibers of one OS thread (cooperative, switched only at barriers), so that
 *   - __syncthreads waits for every live thread of the block, __syncwarp and the warp
 *     collectives (shuffles, votes, wmma) for every live lane of the warp;
 *   - a barrier that can never complete (threads of a block waiting at different barriers,
 *     or a warp collective some lanes never reach) is reported as a deadlock;
 *   - shared memory and fresh device memory start filled with NaN bytes, so a kernel that
 *     reads what nobody wrote shows it in its results.
 * Streams are synchronous: a launch, copy or memset has happened when its call returns,
 * except while a stream is being captured into a graph, when it is recorded instead and
 * replayed by cudaGraphLaunch. cuBLAS's GemmEx products run in float through OpenBLAS.
 *
 * What it does not model: timing, occupancy, the memory model between blocks running at
 * once (blocks run one at a time), the hardware's own fragment layouts (wmma fragments get
 * a layout of their own; code that only loads, stores, fills, multiplies and maps their
 * elements one by one cannot tell) and FMA contraction (nvcc contracts a * b + c by default;
 * this build does what the host compiler does), so results match a GPU's to rounding, not
 * bit for bit. */
#ifndef LATHE_CUEMU_CORE_H
#define LATHE_CUEMU_CORE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

/* ---- qualifiers ---- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__
#define __align__(n) __attribute__((aligned(n)))
#define __CUDA_ARCH__ 900

/* ---- vector types ---- */
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct __attribute__((aligned(8))) float2 {
    float x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(8))) int2 {
    int x, y;
};
struct __attribute__((aligned(16))) int4 {
    int x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned int x, y;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned int x, y, z, w;
};
struct uint1 {
    unsigned int x;
};
struct __attribute__((aligned(16))) double2 {
    double x, y;
};
static inline float2 make_float2(float x, float y)
{
    return float2{x, y};
}
static inline float4 make_float4(float x, float y, float z, float w)
{
    return float4{x, y, z, w};
}
static inline int2 make_int2(int x, int y)
{
    return int2{x, y};
}
static inline uint2 make_uint2(unsigned int x, unsigned int y)
{
    return uint2{x, y};
}
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w)
{
    return uint4{x, y, z, w};
}

/* ---- the running thread (set by the scheduler before it resumes a fiber) ---- */
extern uint3 cuemu_thread_idx, cuemu_block_idx;
extern dim3 cuemu_block_dim, cuemu_grid_dim;
#define threadIdx cuemu_thread_idx
#define blockIdx cuemu_block_idx
#define blockDim cuemu_block_dim
#define gridDim cuemu_grid_dim
#define warpSize 32

/* ---- barriers and warp collectives (cuemu.cc) ---- */
void cuemu_sync_block(void);
void cuemu_sync_warp(void);
/* cuemu_sync_warp, and the lane that arrives last runs last() (NULL: nothing) before the
 * others go on: a warp collective computed once for every lane */
void cuemu_sync_warp_do(void (*last)(void));
/* every lane of the warp gives v and names the lane whose v it gets back: one barrier,
 * the last lane to arrive moves the values */
uint64_t cuemu_shuffle(uint64_t v, int src);
int cuemu_lane(void);

static inline void __syncthreads(void)
{
    cuemu_sync_block();
}
static inline void __syncwarp(unsigned int mask = 0xffffffffu)
{
    (void)mask;
    cuemu_sync_warp();
}
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}

template <typename T, typename F> static inline T cuemu_exchange(T v, F src)
{
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    u = cuemu_shuffle(u, src(cuemu_lane()));
    T r;
    memcpy(&r, &u, sizeof(T));
    return r;
}

template <typename T> static inline T __shfl_sync(unsigned int mask, T v, int src, int width = 32)
{
    (void)mask;
    return cuemu_exchange(v, [&](int l) { return (l & ~(width - 1)) + (src & (width - 1)); });
}
template <typename T>
static inline T __shfl_xor_sync(unsigned int mask, T v, int lm, int width = 32)
{
    (void)mask;
    return cuemu_exchange(v, [&](int l) {
        const int s = l ^ lm;
        return (s & ~(width - 1)) == (l & ~(width - 1)) ? s : l;
    });
}
template <typename T>
static inline T __shfl_up_sync(unsigned int mask, T v, unsigned int d, int width = 32)
{
    (void)mask;
    return cuemu_exchange(v, [&](int l) { return (l & (width - 1)) >= (int)d ? l - (int)d : l; });
}
template <typename T>
static inline T __shfl_down_sync(unsigned int mask, T v, unsigned int d, int width = 32)
{
    (void)mask;
    return cuemu_exchange(
        v, [&](int l) { return (l & (width - 1)) + (int)d < width ? l + (int)d : l; });
}
unsigned int cuemu_ballot(int p);
static inline unsigned int __ballot_sync(unsigned int mask, int p)
{
    return cuemu_ballot(p) & mask;
}
static inline int __any_sync(unsigned int mask, int p)
{
    return __ballot_sync(mask, p) != 0;
}
static inline int __all_sync(unsigned int mask, int p)
{
    return __ballot_sync(mask, p) == (mask & cuemu_ballot(1));
}
static inline unsigned int __activemask(void)
{
    return cuemu_ballot(1);
}

/* ---- atomics (one OS thread runs every fiber, and switches only at barriers); the
 * backend uses atomicAdd alone ---- */
template <typename T> static inline T atomicAdd(T *p, T v)
{
    const T o = *p;
    *p = o + v;
    return o;
}
/* ---- arithmetic intrinsics ---- */
static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
static inline float __fsub_rn(float a, float b)
{
    return a - b;
}
static inline float __fmul_rn(float a, float b)
{
    return a * b;
}
static inline float __fdiv_rn(float a, float b)
{
    return a / b;
}
static inline float __frcp_rn(float a)
{
    return 1.0f / a;
}
static inline float __fsqrt_rn(float a)
{
    return sqrtf(a);
}
static inline double __dadd_rn(double a, double b)
{
    return a + b;
}
static inline double __dmul_rn(double a, double b)
{
    return a * b;
}
static inline float __fdividef(float a, float b)
{
    return a / b;
}
static inline float __saturatef(float a)
{
    return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a;
}
static inline float rsqrtf(float a)
{
    return 1.0f / sqrtf(a);
}
static inline double rsqrt(double a)
{
    return 1.0 / sqrt(a);
}
static inline int __float2int_rn(float a)
{
    return (int)nearbyintf(a);
}
static inline int __float2int_rz(float a)
{
    return (int)a;
}
/* the bits of a as a To (same size) */
template <typename To, typename From> static inline To cuemu_bits(From a)
{
    static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
    To r;
    memcpy(&r, &a, sizeof(To));
    return r;
}
static inline int __float_as_int(float a)
{
    return cuemu_bits<int>(a);
}
static inline unsigned int __float_as_uint(float a)
{
    return cuemu_bits<unsigned int>(a);
}
static inline float __int_as_float(int a)
{
    return cuemu_bits<float>(a);
}
static inline float __uint_as_float(unsigned int a)
{
    return cuemu_bits<float>(a);
}
static inline double __longlong_as_double(long long a)
{
    return cuemu_bits<double>(a);
}
static inline long long __double_as_longlong(double a)
{
    return cuemu_bits<long long>(a);
}
static inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int s)
{
    const uint64_t x = ((uint64_t)hi << 32) | lo;
    return (unsigned int)(x >> (s & 31));
}
static inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int s)
{
    const uint64_t x = ((uint64_t)hi << 32) | lo;
    return (unsigned int)((x << (s & 31)) >> 32);
}
static inline int __dp4a(int a, int b, int c)
{
    for (int i = 0; i < 4; i++)
        c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline int __popc(unsigned int x)
{
    return __builtin_popcount(x);
}
static inline int __popcll(unsigned long long x)
{
    return __builtin_popcountll(x);
}
static inline int __clz(int x)
{
    return x == 0 ? 32 : __builtin_clz((unsigned int)x);
}
static inline int __ffs(int x)
{
    return __builtin_ffs(x);
}
template <typename T> static inline T __ldg(const T *p)
{
    return *p;
}
template <typename T> static inline T __ldcs(const T *p) /* a cache hint: a plain load here */
{
    return *p;
}
template <typename T> static inline T __ldcg(const T *p) /* likewise */
{
    return *p;
}

/* CUDA's min and max overloads (device code calls them unqualified) */
#define CUEMU_MINMAX(T)                                                                            \
    static inline T min(T a, T b)                                                                  \
    {                                                                                              \
        return a < b ? a : b;                                                                      \
    }                                                                                              \
    static inline T max(T a, T b)                                                                  \
    {                                                                                              \
        return a > b ? a : b;                                                                      \
    }
CUEMU_MINMAX(int)
CUEMU_MINMAX(unsigned int)
CUEMU_MINMAX(long)
CUEMU_MINMAX(unsigned long)
CUEMU_MINMAX(long long)
CUEMU_MINMAX(unsigned long long)
CUEMU_MINMAX(float)
CUEMU_MINMAX(double)
#undef CUEMU_MINMAX

/* ---- the runtime's types ---- */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorLaunchFailure = 719,
} cudaError_t;
typedef struct cuemu_stream *cudaStream_t;
typedef struct cuemu_event *cudaEvent_t;
typedef struct cuemu_graph *cudaGraph_t;
typedef struct cuemu_graph *cudaGraphExec_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
#define cudaStreamNonBlocking 0x01
#define cudaStreamDefault 0x00
#define cudaHostRegisterDefault 0x00

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaMalloc(void **p, size_t n);
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t n)
{
    return cudaMalloc((void **)p, n);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st = 0);
cudaError_t cudaMemset(void *d, int v, size_t n);
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st = 0);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int prio);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F, enum cudaFuncAttribute, int)
{
    return cudaSuccess;
}
/* the emulation has no registers to count: a full SM's threads */
template <typename F>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F, int block,
                                                                        size_t shared)
{
    (void)shared;
    *n = block > 0 ? 2048 / block : 0;
    return cudaSuccess;
}

/* ---- launches ---- */

/* A closure the runtime runs once for every thread of every block, or records while its
 * stream is being captured. */
struct cuemu_task {
    virtual ~cuemu_task() {}
    virtual void run_thread() = 0;
};
cudaError_t cuemu_launch(dim3 grid, dim3 block, size_t shared, cudaStream_t st, cuemu_task *t);
/* the dynamic shared memory of the running block */
void *cuemu_dyn_shared(void);

template <typename... P> struct cuemu_kernel_task : cuemu_task {
    void (*fn)(P...);
    std::tuple<typename std::decay<P>::type...> args;
    template <typename Tup> cuemu_kernel_task(void (*f)(P...), Tup &&a) : fn(f), args(a) {}
    void run_thread() override { std::apply(fn, args); }
};

template <typename... A> struct cuemu_pending {
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
    std::tuple<A...> args;
};

struct cuemu_cfg_t {
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
    template <typename... A> cuemu_pending<typename std::decay<A>::type...> operator()(A &&...a)
    {
        return {grid, block, shared, stream,
                std::tuple<typename std::decay<A>::type...>(std::forward<A>(a)...)};
    }
};
static inline cuemu_cfg_t cuemu_cfg(dim3 g, dim3 b, size_t shared = 0, cudaStream_t st = 0)
{
    return cuemu_cfg_t{g, b, shared, st};
}

/* `kernel * cuemu_cfg(...)(args)`: what `kernel<<<...>>>(args)` was */
template <typename... P, typename... A>
static inline void operator*(void (*fn)(P...), cuemu_pending<A...> &&x)
{
    static_assert(sizeof...(P) == sizeof...(A), "a launch's arguments must match its kernel");
    cuemu_launch(x.grid, x.block, x.shared, x.stream, new cuemu_kernel_task<P...>(fn, x.args));
}

#endif
