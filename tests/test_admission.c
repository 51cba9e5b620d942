/* test_admission.c: placement, fallback and every refusal kind, with a backend that has
 * gaps (tests/gap_backend.h), so CI exercises them without a GPU. And the reverse: graphs
 * that should train are admitted, and the memory estimate matches what allocation takes. */
#include <string.h>

#include "check.h"
#include "gap_backend.h"
#include "lathe/opt.h"
#include "lathe/sched.h"
#include "tiny_model.h"

static struct lt_backend *dev, *host;

static void reset_backends(void)
{
    lt_backend_free(dev);
    lt_backend_free(host);
    dev = gap_backend_new("GAP0");
    host = gap_backend_new("CPU");
}

/* The scenario of the original crash: y = sum(sqr(k_conv) * w) where k_conv is a
 * non-contiguous slice of a trainable conv output. */
struct kconv_graph {
    struct lt_ctx *wctx, *ctx;
    struct lt_tensor *conv, *k_conv, *w, *loss, *sqr;
};

static void kconv_build(struct kconv_graph *k, bool no_alloc)
{
    k->wctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    k->ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = no_alloc});
    k->conv = lt_new_tensor_2d(k->wctx, LT_TYPE_F32, 12, 5);
    lt_set_name(k->conv, "conv_out-22");
    k->conv->flags |= LT_FLAG_PARAM;
    k->w = lt_new_tensor_2d(k->wctx, LT_TYPE_F32, 4, 5);
    for (int i = 0; i < 60; i++)
        ((float *)k->conv->data)[i] = 0.1f * (float)(i % 7) - 0.3f;
    for (int i = 0; i < 20; i++)
        ((float *)k->w->data)[i] = 0.05f * (float)(i % 5);
    k->k_conv = lt_view_2d(k->ctx, k->conv, 4, 5, k->conv->nb[1], 4 * sizeof(float));
    lt_set_name(k->k_conv, "k_conv-22");
    k->sqr = lt_sqr(k->ctx, k->k_conv);
    lt_set_name(k->sqr, "sqr k_conv-22");
    k->loss = lt_sum(k->ctx, lt_mul(k->ctx, k->sqr, k->w));
    lt_set_name(k->loss, "loss");
}

static void kconv_free(struct kconv_graph *k)
{
    lt_ctx_free(k->ctx);
    lt_ctx_free(k->wctx);
}

static void test_inference_fallback(bool device_memory)
{
    reset_backends();
    /* device_memory: the gap backend's storage is not host-addressable to the scheduler,
     * so every crossing between it and the CPU goes through a copy */
    dev->is_host = !device_memory;
    gap_of(dev)->gap_strided[LT_OP_SQR] = true;
    struct kconv_graph k;
    kconv_build(&k, true);
    struct lt_graph *g = lt_graph_new(k.ctx, 256);
    lt_graph_build(g, k.loss);
    struct lt_backend *bes[2] = {dev, host};
    struct lt_sched *s = lt_sched_new(bes, 2);
    CHECK(lt_sched_place(s, g, false, NULL) == LT_OK, "%s", lt_last_error());
    CHECK(lt_sched_n_fallback(s) == 1 && lt_sched_fallback_node(s, 0) == k.sqr);
    struct lt_sched_memory mem;
    CHECK(lt_sched_measure(s, g, &mem) == LT_OK);
    CHECK(lt_sched_alloc(s, g) == LT_OK, "%s", lt_last_error());
    CHECK(mem.total == lt_sched_allocated(s), "measured %zu, allocated %zu", mem.total,
          lt_sched_allocated(s));
    CHECK((mem.copies[0] > 0) == device_memory, "copies into the device: %zu", mem.copies[0]);
    CHECK(lt_sched_compute(s, g) == LT_OK, "%s", lt_last_error());
    float got = *(float *)k.loss->data;
    double expect = 0;
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 4; c++) {
            double x = ((float *)k.conv->data)[r * 12 + 4 + c];
            expect += x * x * ((float *)k.w->data)[r * 4 + c];
        }
    CHECK(fabs(got - expect) < 1e-5, "fallback result %g, expected %g", got, expect);
    CHECK(gap_of(dev)->n_computed > 0 && gap_of(host)->n_computed == 1);
    lt_sched_free(s);
    kconv_free(&k);
}

