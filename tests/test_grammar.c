/* test_grammar.c: the GBNF grammar engine (include/lathe/grammar.h) and the JSON Schema
 * compiler (src/server/json_schema.h): parse errors named, strings accepted and refused,
 * UTF-8 split across tokens, every random walk of a schema's matcher parsing as JSON and
 * validating against the schema (by a small validator here, written from the JSON Schema
 * spec, not from the compiler), and, with the SmolLM2 GGUF, generation under a grammar
 * from random logits: the text always parses and the grammar ends it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "lathe/generate.h"
#include "lathe/gguf.h"
#include "lathe/grammar.h"
#include "lathe/sampling.h"
#include "lathe/tokenizer.h"
#include "smollm2.h"

#ifdef LATHE_HAVE_JANSSON
#include <jansson.h>

#include "server/json_schema.h"
#endif
#ifdef LATHE_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

static struct lt_grammar *parse(const char *text)
{
    struct lt_grammar *g = NULL;
    lt_status st = lt_grammar_parse(text, strlen(text), &g);
    CHECK(st == LT_OK, "parse '%s': %s", text, lt_last_error());
    return g;
}

/* 1: the whole of s is a sentence; 0: a prefix only; -1: refused. */
static int run(struct lt_grammar *g, const char *s)
{
    struct lt_grammar_matcher *m;
    if (lt_grammar_matcher_new(g, &m) != LT_OK)
        return -2;
    int r = lt_grammar_matcher_accept(m, s, strlen(s)) != LT_OK ? -1
            : lt_grammar_matcher_can_end(m)                     ? 1
                                                                : 0;
    lt_grammar_matcher_free(m);
    return r;
}

static void expect_error(const char *text, const char *words)
{
    struct lt_grammar *g = NULL;
    lt_status st = lt_grammar_parse(text, strlen(text), &g);
    CHECK(st == LT_ERR_INVALID && g == NULL, "'%s' should not parse", text);
    CHECK(strstr(lt_last_error(), words) != NULL, "'%s': message '%s' lacks '%s'", text,
          lt_last_error(), words);
}

static void test_parse_errors(void)
{
    expect_error("rot ::= \"a\"", "no 'root' rule");
    expect_error("root ::= foo", "rule 'foo' is used but not defined");
    expect_error("root ::= \"abc", "string literal is not closed");
    expect_error("root ::= \"a\\qb\"", "unknown escape '\\q'");
    expect_error("root ::= [a-", "character class is not closed");
    expect_error("root ::= [z-a]", "backwards");
    expect_error("root ::= root \"a\" | \"b\"", "left-recursive");
    expect_error("root ::= x \"a\"\nx ::= \"\" | root", "left-recursive");
    expect_error("root ::= (\"a\"?)*", "left-recursive");
    expect_error("root ::= \"a\"\nroot ::= \"b\"", "defined twice");
    expect_error("root ::= \"a\"{3,1}", "maximum below its minimum");
    expect_error("root ::= \"a\"{5000}", "over 1000");
    expect_error("root ::= (\"a\" | \"b\"", "'(' is not closed");
    expect_error("root ::= \"a\" )", "line 1, column 14: unexpected ')'");
    expect_error("root ::= \"a\"\n\nx = \"b\"", "line 3");
    expect_error("root ::= \"\\u12\"", "4 hex digits");
}

static void test_accept(void)
{
    struct lt_grammar *g = parse("root ::= (\"yes\" | \"no\")");
    CHECK(run(g, "yes") == 1 && run(g, "no") == 1);
    CHECK(run(g, "ye") == 0 && run(g, "") == 0);
    CHECK(run(g, "yess") == -1 && run(g, "maybe") == -1 && run(g, "No") == -1);
    lt_grammar_free(g);

    g = parse("# a comment\nroot ::= [a-c]+ tail # trailing\n"
              "tail ::=\n  \"!\"\n  | \"?\"{2,3}\n  | \"\"\n");
    CHECK(run(g, "abcab") == 1 && run(g, "a!") == 1 && run(g, "b??") == 1);
    CHECK(run(g, "c???") == 1 && run(g, "c????") == -1 && run(g, "c?") == 0);
    CHECK(run(g, "d") == -1 && run(g, "!") == -1);
    lt_grammar_free(g);

    g = parse("root ::= [^x\\n]* \"x\" . \"ab\"? ([0-9] \"-\"){2}");
    CHECK(run(g, "hello x!0-1-") == 1 && run(g, "xyab0-1-") == 1 && run(g, "xy0-1-") == 1);
    CHECK(run(g, "he\nx!0-1-") == -1 && run(g, "xy0-") == 0 && run(g, "xy0-1-2") == -1);
    lt_grammar_free(g);

    /* ambiguous: many parses of one text at once, deduplicated */
    g = parse("root ::= (\"a\"+)+ \"b\" | .+ \"c\"");
    CHECK(run(g, "aaaaaaaaaaaaaaaaaaaaab") == 1 && run(g, "aaaaac") == 1 && run(g, "ab€c") == 1);
    CHECK(run(g, "aaaaaaaa") == 0 && run(g, "b") == 0 && run(g, "bc") == 1);
    lt_grammar_free(g);

    /* UTF-8: literals, classes of code points, escapes */
    g = parse("root ::= \"é\" [α-ω]+ \"\\x41\\u00e9\\U0001F600\"");
    CHECK(run(g, "éαβωAé\xF0\x9F\x98\x80") == 1);
    CHECK(run(g, "eα") == -1 && run(g, "éaAé") == -1);
    lt_grammar_free(g);
}

/* A token may end inside a character; the matcher keeps the partial sequence. */
static void test_partial_utf8(void)
{
    struct lt_grammar *g = parse("root ::= \"é\" | \"a\"");
    struct lt_grammar_matcher *m;
    CHECK(lt_grammar_matcher_new(g, &m) == LT_OK);
    CHECK(lt_grammar_matcher_allows(m, "\xC3", 1), "the first byte of é");
    CHECK(!lt_grammar_matcher_allows(m, "\xC4", 1), "no allowed character starts with C4");
    CHECK(!lt_grammar_matcher_allows(m, "\xFF", 1), "not UTF-8");
    CHECK(lt_grammar_matcher_accept(m, "\xC3", 1) == LT_OK);
    CHECK(!lt_grammar_matcher_can_end(m), "é is not complete");
    CHECK(!lt_grammar_matcher_allows(m, "\xA8", 1), "è is not allowed");
    CHECK(lt_grammar_matcher_accept(m, "\xA9", 1) == LT_OK);
    CHECK(lt_grammar_matcher_can_end(m) && lt_grammar_matcher_done(m));
    lt_grammar_matcher_free(m);
    lt_grammar_free(g);

    g = parse("root ::= \"a\"+");
    CHECK(lt_grammar_matcher_new(g, &m) == LT_OK);
    CHECK(lt_grammar_matcher_accept(m, "aa", 2) == LT_OK);
    CHECK(lt_grammar_matcher_can_end(m) && !lt_grammar_matcher_done(m), "more a's may follow");
    CHECK(lt_grammar_matcher_accept(m, "b", 1) != LT_OK && lt_grammar_matcher_can_end(m),
          "a refused byte leaves the state alone");
    lt_grammar_matcher_reset(m);
    CHECK(!lt_grammar_matcher_can_end(m));
    lt_grammar_matcher_free(m);
    lt_grammar_free(g);
}

