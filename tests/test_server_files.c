/* test_server_files.c: /v1/files through the real engine (lt_server_start on the tiny random
 * model of test_train_tiny.h, CPU, a 4 KiB upload cap), over raw HTTP so that it also runs
 * under the sanitizers (.ci/sanitize); tests/py/test_server_files.py drives the same routes
 * with the openai client on SmolLM2:
 *   - at start, what a killed upload left in <train-dir>/files (lathe's temporary names, data
 *     older than a minute without its object) is removed, and nothing else;
 *   - an upload is stored (the bytes and the object beside them), listed newest first,
 *     retrieved, its content given back byte for byte;
 *   - bad uploads get 4xx naming the fault and leave nothing: JSONL a job would refuse (the
 *     line named), another purpose, over the cap (413), a form without its closing boundary;
 *   - ids other than "file-" and 24 hex digits are 404, whatever they hold;
 *   - uploads still arriving hold at most SRV_MAX_UPLOADS slots: one more gets 503, and
 *     once they are gone uploads are taken again;
 *   - a fine-tuning job created with file ids (training and validation) runs to "succeeded"
 *     with the validation file's examples held out;
 *   - delete: 200, then 404 for it everywhere, and nothing left on disk. */
#include "check.h"

#if !defined(LATHE_HAVE_JANSSON) || !defined(LATHE_HAVE_MHD)
int main(void)
{
    printf("skipped: the server needs jansson and libmicrohttpd\n");
    return 77;
}
#else
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "http_client.h"
#include "lathe/server.h"
#include "server/server_impl.h" /* SRV_MAX_UPLOADS */
#include "server_harness.h"
#include "test_train_tiny.h"

#define UPLOAD_CAP 4096
#define BOUNDARY "t3st-b0undary"
#define MULTIPART_HEADERS                                                                          \
    "Host: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=" BOUNDARY "\r\n"
#define GOOD "{\"prompt\":\"hi\",\"completion\":\"hello\"}\n"

static int port;
static char train_dir[600];

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void put(const char *name, const char *content)
{
    char path[800];
    snprintf(path, sizeof(path), "%s/files/%s", train_dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fputs(content, f) >= 0, "write %s", path);
    if (f)
        fclose(f);
}

static bool there(const char *name)
{
    char path[800];
    snprintf(path, sizeof(path), "%s/files/%s", train_dir, name);
    return access(path, F_OK) == 0;
}

/* Entries of <train-dir>/files, not counting . and .. */
static int n_entries(void)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/files", train_dir);
    DIR *d = opendir(path);
    int n = 0;
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d))
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* POSTs a form of `purpose` and a file `name` holding `data` (close: with its closing
 * boundary); the reply in r. */
static void upload(const char *purpose, const char *name, const char *data, bool close,
                   struct http_reply *r)
{
    struct lt_strbuf b = {0};
    char head[512];
    snprintf(head, sizeof(head),
             "--" BOUNDARY "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n%s\r\n"
             "--" BOUNDARY "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"%s\"\r\n"
             "Content-Type: application/octet-stream\r\n\r\n",
             purpose, name);
    lt_strbuf_append(&b, head, strlen(head));
    lt_strbuf_append(&b, data, strlen(data));
    const char *tail = close ? "\r\n--" BOUNDARY "--\r\n" : "\r\n";
    lt_strbuf_append(&b, tail, strlen(tail));
    CHECK(http_do_ex(port, "POST", "/v1/files", MULTIPART_HEADERS, b.data, r), "a reply");
    lt_strbuf_free(&b);
}

/* The reply's JSON (NULL when it is none); the caller frees it. */
static json_t *reply_json(const struct http_reply *r)
{
    return r->body ? json_loads(r->body, 0, NULL) : NULL;
}

