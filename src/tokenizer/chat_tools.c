/* chat_tools.c: tools in chat templates: the tools block of the system turn, an assistant's
 * tool calls in the history, the start of a forced call, and reading calls back out of a
 * model's output (see tokenizer.h for the two formats).
 *
 * Byte-for-byte parity with the Jinja templates rests on one detail: the JSON they embed is
 * Jinja's `tojson` as transformers defines it, Python's json.dumps(ensure_ascii=False)
 * (", " and ": " separators, keys in their given order, floats as Python's repr), which
 * py_json below reproduces; jansson's own writer differs in float digits and escapes.
 * jansson keeps an object's keys in insertion order, which is the request's order. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

#define TOOL_OPEN "<tool_call>"
#define TOOL_CLOSE "</tool_call>"

/* ---- Python's json.dumps ---- */

struct pyw {
    struct lt_strbuf *b;
    lt_status st;
};

static void pw(struct pyw *w, const char *s, size_t n)
{
    if (!w->st)
        w->st = lt_strbuf_append(w->b, s, n);
}

static void pws(struct pyw *w, const char *s)
{
    pw(w, s, strlen(s));
}

static void py_string(struct pyw *w, const char *s, size_t n)
{
    pws(w, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        pw(w, s + run, i - run);
        run = i + 1;
        char esc[8];
        const char *e = c == '"'    ? "\\\""
                        : c == '\\' ? "\\\\"
                        : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t"
                        : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f"
                                    : NULL;
        if (!e) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            e = esc;
        }
        pws(w, e);
    }
    pw(w, s + run, n - run);
    pws(w, "\"");
}

size_t lt_chat_tool_safe_len(const char *text, size_t len)
{
    static const char open[] = TOOL_OPEN;
    const size_t n = sizeof(open) - 1;
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '<')
            continue;
        size_t k = len - i < n ? len - i : n;
        if (!memcmp(text + i, open, k))
            return i;
    }
    return len;
}

lt_status lt_chat_tool_prefill(enum lt_chat_kind kind, const char *name, struct lt_strbuf *out)
{
    struct pyw w = {.b = out};
    if (kind == LT_CHAT_QWEN35) {
        pws(&w, TOOL_OPEN "\n<function=");
        if (name) {
            pws(&w, name);
            pws(&w, ">\n");
        }
    } else if (name) {
        pws(&w, TOOL_OPEN "\n{\"name\": ");
        py_string(&w, name, strlen(name));
        pws(&w, ", \"arguments\": ");
    } else {
        pws(&w, TOOL_OPEN "\n{\"name\": \"");
    }
    return w.st;
}

void lt_chat_tool_output_free(struct lt_chat_tool_output *o)
{
    for (size_t i = 0; o->calls && i < o->n_calls; i++) {
        free(o->calls[i].name);
        free(o->calls[i].arguments);
    }
    free(o->calls);
    free(o->content);
    memset(o, 0, sizeof(*o));
}

#ifdef LATHE_HAVE_JANSSON
#include <jansson.h>

/* Python's float repr: the shortest digits that read back, fixed notation for exponents
 * -4..15, else d.ddde+XX. */
static void py_real(struct pyw *w, double d)
{
    if (isnan(d) || isinf(d)) {
        pws(w, isnan(d) ? "NaN" : d > 0 ? "Infinity" : "-Infinity");
        return;
    }
    char e[40];
    for (int p = 0; p < 17; p++) {
        snprintf(e, sizeof(e), "%.*e", p, d);
        if (strtod(e, NULL) == d)
            break;
    }
    char digits[24];
    size_t nd = 0;
    const char *c = e + (e[0] == '-');
    for (; *c && *c != 'e'; c++)
        if (isdigit((unsigned char)*c))
            digits[nd++] = *c;
    int exp = atoi(c + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    char out[64];
    size_t o = 0;
    if (e[0] == '-')
        out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int z = -1; z > exp; z--)
                out[o++] = '0';
            memcpy(out + o, digits, nd);
            o += nd;
        } else {
            for (int i = 0; i <= exp; i++)
                out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nd) {
                memcpy(out + o, digits + exp + 1, nd - (size_t)exp - 1);
                o += nd - (size_t)exp - 1;
            } else {
                out[o++] = '0';
            }
        }
        pw(w, out, o);
        return;
    }
    out[o++] = digits[0];
    if (nd > 1) {
        out[o++] = '.';
        memcpy(out + o, digits + 1, nd - 1);
        o += nd - 1;
    }
    o += (size_t)snprintf(out + o, sizeof(out) - o, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
    pw(w, out, o);
}

