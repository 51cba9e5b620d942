/* tensor_access.h (internal): reading and writing a tensor's elements and rows on the host,
 * whatever its strides and type: core's own conversions (lt_tensor_read_f32) and every CPU
 * kernel use them. */
#ifndef LATHE_CORE_TENSOR_ACCESS_H
#define LATHE_CORE_TENSOR_ACCESS_H

#include <stdint.h>

#include "lathe/tensor.h"

/* Address of element (i0..i3) of a tensor with data. */
static inline void *lt_elem_ptr(const struct lt_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                                int64_t i3)
{
    return (char *)t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

/* Reads row (i1, i2, i3) of t (any readable type, any ne0 stride) as ne0 floats. */
void lt_row_to_f32(const struct lt_tensor *t, int64_t i1, int64_t i2, int64_t i3, float *out);
/* Writes ne0 floats into row (i1, i2, i3) of t (F32/F16/BF16 or a from_float type). */
void lt_row_from_f32(struct lt_tensor *t, int64_t i1, int64_t i2, int64_t i3, const float *in);
/* Row (i1, i2, i3) of t as ne0 contiguous floats: t's own memory when it already is that,
 * otherwise converted into buf. */
static inline const float *lt_row_f32(const struct lt_tensor *t, int64_t i1, int64_t i2,
                                      int64_t i3, float *buf)
{
    if (t->type == LT_TYPE_F32 && t->nb[0] == sizeof(float))
        return (const float *)lt_elem_ptr(t, 0, i1, i2, i3);
    lt_row_to_f32(t, i1, i2, i3, buf);
    return buf;
}

#endif
