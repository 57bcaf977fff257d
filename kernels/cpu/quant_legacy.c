/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_legacy.c — the quantizers of ggml's 32-element types people still
 * download: Q4_0, Q4_1, Q5_0 and Q5_1 (quant.h has the layouts; ringlm-mkmodel; ggml's
 * quantize_row_*_ref; IQ4_NL's search is in quant_search.c). Their kernels are in
 * quant_unpack.c.
 */
#include "kernels/cpu/quant_internal.h"

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
    switch (type) {
    case Q_Q4_0: {
        blk_q4_0 *y = out;
        const float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
        y->d = qk_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            int a = (int)(int8_t)(x[j] * id + 8.5f), b = (int)(int8_t)(x[j + 16] * id + 8.5f);
            a = a > 15 ? 15 : a;
            b = b > 15 ? 15 : b;
            y->qs[j] = (uint8_t)(a | b << 4);
        }
        break;
    }
    case Q_Q4_1: {
        blk_q4_1 *y = out;
        const float d = (hi - lo) / 15.0f, id = d ? 1.0f / d : 0.0f;
        y->d = qk_f32_to_f16(d);
        y->m = qk_f32_to_f16(lo);
        for (int j = 0; j < 16; j++) {
            int a = (int)(int8_t)((x[j] - lo) * id + 0.5f);
            int b = (int)(int8_t)((x[j + 16] - lo) * id + 0.5f);
            a = a > 15 ? 15 : a;
            b = b > 15 ? 15 : b;
            y->qs[j] = (uint8_t)(a | b << 4);
        }
        break;
    }
    case Q_Q5_0:
    case Q_Q5_1: {
        const bool one = type == Q_Q5_1;
        const float d = one ? (hi - lo) / 31.0f : max / -16.0f, id = d ? 1.0f / d : 0.0f;
        uint8_t *qs;
        uint8_t *qh_out;
        if (one) {
            blk_q5_1 *y = out;
            y->d = qk_f32_to_f16(d);
            y->m = qk_f32_to_f16(lo);
            qs = y->qs;
            qh_out = y->qh;
        } else {
            blk_q5_0 *y = out;
            y->d = qk_f32_to_f16(d);
            qs = y->qs;
            qh_out = y->qh;
        }
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int a, b;
            if (one) {
                a = (int)(uint8_t)((x[j] - lo) * id + 0.5f);
                b = (int)(uint8_t)((x[j + 16] - lo) * id + 0.5f);
            } else {
                a = (int)(int8_t)(x[j] * id + 16.5f);
                b = (int)(int8_t)(x[j + 16] * id + 16.5f);
                a = a > 31 ? 31 : a;
                b = b > 31 ? 31 : b;
            }
            qs[j] = (uint8_t)((a & 0x0f) | (b & 0x0f) << 4);
            qh |= (uint32_t)((a & 0x10) >> 4) << j;
            qh |= (uint32_t)((b & 0x10) >> 4) << (j + 16);
        }
        memcpy(qh_out, &qh, 4);
        break;
    }
    }
}

void qk_quantize_legacy(int type, const float *x, void *out, int64_t k)
{
    const size_t bb = q_row_bytes(type, 32);
    for (int64_t b = 0; b < k / 32; b++) quantize_block(type, x + b * 32, (char *)out + b * bb);
}
