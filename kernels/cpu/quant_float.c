/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_float.c — F32, F16 and BF16 weights: the conversions (exact, round to
 * nearest even), the fused dots (portable C; AVX2 + FMA + F16C), and F16 rows to floats with
 * F16C for the batch path's tiles.
 */
#include "kernels/cpu/quant_internal.h"

float q_f16_to_f32(uint16_t h)
{
    return qk_f16_to_f32(h);
}

uint16_t q_f32_to_f16(float f)
{
    return qk_f32_to_f16(f);
}

float q_bf16_to_f32(uint16_t h)
{
    return qk_bf16_to_f32(h);
}

uint16_t q_f32_to_bf16(float f)
{
    return qk_f32_to_bf16(f);
}

/* ---- fused dot, portable ------------------------------------------------------------ */

float qk_dot_float_portable(int type, const void *row, const float *x, int64_t k)
{
    float sum = 0.0f;
    switch (type) {
    case Q_F32: {
        const float *w = row;
        for (int64_t i = 0; i < k; i++) sum += w[i] * x[i];
        break;
    }
    case Q_F16: {
        const uint16_t *w = row;
        for (int64_t i = 0; i < k; i++) sum += qk_f16_to_f32(w[i]) * x[i];
        break;
    }
    case Q_BF16: {
        const uint16_t *w = row;
        for (int64_t i = 0; i < k; i++) sum += qk_bf16_to_f32(w[i]) * x[i];
        break;
    }
    }
    return sum;
}

#if QK_X86

/* ---- fused dot, AVX2 + FMA + F16C --------------------------------------------------- */

/* A row of F16 weights as floats with F16C, 8 at a time (exact, as the scalar conversion):
 * the tiles of q_matmul's batch path convert every weight of the model each step, and the
 * scalar conversion made F16 decode of 8 sequences slower than of one. */
SIMD void qk_dequant_f16_avx2(const uint16_t *h, float *out, int64_t k)
{
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < k; i++) out[i] = qk_f16_to_f32(h[i]);
}

/* A row of BF16 weights as floats, 8 at a time: the half shifted into the high bits. */
SIMD void qk_dequant_bf16_avx2(const uint16_t *h, float *out, int64_t k)
{
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < k; i++) out[i] = qk_bf16_to_f32(h[i]);
}

/* 8 halves at h as floats: F16 through F16C, BF16 shifted into the high bits (both exact). */
static inline __attribute__((always_inline)) SIMD __m256 half8(int type, const uint16_t *h)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)h);
    if (type == Q_F16) return _mm256_cvtph_ps(v);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

/* gemm_small's reduction (gemm_small.c, reduce4): lane j of the result is
 * ((a_j0+a_j1)+(a_j2+a_j3)) + ((a_j4+a_j5)+(a_j6+a_j7)). */
static inline __attribute__((always_inline)) SIMD __m128 reduce4(__m256 a0, __m256 a1, __m256 a2,
                                                                 __m256 a3)
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* The half tiles' software prefetch distance, in tiles of 4 weight rows. */
#ifndef HALF_PF_TILES
#define HALF_PF_TILES 2
#endif

/* nr (1 or 4) weight rows by mr (1..4) activation rows, gemm_small's AVX2 tile (gemm_small.c,
 * tile_avx2) with the weights converted in registers: 8 lanes, lane j summing k = j mod 8 in
 * one multiply-add chain, the last step zero-padded, reduce4 at the end. With pf, the 4 rows
 * at pf (the tile HALF_PF_TILES ahead) are prefetched, one cache line of each per 32 halves,
 * as gemm_small prefetches float32 rows: the hardware prefetcher alone kept one thread at
 * 3.5-3.9 GMAC/s at one activation row, with the prefetch 4.5-5.3 (perf/quant_bench --types
 * F16,BF16 --rows 1 --clock cpu, at load 7; 1 to 8 tiles ahead measured alike). */
