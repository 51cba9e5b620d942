/* backend.h: what a backend is (a small vtable), and the CPU backend.
 *
 * supports_op is the one place that knows what a backend can run. A backend's compute
 * must check the same precondition before it runs a node and return LT_ERR_UNSUPPORTED
 * (never abort) when it fails, so a claim and a kernel cannot disagree. */
#ifndef LATHE_BACKEND_H
#define LATHE_BACKEND_H

#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct lt_backend;

/* A block of backend memory. base is a host pointer for host backends, a device
 * pointer otherwise. */
struct lt_buffer {
    struct lt_backend *backend;
    void *base;
    size_t size;
};

struct lt_backend_iface {
    /* true with reason untouched, or false with reason ("source 0 is a non-contiguous view") */
    bool (*supports_op)(struct lt_backend *be, const struct lt_tensor *node, char *reason,
                        size_t reason_size);
    lt_status (*buffer_alloc)(struct lt_backend *be, size_t size, struct lt_buffer **out);
    void (*buffer_free)(struct lt_buffer *buf);
    /* copies between host memory and a tensor's storage (t->data in t->buffer) */
    lt_status (*tensor_set)(struct lt_tensor *t, const void *src, size_t offset, size_t size);
    lt_status (*tensor_get)(const struct lt_tensor *t, void *dst, size_t offset, size_t size);
    /* runs nodes in order; each node's data and its sources' data are in this backend */
    lt_status (*compute)(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes);
    lt_status (*synchronize)(struct lt_backend *be); /* optional */
    lt_status (*memory)(struct lt_backend *be, size_t *free_bytes, size_t *total_bytes);
    void (*free)(struct lt_backend *be);
    /* optional: make host memory [ptr, ptr + size) quicker to copy to and from (CUDA: page-
     * locked, so a copy goes by DMA instead of through the driver's staging buffers);
     * host_unpin(ptr) undoes it, before the memory is freed */
    lt_status (*host_pin)(struct lt_backend *be, void *ptr, size_t size);
    void (*host_unpin)(struct lt_backend *be, void *ptr);
    /* optional: the bytes of working memory (scratch) the backend would hold, beyond the
     * graph's buffers, after running nodes: each kernel's own buffers, grown to the
     * largest node's need; *held: what it holds now (part of the result) */
    size_t (*scratch_bytes)(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes,
                            size_t *held);
};

struct lt_backend {
    const struct lt_backend_iface *iface;
    char name[32]; /* "CPU", "CUDA0" */
    bool is_host;  /* data pointers are host addresses */
    void *impl;
};

bool lt_backend_supports_op(struct lt_backend *be, const struct lt_tensor *node, char *reason,
                            size_t reason_size);
lt_status lt_backend_buffer_alloc(struct lt_backend *be, size_t size, struct lt_buffer **out);
void lt_buffer_free(struct lt_buffer *buf);
lt_status lt_backend_compute(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes);
lt_status lt_backend_memory(struct lt_backend *be, size_t *free_bytes, size_t *total_bytes);
void lt_backend_free(struct lt_backend *be);
/* The backend's scratch after running nodes, and what it holds now (both 0 without any). */
size_t lt_backend_scratch_bytes(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes,
                                size_t *held);
/* Pins host memory that the backend's copies will use often (an engine's logits): true when
 * it is pinned, false (nothing changed, copies work as before) when the backend has no such
 * thing or refuses. Unpin exactly what was pinned, before freeing it. */
bool lt_backend_host_pin(struct lt_backend *be, void *ptr, size_t size);
void lt_backend_host_unpin(struct lt_backend *be, void *ptr);

/* Copies to or from a tensor wherever its storage is (host arena or a backend buffer). */
lt_status lt_tensor_set(struct lt_tensor *t, const void *src, size_t offset, size_t size);
lt_status lt_tensor_get(const struct lt_tensor *t, void *dst, size_t offset, size_t size);

/* ---- the CPU backend: every op, every layout its kernels accept (float32 oracle) ---- */

/* n_threads <= 0: the machine's cores. */
struct lt_backend *lt_backend_cpu_new(int n_threads);
int lt_backend_cpu_threads(struct lt_backend *be);

/* Evaluates a graph whose tensors have host data (e.g. a context without no_alloc) on
 * the CPU backend. Views are skipped; every other node must pass the CPU precondition. */
lt_status lt_cpu_graph_compute(struct lt_backend *cpu, struct lt_graph *g);

/* The CPU verdict for one node (used by the CPU backend and by test backends). */
bool lt_cpu_supports_op(const struct lt_tensor *node, char *reason, size_t reason_size);

#ifdef __cplusplus
}
#endif
#endif
