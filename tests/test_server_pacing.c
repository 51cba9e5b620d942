/* test_server_pacing.c: how a training job shares the device with serving.
 *   - The yield after a window, by hand: the bound y = d (r0 (1 - T) - r_w) / (r0 T), the
 *     worst case d (1 - T) / T before any measurement, never negative; the share
 *     y = d (1e6 - share) / share; the 95th percentile of window lengths.
 *   - Through the real engine (lt_server_start on the tiny random model of test_train_tiny.h,
 *     CPU, real HTTP): max_slowdown_ppm, share_ppm and yield are accepted on /train and in
 *     /v1/fine_tuning/jobs' hyperparameters, refused (400 naming the field) out of range, of
 *     the wrong type, or the first two together;
 *   - under continuous chat traffic, with --train-yield-ms at 10 minutes, a plain-yield job
 *     stalls after its first window (waiting_for_serving), while a job with max_slowdown_ppm
 *     keeps taking windows while serving is busy and measures serving's rate with and
 *     without a window;
 *   - GET /train's "pacing", the fine-tuning job's "lathe_pacing" and /metrics carry the
 *     contract's numbers;
 *   - the wire shape of CambrianTech's llama.cpp /train: "ok" on every /train reply (false
 *     on errors, whose sentence is under "error", with its param beside it), pause and resume take
 * {"out": NAME} and refuse a name that is not the running job's, parse_special true is accepted and
 * false refused naming the field. */
#include "check.h"

#include "server/server_impl.h"

static void test_formulas(void)
{
    /* the bound: d = 100 ms, T = 10%: no measurement -> 100 * 0.9 / 0.1 = 900 */
    CHECK(fabs(srv_pace_yield_bound(100, 0, -1, 100000) - 900) < 1e-9, "worst case %g",
          srv_pace_yield_bound(100, 0, -1, 100000));
    CHECK(fabs(srv_pace_yield_bound(100, 2.0, -1, 100000) - 900) < 1e-9,
          "no rate with a window yet: the worst case");
    /* r0 = 2, r_w = 1 (serving at half speed in the window), T = 10%:
     * y = 100 * (2 * 0.9 - 1) / (2 * 0.1) = 100 * 0.8 / 0.2 = 400; check the average */
    double y = srv_pace_yield_bound(100, 2.0, 1.0, 100000);
    CHECK(fabs(y - 400) < 1e-9, "bound %g", y);
    CHECK(fabs((1.0 * 100 + 2.0 * y) / (100 + y) - 0.9 * 2.0) < 1e-9,
          "the average rate over window and yield is exactly (1 - T) r0");
    /* a window that slows serving less than T needs no yield */
    CHECK(srv_pace_yield_bound(100, 2.0, 1.9, 100000) == 0, "r_w above (1 - T) r0: no yield");
    CHECK(srv_pace_yield_bound(100, 2.0, 2.5, 100000) == 0, "never negative");
    /* T = 50%, serving stopped in the window: y = d */
    CHECK(fabs(srv_pace_yield_bound(30, 3.0, 0.0, 500000) - 30) < 1e-9, "T 50%%, r_w 0");
    CHECK(fabs(srv_pace_yield_bound(10, 0, -1, 1) - 10 * 999999.0) < 1e-3, "T 1 ppm");
    CHECK(srv_pace_yield_bound(0, 2, 1, 100000) == 0, "no window, no yield");
    /* the share: 25% -> 3 d; 100% -> 0; 1 ppm -> 999999 d; 0 takes the default 25% */
    CHECK(fabs(srv_pace_yield_share(100, 250000) - 300) < 1e-9, "share 25%%");
    CHECK(srv_pace_yield_share(100, 1000000) == 0, "share 100%%");
    CHECK(fabs(srv_pace_yield_share(2, 1) - 2 * 999999.0) < 1e-6, "share 1 ppm");
    CHECK(fabs(srv_pace_yield_share(100, 0) - 300) < 1e-9, "the default share");
    double v[20];
    for (int i = 0; i < 20; i++)
        v[i] = 20 - i; /* 20..1 */
    CHECK(srv_pace_percentile(v, 20, 95) == 19, "p95 of 1..20 by nearest rank: %g",
          srv_pace_percentile(v, 20, 95));
    CHECK(srv_pace_percentile(v, 20, 50) == 10, "p50 of 1..20: %g", srv_pace_percentile(v, 20, 50));
    CHECK(srv_pace_percentile(v, 1, 95) == 20 && srv_pace_percentile(v, 0, 95) == 0,
          "p95 of one and of none");
}

