/* pretok.c: pre-tokenizers, the regex splits that cut a valid UTF-8 run into the pieces BPE
 * encodes one at a time. PCRE2 with UTF + UCP (\p{L}, \s, (?i) are Unicode-aware) and JIT.
 *
 * The split follows Hugging Face's Split(behavior = Isolated): each match is a piece and so
 * is each stretch between matches, so the pieces always tile the run. The regexes are those
 * of the models' tokenizer.json files, kept in their original form ((?i:...) included; PCRE2
 * has no need of llama.cpp's [sS] rewrite).
 *
 * "smollm" is HF's Sequence[Digits(individual_digits), ByteLevel(use_regex)]: every numeric
 * character is a piece of its own, and the GPT-2 regex runs on each stretch between them
 * separately, so a lookahead never sees past a digit. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

#ifdef LATHE_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* \s spelled out as Unicode's White_Space, which is what \s means to Oniguruma (Hugging Face
 * tokenizers' regex engine); PCRE2's UCP \s also takes U+180E MONGOLIAN VOWEL SEPARATOR,
 * a format character since Unicode 6.3, and would split text differently around it. */
#define WS                                                                                         \
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"    \
    "\\x{205F}\\x{3000}"

/* The tokenizer.json regexes with \s -> [WS], \S -> [^WS]. */
static const char *const pretok_regex[LT_PRETOK_COUNT] = {
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*
     * |\s*[\r\n]+|\s+(?!\S)|\s+ */
    [LT_PRETOK_QWEN2] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
        "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+",
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}
     * | ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    [LT_PRETOK_QWEN35] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+"
                         "|\\p{N}| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS
                         "]+(?![^" WS "])|[" WS "]+",
    /* GPT-2's: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    [LT_PRETOK_SMOLLM] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+"
                         "|[" WS "]+(?![^" WS "])|[" WS "]+",
};

static lt_status compile_one(const char *pattern, pcre2_code **out)
{
    int err;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return lt_fail(LT_ERR_UNSUPPORTED, "tokenizer: regex error at %zu: %s", (size_t)erroff,
                       (const char *)msg);
    }
    /* JIT is an optimisation: where it is unavailable the interpreter gives the same
     * matches */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return LT_OK;
}

lt_status tok_pretok_compile(struct lt_tokenizer *t)
{
    pcre2_code *main = NULL, *digit = NULL;
    lt_status st = compile_one(pretok_regex[t->pre], &main);
    if (st)
        return st;
    if (t->pre == LT_PRETOK_SMOLLM && (st = compile_one("\\p{N}", &digit))) {
        pcre2_code_free(main);
        return st;
    }
    t->re_main = main;
    t->re_digit = digit;
    return LT_OK;
}

void tok_pretok_free(struct lt_tokenizer *t)
{
    pcre2_code_free(t->re_main);
    pcre2_code_free(t->re_digit);
    t->re_main = t->re_digit = NULL;
}

struct tok_pretok_state {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
};

void tok_pretok_state_free(struct tok_pretok_state *st)
{
    if (!st)
        return;
    pcre2_match_data_free(st->md);
    pcre2_match_context_free(st->mctx);
    pcre2_jit_stack_free(st->jit_stack);
    free(st);
}

/* The first match of `re` in s[0..n) at or after `from`: 1 with [*ms, *me), 0 for none. */
static int find(struct tok_pretok_state *st, const pcre2_code *re, const char *s, size_t n,
                size_t from, size_t *ms, size_t *me, lt_status *err)
{
    for (;;) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, st->md, st->mctx);
        if (rc >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
            *ms = ov[0];
            *me = ov[1];
            return 1;
        }
        if (rc == PCRE2_ERROR_NOMATCH)
            return 0;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !st->jit_stack) {
            /* a very long piece (megabytes of one character class): give JIT a bigger
             * stack and try again */
            st->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
            if (!st->jit_stack) {
                *err = lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory for the regex stack");
                return -1;
            }
            pcre2_jit_stack_assign(st->mctx, NULL, st->jit_stack);
            continue;
        }
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        *err = lt_fail(LT_ERR_INVALID, "tokenizer: regex match failed at byte %zu: %s", from,
                       (const char *)msg);
        return -1;
    }
}

/* Splits s[0..n) by `re`, the Isolated way; offsets passed on are relative to s + base. */
static lt_status split_regex(struct tok_pretok_state *st, const pcre2_code *re, const char *s,
                             size_t n, size_t base, tok_piece_fn piece, void *user)
{
    size_t off = 0;
    lt_status err = LT_OK;
    while (off < n) {
        size_t ms, me;
        int r = find(st, re, s, n, off, &ms, &me, &err);
        if (r < 0)
            return err;
        if (r == 0) {
            return piece(user, base + off, n - off);
        }
        if (me == ms) { /* none of our regexes matches empty; be safe anyway */
            me = ms + 1;
            while (me < n && ((unsigned char)s[me] & 0xC0) == 0x80)
                me++;
        }
        lt_status pst;
        if (ms > off && (pst = piece(user, base + off, ms - off)))
            return pst;
        if ((pst = piece(user, base + ms, me - ms)))
            return pst;
        off = me;
    }
    return LT_OK;
}

lt_status tok_pretok_split(const struct lt_tokenizer *t, struct tok_pretok_state **stp,
                           const char *s, size_t n, tok_piece_fn piece, void *user)
{
    struct tok_pretok_state *st = *stp;
    if (!st) {
        st = calloc(1, sizeof(*st));
        if (!st)
            return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory");
        st->md = pcre2_match_data_create(4, NULL);
        st->mctx = pcre2_match_context_create(NULL);
        if (!st->md || !st->mctx) {
            tok_pretok_state_free(st);
            return lt_fail(LT_ERR_NOMEM, "tokenizer: out of memory");
        }
        *stp = st;
    }
    if (!t->re_digit)
        return split_regex(st, t->re_main, s, n, 0, piece, user);
    size_t off = 0;
    lt_status err = LT_OK, pst;
    while (off < n) {
        size_t ms, me;
        int r = find(st, t->re_digit, s, n, off, &ms, &me, &err);
        if (r < 0)
            return err;
        size_t stop = r ? ms : n;
        if (stop > off &&
            (pst = split_regex(st, t->re_main, s + off, stop - off, off, piece, user)))
            return pst;
        if (!r)
            break;
        if ((pst = piece(user, ms, me - ms)))
            return pst;
        off = me;
    }
    return LT_OK;
}

#else /* no PCRE2 */

lt_status tok_pretok_compile(struct lt_tokenizer *t)
{
    return lt_fail(LT_ERR_UNSUPPORTED,
                   "tokenizer: pre-tokenizer '%s' needs PCRE2, and this build has none "
                   "(install libpcre2-dev and reconfigure)",
                   lt_pretokenizer_name(t->pre));
}

void tok_pretok_free(struct lt_tokenizer *t)
{
    (void)t;
}
void tok_pretok_state_free(struct tok_pretok_state *st)
{
    (void)st;
}

lt_status tok_pretok_split(const struct lt_tokenizer *t, struct tok_pretok_state **st,
                           const char *s, size_t n, tok_piece_fn piece, void *user)
{
    return lt_fail(LT_ERR_UNSUPPORTED, "tokenizer: no PCRE2 in this build");
}

#endif
