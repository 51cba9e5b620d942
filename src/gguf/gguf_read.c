/* gguf_read.c: opening a GGUF file and validating every byte of its header.
 *
 * The parser reads through a cursor that never moves past the end of the file: each read
 * first checks the bytes are there, and each count (keys, tensors, array elements, string
 * lengths) is checked against the bytes that remain, times the smallest size one item can
 * take. Lists of items grow as items are actually parsed (struct vec), so memory follows
 * the metadata really present, never a count: a lying count fails at the first item that
 * is not there. A bad file fails with a message naming the byte offset and the field,
 * never with a crash. Assumes a little-endian host. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf_impl.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "lathe reads GGUF on little-endian hosts");

#define GGUF_MAGIC "GGUF"
/* the smallest encodings, for bounding counts by the bytes that remain */
#define MIN_KV_BYTES (8 + 4 + 1)                  /* empty key, type, one-byte value */
#define MIN_TENSOR_INFO_BYTES (8 + 4 + 8 + 4 + 8) /* empty name, n_dims, one ne, type, offset */
#define MIN_ARRAY_BYTES (4 + 8)                   /* element type, count */
#define MAX_ALIGNMENT (1u << 30)

/* ---------------------------------------------------------------- arena */

static void *arena_alloc(struct lt_gguf *g, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    struct gguf_arena_chunk *c = g->arena;
    if (!c || c->cap - c->used < size) {
        size_t cap = size > (64u << 10) ? size : (64u << 10);
        c = malloc(sizeof(*c) + cap);
        if (!c)
            return NULL;
        c->cap = cap;
        c->used = 0;
        /* a chunk made for one large request goes behind the current one, so the
         * current one's free space is still used by later small requests */
        if (g->arena && cap == size) {
            c->next = g->arena->next;
            g->arena->next = c;
        } else {
            c->next = g->arena;
            g->arena = c;
        }
    }
    void *p = c->mem + c->used;
    c->used += size;
    return p;
}

static void arena_free(struct lt_gguf *g)
{
    struct gguf_arena_chunk *c = g->arena;
    while (c) {
        struct gguf_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    g->arena = NULL;
}

/* A growing array for items being parsed. Memory follows the items actually read, never
 * a count read from the file: a count is only an upper bound that the remaining bytes were
 * checked against, and a file of tensor data behind a lying count must not make us allocate
 * gigabytes before the lie shows. */
struct vec {
    void *p;
    size_t n, cap, elem;
};

static void *vec_push(struct vec *v)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 16;
        void *p = realloc(v->p, cap * v->elem);
        if (!p)
            return NULL;
        v->p = p;
        v->cap = cap;
    }
    return (char *)v->p + v->n++ * v->elem;
}

/* Moves the items into the arena (so they live until close) and frees the vector. */
static void *vec_to_arena(struct lt_gguf *g, struct vec *v)
{
    void *p = arena_alloc(g, v->n * v->elem + 1);
    if (p && v->n)
        memcpy(p, v->p, v->n * v->elem);
    free(v->p);
    v->p = NULL;
    return p;
}

/* ---------------------------------------------------------------- cursor */

struct cursor {
    struct lt_gguf *g;
    size_t pos;
    char field[192]; /* what is being read, for messages: "key 'x'", "tensor 'y'" */
};

