/* model_graph.c: the forward pass of llama, qwen2 and qwen35 as a graph of lathe ops.
 *
 * One builder serves training, prefill and decode. Activations are [n_embd, n_tokens *
 * n_seqs] (sequence-major: token t of sequence s is column s * n_tokens + t); positions are
 * one per column, so a decode batch (n_tokens 1, n_seqs B) ropes each sequence at its own
 * position. Where state crosses calls (KV cache, DeltaNet conv and recurrent state) the
 * builder asks the hooks; without hooks it attends over the batch itself and starts from
 * zero state (training).
 *
 * Slices of fused projections stay views (q and gate out of Qwen3.5's attn_q, q/k/v out of
 * the DeltaNet conv output): that is the graph training has to differentiate.
 *
 * With b->fused (inference): RMS_NORM carries its weight (one node for norm and scale); a
 * layer's projections of one input are one product when the loader stacked their weights
 * (lt_mb_mm_group, model_products.c); a Gated DeltaNet layer's decode step is one GDN_DECODE node
 * (delta_step); an attention layer's decode step reads the cache in one ATTN_DECODE node; the
 * residual sum and the next norm are one ADD_RMS_NORM node (add_norm).
 *
 * Activations are F32, except with b->half_acts (inference, chosen by the session): then
 * the ops whose results only F16 / BF16 weights multiply write them in that type (act_type):
 * the attention and FFN norms, the SwiGLU product, Qwen3.5's gated attention output and
 * gated DeltaNet norm. llama's and qwen2's merged attention output (a CONT) and the final
 * norm (the head often reads one column of it) stay F32.
 *
 * Training on a device (adapters->bf16_products) rounds instead the operands of every
 * product by an F32 weight to BF16 just before it (lt_cont_as), so the products and their
 * gradients run on BF16 matrix units; the activations themselves stay F32. The delta rule's
 * products then run at LT_DELTA_NET_PREC_BF16: BF16 operands where its kernels have a BF16
 * form, else one TF32 product instead of three. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

lt_status lt_mb_check(struct lt_tensor *t, const char *what, int il)
{
    if (t)
        return LT_OK;
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", lt_last_error());
    if (il >= 0)
        return lt_fail(LT_ERR_INVALID, "building %s-%d: %s", what, il, msg);
    return lt_fail(LT_ERR_INVALID, "building %s: %s", what, msg);
}

/* Names t "<name>-<il>" (or "<name>" for il < 0) and passes it on. */
static struct lt_tensor *named(struct lt_tensor *t, const char *name, int il)
{
    if (!t)
        return NULL;
    if (il >= 0)
        return lt_format_name(t, "%s-%d", name, il);
    return lt_set_name(t, name);
}

/* t [a * c, n] (contiguous, or a view of a joint product's rows) as [a, c, n] */
static struct lt_tensor *as_3d(struct lt_ctx *ctx, struct lt_tensor *t, int64_t a, int64_t c,
                               int64_t n)
{
    if (!t || lt_is_contiguous(t))
        return lt_reshape_3d(ctx, t, a, c, n);
    return lt_view_3d(ctx, t, a, c, n, (size_t)a * t->nb[0], t->nb[1], 0);
}

/* t [a, nt * ns] (contiguous, or a view of a joint product's rows) as [a, nt, ns] */
static struct lt_tensor *cols_3d(struct lt_ctx *ctx, struct lt_tensor *t, int64_t a, int64_t nt,
                                 int64_t ns)
{
    if (!t || lt_is_contiguous(t))
        return lt_reshape_3d(ctx, t, a, nt, ns);
    return lt_view_3d(ctx, t, a, nt, ns, t->nb[1], t->nb[1] * (size_t)nt, 0);
}

/* t [a * c, nt * ns] (as as_3d's) as [a, c, nt, ns] */
static struct lt_tensor *as_4d(struct lt_ctx *ctx, struct lt_tensor *t, int64_t a, int64_t c,
                               int64_t nt, int64_t ns)
{
    if (!t || lt_is_contiguous(t))
        return lt_reshape_4d(ctx, t, a, c, nt, ns);
    return lt_view_4d(ctx, t, a, c, nt, ns, (size_t)a * t->nb[0], t->nb[1],
                      t->nb[1] * (size_t)nt, 0);
}

/* The type to store an activation in when the products that read it are by the weights
 * ws[0..n) alone: their type when b->half_acts and they are all F16, or all BF16, as the
 * graph reads them (W), with no LoRA adapter on them (its A is F32 and reads the same
 * activation); F32 otherwise. */
static enum lt_type act_type(struct lt_mb *b, int n, struct lt_tensor *const *ws)
{
    if (b->ad && b->ad->bf16_products && n >= 1 && ws[0]) {
        /* a device's training step: when every reader rounds x to BF16 (an F32 weight's
         * product, a BF16 one's: bf16_x; a LoRA adapter reads the base product's x), the op
         * producing x writes it in BF16 and no CONT rounds it; a quantised reader keeps F32 */
        for (int i = 0; i < n; i++) {
            const struct lt_tensor *wr = ws[i] ? lt_mb_w(b, ws[i]) : NULL;
            if (!wr || !(lt_mb_bf16_product(b, wr) || wr->type == LT_TYPE_BF16))
                return LT_TYPE_F32;
        }
        return LT_TYPE_BF16;
    }
    if (!b->half_acts || n < 1 || !ws[0])
        return LT_TYPE_F32;
    enum lt_type t = lt_mb_w(b, ws[0])->type;
    if (t != LT_TYPE_F16 && t != LT_TYPE_BF16)
        return LT_TYPE_F32;
    for (int i = 0; i < n; i++) {
        if (!ws[i] || lt_mb_w(b, ws[i])->type != t)
            return LT_TYPE_F32;
        for (int j = 0; b->ad && j < b->ad->n_lora; j++)
            if (b->ad->lora[j].w == ws[i])
                return LT_TYPE_F32;
    }
    return t;
}