/* ---- random walks ---- */

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static size_t utf8_put(uint32_t c, char *out)
{
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* A code point of [lo, hi]: mostly printable ASCII when the range has some, never a
 * surrogate. */
static uint32_t pick_in(uint32_t lo, uint32_t hi)
{
    if (lo <= 0x7E && hi >= 0x20 && rnd() % 8 != 0) {
        uint32_t a = lo > 0x20 ? lo : 0x20, b = hi < 0x7E ? hi : 0x7E;
        return a + (uint32_t)(rnd() % (b - a + 1));
    }
    uint32_t span = hi - lo + 1 > 3000 ? 3000 : hi - lo + 1;
    uint32_t c = lo + (uint32_t)(rnd() % span);
    return c >= 0xD800 && c <= 0xDFFF ? 0xE9 : c;
}

/* Walks m from its start, choosing uniformly among the allowed ranges, until the grammar
 * is done, or can end and a coin says stop; the text into out. false: no end in time. */
static bool walk(struct lt_grammar_matcher *m, char *out, size_t cap)
{
    size_t len = 0;
    lt_grammar_matcher_reset(m);
    uint32_t lo[512], hi[512];
    while (len + 8 < cap) {
        if (lt_grammar_matcher_done(m) || (lt_grammar_matcher_can_end(m) && rnd() % 4 == 0))
            break;
        size_t n = lt_grammar_matcher_next_ranges(m, lo, hi, 512);
        if (n > 512)
            n = 512;
        CHECK(n > 0 || lt_grammar_matcher_can_end(m), "a dead end after '%.*s'", (int)len, out);
        if (n == 0)
            break;
        size_t k = (size_t)(rnd() % n);
        char buf[4];
        size_t nb = utf8_put(pick_in(lo[k], hi[k]), buf);
        if (lt_grammar_matcher_accept(m, buf, nb) != LT_OK) {
            CHECK(0, "an allowed character was refused after '%.*s': %s", (int)len, out,
                  lt_last_error());
            return false;
        }
        memcpy(out + len, buf, nb);
        len += nb;
    }
    out[len] = 0;
    return lt_grammar_matcher_can_end(m);
}

static void test_walk_gbnf(void)
{
    struct lt_grammar *g = parse("root ::= (\"yes\" | \"no\") \" \" [0-9]{1,3}");
    struct lt_grammar_matcher *m;
    CHECK(lt_grammar_matcher_new(g, &m) == LT_OK);
    char text[64];
    for (int i = 0; i < 200; i++) {
        CHECK(walk(m, text, sizeof(text)));
        CHECK(run(g, text) == 1, "'%s'", text);
        size_t n = strlen(text);
        CHECK((!strncmp(text, "yes ", 4) || !strncmp(text, "no ", 3)) && n >= 4 && n <= 7, "'%s'",
              text);
    }
    lt_grammar_matcher_free(m);
    lt_grammar_free(g);
}

#ifdef LATHE_HAVE_JANSSON
/* ---- a JSON Schema validator for the subset, from the spec ---- */

static size_t utf8_count(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static bool type_ok(const json_t *v, const char *t)
{
    if (!strcmp(t, "object"))
        return json_is_object(v);
    if (!strcmp(t, "array"))
        return json_is_array(v);
    if (!strcmp(t, "string"))
        return json_is_string(v);
    if (!strcmp(t, "number"))
        return json_is_number(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v);
    if (!strcmp(t, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(t, "null"))
        return json_is_null(v);
    return false;
}

static bool valid(const json_t *v, const json_t *s, const json_t *root);

/* minimum and its kin, with draft 4's boolean exclusive forms. */
static bool valid_bounds(const json_t *v, const json_t *s)
{
    double x = json_number_value(v);
    const json_t *m, *e;
    if ((m = json_object_get(s, "minimum")) &&
        (x < json_number_value(m) ||
         (json_is_true(json_object_get(s, "exclusiveMinimum")) && x == json_number_value(m))))
        return false;
    if ((m = json_object_get(s, "maximum")) &&
        (x > json_number_value(m) ||
         (json_is_true(json_object_get(s, "exclusiveMaximum")) && x == json_number_value(m))))
        return false;
    if ((e = json_object_get(s, "exclusiveMinimum")) && json_is_number(e) &&
        x <= json_number_value(e))
        return false;
    if ((e = json_object_get(s, "exclusiveMaximum")) && json_is_number(e) &&
        x >= json_number_value(e))
        return false;
    return true;
}

/* A pattern by PCRE2 (ECMAScript's '$' is PCRE's DOLLAR_ENDONLY); true without PCRE2. */
static bool valid_pattern(const char *pat, const json_t *v)
{
#ifdef LATHE_HAVE_PCRE2
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &off, NULL);
    CHECK(re != NULL, "PCRE2 cannot compile '%s'", pat);
    if (!re)
        return false;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = md ? pcre2_match(re, (PCRE2_SPTR)json_string_value(v), json_string_length(v), 0, 0,
                              md, NULL)
                : -1;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
#else
    (void)pat;
    (void)v;
    return true;
#endif
}

static bool valid_array(const json_t *v, const json_t *s, const json_t *root)
{
    const json_t *x, *pre = json_object_get(s, "prefixItems");
    size_t i, n = json_array_size(v), np = json_array_size(pre);
    json_t *e;
    json_array_foreach(v, i, e) {
        x = i < np ? json_array_get(pre, i) : json_object_get(s, "items");
        if (x && !valid(e, x, root))
            return false;
    }
    if ((x = json_object_get(s, "minItems")) && n < (size_t)json_integer_value(x))
        return false;
    if ((x = json_object_get(s, "maxItems")) && n > (size_t)json_integer_value(x))
        return false;
    return true;
}

static bool valid_object(const json_t *v, const json_t *s, const json_t *root)
{
    const json_t *props = json_object_get(s, "properties"), *ap;
    ap = json_object_get(s, "additionalProperties");
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(s, "required"), i, r) {
        if (!json_object_get(v, json_string_value(r)))
            return false;
    }
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)v, key, x) {
        const json_t *ps = props ? json_object_get(props, key) : NULL;
        if (ps && !valid(x, ps, root))
            return false;
        if (!ps && ap && !valid(x, ap, root))
            return false;
    }
    return true;
}