static lt_status bad_at(const struct cursor *c, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static lt_status bad_at(const struct cursor *c, size_t at, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return lt_fail(LT_ERR_FORMAT, "%s: offset %zu: %s: %s", c->g->origin, at, c->field, msg);
}

static lt_status no_memory(const struct cursor *c, size_t bytes)
{
    return lt_fail(LT_ERR_NOMEM, "%s: offset %zu: %s: out of memory (%zu bytes)", c->g->origin,
                   c->pos, c->field, bytes);
}

static size_t remaining(const struct cursor *c) { return c->g->size - c->pos; }

static lt_status read_bytes(struct cursor *c, void *dst, size_t n, const char *what)
{
    if (remaining(c) < n)
        return bad_at(c, c->pos, "%s: needs %zu bytes, the file ends after %zu", what, n,
                      remaining(c));
    memcpy(dst, c->g->base + c->pos, n);
    c->pos += n;
    return LT_OK;
}

static lt_status read_u32(struct cursor *c, uint32_t *v, const char *what)
{
    return read_bytes(c, v, 4, what);
}

static lt_status read_u64(struct cursor *c, uint64_t *v, const char *what)
{
    return read_bytes(c, v, 8, what);
}

/* A string: u64 length, then the bytes. Copied into the arena with a NUL after it. */
static lt_status read_string(struct cursor *c, struct lt_gguf_str *out, const char *what)
{
    size_t at = c->pos;
    uint64_t len;
    lt_status st = read_u64(c, &len, what);
    if (st)
        return st;
    if (len > remaining(c))
        return bad_at(c, at, "%s: length %llu runs past the end of the file (%zu bytes left)",
                      what, (unsigned long long)len, remaining(c));
    char *s = arena_alloc(c->g, (size_t)len + 1);
    if (!s)
        return no_memory(c, (size_t)len + 1);
    memcpy(s, c->g->base + c->pos, (size_t)len);
    s[len] = '\0';
    c->pos += (size_t)len;
    out->ptr = s;
    out->len = len;
    return LT_OK;
}

/* A name (key or tensor name): a string without NUL bytes inside. */
static lt_status read_name(struct cursor *c, const char **out, const char *what)
{
    size_t at = c->pos;
    struct lt_gguf_str s;
    lt_status st = read_string(c, &s, what);
    if (st)
        return st;
    if (strlen(s.ptr) != s.len)
        return bad_at(c, at, "%s contains a NUL byte", what);
    *out = s.ptr;
    return LT_OK;
}

/* ---------------------------------------------------------------- values */

static lt_status read_value(struct cursor *c, enum lt_gguf_type type, int depth,
                            struct lt_gguf_value *out);

static size_t min_elem_bytes(enum lt_gguf_type t)
{
    if (t == LT_GGUF_TYPE_STRING)
        return 8;
    if (t == LT_GGUF_TYPE_ARRAY)
        return MIN_ARRAY_BYTES;
    return lt_gguf_type_size(t);
}

static lt_status read_array(struct cursor *c, int depth, struct lt_gguf_value *out)
{
    size_t at = c->pos;
    uint32_t et;
    uint64_t n;
    lt_status st = LT_OK;
    if (depth > LT_GGUF_MAX_ARRAY_DEPTH)
        return bad_at(c, at, "arrays nested more than %d deep", LT_GGUF_MAX_ARRAY_DEPTH);
    if ((st = read_u32(c, &et, "array element type")))
        return st;
    if (et >= LT_GGUF_TYPE_COUNT)
        return bad_at(c, at, "unknown array element type %u", et);
    size_t count_at = c->pos;
    if ((st = read_u64(c, &n, "array length")))
        return st;
    size_t min = min_elem_bytes((enum lt_gguf_type)et);
    if (n > remaining(c) / min)
        return bad_at(c, count_at,
                      "array of %llu %s elements needs at least %llu bytes, the file has %zu left",
                      (unsigned long long)n, lt_gguf_type_name((enum lt_gguf_type)et),
                      (unsigned long long)n * min, remaining(c));
    out->type = LT_GGUF_TYPE_ARRAY;
    out->arr.type = (enum lt_gguf_type)et;
    out->arr.n = n;
    out->arr.data = NULL;
    if (n == 0)
        return LT_OK;

    if (et == LT_GGUF_TYPE_STRING || et == LT_GGUF_TYPE_ARRAY) {
        struct vec v = {.elem = et == LT_GGUF_TYPE_STRING ? sizeof(struct lt_gguf_str)
                                                          : sizeof(struct lt_gguf_value)};
        for (uint64_t i = 0; i < n; i++) {
            void *item = vec_push(&v);
            if (!item) {
                st = no_memory(c, v.cap * v.elem);
                break;
            }
            st = et == LT_GGUF_TYPE_STRING ? read_string(c, item, "array string")
                                           : read_array(c, depth + 1, item);
            if (st)
                break;
        }
        if (st) {
            free(v.p);
            return st;
        }
        out->arr.data = vec_to_arena(c->g, &v);
        return out->arr.data ? LT_OK : no_memory(c, (size_t)n * v.elem);
    }

    switch ((enum lt_gguf_type)et) {
    default: {
        size_t bytes = (size_t)n * min;
        uint8_t *data = arena_alloc(c->g, bytes);
        if (!data)
            return no_memory(c, bytes);
        memcpy(data, c->g->base + c->pos, bytes);
        c->pos += bytes;
        if (et == LT_GGUF_TYPE_BOOL)
            for (size_t i = 0; i < bytes; i++)
                data[i] = data[i] != 0;
        out->arr.data = data;
        return LT_OK;
    }
    }
}

static lt_status read_value(struct cursor *c, enum lt_gguf_type type, int depth,
                            struct lt_gguf_value *out)
{
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        uint64_t u64;
        int64_t i64;
        double f64;
    } raw;
    lt_status st;
    out->type = type;
    if (type == LT_GGUF_TYPE_STRING)
        return read_string(c, &out->str, "string value");
    if (type == LT_GGUF_TYPE_ARRAY)
        return read_array(c, depth + 1, out);
    if ((st = read_bytes(c, &raw, lt_gguf_type_size(type), "value")))
        return st;
    switch (type) {
    case LT_GGUF_TYPE_U8: out->u64 = raw.u8; break;
    case LT_GGUF_TYPE_I8: out->i64 = raw.i8; break;
    case LT_GGUF_TYPE_U16: out->u64 = raw.u16; break;
    case LT_GGUF_TYPE_I16: out->i64 = raw.i16; break;
    case LT_GGUF_TYPE_U32: out->u64 = raw.u32; break;
    case LT_GGUF_TYPE_I32: out->i64 = raw.i32; break;
    case LT_GGUF_TYPE_F32: out->f64 = raw.f32; break;
    case LT_GGUF_TYPE_BOOL: out->b = raw.u8 != 0; break;
    case LT_GGUF_TYPE_U64: out->u64 = raw.u64; break;
    case LT_GGUF_TYPE_I64: out->i64 = raw.i64; break;
    case LT_GGUF_TYPE_F64: out->f64 = raw.f64; break;
    default: break; /* string and array handled above; unknown types refused by callers */
    }
    return LT_OK;
}

