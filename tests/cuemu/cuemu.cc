/* cuemu.cc: the runtime of the CPU emulation of CUDA (see include/cuemu_core.h): the
 * fibers that run a block's threads, their barriers, device memory, streams, events,
 * graphs and the cuBLAS products. A test tool, never part of lathe. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include <map>
#include <memory>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

uint3 cuemu_thread_idx, cuemu_block_idx;
dim3 cuemu_block_dim, cuemu_grid_dim;

static cudaError_t last_error = cudaSuccess;

static cudaError_t fail(cudaError_t e)
{
    if (last_error == cudaSuccess)
        last_error = e;
    return e;
}

/* ---- fibers ---- */

/* emu_switch(save, to): saves the callee-saved registers on the current stack, stores the
 * stack pointer in *save, and resumes the context whose stack pointer is `to` (one saved the
 * same way, or a fresh frame from fiber_frame). The FP control words (MXCSR, x87) are not
 * switched: nothing the emulation runs changes them, so every fiber keeps the thread's.
 * (Saving and loading them took about a third of a switch; the emulated conformance suite
 * switches fibers at every warp collective.) */
extern "C" void cuemu_switch(void **save, void *to);
#if defined(__x86_64__)
asm(".text\n"
    ".globl cuemu_switch\n"
    ".type cuemu_switch,@function\n"
    "cuemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size cuemu_switch, .-cuemu_switch\n");
#else
#error "the CUDA emulation switches fibers with x86-64 code"
#endif

enum fiber_state { F_RUNNABLE, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE };

struct fiber {
    void *sp;
    char *stack; /* lowest address of its mapping (a guard page, then the stack) */
    enum fiber_state state;
    uint3 idx;
    int warp, lane;
};

struct warp_state {
    int live, arrived;
    uint64_t slot[32], out[32]; /* a shuffle's values in, and each lane's result */
    int src[32];                /* the lane each lane reads */
    void *ptrs[32][4];
};

#define STACK_BYTES (256u << 10)
#define GUARD_BYTES 4096u

static std::vector<fiber> fibers;
static std::vector<warp_state> warps;
static int cur = -1;             /* the running fiber */
static void *sched_sp;           /* the scheduler's saved stack pointer */
static cuemu_task *running_task; /* the launch whose block is running */
static int block_live, block_arrived;
static std::vector<unsigned char> dyn_shared;

static std::vector<int> ready; /* runnable fibers in the order they run: a FIFO */
static size_t ready_head;
static int block_threads; /* the running block's threads: fibers [0, block_threads) */

static void wake(fiber &g, int i)
{
    g.state = F_RUNNABLE;
    ready.push_back(i);
}

/* the block's barrier is complete: every waiter runs again */
static void release_block()
{
    block_arrived = 0;
    for (int i = 0; i < block_threads; i++)
        if (fibers[i].state == F_WAIT_BLOCK)
            wake(fibers[i], i);
}

/* warp wi's barrier is complete */
static void release_warp(int wi)
{
    warps[wi].arrived = 0;
    const int end = wi * 32 + 32 < block_threads ? wi * 32 + 32 : block_threads;
    for (int i = wi * 32; i < end; i++)
        if (fibers[i].state == F_WAIT_WARP)
            wake(fibers[i], i);
}

/* Leaves the running fiber (its stack pointer saved at *save) for the next runnable one,
 * without a stop in the scheduler (half the switches), or for the scheduler when none is
 * runnable. A fiber that leaves is never in the queue (it was taken off when it ran). */
static void switch_next(void **save)
{
    if (ready_head == ready.size()) {
        cuemu_switch(save, sched_sp);
        return;
    }
    const int i = ready[ready_head++];
    if (ready_head == ready.size()) /* drained: reuse the buffer */
        ready.clear(), ready_head = 0;
    cur = i;
    cuemu_thread_idx = fibers[i].idx;
    cuemu_switch(save, fibers[i].sp);
}

