/* test_server_metrics.c: /metrics from the real engine (lt_server_start on the tiny random
 * model of test_train_tiny.h, CPU), after a training job has logged steps, is exactly
 * Prometheus text: no NUL or other byte that is not printable text, every line a comment
 * or "name[{labels}] value", the training gauges present, the body ending in a newline.
 * (A metric block formatted into a fixed buffer and appended with its untruncated length
 * once sent stack bytes past the buffer: a NUL, then whatever followed it.) Also the
 * decode counters add up: every accepted request has finished once nothing is busy. */
#include "check.h"

#if !defined(LATHE_HAVE_JANSSON) || !defined(LATHE_HAVE_MHD)
int main(void)
{
    printf("skipped: the server needs jansson and libmicrohttpd\n");
    return 77;
}
#else
#include <jansson.h>
#include <time.h>

#include "http_client.h"
#include "server_harness.h"
#include "lathe/server.h"
#include "test_train_tiny.h"

static int port;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* GET /train's state, into state. */
static bool train_state(char *state, size_t size)
{
    struct http_reply r;
    bool ok = http_do(port, "GET", "/train", NULL, &r) && r.status == 200;
    json_t *j = ok ? json_loads(r.body, 0, NULL) : NULL;
    const char *s = json_string_value(json_object_get(j, "state"));
    snprintf(state, size, "%s", s ? s : "");
    json_decref(j);
    http_reply_free(&r);
    return ok && s;
}

/* The value of the metric line that starts with `name ` in body; NAN when absent. */
static double metric(const char *body, const char *name)
{
    size_t n = strlen(name);
    for (const char *line = body; line && *line;
         line = strchr(line, '\n'), line = line ? line + 1 : NULL)
        if (!strncmp(line, name, n) && line[n] == ' ')
            return strtod(line + n + 1, NULL);
    return NAN;
}

/* Every byte printable or a newline, every line a comment or "name value". */
static void check_prometheus_text(const struct http_reply *r)
{
    size_t bad_bytes = 0;
    for (size_t i = 0; i < r->body_len; i++) {
        unsigned char c = (unsigned char)r->body[i];
        bad_bytes += !(c == '\n' || (c >= 0x20 && c < 0x7f));
    }
    CHECK(bad_bytes == 0, "%zu bytes in /metrics are not text (of %zu)", bad_bytes, r->body_len);
    CHECK(strlen(r->body) == r->body_len, "no NUL inside the body");
    CHECK(r->body_len > 0 && r->body[r->body_len - 1] == '\n', "the body ends with a newline");
    char *copy = strdup(r->body);
    int bad = 0, lines = 0;
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
        lines++;
        if (line[0] == '#')
            continue;
        char name[256], rest[8];
        double v;
        if (sscanf(line, "%255s %lf%7s", name, &v, rest) != 2) {
            bad++;
            fprintf(stderr, "  malformed: %s\n", line);
        }
    }
    free(copy);
    CHECK(bad == 0 && lines > 20, "%d malformed of %d lines", bad, lines);
}

static void test_metrics_after_training(void)
{
    static char body[4096];
    int w =
        snprintf(body, sizeof(body), "{\"out\":\"m.gguf\",\"window\":16,\"epochs\":1,\"text\":\"");
    for (int i = 0; i < 8; i++)
        w += snprintf(body + w, sizeof(body) - (size_t)w,
                      "the quick brown fox jumps over the lazy dog. ");
    snprintf(body + w, sizeof(body) - (size_t)w, "\"}");
    struct http_reply r;
    CHECK(http_do(port, "POST", "/train", body, &r) && r.status == 200, "%d %s", r.status,
          r.body ? r.body : "");
    http_reply_free(&r);
    char state[32] = "";
    for (int i = 0; i < 400 && train_state(state, sizeof(state)); i++) {
        if (strcmp(state, "starting") && strcmp(state, "running"))
            break;
        sleep_ms(50);
    }
    CHECK(!strcmp(state, "done"), "the job ended %s", state);

    CHECK(http_do(port, "GET", "/metrics", NULL, &r) && r.status == 200);
    if (!r.body)
        return;
    check_prometheus_text(&r);
    CHECK(metric(r.body, "lathe_train_step") >= 1, "steps logged");
    CHECK(isfinite(metric(r.body, "lathe_train_yield_seconds_total")), "the last gauge is there");
    CHECK(metric(r.body, "lathe_train_state{state=\"done\"}") == 1);
    http_reply_free(&r);
}

static void test_requests_add_up(void)
{
    struct http_reply r;
    for (int i = 0; i < 3; i++) {
        CHECK(http_do(port, "POST", "/v1/completions",
                      "{\"prompt\":\"the quick\",\"max_tokens\":4}", &r) &&
                  r.status == 200,
              "%d %s", r.status, r.body ? r.body : "");
        http_reply_free(&r);
    }
    CHECK(http_do(port, "GET", "/metrics", NULL, &r) && r.status == 200);
    if (!r.body)
        return;
    check_prometheus_text(&r);
    double finished = 0;
    static const char *const why[] = {"stop", "length", "cancelled", "error"};
    for (int i = 0; i < 4; i++) {
        char name[80];
        snprintf(name, sizeof(name), "lathe_requests_finished_total{reason=\"%s\"}", why[i]);
        finished += metric(r.body, name);
    }
    CHECK(metric(r.body, "lathe_requests_total") == 3 && finished == 3, "%g accepted, %g finished",
          metric(r.body, "lathe_requests_total"), finished);
    http_reply_free(&r);
}

int main(void)
{
    char dir[400], model_path[600], train_dir[600];
    tiny_path(dir, sizeof(dir), "");
    dir[strlen(dir) - 1] = 0; /* drop the trailing '/' */
    snprintf(model_path, sizeof(model_path), "%s/test_server_metrics.gguf", dir);
    snprintf(train_dir, sizeof(train_dir), "/tmp/lathe_test_server_metrics_XXXXXX");
    struct tiny_spec sp = {32, 4, 2, 64, 2, LT_TYPE_F32, 5};
    if (tiny_model_write(model_path, &sp) != 0 || !mkdtemp(train_dir))
        return 1;
    struct lt_server_params p = {
        .model_path = model_path,
        .port = 0,
        .parallel = 2,
        .n_threads = 1,
        .train_dir = train_dir,
        .quiet = true,
        .train_yield_ms = -1,
    };
    struct lt_server *s = NULL;
    lt_status st = harness_start(&p, &s, &port);
    if (st == LT_OK) {
        test_requests_add_up();
        test_metrics_after_training();
    }
    harness_stop(s, train_dir, model_path);
    return check_summary();
}
#endif