/* ---------------------------------------------------------------- sections */

static int cmp_kv_key(const void *a, const void *b)
{
    const struct gguf_kv *x = *(const struct gguf_kv *const *)a;
    const struct gguf_kv *y = *(const struct gguf_kv *const *)b;
    return strcmp(x->key, y->key);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const struct lt_gguf_tensor_info *x = *(const struct lt_gguf_tensor_info *const *)a;
    const struct lt_gguf_tensor_info *y = *(const struct lt_gguf_tensor_info *const *)b;
    return strcmp(x->name, y->name);
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    const struct lt_gguf_tensor_info *x = *(const struct lt_gguf_tensor_info *const *)a;
    const struct lt_gguf_tensor_info *y = *(const struct lt_gguf_tensor_info *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : 0;
}

static lt_status read_header(struct cursor *c, uint64_t *n_tensors, uint64_t *n_kv)
{
    struct lt_gguf *g = c->g;
    char magic[4];
    lt_status st;
    snprintf(c->field, sizeof(c->field), "header");
    if ((st = read_bytes(c, magic, 4, "magic")))
        return st;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0)
        return bad_at(c, 0, "bad magic %02x %02x %02x %02x (a GGUF file starts with \"GGUF\")",
                      (uint8_t)magic[0], (uint8_t)magic[1], (uint8_t)magic[2], (uint8_t)magic[3]);
    if ((st = read_u32(c, &g->version, "version")))
        return st;
    if (g->version != 2 && g->version != 3) {
        if (g->version == 1)
            return bad_at(c, 4, "version 1 is not supported (only 2 and 3)");
        if ((g->version & 0xffff) == 0)
            return bad_at(c, 4, "version %u: a big-endian file? (only little-endian 2 and 3)",
                          g->version);
        return bad_at(c, 4, "unsupported version %u (only 2 and 3)", g->version);
    }
    if ((st = read_u64(c, n_tensors, "tensor count")) || (st = read_u64(c, n_kv, "key count")))
        return st;
    /* Both sections must fit in what remains; each entry takes a known minimum. */
    if (*n_kv > remaining(c) / MIN_KV_BYTES)
        return bad_at(c, 16, "%llu keys cannot fit in the %zu bytes that follow",
                      (unsigned long long)*n_kv, remaining(c));
    if (*n_tensors > remaining(c) / MIN_TENSOR_INFO_BYTES)
        return bad_at(c, 8, "%llu tensor infos cannot fit in the %zu bytes that follow",
                      (unsigned long long)*n_tensors, remaining(c));
    if (*n_kv * MIN_KV_BYTES + *n_tensors * MIN_TENSOR_INFO_BYTES > remaining(c))
        return bad_at(c, 8, "%llu tensor infos and %llu keys cannot fit in the %zu bytes that follow",
                      (unsigned long long)*n_tensors, (unsigned long long)*n_kv, remaining(c));
    return LT_OK;
}

