/* chat.c: chat templates, rendered natively for the families lathe's models use (see
 * tokenizer.h), with the byte spans of assistant turns for training.
 *
 * Each renderer reproduces, for the roles it accepts, exactly the text the model's Jinja
 * template renders; tests check this against Jinja itself. Recognition is by the template's
 * text: a template must contain ChatML's markers, and a template with thinking blocks is
 * only accepted for the architecture whose template lathe renders (qwen35). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* ---- recognising a template ---- */

static bool starts_with(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

/* A literal default system prompt: "<|im_start|>system" + newline (escaped or not) + plain
 * text + "<|im_end|>", all inside one Jinja string (no quote, brace or '+' in the text).
 * Returns the unescaped text (malloc'd) and where the literal starts, or NULL. */
static char *find_default_system(const char *jinja, const char **where)
{
    static const char marker[] = "<|im_start|>system";
    for (const char *p = strstr(jinja, marker); p; p = strstr(p + 1, marker)) {
        const char *s = p + strlen(marker);
        if (starts_with(s, "\\n"))
            s += 2;
        else if (*s == '\n')
            s += 1;
        else
            continue;
        const char *e = strstr(s, "<|im_end|>");
        if (!e || e == s || strcspn(s, "'\"{}+") < (size_t)(e - s))
            continue;
        char *out = malloc((size_t)(e - s) + 1);
        if (!out)
            return NULL;
        size_t n = 0;
        for (const char *c = s; c < e; c++) {
            if (*c == '\\' && c + 1 < e) {
                c++;
                out[n++] = *c == 'n' ? '\n' : *c == 't' ? '\t' : *c;
            } else {
                out[n++] = *c;
            }
        }
        out[n] = 0;
        *where = p;
        return out;
    }
    return NULL;
}

lt_status lt_chat_template_detect(const char *jinja, const char *arch, struct lt_chat_template *out)
{
    memset(out, 0, sizeof(*out));
    if (!jinja)
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "chat template: the model (architecture %s) has no "
                       "tokenizer.chat_template",
                       arch ? arch : "unknown");
    if (!strstr(jinja, "<|im_start|>") || !strstr(jinja, "<|im_end|>"))
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "chat template: not one lathe knows (it is not ChatML); it begins "
                       "'%.60s'",
                       jinja);
    bool thinking = strstr(jinja, "<think>") != NULL;
    bool is_qwen35 = arch && (!strcmp(arch, "qwen35") || !strcmp(arch, "qwen35moe"));
    if (thinking) {
        if (!is_qwen35)
            return lt_fail(LT_ERR_UNSUPPORTED,
                           "chat template: a ChatML template with <think> blocks for "
                           "architecture %s; lathe renders Qwen3.5's (architecture qwen35) only",
                           arch ? arch : "unknown");
        out->kind = LT_CHAT_QWEN35;
        return LT_OK;
    }
    out->kind = LT_CHAT_CHATML;
    out->tool_responses = strstr(jinja, "<tool_response>") != NULL;
    const char *where = NULL;
    out->default_system = find_default_system(jinja, &where);
    if (out->default_system) {
        /* inside the message loop (SmolLM2: "loop.first and messages[0]['role'] != 'system'")
         * it needs a first message; before the loop (Qwen2.5) it is always there */
        size_t before = (size_t)(where - jinja);
        char *prefix = strndup(jinja, before);
        if (!prefix) {
            lt_chat_template_free(out);
            return lt_fail(LT_ERR_NOMEM, "chat template: out of memory");
        }
        out->default_system_if_empty = !strstr(prefix, "loop.first");
        free(prefix);
    }
    return LT_OK;
}

void lt_chat_template_free(struct lt_chat_template *ct)
{
    free(ct->default_system);
    memset(ct, 0, sizeof(*ct));
}

/* ---- rendering ---- */

struct renderer {
    struct lt_chat_render *r;
    size_t spans_cap;
    lt_status st;
};

static void put(struct renderer *w, const char *s, size_t n)
{
    if (!w->st)
        w->st = lt_strbuf_append(&w->r->text, s, n);
}

static void puts_(struct renderer *w, const char *s)
{
    put(w, s, strlen(s));
}

