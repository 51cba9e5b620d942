/* vocab.c: building a byte-level BPE tokenizer from a vocabulary (tokens, types, merges,
 * special ids) and the lookups on it.
 *
 * Invariants established here and relied on by the encoder: every byte value has a token
 * (byte_token), every merge's two sides and its result are tokens, and a pair of token ids
 * has at most one merge (the lowest rank when a file lists a pair twice). */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* ---- hashing ---- */

uint64_t tok_hash(const void *p, size_t n)
{
    /* FNV-1a over 8-byte words, then a final avalanche (splitmix64's finalizer). */
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

static uint64_t pair_hash(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ull;
    key ^= key >> 33;
    return key;
}

static size_t table_size_for(size_t n)
{
    size_t s = 16;
    while (s < 2 * n)
        s <<= 1;
    return s;
}

/* ---- the byte-level alphabet ---- */

static bool byte_is_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t tok_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b))
        return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        n += !byte_is_printable(c);
    return 256 + n;
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_is_printable(cp) ? (int)cp : -1;
    /* the 68 bytes that are not printable stand, in order, for 256..323: 0x00..0x20,
     * 0x7F..0xA0, 0xAD */
    uint32_t n = cp - 256;
    return n < 33 ? (int)n : n < 67 ? (int)(127 + n - 33) : n == 67 ? 173 : -1;
}

static size_t utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

size_t lt_utf8_seq_len(const unsigned char *s, size_t n)
{
    if (n == 0)
        return 0;
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0; /* no overlong forms */
        else if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F; /* nothing past U+10FFFF */
    } else {
        return 0;
    }
    if (n < need || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < need; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return need;
}

