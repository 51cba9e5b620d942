/* routes_lora.c: LoRA adapters: GET /lora-adapters, POST /lora-adapters (scales),
 * /lora-adapters/load and /lora-adapters/unload, GET /lora-adapters/files (the adapter files
 * in the train dir).
 *
 * An adapter is loaded by name from the train dir only (so a finished /train job's output
 * can be served without a restart, and nothing else on the machine can be read). A loaded
 * adapter applies, at its scale, to every request that does not choose its own with the
 * per-request "lora" field; scale 0 keeps it loaded but off. */
#ifdef LATHE_HAVE_JANSSON
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#include "lathe/gguf.h"
#include "server/json_check.h"
#include "server/routes.h"

static json_t *lora_json(const struct srv_lora_info *l)
{
    return json_pack("{s:i,s:s,s:s,s:f,s:i,s:i,s:i}", "id", l->id, "name", l->name, "path",
                     l->path, "scale", (double)l->scale, "n_pairs", l->n_pairs, "rank", l->rank,
                     "in_use", l->in_use);
}

static void respond_list(struct srv_app *app, struct srv_response *rs)
{
    struct srv_lora_info *list = NULL;
    int n = 0;
    int st = app->engine->iface->lora_list(app->engine, &list, &n);
    if (st != 200) {
        srv_respond_last_error(rs, st);
        return;
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, lora_json(&list[i]));
    free(list);
    srv_respond_json(rs, 200, arr);
}

void srv_route_lora_list(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs)
{
    respond_list(app, rs);
}

/* ---- GET /lora-adapters/files: the adapters in the train dir ---- */

static bool adapter_loaded(struct srv_app *app, const char *name);

/* Whether the GGUF at path is a LoRA adapter (general.type "adapter", adapter.type "lora"),
 * read from its header. */
static bool is_lora_file(const char *path)
{
    struct lt_gguf *g = NULL;
    const char *type = NULL, *kind = NULL;
    bool yes = lt_gguf_open(path, &g) == LT_OK && lt_gguf_find_key(g, "general.type") >= 0 &&
               lt_gguf_get_str(g, "general.type", &type) == LT_OK && !strcmp(type, "adapter") &&
               lt_gguf_find_key(g, "adapter.type") >= 0 &&
               lt_gguf_get_str(g, "adapter.type", &kind) == LT_OK && !strcmp(kind, "lora");
    lt_gguf_close(g);
    return yes;
}

static int cmp_file_name(const void *a, const void *b)
{
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "name")),
                  json_string_value(json_object_get(*(json_t *const *)b, "name")));
}

/* [{name, bytes, modified, loaded}] for every LoRA adapter file at the top of the train dir
 * (what /lora-adapters/load takes), by name; other files (models, data, temporaries) are
 * left out. */
void srv_route_lora_files(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs)
{
    if (!app->train_dir) {
        srv_respond_error(rs, 403, NULL, "training_disabled",
                          "adapters are loaded from --train-dir, which this server was not "
                          "started with");
        return;
    }
    DIR *d = opendir(app->train_dir);
    if (!d) {
        srv_respond_error(rs, 500, NULL, NULL, "cannot read the train dir");
        return;
    }
    json_t *items[SRV_MAX_LISTED];
    size_t n = 0;
    for (struct dirent *e = readdir(d); e && n < SRV_MAX_LISTED; e = readdir(d)) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < 6 || strcmp(e->d_name + len - 5, ".gguf") != 0)
            continue;
        char path[2048];
        struct stat sb;
        snprintf(path, sizeof(path), "%s/%s", app->train_dir, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || !is_lora_file(path))
            continue;
        items[n++] = json_pack("{s:s,s:I,s:I,s:b}", "name", e->d_name, "bytes",
                               (json_int_t)sb.st_size, "modified", (json_int_t)sb.st_mtime,
                               "loaded", adapter_loaded(app, e->d_name));
    }
    closedir(d);
    qsort(items, n, sizeof(items[0]), cmp_file_name);
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, items[i]);
    srv_respond_json(rs, 200, arr);
}

static const struct srv_field pick_fields[] = {
    {"name", SRV_JT_STRING, 0, 0, false},
    {"id", SRV_JT_INT, 0, 1 << 20, false},
    {"scale", SRV_JT_NUMBER, -100, 100, false},
};

