/* job.c: training jobs: the run (data, trainables, admission, the loop, the output) and the
 * control around it (thread, pause, resume, cancel, progress).
 *
 * One micro-batch graph of n_seqs sequences of n_tokens = min(window, longest example)
 * positions is built and admitted once. Examples are packed into its sequences padding-free
 * when two of them fit one sequence (unless no_pack): in order, each into the first
 * sequence with room, until one fits none; each starts at position 0 with empty state and
 * sees only itself (lt_model_build_loss_packed), and only what is left after a sequence's
 * last example is padding. Otherwise (or with no_pack) each example takes a sequence of its
 * own, padded at the end with labels -1 (attention and DeltaNet are causal and stay within
 * a sequence, so padding after an example cannot change it; a short last micro-batch fills
 * its empty sequences with padding alone). The graph's loss is the mean over every label of
 * the micro-batch, so a step's loss and gradient weigh examples by their labelled tokens,
 * as a padded batch does in PyTorch. Packed, a step's examples default to as many as
 * grad_accum micro-batches hold on average (a first-fit pass over the training data).
 * The output file is written only after the last epoch, and only when nothing failed and
 * nobody cancelled: a job that stops early leaves the disk as it found it. All memory the
 * run took is released before the job reports its final state.
 *
 * Data parallelism (params.comm, lathe/comm.h): every rank runs this same code on the same
 * data with the same seed, so all load, split and shuffle alike. A step's examples are cut
 * into micro-batches exactly as one rank would cut them, and micro-batch m goes to rank
 * m % world (round robin, not contiguous shares: a step whose micro-batches do not divide
 * evenly leaves the last ranks one short, never one rank with all the rest). The step's
 * gradient is the mean of its micro-batches' gradients, so the ranks sum their accumulators
 * and the micro-batch counts, and each steps over the global count: every rank applies the
 * update one rank would apply to the whole step, and the loss curve is the same (up to the
 * order of the sums). The ranks agree on their status wherever one rank's failure must stop
 * all (admission, before allocation; allocation; each step; each evaluation; the output),
 * and a failing rank's reason, its refusal unchanged, becomes every rank's. Only rank 0
 * checks and writes the output. Validation runs whole on every rank (same weights, same
 * numbers). Without a communicator none of this runs and the job is what it always was. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lathe/comm.h"
#include "lathe/gguf.h"
#include "lathe/lora.h"
#include "lathe/model.h"
#include "lathe/rng.h"
#include "lathe/sched.h"
#include "lathe/tokenizer.h"
#include "lathe/train.h"
#include "train/dataset.h"
#include "train/train_impl.h"

struct lt_train_job {
    struct lt_model *model;
    struct lt_backend *backends[LT_SCHED_MAX_BACKENDS];
    int n_backends;
    struct lt_train_params p; /* defaults filled; strings point into strs */
    char *strs[7];
    lt_train_progress_fn progress_fn;
    void *user;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool has_thread;
    bool cancel, pause;
    enum lt_train_state state;
    struct lt_train_progress prog;
    struct lt_train_result result;
};

