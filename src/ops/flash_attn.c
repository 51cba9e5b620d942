/* flash_attn.c: FLASH_ATTN, scaled dot-product attention in one node, and its backward
 * FLASH_ATTN_BACK: constructors, the shape rule, the backward rule and the CPU kernels.
 *
 * FLASH_ATTN(q, k, v, mask; scale, causal) is what the chain MUL_MAT (k, q), SOFT_MAX
 * (scale, mask, causal), MUL_MAT (v^T, p) and the merge of the heads computes:
 *   o[:, h, t, s] = sum_j p_j v[:, hk, j, s],  p = softmax_j(scale q[:, h, t, s] . k[:, hk, j, s]
 *                                                          + mask[j, t, h % m2, s % m3])
 * with the query heads of a group sharing a key head (hk = h / (H / Hkv)) and SOFT_MAX's
 * rules for dropped keys: causal drops key j of query t when j > t + (n_kv - T), a mask of
 * -inf drops it too, and a query with every key dropped gets zeros. Sources: q [D, H, T, S],
 * k and v [D, Hkv, n_kv, S] (F32, F16 or BF16, any strides), mask F32 [n_kv, T, m2, m3]
 * (m2 dividing H, m3 dividing S; optional), or in its place I32 positions [T * S] (a packed
 * training step's: each example counts 0, 1, 2, ... from its first step), which drop the keys
 * before query t's example, j < t + (n_kv - T) - pos[s T + t]: the packed mask, without a
 * T x T tensor. The result is F32 [D, H, T, S], contiguous: the
 * layout the chain's merge gives. Neither the scores nor the probabilities exist as tensors,
 * so the memory of a layer's attention does not grow with T x T; a device kernel keeps
 * them a tile at a time (src/backend/cuda/flash_attn.cu).
 *
 * FLASH_ATTN_BACK(do, q, k, v, o, mask) gives dq, dk and dv in one flat F32 result, in that
 * order, each in its source's shape, contiguous (lt_flash_attn_back_grad views them). It
 * recomputes the probabilities rather than keeping them:
 *   D_t = do_t . o_t,  ds_j = p_j (do_t . v_j - D_t),
 *   dq_t = scale sum_j ds_j k_j,  dk_j += scale ds_j q_t,  dv_j += p_j do_t.
 * The mask is a constant (its gradient is refused by the rule).
 *
 * Params: f32 0 the scale; i32 1 causal; i32 2 the device products' precision
 * (LT_FLASH_ATTN_PREC_*: the CPU always computes in F32, with each score and each output's
 * sums in double as ATTN_DECODE does). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

/* sources: FLASH_ATTN's (FA_) and FLASH_ATTN_BACK's (FB_), one enum so they compare */
enum { FA_Q = 0, FA_K, FA_V, FA_MASK, FB_DO = 0, FB_Q, FB_K, FB_V, FB_O, FB_MASK };

static bool fa_float(const struct lt_tensor *t)
{
    return t && lt_type_is_float(t->type);
}

/* the constructors' rule; NULL: fine, else what is wrong */
static const char *fa_check(const struct lt_tensor *q, const struct lt_tensor *k,
                            const struct lt_tensor *v, const struct lt_tensor *mask)
{
    if (!fa_float(q) || !fa_float(k) || !fa_float(v))
        return "q, k and v must be f32, f16 or bf16";
    if (!lt_same_shape(k, v))
        return "k and v must have one shape [D, Hkv, n_kv, S]";
    if (q->ne[0] != k->ne[0] || q->ne[3] != k->ne[3])
        return "q [D, H, T, S] and k [D, Hkv, n_kv, S] must agree in D and S";
    if (k->ne[1] < 1 || q->ne[1] % k->ne[1] != 0)
        return "the key heads Hkv must divide the query heads H";
    if (mask && mask->type == LT_TYPE_I32) /* positions: the packed examples' boundaries */
        return lt_is_contiguous(mask) && lt_nelements(mask) == q->ne[2] * q->ne[3]
                   ? NULL
                   : "positions must be contiguous i32 [T * S]";
    if (mask && (mask->type != LT_TYPE_F32 || mask->ne[0] != k->ne[2] || mask->ne[1] != q->ne[2] ||
                 mask->ne[2] < 1 || mask->ne[3] < 1 || q->ne[1] % mask->ne[2] != 0 ||
                 q->ne[3] % mask->ne[3] != 0))
        return "the mask must be f32 [n_kv, T, m2, m3] with m2 dividing H and m3 dividing S";
    return NULL;
}

