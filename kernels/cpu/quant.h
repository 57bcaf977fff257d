/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant.h — weights in their file type (GGUF): F32, F16, BF16, Q8_0, Q4_K, Q6_K.
 *
 * A weight matrix is n rows of k elements, row-major ([out][in], as llama2.c and GGUF),
 * each row q_row_bytes(type, k) bytes; quantized blocks run along a row. Block layouts are
 * ggml's (what GGUF files hold):
 *   Q8_0  32 elements, 34 bytes: f16 d, int8 q[32];                        x = d*q
 *   Q4_K 256 elements, 144 bytes: f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min)
 *         pairs, 128 bytes of 4-bit q; each 32-element sub-block j: x = d*sc_j*q - dmin*m_j
 *   Q6_K 256 elements, 210 bytes: 128 bytes low 4 bits, 64 bytes high 2 bits, int8 scales[16],
 *         f16 d; each 16-element sub-block j: x = d*scales[j]*(q - 32), q in 0..63
 *
 * Decode (few rows): fused dequantize-and-dot, the weight read once, in its own type; AVX2 +
 * FMA (+F16C) when the CPU has them, chosen once at run time, else portable C. The two
 * paths sum in a different order: they agree within 1e-5 x sum_j |w_j x_j| per dot
 * (tests/test_gguf_quant.c holds them to it).
 * Prefill (many rows): a tile of weight rows is dequantized to float32 and multiplied with
 * OpenBLAS SGEMM, so batching keeps its advantage.
 */
#ifndef RINGLM_KERNELS_CPU_QUANT_H
#define RINGLM_KERNELS_CPU_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The supported types (ggml numbering, as eng_wtype in engine.h). */
enum { Q_F32 = 0, Q_F16 = 1, Q_Q8_0 = 8, Q_Q4_K = 12, Q_Q6_K = 14, Q_BF16 = 30 };

bool q_type_supported(int type);
/* Elements per block (1, 32 or 256). */
int q_block_elems(int type);
/* Bytes of a row of k elements (k a multiple of the block). */
size_t q_row_bytes(int type, int64_t k);

float q_f16_to_f32(uint16_t h);
uint16_t q_f32_to_f16(float f);   /* round to nearest even */
float q_bf16_to_f32(uint16_t h);
uint16_t q_f32_to_bf16(float f);  /* round to nearest even */

/* Dequantizes one row of k elements. */
void q_dequant_row(int type, const void *row, float *out, int64_t k);
/* One row · x (k elements), fused: the row is never stored as float32. */
float q_dot(int type, const void *row, const float *x, int64_t k);

/*
 * y[r][i] = beta * y[r][i] + sum_j x[r][j] * w_i[j] for r < rows, i < n, where w_i is row i
 * of a weight matrix of type `type` starting at w (k elements per row). x rows are k floats
 * apart, y rows ld_y. Single-threaded (the backend splits n across its workers).
 */
void q_matmul(int type, const void *w, int n, int k, const float *x, int rows, float beta,
              float *y, int ld_y);

/* Forces the portable C path (tests compare the two); returns the previous setting. */
bool q_force_portable(bool on);
/* Whether the AVX2/FMA path is in use. */
bool q_simd_active(void);

/* Quantizes one row of k floats (ringlm-mkmodel). Returns the bytes written. */
size_t q_quantize_row(int type, const float *x, void *out, int64_t k);

#endif