static lt_status read_kvs(struct cursor *c, uint64_t n_kv)
{
    struct lt_gguf *g = c->g;
    lt_status st = LT_OK;
    struct vec kvs = {.elem = sizeof(struct gguf_kv)};
    for (uint64_t i = 0; i < n_kv; i++) {
        struct gguf_kv *kv = vec_push(&kvs);
        if (!kv) {
            st = no_memory(c, kvs.cap * kvs.elem);
            goto out_free_kvs;
        }
        snprintf(c->field, sizeof(c->field), "key %llu", (unsigned long long)i);
        kv->key_at = c->pos;
        if ((st = read_name(c, &kv->key, "key name")))
            goto out_free_kvs;
        snprintf(c->field, sizeof(c->field), "key '%.120s'", kv->key);
        size_t type_at = c->pos;
        uint32_t type;
        if ((st = read_u32(c, &type, "value type")))
            goto out_free_kvs;
        if (type >= LT_GGUF_TYPE_COUNT) {
            st = bad_at(c, type_at, "unknown value type %u", type);
            goto out_free_kvs;
        }
        kv->value_at = c->pos;
        if ((st = read_value(c, (enum lt_gguf_type)type, 0, &kv->value)))
            goto out_free_kvs;
    }
    g->kv = vec_to_arena(g, &kvs);
    g->kv_by_key = arena_alloc(g, (size_t)n_kv * sizeof(*g->kv_by_key) + 1);
    if (!g->kv || !g->kv_by_key)
        return no_memory(c, (size_t)n_kv * sizeof(*g->kv));
    g->n_kv = (int64_t)n_kv;
    for (uint64_t i = 0; i < n_kv; i++)
        g->kv_by_key[i] = &g->kv[i];
    qsort(g->kv_by_key, (size_t)n_kv, sizeof(*g->kv_by_key), cmp_kv_key);
    for (uint64_t i = 1; i < n_kv; i++) {
        const struct gguf_kv *a = g->kv_by_key[i - 1], *b = g->kv_by_key[i];
        if (!strcmp(a->key, b->key)) {
            snprintf(c->field, sizeof(c->field), "key '%.120s'", b->key);
            return bad_at(c, a->key_at > b->key_at ? a->key_at : b->key_at,
                          "appears more than once");
        }
    }
    return LT_OK;

out_free_kvs:
    free(kvs.p);
    return st;
}

