/* safetensors.c: the safetensors reader (one file, and checkpoints of one file or shards).
 *
 * Everything is validated at open, before any tensor is handed out: the header length against
 * the file, the JSON, each tensor's dtype, shape and byte range, and that the ranges tile the
 * data exactly. Sizes are computed with overflow checks, so a hostile header cannot make a
 * range wrap around. Names are looked up through an index sorted by name. */
#include "convert/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lathe/tensor.h"

#ifdef LATHE_HAVE_JANSSON
#include <jansson.h>
#endif

static const struct {
    const char *name;
    size_t size;
} st_dtypes[LT_ST_DTYPE_COUNT] = {
    [LT_ST_F32] = {"F32", 4}, [LT_ST_F16] = {"F16", 2}, [LT_ST_BF16] = {"BF16", 2},
    [LT_ST_I32] = {"I32", 4}, [LT_ST_I64] = {"I64", 8},
};

const char *lt_st_dtype_name(enum lt_st_dtype d)
{
    return (unsigned)d < LT_ST_DTYPE_COUNT ? st_dtypes[d].name : "?";
}

size_t lt_st_dtype_size(enum lt_st_dtype d)
{
    return (unsigned)d < LT_ST_DTYPE_COUNT ? st_dtypes[d].size : 0;
}

void lt_st_tensor_read_f32(const struct lt_st_tensor *t, float *dst)
{
    const uint8_t *p = t->data;
    int64_t n = t->n_elements;
    switch (t->dtype) {
    case LT_ST_F32:
        memcpy(dst, p, (size_t)n * 4);
        break;
    case LT_ST_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = lt_fp16_to_fp32(h);
        }
        break;
    case LT_ST_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = lt_bf16_to_fp32(h);
        }
        break;
    case LT_ST_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, p + 4 * i, 4);
            dst[i] = (float)v;
        }
        break;
    case LT_ST_I64:
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            dst[i] = (float)v;
        }
        break;
    default:
        memset(dst, 0, (size_t)n * sizeof(float));
        break;
    }
}

/* ================================ one file ================================ */

struct lt_st_file {
    char *path;
    void *map; /* NULL when reading caller's memory */
    size_t map_size;
    const uint8_t *bytes;
    size_t size;

    int64_t n_tensors;
    struct lt_st_tensor *tensors;
    char **names;     /* owned, one per tensor */
    const struct lt_st_tensor **by_name; /* sorted by name */

    int n_meta;
    char **meta_keys;
    char **meta_values;
};

static int cmp_tensor_name(const void *a, const void *b)
{
    const struct lt_st_tensor *x = *(const struct lt_st_tensor *const *)a;
    const struct lt_st_tensor *y = *(const struct lt_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* by_name: n pointers sorted by name. */
static const struct lt_st_tensor *find_sorted(const struct lt_st_tensor *const *by_name, int64_t n,
                                              const char *name)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(by_name[mid]->name, name);
        if (c == 0)
            return by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

void lt_st_file_close(struct lt_st_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_size);
    for (int64_t i = 0; i < f->n_tensors; i++)
        free(f->names[i]);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->names);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
}

int64_t lt_st_file_n_tensors(const struct lt_st_file *f) { return f->n_tensors; }

const struct lt_st_tensor *lt_st_file_tensor(const struct lt_st_file *f, int64_t i)
{
    return i >= 0 && i < f->n_tensors ? &f->tensors[i] : NULL;
}

const struct lt_st_tensor *lt_st_file_find(const struct lt_st_file *f, const char *name)
{
    return find_sorted(f->by_name, f->n_tensors, name);
}

const char *lt_st_file_metadata(const struct lt_st_file *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_keys[i], key))
            return f->meta_values[i];
    return NULL;
}

#ifdef LATHE_HAVE_JANSSON

static int dtype_from_name(const char *s)
{
    for (int d = 0; d < LT_ST_DTYPE_COUNT; d++)
        if (!strcmp(s, st_dtypes[d].name))
            return d;
    return -1;
}

