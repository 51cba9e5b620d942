/* http.c: the HTTP layer over libmicrohttpd: one thread per connection, request bodies up to
 * a cap, the guard once headers are in, dispatch to srv_route, full and streamed responses.
 *
 * The cap is max_body_bytes, or max_upload_bytes for an upload (POST /v1/files): it is
 * chosen from the request head, and bytes past it are never kept, only counted. At most
 * SRV_MAX_UPLOADS uploads are read at once (503 for one more), which bounds what they hold.
 *
 * Each connection has its own thread, so a route may block (waiting for a generation) and a
 * stream's fill may wait for the next tokens; /health never waits behind them. A body over
 * the cap is read and dropped (so the client, which is still sending, gets its 413 instead
 * of a reset), up to a drain limit past which the connection is closed; so is the body of
 * a request the guard refused (srv_route_admit), whose answer waits until it is in. A
 * client that closes its end is noticed by srv_conn_alive (poll for hang-up, peek for EOF)
 * between waits, so an abandoned generation is cancelled within ~100 ms rather than at its
 * end.
 *
 * Header deadline. libmicrohttpd's connection timeout counts idle time, and every trickled
 * header line resets it, so a few hundred slow clients could hold every connection (and
 * /health) for ever. A watchdog thread therefore gives each connection header_timeout_s,
 * from when it opened or its previous request ended, to deliver a complete request head;
 * past it the socket is shut down, which wakes libmicrohttpd's thread to close it. The
 * watch list is kept by the connection callbacks, which libmicrohttpd calls before it
 * closes the socket, so the watchdog never shuts down a descriptor reused by another.
 *
 * Framing. libmicrohttpd answers a Content-Length it cannot parse (-1, +5, "5, 5") with its
 * own 400; it reads a body by the first of several Content-Length headers, so duplicates,
 * or Content-Length beside Transfer-Encoding, or two Host headers, get a 400 here and the
 * connection is closed: a body whose length two parties could read differently must not be
 * read at all. */
/* POLLRDHUP needs _GNU_SOURCE, which the build defines for every file */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server_impl.h"

#ifndef POLLRDHUP
#define POLLRDHUP 0
#endif

#ifdef LATHE_HAVE_MHD
#include <microhttpd.h>

#define SRV_DRAIN_LIMIT ((size_t)64 << 20) /* dropped body bytes tolerated past the cap */

#define SRV_HEADER_TIMEOUT_S 10.0
#define SRV_WATCH_PERIOD_NS (100 * 1000 * 1000) /* how often the watchdog looks */

/* An open connection, from accept to close. */
struct conn_watch {
    struct conn_watch *prev, *next;
    int fd;
    double deadline; /* monotonic seconds by which a request head must be in; 0: none */
};

struct srv_http {
    struct MHD_Daemon *d;
    struct srv_app *app;
    int port;
    double header_timeout_s;
    /* the watch list and its watchdog (watch_mu) */
    pthread_mutex_t watch_mu;
    pthread_cond_t watch_cv;
    struct conn_watch *watched;
    bool stopping;
    pthread_t watchdog;
};

/* One request, from its first header to its completion. */
struct req_ctx {
    char method[16];
    char *path;
    struct lt_strbuf body;
    size_t received;
    size_t cap;       /* the most body bytes kept (srv_route_body_cap) */
    bool upload;      /* POST /v1/files: cap is max_upload_bytes */
    bool upload_slot; /* counted in app->uploads_receiving until it completes */
    bool too_large;
    bool refused;               /* the guard answered it: its body is dropped */
    struct srv_response answer; /* that answer, sent once the body is in */
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
    for (int i = 0; i < rs->n_headers; i++)
        MHD_add_response_header(r, rs->headers[i].name, rs->headers[i].value);
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
    if (status == 400)
        srv_response_header(&rs, "Connection", "close");
    rc->status = status;
    count_status(h->app, status);
    return send_response(c, &rs);
}

/* ---- the header deadline ---- */

