/* lora.c: LoRA adapters: creation (Kaiming-uniform A, zero B), GGUF read/write in
 * llama.cpp's adapter layout, and the pair list a model graph reads.
 *
 * Invariant: every pair's a and b are F32, contiguous, with host data in the adapter's one
 * span (headers in its no_alloc context), and a->ne[1] == b->ne[0] (the rank). Files of
 * other tensor types are converted on load, so the rest of lathe only ever sees this one
 * form.
 *
 * A training job makes its adapter with lt_lora_reserve: the span is address space only
 * until admission has accepted the job, and lt_lora_commit then commits it and draws A. A
 * rank-4096 adapter of a 0.8B Qwen3.5 is 5 GB of F32 that took 18-23 s to fill; a job
 * refused for memory must pay neither. B needs no writing: a committed span reads as zero. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/host_span.h"
#include "lathe/gguf.h"
#include "lathe/lora.h"
#include "lathe/rng.h"

static const char *const known_targets[] = {
    "attn_q", "attn_k",   "attn_v",   "attn_output", "ffn_gate",
    "ffn_up", "ffn_down", "attn_qkv", "attn_gate",   "ssm_out",
};

bool lt_lora_target_known(const char *module)
{
    for (size_t i = 0; i < sizeof(known_targets) / sizeof(known_targets[0]); i++)
        if (!strcmp(module, known_targets[i]))
            return true;
    return false;
}

const char *lt_lora_default_targets(enum lt_arch arch)
{
    if (arch == LT_ARCH_QWEN35)
        return "attn_q,attn_k,attn_v,attn_output,attn_qkv,attn_gate,ssm_out";
    return "attn_q,attn_k,attn_v,attn_output";
}

lt_status lt_lora_parse_targets(const char *list, char names[][LT_LORA_TARGET_NAME], int *n)
{
    *n = 0;
    const char *p = list ? list : "";
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\t')
            p++;
        const char *s = p;
        while (*p && *p != ',' && *p != ' ' && *p != '\t')
            p++;
        size_t len = (size_t)(p - s);
        if (len == 0)
            continue;
        if (len >= LT_LORA_TARGET_NAME)
            return lt_fail(LT_ERR_INVALID, "target '%.*s...' is not a module name", 24, s);
        char name[LT_LORA_TARGET_NAME];
        memcpy(name, s, len);
        name[len] = 0;
        if (!lt_lora_target_known(name))
            return lt_fail(LT_ERR_INVALID,
                           "unknown target '%s' (known: attn_q, attn_k, attn_v, attn_output, "
                           "ffn_gate, ffn_up, ffn_down, attn_qkv, attn_gate, ssm_out)",
                           name);
        bool dup = false;
        for (int i = 0; i < *n; i++)
            dup = dup || !strcmp(names[i], name);
        if (dup)
            continue;
        if (*n == LT_LORA_MAX_TARGETS)
            return lt_fail(LT_ERR_INVALID, "more than %d targets", LT_LORA_MAX_TARGETS);
        memcpy(names[(*n)++], name, len + 1);
    }
    return LT_OK;
}

/* ---- the container ---- */

#define LORA_ALIGN 64 /* bytes; each tensor's data starts aligned in the span */

static size_t lora_align(size_t n)
{
    return (n + LORA_ALIGN - 1) / LORA_ALIGN * LORA_ALIGN;
}

/* An empty adapter for n_pairs pairs whose data (data_bytes, alignment included) is
 * reserved, not committed. */
static lt_status lora_alloc(int n_pairs, size_t data_bytes, struct lt_lora **out)
{
    struct lt_lora *l = calloc(1, sizeof(*l));
    if (!l)
        return lt_fail(LT_ERR_NOMEM, "out of memory for an adapter");
    l->pairs = calloc((size_t)(n_pairs > 0 ? n_pairs : 1), sizeof(*l->pairs));
    l->span = calloc(1, sizeof(*l->span));
    /* headers only, two per pair (~512 bytes each) */
    l->ctx = lt_ctx_init(
        (struct lt_ctx_params){.mem_size = (size_t)n_pairs * 2048 + 4096, .no_alloc = true});
    if (!l->pairs || !l->span || !l->ctx) {
        lt_lora_free(l);
        return lt_fail(LT_ERR_NOMEM, "out of memory for an adapter of %d pairs", n_pairs);
    }
    lt_status st = lt_span_reserve(l->span, data_bytes, "adapter");
    if (st != LT_OK) {
        lt_lora_free(l);
        return st;
    }
    *out = l;
    return LT_OK;
}

