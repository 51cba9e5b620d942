/* sampling.h: choosing the next token from logits, and knowing when to stop.
 *
 * The sampler applies, in this order (Hugging Face's order of logits processors and warpers):
 *   repetition, presence and frequency penalties -> temperature -> top-k -> top-p -> min-p
 *   -> draw.
 * temperature <= 0 means greedy: the highest logit after the penalty (lowest id on a tie),
 * with no random draw. Each filter keeps at least one token. Ties in the sort order are
 * broken by the lower token id, so a result depends only on the logits, the parameters,
 * the history and the seed: the PRNG is lathe's own (xoshiro256**, seeded through
 * splitmix64) and gives the same sequence on every machine.
 *
 * Stopping: generation ends on an end-of-generation token (lt_tokenizer_is_eog) or when the
 * decoded text contains a stop string. lt_stop_scan finds a stop string that spans token
 * boundaries and says how much of the text is safe to show: everything except a tail that
 * could still turn out to be the start of a stop string. */
#ifndef LATHE_SAMPLING_H
#define LATHE_SAMPLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/rng.h"
#include "lathe/status.h"
#include "lathe/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- sampler ---- */

struct lt_sampler_params {
    float temperature;     /* <= 0: greedy */
    int32_t top_k;         /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off; keeps tokens with p >= min_p * p_max */
    float repeat_penalty;  /* 1: off; a logit l of a token seen in the window becomes
                            * l / penalty if l > 0, else l * penalty (once per token) */
    int32_t repeat_last_n; /* the window: the last n tokens of the history; < 0: all of it */
    uint64_t seed;
    /* 0: off. A token seen k > 0 times in the window loses k * frequency_penalty +
     * presence_penalty from its logit, after the repeat penalty (OpenAI's penalties over
     * llama.cpp's window of repeat_last_n tokens) */
    float presence_penalty, frequency_penalty;
};

/* temperature 1, top_k off, top_p 1, min_p 0, repeat_penalty 1, repeat_last_n 64, seed 0,
 * presence and frequency penalties 0. */
struct lt_sampler_params lt_sampler_default_params(void);

struct lt_sampler_cand {
    float logit;
    lt_token id;
};

struct lt_sampler {
    struct lt_sampler_params params;
    struct lt_rng rng;
    struct lt_sampler_cand *cands; /* scratch, [cap] */
    size_t cap;
    uint32_t *seen; /* scratch, [cap]: a token's count in the penalty window */
    uint64_t *pen_bits; /* scratch, [cap / 64 + 1]: the tokens a penalty changed this call */
    float *adj;         /* scratch, [cap]: their changed logits */
};

/* Checks the parameters (a NaN or a negative top_p/min_p/penalty is LT_ERR_INVALID). */
lt_status lt_sampler_init(struct lt_sampler *s, const struct lt_sampler_params *p);
void lt_sampler_free(struct lt_sampler *s);

/* Picks the next token. logits[0..n_vocab) is not modified; history[0..n_history) are the
 * tokens so far (prompt included), used by the repetition penalty. A token id in the
 * history outside the vocabulary is LT_ERR_INVALID; so is a logit that is NaN. */
lt_status lt_sampler_sample(struct lt_sampler *s, const float *logits, size_t n_vocab,
                            const lt_token *history, size_t n_history, lt_token *out);

/* ---- stop strings ---- */

struct lt_stop_result {
    bool stopped;    /* a stop string occurs in the text */
    size_t stop_at;  /* where the earliest one starts (when stopped) */
    size_t which;    /* its index in stops (when stopped) */
    size_t safe_len; /* text[0..safe_len) may be shown: stop_at when stopped, else all but
                      * the longest tail that is a proper prefix of some stop string */
};

/* text[0..len) is all the text generated so far; `from` is where the search may start
 * (the previous call's safe_len: no stop string can start before it). Empty stop strings
 * are ignored. */
struct lt_stop_result lt_stop_scan(const char *text, size_t len, size_t from,
                                   const char *const *stops, size_t n_stops);

#ifdef __cplusplus
}
#endif
#endif
