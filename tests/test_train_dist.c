/* test_train_dist.c: data-parallel training jobs (lt_train_params.comm) on the CPU, with
 * ranks on threads of this process (lt_comm_threads_new), each with its own model and CPU
 * backend, on a tiny random model (test_train_tiny.h):
 * - two ranks sharing each step's micro-batches give the loss curve of one rank training on
 *   the same global batch (within TOL_RANKS), and so do three ranks;
 * - only rank 0 writes the output;
 * - a memory refusal on rank 1 alone refuses the job on both ranks with rank 1's refusal,
 *   nothing allocated or written; another failure on rank 1 reaches rank 0 with its words;
 * - a one-rank communicator gives exactly the job without one: the same curve bit for bit
 *   and the same adapter file byte for byte. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "lathe/backend.h"
#include "lathe/comm.h"
#include "lathe/model.h"
#include "lathe/train.h"
#include "test_train_tiny.h"

/* Ranks sum their gradients in another order than one rank accumulates them ((g0 + g2) +
 * (g1 + g3) against ((g0 + g1) + g2) + g3): F32 rounding, not a different update. */
#define TOL_RANKS 1e-5

#define MAX_RANKS 3

static char model_path[600], out_path[MAX_RANKS][600];
static const char *text;

static bool exists(const char *p)
{
    return access(p, F_OK) == 0;
}

struct rank_job {
    struct lt_train_params p;
    struct lt_train_result r;
};

/* One rank: its own model and backend, as separate processes on separate GPUs would have. */
static void *rank_main(void *arg)
{
    struct rank_job *rj = arg;
    struct lt_model *m = NULL;
    struct lt_backend *cpu = lt_backend_cpu_new(1);
    memset(&rj->r, 0, sizeof(rj->r));
    if (!cpu || lt_model_load(model_path, NULL, &m) != LT_OK) {
        rj->r.status = LT_ERR_IO;
        snprintf(rj->r.error, sizeof(rj->r.error), "load: %s", lt_last_error());
    } else {
        lt_train_job_run(m, &cpu, 1, &rj->p, NULL, NULL, &rj->r);
    }
    lt_model_free(m);
    lt_backend_free(cpu);
    return NULL;
}

