/* server.c: lt_server_start / lt_server_free: the HTTP layer over the real engine.
 *
 * Start order: engine (loading begins on its own thread), then HTTP, so /health answers
 * "loading" while the weights load. Stop order matters too: the engine fails every
 * generation first (so every stream a connection thread is writing ends), then HTTP stops
 * (joining those threads), and only then is the engine freed, since a connection thread may
 * be inside a route calling it until HTTP has stopped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lathe/gguf.h"
#include "lathe/server.h"
#include "server/engine_impl.h"

struct lt_server {
    struct srv_app app;
    struct srv_engine *engine;
    struct srv_http *http;
};

#if defined(LATHE_HAVE_MHD) && defined(LATHE_HAVE_JANSSON)
/* Who can reach the server, and with what. Training writes files and fills the machine, so
 * a server that others can reach and that trains must ask for a key (or be told plainly
 * that it need not); one that only serves is started with a warning. */
static lt_status check_exposure(const struct lt_server_params *p, const struct srv_guard *g)
{
    if (srv_host_is_loopback(p->host) || g->n_keys > 0)
        return LT_OK;
    if (p->train_dir && !p->insecure_no_auth)
        return lt_fail(LT_ERR_INVALID, "refusing to listen on %s with --train-dir and no API "
                       "key: anyone who can reach it could train, write files and load "
                       "adapters. Give --api-key KEY or --api-key-file FILE (or, to run it "
                       "open anyway, --insecure-no-auth)", p->host);
    fprintf(stderr, "lathe serve: WARNING: listening on %s without an API key: anyone who can "
            "reach this address can use the server%s (give --api-key or --api-key-file)\n",
            p->host, p->train_dir ? ", train on it and load adapters" : "");
    return LT_OK;
}
#endif

#if defined(LATHE_HAVE_MHD) && defined(LATHE_HAVE_JANSSON)
/* Fills p's defaults and checks it; with a train dir, removes what a killed job's write or
 * upload left there. LT_OK or the failure, naming the flag. */
