/* tokenizer.h: byte-level BPE tokenizers (GGUF tokenizer.ggml.model = "gpt2"), streaming
 * detokenization and chat templates.
 *
 * Encoding. Input is bytes, not necessarily valid UTF-8. It is cut, in order, into:
 *   1. special tokens (CONTROL and USER_DEFINED tokens, matched leftmost-longest), only when
 *      the caller passes LT_TOKENIZE_PARSE_SPECIAL; otherwise their text is ordinary text;
 *   2. maximal runs of valid UTF-8, and single bytes that do not start a valid UTF-8
 *      sequence (overlong forms, surrogates, stray continuation bytes, truncated sequences);
 *   3. the valid runs are split by the vocabulary's pre-tokenizer (tokenizer.ggml.pre), each
 *      run on its own, and every piece is encoded by BPE (lowest merge rank first, ties to
 *      the leftmost pair), exactly as Hugging Face `tokenizers` does for the same vocabulary,
 *      merges and pre-tokenizer.
 * An invalid byte becomes the single token of that byte (byte-level vocabularies have one
 * for every byte value), so no input byte is ever dropped or replaced: decoding the tokens
 * of any input gives back exactly its bytes. Unicode normalization is not applied: the Hugging
 * Face Qwen tokenizers normalize to NFC first, so for text that is not already NFC (rare:
 * decomposed accents) their ids differ unless the caller normalizes before encoding.
 * One exception, inherited from the vocabulary: a byte value it has no token for (SmolLM2
 * lacks 21, e.g. 0x04, 0xC0, 0xFF) encodes as its unknown token, as Hugging Face does, or,
 * when it has none, makes lt_tokenize fail; lt_tokenizer_missing_bytes lists them.
 *
 * Decoding. A token's bytes are its text mapped back through the byte-level alphabet for a
 * NORMAL token, and its text as it is for the others. CONTROL tokens (<|im_start|>, ...)
 * are rendered only with LT_DETOKENIZE_SPECIAL. A token may end inside a UTF-8 sequence:
 * lt_decode_stream holds such a tail back until it completes (or the stream is flushed).
 *
 * A tokenizer is immutable after it is built and may be shared between threads. */
#ifndef LATHE_TOKENIZER_H
#define LATHE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t lt_token;

#define LT_TOKEN_NONE (-1)

/* tokenizer.ggml.token_type values (llama.cpp's). */
enum lt_token_type {
    LT_TOKEN_TYPE_UNDEFINED = 0,
    LT_TOKEN_TYPE_NORMAL = 1,
    LT_TOKEN_TYPE_UNKNOWN = 2,
    LT_TOKEN_TYPE_CONTROL = 3,
    LT_TOKEN_TYPE_USER_DEFINED = 4,
    LT_TOKEN_TYPE_UNUSED = 5,
    LT_TOKEN_TYPE_BYTE = 6,
};

/* The pre-tokenizers lathe knows, by their tokenizer.ggml.pre names. */
enum lt_pretokenizer {
    LT_PRETOK_QWEN2,  /* "qwen2": Qwen2 / Qwen2.5 */
    LT_PRETOK_QWEN35, /* "qwen35": Qwen3.5 (letters include combining marks \p{M}) */
    LT_PRETOK_SMOLLM, /* "smollm": each digit alone, then GPT-2's split (SmolLM2, StarCoder) */
    LT_PRETOK_COUNT
};

/* NULL for an unknown name. */
const char *lt_pretokenizer_name(enum lt_pretokenizer p);

/* A vocabulary as plain arrays, for building a tokenizer without a GGUF file. Strings are
 * token texts as GGUF stores them (byte-level alphabet for NORMAL tokens: "Ġthe"). */
struct lt_vocab_desc {
    const char *model; /* "gpt2" (the only one supported) */
    const char *pre;   /* "qwen2", "qwen35", "smollm" */
    size_t n_tokens;
    const char *const *tokens;  /* [n_tokens] */
    const size_t *token_lens;   /* [n_tokens], or NULL: strlen */
    const int32_t *token_types; /* [n_tokens] enum lt_token_type, or NULL: all NORMAL */
    size_t n_merges;
    const char *const *merges;             /* [n_merges] "left right", rank = index */
    const size_t *merge_lens;              /* [n_merges], or NULL: strlen */
    lt_token bos, eos, eot, eom, pad, unk; /* LT_TOKEN_NONE when absent */
    bool add_bos;                          /* tokenizer.ggml.add_bos_token */
};