/* Decodes one code point of valid UTF-8 (as checked by lt_utf8_seq_len). */
static uint32_t utf8_get(const unsigned char *s, size_t len)
{
    switch (len) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

/* ---- lookups ---- */

lt_token lt_tokenizer_find(const struct lt_tokenizer *t, const char *s, size_t len)
{
    size_t i = tok_hash(s, len) & t->str_mask;
    for (;;) {
        uint32_t v = t->str_slots[i];
        if (v == 0)
            return LT_TOKEN_NONE;
        lt_token id = (lt_token)(v - 1);
        if (tok_text_len(t, id) == len && !memcmp(t->text_pool + t->text_off[id], s, len))
            return id;
        i = (i + 1) & t->str_mask;
    }
}

static struct tok_merge_slot *merge_slot(const struct lt_tokenizer *t, lt_token a, lt_token b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = pair_hash(key) & t->merge_mask;
    for (;;) {
        struct tok_merge_slot *s = &t->merge_slots[i];
        if (s->key == key || s->key == UINT64_MAX)
            return s;
        i = (i + 1) & t->merge_mask;
    }
}

size_t lt_tokenizer_n_tokens(const struct lt_tokenizer *t)
{
    return t->n_tokens;
}
enum lt_pretokenizer lt_tokenizer_pre(const struct lt_tokenizer *t)
{
    return t->pre;
}
lt_token lt_tokenizer_bos(const struct lt_tokenizer *t)
{
    return t->bos;
}
lt_token lt_tokenizer_eos(const struct lt_tokenizer *t)
{
    return t->eos;
}
lt_token lt_tokenizer_eot(const struct lt_tokenizer *t)
{
    return t->eot;
}
lt_token lt_tokenizer_pad(const struct lt_tokenizer *t)
{
    return t->pad;
}
bool lt_tokenizer_add_bos(const struct lt_tokenizer *t)
{
    return t->add_bos;
}

bool lt_tokenizer_is_eog(const struct lt_tokenizer *t, lt_token id)
{
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return true;
    return false;
}

enum lt_token_type lt_tokenizer_token_type(const struct lt_tokenizer *t, lt_token id)
{
    if (id < 0 || (size_t)id >= t->n_tokens)
        return LT_TOKEN_TYPE_UNDEFINED;
    return (enum lt_token_type)t->types[id];
}

const char *lt_tokenizer_token_text(const struct lt_tokenizer *t, lt_token id, size_t *len)
{
    if (id < 0 || (size_t)id >= t->n_tokens)
        return NULL;
    if (len)
        *len = tok_text_len(t, id);
    return t->text_pool + t->text_off[id];
}

const char *lt_tokenizer_token_bytes(const struct lt_tokenizer *t, lt_token id, size_t *len)
{
    if (id < 0 || (size_t)id >= t->n_tokens)
        return NULL;
    if (len)
        *len = tok_bytes_len(t, id);
    return t->bytes_pool + t->bytes_off[id];
}

int32_t tok_merge_find(const struct lt_tokenizer *t, lt_token a, lt_token b, lt_token *id)
{
    const struct tok_merge_slot *s = merge_slot(t, a, b);
    if (s->key == UINT64_MAX)
        return -1;
    *id = s->id;
    return s->rank;
}

const char *lt_pretokenizer_name(enum lt_pretokenizer p)
{
    static const char *const names[LT_PRETOK_COUNT] = {"qwen2", "qwen35", "smollm"};
    return (unsigned)p < LT_PRETOK_COUNT ? names[p] : NULL;
}

/* ---- building ---- */

static size_t desc_token_len(const struct lt_vocab_desc *d, size_t i)
{
    return d->token_lens ? d->token_lens[i] : strlen(d->tokens[i]);
}

/* The bytes a token stands for: a NORMAL token's text through the byte-level alphabet. A
 * NORMAL token whose text has characters outside the alphabet (not made by a byte-level
 * converter) keeps its text as it is. */
static size_t token_bytes_of(const char *text, size_t len, int type, char *out)
{
    if (type == LT_TOKEN_TYPE_NORMAL || type == LT_TOKEN_TYPE_UNDEFINED) {
        size_t o = 0, i = 0;
        while (i < len) {
            size_t l = lt_utf8_seq_len((const unsigned char *)text + i, len - i);
            int b = l ? tok_cp_to_byte(utf8_get((const unsigned char *)text + i, l)) : -1;
            if (b < 0)
                goto out_as_is;
            out[o++] = (char)b;
            i += l;
        }
        return o;
    }
out_as_is:
    memcpy(out, text, len);
    return len;
}

static lt_status build_pools(struct lt_tokenizer *t, const struct lt_vocab_desc *d)
{
    size_t n = d->n_tokens, total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!d->tokens[i])
            return lt_fail(LT_ERR_FORMAT, "tokenizer: token %zu has no text", i);
        total += desc_token_len(d, i) + 1;
    }
    t->types = malloc(n);
    t->text_off = malloc((n + 1) * sizeof(size_t));
    t->bytes_off = malloc((n + 1) * sizeof(size_t));
    t->text_pool = malloc(total ? total : 1);
    t->bytes_pool = malloc(total ? total : 1);
    if (!t->types || !t->text_off || !t->bytes_off || !t->text_pool || !t->bytes_pool)
        return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory for %zu tokens", n);
    size_t to = 0, bo = 0;
    for (size_t i = 0; i < n; i++) {
        int type = d->token_types ? d->token_types[i] : LT_TOKEN_TYPE_NORMAL;
        if (type < 0 || type > LT_TOKEN_TYPE_BYTE)
            return lt_fail(LT_ERR_FORMAT, "tokenizer: token %zu has unknown type %d", i, type);
        t->types[i] = (uint8_t)type;
        size_t len = desc_token_len(d, i);
        t->text_off[i] = to;
        memcpy(t->text_pool + to, d->tokens[i], len);
        to += len;
        t->text_pool[to++] = 0;
        t->bytes_off[i] = bo;
        bo += token_bytes_of(d->tokens[i], len, type, t->bytes_pool + bo);
        t->bytes_pool[bo++] = 0;
    }
    t->text_off[n] = to;
    t->bytes_off[n] = bo;
    return LT_OK;
}

static lt_status build_str_map(struct lt_tokenizer *t)
{
    size_t size = table_size_for(t->n_tokens);
    t->str_mask = size - 1;
    t->str_slots = calloc(size, sizeof(uint32_t));
    if (!t->str_slots)
        return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory for the token map");
    for (size_t id = 0; id < t->n_tokens; id++) {
        const char *s = t->text_pool + t->text_off[id];
        size_t len = tok_text_len(t, (lt_token)id);
        if (lt_tokenizer_find(t, s, len) != LT_TOKEN_NONE)
            continue; /* a duplicate text keeps its first id */
        size_t i = tok_hash(s, len) & t->str_mask;
        while (t->str_slots[i])
            i = (i + 1) & t->str_mask;
        t->str_slots[i] = (uint32_t)id + 1;
    }
    return LT_OK;
}

/* A byte the vocabulary has no token for (SmolLM2 lacks 21, among them 0x04 and 0xFF)
 * encodes as the unknown token, as Hugging Face's BPE does; the only lossy case, reported
 * by lt_tokenizer_missing_bytes. Without an unknown token, encoding such a byte is an error
 * (never a silent drop). */
