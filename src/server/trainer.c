/* trainer.c: the training worker beside serving: one job at a time (lt_train_job_start runs
 * it on its own thread), its record kept for GET /train and /v1/fine_tuning/jobs/{id}.
 *
 * Windows and yields. The job reports progress after every optimizer step, on its own
 * thread; a step is a window, and the callback here yields to serving before the next one
 * starts. How long is the job's pacing (struct srv_train_pacing):
 *   - max_slowdown_ppm: a bound on serving's slowdown. Serving's decode rate (tokens decoded
 *     per wall-clock ms, from eng_activity's totals: a step that waited for the device or a
 *     prefill slowed by training costs it as a slower step does, as the clients see it) is
 *     measured during windows (r_w) and during
 *     yields (r0, the clean rate, re-measured at least every SRV_PACE_CLEAN_EVERY_S), and the
 *     yield is srv_pace_yield_bound of the window's length (pacing.c). Windows run while
 *     serving is busy: the bound decides, not idleness, and --train-yield-ms does not cap it
 *     (a cap would break the bound).
 *   - otherwise with yield (the default): wait while any slot is decoding, and until decoding
 *     has been idle for SRV_TRAIN_QUIET_S (a client's next request usually follows within
 *     milliseconds), at most yield_ms per window, so a server that is never idle still
 *     trains, slowly;
 *   - otherwise (yield false): share_ppm of the time while serving is active
 *     (srv_pace_yield_share).
 * Every wait ends early when serving goes quiet (no one to slow) or on cancel. Serving thus
 * competes with at most one step at a time, not with the whole job. A request that ran
 * during a window leaves its life's decode rate in eng_activity's ring; each callback folds
 * those into the slowdown histogram against r0.
 *
 * Records. A watcher thread per job waits for its end and stores the result (loss per
 * epoch, the refusal sentence unchanged), then frees the job. Records are malloc'd and
 * never move, since the job's callback holds a pointer to its own; finished ones beyond
 * SRV_TRAIN_MAX_RECORDS are dropped oldest first. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/engine_impl.h"

#define SRV_TRAIN_MAX_RECORDS 32
#define SRV_TRAIN_QUIET_S 0.25 /* idle this long before a step may start */

struct record {
    struct srv_trainer *t;
    struct srv_train_info info; /* under t->mu */
    struct lt_train_job *job;   /* NULL once finished and freed */
    pthread_t watcher;
    bool have_watcher;
    atomic_bool cancel;         /* ends a yield at once */
    int cur_epoch;
    double ep_sum;
    int ep_n;
    /* pacing, the job's thread's (what GET reads is copied into info.pace under t->mu) */
    double win_ms[64]; /* the latest windows' lengths, a ring */
    int n_win;
    long long w_tokens0, w_us0; /* eng_activity's totals when the window began */
    double rw_tok, rw_ms;       /* decayed sums of serving's tokens and ms during windows */
    double r0_tok, r0_ms;       /* ... and between them */
    double clean_at;            /* when the clean rate was last sampled (monotonic s) */
    double ep_t0;               /* when the current epoch's first window began */
    int64_t ep_tokens0;
};

struct srv_trainer {
    struct lt_model *model;
    struct lt_backend *backends[LT_SCHED_MAX_BACKENDS];
    int n_backends;
    struct eng_activity *act;
    int yield_ms;
    pthread_mutex_t mu;
    struct record *records[SRV_TRAIN_MAX_RECORDS]; /* oldest first */
    int n_records;
    unsigned counter;
};

static bool active(enum lt_train_state s)
{
    return s == LT_TRAIN_STARTING || s == LT_TRAIN_RUNNING || s == LT_TRAIN_PAUSED;
}

static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* Under t->mu. */
static void add_event(struct record *r, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_event(struct record *r, const char *level, const char *fmt, ...)
{
    struct srv_train_info *ti = &r->info;
    if (ti->n_events == SRV_TRAIN_MAX_EVENTS) {
        /* keep the first event (the job's creation) and the most recent ones */
        memmove(&ti->events[1], &ti->events[2],
                (size_t)(SRV_TRAIN_MAX_EVENTS - 2) * sizeof(ti->events[0]));
        ti->n_events--;
    }
    int k = ti->n_events++;
    ti->events[k].t = srv_now_unix();
    snprintf(ti->events[k].level, sizeof(ti->events[k].level), "%s", level);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ti->events[k].message, sizeof(ti->events[k].message), fmt, ap);
    va_end(ap);
}

