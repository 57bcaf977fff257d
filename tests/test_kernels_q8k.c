/* SPDX-License-Identifier: MIT */
/*
 * The K types' integer dots with Q8_K activations (kernels/cpu/quant_q8k.c), on AVX2 and the
 * portable path (and with AVX-512 VNNI, in its own arithmetic: quant_kquants.c and, for Q2_K,
 * Q3_K and IQ4_XS, quant_k23.c, one float step per 256):
 *   - the activation quantizer gives ggml's quantize_row_q8_K_ref (copied below) to the bit,
 *     portable and AVX2: the first element of the largest magnitude sets the (signed) scale,
 *     halves round to even, all-zero blocks stay zero;
 *   - Q4_K, Q6_K, Q5_K, Q3_K, Q2_K and IQ4_XS products at 1 to 4 activation rows (and odd batches up to
 *     Q_INT_MAX_ROWS), odd weight-row counts, one to three superblocks, beta 0 and 1, from
 *     quantized weights and from random blocks (every bit pattern): the portable path and
 *     AVX2 give the same bits (AVX-512: the same bound of the Q8_K product below), a row
 *     alone what it gets in a batch (AVX-512's Q2_K, Q3_K, IQ4_XS: at every row count up to
 *     Q_INT_MAX_ROWS); each product is the
 *     product of the dequantized weights with the Q8_K-dequantized activations within float
 *     rounding (1e-5 x sum |w x|), and the dequantized weights' product with the float
 *     activations within quant.h's bound (sum_j |w_j| max|x over j's 256| (1/254 + 1/2048)).
 */
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_internal.h"
#include "kernel_rows.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ggml's quantize_row_q8_K_ref (ggml-quants.c), its nearest_int included. */
static int ggml_nearest_int(float fval)
{
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

static void ggml_q8k(const float *x, int8_t *qs, float *d, int16_t *bsums, int64_t k)
{
    for (int64_t i = 0; i < k / 256; i++, x += 256, qs += 256, bsums += 16) {
        float max = 0, amax = 0;
        for (int j = 0; j < 256; ++j) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (!amax) {
            d[i] = 0;
            memset(qs, 0, 256);
            memset(bsums, 0, 32); /* ggml leaves them; ringlm zeroes them */
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < 256; ++j) {
            int v = ggml_nearest_int(iscale * x[j]);
            qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < 16; ++j) {
            int sum = 0;
            for (int ii = 0; ii < 16; ++ii) sum += qs[j * 16 + ii];
            bsums[j] = (int16_t)sum;
        }
        d[i] = 1 / iscale;
    }
}

Test(kernels_q8k, the_activation_quantizer_is_ggmls_to_the_bit)
{
    enum { K = 256 * 6 };
    float *x = malloc(K * sizeof *x);
    int8_t q[3][K];
    float d[3][K / 256];
    int16_t bs[3][K / 16];
    const bool avx2 = q_isa() >= Q_ISA_AVX2;
    if (!avx2) cr_log_info("no AVX2 here: only the portable quantizer is checked");
    for (int trial = 0; trial < 200; trial++) {
        for (int j = 0; j < K; j++) x[j] = rnd_float() * (float)(1 << (j / 32 % 9)) * 0.01f;
        switch (trial % 5) {
        case 0: memset(x + 256, 0, 256 * sizeof *x); break; /* an all-zero block */
        case 1:                                             /* +m before -m, and after */
            x[10] = 5.0f;
            x[200] = -5.0f;
            x[256 + 3] = -7.0f;
            x[256 + 100] = 7.0f;
            break;
        case 2: /* a scale of exactly -1 (max -127): halves round to even */
            x[512] = -127.0f;
            for (int j = 1; j < 256; j++) x[512 + j] = (float)((int)(rnd() % 250) - 125) + 0.5f;
            break;
        case 3: /* a block of tiny values, its largest magnitude at its end */
            for (int j = 768; j < 1024; j++) x[j] = rnd_float() * 1e-30f;
            x[1023] = -2e-30f;
            break;
        default: break;
        }
        ggml_q8k(x, q[0], d[0], bs[0], K);
        memset(q[1], 0x55, sizeof q[1]);
        memset(bs[1], 0x55, sizeof bs[1]);
        qk_q8k_row_portable(x, q[1], d[1], bs[1], K);
        cr_assert(memcmp(q[0], q[1], sizeof q[0]) == 0, "trial %d: portable q differ", trial);
        cr_assert(memcmp(d[0], d[1], sizeof d[0]) == 0, "trial %d: portable d differ", trial);
        cr_assert(memcmp(bs[0], bs[1], sizeof bs[0]) == 0, "trial %d: portable sums", trial);
#if QK_X86
        if (avx2) {
            memset(q[2], 0x55, sizeof q[2]);
            memset(bs[2], 0x55, sizeof bs[2]);
            qk_q8k_row_avx2(x, q[2], d[2], bs[2], K);
            cr_assert(memcmp(q[0], q[2], sizeof q[0]) == 0, "trial %d: AVX2 q differ", trial);
            cr_assert(memcmp(d[0], d[2], sizeof d[0]) == 0, "trial %d: AVX2 d differ", trial);
            cr_assert(memcmp(bs[0], bs[2], sizeof bs[0]) == 0, "trial %d: AVX2 sums", trial);
        }
#endif
        if (trial % 5 == 2) { /* max -127: iscale -127/-127 = 1, q = x, halves to even */
            cr_assert_eq(d[1][2], 1.0f);
            for (int j = 1; j < 256; j++) {
                const float fl = floorf(x[512 + j]);
                const float want = fmodf(fl, 2.0f) == 0.0f ? fl : fl + 1.0f;
                cr_assert_eq((float)q[1][512 + j], want, "x %g -> q %d", (double)x[512 + j],
                             q[1][512 + j]);
            }
        }
        if (trial % 5 == 3) cr_assert_gt(d[1][3], 0.0f, "max -2e-30 last: a positive scale");
        if (trial % 5 == 1) {
            cr_assert_lt(d[1][0], 0.0f, "max +5 first: a negative scale");
            cr_assert_gt(d[1][1], 0.0f, "max -7 first: a positive scale");
        }
    }
    free(x);
}

/* Random bytes as weights, with finite f16 scales (as tests/test_gguf_quant.c). */
static void random_blocks(int type, unsigned char *q, int n, int k)
{
    const size_t rb = q_row_bytes(type, k);
    for (size_t i = 0; i < rb * n; i++) q[i] = (unsigned char)rnd();
    for (size_t b = 0; b < rb * n / q_row_bytes(type, 256); b++) {
        unsigned char *blk = q + b * q_row_bytes(type, 256);
        const uint16_t d = q_f32_to_f16(fabsf(rnd_float()) * 0.02f);
        const uint16_t dmin = q_f32_to_f16(fabsf(rnd_float()) * 0.02f);
        /* d (and dmin) first, or ending the block: Q6_K's d, Q3_K's, Q2_K's d and dmin */
        const size_t at = type == Q_Q6_K ? 208 : type == Q_Q3_K ? 108 : type == Q_Q2_K ? 80 : 0;
        memcpy(blk + at, &d, 2);
        if (type == Q_Q4_K || type == Q_Q5_K || type == Q_Q2_K) memcpy(blk + at + 2, &dmin, 2);
    }
}

Test(kernels_q8k, k_type_dots_portable_equal_avx2_and_the_q8k_product)
{
    static const int types[] = {Q_Q4_K, Q_Q6_K, Q_Q5_K, Q_Q3_K, Q_Q2_K, Q_IQ4_XS};
    static const char *const names[] = {"Q4_K", "Q6_K", "Q5_K", "Q3_K", "Q2_K", "IQ4_XS"};
    static const int ks[] = {256, 768};
    static const int ns[] = {1, 3, 45};
    static const int rows_cases[] = {1, 2, 3, 4, 5, 9, 17, Q_INT_MAX_ROWS};
    enum { N = 45, R = Q_INT_MAX_ROWS, KMAX = 768 };
    float *x = malloc((size_t)R * KMAX * sizeof *x), *xk = malloc((size_t)R * KMAX * sizeof *xk);
    float *dq = malloc((size_t)N * KMAX * sizeof *dq), *wf = malloc((size_t)N * KMAX * sizeof *wf);
    float *got = malloc((size_t)R * N * sizeof *got), *want = malloc((size_t)R * N * sizeof *want);
    double *ref8 = malloc((size_t)R * N * sizeof *ref8),
           *mag8 = malloc((size_t)R * N * sizeof *mag8);
    float *alone = malloc(N * sizeof *alone);
    unsigned char *q = malloc(q_row_bytes(Q_F32, KMAX) * N);
    int8_t *xq = malloc(KMAX);
    float xd[KMAX / 256];
    int16_t xs[KMAX / 16];
    const int best = q_isa(), was = q_isa_cap(Q_ISA_PORTABLE);
    const bool avx2 = best >= Q_ISA_AVX2;
    if (!avx2) cr_log_info("no AVX2 here: only the portable path is checked");
    int checked = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            for (int data = 0; data < 2; data++) {
                const int type = types[t], k = ks[ki];
                const size_t rb = q_row_bytes(type, k);
                if (data == 0) {
                    for (size_t i = 0; i < (size_t)N * k; i++) wf[i] = rnd_float();
                    for (int i = 0; i < N; i++)
                        q_quantize_row(type, wf + (size_t)i * k, q + i * rb, k);
                } else {
                    random_blocks(type, q, N, k);
                }
                for (int i = 0; i < N; i++) q_dequant_row(type, q + i * rb, dq + (size_t)i * k, k);
                for (size_t i = 0; i < (size_t)R * k; i++)
                    x[i] = rnd_float() * (float)(1 << (i / 32 % 9)) * 0.1f;
                for (int j = 32; j < 64; j++) x[k + j] = 0.0f;
                for (int r = 0; r < R; r++) { /* the activations as Q8_K holds them */
                    ggml_q8k(x + (size_t)r * k, xq, xd, xs, k);
                    for (int j = 0; j < k; j++) xk[(size_t)r * k + j] = xd[j / 256] * xq[j];
                }
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
                    for (size_t rc = 0; rc < sizeof rows_cases / sizeof rows_cases[0]; rc++)
                        for (int beta = 0; beta <= 1; beta++) {
                            const int n = ns[ni], rows = rows_cases[rc];
                            for (int i = 0; i < rows * n; i++) want[i] = 0.25f * (i % 3);
                            q_isa_cap(Q_ISA_PORTABLE);
                            cr_assert_eq(q_int_act_elems(type, rows), 256);
                            q_matmul(type, q, n, k, x, rows, (float)beta, want, n);
                            for (int r = 0; r < rows; r++)
                                for (int i = 0; i < n; i++) {
                                    const double init = 0.25 * ((r * n + i) % 3) * beta;
                                    double e8 = init, e = init, m8 = 0, bound = 0;
                                    for (int j = 0; j < k; j++) {
                                        const double w = dq[(size_t)i * k + j];
                                        e8 += w * xk[(size_t)r * k + j];
                                        m8 += fabs(w * xk[(size_t)r * k + j]);
                                        e += w * x[(size_t)r * k + j];
                                    }
                                    for (int b = 0; b < k / 256; b++) {
                                        double amax = 0, sw = 0;
                                        for (int j = 256 * b; j < 256 * b + 256; j++) {
                                            amax = fmax(amax, fabs(x[(size_t)r * k + j]));
                                            sw += fabs(dq[(size_t)i * k + j]);
                                        }
                                        bound += sw * amax * (1.0 / 254 + 1.0 / 2048);
                                    }
                                    const float y = want[r * n + i];
                                    ref8[r * n + i] = e8;
                                    mag8[r * n + i] = 1e-5 * m8 + 1e-6 * init;
                                    cr_assert_leq(fabs(y - e8), 1e-5 * m8 + 1e-6 * init,
                                                  "%s k=%d %s n=%d rows=%d beta=%d: y[%d][%d] "
                                                  "= %.9g, with Q8_K activations %.9g",
                                                  names[t], k, data ? "random" : "quantized", n,
                                                  rows, beta, r, i, (double)y, e8);
                                    cr_assert_leq(fabs(y - e), bound + 1e-5 * m8 + 1e-6 * init,
                                                  "%s k=%d rows=%d: y[%d][%d] = %.9g, exact "
                                                  "%.9g (bound %.3g)",
                                                  names[t], k, rows, r, i, (double)y, e, bound);
                                }
                            for (int r = 0; r < rows; r++) { /* alone = in the batch */
                                for (int i = 0; i < n; i++) alone[i] = 0.25f * ((r * n + i) % 3);
                                q_matmul(type, q, n, k, x + (size_t)r * k, 1, (float)beta, alone,
                                         n);
                                cr_assert(memcmp(alone, want + r * n, n * sizeof *alone) == 0,
                                          "%s k=%d n=%d rows=%d: row %d alone differs", names[t], k,
                                          n, rows, r);
                            }
                            /* AVX2: the portable bits; AVX-512 VNNI: its own within the
                             * bound of the Q8_K product, a row alone what it gets in the
                             * batch */
                            for (int isa = Q_ISA_AVX2; isa <= best; isa++) {
                                q_isa_cap(isa);
                                cr_assert_eq(q_int_act_elems(type, rows), 256);
                                const bool own = isa >= Q_ISA_AVX512;
                                for (int i = 0; i < rows * n; i++) got[i] = 0.25f * (i % 3);
                                q_matmul(type, q, n, k, x, rows, (float)beta, got, n);
                                for (int r = 0; r < rows && own; r++) {
                                    for (int i = 0; i < n; i++)
                                        alone[i] = 0.25f * ((r * n + i) % 3);
                                    q_matmul(type, q, n, k, x + (size_t)r * k, 1, (float)beta,
                                             alone, n);
                                    cr_assert(memcmp(alone, got + r * n, n * sizeof *alone) == 0,
                                              "%s k=%d n=%d rows=%d: %s row %d alone differs",
                                              names[t], k, n, rows, q_isa_name(isa), r);
                                }
                                for (int i = 0; i < rows * n && own; i++)
                                    cr_assert_leq(fabs(got[i] - ref8[i]), mag8[i],
                                                  "%s k=%d %s n=%d rows=%d beta=%d: y[%d][%d] "
                                                  "%s %.9g, with Q8_K activations %.9g",
                                                  names[t], k, data ? "random" : "quantized", n,
                                                  rows, beta, i / n, i % n, q_isa_name(isa),
                                                  (double)got[i], ref8[i]);
                                for (int i = 0; i < rows * n && !own; i++)
                                    cr_assert(memcmp(&got[i], &want[i], sizeof *got) == 0,
                                              "%s k=%d %s n=%d rows=%d beta=%d: y[%d][%d] %s "
                                              "%.9g, portable %.9g",
                                              names[t], k, data ? "random" : "quantized", n, rows,
                                              beta, i / n, i % n, q_isa_name(isa), (double)got[i],
                                              (double)want[i]);
                            }
                            checked++;
                        }
            }
    q_isa_cap(was);
    cr_log_info("Q8_K dots: %d cases (best path %s)", checked, q_isa_name(best));
    free(x);
    free(xk);
    free(dq);
    free(wf);
    free(got);
    free(want);
    free(ref8);
    free(mag8);
    free(alone);
    free(q);
    free(xq);
}

/* Q2_K, Q3_K and IQ4_XS with AVX-512 VNNI (kernels/cpu/quant_k23.c): up to 4 rows dot the
 * weights as they lie, from 5 rows they take tiles of 16 weight rows, 8 activation rows at a
 * time; at every row count from 1 to Q_INT_MAX_ROWS (each tail of 8 rows, and of 16 weight
 * rows: 37 of them), from random blocks, each row alone gets the bits it gets in the batch.
 * (Above Q_INT_MAX_ROWS rows these types leave the integer path: prefill's arithmetic.) */
Test(kernels_q8k, k23_rows_alone_equal_in_a_batch_at_every_row_count)
{
    static const int types[] = {Q_Q2_K, Q_Q3_K, Q_IQ4_XS};
    enum { N = 37, K = 768, R = Q_INT_MAX_ROWS };
    unsigned char *q = malloc(q_row_bytes(Q_F32, K) * N);
    float *x = malloc((size_t)R * K * sizeof *x), *got = malloc((size_t)R * N * sizeof *got);
    float alone[N];
    if (q_isa() < Q_ISA_AVX512) cr_log_info("no AVX-512 VNNI here: the AVX2 or portable path");
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const int type = types[t];
        random_blocks(type, q, N, K);
        for (size_t i = 0; i < (size_t)R * K; i++) x[i] = rnd_float() * (float)(1 + i % 7);
        for (int rows = 1; rows <= R; rows++) {
            const float beta = (float)(rows % 2);
            for (int i = 0; i < rows * N; i++) got[i] = 0.5f * (float)(i % 5);
            q_matmul(type, q, N, K, x, rows, beta, got, N);
            for (int r = 0; r < rows; r++) {
                for (int i = 0; i < N; i++) alone[i] = 0.5f * (float)((r * N + i) % 5);
                q_matmul(type, q, N, K, x + (size_t)r * K, 1, beta, alone, N);
                for (int i = 0; i < N; i++)
                    cr_assert(memcmp(&alone[i], &got[r * N + i], sizeof alone[i]) == 0,
                              "type %d rows=%d: y[%d][%d] alone %.9g, in the batch %.9g (%s)", type,
                              rows, r, i, (double)alone[i], (double)got[r * N + i],
                              q_isa_name(q_isa()));
            }
        }
    }
    free(q);
    free(x);
    free(got);
}

