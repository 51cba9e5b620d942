/* routes.c: the route table and the small routes (/health, /v1/models, /metrics, /tokenize,
 * /detokenize). Completions are in routes_complete.c, llama.cpp's own routes (/props,
 * /slots, /apply-template, /completion, /infill) in routes_native.c, training in
 * routes_train.c, uploaded training files (/v1/files) in routes_files.c, adapters and model
 * ids in routes_lora.c, the web page (GET /) in routes_page.c. A completion's "model" is resolved here, before its route: the base model,
 * an adapter by name or a fine-tuned model (srv_model_resolve), else 404.
 *
 * /health reads only the engine's state, which never waits on a lock held while decoding or
 * training, so it answers at once whatever the server is doing. A known path asked with
 * the wrong method gets 405 with Allow; an unknown path 404; both in OpenAI's error shape.
 * Before any of this, srv_route_admit puts every request past the guard (guard.c) as soon
 * as its headers are in, so a refused one is answered without its body being kept. */
#ifdef LATHE_HAVE_JANSSON
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_check.h"
#include "server/routes.h"

/* ---- small routes ---- */

static void route_health(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs)
{
    char why[512] = "";
    enum srv_state st = app->engine->iface->state(app->engine, why, sizeof(why));
    if (st == SRV_STATE_READY)
        srv_respond_json(rs, 200, json_pack("{s:s}", "status", "ok"));
    else if (st == SRV_STATE_LOADING)
        srv_respond_json(rs, 503, json_pack("{s:s}", "status", "loading"));
    else
        srv_respond_json(rs, 503, json_pack("{s:s,s:s}", "status", "error", "error", why));
}

static void route_models(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs)
{
    struct srv_model_info mi;
    app->engine->iface->info(app->engine, &mi);
    json_t *m = json_pack(
        "{s:s,s:s,s:I,s:s,s:{s:s,s:s,s:i,s:i,s:I,s:I,s:I}}", "id", mi.id, "object", "model",
        "created", (json_int_t)srv_now_unix(), "owned_by", "lathe", "meta", "arch", mi.arch,
        "backend", mi.backend, "n_ctx", mi.n_ctx, "parallel", mi.parallel, "n_vocab",
        (json_int_t)mi.n_vocab, "n_ctx_train", (json_int_t)mi.n_ctx_train, "n_layer",
        (json_int_t)mi.n_layer);
    json_t *data = json_pack("[o]", m);
    srv_models_adapters(app, data); /* adapters by name, fine-tuned models */
    srv_respond_json(rs, 200, json_pack("{s:s,s:o}", "object", "list", "data", data));
}

static void route_metrics(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs)
{
    rs->status = 200;
    rs->content_type = "text/plain; version=0.0.4; charset=utf-8";
    static const char *const cls[] = {"other", "1xx", "2xx", "3xx", "4xx", "5xx"};
    srv_strbuf_appendf(&rs->body, "# HELP lathe_http_requests_total HTTP requests answered, by "
                                  "status class.\n# TYPE lathe_http_requests_total counter\n");
    pthread_mutex_lock(&app->stats_mu);
    uint64_t counts[6];
    memcpy(counts, app->http_requests, sizeof(counts));
    uint64_t timeouts = app->header_timeouts;
    int uploads = app->uploads_receiving;
    pthread_mutex_unlock(&app->stats_mu);
    for (int i = 0; i < 6; i++)
        srv_strbuf_appendf(&rs->body, "lathe_http_requests_total{class=\"%s\"} %llu\n", cls[i],
                           (unsigned long long)counts[i]);
    srv_strbuf_appendf(&rs->body,
                       "# HELP lathe_http_header_timeouts_total Connections closed because "
                       "their request headers (or the next piece of a body) did not arrive in "
                       "time.\n"
                       "# TYPE lathe_http_header_timeouts_total counter\n"
                       "lathe_http_header_timeouts_total %llu\n",
                       (unsigned long long)timeouts);
    srv_strbuf_appendf(&rs->body,
                       "# HELP lathe_http_uploads_receiving Uploads (POST /v1/files) being "
                       "received now.\n# TYPE lathe_http_uploads_receiving gauge\n"
                       "lathe_http_uploads_receiving %d\n",
                       uploads);
    char why[64];
    enum srv_state st = app->engine->iface->state(app->engine, why, sizeof(why));
    srv_strbuf_appendf(&rs->body,
                       "# HELP lathe_ready 1 when the model is loaded and serving.\n"
                       "# TYPE lathe_ready gauge\nlathe_ready %d\n",
                       st == SRV_STATE_READY);
    app->engine->iface->metrics(app->engine, &rs->body);
}

