/* cpu_backend.c: the CPU backend. Kernels live with their ops (src/ops/); this file holds
 * host buffers, the verdict (the op's own cpu_supported precondition) and the loop that
 * runs a list of nodes on the thread pool, one barrier between nodes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/threadpool.h"
#include "lathe/backend.h"
#include "ops/op.h"

struct cpu_impl {
    struct lt_threadpool *pool;
    void *work;
    size_t work_size;
};

bool lt_cpu_supports_op(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->op < 0 || node->op >= LT_OP_COUNT) {
        snprintf(reason, reason_size, "unknown op %d", (int)node->op);
        return false;
    }
    const struct lt_op_def *def = lt_op_def(node->op);
    if (lt_op_is_view(node->op))
        return true;
    if (!def->cpu_forward) {
        snprintf(reason, reason_size, "the CPU has no kernel for %s", def->name);
        return false;
    }
    if (def->cpu_supported && !def->cpu_supported(node, reason, reason_size))
        return false;
    return true;
}

static bool cpu_supports_op(struct lt_backend *be, const struct lt_tensor *node, char *reason,
                            size_t reason_size)
{
    (void)be;
    return lt_cpu_supports_op(node, reason, reason_size);
}

static lt_status cpu_buffer_alloc(struct lt_backend *be, size_t size, struct lt_buffer **out)
{
    struct lt_buffer *buf = calloc(1, sizeof(*buf));
    if (!buf)
        return lt_fail(LT_ERR_NOMEM, "out of host memory");
    buf->base = aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (!buf->base && size > 0) {
        free(buf);
        return lt_fail(LT_ERR_NOMEM, "out of host memory allocating a %zu-byte CPU buffer", size);
    }
    buf->backend = be;
    buf->size = size;
    *out = buf;
    return LT_OK;
}

static void cpu_buffer_free(struct lt_buffer *buf)
{
    free(buf->base);
    free(buf);
}

static lt_status cpu_tensor_set(struct lt_tensor *t, const void *src, size_t offset, size_t size)
{
    memcpy((char *)t->data + offset, src, size);
    return LT_OK;
}

static lt_status cpu_tensor_get(const struct lt_tensor *t, void *dst, size_t offset, size_t size)
{
    memcpy(dst, (const char *)t->data + offset, size);
    return LT_OK;
}

struct compute_job {
    struct lt_tensor *const *nodes;
    int n_nodes;
    void *work;
    size_t work_size;
    struct lt_barrier *barrier;
};

static void compute_thread(void *arg, int ith, int nth)
{
    struct compute_job *job = arg;
    struct lt_compute_params p = {
        .ith = ith, .nth = nth, .wdata = job->work, .wsize = job->work_size, .barrier = job->barrier};
    for (int i = 0; i < job->n_nodes; i++) {
        struct lt_tensor *node = job->nodes[i];
        if (lt_op_is_view(node->op))
            continue;
        lt_op_def(node->op)->cpu_forward(&p, node);
        lt_compute_barrier(&p);
    }
}

static lt_status cpu_compute(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes)
{
    struct cpu_impl *impl = be->impl;
    int nth = lt_threadpool_size(impl->pool);
    size_t need = 0;
    char reason[LT_REASON_MAX];
    for (int i = 0; i < n_nodes; i++) {
        struct lt_tensor *node = nodes[i];
        if (lt_op_is_view(node->op))
            continue;
        if (!lt_cpu_supports_op(node, reason, sizeof(reason)))
            return lt_fail(LT_ERR_UNSUPPORTED, "CPU cannot run %s '%s': %s", lt_op_name(node->op),
                           node->name, reason);
        if (!node->data)
            return lt_fail(LT_ERR_INVALID, "node '%s' has no storage", node->name);
        const struct lt_op_def *def = lt_op_def(node->op);
        size_t w = def->cpu_work_size ? def->cpu_work_size(node, nth) : 0;
        if (w > need)
            need = w;
    }
    if (need > impl->work_size) {
        void *w = aligned_alloc(64, (need + 63) & ~(size_t)63);
        if (!w)
            return lt_fail(LT_ERR_NOMEM, "out of host memory for %zu bytes of CPU scratch", need);
        free(impl->work);
        impl->work = w;
        impl->work_size = need;
    }
    struct compute_job job = {nodes, n_nodes, impl->work, impl->work_size,
                              lt_threadpool_barrier(impl->pool)};
    lt_threadpool_run(impl->pool, compute_thread, &job);
    return LT_OK;
}

static lt_status cpu_memory(struct lt_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    (void)be;
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    *total_bytes = (size_t)pages * (size_t)page;
    *free_bytes = (size_t)avail * (size_t)page;
    return LT_OK;
}

static void cpu_free(struct lt_backend *be)
{
    struct cpu_impl *impl = be->impl;
    lt_threadpool_free(impl->pool);
    free(impl->work);
    free(impl);
    free(be);
}

static const struct lt_backend_iface cpu_iface = {
    .supports_op = cpu_supports_op,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .tensor_set = cpu_tensor_set,
    .tensor_get = cpu_tensor_get,
    .compute = cpu_compute,
    .memory = cpu_memory,
    .free = cpu_free,
};

struct lt_backend *lt_backend_cpu_new(int n_threads)
{
    if (n_threads <= 0) {
        const char *env = getenv("LATHE_THREADS");
        n_threads = env ? atoi(env) : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (n_threads <= 0)
            n_threads = 1;
    }
    struct lt_backend *be = calloc(1, sizeof(*be));
    struct cpu_impl *impl = calloc(1, sizeof(*impl));
    if (!be || !impl)
        goto out_free;
    impl->pool = lt_threadpool_new(n_threads);
    if (!impl->pool)
        goto out_free;
    be->iface = &cpu_iface;
    be->impl = impl;
    be->is_host = true;
    snprintf(be->name, sizeof(be->name), "CPU");
    return be;
out_free:
    free(impl);
    free(be);
    lt_fail(LT_ERR_NOMEM, "cannot start the CPU backend");
    return NULL;
}

int lt_backend_cpu_threads(struct lt_backend *be)
{
    return lt_threadpool_size(((struct cpu_impl *)be->impl)->pool);
}

lt_status lt_cpu_graph_compute(struct lt_backend *cpu, struct lt_graph *g)
{
    return cpu_compute(cpu, g->nodes, g->n_nodes);
}
