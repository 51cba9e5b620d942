/* tiny_model.h: a two-layer attention + SwiGLU language model built from lathe's ops, for
 * tests of autodiff, admission and CPU training. Weights are F32 leaves in their own data
 * context, flagged PARAM; the loss graph is built in a caller's no_alloc context. */
#ifndef LATHE_TESTS_TINY_MODEL_H
#define LATHE_TESTS_TINY_MODEL_H

#include <math.h>
#include <stdint.h>

#include "lathe/ops.h"

#define TINY_MAX_LAYERS 4

struct tiny_layer {
    struct lt_tensor *attn_norm; /* [n_embd] */
    struct lt_tensor *wq, *wk, *wv, *wo; /* [n_embd, n_embd] */
    struct lt_tensor *ffn_norm;  /* [n_embd] */
    struct lt_tensor *w_gate, *w_up; /* [n_embd, n_ff] */
    struct lt_tensor *w_down;    /* [n_ff, n_embd] */
};

struct tiny_model {
    int n_vocab, n_embd, n_head, n_ff, n_layer;
    struct lt_ctx *wctx;
    struct lt_tensor *tok_embd; /* [n_embd, n_vocab] */
    struct tiny_layer layers[TINY_MAX_LAYERS];
    struct lt_tensor *out_norm; /* [n_embd] */
    struct lt_tensor *output;   /* [n_embd, n_vocab] */
};

static uint64_t tiny_rng_state;
static float tiny_rand(void)
{
    tiny_rng_state = tiny_rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((tiny_rng_state >> 40) / 16777216.0) * 2.0f - 1.0f;
}

static struct lt_tensor *tiny_weight(struct tiny_model *m, const char *name, int layer, int64_t ne0,
                                     int64_t ne1, float scale, float offset)
{
    struct lt_tensor *t = lt_new_tensor_2d(m->wctx, LT_TYPE_F32, ne0, ne1);
    for (int64_t i = 0; i < ne0 * ne1; i++)
        ((float *)t->data)[i] = offset + scale * tiny_rand();
    if (layer >= 0)
        lt_format_name(t, "blk.%d.%s", layer, name);
    else
        lt_set_name(t, name);
    t->flags |= LT_FLAG_PARAM;
    return t;
}

static void tiny_model_init(struct tiny_model *m, int n_vocab, int n_embd, int n_head, int n_ff,
                            int n_layer, uint64_t seed)
{
    *m = (struct tiny_model){n_vocab, n_embd, n_head, n_ff, n_layer, NULL, NULL, {{0}}, NULL, NULL};
    tiny_rng_state = seed;
    m->wctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 8 << 20});
    float s = 1.0f / sqrtf((float)n_embd);
    m->tok_embd = tiny_weight(m, "token_embd", -1, n_embd, n_vocab, 1.0f, 0);
    for (int l = 0; l < n_layer; l++) {
        struct tiny_layer *L = &m->layers[l];
        L->attn_norm = tiny_weight(m, "attn_norm", l, n_embd, 1, 0.1f, 1.0f);
        L->wq = tiny_weight(m, "attn_q", l, n_embd, n_embd, s, 0);
        L->wk = tiny_weight(m, "attn_k", l, n_embd, n_embd, s, 0);
        L->wv = tiny_weight(m, "attn_v", l, n_embd, n_embd, s, 0);
        L->wo = tiny_weight(m, "attn_output", l, n_embd, n_embd, s, 0);
        L->ffn_norm = tiny_weight(m, "ffn_norm", l, n_embd, 1, 0.1f, 1.0f);
        L->w_gate = tiny_weight(m, "ffn_gate", l, n_embd, n_ff, s, 0);
        L->w_up = tiny_weight(m, "ffn_up", l, n_embd, n_ff, s, 0);
        L->w_down = tiny_weight(m, "ffn_down", l, n_ff, n_embd, 1.0f / sqrtf((float)n_ff), 0);
    }
    m->out_norm = tiny_weight(m, "output_norm", -1, n_embd, 1, 0.1f, 1.0f);
    m->output = tiny_weight(m, "output", -1, n_embd, n_vocab, s, 0);
}

static void tiny_model_free(struct tiny_model *m) { lt_ctx_free(m->wctx); }

/* Mean next-token loss of tokens [T] against labels [T] (label < 0: masked). pos [T] holds
 * positions 0..T-1. */
static struct lt_tensor *tiny_model_loss(struct tiny_model *m, struct lt_ctx *ctx,
                                         struct lt_tensor *tokens, struct lt_tensor *pos,
                                         struct lt_tensor *labels)
{
    const int64_t T = tokens->ne[0], E = m->n_embd, H = m->n_head, D = E / H;
    struct lt_tensor *x = lt_get_rows(ctx, m->tok_embd, tokens);
    lt_set_name(x, "inp_embd");
    for (int l = 0; l < m->n_layer; l++) {
        struct tiny_layer *L = &m->layers[l];
        struct lt_tensor *h = lt_mul(ctx, lt_rms_norm(ctx, x, 1e-6f), L->attn_norm);
        struct lt_tensor *q = lt_reshape_3d(ctx, lt_mul_mat(ctx, L->wq, h), D, H, T);
        struct lt_tensor *k = lt_reshape_3d(ctx, lt_mul_mat(ctx, L->wk, h), D, H, T);
        struct lt_tensor *v = lt_reshape_3d(ctx, lt_mul_mat(ctx, L->wv, h), D, H, T);
        q = lt_rope(ctx, q, pos, (int)D, LT_ROPE_NEOX, 10000.0f);
        k = lt_rope(ctx, k, pos, (int)D, LT_ROPE_NEOX, 10000.0f);
        lt_format_name(q, "Qcur-%d", l);
        lt_format_name(k, "Kcur-%d", l);
        struct lt_tensor *qp = lt_permute(ctx, q, 0, 2, 1, 3); /* [D, T, H] */
        struct lt_tensor *kp = lt_permute(ctx, k, 0, 2, 1, 3);
        struct lt_tensor *kq = lt_mul_mat(ctx, kp, qp);         /* [T_k, T_q, H] */
        struct lt_tensor *p = lt_soft_max(ctx, kq, NULL, 1.0f / sqrtf((float)D), true);
        struct lt_tensor *vt = lt_cont(ctx, lt_permute(ctx, v, 1, 2, 0, 3)); /* [T, D, H] */
        struct lt_tensor *o = lt_mul_mat(ctx, vt, p);                       /* [D, T_q, H] */
        o = lt_cont(ctx, lt_permute(ctx, o, 0, 2, 1, 3));                   /* [D, H, T] */
        o = lt_mul_mat(ctx, L->wo, lt_reshape_2d(ctx, o, E, T));
        x = lt_add(ctx, x, o);
        struct lt_tensor *h2 = lt_mul(ctx, lt_rms_norm(ctx, x, 1e-6f), L->ffn_norm);
        struct lt_tensor *f = lt_swiglu(ctx, lt_mul_mat(ctx, L->w_gate, h2),
                                        lt_mul_mat(ctx, L->w_up, h2));
        x = lt_add(ctx, x, lt_mul_mat(ctx, L->w_down, f));
        lt_format_name(x, "l_out-%d", l);
    }
    struct lt_tensor *h = lt_mul(ctx, lt_rms_norm(ctx, x, 1e-6f), m->out_norm);
    struct lt_tensor *logits = lt_mul_mat(ctx, m->output, h);
    lt_set_name(logits, "logits");
    struct lt_tensor *loss = lt_cross_entropy(ctx, logits, labels);
    lt_set_name(loss, "loss");
    return loss;
}

#endif