static void py_json(struct pyw *w, const json_t *v)
{
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        bool first = true;
        pws(w, "{");
        json_object_foreach((json_t *)v, k, x)
        {
            if (!first)
                pws(w, ", ");
            first = false;
            py_string(w, k, strlen(k));
            pws(w, ": ");
            py_json(w, x);
        }
        pws(w, "}");
        break;
    }
    case JSON_ARRAY:
        pws(w, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i)
                pws(w, ", ");
            py_json(w, json_array_get(v, i));
        }
        pws(w, "]");
        break;
    case JSON_STRING: py_string(w, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER:
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        pws(w, num);
        break;
    case JSON_REAL: py_real(w, json_real_value(v)); break;
    case JSON_TRUE: pws(w, "true"); break;
    case JSON_FALSE: pws(w, "false"); break;
    case JSON_NULL: pws(w, "null"); break;
    }
}

/* Python's str() of a JSON scalar (Qwen3.5's `| string` of a parameter's value). */
static void py_str_scalar(struct pyw *w, const json_t *v)
{
    if (json_is_string(v))
        pw(w, json_string_value(v), json_string_length(v));
    else if (json_is_object(v) || json_is_array(v))
        py_json(w, v);
    else if (json_is_true(v) || json_is_false(v) || json_is_null(v))
        pws(w, json_is_true(v) ? "True" : json_is_false(v) ? "False" : "None");
    else if (json_is_real(v) && (isnan(json_real_value(v)) || isinf(json_real_value(v))))
        pws(w, isnan(json_real_value(v)) ? "nan" : json_real_value(v) > 0 ? "inf" : "-inf");
    else
        py_json(w, v);
}

/* ---- reading tools and calls ---- */

static json_t *load(const char *text, const char *what, lt_status *st)
{
    json_error_t jerr;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &jerr);
    if (!j)
        *st = lt_fail(LT_ERR_INVALID, "%s: not valid JSON (%s)", what, jerr.text);
    return j;
}

/* The function object of tools[i] or tool_calls[i] ({"function": {...}} or the bare
 * function), with a string name; NULL with the failure in *st. */
static json_t *function_of(json_t *item, const char *what, size_t i, lt_status *st)
{
    if (!json_is_object(item)) {
        *st = lt_fail(LT_ERR_INVALID, "%s[%zu]: must be an object", what, i);
        return NULL;
    }
    json_t *type = json_object_get(item, "type");
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "function"))) {
        *st = lt_fail(LT_ERR_INVALID, "%s[%zu].type: must be \"function\"", what, i);
        return NULL;
    }
    json_t *fn = json_object_get(item, "function");
    if (!fn)
        fn = item;
    if (!json_is_object(fn)) {
        *st = lt_fail(LT_ERR_INVALID, "%s[%zu].function: must be an object", what, i);
        return NULL;
    }
    json_t *name = json_object_get(fn, "name");
    if (!json_is_string(name) || json_string_length(name) == 0) {
        *st = lt_fail(LT_ERR_INVALID, "%s[%zu].function.name: must be a non-empty string", what, i);
        return NULL;
    }
    return fn;
}

