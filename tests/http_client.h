/* http_client.h: a tiny HTTP/1.0 client over a loopback socket, for the server tests. A
 * request is written as given (the headers chosen by the caller, or the usual Host and JSON
 * Content-Type), so tests can send what no library would: a NUL request line, trickled
 * header lines, duplicate Content-Length, foreign Host and Origin headers. A reply is read
 * to EOF (HTTP/1.0: the server closes after answering). */
#ifndef LATHE_TESTS_HTTP_CLIENT_H
#define LATHE_TESTS_HTTP_CLIENT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "lathe/tokenizer.h" /* struct lt_strbuf */

struct http_reply {
    int status;
    char headers[4096];
    char *body; /* NUL-terminated, malloc'd */
    size_t body_len;
};

/* The headers a JSON request carries when the caller names none. */
#define HTTP_JSON_HEADERS "Host: 127.0.0.1\r\nContent-Type: application/json\r\n"

static inline int http_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline bool send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Sends a request whose header lines (each ending in "\r\n", Content-Length excepted) are
 * `headers`; body may be NULL. Returns the connected socket or -1. */
static inline int http_send_ex(int port, const char *method, const char *path, const char *headers,
                               const char *body, size_t body_len)
{
    int fd = http_connect(port);
    if (fd < 0)
        return -1;
    char head[2048];
    int n = snprintf(head, sizeof(head), "%s %s HTTP/1.0\r\n%sContent-Length: %zu\r\n\r\n", method,
                     path, headers, body ? body_len : 0);
    if (n < 0 || (size_t)n >= sizeof(head) || !send_all(fd, head, (size_t)n) ||
        (body && !send_all(fd, body, body_len))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends a JSON request (body may be NULL); returns the connected socket or -1. */
static inline int http_send(int port, const char *method, const char *path, const char *body,
                            size_t body_len)
{
    return http_send_ex(port, method, path, HTTP_JSON_HEADERS, body, body_len);
}

/* Reads the whole reply (to EOF) from fd and closes it. */
static inline bool http_read(int fd, struct http_reply *r)
{
    memset(r, 0, sizeof(*r));
    struct lt_strbuf b = {0};
    char buf[8192];
    ssize_t k;
    while ((k = recv(fd, buf, sizeof(buf), 0)) > 0)
        lt_strbuf_append(&b, buf, (size_t)k);
    close(fd);
    if (!b.data)
        return false;
    char *sep = strstr(b.data, "\r\n\r\n");
    if (!sep || sscanf(b.data, "HTTP/1.%*d %d", &r->status) != 1) {
        lt_strbuf_free(&b);
        return false;
    }
    size_t hl = (size_t)(sep - b.data);
    snprintf(r->headers, sizeof(r->headers), "%.*s", (int)(hl < 4000 ? hl : 4000), b.data);
    r->body_len = b.len - hl - 4;
    r->body = malloc(r->body_len + 1);
    memcpy(r->body, sep + 4, r->body_len);
    r->body[r->body_len] = 0;
    lt_strbuf_free(&b);
    return true;
}

/* One request with the caller's header lines; false when nothing came back. */
static inline bool http_do_ex(int port, const char *method, const char *path, const char *headers,
                              const char *body, struct http_reply *r)
{
    int fd = http_send_ex(port, method, path, headers, body, body ? strlen(body) : 0);
    if (fd < 0) {
        memset(r, 0, sizeof(*r));
        return false;
    }
    return http_read(fd, r);
}

static inline bool http_do(int port, const char *method, const char *path, const char *body,
                           struct http_reply *r)
{
    return http_do_ex(port, method, path, HTTP_JSON_HEADERS, body, r);
}

/* Sends bytes as they are (a whole request, or the start of one); returns the socket or -1. */
static inline int http_send_raw(int port, const char *bytes, size_t n)
{
    int fd = http_connect(port);
    if (fd >= 0 && !send_all(fd, bytes, n)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The value of header `name` in r (case-insensitive), copied to out; false when absent. */
static inline bool http_header(const struct http_reply *r, const char *name, char *out, size_t size)
{
    size_t n = strlen(name);
    for (const char *line = r->headers; line && *line;) {
        if (!strncasecmp(line, name, n) && line[n] == ':') {
            const char *v = line + n + 1;
            while (*v == ' ')
                v++;
            size_t len = strcspn(v, "\r\n");
            snprintf(out, size, "%.*s", (int)len, v);
            return true;
        }
        line = strstr(line, "\r\n");
        line = line ? line + 2 : NULL;
    }
    return false;
}

static inline void http_reply_free(struct http_reply *r)
{
    free(r->body);
    r->body = NULL;
}

#endif
