/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_kquants.c — the K-quants, Q4_K and Q6_K weights (256 elements with
 * 6-bit or 8-bit sub-block scales; layouts in quant.h): dequantize, the fused dots with float
 * activations (portable; AVX2), the integer dots with 8-bit activations (portable; AVX2
 * maddubs; AVX-512 VNNI scales, packing and one-row sums, whose tile kernels are in
 * quant_vnni.c). Their quantizers are in quant_search.c.
 */
#include "kernels/cpu/quant_internal.h"

/* ---- dequantize --------------------------------------------------------------------- */

static void dequant_q4_k_block(const blk_q4_k *b, float *y)
{
    const float d = qk_f16_to_f32(b->d), min = qk_f16_to_f32(b->dmin);
    const uint8_t *q = b->qs;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
        uint8_t sc, m;
        scale_min_k4(is, b->scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        scale_min_k4(is + 1, b->scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
    }
}

static void dequant_q6_k_block(const blk_q6_k *b, float *y)
{
    const float d = qk_f16_to_f32(b->d);
    const uint8_t *ql = b->ql, *qh = b->qh;
    const int8_t *sc = b->scales;
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
    }
}

void qk_dequant_q4_k(const void *row, float *out, int64_t k)
{
    for (int64_t i = 0; i < k / QK_K; i++)
        dequant_q4_k_block((const blk_q4_k *)row + i, out + i * QK_K);
}

void qk_dequant_q6_k(const void *row, float *out, int64_t k)
{
    for (int64_t i = 0; i < k / QK_K; i++)
        dequant_q6_k_block((const blk_q6_k *)row + i, out + i * QK_K);
}

/* ---- fused dot ---------------------------------------------------------------------- */

float qk_dot_q4_k_portable(const void *row, const float *x, int64_t k)
{
    float sum = 0.0f;
    const blk_q4_k *b = row;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = qk_f16_to_f32(b[i].d), min = qk_f16_to_f32(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32, x += 64) {
            uint8_t sc1, m1, sc2, m2;
            scale_min_k4(is, b[i].scales, &sc1, &m1);
            scale_min_k4(is + 1, b[i].scales, &sc2, &m2);
            float qx1 = 0, sx1 = 0, qx2 = 0, sx2 = 0;
            for (int l = 0; l < 32; l++) {
                qx1 += (float)(q[l] & 0xF) * x[l];
                sx1 += x[l];
                qx2 += (float)(q[l] >> 4) * x[l + 32];
                sx2 += x[l + 32];
            }
            sum += d * sc1 * qx1 - min * m1 * sx1 + d * sc2 * qx2 - min * m2 * sx2;
        }
    }
    return sum;
}

float qk_dot_q6_k_portable(const void *row, const float *x, int64_t k)
{
    float sum = 0.0f;
    const blk_q6_k *b = row;
    float y[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        dequant_q6_k_block(&b[i], y);
        for (int j = 0; j < QK_K; j++) sum += y[j] * x[j];
    }
    return sum;
}

#if QK_X86
SIMD float qk_dot_q4_k_avx2(const void *row, const float *x, int64_t k)
{
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    const blk_q4_k *b = row;
    const __m256i lo4 = _mm256_set1_epi32(0xF);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = qk_f16_to_f32(b[i].d), min = qk_f16_to_f32(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32, x += 64) {
            uint8_t sc1, m1, sc2, m2;
            scale_min_k4(is, b[i].scales, &sc1, &m1);
            scale_min_k4(is + 1, b[i].scales, &sc2, &m2);
            __m256 qx1 = _mm256_setzero_ps(), qx2 = _mm256_setzero_ps();
            __m256 sx1 = _mm256_setzero_ps(), sx2 = _mm256_setzero_ps();
            for (int l = 0; l < 32; l += 8) {
                __m256i v = u8x8(q + l);
                __m256 x1 = _mm256_loadu_ps(x + l), x2 = _mm256_loadu_ps(x + l + 32);
                qx1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, lo4)), x1, qx1);
                qx2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), x2, qx2);
                sx1 = _mm256_add_ps(sx1, x1);
                sx2 = _mm256_add_ps(sx2, x2);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc1), qx1, acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc2), qx2, acc);
            acc2 = _mm256_fmadd_ps(_mm256_set1_ps(min * m1), sx1, acc2);
            acc2 = _mm256_fmadd_ps(_mm256_set1_ps(min * m2), sx2, acc2);
        }
    }
    return hsum8(_mm256_sub_ps(acc, acc2));
}

SIMD float qk_dot_q6_k_avx2(const void *row, const float *x, int64_t k)
{
    __m256 acc = _mm256_setzero_ps();
    const blk_q6_k *b = row;
    const __m256i m4 = _mm256_set1_epi32(0xF), m2 = _mm256_set1_epi32(3);
    const __m256i off = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = qk_f16_to_f32(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int n = 0; n < QK_K; n += 128, x += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l += 8) {
                const int is = l / 16;
                __m256i a = u8x8(ql + l), c = u8x8(ql + l + 32), h = u8x8(qh + l);
                __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, m4),
                                             _mm256_slli_epi32(_mm256_and_si256(h, m2), 4));
                __m256i q2 = _mm256_or_si256(
                    _mm256_and_si256(c, m4),
                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2), m2), 4));
                __m256i q3 = _mm256_or_si256(
                    _mm256_srli_epi32(a, 4),
                    _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 4), m2), 4));
                __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(c, 4),
                                             _mm256_slli_epi32(_mm256_srli_epi32(h, 6), 4));
                __m256 f1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q1, off));
                __m256 f2 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q2, off));
                __m256 f3 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q3, off));
                __m256 f4 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q4, off));
                acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d * sc[is]), f1),
                                      _mm256_loadu_ps(x + l), acc);
                acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d * sc[is + 2]), f2),
                                      _mm256_loadu_ps(x + l + 32), acc);
                acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d * sc[is + 4]), f3),
                                      _mm256_loadu_ps(x + l + 64), acc);
                acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d * sc[is + 6]), f4),
                                      _mm256_loadu_ps(x + l + 96), acc);
            }
        }
    }
    return hsum8(acc);
}
#endif

