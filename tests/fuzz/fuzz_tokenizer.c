/* fuzz_tokenizer.c: libFuzzer target for encoding (lt_tokenize) and decoding on a small
 * byte-level BPE vocabulary built in code once, one tokenizer per pre-tokenizer.
 *
 * Input: byte 0 picks the pre-tokenizer and the flags, the rest is the text. Properties
 * checked, each against a reference written here rather than the tokenizer's own helpers:
 *   - lt_tokenize succeeds (every byte value has a token), appends after what the list
 *     held, gives ids in range, and the same ids with and without offsets;
 *   - special tokens appear (with PARSE_SPECIAL) exactly where a leftmost-longest scan
 *     finds their text, and never without the flag;
 *   - a byte that starts no valid UTF-8 sequence (per the Unicode table, below) is a token
 *     of its own, that byte's token; no token crosses a valid run's edge or a special;
 *   - each token's bytes are the text between its offset and the next token's;
 *   - decoding gives the text back (control tokens dropped without DETOKENIZE_SPECIAL);
 *   - the streaming decoder's output equals lt_detokenize, never ends inside a sequence
 *     that may still complete, and holds back only such sequences;
 *   - lt_utf8_seq_len agrees with the reference at every position;
 *   - (byte 0 is 0xF0..0xFF) in an input padded with long special tokens past 64 KiB,
 *     where the encoder's piece cache turns on, the text tokenizes as it does alone. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_vocab.h"
#include "lathe/tokenizer.h"

static struct fuzz_vocab vocab;
static struct lt_tokenizer *tok[LT_PRETOK_COUNT];

static void build_tokenizers(void)
{
    for (int p = 0; p < LT_PRETOK_COUNT; p++)
        tok[p] = fuzz_vocab_tokenizer(&vocab, (enum lt_pretokenizer)p);
}

/* ---- references ---- */

/* Length of the valid UTF-8 sequence at s (Unicode's table 3-7), 0 when none starts there. */
static size_t ref_seq_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    else if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c == 0xE0)
        need = 3, lo = 0xA0;
    else if (c == 0xED)
        need = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF)
        need = 3;
    else if (c == 0xF0)
        need = 4, lo = 0x90;
    else if (c == 0xF4)
        need = 4, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3)
        need = 4;
    else
        return 0;
    if (n < need || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < need; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return need;
}

/* s[0..k) is a proper prefix of some valid UTF-8 sequence (so more bytes may complete it). */
static bool ref_may_complete(const unsigned char *s, size_t k)
{
    if (k == 0 || k > 3)
        return false;
    unsigned char buf[4];
    memcpy(buf, s, k);
    /* complete it with the smallest continuation bytes the table allows, then ask */
    for (size_t i = k; i < 4; i++)
        buf[i] = 0x80;
    if (k == 1 && (buf[0] == 0xE0))
        buf[1] = 0xA0;
    if (k == 1 && (buf[0] == 0xF0))
        buf[1] = 0x90;
    size_t l = ref_seq_len(buf, 4);
    return l > k;
}

/* The special token whose text starts at text[i], longest first; -1 when none. */
static int ref_special_at(const unsigned char *text, size_t len, size_t i)
{
    int best = -1;
    size_t best_len = 0;
    for (size_t s = 0; s < FUZZ_N_SPECIALS; s++) {
        size_t l = strlen(fuzz_specials[s]);
        if (l <= len - i && l > best_len && !memcmp(text + i, fuzz_specials[s], l)) {
            best = (int)s;
            best_len = l;
        }
    }
    return best;
}

/* ---- the checks ---- */

enum edge {
    EDGE_NONE = 0,
    EDGE_START = 1,   /* a token must start here */
    EDGE_INSIDE = 2,  /* inside a special token's text */
    EDGE_SPECIAL = 4, /* a special token starts here */
    EDGE_INVALID = 8, /* a lone invalid byte: one token of that byte */
};

/* Where tokens must start, from the specials and the UTF-8 runs. edge has len + 1 entries. */
static void ref_edges(const unsigned char *text, size_t len, bool parse_special, uint8_t *edge)
{
    memset(edge, 0, len + 1);
    edge[0] = edge[len] = EDGE_START;
    size_t i = 0;
    while (i < len) {
        int s = parse_special ? ref_special_at(text, len, i) : -1;
        if (s >= 0) {
            size_t l = strlen(fuzz_specials[s]);
            edge[i] |= EDGE_START | EDGE_SPECIAL;
            for (size_t k = 1; k < l; k++)
                edge[i + k] |= EDGE_INSIDE;
            edge[i + l] |= EDGE_START;
            i += l;
            continue;
        }
        size_t l = ref_seq_len(text + i, len - i);
        if (l == 0) {
            edge[i] |= EDGE_START | EDGE_INVALID;
            edge[i + 1] |= EDGE_START;
            i++;
        } else {
            /* tokens may start inside a character (byte-level BPE); a valid run ends where
             * an invalid byte or a special begins, and both are marked */
            i += l;
        }
    }
}

