/* test_train_packed.c: a packed step (several examples side by side in one loss graph, as
 * `lathe train --batch-tokens` builds it) gives the loss and the gradients of the same
 * examples run one at a time, weighted by their labelled tokens. On every architecture of
 * tests/test_model_util.h, qwen35's DeltaNet layers included: a sequence must start from
 * zero state and attend only within itself, and its padding must change nothing. Every
 * weight is trainable (F32 copies), so the gradients reach every op's backward rule.
 * The same for padding-free packing (lt_model_build_loss_packed): the three examples one
 * after another in one row, then in two rows (two examples, and one with padding after),
 * positions restarting at each: no attention, DeltaNet state or conv input may cross from
 * one example to the next, also as a device builds the graph (FLASH_ATTN, and LINEAR_CE as
 * the loss, folded into its backward). And CUDA's verdict (types, shapes and strides: no GPU
 * needed) refuses no more nodes of a packed training graph than of the unpacked one. */
#include <string.h>

#include "backend/cuda/cuda_verdict.h"
#include "check.h"
#include "lathe/autodiff.h"
#include "test_model_util.h"

#define T 9 /* tokens per sequence */
#define S 3 /* sequences */

static const int lens[S] = {9, 5, 7}; /* the last two are padded */

/* loss and d loss / d w (every trainable copy, concatenated) of tokens [n_seqs][t_row];
 * pos NULL: each row one example, else each step's position within its example (packed);
 * device: a device's graph, attention as FLASH_ATTN and the loss as LINEAR_CE (folded into
 * its backward node, src/ops/linear_ce.c) */
static lt_status loss_and_grads(const struct lt_model *m, struct lt_backend *cpu,
                                const struct lt_model_replace *rep, int n_rep, const int32_t *tok,
                                const int32_t *lab, int t_row, int n_seqs, const int32_t *pos,
                                bool device, float *loss, float *grads)
{
    struct lt_model_adapters ad = {
        .replace = rep, .n_replace = n_rep, .flash_attn = device, .fused_loss = device};
    return tm_loss_and_grads(m, cpu, &ad, tok, lab, t_row, n_seqs, pos, loss, grads, NULL, NULL);
}

/* Nodes of the training graph (forward, loss, backward) CUDA's verdict refuses, -1 when it
 * cannot be built; the first refusal's reason in why. */
static int cuda_refusals(const struct lt_model *m, const struct lt_model_replace *rep, int n_rep,
                         bool packed, bool flash, char *why, size_t why_size)
{
    struct lt_model_adapters ad = {
        .replace = rep, .n_replace = n_rep, .fused_loss = true, .flash_attn = flash};
    struct lt_ctx *ctx =
        lt_ctx_init((struct lt_ctx_params){.mem_size = 16 << 20, .no_alloc = true});
    struct lt_graph *g = lt_graph_new(ctx, 1 << 16);
    struct lt_model_loss_graph lg;
    lt_status st = packed ? lt_model_build_loss_packed(m, ctx, 21, 2, &ad, &lg)
                          : lt_model_build_loss(m, ctx, 21, 2, &ad, &lg);
    if (st == LT_OK)
        st = lt_graph_build(g, lg.loss);
    if (st == LT_OK)
        st = lt_autodiff_build(ctx, g, lg.loss, 1.0f, NULL);
    int n = st == LT_OK ? 0 : -1;
    for (int i = 0; st == LT_OK && i < g->n_nodes; i++) {
        char reason[160];
        if (!lt_cuda_verdict(g->nodes[i], reason, sizeof(reason)) && n++ == 0)
            snprintf(why, why_size, "%s '%s': %s", lt_op_name(g->nodes[i]->op), g->nodes[i]->name,
                     reason);
    }
    lt_ctx_free(ctx);
    return n;
}

