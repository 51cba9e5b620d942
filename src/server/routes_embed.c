/* routes_embed.c: POST /v1/embeddings (and /embeddings), OpenAI's shape.
 *
 * "input" is a string, a list of strings, a list of token ids or a list of token-id lists;
 * each string is tokenized as llama.cpp's server does (a BOS only where the GGUF asks for
 * one, special tokens parsed). Each input's embedding is the model's final hidden state
 * after the output norm (what the head reads), pooled over the input's tokens by the
 * server's --pooling (mean, the default, or last: llama.cpp's flag and pooling) and
 * L2-normalised; the engine computes it (srv_engine_iface.embed), inputs one after another.
 * "encoding_format" is "float" (the default) or "base64": the little-endian float32 bytes
 * in base64, as OpenAI sends them. "model" is resolved as for completions (routes.c): the
 * base model's id answers, an unknown id gets 404, and an adapter's or fine-tuned model's id
 * gets 400 (embeddings read the base model only). "dimensions" may only be n_embd.
 *
 * {object: "list", data: [{object: "embedding", index, embedding}], model,
 *  usage: {prompt_tokens, total_tokens}}. */
#ifdef LATHE_HAVE_JANSSON
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_check.h"
#include "server/routes.h"

#define EMBED_MAX_INPUTS 2048

/* out[4 * ceil(n / 3) + 1]: standard base64 with padding. */
static void base64(const unsigned char *in, size_t n, char *out)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n)
            v |= in[i + 2];
        out[o++] = tab[(v >> 18) & 63];
        out[o++] = tab[(v >> 12) & 63];
        out[o++] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    out[o] = 0;
}

/* The embedding as a JSON value: an array of numbers, or a base64 string of float32 LE. */
static json_t *embedding_json(const float *v, int64_t D, bool b64)
{
    if (!b64) {
        json_t *arr = json_array();
        for (int64_t d = 0; arr && d < D; d++)
            json_array_append_new(arr, json_real(v[d]));
        return arr;
    }
    size_t nb = (size_t)D * 4;
    unsigned char *bytes = malloc(nb ? nb : 1);
    char *text = malloc((nb + 2) / 3 * 4 + 1);
    json_t *s = NULL;
    if (bytes && text) {
        for (int64_t d = 0; d < D; d++) {
            uint32_t u;
            memcpy(&u, &v[d], 4);
            for (int k = 0; k < 4; k++)
                bytes[d * 4 + k] = (unsigned char)(u >> (8 * k));
        }
        base64(bytes, nb, text);
        s = json_string(text);
    }
    free(bytes);
    free(text);
    return s;
}

/* The tokens of input i: a string tokenized, or a token-id list checked. */
static int input_tokens(struct srv_app *app, const json_t *v, const char *name,
                        struct lt_tokens *out)
{
    if (json_is_string(v)) {
        return app->engine->iface->tokenize(app->engine, json_string_value(v),
                                            json_string_length(v),
                                            LT_TOKENIZE_ADD_BOS | LT_TOKENIZE_PARSE_SPECIAL, out);
    }
    lt_token *ids = NULL;
    size_t n = 0;
    int st = srv_token_array(app, v, name, &ids, &n);
    if (st != 200)
        return st;
    out->ids = ids;
    out->n = out->cap = n;
    return 200;
}

/* The request's options: no adapter (embeddings are the base model's), encoding_format
 * float or base64 (*b64). 200 or the answer's status. */
static int embed_options(const json_t *body, bool *b64)
{
    if (json_object_get(body, "lora"))
        return srv_fail(400, "model", "model_not_supported",
                        "embeddings are computed by the base model; '%s' names an adapter",
                        json_string_value(json_object_get(body, "model")));
    const json_t *fmt = json_object_get(body, "encoding_format");
    *b64 = false;
    if (fmt && !json_is_null(fmt)) {
        const char *f = json_string_value(fmt);
        *b64 = !strcmp(f, "base64");
        if (!*b64 && strcmp(f, "float") != 0)
            return srv_fail(400, "encoding_format", "invalid_value",
                            "encoding_format must be \"float\" or \"base64\", not \"%s\"", f);
    }
    return 200;
}

/* input: one string or token list (*n_in 1), or a list of them (*list). 200 or the
 * answer's status. */
