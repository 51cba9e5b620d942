/* test_model_decode_cuda.c: tests/test_model_decode.c's per-architecture checks with the
 * sessions on CUDA0 (weights uploaded there, the CPU beside it for what CUDA refuses):
 * one-token decode at every position, prefill whole and in chunks, three sequences decoding
 * in one batch out of slot order, and an F16 cache, each against the CPU's full-sequence
 * forward within 2e-4 of its largest logit; then the kept decode step against steps built
 * anew, on CUDA0 alone. This runs the device's decode ops (GDN_DECODE,
 * ATTN_DECODE, the mmv products) and the kept decode step end to end. Exits 77 without a
 * GPU. */
#define DECODE_ON_DEVICE 1
#include "../test_model_decode.c"

#include "lathe/backend_cuda.h"

int main(void)
{
    const char *dir = getenv("LATHE_BUILD_DIR");
    if (!dir)
        dir = "/tmp";
    struct lt_backend *cuda = lt_backend_cuda_new(0);
    if (!cuda) {
        printf("skipped: %s\n", lt_last_error());
        return 77;
    }
    struct lt_backend *cpu = lt_backend_cpu_new(2);
    for (int i = 0; i < TM_N_SPECS; i++)
        test_arch(&tm_specs[i], dir, cpu, cuda);
    /* the kept decode step against one built anew and one over stacked projections, all
     * three sessions on CUDA0 alone */
    for (int i = 0; i < TM_N_SPECS; i++)
        test_kept_step(&tm_specs[i], dir, cuda);
    lt_backend_free(cpu);
    lt_backend_free(cuda);
    return check_summary();
}
