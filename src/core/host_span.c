/* host_span.c: reserved, then committed, host memory (see host_span.h).
 *
 * The reservation is a private anonymous PROT_NONE mapping, which Linux does not charge
 * against the commit limit; mprotect to read-write charges it then, and fails with ENOMEM
 * (instead of a later OOM kill) when the system cannot commit that much, as malloc would. */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/host_span.h"

static size_t page_round(size_t n)
{
    long page = sysconf(_SC_PAGESIZE);
    size_t p = page > 0 ? (size_t)page : 4096;
    return (n + p - 1) / p * p;
}

lt_status lt_span_reserve(struct lt_span *s, size_t size, const char *what)
{
    memset(s, 0, sizeof(*s));
    if (size == 0)
        return LT_OK;
    size_t n = page_round(size);
    if (n < size)
        return lt_fail(LT_ERR_NOMEM, "%s: %zu bytes is not a size this machine can map", what,
                       size);
    void *p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return lt_fail(LT_ERR_NOMEM, "%s: cannot reserve %zu bytes of address space: %s", what, n,
                       strerror(errno));
    s->base = p;
    s->size = n;
    return LT_OK;
}

lt_status lt_span_commit(struct lt_span *s, const char *what)
{
    if (s->committed || !s->base) {
        s->committed = true;
        return LT_OK;
    }
    if (mprotect(s->base, s->size, PROT_READ | PROT_WRITE) != 0)
        return lt_fail(LT_ERR_NOMEM, "%s: out of host memory for %zu bytes: %s", what, s->size,
                       strerror(errno));
    s->committed = true;
    return LT_OK;
}

void lt_span_free(struct lt_span *s)
{
    if (s->base)
        munmap(s->base, s->size);
    memset(s, 0, sizeof(*s));
}
