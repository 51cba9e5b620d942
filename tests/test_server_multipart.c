/* test_server_multipart.c: the multipart/form-data parser of POST /v1/files
 * (src/server/multipart.c), on bodies written out by hand:
 *   - the boundary from the Content-Type: plain, quoted, in any case, after other
 *     parameters; refused when the type is another, the boundary missing, too long, of
 *     characters RFC 2046 does not allow, or its quote unclosed;
 *   - a well-formed form: parts in order, names and filenames (escaped quotes too), bytes
 *     exactly (CRLF, "--", a boundary's prefix and NUL bytes inside a file), an empty part,
 *     a preamble, transport padding and an epilogue;
 *   - each malformed body refused with a message saying what is wrong: no closing
 *     boundary, the wrong boundary, headers without their empty line or over 8192 bytes, a
 *     part without Content-Disposition, not form-data, without a name, a name or filename too
 *     long, an unclosed quote, a folded or colon-less header line, two parts of one name,
 *     more than 16 parts, a boundary line not ended by CRLF, no parts at all;
 *   - every prefix of a good body is refused (none is a whole form), and nothing reads past
 *     the body (run it under .ci/sanitize to see that). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/multipart.h"

#define B "lathe-b0undary"

static void test_boundary(void)
{
    char b[SRV_MULTIPART_MAX_BOUNDARY + 1];
    static const struct {
        const char *ct, *want;
    } good[] = {
        {"multipart/form-data; boundary=abc", "abc"},
        {"multipart/form-data;boundary=abc", "abc"},
        {"Multipart/Form-Data; BOUNDARY=x-y_z", "x-y_z"},
        {"multipart/form-data; charset=utf-8; boundary=\"a b:c\"", "a b:c"},
        {"  multipart/form-data ; boundary=----WebKitFormBoundary7MA4YWxk",
         "----WebKitFormBoundary7MA4YWxk"},
        {"multipart/form-data; boundary=abc; charset=utf-8", "abc"},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        lt_status st = srv_multipart_boundary(good[i].ct, b, sizeof(b));
        CHECK(st == LT_OK && !strcmp(b, good[i].want), "'%s': %d %s / %s", good[i].ct, st, b,
              lt_last_error());
    }
    static const struct {
        const char *ct;
        lt_status want;
        const char *words;
    } bad[] = {
        {NULL, LT_ERR_UNSUPPORTED, "not multipart/form-data"},
        {"application/json", LT_ERR_UNSUPPORTED, "'application/json'"},
        {"multipart/form-dataX; boundary=x", LT_ERR_UNSUPPORTED, "not multipart"},
        {"multipart/mixed; boundary=x", LT_ERR_UNSUPPORTED, "not multipart"},
        {"multipart/form-data", LT_ERR_FORMAT, "no boundary"},
        {"multipart/form-data; charset=utf-8", LT_ERR_FORMAT, "no boundary"},
        {"multipart/form-data; boundary=", LT_ERR_FORMAT, "1..70"},
        {"multipart/form-data; boundary=a@b", LT_ERR_FORMAT, "1..70"},
        {"multipart/form-data; boundary=\"ab \"", LT_ERR_FORMAT, "1..70"},
        {"multipart/form-data; boundary=\"abc", LT_ERR_FORMAT, "unterminated"},
        {"multipart/form-data; boundary=01234567890123456789012345678901234567890123456789"
         "012345678901234567890",
         LT_ERR_FORMAT, "1..70"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        lt_status st = srv_multipart_boundary(bad[i].ct, b, sizeof(b));
        CHECK(st == bad[i].want && strstr(lt_last_error(), bad[i].words), "'%s': %d '%s'",
              bad[i].ct ? bad[i].ct : "(none)", st, lt_last_error());
    }
}

/* The file's bytes: text, CRLFs, "--", the boundary's prefix after CRLF, and a NUL. */
static const char file_bytes[] = "{\"a\": 1}\r\n--"
                                 "lathe-b0und\r\n--x\n\0tail";
#define FILE_LEN (sizeof(file_bytes) - 1)

