/* test_train_dataset.c: training data: plain-text windows (overlap by half, every target
 * trained exactly once), chat examples (loss only on assistant turns, "train": false turns
 * as context), fit policies, refusals naming the example or line, and the seeded split.
 * The tokenizer is tests/test_train_tiny.h's (one token per byte), so the expected token
 * and label sequences are written out by hand here. */
#include <string.h>

#include "check.h"
#include "lathe/sampling.h"
#include "test_train_tiny.h"
#include "train/dataset.h"

/* ---- expected sequences, built piece by piece ---- */

struct seq {
    int32_t tok[1024];
    bool trained[1024];
    int n;
};

static void put_text(struct seq *s, const char *text, bool trained)
{
    for (const char *c = text; *c; c++) {
        s->tok[s->n] = (unsigned char)*c;
        s->trained[s->n++] = trained;
    }
}

static void put_tok(struct seq *s, int32_t id, bool trained)
{
    s->tok[s->n] = id;
    s->trained[s->n++] = trained;
}

/* One ChatML message; an assistant turn's content and closing marker carry loss if trained. */
static void put_msg(struct seq *s, const char *role, const char *content, bool trained)
{
    put_tok(s, TINY_IM_START, false);
    put_text(s, role, false);
    put_text(s, "\n", false);
    put_text(s, content, trained);
    put_tok(s, TINY_IM_END, trained);
    put_text(s, "\n", false);
}

/* Does example e equal s[from..from+e->n) with the labels the rule gives? */
static bool same_as(const struct lt_example *e, const struct seq *s, int from)
{
    if (from + e->n > s->n)
        return false;
    for (int i = 0; i < e->n; i++) {
        int k = from + i;
        int32_t want = k + 1 < s->n && s->trained[k + 1] ? s->tok[k + 1] : -1;
        if (e->tokens[i] != s->tok[k] || e->labels[i] != want) {
            fprintf(stderr, "position %d: token %d label %d, want %d %d\n", i, e->tokens[i],
                    e->labels[i], s->tok[k], want);
            return false;
        }
    }
    return true;
}

static struct lt_tokenizer *tok;
static struct lt_chat_template ct;

static lt_status chat(const char *jsonl, int window, enum lt_fit_policy fit, struct lt_dataset *d)
{
    return lt_dataset_chat(tok, &ct, jsonl, strlen(jsonl), window, fit, d);
}

static void test_text_windows(void)
{
    char text[101];
    for (int i = 0; i < 100; i++)
        text[i] = (char)('a' + (i * 7) % 26);
    text[100] = 0;
    const int W = 16, N = 100;
    struct lt_dataset d;
    CHECK(lt_dataset_text(tok, text, 100, W, &d) == LT_OK, "%s", lt_last_error());
    int times[100] = {0};
    bool ok_tokens = true, ok_labels = true, ok_context = true, ok_len = true;
    for (int k = 0; k < d.n; k++) {
        const struct lt_example *e = &d.ex[k];
        ok_len = ok_len && e->n >= 1 && e->n <= W;
        for (int i = 0; i < e->n; i++) {
            int at = k * (W / 2) + i; /* windows start every W/2 tokens */
            ok_tokens = ok_tokens && e->tokens[i] == (unsigned char)text[at];
            if (e->labels[i] >= 0) {
                ok_labels = ok_labels && e->labels[i] == (unsigned char)text[at + 1];
                times[at + 1]++;
            } else {
                ok_context = ok_context && k > 0 && i < W / 2;
            }
        }
    }
    CHECK(ok_len, "window lengths");
    CHECK(ok_tokens, "windows start every %d tokens", W / 2);
    CHECK(ok_labels, "labels are the next token");
    CHECK(ok_context, "only the overlap of later windows is context");
    int once = 0;
    for (int t = 1; t < N; t++)
        once += times[t] == 1;
    CHECK(once == N - 1 && times[0] == 0, "every target trained exactly once (%d of %d)", once,
          N - 1);
    CHECK(d.n_loss == N - 1, "n_loss %lld", (long long)d.n_loss);
    CHECK(d.ex[0].n == W && d.ex[0].n_loss == W, "the first window is all loss");
    lt_dataset_free(&d);

    CHECK(lt_dataset_text(tok, "x", 1, W, &d) == LT_ERR_INVALID, "one token is too little");
    CHECK(strstr(lt_last_error(), "at least 2") != NULL, "%s", lt_last_error());
    /* a text shorter than the window: one window of all its tokens */
    CHECK(lt_dataset_text(tok, "hello", 5, W, &d) == LT_OK && d.n == 1 && d.ex[0].n == 4,
          "short text: %d windows", d.n);
    lt_dataset_free(&d);

    /* parse_special (/train's "parse_special": true): "<|im_end|>" is one token, not 10 */
    static const char sp[] = "ab<|im_end|>cd";
    CHECK(lt_dataset_text(tok, sp, strlen(sp), W, &d) == LT_OK && d.n == 1 &&
              d.ex[0].n == (int)strlen(sp) - 1,
          "as text: %d tokens", d.n ? d.ex[0].n : -1);
    lt_dataset_free(&d);
    CHECK(lt_dataset_text_flags(tok, sp, strlen(sp), W, LT_TOKENIZE_PARSE_SPECIAL, &d) == LT_OK &&
              d.n == 1 && d.ex[0].n == 4 && d.ex[0].labels[1] == TINY_IM_END &&
              d.ex[0].tokens[2] == TINY_IM_END,
          "parsed: %d tokens", d.n ? d.ex[0].n : -1);
    lt_dataset_free(&d);
}

