/* json_schema.c: JSON Schema to GBNF (json_schema.h).
 *
 * Each schema becomes one rule, named s1, s2, ... in the order they are met; the JSON
 * building blocks (ws, string, number, value, ...) are emitted once, when first used. An
 * object's properties, in the schema's order, become two chains of rules: A(i), where no
 * property has been written yet, and B(i), where one has (so the next needs a comma):
 *   A(i) ::= KV(i) B(i+1)          B(i) ::= "," ws KV(i) B(i+1)      (property i required)
 *   A(i) ::= KV(i) B(i+1) | A(i+1) B(i) ::= "," ws KV(i) B(i+1) | B(i+1)   (optional)
 *   A(n) ::= ""                    B(n) ::= ""
 * which allows exactly the in-order subsets that hold every required property, with no
 * ambiguity for the matcher to carry. A $ref is compiled once into a rule of its own, named
 * before its target is compiled, so recursive schemas become recursive rules. */
#ifdef LATHE_HAVE_JANSSON
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_schema.h"
#include "server/server_impl.h"

#define SC_MAX_DEPTH 64
#define SC_MAX_REFS 256
#define SC_MAX_REPEAT 1000 /* the grammar's bound on {m,n} (grammar_parse.c) */

enum sc_base {
    SC_WS = 1u << 0,
    SC_CHAR = 1u << 1,
    SC_STRING = 1u << 2,
    SC_INTEGER = 1u << 3,
    SC_NUMBER = 1u << 4,
    SC_BOOLEAN = 1u << 5,
    SC_NULL = 1u << 6,
    SC_VALUE = 1u << 7,
    SC_OBJECT = 1u << 8,
    SC_ARRAY = 1u << 9,
};

/* The building blocks: name and body, by bit; the ones each needs are emitted with it. */
static const struct {
    unsigned bit, needs;
    const char *name, *body;
} sc_bases[] = {
    {SC_WS, 0, "ws", "( \" \" | \"\\n\" [ \\t]{0,20} )?"},
    /* a \u escape is a code point: no lone surrogate, which strict parsers refuse */
    {SC_CHAR, 0, "char",
     "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CeEfF] "
     "[0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} \"\\\\u\" [dD] "
     "[c-fC-F] [0-9a-fA-F]{2} ) )"},
    {SC_STRING, SC_CHAR, "string", "\"\\\"\" char* \"\\\"\""},
    {SC_INTEGER, 0, "integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )"},
    {SC_NUMBER, 0, "number",
     "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?"},
    {SC_BOOLEAN, 0, "boolean", "\"true\" | \"false\""},
    {SC_NULL, 0, "null", "\"null\""},
    {SC_VALUE, SC_OBJECT | SC_ARRAY | SC_STRING | SC_NUMBER | SC_BOOLEAN | SC_NULL, "value",
     "object | array | string | number | boolean | null"},
    {SC_OBJECT, SC_WS | SC_STRING | SC_VALUE, "object",
     "\"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\""},
    {SC_ARRAY, SC_WS | SC_VALUE, "array", "\"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\""},
};

struct sc {
    const json_t *root;
    struct lt_strbuf *out;
    unsigned emitted; /* enum sc_base bits */
    bool oom;         /* an append of a building block failed */
    int n_rules;
    int depth;
    char path[512]; /* where in the schema, for messages: "/properties/age" */
    int n_refs;
    struct {
        const json_t *target;
        char name[16];
    } refs[SC_MAX_REFS];
};

typedef char sc_name[16];

static lt_status sc_schema(struct sc *c, const json_t *s, char *name);

static const char *sc_where(const struct sc *c)
{
    return c->path[0] ? c->path : "the top level";
}

static lt_status sc_nomem(void)
{
    return lt_fail(LT_ERR_NOMEM, "json_schema: out of memory for the grammar");
}

static const char *sc_base(struct sc *c, unsigned bit)
{
    const char *name = "";
    for (size_t i = 0; i < sizeof(sc_bases) / sizeof(sc_bases[0]); i++) {
        if (sc_bases[i].bit != bit)
            continue;
        name = sc_bases[i].name;
        if (c->emitted & bit)
            break;
        c->emitted |= bit;
        c->oom |= srv_strbuf_appendf(c->out, "%s ::= %s\n", name, sc_bases[i].body) != LT_OK;
        for (unsigned b = 1; b <= SC_ARRAY; b <<= 1)
            if (sc_bases[i].needs & b)
                sc_base(c, b);
        break;
    }
    return name;
}

static void sc_new_name(struct sc *c, char *name)
{
    snprintf(name, sizeof(sc_name), "s%d", ++c->n_rules);
}

