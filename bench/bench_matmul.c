/* bench_matmul.c: BF16 weights times activations through lathe's CUDA backend (a one-node
 * graph run by the scheduler) against cuBLAS called directly on the same BF16 operands, for
 * Qwen3.5-0.8B's shapes: hidden 1024, intermediate 3584, vocabulary 248320; 1, 64 and 512
 * tokens. lathe is timed on two paths:
 *   - "f32 x": F32 activations (decode's, and every model's before half activations):
 *     converted to BF16 into scratch, then cuBLAS with F32 accumulation and an F32 result;
 *   - "bf16 x": BF16 activations, as a model's prefill of more than 8 tokens now feeds its
 *     BF16 weights (the norm, SwiGLU or gate op writes them in BF16): cuBLAS reads them in
 *     place, no conversion kernel.
 *
 * All are timed the same way: wall clock around one product and a synchronisation, the
 * three taken in turn in each repetition, median of the timed repetitions after warm-ups
 * (products of ~20 us are at the mercy of clocks and launch jitter; taking them in turn puts
 * any drift on all three), so lathe's figures include its
 * scheduler and its stream synchronisation, and each ratio is lathe / cuBLAS (1.0 = no
 * overhead). The results are compared with cuBLAS's as a sanity check (nmse). With 8 tokens
 * or fewer and weights of at most 16 MiB, "f32 x" runs lathe's own kernel (mmv) on the
 * BF16 weights and the F32 activations, so its result differs from cuBLAS's by the
 * rounding of the activations to BF16 that cuBLAS's operands carry (nmse ~1e-6); "bf16 x"
 * is cuBLAS on cuBLAS's own operands (mmv reads F32 activations only), so ~0.
 *
 * A second table times lathe alone on quantised weights (Q8_0, Q4_K, Q6_K; random blocks
 * with small scales), which have no cuBLAS peer: the effective weight bandwidth shows how
 * far decode is from reading the weights once. Q8_0 with 1, 2 and 8 tokens runs mmvq (int8
 * activations, __dp4a) by default; LATHE_CUDA_MMVQ=0 in the environment times the
 * F32-activation mmv kernel instead, for comparison (the switch is read once a process).
 * A third table times decode's products as a decode step runs them (bench_decode).
 * Usage: bench_matmul [repetitions] [decode] (decode: the third table alone). Exits 77
 * without a GPU. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "lathe/backend_cuda.h"
#include "lathe/ops.h"
#include "lathe/sched.h"

struct shape {
    const char *name;
    int64_t K, M; /* weight [K, M]: K inputs, M outputs */
};

static const struct shape shapes[] = {
    {"gate/up  1024->3584", 1024, 3584},
    {"down:3584->1024", 3584, 1024},
    {"lm_head  1024->248320", 1024, 248320},
    /* the 0.8B model's stacked projections as a prefill runs them: a DeltaNet layer's
     * inputs (qkv, z, b, a), an FFN's gate and up, an attention layer's q (with its gate),
     * k and v */
    {"dn in    1024->8224", 1024, 8224},
    {"gate+up  1024->7168", 1024, 7168},
    {"attn in  1024->5120", 1024, 5120},
};
static const int64_t token_counts[] = {1, 64, 512};

static int cuda_ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 1;
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    return 0;
}

/* lathe's product of the BF16 weights w_host [K, M] and activations x_host [K, N] of type
 * xt (F32 or BF16): a one-node graph on CUDA0, set up once and computed per timed call. */
struct lathe_mm {
    struct lt_ctx *ctx;
    struct lt_sched *s;
    struct lt_graph *g;
    struct lt_tensor *y;
};

static void lathe_mm_free(struct lathe_mm *m)
{
    lt_sched_free(m->s);
    lt_ctx_free(m->ctx);
}

