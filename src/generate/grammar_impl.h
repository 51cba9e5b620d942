/* grammar_impl.h (internal): the compiled form of a GBNF grammar, shared by the parser
 * (grammar_parse.c) and the matcher (grammar.c).
 *
 * Every alternative of every rule is a run of elements in one array, closed by GR_END. A
 * position in the grammar is an index into that array; a matcher's stack holds positions,
 * top last, and never a GR_END one (a finished alternative is popped instead). Repetition,
 * groups and multi-character literals under an operator are rewritten into generated
 * rules at parse time, so the matcher only knows characters and rule references. */
#ifndef LATHE_GRAMMAR_IMPL_H
#define LATHE_GRAMMAR_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "lathe/grammar.h"

enum gr_el_type {
    GR_END = 0, /* closes an alternative */
    GR_CHARS,   /* one code point in ranges[a .. a + 2n) (lo, hi pairs), or not, if negated */
    GR_REF,     /* rule a */
};

struct gr_el {
    uint8_t type;
    uint8_t negated; /* GR_CHARS */
    uint32_t a;      /* GR_CHARS: first range's offset in ranges; GR_REF: the rule */
    uint32_t n;      /* GR_CHARS: range count */
};

struct gr_rule {
    char *name;    /* owned; generated rules are named "<rule>/<n>" */
    uint32_t alt0; /* its alternatives: alts[alt0 .. alt0 + n_alts) */
    uint32_t n_alts;
    bool defined;
};

struct lt_grammar {
    atomic_int refs;
    struct gr_el *els; /* [n_els] */
    uint32_t n_els;
    uint32_t *ranges; /* [n_ranges] code points, lo/hi pairs */
    uint32_t n_ranges;
    uint32_t *alts; /* [n_alts] each alternative's first element */
    uint32_t n_alts;
    struct gr_rule *rules; /* [n_rules] */
    uint32_t n_rules;
    uint32_t root;
};

#define GR_MAX_CODEPOINT 0x10FFFFu

static inline bool gr_chars_match(const struct lt_grammar *g, const struct gr_el *e, uint32_t c)
{
    const uint32_t *r = g->ranges + e->a;
    bool in = false;
    for (uint32_t i = 0; i < e->n && !in; i++)
        in = c >= r[2 * i] && c <= r[2 * i + 1];
    return in != (bool)e->negated;
}

#endif
