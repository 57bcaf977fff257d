/* SPDX-License-Identifier: MIT */
/*
 * The CPU backend's BF16 prefill tiles (kernels/cpu/gemm_bf16.h), on a CPU with AVX-512 BF16
 * (elsewhere it must decline, and the tests say so and check only that):
 *   - equals the exact product of the weights with the activations rounded to the nearest
 *     bf16 (q_f32_to_bf16) within the float error bound of a K-term dot product: the rounding
 *     is the one stated, on shapes that take every edge of its blocking (M not a multiple of
 *     its 8-row tile nor of its 64-row block, N not a multiple of 32 nor of its 128-row block,
 *     K across several 256-element blocks and odd), strided rows, beta 0 and 1;
 *   - and the exact product of the activations as given within the stated tolerance,
 *     (2^-8 + (K + 2) 2^-24) · Σ|x w|;
 *   - a row's results are the same bits alone, in any batch and in any split of the columns.
 */
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/quant.h"
#define KERNEL_ROWS_SEED 0x9e3779b97f4a7c15ull
#include "kernel_rows.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static bool have(void)
{
    if (gemm_bf16_supported()) return true;
    cr_log_info("gemm_bf16 needs AVX-512 BF16: not on this CPU, only its refusal tested");
    return false;
}

/* One trial: N bf16 weight rows (ld_w elements apart), y checked against the exact products
 * with the activations rounded to bf16 (tight bound) and as given (the stated tolerance). */
static void trial(int M, int N, int K, float beta)
{
    const int ld_x = K + (int)(rnd() % 3), ld_w = K + (int)(rnd() % 3), ld_y = N + (int)(rnd() % 4);
    float *x = malloc((size_t)M * ld_x * sizeof(float));
    float *wf = malloc((size_t)N * ld_w * sizeof(float));
    float *y = malloc((size_t)M * ld_y * sizeof(float));
    float *y0 = malloc((size_t)M * ld_y * sizeof(float));
    uint16_t *w = malloc((size_t)N * ld_w * sizeof(uint16_t));
    cr_assert(x && wf && y && y0 && w);
    for (size_t i = 0; i < (size_t)M * ld_x; i++) x[i] = rnd_float();
    for (size_t i = 0; i < (size_t)M * ld_y; i++) y0[i] = y[i] = rnd_float();
    for (size_t i = 0; i < (size_t)N * ld_w; i++) {
        w[i] = q_f32_to_bf16(rnd_float());
        wf[i] = q_bf16_to_f32(w[i]);
    }
    cr_assert(gemm_bf16(M, N, K, x, ld_x, w, (size_t)ld_w * 2, beta, y, ld_y));
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const double base = beta != 0.0f ? y0[(size_t)m * ld_y + n] : 0.0;
            double exact_b = base, exact = base, mag = fabs(base);
            for (int k = 0; k < K; k++) {
                const float xv = x[(size_t)m * ld_x + k];
                const double wv = wf[(size_t)n * ld_w + k];
                exact_b += (double)q_bf16_to_f32(q_f32_to_bf16(xv)) * wv;
                exact += (double)xv * wv;
                mag += fabs((double)xv * wv);
            }
            const double got = y[(size_t)m * ld_y + n];
            cr_assert(fabs(got - exact_b) <= (K + 2) * 0x1p-24 * mag + 1e-30,
                      "M %d N %d K %d beta %g: y[%d][%d] = %.9g, exact with bf16(x) %.9g", M, N, K,
                      beta, m, n, got, exact_b);
            cr_assert(fabs(got - exact) <= (0x1p-8 + (K + 2) * 0x1p-24) * mag + 1e-30,
                      "M %d N %d K %d beta %g: y[%d][%d] = %.9g, exact %.9g", M, N, K, beta, m, n,
                      got, exact);
        }
    /* the padding between rows of y is not written */
    for (int m = 0; m < M; m++)
        for (int n = N; n < ld_y; n++)
            cr_assert_eq(y[(size_t)m * ld_y + n], y0[(size_t)m * ld_y + n]);
    free(x);
    free(wf);
    free(y);
    free(y0);
    free(w);
}

Test(kernels_gemm_bf16, equals_the_product_of_the_rounded_activations_within_the_bound)
{
    if (!have()) return;
    /* the engine's shapes (prefill of 64 and 300 rows through stories15M/110M projections,
     * one worker's chunk), edges, then random ones */
    static const int fixed[][3] = {{64, 192, 768}, {300, 72, 288}, {73, 130, 513},
                                   {7, 16, 8},     {9, 33, 1},     {65, 129, 257}};
    for (size_t f = 0; f < sizeof fixed / sizeof fixed[0]; f++)
        trial(fixed[f][0], fixed[f][1], fixed[f][2], f % 2 ? 1.0f : 0.0f);
    for (int t = 0; t < 24; t++) {
        const int M = 1 + (int)(rnd() % 160), N = 1 + (int)(rnd() % 150),
                  K = 1 + (int)(rnd() % 700);
        trial(M, N, K, t % 3 == 0 ? 1.0f : 0.0f);
    }
}

Test(kernels_gemm_bf16, a_row_gets_the_same_bits_alone_in_a_batch_and_in_a_column_split)
{
    if (!have()) return;
    enum { M = 37, N = 150, K = 600 };
    float *x = malloc((size_t)M * K * sizeof(float));
    uint16_t *w = malloc((size_t)N * K * sizeof(uint16_t));
    float *all = malloc((size_t)M * N * sizeof(float)), *one = malloc((size_t)N * sizeof(float));
    cr_assert(x && w && all && one);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = rnd_float();
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = q_f32_to_bf16(rnd_float());
    cr_assert(gemm_bf16(M, N, K, x, K, w, (size_t)K * 2, 0.0f, all, N));
    for (int m = 0; m < M; m += 5) {
        /* alone */
        cr_assert(gemm_bf16(1, N, K, x + (size_t)m * K, K, w, (size_t)K * 2, 0.0f, one, N));
        cr_assert(memcmp(one, all + (size_t)m * N, (size_t)N * sizeof(float)) == 0,
                  "row %d alone differs from row %d of %d", m, m, M);
        /* the columns in two parts, as workers split them (at 40: inside a panel) */
        cr_assert(gemm_bf16(1, 40, K, x + (size_t)m * K, K, w, (size_t)K * 2, 0.0f, one, N));
        cr_assert(gemm_bf16(1, N - 40, K, x + (size_t)m * K, K, w + (size_t)40 * K, (size_t)K * 2,
                            0.0f, one + 40, N));
        cr_assert(memcmp(one, all + (size_t)m * N, (size_t)N * sizeof(float)) == 0,
                  "row %d with its columns split differs", m);
    }
    free(x);
    free(w);
    free(all);
    free(one);
}

Test(kernels_gemm_bf16, declines_where_the_cpu_lacks_avx512_bf16_without_writing)
{
    if (gemm_bf16_supported()) {
        cr_log_info("this CPU has AVX-512 BF16: nothing to decline");
        return;
    }
    enum { M = 8, N = 32, K = 64 };
    static float x[M * K], y[M * N];
    static uint16_t w[N * K];
    for (int i = 0; i < M * N; i++) y[i] = 7.0f;
    cr_assert_not(gemm_bf16(M, N, K, x, K, w, K * 2, 0.0f, y, N));
    for (int i = 0; i < M * N; i++) cr_assert_eq(y[i], 7.0f);
}
