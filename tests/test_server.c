/* test_server.c: the server's HTTP layer and routes over real loopback sockets, with a fake
 * engine (test_server_fake.h) instead of a model, so every check is fast and exact:
 *   - /health: 503 "loading", 200 "ok", 503 "error", and 200 after every bad request;
 *   - bad bodies (broken JSON, not an object, empty, too large, unknown fields, wrong types,
 *     out-of-range values, nested fields, path traversal in `out` and `name`) each get a
 *     4xx with the OpenAI error shape naming the field;
 *   - unknown routes (404, a path that is not UTF-8 quoted in valid JSON) and wrong methods
 *     (405 with Allow);
 *   - chat and text completions, whole and streamed (SSE ending in "data: [DONE]"), against
 *     the text the fake is known to produce, with usage and finish_reason;
 *   - sampling parameters reaching the engine; /tokenize and /detokenize;
 *   - a client that disconnects mid-generation cancels it (stream and whole);
 *   - a generation that fails mid-stream ends with an error event and [DONE];
 *   - /train, /v1/fine_tuning/jobs and /lora-adapters passing the right values through;
 *   - /metrics in Prometheus text; many connections at once.
 * The guard (keys, Host, Origin, Content-Type) and connection limits are tested by
 * test_server_guard.c; the real engine with a real model by tests/py/test_server.py. */
#include "check.h"

#if !defined(LATHE_HAVE_JANSSON) || !defined(LATHE_HAVE_MHD)
int main(void)
{
    printf("skipped: the server needs jansson and libmicrohttpd\n");
    return 77;
}
#else
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>

#include "test_server_fake.h"

static int port;
static char train_dir[256];
static struct srv_app test_app;

static json_t *parse(const struct http_reply *r)
{
    return r->body ? json_loads(r->body, 0, NULL) : NULL;
}

/* An OpenAI-shaped error with this status, param (NULL: null) and code. */
/* OpenAI's error object; or /train's shape: "ok" false, the sentence under "error" and the
 * object's other fields beside it. */
static bool is_error(const struct http_reply *r, int status, const char *param, const char *code)
{
    json_t *j = parse(r);
    json_t *e = json_object_get(j, "error");
    if (json_is_string(e) && json_is_false(json_object_get(j, "ok"))) {
        json_object_set(j, "message", e);
        e = j;
    }
    bool ok = r->status == status && json_is_string(json_object_get(e, "message")) &&
              json_is_string(json_object_get(e, "type")) &&
              json_is_string(json_object_get(e, "code")) && json_object_get(e, "param");
    if (ok && param)
        ok = json_is_string(json_object_get(e, "param")) &&
             !strcmp(json_string_value(json_object_get(e, "param")), param);
    else if (ok)
        ok = json_is_null(json_object_get(e, "param"));
    if (ok && code)
        ok = !strcmp(json_string_value(json_object_get(e, "code")), code);
    if (!ok)
        fprintf(stderr, "  expected %d param=%s code=%s, got %d: %s\n", status,
                param ? param : "null", code ? code : "*", r->status, r->body ? r->body : "");
    json_decref(j);
    return ok;
}

static bool healthy(void)
{
    struct http_reply r;
    bool ok = http_do(port, "GET", "/health", NULL, &r) && r.status == 200 &&
              strstr(r.body, "\"ok\"");
    http_reply_free(&r);
    return ok;
}

static void expect_error(const char *method, const char *path, const char *body, int status,
                         const char *param, const char *code)
{
    struct http_reply r;
    CHECK(http_do(port, method, path, body, &r), "%s %s", method, path);
    CHECK(is_error(&r, status, param, code), "%s %s %s", method, path, body ? body : "");
    http_reply_free(&r);
    CHECK(healthy(), "healthy after %s", body ? body : path);
}

/* The fake's text for n words. */
static void fake_text(int n, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, size - len, "%sw%d", i ? " " : "", i);
}

static void test_health(void)
{
    struct http_reply r;
    atomic_store(&fake.state, SRV_STATE_LOADING);
    http_do(port, "GET", "/health", NULL, &r);
    CHECK(r.status == 503 && strstr(r.body, "\"loading\""), "%d %s", r.status, r.body);
    http_reply_free(&r);
    http_do(port, "POST", "/v1/completions", "{\"prompt\":\"hi\"}", &r);
    CHECK(is_error(&r, 503, NULL, "loading"));
    http_reply_free(&r);
    atomic_store(&fake.state, SRV_STATE_FAILED);
    http_do(port, "GET", "/health", NULL, &r);
    CHECK(r.status == 503 && strstr(r.body, "fake failure"), "%d %s", r.status, r.body);
    http_reply_free(&r);
    atomic_store(&fake.state, SRV_STATE_READY);
    CHECK(healthy());
    http_do(port, "GET", "/v1/models", NULL, &r);
    json_t *j = parse(&r);
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    CHECK(r.status == 200 && !strcmp(json_string_value(json_object_get(m, "id")), "fake-model"));
    json_decref(j);
    http_reply_free(&r);
}

