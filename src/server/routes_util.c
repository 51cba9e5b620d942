/* routes_util.c: what every route shares: recording an error (reason, field, code) for the
 * thread, OpenAI-shaped error bodies, JSON responses, names resolved inside a directory,
 * clocks, formatted text appended whole (the metrics).
 *
 * A name from a request never becomes a path by itself: it must be a plain file name
 * (no '/', no '\\', no leading '.', only [A-Za-z0-9._-]) with the expected extension, so
 * "../x.gguf", "/etc/passwd" or "a/b.gguf" cannot leave the directory; the file, if it
 * exists, must also not be a symbolic link pointing elsewhere. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "server/server_impl.h"

static _Thread_local char last_param[160];
static _Thread_local char last_code[48];

int srv_fail(int http_status, const char *param, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lt_failv(LT_ERR_INVALID, fmt, ap);
    va_end(ap);
    snprintf(last_param, sizeof(last_param), "%s", param ? param : "");
    snprintf(last_code, sizeof(last_code), "%s", code ? code : "");
    return http_status;
}

const char *srv_last_param(void)
{
    return last_param;
}

const char *srv_last_code(void)
{
    return last_code;
}

int srv_http_status_of(lt_status st)
{
    switch (st) {
    case LT_OK: return 200;
    case LT_ERR_INVALID:
    case LT_ERR_FORMAT:
    case LT_ERR_UNSUPPORTED: return 400;
    case LT_ERR_IO: return 404;
    case LT_ERR_REFUSED: return 409;
    case LT_ERR_NOMEM: return 503;
    case LT_ERR_CANCELLED: return 409;
    default: return 500;
    }
}

double srv_now_unix(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double srv_now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

lt_status srv_strbuf_appendf(struct lt_strbuf *out, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return lt_fail(LT_ERR_INVALID, "a format could not be written");
    if ((size_t)n < sizeof(small))
        return lt_strbuf_append(out, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big)
        return lt_fail(LT_ERR_NOMEM, "out of memory for %d bytes of text", n);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    lt_status st = lt_strbuf_append(out, big, (size_t)n);
    free(big);
    return st;
}

void srv_response_header(struct srv_response *rs, const char *name, const char *value)
{
    if (rs->n_headers == SRV_MAX_HEADERS)
        return;
    rs->headers[rs->n_headers].name = name;
    snprintf(rs->headers[rs->n_headers].value, sizeof(rs->headers[0].value), "%s", value);
    rs->n_headers++;
}

#ifdef LATHE_HAVE_JANSSON
#include "server/json_check.h"
#include "server/routes.h"

static const char *code_for(int status)
{
    switch (status) {
    case 400: return "invalid_request";
    case 403: return "forbidden";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 409: return "conflict";
    case 413: return "body_too_large";
    case 415: return "unsupported_media_type";
    case 503: return "unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request";
    }
}

json_t *srv_json_text(const char *s, size_t n)
{
    if (!s)
        return json_string("");
    json_t *j = json_stringn(s, n); /* NULL when s is not valid UTF-8 */
    if (j)
        return j;
    /* A token may be a lone byte: replace what is not UTF-8 with U+FFFD. */
    struct lt_strbuf b = {0};
    for (size_t i = 0; i < n;) {
        size_t k = lt_utf8_seq_len((const unsigned char *)s + i, n - i);
        if (k == 0) {
            lt_strbuf_append(&b, "\xEF\xBF\xBD", 3);
            i++;
        } else {
            lt_strbuf_append(&b, s + i, k);
            i += k;
        }
    }
    j = json_stringn(b.data ? b.data : "", b.len);
    lt_strbuf_free(&b);
    return j ? j : json_string("");
}

void *srv_error_json(int status, const char *param, const char *code, const char *message)
{
    /* OpenAI's types: a 404 (an unknown model or path) is an invalid request too */
    const char *type = status >= 500 ? "server_error" : "invalid_request_error";
    /* a message may quote what the client sent (a path, a header): keep the JSON valid */
    const char *m = message ? message : "";
    json_t *param_json = param && *param ? srv_json_text(param, strlen(param)) : json_null();
    return json_pack("{s:{s:o,s:s,s:o,s:s}}", "error", "message", srv_json_text(m, strlen(m)),
                     "type", type, "param", param_json, "code",
                     code && *code ? code : code_for(status));
}

void srv_respond_json(struct srv_response *rs, int status, void *json)
{
    json_t *j = json;
    rs->status = status;
    rs->content_type = "application/json";
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    lt_strbuf_free(&rs->body);
    if (!s || lt_strbuf_append(&rs->body, s, strlen(s)) != LT_OK ||
        lt_strbuf_append(&rs->body, "\n", 1) != LT_OK) {
        /* out of memory: a fixed body still says so */
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":\"unavailable\"}}\n";
        lt_strbuf_free(&rs->body);
        rs->status = 503;
        lt_strbuf_append(&rs->body, oom, sizeof(oom) - 1);
    }
    free(s);
}

void srv_respond_error(struct srv_response *rs, int status, const char *param, const char *code,
                       const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    srv_respond_json(rs, status, srv_error_json(status, param, code, msg));
}

void srv_respond_last_error(struct srv_response *rs, int status)
{
    const char *msg = lt_last_error();
    srv_respond_json(rs, status,
                     srv_error_json(status, srv_last_param(), srv_last_code(),
                                    *msg ? msg : "the request failed"));
}

int srv_path_in_dir(const char *dir, const char *name, const char *ext, const char *param,
                    char *path, size_t path_size)
{
    if (!dir)
        return srv_fail(403, param, "no_train_dir",
                        "the server was started without --train-dir, so files cannot be "
                        "named in requests");
    size_t n = strlen(name), ne = strlen(ext);
    if (n == 0 || n > 200)
        return srv_fail(400, param, "invalid_name", "'%s' must be a file name of 1..200 bytes",
                        param);
    if (strchr(name, '/') || strchr(name, '\\') || strstr(name, ".."))
        return srv_fail(400, param, "invalid_name",
                        "'%s' must be a plain file name inside the train dir, without '/', "
                        "'\\' or '..'", param);
    if (name[0] == '.')
        return srv_fail(400, param, "invalid_name", "'%s' must not start with '.'", param);
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok)
            return srv_fail(400, param, "invalid_name",
                            "'%s' may use only letters, digits, '.', '_' and '-'", param);
    }
    if (n <= ne || strcmp(name + n - ne, ext) != 0)
        return srv_fail(400, param, "invalid_name", "'%s' must end in %s", param, ext);
    int w = snprintf(path, path_size, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= path_size)
        return srv_fail(400, param, "invalid_name", "'%s' makes too long a path", param);
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        char real_dir[PATH_MAX], real_file[PATH_MAX];
        size_t nd;
        if (!realpath(dir, real_dir) || !realpath(path, real_file) ||
            strncmp(real_file, real_dir, nd = strlen(real_dir)) != 0 || real_file[nd] != '/')
            return srv_fail(400, param, "invalid_name",
                            "'%s' is a link that leads out of the train dir", param);
    }
    return 200;
}

#endif