#if !defined(LATHE_HAVE_JANSSON) || !defined(LATHE_HAVE_MHD)
int main(void)
{
    test_formulas();
    printf("server part skipped: the server needs jansson and libmicrohttpd\n");
    return check_summary();
}
#else
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "http_client.h"
#include "server_harness.h"
#include "lathe/server.h"
#include "test_train_tiny.h"

static int port;
static char text_field[8192]; /* "text":"...", a long plain text */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static json_t *get_json(const char *path)
{
    struct http_reply r;
    json_t *j = NULL;
    if (http_do(port, "GET", path, NULL, &r) && r.status == 200)
        j = json_loads(r.body, 0, NULL);
    http_reply_free(&r);
    return j;
}

/* POSTs body; the status, and the error's param into param (when there is one). Reads
 * OpenAI's error object, and /train's shape (the sentence under "error", param beside it). */
static int post(const char *path, const char *body, char *param, size_t size, char *msg,
                size_t msg_size)
{
    struct http_reply r;
    int st = http_do(port, "POST", path, body, &r) ? r.status : -1;
    json_t *j = r.body ? json_loads(r.body, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    if (json_is_string(e)) {
        json_object_set(j, "message", e);
        e = j;
    }
    if (param)
        snprintf(param, size, "%s",
                 json_string_value(json_object_get(e, "param"))
                     ? json_string_value(json_object_get(e, "param"))
                     : "");
    if (msg)
        snprintf(msg, msg_size, "%s",
                 json_string_value(json_object_get(e, "message"))
                     ? json_string_value(json_object_get(e, "message"))
                     : "");
    json_decref(j);
    http_reply_free(&r);
    return st;
}

static void test_fields_checked(void)
{
    static const struct {
        const char *extra; /* added to a /train body with a valid text */
        const char *param; /* NULL: accepted */
    } cases[] = {
        {"\"max_slowdown_ppm\":0", "max_slowdown_ppm"},
        {"\"max_slowdown_ppm\":1000000", "max_slowdown_ppm"},
        {"\"max_slowdown_ppm\":\"5%\"", "max_slowdown_ppm"},
        {"\"max_slowdown_ppm\":1.5", "max_slowdown_ppm"},
        {"\"share_ppm\":0", "share_ppm"},
        {"\"share_ppm\":1000001", "share_ppm"},
        {"\"yield\":\"yes\"", "yield"},
        {"\"chunk\":300", "chunk"}, /* the fork's: a multiple of 256, at least 256 */
        {"\"chunk\":128", "chunk"},
        {"\"max_slowdown_ppm\":100000,\"share_ppm\":500000", "share_ppm"},
    };
    char body[9000], param[64], msg[512];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(body, sizeof(body), "{\"out\":\"bad.gguf\",\"window\":16,%s,%s}", text_field,
                 cases[i].extra);
        int st = post("/train", body, param, sizeof(param), msg, sizeof(msg));
        CHECK(st == 400 && !strcmp(param, cases[i].param), "%s: %d, param '%s' (%s)",
              cases[i].extra, st, param, msg);
        if (i + 1 == sizeof(cases) / sizeof(cases[0]))
            CHECK(strstr(msg, "together") != NULL, "the message says why: %s", msg);
    }
    /* the fine-tuning shape: in hyperparameters */
    int st = post("/v1/fine_tuning/jobs",
                  "{\"training_file\":\"data.jsonl\",\"hyperparameters\":{\"max_slowdown_ppm\":"
                  "5000,\"share_ppm\":10}}",
                  param, sizeof(param), msg, sizeof(msg));
    CHECK(st == 400 && !strcmp(param, "hyperparameters.share_ppm"), "ft both: %d '%s' (%s)", st,
          param, msg);
    st = post("/v1/fine_tuning/jobs",
              "{\"training_file\":\"data.jsonl\",\"hyperparameters\":{\"max_slowdown_ppm\":0}}",
              param, sizeof(param), msg, sizeof(msg));
    CHECK(st == 400 && !strcmp(param, "hyperparameters.max_slowdown_ppm"), "ft 0: %d '%s'", st,
          param);
}

