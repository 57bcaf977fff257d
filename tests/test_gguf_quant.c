/* SPDX-License-Identifier: MIT */
/*
 * Weight types (kernels/cpu/quant*.c): f16/bf16 conversions are exact where they must be;
 * each quantizer reconstructs within its type's error; the fused dot of the AVX2 path and
 * of the portable path agree with the dot of the dequantized row within the stated
 * tolerance (1e-5 x sum |w x|); the batched (dequantized tile + SGEMM) and fused matmuls
 * give the same products (Q8_0's, Q4_K's and Q6_K's integer ones with 8-bit activations within
 * their stated bound); the integer paths (portable, AVX2, AVX-512 VNNI) agree; on random
 * blocks of every type, every kernel of the portable path agrees with the SIMD ones; the
 * decode kernels (1 to 4 rows) of every integer type stay within the stated bound of the
 * dequantized product and give a row alone what it gets in a batch; F16 and BF16 weights give
 * the bits of their rows converted to floats and multiplied by gemm_small at every batch size it
 * takes.
 */
#include "kernels/cpu/gemm_small.h"
#include "kernels/cpu/quant.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int types[] = {Q_F32,  Q_F16,  Q_BF16,   Q_Q8_0, Q_Q4_K, Q_Q6_K, Q_Q4_0,  Q_Q4_1,
                            Q_Q5_0, Q_Q5_1, Q_IQ4_NL, Q_Q2_K, Q_Q3_K, Q_Q5_K, Q_IQ4_XS};
static const char *const names[] = {"F32",    "F16",  "BF16", "Q8_0", "Q4_K",
                                    "Q6_K",   "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                    "IQ4_NL", "Q2_K", "Q3_K", "Q5_K", "IQ4_XS"};
/* RMS reconstruction error relative to the RMS of the data, per type (uniform data). */
static const double max_rel_rms[] = {0,    1e-3, 8e-3, 1e-2, 0.08, 0.04, 0.15, 0.12,
                                     0.08, 0.06, 0.15, 0.45, 0.30, 0.05, 0.15};

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0) * 2 - 1);
}

Test(gguf_quant, f16_round_trips_every_half_and_rounds_to_nearest_even)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = q_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        cr_assert_eq(q_f32_to_f16(f), h, "half 0x%04x -> %g -> 0x%04x", h, (double)f,
                     q_f32_to_f16(f));
    }
    cr_assert_eq(q_f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(q_f16_to_f32(0x0001), ldexpf(1, -24));        /* smallest subnormal */
    cr_assert_eq(q_f32_to_f16(65520.0f), 0x7c00);              /* rounds up to inf */
    cr_assert_eq(q_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00); /* tie to even */
    cr_assert_eq(q_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3c02);
    cr_assert_eq(q_bf16_to_f32(q_f32_to_bf16(3.0f)), 3.0f);
    cr_assert_eq(q_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80); /* tie to even */
}

Test(gguf_quant, quantizers_reconstruct_within_their_type)
{
    const int k = 1024;
    float *x = malloc(k * sizeof *x), *y = malloc(k * sizeof *y);
    unsigned char *q = malloc(q_row_bytes(Q_F32, k));
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        for (int i = 0; i < k; i++) x[i] = frand() * (i % 97 == 0 ? 4.0f : 1.0f);
        cr_assert_eq(q_quantize_row(types[t], x, q, k), q_row_bytes(types[t], k));
        q_dequant_row(types[t], q, y, k);
        double e2 = 0, x2 = 0;
        for (int i = 0; i < k; i++) {
            e2 += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
            x2 += (double)x[i] * x[i];
        }
        double rel = sqrt(e2 / x2);
        cr_assert_leq(rel, max_rel_rms[t], "%s: relative RMS error %g > %g", names[t], rel,
                      max_rel_rms[t]);
        if (types[t] == Q_F32) cr_assert_eq(memcmp(x, y, k * sizeof *x), 0);
    }
    /* an all-zero block quantizes to zeros (no division by a zero scale) */
    memset(x, 0, k * sizeof *x);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        q_quantize_row(types[t], x, q, k);
        q_dequant_row(types[t], q, y, k);
        for (int i = 0; i < k; i++)
            cr_assert_eq(y[i], 0.0f, "%s: zero row gives %g at %d", names[t], (double)y[i], i);
    }
    free(x);
    free(y);
    free(q);
}

Test(gguf_quant, fused_dot_simd_and_portable_agree_with_dequantized_dot)
{
    const int k = 2048;
    float *w = malloc(k * sizeof *w), *x = malloc(k * sizeof *x), *dq = malloc(k * sizeof *dq);
    unsigned char *q = malloc(q_row_bytes(Q_F32, k));
    if (!q_simd_active()) cr_log_info("no AVX2/FMA/F16C here: only the portable path is checked");
    for (int trial = 0; trial < 20; trial++) {
        for (int i = 0; i < k; i++) {
            w[i] = frand();
            x[i] = frand() * 3;
        }
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            q_quantize_row(types[t], w, q, k);
            q_dequant_row(types[t], q, dq, k);
            double ref = 0, mag = 0;
            for (int i = 0; i < k; i++) {
                ref += (double)dq[i] * x[i];
                mag += fabs((double)dq[i] * x[i]);
            }
            bool was = q_force_portable(true);
            double portable = q_dot(types[t], q, x, k);
            q_force_portable(false);
            double simd = q_dot(types[t], q, x, k);
            q_force_portable(was);
            cr_assert_leq(fabs(portable - ref), 1e-5 * mag,
                          "%s portable: %.9g vs %.9g (sum|wx| "
                          "%g)",
                          names[t], portable, ref, mag);
            cr_assert_leq(fabs(simd - ref), 1e-5 * mag, "%s simd: %.9g vs %.9g (sum|wx| %g)",
                          names[t], simd, ref, mag);
        }
    }
    free(w);
    free(x);
    free(dq);
    free(q);
}

/* The stated bound of the integer path's product with 8-bit activations (quant.h): each x_j
 * is rounded to within max|x over its block| * (1/254 + 1/2048), the block of blk elements. */
static double act_bound_blk(int blk, const float *w, const float *x, int k)
{
    double bound = 0;
    for (int b = 0; b < k / blk; b++) {
        double amax = 0, sw = 0;
        for (int j = b * blk; j < b * blk + blk; j++) {
            amax = fmax(amax, fabs(x[j]));
            sw += fabs(w[j]);
        }
        bound += sw * amax * (1.0 / 254 + 1.0 / 2048);
    }
    return bound;
}