static lt_status parse_metadata(struct lt_st_file *f, json_t *obj)
{
    if (!json_is_object(obj))
        return lt_fail(LT_ERR_FORMAT, "%s: header: \"__metadata__\" is not an object", f->path);
    size_t n = json_object_size(obj);
    f->meta_keys = calloc(n ? n : 1, sizeof(char *));
    f->meta_values = calloc(n ? n : 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values)
        return lt_fail(LT_ERR_NOMEM, "%s: out of memory reading the metadata", f->path);
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val)
    {
        if (!json_is_string(val))
            return lt_fail(LT_ERR_FORMAT, "%s: header: \"__metadata__\".\"%s\" is not a string",
                           f->path, key);
        f->meta_keys[f->n_meta] = strdup(key);
        f->meta_values[f->n_meta] = strdup(json_string_value(val));
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1])
            return lt_fail(LT_ERR_NOMEM, "%s: out of memory reading the metadata", f->path);
    }
    return LT_OK;
}

/* Reads a JSON integer that must be >= 0. */
static bool json_nonneg(json_t *v, int64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (int64_t)json_integer_value(v);
    return true;
}

static lt_status parse_tensor(struct lt_st_file *f, const char *name, json_t *obj,
                              struct lt_st_tensor *t, uint64_t data_size, uint64_t *begin_out)
{
    const char *path = f->path;
    if (!json_is_object(obj))
        return lt_fail(LT_ERR_FORMAT, "%s: tensor '%s': its header entry is not an object", path,
                       name);
    json_t *jdtype = json_object_get(obj, "dtype");
    json_t *jshape = json_object_get(obj, "shape");
    json_t *joffs = json_object_get(obj, "data_offsets");
    if (!json_is_string(jdtype))
        return lt_fail(LT_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is missing or not a string",
                       path, name);
    int d = dtype_from_name(json_string_value(jdtype));
    if (d < 0)
        return lt_fail(LT_ERR_FORMAT,
                       "%s: tensor '%s': dtype '%s' is not supported (F32, F16, BF16, I32, I64)",
                       path, name, json_string_value(jdtype));
    t->dtype = (enum lt_st_dtype)d;

    if (!json_is_array(jshape))
        return lt_fail(LT_ERR_FORMAT, "%s: tensor '%s': \"shape\" is missing or not an array",
                       path, name);
    size_t nd = json_array_size(jshape);
    if (nd > LT_ST_MAX_DIMS)
        return lt_fail(LT_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", path, name,
                       nd, LT_ST_MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t nel = 1;
    for (int i = 0; i < LT_ST_MAX_DIMS; i++)
        t->shape[i] = 1;
    for (size_t i = 0; i < nd; i++) {
        int64_t v;
        if (!json_nonneg(json_array_get(jshape, i), &v))
            return lt_fail(LT_ERR_FORMAT,
                           "%s: tensor '%s': shape[%zu] is not a non-negative integer", path,
                           name, i);
        t->shape[i] = v;
        if (__builtin_mul_overflow(nel, (uint64_t)v, &nel) || nel > (uint64_t)INT64_MAX)
            return lt_fail(LT_ERR_FORMAT, "%s: tensor '%s': the shape's element count overflows",
                           path, name);
    }
    t->n_elements = (int64_t)nel;
    uint64_t nbytes;
    if (__builtin_mul_overflow(nel, (uint64_t)st_dtypes[d].size, &nbytes))
        return lt_fail(LT_ERR_FORMAT, "%s: tensor '%s': the byte size overflows", path, name);

    int64_t begin, end;
    if (!json_is_array(joffs) || json_array_size(joffs) != 2 ||
        !json_nonneg(json_array_get(joffs, 0), &begin) ||
        !json_nonneg(json_array_get(joffs, 1), &end))
        return lt_fail(LT_ERR_FORMAT,
                       "%s: tensor '%s': \"data_offsets\" is not a pair of non-negative integers",
                       path, name);
    if (end < begin)
        return lt_fail(LT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] end before "
                                      "they begin",
                       path, name, (long long)begin, (long long)end);
    if ((uint64_t)end > data_size)
        return lt_fail(LT_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%lld, %lld] run past the data section "
                       "(%llu bytes)",
                       path, name, (long long)begin, (long long)end,
                       (unsigned long long)data_size);
    if ((uint64_t)(end - begin) != nbytes)
        return lt_fail(LT_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%lld, %lld] hold %lld bytes but %s with "
                       "%llu elements needs %llu",
                       path, name, (long long)begin, (long long)end, (long long)(end - begin),
                       st_dtypes[d].name, (unsigned long long)nel, (unsigned long long)nbytes);
    t->nbytes = (size_t)nbytes;
    *begin_out = (uint64_t)begin;
    return LT_OK;
}