static lt_status try_train(struct lt_tensor *loss, struct lt_ctx *ctx, bool device_only,
                           size_t budget, struct lt_refusal *r, struct lt_train_graph **tg)
{
    struct lt_backend *bes[2] = {dev, host};
    struct lt_train_graph_params p = {
        .backends = bes, .n_backends = 2, .device_only = device_only, .memory_budget = budget};
    return lt_train_graph_new(ctx, loss, &p, tg, r);
}

static void test_refusals(void)
{
    struct lt_refusal r;
    struct lt_train_graph *tg;

    /* device_only with a gap: refused, naming op, node and source; nothing allocated */
    reset_backends();
    gap_of(dev)->gap_strided[LT_OP_SQR] = true;
    struct kconv_graph k;
    kconv_build(&k, true);
    lt_status st = try_train(k.loss, k.ctx, true, 0, &r, &tg);
    CHECK(st == LT_ERR_REFUSED && tg == NULL, "status %d: %s", st, lt_last_error());
    CHECK(r.kind == LT_REFUSAL_DEVICE_ONLY, "kind %s", lt_refusal_kind_name(r.kind));
    CHECK(!strcmp(r.op, "SQR"), "op %s", r.op);
    CHECK(!strcmp(r.source, "k_conv-22"), "source '%s'", r.source);
    CHECK(!strcmp(r.source_layout, "a non-contiguous view"), "layout '%s'", r.source_layout);
    CHECK(!strcmp(r.backend, "GAP0"));
    CHECK(strstr(r.sentence, "SQR") && strstr(r.sentence, "k_conv-22") &&
              strstr(r.sentence, "nothing was allocated"),
          "sentence: %s", r.sentence);
    CHECK(!strcmp(lt_last_error(), r.sentence), "the error carries the sentence unchanged");
    CHECK(gap_of(dev)->bytes_allocated == 0 && gap_of(host)->bytes_allocated == 0,
          "a refused job allocated %zu + %zu bytes", gap_of(dev)->bytes_allocated,
          gap_of(host)->bytes_allocated);
    printf("refusal (device_only): %s\n", r.sentence);
    kconv_free(&k);

    /* without device_only: admitted, trains, lists the fallback nodes */
    reset_backends();
    gap_of(dev)->gap_strided[LT_OP_SQR] = true;
    kconv_build(&k, true);
    st = try_train(k.loss, k.ctx, false, 0, &r, &tg);
    CHECK(st == LT_OK, "%s", lt_last_error());
    if (st == LT_OK) {
        CHECK(lt_train_graph_n_fallback(tg) >= 1);
        bool named = false;
        for (int i = 0; i < lt_train_graph_n_fallback(tg); i++)
            named |= lt_train_graph_fallback_node(tg, i) == k.sqr;
        CHECK(named, "the SQR node is listed as a fallback");
        lt_train_graph_print(tg, stdout);
        CHECK(lt_train_graph_alloc(tg) == LT_OK, "%s", lt_last_error());
        float l0, l1;
        CHECK(lt_train_graph_accumulate(tg, &l0) == LT_OK, "%s", lt_last_error());
        CHECK(lt_train_graph_step(tg, 0.05f) == LT_OK, "%s", lt_last_error());
        CHECK(lt_train_graph_eval(tg, &l1) == LT_OK, "%s", lt_last_error());
        CHECK(l1 < l0, "loss %g -> %g", l0, l1);
        lt_train_graph_free(tg);
    }
    kconv_free(&k);

    /* the device's memory is not host-addressable and the trainable tensor lives in host
     * memory: the optimizer step runs on the device over a copy, which must go back to the
     * tensor after the step or the update is lost; with and without device_only */
    for (int mode = 0; mode < 2; mode++) {
        reset_backends();
        dev->is_host = false;
        kconv_build(&k, true);
        st = try_train(k.loss, k.ctx, mode == 1, 0, &r, &tg);
        CHECK(st == LT_OK, "%s", lt_last_error());
        if (st != LT_OK) {
            kconv_free(&k);
            continue;
        }
        CHECK(lt_train_graph_alloc(tg) == LT_OK, "%s", lt_last_error());
        float l0 = 0, l1 = 0, before = ((float *)k.conv->data)[5]; /* w there is not 0 */
        for (int i = 0; i < 3; i++) {
            CHECK(lt_train_graph_accumulate(tg, i == 0 ? &l0 : NULL) == LT_OK, "%s", lt_last_error());
            CHECK(lt_train_graph_step(tg, 0.05f) == LT_OK, "%s", lt_last_error());
        }
        CHECK(lt_train_graph_eval(tg, &l1) == LT_OK, "%s", lt_last_error());
        CHECK(((float *)k.conv->data)[5] != before, "the host tensor itself was updated");
        CHECK(l1 < l0, "updates reached the trainable tensor: loss %g -> %g", l0, l1);
        lt_train_graph_free(tg);
        kconv_free(&k);
    }

    /* an op no backend supports: refused in every mode */
    for (int mode = 0; mode < 2; mode++) {
        reset_backends();
        gap_of(dev)->gap_always[LT_OP_SQR] = true;
        gap_of(host)->gap_always[LT_OP_SQR] = true;
        kconv_build(&k, true);
        st = try_train(k.loss, k.ctx, mode == 1, 0, &r, &tg);
        CHECK(st == LT_ERR_REFUSED && r.kind == LT_REFUSAL_NO_BACKEND && !strcmp(r.op, "SQR"),
              "status %d kind %s", st, lt_refusal_kind_name(r.kind));
        CHECK(strstr(r.sentence, "no backend can run (GAP0 included)") != NULL, "%s", r.sentence);
        CHECK(gap_of(dev)->bytes_allocated == 0 && gap_of(host)->bytes_allocated == 0);
        kconv_free(&k);
    }

    /* a budget below the estimate */
    reset_backends();
    kconv_build(&k, true);
    st = try_train(k.loss, k.ctx, true, 1024, &r, &tg);
    CHECK(st == LT_ERR_REFUSED && r.kind == LT_REFUSAL_MEMORY, "kind %s", lt_refusal_kind_name(r.kind));
    CHECK(r.need_bytes > 1024 && r.budget_bytes == 1024);
    CHECK(gap_of(dev)->bytes_allocated == 0 && gap_of(host)->bytes_allocated == 0);
    printf("refusal (memory): %s\n", r.sentence);
    kconv_free(&k);

    /* an op without a backward rule on the path to the loss */
    reset_backends();
    kconv_build(&k, true);
    struct lt_tensor *labels = lt_new_tensor_1d(k.wctx, LT_TYPE_I32, 5);
    memset(labels->data, 0, 5 * sizeof(int32_t));
    struct lt_tensor *one = lt_new_tensor_1d(k.wctx, LT_TYPE_F32, 1);
    *(float *)one->data = 1.0f;
    struct lt_tensor *logits = lt_cont(k.ctx, k.k_conv);
    struct lt_tensor *ceb = lt_cross_entropy_back(k.ctx, one, logits, labels);
    lt_set_name(ceb, "ce back");
    struct lt_tensor *loss2 = lt_sum(k.ctx, ceb);
    st = try_train(loss2, k.ctx, false, 0, &r, &tg);
    CHECK(st == LT_ERR_REFUSED && r.kind == LT_REFUSAL_NO_BACKWARD, "status %d kind %s: %s", st,
          lt_refusal_kind_name(r.kind), lt_last_error());
    CHECK(!strcmp(r.op, "CROSS_ENTROPY_BACK") && !strcmp(r.node, "ce back"), "%s %s", r.op, r.node);
    CHECK(gap_of(dev)->bytes_allocated == 0 && gap_of(host)->bytes_allocated == 0);
    printf("refusal (no backward): %s\n", r.sentence);
    kconv_free(&k);
}

