/* routes_train.c: training beside serving, in lathe's shape (/train, /train/cancel|pause|
 * resume) and in OpenAI's fine-tuning shape (/v1/fine_tuning/jobs...).
 *
 * Every parameter is checked here, before the engine starts anything: types and ranges
 * from the field table, then lt_train_params_validate for the rules between fields. Files
 * are named, never given as paths: `out` and `training_file` are plain names resolved inside
 * the train dir. Data given in the request is read and tokenized as the job will before
 * the job starts, so bad examples get a 400 naming the example. A job that later fails
 * (admission refused it, say) is reported by GET as state "error" with the library's
 * sentence unchanged; serving is not involved. */
#ifdef LATHE_HAVE_JANSSON
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "server/json_check.h"
#include "server/routes.h"

static json_t *num_or_null(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static bool job_active(enum lt_train_state s)
{
    return s == LT_TRAIN_STARTING || s == LT_TRAIN_RUNNING || s == LT_TRAIN_PAUSED;
}

/* ---- lathe's shape ---- */

/* The pacing contract and what the job has measured of it (both shapes carry it). */
static json_t *pace_json(const struct srv_train_info *ti)
{
    const struct srv_train_pacing *pc = &ti->meta.pacing;
    const struct srv_train_pace_stats *ps = &ti->pace;
    const struct lt_train_progress *pr = &ti->prog;
    json_t *hist = json_object();
    char key[8];
    for (int i = 0; i < SRV_PACE_HIST; i++)
        if (ps->slowdown_hist[i] > 0) {
            snprintf(key, sizeof(key), "%d", i);
            json_object_set_new(hist, key, json_integer(ps->slowdown_hist[i]));
        }
    json_t *epochs = json_array();
    for (int i = 0; i < ps->n_epoch_times; i++)
        json_array_append_new(epochs,
                              json_pack("{s:i,s:f,s:f}", "epoch", i + 1, "seconds", ps->epoch_s[i],
                                        "tokens_per_s", ps->epoch_tokens_per_s[i]));
    return json_pack(
        "{s:o,s:o,s:b,s:s,"
        "s:I,s:I,s:{s:f,s:f,s:f,s:f},s:f,"
        "s:{s:o,s:o},"
        "s:{s:I,s:o,s:I},"
        "s:b,s:o,s:i,s:i,s:i,s:i}",
        "max_slowdown_ppm",
        pc->max_slowdown_ppm > 0 ? json_integer(pc->max_slowdown_ppm) : json_null(), "share_ppm",
        pc->max_slowdown_ppm > 0
            ? json_null()
            : json_integer(pc->share_ppm > 0 ? pc->share_ppm : SRV_TRAIN_SHARE_PPM_DEFAULT),
        "yield", !pc->no_yield, "mode",
        pc->max_slowdown_ppm > 0 ? "max_slowdown"
        : pc->no_yield           ? "share"
                                 : "yield",
        "windows", (json_int_t)ps->windows, "windows_busy", (json_int_t)ps->windows_busy,
        "window_ms", "last", ps->window_ms_last, "p95", ps->window_ms_p95, "max", ps->window_ms_max,
        "total", ps->window_ms_total, "yielded_ms", ps->yielded_ms, "serving_tokens_per_ms",
        "without_window", ps->rate_clean > 0 ? json_real(ps->rate_clean) : json_null(),
        "with_window", ps->rate_window > 0 ? json_real(ps->rate_window) : json_null(), "slowdown",
        "requests", (json_int_t)ps->n_overlapped, "percent_histogram", hist, "max_ppm",
        (json_int_t)ps->slowdown_max_ppm, "waiting_for_serving", ps->waiting_for_serving, "epochs",
        epochs, "examples", pr->n_examples, "examples_truncated", pr->n_fitted, "examples_skipped",
        pr->n_skipped, "window_asked", ti->params.window);
}

/* The status fields of CambrianTech's /train, top level as its clients read them (lathe's own
 * are in "pacing", "progress" and "params"): the window, the examples' counts, the pacing's
 * windows and yields, pause, the depth adapted, and the output's path once written. */
static void fork_status_fields(json_t *j, const struct srv_train_info *ti)
{
    const struct srv_train_pace_stats *ps = &ti->pace;
    const struct lt_train_progress *pr = &ti->prog;
    const struct srv_train_pacing *pc = &ti->meta.pacing;
    int n_layer = ti->meta.n_layer, top = ti->params.top_layers;
    json_t *f = json_pack(
        "{s:i,s:i,s:i,s:i,s:i,s:f,s:i,s:I,s:I,s:f,s:f,s:f,s:f,s:b,s:b,s:b}", "window",
        ti->have_result && ti->result.n_tokens_graph > 0 ? ti->result.n_tokens_graph
                                                         : ti->params.window,
        "window_asked", ti->params.window, "examples", pr->n_examples, "examples_truncated",
        pr->n_fitted, "examples_skipped", pr->n_skipped, "yielded_ms", ps->yielded_ms, "share_ppm",
        pc->share_ppm > 0 ? pc->share_ppm : SRV_TRAIN_SHARE_PPM_DEFAULT, "windows",
        (json_int_t)ps->windows, "windows_while_busy", (json_int_t)ps->windows_busy,
        "window_ms_last", ps->window_ms_last, "window_ms_max", ps->window_ms_max, "window_ms_p50",
        ps->window_ms_p50, "window_ms_p95", ps->window_ms_p95, "pause_requested",
        ti->pause_requested, "paused", ti->state == LT_TRAIN_PAUSED, "waiting_for_serving",
        ps->waiting_for_serving);
    if (!f)
        return;
    if (n_layer > 0) {
        json_object_set_new(f, "n_layer", json_integer(n_layer));
        json_object_set_new(f, "layers_adapted",
                            json_integer(top > 0 && top < n_layer ? top : n_layer));
    }
    if (ti->state == LT_TRAIN_DONE && ti->meta.out_path[0])
        json_object_set_new(f, "adapter", json_string(ti->meta.out_path));
    json_object_update_missing(j, f);
    json_decref(f);
}

static json_t *train_json(const struct srv_train_info *ti)
{
    const struct lt_train_progress *pr = &ti->prog;
    json_t *epochs = json_array();
    const struct srv_train_pace_stats *ps = &ti->pace;
    for (int i = 0; i < ti->n_epochs; i++) {
        bool timed = i < ps->n_epoch_times; /* seconds and tokens/s as CambrianTech's /train */
        json_array_append_new(
            epochs,
            json_pack("{s:i,s:o,s:o,s:o,s:o}", "epoch", i + 1, "train_loss",
                      num_or_null(ti->train_loss[i]), "eval_loss", num_or_null(ti->eval_loss[i]),
                      "seconds", timed ? json_real(ps->epoch_s[i]) : json_null(), "train_tok_s",
                      timed ? json_real(ps->epoch_tokens_per_s[i]) : json_null()));
    }
    const struct lt_train_result *r = &ti->result;
    const struct lt_train_params *p = &ti->params;
    json_t *j = json_pack(
        "{s:s,s:s,s:s,s:s,s:I,s:o,"
        "s:{s:i,s:i,s:i,s:i,s:o,s:I,s:f,s:f},"
        "s:o,s:{s:I,s:I,s:I,s:I,s:I},"
        "s:{s:i,s:f,s:i,s:i,s:f,s:f,s:I,s:i,s:I,s:b,s:i,s:i,s:i,s:b,s:f,s:s},"
        "s:f}",
        "id", ti->id, "object", "train.job", "state", lt_train_state_name(ti->state), "out",
        ti->meta.out_name, "created_at", (json_int_t)ti->created_at, "finished_at",
        ti->finished_at > 0 ? json_integer((json_int_t)ti->finished_at) : json_null(), "progress",
        "epoch", pr->epoch, "n_epochs", pr->n_epochs, "step", pr->step, "n_steps", pr->n_steps,
        "loss", pr->step > 0 ? num_or_null(pr->loss) : json_null(), "tokens",
        (json_int_t)pr->tokens, "tokens_per_s", pr->tokens_per_s, "eta_s", pr->eta_s, "epochs",
        epochs, "memory", "rss_bytes", (json_int_t)ti->rss_bytes, "peak_bytes",
        (json_int_t)(ti->have_result ? r->peak_bytes : 0), "allocated_bytes",
        (json_int_t)(ti->have_result ? r->allocated_bytes : 0), "scratch_bytes",
        (json_int_t)(ti->have_result ? r->scratch_bytes : 0), "in_use_bytes",
        (json_int_t)(ti->have_result ? r->in_use_bytes : 0), "params", "rank", p->rank, "alpha",
        (double)p->alpha, "window", p->window, "epochs", p->epochs, "lr", (double)p->lr,
        "val_split", (double)p->val_split, "seed", (json_int_t)p->seed, "top_layers", p->top_layers,
        "memory_budget_mib", (json_int_t)p->memory_budget_mib, "device_only", p->device_only,
        "batch", p->batch, "batch_tokens", p->batch_tokens, "grad_accum", p->grad_accum, "no_pack",
        p->no_pack, "weight_decay", (double)p->weight_decay, "fit",
        p->fit == LT_FIT_MIDDLE ? "middle"
        : p->fit == LT_FIT_LEFT ? "left"
                                : "none",
        "yielded_s", ti->yielded_s);
    if (!j)
        return NULL;
    json_object_set_new(j, "pacing", pace_json(ti));
    fork_status_fields(j, ti);
    /* examples packed padding-free into the micro-batch's sequences (known once admitted) */
    json_object_set_new(j, "packed", ti->have_result ? json_boolean(r->packed) : json_null());
    bool failed = ti->state == LT_TRAIN_ERROR && ti->have_result;
    json_object_set_new(j, "error", failed ? json_string(r->error) : json_null());
    if (failed && r->refusal.kind != LT_REFUSAL_NONE) {
        const struct lt_refusal *f = &r->refusal;
        json_object_set_new(
            j, "refusal",
            json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:I,s:s}", "kind",
                      lt_refusal_kind_name(f->kind), "op", f->op, "node", f->node, "source",
                      f->source, "source_layout", f->source_layout, "backend", f->backend,
                      "reason", f->reason, "need_bytes", (json_int_t)f->need_bytes,
                      "budget_bytes", (json_int_t)f->budget_bytes, "sentence", f->sentence));
    } else {
        json_object_set_new(j, "refusal", json_null());
    }
    if (ti->have_result && ti->state == LT_TRAIN_DONE)
        json_object_set_new(
            j, "result",
            json_pack("{s:i,s:i,s:I,s:f,s:f,s:i,s:i,s:I,s:i,s:s}", "n_train", r->n_train,
                      "n_val", r->n_val, "tokens", (json_int_t)r->tokens, "seconds", r->seconds,
                      "tokens_per_s", r->tokens_per_s, "n_fallback", r->n_fallback,
                      "n_trainable", r->n_trainable, "n_trainable_elements",
                      (json_int_t)r->n_trainable_elements, "n_tokens_graph", r->n_tokens_graph,
                      "admission", r->admission));
    else
        json_object_set_new(j, "result", json_null());
    return j;
}

