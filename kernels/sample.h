/* SPDX-License-Identifier: MIT */
/*
 * kernels/sample.h — greedy sampling's argmax, by implementation (kernels/sample.c), so
 * tests and benchmarks can run each one; the engine uses eng_sample (engine.h).
 *
 * Every path returns the scalar loop's answer exactly,
 *
 *   best = 0; for i in 1..n-1: if v[i] > v[best] then best = i
 *
 * that is: 0 when v[0] is NaN; otherwise the lowest index i with v[i] == M, M the largest
 * value that is not NaN (== as floats compare: -0 and +0 are equal, so the first of them
 * wins). NaNs past v[0] are never chosen.
 */
#ifndef RINGLM_KERNELS_SAMPLE_H
#define RINGLM_KERNELS_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum eng_argmax_path {
    ENG_ARGMAX_AUTO,     /* the widest this CPU has, checked once at run time */
    ENG_ARGMAX_PORTABLE, /* the scalar loop above: any target */
    ENG_ARGMAX_AVX2,     /* x86-64 AVX2, compiled with target attributes */
    ENG_ARGMAX_AVX512,   /* x86-64 AVX-512F, the same way */
} eng_argmax_path;

/* Whether `path` can run here (AUTO and PORTABLE always can). */
bool eng_argmax_supported(eng_argmax_path path);

/* The path AUTO resolves to on this machine. */
eng_argmax_path eng_argmax_auto_path(void);

/* The index of the largest of v[0..n-1] as above; 0 when n <= 0. A path this machine does
 * not support runs the portable one. */
int32_t eng_argmax(eng_argmax_path path, const float *v, int n);

#endif