/* What one run holds; released by run_free in reverse order. */
struct run {
    struct lt_tokenizer *tok;
    struct lt_chat_template ct;
    bool have_ct;
    struct lt_dataset data;
    int *order; /* [n]: validation first (n_val), then training */
    int n_val;
    struct lt_lora *lora;
    struct lt_model_f32_params *f32;
    struct lt_model_lora *lora_list;
    int n_lora;
    struct lt_ctx *ctx;
    struct lt_model_loss_graph lg;
    struct lt_train_graph *tg;
    int n_tokens;   /* per sequence of the micro-batch graph */
    int n_seqs;     /* sequences per micro-batch graph */
    int grad_accum; /* micro-batches per optimizer step */
    int per_step;   /* examples per optimizer step */
    int32_t *tok_buf, *lab_buf; /* [n_tokens * n_seqs] */
    bool packed;                /* examples packed padding-free (lt_model_build_loss_packed) */
    int32_t *pos_buf;           /* packed: [n_tokens * n_seqs], positions within examples */
    int *fill_buf;              /* packed: [n_seqs], tokens placed in each sequence */
    int *row_buf, *at_buf;      /* [n_tokens * n_seqs]: the last plan's sequence and first
                                   step of each example it took */
    float *mask_buf;            /* packed: the host side of the graph's mask and gate reset */
    int32_t pad;
    double active_s;             /* running time, pauses excluded */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_free(struct run *r)
{
    lt_train_graph_free(r->tg); /* points the trainable tensors home before they are freed */
    lt_ctx_free(r->ctx);
    free(r->lora_list);
    lt_model_f32_params_free(r->f32);
    lt_lora_free(r->lora);
    free(r->order);
    free(r->tok_buf);
    free(r->lab_buf);
    free(r->pos_buf);
    free(r->fill_buf);
    free(r->row_buf);
    free(r->at_buf);
    free(r->mask_buf);
    lt_dataset_free(&r->data);
    if (r->have_ct)
        lt_chat_template_free(&r->ct);
    lt_tokenizer_free(r->tok);
    memset(r, 0, sizeof(*r));
}

/* ---- control ---- */

static void set_state(struct lt_train_job *j, enum lt_train_state s)
{
    pthread_mutex_lock(&j->mu);
    j->state = s;
    j->prog.state = s;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* Blocks while paused; true when the job should stop. Paused time is not running time. */
static bool should_stop(struct lt_train_job *j, struct run *r, double *t_mark)
{
    pthread_mutex_lock(&j->mu);
    if (j->pause && !j->cancel) {
        r->active_s += now_s() - *t_mark;
        j->state = j->prog.state = LT_TRAIN_PAUSED;
        pthread_cond_broadcast(&j->cv);
        while (j->pause && !j->cancel)
            pthread_cond_wait(&j->cv, &j->mu);
        j->state = j->prog.state = LT_TRAIN_RUNNING;
        pthread_cond_broadcast(&j->cv);
        *t_mark = now_s();
    }
    bool stop = j->cancel;
    pthread_mutex_unlock(&j->mu);
    return stop;
}

static void report(struct lt_train_job *j, const struct lt_train_progress *pr)
{
    pthread_mutex_lock(&j->mu);
    enum lt_train_state s = j->prog.state;
    j->prog = *pr;
    j->prog.state = s;
    struct lt_train_progress copy = j->prog;
    pthread_mutex_unlock(&j->mu);
    if (j->progress_fn)
        j->progress_fn(j->user, &copy);
}

/* ---- ranks ---- */

static int job_rank(const struct lt_train_job *j)
{
    return j->p.comm ? lt_comm_rank(j->p.comm) : 0;
}

static int job_world(const struct lt_train_job *j)
{
    return j->p.comm ? lt_comm_size(j->p.comm) : 1;
}

/* st agreed over the ranks at a point every rank reaches: the lowest failing rank's status
 * becomes every rank's, with its refusal (unchanged, sentence and all) or its reason behind
 * "rank R of W: ". Without a communicator, st itself. */
static lt_status agree(struct lt_train_job *j, lt_status st)
{
    struct lt_comm *c = j->p.comm;
    if (!c)
        return st;
    struct lt_refusal *ref = &j->result.refusal;
    const char *why = st == LT_OK                                            ? ""
                      : st == LT_ERR_REFUSED && ref->kind != LT_REFUSAL_NONE ? ref->sentence
                                                                             : lt_last_error();
    struct lt_comm_verdict v;
    lt_status cst = lt_comm_agree(c, st, why, &v);
    if (cst == LT_OK && v.status != LT_OK)
        cst = lt_comm_broadcast(c, ref, sizeof(*ref), v.rank);
    if (cst != LT_OK)
        return cst;
    if (v.status == LT_OK || v.rank == lt_comm_rank(c))
        return v.status == LT_OK ? LT_OK : lt_fail(v.status, "%s", v.reason);
    if (v.status == LT_ERR_REFUSED && ref->kind != LT_REFUSAL_NONE)
        return lt_fail(v.status, "%s", ref->sentence);
    return lt_fail(v.status, "rank %d of %d: %s", v.rank, lt_comm_size(c), v.reason);
}

/* Every rank must cut its steps alike; the data decides the sequence length and the
 * admission the sequences per micro-batch, which on a device follow its free memory. */
static lt_status same_geometry(struct lt_train_job *j, const struct run *r)
{
    int mine[3] = {r->n_tokens, r->n_seqs, r->per_step}, root[3];
    memcpy(root, mine, sizeof(mine));
    lt_status st = lt_comm_broadcast(j->p.comm, root, sizeof(root), 0);
    if (st == LT_OK && memcmp(root, mine, sizeof(mine)) != 0)
        st = lt_fail(LT_ERR_INVALID,
                     "rank %d cut its steps into micro-batches of %d sequences of %d tokens, %d "
                     "examples a step, and rank 0 into %d of %d, %d: give every rank the same "
                     "data and batch_tokens",
                     job_rank(j), mine[1], mine[0], mine[2], root[1], root[0], root[2]);
    return st;
}

/* ---- the run ---- */

static lt_status load_data(struct lt_train_job *j, struct run *r)
{
    const struct lt_train_params *p = &j->p;
    lt_status st = lt_tokenizer_from_gguf(lt_model_gguf(j->model), &r->tok);
    if (st != LT_OK)
        return st;
    if (p->examples || p->examples_path) {
        st = lt_chat_template_from_gguf(lt_model_gguf(j->model), &r->ct);
        if (st != LT_OK)
            return p->examples_path ? lt_fail(st, "%s: %s", p->examples_path, lt_last_error()) : st;
        r->have_ct = true;
    }
    st = lt_train_data_load(r->tok, r->have_ct ? &r->ct : NULL, p, &r->data, &r->order, &r->n_val,
                            NULL);
    if (st != LT_OK)
        return st;
    int longest = 1;
    for (int i = 0; i < r->data.n; i++)
        longest = r->data.ex[i].n > longest ? r->data.ex[i].n : longest;
    r->n_tokens = longest < p->window ? longest : p->window;
    /* packing pays when two examples fit one sequence */
    int short1 = r->n_tokens + 1, short2 = r->n_tokens + 1;
    for (int i = 0; i < r->data.n; i++) {
        int n = r->data.ex[i].n;
        if (n < short1) {
            short2 = short1;
            short1 = n;
        } else if (n < short2) {
            short2 = n;
        }
    }
    r->packed = !p->no_pack && r->data.n >= 2 && short1 + short2 <= r->n_tokens;
    j->result.packed = r->packed;
    lt_token pad = lt_tokenizer_pad(r->tok);
    if (pad == LT_TOKEN_NONE)
        pad = lt_tokenizer_eos(r->tok);
    r->pad = pad == LT_TOKEN_NONE ? 0 : pad;
    j->result.n_train = r->data.n - r->n_val;
    j->result.n_val = r->n_val;
    j->result.n_fitted = r->data.n_fitted;
    j->result.n_skipped = r->data.n_skipped;
    j->result.n_tokens_graph = r->n_tokens;
    return LT_OK;
}

/* The trainable tensors with their shapes and addresses but no memory yet: admission
 * measures from shapes alone, and commit_trainables takes the memory once it has said yes. */
static lt_status make_trainables(struct lt_train_job *j, struct run *r,
                                 struct lt_model_adapters *ad)
{
    const struct lt_train_params *p = &j->p;
    memset(ad, 0, sizeof(*ad));
    lt_status st;
    if (p->full) {
        for (int i = 0; i < lt_model_n_weights(j->model); i++) {
            const struct lt_tensor *w = lt_model_weight(j->model, i);
            if (w->type != LT_TYPE_F32 && w->type != LT_TYPE_F16 && w->type != LT_TYPE_BF16)
                return lt_fail(LT_ERR_INVALID,
                               "full fine-tuning needs an F32, F16 or BF16 model, and '%s' is %s; "
                               "train a LoRA on this model instead",
                               w->name, lt_type_name(w->type));
        }
        st = lt_model_f32_params_reserve(j->model, NULL, NULL, &r->f32);
        if (st != LT_OK)
            return st;
        ad->replace = lt_model_f32_params_list(r->f32, &ad->n_replace);
        return LT_OK;
    }
    struct lt_lora_params lp = {.rank = p->rank,
                                .alpha = p->alpha,
                                .targets = p->targets,
                                .top_layers = p->top_layers,
                                .seed = p->seed};
    if ((st = lt_lora_reserve(j->model, &lp, &r->lora)) != LT_OK)
        return st;
    struct lt_lora *ls[1] = {r->lora};
    if ((st = lt_lora_model_list(j->model, ls, NULL, 1, &r->lora_list, &r->n_lora)) != LT_OK)
        return st;
    ad->lora = r->lora_list;
    ad->n_lora = r->n_lora;
    return LT_OK;
}

/* Commits the trainable tensors' memory and fills it (LoRA's A drawn, B zero; or the
 * weights' F32 copies). */
static lt_status commit_trainables(struct run *r)
{
    return r->f32 ? lt_model_f32_params_commit(r->f32) : lt_lora_commit(r->lora);
}

static void capture_admission(struct lt_train_job *j, struct run *r)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return;
    lt_train_graph_print(r->tg, f);
    fclose(f);
    snprintf(j->result.admission, sizeof(j->result.admission), "%s", buf ? buf : "");
    free(buf);
}

static lt_status build_and_admit_as(struct lt_train_job *j, struct run *r,
                                    const struct lt_model_adapters *ad, enum lt_checkpoint c)
{
    const bool remat = c == LT_CHECKPOINT_ON || c == LT_CHECKPOINT_SELECTIVE;
    const struct lt_train_params *p = &j->p;
    r->ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 16u << 20, .no_alloc = true});
    if (!r->ctx)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the training graph");
    lt_status st =
        r->packed ? lt_model_build_loss_packed(j->model, r->ctx, r->n_tokens, r->n_seqs, ad, &r->lg)
                  : lt_model_build_loss(j->model, r->ctx, r->n_tokens, r->n_seqs, ad, &r->lg);
    if (st != LT_OK)
        return st;
    size_t reserve = p->serving_reserve_mib;
    if (reserve == 0 && !j->backends[0]->is_host)
        reserve = 1024;
    struct lt_train_graph_params gp = {
        .backends = j->backends,
        .n_backends = j->n_backends,
        .device_only = p->device_only,
        .memory_budget = p->memory_budget_mib << 20,
        .serving_reserve = reserve << 20,
        .optimizer = LT_OPTIMIZER_ADAMW,
        .weight_decay = p->weight_decay,
        .remat_bounds = remat ? r->lg.bounds : NULL,
        .n_remat_bounds = remat ? r->lg.n_bounds : 0,
        .remat_selective = c == LT_CHECKPOINT_SELECTIVE,
    };
    st = lt_train_graph_new(r->ctx, r->lg.loss, &gp, &r->tg, &j->result.refusal);
    if (st != LT_OK)
        return st;
    struct lt_train_result *res = &j->result;
    res->peak_bytes = lt_train_graph_estimate(r->tg);
    lt_train_graph_estimate_parts(r->tg, &res->scratch_bytes, &res->in_use_bytes);
    res->n_recomputed = lt_train_graph_n_recomputed(r->tg);
    res->recompute_selective = c == LT_CHECKPOINT_SELECTIVE;
    res->n_fallback = lt_train_graph_n_fallback(r->tg);
    res->n_trainable = lt_train_graph_n_params(r->tg);
    for (int i = 0; i < res->n_trainable; i++)
        res->n_trainable_elements += lt_nelements(lt_train_graph_param(r->tg, i));
    capture_admission(j, r);
    return LT_OK;
}