static void test_routing(void)
{
    expect_error("GET", "/nope", NULL, 404, NULL, "not_found");
    /* a path that is not UTF-8 once unescaped is quoted in valid JSON */
    expect_error("GET", "/nope%ff%c3", NULL, 404, NULL, "not_found");
    expect_error("GET", "/v1/fine_tuning/jobs/a/b", NULL, 404, NULL, "not_found");
    struct http_reply r;
    http_do(port, "DELETE", "/v1/chat/completions", NULL, &r);
    CHECK(is_error(&r, 405, NULL, "method_not_allowed"));
    CHECK(strstr(r.headers, "Allow: POST") != NULL, "%s", r.headers);
    http_reply_free(&r);
    http_do(port, "GET", "/health/", NULL, &r); /* a trailing slash is the same route */
    CHECK(r.status == 200);
    http_reply_free(&r);
}

static void test_bad_bodies(void)
{
    const char *chat = "/v1/chat/completions";
    expect_error("POST", chat, "{\"messages\": [", 400, NULL, "invalid_json");
    expect_error("POST", chat, "[1, 2]", 400, NULL, "invalid_type");
    expect_error("POST", chat, "", 400, NULL, "missing_body");
    expect_error("POST", chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"x\":1,\"x\":2}",
                 400, NULL, "invalid_json"); /* duplicate key */
    expect_error("POST", chat, "{}", 400, "messages", "missing_field");
    expect_error("POST", chat, "{\"messages\":[]}", 400, "messages", "invalid_value");
    expect_error("POST", chat, "{\"messages\":\"hi\"}", 400, "messages", "invalid_type");
    const char *msg = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char body[512];
    static const struct {
        const char *extra, *param, *code;
    } cases[] = {
        {"\"temprature\":1", "temprature", "unknown_field"},
        {"\"temperature\":\"hot\"", "temperature", "invalid_type"},
        {"\"temperature\":2.5", "temperature", "out_of_range"},
        {"\"temperature\":-0.1", "temperature", "out_of_range"},
        {"\"top_p\":1.5", "top_p", "out_of_range"},
        {"\"top_k\":-1", "top_k", "out_of_range"},
        {"\"top_k\":2.5", "top_k", "invalid_type"},
        {"\"min_p\":2", "min_p", "out_of_range"},
        {"\"repeat_penalty\":0", "repeat_penalty", "out_of_range"},
        {"\"max_tokens\":0", "max_tokens", "out_of_range"},
        {"\"max_tokens\":true", "max_tokens", "invalid_type"},
        {"\"n\":5", "n", "out_of_range"}, /* the fake has 4 slots */
        {"\"n\":0", "n", "out_of_range"},
        {"\"seed\":-5", "seed", "out_of_range"},
        {"\"stream\":\"yes\"", "stream", "invalid_type"},
        {"\"stream_options\":{\"include_usage\":1}", "stream_options.include_usage",
         "invalid_type"},
        {"\"stream_options\":{\"what\":true}", "stream_options.what", "unknown_field"},
        {"\"stop\":[\"a\",2]", "stop[1]", "invalid_type"},
        {"\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\","
         "\"n\",\"o\",\"p\",\"q\"]",
         "stop", "out_of_range"},
        {"\"logprobs\":1", "logprobs", "invalid_type"},
        {"\"logprobs\":true,\"top_logprobs\":21", "top_logprobs", "out_of_range"},
        {"\"top_logprobs\":2", "top_logprobs", "invalid_value"},
        {"\"n_probs\":21", "n_probs", "out_of_range"},
        {"\"echo\":true", "echo", "unknown_field"},
        {"\"presence_penalty\":2.5", "presence_penalty", "out_of_range"},
        {"\"frequency_penalty\":-3", "frequency_penalty", "out_of_range"},
        {"\"lora\":[{\"scale\":1}]", "lora[0]", "invalid_value"},
        {"\"lora\":[{\"name\":\"a.gguf\",\"scale\":\"big\"}]", "lora[0].scale", "invalid_type"},
        {"\"lora\":5", "lora", "invalid_type"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(body, sizeof(body), "{%s,%s}", msg, cases[i].extra);
        expect_error("POST", chat, body, 400, cases[i].param, cases[i].code);
    }
    expect_error("POST", chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":"
                 "\"user\",\"content\":5}]}", 400, "messages[1].content", "invalid_type");
    expect_error("POST", chat, "{\"messages\":[{\"role\":\"robot\",\"content\":\"a\"}]}", 400,
                 "messages[0].role", "invalid_value");
    expect_error("POST", chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"mood\":1}]}",
                 400, "messages[0].mood", "unknown_field");
    expect_error("POST", chat, "{\"messages\":[{\"content\":\"a\"}]}", 400, "messages[0].role",
                 "missing_field");
    expect_error("POST", chat, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                 "\"image_url\",\"text\":\"x\"}]}]}", 400, "messages[0].content[0]", "unsupported");
    expect_error("POST", "/v1/completions", "{\"prompt\":5}", 400, "prompt", "invalid_type");
    expect_error("POST", "/v1/completions", "{\"prompt\":[1,300]}", 400, "prompt[1]",
                 "out_of_range");
    expect_error("POST", "/v1/completions", "{\"prompt\":\"\"}", 400, "prompt", "invalid_value");
    expect_error("POST", "/v1/completions", "{\"prompt\":\"a\",\"logprobs\":6}", 400,
                 "logprobs", "out_of_range");
    expect_error("POST", "/v1/completions", "{\"prompt\":\"a\",\"logprobs\":true}", 400,
                 "logprobs", "invalid_type");
    expect_error("POST", "/v1/completions", "{\"prompt\":\"a\",\"echo\":true,\"logprobs\":1}",
                 400, "echo", "unsupported");
    expect_error("POST", "/v1/completions", "{\"prompt\":[\"a\",\"\"]}", 400, "prompt[1]",
                 "invalid_value");
    expect_error("POST", "/v1/completions", "{\"prompt\":[\"a\",5]}", 400, "prompt[1]",
                 "invalid_value");
    expect_error("POST", "/detokenize", "{\"tokens\":[65,-1]}", 400, "tokens[1]", "out_of_range");
    expect_error("POST", "/tokenize", "{\"content\":1}", 400, "content", "invalid_type");

    /* a prompt longer than the context (the fake's n_ctx is 512) */
    size_t big = 600;
    char *prompt = malloc(big + 64);
    int w = snprintf(prompt, big + 64, "{\"prompt\":\"");
    memset(prompt + w, 'a', big);
    snprintf(prompt + w + big, 64, "\"}");
    expect_error("POST", "/v1/completions", prompt, 400, "prompt", "context_length_exceeded");
    free(prompt);

    /* a body over the cap (the app's is 64 KiB here): read and refused, server fine */
    size_t huge = 1 << 20;
    char *hb = malloc(huge + 1);
    memset(hb, ' ', huge);
    hb[0] = '{';
    hb[huge - 1] = '}';
    hb[huge] = 0;
    expect_error("POST", chat, hb, 413, NULL, "body_too_large");
    free(hb);
}

static void test_paths(void)
{
    static const char *const bad[] = {"../evil.gguf", "a/b.gguf", "/etc/x.gguf", ".hidden.gguf",
                                      "x.txt", "a b.gguf", "..gguf", "", "x\\\\y.gguf"};
    char body[256];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(body, sizeof(body), "{\"out\":\"%s\",\"text\":\"hello\"}", bad[i]);
        expect_error("POST", "/train", body, 400, "out", "invalid_name");
        snprintf(body, sizeof(body), "{\"name\":\"%s\"}", bad[i]);
        expect_error("POST", "/lora-adapters/load", body, 400, "name", "invalid_name");
    }
    /* a link inside the dir that leads out of it */
    char link[512];
    snprintf(link, sizeof(link), "%s/escape.gguf", train_dir);
    CHECK(symlink("/etc/hostname", link) == 0);
    expect_error("POST", "/lora-adapters/load", "{\"name\":\"escape.gguf\"}", 400, "name",
                 "invalid_name");
    expect_error("POST", "/lora-adapters/load", "{\"name\":\"missing.gguf\"}", 404, "name",
                 "file_not_found");
    CHECK(fake.lora_loads == 0, "nothing was loaded");
    CHECK(fake.train_starts == 0, "nothing was trained");
}