/* That bound for `rows` rows of `type` on the instruction set in use: blocks of 32, or of 256
 * where the K types take Q8_K activations (q_int_act_elems). */
static double q8_act_bound(int type, int rows, const float *w, const float *x, int k)
{
    return act_bound_blk(q_int_act_elems(type, rows), w, x, k);
}

/* Whether instruction set isa quantizes the activations of `type` in other blocks than the
 * portable path (the K types: Q8_K on AVX2 and portable, blocks of 32 with AVX-512 VNNI):
 * then the two agree within both their bounds of the exact product, not to 1e-5. */
static bool act_blocks_differ(int type, int rows, int isa)
{
    /* the portable integer path takes at most Q_INT_MAX_ROWS rows at a time */
    const int cap = q_isa_cap(Q_ISA_PORTABLE),
              portable = q_int_act_elems(type, rows < Q_INT_MAX_ROWS ? rows : Q_INT_MAX_ROWS);
    q_isa_cap(isa);
    const int other = q_int_act_elems(type, rows);
    q_isa_cap(cap);
    return portable != other;
}

Test(gguf_quant, tiled_sgemm_and_fused_matmul_give_the_same_products)
{
    const int n = 300, k = 512, max_rows = 40;
    float *w = malloc((size_t)n * k * sizeof *w), *x = malloc((size_t)max_rows * k * sizeof *x);
    float *y = malloc((size_t)max_rows * n * sizeof *y), *dq = malloc(k * sizeof *dq);
    unsigned char *q = malloc(q_row_bytes(Q_F32, k) * n);
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = frand();
    for (size_t i = 0; i < (size_t)max_rows * k; i++) x[i] = frand();
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t rb = q_row_bytes(types[t], k);
        for (int i = 0; i < n; i++) q_quantize_row(types[t], w + (size_t)i * k, q + i * rb, k);
        const int rows_cases[] = {1, 3, 4, 5, 8, 32, 40};
        for (size_t rc = 0; rc < sizeof rows_cases / sizeof rows_cases[0]; rc++) {
            int rows = rows_cases[rc];
            for (size_t i = 0; i < (size_t)rows * n; i++)
                y[i] = 1.0f; /* beta = 1 accumulates onto it */
            q_matmul(types[t], q, n, k, x, rows, 1.0f, y, n);
            for (int i = 0; i < n; i++) {
                q_dequant_row(types[t], q + i * rb, dq, k);
                for (int r = 0; r < rows; r++) {
                    double ref = 1.0, mag = 1.0;
                    for (int j = 0; j < k; j++) {
                        ref += (double)dq[j] * x[(size_t)r * k + j];
                        mag += fabs((double)dq[j] * x[(size_t)r * k + j]);
                    }
                    if (q_int_path(types[t], rows))
                        mag = mag * 1e-5 + q8_act_bound(types[t], rows, dq, x + (size_t)r * k, k);
                    else if (types[t] == Q_BF16 && q_bf16_dot_path(rows))
                        mag *= 0x1p-8 + (k + 2) * 0x1p-24; /* activations rounded to bf16 */
                    else
                        mag *= 1e-5;
                    cr_assert_leq(fabs(y[(size_t)r * n + i] - ref), mag,
                                  "%s rows=%d: y[%d][%d] = %.9g, expected %.9g", names[t], rows, r,
                                  i, (double)y[(size_t)r * n + i], ref);
                }
            }
        }
    }
    free(w);
    free(x);
    free(y);
    free(dq);
    free(q);
}

/* The integer matmul (Q8_0, Q4_K, Q6_K) on each instruction set this CPU has: the same
 * products as the portable path within 1e-5 x sum |w x|, at row counts across its groups of 8
 * and weight tiles of 16 (n = 67 ends in a partial tile), odd ones, and above Q_INT_MAX_ROWS
 * (AVX-512 VNNI's repacked tiles take any number), with beta 0 and 1, on activations of very
 * different sizes per block (and an all-zero block). */