/* ---- integer dots, 8-bit activations ------------------------------------------------ */

/* Q4_K: per 32-element sub-block j, x = d sc_j q - dmin m_j with q in 0..15 (unsigned, so
 * dotted as it is); the minimums meet the quantized block sums. */
float qk_xdot_q4_k_portable(const void *wv, int64_t k, const int8_t *xq, const float *xd,
                            const float *xs)
{
    const blk_q4_k *w = wv;
    float sum = 0.0f, mins = 0.0f;
    for (int64_t b = 0; b < k / QK_K; b++) {
        const float d = qk_f16_to_f32(w[b].d), dmin = qk_f16_to_f32(w[b].dmin);
        float m = 0.0f;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            scale_min_k4(j, w[b].scales, &sc, &mn);
            const uint8_t *q = w[b].qs + 32 * (j / 2);
            const int8_t *xj = xq + b * QK_K + 32 * j;
            int s = 0;
            for (int l = 0; l < 32; l++) s += (j % 2 ? q[l] >> 4 : q[l] & 0xF) * xj[l];
            sum += d * sc * xd[b * 8 + j] * (float)s;
            m += mn * xs[b * 8 + j];
        }
        mins += dmin * m;
    }
    return sum - mins;
}

/* The 6-bit value of element e (0..255) of a Q6_K block, 0..63. */
static int q6k_q(const blk_q6_k *b, int e)
{
    const int h = e / 128, c = e % 128 / 32, l = e % 32;
    const uint8_t ql = b->ql[64 * h + l + (c & 1) * 32], qh = b->qh[32 * h + l];
    return ((c < 2 ? ql & 0xF : ql >> 4) | ((qh >> (2 * c)) & 3) << 4);
}

/* Q6_K: per 16-element sub-block g, x = d scales[g] (q - 32). */
float qk_xdot_q6_k_portable(const void *wv, int64_t k, const int8_t *xq, const float *xd,
                            const float *xs)
{
    (void)xs;
    const blk_q6_k *w = wv;
    float sum = 0.0f;
    for (int64_t b = 0; b < k / QK_K; b++) {
        const float d = qk_f16_to_f32(w[b].d);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += (q6k_q(&w[b], 16 * g + l) - 32) * xq[b * QK_K + 16 * g + l];
            sum += d * w[b].scales[g] * xd[b * 8 + g / 2] * (float)s;
        }
    }
    return sum;
}

#if QK_X86

/* Q4_K: 32 bytes of q hold two sub-blocks (low nibbles, then high); the minimums are summed
 * apart, in scalars, from the quantized block sums. */
#define Q4K_ROWS_KERNEL(name, attr, DOT)                                                           \
    attr static inline __attribute__((always_inline)) void name##_r(                               \
        const blk_q4_k *w, int n, int64_t k, const xq8 *x, float beta, float *y, int ld_y,         \
        const int R)                                                                               \
    {                                                                                              \
        const int64_t nb = k / QK_K, nx = k / 32;                                                  \
        const __m256i m4 = _mm256_set1_epi8(0x0F);                                                 \
        for (int i = 0; i < n; i++, w += nb) {                                                     \
            __m256 acc[Q8_GROUP_ROWS];                                                             \
            float mins[Q8_GROUP_ROWS];                                                             \
            for (int r = 0; r < R; r++) {                                                          \
                acc[r] = _mm256_setzero_ps();                                                      \
                mins[r] = 0.0f;                                                                    \
            }                                                                                      \
            for (int64_t b = 0; b < nb; b++) {                                                     \
                const float d = _cvtsh_ss(w[b].d), dmin = _cvtsh_ss(w[b].dmin);                    \
                uint8_t sc[8], mn[8];                                                              \
                for (int j = 0; j < 8; j++) scale_min_k4(j, w[b].scales, &sc[j], &mn[j]);          \
                for (int jj = 0; jj < 4; jj++) {                                                   \
                    const __m256i qv = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * jj));   \
                    const __m256i lo = _mm256_and_si256(qv, m4);                                   \
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);             \
                    const float s_lo = d * sc[2 * jj], s_hi = d * sc[2 * jj + 1];                  \
                    for (int r = 0; r < R; r++) {                                                  \
                        const int8_t *xr = x->q + (size_t)r * k + b * QK_K + 64 * jj;              \
                        const float *dx = x->d + (size_t)r * nx + b * 8 + 2 * jj;                  \
                        const __m256i pl = DOT(lo, _mm256_loadu_si256((const __m256i *)xr));       \
                        const __m256i ph =                                                         \
                            DOT(hi, _mm256_loadu_si256((const __m256i *)(xr + 32)));               \
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pl),                           \
                                                 _mm256_set1_ps(s_lo * dx[0]), acc[r]);            \
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ph),                           \
                                                 _mm256_set1_ps(s_hi * dx[1]), acc[r]);            \
                    }                                                                              \
                }                                                                                  \
                for (int r = 0; r < R; r++) {                                                      \
                    const float *xs = x->s + (size_t)r * nx + b * 8;                               \
                    float m = 0.0f;                                                                \
                    for (int j = 0; j < 8; j++) m += mn[j] * xs[j];                                \
                    mins[r] += dmin * m;                                                           \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < R; r++) {                                                          \
                float *yr = y + (size_t)r * ld_y + i, sum = hsum8(acc[r]) - mins[r];               \
                *yr = beta == 0.0f ? sum : beta * *yr + sum;                                       \
            }                                                                                      \
        }                                                                                          \
    }

