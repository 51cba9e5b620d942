/* test_lora.c: LoRA adapters: creation (targets, top_layers, Kaiming-uniform A, zero B),
 * the GGUF round trip and refusal of malformed adapter files, checks against a model, and
 * inference through adapters: the logits of a model read with one or two adapters at given
 * scales equal those of the same model whose weights were merged (W + s B A) by a plain
 * loop here, for F32 and Q8_0 bases.
 *
 * Modes for tests/py/test_train_lora_gguf.py: --write DIR writes DIR/model.gguf and
 * DIR/adapter.gguf and prints the adapter as JSON; --read MODEL ADAPTER prints an adapter
 * file (checked against MODEL) as JSON. */
#include <string.h>

#include "check.h"
#include "lathe/lora.h"
#include "lathe/sched.h"
#include "test_train_tiny.h"

/* Logits [T, V] of tokens through the loss graph's forward pass. */
static lt_status logits_of(struct lt_model *m, const struct lt_model_adapters *ad,
                           const int32_t *tokens, int T, float *out)
{
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 4 << 20, .no_alloc = true});
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    struct lt_sched *s = lt_sched_new(&cpu, 1);
    struct lt_model_loss_graph lg;
    struct lt_graph *g = lt_graph_new(ctx, 1 << 14);
    lt_status st = lt_model_build_loss(m, ctx, T, 1, ad, &lg);
    if (st == LT_OK)
        st = lt_graph_build(g, lg.logits);
    if (st == LT_OK)
        st = lt_sched_place(s, g, false, NULL);
    if (st == LT_OK)
        st = lt_sched_alloc(s, g);
    if (st == LT_OK)
        st = lt_tensor_set(lg.tokens, tokens, 0, sizeof(int32_t) * (size_t)T);
    if (st == LT_OK)
        st = lt_model_loss_graph_set_pos(&lg);
    if (st == LT_OK)
        st = lt_sched_compute(s, g);
    if (st == LT_OK)
        st = lt_tensor_get(lg.logits, out, 0, sizeof(float) * (size_t)T * TINY_VOCAB);
    lt_sched_free(s);
    lt_backend_free(cpu);
    lt_ctx_free(ctx);
    return st;
}

static float rnd_state_f(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) / 16777216.0) * 2.0f - 1.0f;
}

static void randomise_b(struct lt_lora *l, uint64_t seed, float scale)
{
    for (int i = 0; i < l->n_pairs; i++) {
        float *b = l->pairs[i].b->data;
        for (int64_t k = 0; k < lt_nelements(l->pairs[i].b); k++)
            b[k] = scale * rnd_state_f(&seed);
    }
}

/* W += s * (B A) for every pair of l, on F32 copies found in `list` (by weight name):
 * W[i, o] += s * sum_r b[r, o] * a[i, r] with a [n_in, rank], b [rank, n_out]. */
static void merge(const struct lt_lora *l, float user_scale, const struct lt_model_replace *list,
                  int n)
{
    for (int p = 0; p < l->n_pairs; p++) {
        const struct lt_lora_pair *pr = &l->pairs[p];
        struct lt_tensor *w = NULL;
        for (int k = 0; k < n; k++)
            if (!strcmp(list[k].w->name, pr->weight))
                w = list[k].with;
        if (!w)
            continue;
        int64_t n_in = pr->a->ne[0], rank = pr->a->ne[1], n_out = pr->b->ne[1];
        float s = user_scale * l->alpha / (float)rank;
        const float *a = pr->a->data, *b = pr->b->data;
        float *wd = w->data;
        for (int64_t o = 0; o < n_out; o++)
            for (int64_t i = 0; i < n_in; i++) {
                double acc = 0;
                for (int64_t r = 0; r < rank; r++)
                    acc += (double)b[o * rank + r] * a[r * n_in + i];
                wd[o * n_in + i] += (float)(s * acc);
            }
    }
}

static bool is_2d_target(void *user, const struct lt_tensor *w)
{
    (void)user;
    return strstr(w->name, "blk.") == w->name && w->ne[1] > 1;
}

