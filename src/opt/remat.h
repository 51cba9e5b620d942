/* remat.h (internal): activation checkpointing of a training graph (remat.c). */
#ifndef LATHE_OPT_REMAT_H
#define LATHE_OPT_REMAT_H
#include "lathe/tensor.h"

/* After autodiff over g (its first n_forward nodes the forward pass): makes every backward
 * node read recomputed copies of the forward tensors between bounds[L] and bounds[L + 1],
 * built once bounds[L + 1]'s gradient exists; with selective, only those that are cheap to
 * make again (remat.c). *n_recomputed: the copies made. The caller builds the graph again
 * from its outputs (the rewritten nodes' sources changed). */
lt_status lt_remat_rewrite(struct lt_ctx *ctx, struct lt_graph *g, int n_forward,
                           struct lt_tensor *const *bounds, int n_bounds, bool selective,
                           int *n_recomputed);

#endif
