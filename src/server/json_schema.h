/* json_schema.h (internal): JSON Schema to GBNF (include/lathe/grammar.h), for
 * response_format and llama.cpp's json_schema field.
 *
 * Supported: type (one or a list), object (properties, required, additionalProperties),
 * array (items, prefixItems, minItems, maxItems; uniqueItems only false), string
 * (minLength, maxLength, or pattern: a regular expression subset), number, integer
 * (minimum, maximum, exclusiveMinimum, exclusiveMaximum), boolean, null, enum, const,
 * anyOf, oneOf (as anyOf: exclusivity is not enforced, so an output may match several
 * branches), $ref to "#", "#/$defs/..." or "#/definitions/..." (recursion allowed).
 * Annotations (title, description, default, examples, $schema, $id, $comment, format) are
 * ignored; every other keyword is refused, so what is generated always validates (except
 * oneOf's exclusivity). Bounds are exact, on integers and on numbers alike; a bounded
 * number is written in plain decimal form, without an exponent.
 *
 * The output's layout: object properties in the schema's order, required ones always,
 * optional ones may be left out; no properties beyond the declared ones when an object
 * declares some; whitespace between tokens is a space or a newline and at most 20 spaces
 * or tabs, numbers have at most 16 digits before and after the point, so a model cannot
 * run on forever in the middle of a value. */
#ifndef LATHE_SERVER_JSON_SCHEMA_H
#define LATHE_SERVER_JSON_SCHEMA_H

#include <jansson.h>
#include <stdbool.h>

#include "lathe/status.h"
#include "lathe/tokenizer.h"

/* Appends the grammar of schema (true, or an object) to out. An unsupported keyword is
 * LT_ERR_UNSUPPORTED, a malformed schema LT_ERR_INVALID; the message names the keyword
 * and where it is ("/properties/age"). */
lt_status srv_json_schema_gbnf(const json_t *schema, struct lt_strbuf *out);
/* Appends the grammar of any JSON object (response_format json_object). */
lt_status srv_json_object_gbnf(struct lt_strbuf *out);

/* ---- for json_schema.c ---- */

/* The largest integer a schema's grammar writes: 16 digits, as the plain integer rule. */
#define SRV_JSON_INT_MAX 9999999999999999LL

/* One of a schema's bounds: minimum, exclusiveMinimum, maximum or exclusiveMaximum. */
struct srv_json_bound {
    const char *key;
    const json_t *value; /* a number */
    bool upper;          /* maximum or exclusiveMaximum */
    bool excl;           /* exclusive: its key, or draft 4's "exclusiveMinimum": true beside */
};
/* Schema s's bounds into out[0..*n) (at most 4): each a number (a boolean exclusive* key is
 * draft 4's flag, read into its partner); LT_ERR_INVALID names a bound that is not a number
 * and `where` it is (json_schema.c). */
lt_status srv_json_bounds(const json_t *s, const char *where, struct srv_json_bound out[4],
                          int *n);

/* Appends a parenthesised GBNF expression matching exactly the JSON spellings (no leading
 * zeros, no "-0") of the integers in [lo, hi]; -SRV_JSON_INT_MAX <= lo <= hi <=
 * SRV_JSON_INT_MAX (json_schema_range.c). */
lt_status srv_json_int_range_gbnf(long long lo, long long hi, struct lt_strbuf *out);

/* Appends a parenthesised GBNF expression matching exactly the plain-decimal JSON texts
 * (no exponent, at most 16 digits before and after the point) of the numbers within
 * schema s's minimum, maximum, exclusiveMinimum and exclusiveMaximum, at least one of
 * which is there; a malformed bound, or bounds that allow nothing, is LT_ERR_INVALID, a
 * bound with more than 32 decimal places LT_ERR_UNSUPPORTED; `where` goes into the
 * messages (json_schema_number.c). */
lt_status srv_json_number_range_gbnf(const json_t *s, const char *where, struct lt_strbuf *out);

/* Appends a parenthesised GBNF expression matching the inside (quotes excluded) of the
 * JSON strings whose value the ECMAScript regular expression `pattern` matches (a search,
 * as JSON Schema's pattern: unanchored ends match anything, written with the rule
 * `any_char`, one JSON string character). Only a subset is compiled: the rest is
 * LT_ERR_UNSUPPORTED naming the construct, a malformed pattern LT_ERR_INVALID; `where`
 * goes into the messages (json_schema_pattern.c). */
lt_status srv_json_pattern_gbnf(const char *pattern, size_t len, const char *any_char,
                                const char *where, struct lt_strbuf *out);

#endif
