/* graph.c: a graph is the tensors a result depends on, sources before users.
 *
 * lt_graph_build walks sources depth-first without recursion (a training graph of a
 * 24-layer model is deep) and records each tensor once; a pointer hash set remembers what
 * has been visited. Leaves (op NONE) go to leafs[], everything else to nodes[]. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/tensor.h"

struct graph_impl {
    struct lt_graph g;
    size_t hash_size;
    const struct lt_tensor **hash;
};

static size_t hash_ptr(const void *p, size_t n) { return ((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull % n; }

static bool hash_find(const struct graph_impl *gi, const struct lt_tensor *t, size_t *slot)
{
    size_t i = hash_ptr(t, gi->hash_size);
    while (gi->hash[i]) {
        if (gi->hash[i] == t) {
            *slot = i;
            return true;
        }
        i = (i + 1) % gi->hash_size;
    }
    *slot = i;
    return false;
}

struct lt_graph *lt_graph_new(struct lt_ctx *ctx, int cap)
{
    struct graph_impl *gi = lt_ctx_alloc(ctx, sizeof(*gi));
    if (!gi)
        return NULL;
    gi->g.cap = cap;
    gi->g.nodes = lt_ctx_alloc(ctx, sizeof(struct lt_tensor *) * (size_t)cap);
    gi->g.leafs = lt_ctx_alloc(ctx, sizeof(struct lt_tensor *) * (size_t)cap);
    gi->hash_size = (size_t)cap * 2 + 1;
    gi->hash = lt_ctx_alloc(ctx, sizeof(*gi->hash) * gi->hash_size);
    if (!gi->g.nodes || !gi->g.leafs || !gi->hash)
        return NULL;
    return &gi->g;
}

void lt_graph_clear(struct lt_graph *g)
{
    struct graph_impl *gi = (struct graph_impl *)g;
    g->n_nodes = 0;
    g->n_leafs = 0;
    memset(gi->hash, 0, sizeof(*gi->hash) * gi->hash_size);
}

bool lt_graph_contains(const struct lt_graph *g, const struct lt_tensor *t)
{
    size_t slot;
    return hash_find((const struct graph_impl *)g, t, &slot);
}

struct walk_frame {
    struct lt_tensor *t;
    int next_src;
};

static bool graph_insert(struct graph_impl *gi, const struct lt_tensor *t)
{
    size_t slot;
    if (hash_find(gi, t, &slot))
        return false;
    gi->hash[slot] = t;
    return true;
}

lt_status lt_graph_build(struct lt_graph *g, struct lt_tensor *root)
{
    struct graph_impl *gi = (struct graph_impl *)g;
    if (lt_graph_contains(g, root))
        return LT_OK;
    /* a root whose sources are all in the graph (a graph built again in its order, as
     * autodiff does when it folds the loss) is appended without a walk */
    bool sources_in = true;
    for (int k = 0; k < LT_MAX_SRC && sources_in; k++)
        sources_in = !root->src[k] || lt_graph_contains(g, root->src[k]);
    if (sources_in) {
        if (g->n_nodes + g->n_leafs >= g->cap)
            return lt_fail(LT_ERR_NOMEM, "graph holds more than its capacity of %d tensors",
                           g->cap);
        graph_insert(gi, root);
        if (root->op == LT_OP_NONE)
            g->leafs[g->n_leafs++] = root;
        else
            g->nodes[g->n_nodes++] = root;
        return LT_OK;
    }
    /* the stack never holds more than one frame per tensor; it starts small and doubles (at
     * the graph's capacity from the start it was megabytes a call, allocated and freed for
     * each of the many roots a training graph adds: seconds under ASan) */
    int stack_cap = g->cap + 1 < 256 ? g->cap + 1 : 256, sp = 0;
    struct walk_frame *stack = malloc(sizeof(*stack) * (size_t)stack_cap);
    if (!stack)
        return lt_fail(LT_ERR_NOMEM, "out of memory building a graph");
    lt_status st = LT_OK;
    graph_insert(gi, root);
    stack[sp++] = (struct walk_frame){root, 0};
    while (sp > 0) {
        struct walk_frame *f = &stack[sp - 1];
        if (f->next_src < LT_MAX_SRC) {
            struct lt_tensor *s = f->t->src[f->next_src++];
            if (s && graph_insert(gi, s)) {
                if (sp == stack_cap) {
                    if (stack_cap > g->cap) {
                        st = lt_fail(LT_ERR_NOMEM, "graph deeper than its capacity %d", g->cap);
                        goto out_free_stack;
                    }
                    const int grown = stack_cap > g->cap / 2 ? g->cap + 1 : 2 * stack_cap;
                    struct walk_frame *more = realloc(stack, sizeof(*stack) * (size_t)grown);
                    if (!more) {
                        st = lt_fail(LT_ERR_NOMEM, "out of memory building a graph");
                        goto out_free_stack;
                    }
                    stack = more, stack_cap = grown;
                    f = &stack[sp - 1];
                }
                stack[sp++] = (struct walk_frame){s, 0};
            }
            continue;
        }
        struct lt_tensor *t = f->t;
        sp--;
        if (g->n_nodes + g->n_leafs >= g->cap) {
            st = lt_fail(LT_ERR_NOMEM, "graph holds more than its capacity of %d tensors", g->cap);
            goto out_free_stack;
        }
        if (t->op == LT_OP_NONE)
            g->leafs[g->n_leafs++] = t;
        else
            g->nodes[g->n_nodes++] = t;
    }
out_free_stack:
    free(stack);
    return st;
}