static int lathe_mm_init(struct lathe_mm *m, struct lt_backend *cuda, int64_t K, int64_t M,
                         int64_t N, enum lt_type xt, const uint16_t *w_host, const void *x_host)
{
    m->ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_tensor *w = lt_new_tensor_2d(m->ctx, LT_TYPE_BF16, K, M);
    struct lt_tensor *x = lt_new_tensor_2d(m->ctx, xt, K, N);
    m->y = lt_mul_mat(m->ctx, w, x);
    m->g = lt_graph_new(m->ctx, 8);
    m->s = lt_sched_new(&cuda, 1);
    if (!m->y || !m->g || !m->s) {
        fprintf(stderr, "lathe graph (%s x): %s\n", lt_type_name(xt), lt_last_error());
        return 0;
    }
    m->y->flags |= LT_FLAG_OUTPUT;
    if (lt_graph_build(m->g, m->y) != LT_OK || lt_sched_place(m->s, m->g, true, NULL) != LT_OK ||
        lt_sched_alloc(m->s, m->g) != LT_OK ||
        lt_tensor_set(w, w_host, 0, 2 * (size_t)(K * M)) != LT_OK ||
        lt_tensor_set(x, x_host, 0, lt_nbytes(x)) != LT_OK) {
        fprintf(stderr, "lathe setup (%s x): %s\n", lt_type_name(xt), lt_last_error());
        return 0;
    }
    return 1;
}

/* one product through the scheduler (which synchronises its stream): seconds, or -1 */
static double lathe_mm_time(struct lathe_mm *m)
{
    double t0 = bench_now_s();
    if (lt_sched_compute(m->s, m->g) != LT_OK) {
        fprintf(stderr, "lathe compute: %s\n", lt_last_error());
        return -1;
    }
    return bench_now_s() - t0;
}

/* normalised squared error of y against ref */
static double nmse(const float *y, const float *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)y[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

/* One shape and token count; returns 0 on failure. The three products are timed in turn
 * within each repetition (lathe F32 x, lathe BF16 x, cuBLAS), so a change of clocks or of
 * the machine's load during the run falls on all three alike. */
static int bench_one(struct lt_backend *cuda, cublasHandle_t blas, const struct shape *sh,
                     int64_t N, const uint16_t *w_host, int reps)
{
    const int64_t K = sh->K, M = sh->M;
    int ok = 0;
    float *x_host = malloc(sizeof(float) * (size_t)(K * N));
    uint16_t *xb_host = malloc(2 * (size_t)(K * N));
    float *y_f32x = malloc(sizeof(float) * (size_t)(M * N));
    float *y_bf16x = malloc(sizeof(float) * (size_t)(M * N));
    float *y_blas = malloc(sizeof(float) * (size_t)(M * N));
    double *times = malloc(3 * sizeof(double) * (size_t)reps);
    struct lathe_mm lf = {0}, lh = {0};
    void *dw = NULL, *dx = NULL, *dy = NULL;
    if (!x_host || !xb_host || !y_f32x || !y_bf16x || !y_blas || !times)
        goto out;
    for (int64_t i = 0; i < K * N; i++) {
        x_host[i] = bench_rnd(-1.0f, 1.0f);
        xb_host[i] = lt_fp32_to_bf16(x_host[i]);
    }
    if (!lathe_mm_init(&lf, cuda, K, M, N, LT_TYPE_F32, w_host, x_host) ||
        !lathe_mm_init(&lh, cuda, K, M, N, LT_TYPE_BF16, w_host, xb_host))
        goto out;

    /* cuBLAS directly: the same BF16 weights, the activations already BF16 */
    if (!cuda_ok(cudaMalloc(&dw, 2 * (size_t)(K * M)), "cudaMalloc") ||
        !cuda_ok(cudaMalloc(&dx, 2 * (size_t)(K * N)), "cudaMalloc") ||
        !cuda_ok(cudaMalloc(&dy, sizeof(float) * (size_t)(M * N)), "cudaMalloc") ||
        !cuda_ok(cudaMemcpy(dw, w_host, 2 * (size_t)(K * M), cudaMemcpyHostToDevice), "copy") ||
        !cuda_ok(cudaMemcpy(dx, xb_host, 2 * (size_t)(K * N), cudaMemcpyHostToDevice), "copy"))
        goto out;
    const float alpha = 1.0f, beta = 0.0f;
    double *tf = times, *th = times + reps, *tb = times + 2 * reps;
    for (int r = -3; r < reps; r++) {
        double f = lathe_mm_time(&lf), h = lathe_mm_time(&lh);
        if (f < 0 || h < 0)
            goto out;
        double t0 = bench_now_s();
        cublasStatus_t bs = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)M, (int)N, (int)K,
                                         &alpha, dw, CUDA_R_16BF, (int)K, dx, CUDA_R_16BF, (int)K,
                                         &beta, dy, CUDA_R_32F, (int)M, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cublasGemmEx: %s\n", cublasGetStatusString(bs));
            goto out;
        }
        if (!cuda_ok(cudaDeviceSynchronize(), "synchronise"))
            goto out;
        if (r >= 0) {
            tf[r] = f;
            th[r] = h;
            tb[r] = bench_now_s() - t0;
        }
    }
    if (!cuda_ok(cudaMemcpy(y_blas, dy, sizeof(float) * (size_t)(M * N), cudaMemcpyDeviceToHost),
                 "copy back") ||
        lt_tensor_get(lf.y, y_f32x, 0, sizeof(float) * (size_t)(M * N)) != LT_OK ||
        lt_tensor_get(lh.y, y_bf16x, 0, sizeof(float) * (size_t)(M * N)) != LT_OK)
        goto out;

    double mf = bench_median(tf, reps), mh = bench_median(th, reps), mb = bench_median(tb, reps);
    double flop = 2.0 * (double)K * (double)M * (double)N;
    printf("%-22s %5lld  %9.1f  %9.1f  %9.1f  %7.1f   %5.2f   %5.2f   %.1e  %.1e  %8.1f\n",
           sh->name, (long long)N, mf * 1e6, mh * 1e6, mb * 1e6, flop / mb * 1e-12, mf / mb,
           mh / mb, nmse(y_f32x, y_blas, M * N), nmse(y_bf16x, y_blas, M * N),
           2.0 * (double)K * (double)M / mf * 1e-9);
    ok = 1;