struct lt_tokenizer;
struct lt_gguf;

/* Builds a tokenizer. A vocabulary that lacks a token for some byte value, a merge naming
 * unknown tokens, or an unknown pre-tokenizer is LT_ERR_FORMAT; without PCRE2 in the build,
 * LT_ERR_UNSUPPORTED. */
lt_status lt_tokenizer_init(const struct lt_vocab_desc *desc, struct lt_tokenizer **out);
/* From a GGUF file's tokenizer.ggml.* metadata (general.architecture and
 * tokenizer.chat_template are read by lt_chat_template_from_gguf). */
lt_status lt_tokenizer_from_gguf(const struct lt_gguf *g, struct lt_tokenizer **out);
void lt_tokenizer_free(struct lt_tokenizer *t); /* NULL is fine */

size_t lt_tokenizer_n_tokens(const struct lt_tokenizer *t);
enum lt_pretokenizer lt_tokenizer_pre(const struct lt_tokenizer *t);
lt_token lt_tokenizer_bos(const struct lt_tokenizer *t);
lt_token lt_tokenizer_eos(const struct lt_tokenizer *t);
lt_token lt_tokenizer_eot(const struct lt_tokenizer *t);
lt_token lt_tokenizer_pad(const struct lt_tokenizer *t);
bool lt_tokenizer_add_bos(const struct lt_tokenizer *t);
/* End of generation: eos, eot, eom, and the control tokens <|im_end|>, <|endoftext|>. */
bool lt_tokenizer_is_eog(const struct lt_tokenizer *t, lt_token id);
enum lt_token_type lt_tokenizer_token_type(const struct lt_tokenizer *t, lt_token id);
/* The token's text as stored in the vocabulary (NUL-terminated), NULL when out of range. */
const char *lt_tokenizer_token_text(const struct lt_tokenizer *t, lt_token id, size_t *len);
/* The bytes the token stands for (see the top of this file), NULL when out of range. */
const char *lt_tokenizer_token_bytes(const struct lt_tokenizer *t, lt_token id, size_t *len);
/* The byte values the vocabulary has no token for, written to bytes[] (room for 256, or
 * NULL); returns how many. Zero for Qwen's vocabularies. */
size_t lt_tokenizer_missing_bytes(const struct lt_tokenizer *t, uint8_t *bytes);
/* Id of the token whose text is exactly s[0..len), or LT_TOKEN_NONE. */
lt_token lt_tokenizer_find(const struct lt_tokenizer *t, const char *s, size_t len);

/* ---- encoding ---- */

enum lt_tokenize_flags {
    LT_TOKENIZE_PARSE_SPECIAL = 1u << 0, /* recognise special tokens' text in the input */
    LT_TOKENIZE_ADD_BOS = 1u << 1,       /* prepend bos (an error when there is none) */
};

/* A growable list of tokens. With want_offsets set before the first call, offs[i] is the
 * byte offset in the input where token i starts (a token covers the bytes up to the next
 * token's offset; the bos token has offset 0 and covers nothing). */
struct lt_tokens {
    lt_token *ids;
    size_t *offs;
    size_t n, cap;
    bool want_offsets;
};

/* Appends the tokens of text[0..len) to out; offsets are relative to text. On failure
 * out->n is as it was. */
lt_status lt_tokenize(const struct lt_tokenizer *t, const char *text, size_t len, unsigned flags,
                      struct lt_tokens *out);
void lt_tokens_free(struct lt_tokens *tk);

/* Length of the valid UTF-8 sequence starting at s (1..4), 0 when s[0..n) does not start
 * with one (this is the rule that decides which bytes encode as lone byte tokens). */
size_t lt_utf8_seq_len(const unsigned char *s, size_t n);

/* ---- decoding ---- */

/* A growable byte string; data is NUL-terminated whenever cap > 0. */
struct lt_strbuf {
    char *data;
    size_t len, cap;
};
lt_status lt_strbuf_append(struct lt_strbuf *b, const void *bytes, size_t n);
void lt_strbuf_free(struct lt_strbuf *b);

