/* json_schema.h (internal): JSON Schema to GBNF (include/lathe/grammar.h), for
 * response_format and llama.cpp's json_schema field.
 *
 * Supported: type (one or a list), object (properties, required, additionalProperties),
 * array (items, minItems, maxItems), string (minLength, maxLength), number, integer,
 * boolean, null, enum, const, anyOf, oneOf (as anyOf: the branches are not made
 * exclusive), $ref to "#", "#/$defs/..." or "#/definitions/..." (recursion allowed).
 * Annotations (title, description, default, examples, $schema, $id, $comment, format) are
 * ignored; every other keyword is refused, so what is generated always validates.
 *
 * The output's layout: object properties in the schema's order, required ones always,
 * optional ones may be left out; no properties beyond the declared ones when an object
 * declares some; whitespace between tokens is a space or a newline and at most 20 spaces
 * or tabs, numbers have at most 16 digits before and after the point, so a model cannot
 * run on forever in the middle of a value. */
#ifndef LATHE_SERVER_JSON_SCHEMA_H
#define LATHE_SERVER_JSON_SCHEMA_H

#include <jansson.h>

#include "lathe/status.h"
#include "lathe/tokenizer.h"

/* Appends the grammar of schema (true, or an object) to out. An unsupported keyword is
 * LT_ERR_UNSUPPORTED, a malformed schema LT_ERR_INVALID; the message names the keyword
 * and where it is ("/properties/age"). */
lt_status srv_json_schema_gbnf(const json_t *schema, struct lt_strbuf *out);
/* Appends the grammar of any JSON object (response_format json_object). */
lt_status srv_json_object_gbnf(struct lt_strbuf *out);

#endif
