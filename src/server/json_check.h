/* json_check.h: request bodies: parsing, and checking an object against a table of the
 * fields it may have (type, numeric range, required).
 *
 * Checks run before a route reads anything, so the getters below may assume the types the
 * table allowed. A failure is reported through srv_fail with the field's full name as param
 * ("temperature", "messages[2].content") and a code: invalid_json, body_too_large,
 * missing_body, unknown_field, invalid_type, out_of_range, missing_field. */
#ifndef LATHE_SERVER_JSON_CHECK_H
#define LATHE_SERVER_JSON_CHECK_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "server/server_impl.h"

enum srv_json_type {
    SRV_JT_STRING = 1u << 0,
    SRV_JT_INT = 1u << 1,    /* an integer (a real with an integral value passes too) */
    SRV_JT_NUMBER = 1u << 2, /* integer or real */
    SRV_JT_BOOL = 1u << 3,
    SRV_JT_ARRAY = 1u << 4,
    SRV_JT_OBJECT = 1u << 5,
    SRV_JT_NULL = 1u << 6,   /* null counts as absent */
};

struct srv_field {
    const char *name;
    unsigned types; /* enum srv_json_type bits */
    double min, max; /* numeric range, inclusive; 0, 0: none */
    bool required;
};

/* Parses the body as a JSON object (duplicate keys refused). 200 or an error status. */
int srv_parse_body(const struct srv_request *rq, json_t **out);

/* Checks obj against fields[0..n). `where` prefixes field names in messages ("" at the top
 * level, else e.g. "messages[2]"). 200 or 400 (srv_fail). */
int srv_check_object(const json_t *obj, const char *where, const struct srv_field *fields,
                     size_t n);

/* Checks v (named `name`) has one of `types` and, when numeric and the range is not 0, 0,
 * lies in [min, max]. 200 or 400. */
int srv_check_value(const json_t *v, const char *name, unsigned types, double min, double max);

/* A name for messages: where + "." + key (or key alone). */
void srv_field_name(char *buf, size_t size, const char *where, const char *key);

/* Getters (absent or null: the default). */
const char *srv_json_str(const json_t *obj, const char *key, const char *dflt);
double srv_json_num(const json_t *obj, const char *key, double dflt);
long long srv_json_int(const json_t *obj, const char *key, long long dflt);
bool srv_json_bool(const json_t *obj, const char *key, bool dflt);
/* The value, or NULL when absent or null. */
json_t *srv_json_get(const json_t *obj, const char *key);
/* A number from a JSON value already checked numeric. */
double srv_json_value_num(const json_t *v);

#endif
