/* fuzz_http.c: the whole HTTP request path of `lathe serve`, on raw bytes. The first input
 * starts the real server in this process (lt_server_start: libmicrohttpd, the guard, the
 * route table, the engine and its slots, the trainer) on a small real model, a two-layer
 * llama GGUF with a byte-level tokenizer and ChatML template written from tests/
 * test_train_tiny.h, or the GGUF named by LATHE_FUZZ_HTTP_MODEL (SmolLM2, say, for a slower
 * and deeper run). Each input is sent as it is over a fresh TCP connection, and the first
 * answer is read until it is whole (its Content-Length, its last chunk) or the server
 * closes.
 *
 * Whatever the bytes, the server must
 *   - accept the connection (it is alive);
 *   - answer within ANSWER_S seconds, and when it answers at all, with an HTTP status line;
 *   - never answer 500 (an internal error is a defect: the route gave no answer, or
 *     sampling or decoding failed on a request that passed validation);
 *   - keep /health at 200 "ok", checked every HEALTH_EVERY inputs.
 * A crash, a sanitizer report in any of its threads (leaks aside: see below), a hang or a
 * broken invariant stops the run with its input saved. Requests may start training jobs in the temp train dir, and
 * generation may run to the slot's context (CTX tokens), so that every route is reached. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lathe/server.h"
#include "test_train_tiny.h"

#define ANSWER_S 60     /* the longest an answer may take (a full-context generation) */
#define HEALTH_EVERY 64 /* inputs between two /health checks */
#define CTX 96          /* tokens per slot: bounds every generation */
#define HALF_CLOSE_MS 300 /* no answer yet: the request is taken as incomplete */

static int port;

/* No leak checks in this target. The server's threads (slots, a training job, connection
 * handlers) keep working while libFuzzer checks for leaks after an input, and LeakSanitizer's
 * check is not reliable against concurrent work (google/sanitizers#757): here it reported a
 * running job's live state and an in-flight request's JSON as leaked. The server's leaks
 * are .ci/sanitize's (it runs the server tests under ASan, which stop the server cleanly). */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "detect_leaks=0";
}

static void die(const char *why, const uint8_t *data, size_t size)
{
    fprintf(stderr, "fuzz_http: %s (input of %zu bytes)\n", why, size);
    (void)data;
    abort();
}

static char dir[] = "/tmp/lathe-fuzz-http-XXXXXX";

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "fuzz_http: could not remove %s\n", dir);
}

static void start_server(void)
{
    static char model[256];
    static struct lt_server *server; /* lives for the whole run */
    if (!mkdtemp(dir))
        die("no temp dir", NULL, 0);
    atexit(remove_dir); /* the server's threads still run then; the run is over */
    const char *path = getenv("LATHE_FUZZ_HTTP_MODEL");
    if (!path || !*path) {
        snprintf(model, sizeof(model), "%s/tiny.gguf", dir);
        struct tiny_spec sp = {32, 4, 2, 64, 2, LT_TYPE_F32, 7};
        if (tiny_model_write(model, &sp) != 0)
            die("could not write the tiny model", NULL, 0);
        path = model;
    }
    struct lt_server_params p = {
        .model_path = path,
        .port = 0,
        .parallel = 2,
        .n_ctx = CTX,
        .n_threads = 1,
        .train_dir = dir,
        .quiet = true,
        .train_yield_ms = 50,
        .header_timeout_ms = 2000,
    };
    if (lt_server_start(&p, &server) != LT_OK || lt_server_wait_ready(server) != LT_OK) {
        fprintf(stderr, "fuzz_http: the server did not start: %s\n", lt_last_error());
        abort();
    }
    port = lt_server_port(server);
    fprintf(stderr, "fuzz_http: lathe serve on 127.0.0.1:%d, model %s, train dir %s\n", port,
            path, dir);
}