static bool valid(const json_t *v, const json_t *s, const json_t *root)
{
    if (json_is_true(s))
        return true;
    if (json_is_false(s))
        return false;
    const json_t *x;
    if ((x = json_object_get(s, "$ref"))) {
        const char *r = json_string_value(x);
        const json_t *t =
            !strcmp(r, "#") ? root : json_object_get(json_object_get(root, "$defs"), r + 8);
        return valid(v, t, root);
    }
    if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
        size_t i, n = 0;
        json_t *b;
        json_array_foreach(x, i, b) {
            n += valid(v, b, root);
        }
        if (n == 0 || (json_object_get(s, "oneOf") && n != 1))
            return false;
    }
    if ((x = json_object_get(s, "enum"))) {
        size_t i, n = 0;
        json_t *e;
        json_array_foreach(x, i, e) {
            n += json_equal((json_t *)v, e);
        }
        if (!n)
            return false;
    }
    if ((x = json_object_get(s, "const")) && !json_equal((json_t *)v, (json_t *)x))
        return false;
    if ((x = json_object_get(s, "type"))) {
        bool ok = false;
        if (json_is_string(x))
            ok = type_ok(v, json_string_value(x));
        size_t i;
        json_t *t;
        json_array_foreach(x, i, t) {
            ok |= type_ok(v, json_string_value(t));
        }
        if (!ok)
            return false;
    }
    if (json_is_object(v) && !valid_object(v, s, root))
        return false;
    if (json_is_array(v) && !valid_array(v, s, root))
        return false;
    if (json_is_number(v) && !valid_bounds(v, s))
        return false;
    if (json_is_string(v) && (x = json_object_get(s, "pattern")) &&
        !valid_pattern(json_string_value(x), v))
        return false;
    if (json_is_string(v)) {
        size_t n = utf8_count(json_string_value(v));
        if ((x = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(x))
            return false;
        if ((x = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(x))
            return false;
    }
    return true;
}

static const char *const schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,"
    "\"maxLength\":12},\"age\":{\"type\":\"integer\"},\"email\":{\"type\":\"string\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3},"
    "\"kind\":{\"enum\":[\"a\",\"b\\\"q\",3,null]},\"ok\":{\"type\":\"boolean\"},"
    "\"score\":{\"type\":[\"number\",\"null\"]}},\"required\":[\"name\",\"age\"],"
    "\"additionalProperties\":false}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}",
    "{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"array\",\"items\":"
    "{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":4},{\"const\":{\"x\":[1,\"é\"]}}]}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
    "{\"title\":\"anything\"}",
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
    "\"number\"},\"b\":{\"type\":\"string\",\"minLength\":2}},\"required\":[\"b\"]},"
    "\"minItems\":1}",
    /* integer ranges, patterns (with JSON's escaped characters), tuples */
    "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":-40,"
    "\"maximum\":1234},\"m\":{\"type\":\"integer\",\"exclusiveMinimum\":0.5},\"k\":{\"type\":"
    "[\"integer\",\"null\"],\"exclusiveMaximum\":-7},\"code\":{\"type\":\"string\","
    "\"pattern\":\"^[A-Z]{2}\\\\d{3}$\"},\"t\":{\"type\":\"array\",\"prefixItems\":[{\"type\":"
    "\"string\",\"maxLength\":2},{\"type\":\"integer\",\"minimum\":3,\"maximum\":5}],"
    "\"items\":false,\"minItems\":1}},\"required\":[\"n\",\"code\",\"t\"]}",
    "{\"type\":\"string\",\"pattern\":\"^(\\\"|\\\\\\\\|[a-c]|\\\\n|[^\\\\x00-\\\\x7f]){1,6}$\"}",
    "{\"type\":\"string\",\"pattern\":\"(?:ab|c)+x?|^z[^a-y]$\"}",
    "{\"type\":\"array\",\"prefixItems\":[{\"const\":\"id\"},{\"type\":\"boolean\"}],"
    "\"items\":{\"type\":\"integer\",\"maximum\":9},\"minItems\":3,\"maxItems\":5}",
    /* number ranges (inclusive: the validator compares doubles, which may round a 16th
     * decimal onto an exclusive bound) */
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\",\"minimum\":-1.5,"
    "\"maximum\":2.25},\"y\":{\"minimum\":0.1},\"z\":{\"type\":[\"number\",\"null\"],"
    "\"maximum\":-7.75}},\"required\":[\"x\",\"y\",\"z\"]}",
};

static struct lt_grammar *schema_grammar(const json_t *schema)
{
    struct lt_strbuf gb = {0};
    lt_status st = srv_json_schema_gbnf(schema, &gb);
    CHECK(st == LT_OK, "compile: %s", lt_last_error());
    struct lt_grammar *g = st == LT_OK ? parse(gb.data) : NULL;
    if (!g)
        fprintf(stderr, "grammar:\n%s\n", gb.data ? gb.data : "");
    lt_strbuf_free(&gb);
    return g;
}

static void walk_schema(const json_t *schema, struct lt_grammar *g, int n_walks)
{
    struct lt_grammar_matcher *m;
    CHECK(lt_grammar_matcher_new(g, &m) == LT_OK);
    char *text = malloc(1 << 16);
    int done = 0;
    for (int i = 0; i < n_walks && text; i++) {
        if (!walk(m, text, 1 << 16))
            continue;
        done++;
        json_error_t err;
        json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        CHECK(v != NULL, "walk output is not JSON (%s): %s", err.text, text);
        if (v)
            CHECK(valid(v, schema, schema), "walk output does not validate: %s", text);
        json_decref(v);
    }
    CHECK(done >= n_walks / 2, "only %d of %d walks ended", done, n_walks);
    free(text);
    lt_grammar_matcher_free(m);
}

