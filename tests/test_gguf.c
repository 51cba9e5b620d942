/* test_gguf.c: the GGUF reader and writer.
 *
 * Without arguments: round trip of every metadata type and several tensor types, the
 * writer's temp-then-rename behaviour and the removal of temporaries killed writes left,
 * every truncation of small valid files, and a set of hand-corrupted headers (built byte by
 * byte here, not with the writer) that must each be refused with LT_ERR_FORMAT and a message
 * naming the right offset and field.
 *
 * Two modes serve tests/py/test_gguf_cross.py:
 *   test_gguf --write PATH      writes the sample file described by the tables below
 *   test_gguf --dump-json PATH  prints a GGUF file's metadata and tensors as JSON (tensor
 *                               bytes as a 64-bit FNV-1a hash) */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "lathe/gguf.h"

/* ================================================================ the sample file */

static const uint8_t s_u8[] = {1, 2, 255};
static const int8_t s_i8[] = {-128, 0, 127};
static const uint16_t s_u16[] = {0, 65535};
static const int16_t s_i16[] = {-32768, 1, 32767};
static const uint32_t s_u32[] = {0, 7, 4294967295u};
static const int32_t s_i32[] = {INT32_MIN, -1, INT32_MAX};
static const float s_f32[] = {0.5f, -1.25f, 3.0e38f, 1.0e-40f};
static const uint8_t s_bool[] = {1, 0, 1};
static const uint64_t s_u64[] = {0, 18446744073709551615ull};
static const int64_t s_i64[] = {INT64_MIN, 42, INT64_MAX};
static const double s_f64[] = {0.1, -2.5e-300, 1.7976931348623157e308};
static const char *const s_strs[] = {"a", "", "tokens \xe2\x9c\x93", "with\nnewline"};
static const char s_str_nul[] = {'n', 'u', 0, 'l'}; /* a string with a NUL inside */

/* Tensor bytes are a fixed pattern the Python test can recompute. */
static uint8_t pattern_byte(int tensor, size_t i) { return (uint8_t)((i * 37u + (size_t)tensor * 11u + 5u) & 0xff); }

struct sample_tensor {
    const char *name;
    enum lt_type type;
    int n_dims;
    int64_t ne[4];
    size_t nbytes; /* worked out by hand from the type's block layout */
};

static const struct sample_tensor sample_tensors[] = {
    {"t.f32", LT_TYPE_F32, 2, {4, 3, 1, 1}, 4 * 3 * 4},
    {"t.f16", LT_TYPE_F16, 1, {8, 1, 1, 1}, 8 * 2},
    {"t.bf16", LT_TYPE_BF16, 3, {2, 2, 2, 1}, 8 * 2},
    {"t.q8_0", LT_TYPE_Q8_0, 2, {64, 2, 1, 1}, 2 * 2 * 34},
    {"t.q4_k", LT_TYPE_Q4_K, 2, {256, 1, 1, 1}, 144},
    {"blk.0.attn_q.weight", LT_TYPE_Q6_K, 1, {256, 1, 1, 1}, 210},
    {"t.i32", LT_TYPE_I32, 4, {4, 1, 1, 2}, 32}, /* last, and a multiple of 32 bytes */
};
#define N_SAMPLE_TENSORS (int)(sizeof(sample_tensors) / sizeof(sample_tensors[0]))

static uint8_t *sample_data[N_SAMPLE_TENSORS];

static void sample_data_init(void)
{
    for (int t = 0; t < N_SAMPLE_TENSORS; t++) {
        sample_data[t] = malloc(sample_tensors[t].nbytes);
        for (size_t i = 0; i < sample_tensors[t].nbytes; i++)
            sample_data[t][i] = pattern_byte(t, i);
    }
}

static lt_status sample_write(const char *path, uint32_t alignment)
{
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    lt_status st = LT_OK;
#define TRY(x) do { if (!st) st = (x); } while (0)
    TRY(lt_gguf_writer_set_str(w, "general.architecture", "test"));
    if (alignment)
        TRY(lt_gguf_writer_set_u32(w, "general.alignment", alignment));
    TRY(lt_gguf_writer_set_u8(w, "test.u8", 200));
    TRY(lt_gguf_writer_set_i8(w, "test.i8", -100));
    TRY(lt_gguf_writer_set_u16(w, "test.u16", 60000));
    TRY(lt_gguf_writer_set_i16(w, "test.i16", -30000));
    TRY(lt_gguf_writer_set_u32(w, "test.u32", 4000000000u));
    TRY(lt_gguf_writer_set_i32(w, "test.i32", -2000000000));
    TRY(lt_gguf_writer_set_f32(w, "test.f32", 3.25f));
    TRY(lt_gguf_writer_set_bool(w, "test.bool", true));
    TRY(lt_gguf_writer_set_bool(w, "test.bool_false", false));
    TRY(lt_gguf_writer_set_str(w, "test.str", "hello, gguf \xe2\x9c\x93"));
    TRY(lt_gguf_writer_set_str(w, "test.str_empty", ""));
    TRY(lt_gguf_writer_set_strn(w, "test.str_nul", s_str_nul, sizeof(s_str_nul)));
    TRY(lt_gguf_writer_set_u64(w, "test.u64", 18000000000000000000ull));
    TRY(lt_gguf_writer_set_i64(w, "test.i64", -9000000000000000000ll));
    TRY(lt_gguf_writer_set_f64(w, "test.f64", -2.5e-300));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_u8", LT_GGUF_TYPE_U8, s_u8, 3));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_i8", LT_GGUF_TYPE_I8, s_i8, 3));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_u16", LT_GGUF_TYPE_U16, s_u16, 2));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_i16", LT_GGUF_TYPE_I16, s_i16, 3));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_u32", LT_GGUF_TYPE_U32, s_u32, 3));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_i32", LT_GGUF_TYPE_I32, s_i32, 3));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_f32", LT_GGUF_TYPE_F32, s_f32, 4));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_bool", LT_GGUF_TYPE_BOOL, s_bool, 3));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_u64", LT_GGUF_TYPE_U64, s_u64, 2));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_i64", LT_GGUF_TYPE_I64, s_i64, 3));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_f64", LT_GGUF_TYPE_F64, s_f64, 3));
    TRY(lt_gguf_writer_set_arr_str(w, "test.arr_str", s_strs, 4));
    TRY(lt_gguf_writer_set_arr(w, "test.arr_empty", LT_GGUF_TYPE_U32, NULL, 0));
    TRY(lt_gguf_writer_set_arr_str(w, "test.arr_str_empty", NULL, 0));
    /* [[1, 2, 3], [], [["x", "y"]]]: an i32 array, an empty i32 array, an array holding a
     * string array */
    {
        struct lt_gguf_value inner_strs = {.type = LT_GGUF_TYPE_ARRAY};
        struct lt_gguf_str xy[2] = {{"x", 1}, {"y", 1}};
        inner_strs.arr.type = LT_GGUF_TYPE_STRING;
        inner_strs.arr.n = 2;
        inner_strs.arr.data = xy;
        struct lt_gguf_value parts[3] = {{.type = LT_GGUF_TYPE_ARRAY},
                                         {.type = LT_GGUF_TYPE_ARRAY},
                                         {.type = LT_GGUF_TYPE_ARRAY}};
        parts[0].arr.type = LT_GGUF_TYPE_I32;
        parts[0].arr.n = 3;
        parts[0].arr.data = (const int32_t[]){1, 2, 3};
        parts[1].arr.type = LT_GGUF_TYPE_I32;
        parts[2].arr.type = LT_GGUF_TYPE_ARRAY;
        parts[2].arr.n = 1;
        parts[2].arr.data = &inner_strs;
        struct lt_gguf_value nested = {.type = LT_GGUF_TYPE_ARRAY};
        nested.arr.type = LT_GGUF_TYPE_ARRAY;
        nested.arr.n = 3;
        nested.arr.data = parts;
        TRY(lt_gguf_writer_set_value(w, "test.nested", &nested));
    }
    for (int t = 0; t < N_SAMPLE_TENSORS; t++) {
        const struct sample_tensor *s = &sample_tensors[t];
        TRY(lt_gguf_writer_add_tensor(w, s->name, s->type, s->n_dims, s->ne, sample_data[t],
                                      s->nbytes));
    }
    TRY(lt_gguf_writer_write(w, path));
