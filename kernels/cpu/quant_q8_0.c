/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_q8_0.c — Q8_0 weights (32 elements: f16 d, int8 q[32]): dequantize, the
 * fused dot with float activations (portable; AVX2), the integer dots with 8-bit activations
 * (portable; AVX2 maddubs; AVX-512 VNNI scales, packing and one-row sums, whose tile kernels
 * are in quant_vnni.c), and the quantizer ringlm-mkmodel writes it with.
 */
#include "kernels/cpu/quant_internal.h"

void qk_dequant_q8_0(const void *row, float *out, int64_t k)
{
    const blk_q8_0 *b = row;
    for (int64_t i = 0; i < k / 32; i++) {
        const float d = qk_f16_to_f32(b[i].d);
        for (int j = 0; j < 32; j++) out[i * 32 + j] = d * b[i].qs[j];
    }
}

/* ---- fused dot ---------------------------------------------------------------------- */

float qk_dot_q8_0_portable(const void *row, const float *x, int64_t k)
{
    float sum = 0.0f;
    const blk_q8_0 *b = row;
    for (int64_t i = 0; i < k / 32; i++, x += 32) {
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += (float)b[i].qs[j] * x[j];
        sum += qk_f16_to_f32(b[i].d) * s;
    }
    return sum;
}

#if QK_X86
SIMD float qk_dot_q8_0_avx2(const void *row, const float *x, int64_t k)
{
    __m256 acc = _mm256_setzero_ps();
    const blk_q8_0 *b = row;
    for (int64_t i = 0; i < k / 32; i++, x += 32) {
        __m256 s = _mm256_setzero_ps();
        for (int j = 0; j < 32; j += 8) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + j)));
            s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(x + j), s);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qk_f16_to_f32(b[i].d)), s, acc);
    }
    return hsum8(acc);
}
#endif

/* ---- integer dots, 8-bit activations ------------------------------------------------ */

/* The portable integer dots of one weight row w (nb blocks of its type) with one quantized
 * activation row (xq: k bytes, xd: its k/32 scales, xs: d x sum q per 32). */
float qk_xdot_q8_0_portable(const void *wv, int64_t k, const int8_t *xq, const float *xd,
                            const float *xs)
{
    (void)xs;
    const blk_q8_0 *w = wv;
    float sum = 0.0f;
    for (int64_t b = 0; b < k / 32; b++) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += w[b].qs[j] * xq[b * 32 + j];
        sum += qk_f16_to_f32(w[b].d) * xd[b] * (float)s;
    }
    return sum;
}

#if QK_X86

/* One activation row (decode) reads each weight row once, one block per few cycles: the
 * hardware prefetcher alone kept one thread at 6.1-6.6 GMAC/s, and the blocks Q8_PF_BYTES
 * ahead (2-4 rows of 768 elements; 1.6-3.3 KiB measured alike) prefetched too, 7.7-9.0
 * (perf/quant_bench --types Q8_0 --rows 1 --clock cpu, at load 7). A batch reads each block
 * for several rows and does not need it. The prefetch may reach past the matrix: it never
 * faults. */
#define Q8_PF_BYTES 2048

/* The rows' products with each weight row: acc[r] += d_w d_x[r] * (w . x[r]) per block; DOT
 * gives the 8 int32 partial sums of |w| (unsigned) times x[r] with w's sign. R is a constant
 * in each expansion (1..Q8_GROUP_ROWS) and the loops over the rows are unrolled, so the
 * accumulators stay in registers (as a loop they lived on the stack, each block's FMA read
 * and stored back: half the kernel's time at 32 rows). */
