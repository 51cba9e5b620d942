/* cmd_serve.c: `lathe serve -m MODEL.gguf [options]`: the OpenAI-compatible server.
 *
 * SIGINT and SIGTERM are blocked before any thread starts and taken with sigwait here, so
 * no server thread is ever interrupted by them and shutdown runs in order (lt_server_free).
 * SIGPIPE is ignored: a client that disconnects is an HTTP event, never a signal. Once
 * listening, one line "lathe serve: listening on http://HOST:PORT" goes to stdout (tests
 * and scripts read the port from it when --port 0 was given). The access options (keys,
 * CORS origins, allowed hosts) are only collected here; src/server/guard.c applies them. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "lathe/server.h"

static const char usage_text[] =
    "usage: lathe serve -m MODEL.gguf [options]\n"
    "  -m, --model FILE      the GGUF model to serve (required)\n"
    "  --alias NAME          the model's id in the API (default: the file's name)\n"
    "  --any-model-id        a request's \"model\" may be any name and gets the base model\n"
    "                        (default: only the base model's id or file name, an adapter's\n"
    "                        name or a fine-tuned model; others get 404 model_not_found)\n"
    "  --host ADDR           numeric address to listen on (default 127.0.0.1)\n"
    "  --port N              port (default 8080; 0: any free port, printed on stdout)\n"
    "  --backend cpu|cuda    where the weights live and decoding runs (default cpu)\n"
    "  --parallel N          requests decoding at once, in one batch (default 4)\n"
    "  --ctx N               tokens per request, prompt and completion (default 2048)\n"
    "  --threads N           CPU threads (default: all cores)\n"
    "  --pooling mean|last   /v1/embeddings pools the final hidden states by their mean or\n"
    "                        takes the last token's (default mean)\n"
    "  --train-dir DIR       enable /train and /v1/files: adapters are written to, and loaded\n"
    "                        from, DIR; uploaded files are kept in DIR/files\n"
    "  --lora FILE           load an adapter at start (repeatable)\n"
    "  --max-body BYTES      largest request body (default 8388608)\n"
    "  --max-upload-mib N    largest upload to /v1/files, in MiB (default 64)\n"
    "  --train-yield-ms N    longest a training step waits for decoding to go idle\n"
    "                        (default 2000; -1: never wait); a job's max_slowdown_ppm\n"
    "                        sizes its own yields and is not capped by this\n"
    "  --quiet               no request log\n"
    "access:\n"
    "  --api-key KEY         require 'Authorization: Bearer KEY' on every route but /health\n"
    "                        and the web page at / (repeatable; visible to other local users\n"
    "                        in ps: prefer a file)\n"
    "  --api-key-file FILE   more keys, one a line (blank lines and '#' lines skipped)\n"
    "  --metrics-public      /metrics answers without a key (default: it needs one)\n"
    "  --cors ORIGIN         a web origin browsers may call from, e.g. http://localhost:3000\n"
    "                        ('*': any; repeatable); other cross-origin requests get 403\n"
    "  --allowed-hosts H     Host names accepted besides localhost and the bound address when\n"
    "                        no key is set (repeatable or comma-separated); others get 403\n"
    "  --insecure-no-auth    allow a non-loopback --host with --train-dir and no key\n"
    "                        (refused otherwise)\n"
    "connections:\n"
    "  --max-connections N   open connections, one thread each (default 256)\n"
    "  --header-timeout S    seconds a connection has to send a request's headers, from when\n"
    "                        it opened or its previous request ended (default 10)\n";

static bool parse_int(const char *s, long lo, long hi, long *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* The repeatable options' values, each list with room for every argument. */
struct serve_lists {
    const char **loras, **keys, **origins, **hosts;
};

static bool lists_alloc(struct serve_lists *l, int argc)
{
    size_t n = (size_t)argc + 1;
    l->loras = calloc(n, sizeof(char *));
    l->keys = calloc(n, sizeof(char *));
    l->origins = calloc(n, sizeof(char *));
    l->hosts = calloc(n, sizeof(char *));
    return l->loras && l->keys && l->origins && l->hosts;
}

static void lists_free(struct serve_lists *l)
{
    free(l->loras);
    free(l->keys);
    free(l->origins);
    free(l->hosts);
}

/* An option without a value; false when a is not one. */
static bool parse_flag(const char *a, struct lt_server_params *p)
{
    if (!strcmp(a, "--quiet"))
        p->quiet = true;
    else if (!strcmp(a, "--metrics-public"))
        p->metrics_public = true;
    else if (!strcmp(a, "--insecure-no-auth"))
        p->insecure_no_auth = true;
    else if (!strcmp(a, "--any-model-id"))
        p->any_model_id = true;
    else
        return false;
    return true;
}