void lt_lora_free(struct lt_lora *l)
{
    if (!l)
        return;
    if (l->span)
        lt_span_free(l->span);
    free(l->span);
    lt_ctx_free(l->ctx);
    free(l->pairs);
    free(l);
}

/* Adds pair l->n_pairs for `weight` with a [n_in, rank], b [rank, n_out], their data at
 * *at in the span (advanced past them). */
static lt_status add_pair(struct lt_lora *l, const char *weight, int layer, int64_t n_in,
                          int64_t rank, int64_t n_out, size_t *at)
{
    if (strlen(weight) + strlen(".lora_a") >= LT_MAX_NAME)
        return lt_fail(LT_ERR_INVALID, "weight name '%s' is too long for an adapter tensor name",
                       weight);
    struct lt_lora_pair *p = &l->pairs[l->n_pairs];
    snprintf(p->weight, sizeof(p->weight), "%s", weight);
    p->layer = layer;
    p->a = lt_new_tensor_2d(l->ctx, LT_TYPE_F32, n_in, rank);
    p->b = lt_new_tensor_2d(l->ctx, LT_TYPE_F32, rank, n_out);
    if (!p->a || !p->b)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the adapter of '%s'", weight);
    struct lt_tensor *t[2] = {p->a, p->b};
    for (int k = 0; k < 2; k++) {
        size_t n = lora_align(lt_nbytes(t[k]));
        assert(*at + n <= l->span->size); /* lora_alloc was given these sizes */
        t[k]->data = (char *)l->span->base + *at;
        *at += n;
    }
    lt_format_name(p->a, "%s.lora_a", weight);
    lt_format_name(p->b, "%s.lora_b", weight);
    l->n_pairs++;
    return LT_OK;
}

int lt_lora_rank(const struct lt_lora *l, int i)
{
    return (int)l->pairs[i].a->ne[1];
}

float lt_lora_scale(const struct lt_lora *l, int i, float user_scale)
{
    if (l->alpha == 0)
        return user_scale;
    return user_scale * l->alpha / (float)lt_lora_rank(l, i);
}

void lt_lora_set_trainable(struct lt_lora *l, bool trainable)
{
    for (int i = 0; i < l->n_pairs; i++) {
        struct lt_tensor *t[2] = {l->pairs[i].a, l->pairs[i].b};
        for (int k = 0; k < 2; k++) {
            if (trainable)
                t[k]->flags |= LT_FLAG_PARAM;
            else
                t[k]->flags &= ~(uint32_t)LT_FLAG_PARAM;
        }
    }
}

/* ---- creation ---- */

/* The 2-D matmul weight "blk.<il>.<module>.weight" of m, or NULL. */
static struct lt_tensor *find_target(const struct lt_model *m, int il, const char *module)
{
    char name[LT_MAX_NAME + 64];
    snprintf(name, sizeof(name), "blk.%d.%.32s.weight", il, module);
    struct lt_tensor *w = lt_model_find_weight(m, name);
    if (!w || w->ne[2] != 1 || w->ne[3] != 1)
        return NULL;
    return w;
}

lt_status lt_lora_reserve(const struct lt_model *m, const struct lt_lora_params *p,
                          struct lt_lora **out)
{
    *out = NULL;
    const struct lt_model_hparams *hp = lt_model_hparams(m);
    if (p->rank < 1)
        return lt_fail(LT_ERR_INVALID, "rank must be at least 1, not %d", p->rank);
    if (!(p->alpha > 0) || !isfinite(p->alpha))
        return lt_fail(LT_ERR_INVALID, "alpha must be a positive number, not %g", p->alpha);
    if (p->top_layers < 0 || p->top_layers > hp->n_layer)
        return lt_fail(LT_ERR_INVALID, "top_layers %d is outside 0..%lld (the model's blocks)",
                       p->top_layers, (long long)hp->n_layer);
    char targets[LT_LORA_MAX_TARGETS][LT_LORA_TARGET_NAME];
    int n_targets;
    const char *list = p->targets && *p->targets ? p->targets : lt_lora_default_targets(hp->arch);
    lt_status st = lt_lora_parse_targets(list, targets, &n_targets);
    if (st != LT_OK)
        return st;
    if (n_targets == 0)
        return lt_fail(LT_ERR_INVALID, "no LoRA targets given");

