/* fuzz_gguf.c: libFuzzer target for the GGUF reader (lt_gguf_open_memory).
 *
 * Any input must either be refused with LT_ERR_FORMAT (and a message) or open; an opened
 * file is then walked completely: every key through every typed getter, every array
 * element, every tensor's bytes (first and last), and the lookups by name. The properties
 * checked beyond "no crash, no sanitizer report" are the reader's promises: tensor data
 * lies inside the input, tensors are found by their own names, keys by theirs.
 * The input is copied into a buffer of exactly its size so ASan sees any over-read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lathe/gguf.h"

static volatile uint64_t sink;

static void walk_value(const struct lt_gguf_value *v, int depth)
{
    if (depth > LT_GGUF_MAX_ARRAY_DEPTH + 1)
        __builtin_trap();
    if (v->type == LT_GGUF_TYPE_STRING) {
        if (v->str.ptr[v->str.len] != '\0')
            __builtin_trap();
        if (v->str.len)
            sink += (uint8_t)v->str.ptr[v->str.len - 1];
        return;
    }
    if (v->type != LT_GGUF_TYPE_ARRAY)
        return;
    uint64_t n = lt_gguf_arr_len(v);
    if (v->arr.type == LT_GGUF_TYPE_STRING) {
        for (uint64_t i = 0; i < n; i++) {
            uint64_t len;
            const char *s = lt_gguf_arr_str(v, i, &len);
            if (!s || s[len] != '\0')
                __builtin_trap();
        }
        if (lt_gguf_arr_str(v, n, NULL))
            __builtin_trap();
    } else if (v->arr.type == LT_GGUF_TYPE_ARRAY) {
        for (uint64_t i = 0; i < n; i++) {
            const struct lt_gguf_value *e = lt_gguf_arr_arr(v, i);
            if (!e || e->type != LT_GGUF_TYPE_ARRAY)
                __builtin_trap();
            walk_value(e, depth + 1);
        }
    } else if (n) {
        const uint8_t *d = lt_gguf_arr_data(v);
        size_t size = lt_gguf_type_size(v->arr.type);
        if (!d || size == 0 || (uintptr_t)d % size)
            __builtin_trap();
        sink += d[0] + d[n * size - 1];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    struct lt_gguf *g = NULL;
    lt_status st = lt_gguf_open_memory(copy, size, &g);
    if (st != LT_OK) {
        if (g || lt_last_error()[0] == '\0' || (st != LT_ERR_FORMAT && st != LT_ERR_NOMEM))
            __builtin_trap();
        free(copy);
        return 0;
    }

    for (int64_t i = 0; i < lt_gguf_n_kv(g); i++) {
        const char *key = lt_gguf_key(g, i);
        const struct lt_gguf_value *v = lt_gguf_kv_value(g, i);
        if (!key || !v || lt_gguf_find_key(g, key) != i || lt_gguf_kv_type(g, i) != v->type)
            __builtin_trap();
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
        bool b;
        const char *s;
        const struct lt_gguf_value *a;
        sink += lt_gguf_get_u32(g, key, &u32) + lt_gguf_get_i32(g, key, &i32) +
                lt_gguf_get_u64(g, key, &u64) + lt_gguf_get_i64(g, key, &i64) +
                lt_gguf_get_f32(g, key, &f32) + lt_gguf_get_f64(g, key, &f64) +
                lt_gguf_get_bool(g, key, &b) + lt_gguf_get_str(g, key, &s) +
                lt_gguf_get_arr(g, key, LT_GGUF_TYPE_COUNT, &a);
        walk_value(v, 0);
    }
    const uint8_t *end = copy + size;
    for (int64_t i = 0; i < lt_gguf_n_tensors(g); i++) {
        const struct lt_gguf_tensor_info *t = lt_gguf_tensor(g, i);
        if (!t || lt_gguf_find_tensor(g, t->name) != i || t->n_dims < 1 || t->n_dims > 4)
            __builtin_trap();
        if (t->nbytes != lt_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]))
            __builtin_trap();
        const uint8_t *p = t->data;
        if (p < copy || p > end || t->nbytes > (size_t)(end - p))
            __builtin_trap();
        if (t->nbytes)
            sink += p[0] + p[t->nbytes - 1];
    }
    lt_gguf_close(g);
    free(copy);
    return 0;
}