/* "model": the base id answers; another name is 404 model_not_found, unless any_model_id. */
static void test_model_ids(void)
{
    static const char body[] = "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\","
                               "\"content\":\"hi\"}],\"max_tokens\":2}";
    expect_error("POST", "/v1/chat/completions", body, 404, "model", "model_not_found");
    expect_error("POST", "/completion", "{\"model\":\"gpt-4\",\"prompt\":\"hi\"}", 404, "model",
                 "model_not_found");
    struct http_reply r;
    test_app.any_model_id = true;
    CHECK(http_do(port, "POST", "/v1/chat/completions", body, &r));
    CHECK(r.status == 200, "--any-model-id: %d %s", r.status, r.body);
    http_reply_free(&r);
    test_app.any_model_id = false;
}

static void test_chat_whole(void)
{
    struct http_reply r;
    const char *body = "{\"model\":\"fake-model\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"},"
                       "{\"type\":\"text\",\"text\":\"there\"}]}],\"max_tokens\":4,"
                       "\"temperature\":0.5,\"top_k\":7,\"top_p\":0.9,\"min_p\":0.05,"
                       "\"repeat_penalty\":1.1,\"repeat_last_n\":32,\"seed\":99,"
                       "\"presence_penalty\":0.5,\"frequency_penalty\":-0.25,"
                       "\"stop\":[\"zz\"],\"user\":\"u\",\"n\":1}";
    CHECK(http_do(port, "POST", "/v1/chat/completions", body, &r));
    json_t *j = parse(&r);
    CHECK(r.status == 200, "%d %s", r.status, r.body);
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "chat.completion"));
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *m = json_object_get(c, "message");
    char want[256];
    fake_text(4, want, sizeof(want));
    CHECK(!strcmp(json_string_value(json_object_get(m, "content")), want), "%s", r.body);
    CHECK(!strcmp(json_string_value(json_object_get(m, "role")), "assistant"));
    CHECK(!strcmp(json_string_value(json_object_get(c, "finish_reason")), "length"));
    /* the prompt as the fake renders it: "system:be brief\nuser:hi\nthere\n" */
    int n_prompt = (int)strlen("system:be brief\nuser:hi\nthere\n");
    json_t *u = json_object_get(j, "usage");
    CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == n_prompt);
    CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == 4);
    CHECK(json_integer_value(json_object_get(u, "total_tokens")) == n_prompt + 4);
    json_decref(j);
    http_reply_free(&r);
    pthread_mutex_lock(&fake.mu);
    struct srv_gen_params p = fake.last_gen;
    pthread_mutex_unlock(&fake.mu);
    CHECK(p.max_tokens == 4 && p.n_stops == 1);
    CHECK(fabsf(p.sampling.temperature - 0.5f) < 1e-6f && p.sampling.top_k == 7);
    CHECK(fabsf(p.sampling.top_p - 0.9f) < 1e-6f && fabsf(p.sampling.min_p - 0.05f) < 1e-6f);
    CHECK(fabsf(p.sampling.repeat_penalty - 1.1f) < 1e-6f && p.sampling.repeat_last_n == 32);
    CHECK(p.sampling.seed == 99 && !p.lora_given);
    CHECK(fabsf(p.sampling.presence_penalty - 0.5f) < 1e-6f &&
          fabsf(p.sampling.frequency_penalty + 0.25f) < 1e-6f);
}

