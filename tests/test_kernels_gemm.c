/* SPDX-License-Identifier: MIT */
/*
 * The small-batch matmul of the CPU backend (kernels/cpu/gemm_small.h), every path (the
 * AVX2 and AVX-512 ones are skipped with a message on a CPU without them):
 *   - equals OpenBLAS SGEMM within the float error bound of a K-term dot product, on random
 *     shapes (odd sizes, M = 1..20, strided rows, beta 0 and 1), and on batches of 21-140
 *     rows with rows long enough that the batch is cut into several passes over the
 *     weights;
 *   - a row's result is bit-identical whatever the other rows of the batch, however the
 *     weight rows are split into calls and however many passes the batch takes — what
 *     keeps a sequence alone and in a batch equal in the engine.
 */
#include "kernels/cpu/gemm_small.h"
#define KERNEL_ROWS_SEED 0x9e3779b97f4a7c15ull
#include "kernel_rows.h"

#include <cblas.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static float *rnd_matrix(int rows, int ld)
{
    float *a = malloc((size_t)rows * ld * sizeof(float) + 1);
    cr_assert(a);
    for (size_t i = 0; i < (size_t)rows * ld; i++) a[i] = rnd_float();
    return a;
}

static const gemm_small_path paths[] = {GEMM_SMALL_PORTABLE, GEMM_SMALL_AVX2, GEMM_SMALL_AVX512};
static const char *path_name(gemm_small_path p)
{
    return p == GEMM_SMALL_AVX512 ? "avx512" : p == GEMM_SMALL_AVX2 ? "avx2" : "portable";
}

static bool have(gemm_small_path p)
{
    if (gemm_small_supported(p)) return true;
    cr_log_info("the %s path is not supported on this CPU: not tested here", path_name(p));
    return false;
}

Test(kernels_gemm, equals_sgemm_within_the_dot_product_error_bound)
{
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        gemm_small_path path = paths[pi];
        if (!have(path)) continue;
        for (int trial = 0; trial < 140; trial++) {
            /* 120 small batches, then 20 of 21-140 rows (the engine's AVX-512 switch to
             * SGEMM is at 128) whose rows of up to 6,000 floats take several passes over
             * the weights */
            const bool large = trial >= 120;
            const int M = large ? 21 + (int)(rnd() % 120) : 1 + trial % 20;
            const int N = 1 + (int)(rnd() % (large ? 13 : 67));
            const int K = 1 + (int)(rnd() % (large ? 6000 : 301));
            const int ld_x = K + (int)(rnd() % 3), ld_w = K + (int)(rnd() % 5);
            const int ld_y = N + (int)(rnd() % 4);
            const float beta = trial % 3 == 0 ? 1.0f : 0.0f;
            float *x = rnd_matrix(M, ld_x), *w = rnd_matrix(N, ld_w);
            float *y = rnd_matrix(M, ld_y), *ref = malloc((size_t)M * ld_y * sizeof(float));
            memcpy(ref, y, (size_t)M * ld_y * sizeof(float));
            gemm_small(path, M, N, K, x, ld_x, w, ld_w, beta, y, ld_y);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, ld_x, w, ld_w,
                        beta, ref, ld_y);
            /* Each side is within K·2^-24·Σ|x·w| (+ |y| for beta 1) of the exact value,
             * so they are within twice that of each other. */
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    double mag = 0;
                    for (int k = 0; k < K; k++)
                        mag += fabs((double)x[(size_t)m * ld_x + k] * w[(size_t)n * ld_w + k]);
                    const double got = y[(size_t)m * ld_y + n], want = ref[(size_t)m * ld_y + n];
                    mag += fabs(want);
                    const double bound = 2.0 * (K + 1) * ldexp(1.0, -24) * mag + 1e-30;
                    cr_assert_leq(fabs(got - want), bound,
                                  "%s M=%d N=%d K=%d beta=%g: y[%d][%d] = %.9g, SGEMM %.9g "
                                  "(bound %.3g)",
                                  path_name(path), M, N, K, beta, m, n, got, want, bound);
                }
            /* Padding between rows of y is never written. */
            for (int m = 0; m < M; m++)
                for (int n = N; n < ld_y; n++)
                    cr_assert_eq(y[(size_t)m * ld_y + n], ref[(size_t)m * ld_y + n]);
            free(x);
            free(w);
            free(y);
            free(ref);
        }
    }
}

