/* test_safetensors.c: the safetensors reader on files this test writes: a valid file read back
 * value by value, every corruption the reader must refuse (with the reason it gives), and
 * sharded checkpoints through model.safetensors.index.json, consistent and not; and the
 * golden Qwen3.5 checkpoint of tests/data/golden. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "lathe/tensor.h"
#include "convert/safetensors.h"

#ifndef LATHE_TEST_DATA_DIR
#error "LATHE_TEST_DATA_DIR (tests/data) is defined by tests/CMakeLists.txt"
#endif

/* ---- building files ---- */

struct blob {
    uint8_t *p;
    size_t n;
};

/* 8-byte little-endian header length, the header, then `data`. */
static struct blob make_blob(const char *header, const void *data, size_t ndata)
{
    size_t hl = strlen(header);
    struct blob b = {malloc(8 + hl + ndata + 1), 8 + hl + ndata};
    for (int i = 0; i < 8; i++)
        b.p[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b.p + 8, header, hl);
    if (ndata && data)
        memcpy(b.p + 8 + hl, data, ndata);
    else if (ndata)
        memset(b.p + 8 + hl, 0, ndata);
    return b;
}

static int write_file(const char *path, const struct blob *b)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(b->p, 1, b->n, f);
    fclose(f);
    return w == b->n ? 0 : -1;
}

static int write_text(const char *path, const char *text)
{
    struct blob b = {(uint8_t *)text, strlen(text)};
    return write_file(path, &b);
}

/* Opens bytes in memory and expects a refusal whose message contains `needle`. */
static void expect_refused(const char *what, const struct blob *b, const char *needle)
{
    struct lt_st_file *f = (struct lt_st_file *)1;
    lt_status st = lt_st_file_open_memory(b->p, b->n, what, &f);
    CHECK(st == LT_ERR_FORMAT, "%s: status %s", what, lt_status_name(st));
    CHECK(f == NULL, "%s: a refused file must not be handed out", what);
    CHECK(strstr(lt_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
          lt_last_error(), needle);
    lt_st_file_close(f);
}

static void expect_header_refused(const char *what, const char *header, size_t ndata,
                                  const char *needle)
{
    uint8_t *zeros = calloc(ndata + 1, 1);
    struct blob b = make_blob(header, zeros, ndata);
    expect_refused(what, &b, needle);
    free(b.p);
    free(zeros);
}

/* ---- a valid file ---- */

static void test_valid_file(void)
{
    /* a: F32 [2,3]; b: BF16 [4]; c: I64 scalar; d: F16 [1,2]; e: I32 [0] (empty) */
    uint8_t data[24 + 8 + 8 + 4 + 4];
    float a[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.125f, 1e6f};
    uint16_t b16[4] = {lt_fp32_to_bf16(1.0f), lt_fp32_to_bf16(-3.5f), lt_fp32_to_bf16(0.0078125f),
                       lt_fp32_to_bf16(256.0f)};
    int64_t c = -7;
    uint16_t d16[2] = {lt_fp32_to_fp16(0.5f), lt_fp32_to_fp16(-65504.0f)};
    int32_t e32 = 0;
    memcpy(data, a, 24);
    memcpy(data + 24, b16, 8);
    memcpy(data + 32, &c, 8);
    memcpy(data + 40, d16, 4);
    (void)e32;
    /* 4 unused bytes at the end would be a gap; use them for a second I32 tensor */
    int32_t g = 123456;
    memcpy(data + 44, &g, 4);
    const char *header =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"z.a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
        "\"y.b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
        "\"x.c\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[32,40]},"
        "\"w.d\":{\"dtype\":\"F16\",\"shape\":[1,2],\"data_offsets\":[40,44]},"
        "\"v.e\":{\"dtype\":\"I32\",\"shape\":[0,5],\"data_offsets\":[44,44]},"
        "\"u.g\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[44,48]}}   ";
    struct blob bl = make_blob(header, data, sizeof(data));
    struct lt_st_file *f = NULL;
    lt_status st = lt_st_file_open_memory(bl.p, bl.n, "valid", &f);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st != LT_OK) {
        free(bl.p);
        return;
    }
    CHECK(lt_st_file_n_tensors(f) == 6);
    CHECK(lt_st_file_metadata(f, "format") && !strcmp(lt_st_file_metadata(f, "format"), "pt"));
    CHECK(lt_st_file_metadata(f, "absent") == NULL);
    /* header order kept */
    const char *order[6] = {"z.a", "y.b", "x.c", "w.d", "v.e", "u.g"};
    for (int i = 0; i < 6; i++)
        CHECK(!strcmp(lt_st_file_tensor(f, i)->name, order[i]), "tensor %d is %s", i,
              lt_st_file_tensor(f, i)->name);
    CHECK(lt_st_file_tensor(f, 6) == NULL && lt_st_file_tensor(f, -1) == NULL);

    const struct lt_st_tensor *t = lt_st_file_find(f, "z.a");
    CHECK(t && t->dtype == LT_ST_F32 && t->n_dims == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
          t->n_elements == 6 && t->nbytes == 24);
    float out[8];
    if (t) {
        lt_st_tensor_read_f32(t, out);
        for (int i = 0; i < 6; i++)
            CHECK(out[i] == a[i], "z.a[%d] = %g, want %g", i, out[i], a[i]);
    }
    t = lt_st_file_find(f, "y.b");
    CHECK(t && t->dtype == LT_ST_BF16 && t->n_dims == 1 && t->shape[0] == 4);
    if (t) {
        lt_st_tensor_read_f32(t, out);
        const float want[4] = {1.0f, -3.5f, 0.0078125f, 256.0f};
        for (int i = 0; i < 4; i++)
            CHECK(out[i] == want[i], "y.b[%d] = %g", i, out[i]);
    }
    t = lt_st_file_find(f, "x.c");
    CHECK(t && t->dtype == LT_ST_I64 && t->n_dims == 0 && t->n_elements == 1);
    if (t) {
        lt_st_tensor_read_f32(t, out);
        CHECK(out[0] == -7.0f);
    }
    t = lt_st_file_find(f, "w.d");
    CHECK(t && t->dtype == LT_ST_F16);
    if (t) {
        lt_st_tensor_read_f32(t, out);
        CHECK(out[0] == 0.5f && out[1] == -65504.0f);
    }
    t = lt_st_file_find(f, "v.e");
    CHECK(t && t->n_elements == 0 && t->nbytes == 0);
    t = lt_st_file_find(f, "u.g");
    CHECK(t && t->dtype == LT_ST_I32);
    if (t) {
        lt_st_tensor_read_f32(t, out);
        CHECK(out[0] == 123456.0f);
    }
    CHECK(lt_st_file_find(f, "nope") == NULL);
    CHECK(lt_st_file_find(f, "") == NULL);
    lt_st_file_close(f);
    free(bl.p);
}

