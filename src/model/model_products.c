/* model_products.c: the products of the forward builder (model_graph.c): a weight as the
 * graph reads it (a trainable replacement), its product by an input with the roundings a
 * device's training step asks for (BF16 operands, BF16 results where only one elementwise op
 * and its backward read them), a layer's products of one input as one product by a joint
 * matrix (inference), and LoRA adapters' terms: each adapter's scale A x (one product for
 * all the adapters of one input's products), added to the base product or joined with it
 * along the contraction. */
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

/* The tensor the graph reads for weight w (a replacement, when the adapters give one). */
struct lt_tensor *lt_mb_w(struct lt_mb *b, struct lt_tensor *w)
{
    if (!w || !b->ad)
        return w;
    for (int i = 0; i < b->ad->n_replace; i++)
        if (b->ad->replace[i].w == w)
            return b->ad->replace[i].with;
    return w;
}

/* x rounded to BF16, once for every product that reads it (x itself when its producer
 * wrote BF16: act_type) */
static struct lt_tensor *bf16_act(struct lt_mb *b, struct lt_tensor *x)
{
    if (x && x->type == LT_TYPE_BF16)
        return x;
    if (b->bf16_from != x) {
        b->bf16_act = lt_cont_as(b->ctx, x, LT_TYPE_BF16);
        b->bf16_from = b->bf16_act ? x : NULL;
    }
    return b->bf16_act;
}

/* whether a product by wr (a weight as the graph reads it) rounds it to BF16 */
bool lt_mb_bf16_product(const struct lt_mb *b, const struct lt_tensor *wr)
{
    return wr && b->ad && b->ad->bf16_products && wr->type == LT_TYPE_F32 && wr->ne[1] > 1;
}

/* whether that product reads x rounded to BF16 (bf16_act): an F32 weight's, and a BF16
 * weight's (a LoRA job's frozen base), which would round x inside each product that reads
 * it (q, k, v and the gate read one x): the same values, rounded once */
static bool bf16_x(const struct lt_mb *b, const struct lt_tensor *wr, const struct lt_tensor *x)
{
    return lt_mb_bf16_product(b, wr) ||
           (wr && x && b->ad && b->ad->bf16_products && wr->type == LT_TYPE_BF16 &&
            x->type == LT_TYPE_F32 && x->ne[1] > 8);
}

/* NAME=0 in the environment, read as a graph is built: the before / after switches
 * LATHE_HALF_FFN, LATHE_HALF_QKV and LATHE_HALF_Z (a training step's FFN gate and up
 * products, its DeltaNet q, k and v products, or its z, stay F32), LATHE_LORA_JOIN (lora_joins) and
 * LATHE_LORA_HALF_AX (lora_ax) */
static bool env_off(const char *name)
{
    const char *env = getenv(name);
    return env && strcmp(env, "0") == 0;
}

/* LoRA adapter l's scale * A x, rounded to BF16 when half (as its B product reads it): made
 * once for the products by several row ranges of one weight (mm_rows), so that A's gradient
 * sums theirs in F32 and rounds once, as one product's would. Half, the scale meets A as it
 * is rounded ([K, r], one node: lt_scale_as) and the product stores BF16 itself, where a
 * SCALE and a rounding of [r, T] followed it (two nodes a step for each adapter, and MUL_MAT's
 * rule then makes A x's gradient in BF16 too: one rounding fewer). For the usual power-of-two
 * scale (alpha / rank) the values are those of the F32 product scaled, then rounded.
 * LATHE_LORA_HALF_AX=0 keeps the chain before (and lora_b_half's rounding a range). */