/* Splits an SSE body into its data payloads. */
static int sse_events(char *body, char **events, int max)
{
    int n = 0;
    for (char *line = strtok(body, "\n"); line && n < max; line = strtok(NULL, "\n"))
        if (!strncmp(line, "data: ", 6))
            events[n++] = line + 6;
    return n;
}

static void test_stream(bool chat)
{
    struct http_reply r;
    const char *body = chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
                              "\"max_tokens\":6,\"stream_options\":{\"include_usage\":true}}"
                            : "{\"prompt\":[104,105],\"stream\":true,\"max_tokens\":6}";
    CHECK(http_do(port, "POST", chat ? "/v1/chat/completions" : "/v1/completions", body, &r));
    CHECK(r.status == 200 && strstr(r.headers, "text/event-stream"), "%d %s", r.status, r.headers);
    char *ev[64];
    int n = sse_events(r.body, ev, 64);
    CHECK(n >= 3 && !strcmp(ev[n - 1], "[DONE]"), "%d events", n);
    char text[512] = "";
    int finishes = 0, usages = 0, roles = 0;
    for (int i = 0; i + 1 < n; i++) {
        json_t *j = json_loads(ev[i], 0, NULL);
        CHECK(j != NULL, "event %d is JSON: %s", i, ev[i]);
        CHECK(!strcmp(json_string_value(json_object_get(j, "object")),
                      chat ? "chat.completion.chunk" : "text_completion"));
        json_t *c = json_array_get(json_object_get(j, "choices"), 0);
        json_t *piece = chat ? json_object_get(json_object_get(c, "delta"), "content")
                             : json_object_get(c, "text");
        if (json_is_string(piece))
            strncat(text, json_string_value(piece), sizeof(text) - strlen(text) - 1);
        if (chat && json_object_get(json_object_get(c, "delta"), "role"))
            roles++;
        if (json_is_string(json_object_get(c, "finish_reason"))) {
            finishes++;
            CHECK(!strcmp(json_string_value(json_object_get(c, "finish_reason")), "length"));
        }
        json_t *u = json_object_get(j, "usage");
        if (u) {
            usages++;
            CHECK(json_integer_value(json_object_get(u, "completion_tokens")) == 6);
            CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == (chat ? 8 : 2));
        }
        json_decref(j);
    }
    char want[256];
    fake_text(6, want, sizeof(want));
    CHECK(!strcmp(text, want), "streamed '%s'", text);
    CHECK(finishes == 1 && roles == (chat ? 1 : 0));
    CHECK(usages == (chat ? 2 : 1), "usage in the last chunk, and its own chunk when asked");
    http_reply_free(&r);
}

