/* encode.c: text to tokens. Special tokens (when asked), then valid-UTF-8 runs and lone
 * invalid bytes, then pre-tokenizer pieces, then BPE on each piece.
 *
 * BPE keeps the piece as a linked list of symbols (initially one per byte) and a min-heap of
 * candidate merges ordered by (rank, position of the left symbol), the order Hugging Face's
 * BPE applies them in. A heap entry records the two token ids it was made for and is
 * skipped when popped if either symbol has changed since: the list is the truth, the heap
 * only a schedule. Each merge is O(log n), so a piece of megabytes (a run of spaces) stays
 * fast. Large inputs also get a direct-mapped cache of short pieces (words repeat), private
 * to the call so the tokenizer itself stays immutable and shareable. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

struct bpe_sym {
    lt_token id; /* LT_TOKEN_NONE once merged into its left neighbour */
    int32_t prev, next;
    uint32_t off; /* first byte, relative to the piece */
};

struct bpe_cand {
    int32_t rank;
    int32_t left, right;
    lt_token lid, rid, merged;
};

#define CACHE_PIECE 24        /* pieces up to this many bytes are cached */
#define CACHE_SLOTS 4096      /* a power of two */
#define CACHE_MIN_INPUT 65536 /* smaller inputs are not worth the cache's memory */

struct cache_slot {
    uint8_t len; /* 0: empty */
    uint8_t n;   /* tokens */
    uint8_t bytes[CACHE_PIECE];
    uint8_t offs[CACHE_PIECE]; /* each token's first byte in the piece */
    lt_token ids[CACHE_PIECE];
};

struct encoder {
    const struct lt_tokenizer *t;
    struct cache_slot *cache; /* [CACHE_SLOTS] or NULL */
    const char *text;
    size_t run_base; /* offset of the current UTF-8 run in text */
    struct lt_tokens *out;
    struct bpe_sym *syms;
    size_t syms_cap;
    struct bpe_cand *heap;
    size_t heap_n, heap_cap;
    struct tok_pretok_state *pst;
};

lt_status tok_push(struct lt_tokens *out, lt_token id, size_t off)
{
    if (out->n == out->cap) {
        size_t cap = out->cap ? 2 * out->cap : 256;
        lt_token *ids = realloc(out->ids, cap * sizeof(lt_token));
        if (!ids)
            return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory for %zu tokens", cap);
        out->ids = ids;
        if (out->want_offsets) {
            size_t *offs = realloc(out->offs, cap * sizeof(size_t));
            if (!offs)
                return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory for %zu tokens", cap);
            out->offs = offs;
        }
        out->cap = cap;
    }
    out->ids[out->n] = id;
    if (out->want_offsets)
        out->offs[out->n] = off;
    out->n++;
    return LT_OK;
}

void lt_tokens_free(struct lt_tokens *tk)
{
    free(tk->ids);
    free(tk->offs);
    bool want = tk->want_offsets;
    memset(tk, 0, sizeof(*tk));
    tk->want_offsets = want;
}

/* ---- the heap ---- */

static bool cand_less(const struct bpe_cand *a, const struct bpe_cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static lt_status heap_push(struct encoder *e, const struct bpe_cand *c)
{
    if (e->heap_n == e->heap_cap) {
        size_t cap = e->heap_cap ? 2 * e->heap_cap : 64;
        struct bpe_cand *h = realloc(e->heap, cap * sizeof(*h));
        if (!h)
            return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory");
        e->heap = h;
        e->heap_cap = cap;
    }
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(c, &e->heap[p]))
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = *c;
    return LT_OK;
}

static struct bpe_cand heap_pop(struct encoder *e)
{
    struct bpe_cand top = e->heap[0];
    struct bpe_cand last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && cand_less(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!cand_less(&e->heap[c], &last))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n)
        e->heap[i] = last;
    return top;
}

static lt_status try_pair(struct encoder *e, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return LT_OK;
    struct bpe_cand c = {
        .left = left, .right = right, .lid = e->syms[left].id, .rid = e->syms[right].id};
    c.rank = tok_merge_find(e->t, c.lid, c.rid, &c.merged);
    return c.rank < 0 ? LT_OK : heap_push(e, &c);
}

/* ---- BPE on one piece ---- */

static lt_status missing_byte(unsigned char b, size_t at)
{
    return lt_fail(LT_ERR_INVALID,
                   "tokenizer: byte 0x%02x at offset %zu has no token in this vocabulary, "
                   "and the vocabulary has no unknown token to stand for it",
                   b, at);
}