static lt_status read_alignment(struct cursor *c)
{
    struct lt_gguf *g = c->g;
    g->alignment = LT_GGUF_DEFAULT_ALIGNMENT;
    int64_t i = lt_gguf_find_key(g, "general.alignment");
    if (i < 0)
        return LT_OK;
    const struct lt_gguf_value *v = &g->kv[i].value;
    size_t at = g->kv[i].value_at;
    snprintf(c->field, sizeof(c->field), "key 'general.alignment'");
    if (v->type != LT_GGUF_TYPE_U32)
        return bad_at(c, at, "must be a u32, not %s", lt_gguf_type_name(v->type));
    if (v->u64 == 0 || (v->u64 & (v->u64 - 1)) != 0 || v->u64 > MAX_ALIGNMENT)
        return bad_at(c, at, "%llu is not a power of two up to %u", (unsigned long long)v->u64,
                      MAX_ALIGNMENT);
    g->alignment = (size_t)v->u64;
    return LT_OK;
}

/* Where a tensor's info sits in the file, for messages. */
struct info_at {
    size_t name, offset;
};

static lt_status read_tensor_info(struct cursor *c, struct lt_gguf_tensor_info *t,
                                  uint64_t index, struct info_at *where)
{
    lt_status st;
    size_t at = c->pos;
    where->name = at;
    snprintf(c->field, sizeof(c->field), "tensor %llu", (unsigned long long)index);
    if ((st = read_name(c, &t->name, "tensor name")))
        return st;
    snprintf(c->field, sizeof(c->field), "tensor '%.120s'", t->name);
    if (strlen(t->name) >= LT_MAX_NAME)
        return bad_at(c, at, "name is %zu bytes long (at most %d)", strlen(t->name),
                      LT_MAX_NAME - 1);
    at = c->pos;
    uint32_t n_dims;
    if ((st = read_u32(c, &n_dims, "dimension count")))
        return st;
    if (n_dims < 1 || n_dims > LT_MAX_DIMS)
        return bad_at(c, at, "%u dimensions (must be 1 to %d)", n_dims, LT_MAX_DIMS);
    t->n_dims = (int)n_dims;
    for (int d = 0; d < LT_MAX_DIMS; d++)
        t->ne[d] = 1;
    int64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        at = c->pos;
        uint64_t ne;
        if ((st = read_u64(c, &ne, "dimension")))
            return st;
        if (ne > (uint64_t)INT64_MAX)
            return bad_at(c, at, "ne[%u] = %lld is negative", d, (long long)(int64_t)ne);
        t->ne[d] = (int64_t)ne;
        /* zero dims count as 1, so no partial product (ne1*ne2*ne3, say) overflows either */
        if (__builtin_mul_overflow(n_el, ne ? t->ne[d] : 1, &n_el))
            return bad_at(c, at, "the element count overflows at ne[%u] = %lld", d,
                          (long long)t->ne[d]);
    }
    at = c->pos;
    uint32_t type;
    if ((st = read_u32(c, &type, "tensor type")))
        return st;
    if (!lt_type_valid((int)type))
        return bad_at(c, at, "unknown tensor type %u", type);
    t->type = (enum lt_type)type;
    const struct lt_type_traits *tt = lt_type_traits(t->type);
    if (t->ne[0] % tt->block_size != 0)
        return bad_at(c, at, "ne[0] = %lld is not a multiple of %s's block size %lld",
                      (long long)t->ne[0], tt->name, (long long)tt->block_size);
    size_t row = (size_t)(t->ne[0] / tt->block_size);
    size_t nbytes;
    if (__builtin_mul_overflow(row, tt->type_size, &nbytes) ||
        __builtin_mul_overflow(nbytes, (size_t)t->ne[1], &nbytes) ||
        __builtin_mul_overflow(nbytes, (size_t)t->ne[2], &nbytes) ||
        __builtin_mul_overflow(nbytes, (size_t)t->ne[3], &nbytes))
        return bad_at(c, at, "the byte size of %lld x %lld x %lld x %lld %s overflows",
                      (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                      (long long)t->ne[3], tt->name);
    t->nbytes = nbytes;
    where->offset = c->pos;
    return read_u64(c, &t->offset, "data offset");
}