out:
    lathe_mm_free(&lf);
    lathe_mm_free(&lh);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
    free(x_host);
    free(xb_host);
    free(y_f32x);
    free(y_bf16x);
    free(y_blas);
    free(times);
    return ok;
}

/* Random blocks of a quantised type with each block's scales set small (see quant.h). */
static void *quant_weights(enum lt_type t, int64_t K, int64_t M, size_t *bytes)
{
    const struct lt_type_traits *tt = lt_type_traits(t);
    size_t bs = tt->type_size, n = (size_t)(K / tt->block_size) * (size_t)M * bs;
    uint8_t *w = malloc(n);
    if (!w)
        return NULL;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t r = (uint32_t)(bench_next_u64() >> 32);
        memcpy(w + i, &r, n - i < 4 ? n - i : 4);
    }
    size_t d_at = t == LT_TYPE_Q6_K ? 208 : 0;
    for (size_t b = 0; b + bs <= n; b += bs) {
        uint16_t d = lt_fp32_to_fp16(0.001f);
        memcpy(w + b + d_at, &d, 2);
        if (t == LT_TYPE_Q4_K)
            memcpy(w + b + 2, &d, 2);
    }
    *bytes = n;
    return w;
}

static int bench_quant(struct lt_backend *cuda, enum lt_type t, const struct shape *sh, int64_t N,
                       int reps)
{
    const int64_t K = sh->K, M = sh->M;
    size_t wbytes;
    void *w_host = quant_weights(t, K, M, &wbytes);
    float *x_host = malloc(sizeof(float) * (size_t)(K * N));
    double *times = malloc(sizeof(double) * (size_t)reps);
    int ok = 0;
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16, .no_alloc = true});
    struct lt_tensor *w = lt_new_tensor_2d(ctx, t, K, M);
    struct lt_tensor *x = lt_new_tensor_2d(ctx, LT_TYPE_F32, K, N);
    struct lt_tensor *y = lt_mul_mat(ctx, w, x);
    struct lt_graph *g = lt_graph_new(ctx, 8);
    struct lt_sched *s = lt_sched_new(&cuda, 1);
    if (!w_host || !x_host || !times)
        goto out;
    for (int64_t i = 0; i < K * N; i++)
        x_host[i] = bench_rnd(-1.0f, 1.0f);
    y->flags |= LT_FLAG_OUTPUT;
    if (lt_graph_build(g, y) != LT_OK || lt_sched_place(s, g, true, NULL) != LT_OK ||
        lt_sched_alloc(s, g) != LT_OK || lt_tensor_set(w, w_host, 0, wbytes) != LT_OK ||
        lt_tensor_set(x, x_host, 0, sizeof(float) * (size_t)(K * N)) != LT_OK) {
        fprintf(stderr, "lathe setup (%s): %s\n", lt_type_name(t), lt_last_error());
        goto out;
    }
    for (int r = -3; r < reps; r++) {
        double t0 = bench_now_s();
        if (lt_sched_compute(s, g) != LT_OK) {
            fprintf(stderr, "lathe compute (%s): %s\n", lt_type_name(t), lt_last_error());
            goto out;
        }
        if (r >= 0)
            times[r] = bench_now_s() - t0;
    }
    double tm = bench_median(times, reps);
    printf("%-6s %-22s %5lld  %9.1f  %8.1f  %7.1f\n", lt_type_name(t), sh->name, (long long)N,
           tm * 1e6, (double)wbytes / tm * 1e-9, 2.0 * (double)K * (double)M * (double)N / tm * 1e-12);
    ok = 1;