#undef TRY
    lt_gguf_writer_free(w);
    return st;
}

static void check_array(const struct lt_gguf *g, const char *key, enum lt_gguf_type t,
                        const void *expect, uint64_t n, size_t elem)
{
    const struct lt_gguf_value *v = NULL;
    CHECK(lt_gguf_get_arr(g, key, t, &v) == LT_OK, "%s: %s", key, lt_last_error());
    if (!v)
        return;
    CHECK(lt_gguf_arr_type(v) == t && lt_gguf_arr_len(v) == n, "%s", key);
    if (n)
        CHECK(lt_gguf_arr_data(v) && !memcmp(lt_gguf_arr_data(v), expect, n * elem), "%s", key);
    CHECK((uintptr_t)lt_gguf_arr_data(v) % elem == 0, "%s: data is not aligned", key);
}

static void check_sample(const struct lt_gguf *g, size_t alignment)
{
    uint32_t u32 = 0;
    int32_t i32 = 0;
    uint64_t u64 = 0;
    int64_t i64 = 0;
    float f32 = 0;
    double f64 = 0;
    bool b = false;
    const char *s = NULL;

    CHECK(lt_gguf_version(g) == 3);
    CHECK(lt_gguf_alignment(g) == alignment);
    CHECK(lt_gguf_data_offset(g) % alignment == 0);
    CHECK(lt_gguf_n_kv(g) == (alignment != 32 ? 32 : 31), "n_kv %" PRId64, lt_gguf_n_kv(g));
    CHECK(!strcmp(lt_gguf_key(g, 0), "general.architecture"));
    CHECK(lt_gguf_get_str(g, "general.architecture", &s) == LT_OK && !strcmp(s, "test"));

    CHECK(lt_gguf_get_u32(g, "test.u8", &u32) == LT_OK && u32 == 200);
    CHECK(lt_gguf_kv_type(g, lt_gguf_find_key(g, "test.u8")) == LT_GGUF_TYPE_U8);
    CHECK(lt_gguf_get_i32(g, "test.i8", &i32) == LT_OK && i32 == -100);
    CHECK(lt_gguf_kv_type(g, lt_gguf_find_key(g, "test.i8")) == LT_GGUF_TYPE_I8);
    CHECK(lt_gguf_get_u32(g, "test.u16", &u32) == LT_OK && u32 == 60000);
    CHECK(lt_gguf_get_i32(g, "test.i16", &i32) == LT_OK && i32 == -30000);
    CHECK(lt_gguf_get_u32(g, "test.u32", &u32) == LT_OK && u32 == 4000000000u);
    CHECK(lt_gguf_get_i32(g, "test.i32", &i32) == LT_OK && i32 == -2000000000);
    CHECK(lt_gguf_get_f32(g, "test.f32", &f32) == LT_OK && f32 == 3.25f);
    CHECK(lt_gguf_kv_type(g, lt_gguf_find_key(g, "test.f32")) == LT_GGUF_TYPE_F32);
    CHECK(lt_gguf_get_bool(g, "test.bool", &b) == LT_OK && b);
    CHECK(lt_gguf_get_bool(g, "test.bool_false", &b) == LT_OK && !b);
    CHECK(lt_gguf_get_str(g, "test.str", &s) == LT_OK && !strcmp(s, "hello, gguf \xe2\x9c\x93"));
    CHECK(lt_gguf_get_str(g, "test.str_empty", &s) == LT_OK && s && s[0] == '\0');
    const struct lt_gguf_value *v = lt_gguf_kv_value(g, lt_gguf_find_key(g, "test.str_nul"));
    CHECK(v && v->type == LT_GGUF_TYPE_STRING && v->str.len == 4 &&
          !memcmp(v->str.ptr, s_str_nul, 4) && v->str.ptr[4] == '\0');
    CHECK(lt_gguf_get_u64(g, "test.u64", &u64) == LT_OK && u64 == 18000000000000000000ull);
    CHECK(lt_gguf_get_i64(g, "test.i64", &i64) == LT_OK && i64 == -9000000000000000000ll);
    CHECK(lt_gguf_get_f64(g, "test.f64", &f64) == LT_OK && f64 == -2.5e-300);

    check_array(g, "test.arr_u8", LT_GGUF_TYPE_U8, s_u8, 3, 1);
    check_array(g, "test.arr_i8", LT_GGUF_TYPE_I8, s_i8, 3, 1);
    check_array(g, "test.arr_u16", LT_GGUF_TYPE_U16, s_u16, 2, 2);
    check_array(g, "test.arr_i16", LT_GGUF_TYPE_I16, s_i16, 3, 2);
    check_array(g, "test.arr_u32", LT_GGUF_TYPE_U32, s_u32, 3, 4);
    check_array(g, "test.arr_i32", LT_GGUF_TYPE_I32, s_i32, 3, 4);
    check_array(g, "test.arr_f32", LT_GGUF_TYPE_F32, s_f32, 4, 4);
    check_array(g, "test.arr_bool", LT_GGUF_TYPE_BOOL, s_bool, 3, 1);
    check_array(g, "test.arr_u64", LT_GGUF_TYPE_U64, s_u64, 2, 8);
    check_array(g, "test.arr_i64", LT_GGUF_TYPE_I64, s_i64, 3, 8);
    check_array(g, "test.arr_f64", LT_GGUF_TYPE_F64, s_f64, 3, 8);
    check_array(g, "test.arr_empty", LT_GGUF_TYPE_U32, NULL, 0, 4);

    const struct lt_gguf_value *a = NULL;
    CHECK(lt_gguf_get_arr(g, "test.arr_str", LT_GGUF_TYPE_STRING, &a) == LT_OK);
    CHECK(lt_gguf_arr_len(a) == 4);
    for (uint64_t i = 0; i < 4; i++) {
        uint64_t len = 99;
        const char *e = lt_gguf_arr_str(a, i, &len);
        CHECK(e && !strcmp(e, s_strs[i]) && len == strlen(s_strs[i]), "arr_str[%" PRIu64 "]", i);
    }
    CHECK(lt_gguf_arr_str(a, 4, NULL) == NULL);
    CHECK(lt_gguf_get_arr(g, "test.arr_str_empty", LT_GGUF_TYPE_STRING, &a) == LT_OK &&
          lt_gguf_arr_len(a) == 0);

    CHECK(lt_gguf_get_arr(g, "test.nested", LT_GGUF_TYPE_ARRAY, &a) == LT_OK);
    CHECK(lt_gguf_arr_len(a) == 3);
    const struct lt_gguf_value *n0 = lt_gguf_arr_arr(a, 0), *n1 = lt_gguf_arr_arr(a, 1),
                               *n2 = lt_gguf_arr_arr(a, 2);
    CHECK(n0 && lt_gguf_arr_type(n0) == LT_GGUF_TYPE_I32 && lt_gguf_arr_len(n0) == 3 &&
          !memcmp(lt_gguf_arr_data(n0), (const int32_t[]){1, 2, 3}, 12));
    CHECK(n1 && lt_gguf_arr_type(n1) == LT_GGUF_TYPE_I32 && lt_gguf_arr_len(n1) == 0);
    CHECK(n2 && lt_gguf_arr_type(n2) == LT_GGUF_TYPE_ARRAY && lt_gguf_arr_len(n2) == 1);
    const struct lt_gguf_value *n20 = lt_gguf_arr_arr(n2, 0);
    CHECK(n20 && lt_gguf_arr_len(n20) == 2 && !strcmp(lt_gguf_arr_str(n20, 0, NULL), "x") &&
          !strcmp(lt_gguf_arr_str(n20, 1, NULL), "y"));
    CHECK(lt_gguf_arr_arr(a, 3) == NULL);

    CHECK(lt_gguf_n_tensors(g) == N_SAMPLE_TENSORS);
    for (int t = 0; t < N_SAMPLE_TENSORS && t < lt_gguf_n_tensors(g); t++) {
        const struct sample_tensor *e = &sample_tensors[t];
        const struct lt_gguf_tensor_info *ti = lt_gguf_tensor(g, t);
        CHECK(!strcmp(ti->name, e->name), "tensor %d: %s", t, ti->name);
        CHECK(ti->type == e->type && ti->n_dims == e->n_dims, "%s", e->name);
        CHECK(!memcmp(ti->ne, e->ne, sizeof(e->ne)), "%s", e->name);
        CHECK(ti->nbytes == e->nbytes, "%s: %zu bytes", e->name, ti->nbytes);
        CHECK(ti->offset % alignment == 0, "%s", e->name);
        CHECK(!memcmp(ti->data, sample_data[t], e->nbytes), "%s: data", e->name);
        CHECK(lt_gguf_find_tensor(g, e->name) == t, "%s", e->name);
    }
    CHECK(lt_gguf_find_tensor(g, "nope") == -1 && lt_gguf_find_tensor(g, "") == -1);
    CHECK(lt_gguf_tensor(g, -1) == NULL && lt_gguf_tensor(g, N_SAMPLE_TENSORS) == NULL);

    /* typed getters: friendly widening, refusal naming the key */
    CHECK(lt_gguf_get_u64(g, "test.u8", &u64) == LT_OK && u64 == 200);
    CHECK(lt_gguf_get_i64(g, "test.u32", &i64) == LT_OK && i64 == 4000000000ll);
    CHECK(lt_gguf_get_f64(g, "test.f32", &f64) == LT_OK && f64 == 3.25);
    CHECK(lt_gguf_get_f32(g, "test.f64", &f32) == LT_OK && f32 == (float)-2.5e-300);
    u32 = 12345;
    CHECK(lt_gguf_get_u32(g, "test.i8", &u32) == LT_ERR_FORMAT && u32 == 12345);
    CHECK(strstr(lt_last_error(), "'test.i8'") && strstr(lt_last_error(), "-100"), "%s",
          lt_last_error());
    CHECK(lt_gguf_get_i32(g, "test.u32", &i32) == LT_ERR_FORMAT); /* 4e9 does not fit */
    CHECK(lt_gguf_get_u32(g, "test.u64", &u32) == LT_ERR_FORMAT);
    CHECK(lt_gguf_get_i64(g, "test.u64", &i64) == LT_ERR_FORMAT);
    CHECK(lt_gguf_get_u32(g, "test.str", &u32) == LT_ERR_FORMAT);
    CHECK(strstr(lt_last_error(), "'test.str' is string"), "%s", lt_last_error());
    CHECK(lt_gguf_get_f32(g, "test.u8", &f32) == LT_ERR_FORMAT);
    CHECK(lt_gguf_get_str(g, "test.bool", &s) == LT_ERR_FORMAT);
    CHECK(lt_gguf_get_bool(g, "test.u8", &b) == LT_ERR_FORMAT);
    CHECK(lt_gguf_get_arr(g, "test.arr_u8", LT_GGUF_TYPE_STRING, &a) == LT_ERR_FORMAT);
    CHECK(strstr(lt_last_error(), "array of u8"), "%s", lt_last_error());
    CHECK(lt_gguf_get_u32(g, "llama.block_count", &u32) == LT_ERR_FORMAT);
    CHECK(strstr(lt_last_error(), "missing key 'llama.block_count'"), "%s", lt_last_error());
    CHECK(lt_gguf_find_key(g, "llama.block_count") == -1);
}

