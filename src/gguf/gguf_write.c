/* gguf_write.c: building a GGUF (version 3) file and writing it atomically.
 *
 * Metadata is deep-copied into the writer as it is set; tensors are only described (their
 * bytes are referenced, or produced by a callback) until lt_gguf_writer_write. The file is
 * written to "PATH.tmp-XXXXXX" in the same directory, fsynced and renamed over PATH, so PATH
 * never holds a half-written file; on any failure the temporary file is unlinked.
 * Every tensor's data, the last one included, is padded to the alignment.
 *
 * A process killed while it writes cannot unlink its temporary file, so the writer holds an
 * exclusive flock on it for as long as it writes (the kernel drops the lock when the process
 * dies), and lt_gguf_remove_stale_temps removes only temporaries nobody holds: before a write
 * those of the same PATH, and the server those in its train dir when it starts. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lathe/gguf.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "lathe writes GGUF on little-endian hosts");

struct writer_kv {
    char *key;
    struct lt_gguf_value value; /* owns its strings and arrays */
};

struct writer_tensor {
    char name[LT_MAX_NAME];
    enum lt_type type;
    int n_dims;
    int64_t ne[LT_MAX_DIMS];
    size_t nbytes;
    const void *data;     /* referenced bytes, or NULL when fill is set */
    lt_gguf_fill_fn fill;
    void *user;
};

struct lt_gguf_writer {
    struct writer_kv *kv;
    int64_t n_kv, cap_kv;
    struct writer_tensor *tensors;
    int64_t n_tensors, cap_tensors;
};

/* ---------------------------------------------------------------- values */

static void value_free(struct lt_gguf_value *v)
{
    if (v->type == LT_GGUF_TYPE_STRING) {
        free((void *)v->str.ptr);
    } else if (v->type == LT_GGUF_TYPE_ARRAY) {
        if (v->arr.type == LT_GGUF_TYPE_STRING) {
            const struct lt_gguf_str *s = v->arr.data;
            for (uint64_t i = 0; i < v->arr.n; i++)
                free((void *)s[i].ptr);
        } else if (v->arr.type == LT_GGUF_TYPE_ARRAY) {
            struct lt_gguf_value *a = (struct lt_gguf_value *)v->arr.data;
            for (uint64_t i = 0; i < v->arr.n; i++)
                value_free(&a[i]);
        }
        free((void *)v->arr.data);
    }
    v->type = LT_GGUF_TYPE_U8;
    v->u64 = 0;
}

static lt_status str_clone(struct lt_gguf_str *dst, const struct lt_gguf_str *src, const char *key)
{
    if (!src->ptr && src->len)
        return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': NULL string of length %llu", key,
                       (unsigned long long)src->len);
    if (src->len >= SIZE_MAX)
        return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': string too long", key);
    char *p = malloc((size_t)src->len + 1);
    if (!p)
        return lt_fail(LT_ERR_NOMEM, "gguf writer: key '%s': out of memory", key);
    if (src->len)
        memcpy(p, src->ptr, (size_t)src->len);
    p[src->len] = '\0';
    dst->ptr = p;
    dst->len = src->len;
    return LT_OK;
}

/* Deep copy of src into dst (dst is overwritten, not freed). On failure dst is left
 * empty (a u8 0) with everything partially copied freed. */
