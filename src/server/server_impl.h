/* server_impl.h: the server's internal interfaces, in three layers:
 *
 *   http.c        libmicrohttpd: request bodies and their cap, the header deadline, dispatch,
 *                 full and streamed responses, noticing a client that went away. Knows
 *                 nothing of models.
 *   guard.c       who may call what (keys, Host, Origin/CORS, JSON for state changes),
 *                 decided on the headers alone, before a body is read.
 *   routes_*.c    each route: validates its JSON body (json_check.c), calls the engine,
 *                 shapes the OpenAI response. Knows the engine only through srv_engine_iface.
 *   engine*.c     the real engine: model, tokenizer, slots decoding in one batch, adapters
 *                 (pool.c), the training worker (trainer.c). Tests substitute a fake one,
 *                 so routes and HTTP are tested without a model.
 *
 * Engine calls that can fail return an HTTP status (200 on success) and leave the reason in
 * lt_last_error and the offending request field, if any, in srv_last_param: the route turns
 * both into the error body unchanged. A generation (srv_gen) is the one object the HTTP
 * side and the engine share; it is reference counted and guarded by its own mutex. */
#ifndef LATHE_SERVER_IMPL_H
#define LATHE_SERVER_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/generate.h"
#include "lathe/sampling.h"
#include "lathe/status.h"
#include "lathe/tokenizer.h"
#include "lathe/train.h"

/* ---- errors ---- */

/* Records reason (lt_fail), the request field at fault (param, may be NULL) and an error
 * code (NULL: one for the status) for this thread; returns http_status. */
int srv_fail(int http_status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
const char *srv_last_param(void); /* "" when none */
const char *srv_last_code(void);  /* "" when none */
/* The HTTP status for a library status (LT_ERR_INVALID -> 400, LT_ERR_NOMEM -> 503, ...). */
int srv_http_status_of(lt_status st);

/* ---- a generation: what one completion request asks for and what it has produced ---- */

enum srv_finish {
    SRV_FINISH_NONE = 0,
    SRV_FINISH_STOP,      /* an end-of-generation token or a stop string */
    SRV_FINISH_LENGTH,    /* max_tokens or the context ran out */
    SRV_FINISH_CANCELLED, /* the client went away */
    SRV_FINISH_ERROR,
};
const char *srv_finish_name(enum srv_finish f); /* "stop", "length", ... */

#define SRV_MAX_STOPS 16
#define SRV_MAX_REQ_LORAS 8
#define SRV_NAME_MAX 128

struct srv_lora_choice {
    char name[SRV_NAME_MAX]; /* the adapter's name, or "" with id >= 0 */
    int id;
    float scale;
};

struct srv_gen_params {
    lt_token *prompt; /* [n_prompt], owned */
    size_t n_prompt;
    int max_tokens; /* <= 0: until the context is full */
    bool ignore_eos; /* llama.cpp's field: go on past end-of-generation tokens (benchmarks) */
    struct lt_sampler_params sampling;
    char *stops[SRV_MAX_STOPS]; /* owned */
    size_t n_stops;
    bool lora_given; /* the request chose its adapters (possibly none) */
    struct srv_lora_choice loras[SRV_MAX_REQ_LORAS];
    int n_loras;
    bool logprobs;    /* record each token's log-probability (struct srv_token_lp) */
    int top_logprobs; /* and this many alternatives', 0..LT_GEN_MAX_TOP_LOGPROBS */
    bool no_prompt_cache; /* llama.cpp's cache_prompt false: prefill the whole prompt */
    struct lt_grammar *grammar; /* a reference, owned; NULL: unconstrained (grammar,
                                 * json_schema or response_format: routes_grammar.c) */
};

/* A generated token's log-probabilities (lt_gen_logprobs) and where its bytes start in the
 * generation's text. End-of-generation tokens get none. */
struct srv_token_lp {
    struct lt_gen_logprob lp;
    size_t text_start;
};

struct srv_gen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    struct srv_gen_params p;
    /* produced (under mu); visible == text.len except while an append is in progress */
    struct lt_strbuf text;
    size_t visible;
    struct srv_token_lp *lps; /* [n_lps], when p.logprobs: in generation order */
    size_t n_lps, cap_lps;
    int n_completion; /* tokens generated */
    bool done;
    enum srv_finish finish;
    int err_status;
    char err[512];
    bool cancel; /* the consumer gave up (disconnect) */
    /* the generator's own reason (enum lt_gen_finish; 0 running/unknown) and, for a stop
     * string, its index: set by the engine before it finishes g (llama.cpp's stop_type) */
    int gen_finish;
    int stop_which;
    size_t n_cached; /* prompt tokens the slot's sequence already held (set at its start) */
    double t_submit, t_start, t_first_token, t_done; /* monotonic seconds; 0: not yet */
};

