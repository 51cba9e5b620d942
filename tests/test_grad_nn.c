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
 * here beside them: a trainable F16 weight refused, training through frozen weights, and
 * LINEAR_CE as the loss itself, whose backward computes the loss too. */
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

/* ---- LINEAR_CE as the loss itself, folded into its backward ---- */

/* A training job's loss is LINEAR_CE itself: autodiff folds the loss into the node of its
 * backward (src/ops/linear_ce.c), so the graph holds no LINEAR_CE and one LINEAR_CE_BACK
 * making the wanted gradients and the loss, which the loss node copies. Held to the unfolded
 * graph (the loss scaled by 1, whose gradient is a SCALE, not autodiff's seed), which runs
 * LINEAR_CE and a LINEAR_CE_BACK without the loss: the same loss and gradients bit for bit
 * (the same CPU functions in the same order), for each set of trainable sources (a LoRA
 * job's frozen head: dh alone) and for grad_scale 1 and 0.25 (a micro-batch's share). */
#define FOLD_D 8
#define FOLD_V 37
#define FOLD_N 6

static const int32_t fold_labels[FOLD_N] = {3, -1, 36, 0, 17, 5};

struct fold_result {
    float loss, dh[FOLD_D * FOLD_N], dw[FOLD_D * FOLD_V];
    int n_lce, n_back; /* LINEAR_CE and LINEAR_CE_BACK nodes */
    unsigned parts;    /* the LINEAR_CE_BACK's */
    bool loss_copies;  /* the loss node is a CONT of the backward's loss */
    bool loss_last;    /* ... and comes after that node */
};

static void fold_values(float *w, float *h)
{
    for (int i = 0; i < FOLD_D * FOLD_V; i++)
        w[i] = sinf(0.37f * (float)i);
    for (int i = 0; i < FOLD_D * FOLD_N; i++)
        h[i] = 2.0f * cosf(0.11f * (float)i + 0.5f);
}

static lt_status fold_run(bool fold, bool train_w, bool train_h, float grad_scale,
                          struct fold_result *out)
{
    memset(out, 0, sizeof(*out));
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 4 << 20});
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, FOLD_D, FOLD_V);
    struct lt_tensor *h = lt_new_tensor_2d(ctx, LT_TYPE_F32, FOLD_D, FOLD_N);
    struct lt_tensor *lab = lt_new_tensor_1d(ctx, LT_TYPE_I32, FOLD_N);
    fold_values(w->data, h->data);
    memcpy(lab->data, fold_labels, sizeof(fold_labels));
    w->flags |= train_w ? LT_FLAG_PARAM : 0;
    h->flags |= train_h ? LT_FLAG_PARAM : 0;
    struct lt_tensor *lce = lt_linear_cross_entropy(ctx, w, h, lab);
    struct lt_tensor *loss = fold ? lce : lt_scale(ctx, lce, 1.0f);
    struct lt_graph *g = lt_graph_new(ctx, 256);
    lt_status st = g && loss ? lt_graph_build(g, loss) : LT_ERR_NOMEM;
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, loss, grad_scale, NULL);
    int back_at = -1, loss_at = -1;
    for (int i = 0; st == LT_OK && i < g->n_nodes; i++) {
        const struct lt_tensor *t = g->nodes[i];
        out->n_lce += t->op == LT_OP_LINEAR_CE;
        if (t->op == LT_OP_LINEAR_CE_BACK) {
            out->n_back++;
            out->parts = (unsigned)lt_get_param_i32(t, 1);
            back_at = i;
        }
        loss_at = t == loss ? i : loss_at;
    }
    out->loss_copies = loss->op == LT_OP_CONT && loss->src[0] && loss->src[0]->view_src &&
                       loss->src[0]->view_src->op == LT_OP_LINEAR_CE_BACK;
    out->loss_last = back_at >= 0 && loss_at > back_at;
    if (st == LT_OK)
        st = lt_cpu_graph_compute(cpu, g);
    if (st == LT_OK) {
        out->loss = *(float *)loss->data;
        if (train_w && w->grad)
            lt_tensor_read_f32(w->grad, out->dw);
        if (train_h && h->grad)
            lt_tensor_read_f32(h->grad, out->dh);
    }
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
    return st;
}

