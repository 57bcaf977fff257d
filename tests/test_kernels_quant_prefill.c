/* SPDX-License-Identifier: MIT */
/*
 * The quantized prefill tiles (kernels/cpu/quant_prefill.h), on a CPU where they run: Q4_K,
 * Q6_K, Q4_0 and Q4_1 on AVX2 without AVX-512 VNNI; Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL in
 * AVX-512 VNNI's tiles (quant.h q_matmul_tiles; the K types and IQ4_XS take Q8_K's tiles
 * there, q_int_path); elsewhere the tests say so and check only that they decline:
 *   - equal the portable integer dots (8-bit activations per 32, the scalar references of
 *     quant_kquants.c and quant_unpack.c) within 1e-5 x sum_j |w_j x_j|, on odd row counts above
 *     Q_INT_MAX_ROWS (groups of 4 with every remainder), odd weight-row counts (panels of 8 with every remainder), K of one to
 *     five 256-element blocks, beta 0 and 1, rows of y strided (the padding never written);
 *   - the same on random bytes as weights (Q6_K: every scale, -128 too, and q - 32 = -32 with
 *     activations of +-127: the 16-bit sums at their largest; Q4_0 every nibble 0, q - 8 =
 *     -8, against activations of +127: its 16-bit sums at their largest, -32640);
 *   - give a row the same bits wherever it lies in a batch;
 *   - decline other weight types and activations prepared for another K without writing y.
 */
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_internal.h"
#include "kernels/cpu/quant_prefill.h"
#define KERNEL_ROWS_SEED 0x9e3779b97f4a7c15ull
#include "kernel_rows.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Whether the tiles run for `type` on this CPU (AVX2: the four types alike, or none) */
static bool have(int type)
{
    if (q_isa() >= Q_ISA_AVX512) {
        const bool runs = q_prefill_runs(type, Q_INT_MAX_ROWS + 1);
        cr_assert_eq(runs, qk_vt_unpacked(type), "type %d on AVX-512 VNNI", type);
        return runs;
    }
    if (type == Q_Q4_K || type == Q_Q6_K || type == Q_Q4_0 || type == Q_Q4_1) {
        if (q_prefill_runs(Q_Q4_K, Q_INT_MAX_ROWS + 1)) {
            cr_assert(q_prefill_runs(type, Q_INT_MAX_ROWS + 1), "type %d: no tiles beside Q4_K's",
                      type);
            return true;
        }
    } else {
        cr_assert_not(q_prefill_runs(type, Q_INT_MAX_ROWS + 1), "type %d without AVX-512", type);
    }
    cr_log_info("the quantized prefill tiles do not run for type %d on this CPU (%s)", type,
                q_isa_name(q_isa()));
    return false;
}

static bool random_blocks;  /* weights(): random bytes instead of quantized floats */
static bool lowest_nibbles; /* weights() with random_blocks: Q4_0's and Q4_1's nibbles all 0 */

/* n rows of k weights of `type`, from floats in [-1, 1) with a few large ones, or (with
 * random_blocks) random bytes with each block's f16 scales set to finite ones */
static char *weights(int type, int n, int k, float *wf)
{
    const size_t rb = q_row_bytes(type, k);
    char *w = malloc((size_t)n * rb);
    cr_assert(w);
    for (int i = 0; i < n; i++) {
        char *row = w + (size_t)i * rb;
        if (random_blocks && (type == Q_Q4_0 || type == Q_Q4_1)) {
            const size_t bb = rb / (size_t)(k / 32), h = type == Q_Q4_0 ? 2 : 4;
            for (int b = 0; b < k / 32; b++) {
                char *blk = row + (size_t)b * bb;
                for (size_t j = h; j < bb; j++) blk[j] = lowest_nibbles ? 0 : (char)rnd();
                uint16_t d = (uint16_t)(0x1000 + rnd() % 0x1000), mn = (uint16_t)(rnd() % 0x2000);
                memcpy(blk, &d, 2);
                if (type == Q_Q4_1) memcpy(blk + 2, &mn, 2); /* +-2^-8 at most, both signs */
            }
        } else if (random_blocks) {
            for (size_t j = 0; j < rb; j++) row[j] = (char)rnd();
            const size_t bb = rb / (size_t)(k / 256); /* Q4_K: d, dmin first; Q6_K: d last */
            for (int b = 0; b < k / 256; b++) {
                uint16_t d = (uint16_t)(0x1000 + rnd() % 0x1000); /* 2^-11 .. 2^-10 */
                memcpy(row + (size_t)b * bb + (type == Q_Q6_K ? bb - 2 : 0), &d, 2);
                if (type == Q_Q4_K) memcpy(row + (size_t)b * bb + 2, &d, 2);
            }
        } else {
            for (int j = 0; j < k; j++)
                wf[(size_t)i * k + j] = rnd_float() * (rnd() % 16 == 0 ? 4.0f : 0.5f);
            q_quantize_row(type, wf + (size_t)i * k, row, k);
        }
        q_dequant_row(type, row, wf + (size_t)i * k, k);
    }
    return w;
}

