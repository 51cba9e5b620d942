/* fuzz_guard.c: the server's guard (src/server/guard.c) on arbitrary request heads. The
 * input is split at NUL bytes into method, path, Host, Origin, Authorization, Content-Type
 * and Access-Control-Request-Headers (a missing field is an absent header). Whatever they
 * hold, the guard either admits the request or answers it with 204, 401, 403 or 415 in
 * OpenAI's error shape (204 without a body); it admits nothing without the key once keys
 * are set, except /health, a preflight and the web page (GET or HEAD /). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/server.h"
#include "server/server_impl.h"

#define FIELDS 7

static void check_answer(const struct srv_response *rs)
{
    if (rs->status == 204) {
        if (rs->body.len != 0)
            abort();
        return;
    }
    if (rs->status != 401 && rs->status != 403 && rs->status != 415)
        abort();
    json_t *j = json_loadb(rs->body.data, rs->body.len, 0, NULL);
    json_t *e = json_object_get(j, "error");
    if (!json_is_string(json_object_get(e, "message")) || !json_object_get(e, "param"))
        abort();
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct srv_guard open, keyed;
    static bool ready;
    if (!ready) {
        const char *keys[] = {"sk-fuzz-key"};
        const char *origins[] = {"http://ok.example", "https://ui.example:8443/"};
        const char *hosts[] = {"myhost.lan,other.lan:80", "[fe80::1]"};
        struct lt_server_params p = {.host = "127.0.0.1",
                                     .cors_origins = origins,
                                     .n_cors_origins = 2,
                                     .allowed_hosts = hosts,
                                     .n_allowed_hosts = 2};
        if (srv_guard_init(&open, &p) != LT_OK)
            abort();
        p.api_keys = keys;
        p.n_api_keys = 1;
        if (srv_guard_init(&keyed, &p) != LT_OK)
            abort();
        ready = true;
    }
    char *copy = malloc(size + 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    copy[size] = 0;
    const char *field[FIELDS] = {NULL};
    const char *p = copy;
    for (int i = 0; i < FIELDS && p <= copy + size; i++) {
        field[i] = p;
        p += strlen(p) + 1;
    }
    struct srv_request rq = {
        .method = field[0] ? field[0] : "GET",
        .path = field[1] ? field[1] : "/",
        .body = "",
        .host = field[2],
        .origin = field[3],
        .authorization = field[4],
        .content_type = field[5],
        .acr_headers = field[6],
    };
    for (int g = 0; g < 2; g++) {
        struct srv_response rs = {0};
        const struct srv_guard *guard = g ? &keyed : &open;
        bool admitted = srv_guard_admit(guard, &rq, rq.path, &rs);
        if (admitted && rs.status != 0)
            abort();
        if (!admitted)
            check_answer(&rs);
        bool health = !strcmp(rq.path, "/health") || !strcmp(rq.path, "/v1/health");
        /* the web page (GET or HEAD /) opens without a key: it holds no data, and a browser
         * cannot send one to open it (guard.c); its own API calls need the key */
        bool page = !strcmp(rq.path, "/") &&
                    (!strcmp(rq.method, "GET") || !strcmp(rq.method, "HEAD"));
        if (g && admitted && !health && !page &&
            (!rq.authorization || !strstr(rq.authorization, "sk-fuzz-key")))
            abort(); /* admitted without the key */
        srv_guard_cors(guard, &rq, &rs);
        lt_strbuf_free(&rs.body);
    }
    free(copy);
    return 0;
}
