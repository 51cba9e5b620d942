/* grammar.c: the matcher of a parsed grammar (include/lathe/grammar.h), and the
 * vocabulary masks built on it.
 *
 * State: a set of stacks of grammar positions (grammar_impl.h), each the rest of one parse,
 * top last, every top a character class; an empty stack is a finished parse. Accepting a
 * code point keeps the stacks whose top matches it, pops that top, and expands what is
 * then on top until characters are on top again (a rule reference becomes one stack per
 * alternative). Stacks are deduplicated by content, so an ambiguous grammar costs its
 * number of distinct parses, not of derivations. Expansion writes into one scratch buffer
 * and restores each slot it overwrote before returning, so alternatives share their prefix
 * without copies; its depth is bounded by the rule count, since the parser refuses left
 * recursion.
 *
 * Masks. Checking a token runs its bytes on scratch sets and leaves the committed state
 * alone. A whole-vocabulary mask first computes which bytes can begin what comes next and
 * skips the tokens whose first byte cannot: after a '"' only the handful that can close or
 * continue a string are matched, and in a number only digits and what may follow one. */
#include <stdlib.h>
#include <string.h>

#include "generate/grammar_impl.h"

#define GR_MAX_STACK 4096      /* positions in one stack: nesting deeper is refused */
#define GR_MAX_STACKS 4096     /* distinct parses at once */
#define GR_LINEAR 32           /* up to this many stacks, duplicates are found by a scan */
#define GR_EXPAND_BUDGET 20000 /* expansion steps for one character */

struct gr_set {
    uint32_t *pos; /* [n_pos] every stack's positions, back to back */
    size_t n_pos, cap_pos;
    uint32_t *off, *len; /* [n] each stack's first position in pos, and its length */
    uint64_t *hash;      /* [n] of its content, to find duplicates fast */
    size_t n, cap;
    bool has_empty; /* one stack is empty: a finished parse */
    /* beyond GR_LINEAR stacks: an open-addressing index of stack i + 1 (0: free) by hash,
     * holding stacks [0, n_indexed); ambiguous grammars ((x+)+) reach thousands */
    uint32_t *slot;
    size_t n_slot, n_indexed;
};

struct lt_grammar_matcher {
    struct lt_grammar *g; /* a reference */
    struct gr_set cur;    /* the committed state */
    struct gr_set tmp[2]; /* scratch for running bytes */
    uint32_t part;        /* the bits of an incomplete UTF-8 sequence read so far */
    uint8_t need;         /* continuation bytes it still needs; 0: none pending */
    uint8_t part_len;     /* its whole length */
    uint32_t *work;       /* [cap_work] expansion scratch */
    size_t cap_work;
    long budget;    /* expansion steps left for this character */
    bool overflow;  /* a limit (budget, stack depth, stack count, memory) was hit */
    uint32_t *rbuf; /* [cap_rbuf] scratch ranges for next_ranges */
    size_t cap_rbuf;
};

static bool grow(void **ptr, size_t *cap, size_t need, size_t elsz)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*ptr, c * elsz);
    if (!q)
        return false;
    *ptr = q;
    *cap = c;
    return true;
}

static void set_free(struct gr_set *s)
{
    free(s->pos);
    free(s->off);
    free(s->len);
    free(s->hash);
    free(s->slot);
    memset(s, 0, sizeof(*s));
}

static void set_clear(struct gr_set *s)
{
    if (s->n_indexed)
        memset(s->slot, 0, s->n_slot * sizeof(*s->slot));
    s->n = s->n_pos = s->n_indexed = 0;
    s->has_empty = false;
}

static bool same_stack(const struct gr_set *s, size_t i, uint64_t h, const uint32_t *w, size_t n)
{
    return s->hash[i] == h && s->len[i] == n &&
           (n == 0 || !memcmp(s->pos + s->off[i], w, n * sizeof(*w)));
}

/* Brings the index up to all n stacks (rebuilt at four slots a stack); false: no memory. */
static bool index_stacks(struct gr_set *s)
{
    if (s->n_slot < 4 * s->n) {
        size_t ns = 256;
        while (ns < 4 * s->n)
            ns *= 2;
        uint32_t *sl = calloc(ns, sizeof(*sl));
        if (!sl)
            return false;
        free(s->slot);
        s->slot = sl;
        s->n_slot = ns;
        s->n_indexed = 0;
    }
    for (; s->n_indexed < s->n; s->n_indexed++) {
        size_t k = (size_t)s->hash[s->n_indexed] & (s->n_slot - 1);
        while (s->slot[k])
            k = (k + 1) & (s->n_slot - 1);
        s->slot[k] = (uint32_t)s->n_indexed + 1;
    }
    return true;
}