static void test_schemas(void)
{
    for (size_t i = 0; i < sizeof(schemas) / sizeof(schemas[0]); i++) {
        json_error_t err;
        json_t *s = json_loads(schemas[i], 0, &err);
        CHECK(s != NULL, "schema %zu: %s", i, err.text);
        struct lt_grammar *g = s ? schema_grammar(s) : NULL;
        if (g)
            walk_schema(s, g, 300);
        lt_grammar_free(g);
        json_decref(s);
    }
    /* json_object: any object */
    struct lt_strbuf gb = {0};
    CHECK(srv_json_object_gbnf(&gb) == LT_OK);
    struct lt_grammar *g = parse(gb.data);
    json_t *obj = json_pack("{s:s}", "type", "object");
    if (g) {
        CHECK(run(g, "{\"a\": [1, 2.5e3, {\"b\": null}], \"c\": \"\\u00e9\\n\"}") == 1);
        CHECK(run(g, "[1]") == -1 && run(g, "{\"a\" 1}") == -1 && run(g, "{\"a\": 01}") == -1);
        walk_schema(obj, g, 300);
    }
    json_decref(obj);
    lt_grammar_free(g);
    lt_strbuf_free(&gb);
}

/* Specific strings against the first schema. */
static void test_schema_accept(void)
{
    json_t *s = json_loads(schemas[0], 0, NULL);
    struct lt_grammar *g = s ? schema_grammar(s) : NULL;
    if (g) {
        CHECK(run(g, "{\"name\": \"Ann\", \"age\": 31}") == 1);
        CHECK(run(g, "{\"name\":\"Ann\",\"age\":-3,\"kind\":\"b\\\"q\",\"score\":null}") == 1);
        CHECK(run(g, "{\n  \"name\": \"Ann\",\n  \"age\": 31,\n  \"tags\": [\"x\", \"y\"]\n}") ==
              1);
        CHECK(run(g, "{\"age\": 31}") == -1, "name is required");
        CHECK(run(g, "{\"name\": \"\", \"age\": 1}") == -1, "minLength 1");
        CHECK(run(g, "{\"name\": \"abcdefghijklm\", \"age\": 1}") == -1, "maxLength 12");
        CHECK(run(g, "{\"name\": \"a\", \"age\": 1.5}") == -1, "an integer");
        CHECK(run(g, "{\"name\": \"a\", \"age\": 1, \"zz\": 1}") == -1, "no extra keys");
        CHECK(run(g, "{\"name\": \"a\", \"age\": 1, \"tags\": [\"1\",\"2\",\"3\",\"4\"]}") == -1,
              "maxItems 3");
        CHECK(run(g, "{\"name\": \"a\", \"age\": 1, \"kind\": \"c\"}") == -1, "enum");
    }
    lt_grammar_free(g);
    json_decref(s);
}

static void expect_schema_error(const char *schema, lt_status want, const char *words)
{
    json_t *s = json_loads(schema, JSON_DECODE_ANY, NULL);
    struct lt_strbuf gb = {0};
    lt_status st = s ? srv_json_schema_gbnf(s, &gb) : LT_ERR_FORMAT;
    CHECK(st == want, "%s: status %d", schema, (int)st);
    CHECK(strstr(lt_last_error(), words) != NULL, "%s: message '%s' lacks '%s'", schema,
          lt_last_error(), words);
    lt_strbuf_free(&gb);
    json_decref(s);
}

static void test_schema_errors(void)
{
    expect_schema_error("{\"type\":\"string\",\"multipleOf\":2}", LT_ERR_UNSUPPORTED,
                        "keyword 'multipleOf' (at the top level) is not supported");
    expect_schema_error("{\"properties\":{\"n\":{\"type\":\"number\",\"minimum\":3,"
                        "\"maximum\":2}}}",
                        LT_ERR_INVALID, "the bounds (at /properties/n) allow no number");
    expect_schema_error("{\"type\":\"strin\"}", LT_ERR_INVALID, "'strin'");
    expect_schema_error("{\"$ref\":\"#/$defs/x\"}", LT_ERR_INVALID, "names no definition");
    expect_schema_error("{\"$ref\":\"http://x/y\"}", LT_ERR_UNSUPPORTED, "only");
    expect_schema_error("{\"required\":[\"a\"]}", LT_ERR_UNSUPPORTED, "not in 'properties'");
    expect_schema_error("{\"type\":\"array\",\"maxItems\":2000}", LT_ERR_UNSUPPORTED, "2000");
    expect_schema_error("false", LT_ERR_INVALID, "false allows nothing");
    expect_schema_error("{\"anyOf\":[{}],\"type\":\"object\"}", LT_ERR_UNSUPPORTED,
                        "'anyOf' beside 'type'");
}

/* The grammar of schema (JSON text), which must compile; NULL if it does not. */
static struct lt_grammar *schema_text_grammar(const char *schema)
{
    json_t *s = json_loads(schema, 0, NULL);
    CHECK(s != NULL, "bad test schema %s", schema);
    struct lt_grammar *g = s ? schema_grammar(s) : NULL;
    json_decref(s);
    return g;
}

/* Every integer in [-3000, 3000], some beyond, and non-canonical spellings, against the
 * range [lo, hi] the schema's bounds give. */
static void expect_range(const char *bounds, long long lo, long long hi)
{
    char schema[200], num[32];
    snprintf(schema, sizeof(schema), "{\"type\":\"integer\",%s}", bounds);
    struct lt_grammar *g = schema_text_grammar(schema);
    if (!g)
        return;
    int bad = 0;
    for (long long v = -3000; v <= 3000 && bad < 5; v++) {
        snprintf(num, sizeof(num), "%lld", v);
        bool in = v >= lo && v <= hi;
        bad += (run(g, num) == 1) != in;
        CHECK((run(g, num) == 1) == in, "%s: %s %s", schema, num, in ? "refused" : "accepted");
    }
    static const long long far[] = {99999,           100000,           -99999,          1000000007,
                                    -1000000007,     9999999999999999, -9999999999999999};
    for (size_t i = 0; i < sizeof(far) / sizeof(far[0]); i++) {
        snprintf(num, sizeof(num), "%lld", far[i]);
        bool in = far[i] >= lo && far[i] <= hi;
        CHECK((run(g, num) == 1) == in, "%s: %s %s", schema, num, in ? "refused" : "accepted");
    }
    static const char *const never[] = {"-0", "00", "0255", "010", "-01", "+5", "1.0", "1e2",
                                        "10000000000000000"};
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++)
        CHECK(run(g, never[i]) != 1, "%s: '%s' accepted", schema, never[i]);
    lt_grammar_free(g);
}