out:
    lt_sched_free(s);
    lt_ctx_free(ctx);
    free(w_host);
    free(x_host);
    free(times);
    return ok;
}

/* Decode's products as a decode step runs them: one list of DEC_LAYERS products, each by
 * its own weight (DEC_LAYERS copies, far more bytes than the GPU's L2, so that every product
 * reads its weight from memory as a model's layers do), all of the same activation columns.
 * The backend records such a list as a CUDA graph on its second run and replays it after
 * (cuda_graphs.cu), as it does a decode step. us a product: the median wall time of the
 * list over DEC_LAYERS, so the kernels, their gaps inside a graph and a share of one launch
 * and synchronisation (~1 us a product); GB/s: the weight's bytes over that. */
#define DEC_LAYERS 32
static const struct shape dec_shapes[] = {
    {"dn_in:1024->8224", 1024, 8224}, /* Qwen3.5-0.8B's stacked DeltaNet projections */
    {"gate_up:1024->7168", 1024, 7168}, {"attn_qkv:1024->5120", 1024, 5120},
    {"out:2048->1024", 2048, 1024}, {"down:3584->1024", 3584, 1024},
};

static int bench_decode(struct lt_backend *cuda, enum lt_type t, const struct shape *sh, int64_t N,
                        int reps)
{
    const int64_t K = sh->K, M = sh->M;
    size_t wbytes = 2 * (size_t)(K * M);
    void *w_host = t == LT_TYPE_BF16 ? malloc(wbytes) : quant_weights(t, K, M, &wbytes);
    float *x_host = malloc(sizeof(float) * (size_t)(K * N));
    double *times = malloc(sizeof(double) * (size_t)reps);
    int ok = 0;
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 18, .no_alloc = true});
    struct lt_graph *g = lt_graph_new(ctx, 4 * DEC_LAYERS);
    struct lt_sched *s = lt_sched_new(&cuda, 1);
    struct lt_tensor *w[DEC_LAYERS], *x = lt_new_tensor_2d(ctx, LT_TYPE_F32, K, N);
    if (!w_host || !x_host || !times || !g || !s || !x)
        goto out;
    if (t == LT_TYPE_BF16)
        for (int64_t i = 0; i < K * M; i++)
            ((uint16_t *)w_host)[i] = lt_fp32_to_bf16(0.05f * bench_rnd(-1.0f, 1.0f));
    for (int64_t i = 0; i < K * N; i++)
        x_host[i] = bench_rnd(-1.0f, 1.0f);
    for (int l = 0; l < DEC_LAYERS; l++) {
        w[l] = lt_new_tensor_2d(ctx, t, K, M);
        struct lt_tensor *y = w[l] ? lt_mul_mat(ctx, w[l], x) : NULL;
        if (!y || lt_graph_build(g, y) != LT_OK)
            goto fail;
        y->flags |= LT_FLAG_OUTPUT;
    }
    if (lt_sched_place(s, g, true, NULL) != LT_OK || lt_sched_alloc(s, g) != LT_OK ||
        lt_tensor_set(x, x_host, 0, sizeof(float) * (size_t)(K * N)) != LT_OK)
        goto fail;
    for (int l = 0; l < DEC_LAYERS; l++)
        if (lt_tensor_set(w[l], w_host, 0, wbytes) != LT_OK)
            goto fail;
    for (int r = -3; r < reps; r++) {
        double t0 = bench_now_s();
        if (lt_sched_compute(s, g) != LT_OK)
            goto fail;
        if (r >= 0)
            times[r] = bench_now_s() - t0;
    }
    double tm = bench_median(times, reps) / DEC_LAYERS;
    printf("%-6s %-22s %5lld  %9.2f  %8.1f\n", lt_type_name(t), sh->name, (long long)N, tm * 1e6,
           (double)wbytes / tm * 1e-9);
    ok = 1;
    goto out;
fail:
    fprintf(stderr, "lathe decode products (%s %s): %s\n", lt_type_name(t), sh->name,
            lt_last_error());