Test(gguf_quant, integer_paths_agree_on_every_instruction_set)
{
    const int n = 67, k = 1024, R = 64;
    static const int itypes[] = {Q_Q8_0, Q_Q4_K,   Q_Q6_K, Q_Q4_0, Q_Q4_1, Q_Q5_0,
                                 Q_Q5_1, Q_IQ4_NL, Q_Q2_K, Q_Q3_K, Q_Q5_K, Q_IQ4_XS};
    static const char *const inames[] = {"Q8_0", "Q4_K",   "Q6_K", "Q4_0", "Q4_1", "Q5_0",
                                         "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q5_K", "IQ4_XS"};
    float *w = malloc((size_t)n * k * sizeof *w), *x = malloc((size_t)R * k * sizeof *x);
    float *want = malloc((size_t)R * n * sizeof *want);
    float *got = malloc((size_t)R * n * sizeof *got), *dq = malloc(k * sizeof *dq);
    unsigned char *q = malloc(q_row_bytes(Q_F32, k) * n);
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = frand();
    for (size_t i = 0; i < (size_t)R * k; i++) x[i] = frand() * (float)(1 << (i / 32 % 12)) * 1e-2f;
    for (int j = 64; j < 96; j++) x[j] = 0.0f;
    int best = q_isa(), was = q_isa_cap(Q_ISA_PORTABLE), checked = 0;
    static const int rows_cases[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, Q_INT_MAX_ROWS, 33, 64};
    for (size_t t = 0; t < sizeof itypes / sizeof itypes[0]; t++) {
        const size_t rb = q_row_bytes(itypes[t], k);
        for (int i = 0; i < n; i++) q_quantize_row(itypes[t], w + (size_t)i * k, q + i * rb, k);
        for (size_t rc = 0; rc < sizeof rows_cases / sizeof rows_cases[0]; rc++)
            for (int beta = 0, rows = rows_cases[rc]; beta <= 1; beta++) {
                q_isa_cap(Q_ISA_PORTABLE);
                for (int i = 0; i < rows * n; i++) want[i] = 0.5f;
                /* the portable integer path takes up to Q_INT_MAX_ROWS rows at a time (each
                 * row's products do not depend on the others) */
                for (int r0 = 0; r0 < rows; r0 += Q_INT_MAX_ROWS)
                    q_matmul(itypes[t], q, n, k, x + (size_t)r0 * k,
                             rows - r0 < Q_INT_MAX_ROWS ? rows - r0 : Q_INT_MAX_ROWS, (float)beta,
                             want + (size_t)r0 * n, n);
                for (int i = 0; i < n && rc == 0 && beta == 0; i++) { /* the stated bound */
                    q_dequant_row(itypes[t], q + i * rb, dq, k);
                    double ref = 0, mag = 0;
                    for (int j = 0; j < k; j++) {
                        ref += (double)dq[j] * x[j];
                        mag += fabs((double)dq[j] * x[j]);
                    }
                    cr_assert_leq(fabs(want[i] - ref),
                                  1e-5 * mag + q8_act_bound(itypes[t], rows, dq, x, k),
                                  "%s portable: y[%d] = %.9g, exact %.9g", inames[t], i,
                                  (double)want[i], ref);
                }
                for (int isa = Q_ISA_AVX2; isa <= best; isa++) {
                    q_isa_cap(isa);
                    cr_assert_eq(q_isa(), isa);
                    if (!q_int_path(itypes[t], rows))
                        continue; /* AVX2 above Q_INT_MAX_ROWS: float tiles, tested above */
                    for (int i = 0; i < rows * n; i++) got[i] = 0.5f;
                    q_matmul(itypes[t], q, n, k, x, rows, (float)beta, got, n);
                    const bool differ = act_blocks_differ(itypes[t], rows, isa);
                    for (int i = 0; i < n; i++) {
                        q_dequant_row(itypes[t], q + i * rb, dq, k);
                        for (int r = 0; r < rows; r++) {
                            double mag = 0.5 * beta;
                            for (int j = 0; j < k; j++)
                                mag += fabs((double)dq[j] * x[(size_t)r * k + j]);
                            const double gap =
                                differ ? 2 * act_bound_blk(256, dq, x + (size_t)r * k, k) : 0;
                            cr_assert_leq(fabs(got[r * n + i] - want[r * n + i]), 1e-5 * mag + gap,
                                          "%s %s rows=%d beta=%d: y[%d][%d] = %.9g, portable "
                                          "%.9g",
                                          inames[t], q_isa_name(isa), rows, beta, r, i,
                                          (double)got[r * n + i], (double)want[r * n + i]);
                        }
                    }
                    checked++;
                }
            }
    }
    q_isa_cap(was);
    cr_log_info("integer path: %s; %d SIMD comparisons with the portable one", q_isa_name(best),
                checked);
    if (best == Q_ISA_PORTABLE) cr_log_info("no AVX2 here: only the portable path ran");
    free(w);
    free(x);
    free(want);
    free(got);
    free(dq);
    free(q);
}

/* A row's products do not depend on the rows beside it (DESIGN §8: batching does not change a
 * sequence's output): on each instruction set, every row of a batch of the integer path gives
 * to the bit what it gives alone (AVX-512 VNNI dots the weights as they lie up to 4 rows of
 * Q8_0 and 1 of the K types, and repacks them for more; both end in the same integer sums
 * and the same float steps: Q8_0's in 16 chains of blocks), for Q8_0 with an odd block count
 * (k = 288, the stories15M rows; k = 480, 15 blocks, as a row sums them 8 at a time; 160,
 * fewer than 8; 800, 16 + 8 + 1) too, and the 32-element types
 * (units of 8 blocks, the blocks past the last whole unit one at a time) with such a tail
 * (Q4_0, Q5_0, Q5_1, IQ4_NL), beta 0 and 1; with AVX-512 VNNI those dot up to 8 rows as the
 * weights lie, 4 at a time and the rest (5 rows: 4 + 1), and more in packed tiles. */
Test(gguf_quant, a_row_alone_equals_the_same_row_in_a_batch_to_the_bit)
{
    static const int itypes[] = {Q_Q8_0,   Q_Q4_K, Q_Q6_K, Q_Q8_0,   Q_Q4_1, Q_Q5_0,
                                 Q_Q2_K,   Q_Q3_K, Q_Q5_K, Q_IQ4_XS, Q_Q4_0, Q_Q5_1,
                                 Q_IQ4_NL, Q_Q8_0, Q_Q8_0, Q_Q8_0,   Q_Q5_0, Q_Q5_1};
    static const int ks[] = {1024, 768, 512, 288, 288, 1024, 768, 512, 768,
                             512,  800, 768, 544, 480, 160,  800, 800, 544};
    static const char *const inames[] = {
        "Q8_0",         "Q4_K",       "Q6_K",       "Q8_0 k=288", "Q4_1 k=288", "Q5_0",
        "Q2_K",         "Q3_K",       "Q5_K",       "IQ4_XS",     "Q4_0 k=800", "Q5_1",
        "IQ4_NL k=544", "Q8_0 k=480", "Q8_0 k=160", "Q8_0 k=800", "Q5_0 k=800", "Q5_1 k=544"};
    const int n = 37, R = 40;
    int best = q_isa(), was = q_isa_cap(Q_ISA_PORTABLE), checked = 0;
    for (size_t t = 0; t < sizeof itypes / sizeof itypes[0]; t++) {
        const int k = ks[t];
        const size_t rb = q_row_bytes(itypes[t], k);
        float *w = malloc((size_t)n * k * sizeof *w), *x = malloc((size_t)R * k * sizeof *x);
        float *batch = malloc((size_t)R * n * sizeof *batch), *alone = malloc(n * sizeof *alone);
        unsigned char *q = malloc(rb * n);
        for (size_t i = 0; i < (size_t)n * k; i++) w[i] = frand();
        for (size_t i = 0; i < (size_t)R * k; i++) x[i] = frand() * (float)(1 << (i / 32 % 7));
        for (int i = 0; i < n; i++) q_quantize_row(itypes[t], w + (size_t)i * k, q + i * rb, k);
        static const int rows_cases[] = {2, 3, 4, 5, 8, 9, 17, 32, 33, 40};
        for (int isa = Q_ISA_PORTABLE; isa <= best; isa++) {
            q_isa_cap(isa);
            for (size_t rc = 0; rc < sizeof rows_cases / sizeof rows_cases[0]; rc++)
                for (int beta = 0, rows = rows_cases[rc]; beta <= 1; beta++) {
                    if (!q_int_path(itypes[t], rows))
                        continue; /* float tiles above Q_INT_MAX_ROWS without AVX-512 */
                    for (int i = 0; i < rows * n; i++) batch[i] = 0.25f * (float)(i % 5);
                    q_matmul(itypes[t], q, n, k, x, rows, (float)beta, batch, n);
                    for (int r = 0; r < rows; r++) {
                        for (int i = 0; i < n; i++) alone[i] = 0.25f * (float)((r * n + i) % 5);
                        q_matmul(itypes[t], q, n, k, x + (size_t)r * k, 1, (float)beta, alone, n);
                        for (int i = 0; i < n; i++)
                            cr_assert(memcmp(&alone[i], &batch[(size_t)r * n + i], sizeof(float)) ==
                                          0,
                                      "%s %s rows=%d beta=%d: y[%d][%d] alone %.9g, in the batch "
                                      "%.9g",
                                      inames[t], q_isa_name(isa), rows, beta, r, i,
                                      (double)alone[i], (double)batch[(size_t)r * n + i]);
                    }
                    checked++;
                }
        }
        free(w);
        free(x);
        free(batch);
        free(alone);
        free(q);
    }
    q_isa_cap(was);
    cr_log_info("alone vs batch: %d batches compared row by row (best path %s)", checked,
                q_isa_name(best));
}

