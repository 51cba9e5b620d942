/* gen_seq.c: one sequence's generation state (include/lathe/generate.h): sampling, streaming
 * detokenization, stop strings, limits, counts and timings. Knows nothing of models.
 *
 * Text flows in two hold-back stages: the decode stream keeps a UTF-8 sequence that may
 * still complete out of `text`; lt_stop_scan keeps a tail of `text` that could still be the
 * start of a stop string out of what is shown (text[0..shown)). When the sequence finishes
 * for any reason other than a stop string, both stages are flushed: what was held back
 * was never part of a stop string after all. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lathe/generate.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *const finish_names[LT_GEN_FINISH_COUNT] = {
    [LT_GEN_RUNNING] = "running",       [LT_GEN_FINISH_EOG] = "eog",
    [LT_GEN_FINISH_STOP] = "stop",      [LT_GEN_FINISH_LENGTH] = "length",
    [LT_GEN_FINISH_CONTEXT] = "context", [LT_GEN_FINISH_GRAMMAR] = "grammar",
};

const char *lt_gen_finish_name(enum lt_gen_finish f)
{
    return (unsigned)f < LT_GEN_FINISH_COUNT ? finish_names[f] : "?";
}

const char *lt_gen_finish_reason(enum lt_gen_finish f)
{
    switch (f) {
    case LT_GEN_FINISH_EOG:
    case LT_GEN_FINISH_STOP:
    case LT_GEN_FINISH_GRAMMAR:
        return "stop";
    case LT_GEN_FINISH_LENGTH:
    case LT_GEN_FINISH_CONTEXT:
        return "length";
    default:
        return NULL;
    }
}

struct lt_gen_params lt_gen_default_params(void)
{
    return (struct lt_gen_params){.sampler = lt_sampler_default_params()};
}

static void free_stops(struct lt_gen_seq *g)
{
    if (g->stop_copies)
        for (size_t i = 0; i < g->params.n_stops; i++)
            free(g->stop_copies[i]);
    free(g->stop_copies);
    g->stop_copies = NULL;
}

lt_status lt_gen_seq_init(struct lt_gen_seq *g, const struct lt_tokenizer *t,
                          const struct lt_gen_params *params)
{
    memset(g, 0, sizeof(*g));
    g->tok = t;
    g->params = *params;
    g->params.stops = NULL;
    g->pending = g->last = LT_TOKEN_NONE;
    lt_status st;
    if (params->n_stops) {
        if (!params->stops) {
            g->params.n_stops = 0;
            return lt_fail(LT_ERR_INVALID, "%zu stop strings but no list", params->n_stops);
        }
        g->stop_copies = calloc(params->n_stops, sizeof(char *));
        if (!g->stop_copies) {
            g->params.n_stops = 0;
            return lt_fail(LT_ERR_NOMEM, "out of memory for stop strings");
        }
        for (size_t i = 0; i < params->n_stops; i++) {
            if (!params->stops[i]) {
                st = lt_fail(LT_ERR_INVALID, "stop string %zu is NULL", i);
                goto out_free_stops;
            }
            g->stop_copies[i] = strdup(params->stops[i]);
            if (!g->stop_copies[i]) {
                st = lt_fail(LT_ERR_NOMEM, "out of memory for stop strings");
                goto out_free_stops;
            }
        }
        g->params.stops = (const char *const *)g->stop_copies;
    }
    if (params->logprobs &&
        (params->top_logprobs < 0 || params->top_logprobs > LT_GEN_MAX_TOP_LOGPROBS)) {
        st = lt_fail(LT_ERR_INVALID, "top_logprobs is %d; it must be 0..%d",
                     (int)params->top_logprobs, LT_GEN_MAX_TOP_LOGPROBS);
        goto out_free_stops;
    }
    if ((st = lt_sampler_init(&g->sampler, &params->sampler)) != LT_OK)
        goto out_free_stops;
    if (params->grammar && (st = lt_grammar_matcher_new(params->grammar, &g->gm)) != LT_OK)
        goto out_free_sampler;
    lt_decode_stream_init(&g->ds, t, params->detokenize_flags);
    return LT_OK;
out_free_sampler:
    lt_sampler_free(&g->sampler);
out_free_stops:
    free_stops(g);
    return st;
}

void lt_gen_seq_free(struct lt_gen_seq *g)
{
    if (!g)
        return;
    free_stops(g);
    lt_sampler_free(&g->sampler);
    lt_grammar_matcher_free(g->gm);
    free(g->masked);
    free(g->allowed);
    free(g->history);
    lt_strbuf_free(&g->text);
    memset(g, 0, sizeof(*g));
}

static lt_status reserve_history(struct lt_gen_seq *g, size_t n)
{
    if (n <= g->cap_history)
        return LT_OK;
    size_t cap = g->cap_history ? g->cap_history : 256;
    while (cap < n)
        cap *= 2;
    lt_token *h = realloc(g->history, cap * sizeof(*h));
    if (!h)
        return lt_fail(LT_ERR_NOMEM, "out of memory for %zu tokens of history", n);
    g->history = h;
    g->cap_history = cap;
    return LT_OK;
}

/* An empty buffer still gets storage, so text.data is always a NUL-terminated string. */
static lt_status text_reset(struct lt_strbuf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = 0;
    return lt_strbuf_append(b, "", 0);
}

