/* routes_native.c: llama.cpp's own server routes, with the field names and shapes of its
 * server README: GET /props, GET /slots, POST /apply-template, POST /completion and
 * POST /infill (/tokenize and /detokenize are in routes.c).
 *
 * /completion is llama.cpp's native completion: its body is checked against llama.cpp's
 * fields, translated into the /v1/completions fields and read by the same code
 * (srv_completion_params), and decoded by the same engine; only the response differs:
 * {content, stop, tokens_predicted, tokens_evaluated, stop_type, stopped_eos, stopped_limit,
 * stopped_word, stopping_word, timings, ...}, streamed as server-sent events of
 * {content, stop:false, ...} and a last {stop:true, ...} (no "[DONE]", as llama.cpp).
 * `n_probs` adds llama.cpp's completion_probabilities (routes_complete.c computes them);
 * `grammar` (GBNF) and `json_schema` constrain the output (routes_grammar.c); a grammar's
 * end reports stop_type "eos", as llama.cpp, whose grammar then allows only end of text.
 *
 * /infill formats prefix, suffix and prompt with the vocabulary's fill-in-the-middle tokens
 * as llama.cpp does ([repo] [sep file]... [bos] PRE prefix prompt SUF suffix MID), and
 * answers 400 naming the missing tokens where the vocabulary has none (SmolLM2). */
#ifdef LATHE_HAVE_JANSSON
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/generate.h"
#include "server/json_check.h"
#include "server/routes.h"

static int no_engine_support(const char *what)
{
    return srv_fail(501, NULL, "unsupported", "this engine has no %s", what);
}

/* llama.cpp's "params" object for sampling parameters s. */
static json_t *params_json(const struct lt_sampler_params *s, int n_predict, int n_stops,
                           char *const *stops)
{
    json_t *st = json_array();
    for (int i = 0; stops && i < n_stops; i++)
        json_array_append_new(st, json_string(stops[i]));
    return json_pack("{s:i,s:I,s:f,s:f,s:f,s:i,s:f,s:f,s:f,s:i,s:f,s:f,s:f,s:i,s:o,s:b,s:i,"
                     "s:i,s:b}",
                     "n_predict", n_predict, "seed", (json_int_t)-1, "temperature",
                     (double)s->temperature, "dynatemp_range", 0.0, "dynatemp_exponent", 1.0,
                     "top_k", s->top_k, "top_p", (double)s->top_p, "min_p", (double)s->min_p,
                     "typical_p", 1.0, "repeat_last_n", s->repeat_last_n, "repeat_penalty",
                     (double)s->repeat_penalty, "presence_penalty", (double)s->presence_penalty,
                     "frequency_penalty", (double)s->frequency_penalty, "mirostat", 0, "stop", st,
                     "ignore_eos", 0, "n_keep", 0, "n_probs", 0, "stream", 0);
}

/* ---- GET /props ---- */