/* Whether the bytes seen so far hold one whole answer: its head, then Content-Length bytes,
 * or a chunked body up to its last chunk, or (neither) nothing more: the server closes.
 * An answer to HEAD, and a 204 or 304, end with their head (RFC 9112 6.3): a preflight's
 * 204 has no Content-Length and the connection stays open for the next request. */
struct framing {
    bool head_request; /* the request's method is HEAD */
    size_t head_end; /* bytes up to the blank line; 0 until it is seen */
    long long length; /* Content-Length; -1 none */
    bool chunked;
    size_t total; /* bytes received */
    char tail[5]; /* the last five */
};

static bool header_is(const char *head, const char *name, const char **value)
{
    for (const char *p = strstr(head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        if (strncasecmp(p + 2, name, strlen(name)) == 0 && p[2 + strlen(name)] == ':') {
            *value = p + 3 + strlen(name);
            return true;
        }
    }
    return false;
}

static bool answer_complete(struct framing *f, const char *kept, size_t n_kept, const char *buf,
                            size_t n)
{
    for (size_t i = 0; i < n; i++) {
        memmove(f->tail, f->tail + 1, 4);
        f->tail[4] = buf[i];
    }
    f->total += n;
    if (!f->head_end) {
        const char *e = strstr(kept, "\r\n\r\n");
        if (!e)
            return false;
        f->head_end = (size_t)(e - kept) + 4;
        char head[4097];
        snprintf(head, sizeof(head), "%.*s", (int)f->head_end, kept);
        const char *v;
        f->length = header_is(head, "Content-Length", &v) ? atoll(v) : -1;
        f->chunked = header_is(head, "Transfer-Encoding", &v) && strstr(v, "chunked");
        bool no_body = strncmp(head, "HTTP/1.", 7) == 0 && (!strncmp(head + 8, " 204", 4) ||
                                                           !strncmp(head + 8, " 304", 4));
        if (no_body || f->head_request)
            f->length = 0;
    }
    (void)n_kept;
    if (f->length >= 0)
        return f->total >= f->head_end + (size_t)f->length;
    return f->chunked && f->total >= f->head_end + 5 && memcmp(f->tail, "0\r\n\r\n", 5) == 0;
}

/* Whether data holds a whole first request: its head, then its Content-Length bytes or its
 * last chunk. One that does not gets the half-close at once (the server would wait). */
static bool request_complete(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return false;
    memcpy(text, data, size);
    text[size] = 0;
    size_t len = strlen(text); /* a NUL ends what the checks below look at */
    char *e = strstr(text, "\r\n\r\n");
    bool whole = e != NULL;
    if (e) {
        e[2] = 0; /* the head, with its last line's CRLF */
        const char *v;
        size_t body = len - (size_t)(e + 4 - text);
        if (header_is(text, "Content-Length", &v))
            whole = atoll(v) >= 0 && (unsigned long long)atoll(v) <= body;
        else if (header_is(text, "Transfer-Encoding", &v))
            whole = strstr(e + 4, "0\r\n\r\n") != NULL;
    }
    free(text);
    return whole;
}

/* Sends data on a new connection and reads the first answer (up to cap bytes kept) until it
 * is complete or the server closes. A request that gets no byte back within HALF_CLOSE_MS
 * is taken as incomplete and the connection half-closed, so that the server ends it (a
 * half-close before that would read as a client gone, and cancel a generation); one that
 * is plainly incomplete gets it at once. Returns
 * the bytes kept, -1 when the connection was refused, -2 when the answer took longer than
 * ANSWER_S. */
static long exchange(const uint8_t *data, size_t size, char *answer, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    /* the server may answer and close before all is sent (a refusal at the head): fine */
    for (size_t off = 0; off < size;) {
        ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    struct framing f = {.length = -1, .head_request = size >= 5 && !memcmp(data, "HEAD ", 5)};
    size_t kept = 0;
    bool half_closed = !request_complete(data, size);
    if (half_closed)
        shutdown(fd, SHUT_WR);
    answer[0] = 0;
    time_t t0 = time(NULL);
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int left = (int)(ANSWER_S - (time(NULL) - t0));
        int wait_ms = !half_closed && f.total == 0 ? HALF_CLOSE_MS : left * 1000;
        int ready = left > 0 ? poll(&pf, 1, wait_ms) : 0;
        if (ready == 0 && !half_closed && f.total == 0 && left > 0) {
            shutdown(fd, SHUT_WR);
            half_closed = true;
            continue;
        }
        if (ready <= 0) {
            close(fd);
            answer[kept] = 0;
            return -2;
        }
        char buf[4096];
        ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r <= 0)
            break; /* closed (or reset, which a refused request may get) */
        size_t take = kept + (size_t)r < cap ? (size_t)r : cap - kept;
        memcpy(answer + kept, buf, take);
        kept += take;
        answer[kept] = 0;
        if (answer_complete(&f, answer, kept, buf, (size_t)r))
            break;
    }
    close(fd);
    return (long)kept;
}

