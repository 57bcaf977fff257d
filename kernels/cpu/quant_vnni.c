/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_vnni.c — the AVX-512 VNNI tile kernels of the integer path in blocks of
 * 32, shared by Q8_0 and the 32-element types (each family's file packs its weights into the
 * tiles, vt_pack_*). x86 only; compiled empty elsewhere, where q_isa never reaches
 * Q_ISA_AVX512.
 */
#include "kernels/cpu/quant_internal.h"

#if QK_X86

/* ---- AVX-512 VNNI tiles: 16 weight rows x up to 8 activation rows in registers --------- */

/* Above a few rows the products are compute-bound, and the AVX2 kernels (Q8_ROWS_KERNEL and
 * the K-quants' in their families' files) spend more
 * instructions per block on its float scale and horizontal sums than on the integer dot. Here
 * a tile of VT_COLS weight rows is first repacked (gathers) so that one zmm holds 4 bytes of
 * the same block of 16 weight rows, one lane each, as unsigned bytes; one vpdpbusd then dots
 * them with 4 bytes of one activation row broadcast (64 MACs), and the block's scale is one
 * multiply-add per activation row for all 16 outputs. The activations, quantized as for the
 * AVX2 kernels (the same integers), are laid out block-major so the rows of a pass sit
 * together. The integer sums are exact: Q8_0's weights are stored as w + 128, and each block's sum
 * starts at -128 x its activations' integer sum. */

/* The float step of one block of 32 for one activation row, with p the exact integer sums
 * of the block against the tile's 16 weight rows and a their scales: acc += p * (a * dx),
 * and for Q4_K's layout acc -= mn * sx (mn = dmin m_j). */
VNNI512 static inline __attribute__((always_inline)) __m512
vt_acc(const int TYPE, __m512 acc, __m512i p, __m512 a, __m512 mn, float dx, float sx)
{
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(a, _mm512_set1_ps(dx)), acc);
    if (TYPE == Q_Q4_K) acc = _mm512_fnmadd_ps(mn, _mm512_set1_ps(sx), acc);
    return acc;
}

/* Block b of the tile times the R (a constant, 1..VT_ROWS) activation rows from r0 into
 * acc[0..R). TYPE is a constant too. */
VNNI512 static inline __attribute__((always_inline)) void
vt_block(const int TYPE, const int R, const vt_w *w, int64_t b, const vt_x *x, int r0, __m512 acc[])
{
    const int rows = x->rows;
    const uint8_t *wq = w->q + b * 512;
    const int8_t *xq = x->q + ((size_t)b * rows + r0) * 32;
    __m512i p[VT_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        p[r] = TYPE == Q_Q8_0 ? _mm512_set1_epi32(x->c32[(size_t)b * rows + r0 + r])
                              : _mm512_setzero_si512();
    vt_dot_rows(wq, xq, 0, 8, p, R);
    const float *dx = x->d + (size_t)b * rows + r0, *sx = x->s + (size_t)b * rows + r0;
    const __m512 a = _mm512_loadu_ps(w->a + b * 16);
    const __m512 mn = TYPE == Q_Q4_K ? _mm512_loadu_ps(w->m + b * 16) : a;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = vt_acc(TYPE, acc[r], p[r], a, mn, dx[r], sx[r]);
}

/* The R (a constant, 1..VT_ROWS) activation rows from r0 times the tile, into y's 16 columns
 * (mask: those that exist). TYPE is a constant too; CHAINS: Q8_0's and the 32-element types' 4 chains (vt_tree4),
 * else one chain of blocks in order. */
VNNI512 static inline __attribute__((always_inline)) void
vt_kernel(const int TYPE, const bool CHAINS, const int R, const vt_w *w, int64_t nb, const vt_x *x,
          int r0, float beta, float *y, int ld_y, __mmask16 mask)
{
    __m512 acc[VT_ROWS];
    if (CHAINS) { /* chain c: blocks c, c + 4, ... (none past nb: 0) */
        __m512 part[VT_ROWS][4];
        for (int c = 0; c < 4; c++) {
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
            for (int64_t b = c; b < nb; b += 4) vt_block(TYPE, R, w, b, x, r0, acc);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) part[r][c] = acc[r];
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            vt_store(y + (size_t)(r0 + r) * ld_y, vt_tree4(part[r]), beta, mask);
        return;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) vt_block(TYPE, R, w, b, x, r0, acc);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) vt_store(y + (size_t)(r0 + r) * ld_y, acc[r], beta, mask);
}

#define VT_DISPATCH(name, TYPE, CHAINS)                                                            \
    VNNI512 void name(const vt_w *w, int64_t nb, const vt_x *x, int r0, int R, float beta,         \
                      float *y, int ld_y, __mmask16 mask)                                          \
    {                                                                                              \
        switch (R) {                                                                               \
        case 1: vt_kernel(TYPE, CHAINS, 1, w, nb, x, r0, beta, y, ld_y, mask); break;              \
        case 2: vt_kernel(TYPE, CHAINS, 2, w, nb, x, r0, beta, y, ld_y, mask); break;              \
        case 3: vt_kernel(TYPE, CHAINS, 3, w, nb, x, r0, beta, y, ld_y, mask); break;              \
        case 4: vt_kernel(TYPE, CHAINS, 4, w, nb, x, r0, beta, y, ld_y, mask); break;              \
        case 5: vt_kernel(TYPE, CHAINS, 5, w, nb, x, r0, beta, y, ld_y, mask); break;              \
        case 6: vt_kernel(TYPE, CHAINS, 6, w, nb, x, r0, beta, y, ld_y, mask); break;              \
        case 7: vt_kernel(TYPE, CHAINS, 7, w, nb, x, r0, beta, y, ld_y, mask); break;              \
        default: vt_kernel(TYPE, CHAINS, 8, w, nb, x, r0, beta, y, ld_y, mask); break;             \
        }                                                                                          \
    }
VT_DISPATCH(qk_vt_rows_q8_0, Q_Q8_0, true)
VT_DISPATCH(qk_vt_rows_signed, Q_Q8_0, false)
VT_DISPATCH(qk_vt_rows_q4_k, Q_Q4_K, false)
VT_DISPATCH(qk_vt_rows_q4_k32, Q_Q4_K, true)

#endif /* QK_X86 */
