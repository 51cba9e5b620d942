/* routes_complete.c: POST /v1/chat/completions and /v1/completions, whole or streamed.
 *
 * Both check every field first (type, range, unknown names), turn the request into a
 * prompt and a srv_gen, and hand it to the engine. A whole response waits for the end; a
 * streamed one sends server-sent events as text becomes visible, and always ends with
 * "data: [DONE]" (after an error event when the generation failed). Whoever holds the
 * generation last frees it; a client that goes away cancels it, which frees its slot. */
#ifdef LATHE_HAVE_JANSSON
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_check.h"
#include "server/routes.h"

#define MAX_MESSAGES 4096
#define MAX_STOP_LEN 256

enum kind {
    KIND_CHAT,
    KIND_TEXT,
};

static const struct srv_field common_fields[] = {
    {"model", SRV_JT_STRING, 0, 0, false},
    {"stream", SRV_JT_BOOL, 0, 0, false},
    {"stream_options", SRV_JT_OBJECT, 0, 0, false},
    {"max_tokens", SRV_JT_INT, 1, 1 << 24, false},
    {"max_completion_tokens", SRV_JT_INT, 1, 1 << 24, false},
    {"temperature", SRV_JT_NUMBER, 0, 2, false},
    {"top_p", SRV_JT_NUMBER, 0, 1, false},
    {"top_k", SRV_JT_INT, 0, 1 << 24, false},
    {"min_p", SRV_JT_NUMBER, 0, 1, false},
    {"repeat_penalty", SRV_JT_NUMBER, 1e-3, 100, false},
    {"repeat_last_n", SRV_JT_INT, -1, 1 << 24, false},
    {"seed", SRV_JT_INT, -1, 9.2e18, false},
    {"stop", SRV_JT_STRING | SRV_JT_ARRAY, 0, 0, false},
    {"n", SRV_JT_INT, 1, 1, false},
    {"presence_penalty", SRV_JT_NUMBER, -2, 2, false},
    {"frequency_penalty", SRV_JT_NUMBER, -2, 2, false},
    {"logprobs", SRV_JT_BOOL, 0, 0, false},
    {"ignore_eos", SRV_JT_BOOL, 0, 0, false},
    {"user", SRV_JT_STRING, 0, 0, false},
    {"lora", SRV_JT_ARRAY | SRV_JT_STRING, 0, 0, false},
};
static const struct srv_field chat_fields[] = {
    {"messages", SRV_JT_ARRAY, 0, 0, true},
    {"chat_template_kwargs", SRV_JT_OBJECT, 0, 0, false},
};
static const struct srv_field text_fields[] = {
    {"prompt", SRV_JT_STRING | SRV_JT_ARRAY, 0, 0, true},
};
#define N_COMMON (sizeof(common_fields) / sizeof(common_fields[0]))

/* What a response needs besides the generation. */
struct completion {
    enum kind kind;
    bool stream, include_usage;
    char id[48];
    long long created;
    char model[SRV_NAME_MAX];
    int n_prompt;
    struct srv_gen *g;
};

static atomic_ullong request_counter;

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t fresh_random(void)
{
    uint64_t n = atomic_fetch_add(&request_counter, 1);
    return mix64(n ^ (uint64_t)(srv_now_mono() * 1e9) ^ ((uint64_t)srv_now_unix() << 20));
}

/* ---- reading the request ---- */

static int check_fields(const json_t *body, const struct srv_field *extra, size_t n_extra)
{
    struct srv_field all[N_COMMON + 4];
    memcpy(all, common_fields, sizeof(common_fields));
    memcpy(all + N_COMMON, extra, n_extra * sizeof(*extra));
    int st = srv_check_object(body, "", all, N_COMMON + n_extra);
    if (st != 200)
        return st;
    json_t *so = srv_json_get(body, "stream_options");
    if (so) {
        static const struct srv_field so_fields[] = {{"include_usage", SRV_JT_BOOL, 0, 0, false}};
        if ((st = srv_check_object(so, "stream_options", so_fields, 1)) != 200)
            return st;
    }
    if (srv_json_bool(body, "logprobs", false))
        return srv_fail(400, "logprobs", "unsupported", "logprobs are not supported");
    return 200;
}

