/* test_tokenizer_chat.c: chat template recognition and rendering against texts written out
 * by hand from the templates' Jinja, assistant spans in bytes and in tokens. (The Python
 * cross-check renders the same conversations with Jinja itself.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lathe/tokenizer.h"

/* SmolLM2-135M-Instruct's tokenizer.chat_template (real newlines inside the strings) */
static const char smollm_template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

/* Qwen2.5's default-system part (escaped newlines, before the message loop) */
static const char qwen25_template[] =
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>' + '\\n' }}{%- endfor %}";

static const char plain_chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";

static const char qwen35_like[] =
    "{%- for message in messages %}...{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is "
    "false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}<|im_end|>";

static const char llama3_template[] =
    "{{ '<|begin_of_text|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}{% endfor %}";

#define M(r, c)                                                                                    \
    {                                                                                              \
        .role = r, .content = c                                                                    \
    }

static void test_detect(void)
{
    struct lt_chat_template ct;
    CHECK(lt_chat_template_detect(smollm_template, "llama", &ct) == LT_OK);
    CHECK(ct.kind == LT_CHAT_CHATML && ct.default_system &&
          !strcmp(ct.default_system,
                  "You are a helpful AI assistant named SmolLM, trained by Hugging Face"));
    CHECK(!ct.default_system_if_empty);
    lt_chat_template_free(&ct);

    CHECK(lt_chat_template_detect(qwen25_template, "qwen2", &ct) == LT_OK);
    CHECK(ct.kind == LT_CHAT_CHATML && ct.default_system &&
          !strcmp(ct.default_system,
                  "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."));
    CHECK(ct.default_system_if_empty);
    lt_chat_template_free(&ct);

    CHECK(lt_chat_template_detect(plain_chatml, "qwen2", &ct) == LT_OK);
    CHECK(ct.kind == LT_CHAT_CHATML && !ct.default_system);
    lt_chat_template_free(&ct);

    CHECK(lt_chat_template_detect(qwen35_like, "qwen35", &ct) == LT_OK &&
          ct.kind == LT_CHAT_QWEN35);
    lt_chat_template_free(&ct);
    CHECK(lt_chat_template_detect(qwen35_like, "qwen3", &ct) == LT_ERR_UNSUPPORTED);
    CHECK(strstr(lt_last_error(), "qwen3") != NULL, "%s", lt_last_error());
    CHECK(lt_chat_template_detect(llama3_template, "llama", &ct) == LT_ERR_UNSUPPORTED);
    CHECK(strstr(lt_last_error(), "not ChatML") != NULL, "%s", lt_last_error());
    CHECK(lt_chat_template_detect(NULL, "qwen35", &ct) == LT_ERR_UNSUPPORTED);
    CHECK(ct.default_system == NULL); /* nothing to free after a failure */
}

static bool render_is(const struct lt_chat_template *ct, const struct lt_chat_message *m, size_t n,
                      bool gen, bool think, const char *want, struct lt_chat_render *keep)
{
    struct lt_chat_options o = {.add_generation_prompt = gen, .enable_thinking = think};
    struct lt_chat_render r;
    if (lt_chat_render(ct, m, n, &o, &r) != LT_OK) {
        fprintf(stderr, "render failed: %s\n", lt_last_error());
        return false;
    }
    bool ok = r.text.len == strlen(want) && !memcmp(r.text.data, want, r.text.len);
    if (!ok)
        fprintf(stderr, "rendered:\n%s\nexpected:\n%s\n", r.text.data, want);
    if (keep)
        *keep = r;
    else
        lt_chat_render_free(&r);
    return ok;
}

/* Every span must point at the right bytes: content equal to `content`, the turn right
 * after the assistant header and ending with <|im_end|>. */
