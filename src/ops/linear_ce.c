/* linear_ce.c: LINEAR_CE, a language-model head and the mean next-token cross-entropy in one
 * op, and LINEAR_CE_BACK, its gradients with respect to the hidden states and the head;
 * constructors, shape rules, the backward rule and CPU kernels.
 *
 * w [D, V] (F32, F16 or BF16, contiguous rows: row v is token v's vector, as mul_mat's
 * weight), h [D, N] F32, labels I32 [N]. With z_n = w^T h_n (the logits of token n),
 *   loss = mean over the unmasked n of logsumexp(z_n) - z_n[label_n]
 * which is lt_cross_entropy(lt_mul_mat(w, h), labels) (src/ops/loss.c: masking, NaN for a
 * label >= V, sums in double), without the [V, N] logits: the CUDA kernels take the tokens
 * a chunk at a time, and the backward recomputes a chunk's logits instead of keeping them.
 * At Qwen3.5's 248,320-token vocabulary and 8,192 tokens a step, the logits and their
 * gradient were 16 GB.
 *
 * LINEAR_CE_BACK(grad_loss, w, h, labels) is one flat F32 tensor of the parts its
 * op_params[1] asks for (enum lt_linear_ce_part), in this order: dh [D, N], dw [D, V] (F32
 * whatever w's type), the loss (one float), with d z_n = grad_loss / n_valid (softmax(z_n) -
 * onehot(label_n)) for unmasked n and 0 otherwise, dh_n = w d z_n and dw = sum_n h_n d z_n^T.
 * The rule asks only for the gradients autodiff wants: a LoRA job's head is frozen, and its
 * dw (1 GB of F32 at Qwen3.5's head, and a product a chunk over all of it) was made and
 * thrown away.
 *
 * The loss part is for the loss that autodiff seeds (lt_ad_seeded: its gradient is the
 * constant grad_scale, nothing else added). The backward computes each chunk's logits
 * anyway, and the loss terms come from the same logits and the same log-sum-exp that d z
 * needs, so the rule asks for the loss too and makes the LINEAR_CE node a copy of that
 * element (lt_ad_fold_loss): the forward's logits product never runs, and a training step
 * takes three products over the head instead of four. The loss is the same value as
 * LINEAR_CE's, bit for bit on the CPU (the same functions in the same order). A graph
 * without a backward (evaluation, inference) keeps LINEAR_CE.
 *
 * The CPU kernels here are the oracle, written for clarity: each logit is a dot product in
 * double. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

static bool lce_shapes_ok(const struct lt_tensor *w, const struct lt_tensor *h,
                          const struct lt_tensor *labels)
{
    return lt_type_is_float(w->type) && w->ne[2] == 1 && w->ne[3] == 1 &&
           h->type == LT_TYPE_F32 && h->ne[0] == w->ne[0] && h->ne[2] == 1 && h->ne[3] == 1 &&
           labels->type == LT_TYPE_I32 && lt_nelements(labels) == h->ne[1] &&
           labels->ne[0] == h->ne[1];
}

static struct lt_tensor *lce_fail(const char *what, const struct lt_tensor *w,
                                  const struct lt_tensor *h, const struct lt_tensor *labels)
{
    lt_fail(LT_ERR_INVALID,
            "%s: head '%s' (%s [%lld, %lld, %lld, %lld]), hidden '%s' (%s [%lld, %lld, %lld, "
            "%lld]) and labels '%s' (%s [%lld]) must be float [D, V], f32 [D, N] and i32 [N]",
            what, w->name, lt_type_name(w->type), (long long)w->ne[0], (long long)w->ne[1],
            (long long)w->ne[2], (long long)w->ne[3], h->name, lt_type_name(h->type),
            (long long)h->ne[0], (long long)h->ne[1], (long long)h->ne[2], (long long)h->ne[3],
            labels->name, lt_type_name(labels->type), (long long)lt_nelements(labels));
    return NULL;
}

struct lt_tensor *lt_linear_cross_entropy(struct lt_ctx *ctx, struct lt_tensor *w,
                                          struct lt_tensor *h, struct lt_tensor *labels)
{
    LT_REQUIRE("linear_cross_entropy", w, h, labels);
    if (!lce_shapes_ok(w, h, labels))
        return lce_fail("linear_cross_entropy", w, h, labels);
    struct lt_tensor *r = lt_new_op_tensor(ctx, LT_OP_LINEAR_CE, LT_TYPE_F32, 1, (int64_t[]){1},
                                           (struct lt_tensor *[]){w, h, labels}, 3);
    if (r) {
        lt_set_param_i32(r, 0, 0);
        lt_format_name(r, "linear_ce(%s)", h->name);
    }
    return r;
}

void lt_linear_cross_entropy_set_chunk(struct lt_tensor *r, int32_t tokens)
{
    if (r && (r->op == LT_OP_LINEAR_CE || r->op == LT_OP_LINEAR_CE_BACK))
        lt_set_param_i32(r, 0, tokens);
}

static unsigned lce_parts(const struct lt_tensor *r)
{
    return (unsigned)lt_get_param_i32(r, 1);
}

/* at least one gradient, and no bit that is not a part */
static bool parts_valid(unsigned parts)
{
    const unsigned all = LT_LINEAR_CE_DH | LT_LINEAR_CE_DW | LT_LINEAR_CE_LOSS;
    return !(parts & ~all) && (parts & (LT_LINEAR_CE_DH | LT_LINEAR_CE_DW));
}