static inline __attribute__((always_inline)) SIMD void
half_tile(int type, int nr, int mr, int K, const uint16_t *w, size_t ld_w, const float *x,
          float beta, float *y, int ld_y, const uint16_t *pf)
{
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int n = 0; n < nr; n++)
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) acc[n][m] = _mm256_setzero_ps();
    const int K8 = K & ~7;
    for (int k = 0; k < K8; k += 8) {
        __m256 wv[4];
        if (pf && !(k & 31)) {
#pragma GCC unroll 4
            for (int n = 0; n < 4; n++)
                _mm_prefetch((const char *)(pf + (size_t)n * ld_w + k), _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int n = 0; n < nr; n++) wv[n] = half8(type, w + (size_t)n * ld_w + k);
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)m * K + k);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++) acc[n][m] = _mm256_fmadd_ps(xv, wv[n], acc[n][m]);
        }
    }
    if (K8 < K) {
        float xt[4][8] = {{0}}, wt[4][8] = {{0}};
        for (int m = 0; m < mr; m++)
            for (int j = 0; j < K - K8; j++) xt[m][j] = x[(size_t)m * K + K8 + j];
        for (int n = 0; n < nr; n++)
            for (int j = 0; j < K - K8; j++) {
                const uint16_t h = w[(size_t)n * ld_w + K8 + j];
                wt[n][j] = type == Q_F16 ? qk_f16_to_f32(h) : qk_bf16_to_f32(h);
            }
#pragma GCC unroll 4
        for (int m = 0; m < mr; m++) {
            const __m256 xv = _mm256_loadu_ps(xt[m]);
#pragma GCC unroll 4
            for (int n = 0; n < nr; n++)
                acc[n][m] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wt[n]), acc[n][m]);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < mr; m++) {
        float *out = y + (size_t)m * ld_y;
        if (nr == 4) {
            __m128 s = reduce4(acc[0][m], acc[1][m], acc[2][m], acc[3][m]);
            if (beta != 0.0f) s = _mm_add_ps(_mm_loadu_ps(out), s);
            _mm_storeu_ps(out, s);
        } else {
            float s = _mm_cvtss_f32(reduce4(acc[0][m], acc[0][m], acc[0][m], acc[0][m]));
            out[0] = beta == 0.0f ? s : out[0] + s;
        }
    }
}

#define HALF_ROWS(T_, MR_)                                                                         \
    do {                                                                                           \
        int n0 = 0;                                                                                \
        for (; n0 + 4 <= n; n0 += 4) {                                                             \
            const uint16_t *pf_ = n0 + (HALF_PF_TILES + 1) * 4 <= n                                \
                                      ? w + (size_t)(n0 + HALF_PF_TILES * 4) * k                   \
                                      : NULL;                                                      \
            half_tile(T_, 4, MR_, k, w + (size_t)n0 * k, (size_t)k, x, beta, y + n0, ld_y, pf_);   \
        }                                                                                          \
        for (; n0 < n; n0++)                                                                       \
            half_tile(T_, 1, MR_, k, w + (size_t)n0 * k, (size_t)k, x, beta, y + n0, ld_y, NULL);  \
    } while (0)

SIMD void qk_rows_half_avx2(int type, const uint16_t *w, int n, int k, const float *x, int rows,
                            float beta, float *y, int ld_y)
{
    const bool f16 = type == Q_F16;
    switch (rows) {
    case 1:
        if (f16)
            HALF_ROWS(Q_F16, 1);
        else
            HALF_ROWS(Q_BF16, 1);
        break;
    case 2:
        if (f16)
            HALF_ROWS(Q_F16, 2);
        else
            HALF_ROWS(Q_BF16, 2);
        break;
    case 3:
        if (f16)
            HALF_ROWS(Q_F16, 3);
        else
            HALF_ROWS(Q_BF16, 3);
        break;
    default:
        if (f16)
            HALF_ROWS(Q_F16, 4);
        else
            HALF_ROWS(Q_BF16, 4);
    }
}

SIMD float qk_dot_float_avx2(int type, const void *row, const float *x, int64_t k)
{
    __m256 acc = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
    switch (type) {
    case Q_F32: {
        const float *w = row;
        int64_t i = 0;
        for (; i + 16 <= k; i += 16) {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), acc);
            acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), acc2);
        }
        float tail = 0.0f;
        for (; i < k; i++) tail += w[i] * x[i];
        return hsum8(_mm256_add_ps(acc, acc2)) + tail;
    }
    case Q_F16: {
        const uint16_t *w = row;
        int64_t i = 0;
        for (; i + 8 <= k; i += 8)
            acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))),
                                  _mm256_loadu_ps(x + i), acc);
        float tail = 0.0f;
        for (; i < k; i++) tail += qk_f16_to_f32(w[i]) * x[i];
        return hsum8(acc) + tail;
    }
    case Q_BF16: {
        const uint16_t *w = row;
        int64_t i = 0;
        for (; i + 8 <= k; i += 8) {
            __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i)));
            acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)),
                                  _mm256_loadu_ps(x + i), acc);
        }
        float tail = 0.0f;
        for (; i < k; i++) tail += qk_bf16_to_f32(w[i]) * x[i];
        return hsum8(acc) + tail;
    }
    }
    return 0.0f;
}

#endif /* QK_X86 */
