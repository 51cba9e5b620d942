/* ptrmap.c: linear probing; capacity is twice the keys promised, so probes stay short. */
#include <stdint.h>
#include <stdlib.h>

#include "core/ptrmap.h"

bool lt_ptrmap_init(struct lt_ptrmap *m, size_t max_keys)
{
    m->cap = max_keys * 2 + 1;
    m->keys = calloc(m->cap, sizeof(*m->keys));
    m->vals = calloc(m->cap, sizeof(*m->vals));
    if (!m->keys || !m->vals) {
        lt_ptrmap_free(m);
        return false;
    }
    return true;
}

void lt_ptrmap_free(struct lt_ptrmap *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
}

static size_t slot_of(const struct lt_ptrmap *m, const void *key)
{
    size_t i = (size_t)(((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull % m->cap);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) % m->cap;
    return i;
}

void lt_ptrmap_set(struct lt_ptrmap *m, const void *key, int val)
{
    size_t i = slot_of(m, key);
    m->keys[i] = key;
    m->vals[i] = val;
}

int lt_ptrmap_get(const struct lt_ptrmap *m, const void *key, int missing)
{
    size_t i = slot_of(m, key);
    return m->keys[i] ? m->vals[i] : missing;
}
