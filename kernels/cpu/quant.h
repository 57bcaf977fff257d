/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant.h — weights in their file type (GGUF): F32, F16, BF16, Q8_0, Q4_K, Q6_K,
 * Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS.
 *
 * A weight matrix is n rows of k elements, row-major ([out][in], as llama2.c and GGUF),
 * each row q_row_bytes(type, k) bytes; quantized blocks run along a row. Block layouts are
 * ggml's (what GGUF files hold):
 *   Q8_0  32 elements, 34 bytes: f16 d, int8 q[32];                        x = d*q
 *   Q4_K 256 elements, 144 bytes: f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min)
 *         pairs, 128 bytes of 4-bit q; each 32-element sub-block j: x = d*sc_j*q - dmin*m_j
 *   Q6_K 256 elements, 210 bytes: 128 bytes low 4 bits, 64 bytes high 2 bits, int8 scales[16],
 *         f16 d; each 16-element sub-block j: x = d*scales[j]*(q - 32), q in 0..63
 *   Q4_0   32 elements, 18 bytes: f16 d, 16 bytes of 4-bit q (element j low nibble of byte j,
 *         element j+16 its high nibble); x = d*(q - 8)
 *   Q4_1   32 elements, 20 bytes: f16 d, f16 m, the nibbles as Q4_0; x = d*q + m
 *   Q5_0   32 elements, 22 bytes: f16 d, 32 fifth bits (bit j of element j), the nibbles;
 *         x = d*(q - 16)
 *   Q5_1   32 elements, 24 bytes: f16 d, f16 m, the fifth bits, the nibbles; x = d*q + m
 *   IQ4_NL 32 elements, 18 bytes: f16 d, the nibbles as Q4_0 index a table of 16 values
 *         (-127 .. 113, denser near 0); x = d*table[q]
 *   Q2_K 256 elements, 84 bytes: 16 bytes of (4-bit scale, 4-bit min) per 16 elements, 64
 *         bytes of 2-bit q, f16 d, f16 dmin; x = d*sc*q - dmin*m
 *   Q3_K 256 elements, 110 bytes: 32 bytes of high bits, 64 bytes of low 2 bits, 12 bytes of
 *         sixteen 6-bit scales, f16 d; x = d*(sc - 32)*(q - 4), q in 0..7
 *   Q5_K 256 elements, 176 bytes: Q4_K's d, dmin and scales, 32 bytes of fifth bits, 128 bytes
 *         of 4-bit q; x = d*sc_j*q - dmin*m_j, q in 0..31
 *   IQ4_XS 256 elements, 136 bytes: f16 d, 8 6-bit scales (16 bits of high pairs, 4 bytes of
 *         low nibbles), 128 bytes of nibbles indexing IQ4_NL's table; x = d*(ls - 32)*table[q]
 *   These nine unpack to signed bytes with a scale and an offset per 16 elements
 *   (kernels/cpu/quant_unpack.c) and take the integer path below like Q8_0 (AVX2 or portable;
 *   with AVX-512 VNNI the 32-element ones in its tiles, the K types with Q8_K activations in
 *   its own kernels); tiles and SGEMM above Q_INT_MAX_ROWS rows.
 *
 * Decode (few rows): fused dequantize-and-dot, the weight read once, in its own type; AVX2 +
 * FMA (+F16C) when the CPU has them, chosen once at run time, else portable C (the only path
 * off x86, where the intrinsics are not compiled: make check-portable builds it for arm64). The two
 * paths sum in a different order: they agree within 1e-5 x sum_j |w_j x_j| per dot
 * (tests/test_gguf_quant.c holds them to it).
 * Q8_0, Q4_K, Q6_K and the unpacked types' weights in q_matmul, up to Q_INT_MAX_ROWS rows (decode of a whole
 * batch), and any number of rows where the CPU has AVX-512 VNNI (q_int_path), are dotted in integers with the activations quantized to 8 bits per 32 elements, as
 * llama.cpp does for Q8_0 (scale max|x|/127 kept as f16; llama.cpp's K-quant activations have
 * one scale per 256; Q4_K's minimums meet the quantized block sums): AVX2 maddubs, or AVX-512 VNNI dpbusd where the CPU has it, or
 * portable C. That product is within sum_j |w_j| * max|x over j's block| * (1/254 + 1/2048)
 * of the exact one, and the three paths agree within 1e-5 x sum_j |w_j x_j|. The K types
 * (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) on AVX2 and portable, up to Q_INT_MAX_ROWS rows, take
 * llama.cpp's K-quant activations instead (Q8_K, kernels/cpu/quant_q8k.c: one float scale per
 * 256, the sub-block scales multiplied in integers, one float step per 256 weights), within
 * sum_j |w_j| * max|x over j's 256| * (1/254 + 1/2048) of the exact product (q_int_act_elems),
 * the two paths to the bit; with AVX-512 VNNI Q4_K and Q6_K take Q8_K at every row count, and
 * Q5_K, Q2_K, Q3_K and IQ4_XS up to Q_INT_MAX_ROWS, in its own arithmetic (each 256 weights'
 * exact integer sum with their sub-block scales, then one float step:
 * kernels/cpu/quant_kquants.c, kernels/cpu/quant_k23.c), within the same bound.
 * On each path a row's products do not depend on the rows beside it (DESIGN §8: a sequence
 * decoding alone and in a batch gets the same logits to the bit): each activation row is
 * quantized by itself, and with AVX-512 VNNI one row (weights dotted as they lie) and a batch
 * (repacked tiles) form the same exact integer sums per block of 32 (Q4_K and Q6_K: per 256)
 * and add them with the same float steps; the AVX2 and portable paths run one kernel for 1
 * to Q_INT_MAX_ROWS rows. tests/test_gguf_quant.c and tests/test_engine_inv.c hold it.
 * Prefill (many rows) otherwise: a tile of weight rows is dequantized to float32 and
 * multiplied with OpenBLAS SGEMM, so batching keeps its advantage. F16 and BF16 weights go
 * through such tiles at every row count (F16C or a shift converts them once per step; a batch
 * up to gemm_small_max_rows multiplies them with gemm_small), or through gemm_small's own tile
 * arithmetic with the conversion in registers: up to Q_FUSED_MAX_ROWS rows on AVX2, up to
 * gemm_small_max_rows on AVX-512. The same bits, so alone and in a batch are bit-identical.
 */