/* Activations quantized once (q_xq_prepare, as the CPU backend does per matmul region) and
 * handed to every chunk of weight rows give what q_matmul gives quantizing them itself, to
 * the bit, on each instruction set; a buffer too small, or rows prepared for another shape,
 * fall back to q_matmul. */
Test(gguf_quant, activations_quantized_once_give_the_same_products)
{
    static const int itypes[] = {Q_Q8_0, Q_Q4_K, Q_Q6_K, Q_Q5_1, Q_Q2_K, Q_IQ4_XS};
    const int n = 50, k = 512, R = 33;
    float *w = malloc((size_t)n * k * sizeof *w), *x = malloc((size_t)R * k * sizeof *x);
    float *want = malloc((size_t)R * n * sizeof *want), *got = malloc((size_t)R * n * sizeof *got);
    unsigned char *q = malloc(q_row_bytes(Q_F32, k) * n);
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = frand();
    for (size_t i = 0; i < (size_t)R * k; i++) x[i] = frand() * (float)(1 << (i / 32 % 9));
    int best = q_isa(), was = q_isa_cap(Q_ISA_PORTABLE), checked = 0;
    for (size_t t = 0; t < sizeof itypes / sizeof itypes[0]; t++) {
        const size_t rb = q_row_bytes(itypes[t], k);
        for (int i = 0; i < n; i++) q_quantize_row(itypes[t], w + (size_t)i * k, q + i * rb, k);
        static const int rows_cases[] = {1, 2, 9, 33};
        for (int isa = Q_ISA_PORTABLE; isa <= best; isa++) {
            q_isa_cap(isa);
            for (size_t rc = 0; rc < sizeof rows_cases / sizeof rows_cases[0]; rc++) {
                const int rows = rows_cases[rc];
                const size_t bytes = q_xq_bytes(rows, k);
                void *mem = malloc(bytes);
                cr_assert_null(q_xq_prepare(mem, bytes - 65, x, rows, k), "too few bytes");
                const q_xq *a = q_xq_prepare(mem, bytes, x, rows, k);
                cr_assert_not_null(a);
                /* in chunks of 16 weight rows, as the backend's workers take them, against
                 * q_matmul on the same chunks: above the integer path's rows (33 on a CPU
                 * without AVX-512) q_matmul runs OpenBLAS SGEMM, whose edge kernels sum an
                 * element in another order than its full tiles, so there a product depends
                 * on how the weight rows are split (the same split gives the same bits) */
                for (int i0 = 0; i0 < n; i0 += 16) {
                    const int m = n - i0 < 16 ? n - i0 : 16;
                    q_matmul(itypes[t], q + i0 * rb, m, k, x, rows, 0.0f, want + i0, n);
                    q_matmul_xq(itypes[t], q + i0 * rb, m, k, a, x, rows, 0.0f, got + i0, n);
                }
                cr_assert(memcmp(want, got, (size_t)rows * n * sizeof *got) == 0,
                          "type %d %s rows=%d: prepared activations differ", itypes[t],
                          q_isa_name(isa), rows);
                if (q_int_path(itypes[t], rows)) { /* integer products ignore the split */
                    q_matmul(itypes[t], q, n, k, x, rows, 0.0f, want, n);
                    cr_assert(memcmp(want, got, (size_t)rows * n * sizeof *got) == 0,
                              "type %d %s rows=%d: the split changed an integer product", itypes[t],
                              q_isa_name(isa), rows);
                }
                if (rows > 1) { /* prepared for other rows: q_matmul on x */
                    q_matmul_xq(itypes[t], q, n, k, a, x + k, rows - 1, 0.0f, got, n);
                    q_matmul(itypes[t], q, n, k, x + k, rows - 1, 0.0f, want, n);
                    cr_assert(memcmp(want, got, (size_t)(rows - 1) * n * sizeof *got) == 0,
                              "rows=%d: prepared for %d rows, not taken", rows - 1, rows);
                }
                free(mem);
                checked++;
            }
        }
    }
    q_isa_cap(was);
    cr_log_info("prepared activations: %d cases", checked);
    free(w);
    free(x);
    free(want);
    free(got);
    free(q);
}

/* Activations quantized in parts of rows (q_xq_plan, then q_xq_fill of each part, as the
 * backend's workers fill them, in any order) give q_xq_prepare's products to the bit, for
 * every type's layout (row-major, pairs, Q8_K, block-major, the K tiles') and every
 * instruction set, at row counts of decode (one part) and prefill; without their Q8_K
 * form, for every type that q_reads_q8k says does not read it; and as Q8_K alone, for every
 * type (the kernels that read only it, the others through q_matmul). */
