/* fuzz_grammar.c: libFuzzer target for the GBNF parser and matcher (lt_grammar_*) and the
 * JSON Schema compiler (srv_json_schema_gbnf).
 *
 * Input: byte 0 picks the mode; the rest is split at the first NUL into a grammar (GBNF
 * text, or with mode bit 0 a JSON schema compiled to GBNF first) and bytes fed to a matcher
 * in chunks of 1..8 bytes (the next byte's low 3 bits + 1 give each chunk's length). Any
 * grammar must parse or be refused with LT_ERR_INVALID, LT_ERR_UNSUPPORTED (a schema's
 * keyword) or LT_ERR_NOMEM and a message; a compiled schema must always parse. For each
 * chunk, allows() must agree with accept(), and a refused chunk must leave the state as
 * it was (can_end and the next characters unchanged). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/grammar.h"

#ifdef LATHE_HAVE_JANSSON
#include <jansson.h>

#include "server/json_schema.h"
#endif

static void fail(const char *why)
{
    (void)why;
    abort(); /* a fuzz target's only way to report: the input is kept as a crash */
}

static bool same_ranges(struct lt_grammar_matcher *m, const uint32_t *lo, const uint32_t *hi,
                        size_t n)
{
    uint32_t lo2[64], hi2[64];
    size_t n2 = lt_grammar_matcher_next_ranges(m, lo2, hi2, 64);
    if (n2 != n)
        return false;
    n = n < 64 ? n : 64;
    return !memcmp(lo, lo2, n * sizeof(*lo)) && !memcmp(hi, hi2, n * sizeof(*hi));
}

static void run_matcher(struct lt_grammar *g, const uint8_t *in, size_t n)
{
    struct lt_grammar_matcher *m;
    if (lt_grammar_matcher_new(g, &m) != LT_OK)
        return;
    size_t i = 0;
    while (i < n) {
        size_t len = (size_t)(in[i] & 7) + 1;
        i++;
        if (len > n - i)
            len = n - i;
        const char *b = (const char *)in + i;
        i += len;
        uint32_t lo[64], hi[64];
        size_t nr = lt_grammar_matcher_next_ranges(m, lo, hi, 64);
        bool end = lt_grammar_matcher_can_end(m);
        bool allowed = lt_grammar_matcher_allows(m, b, len);
        lt_status st = lt_grammar_matcher_accept(m, b, len);
        if (allowed != (st == LT_OK))
            fail("allows and accept disagree");
        if (st != LT_OK && (end != lt_grammar_matcher_can_end(m) || !same_ranges(m, lo, hi, nr)))
            fail("a refused chunk changed the state");
        if (lt_grammar_matcher_done(m) && !lt_grammar_matcher_can_end(m))
            fail("done but cannot end");
    }
    lt_grammar_matcher_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    const uint8_t *rest = data + 1, *nul = memchr(rest, 0, size - 1);
    size_t glen = nul ? (size_t)(nul - rest) : size - 1;
    const uint8_t *feed = nul ? nul + 1 : rest + glen;
    size_t nfeed = (size_t)(data + size - feed);
    char *text = NULL;
    size_t tlen = glen;
    bool from_schema = false;
#ifdef LATHE_HAVE_JANSSON
    if (mode & 1) {
        json_t *s = json_loadb((const char *)rest, glen, JSON_DECODE_ANY, NULL);
        if (!s)
            return 0;
        struct lt_strbuf gb = {0};
        lt_status st = srv_json_schema_gbnf(s, &gb);
        json_decref(s);
        if (st != LT_OK) {
            if (st != LT_ERR_INVALID && st != LT_ERR_UNSUPPORTED && st != LT_ERR_NOMEM)
                fail("unexpected status from the schema compiler");
            lt_strbuf_free(&gb);
            return 0;
        }
        text = gb.data;
        tlen = gb.len;
        from_schema = true;
    }
#endif
    if (!text) {
        text = malloc(glen + 1);
        if (!text)
            return 0;
        memcpy(text, rest, glen);
        text[glen] = 0;
    }
    struct lt_grammar *g = NULL;
    lt_status st = lt_grammar_parse(text, tlen, &g);
    if (st == LT_OK && !g)
        fail("LT_OK without a grammar");
    if (st != LT_OK && (g || (st != LT_ERR_INVALID && st != LT_ERR_NOMEM) || !lt_last_error()[0]))
        fail("a refusal without its status or message");
    /* a compiled schema may still be refused for left recursion ({"$ref": "#"}) or size */
    if (from_schema && st != LT_OK && !strstr(lt_last_error(), "left-recursive") &&
        !strstr(lt_last_error(), "rules"))
        fail("a compiled schema does not parse");
    if (g)
        run_matcher(g, feed, nfeed);
    lt_grammar_free(g);
    free(text);
    return 0;
}
