/* gguf.h: reading and writing GGUF files (llama.cpp's model format), versions 2 and 3.
 *
 * The format, little-endian throughout:
 *
 *   "GGUF"  u32 version  u64 n_tensors  u64 n_kv
 *   n_kv    x { string key; u32 value_type; value }
 *   n_tensors x { string name; u32 n_dims; u64 ne[n_dims]; u32 type; u64 offset }
 *   padding to `alignment` (general.alignment, a u32; 32 when absent)
 *   tensor data; each tensor at data_start + offset, offset a multiple of `alignment`
 *
 * where a string is { u64 len; len bytes, no terminator } and an array value is
 * { u32 elem_type; u64 n; n elements } (elements may themselves be arrays).
 *
 * The reader maps the file read-only and validates all of it at open: a truncated, oversized
 * or inconsistent file is refused with LT_ERR_FORMAT and a message naming the byte offset and
 * the field; nothing is allocated from a count before the count has been checked against the
 * bytes that are really there. After a successful open every getter is a plain lookup, the
 * reader is immutable and may be shared between threads. Metadata (keys, strings, arrays) is
 * copied out of the file: strings are NUL-terminated, numeric arrays are aligned for their
 * element type. Tensor data is not copied: lt_gguf_tensor_info.data points into the mapping
 * and lives until lt_gguf_close.
 *
 * The writer collects metadata (copied) and tensors (referenced, or produced by a callback at
 * write time) and writes the file to a temporary name in the same directory, fsyncs it and
 * renames it into place: a file at `path` is either the old one or the complete new one. */
#ifndef LATHE_GGUF_H
#define LATHE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/status.h"
#include "lathe/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LT_GGUF_DEFAULT_ALIGNMENT 32
#define LT_GGUF_MAX_ARRAY_DEPTH 8 /* arrays nested deeper than this are refused */

/* Metadata value types; the ids are GGUF's. */
enum lt_gguf_type {
    LT_GGUF_TYPE_U8 = 0,
    LT_GGUF_TYPE_I8 = 1,
    LT_GGUF_TYPE_U16 = 2,
    LT_GGUF_TYPE_I16 = 3,
    LT_GGUF_TYPE_U32 = 4,
    LT_GGUF_TYPE_I32 = 5,
    LT_GGUF_TYPE_F32 = 6,
    LT_GGUF_TYPE_BOOL = 7,
    LT_GGUF_TYPE_STRING = 8,
    LT_GGUF_TYPE_ARRAY = 9,
    LT_GGUF_TYPE_U64 = 10,
    LT_GGUF_TYPE_I64 = 11,
    LT_GGUF_TYPE_F64 = 12,
    LT_GGUF_TYPE_COUNT
};

/* "u8", "i32", "string", "array", ...; "?" when unknown. */
const char *lt_gguf_type_name(enum lt_gguf_type t);
/* Bytes of one element of a numeric or bool type (bool: 1); 0 for string, array, unknown. */
size_t lt_gguf_type_size(enum lt_gguf_type t);

struct lt_gguf_str {
    const char *ptr; /* NUL-terminated (the file's bytes may contain NULs; len is exact) */
    uint64_t len;
};

/* One metadata value. Scalars are held widened but keep their type, so copying a value
 * into a writer reproduces the file's bytes. */
struct lt_gguf_value {
    enum lt_gguf_type type;
    union {
        uint64_t u64;           /* U8, U16, U32, U64 */
        int64_t i64;            /* I8, I16, I32, I64 */
        double f64;             /* F32 (exactly widened), F64 */
        bool b;                 /* BOOL */
        struct lt_gguf_str str; /* STRING */
        struct {
            enum lt_gguf_type type; /* element type */
            uint64_t n;             /* element count */
            /* numeric/bool: n packed elements of that C type (uint8_t 0/1 for bool),
             *   aligned for it;
             * STRING: const struct lt_gguf_str[n];
             * ARRAY:  const struct lt_gguf_value[n], each of type ARRAY;
             * NULL when n == 0. */
            const void *data;
        } arr; /* ARRAY */
    };
};

/* ================================ reader ================================ */

struct lt_gguf;

struct lt_gguf_tensor_info {
    const char *name;   /* NUL-terminated, < LT_MAX_NAME bytes, unique in the file */
    enum lt_type type;  /* same ids as GGUF */
    int n_dims;         /* 1..4 */
    int64_t ne[LT_MAX_DIMS]; /* ne[0] innermost; dims past n_dims are 1 */
    uint64_t offset;    /* relative to the start of the data section, as in the file */
    size_t nbytes;      /* lt_row_size(type, ne[0]) * ne[1] * ne[2] * ne[3] */
    const void *data;   /* into the mapping; valid until lt_gguf_close */
};