void srv_route_props(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    if (!srv_require_ready(app, rs))
        return;
    if (!app->engine->iface->props) {
        srv_respond_last_error(rs, no_engine_support("/props"));
        return;
    }
    struct srv_model_info mi;
    app->engine->iface->info(app->engine, &mi);
    struct srv_props p;
    int st = app->engine->iface->props(app->engine, &p);
    if (st != 200) {
        srv_respond_last_error(rs, st);
        return;
    }
    struct lt_sampler_params s = lt_sampler_default_params();
    json_t *dgs = json_pack("{s:i,s:i,s:i,s:b,s:b,s:o,s:s}", "id", 0, "id_task", -1, "n_ctx",
                            mi.n_ctx, "speculative", 0, "is_processing", 0, "params",
                            params_json(&s, -1, 0, NULL), "prompt", "");
    /* older clients read the sampling defaults at the top of default_generation_settings */
    json_t *flat = params_json(&s, -1, 0, NULL);
    json_object_update_missing(dgs, flat);
    json_decref(flat);
    bool fim =
        p.fim_pre != LT_TOKEN_NONE && p.fim_suf != LT_TOKEN_NONE && p.fim_mid != LT_TOKEN_NONE;
    json_t *out = json_pack(
        "{s:o,s:i,s:s,s:s,s:{s:b,s:b},s:o,s:s,s:s,s:s,s:b,s:{s:s,s:s,s:i,s:I,s:I,s:b,s:b}}",
        "default_generation_settings", dgs, "total_slots", mi.parallel, "model_alias", mi.id,
        "model_path", p.model_path, "modalities", "vision", 0, "audio", 0, "chat_template",
        p.chat_template ? json_string(p.chat_template) : json_string(""), "bos_token", p.bos_token,
        "eos_token", p.eos_token, "build_info", "lathe (" __DATE__ ")", "is_sleeping", 0, "lathe",
        "arch", mi.arch, "backend", mi.backend, "n_ctx", mi.n_ctx, "n_vocab",
        (json_int_t)mi.n_vocab, "n_ctx_train", (json_int_t)mi.n_ctx_train, "infill", fim,
        "chat_template_supported", mi.has_chat_template);
    free(p.chat_template);
    srv_respond_json(rs, 200, out);
}

/* ---- GET /slots ---- */

void srv_route_slots(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    if (!srv_require_ready(app, rs))
        return;
    if (!app->engine->iface->slots) {
        srv_respond_last_error(rs, no_engine_support("/slots"));
        return;
    }
    struct srv_slot_info *v = NULL;
    int n = 0;
    int st = app->engine->iface->slots(app->engine, &v, &n);
    if (st != 200) {
        srv_respond_last_error(rs, st);
        return;
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        const struct srv_slot_info *si = &v[i];
        int n_remain =
            si->is_processing && si->max_tokens > 0 ? si->max_tokens - si->n_decoded : -1;
        json_array_append_new(
            arr,
            json_pack("{s:i,s:i,s:i,s:b,s:b,s:o,s:s,s:{s:b,s:b,s:i,s:i,s:s},s:i,s:i}", "id", si->id,
                      "id_task", -1, "n_ctx", si->n_ctx, "speculative", 0, "is_processing",
                      si->is_processing, "params",
                      params_json(&si->sampling, si->max_tokens > 0 ? si->max_tokens : -1, 0, NULL),
                      "prompt", "", "next_token", "has_next_token", si->is_processing,
                      "has_new_line", 0, "n_remain", n_remain, "n_decoded", si->n_decoded,
                      "stopping_word", "", "n_prompt_tokens", si->n_prompt,
                      "n_prompt_tokens_processed", si->n_prefilled));
    }
    free(v);
    srv_respond_json(rs, 200, arr);
}

/* ---- POST /apply-template ---- */

void srv_route_apply_template(struct srv_app *app, const struct srv_request *rq,
                              struct srv_response *rs)
{
    static const struct srv_field fields[] = {
        {"messages", SRV_JT_ARRAY, 0, 0, true},
        {"chat_template_kwargs", SRV_JT_OBJECT, 0, 0, false},
        {"model", SRV_JT_STRING, 0, 0, false},
        {"tools", SRV_JT_ARRAY, 0, 0, false},
        {"tool_choice", SRV_JT_STRING | SRV_JT_OBJECT, 0, 0, false},
    };
    json_t *body = NULL;
    struct lt_tokens tk = {0};
    struct lt_strbuf text = {0};
    int st = srv_parse_body(rq, &body);
    if (st == 200)
        st = srv_check_object(body, "", fields, sizeof(fields) / sizeof(fields[0]));
    if (st != 200)
        goto out_error;
    if (!srv_require_ready(app, rs))
        goto out_free;
    /* the tokens /v1/chat/completions would decode, back to text */
    if ((st = srv_chat_prompt(app, body, &tk)) != 200)
        goto out_error;
    size_t skip = 0;
    if (app->engine->iface->props) {
        struct srv_props p;
        if (app->engine->iface->props(app->engine, &p) == 200) {
            free(p.chat_template);
            /* the bos the tokenizer puts first is no part of the template's text */
            if (p.add_bos && tk.n > 0 && tk.ids[0] == p.bos)
                skip = 1;
        }
    }
    st = app->engine->iface->detokenize(app->engine, tk.ids + skip, tk.n - skip,
                                        LT_DETOKENIZE_SPECIAL, &text);
    if (st != 200)
        goto out_error;
    srv_respond_json(rs, 200, json_pack("{s:o}", "prompt", srv_json_text(text.data, text.len)));
    goto out_free;

out_error:
    srv_respond_last_error(rs, st);
out_free:
    lt_strbuf_free(&text);
    lt_tokens_free(&tk);
    json_decref(body);
}

