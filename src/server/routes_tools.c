/* routes_tools.c: tools in chat completions (issue 18 item 1): reading `tools`,
 * `tool_choice` and the history's tool calls, and shaping the calls a model made into the
 * response's `tool_calls`.
 *
 * The tools reach the model through its chat template (lt_chat_render; the formats are in
 * tokenizer.h). `tool_choice`:
 *   "auto" (the default with tools): tools rendered, the output read for calls;
 *   "none": the tools are not rendered and the output is not read: a plain answer;
 *   "required": the assistant's turn is prefilled with the start of a call, so the model
 *     can only continue one; with a single tool the prefill names it;
 *   {"type": "function", "function": {"name": N}}: prefilled with the call of N.
 * lathe has no constrained decoding here: a forced call's arguments are what the model
 * writes, and output whose blocks do not parse (or name no given tool) is returned as
 * content, prefill included, with finish_reason "stop". */
#ifdef LATHE_HAVE_JANSSON
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_check.h"
#include "server/routes.h"

void srv_tools_free(struct srv_tools *t)
{
    free(t->tools);
    free(t->prefill);
    memset(t, 0, sizeof(*t));
}

/* tools[i]: {"type": "function", "function": {"name", "description"?, "parameters"?,
 * "strict"?}}. */
static int check_tool(const json_t *tool, size_t i)
{
    static const struct srv_field tool_fields[] = {
        {"type", SRV_JT_STRING, 0, 0, true},
        {"function", SRV_JT_OBJECT, 0, 0, true},
    };
    static const struct srv_field fn_fields[] = {
        {"name", SRV_JT_STRING, 0, 0, true},
        {"description", SRV_JT_STRING, 0, 0, false},
        {"parameters", SRV_JT_OBJECT, 0, 0, false},
        {"strict", SRV_JT_BOOL, 0, 0, false},
    };
    char where[64], name[96];
    snprintf(where, sizeof(where), "tools[%zu]", i);
    int st = srv_check_object(tool, where, tool_fields, 2);
    if (st != 200)
        return st;
    if (strcmp(srv_json_str(tool, "type", ""), "function")) {
        snprintf(name, sizeof(name), "%s.type", where);
        return srv_fail(400, name, "invalid_value", "'%s' must be \"function\"", name);
    }
    snprintf(where, sizeof(where), "tools[%zu].function", i);
    json_t *fn = json_object_get(tool, "function");
    if ((st = srv_check_object(fn, where, fn_fields, 4)) != 200)
        return st;
    if (json_string_length(json_object_get(fn, "name")) == 0) {
        snprintf(name, sizeof(name), "%s.name", where);
        return srv_fail(400, name, "invalid_value", "'%s' must not be empty", name);
    }
    return 200;
}

static bool has_tool(const json_t *tools, const char *name)
{
    for (size_t i = 0; i < json_array_size(tools); i++)
        if (!strcmp(srv_json_str(json_object_get(json_array_get(tools, i), "function"), "name", ""),
                    name))
            return true;
    return false;
}

enum srv_tool_choice {
    SRV_TOOL_CHOICE_AUTO,
    SRV_TOOL_CHOICE_NONE,
    SRV_TOOL_CHOICE_REQUIRED,
    SRV_TOOL_CHOICE_FUNCTION, /* a named function */
};