/* Maps `path` read-only and validates it. On failure *out is NULL and the reason
 * ("PATH: offset N: FIELD: ...") is in lt_last_error(). */
lt_status lt_gguf_open(const char *path, struct lt_gguf **out);
/* The same over bytes in memory; `data` is not copied and must outlive the reader. */
lt_status lt_gguf_open_memory(const void *data, size_t size, struct lt_gguf **out);
void lt_gguf_close(struct lt_gguf *g); /* NULL is fine */

uint32_t lt_gguf_version(const struct lt_gguf *g);
size_t lt_gguf_alignment(const struct lt_gguf *g);
size_t lt_gguf_data_offset(const struct lt_gguf *g); /* file offset of the data section */
size_t lt_gguf_file_size(const struct lt_gguf *g);

/* ---- metadata, by index (0 .. n_kv-1, in file order) ---- */
int64_t lt_gguf_n_kv(const struct lt_gguf *g);
const char *lt_gguf_key(const struct lt_gguf *g, int64_t i);
enum lt_gguf_type lt_gguf_kv_type(const struct lt_gguf *g, int64_t i);
const struct lt_gguf_value *lt_gguf_kv_value(const struct lt_gguf *g, int64_t i);
/* Index of `key`, or -1. */
int64_t lt_gguf_find_key(const struct lt_gguf *g, const char *key);

/* ---- metadata, by key. A missing key or a value of the wrong type returns LT_ERR_FORMAT
 * naming the key and both types; *out is untouched on failure. Use lt_gguf_find_key first
 * for optional keys. ---- */
/* Any integer type whose value fits (u8..u64, i8..i64). */
lt_status lt_gguf_get_u32(const struct lt_gguf *g, const char *key, uint32_t *out);
lt_status lt_gguf_get_i32(const struct lt_gguf *g, const char *key, int32_t *out);
lt_status lt_gguf_get_u64(const struct lt_gguf *g, const char *key, uint64_t *out);
lt_status lt_gguf_get_i64(const struct lt_gguf *g, const char *key, int64_t *out);
/* F32 or F64. */
lt_status lt_gguf_get_f32(const struct lt_gguf *g, const char *key, float *out);
lt_status lt_gguf_get_f64(const struct lt_gguf *g, const char *key, double *out);
lt_status lt_gguf_get_bool(const struct lt_gguf *g, const char *key, bool *out);
/* NUL-terminated; valid until lt_gguf_close. */
lt_status lt_gguf_get_str(const struct lt_gguf *g, const char *key, const char **out);
/* An ARRAY value whose elements are of type `elem` (LT_GGUF_TYPE_COUNT: any). Read it with
 * the helpers below or through value->arr directly. */
lt_status lt_gguf_get_arr(const struct lt_gguf *g, const char *key, enum lt_gguf_type elem,
                          const struct lt_gguf_value **out);

/* ---- array helpers (v must be of type ARRAY) ---- */
enum lt_gguf_type lt_gguf_arr_type(const struct lt_gguf_value *v);
uint64_t lt_gguf_arr_len(const struct lt_gguf_value *v);
const void *lt_gguf_arr_data(const struct lt_gguf_value *v); /* numeric/bool elements */
/* Element i of an array of strings (NULL when out of range or not strings); *len if len. */
const char *lt_gguf_arr_str(const struct lt_gguf_value *v, uint64_t i, uint64_t *len);
/* Element i of an array of arrays (NULL when out of range or not arrays). */
const struct lt_gguf_value *lt_gguf_arr_arr(const struct lt_gguf_value *v, uint64_t i);

/* ---- tensors, by index (0 .. n_tensors-1, in file order) ---- */
int64_t lt_gguf_n_tensors(const struct lt_gguf *g);
const struct lt_gguf_tensor_info *lt_gguf_tensor(const struct lt_gguf *g, int64_t i);
/* Index of the tensor named `name`, or -1. */
int64_t lt_gguf_find_tensor(const struct lt_gguf *g, const char *name);

/* ================================ writer ================================ */

struct lt_gguf_writer;

/* NULL (with lt_last_error set) on out-of-memory. */
struct lt_gguf_writer *lt_gguf_writer_new(void);
void lt_gguf_writer_free(struct lt_gguf_writer *w); /* NULL is fine */

/* Setters copy their arguments. Keys are unique: setting an existing key replaces its value
 * and keeps its position. "general.alignment" must be a U32 power of two. */