static lt_status value_clone(struct lt_gguf_value *dst, const struct lt_gguf_value *src,
                             const char *key, int depth)
{
    lt_status st = LT_OK;
    dst->type = LT_GGUF_TYPE_U8;
    dst->u64 = 0;
    if ((int)src->type < 0 || src->type >= LT_GGUF_TYPE_COUNT)
        return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': unknown value type %d", key,
                       (int)src->type);
    if (src->type == LT_GGUF_TYPE_STRING) {
        if ((st = str_clone(&dst->str, &src->str, key)))
            return st;
        dst->type = LT_GGUF_TYPE_STRING;
        return LT_OK;
    }
    if (src->type != LT_GGUF_TYPE_ARRAY) {
        *dst = *src;
        if (src->type == LT_GGUF_TYPE_BOOL)
            dst->b = src->b != 0;
        return LT_OK;
    }

    enum lt_gguf_type et = src->arr.type;
    uint64_t n = src->arr.n;
    if (depth >= LT_GGUF_MAX_ARRAY_DEPTH)
        return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': arrays nested more than %d deep",
                       key, LT_GGUF_MAX_ARRAY_DEPTH);
    if ((int)et < 0 || et >= LT_GGUF_TYPE_COUNT)
        return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': unknown array element type %d",
                       key, (int)et);
    if (n && !src->arr.data)
        return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': NULL data for %llu elements", key,
                       (unsigned long long)n);
    size_t elem = et == LT_GGUF_TYPE_STRING  ? sizeof(struct lt_gguf_str)
                  : et == LT_GGUF_TYPE_ARRAY ? sizeof(struct lt_gguf_value)
                                             : lt_gguf_type_size(et);
    if (n > SIZE_MAX / elem)
        return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': %llu elements is too many", key,
                       (unsigned long long)n);
    void *data = NULL;
    if (n) {
        data = calloc((size_t)n, elem);
        if (!data)
            return lt_fail(LT_ERR_NOMEM, "gguf writer: key '%s': out of memory", key);
    }
    uint64_t done = 0;
    if (et == LT_GGUF_TYPE_STRING) {
        const struct lt_gguf_str *s = src->arr.data;
        struct lt_gguf_str *d = data;
        for (; done < n && !st; done++)
            st = str_clone(&d[done], &s[done], key);
        if (st) {
            for (uint64_t i = 0; i + 1 < done; i++)
                free((void *)d[i].ptr);
            goto out_free_data;
        }
    } else if (et == LT_GGUF_TYPE_ARRAY) {
        const struct lt_gguf_value *s = src->arr.data;
        struct lt_gguf_value *d = data;
        for (; done < n && !st; done++) {
            if (s[done].type != LT_GGUF_TYPE_ARRAY)
                st = lt_fail(LT_ERR_INVALID,
                             "gguf writer: key '%s': element %llu of an array of arrays is a %s",
                             key, (unsigned long long)done, lt_gguf_type_name(s[done].type));
            else
                st = value_clone(&d[done], &s[done], key, depth + 1);
        }
        if (st) {
            for (uint64_t i = 0; i + 1 < done; i++)
                value_free(&d[i]);
            goto out_free_data;
        }
    } else if (n) {
        memcpy(data, src->arr.data, (size_t)n * elem);
        if (et == LT_GGUF_TYPE_BOOL)
            for (uint64_t i = 0; i < n; i++)
                ((uint8_t *)data)[i] = ((uint8_t *)data)[i] != 0;
    }
    dst->type = LT_GGUF_TYPE_ARRAY;
    dst->arr.type = et;
    dst->arr.n = n;
    dst->arr.data = data;
    return LT_OK;

out_free_data:
    free(data);
    return st;
}

/* ---------------------------------------------------------------- writer */

struct lt_gguf_writer *lt_gguf_writer_new(void)
{
    struct lt_gguf_writer *w = calloc(1, sizeof(*w));
    if (!w)
        lt_fail(LT_ERR_NOMEM, "gguf writer: out of memory");
    return w;
}

void lt_gguf_writer_free(struct lt_gguf_writer *w)
{
    if (!w)
        return;
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        value_free(&w->kv[i].value);
    }
    free(w->kv);
    free(w->tensors);
    free(w);
}

int64_t lt_gguf_writer_n_kv(const struct lt_gguf_writer *w) { return w->n_kv; }

static int64_t writer_find_key(const struct lt_gguf_writer *w, const char *key)
{
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key))
            return i;
    return -1;
}

void lt_gguf_writer_remove(struct lt_gguf_writer *w, const char *key)
{
    int64_t i = writer_find_key(w, key);
    if (i < 0)
        return;
    free(w->kv[i].key);
    value_free(&w->kv[i].value);
    memmove(&w->kv[i], &w->kv[i + 1], (size_t)(w->n_kv - i - 1) * sizeof(*w->kv));
    w->n_kv--;
}