static void test_chat_masks(void)
{
    struct lt_dataset d;
    lt_status st = chat("{\"prompt\": \"Hi?\", \"completion\": \"Yo.\"}\n"
                        "\n"
                        "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"},"
                        " {\"role\": \"user\", \"content\": \"a\"},"
                        " {\"role\": \"assistant\", \"content\": \"b\", \"train\": false},"
                        " {\"role\": \"user\", \"content\": \"c\"},"
                        " {\"role\": \"assistant\", \"content\": \"dd\"}]}\n"
                        "{\"system\": \"Be brief.\", \"prompt\": \"Q\", \"completion\": \"A\"}",
                        256, LT_FIT_NONE, &d);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st != LT_OK)
        return;
    CHECK(d.n == 3, "3 examples, not %d", d.n);
    struct seq a = {0}, b = {0}, c = {0};
    put_msg(&a, "user", "Hi?", false);
    put_msg(&a, "assistant", "Yo.", true);
    CHECK(d.n >= 1 && d.ex[0].n == a.n && same_as(&d.ex[0], &a, 0), "prompt/completion");
    CHECK(d.ex[0].n_loss == 4, "loss on 'Yo.' and <|im_end|>: %d", d.ex[0].n_loss);
    put_msg(&b, "system", "S", false);
    put_msg(&b, "user", "a", false);
    put_msg(&b, "assistant", "b", false); /* train: false */
    put_msg(&b, "user", "c", false);
    put_msg(&b, "assistant", "dd", true);
    CHECK(d.n >= 2 && d.ex[1].n == b.n && same_as(&d.ex[1], &b, 0), "messages, train false");
    CHECK(d.ex[1].source == 1, "source index %d (blank lines don't count)", d.ex[1].source);
    put_msg(&c, "system", "Be brief.", false);
    put_msg(&c, "user", "Q", false);
    put_msg(&c, "assistant", "A", true);
    CHECK(d.n >= 3 && d.ex[2].n == c.n && same_as(&d.ex[2], &c, 0), "system + prompt/completion");
    lt_dataset_free(&d);
}

static void test_chat_refusals(void)
{
    struct lt_dataset d;
    const char *two = "{\"prompt\": \"a\", \"completion\": \"b\"}\n"
                      "{\"prompt\": \"a long question here\", \"completion\": \"a long answer\"}\n";
    CHECK(chat(two, 24, LT_FIT_NONE, &d) == LT_ERR_INVALID, "too long");
    CHECK(strstr(lt_last_error(), "example 1 (line 2)") && strstr(lt_last_error(), "window of 24"),
          "%s", lt_last_error());
    CHECK(d.n == 0 && d.ex == NULL, "nothing kept after a refusal");

    CHECK(chat("{\"prompt\": \"a\", \"completion\": \"b\"}\n\n{\"prompt\": 1}\n", 64, LT_FIT_NONE,
               &d) == LT_ERR_FORMAT &&
              strstr(lt_last_error(), "line 3"),
          "%s", lt_last_error());
    CHECK(chat("{\"messages\": [{\"role\": \"user\"}]}", 64, LT_FIT_NONE, &d) == LT_ERR_FORMAT &&
              strstr(lt_last_error(), "message 0 has no \"content\""),
          "%s", lt_last_error());
    CHECK(chat("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": "
               "\"assistant\", \"content\": \"y\", \"train\": false}]}",
               64, LT_FIT_NONE, &d) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "nothing to train on"),
          "%s", lt_last_error());
    CHECK(chat("{\"prompt\": \"a\", \"completion\": \"b\"", 64, LT_FIT_NONE, &d) == LT_ERR_FORMAT &&
              strstr(lt_last_error(), "line 1"),
          "%s", lt_last_error());
    CHECK(chat("\n\n", 64, LT_FIT_NONE, &d) == LT_ERR_INVALID, "no example");
}

