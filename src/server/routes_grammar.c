/* routes_grammar.c: constrained output's request fields, read once for every completion
 * route: OpenAI's response_format ({"type": "text"}, {"type": "json_object"} or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}),
 * and llama.cpp's `grammar` (GBNF text) and `json_schema` (a schema). llama.cpp's own
 * {"type": "json_object", "schema": {...}} is read as json_schema. At most one may ask for
 * a grammar. The grammar is compiled here, before anything is queued, so a bad one is a
 * 400 naming what is wrong, and the engine only ever sees a valid one. `strict` changes
 * nothing: the output always follows the schema. */
#ifdef LATHE_HAVE_JANSSON
#include <string.h>

#include "lathe/grammar.h"
#include "server/json_check.h"
#include "server/json_schema.h"
#include "server/routes.h"

/* The GBNF response_format asks for, into gb; *none when it asks for none (text). */
static int response_format_gbnf(const json_t *rf, struct lt_strbuf *gb, bool *none)
{
    static const struct srv_field rf_fields[] = {
        {"type", SRV_JT_STRING, 0, 0, true},
        {"json_schema", SRV_JT_OBJECT, 0, 0, false},
        {"schema", SRV_JT_OBJECT | SRV_JT_BOOL, 0, 0, false}, /* llama.cpp's json_object */
    };
    static const struct srv_field js_fields[] = {
        {"name", SRV_JT_STRING, 0, 0, false},
        {"description", SRV_JT_STRING, 0, 0, false},
        {"schema", SRV_JT_OBJECT | SRV_JT_BOOL, 0, 0, false},
        {"strict", SRV_JT_BOOL, 0, 0, false},
    };
    int st = srv_check_object(rf, "response_format", rf_fields, 3);
    if (st != 200)
        return st;
    const char *type = srv_json_str(rf, "type", "");
    json_t *schema = srv_json_get(rf, "schema");
    *none = false;
    if (!strcmp(type, "text")) {
        *none = true;
        return 200;
    }
    lt_status ls;
    if (!strcmp(type, "json_object")) {
        ls = schema ? srv_json_schema_gbnf(schema, gb) : srv_json_object_gbnf(gb);
    } else if (!strcmp(type, "json_schema")) {
        json_t *js = srv_json_get(rf, "json_schema");
        if (!js)
            return srv_fail(400, "response_format.json_schema", "missing_field",
                            "response_format of type json_schema needs 'json_schema'");
        if ((st = srv_check_object(js, "response_format.json_schema", js_fields, 4)) != 200)
            return st;
        schema = srv_json_get(js, "schema");
        ls = schema ? srv_json_schema_gbnf(schema, gb) : srv_json_object_gbnf(gb);
    } else {
        return srv_fail(400, "response_format.type", "invalid_value",
                        "response_format's type is '%s'; it must be text, json_object or "
                        "json_schema",
                        type);
    }
    if (ls != LT_OK)
        return srv_fail(srv_http_status_of(ls) == 503 ? 503 : 400, "response_format",
                        ls == LT_ERR_UNSUPPORTED ? "unsupported_schema" : "invalid_schema", "%s",
                        lt_last_error());
    return 200;
}

int srv_read_grammar(const json_t *body, struct lt_grammar **out)
{
    *out = NULL;
    json_t *text = srv_json_get(body, "grammar"), *schema = srv_json_get(body, "json_schema");
    json_t *rf = srv_json_get(body, "response_format");
    if (text && json_string_length(text) == 0)
        text = NULL; /* llama.cpp's clients send "" for none */
    struct lt_strbuf gb = {0};
    bool none = true;
    int st = 200;
    if (rf && (st = response_format_gbnf(rf, &gb, &none)) != 200)
        goto out_free;
    const char *param = !none ? "response_format" : schema ? "json_schema" : "grammar";
    if ((!none) + (schema != NULL) + (text != NULL) > 1) {
        st = srv_fail(400, param, "invalid_value",
                      "ask for one grammar: 'grammar', 'json_schema' or 'response_format', "
                      "not several");
        goto out_free;
    }
    if (schema) {
        lt_status ls = srv_json_schema_gbnf(schema, &gb);
        if (ls != LT_OK) {
            st = srv_fail(srv_http_status_of(ls) == 503 ? 503 : 400, "json_schema",
                          ls == LT_ERR_UNSUPPORTED ? "unsupported_schema" : "invalid_schema", "%s",
                          lt_last_error());
            goto out_free;
        }
    } else if (text) {
        if (lt_strbuf_append(&gb, json_string_value(text), json_string_length(text)) != LT_OK) {
            st = srv_fail(503, NULL, NULL, "out of memory for the grammar");
            goto out_free;
        }
    } else if (none) {
        goto out_free;
    }
    lt_status ls = lt_grammar_parse(gb.data, gb.len, out);
    if (ls != LT_OK)
        st = srv_fail(ls == LT_ERR_NOMEM ? 503 : 400, param,
                      text ? "invalid_grammar" : "invalid_schema", "%s", lt_last_error());
out_free:
    lt_strbuf_free(&gb);
    return st;
}
#endif