#ifndef RINGLM_KERNELS_CPU_QUANT_H
#define RINGLM_KERNELS_CPU_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The supported types (ggml numbering, as eng_wtype in engine.h). */
enum {
    Q_F32 = 0,
    Q_F16 = 1,
    Q_Q4_0 = 2,
    Q_Q4_1 = 3,
    Q_Q5_0 = 6,
    Q_Q5_1 = 7,
    Q_Q8_0 = 8,
    Q_Q2_K = 10,
    Q_Q3_K = 11,
    Q_Q4_K = 12,
    Q_Q5_K = 13,
    Q_Q6_K = 14,
    Q_IQ4_NL = 20,
    Q_IQ4_XS = 23,
    Q_BF16 = 30
};

bool q_type_supported(int type);
/* Elements per block (1, 32 or 256). */
int q_block_elems(int type);
/* Bytes of a row of k elements (k a multiple of the block). */
size_t q_row_bytes(int type, int64_t k);

float q_f16_to_f32(uint16_t h);
uint16_t q_f32_to_f16(float f); /* round to nearest even */
float q_bf16_to_f32(uint16_t h);
uint16_t q_f32_to_bf16(float f); /* round to nearest even */

/* Dequantizes one row of k elements. */
void q_dequant_row(int type, const void *row, float *out, int64_t k);
/* One row · x (k elements), fused: the row is never stored as float32. */
float q_dot(int type, const void *row, const float *x, int64_t k);

/* Up to this many activation rows q_matmul runs the fused path for quantized weights that do
 * not take the integer path (each weight row read once for all rows); above it, dequantized
 * tiles and SGEMM. F16 and BF16 weights do not take the fused dots: up to this many rows they
 * are converted in registers and multiplied with gemm_small's AVX2 tiles (where gemm_small runs
 * those; with AVX-512 its AVX-512 tiles at every batch gemm_small takes), above it (and
 * elsewhere) converted to float tiles for gemm_small or SGEMM; both give the same bits, so a
 * row gets the same sums alone as in a small batch. */