/* An option with value v (may be NULL); false when a is not one or v is not good for it. */
static bool parse_valued(const char *a, const char *v, struct lt_server_params *p,
                         struct serve_lists *l)
{
    long n;
    if (!strcmp(a, "-m") || !strcmp(a, "--model"))
        p->model_path = v;
    else if (!strcmp(a, "--alias"))
        p->model_alias = v;
    else if (!strcmp(a, "--host"))
        p->host = v;
    else if (!strcmp(a, "--port") && parse_int(v, 0, 65535, &n))
        p->port = (int)n;
    else if (!strcmp(a, "--backend"))
        p->backend = v;
    else if (!strcmp(a, "--parallel") && parse_int(v, 1, 256, &n))
        p->parallel = (int)n;
    else if (!strcmp(a, "--ctx") && parse_int(v, 8, 1 << 20, &n))
        p->n_ctx = (int)n;
    else if (!strcmp(a, "--threads") && parse_int(v, 1, 4096, &n))
        p->n_threads = (int)n;
    else if (!strcmp(a, "--pooling") && v && (!strcmp(v, "mean") || !strcmp(v, "last")))
        p->pooling = !strcmp(v, "last") ? LT_SERVER_POOLING_LAST : LT_SERVER_POOLING_MEAN;
    else if (!strcmp(a, "--train-dir"))
        p->train_dir = v;
    else if (!strcmp(a, "--lora") && v)
        l->loras[p->n_loras++] = v;
    else if (!strcmp(a, "--max-body") && parse_int(v, 1024, 1L << 30, &n))
        p->max_body_bytes = (size_t)n;
    else if (!strcmp(a, "--max-upload-mib") && parse_int(v, 1, 2048, &n))
        p->max_upload_bytes = (size_t)n << 20;
    else if (!strcmp(a, "--train-yield-ms") && parse_int(v, -1, 3600000, &n))
        p->train_yield_ms = n == 0 ? -1 : (int)n;
    else if (!strcmp(a, "--api-key") && v)
        l->keys[p->n_api_keys++] = v;
    else if (!strcmp(a, "--api-key-file"))
        p->api_key_file = v;
    else if (!strcmp(a, "--cors") && v)
        l->origins[p->n_cors_origins++] = v;
    else if (!strcmp(a, "--allowed-hosts") && v)
        l->hosts[p->n_allowed_hosts++] = v;
    else if (!strcmp(a, "--max-connections") && parse_int(v, 1, 65536, &n))
        p->max_connections = (int)n;
    else if (!strcmp(a, "--header-timeout") && parse_int(v, 1, 3600, &n))
        p->header_timeout_ms = (int)n * 1000;
    else
        return false;
    return true;
}

/* 0: parsed; 1: --help shown; 2: a bad option (said on stderr). */
static int parse_args(int argc, char **argv, struct lt_server_params *p, struct serve_lists *l)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 1;
        }
        if (parse_flag(a, p))
            continue;
        if (!parse_valued(a, v, p, l)) {
            fprintf(stderr, "lathe serve: bad option or value: %s%s%s\n%s", a, v ? " " : "",
                    v ? v : "", usage_text);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "lathe serve: %s needs a value\n", a);
            return 2;
        }
        i++;
    }
    if (!p->model_path) {
        fprintf(stderr, "lathe serve: a model is required (-m MODEL.gguf)\n%s", usage_text);
        return 2;
    }
    p->loras = l->loras;
    p->api_keys = l->keys;
    p->cors_origins = l->origins;
    p->allowed_hosts = l->hosts;
    return 0;
}

/* Serves until SIGINT or SIGTERM; the exit status. */
static int serve(const struct lt_server_params *p, sigset_t *sigs)
{
    struct lt_server *s = NULL;
    if (lt_server_start(p, &s) != LT_OK) {
        fprintf(stderr, "lathe serve: %s\n", lt_last_error());
        return 1;
    }
    printf("lathe serve: listening on http://%s:%d\n", p->host ? p->host : "127.0.0.1",
           lt_server_port(s));
    fflush(stdout);
    if (lt_server_wait_ready(s) != LT_OK) {
        fprintf(stderr, "lathe serve: %s\n", lt_last_error());
        lt_server_free(s);
        return 1;
    }
    fprintf(stderr, "lathe serve: model ready\n");
    int sig = 0;
    sigwait(sigs, &sig);
    fprintf(stderr, "lathe serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    lt_server_free(s);
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    struct lt_server_params p = {.port = 8080};
    struct serve_lists lists = {0};
    int rc = 1;
    if (!lists_alloc(&lists, argc)) {
        fprintf(stderr, "lathe serve: out of memory\n");
        goto out_free_lists;
    }
    int parsed = parse_args(argc, argv, &p, &lists);
    if (parsed != 0) {
        rc = parsed == 1 ? 0 : 2;
        goto out_free_lists;
    }
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    rc = serve(&p, &sigs);

out_free_lists:
    lists_free(&lists);
    return rc;
}