out:
    lt_sched_free(s);
    lt_ctx_free(ctx);
    free(w_host);
    free(x_host);
    free(times);
    return ok;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    const int decode_only = argc > 2 && strcmp(argv[2], "decode") == 0;
    if (reps < 1)
        reps = 1;
    struct lt_backend *cuda = lt_backend_cuda_new(0);
    if (!cuda) {
        printf("skipped: %s\n", lt_last_error());
        return 77;
    }
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    int failed = 0;
    if (!decode_only) {
        printf("BF16 weights x activations, median of %d (wall clock, synchronised); lathe "
               "f32 x = scheduler + F32->BF16 conversion + cuBLAS (mmv for N <= 8), lathe bf16 x = "
               "scheduler + cuBLAS on the BF16 activations in place; ratios are lathe / cuBLAS; "
               "f32x GB/s: the weight's bytes over lathe f32 x's time\n",
               reps);
        printf("%-22s %5s  %9s  %9s  %9s  %7s   %5s   %5s   %-7s  %-7s  %8s\n", "shape", "N",
               "f32 x us", "bf16 x us", "cuBLAS us", "cuBLAS TF", "f32x", "bf16x", "nmse f32x",
               "nmse bf16x", "f32x GB/s");
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            const struct shape *sh = &shapes[i];
            uint16_t *w_host = malloc(2 * (size_t)(sh->K * sh->M));
            if (!w_host)
                return 1;
            for (int64_t j = 0; j < sh->K * sh->M; j++)
                w_host[j] = lt_fp32_to_bf16(0.05f * bench_rnd(-1.0f, 1.0f));
            for (size_t t = 0; t < sizeof(token_counts) / sizeof(token_counts[0]); t++)
                failed += !bench_one(cuda, blas, sh, token_counts[t], w_host, reps);
            free(w_host);
        }
        const char *mmvq_env = getenv("LATHE_CUDA_MMVQ");
        const int mmvq_on = !(mmvq_env && strcmp(mmvq_env, "0") == 0);
        printf("\nquantised weights through lathe (mmv for N <= 8, %s; else dequantised F16 "
               "tiles + cuBLAS), median of %d\n",
               mmvq_on ? "Q8_0 through mmvq (int8 activations)"
                       : "Q8_0 with F32 activations (LATHE_CUDA_MMVQ=0)",
               reps);
        printf("%-6s %-22s %5s  %9s  %8s  %7s\n", "type", "shape", "N", "lathe us", "weight GB/s",
               "TF");
        static const enum lt_type qtypes[] = {LT_TYPE_Q8_0, LT_TYPE_Q4_K, LT_TYPE_Q6_K};
        static const int64_t qtokens[] = {1, 2, 8, 64}; /* 2 and 8: Q8_0 only (decode batches) */
        for (size_t q = 0; q < sizeof(qtypes) / sizeof(qtypes[0]); q++)
            for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
                for (size_t t = 0; t < sizeof(qtokens) / sizeof(qtokens[0]); t++) {
                    const int64_t n = qtokens[t];
                    if (qtypes[q] != LT_TYPE_Q8_0 && n != 1 && n != 64)
                        continue;
                    failed += !bench_quant(cuda, qtypes[q], &shapes[i], n, reps);
                }
    }
    printf("\ndecode's products: %d weights a list (one a layer), replayed as a CUDA graph; us "
           "a product = the list's median wall time / %d (LATHE_CUDA_MMV_WPR=%s)\n",
           DEC_LAYERS, DEC_LAYERS,
           getenv("LATHE_CUDA_MMV_WPR") ? getenv("LATHE_CUDA_MMV_WPR") : "auto");
    printf("%-6s %-22s %5s  %9s  %8s\n", "type", "shape", "N", "us each", "weight GB/s");
    static const enum lt_type dtypes[] = {LT_TYPE_BF16, LT_TYPE_Q8_0, LT_TYPE_Q4_K};
    static const int64_t dtokens[] = {1, 8};
    for (size_t q = 0; q < 3; q++)
        for (size_t t = 0; t < 2; t++)
            for (size_t i = 0; i < sizeof(dec_shapes) / sizeof(dec_shapes[0]); i++)
                failed += !bench_decode(cuda, dtypes[q], &dec_shapes[i], dtokens[t], reps);
    cublasDestroy(blas);
    lt_backend_free(cuda);
    return failed ? 1 : 0;
}