static void fiber_entry()
{
    for (;;) {
        running_task->run_thread();
        fiber &f = fibers[cur];
        f.state = F_DONE;
        block_live--;
        warps[f.warp].live--;
        /* a thread that ends no longer holds back the barriers its block and warp wait at */
        if (block_arrived > 0 && block_arrived == block_live)
            release_block();
        warp_state &w = warps[f.warp];
        if (w.arrived > 0 && w.arrived == w.live)
            release_warp(f.warp);
        switch_next(&f.sp);
    }
}

/* a fresh frame on fiber i's stack that cuemu_switch resumes into fiber_entry (see the
 * frame's layout in cuemu_switch: six registers, the return address). The stacks' tops
 * are staggered by 64 bytes a fiber: at the same offset in their mappings, every fiber's
 * saved registers would fall in one set of the L1 cache. */
static void fiber_frame(fiber &f, size_t i)
{
    uintptr_t top = (uintptr_t)(f.stack + STACK_BYTES + GUARD_BYTES - (i % 64) * 64) &
                    ~(uintptr_t)15;
    /* six registers, then the return address: fiber_entry starts at top - 8, as if called */
    uint64_t *sp = (uint64_t *)(top - 64);
    for (int r = 0; r < 6; r++)
        sp[r] = 0;
    sp[6] = (uint64_t)(uintptr_t)&fiber_entry;
    sp[7] = 0;
    f.sp = sp;
}

static void ensure_fibers(size_t n)
{
    while (fibers.size() < n) {
        fiber f = {};
        void *m = mmap(NULL, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "cuemu: cannot map a fiber's stack\n");
            abort();
        }
        mprotect(m, GUARD_BYTES, PROT_NONE);
        f.stack = (char *)m;
        fibers.push_back(f);
    }
}

static void yield_to_scheduler()
{
    switch_next(&fibers[cur].sp);
}

void cuemu_sync_block(void)
{
    block_arrived++;
    if (block_arrived == block_live) {
        release_block();
        return;
    }
    fibers[cur].state = F_WAIT_BLOCK;
    yield_to_scheduler();
}

void cuemu_sync_warp(void)
{
    cuemu_sync_warp_do(NULL);
}

void cuemu_sync_warp_do(void (*last)(void))
{
    const int wi = fibers[cur].warp;
    warp_state &w = warps[wi];
    w.arrived++;
    if (w.arrived == w.live) {
        if (last) {
            if (w.live != 32) {
                fprintf(stderr, "cuemu: a warp collective with %d of 32 lanes live\n", w.live);
                abort();
            }
            last();
        }
        release_warp(wi);
        return;
    }
    fibers[cur].state = F_WAIT_WARP;
    yield_to_scheduler();
}

int cuemu_lane(void)
{
    return fibers[cur].lane;
}

static void shuffle_all(void)
{
    warp_state &w = warps[fibers[cur].warp];
    for (int l = 0; l < 32; l++)
        w.out[l] = w.slot[w.src[l] & 31];
}

uint64_t cuemu_shuffle(uint64_t v, int src)
{
    const int lane = fibers[cur].lane;
    warp_state &w = warps[fibers[cur].warp];
    w.slot[lane] = v;
    w.src[lane] = src;
    cuemu_sync_warp_do(shuffle_all);
    return w.out[lane];
}

void **cuemu_warp_ptrs(int lane)
{
    return warps[fibers[cur].warp].ptrs[lane & 31];
}

unsigned int cuemu_ballot(int p)
{
    const int lane = cuemu_lane();
    warp_state &w = warps[fibers[cur].warp];
    w.slot[lane] = p != 0;
    cuemu_sync_warp();
    unsigned int r = 0;
    const int first = fibers[cur].warp * 32;
    for (int l = 0; l < 32; l++)
        if (first + l < (int)fibers.size() && fibers[first + l].state != F_DONE && w.slot[l])
            r |= 1u << l;
    cuemu_sync_warp();
    return r;
}

void *cuemu_dyn_shared(void)
{
    return dyn_shared.data();
}