static size_t pos(struct renderer *w)
{
    return w->r->text.len;
}

static void add_span(struct renderer *w, const struct lt_chat_span *sp)
{
    if (w->st)
        return;
    struct lt_chat_render *r = w->r;
    if (r->n_spans == w->spans_cap) {
        size_t cap = w->spans_cap ? 2 * w->spans_cap : 8;
        struct lt_chat_span *s = realloc(r->spans, cap * sizeof(*s));
        if (!s) {
            w->st = lt_fail(LT_ERR_NOMEM, "chat template: out of memory");
            return;
        }
        r->spans = s;
        w->spans_cap = cap;
    }
    r->spans[r->n_spans++] = *sp;
}

/* Qwen's tool results: consecutive tool messages share one user turn. */
static void render_tool(struct renderer *w, const struct lt_chat_message *m, size_t n, size_t i)
{
    if (i == 0 || strcmp(m[i - 1].role, "tool"))
        puts_(w, "<|im_start|>user");
    puts_(w, "\n<tool_response>\n");
    puts_(w, m[i].content);
    puts_(w, "\n</tool_response>");
    if (i + 1 == n || strcmp(m[i + 1].role, "tool"))
        puts_(w, "<|im_end|>\n");
}

static void set_status(struct renderer *w, lt_status st)
{
    if (!w->st)
        w->st = st;
}

/* Qwen2.5's assistant turn with tool calls (lathe's generic format too): no newline after
 * the header when there is no content. */
static void render_chatml_calls(struct renderer *w, const struct lt_chat_message *m, size_t i)
{
    puts_(w, "<|im_start|>assistant");
    struct lt_chat_span sp = {.message = i, .turn_begin = pos(w)};
    if (*m[i].content)
        puts_(w, "\n");
    sp.content_begin = pos(w);
    puts_(w, m[i].content);
    sp.content_end = pos(w);
    if (!w->st)
        set_status(w, tok_chat_tool_calls(LT_CHAT_CHATML, m[i].tool_calls, m[i].content,
                                          strlen(m[i].content), &w->r->text));
    puts_(w, "<|im_end|>");
    sp.turn_end = pos(w);
    puts_(w, "\n");
    add_span(w, &sp);
}

static void render_chatml(struct renderer *w, const struct lt_chat_template *ct,
                          const struct lt_chat_message *m, size_t n, const char *tools)
{
    size_t first = 0;
    if (tools) {
        /* Qwen2.5's tools branch: the system message (or the default one) and the tools */
        first = n && !strcmp(m[0].role, "system");
        if (!w->st)
            set_status(w, tok_chat_tools_system(LT_CHAT_CHATML, tools,
                                                first ? m[0].content : ct->default_system,
                                                &w->r->text));
    } else if (ct->default_system &&
               (n ? strcmp(m[0].role, "system") : ct->default_system_if_empty)) {
        puts_(w, "<|im_start|>system\n");
        puts_(w, ct->default_system);
        puts_(w, "<|im_end|>\n");
    }
    for (size_t i = first; i < n; i++) {
        if (ct->tool_responses && !strcmp(m[i].role, "tool")) {
            render_tool(w, m, n, i);
            continue;
        }
        if (m[i].tool_calls && !strcmp(m[i].role, "assistant")) {
            render_chatml_calls(w, m, i);
            continue;
        }
        puts_(w, "<|im_start|>");
        puts_(w, m[i].role);
        puts_(w, "\n");
        struct lt_chat_span sp = {.message = i, .turn_begin = pos(w), .content_begin = pos(w)};
        puts_(w, m[i].content);
        sp.content_end = pos(w);
        puts_(w, "<|im_end|>");
        sp.turn_end = pos(w);
        puts_(w, "\n");
        if (!strcmp(m[i].role, "assistant"))
            add_span(w, &sp);
    }
}

/* Python's str.strip / lstrip / rstrip of '\n' on s[*b..*e). */
static void strip_nl(const char *s, size_t *b, size_t *e, bool left, bool right)
{
    while (left && *b < *e && s[*b] == '\n')
        (*b)++;
    while (right && *e > *b && s[*e - 1] == '\n')
        (*e)--;
}

