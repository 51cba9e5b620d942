/* test_grad_basic.c: backward rules of the element-wise and reduction ops (binary.c,
 * unary.c, reduce.c) checked by finite differences (tests/gradcheck.h) with every source
 * contiguous, transposed, permuted and sliced, and b broadcast over a for the binary ops.
 *
 * Beside each check, the backward graph's layouts (grad_basic.h: every node the CPU
 * accepts, no strided source but for copies and views). The case that crashed llama.cpp,
 * SQR of a non-contiguous slice of a trainable tensor, is checked by name, with its
 * gradient against a plain loop.
 *
 * The layout cases live in grad_basic_cases.h, which test_grad_sched.c also runs through
 * the scheduler; here beside them are the checks against plain loops. */
#include "grad_basic_cases.h"

/* relu and abs at exactly 0, and the sign ramp: the subgradient is 0 there (as torch), and
 * a value just off 0 gets the full slope. Checked against plain loops. */
static void test_kinks_at_zero(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    const float v[8] = {0.0f, -0.0f, 1e-30f, -1e-30f, 3.0f, -3.0f, 1e30f, -1e30f};
    for (int k = 0; k < 2; k++) {
        struct lt_tensor *x = lt_new_tensor_1d(ctx, LT_TYPE_F32, 8);
        memcpy(x->data, v, sizeof(v));
        x->flags |= LT_FLAG_PARAM;
        lt_set_name(x, "x");
        struct lt_tensor *loss = lt_sum(ctx, k == 0 ? lt_relu(ctx, x) : lt_abs(ctx, x));
        struct lt_graph *g = lt_graph_new(ctx, 256);
        lt_status st = lt_graph_build(g, loss);
        if (st == LT_OK)
            st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
        if (st == LT_OK)
            st = lt_cpu_graph_compute(cpu, g);
        CHECK(st == LT_OK, "%s", lt_last_error());
        if (st != LT_OK || !x->grad)
            continue;
        for (int i = 0; i < 8; i++) {
            float expect = v[i] > 0 ? 1.0f : v[i] < 0 ? (k == 0 ? 0.0f : -1.0f) : 0.0f;
            float got = ((float *)x->grad->data)[i];
            CHECK(got == expect, "%s'(%g) = %g, expected %g", k == 0 ? "relu" : "abs", (double)v[i],
                  (double)got, (double)expect);
        }
    }
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
}

/* ---- the crash shape: SQR of a non-contiguous slice of a trainable tensor ---- */

static void test_sqr_of_a_view(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_tensor *conv = lt_new_tensor_2d(ctx, LT_TYPE_F32, 12, 5);
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 5);
    lt_set_name(conv, "conv_out-22");
    conv->flags |= LT_FLAG_PARAM;
    float *cv = conv->data, *wv = w->data;
    for (int i = 0; i < 60; i++)
        cv[i] = 0.1f * (float)(i % 7) - 0.3f;
    for (int i = 0; i < 20; i++)
        wv[i] = 0.05f * (float)(i % 5) - 0.1f;
    /* columns 4..7 of each row: a non-contiguous view */
    struct lt_tensor *k_conv = lt_view_2d(ctx, conv, 4, 5, conv->nb[1], 4 * sizeof(float));
    lt_set_name(k_conv, "k_conv-22");
    CHECK(!lt_is_contiguous(k_conv));
    struct lt_tensor *sqr = lt_sqr(ctx, k_conv);
    struct lt_tensor *loss = lt_sum(ctx, lt_mul(ctx, sqr, w));
    struct lt_graph *g = lt_graph_new(ctx, 256);
    lt_status st = lt_graph_build(g, loss);
    int n_forward = g->n_nodes;
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st != LT_OK)
        goto out_free;
    /* every node, forward and backward, is one the CPU takes; no backward node but a copy
     * or a view reads the slice */
    for (int i = 0; i < g->n_nodes; i++) {
        const struct lt_tensor *node = g->nodes[i];
        char reason[LT_REASON_MAX] = "";
        CHECK(lt_cpu_supports_op(node, reason, sizeof(reason)), "the CPU refuses %s '%s': %s",
              lt_op_name(node->op), node->name, reason);
        if (i < n_forward || reads_any_layout(node->op))
            continue;
        for (int s = 0; s < LT_MAX_SRC; s++)
            CHECK(node->src[s] != k_conv, "backward node %s '%s' reads the slice itself",
                  lt_op_name(node->op), node->name);
    }
    st = lt_cpu_graph_compute(cpu, g);
    CHECK(st == LT_OK, "%s", lt_last_error());
    CHECK(conv->grad != NULL);
    if (st != LT_OK || !conv->grad)
        goto out_free;
    /* d loss / d conv[r, c] = 2 conv[r, c] w[r, c - 4] inside the slice, 0 outside */
    float expect[60], got[60];
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 12; c++)
            expect[r * 12 + c] = c >= 4 && c < 8 ? 2.0f * cv[r * 12 + c] * wv[r * 4 + c - 4] : 0.0f;
    lt_tensor_read_f32(conv->grad, got);
    CHECK(check_max_ratio(got, expect, 60, 1e-6, 1e-5, NULL) <= 1, "gradient of the slice");
out_free:
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
}

int main(void)
{
    test_unary();
    test_kinks_at_zero();
    test_swiglu();
    test_binary();
    test_reduce();
    test_sqr_of_a_view();
    return check_summary();
}
