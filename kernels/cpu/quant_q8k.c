/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_q8k.c — the K types' integer dots as llama.cpp runs them: the activations
 * quantized to Q8_K (per 256 elements one float scale, int8 values, and their sums per 16:
 * ggml's quantize_row_q8_K, its rounding and layout), the weights' sub-block scales kept in
 * integers (one madd widens a block's 16-bit products and multiplies in its 6- or 8-bit
 * scale), one int32 sum per lane and superblock, and one float step per superblock (the
 * weight's d times the activation's). The minimums (Q4_K) meet the activations' sums per 32
 * in integers too, with their own float step per superblock; Q6_K's offset of 32 meets the
 * sums per 16.
 *
 * Against the 8-bit activations per 32 elements of the other types (quant_xq.c) this leaves a
 * quarter of the float work per weight (Zen 1 runs every 256-bit operation as two µops, so
 * batch-1 decode is bound by them, not by memory); the activations are rounded to one scale
 * per 256 (quant.h states the bound).
 *
 * The portable kernels compute each AVX2 lane's integer sum and add the lanes' float steps in
 * the AVX2 order (explicit fmaf where the AVX2 code fuses), so the two paths give the same
 * bits; a row's products do not depend on the rows beside it.
 */
#include "kernels/cpu/quant_internal.h"

bool qk_q8k_type(int type)
{
    return type == Q_Q4_K || type == Q_Q6_K;
}

/* ---- the activations ------------------------------------------------------------------ */

void qk_q8k_row_portable(const float *x, int8_t *q, float *d, int16_t *bs, int64_t k)
{
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K, q += QK_K, bs += 16) {
        float max = 0.0f, amax = 0.0f; /* the first element of the largest magnitude */
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            d[b] = 0.0f;
            memset(q, 0, QK_K);
            memset(bs, 0, 16 * sizeof *bs);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            const int v = (int)nearbyintf(iscale * x[j]);
            q[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += q[16 * g + l];
            bs[g] = (int16_t)s;
        }
        d[b] = 1.0f / iscale;
    }
}

/* Q4_K's eight 6-bit scales (bytes 0-7) and mins (bytes 8-15) from their 12 bytes. */
static inline void k4_scales(const uint8_t *s12, uint32_t u[4])
{
    uint32_t a[3];
    memcpy(a, s12, 12);
    u[3] = ((a[2] >> 4) & 0x0f0f0f0f) | (((a[1] >> 6) & 0x03030303) << 4);
    u[1] = (a[2] & 0x0f0f0f0f) | (((a[0] >> 6) & 0x03030303) << 4);
    u[2] = a[1] & 0x3f3f3f3f;
    u[0] = a[0] & 0x3f3f3f3f;
}

