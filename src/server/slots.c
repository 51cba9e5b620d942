/* slots.c: the decode loop. `parallel` slots; each holds one generation on one sequence of
 * the session for its adapter set. Every iteration of the loop:
 *   1. admits queued generations into free slots (FIFO, skipping one whose adapter set has
 *      no session free yet, so it does not hold back the others);
 *   2. drops slots whose client went away;
 *   3. prefills at most ENG_PREFILL_CHUNK prompt tokens per prefilling slot, so a long
 *      prompt delays the others' next token by one chunk, not by the whole prompt; the
 *      prompts of one session prefill side by side, in as few steps as their lengths allow
 *      (lt_session_prefill_batch), so sixteen requests arriving together cost one step;
 *   4. decodes one token for every decoding slot, all slots of a session in one batch.
 * Each slot's lt_gen_seq (src/generate, shared with `lathe run`) samples, detokenizes and
 * handles stop strings and limits (a batch's slots sample on threads side by side, a
 * whole-vocabulary draw costing about a millisecond each, then accept in slot order); its `pending`
 * token, sampled but not yet fed to the model, is what step 4 feeds. A slot that ends leaves its
 * sequence as it is, with a copy of its tokens: the next prompt that extends them (a chat's next
 * turn) takes that sequence and prefills only the rest (the prompt cache; `cache_prompt: false`
 * opts out). Nothing here aborts: a failed prefill or decode fails the generations involved (HTTP
 * 500) and frees their slots; the loop goes on. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "server/engine_impl.h"

/* ---- slot life ---- */

/* Every generation eng_submit accepted (lathe_requests_total) ends here exactly once, by
 * whatever path: from a slot, or still queued (cancelled, refused at admission, shutdown). */
static void count_finished(struct engine *e, enum srv_finish why)
{
    pthread_mutex_lock(&e->stats_mu);
    e->stats.finished[why]++;
    pthread_mutex_unlock(&e->stats_mu);
}

/* A generation that never got a slot ends: finished with why (failed with status and msg
 * when status is not 0), counted, and its queue reference dropped. */
static void queued_end(struct engine *e, struct srv_gen *g, enum srv_finish why, int status,
                       const char *msg)
{
    count_finished(e, why); /* before its client can see the end (and read /metrics) */
    if (status)
        srv_gen_fail(g, status, msg);
    else
        srv_gen_finish(g, why);
    srv_gen_unref(g);
}

/* A request that overlapped a training window leaves serving's decode rate over its life
 * (tokens decoded per wall-clock ms: what its client sees, prefills and waits included) for
 * the trainer, which compares it with the clean rate. */
static void act_note_end(struct eng_activity *a, const struct eng_slot *sl)
{
    bool overlap =
        sl->act_overlap || atomic_load(&a->window) || atomic_load(&a->windows) != sl->act_windows0;
    long long dt = atomic_load(&a->decode_tokens) - sl->act_tokens0;
    double ms = (srv_now_mono() - sl->act_t0) * 1e3;
    if (!overlap || dt <= 0 || ms <= 0)
        return;
    pthread_mutex_lock(&a->ring_mu);
    if (a->n_ring < ENG_ACT_RING)
        a->ring[a->n_ring++] = (double)dt / ms;
    pthread_mutex_unlock(&a->ring_mu);
}

/* ---- the prompt cache ---- */

/* Empties sequence seq of es, and what it kept. */
static lt_status seq_clear(struct eng_session *es, int seq)
{
    es->cache[seq].n = 0;
    lt_status st = lt_session_seq_clear(es->s, seq);
    if (st != LT_OK)
        fprintf(stderr, "lathe serve: clearing sequence %d: %s\n", seq, lt_last_error());
    return st;
}

/* A slot ends: its sequence keeps what it holds (the prompt and all but the last generated
 * token, history[0..pos)) for a next prompt that extends it, unless the generation failed
 * or the request asked for no cache; else it is cleared. */
