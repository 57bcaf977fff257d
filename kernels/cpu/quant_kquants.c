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

/* Q4_K scales: per 256 elements, d, dmin and the 6-bit (scale, min) pairs unpacked in
 * vectors (as scale_min_k4): t->a = d sc_j, t->m = dmin m_j. */
VNNI512 void qk_vt_scales_q4_k(const char *w, size_t rb, int m, int64_t nb, const vt_w *t)
{
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    const __m512i idx = vt_row_offsets(rb), z = _mm512_setzero_si512();
    const __m512i m6 = _mm512_set1_epi32(63), m2 = _mm512_set1_epi32(3),
                  m4s = _mm512_set1_epi32(15);
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const char *base = w + sb * (int64_t)sizeof(blk_q4_k);
        const __m512i dd = _mm512_mask_i32gather_epi32(z, mask, idx, base, 1);
        const __m512 d = vt_f16x16(dd), dmin = vt_f16x16(_mm512_srli_epi32(dd, 16));
        const __m512i D0 = _mm512_mask_i32gather_epi32(z, mask, idx, base + 4, 1);
        const __m512i D1 = _mm512_mask_i32gather_epi32(z, mask, idx, base + 8, 1);
        const __m512i D2 = _mm512_mask_i32gather_epi32(z, mask, idx, base + 12, 1);
        float *a = t->a + sb * 8 * 16, *mm = t->m + sb * 8 * 16;
        for (int j = 0; j < 4; j++) {
            const __m512i b0 = _mm512_srli_epi32(D0, 8 * j), b1 = _mm512_srli_epi32(D1, 8 * j);
            const __m512i b2 = _mm512_srli_epi32(D2, 8 * j);
            const __m512i sc = _mm512_and_si512(b0, m6), mn = _mm512_and_si512(b1, m6);
            const __m512i sc4 = _mm512_or_si512(
                _mm512_and_si512(b2, m4s),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b0, 6), m2), 4));
            const __m512i mn4 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32(b2, 4), m4s),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b1, 6), m2), 4));
            _mm512_storeu_ps(a + j * 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
            _mm512_storeu_ps(mm + j * 16, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn)));
            _mm512_storeu_ps(a + (j + 4) * 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc4)));
            _mm512_storeu_ps(mm + (j + 4) * 16, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn4)));
        }
    }
}

/* Q4_K: the scales as above, and the nibbles of each 32 bytes as two blocks. */
VNNI512 void qk_vt_pack_q4_k(const char *w, size_t rb, int m, int64_t nb, const vt_w *t)
{
    const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
    qk_vt_scales_q4_k(w, rb, m, nb, t);
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const char *base = w + sb * (int64_t)sizeof(blk_q4_k);
        for (int jj = 0; jj < 4; jj++) {
            __m512i v[8];
            vt_transpose(base + 16 + 32 * jj, rb, m, v);
            for (int g = 0; g < 8; g++) {
                _mm512_storeu_si512(t->q + ((sb * 8 + 2 * jj) * 8 + g) * 64,
                                    _mm512_and_si512(v[g], m4));
                _mm512_storeu_si512(t->q + ((sb * 8 + 2 * jj + 1) * 8 + g) * 64,
                                    _mm512_and_si512(_mm512_srli_epi32(v[g], 4), m4));
            }
        }
    }
}

/* Q6_K: per 256 elements, d (read as the upper half of the dword ending the block), the
 * sixteen int8 scales, and the 6-bit values of each 32-element chunk (see Q6K_ROWS_KERNEL). */
/* Q6_K scales: t->a = d for every block of 32; with sc, t->sc = the two int8 scales of
 * each (their 16 elements). */
VNNI512 void qk_vt_scales_q6_k(const char *w, size_t rb, int m, int64_t nb, const vt_w *t, bool sc)
{
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    const __m512i idx = vt_row_offsets(rb), z = _mm512_setzero_si512();
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const char *base = w + sb * (int64_t)sizeof(blk_q6_k);
        const __m512 d = vt_f16x16(
            _mm512_srli_epi32(_mm512_mask_i32gather_epi32(z, mask, idx, base + 206, 1), 16));
        __m512i S[4];
        for (int i = 0; i < 4 && sc; i++)
            S[i] = _mm512_mask_i32gather_epi32(z, mask, idx, base + 192 + 4 * i, 1);
        for (int c32 = 0; c32 < 8; c32++) {
            const int64_t b = sb * 8 + c32;
            _mm512_storeu_ps(t->a + b * 16, d);
            for (int hh = 0; hh < 2 && sc; hh++) {
                const int G = 2 * c32 + hh; /* scales[G], a signed byte */
                _mm512_storeu_si512(
                    t->sc + (b * 2 + hh) * 16,
                    _mm512_srai_epi32(_mm512_slli_epi32(S[G / 4], 24 - 8 * (G % 4)), 24));
            }
        }
    }
}

