/* fuzz_multipart.c: the multipart/form-data parser of POST /v1/files (src/server/multipart.c)
 * on arbitrary input: the bytes up to the first NUL are the Content-Type, the rest the body
 * (which may hold NUL bytes of its own). Whatever they hold, the boundary is refused or is
 * 1..70 bytes; the parse either fails with LT_ERR_FORMAT and no parts, or gives 1..16 parts
 * with non-empty, distinct names whose bytes lie inside the body, in order and apart. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/multipart.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t ct_len = nul ? (size_t)(nul - data) : size;
    char *ct = malloc(ct_len + 1);
    if (!ct)
        return 0;
    memcpy(ct, data, ct_len);
    ct[ct_len] = 0;
    const char *body = nul ? (const char *)nul + 1 : "";
    size_t len = nul ? size - ct_len - 1 : 0;
    char b[SRV_MULTIPART_MAX_BOUNDARY + 1];
    lt_status st = srv_multipart_boundary(ct, b, sizeof(b));
    if (st != LT_OK && st != LT_ERR_FORMAT && st != LT_ERR_UNSUPPORTED)
        abort();
    if (st == LT_OK && (strlen(b) < 1 || strlen(b) > SRV_MULTIPART_MAX_BOUNDARY))
        abort();
    if (st != LT_OK)
        snprintf(b, sizeof(b), "b"); /* the body is parsed anyway, against a short boundary */
    struct srv_multipart *m = malloc(sizeof(*m));
    if (!m) {
        free(ct);
        return 0;
    }
    st = srv_multipart_parse(b, body, len, m);
    if (st != LT_OK && (st != LT_ERR_FORMAT || m->n != 0))
        abort();
    if (st == LT_OK && (m->n < 1 || m->n > SRV_MULTIPART_MAX_PARTS))
        abort();
    const char *prev_end = body;
    for (int i = 0; st == LT_OK && i < m->n; i++) {
        const struct srv_part *p = &m->parts[i];
        if (!p->name[0] || p->data < prev_end || p->data + p->len > body + len)
            abort();
        if (srv_multipart_get(m, p->name) != p)
            abort(); /* a repeated name */
        prev_end = p->data + p->len;
    }
    free(m);
    free(ct);
    return 0;
}
