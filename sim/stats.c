/* ringlm — simulator statistics helpers. SPDX-License-Identifier: MIT */
#include "sim/stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double sim_percentile(const double *v, size_t n, double q)
{
    if (n == 0) return NAN;
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    double f = pos - (double)lo;
    return v[lo] + (v[hi] - v[lo]) * f;
}

void sim_dist_of(double *v, size_t n, sim_dist *d)
{
    memset(d, 0, sizeof *d);
    d->n = n;
    if (n == 0) {
        d->mean = d->p50 = d->p90 = d->p99 = d->max = NAN;
        return;
    }
    qsort(v, n, sizeof *v, cmp_double);
    double s = 0;
    for (size_t i = 0; i < n; i++) s += v[i];
    d->mean = s / (double)n;
    d->p50 = sim_percentile(v, n, 0.50);
    d->p90 = sim_percentile(v, n, 0.90);
    d->p99 = sim_percentile(v, n, 0.99);
    d->max = v[n - 1];
}

double sim_jain(const double *x, size_t n)
{
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        s2 += x[i] * x[i];
    }
    if (n == 0 || s2 == 0) return 1;
    return s * s / ((double)n * s2);
}

void sim_fair_share(double total, const double *weight, const double *demand, size_t n,
                    double *share)
{
    /* Repeatedly give every unsatisfied party its weighted part of what is left; parties whose
     * demand is below their part are capped and leave the pool. At most n rounds. */
    unsigned char *done = calloc(n ? n : 1, 1);
    for (size_t i = 0; i < n; i++) share[i] = 0;
    double left = total;
    for (size_t round = 0; round < n && left > 1e-12; round++) {
        double w = 0;
        for (size_t i = 0; i < n; i++)
            if (!done || !done[i]) w += weight[i];
        if (w <= 0) break;
        int capped = 0;
        double unit = left / w;
        for (size_t i = 0; i < n; i++) {
            if (done && done[i]) continue;
            if (share[i] + unit * weight[i] >= demand[i]) {
                left -= demand[i] - share[i];
                share[i] = demand[i];
                if (done) done[i] = 1;
                capped = 1;
            }
        }
        if (!capped) {
            for (size_t i = 0; i < n; i++)
                if (!done || !done[i]) share[i] += unit * weight[i];
            left = 0;
        }
    }
    free(done);
}