/* Graphs that should train are admitted in device_only mode when the device has no gaps,
 * and the estimate is what allocation takes. */
static void test_regression_and_estimate(void)
{
    const int shapes[3][5] = {{32, 16, 2, 32, 1}, {64, 32, 4, 48, 2}, {50, 24, 3, 40, 3}};
    for (int c = 0; c < 3; c++) {
        reset_backends();
        struct tiny_model m;
        tiny_model_init(&m, shapes[c][0], shapes[c][1], shapes[c][2], shapes[c][3], shapes[c][4], 7);
        struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
        const int T = 9 + c;
        struct lt_tensor *tokens = lt_new_tensor_1d(ctx, LT_TYPE_I32, T);
        struct lt_tensor *pos = lt_new_tensor_1d(ctx, LT_TYPE_I32, T);
        struct lt_tensor *labels = lt_new_tensor_1d(ctx, LT_TYPE_I32, T);
        struct lt_tensor *loss = tiny_model_loss(&m, ctx, tokens, pos, labels);
        struct lt_refusal r;
        struct lt_train_graph *tg;
        lt_status st = try_train(loss, ctx, true, 0, &r, &tg);
        CHECK(st == LT_OK, "graph %d refused: %s", c, lt_last_error());
        if (st == LT_OK) {
            CHECK(lt_train_graph_n_fallback(tg) == 0);
            size_t est = lt_train_graph_estimate(tg);
            CHECK(lt_train_graph_alloc(tg) == LT_OK, "%s", lt_last_error());
            size_t got = lt_train_graph_allocated(tg);
            size_t counted = gap_of(dev)->bytes_live + gap_of(host)->bytes_live;
            printf("graph %d: estimate %zu bytes, allocated %zu (backends count %zu)\n", c, est,
                   got, counted);
            CHECK(counted == got);
            CHECK(fabs((double)got - (double)est) <= 0.10 * (double)est,
                  "estimate %zu vs allocated %zu", est, got);
            lt_train_graph_free(tg);
            CHECK(gap_of(dev)->bytes_live + gap_of(host)->bytes_live == 0, "freed");
        }
        lt_ctx_free(ctx);
        tiny_model_free(&m);
    }
}

