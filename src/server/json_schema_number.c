/* json_schema_number.c: the GBNF of the JSON numbers in a range, for json_schema.c's
 * minimum, maximum, exclusiveMinimum and exclusiveMaximum on "type": "number".
 *
 * A bounded number is written in plain decimal form: an optional "-", an integer part of
 * at most 16 digits without leading zeros, and an optional "." with 1 to 16 digits; no
 * exponent. Every such text of a value inside the bounds is accepted, and no other: trailing
 * zeros ("1.50") and a signed zero ("-0.0") are accepted when their value is in range.
 *
 * A bound is read as an exact decimal. jansson keeps no number's text, only a double (or
 * an integer, which is exact), so a real bound is taken as the shortest decimal that reads
 * back as the same double: the schema's own digits whenever it wrote at most 15 significant
 * ones (0.1 is 0.1, not 0.1000000000000000055...).
 *
 * The texts are split by sign: those without "-" are the magnitudes in [max(lo, 0), hi],
 * those with it the magnitudes in [max(-hi, 0), -lo] (so "-0" is there when 0 is in range).
 * A magnitude range [a, b] is split by integer part: a's integer part A with a fraction at
 * least a's, the integer parts strictly between with any fraction (json_schema_range.c),
 * and b's integer part B with a fraction at most b's (one part, both checked, if A = B).
 * The fraction's digits are built one by one against the bounds' fraction digits, each
 * side "tight" while the digits so far equal the bound's. A bound past the 16 integer
 * digits written is clamped to 10^16, which leaves the same set of texts. */
#ifdef LATHE_HAVE_JANSSON
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_schema.h"
#include "server/server_impl.h"

#define NR_DIGITS 16   /* fraction digits written, as the number rule */
#define NR_FRAC_MAX 32 /* fraction digits of a bound that lathe reads */

/* A bound's exact value: sign, integer part, fraction digits. */
struct nr_dec {
    bool neg;                 /* never for zero */
    long long ip;             /* 0 .. 10^16 (clamped) */
    char fp[NR_FRAC_MAX + 1]; /* fraction digits, no trailing zeros; "" for none */
};

/* One side of a range: a bound and whether it is exclusive. */
struct nr_side {
    bool set, excl;
    struct nr_dec d;
};

static bool nr_zero(const struct nr_dec *d)
{
    return d->ip == 0 && !d->fp[0];
}

/* Compares magnitudes: <0, 0, >0. */
static int nr_cmp_abs(const struct nr_dec *x, const struct nr_dec *y)
{
    if (x->ip != y->ip)
        return x->ip < y->ip ? -1 : 1;
    return strcmp(x->fp, y->fp); /* no trailing zeros: the digit order is the value order */
}

static int nr_cmp(const struct nr_dec *x, const struct nr_dec *y)
{
    if (x->neg != y->neg)
        return x->neg ? -1 : 1;
    return x->neg ? -nr_cmp_abs(x, y) : nr_cmp_abs(x, y);
}

/* d from "D.DDDDe[+-]X" (printf's %e of a finite double). */
static lt_status nr_from_exp(const char *e, const char *key, const char *where, struct nr_dec *d)
{
    char digits[24];
    size_t n = 0;
    const char *p = e + (e[0] == '-');
    for (; *p && *p != 'e' && n + 1 < sizeof(digits); p++)
        if (*p != '.')
            digits[n++] = *p;
    while (n > 1 && digits[n - 1] == '0')
        n--;
    digits[n] = 0;
    long pos = *p == 'e' ? strtol(p + 1, NULL, 10) + 1 : 1; /* digits before the point */
    d->neg = e[0] == '-' && strcmp(digits, "0") != 0;
    d->fp[0] = 0;
    if (pos > NR_DIGITS) { /* 10^16 or more: past every integer part written */
        d->ip = SRV_JSON_INT_MAX + 1;
        return LT_OK;
    }
    if (pos <= 0 && (size_t)-pos + n > NR_FRAC_MAX)
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "json_schema: '%s' (at %s) is %s, which has more than %d decimal places; "
                       "lathe writes numbers with at most %d",
                       key, where, e, NR_FRAC_MAX, NR_DIGITS);
    d->ip = 0;
    for (long i = 0; i < pos; i++)
        d->ip = d->ip * 10 + ((size_t)i < n ? digits[i] - '0' : 0);
    if (pos <= 0) {
        memset(d->fp, '0', (size_t)-pos);
        memcpy(d->fp + -pos, digits, n + 1);
    } else if ((size_t)pos < n) {
        memcpy(d->fp, digits + pos, n - (size_t)pos + 1);
    }
    return LT_OK;
}

/* A bound's value, exactly: an integer as it is, a real as the shortest decimal that reads
 * back as the same double. */