/* Q6_K: each half of a block is 4 chunks of 32 elements (ql low nibbles, ql+32 low, ql high,
 * ql+32 high, each with its 2 bits of qh); chunk c's lanes 0-3 take scales[2c], 4-7
 * scales[2c+1]; q - 32 is signed, so dotted like Q8_0 (|w| times x with w's sign). */
#define Q6K_ROWS_KERNEL(name, attr, DOT)                                                           \
    attr static inline __attribute__((always_inline)) void name##_r(                               \
        const blk_q6_k *w, int n, int64_t k, const xq8 *x, float beta, float *y, int ld_y,         \
        const int R)                                                                               \
    {                                                                                              \
        const int64_t nb = k / QK_K, nx = k / 32;                                                  \
        const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);                       \
        const __m256i off = _mm256_set1_epi8(32);                                                  \
        for (int i = 0; i < n; i++, w += nb) {                                                     \
            __m256 acc[Q8_GROUP_ROWS];                                                             \
            for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                              \
            for (int64_t b = 0; b < nb; b++) {                                                     \
                const float d = _cvtsh_ss(w[b].d);                                                 \
                for (int h = 0; h < 2; h++) {                                                      \
                    const uint8_t *ql = w[b].ql + 64 * h, *qh = w[b].qh + 32 * h;                  \
                    const int8_t *sc = w[b].scales + 8 * h;                                        \
                    const __m256i A = _mm256_loadu_si256((const __m256i *)ql);                     \
                    const __m256i B = _mm256_loadu_si256((const __m256i *)(ql + 32));              \
                    const __m256i H = _mm256_loadu_si256((const __m256i *)qh);                     \
                    __m256i q[4];                                                                  \
                    q[0] = _mm256_or_si256(_mm256_and_si256(A, m4),                                \
                                           _mm256_slli_epi16(_mm256_and_si256(H, m2), 4));         \
                    q[1] = _mm256_or_si256(                                                        \
                        _mm256_and_si256(B, m4),                                                   \
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), m2), 4));      \
                    q[2] = _mm256_or_si256(                                                        \
                        _mm256_and_si256(_mm256_srli_epi16(A, 4), m4),                             \
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), m2), 4));      \
                    q[3] = _mm256_or_si256(                                                        \
                        _mm256_and_si256(_mm256_srli_epi16(B, 4), m4),                             \
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), m2), 4));      \
                    for (int c = 0; c < 4; c++) {                                                  \
                        const __m256i sq = _mm256_sub_epi8(q[c], off);                             \
                        const __m256i aw = _mm256_sign_epi8(sq, sq);                               \
                        const __m256 S = _mm256_insertf128_ps(                                     \
                            _mm256_castps128_ps256(_mm_set1_ps(d * sc[2 * c])),                    \
                            _mm_set1_ps(d * sc[2 * c + 1]), 1);                                    \
                        for (int r = 0; r < R; r++) {                                              \
                            const __m256i xv = _mm256_loadu_si256(                                 \
                                (const __m256i *)(x->q + (size_t)r * k + b * QK_K + 128 * h +      \
                                                  32 * c));                                        \
                            const __m256i p = DOT(aw, _mm256_sign_epi8(xv, sq));                   \
                            const float dx = x->d[(size_t)r * nx + b * 8 + 4 * h + c];             \
                            acc[r] =                                                               \
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),                             \
                                                _mm256_mul_ps(S, _mm256_set1_ps(dx)), acc[r]);     \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < R; r++) {                                                          \
                float *yr = y + (size_t)r * ld_y + i, sum = hsum8(acc[r]);                         \
                *yr = beta == 0.0f ? sum : beta * *yr + sum;                                       \
            }                                                                                      \
        }                                                                                          \
    }
Q4K_ROWS_KERNEL(qk_rows_q4_k_avx2, SIMD, dot_u8s8_avx2)
Q6K_ROWS_KERNEL(qk_rows_q6_k_avx2, SIMD, dot_u8s8_avx2)
ROWS_DISPATCH(qk_rows_q4_k_avx2, SIMD, blk_q4_k)
ROWS_DISPATCH(qk_rows_q6_k_avx2, SIMD, blk_q6_k)

/* ---- AVX-512 VNNI ------------------------------------------------------------------- */


/* Q4_K and Q6_K take Q8_K activations here (one scale per 256, llama.cpp's), so that each
 * 256 weights end in exact integers and one float step (quant_internal.h, qk_kt_*): one row
 * then dots the weights as they lie at the cost of a few integer sums per 256, where with a
 * float step per block of 32 it had to store every block's sum and turn 16 rows' sums into
 * vectors to add them in the tiles' order (the scales gathered apart): that took half of its
 * time with the weights in the cache. */