/* every thread of every block of one launch, blocks in order */
static cudaError_t run_grid(dim3 g, dim3 b, size_t shared, cuemu_task *t)
{
    const size_t n = (size_t)b.x * b.y * b.z;
    if (n == 0 || n > 1024 || g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 || g.z > 65535 ||
        g.x > 0x7fffffffu || b.z > 64 || shared > 232448)
        return fail(cudaErrorInvalidConfiguration);
    ensure_fibers(n);
    const size_t n_fib = fibers.size();
    /* only the block's n fibers take part: mark the rest done */
    warps.assign((n + 31) / 32, warp_state{});
    dyn_shared.assign(shared + 128, 0xff);
    running_task = t;
    cuemu_grid_dim = g;
    cuemu_block_dim = b;
    for (unsigned int bz = 0; bz < g.z; bz++)
        for (unsigned int by = 0; by < g.y; by++)
            for (unsigned int bx = 0; bx < g.x; bx++) {
                cuemu_block_idx = uint3{bx, by, bz};
                memset(dyn_shared.data(), 0xff, dyn_shared.size());
                ready.clear();
                ready_head = 0;
                for (size_t i = 0; i < n_fib; i++) {
                    fiber &f = fibers[i];
                    if (i >= n) {
                        f.state = F_DONE;
                        continue;
                    }
                    f.state = F_RUNNABLE;
                    f.idx = uint3{(unsigned)(i % b.x), (unsigned)(i / b.x % b.y),
                                  (unsigned)(i / ((size_t)b.x * b.y))};
                    f.warp = (int)(i / 32);
                    f.lane = (int)(i % 32);
                    fiber_frame(f, i);
                    ready.push_back((int)i);
                }
                for (size_t w = 0; w < warps.size(); w++) {
                    warps[w].live = (int)(n - w * 32 < 32 ? n - w * 32 : 32);
                    warps[w].arrived = 0;
                }
                block_threads = (int)n;
                block_live = (int)n;
                block_arrived = 0;
                while (ready_head < ready.size()) {
                    const int i = ready[ready_head++];
                    if (ready_head == ready.size()) /* drained: reuse the buffer */
                        ready.clear(), ready_head = 0;
                    cur = i;
                    cuemu_thread_idx = fibers[i].idx;
                    cuemu_switch(&sched_sp, fibers[i].sp);
                }
                if (block_live > 0) {
                    fprintf(stderr,
                            "cuemu: deadlock in block (%u, %u, %u) of a launch of %zu threads: "
                            "every live thread waits at a barrier that cannot complete\n",
                            bx, by, bz, n);
                    abort();
                }
                cur = -1;
            }
    running_task = NULL;
    return cudaSuccess;
}

/* ---- streams, graphs, launches ---- */

/* one thing a stream runs: a launch's grid, or (host) a copy, memset or product run once */
struct recorded {
    std::shared_ptr<cuemu_task> task;
    dim3 grid, block;
    size_t shared;
    bool host;
};

static cudaError_t run_recorded(const recorded &r)
{
    if (r.host) {
        r.task->run_thread();
        return cudaSuccess;
    }
    return run_grid(r.grid, r.block, r.shared, r.task.get());
}

struct cuemu_graph {
    std::vector<recorded> items; /* launches, copies, memsets and products, in order */
};

struct cuemu_stream {
    bool capturing;
    cuemu_graph *graph;
};

static cuemu_stream default_stream;

static cuemu_stream *stream_of(cudaStream_t s)
{
    return s ? s : &default_stream;
}

/* a copy or memset as a one-thread task, so that a capture can record it */
struct host_task : cuemu_task {
    void *dst;
    const void *src;
    int value;
    size_t n;
    bool set;
    void run_thread() override
    {
        if (set)
            memset(dst, value, n);
        else
            memmove(dst, src, n);
    }
};

static cudaError_t submit(cudaStream_t s, dim3 g, dim3 b, size_t shared, cuemu_task *t, bool host)
{
    const recorded r = {std::shared_ptr<cuemu_task>(t), g, b, shared, host};
    cuemu_stream *st = stream_of(s);
    if (st->capturing) {
        st->graph->items.push_back(r);
        return cudaSuccess;
    }
    return run_recorded(r);
}

cudaError_t cuemu_launch(dim3 grid, dim3 block, size_t shared, cudaStream_t st, cuemu_task *t)
{
    return submit(st, grid, block, shared, t, false);
}

