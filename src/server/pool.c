/* pool.c: LoRA adapters and the sessions that read them.
 *
 * A session's graphs read one fixed adapter list (lt_session_params.adapters), so requests
 * with different adapter sets (a per-request "lora" field, or a change of the defaults)
 * decode in different sessions. At most ENG_MAX_SESSIONS exist at once; a set that needs a
 * new one evicts the least recently used idle session, or waits for one to go idle.
 *
 * An adapter is freed only when it has been unloaded (or replaced by a new file of the same
 * name) and no session reads it any more: `refs` counts sessions, `in_use` counts slots
 * decoding with it. Unloading one that is decoding is refused (409); replacing it by
 * loading the same name again is not: running generations finish on the old one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/engine_impl.h"

/* ---- adapter sets ---- */

static struct eng_lora *find_lora(struct engine *e, const char *name, int id)
{
    for (int i = 0; i < e->n_loras; i++) {
        struct eng_lora *l = e->loras[i];
        if (l->removed)
            continue;
        if ((name && *name && !strcmp(l->name, name)) || ((!name || !*name) && l->id == id))
            return l;
    }
    return NULL;
}

static void config_add(struct eng_config *cfg, struct eng_lora *l, float scale)
{
    int k = cfg->n++;
    while (k > 0 && cfg->ids[k - 1] > l->id) { /* keep sorted by id */
        cfg->ids[k] = cfg->ids[k - 1];
        cfg->scales[k] = cfg->scales[k - 1];
        cfg->loras[k] = cfg->loras[k - 1];
        k--;
    }
    cfg->ids[k] = l->id;
    cfg->scales[k] = scale;
    cfg->loras[k] = l;
}

int eng_config_resolve(struct engine *e, const struct srv_gen_params *p, struct eng_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    int st = 200;
    pthread_mutex_lock(&e->lora_mu);
    if (p->lora_given) {
        for (int i = 0; i < p->n_loras && st == 200; i++) {
            const struct srv_lora_choice *c = &p->loras[i];
            struct eng_lora *l = find_lora(e, c->name, c->id);
            if (!l) {
                st = c->name[0] ? srv_fail(400, "lora", "lora_not_loaded",
                                           "no adapter named '%s' is loaded", c->name)
                                : srv_fail(400, "lora", "lora_not_loaded",
                                           "no adapter with id %d is loaded", c->id);
                break;
            }
            for (int k = 0; k < cfg->n; k++)
                if (cfg->ids[k] == l->id)
                    st = srv_fail(400, "lora", "invalid_value", "adapter '%s' is listed twice",
                                  l->name);
            if (st == 200 && c->scale != 0)
                config_add(cfg, l, c->scale);
        }
    } else {
        for (int i = 0; i < e->n_loras && st == 200; i++) {
            struct eng_lora *l = e->loras[i];
            if (l->removed || l->scale == 0)
                continue;
            if (cfg->n == SRV_MAX_REQ_LORAS)
                st = srv_fail(409, "lora", "too_many_adapters",
                              "more than %d adapters have a non-zero scale; set some to 0",
                              SRV_MAX_REQ_LORAS);
            else
                config_add(cfg, l, l->scale);
        }
    }
    pthread_mutex_unlock(&e->lora_mu);
    return st;
}

static bool config_equal(const struct eng_config *a, const struct eng_config *b)
{
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (a->ids[i] != b->ids[i] || a->scales[i] != b->scales[i])
            return false;
    return true;
}

void eng_config_use(struct engine *e, const struct eng_config *cfg, int delta)
{
    pthread_mutex_lock(&e->lora_mu);
    for (int i = 0; i < cfg->n; i++)
        cfg->loras[i]->in_use += delta;
    pthread_mutex_unlock(&e->lora_mu);
}

/* Drops refs on cfg's adapters, freeing those unloaded and no longer read. */
static void config_unref(struct engine *e, const struct eng_config *cfg)
{
    pthread_mutex_lock(&e->lora_mu);
    for (int i = 0; i < cfg->n; i++)
        cfg->loras[i]->refs--;
    int kept = 0;
    for (int i = 0; i < e->n_loras; i++) {
        struct eng_lora *l = e->loras[i];
        if (l->removed && l->refs == 0) {
            lt_lora_free(l->lora);
            free(l);
        } else {
            e->loras[kept++] = l;
        }
    }
    e->n_loras = kept;
    pthread_mutex_unlock(&e->lora_mu);
}

/* ---- sessions ---- */

void eng_session_free(struct engine *e, struct eng_session *es)
{
    if (!es)
        return;
    lt_session_free(es->s);
    free(es->list);
    for (int i = 0; es->cache && i < e->p.parallel; i++)
        free(es->cache[i].tokens);
    free(es->cache);
    free(es->seq_busy);
    config_unref(e, &es->cfg);
    free(es);
}