#define Q8_ROWS_KERNEL(name, attr, DOT)                                                            \
    attr static inline __attribute__((always_inline)) void name##_r(                               \
        const blk_q8_0 *w, int n, int64_t k, const xq8 *x, float beta, float *y, int ld_y,         \
        const int R)                                                                               \
    {                                                                                              \
        const int64_t nb = k / 32;                                                                 \
        for (int i = 0; i < n; i++, w += nb) {                                                     \
            __m256 acc[Q8_GROUP_ROWS];                                                             \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();      \
            for (int64_t b = 0; b < nb; b++) {                                                     \
                if (R == 1) /* one row streams the weights: Q8_PF_BYTES ahead (see above) */       \
                    _mm_prefetch((const char *)(w + b) + Q8_PF_BYTES, _MM_HINT_T0);                \
                const __m256i wq = _mm256_loadu_si256((const __m256i *)w[b].qs);                   \
                const __m256i aw = _mm256_sign_epi8(wq, wq);                                       \
                const float dw = _cvtsh_ss(w[b].d);                                                \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                \
                {                                                                                  \
                    const __m256i xq =                                                             \
                        _mm256_loadu_si256((const __m256i *)(x->q + (size_t)r * k + b * 32));      \
                    const __m256i p = DOT(aw, _mm256_sign_epi8(xq, wq));                           \
                    acc[r] =                                                                       \
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),                                     \
                                        _mm256_set1_ps(dw * x->d[(size_t)r * nb + b]), acc[r]);    \
                }                                                                                  \
            }                                                                                      \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                    \
            {                                                                                      \
                float *yr = y + (size_t)r * ld_y + i, sum = hsum8(acc[r]);                         \
                *yr = beta == 0.0f ? sum : beta * *yr + sum;                                       \
            }                                                                                      \
        }                                                                                          \
    }

Q8_ROWS_KERNEL(qk_rows_q8_0_avx2, SIMD, dot_u8s8_avx2)
ROWS_DISPATCH(qk_rows_q8_0_avx2, SIMD, blk_q8_0)

/* ---- AVX-512 VNNI ------------------------------------------------------------------- */

/* Q8_0 scales of the m (<= 16) rows of w at rb bytes apart, all nb blocks: t->a (lanes m..15:
 * row m - 1's, never stored). Sixteen scalar loads a block: one gather of them (vpgatherdd)
 * took twice the time of one row's dots on Zen 4. */
VNNI512 void qk_vt_scales_q8_0(const char *w, size_t rb, int m, int64_t nb, const vt_w *t)
{
    const char *row[16];
    for (int i = 0; i < 16; i++) row[i] = w + (size_t)(i < m ? i : m - 1) * rb;
    for (int64_t b = 0; b < nb; b++) {
        uint16_t h[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) memcpy(&h[i], row[i] + b * (int64_t)sizeof(blk_q8_0), 2);
        _mm512_storeu_ps(t->a + b * 16, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)));
    }
}

/* Q8_0: the m (<= 16) rows of w at rb bytes apart, all nb blocks. */
VNNI512 void qk_vt_pack_q8_0(const char *w, size_t rb, int m, int64_t nb, const vt_w *t)
{
    const __m512i flip = _mm512_set1_epi32((int)0x80808080u);
    qk_vt_scales_q8_0(w, rb, m, nb, t);
    for (int64_t b = 0; b < nb; b++) {
        const char *base = w + b * (int64_t)sizeof(blk_q8_0);
        __m512i v[8];
        vt_transpose(base + 2, rb, m, v);
        for (int g = 0; g < 8; g++)
            _mm512_storeu_si512(t->q + (b * 8 + g) * 64, _mm512_xor_si512(v[g], flip));
    }
}

/* Up to VT1_ROWS activation rows, the weights as they lie: each weight row read once from start
 * to end (a stream the hardware prefetcher follows: 16 rows dotted side by side, block by
 * block, read at 9.4 GB/s against 19-20 one row after the other; 4 side by side, in the
 * tiles' order, took 2.3x one after the other), 8 blocks at a time: one vpdpbusd a block and
 * activation row (the weights + 128 unsigned), the 8 blocks' partial sums folded to their
 * exact sums (vt1_reduce) and the activations' -128 x sum added (c32), then the 8 sums times
 * their scales times the row's: blocks j and then 4 + j into lane j, chain j of vt_fold4.
 * The sums never go through memory nor turn from blocks to weight rows (the transposes the
 * tiles' one chain in block order needed). The scales are stored as the blocks are read:
 * loads and stores, beside the folds' shuffles (taking two blocks a zmm, one permute for
 * their weights and three levels of permutes for 16 scales took 1.05-1.12x the time of the
 * one-chain kernel before, 1.25-1.5x this: perf/quant_bench --types Q8_0 --rows 1,2 on Zen 4,
 * whose shuffle units the folds fill). */

/* The activation rows of a row-major q_xq: bytes, scales and c32 (-128 x sum) per block. */
typedef struct vr_x {
    const int8_t *q[VT1_ROWS];
    const float *d[VT1_ROWS];
    const int32_t *c32[VT1_ROWS];
} vr_x;