static void test_linear_ce_fold(void)
{
    static const float scales[2] = {1.0f, 0.25f};
    for (int want = 0; want < 3; want++)
        for (int k = 0; k < 2; k++) {
            const bool tw = want != 1, th = want != 2;
            const unsigned grads = (th ? LT_LINEAR_CE_DH : 0u) | (tw ? LT_LINEAR_CE_DW : 0u);
            struct fold_result f, u;
            lt_status st = fold_run(true, tw, th, scales[k], &f);
            if (st == LT_OK)
                st = fold_run(false, tw, th, scales[k], &u);
            CHECK(st == LT_OK, "linear_ce fold: %s", lt_last_error());
            if (st != LT_OK)
                continue;
            const char *what = tw && th ? "w and h" : tw ? "w alone" : "h alone";
            CHECK(f.n_lce == 0 && f.n_back == 1 && f.parts == (grads | LT_LINEAR_CE_LOSS) &&
                      f.loss_copies && f.loss_last,
                  "folded, %s trainable: %d LINEAR_CE, %d LINEAR_CE_BACK of parts %#x (want "
                  "%#x), the loss a copy of its loss %d, after it %d",
                  what, f.n_lce, f.n_back, f.parts, grads | LT_LINEAR_CE_LOSS, f.loss_copies,
                  f.loss_last);
            CHECK(u.n_lce == 1 && u.n_back == 1 && u.parts == grads,
                  "unfolded, %s trainable: %d LINEAR_CE, %d LINEAR_CE_BACK of parts %#x", what,
                  u.n_lce, u.n_back, u.parts);
            CHECK(f.loss == u.loss && f.loss > 0,
                  "%s, grad_scale %g: folded loss %.9g, unfolded %.9g", what, (double)scales[k],
                  (double)f.loss, (double)u.loss);
            CHECK(!memcmp(f.dh, u.dh, sizeof(f.dh)) && !memcmp(f.dw, u.dw, sizeof(f.dw)),
                  "%s, grad_scale %g: the folded gradients differ from the unfolded ones", what,
                  (double)scales[k]);
            if (k == 1) { /* grad_scale reaches the gradients: a quarter of the first run's */
                struct fold_result one;
                CHECK(fold_run(true, tw, th, 1.0f, &one) == LT_OK, "%s", lt_last_error());
                double bad = 0;
                for (int i = 0; i < FOLD_D * FOLD_N; i++)
                    bad = fmax(bad, fabs(f.dh[i] - 0.25 * one.dh[i]));
                for (int i = 0; i < FOLD_D * FOLD_V; i++)
                    bad = fmax(bad, fabs(f.dw[i] - 0.25 * one.dw[i]));
                CHECK(bad < 1e-9 && f.loss == one.loss,
                      "%s: grad_scale 0.25 moved the gradients %g from a quarter of 1's, the "
                      "loss %.9g from %.9g",
                      what, bad, (double)f.loss, (double)one.loss);
            }
        }
}

/* A build that fails after the fold (an op without a backward rule below the head) leaves
 * the loss as it was: LINEAR_CE of its sources, and the forward graph runs */
static void test_linear_ce_fold_refused(void)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 4 << 20});
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_tensor *w = lt_new_tensor_2d(ctx, LT_TYPE_F32, FOLD_D, FOLD_V);
    struct lt_tensor *x = lt_new_tensor_2d(ctx, LT_TYPE_F32, FOLD_D, FOLD_N);
    struct lt_tensor *lab = lt_new_tensor_1d(ctx, LT_TYPE_I32, FOLD_N);
    struct lt_tensor *one = lt_new_tensor_1d(ctx, LT_TYPE_F32, 1);
    fold_values(w->data, x->data);
    memcpy(lab->data, fold_labels, sizeof(fold_labels));
    *(float *)one->data = 1.0f;
    x->flags |= LT_FLAG_PARAM;
    /* CROSS_ENTROPY_BACK has no backward rule (labels < D for it) */
    static const int32_t small[FOLD_N] = {1, 0, 7, 3, -1, 5};
    struct lt_tensor *lab_h = lt_new_tensor_1d(ctx, LT_TYPE_I32, FOLD_N);
    memcpy(lab_h->data, small, sizeof(small));
    struct lt_tensor *h = lt_cross_entropy_back(ctx, one, x, lab_h);
    struct lt_tensor *loss = lt_linear_cross_entropy(ctx, w, h, lab);
    struct lt_graph *g = lt_graph_new(ctx, 256);
    lt_status st = g && loss ? lt_graph_build(g, loss) : LT_ERR_NOMEM;
    const int n_forward = g ? g->n_nodes : 0;
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, loss, 1.0f, NULL);
    CHECK(st == LT_ERR_REFUSED, "autodiff through CROSS_ENTROPY_BACK gave %s: %s",
          lt_status_name(st), lt_last_error());
    CHECK(loss->op == LT_OP_LINEAR_CE && loss->src[0] == w && loss->src[1] == h &&
              loss->src[2] == lab && g->n_nodes == n_forward,
          "after the refusal the loss is %s of %d nodes", lt_op_name(loss->op), g->n_nodes);
    CHECK(lt_cpu_graph_compute(cpu, g) == LT_OK && *(float *)loss->data > 0,
          "the forward after the refusal: %s, loss %g", lt_last_error(),
          (double)*(float *)loss->data);
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
}