/* Q4_K (Q5_K where FIVE), 16 rows rb bytes apart: d, dmin, the scales per block and the
 * minimums in pairs, as the tiles read them (from the 12 bytes as scale_min_k4 unpacks them);
 * and the nibbles of each 32 bytes as two blocks (Q5_K: with their fifth bits from qh, bit j of
 * a byte for block j). */
VNNI512 static inline __attribute__((always_inline)) void
kt_pack_k45(const char *w, size_t rb, int m, int64_t nb, const kt_w *t, const bool FIVE)
{
    const int64_t bsz = FIVE ? (int64_t)sizeof(blk_q5_k) : (int64_t)sizeof(blk_q4_k);
    const int qs_at = FIVE ? 48 : 16; /* Q5_K: qh at 16 */
    const __m512i m1 = _mm512_set1_epi32(0x01010101);
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    const __m512i idx = vt_row_offsets(rb), z = _mm512_setzero_si512();
    const __m512i m6 = _mm512_set1_epi32(63), m2 = _mm512_set1_epi32(3),
                  m4s = _mm512_set1_epi32(15), m4 = _mm512_set1_epi32(0x0F0F0F0F);
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const char *base = w + sb * bsz;
        const __m512i dd = _mm512_mask_i32gather_epi32(z, mask, idx, base, 1);
        _mm512_storeu_ps(t->d + sb * 16, vt_f16x16(dd));
        _mm512_storeu_ps(t->dmin + sb * 16, vt_f16x16(_mm512_srli_epi32(dd, 16)));
        const __m512i D0 = _mm512_mask_i32gather_epi32(z, mask, idx, base + 4, 1);
        const __m512i D1 = _mm512_mask_i32gather_epi32(z, mask, idx, base + 8, 1);
        const __m512i D2 = _mm512_mask_i32gather_epi32(z, mask, idx, base + 12, 1);
        __m512i mn[8];
        for (int j = 0; j < 4; j++) {
            const __m512i b0 = _mm512_srli_epi32(D0, 8 * j), b1 = _mm512_srli_epi32(D1, 8 * j);
            const __m512i b2 = _mm512_srli_epi32(D2, 8 * j);
            _mm512_storeu_si512(t->sc + (sb * 8 + j) * 16, _mm512_and_si512(b0, m6));
            _mm512_storeu_si512(
                t->sc + (sb * 8 + j + 4) * 16,
                _mm512_or_si512(
                    _mm512_and_si512(b2, m4s),
                    _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b0, 6), m2), 4)));
            mn[j] = _mm512_and_si512(b1, m6);
            mn[j + 4] = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32(b2, 4), m4s),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b1, 6), m2), 4));
        }
        for (int p = 0; p < 4; p++)
            _mm512_storeu_si512(t->mn + (sb * 4 + p) * 16,
                                _mm512_or_si512(mn[2 * p], _mm512_slli_epi32(mn[2 * p + 1], 16)));
        __m512i vh[8];
        if (FIVE) vt_transpose(base + 16, rb, m, vh);
        for (int jj = 0; jj < 4; jj++) {
            __m512i v[8];
            vt_transpose(base + qs_at + 32 * jj, rb, m, v);
            for (int g = 0; g < 8; g++) {
                __m512i lo = _mm512_and_si512(v[g], m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi32(v[g], 4), m4);
                if (FIVE) {
                    lo = _mm512_or_si512(
                        lo, _mm512_slli_epi32(
                                _mm512_and_si512(_mm512_srli_epi32(vh[g], 2 * jj), m1), 4));
                    hi = _mm512_or_si512(
                        hi, _mm512_slli_epi32(
                                _mm512_and_si512(_mm512_srli_epi32(vh[g], 2 * jj + 1), m1), 4));
                }
                _mm512_storeu_si512(t->q + ((sb * 8 + 2 * jj) * 8 + g) * 64, lo);
                _mm512_storeu_si512(t->q + ((sb * 8 + 2 * jj + 1) * 8 + g) * 64, hi);
            }
        }
    }
}

VNNI512 void qk_kt_pack_q4_k(const char *w, size_t rb, int m, int64_t nb, const kt_w *t)
{
    kt_pack_k45(w, rb, m, nb, t, false);
}

VNNI512 void qk_kt_pack_q5_k(const char *w, size_t rb, int m, int64_t nb, const kt_w *t)
{
    kt_pack_k45(w, rb, m, nb, t, true);
}

/* Q6_K, 16 rows: d, the sixteen int8 scales of each 256 (two a block), and the 6-bit values
 * of each 32-element chunk (Q6K_ROWS_KERNEL's chunks) as unsigned bytes. */