/* A generation with one reference; takes ownership of p's allocations on success (p is
 * zeroed); on failure (out of memory) frees them. */
int srv_gen_new(struct srv_gen_params *p, struct srv_gen **out);
void srv_gen_params_free(struct srv_gen_params *p);
void srv_gen_ref(struct srv_gen *g);
void srv_gen_unref(struct srv_gen *g); /* frees on the last reference */

/* Engine side. Appends text that may be shown (stop strings already handled by the
 * engine) and sets the count of generated tokens. */
void srv_gen_push(struct srv_gen *g, const char *bytes, size_t n, int n_completion);
/* The same, recording lp (NULL: none) with the text, under one lock. */
void srv_gen_push_lp(struct srv_gen *g, const char *bytes, size_t n, int n_completion,
                     const struct srv_token_lp *lp);
void srv_gen_mark_started(struct srv_gen *g); /* it got a slot */
/* Finishes (no-op when already done). */
void srv_gen_finish(struct srv_gen *g, enum srv_finish why);
void srv_gen_fail(struct srv_gen *g, int http_status, const char *msg);
bool srv_gen_cancelled(struct srv_gen *g);

/* Consumer side. A copy of what the generation has shown beyond `from`, and its state. */
struct srv_gen_snap {
    size_t visible;
    bool done;
    enum srv_finish finish;
    int n_completion;
    int err_status;
    char err[512];
    double queue_s, first_token_s, total_s; /* from submission; 0 when not reached */
};
/* Appends text[from..visible) to out (may be NULL) and fills s. */
void srv_gen_snapshot(struct srv_gen *g, size_t from, struct lt_strbuf *out,
                      struct srv_gen_snap *s);
/* Waits up to timeout_ms for visible text beyond `seen` or the end; returns
 * the visible length. */
size_t srv_gen_wait(struct srv_gen *g, size_t seen, int timeout_ms);
/* A copy (*out malloc'd, NULL when none) of the log-probability records from index `from`
 * whose token's text starts before `visible` (a snapshot's): a token is reported once some
 * of its text is shown, so the tokens of a stop string, cut off, never are. Returns their
 * count. */
size_t srv_gen_logprobs(struct srv_gen *g, size_t from, size_t visible,
                        struct srv_token_lp **out);
void srv_gen_cancel(struct srv_gen *g);

/* ---- the engine interface ---- */

enum srv_state {
    SRV_STATE_LOADING = 0,
    SRV_STATE_READY,
    SRV_STATE_FAILED,
};

struct srv_model_info {
    char id[SRV_NAME_MAX];
    char arch[32];
    char backend[32]; /* the backend that decodes ("CPU", "CUDA0") */
    int n_ctx;       /* per slot */
    int parallel;
    int64_t n_vocab;
    int64_t n_ctx_train;
    int64_t n_layer;
    int64_t n_embd;
    bool has_chat_template;
    enum lt_chat_kind chat_kind; /* the template's family (its tool-call format) */
};

/* What /props tells besides srv_model_info (llama.cpp's fields). */
struct srv_props {
    char model_path[512];
    char *chat_template; /* the GGUF's template text, malloc'd; NULL: none */
    char bos_token[64], eos_token[64]; /* the tokens' text; "" when none */
    /* fill-in-the-middle tokens (LT_TOKEN_NONE when the vocabulary has none) */
    lt_token fim_pre, fim_suf, fim_mid, fim_rep, fim_sep;
    lt_token bos; /* LT_TOKEN_NONE when none */
    bool add_bos;
};

