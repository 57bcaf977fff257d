/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/gemm_bf16.h — prefill with BF16 weights in AVX-512 BF16 tiles:
 *
 *   y[m][n] = beta * y[m][n] + Σ_k bf16(x[m][k]) · w[n][k]      m < M, n < N, beta 0 or 1
 *
 * The weights are bf16 as they lie in the model file; the activations are rounded to bf16
 * (to nearest, ties to even: q_f32_to_bf16's rounding, as vcvtne2ps2bf16 does it), and
 * vdpbf16ps sums the products of pairs of k in float32. A block of k is packed into panels of
 * 32 weight rows, one 32-bit pair of k per row, so one vdpbf16ps dots 16 weight rows with a
 * broadcast pair of one activation row: 32 products; an 8 x 32 tile keeps 16 accumulators.
 *
 * Not the exact float32 product: the activations' rounding costs up to 2^-8 of each product,
 * so |y - exact| <= (2^-8 + (K + 2) · 2^-24) · Σ_k |x w| (plus the flush of subnormal inputs
 * and results to zero, as vdpbf16ps does). A row's results do not depend on the rows or
 * columns beside it (each output sums its pairs of k in order), so a row in any batch that
 * takes this path gets the same bits.
 *
 * The backend takes it for BF16 weights above gemm_small's rows where the CPU has AVX-512
 * BF16 and RINGLM_PREFILL_GEMM is unset (auto); =own (gemm_f32's float panels) and =blas
 * (SGEMM) keep the exact float32 arithmetic, for the reference tests.
 *
 * F32 and F16 weights take it for a batch's prompt rows (eng_batch.prompt_len), at any count,
 * unless eng_options.prompt_exact or RINGLM_PREFILL_GEMM=own / =blas; generated rows stay on
 * the exact float32 paths (=bf16 sends them here too above gemm_small's rows: opt-in). Their
 * weights are rounded to bf16 too as they are packed, so |y - exact| <= (2^-7 + 2^-16 +
 * (K + 2) · 2^-24) · Σ_k |x w|.
 */
#ifndef RINGLM_KERNELS_CPU_GEMM_BF16_H
#define RINGLM_KERNELS_CPU_GEMM_BF16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether this machine runs it (x86-64 with AVX-512 F, BW, VL and BF16). */
bool gemm_bf16_supported(void);

/* Whether the backend runs a product of weights of wtype (quant.h's numbers) here whatever
 * its rows are: supported, and BF16 weights with the prefill mode auto, or F32, F16 and BF16
 * weights with RINGLM_PREFILL_GEMM=bf16 (gemm_f32.h). Prompt rows of F32 and F16 weights are
 * the CPU backend's choice (cpu.c, mm_rows). */
bool gemm_bf16_prefer(int wtype);

/*
 * y = beta * y + bf16(x) · bf16(w)^T. x: M rows of K floats, ld_x floats apart; w: N rows of
 * K elements of wtype (F32, F16 or BF16: quant.h's Q_F32, Q_F16, Q_BF16), w_row_bytes apart;
 * y: M rows of N floats, ld_y apart; beta 0 or 1. Single-threaded (callers split N). Returns
 * false, having written nothing, where it cannot run (not supported here, another type, no
 * memory for its panels).
 */
bool gemm_bf16(int wtype, int M, int N, int K, const float *x, int ld_x, const void *w,
               size_t w_row_bytes, float beta, float *y, int ld_y);

/*
 * The same product with the activations rounded before, once for every caller that splits N:
 * gemm_bf16_round writes M rows of K activations as bf16 (the rounding above, zeros past K),
 * rows gemm_bf16_round_ld(K) elements apart (2 bytes each; 64-byte alignment of xr is not
 * needed); gemm_bf16_rounded multiplies them and gives the bits gemm_bf16 gives for the rows
 * they were rounded from. Rows may be rounded in parts (by several threads: rows m0.. at
 * xr + m0 * gemm_bf16_round_ld(K)). gemm_bf16_round does nothing and gemm_bf16_rounded returns
 * false, having written nothing, where gemm_bf16 would.
 */
int gemm_bf16_round_ld(int K);
void gemm_bf16_round(int M, int K, const float *x, int ld_x, uint16_t *xr);
/* Columns k0 .. k1 of the same rows (x and xr at element 0 of row 0; 0 <= k0 < k1 <= K, else
 * nothing), and where k1 = K the zeros past K: a row rounded in parts of columns, each by the
 * task that made it while it is in that core's cache, is the row gemm_bf16_round writes. */
void gemm_bf16_round_cols(int M, int K, int k0, int k1, const float *x, int ld_x, uint16_t *xr);
bool gemm_bf16_rounded(int wtype, int M, int N, int K, const uint16_t *xr, const void *w,
                       size_t w_row_bytes, float beta, float *y, int ld_y);


/*
 * Weights packed once (at load) into the panels the product packs per block otherwise, so
 * that a product only reads them: gemm_bf16_pack writes N rows of K elements of wtype
 * (w_row_bytes apart) into gemm_bf16_packed_bytes(N, K) bytes at out (64-byte aligned):
 * panels of 32 rows (the last one padded with zero rows), each over all of K as pairs of
 * bf16; false, having written nothing, where gemm_bf16 cannot run. gemm_bf16_packed
 * multiplies rows n0 .. n0 + N of such a matrix (n0 a multiple of 32) by M rows rounded
 * with gemm_bf16_round, and gives the bits gemm_bf16_rounded gives with the weights as
 * they lie: the same pairs, summed in the same order.
 */
size_t gemm_bf16_packed_bytes(int N, int K);
bool gemm_bf16_pack(int wtype, int N, int K, const void *w, size_t w_row_bytes, void *out);
bool gemm_bf16_packed(int M, int N, int K, const uint16_t *xr, const void *wp, int n0, float beta,
                      float *y, int ld_y);

#endif