/* Is w[0..n) (hash h) among s's stacks? -1: could not tell (no memory). */
static int has_stack(struct gr_set *s, uint64_t h, const uint32_t *w, size_t n)
{
    if (s->n <= GR_LINEAR) {
        for (size_t i = 0; i < s->n; i++)
            if (same_stack(s, i, h, w, n))
                return 1;
        return 0;
    }
    if (!index_stacks(s))
        return -1;
    for (size_t k = (size_t)h & (s->n_slot - 1); s->slot[k]; k = (k + 1) & (s->n_slot - 1))
        if (same_stack(s, s->slot[k] - 1, h, w, n))
            return 1;
    return 0;
}

static uint64_t stack_hash(const uint32_t *w, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ w[i]) * 1099511628211ull;
    return h;
}

static void add_stack(struct lt_grammar_matcher *m, struct gr_set *out, const uint32_t *w, size_t n)
{
    uint64_t h = stack_hash(w, n);
    int dup = has_stack(out, h, w, n);
    if (dup == 1)
        return;
    if (dup < 0 || out->n >= GR_MAX_STACKS ||
        !grow((void **)&out->pos, &out->cap_pos, out->n_pos + n, sizeof(*out->pos))) {
        m->overflow = true;
        return;
    }
    if (out->n == out->cap) {
        /* the three arrays share one capacity, raised once all three have grown */
        size_t c_off = out->cap, c_len = out->cap, c_hash = out->cap;
        if (!grow((void **)&out->off, &c_off, out->n + 1, sizeof(*out->off)) ||
            !grow((void **)&out->len, &c_len, out->n + 1, sizeof(*out->len)) ||
            !grow((void **)&out->hash, &c_hash, out->n + 1, sizeof(*out->hash))) {
            m->overflow = true;
            return;
        }
        out->cap = c_off;
    }
    if (n > 0) /* an empty stack may come while pos is still NULL */
        memcpy(out->pos + out->n_pos, w, n * sizeof(*w));
    out->off[out->n] = (uint32_t)out->n_pos;
    out->len[out->n] = (uint32_t)n;
    out->hash[out->n] = h;
    out->n++;
    out->n_pos += n;
    out->has_empty |= n == 0;
}

/* Adds to out every stack that work[0..n) becomes once characters are on top. */
static void expand(struct lt_grammar_matcher *m, struct gr_set *out, size_t n)
{
    const struct lt_grammar *g = m->g;
    uint32_t *w = m->work;
    if (--m->budget < 0 || n > GR_MAX_STACK) {
        m->overflow = true;
        return;
    }
    if (n == 0 || g->els[w[n - 1]].type == GR_CHARS) {
        add_stack(m, out, w, n);
        return;
    }
    uint32_t top = w[n - 1];
    const struct gr_rule *rl = &g->rules[g->els[top].a];
    bool cont = g->els[top + 1].type != GR_END;
    size_t base = cont ? n : n - 1;
    for (uint32_t k = 0; k < rl->n_alts; k++) {
        if (cont)
            w[n - 1] = top + 1;
        uint32_t a = g->alts[rl->alt0 + k];
        if (g->els[a].type != GR_END) {
            w[base] = a;
            expand(m, out, base + 1);
        } else {
            expand(m, out, base);
        }
    }
    w[n - 1] = top;
}

/* The scratch must hold the longest stack plus one push per rule (an expansion's depth). */
static bool reserve_work(struct lt_grammar_matcher *m, const struct gr_set *in)
{
    size_t longest = 0;
    for (size_t i = 0; i < in->n; i++)
        longest = in->len[i] > longest ? in->len[i] : longest;
    if (grow((void **)&m->work, &m->cap_work, longest + m->g->n_rules + 2, sizeof(*m->work)))
        return true;
    m->overflow = true;
    return false;
}