static void test_arch(const struct tm_spec *sp, int idx, struct lt_backend *cpu)
{
    char path[600];
    tm_model_path(path, sizeof(path), "test_train_packed", idx);
    struct lt_model *m;
    struct lt_model_f32_params *fp;
    float *packed = NULL, *one = NULL, *expect = NULL;
    const struct lt_model_replace *rep = NULL;
    int n_rep = 0;
    const size_t n_w = tm_load_f32(sp, path, 300 + (uint64_t)idx, &m, &fp, &rep, &n_rep);
    if (!n_w) {
        CHECK(0, "%s: %s", sp->arch, lt_last_error());
        goto out_free;
    }
    packed = malloc(n_w * sizeof(float));
    one = malloc(n_w * sizeof(float));
    expect = calloc(n_w, sizeof(float));
    int V = (int)lt_model_hparams(m)->n_vocab;
    int32_t tok[S * T], lab[S * T];
    int n_lab = 0;
    for (int s = 0; s < S; s++)
        for (int t = 0; t < T; t++) {
            bool in = t < lens[s];
            tok[s * T + t] = in ? (s * 11 + t * 7 + 3) % V : 0; /* padding: token 0 */
            lab[s * T + t] = in && t + 1 < lens[s] ? (s * 11 + (t + 1) * 7 + 3) % V : -1;
            n_lab += lab[s * T + t] >= 0;
        }
    float loss_packed, loss_expect = 0;
    lt_status st =
        loss_and_grads(m, cpu, rep, n_rep, tok, lab, T, S, NULL, false, &loss_packed, packed);
    CHECK(st == LT_OK, "%s packed: %s", sp->arch, lt_last_error());
    for (int s = 0; s < S && st == LT_OK; s++) {
        float loss;
        st = loss_and_grads(m, cpu, rep, n_rep, tok + s * T, lab + s * T, T, 1, NULL, false, &loss,
                            one);
        CHECK(st == LT_OK, "%s sequence %d: %s", sp->arch, s, lt_last_error());
        double w = (double)(lens[s] - 1) / n_lab; /* its share of the labels */
        loss_expect += (float)(w * loss);
        for (size_t i = 0; i < n_w; i++)
            expect[i] += (float)(w * one[i]);
    }
    if (st != LT_OK)
        goto out_free;
    CHECK(fabsf(loss_packed - loss_expect) <= 1e-5f * fabsf(loss_expect),
          "%s: packed loss %.7f, one at a time %.7f", sp->arch, (double)loss_packed,
          (double)loss_expect);
    double err = tm_rel_err(packed, expect, (int)n_w);
    CHECK(err < 1e-4, "%s: packed gradients differ from one at a time: relative error %.3g",
          sp->arch, err);
    /* and per tensor, so a small tensor cannot hide behind the embedding */
    size_t at = 0;
    for (int i = 0; i < n_rep; i++) {
        int n = (int)lt_nelements(rep[i].with);
        double e = tm_rel_err(packed + at, expect + at, n);
        CHECK(e < 1e-3, "%s: gradient of %s: relative error %.3g", sp->arch, rep[i].w->name, e);
        at += (size_t)n;
    }
    printf("%s: %d weights, loss %.5f, gradient relative error %.2g\n", sp->arch, n_rep,
           (double)loss_packed, err);

    /* padding-free: the examples one after another, in one row of 21 and in two of 14;
     * then the same two as a device's training graph (attention as FLASH_ATTN, the loss as
     * LINEAR_CE), against the same one-at-a-time reference */
    for (int variant = 0; variant < 4; variant++) {
        enum { ROW_MAX = 21 };
        const int layout = variant % 2, t_row = layout ? 14 : 21, n_rows = layout ? 2 : 1;
        const bool flash = variant >= 2;
        /* the row and the first step of each example */
        static const int at_row[2][S] = {{0, 0, 0}, {0, 0, 1}},
                         at_step[2][S] = {{0, 9, 14}, {0, 9, 0}};
        int32_t ptok[2 * ROW_MAX], plab[2 * ROW_MAX], ppos[2 * ROW_MAX];
        for (int i = 0; i < n_rows * t_row; i++) /* padding: token 0, no label */
            ptok[i] = 0, plab[i] = -1;
        for (int s = 0; s < S; s++)
            for (int t = 0; t < lens[s]; t++) {
                int i = at_row[layout][s] * t_row + at_step[layout][s] + t;
                ptok[i] = tok[s * T + t];
                plab[i] = lab[s * T + t];
            }
        /* positions: 0 where an example starts, counting on after it (its padding too) */
        for (int r = 0; r < n_rows; r++) {
            int last = 0;
            for (int t = 0; t < t_row; t++) {
                int i = r * t_row + t;
                bool starts = false;
                for (int s = 0; s < S; s++)
                    starts = starts || (at_row[layout][s] == r && at_step[layout][s] == t);
                last = starts ? 0 : t == 0 ? 0 : last + 1;
                ppos[i] = last;
            }
        }
        float lp;
        st =
            loss_and_grads(m, cpu, rep, n_rep, ptok, plab, t_row, n_rows, ppos, flash, &lp, packed);
        CHECK(st == LT_OK, "%s padding-free: %s", sp->arch, lt_last_error());
        if (st != LT_OK)
            break;
        double e = tm_rel_err(packed, expect, (int)n_w);
        CHECK(fabsf(lp - loss_expect) <= 1e-5f * fabsf(loss_expect) && e < 1e-4,
              "%s padding-free (%d rows): loss %.7f against %.7f, gradients %.3g", sp->arch, n_rows,
              (double)lp, (double)loss_expect, e);
        for (int i = 0, at2 = 0; i < n_rep; i++) {
            int n = (int)lt_nelements(rep[i].with);
            double e2 = tm_rel_err(packed + at2, expect + at2, n);
            CHECK(e2 < 1e-3, "%s padding-free: gradient of %s: relative error %.3g", sp->arch,
                  rep[i].w->name, e2);
            at2 += n;
        }
        printf("%s: padding-free in %d row%s of %d%s: loss %.5f, gradient relative error %.2g\n",
               sp->arch, n_rows, n_rows > 1 ? "s" : "", t_row,
               flash ? " (flash_attn, linear_ce)" : "", (double)lp, e);
    }
    if (lt_cuda_compiled()) {
        char why_p[256] = "", why_u[256] = "";
        int np = cuda_refusals(m, rep, n_rep, true, false, why_p, sizeof(why_p)),
            nu = cuda_refusals(m, rep, n_rep, false, false, why_u, sizeof(why_u));
        CHECK(np >= 0 && nu >= 0 && np <= nu,
              "%s: CUDA refuses %d nodes of the packed graph (%s), %d of the unpacked (%s)",
              sp->arch, np, why_p, nu, why_u);
        char why_f[256] = "";
        int nf = cuda_refusals(m, rep, n_rep, true, true, why_f, sizeof(why_f));
        CHECK(nf >= 0 && nf <= nu,
              "%s: CUDA refuses %d nodes of the packed graph with flash_attn (%s), %d without",
              sp->arch, nf, why_f, nu);
        printf("%s: CUDA's verdict refuses %d nodes of the packed training graph, %d of the "
               "unpacked%s%s\n",
               sp->arch, np, nu, np ? ": " : "", why_p);
    }
out_free:
    free(packed);
    free(one);
    free(expect);
    lt_model_f32_params_free(fp);
    lt_model_free(m);
    remove(path);
}

int main(void)
{
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    for (size_t i = 0; i < sizeof(tm_specs) / sizeof(tm_specs[0]); i++)
        test_arch(&tm_specs[i], (int)i, cpu);
    lt_backend_free(cpu);
    return check_summary();
}