/* A slot is decoding, or one was within the last SRV_TRAIN_QUIET_S. */
static bool serving_active(struct srv_trainer *t)
{
    if (atomic_load(&t->act->busy) > 0)
        return true;
    double last = (double)atomic_load(&t->act->last_busy_us) * 1e-6;
    return last > 0 && srv_now_mono() - last < SRV_TRAIN_QUIET_S;
}

#define SRV_PACE_DECAY 0.5         /* weight of older samples in the rates, per window */
#define SRV_PACE_CLEAN_EVERY_S 2.0 /* re-measure the clean rate at least this often */
#define SRV_PACE_CLEAN_MIN_S 0.1   /* the shortest yield that samples the clean rate */

/* Under t->mu: folds requests that overlapped a window into the slowdown histogram, against
 * the clean rate; they wait in the ring while there is none. */
static void drain_overlapped(struct srv_trainer *t, struct record *r)
{
    struct srv_train_pace_stats *ps = &r->info.pace;
    if (ps->rate_clean <= 0)
        return;
    pthread_mutex_lock(&t->act->ring_mu);
    for (int i = 0; i < t->act->n_ring; i++) {
        double slow = 1.0 - t->act->ring[i] / ps->rate_clean;
        int64_t ppm = slow <= 0 ? 0 : slow >= 1 ? 1000000 : (int64_t)(slow * 1e6 + 0.5);
        ps->slowdown_hist[ppm / 10000]++;
        ps->n_overlapped++;
        ps->slowdown_max_ppm = ppm > ps->slowdown_max_ppm ? ppm : ps->slowdown_max_ppm;
    }
    t->act->n_ring = 0;
    pthread_mutex_unlock(&t->act->ring_mu);
}

/* Starts a window: serving's totals now, so its end can measure the rate during it. */
static void window_begin(struct srv_trainer *t, struct record *r)
{
    r->w_tokens0 = atomic_load(&t->act->decode_tokens);
    r->w_us0 = atomic_load(&t->act->decode_us);
    atomic_fetch_add(&t->act->windows, 1);
    atomic_store(&t->act->window, 1);
}

/* Under t->mu, at a window's end: its length, and serving's rate while it ran. */
static void window_end(struct srv_trainer *t, struct record *r, double d_s)
{
    struct srv_train_pace_stats *ps = &r->info.pace;
    atomic_store(&t->act->window, 0);
    long long dtok = atomic_load(&t->act->decode_tokens) - r->w_tokens0;
    long long dus = atomic_load(&t->act->decode_us) - r->w_us0;
    double ms = d_s * 1e3;
    r->win_ms[r->n_win++ % 64] = ms;
    ps->windows++;
    ps->window_ms_last = ms;
    ps->window_ms_total += ms;
    ps->window_ms_max = ms > ps->window_ms_max ? ms : ps->window_ms_max;
    ps->window_ms_p50 = srv_pace_percentile(r->win_ms, r->n_win < 64 ? r->n_win : 64, 50);
    ps->window_ms_p95 = srv_pace_percentile(r->win_ms, r->n_win < 64 ? r->n_win : 64, 95);
    if (dtok > 0 && dus > 0 && ms > 0) {
        /* over the window's wall-clock time: a decode step that waited for the device, or a
         * prefill the window slowed, costs serving as much as a slower step does */
        ps->windows_busy++;
        r->rw_tok = r->rw_tok * SRV_PACE_DECAY + (double)dtok;
        r->rw_ms = r->rw_ms * SRV_PACE_DECAY + ms;
        ps->rate_window = r->rw_tok / r->rw_ms;
    }
}