/* Blocks b0.. (n of them, 1..8; FULL: 8) of the weight row at wr times the R activation rows
 * into acc[r]'s chains. */
VNNI512 static inline __attribute__((always_inline)) void vr_group(const char *wr, int64_t b0,
                                                                   int n, const bool FULL,
                                                                   const vr_x *x, const int R,
                                                                   __m128 acc[])
{
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i wq[8];
    uint16_t h[8] = {0};
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const char *blk = wr + (b0 + j) * (int64_t)sizeof(blk_q8_0);
        if (FULL || j < n) {
            wq[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), flip);
            memcpy(&h[j], blk, 2);
        } else
            wq[j] = _mm256_setzero_si256();
    }
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
    const __mmask8 k = FULL ? 0xFF : (__mmask8)((1u << n) - 1);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        __m256i v[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            v[j] = FULL || j < n
                       ? _mm256_dpbusd_epi32(
                             _mm256_setzero_si256(), wq[j],
                             _mm256_loadu_si256((const __m256i *)(x->q[r] + (b0 + j) * 32)))
                       : _mm256_setzero_si256();
        const __m256i p =
            _mm256_add_epi32(vt1_reduce(v), _mm256_maskz_loadu_epi32(k, x->c32[r] + b0));
        /* vt_acc's steps: the exact sum times (scale x the row's) */
        const __m256 f = _mm256_cvtepi32_ps(p),
                     t = _mm256_mul_ps(a, _mm256_maskz_loadu_ps(k, x->d[r] + b0));
        acc[r] = _mm_fmadd_ps(_mm256_castps256_ps128(f), _mm256_castps256_ps128(t), acc[r]);
        if (FULL || n > 4)
            acc[r] = _mm_fmadd_ps(_mm256_extractf128_ps(f, 1), _mm256_extractf128_ps(t, 1), acc[r]);
    }
}

VNNI512 static inline __attribute__((always_inline)) void vr_rows(const char *w, size_t rb, int n,
                                                                  int64_t nb, const vr_x *x,
                                                                  const int R, float beta, float *y,
                                                                  int ld_y)
{
    for (int i = 0; i < n; i++) {
        const char *wr = w + (size_t)i * rb;
        __m128 acc[VT1_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r] = _mm_setzero_ps();
        int64_t b0 = 0;
        for (; b0 + 8 <= nb; b0 += 8) vr_group(wr, b0, 8, true, x, R, acc);
        if (b0 < nb) vr_group(wr, b0, (int)(nb - b0), false, x, R, acc);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) vt_store(y + (size_t)r * ld_y + i, vt_fold4(acc[r]), beta, 1);
    }
}

VNNI512 void qk_vt1_rows_q8_0(const char *w, size_t rb, int n, int64_t nb, const struct q_xq *a,
                              int32_t *c32, float beta, float *y, int ld_y)
{
    const int R = a->rows;
    vr_x x;
    for (int r = 0; r < R; r++) {
        x.q[r] = a->xq.q + (size_t)r * nb * 32;
        x.d[r] = a->xq.d + (size_t)r * nb;
        x.c32[r] = R == 1 ? a->xt.c32 : c32 + (size_t)r * nb;
        if (R > 1)
            for (int64_t b = 0; b < nb; b++) c32[r * nb + b] = a->xt.c32[b * R + r];
    }
    switch (R) {
    case 1: vr_rows(w, rb, n, nb, &x, 1, beta, y, ld_y); break;
    case 2: vr_rows(w, rb, n, nb, &x, 2, beta, y, ld_y); break;
    case 3: vr_rows(w, rb, n, nb, &x, 3, beta, y, ld_y); break;
    default: vr_rows(w, rb, n, nb, &x, 4, beta, y, ld_y); break;
    }
}

#endif /* QK_X86 */

/* ---- quantizer (ringlm-mkmodel) ----------------------------------------------------- */

void qk_quantize_q8_0(const float *x, void *out, int64_t k)
{
    blk_q8_0 *b = out;
    for (int64_t i = 0; i < k / 32; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = qk_f32_to_f16(d);
        for (int j = 0; j < 32; j++)
            b[i].qs[j] = (int8_t)roundf(x[j] * id); /* ties away from zero, as ggml */
    }
}
