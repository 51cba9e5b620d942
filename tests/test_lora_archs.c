/* test_lora_archs.c: LoRA on every architecture (tests/test_model_util.h's tiny llama, qwen2
 * and two qwen35 models): the default targets include qwen35's DeltaNet projections
 * (attn_qkv, attn_gate, ssm_out) in its recurrent layers and q/k/v/output in its attention
 * layers; logits through adapters equal those of weights merged by a plain loop; and
 * training only the adapters (all layers, and top_layers = 1) through the training-graph
 * API lowers the loss on a fixed sequence while the base stays frozen. */
#include <string.h>

#include "check.h"
#include "lathe/lora.h"
#include "lathe/opt.h"
#include "test_model_util.h"

static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) / 16777216.0) * 2.0f - 1.0f;
}

static bool is_matrix(void *user, const struct lt_tensor *w)
{
    (void)user;
    return strncmp(w->name, "blk.", 4) == 0 && w->ne[1] > 1 && w->ne[2] == 1;
}

/* W[i, o] += s * sum_r b[r, o] a[i, r] on the F32 copies. */
static void merge(const struct lt_lora *l, const struct lt_model_replace *rep, int n)
{
    for (int p = 0; p < l->n_pairs; p++) {
        const struct lt_lora_pair *pr = &l->pairs[p];
        for (int k = 0; k < n; k++) {
            if (strcmp(rep[k].w->name, pr->weight))
                continue;
            int64_t n_in = pr->a->ne[0], rank = pr->a->ne[1], n_out = pr->b->ne[1];
            float s = lt_lora_scale(l, p, 1.0f);
            const float *a = pr->a->data, *b = pr->b->data;
            float *w = rep[k].with->data;
            for (int64_t o = 0; o < n_out; o++)
                for (int64_t i = 0; i < n_in; i++) {
                    double acc = 0;
                    for (int64_t r = 0; r < rank; r++)
                        acc += (double)b[o * rank + r] * a[r * n_in + i];
                    w[o * n_in + i] += (float)(s * acc);
                }
        }
    }
}

/* Trains only l's pairs on a fixed sequence; returns the first and last losses. */
static lt_status train(struct lt_model *m, struct lt_backend *cpu, struct lt_lora *l, int steps,
                       float *first, float *last)
{
    enum { T = 16 };
    struct lt_model_lora *list;
    int n;
    lt_status st = lt_lora_model_list(m, &l, NULL, 1, &list, &n);
    if (st != LT_OK)
        return st;
    struct lt_model_adapters ad = {.lora = list, .n_lora = n};
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20, .no_alloc = true});
    struct lt_model_loss_graph lg;
    struct lt_train_graph *tg = NULL;
    struct lt_train_graph_params gp = {.backends = &cpu, .n_backends = 1, .device_only = true};
    st = lt_model_build_loss(m, ctx, T, 1, &ad, &lg);
    if (st == LT_OK)
        st = lt_train_graph_new(ctx, lg.loss, &gp, &tg, NULL);
    if (st == LT_OK)
        st = lt_train_graph_alloc(tg);
    int32_t tok[T], lab[T];
    int V = (int)lt_model_hparams(m)->n_vocab;
    for (int i = 0; i < T; i++)
        tok[i] = (i * 5 + 3) % V;
    for (int i = 0; i < T; i++)
        lab[i] = i + 1 < T ? tok[i + 1] : -1;
    if (st == LT_OK)
        st = lt_tensor_set(lg.tokens, tok, 0, sizeof(tok));
    if (st == LT_OK)
        st = lt_tensor_set(lg.labels, lab, 0, sizeof(lab));
    if (st == LT_OK)
        st = lt_model_loss_graph_set_pos(&lg);
    if (st == LT_OK && lt_train_graph_n_params(tg) != 2 * l->n_pairs)
        st = lt_fail(LT_ERR_INVALID, "%d trainable tensors, not the adapter's %d",
                     lt_train_graph_n_params(tg), 2 * l->n_pairs);
    for (int s = 0; s < steps && st == LT_OK; s++) {
        float loss;
        st = lt_train_graph_accumulate(tg, &loss);
        if (st == LT_OK)
            st = lt_train_graph_step(tg, 1e-2f);
        if (s == 0)
            *first = loss;
        *last = loss;
    }
    lt_train_graph_free(tg);
    lt_ctx_free(ctx);
    free(list);
    return st;
}

