/* dataset.c: the example list, plain-text windows, and the shuffled split.
 *
 * Text windows start every h = window / 2 tokens; window k's targets are stream tokens
 * k*h + 1 .. k*h + window, of which the first window - h were the previous window's, so
 * those positions get label -1 there. Every target is trained once, each with at least
 * window - h tokens of context except in the first window. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/rng.h"
#include "train/dataset.h"

void lt_dataset_free(struct lt_dataset *d)
{
    for (int i = 0; i < d->n; i++) {
        free(d->ex[i].tokens);
        free(d->ex[i].labels);
    }
    free(d->ex);
    memset(d, 0, sizeof(*d));
}

/* Appends an example of n tokens (copied) with labels (copied). */
lt_status lt_dataset_push(struct lt_dataset *d, const int32_t *tokens, const int32_t *labels, int n,
                          int source)
{
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 64;
        struct lt_example *ex = realloc(d->ex, (size_t)cap * sizeof(*ex));
        if (!ex)
            return lt_fail(LT_ERR_NOMEM, "out of memory for %d examples", cap);
        d->ex = ex;
        d->cap = cap;
    }
    struct lt_example *e = &d->ex[d->n];
    e->tokens = malloc((size_t)n * sizeof(int32_t));
    e->labels = malloc((size_t)n * sizeof(int32_t));
    if (!e->tokens || !e->labels) {
        free(e->tokens);
        free(e->labels);
        return lt_fail(LT_ERR_NOMEM, "out of memory for an example of %d tokens", n);
    }
    memcpy(e->tokens, tokens, (size_t)n * sizeof(int32_t));
    memcpy(e->labels, labels, (size_t)n * sizeof(int32_t));
    e->n = n;
    e->source = source;
    e->n_loss = 0;
    for (int i = 0; i < n; i++)
        e->n_loss += labels[i] >= 0;
    d->n++;
    d->n_tokens += n;
    d->n_loss += e->n_loss;
    return LT_OK;
}

lt_status lt_dataset_text(const struct lt_tokenizer *tok, const char *text, size_t len, int window,
                          struct lt_dataset *out)
{
    return lt_dataset_text_flags(tok, text, len, window, 0, out);
}

lt_status lt_dataset_text_flags(const struct lt_tokenizer *tok, const char *text, size_t len,
                                int window, unsigned extra_flags, struct lt_dataset *out)
{
    memset(out, 0, sizeof(*out));
    out->window = window;
    if (window < 2)
        return lt_fail(LT_ERR_INVALID, "window must be at least 2 tokens, not %d", window);
    struct lt_tokens tk = {0};
    unsigned flags = lt_tokenizer_add_bos(tok) && lt_tokenizer_bos(tok) != LT_TOKEN_NONE
                         ? LT_TOKENIZE_ADD_BOS
                         : 0;
    flags |= extra_flags & LT_TOKENIZE_PARSE_SPECIAL;
    lt_status st = lt_tokenize(tok, text, len, flags, &tk);
    if (st != LT_OK)
        return st;
    int32_t *labels = NULL;
    int64_t n = (int64_t)tk.n;
    if (n < 2) {
        st = lt_fail(LT_ERR_INVALID, "the text has %lld token%s; training needs at least 2",
                     (long long)n, n == 1 ? "" : "s");
        goto out_free_tokens;
    }
    labels = malloc((size_t)window * sizeof(int32_t));
    if (!labels) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory");
        goto out_free_tokens;
    }
    const int64_t h = window / 2, overlap = window - h;
    for (int64_t k = 0;; k++) {
        int64_t s = k * h;
        /* the first target this window adds: s + 1 in the first, s + overlap + 1 after */
        int64_t first_new = k == 0 ? s + 1 : s + overlap + 1;
        if (first_new > n - 1)
            break;
        int64_t m = n - 1 - s < window ? n - 1 - s : window; /* inputs with a target */
        for (int64_t i = 0; i < m; i++)
            labels[i] = (k > 0 && i < overlap) ? -1 : tk.ids[s + i + 1];
        st = lt_dataset_push(out, tk.ids + s, labels, (int)m, (int)k);
        if (st != LT_OK)
            break;
    }
    free(labels);
out_free_tokens:
    lt_tokens_free(&tk);
    if (st != LT_OK)
        lt_dataset_free(out);
    return st;
}

void lt_dataset_shuffle(int *idx, int n, struct lt_rng *rng)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(lt_rng_next(rng) % (uint64_t)(i + 1));
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

lt_status lt_dataset_split(int n, float val_split, uint64_t seed, int **order, int *n_val)
{
    *order = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    if (!*order)
        return lt_fail(LT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        (*order)[i] = i;
    struct lt_rng rng;
    lt_rng_seed(&rng, seed);
    lt_dataset_shuffle(*order, n, &rng);
    int v = 0;
    if (val_split > 0) {
        v = (int)lroundf((float)n * val_split);
        if (v < 1)
            v = 1;
        if (v > n - 1)
            v = n - 1;
    }
    *n_val = v < 0 ? 0 : v;
    return LT_OK;
}
