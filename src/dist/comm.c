/* comm.c: the communicator's public functions, the one-rank communicator and the threads
 * communicator (N ranks in one process).
 *
 * The threads group meets at a barrier twice per collective: every rank posts its buffer's
 * address, waits until all have, reads what it needs from the others, waits again (so no
 * rank changes or frees a buffer another still reads), then writes its own. A sum is taken
 * in rank order (rank 0's value, plus rank 1's, ...) by every rank alike, so all ranks end
 * with the same bits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm_impl.h"
#include "lathe/backend.h"

int lt_comm_rank(const struct lt_comm *c)
{
    return c->rank;
}
int lt_comm_size(const struct lt_comm *c)
{
    return c->size;
}
const char *lt_comm_kind(const struct lt_comm *c)
{
    return c->iface->kind;
}

lt_status lt_comm_allreduce_f32(struct lt_comm *c, float *buf, size_t n)
{
    return c->size == 1 || n == 0 ? LT_OK : c->iface->allreduce_f32(c, buf, n);
}

lt_status lt_comm_allreduce_f64(struct lt_comm *c, double *buf, size_t n)
{
    return c->size == 1 || n == 0 ? LT_OK : c->iface->allreduce_f64(c, buf, n);
}

lt_status lt_comm_allreduce_tensor(struct lt_comm *c, struct lt_tensor *t)
{
    if (t->type != LT_TYPE_F32 || !lt_is_contiguous(t))
        return lt_fail(LT_ERR_INVALID,
                       "all-reduce of '%s': a sum over ranks needs a contiguous "
                       "F32 tensor",
                       t->name);
    if (c->size == 1)
        return LT_OK;
    if (c->iface->allreduce_tensor) {
        lt_status st = c->iface->allreduce_tensor(c, t);
        if (st != LT_ERR_UNSUPPORTED)
            return st;
    }
    size_t bytes = lt_nbytes(t);
    float *host = malloc(bytes ? bytes : 1);
    /* a rank out of memory still joins the sum (with zeros), so the others are not left
     * waiting; it reports the failure, and the job's next agreement spreads it */
    lt_status st = host ? lt_tensor_get(t, host, 0, bytes) : LT_ERR_NOMEM;
    if (!host)
        lt_fail(st, "all-reduce of '%s': out of host memory for %zu bytes", t->name, bytes);
    float zero = 0;
    lt_status rst = c->iface->allreduce_f32(c, host ? host : &zero, host ? bytes / 4 : 0);
    if (st == LT_OK)
        st = rst;
    if (st == LT_OK)
        st = lt_tensor_set(t, host, 0, bytes);
    free(host);
    return st;
}

lt_status lt_comm_broadcast(struct lt_comm *c, void *buf, size_t bytes, int root)
{
    if (root < 0 || root >= c->size)
        return lt_fail(LT_ERR_INVALID, "broadcast from rank %d of a group of %d", root, c->size);
    return c->size == 1 || bytes == 0 ? LT_OK : c->iface->broadcast(c, buf, bytes, root);
}

/* Each rank's status in its own slot of a sum (statuses are small integers, exact in a
 * double), then the first failing rank's reason broadcast from it. */
lt_status lt_comm_agree(struct lt_comm *c, lt_status st, const char *reason,
                        struct lt_comm_verdict *out)
{
    memset(out, 0, sizeof(*out));
    out->rank = -1;
    if (st != LT_OK)
        snprintf(out->reason, sizeof(out->reason), "%s", reason ? reason : lt_last_error());
    out->status = st;
    if (st != LT_OK)
        out->rank = c->rank;
    if (c->size == 1)
        return LT_OK;
    double *all = calloc((size_t)c->size, sizeof(double));
    if (!all)
        return lt_fail(LT_ERR_NOMEM, "out of memory for a status agreement");
    all[c->rank] = (double)st;
    lt_status cst = c->iface->allreduce_f64(c, all, (size_t)c->size);
    out->status = LT_OK;
    out->rank = -1;
    for (int r = 0; cst == LT_OK && r < c->size && out->rank < 0; r++)
        if (all[r] != 0) {
            out->rank = r;
            out->status = (lt_status)all[r];
        }
    free(all);
    if (cst == LT_OK && out->rank >= 0)
        cst = c->iface->broadcast(c, out->reason, sizeof(out->reason), out->rank);
    return cst;
}

void lt_comm_free(struct lt_comm *c)
{
    if (c)
        c->iface->free(c);
}

/* ---- one rank ---- */

static void single_free(struct lt_comm *c)
{
    free(c);
}

/* A group of one needs no collective: the functions above answer it before reaching the
 * interface, so it has none. */
static const struct comm_iface single_iface = {
    .kind = "single",
    .free = single_free,
};

struct lt_comm *lt_comm_single_new(void)
{
    struct lt_comm *c = calloc(1, sizeof(*c));
    if (!c) {
        lt_fail(LT_ERR_NOMEM, "out of memory for a communicator");
        return NULL;
    }
    c->iface = &single_iface;
    c->size = 1;
    return c;
}