static void respond_train_info(struct srv_app *app, struct srv_response *rs, const char *id,
                               json_t *(*shape)(const struct srv_train_info *))
{
    struct srv_train_info *ti = calloc(1, sizeof(*ti));
    if (!ti) {
        srv_respond_error(rs, 503, NULL, NULL, "out of memory");
        return;
    }
    int st = app->engine->iface->train_info(app->engine, id, ti);
    if (st == 404 && (!id || !*id) && shape == train_json)
        srv_respond_json(rs, 200, json_pack("{s:n,s:s,s:s}", "id", "object", "train.job", "state",
                                            "idle"));
    else if (st != 200)
        srv_respond_last_error(rs, st);
    else
        srv_respond_json(rs, 200, shape(ti));
    free(ti);
}

/* lathe's shape answers in the wire shape of CambrianTech's llama.cpp /train as well: every
 * reply, error or not, carries "ok" (true below 400), and an error its sentence under
 * "error", with the OpenAI error object's type, param and code beside it. A start
 * (with_status) answers {"ok": true, "status": {...}} there: the job object carries a copy of
 * itself under "status". */
static void mark_ok(struct srv_response *rs, bool with_status)
{
    json_t *j = rs->is_stream ? NULL : json_loadb(rs->body.data, rs->body.len, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return;
    }
    if (with_status && rs->status == 200)
        json_object_set_new(j, "status", json_deep_copy(j));
    json_object_set_new(j, "ok", json_boolean(rs->status < 400));
    json_t *e = json_object_get(j, "error");
    if (rs->status >= 400 && json_is_object(e)) {
        json_incref(e);
        static const char *const keys[] = {"type", "param", "code"};
        for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
            json_t *v = json_object_get(e, keys[i]);
            if (v)
                json_object_set(j, keys[i], v);
        }
        json_t *msg = json_object_get(e, "message");
        json_object_set_new(j, "error",
                            json_is_string(msg) ? json_incref(msg) : json_string("error"));
        json_decref(e);
    }
    srv_respond_json(rs, rs->status, j);
}

