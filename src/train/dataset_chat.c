/* dataset_chat.c: chat examples from JSONL, rendered through the model's chat template,
 * with loss on assistant turns only.
 *
 * Each example is rendered once as a whole conversation; the token spans of its assistant
 * turns (lt_chat_tokenize) decide which labels carry loss. A label at position i is the
 * token i + 1, kept only when token i + 1 lies in a trained turn, so the model learns to
 * produce the turn (and its closing marker) from everything before it.
 *
 * fit MIDDLE re-renders without the oldest exchanges (an exchange runs from a user message
 * to the next one), keeping the leading system messages and the last exchange; fit LEFT
 * keeps the last `window` tokens of the rendering. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/dataset.h"

#ifdef LATHE_HAVE_JANSSON
#include <jansson.h>

struct chat_example {
    struct lt_chat_message *msgs;
    bool *train; /* per message: an assistant turn carrying loss */
    char **calls; /* per message: its tool_calls' JSON text (msgs[i].tool_calls), or NULL */
    size_t n;
    char *tools; /* the example's tools' JSON text, or NULL */
};

static void chat_example_free(struct chat_example *c)
{
    for (size_t i = 0; c->calls && i < c->n; i++)
        free(c->calls[i]);
    free(c->calls);
    free(c->tools);
    free(c->msgs);
    free(c->train);
    memset(c, 0, sizeof(*c));
}

/* The example's "tools" (an array; empty is none) as JSON text, checked. */
static lt_status parse_tools(json_t *root, struct chat_example *c)
{
    json_t *tools = json_object_get(root, "tools");
    if (!tools)
        return LT_OK;
    if (!json_is_array(tools))
        return lt_fail(LT_ERR_FORMAT, "\"tools\" must be an array of {\"type\": \"function\", "
                                      "\"function\": {\"name\", ...}}");
    if (json_array_size(tools) == 0)
        return LT_OK;
    if (!(c->tools = json_dumps(tools, JSON_COMPACT)))
        return lt_fail(LT_ERR_NOMEM, "out of memory");
    return lt_chat_tools_check(c->tools);
}

/* Message i's "tool_calls" (assistant messages; a non-empty array), as JSON text. */
static const char *parse_calls(json_t *m, size_t i, struct chat_example *c)
{
    json_t *calls = json_object_get(m, "tool_calls");
    if (!json_is_array(calls) || json_array_size(calls) == 0)
        return NULL;
    c->calls[i] = json_dumps(calls, JSON_COMPACT);
    return c->calls[i];
}

/* Fills c from one parsed JSON line (strings point into `root`). Messages name what is
 * wrong; the caller puts the example and its line in front. */
