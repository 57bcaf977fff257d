/* SPDX-License-Identifier: MIT */
/*
 * tests/kernel_rows.h — the random rows the kernel suites build their cases from (header only,
 * like engine_test_util.h): an xorshift generator, so that every run sees the same shapes and
 * values (a suite picks its own seed by defining KERNEL_ROWS_SEED before including this),
 * uniform floats in [-1, 1), and weight rows quantized to a type and read back as the kernels
 * see them.
 */
#ifndef RINGLM_TESTS_KERNEL_ROWS_H
#define RINGLM_TESTS_KERNEL_ROWS_H

#include "kernels/cpu/quant.h"

#include <stddef.h>
#include <stdint.h>

#ifndef KERNEL_ROWS_SEED
#define KERNEL_ROWS_SEED 0x2545f4914f6cdd1dull
#endif

static uint64_t rng_state = KERNEL_ROWS_SEED;

static inline uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static inline float rnd_float(void)
{
    return (float)rnd() / 4294967296.0f * 2.0f - 1.0f;
}

/* n rows of k floats at wf (k apart) quantized to `type` into w (q_row_bytes(type, k) apart),
 * and wf overwritten with what they dequantize to: the weights the kernels multiply. */
static inline void quantized_rows(int type, float *wf, void *w, int n, int k)
{
    const size_t rb = q_row_bytes(type, k);
    for (int i = 0; i < n; i++) {
        q_quantize_row(type, wf + (size_t)i * k, (char *)w + (size_t)i * rb, k);
        q_dequant_row(type, (char *)w + (size_t)i * rb, wf + (size_t)i * k, k);
    }
}

/* Where a kernel wrote y's padding: the first index (row × ld_y + column, a column n or
 * past) of m rows whose value is not y0's, or -1 (it writes its n columns only). */
static inline long padding_written(const float *y, const float *y0, int m, int n, int ld_y)
{
    for (int r = 0; r < m; r++)
        for (int c = n; c < ld_y; c++)
            if (y[(size_t)r * ld_y + c] != y0[(size_t)r * ld_y + c]) return (long)r * ld_y + c;
    return -1;
}

#endif