void srv_route_train_get(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs)
{
    respond_train_info(app, rs, NULL, train_json);
    mark_ok(rs, false);
}

static bool require_training(struct srv_app *app, struct srv_response *rs)
{
    if (!app->train_dir) {
        srv_respond_error(rs, 403, NULL, "training_disabled",
                          "training is disabled: start lathe serve with --train-dir DIR");
        return false;
    }
    return srv_require_ready(app, rs);
}

/* Joins an array of strings (targets) with commas. */
static int join_targets(const json_t *v, char *buf, size_t size)
{
    if (json_is_string(v)) {
        if (json_string_length(v) >= size)
            return srv_fail(400, "targets", "out_of_range", "'targets' is too long");
        snprintf(buf, size, "%s", json_string_value(v));
        return 200;
    }
    size_t len = 0;
    buf[0] = 0;
    char name[32];
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        snprintf(name, sizeof(name), "targets[%zu]", i);
        int st = srv_check_value(e, name, SRV_JT_STRING, 0, 0);
        if (st != 200)
            return st;
        int w = snprintf(buf + len, size - len, "%s%s", i ? "," : "", json_string_value(e));
        if (w < 0 || (size_t)w >= size - len)
            return srv_fail(400, "targets", "out_of_range", "'targets' is too long");
        len += (size_t)w;
    }
    return 200;
}

/* Chat examples given as an array of objects become JSONL. */
static int examples_jsonl(const json_t *v, struct lt_strbuf *out)
{
    char name[32];
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        snprintf(name, sizeof(name), "examples[%zu]", i);
        int st = srv_check_value(e, name, SRV_JT_OBJECT, 0, 0);
        if (st != 200)
            return st;
        char *s = json_dumps(e, JSON_COMPACT);
        bool ok = s && lt_strbuf_append(out, s, strlen(s)) == LT_OK &&
                  lt_strbuf_append(out, "\n", 1) == LT_OK;
        free(s);
        if (!ok)
            return srv_fail(503, "examples", NULL, "out of memory for the examples");
    }
    if (out->len == 0)
        return srv_fail(400, "examples", "invalid_value", "'examples' is empty");
    return 200;
}

/* The pacing fields (types and ranges already checked) of obj, the body or the
 * hyperparameters ("where" names it in messages). A bound and a share are two answers to
 * one question, so both together are refused. */