static void test_create(struct lt_model *m)
{
    struct lt_lora *l;
    struct lt_lora_params p = {
        .rank = 4, .alpha = 8, .targets = "attn_q, ffn_down", .top_layers = 2, .seed = 3};
    CHECK(lt_lora_new(m, &p, &l) == LT_OK, "%s", lt_last_error());
    if (!l)
        return;
    CHECK(l->n_pairs == 4, "2 targets x 2 top layers: %d pairs", l->n_pairs);
    CHECK(!strcmp(l->pairs[0].weight, "blk.1.attn_q.weight") &&
              !strcmp(l->pairs[3].weight, "blk.2.ffn_down.weight"),
          "%s .. %s", l->pairs[0].weight, l->pairs[3].weight);
    CHECK(!strcmp(l->pairs[0].a->name, "blk.1.attn_q.weight.lora_a") &&
              !strcmp(l->pairs[0].b->name, "blk.1.attn_q.weight.lora_b"),
          "tensor names");
    CHECK(!strcmp(l->arch, "llama") && l->alpha == 8, "arch %s alpha %g", l->arch, l->alpha);
    bool shapes = true, b_zero = true, a_bounded = true, params = true;
    double a_abs = 0;
    for (int i = 0; i < l->n_pairs; i++) {
        struct lt_lora_pair *pr = &l->pairs[i];
        const struct lt_tensor *w = lt_model_find_weight(m, pr->weight);
        shapes = shapes && pr->a->ne[0] == w->ne[0] && pr->a->ne[1] == 4 && pr->b->ne[0] == 4 &&
                 pr->b->ne[1] == w->ne[1] && pr->a->type == LT_TYPE_F32;
        float bound = 1.0f / sqrtf((float)w->ne[0]);
        for (int64_t k = 0; k < lt_nelements(pr->a); k++) {
            float v = ((float *)pr->a->data)[k];
            a_bounded = a_bounded && fabsf(v) <= bound;
            a_abs += fabs(v) / bound;
        }
        for (int64_t k = 0; k < lt_nelements(pr->b); k++)
            b_zero = b_zero && ((float *)pr->b->data)[k] == 0;
        params = params && (pr->a->flags & LT_FLAG_PARAM) && (pr->b->flags & LT_FLAG_PARAM);
    }
    CHECK(shapes, "a [n_in, rank], b [rank, n_out]");
    CHECK(b_zero, "B starts at zero");
    CHECK(a_bounded, "A within +-1/sqrt(n_in)");
    int64_t n_a = 0;
    for (int i = 0; i < l->n_pairs; i++)
        n_a += lt_nelements(l->pairs[i].a);
    CHECK(fabs(a_abs / (double)n_a - 0.5) < 0.05, "A uniform: mean |a|/bound %.3f",
          a_abs / (double)n_a);
    CHECK(params, "A and B trainable");
    struct lt_lora *l2;
    CHECK(lt_lora_new(m, &p, &l2) == LT_OK &&
              !memcmp(l->pairs[0].a->data, l2->pairs[0].a->data, lt_nbytes(l->pairs[0].a)),
          "same seed, same A");
    lt_lora_free(l2);

    /* reserved for admission, committed afterwards: the same adapter, and nothing to save
     * before the commit */
    CHECK(lt_lora_reserve(m, &p, &l2) == LT_OK && !lt_lora_committed(l2), "%s", lt_last_error());
    if (l2) {
        CHECK(l2->n_pairs == l->n_pairs && l2->pairs[3].b->ne[1] == l->pairs[3].b->ne[1] &&
                  (l2->pairs[0].a->flags & LT_FLAG_PARAM),
              "shapes and flags before the commit");
        CHECK(lt_lora_save(l2, "/nonexistent/never.gguf") == LT_ERR_INVALID &&
                  strstr(lt_last_error(), "lt_lora_commit"),
              "a reserved adapter is not saved: %s", lt_last_error());
        CHECK(lt_lora_commit(l2) == LT_OK && lt_lora_committed(l2) && lt_lora_commit(l2) == LT_OK,
              "%s", lt_last_error());
        bool same = true;
        for (int i = 0; i < l->n_pairs; i++)
            same = same &&
                   !memcmp(l->pairs[i].a->data, l2->pairs[i].a->data, lt_nbytes(l->pairs[i].a)) &&
                   !memcmp(l->pairs[i].b->data, l2->pairs[i].b->data, lt_nbytes(l->pairs[i].b));
        CHECK(same, "reserve + commit gives lt_lora_new's A and B");
    }
    lt_lora_free(l2);
    lt_lora_free(l);

    CHECK(lt_lora_new(m, &(struct lt_lora_params){.rank = 2, .alpha = 4, .seed = 1}, &l) == LT_OK &&
              l->n_pairs == 12,
          "default targets: q, k, v, output in 3 layers");
    lt_lora_free(l);
    CHECK(lt_lora_new(m, &(struct lt_lora_params){.rank = 2, .alpha = 4, .targets = "attn_qkv"},
                      &l) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "'attn_qkv' matches no weight of this llama model"),
          "%s", lt_last_error());
    CHECK(lt_lora_new(m, &(struct lt_lora_params){.rank = 2, .alpha = 4, .targets = "attn_z"},
                      &l) == LT_ERR_INVALID &&
              strstr(lt_last_error(), "unknown target 'attn_z'"),
          "%s", lt_last_error());
    CHECK(lt_lora_new(m, &(struct lt_lora_params){.rank = 2, .alpha = 4, .top_layers = 4}, &l) ==
              LT_ERR_INVALID,
          "top_layers past the model");
}