static struct conn_watch *watch_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* The connection's next request head is due `timeout` seconds from now (0: no deadline). */
static void watch_set(struct srv_http *h, struct MHD_Connection *c, double timeout)
{
    struct conn_watch *w = watch_of(c);
    if (!w)
        return;
    pthread_mutex_lock(&h->watch_mu);
    w->deadline = timeout > 0 ? srv_now_mono() + timeout : 0;
    pthread_mutex_unlock(&h->watch_mu);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct srv_http *h = cls;
    struct conn_watch *w = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (!w)
            return;
        pthread_mutex_lock(&h->watch_mu);
        if (w->prev)
            w->prev->next = w->next;
        else
            h->watched = w->next;
        if (w->next)
            w->next->prev = w->prev;
        pthread_mutex_unlock(&h->watch_mu);
        free(w);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    w = calloc(1, sizeof(*w));
    if (!w || !ci) { /* a connection nobody watches is one nobody may hold */
        free(w);
        if (ci)
            shutdown(ci->connect_fd, SHUT_RDWR);
        return;
    }
    w->fd = ci->connect_fd;
    w->deadline = srv_now_mono() + h->header_timeout_s;
    pthread_mutex_lock(&h->watch_mu);
    w->next = h->watched;
    if (w->next)
        w->next->prev = w;
    h->watched = w;
    pthread_mutex_unlock(&h->watch_mu);
    *socket_context = w;
}

/* Under watch_mu: shuts down every connection past its deadline; returns how many. */
static int watch_expire(struct srv_http *h, double now)
{
    int n = 0;
    for (struct conn_watch *w = h->watched; w; w = w->next) {
        if (w->deadline > 0 && now >= w->deadline) {
            shutdown(w->fd, SHUT_RDWR);
            w->deadline = 0;
            n++;
        }
    }
    return n;
}

static void *watchdog_main(void *arg)
{
    struct srv_http *h = arg;
    pthread_mutex_lock(&h->watch_mu);
    while (!h->stopping) {
        int n = watch_expire(h, srv_now_mono());
        if (n > 0) {
            pthread_mutex_lock(&h->app->stats_mu);
            h->app->header_timeouts += (uint64_t)n;
            pthread_mutex_unlock(&h->app->stats_mu);
            if (!h->app->quiet)
                fprintf(stderr, "lathe serve: closed %d connection(s) whose request headers "
                        "or body did not arrive within %.1f s\n", n, h->header_timeout_s);
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += SRV_WATCH_PERIOD_NS;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->watch_cv, &h->watch_mu, &until);
    }
    pthread_mutex_unlock(&h->watch_mu);
    return NULL;
}

/* ---- requests ---- */

struct header_counts {
    int content_length, transfer_encoding, host;
};

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    struct header_counts *n = cls;
    n->content_length += !strcasecmp(key, "Content-Length");
    n->transfer_encoding += !strcasecmp(key, "Transfer-Encoding");
    n->host += !strcasecmp(key, "Host");
    return MHD_YES;
}

/* Why the request's length or target is ambiguous; NULL when it is not. */
static const char *framing_problem(struct MHD_Connection *c)
{
    struct header_counts n = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &n);
    if (n.content_length > 1)
        return "the request has more than one Content-Length header";
    if (n.content_length > 0 && n.transfer_encoding > 0)
        return "the request has both Content-Length and Transfer-Encoding";
    if (n.host > 1)
        return "the request has more than one Host header";
    return NULL;
}

/* The request as the routes see it (the body is added once it is in). */
static struct srv_request request_of(struct MHD_Connection *c, const struct req_ctx *rc)
{
    return (struct srv_request){
        .method = rc->method,
        .path = rc->path,
        .body = rc->body.data ? rc->body.data : "",
        .body_len = rc->body.len,
        .body_too_large = rc->too_large,
        .conn = (struct srv_conn *)c,
        .host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"),
        .origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"),
        .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
        .content_type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"),
        .acr_headers =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers"),
    };
}

/* The guard's answer to a refused request, now. */
static enum MHD_Result send_refusal(struct srv_http *h, struct MHD_Connection *c,
                                    struct req_ctx *rc)
{
    rc->status = rc->answer.status;
    count_status(h->app, rc->status);
    return send_response(c, &rc->answer);
}

/* Counts rc among the uploads being received; false when SRV_MAX_UPLOADS already are. */
static bool upload_slot_take(struct srv_app *app, struct req_ctx *rc)
{
    pthread_mutex_lock(&app->stats_mu);
    rc->upload_slot = app->uploads_receiving < SRV_MAX_UPLOADS;
    app->uploads_receiving += rc->upload_slot;
    pthread_mutex_unlock(&app->stats_mu);
    return rc->upload_slot;
}