/* ---- POST /completion and /infill ---- */

static const struct srv_field native_fields[] = {
    {"prompt", SRV_JT_STRING | SRV_JT_ARRAY, 0, 0, false},
    {"n_predict", SRV_JT_INT, -1, 1 << 24, false},
    {"stream", SRV_JT_BOOL, 0, 0, false},
    {"temperature", SRV_JT_NUMBER, 0, 2, false},
    {"top_k", SRV_JT_INT, 0, 1 << 24, false},
    {"top_p", SRV_JT_NUMBER, 0, 1, false},
    {"min_p", SRV_JT_NUMBER, 0, 1, false},
    {"repeat_penalty", SRV_JT_NUMBER, 1e-3, 100, false},
    {"repeat_last_n", SRV_JT_INT, -1, 1 << 24, false},
    {"presence_penalty", SRV_JT_NUMBER, -2, 2, false},
    {"frequency_penalty", SRV_JT_NUMBER, -2, 2, false},
    {"seed", SRV_JT_INT, -1, 9.2e18, false},
    {"stop", SRV_JT_STRING | SRV_JT_ARRAY, 0, 0, false},
    {"ignore_eos", SRV_JT_BOOL, 0, 0, false},
    {"lora", SRV_JT_ARRAY | SRV_JT_STRING, 0, 0, false},
    {"model", SRV_JT_STRING, 0, 0, false},
    {"n_probs", SRV_JT_INT, 0, 20, false},
    {"grammar", SRV_JT_STRING, 0, 0, false},
    {"json_schema", SRV_JT_OBJECT | SRV_JT_ARRAY | SRV_JT_BOOL, 0, 0, false},
    {"cache_prompt", SRV_JT_BOOL, 0, 0, false},
    {"n_keep", SRV_JT_INT, -1, 1 << 24, false},
    {"id_slot", SRV_JT_INT, -1, -1, false},
    /* /infill */
    {"input_prefix", SRV_JT_STRING, 0, 0, false},
    {"input_suffix", SRV_JT_STRING, 0, 0, false},
    {"input_extra", SRV_JT_ARRAY, 0, 0, false},
};
#define N_NATIVE_FIELDS (sizeof(native_fields) / sizeof(native_fields[0]))
#define N_INFILL_FIELDS 3 /* the last ones */

/* The /v1/completions body that asks for what the llama.cpp body does; prompt given. */
static json_t *translate(const json_t *body, json_t *prompt)
{
    static const char *const same[] = {"temperature",
                                       "top_k",
                                       "top_p",
                                       "min_p",
                                       "repeat_penalty",
                                       "repeat_last_n",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "seed",
                                       "stop",
                                       "ignore_eos",
                                       "lora",
                                       "n_probs",
                                       "grammar",
                                       "json_schema"};
    json_t *t = json_object();
    if (!t)
        return NULL;
    json_object_set(t, "prompt", prompt);
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
        json_t *v = srv_json_get(body, same[i]);
        if (v)
            json_object_set(t, same[i], v);
    }
    long long n_predict = srv_json_int(body, "n_predict", -1);
    if (n_predict > 0)
        json_object_set_new(t, "max_tokens", json_integer(n_predict));
    return t;
}

