/* tok_internal.h: the tokenizer's private layout, shared by the files of src/tokenizer/.
 *
 * Token texts and token bytes live in two pools indexed by token id. The byte-level
 * alphabet (GPT-2's bytes_to_unicode) maps each byte to one code point; byte_token[b] is the
 * token whose text is that one code point, which is what lets every input byte be encoded;
 * for a byte the vocabulary lacks it is the unknown token (or LT_TOKEN_NONE, and encoding
 * that byte fails). Merges are held in an open-addressing
 * table keyed by the pair of token ids. */
#ifndef LATHE_TOKENIZER_INTERNAL_H
#define LATHE_TOKENIZER_INTERNAL_H

#include <stdint.h>

#include "lathe/tokenizer.h"

#define TOK_MAX_EOG 8

struct tok_merge_slot {
    uint64_t key; /* (left << 32) | right, UINT64_MAX when empty */
    int32_t rank;
    lt_token id;
};

struct lt_tokenizer {
    enum lt_pretokenizer pre;
    size_t n_tokens;
    uint8_t *types;    /* [n_tokens] enum lt_token_type */
    char *text_pool;   /* token texts, each NUL-terminated */
    size_t *text_off;  /* [n_tokens + 1] */
    char *bytes_pool;  /* token bytes, each NUL-terminated */
    size_t *bytes_off; /* [n_tokens + 1] */

    uint32_t *str_slots; /* text -> id + 1 (0 empty) */
    size_t str_mask;

    struct tok_merge_slot *merge_slots;
    size_t merge_mask;

    lt_token byte_token[256];
    size_t n_missing_bytes; /* bytes with no token of their own */

    lt_token *specials; /* CONTROL / USER_DEFINED tokens with text, longest first */
    size_t n_specials;
    uint8_t special_first[256]; /* 1 when some special token's text starts with this byte */

    lt_token bos, eos, eot, eom, pad, unk;
    bool add_bos;
    lt_token eog[TOK_MAX_EOG];
    size_t n_eog;

    void *re_main;  /* pcre2_code *: the pre-tokenizer's split regex */
    void *re_digit; /* pcre2_code *: \p{N}, for the smollm digit split; NULL otherwise */
};

static inline size_t tok_text_len(const struct lt_tokenizer *t, lt_token id)
{
    return t->text_off[id + 1] - t->text_off[id] - 1;
}

static inline size_t tok_bytes_len(const struct lt_tokenizer *t, lt_token id)
{
    return t->bytes_off[id + 1] - t->bytes_off[id] - 1;
}

uint64_t tok_hash(const void *p, size_t n);

/* The merge of (a, b): its rank, with the merged token in *id; -1 when the pair has none. */
int32_t tok_merge_find(const struct lt_tokenizer *t, lt_token a, lt_token b, lt_token *id);

/* Appends one token (and its offset, when out wants offsets). */
lt_status tok_push(struct lt_tokens *out, lt_token id, size_t off);

/* pretok.c */
lt_status tok_pretok_compile(struct lt_tokenizer *t);
void tok_pretok_free(struct lt_tokenizer *t);

/* Splits the valid UTF-8 run s[0..n) into pieces, calling piece(user, off, len) for each in
 * order; the pieces tile the run. */
struct tok_pretok_state;
typedef lt_status (*tok_piece_fn)(void *user, size_t off, size_t len);
lt_status tok_pretok_split(const struct lt_tokenizer *t, struct tok_pretok_state **st,
                           const char *s, size_t n, tok_piece_fn piece, void *user);
void tok_pretok_state_free(struct tok_pretok_state *st);

/* chat_tools.c, for chat.c: the system turn holding the tools block (with the system
 * message's text, or NULL), and an assistant's tool calls as rendered after its content. */
lt_status tok_chat_tools_system(enum lt_chat_kind kind, const char *tools, const char *system,
                                struct lt_strbuf *out);
lt_status tok_chat_tool_calls(enum lt_chat_kind kind, const char *tool_calls, const char *content,
                              size_t content_len, struct lt_strbuf *out);

/* The byte-level alphabet: code point of byte b, and the byte of code point cp (-1 if none). */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);

#endif