/* The engine must be ready for these; false after answering 503. */
bool srv_require_ready(struct srv_app *app, struct srv_response *rs)
{
    char why[512] = "";
    enum srv_state st = app->engine->iface->state(app->engine, why, sizeof(why));
    if (st == SRV_STATE_READY)
        return true;
    if (st == SRV_STATE_LOADING)
        srv_respond_error(rs, 503, NULL, "loading", "the model is still loading; try again soon");
    else
        srv_respond_error(rs, 503, NULL, "model_failed", "the model failed to load: %s", why);
    return false;
}

static void route_tokenize(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs)
{
    static const struct srv_field fields[] = {
        {"content", SRV_JT_STRING, 0, 0, true},
        {"add_special", SRV_JT_BOOL, 0, 0, false},
        {"parse_special", SRV_JT_BOOL, 0, 0, false},
        {"with_pieces", SRV_JT_BOOL, 0, 0, false},
    };
    json_t *body = NULL;
    int st = srv_parse_body(rq, &body);
    if (st == 200)
        st = srv_check_object(body, "", fields, sizeof(fields) / sizeof(fields[0]));
    if (st != 200) {
        srv_respond_last_error(rs, st);
        goto out_free_body;
    }
    if (!srv_require_ready(app, rs))
        goto out_free_body;
    json_t *content = json_object_get(body, "content");
    unsigned flags = (srv_json_bool(body, "add_special", false) ? LT_TOKENIZE_ADD_BOS : 0) |
                     (srv_json_bool(body, "parse_special", true) ? LT_TOKENIZE_PARSE_SPECIAL : 0);
    struct lt_tokens tk = {0};
    st = app->engine->iface->tokenize(app->engine, json_string_value(content),
                                      json_string_length(content), flags, &tk);
    if (st != 200) {
        srv_respond_last_error(rs, st);
        goto out_free_body;
    }
    bool pieces = srv_json_bool(body, "with_pieces", false);
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < tk.n; i++) {
        if (!pieces) {
            json_array_append_new(arr, json_integer(tk.ids[i]));
            continue;
        }
        struct lt_strbuf piece = {0};
        app->engine->iface->detokenize(app->engine, &tk.ids[i], 1, LT_DETOKENIZE_SPECIAL, &piece);
        json_array_append_new(arr, json_pack("{s:i,s:o}", "id", tk.ids[i], "piece",
                                             srv_json_text(piece.data, piece.len)));
        lt_strbuf_free(&piece);
    }
    lt_tokens_free(&tk);
    srv_respond_json(rs, 200, json_pack("{s:o}", "tokens", arr));
out_free_body:
    json_decref(body);
}

static void route_detokenize(struct srv_app *app, const struct srv_request *rq,
                             struct srv_response *rs)
{
    static const struct srv_field fields[] = {
        {"tokens", SRV_JT_ARRAY, 0, 0, true},
        {"special", SRV_JT_BOOL, 0, 0, false},
    };
    json_t *body = NULL;
    lt_token *ids = NULL;
    int st = srv_parse_body(rq, &body);
    if (st == 200)
        st = srv_check_object(body, "", fields, sizeof(fields) / sizeof(fields[0]));
    if (st != 200) {
        srv_respond_last_error(rs, st);
        goto out_free_body;
    }
    if (!srv_require_ready(app, rs))
        goto out_free_body;
    size_t n;
    st = srv_token_array(app, json_object_get(body, "tokens"), "tokens", &ids, &n);
    if (st != 200) {
        srv_respond_last_error(rs, st);
        goto out_free_body;
    }
    struct lt_strbuf text = {0};
    unsigned flags = srv_json_bool(body, "special", false) ? LT_DETOKENIZE_SPECIAL : 0;
    st = app->engine->iface->detokenize(app->engine, ids, n, flags, &text);
    if (st != 200)
        srv_respond_last_error(rs, st);
    else
        srv_respond_json(rs, 200, json_pack("{s:o}", "content", srv_json_text(text.data, text.len)));
    lt_strbuf_free(&text);
out_free_body:
    free(ids);
    json_decref(body);
}

