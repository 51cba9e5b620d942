/* engine.c: the real engine: loading the model on a thread of its own (so /health can say
 * "loading"), the srv_engine_iface over it, queueing generations, metrics, shutdown.
 *
 * Until state is READY only state() and info() may touch the engine's model fields; every
 * other entry point checks state first (the routes do too). The model, tokenizer and chat
 * template are immutable once READY and are read by HTTP threads without a lock. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lathe/backend_cuda.h"
#include "lathe/generate.h"
#include "lathe/gguf.h"
#include "server/engine_impl.h"

static struct engine *eng(struct srv_engine *se)
{
    return se->impl;
}

static int not_ready(struct engine *e)
{
    int st = atomic_load(&e->state);
    return st == SRV_STATE_READY ? 0
           : srv_fail(503, NULL, st == SRV_STATE_LOADING ? "loading" : "model_failed",
                      st == SRV_STATE_LOADING ? "the model is still loading"
                                              : "the model failed to load");
}

/* ---- loading ---- */

static lt_status make_backends(struct engine *e)
{
    const char *b = e->p.backend ? e->p.backend : "cpu";
    e->cpu = lt_backend_cpu_new(e->p.n_threads);
    e->train_cpu = lt_backend_cpu_new(e->p.n_threads);
    if (!e->cpu || !e->train_cpu)
        return lt_fail(LT_ERR_NOMEM, "cannot create the CPU backend");
    if (!strcmp(b, "cuda")) {
        e->cuda = lt_backend_cuda_new(0);
        if (!e->cuda)
            return lt_fail(LT_ERR_UNSUPPORTED, "--backend cuda: no usable CUDA device (%s)",
                           *lt_last_error() ? lt_last_error() : "not built with CUDA");
        /* one device, two threads (decoding, a training job): share it behind a lock */
        e->cuda_shared = srv_backend_locked_new(e->cuda);
        if (!e->cuda_shared)
            return lt_fail(LT_ERR_NOMEM, "out of memory for the shared CUDA backend");
        e->backends[e->n_backends++] = e->cuda_shared;
        e->train_backends[e->n_train_backends++] = e->cuda_shared;
    }
    e->backends[e->n_backends++] = e->cpu;
    e->train_backends[e->n_train_backends++] = e->train_cpu;
    return LT_OK;
}

