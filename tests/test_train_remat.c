/* test_train_remat.c: activation checkpointing (lt_train_graph_params.remat_bounds, what
 * `lathe train --checkpoint` asks for) changes nothing but memory and compute. On every
 * architecture of tests/test_model_util.h (qwen35's DeltaNet layers included), a training
 * graph whose backward reads recomputed copies of each layer's forward tensors gives the
 * same loss and, after an SGD step, the same weights, bit for bit, as the graph that keeps
 * them; it recomputes something; and on a longer batch its admission estimate is at most
 * three quarters of the other's. The same again with attention as FLASH_ATTN and the loss as
 * LINEAR_CE (a device's training graph: the attention's backward reads the recomputed
 * forward node, and the loss is folded into the head's backward node, src/ops/linear_ce.c). */
#include <string.h>

#include "check.h"
#include "lathe/opt.h"
#include "test_model_util.h"

#define T 9 /* tokens per sequence */
#define S 3 /* sequences */

/* the graphs' attention as FLASH_ATTN and their loss as LINEAR_CE (a device's training graph)
 * in the second round */
static bool use_flash;

enum { KEPT, WHOLE, SELECTIVE, MODES }; /* no checkpointing, whole layers, selective */
static const char *const mode_names[MODES] = {"off", "on", "selective"};

/* one accumulate + SGD step of every F32 weight (checkpointing `mode`); the loss, the weights
 * after the step
 * (concatenated) and the admission estimate */
static lt_status one_step(const struct lt_model *m, struct lt_backend *cpu,
                          const struct lt_model_replace *rep, int n_rep, int n_tokens, int n_seqs,
                          int mode, bool run, float *loss, float *after, size_t *estimate,
                          int *n_recomputed)
{
    struct lt_model_adapters ad = {
        .replace = rep, .n_replace = n_rep, .flash_attn = use_flash, .fused_loss = use_flash};
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 16 << 20, .no_alloc = true});
    struct lt_model_loss_graph lg;
    struct lt_train_graph *tg = NULL;
    lt_status st = lt_model_build_loss(m, ctx, n_tokens, n_seqs, &ad, &lg);
    if (st == LT_OK) {
        struct lt_train_graph_params gp = {.backends = &cpu,
                                           .n_backends = 1,
                                           .optimizer = LT_OPTIMIZER_SGD,
                                           .remat_bounds = mode ? lg.bounds : NULL,
                                           .n_remat_bounds = mode ? lg.n_bounds : 0,
                                           .remat_selective = mode == SELECTIVE};
        st = lt_train_graph_new(ctx, lg.loss, &gp, &tg, NULL);
    }
    if (st == LT_OK) {
        *estimate = lt_train_graph_estimate(tg);
        *n_recomputed = lt_train_graph_n_recomputed(tg);
    }
    if (st == LT_OK && run) {
        const int n = n_tokens * n_seqs, V = (int)lt_model_hparams(m)->n_vocab;
        int32_t tok[S * T], lab[S * T];
        tm_next_tokens(tok, lab, n_tokens, n, V);
        st = lt_train_graph_alloc(tg);
        if (st == LT_OK)
            st = lt_tensor_set(lg.tokens, tok, 0, sizeof(int32_t) * (size_t)n);
        if (st == LT_OK)
            st = lt_tensor_set(lg.labels, lab, 0, sizeof(int32_t) * (size_t)n);
        if (st == LT_OK)
            st = lt_model_loss_graph_set_pos(&lg);
        if (st == LT_OK)
            st = lt_train_graph_accumulate(tg, loss);
        if (st == LT_OK)
            st = lt_train_graph_step(tg, 0.05f);
    }
    lt_train_graph_free(tg); /* the weights go home, trained */
    size_t at = 0;
    for (int i = 0; i < n_rep && st == LT_OK && run; i++) {
        size_t k = (size_t)lt_nelements(rep[i].with);
        st = lt_tensor_get(rep[i].with, after + at, 0, k * sizeof(float));
        at += k;
    }
    lt_ctx_free(ctx);
    return st;
}

