/* fill.c: FILL, a computed constant (zeros to accumulate gradients into, the seed 1 of the
 * loss gradient). It reads no source, so it costs no memory until it is scheduled. */
#include "lathe/ops.h"
#include "ops/op.h"

struct lt_tensor *lt_fill(struct lt_ctx *ctx, struct lt_tensor *like, float value)
{
    LT_REQUIRE("fill", like);
    struct lt_tensor *t = lt_new_op_tensor(ctx, LT_OP_FILL, LT_TYPE_F32, LT_MAX_DIMS, like->ne,
                                           NULL, 0);
    if (t)
        lt_set_param_f32(t, 0, value);
    return t;
}

static void fill_forward(const struct lt_compute_params *p, struct lt_tensor *node)
{
    float v = lt_get_param_f32(node, 0);
    int64_t lo, hi, n = lt_nelements(node);
    lt_split_range(n, p->ith, p->nth, &lo, &hi);
    float *d = node->data;
    for (int64_t i = lo; i < hi; i++)
        d[i] = v;
}

/* A constant has no inputs, so no gradient flows anywhere from it. */
static lt_status fill_backward(struct lt_autodiff *ad, struct lt_tensor *node)
{
    (void)ad;
    (void)node;
    return LT_OK;
}

const struct lt_op_def lt_op_def_fill = {
    .name = "FILL", .n_src = 0, .cpu_forward = fill_forward, .backward = fill_backward};
