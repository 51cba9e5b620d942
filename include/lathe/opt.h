/* opt.h: training graphs, optimizers and admission.
 *
 * Admission is lathe's promise: before a training job allocates anything, its whole graph
 * (forward, backward, optimizer) is placed on the backends and its peak memory estimated.
 * A job that cannot run is refused with a value that names the op, the node and its
 * source; the same value travels unchanged to the CLI's stderr and the HTTP response. */
#ifndef LATHE_OPT_H
#define LATHE_OPT_H

#include <stdio.h>

#include "lathe/backend.h"
#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum lt_refusal_kind {
    LT_REFUSAL_NONE = 0,
    LT_REFUSAL_NO_BACKWARD, /* an op on a parameter-to-loss path has no backward rule */
    LT_REFUSAL_NO_BACKEND,  /* no backend can run a node */
    LT_REFUSAL_DEVICE_ONLY, /* device_only, and the device can't run a node the CPU can */
    LT_REFUSAL_MEMORY,      /* the estimated peak exceeds the budget */
    LT_REFUSAL_KIND_COUNT
};

struct lt_refusal {
    enum lt_refusal_kind kind;
    char op[32];                /* "SQR" */
    char node[LT_MAX_NAME];     /* "grad for k_conv-22" */
    char source[LT_MAX_NAME];   /* "k_conv-22" */
    char source_layout[48];     /* "a non-contiguous view" */
    char backend[32];           /* the backend that said no ("CUDA0") */
    char reason[160];           /* that backend's reason */
    size_t need_bytes, budget_bytes; /* LT_REFUSAL_MEMORY */
    char sentence[768];         /* for people; see lt_refusal_format */
};

const char *lt_refusal_kind_name(enum lt_refusal_kind kind); /* "no_backward", ... */
/* Fills r->sentence from the other fields. */
void lt_refusal_format(struct lt_refusal *r);
/* Records a refusal about `node` (its first source that is a view, else source 0). */
void lt_refusal_set_node(struct lt_refusal *r, enum lt_refusal_kind kind,
                         const struct lt_tensor *node, const char *backend, const char *reason);

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
size_t lt_train_graph_budget(const struct lt_train_graph *tg);
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
/* The forward graph alone (for evaluation: loss without gradients). */
lt_status lt_train_graph_eval(struct lt_train_graph *tg, float *loss_out);

#ifdef __cplusplus
}
#endif
#endif