static void seq_keep(struct eng_slot *sl, enum srv_finish why)
{
    struct eng_seq_cache *c = &sl->es->cache[sl->seq];
    int pos = lt_session_seq_pos(sl->es->s, sl->seq);
    bool keep = why != SRV_FINISH_ERROR && sl->have_gs && !sl->g->p.no_prompt_cache &&
                pos > 0 && (size_t)pos <= sl->gs.n_history;
    if (keep && (size_t)pos > c->cap) {
        lt_token *t = realloc(c->tokens, (size_t)pos * sizeof(*t));
        keep = t != NULL;
        if (t) {
            c->tokens = t;
            c->cap = (size_t)pos;
        }
    }
    if (!keep) {
        seq_clear(sl->es, sl->seq);
        return;
    }
    memcpy(c->tokens, sl->gs.history, (size_t)pos * sizeof(*c->tokens));
    c->n = (size_t)pos;
}

/* The free sequence of es for the prompt of p: the one whose kept tokens are the longest
 * proper prefix of it (*reused of them), else an empty one, else the first free one,
 * cleared. A proper prefix, so that at least one prompt token is left to prefill for the
 * first logits; and only extensions, since a recurrent layer's state cannot be rewound.
 * -1 when clearing failed (the session's error is set). */
static int seq_choose(struct eng_session *es, int n_seq, const struct srv_gen_params *p,
                      size_t *reused)
{
    int best = -1, empty = -1, first = -1;
    size_t best_n = 0;
    for (int i = 0; i < n_seq; i++) {
        if (es->seq_busy[i])
            continue;
        const struct eng_seq_cache *c = &es->cache[i];
        first = first < 0 ? i : first;
        empty = empty < 0 && c->n == 0 ? i : empty;
        bool prefix = !p->no_prompt_cache && c->n > best_n && c->n < p->n_prompt &&
                      (int)c->n == lt_session_seq_pos(es->s, i) &&
                      !memcmp(c->tokens, p->prompt, c->n * sizeof(*c->tokens));
        if (prefix) {
            best = i;
            best_n = c->n;
        }
    }
    *reused = best_n;
    if (best >= 0)
        return best;
    int seq = empty >= 0 ? empty : first;
    if (seq >= 0 && es->cache[seq].n > 0 && seq_clear(es, seq) != LT_OK)
        return -1;
    return seq;
}

/* A slot's generation ends (failed with status and msg when status is not 0): counted
 * first, so that a client who has its answer finds it in /metrics, then finished, and the
 * slot freed. */
static void slot_end(struct engine *e, struct eng_slot *sl, enum srv_finish why, int status,
                     const char *msg)
{
    if (sl->state == ENG_SLOT_FREE)
        return;
    count_finished(e, why);
    if (status)
        srv_gen_fail(sl->g, status, msg);
    else
        srv_gen_finish(sl->g, why);
    seq_keep(sl, why);
    sl->es->seq_busy[sl->seq] = false;
    sl->es->n_active--;
    sl->es->last_used = srv_now_mono();
    eng_config_use(e, &sl->es->cfg, -1);
    srv_gen_unref(sl->g);
    if (sl->have_gs)
        lt_gen_seq_free(&sl->gs);
    act_note_end(&e->act, sl);
    memset(sl, 0, sizeof(*sl));
    atomic_store(&e->act.last_busy_us, (long long)(srv_now_mono() * 1e6));
    atomic_fetch_sub(&e->act.busy, 1);
}

static void slot_release(struct engine *e, struct eng_slot *sl, enum srv_finish why)
{
    slot_end(e, sl, why, 0, NULL);
}

static void slot_fail(struct engine *e, struct eng_slot *sl, int status, const char *what)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "%s: %s", what, lt_last_error());
    slot_end(e, sl, SRV_FINISH_ERROR, status, msg);
}

/* Puts g in slot sl on sequence seq of es. 200, or an error status (g answered by the
 * caller, nothing held). */