/* The sums of 8 float lanes and of 4, in the order of hsum8 and of the SSE steps below. */
static inline float sum8_lanes(const float a[8])
{
    const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

static inline float sum4_lanes(const float a[4])
{
    return (a[0] + a[2]) + (a[1] + a[3]);
}

/* ---- portable --------------------------------------------------------------------------- */

/* Lane t (0..7) of an AVX2 sum over a chunk of 32 bytes holds bytes 4t..4t+3. */

static float dot_q4_k_portable(const blk_q4_k *w, int64_t nb, const int8_t *xq, const float *xd,
                               const int16_t *xs)
{
    float acc[8] = {0}, accm[4] = {0};
    for (int64_t b = 0; b < nb; b++, xq += QK_K, xs += 16) {
        const float d = qk_f16_to_f32(w[b].d), dmin = qk_f16_to_f32(w[b].dmin), dx = xd[b];
        uint32_t u[4];
        k4_scales(w[b].scales, u);
        const uint8_t *sm = (const uint8_t *)u;
        int32_t lane[8] = {0};
        for (int jj = 0; jj < 4; jj++) {
            const uint8_t *qs = w[b].qs + 32 * jj;
            for (int t = 0; t < 8; t++) {
                int lo = 0, hi = 0;
                for (int e = 4 * t; e < 4 * t + 4; e++) {
                    lo += (qs[e] & 0xF) * xq[64 * jj + e];
                    hi += (qs[e] >> 4) * xq[64 * jj + 32 + e];
                }
                lane[t] += sm[2 * jj] * lo + sm[2 * jj + 1] * hi;
            }
        }
        int32_t prod[4];
        for (int l = 0; l < 4; l++) {
            const int s0 = xs[4 * l] + xs[4 * l + 1], s1 = xs[4 * l + 2] + xs[4 * l + 3];
            prod[l] = sm[8 + 2 * l] * s0 + sm[8 + 2 * l + 1] * s1;
        }
        const float dd = d * dx, dm = -(dmin * dx);
        for (int t = 0; t < 8; t++) acc[t] = fmaf(dd, (float)lane[t], acc[t]);
        for (int l = 0; l < 4; l++) accm[l] = fmaf(dm, (float)prod[l], accm[l]);
    }
    return sum8_lanes(acc) + sum4_lanes(accm);
}

/* The 6-bit value (0..63) of byte e of chunk c (0..3) of half h of a Q6_K block. */
static inline int q6_at(const blk_q6_k *w, int h, int c, int e)
{
    const uint8_t ql = w->ql[64 * h + 32 * (c & 1) + e], qh = w->qh[32 * h + e];
    return (c < 2 ? ql & 0xF : ql >> 4) | ((qh >> (2 * c)) & 3) << 4;
}

static float dot_q6_k_portable(const blk_q6_k *w, int64_t nb, const int8_t *xq, const float *xd,
                               const int16_t *xs)
{
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++, xq += QK_K, xs += 16) {
        const float d = qk_f16_to_f32(w[b].d), dx = xd[b];
        const int8_t *sc = w[b].scales;
        int32_t lane[8];
        for (int t = 0; t < 8; t++)
            lane[t] = -32 * (sc[2 * t] * xs[2 * t] + sc[2 * t + 1] * xs[2 * t + 1]);
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 4; c++)
                for (int t = 0; t < 8; t++) {
                    int s = 0;
                    for (int e = 4 * t; e < 4 * t + 4; e++)
                        s += q6_at(&w[b], h, c, e) * xq[128 * h + 32 * c + e];
                    lane[t] += sc[8 * h + 2 * c + t / 4] * s;
                }
        const float dd = d * dx;
        for (int t = 0; t < 8; t++) acc[t] = fmaf(dd, (float)lane[t], acc[t]);
    }
    return sum8_lanes(acc);
}

void qk_rows_q8k_portable(int type, const void *w, int n, int64_t k, const xq8 *x, int rows,
                          float beta, float *y, int ld_y)
{
    const int64_t nb = k / QK_K;
    const size_t rb = q_row_bytes(type, k);
    for (int i = 0; i < n; i++) {
        const void *row = (const char *)w + (size_t)i * rb;
        for (int r = 0; r < rows; r++) {
            const int8_t *xq = x->kq + (size_t)r * k;
            const float *xd = x->kd + (size_t)r * nb;
            const int16_t *xs = x->ks + (size_t)r * nb * 16;
            const float v = type == Q_Q4_K ? dot_q4_k_portable(row, nb, xq, xd, xs)
                                           : dot_q6_k_portable(row, nb, xq, xd, xs);
            float *yr = y + (size_t)r * ld_y + i;
            *yr = beta == 0.0f ? v : fmaf(beta, *yr, v);
        }
    }
}

/* ---- AVX2 ------------------------------------------------------------------------------- */

#if QK_X86