static lt_status nr_read(const json_t *v, const char *key, const char *where, struct nr_dec *d)
{
    char e[40];
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        long long lim = SRV_JSON_INT_MAX + 1;
        d->neg = x < 0;
        d->ip = x > lim ? lim : x < -lim ? lim : x < 0 ? -(long long)x : (long long)x;
        d->fp[0] = 0;
        return LT_OK;
    }
    double x = json_real_value(v);
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof(e), "%.*e", p - 1, x);
        if (strtod(e, NULL) == x)
            break;
    }
    return nr_from_exp(e, key, where, d);
}

/* The tighter of two lower (upper false) or upper bounds into *side. */
static void nr_tighten(struct nr_side *side, const struct nr_dec *d, bool excl, bool upper)
{
    int c = side->set ? nr_cmp(d, &side->d) : upper ? -1 : 1;
    if ((upper ? c < 0 : c > 0) || (c == 0 && excl)) {
        side->set = true;
        side->excl = excl;
        side->d = *d;
    }
}

/* The range from s's bounds (srv_json_bounds). */
static lt_status nr_bounds(const json_t *s, const char *where, struct nr_side *lo,
                           struct nr_side *hi)
{
    memset(lo, 0, sizeof(*lo));
    memset(hi, 0, sizeof(*hi));
    struct srv_json_bound bd[4];
    int n;
    lt_status st = srv_json_bounds(s, where, bd, &n);
    for (int i = 0; st == LT_OK && i < n; i++) {
        struct nr_dec d;
        st = nr_read(bd[i].value, bd[i].key, where, &d);
        if (st == LT_OK)
            nr_tighten(bd[i].upper ? hi : lo, &d, bd[i].excl, bd[i].upper);
    }
    return st;
}

/* Appends alternative text t to b, after " | " unless it is the first; counts it. */
static lt_status nr_alt(struct lt_strbuf *b, int *n_alts, const char *t)
{
    lt_status st = srv_strbuf_appendf(b, "%s%s", *n_alts ? " | " : "", t);
    ++*n_alts;
    return st;
}

static lt_status nr_frac(struct lt_strbuf *b, const char *lo, bool lo_excl, const char *hi,
                         bool hi_excl, int r, bool empty_ok, int *n_alts);

/* The alternative digit c followed by the fraction digits the bounds leave, if any. */
static lt_status nr_frac_digit(struct lt_strbuf *b, char c, const char *lo, bool lo_excl,
                               const char *hi, bool hi_excl, int r, int *n_alts)
{
    struct lt_strbuf sub = {0};
    int n = 0;
    lt_status st = nr_frac(&sub, lo, lo_excl, hi, hi_excl, r, true, &n);
    if (st == LT_OK && n > 0) {
        st = srv_strbuf_appendf(b, "%s\"%c\" ( %s )", *n_alts ? " | " : "", c, sub.data);
        ++*n_alts;
    }
    lt_strbuf_free(&sub);
    return st;
}

/* Alternatives for the digit strings s of length [empty_ok ? 0 : 1, r] with 0.s within
 * the bounds; lo and hi are the rest of the bounds' fraction digits while s's digits so far
 * equal theirs ("" once passed: 0.s equals the bound if no nonzero digit follows), NULL
 * once s is past them. Nothing is written, and *n_alts stays, if no string fits. */
static lt_status nr_frac(struct lt_strbuf *b, const char *lo, bool lo_excl, const char *hi,
                         bool hi_excl, int r, bool empty_ok, int *n_alts)
{
    if (lo && !lo[0] && !lo_excl)
        lo = NULL; /* equal to an inclusive lower bound: any continuation is at least it */
    lt_status st = LT_OK;
    if (empty_ok && !lo && (!hi || hi[0] || !hi_excl))
        st = nr_alt(b, n_alts, "\"\"");
    if (r == 0 || st != LT_OK)
        return st;
    char l = lo && lo[0] ? lo[0] : '0', h = !hi ? '9' : hi[0] ? hi[0] : '0';
    const char *lo_next = lo && lo[0] ? lo + 1 : lo, *hi_next = hi && hi[0] ? hi + 1 : hi;
    if (lo)
        st = nr_frac_digit(b, l, lo_next, lo_excl, hi && l == h ? hi_next : NULL, hi_excl, r - 1,
                           n_alts);
    if (hi && !(lo && l == h) && st == LT_OK)
        st = nr_frac_digit(b, h, NULL, false, hi_next, hi_excl, r - 1, n_alts);
    char from = lo ? (char)(l + 1) : '0', to = hi ? (char)(h - 1) : '9';
    if (from <= to && st == LT_OK) {
        char t[48];
        int k = snprintf(t, sizeof(t), from == to ? "\"%c\"" : "[%c-%c]", from, to);
        if (r > 1)
            snprintf(t + k, sizeof(t) - (size_t)k, " [0-9]{0,%d}", r - 1);
        st = nr_alt(b, n_alts, t);
    }
    return st;
}

/* The texts of integer part x whose fraction is within the bounds (lo, hi: the bounds'
 * fraction digits, NULL for none on that side). */
