/* grammar_parse.c: GBNF text to the compiled grammar of grammar_impl.h.
 *
 * A recursive-descent parser. Each rule's alternatives are built in scratch vectors and
 * appended to the grammar's element array only when the rule is complete, so every rule's
 * alternatives are contiguous even though groups and repetitions create rules while their
 * parent is still being read. Operators are rewritten as rules:
 *   x*      R ::= x R | ""           (emitted: R)
 *   x+      x R, with R as for x*
 *   x?      R ::= x | ""
 *   x{m,n}  m copies of x, then O(n-m) where O(1) ::= x | "" and O(k) ::= x O(k-1) | ""
 * where x is one element: a group or a literal of several characters is first made a rule
 * of its own. Whitespace, newlines and comments may appear between any two items; a rule
 * ends where the next `name ::=` starts, so rules may span lines in any layout. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate/grammar_impl.h"

#define GR_MAX_REPEAT 1000  /* {m,n} bounds: each copy is grammar, not a counter */
#define GR_MAX_RULES 100000 /* generated ones included */
#define GR_MAX_DEPTH 200    /* nested groups */

struct elvec {
    struct gr_el *v;
    size_t n, cap;
};

struct altvec {
    struct elvec *v;
    size_t n, cap;
};

struct parser {
    const char *s, *p, *end;
    struct lt_grammar *g;
    size_t cap_els, cap_ranges, cap_alts, cap_rules;
    uint32_t top;   /* the rule being defined, for generated rules' names */
    uint32_t n_gen; /* rules generated for it so far */
    int depth;
    lt_status st; /* the first failure; LT_OK while parsing goes well */
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

/* Records the first failure, with the line and column of `at`. */
static bool perr(struct parser *P, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool perr(struct parser *P, const char *at, const char *fmt, ...)
{
    if (P->st != LT_OK)
        return false;
    int line = 1, col = 1;
    for (const char *q = P->s; q < at && q < P->end; q++, col++)
        if (*q == '\n') {
            line++;
            col = 0;
        }
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    P->st = lt_fail(LT_ERR_INVALID, "grammar: line %d, column %d: %s", line, col, msg);
    return false;
}

static bool nomem(struct parser *P)
{
    if (P->st == LT_OK)
        P->st = lt_fail(LT_ERR_NOMEM, "grammar: out of memory");
    return false;
}

static bool push_el(struct parser *P, struct elvec *seq, struct gr_el e)
{
    if (!grow((void **)&seq->v, &seq->cap, seq->n + 1, sizeof(*seq->v)))
        return nomem(P);
    seq->v[seq->n++] = e;
    return true;
}

/* A class of nr ranges (lo/hi pairs in r) as one element of seq. */
static bool push_chars(struct parser *P, struct elvec *seq, const uint32_t *r, uint32_t nr,
                       bool negated)
{
    struct lt_grammar *g = P->g;
    /* room for one pair more than needed: ranges is never NULL once a class exists, so
     * ranges + a is defined even for the range-less '.' */
    if (!grow((void **)&g->ranges, &P->cap_ranges, g->n_ranges + 2 * (size_t)nr + 2,
              sizeof(uint32_t)))
        return nomem(P);
    struct gr_el e = {.type = GR_CHARS, .negated = negated, .a = g->n_ranges, .n = nr};
    if (nr)
        memcpy(g->ranges + g->n_ranges, r, 2 * nr * sizeof(uint32_t));
    g->n_ranges += 2 * nr;
    return push_el(P, seq, e);
}

static bool push_char(struct parser *P, struct elvec *seq, uint32_t c)
{
    uint32_t r[2] = {c, c};
    return push_chars(P, seq, r, 1, false);
}

static void altvec_free(struct altvec *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i].v);
    free(a->v);
    memset(a, 0, sizeof(*a));
}

