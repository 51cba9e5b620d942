/* backend.c: thin dispatch through a backend's vtable. */
#include <string.h>

#include "lathe/backend.h"

bool lt_backend_supports_op(struct lt_backend *be, const struct lt_tensor *node, char *reason,
                            size_t reason_size)
{
    return be->iface->supports_op(be, node, reason, reason_size);
}

lt_status lt_backend_buffer_alloc(struct lt_backend *be, size_t size, struct lt_buffer **out)
{
    return be->iface->buffer_alloc(be, size, out);
}

void lt_buffer_free(struct lt_buffer *buf)
{
    if (buf)
        buf->backend->iface->buffer_free(buf);
}

lt_status lt_backend_compute(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes)
{
    return be->iface->compute(be, nodes, n_nodes);
}

lt_status lt_backend_memory(struct lt_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    return be->iface->memory(be, free_bytes, total_bytes);
}

size_t lt_backend_scratch_bytes(struct lt_backend *be, struct lt_tensor *const *nodes, int n_nodes,
                                size_t *held)
{
    *held = 0;
    return be->iface->scratch_bytes ? be->iface->scratch_bytes(be, nodes, n_nodes, held) : 0;
}

void lt_backend_free(struct lt_backend *be)
{
    if (be)
        be->iface->free(be);
}

bool lt_backend_host_pin(struct lt_backend *be, void *ptr, size_t size)
{
    return be && ptr && size > 0 && be->iface->host_pin &&
           be->iface->host_pin(be, ptr, size) == LT_OK;
}

void lt_backend_host_unpin(struct lt_backend *be, void *ptr)
{
    if (be && ptr && be->iface->host_unpin)
        be->iface->host_unpin(be, ptr);
}

lt_status lt_tensor_set(struct lt_tensor *t, const void *src, size_t offset, size_t size)
{
    if (!t->data)
        return lt_fail(LT_ERR_INVALID, "tensor '%s' has no storage yet", t->name);
    if (offset + size > lt_nbytes(t))
        return lt_fail(LT_ERR_INVALID, "write of %zu bytes at %zu past the end of '%s'", size,
                       offset, t->name);
    if (!t->buffer || t->buffer->backend->is_host) {
        memcpy((char *)t->data + offset, src, size);
        return LT_OK;
    }
    return t->buffer->backend->iface->tensor_set(t, src, offset, size);
}

lt_status lt_tensor_get(const struct lt_tensor *t, void *dst, size_t offset, size_t size)
{
    if (!t->data)
        return lt_fail(LT_ERR_INVALID, "tensor '%s' has no storage yet", t->name);
    if (offset + size > lt_nbytes(t))
        return lt_fail(LT_ERR_INVALID, "read of %zu bytes at %zu past the end of '%s'", size,
                       offset, t->name);
    if (!t->buffer || t->buffer->backend->is_host) {
        memcpy(dst, (const char *)t->data + offset, size);
        return LT_OK;
    }
    return t->buffer->backend->iface->tensor_get(t, dst, offset, size);
}