/* {"name"} or {"id"}, exactly one. */
static int pick(const json_t *o, const char *where, const char **name, int *id)
{
    int st = srv_check_object(o, where, pick_fields, 3);
    if (st != 200)
        return st;
    *name = srv_json_str(o, "name", NULL);
    *id = (int)srv_json_int(o, "id", -1);
    if (!*name == (*id < 0))
        return srv_fail(400, *where ? where : "name", "invalid_value",
                        "give either the adapter's name or its id");
    return 200;
}

/* Sets scales: {"adapters":[{"name"|"id","scale"}]} or, as llama.cpp takes it, the bare
 * array. */
void srv_route_lora_scale(struct srv_app *app, const struct srv_request *rq,
                          struct srv_response *rs)
{
    json_t *body = NULL;
    json_error_t err;
    int st = 200;
    if (rq->body_too_large) {
        st = srv_fail(413, NULL, "body_too_large", "the request body is too large");
        goto out_error;
    }
    body = json_loadb(rq->body, rq->body_len, JSON_REJECT_DUPLICATES, &err);
    if (!body) {
        st = srv_fail(400, NULL, "invalid_json", "the body is not valid JSON: %s (line %d, "
                      "column %d)", err.text, err.line, err.column);
        goto out_error;
    }
    json_t *arr = body;
    const char *prefix = "";
    if (json_is_object(body)) {
        static const struct srv_field fields[] = {{"adapters", SRV_JT_ARRAY, 0, 0, true}};
        if ((st = srv_check_object(body, "", fields, 1)) != 200)
            goto out_error;
        arr = json_object_get(body, "adapters");
        prefix = "adapters";
    } else if (!json_is_array(body)) {
        st = srv_fail(400, NULL, "invalid_type", "the body must be an object or an array");
        goto out_error;
    }
    if (!srv_require_ready(app, rs))
        goto out_free;
    char where[64];
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *e = json_array_get(arr, i);
        snprintf(where, sizeof(where), "%s[%zu]", prefix, i);
        const char *name;
        int id;
        if ((st = pick(e, where, &name, &id)) != 200)
            goto out_error;
        if (!srv_json_get(e, "scale")) {
            char f[80];
            srv_field_name(f, sizeof(f), where, "scale");
            st = srv_fail(400, f, "missing_field", "'%s' is required", f);
            goto out_error;
        }
        st = app->engine->iface->lora_set_scale(app->engine, name, id,
                                                (float)srv_json_num(e, "scale", 1));
        if (st != 200)
            goto out_error;
    }
    respond_list(app, rs);
    goto out_free;

out_error:
    srv_respond_last_error(rs, st);
out_free:
    json_decref(body);
}

int srv_lora_load_named(struct srv_app *app, const char *name, float scale)
{
    char path[1024];
    int st = srv_path_in_dir(app->train_dir, name, ".gguf", "name", path, sizeof(path));
    if (st != 200)
        return st;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return srv_fail(404, "name", "file_not_found", "there is no adapter '%s' in the train dir",
                        name);
    return app->engine->iface->lora_load(app->engine, name, path, scale);
}

void srv_route_lora_load(struct srv_app *app, const struct srv_request *rq,
                         struct srv_response *rs)
{
    static const struct srv_field fields[] = {
        {"name", SRV_JT_STRING, 0, 0, true},
        {"scale", SRV_JT_NUMBER, -100, 100, false},
    };
    json_t *body = NULL;
    char path[1024];
    int st = srv_parse_body(rq, &body);
    if (st == 200)
        st = srv_check_object(body, "", fields, 2);
    const char *name = st == 200 ? srv_json_str(body, "name", "") : "";
    if (st == 200) /* the name's shape before readiness, as before */
        st = srv_path_in_dir(app->train_dir, name, ".gguf", "name", path, sizeof(path));
    if (st != 200)
        goto out_error;
    if (!srv_require_ready(app, rs))
        goto out_free;
    st = srv_lora_load_named(app, name, (float)srv_json_num(body, "scale", 1.0));
    if (st != 200)
        goto out_error;
    respond_list(app, rs);
    goto out_free;

out_error:
    srv_respond_last_error(rs, st);
out_free:
    json_decref(body);
}