struct native {
    struct srv_app *app;
    int n_probs;
    size_t lp_from; /* the next token record completion_probabilities reports */
    bool stream;
    char model[SRV_NAME_MAX];
    int n_prompt;
    struct srv_gen *g;
    size_t sent;
};

static json_t *timings_json(const struct native *c, const struct srv_gen_snap *s)
{
    double prompt_ms = (s->first_token_s - s->queue_s) * 1e3;
    double pred_ms = (s->total_s - s->first_token_s) * 1e3;
    if (prompt_ms < 0)
        prompt_ms = 0;
    if (pred_ms < 0)
        pred_ms = 0;
    int n_pred = s->n_completion > 1 ? s->n_completion - 1 : 0; /* after the first token */
    pthread_mutex_lock(&c->g->mu);
    int cached = (int)c->g->n_cached;
    pthread_mutex_unlock(&c->g->mu);
    int n = c->n_prompt - cached; /* prefilled; the rest came from the prompt cache */
    return json_pack("{s:i,s:i,s:f,s:f,s:f,s:i,s:f,s:f,s:f}", "cache_n", cached, "prompt_n", n,
                     "prompt_ms", prompt_ms, "prompt_per_token_ms", n ? prompt_ms / n : 0.0,
                     "prompt_per_second", prompt_ms > 0 ? n * 1e3 / prompt_ms : 0.0,
                     "predicted_n", s->n_completion, "predicted_ms", pred_ms,
                     "predicted_per_token_ms", n_pred ? pred_ms / n_pred : 0.0,
                     "predicted_per_second", pred_ms > 0 ? n_pred * 1e3 / pred_ms : 0.0);
}

/* The last object: content (the whole text, or "" at the end of a stream) and how it
 * stopped. */
static json_t *final_json(const struct native *c, json_t *content, const struct srv_gen_snap *s)
{
    struct srv_gen *g = c->g;
    pthread_mutex_lock(&g->mu);
    int gf = g->gen_finish, which = g->stop_which;
    pthread_mutex_unlock(&g->mu);
    bool eos = gf == LT_GEN_FINISH_EOG || gf == LT_GEN_FINISH_GRAMMAR, word = gf == LT_GEN_FINISH_STOP,
         limit = gf == LT_GEN_FINISH_LENGTH || gf == LT_GEN_FINISH_CONTEXT;
    if (!gf) { /* the engine did not say: the server's own reason */
        limit = s->finish == SRV_FINISH_LENGTH;
        eos = !limit;
    }
    const char *stopping = word && which >= 0 && (size_t)which < g->p.n_stops && g->p.stops[which]
                               ? g->p.stops[which]
                               : "";
    const char *has_nl = json_string_value(content);
    json_t *o = json_pack(
        "{s:i,s:o,s:[],s:i,s:b,s:s,s:i,s:i,s:o,s:b,s:b,s:s,s:b,s:b,s:b,s:s,s:i,s:o}", "index", 0,
        "content", content, "tokens", "id_slot", -1, "stop", 1, "model", c->model,
        "tokens_predicted", s->n_completion, "tokens_evaluated", c->n_prompt, "generation_settings",
        params_json(&g->p.sampling, g->p.max_tokens > 0 ? g->p.max_tokens : -1, (int)g->p.n_stops,
                    g->p.stops),
        "has_new_line", has_nl && strchr(has_nl, '\n') != NULL, "truncated", 0, "stop_type",
        eos     ? "eos"
        : word  ? "word"
        : limit ? "limit"
                : "none",
        "stopped_eos", eos, "stopped_limit", limit, "stopped_word", word, "stopping_word", stopping,
        "tokens_cached", c->n_prompt + s->n_completion, "timings", timings_json(c, s));
    return o;
}

/* completion_probabilities of the tokens whose text starts before `visible`, not yet sent. */
static void add_probs(struct native *c, json_t *o, size_t visible)
{
    if (c->n_probs <= 0 || !o)
        return;
    json_t *p = srv_completion_probabilities(c->app, c->g, visible, c->n_probs, &c->lp_from);
    json_object_set_new(o, "completion_probabilities", p ? p : json_array());
}

