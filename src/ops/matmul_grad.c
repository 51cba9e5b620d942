/* matmul_grad.c: the backward rule of MUL_MAT and MUL_MAT_ACC (matmul.c has the ops). With
 * g = dL/dy [M, N, B2, B3],
 *   db = mul_mat(a^T, g): a's transposed view as the first operand, grouped over b's heads
 *        exactly as in the forward, so nothing is left to reduce;
 *   da = mul_mat(b^T, g^T) [K, M, B2, B3], then summed over each group of consecutive b
 *        heads that shared one a head (GQA), down to a's [K, M, A2, A3].
 * The first operand may have any layout and readable type, but a block-quantised a cannot
 * be viewed transposed (its blocks run along ne0): it is dequantised to F32 first. When a
 * and b are of one half type, both products read g rounded once to that type. A product
 * joined along its contraction (two CONCATs: a LoRA target's) takes each part's gradients
 * as that part's own product would. */
#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

/* a in a form whose transposed view mul_mat takes as its first operand: a itself, unless
 * block-quantised; then an F32 copy (a CPY into a FILL, so it is scheduled like any node
 * and its memory freed after its last reader). */
static struct lt_tensor *transposable(struct lt_ctx *ctx, struct lt_tensor *a)
{
    if (!lt_type_traits(a->type)->is_quantized)
        return a;
    struct lt_tensor *f32 = lt_fill(ctx, a, 0.0f);
    struct lt_tensor *deq = f32 ? lt_cpy(ctx, a, f32) : NULL;
    if (deq)
        lt_format_name(deq, "%s (f32)", a->name);
    return deq;
}

/* t [K, M, B2, B3] (contiguous F32) summed down to [K, M, A2, A3] over each group of
 * B2 / A2 consecutive heads in dim 2 (and B3 / A3 in dim 3): head i2 of t belongs to head
 * i2 / r2, so reshaped to [K*M, r2, A2, B3] the group is dim 1, which REPEAT_BACK sums
 * (its "like" is only a shape: a view of t's first elements). */
static struct lt_tensor *sum_head_groups(struct lt_ctx *ctx, struct lt_tensor *t, int64_t A2,
                                         int64_t A3)
{
    const int64_t K = t->ne[0], M = t->ne[1], B2 = t->ne[2], B3 = t->ne[3], km = K * M;
    if (B2 != A2) {
        struct lt_tensor *v = lt_reshape_4d(ctx, t, km, B2 / A2, A2, B3);
        struct lt_tensor *like =
            v ? lt_view_4d(ctx, v, km, 1, A2, B3, v->nb[1], v->nb[2], v->nb[3], 0) : NULL;
        t = like ? lt_repeat_back(ctx, v, like) : NULL;
    }
    if (t && B3 != A3) {
        struct lt_tensor *v = lt_reshape_4d(ctx, t, km * A2, B3 / A3, A3, 1);
        struct lt_tensor *like =
            v ? lt_view_4d(ctx, v, km * A2, 1, A3, 1, v->nb[1], v->nb[2], v->nb[3], 0) : NULL;
        t = like ? lt_repeat_back(ctx, v, like) : NULL;
    }
    return t ? lt_reshape_4d(ctx, t, K, M, A2, A3) : NULL;
}

/* src->grad += x y. When src's gradient so far is an accumulator only src reads (a product
 * or a sum made for it: lt_ad_grad_owned), the product is added over it in place by
 * MUL_MAT_ACC: a device adds it in cuBLAS's epilogue, where an ADD took a pass of its own
 * over [K, T] (a LoRA target's input gets its base product's and its adapter's A product's
 * gradients; Qwen3.5's norm output four). The first contribution is a fresh product, src's
 * own from then on. The sums are the same either way: c + x y, element by element. */
static lt_status add_product(struct lt_autodiff *ad, struct lt_tensor *src, struct lt_tensor *x,
                             struct lt_tensor *y, const struct lt_tensor *reader)
{
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    struct lt_tensor *acc = src->grad;
    /* src a half product that only `reader` reads (lt_ad_grad_type: a LoRA adapter's A x,
     * which its B product or the joined product reads): its own rule would round this
     * gradient to its operands' type first, so the product stores it in that type, each
     * element rounded once from the same F32 sum */
    const enum lt_type half = reader ? lt_ad_grad_type(ad, src, reader) : LT_TYPE_F32;
    if (!acc && half != LT_TYPE_F32 && x->type == half && y->type == half) {
        struct lt_tensor *p = lt_mul_mat_as(ctx, x, y, half);
        if (p)
            lt_format_name(p, "grad for %s", src->name);
        return lt_ad_add(ad, src, p);
    }
    if (acc && lt_ad_grad_owned(ad, src) && acc->type == LT_TYPE_F32 && lt_is_contiguous(acc))
        return lt_ad_take_grad(ad, src, lt_mul_mat_acc(ctx, x, y, acc), true);
    const bool first = !acc;
    struct lt_tensor *p = lt_mul_mat(ctx, x, y);
    lt_status st = lt_ad_add(ad, src, p);
    if (st == LT_OK && first && src->grad == p)
        lt_ad_set_owned_grad(ad, src, p);
    return st;
}

/* The gradients of a x b for the operands that want one, g the result's gradient (rounded as
 * the operands are): da for an a that wants one (the formula does not read a), db likewise;
 * reader_b is the node that reads b (the product, or the join that holds b) */
