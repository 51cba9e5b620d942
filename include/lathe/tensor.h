/* tensor.h: tensors, views, contexts (arenas) and graphs.
 *
 * A tensor has a type, element counts ne[4] (ne[0] is the innermost, fastest-varying
 * dimension, as in GGUF) and byte strides nb[4]. For block-quantised types nb[0] is the
 * size of one block and ne[0] must be a multiple of the block size. A view shares the
 * storage of view_src at byte offset view_offs. Every tensor made by an op records the op,
 * its sources and its parameters; evaluating a graph fills in the data.
 *
 * Type ids equal GGUF's (ggml's) type ids, so a GGUF tensor's type is used as it is. */
#ifndef LATHE_TENSOR_H
#define LATHE_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lathe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LT_MAX_DIMS 4
#define LT_MAX_SRC 12 /* GDN_DECODE reads 11 (see lt_gdn_decode) */
#define LT_MAX_OP_PARAMS 16 /* int32 slots; floats are stored bitwise */
#define LT_MAX_NAME 64

enum lt_type {
    LT_TYPE_F32 = 0,
    LT_TYPE_F16 = 1,
    LT_TYPE_Q4_0 = 2,
    LT_TYPE_Q4_1 = 3,
    LT_TYPE_Q5_0 = 6,
    LT_TYPE_Q5_1 = 7,
    LT_TYPE_Q8_0 = 8,
    LT_TYPE_Q8_1 = 9,
    LT_TYPE_Q2_K = 10,
    LT_TYPE_Q3_K = 11,
    LT_TYPE_Q4_K = 12,
    LT_TYPE_Q5_K = 13,
    LT_TYPE_Q6_K = 14,
    LT_TYPE_Q8_K = 15,
    LT_TYPE_I8 = 24,
    LT_TYPE_I16 = 25,
    LT_TYPE_I32 = 26,
    LT_TYPE_I64 = 27,
    LT_TYPE_F64 = 28,
    LT_TYPE_BF16 = 30,
    LT_TYPE_COUNT = 40
};

/* Per-type layout: a row of n elements takes (n / block_size) * type_size bytes.
 * to_float is set for every type that can be read on the CPU; from_float for the types
 * lathe can write (F32, F16, BF16, Q8_0, ...). */
struct lt_type_traits {
    const char *name; /* NULL: not a type lathe knows */
    int64_t block_size;
    size_t type_size;
    bool is_quantized;
    void (*to_float)(const void *src, float *dst, int64_t n);
    void (*from_float)(const float *src, void *dst, int64_t n);
};

const struct lt_type_traits *lt_type_traits(enum lt_type t); /* NULL when unknown */
const char *lt_type_name(enum lt_type t);                     /* "?" when unknown */
bool lt_type_valid(int t);
size_t lt_row_size(enum lt_type t, int64_t n);

/* Scalar conversions (IEEE half and bfloat16, round to nearest even). */
float lt_fp16_to_fp32(uint16_t h);
uint16_t lt_fp32_to_fp16(float f);
float lt_bf16_to_fp32(uint16_t h);
uint16_t lt_fp32_to_bf16(float f);

/* Ops, one table entry each (src/ops/op_table.c). Views are ops too, so a view node in
 * a graph says how it was made. Backward-only ops follow the forward ones. */