/* One slot, as /slots shows it. */
struct srv_slot_info {
    int id;
    bool is_processing;
    int n_ctx;
    int n_prompt;   /* prompt tokens of the generation it holds (0 when free) */
    int n_prefilled; /* of those, in the cache */
    int n_decoded;  /* tokens generated */
    int max_tokens; /* the request's limit; <= 0: the context */
    struct lt_sampler_params sampling;
    int n_stops;
};

struct srv_lora_info {
    int id;
    char name[SRV_NAME_MAX];
    char path[512];
    float scale; /* applied to requests that do not choose their adapters */
    int n_pairs;
    int rank;    /* of the first pair */
    int in_use;  /* generations decoding with it now */
};

enum srv_train_op {
    SRV_TRAIN_CANCEL,
    SRV_TRAIN_PAUSE,
    SRV_TRAIN_RESUME,
};

#define SRV_TRAIN_MAX_EVENTS 64

/* How a job shares the device with serving (docs/DESIGN.md, "Beside serving"). A window is
 * one optimizer step; after each the job yields to serving. */
struct srv_train_pacing {
    int max_slowdown_ppm; /* 1..999999: serving keeps >= (1 - ppm/1e6) of its clean decode
                             rate; 0: not asked, `yield` and share_ppm govern */
    int share_ppm;        /* 1..1000000: training's share of the time while serving is
                             active, when yield is false; 0: the default, 250000 */
    bool no_yield;        /* yield: false (a zero struct yields) */
};

#define SRV_TRAIN_SHARE_PPM_DEFAULT 250000
/* POST /train holds this share out for the eval loss when val_split is absent, as
 * CambrianTech's /train does; `lathe train` and fine-tuning jobs (OpenAI's shape: a
 * validation_file or none) hold out nothing unless asked */
#define SRV_TRAIN_VAL_SPLIT_DEFAULT 0.1f
#define SRV_PACE_HIST 101 /* slowdown histogram buckets: whole percent 0..100 */

/* What the job's pacing has seen (the trainer's, under its lock). Rates are serving's
 * decode tokens per wall-clock ms. */
struct srv_train_pace_stats {
    int64_t windows, windows_busy; /* windows taken; those during which serving decoded */
    double window_ms_last, window_ms_p50, window_ms_p95, window_ms_max;
    double window_ms_total;               /* all windows' time */
    double yielded_ms;                    /* total time waited between windows */
    double rate_clean, rate_window;       /* tokens/ms without and with a window; 0: not yet */
    int64_t n_overlapped;                 /* requests that overlapped a window */
    int64_t slowdown_hist[SRV_PACE_HIST]; /* overlapped requests by slowdown, whole percent */
    int64_t slowdown_max_ppm;
    bool waiting_for_serving; /* in a yield now */
    int n_epoch_times;
    double epoch_s[LT_TRAIN_MAX_EPOCHS];            /* wall seconds, yields included */
    double epoch_tokens_per_s[LT_TRAIN_MAX_EPOCHS]; /* training tokens over those seconds */
};

/* pacing.c: the length of the yield after a training window of d (any unit; the yield is
 * in the same), pure functions. The bound: serving, decoding at r0 without a window and r_w
 * during one (tokens per ms), keeps at least (1 - T) of r0 over window plus yield when
 *   y >= d * (r0 * (1 - T) - r_w) / (r0 * T),  T = max_slowdown_ppm / 1e6;
 * with no clean rate yet (r0 <= 0) or none with a window (r_w < 0) it assumes r_w = 0, the
 * worst case, y = d * (1 - T) / T. Never negative. The share: y = d * (1e6 - share) /
 * share, training taking share/1e6 of the time. */
double srv_pace_yield_bound(double d, double r0, double r_w, int max_slowdown_ppm);
double srv_pace_yield_share(double d, int share_ppm);
/* The pct-th percentile (nearest rank) of v[0..n); 0 for n == 0. Sorts a copy of at most
 * 256 values: the caller keeps a ring of the latest. */
double srv_pace_percentile(const double *v, int n, int pct);

