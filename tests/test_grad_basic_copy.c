/* test_grad_basic_copy.c: backward rules of the copy family (copy.c: cont, cpy, concat,
 * repeat, get_rows, acc, repeat_back, get_rows_back) checked by finite differences
 * (tests/gradcheck.h) with every source contiguous, transposed, permuted and sliced, and
 * the backward graph's layouts beside each (grad_basic.h).
 *
 * CPY is also checked by hand where finite differences cannot see it: dst (trainable, and a
 * window of a larger trainable tensor) gets no gradient from the copy, and a copy into F16
 * passes the gradient through unchanged. A frozen (F16, not trainable) embedding table gets
 * no GET_ROWS_BACK at all.
 *
 * gradcheck's sliced layout starts the window ne0 / 2 elements in, in bytes: shapes here
 * keep ne0 even so every float stays aligned. */
#include "grad_basic.h"

#define NE4(a)                                                                                     \
    {                                                                                              \
        (a)[0], (a)[1], (a)[2], (a)[3]                                                             \
    }

static const int64_t X_NE[4] = {4, 3, 2, 2};

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
    static const int64_t reshaped[4] = {8, 6, 1, 1}; /* X_NE's 48 elements */
    for (int l = 0; l < GC_LAYOUT_COUNT; l++) {
        char name[96];
        struct gc_input in = {LT_TYPE_F32, NE4(X_NE), l, true, -2, 2};
        snprintf(name, sizeof(name), "cont, %s", gc_layout_names[l]);
        check_case(name, build_cont, NULL, &in, 1);
        /* source in layout l into a contiguous dst; contiguous source into dst in layout l
         * (a sliced dst is a window of a larger tensor); source into a reshaped dst */
        struct gc_input cases[3][2] = {
            {{LT_TYPE_F32, NE4(X_NE), l, true, -2, 2},
             {LT_TYPE_F32, NE4(X_NE), GC_CONTIGUOUS, false, -9, 9}},
            {{LT_TYPE_F32, NE4(X_NE), GC_CONTIGUOUS, true, -2, 2},
             {LT_TYPE_F32, NE4(X_NE), l, false, -9, 9}},
            {{LT_TYPE_F32, NE4(X_NE), l, true, -2, 2},
             {LT_TYPE_F32, NE4(reshaped), GC_CONTIGUOUS, false, -9, 9}},
        };
        static const char *const what[3] = {"source", "dst", "source, reshaped dst"};
        for (int c = 0; c < 3; c++) {
            snprintf(name, sizeof(name), "cpy, %s %s", what[c], gc_layout_names[l]);
            check_case(name, build_cpy, NULL, cases[c], 2);
        }
    }
}

/* loss = sum(cpy(a, window of D) * w) + sum(other window of D * w2), D and a trainable:
 * a's gradient is w; D's is w2 on the window read and 0 elsewhere, the copied window
 * included (its old values are overwritten). And a copy into F16 passes w through. */