static void test_schema_ranges(void)
{
    const long long M = 9999999999999999LL;
    expect_range("\"minimum\":10,\"maximum\":255", 10, 255);
    expect_range("\"minimum\":-300,\"maximum\":-7", -300, -7);
    expect_range("\"minimum\":-50,\"maximum\":50", -50, 50);
    expect_range("\"minimum\":-1999,\"maximum\":2099", -1999, 2099);
    expect_range("\"exclusiveMinimum\":0,\"exclusiveMaximum\":1000", 1, 999);
    expect_range("\"minimum\":100", 100, M);
    expect_range("\"maximum\":-5", -M, -5);
    expect_range("\"minimum\":0", 0, M);
    expect_range("\"exclusiveMaximum\":0", -M, -1);
    expect_range("\"minimum\":7,\"maximum\":7", 7, 7);
    expect_range("\"minimum\":-2.5,\"maximum\":99.9", -2, 99);
    expect_range("\"minimum\":3,\"exclusiveMinimum\":true,\"maximum\":9,"
                 "\"exclusiveMaximum\":true",
                 4, 8);
    expect_range("\"minimum\":1000,\"maximum\":1e300", 1000, M);
    expect_range("\"minimum\":-123456789012,\"maximum\":98765432109876", -123456789012,
                 98765432109876);
    struct lt_grammar *g = schema_text_grammar("{\"type\":\"integer\",\"minimum\":10,"
                                               "\"maximum\":255}");
    if (g) /* the brief's cases, by name */
        CHECK(run(g, "10") == 1 && run(g, "99") == 1 && run(g, "255") == 1 && run(g, "9") != 1 &&
              run(g, "256") != 1 && run(g, "0255") != 1);
    lt_grammar_free(g);
    expect_schema_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", LT_ERR_INVALID,
                        "allow no integer");
    expect_schema_error("{\"type\":\"integer\",\"exclusiveMinimum\":4,\"exclusiveMaximum\":5}",
                        LT_ERR_INVALID, "allow no integer");
    expect_schema_error("{\"type\":\"integer\",\"minimum\":1e20}", LT_ERR_UNSUPPORTED,
                        "more than 16 digits");
    expect_schema_error("{\"type\":\"integer\",\"minimum\":\"3\"}", LT_ERR_INVALID,
                        "must be a number");
}

/* Each string against the grammar of {"type": "string", "pattern": pat}: want 1 accepted. */
/* Is s a number as a bounded number is written: "-"?, "0" or 1-16 digits without a
 * leading zero, then optionally "." and 1-16 digits; no exponent. */
static bool plain_decimal(const char *s)
{
    s += *s == '-';
    size_t n = strspn(s, "0123456789");
    if (n == 0 || n > 16 || (n > 1 && s[0] == '0'))
        return false;
    s += n;
    if (*s == '.') {
        n = strspn(s + 1, "0123456789");
        if (n == 0 || n > 16)
            return false;
        s += 1 + n;
    }
    return *s == 0;
}

/* Compares the values of two plain decimals (any digit counts), exactly: <0, 0, >0. */
static int decimal_cmp(const char *x, const char *y)
{
    const char *p[2] = {x, y};
    bool neg[2];
    size_t ilen[2], flen[2];
    const char *ip[2], *fp[2];
    for (int i = 0; i < 2; i++) {
        const char *s = p[i];
        neg[i] = *s == '-';
        s += neg[i];
        while (*s == '0')
            s++;
        ip[i] = s;
        ilen[i] = strspn(s, "0123456789");
        fp[i] = s[ilen[i]] == '.' ? s + ilen[i] + 1 : "";
        flen[i] = strlen(fp[i]);
        while (flen[i] > 0 && fp[i][flen[i] - 1] == '0')
            flen[i]--;
        if (ilen[i] == 0 && flen[i] == 0)
            neg[i] = false; /* -0 is 0 */
    }
    if (neg[0] != neg[1])
        return neg[0] ? -1 : 1;
    int c = ilen[0] != ilen[1] ? (ilen[0] < ilen[1] ? -1 : 1) : strncmp(ip[0], ip[1], ilen[0]);
    for (size_t k = 0; c == 0 && k < flen[0] + flen[1]; k++) {
        char a = k < flen[0] ? fp[0][k] : '0', b = k < flen[1] ? fp[1][k] : '0';
        c = a < b ? -1 : a > b;
    }
    return neg[0] ? -c : c;
}

/* Is num, a text, a plain decimal within the range (lo, hi: decimal texts, NULL: none)? */
static bool in_number_range(const char *num, const char *lo, bool lo_excl, const char *hi,
                            bool hi_excl)
{
    return plain_decimal(num) && (!lo || decimal_cmp(num, lo) > (lo_excl ? 0 : -1)) &&
           (!hi || decimal_cmp(num, hi) < (hi_excl ? 0 : 1));
}

/* Signed integer parts and fractions crossed (every k/8 in [-13, 13] in several spellings,
 * and neighbours a 16th decimal away), and malformed texts, against the range the schema's
 * bounds give: lo and hi are decimal texts (NULL: none). */
static void expect_number_range(const char *bounds, const char *lo, bool lo_excl, const char *hi,
                                bool hi_excl)
{
    static const char *const ints[] = {"0", "1", "2",  "3",  "4",  "5",  "6",  "7",
                                       "8", "9", "10", "11", "12", "13", "00", "01"};
    static const char *const fracs[] = {
        "", ".0", ".00", ".125", ".1250", ".25", ".375", ".5", ".50", ".625", ".75", ".875",
        ".1", ".3", ".1249999999999999", ".1250000000000001", ".2499999999999999",
        ".2500000000000001", ".4999999999999999", ".5000000000000001", ".7499999999999999",
        ".7500000000000001", ".9999999999999999", ".0000000000000001", ".0000000000000000",
        ".0999999999999999", ".1000000000000001", ".2999999999999999", ".3000000000000001",
        ".00001", ".10000000000000000", ".", ".5e0", "e1", "E-2"};
    static const char *const other[] = {
        "9999999999999999.9999999999999999", "-9999999999999999.9999999999999999",
        "9999999999999999", "-9999999999999999", "10000000000000000", "-10000000000000000",
        "+1", ".5", "-.5", "--1", "-", "1.5.", "0x1", "1e0", "-1.5E+1", "Infinity", "NaN"};
    char schema[256], num[64];
    snprintf(schema, sizeof(schema), "{\"type\":\"number\",%s}", bounds);
    struct lt_grammar *g = schema_text_grammar(schema);
    if (!g)
        return;
    int bad = 0;
    for (int sign = 0; sign < 2; sign++)
        for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
            for (size_t f = 0; f < sizeof(fracs) / sizeof(fracs[0]) && bad < 5; f++) {
                snprintf(num, sizeof(num), "%s%s%s", sign ? "-" : "", ints[i], fracs[f]);
                bool in = in_number_range(num, lo, lo_excl, hi, hi_excl);
                bool ok = (run(g, num) == 1) == in;
                bad += !ok;
                CHECK(ok, "%s: %s %s", schema, num, in ? "refused" : "accepted");
            }
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        bool in = in_number_range(other[i], lo, lo_excl, hi, hi_excl);
        CHECK((run(g, other[i]) == 1) == in, "%s: %s %s", schema, other[i],
              in ? "refused" : "accepted");
    }
    lt_grammar_free(g);
}