static bool wait_for(atomic_int *counter, int value)
{
    for (int i = 0; i < 300 && atomic_load(counter) < value; i++)
        fake_sleep_ms(10);
    return atomic_load(counter) >= value;
}

static void test_disconnect(void)
{
    int before = atomic_load(&fake.cancelled);
    /* streamed: read the first event, then hang up */
    const char *sbody = "{\"messages\":[{\"role\":\"user\",\"content\":\"SLOW\"}],\"stream\":true}";
    int fd = http_send(port, "POST", "/v1/chat/completions", sbody, strlen(sbody));
    CHECK(fd >= 0);
    char buf[4096];
    ssize_t k = recv(fd, buf, sizeof(buf) - 1, 0);
    CHECK(k > 0);
    close(fd);
    CHECK(wait_for(&fake.cancelled, before + 1), "a dropped stream cancels its generation");
    /* whole: hang up before anything comes */
    const char *wbody = "{\"prompt\":\"SLOW\"}";
    fd = http_send(port, "POST", "/v1/completions", wbody, strlen(wbody));
    CHECK(fd >= 0);
    fake_sleep_ms(50);
    close(fd);
    CHECK(wait_for(&fake.cancelled, before + 2), "a dropped request cancels its generation");
    CHECK(healthy());
}

static void test_failure(void)
{
    struct http_reply r;
    http_do(port, "POST", "/v1/chat/completions",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"FAIL\"}],\"stream\":true}", &r);
    CHECK(r.status == 200);
    char *ev[64];
    int n = sse_events(r.body, ev, 64);
    CHECK(n >= 2 && !strcmp(ev[n - 1], "[DONE]"));
    CHECK(n >= 2 && strstr(ev[n - 2], "\"error\"") && strstr(ev[n - 2], "on purpose"),
          "an error event before [DONE]");
    http_reply_free(&r);
    expect_error("POST", "/v1/completions", "{\"prompt\":\"FAIL\"}", 500, NULL, NULL);
}

static void test_tokenize(void)
{
    struct http_reply r;
    http_do(port, "POST", "/tokenize", "{\"content\":\"AB\",\"with_pieces\":true}", &r);
    CHECK(r.status == 200 && strstr(r.body, "{\"id\":65,\"piece\":\"A\"}"), "%s", r.body);
    http_reply_free(&r);
    http_do(port, "POST", "/tokenize", "{\"content\":\"AB\"}", &r);
    CHECK(r.status == 200 && strstr(r.body, "[65,66]"), "%s", r.body);
    http_reply_free(&r);
    http_do(port, "POST", "/detokenize", "{\"tokens\":[104,105]}", &r);
    CHECK(r.status == 200 && strstr(r.body, "\"hi\""), "%s", r.body);
    http_reply_free(&r);
    /* a byte that is not UTF-8 comes back as U+FFFD, so the JSON stays valid */
    http_do(port, "POST", "/detokenize", "{\"tokens\":[104,255]}", &r);
    json_t *j = parse(&r);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "content")), "h\xEF\xBF\xBD"));
    json_decref(j);
    http_reply_free(&r);
}

