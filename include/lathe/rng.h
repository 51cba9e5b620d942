/* rng.h: lathe's pseudo-random numbers (xoshiro256**, seeded through splitmix64), the same
 * sequence for a seed on every machine. */
#ifndef LATHE_RNG_H
#define LATHE_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct lt_rng {
    uint64_t s[4];
};
void lt_rng_seed(struct lt_rng *r, uint64_t seed);
uint64_t lt_rng_next(struct lt_rng *r);
double lt_rng_uniform(struct lt_rng *r); /* [0, 1), 53 random bits */

#ifdef __cplusplus
}
#endif
#endif