    /* A target the model has in no layer is a mistake (a typo, another architecture's
     * module) unless it came from the default list; one it has only outside the adapted top
     * layers is skipped (qwen35 has attn_q in its attention layers alone). */
    bool explicit_targets = p->targets && *p->targets;
    int first = p->top_layers > 0 ? (int)hp->n_layer - p->top_layers : 0;
    int n_pairs = 0, anywhere[LT_LORA_MAX_TARGETS] = {0};
    size_t bytes = 0;
    for (int il = 0; il < hp->n_layer; il++)
        for (int t = 0; t < n_targets; t++) {
            struct lt_tensor *w = find_target(m, il, targets[t]);
            if (!w)
                continue;
            anywhere[t]++;
            if (il < first)
                continue;
            n_pairs++;
            bytes += (size_t)(w->ne[0] + w->ne[1]) * (size_t)p->rank * sizeof(float) + 256;
        }
    for (int t = 0; t < n_targets && explicit_targets; t++)
        if (!anywhere[t])
            return lt_fail(LT_ERR_INVALID, "target '%s' matches no weight of this %s model",
                           targets[t], lt_arch_name(hp->arch));
    if (n_pairs == 0)
        return lt_fail(LT_ERR_INVALID,
                       "no target weight (%s) in the top %d layers of this %s model", list,
                       p->top_layers, lt_arch_name(hp->arch));

    struct lt_lora *l;
    st = lora_alloc(n_pairs, bytes, &l);
    if (st != LT_OK)
        return st;
    snprintf(l->arch, sizeof(l->arch), "%s", lt_arch_name(hp->arch));
    l->alpha = p->alpha;
    l->seed = p->seed;
    l->draw_a = true;
    size_t at = 0;
    for (int il = first; il < hp->n_layer; il++)
        for (int t = 0; t < n_targets; t++) {
            struct lt_tensor *w = find_target(m, il, targets[t]);
            if (!w)
                continue;
            st = add_pair(l, w->name, il, w->ne[0], p->rank, w->ne[1], &at);
            if (st != LT_OK)
                goto out_free;
        }
    lt_lora_set_trainable(l, true);
    *out = l;
    return LT_OK;
out_free:
    lt_lora_free(l);
    return st;
}

/* A is drawn pair by pair in the order the pairs were made, one stream from the seed: the
 * values lt_lora_new gave before adapters could be reserved. */
lt_status lt_lora_commit(struct lt_lora *l)
{
    lt_status st = lt_span_commit(l->span, "adapter");
    if (st != LT_OK || !l->draw_a)
        return st;
    struct lt_rng rng;
    lt_rng_seed(&rng, l->seed);
    for (int i = 0; i < l->n_pairs; i++) {
        struct lt_tensor *a = l->pairs[i].a;
        float bound = 1.0f / sqrtf((float)a->ne[0]);
        float *ad = a->data;
        for (int64_t k = 0; k < lt_nelements(a); k++)
            ad[k] = (float)(2.0 * lt_rng_uniform(&rng) - 1.0) * bound;
    }
    l->draw_a = false;
    return LT_OK;
}

bool lt_lora_committed(const struct lt_lora *l)
{
    return l->span->committed;
}

lt_status lt_lora_new(const struct lt_model *m, const struct lt_lora_params *p,
                      struct lt_lora **out)
{
    lt_status st = lt_lora_reserve(m, p, out);
    if (st == LT_OK && (st = lt_lora_commit(*out)) != LT_OK) {
        lt_lora_free(*out);
        *out = NULL;
    }
    return st;
}

/* ---- checking against a model ---- */

lt_status lt_lora_check(const struct lt_lora *l, const struct lt_model *m)
{
    const char *arch = lt_arch_name(lt_model_hparams(m)->arch);
    if (strcmp(l->arch, arch))
        return lt_fail(LT_ERR_INVALID, "the adapter is for a %s model, not %s", l->arch, arch);
    for (int i = 0; i < l->n_pairs; i++) {
        const struct lt_lora_pair *p = &l->pairs[i];
        const struct lt_tensor *w = lt_model_find_weight(m, p->weight);
        if (!w)
            return lt_fail(LT_ERR_INVALID, "the adapter adapts '%s', which the model lacks",
                           p->weight);
        if (w->ne[2] != 1 || w->ne[3] != 1 || w->ne[0] != p->a->ne[0] || w->ne[1] != p->b->ne[1])
            return lt_fail(LT_ERR_INVALID,
                           "the adapter of '%s' is [%lld x %lld], the weight [%lld x %lld]",
                           p->weight, (long long)p->a->ne[0], (long long)p->b->ne[1],
                           (long long)w->ne[0], (long long)w->ne[1]);
    }
    return LT_OK;
}