static void test_round_trip(struct lt_model *m, const char *dir)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/test_lora_rt.gguf", dir);
    struct lt_lora *l, *r;
    CHECK(lt_lora_new(m,
                      &(struct lt_lora_params){
                          .rank = 3, .alpha = 5, .seed = 9, .targets = "attn_v,ffn_up"},
                      &l) == LT_OK,
          "%s", lt_last_error());
    randomise_b(l, 11, 0.1f);
    CHECK(lt_lora_save(l, path) == LT_OK, "%s", lt_last_error());
    CHECK(lt_lora_load(path, &r) == LT_OK, "%s", lt_last_error());
    if (r) {
        bool same = r->n_pairs == l->n_pairs && r->alpha == 5 && !strcmp(r->arch, "llama");
        for (int i = 0; same && i < l->n_pairs; i++)
            same = !strcmp(r->pairs[i].weight, l->pairs[i].weight) &&
                   r->pairs[i].layer == l->pairs[i].layer &&
                   lt_same_shape(r->pairs[i].a, l->pairs[i].a) &&
                   lt_same_shape(r->pairs[i].b, l->pairs[i].b) &&
                   !memcmp(r->pairs[i].a->data, l->pairs[i].a->data, lt_nbytes(l->pairs[i].a)) &&
                   !memcmp(r->pairs[i].b->data, l->pairs[i].b->data, lt_nbytes(l->pairs[i].b));
        CHECK(same, "saved and loaded adapters are the same, bit for bit");
        CHECK(lt_lora_check(r, m) == LT_OK, "%s", lt_last_error());
        struct lt_model_lora *list;
        int n;
        struct lt_lora *ls[2] = {r, l};
        float scales[2] = {0.5f, 2.0f};
        CHECK(lt_lora_model_list(m, ls, scales, 2, &list, &n) == LT_OK && n == 2 * l->n_pairs,
              "list of both adapters");
        CHECK(fabsf(list[0].scale - 0.5f * 5 / 3) < 1e-6f &&
                  fabsf(list[n - 1].scale - 2.0f * 5 / 3) < 1e-6f,
              "scale = user * alpha / rank: %g %g", list[0].scale, list[n - 1].scale);
        CHECK(list[0].w == lt_model_find_weight(m, l->pairs[0].weight) &&
                  list[0].a == r->pairs[0].a,
              "pairs point at the weight and the adapter");
        free(list);
        /* a mismatched adapter is refused */
        snprintf(r->arch, sizeof(r->arch), "qwen2");
        CHECK(lt_lora_check(r, m) == LT_ERR_INVALID && strstr(lt_last_error(), "qwen2"), "%s",
              lt_last_error());
        snprintf(r->arch, sizeof(r->arch), "llama");
        snprintf(r->pairs[0].weight, sizeof(r->pairs[0].weight), "blk.0.ffn_gate.weight");
        CHECK(lt_lora_check(r, m) == LT_ERR_INVALID && strstr(lt_last_error(), "blk.0.ffn_gate"),
              "%s", lt_last_error());
        lt_lora_free(r);
    }
    lt_lora_free(l);
    remove(path);
}