lt_status lt_gguf_writer_set_value(struct lt_gguf_writer *w, const char *key,
                                   const struct lt_gguf_value *v)
{
    if (!key)
        return lt_fail(LT_ERR_INVALID, "gguf writer: NULL key");
    if (!strcmp(key, "general.alignment")) {
        if (v->type != LT_GGUF_TYPE_U32)
            return lt_fail(LT_ERR_INVALID, "gguf writer: general.alignment must be a u32, not %s",
                           lt_gguf_type_name(v->type));
        if (v->u64 == 0 || (v->u64 & (v->u64 - 1)) != 0 || v->u64 > (1u << 30))
            return lt_fail(LT_ERR_INVALID,
                           "gguf writer: general.alignment %llu is not a power of two up to 2^30",
                           (unsigned long long)v->u64);
    }
    struct lt_gguf_value copy;
    lt_status st = value_clone(&copy, v, key, 0);
    if (st)
        return st;
    int64_t i = writer_find_key(w, key);
    if (i >= 0) {
        value_free(&w->kv[i].value);
        w->kv[i].value = copy;
        return LT_OK;
    }
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        struct writer_kv *kv = realloc(w->kv, (size_t)cap * sizeof(*kv));
        if (!kv)
            goto out_nomem;
        w->kv = kv;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k)
        goto out_nomem;
    w->kv[w->n_kv].key = k;
    w->kv[w->n_kv].value = copy;
    w->n_kv++;
    return LT_OK;

out_nomem:
    value_free(&copy);
    return lt_fail(LT_ERR_NOMEM, "gguf writer: key '%s': out of memory", key);
}

static lt_status set_unsigned(struct lt_gguf_writer *w, const char *key, enum lt_gguf_type t,
                              uint64_t x)
{
    struct lt_gguf_value v = {.type = t, .u64 = x};
    return lt_gguf_writer_set_value(w, key, &v);
}

static lt_status set_signed(struct lt_gguf_writer *w, const char *key, enum lt_gguf_type t,
                            int64_t x)
{
    struct lt_gguf_value v = {.type = t, .i64 = x};
    return lt_gguf_writer_set_value(w, key, &v);
}

lt_status lt_gguf_writer_set_u8(struct lt_gguf_writer *w, const char *key, uint8_t v)
{
    return set_unsigned(w, key, LT_GGUF_TYPE_U8, v);
}
lt_status lt_gguf_writer_set_u16(struct lt_gguf_writer *w, const char *key, uint16_t v)
{
    return set_unsigned(w, key, LT_GGUF_TYPE_U16, v);
}
lt_status lt_gguf_writer_set_u32(struct lt_gguf_writer *w, const char *key, uint32_t v)
{
    return set_unsigned(w, key, LT_GGUF_TYPE_U32, v);
}
lt_status lt_gguf_writer_set_u64(struct lt_gguf_writer *w, const char *key, uint64_t v)
{
    return set_unsigned(w, key, LT_GGUF_TYPE_U64, v);
}
lt_status lt_gguf_writer_set_i8(struct lt_gguf_writer *w, const char *key, int8_t v)
{
    return set_signed(w, key, LT_GGUF_TYPE_I8, v);
}
lt_status lt_gguf_writer_set_i16(struct lt_gguf_writer *w, const char *key, int16_t v)
{
    return set_signed(w, key, LT_GGUF_TYPE_I16, v);
}
lt_status lt_gguf_writer_set_i32(struct lt_gguf_writer *w, const char *key, int32_t v)
{
    return set_signed(w, key, LT_GGUF_TYPE_I32, v);
}
lt_status lt_gguf_writer_set_i64(struct lt_gguf_writer *w, const char *key, int64_t v)
{
    return set_signed(w, key, LT_GGUF_TYPE_I64, v);
}