static bool span_is(const struct lt_chat_render *r, size_t k, size_t message, const char *header,
                    const char *content)
{
    if (k >= r->n_spans)
        return false;
    const struct lt_chat_span *s = &r->spans[k];
    const char *t = r->text.data;
    size_t hl = strlen(header), cl = strlen(content);
    return s->message == message && s->turn_begin >= hl &&
           !memcmp(t + s->turn_begin - hl, header, hl) && s->content_end - s->content_begin == cl &&
           !memcmp(t + s->content_begin, content, cl) && s->turn_end >= 10 &&
           !memcmp(t + s->turn_end - 10, "<|im_end|>", 10) && s->turn_begin <= s->content_begin &&
           s->content_end <= s->turn_end;
}

static void test_chatml(void)
{
    struct lt_chat_template ct;
    CHECK(lt_chat_template_detect(smollm_template, "llama", &ct) == LT_OK);
    const char *sys = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                      "Hugging Face<|im_end|>\n";
    struct lt_chat_message m1[] = {M("user", "Hi")};
    char want[1024];
    snprintf(want, sizeof(want), "%s<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", sys);
    CHECK(render_is(&ct, m1, 1, true, false, want, NULL));
    snprintf(want, sizeof(want), "%s<|im_start|>user\nHi<|im_end|>\n", sys);
    CHECK(render_is(&ct, m1, 1, false, true, want, NULL)); /* enable_thinking means nothing here */
    /* SmolLM2's default system prompt lives in the loop: no messages, no system prompt */
    CHECK(render_is(&ct, NULL, 0, true, false, "<|im_start|>assistant\n", NULL));

    struct lt_chat_message m2[] = {M("system", "Be brief."), M("user", "2+2?"), M("assistant", "4"),
                                   M("user", "and 3+3?"), M("assistant", "6\n")};
    struct lt_chat_render r;
    CHECK(render_is(&ct, m2, 5, false, false,
                    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n"
                    "<|im_start|>assistant\n6\n<|im_end|>\n",
                    &r));
    CHECK(r.n_spans == 2);
    CHECK(span_is(&r, 0, 2, "<|im_start|>assistant\n", "4"));
    CHECK(span_is(&r, 1, 4, "<|im_start|>assistant\n", "6\n"));
    lt_chat_render_free(&r);
    lt_chat_template_free(&ct);

    /* SmolLM2 renders a tool message like any other role */
    struct lt_chat_message m3[] = {M("user", "u"), M("tool", "42")};
    CHECK(lt_chat_template_detect(smollm_template, "llama", &ct) == LT_OK && !ct.tool_responses);
    snprintf(want, sizeof(want),
             "%s<|im_start|>user\nu<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n", sys);
    CHECK(render_is(&ct, m3, 2, false, false, want, NULL));
    lt_chat_template_free(&ct);

    /* Qwen2.5: the default system prompt comes before the loop, so even with no messages */
    CHECK(lt_chat_template_detect(qwen25_template, "qwen2", &ct) == LT_OK);
    CHECK(render_is(&ct, NULL, 0, true, false,
                    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                    "assistant.<|im_end|>\n<|im_start|>assistant\n",
                    NULL));
    lt_chat_template_free(&ct);
    /* ... and with Qwen's tool blocks in the template, tool results go in a user turn */
    char with_tools[sizeof(qwen25_template) + 64];
    snprintf(with_tools, sizeof(with_tools), "%s{{- '\\n<tool_response>\\n' }}", qwen25_template);
    CHECK(lt_chat_template_detect(with_tools, "qwen2", &ct) == LT_OK && ct.tool_responses);
    struct lt_chat_message m4[] = {M("system", "S"), M("tool", "1"), M("tool", "2"),
                                   M("user", "u")};
    CHECK(render_is(&ct, m4, 4, false, false,
                    "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n<tool_response>\n1\n"
                    "</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n"
                    "<|im_start|>user\nu<|im_end|>\n",
                    NULL));
    lt_chat_template_free(&ct);
}

