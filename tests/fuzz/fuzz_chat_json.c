/* fuzz_chat_json.c: libFuzzer target for the chat training-data parser (lt_dataset_chat:
 * JSONL lines of {"messages": [...]} or {"prompt", "completion", "system"?}), rendered
 * through a chat template and tokenized with fuzz_vocab.h's vocabulary.
 *
 * Input: byte 0 picks the template (plain ChatML, ChatML with a default system prompt and
 * tool responses, Qwen3.5), the fit policy and the pre-tokenizer; byte 1 the window; the
 * rest is the JSONL. Any input must be refused with LT_ERR_FORMAT or LT_ERR_INVALID (and a
 * message, the dataset left empty) or give a dataset whose every example is well formed:
 * 1..window tokens in the vocabulary, each label -1 or the next token, the last label -1,
 * at least one label, totals that add up, sources in order.
 *
 * For plain ChatML without a fit policy the dataset is also checked against a reference
 * written here: each non-blank line (parsed again with jansson) is one example whose tokens
 * decode to "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, and whose label at i is set
 * exactly when token i + 1 overlaps an assistant turn (content and "<|im_end|>") that is
 * not marked "train": false. Lines with tools or tool calls are only checked for form. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_vocab.h"
#include "lathe/tokenizer.h"
#include "train/dataset.h"

#ifdef LATHE_HAVE_JANSSON
#include <jansson.h>
#endif

static struct fuzz_vocab vocab;
static struct lt_tokenizer *tok[LT_PRETOK_COUNT];
enum { TPL_CHATML, TPL_QWEN25, TPL_QWEN35, TPL_COUNT };
static struct lt_chat_template tpl[TPL_COUNT];

static void build(void)
{
    for (int p = 0; p < LT_PRETOK_COUNT; p++)
        tok[p] = fuzz_vocab_tokenizer(&vocab, (enum lt_pretokenizer)p);
    static const char *const jinja[TPL_COUNT] = {
        [TPL_CHATML] = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' "
                       "+ message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
        [TPL_QWEN25] = "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou "
                       "are a fuzzer.<|im_end|>\\n' }}{%- endif %}{%- for message in messages "
                       "%}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
                       "'<|im_end|>\\n' }}{{- '<tool_response>\\n' }}{%- endfor %}",
        [TPL_QWEN35] = "{%- for message in messages %}{{- '<|im_start|>' + message.role }}"
                       "{{- '<think>\\n' + reasoning + '\\n</think>' }}{{- '<|im_end|>' }}"
                       "{%- endfor %}",
    };
    static const char *const arch[TPL_COUNT] = {"llama", "qwen2", "qwen35"};
    for (int i = 0; i < TPL_COUNT; i++)
        if (lt_chat_template_detect(jinja[i], arch[i], &tpl[i]) != LT_OK)
            __builtin_trap();
    if (tpl[TPL_CHATML].kind != LT_CHAT_CHATML || tpl[TPL_CHATML].default_system ||
        !tpl[TPL_QWEN25].default_system || !tpl[TPL_QWEN25].tool_responses ||
        tpl[TPL_QWEN35].kind != LT_CHAT_QWEN35)
        __builtin_trap();
}

static void check_example(const struct lt_example *e, int window)
{
    if (e->n < 1 || e->n > window || !e->tokens || !e->labels)
        __builtin_trap();
    int n_loss = 0;
    for (int i = 0; i < e->n; i++) {
        if (e->tokens[i] < 0 || e->tokens[i] >= (int32_t)FUZZ_N_TOKENS)
            __builtin_trap();
        int32_t l = e->labels[i];
        if (l != -1 && (i + 1 == e->n || l != e->tokens[i + 1]))
            __builtin_trap();
        n_loss += l >= 0;
    }
    if (n_loss != e->n_loss || n_loss < 1)
        __builtin_trap();
}

#ifdef LATHE_HAVE_JANSSON

/* The byte span [begin, end) of text a trained turn covers. */
struct turn {
    size_t begin, end;
};

struct expect {
    char *text;
    size_t len, cap;
    struct turn turns[64];
    size_t n_turns;
    bool too_many; /* more trained turns than fit: labels not checked */
};

static void put(struct expect *x, const char *s)
{
    size_t n = strlen(s);
    if (x->len + n + 1 > x->cap) {
        size_t cap = 2 * (x->len + n + 1);
        char *t = realloc(x->text, cap);
        if (!t)
            __builtin_trap();
        x->text = t;
        x->cap = cap;
    }
    memcpy(x->text + x->len, s, n + 1);
    x->len += n;
}

static void put_message(struct expect *x, const char *role, const char *content, bool trained)
{
    put(x, "<|im_start|>");
    put(x, role);
    put(x, "\n");
    size_t begin = x->len;
    put(x, content);
    put(x, "<|im_end|>");
    if (trained) {
        if (x->n_turns < sizeof(x->turns) / sizeof(x->turns[0]))
            x->turns[x->n_turns++] = (struct turn){begin, x->len};
        else
            x->too_many = true;
    }
    put(x, "\n");
}