static void test_schema_number_ranges(void)
{
    CHECK(decimal_cmp("1.50", "1.5") == 0 && decimal_cmp("-0.0", "0") == 0 &&
          decimal_cmp("0.4999999999999999", "0.5") < 0 && decimal_cmp("-2", "-1.99") < 0 &&
          decimal_cmp("10", "9.99") > 0 && decimal_cmp("0.1", "0.0999") > 0);
    expect_number_range("\"minimum\":0.5,\"maximum\":10", "0.5", false, "10", false);
    expect_number_range("\"exclusiveMinimum\":-1.25,\"maximum\":3.75", "-1.25", true, "3.75",
                        false);
    expect_number_range("\"minimum\":-2.5,\"exclusiveMaximum\":-0.125", "-2.5", false, "-0.125",
                        true);
    expect_number_range("\"exclusiveMinimum\":0,\"exclusiveMaximum\":1", "0", true, "1", true);
    expect_number_range("\"minimum\":0,\"maximum\":1", "0", false, "1", false);
    expect_number_range("\"minimum\":0,\"maximum\":0", "0", false, "0", false);
    expect_number_range("\"minimum\":-0.0,\"exclusiveMaximum\":0.5", "0", false, "0.5", true);
    expect_number_range("\"minimum\":2.375", "2.375", false, NULL, false);
    expect_number_range("\"exclusiveMinimum\":-3.5", "-3.5", true, NULL, false);
    expect_number_range("\"maximum\":-3.5", NULL, false, "-3.5", false);
    expect_number_range("\"exclusiveMaximum\":0.1", NULL, false, "0.1", true);
    expect_number_range("\"minimum\":0.1,\"maximum\":0.3", "0.1", false, "0.3", false);
    expect_number_range("\"exclusiveMinimum\":0.1,\"exclusiveMaximum\":0.3", "0.1", true, "0.3",
                        true);
    expect_number_range("\"minimum\":1.5,\"maximum\":1.875", "1.5", false, "1.875", false);
    expect_number_range("\"exclusiveMinimum\":1.5,\"exclusiveMaximum\":1.875", "1.5", true,
                        "1.875", true);
    expect_number_range("\"minimum\":-3,\"maximum\":5", "-3", false, "5", false);
    expect_number_range("\"exclusiveMinimum\":-3,\"exclusiveMaximum\":5", "-3", true, "5", true);
    expect_number_range("\"minimum\":0.25,\"exclusiveMinimum\":true,\"maximum\":12,"
                        "\"exclusiveMaximum\":true",
                        "0.25", true, "12", true);
    expect_number_range("\"minimum\":1,\"exclusiveMinimum\":1,\"maximum\":2,"
                        "\"exclusiveMaximum\":3",
                        "1", true, "2", false);
    expect_number_range("\"minimum\":-1e20,\"exclusiveMaximum\":1e-5", "-100000000000000000000",
                        false, "0.00001", true);
    expect_number_range("\"minimum\":0.0000000000000001,\"maximum\":1e300", "0.0000000000000001",
                        false, NULL, false);
    expect_number_range("\"exclusiveMinimum\":1e-20,\"maximum\":0.9999999999999999",
                        "0.00000000000000000001", true, "0.9999999999999999", false);
    struct lt_grammar *g = schema_text_grammar("{\"maximum\":3}"); /* other types are free */
    if (g)
        CHECK(run(g, "3") == 1 && run(g, "2.5") == 1 && run(g, "-0") == 1 &&
              run(g, "3.01") == -1 && run(g, "\"x\"") == 1 && run(g, "[4, 1e9]") == 1 &&
              run(g, "{\"a\": 5}") == 1 && run(g, "null") == 1 && run(g, "1e0") == -1);
    lt_grammar_free(g);
    expect_schema_error("{\"type\":\"number\",\"minimum\":5,\"maximum\":4}", LT_ERR_INVALID,
                        "allow no number");
    expect_schema_error("{\"type\":\"number\",\"exclusiveMinimum\":1.5,\"maximum\":1.5}",
                        LT_ERR_INVALID, "allow no number");
    expect_schema_error("{\"type\":\"number\",\"exclusiveMinimum\":1e20}", LT_ERR_INVALID,
                        "allow no number");
    expect_schema_error("{\"type\":\"number\",\"minimum\":1e-40}", LT_ERR_UNSUPPORTED,
                        "more than 32 decimal places");
    expect_schema_error("{\"type\":\"number\",\"maximum\":[1]}", LT_ERR_INVALID,
                        "'maximum' (at the top level) must be a number");
}

static void expect_pattern(const char *pat, const char *const *strs, const int *want, size_t n)
{
    json_t *s = json_pack("{s:s, s:s}", "type", "string", "pattern", pat);
    struct lt_grammar *g = s ? schema_grammar(s) : NULL;
    for (size_t i = 0; g && i < n; i++) {
        bool ok = run(g, strs[i]) == 1;
        CHECK(ok == (want[i] == 1), "pattern '%s': %s %s", pat, strs[i],
              ok ? "accepted" : "refused");
    }
    lt_grammar_free(g);
    json_decref(s);
}