/* ================================================================ helpers */

static char tmpdir[256];

static char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static uint8_t *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n + 1);
    *size = fread(p, 1, (size_t)n, f);
    fclose(f);
    return p;
}

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t k = fwrite(p, 1, n, f);
    fclose(f);
    return k == n ? 0 : -1;
}

/* Entries of tmpdir whose name contains `part`. */
static int count_entries(const char *part)
{
    int n = 0;
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, part))
            n++;
    if (d)
        closedir(d);
    return n;
}

/* ================================================================ round trip */

static void test_round_trip(void)
{
    const char *path = tmp_path("sample.gguf");
    CHECK(sample_write(path, 0) == LT_OK, "%s", lt_last_error());
    struct lt_gguf *g = NULL;
    CHECK(lt_gguf_open(path, &g) == LT_OK, "%s", lt_last_error());
    if (!g)
        return;
    check_sample(g, 32);

    /* copy everything through a second writer: the bytes must come out identical */
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    CHECK(lt_gguf_writer_copy_kv(w, g) == LT_OK);
    for (int64_t i = 0; i < lt_gguf_n_tensors(g); i++) {
        const struct lt_gguf_tensor_info *t = lt_gguf_tensor(g, i);
        CHECK(lt_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                        t->nbytes) == LT_OK);
    }
    const char *copy = tmp_path("copy.gguf");
    CHECK(lt_gguf_writer_write(w, copy) == LT_OK, "%s", lt_last_error());
    lt_gguf_writer_free(w);
    size_t n1 = 0, n2 = 0;
    uint8_t *b1 = read_file(path, &n1), *b2 = read_file(copy, &n2);
    CHECK(b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1), "copy differs (%zu vs %zu bytes)", n1, n2);

    /* the same bytes through the in-memory reader */
    struct lt_gguf *m = NULL;
    CHECK(lt_gguf_open_memory(b1, n1, &m) == LT_OK, "%s", lt_last_error());
    if (m)
        check_sample(m, 32);
    lt_gguf_close(m);
    free(b1);
    free(b2);
    lt_gguf_close(g);

    /* general.alignment = 64 moves the data section and every tensor onto 64 bytes */
    const char *p64 = tmp_path("align64.gguf");
    CHECK(sample_write(p64, 64) == LT_OK, "%s", lt_last_error());
    CHECK(lt_gguf_open(p64, &g) == LT_OK, "%s", lt_last_error());
    if (g) {
        check_sample(g, 64);
        uint32_t al = 0;
        CHECK(lt_gguf_get_u32(g, "general.alignment", &al) == LT_OK && al == 64);
        lt_gguf_close(g);
    }
}