static void respond_whole(const struct srv_request *rq, struct srv_response *rs, struct native *c)
{
    size_t seen = 0;
    struct srv_gen_snap s;
    for (;;) {
        seen = srv_gen_wait(c->g, seen, 100);
        srv_gen_snapshot(c->g, 0, NULL, &s);
        if (s.done)
            break;
        if (!srv_conn_alive(rq->conn)) {
            srv_gen_cancel(c->g);
            srv_respond_error(rs, 499, NULL, "client_closed", "the client closed the connection");
            return;
        }
    }
    struct lt_strbuf text = {0};
    srv_gen_snapshot(c->g, 0, &text, &s);
    if (s.finish == SRV_FINISH_ERROR || s.finish == SRV_FINISH_CANCELLED) {
        srv_respond_error(rs, s.err_status ? s.err_status : 500, NULL, NULL, "%s",
                          s.err[0] ? s.err : "the generation was cancelled");
        lt_strbuf_free(&text);
        return;
    }
    json_t *content = srv_json_text(text.data, text.len);
    lt_strbuf_free(&text);
    json_t *out = final_json(c, content, &s);
    add_probs(c, out, s.visible);
    srv_respond_json(rs, 200, out);
}

static void sse_event(struct lt_strbuf *out, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s)
        return;
    lt_strbuf_append(out, "data: ", 6);
    lt_strbuf_append(out, s, strlen(s));
    lt_strbuf_append(out, "\n\n", 2);
    free(s);
}

static bool stream_fill(void *user, struct srv_conn *conn, struct lt_strbuf *out, bool *end)
{
    struct native *c = user;
    srv_gen_wait(c->g, c->sent, 100);
    struct lt_strbuf text = {0};
    struct srv_gen_snap s;
    srv_gen_snapshot(c->g, c->sent, &text, &s);
    bool got_text = text.len > 0;
    if (got_text) {
        json_t *chunk =
            json_pack("{s:i,s:o,s:[],s:b,s:i,s:i,s:i}", "index", 0, "content",
                      srv_json_text(text.data, text.len), "tokens", "stop", 0, "id_slot", -1,
                      "tokens_predicted", s.n_completion, "tokens_evaluated", c->n_prompt);
        add_probs(c, chunk, s.visible);
        sse_event(out, chunk);
        c->sent = s.visible;
    }
    lt_strbuf_free(&text);
    if (!s.done) {
        if (!got_text && !srv_conn_alive(conn)) {
            srv_gen_cancel(c->g);
            return false;
        }
        return true;
    }
    if (s.finish == SRV_FINISH_ERROR || s.finish == SRV_FINISH_CANCELLED) {
        int status = s.err_status ? s.err_status : 500;
        sse_event(out, srv_error_json(status, NULL, NULL, s.err[0] ? s.err : "cancelled"));
    } else {
        json_t *last = final_json(c, json_string(""), &s);
        add_probs(c, last, s.visible);
        sse_event(out, last);
    }
    *end = true;
    return true;
}

static void stream_free(void *user)
{
    struct native *c = user;
    srv_gen_cancel(c->g); /* no-op when it finished */
    srv_gen_unref(c->g);
    free(c);
}

