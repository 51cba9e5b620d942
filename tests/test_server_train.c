/* test_server_train.c: training through the real engine (lt_server_start on the tiny random
 * model of test_train_tiny.h, CPU), for what the fake engine of test_server.c cannot show:
 *   - at start, the server removes from --train-dir the temporary files that a killed write
 *     left ("NAME.gguf.tmp-XXXXXX"), and nothing else;
 *   - POST /train with bad data (inline examples that do not parse, are too long for the
 *     window, have nothing to train on; text too short) is answered 400 in OpenAI's error
 *     shape, naming the example by its index (examples[3] in an array, example and line in
 *     JSONL), and no job starts (it used to answer 200 and fail later);
 *   - a job that writes OUT removes OUT's own stale temporaries first. */
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
#include <unistd.h>

#include "http_client.h"
#include "server_harness.h"
#include "lathe/server.h"
#include "test_train_tiny.h"

static int port;
static char train_dir[600];

static const char gguf_head[] = "GGUF\x03\x00\x00\x00 cut off here";

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void put_file(const char *name, const char *content, size_t n)
{
    char path[800];
    snprintf(path, sizeof(path), "%s/%s", train_dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(content, 1, n, f) == n, "write %s", path);
    if (f)
        fclose(f);
}

static bool there(const char *name)
{
    char path[800];
    snprintf(path, sizeof(path), "%s/%s", train_dir, name);
    return access(path, F_OK) == 0;
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

/* Posts body to /train; it must be answered 400 with param == param and a sentence
 * containing each of want[] (NULL-terminated), and no job may start. */
static void check_refused(const char *what, const char *body, const char *param,
                          const char *want_code, const char *const *want)
{
    struct http_reply r;
    CHECK(http_do(port, "POST", "/train", body, &r), "%s: a reply", what);
    json_t *j = r.body ? json_loads(r.body, 0, NULL) : NULL;
    json_t *err = j; /* /train's shape: the sentence under "error", param and code beside it */
    const char *msg = json_string_value(json_object_get(err, "error"));
    const char *got_param = json_string_value(json_object_get(err, "param"));
    const char *type = json_string_value(json_object_get(err, "type"));
    const char *code = json_string_value(json_object_get(err, "code"));
    CHECK(r.status == 400 && msg && type && code && !strcmp(code, want_code), "%s: %d %s", what,
          r.status, r.body ? r.body : "");
    CHECK(got_param && !strcmp(got_param, param), "%s: param %s, want %s", what,
          got_param ? got_param : "(none)", param);
    for (int i = 0; msg && want[i]; i++)
        CHECK(strstr(msg, want[i]), "%s: '%s' in \"%s\"", what, want[i], msg);
    printf("%s: 400 %s: %s\n", what, got_param ? got_param : "", msg ? msg : "");
    json_decref(j);
    http_reply_free(&r);
    char state[32];
    CHECK(train_state(state, sizeof(state)) && !strcmp(state, "idle"),
          "%s: no job started (state %s)", what, state);
}

#define GOOD "{\"prompt\":\"hi\",\"completion\":\"hello\"}"
#define GOOD_IN_STRING "{\\\"prompt\\\":\\\"hi\\\",\\\"completion\\\":\\\"hello\\\"}"

static void test_bad_data(void)
{
    check_refused("array, example 3 empty",
                  "{\"out\":\"a.gguf\",\"window\":64,\"examples\":[" GOOD "," GOOD "," GOOD
                  ",{\"messages\":[]}]}",
                  "examples[3]", "invalid_example",
                  (const char *const[]){"example 3: ", "non-empty array", NULL});
    check_refused("array, example 1 not prompt and completion",
                  "{\"out\":\"a.gguf\",\"window\":64,\"examples\":[" GOOD
                  ",{\"prompt\":\"hi\",\"completion\":7}]}",
                  "examples[1]", "invalid_example",
                  (const char *const[]){"example 1: ", "must both be strings", NULL});
    check_refused("JSONL, example 2 on line 4 broken",
                  "{\"out\":\"a.gguf\",\"window\":64,\"examples\":\"" GOOD_IN_STRING
                  "\\n\\n" GOOD_IN_STRING "\\n{\\\"prompt\\\": \\\"x\\\"\\n\"}",
                  "examples", "invalid_example",
                  (const char *const[]){"example 2 (line 4): ", NULL});
    check_refused("array, example 1 too long for the window",
                  "{\"out\":\"a.gguf\",\"window\":32,\"examples\":[" GOOD
                  ",{\"prompt\":\"hi\",\"completion\":\"a completion far longer than thirty-two "
                  "byte tokens\"}]}",
                  "examples[1]", "invalid_example",
                  (const char *const[]){"example 1: ", "more than the window of 32 holds", NULL});
    check_refused("array, example 0 with nothing to train on",
                  "{\"out\":\"a.gguf\",\"window\":64,\"examples\":[{\"messages\":[{\"role\":"
                  "\"user\",\"content\":\"hi\"}]}," GOOD "]}",
                  "examples[0]", "invalid_example",
                  (const char *const[]){"example 0: ", "nothing to train on", NULL});
    check_refused("text of one token", "{\"out\":\"a.gguf\",\"text\":\"a\"}", "text",
                  "invalid_value", (const char *const[]){"training needs at least 2", NULL});
    CHECK(!there("a.gguf"), "nothing written");
}

/* A job whose OUT has a stale temporary from a killed write: the job removes it. */
static void test_job_clears_its_temps(void)
{
    put_file("good.gguf.tmp-K1lled", gguf_head, sizeof(gguf_head) - 1);
    put_file("other.gguf.tmp-K1lled", gguf_head, sizeof(gguf_head) - 1);
    struct http_reply r;
    CHECK(http_do(port, "POST", "/train",
                  "{\"out\":\"good.gguf\",\"window\":64,\"rank\":2,\"examples\":[" GOOD "," GOOD
                  "]}",
                  &r) &&
              r.status == 200,
          "%d %s", r.status, r.body ? r.body : "");
    http_reply_free(&r);
    char state[32] = "";
    for (int i = 0; i < 600 && train_state(state, sizeof(state)); i++) {
        if (strcmp(state, "starting") && strcmp(state, "running"))
            break;
        sleep_ms(50);
    }
    CHECK(!strcmp(state, "done"), "the job ended %s", state);
    CHECK(there("good.gguf") && !there("good.gguf.tmp-K1lled"),
          "the job wrote good.gguf and removed its stale temporary");
    CHECK(there("other.gguf.tmp-K1lled"), "another output's temporary is not the job's");
}

/* /tokenize with add_special adds a BOS only where the GGUF says to (add_bos_token): the tiny
 * model has a BOS id but add_bos_token false, and llama.cpp adds none there */
static int tokenize_count(bool add_special)
{
    struct http_reply r;
    char body[128];
    snprintf(body, sizeof(body), "{\"content\":\"abc\",\"add_special\":%s}",
             add_special ? "true" : "false");
    int n = -1;
    if (http_do(port, "POST", "/tokenize", body, &r) && r.status == 200) {
        json_t *j = json_loads(r.body, 0, NULL);
        json_t *t = j ? json_object_get(j, "tokens") : NULL;
        n = t ? (int)json_array_size(t) : -1;
        json_decref(j);
    }
    http_reply_free(&r);
    return n;
}

static void test_tokenize_add_special(void)
{
    const int plain = tokenize_count(false), special = tokenize_count(true);
    CHECK(plain > 0 && special == plain, "add_special: %d tokens, without: %d", special, plain);
}

int main(void)
{
    char dir[400], model_path[600];
    tiny_path(dir, sizeof(dir), "");
    dir[strlen(dir) - 1] = 0; /* drop the trailing '/' */
    snprintf(model_path, sizeof(model_path), "%s/test_server_train.gguf", dir);
    snprintf(train_dir, sizeof(train_dir), "/tmp/lathe_test_server_train_XXXXXX");
    struct tiny_spec sp = {32, 4, 2, 64, 2, LT_TYPE_F32, 7};
    if (tiny_model_write(model_path, &sp) != 0 || !mkdtemp(train_dir))
        return 1;

    /* what a killed job's write leaves, and what must survive beside it */
    static const struct {
        const char *name;
        bool stale;
    } files[] = {
        {"old.gguf.tmp-Ab12Cd", true}, /* a partial GGUF */
        {"job.gguf.tmp-000000", true}, /* empty: killed before the first flush */
        {"old.gguf", false},           /* a finished output */
        {"notes.txt", false},
        {"data.jsonl.tmp-abcdef", false}, /* not a .gguf name */
        {"old.gguf.tmp-abc", false},      /* not mkstemp's six characters */
        {"mine.gguf.tmp-qwerty", false},  /* not a GGUF */
    };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        const char *name = files[i].name;
        if (!strcmp(name, "job.gguf.tmp-000000"))
            put_file(name, "", 0);
        else if (!strcmp(name, "notes.txt") || !strcmp(name, "mine.gguf.tmp-qwerty"))
            put_file(name, "my own notes\n", 13);
        else
            put_file(name, gguf_head, sizeof(gguf_head) - 1);
    }

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
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
        CHECK(there(files[i].name) != files[i].stale, "after start: %s %s", files[i].name,
              files[i].stale ? "removed" : "kept");
    if (st == LT_OK) {
        test_bad_data();
        test_job_clears_its_temps();
        test_tokenize_add_special();
    }
    harness_stop(s, train_dir, model_path);
    return check_summary();
}
#endif