Test(gguf_quant, activations_quantized_in_parts_give_the_same_products)
{
    static const int itypes[] = {Q_Q8_0, Q_Q4_K, Q_Q6_K,   Q_Q5_1, Q_Q4_0, Q_IQ4_XS,
                                 Q_Q4_1, Q_Q5_0, Q_IQ4_NL, Q_Q2_K, Q_Q3_K, Q_Q5_K};
    static const int rows_cases[] = {1, 3, 5, 33, 70};
    const int n = 40, k = 512, R = 70;
    float *w = malloc((size_t)n * k * sizeof *w), *x = malloc((size_t)R * k * sizeof *x);
    float *want = malloc((size_t)R * n * sizeof *want), *got = malloc((size_t)R * n * sizeof *got);
    unsigned char *q = malloc(q_row_bytes(Q_F32, k) * n);
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = frand();
    for (size_t i = 0; i < (size_t)R * k; i++) x[i] = frand() * (float)(1 << (i / 32 % 9));
    int best = q_isa(), was = q_isa_cap(Q_ISA_PORTABLE), checked = 0, only = 0;
    for (int isa = Q_ISA_PORTABLE; isa <= best; isa++) {
        q_isa_cap(isa);
        for (size_t rc = 0; rc < sizeof rows_cases / sizeof rows_cases[0]; rc++) {
            const int rows = rows_cases[rc];
            const size_t bytes = q_xq_bytes(rows, k);
            void *mem_a = malloc(bytes), *mem_b = malloc(bytes), *mem_c = malloc(bytes);
            memset(mem_b, 0x5A, bytes);
            memset(mem_c, 0x5A, bytes);
            const q_xq *a = q_xq_prepare(mem_a, bytes, x, rows, k);
            q_xq *b = q_xq_plan(mem_b, bytes, rows, k, true);
            cr_assert(a && b);
            cr_assert_null(q_xq_plan(mem_b, bytes - 65, rows, k, true), "too few bytes");
            const int cut1 = rows / 3, cut2 = 2 * rows / 3; /* the last part first */
            q_xq_fill(b, x, cut2, rows);
            q_xq_fill(b, x, 0, cut1);
            q_xq_fill(b, x, cut1, cut2);
            /* without the Q8_K form, for the weights that do not read it */
            q_xq *c = q_xq_plan(mem_c, bytes, rows, k, false);
            cr_assert(c);
            q_xq_fill(c, x, 0, cut2);
            q_xq_fill(c, x, cut2, rows);
            /* with the Q8_K form alone: the same products for the weights that read only it,
             * and for the others too (matmul_int leaves them to q_matmul) */
            void *mem_d = malloc(bytes);
            memset(mem_d, 0x5A, bytes);
            q_xq *d = q_xq_plan_q8k_only(mem_d, bytes, rows, k);
            cr_assert(d);
            q_xq_fill(d, x, cut1, rows);
            q_xq_fill(d, x, 0, cut1);
            for (size_t t = 0; t < sizeof itypes / sizeof itypes[0]; t++) {
                const size_t rb = q_row_bytes(itypes[t], k);
                for (int i = 0; i < n; i++)
                    q_quantize_row(itypes[t], w + (size_t)i * k, q + i * rb, k);
                q_matmul_xq(itypes[t], q, n, k, a, x, rows, 0.0f, want, n);
                q_matmul_xq(itypes[t], q, n, k, b, x, rows, 0.0f, got, n);
                cr_assert(memcmp(want, got, (size_t)rows * n * sizeof *got) == 0,
                          "type %d %s rows=%d: quantized in parts differs", itypes[t],
                          q_isa_name(isa), rows);
                memset(got, 0, (size_t)rows * n * sizeof *got);
                q_matmul_xq(itypes[t], q, n, k, d, x, rows, 0.0f, got, n);
                cr_assert(memcmp(want, got, (size_t)rows * n * sizeof *got) == 0,
                          "type %d %s rows=%d: quantized as Q8_K alone differs", itypes[t],
                          q_isa_name(isa), rows);
                only += q_reads_only_q8k(itypes[t], rows, k);
                if (!q_reads_q8k(itypes[t])) {
                    q_matmul_xq(itypes[t], q, n, k, c, x, rows, 0.0f, got, n);
                    cr_assert(memcmp(want, got, (size_t)rows * n * sizeof *got) == 0,
                              "type %d %s rows=%d: quantized without Q8_K differs", itypes[t],
                              q_isa_name(isa), rows);
                }
                if (q_matmul_tiles(itypes[t], q, n, k, a, 0.0f, want, n)) {
                    cr_assert(q_matmul_tiles(itypes[t], q, n, k, b, 0.0f, got, n));
                    cr_assert(memcmp(want, got, (size_t)rows * n * sizeof *got) == 0,
                              "type %d %s rows=%d: the tiles differ quantized in parts", itypes[t],
                              q_isa_name(isa), rows);
                }
                checked++;
            }
            free(mem_a);
            free(mem_b);
            free(mem_c);
            free(mem_d);
        }
    }
    q_isa_cap(was);
    cr_log_info("activations quantized in parts: %d cases, %d read as Q8_K alone", checked, only);
    cr_assert(best < Q_ISA_AVX512 || only > 0, "no type read the Q8_K form alone on %s",
              q_isa_name(best));
    free(w);
    free(x);
    free(want);
    free(got);
    free(q);
}

/* Random bytes as weights: every bit pattern a block may hold (codes the quantizers never
 * write, such as Q8_0's -128, Q6_K's negative scales, Q4_K's largest 6-bit scales and mins),
 * with finite f16 scales; F16 and BF16 weights from a wide range, subnormal halves included. */
static void random_blocks(int type, unsigned char *q, int n, int k)
{
    const size_t rb = q_row_bytes(type, k);
    for (size_t i = 0; i < rb * n; i++) q[i] = (unsigned char)(frand() * 128 + 128);
    uint16_t *h = (uint16_t *)q;
    for (size_t i = 0; i < (size_t)n * k && (type == Q_F16 || type == Q_BF16); i++) {
        const float v = frand() * (i % 7 == 0 ? 1e-5f : i % 7 == 1 ? 100.0f : 1.0f);
        h[i] = type == Q_F16 ? q_f32_to_f16(v) : q_f32_to_bf16(v);
    }
    const size_t bb = q_row_bytes(type, q_block_elems(type)); /* bytes per block */
    for (size_t b = 0; b < rb * n / bb && type != Q_F32 && type != Q_F16 && type != Q_BF16; b++) {
        unsigned char *blk = q + b * bb;
        const uint16_t d = q_f32_to_f16(fabsf(frand()) * 0.02f);
        const uint16_t dmin = q_f32_to_f16(fabsf(frand()) * 0.02f);
        /* Q6_K's and Q3_K's d end their blocks, Q2_K's d and dmin too */
        const size_t at = type == Q_Q6_K ? 208 : type == Q_Q3_K ? 108 : type == Q_Q2_K ? 80 : 0;
        memcpy(blk + at, &d, 2);
        if (type == Q_Q4_K || type == Q_Q4_1 || type == Q_Q5_1 || type == Q_Q5_K ||
            type == Q_Q2_K) /* dmin, or m */
            memcpy(blk + at + 2, &dmin, 2);
    }
    if (type == Q_F32) {
        float *f = (float *)q;
        for (size_t i = 0; i < (size_t)n * k; i++) f[i] = frand();
    }
}

