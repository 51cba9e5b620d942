/* view.c: leaves and views (NONE, VIEW, RESHAPE, PERMUTE, TRANSPOSE).
 *
 * Views are made in src/core/tensor.c and compute nothing: their data is view_src's data
 * plus view_offs, so they have no CPU kernel (cpu_forward NULL) and every backend runs
 * them by skipping them.
 *
 * Their backward rules send the gradient back to the viewed tensor. A slice (VIEW) of a
 * larger tensor, e.g. q out of a fused QKV, gets its gradient with ACC into a contiguous
 * zero (or the gradient so far) from a contiguous copy of the slice's gradient, so the
 * accumulation runs on whichever backend runs ACC on contiguous data. The zero and the
 * accumulators made from it belong to that gradient alone, so the ACCs after the first
 * write in place (lt_acc_inplace): the three slices of Qwen3.5's conv output each copied
 * the whole [6144, 8192] gradient before (26 ms of a 16 x 512 training step). */
#include "ops/grad.h"
#include "ops/op.h"

static lt_status view_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0];
    if (!lt_ad_wants(ad, a))
        return LT_OK;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    if (!lt_is_contiguous(a))
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "no backward rule for a view of '%s', which is itself %s; cont it first",
                       a->name, lt_layout_name(a));
    if (node->nb[0] != lt_type_traits(node->type)->type_size)
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "no backward rule for view '%s' with an element stride of %zu bytes",
                       node->name, node->nb[0]);
    size_t base_offs = a->view_src ? a->view_offs : 0;
    size_t offset = node->view_offs - base_offs;
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad);
    /* a zero of its own, or the accumulator the last view made, takes the window in
     * place; a gradient another rule handed a (which may be someone else's too) is
     * copied first */
    const bool own = !a->grad || lt_ad_grad_owned(ad, a);
    struct lt_tensor *into = a->grad ? a->grad : lt_fill(ctx, a, 0.0f);
    if (!g || !into)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the gradient of '%s'", a->name);
    if (!a->grad) /* a FILL has no sources to be named after (profiles list it by name) */
        lt_format_name(into, "zero grad for %s", a->name);
    /* the window's strides and offset in the accumulator's bytes: a view of a half tensor
     * (LoRA's B rounded whole, then viewed a row range at a time) takes an F32 gradient */
    const size_t es = lt_type_traits(node->type)->type_size,
                 ei = lt_type_traits(into->type)->type_size;
    const size_t nb1 = node->nb[1] / es * ei, nb2 = node->nb[2] / es * ei,
                 nb3 = node->nb[3] / es * ei, at = offset / es * ei;
    const bool in_place = own && into->type == LT_TYPE_F32 && lt_is_contiguous(into);
    struct lt_tensor *sum = in_place ? lt_acc_inplace(ctx, into, g, nb1, nb2, nb3, at)
                                     : lt_acc(ctx, into, g, nb1, nb2, nb3, at);
    if (!sum)
        return lt_fail(LT_ERR_INVALID, "cannot send the gradient of view '%s' to '%s': %s",
                       node->name, a->name, lt_last_error());
    lt_format_name(sum, "grad for %s", a->name);
    lt_ad_set_owned_grad(ad, a, sum);
    return LT_OK;
}

static lt_status reshape_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0];
    if (!lt_ad_wants(ad, a))
        return LT_OK;
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad);
    if (!g)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the gradient of '%s'", a->name);
    return lt_ad_add(ad, a, lt_reshape_4d(lt_ad_ctx(ad), g, a->ne[0], a->ne[1], a->ne[2], a->ne[3]));
}

static lt_status permute_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0];
    if (!lt_ad_wants(ad, a))
        return LT_OK;
    int inv[4];
    for (int i = 0; i < 4; i++)
        inv[node->op_params[i]] = i;
    return lt_ad_add(ad, a, lt_permute(lt_ad_ctx(ad), node->grad, inv[0], inv[1], inv[2], inv[3]));
}

const struct lt_op_def lt_op_def_none = {.name = "NONE", .n_src = 0};
const struct lt_op_def lt_op_def_view = {.name = "VIEW", .n_src = 1, .backward = view_backward};
const struct lt_op_def lt_op_def_reshape = {
    .name = "RESHAPE", .n_src = 1, .backward = reshape_backward};
const struct lt_op_def lt_op_def_permute = {
    .name = "PERMUTE", .n_src = 1, .backward = permute_backward};
const struct lt_op_def lt_op_def_transpose = {
    .name = "TRANSPOSE", .n_src = 1, .backward = permute_backward};