/* Under t->mu: the step p into the job's record (progress, epochs, losses, the window). */
static void record_step(struct srv_trainer *t, struct record *r, const struct lt_train_progress *p,
                        double now)
{
    struct srv_train_info *ti = &r->info;
    struct srv_train_pace_stats *ps = &ti->pace;
    if (ti->prog.step == 0) {
        add_event(r, "info", "training started: %d steps over %d epoch(s)", p->n_steps,
                  p->n_epochs);
        r->ep_t0 = now - p->step_s;
        r->ep_tokens0 = 0;
    }
    int64_t tokens_before = ti->prog.tokens;
    ti->prog = *p;
    if (p->epoch != r->cur_epoch) {
        if (r->cur_epoch > 0) { /* this window is the new epoch's first */
            r->ep_t0 = now - p->step_s;
            r->ep_tokens0 = tokens_before;
        }
        r->cur_epoch = p->epoch;
        r->ep_sum = 0;
        r->ep_n = 0;
    }
    if (p->epoch >= 1 && p->epoch <= LT_TRAIN_MAX_EPOCHS && isfinite(p->loss)) {
        r->ep_sum += p->loss;
        r->ep_n++;
        ti->train_loss[p->epoch - 1] = (float)(r->ep_sum / r->ep_n); /* running mean */
        ti->eval_loss[p->epoch - 1] = NAN;
        ti->n_epochs = p->epoch;
    }
    window_end(t, r, p->step_s);
    if (p->epoch >= 1 && p->epoch <= LT_TRAIN_MAX_EPOCHS) {
        double es = now - r->ep_t0;
        ps->epoch_s[p->epoch - 1] = es;
        ps->epoch_tokens_per_s[p->epoch - 1] =
            es > 0 ? (double)(p->tokens - r->ep_tokens0) / es : 0;
        ps->n_epoch_times = p->epoch;
    }
    drain_overlapped(t, r);
    add_event(r, "info", "step %d/%d (epoch %d): loss %.4f, %.1f tokens/s", p->step, p->n_steps,
              p->epoch, (double)p->loss, p->tokens_per_s);
}

/* Under t->mu: how long to yield after a window of step_s seconds, by the job's pacing. */
static double yield_limit(struct srv_trainer *t, struct record *r, double step_s, double now)
{
    const struct srv_train_pacing *pc = &r->info.meta.pacing;
    const struct srv_train_pace_stats *ps = &r->info.pace;
    if (pc->max_slowdown_ppm > 0) {
        double limit =
            srv_pace_yield_bound(step_s, ps->rate_clean,
                                 ps->windows_busy > 0 ? ps->rate_window : -1, pc->max_slowdown_ppm);
        if (now - r->clean_at > SRV_PACE_CLEAN_EVERY_S && limit < SRV_PACE_CLEAN_MIN_S)
            limit = SRV_PACE_CLEAN_MIN_S; /* a yield long enough to re-measure r0 */
        return limit;
    }
    if (pc->no_yield)
        return srv_pace_yield_share(step_s, pc->share_ppm);
    return t->yield_ms < 0 ? 0 : t->yield_ms / 1000.0;
}

/* The yield itself (t->mu not held): it ends after `limit`, when serving goes quiet, or on
 * cancel; then, under t->mu, the time yielded and serving's clean rate go on record. The
 * clean rate counts from the end of the first decode step that ends in the yield: that step
 * began during the window (on two CPU cores one took seconds), so it is not clean. */
static void yield_to_serving(struct srv_trainer *t, struct record *r, double limit)
{
    struct srv_train_pace_stats *ps = &r->info.pace;
    double t0 = srv_now_mono(), t_tok0 = 0;
    long long tok_w = atomic_load(&t->act->decode_tokens), tok0 = -1;
    while (limit > 0 && serving_active(t) && !atomic_load(&r->cancel) &&
           srv_now_mono() - t0 < limit) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (tok0 < 0 && atomic_load(&t->act->decode_tokens) != tok_w) {
            tok0 = atomic_load(&t->act->decode_tokens);
            t_tok0 = srv_now_mono();
        }
    }
    double t1 = srv_now_mono(), waited = t1 - t0;
    long long dtok = tok0 < 0 ? 0 : atomic_load(&t->act->decode_tokens) - tok0;
    double dms = tok0 < 0 ? 0 : (t1 - t_tok0) * 1e3; /* wall-clock, as the window's rate */
    pthread_mutex_lock(&t->mu);
    ps->waiting_for_serving = false;
    if (waited > 0.001) {
        r->info.yielded_s += waited;
        ps->yielded_ms += waited * 1e3;
    }
    if (dtok > 0 && dms > 0) { /* serving decoded with no window: the clean rate */
        r->r0_tok = r->r0_tok * SRV_PACE_DECAY + (double)dtok;
        r->r0_ms = r->r0_ms * SRV_PACE_DECAY + dms;
        ps->rate_clean = r->r0_tok / r->r0_ms;
        r->clean_at = t1;
    }
    window_begin(t, r);
    pthread_mutex_unlock(&t->mu);
}