static int slot_start(struct engine *e, struct eng_slot *sl, struct srv_gen *g,
                      struct eng_session *es, int seq, size_t reused)
{
    const struct srv_gen_params *p = &g->p;
    memset(sl, 0, sizeof(*sl));
    struct lt_gen_params gp = lt_gen_default_params();
    gp.sampler = p->sampling;
    gp.max_tokens = p->max_tokens;
    gp.ignore_eog = p->ignore_eos;
    gp.stops = (const char *const *)p->stops;
    gp.n_stops = p->n_stops;
    gp.logprobs = p->logprobs;
    gp.top_logprobs = p->top_logprobs;
    gp.grammar = p->grammar;
    lt_status ls = lt_gen_seq_init(&sl->gs, e->tok, &gp);
    if (ls != LT_OK)
        return srv_fail(srv_http_status_of(ls), NULL, NULL, "%s", lt_last_error());
    /* the prompt and all but the last generated token live in the session */
    size_t room = (size_t)e->info.n_ctx - p->n_prompt + 1;
    if ((ls = lt_gen_seq_set_prompt(&sl->gs, p->prompt, p->n_prompt, room)) != LT_OK) {
        lt_gen_seq_free(&sl->gs);
        return srv_fail(srv_http_status_of(ls), "prompt", NULL, "%s", lt_last_error());
    }
    sl->have_gs = true;
    sl->g = g;
    sl->es = es;
    sl->seq = seq;
    sl->n_prefilled = reused; /* the sequence already holds these prompt tokens */
    pthread_mutex_lock(&g->mu);
    g->n_cached = reused;
    pthread_mutex_unlock(&g->mu);
    sl->state = ENG_SLOT_PREFILL;
    es->seq_busy[seq] = true;
    es->n_active++;
    es->last_used = srv_now_mono();
    sl->act_tokens0 = atomic_load(&e->act.decode_tokens);
    sl->act_us0 = atomic_load(&e->act.decode_us);
    sl->act_t0 = srv_now_mono();
    sl->act_windows0 = atomic_load(&e->act.windows);
    sl->act_overlap = atomic_load(&e->act.window) != 0;
    atomic_fetch_add(&e->act.busy, 1);
    srv_gen_mark_started(g);
    return 200;
}

static enum srv_finish finish_of(enum lt_gen_finish f)
{
    return f == LT_GEN_FINISH_LENGTH || f == LT_GEN_FINISH_CONTEXT ? SRV_FINISH_LENGTH
                                                                   : SRV_FINISH_STOP;
}

/* After a step of the slot's lt_gen_seq: hand its piece on, and end it when it is done. */
static void slot_after_step(struct engine *e, struct eng_slot *sl)
{
    double now = srv_now_mono();
    pthread_mutex_lock(&e->stats_mu);
    struct eng_stats *s = &e->stats;
    if (sl->t_last > 0) {
        s->latency[s->latency_pos] = (float)(now - sl->t_last);
        s->latency_pos = (s->latency_pos + 1) % ENG_LATENCY_RING;
        s->n_latency += s->n_latency < ENG_LATENCY_RING;
    }
    s->generated_tokens++;
    s->logprob_tokens += sl->g->p.logprobs;
    pthread_mutex_unlock(&e->stats_mu);
    sl->t_last = now;
    size_t len;
    const char *piece = lt_gen_seq_piece(&sl->gs, &len);
    /* the log-probabilities of the token just accepted (sampled with them: gs.lp is its),
     * none for an end-of-generation token, which is no part of the text */
    struct srv_token_lp lp;
    bool with_lp = sl->g->p.logprobs && sl->gs.lp.id == sl->gs.last &&
                   sl->gs.finish != LT_GEN_FINISH_EOG;
    if (with_lp) {
        lp.lp = sl->gs.lp;
        lp.text_start = sl->gs.last_text_start;
    }
    srv_gen_push_lp(sl->g, piece, len, (int)lt_gen_seq_stats(&sl->gs).n_generated,
                    with_lp ? &lp : NULL);
    if (lt_gen_seq_done(&sl->gs)) {
        sl->g->gen_finish = (int)sl->gs.finish; /* for /completion's stop_type */
        sl->g->stop_which = (int)sl->gs.stop_which;
        slot_release(e, sl, finish_of(sl->gs.finish));
    } else
        sl->state = ENG_SLOT_DECODE;
}

static void slot_step(struct engine *e, struct eng_slot *sl, const float *logits)
{
    if (lt_gen_seq_step(&sl->gs, logits, (size_t)e->info.n_vocab) != LT_OK)
        slot_fail(e, sl, 500, "sampling");
    else
        slot_after_step(e, sl);
}

/* ---- the loop's steps ---- */

static int free_slot(struct engine *e)
{
    for (int i = 0; i < e->p.parallel; i++)
        if (e->slots[i].state == ENG_SLOT_FREE)
            return i;
    return -1;
}

