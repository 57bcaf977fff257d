/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_lowk.c — the quantizers of Q2_K, Q3_K, Q5_K and IQ4_XS (ringlm-mkmodel's
 * --type; layouts in quant.h, kernels in quant_unpack.c): each sub-block's scale (and
 * minimum) from its own range, then stored as multiples of the block's f16 scales, as ggml
 * packs them. Simpler than ggml's searches (make_qkx2_quants and the like): the files are
 * the same format, the rounding error somewhat larger.
 */
#include "kernels/cpu/quant_internal.h"

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The value of largest magnitude of n floats (with its sign). */
static float signed_max(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int l = 0; l < n; l++)
        if (fabsf(x[l]) > amax) {
            amax = fabsf(x[l]);
            max = x[l];
        }
    return max;
}

/* Q2_K: per 16 elements x ≈ d sc q - dmin m, q in 0..3, sc and m 4 bits. */
static void quantize_q2_k(const float *x, blk_q2_k *b)
{
    float scale[16], mins[16], max_scale = 0.0f, max_min = 0.0f;
    for (int g = 0; g < 16; g++) {
        float lo = x[16 * g], hi = lo;
        for (int l = 1; l < 16; l++) {
            lo = fminf(lo, x[16 * g + l]);
            hi = fmaxf(hi, x[16 * g + l]);
        }
        if (lo > 0.0f) lo = 0.0f;
        scale[g] = (hi - lo) / 3.0f;
        mins[g] = -lo;
        max_scale = fmaxf(max_scale, scale[g]);
        max_min = fmaxf(max_min, mins[g]);
    }
    memset(b, 0, sizeof *b);
    b->d = qk_f32_to_f16(max_scale / 15.0f);
    b->dmin = qk_f32_to_f16(max_min / 15.0f);
    const float d = qk_f16_to_f32(b->d), dmin = qk_f16_to_f32(b->dmin);
    uint8_t L[QK_K];
    for (int g = 0; g < 16; g++) {
        const int ls = d > 0 ? clampi(qk_nearest(scale[g] / d), 0, 15) : 0;
        const int lm = dmin > 0 ? clampi(qk_nearest(mins[g] / dmin), 0, 15) : 0;
        b->scales[g] = (uint8_t)(ls | lm << 4);
        const float dd = d * (float)ls, dm = dmin * (float)lm;
        for (int l = 0; l < 16; l++)
            L[16 * g + l] =
                (uint8_t)(dd > 0 ? clampi(qk_nearest((x[16 * g + l] + dm) / dd), 0, 3) : 0);
    }
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            b->qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                         (L[j + l + 96] << 6));
}

/* Q3_K: per 16 elements x ≈ d (sc - 32) q, q in -4..3, sc 6 bits; the element of largest
 * magnitude of the block's largest scale takes q = -4 at sc - 32 = -32. */
static void quantize_q3_k(const float *x, blk_q3_k *b)
{
    float scale[16], max_scale = 0.0f, amax = 0.0f;
    for (int g = 0; g < 16; g++) {
        scale[g] = signed_max(x + 16 * g, 16) / -4.0f;
        if (fabsf(scale[g]) > amax) {
            amax = fabsf(scale[g]);
            max_scale = scale[g];
        }
    }
    memset(b, 0, sizeof *b);
    b->d = qk_f32_to_f16(max_scale / -32.0f);
    const float d = qk_f16_to_f32(b->d);
    uint8_t L[QK_K];
    for (int g = 0; g < 16; g++) {
        const int ls = d != 0.0f ? clampi(qk_nearest(scale[g] / d), -32, 31) : 0;
        const int l = ls + 32;
        if (g < 8)
            b->scales[g] = (uint8_t)(l & 0xF);
        else
            b->scales[g - 8] |= (uint8_t)((l & 0xF) << 4);
        b->scales[g % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (g / 4)));
        const float dd = d * (float)ls;
        for (int e = 0; e < 16; e++)
            L[16 * g + e] =
                (uint8_t)((dd != 0.0f ? clampi(qk_nearest(x[16 * g + e] / dd), -4, 3) : 0) + 4);
    }
    for (int j = 0, m = 0, hm = 1; j < QK_K; j++) {
        if (L[j] > 3) {
            b->hmask[m] |= (uint8_t)hm;
            L[j] -= 4;
        }
        if (++m == QK_K / 8) {
            m = 0;
            hm <<= 1;
        }
    }
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            b->qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                         (L[j + l + 96] << 6));
}

