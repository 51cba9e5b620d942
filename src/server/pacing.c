/* pacing.c: how long a training job yields to serving after a window (one optimizer step),
 * as pure functions the trainer calls and tests check by hand (tests/test_server_pacing.c).
 *
 * The bound comes from averaging serving's decode rate over one window of length d and the
 * yield y after it: (r_w * d + r0 * y) / (d + y) >= (1 - T) * r0 solves to
 * y >= d * (r0 * (1 - T) - r_w) / (r0 * T). A window that slows serving less than T needs
 * no yield at all (y = 0); one that stops serving (r_w = 0) needs y = d * (1 - T) / T. */
#include <stdlib.h>
#include <string.h>

#include "server/server_impl.h"

double srv_pace_yield_bound(double d, double r0, double r_w, int max_slowdown_ppm)
{
    if (d <= 0 || max_slowdown_ppm <= 0)
        return 0;
    double T = max_slowdown_ppm >= 1000000 ? 1.0 : max_slowdown_ppm / 1e6;
    if (r0 <= 0 || r_w < 0)
        r_w = 0, r0 = 1; /* no measurement yet: the worst case */
    double y = d * (r0 * (1 - T) - r_w) / (r0 * T);
    return y > 0 ? y : 0;
}

double srv_pace_yield_share(double d, int share_ppm)
{
    if (d <= 0 || share_ppm >= 1000000)
        return 0;
    if (share_ppm <= 0)
        share_ppm = SRV_TRAIN_SHARE_PPM_DEFAULT;
    return d * (1e6 - share_ppm) / share_ppm;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double srv_pace_percentile(const double *v, int n, int pct)
{
    double s[256];
    if (n <= 0)
        return 0;
    n = n < 256 ? n : 256;
    memcpy(s, v, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    int k = (pct * n + 99) / 100; /* nearest rank: ceil(pct / 100 n), 1-based */
    k = k < 1 ? 1 : k;
    return s[k - 1];
}
