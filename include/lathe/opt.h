/* opt.h: training graphs, optimizers and admission.
 *
 * Admission is lathe's promise: before a training job allocates anything, its whole graph
 * (forward, backward, optimizer) is placed on the backends and its peak memory estimated.
 * A job that cannot run is refused with a value that names the op, the node and its
 * source (lathe/refusal.h); the same value travels unchanged to the CLI's stderr and the
 * HTTP response. */
#ifndef LATHE_OPT_H
#define LATHE_OPT_H

#include <stdio.h>

#include "lathe/backend.h"
#include "lathe/refusal.h"
#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- training context: forward + backward + optimizer, admitted before allocation ---- */

enum lt_optimizer {
    LT_OPTIMIZER_ADAMW = 0,
    LT_OPTIMIZER_SGD,
};

struct lt_train_graph_params {
    struct lt_backend *const *backends; /* priority order, e.g. {CUDA0, CPU} */
    int n_backends;
    bool device_only;     /* refuse when the first backend can't run a node */
    size_t memory_budget; /* bytes, at most the first backend's free memory less serving_reserve
                             (0: all of that); a larger one does not raise it */
    size_t serving_reserve;
    enum lt_optimizer optimizer;
    float beta1, beta2, eps, weight_decay; /* AdamW; 0 picks 0.9, 0.999, 1e-8; wd as given */
    /* Learning-rate schedule (NULL: the lr given to each step as it is): the step's rate
     * is lr_schedule(user, step, lr), step counting from 1. */
    float (*lr_schedule)(void *user, int step, float lr);
    /* Which PARAM-flagged leaves train (NULL: all). Others lose the flag. */
    bool (*param_filter)(void *user, const struct lt_tensor *param);
    void *user;
    /* Activation checkpointing: with n_remat_bounds >= 2, the tensors between boundary L and
     * L + 1 (a model's layers: lt_model_loss_graph.bounds) that the backward reads are
     * recomputed from boundary L once the gradient of boundary L + 1 exists, instead of
     * being kept from the forward pass. The same values, more compute, less memory. With
     * remat_selective, only the tensors that cost a pass or two over their sources to make
     * again (no products, attention or delta rule) are recomputed. */
    struct lt_tensor *const *remat_bounds;
    int n_remat_bounds;
    bool remat_selective;
};

struct lt_train_graph;

/* Builds the training graphs of `loss` (built in ctx, a no_alloc context, over leaves
 * flagged LT_FLAG_PARAM) and admits them: places every node and estimates peak memory.
 * Allocates nothing on any backend. On refusal returns LT_ERR_REFUSED with *refusal
 * filled; *out is NULL. */
lt_status lt_train_graph_new(struct lt_ctx *ctx, struct lt_tensor *loss,
                             const struct lt_train_graph_params *params, struct lt_train_graph **out,
                             struct lt_refusal *refusal);
void lt_train_graph_free(struct lt_train_graph *tg);

/* The admission results (valid after lt_train_graph_new succeeded). */
size_t lt_train_graph_estimate(const struct lt_train_graph *tg); /* peak bytes, all backends */
/* Two parts of the estimate: the kernels' working memory the job adds on its first backend,
 * and, for a device, the memory in use there before the job (context, weights, others). */
void lt_train_graph_estimate_parts(const struct lt_train_graph *tg, size_t *scratch,
                                   size_t *in_use);
size_t lt_train_graph_budget(const struct lt_train_graph *tg);
/* how many forward tensors the backward recomputes (0: checkpointing off) */
int lt_train_graph_n_recomputed(const struct lt_train_graph *tg);
void lt_train_graph_print(const struct lt_train_graph *tg, FILE *f); /* placement + memory */
int lt_train_graph_n_fallback(const struct lt_train_graph *tg);
struct lt_tensor *lt_train_graph_fallback_node(const struct lt_train_graph *tg, int i);
int lt_train_graph_n_params(const struct lt_train_graph *tg);
struct lt_tensor *lt_train_graph_param(const struct lt_train_graph *tg, int i);

/* Allocates the graphs' storage (intermediates, gradient accumulators, optimizer state,
 * inputs without storage) and zeroes the accumulators and moments. */
lt_status lt_train_graph_alloc(struct lt_train_graph *tg);
size_t lt_train_graph_allocated(const struct lt_train_graph *tg); /* bytes held now */

/* Runs forward and backward on the current inputs, adding the gradients into the
 * accumulators (one micro-batch); *loss_out receives the loss. */
lt_status lt_train_graph_accumulate(struct lt_train_graph *tg, float *loss_out);
/* One optimizer step with learning rate lr over the micro-batches accumulated since the
 * last step (their mean), then clears the accumulators. */
lt_status lt_train_graph_step(struct lt_train_graph *tg, float lr);
/* The flat F32 tensor ([n_flat]) that holds every trainable tensor's accumulated gradient,
 * for a caller that sums it over the ranks of a data-parallel job (lathe/comm.h) before
 * lt_train_graph_step_over; valid after lt_train_graph_alloc. The gaps between tensors hold
 * zeros, which a sum keeps. */
struct lt_tensor *lt_train_graph_accumulators(const struct lt_train_graph *tg);
/* lt_train_graph_step over accumulators that hold the sum of n_micro micro-batches' gradients,
 * wherever they were computed (this rank may have accumulated none of them): the update uses
 * their mean. lt_train_graph_step is this with the micro-batches accumulated here. */
lt_status lt_train_graph_step_over(struct lt_train_graph *tg, float lr, int n_micro);
/* The forward graph alone (for evaluation: loss without gradients). */
lt_status lt_train_graph_eval(struct lt_train_graph *tg, float *loss_out);

#ifdef __cplusplus
}
#endif
#endif
