/* gen.c: a generation, the object a completion request and the engine share: the request's
 * parameters going in, the text coming out.
 *
 * The engine pushes only text that may be shown (lt_gen_seq has already held back partial
 * UTF-8 and possible starts of stop strings, and cut a stop string off), so text and
 * visible move together here; the consumer copies text[seen..visible) as it grows. With
 * p.logprobs each token's log-probabilities are pushed with its text, under the same lock,
 * tagged with where its bytes start, so a consumer takes exactly the tokens whose text it
 * has shown (srv_gen_logprobs). Every field after the parameters is guarded by mu; waiters
 * sleep on cv. The last of the two holders (the HTTP side, the engine) to let go frees it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server_impl.h"

const char *srv_finish_name(enum srv_finish f)
{
    switch (f) {
    case SRV_FINISH_NONE: return "none";
    case SRV_FINISH_STOP: return "stop";
    case SRV_FINISH_LENGTH: return "length";
    case SRV_FINISH_CANCELLED: return "cancelled";
    case SRV_FINISH_ERROR: return "error";
    }
    return "?";
}

void srv_gen_params_free(struct srv_gen_params *p)
{
    free(p->prompt);
    for (size_t i = 0; i < p->n_stops; i++)
        free(p->stops[i]);
    lt_grammar_free(p->grammar);
    memset(p, 0, sizeof(*p));
}

int srv_gen_new(struct srv_gen_params *p, struct srv_gen **out)
{
    *out = NULL;
    struct srv_gen *g = calloc(1, sizeof(*g));
    if (!g) {
        srv_gen_params_free(p);
        return srv_fail(503, NULL, NULL, "out of memory for a generation");
    }
    if (pthread_mutex_init(&g->mu, NULL) != 0)
        goto out_free_gen;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0)
        goto out_destroy_mutex;
    g->refs = 1;
    g->p = *p;
    memset(p, 0, sizeof(*p));
    g->t_submit = srv_now_mono();
    *out = g;
    return 200;

out_destroy_mutex:
    pthread_mutex_destroy(&g->mu);
out_free_gen:
    free(g);
    srv_gen_params_free(p);
    return srv_fail(503, NULL, NULL, "cannot create a generation's lock");
}

void srv_gen_ref(struct srv_gen *g)
{
    pthread_mutex_lock(&g->mu);
    g->refs++;
    pthread_mutex_unlock(&g->mu);
}

void srv_gen_unref(struct srv_gen *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    int left = --g->refs;
    pthread_mutex_unlock(&g->mu);
    if (left > 0)
        return;
    srv_gen_params_free(&g->p);
    lt_strbuf_free(&g->text);
    free(g->lps);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void finish_locked(struct srv_gen *g, enum srv_finish why)
{
    if (g->done)
        return;
    g->done = true;
    g->finish = why;
    g->t_done = srv_now_mono();
    pthread_cond_broadcast(&g->cv);
}

void srv_gen_push(struct srv_gen *g, const char *bytes, size_t n, int n_completion)
{
    srv_gen_push_lp(g, bytes, n, n_completion, NULL);
}

/* under mu */
static bool append_lp_locked(struct srv_gen *g, const struct srv_token_lp *lp)
{
    if (g->n_lps == g->cap_lps) {
        size_t cap = g->cap_lps ? 2 * g->cap_lps : 64;
        struct srv_token_lp *a = realloc(g->lps, cap * sizeof(*a));
        if (!a)
            return false;
        g->lps = a;
        g->cap_lps = cap;
    }
    g->lps[g->n_lps++] = *lp;
    return true;
}

void srv_gen_push_lp(struct srv_gen *g, const char *bytes, size_t n, int n_completion,
                     const struct srv_token_lp *lp)
{
    pthread_mutex_lock(&g->mu);
    if (!g->done) {
        if (g->t_first_token == 0)
            g->t_first_token = srv_now_mono();
        g->n_completion = n_completion;
        if (lp && !append_lp_locked(g, lp)) {
            snprintf(g->err, sizeof(g->err), "out of memory for the log-probabilities");
            g->err_status = 503;
            finish_locked(g, SRV_FINISH_ERROR);
        }
        if (n > 0 && lt_strbuf_append(&g->text, bytes, n) != LT_OK) {
            snprintf(g->err, sizeof(g->err), "out of memory for the generated text");
            g->err_status = 503;
            finish_locked(g, SRV_FINISH_ERROR);
        }
        g->visible = g->text.len;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

void srv_gen_finish(struct srv_gen *g, enum srv_finish why)
{
    pthread_mutex_lock(&g->mu);
    finish_locked(g, why);
    pthread_mutex_unlock(&g->mu);
}

void srv_gen_fail(struct srv_gen *g, int http_status, const char *msg)
{
    pthread_mutex_lock(&g->mu);
    if (!g->done) {
        g->err_status = http_status;
        snprintf(g->err, sizeof(g->err), "%s", msg);
        finish_locked(g, SRV_FINISH_ERROR);
    }
    pthread_mutex_unlock(&g->mu);
}

bool srv_gen_cancelled(struct srv_gen *g)
{
    pthread_mutex_lock(&g->mu);
    bool c = g->cancel;
    pthread_mutex_unlock(&g->mu);
    return c;
}

size_t srv_gen_wait(struct srv_gen *g, size_t seen, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g->mu);
    while (!g->done && g->visible <= seen) {
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT)
            break;
    }
    size_t v = g->visible;
    pthread_mutex_unlock(&g->mu);
    return v;
}

void srv_gen_cancel(struct srv_gen *g)
{
    pthread_mutex_lock(&g->mu);
    g->cancel = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void srv_gen_snapshot(struct srv_gen *g, size_t from, struct lt_strbuf *out,
                      struct srv_gen_snap *s)
{
    pthread_mutex_lock(&g->mu);
    if (out && from < g->visible)
        lt_strbuf_append(out, g->text.data + from, g->visible - from);
    s->visible = g->visible;
    s->done = g->done;
    s->finish = g->finish;
    s->n_completion = g->n_completion;
    s->err_status = g->err_status;
    snprintf(s->err, sizeof(s->err), "%s", g->err);
    s->queue_s = g->t_start > 0 ? g->t_start - g->t_submit : 0;
    s->first_token_s = g->t_first_token > 0 ? g->t_first_token - g->t_submit : 0;
    s->total_s = g->t_done > 0 ? g->t_done - g->t_submit : 0;
    pthread_mutex_unlock(&g->mu);
}

void srv_gen_mark_started(struct srv_gen *g)
{
    pthread_mutex_lock(&g->mu);
    g->t_start = srv_now_mono();
    pthread_mutex_unlock(&g->mu);
}

size_t srv_gen_logprobs(struct srv_gen *g, size_t from, size_t visible,
                        struct srv_token_lp **out)
{
    *out = NULL;
    pthread_mutex_lock(&g->mu);
    size_t end = from;
    while (end < g->n_lps && g->lps[end].text_start < visible)
        end++;
    size_t n = end > from ? end - from : 0;
    if (n > 0) {
        *out = malloc(n * sizeof(**out));
        if (*out)
            memcpy(*out, g->lps + from, n * sizeof(**out));
        else
            n = 0;
    }
    pthread_mutex_unlock(&g->mu);
    return n;
}
