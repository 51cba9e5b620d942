/* gguf_impl.h: the reader's private state, shared by gguf_read.c (parsing and validation)
 * and gguf_lookup.c (getters).
 *
 * Invariant: once lt_gguf_open* has returned LT_OK, every field below is consistent with the
 * file (counts match the arrays, every tensor lies inside the file and no two overlap, the
 * sorted indexes are sorted and free of duplicates), so lookups never re-validate. */
#ifndef LATHE_GGUF_IMPL_H
#define LATHE_GGUF_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/gguf.h"

/* A bump allocator for everything copied out of the file; freed in one go at close. */
struct gguf_arena_chunk {
    struct gguf_arena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char mem[];
};

struct gguf_kv {
    const char *key; /* NUL-terminated, no NULs inside */
    struct lt_gguf_value value;
    size_t key_at, value_at; /* file offsets, for messages */
};

struct lt_gguf {
    const uint8_t *base; /* the file's bytes */
    size_t size;
    bool mapped; /* base came from mmap and is unmapped at close */
    char *origin; /* the path, or "<memory>", for messages */

    uint32_t version;
    size_t alignment;
    size_t data_offset;

    int64_t n_kv;
    struct gguf_kv *kv;            /* [n_kv], file order */
    const struct gguf_kv **kv_by_key; /* [n_kv], sorted by key */

    int64_t n_tensors;
    struct lt_gguf_tensor_info *tensors;                /* [n_tensors], file order */
    const struct lt_gguf_tensor_info **tensors_by_name; /* [n_tensors], sorted by name */

    struct gguf_arena_chunk *arena;
};

#endif