static lt_status check_params(struct lt_server_params *p)
{
    if (!p->model_path || !*p->model_path)
        return lt_fail(LT_ERR_INVALID, "a model is required (-m MODEL.gguf)");
    if (p->parallel == 0)
        p->parallel = 4;
    if (p->parallel < 1 || p->parallel > 256)
        return lt_fail(LT_ERR_INVALID, "--parallel must be 1..256, not %d", p->parallel);
    if (p->n_ctx < 0 || p->n_ctx > (1 << 20))
        return lt_fail(LT_ERR_INVALID, "--ctx must be 0 (default) or up to %d, not %d", 1 << 20,
                       p->n_ctx);
    if (p->n_ctx > 0 && p->n_ctx < 8)
        return lt_fail(LT_ERR_INVALID, "--ctx %d is too small to hold a prompt", p->n_ctx);
    if (p->backend && strcmp(p->backend, "cpu") != 0 && strcmp(p->backend, "cuda") != 0)
        return lt_fail(LT_ERR_INVALID, "--backend must be cpu or cuda, not '%s'", p->backend);
    if (p->pooling != LT_SERVER_POOLING_MEAN && p->pooling != LT_SERVER_POOLING_LAST)
        return lt_fail(LT_ERR_INVALID, "--pooling must be mean or last");
    if (p->max_body_bytes == 0)
        p->max_body_bytes = (size_t)8 << 20;
    if (p->max_upload_bytes == 0)
        p->max_upload_bytes = (size_t)64 << 20;
    if (p->train_dir) {
        struct stat sb;
        if (stat(p->train_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return lt_fail(LT_ERR_IO, "--train-dir %s is not a directory", p->train_dir);
        /* what a job's write left when the process was killed (lathe's own temporary names
         * only, never held by a running writer; see lt_gguf_remove_stale_temps) */
        int n_removed = 0;
        if (lt_gguf_remove_stale_temps(p->train_dir, NULL, &n_removed) == LT_OK && n_removed > 0)
            fprintf(stderr, "lathe serve: removed %d unfinished temporary file%s from %s\n",
                    n_removed, n_removed == 1 ? "" : "s", p->train_dir);
        /* and what an upload to /v1/files left (routes_files.c) */
        if (srv_files_remove_stale(p->train_dir, &n_removed) == LT_OK && n_removed > 0)
            fprintf(stderr, "lathe serve: removed %d unfinished upload%s from %s/files\n",
                    n_removed, n_removed == 1 ? "" : "s", p->train_dir);
    }
    if (p->max_connections < 0 || p->max_connections > 65536)
        return lt_fail(LT_ERR_INVALID, "--max-connections must be 1..65536, not %d",
                       p->max_connections);
    if (p->header_timeout_ms < 0)
        return lt_fail(LT_ERR_INVALID, "--header-timeout must be positive");
    return LT_OK;
}
#endif

lt_status lt_server_start(const struct lt_server_params *params, struct lt_server **out)
{
    *out = NULL;
#if !defined(LATHE_HAVE_MHD) || !defined(LATHE_HAVE_JANSSON)
    return lt_fail(LT_ERR_UNSUPPORTED, "this build has no server: it needs libmicrohttpd and "
                   "jansson when it is configured");
#else
    struct lt_server_params p = *params;
    lt_status st = check_params(&p);
    if (st != LT_OK)
        return st;
    struct lt_server *s = calloc(1, sizeof(*s));
    if (!s)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the server");
    pthread_mutex_init(&s->app.stats_mu, NULL);
    pthread_mutex_init(&s->app.model_mu, NULL);
    st = srv_guard_init(&s->app.guard, &p);
    if (st != LT_OK)
        goto out_free_server;
    if ((st = check_exposure(&p, &s->app.guard)) != LT_OK)
        goto out_free_guard;
    st = srv_engine_model_new(&p, &s->engine);
    if (st != LT_OK)
        goto out_free_guard;
    s->app.engine = s->engine;
    s->app.train_dir = ((struct engine *)s->engine->impl)->train_dir;
    s->app.max_body_bytes = p.max_body_bytes;
    s->app.max_upload_bytes = p.max_upload_bytes;
    s->app.header_timeout_s = p.header_timeout_ms / 1000.0;
    s->app.quiet = p.quiet;
    s->app.any_model_id = p.any_model_id;
    s->app.model_path = ((struct engine *)s->engine->impl)->model_path;
    st = srv_http_start(&s->app, p.host, p.port, p.max_connections, &s->http);
    if (st != LT_OK)
        goto out_free_engine;
    *out = s;
    return LT_OK;

out_free_engine:
    s->engine->iface->free(s->engine);
out_free_guard:
    srv_guard_free(&s->app.guard);
out_free_server:
    pthread_mutex_destroy(&s->app.stats_mu);
    pthread_mutex_destroy(&s->app.model_mu);
    free(s);
    return st;
#endif
}

int lt_server_port(const struct lt_server *s)
{
    return srv_http_port(s->http);
}

lt_status lt_server_wait_ready(struct lt_server *s)
{
    return srv_engine_model_wait(s->engine);
}

void lt_server_free(struct lt_server *s)
{
    if (!s)
        return;
    struct engine *e = s->engine->impl;
    pthread_mutex_lock(&e->q_mu);
    e->stopping = true; /* no new generations */
    pthread_cond_broadcast(&e->q_cv);
    pthread_mutex_unlock(&e->q_mu);
    if (e->have_load_thread) {
        pthread_join(e->load_thread, NULL);
        e->have_load_thread = false;
    }
    if (e->have_loop_thread) {
        pthread_join(e->loop_thread, NULL);
        e->have_loop_thread = false;
    }
    eng_fail_all(e, 503, "the server is shutting down");
    srv_http_stop(s->http);
    s->engine->iface->free(s->engine);
    srv_guard_free(&s->app.guard);
    pthread_mutex_destroy(&s->app.stats_mu);
    pthread_mutex_destroy(&s->app.model_mu);
    free(s);
}
