/* autodiff.h: reverse-mode differentiation of a graph.
 *
 * lt_autodiff_build walks the forward graph from the loss back to every trainable tensor
 * (flag LT_FLAG_PARAM) and calls each op's backward rule (src/ops/<family>.c). Gradients
 * are ordinary graph nodes named "grad for <name>"; each parameter's ->grad is set. Every
 * accumulated gradient is contiguous: a rule's result that is a view is copied first, so
 * no later kernel is handed a layout because of autodiff.
 *
 * An op without a backward rule on a path from a parameter to the loss is not an error
 * of the library: the build stops and reports it as a refusal (see opt.h).
 *
 * A rule may compute the loss in its backward node where that saves work (LINEAR_CE as the
 * loss itself: its backward recomputes the logits the forward made). The loss node then
 * becomes a copy of that node's loss element (same value), the node moves before the loss
 * in g, and the loss's own forward computation leaves the graph. So g's forward part, the
 * nodes up to the loss, may be longer after this call than before: a caller that runs the
 * forward alone counts its nodes afterwards. A build that fails puts the loss back as it
 * was. A forward graph is differentiated once. */
#ifndef LATHE_AUTODIFF_H
#define LATHE_AUTODIFF_H

#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct lt_refusal;

/* Adds the backward pass of `loss` (one element) to g, which must already hold the forward
 * graph of loss. `grad_scale` seeds d loss / d loss (1, or 1/n for micro-batch means).
 * On a missing backward rule returns LT_ERR_REFUSED and, when refusal is not NULL, fills
 * it (kind LT_REFUSAL_NO_BACKWARD) naming the op, the node and its source. */
lt_status lt_autodiff_build(struct lt_ctx *ctx, struct lt_graph *g, struct lt_tensor *loss,
                            float grad_scale, struct lt_refusal *refusal);

#ifdef __cplusplus
}
#endif
#endif