static void build_byte_tokens(struct lt_tokenizer *t)
{
    for (unsigned b = 0; b < 256; b++) {
        char buf[4];
        size_t n = utf8_put(tok_byte_to_cp((uint8_t)b), buf);
        t->byte_token[b] = lt_tokenizer_find(t, buf, n);
        if (t->byte_token[b] == LT_TOKEN_NONE) {
            t->byte_token[b] = t->unk;
            t->n_missing_bytes++;
        }
    }
}

size_t lt_tokenizer_missing_bytes(const struct lt_tokenizer *t, uint8_t *bytes)
{
    size_t n = 0;
    for (unsigned b = 0; b < 256; b++) {
        char buf[4];
        size_t len = utf8_put(tok_byte_to_cp((uint8_t)b), buf);
        if (lt_tokenizer_find(t, buf, len) != LT_TOKEN_NONE)
            continue;
        if (bytes)
            bytes[n] = (uint8_t)b;
        n++;
    }
    return n;
}

static lt_status build_merges(struct lt_tokenizer *t, const struct lt_vocab_desc *d)
{
    size_t size = table_size_for(d->n_merges);
    t->merge_mask = size - 1;
    t->merge_slots = malloc(size * sizeof(*t->merge_slots));
    if (!t->merge_slots)
        return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory for %zu merges", d->n_merges);
    for (size_t i = 0; i < size; i++)
        t->merge_slots[i].key = UINT64_MAX;
    char *joined = NULL;
    size_t joined_cap = 0;
    lt_status st = LT_OK;
    for (size_t r = 0; r < d->n_merges; r++) {
        const char *m = d->merges[r];
        size_t len = m ? (d->merge_lens ? d->merge_lens[r] : strlen(m)) : 0;
        /* the separator is the first space after the first character: a side never holds
         * a space in a byte-level vocabulary, but the first side may be one ("  x") in
         * others */
        const char *sp = len > 1 ? memchr(m + 1, ' ', len - 1) : NULL;
        if (!sp) {
            st = lt_fail(LT_ERR_FORMAT, "tokenizer: merge %zu '%.*s' is not 'left right'", r,
                         (int)(len > 64 ? 64 : len), m ? m : "");
            goto out_free_joined;
        }
        size_t la = (size_t)(sp - m), lb = len - la - 1;
        lt_token a = lt_tokenizer_find(t, m, la), b = lt_tokenizer_find(t, sp + 1, lb);
        if (la + lb > joined_cap) {
            joined_cap = 2 * (la + lb);
            char *nj = realloc(joined, joined_cap);
            if (!nj) {
                st = lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory");
                goto out_free_joined;
            }
            joined = nj;
        }
        memcpy(joined, m, la);
        memcpy(joined + la, sp + 1, lb);
        lt_token c = lt_tokenizer_find(t, joined, la + lb);
        if (a == LT_TOKEN_NONE || b == LT_TOKEN_NONE || c == LT_TOKEN_NONE) {
            st = lt_fail(LT_ERR_FORMAT,
                         "tokenizer: merge %zu '%.*s' names a token that is not in the "
                         "vocabulary",
                         r, (int)(len > 64 ? 64 : len), m);
            goto out_free_joined;
        }
        struct tok_merge_slot *s = merge_slot(t, a, b);
        if (s->key == UINT64_MAX) {
            s->key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
            s->rank = (int32_t)r;
            s->id = c;
        }
    }
out_free_joined:
    free(joined);
    return st;
}

/* Orders special tokens longest first (then by id), so the first match at a position is
 * the longest one. */
static bool special_before(const struct lt_tokenizer *t, lt_token a, lt_token b)
{
    size_t la = tok_text_len(t, a), lb = tok_text_len(t, b);
    return la != lb ? la > lb : a < b;
}

static lt_status build_specials(struct lt_tokenizer *t)
{
    size_t n = 0;
    for (size_t id = 0; id < t->n_tokens; id++)
        if ((t->types[id] == LT_TOKEN_TYPE_CONTROL || t->types[id] == LT_TOKEN_TYPE_USER_DEFINED) &&
            tok_text_len(t, (lt_token)id) > 0)
            n++;
    t->specials = malloc((n ? n : 1) * sizeof(lt_token));
    if (!t->specials)
        return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t id = 0; id < t->n_tokens; id++)
        if ((t->types[id] == LT_TOKEN_TYPE_CONTROL || t->types[id] == LT_TOKEN_TYPE_USER_DEFINED) &&
            tok_text_len(t, (lt_token)id) > 0) {
            t->specials[t->n_specials++] = (lt_token)id;
            t->special_first[(unsigned char)t->text_pool[t->text_off[id]]] = 1;
        }
    for (size_t i = 1; i < t->n_specials; i++) { /* insertion sort: a few hundred at most */
        lt_token x = t->specials[i];
        size_t j = i;
        for (; j > 0 && special_before(t, x, t->specials[j - 1]); j--)
            t->specials[j] = t->specials[j - 1];
        t->specials[j] = x;
    }
    return LT_OK;
}