/* A good body: a preamble, "purpose", a file, an empty field, an epilogue. */
static size_t good_body(char *out, size_t size)
{
    size_t n = 0;
    n += (size_t)snprintf(out + n, size - n,
                          "preamble to ignore\r\n--" B "\r\n"
                          "Content-Disposition: form-data; name=\"purpose\"\r\n\r\n"
                          "fine-tune\r\n--" B "  \t\r\n"
                          "content-disposition: FORM-DATA; name=file; "
                          "filename=\"we \\\"quote\\\".jsonl\"\r\n"
                          "Content-Type: application/octet-stream\r\n\r\n");
    memcpy(out + n, file_bytes, FILE_LEN);
    n += FILE_LEN;
    n += (size_t)snprintf(out + n, size - n,
                          "\r\n--" B "\r\nContent-Disposition: form-data; name=\"empty\"\r\n\r\n"
                          "\r\n--" B "--\r\nepilogue, ignored too");
    return n;
}

static void test_good(void)
{
    char body[1024];
    size_t n = good_body(body, sizeof(body));
    struct srv_multipart m;
    lt_status st = srv_multipart_parse(B, body, n, &m);
    CHECK(st == LT_OK && m.n == 3, "%d %s, %d parts", st, lt_last_error(), m.n);
    if (st != LT_OK)
        return;
    const struct srv_part *p = srv_multipart_get(&m, "purpose");
    CHECK(p == &m.parts[0] && !p->has_filename && p->len == 9 && !memcmp(p->data, "fine-tune", 9));
    const struct srv_part *f = srv_multipart_get(&m, "file");
    CHECK(f == &m.parts[1] && f->has_filename && !strcmp(f->filename, "we \"quote\".jsonl"),
          "filename '%s'", f ? f->filename : "");
    CHECK(f && f->len == FILE_LEN && !memcmp(f->data, file_bytes, FILE_LEN),
          "the file's bytes, NUL and all: %zu", f ? f->len : 0);
    const struct srv_part *e = srv_multipart_get(&m, "empty");
    CHECK(e && e->len == 0, "an empty part");
    CHECK(srv_multipart_get(&m, "absent") == NULL);
    /* the body starting with its delimiter, no preamble, and a part without a filename */
    const char *plain = "--" B "\r\nContent-Disposition: form-data; name=\"a\"; filename=\"\""
                        "\r\n\r\nx\r\n--" B "--";
    st = srv_multipart_parse(B, plain, strlen(plain), &m);
    CHECK(st == LT_OK && m.n == 1 && m.parts[0].has_filename && !m.parts[0].filename[0] &&
          m.parts[0].len == 1);
}

/* "--B\r\n" + head + "\r\n\r\n" + data + "\r\n--B--". */
static size_t one_part(char *out, size_t size, const char *head, const char *data)
{
    return (size_t)snprintf(out, size, "--" B "\r\n%s\r\n\r\n%s\r\n--" B "--", head, data);
}

static void expect_bad(const char *what, const char *body, size_t n, const char *words)
{
    struct srv_multipart m;
    m.n = 7;
    lt_status st = srv_multipart_parse(B, body, n, &m);
    CHECK(st == LT_ERR_FORMAT && m.n == 0 && strstr(lt_last_error(), words), "%s: %d '%s'", what,
          st, lt_last_error());
}

static void test_bad_parts(void)
{
    static const struct {
        const char *what, *head, *words;
    } bad[] = {
        {"no Content-Disposition", "Content-Type: text/plain", "no Content-Disposition"},
        {"not form-data", "Content-Disposition: attachment; name=\"a\"", "not form-data"},
        {"no name", "Content-Disposition: form-data; filename=\"a\"", "no name"},
        {"an empty name", "Content-Disposition: form-data; name=\"\"", "no name"},
        {"an unclosed quote", "Content-Disposition: form-data; name=\"a", "unterminated"},
        {"a name too long",
         "Content-Disposition: form-data; name=\"0123456789012345678901234567890123456789"
         "0123456789012345678901234\"",
         "longer than 63"},
        {"a folded line", "Content-Disposition: form-data; name=\"a\"\r\n folded", "folded"},
        {"a line without ':'", "Content-Disposition: form-data; name=\"a\"\r\nno colon", "':'"},
        {"two dispositions",
         "Content-Disposition: form-data; name=\"a\"\r\nContent-Disposition: form-data; name=b",
         "two Content-Disposition"},
    };
    char body[2048];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_bad(bad[i].what, body, one_part(body, sizeof(body), bad[i].head, "x"), bad[i].words);
    char head[400];
    snprintf(head, sizeof(head), "Content-Disposition: form-data; name=a; filename=\"%0300d\"", 0);
    expect_bad("a filename too long", body, one_part(body, sizeof(body), head, "x"),
               "longer than 255");
    const char *no_headers = "--" B "\r\n\r\nx\r\n--" B "--";
    expect_bad("no headers at all", no_headers, strlen(no_headers), "no Content-Disposition");
}