enum lt_detokenize_flags {
    LT_DETOKENIZE_SPECIAL = 1u << 0, /* render CONTROL (and UNKNOWN/UNUSED) tokens' text */
};

/* Appends the bytes of ids[0..n) to out. An id out of range is LT_ERR_INVALID. */
lt_status lt_detokenize(const struct lt_tokenizer *t, const lt_token *ids, size_t n, unsigned flags,
                        struct lt_strbuf *out);

/* Streaming: push tokens one at a time; what is appended to `out` never ends inside a UTF-8
 * sequence that may still complete. Bytes that can never become valid UTF-8 are passed
 * through at once. The concatenation of everything appended, flush included, equals
 * lt_detokenize of all the tokens pushed. */
struct lt_decode_stream {
    const struct lt_tokenizer *tok;
    unsigned flags;
    unsigned char held[4];
    size_t n_held;
};
void lt_decode_stream_init(struct lt_decode_stream *s, const struct lt_tokenizer *t,
                           unsigned flags);
lt_status lt_decode_stream_push(struct lt_decode_stream *s, lt_token id, struct lt_strbuf *out);
/* Appends raw bytes (e.g. text already decoded) under the same hold-back rule. */
lt_status lt_decode_stream_push_bytes(struct lt_decode_stream *s, const char *bytes, size_t n,
                                      struct lt_strbuf *out);
/* Appends whatever is held back, complete or not, and resets the stream. */
lt_status lt_decode_stream_flush(struct lt_decode_stream *s, struct lt_strbuf *out);

/* ---- chat templates ----
 *
 * lathe renders the template families its models use natively instead of running Jinja:
 *   LT_CHAT_CHATML: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, generation prompt
 *     "<|im_start|>assistant\n"; with an optional default system message rendered first when
 *     the first message is not a system message (SmolLM2, Qwen2.5), and, when the template
 *     has Qwen's <tool_response> blocks, tool messages rendered as those (Qwen2.5);
 *   LT_CHAT_QWEN35: Qwen3.5's ChatML with thinking blocks: assistant turns after the last user
 *     query carry "<think>\nREASONING\n</think>\n\n"; the generation prompt is
 *     "<|im_start|>assistant\n<think>\n\n</think>\n\n" (thinking off, lathe's default) or
 *     "<|im_start|>assistant\n<think>\n" (enable_thinking).
 * Both render tools and tool calls (lt_chat_options.tools, lt_chat_message.tool_calls; the
 * formats are described with the tool functions below).
 * The family is recognised from tokenizer.chat_template and general.architecture; a template
 * that is not one of these is LT_ERR_UNSUPPORTED, never a guess. */

enum lt_chat_kind {
    LT_CHAT_CHATML,
    LT_CHAT_QWEN35,
};

struct lt_chat_template {
    enum lt_chat_kind kind;
    char *default_system;         /* CHATML only; NULL: none */
    bool default_system_if_empty; /* render default_system even for zero messages */
    bool tool_responses;          /* CHATML: "tool" messages as Qwen's user <tool_response> */
};

/* Recognises `jinja` (the template text; NULL when the file has none) for `arch`. */
lt_status lt_chat_template_detect(const char *jinja, const char *arch,
                                  struct lt_chat_template *out);
lt_status lt_chat_template_from_gguf(const struct lt_gguf *g, struct lt_chat_template *out);
void lt_chat_template_free(struct lt_chat_template *ct);

struct lt_chat_message {
    const char *role;      /* "system", "user", "assistant", "tool" (CHATML: any role) */
    const char *content;   /* NUL-terminated */
    const char *reasoning; /* assistant's reasoning (QWEN35), or NULL: taken from a
                            * "<think>...</think>" prefix of content when there is one */
    const char *tool_calls; /* assistant: the JSON text of an OpenAI tool_calls array
                             * ([{"function": {"name", "arguments"}}, ...], arguments an object
                             * or the JSON text of one), or NULL */
};

