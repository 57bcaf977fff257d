/* SPDX-License-Identifier: MIT */
/*
 * common/half.h — the tree's one set of exact scalar conversions between float and the two
 * 16-bit float formats of model files: IEEE half (F16) and bfloat16 (BF16). Rounding to
 * nearest even, as ggml's reference converters; NaN stays NaN (quiet), overflow goes to
 * infinity, F16 subnormals both ways.
 *
 * Header only (static inline, libc), so model/ and kernels/ may both include it.
 */
#ifndef RINGLM_COMMON_HALF_H
#define RINGLM_COMMON_HALF_H

#include <stdint.h>
#include <string.h>

static inline float half_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t half_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf, nan */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign;
        int e = (int)(ax >> 23), shift = 126 - e; /* value = man * 2^(e-150) */
        uint32_t man = (ax & 0x7fffff) | 0x800000;
        /* half subnormal unit is 2^-24: q = man * 2^(e-150+24) = man >> (126 - e) */
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax - 0x38000000u; /* rebias 127 -> 15, in place */
    uint32_t q = r >> 13, rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

static inline float half_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t half_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

#endif