static void test_bad_bodies(void)
{
    char body[4096];
    const char *head = "Content-Disposition: form-data; name=\"a\"";
    size_t n = one_part(body, sizeof(body), head, "x");
    expect_bad("no closing boundary", body, n - 4, "closing boundary");
    expect_bad("the end without the closing dashes", body, n - 2, "without the closing");
    expect_bad("the wrong boundary", "--other\r\n\r\n--other--", 20, "does not hold the boundary");
    expect_bad("an empty body", "", 0, "does not hold the boundary");
    expect_bad("no fields", "--" B "--", strlen("--" B "--"), "no fields");
    const char *no_crlf =
        "--" B "x\r\nContent-Disposition: form-data; name=a\r\n\r\nx\r\n--" B "--";
    expect_bad("a boundary line not ended by CRLF", no_crlf, strlen(no_crlf), "CRLF");
    const char *open_head = "--" B "\r\nContent-Disposition: form-data; name=a\r\n";
    expect_bad("headers without their empty line", open_head, strlen(open_head), "empty line");
    /* a header block over the bound */
    char *big = malloc(SRV_MULTIPART_MAX_HEAD + 512);
    if (big) {
        size_t k = (size_t)sprintf(big, "--" B "\r\nContent-Disposition: form-data; name=a\r\n"
                                        "X-Pad: ");
        memset(big + k, 'p', SRV_MULTIPART_MAX_HEAD);
        k += SRV_MULTIPART_MAX_HEAD;
        k += (size_t)sprintf(big + k, "\r\n\r\nx\r\n--" B "--");
        expect_bad("headers over the bound", big, k, "longer than 8192");
        free(big);
    }
    /* two parts of one name; one part more than the bound */
    n = (size_t)snprintf(body, sizeof(body),
                         "--" B "\r\n%s\r\n\r\n1\r\n--" B "\r\n%s\r\n\r\n2\r\n--" B "--", head,
                         head);
    expect_bad("two parts of one name", body, n, "two fields named 'a'");
    n = 0;
    for (int i = 0; i <= SRV_MULTIPART_MAX_PARTS; i++)
        n +=
            (size_t)snprintf(body + n, sizeof(body) - n,
                             "--" B "\r\nContent-Disposition: form-data; name=f%d\r\n\r\nx\r\n", i);
    n += (size_t)snprintf(body + n, sizeof(body) - n, "--" B "--");
    expect_bad("too many parts", body, n, "more than 16 fields");
}

static void test_prefixes(void)
{
    char body[1024];
    size_t n = good_body(body, sizeof(body));
    /* the closing delimiter's "--" is the first point at which the form is whole */
    const char *close = memmem(body, n, "--" B "--", strlen("--" B "--")); /* NUL inside */
    CHECK(close != NULL, "the good body has its closing delimiter");
    if (!close)
        return;
    size_t whole = (size_t)(close - body) + strlen("--" B "--");
    int wrong = 0;
    for (size_t k = 0; k < n; k++) {
        char *copy = malloc(k ? k : 1); /* exactly k bytes: a read past them is the sanitizer's */
        if (!copy)
            continue;
        memcpy(copy, body, k);
        struct srv_multipart m;
        lt_status st = srv_multipart_parse(B, copy, k, &m);
        if ((k < whole) != (st != LT_OK)) {
            if (wrong++ < 3)
                fprintf(stderr, "  prefix of %zu bytes (whole at %zu): %d '%s'\n", k, whole, st,
                        st != LT_OK ? lt_last_error() : "");
        }
        free(copy);
    }
    CHECK(wrong == 0, "%d prefixes parsed when they should not, or the reverse", wrong);
}

int main(void)
{
    test_boundary();
    test_good();
    test_bad_parts();
    test_bad_bodies();
    test_prefixes();
    return check_summary();
}