static void text_truncate(struct lt_strbuf *b, size_t len)
{
    b->len = len;
    if (b->cap)
        b->data[len] = 0;
}

lt_status lt_gen_seq_set_prompt(struct lt_gen_seq *g, const lt_token *prompt, size_t n,
                                size_t room)
{
    if (n == 0)
        return lt_fail(LT_ERR_INVALID, "the prompt is empty");
    if (room == 0)
        return lt_fail(LT_ERR_INVALID, "the prompt (%zu tokens) leaves no room to generate", n);
    size_t n_tok = lt_tokenizer_n_tokens(g->tok);
    for (size_t i = 0; i < n; i++)
        if (prompt[i] < 0 || (size_t)prompt[i] >= n_tok)
            return lt_fail(LT_ERR_INVALID, "prompt token %zu is %d, outside the vocabulary of %zu",
                           i, prompt[i], n_tok);
    lt_status st = reserve_history(g, n + 16);
    if (st == LT_OK)
        st = text_reset(&g->text);
    if (st != LT_OK)
        return st;
    memcpy(g->history, prompt, n * sizeof(*prompt));
    g->n_history = g->n_prompt = n;
    size_t max = g->params.max_tokens > 0 ? (size_t)g->params.max_tokens : SIZE_MAX;
    g->limit = max < room ? max : room;
    g->limit_is_context = room <= max;
    lt_decode_stream_init(&g->ds, g->tok, g->params.detokenize_flags);
    g->shown = g->piece_begin = 0;
    g->pending = g->last = LT_TOKEN_NONE;
    g->finish = LT_GEN_RUNNING;
    g->stop_which = 0;
    lt_rng_seed(&g->sampler.rng, g->params.sampler.seed);
    if (g->gm)
        lt_grammar_matcher_reset(g->gm);
    g->n_masked = 0;
    g->t_grammar_s = 0;
    g->t_start = now_s();
    g->t_first = g->t_last = 0;
    return LT_OK;
}

/* Scans text for a stop string from `shown` on; moves `shown` to what may be shown and
 * finishes the sequence (truncating the text) when one is found. */
static void scan_stops(struct lt_gen_seq *g)
{
    struct lt_stop_result r =
        lt_stop_scan(g->text.data, g->text.len, g->shown, g->params.stops, g->params.n_stops);
    if (r.stopped) {
        text_truncate(&g->text, r.stop_at);
        g->finish = LT_GEN_FINISH_STOP;
        g->stop_which = r.which;
    }
    g->shown = r.safe_len;
}

/* Ends the sequence for `why` (not a stop string): flushes what both stages held back,
 * unless the flushed bytes complete a stop string. */
static lt_status finish_flush(struct lt_gen_seq *g, enum lt_gen_finish why)
{
    lt_status st = lt_decode_stream_flush(&g->ds, &g->text);
    if (st != LT_OK)
        return st;
    scan_stops(g);
    if (g->finish == LT_GEN_RUNNING) {
        g->finish = why;
        g->shown = g->text.len;
    }
    return LT_OK;
}

/* Moves the grammar past token id (before anything else changes, so a token it rejects
 * leaves g as it was). */
static lt_status grammar_accept(struct lt_gen_seq *g, lt_token id, bool eog)
{
    if (eog)
        return lt_grammar_matcher_can_end(g->gm)
                   ? LT_OK
                   : lt_fail(LT_ERR_INVALID, "end of generation before the grammar is complete");
    enum lt_token_type ty = lt_tokenizer_token_type(g->tok, id);
    size_t n;
    const char *b = lt_tokenizer_token_bytes(g->tok, id, &n);
    if (ty == LT_TOKEN_TYPE_CONTROL || ty == LT_TOKEN_TYPE_UNKNOWN ||
        ty == LT_TOKEN_TYPE_UNUSED || n == 0 || lt_grammar_matcher_accept(g->gm, b, n) != LT_OK)
        return lt_fail(LT_ERR_INVALID, "token %d does not fit the grammar here", id);
    return LT_OK;
}

