/* params.c: training job parameters: defaults, validation (one message per bad field),
 * and the names of states and fit policies.
 *
 * Validation runs on a copy with the defaults filled in, so "zero means default" holds for
 * every caller, and it reads no file: what depends on the data or the model is checked when
 * the job runs. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "lathe/comm.h"
#include "lathe/lora.h"
#include "lathe/train.h"

void lt_train_params_defaults(struct lt_train_params *p)
{
    if (p->rank == 0)
        p->rank = 8;
    if (p->alpha == 0)
        p->alpha = 2.0f * (float)p->rank;
    if (p->window == 0)
        p->window = 256;
    if (p->epochs == 0)
        p->epochs = 1;
    if (p->lr == 0)
        p->lr = p->full ? 1e-4f : 1e-3f;
    if (p->seed == 0)
        p->seed = 42;
}

bool lt_fit_policy_parse(const char *s, enum lt_fit_policy *out)
{
    static const char *const names[] = {"none", "middle", "left"};
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, names[i])) {
            *out = (enum lt_fit_policy)i;
            return true;
        }
    return false;
}

const char *lt_train_state_name(enum lt_train_state s)
{
    switch (s) {
    case LT_TRAIN_IDLE: return "idle";
    case LT_TRAIN_STARTING: return "starting";
    case LT_TRAIN_RUNNING: return "running";
    case LT_TRAIN_PAUSED: return "paused";
    case LT_TRAIN_DONE: return "done";
    case LT_TRAIN_CANCELLED: return "cancelled";
    case LT_TRAIN_ERROR: return "error";
    }
    return "?";
}

static void add_error(struct lt_train_errors *e, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_error(struct lt_train_errors *e, const char *field, const char *fmt, ...)
{
    if (e->n == LT_TRAIN_MAX_ERRORS)
        return;
    snprintf(e->e[e->n].field, sizeof(e->e[e->n].field), "%s", field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->e[e->n].message, sizeof(e->e[e->n].message), fmt, ap);
    va_end(ap);
    e->n++;
}

/* A number field of p as a double; false for the other types. */
static bool number_of(const struct lt_train_params *p, const struct lt_train_field *f, double *v)
{
    const void *at = (const char *)p + f->offset;
    switch (f->type) {
    case LT_TF_INT: *v = *(const int *)at; return true;
    case LT_TF_U64: *v = (double)*(const uint64_t *)at; return true;
    case LT_TF_SIZE: *v = (double)*(const size_t *)at; return true;
    case LT_TF_FLOAT: *v = *(const float *)at; return true;
    default: return false;
    }
}

/* Every number within its table range (rank and alpha only for LoRA; a zero that stands
 * for the default passes). */
static void ranges(const struct lt_train_params *p, struct lt_train_errors *e)
{
    size_t n;
    const struct lt_train_field *t = lt_train_fields(&n);
    for (size_t i = 0; i < n; i++) {
        const struct lt_train_field *f = &t[i];
        double v;
        if (!number_of(p, f, &v) || (f->zero_default && v == 0))
            continue;
        bool lora_only = f->offset == offsetof(struct lt_train_params, rank) ||
                         f->offset == offsetof(struct lt_train_params, alpha);
        if ((lora_only && p->full) || (isfinite(v) && lt_train_field_in_range(f, v)))
            continue;
        char range[64];
        lt_train_field_range_text(f, range, sizeof(range));
        const char *name = f->key ? f->key : f->flag;
        add_error(e, name, "%s must be %s%s, not %g", name,
                  f->lo == 0 && f->lo_open ? "a positive number " : "", range, v);
    }
}

lt_status lt_train_params_validate(const struct lt_train_params *given,
                                   struct lt_train_errors *errs)
{
    struct lt_train_errors local;
    struct lt_train_errors *e = errs ? errs : &local;
    memset(e, 0, sizeof(*e));
    struct lt_train_params p = *given;
    lt_train_params_defaults(&p);

    if (!p.out || !*p.out)
        add_error(e, "out", "an output path is required");
    int n_data = !!p.text_path + !!p.text + !!p.examples_path + !!p.examples;
    if (n_data != 1)
        add_error(e, n_data ? "examples" : "text",
                  n_data ? "give only one of text and examples (as a file or as content)"
                         : "give the training data: text or examples");
    ranges(&p, e);
    if (!p.full && p.targets) {
        char names[LT_LORA_MAX_TARGETS][LT_LORA_TARGET_NAME];
        int n;
        if (lt_lora_parse_targets(p.targets, names, &n) != LT_OK)
            add_error(e, "targets", "%s", lt_last_error());
        else if (n == 0)
            add_error(e, "targets", "targets is empty; leave it out for the default set");
    } else if (p.targets) {
        add_error(e, "targets",
                  "targets choose LoRA modules; full fine-tuning trains every weight");
    }
    if (p.batch > 0 && p.grad_accum > 0)
        add_error(e, "grad_accum",
                  "give batch (examples a step) or grad_accum (micro-batches a step), not both");
    if (p.val_examples_path && p.val_split > 0)
        add_error(e, "val_split", "give val_split or a validation file, not both");
    if (p.val_examples_path && !p.examples && !p.examples_path)
        add_error(e, "val_examples_path", "a validation file holds chat examples, so the "
                  "training data must be chat examples too");
    if ((int)p.fit < LT_FIT_NONE || (int)p.fit > LT_FIT_LEFT)
        add_error(e, "fit", "fit must be none, middle or left");
    else if (p.fit != LT_FIT_NONE && (p.text || p.text_path))
        add_error(e, "fit", "fit applies to chat examples; text is cut into windows");

    if (p.gpus > 1 && !lt_comm_have_nccl())
        add_error(e, "--gpus", "--gpus %d needs NCCL, and this build has none: build with cmake "
                  "-DLATHE_NCCL=ON (NCCL from the PyPI wheel nvidia-nccl-cu13), or train on one "
                  "GPU", p.gpus);

    if (e->n == 0)
        return LT_OK;
    char msg[1024];
    size_t len = 0;
    msg[0] = 0;
    for (int i = 0; i < e->n && len + 1 < sizeof(msg); i++) {
        int k = snprintf(msg + len, sizeof(msg) - len, "%s%s: %s", i ? "; " : "", e->e[i].field,
                         e->e[i].message);
        len += k > 0 ? (size_t)k : 0;
    }
    return lt_fail(LT_ERR_INVALID, "%s", msg);
}
