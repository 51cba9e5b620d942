/* safetensors.h (internal): read-only access to Hugging Face safetensors checkpoints.
 *
 * A safetensors file is
 *
 *   u64 header_len (little-endian) | header_len bytes of JSON | data
 *
 * where the JSON object maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
 * end]} (offsets relative to the start of the data) plus an optional "__metadata__" object of
 * strings. A file is mapped read-only and validated whole at open: every tensor's byte range
 * must match its dtype and shape, lie inside the data, and the ranges must tile the data
 * exactly (no overlap and no gap, as the format's own reader insists). Shapes are kept in the
 * file's order, outermost dimension first (PyTorch's), which is the reverse of GGUF's ne[].
 *
 * A checkpoint is one `model.safetensors` or the shards named by
 * `model.safetensors.index.json`; tensor names are unique across it. Tensor data is not
 * copied: lt_st_tensor.data points into a mapping (and may be unaligned) and lives until the
 * file or checkpoint is closed. */
#ifndef LATHE_MODEL_SAFETENSORS_H
#define LATHE_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "lathe/status.h"

#define LT_ST_MAX_DIMS 8
#define LT_ST_MAX_HEADER ((uint64_t)100 << 20) /* the format's own limit on the JSON */

enum lt_st_dtype {
    LT_ST_F32,
    LT_ST_F16,
    LT_ST_BF16,
    LT_ST_I32,
    LT_ST_I64,
    LT_ST_DTYPE_COUNT
};

const char *lt_st_dtype_name(enum lt_st_dtype d); /* "F32", ...; "?" when unknown */
size_t lt_st_dtype_size(enum lt_st_dtype d);      /* bytes per element; 0 when unknown */

struct lt_st_tensor {
    const char *name;
    enum lt_st_dtype dtype;
    int n_dims;                    /* 0 (a scalar) .. LT_ST_MAX_DIMS */
    int64_t shape[LT_ST_MAX_DIMS]; /* outermost first; entries past n_dims are 1 */
    int64_t n_elements;
    const void *data; /* into the mapping, possibly unaligned */
    size_t nbytes;    /* n_elements * lt_st_dtype_size(dtype) */
    const char *path; /* the file holding it, for messages */
};

/* Every element of t as float32, in the file's (row-major) order; dst holds n_elements.
 * I64 values beyond float's range are rounded as C's conversion does. */
void lt_st_tensor_read_f32(const struct lt_st_tensor *t, float *dst);

/* ---- one file ---- */

struct lt_st_file;

/* On failure *out is NULL and lt_last_error() names the file, the tensor and the field. */
lt_status lt_st_file_open(const char *path, struct lt_st_file **out);
/* The same over bytes in memory (not copied; they must outlive the reader). `label` names
 * them in messages. */
lt_status lt_st_file_open_memory(const void *data, size_t size, const char *label,
                                 struct lt_st_file **out);
void lt_st_file_close(struct lt_st_file *f); /* NULL is fine */

int64_t lt_st_file_n_tensors(const struct lt_st_file *f);
/* In the order of the header's JSON object. */
const struct lt_st_tensor *lt_st_file_tensor(const struct lt_st_file *f, int64_t i);
/* NULL when absent. */
const struct lt_st_tensor *lt_st_file_find(const struct lt_st_file *f, const char *name);
/* A string of "__metadata__", or NULL. */
const char *lt_st_file_metadata(const struct lt_st_file *f, const char *key);

/* ---- a checkpoint: a directory (model.safetensors or an index with shards) or one file ---- */

struct lt_st_checkpoint;

/* `path` is a directory holding model.safetensors.index.json (shards) or model.safetensors,
 * or a .safetensors file itself. With an index, every tensor it lists must be in the shard it
 * names and every tensor in a shard must be listed; shard names must be plain file names in
 * the same directory. */
lt_status lt_st_checkpoint_open(const char *path, struct lt_st_checkpoint **out);
void lt_st_checkpoint_close(struct lt_st_checkpoint *c); /* NULL is fine */

int64_t lt_st_checkpoint_n_tensors(const struct lt_st_checkpoint *c);
/* Shard by shard (shards sorted by file name), each in its header's order. */
const struct lt_st_tensor *lt_st_checkpoint_tensor(const struct lt_st_checkpoint *c, int64_t i);
const struct lt_st_tensor *lt_st_checkpoint_find(const struct lt_st_checkpoint *c,
                                                 const char *name);
int lt_st_checkpoint_n_files(const struct lt_st_checkpoint *c);

#endif