/* Takes the queue out of q_mu (sessions may be created meanwhile, which takes time, and the
 * adapter registry's lock must not nest inside q_mu), then puts back what must still wait,
 * ahead of what arrived in between. */
static void admit(struct engine *e)
{
    pthread_mutex_lock(&e->q_mu);
    int n = e->q_len;
    memcpy(e->admitting, e->queue, (size_t)n * sizeof(*e->queue));
    e->q_len = 0;
    e->q_admitting = n;
    pthread_mutex_unlock(&e->q_mu);

    int kept = 0;
    for (int i = 0; i < n; i++) {
        struct srv_gen *g = e->admitting[i];
        int si = free_slot(e);
        if (srv_gen_cancelled(g)) {
            queued_end(e, g, SRV_FINISH_CANCELLED, 0, NULL);
            continue;
        }
        if (si < 0) {
            e->admitting[kept++] = g;
            continue;
        }
        struct eng_config cfg;
        int st = eng_config_resolve(e, &g->p, &cfg);
        struct eng_session *es = st == 200 ? eng_session_get(e, &cfg, &st) : NULL;
        if (!es && st == 200) { /* every session busy: wait, let others pass */
            e->admitting[kept++] = g;
            continue;
        }
        if (!es) {
            queued_end(e, g, SRV_FINISH_ERROR, st, lt_last_error());
            continue;
        }
        size_t reused = 0;
        int seq = seq_choose(es, e->p.parallel, &g->p, &reused);
        if (seq < 0)
            st = srv_fail(500, NULL, NULL, "clearing a sequence: %s", lt_last_error());
        else
            st = slot_start(e, &e->slots[si], g, es, seq, reused);
        if (st != 200) {
            queued_end(e, g, SRV_FINISH_ERROR, st, lt_last_error());
        } else {
            eng_config_use(e, &es->cfg, +1);
            pthread_mutex_lock(&e->stats_mu);
            e->stats.prompt_tokens_reused += reused;
            pthread_mutex_unlock(&e->stats_mu);
        }
    }

    pthread_mutex_lock(&e->q_mu);
    memmove(e->queue + kept, e->queue, (size_t)e->q_len * sizeof(*e->queue));
    memcpy(e->queue, e->admitting, (size_t)kept * sizeof(*e->queue));
    e->q_len += kept;
    e->q_admitting = 0;
    pthread_mutex_unlock(&e->q_mu);
}

static void drop_cancelled(struct engine *e)
{
    for (int i = 0; i < e->p.parallel; i++) {
        struct eng_slot *sl = &e->slots[i];
        if (sl->state != ENG_SLOT_FREE && srv_gen_cancelled(sl->g))
            slot_release(e, sl, SRV_FINISH_CANCELLED);
    }
}

/* ---- sampling a batch on threads ---- */

#define SAMPLE_THREADS 8

/* one batch's sampling, shared by the pool's threads */
struct sample_batch {
    struct engine *e;
    int n;
    lt_token *ids;
    lt_status *st;
    char (*err)[256];
};

/* thread ith of nth samples slots ith, ith + nth, ... of the batch, each from its logits */
static void sample_share_run(void *arg, int ith, int nth)
{
    struct sample_batch *b = arg;
    struct engine *e = b->e;
    const size_t V = (size_t)e->info.n_vocab;
    for (int k = ith; k < b->n; k += nth) {
        struct eng_slot *sl = &e->slots[e->batch_slots[k]];
        b->st[k] = lt_gen_seq_sample(&sl->gs, e->logits + (size_t)k * V, V, &b->ids[k]);
        if (b->st[k] != LT_OK)
            snprintf(b->err[k], sizeof(b->err[k]), "%s", lt_last_error());
    }
}

/* Samples the batch's n slots into ids on the loop's pool (started with the loop, so a step
 * starts no thread: that cost ~40 us a thread, more than a greedy pick over 248k logits;
 * NULL when it could not start: this thread alone), then accepts them in order. */