static lt_status load_all(struct engine *e)
{
    lt_status st = make_backends(e);
    if (st != LT_OK)
        return st;
    struct lt_model_params mp = {.weights_backend = e->cuda_shared};
    if ((st = lt_model_load(e->model_path, &mp, &e->model)) != LT_OK)
        return st;
    if ((st = lt_tokenizer_from_gguf(lt_model_gguf(e->model), &e->tok)) != LT_OK)
        return st;
    e->have_ct = lt_chat_template_from_gguf(lt_model_gguf(e->model), &e->ct) == LT_OK;
    const struct lt_model_hparams *hp = lt_model_hparams(e->model);
    struct srv_model_info *mi = &e->info;
    int n_ctx = e->p.n_ctx;
    if (n_ctx <= 0)
        n_ctx = hp->n_ctx_train > 0 && hp->n_ctx_train < 2048 ? (int)hp->n_ctx_train : 2048;
    mi->n_ctx = n_ctx;
    mi->parallel = e->p.parallel;
    mi->n_vocab = hp->n_vocab;
    mi->n_ctx_train = hp->n_ctx_train;
    mi->n_layer = hp->n_layer;
    mi->n_embd = hp->n_embd;
    mi->has_chat_template = e->have_ct;
    mi->chat_kind = e->ct.kind;
    snprintf(mi->arch, sizeof(mi->arch), "%s", lt_arch_name(hp->arch));
    snprintf(mi->backend, sizeof(mi->backend), "%s", e->backends[0]->name);

    int P = e->p.parallel;
    e->slots = calloc((size_t)P, sizeof(*e->slots));
    e->logits = malloc((size_t)P * (size_t)hp->n_vocab * sizeof(float));
    e->batch_seqs = calloc((size_t)P, sizeof(int));
    e->batch_tokens = calloc((size_t)P, sizeof(lt_token));
    e->batch_slots = calloc((size_t)P, sizeof(int));
    e->batch_lens = calloc((size_t)P, sizeof(int));
    e->batch_prompts = calloc((size_t)P, sizeof(*e->batch_prompts));
    e->prefill_order = calloc((size_t)P, sizeof(int));
    e->batch_want = calloc((size_t)P, sizeof(bool));
    e->batch_ids = calloc((size_t)P, sizeof(int32_t));
    if (!e->slots || !e->logits || !e->batch_seqs || !e->batch_tokens || !e->batch_slots ||
        !e->batch_lens || !e->batch_prompts || !e->prefill_order || !e->batch_want || !e->batch_ids)
        return lt_fail(LT_ERR_NOMEM, "out of memory for %d slots", P);
    /* every decode step copies a row of logits a slot (~1 MB each for a 248k vocabulary)
     * into e->logits: page-locked, that copy goes by DMA at full speed */
    e->logits_pinned =
        lt_backend_host_pin(e->cuda, e->logits, (size_t)P * (size_t)hp->n_vocab * sizeof(float));

    /* the base session now, so a model that cannot fit says so at start */
    struct eng_config none = {0};
    int hst;
    eng_step_lock(e);
    struct eng_session *es = eng_session_get(e, &none, &hst);
    /* on a device, load its kernels now rather than during the first request */
    lt_status ws = es && !e->backends[0]->is_host ? lt_session_warmup(es->s) : LT_OK;
    eng_step_unlock(e);
    if (!es)
        return lt_fail(LT_ERR_NOMEM, "cannot create a session of %d x %d tokens: %s", P, n_ctx,
                       lt_last_error());
    if (ws != LT_OK)
        return lt_fail(ws, "warming up on %s: %s", e->backends[0]->name, lt_last_error());

    for (int i = 0; i < e->p.n_loras; i++) {
        const char *path = e->lora_paths[i];
        const char *base = strrchr(path, '/');
        int hs = eng_lora_load(&e->base, base ? base + 1 : path, path, 1.0f);
        if (hs != 200)
            return lt_fail(LT_ERR_INVALID, "--lora %s: %s", path, lt_last_error());
    }
    if (e->train_dir) {
        st = srv_trainer_new(e->model, e->train_backends, e->n_train_backends, &e->act,
                             e->p.train_yield_ms, &e->trainer);
        if (st != LT_OK)
            return st;
    }
    if (pthread_create(&e->loop_thread, NULL, eng_loop_main, e) != 0)
        return lt_fail(LT_ERR_NOMEM, "cannot start the decode thread");
    e->have_loop_thread = true;
    return LT_OK;
}

static void *load_main(void *arg)
{
    struct engine *e = arg;
    lt_status st = load_all(e);
    pthread_mutex_lock(&e->ready_mu);
    if (st != LT_OK) {
        snprintf(e->why, sizeof(e->why), "%s: %s", lt_status_name(st), lt_last_error());
        atomic_store(&e->state, SRV_STATE_FAILED);
    } else {
        atomic_store(&e->state, SRV_STATE_READY);
    }
    pthread_cond_broadcast(&e->ready_cv);
    pthread_mutex_unlock(&e->ready_mu);
    return NULL;
}

/* ---- the interface ---- */

static enum srv_state eng_state(struct srv_engine *se, char *why, size_t why_size)
{
    struct engine *e = eng(se);
    enum srv_state st = (enum srv_state)atomic_load(&e->state);
    if (st == SRV_STATE_FAILED && why)
        snprintf(why, why_size, "%s", e->why);
    return st;
}

static void eng_info(struct srv_engine *se, struct srv_model_info *out)
{
    struct engine *e = eng(se);
    if (atomic_load(&e->state) == SRV_STATE_READY) {
        *out = e->info;
    } else {
        memset(out, 0, sizeof(*out));
        out->parallel = e->p.parallel;
    }
    snprintf(out->id, sizeof(out->id), "%s", e->alias);
}

