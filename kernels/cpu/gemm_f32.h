/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/gemm_f32.h — the CPU backend's own matmul for prefill (many activation rows):
 *
 *   y[m][n] = beta * y[m][n] + Σ_k x[m][k] · w[n][k]      m < M, n < N, beta 0 or 1
 *
 * with the weights w in F32, F16 or BF16 (as they lie in the model file), or in a quantized
 * type of kernels/cpu/quant.h (dequantized to float32 as they are packed, a block of k at a
 * time), in float32 arithmetic with AVX2 + FMA (+ F16C). The weights are converted to float32 and packed into
 * k-major panels of 16 weight rows once per block of 256 k (the F16/BF16 conversion happens
 * there, once per block, not per activation row), and a 6 x 16 register tile (12 of AVX2's
 * 16 vectors) multiplies them with 6 activation rows at a time, each weight panel kept in
 * L1 while the rows of a block of 72 pass over it. It replaces OpenBLAS SGEMM for prefill
 * where it is faster (gemm_f32_prefer): always for F16/BF16 weights, which SGEMM could only
 * take as float tiles converted beforehand and packed again by SGEMM on every tile; for F32
 * on AVX2 machines and on Zen 4 (whose 512-bit FMAs run at the rate of two 256-bit ones), not
 * where a core has two full 512-bit FMA pipes and SGEMM's AVX-512 kernels twice the peak.
 *
 * Not bit-identical to SGEMM (another summation order: k in blocks of 256, each block in
 * order with fused multiply-adds), within K · 2^-24 relative, as SGEMM itself is from the
 * exact product. RINGLM_PREFILL_GEMM=blas makes the backend take SGEMM for every prefill
 * product (the exact-F32 reference path the engine had before), =own this one wherever it
 * runs; the default (auto) takes gemm_f32_prefer's choice, and for BF16 weights gemm_bf16.h's
 * tiles where the CPU has AVX-512 BF16 (activations rounded to bf16: =own and =blas keep the
 * float32 arithmetic) and for the prompt rows of F32 and F16 weights (eng_batch.prompt_len:
 * their weights rounded to bf16 as well; generated rows stay here or on SGEMM), and =bf16 F32
 * and F16 weights through those tiles for every row (opt-in, never for the reference tests).
 */
#ifndef RINGLM_KERNELS_CPU_GEMM_F32_H
#define RINGLM_KERNELS_CPU_GEMM_F32_H

#include <stdbool.h>
#include <stddef.h>

/* Whether this machine runs it (x86-64 with AVX2, FMA and F16C). */
bool gemm_f32_supported(void);

/* Which path the backend takes for prefill products, from RINGLM_PREFILL_GEMM (read once). */
typedef enum gemm_f32_mode {
    GEMM_F32_AUTO,
    GEMM_F32_BLAS,
    GEMM_F32_OWN,
    GEMM_F32_BF16 /* =bf16: F32, F16 and BF16 weights through gemm_bf16.h's tiles */
} gemm_f32_mode;
gemm_f32_mode gemm_f32_mode_get(void);

/* Whether the backend runs a product of M activation rows with N weight rows of K elements in
 * type wtype (0 F32, 1 F16, 30 BF16, the quantized types: quant.h's numbers, ggml's) here
 * rather than through SGEMM: the mode, then what perf/gemm_bench --prefill measured on this
 * kind of machine. */
bool gemm_f32_prefer(int wtype, int M, int N, int K);

/*
 * y = beta * y + x · w^T. x: M rows of K floats, ld_x floats apart; w: N rows of K elements
 * of type wtype, w_row_bytes apart; y: M rows of N floats, ld_y apart. beta 0 (y only
 * written) or 1. Single-threaded (callers split N). Returns false, having written nothing,
 * where it cannot run (not supported here, a type it does not take, K not a whole number of
 * the type's blocks, no memory for its panels).
 */
bool gemm_f32(int wtype, int M, int N, int K, const float *x, int ld_x, const void *w,
              size_t w_row_bytes, float beta, float *y, int ld_y);

#endif
