/* SPDX-License-Identifier: MIT */
/*
 * The CPU backend's prefill matmul (kernels/cpu/gemm_f32.h), on a CPU with AVX2, FMA and
 * F16C (elsewhere it must decline, and the tests say so and check only that):
 *   - equals the exact product (in double) within the float error bound of a K-term dot
 *     product, for F32, F16 and BF16 weights, on shapes that take every edge of its blocking
 *     (M not a multiple of its 6-row tile nor of its 72-row block, N not a multiple of 16 nor
 *     of its 128-row block, K across several 256-element blocks and odd), strided rows, beta
 *     0 and 1;
 *   - the same for quantized weights (Q8_0, Q4_K, Q6_K, Q4_0, Q5_K), dequantized into its
 *     panels, with K of several blocks;
 *   - Q8_0 weights, packed from their blocks where they lie, give the very bits of the same
 *     weights dequantized (q_dequant_row) and multiplied as F32;
 *   - a row gets the same bits alone and in a batch of several passes over the weights;
 *   - declines other weight types, and K that is not a multiple of the block, without
 *     writing y.
 */
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/quant.h"
#include "kernel_rows.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static bool have(void)
{
    if (gemm_f32_supported()) return true;
    cr_log_info("gemm_f32 needs AVX2, FMA and F16C: not on this CPU, only its refusal tested");
    return false;
}

/* one trial: w in `type` (N rows of ld_w elements), y checked against the exact product of
 * the weights as converted (the conversions are exact) */
static void trial(int type, int M, int N, int K, float beta)
{
    const bool quantized = type != Q_F32 && type != Q_F16 && type != Q_BF16;
    const int ld_x = K + (int)(rnd() % 3), ld_w = quantized ? K : K + 2 * (int)(rnd() % 3),
              ld_y = N + (int)(rnd() % 4);
    float *x = malloc((size_t)M * ld_x * sizeof(float));
    float *wf = malloc((size_t)N * ld_w * sizeof(float));
    float *y = malloc((size_t)M * ld_y * sizeof(float));
    float *y0 = malloc((size_t)M * ld_y * sizeof(float));
    const size_t rb = q_row_bytes(type, ld_w);
    char *w = malloc((size_t)N * rb);
    cr_assert(x && wf && y && y0 && w);
    for (size_t i = 0; i < (size_t)M * ld_x; i++) x[i] = rnd_float();
    for (size_t i = 0; i < (size_t)M * ld_y; i++) y0[i] = y[i] = rnd_float();
    for (size_t i = 0; i < (size_t)N * ld_w; i++) wf[i] = rnd_float();
    quantized_rows(type, wf, w, N, ld_w);
    cr_assert(gemm_f32(type, M, N, K, x, ld_x, w, rb, beta, y, ld_y));
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double exact = beta != 0.0f ? y0[(size_t)m * ld_y + n] : 0.0, mag = fabs(exact);
            for (int k = 0; k < K; k++) {
                const double p = (double)x[(size_t)m * ld_x + k] * wf[(size_t)n * ld_w + k];
                exact += p;
                mag += fabs(p);
            }
            const double got = y[(size_t)m * ld_y + n];
            cr_assert(fabs(got - exact) <= (K + 2) * 0x1p-24 * mag + 1e-30,
                      "type %d M %d N %d K %d beta %g: y[%d][%d] = %.9g, exact %.9g", type, M, N, K,
                      beta, m, n, got, exact);
        }
    cr_assert_eq(padding_written(y, y0, M, N, ld_y), -1, "the padding between rows of y");
    free(x);
    free(wf);
    free(y);
    free(y0);
    free(w);
}

Test(kernels_gemm_f32, equals_the_exact_product_within_the_dot_product_bound)
{
    if (!have()) return;
    static const int types[] = {Q_F32, Q_F16, Q_BF16};
    /* the engine's shapes (prefill of 64 and 300 rows through stories15M/110M projections,
     * one worker's chunk), then random ones */
    static const int fixed[][3] = {{64, 192, 768}, {300, 72, 288}, {73, 130, 513}, {7, 16, 8}};
    for (int ti = 0; ti < 3; ti++) {
        for (size_t f = 0; f < sizeof fixed / sizeof fixed[0]; f++)
            trial(types[ti], fixed[f][0], fixed[f][1], fixed[f][2], f % 2 ? 1.0f : 0.0f);
        for (int t = 0; t < 24; t++) {
            const int M = 1 + (int)(rnd() % 160), N = 1 + (int)(rnd() % 150),
                      K = 1 + (int)(rnd() % 700);
            trial(types[ti], M, N, K, t % 3 == 0 ? 1.0f : 0.0f);
        }
    }
}

Test(kernels_gemm_f32, quantized_weights_equal_the_exact_product_of_their_values)
{
    if (!have()) return;
    static const int types[] = {Q_Q8_0, Q_Q4_K, Q_Q6_K, Q_Q4_0, Q_Q5_K};
    static const int fixed[][3] = {{64, 192, 768}, {37, 13, 256}, {73, 130, 1280}, {7, 16, 512}};
    for (int ti = 0; ti < 5; ti++)
        for (size_t f = 0; f < sizeof fixed / sizeof fixed[0]; f++)
            trial(types[ti], fixed[f][0], fixed[f][1], fixed[f][2], f % 2 ? 1.0f : 0.0f);
}

