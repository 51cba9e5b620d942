/* test_server_guard.c: who may call the server, and what a client can do to its connections,
 * over real loopback sockets with the fake engine (test_server_fake.h):
 *   - without a key: a text/plain POST /train from another web origin is refused (403) and
 *     starts nothing, so is one with Host: evil.example (DNS rebinding); loopback names, the
 *     bound address and --allowed-hosts names pass, with or without a port; /health is open;
 *   - state-changing routes need Content-Type: application/json (415 otherwise); the rest do
 *     not; POST /v1/files also takes multipart/form-data (still refused from another origin
 *     or without the key), DELETE needs no Content-Type;
 *   - CORS: an allowed origin gets Access-Control-Allow-Origin, its preflight 204 with the
 *     methods and headers; another origin's preflight gets 403;
 *   - with keys (given and from a file): every route but /health and GET / (the web page,
 *     which still checks Host without a key) needs "Authorization: Bearer KEY" (401 in
 *     OpenAI's shape otherwise, unknown routes included, a refused body dropped), /metrics
 *     too unless metrics_public; the Host check is off; key files with comments and CRLF
 *     load, bad ones are refused;
 *   - connections: a request line that starts with NUL and never ends, a request line
 *     followed by header lines trickled one by one, a body that stops short of its
 *     Content-Length (admitted or refused by the guard) and an idle keep-alive connection
 *     are closed at the header deadline, and a server whose every connection is held by
 *     trickled header lines answers /health again within it; Content-Length -1 (libmicrohttpd's own
 * 400), duplicate Content-Length, Content-Length beside Transfer-Encoding and two Host headers get
 * 400. The header deadline is 1 s here (10 s by default), so the whole test takes a few seconds. */
#include "check.h"

#if !defined(LATHE_HAVE_JANSSON) || !defined(LATHE_HAVE_MHD)
int main(void)
{
    printf("skipped: the server needs jansson and libmicrohttpd\n");
    return 77;
}
#else
#include <jansson.h>
#include <poll.h>

#include "lathe/server.h"
#include "test_server_fake.h"

#define DEADLINE_S 1.0
#define SLOTS 8 /* connections of the server that is held */

static int port;
static char train_dir[256];
static struct srv_app app;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One request with these header lines; the status (0: no answer). The reply is kept in r
 * when r is given (free it), dropped otherwise. */
static int ask(const char *method, const char *path, const char *headers, const char *body,
               struct http_reply *r)
{
    struct http_reply local;
    struct http_reply *out = r ? r : &local;
    if (!http_do_ex(port, method, path, headers, body, out))
        return 0;
    int status = out->status;
    if (!r)
        http_reply_free(&local);
    return status;
}

static bool json_str_is(const json_t *obj, const char *key, const char *want)
{
    const char *v = json_string_value(json_object_get(obj, key));
    return v && !strcmp(v, want);
}