/* A GBNF literal of bytes s[0..n). */
static lt_status sc_literal(struct lt_strbuf *b, const char *s, size_t n)
{
    lt_status st = lt_strbuf_append(b, "\"", 1);
    for (size_t i = 0; i < n && st == LT_OK; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            st = srv_strbuf_appendf(b, "\\%c", ch);
        else if (ch == '\n')
            st = lt_strbuf_append(b, "\\n", 2);
        else if (ch < 0x20 || ch == 0x7F)
            st = srv_strbuf_appendf(b, "\\x%02X", ch);
        else
            st = lt_strbuf_append(b, s + i, 1);
    }
    return st == LT_OK ? lt_strbuf_append(b, "\"", 1) : st;
}

/* Appends "/seg" to the path; returns the old length, for sc_pop. */
static size_t sc_push(struct sc *c, const char *seg)
{
    size_t len = strlen(c->path);
    snprintf(c->path + len, sizeof(c->path) - len, "/%s", seg);
    return len;
}

static void sc_pop(struct sc *c, size_t len)
{
    c->path[len] = 0;
}

#define SC_SUPPORTED                                                                               \
    "type, properties, required, additionalProperties, items, prefixItems, minItems, "             \
    "maxItems, uniqueItems (false only), minLength, maxLength, pattern, minimum, maximum, "        \
    "exclusiveMinimum, exclusiveMaximum, enum, const, anyOf, oneOf (as anyOf: exclusivity "        \
    "is not enforced) and $ref"

/* The keywords lathe reads, and the annotations it may ignore; anything else is refused. */
static lt_status sc_check_keywords(struct sc *c, const json_t *s)
{
    static const char *const known[] = {
        "type",        "properties",  "required",         "additionalProperties",
        "items",       "prefixItems", "minItems",         "maxItems",
        "uniqueItems", "minLength",   "maxLength",        "pattern",
        "minimum",     "maximum",     "exclusiveMinimum", "exclusiveMaximum",
        "enum",        "const",       "anyOf",            "oneOf",
        "$ref",        "$defs",       "definitions",      "title",
        "description", "default",     "examples",         "$schema",
        "$id",         "$comment",    "format"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        bool ok = false;
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]) && !ok; i++)
            ok = !strcmp(key, known[i]);
        if (!ok)
            return lt_fail(LT_ERR_UNSUPPORTED,
                           "json_schema: keyword '%s' (at %s) is not supported; lathe supports "
                           SC_SUPPORTED,
                           key, sc_where(c));
    }
    json_t *u = json_object_get(s, "uniqueItems");
    if (u && !json_is_boolean(u))
        return lt_fail(LT_ERR_INVALID, "json_schema: 'uniqueItems' (at %s) must be a boolean",
                       sc_where(c));
    if (json_is_true(u)) /* a grammar has no memory of the items it has passed */
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "json_schema: 'uniqueItems': true (at %s) cannot be expressed by a "
                       "grammar, which cannot remember the items already written; leave it "
                       "out and check the items after generation",
                       sc_where(c));
    return LT_OK;
}

/* A count keyword (minItems, ...): *out, or dflt when absent. */
static lt_status sc_count(struct sc *c, const json_t *s, const char *key, long long dflt,
                          long long *out)
{
    json_t *v = json_object_get(s, key);
    *out = dflt;
    if (!v)
        return LT_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return lt_fail(LT_ERR_INVALID, "json_schema: '%s' (at %s) must be a non-negative integer",
                       key, sc_where(c));
    if (json_integer_value(v) > SC_MAX_REPEAT)
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "json_schema: '%s' (at %s) is %lld; lathe's grammars count to %d at most",
                       key, sc_where(c), (long long)json_integer_value(v), SC_MAX_REPEAT);
    *out = json_integer_value(v);
    return LT_OK;
}

/* "{m,n}" (n < 0: unbounded) for m..n repetitions. */
static void sc_braces(char *buf, size_t size, long long min, long long max)
{
    if (max < 0)
        snprintf(buf, size, "{%lld,}", min);
    else
        snprintf(buf, size, "{%lld,%lld}", min, max);
}

/* Emits `name ::= body`. */
static lt_status sc_rule(struct sc *c, const char *name, const char *body)
{
    return srv_strbuf_appendf(c->out, "%s ::= %s\n", name, body);
}

