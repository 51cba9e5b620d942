/* data.c: a job's training data: read (a file, or content given in memory), tokenized (text
 * cut into windows, or chat examples rendered through the template) and split, or given its
 * validation examples from a file of their own (val_examples_path).
 *
 * The job and lt_train_data_check run this same code with the same tokenizer and template
 * (both come from the model's GGUF), so data a caller checked first is data the job
 * accepts, and data it refused names the same example the job would have failed on. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/tokenizer.h"
#include "lathe/train.h"
#include "train/dataset.h"
#include "train/train_impl.h"

static lt_status read_file(const char *path, char **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return lt_fail(LT_ERR_IO, "%s: %s", path, strerror(errno));
    lt_status st = LT_OK;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (n < cap)
            break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb)
            free(buf);
        buf = nb;
    }
    if (!buf)
        st = lt_fail(LT_ERR_NOMEM, "%s: out of memory reading it", path);
    else if (ferror(f))
        st = lt_fail(LT_ERR_IO, "%s: read error", path);
    fclose(f);
    if (st != LT_OK) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return LT_OK;
}

/* The fault of a failed load: the example and line the dataset named, the message without
 * the "example N (line L): " it starts with. */
static void note_fault(const struct lt_dataset *d, bool chat, struct lt_train_data_fault *fault)
{
    if (!fault)
        return;
    const char *msg = lt_last_error();
    fault->example = chat ? d->bad_example : -1;
    fault->line = chat ? d->bad_line : -1;
    if (fault->example >= 0) {
        char prefix[64];
        int n =
            snprintf(prefix, sizeof(prefix), "example %d (line %d): ", fault->example, fault->line);
        if (n > 0 && !strncmp(msg, prefix, (size_t)n))
            msg += n;
    }
    snprintf(fault->reason, sizeof(fault->reason), "%s", msg);
}

/* Appends the examples of p->val_examples_path to out (whose first n_train examples are the
 * training ones, in *order) and makes them the validation split: *order becomes those, then
 * the training order. */
static lt_status add_held_out(const struct lt_tokenizer *tok, const struct lt_chat_template *ct,
                              const struct lt_train_params *p, struct lt_dataset *out,
                              int **order, int *n_val, struct lt_train_data_fault *fault)
{
    const char *path = p->val_examples_path;
    char *file = NULL;
    size_t len = 0;
    struct lt_dataset v = {0};
    lt_status st = read_file(path, &file, &len);
    if (st != LT_OK)
        return st;
    st = lt_dataset_chat(tok, ct, file, len, p->window, p->fit, &v);
    free(file);
    if (st != LT_OK) {
        note_fault(&v, true, fault);
        lt_dataset_free(&v);
        return lt_fail(st, "%s: %s", path, lt_last_error());
    }
    int n_train = out->n;
    int *merged = malloc((size_t)(n_train + v.n) * sizeof(int));
    if (!merged)
        st = lt_fail(LT_ERR_NOMEM, "out of memory");
    for (int i = 0; st == LT_OK && i < v.n; i++) {
        st = lt_dataset_push(out, v.ex[i].tokens, v.ex[i].labels, v.ex[i].n, v.ex[i].source);
        merged[i] = n_train + i;
    }
    if (st != LT_OK) {
        free(merged);
        lt_dataset_free(&v);
        return st;
    }
    memcpy(merged + v.n, *order, (size_t)n_train * sizeof(int));
    free(*order);
    *order = merged;
    *n_val = v.n;
    out->n_fitted += v.n_fitted;
    out->n_skipped += v.n_skipped;
    lt_dataset_free(&v);
    return LT_OK;
}

lt_status lt_train_data_load(const struct lt_tokenizer *tok, const struct lt_chat_template *ct,
                             const struct lt_train_params *p, struct lt_dataset *out, int **order,
                             int *n_val, struct lt_train_data_fault *fault)
{
    memset(out, 0, sizeof(*out));
    *order = NULL;
    *n_val = 0;
    if (fault)
        *fault = (struct lt_train_data_fault){.example = -1, .line = -1};
    const char *path = p->text_path ? p->text_path : p->examples_path;
    bool chat = p->examples || p->examples_path;
    if (chat && !ct)
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "chat examples are rendered through the model's chat template, and this "
                       "model has none; give text instead");
    char *file = NULL;
    size_t len = 0;
    const char *content = p->text ? p->text : p->examples;
    lt_status st = LT_OK;
    if (path) {
        if ((st = read_file(path, &file, &len)) != LT_OK)
            return st;
        content = file;
    } else {
        len = strlen(content);
    }
    if (chat)
        st = lt_dataset_chat(tok, ct, content, len, p->window, p->fit, out);
    else
        st = lt_dataset_text_flags(tok, content, len, p->window,
                                   p->parse_special ? LT_TOKENIZE_PARSE_SPECIAL : 0, out);
    free(file);
    if (st != LT_OK) {
        note_fault(out, chat, fault);
        return path ? lt_fail(st, "%s: %s", path, lt_last_error()) : st;
    }
    st = lt_dataset_split(out->n, p->val_split, p->seed, order, n_val);
    if (st == LT_OK && out->n - *n_val < 1)
        st = lt_fail(LT_ERR_INVALID, "no example is left for training after the validation split");
    bool split_failed = st != LT_OK;
    if (st == LT_OK && chat && p->val_examples_path)
        st = add_held_out(tok, ct, p, out, order, n_val, fault); /* its own fault */
    if (st != LT_OK) {
        if (split_failed)
            note_fault(out, false, fault);
        lt_dataset_free(out);
        free(*order);
        *order = NULL;
    }
    return st;
}

lt_status lt_train_data_check(const struct lt_tokenizer *tok, const struct lt_chat_template *ct,
                              const struct lt_train_params *params,
                              struct lt_train_data_fault *fault)
{
    struct lt_train_params p = *params;
    lt_train_params_defaults(&p);
    struct lt_dataset d;
    int *order, n_val;
    lt_status st = lt_train_data_load(tok, ct, &p, &d, &order, &n_val, fault);
    if (st == LT_OK) {
        lt_dataset_free(&d);
        free(order);
    }
    return st;
}