static struct lt_tensor *lora_ax(struct lt_mb *b, const struct lt_model_lora *l,
                                 struct lt_tensor *x, bool half)
{
    if (b->ax_lora == l && b->ax_x == x)
        return b->ax;
    for (int i = 0; half && b->share_x == x && i < b->n_share; i++)
        if (b->share_lora[i] == l) { /* a part of the shared product (lora_share_ax) */
            b->ax_lora = l;
            b->ax_x = x;
            b->ax = b->share_ax[i];
            b->axz = NULL;
            return b->ax;
        }
    const bool fold = half && !env_off("LATHE_LORA_HALF_AX"); /* 0: the chain before */
    struct lt_tensor *xa = half ? bf16_act(b, x) : x; /* the base product's, when it rounds */
    struct lt_tensor *a = !half ? l->a
                          : fold && l->scale != 1.0f
                              ? lt_scale_as(b->ctx, l->a, l->scale, LT_TYPE_BF16)
                              : lt_cont_as(b->ctx, l->a, LT_TYPE_BF16);
    struct lt_tensor *ax = NULL;
    if (a && xa)
        ax = fold ? lt_mul_mat_as(b->ctx, a, xa, LT_TYPE_BF16) : lt_mul_mat(b->ctx, a, xa);
    if (ax && !fold && l->scale != 1.0f)
        ax = lt_scale(b->ctx, ax, l->scale);
    if (ax)
        lt_format_name(ax, "lora_a %s", l->w->name);
    struct lt_tensor *axr = half && !fold && ax ? lt_cont_as(b->ctx, ax, LT_TYPE_BF16) : ax;
    b->ax_lora = axr ? l : NULL;
    b->ax_x = x;
    b->ax = axr;
    b->axz = NULL;
    return axr;
}

/* The only adapter of weight w, or NULL (none, or several) */
static const struct lt_model_lora *only_lora(const struct lt_mb *b, const struct lt_tensor *w)
{
    const struct lt_model_lora *one = NULL;
    for (int i = 0; w && b->ad && i < b->ad->n_lora; i++)
        if (b->ad->lora[i].w == w) {
            if (one)
                return NULL;
            one = &b->ad->lora[i];
        }
    return one;
}

/* Before the products of a layer's weights ws[0..n) that read one input x (q, k and v; the
 * gate and up; a DeltaNet's q/k/v, gate, beta and alpha), with BF16 products: the scaled
 * A x of their adapters (two or more, one a weight) as one product by the A's joined along
 * the rank, [K, r1 + r2 + ...], each adapter's part a contiguous copy of its rows, which
 * lora_ax hands out. x's gradient then takes the adapters' terms in one product over its
 * F32 [K, T] where it took one each (each reading and writing all of it: ~26 us a product at
 * Qwen3.5-0.8B's 1,024 x 8,192), A's gradients one product reading x once, and the forward
 * one product reading x. The same sums; the parts' copies are [r, T]. Once per x (a later
 * call for the same x changes nothing). LATHE_LORA_SHARE_A=0 keeps an A x a weight. */
void lt_mb_lora_share_ax(struct lt_mb *b, struct lt_tensor *x, struct lt_tensor *const *ws, int n)
{
    if (!x || b->share_x == x || !b->ad || !b->ad->bf16_products ||
        (x->type != LT_TYPE_F32 && x->type != LT_TYPE_BF16) || env_off("LATHE_LORA_SHARE_A") ||
        env_off("LATHE_LORA_HALF_AX"))
        return;
    b->share_x = x;
    b->n_share = 0;
    const struct lt_model_lora *ls[LT_MB_SHARE_MAX];
    int m = 0;
    for (int i = 0; i < n && m < LT_MB_SHARE_MAX; i++) {
        const struct lt_model_lora *l = ws[i] ? only_lora(b, ws[i]) : NULL;
        if (l && l->a->ne[0] == x->ne[0])
            ls[m++] = l;
    }
    if (m < 2)
        return;
    /* the A's rounded (and scaled) one after another: [K * r] each, joined end to end (the
     * rank is A's outer dimension, so [K, r1 + r2] is the two laid one after the other: a
     * concat along dim 0 of flat tensors, which a device runs as one copy) */
    struct lt_tensor *aj = NULL, *xa = bf16_act(b, x);
    int64_t rank = 0;
    for (int i = 0; i < m; i++) {
        struct lt_tensor *a = ls[i]->scale != 1.0f
                                  ? lt_scale_as(b->ctx, ls[i]->a, ls[i]->scale, LT_TYPE_BF16)
                                  : lt_cont_as(b->ctx, ls[i]->a, LT_TYPE_BF16);
        struct lt_tensor *flat = a ? lt_reshape_2d(b->ctx, a, lt_nelements(a), 1) : NULL;
        aj = i == 0 ? flat : aj && flat ? lt_concat_as(b->ctx, aj, flat, 0, LT_TYPE_BF16) : NULL;
        rank += ls[i]->a->ne[1];
    }
    aj = aj ? lt_reshape_2d(b->ctx, aj, x->ne[0], rank) : NULL;
    struct lt_tensor *y = aj && xa ? lt_mul_mat_as(b->ctx, aj, xa, LT_TYPE_BF16) : NULL;
    if (!y)
        return; /* each adapter its own A x (lora_ax) */
    lt_format_name(y, "lora_a shared %s", ls[0]->w->name);
    int64_t r0 = 0;
    for (int i = 0; i < m; i++) {
        const int64_t r = ls[i]->a->ne[1];
        struct lt_tensor *v = lt_view_2d(b->ctx, y, r, y->ne[1], y->nb[1], (size_t)r0 * y->nb[0]);
        struct lt_tensor *part = v ? lt_cont(b->ctx, v) : NULL;
        if (!part)
            return;
        lt_format_name(part, "lora_a %s", ls[i]->w->name);
        b->share_lora[i] = ls[i];
        b->share_ax[i] = part;
        r0 += r;
    }
    b->n_share = m;
}

