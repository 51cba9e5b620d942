/* fuzz_safetensors.c: libFuzzer target for the safetensors reader (lt_st_file_open_memory).
 *
 * Any input must either be refused with LT_ERR_FORMAT (and a message, *out left NULL) or
 * open. An opened file is checked against the format's promises, recomputed here from the
 * raw bytes rather than taken from the reader: every tensor's byte range lies in the data
 * section, the ranges tile it exactly, sizes agree with dtype and shape, names are found by
 * lookup, the metadata is the header's "__metadata__" object (parsed again here with
 * jansson), and lt_st_tensor_read_f32 agrees with a plain per-dtype decoder written below.
 * The input is copied into a buffer of exactly its size so ASan sees any over-read. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "convert/safetensors.h"

#ifdef LATHE_HAVE_JANSSON
#include <jansson.h>
#endif

static char not_null; /* a non-NULL *out the reader must reset on failure */

struct span {
    uint64_t begin, end;
};

static int cmp_span(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    /* by start, then end, so an empty range sorts before a range starting where it does */
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end ? 1 : 0;
}

/* IEEE half to float, by the definition (no bit tricks shared with the reader). */
static float ref_f16(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
    float v;
    if (exp == 0)
        v = ldexpf((float)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexpf((float)(mant + 1024), exp - 25);
    return sign ? -v : v;
}

static float ref_bf16(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

static float ref_elem(const struct lt_st_tensor *t, int64_t i)
{
    const uint8_t *p = (const uint8_t *)t->data;
    switch (t->dtype) {
    case LT_ST_F32: {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case LT_ST_F16: {
        uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
        return ref_f16(h);
    }
    case LT_ST_BF16: {
        uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
        return ref_bf16(h);
    }
    case LT_ST_I32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return (float)v;
    }
    case LT_ST_I64: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return (float)v;
    }
    default: __builtin_trap();
    }
}

static bool same_float(float a, float b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return memcmp(&a, &b, 4) == 0;
}

static void check_tensor(const struct lt_st_file *f, const struct lt_st_tensor *t,
                         const uint8_t *data, uint64_t data_size, struct span *sp)
{
    if (!t || !t->name || !t->name[0] || lt_st_file_find(f, t->name) != t)
        __builtin_trap();
    if (t->n_dims < 0 || t->n_dims > LT_ST_MAX_DIMS || (unsigned)t->dtype >= LT_ST_DTYPE_COUNT)
        __builtin_trap();
    uint64_t nel = 1;
    for (int d = 0; d < LT_ST_MAX_DIMS; d++) {
        if (t->shape[d] < 0 || (d >= t->n_dims && t->shape[d] != 1))
            __builtin_trap();
        if (__builtin_mul_overflow(nel, (uint64_t)t->shape[d], &nel))
            __builtin_trap();
    }
    if ((uint64_t)t->n_elements != nel || t->nbytes != nel * lt_st_dtype_size(t->dtype))
        __builtin_trap();
    const uint8_t *p = t->data;
    if (p < data || p > data + data_size || t->nbytes > (size_t)(data + data_size - p))
        __builtin_trap();
    sp->begin = (uint64_t)(p - data);
    sp->end = sp->begin + t->nbytes;

    /* nbytes <= the input's size, so this allocation is bounded by 2x the input */
    float *vals = malloc(nel ? nel * sizeof(float) : 1);
    if (!vals)
        return;
    lt_st_tensor_read_f32(t, vals);
    for (uint64_t i = 0; i < nel; i++)
        if (!same_float(vals[i], ref_elem(t, (int64_t)i)))
            __builtin_trap();
    free(vals);
}

#ifdef LATHE_HAVE_JANSSON
/* The header's tensors in order and its metadata, from jansson directly. */
static void check_against_json(const struct lt_st_file *f, const uint8_t *bytes, uint64_t hlen)
{
    json_t *root = json_loadb((const char *)bytes + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, NULL);
    if (!root || !json_is_object(root))
        __builtin_trap();
    int64_t i = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv)
            {
                const char *got = lt_st_file_metadata(f, mk);
                if (!got || strcmp(got, json_string_value(mv)))
                    __builtin_trap();
            }
            continue;
        }
        const struct lt_st_tensor *t = lt_st_file_tensor(f, i++);
        if (!t || strcmp(t->name, key))
            __builtin_trap();
    }
    if (i != lt_st_file_n_tensors(f) || lt_st_file_tensor(f, i) || lt_st_file_tensor(f, -1))
        __builtin_trap();
    json_decref(root);
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    struct lt_st_file *f = (struct lt_st_file *)(void *)&not_null;
    lt_status st = lt_st_file_open_memory(copy, size, "fuzz", &f);
    if (st != LT_OK) {
        if (f || lt_last_error()[0] == '\0' || (st != LT_ERR_FORMAT && st != LT_ERR_NOMEM))
            __builtin_trap();
        free(copy);
        return 0;
    }

    /* an opened file has an 8-byte little-endian header length and the data after it */
    if (size < 8)
        __builtin_trap();
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | copy[i];
    if (hlen > size - 8)
        __builtin_trap();
    const uint8_t *dsec = copy + 8 + hlen;
    uint64_t dsize = size - 8 - hlen;

    int64_t n = lt_st_file_n_tensors(f);
    struct span *sp = calloc(n ? (size_t)n : 1, sizeof(*sp));
    if (!sp)
        goto out_close;
    for (int64_t i = 0; i < n; i++)
        check_tensor(f, lt_st_file_tensor(f, i), dsec, dsize, &sp[i]);
    /* the ranges tile [0, dsize): sorted by start, each begins where the previous ended */
    qsort(sp, (size_t)n, sizeof(*sp), cmp_span);
    uint64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        if (sp[i].begin != at)
            __builtin_trap();
        at = sp[i].end;
    }
    if (at != dsize)
        __builtin_trap();
    free(sp);
#ifdef LATHE_HAVE_JANSSON
    check_against_json(f, copy, hlen);
#endif
    if (lt_st_file_find(f, "") || lt_st_file_find(f, "__metadata__"))
        __builtin_trap();

out_close:
    lt_st_file_close(f);
    free(copy);
    return 0;
}