static int parse_pacing(const json_t *obj, const char *where, struct srv_train_pacing *out)
{
    memset(out, 0, sizeof(*out));
    if (!obj)
        return 200;
    out->max_slowdown_ppm = (int)srv_json_int(obj, "max_slowdown_ppm", 0);
    out->share_ppm = (int)srv_json_int(obj, "share_ppm", 0);
    out->no_yield = !srv_json_bool(obj, "yield", true);
    if (srv_json_get(obj, "max_slowdown_ppm") && srv_json_get(obj, "share_ppm")) {
        char name[64];
        srv_field_name(name, sizeof(name), where, "share_ppm");
        return srv_fail(400, name, "invalid_value",
                        "'max_slowdown_ppm' and 'share_ppm' cannot be given together: "
                        "max_slowdown_ppm bounds serving's slowdown and sizes each yield from "
                        "measured rates, share_ppm is a plain time share; choose one");
    }
    return 200;
}

/* Checks the library's rules between fields; the first bad field is named. */
static int validate_params(const struct lt_train_params *p)
{
    struct lt_train_errors errs;
    if (lt_train_params_validate(p, &errs) == LT_OK)
        return 200;
    char msg[1024];
    size_t len = 0;
    msg[0] = 0;
    for (int i = 0; i < errs.n && len + 1 < sizeof(msg); i++) {
        int w = snprintf(msg + len, sizeof(msg) - len, "%s%s: %s", i ? "; " : "",
                         errs.e[i].field, errs.e[i].message);
        len += w > 0 ? (size_t)w : 0;
    }
    return srv_fail(400, errs.n ? errs.e[0].field : NULL, "invalid_value", "%s", msg);
}

/* Bad training data is answered here, naming the example, instead of by a job that fails
 * after the 200: examples given as an array are named by their index in it ("examples[3]"),
 * JSONL given as a string by index and line. */
static int check_data(struct srv_app *app, const struct lt_train_params *p, const json_t *ex,
                      const char *file_param, const char *file)
{
    if (!app->engine->iface->train_check)
        return 200;
    struct lt_train_data_fault f;
    int st = app->engine->iface->train_check(app->engine, p, &f);
    if (st == 200)
        return 200;
    const char *code = st != 400 ? NULL : p->text ? "invalid_value" : "invalid_example";
    if (file_param) /* a file of the train dir: its name, not the server's path to it */
        return f.example < 0
                   ? srv_fail(st, file_param, code, "%s '%s': %s", file_param, file,
                              f.reason[0] ? f.reason : lt_last_error())
                   : srv_fail(st, file_param, code, "%s '%s': example %d (line %d): %s",
                              file_param, file, f.example, f.line, f.reason);
    if (f.example < 0)
        return srv_fail(st, p->text ? "text" : "examples", code, "%s", lt_last_error());
    if (ex && json_is_array(ex)) {
        char name[40];
        snprintf(name, sizeof(name), "examples[%d]", f.example);
        return srv_fail(st, name, code, "example %d: %s", f.example, f.reason);
    }
    return srv_fail(st, "examples", code, "example %d (line %d): %s", f.example, f.line, f.reason);
}

/* POST /train's fields: the keys of the parameters' table (lathe/train.h) with its types and
 * ranges, then the pacing fields and CambrianTech's `chunk`. Returns how many (at most cap). */
static size_t train_fields(struct srv_field *out, size_t cap)
{
    static const struct srv_field pacing[] = {
        {"max_slowdown_ppm", SRV_JT_INT, 1, 999999, false},
        {"share_ppm", SRV_JT_INT, 1, 1000000, false},
        {"yield", SRV_JT_BOOL, 0, 0, false},
        /* the fork's graph size within a window; accepted for its clients, no effect here */
        {"chunk", SRV_JT_INT, 256, 1 << 30, false},
    };
    size_t n_t, n = 0;
    const struct lt_train_field *t = lt_train_fields(&n_t);
    for (size_t i = 0; i < n_t && n < cap; i++) {
        const struct lt_train_field *f = &t[i];
        if (!f->key)
            continue;
        static const unsigned types[] = {
            [LT_TF_STRING] = SRV_JT_STRING, [LT_TF_INT] = SRV_JT_INT,
            [LT_TF_U64] = SRV_JT_INT,       [LT_TF_SIZE] = SRV_JT_INT,
            [LT_TF_FLOAT] = SRV_JT_NUMBER,  [LT_TF_BOOL] = SRV_JT_BOOL,
            [LT_TF_FIT] = SRV_JT_STRING,    [LT_TF_CHECKPOINT] = SRV_JT_BOOL | SRV_JT_STRING,
        };
        bool list = !strcmp(f->key, "examples") || !strcmp(f->key, "targets");
        /* open bounds: the nearest number inside (srv_field's range is inclusive) */
        double lo = f->lo_open ? nextafter(f->lo, INFINITY) : f->lo;
        double hi = f->hi_open ? nextafter(f->hi, -INFINITY) : f->hi;
        out[n++] = (struct srv_field){f->key, types[f->type] | (list ? SRV_JT_ARRAY : 0), lo, hi,
                                      !strcmp(f->key, "out")};
    }
    for (size_t i = 0; i < sizeof(pacing) / sizeof(pacing[0]) && n < cap; i++)
        out[n++] = pacing[i];
    return n;
}

/* The numbers and switches of body's table keys into p (strings, the fit policy and the
 * data are the route's: they need paths, joins and their own messages). Checked already. */
