/* grad.c: the gradient accumulation the backward rules call (grad.h). */
#include <string.h>

#include "lathe/ops.h"
#include "ops/grad.h"

struct lt_ctx *lt_ad_ctx(struct lt_autodiff *ad) { return ad->ctx; }

bool lt_ad_wants(struct lt_autodiff *ad, const struct lt_tensor *src)
{
    return src && lt_ptrmap_get(&ad->wants, src, 0) == 1;
}

struct lt_tensor *lt_ad_contiguous(struct lt_autodiff *ad, struct lt_tensor *t)
{
    if (!t || lt_is_contiguous(t))
        return t;
    struct lt_tensor *c = lt_cont(ad->ctx, t);
    if (c)
        lt_format_name(c, "%s (cont)", t->name);
    return c;
}

static bool reads_tensor(const struct lt_tensor *reader, const struct lt_tensor *t)
{
    bool reads = false;
    for (int s = 0; s < LT_MAX_SRC; s++)
        reads |= reader->src[s] == t;
    return reads;
}

enum lt_type lt_ad_grad_type(struct lt_autodiff *ad, const struct lt_tensor *t,
                             const struct lt_tensor *reader)
{
    /* a reshape of a contiguous tensor, read by `reader` alone: RESHAPE's rule hands its
     * gradient on reshaped, so it takes whatever type its source's gradient may have (a
     * Qwen3.5 q, k or v product reshaped to [C, T, S] for CONV_SILU) */
    if (t && t->op == LT_OP_RESHAPE && lt_is_contiguous(t->src[0]) && !t->grad &&
        lt_ptrmap_get(&ad->readers, t, 0) == 1 && reads_tensor(reader, t))
        return lt_ad_grad_type(ad, t->src[0], t);
    const struct lt_tensor *a = t ? t->src[0] : NULL, *b = t ? t->src[1] : NULL;
    const bool half =
        a && b && (a->type == LT_TYPE_BF16 || a->type == LT_TYPE_F16) && b->type == a->type;
    const bool acc = half && t->op == LT_OP_MUL_MAT_ACC;
    if (!half || (t->op != LT_OP_MUL_MAT && !acc) || t->grad ||
        lt_ptrmap_get(&ad->readers, t, 0) != 1)
        return LT_TYPE_F32;
    if (!reads_tensor(reader, t))
        return LT_TYPE_F32;
    /* MUL_MAT_ACC's rule hands its gradient whole to the addend c (a LoRA target's adapter
     * product): c must take it in that type too */
    if (acc && lt_ad_wants(ad, t->src[2]) && lt_ad_grad_type(ad, t->src[2], t) != a->type)
        return LT_TYPE_F32;
    return a->type;
}

struct lt_tensor *lt_ad_rounded(struct lt_autodiff *ad, struct lt_tensor *t, enum lt_type type)
{
    for (int i = 0; i < LT_AD_ROUNDED; i++)
        if (ad->rounded[i].from == t && ad->rounded[i].to->type == type)
            return ad->rounded[i].to;
    struct lt_tensor *r = lt_cont_as(ad->ctx, t, type);
    if (!r)
        return NULL;
    lt_format_name(r, "%s (%s)", t->name, lt_type_name(type));
    ad->rounded[ad->n_rounded % LT_AD_ROUNDED].from = t;
    ad->rounded[ad->n_rounded % LT_AD_ROUNDED].to = r;
    ad->n_rounded++;
    return r;
}