static json_t *load_tools(const char *tools, lt_status *st)
{
    json_t *t = load(tools, "tools", st);
    if (t && !json_is_array(t)) {
        *st = lt_fail(LT_ERR_INVALID, "tools: must be an array");
        json_decref(t);
        return NULL;
    }
    for (size_t i = 0; t && i < json_array_size(t); i++) {
        json_t *fn = function_of(json_array_get(t, i), "tools", i, st);
        json_t *params = fn ? json_object_get(fn, "parameters") : NULL;
        if (fn && params && !json_is_object(params)) {
            *st = lt_fail(LT_ERR_INVALID, "tools[%zu].function.parameters: must be an object", i);
            fn = NULL;
        }
        if (!fn) {
            json_decref(t);
            return NULL;
        }
    }
    return t;
}

lt_status lt_chat_tools_check(const char *tools)
{
    lt_status st = LT_OK;
    json_decref(load_tools(tools, &st));
    return st;
}

/* A call's arguments as an object: an object, or the JSON text of one. */
static json_t *call_arguments(json_t *fn, size_t i, lt_status *st)
{
    json_t *a = json_object_get(fn, "arguments");
    if (json_is_object(a))
        return json_incref(a);
    json_t *parsed = json_is_string(a) ? json_loads(json_string_value(a), 0, NULL) : NULL;
    if (!json_is_object(parsed)) {
        json_decref(parsed);
        *st = lt_fail(LT_ERR_INVALID,
                      "tool_calls[%zu].function.arguments: must be a JSON object or the JSON "
                      "text of one",
                      i);
        return NULL;
    }
    return parsed;
}

/* ---- rendering ---- */

static const char qwen35_rules[] =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"
    "\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the "
    "second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>"
    "\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is "
    "no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>";

static const char qwen25_rules[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Jinja's trim: s[*b..*e) without surrounding whitespace. */
static void trim(const char *s, size_t *b, size_t *e)
{
    while (*b < *e && is_space(s[*b]))
        (*b)++;
    while (*e > *b && is_space(s[*e - 1]))
        (*e)--;
}

lt_status tok_chat_tools_system(enum lt_chat_kind kind, const char *tools, const char *system,
                                struct lt_strbuf *out)
{
    lt_status st = LT_OK;
    json_t *t = load_tools(tools, &st);
    if (!t)
        return st;
    struct pyw w = {.b = out};
    pws(&w, "<|im_start|>system\n");
    if (kind == LT_CHAT_QWEN35) {
        pws(&w, "# Tools\n\nYou have access to the following functions:\n\n<tools>");
    } else {
        pws(&w, system ? system : "");
        pws(&w, "\n\n# Tools\n\nYou may call one or more functions to assist with the user "
                "query.\n\nYou are provided with function signatures within <tools></tools> "
                "XML tags:\n<tools>");
    }
    for (size_t i = 0; i < json_array_size(t); i++) {
        pws(&w, "\n");
        py_json(&w, json_array_get(t, i));
    }
    if (kind == LT_CHAT_QWEN35) {
        pws(&w, "\n</tools>");
        pws(&w, qwen35_rules);
        size_t b = 0, e = system ? strlen(system) : 0;
        if (system)
            trim(system, &b, &e);
        if (e > b) {
            pws(&w, "\n\n");
            pw(&w, system + b, e - b);
        }
    } else {
        pws(&w, qwen25_rules);
    }
    pws(&w, "<|im_end|>\n");
    json_decref(t);
    return w.st;
}

static void qwen35_call(struct pyw *w, const char *name, json_t *args, bool first, bool has_content)
{
    pws(w, first ? (has_content ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=")
                 : "\n<tool_call>\n<function=");
    pws(w, name);
    pws(w, ">\n");
    const char *k;
    json_t *v;
    json_object_foreach(args, k, v)
    {
        pws(w, "<parameter=");
        pws(w, k);
        pws(w, ">\n");
        py_str_scalar(w, v);
        pws(w, "\n</parameter>\n");
    }
    pws(w, "</function>\n</tool_call>");
}

lt_status tok_chat_tool_calls(enum lt_chat_kind kind, const char *tool_calls, const char *content,
                              size_t content_len, struct lt_strbuf *out)
{
    lt_status st = LT_OK;
    json_t *calls = load(tool_calls, "tool_calls", &st);
    if (!calls)
        return st;
    if (!json_is_array(calls)) {
        json_decref(calls);
        return lt_fail(LT_ERR_INVALID, "tool_calls: must be an array");
    }
    size_t b = 0, e = content_len;
    trim(content, &b, &e);
    struct pyw w = {.b = out};
    for (size_t i = 0; i < json_array_size(calls) && !w.st; i++) {
        json_t *fn = function_of(json_array_get(calls, i), "tool_calls", i, &st);
        json_t *args = fn ? call_arguments(fn, i, &st) : NULL;
        if (!args)
            break;
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (kind == LT_CHAT_QWEN35) {
            qwen35_call(&w, name, args, i == 0, e > b);
        } else {
            pws(&w, "\n<tool_call>\n{\"name\": \"");
            pws(&w, name);
            pws(&w, "\", \"arguments\": ");
            py_json(&w, args);
            pws(&w, "}\n</tool_call>");
        }
        json_decref(args);
    }
    json_decref(calls);
    return st ? st : w.st;
}

/* ---- reading calls out of a model's output ---- */

/* The function named `name` among tools, or NULL. */
static json_t *find_tool(json_t *tools, const char *name, size_t n)
{
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *item = json_array_get(tools, i);
        json_t *fn = json_object_get(item, "function");
        if (!fn)
            fn = item;
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (fname && strlen(fname) == n && !memcmp(fname, name, n))
            return fn;
    }
    return NULL;
}

static const char *skip_space(const char *p, const char *end)
{
    while (p < end && is_space(*p))
        p++;
    return p;
}

static bool take(const char **p, const char *end, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(end - *p) < n || memcmp(*p, lit, n))
        return false;
    *p += n;
    return true;
}