/* An OpenAI-shaped error with this status, type (NULL: any) and code. */
static bool is_error(const struct http_reply *r, int status, const char *type, const char *code)
{
    json_t *j = r->body ? json_loads(r->body, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    bool ok = r->status == status && json_is_string(json_object_get(e, "message")) &&
              json_is_null(json_object_get(e, "param")) && json_str_is(e, "code", code) &&
              (!type || json_str_is(e, "type", type));
    if (!ok)
        fprintf(stderr, "  expected %d %s, got %d: %s\n", status, code, r->status,
                r->body ? r->body : "");
    json_decref(j);
    return ok;
}

static void expect(const char *method, const char *path, const char *headers, const char *body,
                   int status, const char *code)
{
    struct http_reply r;
    ask(method, path, headers, body, &r);
    if (code)
        CHECK(is_error(&r, status, NULL, code), "%s %s with\n%s", method, path, headers);
    else
        CHECK(r.status == status, "%s %s: %d, not %d: %s", method, path, r.status, status,
              r.body ? r.body : "");
    http_reply_free(&r);
}

static void guard_set(const struct lt_server_params *p)
{
    srv_guard_free(&app.guard);
    lt_status st = srv_guard_init(&app.guard, p);
    CHECK(st == LT_OK, "%s", lt_last_error());
}

#define TRAIN_BODY "{\"out\":\"a.gguf\",\"text\":\"hello there\"}"

/* ---- no key: Host, Origin, Content-Type ---- */

static void test_cross_site_train(void)
{
    int before = fake.train_starts;
    /* the request: a page on another site posting text/plain */
    expect("POST", "/train",
           "Host: 127.0.0.1\r\nOrigin: http://evil.example\r\nContent-Type: text/plain\r\n",
           TRAIN_BODY, 403, "origin_not_allowed");
    /* the same as JSON: the origin is what is refused */
    expect("POST", "/train",
           "Host: 127.0.0.1\r\nOrigin: http://evil.example\r\nContent-Type: application/json\r\n",
           TRAIN_BODY, 403, "origin_not_allowed");
    /* a form on another site can send multipart/form-data: its Origin is what is refused */
    expect("POST", "/v1/files",
           "Host: 127.0.0.1\r\nOrigin: http://evil.example\r\n"
           "Content-Type: multipart/form-data; boundary=x\r\n",
           "--x\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n--x--",
           403, "origin_not_allowed");
    expect("POST", "/v1/chat/completions",
           "Host: 127.0.0.1\r\nOrigin: http://evil.example\r\nContent-Type: text/plain\r\n",
           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 403, "origin_not_allowed");
    /* DNS rebinding: the page's own name, now resolving to 127.0.0.1, same origin */
    char h[256];
    snprintf(h, sizeof(h),
             "Host: evil.example:%d\r\nOrigin: http://evil.example:%d\r\n"
             "Content-Type: application/json\r\n",
             port, port);
    expect("POST", "/train", h, TRAIN_BODY, 403, "host_not_allowed");
    expect("GET", "/v1/models", "Host: evil.example\r\n", NULL, 403, "host_not_allowed");
    expect("GET", "/health", "Host: evil.example\r\n", NULL, 200, NULL);
    CHECK(fake.train_starts == before, "nothing was trained");
}

static void test_hosts(void)
{
    static const char *const good[] = {"localhost",  "LocalHost:%d", "127.0.0.1:%d",
                                       "[::1]:%d",   "[::1]",        "myhost.lan:1234",
                                       "MYHOST.LAN", "other.lan",    "127.0.0.1"};
    static const char *const bad[] = {
        "evil.example", "localhost:abc",           "[::1", "localhost.:%d",
        "127.0.0.2",    "myhost.lan.evil.example", ":%d",  ""};
    char host[128], h[200];
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        snprintf(host, sizeof(host), good[i], port);
        snprintf(h, sizeof(h), "Host: %s\r\n", host);
        CHECK(ask("GET", "/v1/models", h, NULL, NULL) == 200, "Host %s", host);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(host, sizeof(host), bad[i], port);
        snprintf(h, sizeof(h), "Host: %s\r\n", host);
        int st = ask("GET", "/v1/models", h, NULL, NULL);
        CHECK(st == 403 || st == 400, "Host '%s': %d", host, st);
    }
    CHECK(ask("GET", "/v1/models", "", NULL, NULL) == 200, "HTTP/1.0 without Host");
    CHECK(ask("GET", "/", "Host: evil.example\r\n", NULL, NULL) == 403, "the page checks Host");
}

static void test_content_type(void)
{
    int before = fake.train_starts;
    static const char *const state_changing[] = {"/train",
                                                 "/train/cancel",
                                                 "/train/pause",
                                                 "/lora-adapters",
                                                 "/lora-adapters/load",
                                                 "/lora-adapters/unload",
                                                 "/v1/fine_tuning/jobs",
                                                 "/v1/fine_tuning/jobs/x/cancel",
                                                 "/v1/files"};
    static const char *const not_json[] = {
        "Host: 127.0.0.1\r\nContent-Type: text/plain\r\n",
        "Host: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n",
        "Host: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=x\r\n",
        "Host: 127.0.0.1\r\nContent-Type: application/jsonp\r\n",
        "Host: 127.0.0.1\r\n",
    };
    for (size_t i = 0; i < sizeof(state_changing) / sizeof(state_changing[0]); i++)
        for (size_t k = 0; k < sizeof(not_json) / sizeof(not_json[0]); k++)
            if (strcmp(state_changing[i], "/v1/files") != 0 || !strstr(not_json[k], "multipart"))
                expect("POST", state_changing[i], not_json[k], TRAIN_BODY, 415,
                       "unsupported_media_type");
    /* an upload is multipart/form-data (OpenAI's shape): admitted to its route, which finds
     * no form in this body; and only POST /v1/files takes it */
    expect("POST", "/v1/files", not_json[2], TRAIN_BODY, 400, "invalid_multipart");
    expect("POST", "/v1/files/x", not_json[2], TRAIN_BODY, 415, "unsupported_media_type");
    expect("PUT", "/v1/files", not_json[2], TRAIN_BODY, 415, "unsupported_media_type");
    /* DELETE has no body and no form sends it: admitted, and no such file */
    expect("DELETE", "/v1/files/file-000000000000000000000000", "Host: 127.0.0.1\r\n", NULL, 404,
           NULL);
    CHECK(fake.train_starts == before && fake.lora_loads == 0 && fake.n_ops == 0,
          "nothing started, loaded or controlled");
    expect("POST", "/train", "Host: 127.0.0.1\r\nContent-Type: Application/JSON; charset=utf-8\r\n",
           TRAIN_BODY, 200, NULL);
    CHECK(fake.train_starts == before + 1);
    /* reading is not changing state; completions are not listed */
    expect("GET", "/train", "Host: 127.0.0.1\r\nContent-Type: text/plain\r\n", NULL, 200, NULL);
    expect("POST", "/tokenize", "Host: 127.0.0.1\r\nContent-Type: text/plain\r\n",
           "{\"content\":\"a\"}", 200, NULL);
}