static lt_status product_grads(struct lt_autodiff *ad, struct lt_tensor *a, struct lt_tensor *b,
                               struct lt_tensor *g, const struct lt_tensor *reader_b)
{
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    const bool want_a = lt_ad_wants(ad, a), want_b = lt_ad_wants(ad, b);
    lt_status st = LT_OK;
    if (want_b) {
        struct lt_tensor *at = transposable(ctx, a);
        at = at ? lt_transpose(ctx, at) : NULL;
        st = at ? add_product(ad, b, at, g, reader_b) : lt_ad_add(ad, b, NULL);
    }
    if (st == LT_OK && want_a) {
        struct lt_tensor *bt = lt_transpose(ctx, b), *gt = lt_transpose(ctx, g);
        if (!bt || !gt)
            return lt_ad_add(ad, a, NULL);
        if (b->ne[2] == a->ne[2] && b->ne[3] == a->ne[3])
            return add_product(ad, a, bt, gt, NULL);
        struct lt_tensor *da = lt_mul_mat(ctx, bt, gt);
        st = lt_ad_add(ad, a, da ? sum_head_groups(ctx, da, a->ne[2], a->ne[3]) : NULL);
    }
    return st;
}

/* Whether a x b is a product joined along its contraction: a = [a0 ; a1] and b = [b0 ; b1],
 * both CONCATs along dim 0 split at the same K, 2-d. Then a x b = a0 x b0 + a1 x b1, and
 * the rule takes each part's gradients as that part's product would: a LoRA target's
 * frozen weight joined with its adapter's B, and its input with the adapter's A x
 * (src/model/model_products.c), give the input's and B's gradients alone, never the full
 * [K + r, rows] gradient of the joined weight. */
static bool joined_product(const struct lt_tensor *a, const struct lt_tensor *b)
{
    return a->op == LT_OP_CONCAT && b->op == LT_OP_CONCAT && lt_get_param_i32(a, 0) == 0 &&
           lt_get_param_i32(b, 0) == 0 && a->src[0]->ne[0] == b->src[0]->ne[0] && a->ne[2] == 1 &&
           a->ne[3] == 1 && b->ne[2] == 1 && b->ne[3] == 1;
}

/* da and db for the operands that want one. The F32 gradient of an F16/BF16/quantised a
 * computed from a trainable tensor (a CPY into a half KV cache, say) passes on through that
 * op's rule. A frozen weight never wants one; a non-F32 leaf flagged trainable is refused,
 * since no optimizer step updates it. */
lt_status lt_mul_mat_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *a = node->src[0], *b = node->src[1];
    if (node->op == LT_OP_MUL_MAT_ACC && lt_ad_wants(ad, node->src[2])) {
        /* c passes whole: its gradient is the result's */
        lt_status st = lt_ad_add(ad, node->src[2], node->grad);
        if (st != LT_OK)
            return st;
    }
    if (!lt_ad_wants(ad, a) && !lt_ad_wants(ad, b))
        return LT_OK;
    const bool joined = joined_product(a, b);
    for (int i = 0; i < (joined ? 2 : 1); i++) {
        const struct lt_tensor *ai = joined ? a->src[i] : a;
        if (lt_ad_wants(ad, ai) && ai->type != LT_TYPE_F32 && ai->op == LT_OP_NONE)
            return lt_fail(LT_ERR_UNSUPPORTED,
                           "'%s' is a trainable %s weight of MUL_MAT '%s': only f32 weights take "
                           "gradients (a quantised or half weight stays frozen; train an adapter "
                           "or an f32 copy)",
                           ai->name, lt_type_name(ai->type), node->name);
    }
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad);
    /* a scaled MUL_MAT_ACC's product part: alpha a b */
    const float alpha = lt_mul_mat_acc_alpha(node);
    if (g && alpha != 1.0f)
        g = lt_scale(lt_ad_ctx(ad), g, alpha);
    if (!g)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the gradient of '%s'", node->name);
    /* a and b both in one half type (a device's training products: operands rounded to
     * BF16): each product would round g to that type on its own (a device product takes
     * one operand type); round it once, the same bits, one pass fewer. The rounding is
     * shared with any other rule that rounds this g (lt_ad_rounded): a LoRA target's
     * frozen base product (only db wanted) and its adapter's B product read one g. */
    if ((a->type == LT_TYPE_BF16 || a->type == LT_TYPE_F16) && b->type == a->type &&
        g->type == LT_TYPE_F32) {
        struct lt_tensor *gh = lt_ad_rounded(ad, g, a->type);
        if (!gh)
            return lt_fail(LT_ERR_NOMEM, "out of memory for the gradient of '%s'", node->name);
        g = gh;
    }
    if (!joined)
        return product_grads(ad, a, b, g, node);
    /* the join b hands its parts their gradients only through this node's rule when this
     * node is b's one reader (row ranges of one weight share one join of the input: each
     * range's product adds to the parts) */
    const struct lt_tensor *join = lt_ptrmap_get(&ad->readers, b, 0) == 1 ? b : NULL;
    lt_status st = product_grads(ad, a->src[0], b->src[0], g, join);
    return st == LT_OK ? product_grads(ad, a->src[1], b->src[1], g, join) : st;
}