static const q_xq *prepare(const float *x, int M, int K, void **mem)
{
    const size_t bytes = q_xq_bytes(M, K);
    *mem = malloc(bytes);
    cr_assert(*mem);
    const q_xq *a = q_xq_prepare(*mem, bytes, x, M, K);
    cr_assert(a);
    return a;
}

static void trial(int type, int M, int N, int K, float beta)
{
    const int ld_y = N + (int)(rnd() % 4);
    float *x = malloc((size_t)M * K * sizeof(float)), *wf = malloc((size_t)N * K * sizeof(float));
    float *y = malloc((size_t)M * ld_y * sizeof(float)),
          *ref = malloc((size_t)M * N * sizeof(float));
    float *y0 = malloc((size_t)M * ld_y * sizeof(float));
    cr_assert(x && wf && y && ref && y0);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = rnd_float();
    if (random_blocks) /* every block of 32 of every row at +-127 after quantizing */
        for (size_t i = 0; i < (size_t)M * K; i++)
            x[i] = lowest_nibbles || rnd() % 2 ? 1.0f : -1.0f;
    for (size_t i = 0; i < (size_t)M * ld_y; i++) y0[i] = y[i] = rnd_float();
    char *w = weights(type, N, K, wf);
    void *mem;
    const q_xq *a = prepare(x, M, K, &mem);
    cr_assert(q_prefill_matmul(type, w, N, K, a, beta, y, ld_y), "M %d N %d K %d", M, N, K);
    /* the reference: the portable integer dots with the same activations, 8 bits per 32
     * (q_matmul's decode rows of Q4_K take Q8_K's blocks of 256 instead) */
    const size_t rb = q_row_bytes(type, K), nb = (size_t)K / 32;
    if (qk_is_unpacked(type)) /* quant_unpack.c's, one activation row at a time */
        for (int m = 0; m < M; m++) {
            const xq8 row = {.q = a->xq.q + (size_t)m * K,
                             .d = a->xq.d + (size_t)m * nb,
                             .s = a->xq.s + (size_t)m * nb,
                             .s16 = a->xq.s16 + (size_t)m * 2 * nb};
            qk_rows_unpacked_portable(type, w, N, K, &row, 1, 0.0f, ref + (size_t)m * N, N);
        }
    else {
        qk_xdot_fn *const dot = type == Q_Q4_K ? qk_xdot_q4_k_portable : qk_xdot_q6_k_portable;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++)
                ref[(size_t)m * N + n] = dot(w + (size_t)n * rb, K, a->xq.q + (size_t)m * K,
                                             a->xq.d + (size_t)m * nb, a->xq.s + (size_t)m * nb);
    }
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double mag = 0.0;
            for (int j = 0; j < K; j++)
                mag += fabs((double)x[(size_t)m * K + j] * wf[(size_t)n * K + j]);
            const double want =
                ref[(size_t)m * N + n] + (beta != 0.0f ? y0[(size_t)m * ld_y + n] : 0.0);
            const double got = y[(size_t)m * ld_y + n];
            cr_assert(fabs(got - want) <= 1e-5 * mag + 1e-6,
                      "type %d M %d N %d K %d beta %g: y[%d][%d] = %.9g, portable %.9g (sum |wx| "
                      "%.6g)",
                      type, M, N, K, beta, m, n, got, want, mag);
        }
    for (int m = 0; m < M; m++)
        for (int n = N; n < ld_y; n++)
            cr_assert_eq(y[(size_t)m * ld_y + n], y0[(size_t)m * ld_y + n]);
    free(mem);
    free(w);
    free(x);
    free(wf);
    free(y);
    free(ref);
    free(y0);
}

static const int types[] = {Q_Q4_K, Q_Q6_K, Q_Q4_0, Q_Q4_1, Q_Q5_0, Q_Q5_1, Q_IQ4_NL};

Test(kernels_quant_prefill, equals_the_portable_integer_path_within_its_bound)
{
    static const int Ms[] = {33, 34, 35, 36, 45, 70, 131};
    static const int Ns[] = {1, 7, 8, 9, 13, 67};
    static const int Ks[] = {256, 768, 1280};
    static const int Ks32[] = {32, 96, 288}; /* the types of blocks of 32: not whole 256s */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        if (!have(types[ti])) continue;
        const bool b32 = q_block_elems(types[ti]) == 32;
        int t = 0;
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++, t++)
                trial(types[ti], Ms[mi], Ns[ni], b32 && t % 2 ? Ks32[t % 3] : Ks[t % 3],
                      t % 2 ? 1.0f : 0.0f);
        /* engine shapes: one worker's chunk of stories110M's FFN up- and down-projections */
        trial(types[ti], 256, 512, 768, 0.0f);
        trial(types[ti], 64, 384, 2048, 1.0f);
    }
}