/* What the caller adds to the job parameters, for reporting. */
struct srv_train_meta {
    char model[SRV_NAME_MAX];         /* the served model's id */
    char out_name[SRV_NAME_MAX];      /* the adapter's name inside the train dir */
    char training_file[SRV_NAME_MAX]; /* fine-tuning shape: the examples file; "" otherwise */
    char validation_file[SRV_NAME_MAX]; /* and its held-out examples' file; "" when none */
    char out_path[1024]; /* where the output is written (POST /train's "adapter" when done) */
    int n_layer;         /* the model's blocks (how many a job adapts is reported) */
    bool openai_shape;
    struct srv_train_pacing pacing;
};

struct srv_train_info {
    char id[48];
    struct srv_train_meta meta;
    enum lt_train_state state;
    struct lt_train_progress prog;
    struct lt_train_params params; /* numbers only (strings are NULL) */
    double created_at, finished_at; /* unix seconds; finished_at 0 while not finished */
    int n_epochs;                   /* epochs with a loss below */
    float train_loss[LT_TRAIN_MAX_EPOCHS];
    float eval_loss[LT_TRAIN_MAX_EPOCHS]; /* NAN: none */
    double yielded_s;               /* time spent waiting for decoding to go idle */
    bool pause_requested;           /* a pause asked and not resumed since */
    struct srv_train_pace_stats pace;
    size_t rss_bytes;               /* the process's resident memory now */
    bool have_result;
    struct lt_train_result result;  /* when have_result; curve NULL */
    int n_events;
    struct {
        double t;
        char level[8];
        char message[248];
    } events[SRV_TRAIN_MAX_EVENTS]; /* oldest first */
};

struct srv_engine;

struct srv_engine_iface {
    /* Never blocks. `why` receives the reason when FAILED. */
    enum srv_state (*state)(struct srv_engine *e, char *why, size_t why_size);
    void (*info)(struct srv_engine *e, struct srv_model_info *out);
    int (*tokenize)(struct srv_engine *e, const char *text, size_t len, unsigned flags,
                    struct lt_tokens *out);
    int (*detokenize)(struct srv_engine *e, const lt_token *ids, size_t n, unsigned flags,
                      struct lt_strbuf *out);
    /* A prompt's tokens (into an empty list), as `lathe run` makes them: bos when the
     * vocabulary asks for it; the chat through the model's template with the generation
     * prompt; special tokens' text recognised. */
    int (*prompt_chat)(struct srv_engine *e, const struct lt_chat_message *msgs, size_t n,
                       const struct lt_chat_options *opts, struct lt_tokens *out);
    int (*prompt_text)(struct srv_engine *e, const char *text, struct lt_tokens *out);
    /* Queues g (the engine takes a reference); it decodes as soon as a slot is free. */
    int (*submit)(struct srv_engine *e, struct srv_gen *g);
    /* Appends Prometheus text. */
    void (*metrics)(struct srv_engine *e, struct lt_strbuf *out);
    /* adapters; *out is malloc'd */
    int (*lora_list)(struct srv_engine *e, struct srv_lora_info **out, int *n);
    int (*lora_load)(struct srv_engine *e, const char *name, const char *path, float scale);
    int (*lora_unload)(struct srv_engine *e, const char *name);
    int (*lora_set_scale)(struct srv_engine *e, const char *name, int id, float scale);
    /* training; id NULL or "": the latest job */
    int (*train_start)(struct srv_engine *e, const struct lt_train_params *p,
                       const struct srv_train_meta *meta, char *id, size_t id_size);
    /* Reads and tokenizes p's training data as the job will (lt_train_data_check); 200, or
     * the failure's status with lt_last_error and fault filled. NULL: data is not checked
     * before a job starts. */
    int (*train_check)(struct srv_engine *e, const struct lt_train_params *p,
                       struct lt_train_data_fault *fault);
    int (*train_info)(struct srv_engine *e, const char *id, struct srv_train_info *out);
    int (*train_list)(struct srv_engine *e, char (*ids)[48], int max, int *n);
    int (*train_control)(struct srv_engine *e, const char *id, enum srv_train_op op);
    /* llama.cpp's /props and /slots (NULL in engines without them: the routes answer 501);
     * out->chat_template and *slots are malloc'd */
    int (*props)(struct srv_engine *e, struct srv_props *out);
    int (*slots)(struct srv_engine *e, struct srv_slot_info **out, int *n);
    /* The embedding of ids[0..n) into out[n_embd]: the final hidden state after the output
     * norm, pooled over the tokens (the server's pooling: mean or last) and L2-normalised.
     * NULL: the engine has none (400). */
    int (*embed)(struct srv_engine *e, const lt_token *ids, size_t n, float *out);
    void (*free)(struct srv_engine *e);
};