static void check_stream(const struct lt_tokenizer *t, const lt_token *ids, size_t n,
                         unsigned dflags, const struct lt_strbuf *whole)
{
    struct lt_decode_stream ds;
    struct lt_strbuf sb = {0};
    lt_decode_stream_init(&ds, t, dflags);
    for (size_t i = 0; i < n; i++) {
        if (lt_decode_stream_push(&ds, ids[i], &sb) != LT_OK)
            __builtin_trap();
        /* holds back only a sequence that may still complete... */
        if (ds.n_held > 3 || (ds.n_held && !ref_may_complete(ds.held, ds.n_held)))
            __builtin_trap();
        /* ...and what it appended does not end inside one, counting the held bytes as what
         * follows (an EA held after an EA shows the first one can no longer complete) */
        for (size_t k = 1; k <= 3 && k <= sb.len && k + ds.n_held <= 3; k++) {
            unsigned char tail[3];
            memcpy(tail, sb.data + sb.len - k, k);
            memcpy(tail + k, ds.held, ds.n_held);
            if (ref_may_complete(tail, k + ds.n_held))
                __builtin_trap();
        }
    }
    if (lt_decode_stream_flush(&ds, &sb) != LT_OK || ds.n_held != 0)
        __builtin_trap();
    if (sb.len != whole->len || (sb.len && memcmp(sb.data, whole->data, sb.len)))
        __builtin_trap();
    lt_strbuf_free(&sb);
}

/* Tokenizes text and checks everything but the cache property. */
static void check_text(const struct lt_tokenizer *t, const unsigned char *text, size_t len,
                       unsigned flags)
{
    bool special = flags & LT_TOKENIZE_PARSE_SPECIAL, bos = flags & LT_TOKENIZE_ADD_BOS;
    for (size_t i = 0; i < len; i++)
        if (lt_utf8_seq_len(text + i, len - i) != ref_seq_len(text + i, len - i))
            __builtin_trap();

    /* appends after a token already there; ids equal without offsets */
    struct lt_tokens tk = {.want_offsets = true}, plain = {0};
    lt_token first = 7;
    size_t zero = 0;
    tk.ids = malloc(sizeof(lt_token));
    tk.offs = malloc(sizeof(size_t));
    if (!tk.ids || !tk.offs)
        __builtin_trap();
    tk.ids[0] = first;
    tk.offs[0] = zero;
    tk.n = tk.cap = 1;
    if (lt_tokenize(t, (const char *)text, len, flags, &tk) != LT_OK ||
        lt_tokenize(t, (const char *)text, len, flags, &plain) != LT_OK)
        __builtin_trap();
    if (tk.ids[0] != first || tk.n - 1 != plain.n ||
        (plain.n && memcmp(tk.ids + 1, plain.ids, plain.n * sizeof(lt_token))))
        __builtin_trap();
    lt_tokens_free(&plain);
    const lt_token *ids = tk.ids + 1;
    const size_t *offs = tk.offs + 1;
    size_t n = tk.n - 1;
    if (len == 0 && n != (bos ? 1u : 0u))
        __builtin_trap();

    uint8_t *edge = malloc(len + 1);
    if (!edge)
        __builtin_trap();
    ref_edges(text, len, special, edge);
    size_t k0 = 0;
    if (bos) {
        if (n < 1 || ids[0] != FUZZ_ID_BOS || offs[0] != 0)
            __builtin_trap();
        k0 = 1;
    }
    size_t at = 0;
    for (size_t k = k0; k < n; k++) {
        lt_token id = ids[k];
        size_t end = k + 1 < n ? offs[k + 1] : len;
        if (id < 0 || id >= (lt_token)FUZZ_N_TOKENS || offs[k] != at || end <= at || end > len)
            __builtin_trap();
        if (edge[at] & EDGE_INSIDE)
            __builtin_trap();
        for (size_t i = at + 1; i < end; i++)
            if (edge[i] & EDGE_START)
                __builtin_trap();
        bool is_special = id >= FUZZ_ID_SPECIAL0;
        if (is_special != ((edge[at] & EDGE_SPECIAL) != 0))
            __builtin_trap();
        if (is_special) {
            int s = ref_special_at(text, len, at);
            if (id != FUZZ_ID_SPECIAL0 + s)
                __builtin_trap();
        } else if ((edge[at] & EDGE_INVALID) && id != text[at]) {
            __builtin_trap();
        }
        size_t bl;
        const char *b = lt_tokenizer_token_bytes(t, id, &bl);
        if (!b || bl != end - at || memcmp(b, text + at, bl))
            __builtin_trap();
        at = end;
    }
    if (at != len)
        __builtin_trap();
    free(edge);

    /* decoding: everything with DETOKENIZE_SPECIAL, control tokens dropped without */
    struct lt_strbuf all = {0}, shown = {0};
    if (lt_detokenize(t, ids + k0, n - k0, LT_DETOKENIZE_SPECIAL, &all) != LT_OK ||
        lt_detokenize(t, ids + k0, n - k0, 0, &shown) != LT_OK)
        __builtin_trap();
    if (all.len != len || (len && memcmp(all.data, text, len)))
        __builtin_trap();
    size_t j = 0;
    for (size_t k = k0; k < n; k++) {
        size_t end = k + 1 < n ? offs[k + 1] : len;
        if (ids[k] >= FUZZ_ID_SPECIAL0 && ids[k] < FUZZ_ID_SPECIAL0 + FUZZ_N_CONTROL)
            continue;
        if (j + (end - offs[k]) > shown.len ||
            memcmp(shown.data + j, text + offs[k], end - offs[k]))
            __builtin_trap();
        j += end - offs[k];
    }
    if (j != shown.len)
        __builtin_trap();
    check_stream(t, ids + k0, n - k0, LT_DETOKENIZE_SPECIAL, &all);
    check_stream(t, ids + k0, n - k0, 0, &shown);
    lt_strbuf_free(&all);
    lt_strbuf_free(&shown);
    lt_tokens_free(&tk);
}