/* Chat completions back to back, as a busy server sees them. */
static atomic_bool traffic_stop;
static atomic_int traffic_done;

static void *traffic_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&traffic_stop)) {
        struct http_reply r;
        if (http_do(port, "POST", "/v1/chat/completions",
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"tell me a story\"}],"
                    "\"max_tokens\":48,\"temperature\":0}",
                    &r) &&
            r.status == 200)
            atomic_fetch_add(&traffic_done, 1);
        http_reply_free(&r);
    }
    return NULL;
}

static json_t *pacing_of(json_t *job)
{
    return json_object_get(job, "pacing");
}

static int job_step(json_t *j)
{
    return (int)json_integer_value(json_object_get(json_object_get(j, "progress"), "step"));
}

static void cancel_job(void)
{
    struct http_reply r;
    http_do(port, "POST", "/train/cancel", "{}", &r);
    http_reply_free(&r);
    for (int i = 0; i < 200; i++) {
        json_t *j = get_json("/train");
        const char *s = json_string_value(json_object_get(j, "state"));
        bool over = s && strcmp(s, "running") && strcmp(s, "starting") && strcmp(s, "paused");
        json_decref(j);
        if (over)
            return;
        sleep_ms(20);
    }
}

static void test_pacing_under_traffic(void)
{
    pthread_t th;
    atomic_store(&traffic_stop, false);
    CHECK(pthread_create(&th, NULL, traffic_main, NULL) == 0);
    sleep_ms(300);
    char body[9000], msg[512];
    const double watch_s = 3.0;

    /* plain yield: the first window, then a wait capped at 10 minutes */
    snprintf(body, sizeof(body), "{\"out\":\"y.gguf\",\"window\":16,\"epochs\":3,%s}", text_field);
    int st = post("/train", body, NULL, 0, msg, sizeof(msg));
    CHECK(st == 200, "plain-yield job: %d %s", st, msg);
    double t0 = now_s();
    while (now_s() - t0 < watch_s)
        sleep_ms(100);
    json_t *j = get_json("/train");
    int yield_steps = job_step(j);
    json_t *pc = pacing_of(j);
    CHECK(!strcmp(json_string_value(json_object_get(j, "state")), "running"), "still running");
    CHECK(yield_steps <= 1, "plain yield under traffic stalls: %d steps in %.0f s", yield_steps,
          watch_s);
    CHECK(json_is_true(json_object_get(pc, "waiting_for_serving")), "it says it is waiting");
    CHECK(!strcmp(json_string_value(json_object_get(pc, "mode")), "yield"), "mode yield");
    json_decref(j);
    cancel_job();

    /* the bound: windows go on while serving is busy */
    snprintf(body, sizeof(body),
             "{\"out\":\"b.gguf\",\"window\":16,\"epochs\":3,\"max_slowdown_ppm\":500000,%s}",
             text_field);
    st = post("/train", body, NULL, 0, msg, sizeof(msg));
    CHECK(st == 200, "bounded job: %d %s", st, msg);
    t0 = now_s();
    int served0 = atomic_load(&traffic_done);
    while (now_s() - t0 < watch_s)
        sleep_ms(100);
    int served = atomic_load(&traffic_done) - served0;
    j = get_json("/train");
    int bound_steps = job_step(j);
    const char *state = json_string_value(json_object_get(j, "state"));
    pc = pacing_of(j);
    printf("under traffic for %.0f s: plain yield %d step(s), max_slowdown_ppm 500000 %d steps "
           "(%s), %d chat requests meanwhile\n",
           watch_s, yield_steps, bound_steps, state, served);
    char *dump = json_dumps(pc, JSON_COMPACT);
    printf("pacing: %s\n", dump ? dump : "");
    free(dump);
    CHECK(bound_steps >= 3 || !strcmp(state, "done"), "the bounded job progresses: %d steps",
          bound_steps);
    CHECK(served > 5, "serving went on: %d requests", served);
    CHECK(json_integer_value(json_object_get(pc, "max_slowdown_ppm")) == 500000, "the bound");
    CHECK(!strcmp(json_string_value(json_object_get(pc, "mode")), "max_slowdown"), "mode");
    CHECK(json_integer_value(json_object_get(pc, "windows")) >= 3, "windows counted");
    CHECK(json_integer_value(json_object_get(pc, "windows_busy")) >= 1,
          "windows taken while serving was busy");
    json_t *wm = json_object_get(pc, "window_ms");
    CHECK(json_real_value(json_object_get(wm, "max")) >=
                  json_real_value(json_object_get(wm, "p95")) &&
              json_real_value(json_object_get(wm, "p95")) > 0,
          "window ms p95 <= max");
    json_t *rates = json_object_get(pc, "serving_tokens_per_ms");
    CHECK(json_is_real(json_object_get(rates, "without_window")) &&
              json_is_real(json_object_get(rates, "with_window")),
          "serving's rate measured with and without a window");
    CHECK(json_is_object(json_object_get(json_object_get(pc, "slowdown"), "percent_histogram")),
          "the slowdown histogram");
    CHECK(json_integer_value(json_object_get(pc, "examples")) > 10 &&
              json_integer_value(json_object_get(pc, "window_asked")) == 16 &&
              json_integer_value(json_object_get(pc, "examples_truncated")) == 0,
          "examples and window");
    CHECK(json_array_size(json_object_get(pc, "epochs")) >= 1, "per-epoch times");
    json_decref(j);

    struct http_reply r;
    CHECK(http_do(port, "GET", "/metrics", NULL, &r) && r.status == 200);
    static const char *const names[] = {"lathe_train_max_slowdown_ppm 500000",
                                        "lathe_train_windows ",
                                        "lathe_train_windows_busy ",
                                        "lathe_train_window_ms{stat=\"p50\"} ",
                                        "lathe_train_window_ms{stat=\"p95\"} ",
                                        "lathe_train_yielded_ms ",
                                        "lathe_train_serving_tokens_per_ms{window=\"no\"} ",
                                        "lathe_train_serving_tokens_per_ms{window=\"yes\"} ",
                                        "lathe_train_slowdown_max_ppm ",
                                        "lathe_train_waiting_for_serving ",
                                        "lathe_train_examples ",
                                        "lathe_train_window_asked 16",
                                        "lathe_train_epoch_seconds{epoch=\"1\"} "};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        CHECK(r.body && strstr(r.body, names[i]), "/metrics has '%s'", names[i]);
    http_reply_free(&r);
    cancel_job();
    atomic_store(&traffic_stop, true);
    pthread_join(th, NULL);

    /* the fine-tuning shape takes the fields in hyperparameters and reports them */
    st = post("/v1/fine_tuning/jobs",
              "{\"training_file\":\"data.jsonl\",\"hyperparameters\":{\"share_ppm\":500000,"
              "\"yield\":false}}",
              NULL, 0, msg, sizeof(msg));
    CHECK(st == 200, "ft job with a share: %d %s", st, msg);
    j = get_json("/v1/fine_tuning/jobs");
    json_t *job = json_array_get(json_object_get(j, "data"), 0);
    pc = json_object_get(job, "lathe_pacing");
    CHECK(json_integer_value(json_object_get(pc, "share_ppm")) == 500000 &&
              json_is_false(json_object_get(pc, "yield")) &&
              !strcmp(json_string_value(json_object_get(pc, "mode")), "share"),
          "the job object reports its pacing");
    json_decref(j);
    cancel_job();
}