static int eng_tokenize(struct srv_engine *se, const char *text, size_t len, unsigned flags,
                        struct lt_tokens *out)
{
    struct engine *e = eng(se);
    int st = not_ready(e);
    if (st)
        return st;
    /* "add_special" adds a BOS only where the GGUF asks for one (add_bos_token), as
     * llama.cpp's /tokenize does */
    if ((flags & LT_TOKENIZE_ADD_BOS) &&
        (lt_tokenizer_bos(e->tok) == LT_TOKEN_NONE || !lt_tokenizer_add_bos(e->tok)))
        flags &= ~(unsigned)LT_TOKENIZE_ADD_BOS;
    lt_status ls = lt_tokenize(e->tok, text, len, flags, out);
    return ls == LT_OK ? 200 : srv_fail(srv_http_status_of(ls), NULL, NULL, "%s", lt_last_error());
}

static int eng_detokenize(struct srv_engine *se, const lt_token *ids, size_t n, unsigned flags,
                          struct lt_strbuf *out)
{
    struct engine *e = eng(se);
    int st = not_ready(e);
    if (st)
        return st;
    lt_status ls = lt_detokenize(e->tok, ids, n, flags, out);
    return ls == LT_OK ? 200 : srv_fail(400, "tokens", NULL, "%s", lt_last_error());
}

static int eng_prompt_chat(struct srv_engine *se, const struct lt_chat_message *msgs, size_t n,
                           const struct lt_chat_options *opts, struct lt_tokens *out)
{
    struct engine *e = eng(se);
    int st = not_ready(e);
    if (st)
        return st;
    if (!e->have_ct)
        return srv_fail(400, "messages", "no_chat_template",
                        "the model has no chat template lathe can render; use /v1/completions");
    lt_status ls = lt_gen_prompt_chat_with(e->tok, &e->ct, msgs, n, opts, out);
    return ls == LT_OK ? 200 : srv_fail(srv_http_status_of(ls), "messages", NULL, "%s",
                                        lt_last_error());
}

static int eng_prompt_text(struct srv_engine *se, const char *text, struct lt_tokens *out)
{
    struct engine *e = eng(se);
    int st = not_ready(e);
    if (st)
        return st;
    lt_status ls = lt_gen_prompt_text(e->tok, text, true, out);
    return ls == LT_OK ? 200 : srv_fail(srv_http_status_of(ls), "prompt", NULL, "%s",
                                        lt_last_error());
}

static int eng_submit(struct srv_engine *se, struct srv_gen *g)
{
    struct engine *e = eng(se);
    int st = not_ready(e);
    if (st)
        return st;
    struct eng_config cfg;
    if ((st = eng_config_resolve(e, &g->p, &cfg)) != 200)
        return st;
    pthread_mutex_lock(&e->q_mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->q_mu);
        return srv_fail(503, NULL, "shutting_down", "the server is shutting down");
    }
    if (e->q_len + e->q_admitting >= ENG_MAX_QUEUE) {
        pthread_mutex_unlock(&e->q_mu);
        return srv_fail(503, NULL, "busy", "%d requests are waiting already; try again later",
                        e->q_len);
    }
    srv_gen_ref(g);
    e->queue[e->q_len++] = g;
    pthread_cond_broadcast(&e->q_cv);
    pthread_mutex_unlock(&e->q_mu);
    pthread_mutex_lock(&e->stats_mu);
    e->stats.requests++;
    e->stats.prompt_tokens += g->p.n_prompt;
    pthread_mutex_unlock(&e->stats_mu);
    return 200;
}

static void eng_metrics(struct srv_engine *se, struct lt_strbuf *out)
{
    struct engine *e = eng(se);
    if (atomic_load(&e->state) != SRV_STATE_READY)
        return;
    eng_metrics_decode(e, out);
    if (e->trainer)
        srv_trainer_metrics(e->trainer, out);
}

