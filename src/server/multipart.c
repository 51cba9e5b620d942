/* multipart.c: multipart/form-data bodies (RFC 7578 over RFC 2046's multipart syntax).
 *
 * The body is read once, front to back, and nothing is trusted: every search is bounded by
 * the body's length (memmem, never strstr: a file may hold NUL bytes), a part's header block
 * by SRV_MULTIPART_MAX_HEAD, the number of parts by SRV_MULTIPART_MAX_PARTS, names by their
 * buffers. A delimiter is CRLF "--" boundary; the boundary cannot occur inside a part (the
 * sender chose it so), so the first such line after a part's headers ends the part. A
 * preamble before the first delimiter and an epilogue after the closing one are ignored, as
 * RFC 2046 says. Header lines are CRLF-terminated; folded (obsolete) lines are refused. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server/multipart.h"

static bool is_space(char c)
{
    return c == ' ' || c == '\t';
}

/* RFC 2046's bchars (a space only inside, never last). */
static bool boundary_char(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           strchr("'()+_,-./:=? ", c) != NULL;
}

/* Reads a parameter value at *s, a quoted-string or a token, into v[size]; advances *s.
 * false when the quote is not closed or the value does not fit. */
static bool param_value(const char **s, const char *end, char *v, size_t size)
{
    const char *p = *s;
    size_t n = 0;
    if (p < end && *p == '"') {
        for (p++; p < end && *p != '"'; p++) {
            if (*p == '\\' && p + 1 < end)
                p++;
            if (n + 1 >= size)
                return false;
            v[n++] = *p;
        }
        if (p >= end)
            return false;
        p++; /* the closing quote */
    } else {
        for (; p < end && *p != ';' && !is_space(*p); p++) {
            if (n + 1 >= size)
                return false;
            v[n++] = *p;
        }
    }
    v[n] = 0;
    *s = p;
    return true;
}

lt_status srv_multipart_boundary(const char *content_type, char *b, size_t size)
{
    static const char type[] = "multipart/form-data";
    const char *s = content_type ? content_type : "";
    while (is_space(*s))
        s++;
    size_t n = sizeof(type) - 1;
    if (strncasecmp(s, type, n) != 0 || (s[n] && s[n] != ';' && !is_space(s[n])))
        return lt_fail(LT_ERR_UNSUPPORTED, "the Content-Type is '%.100s', not %s", content_type,
                       type);
    const char *end = s + strlen(s);
    for (s += n; s < end;) {
        while (s < end && (is_space(*s) || *s == ';'))
            s++;
        size_t k = strcspn(s, "=;");
        bool is_boundary = k == 8 && !strncasecmp(s, "boundary", 8) && s[k] == '=';
        s += k;
        if (*s != '=')
            continue;
        s++;
        char v[SRV_MULTIPART_MAX_BOUNDARY + 2];
        if (!param_value(&s, end, v, sizeof(v)))
            return lt_fail(LT_ERR_FORMAT,
                           "a Content-Type parameter is unterminated or too long "
                           "(a boundary is at most %d characters)",
                           SRV_MULTIPART_MAX_BOUNDARY);
        if (!is_boundary)
            continue;
        size_t len = strlen(v);
        bool ok = len >= 1 && len <= SRV_MULTIPART_MAX_BOUNDARY && len < size && v[len - 1] != ' ';
        for (size_t i = 0; ok && i < len; i++)
            ok = boundary_char(v[i]);
        if (!ok)
            return lt_fail(LT_ERR_FORMAT,
                           "the multipart boundary must be 1..%d letters, digits "
                           "or '()+_,-./:=? characters",
                           SRV_MULTIPART_MAX_BOUNDARY);
        memcpy(b, v, len + 1);
        return LT_OK;
    }
    return lt_fail(LT_ERR_FORMAT, "the multipart/form-data Content-Type has no boundary");
}

