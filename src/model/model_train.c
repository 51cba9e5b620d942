/* model_train.c: the loss graph (the training forward pass) and F32 trainable copies of the
 * weights (full fine-tuning, and the gradients check-ref compares).
 *
 * The loss graph attends within each sequence of the batch only and starts every sequence
 * from zero DeltaNet state, as a fresh forward pass of Hugging Face transformers does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/host_span.h"
#include "model/model_impl.h"

static lt_status build_loss(const struct lt_model *m, struct lt_ctx *ctx, int64_t n_tokens,
                            int64_t n_seqs, const struct lt_model_adapters *adapters, bool packed,
                            struct lt_model_loss_graph *out)
{
    memset(out, 0, sizeof(*out));
    if (n_tokens < 1 || n_seqs < 1)
        return lt_fail(LT_ERR_INVALID, "a loss graph of %lld tokens x %lld sequences",
                       (long long)n_tokens, (long long)n_seqs);
    int64_t N = n_tokens * n_seqs;
    struct lt_tensor *tokens = lt_new_tensor_2d(ctx, LT_TYPE_I32, n_tokens, n_seqs);
    struct lt_tensor *pos = lt_new_tensor_1d(ctx, LT_TYPE_I32, N);
    struct lt_tensor *labels = lt_new_tensor_1d(ctx, LT_TYPE_I32, N);
    if (!tokens || !pos || !labels)
        return lt_fail(LT_ERR_NOMEM, "out of memory building the loss graph");
    lt_set_name(tokens, "inp_tokens");
    lt_set_name(pos, "inp_pos");
    lt_set_name(labels, "labels");
    tokens->flags |= LT_FLAG_INPUT;
    pos->flags |= LT_FLAG_INPUT;
    labels->flags |= LT_FLAG_INPUT;
    struct lt_tensor *kq_mask = NULL, *gate_reset = NULL;
    /* packed: FLASH_ATTN takes the examples' boundaries from pos, the chain a mask */
    const bool attn_pos = packed && adapters && adapters->flash_attn;
    if (packed) {
        kq_mask =
            attn_pos ? NULL : lt_new_tensor_4d(ctx, LT_TYPE_F32, n_tokens, n_tokens, 1, n_seqs);
        gate_reset = m->hp.arch == LT_ARCH_QWEN35
                         ? lt_new_tensor_3d(ctx, LT_TYPE_F32, 1, n_tokens, n_seqs)
                         : NULL;
        if ((!attn_pos && !kq_mask) || (m->hp.arch == LT_ARCH_QWEN35 && !gate_reset))
            return lt_fail(LT_ERR_NOMEM, "out of memory building the loss graph");
        if (kq_mask)
            lt_set_name(kq_mask, "inp_kq_mask")->flags |= LT_FLAG_INPUT;
        if (gate_reset)
            lt_set_name(gate_reset, "inp_gate_reset")->flags |= LT_FLAG_INPUT;
    }
    struct lt_mb b = {.m = m,
                      .ctx = ctx,
                      .ad = adapters,
                      .n_tokens = n_tokens,
                      .n_seqs = n_seqs,
                      .pos = pos,
                      .kq_mask = kq_mask,
                      .attn_pos = attn_pos,
                      .flash = adapters && adapters->flash_attn,
                      .gate_reset = gate_reset,
                      .causal = true};
    const int n_bounds = m->hp.n_layer + 1;
    b.bounds = lt_ctx_alloc(ctx, sizeof(struct lt_tensor *) * (size_t)n_bounds);
    if (!b.bounds)
        return lt_fail(LT_ERR_NOMEM, "out of memory building the loss graph");
    struct lt_tensor *hidden;
    lt_status st = lt_mb_forward(&b, tokens, &hidden);
    if (st != LT_OK)
        return st;
    struct lt_tensor *logits;
    struct lt_tensor *loss = lt_mb_loss(&b, hidden, labels, &logits);
    if ((st = lt_mb_check(loss, "loss", -1)))
        return st;
    if (logits) /* NULL with adapters->fused_loss: no [V, N] logits exist */
        logits->flags |= LT_FLAG_OUTPUT;
    lt_set_name(loss, "loss");
    *out = (struct lt_model_loss_graph){tokens,   pos,      labels,  logits,     loss,
                                        b.bounds, n_bounds, kq_mask, gate_reset, packed};
    return LT_OK;
}