Test(kernels_gemm_f32, q8_0_panels_equal_the_dequantized_f32_product_to_the_bit)
{
    if (!have()) return;
    /* partial panels (N not a multiple of 8 or 16), several k blocks, K not a multiple of
     * 256, M across tiles; beta 1 adds to y */
    static const int shapes[][3] = {{64, 192, 768}, {37, 13, 288}, {73, 130, 1280}, {7, 5, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        const size_t rb = q_row_bytes(Q_Q8_0, K);
        float *x = malloc((size_t)M * K * sizeof(float)), *wf = malloc((size_t)N * K * 4);
        float *yq = malloc((size_t)M * N * sizeof(float)), *yf = malloc((size_t)M * N * 4);
        char *w = malloc((size_t)N * rb);
        cr_assert(x && wf && yq && yf && w);
        for (size_t i = 0; i < (size_t)M * K; i++) x[i] = rnd_float();
        for (size_t i = 0; i < (size_t)N * K; i++) wf[i] = rnd_float();
        for (size_t i = 0; i < (size_t)M * N; i++) yq[i] = yf[i] = rnd_float();
        quantized_rows(Q_Q8_0, wf, w, N, K); /* wf: the rows as q_dequant_row gives them */
        const float beta = s % 2 ? 1.0f : 0.0f;
        cr_assert(gemm_f32(Q_Q8_0, M, N, K, x, K, w, rb, beta, yq, N));
        cr_assert(gemm_f32(Q_F32, M, N, K, x, K, wf, (size_t)K * 4, beta, yf, N));
        for (size_t i = 0; i < (size_t)M * N; i++)
            cr_assert(memcmp(&yq[i], &yf[i], 4) == 0, "M %d N %d K %d: y[%zu] %.9g vs %.9g", M, N,
                      K, i, yq[i], yf[i]);
        free(x);
        free(wf);
        free(yq);
        free(yf);
        free(w);
    }
}

/* A prompt of 700 rows takes three passes over the weights (288 rows each), a row alone one:
 * every row's results are the same bits either way, for each weight type (what the engine's
 * "chunked = one-shot" and "alone = in a batch" invariants rest on). */
Test(kernels_gemm_f32, a_row_gets_the_same_bits_alone_and_in_any_pass_of_a_long_batch)
{
    if (!have()) return;
    enum { M = 700, N = 40, K = 300 };
    static const int types[] = {Q_F32, Q_F16, Q_BF16};
    float *x = malloc((size_t)M * K * sizeof(float)), *wf = malloc((size_t)N * K * 4);
    float *all = malloc((size_t)M * N * sizeof(float)), *one = malloc((size_t)N * 4);
    char *w = malloc((size_t)N * K * 4);
    cr_assert(x && wf && all && one && w);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = rnd_float();
    for (int ti = 0; ti < 3; ti++) {
        for (size_t i = 0; i < (size_t)N * K; i++) wf[i] = rnd_float();
        quantized_rows(types[ti], wf, w, N, K);
        const size_t rb = q_row_bytes(types[ti], K);
        cr_assert(gemm_f32(types[ti], M, N, K, x, K, w, rb, 0.0f, all, N));
        for (int m = 0; m < M; m += 37) {
            cr_assert(gemm_f32(types[ti], 1, N, K, x + (size_t)m * K, K, w, rb, 0.0f, one, N));
            for (int n = 0; n < N; n++)
                cr_assert(memcmp(&one[n], &all[(size_t)m * N + n], 4) == 0,
                          "type %d row %d column %d: alone %.9g, in the batch %.9g", types[ti], m,
                          n, one[n], all[(size_t)m * N + n]);
        }
    }
    free(x);
    free(wf);
    free(all);
    free(one);
    free(w);
}

Test(kernels_gemm_f32, declines_other_weight_types_without_writing)
{
    (void)have();
    enum { M = 8, N = 32, K = 64 };
    static float x[M * K], y[M * N];
    static uint8_t w[N * 34 * 2];
    for (int i = 0; i < M * N; i++) y[i] = 7.0f;
    cr_assert_not(gemm_f32(99, M, N, K, x, K, w, K * 4, 0.0f, y, N));
    cr_assert_not(gemm_f32(Q_Q8_0, M, N, 48, x, K, w, 64, 0.0f, y, N)); /* K not whole blocks */
    cr_assert_not(gemm_f32(Q_Q4_K, M, N, K, x, K, w, 64, 0.0f, y, N));  /* nor here */
    for (int i = 0; i < M * N; i++) cr_assert_eq(y[i], 7.0f);
    if (!gemm_f32_supported()) cr_assert_not(gemm_f32(Q_F32, M, N, K, x, K, w, K * 4, 0.0f, y, N));
}