/* A hand-made adapter file; `variant` breaks it in one way. */
static lt_status write_adapter(const char *path, int variant)
{
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    lt_gguf_writer_set_str(w, "general.architecture", "llama");
    lt_gguf_writer_set_str(w, "general.type", variant == 1 ? "model" : "adapter");
    lt_gguf_writer_set_str(w, "adapter.type", "lora");
    lt_gguf_writer_set_f32(w, "adapter.lora.alpha", 4);
    static uint16_t a16[32 * 2], b16[2 * 32];
    for (int i = 0; i < 64; i++) {
        a16[i] = lt_fp32_to_fp16(0.25f * (float)(i % 7) - 0.5f);
        b16[i] = lt_fp32_to_fp16(0.125f * (float)(i % 5));
    }
    int64_t na[2] = {32, 2}, nb[2] = {variant == 3 ? 3 : 2, 32};
    size_t nbb = (size_t)nb[0] * 32 * 2;
    void *zeros = variant == 3 ? calloc(1, nbb) : NULL; /* a rank-3 B, the wrong rank */
    lt_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.lora_a", LT_TYPE_F16, 2, na, a16,
                              sizeof(a16));
    if (variant != 2)
        lt_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.lora_b", LT_TYPE_F16, 2, nb,
                                  zeros ? zeros : (void *)b16, nbb);
    lt_status st = lt_gguf_writer_write(w, path);
    lt_gguf_writer_free(w);
    free(zeros);
    return st;
}

static void test_bad_files(struct lt_model *m, const char *dir)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/test_lora_bad.gguf", dir);
    struct lt_lora *l;
    CHECK(write_adapter(path, 0) == LT_OK && lt_lora_load(path, &l) == LT_OK, "%s",
          lt_last_error());
    if (l) {
        float a = ((float *)l->pairs[0].a->data)[3], b = ((float *)l->pairs[0].b->data)[7];
        CHECK(a == 0.25f * 3 - 0.5f && b == 0.125f * 2, "F16 tensors converted: %g %g", a, b);
        CHECK(l->pairs[0].layer == 0 && lt_lora_rank(l, 0) == 2, "layer and rank");
        CHECK(lt_lora_check(l, m) == LT_OK, "%s", lt_last_error());
        lt_lora_free(l);
    }
    CHECK(write_adapter(path, 1) == LT_OK && lt_lora_load(path, &l) == LT_ERR_FORMAT &&
              strstr(lt_last_error(), "general.type is 'model'"),
          "%s", lt_last_error());
    CHECK(write_adapter(path, 2) == LT_OK && lt_lora_load(path, &l) == LT_ERR_FORMAT &&
              strstr(lt_last_error(), "no partner"),
          "%s", lt_last_error());
    CHECK(write_adapter(path, 3) == LT_OK && lt_lora_load(path, &l) == LT_ERR_FORMAT &&
              strstr(lt_last_error(), "rank"),
          "%s", lt_last_error());
    char model_path[600];
    snprintf(model_path, sizeof(model_path), "%s/test_lora.gguf", dir);
    CHECK(lt_lora_load(model_path, &l) == LT_ERR_FORMAT && strstr(lt_last_error(), "not a LoRA"),
          "a model is not an adapter: %s", lt_last_error());
    remove(path);
}

