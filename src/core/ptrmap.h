/* ptrmap.h (internal): a small open-addressing map from a pointer to an int, for passes
 * over graphs (which nodes need gradients, where each node is placed). Fixed capacity,
 * set at init from the number of keys the caller will insert. */
#ifndef LATHE_CORE_PTRMAP_H
#define LATHE_CORE_PTRMAP_H

#include <stdbool.h>
#include <stddef.h>

struct lt_ptrmap {
    size_t cap;
    const void **keys;
    int *vals;
};

bool lt_ptrmap_init(struct lt_ptrmap *m, size_t max_keys);
void lt_ptrmap_free(struct lt_ptrmap *m);
void lt_ptrmap_set(struct lt_ptrmap *m, const void *key, int val);
/* The value for key, or `missing` when absent. */
int lt_ptrmap_get(const struct lt_ptrmap *m, const void *key, int missing);

#endif