static struct elvec *altvec_add(struct parser *P, struct altvec *a)
{
    if (!grow((void **)&a->v, &a->cap, a->n + 1, sizeof(*a->v))) {
        nomem(P);
        return NULL;
    }
    memset(&a->v[a->n], 0, sizeof(a->v[0]));
    return &a->v[a->n++];
}

/* ---- rules ---- */

/* Generated rules are named "<rule>/<n>": '/' is no name character, so they never clash
 * with a rule of the text. */

static int64_t find_rule(const struct lt_grammar *g, const char *name, size_t len)
{
    for (uint32_t i = 0; i < g->n_rules; i++)
        if (strlen(g->rules[i].name) == len && !memcmp(g->rules[i].name, name, len))
            return i;
    return -1;
}

static int64_t add_rule(struct parser *P, const char *name, size_t len)
{
    struct lt_grammar *g = P->g;
    if (g->n_rules >= GR_MAX_RULES) {
        perr(P, P->p, "more than %d rules (repetition bounds count)", GR_MAX_RULES);
        return -1;
    }
    if (!grow((void **)&g->rules, &P->cap_rules, g->n_rules + 1, sizeof(*g->rules)))
        return nomem(P), -1;
    char *copy = malloc(len + 1);
    if (!copy)
        return nomem(P), -1;
    memcpy(copy, name, len);
    copy[len] = 0;
    g->rules[g->n_rules] = (struct gr_rule){.name = copy};
    return g->n_rules++;
}

static int64_t rule_by_name(struct parser *P, const char *name, size_t len)
{
    int64_t r = find_rule(P->g, name, len);
    return r >= 0 ? r : add_rule(P, name, len);
}

static int64_t gen_rule(struct parser *P)
{
    char name[160];
    snprintf(name, sizeof(name), "%.120s/%u", P->g->rules[P->top].name, ++P->n_gen);
    return add_rule(P, name, strlen(name));
}

/* Appends the alternatives of rule r (complete now) to the grammar. */
static bool commit_rule(struct parser *P, uint32_t r, const struct altvec *a)
{
    struct lt_grammar *g = P->g;
    size_t n_els = 0;
    for (size_t i = 0; i < a->n; i++)
        n_els += a->v[i].n + 1;
    if (!grow((void **)&g->els, &P->cap_els, g->n_els + n_els, sizeof(*g->els)) ||
        !grow((void **)&g->alts, &P->cap_alts, g->n_alts + a->n, sizeof(*g->alts)))
        return nomem(P);
    g->rules[r].alt0 = g->n_alts;
    g->rules[r].n_alts = (uint32_t)a->n;
    g->rules[r].defined = true;
    for (size_t i = 0; i < a->n; i++) {
        g->alts[g->n_alts++] = g->n_els;
        if (a->v[i].n)
            memcpy(g->els + g->n_els, a->v[i].v, a->v[i].n * sizeof(*g->els));
        g->n_els += (uint32_t)a->v[i].n;
        g->els[g->n_els++] = (struct gr_el){.type = GR_END};
    }
    return true;
}

/* A generated rule whose first alternative is first[0..n_first) and, when or_empty, whose
 * second is empty; returns its id or -1. */
static int64_t rule_of(struct parser *P, const struct gr_el *first, size_t n_first, bool or_empty)
{
    int64_t r = gen_rule(P);
    if (r < 0)
        return -1;
    struct altvec a = {0};
    struct elvec *x = altvec_add(P, &a);
    bool ok = x && (!or_empty || altvec_add(P, &a));
    for (size_t i = 0; ok && i < n_first; i++)
        ok = push_el(P, &a.v[0], first[i]);
    ok = ok && commit_rule(P, (uint32_t)r, &a);
    altvec_free(&a);
    return ok ? r : -1;
}

/* ---- lexing ---- */

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static void skip_space(struct parser *P)
{
    while (P->p < P->end) {
        char c = *P->p;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            P->p++;
        else if (c == '#')
            while (P->p < P->end && *P->p != '\n')
                P->p++;
        else
            break;
    }
}