static void test_qwen35(void)
{
    struct lt_chat_template ct;
    CHECK(lt_chat_template_detect(qwen35_like, "qwen35", &ct) == LT_OK);
    struct lt_chat_message m1[] = {M("user", "q")};
    /* lathe's default: thinking off, an empty think block */
    CHECK(render_is(&ct, m1, 1, true, false,
                    "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
                    NULL));
    CHECK(render_is(&ct, m1, 1, true, true,
                    "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n", NULL));

    /* history: reasoning is kept only after the last user query; the last assistant turn
     * always gets a think block */
    struct lt_chat_message m2[] = {M("system", "S"), M("user", "q1"),
                                   M("assistant", "<think>\nr1\n</think>\n\nA1"), M("user", "q2"),
                                   M("assistant", "\n\nA2")};
    struct lt_chat_render r;
    CHECK(render_is(&ct, m2, 5, false, false,
                    "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n"
                    "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n",
                    &r));
    CHECK(r.n_spans == 2);
    CHECK(span_is(&r, 0, 2, "<|im_start|>assistant\n", "A1"));
    CHECK(span_is(&r, 1, 4, "<|im_start|>assistant\n", "A2"));
    /* the turn includes the think block, the content does not */
    CHECK(r.n_spans == 2 &&
          r.spans[1].content_begin - r.spans[1].turn_begin == strlen("<think>\n\n</think>\n\n"));
    lt_chat_render_free(&r);

    /* reasoning given apart, and a non-final turn after the query with reasoning */
    struct lt_chat_message m3[] = {M("user", "q"), M("assistant", "call it"), M("tool", "42"),
                                   M("tool", "43"), M("assistant", "done")};
    m3[1].reasoning = "\nneed a tool\n";
    CHECK(render_is(&ct, m3, 5, false, false,
                    "<|im_start|>user\nq<|im_end|>\n"
                    "<|im_start|>assistant\n<think>\nneed a tool\n</think>\n\ncall it<|im_end|>\n"
                    "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n43\n"
                    "</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n\n</think>\n\ndone<|im_end|>\n",
                    NULL));
    /* a non-final assistant turn after the query without reasoning: no think block */
    struct lt_chat_message m4[] = {M("user", "q"), M("assistant", "a1"), M("assistant", "a2")};
    CHECK(render_is(&ct, m4, 3, false, false,
                    "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n\n</think>\n\na2<|im_end|>\n",
                    NULL));
    struct lt_chat_message bad[] = {M("user", "q"), M("narrator", "x")};
    struct lt_chat_options o = {0};
    CHECK(lt_chat_render(&ct, bad, 2, &o, &r) == LT_ERR_INVALID && r.text.data == NULL);
    CHECK(strstr(lt_last_error(), "narrator") != NULL);
    struct lt_chat_message nul[] = {{.role = "user", .content = NULL}};
    CHECK(lt_chat_render(&ct, nul, 1, &o, &r) == LT_ERR_INVALID);
    lt_chat_template_free(&ct);
}

/* ---- spans in tokens, on a small byte-level vocabulary ---- */

static char byte_text[256][4];

/* 256 byte tokens, 4 merged tokens, then <|im_start|> (264), <|im_end|> (265), <think>,
 * </think> */
static struct lt_tokenizer *small_tokenizer(void)
{
    static const char *tokens[256 + 8];
    static int32_t types[256 + 8];
    static const char *const merges[] = {"a b", "ab c", "Ċ Ċ", "Ġ a"};
    static const char *const more[] = {"ab",           "abc",        "ĊĊ",      "Ġa",
                                       "<|im_start|>", "<|im_end|>", "<think>", "</think>"};
    unsigned next = 256;
    for (unsigned b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        unsigned cp = keep ? b : next++;
        char *s = byte_text[b];
        if (cp < 0x80) {
            s[0] = (char)cp;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
        }
        tokens[b] = s;
        types[b] = LT_TOKEN_TYPE_NORMAL;
    }
    for (size_t i = 0; i < 8; i++) {
        tokens[256 + i] = more[i];
        types[256 + i] = i < 4   ? LT_TOKEN_TYPE_NORMAL
                         : i < 6 ? LT_TOKEN_TYPE_CONTROL
                                 : LT_TOKEN_TYPE_USER_DEFINED;
    }
    struct lt_vocab_desc d = {.model = "gpt2",
                              .pre = "qwen35",
                              .n_tokens = 264,
                              .tokens = tokens,
                              .token_types = types,
                              .n_merges = 4,
                              .merges = merges,
                              .bos = LT_TOKEN_NONE,
                              .eos = 261,
                              .eot = LT_TOKEN_NONE,
                              .eom = LT_TOKEN_NONE,
                              .pad = LT_TOKEN_NONE,
                              .unk = LT_TOKEN_NONE};
    struct lt_tokenizer *t = NULL;
    lt_status st = lt_tokenizer_init(&d, &t);
    CHECK(st == LT_OK || st == LT_ERR_UNSUPPORTED, "%s", lt_last_error());
    return t;
}

