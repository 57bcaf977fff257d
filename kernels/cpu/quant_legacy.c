/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_legacy.c — ggml's 32-element types people still download: Q4_0, Q4_1,
 * Q5_0, Q5_1 and IQ4_NL (quant.h has the layouts): dequantize, the fused dot (each block
 * dequantized into 32 floats on the stack and dotted there, the weight read once, in its
 * type), and the reference quantizers (ringlm-mkmodel; ggml's quantize_row_*_ref, and for
 * IQ4_NL the nearest table value at the block's scale rather than ggml's search).
 *
 * Portable C only: these run on every CPU, in q_matmul's fused path for a few rows and its
 * dequantized tiles into SGEMM above that; the activations stay float32 (llama.cpp rounds
 * them to 8 bits for these types: the oracle tests state that tolerance).
 */
#include "kernels/cpu/quant_internal.h"

/* IQ4_NL's sixteen values (ggml's kvalues_iq4nl), a non-linear 4-bit grid. */
static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

/* The 32 floats of block b of a row of `type`. */
static void block_floats(int type, const void *row, int64_t b, float *out)
{
    switch (type) {
    case Q_Q4_0: {
        const blk_q4_0 *x = (const blk_q4_0 *)row + b;
        const float d = qk_f16_to_f32(x->d);
        for (int j = 0; j < 16; j++) {
            out[j] = (float)((x->qs[j] & 0x0f) - 8) * d;
            out[j + 16] = (float)((x->qs[j] >> 4) - 8) * d;
        }
        break;
    }
    case Q_Q4_1: {
        const blk_q4_1 *x = (const blk_q4_1 *)row + b;
        const float d = qk_f16_to_f32(x->d), m = qk_f16_to_f32(x->m);
        for (int j = 0; j < 16; j++) {
            out[j] = (float)(x->qs[j] & 0x0f) * d + m;
            out[j + 16] = (float)(x->qs[j] >> 4) * d + m;
        }
        break;
    }
    case Q_Q5_0: {
        const blk_q5_0 *x = (const blk_q5_0 *)row + b;
        const float d = qk_f16_to_f32(x->d);
        uint32_t qh;
        memcpy(&qh, x->qh, 4);
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) << 4 & 0x10), h1 = (int)((qh >> (j + 12)) & 0x10);
            out[j] = (float)(((x->qs[j] & 0x0f) | h0) - 16) * d;
            out[j + 16] = (float)(((x->qs[j] >> 4) | h1) - 16) * d;
        }
        break;
    }
    case Q_Q5_1: {
        const blk_q5_1 *x = (const blk_q5_1 *)row + b;
        const float d = qk_f16_to_f32(x->d), m = qk_f16_to_f32(x->m);
        uint32_t qh;
        memcpy(&qh, x->qh, 4);
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) << 4 & 0x10), h1 = (int)((qh >> (j + 12)) & 0x10);
            out[j] = (float)((x->qs[j] & 0x0f) | h0) * d + m;
            out[j + 16] = (float)((x->qs[j] >> 4) | h1) * d + m;
        }
        break;
    }
    case Q_IQ4_NL: {
        const blk_iq4_nl *x = (const blk_iq4_nl *)row + b;
        const float d = qk_f16_to_f32(x->d);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)iq4nl_values[x->qs[j] & 0x0f];
            out[j + 16] = d * (float)iq4nl_values[x->qs[j] >> 4];
        }
        break;
    }
    }
}

void qk_dequant_legacy(int type, const void *row, float *out, int64_t k)
{
    for (int64_t b = 0; b < k / 32; b++) block_floats(type, row, b, out + b * 32);
}

float qk_dot_legacy(int type, const void *row, const float *x, int64_t k)
{
    float sum = 0.0f, w[32];
    for (int64_t b = 0; b < k / 32; b++) {
        block_floats(type, row, b, w);
        const float *xb = x + b * 32;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int j = 0; j < 32; j += 4) {
            s0 += w[j] * xb[j];
            s1 += w[j + 1] * xb[j + 1];
            s2 += w[j + 2] * xb[j + 2];
            s3 += w[j + 3] * xb[j + 3];
        }
        sum += (s0 + s1) + (s2 + s3);
    }
    return sum;
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
    case Q_IQ4_NL: {
        blk_iq4_nl *y = out;
        const float d = max / (float)iq4nl_values[0], id = d ? 1.0f / d : 0.0f;
        y->d = qk_f32_to_f16(d);
        uint8_t q[32];
        for (int j = 0; j < 32; j++) {
            const float v = x[j] * id;
            int best = 0;
            for (int i = 1; i < 16; i++)
                if (fabsf(v - (float)iq4nl_values[i]) < fabsf(v - (float)iq4nl_values[best]))
                    best = i;
            q[j] = (uint8_t)best;
        }
        for (int j = 0; j < 16; j++) y->qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
        break;
    }
    }
}

void qk_quantize_legacy(int type, const float *x, void *out, int64_t k)
{
    const size_t bb = q_row_bytes(type, 32);
    for (int64_t b = 0; b < k / 32; b++) quantize_block(type, x + b * 32, (char *)out + b * bb);
}