/* ---- shared helpers ---- */

int srv_token_array(struct srv_app *app, const json_t *arr, const char *name, lt_token **out,
                    size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    struct srv_model_info mi;
    app->engine->iface->info(app->engine, &mi);
    size_t n = json_array_size(arr);
    lt_token *ids = malloc((n ? n : 1) * sizeof(*ids));
    if (!ids)
        return srv_fail(503, name, NULL, "out of memory for %zu tokens", n);
    char fname[64];
    for (size_t i = 0; i < n; i++) {
        snprintf(fname, sizeof(fname), "%s[%zu]", name, i);
        int st = srv_check_value(json_array_get(arr, i), fname, SRV_JT_INT, 0,
                                 (double)mi.n_vocab - 1);
        if (st != 200) {
            free(ids);
            return st;
        }
        ids[i] = (lt_token)srv_json_value_num(json_array_get(arr, i));
    }
    *out = ids;
    *n_out = n;
    return 200;
}

/* ---- the table ---- */

struct route {
    const char *method;
    const char *path; /* a trailing '*' matches one path segment: the id */
    srv_route_fn fn;
};

static const struct route routes[] = {
    {"GET", "/", srv_route_page},
    {"GET", "/health", route_health},
    {"GET", "/v1/health", route_health},
    {"GET", "/v1/models", route_models},
    {"GET", "/models", route_models},
    {"GET", "/metrics", route_metrics},
    {"POST", "/tokenize", route_tokenize},
    {"POST", "/detokenize", route_detokenize},
    {"POST", "/v1/chat/completions", srv_route_chat},
    {"POST", "/chat/completions", srv_route_chat},
    {"POST", "/v1/completions", srv_route_completions},
    {"POST", "/completions", srv_route_completions},
    {"POST", "/v1/embeddings", srv_route_embeddings},
    {"POST", "/embeddings", srv_route_embeddings},
    {"GET", "/props", srv_route_props},
    {"GET", "/slots", srv_route_slots},
    {"POST", "/apply-template", srv_route_apply_template},
    {"POST", "/completion", srv_route_completion},
    {"POST", "/infill", srv_route_infill},
    {"GET", "/train", srv_route_train_get},
    {"POST", "/train", srv_route_train_post},
    {"POST", "/train/cancel", srv_route_train_cancel},
    {"POST", "/train/pause", srv_route_train_pause},
    {"POST", "/train/resume", srv_route_train_resume},
    {"GET", "/v1/fine_tuning/jobs", srv_route_ft_list},
    {"POST", "/v1/fine_tuning/jobs", srv_route_ft_create},
    {"GET", "/v1/fine_tuning/jobs/*", srv_route_ft_get},
    {"GET", "/v1/fine_tuning/jobs/*/events", srv_route_ft_events},
    {"POST", "/v1/fine_tuning/jobs/*/cancel", srv_route_ft_cancel},
    {"GET", "/v1/files", srv_route_files_list},
    {"POST", "/v1/files", srv_route_files_upload},
    {"GET", "/v1/files/*", srv_route_files_get},
    {"DELETE", "/v1/files/*", srv_route_files_delete},
    {"GET", "/v1/files/*/content", srv_route_files_content},
    {"GET", "/lora-adapters", srv_route_lora_list},
    {"POST", "/lora-adapters", srv_route_lora_scale},
    {"POST", "/lora-adapters/load", srv_route_lora_load},
    {"POST", "/lora-adapters/unload", srv_route_lora_unload},
    {"GET", "/lora-adapters/files", srv_route_lora_files},
};

