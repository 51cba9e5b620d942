/* json_schema_pattern.c: a JSON Schema "pattern" (an ECMAScript regular expression) to
 * GBNF, for json_schema.c.
 *
 * The regular expression speaks of the string's decoded characters, the grammar of the
 * JSON text between the quotes. So every character the expression allows is written in
 * one JSON spelling: as itself, except '"' and '\' (written \" and \\) and the controls
 * U+0000-U+001F, which JSON must escape (\b \t \n \f \r, the others \u00xx). A class is a
 * sorted set of code point ranges; its GBNF is a character class of the characters written
 * as themselves, plus one alternative per escaped spelling.
 *
 * The subset: literals, escapes (\d \w \s \D \W \S, \n \r \t \f \v \0 \cX \xHH \uHHHH
 * \u{H...}, and any punctuation escaped), classes [...] and [^...] (ranges and the class
 * escapes inside), '.', groups ( ), (?: ) and (?<name> ), alternation |, the quantifiers
 * ? * + {n} {n,} {n,m} (lazy ones too: a whole-string match does not care), '^' at the start
 * and '$' at the end of a top-level alternative. A pattern is a search: an alternative
 * without '^' may have anything before it, one without '$' anything after it. Refused:
 * backreferences, lookaround, word boundaries, Unicode property escapes, flags, anchors
 * elsewhere, and '*', '+' or '{n,}' on a part that can match nothing (the grammar would be
 * left-recursive).
 *
 * Sizes are bounded so a hostile pattern cannot blow the grammar up: at most RX_MAX_LEN
 * bytes, groups nested RX_MAX_DEPTH deep, counts up to the grammar's 1000, and the counts
 * of one pattern adding up to RX_MAX_COPIES (each counted copy is grammar text or a rule in
 * the parsed grammar; nesting multiplies nothing, since a repeated group is one rule). */
#ifdef LATHE_HAVE_JANSSON
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_schema.h"
#include "server/server_impl.h"

#define RX_MAX_LEN 2000
#define RX_MAX_DEPTH 32
#define RX_MAX_RANGES 128
#define RX_MAX_COUNT 1000 /* the grammar's bound on {m,n} (grammar_parse.c) */
#define RX_MAX_COPIES 10000
#define RX_MAX_CP 0x10FFFFu

struct rx_set {
    int n;
    uint32_t lo[RX_MAX_RANGES], hi[RX_MAX_RANGES]; /* [n] inclusive, sorted and apart after
                                                      rx_norm */
};

struct rx {
    const char *s, *p, *end; /* the pattern; p: the next character */
    const char *where, *any; /* the schema path, for messages; the any-character rule */
    struct lt_strbuf *out;
    int depth;
    long copies; /* counted copies so far */
    lt_status st;
};

/* Records the first failure; returns false. */
static bool rx_fail(struct rx *r, lt_status kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool rx_fail(struct rx *r, lt_status kind, const char *fmt, ...)
{
    if (r->st != LT_OK)
        return false;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    r->st = lt_fail(kind, "json_schema: 'pattern' (at %s): %s, at character %zu of '%.*s'",
                    r->where, msg, (size_t)(r->p - r->s) + 1, (int)(r->end - r->s), r->s);
    return false;
}

static bool rx_emit(struct rx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool rx_emit(struct rx *r, const char *fmt, ...)
{
    char buf[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(buf) || lt_strbuf_append(r->out, buf, (size_t)n) != LT_OK)
        return rx_fail(r, LT_ERR_NOMEM, "out of memory for the grammar");
    return true;
}

/* ---- character sets ---- */

static bool rx_add(struct rx *r, struct rx_set *s, uint32_t lo, uint32_t hi)
{
    if (s->n == RX_MAX_RANGES)
        return rx_fail(r, LT_ERR_UNSUPPORTED, "a class of more than %d ranges", RX_MAX_RANGES);
    s->lo[s->n] = lo;
    s->hi[s->n++] = hi;
    return true;
}

/* Sorts and merges the ranges. */
static void rx_norm(struct rx_set *s)
{
    for (int i = 1; i < s->n; i++) /* insertion sort: at most RX_MAX_RANGES */
        for (int j = i; j > 0 && s->lo[j - 1] > s->lo[j]; j--) {
            uint32_t l = s->lo[j], h = s->hi[j];
            s->lo[j] = s->lo[j - 1], s->hi[j] = s->hi[j - 1];
            s->lo[j - 1] = l, s->hi[j - 1] = h;
        }
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        if (n > 0 && s->lo[i] <= s->hi[n - 1] + 1) {
            if (s->hi[i] > s->hi[n - 1])
                s->hi[n - 1] = s->hi[i];
            continue;
        }
        s->lo[n] = s->lo[i];
        s->hi[n++] = s->hi[i];
    }
    s->n = n;
}

/* s becomes its complement in U+0000..U+10FFFF (s normalised). */
static bool rx_negate(struct rx *r, struct rx_set *s)
{
    struct rx_set t = {0};
    uint32_t from = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->lo[i] > from && !rx_add(r, &t, from, s->lo[i] - 1))
            return false;
        from = s->hi[i] + 1;
    }
    if (from <= RX_MAX_CP && !rx_add(r, &t, from, RX_MAX_CP))
        return false;
    *s = t;
    return true;
}

