/* json_schema_range.c: the GBNF of the decimal integers in a range, for json_schema.c's
 * minimum and maximum on "type": "integer".
 *
 * Integers are written as JSON writes them: an optional "-", then "0" or a digit 1-9 and
 * more digits; no leading zeros and no "-0", so every integer has one spelling and a
 * range's grammar matches exactly the spellings of its members. [lo, hi] is split into its
 * negative part (a "-" before the range of their absolute values), 0, and its positive
 * part; a positive range is split by digit count, and a range of k-digit numbers [x, y] is
 * built digit by digit: when x and y share the first digit it is written and the rest
 * recurses; otherwise the alternatives are x's first digit then [x's rest, 99..9], the
 * digits strictly between then any k-1 digits, and y's first digit then [00..0, y's rest].
 * Each level recurses on one bound only, so a k-digit range costs O(k^2) text. */
#ifdef LATHE_HAVE_JANSSON
#include <stdio.h>
#include <string.h>

#include "server/json_schema.h"
#include "server/server_impl.h"

/* Digits of [x, y], two numbers of the same n digits (as text), one leading digit may be
 * 0 below the first level. */
static lt_status rg_same(struct lt_strbuf *b, const char *x, const char *y, size_t n)
{
    if (n == 0)
        return srv_strbuf_appendf(b, "\"\"");
    if (x[0] == y[0]) {
        lt_status st = srv_strbuf_appendf(b, "\"%c\" ", x[0]);
        return st != LT_OK ? st : n == 1 ? LT_OK : rg_same(b, x + 1, y + 1, n - 1);
    }
    bool x_low = strspn(x + 1, "0") == n - 1, y_high = strspn(y + 1, "9") == n - 1;
    char lo = x_low ? x[0] : (char)(x[0] + 1), hi = y_high ? y[0] : (char)(y[0] - 1);
    char nines[24] = {0}, zeros[24] = {0};
    memset(nines, '9', n - 1);
    memset(zeros, '0', n - 1);
    lt_status st = srv_strbuf_appendf(b, "( ");
    const char *sep = "";
    if (!x_low && st == LT_OK) {
        st = srv_strbuf_appendf(b, "\"%c\" ( ", x[0]);
        if (st == LT_OK)
            st = rg_same(b, x + 1, nines, n - 1);
        if (st == LT_OK)
            st = srv_strbuf_appendf(b, ") ");
        sep = "| ";
    }
    if (lo <= hi && st == LT_OK) {
        st = lo == hi ? srv_strbuf_appendf(b, "%s\"%c\" ", sep, lo)
                      : srv_strbuf_appendf(b, "%s[%c-%c] ", sep, lo, hi);
        if (st == LT_OK && n > 1)
            st = n == 2 ? srv_strbuf_appendf(b, "[0-9] ")
                        : srv_strbuf_appendf(b, "[0-9]{%zu} ", n - 1);
        sep = "| ";
    }
    if (!y_high && st == LT_OK) {
        st = srv_strbuf_appendf(b, "%s\"%c\" ( ", sep, y[0]);
        if (st == LT_OK)
            st = rg_same(b, zeros, y + 1, n - 1);
        if (st == LT_OK)
            st = srv_strbuf_appendf(b, ") ");
    }
    return st != LT_OK ? st : srv_strbuf_appendf(b, ") ");
}

static long long rg_pow10(int k)
{
    long long p = 1;
    while (k-- > 0)
        p *= 10;
    return p;
}

/* Are the k-digit members of [a, z] all k-digit numbers? */
static bool rg_full(long long a, long long z, int k)
{
    return a <= rg_pow10(k - 1) && z >= rg_pow10(k) - 1;
}

/* Alternatives for [a, z], 1 <= a <= z < 10^18; *sep is put before each. */
static lt_status rg_positive(struct lt_strbuf *b, long long a, long long z, const char **sep)
{
    char xs[24], ys[24];
    int ka = snprintf(xs, sizeof(xs), "%lld", a), kz = snprintf(ys, sizeof(ys), "%lld", z);
    lt_status st = LT_OK;
    for (int k = ka; k <= kz && st == LT_OK; k++) {
        if (rg_full(a, z, k)) { /* whole digit counts k..k2: one alternative */
            int k2 = k;
            while (k2 < kz && rg_full(a, z, k2 + 1))
                k2++;
            st = srv_strbuf_appendf(b, "%s[1-9] ", *sep);
            if (st == LT_OK && k2 > k)
                st = srv_strbuf_appendf(b, "[0-9]{%d,%d} ", k - 1, k2 - 1);
            else if (st == LT_OK && k > 1)
                st = k == 2 ? srv_strbuf_appendf(b, "[0-9] ")
                            : srv_strbuf_appendf(b, "[0-9]{%d} ", k - 1);
            k = k2;
        } else {
            snprintf(xs, sizeof(xs), "%lld", k == ka ? a : rg_pow10(k - 1));
            snprintf(ys, sizeof(ys), "%lld", k == kz ? z : rg_pow10(k) - 1);
            st = srv_strbuf_appendf(b, "%s( ", *sep);
            if (st == LT_OK)
                st = rg_same(b, xs, ys, (size_t)k);
            if (st == LT_OK)
                st = srv_strbuf_appendf(b, ") ");
        }
        *sep = "| ";
    }
    return st;
}

lt_status srv_json_int_range_gbnf(long long lo, long long hi, struct lt_strbuf *out)
{
    const char *sep = "";
    lt_status st = srv_strbuf_appendf(out, "( ");
    if (lo < 0 && st == LT_OK) { /* -m for m in [max(1, -hi), -lo] */
        const char *inner = "";
        st = srv_strbuf_appendf(out, "\"-\" ( ");
        if (st == LT_OK)
            st = rg_positive(out, hi < -1 ? -hi : 1, -lo, &inner);
        if (st == LT_OK)
            st = srv_strbuf_appendf(out, ") ");
        sep = "| ";
    }
    if (lo <= 0 && hi >= 0 && st == LT_OK) {
        st = srv_strbuf_appendf(out, "%s\"0\" ", sep);
        sep = "| ";
    }
    if (hi > 0 && st == LT_OK)
        st = rg_positive(out, lo > 1 ? lo : 1, hi, &sep);
    return st != LT_OK ? st : srv_strbuf_appendf(out, ")");
}
#endif
