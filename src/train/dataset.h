/* dataset.h (internal): training examples made from plain text or chat JSONL.
 *
 * An example is a run of at most `window` input tokens with, per position, the label the
 * model should predict next (-1: no loss there). Labels are always a shift of the tokens
 * the example was cut from (label[i] is the token that follows token i in the source), so
 * the graph's inputs need no shifting.
 *
 * Text: the token stream is cut into windows of `window` inputs starting every window / 2
 * tokens (they overlap by half). Each target token carries loss exactly once: in every
 * window after the first, the positions whose targets the previous window already covered
 * are context only (label -1).
 *
 * Chat: each JSONL line is {"prompt", "completion"} (plus an optional "system") or
 * {"messages": [{"role", "content", "train"?, "tool_calls"?}, ...]}, with an optional
 * "tools" array, rendered through the model's chat template (the tools as the server
 * renders them; an assistant message with tool_calls may have a null content). Loss is on
 * the tokens of assistant turns (content and closing marker), except turns marked "train":
 * false, which stay as context. An example of window + 1 tokens fits (its last token is only
 * a target: the label at window - 1); a longer one is refused with its index unless a fit
 * policy is given. */
#ifndef LATHE_TRAIN_DATASET_H
#define LATHE_TRAIN_DATASET_H

#include <stdint.h>

#include "lathe/status.h"
#include "lathe/tokenizer.h"
#include "lathe/train.h"

struct lt_example {
    int32_t *tokens; /* [n] */
    int32_t *labels; /* [n]: the next token, or -1 */
    int n;           /* 1..window */
    int n_loss;      /* labels >= 0 */
    int source;      /* the JSONL example's index (0-based), or the text window's */
};

struct lt_dataset {
    struct lt_example *ex;
    int n, cap;
    int window;
    int64_t n_tokens; /* sum of n */
    int64_t n_loss;   /* sum of n_loss */
    int n_fitted;     /* examples shortened by the fit policy */
    int n_skipped;    /* examples the fit policy could not fit, left out */
    /* after lt_dataset_chat failed: the example at fault (0-based, blank lines not counted)
     * and its line (1-based); -1 when no one example is (none at all, a bad window) */
    int bad_example, bad_line;
};

/* Plain text. Adds the tokenizer's bos first when it asks for one. Fewer than two tokens
 * is LT_ERR_INVALID. */
lt_status lt_dataset_text(const struct lt_tokenizer *tok, const char *text, size_t len, int window,
                          struct lt_dataset *out);
/* The same, with the tokenizer's flags besides bos (LT_TOKENIZE_PARSE_SPECIAL: special
 * tokens' text in the text is read as those tokens). */
lt_status lt_dataset_text_flags(const struct lt_tokenizer *tok, const char *text, size_t len,
                                int window, unsigned flags, struct lt_dataset *out);

/* Chat JSONL (blank lines skipped). A malformed line is LT_ERR_FORMAT, an example too long
 * for the window (with fit NONE) or with nothing to train on LT_ERR_INVALID; the message
 * starts "example N (line L): " and out->bad_example, out->bad_line say the same. With fit
 * MIDDLE or LEFT an example that still cannot fit is left out and counted (n_skipped); none
 * left at all is LT_ERR_INVALID naming the window. Needs jansson in the build. */
lt_status lt_dataset_chat(const struct lt_tokenizer *tok, const struct lt_chat_template *ct,
                          const char *jsonl, size_t len, int window, enum lt_fit_policy fit,
                          struct lt_dataset *out);

void lt_dataset_free(struct lt_dataset *d);
/* Appends an example (tokens and labels copied). */
lt_status lt_dataset_push(struct lt_dataset *d, const int32_t *tokens, const int32_t *labels, int n,
                          int source);

/* A permutation of 0..n-1 drawn from seed (Fisher-Yates over lathe's own PRNG, the same on
 * every machine), split into the first n_val (validation) and the rest (training).
 * n_val = round(n * val_split), at least 1 when val_split > 0, and at most n - 1. */
lt_status lt_dataset_split(int n, float val_split, uint64_t seed, int **order, int *n_val);

/* Shuffles idx[0..n) in place with the PRNG state (epoch-to-epoch reshuffles). */
struct lt_rng;
void lt_dataset_shuffle(int *idx, int n, struct lt_rng *rng);

#endif
