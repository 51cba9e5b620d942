/* routes_chat.c: a chat request's messages into prompt tokens: each message checked (role,
 * content as a string or text parts, tool calls, reasoning), then rendered by the engine's
 * chat template with the request's tools (routes_tools.c) and chat_template_kwargs. Shared
 * by /v1/chat/completions (routes_complete.c) and /apply-template (routes_native.c). */
#ifdef LATHE_HAVE_JANSSON
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_check.h"
#include "server/routes.h"

#define MAX_MESSAGES 4096

static bool role_known(const char *r)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
        if (!strcmp(r, roles[i]))
            return true;
    return false;
}

/* The message's text: a string, or the "text" parts of an array, joined by newlines. */
static int message_content(const json_t *content, const char *where, char **out)
{
    *out = NULL;
    struct lt_strbuf b = {0};
    char name[64];
    snprintf(name, sizeof(name), "%s.content", where);
    if (!content) {
        *out = strdup("");
    } else if (json_is_string(content)) {
        *out = strdup(json_string_value(content));
    } else {
        static const struct srv_field part_fields[] = {
            {"type", SRV_JT_STRING, 0, 0, true},
            {"text", SRV_JT_STRING, 0, 0, true},
        };
        char pname[96];
        for (size_t i = 0; i < json_array_size(content); i++) {
            json_t *part = json_array_get(content, i);
            snprintf(pname, sizeof(pname), "%s[%zu]", name, i);
            int st = srv_check_object(part, pname, part_fields, 2);
            if (st == 200 && strcmp(srv_json_str(part, "type", ""), "text") != 0)
                st = srv_fail(400, pname, "unsupported", "only text content parts are supported");
            if (st != 200) {
                lt_strbuf_free(&b);
                return st;
            }
            if ((i > 0 && lt_strbuf_append(&b, "\n", 1) != LT_OK) ||
                lt_strbuf_append(&b, srv_json_str(part, "text", ""),
                                 json_string_length(json_object_get(part, "text"))) != LT_OK) {
                lt_strbuf_free(&b);
                return srv_fail(503, name, NULL, "out of memory");
            }
        }
        *out = b.data ? b.data : strdup("");
        if (b.data)
            return 200;
    }
    return *out ? 200 : srv_fail(503, name, NULL, "out of memory");
}

int srv_chat_prompt_tools(struct srv_app *app, const json_t *body, const struct srv_tools *tools,
                          struct lt_tokens *out)
{
    static const struct srv_field msg_fields[] = {
        {"role", SRV_JT_STRING, 0, 0, true},
        {"content", SRV_JT_STRING | SRV_JT_ARRAY | SRV_JT_NULL, 0, 0, false},
        {"name", SRV_JT_STRING, 0, 0, false},
        {"reasoning_content", SRV_JT_STRING, 0, 0, false},
        {"tool_calls", SRV_JT_ARRAY, 0, 0, false},
        {"tool_call_id", SRV_JT_STRING, 0, 0, false},
    };
    json_t *msgs = json_object_get(body, "messages");
    size_t n = json_array_size(msgs);
    if (n == 0)
        return srv_fail(400, "messages", "invalid_value", "'messages' must not be empty");
    if (n > MAX_MESSAGES)
        return srv_fail(400, "messages", "out_of_range", "at most %d messages", MAX_MESSAGES);
    bool thinking = false;
    json_t *kw = srv_json_get(body, "chat_template_kwargs");
    if (kw) {
        static const struct srv_field kw_fields[] = {{"enable_thinking", SRV_JT_BOOL, 0, 0, false}};
        int st = srv_check_object(kw, "chat_template_kwargs", kw_fields, 1);
        if (st != 200)
            return st;
        thinking = srv_json_bool(kw, "enable_thinking", false);
    }
    struct lt_chat_message *cm = calloc(n, sizeof(*cm));
    char **contents = calloc(2 * n, sizeof(*contents)); /* contents, then tool_calls' JSON */
    int st = 200;
    if (!cm || !contents) {
        st = srv_fail(503, "messages", NULL, "out of memory for %zu messages", n);
        goto out_free;
    }
    char where[48];
    for (size_t i = 0; i < n && st == 200; i++) {
        json_t *m = json_array_get(msgs, i);
        snprintf(where, sizeof(where), "messages[%zu]", i);
        if ((st = srv_check_object(m, where, msg_fields, 6)) != 200)
            break;
        const char *role = srv_json_str(m, "role", "");
        if (!role_known(role)) {
            char rname[64];
            snprintf(rname, sizeof(rname), "%s.role", where);
            st = srv_fail(400, rname, "invalid_value",
                          "'%s' must be system, user, assistant, tool or developer, not '%.40s'",
                          rname, role);
            break;
        }
        if ((st = message_content(srv_json_get(m, "content"), where, &contents[i])) != 200 ||
            (st = srv_message_tool_calls(m, where, &contents[n + i])) != 200)
            break;
        cm[i].role = !strcmp(role, "developer") ? "system" : role;
        cm[i].content = contents[i];
        cm[i].reasoning = srv_json_str(m, "reasoning_content", NULL);
        cm[i].tool_calls = contents[n + i];
    }
    struct lt_chat_options opts = {.enable_thinking = thinking};
    if (tools) {
        opts.tools = tools->tools;
        opts.prefill = tools->prefill;
    }
    if (st == 200)
        st = app->engine->iface->prompt_chat(app->engine, cm, n, &opts, out);
out_free:
    for (size_t i = 0; contents && i < 2 * n; i++)
        free(contents[i]);
    free(contents);
    free(cm);
    return st;
}

int srv_chat_prompt(struct srv_app *app, const json_t *body, struct lt_tokens *out)
{
    struct srv_model_info mi;
    struct srv_tools tools;
    app->engine->iface->info(app->engine, &mi);
    int st = srv_tools_read(body, mi.chat_kind, &tools);
    if (st == 200)
        st = srv_chat_prompt_tools(app, body, &tools, out);
    srv_tools_free(&tools);
    return st;
}

#endif