static void test_token_spans(void)
{
    struct lt_tokenizer *t = small_tokenizer();
    if (!t)
        return; /* no PCRE2 in this build */
    struct lt_chat_template ct;
    CHECK(lt_chat_template_detect(qwen35_like, "qwen35", &ct) == LT_OK);
    struct lt_chat_message m[] = {M("user", "abc"), M("assistant", "\n\nab abc"), M("user", "c"),
                                  M("assistant", "")};
    struct lt_chat_options o = {0};
    struct lt_chat_render r;
    CHECK(lt_chat_render(&ct, m, 4, &o, &r) == LT_OK);
    struct lt_tokens tk = {0};
    struct lt_chat_token_span spans[2];
    CHECK(r.n_spans == 2);
    CHECK(lt_chat_tokenize(t, &r, &tk, spans) == LT_OK);
    /* the reference: each token's byte range from its bytes' lengths, then the tokens that
     * overlap each byte span, by brute force */
    size_t *offs = malloc((tk.n + 1) * sizeof(size_t));
    offs[0] = 0;
    for (size_t i = 0; i < tk.n; i++) {
        size_t len;
        lt_tokenizer_token_bytes(t, tk.ids[i], &len);
        offs[i + 1] = offs[i] + len;
    }
    CHECK(offs[tk.n] == r.text.len);
    for (size_t s = 0; s < r.n_spans && s < 2; s++) {
        size_t bounds[2][2] = {{r.spans[s].turn_begin, r.spans[s].turn_end},
                               {r.spans[s].content_begin, r.spans[s].content_end}};
        size_t got[2][2] = {{spans[s].turn_begin, spans[s].turn_end},
                            {spans[s].content_begin, spans[s].content_end}};
        for (int k = 0; k < 2; k++) {
            size_t first = tk.n, last = 0;
            for (size_t i = 0; i < tk.n; i++)
                if (offs[i] < bounds[k][1] && offs[i + 1] > bounds[k][0]) {
                    if (first == tk.n)
                        first = i;
                    last = i + 1;
                }
            if (first == tk.n) /* an empty span: an empty token range */
                CHECK(got[k][0] == got[k][1], "span %zu/%d: %zu..%zu", s, k, got[k][0], got[k][1]);
            else
                CHECK(got[k][0] == first && got[k][1] == last,
                      "span %zu/%d: %zu..%zu, want %zu..%zu", s, k, got[k][0], got[k][1], first,
                      last);
        }
        /* the turn's tokens end with <|im_end|> */
        CHECK(spans[s].turn_end > 0 && tk.ids[spans[s].turn_end - 1] == 261);
    }
    free(offs);
    lt_tokens_free(&tk);
    lt_chat_render_free(&r);
    lt_chat_template_free(&ct);
    lt_tokenizer_free(t);
}

/* ---- tools (the Jinja parity of the rendering: tests/py/test_tokenizer_cross.py) ---- */