/* The stated bound of BF16 weights dotted with activations rounded to bf16 (q_bf16_dot_path,
 * gemm_bf16.h): |y - exact| <= (2^-8 + (K + 2) 2^-24) sum |x w|, y from rows of bf16 weights q
 * (n rows of k) and x (rows of k), beta 0 or 1 over the test's starting values. */
static void bf16_dot_within_bound(const unsigned char *q, int n, int k, const float *x, int rows,
                                  int beta, const float *got)
{
    const uint16_t *h = (const uint16_t *)q;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) {
            double e = beta ? 0.5 * ((r * n + i) % 3) : 0, mag = 0;
            for (int j = 0; j < k; j++) {
                const double p = (double)q_bf16_to_f32(h[(size_t)i * k + j]) * x[(size_t)r * k + j];
                e += p;
                mag += fabs(p);
            }
            const double bound =
                (0x1p-8 + (k + 2) * 0x1p-24) * mag + (beta ? 0x1p-24 * fabs(e) : 0);
            cr_assert_leq(
                fabs(got[(size_t)r * n + i] - e), bound,
                "BF16 dots k=%d rows=%d beta=%d: y[%d][%d] = %.9g, exact %.9g, bound %.3g", k, rows,
                beta, r, i, (double)got[(size_t)r * n + i], e, bound);
        }
}

/* Every kernel of the portable path beside the SIMD ones, on random blocks of every type:
 * q_dot (the fused dots) and q_matmul at row counts that take each of its paths (fused dots up
 * to Q_FUSED_MAX_ROWS, the integer kernels up to Q_INT_MAX_ROWS, dequantized tiles above; the
 * float types' tiles at every row count)
 * on each instruction set this CPU has, against the portable products and the exact ones. The
 * tiles dequantize exactly on every path (F16C's conversion as the scalar one), so there the
 * products are the same to the bit; elsewhere within quant.h's bounds: 1e-5 x sum |w x| between
 * paths, plus the 8-bit activations' bound against the exact product on the integer path. */
Test(gguf_quant, every_kernel_on_random_blocks_portable_beside_simd)
{
    const int n = 24, k = 512, R = 40;
    float *x = malloc((size_t)R * k * sizeof *x), *dq = malloc((size_t)n * k * sizeof *dq);
    float *want = malloc((size_t)R * n * sizeof *want), *got = malloc((size_t)R * n * sizeof *got);
    double *exact = malloc((size_t)R * n * sizeof *exact),
           *mag = malloc((size_t)R * n * sizeof *mag);
    unsigned char *q = malloc(q_row_bytes(Q_F32, k) * n);
    for (size_t i = 0; i < (size_t)R * k; i++) x[i] = frand() * (float)(1 << (i / 32 % 9));
    static const int rows_cases[] = {1, 2, 4, 5, 8, 12, 13, 31, 32, 33, 40};
    int best = q_isa(), was = q_isa_cap(Q_ISA_PORTABLE), checked = 0;
    if (best == Q_ISA_PORTABLE) cr_log_info("no AVX2/FMA/F16C here: only the portable path ran");
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const int type = types[t];
        const size_t rb = q_row_bytes(type, k);
        random_blocks(type, q, n, k);
        for (int i = 0; i < n; i++) q_dequant_row(type, q + i * rb, dq + (size_t)i * k, k);
        for (int r = 0; r < R; r++)
            for (int i = 0; i < n; i++) {
                double e = 0, m = 0;
                for (int j = 0; j < k; j++) {
                    const double p = (double)dq[(size_t)i * k + j] * x[(size_t)r * k + j];
                    e += p;
                    m += fabs(p);
                }
                cr_assert(isfinite(e), "%s: random blocks must stay finite", names[t]);
                exact[(size_t)r * n + i] = e;
                mag[(size_t)r * n + i] = m;
            }
        for (size_t rc = 0; rc < sizeof rows_cases / sizeof rows_cases[0]; rc++) {
            const int rows = rows_cases[rc];
            q_isa_cap(Q_ISA_PORTABLE);
            const bool float_type = type == Q_F32 || type == Q_F16 || type == Q_BF16;
            const bool tiles_portable =
                (rows > Q_FUSED_MAX_ROWS || float_type) && !q_int_path(type, rows);
            q_matmul(type, q, n, k, x, rows, 0.0f, want, n);
            for (int r = 0; r < rows; r++)
                for (int i = 0; i < n; i++) {
                    const size_t at = (size_t)r * n + i;
                    double bound = 1e-5 * mag[at];
                    if (q_int_path(type, rows))
                        bound += q8_act_bound(type, rows, dq + (size_t)i * k, x + (size_t)r * k, k);
                    cr_assert_leq(fabs(want[at] - exact[at]), bound,
                                  "%s portable rows=%d: y[%d][%d] = %.9g, exact %.9g", names[t],
                                  rows, r, i, (double)want[at], exact[at]);
                    if (rows == 1) { /* the fused dot itself */
                        const double d = q_dot(type, q + i * rb, x, k);
                        cr_assert_leq(fabs(d - exact[at]), 1e-5 * mag[at],
                                      "%s portable q_dot: row %d = %.9g, exact %.9g", names[t], i,
                                      d, exact[at]);
                    }
                }
            for (int isa = Q_ISA_AVX2; isa <= best; isa++) {
                q_isa_cap(isa);
                q_matmul(type, q, n, k, x, rows, 0.0f, got, n);
                if (type == Q_BF16 && q_bf16_dot_path(rows)) {
                    bf16_dot_within_bound(q, n, k, x, rows, 0, got);
                } else if (tiles_portable && !q_int_path(type, rows)) {
                    cr_assert(memcmp(want, got, (size_t)rows * n * sizeof *got) == 0,
                              "%s %s rows=%d: dequantized tiles differ from the portable ones",
                              names[t], q_isa_name(isa), rows);
                } else if (tiles_portable) {
                    /* AVX-512 VNNI above Q_INT_MAX_ROWS: integers where the portable path
                     * has float tiles, each within its bound of the exact product */
                    for (int r = 0; r < rows; r++)
                        for (int i = 0; i < n; i++) {
                            const size_t at = (size_t)r * n + i;
                            const double bound =
                                1e-5 * mag[at] +
                                q8_act_bound(type, rows, dq + (size_t)i * k, x + (size_t)r * k, k);
                            cr_assert_leq(fabs((double)got[at] - exact[at]), bound,
                                          "%s %s rows=%d: y[%d][%d] = %.9g, exact %.9g", names[t],
                                          q_isa_name(isa), rows, r, i, (double)got[at], exact[at]);
                        }
                } else {
                    const bool differ = act_blocks_differ(type, rows, isa);
                    for (int r = 0; r < rows; r++)
                        for (int i = 0; i < n; i++) {
                            const size_t at = (size_t)r * n + i;
                            const double gap = differ ? 2 * act_bound_blk(256, dq + (size_t)i * k,
                                                                          x + (size_t)r * k, k)
                                                      : 0;
                            cr_assert_leq(fabs((double)got[at] - want[at]), 1e-5 * mag[at] + gap,
                                          "%s %s rows=%d: y[%d][%d] = %.9g, portable %.9g",
                                          names[t], q_isa_name(isa), rows, r, i, (double)got[at],
                                          (double)want[at]);
                        }
                }
                for (int i = 0; i < n && rows == 1; i++) {
                    const double d = q_dot(type, q + i * rb, x, k);
                    q_isa_cap(Q_ISA_PORTABLE);
                    const double p = q_dot(type, q + i * rb, x, k);
                    q_isa_cap(isa);
                    cr_assert_leq(fabs(d - p), 1e-5 * mag[i],
                                  "%s %s q_dot: row %d = %.9g, "
                                  "portable %.9g",
                                  names[t], q_isa_name(isa), i, d, p);
                }
                checked++;
            }
        }
    }
    q_isa_cap(was);
    cr_log_info("random blocks: %d comparisons with the portable path (best %s)", checked,
                q_isa_name(best));
    free(x);
    free(dq);
    free(want);
    free(got);
    free(exact);
    free(mag);
    free(q);
}