/* rows [r0, r0 + n) of the matrix w (its outputs r0..: a contiguous view), or w itself when
 * that is all of it */
struct lt_tensor *lt_mb_rows_of(struct lt_ctx *ctx, struct lt_tensor *w, int64_t r0, int64_t n)
{
    if (!w || (r0 == 0 && n == w->ne[1]))
        return w;
    return lt_view_2d(ctx, w, w->ne[0], n, w->nb[1], (size_t)r0 * w->nb[1]);
}

/* rows [r0, r0 + n) of LoRA adapter l's B rounded to BF16: B rounded whole once, for every
 * row range's product (q, k and v of one projection), then viewed; the ranges' gradients
 * add up into the rounding's, which passes them to B */
static struct lt_tensor *lora_b_half(struct lt_mb *b, const struct lt_model_lora *l, int64_t r0,
                                     int64_t n)
{
    if (env_off("LATHE_LORA_HALF_AX")) { /* the ranges rounded one by one, as before */
        struct lt_tensor *lb = lt_mb_rows_of(b->ctx, l->b, r0, n);
        return lb ? lt_cont_as(b->ctx, lb, LT_TYPE_BF16) : NULL;
    }
    if (b->bh_lora != l) {
        b->bh = lt_cont_as(b->ctx, l->b, LT_TYPE_BF16);
        b->bh_lora = b->bh ? l : NULL;
    }
    return lt_mb_rows_of(b->ctx, b->bh, r0, n);
}

/* the type the products of a device's training step that only one elementwise op and its
 * backward read may store: BF16 unless the switch `name` is off */
enum lt_type lt_mb_half_out(const struct lt_mb *b, const char *name)
{
    return b->ad && b->ad->bf16_products && !env_off(name) ? LT_TYPE_BF16 : LT_TYPE_F32;
}

/* the type of a BF16 product's result in mm_rows: b->product_type (BF16 while a device's
 * training step builds the FFN's gate and up products, or Qwen3.5's q, k and v) */
static enum lt_type half_product(const struct lt_mb *b)
{
    return b->product_type == LT_TYPE_BF16 ? LT_TYPE_BF16 : LT_TYPE_F32;
}

/* With BF16 products, the rows [r0, r0 + n) of a LoRA target w (its only adapter l) as one
 * product joined along the contraction: [W ; B] (each output row's K weights, then its r
 * adapter weights) against [x ; scale A x], where the base product added over B's F32
 * output [n, T] (written once, read once more in cuBLAS's epilogue) took 8 bytes an
 * output more than the product alone. The joins cost a copy of W's rows and of x ([K, T],
 * made once for every row range of w, as A x is): worth it where the outputs outnumber
 * the inputs, 2 n > K (the q, k, v, gate and up projections of Qwen3.5; not its output or
 * down projections). MUL_MAT's rule takes the gradients of the parts (x, and A x and B
 * through theirs) as the two products' rules would: the same products, the same values.
 * LATHE_LORA_JOIN=0 keeps the base product added over the adapter's. */
static bool lora_joins(const struct lt_mb *b, const struct lt_tensor *w, const struct lt_tensor *wr,
                       const struct lt_tensor *xr, int64_t n)
{
    if (env_off("LATHE_LORA_JOIN") || wr->type != LT_TYPE_BF16 || xr->type != LT_TYPE_BF16 ||
        wr->ne[2] != 1 || wr->ne[3] != 1 || xr->ne[2] != 1 || xr->ne[3] != 1 || 2 * n <= wr->ne[0])
        return false;
    return only_lora(b, w) != NULL;
}

