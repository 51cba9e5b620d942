/* grammar.h: constrained output: a GBNF grammar, and a matcher that says which bytes (so
 * which tokens) may come next.
 *
 * The grammar language is llama.cpp's GBNF: rules `name ::= alternatives`, alternatives
 * separated by `|`, sequences of string literals ("..."), character classes ([a-z], [^"\\],
 * with \n \t \r \\ \" \] \xHH \uHHHH \UHHHHHHHH escapes), `.` (any character), rule
 * references and parenthesised groups, each optionally followed by `*`, `+`, `?`, `{m}`,
 * `{m,}` or `{m,n}`; `#` starts a comment to the end of the line. A rule may span lines: it
 * ends where the next `name ::=` begins. The grammar matches its `root` rule against the
 * whole output. Text is matched by Unicode code points; bytes come in as UTF-8, and a
 * token may end inside a character (the matcher keeps the partial sequence).
 *
 * The matcher holds a set of stacks of grammar positions (a pushdown automaton run on every
 * parse at once); accepting a character replaces each stack by its successors. Rules that
 * can start with themselves (left recursion, also through rules that match the empty
 * string) are refused when the grammar is parsed, since the expansion would not end.
 *
 * A grammar is immutable after parsing and reference counted, so the n choices of a request
 * share one; each choice has its own matcher. */
#ifndef LATHE_GRAMMAR_H
#define LATHE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/status.h"
#include "lathe/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct lt_grammar;
struct lt_grammar_matcher;

/* Parses GBNF text[0..len) (one reference). A syntax error, an undefined or twice-defined
 * rule, a missing root, or left recursion is LT_ERR_INVALID, whose message names the rule
 * and the line and column. */
lt_status lt_grammar_parse(const char *text, size_t len, struct lt_grammar **out);
/* Takes one more reference; returns g. */
struct lt_grammar *lt_grammar_ref(struct lt_grammar *g);
/* Drops a reference; the last frees it. NULL is fine. */
void lt_grammar_free(struct lt_grammar *g);
size_t lt_grammar_n_rules(const struct lt_grammar *g); /* generated rules included */

/* A matcher at the start of g (it takes a reference to g). */
lt_status lt_grammar_matcher_new(struct lt_grammar *g, struct lt_grammar_matcher **out);
void lt_grammar_matcher_free(struct lt_grammar_matcher *m);  /* NULL is fine */
void lt_grammar_matcher_reset(struct lt_grammar_matcher *m); /* back to the start */

/* Could bytes[0..n) come next (as all or the start of what follows)? m is unchanged. A
 * token ending inside a UTF-8 sequence is allowed when some character the grammar allows
 * next could still begin that way. */
bool lt_grammar_matcher_allows(struct lt_grammar_matcher *m, const char *bytes, size_t n);
/* Advances past bytes[0..n); LT_ERR_INVALID (m unchanged) when they do not fit. */
lt_status lt_grammar_matcher_accept(struct lt_grammar_matcher *m, const char *bytes, size_t n);
/* The input so far is a whole sentence of the grammar (the output may end here). */
bool lt_grammar_matcher_can_end(const struct lt_grammar_matcher *m);
/* It may end here and nothing can follow: the output is complete. */
bool lt_grammar_matcher_done(const struct lt_grammar_matcher *m);

/* The characters allowed next, as inclusive code point ranges into lo[], hi[] (room for
 * cap); returns how many there are (may exceed cap; ranges may overlap). None while a
 * UTF-8 sequence is incomplete. For tests and diagnostics (random walks); m's state is
 * unchanged (only its scratch is used). */
size_t lt_grammar_matcher_next_ranges(struct lt_grammar_matcher *m, uint32_t *lo, uint32_t *hi,
                                      size_t cap);

/* ---- tokens ---- */

/* May token `id` of t come next? End-of-generation tokens only when the matcher can end;
 * other control, unknown and unused tokens never (their text is not output); the rest when
 * their bytes are allowed. */
bool lt_grammar_token_allowed(struct lt_grammar_matcher *m, const struct lt_tokenizer *t,
                              lt_token id);
/* allowed[i] = lt_grammar_token_allowed for every i < n_vocab (n_vocab at most the
 * tokenizer's); returns how many are allowed. Tokens whose first byte cannot begin what
 * comes next are skipped without matching. */
size_t lt_grammar_token_mask(struct lt_grammar_matcher *m, const struct lt_tokenizer *t,
                             size_t n_vocab, bool *allowed);

#ifdef __cplusplus
}
#endif
#endif