/* The last occurrence of needle in s[b..e), or NULL. */
static const char *find_last(const char *s, size_t b, size_t e, const char *needle)
{
    size_t nl = strlen(needle);
    const char *last = NULL;
    for (size_t i = b; i + nl <= e; i++)
        if (!memcmp(s + i, needle, nl))
            last = s + i;
    return last;
}

static bool is_tool_response(const char *c)
{
    size_t n = strlen(c);
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    return starts_with(c, open) && n >= strlen(close) && !strcmp(c + n - strlen(close), close);
}

static void render_qwen35_assistant(struct renderer *w, const struct lt_chat_message *m, size_t i,
                                    bool after_query, bool last)
{
    const char *c = m->content;
    size_t cb = 0, ce = strlen(c);
    const char *reason = "";
    size_t rb = 0, re = 0;
    if (m->reasoning) {
        reason = m->reasoning;
        re = strlen(reason);
    } else {
        const char *close = strstr(c, "</think>");
        if (close) {
            /* reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1]
             *             .lstrip('\n'); content = content.split('</think>')[-1].lstrip('\n') */
            reason = c;
            re = (size_t)(close - c);
            strip_nl(c, &rb, &re, false, true);
            const char *open = find_last(c, rb, re, "<think>");
            if (open)
                rb = (size_t)(open - c) + strlen("<think>");
            strip_nl(c, &rb, &re, true, false);
            cb = (size_t)(find_last(c, 0, ce, "</think>") - c) + strlen("</think>");
            strip_nl(c, &cb, &ce, true, false);
        }
    }
    puts_(w, "<|im_start|>assistant\n");
    struct lt_chat_span sp = {.message = i, .turn_begin = pos(w)};
    if (after_query && (last || rb < re)) {
        strip_nl(reason, &rb, &re, true, true);
        puts_(w, "<think>\n");
        put(w, reason + rb, re - rb);
        puts_(w, "\n</think>\n\n");
        strip_nl(c, &cb, &ce, true, false);
    }
    sp.content_begin = pos(w);
    put(w, c + cb, ce - cb);
    sp.content_end = pos(w);
    if (m->tool_calls && !w->st)
        set_status(
            w, tok_chat_tool_calls(LT_CHAT_QWEN35, m->tool_calls, c + cb, ce - cb, &w->r->text));
    puts_(w, "<|im_end|>");
    sp.turn_end = pos(w);
    puts_(w, "\n");
    add_span(w, &sp);
}

static void render_qwen35(struct renderer *w, const struct lt_chat_message *m, size_t n,
                          const char *tools)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(m[i].role, "system") && strcmp(m[i].role, "user") &&
            strcmp(m[i].role, "assistant") && strcmp(m[i].role, "tool")) {
            w->st = lt_fail(LT_ERR_INVALID,
                            "chat template: message %zu has role '%s'; Qwen3.5's template "
                            "knows system, user, assistant and tool",
                            i, m[i].role);
            return;
        }
    if (tools) {
        if (!w->st)
            set_status(
                w, tok_chat_tools_system(LT_CHAT_QWEN35, tools,
                                         n && !strcmp(m[0].role, "system") ? m[0].content : NULL,
                                         &w->r->text));
    } else if (n && !strcmp(m[0].role, "system")) {
        puts_(w, "<|im_start|>system\n");
        puts_(w, m[0].content);
        puts_(w, "<|im_end|>\n");
    }
    size_t last_query = n ? n - 1 : 0;
    for (size_t k = n; k-- > 0;)
        if (!strcmp(m[k].role, "user") && !is_tool_response(m[k].content)) {
            last_query = k;
            break;
        }
    for (size_t i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (!strcmp(role, "user") || (!strcmp(role, "system") && i > 0)) {
            puts_(w, "<|im_start|>");
            puts_(w, role);
            puts_(w, "\n");
            puts_(w, m[i].content);
            puts_(w, "<|im_end|>\n");
        } else if (!strcmp(role, "assistant")) {
            render_qwen35_assistant(w, &m[i], i, i > last_query, i + 1 == n);
        } else if (!strcmp(role, "tool")) {
            render_tool(w, m, n, i);
        }
    }
}