struct lt_tensor *lt_flash_attn(struct lt_ctx *ctx, struct lt_tensor *q, struct lt_tensor *k,
                                struct lt_tensor *v, struct lt_tensor *mask, float scale,
                                bool causal)
{
    LT_REQUIRE("flash_attn", q, k, v);
    const char *why = fa_check(q, k, v, mask);
    if (why) {
        lt_fail(LT_ERR_INVALID, "flash_attn of '%s' over '%s': %s", q->name, k->name, why);
        return NULL;
    }
    struct lt_tensor *srcs[4] = {q, k, v, mask};
    struct lt_tensor *t =
        lt_new_op_tensor(ctx, LT_OP_FLASH_ATTN, LT_TYPE_F32, 4, q->ne, srcs, mask ? 4 : 3);
    if (!t)
        return NULL;
    lt_set_param_f32(t, 0, scale);
    lt_set_param_i32(t, 1, causal ? 1 : 0);
    lt_set_param_i32(t, 2, LT_FLASH_ATTN_PREC_F32);
    return t;
}

void lt_flash_attn_set_prec(struct lt_tensor *t, enum lt_flash_attn_prec prec)
{
    if (t && (t->op == LT_OP_FLASH_ATTN || t->op == LT_OP_FLASH_ATTN_BACK))
        lt_set_param_i32(t, 2, (int32_t)prec);
}

struct lt_tensor *lt_flash_attn_back(struct lt_ctx *ctx, struct lt_tensor *grad,
                                     struct lt_tensor *fwd)
{
    LT_REQUIRE("flash_attn_back", grad, fwd);
    if (fwd->op != LT_OP_FLASH_ATTN) {
        lt_fail(LT_ERR_INVALID, "flash_attn_back: '%s' is %s, not FLASH_ATTN", fwd->name,
                lt_op_name(fwd->op));
        return NULL;
    }
    if (grad->type != LT_TYPE_F32 || !lt_same_shape(grad, fwd)) {
        lt_fail(LT_ERR_INVALID, "flash_attn_back: gradient '%s' must be f32 of '%s''s shape",
                grad->name, fwd->name);
        return NULL;
    }
    struct lt_tensor *q = fwd->src[FA_Q], *k = fwd->src[FA_K], *v = fwd->src[FA_V];
    struct lt_tensor *srcs[6] = {grad, q, k, v, fwd, fwd->src[FA_MASK]};
    int64_t n = lt_nelements(q) + lt_nelements(k) + lt_nelements(v);
    struct lt_tensor *r = lt_new_op_tensor(ctx, LT_OP_FLASH_ATTN_BACK, LT_TYPE_F32, 1, &n, srcs,
                                           fwd->src[FA_MASK] ? 6 : 5);
    if (!r)
        return NULL;
    lt_set_param_f32(r, 0, lt_get_param_f32(fwd, 0));
    lt_set_param_i32(r, 1, lt_get_param_i32(fwd, 1));
    lt_set_param_i32(r, 2, lt_get_param_i32(fwd, 2));
    lt_format_name(r, "flash_attn_back(%s)", fwd->name);
    return r;
}

struct lt_tensor *lt_flash_attn_back_grad(struct lt_ctx *ctx, struct lt_tensor *r,
                                          enum lt_flash_attn_grad which)
{
    LT_REQUIRE("flash_attn_back_grad", r);
    if (r->op != LT_OP_FLASH_ATTN_BACK || (int)which < 0 || which > LT_FLASH_ATTN_GRAD_V) {
        lt_fail(LT_ERR_INVALID,
                "flash_attn_back_grad: '%s' is not FLASH_ATTN_BACK, or no "
                "gradient %d",
                r->name, (int)which);
        return NULL;
    }
    int64_t off = 0;
    for (int i = 0; i < (int)which; i++)
        off += lt_nelements(r->src[FB_Q + i]);
    const struct lt_tensor *s = r->src[FB_Q + which];
    size_t nb1 = sizeof(float) * (size_t)s->ne[0], nb2 = nb1 * (size_t)s->ne[1],
           nb3 = nb2 * (size_t)s->ne[2];
    struct lt_tensor *t = lt_view_4d(ctx, r, s->ne[0], s->ne[1], s->ne[2], s->ne[3], nb1, nb2, nb3,
                                     sizeof(float) * (size_t)off);
    if (t)
        lt_format_name(t, "d %s", s->name);
    return t;
}