static void expect_error(const char *what, struct http_reply *r, int status, const char *param,
                         const char *words)
{
    json_t *j = reply_json(r);
    json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *got = json_string_value(json_object_get(e, "param"));
    CHECK(r->status == status && msg && strstr(msg, words) &&
              (!param ? json_is_null(json_object_get(e, "param")) : got && !strcmp(got, param)),
          "%s: %d %s", what, r->status, r->body ? r->body : "");
    json_decref(j);
    http_reply_free(r);
}

/* Uploads data as a good file; its id into id (empty on failure). */
static void upload_good(const char *name, const char *data, char id[64])
{
    struct http_reply r;
    upload("fine-tune", name, data, true, &r);
    json_t *j = reply_json(&r);
    const char *got = json_string_value(json_object_get(j, "id"));
    snprintf(id, 64, "%s", got ? got : "");
    CHECK(r.status == 200 && strlen(id) == 29 &&
              json_integer_value(json_object_get(j, "bytes")) == (json_int_t)strlen(data) &&
              !strcmp(json_string_value(json_object_get(j, "filename")), name),
          "upload %s: %d %s", name, r.status, r.body ? r.body : "");
    json_decref(j);
    http_reply_free(&r);
}

static void test_bad_uploads(void)
{
    int before = n_entries();
    struct http_reply r;
    upload("fine-tune", "bad.jsonl", GOOD GOOD "{\"prompt\": \"no completion\"}\n", true, &r);
    expect_error("a line a job would refuse", &r, 400, "file", "line 3 (example 2)");
    upload("batch", "a.jsonl", GOOD, true, &r);
    expect_error("another purpose", &r, 400, "purpose", "'batch'");
    upload("fine-tune", "a.jsonl", GOOD, false, &r);
    expect_error("no closing boundary", &r, 400, NULL, "closing boundary");
    char big[UPLOAD_CAP + 200];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    upload("fine-tune", "big.jsonl", big, true, &r);
    expect_error("over the cap", &r, 413, "file", "--max-upload-mib");
    CHECK(n_entries() == before, "nothing left behind: %d entries, %d before", n_entries(), before);
    static const char *const ids[] = {"file-0123456789abcdef01234567", "file-..",
                                      "file-0123456789ABCDEF01234567", "..%2F..%2Fetc",
                                      "file-0123456789abcdef0123456"};
    char path[128];
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        snprintf(path, sizeof(path), "/v1/files/%s", ids[i]);
        CHECK(http_do(port, "GET", path, NULL, &r) && r.status == 404, "GET %s: %d", path,
              r.status);
        http_reply_free(&r);
        CHECK(http_do(port, "DELETE", path, NULL, &r) && r.status == 404, "DELETE %s: %d", path,
              r.status);
        http_reply_free(&r);
    }
}

/* GET path: 200 and its body, or NULL (free it). */
static char *get_body(const char *path)
{
    struct http_reply r;
    char *body = NULL;
    if (http_do(port, "GET", path, NULL, &r) && r.status == 200) {
        body = r.body;
        r.body = NULL;
    }
    http_reply_free(&r);
    return body;
}

static void test_stored(const char *id, const char *vid)
{
    CHECK(n_entries() == 4, "two files and their objects: %d", n_entries());
    char path[128];
    snprintf(path, sizeof(path), "/v1/files/%s/content", id);
    char *content = get_body(path);
    CHECK(content && !strcmp(content, GOOD GOOD GOOD), "content: %s", content ? content : "");
    free(content);
    char *list = get_body("/v1/files");
    json_t *j = list ? json_loads(list, 0, NULL) : NULL;
    json_t *data = json_object_get(j, "data");
    CHECK(json_array_size(data) == 2 &&
              !strcmp(json_string_value(json_object_get(json_array_get(data, 0), "id")), vid),
          "both listed, the newest first: %s", list ? list : "");
    json_decref(j);
    free(list);
}

