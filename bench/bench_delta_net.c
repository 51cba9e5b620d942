/* bench_delta_net.c: the gated delta rule's nodes on the CUDA backend at Qwen3.5-0.8B's
 * training shapes (16 heads of S_k = S_v = 128; 16 x 512 and 4 x 2048 tokens) and a
 * one-sequence prefill's (1 x 64, 128, 512 and 2048): DELTA_NET
 * and DELTA_NET_BACK, each a one-node graph run by the scheduler, on the paths the backend
 * has (chunked: the chunk-parallel kernels of delta_net_wy.cu; token: the per-token scan)
 * and at the precisions of the chunked kernels' products (bf16: BF16 operands where a kernel
 * has that form, else one TF32 product, as training on a device runs them; tf32: one TF32
 * product; f32: three). Wall clock around one node and a
 * synchronisation, median of the timed repetitions after warm-ups; ms a node, and the
 * tokens a second one layer's node passes (T B / time). The layer count of the 0.8B model
 * (18 DeltaNet layers) times the ms is the delta rule's share of a training step.
 * Usage: bench_delta_net [repetitions]. Exits 77 without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "lathe/backend_cuda.h"
#include "lathe/ops.h"
#include "lathe/sched.h"

/* a new F32 tensor of shape ne, its values uniform in [lo, hi) once allocated */
struct input {
    struct lt_tensor *t;
    float lo, hi;
};

static struct lt_tensor *input(struct lt_ctx *ctx, struct input *in, int *n, int64_t a, int64_t b,
                               int64_t c, int64_t d, float lo, float hi)
{
    struct lt_tensor *t = lt_new_tensor_4d(ctx, LT_TYPE_F32, a, b, c, d);
    in[(*n)++] = (struct input){t, lo, hi};
    return t;
}

/* median ms of one node: the forward (back 0) or the backward (back 1) on `path` at `prec`,
 * T tokens in each of B sequences; < 0 when the backend refused or failed (printed) */
static double bench_node(struct lt_backend *cuda, int back, enum lt_delta_net_path path,
                         enum lt_delta_net_prec prec, int64_t T, int64_t B, int reps)
{
    const int64_t S = 128, H = 16;
    double ms = -1.0;
    double *times = malloc(sizeof(double) * (size_t)reps);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_graph *g = lt_graph_new(ctx, 8);
    struct lt_sched *s = lt_sched_new(&cuda, 1);
    struct input in[8];
    int n_in = 0;
    /* unit-scale keys and queries as the model's l2-normalised ones, gates e^g in (0.37, 1) */
    struct lt_tensor *q = input(ctx, in, &n_in, S, H, T, B, -0.15f, 0.15f);
    struct lt_tensor *k = input(ctx, in, &n_in, S, H, T, B, -0.15f, 0.15f);
    struct lt_tensor *v = input(ctx, in, &n_in, S, H, T, B, -1.0f, 1.0f);
    struct lt_tensor *gt = input(ctx, in, &n_in, H, T, B, 1, -1.0f, -0.01f);
    struct lt_tensor *beta = input(ctx, in, &n_in, H, T, B, 1, 0.0f, 1.0f);
    struct lt_tensor *st = input(ctx, in, &n_in, S, S, H, B, -0.5f, 0.5f);
    struct lt_tensor *y;
    if (back) {
        struct lt_tensor *gr = input(ctx, in, &n_in, S, H, T + S, B, -1.0f, 1.0f);
        y = lt_delta_net_back(ctx, gr, q, k, v, gt, beta, st, 0.088f);
    } else {
        y = lt_delta_net(ctx, q, k, v, gt, beta, st, 0.088f);
    }
    if (!times || !g || !s || !y)
        goto out;
    lt_delta_net_set_path(y, path);
    lt_delta_net_set_prec(y, prec);
    y->flags |= LT_FLAG_OUTPUT;
    if (lt_graph_build(g, y) != LT_OK || lt_sched_place(s, g, true, NULL) != LT_OK ||
        lt_sched_alloc(s, g) != LT_OK) {
        printf("  (%s: %s)\n", back ? "DELTA_NET_BACK" : "DELTA_NET", lt_last_error());
        goto out;
    }
    for (int i = 0; i < n_in; i++) {
        const size_t ne = (size_t)lt_nelements(in[i].t);
        float *h = malloc(sizeof(float) * ne);
        if (!h)
            goto out;
        for (size_t j = 0; j < ne; j++)
            h[j] = bench_rnd(in[i].lo, in[i].hi);
        const lt_status st_set = lt_tensor_set(in[i].t, h, 0, sizeof(float) * ne);
        free(h);
        if (st_set != LT_OK)
            goto out;
    }
    for (int r = -2; r < reps; r++) {
        const double t0 = bench_now_s();
        if (lt_sched_compute(s, g) != LT_OK) {
            printf("  (compute: %s)\n", lt_last_error());
            goto out;
        }
        if (r >= 0)
            times[r] = bench_now_s() - t0;
    }
    ms = 1e3 * bench_median(times, reps);
out:
    lt_sched_free(s);
    lt_ctx_free(ctx);
    free(times);
    return ms;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 10;
    if (reps < 1)
        reps = 1;
    struct lt_backend *cuda = lt_backend_cuda_new(0);
    if (!cuda) {
        printf("skipped: %s\n", lt_last_error());
        return 77;
    }
    static const int64_t shapes[][2] = {{512, 16}, {2048, 4}, {64, 1},
                                        {128, 1},  {512, 1},  {2048, 1}};
    static const struct {
        const char *name;
        enum lt_delta_net_path path;
        enum lt_delta_net_prec prec;
    } paths[] = {
        {"chunked bf16", LT_DELTA_NET_PATH_CHUNKED, LT_DELTA_NET_PREC_BF16},
        {"chunked tf32", LT_DELTA_NET_PATH_CHUNKED, LT_DELTA_NET_PREC_TF32},
        {"chunked f32", LT_DELTA_NET_PATH_CHUNKED, LT_DELTA_NET_PREC_F32},
        {"token", LT_DELTA_NET_PATH_RECURRENT, LT_DELTA_NET_PREC_F32},
    };
    printf("### The gated delta rule, 16 heads of 128, median of %d (ms a node; tokens/s of "
           "one layer's node)\n\n",
           reps);
    printf("| tokens | path | DELTA_NET ms | tokens/s | DELTA_NET_BACK ms | tokens/s | 18 layers, "
           "both, ms |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    int failed = 0;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
        for (size_t p = 0; p < sizeof(paths) / sizeof(paths[0]); p++) {
            const int64_t T = shapes[i][0], B = shapes[i][1];
            const double f = bench_node(cuda, 0, paths[p].path, paths[p].prec, T, B, reps);
            const double bk = bench_node(cuda, 1, paths[p].path, paths[p].prec, T, B, reps);
            failed |= f < 0 || bk < 0;
            printf("| %lldx%lld | %s | %.3f | %.0f | %.3f | %.0f | %.1f |\n", (long long)B,
                   (long long)T, paths[p].name, f, (double)(T * B) / f * 1e3, bk,
                   (double)(T * B) / bk * 1e3, 18.0 * (f + bk));
            fflush(stdout);
        }
    lt_backend_free(cuda);
    return failed ? 1 : 0;
}
