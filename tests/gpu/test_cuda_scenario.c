/* test_cuda_scenario.c: the k_conv scenario (tests/kconv_scenario.h) on CUDA0, issue 4's
 * item 5; the device that says no to SQR is a second CUDA backend made under
 * LATHE_CUDA_DISABLE_OPS=SQR. Skipped (77) without a CUDA device. */
#include <stdlib.h>

#include "kconv_scenario.h"
#include "lathe/backend_cuda.h"

int main(void)
{
    /* a node asking its family for more scratch than the family told admission fails */
    setenv("LATHE_CUDA_CHECK_SCRATCH", "1", 0);
    struct lt_backend *cuda = lt_backend_cuda_new(0);
    if (!cuda) {
        printf("skipped: %s\n", lt_last_error());
        return 77;
    }
    struct lt_backend *cpu = lt_backend_cpu_new(0);
    setenv("LATHE_CUDA_DISABLE_OPS", "SQR", 1);
    struct lt_backend *cuda_gap = lt_backend_cuda_new(0);
    CHECK(cuda_gap != NULL, "%s", lt_last_error());
    size_t free0 = 0, free1 = 0, total = 0;
    lt_backend_memory(cuda_gap, &free0, &total);
    struct lt_refusal r;
    kconv_scenario_run(cuda, cuda_gap, cpu, &r);
    lt_backend_memory(cuda_gap, &free1, &total);
    CHECK(strstr(r.reason, "LATHE_CUDA_DISABLE_OPS") != NULL, "reason: %s", r.reason);
    lt_backend_free(cuda_gap);
    lt_backend_free(cpu);
    lt_backend_free(cuda);
    return check_summary();
}