/* out = the stacks of `in` after code point c. */
static void advance(struct lt_grammar_matcher *m, const struct gr_set *in, uint32_t c,
                    struct gr_set *out)
{
    const struct lt_grammar *g = m->g;
    set_clear(out);
    if (!reserve_work(m, in))
        return;
    m->budget = GR_EXPAND_BUDGET;
    for (size_t i = 0; i < in->n; i++) {
        size_t n = in->len[i];
        if (n == 0)
            continue;
        const uint32_t *s = in->pos + in->off[i];
        uint32_t top = s[n - 1];
        if (!gr_chars_match(g, &g->els[top], c))
            continue;
        memcpy(m->work, s, (n - 1) * sizeof(*s));
        if (g->els[top + 1].type != GR_END) {
            m->work[n - 1] = top + 1;
            expand(m, out, n);
        } else {
            expand(m, out, n - 1);
        }
    }
}

static void start_state(struct lt_grammar_matcher *m)
{
    set_clear(&m->cur);
    m->need = m->part_len = 0;
    m->part = 0;
    m->overflow = false;
    m->budget = GR_EXPAND_BUDGET;
    const struct lt_grammar *g = m->g;
    const struct gr_rule *rl = &g->rules[g->root];
    for (uint32_t k = 0; k < rl->n_alts; k++) {
        uint32_t a = g->alts[rl->alt0 + k];
        m->work[0] = a;
        expand(m, &m->cur, g->els[a].type != GR_END ? 1 : 0);
    }
}

lt_status lt_grammar_matcher_new(struct lt_grammar *g, struct lt_grammar_matcher **out)
{
    *out = NULL;
    struct lt_grammar_matcher *m = calloc(1, sizeof(*m));
    if (!m)
        return lt_fail(LT_ERR_NOMEM, "grammar: out of memory for a matcher");
    m->g = lt_grammar_ref(g);
    if (!grow((void **)&m->work, &m->cap_work, g->n_rules + 2, sizeof(*m->work))) {
        lt_grammar_matcher_free(m);
        return lt_fail(LT_ERR_NOMEM, "grammar: out of memory for a matcher");
    }
    start_state(m);
    if (m->overflow) {
        lt_grammar_matcher_free(m);
        return lt_fail(LT_ERR_INVALID, "grammar: its start expands into too many parses");
    }
    *out = m;
    return LT_OK;
}

void lt_grammar_matcher_free(struct lt_grammar_matcher *m)
{
    if (!m)
        return;
    set_free(&m->cur);
    set_free(&m->tmp[0]);
    set_free(&m->tmp[1]);
    free(m->work);
    free(m->rbuf);
    lt_grammar_free(m->g);
    free(m);
}

void lt_grammar_matcher_reset(struct lt_grammar_matcher *m)
{
    start_state(m);
}

/* UTF-8 decoding state, copied so a trial leaves the matcher's alone. */
struct utf8 {
    uint32_t part;
    uint8_t need, len;
};

/* Some stack could take a code point that starts with the pending bytes of u. */
static bool partial_ok(const struct lt_grammar *g, const struct gr_set *s, const struct utf8 *u)
{
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000}; /* by sequence length */
    uint32_t lo = u->part << (6 * u->need), hi = lo | ((1u << (6 * u->need)) - 1);
    lo = lo < least[u->len] ? least[u->len] : lo;
    hi = hi > GR_MAX_CODEPOINT ? GR_MAX_CODEPOINT : hi;
    if (lo > hi)
        return false;
    for (size_t i = 0; i < s->n; i++) {
        if (s->len[i] == 0)
            continue;
        const struct gr_el *e = &g->els[s->pos[s->off[i] + s->len[i] - 1]];
        const uint32_t *r = g->ranges + e->a;
        bool covered = false; /* for a negated class: one range holds all of [lo, hi] */
        for (uint32_t k = 0; k < e->n; k++) {
            if (!e->negated && r[2 * k] <= hi && r[2 * k + 1] >= lo)
                return true;
            covered |= r[2 * k] <= lo && r[2 * k + 1] >= hi;
        }
        if (e->negated && !covered)
            return true;
    }
    return false;
}

/* Feeds one byte to u; returns 1 with *cp when a code point is complete, 0 when more bytes
 * are needed, -1 for bytes that are not UTF-8. */