VNNI512 void qk_kt_pack_q6_k(const char *w, size_t rb, int m, int64_t nb, const kt_w *t)
{
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    const __m512i idx = vt_row_offsets(rb), z = _mm512_setzero_si512();
    const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
    const __m512i m2 = _mm512_set1_epi32(0x03030303);
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const char *base = w + sb * (int64_t)sizeof(blk_q6_k);
        /* d: the upper half of the dword ending the block */
        _mm512_storeu_ps(t->d + sb * 16,
                         vt_f16x16(_mm512_srli_epi32(
                             _mm512_mask_i32gather_epi32(z, mask, idx, base + 206, 1), 16)));
        __m512i S[4];
        for (int i = 0; i < 4; i++)
            S[i] = _mm512_mask_i32gather_epi32(z, mask, idx, base + 192 + 4 * i, 1);
        for (int G = 0; G < 16; G++) /* scales[G], a signed byte */
            _mm512_storeu_si512(
                t->sc + (sb * 16 + G) * 16,
                _mm512_srai_epi32(_mm512_slli_epi32(S[G / 4], 24 - 8 * (G % 4)), 24));
        for (int h = 0; h < 2; h++) {
            __m512i vl0[8], vl1[8], vh[8];
            vt_transpose(base + 64 * h, rb, m, vl0);
            vt_transpose(base + 64 * h + 32, rb, m, vl1);
            vt_transpose(base + 128 + 32 * h, rb, m, vh);
            for (int g = 0; g < 8; g++) {
                const __m512i L0 = vl0[g], L1 = vl1[g], H = vh[g];
                const __m512i q[4] = {
                    _mm512_or_si512(_mm512_and_si512(L0, m4),
                                    _mm512_slli_epi32(_mm512_and_si512(H, m2), 4)),
                    _mm512_or_si512(
                        _mm512_and_si512(L1, m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H, 2), m2), 4)),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi32(L0, 4), m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H, 4), m2), 4)),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi32(L1, 4), m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H, 6), m2), 4)),
                };
                for (int c = 0; c < 4; c++)
                    _mm512_storeu_si512(t->q + ((sb * 8 + 4 * h + c) * 8 + g) * 64, q[c]);
            }
        }
    }
}

/* y[0..15] (mask: the columns that exist) = acc, or beta y + acc: the tiles and one row store
 * through this. */
VNNI512 static inline __attribute__((always_inline)) void kt_store(float *yr, __m512 v, float beta,
                                                                   __mmask16 mask)
{
    if (beta != 0.0f)
        v = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, yr)), v);
    _mm512_mask_storeu_ps(yr, mask, v);
}

/* The R (a constant, 1..VT_ROWS) activation rows from r0 times the tile into y's 16 columns:
 * per block of 32, 8 vpdpbusd per row as in vt_kernel (quant_vnni.c), the block's exact sum
 * times its scales added in integers (Q6_K: from -32 x the sum of x per 16, so that q - 32
 * is dotted); per 256, Q4_K's minimums times the sums of x per 32 (vpdpwssd on int16 pairs),
 * and the float step. */
VNNI512 static inline __attribute__((always_inline)) void
kt_kernel(const int TYPE, const kt_w *w, int64_t nb, const kt_x *x, int r0, float beta, float *y,
          int ld_y, __mmask16 mask, const int R)
{
    __m512 acc[VT_ROWS];
    const int rows = x->rows;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        __m512i I[VT_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) I[r] = _mm512_setzero_si512();
        for (int64_t b = sb * 8; b < sb * 8 + 8; b++) {
            const uint8_t *wq = w->q + b * 512;
            const int8_t *xq = x->q + ((size_t)b * rows + r0) * 32;
            for (int h = 0; h < (TYPE == Q_Q6_K ? 2 : 1); h++) {
                __m512i p[VT_ROWS];
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    p[r] = TYPE == Q_Q6_K ? _mm512_set1_epi32(x->c16[(2 * b + h) * rows + r0 + r])
                                          : _mm512_setzero_si512();
                vt_dot_rows(wq, xq, TYPE == Q_Q6_K ? 4 * h : 0, TYPE == Q_Q6_K ? 4 * h + 4 : 8, p,
                            R);
                const __m512i sc =
                    _mm512_loadu_si512(w->sc + (TYPE == Q_Q6_K ? (2 * b + h) * 16 : b * 16));
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    I[r] = _mm512_add_epi32(I[r], _mm512_mullo_epi32(p[r], sc));
            }
        }
        const __m512 d = _mm512_loadu_ps(w->d + sb * 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const float dx = x->d[sb * rows + r0 + r];
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r]), _mm512_mul_ps(d, _mm512_set1_ps(dx)),
                                     acc[r]);
            if (TYPE == Q_Q4_K) {
                const int32_t *bs = x->bs + ((size_t)sb * rows + r0 + r) * 4;
                __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++)
                    M = _mm512_dpwssd_epi32(M, _mm512_loadu_si512(w->mn + (sb * 4 + p) * 16),
                                            _mm512_set1_epi32(bs[p]));
                acc[r] = _mm512_fnmadd_ps(
                    _mm512_cvtepi32_ps(M),
                    _mm512_mul_ps(_mm512_loadu_ps(w->dmin + sb * 16), _mm512_set1_ps(dx)), acc[r]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) kt_store(y + (size_t)(r0 + r) * ld_y, acc[r], beta, mask);
}

#define KT_DISPATCH(name, TYPE)                                                                    \
    VNNI512 void name(const kt_w *w, int64_t nb, const kt_x *x, int r0, int R, float beta,         \
                      float *y, int ld_y, __mmask16 mask)                                          \
    {                                                                                              \
        ROWS_BY_COUNT(R, kt_kernel, TYPE, w, nb, x, r0, beta, y, ld_y, mask)                       \
    }
KT_DISPATCH(qk_kt_rows_q4_k, Q_Q4_K)
KT_DISPATCH(qk_kt_rows_q6_k, Q_Q6_K)

/* The one-row kernels (qk_kt1_*) stream the weights row after row, as they lie, and leave for
 * each weight row, activation row and 256 the integer sums of the products in 4 lanes
 * (kt1_s); the tile's 16 rows then end together, as kt_kernel's lanes do: the 16 rows' lanes
 * summed into one vector of 16 sums at once, and the float steps taken for the 16 rows in one
 * vector. Each row's own horizontal sums and scalar float steps took a third of the time with
 * the weights in the cache. */