static struct eng_session *session_new(struct engine *e, const struct eng_config *cfg, int *st)
{
    struct eng_session *es = calloc(1, sizeof(*es));
    if (es) {
        es->seq_busy = calloc((size_t)e->p.parallel, sizeof(bool));
        es->cache = calloc((size_t)e->p.parallel, sizeof(*es->cache));
    }
    if (!es || !es->seq_busy || !es->cache) {
        if (es) {
            free(es->seq_busy);
            free(es->cache);
        }
        free(es);
        *st = srv_fail(503, NULL, NULL, "out of memory for a session");
        return NULL;
    }
    struct lt_lora *loras[SRV_MAX_REQ_LORAS];
    pthread_mutex_lock(&e->lora_mu);
    for (int i = 0; i < cfg->n; i++) {
        if (cfg->loras[i]->removed) {
            pthread_mutex_unlock(&e->lora_mu);
            free(es->seq_busy);
            free(es->cache);
            free(es);
            *st = srv_fail(400, "lora", "lora_not_loaded", "adapter '%s' was unloaded",
                           cfg->loras[i]->name);
            return NULL;
        }
    }
    for (int i = 0; i < cfg->n; i++) {
        cfg->loras[i]->refs++;
        loras[i] = cfg->loras[i]->lora;
    }
    es->cfg = *cfg;
    pthread_mutex_unlock(&e->lora_mu);

    int n_list = 0;
    lt_status ls = LT_OK;
    if (cfg->n > 0)
        ls = lt_lora_model_list(e->model, loras, cfg->scales, cfg->n, &es->list, &n_list);
    if (ls != LT_OK) {
        *st = srv_fail(400, "lora", NULL, "%s", lt_last_error());
        goto out_free;
    }
    es->ad = (struct lt_model_adapters){.lora = es->list, .n_lora = n_list};
    struct lt_session_params sp = {
        .n_ctx = e->info.n_ctx,
        .n_seq_max = e->p.parallel,
        .backends = e->backends,
        .n_backends = e->n_backends,
        .n_threads = e->p.n_threads,
        .adapters = n_list > 0 ? &es->ad : NULL,
        /* greedy slots' tokens are picked where the logits are (decode_session) */
        .pick_vocab = (int)lt_tokenizer_n_tokens(e->tok),
    };
    ls = lt_session_new(e->model, &sp, &es->s);
    if (ls != LT_OK) {
        *st = srv_fail(ls == LT_ERR_NOMEM ? 503 : 500, NULL, NULL, "cannot create a session: %s",
                       lt_last_error());
        goto out_free;
    }
    es->last_used = srv_now_mono();
    return es;

out_free:
    eng_session_free(e, es);
    return NULL;
}

struct eng_session *eng_session_get(struct engine *e, const struct eng_config *cfg, int *st)
{
    *st = 200;
    for (int i = 0; i < e->n_sessions; i++) {
        struct eng_session *es = e->sessions[i];
        if (config_equal(&es->cfg, cfg))
            return es->n_active < e->p.parallel ? es : NULL;
    }
    if (e->n_sessions == ENG_MAX_SESSIONS) {
        int victim = -1;
        for (int i = 0; i < e->n_sessions; i++)
            if (e->sessions[i]->n_active == 0 &&
                (victim < 0 || e->sessions[i]->last_used < e->sessions[victim]->last_used))
                victim = i;
        if (victim < 0)
            return NULL; /* all busy: wait */
        eng_session_free(e, e->sessions[victim]);
        e->sessions[victim] = e->sessions[--e->n_sessions];
    }
    struct eng_session *es = session_new(e, cfg, st);
    if (es)
        e->sessions[e->n_sessions++] = es;
    return es;
}

void eng_sessions_collect(struct engine *e)
{
    for (int i = 0; i < e->n_sessions;) {
        struct eng_session *es = e->sessions[i];
        bool stale = false;
        pthread_mutex_lock(&e->lora_mu);
        for (int k = 0; k < es->cfg.n; k++)
            stale = stale || es->cfg.loras[k]->removed;
        pthread_mutex_unlock(&e->lora_mu);
        if (stale && es->n_active == 0) {
            eng_session_free(e, es);
            e->sessions[i] = e->sessions[--e->n_sessions];
        } else {
            i++;
        }
    }
}

void eng_sessions_free_all(struct engine *e)
{
    eng_step_lock(e);
    for (int i = 0; i < e->n_sessions; i++)
        eng_session_free(e, e->sessions[i]);
    e->n_sessions = 0;
    eng_step_unlock(e);
}

/* ---- the registry ---- */

