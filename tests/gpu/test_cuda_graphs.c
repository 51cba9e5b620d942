/* test_cuda_graphs.c: CUDA graphs (decode-sized node lists recorded by stream capture and
 * launched as one graph) give the results of the eager launches, bit for bit, and of the
 * CPU within float rounding, through every path of the graph cache:
 *   - the first run needs scratch memory (a BF16 weight over mmv's size limit, whose F32
 *     activations are converted into scratch): the capture is spoiled, the list runs
 *     eagerly;
 *   - the second run instantiates a graph, later runs with new inputs update it;
 *   - two shapes alternating keep a graph each; six more in turn evict the least recently
 *     used of the four kept;
 *   - a list with a product over 16 activation columns is not captured;
 *   - a backend made without LATHE_CUDA_GRAPHS=1 (the default) captures nothing.
 * The graph is a chain of matrix products (BF16, F32 and Q8_0 weights, as decode has them),
 * SiLU and residual additions ending in a 256 -> 65536 BF16 product. Exits 77 without a
 * GPU. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lathe/backend.h"
#include "lathe/backend_cuda.h"
#include "lathe/ops.h"
#include "lathe/sched.h"

#define D 256        /* the chain's width */
#define HEAD 65536   /* the last product's outputs: 32 MiB of BF16, over mmv's 16 MiB */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float rnd(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* host copies of the weights, shared by every graph */
static uint16_t w_bf16[D * D], head_bf16[(size_t)D * HEAD];
static float w_f32[D * D];
static uint8_t w_q8[D / 32 * 34 * D];

static void make_weights(void)
{
    for (int i = 0; i < D * D; i++) {
        w_bf16[i] = lt_fp32_to_bf16(rnd() / 16);
        w_f32[i] = rnd() / 16;
    }
    for (size_t i = 0; i < (size_t)D * HEAD; i++)
        head_bf16[i] = lt_fp32_to_bf16(rnd() / 16);
    for (size_t b = 0; b < sizeof(w_q8) / 34; b++) {
        uint16_t d = lt_fp32_to_fp16(1.0f / 2048);
        memcpy(w_q8 + 34 * b, &d, 2);
        for (int j = 0; j < 32; j++)
            w_q8[34 * b + 2 + j] = (uint8_t)(int8_t)(rnd() * 127);
    }
}

struct chain {
    struct lt_ctx *ctx;
    struct lt_graph *g;
    struct lt_sched *s;
    struct lt_tensor *x, *y, *wb, *wf, *wq, *head;
    int64_t n;
};

/* layers x (product, SiLU, residual) then the head: 3 * layers + 1 nodes */
static int chain_new(struct chain *c, struct lt_backend *be, int layers, int64_t n)
{
    memset(c, 0, sizeof(*c));
    c->n = n;
    c->ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 20, .no_alloc = true});
    c->x = lt_new_tensor_2d(c->ctx, LT_TYPE_F32, D, n);
    c->wb = lt_new_tensor_2d(c->ctx, LT_TYPE_BF16, D, D);
    c->wf = lt_new_tensor_2d(c->ctx, LT_TYPE_F32, D, D);
    c->wq = lt_new_tensor_2d(c->ctx, LT_TYPE_Q8_0, D, D);
    c->head = lt_new_tensor_2d(c->ctx, LT_TYPE_BF16, D, HEAD);
    struct lt_tensor *h = c->x;
    for (int l = 0; l < layers; l++) {
        struct lt_tensor *w = l % 3 == 0 ? c->wb : l % 3 == 1 ? c->wf : c->wq;
        h = lt_add(c->ctx, lt_silu(c->ctx, lt_mul_mat(c->ctx, w, h)), h);
    }
    c->y = lt_mul_mat(c->ctx, c->head, h);
    c->g = lt_graph_new(c->ctx, 256);
    c->s = lt_sched_new(&be, 1);
    if (!c->y || !c->g || !c->s)
        return 0;
    c->x->flags |= LT_FLAG_INPUT;
    c->y->flags |= LT_FLAG_OUTPUT;
    return lt_graph_build(c->g, c->y) == LT_OK && lt_sched_place(c->s, c->g, true, NULL) == LT_OK &&
           lt_sched_alloc(c->s, c->g) == LT_OK &&
           lt_tensor_set(c->wb, w_bf16, 0, sizeof(w_bf16)) == LT_OK &&
           lt_tensor_set(c->wf, w_f32, 0, sizeof(w_f32)) == LT_OK &&
           lt_tensor_set(c->wq, w_q8, 0, sizeof(w_q8)) == LT_OK &&
           lt_tensor_set(c->head, head_bf16, 0, sizeof(head_bf16)) == LT_OK;
}

static void chain_free(struct chain *c)
{
    lt_sched_free(c->s);
    lt_ctx_free(c->ctx);
}

/* y for input x (D * n floats) into out (HEAD * n floats) */
static int chain_run(struct chain *c, const float *x, float *out)
{
    if (lt_tensor_set(c->x, x, 0, sizeof(float) * D * (size_t)c->n) != LT_OK ||
        lt_sched_compute(c->s, c->g) != LT_OK ||
        lt_tensor_get(c->y, out, 0, sizeof(float) * HEAD * (size_t)c->n) != LT_OK) {
        fprintf(stderr, "chain: %s\n", lt_last_error());
        return 0;
    }
    return 1;
}

struct trio { /* one shape on the three backends */
    struct chain g, e, cpu;
};