static void release_graph(struct run *r, struct lt_train_result *res);

/* The graph of r->n_seqs sequences, with checkpointing as the job asks: AUTO tries without,
 * then (refused for memory) with whole layers, the least memory; when that fits, selective
 * (which recomputes the cheap activations alone) is tried before it is kept, and whole
 * layers are built again if selective does not fit. The same values every way; a job that
 * fits in no way is refused after two graphs, as before selective existed (a refusal must
 * cost little: test_train_refusal_cost). */
static lt_status build_and_admit(struct lt_train_job *j, struct run *r,
                                 const struct lt_model_adapters *ad)
{
    const enum lt_checkpoint c = j->p.checkpoint;
    if (c != LT_CHECKPOINT_AUTO)
        return build_and_admit_as(j, r, ad, c);
    lt_status st = build_and_admit_as(j, r, ad, LT_CHECKPOINT_OFF);
    if (st == LT_OK || j->result.refusal.kind != LT_REFUSAL_MEMORY)
        return st;
    release_graph(r, &j->result);
    if ((st = build_and_admit_as(j, r, ad, LT_CHECKPOINT_ON)) != LT_OK)
        return st;
    release_graph(r, &j->result);
    st = build_and_admit_as(j, r, ad, LT_CHECKPOINT_SELECTIVE);
    if (st == LT_OK || j->result.refusal.kind != LT_REFUSAL_MEMORY)
        return st;
    release_graph(r, &j->result);
    return build_and_admit_as(j, r, ad, LT_CHECKPOINT_ON);
}