static void test_writer_keys(void)
{
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    CHECK(lt_gguf_writer_set_u32(w, "k.a", 1) == LT_OK);
    CHECK(lt_gguf_writer_set_str(w, "k.b", "first") == LT_OK);
    CHECK(lt_gguf_writer_set_u32(w, "k.c", 3) == LT_OK);
    CHECK(lt_gguf_writer_set_str(w, "k.a", "replaced") == LT_OK); /* type changes too */
    CHECK(lt_gguf_writer_n_kv(w) == 3);
    lt_gguf_writer_remove(w, "k.b");
    lt_gguf_writer_remove(w, "k.none");
    CHECK(lt_gguf_writer_n_kv(w) == 2);
    CHECK(lt_gguf_writer_set_u64(w, "general.alignment", 64) == LT_ERR_INVALID);
    CHECK(lt_gguf_writer_set_u32(w, "general.alignment", 48) == LT_ERR_INVALID);
    CHECK(lt_gguf_writer_set_arr(w, "k.bad", LT_GGUF_TYPE_STRING, NULL, 0) == LT_ERR_INVALID);
    CHECK(lt_gguf_writer_n_kv(w) == 2);

    /* tensors: wrong byte counts, bad shapes, duplicates are refused when added */
    float data[64] = {0};
    int64_t ne[2] = {8, 2};
    CHECK(lt_gguf_writer_add_tensor(w, "x", LT_TYPE_F32, 2, ne, data, 60) == LT_ERR_INVALID);
    CHECK(lt_gguf_writer_add_tensor(w, "x", LT_TYPE_F32, 2, ne, data, 64) == LT_OK);
    CHECK(lt_gguf_writer_add_tensor(w, "x", LT_TYPE_F32, 2, ne, data, 64) == LT_ERR_INVALID);
    CHECK(lt_gguf_writer_add_tensor(w, "q", LT_TYPE_Q8_0, 2, ne, data, 64) == LT_ERR_INVALID);
    CHECK(lt_gguf_writer_add_tensor(w, "z", LT_TYPE_F32, 0, ne, data, 4) == LT_ERR_INVALID);
    CHECK(lt_gguf_writer_add_tensor(w, "u", (enum lt_type)4, 2, ne, data, 64) == LT_ERR_INVALID);
    char longname[80];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[79] = '\0';
    CHECK(lt_gguf_writer_add_tensor(w, longname, LT_TYPE_F32, 2, ne, data, 64) == LT_ERR_INVALID);

    const char *path = tmp_path("keys.gguf");
    CHECK(lt_gguf_writer_write(w, path) == LT_OK, "%s", lt_last_error());
    lt_gguf_writer_free(w);
    struct lt_gguf *g = NULL;
    CHECK(lt_gguf_open(path, &g) == LT_OK, "%s", lt_last_error());
    if (g) {
        const char *s = NULL;
        uint32_t c = 0;
        CHECK(lt_gguf_n_kv(g) == 2 && !strcmp(lt_gguf_key(g, 0), "k.a") &&
              !strcmp(lt_gguf_key(g, 1), "k.c"));
        CHECK(lt_gguf_get_str(g, "k.a", &s) == LT_OK && !strcmp(s, "replaced"));
        CHECK(lt_gguf_get_u32(g, "k.c", &c) == LT_OK && c == 3);
        CHECK(lt_gguf_n_tensors(g) == 1);
        lt_gguf_close(g);
    }
}

/* ================================================================ atomic writes */

static lt_status fill_fails(void *user, void *dst, size_t nbytes)
{
    memset(dst, 0, nbytes);
    return lt_fail(LT_ERR_IO, "the source of '%s' went away", (const char *)user);
}

static lt_status fill_ramp(void *user, void *dst, size_t nbytes)
{
    for (size_t i = 0; i < nbytes; i++)
        ((uint8_t *)dst)[i] = (uint8_t)i;
    return LT_OK;
}

static void test_atomic_write(void)
{
    int64_t ne[1] = {64};
    const char *path = tmp_path("atomic.gguf");

    /* a write that fails part way leaves nothing at all */
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    lt_gguf_writer_set_str(w, "general.name", "atomic");
    lt_gguf_writer_add_tensor_fill(w, "ok", LT_TYPE_F32, 1, ne, 256, fill_ramp, NULL);
    lt_gguf_writer_add_tensor_fill(w, "bad", LT_TYPE_F32, 1, ne, 256, fill_fails, "bad");
    CHECK(lt_gguf_writer_write(w, path) == LT_ERR_IO);
    CHECK(strstr(lt_last_error(), "went away"), "%s", lt_last_error());
    CHECK(access(path, F_OK) != 0, "a failed write left %s", path);
    CHECK(count_entries("atomic.gguf") == 0, "a temporary file was left behind");

    /* over an existing file: a failed write leaves the old file as it was */
    const char old[] = "the old contents";
    write_file(path, old, sizeof(old));
    CHECK(lt_gguf_writer_write(w, path) == LT_ERR_IO);
    size_t n = 0;
    uint8_t *b = read_file(path, &n);
    CHECK(b && n == sizeof(old) && !memcmp(b, old, n), "the old file was touched");
    free(b);
    CHECK(count_entries("atomic.gguf.tmp") == 0, "a temporary file was left behind");
    lt_gguf_writer_free(w);

    /* a successful write replaces it; the fill callback's bytes are what is read back */
    w = lt_gguf_writer_new();
    lt_gguf_writer_add_tensor_fill(w, "ok", LT_TYPE_F32, 1, ne, 256, fill_ramp, NULL);
    CHECK(lt_gguf_writer_write(w, path) == LT_OK, "%s", lt_last_error());
    struct lt_gguf *g = NULL;
    CHECK(lt_gguf_open(path, &g) == LT_OK, "%s", lt_last_error());
    if (g) {
        const uint8_t *d = lt_gguf_tensor(g, 0)->data;
        int bad = 0;
        for (int i = 0; i < 256; i++)
            bad += d[i] != (uint8_t)i;
        CHECK(bad == 0);
        lt_gguf_close(g);
    }
    CHECK(count_entries(".tmp-") == 0);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0444) == 0444, "mode %o", sb.st_mode);

    /* a directory that does not exist: an I/O error, nothing created */
    CHECK(lt_gguf_writer_write(w, tmp_path("no/such/dir/x.gguf")) == LT_ERR_IO);
    lt_gguf_writer_free(w);

    /* open: missing file and directory are I/O errors, an empty file a format error */
    CHECK(lt_gguf_open(tmp_path("missing.gguf"), &g) == LT_ERR_IO && g == NULL);
    CHECK(lt_gguf_open(tmpdir, &g) == LT_ERR_IO && g == NULL);
    write_file(tmp_path("empty.gguf"), "", 0);
    CHECK(lt_gguf_open(tmp_path("empty.gguf"), &g) == LT_ERR_FORMAT && g == NULL);
    CHECK(lt_gguf_open_memory(NULL, 0, &g) == LT_ERR_FORMAT && g == NULL);
}