/* Decodes `prompt` (a string or token ids) with body's llama.cpp settings; answers rs. */
static void run_native(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs,
                       const json_t *body, json_t *prompt)
{
    struct srv_gen_params p = {0};
    struct native *c = NULL;
    json_t *t = translate(body, prompt);
    int st = t ? 200 : srv_fail(503, NULL, NULL, "out of memory");
    if (st == 200)
        st = srv_completion_params(app, t, &p);
    json_decref(t);
    p.no_prompt_cache = !srv_json_bool(body, "cache_prompt", true);
    if (st != 200)
        goto out_error;
    struct srv_model_info mi;
    app->engine->iface->info(app->engine, &mi);
    if (p.n_prompt == 0) {
        st = srv_fail(400, "prompt", "invalid_value", "the prompt is empty");
        goto out_error;
    }
    if ((int64_t)p.n_prompt >= mi.n_ctx) {
        st = srv_fail(400, "prompt", "context_length_exceeded",
                      "the prompt has %zu tokens; a slot holds %d (prompt and completion)",
                      p.n_prompt, mi.n_ctx);
        goto out_error;
    }
    if (!(c = calloc(1, sizeof(*c)))) {
        st = srv_fail(503, NULL, NULL, "out of memory");
        goto out_error;
    }
    c->app = app;
    c->n_probs = (int)srv_json_int(body, "n_probs", 0);
    c->stream = srv_json_bool(body, "stream", false);
    snprintf(c->model, sizeof(c->model), "%s", srv_json_str(body, "model", mi.id));
    c->n_prompt = (int)p.n_prompt;
    if ((st = srv_gen_new(&p, &c->g)) != 200)
        goto out_error;
    if ((st = app->engine->iface->submit(app->engine, c->g)) != 200)
        goto out_error;
    if (!c->stream) {
        respond_whole(rq, rs, c);
        stream_free(c);
        return;
    }
    rs->status = 200;
    rs->content_type = "text/event-stream";
    rs->is_stream = true;
    rs->stream = (struct srv_stream){.fill = stream_fill, .free = stream_free, .user = c};
    return;

out_error:
    srv_respond_last_error(rs, st);
    if (c && c->g)
        srv_gen_unref(c->g);
    free(c);
    srv_gen_params_free(&p);
}

void srv_route_completion(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs)
{
    json_t *body = NULL;
    int st = srv_parse_body(rq, &body);
    if (st == 200)
        st = srv_check_object(body, "", native_fields, N_NATIVE_FIELDS - N_INFILL_FIELDS);
    if (st == 200 && !srv_json_get(body, "prompt"))
        st = srv_fail(400, "prompt", "missing_field", "'prompt' is required");
    if (st == 200 && srv_json_int(body, "n_predict", -1) == 0)
        st = srv_fail(400, "n_predict", "unsupported",
                      "n_predict 0 (evaluating the prompt only) is not supported; give -1 or "
                      "at least 1");
    if (st != 200) {
        srv_respond_last_error(rs, st);
        goto out_free;
    }
    if (!srv_require_ready(app, rs))
        goto out_free;
    run_native(app, rq, rs, body, json_object_get(body, "prompt"));
out_free:
    json_decref(body);
}

/* Appends the tokens of text (no bos, special tokens' text kept as text) to ids. */
static int append_text(struct srv_app *app, const char *text, json_t *ids)
{
    struct lt_tokens tk = {0};
    int st = app->engine->iface->tokenize(app->engine, text, strlen(text), 0, &tk);
    for (size_t i = 0; st == 200 && i < tk.n; i++)
        json_array_append_new(ids, json_integer(tk.ids[i]));
    lt_tokens_free(&tk);
    return st;
}

static void append_token(json_t *ids, lt_token id)
{
    json_array_append_new(ids, json_integer(id));
}

/* llama.cpp's format_infill into ids, prefix-suffix-middle order (the middle token is the
 * caller's), without its trimming to a batch (a prompt longer than the context is refused
 * instead). 200 or the answer's status. */
