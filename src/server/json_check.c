/* json_check.c: parsing request bodies and checking their fields against a table.
 *
 * Unknown fields are refused rather than ignored: a misspelt "temprature" must not silently
 * mean the default. null is treated as absent, as OpenAI's clients send it for unset
 * options. */
#ifdef LATHE_HAVE_JANSSON
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "server/json_check.h"

void srv_field_name(char *buf, size_t size, const char *where, const char *key)
{
    if (where && *where)
        snprintf(buf, size, "%s.%s", where, key);
    else
        snprintf(buf, size, "%s", key);
}

int srv_parse_body(const struct srv_request *rq, json_t **out)
{
    *out = NULL;
    if (rq->body_too_large)
        return srv_fail(413, NULL, "body_too_large",
                        "the request body is larger than the server accepts");
    size_t i = 0;
    while (i < rq->body_len && strchr(" \t\r\n", rq->body[i]))
        i++;
    if (i == rq->body_len)
        return srv_fail(400, NULL, "missing_body", "this route needs a JSON object as its body");
    json_error_t err;
    json_t *root = json_loadb(rq->body, rq->body_len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return srv_fail(400, NULL, "invalid_json",
                        "the body is not valid JSON: %s (line %d, column %d)", err.text,
                        err.line, err.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return srv_fail(400, NULL, "invalid_type", "the body must be a JSON object");
    }
    *out = root;
    return 200;
}

static const char *type_names(unsigned types, char *buf, size_t size)
{
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {
        {SRV_JT_STRING, "a string"}, {SRV_JT_INT, "an integer"}, {SRV_JT_NUMBER, "a number"},
        {SRV_JT_BOOL, "a boolean"},  {SRV_JT_ARRAY, "an array"}, {SRV_JT_OBJECT, "an object"},
    };
    size_t len = 0;
    int k = 0, total = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        total += (types & names[i].bit) != 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && len < size; i++) {
        if (!(types & names[i].bit))
            continue;
        const char *sep = k == 0 ? "" : k == total - 1 ? " or " : ", ";
        int w = snprintf(buf + len, size - len, "%s%s", sep, names[i].name);
        len += w > 0 ? (size_t)w : 0;
        k++;
    }
    return buf;
}

static bool is_integral(const json_t *v)
{
    if (json_is_integer(v))
        return true;
    if (!json_is_real(v))
        return false;
    double x = json_real_value(v);
    return x == floor(x) && fabs(x) < 9.0e15;
}

double srv_json_value_num(const json_t *v)
{
    return json_is_integer(v) ? (double)json_integer_value(v) : json_real_value(v);
}

int srv_check_value(const json_t *v, const char *name, unsigned types, double min, double max)
{
    bool ok = (types & SRV_JT_STRING && json_is_string(v)) ||
              (types & SRV_JT_INT && is_integral(v)) ||
              (types & SRV_JT_NUMBER && json_is_number(v)) ||
              (types & SRV_JT_BOOL && json_is_boolean(v)) ||
              (types & SRV_JT_ARRAY && json_is_array(v)) ||
              (types & SRV_JT_OBJECT && json_is_object(v)) ||
              (types & SRV_JT_NULL && json_is_null(v));
    if (!ok) {
        char tn[96];
        return srv_fail(400, name, "invalid_type", "'%s' must be %s", name,
                        type_names(types, tn, sizeof(tn)));
    }
    if ((min != 0 || max != 0) && json_is_number(v)) {
        double x = srv_json_value_num(v);
        if (!(x >= min && x <= max)) {
            if (types & SRV_JT_INT && !(types & SRV_JT_NUMBER))
                return srv_fail(400, name, "out_of_range", "'%s' must be %.0f..%.0f, not %g",
                                name, min, max, x);
            return srv_fail(400, name, "out_of_range", "'%s' must be in [%g, %g], not %g", name,
                            min, max, x);
        }
    }
    return 200;
}

int srv_check_object(const json_t *obj, const char *where, const struct srv_field *fields,
                     size_t n)
{
    char name[160];
    if (!json_is_object(obj))
        return srv_fail(400, where && *where ? where : NULL, "invalid_type",
                        "'%s' must be an object", where && *where ? where : "the body");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        size_t i = 0;
        while (i < n && strcmp(fields[i].name, key) != 0)
            i++;
        srv_field_name(name, sizeof(name), where, key);
        if (i == n)
            return srv_fail(400, name, "unknown_field", "unknown field '%s'", name);
        if (json_is_null(v))
            continue;
        int st = srv_check_value(v, name, fields[i].types, fields[i].min, fields[i].max);
        if (st != 200)
            return st;
    }
    for (size_t i = 0; i < n; i++) {
        if (!fields[i].required)
            continue;
        json_t *v = json_object_get(obj, fields[i].name);
        if (!v || json_is_null(v)) {
            srv_field_name(name, sizeof(name), where, fields[i].name);
            return srv_fail(400, name, "missing_field", "'%s' is required", name);
        }
    }
    return 200;
}

json_t *srv_json_get(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

const char *srv_json_str(const json_t *obj, const char *key, const char *dflt)
{
    json_t *v = srv_json_get(obj, key);
    return v && json_is_string(v) ? json_string_value(v) : dflt;
}

double srv_json_num(const json_t *obj, const char *key, double dflt)
{
    json_t *v = srv_json_get(obj, key);
    return v && json_is_number(v) ? srv_json_value_num(v) : dflt;
}

long long srv_json_int(const json_t *obj, const char *key, long long dflt)
{
    json_t *v = srv_json_get(obj, key);
    if (!v || !json_is_number(v))
        return dflt;
    return json_is_integer(v) ? json_integer_value(v) : (long long)json_real_value(v);
}

bool srv_json_bool(const json_t *obj, const char *key, bool dflt)
{
    json_t *v = srv_json_get(obj, key);
    return v && json_is_boolean(v) ? json_is_true(v) : dflt;
}

#endif