/* ---- corruptions ---- */

static void test_corrupt(void)
{
    /* too short for the length field */
    struct blob tiny = {(uint8_t *)"\x02\x00\x00", 3};
    expect_refused("tiny", &tiny, "too short");

    /* header length past the end of the file */
    struct blob b = make_blob("{}", NULL, 0);
    b.p[0] = 200;
    expect_refused("hlen-past-end", &b, "runs past the end");
    /* header length above the format's limit */
    b.p[0] = 0;
    b.p[4] = 1; /* 2^32 */
    expect_refused("hlen-huge", &b, "exceeds the format's limit");
    free(b.p);

    const char *ok1 = "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    char h[512];
    expect_header_refused("not-json", "{\"t\": [1, 2", 0, "header JSON");
    expect_header_refused("not-object", "[1,2,3]", 0, "not a JSON object");
    expect_header_refused("trailing-garbage", "{} xyz", 0, "header JSON");
    snprintf(h, sizeof(h), "{%s,%s}", ok1, ok1);
    expect_header_refused("duplicate-name", h, 8, "duplicate");
    expect_header_refused("entry-not-object", "{\"t\":5}", 0, "not an object");
    expect_header_refused("dtype-missing", "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                          "\"dtype\" is missing");
    expect_header_refused("dtype-unknown",
                          "{\"t\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                          "dtype 'F8_E4M3' is not supported");
    expect_header_refused("shape-missing", "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
                          "\"shape\" is missing");
    expect_header_refused("shape-negative",
                          "{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                          "shape[0] is not a non-negative integer");
    expect_header_refused("shape-float",
                          "{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
                          "shape[0]");
    expect_header_refused("shape-too-many-dims",
                          "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                          "\"data_offsets\":[0,4]}}",
                          4, "dimensions");
    expect_header_refused("shape-overflow",
                          "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
                          "\"data_offsets\":[0,4]}}",
                          4, "overflows");
    expect_header_refused("offsets-missing", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
                          "data_offsets");
    expect_header_refused("offsets-three",
                          "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
                          "pair");
    expect_header_refused("offsets-reversed",
                          "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4,
                          "end before");
    expect_header_refused("offsets-past-data",
                          "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                          "run past the data");
    expect_header_refused("size-mismatch",
                          "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                          "needs 12");
    expect_header_refused("bf16-size-mismatch",
                          "{\"t\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
                          "needs 8");
    expect_header_refused("overlap",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                          12, "overlap");
    expect_header_refused("gap",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                          12, "gap");
    expect_header_refused("trailing-bytes",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9,
                          "cover 4 bytes");
    expect_header_refused("metadata-not-string", "{\"__metadata__\":{\"k\":1}}", 0,
                          "is not a string");
    expect_header_refused("metadata-not-object", "{\"__metadata__\":[]}", 0, "not an object");
    expect_header_refused("empty-name",
                          "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                          "empty name");

    /* an empty header with no data is a valid (empty) file */
    struct blob e = make_blob("{}", NULL, 0);
    struct lt_st_file *f = NULL;
    CHECK(lt_st_file_open_memory(e.p, e.n, "empty", &f) == LT_OK && f &&
          lt_st_file_n_tensors(f) == 0);
    lt_st_file_close(f);
    free(e.p);
}

/* ---- files and checkpoints on disk ---- */

static char tmpdir[1024];

static void path_in(char *dst, size_t cap, const char *sub, const char *name)
{
    snprintf(dst, cap, "%s/%s/%s", tmpdir, sub, name);
}

static void make_dir(const char *sub)
{
    char p[1200];
    snprintf(p, sizeof(p), "%s/%s", tmpdir, sub);
    mkdir(p, 0755);
}

static void test_disk(void)
{
    float x[4] = {1, 2, 3, 4}, y[2] = {-1, -2}, z[3] = {7, 8, 9};
    struct blob s1 = make_blob("{\"m.x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                               "\"m.y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
                               NULL, 24);
    memcpy(s1.p + s1.n - 24, x, 16);
    memcpy(s1.p + s1.n - 8, y, 8);
    struct blob s2 = make_blob("{\"m.z\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}",
                               z, 12);
    char p[1300];

    /* one file, opened directly and as a directory holding model.safetensors */
    make_dir("single");
    path_in(p, sizeof(p), "single", "model.safetensors");
    CHECK(write_file(p, &s1) == 0, "cannot write %s", p);
    struct lt_st_file *f = NULL;
    CHECK(lt_st_file_open(p, &f) == LT_OK, "%s", lt_last_error());
    if (f) {
        const struct lt_st_tensor *t = lt_st_file_find(f, "m.y");
        float out[2];
        CHECK(t != NULL);
        if (t) {
            lt_st_tensor_read_f32(t, out);
            CHECK(out[0] == -1 && out[1] == -2);
            CHECK(!strcmp(t->path, p));
        }
    }
    lt_st_file_close(f);
    struct lt_st_checkpoint *c = NULL;
    snprintf(p, sizeof(p), "%s/single", tmpdir);
    CHECK(lt_st_checkpoint_open(p, &c) == LT_OK, "%s", lt_last_error());
    if (c) {
        CHECK(lt_st_checkpoint_n_files(c) == 1 && lt_st_checkpoint_n_tensors(c) == 2);
        CHECK(lt_st_checkpoint_find(c, "m.x") && lt_st_checkpoint_find(c, "m.x")->shape[1] == 2);
    }
    lt_st_checkpoint_close(c);

    /* a missing file and a directory with nothing in it */
    f = (struct lt_st_file *)1;
    path_in(p, sizeof(p), "single", "absent.safetensors");
    CHECK(lt_st_file_open(p, &f) == LT_ERR_IO && f == NULL);
    make_dir("nothing");
    snprintf(p, sizeof(p), "%s/nothing", tmpdir);
    c = (struct lt_st_checkpoint *)1;
    CHECK(lt_st_checkpoint_open(p, &c) == LT_ERR_IO && c == NULL);
    CHECK(strstr(lt_last_error(), "neither") != NULL, "%s", lt_last_error());
    /* a zero-length file */
    path_in(p, sizeof(p), "nothing", "zero.safetensors");
    CHECK(write_text(p, "") == 0);
    f = (struct lt_st_file *)1;
    CHECK(lt_st_file_open(p, &f) == LT_ERR_FORMAT && f == NULL);

    /* shards with an index */
    make_dir("sharded");
    path_in(p, sizeof(p), "sharded", "model-00001-of-00002.safetensors");
    CHECK(write_file(p, &s1) == 0);
    path_in(p, sizeof(p), "sharded", "model-00002-of-00002.safetensors");
    CHECK(write_file(p, &s2) == 0);
    path_in(p, sizeof(p), "sharded", "model.safetensors.index.json");
    CHECK(write_text(p, "{\"metadata\":{\"total_size\":36},\"weight_map\":{"
                        "\"m.z\":\"model-00002-of-00002.safetensors\","
                        "\"m.x\":\"model-00001-of-00002.safetensors\","
                        "\"m.y\":\"model-00001-of-00002.safetensors\"}}") == 0);
    snprintf(p, sizeof(p), "%s/sharded", tmpdir);
    c = NULL;
    CHECK(lt_st_checkpoint_open(p, &c) == LT_OK, "%s", lt_last_error());
    if (c) {
        CHECK(lt_st_checkpoint_n_files(c) == 2 && lt_st_checkpoint_n_tensors(c) == 3);
        /* shards in file-name order, each in header order */
        CHECK(!strcmp(lt_st_checkpoint_tensor(c, 0)->name, "m.x"));
        CHECK(!strcmp(lt_st_checkpoint_tensor(c, 1)->name, "m.y"));
        CHECK(!strcmp(lt_st_checkpoint_tensor(c, 2)->name, "m.z"));
        const struct lt_st_tensor *t = lt_st_checkpoint_find(c, "m.z");
        float out[3];
        CHECK(t != NULL);
        if (t) {
            lt_st_tensor_read_f32(t, out);
            CHECK(out[0] == 7 && out[1] == 8 && out[2] == 9);
            CHECK(strstr(t->path, "00002") != NULL);
        }
        CHECK(lt_st_checkpoint_find(c, "m.w") == NULL);
    }
    lt_st_checkpoint_close(c);

    /* inconsistent indexes */
    struct {
        const char *what, *index, *needle;
    } bad[] = {
        {"listed-in-wrong-shard",
         "{\"weight_map\":{\"m.z\":\"model-00001-of-00002.safetensors\","
         "\"m.x\":\"model-00001-of-00002.safetensors\","
         "\"m.y\":\"model-00002-of-00002.safetensors\"}}",
         "listed in"},
        {"unlisted-tensor",
         "{\"weight_map\":{\"m.z\":\"model-00002-of-00002.safetensors\","
         "\"m.x\":\"model-00001-of-00002.safetensors\"}}",
         "not in the index"},
        {"missing-tensor",
         "{\"weight_map\":{\"m.z\":\"model-00002-of-00002.safetensors\","
         "\"m.x\":\"model-00001-of-00002.safetensors\","
         "\"m.y\":\"model-00001-of-00002.safetensors\","
         "\"m.q\":\"model-00002-of-00002.safetensors\"}}",
         "lacks it"},
        {"escaping-path", "{\"weight_map\":{\"m.z\":\"../single/model.safetensors\"}}",
         "plain file name"},
        {"missing-shard", "{\"weight_map\":{\"m.z\":\"model-00003-of-00003.safetensors\"}}",
         "cannot open"},
        {"no-weight-map", "{\"metadata\":{}}", "weight_map"},
        {"bad-json", "{\"weight_map\":", "line"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        path_in(p, sizeof(p), "sharded", "model.safetensors.index.json");
        CHECK(write_text(p, bad[i].index) == 0);
        snprintf(p, sizeof(p), "%s/sharded", tmpdir);
        c = (struct lt_st_checkpoint *)1;
        lt_status st = lt_st_checkpoint_open(p, &c);
        CHECK(st != LT_OK && c == NULL, "%s: accepted", bad[i].what);
        CHECK(strstr(lt_last_error(), bad[i].needle) != NULL, "%s: message '%s' lacks '%s'",
              bad[i].what, lt_last_error(), bad[i].needle);
    }
    free(s1.p);
    free(s2.p);
}

/* The golden checkpoint (tests/data/golden/qwen35-tiny-a, part of the repository): every
 * tensor is F32 and its data lies inside the file. */
static void test_golden(void)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/golden/qwen35-tiny-a", LATHE_TEST_DATA_DIR);
    struct lt_st_checkpoint *c = NULL;
    if (lt_st_checkpoint_open(p, &c) != LT_OK) {
        CHECK(false, "golden checkpoint %s not readable: %s", p, lt_last_error());
        return;
    }
    const struct lt_st_tensor *t = lt_st_checkpoint_find(c, "model.embed_tokens.weight");
    CHECK(t && t->dtype == LT_ST_F32 && t->n_dims == 2 && t->shape[0] == 512 && t->shape[1] == 64);
    t = lt_st_checkpoint_find(c, "model.layers.0.linear_attn.conv1d.weight");
    CHECK(t && t->n_dims == 3 && t->shape[0] == 128 && t->shape[1] == 1 && t->shape[2] == 4);
    lt_st_checkpoint_close(c);
}

int main(void)
{
    const char *build = getenv("LATHE_BUILD_DIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/test_safetensors.tmp", build ? build : "/tmp");
    if (mkdir(tmpdir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "cannot make %s\n", tmpdir);
        return 1;
    }
    test_valid_file();
    test_corrupt();
    test_disk();
    test_golden();
    return check_summary();
}