static void train_set_fields(const json_t *body, struct lt_train_params *p)
{
    size_t n_t;
    const struct lt_train_field *t = lt_train_fields(&n_t);
    for (size_t i = 0; i < n_t; i++) {
        const struct lt_train_field *f = &t[i];
        json_t *v = f->key ? srv_json_get(body, f->key) : NULL;
        if (!v)
            continue;
        void *at = (char *)p + f->offset;
        switch (f->type) {
        case LT_TF_INT: *(int *)at = (int)srv_json_int(body, f->key, 0); break;
        case LT_TF_U64: *(uint64_t *)at = (uint64_t)srv_json_int(body, f->key, 0); break;
        case LT_TF_SIZE: *(size_t *)at = (size_t)srv_json_int(body, f->key, 0); break;
        case LT_TF_FLOAT: *(float *)at = (float)srv_json_num(body, f->key, 0); break;
        case LT_TF_BOOL: *(bool *)at = srv_json_bool(body, f->key, false); break;
        case LT_TF_CHECKPOINT: /* absent: auto; a name is the route's (checked there) */
            if (json_is_boolean(v))
                *(enum lt_checkpoint *)at = json_is_true(v) ? LT_CHECKPOINT_ON : LT_CHECKPOINT_OFF;
            break;
        default: break;
        }
    }
}

/* The fields of CambrianTech's /train that lathe takes its own way: chunk (checked, no
 * effect) and parse_special (false refused). 200, or the refusal. */
static int check_fork_fields(const json_t *body)
{
    if (srv_json_int(body, "chunk", 256) % 256 != 0)
        return srv_fail(400, "chunk", "invalid_value",
                        "'chunk' must be a multiple of 256 (it is accepted as CambrianTech's "
                        "/train takes it, and has no effect: lathe's step graph holds whole "
                        "windows, batch_tokens of them)");
    if (!srv_json_bool(body, "parse_special", true))
        return srv_fail(400, "parse_special", "unsupported_value",
                        "'parse_special' false is not supported: chat examples are rendered "
                        "through the model's chat template, whose role markers are special "
                        "tokens, so their text is always read as those tokens; leave it out or "
                        "send true");
    return 200;
}

void srv_route_train_post(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs)
{
    struct srv_field fields[48];
    size_t n_fields = train_fields(fields, sizeof(fields) / sizeof(fields[0]));
    json_t *body = NULL;
    struct lt_strbuf examples = {0};
    struct lt_train_params p = {0};
    struct srv_train_meta meta = {0};
    bool started = false;
    char path[1024], targets[512];
    int st = srv_parse_body(rq, &body);
    if (st == 200)
        st = srv_check_object(body, "", fields, n_fields);
    if (st != 200)
        goto out_error;
    const char *out = srv_json_str(body, "out", "");
    if ((st = srv_path_in_dir(app->train_dir, out, ".gguf", "out", path, sizeof(path))) != 200)
        goto out_error;
    if (!require_training(app, rs))
        goto out_free;
    snprintf(meta.out_name, sizeof(meta.out_name), "%s", out);
    snprintf(meta.out_path, sizeof(meta.out_path), "%s", path);
    if ((st = parse_pacing(body, "", &meta.pacing)) != 200 || (st = check_fork_fields(body)) != 200)
        goto out_error;
    p.out = path;
    p.text = srv_json_str(body, "text", NULL);
    json_t *ex = srv_json_get(body, "examples");
    if (ex && json_is_string(ex)) {
        p.examples = json_string_value(ex);
    } else if (ex) {
        if ((st = examples_jsonl(ex, &examples)) != 200)
            goto out_error;
        p.examples = examples.data;
    }
    train_set_fields(body, &p);
    if (!srv_json_get(body, "val_split"))
        p.val_split = SRV_TRAIN_VAL_SPLIT_DEFAULT;
    json_t *tg = srv_json_get(body, "targets");
    if (tg) {
        if ((st = join_targets(tg, targets, sizeof(targets))) != 200)
            goto out_error;
        p.targets = targets;
    }
    const char *ckpt = srv_json_str(body, "checkpoint", NULL);
    if (ckpt && !lt_train_field_parse(lt_train_field_by_key("checkpoint"), ckpt, &p)) {
        st = srv_fail(400, "checkpoint", "invalid_value",
                      "'checkpoint' must be auto, on, off or selective (or true or false)");
        goto out_error;
    }
    const char *fit = srv_json_str(body, "fit", NULL);
    if (fit && !lt_fit_policy_parse(fit, &p.fit)) {
        st = srv_fail(400, "fit", "invalid_value", "'fit' must be none, middle or left");
        goto out_error;
    }
    struct srv_model_info mi;
    app->engine->iface->info(app->engine, &mi);
    snprintf(meta.model, sizeof(meta.model), "%s", mi.id);
    meta.n_layer = (int)mi.n_layer;
    if (p.top_layers > mi.n_layer) {
        st = srv_fail(400, "top_layers", "out_of_range", "'top_layers' must be 0..%lld",
                      (long long)mi.n_layer);
        goto out_error;
    }
    if ((st = validate_params(&p)) != 200 || (st = check_data(app, &p, ex, NULL, NULL)) != 200)
        goto out_error;
    char id[48];
    if ((st = app->engine->iface->train_start(app->engine, &p, &meta, id, sizeof(id))) != 200)
        goto out_error;
    respond_train_info(app, rs, id, train_json);
    started = true;
    goto out_free;

out_error:
    srv_respond_last_error(rs, st);
out_free:
    mark_ok(rs, started);
    lt_strbuf_free(&examples);
    json_decref(body);
}