SIMD void qk_q8k_row_avx2(const float *x, int8_t *q, float *d, int16_t *bs, int64_t k)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K, q += QK_K, bs += 16) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) /* a NaN lane keeps m (the second operand) */
            m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), m);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        if (amax == 0.0f) {
            d[b] = 0.0f;
            memset(q, 0, QK_K);
            memset(bs, 0, 16 * sizeof *bs);
            continue;
        }
        const __m256 va = _mm256_set1_ps(amax);
        int j0 = 0; /* the first element of the largest magnitude, as the scalar loop finds */
        for (int j = 0; j < QK_K; j += 8) {
            const int mk = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), va, _CMP_EQ_OQ));
            if (mk) {
                j0 = j + __builtin_ctz((unsigned)mk);
                break;
            }
        }
        const float iscale = -127.0f / x[j0];
        const __m256 vi = _mm256_set1_ps(iscale);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i v[4];
            for (int t = 0; t < 4; t++)
                v[t] = _mm256_cvtps_epi32(
                    _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * t), vi), rnd));
            /* the packs saturate at 127 (MIN(127, v)); within 128-bit lanes, so permuted */
            __m256i p =
                _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
            p = _mm256_permutevar8x32_epi32(p, perm);
            _mm256_storeu_si256((__m256i *)(q + j), p);
            const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
            __m128i s4 = _mm_hadd_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            s4 = _mm_hadd_epi32(s4, s4);
            bs[j / 16] = (int16_t)_mm_cvtsi128_si32(s4);
            bs[j / 16 + 1] = (int16_t)_mm_extract_epi32(s4, 1);
        }
        d[b] = 1.0f / iscale;
    }
}

/* 16 int16 lanes of the int16 at index j of v (a pshufb within each 128-bit half). */
SIMD static inline __m256i bcast16(__m256i v, int j)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)((2 * j) | (2 * j + 1) << 8)));
}

/* R activation rows (a constant) times the n weight rows of `type` (a constant). */
SIMD static inline __attribute__((always_inline)) void rows_q8k_r(const int type, const char *w,
                                                                  int n, int64_t k, const xq8 *x,
                                                                  float beta, float *y, int ld_y,
                                                                  const int R)
{
    const int64_t nb = k / QK_K;
    const size_t rb = q_row_bytes(type, k);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    for (int i = 0; i < n; i++) {
        const char *row = w + (size_t)i * rb;
        __m256 acc[Q8_GROUP_ROWS];
        __m128 accm[Q8_GROUP_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_setzero_ps();
            accm[r] = _mm_setzero_ps();
        }
        for (int64_t b = 0; b < nb; b++) {
            __m256i sumi[Q8_GROUP_ROWS];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
            float dw;
            if (type == Q_Q4_K) {
                const blk_q4_k *blk = (const blk_q4_k *)row + b;
                dw = _cvtsh_ss(blk->d);
                const float dmin = _cvtsh_ss(blk->dmin);
                uint32_t u[4];
                k4_scales(blk->scales, u);
                const __m256i sm = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)u));
                const __m128i mins = _mm256_extracti128_si256(sm, 1);
                const __m256i scales = _mm256_permute2x128_si256(sm, sm, 0x00);
#pragma GCC unroll 4
                for (int jj = 0; jj < 4; jj++) {
                    const __m256i qv = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * jj));
                    const __m256i lo = _mm256_and_si256(qv, m4);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
                    const __m256i sl = bcast16(scales, 2 * jj), sh = bcast16(scales, 2 * jj + 1);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        const int8_t *xr = x->kq + (size_t)r * k + b * QK_K + 64 * jj;
                        const __m256i pl = _mm256_madd_epi16(
                            sl, _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xr)));
                        const __m256i ph = _mm256_madd_epi16(
                            sh, _mm256_maddubs_epi16(
                                    hi, _mm256_loadu_si256((const __m256i *)(xr + 32))));
                        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(pl, ph));
                    }
                }
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const float dx = x->kd[(size_t)r * nb + b];
                    const __m256i bsv = _mm256_loadu_si256(
                        (const __m256i *)(x->ks + ((size_t)r * nb + (size_t)b) * 16));
                    const __m128i s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bsv),
                                                       _mm256_extracti128_si256(bsv, 1));
                    accm[r] = _mm_fmadd_ps(_mm_set1_ps(-(dmin * dx)),
                                           _mm_cvtepi32_ps(_mm_madd_epi16(mins, s32)), accm[r]);
                }
            } else { /* Q_Q6_K */
                const blk_q6_k *blk = (const blk_q6_k *)row + b;
                dw = _cvtsh_ss(blk->d);
                const __m128i sc8 = _mm_loadu_si128((const __m128i *)blk->scales);
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256i A = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h));
                    const __m256i B = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h + 32));
                    const __m256i H = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h));
                    __m256i q[4], sc[4];
                    q[0] = _mm256_or_si256(_mm256_and_si256(A, m4),
                                           _mm256_slli_epi16(_mm256_and_si256(H, m3), 4));
                    q[1] = _mm256_or_si256(
                        _mm256_and_si256(B, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), m3), 4));
                    q[2] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(A, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), m3), 4));
                    q[3] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), m3), 4));
