/* ops_nn_util.h: what test_ops_nn*.c share: a seeded generator, inputs laid out as
 * contiguous tensors or as transposed, permuted and sliced views (the storage outside the
 * view is NaN, so a kernel that reads past its view shows it), and running one node on a
 * CPU backend of 1 or 2 threads. */
#ifndef LATHE_TESTS_OPS_NN_UTIL_H
#define LATHE_TESTS_OPS_NN_UTIL_H

#include <string.h>

#include "check.h"
#include "lathe/backend.h"
#include "lathe/ops.h"

static uint64_t nn_rng_state = 0x9E3779B97F4A7C15ull;

/* uniform in [-1, 1) */
static inline float nn_rand(void)
{
    nn_rng_state ^= nn_rng_state << 13;
    nn_rng_state ^= nn_rng_state >> 7;
    nn_rng_state ^= nn_rng_state << 17;
    return (float)((nn_rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

enum nn_layout { NN_CONTIG, NN_TRANSPOSED, NN_PERMUTED, NN_SLICED, NN_LAYOUT_COUNT };
static const char *const nn_layout_names[] = {"contiguous", "transposed", "permuted", "sliced"};

static inline void nn_fill_nan(struct lt_tensor *s)
{
    int64_t n = lt_nelements(s);
    for (int64_t i = 0; i < n; i++) {
        int64_t i0 = i % s->ne[0], i1 = (i / s->ne[0]) % s->ne[1];
        int64_t i2 = (i / (s->ne[0] * s->ne[1])) % s->ne[2], i3 = i / (s->ne[0] * s->ne[1] * s->ne[2]);
        lt_set_f32_nd(s, i0, i1, i2, i3, NAN);
    }
}

/* A tensor of logical shape ne in the given layout, NaN outside the view. */
static inline struct lt_tensor *nn_make(struct lt_ctx *ctx, enum lt_type type, enum nn_layout lay,
                                        const int64_t ne[4])
{
    struct lt_tensor *s, *t;
    switch (lay) {
    case NN_TRANSPOSED: /* storage [ne1, ne0, ne2, ne3], axes 0 and 1 swapped */
        s = lt_new_tensor_4d(ctx, type, ne[1], ne[0], ne[2], ne[3]);
        nn_fill_nan(s);
        t = lt_transpose(ctx, s);
        break;
    case NN_PERMUTED: /* storage [ne2, ne0, ne1, ne3]: neither dim 0 nor 1 is unit-strided */
        s = lt_new_tensor_4d(ctx, type, ne[2], ne[0], ne[1], ne[3]);
        nn_fill_nan(s);
        t = lt_permute(ctx, s, 2, 0, 1, 3);
        break;
    case NN_SLICED: /* a window of a larger tensor, starting at (1, 2, 1, 0) */
        s = lt_new_tensor_4d(ctx, type, ne[0] + 3, ne[1] + 2, ne[2] + 1, ne[3]);
        nn_fill_nan(s);
        t = lt_view_4d(ctx, s, ne[0], ne[1], ne[2], ne[3], s->nb[1], s->nb[2], s->nb[3],
                       s->nb[0] + 2 * s->nb[1] + s->nb[2]);
        break;
    default:
        t = lt_new_tensor_4d(ctx, type, ne[0], ne[1], ne[2], ne[3]);
        break;
    }
    for (int i = 0; i < 4; i++)
        if (!t || t->ne[i] != ne[i])
            return NULL;
    return t;
}

/* Random values into t (any layout); ref gets the values as stored (rounded for F16/BF16). */
static inline void nn_fill_rand(struct lt_tensor *t, float *ref, float scale)
{
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++, k++) {
                    lt_set_f32_nd(t, i0, i1, i2, i3, nn_rand() * scale);
                    ref[k] = lt_get_f32_nd(t, i0, i1, i2, i3);
                }
}

static inline void nn_fill_values(struct lt_tensor *t, const float *vals)
{
    lt_tensor_fill_f32(t, vals);
}

static struct lt_backend *nn_cpu[3]; /* [1], [2]: backends of 1 and 2 threads */

static inline void nn_backends_init(void)
{
    nn_cpu[1] = lt_backend_cpu_new(1);
    nn_cpu[2] = lt_backend_cpu_new(2);
}

static inline void nn_backends_free(void)
{
    lt_backend_free(nn_cpu[1]);
    lt_backend_free(nn_cpu[2]);
}

/* Computes node (and any views it reads) on nth threads; returns the status. */
static inline lt_status nn_run(struct lt_ctx *ctx, struct lt_tensor *node, int nth)
{
    struct lt_graph *g = lt_graph_new(ctx, 64);
    if (!g)
        return LT_ERR_NOMEM;
    lt_status st = lt_graph_build(g, node);
    if (st != LT_OK)
        return st;
    return lt_cpu_graph_compute(nn_cpu[nth], g);
}

/* Index of (i0..i3) in a dense array of shape ne. */
static inline int64_t nn_idx(const int64_t ne[4], int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return i0 + ne[0] * (i1 + ne[1] * (i2 + ne[2] * i3));
}

static inline int64_t nn_count(const int64_t ne[4]) { return ne[0] * ne[1] * ne[2] * ne[3]; }

#endif