enum lt_op {
    LT_OP_NONE = 0, /* a leaf: input, parameter or constant */
    /* views: no computation, share storage */
    LT_OP_VIEW,
    LT_OP_RESHAPE,
    LT_OP_PERMUTE,
    LT_OP_TRANSPOSE,
    /* constants and copies */
    LT_OP_FILL,
    LT_OP_CONT,
    LT_OP_CPY,
    LT_OP_CONCAT,
    LT_OP_REPEAT,
    LT_OP_GET_ROWS,
    LT_OP_SET_ROWS, /* rows of src written into dst at ids (in place, like CPY) */
    /* linear algebra */
    LT_OP_MUL_MAT,
    LT_OP_MUL_MAT_ACC, /* c += a b in place (c: F32, contiguous, of the product's shape) */
    LT_OP_MUL_MAT_GLU, /* silu(a's gate rows b) * (a's up rows b) of a stacked a (inference) */
    LT_OP_MUL_MAT_ADD_RMS_NORM, /* x + a b and its rms_norm(..) * w in one (inference) */
    LT_OP_RMS_NORM_MUL_MAT,     /* a (rms_norm(x) * w), or its GLU, in one (inference) */
    /* element-wise binary, with broadcasting of src1 over src0 */
    LT_OP_ADD,
    LT_OP_SUB,
    LT_OP_MUL,
    LT_OP_DIV,
    /* element-wise unary */
    LT_OP_SCALE,
    LT_OP_SILU,
    LT_OP_SIGMOID,
    LT_OP_SOFTPLUS,
    LT_OP_EXP,
    LT_OP_LOG,
    LT_OP_SQR,
    LT_OP_SQRT,
    LT_OP_SIN,
    LT_OP_COS,
    LT_OP_ABS,
    LT_OP_NEG,
    LT_OP_RELU,
    /* reductions */
    LT_OP_SUM_ROWS,
    LT_OP_MEAN,
    LT_OP_SUM,
    LT_OP_ARGMAX, /* each row's largest element's index (a greedy pick where the logits are) */
    /* normalisation, position, attention */
    LT_OP_RMS_NORM,
    LT_OP_ADD_RMS_NORM, /* a + b and rms_norm(a + b) * w in one (inference) */
    LT_OP_L2_NORM,
    LT_OP_ROPE,
    LT_OP_RMS_NORM_ROPE, /* rope(rms_norm(x) * w) of each head's row in one (inference) */
    LT_OP_SOFT_MAX,
    LT_OP_ATTN_DECODE, /* one decode token's attention over the KV cache (inference) */
    LT_OP_FLASH_ATTN,  /* softmax(q k^T) v in one node, without T x T scores */
    LT_OP_SWIGLU,
    /* recurrent (Gated DeltaNet) */
    LT_OP_SSM_CONV,
    LT_OP_DELTA_NET,
    LT_OP_GDN_DECODE, /* one decode token of a Gated DeltaNet layer, conv to gated norm */
    LT_OP_CONV_SILU,  /* silu(causal conv1d) of channels-innermost x, no carried state */
    /* loss */
    LT_OP_CROSS_ENTROPY,
    LT_OP_LINEAR_CE, /* the LM head and the cross-entropy in one (no [V, N] logits) */
    /* backward-only ops */
    LT_OP_ACC,           /* dst = src0 with src1 added into a strided window */
    LT_OP_REPEAT_BACK,   /* sum src0 down to the shape of the broadcast source */
    LT_OP_GET_ROWS_BACK, /* scatter-add rows into a zero tensor */
    LT_OP_SILU_BACK,
    LT_OP_SWIGLU_BACK, /* both gradients of SWIGLU in one pass */
    LT_OP_RMS_NORM_BACK,
    LT_OP_RMS_NORM_MUL_BACK, /* dx, dz and dw's partial sums of a weighted (gated) RMS_NORM */
    LT_OP_L2_NORM_BACK,
    LT_OP_ROPE_BACK,
    LT_OP_SOFT_MAX_BACK,
    LT_OP_SSM_CONV_BACK,
    LT_OP_CONV_SILU_BACK,
    LT_OP_DELTA_NET_BACK,
    LT_OP_FLASH_ATTN_BACK,
    LT_OP_CROSS_ENTROPY_BACK,
    LT_OP_LINEAR_CE_BACK,
    /* optimizer steps (update a parameter in place) */
    LT_OP_ADAMW,
    LT_OP_SGD,
    LT_OP_COUNT
};

const char *lt_op_name(enum lt_op op); /* "ADD", "SQR", ... */
/* NONE (a leaf), VIEW, RESHAPE, PERMUTE and TRANSPOSE: a node that shares its source's
 * storage and runs no kernel on any backend */
bool lt_op_is_view(enum lt_op op);

enum lt_tensor_flag {
    LT_FLAG_INPUT = 1u << 0,
    LT_FLAG_OUTPUT = 1u << 1,
    LT_FLAG_PARAM = 1u << 2, /* trainable */
    LT_FLAG_LOSS = 1u << 3,
};

struct lt_buffer; /* backend storage, see backend.h */

struct lt_tensor {
    enum lt_type type;
    int64_t ne[LT_MAX_DIMS]; /* element counts, ne[0] innermost */
    size_t nb[LT_MAX_DIMS];  /* byte strides */