/* POSTs body to path; the status, with the reply's "ok" into *ok (-1: absent or not a bool)
 * and the error's param ("" also when the error's sentence is not a string under "error"). */
static int post_ok(const char *path, const char *body, int *ok, char *param, size_t size)
{
    struct http_reply r;
    int st = http_do(port, "POST", path, body, &r) ? r.status : -1;
    json_t *j = r.body ? json_loads(r.body, 0, NULL) : NULL;
    json_t *o = json_object_get(j, "ok");
    *ok = json_is_boolean(o) ? json_is_true(o) : -1;
    const char *p = json_string_value(json_object_get(j, "param"));
    const char *e = json_string_value(json_object_get(j, "error"));
    snprintf(param, size, "%s", p && e && *e ? p : "");
    json_decref(j);
    http_reply_free(&r);
    return st;
}

/* The wire shape of CambrianTech's llama.cpp /train: "ok" on every reply, pause and resume
 * naming the job by its output, parse_special. */
static void test_wire_compat(void)
{
    json_t *j = get_json("/train");
    CHECK(json_is_true(json_object_get(j, "ok")), "GET /train says ok");
    int ok;
    char param[64], body[9000];
    int st = post_ok("/train", "{\"out\":\"x.gguf\",\"window\":1}", &ok, param, sizeof(param));
    CHECK(st == 400 && ok == 0 && !strcmp(param, "window"), "an error: %d ok %d '%s'", st, ok,
          param);
    snprintf(body, sizeof(body), "{\"out\":\"w.gguf\",\"parse_special\":false,%s}", text_field);
    st = post_ok("/train", body, &ok, param, sizeof(param));
    CHECK(st == 400 && ok == 0 && !strcmp(param, "parse_special"), "parse_special false: %d", st);
    st = post_ok("/train/pause", "{\"out\":\"w.gguf\"}", &ok, param, sizeof(param));
    CHECK(st == 409 && ok == 0 && !strcmp(param, "out"), "pause with no job running: %d", st);
    snprintf(body, sizeof(body),
             "{\"out\":\"w.gguf\",\"window\":16,\"epochs\":100,\"parse_special\":true,"
             "\"chunk\":512,%s}",
             text_field);
    struct http_reply rp;
    st = http_do(port, "POST", "/train", body, &rp) ? rp.status : -1;
    json_t *started = rp.body ? json_loads(rp.body, 0, NULL) : NULL;
    json_t *status = json_object_get(started, "status");
    CHECK(st == 200 && json_is_true(json_object_get(started, "ok")) && json_is_object(status) &&
              json_is_string(json_object_get(status, "state")) &&
              json_integer_value(json_object_get(status, "window_asked")) == 16,
          "parse_special true: %d, and the start's reply carries its status: %s", st,
          rp.body ? rp.body : "");
    json_decref(started);
    http_reply_free(&rp);
    st = post_ok("/train/pause", "{\"out\":\"other.gguf\"}", &ok, param, sizeof(param));
    CHECK(st == 409 && ok == 0 && !strcmp(param, "out"), "another name is refused: %d '%s'", st,
          param);
    st = post_ok("/train/pause", "{\"out\":\"w\"}", &ok, param, sizeof(param));
    CHECK(st == 200 && ok == 1, "pause by name (without .gguf): %d", st);
    const char *state = "";
    for (int i = 0; i < 100; i++) {
        json_decref(j);
        j = get_json("/train");
        state = json_string_value(json_object_get(j, "state"));
        if (state && !strcmp(state, "paused"))
            break;
        sleep_ms(20);
    }
    CHECK(state && !strcmp(state, "paused"), "paused: %s", state ? state : "?");
    /* the fork's status fields, top level */
    CHECK(json_is_true(json_object_get(j, "paused")) &&
              json_is_true(json_object_get(j, "pause_requested")) &&
              json_is_integer(json_object_get(j, "windows")) &&
              json_is_integer(json_object_get(j, "windows_while_busy")) &&
              json_is_number(json_object_get(j, "window_ms_p50")) &&
              json_is_number(json_object_get(j, "yielded_ms")) &&
              json_integer_value(json_object_get(j, "share_ppm")) == 250000 &&
              json_integer_value(json_object_get(j, "examples_skipped")) == 0 &&
              json_is_integer(json_object_get(j, "examples")) &&
              json_integer_value(json_object_get(j, "layers_adapted")) ==
                  json_integer_value(json_object_get(j, "n_layer")) &&
              json_integer_value(json_object_get(j, "n_layer")) == 2,
          "the fork's status fields while paused");
    json_decref(j);
    st = post_ok("/train/resume", "{\"out\":\"other\"}", &ok, param, sizeof(param));
    CHECK(st == 409 && ok == 0, "resume another name: %d", st);
    st = post_ok("/train/resume", "{\"out\":\"w.gguf\"}", &ok, param, sizeof(param));
    CHECK(st == 200 && ok == 1, "resume by name: %d", st);
    j = get_json("/train");
    CHECK(json_is_false(json_object_get(j, "pause_requested")), "resumed: no pause asked");
    json_decref(j);
    st = post_ok("/train/cancel", "", &ok, param, sizeof(param));
    CHECK(st == 200 && ok == 1, "cancel with no body: %d", st);
    cancel_job();
}