/* Whether a layer's recurrence or attention (DELTA_NET, FLASH_ATTN) may take BF16 operands
 * where the graph's products round their activations anyway: a device's training step
 * (bf16_products), or a prefill with half activations whose layer output weight `wo` is
 * not F32 (BF16, F16 or quantised: those products round the activations to BF16 or F16).
 * A prefill of F32 weights (check-ref's, the CPU oracle's) keeps F32. */
static bool half_mixer(struct lt_mb *b, struct lt_tensor *wo)
{
    return (b->ad && b->ad->bf16_products) ||
           (b->half_acts && wo && lt_mb_w(b, wo)->type != LT_TYPE_F32);
}

/* whether a graph takes the fused forms that have backward rules where the chain they
 * replace is the F32 path's: a device's training step (BF16 products; RMS_NORM with its
 * weight and gate, one RMS_NORM_MUL_BACK a norm) */
static bool train_fused(const struct lt_mb *b)
{
    return b->ad && b->ad->bf16_products && !b->ad->chain_norms;
}

/* whether wr (a norm's weight as the graph reads it) is one a fused RMS_NORM takes for rows
 * of n: contiguous F32 [n] */
static bool norm_weight_fits(const struct lt_tensor *wr, int64_t n)
{
    return wr && wr->type == LT_TYPE_F32 && lt_is_contiguous(wr) && lt_nelements(wr) == n &&
           wr->ne[0] == n;
}

/* rms_norm(x) * w, stored as type */
static struct lt_tensor *norm(struct lt_mb *b, struct lt_tensor *x, struct lt_tensor *w,
                              enum lt_type type)
{
    struct lt_tensor *wr = lt_mb_w(b, w);
    if ((b->fused || train_fused(b)) && x && norm_weight_fits(wr, x->ne[0]))
        return lt_rms_norm_mul(b->ctx, x, wr, b->m->hp.rms_eps, type);
    struct lt_tensor *n = lt_rms_norm(b->ctx, x, b->m->hp.rms_eps);
    return lt_mul_as(b->ctx, n, lt_mb_w(b, w), type);
}

static struct lt_tensor *add_bias(struct lt_mb *b, struct lt_tensor *x, struct lt_tensor *bias)
{
    return bias && x ? lt_add(b->ctx, x, lt_mb_w(b, bias)) : x;
}

/* t rounded to BF16 when the step's products are (bf16_products), else t */
static struct lt_tensor *bf16_operand(struct lt_mb *b, struct lt_tensor *t)
{
    return t && b->ad && b->ad->bf16_products ? lt_cont_as(b->ctx, t, LT_TYPE_BF16) : t;
}

/* Scaled dot-product attention. q [D, H, n_tokens * n_seqs] (roped), k and v
 * [D, H_kv, n_kv, n_seqs] (any strides). Result [D * H, n_tokens * n_seqs]. With
 * b->flash (a training graph's ad->flash_attn, or a session's prefill), one FLASH_ATTN node.
 * Otherwise the chain; with
 * bf16_products, q, k, v and the probabilities meet the two products (and their gradients'
 * four) as BF16, so all six run on BF16 matrix units; the scores, the softmax and the
 * gradients stay F32. */
static struct lt_tensor *attention(struct lt_mb *b, int il, struct lt_tensor *q,
                                   struct lt_tensor *k, struct lt_tensor *v)
{
    struct lt_ctx *ctx = b->ctx;
    const struct lt_model_hparams *hp = &b->m->hp;
    int64_t D = hp->head_dim, H = hp->n_head, T = b->n_tokens, S = b->n_seqs;
    struct lt_tensor *q4 = lt_reshape_4d(ctx, q, D, H, T, S);
    if (b->flash) {
        /* one node; its products' operands round to BF16 where the step's others do */
        struct lt_tensor *o = named(lt_flash_attn(ctx, q4, k, v, b->attn_pos ? b->pos : b->kq_mask,
                                                  1.0f / sqrtf((float)D), b->causal),
                                    "flash_attn", il); /* [D, H, T, S] */
        lt_flash_attn_set_prec(o, half_mixer(b, b->m->layers[il].wo) ? LT_FLASH_ATTN_PREC_BF16
                                                                     : LT_FLASH_ATTN_PREC_F32);
        return o ? lt_reshape_2d(ctx, o, D * H, T * S) : NULL;
    }
    struct lt_tensor *qp = lt_permute(ctx, q4, 0, 2, 1, 3); /* [D, T, H, S] */
    struct lt_tensor *kp = lt_permute(ctx, k, 0, 2, 1, 3);              /* [D, n_kv, H_kv, S] */
    struct lt_tensor *kq =
        named(lt_mul_mat(ctx, bf16_operand(b, kp), bf16_operand(b, qp)), "kq", il);
    struct lt_tensor *p = named(lt_soft_max(ctx, kq, b->kq_mask, 1.0f / sqrtf((float)D), b->causal),
                                "kq_soft_max", il); /* [n_kv, T, H, S] */
    struct lt_tensor *vt = lt_permute(ctx, v, 1, 2, 0, 3); /* [n_kv, D, H_kv, S] */
    /* [D, T, H, S] */
    struct lt_tensor *kqv =
        named(lt_mul_mat(ctx, bf16_operand(b, vt), bf16_operand(b, p)), "kqv", il);
    struct lt_tensor *o = lt_permute(ctx, kqv, 0, 2, 1, 3); /* [D, H, T, S] */
    o = named(lt_cont(ctx, o), "kqv_merged", il);
    return lt_reshape_2d(ctx, o, D * H, T * S);
}