lt_status lt_lora_model_list(const struct lt_model *m, struct lt_lora *const *loras,
                             const float *scales, int n, struct lt_model_lora **list, int *n_list)
{
    *list = NULL;
    *n_list = 0;
    int total = 0;
    for (int i = 0; i < n; i++) {
        lt_status st = lt_lora_check(loras[i], m);
        if (st != LT_OK)
            return st;
        total += loras[i]->n_pairs;
    }
    if (total == 0)
        return LT_OK;
    struct lt_model_lora *out = calloc((size_t)total, sizeof(*out));
    if (!out)
        return lt_fail(LT_ERR_NOMEM, "out of memory for %d adapter pairs", total);
    int k = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < loras[i]->n_pairs; j++) {
            const struct lt_lora_pair *p = &loras[i]->pairs[j];
            out[k++] = (struct lt_model_lora){
                .w = lt_model_find_weight(m, p->weight),
                .a = p->a,
                .b = p->b,
                .scale = lt_lora_scale(loras[i], j, scales ? scales[i] : 1.0f),
            };
        }
    *list = out;
    *n_list = k;
    return LT_OK;
}

/* ---- files ---- */

static lt_status fill_from_tensor(void *user, void *dst, size_t nbytes)
{
    return lt_tensor_get(user, dst, 0, nbytes);
}