lt_status lt_model_build_loss(const struct lt_model *m, struct lt_ctx *ctx, int64_t n_tokens,
                              int64_t n_seqs, const struct lt_model_adapters *adapters,
                              struct lt_model_loss_graph *out)
{
    return build_loss(m, ctx, n_tokens, n_seqs, adapters, false, out);
}

lt_status lt_model_build_loss_packed(const struct lt_model *m, struct lt_ctx *ctx, int64_t n_tokens,
                                     int64_t n_seqs, const struct lt_model_adapters *adapters,
                                     struct lt_model_loss_graph *out)
{
    return build_loss(m, ctx, n_tokens, n_seqs, adapters, true, out);
}

lt_status lt_model_loss_graph_set_pos(struct lt_model_loss_graph *g)
{
    int64_t T = g->tokens->ne[0], S = g->tokens->ne[1];
    int32_t *p = malloc(sizeof(int32_t) * (size_t)(T * S));
    if (!p)
        return lt_fail(LT_ERR_NOMEM, "out of memory for positions");
    for (int64_t s = 0; s < S; s++)
        for (int64_t t = 0; t < T; t++)
            p[s * T + t] = (int32_t)t;
    lt_status st = lt_tensor_set(g->pos, p, 0, sizeof(int32_t) * (size_t)(T * S));
    free(p);
    return st;
}

lt_status lt_model_loss_graph_set_packed(struct lt_model_loss_graph *g, const int32_t *pos,
                                         float *scratch)
{
    if (!g->packed)
        return lt_fail(LT_ERR_INVALID, "the loss graph was not built packed");
    const int64_t T = g->tokens->ne[0], S = g->tokens->ne[1], n_mask = g->kq_mask ? T * T * S : 0;
    float *mine = scratch ? NULL : malloc(sizeof(float) * (size_t)(n_mask + T * S));
    float *buf = scratch ? scratch : mine;
    float *mask = buf && g->kq_mask ? buf : NULL, *reset = buf ? buf + n_mask : NULL;
    lt_status st = buf ? LT_OK : lt_fail(LT_ERR_NOMEM, "out of memory for a packed step");
    /* query q sees key k <= q (the causal flag drops the rest) of its own example: keys from
     * q - pos[q] on (a row is two fills: 16 x 512 tokens take a few ms) */
    for (int64_t s = 0; st == LT_OK && s < S; s++)
        for (int64_t q = 0; q < T; q++) {
            const int32_t pq = pos[s * T + q];
            if (pq < 0 || pq > q || (q > 0 && pq != 0 && pq != pos[s * T + q - 1] + 1)) {
                st = lt_fail(LT_ERR_INVALID,
                             "packed positions: row %lld step %lld holds %d (each example counts "
                             "0, 1, 2, ... from its first step)",
                             (long long)s, (long long)q, pq);
                break;
            }
            if (mask) {
                float *row = mask + (s * T + q) * T;
                for (int64_t k = 0; k < q - pq; k++)
                    row[k] = -INFINITY;
                memset(row + (q - pq), 0, sizeof(float) * (size_t)(T - (q - pq)));
            }
            reset[s * T + q] = pq == 0 && q > 0 ? LT_MB_GATE_RESET : 0.0f;
        }
    if (st == LT_OK)
        st = lt_tensor_set(g->pos, pos, 0, sizeof(int32_t) * (size_t)(T * S));
    if (st == LT_OK && mask)
        st = lt_tensor_set(g->kq_mask, mask, 0, sizeof(float) * (size_t)(T * T * S));
    if (st == LT_OK && g->gate_reset)
        st = lt_tensor_set(g->gate_reset, reset, 0, sizeof(float) * (size_t)(T * S));
    free(mine);
    return st;
}

/* ---- F32 trainable copies ----
 *
 * Reserved first, like a training job's adapter (lora.c): the copies of a 0.8B model are
 * 3.2 GB, which a job refused for memory must neither take nor spend time converting. */

struct lt_model_f32_params {
    struct lt_ctx *ctx;  /* headers only */
    struct lt_span span; /* the copies' data */
    bool copied;         /* the weights have been read into it */
    struct lt_model_replace *list;
    int n;
};