/* On the job's thread, after every optimizer step (a window): records it, then yields to
 * serving for as long as the job's pacing says, and starts the next window. */
static void on_progress(void *user, const struct lt_train_progress *p)
{
    struct record *r = user;
    struct srv_trainer *t = r->t;
    double now = srv_now_mono();
    pthread_mutex_lock(&t->mu);
    record_step(t, r, p, now);
    double limit = yield_limit(t, r, p->step_s, now);
    r->info.pace.waiting_for_serving = limit > 0 && serving_active(t);
    pthread_mutex_unlock(&t->mu);
    yield_to_serving(t, r, limit);
}

static void *watch_main(void *arg)
{
    struct record *r = arg;
    struct srv_trainer *t = r->t;
    struct lt_train_result res;
    lt_train_job_wait(r->job, &res);
    pthread_mutex_lock(&t->mu);
    atomic_store(&t->act->window, 0);
    drain_overlapped(t, r);
    struct srv_train_info *ti = &r->info;
    ti->result = res;
    ti->result.curve = NULL;
    ti->have_result = true;
    ti->state = res.state;
    ti->pause_requested = false;
    if (ti->prog.n_examples == 0) { /* a dry run, or one that ended before its first step */
        ti->prog.n_examples = res.n_train + res.n_val;
        ti->prog.n_fitted = res.n_fitted;
        ti->prog.n_skipped = res.n_skipped;
    }
    ti->finished_at = srv_now_unix();
    if (res.n_epochs > 0) {
        ti->n_epochs = res.n_epochs;
        for (int i = 0; i < res.n_epochs; i++) {
            ti->train_loss[i] = res.train_loss[i];
            ti->eval_loss[i] = res.eval_loss[i];
        }
    }
    if (res.state == LT_TRAIN_DONE && ti->params.dry_run)
        add_event(r, "info", "dry run: admitted; nothing was allocated or written");
    else if (res.state == LT_TRAIN_DONE)
        add_event(r, "info", "done: %s written (%lld tokens, %.1f tokens/s)", ti->meta.out_name,
                  (long long)res.tokens, res.tokens_per_s);
    else if (res.state == LT_TRAIN_CANCELLED)
        add_event(r, "warn", "cancelled; nothing was written");
    else
        add_event(r, "error", "failed: %s", res.error);
    struct lt_train_job *job = r->job;
    r->job = NULL;
    pthread_mutex_unlock(&t->mu);
    lt_train_result_free(&res);
    lt_train_job_free(job);
    return NULL;
}

lt_status srv_trainer_new(struct lt_model *m, struct lt_backend *const *backends, int n,
                          struct eng_activity *act, int yield_ms, struct srv_trainer **out)
{
    *out = NULL;
    struct srv_trainer *t = calloc(1, sizeof(*t));
    if (!t)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the trainer");
    t->model = m;
    t->n_backends = n < LT_SCHED_MAX_BACKENDS ? n : LT_SCHED_MAX_BACKENDS;
    for (int i = 0; i < t->n_backends; i++)
        t->backends[i] = backends[i];
    t->act = act;
    t->yield_ms = yield_ms == 0 ? 2000 : yield_ms;
    pthread_mutex_init(&t->mu, NULL);
    *out = t;
    return LT_OK;
}

/* Under t->mu: the record with this id, or the latest for NULL / "". */
static struct record *find(struct srv_trainer *t, const char *id)
{
    if (!id || !*id)
        return t->n_records ? t->records[t->n_records - 1] : NULL;
    for (int i = 0; i < t->n_records; i++)
        if (!strcmp(t->records[i]->info.id, id))
            return t->records[i];
    return NULL;
}