int eng_lora_list(struct srv_engine *se, struct srv_lora_info **out, int *n)
{
    struct engine *e = se->impl;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&e->lora_mu);
    struct srv_lora_info *list = calloc((size_t)e->n_loras + 1, sizeof(*list));
    if (!list) {
        pthread_mutex_unlock(&e->lora_mu);
        return srv_fail(503, NULL, NULL, "out of memory");
    }
    int k = 0;
    for (int i = 0; i < e->n_loras; i++) {
        struct eng_lora *l = e->loras[i];
        if (l->removed)
            continue;
        struct srv_lora_info *d = &list[k++];
        d->id = l->id;
        snprintf(d->name, sizeof(d->name), "%s", l->name);
        snprintf(d->path, sizeof(d->path), "%s", l->path);
        d->scale = l->scale;
        d->n_pairs = l->lora->n_pairs;
        d->rank = l->lora->n_pairs > 0 ? lt_lora_rank(l->lora, 0) : 0;
        d->in_use = l->in_use;
    }
    pthread_mutex_unlock(&e->lora_mu);
    *out = list;
    *n = k;
    return 200;
}

int eng_lora_load(struct srv_engine *se, const char *name, const char *path, float scale)
{
    struct engine *e = se->impl;
    struct lt_lora *lora = NULL;
    lt_status ls = lt_lora_load(path, &lora);
    if (ls == LT_OK && (ls = lt_lora_check(lora, e->model)) != LT_OK)
        lt_lora_free(lora);
    if (ls != LT_OK)
        return srv_fail(ls == LT_ERR_NOMEM ? 503 : ls == LT_ERR_IO ? 404 : 400, "name",
                        "invalid_adapter", "adapter '%s': %s", name, lt_last_error());
    struct eng_lora *l = calloc(1, sizeof(*l));
    if (!l) {
        lt_lora_free(lora);
        return srv_fail(503, NULL, NULL, "out of memory for an adapter");
    }
    snprintf(l->name, sizeof(l->name), "%s", name);
    snprintf(l->path, sizeof(l->path), "%s", path);
    l->lora = lora;
    l->scale = scale;

    int st = 200;
    eng_step_lock(e);
    pthread_mutex_lock(&e->lora_mu);
    struct eng_lora *old = find_lora(e, name, -1);
    if (e->n_loras == ENG_MAX_LORAS) {
        st = srv_fail(409, "name", "too_many_adapters",
                      "%d adapters are loaded (or still decoding); unload some first",
                      ENG_MAX_LORAS);
    } else {
        if (old)
            old->removed = true; /* replaced: running generations finish on it */
        l->id = e->next_lora_id++;
        e->loras[e->n_loras++] = l;
    }
    pthread_mutex_unlock(&e->lora_mu);
    if (st == 200)
        eng_sessions_collect(e);
    eng_step_unlock(e);
    if (st != 200) {
        lt_lora_free(lora);
        free(l);
    }
    return st;
}

int eng_lora_unload(struct srv_engine *se, const char *name)
{
    struct engine *e = se->impl;
    int st = 200;
    eng_step_lock(e);
    pthread_mutex_lock(&e->lora_mu);
    struct eng_lora *l = find_lora(e, name, -1);
    if (!l)
        st = srv_fail(404, "name", "lora_not_loaded", "no adapter named '%s' is loaded", name);
    else if (l->in_use > 0)
        st = srv_fail(409, "name", "lora_in_use",
                      "adapter '%s' is decoding %d request(s) now; unload it when they finish",
                      name, l->in_use);
    else
        l->removed = true;
    bool free_now = st == 200 && l->refs == 0;
    if (free_now) {
        int k = 0;
        for (int i = 0; i < e->n_loras; i++)
            if (e->loras[i] != l)
                e->loras[k++] = e->loras[i];
        e->n_loras = k;
    }
    pthread_mutex_unlock(&e->lora_mu);
    if (free_now) {
        lt_lora_free(l->lora);
        free(l);
    } else if (st == 200) {
        eng_sessions_collect(e); /* idle sessions reading it go, and it with them */
    }
    eng_step_unlock(e);
    return st;
}

int eng_lora_set_scale(struct srv_engine *se, const char *name, int id, float scale)
{
    struct engine *e = se->impl;
    pthread_mutex_lock(&e->lora_mu);
    struct eng_lora *l = find_lora(e, name, id);
    if (l)
        l->scale = scale;
    pthread_mutex_unlock(&e->lora_mu);
    if (l)
        return 200;
    return name && *name
               ? srv_fail(404, "name", "lora_not_loaded", "no adapter named '%s' is loaded", name)
               : srv_fail(404, "id", "lora_not_loaded", "no adapter with id %d is loaded", id);
}

void eng_loras_free_all(struct engine *e)
{
    pthread_mutex_lock(&e->lora_mu);
    for (int i = 0; i < e->n_loras; i++) {
        lt_lora_free(e->loras[i]->lora);
        free(e->loras[i]);
    }
    e->n_loras = 0;
    pthread_mutex_unlock(&e->lora_mu);
}