/* The elements that the parts of `parts` before part `before` take (before 0: all of them),
 * in the result's order: dh, dw, the loss (bit i is part i) */
static int64_t parts_size(const struct lt_tensor *w, const struct lt_tensor *h, unsigned parts,
                          unsigned before)
{
    const int64_t n[3] = {lt_nelements(h), lt_nelements(w), 1};
    int64_t total = 0;
    for (int i = 0; i < 3 && (1u << i) != before; i++)
        total += parts & (1u << i) ? n[i] : 0;
    return total;
}

int64_t lt_linear_cross_entropy_part_at(const struct lt_tensor *r, enum lt_linear_ce_part part)
{
    if (!r || r->op != LT_OP_LINEAR_CE_BACK || !(lce_parts(r) & (unsigned)part))
        return -1;
    return parts_size(r->src[1], r->src[2], lce_parts(r), (unsigned)part);
}

bool lt_linear_cross_entropy_back_fits(const struct lt_tensor *r)
{
    return r->op == LT_OP_LINEAR_CE_BACK && parts_valid(lce_parts(r)) &&
           lce_shapes_ok(r->src[1], r->src[2], r->src[3]) && lt_nelements(r->src[0]) == 1 &&
           lt_nelements(r) == parts_size(r->src[1], r->src[2], lce_parts(r), 0);
}

struct lt_tensor *lt_linear_cross_entropy_back_parts(struct lt_ctx *ctx,
                                                     struct lt_tensor *grad_loss,
                                                     struct lt_tensor *w, struct lt_tensor *h,
                                                     struct lt_tensor *labels, unsigned parts)
{
    LT_REQUIRE("linear_cross_entropy_back", grad_loss, w, h, labels);
    if (!lce_shapes_ok(w, h, labels))
        return lce_fail("linear_cross_entropy_back", w, h, labels);
    if (grad_loss->type != LT_TYPE_F32 || lt_nelements(grad_loss) != 1) {
        lt_fail(LT_ERR_INVALID, "linear_cross_entropy_back: grad '%s' must be one f32",
                grad_loss->name);
        return NULL;
    }
    if (!parts_valid(parts)) {
        lt_fail(LT_ERR_INVALID,
                "linear_cross_entropy_back of '%s': parts %#x must name dh, dw or both "
                "(LT_LINEAR_CE_DH, LT_LINEAR_CE_DW), and may add LT_LINEAR_CE_LOSS",
                h->name, parts);
        return NULL;
    }
    const int64_t n = parts_size(w, h, parts, 0);
    struct lt_tensor *r = lt_new_op_tensor(ctx, LT_OP_LINEAR_CE_BACK, LT_TYPE_F32, 1, &n,
                                           (struct lt_tensor *[]){grad_loss, w, h, labels}, 4);
    if (r) {
        lt_set_param_i32(r, 0, 0);
        lt_set_param_i32(r, 1, (int32_t)parts);
        lt_format_name(r, "linear_ce_back(%s)", h->name);
    }
    return r;
}

struct lt_tensor *lt_linear_cross_entropy_back(struct lt_ctx *ctx, struct lt_tensor *grad_loss,
                                               struct lt_tensor *w, struct lt_tensor *h,
                                               struct lt_tensor *labels)
{
    return lt_linear_cross_entropy_back_parts(ctx, grad_loss, w, h, labels,
                                              LT_LINEAR_CE_DH | LT_LINEAR_CE_DW);
}

/* A view of part `part` of r, shaped like h or w, or [1] for the loss; `what` names the
 * caller (lt_linear_cross_entropy_back_<what>) in messages */