#define AUTO_BATCH_TOKENS 16384

/* Drops an admitted or refused graph before the next try. */
static void release_graph(struct run *r, struct lt_train_result *res)
{
    lt_train_graph_free(r->tg);
    r->tg = NULL;
    lt_ctx_free(r->ctx);
    r->ctx = NULL;
    memset(&res->refusal, 0, sizeof(res->refusal));
    res->refusal.kind = LT_REFUSAL_NONE;
}

/* How many of the examples idx[0..n) (n >= 1) the next micro-batch takes: one a sequence;
 * packed, each into the first sequence with room, in order, until one fits none (at least
 * one: no example is longer than a sequence). Each taken example's sequence and first step
 * go to row_buf and at_buf, for set_inputs. */
static int plan_micro(struct run *r, const int *idx, int n)
{
    if (!r->packed) {
        int take = n < r->n_seqs ? n : r->n_seqs;
        for (int i = 0; i < take; i++)
            r->row_buf[i] = i, r->at_buf[i] = 0;
        return take;
    }
    memset(r->fill_buf, 0, sizeof(int) * (size_t)r->n_seqs);
    const int cap = r->n_tokens * r->n_seqs;
    int take = 0;
    for (; take < n && take < cap; take++) {
        const int len = r->data.ex[idx[take]].n;
        int s = 0;
        while (s < r->n_seqs && r->fill_buf[s] + len > r->n_tokens)
            s++;
        if (s == r->n_seqs)
            break;
        r->row_buf[take] = s;
        r->at_buf[take] = r->fill_buf[s];
        r->fill_buf[s] += len;
    }
    return take;
}

/* Chooses the micro-batch (sequences side by side) and the accumulation, then builds and
 * admits the graph. batch_tokens 0 on a device tries the most sequences that 16384 tokens
 * hold and halves them while admission refuses for memory, down to one sequence (the graph
 * of a job that was admitted before there were packed steps), trying one sequence right
 * after the first refusal so a job that cannot fit at all is refused after two tries; on
 * the host it is one window.
 * A micro-batch never holds more sequences than a step has examples. */