/* 413 before the body is in, naming the cap that applied. */
static enum MHD_Result send_too_large(struct srv_http *h, struct MHD_Connection *c,
                                      struct req_ctx *rc)
{
    char msg[160];
    snprintf(msg, sizeof(msg), "the request body is larger than the %zu bytes the server accepts%s",
             rc->cap, rc->upload ? " for an upload (--max-upload-mib)" : "");
    return send_early_error(h, c, rc, 413, "body_too_large", msg);
}

/* The request head is in: a new context, framing and the guard checked. The deadline moves
 * to the body: a request with one must keep sending it, at most the header timeout between
 * two pieces (else a client that declares a body and stalls holds the connection for
 * libmicrohttpd's idle timeout, 120 s, as a trickled head did); one without has none until
 * it is answered. */
static enum MHD_Result on_request_head(struct srv_http *h, struct MHD_Connection *c,
                                       const char *url, const char *method, void **con_cls)
{
    struct srv_app *app = h->app;
    struct req_ctx *rc = calloc(1, sizeof(*rc));
    if (!rc)
        return MHD_NO;
    snprintf(rc->method, sizeof(rc->method), "%s", method);
    rc->path = strdup(url ? url : "/");
    rc->t0 = srv_now_mono();
    *con_cls = rc;
    if (!rc->path)
        return MHD_NO;
    const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
    const char *length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    bool body = te || (length && strtoull(length, NULL, 10) > 0);
    watch_set(h, c, body ? h->header_timeout_s : 0);
    const char *bad = framing_problem(c);
    if (bad)
        return send_early_error(h, c, rc, 400, "invalid_request", bad);
    const char *ex = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Expect");
    bool expects_continue = ex && !strcasecmp(ex, "100-continue");
    struct srv_request rq = request_of(c, rc);
    rc->cap = srv_route_body_cap(app, &rq, &rc->upload);
    if (!srv_route_admit(app, &rq, &rc->answer)) {
        rc->refused = true;
        /* a client waiting for "100 Continue" hears the refusal instead */
        return expects_continue ? send_refusal(h, c, rc) : MHD_YES;
    }
    if (rc->upload && !upload_slot_take(app, rc)) {
        srv_respond_error(&rc->answer, 503, NULL, "too_many_uploads",
                          "%d uploads are being received already; try again when one is done",
                          SRV_MAX_UPLOADS);
        rc->refused = true; /* answered once its body is in, like the guard's refusals */
        return expects_continue ? send_refusal(h, c, rc) : MHD_YES;
    }
    /* A client that waits for "100 Continue" can be told at once. */
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && expects_continue && strtoull(cl, NULL, 10) > rc->cap)
        return send_too_large(h, c, rc);
    return MHD_YES;
}

/* A piece of the body: kept, or dropped (too large, refused, answered). */
static enum MHD_Result on_request_body(struct srv_http *h, struct MHD_Connection *c,
                                       struct req_ctx *rc, const char *data, size_t n)
{
    watch_set(h, c, h->header_timeout_s); /* the next piece is due within it */
    if (rc->status != 0)
        return MHD_YES; /* answered already: drop the rest */
    rc->received += n;
    bool drop = rc->too_large || rc->refused;
    if (!drop && rc->body.len + n <= rc->cap) {
        if (lt_strbuf_append(&rc->body, data, n) != LT_OK)
            return send_early_error(h, c, rc, 503, "out_of_memory",
                                    "out of memory for the request body");
    } else if (!drop) {
        rc->too_large = true;
        lt_strbuf_free(&rc->body);
    }
    if (rc->received > rc->cap + SRV_DRAIN_LIMIT)
        return rc->refused ? send_refusal(h, c, rc) : send_too_large(h, c, rc);
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct srv_http *h = cls;
    struct req_ctx *rc = *con_cls;
    if (!rc)
        return on_request_head(h, c, url, method, con_cls);
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return on_request_body(h, c, rc, upload_data, n);
    }
    watch_set(h, c, 0); /* all in: no deadline while it is answered (a long generation) */
    if (rc->status != 0)
        return MHD_YES; /* answered already */
    if (rc->refused)
        return send_refusal(h, c, rc);
    struct srv_request rq = request_of(c, rc);
    struct srv_response rs = {0};
    srv_route(h->app, &rq, &rs);
    if (rs.status == 0)
        srv_respond_error(&rs, 500, NULL, "internal_error", "the route gave no answer");
    rc->status = rs.status;
    count_status(h->app, rs.status);
    return send_response(c, &rs);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct srv_http *h = cls;
    struct req_ctx *rc = *con_cls;
    watch_set(h, c, h->header_timeout_s); /* for the next request on this connection */
    if (!rc)
        return;
    if (!h->app->quiet && rc->status != 0)
        fprintf(stderr, "lathe serve: %s %s %d %.3fs%s\n", rc->method, rc->path ? rc->path : "",
                rc->status, srv_now_mono() - rc->t0,
                toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
    if (rc->upload_slot) {
        pthread_mutex_lock(&h->app->stats_mu);
        h->app->uploads_receiving--;
        pthread_mutex_unlock(&h->app->stats_mu);
    }
    lt_strbuf_free(&rc->answer.body); /* an answer never sent */
    lt_strbuf_free(&rc->body);
    free(rc->path);
    free(rc);
    *con_cls = NULL;
}