/* Attention layer: llama, qwen2 (biases) and qwen35 (q/k norms, output gate, partial rope).
 * x [n_embd, N] (normed). */
static lt_status build_attn_layer(struct lt_mb *b, int il, struct lt_tensor *x,
                                  struct lt_tensor **out)
{
    struct lt_ctx *ctx = b->ctx;
    const struct lt_model_hparams *hp = &b->m->hp;
    const struct lt_model_layer *ly = &b->m->layers[il];
    int64_t D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    int64_t N = b->n_tokens * b->n_seqs;
    lt_status st;
    struct lt_tensor *q, *gate = NULL, *proj[3];
    struct lt_tensor *const ws[3] = {ly->wq, ly->wk, ly->wv};
    if ((st = lt_mb_mm_group(b, ly->wqkv, ws, 3, x, proj)))
        return st;
    /* a decode step of Qwen3.5: each head's norm and rotation as one RMS_NORM_ROPE node */
    const bool nr = hp->arch == LT_ARCH_QWEN35 && b->fused && b->n_tokens == 1 &&
                    norm_weight_fits(lt_mb_w(b, ly->q_norm), D) &&
                    norm_weight_fits(lt_mb_w(b, ly->k_norm), D);
    if (hp->arch == LT_ARCH_QWEN35) {
        /* attn_q gives, per head, head_dim of query then head_dim of gate */
        struct lt_tensor *qg = named(proj[0], "Qcur_full", il);
        size_t es = sizeof(float);
        q = named(lt_view_3d(ctx, qg, D, H, N, 2 * D * es, qg->nb[1], 0), "Qcur_view", il);
        gate = named(lt_view_3d(ctx, qg, D, H, N, 2 * D * es, qg->nb[1], D * es), "gate", il);
        if (!nr)
            q = named(norm(b, q, ly->q_norm, LT_TYPE_F32), "Qcur_normed", il);
    } else {
        q = as_3d(ctx, add_bias(b, proj[0], ly->bq), D, H, N);
    }
    struct lt_tensor *k = as_3d(ctx, add_bias(b, proj[1], ly->bk), D, Hkv, N);
    struct lt_tensor *v = add_bias(b, proj[2], ly->bv);
    v = as_3d(ctx, v, D, Hkv, N);
    if (k && hp->arch == LT_ARCH_QWEN35 && !nr)
        k = named(norm(b, k, ly->k_norm, LT_TYPE_F32), "Kcur_normed", il);
    if ((st = lt_mb_check(q, "Qcur", il)) || (st = lt_mb_check(k, "Kcur", il)) ||
        (st = lt_mb_check(v, "Vcur", il)))
        return st;
    if (nr) {
        q = named(lt_rms_norm_rope(ctx, q, lt_mb_w(b, ly->q_norm), hp->rms_eps, b->pos,
                                   (int)hp->n_rot, hp->rope_mode, hp->rope_base),
                  "Qcur", il);
        k = named(lt_rms_norm_rope(ctx, k, lt_mb_w(b, ly->k_norm), hp->rms_eps, b->pos,
                                   (int)hp->n_rot, hp->rope_mode, hp->rope_base),
                  "Kcur", il);
    } else {
        q = named(lt_rope(ctx, q, b->pos, (int)hp->n_rot, hp->rope_mode, hp->rope_base), "Qcur",
                  il);
        k = named(lt_rope(ctx, k, b->pos, (int)hp->n_rot, hp->rope_mode, hp->rope_base), "Kcur",
                  il);
    }
    named(v, "Vcur", il);
    if ((st = lt_mb_check(q, "Qcur", il)) || (st = lt_mb_check(k, "Kcur", il)))
        return st;
    struct lt_tensor *k4 = lt_reshape_4d(ctx, k, D, Hkv, b->n_tokens, b->n_seqs);
    struct lt_tensor *v4 =
        lt_is_contiguous(v) ? lt_reshape_4d(ctx, v, D, Hkv, b->n_tokens, b->n_seqs)
                            : lt_view_4d(ctx, v, D, Hkv, b->n_tokens, b->n_seqs, v->nb[1], v->nb[2],
                                         v->nb[2] * (size_t)b->n_tokens, 0);
    if ((st = lt_mb_check(k4 && v4 ? k4 : NULL, "Kcur", il)))
        return st;
    struct lt_mb_layer_state ls = {.k = k4, .v = v4};
    if (b->hooks && b->hooks->attn_kv && (st = b->hooks->attn_kv(b, il, k4, v4, &ls)))
        return st;
    if (b->fused && b->n_tokens == 1 && ls.k_cache && ls.v_cache && ls.seq_ids) {
        /* a kept decode step: attention read from the cache, gate included, in one node
         * (which also stores this token's K and V when the hook left them to it) */
        struct lt_tensor *o =
            named(lt_attn_decode(ctx, q, ls.k_cache, ls.v_cache, ls.seq_ids, b->pos, gate,
                                 1.0f / sqrtf((float)D), ls.kv_to_attn ? k4 : NULL,
                                 ls.kv_to_attn ? v4 : NULL),
                  "attn_decode", il);
        o = named(lt_mb_mm(b, ly->wo, o), "attn_out", il);
        *out = o;
        return lt_mb_check(o, "attn_out", il);
    }
    if (ls.kv_to_attn)
        return lt_fail(LT_ERR_INVALID,
                       "layer %d: the keys and values were left to an "
                       "ATTN_DECODE node this graph does not build",
                       il);
    struct lt_tensor *o = attention(b, il, q, ls.k, ls.v);
    if (o && gate) { /* o * sigmoid(gate), one node (the value of SIGMOID then MUL) */
        struct lt_tensor *g =
            lt_glu_as(ctx, gate, as_3d(ctx, o, D, H, N), LT_GLU_SIGMOID, act_type(b, 1, &ly->wo));
        o = named(g ? lt_reshape_2d(ctx, g, D * H, N) : NULL, "attn_gated", il);
    }
    o = named(lt_mb_mm(b, ly->wo, o), "attn_out", il);
    *out = o;
    return lt_mb_check(o, "attn_out", il);
}