lt_status lt_gen_seq_accept(struct lt_gen_seq *g, lt_token id)
{
    if (g->n_prompt == 0)
        return lt_fail(LT_ERR_INVALID, "no prompt has been set");
    if (g->finish != LT_GEN_RUNNING)
        return lt_fail(LT_ERR_INVALID, "the generation has finished (%s)",
                       lt_gen_finish_name(g->finish));
    size_t n_tok = lt_tokenizer_n_tokens(g->tok);
    if (id < 0 || (size_t)id >= n_tok)
        return lt_fail(LT_ERR_INVALID, "token %d is outside the vocabulary of %zu", id, n_tok);
    lt_status st = reserve_history(g, g->n_history + 1);
    if (st != LT_OK)
        return st;
    bool eog = !g->params.ignore_eog && lt_tokenizer_is_eog(g->tok, id);
    g->piece_begin = g->shown;
    g->last_text_start = g->text.len;
    if (g->gm) {
        double t0 = now_s();
        st = grammar_accept(g, id, eog);
        g->t_grammar_s += now_s() - t0;
        if (st != LT_OK)
            return st;
    }
    if (!eog) {
        if ((st = lt_decode_stream_push(&g->ds, id, &g->text)) != LT_OK)
            return st;
        scan_stops(g);
    }
    g->history[g->n_history++] = id;
    g->last = id;
    double t = now_s();
    if (g->n_history - g->n_prompt == 1)
        g->t_first = t;
    g->t_last = t;

    if (eog)
        st = finish_flush(g, LT_GEN_FINISH_EOG);
    else if (g->finish == LT_GEN_RUNNING && g->gm && lt_grammar_matcher_done(g->gm))
        st = finish_flush(g, LT_GEN_FINISH_GRAMMAR);
    else if (g->finish == LT_GEN_RUNNING && g->n_history - g->n_prompt >= g->limit)
        st = finish_flush(g, g->limit_is_context ? LT_GEN_FINISH_CONTEXT : LT_GEN_FINISH_LENGTH);
    g->pending = g->finish == LT_GEN_RUNNING ? id : LT_TOKEN_NONE;
    return st;
}

/* The sampled token does not fit the grammar: draw again from the tokens that do. Masking
 * only on a rejection keeps the cost off most steps (a model mostly wants what the grammar
 * allows), and draws from the same distribution as masking first would: a token t the
 * grammar allows comes out with p(t) + (1 - Z) p(t) / Z = p(t) / Z, Z the allowed mass
 * (with top-k/top-p, over the tokens those keep of the masked logits). */
static lt_status grammar_resample(struct lt_gen_seq *g, const float *logits, size_t n_vocab,
                                  lt_token *id)
{
    if (n_vocab > g->cap_masked) {
        float *m = realloc(g->masked, n_vocab * sizeof(*m));
        if (m)
            g->masked = m;
        bool *a = m ? realloc(g->allowed, n_vocab * sizeof(*a)) : NULL;
        if (!a)
            return lt_fail(LT_ERR_NOMEM, "out of memory for the grammar's mask");
        g->allowed = a;
        g->cap_masked = n_vocab;
    }
    g->n_masked++;
    size_t n_ok = lt_grammar_token_mask(g->gm, g->tok, n_vocab, g->allowed);
    for (size_t i = 0; g->params.ignore_eog && i < n_vocab; i++)
        if (g->allowed[i] && lt_tokenizer_is_eog(g->tok, (lt_token)i)) {
            g->allowed[i] = false;
            n_ok--;
        }
    if (n_ok == 0)
        return lt_fail(LT_ERR_INVALID, "the grammar allows no token of the vocabulary after "
                                       "%zu generated tokens",
                       g->n_history - g->n_prompt);
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < n_vocab; i++) {
        g->masked[i] = g->allowed[i] ? logits[i] : -INFINITY;
        if (g->allowed[i] && (best == SIZE_MAX || logits[i] > logits[best]))
            best = i;
    }
    lt_status st =
        lt_sampler_sample(&g->sampler, g->masked, n_vocab, g->history, g->n_history, id);
    /* a draw can land on a -inf token only by rounding at the top of the cumulative sum */
    if (st == LT_OK && !g->allowed[*id])
        *id = (lt_token)best;
    return st;
}