Test(kernels_quant_prefill, equals_the_portable_integer_path_on_random_blocks)
{
    random_blocks = true;
    for (size_t ti = 0; ti < 4; ti++) { /* Q4_K, Q6_K, Q4_0, Q4_1 */
        if (!have(types[ti])) continue;
        trial(types[ti], 37, 19, 512, 0.0f);
        trial(types[ti], 33, 8, 2048, 1.0f);
    }
    lowest_nibbles = true; /* Q4_0: q - 8 = -8 times +127 everywhere */
    if (have(Q_Q4_0)) trial(Q_Q4_0, 35, 9, 512, 0.0f);
    lowest_nibbles = false;
    random_blocks = false;
}

static void same_bits(int type)
{
    enum { N = 21, K = 512, M1 = 41, M2 = 58, AT = 39 };
    float *x1 = malloc((size_t)M1 * K * sizeof(float)),
          *x2 = malloc((size_t)M2 * K * sizeof(float));
    float *wf = malloc((size_t)N * K * sizeof(float)), y1[M1 * N], y2[M2 * N];
    cr_assert(x1 && x2 && wf);
    for (size_t i = 0; i < (size_t)M1 * K; i++) x1[i] = rnd_float();
    for (size_t i = 0; i < (size_t)M2 * K; i++) x2[i] = rnd_float();
    memcpy(x2 + (size_t)AT * K, x1, (size_t)K * sizeof(float)); /* row 0 of x1 at row 39 */
    char *w = weights(type, N, K, wf);
    void *m1, *m2;
    const q_xq *a1 = prepare(x1, M1, K, &m1), *a2 = prepare(x2, M2, K, &m2);
    cr_assert(q_prefill_matmul(type, w, N, K, a1, 0.0f, y1, N));
    cr_assert(q_prefill_matmul(type, w, N, K, a2, 0.0f, y2, N));
    for (int n = 0; n < N; n++)
        cr_assert_eq(memcmp(&y1[n], &y2[AT * N + n], sizeof(float)), 0,
                     "type %d column %d: %.9g in row 0 of %d, %.9g in row %d of %d", type, n, y1[n],
                     M1, y2[AT * N + n], AT, M2);
    free(m1);
    free(m2);
    free(w);
    free(x1);
    free(x2);
    free(wf);
}

Test(kernels_quant_prefill, gives_a_row_the_same_bits_wherever_it_lies)
{
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        if (have(types[ti])) same_bits(types[ti]);
}

Test(kernels_quant_prefill, declines_what_it_does_not_take_without_writing)
{
    enum { M = 40, N = 16, K = 512 };
    float *x = calloc((size_t)M * K, sizeof(float)), y[M * N];
    char *w = calloc(N, q_row_bytes(Q_Q8_0, K));
    cr_assert(x && w);
    for (int i = 0; i < M * N; i++) y[i] = 7.0f;
    void *mem;
    const q_xq *a = prepare(x, M, K, &mem);
    cr_assert_not(q_prefill_runs(Q_Q8_0 + 100, M));
    cr_assert_not(q_prefill_runs(Q_Q4_K, Q_INT_MAX_ROWS)); /* the integer dots' rows */
    cr_assert_not(q_prefill_runs(Q_Q4_0, Q_INT_MAX_ROWS));
    cr_assert_not(q_prefill_runs(Q_Q2_K, M)); /* 16-element scales: no tiles */
    /* Q5_K and IQ4_XS: Q8_K's tiles with AVX-512 VNNI, no tiles of theirs on AVX2 */
    cr_assert_not(q_prefill_runs(Q_Q5_K, M));
    cr_assert_not(q_prefill_runs(Q_IQ4_XS, M));
    if (q_isa() >= Q_ISA_AVX512) {
        cr_assert(q_int_path(Q_Q5_K, M) && q_int_path(Q_IQ4_XS, M) && q_int_path(Q_Q3_K, M));
        cr_assert_eq(q_int_act_elems(Q_Q2_K, M), QK_K);
    }
    cr_assert_not(q_prefill_matmul(Q_F32, w, N, K, a, 0.0f, y, N));
    cr_assert_not(q_prefill_matmul(Q_Q4_K, w, N, K - 256, a, 0.0f, y, N)); /* a's K is 512 */
    cr_assert_not(q_prefill_matmul(Q_Q4_K, w, N, K, NULL, 0.0f, y, N));
    for (int i = 0; i < M * N; i++) cr_assert_eq(y[i], 7.0f);
    free(mem);
    free(w);
    free(x);
}
