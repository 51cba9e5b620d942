/* multipart.h: multipart/form-data request bodies (RFC 7578), as POST /v1/files receives
 * them (internal). The parser reads a whole body already in memory, bounded by the HTTP
 * layer's cap, and never writes to it: a part's data points into the body. */
#ifndef LATHE_SERVER_MULTIPART_H
#define LATHE_SERVER_MULTIPART_H

#include <stdbool.h>
#include <stddef.h>

#include "lathe/status.h"

#define SRV_MULTIPART_MAX_PARTS 16
#define SRV_MULTIPART_MAX_HEAD 8192   /* one part's header block, in bytes */
#define SRV_MULTIPART_MAX_BOUNDARY 70 /* RFC 2046 */

struct srv_part {
    char name[64];      /* the form field's name (Content-Disposition name=) */
    char filename[256]; /* the file's name as the client gave it; "" when none */
    bool has_filename;  /* the part is a file (filename= present, maybe empty) */
    const char *data;   /* [len] the part's bytes, inside the body (borrowed) */
    size_t len;
};

struct srv_multipart {
    struct srv_part parts[SRV_MULTIPART_MAX_PARTS]; /* [n], in the body's order */
    int n;
};

/* The boundary parameter of a "multipart/form-data; boundary=..." Content-Type (quoted or
 * not) into b[size]: LT_ERR_UNSUPPORTED when the type is not multipart/form-data,
 * LT_ERR_FORMAT when the boundary is missing or not 1..70 of RFC 2046's characters. */
lt_status srv_multipart_boundary(const char *content_type, char *b, size_t size);

/* Splits body[0..len) at the boundary into its parts: each must have a Content-Disposition
 * "form-data" with a name, no name may repeat, and the closing boundary must be there.
 * LT_ERR_FORMAT says what is wrong otherwise; *out is then empty. */
lt_status srv_multipart_parse(const char *boundary, const char *body, size_t len,
                              struct srv_multipart *out);

/* The part named `name`; NULL when there is none. */
const struct srv_part *srv_multipart_get(const struct srv_multipart *m, const char *name);

#endif