#define Q_FUSED_MAX_ROWS 4
/* Whether q_matmul multiplies BF16 weights at this many activation rows with the activations
 * rounded to bf16 (vdpbf16ps, llama.cpp's arithmetic; gemm_bf16.h's bound of the exact
 * product): on AVX-512 BF16 machines, up to gemm_small_max_rows rows, where the backend
 * rounds BF16 prefill's activations too (gemm_bf16_prefer: RINGLM_PREFILL_GEMM unset). Every
 * row count it takes sums a row in one order: alone and in a batch are bit-identical. */
bool q_bf16_dot_path(int rows);
/* Q8_0, Q4_K, Q6_K: up to this many rows, 8-bit activations and integer dots (each weight
 * row read once per group of 8 rows, from cache after the first); above it, tiles and SGEMM.
 * On this VM's EPYC (1 thread, Q8_0) it beat the SGEMM path at 5 to 32 rows by 1.2-4x.
 * With AVX-512 VNNI, from 2 rows, tiles of 16 weight rows are repacked so that one vpdpbusd
 * dots 4 bytes of one activation row with 16 weight rows, up to 8 activation rows held in
 * registers: 4-5x the kernels of 8 rows at 32 rows (Q8_0 190 against 41 GMAC/s) and 5x SGEMM
 * on dequantized tiles, so there every row count runs in integers (prefill too). */
#define Q_INT_MAX_ROWS 32
/* Whether q_matmul runs `rows` rows of weights of `type` in integers (the bound above). */
bool q_int_path(int type, int rows);
/* The elements per activation scale of that integer path on the instruction set in use: 256
 * for the K types up to Q_INT_MAX_ROWS rows (Q8_K, as llama.cpp: x_j rounded to within
 * max|x over its 256| / 254, one float step per 256 weights), and for Q4_K and Q6_K at every
 * row count with AVX-512 VNNI; else 32. */
int q_int_act_elems(int type, int rows);

/*
 * y[r][i] = beta * y[r][i] + sum_j x[r][j] * w_i[j] for r < rows, i < n, where w_i is row i
 * of a weight matrix of type `type` starting at w (k elements per row). x rows are k floats
 * apart, y rows ld_y. Single-threaded (the backend splits n across its workers).
 */
void q_matmul(int type, const void *w, int n, int k, const float *x, int rows, float beta, float *y,
              int ld_y);

/* Activation rows quantized once for the integer path (Q8_0, Q4_K, Q6_K weights: one 8-bit
 * format for all three), so that the chunks of weight rows a backend splits a matmul into,
 * and the matmuls that read the same rows, do not each quantize them again. q_xq_bytes: the
 * memory it takes; q_xq_prepare quantizes x (rows x k) into mem (NULL when bytes are too few
 * or k is not a multiple of 32); it holds no pointer to x. */
typedef struct q_xq q_xq;
size_t q_xq_bytes(int rows, int k);
const q_xq *q_xq_prepare(void *mem, size_t bytes, const float *x, int rows, int k);
/* q_xq_prepare in two steps, so that workers can quantize parts of the rows: q_xq_plan lays
 * out mem for rows x k (NULL where q_xq_prepare is), q_xq_fill quantizes rows r0 .. r1 - 1 of
 * x (row r at x + r * k) into it. Parts filled by different threads must not overlap, and
 * every row must be filled before the q_xq is read; then it holds q_xq_prepare's bytes. With
 * q8k false the rows get no Q8_K form: for weights none of whose types q_reads_q8k, which
 * then give the same products, to the bit, without its cost (a tenth of a Q8_0 prefill's). */
q_xq *q_xq_plan(void *mem, size_t bytes, int rows, int k, bool q8k);
/* q_xq_plan with the Q8_K form alone (no 32-element form, no tiles' layout of it): for rows
 * that only weights q_reads_only_q8k multiply, which then give the same products, to the bit,
 * without the 32-element form's cost (at one row with Q4_K_M, two thirds of the quantizing
 * the caller does alone between regions, perf record). Where the rows cannot have a Q8_K form
 * (k not a multiple of 256) it is q_xq_plan with q8k. */
q_xq *q_xq_plan_q8k_only(void *mem, size_t bytes, int rows, int k);
/* Whether weights of the type read the activations' Q8_K form (the K types and IQ4_XS). */
bool q_reads_q8k(int type);
/* Whether weights of the type times rows activation rows of k elements read nothing of a q_xq
 * but its Q8_K form (Q4_K, Q5_K and Q6_K's few-row kernels with AVX-512 VNNI). */