/* JSON text "[]", whitespace aside. */
static bool is_empty_array(const char *s)
{
    s += strspn(s, " \t\r\n");
    if (*s++ != '[')
        return false;
    s += strspn(s, " \t\r\n");
    if (*s++ != ']')
        return false;
    return s[strspn(s, " \t\r\n")] == 0;
}

lt_status lt_chat_render(const struct lt_chat_template *ct, const struct lt_chat_message *msgs,
                         size_t n, const struct lt_chat_options *opts, struct lt_chat_render *out)
{
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return lt_fail(LT_ERR_INVALID, "chat template: message %zu has no %s", i,
                           msgs[i].role ? "content" : "role");
    struct renderer w = {.r = out};
    w.st = lt_strbuf_append(&out->text, "", 0);
    const char *tools = opts ? opts->tools : NULL;
    if (tools && is_empty_array(tools))
        tools = NULL; /* the templates' `if tools` */
    if (ct->kind == LT_CHAT_QWEN35)
        render_qwen35(&w, msgs, n, tools);
    else
        render_chatml(&w, ct, msgs, n, tools);
    if (opts && opts->add_generation_prompt) {
        puts_(&w, "<|im_start|>assistant\n");
        /* a forced tool call starts right away: its prefill closes the thinking block */
        if (ct->kind == LT_CHAT_QWEN35)
            puts_(&w, opts->enable_thinking && !opts->prefill ? "<think>\n"
                                                              : "<think>\n\n</think>\n\n");
        if (opts->prefill)
            puts_(&w, opts->prefill);
    }
    if (w.st)
        lt_chat_render_free(out);
    return w.st;
}

void lt_chat_render_free(struct lt_chat_render *r)
{
    lt_strbuf_free(&r->text);
    free(r->spans);
    memset(r, 0, sizeof(*r));
}

/* ---- spans to tokens ---- */

/* Number of tokens that end at or before byte b (tokens tile the text; token i covers
 * [offs[i], offs[i+1]), the last one up to len). */
static size_t tokens_ending_by(const struct lt_tokens *tk, size_t len, size_t b)
{
    size_t lo = 0, hi = tk->n; /* first token whose end is > b */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        size_t end = mid + 1 < tk->n ? tk->offs[mid + 1] : len;
        if (end <= b)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Number of tokens that start before byte e. */
static size_t tokens_starting_before(const struct lt_tokens *tk, size_t e)
{
    size_t lo = 0, hi = tk->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (tk->offs[mid] < e)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void token_range(const struct lt_tokens *tk, size_t len, size_t b, size_t e, size_t *tb,
                        size_t *te)
{
    *tb = tokens_ending_by(tk, len, b);
    *te = e > b ? tokens_starting_before(tk, e) : *tb;
    if (*te < *tb)
        *te = *tb;
}

lt_status lt_chat_tokenize(const struct lt_tokenizer *t, const struct lt_chat_render *r,
                           struct lt_tokens *out, struct lt_chat_token_span *spans)
{
    struct lt_tokens tk = {.want_offsets = true};
    lt_status st = lt_tokenize(t, r->text.data ? r->text.data : "", r->text.len,
                               LT_TOKENIZE_PARSE_SPECIAL, &tk);
    if (st)
        goto out_free_tokens;
    size_t base = out->n;
    for (size_t i = 0; i < tk.n; i++)
        if ((st = tok_push(out, tk.ids[i], tk.offs[i])))
            goto out_rollback;
    for (size_t s = 0; s < r->n_spans; s++) {
        const struct lt_chat_span *sp = &r->spans[s];
        struct lt_chat_token_span *ts = &spans[s];
        token_range(&tk, r->text.len, sp->turn_begin, sp->turn_end, &ts->turn_begin, &ts->turn_end);
        token_range(&tk, r->text.len, sp->content_begin, sp->content_end, &ts->content_begin,
                    &ts->content_end);
        ts->turn_begin += base;
        ts->turn_end += base;
        ts->content_begin += base;
        ts->content_end += base;
    }
    goto out_free_tokens;

out_rollback:
    out->n = base;
out_free_tokens:
    lt_tokens_free(&tk);
    return st;
}