static void test_job(const char *id, const char *vid)
{
    char body[256];
    snprintf(body, sizeof(body),
             "{\"training_file\":\"%s\",\"validation_file\":\"%s\",\"hyperparameters\":"
             "{\"n_epochs\":1}}",
             id, vid);
    struct http_reply r;
    CHECK(http_do(port, "POST", "/v1/fine_tuning/jobs", body, &r) && r.status == 200, "%d %s",
          r.status, r.body ? r.body : "");
    http_reply_free(&r);
    char state[32] = "";
    json_t *j = NULL;
    for (int i = 0; i < 600; i++) {
        char *t = get_body("/train");
        json_decref(j);
        j = t ? json_loads(t, 0, NULL) : NULL;
        free(t);
        snprintf(state, sizeof(state), "%s", json_string_value(json_object_get(j, "state")));
        if (strcmp(state, "starting") && strcmp(state, "running"))
            break;
        sleep_ms(50);
    }
    json_t *res = json_object_get(j, "result");
    char *dump = json_dumps(j, JSON_COMPACT);
    CHECK(!strcmp(state, "done") && json_integer_value(json_object_get(res, "n_train")) == 3 &&
              json_integer_value(json_object_get(res, "n_val")) == 1,
          "the job ran with the validation file held out: %s %.600s", state, dump ? dump : "");
    free(dump);
    json_decref(j);
}

/* SRV_MAX_UPLOADS uploads still arriving hold every upload slot: one more is answered 503
 * (once its body is in), and when they go away uploads are taken again. */
static void test_upload_slots(void)
{
    int held[SRV_MAX_UPLOADS];
    char head[256];
    int n = snprintf(head, sizeof(head),
                     "POST /v1/files HTTP/1.1\r\n" MULTIPART_HEADERS "Content-Length: 1000\r\n"
                     "\r\n--" BOUNDARY "\r\n");
    for (int i = 0; i < SRV_MAX_UPLOADS; i++)
        held[i] = http_send_raw(port, head, (size_t)n);
    int receiving = -1;
    for (int i = 0; i < 200 && receiving != SRV_MAX_UPLOADS; i++) { /* their heads are read */
        char *m = get_body("/metrics");
        const char *at = m ? strstr(m, "\nlathe_http_uploads_receiving ") : NULL;
        receiving = at ? atoi(at + strlen("\nlathe_http_uploads_receiving ")) : -1;
        free(m);
        if (receiving != SRV_MAX_UPLOADS)
            sleep_ms(50);
    }
    CHECK(receiving == SRV_MAX_UPLOADS, "/metrics counts the uploads arriving: %d", receiving);
    struct http_reply r;
    upload("fine-tune", "one.jsonl", GOOD, true, &r);
    json_t *j = reply_json(&r);
    const char *code = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
    CHECK(r.status == 503 && code && !strcmp(code, "too_many_uploads"), "one upload too many: %d %s",
          r.status, r.body ? r.body : "");
    json_decref(j);
    http_reply_free(&r);
    for (int i = 0; i < SRV_MAX_UPLOADS; i++)
        if (held[i] >= 0)
            close(held[i]);
    int status = 0;
    for (int i = 0; i < 50 && status != 200; i++) { /* the server notices the closes */
        sleep_ms(50);
        upload("fine-tune", "two.jsonl", GOOD, true, &r);
        status = r.status;
        if (status == 200) { /* not kept: the counts below are the other files' */
            j = reply_json(&r);
            char path[128];
            snprintf(path, sizeof(path), "/v1/files/%s",
                     json_string_value(json_object_get(j, "id")));
            json_decref(j);
            struct http_reply d;
            CHECK(http_do(port, "DELETE", path, NULL, &d) && d.status == 200, "delete it");
            http_reply_free(&d);
        }
        http_reply_free(&r);
    }
    CHECK(status == 200, "uploads are taken again once the others went away: %d", status);
}

