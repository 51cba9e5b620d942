/* refusal.c: the refusal value and its sentence. The sentence ends by saying that nothing
 * was allocated, which admission guarantees: refusals are decided before any buffer. */
#include <stdio.h>
#include <string.h>

#include "lathe/refusal.h"

const char *lt_refusal_kind_name(enum lt_refusal_kind kind)
{
    static const char *const names[] = {
        [LT_REFUSAL_NONE] = "none",
        [LT_REFUSAL_NO_BACKWARD] = "no_backward",
        [LT_REFUSAL_NO_BACKEND] = "no_backend",
        [LT_REFUSAL_DEVICE_ONLY] = "device_only",
        [LT_REFUSAL_MEMORY] = "memory",
    };
    _Static_assert(sizeof(names) / sizeof(names[0]) == LT_REFUSAL_KIND_COUNT, "refusal names");
    return (int)kind >= 0 && kind < LT_REFUSAL_KIND_COUNT ? names[kind] : "?";
}

static const struct lt_tensor *blamed_source(const struct lt_tensor *node)
{
    for (int i = 0; i < LT_MAX_SRC; i++)
        if (node->src[i] && node->src[i]->view_src && !lt_is_contiguous(node->src[i]))
            return node->src[i];
    return node->src[0];
}

static void copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

void lt_refusal_set_node(struct lt_refusal *r, enum lt_refusal_kind kind,
                         const struct lt_tensor *node, const char *backend, const char *reason)
{
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    copy_str(r->op, sizeof(r->op), lt_op_name(node->op));
    copy_str(r->node, sizeof(r->node), node->name);
    const struct lt_tensor *src = blamed_source(node);
    if (src) {
        /* name the storage a view was cut from when the view itself is unnamed */
        const char *name = src->name;
        char base[LT_MAX_NAME];
        if (strstr(name, " (view)") || strstr(name, " (cont)")) {
            copy_str(base, sizeof(base), name);
            *strstr(base, " (") = '\0';
            name = base;
        }
        copy_str(r->source, sizeof(r->source), name);
        copy_str(r->source_layout, sizeof(r->source_layout), lt_layout_name(src));
    }
    copy_str(r->backend, sizeof(r->backend), backend);
    copy_str(r->reason, sizeof(r->reason), reason);
    lt_refusal_format(r);
}

void lt_refusal_format(struct lt_refusal *r)
{
    static const char tail[] = "; nothing was allocated and serving is unaffected";
    char where[256];
    if (r->source[0])
        snprintf(where, sizeof(where), "%s '%s' on '%s' (%s)", r->op, r->node, r->source,
                 r->source_layout);
    else
        snprintf(where, sizeof(where), "%s '%s'", r->op, r->node);
    switch (r->kind) {
    case LT_REFUSAL_NO_BACKWARD:
        snprintf(r->sentence, sizeof(r->sentence),
                 "the training graph has an op with no backward rule on a path from a trainable "
                 "tensor to the loss: %s%s",
                 where, tail);
        break;
    case LT_REFUSAL_NO_BACKEND:
        snprintf(r->sentence, sizeof(r->sentence),
                 "the training graph has a node no backend can run (%s included): %s%s",
                 r->backend[0] ? r->backend : "CPU", where, tail);
        break;
    case LT_REFUSAL_DEVICE_ONLY:
        snprintf(r->sentence, sizeof(r->sentence),
                 "the training graph has a node %s can't run and device_only forbids the CPU "
                 "fallback: %s (%s: %s)%s",
                 r->backend, where, r->backend, r->reason, tail);
        break;
    case LT_REFUSAL_MEMORY:
        snprintf(r->sentence, sizeof(r->sentence),
                 "the training graph needs %.1f MiB at its peak on %s, over the budget of %.1f "
                 "MiB%s",
                 (double)r->need_bytes / (1 << 20), r->backend[0] ? r->backend : "CPU",
                 (double)r->budget_bytes / (1 << 20), tail);
        break;
    default:
        copy_str(r->sentence, sizeof(r->sentence), "");
    }
}