/* A Gated DeltaNet layer's decode step (one token a sequence, with carried states) as one
 * GDN_DECODE node: conv, norms, gates, recurrence and gated norm between the projections
 * proj (qkv, z, beta, alpha) and the output product. */
static lt_status delta_step(struct lt_mb *b, int il, struct lt_tensor *const *proj,
                            const struct lt_mb_layer_state *ls, struct lt_tensor **out)
{
    struct lt_ctx *ctx = b->ctx;
    const struct lt_model_layer *ly = &b->m->layers[il];
    lt_status st;
    /* a kept decode step reads both caches at the sequences' slots and updates them in
     * place; otherwise the gathered states come in and the new ones go out */
    const bool in_place = ls->conv_cache && ls->ssm_cache && ls->seq_ids;
    struct lt_tensor *r = named(
        lt_gdn_decode(ctx, proj[0], proj[1], proj[2], proj[3], in_place ? ls->conv_cache : ls->conv,
                      in_place ? ls->ssm_cache : ls->ssm, lt_mb_w(b, ly->ssm_conv1d),
                      lt_mb_w(b, ly->ssm_dt), lt_mb_w(b, ly->ssm_a), lt_mb_w(b, ly->ssm_norm),
                      b->m->hp.ssm_n_k_heads, b->m->hp.rms_eps, in_place ? ls->seq_ids : NULL),
        "gdn_decode", il);
    if ((st = lt_mb_check(r, "gdn_decode", il)))
        return st;
    struct lt_tensor *conv_new =
        in_place ? NULL : named(lt_gdn_decode_conv(ctx, r), "conv_state_new", il);
    struct lt_tensor *ssm_new = in_place ? NULL : named(lt_gdn_decode_state(ctx, r), "state_new", il);
    if ((!in_place && (st = lt_mb_check(conv_new, "conv_state_new", il))) ||
        (!in_place && (st = lt_mb_check(ssm_new, "state_new", il))) ||
        (b->hooks->recr_store && (st = b->hooks->recr_store(b, il, conv_new, ssm_new))))
        return st;
    struct lt_tensor *on = named(lt_gdn_decode_output(ctx, r), "attn_out_norm", il);
    struct lt_tensor *y = named(lt_mb_mm(b, ly->ssm_out, on), "linear_attn_out", il);
    *out = y;
    return lt_mb_check(y, "linear_attn_out", il);
}

/* Gated DeltaNet layer (qwen35). x [n_embd, N] (normed). */
static lt_status build_delta_layer(struct lt_mb *b, int il, struct lt_tensor *x,
                                   struct lt_tensor **out)
{
    struct lt_ctx *ctx = b->ctx;
    const struct lt_model_hparams *hp = &b->m->hp;
    const struct lt_model_layer *ly = &b->m->layers[il];
    int64_t T = b->n_tokens, S = b->n_seqs, Sk = hp->ssm_d_state, Hk = hp->ssm_n_k_heads;
    int64_t Hv = hp->ssm_n_v_heads, Sv = hp->ssm_d_inner / Hv, K = hp->ssm_d_conv;
    int64_t key_dim = Sk * Hk, value_dim = hp->ssm_d_inner, C = 2 * key_dim + value_dim;
    size_t es = sizeof(float);
    lt_status st;

    struct lt_mb_layer_state ls = {0};
    if (b->hooks && b->hooks->recr_load && (st = b->hooks->recr_load(b, il, &ls)))
        return st;