static int read_stops(const json_t *body, struct srv_gen_params *p)
{
    json_t *stop = srv_json_get(body, "stop");
    if (!stop)
        return 200;
    if (json_is_string(stop)) {
        if (json_string_length(stop) > MAX_STOP_LEN)
            return srv_fail(400, "stop", "out_of_range", "a stop string is at most %d bytes",
                            MAX_STOP_LEN);
        p->stops[0] = strdup(json_string_value(stop));
        if (!p->stops[0])
            return srv_fail(503, "stop", NULL, "out of memory");
        p->n_stops = 1;
        return 200;
    }
    if (json_array_size(stop) > SRV_MAX_STOPS)
        return srv_fail(400, "stop", "out_of_range", "at most %d stop strings", SRV_MAX_STOPS);
    char name[32];
    for (size_t i = 0; i < json_array_size(stop); i++) {
        json_t *s = json_array_get(stop, i);
        snprintf(name, sizeof(name), "stop[%zu]", i);
        int st = srv_check_value(s, name, SRV_JT_STRING, 0, 0);
        if (st != 200)
            return st;
        if (json_string_length(s) > MAX_STOP_LEN)
            return srv_fail(400, name, "out_of_range", "a stop string is at most %d bytes",
                            MAX_STOP_LEN);
        p->stops[p->n_stops] = strdup(json_string_value(s));
        if (!p->stops[p->n_stops])
            return srv_fail(503, name, NULL, "out of memory");
        p->n_stops++;
    }
    return 200;
}

static int read_loras(const json_t *body, struct srv_gen_params *p)
{
    json_t *lora = srv_json_get(body, "lora");
    if (!lora)
        return 200;
    p->lora_given = true;
    if (json_is_string(lora)) {
        if (json_string_length(lora) >= SRV_NAME_MAX)
            return srv_fail(400, "lora", "invalid_name", "an adapter name is shorter than %d",
                            SRV_NAME_MAX);
        snprintf(p->loras[0].name, SRV_NAME_MAX, "%s", json_string_value(lora));
        p->loras[0].id = -1;
        p->loras[0].scale = 1.0f;
        p->n_loras = 1;
        return 200;
    }
    static const struct srv_field fields[] = {
        {"name", SRV_JT_STRING, 0, 0, false},
        {"id", SRV_JT_INT, 0, 1 << 20, false},
        {"scale", SRV_JT_NUMBER, -100, 100, false},
    };
    if (json_array_size(lora) > SRV_MAX_REQ_LORAS)
        return srv_fail(400, "lora", "out_of_range", "at most %d adapters per request",
                        SRV_MAX_REQ_LORAS);
    char where[32];
    for (size_t i = 0; i < json_array_size(lora); i++) {
        json_t *e = json_array_get(lora, i);
        snprintf(where, sizeof(where), "lora[%zu]", i);
        int st = srv_check_object(e, where, fields, 3);
        if (st != 200)
            return st;
        const char *name = srv_json_str(e, "name", NULL);
        long long id = srv_json_int(e, "id", -1);
        if (!name == (id < 0))
            return srv_fail(400, where, "invalid_value", "'%s' needs either a name or an id",
                            where);
        struct srv_lora_choice *c = &p->loras[p->n_loras++];
        if (name && strlen(name) >= SRV_NAME_MAX)
            return srv_fail(400, where, "invalid_name", "an adapter name is shorter than %d",
                            SRV_NAME_MAX);
        snprintf(c->name, sizeof(c->name), "%s", name ? name : "");
        c->id = (int)id;
        c->scale = (float)srv_json_num(e, "scale", 1.0);
    }
    return 200;
}

static int read_sampling(const json_t *body, struct srv_gen_params *p)
{
    struct lt_sampler_params *s = &p->sampling;
    *s = lt_sampler_default_params();
    s->temperature = (float)srv_json_num(body, "temperature", s->temperature);
    s->top_p = (float)srv_json_num(body, "top_p", s->top_p);
    s->top_k = (int32_t)srv_json_int(body, "top_k", s->top_k);
    s->min_p = (float)srv_json_num(body, "min_p", s->min_p);
    s->repeat_penalty = (float)srv_json_num(body, "repeat_penalty", s->repeat_penalty);
    s->repeat_last_n = (int32_t)srv_json_int(body, "repeat_last_n", s->repeat_last_n);
    s->presence_penalty = (float)srv_json_num(body, "presence_penalty", s->presence_penalty);
    s->frequency_penalty = (float)srv_json_num(body, "frequency_penalty", s->frequency_penalty);
    long long seed = srv_json_int(body, "seed", -1);
    s->seed = seed >= 0 ? (uint64_t)seed : fresh_random();
    p->max_tokens = (int)srv_json_int(body, "max_completion_tokens",
                                      srv_json_int(body, "max_tokens", 0));
    p->ignore_eos = json_is_true(json_object_get(body, "ignore_eos"));
    int st = read_stops(body, p);
    if (st == 200)
        st = read_loras(body, p);
    return st;
}