struct range {
    uint64_t begin, end;
    int64_t tensor;
};

static int cmp_range(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* The byte ranges must tile [0, data_size) exactly. */
static lt_status check_tiling(struct lt_st_file *f, struct range *r, int64_t n, uint64_t data_size)
{
    qsort(r, (size_t)n, sizeof(*r), cmp_range);
    uint64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *name = f->tensors[r[i].tensor].name;
        if (r[i].begin < at)
            return lt_fail(LT_ERR_FORMAT,
                           "%s: tensor '%s': data starts at byte %llu, inside the previous "
                           "tensor's data (which ends at %llu): ranges overlap",
                           f->path, name, (unsigned long long)r[i].begin,
                           (unsigned long long)at);
        if (r[i].begin > at)
            return lt_fail(LT_ERR_FORMAT,
                           "%s: tensor '%s': data starts at byte %llu but the data before it "
                           "ends at %llu: a gap of unindexed bytes",
                           f->path, name, (unsigned long long)r[i].begin, (unsigned long long)at);
        at = r[i].end;
    }
    if (at != data_size)
        return lt_fail(LT_ERR_FORMAT,
                       "%s: the tensors cover %llu bytes of data but the data section has %llu",
                       f->path, (unsigned long long)at, (unsigned long long)data_size);
    return LT_OK;
}

static lt_status parse_header(struct lt_st_file *f)
{
    const char *path = f->path;
    if (f->size < 8)
        return lt_fail(LT_ERR_FORMAT, "%s: %zu bytes, too short for the 8-byte header length",
                       path, f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | f->bytes[i];
    if (hlen > LT_ST_MAX_HEADER)
        return lt_fail(LT_ERR_FORMAT, "%s: header length %llu exceeds the format's limit of %llu",
                       path, (unsigned long long)hlen, (unsigned long long)LT_ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return lt_fail(LT_ERR_FORMAT,
                       "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                       (unsigned long long)hlen, f->size);
    if (hlen < 2 || f->bytes[8] != '{')
        return lt_fail(LT_ERR_FORMAT, "%s: the header is not a JSON object", path);
    const uint8_t *data = f->bytes + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->bytes + 8, (size_t)hlen, JSON_REJECT_DUPLICATES,
                              &jerr);
    if (!root)
        return lt_fail(LT_ERR_FORMAT, "%s: header JSON, line %d column %d: %s", path, jerr.line,
                       jerr.column, jerr.text);
    lt_status st = LT_OK;
    struct range *ranges = NULL;
    if (!json_is_object(root)) {
        st = lt_fail(LT_ERR_FORMAT, "%s: the header is not a JSON object", path);
        goto out_free_json;
    }
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof(*f->tensors));
    f->names = calloc(n ? n : 1, sizeof(char *));
    f->by_name = calloc(n ? n : 1, sizeof(*f->by_name));
    ranges = calloc(n ? n : 1, sizeof(*ranges));
    if (!f->tensors || !f->names || !f->by_name || !ranges) {
        st = lt_fail(LT_ERR_NOMEM, "%s: out of memory for %zu tensor entries", path, n);
        goto out_free_ranges;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__")) {
            if ((st = parse_metadata(f, val)) != LT_OK)
                goto out_free_ranges;
            continue;
        }
        int64_t i = f->n_tensors;
        struct lt_st_tensor *t = &f->tensors[i];
        f->names[i] = strdup(key);
        if (!f->names[i]) {
            st = lt_fail(LT_ERR_NOMEM, "%s: out of memory", path);
            goto out_free_ranges;
        }
        f->n_tensors++;
        t->name = f->names[i];
        t->path = f->path;
        if (!key[0]) {
            st = lt_fail(LT_ERR_FORMAT, "%s: a tensor has an empty name", path);
            goto out_free_ranges;
        }
        uint64_t begin = 0;
        if ((st = parse_tensor(f, key, val, t, data_size, &begin)) != LT_OK)
            goto out_free_ranges;
        t->data = data + begin;
        ranges[i] = (struct range){begin, begin + t->nbytes, i};
    }
    if ((st = check_tiling(f, ranges, f->n_tensors, data_size)) != LT_OK)
        goto out_free_ranges;

    for (int64_t i = 0; i < f->n_tensors; i++)
        f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, (size_t)f->n_tensors, sizeof(*f->by_name), cmp_tensor_name);

