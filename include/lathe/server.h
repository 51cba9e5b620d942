/* server.h: `lathe serve`, an OpenAI-compatible HTTP server that can train LoRA adapters on
 * the model it serves, beside serving.
 *
 * lt_server_start binds the listening socket first and loads the model on a thread of its
 * own, so /health answers 503 {"status":"loading"} until the model is ready and 200
 * {"status":"ok"} from then on, during training too. Nothing a client sends can stop the
 * process: every failure is an HTTP error with an OpenAI-shaped body
 * {"error":{"message","type","param","code"}}. The routes are listed in
 * src/server/routes.c; the training worker and its yielding in src/server/trainer.c. */
#ifndef LATHE_SERVER_H
#define LATHE_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "lathe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How /v1/embeddings pools the final hidden states over the input's tokens (llama.cpp's
 * --pooling mean|last). */
enum { LT_SERVER_POOLING_MEAN = 0, LT_SERVER_POOLING_LAST = 1 };

struct lt_server_params {
    const char *model_path;  /* the GGUF model (required) */
    const char *model_alias; /* its id in /v1/models; NULL: the file's name */
    const char *host;        /* numeric IPv4 or IPv6 address; NULL: "127.0.0.1" */
    int port;                /* 0: any free port (see lt_server_port) */
    const char *backend;     /* "cpu" or "cuda"; NULL: "cpu" */
    int parallel;            /* slots decoding at once; 0: 4 */
    int n_ctx;               /* tokens per slot; 0: min(4096, the model's training context) */
    int n_threads;           /* CPU threads for decoding and training; <= 0: all cores */
    const char *train_dir;   /* where /train writes adapters and /lora-adapters/load reads
                              * them; NULL: training and loading by name are disabled */
    const char *const *loras; /* adapter files loaded (scale 1) once the model is ready */
    int n_loras;
    size_t max_body_bytes;   /* request bodies above this get 413; 0: 8 MiB */
    size_t max_upload_bytes; /* the same for uploads (POST /v1/files); 0: 64 MiB */
    int max_connections;     /* open connections (one thread each); 0: 256 */
    int train_yield_ms;      /* the longest a training job waits, between two steps, for
                              * decoding to go idle; 0: 2000; < 0: never waits */
    int header_timeout_ms;   /* a request's headers must arrive within this of the connection
                              * opening (or its previous request ending); 0: 10000 */
    bool quiet;              /* no request log on stderr */
    int pooling;             /* /v1/embeddings: LT_SERVER_POOLING_MEAN (0) or _LAST */
    bool any_model_id;       /* a request's "model" may be any name (the base model answers);
                              * otherwise only the base model's id, alias or file, an adapter
                              * loaded under a name or a finished fine-tuning job's model, and
                              * any other gets 404 model_not_found */

    /* Who may call it. With keys, every route but /health needs "Authorization: Bearer
     * KEY". Without, the Host header must name this server. See src/server/guard.c. */
    const char *const *api_keys; /* [n_api_keys] */
    int n_api_keys;
    const char *api_key_file;    /* more keys, one a line ('#' comments, blank lines) */
    bool metrics_public;         /* /metrics answers without a key */
    const char *const *cors_origins; /* [n_cors_origins] cross origins browsers may call
                                      * from ("http://host:port", or "*": any) */
    int n_cors_origins;
    const char *const *allowed_hosts; /* [n_allowed_hosts] Host names accepted besides
                                       * loopback and the bound address (no key set) */
    int n_allowed_hosts;
    bool insecure_no_auth;       /* allow a non-loopback host with a train dir and no key */
};

struct lt_server;

/* Validates the parameters, binds the socket, starts answering HTTP and starts loading the
 * model in the background. An unusable address or port is LT_ERR_IO. A host that is not
 * loopback, with a train dir and no API key, is refused (LT_ERR_INVALID) unless
 * insecure_no_auth; a non-loopback host without a key is warned about on stderr. */
lt_status lt_server_start(const struct lt_server_params *params, struct lt_server **out);
/* The port listened on (the one chosen when params->port was 0). */
int lt_server_port(const struct lt_server *s);
/* Waits until the model is loaded (LT_OK) or has failed to load (its status and reason). */
lt_status lt_server_wait_ready(struct lt_server *s);
/* Stops accepting connections, cancels generations and any training job, frees all. NULL is
 * fine. */
void lt_server_free(struct lt_server *s);

#ifdef __cplusplus
}
#endif
#endif
