/* generate.h: the generation loop shared by `lathe run` and the server.
 *
 * Two layers:
 *
 *   lt_gen_seq: one sequence's generation state, knowing nothing of models. It is fed one
 *   row of logits at a time (or a chosen token), samples the next token, detokenizes it and
 *   hands out the text that has become safe to show: a piece never ends inside a UTF-8
 *   sequence that may still complete, and never shows a tail that could turn out to be the
 *   start of a stop string. It stops on an end-of-generation token, a stop string (whose
 *   text, and everything after it, is never shown), max_tokens or the room left in the
 *   context, and keeps the token counts, the finish reason and the timings.
 *
 *   lt_generator: drives lt_gen_seqs over one inference session: prefill of a prompt (in
 *   chunks), and one batched decode step for several running sequences at once, which is
 *   what a server runs per iteration. lt_generator_run is the run-to-completion
 *   convenience `lathe run` uses.
 *
 * Invariant of lt_gen_seq: text[0..shown) is exactly the concatenation of every piece
 * handed out so far, and when the sequence is done, text is the whole answer (up to, not
 * including, a stop string). A token sampled but not yet fed to the model is `pending`;
 * a finished sequence has none (its last token never needs a decode). */
#ifndef LATHE_GENERATE_H
#define LATHE_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/grammar.h"
#include "lathe/model.h"
#include "lathe/sampling.h"
#include "lathe/status.h"
#include "lathe/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

enum lt_gen_finish {
    LT_GEN_RUNNING = 0,    /* not finished */
    LT_GEN_FINISH_EOG,     /* an end-of-generation token (not part of the text) */
    LT_GEN_FINISH_STOP,    /* a stop string (not part of the text) */
    LT_GEN_FINISH_LENGTH,  /* max_tokens generated */
    LT_GEN_FINISH_CONTEXT, /* the context is full */
    LT_GEN_FINISH_GRAMMAR, /* the grammar is complete and allows nothing more */
    LT_GEN_FINISH_COUNT
};

/* "running", "eog", "stop", "length", "context", "grammar". */
const char *lt_gen_finish_name(enum lt_gen_finish f);
/* The OpenAI API's finish_reason: "stop" (eog, stop string, grammar), "length" (max_tokens,
 * context),
 * NULL while running. */
const char *lt_gen_finish_reason(enum lt_gen_finish f);

struct lt_gen_params {
    struct lt_sampler_params sampler;
    int32_t max_tokens;      /* tokens to generate at most; <= 0: until the context is full */
    const char *const *stops; /* [n_stops] stop strings, copied by lt_gen_seq_init; "" ignored */
    size_t n_stops;
    unsigned detokenize_flags; /* lt_detokenize_flags: LT_DETOKENIZE_SPECIAL shows control
                                * tokens' text (end-of-generation tokens are never shown) */
    bool ignore_eog;          /* keep going past end-of-generation tokens (benchmarks) */
    bool logprobs;            /* lt_gen_seq_sample records the sampled token's log-probability
                               * and the top_logprobs most likely tokens' in the seq's `lp` */
    int32_t top_logprobs;     /* 0..LT_GEN_MAX_TOP_LOGPROBS */
    /* NULL: none. Otherwise every token sampled keeps the text a prefix of a sentence of
     * the grammar: a sampled token the grammar rejects is replaced by a draw from the
     * tokens it allows (the logits of the others set to -inf), end-of-generation only once
     * the grammar can end; when it is complete and allows nothing more, the sequence ends
     * (LT_GEN_FINISH_GRAMMAR). The seq takes its own reference (lt_gen_seq_init). */
    struct lt_grammar *grammar;
};

#define LT_GEN_MAX_TOP_LOGPROBS 20

/* A sampled token's log-probability and the most likely tokens', all the log-softmax of the
 * logits the model produced (computed in double over the whole vocabulary), before any
 * sampling transform (penalties, temperature, top-k/p, min-p): OpenAI's `logprobs`, and
 * llama.cpp's n_probs without post_sampling_probs. */
struct lt_gen_logprob {
    lt_token id;    /* the sampled token */
    double logprob; /* its log-probability, whether or not it is among the top */
    int n_top;
    lt_token top_id[LT_GEN_MAX_TOP_LOGPROBS]; /* [n_top] most likely first; ties: lower id */
    double top_logprob[LT_GEN_MAX_TOP_LOGPROBS];
};

