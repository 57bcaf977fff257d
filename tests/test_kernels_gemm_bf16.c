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
 *   - a row's results are the same bits alone, in any batch and in any split of the columns;
 *   - with the activations rounded before (gemm_bf16_round, in two parts of rows as threads
 *     split them), gemm_bf16_rounded gives gemm_bf16's bits on every shape above; rounded in
 *     parts of columns (gemm_bf16_round_cols, as the tasks that make them do), the same rows;
 *   - with the weights packed once (gemm_bf16_pack), gemm_bf16_packed gives the same bits on
 *     every shape above, whole and with its columns split where a worker's chunk may start
 *     (a multiple of 32 rows);
 *   - F32 and F16 weights (RINGLM_PREFILL_GEMM=bf16) are rounded to the nearest bf16 as they
 *     are packed: the same two checks with the weights so rounded, and the stated tolerance
 *     (2^-7 + 2^-16 + (K + 2) 2^-24) · Σ|x w| against their exact product;
 *   - other weight types are declined without writing y.
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

/* One trial: N weight rows of `type` (ld_w elements apart), y checked against the exact
 * products of the operands rounded to bf16 (tight bound) and as given (the stated
 * tolerance). */
static void trial(int type, int M, int N, int K, float beta)
{
    const size_t es = type == Q_F32 ? 4 : 2;
    const int ld_x = K + (int)(rnd() % 3), ld_w = K + (int)(rnd() % 3), ld_y = N + (int)(rnd() % 4);
    float *x = malloc((size_t)M * ld_x * sizeof(float));
    float *wf = malloc((size_t)N * ld_w * sizeof(float));
    float *y = malloc((size_t)M * ld_y * sizeof(float));
    float *y0 = malloc((size_t)M * ld_y * sizeof(float));
    float *wb = malloc((size_t)N * ld_w * sizeof(float));
    char *w = malloc((size_t)N * ld_w * es);
    cr_assert(x && wf && wb && y && y0 && w);
    for (size_t i = 0; i < (size_t)M * ld_x; i++) x[i] = rnd_float();
    for (size_t i = 0; i < (size_t)M * ld_y; i++) y0[i] = y[i] = rnd_float();
    /* wf: the weights as they lie; wb: as the tiles multiply them (rounded to bf16) */
    for (size_t i = 0; i < (size_t)N * ld_w; i++) {
        const float f = rnd_float();
        if (type == Q_F32) {
            ((float *)w)[i] = wf[i] = f;
        } else if (type == Q_F16) {
            const uint16_t h = q_f32_to_f16(f);
            memcpy(w + i * 2, &h, 2);
            wf[i] = q_f16_to_f32(h);
        } else {
            const uint16_t h = q_f32_to_bf16(f);
            memcpy(w + i * 2, &h, 2);
            wf[i] = q_bf16_to_f32(h);
        }
        wb[i] = q_bf16_to_f32(q_f32_to_bf16(wf[i]));
    }
    cr_assert(gemm_bf16(type, M, N, K, x, ld_x, w, (size_t)ld_w * es, beta, y, ld_y));
    /* the same product from rows rounded before, in two parts as workers round them */
    const int ld_r = gemm_bf16_round_ld(K), m1 = M / 3;
    uint16_t *xr = malloc((size_t)M * ld_r * sizeof(uint16_t));
    float *y2 = malloc((size_t)M * ld_y * sizeof(float));
    cr_assert(xr && y2);
    memset(xr, 0xA5, (size_t)M * ld_r * sizeof(uint16_t)); /* zeros past K are its to write */
    memcpy(y2, y0, (size_t)M * ld_y * sizeof(float));
    gemm_bf16_round(m1, K, x, ld_x, xr);
    gemm_bf16_round(M - m1, K, x + (size_t)m1 * ld_x, ld_x, xr + (size_t)m1 * ld_r);
    cr_assert(gemm_bf16_rounded(type, M, N, K, xr, w, (size_t)ld_w * es, beta, y2, ld_y));
    /* the same rows rounded in three parts of columns, as the tasks that make them do: the
     * same elements, and the same zeros up to the next 32 past K */
    uint16_t *xc = malloc((size_t)M * ld_r * sizeof(uint16_t));
    cr_assert(xc);
    memset(xc, 0x5A, (size_t)M * ld_r * sizeof(uint16_t));
    const int k1 = K / 3, k2 = k1 + (K - k1) / 2 + (int)(rnd() % 2);
    gemm_bf16_round_cols(M, K, 0, k1, x, ld_x, xc);
    gemm_bf16_round_cols(M, K, k1, k2, x, ld_x, xc);
    gemm_bf16_round_cols(M, K, k2, K, x, ld_x, xc);
    for (int m = 0; m < M; m++)
        cr_assert(
            memcmp(xc + (size_t)m * ld_r, xr + (size_t)m * ld_r,
                   (size_t)(K + 31) / 32 * 32 * sizeof(uint16_t)) == 0,
            "K %d: row %d rounded in columns [0, %d), [%d, %d), [%d, %d) differs from the row "
            "rounded whole",
            K, m, k1, k1, k2, k2, K);
    free(xc);
    for (int m = 0; m < M; m++)
        cr_assert(memcmp(y2 + (size_t)m * ld_y, y + (size_t)m * ld_y, (size_t)N * sizeof(float)) ==
                      0,
                  "type %d M %d N %d K %d beta %g: row %d from rows rounded before differs", type,
                  M, N, K, beta, m);
    /* the weights packed once: whole, and the columns split at 32 as a worker's chunk */
    uint32_t *wp = aligned_alloc(64, (gemm_bf16_packed_bytes(N, K) + 63) & ~(size_t)63);
    cr_assert(wp);
    memset(wp, 0x5A, gemm_bf16_packed_bytes(N, K)); /* padding rows are its to write */
    cr_assert(gemm_bf16_pack(type, N, K, w, (size_t)ld_w * es, wp));
    for (int split = 0; split < 2; split++) {
        memcpy(y2, y0, (size_t)M * ld_y * sizeof(float));
        const int n1 = split && N > 32 ? 32 : N;
        cr_assert(gemm_bf16_packed(M, n1, K, xr, wp, 0, beta, y2, ld_y));
        if (n1 < N) cr_assert(gemm_bf16_packed(M, N - n1, K, xr, wp, n1, beta, y2 + n1, ld_y));
        for (int m = 0; m < M; m++)
            cr_assert(
                memcmp(y2 + (size_t)m * ld_y, y + (size_t)m * ld_y, (size_t)N * sizeof(float)) == 0,
                "type %d M %d N %d K %d beta %g split %d: row %d with packed weights differs", type,
                M, N, K, beta, split, m);
        cr_assert_eq(padding_written(y2, y0, M, N, ld_y), -1, "the padding, packed weights");
    }
    free(wp);
    free(xr);
    free(y2);
    const double tol = type == Q_BF16 ? 0x1p-8 : 0x1p-7 + 0x1p-16;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const double base = beta != 0.0f ? y0[(size_t)m * ld_y + n] : 0.0;
            double exact_b = base, exact = base, mag = fabs(base);
            for (int k = 0; k < K; k++) {
                const float xv = x[(size_t)m * ld_x + k];
                const double wv = wf[(size_t)n * ld_w + k];
                exact_b += (double)q_bf16_to_f32(q_f32_to_bf16(xv)) * wb[(size_t)n * ld_w + k];
                exact += (double)xv * wv;
                mag += fabs((double)xv * wv);
            }
            const double got = y[(size_t)m * ld_y + n];
            /* the rounded products' magnitudes are within (1 + 2^-8)^2 of mag's */
            cr_assert(fabs(got - exact_b) <= (K + 2) * 0x1p-24 * mag * (1 + 0x1p-6) + 1e-30,
                      "type %d M %d N %d K %d beta %g: y[%d][%d] = %.9g, exact with bf16 %.9g",
                      type, M, N, K, beta, m, n, got, exact_b);
            cr_assert(fabs(got - exact) <= (tol + (K + 2) * 0x1p-24) * mag + 1e-30,
                      "type %d M %d N %d K %d beta %g: y[%d][%d] = %.9g, exact %.9g", type, M, N, K,
                      beta, m, n, got, exact);
        }
    cr_assert_eq(padding_written(y, y0, M, N, ld_y), -1, "the padding between rows of y");
    free(x);
    free(wf);
    free(wb);
    free(y);
    free(y0);
    free(w);
}