void srv_route_lora_unload(struct srv_app *app, const struct srv_request *rq,
                           struct srv_response *rs)
{
    json_t *body = NULL;
    const char *name = NULL;
    char by_id[SRV_NAME_MAX] = "";
    int id = -1;
    int st = srv_parse_body(rq, &body);
    if (st == 200)
        st = pick(body, "", &name, &id);
    if (st != 200)
        goto out_error;
    if (!srv_require_ready(app, rs))
        goto out_free;
    if (!name) {
        /* by id: find its name */
        struct srv_lora_info *list = NULL;
        int n = 0;
        app->engine->iface->lora_list(app->engine, &list, &n);
        for (int i = 0; i < n; i++)
            if (list[i].id == id)
                snprintf(by_id, sizeof(by_id), "%s", list[i].name);
        free(list);
        if (!by_id[0]) {
            st = srv_fail(404, "id", "not_found", "no adapter has id %d", id);
            goto out_error;
        }
        name = by_id;
    }
    if ((st = app->engine->iface->lora_unload(app->engine, name)) != 200)
        goto out_error;
    respond_list(app, rs);
    goto out_free;

out_error:
    srv_respond_last_error(rs, st);
out_free:
    json_decref(body);
}

/* ---- model ids: the base model, adapters by name, fine-tuned models ---- */

/* name is the base model: its id (the alias), or its file's name, with or without .gguf,
 * or its path. */
static bool is_base_model(struct srv_app *app, const char *name)
{
    struct srv_model_info mi;
    app->engine->iface->info(app->engine, &mi);
    if (!strcmp(name, mi.id))
        return true;
    const char *path = app->model_path;
    if (!path)
        return false;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (!strcmp(name, path) || !strcmp(name, base))
        return true;
    return n > 5 && !strcmp(base + n - 5, ".gguf") && strlen(name) == n - 5 &&
           !strncmp(name, base, n - 5);
}

/* Finished jobs' fine_tuned_model names (their adapter files), up to max. */
static int finished_models(struct srv_app *app, char (*names)[SRV_NAME_MAX], int max)
{
    char(*ids)[48] = calloc(256, sizeof(*ids));
    struct srv_train_info *ti = malloc(sizeof(*ti));
    int n_ids = 0, n = 0;
    if (ids && ti && app->engine->iface->train_list &&
        app->engine->iface->train_list(app->engine, ids, 256, &n_ids) == 200) {
        for (int i = 0; i < n_ids && n < max; i++) {
            if (app->engine->iface->train_info(app->engine, ids[i], ti) != 200 ||
                ti->state != LT_TRAIN_DONE || !ti->meta.out_name[0])
                continue;
            bool dup = false;
            for (int k = 0; k < n && !dup; k++)
                dup = !strcmp(names[k], ti->meta.out_name);
            if (!dup)
                snprintf(names[n++], SRV_NAME_MAX, "%s", ti->meta.out_name);
        }
    }
    free(ids);
    free(ti);
    return n;
}

static bool adapter_loaded(struct srv_app *app, const char *name)
{
    struct srv_lora_info *list = NULL;
    int n = 0;
    bool found = false;
    if (app->engine->iface->lora_list(app->engine, &list, &n) == 200)
        for (int i = 0; i < n && !found; i++)
            found = !strcmp(list[i].name, name);
    free(list);
    return found;
}

/* The body with the adapter `name` added to its choice of adapters. */
static int body_with_adapter(json_t *body, const char *name, char **out, size_t *len)
{
    json_t *lora = json_object_get(body, "lora");
    json_t *pick = json_pack("{s:s,s:f}", "name", name, "scale", 1.0);
    json_t *arr = NULL;
    if (!lora) {
        arr = json_array();
    } else if (json_is_string(lora)) {
        arr = json_array();
        if (strcmp(json_string_value(lora), name) != 0)
            json_array_append_new(arr, json_pack("{s:O,s:f}", "name", lora, "scale", 1.0));
    } else if (json_is_array(lora)) {
        arr = json_deep_copy(lora);
        for (size_t i = 0; arr && i < json_array_size(arr); i++) {
            const char *ln = srv_json_str(json_array_get(arr, i), "name", NULL);
            if (ln && !strcmp(ln, name)) { /* chosen already, with its own scale */
                json_decref(pick);
                pick = NULL;
                break;
            }
        }
    } else { /* a wrong type: the route names it */
        json_decref(pick);
        *out = NULL;
        return 200;
    }
    if (!arr) {
        json_decref(pick);
        return srv_fail(503, NULL, NULL, "out of memory");
    }
    if (pick)
        json_array_append_new(arr, pick);
    json_object_set_new(body, "lora", arr);
    *out = json_dumps(body, JSON_COMPACT);
    if (!*out)
        return srv_fail(503, NULL, NULL, "out of memory");
    *len = strlen(*out);
    return 200;
}