/* The status of an answer's first line, or -1 when it is not "HTTP/1.x NNN". */
static int status_of(const char *answer, long n)
{
    if (n < 12 || strncmp(answer, "HTTP/1.", 7) != 0 || (answer[7] != '0' && answer[7] != '1') ||
        answer[8] != ' ')
        return -1;
    int s = 0;
    for (int i = 9; i < 12; i++) {
        if (answer[i] < '0' || answer[i] > '9')
            return -1;
        s = s * 10 + (answer[i] - '0');
    }
    return s;
}

static void check_health(void)
{
    static const char req[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    char answer[4097];
    long n = exchange((const uint8_t *)req, sizeof(req) - 1, answer, sizeof(answer) - 1);
    if (status_of(answer, n) != 200 || !strstr(answer, "\"ok\""))
        die("/health is not 200 ok", NULL, 0);
}

/* After a hang: what the server says of its connections, slots and job. */
static void dump_state(void)
{
    static const char *const paths[] = {"/metrics", "/slots", "/train"};
    for (int i = 0; i < 3; i++) {
        char req[128], answer[4097];
        int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", paths[i]);
        long got = exchange((const uint8_t *)req, (size_t)n, answer, sizeof(answer) - 1);
        fprintf(stderr, "fuzz_http: GET %s (%ld bytes):\n%s\n", paths[i], got, got > 0 ? answer : "");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned long runs;
    if (!port)
        start_server();
    char answer[4097];
    long n = exchange(data, size, answer, sizeof(answer) - 1);
    if (n == -1)
        die("the server refused the connection", data, size);
    if (n == -2) {
        /* say what came back, and whether the server as a whole still answers */
        fprintf(stderr, "fuzz_http: a hang after %zu bytes of answer: %.*s\n", strlen(answer),
                (int)strcspn(answer, "\r\n"), answer);
        check_health();
        dump_state();
        die("no whole answer within the time limit, though /health answers", data, size);
    }
    /* Every answer the server writes itself starts with a status line. A request that
     * never completed its head may get no answer at all (libmicrohttpd closes it). */
    int status = n > 0 ? status_of(answer, n) : 0;
    if (n > 0 && status < 0)
        die("an answer without an HTTP status line", data, size);
    if (getenv("LATHE_FUZZ_HTTP_VERBOSE")) /* to see what the seeds reach */
        fprintf(stderr, "fuzz_http: %zu bytes -> %.*s | %.200s\n", size,
                (int)strcspn(answer, "\r\n"), answer,
                strstr(answer, "\r\n\r\n") ? strstr(answer, "\r\n\r\n") + 4 : "");
    if (status == 500)
        die("the server answered 500", data, size);
    if (++runs % HEALTH_EVERY == 0)
        check_health();
    return 0;
}
