/* param_table.c: the training parameters' table (lathe/train.h): names, types, ranges,
 * defaults and help, written once for `lathe train`, POST /train, /v1/fine_tuning/jobs, the
 * validation and the help texts. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/train.h"

#define AT(field) offsetof(struct lt_train_params, field)

static const struct lt_train_field fields[] = {
    {"data", "out", "--out", NULL, LT_TF_STRING, 0, 0, false, false, false, "OUT.gguf", NULL,
     "the output file (the server: a name in --train-dir)", AT(out)},
    {NULL, NULL, "--text", NULL, LT_TF_STRING, 0, 0, false, false, false, "FILE", NULL,
     "plain text, cut into windows that overlap by half", AT(text_path)},
    {NULL, "text", NULL, NULL, LT_TF_STRING, 0, 0, false, false, false, NULL, NULL,
     "plain text itself, cut into windows that overlap by half", AT(text)},
    {NULL, NULL, "--examples", NULL, LT_TF_STRING, 0, 0, false, false, false, "FILE", NULL,
     "chat JSONL: {\"prompt\",\"completion\"} or {\"messages\":[...]} a line, optionally "
     "with \"tools\":[...]",
     AT(examples_path)},
    {NULL, "examples", NULL, NULL, LT_TF_STRING, 0, 0, false, false, false, NULL, NULL,
     "chat examples: JSONL text, or an array of example objects", AT(examples)},
    {NULL, "window", "--window", NULL, LT_TF_INT, 2, 1 << 20, false, false, false, "N", "256",
     "tokens per example (a chat example may have one more: its last token is only a "
     "target)",
     AT(window)},
    {NULL, "fit", "--fit", NULL, LT_TF_FIT, 0, 0, false, false, false, "none|middle|left", "none",
     "an example longer than the window: refuse it, drop its oldest exchanges, or keep "
     "the tail that ends its last trained turn (a turn cut at the front is masked); with "
     "middle or left, one that still cannot fit is skipped and counted",
     AT(fit)},
    {NULL, "val_split", "--val-split", NULL, LT_TF_FLOAT, 0, 1, false, true, false, "F",
     "0 (POST /train: 0.1)", "fraction held out for the eval loss", AT(val_split)},
    {NULL, "seed", "--seed", NULL, LT_TF_U64, 0, 9.2e18, false, false, true, "N", "42",
     "shuffling and LoRA init", AT(seed)},
    {NULL, "parse_special", NULL, NULL, LT_TF_BOOL, 0, 0, false, false, false, NULL, "true",
     "special tokens' text in plain text is read as those tokens (false is refused: chat "
     "examples always are)",
     AT(parse_special)},
    {"LoRA (the default) or full fine-tuning", "rank", "--rank", NULL, LT_TF_INT, 1, 4096, false,
     false, false, "N", "8", "adapter rank", AT(rank)},
    {NULL, "alpha", "--alpha", NULL, LT_TF_FLOAT, 0, 1e6, true, false, false, "F", "2 x rank",
     "adapter alpha", AT(alpha)},
    {NULL, "targets", "--targets", NULL, LT_TF_STRING, 0, 0, false, false, false, "LIST",
     "attention", "modules, e.g. attn_q,attn_v,ffn_down (JSON: also an array)", AT(targets)},
    {NULL, "top_layers", "--top-layers", NULL, LT_TF_INT, 0, 1 << 20, false, false, false, "K",
     "0 (all)", "adapt only the last K blocks", AT(top_layers)},
    {NULL, NULL, "--full", NULL, LT_TF_BOOL, 0, 0, false, false, false, NULL, NULL,
     "train every weight (F32/F16/BF16 models); writes a model", AT(full)},
    {"schedule", "epochs", "--epochs", "n_epochs", LT_TF_INT, 1, LT_TRAIN_MAX_EPOCHS, false, false,
     false, "N", "1", "passes over the data", AT(epochs)},
    {NULL, "lr", "--lr", NULL, LT_TF_FLOAT, 0, 1, true, false, false, "F", "1e-3 LoRA, 1e-4 full",
     "learning rate (fine-tuning jobs: learning_rate_multiplier x "
     "1e-3)",
     AT(lr)},
    {NULL, "weight_decay", "--weight-decay", NULL, LT_TF_FLOAT, 0, 1, false, false, false, "F", "0",
     "AdamW weight decay", AT(weight_decay)},
    {NULL, "batch_tokens", "--batch-tokens", "batch_tokens", LT_TF_INT, 1, 1 << 24, false, false,
     true, "N", "the most that fit, up to 16384 (CPU: one window)",
     "tokens per micro-batch: N / window sequences side by side", AT(batch_tokens)},
    {NULL, "grad_accum", "--grad-accum", "grad_accum", LT_TF_INT, 1, 65536, false, false, true, "K",
     "1", "micro-batches per optimizer step", AT(grad_accum)},
    {NULL, "no_pack", "--no-pack", NULL, LT_TF_BOOL, 0, 0, false, false, false, NULL, NULL,
     "one example a sequence, padded after it (by default examples shorter than the window "
     "are packed one after another into the sequences, each starting at position 0 with "
     "empty state and seeing only itself)",
     AT(no_pack)},
    {NULL, "batch", "--batch", "batch_size", LT_TF_INT, 1, 65536, false, false, true, "N", NULL,
     "examples per optimizer step instead (micro-batches of up to N sequences, as many as "
     "that takes)",
     AT(batch)},
    {"admission", "memory_budget_mib", "--memory-budget-mib", NULL, LT_TF_SIZE, 0, 1 << 30, false,
     false, true, "N", "free memory less serving's reserve",
     "refuse a job whose estimated peak is larger (the server: only lower than its own)",
     AT(memory_budget_mib)},
    {NULL, "device_only", "--device-only", NULL, LT_TF_BOOL, 0, 0, false, false, false, NULL, NULL,
     "refuse rather than run a node on the CPU", AT(device_only)},
    {NULL, "f32_products", "--f32-products", NULL, LT_TF_BOOL, 0, 0, false, false, false, NULL,
     NULL,
     "on the device, keep products by F32 weights, attention's and the delta rule's at "
     "F32 precision (slower; by default their operands are rounded to BF16, the delta rule's "
     "to TF32)",
     AT(f32_products)},
    {NULL, "checkpoint", "--checkpoint", NULL, LT_TF_CHECKPOINT, 0, 0, false, false, false,
     "auto|on|off|selective", "auto",
     "recompute each layer's activations in the backward instead of "
     "keeping them (less memory, ~1/3 more compute); selective: only those that cost no "
     "product to make again (norms, elementwise ops, rope, SwiGLU, the short convolution); "
     "auto: off; if that does not fit, selective where it fits, else on (JSON: true or "
     "false for on or off)",
     AT(checkpoint)},
    {NULL, "dry_run", "--dry-run", NULL, LT_TF_BOOL, 0, 0, false, false, false, NULL, NULL,
     "admit and report, then stop without training", AT(dry_run)},
    {"data parallelism", NULL, "--gpus", NULL, LT_TF_INT, 1, 64, false, false, true, "N", "1",
     "ranks, one a GPU, each taking its share of every step's micro-batches, their gradients "
     "summed before each step (more than 1 needs a build with -DLATHE_NCCL=ON)",
     AT(gpus)},
};

const struct lt_train_field *lt_train_fields(size_t *n)
{
    *n = sizeof(fields) / sizeof(fields[0]);
    return fields;
}

const struct lt_train_field *lt_train_field_by_flag(const char *flag)
{
    for (size_t i = 0; flag && i < sizeof(fields) / sizeof(fields[0]); i++)
        if (fields[i].flag && !strcmp(fields[i].flag, flag))
            return &fields[i];
    return NULL;
}

const struct lt_train_field *lt_train_field_by_key(const char *key)
{
    for (size_t i = 0; key && i < sizeof(fields) / sizeof(fields[0]); i++)
        if ((fields[i].key && !strcmp(fields[i].key, key)) ||
            (fields[i].ft_key && !strcmp(fields[i].ft_key, key)))
            return &fields[i];
    return NULL;
}

static bool parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

bool lt_train_field_parse(const struct lt_train_field *f, const char *text,
                          struct lt_train_params *p)
{
    void *at = (char *)p + f->offset;
    double v;
    switch (f->type) {
    case LT_TF_STRING: *(const char **)at = text; return true;
    case LT_TF_BOOL: *(bool *)at = true; return true;
    case LT_TF_FIT: return lt_fit_policy_parse(text, (enum lt_fit_policy *)at);
    case LT_TF_CHECKPOINT: {
        static const char *const names[] = {"auto", "on", "off", "selective"};
        for (int i = 0; i < 4; i++)
            if (!strcmp(text, names[i])) {
                *(enum lt_checkpoint *)at = (enum lt_checkpoint)i;
                return true;
            }
        return false;
    }
    case LT_TF_FLOAT:
        if (!parse_double(text, &v))
            return false;
        *(float *)at = (float)v;
        return true;
    default: break;
    }
    /* the integers: whole numbers that fit their type (the range is validation's) */
    if (!parse_double(text, &v) || v != floor(v) || fabs(v) > 9.2e18)
        return false;
    if (f->type == LT_TF_INT) {
        if (v < -2147483648.0 || v > 2147483647.0)
            return false;
        *(int *)at = (int)v;
    } else if (v < 0) {
        return false;
    } else if (f->type == LT_TF_U64) { /* digits alone: exact past 2^53 */
        *(uint64_t *)at = strspn(text, "0123456789") == strlen(text) ? strtoull(text, NULL, 10)
                                                                     : (uint64_t)v;
    } else {
        *(size_t *)at = (size_t)v;
    }
    return true;
}

bool lt_train_field_in_range(const struct lt_train_field *f, double v)
{
    if (f->lo == 0 && f->hi == 0)
        return true;
    return (f->lo_open ? v > f->lo : v >= f->lo) && (f->hi_open ? v < f->hi : v <= f->hi);
}

void lt_train_field_range_text(const struct lt_train_field *f, char *out, size_t size)
{
    if (f->lo == 0 && f->hi == 0)
        snprintf(out, size, "%s", "");
    else if (f->type == LT_TF_FLOAT)
        snprintf(out, size, "in %c%g, %g%c", f->lo_open ? '(' : '[', f->lo, f->hi,
                 f->hi_open ? ')' : ']');
    else if (f->hi < 1e10)
        snprintf(out, size, "%.0f..%.0f", f->lo, f->hi);
    else
        snprintf(out, size, "%.0f..%g", f->lo, f->hi);
}