static void test_arch(const struct tm_spec *sp, int idx, struct lt_backend *cpu)
{
    char path[600];
    tm_model_path(path, sizeof(path), "test_train_remat", idx);
    struct lt_model *m;
    struct lt_model_f32_params *fp;
    float *orig = NULL, *after[MODES] = {NULL};
    const struct lt_model_replace *rep = NULL;
    int n_rep = 0;
    const size_t n_w = tm_load_f32(sp, path, 500 + (uint64_t)idx, &m, &fp, &rep, &n_rep);
    if (!n_w) {
        CHECK(0, "%s: %s", sp->arch, lt_last_error());
        goto out_free;
    }
    orig = malloc(n_w * sizeof(float));
    for (int r = 0; r < MODES; r++)
        after[r] = malloc(n_w * sizeof(float));
    size_t at = 0;
    for (int i = 0; i < n_rep; i++) {
        size_t k = (size_t)lt_nelements(rep[i].with);
        lt_tensor_get(rep[i].with, orig + at, 0, k * sizeof(float));
        at += k;
    }
    float loss[MODES] = {0};
    size_t est[MODES] = {0};
    int n_rec[MODES] = {0};
    for (int r = 0; r < MODES; r++) {
        lt_status st =
            one_step(m, cpu, rep, n_rep, T, S, r, true, &loss[r], after[r], &est[r], &n_rec[r]);
        CHECK(st == LT_OK, "%s, checkpointing %s: %s", sp->arch, mode_names[r], lt_last_error());
        at = 0; /* the next run starts from the same weights */
        for (int i = 0; i < n_rep; i++) {
            size_t k = (size_t)lt_nelements(rep[i].with);
            lt_tensor_set(rep[i].with, orig + at, 0, k * sizeof(float));
            at += k;
        }
    }
    /* selective: fewer copies than whole layers (the products are kept), but some */
    CHECK(n_rec[KEPT] == 0 && n_rec[WHOLE] > n_rec[SELECTIVE] && n_rec[SELECTIVE] > 0,
          "%s: %d, %d and %d tensors recomputed", sp->arch, n_rec[KEPT], n_rec[WHOLE],
          n_rec[SELECTIVE]);
    CHECK(memcmp(after[0], orig, n_w * sizeof(float)) != 0, "%s: the step changed nothing",
          sp->arch);
    for (int r = WHOLE; r < MODES; r++) {
        CHECK(memcmp(&loss[KEPT], &loss[r], sizeof(float)) == 0,
              "%s: loss %.9g kept, %.9g recomputed (%s)", sp->arch, (double)loss[KEPT],
              (double)loss[r], mode_names[r]);
        CHECK(memcmp(after[KEPT], after[r], n_w * sizeof(float)) == 0,
              "%s: the weights after a step differ with checkpointing %s", sp->arch, mode_names[r]);
    }
    /* a longer batch: the kept activations outweigh the copies of one layer */
    size_t big[MODES] = {0};
    for (int r = 0; r < MODES; r++) {
        int n_r;
        lt_status st = one_step(m, cpu, rep, n_rep, 64, 8, r, false, NULL, NULL, &big[r], &n_r);
        CHECK(st == LT_OK, "%s, 8 x 64 estimate: %s", sp->arch, lt_last_error());
    }
    /* at most 3/4: each weight's gradient is made and accumulated as the backward reaches
     * its layer (train_graph.c, order_backward); made after the whole backward, the
     * activations and gradients its product reads stayed, and checkpointing saved 8-12% */
    CHECK(big[WHOLE] * 4 < big[KEPT] * 3,
          "%s: 8 x 64 tokens: estimate %zu with checkpointing, %zu without", sp->arch, big[WHOLE],
          big[KEPT]);
    /* selective: between the two */
    CHECK(big[SELECTIVE] < big[KEPT] && big[SELECTIVE] >= big[WHOLE],
          "%s: 8 x 64 tokens: estimate %zu selective, %zu without, %zu whole layers", sp->arch,
          big[SELECTIVE], big[KEPT], big[WHOLE]);
    printf("%s: %d tensors recomputed (selective %d), loss %.6f every way; estimate 8 x 64: "
           "%.1f KiB -> %.1f KiB (selective %.1f KiB)\n",
           sp->arch, n_rec[WHOLE], n_rec[SELECTIVE], (double)loss[KEPT], big[KEPT] / 1024.0,
           big[WHOLE] / 1024.0, big[SELECTIVE] / 1024.0);
out_free:
    free(orig);
    for (int r = 0; r < MODES; r++)
        free(after[r]);
    lt_model_f32_params_free(fp);
    lt_model_free(m);
    remove(path);
}

int main(void)
{
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    for (int flash = 0; flash < 2; flash++) {
        use_flash = flash;
        if (flash)
            printf("attention as FLASH_ATTN, the loss as LINEAR_CE:\n");
        for (size_t i = 0; i < sizeof(tm_specs) / sizeof(tm_specs[0]); i++)
            test_arch(&tm_specs[i], (int)i, cpu);
    }
    lt_backend_free(cpu);
    return check_summary();
}