/* The same loss in the real training graph (admission, placement, plan; SGD of rate 1 on
 * the CPU): two micro-batches of the same tokens report LINEAR_CE's loss, eval (the forward
 * part alone, which now holds the backward node) reports it too, and the step moves w and h
 * by the unfolded gradients (the mean of two equal ones). */
static void test_linear_ce_fold_train(void)
{
    struct fold_result u;
    if (fold_run(false, true, true, 1.0f, &u) != LT_OK) {
        CHECK(0, "linear_ce reference: %s", lt_last_error());
        return;
    }
    struct lt_ctx *wctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_tensor *w = lt_new_tensor_2d(wctx, LT_TYPE_F32, FOLD_D, FOLD_V);
    struct lt_tensor *h = lt_new_tensor_2d(wctx, LT_TYPE_F32, FOLD_D, FOLD_N);
    struct lt_tensor *lab = lt_new_tensor_1d(wctx, LT_TYPE_I32, FOLD_N);
    static float w0[FOLD_D * FOLD_V], h0[FOLD_D * FOLD_N];
    fold_values(w0, h0);
    memcpy(w->data, w0, sizeof(w0));
    memcpy(h->data, h0, sizeof(h0));
    memcpy(lab->data, fold_labels, sizeof(fold_labels));
    lt_set_name(w, "head");
    lt_set_name(h, "hidden");
    w->flags |= LT_FLAG_PARAM;
    h->flags |= LT_FLAG_PARAM;
    struct lt_tensor *loss = lt_linear_cross_entropy(ctx, w, h, lab);
    struct lt_train_graph_params p = {
        .backends = &cpu, .n_backends = 1, .device_only = true, .optimizer = LT_OPTIMIZER_SGD};
    struct lt_train_graph *tg = NULL;
    float l0 = NAN, l1 = NAN, le = NAN;
    lt_status st = lt_train_graph_new(ctx, loss, &p, &tg, NULL);
    if (st == LT_OK)
        st = lt_train_graph_alloc(tg);
    if (st == LT_OK)
        st = lt_train_graph_accumulate(tg, &l0);
    if (st == LT_OK)
        st = lt_train_graph_accumulate(tg, &l1);
    if (st == LT_OK)
        st = lt_train_graph_eval(tg, &le);
    if (st == LT_OK)
        st = lt_train_graph_step(tg, 1.0f);
    lt_train_graph_free(tg); /* w and h go home, trained */
    CHECK(st == LT_OK, "training on LINEAR_CE: %s", lt_last_error());
    if (st == LT_OK) {
        CHECK(l0 == u.loss && l1 == u.loss && le == u.loss,
              "training graph: losses %.9g, %.9g, eval %.9g; LINEAR_CE's %.9g", (double)l0,
              (double)l1, (double)le, (double)u.loss);
        double bad = 0;
        for (int i = 0; i < FOLD_D * FOLD_V; i++)
            bad = fmax(bad, fabs((w0[i] - ((float *)w->data)[i]) - u.dw[i]));
        for (int i = 0; i < FOLD_D * FOLD_N; i++)
            bad = fmax(bad, fabs((h0[i] - ((float *)h->data)[i]) - u.dh[i]));
        /* the step's subtraction rounds to the weights' ulp (values up to 2) */
        CHECK(bad < 5e-7, "training graph: the step is %g off the unfolded gradients", bad);
    }
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
    lt_ctx_free(wctx);
}

