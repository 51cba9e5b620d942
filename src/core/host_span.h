/* host_span.h (internal): host memory for trainable tensors in two steps, so that a training
 * job can be admitted before it takes any.
 *
 * lt_span_reserve takes address space only (PROT_NONE: no page, no RSS, no overcommit
 * charge), so tensors can get their shapes and final addresses and a graph over them can be
 * built, placed and measured. lt_span_commit makes the span readable and writable; its pages
 * read as zero and become resident only when touched. Touching a span before its commit is a
 * programmer error and faults at once instead of reading garbage. */
#ifndef LATHE_CORE_HOST_SPAN_H
#define LATHE_CORE_HOST_SPAN_H

#include <stdbool.h>
#include <stddef.h>

#include "lathe/status.h"

struct lt_span {
    void *base; /* NULL when size is 0 */
    size_t size;
    bool committed;
};

/* Reserves size bytes (rounded up to pages); LT_ERR_NOMEM naming what when the address space
 * cannot be had. */
lt_status lt_span_reserve(struct lt_span *s, size_t size, const char *what);
/* Makes the span usable (zero-filled); LT_OK at once when it is already. LT_ERR_NOMEM naming
 * what when the system will not commit that much memory. */
lt_status lt_span_commit(struct lt_span *s, const char *what);
/* Returns the span (NULL base is fine) and zeroes *s. */
void lt_span_free(struct lt_span *s);

#endif