VNNI512 void qk_vt_pack_q6_k(const char *w, size_t rb, int m, int64_t nb, const vt_w *t)
{
    const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
    const __m512i m2 = _mm512_set1_epi32(0x03030303);
    qk_vt_scales_q6_k(w, rb, m, nb, t, true);
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const char *base = w + sb * (int64_t)sizeof(blk_q6_k);
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

/* One weight row after the other, as for Q8_0 (quant_q8_0.c): the 8 blocks of each 256
 * elements summed together. Q4_K: each 32 bytes of q are [low nibbles | high nibbles], the two
 * blocks they hold. */
VNNI512 static inline __attribute__((always_inline)) void
vt1_sums_q4_k(const char *w, size_t rb, int m, int64_t nb, const vt_x *x, const int R, int32_t *S)
{
    const int64_t ld = vt1_stride(nb);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < m; i++) {
        const char *wr = w + (size_t)i * rb;
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const char *base = wr + sb * (int64_t)sizeof(blk_q4_k);
            __m256i q[8];
#pragma GCC unroll 4
            for (int jj = 0; jj < 4; jj++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(base + 16 + 32 * jj));
                q[2 * jj] = _mm256_and_si256(v, m4);
                q[2 * jj + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i v[8];
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++)
                    v[j] = _mm256_dpbusd_epi32(
                        _mm256_setzero_si256(), q[j],
                        _mm256_loadu_si256(
                            (const __m256i *)(x->q + ((sb * 8 + j) * x->rows + r) * 32)));
                _mm256_storeu_si256((__m256i *)(S + (r * 16 + i) * ld + sb * 8), vt1_reduce(v));
            }
        }
    }
}

VNNI512 void qk_vt1_sums_q4_k(const char *w, size_t rb, int m, int64_t nb, const vt_x *x,
                              const int16_t *x32, int R, int32_t *S, const vt_w *t)
{
    (void)x32, (void)t;
    VT1_BY_ROWS(R, vt1_sums_q4_k, w, rb, m, nb, x, S);
}

/* Q6_K: per half of 128 elements, its four blocks as 6-bit values (Q6K_ROWS_KERNEL's
 * chunks); maddubs pairs minus 32 x the pair sums of x (x32) are the pairs of (q - 32) x, and
 * one madd with the block's two 16-element scales gives vt_kernel's scaled block sums. */
VNNI512 static inline __attribute__((always_inline)) void
vt1_sums_q6_k(const char *w, size_t rb, int m, int64_t nb, const vt_x *x, const int R, int32_t *S,
              const int16_t *x32)
{
    const int64_t ld = vt1_stride(nb);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256i pick[8]; /* block j's scales: words 2j (lanes 0-7) and 2j + 1 (lanes 8-15) */
    for (int j = 0; j < 8; j++)
        pick[j] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)(2 * j))),
                                          _mm_set1_epi16((short)(2 * j + 1)), 1);
    for (int i = 0; i < m; i++) {
        const char *wr = w + (size_t)i * rb;
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const char *base = wr + sb * (int64_t)sizeof(blk_q6_k);
            const __m256i sc16 =
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(base + 192)));
            __m256i q[8];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(base + 64 * h));
                const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(base + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(base + 128 + 32 * h));
                /* low nibble from ql (or ql >> 4), bits 4-5 from qh: ternary blend on m4 */
                q[4 * h] = _mm256_ternarylogic_epi32(
                    m4, ql0, _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30), 0xCA);
                q[4 * h + 1] = _mm256_ternarylogic_epi32(
                    m4, ql1, _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30), 0xCA);
                q[4 * h + 2] = _mm256_ternarylogic_epi32(m4, _mm256_srli_epi16(ql0, 4),
                                                         _mm256_and_si256(qh, m30), 0xCA);
                q[4 * h + 3] = _mm256_ternarylogic_epi32(
                    m4, _mm256_srli_epi16(ql1, 4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
                    0xCA);
            }
            __m256i sc[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) sc[j] = _mm256_permutexvar_epi16(pick[j], sc16);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i v[8];
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    const int64_t xb = (sb * 8 + j) * x->rows + r;
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q + xb * 32));
                    const __m256i z = _mm256_loadu_si256((const __m256i *)(x32 + xb * 16));
                    v[j] = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q[j], xv), z),
                                             sc[j]);
                }
                _mm256_storeu_si256((__m256i *)(S + (r * 16 + i) * ld + sb * 8), vt1_reduce(v));
            }
        }
    }
}

VNNI512 void qk_vt1_sums_q6_k(const char *w, size_t rb, int m, int64_t nb, const vt_x *x,
                              const int16_t *x32, int R, int32_t *S, const vt_w *t)
{
    (void)t;
    VT1_BY_ROWS(R, vt1_sums_q6_k, w, rb, m, nb, x, S, x32);
}

#endif /* QK_X86 */
