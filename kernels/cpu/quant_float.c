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