/* A device's kernel scratch is part of the estimate and of what admission checks: the
 * part it does not hold yet, once for both graphs (the gradient and the optimizer graph
 * share the backend's scratch); a budget that fits the buffers but not the scratch too is
 * refused for memory, before anything is allocated. */
static void test_scratch_counted(void)
{
    const size_t mib = (size_t)1 << 20;
    size_t est[3] = {0}, need[3] = {0};
    for (int pass = 0; pass < 3; pass++) {
        reset_backends();
        /* pass 1: 3 MiB of scratch to grow; pass 2: 3 MiB needed, 1 MiB of it held */
        gap_of(dev)->scratch_need = pass ? 3 * mib : 0;
        gap_of(dev)->scratch_held = pass == 2 ? mib : 0;
        struct kconv_graph k;
        kconv_build(&k, true);
        struct lt_refusal r;
        struct lt_train_graph *tg = NULL;
        lt_status st = try_train(k.loss, k.ctx, true, 0, &r, &tg);
        CHECK(st == LT_OK, "pass %d: %s", pass, lt_last_error());
        est[pass] = tg ? lt_train_graph_estimate(tg) : 0;
        size_t scratch = 0, in_use = 0;
        if (tg)
            lt_train_graph_estimate_parts(tg, &scratch, &in_use);
        CHECK(scratch == (pass == 0 ? 0 : pass == 1 ? 3 * mib : 2 * mib) && in_use == 0,
              "pass %d: scratch %zu, in use %zu (a host-like backend has none)", pass, scratch,
              in_use);
        lt_train_graph_free(tg);
        /* a budget of 1 byte: refused, the need named; it counts the scratch to grow */
        st = try_train(k.loss, k.ctx, true, 1, &r, &tg);
        CHECK(st == LT_ERR_REFUSED && r.kind == LT_REFUSAL_MEMORY, "pass %d: kind %s", pass,
              lt_refusal_kind_name(r.kind));
        need[pass] = r.need_bytes;
        CHECK(gap_of(dev)->bytes_allocated == 0 && gap_of(host)->bytes_allocated == 0);
        if (pass == 1) {
            /* enough for the buffers, not for the scratch as well */
            st = try_train(k.loss, k.ctx, true, need[0] + mib, &r, &tg);
            CHECK(st == LT_ERR_REFUSED && r.kind == LT_REFUSAL_MEMORY && r.need_bytes == need[1],
                  "a budget short of the scratch: status %d, kind %s, need %zu", st,
                  lt_refusal_kind_name(r.kind), r.need_bytes);
            CHECK(gap_of(dev)->bytes_allocated == 0 && gap_of(host)->bytes_allocated == 0);
        }
        kconv_free(&k);
    }
    CHECK(est[1] == est[0] + 3 * mib && est[2] == est[0] + 2 * mib, "estimates %zu %zu %zu",
          est[0], est[1], est[2]);
    CHECK(need[1] == need[0] + 3 * mib && need[2] == need[0] + 2 * mib, "needs %zu %zu %zu",
          need[0], need[1], need[2]);
    printf("scratch: estimate %zu, %zu with 3 MiB to grow, %zu with 1 MiB of it held\n", est[0],
           est[1], est[2]);
}