static void test_train(void)
{
    struct http_reply r;
    /* no job yet */
    http_do(port, "GET", "/train", NULL, &r);
    CHECK(r.status == 200 && strstr(r.body, "\"idle\""), "%s", r.body);
    http_reply_free(&r);
    expect_error("POST", "/train", "{\"out\":\"a.gguf\"}", 400, "text", "invalid_value");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"examples\":\"y\"}", 400,
                 "examples", "invalid_value");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"rank\":0}", 400, "rank",
                 "out_of_range");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"epochs\":101}", 400,
                 "epochs", "out_of_range");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"lr\":2}", 400, "lr",
                 "out_of_range");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"fit\":\"squeeze\"}", 400,
                 "fit", "invalid_value");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"checkpoint\":\"some\"}",
                 400, "checkpoint", "invalid_value");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"checkpoint\":1}", 400,
                 "checkpoint", "invalid_type");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"top_layers\":5}", 400,
                 "top_layers", "out_of_range");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"targets\":\"attn_zz\"}",
                 400, "targets", "invalid_value");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"examples\":[1]}", 400, "examples[0]",
                 "invalid_type");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"full\":true}", 400,
                 "full", "unknown_field");
    expect_error("POST", "/train", "{\"out\":\"a.gguf\",\"text\":\"x\",\"device_only\":1}", 400,
                 "device_only", "invalid_type");
    CHECK(fake.train_starts == 0);

    http_do(port, "POST", "/train",
            "{\"out\":\"fact.gguf\",\"examples\":[{\"prompt\":\"a\",\"completion\":\"b\"},"
            "{\"prompt\":\"c\",\"completion\":\"d\"}],\"rank\":4,\"alpha\":8,\"epochs\":3,"
            "\"lr\":0.002,\"window\":64,\"targets\":[\"attn_q\",\"attn_v\"],\"val_split\":0.25,"
            "\"seed\":7,\"top_layers\":2,\"memory_budget_mib\":512,\"fit\":\"left\","
            "\"device_only\":true,\"checkpoint\":\"selective\"}",
            &r);
    CHECK(r.status == 200, "%d %s", r.status, r.body);
    http_reply_free(&r);
    char want_out[512];
    snprintf(want_out, sizeof(want_out), "%s/fact.gguf", train_dir);
    pthread_mutex_lock(&fake.mu);
    struct lt_train_params p = fake.train_p;
    CHECK(fake.train_starts == 1 && !strcmp(fake.train_out, want_out), "%s", fake.train_out);
    CHECK(!strcmp(fake.train_examples, "{\"prompt\":\"a\",\"completion\":\"b\"}\n"
                                       "{\"prompt\":\"c\",\"completion\":\"d\"}\n"),
          "%s", fake.train_examples);
    CHECK(!strcmp(fake.train_targets, "attn_q,attn_v"), "%s", fake.train_targets);
    CHECK(!strcmp(fake.train_meta.out_name, "fact.gguf"));
    pthread_mutex_unlock(&fake.mu);
    CHECK(p.rank == 4 && p.alpha == 8 && p.epochs == 3 && fabsf(p.lr - 0.002f) < 1e-7f);
    CHECK(p.window == 64 && fabsf(p.val_split - 0.25f) < 1e-7f && p.seed == 7);
    CHECK(p.top_layers == 2 && p.memory_budget_mib == 512 && p.fit == LT_FIT_LEFT);
    CHECK(p.device_only && !p.full && !p.text && !p.text_path && !p.examples_path);
    CHECK(p.checkpoint == LT_CHECKPOINT_SELECTIVE, "checkpoint %d", (int)p.checkpoint);

    /* GET /train carries the refusal unchanged */
    http_do(port, "GET", "/train", NULL, &r);
    json_t *j = parse(&r);
    CHECK(!strcmp(json_string_value(json_object_get(j, "state")), "error"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "error")),
                  "refused: SQR 'grad for k_conv-2' on 'k_conv-2'"));
    json_t *ref = json_object_get(j, "refusal");
    CHECK(!strcmp(json_string_value(json_object_get(ref, "op")), "SQR"));
    CHECK(!strcmp(json_string_value(json_object_get(ref, "kind")), "device_only"));
    json_t *ep = json_array_get(json_object_get(j, "epochs"), 0);
    CHECK(fabs(json_real_value(json_object_get(ep, "train_loss")) - 2.5) < 1e-6);
    CHECK(json_is_null(json_object_get(ep, "eval_loss")), "NaN becomes null");
    json_decref(j);
    http_reply_free(&r);

    fake.train_busy = true;
    expect_error("POST", "/train", "{\"out\":\"b.gguf\",\"text\":\"x\"}", 409, NULL, "job_running");
    fake.train_busy = false;

    http_do(port, "POST", "/train/pause", "", &r);
    CHECK(r.status == 200 && fake.last_op == SRV_TRAIN_PAUSE && !fake.last_op_id[0]);
    http_reply_free(&r);
    http_do(port, "POST", "/train/resume", NULL, &r);
    CHECK(r.status == 200 && fake.last_op == SRV_TRAIN_RESUME);
    http_reply_free(&r);
    http_do(port, "POST", "/train/cancel", NULL, &r);
    CHECK(r.status == 200 && fake.last_op == SRV_TRAIN_CANCEL);
    http_reply_free(&r);

    /* without a train dir */
    const char *saved = train_dir;
    test_app.train_dir = NULL;
    expect_error("POST", "/train", "{\"out\":\"c.gguf\",\"text\":\"x\"}", 403, "out", "no_train_dir");
    expect_error("POST", "/train/cancel", NULL, 403, NULL, "training_disabled");
    test_app.train_dir = saved;
}