static void test_cors(void)
{
    struct http_reply r;
    char v[256];
    ask("POST", "/train",
        "Host: 127.0.0.1\r\nOrigin: http://ok.example\r\nContent-Type: application/json\r\n",
        TRAIN_BODY, &r);
    CHECK(r.status == 200, "%d %s", r.status, r.body);
    CHECK(http_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)) &&
              !strcmp(v, "http://ok.example"),
          "%s", r.headers);
    CHECK(http_header(&r, "Vary", v, sizeof(v)) && !strcmp(v, "Origin"));
    http_reply_free(&r);
    /* same origin: nothing to allow */
    char h[256];
    snprintf(h, sizeof(h), "Host: 127.0.0.1:%d\r\nOrigin: http://127.0.0.1:%d\r\n", port, port);
    ask("GET", "/v1/models", h, NULL, &r);
    CHECK(r.status == 200 && !http_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)));
    http_reply_free(&r);
    /* preflight */
    ask("OPTIONS", "/v1/chat/completions",
        "Host: 127.0.0.1\r\nOrigin: http://ok.example\r\nAccess-Control-Request-Method: POST\r\n"
        "Access-Control-Request-Headers: authorization, content-type, x-stainless-os\r\n",
        NULL, &r);
    CHECK(r.status == 204, "%d %s", r.status, r.body);
    CHECK(http_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)) &&
          !strcmp(v, "http://ok.example"));
    CHECK(http_header(&r, "Access-Control-Allow-Methods", v, sizeof(v)) && strstr(v, "POST"));
    CHECK(http_header(&r, "Access-Control-Allow-Headers", v, sizeof(v)) &&
              strstr(v, "x-stainless-os") && strstr(v, "authorization"),
          "%s", v);
    http_reply_free(&r);
    ask("OPTIONS", "/train",
        "Host: 127.0.0.1\r\nOrigin: http://evil.example\r\n"
        "Access-Control-Request-Method: POST\r\n",
        NULL, &r);
    CHECK(is_error(&r, 403, NULL, "origin_not_allowed"));
    CHECK(!http_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)));
    http_reply_free(&r);
}