/* Fills out for `chosen` from logits[0..n_vocab) with the k (0..LT_GEN_MAX_TOP_LOGPROBS, at
 * most n_vocab) most likely tokens. A chosen id outside the vocabulary, a bad k, or logits
 * whose maximum is not finite are LT_ERR_INVALID. */
lt_status lt_gen_logprobs(const float *logits, size_t n_vocab, lt_token chosen, int k,
                          struct lt_gen_logprob *out);

/* lt_sampler_default_params, max_tokens 0, no stop strings, flags 0. */
struct lt_gen_params lt_gen_default_params(void);

struct lt_gen_stats {
    size_t n_prompt;    /* prompt tokens */
    size_t n_generated; /* tokens sampled, the end-of-generation one included */
    double t_prompt_s;  /* from lt_gen_seq_set_prompt to the first token (prefill + sample) */
    double t_gen_s;     /* from the first token to the last */
};

struct lt_gen_seq {
    const struct lt_tokenizer *tok;
    struct lt_gen_params params; /* stops point into stop_copies */
    char **stop_copies;          /* [params.n_stops] */
    struct lt_sampler sampler;
    struct lt_grammar_matcher *gm; /* when params.grammar; params.grammar is then a reference */
    float *masked;                 /* [cap_masked] the logits with rejected tokens at -inf */
    bool *allowed;                 /* [cap_masked] the grammar's mask */
    size_t cap_masked;
    uint64_t n_masked;             /* samples the grammar rejected (and so masked) */
    double t_grammar_s;            /* time in the grammar: checks, masks, accepts */

    lt_token *history;          /* [n_history]: the prompt, then the generated tokens */
    size_t n_history, cap_history;
    size_t n_prompt;
    size_t limit;               /* generated tokens allowed (max_tokens and the context) */
    bool limit_is_context;      /* the context, not max_tokens, set limit */

    struct lt_decode_stream ds;
    struct lt_strbuf text;      /* the generated text so far (complete UTF-8 sequences) */
    size_t shown;               /* text[0..shown) has been handed out */
    size_t piece_begin;         /* the last step's piece: text[piece_begin..shown) */

    lt_token pending;           /* sampled, not yet decoded; LT_TOKEN_NONE when done */
    lt_token last;              /* the last token sampled or accepted */
    size_t last_text_start;     /* text.len before the last accepted token's bytes */
    struct lt_gen_logprob lp;   /* the last sample's, when params.logprobs */
    enum lt_gen_finish finish;
    size_t stop_which;          /* index of the stop string found (FINISH_STOP) */

    double t_start, t_first, t_last; /* CLOCK_MONOTONIC seconds */
};

/* Copies params (the stop strings too) and checks the sampler parameters. */
lt_status lt_gen_seq_init(struct lt_gen_seq *g, const struct lt_tokenizer *t,
                          const struct lt_gen_params *params);
void lt_gen_seq_free(struct lt_gen_seq *g);

/* Starts a generation from prompt[0..n) (n >= 1; an empty prompt is LT_ERR_INVALID): resets
 * the text, counts and finish reason, reseeds the sampler, and records the start time.
 * room: how many tokens may be generated before the context is full (SIZE_MAX: no bound);
 * 0 is LT_ERR_INVALID naming the prompt length. */
lt_status lt_gen_seq_set_prompt(struct lt_gen_seq *g, const lt_token *prompt, size_t n,
                                size_t room);

/* Samples a token from logits[0..n_vocab) (the model's output after the last token fed) and
 * accepts it. The sequence must be running. */
lt_status lt_gen_seq_step(struct lt_gen_seq *g, const float *logits, size_t n_vocab);
/* step's sampling alone (*id not yet accepted): touches only g's sampler (and g->lp, filled
 * for *id when params.logprobs), so sequences of one batch may sample on threads of their
 * own, then accept in order. */
lt_status lt_gen_seq_sample(struct lt_gen_seq *g, const float *logits, size_t n_vocab,
                            lt_token *id);
/* Accepts `id` as the next generated token: the streaming and stopping logic of step
 * without the sampling. An id outside the vocabulary is LT_ERR_INVALID. */
lt_status lt_gen_seq_accept(struct lt_gen_seq *g, lt_token id);
/* Whether lt_gen_seq_sample would pick the largest logit, the lowest id among equals, and
 * read nothing else: greedy, no penalty, no grammar, no log-probabilities, running. Its
 * next token may then be picked where the logits are (lt_session_decode_pick) and given to
 * lt_gen_seq_accept, without copying the logits out. */