lt_status lt_ad_add(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *grad)
{
    if (!grad)
        return lt_fail(LT_ERR_INVALID, "cannot build the gradient for '%s': %s", src->name,
                       lt_last_error());
    if (!lt_same_shape(src, grad))
        return lt_fail(LT_ERR_INVALID,
                       "gradient for '%s' has shape [%lld %lld %lld %lld], not the tensor's "
                       "[%lld %lld %lld %lld]",
                       src->name, (long long)grad->ne[0], (long long)grad->ne[1],
                       (long long)grad->ne[2], (long long)grad->ne[3], (long long)src->ne[0],
                       (long long)src->ne[1], (long long)src->ne[2], (long long)src->ne[3]);
    grad = lt_ad_contiguous(ad, grad);
    if (!grad)
        return lt_fail(LT_ERR_NOMEM, "cannot copy the gradient for '%s'", src->name);
    struct lt_tensor *sum = src->grad ? lt_add(ad->ctx, src->grad, grad) : grad;
    if (!sum)
        return lt_fail(LT_ERR_INVALID, "cannot accumulate the gradient for '%s': %s", src->name,
                       lt_last_error());
    if (sum == grad && grad->op == LT_OP_NONE) {
        /* never alias a leaf as a gradient: later accumulation would look like a write */
        sum = lt_scale(ad->ctx, grad, 1.0f);
        if (!sum)
            return lt_fail(LT_ERR_NOMEM, "cannot copy the gradient for '%s'", src->name);
    }
    lt_format_name(sum, "grad for %s", src->name);
    src->grad = sum;
    /* a sum or copy made here is src's alone; a contribution handed through whole may be
     * another tensor's gradient too */
    lt_ptrmap_set(&ad->owned, src, sum != grad);
    return LT_OK;
}

bool lt_ad_seeded(struct lt_autodiff *ad, const struct lt_tensor *node)
{
    return node && node == ad->loss && node->grad && node->grad == ad->seed;
}

lt_status lt_ad_fold_loss(struct lt_autodiff *ad, struct lt_tensor *node, struct lt_tensor *value)
{
    if (!value)
        return lt_fail(LT_ERR_INVALID, "cannot fold the loss '%s' into its backward: %s",
                       node->name, lt_last_error());
    const struct lt_tensor *from = lt_storage_root(value);
    bool reads_loss = false;
    for (int k = 0; k < LT_MAX_SRC; k++)
        reads_loss |= from->src[k] == node || value->src[k] == node;
    if (!lt_ad_seeded(ad, node) || node->view_src || value->type != node->type ||
        !lt_same_shape(value, node) || reads_loss)
        return lt_fail(LT_ERR_INVALID,
                       "cannot fold '%s' into its backward: it is not the seeded loss, or '%s' "
                       "is not its type and shape, or reads the loss",
                       node->name, value->name);
    struct lt_tensor *copy = lt_cont(ad->ctx, value);
    if (!copy)
        return lt_fail(LT_ERR_NOMEM, "cannot fold the loss '%s' into its backward: %s", node->name,
                       lt_last_error());
    /* the node itself (the caller's loss, which the job reads) becomes the copy */
    ad->unfolded = *node;
    node->op = copy->op;
    memcpy(node->op_params, copy->op_params, sizeof(node->op_params));
    memcpy(node->src, copy->src, sizeof(node->src));
    ad->folded = true;
    return LT_OK;
}

bool lt_ad_grad_owned(struct lt_autodiff *ad, const struct lt_tensor *src)
{
    return src->grad && lt_ptrmap_get(&ad->owned, src, 0) == 1;
}

void lt_ad_set_owned_grad(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *grad)
{
    src->grad = grad;
    lt_ptrmap_set(&ad->owned, src, 1);
}

lt_status lt_ad_take_grad(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *t,
                          bool owned)
{
    if (!t)
        return lt_fail(LT_ERR_INVALID, "cannot accumulate the gradient for '%s': %s", src->name,
                       lt_last_error());
    lt_format_name(t, "grad for %s", src->name);
    src->grad = t;
    lt_ptrmap_set(&ad->owned, src, owned);
    return LT_OK;
}

lt_status lt_ad_rows_into(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *rows,
                          struct lt_tensor *ids, struct lt_tensor *into)
{
    return lt_ad_take_grad(ad, src, lt_get_rows_back_into(ad->ctx, rows, ids, into), true);
}

lt_status lt_ad_add_owned(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *grad)
{
    struct lt_tensor *had = src->grad;
    const bool fits =
        grad && grad->type == LT_TYPE_F32 && lt_is_contiguous(grad) && lt_same_shape(grad, src);
    if (fits && had && lt_ad_grad_owned(ad, src) && had->op == LT_OP_GET_ROWS_BACK && !had->src[2])
        return lt_ad_rows_into(ad, src, had->src[0], had->src[1], grad);
    lt_status st = lt_ad_add(ad, src, grad);
    if (st == LT_OK && !had && fits && src->grad == grad)
        lt_ad_set_owned_grad(ad, src, grad);
    return st;
}