    /* A device's training step with no state to read or keep takes q, k and v as three
     * products by their rows of the QKV weight, each conv'd on its own: contiguous
     * activations, and gradients that need no [C, N] zero and three ACCs into it, nor
     * copies of the q and k slices for their norms (~15 ms of a 16 x 512 full fine-tune's
     * 506 over two steps on an H100) */
    const bool keeps_state = b->hooks && b->hooks->recr_store;
    const bool split = train_fused(b) && !ls.conv && !keeps_state;
    /* the output's gated RMSNorm is one node (which also reads a BF16 gate) */
    const bool gated_norm_fused =
        (train_fused(b) || b->fused) && norm_weight_fits(lt_mb_w(b, ly->ssm_norm), Sv);
    struct lt_tensor *proj[4] = {NULL};
    struct lt_tensor *const ws[4] = {ly->ssm_qkv, ly->ssm_z, ly->ssm_beta, ly->ssm_alpha};
    if (split) {
        lt_mb_lora_share_ax(b, x, ws, 4); /* the q, k and v products by ssm_qkv's rows come later */
        /* z stores BF16 where the gated norm (one node, which reads a BF16 gate) is its only
         * reader: half the bytes written, read by the norm and kept for its backward */
        if (gated_norm_fused)
            b->product_type = lt_mb_half_out(b, "LATHE_HALF_Z");
        proj[1] = lt_mb_mm(b, ws[1], x);
        b->product_type = LT_TYPE_F32;
        st = proj[1] ? lt_mb_mm_group(b, NULL, ws + 2, 2, x, proj + 2) : lt_mb_check(NULL, "z", il);
    } else {
        st = lt_mb_mm_group(b, ly->ssm_in, ws, 4, x, proj);
    }
    if (st)
        return st;
    struct lt_tensor *qkv = split ? NULL : named(proj[0], "linear_attn_qkv_mixed", il); /* [C, N] */
    struct lt_tensor *z = named(proj[1], "z", il);                       /* [value_dim, N] */
    struct lt_tensor *beta = named(proj[2], "beta", il);                 /* [Hv, N] */
    struct lt_tensor *alpha = named(proj[3], "alpha", il);               /* [Hv, N] */
    if ((!split && (st = lt_mb_check(qkv, "linear_attn_qkv_mixed", il))) ||
        (st = lt_mb_check(z, "z", il)) || (st = lt_mb_check(beta, "beta", il)) ||
        (st = lt_mb_check(alpha, "alpha", il)))
        return st;
    if (b->fused && T == 1 && ls.conv && ls.ssm)
        return delta_step(b, il, proj, &ls, out);
    beta = named(lt_sigmoid(ctx, cols_3d(ctx, beta, Hv, T, S)), "beta_sigmoid", il);
    /* g = -exp(A_log) * softplus(alpha + dt_bias); ssm_a holds -exp(A_log) */
    struct lt_tensor *g = lt_add(ctx, cols_3d(ctx, alpha, Hv, T, S), lt_mb_w(b, ly->ssm_dt));
    g = named(lt_softplus(ctx, g), "a_softplus", il);
    g = named(lt_mul(ctx, g, lt_mb_w(b, ly->ssm_a)), "gate", il);
    if (b->gate_reset) /* packed examples: nothing flows in from the example before */
        g = named(lt_add(ctx, g, b->gate_reset), "gate_reset", il);
    if (b->tok_mask) { /* padding: no update, no decay */
        beta = named(lt_mul(ctx, beta, b->tok_mask), "beta_masked", il);
        g = named(lt_mul(ctx, g, b->tok_mask), "gate_masked", il);
    }
    if ((st = lt_mb_check(beta, "beta_sigmoid", il)) || (st = lt_mb_check(g, "gate", il)))
        return st;