#pragma GCC unroll 4
                    for (int c = 0; c < 4; c++) { /* int16 lanes 0-7: scale 8h+2c, 8-15: +1 */
                        const int g = 8 * h + 2 * c;
                        sc[c] = _mm256_cvtepi8_epi16(
                            _mm_shuffle_epi8(sc8, _mm_set_epi64x(0x0101010101010101LL * (g + 1),
                                                                 0x0101010101010101LL * g)));
                    }
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++) {
                        const int8_t *xr = x->kq + (size_t)r * k + b * QK_K + 128 * h;
#pragma GCC unroll 4
                        for (int c = 0; c < 4; c++)
                            sumi[r] = _mm256_add_epi32(
                                sumi[r],
                                _mm256_madd_epi16(
                                    sc[c],
                                    _mm256_maddubs_epi16(
                                        q[c], _mm256_loadu_si256((const __m256i *)(xr + 32 * c)))));
                    }
                }
                /* the offset of 32: 32 x sum of scale x (the activations' sum) per 16 */
                const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const __m256i bsv = _mm256_loadu_si256(
                        (const __m256i *)(x->ks + ((size_t)r * nb + (size_t)b) * 16));
                    sumi[r] = _mm256_sub_epi32(sumi[r],
                                               _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsv), 5));
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x->kd[(size_t)r * nb + b]),
                                         _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            float v = hsum8(acc[r]);
            if (type == Q_Q4_K) {
                __m128 m = _mm_add_ps(accm[r], _mm_movehl_ps(accm[r], accm[r]));
                m = _mm_add_ss(m, _mm_movehdup_ps(m));
                v += _mm_cvtss_f32(m);
            }
            float *yr = y + (size_t)r * ld_y + i;
            *yr = beta == 0.0f ? v : fmaf(beta, *yr, v);
        }
    }
}

#define Q8K_TYPE(name, T)                                                                          \
    SIMD static void name(const char *w, int n, int64_t k, const xq8 *x, int rows, float beta,     \
                          float *y, int ld_y)                                                      \
    {                                                                                              \
        switch (rows) {                                                                            \
        case 1: rows_q8k_r(T, w, n, k, x, beta, y, ld_y, 1); break;                                \
        case 2: rows_q8k_r(T, w, n, k, x, beta, y, ld_y, 2); break;                                \
        case 3: rows_q8k_r(T, w, n, k, x, beta, y, ld_y, 3); break;                                \
        case 4: rows_q8k_r(T, w, n, k, x, beta, y, ld_y, 4); break;                                \
        case 5: rows_q8k_r(T, w, n, k, x, beta, y, ld_y, 5); break;                                \
        case 6: rows_q8k_r(T, w, n, k, x, beta, y, ld_y, 6); break;                                \
        case 7: rows_q8k_r(T, w, n, k, x, beta, y, ld_y, 7); break;                                \
        default: rows_q8k_r(T, w, n, k, x, beta, y, ld_y, 8); break;                               \
        }                                                                                          \
    }
Q8K_TYPE(rows_q4_k, Q_Q4_K)
Q8K_TYPE(rows_q6_k, Q_Q6_K)

SIMD void qk_rows_q8k_avx2(int type, const void *w, int n, int64_t k, const xq8 *x, int rows,
                           float beta, float *y, int ld_y)
{
    (type == Q_Q4_K ? rows_q4_k : rows_q6_k)(w, n, k, x, rows, beta, y, ld_y);
}

#endif /* QK_X86 */