Test(kernels_gemm_bf16, equals_the_product_of_the_rounded_operands_within_the_bound)
{
    if (!have()) return;
    /* the engine's shapes (prefill of 64 and 300 rows through stories15M/110M projections,
     * one worker's chunk), edges, then random ones */
    static const int fixed[][3] = {{64, 192, 768}, {300, 72, 288}, {73, 130, 513},
                                   {7, 16, 8},     {9, 33, 1},     {65, 129, 257}};
    static const int types[] = {Q_BF16, Q_F32, Q_F16};
    for (int ti = 0; ti < 3; ti++) {
        for (size_t f = 0; f < sizeof fixed / sizeof fixed[0]; f++)
            trial(types[ti], fixed[f][0], fixed[f][1], fixed[f][2], f % 2 ? 1.0f : 0.0f);
        for (int t = 0; t < (ti == 0 ? 24 : 8); t++) {
            const int M = 1 + (int)(rnd() % 160), N = 1 + (int)(rnd() % 150),
                      K = 1 + (int)(rnd() % 700);
            trial(types[ti], M, N, K, t % 3 == 0 ? 1.0f : 0.0f);
        }
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
    cr_assert(gemm_bf16(Q_BF16, M, N, K, x, K, w, (size_t)K * 2, 0.0f, all, N));
    for (int m = 0; m < M; m += 5) {
        /* alone */
        cr_assert(gemm_bf16(Q_BF16, 1, N, K, x + (size_t)m * K, K, w, (size_t)K * 2, 0.0f, one, N));
        cr_assert(memcmp(one, all + (size_t)m * N, (size_t)N * sizeof(float)) == 0,
                  "row %d alone differs from row %d of %d", m, m, M);
        /* the columns in two parts, as workers split them (at 40: inside a panel) */
        cr_assert(
            gemm_bf16(Q_BF16, 1, 40, K, x + (size_t)m * K, K, w, (size_t)K * 2, 0.0f, one, N));
        cr_assert(gemm_bf16(Q_BF16, 1, N - 40, K, x + (size_t)m * K, K, w + (size_t)40 * K,
                            (size_t)K * 2, 0.0f, one + 40, N));
        cr_assert(memcmp(one, all + (size_t)m * N, (size_t)N * sizeof(float)) == 0,
                  "row %d with its columns split differs", m);
    }
    free(x);
    free(w);
    free(all);
    free(one);
}

Test(kernels_gemm_bf16, declines_other_weight_types_and_cpus_without_avx512_bf16_unwritten)
{
    (void)have();
    enum { M = 8, N = 32, K = 64 };
    static float x[M * K], y[M * N];
    static uint16_t w[N * K * 2];
    for (int i = 0; i < M * N; i++) y[i] = 7.0f;
    cr_assert_not(gemm_bf16(Q_Q8_0, M, N, K, x, K, w, 68, 0.0f, y, N));
    cr_assert_not(gemm_bf16(99, M, N, K, x, K, w, K * 2, 0.0f, y, N));
    static uint16_t xr[M * (K + 64)];
    cr_assert_not(gemm_bf16_rounded(Q_Q8_0, M, N, K, xr, w, 68, 0.0f, y, N));
    if (!gemm_bf16_supported())
        for (int t = 0; t < 3; t++)
            cr_assert_not(
                gemm_bf16((int[]){Q_BF16, Q_F32, Q_F16}[t], M, N, K, x, K, w, K * 4, 0.0f, y, N) ||
                gemm_bf16_rounded((int[]){Q_BF16, Q_F32, Q_F16}[t], M, N, K, xr, w, K * 4, 0.0f, y,
                                  N));
    static uint32_t wp[N * K];
    cr_assert_not(gemm_bf16_pack(Q_Q8_0, N, K, w, 68, wp));
    if (gemm_bf16_supported()) { /* a chunk that does not start on a panel */
        cr_assert(gemm_bf16_pack(Q_BF16, N, K, w, K * 2, wp));
        cr_assert_not(gemm_bf16_packed(M, N - 8, K, xr, wp, 8, 0.0f, y, N));
    } else {
        cr_assert_not(gemm_bf16_pack(Q_BF16, N, K, w, K * 2, wp));
        cr_assert_not(gemm_bf16_packed(M, N, K, xr, wp, 0, 0.0f, y, N));
    }
    for (int i = 0; i < M * N; i++) cr_assert_eq(y[i], 7.0f);
}
