/* engine_impl.h: the real engine's parts: the engine (engine.c: loading, the vtable), the
 * decode loop over slots (slots.c), adapters and the sessions that read them (pool.c), and
 * the training worker (trainer.c).
 *
 * Threads and locks. One engine thread owns every session and slot and runs the decode
 * loop; it holds step_mu while it works. HTTP threads only queue generations (q_mu) and
 * read counters (stats_mu); the adapter registry has its own lora_mu so loading an adapter
 * never waits for a decode step. Lock order: step_mu, then lora_mu, then q_mu or stats_mu.
 * `state` and `act` are atomics, read by /health and by the training job's thread without
 * any lock. */
#ifndef LATHE_SERVER_ENGINE_IMPL_H
#define LATHE_SERVER_ENGINE_IMPL_H

#include <stdatomic.h>

#include "lathe/backend.h"
#include "lathe/generate.h"
#include "lathe/lora.h"
#include "lathe/model.h"
#include "lathe/sched.h"
#include "lathe/server.h"
#include "server/server_impl.h"

#define ENG_MAX_LORAS 32
#define ENG_MAX_SESSIONS 2   /* adapter sets with a session (KV caches) at once */
#define ENG_PREFILL_CHUNK 256 /* prompt tokens per slot between two decode steps */
#define ENG_PREFILL_BATCH_TOKENS (8 * ENG_PREFILL_CHUNK) /* columns of one prefill step */
#define ENG_MAX_QUEUE 1024
#define ENG_LATENCY_RING 4096

/* A loaded adapter. Freed when it has been unloaded and no session reads it. */
struct eng_lora {
    int id;
    char name[SRV_NAME_MAX];
    char path[512];
    struct lt_lora *lora;
    float scale;  /* the default for requests that do not choose */
    bool removed; /* unloaded: no new request may use it */
    int refs;     /* sessions reading it */
    int in_use;   /* slots decoding with it */
};

/* An adapter set, sorted by id, zero scales dropped. */
struct eng_config {
    int n;
    int ids[SRV_MAX_REQ_LORAS];
    float scales[SRV_MAX_REQ_LORAS];
    struct eng_lora *loras[SRV_MAX_REQ_LORAS];
};

/* A session reading one adapter set, with parallel sequences. */
/* The tokens a free sequence of a session still holds from its last request: its prompt and
 * all but the last generated token. A new prompt that extends them starts there. */
struct eng_seq_cache {
    lt_token *tokens;
    size_t n, cap;
};

struct eng_session {
    struct eng_config cfg;
    struct lt_model_lora *list; /* what the graphs read; must outlive s */
    struct lt_model_adapters ad;
    struct lt_session *s;
    bool *seq_busy; /* [parallel] */
    struct eng_seq_cache *cache; /* [parallel] */
    int n_active;
    double last_used;
};

enum eng_slot_state {
    ENG_SLOT_FREE = 0,
    ENG_SLOT_PREFILL,
    ENG_SLOT_DECODE,
};

struct eng_slot {
    enum eng_slot_state state;
    struct srv_gen *g;
    struct eng_session *es;
    int seq;
    size_t n_prefilled;   /* prompt tokens in the session so far */
    struct lt_gen_seq gs; /* sampling, text, stop strings, limits (src/generate) */
    bool have_gs;
    double t_last;        /* when its last token was produced */
    /* eng_activity's totals when the slot started, to measure its life's decode rate */
    long long act_tokens0, act_us0, act_windows0;
    double act_t0; /* when it started decoding (srv_now_mono) */
    bool act_overlap; /* a training window ran at some point of its life */
};

struct eng_stats {
    uint64_t requests, finished[5]; /* by enum srv_finish */
    uint64_t prompt_tokens, prompt_tokens_reused, generated_tokens;
    uint64_t logprob_tokens; /* generated tokens sampled with their log-probabilities */
    uint64_t decode_steps, decode_tokens;
    uint64_t prefill_steps; /* steps of prompts prefilled (several prompts may share one) */
    uint64_t picked_tokens; /* decoded tokens picked where the logits are (plain greedy) */
    int batch_max;
    double prefill_s, decode_s;
    double sample_s; /* after each decode step: sampling, detokenizing, stops, streaming */
    float latency[ENG_LATENCY_RING]; /* seconds between a slot's tokens */
    int n_latency, latency_pos;
};

struct srv_trainer;

/* What the training worker watches to yield: slots holding a generation, and when one last
 * did (CLOCK_MONOTONIC microseconds; a request that follows another a few ms later should
 * not find a training step started in the gap). */
#define ENG_ACT_RING 256

struct eng_activity {
    atomic_int busy;
    atomic_llong last_busy_us;
    /* the decode loop's running totals over its batched decode steps (the time inside
     * lt_session_decode, waits for a device held by training included): serving's rate is
     * the change of tokens over the change of us */
    atomic_llong decode_tokens, decode_us;
    /* the trainer's: 1 while a window runs, and windows started so far */
    atomic_int window;
    atomic_llong windows;
    /* requests that overlapped a window, as serving's rate over their life (tokens per ms of
     * decode), for the trainer to drain; ring_mu guards these three and is taken alone */
    pthread_mutex_t ring_mu;
    double ring[ENG_ACT_RING];
    int n_ring;
};

struct engine {
    struct srv_engine base;
    struct lt_server_params p; /* strings point into owned copies below */
    char *model_path, *train_dir;
    char **lora_paths;
    char *alias;