/* The first position where e's tokens are the bytes of s, or -1. */
static int find_bytes(const struct lt_example *e, const char *s)
{
    int n = (int)strlen(s);
    for (int i = 0; i + n <= e->n; i++) {
        int j = 0;
        while (j < n && e->tokens[i + j] == (unsigned char)s[j])
            j++;
        if (j == n)
            return i;
    }
    return -1;
}

/* Per-example tools (issue 17 item 3): rendered into the system turn through the template
 * (the tiny model's ChatML has no tool blocks: lathe's generic format, Qwen2.5's), an
 * assistant's tool call trained like any assistant turn; a non-array refused. */
static void test_chat_tools(void)
{
    struct lt_dataset d;
    const char *ex =
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"add\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
        "\"integer\"}}}}}], \"messages\": [{\"role\": \"user\", \"content\": \"1+1?\"}, "
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\", "
        "\"function\": {\"name\": \"add\", \"arguments\": \"{\\\"a\\\":1}\"}}]}, {\"role\": "
        "\"tool\", \"content\": \"2\"}, {\"role\": \"assistant\", \"content\": \"2\"}]}\n";
    CHECK(chat(ex, 2048, LT_FIT_NONE, &d) == LT_OK && d.n == 1, "%s", lt_last_error());
    if (d.n != 1)
        return;
    const struct lt_example *e = &d.ex[0];
    struct lt_strbuf text = {0};
    CHECK(lt_detokenize(tok, (const lt_token *)e->tokens, (size_t)e->n, LT_DETOKENIZE_SPECIAL,
                        &text) == LT_OK &&
          lt_strbuf_append(&text, "", 0) == LT_OK);
    const char *block =
        "<|im_start|>system\n\n\n# Tools\n\nYou may call one or more functions to assist with "
        "the user query.\n\nYou are provided with function signatures within <tools></tools> "
        "XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"add\", "
        "\"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
        "\"integer\"}}}}}\n</tools>\n\nFor each function call, return a json object with "
        "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
        "<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n";
    const char *call = "<|im_start|>assistant\n<tool_call>\n{\"name\": \"add\", \"arguments\": "
                       "{\"a\": 1}}\n</tool_call><|im_end|>\n<|im_start|>tool\n2<|im_end|>\n";
    CHECK(text.data && !strncmp(text.data, block, strlen(block)), "rendered\n%s", text.data);
    const char *at = text.data ? strstr(text.data, call) : NULL;
    CHECK(at != NULL, "the call's turn is not in\n%s", text.data);
    /* the call's "<tool_call>" carries loss (one token per byte) */
    int k = find_bytes(e, "assistant\n<tool_call>");
    k = k < 0 ? -1 : k + (int)strlen("assistant\n");
    CHECK(k > 0 && e->labels[k - 1] == '<' && e->labels[k] == 't', "the call is not trained (%d)",
          k);
    lt_strbuf_free(&text);
    lt_dataset_free(&d);

    CHECK(chat("{\"tools\": {\"name\": \"add\"}, \"prompt\": \"a\", \"completion\": \"b\"}\n", 2048,
               LT_FIT_NONE, &d) == LT_ERR_FORMAT &&
              strstr(lt_last_error(), "example 0 (line 1)") &&
              strstr(lt_last_error(), "\"tools\" must be an array"),
          "%s", lt_last_error());
    CHECK(chat("{\"tools\": [{\"type\": \"function\", \"function\": {}}], \"prompt\": \"a\", "
               "\"completion\": \"b\"}\n",
               2048, LT_FIT_NONE, &d) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "tools[0].function.name"),
          "%s", lt_last_error());
    CHECK(chat("{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
               "\"assistant\", \"content\": null, \"tool_calls\": [{\"function\": {\"name\": "
               "\"add\", \"arguments\": \"[1]\"}}]}]}\n",
               2048, LT_FIT_NONE, &d) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "tool_calls[0].function.arguments"),
          "%s", lt_last_error());
}