lt_status lt_gguf_writer_set_f32(struct lt_gguf_writer *w, const char *key, float v)
{
    struct lt_gguf_value val = {.type = LT_GGUF_TYPE_F32, .f64 = v};
    return lt_gguf_writer_set_value(w, key, &val);
}

lt_status lt_gguf_writer_set_f64(struct lt_gguf_writer *w, const char *key, double v)
{
    struct lt_gguf_value val = {.type = LT_GGUF_TYPE_F64, .f64 = v};
    return lt_gguf_writer_set_value(w, key, &val);
}

lt_status lt_gguf_writer_set_bool(struct lt_gguf_writer *w, const char *key, bool v)
{
    struct lt_gguf_value val = {.type = LT_GGUF_TYPE_BOOL, .b = v};
    return lt_gguf_writer_set_value(w, key, &val);
}

lt_status lt_gguf_writer_set_strn(struct lt_gguf_writer *w, const char *key, const char *s,
                                  uint64_t len)
{
    struct lt_gguf_value val = {.type = LT_GGUF_TYPE_STRING, .str = {s, len}};
    return lt_gguf_writer_set_value(w, key, &val);
}

lt_status lt_gguf_writer_set_str(struct lt_gguf_writer *w, const char *key, const char *s)
{
    if (!s)
        return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': NULL string", key ? key : "?");
    return lt_gguf_writer_set_strn(w, key, s, strlen(s));
}

lt_status lt_gguf_writer_set_arr(struct lt_gguf_writer *w, const char *key,
                                 enum lt_gguf_type elem, const void *data, uint64_t n)
{
    if (lt_gguf_type_size(elem) == 0)
        return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': %s is not a numeric element type",
                       key ? key : "?", lt_gguf_type_name(elem));
    struct lt_gguf_value val = {.type = LT_GGUF_TYPE_ARRAY};
    val.arr.type = elem;
    val.arr.n = n;
    val.arr.data = data;
    return lt_gguf_writer_set_value(w, key, &val);
}

lt_status lt_gguf_writer_set_arr_str(struct lt_gguf_writer *w, const char *key,
                                     const char *const *strs, uint64_t n)
{
    if (n > SIZE_MAX / sizeof(struct lt_gguf_str))
        return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': too many strings", key ? key : "?");
    struct lt_gguf_str *s = n ? malloc((size_t)n * sizeof(*s)) : NULL;
    if (n && !s)
        return lt_fail(LT_ERR_NOMEM, "gguf writer: key '%s': out of memory", key ? key : "?");
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) {
            free(s);
            return lt_fail(LT_ERR_INVALID, "gguf writer: key '%s': string %llu is NULL",
                           key ? key : "?", (unsigned long long)i);
        }
        s[i].ptr = strs[i];
        s[i].len = strlen(strs[i]);
    }
    struct lt_gguf_value val = {.type = LT_GGUF_TYPE_ARRAY};
    val.arr.type = LT_GGUF_TYPE_STRING;
    val.arr.n = n;
    val.arr.data = s;
    lt_status st = lt_gguf_writer_set_value(w, key, &val);
    free(s);
    return st;
}

lt_status lt_gguf_writer_copy_kv(struct lt_gguf_writer *w, const struct lt_gguf *g)
{
    for (int64_t i = 0; i < lt_gguf_n_kv(g); i++) {
        lt_status st = lt_gguf_writer_set_value(w, lt_gguf_key(g, i), lt_gguf_kv_value(g, i));
        if (st)
            return st;
    }
    return LT_OK;
}

/* ---------------------------------------------------------------- tensors */

