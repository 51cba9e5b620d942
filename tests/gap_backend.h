/* gap_backend.h: a test backend with gaps. It computes on the CPU but its supports_op says
 * no to a configurable set of ops — always, or only when a source is a non-contiguous view
 * (the shape of the original crash: SQR on a viewed k_conv). Its compute re-checks its own
 * verdict and refuses instead of running, as an honest backend must. It counts the bytes
 * it has allocated, so a test can show that a refused job allocated nothing. */
#ifndef LATHE_TESTS_GAP_BACKEND_H
#define LATHE_TESTS_GAP_BACKEND_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/backend.h"

struct gap_impl {
    struct lt_backend *cpu;
    bool gap_always[LT_OP_COUNT];   /* no, whatever the layout */
    bool gap_strided[LT_OP_COUNT];  /* no when a source is a non-contiguous view */
    size_t bytes_allocated;         /* ever */
    size_t mem_free;                /* what memory() reports free; 0: 4 GiB */
    size_t bytes_live;
    int n_computed;                 /* nodes run */
    /* scratch as a device's kernels take it (lt_backend_scratch_bytes): scratch_need bytes
     * for any graph with a node, of which scratch_held are held already; 0: none */
    size_t scratch_need, scratch_held;
};

static bool gap_verdict(struct lt_backend *be, const struct lt_tensor *node, char *reason,
                        size_t reason_size)
{
    struct gap_impl *g = be->impl;
    if (g->gap_always[node->op]) {
        snprintf(reason, reason_size, "%s has no kernel for %s", be->name, lt_op_name(node->op));
        return false;
    }
    if (g->gap_strided[node->op])
        for (int i = 0; i < LT_MAX_SRC; i++)
            if (node->src[i] && !lt_is_contiguous(node->src[i])) {
                snprintf(reason, reason_size, "source %d is %s", i, lt_layout_name(node->src[i]));
                return false;
            }
    return lt_cpu_supports_op(node, reason, reason_size);
}

static lt_status gap_buffer_alloc(struct lt_backend *be, size_t size, struct lt_buffer **out)
{
    struct gap_impl *g = be->impl;
    lt_status st = g->cpu->iface->buffer_alloc(g->cpu, size, out);
    if (st == LT_OK) {
        (*out)->backend = be;
        g->bytes_allocated += size;
        g->bytes_live += size;
    }
    return st;
}

static void gap_buffer_free(struct lt_buffer *buf)
{
    struct gap_impl *g = buf->backend->impl;
    g->bytes_live -= buf->size;
    buf->backend = g->cpu;
    lt_buffer_free(buf);
}

static lt_status gap_compute(struct lt_backend *be, struct lt_tensor *const *nodes, int n)
{
    struct gap_impl *g = be->impl;
    char reason[160];
    for (int i = 0; i < n; i++)
        if (!gap_verdict(be, nodes[i], reason, sizeof(reason)))
            return lt_fail(LT_ERR_UNSUPPORTED, "%s refuses %s '%s': %s", be->name,
                           lt_op_name(nodes[i]->op), nodes[i]->name, reason);
    g->n_computed += n;
    return lt_backend_compute(g->cpu, nodes, n);
}

static lt_status gap_memory(struct lt_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    size_t f = ((struct gap_impl *)be->impl)->mem_free;
    *free_bytes = f ? f : (size_t)1 << 32;
    *total_bytes = (size_t)1 << 33;
    return LT_OK;
}

static void gap_free(struct lt_backend *be)
{
    struct gap_impl *g = be->impl;
    lt_backend_free(g->cpu);
    free(g);
    free(be);
}

static lt_status gap_tensor_set(struct lt_tensor *t, const void *src, size_t off, size_t n)
{
    memcpy((char *)t->data + off, src, n);
    return LT_OK;
}

static lt_status gap_tensor_get(const struct lt_tensor *t, void *dst, size_t off, size_t n)
{
    memcpy(dst, (const char *)t->data + off, n);
    return LT_OK;
}

static size_t gap_scratch_bytes(struct lt_backend *be, struct lt_tensor *const *nodes, int n,
                                size_t *held)
{
    (void)nodes;
    struct gap_impl *g = be->impl;
    *held = g->scratch_held;
    return n > 0 && g->scratch_need > g->scratch_held ? g->scratch_need : g->scratch_held;
}

static const struct lt_backend_iface gap_iface = {
    .supports_op = gap_verdict,
    .buffer_alloc = gap_buffer_alloc,
    .buffer_free = gap_buffer_free,
    .tensor_set = gap_tensor_set,
    .tensor_get = gap_tensor_get,
    .compute = gap_compute,
    .memory = gap_memory,
    .free = gap_free,
    .scratch_bytes = gap_scratch_bytes,
};

static struct lt_backend *gap_backend_new(const char *name)
{
    struct lt_backend *be = calloc(1, sizeof(*be));
    struct gap_impl *g = calloc(1, sizeof(*g));
    g->cpu = lt_backend_cpu_new(2);
    be->iface = &gap_iface;
    be->impl = g;
    be->is_host = true;
    snprintf(be->name, sizeof(be->name), "%s", name);
    return be;
}

static struct gap_impl *gap_of(struct lt_backend *be) { return be->impl; }

#endif
