/* loss.c: CROSS_ENTROPY (mean next-token loss) and CROSS_ENTROPY_BACK (dL/dlogits), with
 * their CPU kernels.
 *
 * logits [V, N] F32 with any strides, labels I32 [N]; a label < 0 is masked out (no loss,
 * no gradient) and the mean is over the n_valid unmasked rows (0 when there are none).
 * Per row, loss = logsumexp(x) - x[label], with the max subtracted and the exponentials
 * summed in double. The forward keeps one double per row in scratch and thread 0 adds
 * them in row order after a barrier, so the loss does not depend on the thread count.
 * A label >= V cannot be reported from a kernel; it makes the loss NaN (loud, where the
 * training loop looks) and gets no gradient.
 *
 * Backward rule: CROSS_ENTROPY -> CROSS_ENTROPY_BACK with the incoming dL/dloss (one F32,
 * read by the kernel, so a scaled or micro-batched loss scales the gradient); the labels
 * are integers and get none. The kernel takes any strides, but it is handed contiguous
 * logits and labels, as every backward kernel is (a no-op for mul_mat's logits). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lathe/ops.h"
#include "ops/grad.h"
#include "ops/op.h"

static bool ce_shapes_ok(const struct lt_tensor *logits, const struct lt_tensor *labels)
{
    return logits->type == LT_TYPE_F32 && logits->ne[2] == 1 && logits->ne[3] == 1 &&
           labels->type == LT_TYPE_I32 && labels->ne[0] == logits->ne[1] &&
           lt_nelements(labels) == logits->ne[1];
}

static struct lt_tensor *ce_fail(const char *what, const struct lt_tensor *logits,
                                 const struct lt_tensor *labels)
{
    lt_fail(LT_ERR_INVALID,
            "%s: logits '%s' (%s [%lld, %lld, %lld, %lld]) must be f32 [V, N] and labels '%s' "
            "(%s [%lld]) i32 [N]",
            what, logits->name, lt_type_name(logits->type), (long long)logits->ne[0],
            (long long)logits->ne[1], (long long)logits->ne[2], (long long)logits->ne[3],
            labels->name, lt_type_name(labels->type), (long long)lt_nelements(labels));
    return NULL;
}

struct lt_tensor *lt_cross_entropy(struct lt_ctx *ctx, struct lt_tensor *logits,
                                   struct lt_tensor *labels)
{
    LT_REQUIRE("cross_entropy", logits, labels);
    if (!ce_shapes_ok(logits, labels))
        return ce_fail("cross_entropy", logits, labels);
    return lt_new_op_tensor(ctx, LT_OP_CROSS_ENTROPY, LT_TYPE_F32, 1, (int64_t[]){1},
                            (struct lt_tensor *[]){logits, labels}, 2);
}

struct lt_tensor *lt_cross_entropy_back(struct lt_ctx *ctx, struct lt_tensor *grad_loss,
                                        struct lt_tensor *logits, struct lt_tensor *labels)
{
    LT_REQUIRE("cross_entropy_back", grad_loss, logits, labels);
    if (!ce_shapes_ok(logits, labels))
        return ce_fail("cross_entropy_back", logits, labels);
    if (grad_loss->type != LT_TYPE_F32 || lt_nelements(grad_loss) != 1) {
        lt_fail(LT_ERR_INVALID, "cross_entropy_back: grad '%s' must be one f32", grad_loss->name);
        return NULL;
    }
    return lt_new_op_tensor(ctx, LT_OP_CROSS_ENTROPY_BACK, LT_TYPE_F32, 2, logits->ne,
                            (struct lt_tensor *[]){grad_loss, logits, labels}, 3);
}

/* ---- CPU ---- */