static enum lt_train_state state_of(struct record *r)
{
    return r->job ? lt_train_job_state(r->job) : r->info.state;
}

static void record_free(struct record *r)
{
    if (r->have_watcher)
        pthread_join(r->watcher, NULL);
    free(r);
}

int srv_trainer_start(struct srv_trainer *t, const struct lt_train_params *p,
                      const struct srv_train_meta *meta, char *id, size_t id_size)
{
    pthread_mutex_lock(&t->mu);
    struct record *last = find(t, NULL);
    if (last && active(state_of(last))) {
        int st = srv_fail(409, NULL, "job_running",
                          "training job %s is %s; one job runs at a time (cancel it with POST "
                          "/train/cancel)", last->info.id, lt_train_state_name(state_of(last)));
        pthread_mutex_unlock(&t->mu);
        return st;
    }
    if (t->n_records == SRV_TRAIN_MAX_RECORDS) { /* all finished: drop the oldest */
        struct record *old = t->records[0];
        memmove(&t->records[0], &t->records[1],
                (size_t)(SRV_TRAIN_MAX_RECORDS - 1) * sizeof(t->records[0]));
        t->n_records--;
        pthread_mutex_unlock(&t->mu);
        record_free(old); /* its watcher has finished or is about to */
        pthread_mutex_lock(&t->mu);
    }
    struct record *r = calloc(1, sizeof(*r));
    if (!r) {
        pthread_mutex_unlock(&t->mu);
        return srv_fail(503, NULL, NULL, "out of memory for a training job");
    }
    r->t = t;
    struct srv_train_info *ti = &r->info;
    ti->meta = *meta;
    ti->created_at = srv_now_unix();
    ti->state = LT_TRAIN_STARTING;
    snprintf(ti->id, sizeof(ti->id), "ftjob-%06u%06x", ++t->counter,
             (unsigned)((uint64_t)(srv_now_mono() * 1e6) & 0xffffff));
    ti->params = *p;
    lt_train_params_defaults(&ti->params);
    ti->params.out = ti->params.text = ti->params.text_path = NULL;
    ti->params.examples = ti->params.examples_path = ti->params.targets = NULL;
    ti->params.val_examples_path = NULL;
    for (int i = 0; i < LT_TRAIN_MAX_EPOCHS; i++)
        ti->train_loss[i] = ti->eval_loss[i] = NAN;
    ti->prog.n_epochs = ti->params.epochs;
    add_event(r, "info", "job created: training %s", meta->out_name);
    pthread_mutex_lock(&t->act->ring_mu); /* overlaps of an earlier job are not this one's */
    t->act->n_ring = 0;
    pthread_mutex_unlock(&t->act->ring_mu);
    window_begin(t, r); /* loading and admission count as the first window */
    lt_status ls = lt_train_job_start(t->model, t->backends, t->n_backends, p, on_progress, r,
                                      &r->job);
    if (ls != LT_OK) {
        atomic_store(&t->act->window, 0);
        pthread_mutex_unlock(&t->mu);
        free(r);
        return srv_fail(srv_http_status_of(ls), NULL, NULL, "%s", lt_last_error());
    }
    if (pthread_create(&r->watcher, NULL, watch_main, r) != 0) {
        /* without a watcher the job is still ours: stop it here */
        struct lt_train_job *job = r->job;
        pthread_mutex_unlock(&t->mu);
        lt_train_job_free(job);
        atomic_store(&t->act->window, 0);
        free(r);
        return srv_fail(503, NULL, NULL, "cannot start a thread to watch the training job");
    }
    r->have_watcher = true;
    t->records[t->n_records++] = r;
    snprintf(id, id_size, "%s", ti->id);
    pthread_mutex_unlock(&t->mu);
    return 200;
}