static struct lt_tensor *back_part(struct lt_ctx *ctx, struct lt_tensor *r,
                                   enum lt_linear_ce_part part, const char *what)
{
    const char *part_name = part == LT_LINEAR_CE_DH   ? "dh"
                            : part == LT_LINEAR_CE_DW ? "dw"
                                                      : "loss";
    if (!r || r->op != LT_OP_LINEAR_CE_BACK) {
        lt_fail(LT_ERR_INVALID, "linear_cross_entropy_back_%s: '%s' is not LINEAR_CE_BACK", what,
                r ? r->name : "(null)");
        return NULL;
    }
    const int64_t at = lt_linear_cross_entropy_part_at(r, part);
    if (at < 0) {
        lt_fail(LT_ERR_INVALID, "linear_cross_entropy_back_%s: '%s' was built without its %s part",
                what, r->name, part_name);
        return NULL;
    }
    const size_t f = sizeof(float);
    if (part == LT_LINEAR_CE_LOSS) {
        struct lt_tensor *t = lt_view_1d(ctx, r, 1, f * (size_t)at);
        if (t)
            lt_format_name(t, "loss of %s", r->name);
        return t;
    }
    const struct lt_tensor *like = r->src[part == LT_LINEAR_CE_DW ? 1 : 2];
    struct lt_tensor *t =
        lt_view_2d(ctx, r, like->ne[0], like->ne[1], f * (size_t)like->ne[0], f * (size_t)at);
    if (t)
        lt_format_name(t, "d %s", like->name);
    return t;
}

struct lt_tensor *lt_linear_cross_entropy_back_h(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("linear_cross_entropy_back_h", r);
    return back_part(ctx, r, LT_LINEAR_CE_DH, "h");
}

struct lt_tensor *lt_linear_cross_entropy_back_w(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("linear_cross_entropy_back_w", r);
    return back_part(ctx, r, LT_LINEAR_CE_DW, "w");
}

struct lt_tensor *lt_linear_cross_entropy_back_loss(struct lt_ctx *ctx, struct lt_tensor *r)
{
    LT_REQUIRE("linear_cross_entropy_back_loss", r);
    return back_part(ctx, r, LT_LINEAR_CE_LOSS, "loss");
}

/* ---- CPU ---- */

static bool lce_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    const int s0 = node->op == LT_OP_LINEAR_CE_BACK ? 1 : 0;
    const struct lt_tensor *w = node->src[s0], *h = node->src[s0 + 1], *labels = node->src[s0 + 2];
    if (!lce_shapes_ok(w, h, labels)) {
        snprintf(reason, reason_size, "the sources are not float [D, V], f32 [D, N], i32 [N]");
        return false;
    }
    if (w->nb[0] != lt_type_traits(w->type)->type_size) {
        snprintf(reason, reason_size, "the head's rows are not contiguous");
        return false;
    }
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node)) {
        snprintf(reason, reason_size, "the result is not contiguous f32");
        return false;
    }
    if (s0 && !lt_linear_cross_entropy_back_fits(node)) {
        snprintf(reason, reason_size,
                 "its parts (op_params[1] %#x) do not fit the result's %lld elements",
                 (unsigned)lce_parts(node), (long long)lt_nelements(node));
        return false;
    }
    return true;
}

static int32_t label_at(const struct lt_tensor *labels, int64_t n)
{
    int32_t v;
    memcpy(&v, (const char *)labels->data + n * labels->nb[0], sizeof(v));
    return v;
}

/* What the kernels keep of each token: its logits' max and log-sum-exp (d z needs them), and
 * its loss (0 masked, NaN for a label >= V) */
struct token_stats {
    double mx, lse, loss;
};

/* per thread: a row of w as floats [D], h_n [D], the logits of one token [V] */
static size_t lce_thread_floats(const struct lt_tensor *w)
{
    return 2 * lt_scratch_floats(w->ne[0]) + lt_scratch_floats(w->ne[1]);
}

static size_t lce_work_size(const struct lt_tensor *node, int nth)
{
    const int s0 = node->op == LT_OP_LINEAR_CE_BACK ? 1 : 0;
    const struct lt_tensor *w = node->src[s0], *h = node->src[s0 + 1];
    /* the threads' floats first: a multiple of 16 floats, so the stats stay aligned */
    return sizeof(float) * lce_thread_floats(w) * (size_t)nth +
           sizeof(struct token_stats) * (size_t)h->ne[1];
}

static double dot_d(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * (double)b[i];
    return s;
}

