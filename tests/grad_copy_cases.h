/* grad_copy_cases.h: the finite-difference cases of the copy family (copy.c: cont, cpy,
 * concat, repeat, repeat_back, get_rows, get_rows_back, acc), every source contiguous,
 * transposed, permuted and sliced; each a gradcheck (gradcheck.h) and a layout check of its
 * backward graph (grad_basic.h). test_grad_basic_copy.c runs them on the CPU,
 * test_grad_sched.c and gpu/test_cuda_gradcheck.c through the scheduler.
 *
 * gradcheck's sliced layout starts the window ne0 / 2 elements in, in bytes: shapes here
 * keep ne0 even so every float stays aligned. */
#ifndef LATHE_TESTS_GRAD_COPY_CASES_H
#define LATHE_TESTS_GRAD_COPY_CASES_H

#include "grad_basic.h"

#define NE4(a)                                                                                     \
    {                                                                                              \
        (a)[0], (a)[1], (a)[2], (a)[3]                                                             \
    }

static const int64_t COPY_NE[4] = {4, 3, 2, 2};

/* ---- cont, cpy ---- */

static struct lt_tensor *build_cont(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_cont(ctx, x[0]);
}

/* x[1] is the destination (not trainable): same shape, or the same elements reshaped */
static struct lt_tensor *build_cpy(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_cpy(ctx, x[0], x[1]);
}

static void test_cont_cpy(void)
{
    static const int64_t reshaped[4] = {8, 6, 1, 1}; /* COPY_NE's 48 elements */
    for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
        char name[96];
        struct gc_input in = {LT_TYPE_F32, NE4(COPY_NE), l, true, -2, 2};
        snprintf(name, sizeof(name), "cont, %s", gc_layout_names[l]);
        check_case(name, build_cont, NULL, &in, 1);
        /* source in layout l into a contiguous dst; contiguous source into dst in layout l
         * (a sliced dst is a window of a larger tensor); source into a reshaped dst */
        struct gc_input cases[3][2] = {
            {{LT_TYPE_F32, NE4(COPY_NE), l, true, -2, 2},
             {LT_TYPE_F32, NE4(COPY_NE), GC_CONTIGUOUS, false, -9, 9}},
            {{LT_TYPE_F32, NE4(COPY_NE), GC_CONTIGUOUS, true, -2, 2},
             {LT_TYPE_F32, NE4(COPY_NE), l, false, -9, 9}},
            {{LT_TYPE_F32, NE4(COPY_NE), l, true, -2, 2},
             {LT_TYPE_F32, NE4(reshaped), GC_CONTIGUOUS, false, -9, 9}},
        };
        static const char *const what[3] = {"source", "dst", "source, reshaped dst"};
        for (int c = 0; c < 3; c++) {
            snprintf(name, sizeof(name), "cpy, %s %s", what[c], gc_layout_names[l]);
            check_case(name, build_cpy, NULL, cases[c], 2);
        }
    }
}

/* ---- concat ---- */

static struct lt_tensor *build_concat(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    return lt_concat(ctx, x[0], x[1], *(const int *)user);
}

static void test_concat(void)
{
    static const int dims[4] = {0, 1, 2, 3};
    for (int d = 0; d < 4; d++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            int64_t bne[4] = NE4(COPY_NE);
            bne[d] = 2;
            struct gc_input in[2] = {{LT_TYPE_F32, NE4(COPY_NE), l, true, -2, 2},
                                     {LT_TYPE_F32, NE4(bne), l, true, -2, 2}};
            char name[64];
            snprintf(name, sizeof(name), "concat along %d, %s", d, gc_layout_names[l]);
            check_case(name, build_concat, (void *)&dims[d], in, 2);
            in[0].trainable = false;
            snprintf(name, sizeof(name), "concat along %d (b only), %s", d, gc_layout_names[l]);
            check_case(name, build_concat, (void *)&dims[d], in, 2);
        }
}

/* ---- repeat and repeat_back ---- */

/* user: the shape to repeat to (or sum down to) */
static struct lt_tensor *build_repeat(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const int64_t *ne = user;
    return lt_repeat(ctx, x[0], lt_new_tensor_4d(ctx, LT_TYPE_F32, ne[0], ne[1], ne[2], ne[3]));
}

