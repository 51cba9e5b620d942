/* generator.c: prompts to tokens, and lt_gen_seqs driven over an inference session
 * (include/lathe/generate.h): chunked prefill, one batched decode step for several
 * sequences, and the run-to-completion loop.
 *
 * Context accounting: a sequence's prompt of n tokens and its first n_gen - 1 generated
 * tokens occupy the session (the last token sampled is never decoded), so a prompt fits
 * when n <= n_ctx and then leaves room for n_ctx - n + 1 generated tokens. */
#include <stdlib.h>
#include <string.h>

#include "lathe/generate.h"

/* Tokenizes into an empty list, bos first when the vocabulary asks for it; a bos the text
 * itself starts with (a template that writes it) is not doubled. */
static lt_status tokenize_prompt(const struct lt_tokenizer *t, const char *text, size_t len,
                                 unsigned flags, struct lt_tokens *out)
{
    if (out->n)
        return lt_fail(LT_ERR_INVALID, "prompt tokens go into an empty list");
    lt_token bos = lt_tokenizer_bos(t);
    if (lt_tokenizer_add_bos(t) && bos != LT_TOKEN_NONE)
        flags |= LT_TOKENIZE_ADD_BOS;
    lt_status st = lt_tokenize(t, text, len, flags, out);
    if (st == LT_OK && (flags & LT_TOKENIZE_ADD_BOS) && out->n >= 2 && out->ids[1] == bos) {
        memmove(out->ids, out->ids + 1, (out->n - 1) * sizeof(*out->ids));
        if (out->want_offsets)
            memmove(out->offs, out->offs + 1, (out->n - 1) * sizeof(*out->offs));
        out->n--;
    }
    return st;
}

lt_status lt_gen_prompt_text(const struct lt_tokenizer *t, const char *text, bool parse_special,
                             struct lt_tokens *out)
{
    size_t len = text ? strlen(text) : 0;
    if (len == 0)
        return lt_fail(LT_ERR_INVALID, "the prompt is empty");
    return tokenize_prompt(t, text, len, parse_special ? LT_TOKENIZE_PARSE_SPECIAL : 0, out);
}

lt_status lt_gen_prompt_chat(const struct lt_tokenizer *t, const struct lt_chat_template *ct,
                             const struct lt_chat_message *msgs, size_t n, bool enable_thinking,
                             struct lt_tokens *out)
{
    struct lt_chat_options opts = {.enable_thinking = enable_thinking};
    return lt_gen_prompt_chat_with(t, ct, msgs, n, &opts, out);
}

lt_status lt_gen_prompt_chat_with(const struct lt_tokenizer *t, const struct lt_chat_template *ct,
                                  const struct lt_chat_message *msgs, size_t n,
                                  const struct lt_chat_options *opts, struct lt_tokens *out)
{
    struct lt_chat_options o = *opts;
    o.add_generation_prompt = true;
    struct lt_chat_render r = {0};
    lt_status st = lt_chat_render(ct, msgs, n, &o, &r);
    if (st != LT_OK)
        goto out_free_render;
    st = tokenize_prompt(t, r.text.data, r.text.len, LT_TOKENIZE_PARSE_SPECIAL, out);
out_free_render:
    lt_chat_render_free(&r);
    return st;
}

lt_status lt_generator_init(struct lt_generator *gen, const struct lt_model *m,
                            struct lt_session *s, int n_ctx, int n_seq_max, int n_batch)
{
    memset(gen, 0, sizeof(*gen));
    if (n_ctx < 1 || n_seq_max < 1)
        return lt_fail(LT_ERR_INVALID, "a generator needs n_ctx >= 1 and n_seq_max >= 1 (got %d, %d)",
                       n_ctx, n_seq_max);
    gen->model = m;
    gen->session = s;
    gen->n_vocab = lt_model_hparams(m)->n_vocab;
    gen->n_ctx = n_ctx;
    gen->n_seq_max = n_seq_max;
    gen->n_batch = n_batch > 0 ? n_batch : 512;
    gen->logits = malloc(sizeof(float) * (size_t)gen->n_vocab * (size_t)n_seq_max);
    gen->ids = malloc(sizeof(int32_t) * (size_t)n_seq_max);
    gen->want = malloc(sizeof(bool) * (size_t)n_seq_max);
    gen->picks = malloc(sizeof(int32_t) * (size_t)n_seq_max);
    if (!gen->logits || !gen->ids || !gen->want || !gen->picks) {
        lt_generator_free(gen);
        return lt_fail(LT_ERR_NOMEM, "out of memory for %d rows of logits", n_seq_max);
    }
    return LT_OK;
}

