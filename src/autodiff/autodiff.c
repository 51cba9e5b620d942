/* autodiff.c: builds the backward graph from each op's rule.
 *
 * Nodes are visited in reverse topological order, so by the time a node is visited every
 * user of it has added its contribution to node->grad. A tensor "wants" a gradient when it
 * is trainable or depends on something trainable; rules skip sources that don't.
 *
 * A rule may fold the loss into its backward node (lt_ad_fold_loss; LINEAR_CE's rule does,
 * src/ops/linear_ce.c): the loss node becomes a copy of one element of a node that autodiff
 * built, so the graph is built again, the forward's nodes in their order with that node and
 * what it reads inserted before the loss, and the forward part (every node the loss needs)
 * ends after the loss as before, a few nodes later. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ptrmap.h"
#include "lathe/refusal.h"
#include "ops/grad.h"
#include "ops/op.h"

/* how many of g's nodes read each tensor (lt_ad_grad_type) */
static void count_readers(struct lt_autodiff *ad, struct lt_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++)
        for (int s = 0; s < LT_MAX_SRC; s++) {
            const struct lt_tensor *t = g->nodes[i]->src[s];
            if (t)
                lt_ptrmap_set(&ad->readers, t, lt_ptrmap_get(&ad->readers, t, 0) + 1);
        }
}

static void mark_wants(struct lt_autodiff *ad, struct lt_graph *g)
{
    for (int i = 0; i < g->n_leafs; i++)
        if (g->leafs[i]->flags & LT_FLAG_PARAM)
            lt_ptrmap_set(&ad->wants, g->leafs[i], 1);
    for (int i = 0; i < g->n_nodes; i++) {
        struct lt_tensor *t = g->nodes[i];
        bool w = (t->flags & LT_FLAG_PARAM) != 0;
        for (int s = 0; s < LT_MAX_SRC && !w; s++)
            w = t->src[s] && lt_ptrmap_get(&ad->wants, t->src[s], 0) == 1;
        if (w)
            lt_ptrmap_set(&ad->wants, t, 1);
    }
}

/* Backward nodes that rules left unnamed are named after the forward tensor they serve
 * ("grad for k_conv-22"), so refusals and placement reports can name them. Sources come
 * before users, so a name found on a source passes on to the nodes built from it. */
static void name_backward_nodes(struct lt_graph *g, int n_forward)
{
    for (int i = n_forward; i < g->n_nodes; i++) {
        struct lt_tensor *t = g->nodes[i];
        if (t->name[0])
            continue;
        const struct lt_tensor *from = NULL;
        for (int k = 0; k < LT_MAX_SRC && !from; k++) /* a forward tensor first */
            if (t->src[k] && t->src[k]->name[0] && strncmp(t->src[k]->name, "grad for ", 9))
                from = t->src[k];
        if (from) {
            char base[LT_MAX_NAME];
            snprintf(base, sizeof(base), "%s", from->name);
            char *suffix = strstr(base, " (");
            if (suffix) /* " (view)", " (cont)": name the tensor they come from */
                *suffix = '\0';
            lt_format_name(t, "grad for %s", base);
            continue;
        }
        for (int k = 0; k < LT_MAX_SRC && !from; k++)
            if (t->src[k] && t->src[k]->name[0])
                from = t->src[k];
        if (from)
            lt_set_name(t, from->name);
    }
}

/* g again, its first n_forward nodes and every leaf built in their order, so the loss's new
 * sources (a folded loss) come before it and nothing else moves; *n_out: the nodes of the
 * forward part now */
static lt_status rebuild_forward(struct lt_graph *g, int n_forward, int *n_out)
{
    const int n_leafs = g->n_leafs;
    struct lt_tensor **old = malloc(sizeof(*old) * (size_t)(n_forward + n_leafs + 1));
    if (!old)
        return lt_fail(LT_ERR_NOMEM, "out of memory for autodiff");
    /* the leaves first (in their order), so that every node finds its sources in the graph
     * and is appended without a walk (lt_graph_build) */
    memcpy(old, g->leafs, sizeof(*old) * (size_t)n_leafs);
    memcpy(old + n_leafs, g->nodes, sizeof(*old) * (size_t)n_forward);
    lt_graph_clear(g);
    lt_status st = LT_OK;
    for (int i = 0; i < n_forward + n_leafs && st == LT_OK; i++)
        st = lt_graph_build(g, old[i]);
    free(old);
    *n_out = g->n_nodes;
    return st;
}