Test(kernels_gemm, a_row_does_not_depend_on_the_batch_or_the_split)
{
    /* 3000 and 5001: a batch of more than 20 / 12 rows takes several passes */
    const int Ks[] = {1, 7, 8, 64, 172, 288, 301, 3000, 5001};
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        gemm_small_path path = paths[pi];
        if (!have(path)) continue;
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            const int K = Ks[ki], N = 37, Mmax = K >= 3000 ? 45 : 20;
            float *x = rnd_matrix(Mmax, K), *w = rnd_matrix(N, K);
            float *alone = malloc((size_t)Mmax * N * sizeof(float));
            float *batch = malloc((size_t)Mmax * N * sizeof(float));
            for (int m = 0; m < Mmax; m++)
                gemm_small(path, 1, N, K, x + (size_t)m * K, K, w, K, 0.0f, alone + (size_t)m * N,
                           N);
            for (int M = 1; M <= Mmax; M++) {
                /* rows [M0, M0 + M) of x in one batch; the weight rows in uneven pieces */
                const int M0 = Mmax - M;
                const int cuts[] = {0, 3, 4, 13, 21, N};
                for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++)
                    gemm_small(path, M, cuts[c + 1] - cuts[c], K, x + (size_t)M0 * K, K,
                               w + (size_t)cuts[c] * K, K, 0.0f, batch + cuts[c], N);
                for (int m = 0; m < M; m++)
                    cr_assert(memcmp(batch + (size_t)m * N, alone + (size_t)(M0 + m) * N,
                                     (size_t)N * sizeof(float)) == 0,
                              "%s K=%d: row %d in a batch of %d differs from the row alone",
                              path_name(path), K, M0 + m, M);
            }
            /* beta 1 adds the same bits onto y */
            for (int m = 0; m < Mmax; m++)
                for (int n = 0; n < N; n++) batch[(size_t)m * N + n] = 0.5f;
            gemm_small(path, Mmax, N, K, x, K, w, K, 1.0f, batch, N);
            for (int i = 0; i < Mmax * N; i++)
                cr_assert_eq(batch[i], 0.5f + alone[i], "%s K=%d: beta 1 at %d", path_name(path), K,
                             i);
            free(x);
            free(w);
            free(alone);
            free(batch);
        }
    }
}

Test(kernels_gemm, the_paths_agree_and_auto_picks_the_widest_supported)
{
    gemm_small_path a = gemm_small_auto_path();
    cr_assert(a == GEMM_SMALL_PORTABLE || a == GEMM_SMALL_AVX2 || a == GEMM_SMALL_AVX512);
    cr_assert(gemm_small_supported(a));
    gemm_small_path widest = gemm_small_supported(GEMM_SMALL_AVX512) ? GEMM_SMALL_AVX512
                             : gemm_small_supported(GEMM_SMALL_AVX2) ? GEMM_SMALL_AVX2
                                                                     : GEMM_SMALL_PORTABLE;
    cr_assert_eq(a, widest, "AUTO resolves to %s, the CPU has %s", path_name(a), path_name(widest));
    const int M = 9, N = 50, K = 333;
    float *x = rnd_matrix(M, K), *w = rnd_matrix(N, K);
    static float y[3][9 * 50], ya[9 * 50];
    gemm_small(GEMM_SMALL_AUTO, M, N, K, x, K, w, K, 0.0f, ya, N);
    for (size_t pi = 0; pi < sizeof paths / sizeof paths[0]; pi++) {
        if (!have(paths[pi])) continue;
        gemm_small(paths[pi], M, N, K, x, K, w, K, 0.0f, y[pi], N);
        if (paths[pi] == a)
            cr_assert(memcmp(y[pi], ya, sizeof ya) == 0, "AUTO is the %s path here", path_name(a));
        for (int i = 0; i < M * N; i++)
            cr_assert_leq(fabsf(y[pi][i] - y[0][i]), 1e-4f * (1.0f + fabsf(y[0][i])),
                          "element %d: portable %.9g, %s %.9g", i, y[0][i], path_name(paths[pi]),
                          y[pi][i]);
    }
    free(x);
    free(w);
}