out_free_ranges:
    free(ranges);
out_free_json:
    json_decref(root);
    return st;
}

static lt_status file_new(const char *label, struct lt_st_file **out)
{
    struct lt_st_file *f = calloc(1, sizeof(*f));
    if (!f || !(f->path = strdup(label ? label : "(memory)"))) {
        free(f);
        return lt_fail(LT_ERR_NOMEM, "out of memory opening %s", label ? label : "(memory)");
    }
    *out = f;
    return LT_OK;
}

lt_status lt_st_file_open_memory(const void *data, size_t size, const char *label,
                                 struct lt_st_file **out)
{
    *out = NULL;
    struct lt_st_file *f;
    lt_status st = file_new(label, &f);
    if (st != LT_OK)
        return st;
    f->bytes = data;
    f->size = size;
    if ((st = parse_header(f)) != LT_OK) {
        lt_st_file_close(f);
        return st;
    }
    *out = f;
    return LT_OK;
}

lt_status lt_st_file_open(const char *path, struct lt_st_file **out)
{
    *out = NULL;
    struct lt_st_file *f;
    lt_status st = file_new(path, &f);
    if (st != LT_OK)
        return st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = lt_fail(LT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto out_close_file;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = lt_fail(LT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto out_close_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = lt_fail(LT_ERR_IO, "%s: not a regular file", path);
        goto out_close_fd;
    }
    f->size = (size_t)sb.st_size;
    if (f->size >= 8) {
        void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            st = lt_fail(LT_ERR_IO, "%s: cannot map %zu bytes: %s", path, f->size,
                         strerror(errno));
            goto out_close_fd;
        }
        f->map = map;
        f->map_size = f->size;
        f->bytes = map;
    }
    st = parse_header(f);
out_close_fd:
    close(fd);
out_close_file:
    if (st != LT_OK) {
        lt_st_file_close(f);
        return st;
    }
    *out = f;
    return LT_OK;
}

#else /* !LATHE_HAVE_JANSSON */

lt_status lt_st_file_open_memory(const void *data, size_t size, const char *label,
                                 struct lt_st_file **out)
{
    (void)data;
    (void)size;
    *out = NULL;
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: reading safetensors needs jansson, which this build "
                                       "lacks",
                   label ? label : "(memory)");
}

lt_status lt_st_file_open(const char *path, struct lt_st_file **out)
{
    return lt_st_file_open_memory(NULL, 0, path, out);
}

#endif /* LATHE_HAVE_JANSSON */

/* ================================ checkpoints ================================ */

struct lt_st_checkpoint {
    int n_files;
    struct lt_st_file **files;
    int64_t n_tensors;
    const struct lt_st_tensor **tensors; /* shard by shard */
    const struct lt_st_tensor **by_name; /* sorted by name */
};

void lt_st_checkpoint_close(struct lt_st_checkpoint *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_files; i++)
        lt_st_file_close(c->files[i]);
    free(c->files);
    free(c->tensors);
    free(c->by_name);
    free(c);
}