/* Runs the jobs of n ranks (jobs[r].p given, comm filled here) on n threads. */
static void run_ranks(struct rank_job *jobs, int n)
{
    struct lt_comm *comm[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    CHECK(lt_comm_threads_new(n, comm) == LT_OK, "%s", lt_last_error());
    for (int r = 0; r < n; r++) {
        jobs[r].p.comm = comm[r];
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        lt_comm_free(comm[r]);
    }
}

static struct lt_train_params base_params(void)
{
    /* batch 4 on the host: micro-batches of one window, four a step; the last step of an
     * epoch is short, so a rank gets no micro-batch of it */
    return (struct lt_train_params){.out = out_path[0],
                                    .text = text,
                                    .rank = 4,
                                    .window = 32,
                                    .epochs = 2,
                                    .lr = 1e-2f,
                                    .batch = 4,
                                    .targets = "attn_q,attn_v,ffn_down"};
}

/* (a) and (b): n ranks against one rank without a communicator. */
static void test_same_curve(const struct lt_train_result *one, int n)
{
    struct rank_job jobs[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        remove(out_path[r]);
        jobs[r].p = base_params();
        jobs[r].p.out = out_path[r];
    }
    run_ranks(jobs, n);
    double worst = 0;
    for (int r = 0; r < n; r++) {
        const struct lt_train_result *res = &jobs[r].r;
        CHECK(res->status == LT_OK && res->state == LT_TRAIN_DONE, "rank %d: %s", r, res->error);
        CHECK(res->n_curve == one->n_curve && res->tokens == one->tokens,
              "rank %d: %d steps, %lld tokens; one rank: %d, %lld", r, res->n_curve,
              (long long)res->tokens, one->n_curve, (long long)one->tokens);
        for (int s = 0; s < res->n_curve && s < one->n_curve; s++) {
            double rel = fabs((double)res->curve[s] - one->curve[s]) / fabs(one->curve[s]);
            worst = rel > worst ? rel : worst;
            CHECK(rel <= TOL_RANKS, "rank %d of %d, step %d: loss %.9g, one rank %.9g", r, n, s + 1,
                  res->curve[s], one->curve[s]);
        }
        for (int e = 0; e < res->n_epochs; e++)
            CHECK(fabs((double)res->train_loss[e] - one->train_loss[e]) <=
                      TOL_RANKS * fabs(one->train_loss[e]),
                  "rank %d epoch %d: %g vs %g", r, e + 1, res->train_loss[e], one->train_loss[e]);
        /* every rank applied the same updates: the same bits on every rank */
        CHECK(!memcmp(res->curve, jobs[0].r.curve, (size_t)res->n_curve * sizeof(float)),
              "rank %d's curve is rank 0's", r);
    }
    printf("%d ranks: %d steps, loss %.6f -> %.6f, largest relative difference from one rank "
           "%.3g\n",
           n, one->n_curve, one->curve[0], one->curve[one->n_curve - 1], worst);
    CHECK(exists(out_path[0]), "rank 0 wrote its output");
    for (int r = 1; r < n; r++)
        CHECK(!exists(out_path[r]), "rank %d wrote nothing", r);
    for (int r = 0; r < n; r++) {
        lt_train_result_free(&jobs[r].r);
        remove(out_path[r]);
    }
}

/* (c): a refusal (and another failure) on rank 1 only stops both ranks with rank 1's words. */
static void test_refusal(void)
{
    struct rank_job jobs[2];
    for (int r = 0; r < 2; r++) {
        remove(out_path[r]);
        jobs[r].p = base_params();
        jobs[r].p.out = out_path[r];
        jobs[r].p.window = 512; /* attention scores alone: 512 x 512 x 4 heads x 4 bytes */
    }
    jobs[1].p.memory_budget_mib = 1;
    run_ranks(jobs, 2);
    for (int r = 0; r < 2; r++) {
        const struct lt_train_result *res = &jobs[r].r;
        CHECK(res->status == LT_ERR_REFUSED && res->state == LT_TRAIN_ERROR &&
                  res->refusal.kind == LT_REFUSAL_MEMORY && res->refusal.budget_bytes == (1u << 20),
              "rank %d: refused with rank 1's memory refusal: %s", r, res->error);
        CHECK(!strcmp(res->error, jobs[1].r.refusal.sentence) && res->allocated_bytes == 0 &&
                  res->n_curve == 0,
              "rank %d: rank 1's sentence, nothing allocated or trained: %s", r, res->error);
        CHECK(!exists(out_path[r]), "rank %d: nothing written", r);
    }
    CHECK(jobs[0].r.peak_bytes > 0, "rank 0 was admitted on its own budget");
    for (int r = 0; r < 2; r++)
        lt_train_result_free(&jobs[r].r);

    for (int r = 0; r < 2; r++)
        jobs[r].p = base_params();
    jobs[1].p.text = NULL;
    jobs[1].p.text_path = "/nonexistent/rank1.txt";
    run_ranks(jobs, 2);
    CHECK(jobs[0].r.status == LT_ERR_IO && strstr(jobs[0].r.error, "rank 1 of 2: ") &&
              strstr(jobs[0].r.error, "/nonexistent/rank1.txt") && jobs[1].r.status == LT_ERR_IO,
          "rank 1's failure on rank 0: %s", jobs[0].r.error);
    CHECK(!exists(out_path[0]), "nothing written");
    for (int r = 0; r < 2; r++)
        lt_train_result_free(&jobs[r].r);
}

static bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

/* (d): a one-rank communicator is no communicator, exactly. */
static void test_single(const struct lt_train_result *one)
{
    struct lt_comm *c = lt_comm_single_new();
    struct rank_job job = {.p = base_params()};
    job.p.out = out_path[1];
    job.p.comm = c;
    remove(out_path[1]);
    rank_main(&job);
    CHECK(job.r.status == LT_OK && job.r.n_curve == one->n_curve &&
              !memcmp(job.r.curve, one->curve, (size_t)one->n_curve * sizeof(float)) &&
              !memcmp(job.r.train_loss, one->train_loss, sizeof(one->train_loss)) &&
              job.r.tokens == one->tokens,
          "one rank: the same curve bit for bit: %s", job.r.error);
    CHECK(same_file(out_path[0], out_path[1]), "one rank: the same adapter byte for byte");
    lt_train_result_free(&job.r);
    remove(out_path[1]);
    lt_comm_free(c);
}

int main(void)
{
    char dir[400];
    tiny_path(dir, sizeof(dir), "");
    snprintf(model_path, sizeof(model_path), "%stest_train_dist.gguf", dir);
    for (int r = 0; r < MAX_RANKS; r++)
        snprintf(out_path[r], sizeof(out_path[r]), "%stest_train_dist_out%d.gguf", dir, r);
    text = tiny_train_text();
    struct tiny_spec sp = {32, 4, 2, 64, 2, LT_TYPE_F32, 7};
    if (tiny_model_write(model_path, &sp) != 0)
        return 1;

    /* one rank, no communicator: the reference */
    struct rank_job one = {.p = base_params()};
    remove(out_path[0]);
    rank_main(&one);
    CHECK(one.r.status == LT_OK && one.r.n_curve > 2, "one rank: %s", one.r.error);
    if (one.r.status == LT_OK) {
        test_single(&one.r); /* before out_path[0] is overwritten */
        test_same_curve(&one.r, 2);
        test_same_curve(&one.r, 3);
    }
    test_refusal();
    lt_train_result_free(&one.r);
    for (int r = 0; r < MAX_RANKS; r++)
        remove(out_path[r]);
    remove(model_path);
    return check_summary();
}
