/* threadpool.c: workers sleep on a condition variable between jobs; within a job they meet
 * at a sense-reversing barrier built on atomics. */
#include <pthread.h>
#include <stdbool.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/threadpool.h"

struct lt_barrier {
    int n;
    atomic_int arrived;
    atomic_int sense;
};

struct lt_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    unsigned generation; /* bumped per job */
    int running;         /* workers still inside the current job */
    bool stop;
    void (*fn)(void *, int, int);
    void *arg;
    struct lt_barrier barrier;
};

struct worker_arg {
    struct lt_threadpool *pool;
    int ith;
};

void lt_barrier_wait(struct lt_barrier *b)
{
    if (b->n == 1)
        return;
    int sense = atomic_load_explicit(&b->sense, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == b->n - 1) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&b->sense, !sense, memory_order_release);
        return;
    }
    for (int spins = 0; atomic_load_explicit(&b->sense, memory_order_acquire) == sense; spins++)
        if (spins > 256)
            sched_yield();
}

static void *worker_main(void *varg)
{
    struct worker_arg *wa = varg;
    struct lt_threadpool *pool = wa->pool;
    int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        while (pool->generation == seen && !pool->stop)
            pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->stop) {
            pthread_mutex_unlock(&pool->lock);
            return NULL;
        }
        seen = pool->generation;
        void (*fn)(void *, int, int) = pool->fn;
        void *arg = pool->arg;
        pthread_mutex_unlock(&pool->lock);

        fn(arg, ith, pool->n_threads);

        pthread_mutex_lock(&pool->lock);
        if (--pool->running == 0)
            pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->lock);
    }
}

struct lt_threadpool *lt_threadpool_new(int n_threads)
{
    struct lt_threadpool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return NULL;
    pool->n_threads = n_threads < 1 ? 1 : n_threads;
    pool->barrier.n = pool->n_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->threads = calloc((size_t)pool->n_threads, sizeof(pthread_t));
    if (!pool->threads)
        goto out_free_pool;
    for (int i = 1; i < pool->n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (wa)
            *wa = (struct worker_arg){pool, i};
        if (!wa || pthread_create(&pool->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            pool->n_threads = i; /* stop the ones already started */
            lt_threadpool_free(pool);
            return NULL;
        }
    }
    return pool;
out_free_pool:
    free(pool);
    return NULL;
}

void lt_threadpool_free(struct lt_threadpool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = true;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->n_threads; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    free(pool->threads);
    free(pool);
}

int lt_threadpool_size(const struct lt_threadpool *pool) { return pool->n_threads; }

struct lt_barrier *lt_threadpool_barrier(struct lt_threadpool *pool) { return &pool->barrier; }

void lt_threadpool_run(struct lt_threadpool *pool, void (*fn)(void *arg, int ith, int nth),
                       void *arg)
{
    if (pool->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->running = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    fn(arg, 0, pool->n_threads);

    pthread_mutex_lock(&pool->lock);
    while (pool->running > 0)
        pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
