/* http.c: the HTTP layer over libmicrohttpd: one thread per connection, request bodies up to
 * a cap, dispatch to srv_route, full and streamed responses.
 *
 * Each connection has its own thread, so a route may block (waiting for a generation) and a
 * stream's fill may wait for the next tokens; /health never waits behind them. A body over
 * the cap is read and dropped (so the client, which is still sending, gets its 413 instead
 * of a reset), up to a drain limit past which the connection is closed. A client that
 * closes its end is noticed by srv_conn_alive (poll for hang-up, peek for EOF) between
 * waits, so an abandoned generation is cancelled within ~100 ms rather than at its end. */
/* POLLRDHUP needs _GNU_SOURCE, which the build defines for every file */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/server_impl.h"

#ifndef POLLRDHUP
#define POLLRDHUP 0
#endif

#ifdef LATHE_HAVE_MHD
#include <microhttpd.h>

#define SRV_DRAIN_LIMIT ((size_t)64 << 20) /* dropped body bytes tolerated past the cap */

struct srv_http {
    struct MHD_Daemon *d;
    struct srv_app *app;
    int port;
};

/* One request, from its first header to its completion. */
struct req_ctx {
    char method[16];
    char *path;
    struct lt_strbuf body;
    size_t received;
    bool too_large;
    int status;
    double t0;
};

/* A streamed response in flight. */
struct stream_ctx {
    struct srv_stream s;
    struct MHD_Connection *c;
    struct lt_strbuf pending;
    size_t off;
    bool end;
};

bool srv_conn_alive(struct srv_conn *conn)
{
    struct MHD_Connection *c = (struct MHD_Connection *)conn;
    if (!c)
        return true;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    int n = poll(&p, 1, 0);
    if (n < 0)
        return errno == EINTR;
    if (n == 0)
        return true;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP))
        return false;
    /* readable: either the client sent more (pipelining) or its end closed (EOF) */
    char b;
    ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream_ctx *sc = cls;
    for (;;) {
        if (sc->off < sc->pending.len) {
            size_t n = sc->pending.len - sc->off;
            n = n < max ? n : max;
            memcpy(buf, sc->pending.data + sc->off, n);
            sc->off += n;
            return (ssize_t)n;
        }
        if (sc->end)
            return MHD_CONTENT_READER_END_OF_STREAM;
        sc->pending.len = 0;
        sc->off = 0;
        if (!sc->s.fill(sc->s.user, (struct srv_conn *)sc->c, &sc->pending, &sc->end))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void stream_free(void *cls)
{
    struct stream_ctx *sc = cls;
    if (sc->s.free)
        sc->s.free(sc->s.user);
    lt_strbuf_free(&sc->pending);
    free(sc);
}

static void count_status(struct srv_app *app, int status)
{
    int cls = status / 100;
    pthread_mutex_lock(&app->stats_mu);
    app->http_requests[cls >= 1 && cls <= 5 ? cls : 0]++;
    pthread_mutex_unlock(&app->stats_mu);
}

/* Hands rs to MHD; consumes rs's body or stream either way. */
static enum MHD_Result send_response(struct MHD_Connection *c, struct srv_response *rs)
{
    struct MHD_Response *r = NULL;
    if (rs->is_stream) {
        struct stream_ctx *sc = calloc(1, sizeof(*sc));
        if (!sc) {
            rs->stream.free(rs->stream.user);
            return MHD_NO;
        }
        sc->s = rs->stream;
        sc->c = c;
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, sc,
                                              stream_free);
        if (!r) {
            stream_free(sc);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Cache-Control", "no-cache");
    } else if (rs->body.len > 0) {
        r = MHD_create_response_from_buffer(rs->body.len, rs->body.data, MHD_RESPMEM_MUST_FREE);
        if (!r) {
            lt_strbuf_free(&rs->body);
            return MHD_NO;
        }
        memset(&rs->body, 0, sizeof(rs->body)); /* MHD frees it */
    } else {
        lt_strbuf_free(&rs->body);
        r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!r)
            return MHD_NO;
    }
    if (rs->content_type)
        MHD_add_response_header(r, "Content-Type", rs->content_type);
    if (rs->allow[0])
        MHD_add_response_header(r, "Allow", rs->allow);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)rs->status, r);
    MHD_destroy_response(r);
    return ret;
}