/* tool_choice into *mode, and the function's name for SRV_TOOL_CHOICE_FUNCTION. */
static int read_choice(const json_t *body, const json_t *tools, enum srv_tool_choice *mode,
                       const char **name)
{
    json_t *tc = srv_json_get(body, "tool_choice");
    *mode = SRV_TOOL_CHOICE_AUTO;
    *name = NULL;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (strcmp(s, "auto") && strcmp(s, "none") && strcmp(s, "required"))
            return srv_fail(400, "tool_choice", "invalid_value",
                            "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}, not '%.40s'",
                            s);
        *mode = s[0] == 'a'   ? SRV_TOOL_CHOICE_AUTO
                : s[0] == 'n' ? SRV_TOOL_CHOICE_NONE
                              : SRV_TOOL_CHOICE_REQUIRED;
    } else if (tc) {
        static const struct srv_field fields[] = {
            {"type", SRV_JT_STRING, 0, 0, true},
            {"function", SRV_JT_OBJECT, 0, 0, true},
        };
        static const struct srv_field fn_fields[] = {{"name", SRV_JT_STRING, 0, 0, true}};
        int st = srv_check_object(tc, "tool_choice", fields, 2);
        if (st == 200)
            st = srv_check_object(json_object_get(tc, "function"), "tool_choice.function",
                                  fn_fields, 1);
        if (st != 200)
            return st;
        *mode = SRV_TOOL_CHOICE_FUNCTION;
        *name = srv_json_str(json_object_get(tc, "function"), "name", "");
        if (!has_tool(tools, *name))
            return srv_fail(400, "tool_choice.function.name", "invalid_value",
                            "'tool_choice.function.name' is '%.60s', which is not among 'tools'",
                            *name);
    }
    if (*mode >= SRV_TOOL_CHOICE_REQUIRED && json_array_size(tools) == 0)
        return srv_fail(400, "tool_choice", "invalid_value",
                        "'tool_choice' asks for a tool call, but the request has no 'tools'");
    return 200;
}

int srv_tools_read(const json_t *body, enum lt_chat_kind kind, struct srv_tools *out)
{
    memset(out, 0, sizeof(*out));
    json_t *tools = srv_json_get(body, "tools");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        int st = check_tool(json_array_get(tools, i), i);
        if (st != 200)
            return st;
    }
    enum srv_tool_choice mode;
    const char *name;
    int st = read_choice(body, tools, &mode, &name);
    if (st != 200 || json_array_size(tools) == 0 || mode == SRV_TOOL_CHOICE_NONE)
        return st;
    if (mode == SRV_TOOL_CHOICE_REQUIRED && json_array_size(tools) == 1) {
        mode = SRV_TOOL_CHOICE_FUNCTION;
        name = srv_json_str(json_object_get(json_array_get(tools, 0), "function"), "name", "");
    }
    out->parse = true;
    out->tools = json_dumps(tools, JSON_COMPACT);
    struct lt_strbuf pre = {0};
    if (out->tools && mode != SRV_TOOL_CHOICE_AUTO &&
        (lt_chat_tool_prefill(kind, mode == SRV_TOOL_CHOICE_FUNCTION ? name : NULL, &pre) !=
             LT_OK ||
         lt_strbuf_append(&pre, "", 0) != LT_OK)) {
        lt_strbuf_free(&pre);
        srv_tools_free(out);
        return srv_fail(503, "tools", NULL, "out of memory");
    }
    out->prefill = pre.data;
    if (!out->tools) {
        srv_tools_free(out);
        return srv_fail(503, "tools", NULL, "out of memory");
    }
    return 200;
}

/* messages[i].tool_calls[j]: {"id"?, "type"?: "function", "function": {"name", "arguments"}},
 * arguments the JSON text of an object (OpenAI's form) or an object. */
static int check_call(const json_t *call, const char *where)
{
    static const struct srv_field fields[] = {
        {"id", SRV_JT_STRING, 0, 0, false},
        {"type", SRV_JT_STRING, 0, 0, false},
        {"function", SRV_JT_OBJECT, 0, 0, true},
        {"index", SRV_JT_INT, 0, 1 << 20, false},
    };
    static const struct srv_field fn_fields[] = {
        {"name", SRV_JT_STRING, 0, 0, true},
        {"arguments", SRV_JT_STRING | SRV_JT_OBJECT, 0, 0, true},
    };
    char name[128];
    int st = srv_check_object(call, where, fields, 4);
    if (st != 200)
        return st;
    snprintf(name, sizeof(name), "%s.function", where);
    json_t *fn = json_object_get(call, "function");
    if ((st = srv_check_object(fn, name, fn_fields, 2)) != 200)
        return st;
    json_t *args = json_object_get(fn, "arguments");
    json_t *parsed = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL) : NULL;
    bool ok = json_is_object(args) || json_is_object(parsed);
    json_decref(parsed);
    if (!ok) {
        snprintf(name, sizeof(name), "%s.function.arguments", where);
        return srv_fail(400, name, "invalid_value", "'%s' must be the JSON text of an object",
                        name);
    }
    return 200;
}