/* Q5_K: as Q4_K (quant_kquants.c) with q in 0..31, its fifth bit in qh. */
static void quantize_q5_k(const float *x, blk_q5_k *b)
{
    float scale[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = x[32 * j], hi = lo;
        for (int l = 1; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        if (lo > 0.0f) lo = 0.0f;
        scale[j] = (hi - lo) / 31.0f;
        mins[j] = -lo;
        max_scale = fmaxf(max_scale, scale[j]);
        max_min = fmaxf(max_min, mins[j]);
    }
    memset(b, 0, sizeof *b);
    b->d = qk_f32_to_f16(max_scale / 63.0f);
    b->dmin = qk_f32_to_f16(max_min / 63.0f);
    const float d = qk_f16_to_f32(b->d), dmin = qk_f16_to_f32(b->dmin);
    uint8_t ls[8], lm[8], L[QK_K];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)(d > 0 ? clampi(qk_nearest(scale[j] / d), 0, 63) : 0);
        lm[j] = (uint8_t)(dmin > 0 ? clampi(qk_nearest(mins[j] / dmin), 0, 63) : 0);
        if (j < 4) {
            b->scales[j] = ls[j];
            b->scales[j + 4] = lm[j];
        } else {
            b->scales[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            b->scales[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            b->scales[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
        const float dd = d * ls[j], dm = dmin * lm[j];
        for (int l = 0; l < 32; l++)
            L[32 * j + l] =
                (uint8_t)(dd > 0 ? clampi(qk_nearest((x[32 * j + l] + dm) / dd), 0, 31) : 0);
    }
    for (int jj = 0; jj < 4; jj++)
        for (int l = 0; l < 32; l++) {
            const int lo = L[64 * jj + l], hi = L[64 * jj + 32 + l];
            b->qs[32 * jj + l] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
            b->qh[l] |= (uint8_t)(((lo >> 4) << (2 * jj)) | ((hi >> 4) << (2 * jj + 1)));
        }
}

/* IQ4_XS: per 32 elements x ≈ d (ls - 32) table[q], ls 6 bits. */
static void quantize_iq4_xs(const float *x, blk_iq4_xs *b)
{
    float scale[8], max_scale = 0.0f, amax = 0.0f;
    for (int ib = 0; ib < 8; ib++) {
        scale[ib] = signed_max(x + 32 * ib, 32) / (float)qk_iq4nl_values[0];
        if (fabsf(scale[ib]) > amax) {
            amax = fabsf(scale[ib]);
            max_scale = scale[ib];
        }
    }
    memset(b, 0, sizeof *b);
    b->d = qk_f32_to_f16(max_scale / -32.0f);
    const float d = qk_f16_to_f32(b->d);
    for (int ib = 0; ib < 8; ib++) {
        const int ls = (d != 0.0f ? clampi(qk_nearest(scale[ib] / d), -32, 31) : 0) + 32;
        b->scales_l[ib / 2] |= (uint8_t)((ls & 0xf) << 4 * (ib % 2));
        b->scales_h |= (uint16_t)((ls >> 4) << 2 * ib);
        const float dl = d * (float)(ls - 32), id = dl != 0.0f ? 1.0f / dl : 0.0f;
        uint8_t q[32];
        for (int l = 0; l < 32; l++) {
            const float v = x[32 * ib + l] * id;
            int best = 0;
            for (int i = 1; i < 16; i++)
                if (fabsf(v - (float)qk_iq4nl_values[i]) < fabsf(v - (float)qk_iq4nl_values[best]))
                    best = i;
            q[l] = (uint8_t)best;
        }
        for (int l = 0; l < 16; l++) b->qs[16 * ib + l] = (uint8_t)(q[l] | q[l + 16] << 4);
    }
}

void qk_quantize_lowk(int type, const float *x, void *out, int64_t k)
{
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) switch (type) {
        case Q_Q2_K: quantize_q2_k(x, (blk_q2_k *)out + i); break;
        case Q_Q3_K: quantize_q3_k(x, (blk_q3_k *)out + i); break;
        case Q_Q5_K: quantize_q5_k(x, (blk_q5_k *)out + i); break;
        case Q_IQ4_XS: quantize_iq4_xs(x, (blk_iq4_xs *)out + i); break;
        }
}
