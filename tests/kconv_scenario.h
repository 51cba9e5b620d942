/* kconv_scenario.h: the failure lathe exists to prevent, as a test any device can run.
 *
 * A Qwen3.5 training graph (a tiny random qwen35 model, every weight an F32 trainable copy
 * held in the device's memory) has the L2-norm backward of k_conv, a non-contiguous slice of
 * the conv output, and gradients flowing into slices of the fused QKV projection. With the
 * device first and device_only set:
 *   1. it is admitted with no node off the device, and a few AdamW steps lower the loss;
 *   2. on a device that says no to SQR (dev_gap), the same graph is refused before anything
 *      is allocated, naming SQR, the node and k_conv as its source.
 * tests/gpu/test_cuda_scenario.c runs it on CUDA0 (LATHE_CUDA_DISABLE_OPS=SQR for the gap),
 * tests/test_scenario_gap.c on the gap backend, so CI runs it too. */
#ifndef LATHE_TESTS_KCONV_SCENARIO_H
#define LATHE_TESTS_KCONV_SCENARIO_H

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "lathe/model.h"
#include "lathe/opt.h"
#include "test_model_util.h"

#define T 12

static const struct tm_spec *qwen35_spec(void)
{
    for (int i = 0; i < TM_N_SPECS; i++)
        if (!strcmp(tm_specs[i].arch, "qwen35"))
            return &tm_specs[i];
    return NULL;
}

/* Moves every trainable copy into one buffer of `be`. */
static struct lt_buffer *upload(struct lt_backend *be, const struct lt_model_replace *r, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += (lt_nbytes(r[i].with) + 255) & ~(size_t)255;
    struct lt_buffer *buf = NULL;
    if (lt_backend_buffer_alloc(be, total, &buf) != LT_OK)
        return NULL;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        struct lt_tensor *t = r[i].with;
        size_t nb = lt_nbytes(t);
        void *host = malloc(nb);
        memcpy(host, t->data, nb);
        t->data = (char *)buf->base + off;
        t->buffer = buf;
        lt_tensor_set(t, host, 0, nb);
        free(host);
        off += (nb + 255) & ~(size_t)255;
    }
    return buf;
}

struct built {
    struct lt_ctx *ctx;
    struct lt_model_loss_graph lg;
};

static lt_status build(const struct lt_model *m, const struct lt_model_adapters *ad, struct built *b)
{
    b->ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20, .no_alloc = true});
    return lt_model_build_loss(m, b->ctx, T, 1, ad, &b->lg);
}

/* Runs both parts; dev holds the trainable copies. The refusal is returned in *r. */
static void kconv_scenario_run(struct lt_backend *dev, struct lt_backend *dev_gap,
                               struct lt_backend *cpu, struct lt_refusal *r)
{
    (void)tm_forward; /* shared test helpers this scenario does not need */
    (void)tm_forward_ad;
    char path[256];
    snprintf(path, sizeof(path), "/tmp/lathe-kconv-scenario-%d.gguf", (int)getpid());
    const struct tm_spec *spec = qwen35_spec();
    CHECK(spec && tm_write_model(spec, path, 11) == LT_OK, "%s", lt_last_error());
    struct lt_model *m = NULL;
    CHECK(lt_model_load(path, NULL, &m) == LT_OK, "%s", lt_last_error());
    struct lt_model_f32_params *fp = NULL;
    CHECK(lt_model_f32_params_new(m, NULL, NULL, &fp) == LT_OK, "%s", lt_last_error());
    int n_rep = 0;
    const struct lt_model_replace *rep = lt_model_f32_params_list(fp, &n_rep);
    struct lt_buffer *params_buf = upload(dev, rep, n_rep);
    CHECK(params_buf != NULL, "%s", lt_last_error());
    struct lt_model_adapters ad = {.replace = rep, .n_replace = n_rep};

    /* 1. admitted entirely on the device, and it trains */
    struct lt_backend *bes[2] = {dev, cpu};
    struct lt_train_graph_params p = {.backends = bes, .n_backends = 2, .device_only = true};
    struct built b;
    struct lt_train_graph *tg = NULL;
    lt_status st = build(m, &ad, &b);
    if (st == LT_OK)
        st = lt_train_graph_new(b.ctx, b.lg.loss, &p, &tg, r);
    CHECK(st == LT_OK, "refused on the device: %s", lt_last_error());
    if (st == LT_OK) {
        lt_train_graph_print(tg, stdout);
        CHECK(lt_train_graph_n_fallback(tg) == 0, "%d nodes off the device",
              lt_train_graph_n_fallback(tg));
        CHECK(lt_train_graph_alloc(tg) == LT_OK, "%s", lt_last_error());
        int32_t tok[T], lab[T];
        for (int i = 0; i < T; i++)
            tok[i] = (i * 5 + 1) % spec->n_vocab;
        for (int i = 0; i < T; i++)
            lab[i] = i + 1 < T ? tok[i + 1] : -1;
        lt_tensor_set(b.lg.tokens, tok, 0, sizeof(tok));
        lt_tensor_set(b.lg.labels, lab, 0, sizeof(lab));
        lt_model_loss_graph_set_pos(&b.lg);
        float l0 = 0, l1 = 0;
        for (int s = 0; s < 8; s++) {
            CHECK(lt_train_graph_accumulate(tg, s == 0 ? &l0 : NULL) == LT_OK, "%s", lt_last_error());
            CHECK(lt_train_graph_step(tg, 1e-2f) == LT_OK, "%s", lt_last_error());
        }
        CHECK(lt_train_graph_eval(tg, &l1) == LT_OK, "%s", lt_last_error());
        printf("on the device: loss %.4f -> %.4f after 8 AdamW steps\n", l0, l1);
        CHECK(l1 < l0, "loss %g -> %g", l0, l1);
        lt_train_graph_free(tg);
    }
    lt_ctx_free(b.ctx);

    /* 2. the device says no to SQR: refused before anything is allocated */
    bes[0] = dev_gap;
    st = build(m, &ad, &b);
    tg = NULL;
    if (st == LT_OK)
        st = lt_train_graph_new(b.ctx, b.lg.loss, &p, &tg, r);
    printf("refusal: %s\n", r->sentence);
    CHECK(st == LT_ERR_REFUSED && tg == NULL, "status %d", st);
    CHECK(r->kind == LT_REFUSAL_DEVICE_ONLY, "kind %s", lt_refusal_kind_name(r->kind));
    CHECK(!strcmp(r->op, "SQR"), "op %s", r->op);
    CHECK(strstr(r->source, "k_conv") != NULL, "source '%s'", r->source);
    CHECK(strstr(r->node, "k_conv") != NULL, "node '%s'", r->node);
    CHECK(strstr(r->sentence, "SQR") && strstr(r->sentence, "k_conv"), "%s", r->sentence);
    lt_ctx_free(b.ctx);

    lt_buffer_free(params_buf);
    lt_model_f32_params_free(fp);
    lt_model_free(m);
    unlink(path);
}

#endif