/* Logits through adapters vs logits of merged weights. */
static void test_apply(const char *dir, enum lt_type wtype)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/test_lora_apply.gguf", dir);
    struct tiny_spec sp = {32, 4, 2, 64, 2, wtype, 5};
    struct lt_model *m;
    if (tiny_model_write(path, &sp) != 0 || lt_model_load(path, NULL, &m) != LT_OK) {
        CHECK(0, "tiny model: %s", lt_last_error());
        return;
    }
    enum { T = 12 };
    int32_t tokens[T];
    for (int i = 0; i < T; i++)
        tokens[i] = (i * 37 + 5) % TINY_VOCAB;
    struct lt_lora *l1, *l2;
    lt_lora_new(
        m,
        &(struct lt_lora_params){
            .rank = 4, .alpha = 8, .seed = 1, .targets = "attn_q,attn_v,attn_output,ffn_down"},
        &l1);
    lt_lora_new(
        m,
        &(struct lt_lora_params){
            .rank = 2, .alpha = 2, .seed = 2, .targets = "attn_q,ffn_gate", .top_layers = 1},
        &l2);
    randomise_b(l1, 21, 0.3f);
    randomise_b(l2, 22, 0.3f);
    static float base[T * TINY_VOCAB], with[T * TINY_VOCAB], merged[T * TINY_VOCAB];
    CHECK(logits_of(m, NULL, tokens, T, base) == LT_OK, "%s", lt_last_error());

    /* one adapter at 0.7 */
    struct lt_lora *ls[2] = {l1, l2};
    float scales[2] = {0.7f, -1.5f};
    struct lt_model_lora *list;
    int n;
    struct lt_model_f32_params *f32;
    const struct lt_model_replace *rep;
    int n_rep;
    CHECK(lt_lora_model_list(m, ls, scales, 1, &list, &n) == LT_OK, "%s", lt_last_error());
    struct lt_model_adapters ad = {.lora = list, .n_lora = n};
    CHECK(logits_of(m, &ad, tokens, T, with) == LT_OK, "%s", lt_last_error());
    free(list);
    CHECK(lt_model_f32_params_new(m, is_2d_target, NULL, &f32) == LT_OK, "%s", lt_last_error());
    rep = lt_model_f32_params_list(f32, &n_rep);
    merge(l1, 0.7f, rep, n_rep);
    struct lt_model_adapters mad = {.replace = rep, .n_replace = n_rep};
    CHECK(logits_of(m, &mad, tokens, T, merged) == LT_OK, "%s", lt_last_error());
    lt_model_f32_params_free(f32);
    double e1 = check_nmse(with, merged, T * TINY_VOCAB),
           d1 = check_nmse(with, base, T * TINY_VOCAB);
    printf("%s base: one adapter vs merged nmse %.3g (vs base %.3g)\n", lt_type_name(wtype), e1,
           d1);
    CHECK(e1 < 1e-9 && d1 > 1e-4, "one adapter = merged weights (nmse %g), and not the base (%g)",
          e1, d1);

    /* two adapters, the second at a negative scale, one of them on the same weights */
    CHECK(lt_lora_model_list(m, ls, scales, 2, &list, &n) == LT_OK, "%s", lt_last_error());
    ad = (struct lt_model_adapters){.lora = list, .n_lora = n};
    CHECK(logits_of(m, &ad, tokens, T, with) == LT_OK, "%s", lt_last_error());
    free(list);
    CHECK(lt_model_f32_params_new(m, is_2d_target, NULL, &f32) == LT_OK, "%s", lt_last_error());
    rep = lt_model_f32_params_list(f32, &n_rep);
    merge(l1, 0.7f, rep, n_rep);
    merge(l2, -1.5f, rep, n_rep);
    mad = (struct lt_model_adapters){.replace = rep, .n_replace = n_rep};
    CHECK(logits_of(m, &mad, tokens, T, merged) == LT_OK, "%s", lt_last_error());
    lt_model_f32_params_free(f32);
    double e2 = check_nmse(with, merged, T * TINY_VOCAB);
    CHECK(e2 < 1e-9, "two adapters = both merged (nmse %g)", e2);

    /* scale 0: the base model */
    scales[0] = scales[1] = 0;
    CHECK(lt_lora_model_list(m, ls, scales, 2, &list, &n) == LT_OK, "%s", lt_last_error());
    ad = (struct lt_model_adapters){.lora = list, .n_lora = n};
    CHECK(logits_of(m, &ad, tokens, T, with) == LT_OK, "%s", lt_last_error());
    free(list);
    CHECK(check_nmse(with, base, T * TINY_VOCAB) < 1e-12, "scale 0 is the base");
    lt_lora_free(l1);
    lt_lora_free(l2);
    lt_model_free(m);
    remove(path);
}