int srv_model_resolve(struct srv_app *app, const struct srv_request *rq, char **body_out,
                      size_t *len_out)
{
    *body_out = NULL;
    *len_out = 0;
    if (rq->body_too_large || !rq->body_len)
        return 200;
    json_t *body = json_loadb(rq->body, rq->body_len, JSON_REJECT_DUPLICATES, NULL);
    json_t *model = json_is_object(body) ? json_object_get(body, "model") : NULL;
    char state_why[8];
    if (!json_is_string(model) ||
        app->engine->iface->state(app->engine, state_why, sizeof(state_why)) != SRV_STATE_READY) {
        json_decref(body);
        return 200; /* the route names what is wrong */
    }
    const char *name = json_string_value(model);
    int st = 200;
    if (!*name || is_base_model(app, name)) /* "": as if absent */
        goto out;
    bool found = adapter_loaded(app, name);
    if (!found && app->train_dir) {
        char(*done)[SRV_NAME_MAX] = calloc(256, sizeof(*done));
        int n = done ? finished_models(app, done, 256) : 0;
        for (int i = 0; i < n && !found; i++)
            found = !strcmp(done[i], name);
        free(done);
        if (found) {
            /* its first use: load it as /lora-adapters/load would, but off (scale 0) for
             * every request that does not name it; one loader at a time */
            pthread_mutex_lock(&app->model_mu);
            if (!adapter_loaded(app, name))
                st = srv_lora_load_named(app, name, 0.0f);
            pthread_mutex_unlock(&app->model_mu);
            if (st != 200) {
                char why[400];
                snprintf(why, sizeof(why), "%s", lt_last_error());
                st = srv_fail(st, "model", "model_not_loaded",
                              "the fine-tuned model '%.100s' could not be loaded: %s", name, why);
                goto out;
            }
        }
    }
    if (found) {
        st = body_with_adapter(body, name, body_out, len_out);
        goto out;
    }
    if (app->any_model_id)
        goto out;
    st = srv_fail(404, "model", "model_not_found",
                  "The model '%.100s' does not exist: this server has its base model, the "
                  "adapters loaded under a name and the fine-tuned models (GET /v1/models)",
                  name);
out:
    json_decref(body);
    return st;
}

void srv_models_adapters(struct srv_app *app, json_t *data)
{
    struct srv_model_info mi;
    app->engine->iface->info(app->engine, &mi);
    char why[8];
    if (app->engine->iface->state(app->engine, why, sizeof(why)) != SRV_STATE_READY)
        return;
    struct srv_lora_info *list = NULL;
    int n = 0;
    if (app->engine->iface->lora_list(app->engine, &list, &n) != 200)
        n = 0;
    long long now = (long long)srv_now_unix();
    for (int i = 0; i < n; i++)
        json_array_append_new(
            data, json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:{s:s,s:i,s:f,s:i}}", "id", list[i].name,
                            "object", "model", "created", (json_int_t)now, "owned_by", "lathe",
                            "parent", mi.id, "root", mi.id, "meta", "kind", "lora", "lora_id",
                            list[i].id, "scale", (double)list[i].scale, "rank", list[i].rank));
    char(*done)[SRV_NAME_MAX] = app->train_dir ? calloc(256, sizeof(*done)) : NULL;
    int n_done = done ? finished_models(app, done, 256) : 0;
    for (int k = 0; k < n_done; k++) {
        bool listed = false;
        for (int i = 0; i < n && !listed; i++)
            listed = !strcmp(list[i].name, done[k]);
        if (!listed)
            json_array_append_new(
                data, json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:{s:s}}", "id", done[k], "object",
                                "model", "created", (json_int_t)now, "owned_by", "lathe",
                                "parent", mi.id, "root", mi.id, "meta", "kind", "fine_tune"));
    }
    free(done);
    free(list);
}

#endif