static void add_eog(struct lt_tokenizer *t, lt_token id)
{
    if (id < 0 || (size_t)id >= t->n_tokens || lt_tokenizer_is_eog(t, id) ||
        t->n_eog == TOK_MAX_EOG)
        return;
    t->eog[t->n_eog++] = id;
}

static lt_status check_special_id(const struct lt_tokenizer *t, lt_token id, const char *what)
{
    if (id != LT_TOKEN_NONE && (id < 0 || (size_t)id >= t->n_tokens))
        return lt_fail(LT_ERR_FORMAT, "tokenizer: %s token id %d is outside the vocabulary (%zu)",
                       what, id, t->n_tokens);
    return LT_OK;
}

lt_status lt_tokenizer_init(const struct lt_vocab_desc *d, struct lt_tokenizer **out)
{
    *out = NULL;
    if (!d->model || strcmp(d->model, "gpt2"))
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "tokenizer: model '%s' is not supported (only byte-level BPE, 'gpt2')",
                       d->model ? d->model : "(none)");
    enum lt_pretokenizer pre = LT_PRETOK_COUNT;
    for (int p = 0; p < LT_PRETOK_COUNT; p++)
        if (d->pre && !strcmp(d->pre, lt_pretokenizer_name((enum lt_pretokenizer)p)))
            pre = (enum lt_pretokenizer)p;
    if (pre == LT_PRETOK_COUNT)
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "tokenizer: pre-tokenizer '%s' is not supported (known: qwen2, qwen35, "
                       "smollm)",
                       d->pre ? d->pre : "(none)");
    if (d->n_tokens == 0 || d->n_tokens > INT32_MAX - 1)
        return lt_fail(LT_ERR_FORMAT, "tokenizer: %zu tokens", d->n_tokens);
    if (d->n_merges > INT32_MAX)
        return lt_fail(LT_ERR_FORMAT, "tokenizer: %zu merges", d->n_merges);

    struct lt_tokenizer *t = calloc(1, sizeof(*t));
    if (!t)
        return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory");
    t->pre = pre;
    t->n_tokens = d->n_tokens;
    t->bos = d->bos;
    t->eos = d->eos;
    t->eot = d->eot;
    t->eom = d->eom;
    t->pad = d->pad;
    t->unk = d->unk;
    t->add_bos = d->add_bos;
    lt_status st;
    if ((st = check_special_id(t, t->bos, "bos")) || (st = check_special_id(t, t->eos, "eos")) ||
        (st = check_special_id(t, t->eot, "eot")) || (st = check_special_id(t, t->eom, "eom")) ||
        (st = check_special_id(t, t->pad, "padding")) ||
        (st = check_special_id(t, t->unk, "unknown")))
        goto out_free_tokenizer;
    if ((st = build_pools(t, d)) || (st = build_str_map(t)))
        goto out_free_tokenizer;
    build_byte_tokens(t);
    if ((st = build_merges(t, d)) || (st = build_specials(t)))
        goto out_free_tokenizer;
    add_eog(t, t->eos);
    add_eog(t, t->eot);
    add_eog(t, t->eom);
    static const char *const eog_texts[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>"};
    for (size_t i = 0; i < sizeof(eog_texts) / sizeof(eog_texts[0]); i++) {
        lt_token id = lt_tokenizer_find(t, eog_texts[i], strlen(eog_texts[i]));
        if (id != LT_TOKEN_NONE && t->types[id] == LT_TOKEN_TYPE_CONTROL)
            add_eog(t, id);
    }
    if ((st = tok_pretok_compile(t)))
        goto out_free_tokenizer;
    *out = t;
    return LT_OK;

out_free_tokenizer:
    lt_tokenizer_free(t);
    return st;
}

void lt_tokenizer_free(struct lt_tokenizer *t)
{
    if (!t)
        return;
    tok_pretok_free(t);
    free(t->types);
    free(t->text_pool);
    free(t->text_off);
    free(t->bytes_pool);
    free(t->bytes_off);
    free(t->str_slots);
    free(t->merge_slots);
    free(t->specials);
    free(t);
}
