/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_prefill.h — Q4_K, Q6_K, Q4_0 and Q4_1 weights times many activation rows
 * (prefill) in integers on AVX2, where quant.h's integer path stops (above Q_INT_MAX_ROWS rows
 * without AVX-512 VNNI).
 *
 * The activation rows are quantized once to 8 bits per 32 elements (q_xq, as the integer path
 * of quant.h: the same rounding, so the same error bound against the exact product), the
 * weights of a panel of 8 rows are unpacked once to bytes, transposed so that one vector holds
 * 4 consecutive bytes of each of the 8 rows, and reused for every activation row: per 4 bytes
 * of k, one maddubs per activation row, its 16-bit sums added in registers over a block of 32
 * (Q4_K's and Q4_1's 4-bit weights; Q4_0's q - 8 against the activations + 128) or of 8
 * (Q6_K's 6-bit ones against the activations + 128, then one madd with the 16-element scale):
 * none can overflow them; then one conversion and the block's scales in float.
 *
 * Why only these: on AVX2 cores that split 256-bit ops (Zen 1) a signed 8 x 8-bit dot
 * (maddubs, then madd to 32 bits after every maddubs: two products already fill 16 bits)
 * gives no more products per cycle than FMA (perf/machine_probe --mul: 7.7-7.9 against
 * 7.9-8.1), so Q8_0 stays on gemm_f32's float panels; 4-bit weights let one madd serve eight
 * maddubs.
 *
 * With AVX-512 VNNI, q_prefill_runs and q_prefill_matmul take Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
 * Q5_K and IQ4_XS instead, into the tiles of quant.h's q_matmul_tiles (Q4_K and Q6_K take the
 * integer path there at every row count).
 *
 * Within 1e-5 x sum_j |w_j x_j| of the portable integer path (another order of the float
 * steps), and a row's results do not depend on the rows beside it. RINGLM_PREFILL_GEMM=own or
 * =blas (gemm_f32.h) turn these tiles off: the float panels of gemm_f32, or SGEMM.
 */
#ifndef RINGLM_KERNELS_CPU_QUANT_PREFILL_H
#define RINGLM_KERNELS_CPU_QUANT_PREFILL_H

#include "kernels/cpu/quant.h"

#include <stdbool.h>

/* Whether q_prefill_matmul runs `rows` activation rows of weights of `type` on this CPU
 * (Q4_K, Q6_K, Q4_0 and Q4_1 on AVX2 without AVX-512 VNNI; with it, the seven types of
 * q_matmul_tiles; above Q_INT_MAX_ROWS rows, unless the mode says not). */
bool q_prefill_runs(int type, int rows);

/*
 * y[r][i] = beta * y[r][i] + sum_j x[r][j] * w_i[j] for r < a's rows, i < n: w is n rows of k
 * elements of `type`, a the activation rows quantized by q_xq_prepare (k elements each), y rows
 * ld_y floats apart, beta 0 or 1. Single-threaded (callers split n). Returns false, having
 * written nothing, where it does not run (another type or instruction set, a prepared for
 * another k or instruction set, no memory for its panel). k: a multiple of 256 for Q4_K and
 * Q6_K, of 32 for Q4_0 and Q4_1.
 */
bool q_prefill_matmul(int type, const void *w, int n, int k, const q_xq *a, float beta, float *y,
                      int ld_y);

#endif