    enum lt_op op;
    int32_t op_params[LT_MAX_OP_PARAMS];
    struct lt_tensor *src[LT_MAX_SRC];

    struct lt_tensor *view_src; /* the tensor whose storage this view shares */
    size_t view_offs;           /* byte offset into view_src's storage */

    void *data;                /* host or device address; NULL until allocated */
    struct lt_buffer *buffer;  /* which backend buffer owns data (NULL: host arena) */
    uint32_t flags;            /* enum lt_tensor_flag */
    struct lt_tensor *grad;    /* set by autodiff */
    void *extra;               /* per-pass scratch for schedulers and allocators */
    char name[LT_MAX_NAME];
};

/* ---- context: an arena that owns tensor headers and, unless no_alloc, their data ---- */

struct lt_ctx;

struct lt_ctx_params {
    size_t mem_size; /* bytes for headers (+ data unless no_alloc); grows by chunks */
    bool no_alloc;   /* headers only: data is placed later by an allocator */
};

struct lt_ctx *lt_ctx_init(struct lt_ctx_params params);
void lt_ctx_free(struct lt_ctx *ctx);
size_t lt_ctx_used(const struct lt_ctx *ctx);
bool lt_ctx_no_alloc(const struct lt_ctx *ctx);
/* Raw bytes from the arena (aligned to 64); NULL on out-of-memory. */
void *lt_ctx_alloc(struct lt_ctx *ctx, size_t size);

/* New leaf tensors. Return NULL (with lt_last_error set) on out-of-memory or bad shape. */
struct lt_tensor *lt_new_tensor(struct lt_ctx *ctx, enum lt_type type, int n_dims,
                                const int64_t *ne);
struct lt_tensor *lt_new_tensor_1d(struct lt_ctx *ctx, enum lt_type type, int64_t ne0);
struct lt_tensor *lt_new_tensor_2d(struct lt_ctx *ctx, enum lt_type type, int64_t ne0,
                                   int64_t ne1);
struct lt_tensor *lt_new_tensor_3d(struct lt_ctx *ctx, enum lt_type type, int64_t ne0,
                                   int64_t ne1, int64_t ne2);
struct lt_tensor *lt_new_tensor_4d(struct lt_ctx *ctx, enum lt_type type, int64_t ne0,
                                   int64_t ne1, int64_t ne2, int64_t ne3);
/* A new tensor of a's type and shape (contiguous), no op. */
struct lt_tensor *lt_dup_tensor(struct lt_ctx *ctx, const struct lt_tensor *a);

/* The NULL policy: every constructor and view, given a NULL source (an earlier constructor
 * failed), returns NULL through this one check, and the error names the constructor, the
 * missing source and the failure that left it NULL, so a graph builder may chain calls and
 * check once. lt_sources_present is true when all n sources are there; names is the
 * sources' names, comma-separated (LT_REQUIRE passes its arguments' text). */
bool lt_sources_present(const char *what, const char *names, const struct lt_tensor *const *srcs,
                        int n);
#define LT_REQUIRE(what, ...)                                                                      \
    do {                                                                                           \
        const struct lt_tensor *const lt_req_[] = {__VA_ARGS__};                                   \
        if (!lt_sources_present(what, #__VA_ARGS__, lt_req_,                                       \
                                (int)(sizeof(lt_req_) / sizeof(lt_req_[0]))))                      \
            return NULL;                                                                           \
    } while (0)

/* An op result: type and shape given, sources and op recorded, data allocated unless
 * no_alloc. Used by op constructors (src/ops/). */
struct lt_tensor *lt_new_op_tensor(struct lt_ctx *ctx, enum lt_op op, enum lt_type type,
                                   int n_dims, const int64_t *ne, struct lt_tensor *const *srcs,
                                   int n_srcs);

/* ---- views: share a's storage ---- */
struct lt_tensor *lt_view_1d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, size_t offset);
struct lt_tensor *lt_view_2d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1,
                             size_t nb1, size_t offset);
struct lt_tensor *lt_view_3d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1,
                             int64_t ne2, size_t nb1, size_t nb2, size_t offset);
struct lt_tensor *lt_view_4d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1,
                             int64_t ne2, int64_t ne3, size_t nb1, size_t nb2, size_t nb3,
                             size_t offset);
