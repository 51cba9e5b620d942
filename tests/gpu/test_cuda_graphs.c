/* test_cuda_graphs.c: CUDA graphs (a decode-sized node list that comes back unchanged is
 * recorded once by stream capture and then replayed as one graph) give the results of the
 * eager launches, bit for bit, and of the CPU within float rounding, through every path of
 * the graph cache:
 *   - the first run is eager (a list seen once is not captured) and grows scratch memory
 *     (a BF16 head over mmv's size limit converts its F32 activations into scratch), which
 *     changes the list's signature, so the second run is eager too; the third is captured
 *     and later runs with new inputs replay it;
 *   - two shapes alternating (the second growing scratch again, so the first's graph may
 *     not be replayed) end up with a graph each, replayed;
 *   - six shapes in turn (more than the lists remembered) run eagerly, correctly;
 *   - a list with a product over 65 activation columns is not a decode list: no signature,
 *     no capture; with LATHE_CUDA_GRAPHS=all it is captured and replayed like the others;
 *   - a backend made with LATHE_CUDA_GRAPHS=0 captures nothing.
 * The graph is a chain of matrix products (BF16, F32 and Q8_0 weights, as decode has them),
 * SiLU and residual additions ending in a 256 -> 73728 BF16 product. Exits 77 without a
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
#define HEAD 73728   /* the last product's outputs: 36 MiB of BF16, over mmv's 32 MiB */

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
#define WIDE 65
static float x_in[D * WIDE], out_g[HEAD * WIDE], out_e[HEAD * WIDE], out_c[HEAD * WIDE];

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

/* the counters moved by runs of a (or b) since `before`: launched, instantiated, eager */
static void check_moved(struct lt_cuda_graph_stats before, long launched, long instantiated,
                        long eager, const char *what)
{
    struct lt_cuda_graph_stats st = stats();
    CHECK(st.launched - before.launched == launched &&
              st.instantiated - before.instantiated == instantiated &&
              st.eager - before.eager == eager,
          "%s: %ld launched, %ld instantiated, %ld eager (want %ld, %ld, %ld)", what,
          st.launched - before.launched, st.instantiated - before.instantiated,
          st.eager - before.eager, launched, instantiated, eager);
}

