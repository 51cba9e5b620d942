/* test_grad_basic_copy.c: backward rules of the copy family (copy.c: cont, cpy, concat,
 * repeat, get_rows, acc, repeat_back, get_rows_back) checked by finite differences
 * (tests/gradcheck.h) with every source contiguous, transposed, permuted and sliced, and
 * the backward graph's layouts beside each (grad_basic.h).
 *
 * CPY is also checked by hand where finite differences cannot see it: dst (trainable, and a
 * window of a larger trainable tensor) gets no gradient from the copy, and a copy into F16
 * passes the gradient through unchanged. A frozen (F16, not trainable) embedding table gets
 * no GET_ROWS_BACK at all. Row windows of a BF16 rounding send their F32 gradients to the
 * rows they view.
 *
 * The layout cases live in grad_copy_cases.h, which test_grad_sched.c also runs through
 * the scheduler; the checks by hand stay here. */
#include "grad_copy_cases.h"

/* loss's graph and its backward, built in ctx and run on the CPU backend */
static lt_status backward_on_cpu(struct lt_ctx *ctx, struct lt_backend *cpu, struct lt_tensor *loss)
{
    struct lt_graph *g = lt_graph_new(ctx, 256);
    lt_status st = g ? lt_graph_build(g, loss) : LT_ERR_NOMEM;
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
    return st == LT_OK ? lt_cpu_graph_compute(cpu, g) : st;
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
    lt_status st = backward_on_cpu(ctx, cpu, loss);
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
    st = backward_on_cpu(ctx, cpu, loss16);
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

/* Views of a half rounding take F32 gradients: a trainable a [4, 6] rounded to BF16 whole,
 * two row windows of the rounding read (rows 1..2 and 4..5, as LoRA's B rounded once and
 * viewed a row range at a time): a's gradient is w1 and w2 on those rows, 0 elsewhere. The
 * windows' strides and offsets are the half tensor's bytes, the accumulator's F32. */
static void test_view_of_half(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_tensor *a = lt_set_name(lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 6), "a");
    struct lt_tensor *w1 = lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 2);
    struct lt_tensor *w2 = lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 2);
    a->flags |= LT_FLAG_PARAM;
    for (int i = 0; i < 24; i++)
        ((float *)a->data)[i] = 0.5f * (float)i - 3.0f;
    for (int i = 0; i < 8; i++) {
        ((float *)w1->data)[i] = 0.25f * (float)i + 1.0f;
        ((float *)w2->data)[i] = -0.5f * (float)i;
    }
    struct lt_tensor *h = lt_cont_as(ctx, a, LT_TYPE_BF16);
    struct lt_tensor *v1 = lt_view_2d(ctx, h, 4, 2, h->nb[1], 1 * h->nb[1]);
    struct lt_tensor *v2 = lt_view_2d(ctx, h, 4, 2, h->nb[1], 4 * h->nb[1]);
    struct lt_tensor *loss =
        lt_add(ctx, lt_sum(ctx, lt_mul(ctx, v1, w1)), lt_sum(ctx, lt_mul(ctx, v2, w2)));
    lt_status st = backward_on_cpu(ctx, cpu, loss);
    CHECK(st == LT_OK && a->grad, "views of a BF16 rounding: %s", lt_last_error());
    if (st == LT_OK && a->grad) {
        float ga[24];
        lt_tensor_read_f32(a->grad, ga);
        for (int r = 0; r < 6; r++)
            for (int c = 0; c < 4; c++) {
                const float *w = r == 1 || r == 2   ? (float *)w1->data + (r - 1) * 4
                                 : r == 4 || r == 5 ? (float *)w2->data + (r - 4) * 4
                                                    : NULL;
                const float expect = w ? w[c] : 0.0f;
                CHECK(ga[r * 4 + c] == expect,
                      "views of a BF16 rounding: d a[%d, %d] = %g, "
                      "expected %g",
                      r, c, (double)ga[r * 4 + c], (double)expect);
            }
    }
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
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

int main(void)
{
    test_cont_cpy();
    test_cpy_dst();
    test_view_of_half();
    test_concat();
    test_repeat();
    test_get_rows();
    test_frozen_table();
    test_acc();
    return check_summary();
}
