/* gguf_lookup.c: looking things up in an opened GGUF file: keys, typed getters, arrays and
 * tensors. Everything here reads state validated at open (see gguf_impl.h), so lookups
 * only check what the caller asks for: that a key exists and has a type that converts
 * without loss to the one requested. */
#include <string.h>

#include "gguf/gguf_impl.h"

static const struct {
    const char *name;
    size_t size;
} gguf_types[LT_GGUF_TYPE_COUNT] = {
    [LT_GGUF_TYPE_U8] = {"u8", 1},     [LT_GGUF_TYPE_I8] = {"i8", 1},
    [LT_GGUF_TYPE_U16] = {"u16", 2},   [LT_GGUF_TYPE_I16] = {"i16", 2},
    [LT_GGUF_TYPE_U32] = {"u32", 4},   [LT_GGUF_TYPE_I32] = {"i32", 4},
    [LT_GGUF_TYPE_F32] = {"f32", 4},   [LT_GGUF_TYPE_BOOL] = {"bool", 1},
    [LT_GGUF_TYPE_STRING] = {"string", 0}, [LT_GGUF_TYPE_ARRAY] = {"array", 0},
    [LT_GGUF_TYPE_U64] = {"u64", 8},   [LT_GGUF_TYPE_I64] = {"i64", 8},
    [LT_GGUF_TYPE_F64] = {"f64", 8},
};

const char *lt_gguf_type_name(enum lt_gguf_type t)
{
    return (int)t >= 0 && t < LT_GGUF_TYPE_COUNT ? gguf_types[t].name : "?";
}

size_t lt_gguf_type_size(enum lt_gguf_type t)
{
    return (int)t >= 0 && t < LT_GGUF_TYPE_COUNT ? gguf_types[t].size : 0;
}

uint32_t lt_gguf_version(const struct lt_gguf *g) { return g->version; }
size_t lt_gguf_alignment(const struct lt_gguf *g) { return g->alignment; }
size_t lt_gguf_data_offset(const struct lt_gguf *g) { return g->data_offset; }
size_t lt_gguf_file_size(const struct lt_gguf *g) { return g->size; }

/* ---------------------------------------------------------------- keys */

int64_t lt_gguf_n_kv(const struct lt_gguf *g) { return g->n_kv; }

const char *lt_gguf_key(const struct lt_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? g->kv[i].key : NULL;
}

enum lt_gguf_type lt_gguf_kv_type(const struct lt_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? g->kv[i].value.type : LT_GGUF_TYPE_COUNT;
}

const struct lt_gguf_value *lt_gguf_kv_value(const struct lt_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? &g->kv[i].value : NULL;
}

int64_t lt_gguf_find_key(const struct lt_gguf *g, const char *key)
{
    int64_t lo = 0, hi = g->n_kv; /* binary search over kv_by_key */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->kv_by_key[mid]->key, key);
        if (c == 0)
            return g->kv_by_key[mid] - g->kv;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static lt_status find_value(const struct lt_gguf *g, const char *key,
                            const struct lt_gguf_value **v)
{
    int64_t i = lt_gguf_find_key(g, key);
    if (i < 0)
        return lt_fail(LT_ERR_FORMAT, "%s: missing key '%s'", g->origin, key);
    *v = &g->kv[i].value;
    return LT_OK;
}

static lt_status wrong_type(const struct lt_gguf *g, const char *key,
                            const struct lt_gguf_value *v, const char *want)
{
    return lt_fail(LT_ERR_FORMAT, "%s: key '%s' is %s, expected %s", g->origin, key,
                   lt_gguf_type_name(v->type), want);
}

static bool is_unsigned(enum lt_gguf_type t)
{
    return t == LT_GGUF_TYPE_U8 || t == LT_GGUF_TYPE_U16 || t == LT_GGUF_TYPE_U32 ||
           t == LT_GGUF_TYPE_U64;
}

static bool is_signed(enum lt_gguf_type t)
{
    return t == LT_GGUF_TYPE_I8 || t == LT_GGUF_TYPE_I16 || t == LT_GGUF_TYPE_I32 ||
           t == LT_GGUF_TYPE_I64;
}

/* Any integer value within [lo, hi], as a signed or unsigned 64-bit number. */
static lt_status get_integer(const struct lt_gguf *g, const char *key, const char *want,
                             int64_t lo, uint64_t hi, uint64_t *u, int64_t *s)
{
    const struct lt_gguf_value *v = NULL;
    lt_status st = find_value(g, key, &v);
    if (st)
        return st;
    if (is_unsigned(v->type)) {
        if (v->u64 > hi)
            return lt_fail(LT_ERR_FORMAT, "%s: key '%s' = %llu does not fit %s", g->origin, key,
                           (unsigned long long)v->u64, want);
        *u = v->u64;
        *s = (int64_t)v->u64;
        return LT_OK;
    }
    if (is_signed(v->type)) {
        if (v->i64 < lo || (v->i64 >= 0 && (uint64_t)v->i64 > hi))
            return lt_fail(LT_ERR_FORMAT, "%s: key '%s' = %lld does not fit %s", g->origin, key,
                           (long long)v->i64, want);
        *u = (uint64_t)v->i64;
        *s = v->i64;
        return LT_OK;
    }
    return wrong_type(g, key, v, want);
}

