/* threadpool.h (internal): a fixed set of threads that run one function together.
 *
 * lt_threadpool_run(pool, fn, arg) calls fn(arg, ith, nth) on every thread (the caller is
 * thread 0) and returns when all are done. Inside fn, lt_barrier_wait lines the threads up
 * (e.g. between the nodes of a graph). Waiting spins briefly, then yields the core, so a
 * pool never starves another library's threads for long. */
#ifndef LATHE_CPU_THREADPOOL_H
#define LATHE_CPU_THREADPOOL_H

struct lt_threadpool;
struct lt_barrier;

struct lt_threadpool *lt_threadpool_new(int n_threads);
void lt_threadpool_free(struct lt_threadpool *pool);
int lt_threadpool_size(const struct lt_threadpool *pool);
void lt_threadpool_run(struct lt_threadpool *pool, void (*fn)(void *arg, int ith, int nth),
                       void *arg);
struct lt_barrier *lt_threadpool_barrier(struct lt_threadpool *pool);
void lt_barrier_wait(struct lt_barrier *b);

#endif