/* ---- N ranks on N threads ---- */

/* Shared by the group's handles. mu guards arrived, gen and refs; slot[r] is written by
 * rank r alone before the first barrier of a collective and read by the others between the
 * two barriers, which order those accesses (the barrier takes mu). */
struct thread_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    int arrived;  /* ranks waiting at the barrier */
    unsigned gen; /* barriers passed */
    int refs;     /* handles not yet freed */
    void **slot;  /* [n] */
};

static void group_barrier(struct thread_group *g)
{
    pthread_mutex_lock(&g->mu);
    unsigned gen = g->gen;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->gen)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

/* Sums n elements of `elem` bytes (4: float, 8: double) over the ranks into buf. */
static lt_status threads_sum(struct lt_comm *c, void *buf, size_t n, size_t elem)
{
    struct thread_group *g = c->impl;
    void *sum = malloc(n * elem);
    g->slot[c->rank] = buf;
    group_barrier(g);
    if (sum && elem == sizeof(float)) {
        float *s = sum;
        memcpy(s, g->slot[0], n * elem);
        for (int r = 1; r < g->n; r++)
            for (size_t i = 0; i < n; i++)
                s[i] += ((const float *)g->slot[r])[i];
    } else if (sum) {
        double *s = sum;
        memcpy(s, g->slot[0], n * elem);
        for (int r = 1; r < g->n; r++)
            for (size_t i = 0; i < n; i++)
                s[i] += ((const double *)g->slot[r])[i];
    }
    group_barrier(g);
    if (!sum)
        return lt_fail(LT_ERR_NOMEM, "all-reduce: out of memory for %zu bytes", n * elem);
    memcpy(buf, sum, n * elem);
    free(sum);
    return LT_OK;
}

static lt_status threads_f32(struct lt_comm *c, float *buf, size_t n)
{
    return threads_sum(c, buf, n, sizeof(float));
}

static lt_status threads_f64(struct lt_comm *c, double *buf, size_t n)
{
    return threads_sum(c, buf, n, sizeof(double));
}

static lt_status threads_broadcast(struct lt_comm *c, void *buf, size_t bytes, int root)
{
    struct thread_group *g = c->impl;
    g->slot[c->rank] = buf;
    group_barrier(g);
    if (c->rank != root)
        memcpy(buf, g->slot[root], bytes);
    group_barrier(g);
    return LT_OK;
}

static void threads_free(struct lt_comm *c)
{
    struct thread_group *g = c->impl;
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    free(c);
    if (!last)
        return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->slot);
    free(g);
}

static const struct comm_iface threads_iface = {
    .kind = "threads",
    .allreduce_f32 = threads_f32,
    .allreduce_f64 = threads_f64,
    .broadcast = threads_broadcast,
    .free = threads_free,
};

lt_status lt_comm_threads_new(int n, struct lt_comm **ranks)
{
    if (n < 1 || n > 4096)
        return lt_fail(LT_ERR_INVALID, "a group of %d ranks; 1 to 4096 are possible", n);
    for (int r = 0; r < n; r++)
        ranks[r] = NULL;
    struct thread_group *g = calloc(1, sizeof(*g));
    void **slot = calloc((size_t)n, sizeof(void *));
    if (!g || !slot) {
        free(g);
        free(slot);
        return lt_fail(LT_ERR_NOMEM, "out of memory for a group of %d ranks", n);
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->n = n;
    g->slot = slot;
    for (int r = 0; r < n; r++) {
        ranks[r] = calloc(1, sizeof(struct lt_comm));
        if (!ranks[r]) {
            for (int k = 0; k < r; k++)
                lt_comm_free(ranks[k]);
            /* with no handle yet, the group goes here */
            if (r == 0) {
                pthread_mutex_destroy(&g->mu);
                pthread_cond_destroy(&g->cv);
                free(slot);
                free(g);
            }
            for (int k = 0; k < n; k++)
                ranks[k] = NULL;
            return lt_fail(LT_ERR_NOMEM, "out of memory for a group of %d ranks", n);
        }
        *ranks[r] = (struct lt_comm){.iface = &threads_iface, .rank = r, .size = n, .impl = g};
        g->refs++;
    }
    return LT_OK;
}

#ifndef LATHE_HAVE_NCCL
bool lt_comm_have_nccl(void)
{
    return false;
}

lt_status lt_comm_nccl_group_new(int n, const int *devices, struct lt_comm **ranks)
{
    return lt_fail(LT_ERR_UNSUPPORTED,
                   "this build has no NCCL, so it runs one rank on one GPU; "
                   "build with cmake -DLATHE_NCCL=ON (NCCL from the PyPI wheel nvidia-nccl-cu13) "
                   "to train on %d GPUs",
                   n);
}
#endif