static void step_batch(struct engine *e, struct lt_threadpool *pool, int n)
{
    lt_token *ids = malloc(sizeof(*ids) * (size_t)n);
    lt_status *st = malloc(sizeof(*st) * (size_t)n);
    char(*err)[256] = malloc(sizeof(*err) * (size_t)n);
    if (!ids || !st || !err) {
        free(ids);
        free(st);
        free(err);
        for (int k = 0; k < n; k++)
            slot_step(e, &e->slots[e->batch_slots[k]],
                      e->logits + (size_t)k * (size_t)e->info.n_vocab);
        return;
    }
    struct sample_batch b = {e, n, ids, st, err};
    if (pool)
        lt_threadpool_run(pool, sample_share_run, &b);
    else
        sample_share_run(&b, 0, 1);
    for (int k = 0; k < n; k++) {
        struct eng_slot *sl = &e->slots[e->batch_slots[k]];
        if (st[k] != LT_OK) {
            lt_fail(st[k], "%s", err[k]);
            slot_fail(e, sl, 500, "sampling");
        } else if (lt_gen_seq_accept(&sl->gs, ids[k]) != LT_OK) {
            slot_fail(e, sl, 500, "sampling");
        } else {
            slot_after_step(e, sl);
        }
    }
    free(ids);
    free(st);
    free(err);
}

/* ---- prefill ---- */

/* Prompt tokens slot sl prefills this iteration: the rest of its prompt, at most a chunk. */
static int chunk_of(const struct eng_slot *sl)
{
    size_t n = sl->g->p.n_prompt - sl->n_prefilled;
    return n < ENG_PREFILL_CHUNK ? (int)n : ENG_PREFILL_CHUNK;
}

static bool chunk_ends_prompt(const struct eng_slot *sl)
{
    return sl->n_prefilled + (size_t)chunk_of(sl) == sl->g->p.n_prompt;
}

/* Prefills the n slots e->batch_slots[0..n) of session es in one step (their prompts side by
 * side), those that end their prompt first; these then sample their first token. */
static void prefill_group(struct engine *e, struct lt_threadpool *pool, struct eng_session *es,
                          int n)
{
    int n_end = 0;
    for (int k = 0; k < n; k++) { /* the slots whose prompt ends, first */
        struct eng_slot *sl = &e->slots[e->batch_slots[k]];
        if (chunk_ends_prompt(sl)) {
            int t = e->batch_slots[n_end];
            e->batch_slots[n_end++] = e->batch_slots[k];
            e->batch_slots[k] = t;
        }
    }
    for (int k = 0; k < n; k++) {
        struct eng_slot *sl = &e->slots[e->batch_slots[k]];
        e->batch_seqs[k] = sl->seq;
        e->batch_lens[k] = chunk_of(sl);
        e->batch_prompts[k] = sl->g->p.prompt + sl->n_prefilled;
    }
    double t0 = srv_now_mono();
    lt_status st = lt_session_prefill_batch(es->s, n, e->batch_seqs, e->batch_prompts,
                                            e->batch_lens, n_end ? e->logits : NULL);
    pthread_mutex_lock(&e->stats_mu);
    e->stats.prefill_s += srv_now_mono() - t0;
    e->stats.prefill_steps++;
    pthread_mutex_unlock(&e->stats_mu);
    for (int k = 0; k < n; k++) {
        struct eng_slot *sl = &e->slots[e->batch_slots[k]];
        if (st != LT_OK)
            slot_fail(e, sl, st == LT_ERR_NOMEM ? 503 : 500, "prefill");
        else
            sl->n_prefilled += (size_t)e->batch_lens[k];
    }
    if (st != LT_OK || n_end == 0)
        return;
    if (n_end > 1)
        step_batch(e, pool, n_end);
    else
        slot_step(e, &e->slots[e->batch_slots[0]], e->logits);
}

/* Every prefilling slot advances by a chunk of its prompt. The slots of one session go in
 * groups, each one step: taken longest chunk first, a group holds chunks at least half its
 * longest (the shorter ones are padded, so padding stays under half the step), and no more
 * of them than keep its attention scores (sequences x chunk x positions attended) within
 * those of one chunk at full context, and its tokens (sequences x chunk) within
 * ENG_PREFILL_BATCH_TOKENS, so a step's activations stay a few chunks' (64 slots of short
 * prompts still go in one step). */
