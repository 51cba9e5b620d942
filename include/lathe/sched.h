/* sched.h: the scheduler: placement, memory planning and execution over several backends.
 *
 * Backends are given in priority order (CUDA0, then CPU). Placement puts each node on
 * the first backend whose supports_op says yes; it is a pure function of the graph and
 * the verdicts, computed without running or allocating anything, and can be printed.
 * For inference a node the first backend refuses falls back to a later one (copies of
 * its sources are made where storage differs); for training the caller decides whether
 * such a fallback is allowed (device_only) — see opt.h.
 *
 * Memory: each backend's intermediate results share one buffer; a result's bytes are
 * reused once its last reader (through any view of it) has run. lt_sched_measure gives
 * the exact bytes lt_sched_alloc will then take, without allocating. */
#ifndef LATHE_SCHED_H
#define LATHE_SCHED_H

#include <stdio.h>

#include "lathe/backend.h"
#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LT_SCHED_MAX_BACKENDS 4

struct lt_sched;
struct lt_refusal;

struct lt_sched *lt_sched_new(struct lt_backend *const *backends, int n_backends);
void lt_sched_free(struct lt_sched *s);

/* Places every node of g. Fails (LT_ERR_UNSUPPORTED) when no backend can run a node, or,
 * with device_only, when a node can't run on the first backend; refusal (optional) then
 * names the op, the node and its source. */
lt_status lt_sched_place(struct lt_sched *s, struct lt_graph *g, bool device_only,
                         struct lt_refusal *refusal);

/* After place: the backend index of a node (-1 for views and leaves), counts, fallbacks. */
int lt_sched_node_backend(const struct lt_sched *s, int node_index);
int lt_sched_count(const struct lt_sched *s, int backend_index);
int lt_sched_n_fallback(const struct lt_sched *s);
struct lt_tensor *lt_sched_fallback_node(const struct lt_sched *s, int i);
/* "CUDA0: 812 nodes, CPU: 3 nodes; fallback to CPU: SQR 'x' ..." */
void lt_sched_print(const struct lt_sched *s, FILE *f);

struct lt_sched_memory {
    size_t compute[LT_SCHED_MAX_BACKENDS]; /* intermediates, per backend (reused) */
    size_t leafs[LT_SCHED_MAX_BACKENDS];   /* leaves without storage yet (inputs, state) */
    size_t copies[LT_SCHED_MAX_BACKENDS];  /* storage copied in for readers on another backend */
    size_t total;                          /* the sum of the three above */
    /* kernels' working memory per backend (lt_backend_scratch_bytes): what it will hold
     * after the graph, and the part it holds already; not in total (a backend keeps one
     * scratch for every graph it runs, so two graphs' scratch is the larger, not the sum) */
    size_t scratch[LT_SCHED_MAX_BACKENDS], scratch_held[LT_SCHED_MAX_BACKENDS];
};
/* The bytes lt_sched_alloc would take for g (after place), without allocating. */
lt_status lt_sched_measure(struct lt_sched *s, struct lt_graph *g, struct lt_sched_memory *m);
/* The bytes a leaf without storage takes in a plan (its size, aligned). */
size_t lt_sched_leaf_bytes(const struct lt_tensor *t);
/* Allocates storage for g's intermediates and its leaves that have none. */
lt_status lt_sched_alloc(struct lt_sched *s, struct lt_graph *g);
/* Bytes held in buffers by this scheduler now. */
size_t lt_sched_allocated(const struct lt_sched *s);
/* Frees the buffers of the last alloc (tensors' data pointers become stale). */
void lt_sched_release(struct lt_sched *s);
/* Forgets the graph (call before freeing it) but keeps the compute and leaf buffers for
 * the next graph, which reuses them when they are large enough: a decode loop that builds
 * a graph per token then allocates nothing per token. */
void lt_sched_reset(struct lt_sched *s);
/* Runs g (placed and allocated), backend by backend in runs of consecutive nodes. */
lt_status lt_sched_compute(struct lt_sched *s, struct lt_graph *g);
/* Runs nodes [from, to) of g only (e.g. the forward part of a training graph). */
lt_status lt_sched_compute_range(struct lt_sched *s, struct lt_graph *g, int from, int to);

#ifdef __cplusplus
}
#endif
#endif