    atomic_int state; /* enum srv_state */
    char why[512];    /* when FAILED; written before state */
    pthread_t load_thread;
    bool have_load_thread;
    pthread_mutex_t ready_mu;
    pthread_cond_t ready_cv;

    struct lt_model *model;
    struct lt_tokenizer *tok;
    struct lt_chat_template ct;
    bool have_ct;
    struct srv_model_info info;
    struct lt_backend *cpu, *cuda, *train_cpu;
    struct lt_backend *cuda_shared; /* cuda behind a lock: serving and training use this one */
    struct lt_backend *backends[2];
    int n_backends;
    struct lt_backend *train_backends[2];
    int n_train_backends;

    /* the queue (q_mu) */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    struct srv_gen **queue;     /* [ENG_MAX_QUEUE] */
    int q_len;
    int q_admitting;            /* taken out by the loop for admission; counts toward the cap */
    struct srv_gen **admitting; /* [ENG_MAX_QUEUE], the loop's */
    bool stopping;

    /* the decode loop (step_mu); step_waiting counts other threads waiting for step_mu
     * (eng_step_lock), for whom the loop stands aside between two steps */
    pthread_mutex_t step_mu;
    atomic_int step_waiting;
    pthread_t loop_thread;
    bool have_loop_thread;
    struct eng_slot *slots; /* [parallel] */
    struct eng_session *sessions[ENG_MAX_SESSIONS];
    int n_sessions;
    float *logits;   /* [parallel, n_vocab] */
    bool logits_pinned; /* page-locked by e->cuda (lt_backend_host_pin) */
    int *batch_seqs; /* [parallel] */
    lt_token *batch_tokens;
    int *batch_slots;
    int *batch_lens;                /* a batched prefill: each slot's prompt tokens this step */
    const lt_token **batch_prompts; /* and where they start */
    int *prefill_order;             /* [parallel]: the prefilling slots, longest chunk first */
    bool *batch_want;               /* a decode step: the slots whose logits are copied out */
    int32_t *batch_ids;             /* and each slot's greedy pick */
    struct eng_activity act; /* act.busy: slots not FREE */

    /* adapters (lora_mu) */
    pthread_mutex_t lora_mu;
    struct eng_lora *loras[ENG_MAX_LORAS];
    int n_loras;
    int next_lora_id;

    pthread_mutex_t stats_mu;
    struct eng_stats stats;

    struct srv_trainer *trainer;

    /* /v1/embeddings: a session of one sequence, made on first use; step_mu */
    struct lt_session *embed_s;
    float *embed_h; /* [n_ctx, n_embd] */
};

/* backend_lock.c: `inner` behind a mutex, as the same backend (shares its impl); free the
 * proxy with lt_backend_free before freeing inner. NULL when out of memory. */
struct lt_backend *srv_backend_locked_new(struct lt_backend *inner);

/* slots.c */
void *eng_loop_main(void *arg);
/* step_mu for a thread other than the loop. A mutex is not fair: the loop, taking it again
 * right after each step, would keep an HTTP thread (/slots, an adapter load) waiting until
 * every generation ends; these let the loop see the waiter and give way. */
void eng_step_lock(struct engine *e);
void eng_step_unlock(struct engine *e);
/* Fails every queued and active generation (shutdown). Caller holds nothing. */
void eng_fail_all(struct engine *e, int status, const char *msg);
void eng_metrics_decode(struct engine *e, struct lt_strbuf *out);

/* pool.c (callers hold step_mu where noted) */
/* Resolves a request's adapter choice into cfg (takes lora_mu). 200 or 400 naming "lora". */
int eng_config_resolve(struct engine *e, const struct srv_gen_params *p, struct eng_config *cfg);
/* A session for cfg with a free sequence, creating one (evicting an idle one) when needed;
 * NULL with *st == 200 when all are busy, or with an error status. Holds step_mu. */
struct eng_session *eng_session_get(struct engine *e, const struct eng_config *cfg, int *st);
/* Counts a slot on cfg's adapters (in_use), or uncounts it. */
void eng_config_use(struct engine *e, const struct eng_config *cfg, int delta);
/* Frees sessions reading unloaded adapters, once idle. Holds step_mu. */
void eng_sessions_collect(struct engine *e);
void eng_sessions_free_all(struct engine *e);
void eng_session_free(struct engine *e, struct eng_session *es);
int eng_lora_list(struct srv_engine *se, struct srv_lora_info **out, int *n);
int eng_lora_load(struct srv_engine *se, const char *name, const char *path, float scale);
int eng_lora_unload(struct srv_engine *se, const char *name);
int eng_lora_set_scale(struct srv_engine *se, const char *name, int id, float scale);
void eng_loras_free_all(struct engine *e);

/* trainer.c */
lt_status srv_trainer_new(struct lt_model *m, struct lt_backend *const *backends, int n,
                          struct eng_activity *act, int yield_ms, struct srv_trainer **out);
int srv_trainer_start(struct srv_trainer *t, const struct lt_train_params *p,
                      const struct srv_train_meta *meta, char *id, size_t id_size);
int srv_trainer_info(struct srv_trainer *t, const char *id, struct srv_train_info *out);
int srv_trainer_list(struct srv_trainer *t, char (*ids)[48], int max, int *n);
int srv_trainer_control(struct srv_trainer *t, const char *id, enum srv_train_op op);
void srv_trainer_metrics(struct srv_trainer *t, struct lt_strbuf *out);
void srv_trainer_free(struct srv_trainer *t); /* cancels a running job and waits */

#endif
