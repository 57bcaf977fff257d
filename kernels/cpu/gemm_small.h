/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/gemm_small.h — the CPU backend's matmul for small batches:
 *
 *   y[m][n] = beta * y[m][n] + Σ_k x[m][k] · w[n][k]      m < M, n < N, beta 0 or 1
 *
 * (x · w^T with w row-major, as every projection of the model). Each weight row is read
 * from memory once per pass over the batch, and nothing is packed: for a few rows this
 * is bound by reading the weights, where OpenBLAS's SGEMM first copies (packs) the whole
 * weight and then reads it again. A pass takes as many batch rows as fit in 256 KiB (all
 * of a decode batch at the model's row lengths: 84 rows of 768 floats, 32 of 2,048), so
 * the rows stay in cache while the weights stream past them.
 *
 * Every output element is the same computation whatever M, N, the split into chunks or
 * the blocking around it: 8 partial sums in lanes (lane j takes k ≡ j mod 8, the last
 * step zero-padded), a fused multiply-add chain over k in the AVX2 path (multiply then add
 * in the portable one), reduced as ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)); the AVX-512 path
 * keeps 16 lanes and adds lanes j and j+8 before that reduction. So a row's result does
 * not depend on how many other rows are in the batch, which keeps a sequence alone and
 * the same sequence in a batch bit-identical. The paths differ only by rounding (fused
 * multiply-add, lane count): relative differences of order K · 2^-24.
 */
#ifndef RINGLM_KERNELS_CPU_GEMM_SMALL_H
#define RINGLM_KERNELS_CPU_GEMM_SMALL_H

#include <stdbool.h>

/* Which implementation runs. AUTO: the widest this CPU has (checked once, at run time):
 * AVX-512, else AVX2 with FMA, else the portable one. */
typedef enum gemm_small_path {
    GEMM_SMALL_AUTO,
    GEMM_SMALL_PORTABLE, /* GNU C vectors: any target GCC builds for */
    GEMM_SMALL_AVX2,     /* x86-64 AVX2 + FMA intrinsics, compiled with target attributes */
    GEMM_SMALL_AVX512,   /* x86-64 AVX-512F (16 lanes, 4 × 4 tiles), the same way */
} gemm_small_path;

/* Whether `path` can run on this machine (AUTO and PORTABLE always can). */
bool gemm_small_supported(gemm_small_path path);

/* The path AUTO resolves to on this machine. */
gemm_small_path gemm_small_auto_path(void);

/* The batch size up to which `path` (AUTO: this machine's) beats OpenBLAS SGEMM on model
 * projections, so callers switch to SGEMM above it. Measured with perf/gemm_bench
 * (stories110M/15M projections, one thread, weights from memory; README, Benchmarks):
 * AVX2 breaks even at ~12 rows; AVX-512 (twice the arithmetic per instruction, against
 * an OpenBLAS that runs its AVX2 kernels on AMD) was 1.0-1.6x SGEMM at 32-128 rows and
 * lost only on the 2,048-float rows at 256: 128; the portable path takes AVX2's figure.
 * Cheap enough to call per matmul: AUTO's path is resolved once (gemm_small_auto_path). */
int gemm_small_max_rows(gemm_small_path path);

/*
 * y = beta * y + x · w^T as above. x: M rows of K floats, ld_x apart; w: N rows of K
 * floats, ld_w apart; y: M rows of N floats, ld_y apart. beta must be 0 (y is only written)
 * or 1 (y += x · w^T); M, N >= 0, K >= 1. A path this machine does not support
 * (gemm_small_supported false) runs the portable one. Single-threaded; callers split N.
 */
void gemm_small(gemm_small_path path, int M, int N, int K, const float *x, int ld_x, const float *w,
                int ld_w, float beta, float *y, int ld_y);

#endif
