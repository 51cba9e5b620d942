/* cmd_info.c: `lathe info FILE.gguf`: prints a GGUF file's header, every metadata key with
 * its type and value, and the tensor table. Long strings and arrays are abbreviated (the
 * first few elements and the count), so the output stays readable for a 150k-token vocab.
 * A file the reader refuses is one line on stderr and exit status 1. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "lathe/gguf.h"

#define INFO_MAX_STRING 96   /* bytes of a string shown before "..." */
#define INFO_MAX_ELEMENTS 8  /* elements of an array shown before "..." */

static void print_string(FILE *f, const char *s, uint64_t len, size_t max)
{
    fputc('"', f);
    for (uint64_t i = 0; i < len && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
    if (len > max)
        fprintf(f, "... (%" PRIu64 " bytes)", len);
}

static void print_scalar(FILE *f, enum lt_gguf_type t, const void *p)
{
    switch (t) {
    case LT_GGUF_TYPE_U8: fprintf(f, "%u", *(const uint8_t *)p); break;
    case LT_GGUF_TYPE_I8: fprintf(f, "%d", *(const int8_t *)p); break;
    case LT_GGUF_TYPE_U16: fprintf(f, "%u", *(const uint16_t *)p); break;
    case LT_GGUF_TYPE_I16: fprintf(f, "%d", *(const int16_t *)p); break;
    case LT_GGUF_TYPE_U32: fprintf(f, "%" PRIu32, *(const uint32_t *)p); break;
    case LT_GGUF_TYPE_I32: fprintf(f, "%" PRId32, *(const int32_t *)p); break;
    case LT_GGUF_TYPE_U64: fprintf(f, "%" PRIu64, *(const uint64_t *)p); break;
    case LT_GGUF_TYPE_I64: fprintf(f, "%" PRId64, *(const int64_t *)p); break;
    case LT_GGUF_TYPE_F32: fprintf(f, "%.9g", *(const float *)p); break;
    case LT_GGUF_TYPE_F64: fprintf(f, "%.17g", *(const double *)p); break;
    case LT_GGUF_TYPE_BOOL: fputs(*(const uint8_t *)p ? "true" : "false", f); break;
    default: fputs("?", f); break;
    }
}

static void print_value(FILE *f, const struct lt_gguf_value *v)
{
    switch (v->type) {
    case LT_GGUF_TYPE_U8: case LT_GGUF_TYPE_U16: case LT_GGUF_TYPE_U32: case LT_GGUF_TYPE_U64:
        fprintf(f, "%" PRIu64, v->u64);
        break;
    case LT_GGUF_TYPE_I8: case LT_GGUF_TYPE_I16: case LT_GGUF_TYPE_I32: case LT_GGUF_TYPE_I64:
        fprintf(f, "%" PRId64, v->i64);
        break;
    case LT_GGUF_TYPE_F32: fprintf(f, "%.9g", v->f64); break;
    case LT_GGUF_TYPE_F64: fprintf(f, "%.17g", v->f64); break;
    case LT_GGUF_TYPE_BOOL: fputs(v->b ? "true" : "false", f); break;
    case LT_GGUF_TYPE_STRING: print_string(f, v->str.ptr, v->str.len, INFO_MAX_STRING); break;
    case LT_GGUF_TYPE_ARRAY: {
        uint64_t n = v->arr.n;
        uint64_t shown = n < INFO_MAX_ELEMENTS ? n : INFO_MAX_ELEMENTS;
        fputc('[', f);
        for (uint64_t i = 0; i < shown; i++) {
            if (i)
                fputs(", ", f);
            if (v->arr.type == LT_GGUF_TYPE_STRING) {
                uint64_t len;
                const char *s = lt_gguf_arr_str(v, i, &len);
                print_string(f, s, len, 32);
            } else if (v->arr.type == LT_GGUF_TYPE_ARRAY) {
                print_value(f, lt_gguf_arr_arr(v, i));
            } else {
                const char *base = v->arr.data;
                print_scalar(f, v->arr.type, base + i * lt_gguf_type_size(v->arr.type));
            }
        }
        if (shown < n)
            fputs(", ...", f);
        fputc(']', f);
        if (shown < n)
            fprintf(f, " (%" PRIu64 " elements)", n);
        break;
    }
    default: fputs("?", f); break;
    }
}

static void type_label(char *buf, size_t size, const struct lt_gguf_value *v)
{
    if (v->type != LT_GGUF_TYPE_ARRAY) {
        snprintf(buf, size, "%s", lt_gguf_type_name(v->type));
        return;
    }
    snprintf(buf, size, "%s[%" PRIu64 "]", lt_gguf_type_name(v->arr.type), v->arr.n);
}

static void print_shape(char *buf, size_t size, const struct lt_gguf_tensor_info *t)
{
    int k = snprintf(buf, size, "[");
    for (int d = 0; d < t->n_dims && k > 0 && (size_t)k < size; d++)
        k += snprintf(buf + k, size - (size_t)k, "%s%" PRId64, d ? ", " : "", t->ne[d]);
    if (k > 0 && (size_t)k < size)
        snprintf(buf + k, size - (size_t)k, "]");
}

int cmd_info(int argc, char **argv)
{
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: lathe info FILE.gguf\n");
        return argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) ? 0 : 2;
    }
    struct lt_gguf *g;
    if (lt_gguf_open(argv[1], &g) != LT_OK) {
        fprintf(stderr, "lathe info: %s\n", lt_last_error());
        return 1;
    }
    printf("file:       %s\n", argv[1]);
    printf("version:    %" PRIu32 "\n", lt_gguf_version(g));
    printf("alignment:  %zu\n", lt_gguf_alignment(g));
    printf("data at:    %zu (file size %zu)\n", lt_gguf_data_offset(g), lt_gguf_file_size(g));

    printf("\nmetadata: %" PRId64 " keys\n", lt_gguf_n_kv(g));
    for (int64_t i = 0; i < lt_gguf_n_kv(g); i++) {
        const struct lt_gguf_value *v = lt_gguf_kv_value(g, i);
        char type[48];
        type_label(type, sizeof(type), v);
        printf("  %-44s %-16s ", lt_gguf_key(g, i), type);
        print_value(stdout, v);
        putchar('\n');
    }

    size_t total = 0;
    printf("\ntensors: %" PRId64 "\n", lt_gguf_n_tensors(g));
    printf("  %5s  %-40s %-6s %-24s %14s %14s\n", "#", "name", "type", "shape", "offset",
           "bytes");
    for (int64_t i = 0; i < lt_gguf_n_tensors(g); i++) {
        const struct lt_gguf_tensor_info *t = lt_gguf_tensor(g, i);
        char shape[128];
        print_shape(shape, sizeof(shape), t);
        printf("  %5" PRId64 "  %-40s %-6s %-24s %14" PRIu64 " %14zu\n", i, t->name,
               lt_type_name(t->type), shape, t->offset, t->nbytes);
        total += t->nbytes;
    }
    printf("  total tensor bytes: %zu\n", total);
    lt_gguf_close(g);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "lathe info: cannot write the output\n");
        return 1;
    }
    return 0;
}