/* Matches path against pattern; a '*' segment matches one non-empty segment, copied to id. */
static bool path_match(const char *pattern, const char *path, char *id, size_t id_size)
{
    while (*pattern && *path) {
        if (*pattern == '*') {
            size_t n = strcspn(path, "/");
            if (n == 0 || n >= id_size)
                return false;
            memcpy(id, path, n);
            id[n] = 0;
            path += n;
            pattern++;
            continue;
        }
        if (*pattern != *path)
            return false;
        pattern++;
        path++;
    }
    return *pattern == 0 && *path == 0;
}

/* The path without trailing slashes ("/health/" is "/health"). */
static void path_normalise(const char *in, char *out, size_t size)
{
    snprintf(out, size, "%s", in);
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/')
        out[--len] = 0;
}

size_t srv_route_body_cap(const struct srv_app *app, const struct srv_request *rq, bool *upload)
{
    char path[512];
    path_normalise(rq->path, path, sizeof(path));
    *upload = !strcmp(rq->method, "POST") && !strcmp(path, "/v1/files");
    return *upload && app->max_upload_bytes > 0 ? app->max_upload_bytes : app->max_body_bytes;
}

bool srv_route_admit(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    char path[512];
    path_normalise(rq->path, path, sizeof(path));
    if (srv_guard_admit(&app->guard, rq, path, rs))
        return true;
    if (rs->status != 204) /* a preflight has its CORS headers already */
        srv_guard_cors(&app->guard, rq, rs); /* a browser may read why it was refused */
    return false;
}

static void route_dispatch(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs)
{
    char path[512];
    path_normalise(rq->path, path, sizeof(path));
    char id[128] = "";
    struct srv_request r = *rq;
    r.path = path;
    char allow[64] = "";
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        char this_id[128] = "";
        if (!path_match(routes[i].path, path, this_id, sizeof(this_id)))
            continue;
        if (!strcmp(routes[i].method, rq->method) ||
            (!strcmp(rq->method, "HEAD") && !strcmp(routes[i].method, "GET"))) {
            snprintf(id, sizeof(id), "%s", this_id);
            r.route_id = id;
            char *body = NULL; /* the body choosing the adapter its "model" names */
            if (routes[i].fn == srv_route_chat || routes[i].fn == srv_route_completions ||
                routes[i].fn == srv_route_completion || routes[i].fn == srv_route_infill ||
                routes[i].fn == srv_route_embeddings) {
                size_t len = 0;
                int st = srv_model_resolve(app, &r, &body, &len);
                if (st != 200) {
                    srv_respond_last_error(rs, st);
                    return;
                }
                if (body) {
                    r.body = body;
                    r.body_len = len;
                }
            }
            routes[i].fn(app, &r, rs);
            free(body);
            return;
        }
        size_t al = strlen(allow);
        snprintf(allow + al, sizeof(allow) - al, "%s%s", al ? ", " : "", routes[i].method);
    }
    if (allow[0]) {
        srv_respond_error(rs, 405, NULL, "method_not_allowed", "%s %s is not allowed; use %s",
                          rq->method, path, allow);
        snprintf(rs->allow, sizeof(rs->allow), "%s", allow);
        return;
    }
    srv_respond_error(rs, 404, NULL, "not_found", "no route %s %s", rq->method, path);
}

void srv_route(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    route_dispatch(app, rq, rs);
    srv_guard_cors(&app->guard, rq, rs);
}

#else /* !LATHE_HAVE_JANSSON */

#include "server/server_impl.h"

size_t srv_route_body_cap(const struct srv_app *app, const struct srv_request *rq, bool *upload)
{
    *upload = false;
    return app->max_body_bytes;
}

bool srv_route_admit(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    return true;
}

void srv_route(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    rs->status = 501;
    rs->content_type = "application/json";
    static const char msg[] = "{\"error\":{\"message\":\"this build has no JSON library "
                              "(jansson)\",\"type\":\"server_error\",\"param\":null,"
                              "\"code\":\"unsupported\"}}\n";
    lt_strbuf_append(&rs->body, msg, sizeof(msg) - 1);
}

#endif
