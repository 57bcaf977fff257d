/* SPDX-License-Identifier: MIT */
/*
 * perf/bench_util.h — the statistics every benchmark reports (header only: perf programs
 * are single files). One median, so "median" means the same figure in every bench.
 */
#ifndef RINGLM_PERF_BENCH_UTIL_H
#define RINGLM_PERF_BENCH_UTIL_H

#include <stdlib.h>

/* Ascending order of doubles, for qsort. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v in place); the mean of the middle two when n is even, 0 when
 * n <= 0. */
static inline double bench_median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