lt_status lt_autodiff_build(struct lt_ctx *ctx, struct lt_graph *g, struct lt_tensor *loss,
                            float grad_scale, struct lt_refusal *refusal)
{
    struct lt_autodiff ad = {.ctx = ctx};
    lt_status st = LT_OK;
    if (lt_nelements(loss) != 1)
        return lt_fail(LT_ERR_INVALID, "the loss '%s' has %lld elements, not 1", loss->name,
                       (long long)lt_nelements(loss));
    if (!lt_ptrmap_init(&ad.wants, (size_t)(g->n_nodes + g->n_leafs) * 4 + 16))
        return lt_fail(LT_ERR_NOMEM, "out of memory for autodiff");
    if (!lt_ptrmap_init(&ad.owned, (size_t)(g->n_nodes + g->n_leafs) * 4 + 16)) {
        lt_ptrmap_free(&ad.wants);
        return lt_fail(LT_ERR_NOMEM, "out of memory for autodiff");
    }
    if (!lt_ptrmap_init(&ad.readers, (size_t)(g->n_nodes + g->n_leafs) * 4 + 16)) {
        lt_ptrmap_free(&ad.wants);
        lt_ptrmap_free(&ad.owned);
        return lt_fail(LT_ERR_NOMEM, "out of memory for autodiff");
    }
    /* gradients from an earlier build over the same tensors (a second job on the same
     * weights) belong to a graph that may be gone: start from none */
    for (int i = 0; i < g->n_leafs; i++)
        g->leafs[i]->grad = NULL;
    for (int i = 0; i < g->n_nodes; i++)
        g->nodes[i]->grad = NULL;
    mark_wants(&ad, g);
    count_readers(&ad, g);
    if (!lt_ad_wants(&ad, loss)) {
        st = lt_fail(LT_ERR_INVALID, "the loss '%s' depends on no trainable tensor", loss->name);
        goto out_free_map;
    }
    int n_forward = g->n_nodes;
    struct lt_tensor *seed = lt_fill(ctx, loss, grad_scale);
    if (!seed) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory for autodiff");
        goto out_free_map;
    }
    lt_format_name(seed, "grad for %s", loss->name);
    loss->grad = seed;
    ad.loss = loss;
    ad.seed = seed;
    for (int i = n_forward - 1; i >= 0; i--) {
        struct lt_tensor *node = g->nodes[i];
        if (!node->grad || !lt_ad_wants(&ad, node))
            continue;
        const struct lt_op_def *def = lt_op_def(node->op);
        if (!def->backward) {
            if (refusal)
                lt_refusal_set_node(refusal, LT_REFUSAL_NO_BACKWARD, node, "", "no backward rule");
            st = lt_fail(LT_ERR_REFUSED, "%s",
                         refusal ? refusal->sentence : "an op has no backward rule");
            goto out_free_map;
        }
        st = def->backward(&ad, node);
        if (st != LT_OK)
            goto out_free_map;
    }
    if (ad.folded && (st = rebuild_forward(g, n_forward, &n_forward)) != LT_OK)
        goto out_free_map;
    /* add every parameter gradient (and what it depends on) to the graph */
    for (int i = 0; i < g->n_leafs; i++) {
        struct lt_tensor *p = g->leafs[i];
        if ((p->flags & LT_FLAG_PARAM) && p->grad) {
            st = lt_graph_build(g, p->grad);
            if (st != LT_OK)
                goto out_free_map;
        }
    }
    name_backward_nodes(g, n_forward);
out_free_map:
    if (st != LT_OK && ad.folded) { /* the loss computes itself again */
        loss->op = ad.unfolded.op;
        memcpy(loss->op_params, ad.unfolded.op_params, sizeof(loss->op_params));
        memcpy(loss->src, ad.unfolded.src, sizeof(loss->src));
    }
    lt_ptrmap_free(&ad.wants);
    lt_ptrmap_free(&ad.owned);
    lt_ptrmap_free(&ad.readers);
    return st;
}