bool q_reads_only_q8k(int type, int rows, int k);
void q_xq_fill(q_xq *a, const float *x, int r0, int r1);
/* q_matmul with the rows already quantized in a (taken when a matches rows, k and the current
 * instruction set, and q_int_path(type, rows); otherwise q_matmul on x). The same results as
 * q_matmul, to the bit. */
void q_matmul_xq(int type, const void *w, int n, int k, const q_xq *a, const float *x, int rows,
                 float beta, float *y, int ld_y);
/* Above Q_INT_MAX_ROWS rows (prefill) with AVX-512 VNNI: Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q5_K
 * and IQ4_XS weights times the rows in a in Q8_0's and Q4_K's repacked tiles (each block of 32
 * one scale and, for the unsigned values, a minimum; the activations' bound above; a row's
 * results do not depend on the rows beside it, but differ from q_matmul's, which dequantizes
 * tiles there). Returns false, having written nothing, where it does not run (another type or
 * instruction set, a prepared for another k, no memory). */
bool q_matmul_tiles(int type, const void *w, int n, int k, const q_xq *a, float beta, float *y,
                    int ld_y);

/* Q4_K and Q6_K weights packed once (at load) for the products of up to Q_PACKED_MAX_ROWS
 * activation rows (decode), where the CPU has AVX-512 VNNI (kernels/cpu/quant_kpack.c): 16
 * weight rows side by side, so that one vpdpbusd dots 4 bytes of x with 16 rows and the
 * scales are bytes already unpacked (as they lie each 256 weights of a row are unpacked and
 * reduced on their own). The copy takes 1.028x the Q4_K bytes, 1.0095x the Q6_K ones, and
 * gives the same bits as the weights as they lie. q_packed_bytes: the bytes of the n rows of
 * k elements packed (0 where this type or CPU has no such layout); q_pack: packs them into
 * out (64-aligned; false where q_packed_bytes is 0); q_matmul_packed: q_matmul_xq of the
 * rows n0 .. n0 + n - 1 (n0 a multiple of Q_PACKED_ROWS) from the packing wp of the whole
 * matrix, the same bits; false, having written nothing, where it does not run (more rows,
 * another instruction set or k than a's, a without the Q8_K form): then the caller reads
 * the weights as they lie. */
#define Q_PACKED_MAX_ROWS 4
#define Q_PACKED_ROWS     16
size_t q_packed_bytes(int type, int n, int k);
bool q_pack(int type, const void *w, int n, int k, void *out);
bool q_matmul_packed(int type, const void *wp, int n0, int n, int k, const q_xq *a, int rows,
                     float beta, float *y, int ld_y);

/* The instruction sets of the kernels, chosen once at run time: the best this CPU has, capped
 * by RINGLM_QUANT_PORTABLE=1 or RINGLM_QUANT_NO_AVX512=1 in the environment, or by
 * q_isa_cap() (tests compare the paths; it returns the previous cap). */
enum { Q_ISA_PORTABLE = 0, Q_ISA_AVX2 = 1, Q_ISA_AVX512 = 2 /* AVX-512 VL + VNNI */ };
int q_isa(void);
int q_isa_cap(int cap);
const char *q_isa_name(int isa);
/* Forces the portable C path (or lifts the cap); returns whether it was forced. */
bool q_force_portable(bool on);
/* Whether a SIMD path (AVX2/FMA or above) is in use. */
bool q_simd_active(void);

/* Quantizes one row of k floats (ringlm-mkmodel). Returns the bytes written. */
size_t q_quantize_row(int type, const float *x, void *out, int64_t k);
/* The same under an importance matrix: qw holds k per-column weights (llama-imatrix's mean
 * squared activations), read as ggml's quantize_* functions read quant_weights, so the bytes
 * are llama-quantize --imatrix's. Types ggml quantizes without them (F32, F16, BF16, Q8_0)
 * ignore qw; Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS read
 * them (the legacy types weight by the whole row's mean square: pass whole rows); 0 for a
 * type this cannot write (nothing written). */
size_t q_quantize_row_weighted(int type, const float *x, void *out, int64_t k, const float *qw);
/* Whether ggml's quantizer of type reads an importance matrix. */
bool q_takes_imatrix(int type);

#endif