/* One JSON value at *p (advanced past it), or NULL. */
static json_t *take_value(const char **p, const char *end)
{
    json_error_t jerr;
    json_t *v = json_loadb(*p, (size_t)(end - *p), JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &jerr);
    if (v)
        *p += jerr.position;
    return v;
}

/* {"name": N, "arguments": A} read field by field, the closing brace optional: small models
 * often drop it (SmolLM2 does after a forced call's prefill, and goes on writing). */
static json_t *take_call_fields(const char **p, const char *end)
{
    const char *q = skip_space(*p, end);
    json_t *name = NULL, *args = NULL, *call = NULL;
    if (take(&q, end, "{") && (q = skip_space(q, end), take(&q, end, "\"name\"")) &&
        (q = skip_space(q, end), take(&q, end, ":")) && (q = skip_space(q, end), true) &&
        (name = take_value(&q, end)) && (q = skip_space(q, end), take(&q, end, ",")) &&
        (q = skip_space(q, end), take(&q, end, "\"arguments\"")) &&
        (q = skip_space(q, end), take(&q, end, ":")) && (q = skip_space(q, end), true) &&
        (args = take_value(&q, end))) {
        const char *r = skip_space(q, end);
        if (take(&r, end, "}"))
            q = r;
        call = json_pack("{s:O,s:O}", "name", name, "arguments", args);
        *p = q;
    }
    json_decref(name);
    json_decref(args);
    return call;
}

/* {"name": ..., "arguments": {...}} (Qwen2.5's and the generic format), at the start of
 * s[0..n); *used: the bytes it took. */
