/* test_cuda_fusion.c: the CUDA backend's decode fusion, a few-columns product and the
 * ADD_RMS_NORM after it that reads it issued as one launch (the product kernel's last block
 * takes the norm), gives the results of the two nodes run one by one
 * (LATHE_CUDA_FUSE_NORM=0) and of the CPU:
 *   - a chain of layers, each a product of the normed stream by a BF16, Q8_0, F16 or F32
 *     weight, then the residual sum and its norm (ADD_RMS_NORM, the product as its first
 *     source in one layer and its second in the next), ending in the last sum plus the
 *     last norm;
 *   - 1, 3 and 8 columns (mmv_half_kernel and mmvq's kernel finish the norm: every layer
 *     but the F32 weight's, whose product is cuBLAS's) and 12 (cuBLAS: none fused);
 *   - four runs on new inputs each: the counter the kernels count in is back at zero after
 *     each, and from the third run the list replays as a CUDA graph.
 * Exits 77 without a GPU. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lathe/backend.h"
#include "lathe/backend_cuda.h"
#include "lathe/ops.h"
#include "lathe/sched.h"

#define D 256
#define LAYERS 20
#define MAXN 12

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float rnd(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static const enum lt_type wtype[4] = {LT_TYPE_BF16, LT_TYPE_Q8_0, LT_TYPE_F16, LT_TYPE_F32};
static uint16_t w_bf16[D * D], w_f16[D * D];
static float w_f32[D * D], nw[LAYERS][D];
static uint8_t w_q8[D / 32 * 34 * D];

static void make_weights(void)
{
    for (int i = 0; i < D * D; i++) {
        w_bf16[i] = lt_fp32_to_bf16(rnd() / 8);
        w_f16[i] = lt_fp32_to_fp16(rnd() / 8);
        w_f32[i] = rnd() / 8;
    }
    for (size_t b = 0; b < sizeof(w_q8) / 34; b++) {
        uint16_t d = lt_fp32_to_fp16(1.0f / 1024);
        memcpy(w_q8 + 34 * b, &d, 2);
        for (int j = 0; j < 32; j++)
            w_q8[34 * b + 2 + j] = (uint8_t)(int8_t)(rnd() * 127);
    }
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < D; i++)
            nw[l][i] = 0.5f + (rnd() + 1.0f) / 2;
}

struct chain {
    struct lt_ctx *ctx;
    struct lt_graph *g;
    struct lt_sched *s;
    struct lt_tensor *x, *r0, *y, *w[4], *nw[LAYERS];
    int64_t n;
};

static const void *w_data(int i)
{
    return i == 0   ? (const void *)w_bf16
           : i == 1 ? (const void *)w_q8
           : i == 2 ? (const void *)w_f16
                    : (const void *)w_f32;
}

static int chain_new(struct chain *c, struct lt_backend *be, int64_t n)
{
    memset(c, 0, sizeof(*c));
    c->n = n;
    c->ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    c->x = lt_new_tensor_2d(c->ctx, LT_TYPE_F32, D, n);
    c->r0 = lt_new_tensor_2d(c->ctx, LT_TYPE_F32, D, n);
    for (int i = 0; i < 4; i++)
        c->w[i] = lt_new_tensor_2d(c->ctx, wtype[i], D, D);
    struct lt_tensor *h = c->x, *r = c->r0;
    for (int l = 0; l < LAYERS; l++) {
        c->nw[l] = lt_new_tensor_1d(c->ctx, LT_TYPE_F32, D);
        struct lt_tensor *p = lt_mul_mat(c->ctx, c->w[l % 4], h);
        struct lt_tensor *an = l % 2 ? lt_add_rms_norm(c->ctx, p, r, c->nw[l], 1e-6f)
                                     : lt_add_rms_norm(c->ctx, r, p, c->nw[l], 1e-6f);
        r = lt_add_rms_norm_sum(c->ctx, an);
        h = lt_add_rms_norm_out(c->ctx, an);
    }
    c->y = lt_add(c->ctx, h, r);
    c->g = lt_graph_new(c->ctx, 512);
    c->s = lt_sched_new(&be, 1);
    if (!c->y || !c->g || !c->s)
        return 0;
    c->x->flags |= LT_FLAG_INPUT;
    c->r0->flags |= LT_FLAG_INPUT;
    c->y->flags |= LT_FLAG_OUTPUT;
    if (lt_graph_build(c->g, c->y) != LT_OK || lt_sched_place(c->s, c->g, true, NULL) != LT_OK ||
        lt_sched_alloc(c->s, c->g) != LT_OK)
        return 0;
    for (int i = 0; i < 4; i++)
        if (lt_tensor_set(c->w[i], w_data(i), 0, lt_nbytes(c->w[i])) != LT_OK)
            return 0;
    for (int l = 0; l < LAYERS; l++)
        if (lt_tensor_set(c->nw[l], nw[l], 0, sizeof(nw[l])) != LT_OK)
            return 0;
    return 1;
}

static void chain_free(struct chain *c)
{
    lt_sched_free(c->s);
    lt_ctx_free(c->ctx);
}

static int chain_run(struct chain *c, const float *x, const float *r0, float *out)
{
    const size_t bytes = sizeof(float) * D * (size_t)c->n;
    if (lt_tensor_set(c->x, x, 0, bytes) != LT_OK || lt_tensor_set(c->r0, r0, 0, bytes) != LT_OK ||
        lt_sched_compute(c->s, c->g) != LT_OK || lt_tensor_get(c->y, out, 0, bytes) != LT_OK) {
        fprintf(stderr, "chain: %s\n", lt_last_error());
        return 0;
    }
    return 1;
}

static struct lt_backend *cuda_f, *cuda_u, *cpu;
static float x_in[D * MAXN], r_in[D * MAXN], out_f[D * MAXN], out_u[D * MAXN], out_c[D * MAXN];

static void check_columns(int64_t n)
{
    struct chain f, u, c;
    if (!chain_new(&f, cuda_f, n) || !chain_new(&u, cuda_u, n) || !chain_new(&c, cpu, n)) {
        CHECK(0, "%lld columns: building the chains: %s", (long long)n, lt_last_error());
        return;
    }
    /* every layer but the F32 weight's (a cuBLAS product) fuses, up to 8 columns */
    const long want = n <= 8 ? LAYERS - LAYERS / 4 : 0;
    for (int run = 0; run < 4; run++) {
        for (int i = 0; i < D * n; i++) {
            x_in[i] = rnd();
            r_in[i] = rnd();
        }
        const long before = lt_backend_cuda_fused_norms(cuda_f);
        if (!chain_run(&f, x_in, r_in, out_f) || !chain_run(&u, x_in, r_in, out_u) ||
            !chain_run(&c, x_in, r_in, out_c)) {
            CHECK(0, "%lld columns, run %d: a run failed", (long long)n, run);
            break;
        }
        const long fused = lt_backend_cuda_fused_norms(cuda_f) - before;
        /* runs 0 and 1 are eager, run 2 is captured (issued once more), run 3 replays */
        if (run < 3)
            CHECK(fused == want, "%lld columns, run %d: %ld pairs fused, want %ld", (long long)n,
                  run, fused, want);
        const double eu = check_nmse(out_f, out_u, D * n), ec = check_nmse(out_f, out_c, D * n);
        CHECK(eu < 1e-10, "%lld columns, run %d: fused against one by one: nmse %.3g", (long long)n,
              run, eu);
        CHECK(ec < 1e-5, "%lld columns, run %d: fused against the CPU: nmse %.3g", (long long)n,
              run, ec);
    }
    CHECK(lt_backend_cuda_fused_norms(cuda_u) == 0, "LATHE_CUDA_FUSE_NORM=0 fuses nothing");
    chain_free(&f);
    chain_free(&u);
    chain_free(&c);
}

int main(void)
{
    /* Q8_0 decode products run on int8 activations on the device (mmvq); the CPU rounds
     * the same way with this */
    setenv("LATHE_MATMUL_DOT", "int8", 1);
    setenv("LATHE_CUDA_CHECK_SCRATCH", "1", 0);
    unsetenv("LATHE_CUDA_FUSE_NORM");
    cuda_f = lt_backend_cuda_new(0);
    if (!cuda_f) {
        printf("skipped: %s\n", lt_last_error());
        return 77;
    }
    setenv("LATHE_CUDA_FUSE_NORM", "0", 1);
    cuda_u = lt_backend_cuda_new(0);
    unsetenv("LATHE_CUDA_FUSE_NORM");
    cpu = lt_backend_cpu_new(0);
    CHECK(cuda_u && cpu, "%s", lt_last_error());
    if (!cuda_u || !cpu)
        return check_summary();
    make_weights();
    const int64_t cols[] = {1, 3, 8, 12};
    for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++)
        check_columns(cols[i]);
    lt_backend_free(cuda_f);
    lt_backend_free(cuda_u);
    lt_backend_free(cpu);
    return check_summary();
}