struct srv_engine {
    const struct srv_engine_iface *iface;
    void *impl;
};

/* ---- HTTP ---- */

struct srv_conn; /* an open client connection */

/* True while the client is connected (it has not closed or reset its end). */
bool srv_conn_alive(struct srv_conn *c);

struct srv_request {
    const char *method;
    const char *path;   /* without the query string */
    const char *body;   /* NUL-terminated; "" when none (and while only headers are in) */
    size_t body_len;
    bool body_too_large;
    struct srv_conn *conn;
    const char *route_id; /* the path segment a route's '*' matched ("" when none) */
    /* request headers the guard reads; NULL when absent */
    const char *host;
    const char *origin;
    const char *authorization;
    const char *content_type;
    const char *acr_headers; /* Access-Control-Request-Headers of a CORS preflight */
};

/* A body produced over time (server-sent events). fill appends the next bytes to out,
 * waiting at most ~100 ms; sets *end after the last bytes; false closes the connection. */
struct srv_stream {
    bool (*fill)(void *user, struct srv_conn *conn, struct lt_strbuf *out, bool *end);
    void (*free)(void *user); /* exactly once, whatever happened */
    void *user;
};

#define SRV_MAX_HEADERS 6

struct srv_response {
    int status;
    const char *content_type; /* static string */
    struct lt_strbuf body;
    bool is_stream;
    struct srv_stream stream;
    char allow[64]; /* the Allow header of a 405 */
    int n_headers;
    struct {
        const char *name; /* static string */
        char value[256];
    } headers[SRV_MAX_HEADERS]; /* more headers (CORS, WWW-Authenticate, Connection) */
};

/* Adds a header to rs (name static); one that does not fit is dropped. */
void srv_response_header(struct srv_response *rs, const char *name, const char *value);

/* ---- the guard: who may call what (guard.c) ---- */

/* Which clients a server answers. With API keys, every route but /health needs
 * "Authorization: Bearer KEY" (/metrics too unless metrics_public); without, a request's
 * Host must name this server (loopback, the bound address or an allowed host), so a page
 * that rebinds its own name to 127.0.0.1 is refused. Either way a browser's cross-origin
 * request needs its Origin listed, and a state-changing route (/train*, /lora-adapters*,
 * /v1/fine_tuning*, /v1/files*) needs a JSON body, which no HTML form can send; except
 * POST /v1/files, which takes multipart/form-data, and DELETE, which no form can send. */
struct srv_guard {
    char **keys; /* [n_keys]; none: no authentication */
    int n_keys;
    bool metrics_public;
    char **origins; /* [n_origins] cross origins allowed (CORS); "*": any */
    int n_origins;
    char **hosts; /* [n_hosts] Host names accepted besides loopback and bind_host */
    int n_hosts;
    char bind_host[64]; /* the numeric address listened on */
};

struct lt_server_params;

/* Copies the parameters' keys (reading api_key_file), origins and hosts into g, checking
 * each; LT_ERR_INVALID or LT_ERR_IO names the bad one. g is zeroed first. */
lt_status srv_guard_init(struct srv_guard *g, const struct lt_server_params *p);
void srv_guard_free(struct srv_guard *g);
/* A request whose headers are in (path normalised, body not yet read): true when it may go
 * on to its route; false after answering it in rs (401, 403, 415, or 204 for a preflight). */
bool srv_guard_admit(const struct srv_guard *g, const struct srv_request *rq, const char *path,
                     struct srv_response *rs);
/* Adds Access-Control-Allow-Origin (and Vary) to rs when rq comes from an allowed cross
 * origin. */
void srv_guard_cors(const struct srv_guard *g, const struct srv_request *rq,
                    struct srv_response *rs);