static int no_training(void)
{
    return srv_fail(403, NULL, "training_disabled",
                    "training is disabled: start lathe serve with --train-dir DIR");
}

static int eng_train_start(struct srv_engine *se, const struct lt_train_params *p,
                           const struct srv_train_meta *meta, char *id, size_t id_size)
{
    struct engine *e = eng(se);
    int st = not_ready(e);
    if (st)
        return st;
    return e->trainer ? srv_trainer_start(e->trainer, p, meta, id, id_size) : no_training();
}

/* On the HTTP thread: the tokenizer and template are immutable once loaded, and the job
 * loads its own from the same file, so this is the job's own verdict. */
static int eng_train_check(struct srv_engine *se, const struct lt_train_params *p,
                           struct lt_train_data_fault *fault)
{
    struct engine *e = eng(se);
    int st = not_ready(e);
    if (st)
        return st;
    lt_status ls = lt_train_data_check(e->tok, e->have_ct ? &e->ct : NULL, p, fault);
    return ls == LT_OK ? 200 : srv_http_status_of(ls);
}

static int eng_train_info(struct srv_engine *se, const char *id, struct srv_train_info *out)
{
    struct engine *e = eng(se);
    if (!e->trainer || atomic_load(&e->state) != SRV_STATE_READY)
        return srv_fail(404, NULL, "not_found", "no training job has run");
    return srv_trainer_info(e->trainer, id, out);
}

static int eng_train_list(struct srv_engine *se, char (*ids)[48], int max, int *n)
{
    struct engine *e = eng(se);
    *n = 0;
    if (!e->trainer || atomic_load(&e->state) != SRV_STATE_READY)
        return 200;
    return srv_trainer_list(e->trainer, ids, max, n);
}

static int eng_train_control(struct srv_engine *se, const char *id, enum srv_train_op op)
{
    struct engine *e = eng(se);
    int st = not_ready(e);
    if (st)
        return st;
    return e->trainer ? srv_trainer_control(e->trainer, id, op) : no_training();
}

/* A special token by its text, LT_TOKEN_NONE when the vocabulary has none. */
static lt_token find_special(const struct lt_tokenizer *t, const char *const *texts)
{
    for (; *texts; texts++) {
        lt_token id = lt_tokenizer_find(t, *texts, strlen(*texts));
        if (id != LT_TOKEN_NONE)
            return id;
    }
    return LT_TOKEN_NONE;
}

/* A token id from the GGUF's tokenizer.ggml.KEY, else by its text. */
static lt_token fim_token(struct engine *e, const char *key, const char *const *texts)
{
    const struct lt_gguf *g = lt_model_gguf(e->model);
    int64_t k = lt_gguf_find_key(g, key);
    if (k >= 0) {
        uint32_t v = 0;
        if (lt_gguf_get_u32(g, key, &v) == LT_OK && v < lt_tokenizer_n_tokens(e->tok))
            return (lt_token)v;
    }
    return find_special(e->tok, texts);
}

static void token_text(const struct lt_tokenizer *t, lt_token id, char *out, size_t size)
{
    size_t len = 0;
    const char *s = id == LT_TOKEN_NONE ? NULL : lt_tokenizer_token_text(t, id, &len);
    snprintf(out, size, "%.*s", s ? (int)len : 0, s ? s : "");
}

