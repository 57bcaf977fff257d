/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_search.c — the quantizers of the K types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
 * and of IQ4_NL and IQ4_XS, and of every quantized type under an importance matrix (the
 * legacy Q4_0, Q4_1, Q5_0 and Q5_1 too), as ringlm-mkmodel writes them (layouts in
 * quant_internal.h).
 *
 * Each is the search llama.cpp's quantizer runs on a tensor without an importance matrix, so
 * a file re-quantized here holds the same bytes as `llama-quantize` writes from the same
 * weights (tests/test_gguf_oracle.c checks it block for block against ggml's functions):
 *   - a sub-block's scale and minimum (Q2_K, Q4_K, Q5_K) by trying the range's scale and a few
 *     around it, each refitted by weighted least squares, keeping the least weighted error;
 *   - a symmetric sub-block's scale (Q6_K) by trying 19 scales near the largest value's,
 *     weighting each element by its square; Q3_K's by moving one element at a time to the
 *     level that raises the fit, up to five passes;
 *   - IQ4's scale by trying 15 steps of the grid's first value, weighting by the square;
 *   then the sub-block scales are quantized against the block's f16 scale(s) and every
 *   element re-rounded with the scale it will be read with.
 * Under an importance matrix (llama-quantize --imatrix) the same searches weight each element
 * by its column's importance times sqrt(sigma² + x²) instead, the affine ones with a finer
 * sweep, and the sub-block scales of Q2_K, Q3_K, Q4_K and Q5_K are themselves fitted,
 * weighted by the sub-blocks' total weights, rather than scaled to the largest.
 * The float operations are in ggml's order (no fused multiply-add: this file is built for
 * the baseline x86-64), which is what makes the bytes equal, not only the error.
 */
#include "kernels/cpu/quant_internal.h"

#define EPS_ZERO 1e-15f /* a group whose largest magnitude is below this is all zeros */

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The value of largest magnitude of n (the first of equals; 0 when all are 0). */
static float largest(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    return max;
}

/* x ≈ scale * (L - nmax), L in 0..2 nmax - 1, each element weighted by x² (or by qw, an
 * importance matrix's weights): the scale -(nmax + s/10) / max for s in -9..9 with each its
 * least-squares refit, the best kept. */
