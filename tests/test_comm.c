/* test_comm.c: communicators (lathe/comm.h) on the CPU: a group of three ranks on three
 * threads sums F32 and F64 buffers and a host tensor to the same bits on every rank,
 * broadcasts from any rank, and agrees on a status with the lowest failing rank's reason;
 * the one-rank communicator is the identity; a build without NCCL says how to get it. */
#include <pthread.h>
#include <string.h>

#include "check.h"
#include "lathe/comm.h"
#include "lathe/tensor.h"

#define N_RANKS 3

/* What each rank's thread saw; checked on the main thread (CHECK counts are not atomic). */
struct rank_out {
    struct lt_comm *c;
    lt_status st;
    float f[3];
    double d[2];
    float t[5];
    char bc[16];
    struct lt_comm_verdict ok, fail;
};

static void *rank_main(void *arg)
{
    struct rank_out *o = arg;
    int r = lt_comm_rank(o->c);
    o->f[0] = (float)(r + 1);
    o->f[1] = 0.1f * (float)(r + 1);
    o->f[2] = -1.0f;
    o->d[0] = 1e-17 * r;
    o->d[1] = 1.0;
    lt_status st = lt_comm_allreduce_f32(o->c, o->f, 3);
    if (st == LT_OK)
        st = lt_comm_allreduce_f64(o->c, o->d, 2);
    struct lt_ctx *ctx = lt_ctx_init((struct lt_ctx_params){.mem_size = 1 << 16});
    struct lt_tensor *t = ctx ? lt_new_tensor_1d(ctx, LT_TYPE_F32, 5) : NULL;
    for (int i = 0; t && i < 5; i++)
        ((float *)t->data)[i] = (float)(i * 10 + r);
    if (st == LT_OK)
        st = t ? lt_comm_allreduce_tensor(o->c, t) : LT_ERR_NOMEM;
    if (t)
        memcpy(o->t, t->data, sizeof(o->t));
    lt_ctx_free(ctx);
    snprintf(o->bc, sizeof(o->bc), "rank %d", r);
    if (st == LT_OK)
        st = lt_comm_broadcast(o->c, o->bc, sizeof(o->bc), 2);
    if (st == LT_OK)
        st = lt_comm_agree(o->c, LT_OK, NULL, &o->ok);
    /* ranks 1 and 2 fail, each with its own reason: rank 1's wins */
    char why[64];
    snprintf(why, sizeof(why), "rank %d ran out of patience", r);
    if (st == LT_OK)
        st = lt_comm_agree(o->c,
                           r == 0   ? LT_OK
                           : r == 1 ? LT_ERR_REFUSED
                                    : LT_ERR_IO,
                           why, &o->fail);
    o->st = st;
    return NULL;
}

static void test_threads(void)
{
    struct lt_comm *ranks[N_RANKS];
    CHECK(lt_comm_threads_new(N_RANKS, ranks) == LT_OK, "%s", lt_last_error());
    struct rank_out out[N_RANKS];
    pthread_t th[N_RANKS];
    memset(out, 0, sizeof(out));
    for (int r = 0; r < N_RANKS; r++) {
        out[r].c = ranks[r];
        pthread_create(&th[r], NULL, rank_main, &out[r]);
    }
    for (int r = 0; r < N_RANKS; r++)
        pthread_join(th[r], NULL);
    /* the sum in rank order, as the group takes it */
    float f1 = 0.1f * 1.0f;
    f1 += 0.1f * 2.0f;
    f1 += 0.1f * 3.0f;
    for (int r = 0; r < N_RANKS; r++) {
        struct rank_out *o = &out[r];
        CHECK(o->st == LT_OK && lt_comm_rank(ranks[r]) == r && lt_comm_size(ranks[r]) == N_RANKS &&
                  !strcmp(lt_comm_kind(ranks[r]), "threads"),
              "rank %d: %d", r, (int)o->st);
        CHECK(o->f[0] == 6.0f && o->f[1] == f1 && o->f[2] == -3.0f, "rank %d: f32 sums %g %g %g", r,
              o->f[0], o->f[1], o->f[2]);
        CHECK(o->d[0] == 1e-17 + 2e-17 && o->d[1] == 3.0, "rank %d: f64 sums %g %g", r, o->d[0],
              o->d[1]);
        for (int i = 0; i < 5; i++)
            CHECK(o->t[i] == (float)(30 * i + 3), "rank %d: tensor[%d] = %g", r, i, o->t[i]);
        CHECK(!strcmp(o->bc, "rank 2"), "rank %d: broadcast from rank 2 gave '%s'", r, o->bc);
        CHECK(o->ok.status == LT_OK && o->ok.rank == -1 && !o->ok.reason[0],
              "rank %d: all ok: %d %d '%s'", r, (int)o->ok.status, o->ok.rank, o->ok.reason);
        CHECK(o->fail.status == LT_ERR_REFUSED && o->fail.rank == 1 &&
                  !strcmp(o->fail.reason, "rank 1 ran out of patience"),
              "rank %d: the lowest failing rank's reason: %d %d '%s'", r, (int)o->fail.status,
              o->fail.rank, o->fail.reason);
    }
    for (int r = 0; r < N_RANKS; r++)
        lt_comm_free(ranks[r]);
}

static void test_single(void)
{
    struct lt_comm *c = lt_comm_single_new();
    CHECK(c && lt_comm_rank(c) == 0 && lt_comm_size(c) == 1 && !strcmp(lt_comm_kind(c), "single"),
          "one rank");
    float f[2] = {1.5f, -2.0f};
    double d = 0.25;
    char b[4] = "abc";
    struct lt_comm_verdict v;
    CHECK(lt_comm_allreduce_f32(c, f, 2) == LT_OK && f[0] == 1.5f && f[1] == -2.0f, "identity");
    CHECK(lt_comm_allreduce_f64(c, &d, 1) == LT_OK && d == 0.25, "identity");
    CHECK(lt_comm_broadcast(c, b, 4, 0) == LT_OK && !strcmp(b, "abc"), "identity");
    CHECK(lt_comm_broadcast(c, b, 4, 1) == LT_ERR_INVALID, "no rank 1 in a group of one");
    CHECK(lt_comm_agree(c, LT_ERR_IO, "the disk", &v) == LT_OK && v.status == LT_ERR_IO &&
              v.rank == 0 && !strcmp(v.reason, "the disk"),
          "its own verdict: %d %d '%s'", (int)v.status, v.rank, v.reason);
    lt_comm_free(c);
}

static void test_nccl(void)
{
    struct lt_comm *ranks[2];
    int devices[2] = {0, 1};
    if (lt_comm_have_nccl()) {
        /* one rank on GPU 0: made, or (no GPU here) refused with CUDA's or NCCL's words */
        lt_status st = lt_comm_nccl_group_new(1, devices, ranks);
        CHECK(st == LT_OK ? lt_comm_size(ranks[0]) == 1 && !strcmp(lt_comm_kind(ranks[0]), "nccl")
                          : st == LT_ERR_BACKEND && (strstr(lt_last_error(), "NCCL") ||
                                                     strstr(lt_last_error(), "CUDA")),
              "one NCCL rank: %s", st == LT_OK ? "made" : lt_last_error());
        if (st == LT_OK)
            lt_comm_free(ranks[0]);
        return;
    }
    CHECK(lt_comm_nccl_group_new(2, devices, ranks) == LT_ERR_UNSUPPORTED &&
              strstr(lt_last_error(), "-DLATHE_NCCL=ON"),
          "without NCCL: %s", lt_last_error());
}

int main(void)
{
    test_threads();
    test_single();
    test_nccl();
    return check_summary();
}