static void test_fine_tuning(void)
{
    const char *url = "/v1/fine_tuning/jobs";
    expect_error("POST", url, "{}", 400, "training_file", "missing_field");
    expect_error("POST", url, "{\"training_file\":\"../x.jsonl\"}", 400, "training_file",
                 "invalid_name");
    expect_error("POST", url, "{\"training_file\":\"none.jsonl\"}", 400, "training_file",
                 "file_not_found");
    char path[512];
    snprintf(path, sizeof(path), "%s/data.jsonl", train_dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"prompt\":\"a\",\"completion\":\"b\"}\n", f);
        fclose(f);
    }
    expect_error("POST", url, "{\"training_file\":\"data.jsonl\",\"hyperparameters\":"
                 "{\"n_epochs\":\"many\"}}", 400, "hyperparameters.n_epochs", "invalid_value");
    expect_error("POST", url, "{\"training_file\":\"data.jsonl\",\"model\":\"gpt-4\"}", 400,
                 "model", "model_not_found");
    expect_error("POST", url, "{\"training_file\":\"data.jsonl\",\"suffix\":\"a/b\"}", 400,
                 "suffix", "invalid_value");
    struct http_reply r;
    http_do(port, "POST", url,
            "{\"model\":\"fake-model\",\"training_file\":\"data.jsonl\",\"hyperparameters\":"
            "{\"n_epochs\":2,\"batch_size\":\"auto\",\"learning_rate_multiplier\":2},"
            "\"suffix\":\"zz\",\"seed\":3}",
            &r);
    CHECK(r.status == 200, "%d %s", r.status, r.body);
    json_t *j = parse(&r);
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "fine_tuning.job"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "status")), "failed"));
    CHECK(json_is_object(json_object_get(j, "error")));
    const char *id = json_string_value(json_object_get(j, "id"));
    char idbuf[64];
    snprintf(idbuf, sizeof(idbuf), "%s", id ? id : "");
    json_decref(j);
    http_reply_free(&r);
    pthread_mutex_lock(&fake.mu);
    CHECK(fake.train_p.epochs == 2 && fabsf(fake.train_p.lr - 2e-3f) < 1e-8f);
    CHECK(fake.train_p.seed == 3 && !strcmp(fake.train_examples_path, path));
    CHECK(!strncmp(fake.train_meta.out_name, "zz-", 3) && fake.train_meta.openai_shape);
    pthread_mutex_unlock(&fake.mu);

    char u[256];
    snprintf(u, sizeof(u), "%s/%s", url, idbuf);
    http_do(port, "GET", u, NULL, &r);
    CHECK(r.status == 200 && !strcmp(fake.last_info_id, idbuf), "%s", fake.last_info_id);
    http_reply_free(&r);
    snprintf(u, sizeof(u), "%s/%s/events", url, idbuf);
    http_do(port, "GET", u, NULL, &r);
    j = parse(&r);
    json_t *d = json_object_get(j, "data");
    CHECK(json_array_size(d) == 2 &&
          !strcmp(json_string_value(json_object_get(json_array_get(d, 0), "message")), "second"),
          "events newest first");
    json_decref(j);
    http_reply_free(&r);
    snprintf(u, sizeof(u), "%s/%s/cancel", url, idbuf);
    http_do(port, "POST", u, NULL, &r);
    CHECK(r.status == 200 && fake.last_op == SRV_TRAIN_CANCEL && !strcmp(fake.last_op_id, idbuf));
    http_reply_free(&r);
    expect_error("GET", "/v1/fine_tuning/jobs/ftjob-other", NULL, 404, NULL, "not_found");
    http_do(port, "GET", url, NULL, &r);
    CHECK(r.status == 200 && strstr(r.body, idbuf));
    http_reply_free(&r);
}