lt_status lt_lora_save(const struct lt_lora *l, const char *path)
{
    if (!lt_lora_committed(l))
        return lt_fail(LT_ERR_INVALID, "%s: the adapter was only reserved (lt_lora_commit first)",
                       path);
    struct lt_gguf_writer *w = lt_gguf_writer_new();
    if (!w)
        return LT_ERR_NOMEM;
    lt_status st = lt_gguf_writer_set_str(w, "general.architecture", l->arch);
    if (st == LT_OK)
        st = lt_gguf_writer_set_str(w, "general.type", "adapter");
    if (st == LT_OK)
        st = lt_gguf_writer_set_str(w, "adapter.type", "lora");
    if (st == LT_OK)
        st = lt_gguf_writer_set_f32(w, "adapter.lora.alpha", l->alpha);
    for (int i = 0; i < l->n_pairs && st == LT_OK; i++) {
        struct lt_tensor *t[2] = {l->pairs[i].a, l->pairs[i].b};
        for (int k = 0; k < 2 && st == LT_OK; k++)
            st = lt_gguf_writer_add_tensor_fill(w, t[k]->name, LT_TYPE_F32, 2, t[k]->ne,
                                                lt_nbytes(t[k]), fill_from_tensor, t[k]);
    }
    if (st == LT_OK)
        st = lt_gguf_writer_write(w, path);
    lt_gguf_writer_free(w);
    return st;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Converts a file tensor (any readable type, 2-D) into the F32 tensor dst of its shape. */
static lt_status read_tensor(const char *path, const struct lt_gguf_tensor_info *ti,
                             struct lt_tensor *dst)
{
    const struct lt_type_traits *tr = lt_type_traits(ti->type);
    if (!tr || !tr->to_float)
        return lt_fail(LT_ERR_FORMAT, "%s: tensor '%s' has type %s, which lathe cannot read", path,
                       ti->name, lt_type_name(ti->type));
    size_t row = lt_row_size(ti->type, ti->ne[0]);
    for (int64_t r = 0; r < ti->ne[1]; r++)
        tr->to_float((const char *)ti->data + (size_t)r * row, (float *)dst->data + r * ti->ne[0],
                     ti->ne[0]);
    return LT_OK;
}

static lt_status check_str(const struct lt_gguf *g, const char *path, const char *key,
                           const char *want)
{
    const char *v;
    if (lt_gguf_find_key(g, key) < 0)
        return lt_fail(LT_ERR_FORMAT, "%s: not a LoRA adapter (no %s)", path, key);
    lt_status st = lt_gguf_get_str(g, key, &v);
    if (st != LT_OK)
        return st;
    if (strcmp(v, want))
        return lt_fail(LT_ERR_FORMAT, "%s: %s is '%s', not '%s'", path, key, v, want);
    return LT_OK;
}

lt_status lt_lora_load(const char *path, struct lt_lora **out)
{
    *out = NULL;
    struct lt_gguf *g;
    lt_status st = lt_gguf_open(path, &g);
    if (st != LT_OK)
        return st;
    st = check_str(g, path, "general.type", "adapter");
    if (st == LT_OK)
        st = check_str(g, path, "adapter.type", "lora");
    const char *arch = NULL;
    if (st == LT_OK)
        st = lt_gguf_get_str(g, "general.architecture", &arch);
    float alpha = 0;
    if (st == LT_OK && lt_gguf_find_key(g, "adapter.lora.alpha") >= 0)
        st = lt_gguf_get_f32(g, "adapter.lora.alpha", &alpha);
    if (st != LT_OK)
        goto out_close;

    /* pair up the tensors: every lora_a needs its lora_b and the other way round */
    int64_t nt = lt_gguf_n_tensors(g);
    int n_pairs = 0;
    size_t bytes = 0;
    for (int64_t i = 0; i < nt; i++) {
        const struct lt_gguf_tensor_info *ti = lt_gguf_tensor(g, i);
        bool is_a = ends_with(ti->name, ".lora_a"), is_b = ends_with(ti->name, ".lora_b");
        if (!is_a && !is_b) {
            st = lt_fail(LT_ERR_FORMAT, "%s: tensor '%s' is neither a lora_a nor a lora_b", path,
                         ti->name);
            goto out_close;
        }
        if (ti->n_dims > 2 || ti->ne[2] != 1 || ti->ne[3] != 1) {
            st = lt_fail(LT_ERR_FORMAT, "%s: tensor '%s' is not 2-D", path, ti->name);
            goto out_close;
        }
        char partner[LT_MAX_NAME];
        snprintf(partner, sizeof(partner), "%s", ti->name);
        partner[strlen(partner) - 1] = is_a ? 'b' : 'a';
        int64_t j = lt_gguf_find_tensor(g, partner);
        if (j < 0) {
            st = lt_fail(LT_ERR_FORMAT, "%s: tensor '%s' has no partner '%s'", path, ti->name,
                         partner);
            goto out_close;
        }
        if (is_a) {
            const struct lt_gguf_tensor_info *tb = lt_gguf_tensor(g, j);
            if (ti->ne[1] != tb->ne[0] || ti->ne[1] < 1) {
                st = lt_fail(LT_ERR_FORMAT,
                             "%s: '%s' has rank %lld but '%s' has rank %lld (lora_a must be "
                             "[n_in, rank], lora_b [rank, n_out])",
                             path, ti->name, (long long)ti->ne[1], tb->name, (long long)tb->ne[0]);
                goto out_close;
            }
            n_pairs++;
            bytes += (size_t)(ti->ne[0] * ti->ne[1] + tb->ne[0] * tb->ne[1]) * sizeof(float) + 256;
        }
    }
    struct lt_lora *l;
    st = lora_alloc(n_pairs, bytes, &l);
    if (st != LT_OK)
        goto out_close;
    if ((st = lt_span_commit(l->span, path)) != LT_OK) {
        lt_lora_free(l);
        goto out_close;
    }
    snprintf(l->arch, sizeof(l->arch), "%s", arch);
    l->alpha = alpha;
    size_t at = 0;
    for (int64_t i = 0; i < nt && st == LT_OK; i++) {
        const struct lt_gguf_tensor_info *ta = lt_gguf_tensor(g, i);
        if (!ends_with(ta->name, ".lora_a"))
            continue;
        char weight[LT_MAX_NAME], bname[LT_MAX_NAME + 8];
        size_t wl = strlen(ta->name) - strlen(".lora_a");
        snprintf(weight, sizeof(weight), "%.*s", (int)wl, ta->name);
        snprintf(bname, sizeof(bname), "%s.lora_b", weight);
        const struct lt_gguf_tensor_info *tb = lt_gguf_tensor(g, lt_gguf_find_tensor(g, bname));
        int layer = -1;
        if (sscanf(weight, "blk.%d.", &layer) != 1)
            layer = -1;
        st = add_pair(l, weight, layer, ta->ne[0], ta->ne[1], tb->ne[1], &at);
        if (st == LT_OK)
            st = read_tensor(path, ta, l->pairs[l->n_pairs - 1].a);
        if (st == LT_OK)
            st = read_tensor(path, tb, l->pairs[l->n_pairs - 1].b);
    }
    if (st != LT_OK) {
        lt_lora_free(l);
        goto out_close;
    }
    *out = l;
out_close:
    lt_gguf_close(g);
    return st;
}