static struct lt_backend *cuda_g, *cuda_e, *cpu;
static float x_in[D * 16], out_g[HEAD * 16], out_e[HEAD * 16], out_c[HEAD * 16];

static int trio_new(struct trio *t, int layers, int64_t n)
{
    return chain_new(&t->g, cuda_g, layers, n) && chain_new(&t->e, cuda_e, layers, n) &&
           chain_new(&t->cpu, cpu, layers, n);
}

static void trio_free(struct trio *t)
{
    chain_free(&t->g);
    chain_free(&t->e);
    chain_free(&t->cpu);
}

/* one run on new inputs: graphs equal to eager bit for bit, and to the CPU */
static void trio_check(struct trio *t, const char *what)
{
    for (int i = 0; i < D * t->g.n; i++)
        x_in[i] = rnd();
    const long n = HEAD * t->g.n;
    if (!chain_run(&t->g, x_in, out_g) || !chain_run(&t->e, x_in, out_e) ||
        !chain_run(&t->cpu, x_in, out_c)) {
        CHECK(0, "%s: a run failed", what);
        return;
    }
    CHECK(memcmp(out_g, out_e, sizeof(float) * (size_t)n) == 0,
          "%s: graph and eager results differ (nmse %.3g)", what, check_nmse(out_g, out_e, n));
    double e = check_nmse(out_g, out_c, n);
    CHECK(e < 1e-5, "%s: CUDA against the CPU: nmse %.3g", what, e);
}

static struct lt_cuda_graph_stats stats(void)
{
    struct lt_cuda_graph_stats st;
    lt_backend_cuda_graph_stats(cuda_g, &st);
    return st;
}

int main(void)
{
    setenv("LATHE_CUDA_GRAPHS", "1", 1);
    cuda_g = lt_backend_cuda_new(0);
    if (!cuda_g) {
        printf("skipped: %s\n", lt_last_error());
        return 77;
    }
    unsetenv("LATHE_CUDA_GRAPHS");
    cuda_e = lt_backend_cuda_new(0);
    cpu = lt_backend_cpu_new(0);
    CHECK(cuda_e && cpu, "%s", lt_last_error());
    if (!cuda_e || !cpu)
        return check_summary();
    make_weights();

    /* one shape: spoiled capture (scratch), instantiate, then updates with new inputs */
    struct trio a;
    CHECK(trio_new(&a, 12, 1), "%s", lt_last_error());
    trio_check(&a, "first run");
    struct lt_cuda_graph_stats st = stats();
    CHECK(st.eager == 1 && st.launched == 0, "first run: %ld eager, %ld launched (scratch grows)",
          st.eager, st.launched);
    trio_check(&a, "second run");
    st = stats();
    CHECK(st.launched == 1 && st.instantiated == 1, "second run: %ld launched, %ld instantiated",
          st.launched, st.instantiated);
    for (int r = 0; r < 3; r++)
        trio_check(&a, "later run");
    st = stats();
    CHECK(st.launched == 4 && st.instantiated == 1 && st.eager == 1,
          "later runs update the graph: %ld launched, %ld instantiated, %ld eager", st.launched,
          st.instantiated, st.eager);

    /* a second shape (4 columns, 15 layers) alternating with the first: a graph each. Its
     * first run needs more scratch (4 columns to convert for the head): eager once more */
    struct trio b;
    CHECK(trio_new(&b, 15, 4), "%s", lt_last_error());
    for (int r = 0; r < 3; r++) {
        trio_check(&b, "shape b");
        trio_check(&a, "shape a after b");
    }
    st = stats();
    CHECK(st.launched == 9 && st.instantiated == 2 && st.eager == 2,
          "two shapes: %ld launched, %ld instantiated, %ld eager", st.launched, st.instantiated,
          st.eager);

    /* six more shapes (16 to 21 layers) twice in turn: four graphs are kept, so each run
     * evicts the least recently used and instantiates its own */
    struct trio many[6];
    for (int k = 0; k < 6; k++)
        CHECK(trio_new(&many[k], 16 + k, 1), "%s", lt_last_error());
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 6; k++)
            trio_check(&many[k], "six shapes");
    st = stats();
    CHECK(st.launched == 21 && st.instantiated == 14 && st.eager == 2,
          "six shapes in turn: %ld launched, %ld instantiated, %ld eager", st.launched,
          st.instantiated, st.eager);
    for (int k = 0; k < 6; k++)
        trio_free(&many[k]);

    /* a product over 16 columns: not a decode list, not captured */
    struct trio wide;
    CHECK(trio_new(&wide, 12, 16), "%s", lt_last_error());
    trio_check(&wide, "16 columns");
    struct lt_cuda_graph_stats st2 = stats();
    CHECK(st2.launched == st.launched && st2.eager == st.eager, "16 columns were captured");
    trio_free(&wide);

    struct lt_cuda_graph_stats off;
    lt_backend_cuda_graph_stats(cuda_e, &off);
    CHECK(off.launched == 0 && off.instantiated == 0 && off.eager == 0,
          "the default backend captured");
    printf("graphs: %ld launched, %ld instantiated, %ld lists run eagerly\n", st2.launched,
           st2.instantiated, st2.eager);
    trio_free(&a);
    trio_free(&b);
    lt_backend_free(cpu);
    lt_backend_free(cuda_e);
    lt_backend_free(cuda_g);
    return check_summary();
}
