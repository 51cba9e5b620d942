/* cmd_serve.c: `lathe serve -m MODEL.gguf [options]`: the OpenAI-compatible server.
 *
 * SIGINT and SIGTERM are blocked before any thread starts and taken with sigwait here, so
 * no server thread is ever interrupted by them and shutdown runs in order (lt_server_free).
 * SIGPIPE is ignored: a client that disconnects is an HTTP event, never a signal. Once
 * listening, one line "lathe serve: listening on http://HOST:PORT" goes to stdout (tests
 * and scripts read the port from it when --port 0 was given). */
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
    "  --host ADDR           numeric address to listen on (default 127.0.0.1)\n"
    "  --port N              port (default 8080; 0: any free port, printed on stdout)\n"
    "  --backend cpu|cuda    where the weights live and decoding runs (default cpu)\n"
    "  --parallel N          requests decoding at once, in one batch (default 4)\n"
    "  --ctx N               tokens per request, prompt and completion (default 2048)\n"
    "  --threads N           CPU threads (default: all cores)\n"
    "  --train-dir DIR       enable /train: adapters are written to, and loaded from, DIR\n"
    "  --lora FILE           load an adapter at start (repeatable)\n"
    "  --max-body BYTES      largest request body (default 8388608)\n"
    "  --train-yield-ms N    longest a training step waits for decoding to go idle\n"
    "                        (default 2000; -1: never wait)\n"
    "  --quiet               no request log\n";

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

int cmd_serve(int argc, char **argv)
{
    struct lt_server_params p = {.port = 8080};
    const char **loras = calloc((size_t)argc + 1, sizeof(char *));
    int rc = 2;
    if (!loras) {
        fprintf(stderr, "lathe serve: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        bool takes = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            rc = 0;
            goto out_free;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            p.model_path = v;
        } else if (!strcmp(a, "--alias")) {
            p.model_alias = v;
        } else if (!strcmp(a, "--host")) {
            p.host = v;
        } else if (!strcmp(a, "--port") && parse_int(v, 0, 65535, &n)) {
            p.port = (int)n;
        } else if (!strcmp(a, "--backend")) {
            p.backend = v;
        } else if (!strcmp(a, "--parallel") && parse_int(v, 1, 256, &n)) {
            p.parallel = (int)n;
        } else if (!strcmp(a, "--ctx") && parse_int(v, 8, 1 << 20, &n)) {
            p.n_ctx = (int)n;
        } else if (!strcmp(a, "--threads") && parse_int(v, 1, 4096, &n)) {
            p.n_threads = (int)n;
        } else if (!strcmp(a, "--train-dir")) {
            p.train_dir = v;
        } else if (!strcmp(a, "--lora") && v) {
            loras[p.n_loras++] = v;
        } else if (!strcmp(a, "--max-body") && parse_int(v, 1024, 1L << 30, &n)) {
            p.max_body_bytes = (size_t)n;
        } else if (!strcmp(a, "--train-yield-ms") && parse_int(v, -1, 3600000, &n)) {
            p.train_yield_ms = n == 0 ? -1 : (int)n;
        } else if (!strcmp(a, "--quiet")) {
            p.quiet = true;
            takes = false;
        } else {
            fprintf(stderr, "lathe serve: bad option or value: %s%s%s\n%s", a, v ? " " : "",
                    v ? v : "", usage_text);
            goto out_free;
        }
        if (takes && !v) {
            fprintf(stderr, "lathe serve: %s needs a value\n", a);
            goto out_free;
        }
        i += takes;
    }
    if (!p.model_path) {
        fprintf(stderr, "lathe serve: a model is required (-m MODEL.gguf)\n%s", usage_text);
        goto out_free;
    }
    p.loras = loras;

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct lt_server *s = NULL;
    if (lt_server_start(&p, &s) != LT_OK) {
        fprintf(stderr, "lathe serve: %s\n", lt_last_error());
        rc = 1;
        goto out_free;
    }
    printf("lathe serve: listening on http://%s:%d\n", p.host ? p.host : "127.0.0.1",
           lt_server_port(s));
    fflush(stdout);
    if (lt_server_wait_ready(s) != LT_OK) {
        fprintf(stderr, "lathe serve: %s\n", lt_last_error());
        lt_server_free(s);
        rc = 1;
        goto out_free;
    }
    fprintf(stderr, "lathe serve: model ready\n");
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "lathe serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    lt_server_free(s);
    rc = 0;

out_free:
    free(loras);
    return rc;
}