/* ---- modes for the Python cross-check ---- */

static void print_adapter(const struct lt_lora *l)
{
    printf("{\"arch\": \"%s\", \"alpha\": %.9g, \"pairs\": [", l->arch, l->alpha);
    for (int i = 0; i < l->n_pairs; i++) {
        const struct lt_lora_pair *p = &l->pairs[i];
        double sa = 0, sb = 0;
        for (int64_t k = 0; k < lt_nelements(p->a); k++)
            sa += ((float *)p->a->data)[k] * (double)(k % 13 + 1);
        for (int64_t k = 0; k < lt_nelements(p->b); k++)
            sb += ((float *)p->b->data)[k] * (double)(k % 13 + 1);
        printf("%s{\"weight\": \"%s\", \"a\": [%lld, %lld], \"b\": [%lld, %lld], \"a_sum\": %.9g, "
               "\"b_sum\": %.9g}",
               i ? ", " : "", p->weight, (long long)p->a->ne[0], (long long)p->a->ne[1],
               (long long)p->b->ne[0], (long long)p->b->ne[1], sa, sb);
    }
    printf("]}\n");
}

static int mode_write(const char *dir)
{
    char mp[600], ap[600];
    snprintf(mp, sizeof(mp), "%s/model.gguf", dir);
    snprintf(ap, sizeof(ap), "%s/adapter.gguf", dir);
    struct tiny_spec sp = {32, 4, 2, 48, 2, LT_TYPE_F32, 7};
    struct lt_model *m;
    struct lt_lora *l;
    if (tiny_model_write(mp, &sp) || lt_model_load(mp, NULL, &m) ||
        lt_lora_new(m,
                    &(struct lt_lora_params){
                        .rank = 4, .alpha = 8, .seed = 5, .targets = "attn_q,attn_v,ffn_down"},
                    &l)) {
        fprintf(stderr, "%s\n", lt_last_error());
        return 1;
    }
    randomise_b(l, 3, 0.2f);
    if (lt_lora_save(l, ap)) {
        fprintf(stderr, "%s\n", lt_last_error());
        return 1;
    }
    print_adapter(l);
    lt_lora_free(l);
    lt_model_free(m);
    return 0;
}

static int mode_read(const char *model, const char *adapter)
{
    struct lt_model *m;
    struct lt_lora *l;
    if (lt_model_load(model, NULL, &m) || lt_lora_load(adapter, &l)) {
        fprintf(stderr, "%s\n", lt_last_error());
        return 1;
    }
    int rc = 0;
    if (lt_lora_check(l, m)) {
        fprintf(stderr, "%s\n", lt_last_error());
        rc = 1;
    } else {
        print_adapter(l);
    }
    lt_lora_free(l);
    lt_model_free(m);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write"))
        return mode_write(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "--read"))
        return mode_read(argv[2], argv[3]);
    const char *dir = getenv("LATHE_BUILD_DIR");
    if (!dir || !*dir)
        dir = "/tmp";
    char path[600];
    snprintf(path, sizeof(path), "%s/test_lora.gguf", dir);
    struct tiny_spec sp = {32, 4, 2, 48, 3, LT_TYPE_F32, 3};
    struct lt_model *m = NULL;
    CHECK(tiny_model_write(path, &sp) == 0, "write");
    CHECK(lt_model_load(path, NULL, &m) == LT_OK, "%s", lt_last_error());
    if (m) {
        test_create(m);
        test_round_trip(m, dir);
        test_bad_files(m, dir);
        lt_model_free(m);
    }
    test_apply(dir, LT_TYPE_F32);
    test_apply(dir, LT_TYPE_Q8_0);
    remove(path);
    return check_summary();
}