/* z = w^T h_n, each logit rounded to float as a product's result is */
static void token_logits(const struct lt_tensor *w, const struct lt_tensor *h, int64_t n,
                         float *row, float *hn, float *z)
{
    const int64_t D = w->ne[0], V = w->ne[1];
    lt_row_to_f32(h, n, 0, 0, hn);
    for (int64_t v = 0; v < V; v++) {
        const float *wr = lt_row_f32(w, v, 0, 0, row);
        z[v] = (float)dot_d(wr, hn, D);
    }
}

/* max and log(sum(exp(z - max))) of z [V] */
static void logits_lse(const float *z, int64_t V, double *mx_out, double *lse_out)
{
    float mx = -INFINITY;
    for (int64_t v = 0; v < V; v++)
        mx = z[v] > mx ? z[v] : mx;
    double sum = 0;
    for (int64_t v = 0; v < V; v++)
        sum += exp((double)z[v] - (double)mx);
    *mx_out = mx;
    *lse_out = log(sum);
}

struct lce_bufs {
    float *row, *hn, *z;
    struct token_stats *tok; /* [N], shared */
};

static struct lce_bufs lce_bufs_of(const struct lt_compute_params *p, const struct lt_tensor *w)
{
    const size_t per = lce_thread_floats(w), D = lt_scratch_floats(w->ne[0]);
    float *base = (float *)p->wdata + per * (size_t)p->ith;
    struct lce_bufs b = {base, base + D, base + 2 * D,
                         (struct token_stats *)((float *)p->wdata + per * (size_t)p->nth)};
    return b;
}

/* Token n's logits into b->z and its stats into b->tok[n]; false (the stats of a token
 * without logits) when its label is masked or past the vocabulary */
static bool token_stats(const struct lt_tensor *w, const struct lt_tensor *h, int32_t label,
                        int64_t n, struct lce_bufs *b)
{
    struct token_stats *t = &b->tok[n];
    if (label < 0 || label >= w->ne[1]) {
        *t = (struct token_stats){0, 0, label < 0 ? 0 : NAN};
        return false;
    }
    token_logits(w, h, n, b->row, b->hn, b->z);
    logits_lse(b->z, w->ne[1], &t->mx, &t->lse);
    t->loss = t->mx + t->lse - (double)b->z[label];
    return true;
}

/* the mean of the unmasked tokens' losses, 0 when every label is masked */
static float mean_loss(const struct token_stats *tok, const struct lt_tensor *labels, int64_t N)
{
    double total = 0;
    int64_t n_valid = 0;
    for (int64_t n = 0; n < N; n++) {
        if (label_at(labels, n) < 0)
            continue;
        total += tok[n].loss;
        n_valid++;
    }
    return n_valid ? (float)(total / (double)n_valid) : 0.0f;
}

static void lce_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *w = node->src[0], *h = node->src[1], *labels = node->src[2];
    const int64_t N = h->ne[1];
    struct lce_bufs b = lce_bufs_of(p, w);
    int64_t lo, hi;
    lt_split_range(N, p->ith, p->nth, &lo, &hi);
    for (int64_t n = lo; n < hi; n++)
        token_stats(w, h, label_at(labels, n), n, &b);
    lt_compute_barrier(p);
    if (p->ith == 0)
        *(float *)node->data = mean_loss(b.tok, labels, N);
}

/* d z_n[v] given the token's max and lse: (softmax - onehot) coef, the label's in double */
static float dlogit(float z, int64_t v, int32_t label, double mx, double lse, double coef)
{
    const double pv = coef * exp((double)z - mx - lse);
    return (float)(v == label ? pv - coef : pv);
}

/* part `part` of the result, NULL when not asked for */
static float *part_data(struct lt_tensor *node, enum lt_linear_ce_part part)
{
    const int64_t at = lt_linear_cross_entropy_part_at(node, part);
    return at < 0 ? NULL : (float *)node->data + at;
}