static int eng_props(struct srv_engine *se, struct srv_props *out)
{
    struct engine *e = eng(se);
    memset(out, 0, sizeof(*out));
    int st = not_ready(e);
    if (st)
        return st;
    snprintf(out->model_path, sizeof(out->model_path), "%s", e->model_path);
    const char *ct = NULL;
    if (lt_gguf_find_key(lt_model_gguf(e->model), "tokenizer.chat_template") >= 0 &&
        lt_gguf_get_str(lt_model_gguf(e->model), "tokenizer.chat_template", &ct) == LT_OK && ct &&
        !(out->chat_template = strdup(ct)))
        return srv_fail(503, NULL, NULL, "out of memory for the chat template");
    token_text(e->tok, lt_tokenizer_bos(e->tok), out->bos_token, sizeof(out->bos_token));
    token_text(e->tok, lt_tokenizer_eos(e->tok), out->eos_token, sizeof(out->eos_token));
    out->add_bos = lt_tokenizer_add_bos(e->tok);
    out->bos = lt_tokenizer_bos(e->tok);
    /* as llama.cpp finds them: the GGUF's ids, else the token texts its families use */
    static const char *const pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>",
                                      "\xe2\x96\x81<PRE>", "<|fim_begin|>", NULL};
    static const char *const suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>",
                                      "\xe2\x96\x81<SUF>", "<|fim_hole|>", NULL};
    static const char *const mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>",
                                      "\xe2\x96\x81<MID>", "<|fim_end|>", NULL};
    static const char *const rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", NULL};
    static const char *const sep[] = {"<|file_sep|>", "<fim-sep>", NULL};
    out->fim_pre = fim_token(e, "tokenizer.ggml.fim_pre_token_id", pre);
    out->fim_suf = fim_token(e, "tokenizer.ggml.fim_suf_token_id", suf);
    out->fim_mid = fim_token(e, "tokenizer.ggml.fim_mid_token_id", mid);
    out->fim_rep = fim_token(e, "tokenizer.ggml.fim_rep_token_id", rep);
    out->fim_sep = fim_token(e, "tokenizer.ggml.fim_sep_token_id", sep);
    return 200;
}

/* The slots as the decode loop has them, between two of its steps. */
static int eng_slots(struct srv_engine *se, struct srv_slot_info **out, int *n)
{
    struct engine *e = eng(se);
    *out = NULL;
    *n = 0;
    int st = not_ready(e);
    if (st)
        return st;
    int P = e->p.parallel;
    struct srv_slot_info *v = calloc((size_t)P, sizeof(*v));
    if (!v)
        return srv_fail(503, NULL, NULL, "out of memory for %d slots", P);
    eng_step_lock(e);
    for (int i = 0; i < P; i++) {
        const struct eng_slot *sl = &e->slots[i];
        struct srv_slot_info *si = &v[i];
        si->id = i;
        si->n_ctx = e->info.n_ctx;
        si->sampling = lt_sampler_default_params();
        if (sl->state == ENG_SLOT_FREE || !sl->g)
            continue;
        si->is_processing = true;
        si->n_prompt = (int)sl->g->p.n_prompt;
        si->n_prefilled = (int)sl->n_prefilled;
        si->n_decoded = sl->have_gs ? (int)lt_gen_seq_stats(&sl->gs).n_generated : 0;
        si->max_tokens = sl->g->p.max_tokens;
        si->sampling = sl->g->p.sampling;
        si->n_stops = (int)sl->g->p.n_stops;
    }
    eng_step_unlock(e);
    *out = v;
    *n = P;
    return 200;
}

/* On the HTTP thread under step_mu (the decode loop's sessions are not touched): one
 * sequence of a session of its own, prefilled, its final-norm states pooled, then cleared. */