/* The scratch of the one-row kernels for R activation rows: per 256, the 4 lanes of each of
 * the 16 weight rows for each activation row, the d and dmin of each weight row (the dword
 * starting a Q4_K or Q5_K block; Q6_K: d in the low half), and Q4_K's and Q5_K's eight
 * minimums of each weight row in int16. The lanes and minimums of row 4s + t are at slot
 * 4t + s (kt1_slot), so that a 4 x 4 transpose in each 128 bits puts the rows in order. */
typedef struct kt1_s {
    int32_t *I;  /* [R][nb / 8][16 slots][4] */
    int32_t *dd; /* [nb / 8][16] */
    int16_t *mn; /* [nb / 8][16 slots][8] */
} kt1_s;

/* The block KT1_PF_BYTES ahead of the one at b, to the cache: LINES lines from its start,
 * 64 bytes apart, reach its last byte (Q4_K's 144 and Q5_K's 176 bytes: 3; Q6_K's 210: 4, where
 * 3 left a line of ~28% of the blocks to the demand load). The weights stream row after row;
 * the hardware prefetcher alone left one row at 0.83-0.90x this (Q4_K, Q6_K; 0.79x at 4 rows).
 * The prefetch may reach past the matrix: it never faults. */
#define KT1_PF_BYTES 4096
VNNI512 static inline __attribute__((always_inline)) void kt1_prefetch(const char *b,
                                                                       const int LINES)
{
#pragma GCC unroll 4
    for (int l = 0; l < LINES; l++) _mm_prefetch(b + KT1_PF_BYTES + 64 * l, _MM_HINT_T0);
}

/* The minimums of the 16 rows as kt_w's mn lays them out (p: blocks 2p and 2p + 1, int16),
 * from kt1_s's slots: a 4 x 4 transpose of dwords in each 128 bits. */
VNNI512 static inline __attribute__((always_inline)) void kt1_mins(const int16_t *mn,
                                                                   __m512i out[4])
{
    __m512i a[4], t[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) a[j] = _mm512_loadu_si512(mn + 32 * j);
    t[0] = _mm512_unpacklo_epi32(a[0], a[1]);
    t[1] = _mm512_unpackhi_epi32(a[0], a[1]);
    t[2] = _mm512_unpacklo_epi32(a[2], a[3]);
    t[3] = _mm512_unpackhi_epi32(a[2], a[3]);
    out[0] = _mm512_unpacklo_epi64(t[0], t[2]);
    out[1] = _mm512_unpackhi_epi64(t[0], t[2]);
    out[2] = _mm512_unpacklo_epi64(t[1], t[3]);
    out[3] = _mm512_unpackhi_epi64(t[1], t[3]);
}

/* The tile's m rows end: per 256, I (and Q4_K's, Q5_K's M) of the 16 rows, the float steps of
 * kt_kernel, and the store. */
VNNI512 static inline __attribute__((always_inline)) void kt1_end(const int TYPE, const kt1_s *s,
                                                                  int m, int64_t nsb, const xq8 *x,
                                                                  int64_t k, float beta, float *y,
                                                                  int ld_y, const int R)
{
    __m512 acc[KT1_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const __m512i ones = _mm512_set1_epi16(1);
    for (int64_t sb = 0; sb < nsb; sb++) {
        const __m512i dd = _mm512_loadu_si512(s->dd + sb * 16);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        __m512 dmin = d;
        __m512i mn[4];
        if (TYPE == Q_Q4_K) {
            dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
            kt1_mins(s->mn + sb * 128, mn);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float dx = x->kd[r * nsb + sb];
            const __m512i I = kt1_sum16(s->I + ((size_t)r * nsb + sb) * 64);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, _mm512_set1_ps(dx)),
                                     acc[r]);
            if (TYPE == Q_Q4_K) {
                /* the sums of x per 32 from Q8_K's per 16, two to a dword as kt_x's bs */
                const __m256i s32 = _mm256_madd_epi16(
                    _mm256_loadu_si256((const __m256i *)(x->ks + r * (k / 16) + sb * 16)),
                    _mm512_castsi512_si256(ones));
                const __m128i bs = _mm256_cvtepi32_epi16(s32);
                __m512i M = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++)
                    M = _mm512_dpwssd_epi32(
                        M, mn[p], _mm512_broadcastd_epi32(_mm_shuffle_epi32(bs, p * 0x55)));
                acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M),
                                          _mm512_mul_ps(dmin, _mm512_set1_ps(dx)), acc[r]);
            }
        }
    }
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) kt_store(y + (size_t)r * ld_y, acc[r], beta, mask);
}

/* The rows past m of a tile's last 16: zero sums and scales, so that their lanes hold numbers
 * (they are not stored). */
static void kt1_clear(const kt1_s *s, int m, int64_t nsb, int R)
{
    for (int64_t sb = 0; sb < nsb; sb++) {
        memset(s->dd + sb * 16 + m, 0, (size_t)(16 - m) * 4);
        for (int i = m; i < 16; i++) {
            for (int r = 0; r < R; r++)
                memset(s->I + (((size_t)r * nsb + sb) * 16 + kt1_slot(i)) * 4, 0, 16);
            memset(s->mn + sb * 128 + 8 * kt1_slot(i), 0, 16);
        }
    }
}