/* ne0 contiguous elements of type (unblocked, as a's) from byte offset of a's storage (a
 * multiple of the element): one part of a packed result of mixed types, CONV_SILU_BACK's F32
 * d w after a half d x. */
struct lt_tensor *lt_view_1d_as(struct lt_ctx *ctx, struct lt_tensor *a, enum lt_type type,
                                int64_t ne0, size_t offset);
/* a must be contiguous; the element count must match. */
struct lt_tensor *lt_reshape_2d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1);
struct lt_tensor *lt_reshape_3d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1,
                                int64_t ne2);
struct lt_tensor *lt_reshape_4d(struct lt_ctx *ctx, struct lt_tensor *a, int64_t ne0, int64_t ne1,
                                int64_t ne2, int64_t ne3);
/* Axis i of a becomes axis axN of the result (ggml's convention). */
struct lt_tensor *lt_permute(struct lt_ctx *ctx, struct lt_tensor *a, int ax0, int ax1, int ax2,
                             int ax3);
/* Swaps axes 0 and 1. */
struct lt_tensor *lt_transpose(struct lt_ctx *ctx, struct lt_tensor *a);

/* ---- inspection ---- */
int64_t lt_nelements(const struct lt_tensor *t);
int64_t lt_nrows(const struct lt_tensor *t); /* ne[1]*ne[2]*ne[3] */
size_t lt_nbytes(const struct lt_tensor *t); /* bytes spanned, views included */
int lt_n_dims(const struct lt_tensor *t);    /* 1 + index of the last ne > 1 */
bool lt_is_contiguous(const struct lt_tensor *t);
/* Whether two elements of t (a type of one element a block) lie at one address (a broadcast
 * or overlapping view): what an op writing t in place must refuse. */
bool lt_shares_memory(const struct lt_tensor *t);
bool lt_is_view(const struct lt_tensor *t);
bool lt_same_shape(const struct lt_tensor *a, const struct lt_tensor *b);
/* True when b's dims each divide a's (b can be broadcast over a). */
bool lt_can_repeat(const struct lt_tensor *b, const struct lt_tensor *a);
/* "contiguous", "a non-contiguous view", "a transposed view", ... for messages. */
const char *lt_layout_name(const struct lt_tensor *t);
/* The tensor that owns the storage (follows view_src to the end). */
struct lt_tensor *lt_storage_root(struct lt_tensor *t);

struct lt_tensor *lt_set_name(struct lt_tensor *t, const char *name);
struct lt_tensor *lt_format_name(struct lt_tensor *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Op parameters, stored in op_params[]. */
static inline void lt_set_param_i32(struct lt_tensor *t, int i, int32_t v) { t->op_params[i] = v; }
static inline int32_t lt_get_param_i32(const struct lt_tensor *t, int i) { return t->op_params[i]; }
void lt_set_param_f32(struct lt_tensor *t, int i, float v);
float lt_get_param_f32(const struct lt_tensor *t, int i);

/* Element access for host tensors (any layout; F32/F16/BF16/I32). For tests and tools. */
float lt_get_f32_nd(const struct lt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
void lt_set_f32_nd(struct lt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v);
/* Fill a host F32 tensor from a flat row-major array (element order i0 fastest). */
void lt_tensor_fill_f32(struct lt_tensor *t, const float *values);
/* Copy a host tensor of any layout and readable type into a dense float array. */
void lt_tensor_read_f32(const struct lt_tensor *t, float *out);

/* ---- graphs: nodes in topological order (every source before its users) ---- */

struct lt_graph {
    int n_nodes; /* computed tensors (op != NONE), in order */
    int n_leafs; /* leaves (op == NONE) reached */
    int cap;
    struct lt_tensor **nodes;
    struct lt_tensor **leafs;
};

struct lt_graph *lt_graph_new(struct lt_ctx *ctx, int cap);
/* Adds t and everything it depends on (not yet in the graph). */
lt_status lt_graph_build(struct lt_graph *g, struct lt_tensor *t);
bool lt_graph_contains(const struct lt_graph *g, const struct lt_tensor *t);
/* Empties g, its capacity kept, to be built again. */
void lt_graph_clear(struct lt_graph *g);

#ifdef __cplusplus
}
#endif
#endif