static int utf8_feed(struct utf8 *u, unsigned char c, uint32_t *cp)
{
    if (u->need == 0) {
        if (c < 0x80) {
            *cp = c;
            return 1;
        }
        int need = c >= 0xC2 && c <= 0xDF   ? 1
                   : c >= 0xE0 && c <= 0xEF ? 2
                   : c >= 0xF0 && c <= 0xF4 ? 3
                                            : 0;
        if (!need)
            return -1;
        u->need = (uint8_t)need;
        u->len = (uint8_t)(need + 1);
        u->part = c & (0x3Fu >> need);
        return 0;
    }
    if ((c & 0xC0) != 0x80)
        return -1;
    u->part = (u->part << 6) | (c & 0x3F);
    if (--u->need > 0)
        return 0;
    uint32_t v = u->part;
    if ((u->len == 3 && v < 0x800) || (u->len == 4 && (v < 0x10000 || v > GR_MAX_CODEPOINT)) ||
        (v >= 0xD800 && v <= 0xDFFF))
        return -1;
    *cp = v;
    return 1;
}

/* Runs bytes from the committed state on the scratch sets: the resulting set (m->cur when
 * no code point completed) and *u, or NULL when they do not fit. */
static const struct gr_set *run_bytes(struct lt_grammar_matcher *m, const char *bytes, size_t n,
                                      struct utf8 *u)
{
    const struct gr_set *src = &m->cur;
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp;
        int r = utf8_feed(u, (unsigned char)bytes[i], &cp);
        if (r < 0)
            return NULL;
        if (r == 0)
            continue;
        advance(m, src, cp, &m->tmp[k]);
        src = &m->tmp[k];
        k ^= 1;
        if (src->n == 0)
            return NULL;
    }
    if (u->need > 0 && !partial_ok(m->g, src, u))
        return NULL;
    return src;
}

bool lt_grammar_matcher_allows(struct lt_grammar_matcher *m, const char *bytes, size_t n)
{
    struct utf8 u = {m->part, m->need, m->part_len};
    return run_bytes(m, bytes, n, &u) != NULL;
}

lt_status lt_grammar_matcher_accept(struct lt_grammar_matcher *m, const char *bytes, size_t n)
{
    struct utf8 u = {m->part, m->need, m->part_len};
    m->overflow = false;
    const struct gr_set *s = run_bytes(m, bytes, n, &u);
    if (!s)
        return lt_fail(LT_ERR_INVALID, m->overflow
                                           ? "grammar: the text nests too deeply or has too "
                                             "many parses to follow"
                                           : "grammar: the text does not fit the grammar");
    if (s != &m->cur) {
        struct gr_set *w = s == &m->tmp[0] ? &m->tmp[0] : &m->tmp[1];
        struct gr_set t = m->cur;
        m->cur = *w;
        *w = t;
    }
    m->part = u.part;
    m->need = u.need;
    m->part_len = u.len;
    return LT_OK;
}

bool lt_grammar_matcher_can_end(const struct lt_grammar_matcher *m)
{
    return m->need == 0 && m->cur.has_empty;
}

bool lt_grammar_matcher_done(const struct lt_grammar_matcher *m)
{
    return lt_grammar_matcher_can_end(m) && m->cur.n == 1;
}

/* Appends range [lo, hi] to m->rbuf at *n (when it fits in cap, else only counts it). */
static void put_range(uint32_t *lo_out, uint32_t *hi_out, size_t cap, size_t *n, uint32_t lo,
                      uint32_t hi)
{
    if (*n < cap) {
        lo_out[*n] = lo;
        hi_out[*n] = hi;
    }
    (*n)++;
}

/* The complement of a negated class's ranges, in order: sorts a copy by lower bound. */
static size_t complement(struct lt_grammar_matcher *m, const struct gr_el *e, uint32_t *lo,
                         uint32_t *hi, size_t cap, size_t n)
{
    if (!grow((void **)&m->rbuf, &m->cap_rbuf, 2 * (size_t)e->n + 2, sizeof(*m->rbuf))) {
        put_range(lo, hi, cap, &n, 0, GR_MAX_CODEPOINT); /* too wide beats too narrow */
        return n;
    }
    uint32_t *r = m->rbuf;
    memcpy(r, m->g->ranges + e->a, 2 * e->n * sizeof(*r));
    for (uint32_t i = 1; i < e->n; i++)
        for (uint32_t j = i; j > 0 && r[2 * j] < r[2 * (j - 1)]; j--) {
            uint32_t a = r[2 * j], b = r[2 * j + 1];
            r[2 * j] = r[2 * (j - 1)];
            r[2 * j + 1] = r[2 * (j - 1) + 1];
            r[2 * (j - 1)] = a;
            r[2 * (j - 1) + 1] = b;
        }
    uint32_t from = 0; /* the first code point not yet excluded or emitted */
    for (uint32_t i = 0; i < e->n && from <= GR_MAX_CODEPOINT; i++) {
        if (r[2 * i] > from)
            put_range(lo, hi, cap, &n, from, r[2 * i] - 1);
        if (r[2 * i + 1] + 1 > from)
            from = r[2 * i + 1] + 1;
    }
    if (from <= GR_MAX_CODEPOINT)
        put_range(lo, hi, cap, &n, from, GR_MAX_CODEPOINT);
    return n;
}