static int infill_prompt(struct srv_app *app, const json_t *body, const struct srv_props *p,
                         json_t *ids)
{
    const json_t *extra = srv_json_get(body, "input_extra");
    const json_t *prompt = srv_json_get(body, "prompt");
    int st = 200;
    if (p->fim_rep != LT_TOKEN_NONE) {
        append_token(ids, p->fim_rep);
        st = append_text(app, "myproject\n", ids);
    }
    for (size_t i = 0; st == 200 && i < json_array_size(extra); i++) {
        json_t *chunk = json_array_get(extra, i);
        if (p->fim_sep != LT_TOKEN_NONE) {
            append_token(ids, p->fim_sep);
            char fname[300];
            snprintf(fname, sizeof(fname), "%.250s\n", srv_json_str(chunk, "filename", "tmp"));
            st = append_text(app, fname, ids);
        } else {
            st = append_text(app, "\n\n--- snippet ---\n\n", ids);
        }
        if (st == 200)
            st = append_text(app, srv_json_str(chunk, "text", ""), ids);
    }
    if (st == 200 && p->fim_sep != LT_TOKEN_NONE) {
        append_token(ids, p->fim_sep);
        st = append_text(app, "filename\n", ids);
    }
    if (st == 200 && p->add_bos && p->bos != LT_TOKEN_NONE)
        append_token(ids, p->bos);
    if (st == 200) {
        append_token(ids, p->fim_pre);
        st = append_text(app, srv_json_str(body, "input_prefix", ""), ids);
    }
    if (st == 200 && prompt)
        st = append_text(app, json_string_value(prompt), ids);
    if (st == 200) {
        append_token(ids, p->fim_suf);
        st = append_text(app, srv_json_str(body, "input_suffix", ""), ids);
    }
    return st;
}

void srv_route_infill(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    json_t *body = NULL, *ids = NULL;
    struct srv_props p = {0};
    int st = srv_parse_body(rq, &body);
    if (st == 200)
        st = srv_check_object(body, "", native_fields, N_NATIVE_FIELDS);
    json_t *prompt = st == 200 ? srv_json_get(body, "prompt") : NULL;
    if (st == 200 && prompt && !json_is_string(prompt))
        st = srv_fail(400, "prompt", "invalid_type",
                      "'prompt' of /infill is a string (the start of the middle)");
    if (st == 200 && srv_json_int(body, "n_predict", -1) == 0)
        st = srv_fail(400, "n_predict", "unsupported",
                      "n_predict 0 (evaluating the prompt only) is not supported");
    json_t *extra = st == 200 ? srv_json_get(body, "input_extra") : NULL;
    char where[48];
    static const struct srv_field chunk_fields[] = {
        {"filename", SRV_JT_STRING, 0, 0, false},
        {"text", SRV_JT_STRING, 0, 0, true},
    };
    for (size_t i = 0; st == 200 && i < json_array_size(extra); i++) {
        snprintf(where, sizeof(where), "input_extra[%zu]", i);
        st = srv_check_object(json_array_get(extra, i), where, chunk_fields, 2);
    }
    if (st != 200)
        goto out_error;
    if (!srv_require_ready(app, rs))
        goto out_free;
    if (!app->engine->iface->props) {
        st = no_engine_support("/infill");
        goto out_error;
    }
    if ((st = app->engine->iface->props(app->engine, &p)) != 200)
        goto out_error;
    if (p.fim_pre == LT_TOKEN_NONE || p.fim_suf == LT_TOKEN_NONE || p.fim_mid == LT_TOKEN_NONE) {
        st = srv_fail(400, NULL, "no_fim_tokens",
                      "this model's vocabulary has no fill-in-the-middle tokens (%s%s%s"
                      "missing), so /infill cannot format its prompt; use /completion",
                      p.fim_pre == LT_TOKEN_NONE ? "prefix " : "",
                      p.fim_suf == LT_TOKEN_NONE ? "suffix " : "",
                      p.fim_mid == LT_TOKEN_NONE ? "middle " : "");
        goto out_error;
    }
    ids = json_array();
    st = ids ? infill_prompt(app, body, &p, ids) : srv_fail(503, NULL, NULL, "out of memory");
    if (st != 200)
        goto out_error;
    append_token(ids, p.fim_mid);
    run_native(app, rq, rs, body, ids);
    goto out_free;

out_error:
    srv_respond_last_error(rs, st);
out_free:
    free(p.chat_template);
    json_decref(ids);
    json_decref(body);
}

#endif