static void prefill(struct engine *e, struct lt_threadpool *pool)
{
    for (int si = 0; si < e->n_sessions; si++) {
        struct eng_session *es = e->sessions[si];
        int n = 0;
        for (int i = 0; i < e->p.parallel; i++) {
            struct eng_slot *sl = &e->slots[i];
            if (sl->state != ENG_SLOT_PREFILL || sl->es != es)
                continue;
            /* insertion by chunk, longest first (slot order among equals) */
            int *order = e->prefill_order, k = n++, len = chunk_of(sl);
            for (; k > 0 && chunk_of(&e->slots[order[k - 1]]) < len; k--)
                order[k] = order[k - 1];
            order[k] = i;
        }
        const int *cand = e->prefill_order;
        const double budget = (double)ENG_PREFILL_CHUNK * e->info.n_ctx;
        for (int a = 0; a < n;) {
            int T = chunk_of(&e->slots[cand[a]]), n_kv = 0, b = a;
            for (; b < n; b++) {
                const struct eng_slot *sl = &e->slots[cand[b]];
                int end = (int)sl->n_prefilled + chunk_of(sl);
                int kv = end > n_kv ? end : n_kv;
                if (b > a && (2 * chunk_of(sl) < T || (double)(b - a + 1) * T * kv > budget ||
                              (b - a + 1) * T > ENG_PREFILL_BATCH_TOKENS))
                    break;
                n_kv = kv;
            }
            memcpy(e->batch_slots, cand + a, sizeof(int) * (size_t)(b - a));
            prefill_group(e, pool, es, b - a);
            a = b;
        }
    }
}

/* The slots of a step whose tokens were picked where the logits are (plain greedy):
 * accepted in order. A NaN among a row's logits (-1) fails its slot as the sampler would. */
static void accept_picks(struct engine *e, int from, int n)
{
    for (int k = from; k < n; k++) {
        struct eng_slot *sl = &e->slots[e->batch_slots[k]];
        if (lt_gen_seq_accept_pick(&sl->gs, e->batch_ids[k]) != LT_OK)
            slot_fail(e, sl, 500, "sampling");
        else
            slot_after_step(e, sl);
    }
}

/* One decode step of every decoding slot of es. The slots whose sampler reads the logits
 * come first, and only their rows are copied out; the plain greedy ones take the pick the
 * step made where the logits are (a device's ARGMAX), with no copy of their rows. */
static void decode_session(struct engine *e, struct lt_threadpool *pool,
                           struct eng_session *es)
{
    int n = 0, n_read = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < e->p.parallel; i++) {
            struct eng_slot *sl = &e->slots[i];
            if (sl->state != ENG_SLOT_DECODE || sl->es != es ||
                lt_gen_seq_plain_greedy(&sl->gs) != (pass == 1))
                continue;
            e->batch_slots[n] = i;
            e->batch_seqs[n] = sl->seq;
            e->batch_tokens[n] = sl->gs.pending;
            e->batch_want[n] = pass == 0;
            n_read += pass == 0;
            n++;
        }
    if (n == 0)
        return;
    double t0 = srv_now_mono();
    lt_status st = lt_session_decode_pick(es->s, n, e->batch_seqs, e->batch_tokens, e->batch_want,
                                          e->logits, e->batch_ids);
    double dt = srv_now_mono() - t0;
    pthread_mutex_lock(&e->stats_mu);
    e->stats.decode_s += dt;
    e->stats.decode_steps++;
    e->stats.decode_tokens += (uint64_t)n;
    e->stats.picked_tokens += st == LT_OK ? (uint64_t)(n - n_read) : 0;
    e->stats.batch_max = n > e->stats.batch_max ? n : e->stats.batch_max;
    pthread_mutex_unlock(&e->stats_mu);
    atomic_fetch_add(&e->act.decode_tokens, (long long)n);
    atomic_fetch_add(&e->act.decode_us, (long long)(dt * 1e6));
    double t1 = srv_now_mono();
    if (st != LT_OK) {
        for (int k = 0; k < n; k++)
            slot_fail(e, &e->slots[e->batch_slots[k]], 500, "decode");
    } else {
        if (n_read > 1)
            step_batch(e, pool, n_read);
        else if (n_read == 1)
            slot_step(e, &e->slots[e->batch_slots[0]], e->logits);
        accept_picks(e, n_read, n);
    }
    dt = srv_now_mono() - t1;
    pthread_mutex_lock(&e->stats_mu);
    e->stats.sample_s += dt;
    pthread_mutex_unlock(&e->stats_mu);
}

