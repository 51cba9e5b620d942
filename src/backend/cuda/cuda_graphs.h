/* cuda_graphs.h (internal, CUDA C++): CUDA graph replay for the CUDA backend
 * (cuda_graphs.cu): a decode-sized node list that comes back unchanged is launched as the
 * graph it was recorded into. */
#ifndef LATHE_BACKEND_CUDA_GRAPHS_H
#define LATHE_BACKEND_CUDA_GRAPHS_H

#include "backend/cuda/cuda_common.h"
#include "lathe/backend_cuda.h"

/* how the backend queues a list eagerly (also what a capture records) */
typedef lt_status (*cu_issue_fn)(struct lt_backend *be, struct lt_tensor *const *nodes,
                                 int n_nodes);

/* c->graphs, unless LATHE_CUDA_GRAPHS=0 (or it cannot be set up: then NULL, graphs off) */
void cu_graphs_new(struct cu_ctx *c);
void cu_graphs_free(struct cu_ctx *c);
/* a list graphs are for (graphs on): 32 nodes or more, every product over at most 64
 * columns (any width with LATHE_CUDA_GRAPHS=all) */
bool cu_graph_worthy(const struct cu_ctx *c, struct lt_tensor *const *nodes, int n_nodes);
/* Runs the list as a graph (replayed, or captured now); *eager set when it was not, and
 * nothing ran: the caller issues it itself. */
lt_status cu_graph_compute(struct lt_backend *be, struct cu_ctx *c,
                           struct lt_tensor *const *nodes, int n_nodes, cu_issue_fn issue,
                           bool *eager);
/* adds nothing when graphs are off */
void cu_graphs_stats(const struct cu_ctx *c, struct lt_cuda_graph_stats *out);

#endif