/* ---- CPU ---- */

static bool fa_cpu_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const int base = node->op == LT_OP_FLASH_ATTN ? FA_Q : FB_Q;
    const char *why = fa_check(node->src[base], node->src[base + 1], node->src[base + 2],
                               node->src[node->op == LT_OP_FLASH_ATTN ? FA_MASK : FB_MASK]);
    if (why) {
        snprintf(reason, reason_size, "%s", why);
        return false;
    }
    return true;
}

/* what one (key head, sequence) of either kernel reads and computes, in floats */
struct fa_head {
    int64_t D, H, Hkv, T, nk, S;
    float scale;
    bool causal;
    const struct lt_tensor *q, *k, *v, *mask; /* mask: the F32 one, else NULL */
    const int32_t *pos;                       /* the I32 positions in the mask's place, else NULL */
};

static struct fa_head fa_head_of(const struct lt_tensor *q, const struct lt_tensor *k,
                                 const struct lt_tensor *v, const struct lt_tensor *mask,
                                 const struct lt_tensor *node)
{
    struct fa_head h = {q->ne[0],
                        q->ne[1],
                        k->ne[1],
                        q->ne[2],
                        k->ne[2],
                        q->ne[3],
                        lt_get_param_f32(node, 0),
                        lt_get_param_i32(node, 1) != 0,
                        q,
                        k,
                        v,
                        mask && mask->type == LT_TYPE_F32 ? mask : NULL,
                        mask && mask->type == LT_TYPE_I32 ? (const int32_t *)mask->data : NULL};
    return h;
}

/* keys [0, keep) of query t take part (causal), the rest are dropped */
static int64_t fa_keep(const struct fa_head *a, int64_t t)
{
    if (!a->causal)
        return a->nk;
    int64_t keep = t + (a->nk - a->T) + 1;
    return keep < 0 ? 0 : keep > a->nk ? a->nk : keep;
}

/* the keys' and values' rows of key head hk, sequence s, as contiguous floats */
static void fa_load_kv(const struct fa_head *a, int64_t hk, int64_t s, float *K, float *V)
{
    for (int64_t j = 0; j < a->nk; j++) {
        lt_row_to_f32(a->k, hk, j, s, K + j * a->D);
        lt_row_to_f32(a->v, hk, j, s, V + j * a->D);
    }
}

/* p over the keys of query (h, t, s) from its row q (scale q.k_j + mask, SOFT_MAX's
 * rounding: each dot in double rounded once, expf of the difference to the maximum, the
 * sum in double); false when every key is dropped (p all zero) */
static bool fa_probs(const struct fa_head *a, const float *q, const float *K, int64_t h, int64_t t,
                     int64_t s, float *p, float *mrow)
{
    const int64_t keep = fa_keep(a, t);
    /* positions: query t (key t + n_kv - T) sees its own example's keys, from its start on */
    const int64_t first = a->pos ? t + (a->nk - a->T) - a->pos[s * a->T + t] : 0;
    if (a->mask)
        lt_row_to_f32(a->mask, t, h % a->mask->ne[2], s % a->mask->ne[3], mrow);
    float mx = -INFINITY;
    for (int64_t j = 0; j < keep; j++) {
        double d = 0.0;
        for (int64_t i = 0; i < a->D; i++)
            d += (double)q[i] * K[j * a->D + i];
        p[j] = j < first ? -INFINITY : (float)d * a->scale + (a->mask ? mrow[j] : 0.0f);
        mx = p[j] > mx ? p[j] : mx;
    }
    if (mx == -INFINITY) {
        memset(p, 0, sizeof(float) * (size_t)a->nk);
        return false;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < keep; j++) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < keep; j++)
        p[j] *= inv;
    for (int64_t j = keep; j < a->nk; j++)
        p[j] = 0.0f;
    return true;
}

