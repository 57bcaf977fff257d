/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_q8k.c — the K types' integer dots as llama.cpp runs them: the activations
 * quantized to Q8_K (per 256 elements one float scale, int8 values, and their sums per 16:
 * ggml's quantize_row_q8_K, its rounding and layout), the weights' sub-block scales kept in
 * integers (one madd widens a block's 16-bit products and multiplies in its 6- or 8-bit
 * scale), one int32 sum per lane and superblock, and one float step per superblock (the
 * weight's d times the activation's). The minimums meet the activations' sums in integers
 * too (Q4_K's and Q5_K's per 32, Q2_K's per 16), with their own float step per superblock;
 * the zero points of the unsigned values (Q6_K's 32, Q3_K's 4) meet the sums per 16; IQ4_XS's
 * signed grid values are dotted with the sign trick (|q| times x with q's sign).
 *
 * Against the 8-bit activations per 32 elements of the other types (quant_xq.c) this leaves
 * one float step per 256 weights instead of one (or two) per 32 (Zen 1 runs every 256-bit
 * operation as two µops, so batch-1 decode is bound by them, not by memory); the activations
 * are rounded to one scale per 256 (quant.h states the bound).
 *
 * The portable kernels compute each AVX2 lane's integer sum and add the lanes' float steps in
 * the AVX2 order (explicit fmaf where the AVX2 code fuses), so the two paths give the same
 * bits; a row's products do not depend on the rows beside it.
 */
#include "kernels/cpu/quant_internal.h"

bool qk_q8k_type(int type)
{
    return type == Q_Q4_K || type == Q_Q6_K || type == Q_Q5_K || type == Q_Q3_K || type == Q_Q2_K ||
           type == Q_IQ4_XS;
}

bool q_reads_q8k(int type)
{
    return qk_q8k_type(type);
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

/* One superblock as the AVX2 kernels see it: the value of each element (the bytes maddubs
 * multiplies: 0..63, or IQ4_XS's signed grid), the integer scale of each 16 elements, the
 * minimums (Q2_K per 16, Q4_K and Q5_K per 32 in mn[0..7]), d and dmin. */
typedef struct kblk {
    int v[QK_K];
    int sc[16];
    int mn[16];
    float d, dmin;
} kblk;

/* Q3_K's sixteen 6-bit scales from their 12 bytes, less their bias 32. */
static inline void q3k_scales_signed(const uint8_t *s12, int8_t out[16])
{
    uint8_t u[16];
    q3k_scales(s12, u);
    for (int g = 0; g < 16; g++) out[g] = (int8_t)(u[g] - 32);
}

/* IQ4_XS's eight 6-bit scales less their bias 32. */
static inline int iq4xs_scale(const blk_iq4_xs *x, int ib)
{
    return (((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((x->scales_h >> 2 * ib) & 3) << 4)) -
           32;
}

static void kblk_of(int type, const void *row, int64_t b, kblk *o)
{
    switch (type) {
    case Q_Q4_K:
    case Q_Q5_K: {
        const blk_q4_k *x4 = (const blk_q4_k *)row + b;
        const blk_q5_k *x5 = (const blk_q5_k *)row + b;
        const bool five = type == Q_Q5_K;
        const uint8_t *qs = five ? x5->qs : x4->qs;
        o->d = qk_f16_to_f32(five ? x5->d : x4->d);
        o->dmin = qk_f16_to_f32(five ? x5->dmin : x4->dmin);
        uint32_t u[4];
        k4_scales(five ? x5->scales : x4->scales, u);
        const uint8_t *sm = (const uint8_t *)u;
        for (int j = 0; j < 8; j++) {
            o->sc[2 * j] = o->sc[2 * j + 1] = sm[j];
            o->mn[j] = sm[8 + j];
        }
        for (int jj = 0; jj < 4; jj++)
            for (int e = 0; e < 32; e++) {
                int lo = qs[32 * jj + e] & 0xF, hi = qs[32 * jj + e] >> 4;
                if (five) {
                    lo |= ((x5->qh[e] >> (2 * jj)) & 1) << 4;
                    hi |= ((x5->qh[e] >> (2 * jj + 1)) & 1) << 4;
                }
                o->v[64 * jj + e] = lo;
                o->v[64 * jj + 32 + e] = hi;
            }
        break;
    }
    case Q_Q6_K: {
        const blk_q6_k *x = (const blk_q6_k *)row + b;
        o->d = qk_f16_to_f32(x->d);
        for (int g = 0; g < 16; g++) o->sc[g] = x->scales[g];
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 4; c++)
                for (int e = 0; e < 32; e++) {
                    const uint8_t ql = x->ql[64 * h + 32 * (c & 1) + e], qh = x->qh[32 * h + e];
                    o->v[128 * h + 32 * c + e] =
                        (c < 2 ? ql & 0xF : ql >> 4) | ((qh >> (2 * c)) & 3) << 4;
                }
        break;
    }
    case Q_Q3_K: {
        const blk_q3_k *x = (const blk_q3_k *)row + b;
        int8_t sc[16];
        q3k_scales_signed(x->scales, sc);
        o->d = qk_f16_to_f32(x->d);
        for (int g = 0; g < 16; g++) o->sc[g] = sc[g];
        for (int c = 0; c < 8; c++)
            for (int e = 0; e < 32; e++)
                o->v[32 * c + e] = ((x->qs[32 * (c / 4) + e] >> (2 * (c % 4))) & 3) |
                                   ((x->hmask[e] >> c) & 1) << 2;
        break;
    }
    case Q_Q2_K: {
        const blk_q2_k *x = (const blk_q2_k *)row + b;
        o->d = qk_f16_to_f32(x->d);
        o->dmin = qk_f16_to_f32(x->dmin);
        for (int g = 0; g < 16; g++) {
            o->sc[g] = x->scales[g] & 0xF;
            o->mn[g] = x->scales[g] >> 4;
        }
        for (int c = 0; c < 8; c++)
            for (int e = 0; e < 32; e++)
                o->v[32 * c + e] = (x->qs[32 * (c / 4) + e] >> (2 * (c % 4))) & 3;
        break;
    }
    default: { /* Q_IQ4_XS */
        const blk_iq4_xs *x = (const blk_iq4_xs *)row + b;
        o->d = qk_f16_to_f32(x->d);
        for (int ib = 0; ib < 8; ib++) {
            o->sc[2 * ib] = o->sc[2 * ib + 1] = iq4xs_scale(x, ib);
            for (int e = 0; e < 16; e++) {
                o->v[32 * ib + e] = qk_iq4nl_values[x->qs[16 * ib + e] & 0xF];
                o->v[32 * ib + 16 + e] = qk_iq4nl_values[x->qs[16 * ib + e] >> 4];
            }
        }
        break;
    }
    }
}

/* A weight row times an activation row: per superblock, the integer sum of each AVX2 lane
 * (lane t holds bytes 4t..4t+3 of every chunk of 32 elements), less the offset (Q6_K's 32,
 * Q3_K's 4, met by the sums per 16), each lane's float step, and the minimums' (4 lanes); the
 * lanes then added in the order of hsum8. */
static float dot_q8k_portable(int type, const void *row, int64_t nb, const int8_t *xq,
                              const float *xd, const int16_t *xs)
{
    const int off = type == Q_Q6_K ? 32 : type == Q_Q3_K ? 4 : 0;
    const bool mins32 = type == Q_Q4_K || type == Q_Q5_K, mins16 = type == Q_Q2_K;
    float acc[8] = {0}, accm[4] = {0};
    kblk kb;
    for (int64_t b = 0; b < nb; b++, xq += QK_K, xs += 16) {
        kblk_of(type, row, b, &kb);
        int32_t lane[8];
        for (int t = 0; t < 8; t++)
            lane[t] = -off * (kb.sc[2 * t] * xs[2 * t] + kb.sc[2 * t + 1] * xs[2 * t + 1]);
        for (int c = 0; c < 8; c++)
            for (int t = 0; t < 8; t++) {
                int s = 0;
                for (int e = 32 * c + 4 * t; e < 32 * c + 4 * t + 4; e++) s += kb.v[e] * xq[e];
                lane[t] += kb.sc[2 * c + t / 4] * s;
            }
        const float dx = xd[b], dd = kb.d * dx;
        for (int t = 0; t < 8; t++) acc[t] = fmaf(dd, (float)lane[t], acc[t]);
        if (mins32 || mins16) {
            const float dm = -(kb.dmin * dx);
            for (int l = 0; l < 4; l++) {
                const int p =
                    mins32
                        ? kb.mn[2 * l] * (xs[4 * l] + xs[4 * l + 1]) +
                              kb.mn[2 * l + 1] * (xs[4 * l + 2] + xs[4 * l + 3])
                        : (kb.mn[2 * l] * xs[2 * l] + kb.mn[2 * l + 1] * xs[2 * l + 1]) +
                              (kb.mn[2 * l + 8] * xs[2 * l + 8] + kb.mn[2 * l + 9] * xs[2 * l + 9]);
                accm[l] = fmaf(dm, (float)p, accm[l]);
            }
        }
    }
    return mins32 || mins16 ? sum8_lanes(acc) + sum4_lanes(accm) : sum8_lanes(acc);
}

void qk_rows_q8k_portable(int type, const void *w, int n, int64_t k, const xq8 *x, int rows,
                          float beta, float *y, int ld_y)
{
    const int64_t nb = k / QK_K;
    const size_t rb = q_row_bytes(type, k);
    for (int i = 0; i < n; i++) {
        const void *row = (const char *)w + (size_t)i * rb;
        for (int r = 0; r < rows; r++) {
            const float v = dot_q8k_portable(type, row, nb, x->kq + (size_t)r * k,
                                             x->kd + (size_t)r * nb, x->ks + (size_t)r * nb * 16);
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

/* Bits from..from+width-1 of each byte of v moved to bits to..to+width-1, the others cleared
 * (16-bit shifts: the bits that cross into the neighbouring byte are masked off). */
SIMD static inline __m256i bits_to(__m256i v, const int from, const int to, const int width)
{
    const __m256i m = _mm256_set1_epi8((char)(((1 << width) - 1) << to));
    return _mm256_and_si256(
        from <= to ? _mm256_slli_epi16(v, to - from) : _mm256_srli_epi16(v, from - to), m);
}

/* The 32 nibbles of 16 bytes: low nibbles (elements 0-15), then high (16-31). */
SIMD static inline __m256i nib32(const uint8_t *qs)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

/* The AVX2 kernels make each superblock's scales in registers from the block's bytes: the
 * scalar unpacking stored them byte by byte (or word by word) and loaded them as one vector,
 * a load no store forwards to, so every superblock waited for those stores to retire (IQ4_XS's
 * rows took 1.5x the time of ggml's dot, Q3_K's 1.15x). */

/* Q3_K's sixteen 6-bit scales less their bias 32 (q3k_scales_signed), int8. */
SIMD static inline __m128i q3k_scales_v(const blk_q3_k *x)
{
    /* 16 bytes ending with d (the block's last), moved down 2: a0 a1 a2 d */
    const __m128i a = _mm_srli_si128(_mm_loadu_si128((const __m128i *)(x->scales - 2)), 2);
    const __m128i lo = _mm_and_si128(
        _mm_srlv_epi32(_mm_shuffle_epi32(a, _MM_SHUFFLE(1, 0, 1, 0)), _mm_setr_epi32(0, 0, 4, 4)),
        _mm_set1_epi8(0x0F));
    /* bits 2j, 2j + 1 of each byte of a2 to bits 4-5: a2 << 4, << 2, as it is, >> 2 */
    const __m128i a2 = _mm_shuffle_epi32(a, _MM_SHUFFLE(2, 2, 2, 2));
    const __m128i hi = _mm_and_si128(
        _mm_srlv_epi32(_mm_sllv_epi32(a2, _mm_setr_epi32(4, 2, 0, 0)), _mm_setr_epi32(0, 0, 0, 2)),
        _mm_set1_epi8(0x30));
    return _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
}

/* IQ4_XS's eight 6-bit scales less their bias 32, int16. */
SIMD static inline __m128i iq4xs_scales_v(const blk_iq4_xs *x)
{
    const __m128i v = _mm_loadl_epi64((const __m128i *)x); /* d, scales_h, scales_l */
    const __m128i b = _mm_srli_si128(v, 4), m4 = _mm_set1_epi8(0x0F);
    const __m128i l = _mm_cvtepu8_epi16(
        _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4)));
    /* bits 2 ib, 2 ib + 1 of scales_h moved to 14-15, then to 4-5 */
    const __m128i h = _mm_mullo_epi16(
        _mm_set1_epi16((short)x->scales_h),
        _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1));
    return _mm_sub_epi16(
        _mm_or_si128(l, _mm_and_si128(_mm_srli_epi16(h, 10), _mm_set1_epi16(0x30))),
        _mm_set1_epi16(32));
}

/* The bytes of chunk c (elements 32c..32c+31) of superblock blk, in the order of kblk_of. */
SIMD static inline __attribute__((always_inline)) __m256i chunk_q(const int type, const char *blk,
                                                                  const int c)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    switch (type) {
    case Q_Q4_K:
    case Q_Q5_K: {
        const uint8_t *qs =
            type == Q_Q4_K ? ((const blk_q4_k *)blk)->qs : ((const blk_q5_k *)blk)->qs;
        const __m256i qv = _mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 2)));
        const __m256i q = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(qv, 4) : qv, m4);
        if (type == Q_Q4_K) return q;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)((const blk_q5_k *)blk)->qh);
        return _mm256_or_si256(q, bits_to(qh, c, 4, 1));
    }
    case Q_Q6_K: {
        const blk_q6_k *x = (const blk_q6_k *)blk;
        const int h = c / 4, cc = c % 4;
        const __m256i l = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32 * (cc & 1)));
        const __m256i H = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        const __m256i lo = _mm256_and_si256(cc < 2 ? l : _mm256_srli_epi16(l, 4), m4);
        return _mm256_or_si256(lo, bits_to(H, 2 * cc, 4, 2));
    }
    case Q_Q3_K:
    case Q_Q2_K: {
        const uint8_t *qs =
            type == Q_Q3_K ? ((const blk_q3_k *)blk)->qs : ((const blk_q2_k *)blk)->qs;
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 4)));
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * (c % 4)), m3);
        if (type == Q_Q2_K) return q;
        const __m256i hm = _mm256_loadu_si256((const __m256i *)((const blk_q3_k *)blk)->hmask);
        return _mm256_or_si256(q, bits_to(hm, c, 2, 1));
    }
    default: /* Q_IQ4_XS */
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qk_iq4nl_values)),
            nib32(((const blk_iq4_xs *)blk)->qs + 16 * c));
    }
}