/* At `name ::=`? */
static bool at_rule_start(const struct parser *P)
{
    const char *q = P->p;
    if (q >= P->end || !is_name_char(*q))
        return false;
    while (q < P->end && is_name_char(*q))
        q++;
    while (q < P->end && (*q == ' ' || *q == '\t'))
        q++;
    return P->end - q >= 3 && !memcmp(q, "::=", 3);
}

/* One UTF-8 code point at P->p (advanced past it). */
static bool read_utf8(struct parser *P, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)P->p;
    size_t n = lt_utf8_seq_len(s, (size_t)(P->end - P->p));
    if (n == 0)
        return perr(P, P->p, "invalid UTF-8 (byte 0x%02X)", s[0]);
    uint32_t c = n == 1 ? s[0] : n == 2 ? s[0] & 0x1F : n == 3 ? s[0] & 0x0F : s[0] & 0x07;
    for (size_t i = 1; i < n; i++)
        c = (c << 6) | (s[i] & 0x3F);
    P->p += n;
    *cp = c;
    return true;
}

static bool read_hex(struct parser *P, int digits, uint32_t *cp)
{
    const char *at = P->p;
    uint32_t v = 0;
    for (int i = 0; i < digits; i++, P->p++) {
        char c = P->p < P->end ? *P->p : 0;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return perr(P, at, "escape needs %d hex digits", digits);
        v = v * 16 + (uint32_t)d;
    }
    if (v > GR_MAX_CODEPOINT)
        return perr(P, at, "code point U+%X is past U+10FFFF", v);
    *cp = v;
    return true;
}

/* One character of a literal or class, escapes decoded. */
static bool read_char(struct parser *P, uint32_t *cp)
{
    if (P->p >= P->end)
        return perr(P, P->p, "unexpected end of the grammar");
    if (*P->p != '\\')
        return read_utf8(P, cp);
    const char *at = P->p++;
    char e = P->p < P->end ? *P->p++ : 0;
    switch (e) {
    case 'n': *cp = '\n'; return true;
    case 'r': *cp = '\r'; return true;
    case 't': *cp = '\t'; return true;
    case '0': *cp = 0; return true;
    case '\\':
    case '"':
    case '\'':
    case '[':
    case ']':
    case '-':
    case '^':
    case '/': *cp = (uint32_t)e; return true;
    case 'x': return read_hex(P, 2, cp);
    case 'u': return read_hex(P, 4, cp);
    case 'U': return read_hex(P, 8, cp);
    default: return perr(P, at, "unknown escape '\\%c'", e ? e : '0');
    }
}

/* ---- syntax ---- */

static bool parse_alternates(struct parser *P, struct altvec *out);

static bool parse_literal(struct parser *P, struct elvec *seq)
{
    const char *open = P->p++;
    while (P->p < P->end && *P->p != '"') {
        uint32_t c;
        if (!read_char(P, &c) || !push_char(P, seq, c))
            return false;
    }
    if (P->p >= P->end)
        return perr(P, open, "string literal is not closed");
    P->p++;
    return true;
}

static bool parse_class(struct parser *P, struct elvec *seq)
{
    const char *open = P->p++;
    bool neg = P->p < P->end && *P->p == '^';
    P->p += neg;
    uint32_t *r = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    while (ok && P->p < P->end && *P->p != ']') {
        uint32_t lo, hi;
        const char *at = P->p;
        ok = read_char(P, &lo);
        hi = lo;
        if (ok && P->end - P->p >= 2 && P->p[0] == '-' && P->p[1] != ']') {
            P->p++;
            ok = read_char(P, &hi);
            if (ok && hi < lo)
                ok = perr(P, at, "character range is backwards (U+%X after U+%X)", hi, lo);
        }
        if (ok && !grow((void **)&r, &cap, 2 * (n + 1), sizeof(*r)))
            ok = nomem(P);
        if (ok) {
            r[2 * n] = lo;
            r[2 * n + 1] = hi;
            n++;
        }
    }
    if (ok && P->p >= P->end)
        ok = perr(P, open, "character class is not closed");
    if (ok) {
        P->p++;
        ok = push_chars(P, seq, r, (uint32_t)n, neg);
    }
    free(r);
    return ok;
}