static void test_lora(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ad.gguf", train_dir);
    FILE *f = fopen(path, "w");
    if (f)
        fclose(f);
    struct http_reply r;
    http_do(port, "POST", "/lora-adapters/load", "{\"name\":\"ad.gguf\",\"scale\":0.5}", &r);
    CHECK(r.status == 200 && fake.lora_loads == 1 && !strcmp(fake.lora_path, path), "%s",
          r.body);
    CHECK(fake.lora_scale == 0.5f);
    http_reply_free(&r);
    http_do(port, "GET", "/lora-adapters", NULL, &r);
    CHECK(r.status == 200 && strstr(r.body, "\"name\":\"ad.gguf\""), "%s", r.body);
    http_reply_free(&r);
    http_do(port, "POST", "/lora-adapters", "[{\"id\":7,\"scale\":0.25}]", &r);
    CHECK(r.status == 200 && fake.lora_scale == 0.25f, "%s", r.body);
    http_reply_free(&r);
    expect_error("POST", "/lora-adapters", "{\"adapters\":[{\"id\":7}]}", 400,
                 "adapters[0].scale", "missing_field");
    expect_error("POST", "/lora-adapters/unload", "{\"name\":\"other.gguf\"}", 404, "name",
                 "lora_not_loaded");
    http_do(port, "POST", "/lora-adapters/unload", "{\"id\":7}", &r);
    CHECK(r.status == 200 && fake.lora_unloads == 1, "%s", r.body);
    http_reply_free(&r);

    /* the per-request choice reaches the engine */
    http_do(port, "POST", "/v1/completions",
            "{\"prompt\":\"x\",\"lora\":[{\"name\":\"ad.gguf\",\"scale\":0.75},{\"id\":3}]}", &r);
    CHECK(r.status == 200);
    http_reply_free(&r);
    pthread_mutex_lock(&fake.mu);
    struct srv_gen_params p = fake.last_gen;
    pthread_mutex_unlock(&fake.mu);
    CHECK(p.lora_given && p.n_loras == 2 && !strcmp(p.loras[0].name, "ad.gguf"));
    CHECK(p.loras[0].scale == 0.75f && p.loras[1].id == 3 && p.loras[1].scale == 1.0f);
}

static void test_metrics(void)
{
    struct http_reply r;
    http_do(port, "GET", "/metrics", NULL, &r);
    CHECK(r.status == 200 && strstr(r.headers, "text/plain"));
    CHECK(strstr(r.body, "fake_metric 1\n") != NULL);
    unsigned long long n4 = 0;
    const char *p = strstr(r.body, "lathe_http_requests_total{class=\"4xx\"} ");
    CHECK(p && sscanf(p + strlen("lathe_http_requests_total{class=\"4xx\"} "), "%llu", &n4) == 1);
    CHECK(n4 > 50, "%llu 4xx answers counted", n4);
    /* every line is a comment or "name[{labels}] value" */
    int bad = 0;
    for (char *line = strtok(r.body, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        char name[256];
        double v;
        if (sscanf(line, "%255s %lf", name, &v) != 2)
            bad++;
    }
    CHECK(bad == 0, "%d malformed metric lines", bad);
    http_reply_free(&r);
}

struct par {
    int ok;
};

static void *one_request(void *arg)
{
    struct par *p = arg;
    struct http_reply r;
    if (http_do(port, "POST", "/v1/chat/completions",
                "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}", &r))
        p->ok = r.status == 200 && strstr(r.body, "w0 w1 w2") != NULL;
    http_reply_free(&r);
    return NULL;
}

static void test_parallel(void)
{
    enum { N = 16 };
    pthread_t t[N];
    struct par p[N] = {{0}};
    for (int i = 0; i < N; i++)
        pthread_create(&t[i], NULL, one_request, &p[i]);
    int ok = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        ok += p[i].ok;
    }
    CHECK(ok == N, "%d of %d concurrent requests answered", ok, N);
}

int main(void)
{
    snprintf(train_dir, sizeof(train_dir), "/tmp/lathe_test_server_XXXXXX");
    if (!mkdtemp(train_dir)) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    pthread_mutex_init(&fake.mu, NULL);
    atomic_init(&fake.state, SRV_STATE_READY);
    struct srv_engine engine = {.iface = &fake_iface};
    test_app.engine = &engine;
    test_app.train_dir = train_dir;
    test_app.max_body_bytes = 64 * 1024;
    test_app.quiet = true;
    pthread_mutex_init(&test_app.stats_mu, NULL);
    struct srv_http *http = NULL;
    lt_status st = srv_http_start(&test_app, "127.0.0.1", 0, 64, &http);
    if (st == LT_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", lt_last_error());
        return 77;
    }
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st != LT_OK)
        return check_summary();
    port = srv_http_port(http);
    CHECK(port > 0);

    test_health();
    test_routing();
    test_bad_bodies();
    test_paths();
    test_chat_whole();
    test_model_ids();
    test_stream(true);
    test_stream(false);
    test_tokenize();
    test_disconnect();
    test_failure();
    test_train();
    test_fine_tuning();
    test_lora();
    test_parallel();
    test_metrics();
    CHECK(healthy(), "healthy at the end");

    for (int i = 0; i < 300 && atomic_load(&fake.running) > 0; i++)
        fake_sleep_ms(10);
    CHECK(atomic_load(&fake.running) == 0, "every generation ended");
    srv_http_stop(http);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", train_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", train_dir);
    return check_summary();
}
#endif
