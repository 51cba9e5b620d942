/* cuda_emu.h: CUDA0 emulated on the CPU, for placement tests on machines without a GPU.
 *
 * The backend computes with the CPU but answers supports_op with the CUDA backend's own
 * preconditions (lt_cuda_verdict, which reads types, shapes and strides only), and its
 * memory counts as device memory (is_host false). So the scheduler makes exactly the
 * placement, fallbacks and copies that a graph on {CUDA0, CPU} gets on a GPU. Its compute
 * refuses, as CUDA's does, a node the verdict refuses and a source outside its memory. In a
 * build without CUDA the verdict is always no (check lt_cuda_compiled first). */
#ifndef LATHE_TESTS_CUDA_EMU_H
#define LATHE_TESTS_CUDA_EMU_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_verdict.h"
#include "lathe/backend.h"
#include "ops/op.h"

struct emu {
    struct lt_backend *cpu;
    int n_refused_runs; /* compute calls that met a node CUDA would refuse (must stay 0) */
};

static bool emu_supports(struct lt_backend *be, const struct lt_tensor *node, char *reason,
                         size_t reason_size)
{
    (void)be;
    return lt_cuda_verdict(node, reason, reason_size) &&
           lt_cpu_supports_op(node, reason, reason_size);
}

static lt_status emu_buffer_alloc(struct lt_backend *be, size_t size, struct lt_buffer **out)
{
    struct emu *e = be->impl;
    lt_status st = e->cpu->iface->buffer_alloc(e->cpu, size, out);
    if (st == LT_OK)
        (*out)->backend = be;
    return st;
}

static void emu_buffer_free(struct lt_buffer *buf)
{
    struct emu *e = buf->backend->impl;
    buf->backend = e->cpu;
    lt_buffer_free(buf);
}

static lt_status emu_set(struct lt_tensor *t, const void *src, size_t off, size_t n)
{
    memcpy((char *)t->data + off, src, n);
    return LT_OK;
}

static lt_status emu_get(const struct lt_tensor *t, void *dst, size_t off, size_t n)
{
    memcpy(dst, (const char *)t->data + off, n);
    return LT_OK;
}

/* As CUDA's compute does: refuse a node the verdict refuses, and a source outside this
 * backend's memory (the scheduler must have copied it). */
static lt_status emu_compute(struct lt_backend *be, struct lt_tensor *const *nodes, int n)
{
    struct emu *e = be->impl;
    char reason[160];
    for (int i = 0; i < n; i++) {
        const struct lt_tensor *node = nodes[i];
        if (!emu_supports(be, node, reason, sizeof(reason))) {
            e->n_refused_runs++;
            return lt_fail(LT_ERR_UNSUPPORTED, "emulated CUDA0 refuses %s '%s': %s",
                           lt_op_name(node->op), node->name, reason);
        }
        for (int k = 0; k < LT_MAX_SRC; k++) {
            const struct lt_tensor *s = node->src[k];
            if (!s || node->op == LT_OP_VIEW || node->op == LT_OP_RESHAPE ||
                node->op == LT_OP_PERMUTE || node->op == LT_OP_TRANSPOSE || node->op == LT_OP_NONE)
                continue;
            const struct lt_tensor *r = s->view_src ? s->view_src : s;
            if (!r->buffer || r->buffer->backend != be)
                return lt_fail(LT_ERR_INVALID, "%s '%s': source %d '%s' is not in device memory",
                               lt_op_name(node->op), node->name, k, s->name);
        }
    }
    return lt_backend_compute(e->cpu, nodes, n);
}

static lt_status emu_memory(struct lt_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    (void)be;
    *free_bytes = (size_t)1 << 32;
    *total_bytes = (size_t)1 << 33;
    return LT_OK;
}

static void emu_free(struct lt_backend *be)
{
    struct emu *e = be->impl;
    lt_backend_free(e->cpu);
    free(e);
    free(be);
}

static const struct lt_backend_iface emu_iface = {
    .supports_op = emu_supports,
    .buffer_alloc = emu_buffer_alloc,
    .buffer_free = emu_buffer_free,
    .tensor_set = emu_set,
    .tensor_get = emu_get,
    .compute = emu_compute,
    .memory = emu_memory,
    .free = emu_free,
};

static struct lt_backend *emu_new(void)
{
    struct lt_backend *be = calloc(1, sizeof(*be));
    struct emu *e = calloc(1, sizeof(*e));
    if (!be || !e) {
        free(be);
        free(e);
        return NULL;
    }
    e->cpu = lt_backend_cpu_new(2);
    be->iface = &emu_iface;
    be->impl = e;
    be->is_host = false;
    snprintf(be->name, sizeof(be->name), "CUDA0-emulated");
    return be;
}

#endif