static int eng_embed(struct srv_engine *se, const lt_token *ids, size_t n, float *out)
{
    struct engine *e = eng(se);
    int st = not_ready(e);
    if (st)
        return st;
    int64_t D = e->info.n_embd;
    if (n == 0)
        return srv_fail(400, "input", NULL, "an input has no tokens");
    if (n > (size_t)e->info.n_ctx)
        return srv_fail(400, "input", "context_length_exceeded",
                        "an input of %zu tokens exceeds the context of %d", n, e->info.n_ctx);
    eng_step_lock(e);
    lt_status ls = LT_OK;
    if (!e->embed_s) {
        struct lt_session_params sp = {
            .n_ctx = e->info.n_ctx,
            .n_seq_max = 1,
            .backends = e->backends,
            .n_backends = e->n_backends,
            .n_threads = e->p.n_threads,
            .half_acts = -1, /* F32 activations: the embedding as llama.cpp computes it */
        };
        if (!e->embed_h)
            e->embed_h = malloc((size_t)e->info.n_ctx * (size_t)D * sizeof(float));
        ls = e->embed_h ? lt_session_new(e->model, &sp, &e->embed_s)
                        : lt_fail(LT_ERR_NOMEM, "out of memory for embeddings");
    }
    if (ls == LT_OK)
        ls = lt_session_prefill_hidden(e->embed_s, 0, ids, (int)n, e->embed_h);
    lt_status cl = e->embed_s ? lt_session_seq_clear(e->embed_s, 0) : LT_OK;
    if (ls == LT_OK)
        ls = cl;
    if (ls == LT_OK) {
        const float *h = e->embed_h;
        size_t first = e->p.pooling == LT_SERVER_POOLING_LAST ? n - 1 : 0;
        double norm = 0;
        for (int64_t d = 0; d < D; d++) {
            double sum = 0;
            for (size_t t = first; t < n; t++)
                sum += h[t * (size_t)D + (size_t)d];
            out[d] = (float)(sum / (double)(n - first));
            norm += (double)out[d] * out[d];
        }
        norm = sqrt(norm);
        for (int64_t d = 0; d < D; d++)
            out[d] = norm > 0 ? (float)(out[d] / norm) : 0.0f;
    }
    eng_step_unlock(e);
    if (ls != LT_OK)
        return srv_fail(srv_http_status_of(ls), "input", NULL, "embedding: %s", lt_last_error());
    pthread_mutex_lock(&e->stats_mu);
    e->stats.prompt_tokens += n;
    pthread_mutex_unlock(&e->stats_mu);
    return 200;
}

static void eng_free(struct srv_engine *se)
{
    struct engine *e = eng(se);
    if (e->have_load_thread)
        pthread_join(e->load_thread, NULL);
    pthread_mutex_lock(&e->q_mu);
    e->stopping = true;
    pthread_cond_broadcast(&e->q_cv);
    pthread_mutex_unlock(&e->q_mu);
    if (e->have_loop_thread)
        pthread_join(e->loop_thread, NULL);
    eng_fail_all(e, 503, "the server is shutting down");
    srv_trainer_free(e->trainer);
    eng_sessions_free_all(e);
    lt_session_free(e->embed_s);
    free(e->embed_h);
    eng_loras_free_all(e);
    if (e->logits_pinned)
        lt_backend_host_unpin(e->cuda, e->logits);
    free(e->logits);
    free(e->batch_seqs);
    free(e->batch_tokens);
    free(e->batch_slots);
    free(e->batch_lens);
    free(e->batch_prompts);
    free(e->prefill_order);
    free(e->batch_want);
    free(e->batch_ids);
    free(e->slots);
    free(e->queue);
    free(e->admitting);
    if (e->have_ct)
        lt_chat_template_free(&e->ct);
    lt_tokenizer_free(e->tok);
    lt_model_free(e->model);
    if (e->cuda_shared)
        lt_backend_free(e->cuda_shared);
    if (e->cuda)
        lt_backend_free(e->cuda);
    if (e->cpu)
        lt_backend_free(e->cpu);
    if (e->train_cpu)
        lt_backend_free(e->train_cpu);
    for (int i = 0; i < e->p.n_loras; i++)
        free(e->lora_paths[i]);
    free(e->lora_paths);
    free(e->model_path);
    free(e->train_dir);
    free(e->alias);
    pthread_mutex_destroy(&e->q_mu);
    pthread_cond_destroy(&e->q_cv);
    pthread_mutex_destroy(&e->step_mu);
    pthread_mutex_destroy(&e->lora_mu);
    pthread_mutex_destroy(&e->stats_mu);
    pthread_mutex_destroy(&e->act.ring_mu);
    pthread_mutex_destroy(&e->ready_mu);
    pthread_cond_destroy(&e->ready_cv);
    free(e);
}