/* The address is a loopback one (127.0.0.0/8, ::1); NULL means the default, 127.0.0.1. */
bool srv_host_is_loopback(const char *numeric_host);

struct srv_app {
    struct srv_engine *engine;
    const char *train_dir; /* NULL: training and loading by name disabled */
    size_t max_body_bytes;
    size_t max_upload_bytes; /* the cap for POST /v1/files instead (srv_route_body_cap) */
    double header_timeout_s; /* a request's headers must be in this long after the
                              * connection opened or its previous request ended; 0: 10 */
    bool quiet;
    /* "model" in a request: any name answers with the base model (--any-model-id);
     * otherwise an unknown one gets 404 model_not_found */
    bool any_model_id;
    const char *model_path; /* the served file, also accepted as its id; NULL: unknown */
    pthread_mutex_t model_mu; /* loading a fine-tuned model's adapter on first use */
    struct srv_guard guard;
    /* counted by http.c */
    pthread_mutex_t stats_mu;
    uint64_t http_requests[6]; /* by class: 1xx..5xx, [0] other */
    uint64_t header_timeouts;  /* connections closed for headers not in on time */
    int uploads_receiving;     /* uploads whose bodies are being read (at most
                                * SRV_MAX_UPLOADS), under stats_mu */
};

struct srv_http;

/* Uploads read at once: each holds up to max_upload_bytes in memory until its route has
 * stored it, so 4 x --max-upload-mib (256 MiB by default) is the most they hold; one more is
 * answered 503. */
#define SRV_MAX_UPLOADS 4

/* Serves app on host:port (port 0: any). */
lt_status srv_http_start(struct srv_app *app, const char *host, int port, int max_connections,
                         struct srv_http **out);
int srv_http_port(const struct srv_http *h);
void srv_http_stop(struct srv_http *h); /* NULL is fine */

/* ---- routes ---- */

/* Once a request's headers are in: true when it may proceed (its body is then read and
 * srv_route answers it); false after answering it in rs (the guard refused it). */
bool srv_route_admit(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);
/* The most body bytes the request may send, from its method and path: max_upload_bytes for
 * an upload (POST /v1/files; *upload set), max_body_bytes otherwise. */
size_t srv_route_body_cap(const struct srv_app *app, const struct srv_request *rq, bool *upload);
/* Removes what uploads to train_dir/files left when the process was killed (their
 * temporary files, and data whose file object was never written); counts them. */
lt_status srv_files_remove_stale(const char *train_dir, int *n_removed);
/* Answers one admitted request (fills rs); never fails to answer. */
void srv_route(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs);

/* Response helpers (routes_util.c). */
void srv_respond_json(struct srv_response *rs, int status, void *json /* json_t*, stolen */);
void srv_respond_error(struct srv_response *rs, int status, const char *param, const char *code,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The error recorded by srv_fail (lt_last_error, srv_last_param, srv_last_code). */
void srv_respond_last_error(struct srv_response *rs, int status);
/* The OpenAI error body {"error":{"message","type","param","code"}} (a json_t*). */
void *srv_error_json(int status, const char *param, const char *code, const char *message);

/* The path of `name` inside dir, when name is a plain file name ending in `ext` (no
 * directory parts, no leading dot, only [A-Za-z0-9._-], at most 200 bytes); otherwise an
 * HTTP status with the reason naming `param`. */
int srv_path_in_dir(const char *dir, const char *name, const char *ext, const char *param,
                    char *path, size_t path_size);

double srv_now_unix(void);
double srv_now_mono(void);

/* Appends printf-formatted text to out, all of it: never a fixed buffer's worth. LT_ERR_NOMEM
 * leaves out as it was. */
lt_status srv_strbuf_appendf(struct lt_strbuf *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- the real engine (engine.c) ---- */

struct lt_server_params;
/* Starts loading the model on a thread; state() says LOADING until it is done. */
lt_status srv_engine_model_new(const struct lt_server_params *p, struct srv_engine **out);
/* Waits until the engine is READY (LT_OK) or FAILED. */
lt_status srv_engine_model_wait(struct srv_engine *e);

#endif