/* A string whose value the regular expression matches (json_schema_pattern.c). */
static lt_status sc_pattern(struct sc *c, const json_t *pattern, bool lengths, char *name)
{
    if (!json_is_string(pattern))
        return lt_fail(LT_ERR_INVALID, "json_schema: 'pattern' (at %s) must be a string",
                       sc_where(c));
    if (lengths) /* a grammar of both would be their intersection, not built here */
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "json_schema: 'pattern' beside minLength or maxLength (at %s) is not "
                       "supported; put the length into the pattern ('{m,n}')",
                       sc_where(c));
    const char *any = sc_base(c, SC_CHAR);
    sc_new_name(c, name);
    lt_status st = srv_strbuf_appendf(c->out, "%s ::= \"\\\"\" ", name);
    if (st == LT_OK)
        st = srv_json_pattern_gbnf(json_string_value(pattern), json_string_length(pattern), any,
                                   sc_where(c), c->out);
    return st != LT_OK ? st : srv_strbuf_appendf(c->out, " \"\\\"\"\n");
}

static lt_status sc_string(struct sc *c, const json_t *s, char *name)
{
    long long min, max;
    lt_status st;
    if ((st = sc_count(c, s, "minLength", 0, &min)) != LT_OK ||
        (st = sc_count(c, s, "maxLength", -1, &max)) != LT_OK)
        return st;
    if (max >= 0 && max < min)
        return lt_fail(LT_ERR_INVALID,
                       "json_schema: maxLength %lld is below minLength %lld (at %s)", max, min,
                       sc_where(c));
    json_t *pattern = json_object_get(s, "pattern");
    if (pattern)
        return sc_pattern(c, pattern, min != 0 || max >= 0, name);
    if (min == 0 && max < 0) {
        snprintf(name, sizeof(sc_name), "%s", sc_base(c, SC_STRING));
        return LT_OK;
    }
    sc_base(c, SC_CHAR);
    char br[48], body[96];
    sc_braces(br, sizeof(br), min, max);
    snprintf(body, sizeof(body), "\"\\\"\" char%s \"\\\"\"", br);
    sc_new_name(c, name);
    return sc_rule(c, name, body);
}

/* T(i) of a tuple: what follows its first i items (i <= n_prefix): more prefix items up to
 * max, optional from min on, then the rest (rest: NULL when "items" is false). */
static lt_status sc_tuple_rest(struct sc *c, const char *rest, long long min, long long max,
                               size_t n, int first)
{
    long long lo = min > (long long)n ? min - (long long)n : 0;
    long long hi = max < 0 ? -1 : max - (long long)n;
    if (!rest || (max >= 0 && hi <= 0))
        return srv_strbuf_appendf(c->out, "s%d ::= \"\"\n", first + (int)n);
    char br[48];
    sc_braces(br, sizeof(br), lo, hi);
    return srv_strbuf_appendf(c->out, "s%d ::= ( \",\" ws %s ws )%s\n", first + (int)n, rest, br);
}

/* prefixItems: items one by one, then `rest` ("items"); T(i) is s<first + i>. */
static lt_status sc_tuple(struct sc *c, const json_t *prefix, const char *rest, long long min,
                          long long max, char *name)
{
    size_t n = json_array_size(prefix);
    long long most = rest ? max : max < 0 || max > (long long)n ? (long long)n : max;
    if (min > most && most >= 0)
        return lt_fail(LT_ERR_INVALID,
                       "json_schema: minItems %lld (at %s) is more than the %lld items that "
                       "prefixItems and 'items': false allow",
                       min, sc_where(c), most);
    sc_new_name(c, name);
    int first = c->n_rules + 1;
    c->n_rules += (int)n + 1;
    lt_status st = srv_strbuf_appendf(c->out, "%s ::= \"[\" ws s%d \"]\"\n", name, first);
    for (size_t i = 0; i < n && st == LT_OK; i++) {
        sc_name item;
        char seg[48];
        snprintf(seg, sizeof(seg), "prefixItems/%zu", i);
        size_t len = sc_push(c, seg);
        st = sc_schema(c, json_array_get(prefix, i), item);
        sc_pop(c, len);
        if (st != LT_OK)
            break;
        if (most >= 0 && (long long)i >= most)
            st = srv_strbuf_appendf(c->out, "s%d ::= \"\"\n", first + (int)i);
        else
            st = srv_strbuf_appendf(c->out, "s%d ::= %s%s ws s%d%s\n", first + (int)i,
                                    i ? "\",\" ws " : "", item, first + (int)i + 1,
                                    (long long)i >= min ? " | \"\"" : "");
    }
    return st != LT_OK ? st : sc_tuple_rest(c, rest, min, max, n, first);
}

/* The schema of the items after prefixItems, into item; *none: "items" is false. */
static lt_status sc_items(struct sc *c, const json_t *items, char *item, bool *none)
{
    *none = json_is_false(items);
    if (*none)
        return LT_OK;
    if (json_is_array(items))
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "json_schema: 'items' as an array (at %s) is draft 4's tuple; write "
                       "'prefixItems' (and 'items' for what follows)",
                       sc_where(c));
    if (!items) {
        snprintf(item, sizeof(sc_name), "%s", sc_base(c, SC_VALUE));
        return LT_OK;
    }
    size_t len = sc_push(c, "items");
    lt_status st = sc_schema(c, items, item);
    sc_pop(c, len);
    return st;
}

