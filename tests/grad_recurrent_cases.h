/* grad_recurrent_cases.h: the recurrent ops' backward rules through autodiff, checked by
 * finite differences over input layouts (gradcheck.h): ssm_conv, conv_silu, and delta_net's packed
 * result, output and state. test_ops_recurrent.c runs them on the CPU, test_grad_sched.c
 * and gpu/test_cuda_gradcheck.c through the scheduler. */
#ifndef LATHE_TESTS_GRAD_RECURRENT_CASES_H
#define LATHE_TESTS_GRAD_RECURRENT_CASES_H

#include "gradcheck.h"
#include "ops/op.h"

/* ---- backward rules, through autodiff, over input layouts (tests/gradcheck.h) ---- */

static struct lt_tensor *gc_ssm_conv(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_ssm_conv(ctx, x[0], x[1]);
}

static struct lt_tensor *gc_conv_silu(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    (void)user;
    return lt_conv_silu(ctx, x[0], x[1]);
}

enum gc_dn_part { GC_DN_ALL, GC_DN_OUTPUT, GC_DN_STATE };

static struct lt_tensor *gc_delta_net(struct lt_ctx *ctx, struct lt_tensor **x, void *user)
{
    enum gc_dn_part part = *(enum gc_dn_part *)user;
    struct lt_tensor *r = lt_delta_net(ctx, x[0], x[1], x[2], x[3], x[4], x[5], 0.5f);
    if (!r || part == GC_DN_ALL)
        return r;
    return part == GC_DN_OUTPUT ? lt_delta_net_output(ctx, r) : lt_delta_net_state(ctx, r);
}

/* gradcheck.h's loss is sum(y * w): it needs MUL's and SUM's rules (src/ops, not here) */
static bool loss_rules_ready(void)
{
    return lt_op_def(LT_OP_MUL)->backward && lt_op_def(LT_OP_SUM)->backward;
}

/* no op's sources are held to contiguity here (gc_check_backward_graph's layout rule) */
static bool dn_layout_free(enum lt_op op)
{
    (void)op;
    return false;
}

/* GC_PERMUTED is left out: gradcheck.h's permuted view does not have the shape asked for */
static const enum gc_layout gc_layouts[] = {GC_CONTIGUOUS, GC_TRANSPOSED, GC_SLICED};

static void test_backward_rules(void)
{
    if (!loss_rules_ready()) {
        printf("backward rules through autodiff: skipped (MUL or SUM has no backward rule yet)\n");
        return;
    }
    for (int li = 0; li < 3; li++) {
        const struct gc_input in[2] = {
            {LT_TYPE_F32, {7, 5, 2, 1}, gc_layouts[li], true, -1, 1},
            {LT_TYPE_F32, {4, 5, 1, 1}, gc_layouts[(li + 1) % 3], true, -1, 1},
        };
        double e = gradcheck("ssm_conv", gc_ssm_conv, NULL, in, 2, 1e-2);
        printf("ssm_conv (sx %s) through autodiff: worst gradient error %.2e\n",
               gc_layout_names[gc_layouts[li]], e);
    }
    /* CONV_SILU: x [5 channels, 7 steps, 2 sequences] (a device runs the contiguous one; the
     * others go to the CPU), w of 4 taps; and 40 steps (two of the device's step blocks) */
    for (int li = 0; li < 4; li++) {
        const struct gc_input in[2] = {
            {LT_TYPE_F32, {5, li < 3 ? 7 : 40, 2, 1}, gc_layouts[li % 3], true, -1, 1},
            {LT_TYPE_F32, {4, 5, 1, 1}, gc_layouts[(li + 1) % 3], true, -1, 1},
        };
        double e = gradcheck("conv_silu", gc_conv_silu, NULL, in, 2, 1e-2);
        printf("conv_silu (x %s, T %lld) through autodiff: worst gradient error %.2e\n",
               gc_layout_names[gc_layouts[li % 3]], (long long)in[0].ne[1], e);
    }
    const int64_t lens[] = {3, 70};
    int n_acc_packed[2] = {0, 0};
    for (int part = GC_DN_ALL; part <= GC_DN_STATE; part++)
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            const int64_t nt = lens[li];
            /* q a slice (as of a fused projection), k, v and the state transposed; |k| <= 1
             * keeps the rule contracting */
            const struct gc_input in[6] = {
                {LT_TYPE_F32, {4, 1, nt, 2}, GC_SLICED, true, -0.5f, 0.5f},
                {LT_TYPE_F32, {4, 1, nt, 2}, GC_TRANSPOSED, true, -0.5f, 0.5f},
                {LT_TYPE_F32, {3, 2, nt, 2}, GC_TRANSPOSED, true, -1, 1},
                {LT_TYPE_F32, {2, nt, 2, 1}, GC_CONTIGUOUS, true, -2, 0},
                {LT_TYPE_F32, {2, nt, 2, 1}, GC_SLICED, true, 0.1f, 0.9f},
                {LT_TYPE_F32, {3, 4, 2, 2}, GC_TRANSPOSED, true, -0.5f, 0.5f},
            };
            char name[64];
            snprintf(name, sizeof(name), "delta_net %s T=%lld",
                     part == GC_DN_ALL      ? "packed"
                     : part == GC_DN_OUTPUT ? "output"
                                            : "state",
                     (long long)nt);
            enum gc_dn_part pp = part;
            double e = gradcheck(name, gc_delta_net, &pp, in, 6, 1e-2);
            printf("%s through autodiff: worst gradient error %.2e\n", name, e);
            /* the output's gradient alone goes to DELTA_NET_BACK as it is: no ACC into a
             * zero of the packed result beyond the packed case's (the sliced inputs' own);
             * the state's gradient still takes one */
            int n_acc = -1;
            const uint64_t rng = gc_rng; /* the next cases' inputs stay what they were */
            CHECK(gc_check_backward_graph(name, gc_delta_net, &pp, in, 6, dn_layout_free,
                                          LT_OP_ACC, &n_acc) > 0,
                  "%s: backward graph", name);
            gc_rng = rng;
            if (part == GC_DN_ALL)
                n_acc_packed[li] = n_acc;
            else
                CHECK(n_acc == n_acc_packed[li] + (part == GC_DN_STATE),
                      "%s: %d ACC nodes in the backward graph (the packed result's: %d)", name,
                      n_acc, n_acc_packed[li]);
        }
}

#endif
