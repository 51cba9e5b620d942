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
 * without recomputation (test_train_remat).
 *
 * Selective checkpointing recomputes only what is cheap to make again and large to keep:
 * a tensor of an op with no product or sequence mixing (elementwise ops, norms, rope,
 * SwiGLU, the short convolution, copies and views: recompute_cheap), whose sources are
 * either recomputed too or kept anyway (the backward reads them as they are, or they lie
 * outside the layers). The products, attention and the delta rule stay as the forward made
 * them, so the backward's extra work is a few passes over the layer's activations, where the
 * whole layer's recomputation ran its products again; and no recomputation keeps a tensor
 * alive that the backward would not have read.
 *
 * Either way a trainable weight's rounding to BF16 (a device's products read it) is made
 * again for the backward (weight_rounding) rather than kept from the forward. */
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
    bool selective;           /* recompute only the cheap tensors (selective_ok) */
    struct lt_ptrmap read;    /* selective: forward tensors the backward reads (1) */
    struct lt_ptrmap cheap;   /* selective: tensor -> 1 recomputed, 2 kept, 3 being decided */
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
static int layer_any(const struct remat *r, const struct lt_tensor *t)
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

/* ops whose result costs a pass or two over their sources to make again: no product, no
 * attention, no delta rule, no loss */
static bool recompute_cheap(enum lt_op op)
{
    switch (op) {
    case LT_OP_VIEW:
    case LT_OP_RESHAPE:
    case LT_OP_PERMUTE:
    case LT_OP_TRANSPOSE:
    case LT_OP_FILL:
    case LT_OP_CONT:
    case LT_OP_REPEAT:
    case LT_OP_ACC:
    case LT_OP_ADD:
    case LT_OP_SUB:
    case LT_OP_MUL:
    case LT_OP_DIV:
    case LT_OP_SCALE:
    case LT_OP_SILU:
    case LT_OP_SIGMOID:
    case LT_OP_SOFTPLUS:
    case LT_OP_EXP:
    case LT_OP_NEG:
    case LT_OP_RMS_NORM:
    case LT_OP_ADD_RMS_NORM:
    case LT_OP_L2_NORM:
    case LT_OP_ROPE:
    case LT_OP_RMS_NORM_ROPE:
    case LT_OP_SWIGLU:
    case LT_OP_SSM_CONV:
    case LT_OP_CONV_SILU: return true;
    default: return false;
    }
}

static bool selective_ok(struct remat *r, const struct lt_tensor *t);

/* whether a recomputed tensor may read t: recomputed itself, or alive when the copy is made
 * without the copy keeping it (the backward reads it, or it is no layer's: a weight, a
 * boundary) */
static bool selective_source_ok(struct remat *r, const struct lt_tensor *t)
{
    if (!t || layer_any(r, t) < 0)
        return true;
    return lt_ptrmap_get(&r->read, t, 0) || selective_ok(r, t);
}

/* selective: whether t is recomputed (recompute_cheap, every source selective_source_ok) */
static bool selective_ok(struct remat *r, const struct lt_tensor *t)
{
    const int known = lt_ptrmap_get(&r->cheap, t, 0);
    if (known)
        return known == 1;
    lt_ptrmap_set(&r->cheap, t, 3); /* a cycle cannot happen in a DAG; 3 reads as kept */
    bool ok = recompute_cheap(t->op);
    for (int k = 0; ok && k < LT_MAX_SRC; k++)
        ok = selective_source_ok(r, t->src[k]);
    ok = ok && (!t->view_src || selective_source_ok(r, t->view_src));
    lt_ptrmap_set(&r->cheap, t, ok ? 1 : 2);
    return ok;
}

/* The layer of a forward tensor the backward reads a copy of, or -1: layer_any's, and when
 * selective only for a tensor selective_ok recomputes */
static int layer_of(struct remat *r, const struct lt_tensor *t)
{
    const int d = layer_any(r, t);
    return d >= 0 && r->selective && !selective_ok(r, t) ? -1 : d;
}

static struct lt_tensor *copy_of(struct remat *r, struct lt_tensor *t, int layer);

/* Is t a trainable weight rounded for a device's products (a CONT of the weight or of a view
 * of it)? Such a rounding depends on no boundary, so the forward's was kept for the
 * backward's products (~0.9 GiB at Qwen3.5-0.8B's full fine-tune); the backward rounds it
 * again instead, one pass over the weight. */
static bool weight_rounding(const struct remat *r, const struct lt_tensor *t)
{
    if (!t || t->op != LT_OP_CONT || depth_of(r, t) >= 0 || writes_elsewhere(t) ||
        (t->flags & (LT_FLAG_OUTPUT | LT_FLAG_LOSS | LT_FLAG_PARAM | LT_FLAG_INPUT)))
        return false;
    const struct lt_tensor *w = t->src[0] ? lt_storage_root(t->src[0]) : NULL;
    return w && (w->flags & LT_FLAG_PARAM);
}

/* the layer whose copy of t the backward reads instead of t, or -1 (none, or the layer's
 * copies have no start: no gradient reaches its output). A weight rounding reads no
 * boundary, so it needs no start and any index serves. */
static int backward_copy_layer(struct remat *r, const struct lt_tensor *t)
{
    if (!t)
        return -1;
    if (weight_rounding(r, t))
        return 0;
    const int L = layer_of(r, t);
    return L >= 0 && r->start[L] ? L : -1;
}

/* what a copy of layer `layer` reads in place of t */
static struct lt_tensor *source_for(struct remat *r, struct lt_tensor *t, int layer)
{
    if (!t)
        return NULL;
    if (t == r->bounds[layer])
        return r->start[layer];
    return layer_of(r, t) == layer || weight_rounding(r, t) ? copy_of(r, t, layer) : t;
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
                           struct lt_tensor *const *bounds, int n_bounds, bool selective,
                           int *n_recomputed)
{
    *n_recomputed = 0;
    if (n_bounds < 2)
        return LT_OK;
    struct remat r = {.ctx = ctx, .bounds = bounds, .n_bounds = n_bounds, .selective = selective};
    const size_t keys = (size_t)(g->n_nodes + g->n_leafs) * 2 + (size_t)n_bounds + 16;
    lt_status st = LT_OK;
    r.start = calloc((size_t)n_bounds, sizeof(*r.start));
    if (!r.start || !lt_ptrmap_init(&r.depth, keys) || !lt_ptrmap_init(&r.copy, keys) ||
        (selective && (!lt_ptrmap_init(&r.read, keys) || !lt_ptrmap_init(&r.cheap, keys)))) {
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
    /* selective: what the backward reads of the forward (and the storage of its views) */
    for (int i = n_forward; selective && i < g->n_nodes; i++)
        for (int k = 0; k <= LT_MAX_SRC; k++) {
            const struct lt_tensor *s =
                k < LT_MAX_SRC ? g->nodes[i]->src[k] : g->nodes[i]->view_src;
            for (; s; s = s->view_src)
                lt_ptrmap_set(&r.read, s, 1);
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
            const int L = backward_copy_layer(&r, s);
            if (L < 0)
                continue;
            if (!(t->src[k] = copy_of(&r, s, L))) {
                st = lt_fail(LT_ERR_NOMEM, "out of memory for checkpointing");
                goto out;
            }
        }
        const int L = backward_copy_layer(&r, t->view_src);
        if (L >= 0) { /* a view of a forward tensor: of its copy */
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
    if (selective) {
        lt_ptrmap_free(&r.read);
        lt_ptrmap_free(&r.cheap);
    }
    return st;
}