/* A write killed part way leaves "NAME.tmp-XXXXXX" behind. lt_gguf_remove_stale_temps
 * removes exactly those (of one name, or of any .gguf name), never anything else and never
 * one a live writer holds; a write and a writability check of NAME remove NAME's first. */
static void test_stale_temps(void)
{
    static const char gguf_head[] = "GGUF\x03\x00\x00\x00partial";
    struct {
        const char *name;
        const char *content; /* NULL: a directory; "->": a symlink to a stale temporary */
        bool stale_for_any, stale_for_out;
    } files[] = {
        {"out.gguf.tmp-AbC123", gguf_head, true, true},
        {"out.gguf.tmp-000000", "", true, true},
        {"other.gguf.tmp-ZZzz99", gguf_head, true, false},
        {"out.gguf", gguf_head, false, false},
        {"out.gguf.tmp-abc12", gguf_head, false, false},   /* five random characters */
        {"out.gguf.tmp-abc1234", gguf_head, false, false}, /* seven */
        {"out.gguf.tmp-abc_12", gguf_head, false, false},  /* not mkstemp's alphabet */
        {"out.gguf.tmp-qwerty", "hello, not a model", false, false},
        {"notes.txt.tmp-abcdef", gguf_head, false, false}, /* any name: .gguf only */
        {".tmp-abcdef", gguf_head, false, false},          /* no name before the tag */
        {"out.gguf.TMP-abcdef", gguf_head, false, false},
        {"out.gguf.tmp-dir000", NULL, false, false},
        {"out.gguf.tmp-link00", "->", false, false},
        {"held.gguf.tmp-Held01", gguf_head, false, false}, /* a live writer's (locked below) */
    };
    const int n_files = (int)(sizeof(files) / sizeof(files[0]));
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/stale", tmpdir);
    CHECK(mkdir(dir, 0755) == 0);
    char target[700];
    snprintf(target, sizeof(target), "%s/elsewhere.gguf.tmp-aaaaaa", tmpdir);
    write_file(target, gguf_head, sizeof(gguf_head) - 1);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n_files; i++) {
            char path[800];
            snprintf(path, sizeof(path), "%s/%s", dir, files[i].name);
            if (!files[i].content)
                mkdir(path, 0755);
            else if (!strcmp(files[i].content, "->"))
                CHECK(symlink(target, path) == 0 || access(path, F_OK) == 0);
            else if (access(path, F_OK) != 0)
                write_file(path, files[i].content, strlen(files[i].content));
        }
        char held[800];
        snprintf(held, sizeof(held), "%s/held.gguf.tmp-Held01", dir);
        int hfd = open(held, O_RDONLY);
        CHECK(hfd >= 0 && flock(hfd, LOCK_EX) == 0, "lock %s", held);
        int n = -1;
        CHECK(lt_gguf_remove_stale_temps(dir, pass == 0 ? "out.gguf" : NULL, &n) == LT_OK, "%s",
              lt_last_error());
        int want = 0;
        for (int i = 0; i < n_files; i++) {
            bool stale = pass == 0 ? files[i].stale_for_out : files[i].stale_for_any;
            char path[800];
            snprintf(path, sizeof(path), "%s/%s", dir, files[i].name);
            struct stat sb;
            bool there = lstat(path, &sb) == 0;
            want += stale;
            CHECK(there != stale, "%s: %s", pass == 0 ? "name out.gguf" : "any .gguf name",
                  files[i].name);
        }
        CHECK(n == want, "%d removed, %d expected", n, want);
        close(hfd);
    }
    int n_after = 0;
    CHECK(lt_gguf_remove_stale_temps(dir, NULL, &n_after) == LT_OK && n_after == 1 &&
              access(tmp_path("stale/held.gguf.tmp-Held01"), F_OK) != 0,
          "once its writer let go, the held temporary goes too (%d removed)", n_after);
    CHECK(access(target, F_OK) == 0, "a symlink's target is never touched");
    CHECK(lt_gguf_remove_stale_temps(tmp_path("no-such-dir"), NULL, NULL) == LT_ERR_IO);

    /* the writer and the writability check clear their own name's first */
    char path[800], stale[800], other[800];
    snprintf(path, sizeof(path), "%s/w.gguf", dir);
    snprintf(stale, sizeof(stale), "%s/w.gguf.tmp-k1LLed", dir);
    snprintf(other, sizeof(other), "%s/v.gguf.tmp-k1LLed", dir);
    write_file(stale, gguf_head, sizeof(gguf_head) - 1);
    write_file(other, gguf_head, sizeof(gguf_head) - 1);
    CHECK(lt_gguf_check_writable(path) == LT_OK, "%s", lt_last_error());
    CHECK(access(stale, F_OK) != 0 && access(other, F_OK) == 0,
          "the check removed w.gguf's stale temporary, not v.gguf's");
    write_file(stale, "", 0);
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    lt_gguf_writer_set_str(w, "general.name", "after a kill");
    CHECK(lt_gguf_writer_write(w, path) == LT_OK, "%s", lt_last_error());
    lt_gguf_writer_free(w);
    CHECK(access(stale, F_OK) != 0 && access(path, F_OK) == 0 && access(other, F_OK) == 0,
          "the write removed w.gguf's stale temporary and wrote w.gguf");
}

/* ================================================================ hand-built files */

struct bytes {
    uint8_t p[4096];
    size_t n;
};

static size_t put(struct bytes *b, const void *p, size_t n)
{
    size_t at = b->n;
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return at;
}
static size_t put_u32(struct bytes *b, uint32_t v) { return put(b, &v, 4); }
static size_t put_u64(struct bytes *b, uint64_t v) { return put(b, &v, 8); }
static size_t put_str(struct bytes *b, const char *s)
{
    size_t at = put_u64(b, strlen(s));
    put(b, s, strlen(s));
    return at;
}
static void pad_to(struct bytes *b, size_t a)
{
    while (b->n % a)
        b->p[b->n++] = 0;
}
static void patch_u32(struct bytes *b, size_t at, uint32_t v) { memcpy(b->p + at, &v, 4); }
static void patch_u64(struct bytes *b, size_t at, uint64_t v) { memcpy(b->p + at, &v, 8); }