static int embed_inputs(const json_t *input, size_t *n_in, bool *list)
{
    *n_in = 1;
    *list = false;
    if (json_is_array(input)) {
        size_t n = json_array_size(input);
        if (n == 0)
            return srv_fail(400, "input", "invalid_value", "input is an empty list");
        const json_t *first = json_array_get(input, 0);
        *list = json_is_string(first) || json_is_array(first);
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(input, i);
            if (!(*list ? json_is_string(x) || json_is_array(x) : json_is_integer(x)))
                return srv_fail(400, "input", "invalid_type",
                                "input[%zu]: input must be a string, a list of strings, a list "
                                "of token ids or a list of token-id lists",
                                i);
        }
        *n_in = *list ? n : 1;
    }
    if (*n_in > EMBED_MAX_INPUTS)
        return srv_fail(400, "input", "invalid_value",
                        "input has %zu items; at most %d are embedded in one request", *n_in,
                        EMBED_MAX_INPUTS);
    return 200;
}

/* Embeds the n_in inputs into data (one object each), adding their tokens to *n_tokens.
 * 200 or the answer's status. */
static int embed_all(struct srv_app *app, const json_t *input, size_t n_in, bool list,
                     int64_t n_embd, bool b64, json_t *data, json_int_t *n_tokens)
{
    float *vec = malloc(sizeof(float) * (size_t)(n_embd > 0 ? n_embd : 1));
    int st = vec ? 200 : srv_fail(503, NULL, NULL, "out of memory");
    for (size_t i = 0; st == 200 && i < n_in; i++) {
        const json_t *x = list ? json_array_get(input, i) : input;
        char name[64];
        if (list)
            snprintf(name, sizeof(name), "input[%zu]", i);
        else
            snprintf(name, sizeof(name), "input");
        struct lt_tokens tk = {0};
        st = input_tokens(app, x, name, &tk);
        if (st == 200 && tk.n == 0)
            st = srv_fail(400, "input", "invalid_value", "%s is empty", name);
        if (st == 200)
            st = app->engine->iface->embed(app->engine, tk.ids, tk.n, vec);
        *n_tokens += (json_int_t)tk.n;
        lt_tokens_free(&tk);
        json_t *emb = st == 200 ? embedding_json(vec, n_embd, b64) : NULL;
        if (st == 200 && !emb)
            st = srv_fail(503, NULL, NULL, "out of memory");
        if (st == 200)
            json_array_append_new(data, json_pack("{s:s,s:I,s:o}", "object", "embedding",
                                                  "index", (json_int_t)i, "embedding", emb));
    }
    free(vec);
    return st;
}

void srv_route_embeddings(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs)
{
    static const struct srv_field fields[] = {
        {"input", SRV_JT_STRING | SRV_JT_ARRAY, 0, 0, true},
        {"model", SRV_JT_STRING, 0, 0, false},
        {"encoding_format", SRV_JT_STRING, 0, 0, false},
        {"dimensions", SRV_JT_INT, 1, 1 << 30, false},
        {"user", SRV_JT_STRING, 0, 0, false},
        {"lora", SRV_JT_ARRAY, 0, 0, false}, /* set by srv_model_resolve for an adapter */
    };
    json_t *body = NULL, *data = NULL;
    struct srv_model_info mi;
    bool b64, list;
    size_t n_in;
    json_int_t n_tokens = 0;
    int st = srv_parse_body(rq, &body);
    if (st == 200)
        st = srv_check_object(body, "", fields, sizeof(fields) / sizeof(fields[0]));
    if (st == 200)
        st = embed_options(body, &b64);
    if (st == 200 && !srv_require_ready(app, rs))
        goto out;
    if (st == 200 && !app->engine->iface->embed)
        st = srv_fail(501, NULL, "unsupported", "this engine has no embeddings");
    app->engine->iface->info(app->engine, &mi);
    const json_t *dims = st == 200 ? json_object_get(body, "dimensions") : NULL;
    if (dims && !json_is_null(dims) && (int64_t)srv_json_value_num(dims) != mi.n_embd)
        st = srv_fail(400, "dimensions", "invalid_value",
                      "dimensions must be the model's %lld (no other size is supported)",
                      (long long)mi.n_embd);
    const json_t *input = st == 200 ? json_object_get(body, "input") : NULL;
    if (st == 200)
        st = embed_inputs(input, &n_in, &list);
    if (st == 200 && !(data = json_array()))
        st = srv_fail(503, NULL, NULL, "out of memory");
    if (st == 200)
        st = embed_all(app, input, n_in, list, mi.n_embd, b64, data, &n_tokens);
    if (st != 200) {
        srv_respond_last_error(rs, st);
        goto out;
    }
    const char *model = json_string_value(json_object_get(body, "model"));
    srv_respond_json(rs, 200,
                     json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data,
                               "model", model ? model : mi.id, "usage", "prompt_tokens",
                               n_tokens, "total_tokens", n_tokens));
    data = NULL;
out:
    json_decref(data);
    json_decref(body);
}

#endif