/* Each tensor's data: aligned, inside the file, overlapping no other. */
static lt_status place_tensors(struct cursor *c, const struct info_at *where)
{
    struct lt_gguf *g = c->g;
    size_t n = (size_t)g->n_tensors;
    for (size_t i = 0; i < n; i++) {
        struct lt_gguf_tensor_info *t = &g->tensors[i];
        snprintf(c->field, sizeof(c->field), "tensor '%.120s'", t->name);
        if (t->offset % g->alignment != 0)
            return bad_at(c, where[i].offset, "data offset %llu is not a multiple of the alignment %zu",
                          (unsigned long long)t->offset, g->alignment);
        /* even a tensor of 0 bytes must point inside the file */
        size_t avail = g->size >= g->data_offset ? g->size - g->data_offset : 0;
        if (g->data_offset > g->size || t->offset > avail || t->nbytes > avail - t->offset)
            return bad_at(c, where[i].offset,
                          "data ends past the end of the file (data section at %zu + offset "
                          "%llu + %zu bytes > file size %zu)",
                          g->data_offset, (unsigned long long)t->offset, t->nbytes, g->size);
        t->data = g->base + g->data_offset + t->offset;
    }

    const struct lt_gguf_tensor_info **by_offset = malloc(n * sizeof(*by_offset) + 1);
    if (!by_offset)
        return no_memory(c, n * sizeof(*by_offset));
    for (size_t i = 0; i < n; i++)
        by_offset[i] = &g->tensors[i];
    qsort(by_offset, n, sizeof(*by_offset), cmp_tensor_offset);
    lt_status st = LT_OK;
    const struct lt_gguf_tensor_info *last = NULL; /* the one reaching furthest so far */
    for (size_t i = 0; i < n && !st; i++) {
        const struct lt_gguf_tensor_info *t = by_offset[i];
        if (t->nbytes == 0)
            continue;
        if (last && t->offset < last->offset + last->nbytes) {
            snprintf(c->field, sizeof(c->field), "tensor '%.120s'", t->name);
            st = bad_at(c, where[t - g->tensors].offset,
                        "data [%llu, %llu) overlaps tensor '%s' [%llu, %llu)",
                        (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes),
                        last->name, (unsigned long long)last->offset,
                        (unsigned long long)(last->offset + last->nbytes));
        }
        if (!last || t->offset + t->nbytes > last->offset + last->nbytes)
            last = t;
    }
    free(by_offset);
    return st;
}