/* lathe's shape may name the job by its output, {"out": NAME} (CambrianTech's /train does):
 * a name that is not the running job's is refused, so a client cannot pause or cancel a job
 * it did not mean. An empty body, or one without "out", means the latest job. */
static int check_out_named(struct srv_app *app, const struct srv_request *rq)
{
    size_t i = 0;
    while (i < rq->body_len && strchr(" \t\r\n", rq->body[i]))
        i++;
    if (i == rq->body_len)
        return 200;
    json_t *body = NULL;
    int st = srv_parse_body(rq, &body);
    json_t *out = st == 200 ? srv_json_get(body, "out") : NULL;
    if (st == 200 && out)
        st = srv_check_value(out, "out", SRV_JT_STRING, 0, 0);
    if (st != 200 || !out) {
        json_decref(body);
        return st;
    }
    struct srv_train_info *ti = calloc(1, sizeof(*ti));
    if (!ti) {
        json_decref(body);
        return srv_fail(503, NULL, NULL, "out of memory");
    }
    const char *name = json_string_value(out);
    bool have =
        app->engine->iface->train_info(app->engine, NULL, ti) == 200 && job_active(ti->state);
    size_t n = strlen(name);
    bool same =
        have && (!strcmp(name, ti->meta.out_name) ||
                 (!strncmp(name, ti->meta.out_name, n) && !strcmp(ti->meta.out_name + n, ".gguf")));
    if (!have)
        st = srv_fail(409, "out", "no_job", "no training job is running, so none writes '%.200s'",
                      name);
    else if (!same)
        st = srv_fail(409, "out", "not_running_job",
                      "'%.200s' is not the running job's output; job %s writes '%s'", name, ti->id,
                      ti->meta.out_name);
    free(ti);
    json_decref(body);
    return st;
}

static void train_control(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs, const char *id, enum srv_train_op op,
                          json_t *(*shape)(const struct srv_train_info *))
{
    if (!app->train_dir) {
        require_training(app, rs);
    } else {
        int st = shape == train_json ? check_out_named(app, rq) : 200;
        if (st == 200)
            st = app->engine->iface->train_control(app->engine, id, op);
        if (st != 200)
            srv_respond_last_error(rs, st);
        else
            respond_train_info(app, rs, id, shape);
    }
    if (shape == train_json)
        mark_ok(rs, false);
}

void srv_route_train_cancel(struct srv_app *app, const struct srv_request *rq,
                            struct srv_response *rs)
{
    train_control(app, rq, rs, NULL, SRV_TRAIN_CANCEL, train_json);
}

void srv_route_train_pause(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs)
{
    train_control(app, rq, rs, NULL, SRV_TRAIN_PAUSE, train_json);
}

void srv_route_train_resume(struct srv_app *app, const struct srv_request *rq,
                            struct srv_response *rs)
{
    train_control(app, rq, rs, NULL, SRV_TRAIN_RESUME, train_json);
}

/* ---- OpenAI's fine-tuning shape ---- */

static const char *ft_status(enum lt_train_state s)
{
    switch (s) {
    case LT_TRAIN_IDLE: return "queued";
    case LT_TRAIN_STARTING: return "validating_files";
    case LT_TRAIN_RUNNING:
    case LT_TRAIN_PAUSED: return "running";
    case LT_TRAIN_DONE: return "succeeded";
    case LT_TRAIN_CANCELLED: return "cancelled";
    case LT_TRAIN_ERROR: return "failed";
    }
    return "failed";
}

static json_t *ft_json(const struct srv_train_info *ti)
{
    const struct lt_train_params *p = &ti->params;
    bool done = ti->state == LT_TRAIN_DONE;
    bool failed = ti->state == LT_TRAIN_ERROR && ti->have_result;
    json_t *j = json_pack(
        "{s:s,s:s,s:s,s:I,s:o,s:o,s:s,s:[],s:s,s:o,s:s,s:{s:i,s:o,s:f},s:o,s:I,s:o,s:[],s:n}",
        "object", "fine_tuning.job", "id", ti->id, "model", ti->meta.model, "created_at",
        (json_int_t)ti->created_at, "finished_at",
        ti->finished_at > 0 ? json_integer((json_int_t)ti->finished_at) : json_null(),
        "fine_tuned_model", done ? json_string(ti->meta.out_name) : json_null(),
        "organization_id", "lathe", "result_files", "status", ft_status(ti->state),
        "validation_file",
        ti->meta.validation_file[0] ? json_string(ti->meta.validation_file) : json_null(),
        "training_file", ti->meta.training_file, "hyperparameters",
        "n_epochs", p->epochs, "batch_size",
        p->batch > 0 ? json_integer(p->batch) : json_string("auto"), "learning_rate_multiplier",
        (double)p->lr / 1e-3, "trained_tokens",
        done ? json_integer((json_int_t)ti->prog.tokens) : json_null(), "seed",
        (json_int_t)p->seed, "error",
        failed ? json_pack("{s:s,s:s,s:n}", "code", ti->result.refusal.kind != LT_REFUSAL_NONE
                                                        ? "refused" : "training_failed",
                           "message", ti->result.error, "param")
               : json_null(),
        "integrations", "metadata");
    if (j) {
        json_object_set_new(j, "lathe_state", json_string(lt_train_state_name(ti->state)));
        json_object_set_new(j, "lathe_pacing", pace_json(ti));
        json_object_set_new(j, "estimated_finish",
                            job_active(ti->state) && ti->prog.eta_s > 0
                                ? json_integer((json_int_t)(srv_now_unix() + ti->prog.eta_s))
                                : json_null());
    }
    return j;
}