/* The listening address: host (numeric IPv4 or IPv6) and port into a4 or a6. */
static struct sockaddr *address_of(const char *host, int port, struct sockaddr_in *a4,
                                   struct sockaddr_in6 *a6, bool *ipv6)
{
    *ipv6 = false;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        return (struct sockaddr *)a4;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *ipv6 = true;
        return (struct sockaddr *)a6;
    }
    return NULL;
}

static lt_status watchdog_start(struct srv_http *h)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->watch_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&h->watch_mu, NULL);
    if (pthread_create(&h->watchdog, NULL, watchdog_main, h) != 0) {
        pthread_mutex_destroy(&h->watch_mu);
        pthread_cond_destroy(&h->watch_cv);
        return lt_fail(LT_ERR_NOMEM, "cannot start the HTTP server's watchdog thread");
    }
    return LT_OK;
}

static void watchdog_stop(struct srv_http *h)
{
    pthread_mutex_lock(&h->watch_mu);
    h->stopping = true;
    pthread_cond_broadcast(&h->watch_cv);
    pthread_mutex_unlock(&h->watch_mu);
    pthread_join(h->watchdog, NULL);
}

lt_status srv_http_start(struct srv_app *app, const char *host, int port, int max_connections,
                         struct srv_http **out)
{
    *out = NULL;
    if (port < 0 || port > 65535)
        return lt_fail(LT_ERR_INVALID, "port %d is not 0..65535", port);
    struct sockaddr_in a4 = {0};
    struct sockaddr_in6 a6 = {0};
    bool ipv6;
    if (!host)
        host = "127.0.0.1";
    struct sockaddr *sa = address_of(host, port, &a4, &a6, &ipv6);
    if (!sa)
        return lt_fail(LT_ERR_INVALID, "host '%s' is not a numeric IPv4 or IPv6 address", host);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_AUTO | MHD_USE_ITC | (app->quiet ? 0 : MHD_USE_ERROR_LOG) |
                     (ipv6 ? MHD_USE_IPv6 : 0);
    struct srv_http *h = calloc(1, sizeof(*h));
    if (!h)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the HTTP server");
    h->app = app;
    h->header_timeout_s = app->header_timeout_s > 0 ? app->header_timeout_s
                                                    : SRV_HEADER_TIMEOUT_S;
    lt_status st = watchdog_start(h);
    if (st != LT_OK)
        goto out_free_http;
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h,
                            MHD_OPTION_SOCK_ADDR, sa,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)(max_connections > 0 ? max_connections : 256),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, /* idle, once a
                                                                           * head is in */
                            MHD_OPTION_THREAD_STACK_SIZE, (size_t)2 << 20,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)128 * 1024,
                            MHD_OPTION_END);
    if (!h->d) {
        st = lt_fail(LT_ERR_IO, "cannot listen on %s port %d (in use, or not an address of "
                     "this machine?)", host, port);
        goto out_stop_watchdog;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di && di->port ? di->port : port;
    *out = h;
    return LT_OK;

out_stop_watchdog:
    watchdog_stop(h);
    pthread_mutex_destroy(&h->watch_mu);
    pthread_cond_destroy(&h->watch_cv);
out_free_http:
    free(h);
    return st;
}

int srv_http_port(const struct srv_http *h)
{
    return h->port;
}

void srv_http_stop(struct srv_http *h)
{
    if (!h)
        return;
    watchdog_stop(h);
    MHD_stop_daemon(h->d); /* each connection's close callback empties the watch list */
    pthread_mutex_destroy(&h->watch_mu);
    pthread_cond_destroy(&h->watch_cv);
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