static lt_status parse_example(json_t *root, struct chat_example *c)
{
    memset(c, 0, sizeof(*c));
    if (!json_is_object(root))
        return lt_fail(LT_ERR_FORMAT, "an example must be a JSON object");
    json_t *msgs = json_object_get(root, "messages");
    json_t *prompt = json_object_get(root, "prompt");
    json_t *completion = json_object_get(root, "completion");
    json_t *system = json_object_get(root, "system");
    if (msgs) {
        if (!json_is_array(msgs) || json_array_size(msgs) == 0)
            return lt_fail(LT_ERR_FORMAT, "\"messages\" must be a non-empty array");
        c->n = json_array_size(msgs);
    } else if (prompt || completion) {
        if (!json_is_string(prompt) || !json_is_string(completion))
            return lt_fail(LT_ERR_FORMAT, "\"prompt\" and \"completion\" must both be strings");
        if (system && !json_is_string(system))
            return lt_fail(LT_ERR_FORMAT, "\"system\" must be a string");
        c->n = system ? 3 : 2;
    } else {
        return lt_fail(LT_ERR_FORMAT,
                       "an example needs \"messages\" or \"prompt\" and \"completion\"");
    }
    c->msgs = calloc(c->n, sizeof(*c->msgs));
    c->train = calloc(c->n, sizeof(*c->train));
    c->calls = calloc(c->n, sizeof(*c->calls));
    if (!c->msgs || !c->train || !c->calls) {
        chat_example_free(c);
        return lt_fail(LT_ERR_NOMEM, "out of memory");
    }
    if (!msgs) {
        size_t k = 0;
        if (system)
            c->msgs[k++] =
                (struct lt_chat_message){.role = "system", .content = json_string_value(system)};
        c->msgs[k++] =
            (struct lt_chat_message){.role = "user", .content = json_string_value(prompt)};
        c->msgs[k] =
            (struct lt_chat_message){.role = "assistant", .content = json_string_value(completion)};
        c->train[k] = true;
        return parse_tools(root, c);
    }
    for (size_t i = 0; i < c->n; i++) {
        json_t *m = json_array_get(msgs, i);
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        json_t *train = json_object_get(m, "train");
        json_t *reasoning = json_object_get(m, "reasoning_content");
        json_t *calls = json_object_get(m, "tool_calls");
        /* an assistant message with tool calls may have a null or no content */
        bool no_content = calls && (!content || json_is_null(content));
        const char *bad =
            !json_is_object(m)                        ? "is not an object"
            : !json_is_string(role)                   ? "has no \"role\" string"
            : calls && !json_is_array(calls)          ? "has a \"tool_calls\" that is not an array"
            : !no_content && !json_is_string(content) ? "has no \"content\" string"
            : train && !json_is_boolean(train)        ? "has a \"train\" that is not true or false"
            : reasoning && !json_is_string(reasoning)
                ? "has a \"reasoning_content\" that is not a string"
                : NULL;
        if (bad) {
            chat_example_free(c);
            return lt_fail(LT_ERR_FORMAT, "message %zu %s", i, bad);
        }
        c->msgs[i] =
            (struct lt_chat_message){.role = json_string_value(role),
                                     .content = no_content ? "" : json_string_value(content),
                                     .reasoning = reasoning ? json_string_value(reasoning) : NULL,
                                     .tool_calls = parse_calls(m, i, c)};
        if (calls && json_array_size(calls) && !c->msgs[i].tool_calls) {
            chat_example_free(c);
            return lt_fail(LT_ERR_NOMEM, "out of memory");
        }
        c->train[i] = !strcmp(c->msgs[i].role, "assistant") && !json_is_false(train);
    }
    return parse_tools(root, c);
}

