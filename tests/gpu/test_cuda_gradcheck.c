/* test_cuda_gradcheck.c: the finite-difference gradient cases of the CPU tests
 * (grad_cases.h: element-wise, copy and view ops, mul_mat, norms, rope, soft_max,
 * cross_entropy, attention, ssm_conv and delta_net, over contiguous, transposed, permuted
 * and sliced inputs) on {CUDA0, CPU} through the scheduler: forward and backward nodes on
 * the GPU where CUDA takes them, the CPU otherwise (counted and listed with CUDA's reason).
 * Inputs live in host memory and are perturbed there; the scheduler uploads them before
 * each run. Prints a table: case, layouts, worst relative error, nodes on CUDA0 / fallback.
 * Exits 77 (skipped) without a GPU. */
#include <stdlib.h>

#include "check.h"
#include "grad_cases.h"
#include "lathe/backend_cuda.h"

int main(void)
{
    /* a node asking its family for more scratch than the family told admission fails */
    setenv("LATHE_CUDA_CHECK_SCRATCH", "1", 0);
    struct lt_backend *cuda = lt_backend_cuda_new(0);
    if (!cuda) {
        printf("no GPU: skipped (%s)\n", lt_last_error());
        return 77;
    }
    struct lt_backend *cpu = lt_backend_cpu_new(4);
    CHECK(cpu != NULL);
    if (!cpu) {
        lt_backend_free(cuda);
        return check_summary();
    }
    struct lt_backend *both[2] = {cuda, cpu};
    grad_cases_run(both, 2);
    lt_backend_free(cpu);
    lt_backend_free(cuda);
    return check_summary();
}