static lt_status add_tensor(struct lt_gguf_writer *w, const char *name, enum lt_type type,
                            int n_dims, const int64_t *ne, size_t nbytes,
                            struct writer_tensor *t)
{
    if (!name || !*name || strlen(name) >= LT_MAX_NAME)
        return lt_fail(LT_ERR_INVALID, "gguf writer: tensor name '%s' must be 1 to %d bytes",
                       name ? name : "(null)", LT_MAX_NAME - 1);
    const struct lt_type_traits *tt = lt_type_traits(type);
    if (!tt)
        return lt_fail(LT_ERR_INVALID, "gguf writer: tensor '%s': unknown type %d", name, (int)type);
    if (n_dims < 1 || n_dims > LT_MAX_DIMS)
        return lt_fail(LT_ERR_INVALID, "gguf writer: tensor '%s': %d dimensions (1 to %d)", name,
                       n_dims, LT_MAX_DIMS);
    for (int64_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name))
            return lt_fail(LT_ERR_INVALID, "gguf writer: tensor '%s' added twice", name);
    memset(t, 0, sizeof(*t));
    strcpy(t->name, name);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < LT_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    for (int d = 0; d < n_dims; d++)
        if (t->ne[d] < 0)
            return lt_fail(LT_ERR_INVALID, "gguf writer: tensor '%s': ne[%d] = %lld", name, d,
                           (long long)t->ne[d]);
    if (t->ne[0] % tt->block_size)
        return lt_fail(LT_ERR_INVALID,
                       "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of %s's block "
                       "size %lld",
                       name, (long long)t->ne[0], tt->name, (long long)tt->block_size);
    size_t want;
    if (__builtin_mul_overflow((size_t)(t->ne[0] / tt->block_size), tt->type_size, &want) ||
        __builtin_mul_overflow(want, (size_t)t->ne[1], &want) ||
        __builtin_mul_overflow(want, (size_t)t->ne[2], &want) ||
        __builtin_mul_overflow(want, (size_t)t->ne[3], &want))
        return lt_fail(LT_ERR_INVALID, "gguf writer: tensor '%s': byte size overflows", name);
    if (want != nbytes)
        return lt_fail(LT_ERR_INVALID,
                       "gguf writer: tensor '%s': %zu bytes given, a %lld x %lld x %lld x %lld "
                       "%s tensor takes %zu",
                       name, nbytes, (long long)t->ne[0], (long long)t->ne[1],
                       (long long)t->ne[2], (long long)t->ne[3], tt->name, want);
    t->nbytes = nbytes;
    if (w->n_tensors == w->cap_tensors) {
        int64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        struct writer_tensor *ts = realloc(w->tensors, (size_t)cap * sizeof(*ts));
        if (!ts)
            return lt_fail(LT_ERR_NOMEM, "gguf writer: tensor '%s': out of memory", name);
        w->tensors = ts;
        w->cap_tensors = cap;
    }
    return LT_OK;
}

lt_status lt_gguf_writer_add_tensor(struct lt_gguf_writer *w, const char *name, enum lt_type type,
                                    int n_dims, const int64_t *ne, const void *data,
                                    size_t nbytes)
{
    struct writer_tensor t;
    lt_status st = add_tensor(w, name, type, n_dims, ne, nbytes, &t);
    if (st)
        return st;
    if (!data && nbytes)
        return lt_fail(LT_ERR_INVALID, "gguf writer: tensor '%s': NULL data", name);
    t.data = data;
    w->tensors[w->n_tensors++] = t;
    return LT_OK;
}

lt_status lt_gguf_writer_add_tensor_fill(struct lt_gguf_writer *w, const char *name,
                                         enum lt_type type, int n_dims, const int64_t *ne,
                                         size_t nbytes, lt_gguf_fill_fn fill, void *user)
{
    struct writer_tensor t;
    if (!fill)
        return lt_fail(LT_ERR_INVALID, "gguf writer: tensor '%s': NULL fill function",
                       name ? name : "(null)");
    lt_status st = add_tensor(w, name, type, n_dims, ne, nbytes, &t);
    if (st)
        return st;
    t.fill = fill;
    t.user = user;
    w->tensors[w->n_tensors++] = t;
    return LT_OK;
}

/* ---------------------------------------------------------------- output */

/* A buffered file descriptor that remembers its first error. */
struct out {
    int fd;
    const char *path;
    lt_status st;
    uint64_t written;
    size_t len;
    unsigned char buf[1 << 16];
};