/* floats of one thread's scratch: K, V [n_kv][D]; p, the mask's row, dp [n_kv]; q, do, o,
 * an output row in double [D] (as two floats, aligned) */
static size_t fa_thread_floats(int64_t D, int64_t nk)
{
    return (size_t)((2 * nk * D + 3 * nk + 5 * D + 2 + 1) & ~(int64_t)1); /* even: doubles follow */
}

static size_t fa_work_size(const struct lt_tensor *node, int nth)
{
    const struct lt_tensor *k = node->src[node->op == LT_OP_FLASH_ATTN ? FA_K : FB_K];
    size_t per = fa_thread_floats(k->ne[0], k->ne[2]);
    if (node->op == LT_OP_FLASH_ATTN_BACK)
        per += 2 * (size_t)(k->ne[0] * k->ne[2]) * 2; /* dK, dV [n_kv][D] in double */
    return (size_t)nth * per * sizeof(float);
}

/* threads take (key head, sequence) pairs; each does every query head of the group */
static void fa_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct fa_head a =
        fa_head_of(node->src[FA_Q], node->src[FA_K], node->src[FA_V], node->src[FA_MASK], node);
    const int64_t D = a.D, nk = a.nk, G = a.H / a.Hkv;
    float *w = (float *)p->wdata + (size_t)p->ith * fa_thread_floats(D, nk);
    float *K = w, *V = K + nk * D, *pr = V + nk * D, *mrow = pr + nk, *q = mrow + 2 * nk;
    double *acc = (double *)(((uintptr_t)(q + D) + 7) & ~(uintptr_t)7); /* [D] */
    int64_t lo, hi;
    lt_split_range(a.Hkv * a.S, p->ith, p->nth, &lo, &hi);
    for (int64_t u = lo; u < hi; u++) {
        const int64_t hk = u % a.Hkv, s = u / a.Hkv;
        fa_load_kv(&a, hk, s, K, V);
        for (int64_t h = hk * G; h < (hk + 1) * G; h++)
            for (int64_t t = 0; t < a.T; t++) {
                float *o = (float *)lt_elem_ptr(node, 0, h, t, s);
                lt_row_to_f32(a.q, h, t, s, q);
                if (!fa_probs(&a, q, K, h, t, s, pr, mrow)) {
                    memset(o, 0, sizeof(float) * (size_t)D);
                    continue;
                }
                for (int64_t i = 0; i < D; i++)
                    acc[i] = 0.0;
                for (int64_t j = 0; j < nk; j++)
                    if (pr[j] != 0.0f)
                        for (int64_t i = 0; i < D; i++)
                            acc[i] += (double)pr[j] * V[j * D + i];
                for (int64_t i = 0; i < D; i++)
                    o[i] = (float)acc[i];
            }
    }
}