/* The decode kernels of the integer path, 1 to 4 activation rows (one row alone dots several
 * weight rows at once, the rows left over one at a time): on each instruction set this CPU
 * has, every integer type, quantized weights and random blocks (every bit pattern a block may
 * hold), rows of whole and partial units of 8 blocks (k = 288: 9 blocks of 32), weight row
 * counts that leave remainders (1, 3, 45), beta 0 and 1. Each product is within quant.h's
 * bound of the product of the dequantized weights with the float activations (1e-5 x
 * sum |w x| plus the 8-bit activations' bound), and each row of a batch gives to the bit what
 * it gives alone. */
Test(gguf_quant, decode_kernels_of_every_integer_type_within_the_bound_of_the_float_product)
{
    static const int itypes[] = {Q_Q8_0, Q_Q4_K,   Q_Q6_K, Q_Q4_0, Q_Q4_1, Q_Q5_0,
                                 Q_Q5_1, Q_IQ4_NL, Q_Q2_K, Q_Q3_K, Q_Q5_K, Q_IQ4_XS};
    static const char *const inames[] = {"Q8_0", "Q4_K",   "Q6_K", "Q4_0", "Q4_1", "Q5_0",
                                         "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q5_K", "IQ4_XS"};
    static const int ns[] = {1, 3, 45};
    enum { N = 45, R = 4, KMAX = 768 };
    float *x = malloc((size_t)R * KMAX * sizeof *x), *dq = malloc((size_t)N * KMAX * sizeof *dq);
    float *got = malloc((size_t)R * N * sizeof *got), *alone = malloc(N * sizeof *alone);
    double *exact = malloc((size_t)R * N * sizeof *exact),
           *bound = malloc((size_t)R * N * sizeof *bound);
    float *wf = malloc((size_t)N * KMAX * sizeof *wf);
    unsigned char *q = malloc(q_row_bytes(Q_F32, KMAX) * N);
    int best = q_isa(), was = q_isa_cap(Q_ISA_PORTABLE), checked = 0;
    for (size_t t = 0; t < sizeof itypes / sizeof itypes[0]; t++) {
        const int type = itypes[t];
        const int ks[2] = {q_block_elems(type) == 32 ? 288 : 512, KMAX};
        for (int ki = 0; ki < 2; ki++)
            for (int data = 0; data < 2; data++) {
                const int k = ks[ki];
                const size_t rb = q_row_bytes(type, k);
                if (data == 0) {
                    for (size_t i = 0; i < (size_t)N * k; i++) wf[i] = frand();
                    for (int i = 0; i < N; i++)
                        q_quantize_row(type, wf + (size_t)i * k, q + i * rb, k);
                } else {
                    random_blocks(type, q, N, k);
                }
                for (size_t i = 0; i < (size_t)R * k; i++)
                    x[i] = frand() * (float)(1 << (i / 32 % 9)) * 0.1f;
                for (int j = 32; j < 64; j++) x[k + j] = 0.0f; /* an all-zero block */
                for (int i = 0; i < N; i++) q_dequant_row(type, q + i * rb, dq + (size_t)i * k, k);
                for (int r = 0; r < R; r++)
                    for (int i = 0; i < N; i++) {
                        double e = 0, m = 0;
                        for (int j = 0; j < k; j++) {
                            const double p = (double)dq[(size_t)i * k + j] * x[(size_t)r * k + j];
                            e += p;
                            m += fabs(p);
                        }
                        exact[r * N + i] = e;
                        bound[r * N + i] = 1e-5 * m + q8_act_bound(type, 1, dq + (size_t)i * k,
                                                                   x + (size_t)r * k, k);
                    }
                for (int isa = Q_ISA_PORTABLE; isa <= best; isa++) {
                    q_isa_cap(isa);
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                        for (int rows = 1; rows <= R; rows++)
                            for (int beta = 0; beta <= 1; beta++) {
                                const int n = ns[ni];
                                cr_assert(q_int_path(type, rows));
                                for (int i = 0; i < rows * n; i++) got[i] = 0.25f * (float)(i % 3);
                                q_matmul(type, q, n, k, x, rows, (float)beta, got, n);
                                for (int r = 0; r < rows; r++) {
                                    for (int i = 0; i < n; i++)
                                        alone[i] = 0.25f * (float)((r * n + i) % 3);
                                    q_matmul(type, q, n, k, x + (size_t)r * k, 1, (float)beta,
                                             alone, n);
                                    for (int i = 0; i < n; i++) {
                                        const double init = 0.25 * ((r * n + i) % 3) * beta;
                                        const double want = exact[r * N + i] + init;
                                        const float y = got[r * n + i];
                                        cr_assert_leq(
                                            fabs(y - want), bound[r * N + i] + 1e-6 * fabs(init),
                                            "%s %s k=%d %s n=%d rows=%d beta=%d: "
                                            "y[%d][%d] = %.9g, dequantized product "
                                            "%.9g (bound %.3g)",
                                            inames[t], q_isa_name(isa), k,
                                            data ? "random blocks" : "quantized", n, rows, beta, r,
                                            i, (double)y, want, bound[r * N + i]);
                                        cr_assert(memcmp(&alone[i], &y, sizeof y) == 0,
                                                  "%s %s k=%d n=%d rows=%d beta=%d: y[%d][%d] "
                                                  "alone %.9g, in the batch %.9g",
                                                  inames[t], q_isa_name(isa), k, n, rows, beta, r,
                                                  i, (double)alone[i], (double)y);
                                    }
                                }
                                checked++;
                            }
                }
            }
    }
    q_isa_cap(was);
    cr_log_info("decode kernels: %d products checked (best path %s)", checked, q_isa_name(best));
    free(x);
    free(dq);
    free(got);
    free(alone);
    free(exact);
    free(bound);
    free(wf);
    free(q);
}