size_t lt_grammar_matcher_next_ranges(struct lt_grammar_matcher *m, uint32_t *lo, uint32_t *hi,
                                      size_t cap)
{
    const struct lt_grammar *g = m->g;
    size_t n = 0;
    if (m->need > 0)
        return 0;
    for (size_t i = 0; i < m->cur.n; i++) {
        if (m->cur.len[i] == 0)
            continue;
        const struct gr_el *e = &g->els[m->cur.pos[m->cur.off[i] + m->cur.len[i] - 1]];
        if (e->negated) {
            n = complement(m, e, lo, hi, cap, n);
            continue;
        }
        for (uint32_t k = 0; k < e->n; k++)
            put_range(lo, hi, cap, &n, g->ranges[e->a + 2 * k], g->ranges[e->a + 2 * k + 1]);
    }
    return n;
}

/* The first byte of code point c's UTF-8 form (monotonic in c). */
static unsigned lead_byte(uint32_t c)
{
    return c < 0x80      ? c
           : c < 0x800   ? 0xC0 | (c >> 6)
           : c < 0x10000 ? 0xE0 | (c >> 12)
                         : 0xF0 | (c >> 18);
}

/* first[b]: some allowed next character's UTF-8 form starts with byte b (everything while
 * a sequence is pending: its continuation bytes are checked by matching). */
static void first_bytes(struct lt_grammar_matcher *m, bool first[256])
{
    if (m->need > 0) {
        memset(first, 1, 256);
        return;
    }
    memset(first, 0, 256);
    uint32_t lo[64], hi[64];
    size_t n = lt_grammar_matcher_next_ranges(m, lo, hi, 64);
    if (n > 64) {
        memset(first, 1, 256); /* many ranges: no filter, the matching still decides */
        return;
    }
    for (size_t i = 0; i < n; i++)
        for (unsigned b = lead_byte(lo[i]); b <= lead_byte(hi[i]) && b < 256; b++)
            first[b] = true;
}

static bool token_allowed(struct lt_grammar_matcher *m, const struct lt_tokenizer *t, lt_token id,
                          const bool *first, bool can_end)
{
    if (lt_tokenizer_is_eog(t, id))
        return can_end;
    enum lt_token_type ty = lt_tokenizer_token_type(t, id);
    if (ty == LT_TOKEN_TYPE_CONTROL || ty == LT_TOKEN_TYPE_UNKNOWN || ty == LT_TOKEN_TYPE_UNUSED)
        return false;
    size_t n;
    const char *b = lt_tokenizer_token_bytes(t, id, &n);
    if (!b || n == 0 || (first && !first[(unsigned char)b[0]]))
        return false;
    return lt_grammar_matcher_allows(m, b, n);
}

bool lt_grammar_token_allowed(struct lt_grammar_matcher *m, const struct lt_tokenizer *t,
                              lt_token id)
{
    if (id < 0 || (size_t)id >= lt_tokenizer_n_tokens(t))
        return false;
    return token_allowed(m, t, id, NULL, lt_grammar_matcher_can_end(m));
}

size_t lt_grammar_token_mask(struct lt_grammar_matcher *m, const struct lt_tokenizer *t,
                             size_t n_vocab, bool *allowed)
{
    bool first[256];
    first_bytes(m, first);
    bool can_end = lt_grammar_matcher_can_end(m);
    size_t n_tok = lt_tokenizer_n_tokens(t), count = 0;
    for (size_t i = 0; i < n_vocab; i++) {
        allowed[i] = i < n_tok && token_allowed(m, t, (lt_token)i, first, can_end);
        count += allowed[i];
    }
    return count;
}