static json_t *parse_json_call(json_t *tools, const char *s, size_t n, const char **name,
                               size_t *used)
{
    const char *p = s;
    json_t *call = take_value(&p, s + n);
    if (!json_is_object(call)) {
        json_decref(call);
        p = s;
        call = take_call_fields(&p, s + n);
    }
    *used = (size_t)(p - s);
    json_t *fname = json_object_get(call, "name");
    json_t *args = json_object_get(call, "arguments");
    json_t *out = NULL;
    if (json_is_string(fname) &&
        find_tool(tools, json_string_value(fname), json_string_length(fname))) {
        if (json_is_object(args))
            out = json_incref(args);
        else if (json_is_string(args))
            out = json_loads(json_string_value(args), 0, NULL);
        if (out && !json_is_object(out)) {
            json_decref(out);
            out = NULL;
        }
    }
    *name = out ? strdup(json_string_value(fname)) : NULL;
    json_decref(call);
    return out;
}

static const char *find(const char *s, const char *end, const char *lit)
{
    size_t n = strlen(lit);
    for (; s + n <= end; s++)
        if (!memcmp(s, lit, n))
            return s;
    return NULL;
}

/* A parameter's value: a string where the schema says so (or it is no JSON), else JSON. */
static json_t *param_value(json_t *fn, const char *key, const char *v, size_t n)
{
    json_t *prop =
        json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"), key);
    const char *type = json_string_value(json_object_get(prop, "type"));
    json_t *j = type && !strcmp(type, "string") ? NULL : json_loadb(v, n, JSON_DECODE_ANY, NULL);
    return j ? j : json_stringn(v, n);
}

/* <function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function> (Qwen3.5's). */
static json_t *parse_xml_call(json_t *tools, const char *s, size_t n, const char **name)
{
    const char *p = skip_space(s, s + n), *end = s + n;
    *name = NULL;
    if (!take(&p, end, "<function="))
        return NULL;
    const char *ne = memchr(p, '>', (size_t)(end - p));
    json_t *fn = ne ? find_tool(tools, p, (size_t)(ne - p)) : NULL;
    if (!fn)
        return NULL;
    const char *fname = json_string_value(json_object_get(fn, "name"));
    p = ne + 1;
    json_t *args = json_object();
    bool ok = args != NULL;
    while (ok) {
        p = skip_space(p, end);
        if (p == end || take(&p, end, "</function>"))
            break;
        const char *ke = NULL;
        ok = take(&p, end, "<parameter=") && (ke = memchr(p, '>', (size_t)(end - p)));
        if (!ok)
            break;
        char *key = strndup(p, (size_t)(ke - p));
        p = ke + 1 + (ke + 1 < end && ke[1] == '\n');
        const char *ve = find(p, end, "</parameter>");
        ok = key && ve;
        if (ok) {
            size_t vn = (size_t)(ve - p) - (ve > p && ve[-1] == '\n');
            ok = json_object_set_new(args, key, param_value(fn, key, p, vn)) == 0;
            p = ve + strlen("</parameter>");
        }
        free(key);
    }
    if (ok && skip_space(p, end) != end)
        ok = false;
    if (!ok) {
        json_decref(args);
        return NULL;
    }
    *name = strdup(fname);
    return args;
}

static lt_status add_call(struct lt_chat_tool_output *o, const char *name, json_t *args)
{
    struct lt_chat_tool_call *c = realloc(o->calls, (o->n_calls + 1) * sizeof(*c));
    if (!c)
        return lt_fail(LT_ERR_NOMEM, "out of memory for a tool call");
    o->calls = c;
    struct lt_strbuf b = {0};
    struct pyw w = {.b = &b};
    py_json(&w, args);
    pw(&w, "", 0);
    c[o->n_calls] = (struct lt_chat_tool_call){.name = strdup(name), .arguments = b.data};
    o->n_calls++;
    if (w.st || !c[o->n_calls - 1].name)
        return lt_fail(LT_ERR_NOMEM, "out of memory for a tool call");
    return LT_OK;
}

/* The blocks of text into o; false when one does not parse. A closed block holds one call
 * and nothing else; in a last block the model left open (it went on, or stopped), what
 * follows the call is kept as text outside it. */
