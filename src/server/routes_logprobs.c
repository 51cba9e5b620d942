/* routes_logprobs.c: log-probabilities as the completion routes answer them (routes_complete.c,
 * routes_native.c): OpenAI chat's content entries, OpenAI legacy's token lists, llama.cpp's
 * completion_probabilities. The numbers are lt_gen_logprobs': the log-softmax of the
 * model's logits, before the sampler's transforms. */
#ifdef LATHE_HAVE_JANSSON
#include <math.h>
#include <stdlib.h>

#include "server/json_check.h"
#include "server/routes.h"

/* OpenAI's stand-in for a probability too small to write (a logit of -inf). */
static json_t *logprob_json(double lp)
{
    return json_real(isfinite(lp) ? lp : -9999.0);
}

/* A token's text (as a JSON string, invalid UTF-8 replaced) and its bytes. */
static void token_json(struct srv_app *app, lt_token id, json_t **text, json_t **bytes)
{
    struct lt_strbuf b = {0};
    if (app->engine->iface->detokenize(app->engine, &id, 1, 0, &b) != 200)
        b.len = 0;
    *text = srv_json_text(b.data, b.len);
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < b.len; i++)
            json_array_append_new(*bytes, json_integer((unsigned char)b.data[i]));
    }
    lt_strbuf_free(&b);
}

/* {token, logprob, bytes[, id]} */
static json_t *entry_json(struct srv_app *app, lt_token id, double lp, bool with_id)
{
    json_t *text, *bytes;
    token_json(app, id, &text, &bytes);
    json_t *e = json_pack("{s:o,s:o,s:o}", "token", text, "logprob", logprob_json(lp), "bytes",
                          bytes);
    if (e && with_id)
        json_object_set_new(e, "id", json_integer(id));
    return e;
}

/* OpenAI chat's [{token, logprob, bytes, top_logprobs: [...]}], or llama.cpp's n_probs
 * entries (with ids) when llama. */
json_t *srv_lp_content_json(struct srv_app *app, const struct srv_token_lp *r, size_t n,
                               int top, bool llama)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        const struct lt_gen_logprob *lp = &r[i].lp;
        json_t *e = entry_json(app, lp->id, lp->logprob, llama);
        json_t *tops = json_array();
        for (int k = 0; k < top && k < lp->n_top; k++)
            json_array_append_new(tops, entry_json(app, lp->top_id[k], lp->top_logprob[k], llama));
        json_object_set_new(e, "top_logprobs", tops);
        json_array_append_new(arr, e);
    }
    return arr;
}

/* OpenAI legacy's {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset};
 * the sampled token is always in its dict (up to top + 1 entries, as OpenAI's). */
json_t *srv_lp_legacy_json(struct srv_app *app, const struct srv_token_lp *r, size_t n,
                              int top, size_t offset0)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    for (size_t i = 0; i < n; i++) {
        const struct lt_gen_logprob *lp = &r[i].lp;
        json_t *text;
        token_json(app, lp->id, &text, NULL);
        json_t *d = json_object();
        for (int k = 0; k < top && k < lp->n_top; k++) {
            json_t *t;
            token_json(app, lp->top_id[k], &t, NULL);
            if (!json_object_get(d, json_string_value(t)))
                json_object_set_new(d, json_string_value(t), logprob_json(lp->top_logprob[k]));
            json_decref(t);
        }
        if (!json_object_get(d, json_string_value(text)))
            json_object_set_new(d, json_string_value(text), logprob_json(lp->logprob));
        json_array_append_new(tokens, text);
        json_array_append_new(lps, logprob_json(lp->logprob));
        json_array_append_new(tops, d);
        json_array_append_new(offs, json_integer((json_int_t)(offset0 + r[i].text_start)));
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

json_t *srv_completion_probabilities(struct srv_app *app, struct srv_gen *g, size_t visible,
                                     int n_probs, size_t *from)
{
    if (!g->p.logprobs)
        return NULL;
    struct srv_token_lp *r = NULL;
    size_t n = srv_gen_logprobs(g, *from, visible, &r);
    *from += n;
    json_t *j = srv_lp_content_json(app, r, n, n_probs, true);
    free(r);
    return j;
}

#endif