void lt_generator_free(struct lt_generator *gen)
{
    if (!gen)
        return;
    free(gen->logits);
    free(gen->ids);
    free(gen->want);
    free(gen->picks);
    memset(gen, 0, sizeof(*gen));
}

lt_status lt_generator_prefill(struct lt_generator *gen, int seq, struct lt_gen_seq *g,
                               const lt_token *prompt, size_t n)
{
    if (n == 0)
        return lt_fail(LT_ERR_INVALID, "the prompt is empty");
    if (n > (size_t)gen->n_ctx)
        return lt_fail(LT_ERR_INVALID, "the prompt is %zu tokens, longer than the context of %d",
                       n, gen->n_ctx);
    lt_status st = lt_session_seq_clear(gen->session, seq);
    if (st == LT_OK)
        st = lt_gen_seq_set_prompt(g, prompt, n, (size_t)gen->n_ctx - n + 1);
    for (size_t off = 0; st == LT_OK && off < n; off += (size_t)gen->n_batch) {
        size_t len = n - off < (size_t)gen->n_batch ? n - off : (size_t)gen->n_batch;
        bool last = off + len == n;
        st = lt_session_prefill(gen->session, seq, prompt + off, (int)len, false,
                                last ? gen->logits : NULL);
    }
    if (st == LT_OK)
        st = lt_gen_seq_step(g, gen->logits, (size_t)gen->n_vocab);
    return st;
}

lt_status lt_generator_decode(struct lt_generator *gen, int n, const int *seqs,
                              struct lt_gen_seq *const *gs)
{
    if (n < 1 || n > gen->n_seq_max)
        return lt_fail(LT_ERR_INVALID, "decode of %d sequences; the generator holds %d", n,
                       gen->n_seq_max);
    for (int i = 0; i < n; i++) {
        if (gs[i]->pending == LT_TOKEN_NONE)
            return lt_fail(LT_ERR_INVALID, "sequence %d has nothing to decode (%s)", seqs[i],
                           lt_gen_finish_name(gs[i]->finish));
        gen->ids[i] = gs[i]->pending;
    }
    /* in a session that picks, a plain greedy sequence takes the step's own pick; the
     * others' rows come out packed (every row, in a session that does not) */
    const bool pick = lt_session_pick_vocab(gen->session) > 0;
    for (int i = 0; i < n; i++)
        gen->want[i] = !pick || !lt_gen_seq_plain_greedy(gs[i]);
    lt_status st = pick ? lt_session_decode_pick(gen->session, n, seqs, gen->ids, gen->want,
                                                 gen->logits, gen->picks)
                        : lt_session_decode(gen->session, n, seqs, gen->ids, gen->logits);
    for (int i = 0, j = 0; st == LT_OK && i < n; i++)
        st = gen->want[i] ? lt_gen_seq_step(gs[i], gen->logits + (size_t)j++ * (size_t)gen->n_vocab,
                                            (size_t)gen->n_vocab)
                          : lt_gen_seq_accept_pick(gs[i], gen->picks[i]);
    return st;
}

static lt_status emit(const struct lt_gen_seq *g, lt_gen_piece_fn on_piece, void *user)
{
    size_t len;
    const char *piece = lt_gen_seq_piece(g, &len);
    if (len && on_piece && !on_piece(user, piece, len))
        return lt_fail(LT_ERR_CANCELLED, "the generation was cancelled");
    return LT_OK;
}

lt_status lt_generator_run(struct lt_generator *gen, int seq, struct lt_gen_seq *g,
                           const lt_token *prompt, size_t n, lt_gen_piece_fn on_piece,
                           void *user)
{
    lt_status st = lt_generator_prefill(gen, seq, g, prompt, n);
    if (st == LT_OK)
        st = emit(g, on_piece, user);
    while (st == LT_OK && !lt_gen_seq_done(g)) {
        st = lt_generator_decode(gen, 1, &seq, &g);
        if (st == LT_OK)
            st = emit(g, on_piece, user);
    }
    return st;
}
