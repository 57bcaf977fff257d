/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_legacy.c — the quantizers of ggml's 32-element types people still
 * download: Q4_0, Q4_1, Q5_0 and Q5_1 (quant.h has the layouts; ringlm-mkmodel; ggml's
 * quantize_row_*_ref), and their blocks written from levels (qk_pack_legacy, which the
 * searches under an importance matrix in quant_search.c share; IQ4_NL's search is there too).
 * Their kernels are in quant_unpack.c.
 */
#include "kernels/cpu/quant_internal.h"

/* ---- the blocks ------------------------------------------------------------------- */

void qk_pack_legacy(int type, const uint8_t L[32], float d, float m, void *out)
{
    uint8_t *qs, *qh = NULL;
    switch (type) {
    case Q_Q4_0: {
        blk_q4_0 *y = out;
        y->d = qk_f32_to_f16(d);
        qs = y->qs;
        break;
    }
    case Q_Q4_1: {
        blk_q4_1 *y = out;
        y->d = qk_f32_to_f16(d);
        y->m = qk_f32_to_f16(m);
        qs = y->qs;
        break;
    }
    case Q_Q5_0: {
        blk_q5_0 *y = out;
        y->d = qk_f32_to_f16(d);
        qs = y->qs;
        qh = y->qh;
        break;
    }
    case Q_Q5_1: {
        blk_q5_1 *y = out;
        y->d = qk_f32_to_f16(d);
        y->m = qk_f32_to_f16(m);
        qs = y->qs;
        qh = y->qh;
        break;
    }
    default: return;
    }
    /* element j in the low nibble of byte j, element j + 16 in the high one (the 4-bit
     * types' levels unmasked, as ggml writes them); the 5-bit types' fifth bits of all 32 in
     * one little-endian word */
    if (!qh) {
        for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | L[j + 16] << 4);
        return;
    }
    uint32_t high = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((L[j] & 0x0f) | (L[j + 16] & 0x0f) << 4);
        high |= (uint32_t)((L[j] & 0x10) >> 4) << j;
        high |= (uint32_t)((L[j + 16] & 0x10) >> 4) << (j + 16);
    }
    memcpy(qh, &high, 4);
}

/* ---- quantizers (ggml's reference ones) --------------------------------------------- */

static void quantize_block(int type, const float *x, void *out)
{
    float amax = 0.0f, max = 0.0f, lo = x[0], hi = x[0];
    for (int j = 0; j < 32; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    uint8_t L[32];
    float d, m = 0.0f;
    switch (type) {
    case Q_Q4_0:
    case Q_Q5_0: { /* x ~ d (L - 8) or d (L - 16), d = max / -8 or -16 */
        const int half = type == Q_Q4_0 ? 8 : 16;
        d = max / (float)-half;
        const float id = d ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) {
            const int l = (int)(int8_t)(x[j] * id + ((float)half + 0.5f));
            L[j] = (uint8_t)(l < 2 * half - 1 ? l : 2 * half - 1);
        }
        break;
    }
    case Q_Q4_1:
    case Q_Q5_1: { /* x ~ d L + lo over the range */
        const int top = type == Q_Q4_1 ? 15 : 31;
        d = (hi - lo) / (float)top;
        m = lo;
        const float id = d ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) {
            /* Q5_1's levels are not clamped in ggml's reference (the packing keeps 5 bits) */
            if (type == Q_Q4_1) {
                const int l = (int)(int8_t)((x[j] - lo) * id + 0.5f);
                L[j] = (uint8_t)(l > top ? top : l);
            } else {
                L[j] = (uint8_t)((x[j] - lo) * id + 0.5f);
            }
        }
        break;
    }
    default: return;
    }
    qk_pack_legacy(type, L, d, m, out);
}

void qk_quantize_legacy(int type, const float *x, void *out, int64_t k)
{
    const size_t bb = q_row_bytes(type, 32);
    for (int64_t b = 0; b < k / 32; b++) quantize_block(type, x + b * 32, (char *)out + b * bb);
}