/* The exact sums of 256 bytes of x (xq) times the unpacked weights q (4 x 64 unsigned values)
 * by the scales of their sub-blocks, from I0, stored as 4 lanes at I: vpdpbusd sums each 4
 * products in a dword (|sum| < 2^15: 4 x 63 x 128 at most), vpackssdw packs those of q[2h] and
 * q[2h + 1] to words (exactly: no sum saturates), and vpdpwssd multiplies each word pair by its
 * sub-block's scale (sc[h]: the scale of each word) and adds. */
VNNI512 static inline __attribute__((always_inline)) void
kt1_dot(const __m512i q[4], const __m512i sc[2], const int8_t *xq, __m512i I0, int32_t *I)
{
    const __m512i z = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i a = _mm512_dpbusd_epi32(z, q[2 * h], _mm512_loadu_si512(xq + 128 * h));
        const __m512i b =
            _mm512_dpbusd_epi32(z, q[2 * h + 1], _mm512_loadu_si512(xq + 128 * h + 64));
        I0 = _mm512_dpwssd_epi32(I0, _mm512_packs_epi32(a, b), sc[h]);
    }
    const __m256i h =
        _mm256_add_epi32(_mm512_castsi512_si256(I0), _mm512_extracti64x4_epi64(I0, 1));
    _mm_storeu_si128((__m128i *)I,
                     _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

/* Q4_K (Q5_K where FIVE), a few rows (R, a constant, 1..KT1_ROWS) against the weights as they
 * lie: each 64 bytes of q hold blocks 4i and 4i + 2 in their low nibbles, 4i + 1 and 4i + 3 in
 * their high ones (Q5_K: the fifth bits, bit j of qh's 32 bytes for block j, broadcast to both
 * halves and shifted per half), dotted with x in that order (kt_x's q1) by kt1_dot, each
 * block's scale a pshufb of the 8 scales in int16 (each 128 bits the same). The weights are
 * unpacked once for the R rows; the minimums are taken for the 16 rows at the end (kt1_end). */
VNNI512 static inline __attribute__((always_inline)) void
kt1_k45(const char *w, size_t rb, int m, int64_t nb, const struct q_xq *a, const kt1_s *s,
        float beta, float *y, int ld_y, const bool FIVE, const int R)
{
    const int64_t bsz = FIVE ? (int64_t)sizeof(blk_q5_k) : (int64_t)sizeof(blk_q4_k);
    const int qs_at = FIVE ? 48 : 16; /* Q5_K: qh at 16 */
    const __m512i m1 = _mm512_set1_epi8(1);
    __m512i shift[4]; /* the bit of qh for block 4 (j / 2) + j % 2 (low half), + 2 (high) */
    for (int j = 0; j < 4; j++)
        shift[j] = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set1_epi16((short)(4 * (j / 2) + j % 2))),
            _mm256_set1_epi16((short)(4 * (j / 2) + j % 2 + 2)), 1);
    const int64_t k = nb * 32, nsb = nb / 8;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* the scale of each word of kt1_dot's packs, from the 8 int16 scales in each 128 bits: q[2h]
     * holds blocks 4h and 4h + 2 (128-bit lanes 0-1 and 2-3), q[2h + 1] blocks 4h + 1 and
     * 4h + 3, and a pack's 128-bit lane has 4 words of each */
    __m512i pick[2];
    for (int h = 0; h < 2; h++) {
        int8_t ix[64];
        for (int t = 0; t < 64; t++)
            ix[t] = (int8_t)(2 * (4 * h + 2 * (t >= 32) + (t % 16 >= 8)) + (t & 1));
        pick[h] = _mm512_loadu_si512(ix);
    }
    if (m < 16) kt1_clear(s, m, nsb, R);
    for (int i = 0; i < m; i++) {
        const char *b = w + (size_t)i * rb;
        const int slot = kt1_slot(i);
        int16_t *mn = s->mn + 8 * slot;
        for (int64_t sb = 0; sb < nsb; sb++, b += bsz, mn += 128) {
            kt1_prefetch(b, 3);
            const __m128i u = k4_scales_v((const uint8_t *)b + 4); /* 8 scales, 8 minimums */
            const __m512i sc16 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(u));
            _mm_storeu_si128((__m128i *)mn, _mm_cvtepu8_epi16(_mm_srli_si128(u, 8)));
            memcpy(s->dd + sb * 16 + i, b, 4); /* d, dmin */
            __m512i q[4], sc[2];
#pragma GCC unroll 2
            for (int j2 = 0; j2 < 2; j2++) {
                const __m512i qv = _mm512_loadu_si512(b + qs_at + 64 * j2);
                q[2 * j2] = _mm512_and_si512(qv, m4);
                q[2 * j2 + 1] = _mm512_and_si512(_mm512_srli_epi16(qv, 4), m4);
            }
            if (FIVE) {
                const __m512i H =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16)));
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    q[j] = _mm512_or_si512(
                        q[j],
                        _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(H, shift[j]), m1), 4));
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) sc[h] = _mm512_shuffle_epi8(sc16, pick[h]);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                kt1_dot(q, sc, a->kt.q1 + r * k + sb * QK_K, _mm512_setzero_si512(),
                        s->I + (((size_t)r * nsb + sb) * 16 + slot) * 4);
        }
    }
    kt1_end(Q_Q4_K, s, m, nsb, &a->xq, k, beta, y, ld_y, R);
}