static bool role_known(const char *r)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
        if (!strcmp(r, roles[i]))
            return true;
    return false;
}

/* The message's text: a string, or the "text" parts of an array, joined by newlines. */
static int message_content(const json_t *content, const char *where, char **out)
{
    *out = NULL;
    struct lt_strbuf b = {0};
    char name[64];
    snprintf(name, sizeof(name), "%s.content", where);
    if (!content) {
        *out = strdup("");
    } else if (json_is_string(content)) {
        *out = strdup(json_string_value(content));
    } else {
        static const struct srv_field part_fields[] = {
            {"type", SRV_JT_STRING, 0, 0, true},
            {"text", SRV_JT_STRING, 0, 0, true},
        };
        char pname[96];
        for (size_t i = 0; i < json_array_size(content); i++) {
            json_t *part = json_array_get(content, i);
            snprintf(pname, sizeof(pname), "%s[%zu]", name, i);
            int st = srv_check_object(part, pname, part_fields, 2);
            if (st == 200 && strcmp(srv_json_str(part, "type", ""), "text") != 0)
                st = srv_fail(400, pname, "unsupported", "only text content parts are supported");
            if (st != 200) {
                lt_strbuf_free(&b);
                return st;
            }
            if ((i > 0 && lt_strbuf_append(&b, "\n", 1) != LT_OK) ||
                lt_strbuf_append(&b, srv_json_str(part, "text", ""),
                                 json_string_length(json_object_get(part, "text"))) != LT_OK) {
                lt_strbuf_free(&b);
                return srv_fail(503, name, NULL, "out of memory");
            }
        }
        *out = b.data ? b.data : strdup("");
        if (b.data)
            return 200;
    }
    return *out ? 200 : srv_fail(503, name, NULL, "out of memory");
}

/* The chat prompt's tokens, rendered by the engine's template. */
static int chat_prompt(struct srv_app *app, const json_t *body, struct lt_tokens *out)
{
    static const struct srv_field msg_fields[] = {
        {"role", SRV_JT_STRING, 0, 0, true},
        {"content", SRV_JT_STRING | SRV_JT_ARRAY | SRV_JT_NULL, 0, 0, false},
        {"name", SRV_JT_STRING, 0, 0, false},
        {"reasoning_content", SRV_JT_STRING, 0, 0, false},
    };
    json_t *msgs = json_object_get(body, "messages");
    size_t n = json_array_size(msgs);
    if (n == 0)
        return srv_fail(400, "messages", "invalid_value", "'messages' must not be empty");
    if (n > MAX_MESSAGES)
        return srv_fail(400, "messages", "out_of_range", "at most %d messages", MAX_MESSAGES);
    bool thinking = false;
    json_t *kw = srv_json_get(body, "chat_template_kwargs");
    if (kw) {
        static const struct srv_field kw_fields[] = {{"enable_thinking", SRV_JT_BOOL, 0, 0, false}};
        int st = srv_check_object(kw, "chat_template_kwargs", kw_fields, 1);
        if (st != 200)
            return st;
        thinking = srv_json_bool(kw, "enable_thinking", false);
    }
    struct lt_chat_message *cm = calloc(n, sizeof(*cm));
    char **contents = calloc(n, sizeof(*contents));
    int st = 200;
    if (!cm || !contents) {
        st = srv_fail(503, "messages", NULL, "out of memory for %zu messages", n);
        goto out_free;
    }
    char where[48];
    for (size_t i = 0; i < n && st == 200; i++) {
        json_t *m = json_array_get(msgs, i);
        snprintf(where, sizeof(where), "messages[%zu]", i);
        if ((st = srv_check_object(m, where, msg_fields, 4)) != 200)
            break;
        const char *role = srv_json_str(m, "role", "");
        if (!role_known(role)) {
            char rname[64];
            snprintf(rname, sizeof(rname), "%s.role", where);
            st = srv_fail(400, rname, "invalid_value",
                          "'%s' must be system, user, assistant, tool or developer, not '%.40s'",
                          rname, role);
            break;
        }
        if ((st = message_content(srv_json_get(m, "content"), where, &contents[i])) != 200)
            break;
        cm[i].role = !strcmp(role, "developer") ? "system" : role;
        cm[i].content = contents[i];
        cm[i].reasoning = srv_json_str(m, "reasoning_content", NULL);
    }
    if (st == 200)
        st = app->engine->iface->prompt_chat(app->engine, cm, n, thinking, out);
out_free:
    for (size_t i = 0; contents && i < n; i++)
        free(contents[i]);
    free(contents);
    free(cm);
    return st;
}