/* ---- the runtime API ---- */

static size_t mem_total()
{
    const char *e = getenv("LATHE_CUEMU_MEM_MIB");
    return (size_t)(e ? atol(e) : 16384) << 20;
}
static size_t mem_used;
static std::map<void *, size_t> allocations;

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d)
{
    return d == 0 ? cudaSuccess : fail(cudaErrorInvalidValue);
}
cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d)
{
    (void)d;
    switch (a) {
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 232448; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
/* CUEMU_TRACE=1: each call that allocates, frees or waits for the device on real hardware,
 * one line on stderr (what a loop of host code costs the device in stalls) */
static void trace(const char *what, size_t n)
{
    static int on = -1;
    if (on < 0)
        on = getenv("CUEMU_TRACE") != NULL;
    if (on)
        fprintf(stderr, "cuemu: %s %zu\n", what, n);
}
cudaError_t cudaDeviceSynchronize(void)
{
    trace("cudaDeviceSynchronize", 0);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}
const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}
const char *cudaGetErrorString(cudaError_t e)
{
    return cudaGetErrorName(e);
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    trace("cudaMalloc", n);
    if (n == 0)
        n = 1;
    if (mem_used + n > mem_total())
        return fail(cudaErrorMemoryAllocation);
    void *m = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!m)
        return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, n); /* NaN bytes: a kernel that reads what nobody wrote shows it */
    allocations[m] = n;
    mem_used += n;
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    trace("cudaFree", 0);
    if (!p)
        return cudaSuccess;
    auto it = allocations.find(p);
    if (it == allocations.end())
        return fail(cudaErrorInvalidValue);
    mem_used -= it->second;
    allocations.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    *total_b = mem_total();
    *free_b = mem_total() - mem_used;
    return cudaSuccess;
}

static cudaError_t host_op(cudaStream_t s, void *d, const void *src, int v, size_t n, bool set)
{
    host_task *t = new host_task;
    t->dst = d, t->src = src, t->value = v, t->n = n, t->set = set;
    return submit(s, dim3(1), dim3(1), 0, t, true);
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    trace("cudaMemcpy", n);
    (void)k;
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t st)
{
    trace(k == cudaMemcpyDeviceToHost   ? "cudaMemcpyAsync D2H"
          : k == cudaMemcpyHostToDevice ? "cudaMemcpyAsync H2D"
                                        : "cudaMemcpyAsync",
          n);
    return host_op(st, d, s, 0, n, false);
}
cudaError_t cudaMemset(void *d, int v, size_t n)
{
    trace("cudaMemset", n);
    memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st)
{
    return host_op(st, d, NULL, v, n, true);
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    *s = new cuemu_stream{false, NULL};
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    return cudaStreamCreate(s);
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int prio)
{
    (void)flags, (void)prio;
    return cudaStreamCreate(s);
}
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    *least = 0, *greatest = -5;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (s && s != &default_stream)
        delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    trace("cudaStreamSynchronize", 0);
    return stream_of(s)->capturing ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

struct cuemu_event {
    double t;
};
static double now_ms()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = new cuemu_event{0.0};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)s;
    e->t = now_ms();
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    trace("cudaEventSynchronize", 0);
    (void)e;
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags)
{
    (void)p, (void)n, (void)flags;
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p)
{
    (void)p;
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m)
{
    (void)m;
    cuemu_stream *st = stream_of(s);
    if (st->capturing)
        return fail(cudaErrorStreamCaptureUnsupported);
    st->capturing = true;
    st->graph = new cuemu_graph;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    cuemu_stream *st = stream_of(s);
    if (!st->capturing)
        return fail(cudaErrorInvalidValue);
    st->capturing = false;
    *g = st->graph;
    st->graph = NULL;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags)
{
    (void)flags;
    *e = new cuemu_graph(*g); /* shares the recorded tasks */
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
    if (stream_of(s)->capturing)
        return fail(cudaErrorStreamCaptureUnsupported);
    for (const recorded &r : e->items) {
        cudaError_t err = run_recorded(r);
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    delete e;
    return cudaSuccess;
}

/* ---- cuBLAS ---- */

struct cuemu_blas {
    cudaStream_t stream;
};

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new cuemu_blas{NULL};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
    (void)h, (void)m;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *w, size_t n)
{
    (void)h, (void)w, (void)n;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "success" : "failure (emulated cuBLAS)";
}
const char *cublasGetStatusName(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_SUPPORTED";
}