static void fa_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *gd = node->src[FB_DO], *ot = node->src[FB_O];
    const struct fa_head a =
        fa_head_of(node->src[FB_Q], node->src[FB_K], node->src[FB_V], node->src[FB_MASK], node);
    const int64_t D = a.D, nk = a.nk, G = a.H / a.Hkv;
    float *w =
        (float *)p->wdata + (size_t)p->ith * (fa_thread_floats(D, nk) + 2 * (size_t)(nk * D) * 2);
    float *K = w, *V = K + nk * D, *pr = V + nk * D, *mrow = pr + nk, *dp = mrow + nk, *q = dp + nk,
          *gdo = q + D, *o = gdo + D;
    double *dK = (double *)(w + fa_thread_floats(D, nk)), *dV = dK + nk * D;
    float *out = (float *)node->data;
    const int64_t n_q = D * a.H * a.T * a.S, n_k = D * a.Hkv * nk * a.S;
    float *dq_all = out, *dk_all = out + n_q, *dv_all = out + n_q + n_k;
    int64_t lo, hi;
    lt_split_range(a.Hkv * a.S, p->ith, p->nth, &lo, &hi);
    for (int64_t u = lo; u < hi; u++) {
        const int64_t hk = u % a.Hkv, s = u / a.Hkv;
        fa_load_kv(&a, hk, s, K, V);
        memset(dK, 0, sizeof(double) * (size_t)(2 * nk * D));
        for (int64_t h = hk * G; h < (hk + 1) * G; h++)
            for (int64_t t = 0; t < a.T; t++) {
                float *dq = dq_all + ((s * a.T + t) * a.H + h) * D;
                lt_row_to_f32(a.q, h, t, s, q);
                lt_row_to_f32(gd, h, t, s, gdo);
                lt_row_to_f32(ot, h, t, s, o);
                if (!fa_probs(&a, q, K, h, t, s, pr, mrow)) {
                    memset(dq, 0, sizeof(float) * (size_t)D);
                    continue;
                }
                double dd = 0.0;
                for (int64_t i = 0; i < D; i++)
                    dd += (double)gdo[i] * o[i];
                for (int64_t j = 0; j < nk; j++) {
                    if (pr[j] == 0.0f) {
                        dp[j] = 0.0f;
                        continue;
                    }
                    double x = 0.0;
                    for (int64_t i = 0; i < D; i++)
                        x += (double)gdo[i] * V[j * D + i];
                    dp[j] = (float)((double)pr[j] * (x - dd)); /* ds_j */
                }
                for (int64_t i = 0; i < D; i++) {
                    double x = 0.0;
                    for (int64_t j = 0; j < nk; j++)
                        x += (double)dp[j] * K[j * D + i];
                    dq[i] = (float)(x * a.scale);
                }
                for (int64_t j = 0; j < nk; j++) {
                    if (pr[j] == 0.0f)
                        continue;
                    const double ds = (double)dp[j] * a.scale, pj = pr[j];
                    for (int64_t i = 0; i < D; i++) {
                        dK[j * D + i] += ds * q[i];
                        dV[j * D + i] += pj * gdo[i];
                    }
                }
            }
        for (int64_t j = 0; j < nk; j++)
            for (int64_t i = 0; i < D; i++) {
                const int64_t e = ((s * nk + j) * a.Hkv + hk) * D + i;
                dk_all[e] = (float)dK[j * D + i];
                dv_all[e] = (float)dV[j * D + i];
            }
    }
}

/* ---- backward rule ---- */

static lt_status fa_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    if (node->src[FA_MASK] && lt_ad_wants(ad, node->src[FA_MASK]))
        return lt_fail(LT_ERR_UNSUPPORTED,
                       "flash_attn '%s': the mask '%s' is a constant, it has no gradient",
                       node->name, node->src[FA_MASK]->name);
    bool any = false;
    for (int i = FA_Q; i <= FA_V; i++)
        any = any || lt_ad_wants(ad, node->src[i]);
    if (!any)
        return LT_OK;
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    struct lt_tensor *r = lt_flash_attn_back(ctx, node->grad, node);
    if (!r)
        return lt_fail(LT_ERR_INVALID, "cannot build the gradient of '%s': %s", node->name,
                       lt_last_error());
    for (int i = FA_Q; i <= FA_V; i++) {
        if (!lt_ad_wants(ad, node->src[i]))
            continue;
        lt_status st = lt_ad_add(ad, node->src[i],
                                 lt_flash_attn_back_grad(ctx, r, (enum lt_flash_attn_grad)i));
        if (st != LT_OK)
            return st;
    }
    return LT_OK;
}

const struct lt_op_def lt_op_def_flash_attn = {
    .name = "FLASH_ATTN",
    .n_src = 4,
    .cpu_supported = fa_cpu_supported,
    .cpu_work_size = fa_work_size,
    .cpu_forward = fa_forward,
    .backward = fa_backward,
};

const struct lt_op_def lt_op_def_flash_attn_back = {
    .name = "FLASH_ATTN_BACK",
    .n_src = 6,
    .cpu_supported = fa_cpu_supported,
    .cpu_work_size = fa_work_size,
    .cpu_forward = fa_back_forward,
};