static int text_prompt(struct srv_app *app, const json_t *body, struct srv_gen_params *p)
{
    json_t *prompt = json_object_get(body, "prompt");
    if (json_is_array(prompt) && json_array_size(prompt) == 1 &&
        json_is_string(json_array_get(prompt, 0)))
        prompt = json_array_get(prompt, 0);
    if (json_is_string(prompt)) {
        if (json_string_length(prompt) == 0)
            return srv_fail(400, "prompt", "invalid_value", "the prompt is empty");
        struct lt_tokens tk = {0};
        int st = app->engine->iface->prompt_text(app->engine, json_string_value(prompt), &tk);
        p->prompt = tk.ids;
        p->n_prompt = tk.n;
        free(tk.offs);
        return st;
    }
    if (json_array_size(prompt) > 0 && !json_is_string(json_array_get(prompt, 0)))
        return srv_token_array(app, prompt, "prompt", &p->prompt, &p->n_prompt);
    return srv_fail(400, "prompt", "invalid_value",
                    "'prompt' must be a string, an array of one string or an array of token ids");
}

/* Everything up to submission; on success c->g is queued in the engine. */
static int start_completion(struct srv_app *app, const struct srv_request *rq, enum kind kind,
                            json_t **body_out, struct completion *c)
{
    json_t *body = NULL;
    struct srv_gen_params p = {0};
    int st = srv_parse_body(rq, &body);
    *body_out = body;
    if (st == 200)
        st = kind == KIND_CHAT ? check_fields(body, chat_fields, 2) : check_fields(body, text_fields, 1);
    if (st == 200)
        st = read_sampling(body, &p);
    if (st != 200)
        goto out_free_params;
    struct srv_model_info mi;
    app->engine->iface->info(app->engine, &mi);
    const char *prompt_field = kind == KIND_CHAT ? "messages" : "prompt";
    if (kind == KIND_CHAT) {
        struct lt_tokens tk = {0};
        st = chat_prompt(app, body, &tk);
        p.prompt = tk.ids;
        p.n_prompt = tk.n;
        free(tk.offs);
    } else {
        st = text_prompt(app, body, &p);
    }
    if (st != 200)
        goto out_free_params;
    if (p.n_prompt == 0) {
        st = srv_fail(400, prompt_field, "invalid_value", "the prompt is empty");
        goto out_free_params;
    }
    if ((int64_t)p.n_prompt >= mi.n_ctx) {
        st = srv_fail(400, prompt_field, "context_length_exceeded",
                      "the prompt has %zu tokens; a slot holds %d (prompt and completion)",
                      p.n_prompt, mi.n_ctx);
        goto out_free_params;
    }
    c->kind = kind;
    c->stream = srv_json_bool(body, "stream", false);
    c->include_usage = srv_json_bool(srv_json_get(body, "stream_options"), "include_usage", false);
    c->created = (long long)srv_now_unix();
    snprintf(c->id, sizeof(c->id), "%s-%016llx", kind == KIND_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)fresh_random());
    snprintf(c->model, sizeof(c->model), "%s", mi.id);
    c->n_prompt = (int)p.n_prompt;
    st = srv_gen_new(&p, &c->g);
    if (st != 200)
        return st;
    st = app->engine->iface->submit(app->engine, c->g);
    if (st != 200) {
        srv_gen_unref(c->g);
        c->g = NULL;
    }
    return st;

out_free_params:
    srv_gen_params_free(&p);
    return st;
}

/* ---- shaping the response ---- */

static json_t *usage_json(const struct completion *c, const struct srv_gen_snap *s)
{
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", c->n_prompt, "completion_tokens",
                     s->n_completion, "total_tokens", c->n_prompt + s->n_completion);
}

static json_t *timings_json(const struct srv_gen_snap *s)
{
    double gen_s = s->total_s - s->first_token_s;
    return json_pack("{s:f,s:f,s:f,s:f}", "queue_s", s->queue_s, "first_token_s",
                     s->first_token_s, "total_s", s->total_s, "tokens_per_s",
                     gen_s > 0 && s->n_completion > 1 ? (s->n_completion - 1) / gen_s : 0.0);
}

static const char *finish_reason(enum srv_finish f)
{
    return f == SRV_FINISH_LENGTH ? "length" : "stop";
}