    /* causal conv1d over time of the q, k, v channels, after the carried K - 1 inputs, and
     * its silu. A graph with no state to read or keep (a training step) takes the
     * projection as it is (CONV_SILU: zeros before the first step), and so does a session's
     * first prefill of a sequence (ls.conv NULL: zeros carried in), which keeps the last
     * K - 1 inputs; otherwise a session's layer conv's the carried inputs followed by the
     * new ones, time innermost (SSM_CONV), and keeps the last K - 1 of them */
    /* conv_keep: what a session keeps as the next conv state, [K - 1, C, S] */
    struct lt_tensor *sx = NULL, *conv = NULL, *conv_keep = NULL, *q, *k, *v;
    if (split) {
        const int64_t width[3] = {key_dim, key_dim, value_dim};
        const char *names[3] = {"q_conv", "k_conv", "v_conv"};
        struct lt_tensor *part[3];
        int64_t c0 = 0;
        for (int i = 0; i < 3; c0 += width[i++]) {
            /* a device's training step: each stores BF16, which CONV_SILU and its backward
             * read (half the bytes written, read twice and kept for the backward) */
            b->product_type = lt_mb_half_out(b, "LATHE_HALF_QKV");
            struct lt_tensor *y = named(lt_mb_mm_rows(b, ly->ssm_qkv, x, c0, width[i]),
                                        "linear_attn_qkv_mixed", il); /* [width, N] */
            b->product_type = LT_TYPE_F32;
            struct lt_tensor *cw = lt_mb_rows_of(ctx, lt_mb_w(b, ly->ssm_conv1d), c0, width[i]);
            y = y ? lt_reshape_3d(ctx, y, width[i], T, S) : NULL;
            part[i] =
                y && cw ? lt_conv_silu_packed(ctx, y, cw, b->gate_reset ? b->pos : NULL) : NULL;
            if ((st = lt_mb_check(part[i], names[i], il)))
                return st;
        }
        q = named(lt_reshape_4d(ctx, part[0], Sk, Hk, T, S), "q_conv", il);
        k = named(lt_reshape_4d(ctx, part[1], Sk, Hk, T, S), "k_conv", il);
        v = named(lt_reshape_4d(ctx, part[2], Sv, Hv, T, S), "v_conv", il);
    } else if (!ls.conv && !keeps_state) {
        struct lt_tensor *x3 = cols_3d(ctx, qkv, C, T, S); /* [C, T, S] */
        if (x3 && !lt_is_contiguous(x3))                   /* a slice of a fused projection */
            x3 = lt_cont(ctx, x3);
        conv =
            lt_conv_silu_packed(ctx, x3, lt_mb_w(b, ly->ssm_conv1d), b->gate_reset ? b->pos : NULL);
    } else if (!ls.conv && T >= K - 1 && !b->tok_mask) {
        /* a session's first prefill of a sequence (zeros carried in): CONV_SILU, zeros before
         * t = 0, the sums and roundings of the form below (conv_silu.c), and the last K - 1
         * inputs kept as they lie in the projection (H100, 0.8B: CONCAT, SSM_CONV and SILU
         * took ~52 us a layer of a 512-token prefill, the first two reading time innermost) */
        struct lt_tensor *x3 = cols_3d(ctx, qkv, C, T, S); /* [C, T, S], read as it lies */
        conv = lt_conv_silu_packed(ctx, x3, lt_mb_w(b, ly->ssm_conv1d), NULL);
        struct lt_tensor *last = x3 ? lt_view_3d(ctx, x3, C, K - 1, S, x3->nb[1], x3->nb[2],
                                                 (size_t)(T - K + 1) * x3->nb[1])
                                    : NULL;
        conv_keep = named(last ? lt_transpose(ctx, last) : NULL, "conv_state_new", il);
    } else {
        struct lt_tensor *conv_state = ls.conv;
        if (!conv_state) {
            struct lt_tensor *like = lt_new_tensor_3d(ctx, LT_TYPE_F32, K - 1, C, S);
            conv_state = named(lt_fill(ctx, like, 0.0f), "conv_state_zero", il);
        }
        struct lt_tensor *qkv_t = lt_transpose(ctx, cols_3d(ctx, qkv, C, T, S)); /* [T, C, S] */
        sx = named(lt_concat(ctx, conv_state, qkv_t, 0), "conv_input", il);      /* [K-1+T, C, S] */
        if ((st = lt_mb_check(sx, "conv_input", il)))
            return st;
        conv = named(lt_ssm_conv(ctx, sx, lt_mb_w(b, ly->ssm_conv1d)), "conv_output_raw", il);
        conv = lt_silu(ctx, conv);
        /* a padded batch hands over all of sx (each sequence keeps its own steps) */
        conv_keep =
            b->tok_mask
                ? sx
                : named(lt_view_3d(ctx, sx, K - 1, C, S, sx->nb[1], sx->nb[2], (size_t)T * es),
                        "conv_state_new", il);
    }
    if (!split) {
        conv = named(conv, "conv_output_silu", il); /* [C, T, S] */
        if ((st = lt_mb_check(conv, "conv_output_silu", il)))
            return st;
        size_t nb1 = (size_t)C * es, nb2 = nb1 * (size_t)T;
        q = named(lt_view_4d(ctx, conv, Sk, Hk, T, S, Sk * es, nb1, nb2, 0), "q_conv", il);
        k = named(lt_view_4d(ctx, conv, Sk, Hk, T, S, Sk * es, nb1, nb2, key_dim * es), "k_conv",
                  il);
        v = named(lt_view_4d(ctx, conv, Sv, Hv, T, S, Sv * es, nb1, nb2, 2 * key_dim * es),
                  "v_conv", il);
    }
    /* HF/FLA's l2norm: x * rsqrt(sum x^2 + 1e-6); with BF16 products its backward is one
     * L2_NORM_BACK node, with F32 the primitives (the k_conv scenario's graph) */
    struct lt_tensor *(*l2)(struct lt_ctx *, struct lt_tensor *, float) =
        b->ad && b->ad->bf16_products ? lt_l2_norm_fused_back : lt_l2_norm;
    q = named(l2(ctx, q, 1e-6f), "q_conv_norm", il);
    k = named(l2(ctx, k, 1e-6f), "k_conv_norm", il);
    if ((st = lt_mb_check(q, "q_conv", il)) || (st = lt_mb_check(k, "k_conv", il)) ||
        (st = lt_mb_check(v, "v_conv", il)))
        return st;

    struct lt_tensor *state = ls.ssm;
    if (!state) {
        const struct lt_tensor *z0 = b->state_zero;
        if (!z0 || z0->ne[0] != Sv || z0->ne[1] != Sk || z0->ne[2] != Hv || z0->ne[3] != S) {
            struct lt_tensor *like = lt_new_tensor_4d(ctx, LT_TYPE_F32, Sv, Sk, Hv, S);
            b->state_zero = named(lt_fill(ctx, like, 0.0f), "state_zero", il);
        }
        state = b->state_zero;
    }
    struct lt_tensor *r = lt_delta_net(ctx, q, k, v, g, beta, state, 1.0f / sqrtf((float)Sk));
    if (half_mixer(b, ly->ssm_out))
        lt_delta_net_set_prec(r, LT_DELTA_NET_PREC_BF16);
    if ((st = lt_mb_check(named(r, "delta_net", il), "delta_net", il)))
        return st;
    struct lt_tensor *o =
        named(lt_delta_net_output(ctx, r), "attn_output", il); /* [Sv, Hv, T, S] */
    if (keeps_state) {
        struct lt_tensor *ssm_new = named(lt_delta_net_state(ctx, r), "state_new", il);
        if ((st = lt_mb_check(conv_keep, "conv_state_new", il)) ||
            (st = lt_mb_check(ssm_new, "state_new", il)) ||
            (st = b->hooks->recr_store(b, il, conv_keep, ssm_new)))
            return st;
    }
    /* gated RMSNorm: rms_norm(o) * w * silu(z), per value head (one node in a device's
     * training step, and in a session's graph: b->fused) */
    struct lt_tensor *z4 = as_4d(ctx, z, Sv, Hv, T, S);
    struct lt_tensor *on, *nw = lt_mb_w(b, ly->ssm_norm);
    if (gated_norm_fused) {
        on = lt_rms_norm_mul_gated(ctx, o, nw, z4, b->m->hp.rms_eps, act_type(b, 1, &ly->ssm_out));
    } else {
        struct lt_tensor *zs = named(lt_silu(ctx, z4), "z_silu", il);
        on =
            lt_mul_as(ctx, norm(b, o, ly->ssm_norm, LT_TYPE_F32), zs, act_type(b, 1, &ly->ssm_out));
    }
    on = named(on, "attn_out_norm", il);
    on = lt_reshape_2d(ctx, on, value_dim, T * S);
    struct lt_tensor *y = named(lt_mb_mm(b, ly->ssm_out, on), "linear_attn_out", il);
    *out = y;
    return lt_mb_check(y, "linear_attn_out", il);
}