static lt_status sc_array(struct sc *c, const json_t *s, char *name)
{
    long long min, max;
    lt_status st;
    if ((st = sc_count(c, s, "minItems", 0, &min)) != LT_OK ||
        (st = sc_count(c, s, "maxItems", -1, &max)) != LT_OK)
        return st;
    if (max >= 0 && max < min)
        return lt_fail(LT_ERR_INVALID, "json_schema: maxItems %lld is below minItems %lld (at %s)",
                       max, min, sc_where(c));
    json_t *prefix = json_object_get(s, "prefixItems");
    if (prefix && !json_is_array(prefix))
        return lt_fail(LT_ERR_INVALID, "json_schema: 'prefixItems' (at %s) must be an array",
                       sc_where(c));
    sc_name item;
    bool none;
    if ((st = sc_items(c, json_object_get(s, "items"), item, &none)) != LT_OK)
        return st;
    sc_base(c, SC_WS);
    if (json_array_size(prefix) > 0)
        return sc_tuple(c, prefix, none ? NULL : item, min, max, name);
    if (none && min > 0)
        return lt_fail(LT_ERR_INVALID,
                       "json_schema: 'items': false (at %s) allows only [], but minItems is %lld",
                       sc_where(c), min);
    char body[256], br[48];
    if (max == 0 || none) {
        snprintf(body, sizeof(body), "\"[\" ws \"]\"");
    } else if (min == 0) {
        if (max < 0)
            snprintf(br, sizeof(br), "*");
        else
            sc_braces(br, sizeof(br), 0, max - 1);
        snprintf(body, sizeof(body), "\"[\" ws ( %s ws ( \",\" ws %s ws )%s )? \"]\"", item, item,
                 br);
    } else {
        sc_braces(br, sizeof(br), min - 1, max < 0 ? -1 : max - 1);
        snprintf(body, sizeof(body), "\"[\" ws %s ws ( \",\" ws %s ws )%s \"]\"", item, item, br);
    }
    sc_new_name(c, name);
    return sc_rule(c, name, body);
}

/* An object without declared properties: any keys, with values of additionalProperties. */
static lt_status sc_map(struct sc *c, const json_t *ap, char *name)
{
    sc_base(c, SC_WS);
    if (json_is_false(ap)) {
        sc_new_name(c, name);
        return sc_rule(c, name, "\"{\" ws \"}\"");
    }
    if (!ap || json_is_true(ap)) {
        snprintf(name, sizeof(sc_name), "%s", sc_base(c, SC_OBJECT));
        return LT_OK;
    }
    sc_name v;
    size_t len = sc_push(c, "additionalProperties");
    lt_status st = sc_schema(c, ap, v);
    sc_pop(c, len);
    if (st != LT_OK)
        return st;
    const char *str = sc_base(c, SC_STRING);
    char body[256];
    snprintf(body, sizeof(body),
             "\"{\" ws ( %s ws \":\" ws %s ws ( \",\" ws %s ws \":\" ws %s ws )* )? \"}\"", str, v,
             str, v);
    sc_new_name(c, name);
    return sc_rule(c, name, body);
}

static bool sc_required(const json_t *req, const char *key)
{
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v) {
        if (json_is_string(v) && !strcmp(json_string_value(v), key))
            return true;
    }
    return false;
}

/* Checks `required` (strings naming declared properties). */
static lt_status sc_check_required(struct sc *c, const json_t *props, const json_t *req)
{
    if (!req)
        return LT_OK;
    if (!json_is_array(req))
        return lt_fail(LT_ERR_INVALID, "json_schema: 'required' (at %s) must be an array",
                       sc_where(c));
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v) {
        if (!json_is_string(v))
            return lt_fail(LT_ERR_INVALID,
                           "json_schema: 'required' (at %s) must hold property names", sc_where(c));
        if (!props || !json_object_get(props, json_string_value(v)))
            return lt_fail(LT_ERR_UNSUPPORTED,
                           "json_schema: 'required' (at %s) names '%s', which is not in "
                           "'properties'; declare it there",
                           sc_where(c), json_string_value(v));
    }
    return LT_OK;
}