static lt_status choose_and_admit(struct lt_train_job *j, struct run *r,
                                  const struct lt_model_adapters *ad)
{
    const struct lt_train_params *p = &j->p;
    struct lt_train_result *res = &j->result;
    int n_train = r->data.n - r->n_val;
    bool auto_size = p->batch_tokens == 0 && !j->backends[0]->is_host;
    int tokens = p->batch_tokens > 0 ? p->batch_tokens
                 : auto_size         ? AUTO_BATCH_TOKENS
                                     : r->n_tokens;
    int seqs = tokens / r->n_tokens > 1 ? tokens / r->n_tokens : 1;
    int cap = p->batch > 0 ? p->batch : n_train;
    seqs = seqs < cap ? seqs : cap;
    seqs = seqs < n_train ? seqs : n_train;
    lt_status st;
    bool probed_one = false;
    for (;;) {
        r->n_seqs = seqs;
        st = build_and_admit(j, r, ad);
        if (st == LT_OK || !auto_size || seqs == 1 || res->refusal.kind != LT_REFUSAL_MEMORY)
            break;
        release_graph(r, res);
        /* A micro-batch's memory grows with its sequences, so when one sequence is refused
         * too, every size the halving would try is: try one next, and end there with the
         * refusal the halving would have ended on (each try builds and measures the whole
         * graph again, 15 ms for a 0.8B Qwen3.5). */
        if (!probed_one && seqs > 2) {
            probed_one = true;
            r->n_seqs = 1;
            st = build_and_admit(j, r, ad);
            if (st != LT_OK)
                break;
            release_graph(r, res);
        }
        seqs /= 2;
    }
    if (st != LT_OK)
        return st;
    size_t n = (size_t)r->n_tokens * (size_t)seqs;
    r->tok_buf = malloc(n * sizeof(int32_t));
    r->lab_buf = malloc(n * sizeof(int32_t));
    r->pos_buf = malloc(n * sizeof(int32_t));
    r->fill_buf = malloc((size_t)seqs * sizeof(int));
    r->row_buf = malloc(n * sizeof(int));
    r->at_buf = malloc(n * sizeof(int));
    /* the mask's rows (none with FLASH_ATTN: it reads the positions) and the gate reset */
    r->mask_buf = r->packed
                      ? malloc(n * ((r->lg.kq_mask ? (size_t)r->n_tokens : 0) + 1) * sizeof(float))
                      : NULL;
    if (!r->tok_buf || !r->lab_buf || !r->pos_buf || !r->fill_buf || !r->row_buf || !r->at_buf ||
        (r->packed && !r->mask_buf))
        return lt_fail(LT_ERR_NOMEM, "out of memory");
    /* examples a micro-batch holds: its sequences, or packed, the training data's average
     * over a first-fit pass */
    int per_micro = seqs;
    if (r->packed) {
        const int *train_idx = r->order + r->n_val;
        int micro = 0;
        for (int k = 0; k < n_train; micro++)
            k += plan_micro(r, train_idx + k, n_train - k);
        per_micro = micro > 0 ? (n_train + micro - 1) / micro : seqs;
    }
    if (p->batch > 0) {
        r->per_step = p->batch;
        r->grad_accum = (p->batch + per_micro - 1) / per_micro;
    } else {
        r->grad_accum = p->grad_accum > 0 ? p->grad_accum : 1;
        r->per_step = per_micro * r->grad_accum;
    }
    res->n_seqs_graph = seqs;
    res->grad_accum = r->grad_accum;
    return LT_OK;
}

/* Copies the micro-batch of examples idx[0..n), as the plan_micro call just before took
 * and placed them, into the graph's sequences; the rest is padding (labels -1), a packed
 * sequence's positions counting on after its last example. Returns their labelled tokens
 * in *n_loss. */
static lt_status set_inputs(struct run *r, const int *idx, int n, double *n_loss)
{
    *n_loss = 0;
    const size_t N = (size_t)r->n_tokens * (size_t)r->n_seqs;
    for (size_t i = 0; i < N; i++) {
        r->tok_buf[i] = r->pad;
        r->lab_buf[i] = -1;
        r->pos_buf[i] = 1; /* not an example's first step */
    }
    for (int i = 0; i < n; i++) {
        const struct lt_example *e = &r->data.ex[idx[i]];
        const size_t base = (size_t)r->row_buf[i] * r->n_tokens + (size_t)r->at_buf[i];
        memcpy(r->tok_buf + base, e->tokens, sizeof(int32_t) * (size_t)e->n);
        memcpy(r->lab_buf + base, e->labels, sizeof(int32_t) * (size_t)e->n);
        r->pos_buf[base] = 0;
        *n_loss += e->n_loss;
    }
    size_t bytes = N * sizeof(int32_t);
    lt_status st = lt_tensor_set(r->lg.tokens, r->tok_buf, 0, bytes);
    if (st == LT_OK)
        st = lt_tensor_set(r->lg.labels, r->lab_buf, 0, bytes);
    if (st != LT_OK || !r->packed)
        return st;
    /* positions: 0 where an example starts (and where a sequence does), counting on after */
    for (int s = 0; s < r->n_seqs; s++) {
        int32_t *pos = r->pos_buf + (size_t)s * r->n_tokens;
        for (int t = 0; t < r->n_tokens; t++)
            pos[t] = t == 0 || pos[t] == 0 ? 0 : pos[t - 1] + 1;
    }
    return lt_model_loss_graph_set_packed(&r->lg, r->pos_buf, r->mask_buf);
}