int64_t lt_st_checkpoint_n_tensors(const struct lt_st_checkpoint *c) { return c->n_tensors; }
int lt_st_checkpoint_n_files(const struct lt_st_checkpoint *c) { return c->n_files; }

const struct lt_st_tensor *lt_st_checkpoint_tensor(const struct lt_st_checkpoint *c, int64_t i)
{
    return i >= 0 && i < c->n_tensors ? c->tensors[i] : NULL;
}

const struct lt_st_tensor *lt_st_checkpoint_find(const struct lt_st_checkpoint *c,
                                                 const char *name)
{
    return find_sorted(c->by_name, c->n_tensors, name);
}

static lt_status join_path(char *dst, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(dst, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return lt_fail(LT_ERR_INVALID, "path too long: %s/%s", dir, name);
    return LT_OK;
}

static bool is_regular_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Collects every tensor of the opened files into c's lists and checks names are unique. */
static lt_status checkpoint_index(struct lt_st_checkpoint *c)
{
    int64_t n = 0;
    for (int i = 0; i < c->n_files; i++)
        n += c->files[i]->n_tensors;
    c->tensors = calloc((size_t)(n ? n : 1), sizeof(*c->tensors));
    c->by_name = calloc((size_t)(n ? n : 1), sizeof(*c->by_name));
    if (!c->tensors || !c->by_name)
        return lt_fail(LT_ERR_NOMEM, "out of memory indexing %lld tensors", (long long)n);
    for (int i = 0; i < c->n_files; i++)
        for (int64_t j = 0; j < c->files[i]->n_tensors; j++)
            c->tensors[c->n_tensors++] = &c->files[i]->tensors[j];
    memcpy(c->by_name, c->tensors, (size_t)n * sizeof(*c->by_name));
    qsort(c->by_name, (size_t)n, sizeof(*c->by_name), cmp_tensor_name);
    for (int64_t i = 1; i < n; i++)
        if (!strcmp(c->by_name[i - 1]->name, c->by_name[i]->name))
            return lt_fail(LT_ERR_FORMAT, "tensor '%s' is in both %s and %s", c->by_name[i]->name,
                           c->by_name[i - 1]->path, c->by_name[i]->path);
    return LT_OK;
}

#ifdef LATHE_HAVE_JANSSON

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool plain_file_name(const char *s)
{
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* Opens the shards an index names and checks the index against them. */
static lt_status checkpoint_open_index(struct lt_st_checkpoint *c, const char *dir,
                                       const char *index_path)
{
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return lt_fail(LT_ERR_FORMAT, "%s: line %d column %d: %s", index_path, jerr.line,
                       jerr.column, jerr.text);
    lt_status st = LT_OK;
    const char **shards = NULL;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        st = lt_fail(LT_ERR_FORMAT, "%s: \"weight_map\" is missing or not an object", index_path);
        goto out_free_json;
    }
    size_t n_map = json_object_size(map);
    shards = calloc(n_map ? n_map : 1, sizeof(*shards));
    if (!shards) {
        st = lt_fail(LT_ERR_NOMEM, "%s: out of memory", index_path);
        goto out_free_json;
    }
    size_t n_shards = 0;
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val)
    {
        if (!json_is_string(val) || !plain_file_name(json_string_value(val))) {
            st = lt_fail(LT_ERR_FORMAT,
                         "%s: weight_map[\"%s\"] is not a plain file name in the same directory",
                         index_path, key);
            goto out_free_shards;
        }
        shards[n_shards++] = json_string_value(val);
    }
    qsort(shards, n_shards, sizeof(*shards), cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < n_shards; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]))
            shards[u++] = shards[i];
    n_shards = u;

    c->files = calloc(n_shards ? n_shards : 1, sizeof(*c->files));
    if (!c->files) {
        st = lt_fail(LT_ERR_NOMEM, "%s: out of memory", index_path);
        goto out_free_shards;
    }
    for (size_t i = 0; i < n_shards; i++) {
        char path[4096];
        if ((st = join_path(path, sizeof(path), dir, shards[i])) != LT_OK)
            goto out_free_shards;
        if ((st = lt_st_file_open(path, &c->files[c->n_files])) != LT_OK)
            goto out_free_shards;
        c->n_files++;
    }
    /* every tensor of every shard is listed, for that shard ... */
    for (int i = 0; i < c->n_files; i++) {
        const char *shard = shards[i];
        for (int64_t j = 0; j < c->files[i]->n_tensors; j++) {
            const char *name = c->files[i]->tensors[j].name;
            json_t *where = json_object_get(map, name);
            if (!where) {
                st = lt_fail(LT_ERR_FORMAT, "%s: tensor '%s' is in %s but not in the index",
                             index_path, name, shard);
                goto out_free_shards;
            }
            if (strcmp(json_string_value(where), shard)) {
                st = lt_fail(LT_ERR_FORMAT, "%s: tensor '%s' is listed in %s but found in %s",
                             index_path, name, json_string_value(where), shard);
                goto out_free_shards;
            }
        }
    }
    /* ... and every listed tensor is in its shard */
    json_object_foreach(map, key, val)
    {
        const char *shard = json_string_value(val);
        const struct lt_st_file *f = NULL;
        for (int i = 0; i < c->n_files && !f; i++)
            if (!strcmp(shards[i], shard))
                f = c->files[i];
        if (!f || !lt_st_file_find(f, key)) {
            st = lt_fail(LT_ERR_FORMAT, "%s: tensor '%s' is listed in %s but that file lacks it",
                         index_path, key, shard);
            goto out_free_shards;
        }
    }