static void test_schema_patterns(void)
{
    const char *code[] = {"\"AB123\"", "\"AB12\"", "\"ab123\"", "\"AB1234\"", "\"XY000\"",
                          "AB123"};
    expect_pattern("^[A-Z]{2}\\d{3}$", code, (const int[]){1, 0, 0, 0, 1, 0}, 6);
    /* unanchored: anything around; anchored on one side only */
    const char *un[] = {"\"cat\"", "\"a cat!\"", "\"dog\"", "\"\\\"cat\\\"\""};
    expect_pattern("cat", un, (const int[]){1, 1, 0, 1}, 4);
    expect_pattern("^cat", un, (const int[]){1, 0, 0, 0}, 4);
    expect_pattern("cat!$", un, (const int[]){0, 1, 0, 0}, 4);
    /* '"', '\\' and controls in JSON spelling: the value is what the pattern sees; each
     * character has one spelling (so "\/" for '/' is refused) */
    const char *q[] = {"\"\\\"\"", "\"\\\\\"", "\"\\n\"", "\"\\t\"", "\"\\u0001\"", "\"n\"",
                       "\"\\/\""};
    expect_pattern("^[\"\\\\\\n\\x01]$", q, (const int[]){1, 1, 1, 0, 1, 0, 0}, 7);
    expect_pattern("^[^a-z]$", q, (const int[]){1, 1, 1, 1, 1, 0, 0}, 7);
    expect_pattern("^.$", q, (const int[]){1, 1, 0, 1, 1, 1, 0}, 7);
    /* groups, alternation, counts, classes, lazy quantifiers, escapes */
    const char *g[] = {"\"ab-ab-\"", "\"ab-\"", "\"x_9\"", "\"2024-01-31\"", "\"a.b\"", "\"axb\""};
    expect_pattern("^(ab-){2,}$", g, (const int[]){1, 0, 0, 0, 0, 0}, 6);
    expect_pattern("^(?:ab-)+?$|^\\w+$", g, (const int[]){1, 1, 1, 0, 0, 1}, 6);
    expect_pattern("^\\d{4}-(0[1-9]|1[0-2])-\\d\\d$", g, (const int[]){0, 0, 0, 1, 0, 0}, 6);
    expect_pattern("^a\\.b$", g, (const int[]){0, 0, 0, 0, 1, 0}, 6);
    expect_pattern("^a[.]b$|^a\\x78b$", g, (const int[]){0, 0, 0, 0, 1, 1}, 6);
    expect_pattern("^[^\\W\\d]{3}$", g, (const int[]){0, 0, 0, 0, 0, 1}, 6);
    const char *e[] = {"\"\"", "\"a\""};
    expect_pattern("^$", e, (const int[]){1, 0}, 2);
    expect_pattern("^a?$", e, (const int[]){1, 1}, 2);
    expect_pattern("^(|a)$", e, (const int[]){1, 1}, 2);
    expect_pattern("^a{0}$", e, (const int[]){1, 0}, 2);
    /* refused: the construct named */
    static const struct {
        const char *pat, *words;
        lt_status st;
    } bad[] = {
        {"^(a)\\1$", "backreferences", LT_ERR_UNSUPPORTED},
        {"^(?=a)a$", "lookahead", LT_ERR_UNSUPPORTED},
        {"^(?<!a)b$", "lookbehind", LT_ERR_UNSUPPORTED},
        {"\\bword", "word boundaries", LT_ERR_UNSUPPORTED},
        {"\\p{L}", "Unicode property", LT_ERR_UNSUPPORTED},
        {"a^b", "'^' only anchors", LT_ERR_UNSUPPORTED},
        {"(a$)", "'$' only anchors", LT_ERR_UNSUPPORTED},
        {"a$b", "'$' only anchors", LT_ERR_UNSUPPORTED},
        {"^(a?)*$", "without bound, a part that can match nothing", LT_ERR_UNSUPPORTED},
        {"^a{1000000}$", "a count over 1000", LT_ERR_UNSUPPORTED},
        {"^(a{1000}){1001}$", "a count over 1000", LT_ERR_UNSUPPORTED},
        {"^a{999}b{999}c{999}d{999}e{999}f{999}g{999}h{999}i{999}j{999}k{999}$", "adding up",
         LT_ERR_UNSUPPORTED},
        {"^(((((((((((((((((((((((((((((((((a)))))))))))))))))))))))))))))))))$", "nested deeper",
         LT_ERR_UNSUPPORTED},
        {"^[z-a]$", "out of order", LT_ERR_INVALID},
        {"^a{3,2}$", "out of order", LT_ERR_INVALID},
        {"^(ab", "'(' is not closed", LT_ERR_INVALID},
        {"^ab)$", "')' without its '('", LT_ERR_INVALID},
        {"^[ab$", "'[' is not closed", LT_ERR_INVALID},
        {"^*a$", "nothing to repeat", LT_ERR_INVALID},
        {"^a**$", "nothing to repeat", LT_ERR_INVALID},
        {"^[^\\s\\S]$", "matches no character", LT_ERR_UNSUPPORTED},
        {"^\\x4$", "malformed", LT_ERR_INVALID},
        {"^(?i)a$", "'(?' other than", LT_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char schema[300];
        json_t *p = json_string(bad[i].pat);
        char *enc = p ? json_dumps(p, JSON_ENCODE_ANY) : NULL;
        snprintf(schema, sizeof(schema), "{\"type\":\"string\",\"pattern\":%s}", enc ? enc : "0");
        expect_schema_error(schema, bad[i].st, bad[i].words);
        free(enc);
        json_decref(p);
    }
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}",
                        LT_ERR_UNSUPPORTED, "'pattern' beside minLength or maxLength");
}