/* Q4_K and Q6_K packed once (q_pack, kernels/cpu/quant_kpack.c): every weight-row count
 * (a tile's last rows missing), one and three superblocks, 1 to 4 activation rows, beta 0 and
 * 1, quantized weights and random blocks (every bit pattern: 6-bit scales and minimums at
 * 63, Q6_K's scales at -128), the product read in chunks of 16, 32 or all rows: the bits of
 * q_matmul_xq on the weights as they lie, nothing written past the n columns; and where it
 * does not run (5 rows, a chunk not starting on 16 rows, rows prepared for another k) it says
 * so and writes nothing. */
Test(kernels_q8k, packed_q4_k_q6_k_give_the_bits_of_the_weights_as_they_lie)
{
    static const int types[] = {Q_Q4_K, Q_Q6_K};
    static const int ks[] = {256, 768};
    static const int ns[] = {1, 15, 16, 17, 45};
    static const int chunks[] = {16, 32, 1 << 20};
    enum { N = 45, KMAX = 768, R = 5, LD = N + 3 };
    if (!q_packed_bytes(Q_Q4_K, 16, 256)) {
        cr_assert(!q_pack(Q_Q4_K, NULL, 16, 256, NULL));
        cr_skip_test("no AVX-512 VNNI here (%s): no packed layout", q_isa_name(q_isa()));
    }
    cr_assert_eq(q_packed_bytes(Q_Q8_0, 16, 256), 0, "Q8_0 has no packed layout");
    cr_assert_eq(q_packed_bytes(Q_Q4_K, 16, 100), 0, "k must be a multiple of 256");
    cr_assert_eq(q_packed_bytes(Q_Q4_K, 17, 768), 2 * 3 * 2368);
    cr_assert_eq(q_packed_bytes(Q_Q6_K, 16, 256), 3392);
    float *x = malloc((size_t)R * KMAX * sizeof *x), *wf = malloc((size_t)N * KMAX * sizeof *wf);
    float *want = malloc((size_t)R * LD * sizeof *want),
          *got = malloc((size_t)R * LD * sizeof *got);
    unsigned char *q = malloc(q_row_bytes(Q_F32, KMAX) * N);
    const size_t pb = q_packed_bytes(Q_Q6_K, N, KMAX);
    void *packed = aligned_alloc(64, pb);
    const size_t xb = q_xq_bytes(R, KMAX);
    void *xmem = malloc(xb), *xmem5 = malloc(xb);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            for (int source = 0; source < 2; source++) {
                const int type = types[t], k = ks[ki];
                if (source == 0) {
                    for (size_t i = 0; i < (size_t)N * k; i++) wf[i] = rnd_float();
                    quantized_rows(type, wf, q, N, k);
                } else {
                    random_blocks(type, q, N, k);
                }
                for (size_t i = 0; i < (size_t)R * k; i++)
                    x[i] = rnd_float() * (float)(1 << (i / 32 % 9)) * 0.1f;
                for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                    const int n = ns[ni];
                    cr_assert(q_pack(type, q, n, k, packed));
                    for (int rows = 1; rows <= 4; rows++) {
                        const q_xq *a = q_xq_prepare(xmem, xb, x, rows, k);
                        cr_assert_not_null(a);
                        for (int beta = 0; beta <= 1; beta++) {
                            for (int i = 0; i < R * LD; i++)
                                want[i] = got[i] = 0.25f * (float)(i % 7);
                            q_matmul_xq(type, q, n, k, a, x, rows, (float)beta, want, LD);
                            for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
                                for (int i = 0; i < R * LD; i++) got[i] = 0.25f * (float)(i % 7);
                                for (int n0 = 0; n0 < n; n0 += chunks[c]) {
                                    const int m = n - n0 < chunks[c] ? n - n0 : chunks[c];
                                    cr_assert(q_matmul_packed(type, packed, n0, m, k, a, rows,
                                                              (float)beta, got + n0, LD),
                                              "type %d n=%d rows=%d: the packed product runs", type,
                                              n, rows);
                                }
                                for (int i = 0; i < R * LD; i++)
                                    cr_assert(memcmp(&want[i], &got[i], sizeof got[i]) == 0,
                                              "type %d k=%d n=%d rows=%d beta=%d chunk=%d "
                                              "source=%d: y[%d][%d] packed %.9g, as they lie %.9g",
                                              type, k, n, rows, beta, chunks[c], source, i / LD,
                                              i % LD, (double)got[i], (double)want[i]);
                            }
                        }
                    }
                }
                /* where it does not run: nothing written */
                const q_xq *a5 = q_xq_prepare(xmem5, xb, x, 5, k);
                const q_xq *a1 = q_xq_prepare(xmem, xb, x, 1, k);
                for (int i = 0; i < R * LD; i++) got[i] = 1.0f;
                cr_assert(!q_matmul_packed(type, packed, 0, 16, k, a5, 5, 0.0f, got, LD));
                cr_assert(!q_matmul_packed(type, packed, 8, 8, k, a1, 1, 0.0f, got, LD));
                cr_assert(!q_matmul_packed(type, packed, 0, 16, k == 256 ? 768 : 256, a1, 1, 0.0f,
                                           got, LD));
                for (int i = 0; i < R * LD; i++) cr_assert_eq(got[i], 1.0f, "y[%d] written", i);
            }
    free(x);
    free(wf);
    free(want);
    free(got);
    free(q);
    free(packed);
    free(xmem);
    free(xmem5);
}