/* A Content-Disposition value "form-data; name=...; filename=..." into part. */
static lt_status parse_disposition(const char *s, const char *end, struct srv_part *part)
{
    while (s < end && is_space(*s))
        s++;
    if ((size_t)(end - s) < 9 || strncasecmp(s, "form-data", 9) != 0 ||
        (s + 9 < end && s[9] != ';' && !is_space(s[9])))
        return lt_fail(LT_ERR_FORMAT, "a part's Content-Disposition is not form-data");
    bool have_name = false;
    for (s += 9; s < end;) {
        while (s < end && (is_space(*s) || *s == ';'))
            s++;
        const char *key = s;
        while (s < end && *s != '=' && *s != ';')
            s++;
        size_t k = (size_t)(s - key);
        while (k > 0 && is_space(key[k - 1]))
            k--;
        if (s >= end || *s != '=')
            continue; /* a parameter without a value: ignored */
        s++;
        while (s < end && is_space(*s))
            s++;
        char v[256];
        if (!param_value(&s, end, v, sizeof(v)))
            return lt_fail(LT_ERR_FORMAT,
                           "a part's Content-Disposition parameter '%.*s' is "
                           "unterminated or longer than %zu bytes",
                           (int)(k < 40 ? k : 40), key, sizeof(v) - 1);
        if (k == 4 && !strncasecmp(key, "name", 4)) {
            if (strlen(v) >= sizeof(part->name))
                return lt_fail(LT_ERR_FORMAT, "a form field's name is longer than %zu bytes",
                               sizeof(part->name) - 1);
            snprintf(part->name, sizeof(part->name), "%s", v);
            have_name = true;
        } else if (k == 8 && !strncasecmp(key, "filename", 8)) {
            snprintf(part->filename, sizeof(part->filename), "%s", v);
            part->has_filename = true;
        }
    }
    if (!have_name || !part->name[0])
        return lt_fail(LT_ERR_FORMAT, "a part's Content-Disposition has no name");
    return LT_OK;
}

/* The header block head[0..n) (CRLF-separated lines) of one part into part. */
static lt_status parse_head(const char *head, size_t n, struct srv_part *part)
{
    bool have_disposition = false;
    const char *end = head + n;
    for (const char *line = head; line < end;) {
        const char *eol = memmem(line, (size_t)(end - line), "\r\n", 2);
        if (!eol)
            eol = end;
        if (is_space(*line))
            return lt_fail(LT_ERR_FORMAT, "a part's header line is folded (starts with a space)");
        const char *colon = memchr(line, ':', (size_t)(eol - line));
        if (!colon || colon == line)
            return lt_fail(LT_ERR_FORMAT, "a part's header line has no name and ':'");
        static const char cd[] = "Content-Disposition";
        if ((size_t)(colon - line) == sizeof(cd) - 1 && !strncasecmp(line, cd, sizeof(cd) - 1)) {
            if (have_disposition)
                return lt_fail(LT_ERR_FORMAT, "a part has two Content-Disposition headers");
            lt_status st = parse_disposition(colon + 1, eol, part);
            if (st != LT_OK)
                return st;
            have_disposition = true;
        }
        line = eol + 2;
    }
    if (!have_disposition)
        return lt_fail(LT_ERR_FORMAT, "a part has no Content-Disposition header");
    return LT_OK;
}

/* One part starting at body[*pos] (just past its delimiter line's CRLF), up to the next
 * delimiter; *pos is left just past that delimiter. */
