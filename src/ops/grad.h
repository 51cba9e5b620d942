/* grad.h (internal): what a backward rule may call, and the state of the backward pass
 * that src/autodiff/autodiff.c builds (it walks the graph; the rules live here, in ops).
 *
 * A rule (lt_op_def.backward) is handed a node whose ->grad holds d loss / d node. For
 * each source s that needs a gradient (lt_ad_wants), it builds the gradient with ordinary
 * op constructors and hands it to lt_ad_add, which accumulates into s->grad (copying a
 * non-contiguous contribution first). A rule must never give a kernel a layout it
 * cannot take: where the forward source is a non-contiguous view and the kernel needs a
 * contiguous one, use lt_ad_contiguous. */
#ifndef LATHE_OPS_GRAD_H
#define LATHE_OPS_GRAD_H

#include "core/ptrmap.h"
#include "lathe/ops.h"

struct lt_autodiff {
    struct lt_ctx *ctx;
    struct lt_tensor *loss, *seed; /* the loss and its gradient, the FILL of grad_scale */
    bool folded;                   /* a rule computed the loss in its backward node */
    /* the loss's op, parameters and sources before it was folded: lt_autodiff_build puts
     * them back when the build fails, so the caller's forward graph still runs */
    struct lt_tensor unfolded;
    struct lt_ptrmap wants; /* tensor -> 1 when it needs a gradient */
    /* tensor -> 1 while its gradient is an accumulator no other tensor reads (made by a
     * view's rule from a fresh zero or a fresh ACC), so the next view may add in place */
    struct lt_ptrmap owned;
    struct lt_ptrmap readers; /* tensor -> how many nodes of the forward graph read it */
    /* the last LT_AD_ROUNDED roundings made by lt_ad_rounded (a ring), so that two rules
     * reading one gradient in one half type share one rounding */
#define LT_AD_ROUNDED 8
    struct {
        struct lt_tensor *from, *to;
    } rounded[LT_AD_ROUNDED];
    int n_rounded;
};

struct lt_ctx *lt_ad_ctx(struct lt_autodiff *ad);
/* Does src lie on a path from a trainable tensor (so it needs a gradient)? */
bool lt_ad_wants(struct lt_autodiff *ad, const struct lt_tensor *src);
/* src->grad += grad. grad must have src's shape; NULL grad (a constructor failed) is
 * reported as an error naming src. */
lt_status lt_ad_add(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *grad);
/* Is src's gradient so far an accumulator that only src's later contributions read (set
 * by lt_ad_set_owned_grad and by a sum lt_ad_add makes; cleared when lt_ad_add hands a
 * contribution through whole)? A rule may then add into it in place (view_backward's ACC,
 * MUL_MAT's rule's MUL_MAT_ACC). */
bool lt_ad_grad_owned(struct lt_autodiff *ad, const struct lt_tensor *src);
/* src->grad = grad, a tensor made for src alone (a fresh zero or product, or an in-place
 * accumulation into one) */
void lt_ad_set_owned_grad(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *grad);
/* t, a node that holds src's whole gradient so far (a sum a rule made over it in place, or
 * beside it), becomes src's gradient, named for src: owned (lt_ad_set_owned_grad) or not
 * (a part of a larger result, which others' rules may also hold). A NULL t (its constructor
 * failed) is reported naming src. */
lt_status lt_ad_take_grad(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *t,
                          bool owned);
/* src->grad += grad, where grad is an accumulator the caller hands over (nothing else reads
 * it: a rule's fresh part, or its node's own gradient). A first contribution becomes src's
 * own; when src's gradient so far is a scatter made for src alone (GET_ROWS_BACK: an
 * embedding's rows), the rows go into grad in place instead (a tied LM head's gradient: no
 * dense scatter and no ADD over the whole table); otherwise as lt_ad_add. */
lt_status lt_ad_add_owned(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *grad);
/* src's gradient becomes `into` (an accumulator src alone reads: contiguous F32 of src's
 * shape) with the rows of `rows` added at ids in place (lt_get_rows_back_into) */
lt_status lt_ad_rows_into(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *rows,
                          struct lt_tensor *ids, struct lt_tensor *into);
/* t rounded to type (F16 or BF16) by a CONT, named "<t> (<type>)": the one already made for t
 * when one of the last LT_AD_ROUNDED roundings was (a LoRA target's base product and its
 * adapter's B product read one output gradient). */
struct lt_tensor *lt_ad_rounded(struct lt_autodiff *ad, struct lt_tensor *t, enum lt_type type);
/* The type a rule may write t's gradient in: F16 or BF16 when t is a plain product
 * (MUL_MAT) of two operands of that type, which by then reads nothing but `reader` (so the
 * gradient is that rule's alone, and MUL_MAT's rule would round it to that type before its
 * products), or such a product added over an addend (MUL_MAT_ACC: a LoRA target's base
 * product over its adapter's) whose addend takes its gradient in that type by the same
 * rule, or wants none; or a reshape of such a product that reads nothing but `reader`; F32
 * otherwise. */
enum lt_type lt_ad_grad_type(struct lt_autodiff *ad, const struct lt_tensor *t,
                             const struct lt_tensor *reader);
/* Is node the loss with its gradient still autodiff's seed (the constant grad_scale, nothing
 * added to it)? Its rule may then compute the loss in its own backward node and hand that
 * value to lt_ad_fold_loss. */
bool lt_ad_seeded(struct lt_autodiff *ad, const struct lt_tensor *node);
/* The loss takes its value from `value` (one F32, computed by the loss's backward node from
 * the loss's sources, not from the loss): the loss node becomes a copy of it, so its own
 * computation never runs, and lt_autodiff_build puts value's nodes before the loss in the
 * graph. A copy rather than a view: the loss lives to the end of the graph (LT_FLAG_LOSS),
 * and a view would keep the whole backward node alive with it. */
lt_status lt_ad_fold_loss(struct lt_autodiff *ad, struct lt_tensor *node, struct lt_tensor *value);
/* t itself when contiguous, otherwise a CONT copy of it. */
struct lt_tensor *lt_ad_contiguous(struct lt_autodiff *ad, struct lt_tensor *t);

/* MUL_MAT's and MUL_MAT_ACC's rule (src/ops/matmul_grad.c) */
lt_status lt_mul_mat_backward(struct lt_autodiff *ad, struct lt_tensor *node);

#endif