static void test_cpy_dst(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_tensor *a = lt_new_tensor_2d(ctx, LT_TYPE_F32, 3, 2);
    struct lt_tensor *D = lt_new_tensor_2d(ctx, LT_TYPE_F32, 8, 4);
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, 3, 2);
    struct lt_tensor *w2 = lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 2);
    struct lt_tensor *h = lt_new_tensor_2d(ctx, LT_TYPE_F16, 3, 2);
    lt_set_name(a, "a");
    lt_set_name(D, "D");
    a->flags |= LT_FLAG_PARAM;
    D->flags |= LT_FLAG_PARAM;
    for (int i = 0; i < 6; i++) {
        ((float *)a->data)[i] = 0.25f * (float)i - 0.5f;
        ((float *)w->data)[i] = 0.5f - 0.125f * (float)i;
    }
    for (int i = 0; i < 32; i++)
        ((float *)D->data)[i] = (float)i;
    for (int i = 0; i < 8; i++)
        ((float *)w2->data)[i] = 0.25f * (float)i + 1.0f;
    /* rows 1..2, columns 2..4 of D are overwritten; rows 2..3, columns 4..7 are read */
    struct lt_tensor *dst = lt_view_2d(ctx, D, 3, 2, D->nb[1], D->nb[1] + 2 * sizeof(float));
    struct lt_tensor *other = lt_view_2d(ctx, D, 4, 2, D->nb[1], 2 * D->nb[1] + 4 * sizeof(float));
    struct lt_tensor *y = lt_cpy(ctx, a, dst);
    struct lt_tensor *loss =
        lt_add(ctx, lt_sum(ctx, lt_mul(ctx, y, w)), lt_sum(ctx, lt_mul(ctx, other, w2)));
    /* second graph: a into F16, then read */
    struct lt_tensor *loss16 = lt_sum(ctx, lt_mul(ctx, lt_cpy(ctx, a, h), w));
    struct lt_graph *g = lt_graph_new(ctx, 256);
    lt_status st = lt_graph_build(g, loss);
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
    if (st == LT_OK)
        st = lt_cpu_graph_compute(cpu, g);
    CHECK(st == LT_OK, "%s", lt_last_error());
    CHECK(a->grad && D->grad, "both a and D have gradients");
    if (st == LT_OK && a->grad && D->grad) {
        float ga[6], gd[32];
        lt_tensor_read_f32(a->grad, ga);
        lt_tensor_read_f32(D->grad, gd);
        for (int i = 0; i < 6; i++)
            CHECK(ga[i] == ((float *)w->data)[i], "d a[%d] = %g", i, (double)ga[i]);
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 8; c++) {
                float expect = r >= 2 && c >= 4 ? ((float *)w2->data)[(r - 2) * 4 + c - 4] : 0.0f;
                CHECK(gd[r * 8 + c] == expect, "d D[%d, %d] = %g, expected %g", r, c,
                      (double)gd[r * 8 + c], (double)expect);
            }
        /* the copy ran: D's window holds a's values */
        CHECK(((float *)D->data)[1 * 8 + 2] == ((float *)a->data)[0] &&
              ((float *)D->data)[2 * 8 + 4] == ((float *)a->data)[5]);
    }
    a->grad = NULL;
    struct lt_graph *g16 = lt_graph_new(ctx, 256);
    st = lt_graph_build(g16, loss16);
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g16, loss16, 1.0f, NULL);
    if (st == LT_OK)
        st = lt_cpu_graph_compute(cpu, g16);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st == LT_OK && a->grad) {
        float ga[6];
        lt_tensor_read_f32(a->grad, ga);
        for (int i = 0; i < 6; i++)
            CHECK(ga[i] == ((float *)w->data)[i], "through F16: d a[%d] = %g", i, (double)ga[i]);
    }
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
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
            int64_t bne[4] = NE4(X_NE);
            bne[d] = 2;
            struct gc_input in[2] = {{LT_TYPE_F32, NE4(X_NE), l, true, -2, 2},
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

/* A frozen F16 table (not trainable) gets no gradient and no GET_ROWS_BACK, while the
 * trainable tensor multiplied with its rows gets its own. */
static void test_frozen_table(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_tensor *table = lt_new_tensor_2d(ctx, LT_TYPE_F16, 4, 6);
    struct lt_tensor *ids = lt_new_tensor_1d(ctx, LT_TYPE_I32, 3);
    struct lt_tensor *x = lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 3);
    x->flags |= LT_FLAG_PARAM;
    struct lt_tensor *loss = lt_sum(ctx, lt_mul(ctx, lt_get_rows(ctx, table, ids), x));
    struct lt_graph *g = lt_graph_new(ctx, 256);
    lt_status st = lt_graph_build(g, loss);
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
    CHECK(st == LT_OK, "%s", lt_last_error());
    CHECK(x->grad != NULL && table->grad == NULL);
    for (int i = 0; i < g->n_nodes; i++)
        CHECK(g->nodes[i]->op != LT_OP_GET_ROWS_BACK, "a frozen table got '%s'", g->nodes[i]->name);
    lt_ctx_free(ctx);
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

int main(void)
{
    test_cont_cpy();
    test_cpy_dst();
    test_concat();
    test_repeat();
    test_get_rows();
    test_frozen_table();
    test_acc();
    return check_summary();
}