/* Two copies of the text, each followed by <|im_end|>, then <|pad==...|> tokens past the
 * 64 KiB at which the encoder caches pieces (a few long specials cost little to encode):
 * each copy tokenizes as the text alone (shifted by its offset), the second from the cache. */
static void check_cache(const struct lt_tokenizer *t, const unsigned char *text, size_t len)
{
    const char *sep = "<|im_end|>";
    size_t sl = strlen(sep), unit = len + sl, n_pad = 65536 / FUZZ_PAD_LEN + 1;
    size_t total = 2 * unit + n_pad * FUZZ_PAD_LEN;
    char *big = malloc(total);
    if (!big)
        return;
    for (size_t c = 0; c < 2; c++) {
        memcpy(big + c * unit, text, len);
        memcpy(big + c * unit + len, sep, sl);
    }
    for (size_t k = 0; k < n_pad; k++)
        memcpy(big + 2 * unit + k * FUZZ_PAD_LEN, fuzz_pad_text, FUZZ_PAD_LEN);
    struct lt_tokens one = {.want_offsets = true}, many = {.want_offsets = true};
    if (lt_tokenize(t, (const char *)text, len, LT_TOKENIZE_PARSE_SPECIAL, &one) != LT_OK ||
        lt_tokenize(t, big, total, LT_TOKENIZE_PARSE_SPECIAL, &many) != LT_OK)
        __builtin_trap();
    if (many.n != 2 * (one.n + 1) + n_pad)
        __builtin_trap();
    for (size_t c = 0; c < 2; c++) {
        const lt_token *ids = many.ids + c * (one.n + 1);
        const size_t *offs = many.offs + c * (one.n + 1);
        for (size_t k = 0; k < one.n; k++)
            if (ids[k] != one.ids[k] || offs[k] != one.offs[k] + c * unit)
                __builtin_trap();
        if (ids[one.n] != FUZZ_ID_IM_END || offs[one.n] != c * unit + len)
            __builtin_trap();
    }
    for (size_t k = 2 * (one.n + 1); k < many.n; k++)
        if (many.ids[k] != FUZZ_ID_PAD)
            __builtin_trap();
    lt_tokens_free(&one);
    lt_tokens_free(&many);
    free(big);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!tok[0])
        build_tokenizers();
    if (size < 1)
        return 0;
    unsigned ctl = data[0];
    const struct lt_tokenizer *t = tok[ctl % LT_PRETOK_COUNT];
    unsigned flags = 0;
    if (ctl & 0x10)
        flags |= LT_TOKENIZE_PARSE_SPECIAL;
    if (ctl & 0x20)
        flags |= LT_TOKENIZE_ADD_BOS;
    /* an exact-size copy, so ASan sees any over-read */
    size_t len = size - 1;
    unsigned char *text = malloc(len ? len : 1);
    if (!text)
        return 0;
    memcpy(text, data + 1, len);
    check_text(t, text, len, flags);
    if ((ctl & 0xF0) == 0xF0 && len > 0 && len <= 4096)
        check_cache(t, text, len);
    free(text);
    return 0;
}