static void test_arch(const struct tm_spec *sp, int idx, struct lt_backend *cpu)
{
    char path[600];
    tm_model_path(path, sizeof(path), "test_lora_archs", idx);
    struct lt_model *m = NULL;
    if (tm_write_model(sp, path, 100 + (uint64_t)idx) != LT_OK ||
        lt_model_load(path, NULL, &m) != LT_OK) {
        CHECK(0, "%s: %s", sp->arch, lt_last_error());
        return;
    }
    const struct lt_model_hparams *hp = lt_model_hparams(m);
    struct lt_lora *l = NULL;
    CHECK(lt_lora_new(m, &(struct lt_lora_params){.rank = 4, .alpha = 8, .seed = 1}, &l) == LT_OK,
          "%s: %s", sp->arch, lt_last_error());
    if (!l)
        goto out_free;
    /* the default targets, layer by layer */
    int want = 0;
    for (int il = 0; il < hp->n_layer; il++)
        want += lt_model_layer_is_recurrent(m, il) ? 3 : 4;
    int n_ssm = 0;
    for (int i = 0; i < l->n_pairs; i++) {
        const char *w = l->pairs[i].weight;
        bool rec = lt_model_layer_is_recurrent(m, l->pairs[i].layer);
        bool ok =
            rec ? (strstr(w, ".attn_qkv.") || strstr(w, ".attn_gate.") || strstr(w, ".ssm_out."))
                : (strstr(w, ".attn_q.") || strstr(w, ".attn_k.") || strstr(w, ".attn_v.") ||
                   strstr(w, ".attn_output."));
        CHECK(ok, "%s: %s in a %s layer", sp->arch, w, rec ? "recurrent" : "attention");
        n_ssm += strstr(w, ".ssm_out.") != NULL;
    }
    CHECK(l->n_pairs == want, "%s: %d pairs, want %d", sp->arch, l->n_pairs, want);
    if (!strcmp(sp->arch, "qwen35"))
        CHECK(n_ssm > 0, "qwen35: ssm_out adapted");

    /* adapters = merged weights */
    uint64_t seed = 7;
    for (int i = 0; i < l->n_pairs; i++)
        for (int64_t k = 0; k < lt_nelements(l->pairs[i].b); k++)
            ((float *)l->pairs[i].b->data)[k] = 0.3f * rnd(&seed);
    enum { T = 9 };
    int32_t tok[T];
    for (int i = 0; i < T; i++)
        tok[i] = (i * 7 + 1) % (int)hp->n_vocab;
    size_t nl = (size_t)T * (size_t)hp->n_vocab;
    float *with = malloc(nl * sizeof(float)), *merged = malloc(nl * sizeof(float)),
          *base = malloc(nl * sizeof(float));
    struct lt_model_lora *list;
    int n;
    struct lt_model_f32_params *f32 = NULL;
    CHECK(lt_lora_model_list(m, &l, NULL, 1, &list, &n) == LT_OK, "%s", lt_last_error());
    struct lt_model_adapters ad = {.lora = list, .n_lora = n};
    CHECK(tm_forward_ad(m, cpu, &ad, tok, T, 1, with) == LT_OK, "%s", lt_last_error());
    CHECK(tm_forward(m, cpu, tok, T, 1, base) == LT_OK, "%s", lt_last_error());
    free(list);
    CHECK(lt_model_f32_params_new(m, is_matrix, NULL, &f32) == LT_OK, "%s", lt_last_error());
    int n_rep;
    const struct lt_model_replace *rep = lt_model_f32_params_list(f32, &n_rep);
    merge(l, rep, n_rep);
    struct lt_model_adapters mad = {.replace = rep, .n_replace = n_rep};
    CHECK(tm_forward_ad(m, cpu, &mad, tok, T, 1, merged) == LT_OK, "%s", lt_last_error());
    lt_model_f32_params_free(f32);
    double e = check_nmse(with, merged, (long)nl), d = check_nmse(with, base, (long)nl);
    CHECK(e < 1e-9 && d > 1e-4, "%s: adapters = merged (nmse %g; %g from the base)", sp->arch, e,
          d);
    free(with);
    free(merged);
    free(base);
    lt_lora_free(l);
    l = NULL;

    /* training the adapters alone lowers the loss; then only the top layer */
    float first = 0, last = 0;
    CHECK(lt_lora_new(m, &(struct lt_lora_params){.rank = 4, .alpha = 8, .seed = 2}, &l) == LT_OK,
          "%s", lt_last_error());
    CHECK(train(m, cpu, l, 30, &first, &last) == LT_OK, "%s: %s", sp->arch, lt_last_error());
    printf("%s: LoRA on all layers, loss %.3f -> %.3f\n", sp->arch, first, last);
    CHECK(last < 0.7f * first, "%s: loss fell %g -> %g", sp->arch, first, last);
    lt_lora_free(l);
    /* qwen35: the top block is an attention layer, where attn_qkv and ssm_out don't exist */
    const char *targets = strcmp(sp->arch, "qwen35") ? "attn_q,attn_v,ffn_down"
                                                     : "attn_qkv,ssm_out,attn_q,attn_v,ffn_down";
    CHECK(lt_lora_new(m,
                      &(struct lt_lora_params){
                          .rank = 4, .alpha = 8, .seed = 2, .top_layers = 1, .targets = targets},
                      &l) == LT_OK,
          "%s", lt_last_error());
    bool top_only = l && l->n_pairs > 0;
    for (int i = 0; l && i < l->n_pairs; i++)
        top_only = top_only && l->pairs[i].layer == hp->n_layer - 1;
    CHECK(top_only && l->n_pairs == 3, "%s: top_layers 1 adapts the last block only (%d pairs)",
          sp->arch, l ? l->n_pairs : 0);
    /* defaults with top_layers: the targets missing from the top block are skipped */
    struct lt_lora *l2 = NULL;
    CHECK(lt_lora_new(m, &(struct lt_lora_params){.rank = 2, .alpha = 2, .top_layers = 1}, &l2) ==
                  LT_OK &&
              l2->n_pairs == (lt_model_layer_is_recurrent(m, (int)hp->n_layer - 1) ? 3 : 4),
          "%s: default targets, top layer: %s", sp->arch, lt_last_error());
    lt_lora_free(l2);
    CHECK(l && train(m, cpu, l, 30, &first, &last) == LT_OK, "%s: %s", sp->arch, lt_last_error());
    printf("%s: LoRA on the top layer, loss %.3f -> %.3f\n", sp->arch, first, last);
    CHECK(last < 0.9f * first, "%s: loss fell %g -> %g", sp->arch, first, last);
out_free:
    lt_lora_free(l);
    lt_model_free(m);
    remove(path);
}

int main(void)
{
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    for (int i = 0; i < TM_N_SPECS; i++)
        test_arch(&tm_specs[i], i, cpu);
    lt_backend_free(cpu);
    return check_summary();
}
