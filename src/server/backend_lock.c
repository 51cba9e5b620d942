/* backend_lock.c: one device backend shared by two threads (the decode loop and a training
 * job), each call made under one mutex.
 *
 * A device backend keeps per-instance state between calls (its stream, cuBLAS handle and
 * scratch buffers), so two threads must not compute on it at once; and the model's weights
 * live in that one backend's buffers, which a second instance would not recognise as its
 * own. The proxy is therefore the same backend, not a copy: it shares the inner backend's
 * impl, name and host flag, so buffers it allocates name the proxy as their backend and the
 * inner functions find their context through it; only every entry point is wrapped in a
 * (recursive) lock. Everyone uses the proxy; the inner backend outlives it and is freed by
 * its owner. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "server/engine_impl.h"

struct locked_backend {
    struct lt_backend be; /* first: the proxy itself */
    const struct lt_backend_iface *inner;
    pthread_mutex_t mu;
};

static struct locked_backend *lb_of(struct lt_backend *be)
{
    return (struct locked_backend *)be;
}

static bool lb_supports_op(struct lt_backend *be, const struct lt_tensor *node, char *reason,
                           size_t reason_size)
{
    struct locked_backend *lb = lb_of(be);
    pthread_mutex_lock(&lb->mu);
    bool ok = lb->inner->supports_op(be, node, reason, reason_size);
    pthread_mutex_unlock(&lb->mu);
    return ok;
}

static lt_status lb_buffer_alloc(struct lt_backend *be, size_t size, struct lt_buffer **out)
{
    struct locked_backend *lb = lb_of(be);
    pthread_mutex_lock(&lb->mu);
    lt_status st = lb->inner->buffer_alloc(be, size, out);
    pthread_mutex_unlock(&lb->mu);
    return st;
}

static void lb_buffer_free(struct lt_buffer *buf)
{
    struct locked_backend *lb = lb_of(buf->backend);
    pthread_mutex_lock(&lb->mu);
    lb->inner->buffer_free(buf);
    pthread_mutex_unlock(&lb->mu);
}

static lt_status lb_tensor_set(struct lt_tensor *t, const void *src, size_t offset, size_t size)
{
    struct locked_backend *lb = lb_of(t->buffer->backend);
    pthread_mutex_lock(&lb->mu);
    lt_status st = lb->inner->tensor_set(t, src, offset, size);
    pthread_mutex_unlock(&lb->mu);
    return st;
}

static lt_status lb_tensor_get(const struct lt_tensor *t, void *dst, size_t offset, size_t size)
{
    struct locked_backend *lb = lb_of(t->buffer->backend);
    pthread_mutex_lock(&lb->mu);
    lt_status st = lb->inner->tensor_get(t, dst, offset, size);
    pthread_mutex_unlock(&lb->mu);
    return st;
}

static lt_status lb_compute(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes)
{
    struct locked_backend *lb = lb_of(be);
    pthread_mutex_lock(&lb->mu);
    lt_status st = lb->inner->compute(be, nodes, n_nodes);
    /* finish the queued work before another thread queues its own */
    if (st == LT_OK && lb->inner->synchronize)
        st = lb->inner->synchronize(be);
    pthread_mutex_unlock(&lb->mu);
    return st;
}

static lt_status lb_synchronize(struct lt_backend *be)
{
    struct locked_backend *lb = lb_of(be);
    pthread_mutex_lock(&lb->mu);
    lt_status st = lb->inner->synchronize ? lb->inner->synchronize(be) : LT_OK;
    pthread_mutex_unlock(&lb->mu);
    return st;
}

static lt_status lb_memory(struct lt_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    struct locked_backend *lb = lb_of(be);
    pthread_mutex_lock(&lb->mu);
    lt_status st = lb->inner->memory(be, free_bytes, total_bytes);
    pthread_mutex_unlock(&lb->mu);
    return st;
}

static void lb_free(struct lt_backend *be)
{
    struct locked_backend *lb = lb_of(be);
    pthread_mutex_destroy(&lb->mu);
    free(lb); /* the inner backend is its owner's to free */
}

static const struct lt_backend_iface locked_iface = {
    .supports_op = lb_supports_op,
    .buffer_alloc = lb_buffer_alloc,
    .buffer_free = lb_buffer_free,
    .tensor_set = lb_tensor_set,
    .tensor_get = lb_tensor_get,
    .compute = lb_compute,
    .synchronize = lb_synchronize,
    .memory = lb_memory,
    .free = lb_free,
};

struct lt_backend *srv_backend_locked_new(struct lt_backend *inner)
{
    struct locked_backend *lb = calloc(1, sizeof(*lb));
    if (!lb)
        return NULL;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    int rc = pthread_mutex_init(&lb->mu, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) {
        free(lb);
        return NULL;
    }
    lb->inner = inner->iface;
    lb->be.iface = &locked_iface;
    memcpy(lb->be.name, inner->name, sizeof(lb->be.name));
    lb->be.is_host = inner->is_host;
    lb->be.impl = inner->impl;
    return &lb->be;
}