/* Dense floats of weight w, wherever it lives. */
static lt_status read_weight_f32(const struct lt_tensor *w, float *dst)
{
    if (!w->buffer || w->buffer->backend->is_host) {
        lt_tensor_read_f32(w, dst);
        return LT_OK;
    }
    size_t n = lt_nbytes(w);
    void *raw = malloc(n);
    if (!raw)
        return lt_fail(LT_ERR_NOMEM, "out of host memory reading '%s'", w->name);
    lt_status st = lt_tensor_get(w, raw, 0, n);
    if (st == LT_OK)
        lt_type_traits(w->type)->to_float(raw, dst, lt_nelements(w));
    free(raw);
    return st;
}

#define F32_ALIGN 64 /* bytes; each copy starts aligned in the span */

lt_status lt_model_f32_params_reserve(const struct lt_model *m,
                                      bool (*filter)(void *user, const struct lt_tensor *w),
                                      void *user, struct lt_model_f32_params **out)
{
    *out = NULL;
    struct lt_model_f32_params *p = calloc(1, sizeof(*p));
    lt_status st = LT_OK;
    if (!p)
        return lt_fail(LT_ERR_NOMEM, "out of memory for trainable weights");
    size_t bytes = 0;
    for (int i = 0; i < m->n_weights; i++)
        if (!filter || filter(user, m->weights[i]))
            bytes += (size_t)lt_nelements(m->weights[i]) * sizeof(float) + F32_ALIGN;
    p->ctx = lt_ctx_init((struct lt_ctx_params){
        .mem_size = (size_t)m->n_weights * (sizeof(struct lt_tensor) + 128) + 4096,
        .no_alloc = true});
    p->list = calloc((size_t)m->n_weights + 1, sizeof(*p->list));
    if (!p->ctx || !p->list) {
        st = lt_fail(LT_ERR_NOMEM, "out of memory for trainable weights");
        goto out_free;
    }
    if ((st = lt_span_reserve(&p->span, bytes, "trainable weights")) != LT_OK)
        goto out_free;
    size_t at = 0;
    for (int i = 0; i < m->n_weights; i++) {
        struct lt_tensor *w = m->weights[i];
        if (filter && !filter(user, w))
            continue;
        struct lt_tensor *c = lt_new_tensor(p->ctx, LT_TYPE_F32, LT_MAX_DIMS, w->ne);
        if (!c) {
            st = lt_fail(LT_ERR_NOMEM, "out of memory copying '%s'", w->name);
            goto out_free;
        }
        c->data = (char *)p->span.base + at;
        at += (lt_nbytes(c) + F32_ALIGN - 1) / F32_ALIGN * F32_ALIGN;
        lt_set_name(c, w->name);
        c->flags |= LT_FLAG_PARAM;
        p->list[p->n++] = (struct lt_model_replace){w, c};
    }
    *out = p;
    return LT_OK;
out_free:
    lt_model_f32_params_free(p);
    return st;
}

lt_status lt_model_f32_params_commit(struct lt_model_f32_params *p)
{
    if (p->copied)
        return LT_OK;
    lt_status st = lt_span_commit(&p->span, "trainable weights");
    for (int i = 0; i < p->n && st == LT_OK; i++)
        st = read_weight_f32(p->list[i].w, p->list[i].with->data);
    p->copied = st == LT_OK;
    return st;
}

lt_status lt_model_f32_params_new(const struct lt_model *m,
                                  bool (*filter)(void *user, const struct lt_tensor *w), void *user,
                                  struct lt_model_f32_params **out)
{
    lt_status st = lt_model_f32_params_reserve(m, filter, user, out);
    if (st == LT_OK && (st = lt_model_f32_params_commit(*out)) != LT_OK) {
        lt_model_f32_params_free(*out);
        *out = NULL;
    }
    return st;
}

void lt_model_f32_params_free(struct lt_model_f32_params *p)
{
    if (!p)
        return;
    lt_span_free(&p->span);
    lt_ctx_free(p->ctx);
    free(p->list);
    free(p);
}

const struct lt_model_replace *lt_model_f32_params_list(const struct lt_model_f32_params *p, int *n)
{
    *n = p->n;
    return p->list;
}