static void test_schema_arrays(void)
{
    struct lt_grammar *g = schema_text_grammar(
        "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\","
        "\"minimum\":0}],\"items\":false,\"minItems\":2}");
    if (g) {
        CHECK(run(g, "[\"a\", 3]") == 1 && run(g, "[ \"a\",0 ]") == 1);
        CHECK(run(g, "[\"a\"]") != 1 && run(g, "[]") != 1, "minItems 2");
        CHECK(run(g, "[\"a\", 3, 4]") != 1, "items false");
        CHECK(run(g, "[3, \"a\"]") != 1 && run(g, "[\"a\", -1]") != 1, "item schemas");
    }
    lt_grammar_free(g);
    /* spec defaults: a prefix may stop early, and any items may follow it */
    g = schema_text_grammar("{\"prefixItems\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}");
    if (g)
        CHECK(run(g, "[]") == 1 && run(g, "[true]") == 1 && run(g, "[true, null]") == 1 &&
              run(g, "[false, null, {\"x\": 1}, 2]") == 1 && run(g, "[null]") != 1);
    lt_grammar_free(g);
    g = schema_text_grammar("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"boolean\"}],"
                            "\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}");
    if (g)
        CHECK(run(g, "[true, 1]") == 1 && run(g, "[true, 1, 2]") == 1 && run(g, "[true]") != 1 &&
              run(g, "[true, 1, 2, 3]") != 1 && run(g, "[true, \"x\"]") != 1);
    lt_grammar_free(g);
    g = schema_text_grammar("{\"prefixItems\":[{},{},{}],\"maxItems\":1}");
    if (g)
        CHECK(run(g, "[]") == 1 && run(g, "[1]") == 1 && run(g, "[1, 2]") != 1);
    lt_grammar_free(g);
    g = schema_text_grammar("{\"type\":\"array\",\"items\":false,\"uniqueItems\":false}");
    if (g)
        CHECK(run(g, "[]") == 1 && run(g, "[1]") != 1);
    lt_grammar_free(g);
    expect_schema_error("{\"type\":\"array\",\"uniqueItems\":true}", LT_ERR_UNSUPPORTED,
                        "'uniqueItems': true (at the top level) cannot be expressed by a grammar");
    expect_schema_error("{\"prefixItems\":[{},{}],\"items\":false,\"minItems\":3}",
                        LT_ERR_INVALID, "more than the 2 items");
    expect_schema_error("{\"items\":[{},{}]}", LT_ERR_UNSUPPORTED, "write 'prefixItems'");
    expect_schema_error("{\"prefixItems\":{}}", LT_ERR_INVALID, "must be an array");
}

/* oneOf is compiled as anyOf: an output fitting two branches is not refused (documented). */
static void test_schema_one_of(void)
{
    struct lt_grammar *g =
        schema_text_grammar("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}");
    if (g)
        CHECK(run(g, "3") == 1 && run(g, "3.5") == 1, "oneOf as anyOf");
    lt_grammar_free(g);
}
#endif

/* ---- generation under a grammar, SmolLM2's vocabulary, random logits ---- */

/* Generates from random logits (a model that wants anything) under g; the text into out.
 * Returns the finish reason; *secs the time it took. */
static enum lt_gen_finish generate(const struct lt_tokenizer *tok, struct lt_grammar *g,
                                   uint64_t seed, struct lt_strbuf *out, double *secs)
{
    struct lt_gen_params gp = lt_gen_default_params();
    gp.ignore_eog = seed % 2 == 0; /* end-of-generation tokens are then never drawn */
    gp.grammar = g;
    gp.max_tokens = 4000;
    gp.sampler.seed = seed;
    struct lt_gen_seq s;
    CHECK(lt_gen_seq_init(&s, tok, &gp) == LT_OK, "%s", lt_last_error());
    size_t V = lt_tokenizer_n_tokens(tok);
    float *lg = malloc(V * sizeof(*lg));
    lt_token p0 = 1;
    CHECK(lg && lt_gen_seq_set_prompt(&s, &p0, 1, SIZE_MAX) == LT_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (lg && !lt_gen_seq_done(&s)) {
        for (size_t i = 0; i < V; i++)
            lg[i] = (float)(rnd() % 4000) / 400.0f;
        lt_status st = lt_gen_seq_step(&s, lg, V);
        CHECK(st == LT_OK, "step: %s", lt_last_error());
        if (st != LT_OK)
            break;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    out->len = 0;
    lt_strbuf_append(out, s.text.data, s.text.len);
    enum lt_gen_finish f = s.finish;
    printf("  seed %llu: %zu tokens, %llu masked, %.1f ms/token: %.120s%s\n",
           (unsigned long long)seed, lt_gen_seq_stats(&s).n_generated,
           (unsigned long long)s.n_masked, 1e3 * *secs / (double)lt_gen_seq_stats(&s).n_generated,
           out->data, out->len > 120 ? "..." : "");
    free(lg);
    lt_gen_seq_free(&s);
    return f;
}

static void test_generate_smollm2(void)
{
    char path[600];
    struct lt_gguf *gg = NULL;
    struct lt_tokenizer *tok = NULL;
    if (!find_model(path, sizeof(path)) || lt_gguf_open(path, &gg) != LT_OK ||
        lt_tokenizer_from_gguf(gg, &tok) != LT_OK) {
        printf("no SmolLM2 GGUF (or tokenizer): generation under a grammar not tested\n");
        lt_gguf_close(gg);
        return;
    }
    struct lt_strbuf text = {0};
    double secs;
    struct lt_grammar *g = parse("root ::= (\"yes\" | \"no\")");
    for (uint64_t seed = 1; g && seed <= 5; seed++) {
        enum lt_gen_finish f = generate(tok, g, seed, &text, &secs);
        CHECK(f == LT_GEN_FINISH_GRAMMAR, "finish %s", lt_gen_finish_name(f));
        CHECK(!strcmp(text.data, "yes") || !strcmp(text.data, "no"), "'%s'", text.data);
        CHECK(!strcmp(lt_gen_finish_reason(f), "stop"));
    }
    lt_grammar_free(g);
#ifdef LATHE_HAVE_JANSSON
    for (size_t k = 0; k < 2; k++) {
        json_t *s = json_loads(schemas[k == 0 ? 0 : 5], 0, NULL);
        g = s ? schema_grammar(s) : NULL;
        int ended = 0;
        for (uint64_t seed = 1; g && seed <= 4; seed++) {
            enum lt_gen_finish f = generate(tok, g, seed, &text, &secs);
            /* random logits may write a string without end: the limit stops it */
            CHECK(f == LT_GEN_FINISH_GRAMMAR || f == LT_GEN_FINISH_EOG || f == LT_GEN_FINISH_LENGTH,
                  "finish %s", lt_gen_finish_name(f));
            if (f == LT_GEN_FINISH_LENGTH)
                continue;
            ended++;
            json_error_t err;
            json_t *v = json_loads(text.data, 0, &err);
            CHECK(v && valid(v, s, s), "not valid (%s): %s", err.text, text.data);
            json_decref(v);
        }
        CHECK(ended >= 2, "only %d of 4 generations ended", ended);
        lt_grammar_free(g);
        json_decref(s);
    }
#endif
    lt_strbuf_free(&text);
    lt_tokenizer_free(tok);
    lt_gguf_close(gg);
}

int main(void)
{
    test_parse_errors();
    test_accept();
    test_partial_utf8();
    test_walk_gbnf();
#ifdef LATHE_HAVE_JANSSON
    test_schema_accept();
    test_schema_errors();
    test_schema_ranges();
    test_schema_number_ranges();
    test_schema_patterns();
    test_schema_arrays();
    test_schema_one_of();
    test_schemas();
#endif
    test_generate_smollm2();
    return check_summary();
}