/* \d \w \s and their negations (ECMAScript's sets), added to s; false if c is none. */
static bool rx_class_escape(struct rx *r, char c, struct rx_set *s, bool *ok)
{
    static const uint32_t space[][2] = {
        {9, 13},          {32, 32},         {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
        {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    static const uint32_t digit[][2] = {{'0', '9'}};
    static const uint32_t word[][2] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const uint32_t(*t)[2];
    size_t n;
    switch (c | 0x20) {
    case 'd': t = digit, n = 1; break;
    case 'w': t = word, n = 4; break;
    case 's': t = space, n = sizeof(space) / sizeof(space[0]); break;
    default: return false;
    }
    struct rx_set one = {0};
    for (size_t i = 0; i < n; i++)
        rx_add(r, &one, t[i][0], t[i][1]);
    *ok = c >= 'a' || rx_negate(r, &one);
    for (int i = 0; i < one.n && *ok; i++)
        *ok = rx_add(r, s, one.lo[i], one.hi[i]);
    return true;
}

/* One code point in GBNF (a literal's or a class's), escaped unless plainly printable. */
static bool rx_emit_cp(struct rx *r, uint32_t c)
{
    if ((c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ||
        (c >= 0x20 && c < 0x7F && strchr(" !#$%&'()*+,./:;<=>?@_`{|}~", (int)c)))
        return rx_emit(r, "%c", (char)c);
    if (c < 0x80)
        return rx_emit(r, "\\x%02X", c);
    return c <= 0xFFFF ? rx_emit(r, "\\u%04X", c) : rx_emit(r, "\\U%08X", c);
}

/* The JSON spellings of s's members: a class of the plain ones, the escapes beside. */
static bool rx_emit_set(struct rx *r, struct rx_set *s)
{
    static const char *const short_esc[32] = {
        ['\b'] = "b", ['\t'] = "t", ['\n'] = "n", ['\f'] = "f", ['\r'] = "r"};
    bool has[128] = {0}; /* ASCII members */
    struct rx_set plain = {0};
    for (int i = 0; i < s->n; i++) {
        for (uint32_t c = s->lo[i]; c <= s->hi[i] && c < 128; c++)
            has[c] = true;
        /* plain: minus the controls, '"', '\' and the surrogates (not characters) */
        uint32_t cut[][2] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}};
        uint32_t lo = s->lo[i], hi = s->hi[i];
        for (size_t k = 0; k < 4 && lo <= hi; k++) {
            if (cut[k][1] < lo || cut[k][0] > hi)
                continue;
            if (cut[k][0] > lo && !rx_add(r, &plain, lo, cut[k][0] - 1))
                return false;
            lo = cut[k][1] + 1;
        }
        if (lo <= hi && !rx_add(r, &plain, lo, hi))
            return false;
    }
    int n_ctl = 0;
    for (int c = 0; c < 32; c++)
        n_ctl += has[c];
    int pieces = (plain.n > 0) + has['"'] + has['\\'] + n_ctl;
    if (pieces == 0)
        return rx_fail(r, LT_ERR_UNSUPPORTED, "a class that matches no character");
    bool ok = pieces == 1 || rx_emit(r, "( ");
    const char *sep = "";
    if (ok && plain.n == 1 && plain.lo[0] == plain.hi[0]) {
        ok = rx_emit(r, "\"") && rx_emit_cp(r, plain.lo[0]) && rx_emit(r, "\"");
        sep = " | ";
    } else if (ok && plain.n > 0) {
        ok = rx_emit(r, "[");
        for (int i = 0; i < plain.n && ok; i++)
            ok = rx_emit_cp(r, plain.lo[i]) &&
                 (plain.lo[i] == plain.hi[i] || (rx_emit(r, "-") && rx_emit_cp(r, plain.hi[i])));
        ok = ok && rx_emit(r, "]");
        sep = " | ";
    }
    if (ok && has['"'])
        ok = rx_emit(r, "%s\"\\\\\\\"\"", sep), sep = " | ";
    if (ok && has['\\'])
        ok = rx_emit(r, "%s\"\\\\\\\\\"", sep), sep = " | ";
    if (ok && n_ctl == 32)
        ok = rx_emit(r, "%s\"\\\\\" ( [btnfr] | \"u00\" [01] [0-9a-fA-F] )", sep);
    for (int c = 0; c < 32 && ok && n_ctl < 32; c++) {
        if (has[c])
            ok = short_esc[c] ? rx_emit(r, "%s\"\\\\%s\"", sep, short_esc[c])
                              : rx_emit(r, "%s\"\\\\u%04x\"", sep, (unsigned)c);
        if (has[c])
            sep = " | ";
    }
    return ok && (pieces == 1 || rx_emit(r, " )"));
}

/* ---- parsing ---- */

static bool rx_at(const struct rx *r, char c)
{
    return r->p < r->end && *r->p == c;
}

/* A code point of the pattern (UTF-8, checked by jansson; a bad byte stands for itself). */
static uint32_t rx_utf8(struct rx *r)
{
    const unsigned char *u = (const unsigned char *)r->p;
    size_t n = lt_utf8_seq_len(u, (size_t)(r->end - r->p));
    if (n <= 1) {
        r->p++;
        return u[0];
    }
    uint32_t c = n == 2 ? u[0] & 0x1F : n == 3 ? u[0] & 0x0F : u[0] & 0x07;
    for (size_t i = 1; i < n; i++)
        c = (c << 6) | (u[i] & 0x3F);
    r->p += n;
    return c;
}

/* n hex digits (n < 0: 1 to 6 of them up to a '}'), or -1. */
static long rx_hex(struct rx *r, int n)
{
    long v = 0;
    int k = 0;
    for (; r->p < r->end && (n < 0 ? k < 7 && *r->p != '}' : k < n); k++, r->p++) {
        char c = *r->p;
        int d = c >= '0' && c <= '9'                     ? c - '0'
                : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10
                                                         : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return (n < 0 ? k == 0 || k > 6 || !rx_at(r, '}') : k < n) || v > (long)RX_MAX_CP ? -1 : v;
}

/* A character escape after '\' (r->p at the letter): *c, or false. */
static bool rx_char_escape(struct rx *r, bool in_class, uint32_t *c)
{
    char e = *r->p++;
    const char *named = strchr("n\nr\rt\tf\fv\v", e);
    if (named && e >= 'a') {
        *c = (uint32_t)(unsigned char)named[1];
        return true;
    }
    long v = -1;
    if (e == 'b' && in_class)
        v = '\b';
    else if (e == '0' && !(r->p < r->end && *r->p >= '0' && *r->p <= '9'))
        v = 0;
    else if (e == 'c' && r->p < r->end && ((*r->p | 0x20) >= 'a' && (*r->p | 0x20) <= 'z'))
        v = *r->p++ % 32;
    else if (e == 'x')
        v = rx_hex(r, 2);
    else if (e == 'u' && rx_at(r, '{')) {
        r->p++;
        v = rx_hex(r, -1);
        r->p += v >= 0;
    } else if (e == 'u')
        v = rx_hex(r, 4);
    else if (e == 'b' || e == 'B')
        return rx_fail(r, LT_ERR_UNSUPPORTED, "word boundaries ('\\%c') are not supported", e);
    else if (e >= '1' && e <= '9')
        return rx_fail(r, LT_ERR_UNSUPPORTED, "backreferences ('\\%c') are not supported", e);
    else if (e == 'k')
        return rx_fail(r, LT_ERR_UNSUPPORTED, "named backreferences ('\\k') are not supported");
    else if (e == 'p' || e == 'P')
        return rx_fail(r, LT_ERR_UNSUPPORTED,
                       "Unicode property escapes ('\\%c{...}') are not supported", e);
    else if (!((e | 0x20) >= 'a' && (e | 0x20) <= 'z') && !(e >= '0' && e <= '9') && e)
        v = (unsigned char)e; /* escaped punctuation stands for itself */
    else
        return rx_fail(r, LT_ERR_UNSUPPORTED, "the escape '\\%c' is not supported", e ? e : '0');
    if (v < 0)
        return rx_fail(r, LT_ERR_INVALID, "a malformed '\\%c' escape", e);
    *c = (uint32_t)v;
    return true;
}

/* An escape (r->p after '\'): added to s. */
static bool rx_escape(struct rx *r, bool in_class, struct rx_set *s, bool *single)
{
    if (r->p >= r->end)
        return rx_fail(r, LT_ERR_INVALID, "the pattern ends with '\\'");
    bool ok = true;
    *single = false;
    if (rx_class_escape(r, *r->p, s, &ok)) {
        r->p++;
        return ok;
    }
    uint32_t c = 0;
    *single = true;
    return rx_char_escape(r, in_class, &c) && rx_add(r, s, c, c);
}

/* One member of a class (a character or a class escape) into s; *single: a character. */
static bool rx_class_atom(struct rx *r, struct rx_set *s, bool *single)
{
    if (*r->p != '\\') {
        uint32_t c = rx_utf8(r);
        *single = true;
        return rx_add(r, s, c, c);
    }
    r->p++;
    return rx_escape(r, true, s, single);
}

/* [...] (r->p after '['), into s. */
static bool rx_class(struct rx *r, struct rx_set *s)
{
    bool negate = rx_at(r, '^');
    r->p += negate;
    while (r->p < r->end && *r->p != ']') {
        bool single, single2;
        if (!rx_class_atom(r, s, &single))
            return false;
        if (!rx_at(r, '-') || r->p + 1 >= r->end || r->p[1] == ']')
            continue;
        const char *dash = r->p++;
        if (!rx_class_atom(r, s, &single2))
            return false;
        if (!single || !single2) {
            r->p = dash;
            return rx_fail(r, LT_ERR_UNSUPPORTED, "a range with a class escape as an end");
        }
        uint32_t lo = s->lo[s->n - 2], hi = s->lo[s->n - 1];
        if (lo > hi) {
            r->p = dash;
            return rx_fail(r, LT_ERR_INVALID, "the range's ends are out of order");
        }
        s->n -= 2;
        rx_add(r, s, lo, hi);
    }
    if (r->p >= r->end)
        return rx_fail(r, LT_ERR_INVALID, "'[' is not closed");
    r->p++;
    rx_norm(s);
    return !negate || rx_negate(r, s);
}

/* A quantifier's {m}, {m,} or {m,n} at r->p: true and r->p past it, else r->p unchanged
 * (ECMAScript then reads '{' as itself). *max < 0: no bound; counts saturate at 10^6. */
static bool rx_braces(struct rx *r, long *min, long *max)
{
    const char *q = r->p + 1, *d = q;
    long v[2] = {0, -1};
    for (; q < r->end && *q >= '0' && *q <= '9'; q++)
        v[0] = v[0] < 1000000 ? v[0] * 10 + (*q - '0') : v[0];
    if (q == d || q >= r->end)
        return false;
    if (*q == '}') {
        v[1] = v[0];
    } else if (*q == ',') {
        d = ++q;
        for (; q < r->end && *q >= '0' && *q <= '9'; q++)
            v[1] = v[1] < 0 ? *q - '0' : v[1] < 1000000 ? v[1] * 10 + (*q - '0') : v[1];
        if (q >= r->end || *q != '}')
            return false;
    } else {
        return false;
    }
    *min = v[0];
    *max = v[1];
    r->p = q + 1;
    return true;
}

static bool rx_alternatives(struct rx *r, bool top, bool *nullable);

/* A quantifier at r->p, if any, for an atom just emitted. */
static bool rx_quantifier(struct rx *r, bool atom_nullable, bool *nullable)
{
    const char *at = r->p;
    long min = 1, max = 1;
    if (r->p >= r->end)
        return true;
    if (*r->p == '*' || *r->p == '+' || *r->p == '?') {
        min = *r->p == '+';
        max = *r->p == '?' ? 1 : -1;
        r->p++;
    } else if (*r->p != '{' || !rx_braces(r, &min, &max)) {
        return true;
    }
    *nullable = min == 0 || atom_nullable;
    const char *after = r->p;
    r->p = at;
    if (max >= 0 && min > max)
        return rx_fail(r, LT_ERR_INVALID, "the count's bounds {%ld,%ld} are out of order", min,
                       max);
    if ((max < 0 ? min : max) > RX_MAX_COUNT)
        return rx_fail(r, LT_ERR_UNSUPPORTED, "a count over %d", RX_MAX_COUNT);
    if (max < 0 && atom_nullable)
        return rx_fail(r, LT_ERR_UNSUPPORTED,
                       "'%.*s' repeats, without bound, a part that can match nothing; give it "
                       "a bound or make the part match at least one character",
                       (int)(after - at), at);
    r->copies += max < 0 ? min + 1 : max;
    if (r->copies > RX_MAX_COPIES)
        return rx_fail(r, LT_ERR_UNSUPPORTED, "counts adding up to over %d", RX_MAX_COPIES);
    r->p = after;
    r->p += rx_at(r, '?'); /* lazy: the same strings */
    bool ok = min == 0 && max == 1  ? rx_emit(r, "?")
              : min == 0 && max < 0 ? rx_emit(r, "*")
              : min == 1 && max < 0 ? rx_emit(r, "+")
              : max < 0             ? rx_emit(r, "{%ld,}", min)
              : min == max          ? rx_emit(r, "{%ld}", min)
                                    : rx_emit(r, "{%ld,%ld}", min, max);
    long m2, n2;
    const char *q = r->p;
    if (ok && r->p < r->end &&
        (*r->p == '*' || *r->p == '+' || *r->p == '?' ||
         (*r->p == '{' && rx_braces(r, &m2, &n2)))) {
        r->p = q;
        return rx_fail(r, LT_ERR_INVALID, "'%c' has nothing to repeat", *r->p);
    }
    return ok;
}

/* ( ... ) with r->p after '('. */
static bool rx_group(struct rx *r, bool *nullable)
{
    if (rx_at(r, '?')) {
        const char *q = r->p + 1;
        bool look = q < r->end && (*q == '=' || *q == '!' ||
                                   (*q == '<' && q + 1 < r->end && (q[1] == '=' || q[1] == '!')));
        if (look)
            return rx_fail(r, LT_ERR_UNSUPPORTED, "lookahead and lookbehind are not supported");
        if (q < r->end && *q == ':')
            r->p = q + 1;
        else if (q < r->end && *q == '<' && (q = memchr(q, '>', (size_t)(r->end - q))))
            r->p = q + 1; /* a named group: the name does not matter */
        else
            return rx_fail(r, LT_ERR_UNSUPPORTED, "'(?' other than '(?:' and '(?<name>'");
    }
    if (++r->depth > RX_MAX_DEPTH)
        return rx_fail(r, LT_ERR_UNSUPPORTED, "groups nested deeper than %d", RX_MAX_DEPTH);
    if (!rx_emit(r, "( ") || !rx_alternatives(r, false, nullable))
        return false;
    if (!rx_at(r, ')'))
        return rx_fail(r, LT_ERR_INVALID, "'(' is not closed");
    r->p++;
    r->depth--;
    return rx_emit(r, " )");
}

/* One atom and its quantifier; *nullable: it can match nothing. */
static bool rx_term(struct rx *r, bool *nullable)
{
    struct rx_set set = {0};
    bool ok = true, atom_nullable = false, single;
    const char *at = r->p;
    char c = *r->p;
    long m, n;
    if (c == '*' || c == '+' || c == '?' || (c == '{' && rx_braces(r, &m, &n))) {
        r->p = at;
        return rx_fail(r, LT_ERR_INVALID, "'%c' has nothing to repeat", c);
    }
    r->p++;
    if (c == '(') {
        ok = rx_group(r, &atom_nullable);
    } else if (c == '[') {
        ok = rx_class(r, &set) && rx_emit_set(r, &set);
    } else if (c == '.') { /* all but the line terminators */
        rx_add(r, &set, '\n', '\n'), rx_add(r, &set, '\r', '\r'), rx_add(r, &set, 0x2028, 0x2029);
        ok = rx_negate(r, &set) && rx_emit_set(r, &set);
    } else if (c == '\\') {
        ok = rx_escape(r, false, &set, &single) && (rx_norm(&set), rx_emit_set(r, &set));
    } else {
        r->p--;
        uint32_t cp = rx_utf8(r);
        ok = rx_add(r, &set, cp, cp) && rx_emit_set(r, &set);
    }
    *nullable = atom_nullable;
    return ok && rx_quantifier(r, atom_nullable, nullable);
}

/* A sequence up to '|', ')' or the end ('$' too at the top level). */
static bool rx_sequence(struct rx *r, bool top, bool *nullable)
{
    *nullable = true;
    bool any = false;
    while (r->p < r->end && *r->p != '|' && *r->p != ')' && !(top && *r->p == '$')) {
        if (*r->p == '^' || *r->p == '$')
            return rx_fail(r, LT_ERR_UNSUPPORTED,
                           "'%c' only anchors the start or end of a top-level alternative", *r->p);
        bool n;
        if ((any && !rx_emit(r, " ")) || !rx_term(r, &n))
            return false;
        *nullable &= n;
        any = true;
    }
    return any || rx_emit(r, "\"\"");
}

/* Alternatives up to ')' or the end; at the top level each may be anchored. */
static bool rx_alternatives(struct rx *r, bool top, bool *nullable)
{
    *nullable = false;
    for (bool first = true;; first = false) {
        if (!first && !rx_emit(r, " | "))
            return false;
        bool start = top && rx_at(r, '^'), n;
        r->p += start;
        if (top && !start && !rx_emit(r, "%s* ", r->any))
            return false;
        if (!rx_sequence(r, top, &n))
            return false;
        bool end = top && rx_at(r, '$');
        r->p += end;
        if (end && r->p < r->end && *r->p != '|') {
            r->p--; /* at the '$' */
            return rx_fail(r, LT_ERR_UNSUPPORTED,
                           "'$' only anchors the end of a top-level alternative");
        }
        if (top && !end && !rx_emit(r, " %s*", r->any))
            return false;
        *nullable |= n;
        if (!rx_at(r, '|'))
            return true;
        r->p++;
    }
}

lt_status srv_json_pattern_gbnf(const char *pattern, size_t len, const char *any_char,
                                const char *where, struct lt_strbuf *out)
{
    struct rx r = {.s = pattern,
                   .p = pattern,
                   .end = pattern + len,
                   .where = where,
                   .any = any_char,
                   .out = out};
    if (len > RX_MAX_LEN)
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "json_schema: 'pattern' (at %s) is %zu bytes; lathe compiles %d at most",
                       where, len, RX_MAX_LEN);
    bool nullable;
    if (rx_emit(&r, "( ") && rx_alternatives(&r, true, &nullable) && r.p < r.end)
        rx_fail(&r, LT_ERR_INVALID, "')' without its '('");
    if (r.st == LT_OK)
        rx_emit(&r, " )");
    return r.st;
}
#endif
