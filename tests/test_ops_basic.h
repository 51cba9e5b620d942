/* test_ops_basic.h: what the basic-op tests share: inputs in several layouts, a seeded
 * generator, and a runner that evaluates a result's graph on the CPU backend with 1 and 2
 * threads and compares it with a reference computed by plain loops in the test.
 *
 * Every input is made in the requested layout from a larger or reordered base tensor whose
 * other elements are NaN, so a kernel that reads outside a view shows up as NaN. */
#ifndef LATHE_TESTS_OPS_BASIC_H
#define LATHE_TESTS_OPS_BASIC_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lathe/backend.h"
#include "lathe/ops.h"

enum layout {
    LAYOUT_CONTIGUOUS,
    LAYOUT_TRANSPOSED, /* lt_transpose of a [ne1, ne0, ne2, ne3] base */
    LAYOUT_PERMUTED,   /* lt_permute(1, 2, 0, 3) of a [ne1, ne2, ne0, ne3] base */
    LAYOUT_SLICED,     /* lt_view_4d inside a [ne0 + 2, ne1 + 1, ne2 + 1, ne3] base */
    LAYOUT_COUNT
};

static const char *const layout_names[LAYOUT_COUNT] = {"contiguous", "transposed", "permuted",
                                                       "sliced"};

struct ops_test {
    struct lt_ctx *ctx;
    struct lt_backend *cpu[2]; /* 1 and 2 threads */
    uint64_t rng;
};

static inline void ops_test_init(struct ops_test *t)
{
    t->ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 16u << 20});
    t->cpu[0] = lt_backend_cpu_new(1);
    t->cpu[1] = lt_backend_cpu_new(2);
    t->rng = 0x9e3779b97f4a7c15ull;
    if (!t->ctx || !t->cpu[0] || !t->cpu[1]) {
        fprintf(stderr, "cannot set up: %s\n", lt_last_error());
        exit(1);
    }
}

static inline void ops_test_free(struct ops_test *t)
{
    lt_backend_free(t->cpu[0]);
    lt_backend_free(t->cpu[1]);
    lt_ctx_free(t->ctx);
}

/* uniform in [lo, hi) */
static inline float rnd(struct ops_test *t, float lo, float hi)
{
    t->rng = t->rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((t->rng >> 40) * (1.0 / 16777216.0));
}

/* NaN in every element (I32: a value no test expects) */
static inline void fill_nan(struct lt_tensor *t)
{
    float v = t->type == LT_TYPE_I32 ? -7777.0f : NAN;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
                    lt_set_f32_nd(t, i0, i1, i2, i3, v);
}

static inline void fill_rnd(struct ops_test *t, struct lt_tensor *x, float lo, float hi)
{
    for (int64_t i3 = 0; i3 < x->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < x->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < x->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < x->ne[0]; i0++)
                    lt_set_f32_nd(x, i0, i1, i2, i3, rnd(t, lo, hi));
}

/* A [ne0..ne3] tensor of `type` in `layout`, filled uniformly in [lo, hi). */
static inline struct lt_tensor *input_new(struct ops_test *t, enum lt_type type, const int64_t *ne,
                                          enum layout layout, float lo, float hi)
{
    struct lt_ctx *ctx = t->ctx;
    struct lt_tensor *base = NULL, *x = NULL;
    switch (layout) {
    case LAYOUT_CONTIGUOUS: x = lt_new_tensor_4d(ctx, type, ne[0], ne[1], ne[2], ne[3]); break;
    case LAYOUT_TRANSPOSED:
        base = lt_new_tensor_4d(ctx, type, ne[1], ne[0], ne[2], ne[3]);
        fill_nan(base);
        x = lt_transpose(ctx, base);
        break;
    case LAYOUT_PERMUTED:
        base = lt_new_tensor_4d(ctx, type, ne[1], ne[2], ne[0], ne[3]);
        fill_nan(base);
        x = lt_permute(ctx, base, 1, 2, 0, 3);
        break;
    case LAYOUT_SLICED:
        base = lt_new_tensor_4d(ctx, type, ne[0] + 2, ne[1] + 1, ne[2] + 1, ne[3]);
        fill_nan(base);
        x = lt_view_4d(ctx, base, ne[0], ne[1], ne[2], ne[3], base->nb[1], base->nb[2], base->nb[3],
                       base->nb[0] + base->nb[1] + base->nb[2]);
        break;
    default: break;
    }
    if (!x) {
        fprintf(stderr, "cannot make an input: %s\n", lt_last_error());
        exit(1);
    }
    for (int i = 0; i < 4; i++)
        if (x->ne[i] != ne[i]) {
            fprintf(stderr, "input_new made the wrong shape\n");
            exit(1);
        }
    lt_set_name(x, layout_names[layout]);
    fill_rnd(t, x, lo, hi);
    return x;
}

/* The values of any host tensor (F32/F16/BF16/I32, any strides), i0 fastest; free() it. */
static inline float *dense(const struct lt_tensor *x)
{
    float *v = malloc(sizeof(float) * (size_t)(lt_nelements(x) ? lt_nelements(x) : 1));
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < x->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < x->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < x->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < x->ne[0]; i0++)
                    v[k++] = lt_get_f32_nd(x, i0, i1, i2, i3);
    return v;
}

/* flat index of (i0..i3) in a dense array of shape ne */
static inline int64_t flat(const int64_t *ne, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0;
}

/* Runs out's graph on 1 and then 2 threads; before each run out's elements are set to NaN
 * so a run that writes nothing cannot pass on the previous run's values. Each time out
 * must equal ref within |out - ref| <= atol + rtol |ref| (NaN matches NaN). */
static inline void check_op(struct ops_test *t, struct lt_tensor *out, const float *ref,
                            double atol, double rtol, const char *what)
{
    CHECK(out != NULL, "%s: constructor failed: %s", what, lt_last_error());
    if (!out)
        return;
    struct lt_graph *g = lt_graph_new(t->ctx, 256);
    CHECK(g && lt_graph_build(g, out) == LT_OK, "%s: graph", what);
    int64_t n = lt_nelements(out);
    for (int k = 0; k < 2; k++) {
        char reason[256] = "";
        CHECK(lt_backend_supports_op(t->cpu[k], out, reason, sizeof(reason)), "%s: CPU says no: %s",
              what, reason);
        fill_nan(out);
        lt_status st = lt_cpu_graph_compute(t->cpu[k], g);
        CHECK(st == LT_OK, "%s: compute: %s", what, lt_last_error());
        float *got = dense(out);
        long worst = 0, bad = 0;
        for (int64_t i = 0; i < n; i++) {
            bool both_nan = isnan(got[i]) && isnan(ref[i]);
            if (!both_nan && !(fabs((double)got[i] - ref[i]) <= atol + rtol * fabs(ref[i]))) {
                if (!bad)
                    worst = (long)i;
                bad++;
            }
        }
        CHECK(bad == 0, "%s (%d thread%s): %ld of %lld differ, first at %ld: %g, expected %g", what,
              k + 1, k ? "s" : "", bad, (long long)n, worst, bad ? got[worst] : 0.0,
              bad ? ref[worst] : 0.0);
        free(got);
    }
}

/* The constructor must have refused (NULL) with a reason that names `name`. */
static inline void check_refused(struct lt_tensor *r, const char *name, const char *what)
{
    CHECK(r == NULL, "%s: bad shapes were accepted", what);
    CHECK(strstr(lt_last_error(), name) != NULL, "%s: the reason '%s' does not name '%s'", what,
          lt_last_error(), name);
    lt_clear_error();
}

#endif
