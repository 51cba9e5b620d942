/* check.h: the assertions every C test uses. A failed CHECK prints the file, line and
 * the condition (with an optional message) and counts a failure; the test's main returns
 * check_summary(), which prints "N passed, N failed" and exits non-zero on any failure. */
#ifndef LATHE_TESTS_CHECK_H
#define LATHE_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (cond) {                                                                        \
            check_passed++;                                                                \
        } else {                                                                           \
            check_failed++;                                                                \
            fprintf(stderr, "%s:%d: check failed: %s ", __FILE__, __LINE__, #cond);        \
            fprintf(stderr, " " __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                         \
        }                                                                                  \
    } while (0)

/* max |a-b| / (atol + rtol*|b|) style: returns the normalised error sum|a-b|^2/sum|b|^2 */
static inline double check_nmse(const float *a, const float *b, long n)
{
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? num / den : num;
}

/* Largest |a-b| / (atol + rtol*|b|) over the arrays; <= 1 means within tolerance. */
static inline double check_max_ratio(const float *a, const float *b, long n, double atol,
                                     double rtol, long *worst)
{
    double m = 0;
    for (long i = 0; i < n; i++) {
        double r = fabs((double)a[i] - (double)b[i]) / (atol + rtol * fabs((double)b[i]));
        if (r > m || r != r) {
            m = r != r ? INFINITY : r;
            if (worst)
                *worst = i;
        }
    }
    return m;
}

static inline int check_summary(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
