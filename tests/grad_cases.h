/* grad_cases.h: every finite-difference gradient case of the CPU tests (test_grad_basic.c,
 * test_grad_basic_copy.c, test_grad_nn.c, test_ops_recurrent.c), run through the scheduler
 * on a list of backends such as {CUDA0, CPU}: forward and backward nodes on the first
 * backend that takes them, the rest counted as fallbacks and listed with the first
 * backend's reason. Prints one row per family of cases: the layouts its inputs came in,
 * the worst relative gradient error, and the nodes placed on the first backend and off it.
 * test_grad_sched.c runs it on CUDA emulated on the CPU, gpu/test_cuda_gradcheck.c on the
 * GPU. */
#ifndef LATHE_TESTS_GRAD_CASES_H
#define LATHE_TESTS_GRAD_CASES_H

#include "grad_basic_cases.h"
#include "grad_copy_cases.h"
#include "grad_nn_cases.h"
#include "grad_recurrent_cases.h"

struct grad_family {
    const char *name;
    void (*run)(void);
};

static const struct grad_family grad_families[] = {
    {"unary (scale silu sigmoid softplus exp log sqr ...)", test_unary},
    {"swiglu", test_swiglu},
    {"binary (add sub mul div, b broadcast)", test_binary},
    {"reduce (sum_rows mean sum)", test_reduce},
    {"cont, cpy", test_cont_cpy},
    {"concat", test_concat},
    {"repeat, repeat_back", test_repeat},
    {"get_rows, get_rows_back", test_get_rows},
    {"acc", test_acc},
    {"mul_mat (GQA heads, odd K, N=1, M=1)", test_mul_mat},
    {"mul_mat(x, x)", test_mul_mat_same_source},
    {"mul_mat_acc (c + a b over c)", test_mul_mat_acc},
    {"mul_mat of joined operands ([a0 ; a1] [b0 ; b1], LoRA)", test_joined_product},
    {"mul_mat, frozen F16/BF16/Q8_0 a", test_mul_mat_frozen_types},
    {"rms_norm, l2_norm", test_norms},
    {"rms_norm * w (* silu(z)), fused", test_norm_mul},
    {"x + rms_norm(x) * w * v (the residual's gradient in the norm's)", test_norm_residual},
    {"l2_norm of a viewed k_conv", test_l2_norm_of_k_conv},
    {"rope (normal, neox, partial)", test_rope},
    {"soft_max (scale, causal, masks)", test_soft_max},
    {"cross_entropy", test_cross_entropy},
    {"lm head (rms_norm, mul_mat, cross_entropy)", test_lm_head},
    {"linear_ce (the head and the loss in one)", test_linear_ce},
    {"tied embedding (get_rows into linear_ce's head)", test_tied_embedding},
    {"GQA attention", test_attention},
    {"flash_attn (causal, groups, masks)", test_flash_attn},
    {"ssm_conv, delta_net", test_backward_rules},
};

#define GRAD_FAMILY_COUNT ((int)(sizeof(grad_families) / sizeof(grad_families[0])))

/* Runs every family on backends (placed by the scheduler) and prints the table. Returns
 * the number of nodes placed on backends[0] in all, so a caller can show the device ran
 * something. */
static inline long grad_cases_run(struct lt_backend *const *backends, int n_backends)
{
    long on_first = 0, fell_back = 0;
    double worst_all = 0;
    gc_device_use(backends, n_backends);
    printf("%-50s %-38s %5s %9s %8s %8s\n", "case", "layouts", "runs", "worst rel", "on first",
           "fallback");
    for (int f = 0; f < GRAD_FAMILY_COUNT; f++) {
        gc_device_reset();
        grad_families[f].run();
        const struct gc_device *d = &gc_device;
        char layouts[64] = "";
        for (int l = 0; l < GC_LAYOUT_COUNT; l++)
            if (d->layouts & (1u << l))
                snprintf(layouts + strlen(layouts), sizeof(layouts) - strlen(layouts), "%s%s",
                         layouts[0] ? "," : "", gc_layout_names[l]);
        printf("%-50s %-38s %5d %9.2e %8ld %8ld\n", grad_families[f].name, layouts, d->n_cases,
               d->worst, d->n_first, d->n_fallback);
        for (int k = 0; k < d->n_fallback_kinds; k++)
            printf("    fallback: %ld x %s (%s: %s)\n", d->fallback[k].count,
                   lt_op_name(d->fallback[k].op), backends[0]->name, d->fallback[k].reason);
        CHECK(d->n_cases > 0 && d->n_first > 0, "%s: %d cases, %ld nodes on %s",
              grad_families[f].name, d->n_cases, d->n_first, backends[0]->name);
        on_first += d->n_first;
        fell_back += d->n_fallback;
        worst_all = d->worst > worst_all ? d->worst : worst_all;
    }
    printf("all: worst relative error %.2e; %ld nodes on %s, %ld fell back\n", worst_all, on_first,
           backends[0]->name, fell_back);
    gc_device_use(NULL, 0);
    return on_first;
}

#endif