bool lt_gen_seq_plain_greedy(const struct lt_gen_seq *g);
/* Accepts such a pick: the id, or -1 (a NaN among the logits) refused as the sampler
 * refuses it. */
lt_status lt_gen_seq_accept_pick(struct lt_gen_seq *g, int32_t pick);

static inline bool lt_gen_seq_done(const struct lt_gen_seq *g) { return g->finish != LT_GEN_RUNNING; }
/* The text the last step made safe to show (may be empty); valid until the next call. */
const char *lt_gen_seq_piece(const struct lt_gen_seq *g, size_t *len);
struct lt_gen_stats lt_gen_seq_stats(const struct lt_gen_seq *g);

/* ---- prompts ---- */

/* Both fill an empty token list (out->n == 0). */

/* Tokens of a plain prompt: bos first when the vocabulary asks for it (add_bos), special
 * tokens' text recognised only when parse_special. Empty text is LT_ERR_INVALID. */
lt_status lt_gen_prompt_text(const struct lt_tokenizer *t, const char *text, bool parse_special,
                             struct lt_tokens *out);
/* Tokens of a chat rendered with the template and the generation prompt (special tokens
 * parsed, bos first when the vocabulary asks for it and the text does not start with it). */
lt_status lt_gen_prompt_chat(const struct lt_tokenizer *t, const struct lt_chat_template *ct,
                             const struct lt_chat_message *msgs, size_t n, bool enable_thinking,
                             struct lt_tokens *out);
/* The same with the template's options (tools, a prefill); add_generation_prompt is implied. */
lt_status lt_gen_prompt_chat_with(const struct lt_tokenizer *t, const struct lt_chat_template *ct,
                                  const struct lt_chat_message *msgs, size_t n,
                                  const struct lt_chat_options *opts, struct lt_tokens *out);

/* ---- driving a session ---- */

struct lt_generator {
    const struct lt_model *model;
    struct lt_session *session;
    int64_t n_vocab;
    int n_ctx;     /* tokens per sequence, as the session was made */
    int n_seq_max; /* sequences, as the session was made */
    int n_batch;   /* prompt tokens per prefill graph */
    float *logits; /* [n_seq_max, n_vocab] scratch */
    int32_t *ids;  /* [n_seq_max] scratch */
    bool *want;    /* [n_seq_max] scratch: the rows whose logits a sampler reads */
    int32_t *picks; /* [n_seq_max] scratch: the step's greedy picks */
};

/* The session must have been made for m with these n_ctx and n_seq_max; n_batch <= 0: 512. */
lt_status lt_generator_init(struct lt_generator *gen, const struct lt_model *m,
                            struct lt_session *s, int n_ctx, int n_seq_max, int n_batch);
void lt_generator_free(struct lt_generator *gen);

/* Starts g on session sequence seq: clears it, sets g's prompt (the room is what the
 * context leaves), prefills it in chunks of n_batch, and takes the first step. A prompt
 * that leaves no room in the context is LT_ERR_INVALID saying both lengths. */
lt_status lt_generator_prefill(struct lt_generator *gen, int seq, struct lt_gen_seq *g,
                               const lt_token *prompt, size_t n);

/* One decode step: feeds the pending token of gs[i] to session sequence seqs[i] for every
 * i < n (all running, distinct sequences) in one batched graph, then steps each with its
 * logits. When the decode itself fails, no sequence has moved; when sampling fails for one
 * (NaN logits), those before it have stepped and that one should be abandoned. */
lt_status lt_generator_decode(struct lt_generator *gen, int n, const int *seqs,
                              struct lt_gen_seq *const *gs);

/* Called with each non-empty piece; return false to stop (lt_generator_run then returns
 * LT_ERR_CANCELLED). */
typedef bool (*lt_gen_piece_fn)(void *user, const char *piece, size_t len);

/* Prefill, then decode until g is done, calling on_piece (may be NULL) as text comes. */
lt_status lt_generator_run(struct lt_generator *gen, int seq, struct lt_gen_seq *g,
                           const lt_token *prompt, size_t n, lt_gen_piece_fn on_piece,
                           void *user);

#ifdef __cplusplus
}
#endif
#endif