static void test_fit(void)
{
    struct lt_dataset d;
    const char *conv =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"},"
        " {\"role\": \"user\", \"content\": \"u1\"},"
        " {\"role\": \"assistant\", \"content\": \"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"},"
        " {\"role\": \"user\", \"content\": \"u2\"},"
        " {\"role\": \"assistant\", \"content\": \"b\"},"
        " {\"role\": \"user\", \"content\": \"u3\"},"
        " {\"role\": \"assistant\", \"content\": \"c\"}]}";
    struct seq full = {0}, last2 = {0}, last1 = {0};
    put_msg(&full, "system", "S", false);
    put_msg(&full, "user", "u1", false);
    put_msg(&full, "assistant", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", true);
    put_msg(&last2, "system", "S", false);
    put_msg(&last1, "system", "S", false);
    put_msg(&full, "user", "u2", false);
    put_msg(&full, "assistant", "b", true);
    put_msg(&last2, "user", "u2", false);
    put_msg(&last2, "assistant", "b", true);
    put_msg(&full, "user", "u3", false);
    put_msg(&full, "assistant", "c", true);
    put_msg(&last2, "user", "u3", false);
    put_msg(&last2, "assistant", "c", true);
    put_msg(&last1, "user", "u3", false);
    put_msg(&last1, "assistant", "c", true);

    /* left: the `window` tokens that end where the last trained turn ends (its closing
     * marker's label is the last; the newline after it is dropped) */
    int stop = full.n - 2;
    int W = full.n - 10;
    CHECK(chat(conv, W, LT_FIT_LEFT, &d) == LT_OK, "%s", lt_last_error());
    CHECK(d.n == 1 && d.ex[0].n == W && same_as(&d.ex[0], &full, stop - W), "fit left");
    CHECK(d.n_fitted == 1 && d.n_skipped == 0, "fitted %d skipped %d", d.n_fitted, d.n_skipped);
    lt_dataset_free(&d);

    /* left, cut inside the long reply: what is kept of it is masked, the rest as before */
    int a0 = 0; /* the first 'A' */
    while (full.tok[a0] != 'A')
        a0++;
    int a_end = a0 + 30; /* its closing marker; labels a0 - 1 .. a_end - 1 train it */
    int start = a0 + 5;
    CHECK(chat(conv, stop - start, LT_FIT_LEFT, &d) == LT_OK, "%s", lt_last_error());
    bool masked = d.n == 1 && d.ex[0].n == stop - start;
    for (int i = 0; masked && i < d.ex[0].n; i++) {
        int k = start + i;
        int32_t want = k >= a_end ? (full.trained[k + 1] ? full.tok[k + 1] : -1) : -1;
        masked = d.ex[0].tokens[i] == full.tok[k] && d.ex[0].labels[i] == want;
    }
    CHECK(masked, "fit left masks the reply it cut at the front");
    CHECK(d.ex[0].n_loss == 4, "only b and c train: %d", d.ex[0].n_loss);
    lt_dataset_free(&d);

    /* left: an example whose last reply alone does not fit is skipped and counted */
    const char *longlast = "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"},"
                           " {\"role\": \"assistant\", \"content\": "
                           "\"BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
                           "BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB\"}]}";
    char two[2048];
    snprintf(two, sizeof(two), "%s\n%s\n", longlast, conv);
    CHECK(chat(two, W, LT_FIT_LEFT, &d) == LT_OK, "%s", lt_last_error());
    CHECK(d.n == 1 && d.n_skipped == 1 && d.n_fitted == 1 && d.ex[0].source == 1 &&
              same_as(&d.ex[0], &full, stop - W),
          "skipped %d fitted %d", d.n_skipped, d.n_fitted);
    lt_dataset_free(&d);
    CHECK(chat(longlast, 30, LT_FIT_LEFT, &d) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "no example fits the window of 30") &&
              strstr(lt_last_error(), "1 skipped"),
          "%s", lt_last_error());

    /* middle: drop the first exchange only */
    CHECK(chat(conv, last2.n, LT_FIT_MIDDLE, &d) == LT_OK, "%s", lt_last_error());
    CHECK(d.n == 1 && d.ex[0].n == last2.n && same_as(&d.ex[0], &last2, 0),
          "fit middle keeps system + last two exchanges");
    lt_dataset_free(&d);
    /* middle: room for the last exchange only (a window holds window + 1 tokens) */
    CHECK(chat(conv, last2.n - 2, LT_FIT_MIDDLE, &d) == LT_OK, "%s", lt_last_error());
    CHECK(d.n == 1 && d.ex[0].n == last1.n && same_as(&d.ex[0], &last1, 0),
          "fit middle keeps system + last exchange");
    lt_dataset_free(&d);
    /* middle: not even that: skipped, and with no other example, refused */
    snprintf(two, sizeof(two), "%s\n{\"prompt\": \"p\", \"completion\": \"q\"}\n", conv);
    CHECK(chat(two, last1.n - 2, LT_FIT_MIDDLE, &d) == LT_OK && d.n == 1 && d.n_skipped == 1 &&
              d.ex[0].source == 1,
          "fit middle skips what cannot fit: %s", lt_last_error());
    lt_dataset_free(&d);
    CHECK(chat(conv, last1.n - 2, LT_FIT_MIDDLE, &d) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "1 skipped") && strstr(lt_last_error(), "last exchange"),
          "%s", lt_last_error());
    /* window + 1 tokens fit with no policy: the last token (a newline after the closing
     * marker, only a target) goes, every label stays */
    CHECK(chat(conv, full.n - 1, LT_FIT_NONE, &d) == LT_OK && d.n == 1 && d.ex[0].n == full.n - 1 &&
              same_as(&d.ex[0], &full, 0) && d.n_fitted == 0 && d.ex[0].n_loss == 35,
          "window + 1 tokens: %s", lt_last_error());
    lt_dataset_free(&d);
    CHECK(chat(conv, full.n - 2, LT_FIT_NONE, &d) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "more than the window"),
          "window + 2 tokens: %s", lt_last_error());
    /* and a fitting example is left alone */
    CHECK(chat(conv, full.n, LT_FIT_MIDDLE, &d) == LT_OK && d.ex[0].n == full.n && d.n_fitted == 0,
          "no fit needed");
    lt_dataset_free(&d);
}