lt_status lt_gguf_writer_set_u8(struct lt_gguf_writer *w, const char *key, uint8_t v);
lt_status lt_gguf_writer_set_i8(struct lt_gguf_writer *w, const char *key, int8_t v);
lt_status lt_gguf_writer_set_u16(struct lt_gguf_writer *w, const char *key, uint16_t v);
lt_status lt_gguf_writer_set_i16(struct lt_gguf_writer *w, const char *key, int16_t v);
lt_status lt_gguf_writer_set_u32(struct lt_gguf_writer *w, const char *key, uint32_t v);
lt_status lt_gguf_writer_set_i32(struct lt_gguf_writer *w, const char *key, int32_t v);
lt_status lt_gguf_writer_set_u64(struct lt_gguf_writer *w, const char *key, uint64_t v);
lt_status lt_gguf_writer_set_i64(struct lt_gguf_writer *w, const char *key, int64_t v);
lt_status lt_gguf_writer_set_f32(struct lt_gguf_writer *w, const char *key, float v);
lt_status lt_gguf_writer_set_f64(struct lt_gguf_writer *w, const char *key, double v);
lt_status lt_gguf_writer_set_bool(struct lt_gguf_writer *w, const char *key, bool v);
lt_status lt_gguf_writer_set_str(struct lt_gguf_writer *w, const char *key, const char *s);
/* A string with an explicit length (may contain NULs). */
lt_status lt_gguf_writer_set_strn(struct lt_gguf_writer *w, const char *key, const char *s,
                                  uint64_t len);
/* An array of n numeric or bool elements of type `elem`, packed as their C type
 * (bool: one byte each, 0 or 1). */
lt_status lt_gguf_writer_set_arr(struct lt_gguf_writer *w, const char *key,
                                 enum lt_gguf_type elem, const void *data, uint64_t n);
lt_status lt_gguf_writer_set_arr_str(struct lt_gguf_writer *w, const char *key,
                                     const char *const *strs, uint64_t n);
/* Any value, nested arrays included (deep copy), e.g. one taken from a reader. */
lt_status lt_gguf_writer_set_value(struct lt_gguf_writer *w, const char *key,
                                   const struct lt_gguf_value *v);
/* Copies every key/value of `g` (replacing keys already set). */
lt_status lt_gguf_writer_copy_kv(struct lt_gguf_writer *w, const struct lt_gguf *g);
/* Removes `key` if present. */
void lt_gguf_writer_remove(struct lt_gguf_writer *w, const char *key);
int64_t lt_gguf_writer_n_kv(const struct lt_gguf_writer *w);

/* Adds a tensor. `data` (nbytes bytes) is referenced, not copied, and must stay valid until
 * lt_gguf_writer_write returns. nbytes must equal lt_row_size(type, ne[0]) * ne[1]*ne[2]*ne[3];
 * names are unique and shorter than LT_MAX_NAME. Tensors are written in the order added. */
lt_status lt_gguf_writer_add_tensor(struct lt_gguf_writer *w, const char *name, enum lt_type type,
                                    int n_dims, const int64_t *ne, const void *data,
                                    size_t nbytes);

/* A tensor whose bytes are produced at write time (e.g. converted one at a time, so a large
 * model never has to be in memory at once): fill(user, dst, nbytes) writes all nbytes of dst
 * and returns LT_OK, or fails, which fails the whole write. */
typedef lt_status (*lt_gguf_fill_fn)(void *user, void *dst, size_t nbytes);
lt_status lt_gguf_writer_add_tensor_fill(struct lt_gguf_writer *w, const char *name,
                                         enum lt_type type, int n_dims, const int64_t *ne,
                                         size_t nbytes, lt_gguf_fill_fn fill, void *user);

/* Writes GGUF version 3 to a temporary file next to `path`, fsyncs it and renames it to
 * `path`. On failure the temporary file is removed and `path` is left as it was. */
lt_status lt_gguf_writer_write(struct lt_gguf_writer *w, const char *path);
/* LT_OK when lt_gguf_writer_write could create its temporary file beside path (made and
 * removed again): a check before hours of work that end in a write. Like the write, it
 * first removes the temporaries that killed writes of the same path left
 * (lt_gguf_remove_stale_temps with path's file name). */
lt_status lt_gguf_check_writable(const char *path);
/* Removes from dir the temporary files of writes that never finished (their process was
 * killed): entries named "NAME.tmp-XXXXXX" (XXXXXX six letters or digits, as the writer
 * makes them) that are regular files of this user's, empty or beginning with GGUF's magic,
 * and not held by a writer that is still running (a writer locks its temporary file while it
 * writes). name: only the temporaries of that file name ("out.gguf"); NULL: of any name
 * ending in ".gguf". Nothing else is touched. lt_gguf_writer_write and
 * lt_gguf_check_writable do this for their own path first. *n_removed (may be NULL) counts the
 * files removed; a folder that cannot be read is LT_ERR_IO. */
lt_status lt_gguf_remove_stale_temps(const char *dir, const char *name, int *n_removed);

#ifdef __cplusplus
}
#endif
#endif