/* ---- keys ---- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "%s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_key_files(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/keys.txt", train_dir);
    struct srv_guard g;
    struct lt_server_params p = {.api_key_file = path};
    write_file(path, "# team keys\r\n\r\n  sk-two  \r\nsk-three\n");
    CHECK(srv_guard_init(&g, &p) == LT_OK && g.n_keys == 2 && !strcmp(g.keys[0], "sk-two") &&
              !strcmp(g.keys[1], "sk-three"),
          "%s", lt_last_error());
    srv_guard_free(&g);
    write_file(path, "# nothing here\n\n");
    CHECK(srv_guard_init(&g, &p) == LT_ERR_INVALID && strstr(lt_last_error(), "no key"));
    write_file(path, "sk one\n");
    CHECK(srv_guard_init(&g, &p) == LT_ERR_INVALID && strstr(lt_last_error(), "line 1"));
    snprintf(path, sizeof(path), "%s/absent.txt", train_dir);
    CHECK(srv_guard_init(&g, &p) == LT_ERR_IO);
    const char *empty[] = {""};
    struct lt_server_params q = {.api_keys = empty, .n_api_keys = 1};
    CHECK(srv_guard_init(&g, &q) == LT_ERR_INVALID);
}

static void test_keys(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/keys.txt", train_dir);
    write_file(path, "# team keys\r\nsk-two\r\n");
    const char *keys[] = {"sk-one"};
    struct lt_server_params p = {
        .host = "127.0.0.1", .api_keys = keys, .n_api_keys = 1, .api_key_file = path};
    guard_set(&p);
    struct http_reply r;
    ask("GET", "/v1/models", "Host: 127.0.0.1\r\n", NULL, &r);
    CHECK(is_error(&r, 401, "invalid_request_error", "invalid_api_key"));
    char v[64];
    CHECK(http_header(&r, "WWW-Authenticate", v, sizeof(v)) && !strcmp(v, "Bearer"));
    http_reply_free(&r);
    static const char *const wrong[] = {
        "Bearer sk-on", "Bearer sk-one1", "Bearer sk-tw", "Basic c2stb25lOg==",
        "sk-one",       "Bearer ",        "Bearer  "};
    char h[256];
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        snprintf(h, sizeof(h), "Host: 127.0.0.1\r\nAuthorization: %s\r\n", wrong[i]);
        ask("GET", "/v1/models", h, NULL, &r);
        CHECK(is_error(&r, 401, "invalid_request_error", "invalid_api_key"), "%s", wrong[i]);
        CHECK(strstr(r.body, "sk-") == NULL, "the key is not echoed");
        http_reply_free(&r);
    }
    static const char *const right[] = {"Bearer sk-one", "bearer   sk-two", "BEARER sk-one "};
    for (size_t i = 0; i < sizeof(right) / sizeof(right[0]); i++) {
        snprintf(h, sizeof(h), "Host: evil.example\r\nAuthorization: %s\r\n", right[i]);
        CHECK(ask("GET", "/v1/models", h, NULL, NULL) == 200, "%s (any Host with a key)", right[i]);
    }
    CHECK(ask("GET", "/health", "Host: 127.0.0.1\r\n", NULL, NULL) == 200, "/health is open");
    /* the web page holds no data, and a browser cannot send a key to open it */
    ask("GET", "/", "Host: 127.0.0.1\r\n", NULL, &r);
    char csp[256] = "";
    CHECK(r.status == 200 && r.body && strstr(r.body, "<title>lathe</title>") &&
              http_header(&r, "Content-Security-Policy", csp, sizeof(csp)) &&
              !strncmp(csp, "default-src 'none';", 19),
          "the page is open: %d, CSP '%s'", r.status, csp);
    http_reply_free(&r);
    expect("POST", "/", HTTP_JSON_HEADERS, "{}", 401, "invalid_api_key");
    /* the multipart upload is no way around the key */
    expect("POST", "/v1/files",
           "Host: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=x\r\n",
           "--x--", 401, "invalid_api_key");
    expect("DELETE", "/v1/files/file-000000000000000000000000", "Host: 127.0.0.1\r\n", NULL,
           401, "invalid_api_key");
    expect("GET", "/nothing/here", "Host: 127.0.0.1\r\n", NULL, 401, "invalid_api_key");
    expect("GET", "/metrics", "Host: 127.0.0.1\r\n", NULL, 401, "invalid_api_key");
    CHECK(ask("GET", "/metrics", "Host: 127.0.0.1\r\nAuthorization: Bearer sk-two\r\n", NULL,
              NULL) == 200);
    /* a refused body is dropped, however large: 401, not 413 */
    size_t big = 200 * 1024;
    char *hb = malloc(big + 1);
    memset(hb, 'x', big);
    hb[big] = 0;
    expect("POST", "/v1/chat/completions", HTTP_JSON_HEADERS, hb, 401, "invalid_api_key");
    free(hb);
    /* a client waiting for 100 Continue hears the refusal instead */
    static const char expect100[] =
        "POST /train HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 100000\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n";
    int fd = http_send_raw(port, expect100, sizeof(expect100) - 1);
    CHECK(fd >= 0 && http_read(fd, &r) && r.status == 401, "%d", r.status);
    http_reply_free(&r);
    p.metrics_public = true;
    guard_set(&p);
    CHECK(ask("GET", "/metrics", "Host: 127.0.0.1\r\n", NULL, NULL) == 200, "metrics public");
    expect("GET", "/v1/models", "Host: 127.0.0.1\r\n", NULL, 401, "invalid_api_key");
}