/* A job's training or validation file (`param`): an uploaded file's id or a .jsonl name in
 * the train dir, which must exist; its path into path. */
static int ft_file(struct srv_app *app, const char *name, const char *param, char *path,
                   size_t size)
{
    int st = srv_file_resolve(app, name, param, path, size);
    struct stat sb;
    if (st == 200 && (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)))
        st = srv_fail(400, param, "file_not_found", "there is no file '%s' in the train dir",
                      name);
    return st;
}

/* hyperparameters: OpenAI's keys (n_epochs, batch_size, learning_rate_multiplier, each a
 * number or "auto"), lathe's batch_tokens and grad_accum, and the pacing fields; the ranges
 * of the first four are the parameters' table's. 200, or the status of the answer. */
static int ft_check_hyperparameters(const json_t *hp)
{
    struct srv_field hp_fields[] = {
        {"n_epochs", SRV_JT_INT | SRV_JT_STRING, 0, 0, false},
        {"batch_size", SRV_JT_INT | SRV_JT_STRING, 0, 0, false},
        {"batch_tokens", SRV_JT_INT | SRV_JT_STRING, 0, 0, false},
        {"grad_accum", SRV_JT_INT | SRV_JT_STRING, 0, 0, false},
        {"learning_rate_multiplier", SRV_JT_NUMBER | SRV_JT_STRING, 1e-6, 1000, false},
        {"max_slowdown_ppm", SRV_JT_INT, 1, 999999, false},
        {"share_ppm", SRV_JT_INT, 1, 1000000, false},
        {"yield", SRV_JT_BOOL, 0, 0, false},
    };
    for (int i = 0; i < 4; i++) {
        const struct lt_train_field *f = lt_train_field_by_key(hp_fields[i].name);
        hp_fields[i].min = f->lo;
        hp_fields[i].max = f->hi;
    }
    const int n_hp = (int)(sizeof(hp_fields) / sizeof(hp_fields[0]));
    int st = srv_check_object(hp, "hyperparameters", hp_fields, n_hp);
    for (int i = 0; st == 200 && i < n_hp; i++) {
        json_t *v = srv_json_get(hp, hp_fields[i].name);
        if (v && json_is_string(v) && strcmp(json_string_value(v), "auto") != 0) {
            char name[64];
            srv_field_name(name, sizeof(name), "hyperparameters", hp_fields[i].name);
            st = srv_fail(400, name, "invalid_value", "'%s' must be a number or \"auto\"", name);
        }
    }
    return st;
}

/* The checked hyperparameters into p ("auto" and absent: the defaults). */
static void ft_set_hyperparameters(const json_t *hp, struct lt_train_params *p)
{
    if (!hp)
        return;
    if (json_is_integer(srv_json_get(hp, "n_epochs")))
        p->epochs = (int)srv_json_int(hp, "n_epochs", 0);
    if (json_is_integer(srv_json_get(hp, "batch_size")))
        p->batch = (int)srv_json_int(hp, "batch_size", 0);
    if (json_is_integer(srv_json_get(hp, "batch_tokens")))
        p->batch_tokens = (int)srv_json_int(hp, "batch_tokens", 0);
    if (json_is_integer(srv_json_get(hp, "grad_accum")))
        p->grad_accum = (int)srv_json_int(hp, "grad_accum", 0);
    if (json_is_number(srv_json_get(hp, "learning_rate_multiplier")))
        p->lr = (float)(1e-3 * srv_json_num(hp, "learning_rate_multiplier", 1));
}