/* F16 and BF16 weights, converted in registers or into float tiles as the instruction set
 * allows, give to the bit what their rows converted to floats give through gemm_small (the
 * float32 weights' kernel), at every row count gemm_small takes, on each instruction set (BF16
 * where q_bf16_dot_path rounds the activations: within its bound of the exact product): row
 * lengths with a tail of every kind (1, 15 and 17 elements; 771 = 48 x 16 + 3), 3, 9 and 22
 * weight rows (rows alone only; tiles of 4 with one or two rows left, with and without a tile
 * prefetched ahead), batches that cross gemm_small's passes (84 rows of 771), beta 0 and 1,
 * subnormal halves; and each row of a batch gives what it gives alone. */
Test(gguf_quant, half_weights_give_gemm_smalls_bits_alone_and_in_every_batch)
{
    static const int ks[] = {1, 15, 17, 288, 771};
    static const int ns[] = {3, 9, 22};
    static const int rows_cases[] = {1, 2, 3, 4, 5, 7, 8, 13, 32, 33, 85, 128};
    enum { NMAX = 22 };
    const int R = 128, kmax = 771;
    float *x = malloc((size_t)R * kmax * sizeof *x), *dq = malloc((size_t)NMAX * kmax * sizeof *dq);
    float *want = malloc((size_t)R * NMAX * sizeof *want);
    float *got = malloc((size_t)R * NMAX * sizeof *got);
    float alone[NMAX];
    unsigned char *q = malloc(q_row_bytes(Q_F16, kmax) * NMAX);
    const int best = q_isa(), was = q_isa_cap(Q_ISA_PORTABLE);
    int checked = 0;
    cr_assert_geq(gemm_small_max_rows(GEMM_SMALL_AUTO), 12);
    for (int t = 0; t < 2; t++) {
        const int type = t ? Q_BF16 : Q_F16;
        for (size_t c = 0; c < sizeof ks / sizeof ks[0] * (sizeof ns / sizeof ns[0]); c++) {
            const int k = ks[c / (sizeof ns / sizeof ns[0])],
                      n = ns[c % (sizeof ns / sizeof ns[0])];
            const size_t rb = q_row_bytes(type, k);
            random_blocks(type, q, n, k);
            for (int i = 0; i < n; i++) q_dequant_row(type, q + i * rb, dq + (size_t)i * k, k);
            for (size_t i = 0; i < (size_t)R * k; i++) x[i] = frand() * (float)(1 << (i / 16 % 9));
            for (size_t rc = 0; rc < sizeof rows_cases / sizeof rows_cases[0]; rc++) {
                const int rows = rows_cases[rc];
                if (rows > gemm_small_max_rows(GEMM_SMALL_AUTO)) continue;
                for (int beta = 0; beta <= 1; beta++) {
                    for (int i = 0; i < rows * n; i++) want[i] = got[i] = 0.5f * (float)(i % 3);
                    gemm_small(GEMM_SMALL_AUTO, rows, n, k, x, k, dq, k, (float)beta, want, n);
                    for (int isa = Q_ISA_PORTABLE; isa <= best; isa++) {
                        q_isa_cap(isa);
                        for (int i = 0; i < rows * n; i++) got[i] = 0.5f * (float)(i % 3);
                        q_matmul(type, q, n, k, x, rows, (float)beta, got, n);
                        if (type == Q_BF16 && q_bf16_dot_path(rows))
                            bf16_dot_within_bound(q, n, k, x, rows, beta, got);
                        else
                            for (int i = 0; i < rows * n; i++)
                                cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                                          "%s %s k=%d n=%d rows=%d beta=%d: y[%d][%d] = "
                                          "%.9g, gemm_small %.9g",
                                          names[t + 1], q_isa_name(isa), k, n, rows, beta, i / n,
                                          i % n, (double)got[i], (double)want[i]);
                        for (int r = 0; r < rows; r++) {
                            for (int i = 0; i < n; i++) alone[i] = 0.5f * (float)((r * n + i) % 3);
                            q_matmul(type, q, n, k, x + (size_t)r * k, 1, (float)beta, alone, n);
                            cr_assert(
                                memcmp(alone, got + (size_t)r * n, (size_t)n * sizeof *alone) == 0,
                                "%s %s k=%d n=%d rows=%d beta=%d: row %d alone differs "
                                "from the same row in the batch",
                                names[t + 1], q_isa_name(isa), k, n, rows, beta, r);
                        }
                        checked++;
                    }
                }
            }
        }
    }
    q_isa_cap(was);
    cr_log_info("half weights: %d products equal to gemm_small's (best path %s)", checked,
                q_isa_name(best));
    free(x);
    free(dq);
    free(want);
    free(got);
    free(q);
}