static void test_split(void)
{
    int *a, *b, *c, va, vb, vc;
    CHECK(lt_dataset_split(10, 0.2f, 7, &a, &va) == LT_OK, "split");
    CHECK(lt_dataset_split(10, 0.2f, 7, &b, &vb) == LT_OK, "split");
    CHECK(lt_dataset_split(10, 0.2f, 8, &c, &vc) == LT_OK, "split");
    CHECK(va == 2 && vb == 2, "n_val %d", va);
    int seen[10] = {0};
    for (int i = 0; i < 10; i++)
        seen[a[i]]++;
    bool perm = true;
    for (int i = 0; i < 10; i++)
        perm = perm && seen[i] == 1;
    CHECK(perm, "a permutation");
    CHECK(memcmp(a, b, sizeof(int) * 10) == 0, "same seed, same order");
    CHECK(memcmp(a, c, sizeof(int) * 10) != 0, "another seed, another order");
    free(a);
    free(b);
    free(c);
    CHECK(lt_dataset_split(10, 0.01f, 7, &a, &va) == LT_OK && va == 1, "at least one: %d", va);
    free(a);
    CHECK(lt_dataset_split(3, 0.9f, 7, &a, &va) == LT_OK && va == 2, "at most n-1: %d", va);
    free(a);
    CHECK(lt_dataset_split(5, 0, 7, &a, &va) == LT_OK && va == 0, "none: %d", va);
    free(a);
}

int main(void)
{
    char path[512];
    tiny_path(path, sizeof(path), "test_train_dataset.gguf");
    struct tiny_spec sp = {32, 4, 2, 64, 1, LT_TYPE_F32, 1};
    if (tiny_model_write(path, &sp) != 0)
        return 1;
    struct lt_gguf *g;
    CHECK(lt_gguf_open(path, &g) == LT_OK, "%s", lt_last_error());
    lt_status st = lt_tokenizer_from_gguf(g, &tok);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st == LT_OK)
        st = lt_chat_template_from_gguf(g, &ct);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st == LT_OK) {
        test_text_windows();
        test_chat_masks();
        test_chat_refusals();
        test_chat_tools();
        test_fit();
    }
    test_split();
    lt_chat_template_free(&ct);
    lt_tokenizer_free(tok);
    lt_gguf_close(g);
    remove(path);
    return check_summary();
}