/* KV(i) of the chains: "\"key\"" ws ":" ws value ws, into body. */
static lt_status sc_member(struct sc *c, const char *key, const json_t *schema,
                           struct lt_strbuf *body)
{
    sc_name v;
    size_t len = sc_push(c, "properties");
    sc_push(c, key);
    lt_status st = sc_schema(c, schema, v);
    sc_pop(c, len);
    if (st != LT_OK)
        return st;
    json_t *k = json_string(key);
    char *enc = k ? json_dumps(k, JSON_ENCODE_ANY) : NULL;
    json_decref(k);
    if (!enc)
        return sc_nomem();
    st = sc_literal(body, enc, strlen(enc));
    free(enc);
    return st != LT_OK ? st : srv_strbuf_appendf(body, " ws \":\" ws %s ws", v);
}

/* The A and B chains of the file's comment; A(i) is s<first + i>, B(i) s<first + n + 1 + i>. */
static lt_status sc_chains(struct sc *c, const json_t *props, const json_t *req, int first)
{
    size_t n = json_object_size(props), i = 0;
    struct lt_strbuf kv = {0};
    lt_status st = LT_OK;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)props, key, v) {
        kv.len = 0;
        if ((st = sc_member(c, key, v, &kv)) != LT_OK)
            break;
        int a = first + (int)i, b = first + (int)(n + 1 + i);
        bool r = req && sc_required(req, key);
        if (r)
            st = srv_strbuf_appendf(c->out, "s%d ::= %s s%d\ns%d ::= \",\" ws %s s%d\n", a, kv.data,
                                    b + 1, b, kv.data, b + 1);
        else
            st = srv_strbuf_appendf(c->out, "s%d ::= %s s%d | s%d\ns%d ::= \",\" ws %s s%d | s%d\n",
                                    a, kv.data, b + 1, a + 1, b, kv.data, b + 1, b + 1);
        if (st != LT_OK)
            break;
        i++;
    }
    if (st == LT_OK)
        st = srv_strbuf_appendf(c->out, "s%d ::= \"\"\ns%d ::= \"\"\n", first + (int)n,
                                first + (int)(2 * n + 1));
    lt_strbuf_free(&kv);
    return st;
}

static lt_status sc_object(struct sc *c, const json_t *s, char *name)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return lt_fail(LT_ERR_INVALID, "json_schema: 'properties' (at %s) must be an object",
                       sc_where(c));
    if (ap && !json_is_boolean(ap) && !json_is_object(ap))
        return lt_fail(LT_ERR_INVALID,
                       "json_schema: 'additionalProperties' (at %s) must be a boolean or a schema",
                       sc_where(c));
    lt_status st = sc_check_required(c, props, req);
    if (st != LT_OK)
        return st;
    size_t n = props ? json_object_size(props) : 0;
    if (n == 0)
        return sc_map(c, ap, name);
    sc_base(c, SC_WS);
    sc_new_name(c, name);
    int first = c->n_rules + 1;
    c->n_rules += 2 * (int)(n + 1);
    if ((st = srv_strbuf_appendf(c->out, "%s ::= \"{\" ws s%d \"}\"\n", name, first)) != LT_OK)
        return st;
    /* the chains (and the members' own rules) take names after the ones reserved here */
    return sc_chains(c, props, req, first);
}

/* enum and const: alternatives of the values (a JSON array) in compact JSON text. */
static lt_status sc_values(struct sc *c, const json_t *vals, const char *key, char *name)
{
    size_t n = json_array_size(vals);
    if (n == 0)
        return lt_fail(LT_ERR_INVALID, "json_schema: '%s' (at %s) allows no value", key,
                       sc_where(c));
    struct lt_strbuf body = {0};
    lt_status st = LT_OK;
    for (size_t i = 0; i < n && st == LT_OK; i++) {
        char *enc = json_dumps(json_array_get(vals, i), JSON_ENCODE_ANY | JSON_COMPACT);
        if (!enc)
            st = sc_nomem();
        if (st == LT_OK && i > 0)
            st = lt_strbuf_append(&body, " | ", 3);
        if (st == LT_OK)
            st = sc_literal(&body, enc, strlen(enc));
        free(enc);
    }
    if (st == LT_OK) {
        sc_new_name(c, name);
        st = sc_rule(c, name, body.data);
    }
    lt_strbuf_free(&body);
    return st;
}

/* One bound of an integer: the least (upper false) or greatest integer it allows, clamped
 * to just past what the grammar writes. */
static long long sc_int_bound(const json_t *v, bool upper, bool exclusive)
{
    const double lim = (double)SRV_JSON_INT_MAX + 1;
    if (json_is_integer(v)) {
        long long x = json_integer_value(v);
        if (x > SRV_JSON_INT_MAX)
            x = SRV_JSON_INT_MAX + 1;
        else if (x < -SRV_JSON_INT_MAX)
            x = -SRV_JSON_INT_MAX - 1;
        return exclusive ? (upper ? x - 1 : x + 1) : x;
    }
    double d = json_real_value(v);
    d = d > lim ? lim : d < -lim ? -lim : d;
    double i = upper ? floor(d) : ceil(d);
    if (exclusive && i == d)
        i += upper ? -1 : 1;
    return (long long)i;
}