/* The rendering of one JSONL line the parser accepted (so the fields have their types). */
static void expect_line(json_t *root, struct expect *x)
{
    json_t *msgs = json_object_get(root, "messages");
    if (msgs) {
        size_t i;
        json_t *m;
        json_array_foreach(msgs, i, m)
        {
            const char *role = json_string_value(json_object_get(m, "role"));
            const char *content = json_string_value(json_object_get(m, "content"));
            bool trained =
                !strcmp(role, "assistant") && !json_is_false(json_object_get(m, "train"));
            put_message(x, role, content, trained);
        }
        return;
    }
    json_t *system = json_object_get(root, "system");
    if (system)
        put_message(x, "system", json_string_value(system), false);
    put_message(x, "user", json_string_value(json_object_get(root, "prompt")), false);
    put_message(x, "assistant", json_string_value(json_object_get(root, "completion")), true);
}

/* Lines with tools or tool calls render a tools block and calls (chat_tools.c, checked
 * against Jinja elsewhere); the reference skips them. */
static bool uses_tools(json_t *root)
{
    if (json_object_get(root, "tools"))
        return true;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(root, "messages"), i, m)
    {
        if (json_object_get(m, "tool_calls"))
            return true;
    }
    return false;
}

static void check_reference(const struct lt_tokenizer *t, const struct lt_dataset *d,
                            const char *jsonl, size_t len)
{
    int index = 0;
    for (size_t p = 0; p < len;) {
        const char *s = jsonl + p;
        const char *nl = memchr(s, '\n', len - p);
        size_t ll = nl ? (size_t)(nl - s) : len - p;
        p += ll + (nl ? 1 : 0);
        size_t b = 0;
        while (b < ll && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r'))
            b++;
        if (b == ll)
            continue;
        json_t *root = json_loadb(s, ll, JSON_REJECT_DUPLICATES, NULL);
        if (!root || index >= d->n)
            __builtin_trap();
        const struct lt_example *e = &d->ex[index];
        if (e->source != index)
            __builtin_trap();
        if (uses_tools(root)) {
            json_decref(root);
            index++;
            continue;
        }
        struct expect x = {0};
        put(&x, "");
        expect_line(root, &x);
        json_decref(root);

        /* the tokens decode to the rendering; token k covers [at[k], at[k + 1]) */
        size_t *at = malloc(((size_t)e->n + 1) * sizeof(size_t));
        if (!at)
            __builtin_trap();
        at[0] = 0;
        for (int k = 0; k < e->n; k++) {
            size_t bl;
            const char *bytes = lt_tokenizer_token_bytes(t, e->tokens[k], &bl);
            if (!bytes || at[k] + bl > x.len || memcmp(x.text + at[k], bytes, bl))
                __builtin_trap();
            at[k + 1] = at[k] + bl;
        }
        if (at[e->n] != x.len)
            __builtin_trap();
        for (int k = 0; k + 1 < e->n && !x.too_many; k++) {
            bool want = false;
            for (size_t u = 0; u < x.n_turns; u++)
                want |= at[k + 1] < x.turns[u].end && at[k + 2] > x.turns[u].begin;
            if (want != (e->labels[k] >= 0))
                __builtin_trap();
        }
        free(at);
        free(x.text);
        index++;
    }
    if (index != d->n)
        __builtin_trap();
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!tok[0])
        build();
    if (size < 2)
        return 0;
    unsigned ctl = data[0];
    int which = (int)(ctl % TPL_COUNT);
    enum lt_fit_policy fit = (enum lt_fit_policy)((ctl / TPL_COUNT) % 3);
    const struct lt_tokenizer *t = tok[(ctl / (TPL_COUNT * 3)) % LT_PRETOK_COUNT];
    int window = 2 + 4 * data[1];
    size_t len = size - 2;
    char *jsonl = malloc(len ? len : 1); /* exact size: ASan sees any over-read */
    if (!jsonl)
        return 0;
    memcpy(jsonl, data + 2, len);

    struct lt_dataset d;
    memset(&d, 0xA5, sizeof(d));
    lt_status st = lt_dataset_chat(t, &tpl[which], jsonl, len, window, fit, &d);
    if (st != LT_OK) {
        if (lt_last_error()[0] == '\0' || (st != LT_ERR_FORMAT && st != LT_ERR_INVALID &&
                                           st != LT_ERR_NOMEM && st != LT_ERR_UNSUPPORTED))
            __builtin_trap();
        if (d.n != 0 || d.ex != NULL)
            __builtin_trap();
        free(jsonl);
        return 0;
    }

    if (d.n < 1 || d.window != window || d.n_fitted < 0 || d.n_fitted > d.n ||
        (fit == LT_FIT_NONE && d.n_fitted != 0))
        __builtin_trap();
    int64_t n_tokens = 0, n_loss = 0;
    for (int i = 0; i < d.n; i++) {
        check_example(&d.ex[i], window);
        if (i > 0 && d.ex[i].source <= d.ex[i - 1].source)
            __builtin_trap();
        n_tokens += d.ex[i].n;
        n_loss += d.ex[i].n_loss;
    }
    if (n_tokens != d.n_tokens || n_loss != d.n_loss)
        __builtin_trap();
#ifdef LATHE_HAVE_JANSSON
    if (which == TPL_CHATML && fit == LT_FIT_NONE)
        check_reference(t, &d, jsonl, len);
#endif
    lt_dataset_free(&d);
    free(jsonl);
    return 0;
}