static void out_flush(struct out *o)
{
    size_t done = 0;
    while (!o->st && done < o->len) {
        ssize_t k = write(o->fd, o->buf + done, o->len - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            o->st = lt_fail(LT_ERR_IO, "%s: write failed: %s", o->path,
                            k < 0 ? strerror(errno) : "no progress");
        else
            done += (size_t)k;
    }
    o->len = 0;
}

static void out_bytes(struct out *o, const void *p, size_t n)
{
    const unsigned char *s = p;
    while (n && !o->st) {
        if (o->len == sizeof(o->buf))
            out_flush(o);
        size_t k = sizeof(o->buf) - o->len < n ? sizeof(o->buf) - o->len : n;
        memcpy(o->buf + o->len, s, k);
        o->len += k;
        s += k;
        n -= k;
        o->written += k;
    }
}

static void out_zeros(struct out *o, size_t n)
{
    static const unsigned char zeros[64];
    while (n && !o->st) {
        size_t k = n < sizeof(zeros) ? n : sizeof(zeros);
        out_bytes(o, zeros, k);
        n -= k;
    }
}

static void out_pad(struct out *o, size_t alignment)
{
    out_zeros(o, (size_t)((alignment - o->written % alignment) % alignment));
}

static void out_u32(struct out *o, uint32_t v) { out_bytes(o, &v, 4); }
static void out_u64(struct out *o, uint64_t v) { out_bytes(o, &v, 8); }

static void out_str(struct out *o, const char *s, uint64_t len)
{
    out_u64(o, len);
    out_bytes(o, s, (size_t)len);
}

static void out_value_body(struct out *o, const struct lt_gguf_value *v)
{
    switch (v->type) {
    case LT_GGUF_TYPE_U8: case LT_GGUF_TYPE_U16: case LT_GGUF_TYPE_U32: case LT_GGUF_TYPE_U64:
    case LT_GGUF_TYPE_I8: case LT_GGUF_TYPE_I16: case LT_GGUF_TYPE_I32: case LT_GGUF_TYPE_I64:
        /* little-endian: the low bytes of the 64-bit value are the narrow encoding */
        out_bytes(o, &v->u64, lt_gguf_type_size(v->type));
        break;
    case LT_GGUF_TYPE_F32: {
        float f = (float)v->f64;
        out_bytes(o, &f, 4);
        break;
    }
    case LT_GGUF_TYPE_F64: out_bytes(o, &v->f64, 8); break;
    case LT_GGUF_TYPE_BOOL: {
        uint8_t b = v->b ? 1 : 0;
        out_bytes(o, &b, 1);
        break;
    }
    case LT_GGUF_TYPE_STRING: out_str(o, v->str.ptr, v->str.len); break;
    case LT_GGUF_TYPE_ARRAY:
        out_u32(o, (uint32_t)v->arr.type);
        out_u64(o, v->arr.n);
        if (v->arr.type == LT_GGUF_TYPE_STRING) {
            const struct lt_gguf_str *s = v->arr.data;
            for (uint64_t i = 0; i < v->arr.n; i++)
                out_str(o, s[i].ptr, s[i].len);
        } else if (v->arr.type == LT_GGUF_TYPE_ARRAY) {
            const struct lt_gguf_value *a = v->arr.data;
            for (uint64_t i = 0; i < v->arr.n; i++)
                out_value_body(o, &a[i]);
        } else if (v->arr.n) {
            out_bytes(o, v->arr.data, (size_t)v->arr.n * lt_gguf_type_size(v->arr.type));
        }
        break;
    default: break; /* types were checked when set */
    }
}

static size_t writer_alignment(const struct lt_gguf_writer *w)
{
    int64_t i = writer_find_key(w, "general.alignment");
    return i < 0 ? LT_GGUF_DEFAULT_ALIGNMENT : (size_t)w->kv[i].value.u64;
}

static void out_file(struct out *o, const struct lt_gguf_writer *w)
{
    size_t alignment = writer_alignment(w);
    out_bytes(o, "GGUF", 4);
    out_u32(o, 3);
    out_u64(o, (uint64_t)w->n_tensors);
    out_u64(o, (uint64_t)w->n_kv);
    for (int64_t i = 0; i < w->n_kv; i++) {
        out_str(o, w->kv[i].key, strlen(w->kv[i].key));
        out_u32(o, (uint32_t)w->kv[i].value.type);
        out_value_body(o, &w->kv[i].value);
    }
    uint64_t offset = 0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const struct writer_tensor *t = &w->tensors[i];
        out_str(o, t->name, strlen(t->name));
        out_u32(o, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++)
            out_u64(o, (uint64_t)t->ne[d]);
        out_u32(o, (uint32_t)t->type);
        out_u64(o, offset);
        offset += (t->nbytes + alignment - 1) / alignment * alignment;
    }
    out_pad(o, alignment);
    for (int64_t i = 0; i < w->n_tensors && !o->st; i++) {
        const struct writer_tensor *t = &w->tensors[i];
        if (t->fill) {
            void *buf = malloc(t->nbytes ? t->nbytes : 1);
            if (!buf) {
                o->st = lt_fail(LT_ERR_NOMEM, "%s: tensor '%s': out of memory (%zu bytes)",
                                o->path, t->name, t->nbytes);
                break;
            }
            lt_status st = t->fill(t->user, buf, t->nbytes);
            if (st)
                o->st = st; /* the callback's message stands */
            else
                out_bytes(o, buf, t->nbytes);
            free(buf);
        } else {
            out_bytes(o, t->data, t->nbytes);
        }
        out_pad(o, alignment);
    }
    out_flush(o);
}