static struct lt_tensor *ffn(struct lt_mb *b, int il, struct lt_tensor *x)
{
    const struct lt_model_layer *ly = &b->m->layers[il];
    struct lt_tensor *proj[2];
    struct lt_tensor *const ws[2] = {ly->ffn_gate, ly->ffn_up};
    if (b->n_tokens == 1 && x && x->type == LT_TYPE_F32 &&
        act_type(b, 1, &ly->ffn_down) == LT_TYPE_F32 &&
        lt_mb_joint_takes(b, ly->ffn_gate_up, ws, 2, x) && ws[0]->ne[1] == ws[1]->ne[1]) {
        /* a decode step: the stacked product and its SwiGLU as one MUL_MAT_GLU node (the
         * joint's rows: the gate's, then the up's) */
        struct lt_tensor *h = named(lt_mb_product(b, ly->ffn_gate_up, x, true), "ffn_swiglu", il);
        return named(lt_mb_mm(b, ly->ffn_down, h), "ffn_out", il);
    }
    /* a device's training step: the gate and up products store BF16, which SWIGLU and its
     * backward read (half the bytes written, read twice and kept for the backward) */
    b->product_type = lt_mb_half_out(b, "LATHE_HALF_FFN");
    const lt_status st = lt_mb_mm_group(b, ly->ffn_gate_up, ws, 2, x, proj);
    b->product_type = LT_TYPE_F32;
    if (st != LT_OK)
        return NULL;
    struct lt_tensor *gate = named(proj[0], "ffn_gate", il);
    struct lt_tensor *up = named(proj[1], "ffn_up", il);
    struct lt_tensor *h =
        named(lt_swiglu_as(b->ctx, gate, up, act_type(b, 1, &ly->ffn_down)), "ffn_swiglu", il);
    return named(lt_mb_mm(b, ly->ffn_down, h), "ffn_out", il);
}

/* The weights of layer il's input projections, the readers of its attention norm (4 or 3) */
static int attn_readers(const struct lt_mb *b, int il, struct lt_tensor *readers[4])
{
    const struct lt_model_layer *ly = &b->m->layers[il];
    if (ly->recurrent) {
        readers[0] = ly->ssm_qkv, readers[1] = ly->ssm_z;
        readers[2] = ly->ssm_beta, readers[3] = ly->ssm_alpha;
        return 4;
    }
    readers[0] = ly->wq, readers[1] = ly->wk, readers[2] = ly->wv;
    return 3;
}

/* The type of layer il's attention norm: what its input projections read */
static enum lt_type attn_norm_type(struct lt_mb *b, int il)
{
    struct lt_tensor *readers[4];
    const int n = attn_readers(b, il, readers);
    return act_type(b, n, readers);
}

/* Whether a, a layer's output or FFN's, is a plain product that MUL_MAT_ADD_RMS_NORM can
 * take over in a one-token step: a 2-d weight (no adapter added to it) by F32 columns.
 * LATHE_FUSE_ADD_NORM=0 keeps the product and ADD_RMS_NORM apart (a before / after switch
 * for the device's measurements). */
static bool product_to_fold(const struct lt_mb *b, const struct lt_tensor *a)
{
    const struct lt_tensor *w = a->src[0], *h = a->src[1];
    const char *env = getenv("LATHE_FUSE_ADD_NORM");
    if (env && strcmp(env, "0") == 0)
        return false;
    return b->n_tokens == 1 && a->op == LT_OP_MUL_MAT && w && h && w->ne[2] == 1 && w->ne[3] == 1 &&
           h->type == LT_TYPE_F32 && h->ne[2] == 1 && h->ne[3] == 1;
}

/* The residual sum x + a (*sum) and its norm by w stored as type (returned): with b->fused
 * when the norm is F32, one ADD_RMS_NORM node, or in a one-token step where a is a plain
 * product one MUL_MAT_ADD_RMS_NORM node in a's place (the product's kernel adds and norms:
 * a decode token's output and down projections); else ADD then norm(). In a one-token step
 * of one sequence where a is a plain product of rows of a norm_product_type and the norm's
 * readers (`readers`, n of them) are such products too, the product is added over x in place
 * (MUL_MAT_ACC) and the norm is an RMS_NORM_MUL node its readers take into themselves
 * (model_products.c's norm_into_product): no block of the product waits for all the others to norm
 * the sum. */