static bool any_busy(struct engine *e)
{
    return atomic_load(&e->act.busy) > 0;
}

void eng_step_lock(struct engine *e)
{
    atomic_fetch_add(&e->step_waiting, 1);
    pthread_mutex_lock(&e->step_mu);
    atomic_fetch_sub(&e->step_waiting, 1);
}

void eng_step_unlock(struct engine *e)
{
    pthread_mutex_unlock(&e->step_mu);
}

/* Between two steps: while another thread waits for step_mu, let it have it first. */
static void give_way(struct engine *e)
{
    while (atomic_load(&e->step_waiting) > 0) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

void *eng_loop_main(void *arg)
{
    struct engine *e = arg;
    /* the sampling threads live as long as the loop */
    struct lt_threadpool *pool = lt_threadpool_new(SAMPLE_THREADS);
    for (;;) {
        pthread_mutex_lock(&e->q_mu);
        while (!e->stopping && e->q_len == 0 && !any_busy(e))
            pthread_cond_wait(&e->q_cv, &e->q_mu);
        bool stop = e->stopping;
        pthread_mutex_unlock(&e->q_mu);
        if (stop)
            break;
        pthread_mutex_lock(&e->step_mu);
        eng_sessions_collect(e);
        admit(e);
        drop_cancelled(e);
        prefill(e, pool);
        for (int i = 0; i < e->n_sessions; i++)
            decode_session(e, pool, e->sessions[i]);
        bool waiting = false;
        if (!any_busy(e)) {
            pthread_mutex_lock(&e->q_mu);
            waiting = e->q_len > 0;
            pthread_mutex_unlock(&e->q_mu);
        }
        pthread_mutex_unlock(&e->step_mu);
        give_way(e);
        if (waiting) {
            /* queued work no session could take (all busy with other adapter sets and not
             * idle yet): it cannot be, since no slot is busy; yield briefly anyway */
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    lt_threadpool_free(pool);
    return NULL;
}

void eng_fail_all(struct engine *e, int status, const char *msg)
{
    eng_step_lock(e);
    for (int i = 0; e->slots && i < e->p.parallel; i++)
        if (e->slots[i].state != ENG_SLOT_FREE)
            slot_end(e, &e->slots[i], SRV_FINISH_ERROR, status, msg);
    for (;;) { /* one at a time: stats_mu may not nest inside q_mu */
        pthread_mutex_lock(&e->q_mu);
        struct srv_gen *g = e->q_len > 0 ? e->queue[--e->q_len] : NULL;
        pthread_mutex_unlock(&e->q_mu);
        if (!g)
            break;
        queued_end(e, g, SRV_FINISH_ERROR, status, msg);
    }
    eng_step_unlock(e);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void eng_metrics_decode(struct engine *e, struct lt_strbuf *out)
{
    struct eng_stats *s = malloc(sizeof(*s));
    if (!s)
        return;
    pthread_mutex_lock(&e->stats_mu);
    *s = e->stats;
    pthread_mutex_unlock(&e->stats_mu);
    int busy = atomic_load(&e->act.busy);
    pthread_mutex_lock(&e->q_mu);
    int queued = e->q_len;
    pthread_mutex_unlock(&e->q_mu);
    qsort(s->latency, (size_t)s->n_latency, sizeof(float), cmp_float);
    double p50 = s->n_latency ? s->latency[(s->n_latency - 1) / 2] : 0;
    double p95 = s->n_latency ? s->latency[(int)((s->n_latency - 1) * 0.95)] : 0;
    srv_strbuf_appendf(
        out,
        "# HELP lathe_requests_total Completion requests accepted.\n"
        "# TYPE lathe_requests_total counter\nlathe_requests_total %llu\n"
        "# HELP lathe_requests_finished_total Completions ended, by reason.\n"
        "# TYPE lathe_requests_finished_total counter\n"
        "lathe_requests_finished_total{reason=\"stop\"} %llu\n"
        "lathe_requests_finished_total{reason=\"length\"} %llu\n"
        "lathe_requests_finished_total{reason=\"cancelled\"} %llu\n"
        "lathe_requests_finished_total{reason=\"error\"} %llu\n"
        "# HELP lathe_prompt_tokens_total Prompt tokens accepted.\n"
        "# TYPE lathe_prompt_tokens_total counter\nlathe_prompt_tokens_total %llu\n"
        "# HELP lathe_prompt_tokens_reused_total Prompt tokens a slot's sequence already held "
        "from the request before (the prompt cache), not prefilled again.\n"
        "# TYPE lathe_prompt_tokens_reused_total counter\nlathe_prompt_tokens_reused_total %llu\n"
        "# HELP lathe_generated_tokens_total Tokens generated.\n"
        "# TYPE lathe_generated_tokens_total counter\nlathe_generated_tokens_total %llu\n"
        "# HELP lathe_logprob_tokens_total Generated tokens whose log-probabilities were "
        "computed (for requests that asked for them).\n"
        "# TYPE lathe_logprob_tokens_total counter\nlathe_logprob_tokens_total %llu\n"
        "# HELP lathe_slots Slots decoding at once.\n# TYPE lathe_slots gauge\nlathe_slots %d\n"
        "# HELP lathe_slots_busy Slots holding a generation now.\n"
        "# TYPE lathe_slots_busy gauge\nlathe_slots_busy %d\n"
        "# HELP lathe_requests_queued Generations waiting for a slot.\n"
        "# TYPE lathe_requests_queued gauge\nlathe_requests_queued %d\n"
        "# HELP lathe_decode_steps_total Batched decode steps.\n"
        "# TYPE lathe_decode_steps_total counter\nlathe_decode_steps_total %llu\n"
        "# HELP lathe_decode_tokens_total Tokens decoded in batched steps.\n"
        "# TYPE lathe_decode_tokens_total counter\nlathe_decode_tokens_total %llu\n"
        "# HELP lathe_decode_batch_max The largest batch decoded in one step.\n"
        "# TYPE lathe_decode_batch_max gauge\nlathe_decode_batch_max %d\n"
        "# HELP lathe_decode_seconds_total Time in batched decode steps.\n"
        "# TYPE lathe_decode_seconds_total counter\nlathe_decode_seconds_total %.6f\n"
        "# HELP lathe_sample_seconds_total Time after batched decode steps: sampling, "
        "detokenizing, stop strings and handing tokens to the streams.\n"
        "# TYPE lathe_sample_seconds_total counter\nlathe_sample_seconds_total %.6f\n"
        "# HELP lathe_prefill_seconds_total Time in prompt prefill.\n"
        "# TYPE lathe_prefill_seconds_total counter\nlathe_prefill_seconds_total %.6f\n"
        "# HELP lathe_prefill_steps_total Prefill steps (the prompts prefilling together share "
        "one).\n"
        "# TYPE lathe_prefill_steps_total counter\nlathe_prefill_steps_total %llu\n"
        "# HELP lathe_picked_tokens_total Decoded tokens picked where the logits are (greedy "
        "requests without penalties, grammar or logprobs: no logits copied out for them).\n"
        "# TYPE lathe_picked_tokens_total counter\nlathe_picked_tokens_total %llu\n"
        "# HELP lathe_token_latency_seconds Time between a slot's tokens (last %d).\n"
        "# TYPE lathe_token_latency_seconds summary\n"
        "lathe_token_latency_seconds{quantile=\"0.5\"} %.6f\n"
        "lathe_token_latency_seconds{quantile=\"0.95\"} %.6f\n"
        "lathe_token_latency_seconds_count %d\n",
        (unsigned long long)s->requests, (unsigned long long)s->finished[SRV_FINISH_STOP],
        (unsigned long long)s->finished[SRV_FINISH_LENGTH],
        (unsigned long long)s->finished[SRV_FINISH_CANCELLED],
        (unsigned long long)s->finished[SRV_FINISH_ERROR], (unsigned long long)s->prompt_tokens,
        (unsigned long long)s->prompt_tokens_reused, (unsigned long long)s->generated_tokens,
        (unsigned long long)s->logprob_tokens, e->p.parallel, busy, queued,
        (unsigned long long)s->decode_steps, (unsigned long long)s->decode_tokens, s->batch_max,
        s->decode_s, s->sample_s, s->prefill_s, (unsigned long long)s->prefill_steps,
        (unsigned long long)s->picked_tokens, ENG_LATENCY_RING, p50, p95, s->n_latency);
    free(s);
}