/* One SGD step (lr 1) of a training graph over loss = sum(mul_mat(scale(A, s), x) * w), A
 * [K, M] trainable: A moves by s x w^T (its gradient, a SCALE of the rule's product, is
 * accumulated by one scaled MUL_MAT_ACC), and the gradient graph holds one node more than the
 * same graph without the scale (the forward's SCALE alone: no product, SCALE and ACC beside
 * the accumulation). Returns A's step in *step; nodes in the gradient graph, 0 on failure. */
#define SPA_K 6
#define SPA_M 5
#define SPA_N 4
static int scaled_product_step(float s, bool scaled, float *step)
{
    struct lt_ctx *wctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_tensor *A = lt_set_name(lt_new_tensor_2d(wctx, LT_TYPE_F32, SPA_K, SPA_M), "A");
    struct lt_tensor *x = lt_new_tensor_2d(wctx, LT_TYPE_F32, SPA_K, SPA_N);
    struct lt_tensor *w = lt_new_tensor_2d(wctx, LT_TYPE_F32, SPA_M, SPA_N);
    float a0[SPA_K * SPA_M];
    for (int i = 0; i < SPA_K * SPA_M; i++)
        ((float *)A->data)[i] = a0[i] = 0.125f * (float)(i % 7) - 0.25f;
    for (int i = 0; i < SPA_K * SPA_N; i++)
        ((float *)x->data)[i] = 0.25f * (float)(i % 5) - 0.5f;
    for (int i = 0; i < SPA_M * SPA_N; i++)
        ((float *)w->data)[i] = 0.5f - 0.0625f * (float)i;
    A->flags |= LT_FLAG_PARAM;
    struct lt_tensor *as = scaled ? lt_scale(ctx, A, s) : A;
    struct lt_tensor *loss = lt_sum(ctx, lt_mul(ctx, lt_mul_mat(ctx, as, x), w));
    struct lt_train_graph_params p = {
        .backends = &cpu, .n_backends = 1, .device_only = true, .optimizer = LT_OPTIMIZER_SGD};
    struct lt_train_graph *tg = NULL;
    float l = NAN;
    int nodes = 0;
    lt_status st = lt_train_graph_new(ctx, loss, &p, &tg, NULL);
    if (st == LT_OK) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        lt_train_graph_print(tg, f);
        fclose(f);
        if (sscanf(buf, "gradient graph: %d nodes", &nodes) != 1)
            nodes = 0;
        free(buf);
        st = lt_train_graph_alloc(tg);
    }
    if (st == LT_OK)
        st = lt_train_graph_accumulate(tg, &l);
    if (st == LT_OK)
        st = lt_train_graph_step(tg, 1.0f);
    lt_train_graph_free(tg); /* A goes home, trained */
    CHECK(st == LT_OK, "training a scaled product: %s", lt_last_error());
    for (int i = 0; i < SPA_K * SPA_M; i++)
        step[i] = a0[i] - ((float *)A->data)[i];
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
    lt_ctx_free(wctx);
    return st == LT_OK ? nodes : 0;
}

static void test_scaled_product_accumulates(void)
{
    float s1[SPA_K * SPA_M], s2[SPA_K * SPA_M];
    const int plain = scaled_product_step(1.0f, false, s1);
    const int scaled = scaled_product_step(1.5f, true, s2);
    double bad = 0;
    for (int i = 0; i < SPA_K * SPA_M; i++)
        bad = fmax(bad, fabs(s2[i] - 1.5f * s1[i]));
    CHECK(plain > 0 && scaled == plain + 1,
          "the scaled product's gradient graph: %d nodes, the plain one's %d (want one more)",
          scaled, plain);
    CHECK(bad < 1e-6, "the scaled product's step is %g off 1.5 times the plain one's", bad);
}

int main(void)
{
    test_mul_mat();
    test_mul_mat_same_source();
    test_mul_mat_acc();
    test_joined_product();
    test_mul_mat_frozen_types();
    test_mul_mat_trainable_f16_refused();
    test_train_through_frozen_weight(LT_TYPE_Q8_0);
    test_train_through_frozen_weight(LT_TYPE_F16);
    test_train_through_frozen_weight(LT_TYPE_BF16);
    test_norms();
    test_norm_mul();
    test_norm_residual();
    test_l2_norm_of_k_conv();
    test_rope();
    test_soft_max();
    test_cross_entropy();
    test_lm_head();
    test_linear_ce();
    test_tied_embedding();
    test_linear_ce_fold();
    test_linear_ce_fold_refused();
    test_linear_ce_fold_train();
    test_scaled_product_accumulates();
    test_attention();
    test_flash_attn();
    return check_summary();
}