static float blas_load(const void *p, cudaDataType_t t, size_t i)
{
    switch (t) {
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* a stored matrix of `rows` x `cols` (column-major, leading dimension ld) as float */
static std::vector<float> blas_floats(const void *p, cudaDataType_t t, int rows, int cols, int ld)
{
    std::vector<float> f((size_t)ld * cols);
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++)
            f[(size_t)c * ld + r] = blas_load(p, t, (size_t)c * ld + r);
    return f;
}

/* the product C = alpha op(A) op(B) + beta C, as a task so that a capture records it */
struct gemm_task : cuemu_task {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc, batch;
    float alpha, beta;
    const void *A, *B;
    void *C;
    cudaDataType_t at, bt, ct;
    long long sa, sb, sc;
    void run_thread() override
    {
        const size_t ea = at == CUDA_R_32F ? 4 : 2, eb = bt == CUDA_R_32F ? 4 : 2,
                     ec = ct == CUDA_R_32F ? 4 : 2;
        for (int i = 0; i < batch; i++) {
            const char *a = (const char *)A + (size_t)(i * sa) * ea,
                       *b = (const char *)B + (size_t)(i * sb) * eb;
            char *c = (char *)C + (size_t)(i * sc) * ec;
            std::vector<float> fa =
                blas_floats(a, at, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda);
            std::vector<float> fb =
                blas_floats(b, bt, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb);
            std::vector<float> fc((size_t)ldc * n, 0.0f);
            if (beta != 0.0f)
                fc = blas_floats(c, ct, m, n, ldc);
            if (m > 0 && n > 0 && k > 0)
                cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                            tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, alpha,
                            fa.data(), lda, fb.data(), ldb, beta, fc.data(), ldc);
            else
                for (float &x : fc)
                    x *= beta;
            for (int col = 0; col < n; col++)
                for (int r = 0; r < m; r++) {
                    const size_t j = (size_t)col * ldc + r;
                    if (ct == CUDA_R_16F)
                        ((__half *)c)[j] = __float2half_rn(fc[j]);
                    else if (ct == CUDA_R_16BF)
                        ((__nv_bfloat16 *)c)[j] = __float2bfloat16_rn(fc[j]);
                    else
                        ((float *)c)[j] = fc[j];
                }
        }
    }
};

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType_t at,
                                          int lda, long long sa, const void *B, cudaDataType_t bt,
                                          int ldb, long long sb, const void *beta, void *C,
                                          cudaDataType_t ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t comp, cublasGemmAlgo_t algo)
{
    (void)comp, (void)algo;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || ldc < (m > 1 ? m : 1) ||
        lda < ((ta == CUBLAS_OP_N ? m : k) > 1 ? (ta == CUBLAS_OP_N ? m : k) : 1) ||
        ldb < ((tb == CUBLAS_OP_N ? k : n) > 1 ? (tb == CUBLAS_OP_N ? k : n) : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    gemm_task *t = new gemm_task;
    t->ta = ta, t->tb = tb, t->m = m, t->n = n, t->k = k, t->lda = lda, t->ldb = ldb;
    t->ldc = ldc, t->batch = batch, t->alpha = *(const float *)alpha;
    t->beta = *(const float *)beta, t->A = A, t->B = B, t->C = C, t->at = at, t->bt = bt;
    t->ct = ct, t->sa = sa, t->sb = sb, t->sc = sc;
    submit(h->stream, dim3(1), dim3(1), 0, t, true);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t at,
                            int lda, const void *B, cudaDataType_t bt, int ldb, const void *beta,
                            void *C, cudaDataType_t ct, int ldc, cublasComputeType_t comp,
                            cublasGemmAlgo_t algo)
{
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta,
                                      C, ct, ldc, 0, 1, comp, algo);
}
