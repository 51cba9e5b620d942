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

static bool finite_positive(float x)
{
    return isfinite(x) && x > 0;
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
    if (!p.full) {
        if (p.rank < 1 || p.rank > 4096)
            add_error(e, "rank", "rank must be 1..4096, not %d", p.rank);
        if (!finite_positive(p.alpha))
            add_error(e, "alpha", "alpha must be a positive number, not %g", (double)p.alpha);
        if (p.targets) {
            char names[LT_LORA_MAX_TARGETS][LT_LORA_TARGET_NAME];
            int n;
            if (lt_lora_parse_targets(p.targets, names, &n) != LT_OK)
                add_error(e, "targets", "%s", lt_last_error());
            else if (n == 0)
                add_error(e, "targets", "targets is empty; leave it out for the default set");
        }
    } else if (p.targets) {
        add_error(e, "targets",
                  "targets choose LoRA modules; full fine-tuning trains every weight");
    }
    if (p.top_layers < 0)
        add_error(e, "top_layers", "top_layers must be 0 (all) or more, not %d", p.top_layers);
    if (p.window < 2 || p.window > (1 << 20))
        add_error(e, "window", "window must be 2..%d tokens, not %d", 1 << 20, p.window);
    if (p.epochs < 1 || p.epochs > LT_TRAIN_MAX_EPOCHS)
        add_error(e, "epochs", "epochs must be 1..%d, not %d", LT_TRAIN_MAX_EPOCHS, p.epochs);
    if (!finite_positive(p.lr) || p.lr > 1)
        add_error(e, "lr", "lr must be in (0, 1], not %g", (double)p.lr);
    if (!isfinite(p.weight_decay) || p.weight_decay < 0 || p.weight_decay > 1)
        add_error(e, "weight_decay", "weight_decay must be in [0, 1], not %g",
                  (double)p.weight_decay);
    if (p.batch < 0 || p.batch > 65536)
        add_error(e, "batch", "batch must be 1..65536 examples a step (0: the default), not %d",
                  p.batch);
    if (p.grad_accum < 0 || p.grad_accum > 65536)
        add_error(e, "grad_accum", "grad_accum must be 1..65536 micro-batches a step, not %d",
                  p.grad_accum);
    if (p.batch > 0 && p.grad_accum > 0)
        add_error(e, "grad_accum",
                  "give batch (examples a step) or grad_accum (micro-batches a step), not both");
    if (p.batch_tokens < 0 || p.batch_tokens > (1 << 24))
        add_error(e, "batch_tokens", "batch_tokens must be 1..%d (0: the default), not %d",
                  1 << 24, p.batch_tokens);
    if (!isfinite(p.val_split) || p.val_split < 0 || p.val_split >= 1)
        add_error(e, "val_split", "val_split must be in [0, 1), not %g", (double)p.val_split);
    else if (p.val_examples_path && p.val_split > 0)
        add_error(e, "val_split", "give val_split or a validation file, not both");
    if (p.val_examples_path && !p.examples && !p.examples_path)
        add_error(e, "val_examples_path", "a validation file holds chat examples, so the "
                  "training data must be chat examples too");
    if ((int)p.fit < LT_FIT_NONE || (int)p.fit > LT_FIT_LEFT)
        add_error(e, "fit", "fit must be none, middle or left");
    else if (p.fit != LT_FIT_NONE && (p.text || p.text_path))
        add_error(e, "fit", "fit applies to chat examples; text is cut into windows");
    if (p.memory_budget_mib > ((size_t)1 << 30))
        add_error(e, "memory_budget_mib", "memory_budget_mib %zu is not a plausible size",
                  p.memory_budget_mib);

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