static void lce_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *w = node->src[1], *h = node->src[2], *labels = node->src[3];
    const int64_t D = w->ne[0], V = w->ne[1], N = h->ne[1];
    struct lce_bufs b = lce_bufs_of(p, w);
    float *dh = part_data(node, LT_LINEAR_CE_DH), *dw = part_data(node, LT_LINEAR_CE_DW),
          *loss = part_data(node, LT_LINEAR_CE_LOSS);
    int64_t n_valid = 0;
    for (int64_t n = 0; n < N; n++)
        n_valid += label_at(labels, n) >= 0;
    float g;
    memcpy(&g, node->src[0]->data, sizeof(g));
    const double coef = n_valid ? (double)g / (double)n_valid : 0.0;
    /* tokens: each one's stats, then (dh asked for) dh_n = w d z_n */
    int64_t lo, hi;
    lt_split_range(N, p->ith, p->nth, &lo, &hi);
    for (int64_t n = lo; n < hi; n++) {
        const int32_t label = label_at(labels, n);
        float *dhn = dh ? dh + n * D : NULL;
        if (dhn)
            memset(dhn, 0, sizeof(float) * (size_t)D);
        if (!token_stats(w, h, label, n, &b) || !dhn)
            continue;
        const struct token_stats *t = &b.tok[n];
        for (int64_t v = 0; v < V; v++) {
            const float d = dlogit(b.z[v], v, label, t->mx, t->lse, coef);
            const float *wr = lt_row_f32(w, v, 0, 0, b.row);
            for (int64_t i = 0; i < D; i++)
                dhn[i] += d * wr[i];
        }
    }
    lt_compute_barrier(p);
    if (loss && p->ith == 0)
        *loss = mean_loss(b.tok, labels, N);
    if (!dw)
        return;
    /* head rows: dw_v = sum_n d z_n[v] h_n, the logit recomputed */
    lt_split_range(V, p->ith, p->nth, &lo, &hi);
    for (int64_t v = lo; v < hi; v++) {
        float *dwv = dw + v * D;
        memset(dwv, 0, sizeof(float) * (size_t)D);
        const float *wr = lt_row_f32(w, v, 0, 0, b.row);
        for (int64_t n = 0; n < N; n++) {
            const int32_t label = label_at(labels, n);
            if (label < 0 || label >= V)
                continue;
            lt_row_to_f32(h, n, 0, 0, b.hn);
            const float z = (float)dot_d(wr, b.hn, D);
            const float d = dlogit(z, v, label, b.tok[n].mx, b.tok[n].lse, coef);
            for (int64_t i = 0; i < D; i++)
                dwv[i] += d * b.hn[i];
        }
    }
}

/* ---- backward rule ---- */

/* The head and the hidden states get their parts of one LINEAR_CE_BACK, which makes only
 * the gradients wanted; the labels get none. When this node is the loss autodiff seeds, the
 * same node computes the loss, and this node becomes a copy of it (the file's comment). */
static lt_status lce_rule(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *w = node->src[0], *h = node->src[1];
    const bool dw = lt_ad_wants(ad, w), dh = lt_ad_wants(ad, h);
    if (!dw && !dh)
        return LT_OK;
    const bool fold = lt_ad_seeded(ad, node);
    const unsigned parts =
        (dh ? LT_LINEAR_CE_DH : 0u) | (dw ? LT_LINEAR_CE_DW : 0u) | (fold ? LT_LINEAR_CE_LOSS : 0u);
    struct lt_ctx *ctx = lt_ad_ctx(ad);
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad);
    struct lt_tensor *hc = lt_ad_contiguous(ad, h);
    struct lt_tensor *labels = lt_ad_contiguous(ad, node->src[2]);
    struct lt_tensor *r =
        g && hc && labels ? lt_linear_cross_entropy_back_parts(ctx, g, w, hc, labels, parts) : NULL;
    if (!r)
        return lt_fail(LT_ERR_INVALID, "cannot build the gradient of '%s': %s", node->name,
                       lt_last_error());
    lt_linear_cross_entropy_set_chunk(r, lt_get_param_i32(node, 0));
    lt_status st = LT_OK;
    if (dh)
        st = lt_ad_add(ad, h, lt_linear_cross_entropy_back_h(ctx, r));
    /* the head's part of r is w's alone (r's other parts lie apart from it): handed over, a
     * tied embedding's rows add into it in place */
    if (st == LT_OK && dw)
        st = lt_ad_add_owned(ad, w, lt_linear_cross_entropy_back_w(ctx, r));
    if (st == LT_OK && fold)
        st = lt_ad_fold_loss(ad, node, lt_linear_cross_entropy_back_loss(ctx, r));
    return st;
}

const struct lt_op_def lt_op_def_linear_ce = {
    .name = "LINEAR_CE",
    .n_src = 3,
    .cpu_supported = lce_supported,
    .cpu_work_size = lce_work_size,
    .cpu_forward = lce_forward,
    .backward = lce_rule,
};

const struct lt_op_def lt_op_def_linear_ce_back = {
    .name = "LINEAR_CE_BACK",
    .n_src = 4,
    .cpu_supported = lce_supported,
    .cpu_work_size = lce_work_size,
    .cpu_forward = lce_back_forward,
};