/* An OUTPUT node keeps its storage to the end even when it is read early: later results
 * of the same size must not land on it. */
static void test_output_lifetime(void)
{
    reset_backends();
    struct lt_ctx *wctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20});
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *x = lt_new_tensor_1d(wctx, LT_TYPE_F32, 64);
    for (int i = 0; i < 64; i++)
        ((float *)x->data)[i] = 0.01f * (float)i;
    struct lt_tensor *y = lt_sqr(ctx, x);
    y->flags |= LT_FLAG_OUTPUT;
    struct lt_tensor *z = lt_neg(ctx, y);
    for (int i = 0; i < 6; i++)
        z = lt_neg(ctx, lt_exp(ctx, z));
    struct lt_graph *g = lt_graph_new(ctx, 64);
    lt_graph_build(g, z);
    struct lt_sched *s = lt_sched_new(&host, 1);
    CHECK(lt_sched_place(s, g, true, NULL) == LT_OK);
    CHECK(lt_sched_alloc(s, g) == LT_OK);
    CHECK(lt_sched_compute(s, g) == LT_OK);
    int bad = 0;
    for (int i = 0; i < 64; i++)
        bad += ((float *)y->data)[i] != ((float *)x->data)[i] * ((float *)x->data)[i];
    CHECK(bad == 0, "%d elements of the OUTPUT node were overwritten", bad);
    lt_sched_free(s);
    lt_ctx_free(ctx);
    lt_ctx_free(wctx);
}

int main(void)
{
    test_output_lifetime();
    test_inference_fallback(false);
    test_inference_fallback(true);
    test_refusals();
    test_regression_and_estimate();
    test_scratch_counted();
    lt_backend_free(dev);
    lt_backend_free(host);
    return check_summary();
}