static lt_status nr_int_part(struct lt_strbuf *b, long long x, const char *lo, bool lo_excl,
                             const char *hi, bool hi_excl, int *n_alts)
{
    if (x > SRV_JSON_INT_MAX)
        return LT_OK;
    struct lt_strbuf frac = {0};
    int n = 0;
    lt_status st = nr_frac(&frac, lo, lo_excl, hi, hi_excl, NR_DIGITS, false, &n);
    bool bare = (!lo || (!lo[0] && !lo_excl)) && (!hi || hi[0] || !hi_excl); /* no fraction */
    if (st == LT_OK && (n > 0 || bare)) {
        st = srv_strbuf_appendf(b, "%s\"%lld\"", *n_alts ? " | " : "", x);
        if (st == LT_OK && n > 0)
            st = srv_strbuf_appendf(b, bare ? " ( \".\" ( %s ) )?" : " \".\" ( %s )", frac.data);
        ++*n_alts;
    }
    lt_strbuf_free(&frac);
    return st;
}

/* Alternatives for the unsigned texts of the magnitudes in [a, b] (b NULL: no upper
 * bound), a <= b. */
static lt_status nr_half(struct lt_strbuf *out, const struct nr_dec *a, bool a_excl,
                         const struct nr_dec *b, bool b_excl, int *n_alts)
{
    if (b && a->ip == b->ip)
        return nr_int_part(out, a->ip, a->fp, a_excl, b->fp, b_excl, n_alts);
    bool a_whole = !a->fp[0] && !a_excl; /* a's integer part with any fraction */
    lt_status st = LT_OK;
    if (!a_whole)
        st = nr_int_part(out, a->ip, a->fp, a_excl, NULL, false, n_alts);
    long long m_lo = a_whole ? a->ip : a->ip + 1, m_hi = b ? b->ip - 1 : SRV_JSON_INT_MAX;
    if (m_hi > SRV_JSON_INT_MAX)
        m_hi = SRV_JSON_INT_MAX;
    if (m_lo <= m_hi && st == LT_OK) {
        st = srv_strbuf_appendf(out, "%s", *n_alts ? " | " : "");
        if (st == LT_OK)
            st = srv_json_int_range_gbnf(m_lo, m_hi, out);
        if (st == LT_OK)
            st = srv_strbuf_appendf(out, " ( \".\" [0-9]{1,%d} )?", NR_DIGITS);
        ++*n_alts;
    }
    if (b && st == LT_OK)
        st = nr_int_part(out, b->ip, NULL, false, b->fp, b_excl, n_alts);
    return st;
}

/* The half of the texts with sign neg: the magnitudes in [max(lo, 0), hi] for "+",
 * [max(-hi, 0), -lo] for "-". */
static lt_status nr_signed(struct lt_strbuf *out, const struct nr_side *lo,
                           const struct nr_side *hi, bool neg, int *n_alts)
{
    const struct nr_side *near = neg ? hi : lo, *far = neg ? lo : hi; /* to 0, from 0 */
    static const struct nr_dec zero = {0};
    const struct nr_dec *a = &zero, *b = NULL;
    bool a_excl = false, b_excl = false;
    if (near->set && (near->d.neg == neg || nr_zero(&near->d))) {
        a = &near->d;
        a_excl = near->excl;
    }
    if (far->set) {
        if (far->d.neg != neg && !nr_zero(&far->d))
            return LT_OK; /* the whole range is on the other side of 0 */
        b = &far->d;
        b_excl = far->excl;
    }
    if (b && nr_cmp_abs(a, b) > 0)
        return LT_OK;
    return nr_half(out, a, a_excl, b, b_excl, n_alts);
}

lt_status srv_json_number_range_gbnf(const json_t *s, const char *where, struct lt_strbuf *out)
{
    struct nr_side lo, hi;
    lt_status st = nr_bounds(s, where, &lo, &hi);
    if (st != LT_OK)
        return st;
    struct lt_strbuf pos = {0}, neg = {0};
    int n_pos = 0, n_neg = 0;
    st = nr_signed(&pos, &lo, &hi, false, &n_pos);
    if (st == LT_OK)
        st = nr_signed(&neg, &lo, &hi, true, &n_neg);
    if (st == LT_OK && n_pos + n_neg == 0)
        st = lt_fail(LT_ERR_INVALID,
                     "json_schema: the bounds (at %s) allow no number of at most 16 digits "
                     "before and after the point",
                     where);
    if (st == LT_OK)
        st = srv_strbuf_appendf(out, "( %s%s%s%s%s )", n_pos ? pos.data : "",
                                n_pos && n_neg ? " | " : "", n_neg ? "\"-\" ( " : "",
                                n_neg ? neg.data : "", n_neg ? " )" : "");
    lt_strbuf_free(&neg);
    lt_strbuf_free(&pos);
    return st;
}
#endif
