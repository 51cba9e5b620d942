/* guard.c: who may call which route, decided once a request's headers are in, before its
 * body is read.
 *
 * In order: a CORS preflight (OPTIONS) is answered here; /health is open to everyone; with
 * no API key the Host header must name this server (loopback, the bound address, or a name
 * given with --allowed-hosts), which is what defeats DNS rebinding (a page whose own name
 * now resolves to 127.0.0.1 still sends Host: its-name); a cross-origin Origin must be
 * listed (--cors); with keys, "Authorization: Bearer KEY" must carry one of them (/metrics
 * excepted with --metrics-public, and GET /, the web page); a state-changing route must be
 * sent as JSON, which no HTML form and no CORS-free fetch can do (but for DELETE and the
 * multipart upload of POST /v1/files: body_type_accepted says why).
 *
 * Keys are compared in time that depends on the key's length only, never on how much of
 * it a guess got right, and every key is compared so the time does not say which matched. */
#ifdef LATHE_HAVE_JANSSON
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lathe/server.h"
#include "server/server_impl.h"

#define GUARD_MAX_KEY 512

/* ---- setting up ---- */

bool srv_host_is_loopback(const char *host)
{
    if (!host)
        return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

/* A key is printable ASCII without spaces: what fits in "Authorization: Bearer KEY". */
static bool key_valid(const char *k, size_t n)
{
    if (n == 0 || n > GUARD_MAX_KEY)
        return false;
    for (size_t i = 0; i < n; i++)
        if (k[i] <= 0x20 || k[i] >= 0x7f)
            return false;
    return true;
}

/* Appends a copy of s[0..n) to (*list)[*n]. */
static lt_status list_add(char ***list, int *count, const char *s, size_t n)
{
    char **grown = realloc(*list, (size_t)(*count + 1) * sizeof(char *));
    if (!grown)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the server's settings");
    *list = grown;
    char *copy = malloc(n + 1);
    if (!copy)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the server's settings");
    memcpy(copy, s, n);
    copy[n] = 0;
    grown[(*count)++] = copy;
    return LT_OK;
}

static void list_free(char **list, int n)
{
    for (int i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

static lt_status keys_from_file(struct srv_guard *g, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return lt_fail(LT_ERR_IO, "--api-key-file %s: %s", path, strerror(errno));
    char line[GUARD_MAX_KEY + 8];
    int lineno = 0, before = g->n_keys;
    lt_status st = LT_OK;
    while (st == LT_OK && fgets(line, sizeof(line), f)) {
        lineno++;
        size_t n = strlen(line);
        if (n == sizeof(line) - 1 && line[n - 1] != '\n') {
            st = lt_fail(LT_ERR_INVALID, "--api-key-file %s: line %d is longer than %d bytes", path,
                         lineno, GUARD_MAX_KEY);
            break;
        }
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        n = strlen(s);
        while (n > 0 &&
               (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
            n--;
        if (n == 0 || s[0] == '#')
            continue;
        if (!key_valid(s, n))
            st = lt_fail(LT_ERR_INVALID,
                         "--api-key-file %s: the key on line %d has a space or "
                         "a character that is not printable ASCII",
                         path, lineno);
        else
            st = list_add(&g->keys, &g->n_keys, s, n);
    }
    if (st == LT_OK && ferror(f))
        st = lt_fail(LT_ERR_IO, "--api-key-file %s: cannot read it", path);
    if (st == LT_OK && g->n_keys == before)
        st = lt_fail(LT_ERR_INVALID, "--api-key-file %s holds no key", path);
    fclose(f);
    return st;
}

/* Copies each of the comma-separated names in the items into *list (origins lose a
 * trailing '/'). */
static lt_status names_add(char ***list, int *count, const char *const *items, int n,
                           const char *flag)
{
    for (int i = 0; i < n; i++) {
        for (const char *s = items[i]; *s;) {
            size_t len = strcspn(s, ",");
            size_t keep = len;
            while (keep > 0 && (s[keep - 1] == '/' || s[keep - 1] == ' '))
                keep--;
            const char *start = s;
            while (keep > 0 && *start == ' ') {
                start++;
                keep--;
            }
            if (keep == 0 || keep > 255)
                return lt_fail(LT_ERR_INVALID, "%s '%s': an empty or too long name", flag,
                               items[i]);
            lt_status st = list_add(list, count, start, keep);
            if (st != LT_OK)
                return st;
            s += len + (s[len] == ',');
        }
    }
    return LT_OK;
}

lt_status srv_guard_init(struct srv_guard *g, const struct lt_server_params *p)
{
    memset(g, 0, sizeof(*g));
    snprintf(g->bind_host, sizeof(g->bind_host), "%s", p->host ? p->host : "127.0.0.1");
    g->metrics_public = p->metrics_public;
    lt_status st = LT_OK;
    for (int i = 0; st == LT_OK && i < p->n_api_keys; i++) {
        const char *k = p->api_keys[i] ? p->api_keys[i] : "";
        if (!key_valid(k, strlen(k)))
            st = lt_fail(LT_ERR_INVALID,
                         "--api-key must be 1..%d printable ASCII characters "
                         "without spaces",
                         GUARD_MAX_KEY);
        else
            st = list_add(&g->keys, &g->n_keys, k, strlen(k));
    }
    if (st == LT_OK && p->api_key_file)
        st = keys_from_file(g, p->api_key_file);
    if (st == LT_OK)
        st = names_add(&g->origins, &g->n_origins, p->cors_origins, p->n_cors_origins, "--cors");
    if (st == LT_OK)
        st = names_add(&g->hosts, &g->n_hosts, p->allowed_hosts, p->n_allowed_hosts,
                       "--allowed-hosts");
    if (st != LT_OK)
        srv_guard_free(g);
    return st;
}

void srv_guard_free(struct srv_guard *g)
{
    for (int i = 0; i < g->n_keys; i++) /* no key left behind in freed memory */
        memset(g->keys[i], 0, strlen(g->keys[i]));
    list_free(g->keys, g->n_keys);
    list_free(g->origins, g->n_origins);
    list_free(g->hosts, g->n_hosts);
    memset(g, 0, sizeof(*g));
}

/* ---- the checks ---- */

/* Equal, in time that depends on the key's length only. */
static bool key_equal(const char *given, size_t n_given, const char *key)
{
    size_t n = strlen(key);
    volatile unsigned char diff = n_given != n;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < n_given ? given[i] : 0);
    return diff == 0;
}

/* The token of "Bearer TOKEN" (scheme in any case); NULL when the header is not that. */
static const char *bearer_token(const char *auth, size_t *n)
{
    if (!auth)
        return NULL;
    while (*auth == ' ')
        auth++;
    if (strncasecmp(auth, "Bearer ", 7) != 0)
        return NULL;
    const char *t = auth + 7;
    while (*t == ' ')
        t++;
    size_t len = strlen(t);
    while (len > 0 && t[len - 1] == ' ')
        len--;
    *n = len;
    return len ? t : NULL;
}

static bool key_accepted(const struct srv_guard *g, const char *auth)
{
    size_t n = 0;
    const char *t = bearer_token(auth, &n);
    bool ok = false;
    for (int i = 0; i < g->n_keys; i++) /* all of them, whichever matches */
        ok |= key_equal(t ? t : "", t ? n : 0, g->keys[i]);
    return t && ok;
}

/* Splits a Host value into its name (IPv6 without brackets) and whether a port follows;
 * false when it is not name[:digits]. */
static bool host_split(const char *host, char *name, size_t size, const char **port)
{
    const char *end;
    const char *start = host;
    if (host[0] == '[') {
        end = strchr(host, ']');
        if (!end)
            return false;
        start = host + 1;
        *port = end + 1;
    } else {
        end = host + strcspn(host, ":");
        *port = end;
    }
    size_t n = (size_t)(end - start);
    if (n == 0 || n >= size)
        return false;
    memcpy(name, start, n);
    name[n] = 0;
    if (**port == 0)
        return true;
    if (**port != ':' || !(*port)[1] || strspn(*port + 1, "0123456789") != strlen(*port + 1))
        return false;
    return true;
}

/* An --allowed-hosts entry matches "name" or "name:port"; one that names a port needs it. */
static bool host_listed(const struct srv_guard *g, const char *host, const char *name)
{
    for (int i = 0; i < g->n_hosts; i++) {
        const char *h = g->hosts[i];
        if (!strcasecmp(h, host) || !strcasecmp(h, name))
            return true;
        char bracketed[300]; /* an IPv6 entry may be written with brackets */
        snprintf(bracketed, sizeof(bracketed), "[%s]", name);
        if (!strcasecmp(h, bracketed))
            return true;
    }
    return false;
}

static bool host_accepted(const struct srv_guard *g, const char *host)
{
    if (!host)
        return true; /* HTTP/1.0 without Host: not a browser, nothing to rebind */
    char name[256];
    const char *port;
    if (!host_split(host, name, sizeof(name), &port))
        return false;
    return !strcasecmp(name, "localhost") || !strcmp(name, "127.0.0.1") || !strcmp(name, "::1") ||
           !strcasecmp(name, g->bind_host) || host_listed(g, host, name);
}

/* Origin "scheme://Host" is the server's own. */
static bool same_origin(const char *origin, const char *host)
{
    if (!host)
        return false;
    const char *rest = !strncasecmp(origin, "http://", 7)    ? origin + 7
                       : !strncasecmp(origin, "https://", 8) ? origin + 8
                                                             : NULL;
    return rest && !strcasecmp(rest, host);
}

static bool origin_listed(const struct srv_guard *g, const char *origin)
{
    for (int i = 0; i < g->n_origins; i++)
        if (!strcmp(g->origins[i], "*") || !strcasecmp(g->origins[i], origin))
            return true;
    return false;
}

static bool origin_accepted(const struct srv_guard *g, const struct srv_request *rq)
{
    return !rq->origin || same_origin(rq->origin, rq->host) || origin_listed(g, rq->origin);
}

/* path is prefix itself or below it. */
static bool path_under(const char *path, const char *prefix)
{
    size_t n = strlen(prefix);
    return !strncmp(path, prefix, n) && (path[n] == 0 || path[n] == '/');
}

static bool changes_state(const char *method, const char *path)
{
    if (!strcmp(method, "GET") || !strcmp(method, "HEAD"))
        return false;
    return path_under(path, "/train") || path_under(path, "/lora-adapters") ||
           path_under(path, "/v1/fine_tuning") || path_under(path, "/v1/files");
}

/* ct is the media type `type`, with parameters or not. */
static bool is_type(const char *ct, const char *type)
{
    if (!ct)
        return false;
    while (*ct == ' ')
        ct++;
    size_t n = strlen(type);
    return !strncasecmp(ct, type, n) && (ct[n] == 0 || ct[n] == ';' || ct[n] == ' ');
}

/* The body type a state-changing request must have. JSON, which no HTML form can send and
 * a cross-origin fetch only after a preflight. Two exceptions: DELETE has no body, and no
 * form can send it either (a cross-origin one is preflighted); and an upload (POST
 * /v1/files) is multipart/form-data, as OpenAI's API and clients have it. A form can send
 * that, so the upload rests on the checks before this one: a browser sends Origin with
 * every cross-origin POST, which must be listed; the Host check stops rebinding; with keys
 * the request needs one, which a form cannot send. */
static bool body_type_accepted(const char *method, const char *path, const char *ct)
{
    if (!strcmp(method, "DELETE"))
        return true;
    if (!strcmp(method, "POST") && !strcmp(path, "/v1/files") &&
        is_type(ct, "multipart/form-data"))
        return true;
    return is_type(ct, "application/json");
}

/* Request header names a preflight may ask for: tokens only, so echoing them is safe. */
static bool header_list_ok(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_' || *s == ',' || *s == ' '))
            return false;
    return true;
}

static void answer_preflight(const struct srv_guard *g, const struct srv_request *rq,
                             struct srv_response *rs)
{
    if (rq->origin && !origin_accepted(g, rq)) {
        srv_respond_error(rs, 403, NULL, "origin_not_allowed",
                          "requests from origin %.200s are not allowed (start lathe serve with "
                          "--cors ORIGIN to allow it)",
                          rq->origin);
        return;
    }
    rs->status = 204;
    snprintf(rs->allow, sizeof(rs->allow), "GET, POST, DELETE, OPTIONS");
    if (!rq->origin)
        return;
    srv_guard_cors(g, rq, rs);
    srv_response_header(rs, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    const char *want = rq->acr_headers && header_list_ok(rq->acr_headers)
                           ? rq->acr_headers
                           : "Authorization, Content-Type";
    srv_response_header(rs, "Access-Control-Allow-Headers", want);
    srv_response_header(rs, "Access-Control-Max-Age", "600");
}

bool srv_guard_admit(const struct srv_guard *g, const struct srv_request *rq, const char *path,
                     struct srv_response *rs)
{
    if (!strcmp(rq->method, "OPTIONS")) {
        answer_preflight(g, rq, rs);
        return false;
    }
    if (!strcmp(path, "/health") || !strcmp(path, "/v1/health"))
        return true;
    if (g->n_keys == 0 && !host_accepted(g, rq->host)) {
        srv_respond_error(rs, 403, NULL, "host_not_allowed",
                          "Host '%.200s' is not this server's name (start lathe serve with "
                          "--allowed-hosts NAME, or with an API key)",
                          rq->host);
        return false;
    }
    if (!origin_accepted(g, rq)) {
        srv_respond_error(rs, 403, NULL, "origin_not_allowed",
                          "requests from origin %.200s are not allowed (start lathe serve with "
                          "--cors ORIGIN to allow it)",
                          rq->origin);
        return false;
    }
    bool open_metrics = g->metrics_public && !strcmp(path, "/metrics");
    /* the web page holds no data, and a browser cannot send a key to open it; the calls it
     * makes carry the key the user gives it */
    bool open_page =
        !strcmp(path, "/") && (!strcmp(rq->method, "GET") || !strcmp(rq->method, "HEAD"));
    if (g->n_keys > 0 && !open_metrics && !open_page && !key_accepted(g, rq->authorization)) {
        srv_respond_error(rs, 401, NULL, "invalid_api_key", "%s",
                          rq->authorization
                              ? "Incorrect API key provided."
                              : "You didn't provide an API key. Send it in an Authorization "
                                "header: 'Authorization: Bearer KEY'.");
        srv_response_header(rs, "WWW-Authenticate", "Bearer");
        return false;
    }
    if (changes_state(rq->method, path) &&
        !body_type_accepted(rq->method, path, rq->content_type)) {
        bool upload = !strcmp(rq->method, "POST") && !strcmp(path, "/v1/files");
        srv_respond_error(rs, 415, NULL, "unsupported_media_type",
                          "%s %s needs 'Content-Type: %s', not '%.100s'", rq->method, path,
                          upload ? "multipart/form-data" : "application/json",
                          rq->content_type ? rq->content_type : "none");
        return false;
    }
    return true;
}

void srv_guard_cors(const struct srv_guard *g, const struct srv_request *rq,
                    struct srv_response *rs)
{
    if (!rq->origin || same_origin(rq->origin, rq->host) || !origin_listed(g, rq->origin))
        return;
    srv_response_header(rs, "Access-Control-Allow-Origin", rq->origin);
    srv_response_header(rs, "Vary", "Origin");
}

#endif