VNNI512 static inline __attribute__((always_inline)) void kt1_q4_k(const char *w, size_t rb, int m,
                                                                   int64_t nb, const struct q_xq *a,
                                                                   const kt1_s *s, float beta,
                                                                   float *y, int ld_y, const int R)
{
    kt1_k45(w, rb, m, nb, a, s, beta, y, ld_y, false, R);
}

VNNI512 static inline __attribute__((always_inline)) void kt1_q5_k(const char *w, size_t rb, int m,
                                                                   int64_t nb, const struct q_xq *a,
                                                                   const kt1_s *s, float beta,
                                                                   float *y, int ld_y, const int R)
{
    kt1_k45(w, rb, m, nb, a, s, beta, y, ld_y, true, R);
}

/* Q6_K, a few rows: per half of 128 elements, ql's 64 bytes (low nibbles: chunks 0 and 1,
 * high: 2 and 3, x as it lies) with qh's 32 broadcast to both halves and shifted per half to
 * bits 4-5; kt1_dot by the scale of each 16, from -32 x each scale x the sums of x per 16
 * (Q8_K's). The weights are unpacked once for the R rows. */
VNNI512 static inline __attribute__((always_inline)) void kt1_q6_k(const char *w, size_t rb, int m,
                                                                   int64_t nb, const struct q_xq *a,
                                                                   const kt1_s *s, float beta,
                                                                   float *y, int ld_y, const int R)
{
    const xq8 *x = &a->xq;
    const int64_t k = nb * 32, nsb = nb / 8;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(4)), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    /* the scale of each word of kt1_dot's packs: q[2h] holds the 16s 8h .. 8h + 3 (a 128-bit
     * lane each), q[2h + 1] 8h + 4 .. 8h + 7, and a pack's 128-bit lane L has 4 words of each */
    __m512i pick[2];
    for (int h = 0; h < 2; h++) {
        int16_t ix[32];
        for (int t = 0; t < 32; t++) ix[t] = (int16_t)(8 * h + t / 8 + 4 * (t % 8 >= 4));
        pick[h] = _mm512_loadu_si512(ix);
    }
    if (m < 16) kt1_clear(s, m, nsb, R);
    for (int i = 0; i < m; i++) {
        const blk_q6_k *b = (const blk_q6_k *)(w + (size_t)i * rb);
        const int slot = kt1_slot(i);
        for (int64_t sb = 0; sb < nsb; sb++, b++) {
            kt1_prefetch((const char *)b, 4);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
            const __m512i scz = _mm512_inserti64x4(_mm512_castsi256_si512(sc16), sc16, 1);
            const __m256i scn = _mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32));
            s->dd[sb * 16 + i] = b->d;
            __m512i q[4], sc[2];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i L = _mm512_loadu_si512(b->ql + 64 * h);
                const __m512i H =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * h)));
                q[2 * h] = _mm512_ternarylogic_epi32(
                    m4, L, _mm512_and_si512(_mm512_sllv_epi16(H, shl), m30), 0xCA);
                q[2 * h + 1] = _mm512_ternarylogic_epi32(
                    m4, _mm512_srli_epi16(L, 4), _mm512_and_si512(_mm512_srlv_epi16(H, shr), m30),
                    0xCA);
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) sc[h] = _mm512_permutexvar_epi16(pick[h], scz);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m256i off = _mm256_madd_epi16(
                    scn, _mm256_loadu_si256((const __m256i *)(x->ks + r * (k / 16) + sb * 16)));
                kt1_dot(q, sc, x->kq + r * k + sb * QK_K, _mm512_zextsi256_si512(off),
                        s->I + (((size_t)r * nsb + sb) * 16 + slot) * 4);
            }
        }
    }
    kt1_end(Q_Q6_K, s, m, nsb, x, k, beta, y, ld_y, R);
}

/* The bytes of kt1_s for nb blocks of 32 (the scratch of qk_kt1_*), and its parts in buf
 * (64-aligned). */
size_t qk_kt1_bytes(int64_t nb)
{
    return (size_t)(nb / 8) * (KT1_ROWS * 256 + 64 + 256);
}

static kt1_s kt1_carve(char *buf, int64_t nb)
{
    const size_t nsb = (size_t)nb / 8;
    return (kt1_s){.I = (int32_t *)buf,
                   .dd = (int32_t *)(buf + nsb * KT1_ROWS * 256),
                   .mn = (int16_t *)(buf + nsb * (KT1_ROWS * 256 + 64))};
}

#define KT1_DISPATCH(name, kern)                                                                   \
    VNNI512 void name(const char *w, size_t rb, int m, int64_t nb, const struct q_xq *a,           \
                      void *scratch, float beta, float *y, int ld_y)                               \
    {                                                                                              \
        const kt1_s s = kt1_carve(scratch, nb);                                                    \
        switch (a->rows) {                                                                         \
        case 1: kern(w, rb, m, nb, a, &s, beta, y, ld_y, 1); break;                                \
        case 2: kern(w, rb, m, nb, a, &s, beta, y, ld_y, 2); break;                                \
        case 3: kern(w, rb, m, nb, a, &s, beta, y, ld_y, 3); break;                                \
        default: kern(w, rb, m, nb, a, &s, beta, y, ld_y, 4); break;                               \
        }                                                                                          \
    }
KT1_DISPATCH(qk_kt1_q4_k, kt1_q4_k)
KT1_DISPATCH(qk_kt1_q5_k, kt1_q5_k)
KT1_DISPATCH(qk_kt1_q6_k, kt1_q6_k)

#endif /* QK_X86 */