struct lt_chat_options {
    bool add_generation_prompt;
    bool enable_thinking; /* QWEN35: open a thinking block in the generation prompt */
    const char *tools;    /* the JSON text of an OpenAI tools array, or NULL (or "[]"): no
                           * tools */
    const char *prefill;  /* appended after the generation prompt (a forced tool call's
                           * start, lt_chat_tool_prefill), or NULL */
};

/* One assistant turn in rendered text, byte offsets: the turn is what the model would have
 * generated after the "<|im_start|>assistant\n" header, up to and including its
 * "<|im_end|>" (for QWEN35 the think block is part of it); content is the message's content
 * as rendered inside it. turn_begin <= content_begin <= content_end <= turn_end. */
struct lt_chat_span {
    size_t message; /* index into the messages */
    size_t turn_begin, content_begin, content_end, turn_end;
};

struct lt_chat_render {
    struct lt_strbuf text;
    struct lt_chat_span *spans; /* assistant turns, in order */
    size_t n_spans;
};

/* Renders messages[0..n) into out (which must be zeroed or freed). */
lt_status lt_chat_render(const struct lt_chat_template *ct, const struct lt_chat_message *msgs,
                         size_t n, const struct lt_chat_options *opts, struct lt_chat_render *out);
void lt_chat_render_free(struct lt_chat_render *r);

/* ---- tools (chat_tools.c; they need jansson in the build) ----
 *
 * Tools are rendered as the template's own tools block: Qwen2.5's ("# Tools ... <tools>" one
 * JSON object per line "</tools>" in the system turn; calls are <tool_call> blocks holding
 * {"name": ..., "arguments": {...}}) for CHATML, which is also lathe's generic format for
 * ChatML templates without tool blocks (SmolLM2); Qwen3.5's for QWEN35 (the same tools
 * block with its own instructions; calls are <tool_call><function=NAME><parameter=KEY>
 * VALUE</parameter></function></tool_call>). JSON inside the prompt is written as the
 * templates' tojson writes it under transformers (Python's json.dumps: ", " and ": ",
 * keys in their order, non-ASCII as is). */

/* Checks a tools array: LT_ERR_INVALID naming the field ("tools[1].function.name") when it
 * is not an array of {"type": "function", "function": {"name": string, ...}}. */
lt_status lt_chat_tools_check(const char *tools);

/* The text that starts a tool call, to prefill the assistant's turn with when a call is
 * forced: the call's opening and, when name is not NULL, the function's name. */
lt_status lt_chat_tool_prefill(enum lt_chat_kind kind, const char *name, struct lt_strbuf *out);

/* The bytes of text[0..len) that cannot be part of a tool call: up to the first
 * "<tool_call>", or up to a tail that could still become one. */
size_t lt_chat_tool_safe_len(const char *text, size_t len);

struct lt_chat_tool_call {
    char *name;
    char *arguments; /* the JSON text of an object */
};

struct lt_chat_tool_output {
    char *content; /* the text outside the calls, or NULL when that is only whitespace */
    struct lt_chat_tool_call *calls; /* [n_calls] */
    size_t n_calls;
};

/* Reads a model's output for tool calls. Every <tool_call> block must parse, name one of
 * `tools` and carry an arguments object; otherwise (or with no block) n_calls is 0 and
 * content is the whole text. A last block may lack its closing tag (the model stopped, or
 * went on without it): what follows its call is then content.
 * out is zeroed first; free it with lt_chat_tool_output_free. */
lt_status lt_chat_tool_parse(enum lt_chat_kind kind, const char *tools, const char *text,
                             size_t len, struct lt_chat_tool_output *out);
void lt_chat_tool_output_free(struct lt_chat_tool_output *o);

/* Token ranges of one span: tokens [turn_begin, turn_end) are those whose bytes overlap the
 * turn's bytes (likewise for content); a trainer puts loss on them. */
struct lt_chat_token_span {
    size_t turn_begin, turn_end;
    size_t content_begin, content_end;
};

/* Tokenizes a rendered conversation (special tokens parsed) and maps its spans to tokens.
 * `spans` receives r->n_spans entries (caller-allocated, may be NULL when n_spans == 0). */
lt_status lt_chat_tokenize(const struct lt_tokenizer *t, const struct lt_chat_render *r,
                           struct lt_tokens *out, struct lt_chat_token_span *spans);

#ifdef __cplusplus
}
#endif
#endif