/* Offsets of the fields of the hand-built file, recorded while building it. */
struct hand {
    size_t version, n_tensors, n_kv;
    size_t kv0_key, kv0_type, kv1_key, kv1_elem, kv1_count, kv1_str0;
    size_t t0_name, t0_ndims, t0_ne0, t0_ne1, t0_type, t0_offset;
    size_t t1_name, t1_ndims, t1_ne0, t1_type, t1_offset;
};

/* GGUF v3: keys "a" = u32 7, "b" = [string "x"]; tensors "w" q8_0 [32, 2] (68 bytes) at 0
 * and "v" f32 [8] (32 bytes) at 96; the file ends exactly where v's data does. */
static void hand_build(struct bytes *b, struct hand *h)
{
    b->n = 0;
    put(b, "GGUF", 4);
    h->version = put_u32(b, 3);
    h->n_tensors = put_u64(b, 2);
    h->n_kv = put_u64(b, 2);
    h->kv0_key = put_str(b, "a");
    h->kv0_type = put_u32(b, LT_GGUF_TYPE_U32);
    put_u32(b, 7);
    h->kv1_key = put_str(b, "b");
    put_u32(b, LT_GGUF_TYPE_ARRAY);
    h->kv1_elem = put_u32(b, LT_GGUF_TYPE_STRING);
    h->kv1_count = put_u64(b, 1);
    h->kv1_str0 = put_str(b, "x");
    h->t0_name = put_str(b, "w");
    h->t0_ndims = put_u32(b, 2);
    h->t0_ne0 = put_u64(b, 32);
    h->t0_ne1 = put_u64(b, 2);
    h->t0_type = put_u32(b, LT_TYPE_Q8_0);
    h->t0_offset = put_u64(b, 0);
    h->t1_name = put_str(b, "v");
    h->t1_ndims = put_u32(b, 1);
    h->t1_ne0 = put_u64(b, 8);
    h->t1_type = put_u32(b, LT_TYPE_F32);
    h->t1_offset = put_u64(b, 96);
    pad_to(b, 32);
    for (int i = 0; i < 128; i++)
        b->p[b->n++] = (uint8_t)(i + 1);
}

/* Opens b; expects a refusal (LT_ERR_FORMAT) whose message has "offset AT:" and each of
 * the given fragments. */
static void expect_refusal(const char *what, const struct bytes *b, size_t at,
                           const char *frag1, const char *frag2)
{
    struct lt_gguf *g = (struct lt_gguf *)1;
    lt_status st = lt_gguf_open_memory(b->p, b->n, &g);
    CHECK(st == LT_ERR_FORMAT && g == NULL, "%s: status %d", what, (int)st);
    char off[48];
    snprintf(off, sizeof(off), "offset %zu:", at);
    const char *msg = lt_last_error();
    CHECK(strstr(msg, off), "%s: wanted '%s' in: %s", what, off, msg);
    CHECK(!frag1 || strstr(msg, frag1), "%s: wanted '%s' in: %s", what, frag1, msg);
    CHECK(!frag2 || strstr(msg, frag2), "%s: wanted '%s' in: %s", what, frag2, msg);
    if (st != LT_ERR_FORMAT)
        lt_gguf_close(st == LT_OK ? g : NULL);
}

/* One f32 [8] tensor called `name`, no keys; returns the offset of the name. */
static size_t one_tensor_file(struct bytes *k, const char *name)
{
    k->n = 0;
    put(k, "GGUF", 4);
    put_u32(k, 3);
    put_u64(k, 1);
    put_u64(k, 0);
    size_t at = put_str(k, name);
    put_u32(k, 1);
    put_u64(k, 8);
    put_u32(k, LT_TYPE_F32);
    put_u64(k, 0);
    pad_to(k, 32);
    for (int i = 0; i < 32; i++)
        k->p[k->n++] = 0;
    return at;
}

