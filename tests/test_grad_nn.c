/* test_grad_nn.c: backward rules of mul_mat (matmul.c), rms_norm and l2_norm (norm.c),
 * rope (rope.c), soft_max (softmax.c) and cross_entropy (loss.c), checked by finite
 * differences (tests/gradcheck.h) with every trainable source contiguous, transposed,
 * permuted and sliced; mul_mat also with grouped (GQA) head broadcast, an odd K, and a
 * frozen F16 / BF16 / Q8_0 first operand (gradient only to b); a small GQA attention block
 * end to end.
 *
 * Beside each finite-difference check, the backward graph itself: every node autodiff adds
 * must be one the CPU accepts, and the kernels of the _BACK ops must be handed contiguous
 * sources (the viewed k_conv fed to l2_norm's backward is the case that crashed llama.cpp).
 * Those cases live in grad_nn_cases.h (test_grad_sched.c runs them through the scheduler);
 * here beside them: a trainable F16 weight refused, and training through frozen weights. */
#include <string.h>

#include "check.h"
#include "grad_nn_cases.h"
#include "gradcheck.h"
#include "lathe/opt.h"
#include "ops/op.h"

/* A trainable non-F32 weight is refused with its name, not aborted on, and not silently
 * left without a gradient. */
static void test_mul_mat_trainable_f16_refused(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_tensor *a = lt_new_tensor_2d(ctx, LT_TYPE_F16, 4, 3);
    struct lt_tensor *b = lt_new_tensor_2d(ctx, LT_TYPE_F32, 4, 2);
    lt_set_name(a, "blk.0.attn_q.weight");
    a->flags |= LT_FLAG_PARAM;
    struct lt_tensor *loss = lt_sum(ctx, lt_mul_mat(ctx, a, b));
    struct lt_graph *g = lt_graph_new(ctx, 64);
    lt_status st = lt_graph_build(g, loss);
    CHECK(st == LT_OK, "%s", lt_last_error());
    st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
    CHECK(st == LT_ERR_UNSUPPORTED, "autodiff of a trainable f16 weight gave %s",
          lt_status_name(st));
    CHECK(strstr(lt_last_error(), "blk.0.attn_q.weight") != NULL, "message: %s", lt_last_error());
    lt_ctx_free(ctx);
}

/* Training through a frozen weight with the real training graph (admission, placement,
 * memory plan, then one SGD step of rate 1 on the CPU): x's change is its gradient, held to
 * a plain double loop over the weight's dequantised values. A Q8_0 weight goes through the
 * backward's dequantising copy, an F16 one through its transposed view. */
static void test_train_through_frozen_weight(enum lt_type type)
{
    enum { K = 64, M = 6, N = 3 };
    static const int32_t labels[N] = {2, -1, 5};
    struct lt_ctx *wctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_tensor *w = lt_new_tensor_2d(wctx, type, K, M);
    struct lt_tensor *x = lt_new_tensor_2d(wctx, LT_TYPE_F32, K, N);
    struct lt_tensor *lab = lt_new_tensor_1d(wctx, LT_TYPE_I32, N);
    lt_set_name(w, "blk.0.ffn_up.weight");
    lt_set_name(x, "x");
    x->flags |= LT_FLAG_PARAM;
    static float wf[K * M], wd[K * M], x0[K * N];
    for (int i = 0; i < K * M; i++)
        wf[i] = gc_uniform(-1, 1);
    for (int i = 0; i < K * N; i++)
        x0[i] = gc_uniform(-1, 1);
    lt_type_traits(type)->from_float(wf, w->data, K * M);
    lt_type_traits(type)->to_float(w->data, wd, K * M);
    memcpy(x->data, x0, sizeof(x0));
    memcpy(lab->data, labels, sizeof(labels));
    struct lt_tensor *loss = lt_cross_entropy(ctx, lt_mul_mat(ctx, w, x), lab);
    struct lt_train_graph_params p = {
        .backends = &cpu, .n_backends = 1, .device_only = true, .optimizer = LT_OPTIMIZER_SGD};
    struct lt_train_graph *tg = NULL;
    struct lt_refusal r;
    float l0 = 0;
    lt_status st = lt_train_graph_new(ctx, loss, &p, &tg, &r);
    if (st == LT_OK)
        st = lt_train_graph_alloc(tg);
    if (st == LT_OK)
        st = lt_train_graph_accumulate(tg, &l0);
    if (st == LT_OK)
        st = lt_train_graph_step(tg, 1.0f);
    CHECK(st == LT_OK, "training through a frozen %s weight: %s", lt_type_name(type),
          lt_last_error());
    if (st != LT_OK)
        goto out_free;
    /* the reference: dlogits = (softmax - onehot) / n_valid, dx = W dlogits */
    double dx[K * N] = {0}, loss_ref = 0;
    int n_valid = 0;
    for (int n = 0; n < N; n++)
        n_valid += labels[n] >= 0;
    for (int n = 0; n < N; n++) {
        if (labels[n] < 0)
            continue;
        double z[M], mx = -INFINITY, sum = 0;
        for (int m = 0; m < M; m++) {
            z[m] = 0;
            for (int k = 0; k < K; k++)
                z[m] += (double)wd[m * K + k] * x0[n * K + k];
            mx = z[m] > mx ? z[m] : mx;
        }
        for (int m = 0; m < M; m++)
            sum += exp(z[m] - mx);
        loss_ref += (mx + log(sum) - z[labels[n]]) / n_valid;
        for (int m = 0; m < M; m++) {
            double d = (exp(z[m] - mx) / sum - (m == labels[n])) / n_valid;
            for (int k = 0; k < K; k++)
                dx[n * K + k] += (double)wd[m * K + k] * d;
        }
    }
    float got[K * N], want[K * N];
    for (int i = 0; i < K * N; i++) {
        got[i] = x0[i] - ((float *)x->data)[i];
        want[i] = (float)dx[i];
    }
    CHECK(fabs(l0 - loss_ref) < 1e-5 * (1 + fabs(loss_ref)), "loss %g, expected %g", (double)l0,
          loss_ref);
    double bad = check_max_ratio(got, want, K * N, 1e-6, 1e-4, NULL);
    CHECK(bad <= 1, "gradient through a frozen %s weight off by %g of tolerance",
          lt_type_name(type), bad);
out_free:
    lt_train_graph_free(tg);
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
    lt_ctx_free(wctx);
}

int main(void)
{
    test_mul_mat();
    test_mul_mat_same_source();
    test_mul_mat_acc();
    test_mul_mat_frozen_types();
    test_mul_mat_trainable_f16_refused();
    test_train_through_frozen_weight(LT_TYPE_Q8_0);
    test_train_through_frozen_weight(LT_TYPE_F16);
    test_train_through_frozen_weight(LT_TYPE_BF16);
    test_norms();
    test_norm_mul();
    test_l2_norm_of_k_conv();
    test_rope();
    test_soft_max();
    test_cross_entropy();
    test_lm_head();
    test_linear_ce();
    test_attention();
    test_flash_attn();
    return check_summary();
}