int srv_trainer_info(struct srv_trainer *t, const char *id, struct srv_train_info *out)
{
    pthread_mutex_lock(&t->mu);
    struct record *r = find(t, id);
    if (!r) {
        pthread_mutex_unlock(&t->mu);
        return id && *id ? srv_fail(404, NULL, "not_found", "no training job '%s'", id)
                         : srv_fail(404, NULL, "not_found", "no training job has run");
    }
    *out = r->info;
    if (r->job) {
        struct lt_train_progress pr;
        lt_train_job_progress(r->job, &pr);
        /* A finished job reads as finished once watch_main has published its result and
         * last evaluation (under this lock); between the job's end and that, its live state
         * would say "done" with them missing, so it still reads as running (or starting,
         * before its first step). */
        out->state = pr.state < LT_TRAIN_DONE ? pr.state
                     : pr.step > 0            ? LT_TRAIN_RUNNING
                                              : LT_TRAIN_STARTING;
        if (pr.step >= out->prog.step)
            out->prog = pr;
    }
    pthread_mutex_unlock(&t->mu);
    out->rss_bytes = rss_bytes();
    return 200;
}

int srv_trainer_list(struct srv_trainer *t, char (*ids)[48], int max, int *n)
{
    pthread_mutex_lock(&t->mu);
    int k = 0;
    int first = t->n_records > max ? t->n_records - max : 0;
    for (int i = first; i < t->n_records; i++)
        snprintf(ids[k++], 48, "%s", t->records[i]->info.id);
    pthread_mutex_unlock(&t->mu);
    *n = k;
    return 200;
}

