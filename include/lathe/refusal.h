/* refusal.h: the refusal value: why a training job cannot run, naming the op, the node and
 * its source, as autodiff (no backward rule), the scheduler (no backend, device only) and
 * admission (memory) find it. A core value, so the layers that fill it need not reach up
 * to opt, which admits jobs (lathe/opt.h). */
#ifndef LATHE_REFUSAL_H
#define LATHE_REFUSAL_H

#include <stddef.h>

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

#ifdef __cplusplus
}
#endif
#endif
