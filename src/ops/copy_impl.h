/* copy_impl.h (internal): what the copy-family files (copy.c: cont, cpy, concat, acc;
 * repeat.c: repeat, repeat_back; gather.c: get_rows, get_rows_back) share: type and row
 * helpers, the shape failure, the kernels' preconditions and the byte-size op params. */
#ifndef LATHE_OPS_COPY_IMPL_H
#define LATHE_OPS_COPY_IMPL_H

#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/op.h"

static inline bool type_readable(enum lt_type t)
{
    const struct lt_type_traits *tt = lt_type_traits(t);
    return tt && tt->to_float;
}

static inline void row_index(const struct lt_tensor *t, int64_t r, int64_t *i1, int64_t *i2,
                             int64_t *i3)
{
    *i1 = r % t->ne[1];
    *i2 = (r / t->ne[1]) % t->ne[2];
    *i3 = r / (t->ne[1] * t->ne[2]);
}

static inline struct lt_tensor *fail_shapes(enum lt_op op, const struct lt_tensor *a,
                                            const struct lt_tensor *b, const char *why)
{
    lt_fail(LT_ERR_INVALID, "%s of '%s' [%lld %lld %lld %lld] and '%s' [%lld %lld %lld %lld]: %s",
            lt_op_name(op), a->name, (long long)a->ne[0], (long long)a->ne[1], (long long)a->ne[2],
            (long long)a->ne[3], b->name, (long long)b->ne[0], (long long)b->ne[1],
            (long long)b->ne[2], (long long)b->ne[3], why);
    return NULL;
}

static inline bool check_result_f32(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is %s %s, not contiguous f32",
                 lt_type_name(node->type), lt_layout_name(node));
        return false;
    }
    return true;
}

static inline bool check_source_readable(const struct lt_tensor *node, int i, char *reason,
                                         size_t reason_size)
{
    const struct lt_tensor *s = node->src[i];
    if (!s || !type_readable(s->type)) {
        snprintf(reason, reason_size, "source %d has type %s, which the CPU cannot read", i,
                 s ? lt_type_name(s->type) : "(missing)");
        return false;
    }
    return true;
}

/* Scratch of ne0 floats per thread for the node's widest row. */
static inline size_t row_work_size(int64_t ne0, int nth)
{
    return (size_t)nth * lt_scratch_floats(ne0) * sizeof(float);
}

/* Sizes (byte offsets, strides) are kept in two int32 slots each, low half first. */
static inline void set_param_size(struct lt_tensor *t, int i, size_t v)
{
    uint64_t u = v;
    t->op_params[i] = (int32_t)(uint32_t)(u & 0xffffffffu);
    t->op_params[i + 1] = (int32_t)(uint32_t)(u >> 32);
}

static inline size_t get_param_size(const struct lt_tensor *t, int i)
{
    uint64_t lo = (uint32_t)t->op_params[i], hi = (uint32_t)t->op_params[i + 1];
    return (size_t)(lo | hi << 32);
}

#endif
