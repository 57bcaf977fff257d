/* ringlm — seeded random numbers for the simulator. SPDX-License-Identifier: MIT */
#ifndef RINGLM_SIM_RNG_H
#define RINGLM_SIM_RNG_H

#include <math.h>
#include <stdint.h>

/* xoshiro256** seeded through splitmix64: fast, good enough for workloads, and identical on
 * every platform so a seed names one workload everywhere (libc rand() would not). */
typedef struct sim_rng {
    uint64_t s[4];
} sim_rng;

static inline uint64_t sim_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void sim_rng_seed(sim_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = sim_splitmix64(&seed);
}

static inline uint64_t sim_rng_u64(sim_rng *r)
{
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5, result = ((x << 7) | (x >> 57)) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Uniform in (0, 1): never 0, so log() is safe. */
static inline double sim_rng_unif(sim_rng *r)
{
    return ((double)(sim_rng_u64(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static inline double sim_rng_exp(sim_rng *r, double mean)
{
    return -mean * log(sim_rng_unif(r));
}

static inline double sim_rng_normal(sim_rng *r)
{
    double u = sim_rng_unif(r), v = sim_rng_unif(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Gamma(shape k, scale 1), Marsaglia–Tsang; k < 1 through the boost U^(1/k). */
static inline double sim_rng_gamma(sim_rng *r, double k)
{
    double boost = 1.0;
    if (k < 1.0) {
        boost = pow(sim_rng_unif(r), 1.0 / k);
        k += 1.0;
    }
    double d = k - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = sim_rng_normal(r), v = 1.0 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        double u = sim_rng_unif(r);
        if (u < 1.0 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return boost * d * v;
    }
}

/* Integer uniform in [lo, hi]. */
static inline uint64_t sim_rng_range(sim_rng *r, uint64_t lo, uint64_t hi)
{
    return hi <= lo ? lo : lo + sim_rng_u64(r) % (hi - lo + 1);
}

#endif