/* An error answered before the body was read (no route involved). */
static enum MHD_Result send_early_error(struct srv_http *h, struct MHD_Connection *c,
                                        struct req_ctx *rc, int status, const char *code,
                                        const char *msg)
{
    struct srv_response rs = {0};
    srv_respond_error(&rs, status, NULL, code, "%s", msg);
    rc->status = status;
    count_status(h->app, status);
    return send_response(c, &rs);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct srv_http *h = cls;
    struct srv_app *app = h->app;
    struct req_ctx *rc = *con_cls;
    if (!rc) {
        rc = calloc(1, sizeof(*rc));
        if (!rc)
            return MHD_NO;
        snprintf(rc->method, sizeof(rc->method), "%s", method);
        rc->path = strdup(url ? url : "/");
        rc->t0 = srv_now_mono();
        *con_cls = rc;
        if (!rc->path)
            return MHD_NO;
        /* A client that waits for "100 Continue" can be told at once. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        const char *ex = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect");
        if (cl && ex && !strcasecmp(ex, "100-continue") &&
            strtoull(cl, NULL, 10) > app->max_body_bytes)
            return send_early_error(h, c, rc, 413, "body_too_large",
                                    "the request body is larger than the server accepts");
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (rc->status != 0)
            return MHD_YES; /* answered already: drop the rest */
        rc->received += n;
        if (!rc->too_large && rc->body.len + n <= app->max_body_bytes) {
            if (lt_strbuf_append(&rc->body, upload_data, n) != LT_OK)
                return send_early_error(h, c, rc, 503, "out_of_memory",
                                        "out of memory for the request body");
        } else if (!rc->too_large) {
            rc->too_large = true;
            lt_strbuf_free(&rc->body);
        }
        if (rc->too_large && rc->received > app->max_body_bytes + SRV_DRAIN_LIMIT)
            return send_early_error(h, c, rc, 413, "body_too_large",
                                    "the request body is larger than the server accepts");
        return MHD_YES;
    }
    if (rc->status != 0)
        return MHD_YES; /* answered already */

    struct srv_request rq = {
        .method = rc->method,
        .path = rc->path,
        .body = rc->body.data ? rc->body.data : "",
        .body_len = rc->body.len,
        .body_too_large = rc->too_large,
        .conn = (struct srv_conn *)c,
    };
    struct srv_response rs = {0};
    srv_route(app, &rq, &rs);
    if (rs.status == 0)
        srv_respond_error(&rs, 500, NULL, "internal_error", "the route gave no answer");
    rc->status = rs.status;
    count_status(app, rs.status);
    return send_response(c, &rs);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct srv_http *h = cls;
    struct req_ctx *rc = *con_cls;
    if (!rc)
        return;
    if (!h->app->quiet && rc->status != 0)
        fprintf(stderr, "lathe serve: %s %s %d %.3fs%s\n", rc->method, rc->path ? rc->path : "",
                rc->status, srv_now_mono() - rc->t0,
                toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
    lt_strbuf_free(&rc->body);
    free(rc->path);
    free(rc);
    *con_cls = NULL;
}

lt_status srv_http_start(struct srv_app *app, const char *host, int port, int max_connections,
                         struct srv_http **out)
{
    *out = NULL;
    if (port < 0 || port > 65535)
        return lt_fail(LT_ERR_INVALID, "port %d is not 0..65535", port);
    struct sockaddr_in a4 = {0};
    struct sockaddr_in6 a6 = {0};
    struct sockaddr *sa;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_AUTO | MHD_USE_ITC | (app->quiet ? 0 : MHD_USE_ERROR_LOG);
    if (!host)
        host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        return lt_fail(LT_ERR_INVALID, "host '%s' is not a numeric IPv4 or IPv6 address", host);
    }
    struct srv_http *h = calloc(1, sizeof(*h));
    if (!h)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the HTTP server");
    h->app = app;
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, sa,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)(max_connections > 0 ? max_connections : 256),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, /* idle keep-alive */
                            MHD_OPTION_THREAD_STACK_SIZE, (size_t)2 << 20,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)128 * 1024,
                            MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return lt_fail(LT_ERR_IO, "cannot listen on %s port %d (in use, or not an address of "
                       "this machine?)", host, port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di && di->port ? di->port : port;
    *out = h;
    return LT_OK;
}

int srv_http_port(const struct srv_http *h)
{
    return h->port;
}

void srv_http_stop(struct srv_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d);
    free(h);
}

#else /* !LATHE_HAVE_MHD */

bool srv_conn_alive(struct srv_conn *conn)
{
    return true;
}

lt_status srv_http_start(struct srv_app *app, const char *host, int port, int max_connections,
                         struct srv_http **out)
{
    *out = NULL;
    return lt_fail(LT_ERR_UNSUPPORTED, "this build has no HTTP server (libmicrohttpd was not "
                   "found when it was configured)");
}

int srv_http_port(const struct srv_http *h)
{
    return 0;
}

void srv_http_stop(struct srv_http *h)
{
}

#endif