static bool parse_blocks(enum lt_chat_kind kind, json_t *tools, const char *text, size_t len,
                         struct lt_chat_tool_output *o, struct lt_strbuf *outside, lt_status *st)
{
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *open = find(p, end, TOOL_OPEN);
        if (!open) {
            *st = lt_strbuf_append(outside, p, (size_t)(end - p));
            break;
        }
        if ((*st = lt_strbuf_append(outside, p, (size_t)(open - p))))
            return false;
        const char *body = open + strlen(TOOL_OPEN);
        const char *close = find(body, end, TOOL_CLOSE);
        const char *body_end = close ? close : end;
        const char *name = NULL;
        size_t n = (size_t)(body_end - body), used = n;
        json_t *args = kind == LT_CHAT_QWEN35 ? parse_xml_call(tools, body, n, &name)
                                              : parse_json_call(tools, body, n, &name, &used);
        const char *rest = skip_space(body + used, body_end);
        if (args && rest < body_end && close) {
            json_decref(args); /* more than one call in a closed block */
            args = NULL;
        }
        if (args && rest < body_end)
            *st = lt_strbuf_append(outside, rest, (size_t)(body_end - rest));
        if (args && !*st)
            *st = name ? add_call(o, name, args) : lt_fail(LT_ERR_NOMEM, "out of memory");
        json_decref(args);
        free((char *)name);
        if (!args || *st)
            return false;
        p = close ? close + strlen(TOOL_CLOSE) : end;
    }
    return *st == LT_OK;
}

lt_status lt_chat_tool_parse(enum lt_chat_kind kind, const char *tools, const char *text,
                             size_t len, struct lt_chat_tool_output *out)
{
    memset(out, 0, sizeof(*out));
    lt_status st = LT_OK;
    json_t *t = tools ? load_tools(tools, &st) : json_array();
    if (!t)
        return st ? st : lt_fail(LT_ERR_NOMEM, "out of memory");
    struct lt_strbuf outside = {0};
    bool ok = parse_blocks(kind, t, text, len, out, &outside, &st);
    json_decref(t);
    if (st) {
        lt_strbuf_free(&outside);
        lt_chat_tool_output_free(out);
        return st;
    }
    if (!ok || out->n_calls == 0) {
        lt_chat_tool_output_free(out);
        lt_strbuf_free(&outside);
        out->content = strndup(text, len);
        return out->content ? LT_OK : lt_fail(LT_ERR_NOMEM, "out of memory");
    }
    size_t b = 0, e = outside.len;
    if (outside.data)
        trim(outside.data, &b, &e);
    if (e > b && !(out->content = strndup(outside.data + b, e - b)))
        st = lt_fail(LT_ERR_NOMEM, "out of memory");
    if (out->content && !*out->content) { /* text that starts with a NUL byte */
        free(out->content);
        out->content = NULL;
    }
    lt_strbuf_free(&outside);
    if (st)
        lt_chat_tool_output_free(out);
    return st;
}

#else

lt_status tok_chat_tools_system(enum lt_chat_kind kind, const char *tools, const char *system,
                                struct lt_strbuf *out)
{
    return lt_fail(LT_ERR_UNSUPPORTED, "tools need jansson, which this build lacks");
}

lt_status tok_chat_tool_calls(enum lt_chat_kind kind, const char *tool_calls, const char *content,
                              size_t content_len, struct lt_strbuf *out)
{
    return lt_fail(LT_ERR_UNSUPPORTED, "tool calls need jansson, which this build lacks");
}

lt_status lt_chat_tools_check(const char *tools)
{
    return lt_fail(LT_ERR_UNSUPPORTED, "tools need jansson, which this build lacks");
}

lt_status lt_chat_tool_parse(enum lt_chat_kind kind, const char *tools, const char *text,
                             size_t len, struct lt_chat_tool_output *out)
{
    memset(out, 0, sizeof(*out));
    out->content = strndup(text, len);
    return out->content ? LT_OK : lt_fail(LT_ERR_NOMEM, "out of memory");
}

#endif
