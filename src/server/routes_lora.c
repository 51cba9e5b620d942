/* routes_lora.c: LoRA adapters: GET /lora-adapters, POST /lora-adapters (scales),
 * /lora-adapters/load and /lora-adapters/unload.
 *
 * An adapter is loaded by name from the train dir only (so a finished /train job's output
 * can be served without a restart, and nothing else on the machine can be read). A loaded
 * adapter applies, at its scale, to every request that does not choose its own with the
 * per-request "lora" field; scale 0 keeps it loaded but off. */
#ifdef LATHE_HAVE_JANSSON
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
    if (st == 200)
        st = srv_path_in_dir(app->train_dir, name, ".gguf", "name", path, sizeof(path));
    if (st != 200)
        goto out_error;
    if (!srv_require_ready(app, rs))
        goto out_free;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = srv_fail(404, "name", "file_not_found", "there is no adapter '%s' in the train dir",
                      name);
        goto out_error;
    }
    st = app->engine->iface->lora_load(app->engine, name, path,
                                       (float)srv_json_num(body, "scale", 1.0));
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

#endif