/* R activation rows (a constant) times the n weight rows of `type` (a constant): per
 * superblock, each chunk of 32 weights unpacked once for the R rows, maddubs with the row's
 * bytes (IQ4_XS with the sign trick), madd with the int16 scales of its two 16s, one int32
 * sum per lane; then the offset or the minimums with the sums per 16, and one float step. */
SIMD static inline __attribute__((always_inline)) void rows_q8k_r(const int type, const char *w,
                                                                  int n, int64_t k, const xq8 *x,
                                                                  float beta, float *y, int ld_y,
                                                                  const int R)
{
    const int64_t nb = k / QK_K;
    const size_t rb = q_row_bytes(type, k), bb = q_row_bytes(type, QK_K);
    const bool mins32 = type == Q_Q4_K || type == Q_Q5_K, mins16 = type == Q_Q2_K;
    const bool per16 = type == Q_Q6_K || type == Q_Q3_K || type == Q_Q2_K;
    const bool sgn = type == Q_IQ4_XS;
    const int off_shift = type == Q_Q6_K ? 5 : type == Q_Q3_K ? 2 : 0; /* x 32, x 4 */
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
            const char *blk = row + (size_t)b * bb;
            float dw, dmin = 0.0f;
            __m256i scales = _mm256_setzero_si256(); /* per 32: chunk c's in int16 c, each half */
            __m128i sc8 = _mm_setzero_si128();       /* per 16: the 16 scales, int8 */
            __m128i mn8 = _mm_setzero_si128();       /* Q4_K, Q5_K: the 8 minimums, int16 */
            __m256i mn16 = _mm256_setzero_si256();   /* Q2_K: the 16 minimums, int16 */
            switch (type) {
            case Q_Q4_K:
            case Q_Q5_K: { /* d, dmin and the scales lie as in Q4_K */
                const blk_q4_k *x4 = (const blk_q4_k *)blk;
                dw = _cvtsh_ss(x4->d);
                dmin = _cvtsh_ss(x4->dmin);
                const __m128i u = k4_scales_v(x4->scales);
                mn8 = _mm_cvtepu8_epi16(_mm_srli_si128(u, 8));
                const __m128i s8 = _mm_cvtepu8_epi16(u);
                scales = _mm256_set_m128i(s8, s8);
                break;
            }
            case Q_Q6_K:
                dw = _cvtsh_ss(((const blk_q6_k *)blk)->d);
                sc8 = _mm_loadu_si128((const __m128i *)((const blk_q6_k *)blk)->scales);
                break;
            case Q_Q3_K:
                dw = _cvtsh_ss(((const blk_q3_k *)blk)->d);
                sc8 = q3k_scales_v((const blk_q3_k *)blk);
                break;
            case Q_Q2_K: {
                const blk_q2_k *x2 = (const blk_q2_k *)blk;
                dw = _cvtsh_ss(x2->d);
                dmin = _cvtsh_ss(x2->dmin);
                const __m128i raw = _mm_loadu_si128((const __m128i *)x2->scales);
                const __m128i m4 = _mm_set1_epi8(0x0F);
                sc8 = _mm_and_si128(raw, m4);
                mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
                break;
            }
            default: { /* Q_IQ4_XS */
                const blk_iq4_xs *xi = (const blk_iq4_xs *)blk;
                dw = _cvtsh_ss(xi->d);
                const __m128i v = iq4xs_scales_v(xi);
                scales = _mm256_set_m128i(v, v);
                break;
            }
            }
            __m256i sumi[Q8_GROUP_ROWS];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m256i q = chunk_q(type, blk, c);
                const __m256i aq = sgn ? _mm256_sign_epi8(q, q) : q;
                /* int16 lanes 0-7: the scale of 16s 2c (per 32: chunk c's), 8-15: 2c + 1 */
                const __m256i s = per16
                                      ? _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                                            sc8, _mm_set_epi64x(0x0101010101010101LL * (2 * c + 1),
                                                                0x0101010101010101LL * (2 * c))))
                                      : bcast16(scales, c);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const __m256i xv = _mm256_loadu_si256(
                        (const __m256i *)(x->kq + (size_t)r * k + b * QK_K + 32 * c));
                    const __m256i p = _mm256_maddubs_epi16(aq, sgn ? _mm256_sign_epi8(xv, q) : xv);
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(s, p));
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const float dx = x->kd[(size_t)r * nb + b];
                const __m256i bsv = _mm256_loadu_si256(
                    (const __m256i *)(x->ks + ((size_t)r * nb + (size_t)b) * 16));
                if (off_shift) /* Q6_K's 32, Q3_K's 4: x the scale and the sum of each 16 */
                    sumi[r] = _mm256_sub_epi32(
                        sumi[r], _mm256_slli_epi32(
                                     _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), bsv), off_shift));
                if (mins32) {
                    const __m128i s32 = _mm_hadd_epi16(_mm256_castsi256_si128(bsv),
                                                       _mm256_extracti128_si256(bsv, 1));
                    accm[r] = _mm_fmadd_ps(_mm_set1_ps(-(dmin * dx)),
                                           _mm_cvtepi32_ps(_mm_madd_epi16(mn8, s32)), accm[r]);
                }
                if (mins16) {
                    const __m256i p = _mm256_madd_epi16(mn16, bsv);
                    accm[r] =
                        _mm_fmadd_ps(_mm_set1_ps(-(dmin * dx)),
                                     _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(p),
                                                                   _mm256_extracti128_si256(p, 1))),
                                     accm[r]);
                }
                acc[r] =
                    _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            float v = hsum8(acc[r]);
            if (mins32 || mins16) {
                __m128 m = _mm_add_ps(accm[r], _mm_movehl_ps(accm[r], accm[r]));
                m = _mm_add_ss(m, _mm_movehdup_ps(m));
                v += _mm_cvtss_f32(m);
            }
            float *yr = y + (size_t)r * ld_y + i;
            *yr = beta == 0.0f ? v : fmaf(beta, *yr, v);
        }
    }
}

/* The K types of this file; each is a constant in its own expansion of rows_q8k_r. */
#define Q8K_TYPES(X) X(Q_Q4_K) X(Q_Q6_K) X(Q_Q5_K) X(Q_Q3_K) X(Q_Q2_K) X(Q_IQ4_XS)

SIMD void qk_rows_q8k_avx2(int type, const void *wv, int n, int64_t k, const xq8 *x, int rows,
                           float beta, float *y, int ld_y)
{
    const char *w = wv;
#define Q8K_CASE(T)                                                                                \
    case T: ROWS_BY_COUNT(rows, rows_q8k_r, T, w, n, k, x, beta, y, ld_y) break;
    switch (type) {
        Q8K_TYPES(Q8K_CASE)
    }
#undef Q8K_CASE
}

#endif /* QK_X86 */