int srv_trainer_control(struct srv_trainer *t, const char *id, enum srv_train_op op)
{
    pthread_mutex_lock(&t->mu);
    struct record *r = find(t, id);
    int st = 200;
    if (!r) {
        st = id && *id ? srv_fail(404, NULL, "not_found", "no training job '%s'", id)
                       : srv_fail(409, NULL, "no_job", "no training job is running");
    } else if (!r->job || !active(state_of(r))) {
        st = srv_fail(409, NULL, "job_finished", "training job %s has finished (%s)",
                      r->info.id, lt_train_state_name(state_of(r)));
    } else if (op == SRV_TRAIN_CANCEL) {
        atomic_store(&r->cancel, true);
        lt_train_job_cancel(r->job);
        add_event(r, "info", "cancel requested");
    } else if (op == SRV_TRAIN_PAUSE) {
        lt_train_job_pause(r->job);
        r->info.pause_requested = true;
        add_event(r, "info", "pause requested");
    } else {
        lt_train_job_resume(r->job);
        r->info.pause_requested = false;
        add_event(r, "info", "resumed");
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* The pacing contract's numbers (GET /train's "pacing"), as gauges. */
static void pace_metrics(const struct srv_train_info *ti, struct lt_strbuf *out)
{
    const struct srv_train_pace_stats *ps = &ti->pace;
    const struct lt_train_progress *pr = &ti->prog;
    srv_strbuf_appendf(
        out,
        "# HELP lathe_train_max_slowdown_ppm The job's bound on serving's slowdown (0: none).\n"
        "# TYPE lathe_train_max_slowdown_ppm gauge\nlathe_train_max_slowdown_ppm %d\n"
        "# TYPE lathe_train_windows gauge\nlathe_train_windows %lld\n"
        "# HELP lathe_train_windows_busy Windows during which serving decoded.\n"
        "# TYPE lathe_train_windows_busy gauge\nlathe_train_windows_busy %lld\n"
        "# TYPE lathe_train_window_ms gauge\n"
        "lathe_train_window_ms{stat=\"last\"} %g\nlathe_train_window_ms{stat=\"p50\"} %g\n"
        "lathe_train_window_ms{stat=\"p95\"} %g\nlathe_train_window_ms{stat=\"max\"} %g\n"
        "# TYPE lathe_train_yielded_ms gauge\nlathe_train_yielded_ms %g\n"
        "# HELP lathe_train_serving_tokens_per_ms Serving's decode rate measured by the job.\n"
        "# TYPE lathe_train_serving_tokens_per_ms gauge\n"
        "lathe_train_serving_tokens_per_ms{window=\"no\"} %g\n"
        "lathe_train_serving_tokens_per_ms{window=\"yes\"} %g\n"
        "# TYPE lathe_train_overlapped_requests gauge\nlathe_train_overlapped_requests %lld\n"
        "# TYPE lathe_train_slowdown_max_ppm gauge\nlathe_train_slowdown_max_ppm %lld\n"
        "# TYPE lathe_train_waiting_for_serving gauge\nlathe_train_waiting_for_serving %d\n"
        "# TYPE lathe_train_examples gauge\nlathe_train_examples %d\n"
        "# TYPE lathe_train_examples_truncated gauge\nlathe_train_examples_truncated %d\n"
        "# TYPE lathe_train_examples_skipped gauge\nlathe_train_examples_skipped %d\n"
        "# TYPE lathe_train_window_asked gauge\nlathe_train_window_asked %d\n",
        ti->meta.pacing.max_slowdown_ppm, (long long)ps->windows, (long long)ps->windows_busy,
        ps->window_ms_last, ps->window_ms_p50, ps->window_ms_p95, ps->window_ms_max, ps->yielded_ms,
        ps->rate_clean, ps->rate_window, (long long)ps->n_overlapped,
        (long long)ps->slowdown_max_ppm, ps->waiting_for_serving, pr->n_examples, pr->n_fitted,
        pr->n_skipped, ti->params.window);
    srv_strbuf_appendf(out, "# HELP lathe_train_slowdown_requests Overlapped requests by "
                            "serving's slowdown, whole percent.\n"
                            "# TYPE lathe_train_slowdown_requests gauge\n");
    for (int i = 0; i < SRV_PACE_HIST; i++)
        if (ps->slowdown_hist[i] > 0)
            srv_strbuf_appendf(out, "lathe_train_slowdown_requests{percent=\"%d\"} %lld\n", i,
                               (long long)ps->slowdown_hist[i]);
    srv_strbuf_appendf(out, "# TYPE lathe_train_epoch_seconds gauge\n");
    for (int i = 0; i < ps->n_epoch_times; i++)
        srv_strbuf_appendf(out, "lathe_train_epoch_seconds{epoch=\"%d\"} %g\n", i + 1,
                           ps->epoch_s[i]);
    srv_strbuf_appendf(out, "# TYPE lathe_train_epoch_tokens_per_second gauge\n");
    for (int i = 0; i < ps->n_epoch_times; i++)
        srv_strbuf_appendf(out, "lathe_train_epoch_tokens_per_second{epoch=\"%d\"} %g\n", i + 1,
                           ps->epoch_tokens_per_s[i]);
}

void srv_trainer_metrics(struct srv_trainer *t, struct lt_strbuf *out)
{
    struct srv_train_info *ti = malloc(sizeof(*ti));
    if (!ti)
        return;
    bool have = srv_trainer_info(t, NULL, ti) == 200;
    static const enum lt_train_state states[] = {LT_TRAIN_IDLE, LT_TRAIN_STARTING,
                                                 LT_TRAIN_RUNNING, LT_TRAIN_PAUSED,
                                                 LT_TRAIN_DONE, LT_TRAIN_CANCELLED,
                                                 LT_TRAIN_ERROR};
    enum lt_train_state cur = have ? ti->state : LT_TRAIN_IDLE;
    srv_strbuf_appendf(out, "# HELP lathe_train_state The latest training job's state (1 = "
                            "current).\n# TYPE lathe_train_state gauge\n");
    for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
        srv_strbuf_appendf(out, "lathe_train_state{state=\"%s\"} %d\n",
                           lt_train_state_name(states[i]), states[i] == cur);
    if (have)
        srv_strbuf_appendf(out,
                           "# TYPE lathe_train_step gauge\nlathe_train_step %d\n"
                           "# TYPE lathe_train_loss gauge\nlathe_train_loss %g\n"
                           "# TYPE lathe_train_tokens_per_second gauge\n"
                           "lathe_train_tokens_per_second %g\n"
                           "# TYPE lathe_train_yield_seconds_total counter\n"
                           "lathe_train_yield_seconds_total %g\n",
                           ti->prog.step, ti->prog.step > 0 ? (double)ti->prog.loss : 0.0,
                           ti->prog.tokens_per_s, ti->yielded_s);
    if (have)
        pace_metrics(ti, out);
    free(ti);
}

void srv_trainer_free(struct srv_trainer *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n_records; i++) {
        struct record *r = t->records[i];
        atomic_store(&r->cancel, true);
        if (r->job)
            lt_train_job_cancel(r->job);
    }
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->n_records; i++)
        record_free(t->records[i]);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