static struct lt_tensor *lora_joined(struct lt_mb *b, const struct lt_model_lora *l,
                                     struct lt_tensor *x, struct lt_tensor *xr,
                                     struct lt_tensor *wr, int64_t r0, int64_t n)
{
    struct lt_tensor *axr = lora_ax(b, l, x, true);
    if (!b->axz && axr) {
        b->axz = lt_concat_as(b->ctx, xr, axr, 0, LT_TYPE_BF16);
        if (b->axz)
            lt_format_name(b->axz, "%s ; lora_a %s", xr->name, l->w->name);
    }
    struct lt_tensor *bw = lora_b_half(b, l, r0, n);
    struct lt_tensor *wb = bw ? lt_concat_as(b->ctx, wr, bw, 0, LT_TYPE_BF16) : NULL;
    if (wb)
        lt_format_name(wb, "%s ; lora_b", l->w->name);
    struct lt_tensor *y = wb && b->axz ? lt_mul_mat_as(b->ctx, wb, b->axz, half_product(b)) : NULL;
    if (y)
        lt_format_name(y, "lora-joined %s", l->w->name);
    return y;
}

/* LATHE_FUSE_NORM_MM=0 in the environment (read as a graph is built): a decode step's norms
 * stay where MUL_MAT_ADD_RMS_NORM puts them (a before / after switch for the device's
 * measurements and the tests) */
bool lt_mb_norm_mm_off(void)
{
    const char *env = getenv("LATHE_FUSE_NORM_MM");
    return env && strcmp(env, "0") == 0;
}

/* weights whose one-column product a device runs with a norm taken in first or a residual
 * added as it stores (CUDA: mmv_half_kernel for F16 / BF16, mmvq for Q8_0 / Q4_0 / Q5_0) */
bool lt_mb_norm_product_type(enum lt_type t)
{
    return t == LT_TYPE_F16 || t == LT_TYPE_BF16 || t == LT_TYPE_Q8_0 || t == LT_TYPE_Q4_0 ||
           t == LT_TYPE_Q5_0;
}

/* Whether the product of the weight w (as the graph reads it) by x takes x's norm into one
 * RMS_NORM_MUL_MAT node: a fused one-token step (decode) whose x is the F32 weighted RMS
 * norm (RMS_NORM_MUL, no gate) of one F32 column (one sequence: a device norms it in each
 * block of the product, or as it quantises it), against rows of a norm_product_type. */
static bool norm_into_product(const struct lt_mb *b, const struct lt_tensor *w,
                              const struct lt_tensor *x)
{
    return b->fused && b->n_tokens == 1 && !lt_mb_norm_mm_off() && w && x &&
           lt_mb_norm_product_type(w->type) && w->ne[2] == 1 && w->ne[3] == 1 &&
           x->op == LT_OP_RMS_NORM && x->type == LT_TYPE_F32 && x->src[1] && !x->src[2] &&
           x->src[0]->type == LT_TYPE_F32 && x->src[0]->ne[1] == 1 && x->src[0]->ne[2] == 1 &&
           x->src[0]->ne[3] == 1;
}

/* w x (lt_mul_mat), or its SwiGLU with glu (lt_mul_mat_glu), with x's norm taken in
 * (norm_into_product) where it may */
struct lt_tensor *lt_mb_product(struct lt_mb *b, struct lt_tensor *w, struct lt_tensor *x, bool glu)
{
    if (norm_into_product(b, w, x))
        return lt_rms_norm_mul_mat(b->ctx, w, x->src[0], x->src[1], lt_get_param_f32(x, 0), glu);
    return glu ? lt_mul_mat_glu(b->ctx, w, x) : lt_mul_mat(b->ctx, w, x);
}

/* w x, plus B (scale * A x) for each LoRA adapter of w: the scale meets the rank-r A x, not
 * the output (a pass over [r, T] instead of [rows, T], forward and backward). With
 * bf16_products, an F32 weight matrix and x are rounded to BF16 first, and so are the
 * adapters' operands: A, B, the x that A reads (the base product's rounding of it) and the
 * scaled A x. B's product writes [rows, T] and its gradient reads as much: in F32 (no
 * tensor cores) the adapters' products took more of a LoRA step than the base products.
 * mm_rows takes the output rows [r0, r0 + n) alone (those of w and of each B). */