static bool ce_supported(const struct lt_tensor *node, char *reason, size_t reason_size)
{
    bool back = node->op == LT_OP_CROSS_ENTROPY_BACK;
    const struct lt_tensor *logits = node->src[back ? 1 : 0], *labels = node->src[back ? 2 : 1];
    if (!ce_shapes_ok(logits, labels)) {
        snprintf(reason, reason_size, "the logits are not f32 [V, N] or the labels not i32 [N]");
        return false;
    }
    if (back && (node->src[0]->type != LT_TYPE_F32 || lt_nelements(node->src[0]) != 1)) {
        snprintf(reason, reason_size, "source 0 (the loss gradient) is not one f32");
        return false;
    }
    if (node->type != LT_TYPE_F32 || !lt_is_contiguous(node) ||
        (back ? !lt_same_shape(node, logits) : lt_nelements(node) != 1)) {
        snprintf(reason, reason_size, "the result is not contiguous f32 of the right shape");
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

/* max and sum(exp(x - max)) of row n of logits */
static void row_lse(const struct lt_tensor *logits, int64_t n, double *mx_out, double *sum_out)
{
    const char *row = (const char *)logits->data + n * logits->nb[1];
    size_t s0 = logits->nb[0];
    int64_t V = logits->ne[0];
    float mx = -INFINITY;
    for (int64_t i = 0; i < V; i++) {
        float x = *(const float *)(row + i * s0);
        mx = x > mx ? x : mx;
    }
    double sum = 0;
    for (int64_t i = 0; i < V; i++)
        sum += exp((double)*(const float *)(row + i * s0) - (double)mx);
    *mx_out = mx;
    *sum_out = sum;
}

static size_t ce_work_size(const struct lt_tensor *node, int nth)
{
    return (size_t)node->src[0]->ne[1] * sizeof(double);
}

static void ce_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *logits = node->src[0], *labels = node->src[1];
    int64_t V = logits->ne[0], N = logits->ne[1], lo, hi;
    double *row_loss = p->wdata;
    lt_split_range(N, p->ith, p->nth, &lo, &hi);
    for (int64_t n = lo; n < hi; n++) {
        int32_t label = label_at(labels, n);
        if (label < 0) {
            row_loss[n] = 0;
            continue;
        }
        if (label >= V) {
            row_loss[n] = NAN;
            continue;
        }
        double mx, sum;
        row_lse(logits, n, &mx, &sum);
        double x = *(const float *)((const char *)logits->data + label * logits->nb[0] +
                                    n * logits->nb[1]);
        row_loss[n] = mx + log(sum) - x;
    }
    lt_compute_barrier(p);
    if (p->ith != 0)
        return;
    double total = 0;
    int64_t n_valid = 0;
    for (int64_t n = 0; n < N; n++) {
        if (label_at(labels, n) < 0)
            continue;
        total += row_loss[n];
        n_valid++;
    }
    *(float *)node->data = n_valid ? (float)(total / (double)n_valid) : 0.0f;
}

static void ce_back_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    const struct lt_tensor *logits = node->src[1], *labels = node->src[2];
    int64_t V = logits->ne[0], N = logits->ne[1], lo, hi;
    int64_t n_valid = 0;
    for (int64_t n = 0; n < N; n++)
        n_valid += label_at(labels, n) >= 0;
    float g;
    memcpy(&g, node->src[0]->data, sizeof(g));
    double coef = n_valid ? (double)g / (double)n_valid : 0.0;
    lt_split_range(N, p->ith, p->nth, &lo, &hi);
    for (int64_t n = lo; n < hi; n++) {
        float *d = (float *)node->data + n * V;
        int32_t label = label_at(labels, n);
        if (label < 0 || label >= V) {
            memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        double mx, sum;
        row_lse(logits, n, &mx, &sum);
        const char *row = (const char *)logits->data + n * logits->nb[1];
        size_t s0 = logits->nb[0];
        double c = coef / sum;
        for (int64_t i = 0; i < V; i++)
            d[i] = (float)(c * exp((double)*(const float *)(row + i * s0) - mx));
        /* p - 1 in double: p near 1 would lose its digits if rounded to float first */
        double pl = c * exp((double)*(const float *)(row + label * s0) - mx);
        d[label] = (float)(pl - coef);
    }
}

/* ---- backward rule ---- */

static lt_status ce_rule(struct lt_autodiff *ad, struct lt_tensor *node)
{
    struct lt_tensor *logits = node->src[0];
    if (!lt_ad_wants(ad, logits))
        return LT_OK;
    struct lt_tensor *g = lt_ad_contiguous(ad, node->grad);
    struct lt_tensor *x = lt_ad_contiguous(ad, logits);
    struct lt_tensor *labels = lt_ad_contiguous(ad, node->src[1]);
    if (!g || !x || !labels)
        return lt_fail(LT_ERR_NOMEM, "out of memory for the gradient of '%s'", logits->name);
    return lt_ad_add(ad, logits, lt_cross_entropy_back(lt_ad_ctx(ad), g, x, labels));
}

const struct lt_op_def lt_op_def_cross_entropy = {
    .name = "CROSS_ENTROPY",
    .n_src = 2,
    .cpu_supported = ce_supported,
    .cpu_work_size = ce_work_size,
    .cpu_forward = ce_forward,
    .backward = ce_rule,
};

const struct lt_op_def lt_op_def_cross_entropy_back = {
    .name = "CROSS_ENTROPY_BACK",
    .n_src = 3,
    .cpu_supported = ce_supported,
    .cpu_work_size = NULL,
    .cpu_forward = ce_back_forward,
};