static lt_status parse_part(const char *delim, size_t dlen, const char *body, size_t len,
                            size_t *pos, struct srv_part *part)
{
    size_t hs = *pos, cs;
    size_t window = len - hs < SRV_MULTIPART_MAX_HEAD + 4 ? len - hs : SRV_MULTIPART_MAX_HEAD + 4;
    if (window >= 2 && body[hs] == '\r' && body[hs + 1] == '\n') {
        cs = hs + 2; /* no headers at all: refused below, for want of a Content-Disposition */
    } else {
        const char *he = memmem(body + hs, window, "\r\n\r\n", 4);
        if (!he && len - hs > SRV_MULTIPART_MAX_HEAD)
            return lt_fail(LT_ERR_FORMAT, "a part's headers are longer than %d bytes",
                           SRV_MULTIPART_MAX_HEAD);
        if (!he)
            return lt_fail(LT_ERR_FORMAT, "a part's headers do not end with an empty line");
        cs = (size_t)(he - body) + 4;
    }
    lt_status st = parse_head(body + hs, cs >= hs + 4 ? cs - hs - 4 : 0, part);
    if (st != LT_OK)
        return st;
    const char *ce = memmem(body + cs, len - cs, delim, dlen); /* delim starts with CRLF */
    if (!ce)
        return lt_fail(LT_ERR_FORMAT,
                       "the body ends inside the part '%s', before the closing "
                       "boundary",
                       part->name);
    part->data = body + cs;
    part->len = (size_t)(ce - (body + cs));
    *pos = (size_t)(ce - body) + dlen;
    return LT_OK;
}

/* Where the first delimiter (at the very start, or after a preamble line) ends; 0: none. */
static size_t first_delimiter(const char *delim, size_t dlen, const char *body, size_t len)
{
    if (len >= dlen - 2 && !memcmp(body, delim + 2, dlen - 2))
        return dlen - 2;
    const char *d = memmem(body, len, delim, dlen);
    return d ? (size_t)(d - body) + dlen : 0;
}

static lt_status parse_parts(const char *delim, size_t dlen, const char *body, size_t len,
                             struct srv_multipart *out)
{
    size_t pos = first_delimiter(delim, dlen, body, len);
    if (pos == 0)
        return lt_fail(LT_ERR_FORMAT, "the body does not hold the boundary its Content-Type "
                                      "names");
    for (;;) {
        if (len - pos >= 2 && body[pos] == '-' && body[pos + 1] == '-')
            break; /* the closing delimiter; what follows is the epilogue */
        while (pos < len && is_space(body[pos]))
            pos++; /* transport padding */
        if (len - pos < 2 || body[pos] != '\r' || body[pos + 1] != '\n')
            return lt_fail(LT_ERR_FORMAT, pos >= len ? "the body ends without the closing "
                                                       "boundary"
                                                     : "a boundary line does not end with CRLF");
        pos += 2;
        if (out->n == SRV_MULTIPART_MAX_PARTS)
            return lt_fail(LT_ERR_FORMAT, "the form has more than %d fields",
                           SRV_MULTIPART_MAX_PARTS);
        struct srv_part *part = &out->parts[out->n];
        memset(part, 0, sizeof(*part));
        lt_status st = parse_part(delim, dlen, body, len, &pos, part);
        if (st != LT_OK)
            return st;
        if (srv_multipart_get(out, part->name))
            return lt_fail(LT_ERR_FORMAT, "the form has two fields named '%s'", part->name);
        out->n++;
    }
    if (out->n == 0)
        return lt_fail(LT_ERR_FORMAT, "the form has no fields");
    return LT_OK;
}

lt_status srv_multipart_parse(const char *boundary, const char *body, size_t len,
                              struct srv_multipart *out)
{
    out->n = 0;
    char delim[SRV_MULTIPART_MAX_BOUNDARY + 8];
    size_t blen = strlen(boundary);
    if (blen == 0 || blen > SRV_MULTIPART_MAX_BOUNDARY)
        return lt_fail(LT_ERR_FORMAT, "the multipart boundary must be 1..%d characters",
                       SRV_MULTIPART_MAX_BOUNDARY);
    int dlen = snprintf(delim, sizeof(delim), "\r\n--%s", boundary);
    lt_status st = parse_parts(delim, (size_t)dlen, body, len, out);
    if (st != LT_OK)
        out->n = 0;
    return st;
}

const struct srv_part *srv_multipart_get(const struct srv_multipart *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->parts[i].name, name))
            return &m->parts[i];
    return NULL;
}