int main(void)
{
    test_formulas();
    char dir[400], model_path[600], train_dir[600];
    tiny_path(dir, sizeof(dir), "");
    dir[strlen(dir) - 1] = 0; /* drop the trailing '/' */
    snprintf(model_path, sizeof(model_path), "%s/test_server_pacing.gguf", dir);
    snprintf(train_dir, sizeof(train_dir), "/tmp/lathe_test_server_pacing_XXXXXX");
    struct tiny_spec sp = {32, 4, 2, 64, 2, LT_TYPE_F32, 11};
    if (tiny_model_write(model_path, &sp) != 0 || !mkdtemp(train_dir))
        return 1;
    int w = snprintf(text_field, sizeof(text_field), "\"text\":\"");
    for (int i = 0; i < 40; i++)
        w += snprintf(text_field + w, sizeof(text_field) - (size_t)w,
                      "the quick brown fox jumps over the lazy dog. ");
    snprintf(text_field + w, sizeof(text_field) - (size_t)w, "\"");
    char path[800];
    snprintf(path, sizeof(path), "%s/data.jsonl", train_dir);
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < 64; i++)
        fprintf(f, "{\"prompt\":\"what is %d plus one?\",\"completion\":\"%d.\"}\n", i, i + 1);
    if (f)
        fclose(f);

    struct lt_server_params p = {
        .model_path = model_path,
        .port = 0,
        .parallel = 2,
        .n_threads = 1,
        .train_dir = train_dir,
        .quiet = true,
        .train_yield_ms = 600000,
    };
    struct lt_server *s = NULL;
    lt_status st = harness_start(&p, &s, &port);
    if (st == LT_OK) {
        test_fields_checked();
        test_pacing_under_traffic();
        test_wire_compat();
    }
    harness_stop(s, train_dir, model_path);
    return check_summary();
}
#endif