static void test_delete(const char *id)
{
    char path[128];
    snprintf(path, sizeof(path), "/v1/files/%s", id);
    struct http_reply r;
    CHECK(http_do(port, "DELETE", path, NULL, &r) && r.status == 200 && r.body &&
              strstr(r.body, "\"deleted\":true"),
          "delete: %d %s", r.status, r.body ? r.body : "");
    http_reply_free(&r);
    CHECK(http_do(port, "GET", path, NULL, &r) && r.status == 404, "GET after delete");
    http_reply_free(&r);
    CHECK(http_do(port, "DELETE", path, NULL, &r) && r.status == 404, "a second delete");
    http_reply_free(&r);
    CHECK(n_entries() == 2, "its data and object are gone: %d entries", n_entries());
}

int main(void)
{
    char dir[400], model_path[600], files_dir[700];
    tiny_path(dir, sizeof(dir), "");
    dir[strlen(dir) - 1] = 0; /* drop the trailing '/' */
    snprintf(model_path, sizeof(model_path), "%s/test_server_files.gguf", dir);
    snprintf(train_dir, sizeof(train_dir), "/tmp/lathe_test_server_files_XXXXXX");
    struct tiny_spec sp = {32, 4, 2, 64, 2, LT_TYPE_F32, 7};
    if (tiny_model_write(model_path, &sp) != 0 || !mkdtemp(train_dir))
        return 1;
    snprintf(files_dir, sizeof(files_dir), "%s/files", train_dir);
    mkdir(files_dir, 0700);
    /* what a killed upload leaves, and what must survive beside it */
    put("file-bbbbbbbbbbbbbbbbbbbbbbbb.jsonl.tmp-Ab12Cd", GOOD);
    put("file-bbbbbbbbbbbbbbbbbbbbbbbb.json.tmp-000000", "");
    put("file-cccccccccccccccccccccccc.jsonl", GOOD); /* no object, made old below */
    put("file-dddddddddddddddddddddddd.jsonl", GOOD); /* no object, but new */
    put("notes.tmp-abcdef", "mine\n");
    char old[800];
    snprintf(old, sizeof(old), "%s/file-cccccccccccccccccccccccc.jsonl", files_dir);
    struct timespec times[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    utimensat(AT_FDCWD, old, times, 0);
    struct lt_server_params p = {.model_path = model_path,
                                 .parallel = 2,
                                 .n_threads = 1,
                                 .train_dir = train_dir,
                                 .quiet = true,
                                 .train_yield_ms = -1,
                                 .max_upload_bytes = UPLOAD_CAP};
    struct lt_server *s = NULL;
    lt_status st = harness_start(&p, &s, &port);
    CHECK(!there("file-bbbbbbbbbbbbbbbbbbbbbbbb.jsonl.tmp-Ab12Cd") &&
              !there("file-bbbbbbbbbbbbbbbbbbbbbbbb.json.tmp-000000") &&
              !there("file-cccccccccccccccccccccccc.jsonl"),
          "a killed upload's leftovers are removed at start");
    CHECK(there("file-dddddddddddddddddddddddd.jsonl") && there("notes.tmp-abcdef"),
          "the rest is kept");
    /* the young orphan and the notes, out of the way of the counts below */
    snprintf(old, sizeof(old), "%s/file-dddddddddddddddddddddddd.jsonl", files_dir);
    unlink(old);
    snprintf(old, sizeof(old), "%s/notes.tmp-abcdef", files_dir);
    unlink(old);
    if (st == LT_OK) {
        char id[64], vid[64];
        upload_good("train.jsonl", GOOD GOOD GOOD, id);
        sleep_ms(1100); /* created_at is in seconds: the second file is newer */
        upload_good("held out.jsonl", GOOD, vid);
        test_bad_uploads();
        test_upload_slots();
        test_stored(id, vid);
        test_job(id, vid);
        test_delete(id);
    }
    harness_stop(s, train_dir, model_path);
    return check_summary();
}
#endif