static const struct srv_engine_iface engine_iface = {
    .state = eng_state,
    .info = eng_info,
    .tokenize = eng_tokenize,
    .detokenize = eng_detokenize,
    .prompt_chat = eng_prompt_chat,
    .prompt_text = eng_prompt_text,
    .submit = eng_submit,
    .metrics = eng_metrics,
    .lora_list = eng_lora_list,
    .lora_load = eng_lora_load,
    .lora_unload = eng_lora_unload,
    .lora_set_scale = eng_lora_set_scale,
    .train_start = eng_train_start,
    .train_check = eng_train_check,
    .train_info = eng_train_info,
    .train_list = eng_train_list,
    .train_control = eng_train_control,
    .props = eng_props,
    .slots = eng_slots,
    .embed = eng_embed,
    .free = eng_free,
};

static char *alias_of(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *a = strdup(base);
    if (a) {
        size_t n = strlen(a);
        if (n > 5 && !strcmp(a + n - 5, ".gguf"))
            a[n - 5] = 0;
    }
    return a;
}

lt_status srv_engine_model_new(const struct lt_server_params *p, struct srv_engine **out)
{
    *out = NULL;
    struct engine *e = calloc(1, sizeof(*e));
    if (!e)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the engine");
    e->base.iface = &engine_iface;
    e->base.impl = e;
    e->p = *p;
    pthread_mutex_init(&e->q_mu, NULL);
    pthread_cond_init(&e->q_cv, NULL);
    pthread_mutex_init(&e->step_mu, NULL);
    pthread_mutex_init(&e->lora_mu, NULL);
    pthread_mutex_init(&e->stats_mu, NULL);
    pthread_mutex_init(&e->act.ring_mu, NULL);
    pthread_mutex_init(&e->ready_mu, NULL);
    pthread_cond_init(&e->ready_cv, NULL);
    atomic_init(&e->state, SRV_STATE_LOADING);
    atomic_init(&e->act.busy, 0);
    atomic_init(&e->step_waiting, 0);
    atomic_init(&e->act.last_busy_us, 0);
    bool ok = true;
    e->model_path = strdup(p->model_path);
    e->alias = p->model_alias ? strdup(p->model_alias) : alias_of(p->model_path);
    e->train_dir = p->train_dir ? strdup(p->train_dir) : NULL;
    ok = e->model_path && e->alias && (!p->train_dir || e->train_dir);
    e->lora_paths = calloc((size_t)(p->n_loras > 0 ? p->n_loras : 1), sizeof(char *));
    ok = ok && e->lora_paths;
    for (int i = 0; ok && i < p->n_loras; i++)
        ok = (e->lora_paths[i] = strdup(p->loras[i])) != NULL;
    e->queue = calloc(ENG_MAX_QUEUE, sizeof(*e->queue));
    e->admitting = calloc(ENG_MAX_QUEUE, sizeof(*e->admitting));
    ok = ok && e->queue && e->admitting;
    e->p.model_path = e->model_path;
    e->p.train_dir = e->train_dir;
    e->p.loras = NULL;
    if (!ok) {
        e->p.n_loras = 0;
        eng_free(&e->base);
        return lt_fail(LT_ERR_NOMEM, "out of memory for the engine");
    }
    if (pthread_create(&e->load_thread, NULL, load_main, e) != 0) {
        eng_free(&e->base);
        return lt_fail(LT_ERR_NOMEM, "cannot start the loading thread");
    }
    e->have_load_thread = true;
    *out = &e->base;
    return LT_OK;
}

lt_status srv_engine_model_wait(struct srv_engine *se)
{
    struct engine *e = eng(se);
    pthread_mutex_lock(&e->ready_mu);
    while (atomic_load(&e->state) == SRV_STATE_LOADING)
        pthread_cond_wait(&e->ready_cv, &e->ready_mu);
    pthread_mutex_unlock(&e->ready_mu);
    if (atomic_load(&e->state) == SRV_STATE_READY)
        return LT_OK;
    return lt_fail(LT_ERR_INVALID, "%s", e->why);
}