static const char tools_json[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
    "{\"type\": \"integer\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": \"f\"}}]";

/* Parses text as kind's output; returns the number of calls (content and calls in o). */
static size_t parse(enum lt_chat_kind kind, const char *text, struct lt_chat_tool_output *o)
{
    CHECK(lt_chat_tool_parse(kind, tools_json, text, strlen(text), o) == LT_OK, "%s",
          lt_last_error());
    return o->n_calls;
}

static void test_tool_parse(void)
{
    struct lt_chat_tool_output o;
    const char *one = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                      "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
    CHECK(parse(LT_CHAT_CHATML, one, &o) == 1 && !strcmp(o.calls[0].name, "get_weather") &&
              !strcmp(o.calls[0].arguments, "{\"city\": \"Paris\", \"days\": 2}") && o.content &&
              !strcmp(o.content, "Let me look."),
          "%zu calls, content %s", o.n_calls, o.content ? o.content : "(null)");
    lt_chat_tool_output_free(&o);
    /* two calls, the last unclosed (the model stopped), one missing its final brace,
     * arguments given as JSON text */
    const char *two = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                      "\"{\\\"city\\\": \\\"Rome\\\"}\"\n";
    CHECK(parse(LT_CHAT_CHATML, two, &o) == 2 && !o.content && !strcmp(o.calls[0].name, "f") &&
              !strcmp(o.calls[0].arguments, "{}") &&
              !strcmp(o.calls[1].arguments, "{\"city\": \"Rome\"}"),
          "%zu calls", o.n_calls);
    lt_chat_tool_output_free(&o);
    /* not calls: no block, a block that is no JSON, a name not among the tools, arguments
     * that are no object; the whole text comes back as content */
    const char *bad[] = {"plain answer", "<tool_call>\nnot json\n</tool_call>",
                         "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>",
                         "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
                         "ok <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> and "
                         "<tool_call>{bad</tool_call>"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK(parse(LT_CHAT_CHATML, bad[i], &o) == 0 && o.content && !strcmp(o.content, bad[i]),
              "case %zu: %zu calls", i, o.n_calls);
        lt_chat_tool_output_free(&o);
    }
    /* an open last block: the call, then what the model wrote on is content */
    const char *open = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n{\"name\": ";
    CHECK(parse(LT_CHAT_CHATML, open, &o) == 1 && !strcmp(o.calls[0].arguments, "{\"a\": 1}") &&
              o.content && !strcmp(o.content, "{\"name\":"),
          "%zu calls, content %s", o.n_calls, o.content ? o.content : "(null)");
    lt_chat_tool_output_free(&o);
    /* SmolLM2's way: the call's closing brace dropped, then more text */
    const char *nobrace =
        "<tool_call>\n{\"name\": \"f\", \"arguments\": \n{\"a\": {\"b\": [1]}}\n{\"x\"";
    CHECK(parse(LT_CHAT_CHATML, nobrace, &o) == 1 &&
              !strcmp(o.calls[0].arguments, "{\"a\": {\"b\": [1]}}") && o.content &&
              !strcmp(o.content, "{\"x\""),
          "%zu calls, content %s", o.n_calls, o.content ? o.content : "(null)");
    lt_chat_tool_output_free(&o);
    /* a closed block holds one call and nothing else */
    CHECK(parse(LT_CHAT_CHATML, "<tool_call>{\"name\": \"f\", \"arguments\": {}} x</tool_call>",
                &o) == 0,
          "text after the call inside a closed block");
    lt_chat_tool_output_free(&o);
    /* Qwen3.5's XML: a string parameter stays a string, others are read as JSON */
    const char *xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n"
                      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    CHECK(parse(LT_CHAT_QWEN35, xml, &o) == 1 &&
              !strcmp(o.calls[0].arguments, "{\"city\": \"42\", \"days\": 3}"),
          "%s", o.n_calls ? o.calls[0].arguments : "no call");
    lt_chat_tool_output_free(&o);
    CHECK(parse(LT_CHAT_QWEN35, "<tool_call>\n<function=get_weather>\n<parameter=city>\nx", &o) ==
              0,
          "an unclosed parameter is no call");
    lt_chat_tool_output_free(&o);
    CHECK(lt_chat_tool_parse(LT_CHAT_CHATML, "{\"a\": 1}", "x", 1, &o) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "tools: must be an array"),
          "%s", lt_last_error());
}

static void test_tool_stream_prefill(void)
{
    const char *t = "abc <tool";
    CHECK(lt_chat_tool_safe_len(t, strlen(t)) == 4, "a possible start is held");
    CHECK(lt_chat_tool_safe_len("a <b> <tool_call> x", 19) == 6, "up to the block");
    CHECK(lt_chat_tool_safe_len("a < b", 5) == 5, "'<' then no tag");
    struct lt_strbuf b = {0};
    CHECK(lt_chat_tool_prefill(LT_CHAT_CHATML, "f", &b) == LT_OK && b.len &&
          !strcmp(b.data, "<tool_call>\n{\"name\": \"f\", \"arguments\": "));
    lt_strbuf_free(&b);
    CHECK(lt_chat_tool_prefill(LT_CHAT_QWEN35, NULL, &b) == LT_OK && b.len &&
          !strcmp(b.data, "<tool_call>\n<function="));
    lt_strbuf_free(&b);
}

/* lathe's generic format on a ChatML template without tool blocks (SmolLM2's). */
static void test_tool_render_generic(void)
{
    struct lt_chat_template ct;
    CHECK(lt_chat_template_detect(smollm_template, "llama", &ct) == LT_OK);
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                        "{\"x\":[0.5,1e20,100.0,1e-7,\"é\\u0001\"]}}}]";
    struct lt_chat_message m[] = {
        M("user", "q"),
        {.role = "assistant",
         .content = "",
         .tool_calls = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                       "\"arguments\":\"{\\\"x\\\":1}\"}}]"},
        M("tool", "r")};
    struct lt_chat_options o = {.add_generation_prompt = true, .tools = tools};
    struct lt_chat_render r;
    CHECK(lt_chat_render(&ct, m, 3, &o, &r) == LT_OK, "%s", lt_last_error());
    const char *want =
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
        "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
        "{\"x\": [0.5, 1e+20, 100.0, 1e-07, \"é\\u0001\"]}}}\n</tools>\n\nFor each function "
        "call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
        "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nq<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n"
        "</tool_call><|im_end|>\n<|im_start|>tool\nr<|im_end|>\n<|im_start|>assistant\n";
    CHECK(r.text.data && !strcmp(r.text.data, want), "got\n%s", r.text.data);
    CHECK(r.n_spans == 1 && r.spans[0].message == 1, "one assistant span");
    lt_chat_render_free(&r);
    /* an empty tools array is no tools (the templates' `if tools`) */
    struct lt_chat_render r0, r1;
    CHECK(lt_chat_render(&ct, m, 1, &(struct lt_chat_options){.tools = " [ ] "}, &r0) == LT_OK &&
          lt_chat_render(&ct, m, 1, NULL, &r1) == LT_OK && !strcmp(r0.text.data, r1.text.data));
    lt_chat_render_free(&r0);
    lt_chat_render_free(&r1);
    /* a named prefill escapes the name as JSON */
    struct lt_strbuf b = {0};
    CHECK(lt_chat_tool_prefill(LT_CHAT_CHATML, "a\"b", &b) == LT_OK && b.len &&
          !strcmp(b.data, "<tool_call>\n{\"name\": \"a\\\"b\", \"arguments\": "));
    lt_strbuf_free(&b);
    /* malformed tool calls and tools are refused, naming the field */
    m[1].tool_calls = "[{\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]";
    CHECK(lt_chat_render(&ct, m, 3, &o, &r) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "tool_calls[0].function.arguments"),
          "%s", lt_last_error());
    o.tools = "[{\"type\":\"function\",\"function\":{\"description\":\"d\"}}]";
    CHECK(lt_chat_render(&ct, m, 1, &o, &r) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "tools[0].function.name"),
          "%s", lt_last_error());
    lt_chat_template_free(&ct);
}

int main(void)
{
    test_detect();
    test_chatml();
    test_qwen35();
    test_token_spans();
    test_tool_parse();
    test_tool_stream_prefill();
    test_tool_render_generic();
    return check_summary();
}
