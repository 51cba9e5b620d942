/* test_grad_sched.c: the finite-difference gradient cases of the CPU tests (grad_cases.h)
 * through the scheduler on {CUDA0 emulated, CPU} (cuda_emu.h: the CPU's kernels behind
 * CUDA's own supports_op, in memory that counts as the device's). The placement, the
 * fallbacks and the copies between host and device are the ones a GPU gets, so this checks
 * the scheduler path of the gradient checks without a GPU (gpu/test_cuda_gradcheck.c runs
 * the same cases on one): inputs perturbed in host memory must reach the device copy on
 * every run, and the loss and gradients come back from device memory. Skipped (77) in a
 * build without the CUDA backend, whose verdict would refuse everything. */
#include "check.h"
#include "cuda_emu.h"
#include "grad_cases.h"

/* What gradcheck relies on, alone: a host input read by a device node, changed on the host
 * between two computes, gives the second compute the new value. */
static void test_host_input_uploaded_each_run(struct lt_backend *const *backends)
{
    struct lt_ctx *data = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16});
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    struct lt_tensor *x = lt_new_tensor_1d(data, LT_TYPE_F32, 4);
    lt_set_name(x, "x");
    float *xv = x->data;
    for (int i = 0; i < 4; i++)
        xv[i] = (float)i;
    struct lt_tensor *loss = lt_sum(ctx, lt_sqr(ctx, x));
    loss->flags |= LT_FLAG_LOSS;
    struct lt_graph *g = lt_graph_new(ctx, 64);
    struct lt_sched *s = lt_sched_new(backends, 2);
    lt_status st = lt_graph_build(g, loss);
    if (st == LT_OK)
        st = lt_sched_place(s, g, true, NULL);
    if (st == LT_OK)
        st = lt_sched_alloc(s, g);
    float l[2] = {0, 0};
    for (int run = 0; run < 2 && st == LT_OK; run++) {
        st = lt_sched_compute(s, g);
        if (st == LT_OK)
            st = lt_tensor_get(loss, &l[run], 0, sizeof(float));
        xv[3] = 5.0f; /* on the host only */
    }
    CHECK(st == LT_OK, "%s", lt_last_error());
    CHECK(l[0] == 14.0f && l[1] == 30.0f, "loss %g then %g, expected 14 then 30", (double)l[0],
          (double)l[1]);
    lt_sched_free(s);
    lt_ctx_free(ctx);
    lt_ctx_free(data);
}

int main(void)
{
    if (!lt_cuda_compiled()) {
        printf("no CUDA build: skipped\n");
        return 77;
    }
    struct lt_backend *dev = emu_new(), *cpu = lt_backend_cpu_new(2);
    CHECK(dev && cpu);
    if (!dev || !cpu)
        return check_summary();
    struct lt_backend *both[2] = {dev, cpu};
    test_host_input_uploaded_each_run(both);
    grad_cases_run(both, 2);
    CHECK(((struct emu *)dev->impl)->n_refused_runs == 0, "no refused node was run");
    lt_backend_free(dev);
    lt_backend_free(cpu);
    return check_summary();
}
