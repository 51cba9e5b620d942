/* bench_util.h: what the C benchmarks share: a monotonic clock, the median of timed
 * repetitions, and a fixed xorshift sequence of uniform floats (the same numbers every run). */
#ifndef LATHE_BENCH_UTIL_H
#define LATHE_BENCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the median of v[0..n) (sorts v) */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* the next number of one xorshift64 sequence */
static inline uint64_t bench_next_u64(void)
{
    static uint64_t rng = 0x243F6A8885A308D3ull;
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* uniform in [lo, hi): 24 bits of the next number */
static inline float bench_rnd(float lo, float hi)
{
    return lo + (hi - lo) * (float)((bench_next_u64() >> 40) * (1.0 / 16777216.0));
}

#endif