static void respond_whole(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs, struct completion *c)
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
    json_t *choice = c->kind == KIND_CHAT
        ? json_pack("{s:i,s:{s:s,s:o},s:n,s:s}", "index", 0, "message", "role", "assistant",
                    "content", content, "logprobs", "finish_reason", finish_reason(s.finish))
        : json_pack("{s:i,s:o,s:n,s:s}", "index", 0, "text", content, "logprobs",
                    "finish_reason", finish_reason(s.finish));
    srv_respond_json(rs, 200,
                     json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o],s:o,s:o}", "id", c->id, "object",
                               c->kind == KIND_CHAT ? "chat.completion" : "text_completion",
                               "created", (json_int_t)c->created, "model", c->model,
                               "system_fingerprint", "lathe", "choices", choice, "usage",
                               usage_json(c, &s), "timings", timings_json(&s)));
}

/* A streamed response in progress. */
struct stream_state {
    struct completion c;
    size_t sent;
    bool role_sent;
};

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

/* One chunk; delta_or_text is the chat delta object or the completion text (stolen). */
static json_t *chunk_json(const struct completion *c, json_t *delta_or_text, const char *finish)
{
    json_t *choice =
        c->kind == KIND_CHAT
            ? json_pack("{s:i,s:o,s:n,s:s?}", "index", 0, "delta", delta_or_text, "logprobs",
                        "finish_reason", finish)
            : json_pack("{s:i,s:o,s:n,s:s?}", "index", 0, "text", delta_or_text, "logprobs",
                        "finish_reason", finish);
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:[o]}", "id", c->id, "object",
                     c->kind == KIND_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)c->created, "model", c->model, "system_fingerprint", "lathe",
                     "choices", choice);
}

static bool stream_fill(void *user, struct srv_conn *conn, struct lt_strbuf *out, bool *end)
{
    struct stream_state *ss = user;
    struct completion *c = &ss->c;
    if (c->kind == KIND_CHAT && !ss->role_sent) {
        ss->role_sent = true;
        sse_event(out, chunk_json(c, json_pack("{s:s,s:s}", "role", "assistant", "content", ""),
                                  NULL));
        return true;
    }
    srv_gen_wait(c->g, ss->sent, 100);
    struct lt_strbuf text = {0};
    struct srv_gen_snap s;
    srv_gen_snapshot(c->g, ss->sent, &text, &s);
    bool got_text = text.len > 0;
    if (got_text) {
        json_t *t = srv_json_text(text.data, text.len);
        sse_event(out, chunk_json(c, c->kind == KIND_CHAT ? json_pack("{s:o}", "content", t) : t,
                                  NULL));
        ss->sent = s.visible;
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
        json_t *last = chunk_json(c, c->kind == KIND_CHAT ? json_object() : json_string(""),
                                  finish_reason(s.finish));
        json_object_set_new(last, "usage", usage_json(c, &s));
        json_object_set_new(last, "timings", timings_json(&s));
        sse_event(out, last);
        if (c->include_usage) {
            json_t *u = chunk_json(c, json_object(), NULL);
            json_object_set_new(u, "choices", json_array());
            json_object_set_new(u, "usage", usage_json(c, &s));
            sse_event(out, u);
        }
    }
    lt_strbuf_append(out, "data: [DONE]\n\n", 14);
    *end = true;
    return true;
}

static void stream_free(void *user)
{
    struct stream_state *ss = user;
    srv_gen_cancel(ss->c.g); /* no-op when it finished */
    srv_gen_unref(ss->c.g);
    free(ss);
}

static void route_completion(struct srv_app *app, const struct srv_request *rq,
                             struct srv_response *rs, enum kind kind)
{
    json_t *body = NULL;
    struct completion c = {0};
    if (!srv_require_ready(app, rs))
        return;
    int st = start_completion(app, rq, kind, &body, &c);
    json_decref(body);
    if (st != 200) {
        srv_respond_last_error(rs, st);
        return;
    }
    if (!c.stream) {
        respond_whole(app, rq, rs, &c);
        srv_gen_unref(c.g);
        return;
    }
    struct stream_state *ss = calloc(1, sizeof(*ss));
    if (!ss) {
        srv_gen_cancel(c.g);
        srv_gen_unref(c.g);
        srv_respond_error(rs, 503, NULL, NULL, "out of memory for a stream");
        return;
    }
    ss->c = c;
    rs->status = 200;
    rs->content_type = "text/event-stream";
    rs->is_stream = true;
    rs->stream = (struct srv_stream){.fill = stream_fill, .free = stream_free, .user = ss};
}

void srv_route_chat(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    route_completion(app, rq, rs, KIND_CHAT);
}

void srv_route_completions(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs)
{
    route_completion(app, rq, rs, KIND_TEXT);
}

#endif
