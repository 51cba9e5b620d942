/* decode.c: tokens to bytes, whole or streamed, and the growable byte string.
 *
 * The stream holds back at most 3 bytes: the tail of a UTF-8 sequence whose lead byte and
 * continuation bytes so far are valid but which is not complete yet. Anything that can no
 * longer become valid UTF-8 is passed on as it is, so the stream never loses or alters a
 * byte, and never waits for a sequence that cannot complete. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

lt_status lt_strbuf_append(struct lt_strbuf *b, const void *bytes, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return lt_fail(LT_ERR_NOMEM, "out of memory for a %zu-byte string", cap);
        b->data = d;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, bytes, n);
    b->len += n;
    b->data[b->len] = 0;
    return LT_OK;
}

void lt_strbuf_free(struct lt_strbuf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

static bool token_rendered(const struct lt_tokenizer *t, lt_token id, unsigned flags)
{
    switch (t->types[id]) {
    case LT_TOKEN_TYPE_CONTROL:
    case LT_TOKEN_TYPE_UNKNOWN:
    case LT_TOKEN_TYPE_UNUSED: return flags & LT_DETOKENIZE_SPECIAL;
    default: return true;
    }
}

lt_status lt_detokenize(const struct lt_tokenizer *t, const lt_token *ids, size_t n, unsigned flags,
                        struct lt_strbuf *out)
{
    size_t len0 = out->len;
    for (size_t i = 0; i < n; i++) {
        lt_token id = ids[i];
        if (id < 0 || (size_t)id >= t->n_tokens) {
            out->len = len0;
            if (out->data)
                out->data[len0] = 0;
            return lt_fail(LT_ERR_INVALID,
                           "detokenize: token %zu is id %d, outside the "
                           "vocabulary (%zu tokens)",
                           i, id, t->n_tokens);
        }
        if (!token_rendered(t, id, flags))
            continue;
        lt_status st =
            lt_strbuf_append(out, t->bytes_pool + t->bytes_off[id], tok_bytes_len(t, id));
        if (st)
            return st;
    }
    return LT_OK;
}

/* How many bytes at the end of s[0..n) are an incomplete but so far valid UTF-8 sequence. */
static size_t incomplete_tail(const unsigned char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned c = s[n - k];
        if ((c & 0xC0) == 0x80)
            continue; /* a continuation byte: its lead is further back */
        size_t need = (c >= 0xC2 && c <= 0xDF)   ? 2
                      : (c >= 0xE0 && c <= 0xEF) ? 3
                      : (c >= 0xF0 && c <= 0xF4) ? 4
                                                 : 0;
        if (need <= k)
            return 0; /* complete, ASCII, or a byte that leads nothing */
        if (k >= 2) {
            unsigned c1 = s[n - k + 1], lo = 0x80, hi = 0xBF;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
            else if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
            if (c1 < lo || c1 > hi)
                return 0;
        }
        return k;
    }
    return 0;
}

void lt_decode_stream_init(struct lt_decode_stream *s, const struct lt_tokenizer *t, unsigned flags)
{
    memset(s, 0, sizeof(*s));
    s->tok = t;
    s->flags = flags;
}

lt_status lt_decode_stream_push_bytes(struct lt_decode_stream *s, const char *bytes, size_t n,
                                      struct lt_strbuf *out)
{
    size_t start = out->len;
    lt_status st;
    if ((st = lt_strbuf_append(out, s->held, s->n_held)) ||
        (st = lt_strbuf_append(out, bytes, n))) {
        out->len = start;
        if (out->data)
            out->data[start] = 0;
        return st;
    }
    size_t tail = incomplete_tail((const unsigned char *)out->data + start, out->len - start);
    memcpy(s->held, out->data + out->len - tail, tail);
    s->n_held = tail;
    out->len -= tail;
    out->data[out->len] = 0;
    return LT_OK;
}

lt_status lt_decode_stream_push(struct lt_decode_stream *s, lt_token id, struct lt_strbuf *out)
{
    const struct lt_tokenizer *t = s->tok;
    if (id < 0 || (size_t)id >= t->n_tokens)
        return lt_fail(LT_ERR_INVALID, "detokenize: id %d is outside the vocabulary (%zu tokens)",
                       id, t->n_tokens);
    if (!token_rendered(t, id, s->flags))
        return LT_OK;
    return lt_decode_stream_push_bytes(s, t->bytes_pool + t->bytes_off[id], tok_bytes_len(t, id),
                                       out);
}

lt_status lt_decode_stream_flush(struct lt_decode_stream *s, struct lt_strbuf *out)
{
    lt_status st = lt_strbuf_append(out, s->held, s->n_held);
    if (!st)
        s->n_held = 0;
    return st;
}