static bool parse_group(struct parser *P, struct elvec *seq)
{
    const char *open = P->p++;
    if (++P->depth > GR_MAX_DEPTH)
        return perr(P, open, "groups nested deeper than %d", GR_MAX_DEPTH);
    int64_t r = gen_rule(P);
    struct altvec a = {0};
    bool ok = r >= 0 && parse_alternates(P, &a);
    skip_space(P);
    if (ok && (P->p >= P->end || *P->p != ')'))
        ok = perr(P, open, "'(' is not closed");
    if (ok) {
        P->p++;
        ok = commit_rule(P, (uint32_t)r, &a) &&
             push_el(P, seq, (struct gr_el){.type = GR_REF, .a = (uint32_t)r});
    }
    altvec_free(&a);
    P->depth--;
    return ok;
}

/* Reads {m}, {m,} or {m,n} at P->p; max UINT32_MAX: unbounded. */
static bool parse_braces(struct parser *P, uint32_t *min, uint32_t *max)
{
    const char *open = P->p++;
    unsigned long v[2] = {0, 0};
    int k = 0;
    bool have[2] = {false, false}, comma = false;
    for (; P->p < P->end && *P->p != '}'; P->p++) {
        char c = *P->p;
        if (c >= '0' && c <= '9') {
            v[k] = v[k] * 10 + (unsigned long)(c - '0');
            have[k] = true;
            if (v[k] > GR_MAX_REPEAT)
                return perr(P, open, "repetition bound over %d", GR_MAX_REPEAT);
        } else if (c == ',' && !comma) {
            comma = true;
            k = 1;
        } else if (c != ' ') {
            return perr(P, P->p, "unexpected '%c' in a repetition {m,n}", c);
        }
    }
    if (P->p >= P->end || !have[0])
        return perr(P, open, "repetition needs {m}, {m,} or {m,n}");
    P->p++;
    *min = (uint32_t)v[0];
    *max = !comma ? *min : have[1] ? (uint32_t)v[1] : UINT32_MAX;
    if (*max < *min)
        return perr(P, open, "repetition {%u,%u} has its maximum below its minimum", *min, *max);
    return true;
}

/* Rewrites seq[start..) (the operand) as min..max repetitions of itself. */
static bool apply_repeat(struct parser *P, struct elvec *seq, size_t start, uint32_t min,
                         uint32_t max)
{
    if (seq->n - start != 1) { /* a literal of several characters: a rule of its own */
        int64_t r = rule_of(P, seq->v + start, seq->n - start, false);
        if (r < 0)
            return false;
        seq->n = start;
        if (!push_el(P, seq, (struct gr_el){.type = GR_REF, .a = (uint32_t)r}))
            return false;
    }
    struct gr_el x = seq->v[start];
    seq->n = start;
    for (uint32_t i = 0; i < min; i++)
        if (!push_el(P, seq, x))
            return false;
    if (max == UINT32_MAX) {
        int64_t r = gen_rule(P);
        if (r < 0)
            return false;
        struct gr_el body[2] = {x, {.type = GR_REF, .a = (uint32_t)r}};
        struct altvec a = {0};
        bool ok = altvec_add(P, &a) && altvec_add(P, &a) && push_el(P, &a.v[0], body[0]) &&
                  push_el(P, &a.v[0], body[1]) && commit_rule(P, (uint32_t)r, &a);
        altvec_free(&a);
        return ok && push_el(P, seq, body[1]);
    }
    int64_t prev = -1;
    for (uint32_t k = 0; k < max - min; k++) {
        struct gr_el body[2] = {x, {.type = GR_REF, .a = (uint32_t)prev}};
        prev = rule_of(P, body, prev < 0 ? 1 : 2, true);
        if (prev < 0)
            return false;
    }
    return prev < 0 || push_el(P, seq, (struct gr_el){.type = GR_REF, .a = (uint32_t)prev});
}