/* Token-weighted mean loss over the validation examples. */
static lt_status evaluate(struct run *r, float *out)
{
    double sum = 0, n = 0;
    for (int k = 0, count; k < r->n_val; k += count) {
        count = plan_micro(r, r->order + k, r->n_val - k);
        float loss;
        double n_loss;
        lt_status st = set_inputs(r, r->order + k, count, &n_loss);
        if (st == LT_OK && n_loss > 0)
            st = lt_train_graph_eval(r->tg, &loss);
        if (st != LT_OK)
            return st;
        if (n_loss > 0) {
            sum += (double)loss * n_loss;
            n += n_loss;
        }
    }
    *out = n > 0 ? (float)(sum / n) : NAN;
    return LT_OK;
}

/* This rank's share of one optimizer step: the step's examples idx[0..n) cut into
 * micro-batches of n_seqs, micro-batch m run by rank m % world (every one without a
 * communicator). Adds this rank's part to sums: [0] loss x labelled tokens, [1] labelled
 * tokens, [2] micro-batches, [3] input tokens. ep and s (from 0) name the step in messages. */
static lt_status run_share(struct lt_train_job *j, struct run *r, const int *idx, int n,
                           double *t_mark, int ep, int s, double sums[4])
{
    const int rank = job_rank(j), world = job_world(j);
    for (int k = 0, m = 0, count; k < n; k += count, m++) {
        count = plan_micro(r, idx + k, n - k);
        if (m % world != rank)
            continue;
        if (should_stop(j, r, t_mark))
            return lt_fail(LT_ERR_CANCELLED, "the job was cancelled");
        float loss;
        double n_loss;
        lt_status st = set_inputs(r, idx + k, count, &n_loss);
        if (st != LT_OK)
            return st;
        for (int i = 0; i < count; i++)
            sums[3] += r->data.ex[idx[k + i]].n;
        if ((st = lt_train_graph_accumulate(r->tg, &loss)) != LT_OK)
            return st;
        if (!isfinite(loss))
            return lt_fail(LT_ERR_INVALID,
                           "the loss became %g at epoch %d, step %d (try a lower lr)",
                           (double)loss, ep + 1, s + 1);
        sums[0] += (double)loss * n_loss;
        sums[1] += n_loss;
        sums[2] += 1;
    }
    return LT_OK;
}

/* Sums the accumulated gradients and the step's counts over the ranks, then steps over every
 * micro-batch of the step: each rank applies the update one rank would with the whole step. */
static lt_status reduce_and_step(struct lt_train_job *j, struct run *r, double sums[4])
{
    struct lt_comm *c = j->p.comm;
    if (!c)
        return lt_train_graph_step(r->tg, j->p.lr);
    lt_status st = lt_comm_allreduce_tensor(c, lt_train_graph_accumulators(r->tg));
    if (st == LT_OK)
        st = lt_comm_allreduce_f64(c, sums, 4);
    if (st == LT_OK)
        st = lt_train_graph_step_over(r->tg, j->p.lr, (int)sums[2]);
    return st;
}

static lt_status train_loop(struct lt_train_job *j, struct run *r)
{
    const struct lt_train_params *p = &j->p;
    struct lt_train_result *res = &j->result;
    int n_train = r->data.n - r->n_val;
    int *train_idx = r->order + r->n_val;
    int steps_per_epoch = (n_train + r->per_step - 1) / r->per_step;
    int n_steps = steps_per_epoch * p->epochs;
    res->curve = malloc((size_t)n_steps * sizeof(float));
    if (!res->curve)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the loss curve");
    struct lt_rng rng;
    lt_rng_seed(&rng, p->seed ^ 0x5eed5eed5eedull);
    struct lt_train_progress pr = {.n_epochs = p->epochs,
                                   .n_steps = n_steps,
                                   .n_examples = r->data.n,
                                   .n_fitted = r->data.n_fitted,
                                   .n_skipped = r->data.n_skipped};
    double t_mark = now_s();
    lt_status st = LT_OK;
    for (int ep = 0; ep < p->epochs; ep++) {
        lt_dataset_shuffle(train_idx, n_train, &rng);
        double ep_sum = 0, ep_n = 0;
        for (int s = 0; s < steps_per_epoch; s++) {
            double sums[4] = {0};
            double active0 = r->active_s + (now_s() - t_mark);
            int begin = s * r->per_step;
            int end = begin + r->per_step < n_train ? begin + r->per_step : n_train;
            st = agree(j, run_share(j, r, train_idx + begin, end - begin, &t_mark, ep, s, sums));
            if (st == LT_OK)
                st = agree(j, reduce_and_step(j, r, sums));
            if (st != LT_OK)
                return st;
            pr.tokens += (int64_t)sums[3];
            float step_loss = sums[1] > 0 ? (float)(sums[0] / sums[1]) : 0.0f;
            res->curve[res->n_curve++] = step_loss;
            ep_sum += sums[0];
            ep_n += sums[1];
            double t = now_s();
            double active = r->active_s + (t - t_mark);
            pr.epoch = ep + 1;
            pr.step = res->n_curve;
            pr.loss = step_loss;
            pr.tokens_per_s = active > 0 ? (double)pr.tokens / active : 0;
            pr.step_s = active - active0;
            pr.eta_s = pr.step > 0 ? active / pr.step * (n_steps - pr.step) : 0;
            report(j, &pr);
        }
        res->train_loss[ep] = ep_n > 0 ? (float)(ep_sum / ep_n) : NAN;
        res->eval_loss[ep] = NAN;
        if (r->n_val > 0 && (st = agree(j, evaluate(r, &res->eval_loss[ep]))) != LT_OK)
            return st;
        res->n_epochs = ep + 1;
    }
    r->active_s += now_s() - t_mark;
    res->tokens = pr.tokens;
    res->seconds = r->active_s;
    res->tokens_per_s = r->active_s > 0 ? (double)pr.tokens / r->active_s : 0;
    return LT_OK;
}