static lt_status read_tensors(struct cursor *c, uint64_t n_tensors)
{
    struct lt_gguf *g = c->g;
    lt_status st = LT_OK;
    struct vec infos = {.elem = sizeof(struct lt_gguf_tensor_info)};
    struct vec where = {.elem = sizeof(struct info_at)};
    for (uint64_t i = 0; i < n_tensors; i++) {
        struct lt_gguf_tensor_info *t = vec_push(&infos);
        struct info_at *at = vec_push(&where);
        if (!t || !at) {
            st = no_memory(c, infos.cap * infos.elem);
            goto out_free_vecs;
        }
        if ((st = read_tensor_info(c, t, i, at)))
            goto out_free_vecs;
    }
    g->tensors = vec_to_arena(g, &infos);
    g->tensors_by_name = arena_alloc(g, (size_t)n_tensors * sizeof(*g->tensors_by_name) + 1);
    if (!g->tensors || !g->tensors_by_name) {
        st = no_memory(c, (size_t)n_tensors * sizeof(*g->tensors));
        goto out_free_vecs;
    }
    g->n_tensors = (int64_t)n_tensors;
    const struct info_at *w = where.p;
    for (uint64_t i = 0; i < n_tensors; i++)
        g->tensors_by_name[i] = &g->tensors[i];
    qsort(g->tensors_by_name, (size_t)n_tensors, sizeof(*g->tensors_by_name), cmp_tensor_name);
    for (uint64_t i = 1; i < n_tensors; i++) {
        const struct lt_gguf_tensor_info *a = g->tensors_by_name[i - 1], *b = g->tensors_by_name[i];
        if (!strcmp(a->name, b->name)) {
            size_t at_a = w[a - g->tensors].name, at_b = w[b - g->tensors].name;
            snprintf(c->field, sizeof(c->field), "tensor '%.120s'", b->name);
            st = bad_at(c, at_a > at_b ? at_a : at_b, "the name appears more than once");
            goto out_free_vecs;
        }
    }

    size_t pad = (g->alignment - c->pos % g->alignment) % g->alignment;
    g->data_offset = c->pos + pad; /* may pass the end when there is no tensor data */
    st = place_tensors(c, w);
out_free_vecs:
    free(infos.p); /* NULL once moved into the arena */
    free(where.p);
    return st;
}

/* ---------------------------------------------------------------- open and close */

static lt_status gguf_parse(struct lt_gguf *g)
{
    struct cursor c = {.g = g, .pos = 0};
    uint64_t n_tensors, n_kv;
    lt_status st;
    if ((st = read_header(&c, &n_tensors, &n_kv)))
        return st;
    if ((st = read_kvs(&c, n_kv)))
        return st;
    if ((st = read_alignment(&c)))
        return st;
    return read_tensors(&c, n_tensors);
}

static lt_status gguf_new(const char *origin, struct lt_gguf **out)
{
    struct lt_gguf *g = calloc(1, sizeof(*g));
    char *o = strdup(origin);
    if (!g || !o) {
        free(g);
        free(o);
        return lt_fail(LT_ERR_NOMEM, "%s: out of memory", origin);
    }
    g->origin = o;
    *out = g;
    return LT_OK;
}

lt_status lt_gguf_open_memory(const void *data, size_t size, struct lt_gguf **out)
{
    struct lt_gguf *g;
    *out = NULL;
    lt_status st = gguf_new("<memory>", &g);
    if (st)
        return st;
    g->base = data;
    g->size = data ? size : 0;
    if ((st = gguf_parse(g))) {
        lt_gguf_close(g);
        return st;
    }
    *out = g;
    return LT_OK;
}

lt_status lt_gguf_open(const char *path, struct lt_gguf **out)
{
    struct lt_gguf *g;
    struct stat sb;
    *out = NULL;
    lt_status st = gguf_new(path, &g);
    if (st)
        return st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = lt_fail(LT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto out_free_reader;
    }
    if (fstat(fd, &sb) != 0) {
        st = lt_fail(LT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto out_close_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = lt_fail(LT_ERR_IO, "%s: not a regular file", path);
        goto out_close_fd;
    }
    g->size = (size_t)sb.st_size;
    if (g->size > 0) {
        void *p = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            st = lt_fail(LT_ERR_IO, "%s: cannot map %zu bytes: %s", path, g->size,
                         strerror(errno));
            goto out_close_fd;
        }
        g->base = p;
        g->mapped = true;
    }
    close(fd);
    if ((st = gguf_parse(g)))
        goto out_free_reader;
    *out = g;
    return LT_OK;

out_close_fd:
    close(fd);
out_free_reader:
    lt_gguf_close(g);
    return st;
}

void lt_gguf_close(struct lt_gguf *g)
{
    if (!g)
        return;
    if (g->mapped)
        munmap((void *)g->base, g->size);
    arena_free(g);
    free(g->origin);
    free(g);
}