/* Best effort: makes the rename itself durable. */
static void sync_parent_dir(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

#define TEMP_TAG ".tmp-"
#define TEMP_TAG_LEN 5
#define TEMP_RANDOM_LEN 6 /* mkstemp's XXXXXX: letters and digits */

/* Creates "PATH.tmp-XXXXXX" beside path and locks it; *tmp (the caller frees it) names it.
 * A cleaner that found the file in the instant before the lock may have removed it: the
 * name is checked to still be this file once the lock is held, and made anew otherwise. */
static lt_status open_temp_beside(const char *path, char **tmp, int *fd)
{
    size_t n = strlen(path);
    *tmp = malloc(n + sizeof(".tmp-XXXXXX"));
    if (!*tmp)
        return lt_fail(LT_ERR_NOMEM, "%s: out of memory", path);
    for (int attempt = 0;; attempt++) {
        memcpy(*tmp, path, n);
        memcpy(*tmp + n, ".tmp-XXXXXX", sizeof(".tmp-XXXXXX"));
        *fd = mkstemp(*tmp);
        if (*fd < 0)
            return lt_fail(LT_ERR_IO, "%s: cannot create a temporary file next to it: %s", path,
                           strerror(errno));
        /* where flock is not supported, a cleaner cannot lock the file either and skips it */
        (void)flock(*fd, LOCK_EX);
        struct stat by_fd, by_name;
        if (fstat(*fd, &by_fd) != 0 || stat(*tmp, &by_name) != 0 ||
            by_fd.st_dev != by_name.st_dev || by_fd.st_ino != by_name.st_ino) {
            close(*fd);
            *fd = -1;
            if (attempt < 3)
                continue;
            return lt_fail(LT_ERR_IO, "%s: cannot hold a temporary file next to it", path);
        }
        return LT_OK;
    }
}

/* "NAME.tmp-XXXXXX": the length of NAME, or 0 when `entry` is not of that form. */
static size_t temp_target_len(const char *entry)
{
    size_t n = strlen(entry);
    if (n <= TEMP_TAG_LEN + TEMP_RANDOM_LEN)
        return 0;
    size_t stem = n - TEMP_TAG_LEN - TEMP_RANDOM_LEN;
    if (memcmp(entry + stem, TEMP_TAG, TEMP_TAG_LEN) != 0)
        return 0;
    for (size_t i = n - TEMP_RANDOM_LEN; i < n; i++) {
        char c = entry[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return 0;
    }
    return stem;
}

/* Removes dir/entry when it is a temporary file the writer left: a regular file of this
 * user's, empty or beginning with GGUF's magic, that no writer holds. */
static bool remove_if_stale(int dfd, const char *entry)
{
    int fd = openat(dfd, entry, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return false;
    bool removed = false;
    struct stat by_fd, by_name;
    char magic[4];
    if (fstat(fd, &by_fd) != 0 || !S_ISREG(by_fd.st_mode) || by_fd.st_uid != geteuid())
        goto out_close;
    if (by_fd.st_size != 0 &&
        (pread(fd, magic, sizeof(magic), 0) != (ssize_t)sizeof(magic) || memcmp(magic, "GGUF", 4)))
        goto out_close;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        goto out_close; /* a live writer's */
    /* still the file that was checked, not one renamed over the name meanwhile */
    if (fstatat(dfd, entry, &by_name, AT_SYMLINK_NOFOLLOW) == 0 && by_name.st_dev == by_fd.st_dev &&
        by_name.st_ino == by_fd.st_ino)
        removed = unlinkat(dfd, entry, 0) == 0;
out_close:
    close(fd); /* drops the lock */
    return removed;
}

static bool ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

lt_status lt_gguf_remove_stale_temps(const char *dir, const char *name, int *n_removed)
{
    if (n_removed)
        *n_removed = 0;
    DIR *d = opendir(dir);
    if (!d)
        return lt_fail(LT_ERR_IO, "%s: %s", dir, strerror(errno));
    size_t name_len = name ? strlen(name) : 0;
    for (struct dirent *e = readdir(d); e; e = readdir(d)) {
        size_t stem = temp_target_len(e->d_name);
        bool ours = stem > 0 && (name ? stem == name_len && !memcmp(e->d_name, name, stem)
                                      : ends_with(e->d_name, stem, ".gguf"));
        if (ours && remove_if_stale(dirfd(d), e->d_name) && n_removed)
            (*n_removed)++;
    }
    closedir(d);
    return LT_OK;
}

/* Best effort, before a write: the temporaries an earlier write of the same path left. */
static void remove_stale_temps_of(const char *path)
{
    char *copy_dir = strdup(path), *copy_base = strdup(path);
    if (copy_dir && copy_base)
        (void)lt_gguf_remove_stale_temps(dirname(copy_dir), basename(copy_base), NULL);
    free(copy_dir);
    free(copy_base);
}

lt_status lt_gguf_check_writable(const char *path)
{
    char *tmp = NULL;
    int fd = -1;
    remove_stale_temps_of(path);
    lt_status st = open_temp_beside(path, &tmp, &fd);
    if (st == LT_OK) {
        close(fd);
        unlink(tmp);
    }
    free(tmp);
    return st;
}

lt_status lt_gguf_writer_write(struct lt_gguf_writer *w, const char *path)
{
    char *tmp = NULL;
    int fd = -1;
    struct out *o = malloc(sizeof(*o));
    remove_stale_temps_of(path);
    lt_status st = o ? open_temp_beside(path, &tmp, &fd)
                     : lt_fail(LT_ERR_NOMEM, "%s: out of memory", path);
    if (st != LT_OK)
        goto out_free;
    fchmod(fd, 0644); /* mkstemp makes it 0600; a model file is not a secret */
    *o = (struct out){.fd = fd, .path = tmp, .st = LT_OK};
    out_file(o, w);
    st = o->st;
    if (!st && fsync(fd) != 0)
        st = lt_fail(LT_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !st)
        st = lt_fail(LT_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = lt_fail(LT_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    if (st)
        goto out_unlink_tmp;
    sync_parent_dir(path);
    free(o);
    free(tmp);
    return LT_OK;

out_unlink_tmp:
    unlink(tmp);
out_free:
    free(o);
    free(tmp);
    return st;
}