/* Renders msgs (with per-message train flags) into tokens and labels (malloc'd). */
static lt_status render(const struct lt_tokenizer *tok, const struct lt_chat_template *ct,
                        const struct lt_chat_message *msgs, const bool *train, size_t n,
                        const char *tools, int32_t **tokens, int32_t **labels, int *n_tokens)
{
    struct lt_chat_render r = {0};
    struct lt_tokens tk = {0};
    struct lt_chat_token_span *spans = NULL;
    *tokens = *labels = NULL;
    lt_status st = lt_chat_render(ct, msgs, n, &(struct lt_chat_options){.tools = tools}, &r);
    if (st != LT_OK)
        return st;
    bool bos = lt_tokenizer_add_bos(tok) && lt_tokenizer_bos(tok) != LT_TOKEN_NONE;
    if (bos && (st = lt_tokenize(tok, "", 0, LT_TOKENIZE_ADD_BOS, &tk)) != LT_OK)
        goto out_free;
    spans = calloc(r.n_spans ? r.n_spans : 1, sizeof(*spans));
    if (!spans) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    if ((st = lt_chat_tokenize(tok, &r, &tk, spans)) != LT_OK)
        goto out_free;
    int nt = (int)tk.n;
    *tokens = malloc((size_t)(nt ? nt : 1) * sizeof(int32_t));
    *labels = malloc((size_t)(nt ? nt : 1) * sizeof(int32_t));
    bool *in_loss = calloc((size_t)nt + 1, 1);
    if (!*tokens || !*labels || !in_loss) {
        free(in_loss);
        st = lt_fail(LT_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    for (size_t s = 0; s < r.n_spans; s++)
        if (train[r.spans[s].message])
            for (size_t i = spans[s].turn_begin; i < spans[s].turn_end && i < (size_t)nt; i++)
                in_loss[i] = true;
    for (int i = 0; i < nt; i++) {
        (*tokens)[i] = tk.ids[i];
        (*labels)[i] = i + 1 < nt && in_loss[i + 1] ? tk.ids[i + 1] : -1;
    }
    free(in_loss);
    *n_tokens = nt;
out_free:
    if (st != LT_OK) {
        free(*tokens);
        free(*labels);
        *tokens = *labels = NULL;
    }
    free(spans);
    lt_tokens_free(&tk);
    lt_chat_render_free(&r);
    return st;
}

/* fit MIDDLE: drops the oldest exchanges until the rendering fits. The leading system
 * messages and the last exchange always stay; when those alone are too long, *n_tokens is
 * left over the window and the caller skips the example. */
static lt_status fit_middle(const struct lt_tokenizer *tok, const struct lt_chat_template *ct,
                            const struct chat_example *c, int window, int32_t **tokens,
                            int32_t **labels, int *n_tokens)
{
    size_t n_sys = 0;
    while (n_sys < c->n && !strcmp(c->msgs[n_sys].role, "system"))
        n_sys++;
    struct lt_chat_message *m = malloc(c->n * sizeof(*m));
    bool *tr = malloc(c->n * sizeof(*tr));
    if (!m || !tr) {
        free(m);
        free(tr);
        return lt_fail(LT_ERR_NOMEM, "out of memory");
    }
    lt_status st = LT_OK;
    size_t keep_from = n_sys; /* first message of the oldest exchange kept */
    for (;;) {
        /* the next exchange starts at the next user message after keep_from */
        size_t next = keep_from + 1;
        while (next < c->n && strcmp(c->msgs[next].role, "user"))
            next++;
        if (next >= c->n)
            break; /* keep_from starts the last exchange */
        keep_from = next;
        size_t k = 0;
        for (size_t i = 0; i < n_sys; i++, k++) {
            m[k] = c->msgs[i];
            tr[k] = c->train[i];
        }
        for (size_t i = keep_from; i < c->n; i++, k++) {
            m[k] = c->msgs[i];
            tr[k] = c->train[i];
        }
        free(*tokens);
        free(*labels);
        st = render(tok, ct, m, tr, k, c->tools, tokens, labels, n_tokens);
        if (st != LT_OK || *n_tokens <= window)
            break;
    }
    free(m);
    free(tr);
    return st;
}

/* fit LEFT: keeps the tail of an example (tk, lb; *n tokens) that ends where its last
 * trained turn ends, at most window tokens, with the tokenizer's bos in front when it adds
 * one. A trained turn cut at the front is masked: a reply learned without its opening (its
 * role header) teaches the wrong thing. False when the last trained turn alone does not fit;
 * the caller skips the example and counts it. lb[i] labels position i (the next token). */
static bool fit_left(int32_t *tk, int32_t *lb, int *n, int window, bool bos)
{
    int last = *n - 1; /* the last trained position, and the first of its run */
    while (last >= 0 && lb[last] < 0)
        last--;
    int first = last;
    while (first > 0 && lb[first - 1] >= 0)
        first--;
    int head = bos ? 1 : 0;
    int stop = last + 1, start = stop - (window - head);
    if (start < head)
        start = head;
    if (last < 0 || first < start)
        return false;
    if (start > 0 && lb[start - 1] >= 0) /* a trained run goes on before the cut */
        for (int i = start; i < stop && lb[i] >= 0; i++)
            lb[i] = -1;
    if (bos && start > head)
        lb[0] = -1; /* bos now precedes the cut, whose first token is not learned */
    memmove(tk + head, tk + start, (size_t)(stop - start) * sizeof(*tk));
    memmove(lb + head, lb + start, (size_t)(stop - start) * sizeof(*lb));
    *n = head + stop - start;
    return true;
}

lt_status lt_dataset_chat(const struct lt_tokenizer *tok, const struct lt_chat_template *ct,
                          const char *jsonl, size_t len, int window, enum lt_fit_policy fit,
                          struct lt_dataset *out)
{
    memset(out, 0, sizeof(*out));
    out->window = window;
    out->bad_example = out->bad_line = -1;
    if (window < 2)
        return lt_fail(LT_ERR_INVALID, "window must be at least 2 tokens, not %d", window);
    lt_status st = LT_OK;
    int line = 0, index = 0;
    bool bos = lt_tokenizer_add_bos(tok) && lt_tokenizer_bos(tok) != LT_TOKEN_NONE;
    for (size_t p = 0; p < len && st == LT_OK;) {
        const char *s = jsonl + p;
        const char *nl = memchr(s, '\n', len - p);
        size_t ll = nl ? (size_t)(nl - s) : len - p;
        p += ll + (nl ? 1 : 0);
        line++;
        size_t b = 0;
        while (b < ll && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r'))
            b++;
        if (b == ll)
            continue;
        json_error_t jerr;
        json_t *root = json_loadb(s, ll, JSON_REJECT_DUPLICATES, &jerr);
        if (!root) {
            st = lt_fail(LT_ERR_FORMAT, "%s (column %d)", jerr.text, jerr.column);
            break;
        }
        struct chat_example c;
        st = parse_example(root, &c);
        int32_t *tokens = NULL, *labels = NULL;
        int n = 0;
        if (st == LT_OK)
            st = render(tok, ct, c.msgs, c.train, c.n, c.tools, &tokens, &labels, &n);
        int n_full = n;
        int n_loss = 0;
        for (int i = 0; st == LT_OK && i < n; i++)
            n_loss += labels[i] >= 0;
        if (st == LT_OK && n_loss == 0)
            st = lt_fail(LT_ERR_INVALID,
                         "nothing to train on: no assistant turn without \"train\": false");
        /* window + 1 tokens fit: the last one is only a target (the label at window - 1), never
         * an input that predicts anything, so it is dropped with nothing lost (window
         * predictions, as CambrianTech's /train counts an example) */
        int room = window + 1;
        bool skip = false;
        if (st == LT_OK && n > room && fit == LT_FIT_MIDDLE) {
            st = fit_middle(tok, ct, &c, room, &tokens, &labels, &n);
            skip = st == LT_OK && n > room; /* its head and last exchange alone overflow */
        }
        if (st == LT_OK && n > room && fit == LT_FIT_LEFT)
            skip = !fit_left(tokens, labels, &n, window, bos);
        bool fitted = st == LT_OK && !skip && n < n_full;
        if (st == LT_OK && n == room)
            n = window;
        for (int i = n_loss = 0; st == LT_OK && !skip && i < n; i++)
            n_loss += labels[i] >= 0;
        skip = skip || (st == LT_OK && n_loss == 0); /* the fit left no trained turn */
        if (st == LT_OK && !skip && n > window)
            st = lt_fail(LT_ERR_INVALID,
                         "%d tokens, more than the window of %d holds (%d: the last token is only "
                         "a target); raise the window or give a fit policy (middle or left)",
                         n, window, room);
        if (fitted && !skip)
            out->n_fitted++;
        out->n_skipped += skip;
        if (st == LT_OK && !skip)
            st = lt_dataset_push(out, tokens, labels, n, index);
        free(tokens);
        free(labels);
        chat_example_free(&c);
        json_decref(root);
        if (st != LT_OK)
            break;
        index++;
    }
    int bad = st != LT_OK ? index : -1, bad_line = st != LT_OK ? line : -1;
    if (st != LT_OK)
        st = lt_fail(st, "example %d (line %d): %s", index, line, lt_last_error());
    if (st == LT_OK && out->n == 0 && out->n_skipped > 0)
        st = lt_fail(LT_ERR_INVALID,
                     "no example fits the window of %d tokens: %d skipped, since %s; raise the "
                     "window",
                     window, out->n_skipped,
                     fit == LT_FIT_LEFT ? "the last trained turn alone does not fit"
                                        : "the system messages and the last exchange alone do "
                                          "not fit");
    if (st == LT_OK && out->n == 0)
        st = lt_fail(LT_ERR_INVALID, "the examples hold no example (every line is blank)");
    if (st != LT_OK) {
        lt_dataset_free(out);
        out->bad_example = bad;
        out->bad_line = bad_line;
    }
    return st;
}

#else

lt_status lt_dataset_chat(const struct lt_tokenizer *tok, const struct lt_chat_template *ct,
                          const char *jsonl, size_t len, int window, enum lt_fit_policy fit,
                          struct lt_dataset *out)
{
    memset(out, 0, sizeof(*out));
    out->bad_example = out->bad_line = -1;
    return lt_fail(LT_ERR_UNSUPPORTED, "chat examples need jansson, which this build lacks");
}

#endif