lt_status srv_json_bounds(const json_t *s, const char *where, struct srv_json_bound out[4],
                          int *n)
{
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum"};
    *n = 0;
    for (int k = 0; k < 4; k++) {
        json_t *v = json_object_get(s, keys[k]);
        bool upper = k >= 2, excl = k % 2 == 1;
        if (!v || (excl && json_is_boolean(v)))
            continue;
        if (!json_is_number(v))
            return lt_fail(LT_ERR_INVALID, "json_schema: '%s' (at %s) must be a number%s",
                           keys[k], where, excl ? " (or a boolean, as in draft 4)" : "");
        if (!excl) /* draft 4: "exclusiveMinimum": true makes minimum exclusive */
            excl = json_is_true(json_object_get(s, keys[k + 1]));
        out[(*n)++] = (struct srv_json_bound){keys[k], v, upper, excl};
    }
    return LT_OK;
}

/* [*lo, *hi] from s's bounds (srv_json_bounds); *any: none is there. */
static lt_status sc_int_bounds(struct sc *c, const json_t *s, long long *lo, long long *hi,
                               bool *any)
{
    struct srv_json_bound bd[4];
    int n;
    lt_status st = srv_json_bounds(s, sc_where(c), bd, &n);
    if (st != LT_OK)
        return st;
    *lo = -SRV_JSON_INT_MAX;
    *hi = SRV_JSON_INT_MAX;
    *any = n > 0;
    for (int i = 0; i < n; i++) {
        long long b = sc_int_bound(bd[i].value, bd[i].upper, bd[i].excl);
        if (bd[i].upper && b < *hi)
            *hi = b;
        else if (!bd[i].upper && b > *lo)
            *lo = b;
    }
    if (*lo > SRV_JSON_INT_MAX || *hi < -SRV_JSON_INT_MAX)
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "json_schema: the bounds (at %s) allow only integers of more than 16 "
                       "digits, which lathe does not write",
                       sc_where(c));
    if (*lo > *hi)
        return lt_fail(LT_ERR_INVALID,
                       "json_schema: the bounds (at %s) allow no integer: the least is %lld, the "
                       "greatest %lld",
                       sc_where(c), *lo, *hi);
    return LT_OK;
}

static lt_status sc_integer(struct sc *c, const json_t *s, char *name)
{
    long long lo, hi;
    bool any;
    lt_status st = sc_int_bounds(c, s, &lo, &hi, &any);
    if (st != LT_OK)
        return st;
    if (!any) {
        snprintf(name, sizeof(sc_name), "%s", sc_base(c, SC_INTEGER));
        return LT_OK;
    }
    sc_new_name(c, name);
    st = srv_strbuf_appendf(c->out, "%s ::= ", name);
    if (st == LT_OK)
        st = srv_json_int_range_gbnf(lo, hi, c->out);
    return st != LT_OK ? st : lt_strbuf_append(c->out, "\n", 1);
}

/* The bound keyword in s, if any. */
static const char *sc_number_bound(const json_t *s)
{
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum",
                                       "exclusiveMaximum"};
    for (int k = 0; k < 4; k++)
        if (json_object_get(s, keys[k]))
            return keys[k];
    return NULL;
}

/* A number within s's bounds (there is one), in plain decimal form (json_schema_number.c). */
static lt_status sc_number(struct sc *c, const json_t *s, char *name)
{
    sc_name rule;
    sc_new_name(c, rule);
    lt_status st = srv_strbuf_appendf(c->out, "%s ::= ", rule);
    if (st == LT_OK)
        st = srv_json_number_range_gbnf(s, sc_where(c), c->out);
    if (st == LT_OK)
        st = lt_strbuf_append(c->out, "\n", 1);
    if (st == LT_OK)
        snprintf(name, sizeof(sc_name), "%s", rule);
    return st;
}

/* Any value, numbers within s's bounds: JSON Schema's bounds leave other types alone. */
static lt_status sc_bounded_value(struct sc *c, const json_t *s, char *name)
{
    sc_name num;
    lt_status st = sc_number(c, s, num);
    if (st != LT_OK)
        return st;
    char body[128];
    snprintf(body, sizeof(body), "%s | %s | %s | %s | %s | %s", sc_base(c, SC_OBJECT),
             sc_base(c, SC_ARRAY), sc_base(c, SC_STRING), num, sc_base(c, SC_BOOLEAN),
             sc_base(c, SC_NULL));
    sc_new_name(c, name);
    return sc_rule(c, name, body);
}

