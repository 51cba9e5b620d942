/* test_scenario_gap.c: the k_conv scenario (tests/kconv_scenario.h) on a device CI has: the
 * gap backend (tests/gap_backend.h) with memory the scheduler treats as device memory, so
 * every crossing to the CPU goes through a copy; its twin that says no to SQR refuses. */
#include "gap_backend.h"
#include "kconv_scenario.h"

int main(void)
{
    struct lt_backend *dev = gap_backend_new("GAP0");
    struct lt_backend *dev_gap = gap_backend_new("GAP1");
    struct lt_backend *cpu = gap_backend_new("CPU"); /* a CPU that counts its bytes */
    dev->is_host = false;
    dev_gap->is_host = false;
    gap_of(dev_gap)->gap_always[LT_OP_SQR] = true;
    struct lt_refusal r;
    kconv_scenario_run(dev, dev_gap, cpu, &r);
    CHECK(strstr(r.reason, "SQR") != NULL, "reason: %s", r.reason);
    CHECK(gap_of(dev_gap)->bytes_allocated == 0, "a refused job allocated");
    lt_backend_free(dev_gap);
    lt_backend_free(dev);
    lt_backend_free(cpu);
    return check_summary();
}
