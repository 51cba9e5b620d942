/* remat.c: activation checkpointing of a training graph, by rewriting it after autodiff.
 *
 * A model's forward pass is a chain of layers between boundaries: b[0] (the embeddings), b[1]
 * (the residual stream after layer 0), ..., b[n] (after the last layer). Autodiff's rules
 * read the forward tensors of layer L (norm outputs, projections, attention, the DeltaNet
 * state...), which therefore live from the forward pass until layer L's backward: most of
 * a training step's memory. Here every backward node that reads such a tensor reads a
 * recomputed copy instead, built from b[L] through a view of it that also lists the
 * gradient of b[L + 1] as a source. That source orders the copy after layer L + 1's
 * backward (a graph is built depth first from its outputs, sources before users), so the
 * copies of one layer exist only around that layer's backward, and the forward originals
 * die after their last forward reader (the scheduler frees by liveness).
 *
 * A forward tensor belongs to layer L when the latest boundary it depends on is b[L] and it
 * is not b[L + 1] itself: its depth is the largest depth of its sources, with b[k] at depth
 * k and everything that depends on no boundary (weights, positions, masks, zero states) at
 * -1, shared rather than copied. A copy is the node itself with its sources (and storage
 * root, for a view) replaced by their copies; a node that writes into another tensor's
 * storage (CPY) is not copied: its readers keep the original. The values are the same ops
 * on the same inputs, so the loss and every gradient are bit for bit those of the graph
 * without recomputation (test_train_remat). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ptrmap.h"
#include "lathe/ops.h"
#include "opt/remat.h"

struct remat {
    struct lt_ctx *ctx;
    struct lt_ptrmap depth; /* forward tensor -> its depth + 2 (absent: -1) */
    struct lt_ptrmap copy;  /* forward tensor -> index + 1 in copies[] */
    struct lt_tensor **copies;
    int n_copies, cap_copies;
    struct lt_tensor *const *bounds;
    int n_bounds;
    struct lt_tensor **start; /* per layer: the view of b[L] its copies start from (or NULL) */
};

static int depth_of(const struct remat *r, const struct lt_tensor *t)
{
    return lt_ptrmap_get(&r->depth, t, 1) - 2;
}

static bool writes_elsewhere(const struct lt_tensor *t)
{
    return t->view_src && !lt_op_is_view(t->op);
}

/* Is t a forward tensor of some layer that the backward may read a copy of? Its layer. */
static int layer_of(const struct remat *r, const struct lt_tensor *t)
{
    const int d = depth_of(r, t);
    if (d < 0 || d >= r->n_bounds - 1 || writes_elsewhere(t) ||
        (t->flags & (LT_FLAG_OUTPUT | LT_FLAG_LOSS | LT_FLAG_PARAM | LT_FLAG_INPUT)))
        return -1;
    for (int k = 0; k < r->n_bounds; k++)
        if (r->bounds[k] == t)
            return -1;
    return d;
}

static struct lt_tensor *copy_of(struct remat *r, struct lt_tensor *t, int layer);

/* what a copy of layer `layer` reads in place of t */
static struct lt_tensor *source_for(struct remat *r, struct lt_tensor *t, int layer)
{
    if (!t)
        return NULL;
    if (t == r->bounds[layer])
        return r->start[layer];
    return layer_of(r, t) == layer ? copy_of(r, t, layer) : t;
}

static struct lt_tensor *copy_of(struct remat *r, struct lt_tensor *t, int layer)
{
    const int i = lt_ptrmap_get(&r->copy, t, 0);
    if (i > 0)
        return r->copies[i - 1];
    struct lt_tensor *c = lt_ctx_alloc(r->ctx, sizeof(*c));
    if (!c)
        return NULL;
    *c = *t;
    c->flags = 0;
    c->grad = NULL;
    c->data = NULL;
    c->buffer = NULL;
    c->extra = NULL;
    for (int k = 0; k < LT_MAX_SRC; k++) {
        c->src[k] = source_for(r, t->src[k], layer);
        if (t->src[k] && !c->src[k])
            return NULL;
    }
    if (t->view_src) { /* a view: of the copy of its storage, at the same offset */
        struct lt_tensor *root = source_for(r, t->view_src, layer);
        if (!root)
            return NULL;
        c->view_src = root->view_src ? root->view_src : root;
    }
    char name[LT_MAX_NAME];
    snprintf(name, sizeof(name), "%s", t->name);
    lt_format_name(c, "%.*s (remat)", LT_MAX_NAME - 10, name);
    if (r->n_copies == r->cap_copies) {
        int cap = r->cap_copies ? 2 * r->cap_copies : 256;
        struct lt_tensor **p = realloc(r->copies, sizeof(*p) * (size_t)cap);
        if (!p)
            return NULL;
        r->copies = p;
        r->cap_copies = cap;
    }
    r->copies[r->n_copies++] = c;
    lt_ptrmap_set(&r->copy, t, r->n_copies);
    return c;
}