static struct lt_tensor *build_repeat_back(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const int64_t *ne = user;
    return lt_repeat_back(ctx, x[0],
                          lt_new_tensor_4d(ctx, LT_TYPE_F32, ne[0], ne[1], ne[2], ne[3]));
}

static void test_repeat(void)
{
    static int64_t big[4] = {4, 6, 2, 2}, small[2][4] = {{2, 3, 1, 2}, {4, 1, 2, 1}};
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            char name[64];
            struct gc_input in = {LT_TYPE_F32, NE4(small[s]), l, true, -2, 2};
            snprintf(name, sizeof(name), "repeat %d, %s", s, gc_layout_names[l]);
            check_case(name, build_repeat, big, &in, 1);
            struct gc_input back = {LT_TYPE_F32, NE4(big), l, true, -2, 2};
            snprintf(name, sizeof(name), "repeat_back %d, %s", s, gc_layout_names[l]);
            check_case(name, build_repeat_back, small[s], &back, 1);
        }
}

/* ---- get_rows and get_rows_back ---- */

static struct lt_tensor *build_get_rows(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_get_rows(ctx, x[0], x[1]);
}

/* user: the shape of the table the rows are sent back to */
static struct lt_tensor *build_get_rows_back(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const int64_t *ne = user;
    return lt_get_rows_back(ctx, x[0], x[1],
                            lt_new_tensor_4d(ctx, LT_TYPE_F32, ne[0], ne[1], ne[2], ne[3]));
}

static void test_get_rows(void)
{
    /* a 2-D table with repeated ids (9 picks from 5 rows), and a batched one */
    static int64_t table[2][4] = {{4, 5, 1, 1}, {4, 5, 3, 1}};
    static const int64_t ids[2][4] = {{9, 1, 1, 1}, {4, 3, 1, 1}};
    for (int t = 0; t < 2; t++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            char name[64];
            struct gc_input in[2] = {{LT_TYPE_F32, NE4(table[t]), l, true, -2, 2},
                                     {LT_TYPE_I32, NE4(ids[t]), GC_CONTIGUOUS, false, 0, 5}};
            snprintf(name, sizeof(name), "get_rows %d, %s", t, gc_layout_names[l]);
            check_case(name, build_get_rows, NULL, in, 2);
            /* get_rows_back: grad [n, k, ne2] in layout l, back into the table's shape */
            in[0] = (struct gc_input){
                LT_TYPE_F32, {table[t][0], ids[t][0], table[t][2], 1}, l, true, -2, 2};
            snprintf(name, sizeof(name), "get_rows_back %d, %s", t, gc_layout_names[l]);
            check_case(name, build_get_rows_back, table[t], in, 2);
        }
    /* ids given as a (non-contiguous) slice: the rule reads a contiguous copy of them */
    struct gc_input in[2] = {{LT_TYPE_F32, NE4(table[1]), GC_TRANSPOSED, true, -2, 2},
                             {LT_TYPE_I32, NE4(ids[1]), GC_SLICED, false, 0, 5}};
    check_case("get_rows, sliced ids", build_get_rows, NULL, in, 2);
}

/* ---- acc ---- */

struct acc_window {
    size_t nb1, nb2, nb3, offset;
};

static struct lt_tensor *build_acc(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    const struct acc_window *w = user;
    return lt_acc(ctx, x[0], x[1], w->nb1, w->nb2, w->nb3, w->offset);
}

static void test_acc(void)
{
    /* a [6, 5, 2, 2] (contiguous F32 result: rows of 24 bytes), b [2, 3, 2, 1]: a window
     * of whole rows, and one whose rows overlap (stride one float, rows two wide) */
    static const int64_t a_ne[4] = {6, 5, 2, 2}, b_ne[4] = {2, 3, 2, 1};
    static const struct acc_window windows[2] = {
        {6 * 4, 30 * 4, 60 * 4, (1 * 6 + 2) * 4},
        {1 * 4, 30 * 4, 60 * 4, (30 + 6 + 1) * 4},
    };
    for (int k = 0; k < 2; k++)
        for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
            char name[64];
            struct gc_input in[2] = {{LT_TYPE_F32, NE4(a_ne), l, true, -2, 2},
                                     {LT_TYPE_F32, NE4(b_ne), l, true, -2, 2}};
            snprintf(name, sizeof(name), "acc %s, %s", k ? "overlapping" : "rows",
                     gc_layout_names[l]);
            check_case(name, build_acc, (void *)&windows[k], in, 2);
        }
}
#endif