static struct lt_tensor *add_norm(struct lt_mb *b, struct lt_tensor *x, struct lt_tensor *a,
                                  struct lt_tensor *w, enum lt_type type, struct lt_tensor **sum,
                                  int n, struct lt_tensor *const *readers)
{
    struct lt_tensor *wr = lt_mb_w(b, w);
    *sum = NULL;
    if (!x || !a)
        return NULL;
    if (b->fused && type == LT_TYPE_F32 && wr && wr->type == LT_TYPE_F32 && lt_is_contiguous(wr) &&
        lt_nelements(wr) == x->ne[0] && lt_same_shape(x, a) && x->ne[2] == 1 && x->ne[3] == 1) {
        bool defer = n > 0 && product_to_fold(b, a) && lt_mb_norm_product_type(a->src[0]->type) &&
                     !lt_mb_norm_mm_off() && lt_is_contiguous(x) && x->type == LT_TYPE_F32 &&
                     x->ne[1] == 1;
        for (int i = 0; defer && i < n; i++)
            defer = readers[i] && lt_mb_norm_product_type(lt_mb_w(b, readers[i])->type);
        if (defer) {
            *sum = lt_mul_mat_acc(b->ctx, a->src[0], a->src[1], x);
            return *sum ? lt_rms_norm_mul(b->ctx, *sum, wr, b->m->hp.rms_eps, LT_TYPE_F32) : NULL;
        }
        struct lt_tensor *r =
            product_to_fold(b, a)
                ? lt_mul_mat_add_rms_norm(b->ctx, a->src[0], a->src[1], x, wr, b->m->hp.rms_eps)
                : lt_add_rms_norm(b->ctx, x, a, wr, b->m->hp.rms_eps);
        *sum = lt_add_rms_norm_sum(b->ctx, r);
        return lt_add_rms_norm_out(b->ctx, r);
    }
    *sum = lt_add(b->ctx, x, a);
    return norm(b, *sum, w, type);
}

lt_status lt_mb_forward(struct lt_mb *b, struct lt_tensor *tokens, struct lt_tensor **hidden)
{
    struct lt_ctx *ctx = b->ctx;
    const struct lt_model *m = b->m;
    int64_t N = b->n_tokens * b->n_seqs;
    lt_status st;
    struct lt_tensor *ids = lt_reshape_2d(ctx, tokens, N, 1);
    struct lt_tensor *x = named(lt_get_rows(ctx, lt_mb_w(b, m->tok_embd), ids), "inp_embd", -1);
    if ((st = lt_mb_check(x, "inp_embd", -1)))
        return st;
    if (b->bounds)
        b->bounds[0] = x;
    /* h: layer il's normed input; x: the residual stream it adds to */
    struct lt_tensor *h = named(norm(b, x, m->layers[0].attn_norm, attn_norm_type(b, 0)),
                                "attn_norm", 0);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct lt_model_layer *ly = &m->layers[il];
        struct lt_tensor *a, *r;
        if ((st = lt_mb_check(h, "attn_norm", il)))
            return st;
        st = ly->recurrent ? build_delta_layer(b, il, h, &a) : build_attn_layer(b, il, h, &a);
        if (st != LT_OK)
            return st;
        struct lt_tensor *ffn_in[2] = {ly->ffn_gate, ly->ffn_up};
        struct lt_tensor *hn = named(
            add_norm(b, x, a, ly->ffn_norm, act_type(b, 2, ffn_in), &r, 2, ffn_in), "ffn_norm", il);
        named(r, "ffn_inp", il);
        struct lt_tensor *f = ffn(b, il, hn);
        if ((st = lt_mb_check(f, "ffn_out", il)))
            return st;
        struct lt_tensor *next[4];
        if (il + 1 < m->hp.n_layer)
            h = named(add_norm(b, r, f, m->layers[il + 1].attn_norm, attn_norm_type(b, il + 1), &x,
                               attn_readers(b, il + 1, next), next),
                      "attn_norm", il + 1);
        else /* the head's product keeps its norm apart (a product too wide for mmv) */
            h = named(add_norm(b, r, f, m->out_norm, LT_TYPE_F32, &x, 0, NULL), "result_norm", -1);
        named(x, "l_out", il);
        if ((st = lt_mb_check(x, "l_out", il)))
            return st;
        if (b->bounds)
            b->bounds[il + 1] = x;
    }
    *hidden = h;
    return lt_mb_check(h, "result_norm", -1);
}

struct lt_tensor *lt_mb_logits(struct lt_mb *b, struct lt_tensor *hidden)
{
    return named(lt_mb_mm(b, b->m->output, hidden), "result_output", -1);
}

/* The mean loss of hidden [D, N]: LINEAR_CE (the head and the loss in one, no [V, N]
 * logits) when the adapters ask for fused_loss and the head, as the graph reads it, is a
 * contiguous float matrix without LoRA adapters (rounded to BF16 with bf16_products, as
 * lt_mb_mm() would); otherwise the logits (*logits) and CROSS_ENTROPY. */
struct lt_tensor *lt_mb_loss(struct lt_mb *b, struct lt_tensor *hidden, struct lt_tensor *labels,
                             struct lt_tensor **logits)
{
    struct lt_tensor *w = b->m->output, *wr = lt_mb_w(b, w);
    bool fused = b->ad && b->ad->fused_loss && wr && hidden && lt_is_contiguous(wr) &&
                 lt_is_contiguous(hidden) &&
                 (wr->type == LT_TYPE_F32 || wr->type == LT_TYPE_F16 || wr->type == LT_TYPE_BF16);
    for (int i = 0; fused && i < b->ad->n_lora; i++)
        fused = b->ad->lora[i].w != w;
    *logits = NULL;
    if (!fused) {
        *logits = lt_mb_logits(b, hidden);
        return lt_cross_entropy(b->ctx, *logits, labels);
    }
    if (lt_mb_bf16_product(b, wr))
        wr = lt_cont_as(b->ctx, wr, LT_TYPE_BF16);
    struct lt_tensor *h = lt_reshape_2d(b->ctx, hidden, hidden->ne[0], lt_nelements(hidden) / hidden->ne[0]);
    return lt_linear_cross_entropy(b->ctx, wr, h, labels);
}