static float fit_symmetric(int n, int nmax, const float *x, const float *qw, int8_t *L)
{
    const float max = largest(x, n);
    if (fabsf(max) < EPS_ZERO) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max, sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(qk_nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = qw ? qw[i] : x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(qk_nearest(iscale * x[i]), -nmax, nmax - 1);
            const float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clampi(qk_nearest(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's sub-block fit: rounded at the largest value's scale, then elements moved one at a
 * time to the level the others' fit asks for while that raises the fit (x²-weighted). */
static float fit_q3(int n, int nmax, const float *x, int8_t *L)
{
    const float max = largest(x, n);
    if (fabsf(max) < EPS_ZERO) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = (float)-nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(qk_nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (!(slx > 0.0f)) continue; /* NaN too */
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            const int nl = clampi(qk_nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (nl == L[i]) continue;
            slx += w * x[i] * (float)nl;
            sl2 += w * (float)nl * (float)nl;
            if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (int8_t)nl;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* x ≈ scale * L - min (min ≥ 0 returned), L in 0..nmax, weighted: the range's scale, then
 * nmax + rmin + rdelta s steps (s = 0..nstep) over the range, each refitted (scale and
 * minimum by weighted least squares), the one of least weighted error (absolute or squared)
 * kept. */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
                        float rmin, float rdelta, int nstep, bool abs_err)
{
    uint8_t Laux[32];
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0.0f) min = 0.0f;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1.0f / iscale, best = 0.0f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(qk_nearest(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = abs_err ? fabsf(diff) : diff * diff;
        best += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(qk_nearest(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0.0f)) continue; /* NaN too */
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D,
              this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0.0f) {
            this_min = 0.0f;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * (float)Laux[i] + this_min - x[i];
            diff = abs_err ? fabsf(diff) : diff * diff;
            err += w[i] * diff;
        }
        if (err < best) {
            memcpy(L, Laux, (size_t)n);
            best = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *the_min = -min;
    return scale;
}

/* Non-negative x ≈ scale * L, L in 0..nmax, weighted by w: the largest value's scale and
 * eight around it (least weighted error kept), then up to five passes moving one element at a
 * time to the level the others' fit asks for while that raises the fit. ggml's make_qp_quants:
 * the sub-block scales and minimums of Q2_K, Q4_K and Q5_K under an importance matrix. */
static float fit_positive(int n, int nmax, const float *x, const float *w, uint8_t *L)
{
    float max = 0.0f;
    for (int i = 0; i < n; i++) max = x[i] > max ? x[i] : max;
    if (max < EPS_ZERO) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)qk_nearest(iscale * x[i]);
    const float scale = 1.0f / iscale;
    float best = 0.0f;
    for (int i = 0; i < n; i++) {
        const float diff = x[i] - scale * (float)L[i];
        best += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * (float)is + (float)nmax) / max, scale_is = 1.0f / iscale_is;
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = qk_nearest(iscale_is * x[i]);
            l = l > nmax ? nmax : l;
            const float diff = x[i] - scale_is * (float)l;
            err += w[i] * diff * diff;
        }
        if (err < best) {
            best = err;
            iscale = iscale_is;
        }
    }
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = qk_nearest(iscale * x[i]);
        l = l > nmax ? nmax : l;
        L[i] = (uint8_t)l;
        sumlx += w[i] * x[i] * (float)l;
        suml2 += w[i] * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float slx = sumlx - w[i] * x[i] * (float)L[i],
                  sl2 = suml2 - w[i] * (float)L[i] * (float)L[i];
            if (!(slx > 0.0f && sl2 > 0.0f)) continue;
            int l = qk_nearest(x[i] * sl2 / slx);
            l = l > nmax ? nmax : l;
            if (l == L[i]) continue;
            slx += w[i] * x[i] * (float)l;
            sl2 += w[i] * (float)l * (float)l;
            if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (uint8_t)l;
                sumlx = slx;
                suml2 = sl2;
                changed++;
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* The weights of n elements under an importance matrix, as all of ggml's weighted searches
 * form them: the column's qw times sqrt(sigma2 + x²); returns their sum. */
static float imatrix_weights(int n, const float *x, const float *qw, float sigma2, float *w)
{
    float sum = 0.0f;
    for (int l = 0; l < n; l++) w[l] = qw[l] * sqrtf(sigma2 + x[l] * x[l]);
    for (int l = 0; l < n; l++) sum += w[l];
    return sum;
}

/* ---- Q2_K --------------------------------------------------------------------------- */

/* Four 2-bit levels to a byte: element j + 32 i of each 128 in bits 2i of byte j. */
static void pack_2bit(const uint8_t L[QK_K], uint8_t qs[QK_K / 4])
{
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] =
                (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 | L[j + l + 96] << 6);
}

/* A Q2_K block from its sub-blocks' 4-bit scale and minimum codes (ls, lm) and the block's
 * steps d and dmin: every element re-rounded at the scale it will be read with, packed. */
static void finish_q2_k(const float *x, const uint8_t ls[16], const uint8_t lm[16], float d,
                        float dmin, uint8_t L[QK_K], blk_q2_k *b)
{
    for (int j = 0; j < 16; j++) b->scales[j] = (uint8_t)(ls[j] | lm[j] << 4);
    b->d = qk_f32_to_f16(d);
    b->dmin = qk_f32_to_f16(dmin);
    for (int j = 0; j < 16; j++) {
        const float dj = qk_f16_to_f32(b->d) * (float)(b->scales[j] & 0xF);
        if (dj == 0.0f) continue;
        const float dm = qk_f16_to_f32(b->dmin) * (float)(b->scales[j] >> 4);
        for (int l = 0; l < 16; l++)
            L[16 * j + l] = (uint8_t)clampi(qk_nearest((x[16 * j + l] + dm) / dj), 0, 3);
    }
    pack_2bit(L, b->qs);
}

static void quantize_q2_k(const float *x, blk_q2_k *b)
{
    uint8_t L[QK_K], ls[16] = {0}, lm[16] = {0};
    float w[16], scales[16], mins[16], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
        scales[j] = fit_affine(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0.0f) {
        const float iscale = 15.0f / max_scale;
        for (int j = 0; j < 16; j++) ls[j] = (uint8_t)qk_nearest(iscale * scales[j]);
    }
    if (max_min > 0.0f) {
        const float iscale = 15.0f / max_min;
        for (int j = 0; j < 16; j++) lm[j] = (uint8_t)qk_nearest(iscale * mins[j]);
    }
    finish_q2_k(x, ls, lm, max_scale > 0.0f ? max_scale / 15.0f : 0.0f,
                max_min > 0.0f ? max_min / 15.0f : 0.0f, L, b);
}

/* Under an importance matrix (ggml's quantize_row_q2_K_impl): each element weighted by its
 * column's qw times sqrt(sigma^2 + x^2) (sigma^2 the block's mean square), the sub-blocks
 * fitted with the finer sweep, their scales and minimums quantized by fit_positive weighted
 * by the sub-blocks' total weights. */
static void quantize_q2_k_weighted(const float *x, const float *qw, blk_q2_k *b)
{
    uint8_t L[QK_K], ls[16], lm[16];
    float w[16], sw[16], scales[16], mins[16], sum_x2 = 0.0f;
    for (int l = 0; l < QK_K; l++) sum_x2 += x[l] * x[l];
    const float sigma2 = sum_x2 / (float)QK_K;
    for (int j = 0; j < 16; j++) {
        sw[j] = imatrix_weights(16, x + 16 * j, qw + 16 * j, sigma2, w);
        scales[j] = fit_affine(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.9f, 0.05f, 36, false);
    }
    const float d = fit_positive(16, 15, scales, sw, ls), dmin = fit_positive(16, 15, mins, sw, lm);
    finish_q2_k(x, ls, lm, d, dmin, L, b);
}

/* ---- Q3_K --------------------------------------------------------------------------- */

/* A Q3_K block from its sub-blocks' 6-bit scale codes (ls: 0..63, read as ls - 32) and the
 * block's step d: every element re-rounded at the scale it will be read with, packed. */
static void finish_q3_k(const float *x, const uint8_t ls[16], float d, int8_t L[QK_K], blk_q3_k *b)
{
    memset(b, 0, sizeof *b);
    for (int j = 0; j < 16; j++) {
        const int l = ls[j];
        if (j < 8)
            b->scales[j] = (uint8_t)(l & 0xF);
        else
            b->scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
        b->scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
    }
    b->d = qk_f32_to_f16(d);
    for (int j = 0; j < 16; j++) {
        int sc = j < 8 ? b->scales[j] & 0xF : b->scales[j - 8] >> 4;
        sc = (sc | ((b->scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
        const float dj = qk_f16_to_f32(b->d) * (float)sc;
        if (dj == 0.0f) continue;
        for (int l = 0; l < 16; l++)
            L[16 * j + l] = (int8_t)(clampi(qk_nearest(x[16 * j + l] / dj), -4, 3) + 4);
    }
    /* the high bit of element j in bit j / 32 of hmask[j % 32] */
    for (int j = 0; j < QK_K; j++)
        if (L[j] > 3) {
            b->hmask[j % 32] |= (uint8_t)(1u << (j / 32));
            L[j] = (int8_t)(L[j] - 4);
        }
    pack_2bit((const uint8_t *)L, b->qs); /* levels 0..3 by now */
}

static void quantize_q3_k(const float *x, blk_q3_k *b)
{
    int8_t L[QK_K];
    uint8_t ls[16] = {0};
    float scales[16], d = 0.0f;
    for (int j = 0; j < 16; j++) scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
    const float max_scale = largest(scales, 16);
    if (max_scale != 0.0f) {
        const float iscale = -32.0f / max_scale;
        for (int j = 0; j < 16; j++) {
            const int8_t l = (int8_t)qk_nearest(iscale * scales[j]);
            ls[j] = (uint8_t)(clampi(l, -32, 31) + 32);
        }
        d = 1.0f / iscale;
    }
    finish_q3_k(x, ls, d, L, b);
}

/* Under an importance matrix (ggml's quantize_row_q3_K_impl): each element weighted by its
 * column's qw times sqrt(sigma^2 + x^2) (sigma^2 twice the block's mean square) in the
 * symmetric fit, the sub-block scales fitted by the same search weighted by the sub-blocks'
 * total weights. */
static void quantize_q3_k_weighted(const float *x, const float *qw, blk_q3_k *b)
{
    int8_t L[QK_K], ls[16];
    float w[16], sw[16], scales[16], sum_x2 = 0.0f;
    for (int l = 0; l < QK_K; l++) sum_x2 += x[l] * x[l];
    const float sigma2 = 2.0f * sum_x2 / (float)QK_K;
    for (int j = 0; j < 16; j++) {
        sw[j] = imatrix_weights(16, x + 16 * j, qw + 16 * j, sigma2, w);
        scales[j] = fit_symmetric(16, 4, x + 16 * j, w, L + 16 * j);
    }
    const float d = fit_symmetric(16, 32, scales, sw, ls);
    finish_q3_k(x, (const uint8_t *)ls, d, L, b);
}

/* ---- Q4_K and Q5_K: 8 sub-blocks of 32, 6-bit scales and minimums --------------------- */

/* The sub-blocks' 6-bit scale and minimum codes (ls, lm) packed into sc12, the block's steps
 * d and dmin into bd and bdmin; L gets every element's level (0..nmax) as it will be read. */
static void finish_k32(const float *x, int nmax, const uint8_t ls[8], const uint8_t lm[8], float d,
                       float dmin, uint16_t *bd, uint16_t *bdmin, uint8_t sc12[12], uint8_t L[QK_K])
{
    memset(sc12, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc12[j] = ls[j];
            sc12[j + 4] = lm[j];
        } else {
            sc12[j + 4] = (uint8_t)((ls[j] & 0xF) | (lm[j] & 0xF) << 4);
            sc12[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            sc12[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    *bd = qk_f32_to_f16(d);
    *bdmin = qk_f32_to_f16(dmin);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        scale_min_k4(j, sc12, &sc, &m);
        const float dj = qk_f16_to_f32(*bd) * (float)sc;
        if (dj == 0.0f) continue;
        const float dm = qk_f16_to_f32(*bdmin) * (float)m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clampi(qk_nearest((x[32 * j + l] + dm) / dj), 0, nmax);
    }
}

/* The sub-blocks' scales and minimums (nmax 15 or 31), each fitted weighted by
 * av_x + |x|, quantized against the largest of each. */
static void fit_k32(const float *x, int nmax, float rmin, int nstep, uint16_t *bd, uint16_t *bdmin,
                    uint8_t sc12[12], uint8_t L[QK_K])
{
    uint8_t ls[8], lm[8];
    float w[32], scales[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] =
            fit_affine(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f,
                inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)qk_nearest(inv_scale * scales[j]);
        lm[j] = (uint8_t)qk_nearest(inv_min * mins[j]);
        ls[j] = ls[j] > 63 ? 63 : ls[j];
        lm[j] = lm[j] > 63 ? 63 : lm[j];
    }
    finish_k32(x, nmax, ls, lm, max_scale / 63.0f, max_min / 63.0f, bd, bdmin, sc12, L);
}

/* Q4_K and Q5_K under an importance matrix (ggml's quantize_row_q4_K_impl and _q5_K_impl):
 * each element weighted by its column's qw times sqrt(sigma² + x²), the sub-blocks fitted with
 * a finer sweep, their scales and minimums quantized by fit_positive weighted by the
 * sub-blocks' total weight (Q5_K caps the 6-bit codes at 63, Q4_K lets them wrap, as ggml
 * does). */
static void fit_k32_weighted(const float *x, const float *qw, int nmax, uint16_t *bd,
                             uint16_t *bdmin, uint8_t sc12[12], uint8_t L[QK_K])
{
    uint8_t ls[8], lm[8];
    float w[32], sw[8], mins[8], scales[8], sum_x2 = 0.0f;
    for (int l = 0; l < QK_K; l++) sum_x2 += x[l] * x[l];
    const float sigma2 = 2.0f * sum_x2 / (float)QK_K;
    for (int j = 0; j < 8; j++) {
        sw[j] = imatrix_weights(32, x + 32 * j, qw + 32 * j, sigma2, w);
        scales[j] =
            fit_affine(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], -0.9f, 0.05f, 36, false);
    }
    const float d_block = fit_positive(8, 63, scales, sw, ls),
                m_block = fit_positive(8, 63, mins, sw, lm);
    if (nmax == 31)
        for (int j = 0; j < 8; j++) {
            ls[j] = ls[j] > 63 ? 63 : ls[j];
            lm[j] = lm[j] > 63 ? 63 : lm[j];
        }
    finish_k32(x, nmax, ls, lm, d_block, m_block, bd, bdmin, sc12, L);
}

static void quantize_q4_k(const float *x, const float *qw, blk_q4_k *b)
{
    uint8_t L[QK_K];
    if (qw)
        fit_k32_weighted(x, qw, 15, &b->d, &b->dmin, b->scales, L);
    else
        fit_k32(x, 15, -1.0f, 20, &b->d, &b->dmin, b->scales, L);
    uint8_t *q = b->qs;
    for (int j = 0; j < QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
}

static void quantize_q5_k(const float *x, const float *qw, blk_q5_k *b)
{
    uint8_t L[QK_K];
    if (qw)
        fit_k32_weighted(x, qw, 31, &b->d, &b->dmin, b->scales, L);
    else
        fit_k32(x, 31, -0.5f, 15, &b->d, &b->dmin, b->scales, L);
    memset(b->qh, 0, sizeof b->qh);
    uint8_t *ql = b->qs, m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64, ql += 32, m1 = (uint8_t)(m1 << 2), m2 = (uint8_t)(m2 << 2))
        for (int j = 0; j < 32; j++) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) {
                l1 -= 16;
                b->qh[j] |= m1;
            }
            if (l2 > 15) {
                l2 -= 16;
                b->qh[j] |= m2;
            }
            ql[j] = (uint8_t)(l1 | l2 << 4);
        }
}

/* ---- Q6_K: 16 sub-blocks of 16, int8 scales ----------------------------------------- */

static void quantize_q6_k(const float *x, const float *qw, blk_q6_k *b)
{
    int8_t L[QK_K];
    float scales[16];
    for (int j = 0; j < 16; j++)
        scales[j] = fit_symmetric(16, 32, x + 16 * j, qw ? qw + 16 * j : NULL, L + 16 * j);
    const float max_scale = largest(scales, 16);
    memset(b, 0, sizeof *b);
    if (fabsf(max_scale) < EPS_ZERO) return;
    const float iscale = -128.0f / max_scale;
    b->d = qk_f32_to_f16(1.0f / iscale);
    for (int j = 0; j < 16; j++) {
        const int s = qk_nearest(iscale * scales[j]);
        b->scales[j] = (int8_t)(s > 127 ? 127 : s);
    }
    for (int j = 0; j < 16; j++) {
        const float d = qk_f16_to_f32(b->d) * (float)b->scales[j];
        if (d == 0.0f) continue;
        for (int l = 0; l < 16; l++)
            L[16 * j + l] = (int8_t)(clampi(qk_nearest(x[16 * j + l] / d), -32, 31) + 32);
    }
    uint8_t *ql = b->ql, *qh = b->qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
            ql[l] = (uint8_t)((q1 & 0xF) | (q3 & 0xF) << 4);
            ql[l + 32] = (uint8_t)((q2 & 0xF) | (q4 & 0xF) << 4);
            qh[l] = (uint8_t)(q1 >> 4 | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
        }
}

/* ---- IQ4_NL and IQ4_XS: the non-linear 16-value grid -------------------------------- */

/* The grid value nearest v (ties to the lower), by bisection. */
static int grid_index(float v)
{
    const int8_t *val = qk_iq4nl_values;
    if (v <= (float)val[0]) return 0;
    if (v >= (float)val[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < (float)val[mid])
            hi = mid;
        else
            lo = mid;
    }
    return v - (float)val[hi - 1] < (float)val[hi] - v ? hi - 1 : hi;
}

/* A block of 32's scale: -max / grid[0], refitted, then 15 scales (grid[0] + t) / max for t in
 * -7..7, each refitted by weighted least squares (w, or x² where w is NULL); the best fit's
 * scale. L: the levels at the first scale (the callers round again at the scale they store).
 * 0 for an all-zero block. */
static float fit_grid(const float *x, const float *w, uint8_t *L)
{
    const int8_t *val = qk_iq4nl_values;
    const float max = largest(x, 32);
    if (fabsf(max) < EPS_ZERO) return 0.0f;
    float d = -max / (float)val[0], id = 1.0f / d, sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; j++) {
        const int l = grid_index(id * x[j]);
        L[j] = (uint8_t)l;
        const float q = (float)val[l], wj = w ? w[j] : x[j] * x[j];
        sumqx += wj * q * x[j];
        sumq2 += wj * q * q;
    }
    d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    float best = d * sumqx;
    for (int t = -7; t <= 7; t++) {
        id = (float)(t + val[0]) / max;
        sumqx = sumq2 = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float q = (float)val[grid_index(id * x[j])], wj = w ? w[j] : x[j] * x[j];
            sumqx += wj * q * x[j];
            sumq2 += wj * q * q;
        }
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* Under an importance matrix the grid fit weights each element by its column's qw times
 * sqrt(sigma² + x²), sigma² twice the mean square of the n elements (the block for IQ4_NL,
 * the super-block for IQ4_XS; ggml's quantize_row_iq4_nl_impl). w: NULL without one. */
static const float *grid_weights(const float *x, const float *qw, int n, float *w)
{
    if (!qw) return NULL;
    float sigma2 = 0.0f;
    for (int j = 0; j < n; j++) sigma2 += x[j] * x[j];
    sigma2 *= 2.0f / (float)n;
    imatrix_weights(n, x, qw, sigma2, w);
    return w;
}

static void pack_nibbles(const uint8_t *L, uint8_t *qs, int n)
{
    for (int i = 0; i < n / 32; i++)
        for (int j = 0; j < 16; j++)
            qs[16 * i + j] = (uint8_t)(L[32 * i + j] | L[32 * i + 16 + j] << 4);
}

static void quantize_iq4_nl(const float *x, const float *qw, blk_iq4_nl *b)
{
    uint8_t L[32];
    float w[32];
    const float d = fit_grid(x, grid_weights(x, qw, 32, w), L);
    b->d = qk_f32_to_f16(d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) L[j] = (uint8_t)grid_index(id * x[j]);
    pack_nibbles(L, b->qs, 32);
}

static void quantize_iq4_xs(const float *x, const float *qw, blk_iq4_xs *b)
{
    uint8_t L[QK_K];
    float scales[8], w[QK_K];
    const float *wt = grid_weights(x, qw, QK_K, w);
    for (int ib = 0; ib < 8; ib++)
        scales[ib] = fit_grid(x + 32 * ib, wt ? wt + 32 * ib : NULL, L + 32 * ib);
    const float max_scale = largest(scales, 8);
    memset(b, 0, sizeof *b);
    const float d = -max_scale / 32.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = qk_f32_to_f16(d);
    for (int ib = 0; ib < 8; ib++) {
        const int l = clampi(qk_nearest(id * scales[ib]), -32, 31);
        const float dl = d * (float)l, idl = dl != 0.0f ? 1.0f / dl : 0.0f;
        for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)grid_index(idl * x[32 * ib + j]);
        const int ls = l + 32;
        b->scales_l[ib / 2] |= (uint8_t)((ls & 0xF) << 4 * (ib % 2));
        b->scales_h |= (uint16_t)((ls >> 4) << 2 * ib);
    }
    pack_nibbles(L, b->qs, QK_K);
}

/* ---- Q4_0, Q4_1, Q5_0, Q5_1 under an importance matrix ------------------------------ */

/* ggml's quantize_row_q4_0_impl and its siblings: each block of 32 weighted by its columns'
 * qw times sqrt(sigma² + x²), sigma² the mean square of the whole row; Q4_0 and Q5_0 fitted
 * by the symmetric search, Q4_1 and Q5_1 by the affine one with the finer sweep. The levels
 * are the search's (no second rounding at the stored f16 scale, as in ggml). Without an
 * importance matrix these types are quantized by quant_legacy.c (ggml's reference). */
static void quantize_legacy_weighted(int type, const float *x, const float *qw, void *out,
                                     int64_t k)
{
    float sum_x2 = 0.0f, w[32];
    for (int64_t j = 0; j < k; j++) sum_x2 += x[j] * x[j];
    const float sigma2 = sum_x2 / (float)k;
    const size_t block_bytes = q_row_bytes(type, 32);
    for (int64_t ib = 0; ib < k / 32; ib++, x += 32, qw += 32) {
        imatrix_weights(32, x, qw, sigma2, w);
        uint8_t L[32];
        float d, min = 0.0f;
        if (type == Q_Q4_0 || type == Q_Q5_0)
            d = fit_symmetric(32, type == Q_Q4_0 ? 8 : 16, x, w, (int8_t *)L);
        else
            d = fit_affine(32, type == Q_Q4_1 ? 15 : 31, x, w, L, &min, -0.9f, 0.05f, 36, false);
        qk_pack_legacy(type, L, d, -min, (char *)out + ib * block_bytes);
    }
}

/* ---- entry ------------------------------------------------------------------------- */

void qk_quantize_searched(int type, const float *x, const float *qw, void *out, int64_t k)
{
    switch (type) {
    case Q_Q4_0:
    case Q_Q4_1:
    case Q_Q5_0:
    case Q_Q5_1:
        if (qw)
            quantize_legacy_weighted(type, x, qw, out, k);
        else
            qk_quantize_legacy(type, x, out, k);
        return;
    case Q_IQ4_NL:
        for (int64_t i = 0; i < k / 32; i++, x += 32, qw = qw ? qw + 32 : NULL)
            quantize_iq4_nl(x, qw, (blk_iq4_nl *)out + i);
        return;
    default: break;
    }
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K, qw = qw ? qw + QK_K : NULL) switch (type) {
        case Q_Q2_K:
            qw ? quantize_q2_k_weighted(x, qw, (blk_q2_k *)out + i)
               : quantize_q2_k(x, (blk_q2_k *)out + i);
            break;
        case Q_Q3_K:
            qw ? quantize_q3_k_weighted(x, qw, (blk_q3_k *)out + i)
               : quantize_q3_k(x, (blk_q3_k *)out + i);
            break;
        case Q_Q4_K: quantize_q4_k(x, qw, (blk_q4_k *)out + i); break;
        case Q_Q5_K: quantize_q5_k(x, qw, (blk_q5_k *)out + i); break;
        case Q_Q6_K: quantize_q6_k(x, qw, (blk_q6_k *)out + i); break;
        case Q_IQ4_XS: quantize_iq4_xs(x, qw, (blk_iq4_xs *)out + i); break;
        }
}