static void test_hand_built(void)
{
    struct bytes b;
    struct hand h;
    hand_build(&b, &h);
    CHECK(b.n == 288, "hand-built file is %zu bytes", b.n); /* 160 header + 128 data */
    struct lt_gguf *g = NULL;
    CHECK(lt_gguf_open_memory(b.p, b.n, &g) == LT_OK, "%s", lt_last_error());
    if (g) {
        CHECK(lt_gguf_data_offset(g) == 160 && lt_gguf_n_kv(g) == 2 && lt_gguf_n_tensors(g) == 2);
        CHECK(lt_gguf_tensor(g, 1)->data == b.p + 256 && lt_gguf_tensor(g, 0)->nbytes == 68);
        lt_gguf_close(g);
    }
    /* version 2 has the same layout and is accepted */
    patch_u32(&b, h.version, 2);
    CHECK(lt_gguf_open_memory(b.p, b.n, &g) == LT_OK && lt_gguf_version(g) == 2);
    lt_gguf_close(g);

#define CASE(what, patch, at, f1, f2)                                                      \
    do {                                                                                   \
        hand_build(&b, &h);                                                                \
        patch;                                                                             \
        expect_refusal(what, &b, at, f1, f2);                                              \
    } while (0)

    CASE("magic", b.p[0] = 'X', 0, "header", "bad magic");
    CASE("version 1", patch_u32(&b, h.version, 1), 4, "version 1", NULL);
    CASE("version 4", patch_u32(&b, h.version, 4), 4, "unsupported version 4", NULL);
    CASE("big-endian", patch_u32(&b, h.version, 0x03000000), 4, "big-endian", NULL);
    CASE("n_kv absurd", patch_u64(&b, h.n_kv, 1ull << 60), 16, "keys cannot fit", NULL);
    CASE("n_kv too many", patch_u64(&b, h.n_kv, 40), 16, "keys cannot fit", NULL);
    CASE("n_tensors absurd", patch_u64(&b, h.n_tensors, ~0ull), 8, "tensor infos", NULL);
    CASE("key length past EOF", patch_u64(&b, h.kv0_key, 1ull << 40), h.kv0_key, "key 0",
         "past the end of the file");
    CASE("unknown value type", patch_u32(&b, h.kv0_type, 13), h.kv0_type, "key 'a'",
         "unknown value type 13");
    CASE("unknown element type", patch_u32(&b, h.kv1_elem, 99), h.kv1_elem, "key 'b'",
         "unknown array element type 99");
    CASE("array count absurd", patch_u64(&b, h.kv1_count, 1ull << 62), h.kv1_count, "key 'b'",
         "array of");
    CASE("array string past EOF", patch_u64(&b, h.kv1_str0, 10000), h.kv1_str0, "key 'b'",
         "past the end");
    CASE("duplicate key", b.p[h.kv1_key + 8] = 'a', h.kv1_key, "key 'a'", "more than once");
    CASE("0 dims", patch_u32(&b, h.t0_ndims, 0), h.t0_ndims, "tensor 'w'", "0 dimensions");
    CASE("5 dims", patch_u32(&b, h.t0_ndims, 5), h.t0_ndims, "tensor 'w'", "5 dimensions");
    CASE("negative ne", patch_u64(&b, h.t0_ne1, (uint64_t)-2), h.t0_ne1, "tensor 'w'", "negative");
    CASE("element count overflow",
         (patch_u64(&b, h.t0_ne0, 32ull << 30), patch_u64(&b, h.t0_ne1, 1ull << 40)), h.t0_ne1,
         "tensor 'w'", "overflows");
    CASE("byte size overflow", patch_u64(&b, h.t1_ne0, 1ull << 62), h.t1_type, "tensor 'v'",
         "overflows");
    CASE("unknown tensor type", patch_u32(&b, h.t0_type, 4), h.t0_type, "tensor 'w'",
         "unknown tensor type 4");
    CASE("tensor type past the table", patch_u32(&b, h.t0_type, 1000), h.t0_type, "tensor 'w'",
         "unknown tensor type 1000");
    CASE("ne0 not a block multiple", patch_u64(&b, h.t0_ne0, 33), h.t0_type, "tensor 'w'",
         "block size 32");
    CASE("misaligned offset", patch_u64(&b, h.t1_offset, 97), h.t1_offset, "tensor 'v'",
         "alignment");
    CASE("data past EOF", patch_u64(&b, h.t1_offset, 128), h.t1_offset, "tensor 'v'",
         "data ends past the end of the file");
    CASE("offset huge", patch_u64(&b, h.t1_offset, ~0ull << 5), h.t1_offset, "tensor 'v'",
         "past the end");
    CASE("overlap", patch_u64(&b, h.t1_offset, 64), h.t1_offset, "tensor 'v'", "overlaps tensor 'w'");
    CASE("duplicate tensor name", b.p[h.t1_name + 8] = 'w', h.t1_name, "tensor 'w'",
         "more than once");
    CASE("NUL in tensor name", b.p[h.t1_name + 8] = 0, h.t1_name, "tensor 1", "NUL");
    CASE("NUL in key", b.p[h.kv0_key + 8] = 0, h.kv0_key, "key 0", "NUL");
    CASE("truncated data", b.n -= 1, h.t1_offset, "tensor 'v'", "past the end");
#undef CASE

    /* files with one key, built from scratch */
    struct bytes k;
    size_t at;
#define ONE_KV_HEADER(k)                                                                   \
    do {                                                                                   \
        (k).n = 0;                                                                         \
        put(&(k), "GGUF", 4);                                                              \
        put_u32(&(k), 3);                                                                  \
        put_u64(&(k), 0);                                                                  \
        put_u64(&(k), 1);                                                                  \
    } while (0)

    /* arrays nested 8 deep are fine, 9 deep are refused */
    for (int depth = 8; depth <= 9; depth++) {
        ONE_KV_HEADER(k);
        put_str(&k, "deep");
        put_u32(&k, LT_GGUF_TYPE_ARRAY);
        size_t deepest = 0;
        for (int d = 0; d < depth; d++) {
            deepest = k.n;
            put_u32(&k, d + 1 < depth ? LT_GGUF_TYPE_ARRAY : LT_GGUF_TYPE_U8);
            put_u64(&k, d + 1 < depth ? 1 : 0);
        }
        if (depth == 8) {
            CHECK(lt_gguf_open_memory(k.p, k.n, &g) == LT_OK, "%s", lt_last_error());
            lt_gguf_close(g);
        } else {
            expect_refusal("nested 9 deep", &k, deepest, "key 'deep'", "nested");
        }
    }
    ONE_KV_HEADER(k);
    put_str(&k, "general.alignment");
    put_u32(&k, LT_GGUF_TYPE_U64);
    at = put_u64(&k, 64);
    expect_refusal("alignment u64", &k, at, "general.alignment", "must be a u32");
    ONE_KV_HEADER(k);
    put_str(&k, "general.alignment");
    put_u32(&k, LT_GGUF_TYPE_U32);
    at = put_u32(&k, 24);
    expect_refusal("alignment 24", &k, at, "general.alignment", "power of two");
    ONE_KV_HEADER(k);
    put_str(&k, "general.alignment");
    put_u32(&k, LT_GGUF_TYPE_U32);
    at = put_u32(&k, 0);
    expect_refusal("alignment 0", &k, at, "general.alignment", "power of two");
    ONE_KV_HEADER(k);
    put_str(&k, "s");
    put_u32(&k, LT_GGUF_TYPE_STRING);
    at = put_u64(&k, 5);
    put(&k, "abcd", 4);
    expect_refusal("string one byte short", &k, at, "key 's'", "past the end");

    /* found by the fuzzer: a 0-byte tensor in a file that ends before its data section
     * would point past the end; refused */
    k.n = 0;
    put(&k, "GGUF", 4);
    put_u32(&k, 3);
    put_u64(&k, 1);
    put_u64(&k, 0);
    put_str(&k, "z");
    put_u32(&k, 2);
    put_u64(&k, 32);
    put_u64(&k, 0);
    put_u32(&k, LT_TYPE_F32);
    at = put_u64(&k, 0);
    expect_refusal("empty tensor past the end", &k, at, "tensor 'z'", "past the end");
    pad_to(&k, 32); /* with the data section present, a 0-byte tensor is fine */
    CHECK(lt_gguf_open_memory(k.p, k.n, &g) == LT_OK, "%s", lt_last_error());
    if (g)
        CHECK(lt_gguf_tensor(g, 0)->nbytes == 0 && lt_gguf_tensor(g, 0)->data == k.p + k.n);
    lt_gguf_close(g);

    /* a zero dim must not hide that the other dims' product overflows */
    k.n = 0;
    put(&k, "GGUF", 4);
    put_u32(&k, 3);
    put_u64(&k, 1);
    put_u64(&k, 0);
    put_str(&k, "z");
    put_u32(&k, 3);
    put_u64(&k, 0);
    put_u64(&k, 1ull << 40);
    at = put_u64(&k, 1ull << 40);
    put_u32(&k, LT_TYPE_F32);
    put_u64(&k, 0);
    pad_to(&k, 32);
    expect_refusal("zero dim and overflow", &k, at, "tensor 'z'", "overflows");

    /* a 64-byte tensor name is one too long, 63 bytes is fine */
    char name[65];
    memset(name, 'n', 64);
    name[64] = 0;
    at = one_tensor_file(&k, name);
    expect_refusal("name too long", &k, at, "tensor 'nnnn", "at most 63");
    name[63] = 0;
    one_tensor_file(&k, name);
    CHECK(lt_gguf_open_memory(k.p, k.n, &g) == LT_OK, "%s", lt_last_error());
    lt_gguf_close(g);
#undef ONE_KV_HEADER
}

/* ================================================================ truncation */