struct lt_tensor *lt_mb_mm_rows(struct lt_mb *b, struct lt_tensor *w, struct lt_tensor *x,
                                int64_t r0, int64_t n)
{
    struct lt_tensor *wr = lt_mb_rows_of(b->ctx, lt_mb_w(b, w), r0, n), *xr = x;
    const bool round_w = lt_mb_bf16_product(b, wr), round_x = bf16_x(b, wr, x);
    if (round_w && !(wr = lt_cont_as(b->ctx, wr, LT_TYPE_BF16)))
        return NULL;
    if (round_x && !(xr = bf16_act(b, x)))
        return NULL;
    /* with BF16 products the adapters' outputs come first, summed, and the base product is
     * added into that sum in place (MUL_MAT_ACC: in cuBLAS's epilogue, where an ADD took
     * a pass over [rows, T] of its own); otherwise the base product first, adapters added.
     * The other order with BF16 products (the base product first, each rank-r product
     * adding into it) measured slower: on an H100 at Qwen3.5-0.8B's 16 x 512, cuBLAS's
     * rank-16 product with the F32 [2048, 8192] addend took 72 us, where the adapter's
     * product writing it took 30 and the base product reading it 33 more than without. */
    const bool half =
        b->ad && b->ad->bf16_products && (x->type == LT_TYPE_F32 || x->type == LT_TYPE_BF16);
    if (half && lora_joins(b, w, wr, xr, n))
        return lora_joined(b, only_lora(b, w), x, xr, wr, r0, n);
    struct lt_tensor *y = half ? NULL : lt_mb_product(b, wr, xr, false);
    for (int i = 0; (y || half) && b->ad && i < b->ad->n_lora; i++) {
        const struct lt_model_lora *l = &b->ad->lora[i];
        if (l->w != w)
            continue;
        struct lt_tensor *axr = lora_ax(b, l, x, half);
        struct lt_tensor *bw = half ? lora_b_half(b, l, r0, n) : lt_mb_rows_of(b->ctx, l->b, r0, n);
        struct lt_tensor *bax = axr && bw ? lt_mul_mat(b->ctx, bw, axr) : NULL;
        if (!bax)
            return NULL;
        lt_format_name(bax, "lora %s", w->name);
        y = y ? lt_add(b->ctx, y, bax) : bax;
        if (!y)
            return NULL;
    }
    if (half)
        y = y ? lt_mul_mat_acc(b->ctx, wr, xr, y)
              : lt_mul_mat_as(b->ctx, wr, xr,
                              wr->type == LT_TYPE_BF16 && xr->type == LT_TYPE_BF16 ? half_product(b)
                                                                                   : LT_TYPE_F32);
    return y;
}

struct lt_tensor *lt_mb_mm(struct lt_mb *b, struct lt_tensor *w, struct lt_tensor *x)
{
    return w ? lt_mb_mm_rows(b, w, x, 0, w->ne[1]) : NULL;
}

/* whether the group's products may be the one product by `joint` (mm_group) */
bool lt_mb_joint_takes(struct lt_mb *b, struct lt_tensor *joint, struct lt_tensor *const *ws, int n,
                       struct lt_tensor *x)
{
    bool one = b->fused && joint && x;
    for (int i = 0; one && i < n; i++) {
        one = ws[i] && lt_mb_w(b, ws[i]) == ws[i] && !lt_mb_bf16_product(b, ws[i]);
        for (int j = 0; one && b->ad && j < b->ad->n_lora; j++)
            one = b->ad->lora[j].w != ws[i];
    }
    return one;
}

/* The products of x by ws[0..n), a layer group stacked in one matrix `joint` at upload
 * (model_load.c): with b->fused and no adapter, replacement or BF16 rounding on any member,
 * one product by the joint matrix, out[i] the view of member i's rows (columns as far apart
 * as the joint's rows); otherwise lt_mb_mm() of each. */
lt_status lt_mb_mm_group(struct lt_mb *b, struct lt_tensor *joint, struct lt_tensor *const *ws,
                         int n, struct lt_tensor *x, struct lt_tensor **out)
{
    if (!lt_mb_joint_takes(b, joint, ws, n, x)) {
        lt_mb_lora_share_ax(b, x, ws, n);
        for (int i = 0; i < n; i++)
            if (!(out[i] = lt_mb_mm(b, ws[i], x)))
                return lt_mb_check(NULL, "a projection", -1);
        return LT_OK;
    }
    struct lt_tensor *y = lt_mb_product(b, joint, x, false);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        out[i] = y ? lt_view_2d(b->ctx, y, ws[i]->ne[1], y->ne[1], y->nb[1], off) : NULL;
        off += (size_t)ws[i]->ne[1] * sizeof(float);
        if (!out[i])
            return lt_mb_check(NULL, joint->name, -1);
    }
    return LT_OK;
}