/* ---- connections ---- */

/* Seconds until the server closes fd, trickling a header line every 200 ms when asked;
 * give_up when it does not. */
static double seconds_to_close(int fd, bool trickle, double give_up)
{
    double t0 = now_s(), next = t0;
    int i = 0;
    while (now_s() - t0 < give_up) {
        if (trickle && now_s() >= next) {
            char line[32];
            int n = snprintf(line, sizeof(line), "X-Slow-%d: a\r\n", i++);
            if (send(fd, line, (size_t)n, MSG_NOSIGNAL) < 0)
                return now_s() - t0;
            next += 0.2;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 20) > 0) {
            char b[256];
            ssize_t k = recv(fd, b, sizeof(b), MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
                return now_s() - t0;
        }
    }
    return give_up;
}

static void test_slow_head(void)
{
    /* a request line that starts with NUL (and never ends) */
    int fd = http_send_raw(port, "\0", 1);
    CHECK(fd >= 0);
    double t = fd >= 0 ? seconds_to_close(fd, false, 4 * DEADLINE_S) : 0;
    CHECK(t < DEADLINE_S + 1.0, "closed after %.2f s (deadline %.1f s)", t, DEADLINE_S);
    if (fd >= 0)
        close(fd);
    /* an ordinary request line, then headers that never end */
    fd = http_send_raw(port, "GET /health HTTP/1.1\r\n", 22);
    t = fd >= 0 ? seconds_to_close(fd, true, 4 * DEADLINE_S) : 0;
    CHECK(t < DEADLINE_S + 1.0, "closed after %.2f s", t);
    if (fd >= 0)
        close(fd);
    /* a head that declares a body, then part of it, then nothing: the body's next piece is
     * due within the deadline too (it waited for libmicrohttpd's 120 s idle timeout);
     * once for a request the guard admits, once for one it refuses (a foreign Host) */
    static const char *const stalled[] = {
        "POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n{\"content\": \"x",
        "POST /tokenize HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n{\"content\": \"x",
    };
    for (int i = 0; i < 2; i++) {
        fd = http_send_raw(port, stalled[i], strlen(stalled[i]));
        t = fd >= 0 ? seconds_to_close(fd, false, 4 * DEADLINE_S) : 0;
        CHECK(t < DEADLINE_S + 1.0, "a stalled body (%s) closed after %.2f s",
              i ? "refused" : "admitted", t);
        if (fd >= 0)
            close(fd);
    }
    /* idle keep-alive after an answered request: the next head is due in time too */
    static const char keep_alive[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    fd = http_send_raw(port, keep_alive, sizeof(keep_alive) - 1);
    char b[1024];
    CHECK(fd >= 0 && recv(fd, b, sizeof(b), 0) > 0, "answered");
    t = fd >= 0 ? seconds_to_close(fd, false, 4 * DEADLINE_S) : 0;
    CHECK(t < DEADLINE_S + 1.0, "idle keep-alive closed after %.2f s", t);
    if (fd >= 0)
        close(fd);
}

/* Holds every connection of the server on hport with slow heads; /health must answer again
 * within the deadline. */
static void test_lockout(int hport)
{
    int fds[SLOTS];
    for (int i = 0; i < SLOTS; i++) {
        fds[i] = http_connect(hport);
        if (fds[i] >= 0)
            send_all(fds[i], "GET /health HTTP/1.1\r\n", 22);
    }
    double t0 = now_s(), answered = -1;
    int tick = 0;
    while (now_s() - t0 < 6 * DEADLINE_S && answered < 0) {
        for (int i = 0; i < SLOTS; i++) { /* the attacker keeps trickling */
            char line[32];
            int n = snprintf(line, sizeof(line), "X-%d: a\r\n", tick);
            if (fds[i] >= 0)
                send(fds[i], line, (size_t)n, MSG_NOSIGNAL);
        }
        tick++;
        struct http_reply r;
        int fd = http_send(hport, "GET", "/health", NULL, 0);
        if (fd >= 0 && http_read(fd, &r)) {
            if (r.status == 200)
                answered = now_s() - t0;
            http_reply_free(&r);
        }
        fake_sleep_ms(100);
    }
    CHECK(answered >= 0 && answered < DEADLINE_S + 1.5,
          "/health answered after %.2f s with %d slow connections held", answered, SLOTS);
    for (int i = 0; i < SLOTS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Sends a raw request; its status (0: none). */
static int raw_status(const char *req, struct http_reply *r)
{
    int fd = http_send_raw(port, req, strlen(req));
    if (fd < 0 || !http_read(fd, r))
        return 0;
    return r->status;
}

static void test_framing(void)
{
    static const struct {
        const char *req;
        bool ours; /* answered by lathe (JSON), not by libmicrohttpd */
    } cases[] = {
        {"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         "Content-Length: -1\r\n\r\n{\"content\":\"a\"}",
         false},
        {"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         "Content-Length: 15\r\nContent-Length: 15\r\n\r\n{\"content\":\"a\"}",
         true},
        {"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         "Content-Length: 2\r\nContent-Length: 15\r\n\r\n{\"content\":\"a\"}",
         true},
        {"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         "Content-Length: 15\r\nTransfer-Encoding: chunked\r\n\r\nf\r\n{\"content\":\"a\"}\r\n"
         "0\r\n\r\n",
         true},
        {"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n", true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct http_reply r;
        int st = raw_status(cases[i].req, &r);
        CHECK(st == 400, "case %zu: %d", i, st);
        if (cases[i].ours && st == 400) {
            CHECK(is_error(&r, 400, "invalid_request_error", "invalid_request"), "case %zu", i);
            char v[32];
            CHECK(http_header(&r, "Connection", v, sizeof(v)) && !strcasecmp(v, "close"));
        }
        http_reply_free(&r);
    }
    struct http_reply r;
    CHECK(raw_status("POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     "application/json\r\nContent-Length: 15\r\nConnection: close\r\n\r\n"
                     "{\"content\":\"a\"}",
                     &r) == 200,
          "one Content-Length is fine");
    http_reply_free(&r);
}

static void test_timeouts_counted(void)
{
    struct http_reply r;
    CHECK(http_do(port, "GET", "/metrics", NULL, &r) && r.status == 200);
    static const char name[] = "\nlathe_http_header_timeouts_total ";
    const char *m = r.body ? strstr(r.body, name) : NULL;
    int n = m ? atoi(m + sizeof(name) - 1) : -1;
    CHECK(n >= 5 + SLOTS, "%d connections closed at the header deadline", n);
    http_reply_free(&r);
}

int main(void)
{
    snprintf(train_dir, sizeof(train_dir), "/tmp/lathe_test_server_guard_XXXXXX");
    if (!mkdtemp(train_dir))
        return 1;
    pthread_mutex_init(&fake.mu, NULL);
    atomic_init(&fake.state, SRV_STATE_READY);
    struct srv_engine engine = {.iface = &fake_iface};
    app.engine = &engine;
    app.train_dir = train_dir;
    app.max_body_bytes = 64 * 1024;
    app.header_timeout_s = DEADLINE_S;
    app.quiet = true;
    pthread_mutex_init(&app.stats_mu, NULL);
    const char *origins[] = {"http://ok.example/"};
    const char *hosts[] = {"myhost.lan", "other.lan:80,other.lan"};
    struct lt_server_params open = {.host = "127.0.0.1",
                                    .cors_origins = origins,
                                    .n_cors_origins = 1,
                                    .allowed_hosts = hosts,
                                    .n_allowed_hosts = 2};
    guard_set(&open);
    struct srv_http *http = NULL, *held = NULL;
    lt_status st = srv_http_start(&app, "127.0.0.1", 0, 64, &http);
    if (st == LT_OK)
        st = srv_http_start(&app, "127.0.0.1", 0, SLOTS, &held);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st != LT_OK)
        return check_summary();
    port = srv_http_port(http);

    test_cross_site_train();
    test_hosts();
    test_content_type();
    test_cors();
    test_framing();
    test_slow_head();
    test_lockout(srv_http_port(held));
    test_timeouts_counted();
    test_key_files();
    test_keys();

    srv_http_stop(held);
    srv_http_stop(http);
    srv_guard_free(&app.guard);
    for (int i = 0; i < 300 && atomic_load(&fake.running) > 0; i++)
        fake_sleep_ms(10);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", train_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", train_dir);
    return check_summary();
}
#endif