/* The schema as one type t (its other keywords apply to that type only). */
static lt_status sc_typed(struct sc *c, const json_t *s, const char *t, char *name)
{
    static const struct {
        const char *type;
        unsigned base;
    } plain[] = {{"number", SC_NUMBER}, {"boolean", SC_BOOLEAN}, {"null", SC_NULL}};
    if (!strcmp(t, "number") && sc_number_bound(s))
        return sc_number(c, s, name);
    if (!strcmp(t, "integer"))
        return sc_integer(c, s, name);
    if (!strcmp(t, "object"))
        return sc_object(c, s, name);
    if (!strcmp(t, "array"))
        return sc_array(c, s, name);
    if (!strcmp(t, "string"))
        return sc_string(c, s, name);
    for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++)
        if (!strcmp(t, plain[i].type)) {
            snprintf(name, sizeof(sc_name), "%s", sc_base(c, plain[i].base));
            return LT_OK;
        }
    return lt_fail(LT_ERR_INVALID, "json_schema: 'type' (at %s) is '%s', not a JSON Schema type",
                   sc_where(c), t);
}

/* Alternatives: anyOf/oneOf's schemas, or a list of types. oneOf is compiled as anyOf: that
 * exactly one branch matches is not enforced (a grammar of "this branch and not the others"
 * would need the complement of a context-free language), so an output may fit two
 * branches; the documentation and the keyword list say so. */
static lt_status sc_alternatives(struct sc *c, const json_t *s, const json_t *list, const char *key,
                                 char *name)
{
    if (!json_is_array(list) || json_array_size(list) == 0)
        return lt_fail(LT_ERR_INVALID, "json_schema: '%s' (at %s) must be a non-empty array", key,
                       sc_where(c));
    struct lt_strbuf body = {0};
    lt_status st = LT_OK;
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        sc_name alt;
        char seg[48];
        snprintf(seg, sizeof(seg), "%s/%zu", key, i);
        size_t len = sc_push(c, seg);
        if (!strcmp(key, "type"))
            st = json_is_string(v)
                     ? sc_typed(c, s, json_string_value(v), alt)
                     : lt_fail(LT_ERR_INVALID, "json_schema: 'type' (at %s) must hold strings",
                               sc_where(c));
        else
            st = sc_schema(c, v, alt);
        sc_pop(c, len);
        if (st == LT_OK)
            st = srv_strbuf_appendf(&body, "%s%s", i ? " | " : "", alt);
        if (st != LT_OK)
            break;
    }
    if (st == LT_OK) {
        sc_new_name(c, name);
        st = sc_rule(c, name, body.data);
    }
    lt_strbuf_free(&body);
    return st;
}

static lt_status sc_ref(struct sc *c, const json_t *ref, char *name)
{
    const char *r = json_string_value(ref);
    if (!r)
        return lt_fail(LT_ERR_INVALID, "json_schema: '$ref' (at %s) must be a string", sc_where(c));
    const json_t *target = NULL;
    if (!strcmp(r, "#"))
        target = c->root;
    else if (!strncmp(r, "#/$defs/", 8))
        target = json_object_get(json_object_get(c->root, "$defs"), r + 8);
    else if (!strncmp(r, "#/definitions/", 14))
        target = json_object_get(json_object_get(c->root, "definitions"), r + 14);
    else
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "json_schema: '$ref' '%s' (at %s) is not supported; only \"#\", "
                       "\"#/$defs/NAME\" and \"#/definitions/NAME\" are",
                       r, sc_where(c));
    if (!target)
        return lt_fail(LT_ERR_INVALID, "json_schema: '$ref' '%s' (at %s) names no definition", r,
                       sc_where(c));
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].target == target) {
            snprintf(name, sizeof(sc_name), "%s", c->refs[i].name);
            return LT_OK;
        }
    if (c->n_refs == SC_MAX_REFS)
        return lt_fail(LT_ERR_UNSUPPORTED, "json_schema: more than %d '$ref' targets", SC_MAX_REFS);
    sc_new_name(c, name);
    c->refs[c->n_refs].target = target;
    snprintf(c->refs[c->n_refs++].name, sizeof(sc_name), "%s", name);
    sc_name body;
    char saved[sizeof(c->path)];
    memcpy(saved, c->path, sizeof(saved));
    snprintf(c->path, sizeof(c->path), "%s", r + 1);
    lt_status st = sc_schema(c, target, body);
    memcpy(c->path, saved, sizeof(saved));
    return st != LT_OK ? st : sc_rule(c, name, body);
}