/* Every proper prefix of a valid file whose last tensor ends at end-of-file is refused. */
static void check_all_prefixes(const char *what, const uint8_t *p, size_t n)
{
    int wrong_status = 0, accepted = 0;
    for (size_t len = 0; len < n; len++) {
        uint8_t *copy = malloc(len + 1); /* exactly len bytes, so ASan sees any overread */
        memcpy(copy, p, len);
        struct lt_gguf *g = NULL;
        lt_status st = lt_gguf_open_memory(len ? copy : NULL, len, &g);
        if (st == LT_OK) {
            accepted++;
            lt_gguf_close(g);
        } else if (st != LT_ERR_FORMAT) {
            wrong_status++;
        }
        free(copy);
    }
    CHECK(accepted == 0 && wrong_status == 0, "%s: %d prefixes accepted, %d other errors", what,
          accepted, wrong_status);
}

static void test_truncation(void)
{
    struct bytes b;
    struct hand h;
    hand_build(&b, &h);
    check_all_prefixes("hand-built", b.p, b.n);

    size_t n = 0;
    uint8_t *p = read_file(tmp_path("sample.gguf"), &n);
    CHECK(p && n > 1000, "sample is %zu bytes", n);
    if (p)
        check_all_prefixes("sample", p, n);

    /* and through files, for a spread of prefixes */
    int bad = 0;
    for (size_t len = 0; p && len < n; len += 97) {
        const char *path = tmp_path("prefix.gguf");
        write_file(path, p, len);
        struct lt_gguf *g = NULL;
        if (lt_gguf_open(path, &g) != LT_ERR_FORMAT || g)
            bad++;
        if (!strstr(lt_last_error(), path))
            bad++;
    }
    CHECK(bad == 0);
    free(p);
}

/* ================================================================ modes for the Python test */

static void json_string(const char *s, uint64_t len)
{
    putchar('"');
    for (uint64_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void json_number(enum lt_gguf_type t, const void *p)
{
    switch (t) {
    case LT_GGUF_TYPE_U8: printf("%u", *(const uint8_t *)p); break;
    case LT_GGUF_TYPE_I8: printf("%d", *(const int8_t *)p); break;
    case LT_GGUF_TYPE_U16: printf("%u", *(const uint16_t *)p); break;
    case LT_GGUF_TYPE_I16: printf("%d", *(const int16_t *)p); break;
    case LT_GGUF_TYPE_U32: printf("%" PRIu32, *(const uint32_t *)p); break;
    case LT_GGUF_TYPE_I32: printf("%" PRId32, *(const int32_t *)p); break;
    case LT_GGUF_TYPE_U64: printf("%" PRIu64, *(const uint64_t *)p); break;
    case LT_GGUF_TYPE_I64: printf("%" PRId64, *(const int64_t *)p); break;
    case LT_GGUF_TYPE_F32: printf("%.9g", *(const float *)p); break;
    case LT_GGUF_TYPE_F64: printf("%.17g", *(const double *)p); break;
    case LT_GGUF_TYPE_BOOL: printf(*(const uint8_t *)p ? "true" : "false"); break;
    default: printf("null"); break;
    }
}

/* {"type": T, "value": V}; an array is {"type": "array", "elem": T, "value": [...]} with
 * nested arrays as such objects. */
static void json_value(const struct lt_gguf_value *v)
{
    printf("{\"type\": \"%s\", ", lt_gguf_type_name(v->type));
    if (v->type == LT_GGUF_TYPE_ARRAY) {
        printf("\"elem\": \"%s\", \"value\": [", lt_gguf_type_name(v->arr.type));
        for (uint64_t i = 0; i < v->arr.n; i++) {
            if (i)
                printf(", ");
            if (v->arr.type == LT_GGUF_TYPE_STRING) {
                uint64_t len;
                const char *s = lt_gguf_arr_str(v, i, &len);
                json_string(s, len);
            } else if (v->arr.type == LT_GGUF_TYPE_ARRAY) {
                json_value(lt_gguf_arr_arr(v, i));
            } else {
                json_number(v->arr.type,
                            (const char *)v->arr.data + i * lt_gguf_type_size(v->arr.type));
            }
        }
        printf("]}");
        return;
    }
    printf("\"value\": ");
    if (v->type == LT_GGUF_TYPE_STRING) {
        json_string(v->str.ptr, v->str.len);
    } else {
        union {
            uint8_t u8;
            uint16_t u16;
            uint32_t u32;
            uint64_t u64;
            float f32;
            double f64;
        } x;
        /* the value back in its own width, so json_number prints it as the file has it */
        if (v->type == LT_GGUF_TYPE_F32)
            x.f32 = (float)v->f64;
        else if (v->type == LT_GGUF_TYPE_F64)
            x.f64 = v->f64;
        else if (v->type == LT_GGUF_TYPE_BOOL)
            x.u8 = v->b;
        else
            x.u64 = v->u64; /* little-endian: the low bytes are the narrow value */
        json_number(v->type, &x);
    }
    printf("}");
}

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int dump_json(const char *path)
{
    struct lt_gguf *g;
    if (lt_gguf_open(path, &g) != LT_OK) {
        fprintf(stderr, "%s\n", lt_last_error());
        return 1;
    }
    printf("{\"version\": %u, \"alignment\": %zu, \"data_offset\": %zu,\n \"kv\": [\n",
           lt_gguf_version(g), lt_gguf_alignment(g), lt_gguf_data_offset(g));
    for (int64_t i = 0; i < lt_gguf_n_kv(g); i++) {
        printf("  [");
        json_string(lt_gguf_key(g, i), strlen(lt_gguf_key(g, i)));
        printf(", ");
        json_value(lt_gguf_kv_value(g, i));
        printf("]%s\n", i + 1 < lt_gguf_n_kv(g) ? "," : "");
    }
    printf(" ],\n \"tensors\": [\n");
    for (int64_t i = 0; i < lt_gguf_n_tensors(g); i++) {
        const struct lt_gguf_tensor_info *t = lt_gguf_tensor(g, i);
        printf("  {\"name\": ");
        json_string(t->name, strlen(t->name));
        printf(", \"type\": %d, \"type_name\": \"%s\", \"shape\": [", (int)t->type,
               lt_type_name(t->type));
        for (int d = 0; d < t->n_dims; d++)
            printf("%s%" PRId64, d ? ", " : "", t->ne[d]);
        printf("], \"offset\": %" PRIu64 ", \"nbytes\": %zu, \"fnv1a\": \"%016" PRIx64 "\"}%s\n",
               t->offset, t->nbytes, fnv1a(t->data, t->nbytes),
               i + 1 < lt_gguf_n_tensors(g) ? "," : "");
    }
    printf(" ]}\n");
    lt_gguf_close(g);
    return 0;
}

int main(int argc, char **argv)
{
    sample_data_init();
    if (argc == 3 && !strcmp(argv[1], "--write")) {
        if (sample_write(argv[2], 0) != LT_OK) {
            fprintf(stderr, "%s\n", lt_last_error());
            return 1;
        }
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--dump-json"))
        return dump_json(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: test_gguf [--write PATH | --dump-json PATH]\n");
        return 2;
    }

    snprintf(tmpdir, sizeof(tmpdir), "/tmp/lathe_test_gguf_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_writer_keys();
    test_atomic_write();
    test_stale_temps();
    test_hand_built();
    test_truncation();

    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    for (int t = 0; t < N_SAMPLE_TENSORS; t++)
        free(sample_data[t]);
    return check_summary();
}