static bool parse_postfix(struct parser *P, struct elvec *seq, size_t start)
{
    for (;;) {
        skip_space(P);
        if (P->p >= P->end)
            return true;
        uint32_t min = 0, max = 0;
        char c = *P->p;
        if (c == '*' || c == '+' || c == '?') {
            P->p++;
            min = c == '+';
            max = c == '?' ? 1 : UINT32_MAX;
        } else if (c == '{') {
            if (!parse_braces(P, &min, &max))
                return false;
        } else {
            return true;
        }
        if (seq->n == start)
            continue; /* an empty literal repeated is still empty */
        if (!apply_repeat(P, seq, start, min, max))
            return false;
    }
}

/* One alternative: items until '|', ')', the next rule or the end. */
static bool parse_sequence(struct parser *P, struct elvec *seq)
{
    for (;;) {
        skip_space(P);
        if (P->p >= P->end || at_rule_start(P))
            return true;
        size_t start = seq->n;
        char c = *P->p;
        bool ok;
        if (c == '"')
            ok = parse_literal(P, seq);
        else if (c == '[')
            ok = parse_class(P, seq);
        else if (c == '.') {
            P->p++;
            ok = push_chars(P, seq, NULL, 0, true);
        } else if (c == '(')
            ok = parse_group(P, seq);
        else if (is_name_char(c)) {
            const char *name = P->p;
            while (P->p < P->end && is_name_char(*P->p))
                P->p++;
            int64_t r = rule_by_name(P, name, (size_t)(P->p - name));
            ok = r >= 0 && push_el(P, seq, (struct gr_el){.type = GR_REF, .a = (uint32_t)r});
        } else
            return true; /* '|', ')' or something the caller reports */
        if (!ok || !parse_postfix(P, seq, start))
            return false;
    }
}

static bool parse_alternates(struct parser *P, struct altvec *out)
{
    for (;;) {
        struct elvec *seq = altvec_add(P, out);
        if (!seq || !parse_sequence(P, seq))
            return false;
        skip_space(P);
        if (P->p >= P->end || *P->p != '|')
            return true;
        P->p++;
    }
}

static bool parse_rule(struct parser *P)
{
    const char *name = P->p;
    while (P->p < P->end && is_name_char(*P->p))
        P->p++;
    if (P->p == name)
        return perr(P, name, "expected a rule name, found '%c'", *name);
    size_t len = (size_t)(P->p - name);
    skip_space(P);
    if (P->end - P->p < 3 || memcmp(P->p, "::=", 3))
        return perr(P, P->p, "expected '::=' after rule name '%.*s'", (int)len, name);
    P->p += 3;
    int64_t r = rule_by_name(P, name, len);
    if (r < 0)
        return false;
    if (P->g->rules[r].defined)
        return perr(P, name, "rule '%.*s' is defined twice", (int)len, name);
    P->top = (uint32_t)r;
    P->n_gen = 0;
    struct altvec a = {0};
    bool ok = parse_alternates(P, &a) && commit_rule(P, (uint32_t)r, &a);
    altvec_free(&a);
    skip_space(P);
    if (ok && P->p < P->end && !at_rule_start(P))
        ok = perr(P, P->p, "unexpected '%c' in rule '%.*s'", *P->p, (int)len, name);
    return ok;
}

/* ---- checks on the whole grammar ---- */