static lt_status write_output(struct lt_train_job *j, struct run *r)
{
    if (j->p.full) {
        int n;
        const struct lt_model_replace *list = lt_model_f32_params_list(r->f32, &n);
        return lt_train_write_model(j->model, list, n, j->p.out);
    }
    return lt_lora_save(r->lora, j->p.out);
}

/* A bad output fails at once, in a dry run too, instead of after the training; only rank 0
 * writes it, so only rank 0 checks it. */
static lt_status check_output(struct lt_train_job *j)
{
    if (job_rank(j) != 0)
        return LT_OK;
    lt_status st = lt_gguf_check_writable(j->p.out);
    if (st != LT_OK) {
        char why[512];
        snprintf(why, sizeof(why), "%s", lt_last_error());
        st = lt_fail(st, "cannot write the output '%s': %s (nothing was trained)", j->p.out, why);
    }
    return st;
}

/* After admission: the memory, the loop and the output (rank 0's), agreed over the ranks. */
static lt_status run_training(struct lt_train_job *j, struct run *r)
{
    lt_status st = commit_trainables(r);
    if (st == LT_OK)
        st = lt_train_graph_alloc(r->tg);
    if (st == LT_OK) {
        j->result.allocated_bytes = lt_train_graph_allocated(r->tg);
        st = lt_model_loss_graph_set_pos(&r->lg);
    }
    if (st == LT_OK && should_stop(j, r, &(double){now_s()}))
        st = lt_fail(LT_ERR_CANCELLED, "the job was cancelled");
    if ((st = agree(j, st)) != LT_OK)
        return st;
    set_state(j, LT_TRAIN_RUNNING);
    if ((st = train_loop(j, r)) != LT_OK)
        return st; /* agreed in the loop */
    return agree(j, job_rank(j) == 0 ? write_output(j, r) : LT_OK);
}

/* The whole job; fills j->result. */
static void job_main(struct lt_train_job *j)
{
    struct run r = {0};
    struct lt_model_adapters ad;
    struct lt_train_result *res = &j->result;
    set_state(j, LT_TRAIN_STARTING);
    lt_status st = check_output(j);
    if (st == LT_OK)
        st = load_data(j, &r);
    if (st == LT_OK)
        st = make_trainables(j, &r, &ad);
    if (st == LT_OK) { /* after a failure, nothing here may touch the error's sentence */
        /* on a device, products by F32 weights (full fine-tuning, an F32 base) run in BF16 */
        ad.bf16_products = !j->p.f32_products && !j->backends[0]->is_host;
        ad.fused_loss = !j->backends[0]->is_host;
        ad.flash_attn = lt_model_flash_attn_on(j->model, j->backends[0], ad.bf16_products);
        st = choose_and_admit(j, &r, &ad);
    }
    st = agree(j, st); /* every rank admitted, or none allocates */
    if (st == LT_OK && j->p.comm)
        st = agree(j, same_geometry(j, &r));
    if (st == LT_OK && !j->p.dry_run)
        st = run_training(j, &r);
    res->status = st;
    if (st != LT_OK)
        snprintf(res->error, sizeof(res->error), "%s",
                 st == LT_ERR_REFUSED && res->refusal.kind != LT_REFUSAL_NONE
                     ? res->refusal.sentence
                     : lt_last_error());
    run_free(&r);
    res->state = st == LT_OK              ? LT_TRAIN_DONE
                 : st == LT_ERR_CANCELLED ? LT_TRAIN_CANCELLED
                                          : LT_TRAIN_ERROR;
    set_state(j, res->state);
}

/* ---- the API ---- */

static char *dup_str(const char *s, bool *ok)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *ok = false;
    return d;
}