int main(void)
{
    /* a node asking its family for more scratch than the family told admission fails */
    setenv("LATHE_CUDA_CHECK_SCRATCH", "1", 0);
    /* Q8_0 decode products run on int8 activations on the device (mmvq); the CPU rounds
     * the same way with this, so the comparison stays within float rounding */
    setenv("LATHE_MATMUL_DOT", "int8", 1);
    unsetenv("LATHE_CUDA_GRAPHS");
    cuda_g = lt_backend_cuda_new(0);
    if (!cuda_g) {
        printf("skipped: %s\n", lt_last_error());
        return 77;
    }
    setenv("LATHE_CUDA_GRAPHS", "0", 1);
    cuda_e = lt_backend_cuda_new(0);
    unsetenv("LATHE_CUDA_GRAPHS");
    cpu = lt_backend_cpu_new(0);
    CHECK(cuda_e && cpu, "%s", lt_last_error());
    if (!cuda_e || !cpu)
        return check_summary();
    make_weights();

    /* one shape: eager twice (first sight, then a new scratch generation), captured, then
     * replayed with new inputs */
    struct trio a;
    CHECK(trio_new(&a, 12, 1), "%s", lt_last_error());
    struct lt_cuda_graph_stats st = stats();
    trio_check(&a, "first run");
    trio_check(&a, "second run");
    check_moved(st, 0, 0, 2, "two runs");
    trio_check(&a, "third run");
    check_moved(st, 1, 1, 2, "three runs");
    for (int r = 0; r < 3; r++)
        trio_check(&a, "later run");
    check_moved(st, 4, 1, 2, "later runs replay the graph");

    /* a second shape (4 columns, 15 layers) alternating with the first; its first run grows
     * scratch again, so the first shape's graph is not replayed but captured anew */
    struct trio b;
    CHECK(trio_new(&b, 15, 4), "%s", lt_last_error());
    for (int r = 0; r < 3; r++) {
        trio_check(&b, "shape b");
        trio_check(&a, "shape a after b");
    }
    st = stats();
    for (int r = 0; r < 2; r++) {
        trio_check(&b, "shape b, settled");
        trio_check(&a, "shape a, settled");
    }
    check_moved(st, 4, 0, 0, "two shapes alternating replay their graphs");

    /* six more shapes (16 to 21 layers) twice in turn: each is remembered for fewer lists
     * than come between its runs, so all run eagerly */
    struct trio many[6];
    for (int k = 0; k < 6; k++)
        CHECK(trio_new(&many[k], 16 + k, 1), "%s", lt_last_error());
    st = stats();
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 6; k++)
            trio_check(&many[k], "six shapes");
    check_moved(st, 0, 0, 12, "six shapes in turn");
    for (int k = 0; k < 6; k++)
        trio_free(&many[k]);
    /* the first two shapes' graphs are still kept */
    st = stats();
    trio_check(&a, "shape a, kept");
    trio_check(&b, "shape b, kept");
    check_moved(st, 2, 0, 0, "kept graphs after the six");

    /* a product over 65 columns: not a decode list, never captured by default (a repeated
     * prefill would pay for a capture once in a run of three, and a training step at 16 x 512
     * tokens is bound by the device: on the H200 its wall time equals its nodes' device
     * time, 286 against 291 ms) */
    struct trio wide;
    CHECK(trio_new(&wide, 12, WIDE), "%s", lt_last_error());
    st = stats();
    for (int r = 0; r < 3; r++)
        trio_check(&wide, "65 columns");
    check_moved(st, 0, 0, 0, "65 columns");
    trio_free(&wide);

    /* LATHE_CUDA_GRAPHS=all keeps it: eager twice (first sight, then the scratch the first
     * run grew), captured on the third run, replayed after, each run equal to eager bit for
     * bit (a training step's lists are such lists) */
    setenv("LATHE_CUDA_GRAPHS", "all", 1);
    struct lt_backend *cuda_all = lt_backend_cuda_new(0);
    unsetenv("LATHE_CUDA_GRAPHS");
    struct chain wa, we;
    CHECK(cuda_all && chain_new(&wa, cuda_all, 12, WIDE) && chain_new(&we, cuda_e, 12, WIDE), "%s",
          lt_last_error());
    for (int r = 0; cuda_all && r < 5; r++) {
        for (int i = 0; i < D * WIDE; i++)
            x_in[i] = rnd();
        CHECK(chain_run(&wa, x_in, out_g) && chain_run(&we, x_in, out_e), "wide run %d", r);
        CHECK(memcmp(out_g, out_e, sizeof(float) * HEAD * WIDE) == 0,
              "LATHE_CUDA_GRAPHS=all, run %d: graph and eager differ", r);
    }
    struct lt_cuda_graph_stats all = {0};
    if (cuda_all)
        lt_backend_cuda_graph_stats(cuda_all, &all);
    CHECK(all.launched == 3 && all.instantiated == 1 && all.eager == 2,
          "LATHE_CUDA_GRAPHS=all over 5 runs of 65 columns: %ld launched, %ld instantiated, %ld "
          "eager (want 3, 1, 2)",
          all.launched, all.instantiated, all.eager);
    chain_free(&wa);
    chain_free(&we);
    lt_backend_free(cuda_all);

    struct lt_cuda_graph_stats off;
    lt_backend_cuda_graph_stats(cuda_e, &off);
    CHECK(off.launched == 0 && off.instantiated == 0 && off.eager == 0,
          "the backend made with LATHE_CUDA_GRAPHS=0 captured");
    st = stats();
    printf("graphs: %ld launched, %ld instantiated, %ld lists run eagerly\n", st.launched,
           st.instantiated, st.eager);
    trio_free(&a);
    trio_free(&b);
    lt_backend_free(cpu);
    lt_backend_free(cuda_e);
    lt_backend_free(cuda_g);
    return check_summary();
}