/* nullable[r]: rule r can match the empty string (a fixpoint over the rules). */
static void find_nullable(const struct lt_grammar *g, bool *nullable)
{
    bool changed = true;
    while (changed) {
        changed = false;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            const struct gr_rule *rl = &g->rules[r];
            for (uint32_t k = 0; k < rl->n_alts && !nullable[r]; k++) {
                const struct gr_el *e = g->els + g->alts[rl->alt0 + k];
                while (e->type == GR_REF && nullable[e->a])
                    e++;
                if (e->type == GR_END)
                    nullable[r] = changed = true;
            }
        }
    }
}

/* Depth-first over "r can start with s" (s after only nullable rules): a rule met again on
 * the path is left-recursive, and expanding it would never end. color: 0 new, 1 on the
 * path, 2 done. */
static lt_status check_left(const struct lt_grammar *g, const bool *nullable, uint8_t *color,
                            uint32_t r)
{
    color[r] = 1;
    const struct gr_rule *rl = &g->rules[r];
    for (uint32_t k = 0; k < rl->n_alts; k++) {
        for (const struct gr_el *e = g->els + g->alts[rl->alt0 + k]; e->type == GR_REF; e++) {
            if (color[e->a] == 1)
                return lt_fail(LT_ERR_INVALID,
                               "grammar: rule '%s' is left-recursive: it comes back to itself "
                               "through '%s' without reading a character",
                               g->rules[e->a].name, rl->name);
            if (color[e->a] == 0) {
                lt_status st = check_left(g, nullable, color, e->a);
                if (st != LT_OK)
                    return st;
            }
            if (!nullable[e->a])
                break;
        }
    }
    color[r] = 2;
    return LT_OK;
}

static lt_status check_grammar(struct lt_grammar *g)
{
    for (uint32_t r = 0; r < g->n_rules; r++)
        if (!g->rules[r].defined)
            return lt_fail(LT_ERR_INVALID, "grammar: rule '%s' is used but not defined",
                           g->rules[r].name);
    int64_t root = find_rule(g, "root", 4);
    if (root < 0)
        return lt_fail(LT_ERR_INVALID, "grammar: there is no 'root' rule");
    g->root = (uint32_t)root;
    bool *nullable = calloc(g->n_rules, sizeof(*nullable));
    uint8_t *color = calloc(g->n_rules, 1);
    lt_status st = nullable && color ? LT_OK : lt_fail(LT_ERR_NOMEM, "grammar: out of memory");
    if (st == LT_OK)
        find_nullable(g, nullable);
    for (uint32_t r = 0; r < g->n_rules && st == LT_OK; r++)
        if (color[r] == 0)
            st = check_left(g, nullable, color, r);
    free(color);
    free(nullable);
    return st;
}

lt_status lt_grammar_parse(const char *text, size_t len, struct lt_grammar **out)
{
    *out = NULL;
    struct lt_grammar *g = calloc(1, sizeof(*g));
    if (!g)
        return lt_fail(LT_ERR_NOMEM, "grammar: out of memory");
    atomic_init(&g->refs, 1);
    struct parser P = {.s = text, .p = text, .end = text + len, .g = g};
    for (;;) {
        skip_space(&P);
        if (P.p >= P.end || !parse_rule(&P))
            break;
    }
    lt_status st = P.st != LT_OK ? P.st : check_grammar(g);
    if (st != LT_OK) {
        lt_grammar_free(g);
        return st;
    }
    *out = g;
    return LT_OK;
}

struct lt_grammar *lt_grammar_ref(struct lt_grammar *g)
{
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void lt_grammar_free(struct lt_grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1)
        return;
    for (uint32_t r = 0; r < g->n_rules; r++)
        free(g->rules[r].name);
    free(g->rules);
    free(g->alts);
    free(g->els);
    free(g->ranges);
    free(g);
}

size_t lt_grammar_n_rules(const struct lt_grammar *g)
{
    return g->n_rules;
}