void srv_route_ft_create(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs)
{
    static const struct srv_field fields[] = {
        {"model", SRV_JT_STRING, 0, 0, false},
        {"training_file", SRV_JT_STRING, 0, 0, true},
        {"validation_file", SRV_JT_STRING | SRV_JT_NULL, 0, 0, false},
        {"hyperparameters", SRV_JT_OBJECT, 0, 0, false},
        {"suffix", SRV_JT_STRING, 0, 0, false},
        {"seed", SRV_JT_INT, 0, 9.2e18, false},
    };
    json_t *body = NULL;
    struct lt_train_params p = {0};
    struct srv_train_meta meta = {.openai_shape = true};
    char data_path[1024], val_path[1024] = "", out_path[1024];
    int st = srv_parse_body(rq, &body);
    if (st == 200)
        st = srv_check_object(body, "", fields, sizeof(fields) / sizeof(fields[0]));
    if (st != 200)
        goto out_error;
    json_t *hp = srv_json_get(body, "hyperparameters");
    if (hp && (st = ft_check_hyperparameters(hp)) != 200)
        goto out_error;
    if ((st = parse_pacing(hp, "hyperparameters", &meta.pacing)) != 200)
        goto out_error;
    const char *file = srv_json_str(body, "training_file", "");
    const char *vfile = srv_json_str(body, "validation_file", NULL);
    if ((st = ft_file(app, file, "training_file", data_path, sizeof(data_path))) != 200 ||
        (vfile && (st = ft_file(app, vfile, "validation_file", val_path, sizeof(val_path))) != 200))
        goto out_error;
    const char *suffix = srv_json_str(body, "suffix", "ft");
    if (strlen(suffix) > 40 || strspn(suffix, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-") != strlen(suffix) || !*suffix) {
        st = srv_fail(400, "suffix", "invalid_value",
                      "'suffix' is 1..40 letters, digits, '_' or '-'");
        goto out_error;
    }
    if (!require_training(app, rs))
        goto out_free;
    struct srv_model_info mi;
    app->engine->iface->info(app->engine, &mi);
    const char *model = srv_json_str(body, "model", NULL);
    if (model && strcmp(model, mi.id) != 0) {
        st = srv_fail(400, "model", "model_not_found", "this server fine-tunes only '%s', not "
                      "'%.64s'", mi.id, model);
        goto out_error;
    }
    snprintf(meta.training_file, sizeof(meta.training_file), "%s", file);
    snprintf(meta.validation_file, sizeof(meta.validation_file), "%s", vfile ? vfile : "");
    snprintf(meta.model, sizeof(meta.model), "%s", mi.id);
    snprintf(meta.out_name, sizeof(meta.out_name), "%s-%08x.gguf", suffix,
             (unsigned)((uint64_t)(srv_now_mono() * 1e6) & 0xffffffffu));
    snprintf(out_path, sizeof(out_path), "%s/%s", app->train_dir, meta.out_name);
    p.out = out_path;
    p.examples_path = data_path;
    p.val_examples_path = vfile ? val_path : NULL;
    ft_set_hyperparameters(hp, &p);
    p.seed = (uint64_t)srv_json_int(body, "seed", 0);
    struct lt_train_params vp = p; /* the validation file alone, so its faults are its own */
    vp.examples_path = val_path;
    vp.val_examples_path = NULL;
    if ((st = validate_params(&p)) != 200 ||
        (vfile && (st = check_data(app, &vp, NULL, "validation_file", vfile)) != 200) ||
        (st = check_data(app, &p, NULL, "training_file", file)) != 200)
        goto out_error;
    char id[48];
    if ((st = app->engine->iface->train_start(app->engine, &p, &meta, id, sizeof(id))) != 200)
        goto out_error;
    respond_train_info(app, rs, id, ft_json);
    goto out_free;

out_error:
    srv_respond_last_error(rs, st);
out_free:
    json_decref(body);
}

void srv_route_ft_list(struct srv_app *app, const struct srv_request *rq,
                       struct srv_response *rs)
{
    char(*ids)[48] = calloc(64, sizeof(*ids));
    struct srv_train_info *ti = calloc(1, sizeof(*ti));
    json_t *data = json_array();
    int n = 0;
    if (!ids || !ti || !data) {
        srv_respond_error(rs, 503, NULL, NULL, "out of memory");
        goto out_free;
    }
    app->engine->iface->train_list(app->engine, ids, 64, &n);
    for (int i = n - 1; i >= 0; i--) /* newest first */
        if (app->engine->iface->train_info(app->engine, ids[i], ti) == 200)
            json_array_append_new(data, ft_json(ti));
    srv_respond_json(rs, 200, json_pack("{s:s,s:o,s:b}", "object", "list", "data", data,
                                        "has_more", false));
    data = NULL;
out_free:
    json_decref(data);
    free(ti);
    free(ids);
}

void srv_route_ft_get(struct srv_app *app, const struct srv_request *rq, struct srv_response *rs)
{
    respond_train_info(app, rs, rq->route_id, ft_json);
}

void srv_route_ft_events(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs)
{
    struct srv_train_info *ti = calloc(1, sizeof(*ti));
    if (!ti) {
        srv_respond_error(rs, 503, NULL, NULL, "out of memory");
        return;
    }
    int st = app->engine->iface->train_info(app->engine, rq->route_id, ti);
    if (st != 200) {
        srv_respond_last_error(rs, st);
        free(ti);
        return;
    }
    json_t *data = json_array();
    char eid[96];
    for (int i = ti->n_events - 1; i >= 0; i--) { /* newest first */
        snprintf(eid, sizeof(eid), "ftevent-%s-%d", ti->id, i);
        json_array_append_new(data, json_pack("{s:s,s:s,s:I,s:s,s:s,s:s}", "object",
                                              "fine_tuning.job.event", "id", eid, "created_at",
                                              (json_int_t)ti->events[i].t, "level",
                                              ti->events[i].level, "message",
                                              ti->events[i].message, "type", "message"));
    }
    srv_respond_json(rs, 200, json_pack("{s:s,s:o,s:b}", "object", "list", "data", data,
                                        "has_more", false));
    free(ti);
}

void srv_route_ft_cancel(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs)
{
    train_control(app, rq, rs, rq->route_id, SRV_TRAIN_CANCEL, ft_json);
}

#endif