int srv_message_tool_calls(const json_t *m, const char *where, char **out)
{
    *out = NULL;
    json_t *calls = srv_json_get(m, "tool_calls");
    if (json_array_size(calls) == 0)
        return 200;
    char name[96];
    if (strcmp(srv_json_str(m, "role", ""), "assistant")) {
        snprintf(name, sizeof(name), "%s.tool_calls", where);
        return srv_fail(400, name, "invalid_value", "only assistant messages carry '%s'", name);
    }
    for (size_t j = 0; j < json_array_size(calls); j++) {
        snprintf(name, sizeof(name), "%s.tool_calls[%zu]", where, j);
        int st = check_call(json_array_get(calls, j), name);
        if (st != 200)
            return st;
    }
    *out = json_dumps(calls, JSON_COMPACT);
    return *out ? 200 : srv_fail(503, where, NULL, "out of memory");
}

static json_t *calls_json(const struct lt_chat_tool_output *o, uint64_t (*random)(void),
                          bool with_index)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < o->n_calls; i++) {
        char id[32];
        snprintf(id, sizeof(id), "call_%016llx", (unsigned long long)random());
        json_t *call = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function",
                                 "name", o->calls[i].name, "arguments", o->calls[i].arguments);
        if (call && with_index)
            json_object_set_new(call, "index", json_integer((json_int_t)i));
        json_array_append_new(arr, call);
    }
    return arr;
}

/* The parsed output of prefill + text (the prefill only when with_prefill). */
static int parse_output(const struct srv_tools *t, enum lt_chat_kind kind, bool with_prefill,
                        const char *text, size_t len, struct lt_chat_tool_output *o)
{
    struct lt_strbuf all = {0};
    lt_status ls = LT_OK;
    if (with_prefill && t->prefill)
        ls = lt_strbuf_append(&all, t->prefill, strlen(t->prefill));
    if (!ls)
        ls = lt_strbuf_append(&all, text ? text : "", len);
    if (!ls)
        ls = lt_chat_tool_parse(kind, t->tools, all.data, all.len, o);
    lt_strbuf_free(&all);
    return ls == LT_OK ? 200 : srv_fail(503, NULL, NULL, "%s", lt_last_error());
}

json_t *srv_tool_message(const struct srv_tools *t, enum lt_chat_kind kind, const char *text,
                         size_t len, uint64_t (*random)(void), bool *called)
{
    struct lt_chat_tool_output o;
    *called = false;
    if (parse_output(t, kind, true, text, len, &o) != 200)
        return NULL;
    json_t *content = o.content ? srv_json_text(o.content, strlen(o.content)) : json_null();
    json_t *msg = json_pack("{s:s,s:o}", "role", "assistant", "content", content);
    if (msg && o.n_calls) {
        json_object_set_new(msg, "tool_calls", calls_json(&o, random, false));
        *called = true;
    }
    lt_chat_tool_output_free(&o);
    return msg;
}

json_t *srv_tool_deltas(const struct srv_tools *t, enum lt_chat_kind kind, bool with_prefill,
                        const char *text, size_t len, uint64_t (*random)(void), bool *called)
{
    struct lt_chat_tool_output o;
    *called = false;
    json_t *out = json_array();
    if (!out || parse_output(t, kind, with_prefill, text, len, &o) != 200)
        return out;
    if (o.content && *o.content)
        json_array_append_new(
            out, json_pack("{s:o}", "content", srv_json_text(o.content, strlen(o.content))));
    if (o.n_calls) {
        json_array_append_new(out, json_pack("{s:o}", "tool_calls", calls_json(&o, random, true)));
        *called = true;
    }
    lt_chat_tool_output_free(&o);
    return out;
}

#endif
