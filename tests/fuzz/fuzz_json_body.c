/* fuzz_json_body.c: libFuzzer over the server's request handling: the first input byte picks
 * a route, the rest is its body; srv_route parses and validates it (json_check.c and every
 * route's field checks) against an engine that is always ready and answers a generation at
 * once. Whatever the body, a route must answer with a status and, for 4xx/5xx, the OpenAI
 * error shape; a streamed answer must end. Sanitizers catch the rest. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_impl.h"

static enum srv_state f_state(struct srv_engine *e, char *why, size_t n)
{
    return SRV_STATE_READY;
}

static void f_info(struct srv_engine *e, struct srv_model_info *out)
{
    memset(out, 0, sizeof(*out));
    strcpy(out->id, "fuzz");
    out->n_ctx = 64;
    out->parallel = 1;
    out->n_vocab = 256;
    out->n_layer = 2;
}

static int f_tok(struct srv_engine *e, const char *text, size_t len, unsigned flags,
                 struct lt_tokens *out)
{
    for (size_t i = 0; i < len && i < 100000; i++) {
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 16;
            lt_token *ids = realloc(out->ids, cap * sizeof(*ids));
            if (!ids)
                return srv_fail(503, NULL, NULL, "oom");
            out->ids = ids;
            out->cap = cap;
        }
        out->ids[out->n++] = (unsigned char)text[i];
    }
    return 200;
}

static int f_detok(struct srv_engine *e, const lt_token *ids, size_t n, unsigned flags,
                   struct lt_strbuf *out)
{
    for (size_t i = 0; i < n; i++) {
        char c = (char)ids[i];
        lt_strbuf_append(out, &c, 1);
    }
    return 200;
}

static int f_chat(struct srv_engine *e, const struct lt_chat_message *m, size_t n,
                  const struct lt_chat_options *opt, struct lt_tokens *out)
{
    (void)opt;
    for (size_t i = 0; i < n; i++)
        if (m[i].content)
            f_tok(e, m[i].content, strlen(m[i].content), 0, out);
    return 200;
}

static int f_text(struct srv_engine *e, const char *text, struct lt_tokens *out)
{
    return f_tok(e, text, strlen(text), 0, out);
}

static int f_submit(struct srv_engine *e, struct srv_gen *g)
{
    srv_gen_push(g, "ok \xff", 4, 2);
    srv_gen_finish(g, SRV_FINISH_LENGTH);
    return 200;
}

static void f_metrics(struct srv_engine *e, struct lt_strbuf *out) {}

static int f_lora_list(struct srv_engine *e, struct srv_lora_info **out, int *n)
{
    *out = NULL;
    *n = 0;
    return 200;
}

static int f_lora_load(struct srv_engine *e, const char *name, const char *path, float s)
{
    return 200;
}

static int f_lora_unload(struct srv_engine *e, const char *name)
{
    return srv_fail(404, "name", NULL, "none");
}

static int f_lora_scale(struct srv_engine *e, const char *name, int id, float s)
{
    return srv_fail(404, "name", NULL, "none");
}

static int f_train_start(struct srv_engine *e, const struct lt_train_params *p,
                         const struct srv_train_meta *m, char *id, size_t n)
{
    return srv_fail(409, NULL, NULL, "busy");
}

static int f_train_info(struct srv_engine *e, const char *id, struct srv_train_info *out)
{
    return srv_fail(404, NULL, NULL, "none");
}

static int f_train_list(struct srv_engine *e, char (*ids)[48], int max, int *n)
{
    *n = 0;
    return 200;
}

static int f_train_control(struct srv_engine *e, const char *id, enum srv_train_op op)
{
    return srv_fail(409, NULL, NULL, "none");
}

static const struct srv_engine_iface iface = {
    .state = f_state,
    .info = f_info,
    .tokenize = f_tok,
    .detokenize = f_detok,
    .prompt_chat = f_chat,
    .prompt_text = f_text,
    .submit = f_submit,
    .metrics = f_metrics,
    .lora_list = f_lora_list,
    .lora_load = f_lora_load,
    .lora_unload = f_lora_unload,
    .lora_set_scale = f_lora_scale,
    .train_start = f_train_start,
    .train_info = f_train_info,
    .train_list = f_train_list,
    .train_control = f_train_control,
};

static const char *const paths[] = {
    "/v1/chat/completions",
    "/v1/completions",
    "/tokenize",
    "/detokenize",
    "/train",
    "/v1/fine_tuning/jobs",
    "/lora-adapters",
    "/lora-adapters/load",
    "/lora-adapters/unload",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct srv_engine engine = {.iface = &iface};
    static struct srv_app app;
    if (!app.engine) {
        app.engine = &engine;
        app.train_dir = "/nonexistent-lathe-fuzz-dir";
        app.max_body_bytes = 1 << 20;
        app.quiet = true;
        pthread_mutex_init(&app.stats_mu, NULL);
    }
    if (size < 1)
        return 0;
    char *body = malloc(size);
    if (!body)
        return 0;
    memcpy(body, data + 1, size - 1);
    body[size - 1] = 0;
    struct srv_request rq = {
        .method = "POST",
        .path = paths[data[0] % (sizeof(paths) / sizeof(paths[0]))],
        .body = body,
        .body_len = size - 1,
        .route_id = "",
    };
    struct srv_response rs = {0};
    srv_route(&app, &rq, &rs);
    if (rs.status < 200 || rs.status > 599)
        abort();
    if (rs.is_stream) {
        struct lt_strbuf out = {0};
        bool end = false;
        for (int i = 0; i < 1000 && !end; i++)
            if (!rs.stream.fill(rs.stream.user, NULL, &out, &end))
                break;
        if (!end)
            abort();
        rs.stream.free(rs.stream.user);
        lt_strbuf_free(&out);
    } else if (rs.status >= 400) {
        json_t *j = json_loadb(rs.body.data, rs.body.len, 0, NULL);
        json_t *e = json_object_get(j, "error");
        if (json_is_string(e) && json_is_false(json_object_get(j, "ok"))) /* /train's shape */
            e = json_object_get(j, "param") ? e : NULL;
        else if (!json_is_string(json_object_get(e, "message")) || !json_object_get(e, "param"))
            e = NULL;
        if (!e)
            abort();
        json_decref(j);
    }
    lt_strbuf_free(&rs.body);
    free(body);
    return 0;
}