/* Keywords that constrain; with anyOf/oneOf or $ref beside them, a schema is refused. */
static const char *sc_sibling(const json_t *s, const char *except)
{
    static const char *const constraining[] = {
        "type",     "properties",       "required",         "additionalProperties",
        "items",    "prefixItems",      "minItems",         "maxItems",
        "pattern",  "minLength",        "maxLength",        "minimum",
        "maximum",  "exclusiveMinimum", "exclusiveMaximum", "enum",
        "const",    "anyOf",            "oneOf",            "$ref"};
    for (size_t i = 0; i < sizeof(constraining) / sizeof(constraining[0]); i++)
        if (strcmp(constraining[i], except) && json_object_get(s, constraining[i]))
            return constraining[i];
    return NULL;
}

static lt_status sc_schema(struct sc *c, const json_t *s, char *name)
{
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        snprintf(name, sizeof(sc_name), "%s", sc_base(c, SC_VALUE));
        return LT_OK;
    }
    if (!json_is_object(s))
        return lt_fail(LT_ERR_INVALID, "json_schema: the schema at %s must be an object%s",
                       sc_where(c), json_is_false(s) ? " (false allows nothing)" : "");
    if (c->depth >= SC_MAX_DEPTH)
        return lt_fail(LT_ERR_UNSUPPORTED, "json_schema: nested deeper than %d (at %s)",
                       SC_MAX_DEPTH, sc_where(c));
    lt_status st = sc_check_keywords(c, s);
    if (st != LT_OK)
        return st;
    c->depth++;
    const json_t *v, *t = json_object_get(s, "type");
    const char *key = NULL, *other = NULL;
    if ((v = json_object_get(s, (key = "$ref"))) || (v = json_object_get(s, (key = "anyOf"))) ||
        (v = json_object_get(s, (key = "oneOf"))))
        other = sc_sibling(s, key);
    if (other)
        st = lt_fail(LT_ERR_UNSUPPORTED,
                     "json_schema: '%s' beside '%s' (at %s) is not supported; move '%s' into "
                     "each branch",
                     key, other, sc_where(c), other);
    else if ((v = json_object_get(s, "$ref")))
        st = sc_ref(c, v, name);
    else if ((v = json_object_get(s, "anyOf")) || (v = json_object_get(s, "oneOf")))
        st = sc_alternatives(c, s, v, json_object_get(s, "anyOf") ? "anyOf" : "oneOf", name);
    else if ((v = json_object_get(s, "enum")))
        st = json_is_array(v) ? sc_values(c, v, "enum", name)
                              : lt_fail(LT_ERR_INVALID,
                                        "json_schema: 'enum' (at %s) must be an "
                                        "array",
                                        sc_where(c));
    else if ((v = json_object_get(s, "const"))) {
        json_t *one = json_pack("[O]", v);
        st = one ? sc_values(c, one, "const", name) : sc_nomem();
        json_decref(one);
    } else if (json_is_array(t))
        st = sc_alternatives(c, s, t, "type", name);
    else if (json_is_string(t))
        st = sc_typed(c, s, json_string_value(t), name);
    else if (t)
        st = lt_fail(LT_ERR_INVALID, "json_schema: 'type' (at %s) must be a string or an array",
                     sc_where(c));
    else if (json_object_get(s, "properties") || json_object_get(s, "required") ||
             json_object_get(s, "additionalProperties"))
        st = sc_object(c, s, name);
    else if (json_object_get(s, "items") || json_object_get(s, "prefixItems") ||
             json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
        st = sc_array(c, s, name);
    else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
             json_object_get(s, "pattern"))
        st = sc_string(c, s, name);
    else if (sc_number_bound(s))
        st = sc_bounded_value(c, s, name);
    else
        snprintf(name, sizeof(sc_name), "%s", sc_base(c, SC_VALUE));
    c->depth--;
    return st;
}

lt_status srv_json_schema_gbnf(const json_t *schema, struct lt_strbuf *out)
{
    struct sc *c = calloc(1, sizeof(*c));
    if (!c)
        return sc_nomem();
    c->root = schema;
    c->out = out;
    sc_name top;
    lt_status st = sc_schema(c, schema, top);
    if (st == LT_OK)
        st = srv_strbuf_appendf(out, "root ::= %s\n", top);
    if (st == LT_OK && c->oom)
        st = sc_nomem();
    free(c);
    return st;
}

lt_status srv_json_object_gbnf(struct lt_strbuf *out)
{
    struct sc c = {.out = out};
    lt_status st = srv_strbuf_appendf(out, "root ::= %s\n", sc_base(&c, SC_OBJECT));
    return st == LT_OK && c.oom ? sc_nomem() : st;
}
#endif
