/* grad_basic.h: what the basic ops' gradient tests share: the tolerance, and a check of
 * the backward graph's layouts beside every finite-difference check.
 *
 * Every node autodiff adds must be one the CPU backend accepts, and apart from copies
 * (CONT) and views it must read only contiguous tensors: the rules hand no backward kernel a
 * strided forward source (they copy it first), so a device whose kernels need unit strides
 * can run the whole backward pass. */
#ifndef LATHE_TESTS_GRAD_BASIC_H
#define LATHE_TESTS_GRAD_BASIC_H

#include <string.h>

#include "check.h"
#include "gradcheck.h"
#include "ops/op.h"

#define TOL 1e-2

static bool reads_any_layout(enum lt_op op)
{
    return op == LT_OP_CONT || op == LT_OP_VIEW || op == LT_OP_RESHAPE || op == LT_OP_PERMUTE ||
           op == LT_OP_TRANSPOSE;
}

/* Builds sum(y * w) and its backward pass as gradcheck does, and checks each node that
 * autodiff added. Returns the number of backward nodes (0 on failure). */
static int check_backward_graph(const char *name, gc_build_fn build, void *user,
                                const struct gc_input *in, int n_in)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20});
    struct lt_tensor *x[8], *storage[8];
    int n_backward = 0;
    for (int i = 0; i < n_in; i++)
        x[i] = gc_make_input(ctx, &in[i], &storage[i]);
    struct lt_tensor *y = build(ctx, x, user);
    CHECK(y != NULL, "%s: build failed: %s", name, lt_last_error());
    if (!y)
        goto out_free_ctx;
    struct lt_tensor *w =
        lt_new_tensor_4d(ctx, LT_TYPE_F32, y->ne[0], y->ne[1], y->ne[2], y->ne[3]);
    struct lt_tensor *loss = lt_sum(ctx, lt_mul(ctx, y, w));
    struct lt_graph *g = lt_graph_new(ctx, 4096);
    lt_status st = lt_graph_build(g, loss);
    int n_forward = g->n_nodes;
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
    CHECK(st == LT_OK, "%s: autodiff: %s", name, lt_last_error());
    if (st != LT_OK)
        goto out_free_ctx;
    for (int i = n_forward; i < g->n_nodes; i++) {
        const struct lt_tensor *node = g->nodes[i];
        char reason[LT_REASON_MAX] = "";
        CHECK(lt_cpu_supports_op(node, reason, sizeof(reason)), "%s: the CPU refuses %s '%s': %s",
              name, lt_op_name(node->op), node->name, reason);
        if (reads_any_layout(node->op))
            continue;
        for (int s = 0; s < LT_MAX_SRC; s++)
            CHECK(!node->src[s] || lt_is_contiguous(node->src[s]),
                  "%s: backward node %s '%s' reads '%s', %s", name, lt_op_name(node->op),
                  node->name, node->src[s]->name, lt_layout_name(node->src[s]));
    }
    n_backward = g->n_nodes - n_forward;
out_free_ctx:
    lt_ctx_free(ctx);
    return n_backward;
}

/* gradcheck and the layout check of the same case */
static void check_case(const char *name, gc_build_fn build, void *user, const struct gc_input *in,
                       int n_in)
{
    gradcheck(name, build, user, in, n_in, TOL);
    CHECK(check_backward_graph(name, build, user, in, n_in) > 0, "%s: no backward nodes", name);
}

#endif