static lt_status job_new(struct lt_model *model, struct lt_backend *const *backends, int n_backends,
                         const struct lt_train_params *params, lt_train_progress_fn progress,
                         void *user, struct lt_train_job **out)
{
    *out = NULL;
    if (!model)
        return lt_fail(LT_ERR_INVALID, "a training job needs a model");
    if (n_backends < 1 || n_backends > LT_SCHED_MAX_BACKENDS || !backends)
        return lt_fail(LT_ERR_INVALID, "a training job needs 1 to %d backends",
                       LT_SCHED_MAX_BACKENDS);
    lt_status st = lt_train_params_validate(params, NULL);
    if (st != LT_OK)
        return st;
    struct lt_train_job *j = calloc(1, sizeof(*j));
    if (!j)
        return lt_fail(LT_ERR_NOMEM, "out of memory for a training job");
    j->model = model;
    for (int i = 0; i < n_backends; i++)
        j->backends[i] = backends[i];
    j->n_backends = n_backends;
    j->p = *params;
    lt_train_params_defaults(&j->p);
    bool ok = true;
    j->p.out = j->strs[0] = dup_str(params->out, &ok);
    j->p.text_path = j->strs[1] = dup_str(params->text_path, &ok);
    j->p.text = j->strs[2] = dup_str(params->text, &ok);
    j->p.examples_path = j->strs[3] = dup_str(params->examples_path, &ok);
    j->p.examples = j->strs[4] = dup_str(params->examples, &ok);
    j->p.targets = j->strs[5] = dup_str(params->targets, &ok);
    j->p.val_examples_path = j->strs[6] = dup_str(params->val_examples_path, &ok);
    j->progress_fn = progress;
    j->user = user;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->result.refusal.kind = LT_REFUSAL_NONE;
    j->prog.n_epochs = j->p.epochs;
    if (!ok) {
        lt_train_job_free(j);
        return lt_fail(LT_ERR_NOMEM, "out of memory for a training job");
    }
    *out = j;
    return LT_OK;
}

static void *job_thread(void *arg)
{
    job_main(arg);
    return NULL;
}

lt_status lt_train_job_start(struct lt_model *model, struct lt_backend *const *backends,
                             int n_backends, const struct lt_train_params *params,
                             lt_train_progress_fn progress, void *user, struct lt_train_job **out)
{
    struct lt_train_job *j;
    lt_status st = job_new(model, backends, n_backends, params, progress, user, &j);
    if (st != LT_OK)
        return st;
    j->state = j->prog.state = LT_TRAIN_STARTING;
    if (pthread_create(&j->thread, NULL, job_thread, j) != 0) {
        lt_train_job_free(j);
        return lt_fail(LT_ERR_NOMEM, "cannot start a thread for the training job");
    }
    j->has_thread = true;
    *out = j;
    return LT_OK;
}

lt_status lt_train_job_run(struct lt_model *model, struct lt_backend *const *backends,
                           int n_backends, const struct lt_train_params *params,
                           lt_train_progress_fn progress, void *user,
                           struct lt_train_result *result)
{
    memset(result, 0, sizeof(*result));
    struct lt_train_job *j;
    lt_status st = job_new(model, backends, n_backends, params, progress, user, &j);
    if (st != LT_OK) {
        result->state = LT_TRAIN_ERROR;
        result->status = st;
        snprintf(result->error, sizeof(result->error), "%s", lt_last_error());
        return st;
    }
    job_main(j);
    *result = j->result;
    j->result.curve = NULL; /* handed to the caller */
    lt_train_job_free(j);
    if (result->status != LT_OK)
        lt_fail(result->status, "%s", result->error);
    return result->status;
}

enum lt_train_state lt_train_job_state(struct lt_train_job *j)
{
    pthread_mutex_lock(&j->mu);
    enum lt_train_state s = j->state;
    pthread_mutex_unlock(&j->mu);
    return s;
}

void lt_train_job_progress(struct lt_train_job *j, struct lt_train_progress *out)
{
    pthread_mutex_lock(&j->mu);
    *out = j->prog;
    out->state = j->state;
    pthread_mutex_unlock(&j->mu);
}

void lt_train_job_cancel(struct lt_train_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->cancel = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void lt_train_job_pause(struct lt_train_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->pause = true;
    pthread_mutex_unlock(&j->mu);
}

void lt_train_job_resume(struct lt_train_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->pause = false;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static bool finished(enum lt_train_state s)
{
    return s == LT_TRAIN_DONE || s == LT_TRAIN_CANCELLED || s == LT_TRAIN_ERROR;
}

void lt_train_job_wait(struct lt_train_job *j, struct lt_train_result *out)
{
    pthread_mutex_lock(&j->mu);
    while (!finished(j->state))
        pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
    if (j->has_thread) {
        pthread_join(j->thread, NULL);
        j->has_thread = false;
    }
    if (!out)
        return;
    *out = j->result;
    out->curve = NULL;
    if (j->result.n_curve > 0) {
        out->curve = malloc((size_t)j->result.n_curve * sizeof(float));
        if (out->curve)
            memcpy(out->curve, j->result.curve, (size_t)j->result.n_curve * sizeof(float));
        else
            out->n_curve = 0;
    }
}

void lt_train_result_free(struct lt_train_result *r)
{
    if (!r)
        return;
    free(r->curve);
    r->curve = NULL;
    r->n_curve = 0;
}

void lt_train_job_free(struct lt_train_job *j)
{
    if (!j)
        return;
    if (j->has_thread) {
        lt_train_job_cancel(j);
        lt_train_job_wait(j, NULL);
    }
    free(j->result.curve);
    for (size_t i = 0; i < sizeof(j->strs) / sizeof(j->strs[0]); i++)
        free(j->strs[i]);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}