lt_status lt_gen_seq_sample(struct lt_gen_seq *g, const float *logits, size_t n_vocab,
                            lt_token *id)
{
    if (g->n_prompt == 0)
        return lt_fail(LT_ERR_INVALID, "no prompt has been set");
    if (g->finish != LT_GEN_RUNNING)
        return lt_fail(LT_ERR_INVALID, "the generation has finished (%s)",
                       lt_gen_finish_name(g->finish));
    /* a model's output may be padded past the vocabulary (Qwen): those ids are never drawn */
    size_t n_tok = lt_tokenizer_n_tokens(g->tok);
    if (n_vocab > n_tok)
        n_vocab = n_tok;
    lt_status st = lt_sampler_sample(&g->sampler, logits, n_vocab, g->history, g->n_history, id);
    if (st == LT_OK && g->gm) {
        double t0 = now_s();
        /* with ignore_eog an end-of-generation token would be text, which no grammar has */
        if (!lt_grammar_token_allowed(g->gm, g->tok, *id) ||
            (g->params.ignore_eog && lt_tokenizer_is_eog(g->tok, *id)))
            st = grammar_resample(g, logits, n_vocab, id);
        g->t_grammar_s += now_s() - t0;
    }
    if (st == LT_OK && g->params.logprobs)
        st = lt_gen_logprobs(logits, n_vocab, *id, g->params.top_logprobs, &g->lp);
    return st;
}

/* Two passes over the logits in double: the maximum, then the sum of exp(l - max), so
 * logprob(i) = l_i - max - log(sum) is exact to double rounding whatever the logits' scale.
 * The top k are kept by insertion into a sorted list of at most 20, which a logit below the
 * list's last rarely enters: about one comparison per token. */
lt_status lt_gen_logprobs(const float *logits, size_t n_vocab, lt_token chosen, int k,
                          struct lt_gen_logprob *out)
{
    if (chosen < 0 || (size_t)chosen >= n_vocab)
        return lt_fail(LT_ERR_INVALID, "token %d is outside the vocabulary of %zu", chosen,
                       n_vocab);
    if (k < 0 || k > LT_GEN_MAX_TOP_LOGPROBS)
        return lt_fail(LT_ERR_INVALID, "top logprobs %d; at most %d", k, LT_GEN_MAX_TOP_LOGPROBS);
    if ((size_t)k > n_vocab)
        k = (int)n_vocab;
    double max = -INFINITY;
    for (size_t i = 0; i < n_vocab; i++)
        if (logits[i] > max)
            max = logits[i];
    if (!isfinite(max))
        return lt_fail(LT_ERR_INVALID, "the logits' maximum is %g; no distribution", max);
    double sum = 0;
    for (size_t i = 0; i < n_vocab; i++)
        sum += exp((double)logits[i] - max);
    double lse = max + log(sum);
    out->id = chosen;
    out->logprob = (double)logits[chosen] - lse;
    int n = 0;
    for (size_t i = 0; i < n_vocab && k > 0; i++) {
        double l = logits[i];
        if (n == k && l <= out->top_logprob[n - 1]) /* ties: the lower id, already in, stays */
            continue;
        int at = n < k ? n++ : k - 1;
        while (at > 0 && out->top_logprob[at - 1] < l) {
            out->top_logprob[at] = out->top_logprob[at - 1];
            out->top_id[at] = out->top_id[at - 1];
            at--;
        }
        out->top_logprob[at] = l;
        out->top_id[at] = (lt_token)i;
    }
    for (int j = 0; j < n; j++)
        out->top_logprob[j] -= lse;
    out->n_top = n;
    return LT_OK;
}

bool lt_gen_seq_plain_greedy(const struct lt_gen_seq *g)
{
    const struct lt_sampler_params *p = &g->sampler.params;
    return g->n_prompt > 0 && g->finish == LT_GEN_RUNNING && p->temperature <= 0 &&
           p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
           p->frequency_penalty == 0.0f && !g->gm && !g->params.logprobs;
}

lt_status lt_gen_seq_accept_pick(struct lt_gen_seq *g, int32_t pick)
{
    return pick >= 0 ? lt_gen_seq_accept(g, pick)
                     : lt_fail(LT_ERR_INVALID, "sampler: a logit is NaN (the step's greedy pick)");
}

lt_status lt_gen_seq_step(struct lt_gen_seq *g, const float *logits, size_t n_vocab)
{
    lt_token id;
    lt_status st = lt_gen_seq_sample(g, logits, n_vocab, &id);
    return st != LT_OK ? st : lt_gen_seq_accept(g, id);
}

const char *lt_gen_seq_piece(const struct lt_gen_seq *g, size_t *len)
{
    *len = g->shown - g->piece_begin;
    return g->text.data ? g->text.data + g->piece_begin : "";
}

struct lt_gen_stats lt_gen_seq_stats(const struct lt_gen_seq *g)
{
    struct lt_gen_stats s = {.n_prompt = g->n_prompt, .n_generated = g->n_history - g->n_prompt};
    if (s.n_generated) {
        s.t_prompt_s = g->t_first - g->t_start;
        s.t_gen_s = g->t_last - g->t_first;
    }
    return s;
}