out_free_shards:
    free(shards);
out_free_json:
    json_decref(root);
    return st;
}

#else

static lt_status checkpoint_open_index(struct lt_st_checkpoint *c, const char *dir,
                                       const char *index_path)
{
    (void)c;
    (void)dir;
    return lt_fail(LT_ERR_UNSUPPORTED, "%s: reading an index needs jansson, which this build lacks",
                   index_path);
}

#endif

lt_status lt_st_checkpoint_open(const char *path, struct lt_st_checkpoint **out)
{
    *out = NULL;
    struct lt_st_checkpoint *c = calloc(1, sizeof(*c));
    if (!c)
        return lt_fail(LT_ERR_NOMEM, "out of memory opening %s", path);
    lt_status st;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        st = lt_fail(LT_ERR_IO, "%s: %s", path, strerror(errno));
        goto out_close;
    }
    if (S_ISREG(sb.st_mode)) {
        c->files = calloc(1, sizeof(*c->files));
        if (!c->files) {
            st = lt_fail(LT_ERR_NOMEM, "out of memory opening %s", path);
            goto out_close;
        }
        if ((st = lt_st_file_open(path, &c->files[0])) != LT_OK)
            goto out_close;
        c->n_files = 1;
    } else {
        char index[4096], single[4096];
        if ((st = join_path(index, sizeof(index), path, "model.safetensors.index.json")) != LT_OK ||
            (st = join_path(single, sizeof(single), path, "model.safetensors")) != LT_OK)
            goto out_close;
        if (is_regular_file(index)) {
            if ((st = checkpoint_open_index(c, path, index)) != LT_OK)
                goto out_close;
        } else if (is_regular_file(single)) {
            c->files = calloc(1, sizeof(*c->files));
            if (!c->files) {
                st = lt_fail(LT_ERR_NOMEM, "out of memory opening %s", single);
                goto out_close;
            }
            if ((st = lt_st_file_open(single, &c->files[0])) != LT_OK)
                goto out_close;
            c->n_files = 1;
        } else {
            st = lt_fail(LT_ERR_IO,
                         "%s: neither model.safetensors nor model.safetensors.index.json is there",
                         path);
            goto out_close;
        }
    }
    if ((st = checkpoint_index(c)) != LT_OK)
        goto out_close;
    *out = c;
    return LT_OK;
out_close:
    lt_st_checkpoint_close(c);
    return st;
}