lt_status lt_gguf_get_u32(const struct lt_gguf *g, const char *key, uint32_t *out)
{
    uint64_t u = 0;
    int64_t s = 0;
    lt_status st = get_integer(g, key, "a u32", 0, UINT32_MAX, &u, &s);
    if (!st)
        *out = (uint32_t)u;
    return st;
}

lt_status lt_gguf_get_i32(const struct lt_gguf *g, const char *key, int32_t *out)
{
    uint64_t u = 0;
    int64_t s = 0;
    lt_status st = get_integer(g, key, "an i32", INT32_MIN, INT32_MAX, &u, &s);
    if (!st)
        *out = (int32_t)s;
    return st;
}

lt_status lt_gguf_get_u64(const struct lt_gguf *g, const char *key, uint64_t *out)
{
    uint64_t u = 0;
    int64_t s = 0;
    lt_status st = get_integer(g, key, "a u64", 0, UINT64_MAX, &u, &s);
    if (!st)
        *out = u;
    return st;
}

lt_status lt_gguf_get_i64(const struct lt_gguf *g, const char *key, int64_t *out)
{
    uint64_t u = 0;
    int64_t s = 0;
    lt_status st = get_integer(g, key, "an i64", INT64_MIN, INT64_MAX, &u, &s);
    if (!st)
        *out = s;
    return st;
}

lt_status lt_gguf_get_f64(const struct lt_gguf *g, const char *key, double *out)
{
    const struct lt_gguf_value *v = NULL;
    lt_status st = find_value(g, key, &v);
    if (st)
        return st;
    if (v->type != LT_GGUF_TYPE_F32 && v->type != LT_GGUF_TYPE_F64)
        return wrong_type(g, key, v, "f32 or f64");
    *out = v->f64;
    return LT_OK;
}

lt_status lt_gguf_get_f32(const struct lt_gguf *g, const char *key, float *out)
{
    double d = 0;
    lt_status st = lt_gguf_get_f64(g, key, &d);
    if (!st)
        *out = (float)d;
    return st;
}

lt_status lt_gguf_get_bool(const struct lt_gguf *g, const char *key, bool *out)
{
    const struct lt_gguf_value *v = NULL;
    lt_status st = find_value(g, key, &v);
    if (st)
        return st;
    if (v->type != LT_GGUF_TYPE_BOOL)
        return wrong_type(g, key, v, "bool");
    *out = v->b;
    return LT_OK;
}

lt_status lt_gguf_get_str(const struct lt_gguf *g, const char *key, const char **out)
{
    const struct lt_gguf_value *v = NULL;
    lt_status st = find_value(g, key, &v);
    if (st)
        return st;
    if (v->type != LT_GGUF_TYPE_STRING)
        return wrong_type(g, key, v, "string");
    *out = v->str.ptr;
    return LT_OK;
}

lt_status lt_gguf_get_arr(const struct lt_gguf *g, const char *key, enum lt_gguf_type elem,
                          const struct lt_gguf_value **out)
{
    const struct lt_gguf_value *v = NULL;
    lt_status st = find_value(g, key, &v);
    if (st)
        return st;
    if (v->type != LT_GGUF_TYPE_ARRAY)
        return wrong_type(g, key, v, "array");
    if (elem != LT_GGUF_TYPE_COUNT && v->arr.type != elem)
        return lt_fail(LT_ERR_FORMAT, "%s: key '%s' is an array of %s, expected an array of %s",
                       g->origin, key, lt_gguf_type_name(v->arr.type), lt_gguf_type_name(elem));
    *out = v;
    return LT_OK;
}

/* ---------------------------------------------------------------- arrays */

enum lt_gguf_type lt_gguf_arr_type(const struct lt_gguf_value *v)
{
    return v && v->type == LT_GGUF_TYPE_ARRAY ? v->arr.type : LT_GGUF_TYPE_COUNT;
}

uint64_t lt_gguf_arr_len(const struct lt_gguf_value *v)
{
    return v && v->type == LT_GGUF_TYPE_ARRAY ? v->arr.n : 0;
}

const void *lt_gguf_arr_data(const struct lt_gguf_value *v)
{
    if (!v || v->type != LT_GGUF_TYPE_ARRAY || lt_gguf_type_size(v->arr.type) == 0)
        return NULL;
    return v->arr.data;
}

const char *lt_gguf_arr_str(const struct lt_gguf_value *v, uint64_t i, uint64_t *len)
{
    if (!v || v->type != LT_GGUF_TYPE_ARRAY || v->arr.type != LT_GGUF_TYPE_STRING || i >= v->arr.n)
        return NULL;
    const struct lt_gguf_str *s = (const struct lt_gguf_str *)v->arr.data + i;
    if (len)
        *len = s->len;
    return s->ptr;
}

const struct lt_gguf_value *lt_gguf_arr_arr(const struct lt_gguf_value *v, uint64_t i)
{
    if (!v || v->type != LT_GGUF_TYPE_ARRAY || v->arr.type != LT_GGUF_TYPE_ARRAY || i >= v->arr.n)
        return NULL;
    return (const struct lt_gguf_value *)v->arr.data + i;
}

/* ---------------------------------------------------------------- tensors */

int64_t lt_gguf_n_tensors(const struct lt_gguf *g) { return g->n_tensors; }

const struct lt_gguf_tensor_info *lt_gguf_tensor(const struct lt_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

int64_t lt_gguf_find_tensor(const struct lt_gguf *g, const char *name)
{
    int64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->tensors_by_name[mid]->name, name);
        if (c == 0)
            return g->tensors_by_name[mid] - g->tensors;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}