static lt_status bpe_piece(void *user, size_t off, size_t len)
{
    struct encoder *e = user;
    const struct lt_tokenizer *t = e->t;
    const unsigned char *s = (const unsigned char *)e->text + e->run_base + off;
    size_t base = e->run_base + off;
    if (t->n_missing_bytes)
        for (size_t i = 0; i < len; i++)
            if (t->byte_token[s[i]] == LT_TOKEN_NONE)
                return missing_byte(s[i], base + i);
    if (len == 1)
        return tok_push(e->out, t->byte_token[s[0]], base);
    lt_status st;
    struct cache_slot *slot = NULL;
    if (e->cache && len <= CACHE_PIECE) {
        slot = &e->cache[tok_hash(s, len) & (CACHE_SLOTS - 1)];
        if (slot->len == len && !memcmp(slot->bytes, s, len)) {
            for (size_t i = 0; i < slot->n; i++)
                if ((st = tok_push(e->out, slot->ids[i], base + slot->offs[i])))
                    return st;
            return LT_OK;
        }
    }
    if (len > INT32_MAX)
        return lt_fail(LT_ERR_INVALID, "tokenizer: a piece of %zu bytes is too long", len);
    if (len > e->syms_cap) {
        size_t cap = len < 256 ? 256 : len;
        struct bpe_sym *syms = realloc(e->syms, cap * sizeof(*syms));
        if (!syms)
            return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory for a %zu-byte piece", len);
        e->syms = syms;
        e->syms_cap = cap;
    }
    for (size_t i = 0; i < len; i++)
        e->syms[i] = (struct bpe_sym){.id = t->byte_token[s[i]],
                                      .prev = (int32_t)i - 1,
                                      .next = i + 1 < len ? (int32_t)i + 1 : -1,
                                      .off = (uint32_t)i};
    e->heap_n = 0;
    for (size_t i = 0; i + 1 < len; i++)
        if ((st = try_pair(e, (int32_t)i, (int32_t)i + 1)))
            return st;
    while (e->heap_n) {
        struct bpe_cand c = heap_pop(e);
        struct bpe_sym *l = &e->syms[c.left], *r = &e->syms[c.right];
        if (l->id != c.lid || l->next != c.right || r->id != c.rid)
            continue; /* stale: one side has merged since this was scheduled */
        l->id = c.merged;
        l->next = r->next;
        if (r->next >= 0)
            e->syms[r->next].prev = c.left;
        r->id = LT_TOKEN_NONE;
        if ((st = try_pair(e, l->prev, c.left)) || (st = try_pair(e, c.left, l->next)))
            return st;
    }
    if (slot) {
        slot->len = (uint8_t)len;
        slot->n = 0;
        memcpy(slot->bytes, s, len);
    }
    for (int32_t i = 0; i >= 0; i = e->syms[i].next) {
        if ((st = tok_push(e->out, e->syms[i].id, base + e->syms[i].off)))
            return st;
        if (slot) {
            slot->ids[slot->n] = e->syms[i].id;
            slot->offs[slot->n++] = (uint8_t)e->syms[i].off;
        }
    }
    return LT_OK;
}

/* ---- text between special tokens ---- */

static lt_status encode_plain(struct encoder *e, size_t begin, size_t end)
{
    const unsigned char *s = (const unsigned char *)e->text;
    size_t i = begin;
    lt_status st;
    while (i < end) {
        size_t j = i;
        for (;;) {
            while (j < end && s[j] < 0x80)
                j++;
            size_t l = j < end ? lt_utf8_seq_len(s + j, end - j) : 0;
            if (!l)
                break;
            j += l;
        }
        if (j > i) {
            e->run_base = i;
            if ((st = tok_pretok_split(e->t, &e->pst, e->text + i, j - i, bpe_piece, e)))
                return st;
        }
        if (j < end) { /* a byte that starts no valid sequence: its own token */
            if (e->t->byte_token[s[j]] == LT_TOKEN_NONE)
                return missing_byte(s[j], j);
            if ((st = tok_push(e->out, e->t->byte_token[s[j]], j)))
                return st;
            j++;
        }
        i = j;
    }
    return LT_OK;
}

/* The leftmost special token at or after `from`, longest at that position. */
static bool find_special(const struct lt_tokenizer *t, const char *text, size_t len, size_t from,
                         size_t *at, lt_token *id)
{
    for (size_t i = from; i < len; i++) {
        if (!t->special_first[(unsigned char)text[i]])
            continue;
        for (size_t k = 0; k < t->n_specials; k++) {
            lt_token sid = t->specials[k];
            size_t sl = tok_text_len(t, sid);
            if (sl <= len - i && !memcmp(text + i, t->text_pool + t->text_off[sid], sl)) {
                *at = i;
                *id = sid;
                return true;
            }
        }
    }
    return false;
}

lt_status lt_tokenize(const struct lt_tokenizer *t, const char *text, size_t len, unsigned flags,
                      struct lt_tokens *out)
{
    size_t n0 = out->n;
    struct encoder e = {.t = t, .text = text, .out = out};
    lt_status st = LT_OK;
    if (len >= CACHE_MIN_INPUT)
        e.cache = calloc(CACHE_SLOTS, sizeof(*e.cache)); /* none (NULL) is fine too */
    if (flags & LT_TOKENIZE_ADD_BOS) {
        if (t->bos == LT_TOKEN_NONE) {
            st = lt_fail(LT_ERR_INVALID, "tokenizer: asked to add bos, but the vocabulary has "
                                         "no bos token");
            goto out_rollback;
        }
        if ((st = tok_push(out, t->bos, 0)))
            goto out_rollback;
    }
    size_t pos = 0;
    while (pos < len) {
        size_t at = len;
        lt_token sid = LT_TOKEN_NONE;
        if (flags & LT_TOKENIZE_PARSE_SPECIAL)
            find_special(t, text, len, pos, &at, &sid);
        if ((st = encode_plain(&e, pos, at)))
            goto out_rollback;
        if (sid == LT_TOKEN_NONE)
            break;
        if ((st = tok_push(out, sid, at)))
            goto out_rollback;
        pos = at + tok_text_len(t, sid);
    }
    goto out_free_encoder;

out_rollback:
    out->n = n0;
out_free_encoder:
    free(e.cache);
    tok_pretok_state_free(e.pst);
    free(e.syms);
    free(e.heap);
    return st;
}
