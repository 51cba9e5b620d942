/* fuzz_tool_calls.c: libFuzzer target for reading tool calls out of a model's output
 * (lt_chat_tool_parse) and for the stream's hold-back (lt_chat_tool_safe_len).
 *
 * Input: byte 0 picks the format (Qwen2.5's JSON blocks or Qwen3.5's XML); the rest is the
 * model's text. The tools are fixed: "f" (no parameters) and "g" (a string "s" and an
 * integer "n"). Any text must parse to LT_OK and either no call, with the whole text as
 * content, or calls that each name "f" or "g" and whose arguments are the JSON text of an
 * object, with content NULL or non-empty. The hold-back never passes a '<' that could begin
 * "<tool_call>". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/tokenizer.h"

#ifdef LATHE_HAVE_JANSSON
#include <jansson.h>
#endif

static const char tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":"
    "{\"name\":\"g\",\"parameters\":{\"type\":\"object\",\"properties\":{\"s\":{\"type\":"
    "\"string\"},\"n\":{\"type\":\"integer\"}}}}}]";

static void check_safe_len(const char *s, size_t n)
{
    size_t k = lt_chat_tool_safe_len(s, n);
    if (k > n || (k < n && s[k] != '<'))
        __builtin_trap();
    static const char open[] = "<tool_call>";
    for (size_t i = 0; i < k; i++) /* nothing shown could begin a block */
        if (s[i] == '<' && !memcmp(s + i, open, n - i < 11 ? n - i : 11))
            __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    enum lt_chat_kind kind = data[0] & 1 ? LT_CHAT_QWEN35 : LT_CHAT_CHATML;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    check_safe_len(text, n);
    struct lt_chat_tool_output o;
    if (lt_chat_tool_parse(kind, tools, text, n, &o) != LT_OK)
        __builtin_trap();
    if (o.n_calls == 0 && (!o.content || strlen(o.content) != strnlen(text, n) ||
                           memcmp(o.content, text, strlen(o.content))))
        __builtin_trap();
    if (o.n_calls > 0 && o.content && !*o.content)
        __builtin_trap();
    for (size_t i = 0; i < o.n_calls; i++) {
        if (strcmp(o.calls[i].name, "f") && strcmp(o.calls[i].name, "g"))
            __builtin_trap();
#ifdef LATHE_HAVE_JANSSON
        json_t *a = json_loads(o.calls[i].arguments, JSON_ALLOW_NUL, NULL);
        if (!json_is_object(a))
            __builtin_trap();
        json_decref(a);
#endif
    }
    lt_chat_tool_output_free(&o);
    return 0;
}