lt_status lt_remat_rewrite(struct lt_ctx *ctx, struct lt_graph *g, int n_forward,
                           struct lt_tensor *const *bounds, int n_bounds, int *n_recomputed)
{
    *n_recomputed = 0;
    if (n_bounds < 2)
        return LT_OK;
    struct remat r = {.ctx = ctx, .bounds = bounds, .n_bounds = n_bounds};
    const size_t keys = (size_t)(g->n_nodes + g->n_leafs) * 2 + (size_t)n_bounds + 16;
    lt_status st = LT_OK;
    r.start = calloc((size_t)n_bounds, sizeof(*r.start));
    if (!r.start || !lt_ptrmap_init(&r.depth, keys) || !lt_ptrmap_init(&r.copy, keys)) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory for checkpointing");
        goto out;
    }
    for (int k = 0; k < n_bounds; k++)
        if (bounds[k])
            lt_ptrmap_set(&r.depth, bounds[k], k + 2);
    for (int i = 0; i < n_forward; i++) {
        struct lt_tensor *t = g->nodes[i];
        if (lt_ptrmap_get(&r.depth, t, 0) > 0) /* a boundary */
            continue;
        int d = -1;
        for (int k = 0; k < LT_MAX_SRC; k++)
            if (t->src[k] && depth_of(&r, t->src[k]) > d)
                d = depth_of(&r, t->src[k]);
        if (d >= 0)
            lt_ptrmap_set(&r.depth, t, d + 2);
    }
    /* where each layer's copies start: b[L] again, once b[L + 1]'s gradient exists */
    for (int L = 0; L + 1 < n_bounds; L++) {
        struct lt_tensor *x = bounds[L], *after = bounds[L + 1] ? bounds[L + 1]->grad : NULL;
        if (!x || !after)
            continue;
        struct lt_tensor *v = lt_view_4d(ctx, x, x->ne[0], x->ne[1], x->ne[2], x->ne[3], x->nb[1],
                                         x->nb[2], x->nb[3], 0);
        if (!v) {
            st = lt_fail(LT_ERR_NOMEM, "out of memory for checkpointing");
            goto out;
        }
        v->src[1] = after; /* orders the copies after layer L + 1's backward */
        lt_format_name(v, "%s (remat start)", x->name);
        r.start[L] = v;
    }
    /* the backward reads copies */
    for (int i = n_forward; i < g->n_nodes; i++) {
        struct lt_tensor *t = g->nodes[i];
        for (int k = 0; k < LT_MAX_SRC; k++) {
            struct lt_tensor *s = t->src[k];
            const int L = s ? layer_of(&r, s) : -1;
            if (L < 0 || !r.start[L])
                continue;
            if (!(t->src[k] = copy_of(&r, s, L))) {
                st = lt_fail(LT_ERR_NOMEM, "out of memory for checkpointing");
                goto out;
            }
        }
        const int L = t->view_src ? layer_of(&r, t->view_src) : -1;
        if (L >= 0 && r.start[L]) { /* a view of a forward tensor: of its copy */
            struct lt_tensor *root = copy_of(&r, t->view_src, L);
            if (!root) {
                st = lt_fail(LT_ERR_NOMEM, "out of memory for checkpointing");
                goto out;
            }
            t->view_src = root->view_src ? root->view_src : root;
        }
    }
    *n_recomputed = r.n_copies;
out:
    free(r.start);
    free(r.copies);
    lt_ptrmap_free(&r.depth);
    lt_ptrmap_free(&r.copy);
    return st;
}
