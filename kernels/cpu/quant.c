/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant.c — dequantize, fused dequantize-and-dot (portable C and AVX2/FMA,
 * picked once at run time), dequantized-tile SGEMM for batches, and the quantizers
 * ringlm-mkmodel writes Q8_0/Q4_K/Q6_K with. See quant.h for the block layouts.
 */
#include "kernels/cpu/quant.h"
#include "kernels/cpu/gemm_small.h"

#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define QK_K 256

typedef struct {
    uint16_t d;
    int8_t qs[32];
} blk_q8_0;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
} blk_q4_k;
typedef struct {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
} blk_q6_k;

_Static_assert(sizeof(blk_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(blk_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(blk_q6_k) == 210, "Q6_K block is 210 bytes");

/* ---- types -------------------------------------------------------------------------- */

bool q_type_supported(int type)
{
    return type == Q_F32 || type == Q_F16 || type == Q_BF16 || type == Q_Q8_0 || type == Q_Q4_K ||
           type == Q_Q6_K;
}

int q_block_elems(int type)
{
    switch (type) {
    case Q_Q8_0: return 32;
    case Q_Q4_K:
    case Q_Q6_K: return QK_K;
    default: return 1;
    }
}

size_t q_row_bytes(int type, int64_t k)
{
    switch (type) {
    case Q_F32: return (size_t)k * 4;
    case Q_F16:
    case Q_BF16: return (size_t)k * 2;
    case Q_Q8_0: return (size_t)k / 32 * sizeof(blk_q8_0);
    case Q_Q4_K: return (size_t)k / QK_K * sizeof(blk_q4_k);
    case Q_Q6_K: return (size_t)k / QK_K * sizeof(blk_q6_k);
    default: return 0;
    }
}

float q_f16_to_f32(uint16_t h)
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

uint16_t q_f32_to_f16(float f)
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

float q_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t q_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ---- dequantize --------------------------------------------------------------------- */

static void dequant_q4_k_block(const blk_q4_k *b, float *y)
{
    const float d = q_f16_to_f32(b->d), min = q_f16_to_f32(b->dmin);
    const uint8_t *q = b->qs;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
        uint8_t sc, m;
        scale_min_k4(is, b->scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        scale_min_k4(is + 1, b->scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
    }
}

static void dequant_q6_k_block(const blk_q6_k *b, float *y)
{
    const float d = q_f16_to_f32(b->d);
    const uint8_t *ql = b->ql, *qh = b->qh;
    const int8_t *sc = b->scales;
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
    }
}

void q_dequant_row(int type, const void *row, float *out, int64_t k)
{
    switch (type) {
    case Q_F32: memcpy(out, row, (size_t)k * 4); break;
    case Q_F16: {
        const uint16_t *h = row;
        for (int64_t i = 0; i < k; i++) out[i] = q_f16_to_f32(h[i]);
        break;
    }
    case Q_BF16: {
        const uint16_t *h = row;
        for (int64_t i = 0; i < k; i++) out[i] = q_bf16_to_f32(h[i]);
        break;
    }
    case Q_Q8_0: {
        const blk_q8_0 *b = row;
        for (int64_t i = 0; i < k / 32; i++) {
            const float d = q_f16_to_f32(b[i].d);
            for (int j = 0; j < 32; j++) out[i * 32 + j] = d * b[i].qs[j];
        }
        break;
    }
    case Q_Q4_K:
        for (int64_t i = 0; i < k / QK_K; i++)
            dequant_q4_k_block((const blk_q4_k *)row + i, out + i * QK_K);
        break;
    case Q_Q6_K:
        for (int64_t i = 0; i < k / QK_K; i++)
            dequant_q6_k_block((const blk_q6_k *)row + i, out + i * QK_K);
        break;
    }
}

/* ---- fused dot, portable ------------------------------------------------------------ */

static float dot_portable(int type, const void *row, const float *x, int64_t k)
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
        for (int64_t i = 0; i < k; i++) sum += q_f16_to_f32(w[i]) * x[i];
        break;
    }
    case Q_BF16: {
        const uint16_t *w = row;
        for (int64_t i = 0; i < k; i++) sum += q_bf16_to_f32(w[i]) * x[i];
        break;
    }
    case Q_Q8_0: {
        const blk_q8_0 *b = row;
        for (int64_t i = 0; i < k / 32; i++, x += 32) {
            float s = 0.0f;
            for (int j = 0; j < 32; j++) s += (float)b[i].qs[j] * x[j];
            sum += q_f16_to_f32(b[i].d) * s;
        }
        break;
    }
    case Q_Q4_K: {
        const blk_q4_k *b = row;
        for (int64_t i = 0; i < k / QK_K; i++) {
            const float d = q_f16_to_f32(b[i].d), min = q_f16_to_f32(b[i].dmin);
            const uint8_t *q = b[i].qs;
            for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32, x += 64) {
                uint8_t sc1, m1, sc2, m2;
                scale_min_k4(is, b[i].scales, &sc1, &m1);
                scale_min_k4(is + 1, b[i].scales, &sc2, &m2);
                float qx1 = 0, sx1 = 0, qx2 = 0, sx2 = 0;
                for (int l = 0; l < 32; l++) {
                    qx1 += (float)(q[l] & 0xF) * x[l];
                    sx1 += x[l];
                    qx2 += (float)(q[l] >> 4) * x[l + 32];
                    sx2 += x[l + 32];
                }
                sum += d * sc1 * qx1 - min * m1 * sx1 + d * sc2 * qx2 - min * m2 * sx2;
            }
        }
        break;
    }
    case Q_Q6_K: {
        const blk_q6_k *b = row;
        float y[QK_K];
        for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
            dequant_q6_k_block(&b[i], y);
            for (int j = 0; j < QK_K; j++) sum += y[j] * x[j];
        }
        break;
    }
    }
    return sum;
}

/* ---- fused dot, AVX2 + FMA + F16C --------------------------------------------------- */

#define SIMD __attribute__((target("avx2,fma,f16c")))

SIMD static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 unsigned bytes at p as 8 int32 lanes. */
SIMD static inline __m256i u8x8(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* A row of F16 weights as floats with F16C, 8 at a time (exact, as the scalar conversion):
 * the tiles of q_matmul's batch path convert every weight of the model each step, and the
 * scalar conversion made F16 decode of 8 sequences slower than of one. */
SIMD static void dequant_f16_simd(const uint16_t *h, float *out, int64_t k)
{
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < k; i++) out[i] = q_f16_to_f32(h[i]);
}

SIMD static float dot_simd(int type, const void *row, const float *x, int64_t k)
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
        for (; i < k; i++) tail += q_f16_to_f32(w[i]) * x[i];
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
        for (; i < k; i++) tail += q_bf16_to_f32(w[i]) * x[i];
        return hsum8(acc) + tail;
    }
    case Q_Q8_0: {
        const blk_q8_0 *b = row;
        for (int64_t i = 0; i < k / 32; i++, x += 32) {
            __m256 s = _mm256_setzero_ps();
            for (int j = 0; j < 32; j += 8) {
                __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + j)));
                s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(x + j), s);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(q_f16_to_f32(b[i].d)), s, acc);
        }
        return hsum8(acc);
    }
    case Q_Q4_K: {
        const blk_q4_k *b = row;
        const __m256i lo4 = _mm256_set1_epi32(0xF);
        for (int64_t i = 0; i < k / QK_K; i++) {
            const float d = q_f16_to_f32(b[i].d), min = q_f16_to_f32(b[i].dmin);
            const uint8_t *q = b[i].qs;
            for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32, x += 64) {
                uint8_t sc1, m1, sc2, m2;
                scale_min_k4(is, b[i].scales, &sc1, &m1);
                scale_min_k4(is + 1, b[i].scales, &sc2, &m2);
                __m256 qx1 = _mm256_setzero_ps(), qx2 = _mm256_setzero_ps();
                __m256 sx1 = _mm256_setzero_ps(), sx2 = _mm256_setzero_ps();
                for (int l = 0; l < 32; l += 8) {
                    __m256i v = u8x8(q + l);
                    __m256 x1 = _mm256_loadu_ps(x + l), x2 = _mm256_loadu_ps(x + l + 32);
                    qx1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, lo4)), x1, qx1);
                    qx2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), x2, qx2);
                    sx1 = _mm256_add_ps(sx1, x1);
                    sx2 = _mm256_add_ps(sx2, x2);
                }
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc1), qx1, acc);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc2), qx2, acc);
                acc2 = _mm256_fmadd_ps(_mm256_set1_ps(min * m1), sx1, acc2);
                acc2 = _mm256_fmadd_ps(_mm256_set1_ps(min * m2), sx2, acc2);
            }
        }
        return hsum8(_mm256_sub_ps(acc, acc2));
    }
    case Q_Q6_K: {
        const blk_q6_k *b = row;
        const __m256i m4 = _mm256_set1_epi32(0xF), m2 = _mm256_set1_epi32(3);
        const __m256i off = _mm256_set1_epi32(32);
        for (int64_t i = 0; i < k / QK_K; i++) {
            const float d = q_f16_to_f32(b[i].d);
            const uint8_t *ql = b[i].ql, *qh = b[i].qh;
            const int8_t *sc = b[i].scales;
            for (int n = 0; n < QK_K; n += 128, x += 128, ql += 64, qh += 32, sc += 8) {
                for (int l = 0; l < 32; l += 8) {
                    const int is = l / 16;
                    __m256i a = u8x8(ql + l), c = u8x8(ql + l + 32), h = u8x8(qh + l);
                    __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, m4),
                                                 _mm256_slli_epi32(_mm256_and_si256(h, m2), 4));
                    __m256i q2 = _mm256_or_si256(
                        _mm256_and_si256(c, m4),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2), m2), 4));
                    __m256i q3 = _mm256_or_si256(
                        _mm256_srli_epi32(a, 4),
                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 4), m2), 4));
                    __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(c, 4),
                                                 _mm256_slli_epi32(_mm256_srli_epi32(h, 6), 4));
                    __m256 f1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q1, off));
                    __m256 f2 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q2, off));
                    __m256 f3 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q3, off));
                    __m256 f4 = _mm256_cvtepi32_ps(_mm256_sub_epi32(q4, off));
                    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d * sc[is]), f1),
                                          _mm256_loadu_ps(x + l), acc);
                    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d * sc[is + 2]), f2),
                                          _mm256_loadu_ps(x + l + 32), acc);
                    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d * sc[is + 4]), f3),
                                          _mm256_loadu_ps(x + l + 64), acc);
                    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d * sc[is + 6]), f4),
                                          _mm256_loadu_ps(x + l + 96), acc);
                }
            }
        }
        return hsum8(acc);
    }
    }
    return 0.0f;
}

/* ---- dispatch ----------------------------------------------------------------------- */

static pthread_once_t simd_once = PTHREAD_ONCE_INIT;
static int isa_best; /* Q_ISA_* of this CPU */
static _Atomic int isa_cap = Q_ISA_AVX512;

static void simd_probe(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        isa_best = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                           __builtin_cpu_supports("avx512vnni")
                       ? Q_ISA_AVX512
                       : Q_ISA_AVX2;
    const char *env = getenv("RINGLM_QUANT_PORTABLE");
    if (env && *env && strcmp(env, "0") != 0) isa_cap = Q_ISA_PORTABLE;
    env = getenv("RINGLM_QUANT_NO_AVX512");
    if (env && *env && strcmp(env, "0") != 0 && isa_cap > Q_ISA_AVX2) isa_cap = Q_ISA_AVX2;
}

int q_isa(void)
{
    pthread_once(&simd_once, simd_probe);
    return isa_best < isa_cap ? isa_best : isa_cap;
}

int q_isa_cap(int cap)
{
    pthread_once(&simd_once, simd_probe);
    return atomic_exchange(&isa_cap, cap);
}

const char *q_isa_name(int isa)
{
    return isa >= Q_ISA_AVX512 ? "avx512-vnni" : isa == Q_ISA_AVX2 ? "avx2-fma" : "portable";
}

bool q_force_portable(bool on)
{
    return q_isa_cap(on ? Q_ISA_PORTABLE : Q_ISA_AVX512) == Q_ISA_PORTABLE;
}

bool q_simd_active(void)
{
    return q_isa() > Q_ISA_PORTABLE;
}

float q_dot(int type, const void *row, const float *x, int64_t k)
{
    return q_simd_active() ? dot_simd(type, row, x, k) : dot_portable(type, row, x, k);
}

#define FUSED_MAX_ROWS Q_FUSED_MAX_ROWS
/* Q8_0's integer path runs up to Q_INT_MAX_ROWS rows: groups of up to Q8_GROUP_ROWS rows
 * (the accumulators in registers) over tiles of Q8_TILE weight rows (kept in L1/L2 while
 * every group passes over them). */
#define Q8_GROUP_ROWS  8
#define Q8_TILE        16

/* ---- Q8_0 decode: activations quantized to 8 bits, integer dots ----------------------- */

/* For Q8_0 weights the fused path quantizes each activation row the way llama.cpp does for
 * this type: per 32 elements, scale d = max|x| / 127 (kept as f16, as a Q8_0 block keeps it)
 * and q = x * 127 / max|x| rounded to nearest even. A block's product is then d_w * d_x *
 * sum q_w q_x: the integer sum is exact, so the three paths (portable, AVX2, AVX-512 VNNI)
 * differ only in the order they add the per-block floats. */
typedef struct xq8 {
    int8_t *q; /* rows x k */
    float *d;  /* rows x k/32 */
    float *s;  /* rows x k/32: d * sum q, the block's sum as quantized (Q4_K's minimums) */
} xq8;

static float xq8_scale(float amax, float *id)
{
    *id = amax != 0.0f ? 127.0f / amax : 0.0f;
    return q_f16_to_f32(q_f32_to_f16(amax / 127.0f));
}

static void xq8_row_portable(const float *x, int8_t *q, float *d, float *s, int64_t k)
{
    for (int64_t b = 0; b < k / 32; b++, x += 32, q += 32) {
        float amax = 0.0f, id;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        d[b] = xq8_scale(amax, &id);
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            q[j] = (int8_t)nearbyintf(x[j] * id);
            sum += q[j];
        }
        s[b] = d[b] * (float)sum;
    }
}

SIMD static void xq8_row_avx2(const float *x, int8_t *q, float *d, float *s, int64_t k)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < k / 32; b++, x += 32, q += 32) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m =
            _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                          _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float id;
        d[b] = xq8_scale(_mm_cvtss_f32(h), &id);
        const __m256 vid = _mm256_set1_ps(id);
        const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, vid), rnd));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, vid), rnd));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, vid), rnd));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, vid), rnd));
        /* packs work within 128-bit lanes: the permute puts the 32 bytes back in order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, perm);
        _mm256_storeu_si256((__m256i *)q, p);
        __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        s[b] = d[b] * (float)_mm_cvtsi128_si32(s4);
    }
}

/* The portable integer dots of one weight row w (nb blocks of its type) with one quantized
 * activation row (xq: k bytes, xd: its k/32 scales, xs: d x sum q per 32). */
static float q8_dot_portable(const void *wv, int64_t k, const int8_t *xq, const float *xd,
                             const float *xs)
{
    (void)xs;
    const blk_q8_0 *w = wv;
    float sum = 0.0f;
    for (int64_t b = 0; b < k / 32; b++) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += w[b].qs[j] * xq[b * 32 + j];
        sum += q_f16_to_f32(w[b].d) * xd[b] * (float)s;
    }
    return sum;
}

/* Q4_K: per 32-element sub-block j, x = d sc_j q - dmin m_j with q in 0..15 (unsigned, so
 * dotted as it is); the minimums meet the quantized block sums. */
static float q4k_dot_portable(const void *wv, int64_t k, const int8_t *xq, const float *xd,
                              const float *xs)
{
    const blk_q4_k *w = wv;
    float sum = 0.0f, mins = 0.0f;
    for (int64_t b = 0; b < k / QK_K; b++) {
        const float d = q_f16_to_f32(w[b].d), dmin = q_f16_to_f32(w[b].dmin);
        float m = 0.0f;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            scale_min_k4(j, w[b].scales, &sc, &mn);
            const uint8_t *q = w[b].qs + 32 * (j / 2);
            const int8_t *xj = xq + b * QK_K + 32 * j;
            int s = 0;
            for (int l = 0; l < 32; l++) s += (j % 2 ? q[l] >> 4 : q[l] & 0xF) * xj[l];
            sum += d * sc * xd[b * 8 + j] * (float)s;
            m += mn * xs[b * 8 + j];
        }
        mins += dmin * m;
    }
    return sum - mins;
}

/* The 6-bit value of element e (0..255) of a Q6_K block, 0..63. */
static int q6k_q(const blk_q6_k *b, int e)
{
    const int h = e / 128, c = e % 128 / 32, l = e % 32;
    const uint8_t ql = b->ql[64 * h + l + (c & 1) * 32], qh = b->qh[32 * h + l];
    return ((c < 2 ? ql & 0xF : ql >> 4) | ((qh >> (2 * c)) & 3) << 4);
}

/* Q6_K: per 16-element sub-block g, x = d scales[g] (q - 32). */
static float q6k_dot_portable(const void *wv, int64_t k, const int8_t *xq, const float *xd,
                              const float *xs)
{
    (void)xs;
    const blk_q6_k *w = wv;
    float sum = 0.0f;
    for (int64_t b = 0; b < k / QK_K; b++) {
        const float d = q_f16_to_f32(w[b].d);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += (q6k_q(&w[b], 16 * g + l) - 32) * xq[b * QK_K + 16 * g + l];
            sum += d * w[b].scales[g] * xd[b * 8 + g / 2] * (float)s;
        }
    }
    return sum;
}

/* y[r][i] = beta y[r][i] + w_i . x_r for the n weight rows and the rows of x, portable. */
static void rows_portable(int type, const void *wv, int n, int64_t k, const xq8 *x, int rows,
                          float beta, float *y, int ld_y)
{
    float (*dot)(const void *, int64_t, const int8_t *, const float *, const float *) =
        type == Q_Q8_0   ? q8_dot_portable
        : type == Q_Q4_K ? q4k_dot_portable
                         : q6k_dot_portable;
    const size_t rb = q_row_bytes(type, k), nx = (size_t)k / 32;
    for (int i = 0; i < n; i++)
        for (int r = 0; r < rows; r++) {
            const float sum = dot((const char *)wv + (size_t)i * rb, k, x->q + (size_t)r * k,
                                  x->d + (size_t)r * nx, x->s + (size_t)r * nx);
            float *yr = y + (size_t)r * ld_y + i;
            *yr = beta == 0.0f ? sum : beta * *yr + sum;
        }
}

/* The rows' products with each weight row: acc[r] += d_w d_x[r] * (w . x[r]) per block; DOT
 * gives the 8 int32 partial sums of |w| (unsigned) times x[r] with w's sign. R is a constant
 * in each expansion (1..Q8_GROUP_ROWS), so the accumulators stay in registers. */
#define Q8_ROWS_KERNEL(name, attr, DOT)                                                            \
    attr static inline __attribute__((always_inline)) void name##_r(                               \
        const blk_q8_0 *w, int n, int64_t k, const xq8 *x, float beta, float *y, int ld_y,         \
        const int R)                                                                               \
    {                                                                                              \
        const int64_t nb = k / 32;                                                                 \
        for (int i = 0; i < n; i++, w += nb) {                                                     \
            __m256 acc[Q8_GROUP_ROWS];                                                             \
            for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                              \
            for (int64_t b = 0; b < nb; b++) {                                                     \
                const __m256i wq = _mm256_loadu_si256((const __m256i *)w[b].qs);                   \
                const __m256i aw = _mm256_sign_epi8(wq, wq);                                       \
                const float dw = _cvtsh_ss(w[b].d);                                                \
                for (int r = 0; r < R; r++) {                                                      \
                    const __m256i xq =                                                             \
                        _mm256_loadu_si256((const __m256i *)(x->q + (size_t)r * k + b * 32));      \
                    const __m256i p = DOT(aw, _mm256_sign_epi8(xq, wq));                           \
                    acc[r] =                                                                       \
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),                                     \
                                        _mm256_set1_ps(dw * x->d[(size_t)r * nb + b]), acc[r]);    \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < R; r++) {                                                          \
                float *yr = y + (size_t)r * ld_y + i, sum = hsum8(acc[r]);                         \
                *yr = beta == 0.0f ? sum : beta * *yr + sum;                                       \
            }                                                                                      \
        }                                                                                          \
    }

SIMD static inline __m256i dot_u8s8_avx2(__m256i a, __m256i b)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}


/* Q4_K: 32 bytes of q hold two sub-blocks (low nibbles, then high); the minimums are summed
 * apart, in scalars, from the quantized block sums. */
#define Q4K_ROWS_KERNEL(name, attr, DOT)                                                           \
    attr static inline __attribute__((always_inline)) void name##_r(                               \
        const blk_q4_k *w, int n, int64_t k, const xq8 *x, float beta, float *y, int ld_y,         \
        const int R)                                                                               \
    {                                                                                              \
        const int64_t nb = k / QK_K, nx = k / 32;                                                  \
        const __m256i m4 = _mm256_set1_epi8(0x0F);                                                 \
        for (int i = 0; i < n; i++, w += nb) {                                                     \
            __m256 acc[Q8_GROUP_ROWS];                                                             \
            float mins[Q8_GROUP_ROWS];                                                             \
            for (int r = 0; r < R; r++) {                                                          \
                acc[r] = _mm256_setzero_ps();                                                      \
                mins[r] = 0.0f;                                                                    \
            }                                                                                      \
            for (int64_t b = 0; b < nb; b++) {                                                     \
                const float d = _cvtsh_ss(w[b].d), dmin = _cvtsh_ss(w[b].dmin);                    \
                uint8_t sc[8], mn[8];                                                              \
                for (int j = 0; j < 8; j++) scale_min_k4(j, w[b].scales, &sc[j], &mn[j]);          \
                for (int jj = 0; jj < 4; jj++) {                                                   \
                    const __m256i qv = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * jj));   \
                    const __m256i lo = _mm256_and_si256(qv, m4);                                   \
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);             \
                    const float s_lo = d * sc[2 * jj], s_hi = d * sc[2 * jj + 1];                  \
                    for (int r = 0; r < R; r++) {                                                  \
                        const int8_t *xr = x->q + (size_t)r * k + b * QK_K + 64 * jj;              \
                        const float *dx = x->d + (size_t)r * nx + b * 8 + 2 * jj;                  \
                        const __m256i pl = DOT(lo, _mm256_loadu_si256((const __m256i *)xr));       \
                        const __m256i ph =                                                         \
                            DOT(hi, _mm256_loadu_si256((const __m256i *)(xr + 32)));               \
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pl),                           \
                                                 _mm256_set1_ps(s_lo * dx[0]), acc[r]);            \
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ph),                           \
                                                 _mm256_set1_ps(s_hi * dx[1]), acc[r]);            \
                    }                                                                              \
                }                                                                                  \
                for (int r = 0; r < R; r++) {                                                      \
                    const float *xs = x->s + (size_t)r * nx + b * 8;                               \
                    float m = 0.0f;                                                                \
                    for (int j = 0; j < 8; j++) m += mn[j] * xs[j];                                \
                    mins[r] += dmin * m;                                                           \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < R; r++) {                                                          \
                float *yr = y + (size_t)r * ld_y + i, sum = hsum8(acc[r]) - mins[r];               \
                *yr = beta == 0.0f ? sum : beta * *yr + sum;                                       \
            }                                                                                      \
        }                                                                                          \
    }

/* Q6_K: each half of a block is 4 chunks of 32 elements (ql low nibbles, ql+32 low, ql high,
 * ql+32 high, each with its 2 bits of qh); chunk c's lanes 0-3 take scales[2c], 4-7
 * scales[2c+1]; q - 32 is signed, so dotted like Q8_0 (|w| times x with w's sign). */
#define Q6K_ROWS_KERNEL(name, attr, DOT)                                                           \
    attr static inline __attribute__((always_inline)) void name##_r(                               \
        const blk_q6_k *w, int n, int64_t k, const xq8 *x, float beta, float *y, int ld_y,         \
        const int R)                                                                               \
    {                                                                                              \
        const int64_t nb = k / QK_K, nx = k / 32;                                                  \
        const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);                       \
        const __m256i off = _mm256_set1_epi8(32);                                                  \
        for (int i = 0; i < n; i++, w += nb) {                                                     \
            __m256 acc[Q8_GROUP_ROWS];                                                             \
            for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                              \
            for (int64_t b = 0; b < nb; b++) {                                                     \
                const float d = _cvtsh_ss(w[b].d);                                                 \
                for (int h = 0; h < 2; h++) {                                                      \
                    const uint8_t *ql = w[b].ql + 64 * h, *qh = w[b].qh + 32 * h;                  \
                    const int8_t *sc = w[b].scales + 8 * h;                                        \
                    const __m256i A = _mm256_loadu_si256((const __m256i *)ql);                     \
                    const __m256i B = _mm256_loadu_si256((const __m256i *)(ql + 32));              \
                    const __m256i H = _mm256_loadu_si256((const __m256i *)qh);                     \
                    __m256i q[4];                                                                  \
                    q[0] = _mm256_or_si256(_mm256_and_si256(A, m4),                                \
                                           _mm256_slli_epi16(_mm256_and_si256(H, m2), 4));         \
                    q[1] = _mm256_or_si256(                                                        \
                        _mm256_and_si256(B, m4),                                                   \
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), m2), 4));      \
                    q[2] = _mm256_or_si256(                                                        \
                        _mm256_and_si256(_mm256_srli_epi16(A, 4), m4),                             \
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), m2), 4));      \
                    q[3] = _mm256_or_si256(                                                        \
                        _mm256_and_si256(_mm256_srli_epi16(B, 4), m4),                             \
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), m2), 4));      \
                    for (int c = 0; c < 4; c++) {                                                  \
                        const __m256i sq = _mm256_sub_epi8(q[c], off);                             \
                        const __m256i aw = _mm256_sign_epi8(sq, sq);                               \
                        const __m256 S = _mm256_insertf128_ps(                                     \
                            _mm256_castps128_ps256(_mm_set1_ps(d * sc[2 * c])),                    \
                            _mm_set1_ps(d * sc[2 * c + 1]), 1);                                    \
                        for (int r = 0; r < R; r++) {                                              \
                            const __m256i xv = _mm256_loadu_si256(                                 \
                                (const __m256i *)(x->q + (size_t)r * k + b * QK_K + 128 * h +      \
                                                  32 * c));                                        \
                            const __m256i p = DOT(aw, _mm256_sign_epi8(xv, sq));                   \
                            const float dx = x->d[(size_t)r * nx + b * 8 + 4 * h + c];             \
                            acc[r] =                                                               \
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),                             \
                                                _mm256_mul_ps(S, _mm256_set1_ps(dx)), acc[r]);     \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < R; r++) {                                                          \
                float *yr = y + (size_t)r * ld_y + i, sum = hsum8(acc[r]);                         \
                *yr = beta == 0.0f ? sum : beta * *yr + sum;                                       \
            }                                                                                      \
        }                                                                                          \
    }

/* The dispatch on the row count (each R a constant), for a block type T. */
#define ROWS_DISPATCH(name, attr, T)                                                               \
    attr static void name(const void *wv, int n, int64_t k, const xq8 *x, int rows, float beta,    \
                          float *y, int ld_y)                                                      \
    {                                                                                              \
        const T *w = wv;                                                                           \
        switch (rows) {                                                                            \
        case 1: name##_r(w, n, k, x, beta, y, ld_y, 1); break;                                     \
        case 2: name##_r(w, n, k, x, beta, y, ld_y, 2); break;                                     \
        case 3: name##_r(w, n, k, x, beta, y, ld_y, 3); break;                                     \
        case 4: name##_r(w, n, k, x, beta, y, ld_y, 4); break;                                     \
        case 5: name##_r(w, n, k, x, beta, y, ld_y, 5); break;                                     \
        case 6: name##_r(w, n, k, x, beta, y, ld_y, 6); break;                                     \
        case 7: name##_r(w, n, k, x, beta, y, ld_y, 7); break;                                     \
        default: name##_r(w, n, k, x, beta, y, ld_y, 8); break;                                    \
        }                                                                                          \
    }

Q8_ROWS_KERNEL(q8_rows_avx2, SIMD, dot_u8s8_avx2)
Q4K_ROWS_KERNEL(q4k_rows_avx2, SIMD, dot_u8s8_avx2)
Q6K_ROWS_KERNEL(q6k_rows_avx2, SIMD, dot_u8s8_avx2)
ROWS_DISPATCH(q8_rows_avx2, SIMD, blk_q8_0)
ROWS_DISPATCH(q4k_rows_avx2, SIMD, blk_q4_k)
ROWS_DISPATCH(q6k_rows_avx2, SIMD, blk_q6_k)

/* ---- AVX-512 VNNI tiles: 16 weight rows x up to 8 activation rows in registers --------- */

/* Above a few rows the products are compute-bound, and the kernels above spend more
 * instructions per block on its float scale and horizontal sums than on the integer dot. Here
 * a tile of VT_COLS weight rows is first repacked (gathers) so that one zmm holds 4 bytes of
 * the same block of 16 weight rows, one lane each, as unsigned bytes; one vpdpbusd then dots
 * them with 4 bytes of one activation row broadcast (64 MACs), and the block's scale is one
 * multiply-add per activation row for all 16 outputs. The activations, quantized as for the
 * kernels above (the same integers), are laid out block-major so the rows of a pass sit
 * together. The integer sums are exact: Q8_0's weights are stored as w + 128 and Q6_K's as
 * q in 0..63, and each block's sum starts at -128 (-32) x its activations' integer sum. */
#define VT_COLS 16
#define VT_ROWS 8
/* Every row count with AVX-512 VNNI: from 2 rows the repacked tiles win (1 thread, Q8_0
 * 768x768: 42 against 20 GMAC/s for the 8-row kernels above at 2 rows, 190 against 41 at 32);
 * 1 row (decode alone) dots the weights as they lie (vt1_*, below) with the same arithmetic. */
#define VNNI512                                                                                    \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))

typedef struct vt_w { /* one repacked tile of VT_COLS weight rows, nb blocks of 32 */
    uint8_t *q;       /* [nb][8][16][4] unsigned weights */
    float *a;         /* [nb][16] block scales */
    float *m;         /* [nb][16] Q4_K: dmin * m_j */
    int32_t *sc;      /* [nb][2][16] Q6_K: the two 16-element scales */
} vt_w;

typedef struct vt_x { /* the activation rows, block-major */
    int8_t *q;        /* [nb][rows][32] */
    float *d;         /* [nb][rows] scales */
    float *s;         /* [nb][rows] d x sum q (Q4_K's minimums) */
    int32_t *c32;     /* [nb][rows] -128 x sum q (Q8_0) */
    int32_t *c16;     /* [2 nb][rows] -32 x sum q per 16 elements (Q6_K) */
    int rows;
} vt_x;

VNNI512 static inline __m512 vt_f16x16(__m512i v) /* the low halves of 16 dwords, as f16 */
{
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

/* out[g], lane c: the g-th 4 bytes of the 32 at p + c * rb, for the m (<= 16) columns c < m
 * (the others 0, never read): two 8x8 transposes of dwords, one in each half of the zmm. */
VNNI512 static inline __attribute__((always_inline)) void vt_transpose(const char *p, size_t rb,
                                                                       int m, __m512i out[8])
{
    __m512i z[8], t[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        const __m256i lo = _mm256_maskz_loadu_epi32(i < m ? 0xFF : 0, p + (size_t)i * rb);
        const __m256i hi = _mm256_maskz_loadu_epi32(i + 8 < m ? 0xFF : 0, p + (size_t)(i + 8) * rb);
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 4) {
        z[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        z[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        z[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        z[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    const __m512i lo128 = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi128 = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 8
    for (int i = 0; i < 4; i++) {
        out[i] = _mm512_permutex2var_epi64(z[i], lo128, z[i + 4]);
        out[i + 4] = _mm512_permutex2var_epi64(z[i], hi128, z[i + 4]);
    }
}

/* Byte offsets of 16 rows rb bytes apart (the gathers' index). */
VNNI512 static inline __m512i vt_row_offsets(size_t rb)
{
    return _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)rb));
}

/* Q8_0 scales of the m (<= 16) rows of w at rb bytes apart, all nb blocks: t->a. */
VNNI512 static void vt_scales_q8_0(const char *w, size_t rb, int m, int64_t nb, const vt_w *t)
{
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    const __m512i idx = vt_row_offsets(rb), z = _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; b++)
        _mm512_storeu_ps(t->a + b * 16, vt_f16x16(_mm512_mask_i32gather_epi32(
                                            z, mask, idx, w + b * (int64_t)sizeof(blk_q8_0), 1)));
}

/* Q8_0: the m (<= 16) rows of w at rb bytes apart, all nb blocks. */
VNNI512 static void vt_pack_q8_0(const char *w, size_t rb, int m, int64_t nb, const vt_w *t)
{
    const __m512i flip = _mm512_set1_epi32((int)0x80808080u);
    vt_scales_q8_0(w, rb, m, nb, t);
    for (int64_t b = 0; b < nb; b++) {
        const char *base = w + b * (int64_t)sizeof(blk_q8_0);
        __m512i v[8];
        vt_transpose(base + 2, rb, m, v);
        for (int g = 0; g < 8; g++)
            _mm512_storeu_si512(t->q + (b * 8 + g) * 64, _mm512_xor_si512(v[g], flip));
    }
}

/* Q4_K scales: per 256 elements, d, dmin and the 6-bit (scale, min) pairs unpacked in
 * vectors (as scale_min_k4): t->a = d sc_j, t->m = dmin m_j. */
VNNI512 static void vt_scales_q4_k(const char *w, size_t rb, int m, int64_t nb, const vt_w *t)
{
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    const __m512i idx = vt_row_offsets(rb), z = _mm512_setzero_si512();
    const __m512i m6 = _mm512_set1_epi32(63), m2 = _mm512_set1_epi32(3),
                  m4s = _mm512_set1_epi32(15);
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const char *base = w + sb * (int64_t)sizeof(blk_q4_k);
        const __m512i dd = _mm512_mask_i32gather_epi32(z, mask, idx, base, 1);
        const __m512 d = vt_f16x16(dd), dmin = vt_f16x16(_mm512_srli_epi32(dd, 16));
        const __m512i D0 = _mm512_mask_i32gather_epi32(z, mask, idx, base + 4, 1);
        const __m512i D1 = _mm512_mask_i32gather_epi32(z, mask, idx, base + 8, 1);
        const __m512i D2 = _mm512_mask_i32gather_epi32(z, mask, idx, base + 12, 1);
        float *a = t->a + sb * 8 * 16, *mm = t->m + sb * 8 * 16;
        for (int j = 0; j < 4; j++) {
            const __m512i b0 = _mm512_srli_epi32(D0, 8 * j), b1 = _mm512_srli_epi32(D1, 8 * j);
            const __m512i b2 = _mm512_srli_epi32(D2, 8 * j);
            const __m512i sc = _mm512_and_si512(b0, m6), mn = _mm512_and_si512(b1, m6);
            const __m512i sc4 = _mm512_or_si512(
                _mm512_and_si512(b2, m4s),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b0, 6), m2), 4));
            const __m512i mn4 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32(b2, 4), m4s),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b1, 6), m2), 4));
            _mm512_storeu_ps(a + j * 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
            _mm512_storeu_ps(mm + j * 16, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn)));
            _mm512_storeu_ps(a + (j + 4) * 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc4)));
            _mm512_storeu_ps(mm + (j + 4) * 16, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn4)));
        }
    }
}

/* Q4_K: the scales as above, and the nibbles of each 32 bytes as two blocks. */
VNNI512 static void vt_pack_q4_k(const char *w, size_t rb, int m, int64_t nb, const vt_w *t)
{
    const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
    vt_scales_q4_k(w, rb, m, nb, t);
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const char *base = w + sb * (int64_t)sizeof(blk_q4_k);
        for (int jj = 0; jj < 4; jj++) {
            __m512i v[8];
            vt_transpose(base + 16 + 32 * jj, rb, m, v);
            for (int g = 0; g < 8; g++) {
                _mm512_storeu_si512(t->q + ((sb * 8 + 2 * jj) * 8 + g) * 64,
                                    _mm512_and_si512(v[g], m4));
                _mm512_storeu_si512(t->q + ((sb * 8 + 2 * jj + 1) * 8 + g) * 64,
                                    _mm512_and_si512(_mm512_srli_epi32(v[g], 4), m4));
            }
        }
    }
}

/* Q6_K: per 256 elements, d (read as the upper half of the dword ending the block), the
 * sixteen int8 scales, and the 6-bit values of each 32-element chunk (see Q6K_ROWS_KERNEL). */
/* Q6_K scales: t->a = d for every block of 32; with sc, t->sc = the two int8 scales of
 * each (their 16 elements). */
VNNI512 static void vt_scales_q6_k(const char *w, size_t rb, int m, int64_t nb, const vt_w *t,
                                   bool sc)
{
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    const __m512i idx = vt_row_offsets(rb), z = _mm512_setzero_si512();
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const char *base = w + sb * (int64_t)sizeof(blk_q6_k);
        const __m512 d = vt_f16x16(
            _mm512_srli_epi32(_mm512_mask_i32gather_epi32(z, mask, idx, base + 206, 1), 16));
        __m512i S[4];
        for (int i = 0; i < 4 && sc; i++)
            S[i] = _mm512_mask_i32gather_epi32(z, mask, idx, base + 192 + 4 * i, 1);
        for (int c32 = 0; c32 < 8; c32++) {
            const int64_t b = sb * 8 + c32;
            _mm512_storeu_ps(t->a + b * 16, d);
            for (int hh = 0; hh < 2 && sc; hh++) {
                const int G = 2 * c32 + hh; /* scales[G], a signed byte */
                _mm512_storeu_si512(
                    t->sc + (b * 2 + hh) * 16,
                    _mm512_srai_epi32(_mm512_slli_epi32(S[G / 4], 24 - 8 * (G % 4)), 24));
            }
        }
    }
}

VNNI512 static void vt_pack_q6_k(const char *w, size_t rb, int m, int64_t nb, const vt_w *t)
{
    const __m512i m4 = _mm512_set1_epi32(0x0F0F0F0F);
    const __m512i m2 = _mm512_set1_epi32(0x03030303);
    vt_scales_q6_k(w, rb, m, nb, t, true);
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const char *base = w + sb * (int64_t)sizeof(blk_q6_k);
        for (int h = 0; h < 2; h++) {
            __m512i vl0[8], vl1[8], vh[8];
            vt_transpose(base + 64 * h, rb, m, vl0);
            vt_transpose(base + 64 * h + 32, rb, m, vl1);
            vt_transpose(base + 128 + 32 * h, rb, m, vh);
            for (int g = 0; g < 8; g++) {
                const __m512i L0 = vl0[g], L1 = vl1[g], H = vh[g];
                const __m512i q[4] = {
                    _mm512_or_si512(_mm512_and_si512(L0, m4),
                                    _mm512_slli_epi32(_mm512_and_si512(H, m2), 4)),
                    _mm512_or_si512(
                        _mm512_and_si512(L1, m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H, 2), m2), 4)),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi32(L0, 4), m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H, 4), m2), 4)),
                    _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi32(L1, 4), m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H, 6), m2), 4)),
                };
                for (int c = 0; c < 4; c++)
                    _mm512_storeu_si512(t->q + ((sb * 8 + 4 * h + c) * 8 + g) * 64, q[c]);
            }
        }
    }
}

/* The float step of one block b of 32 for one activation row, with p the exact integer sums
 * of the block against the tile's 16 weight rows (Q6_K: already times the 16-element
 * scales): acc += p * (scale * dx), and for Q4_K acc -= dmin m_j * sx. vt_kernel and
 * vt1_kernel (one row) both add through this, so a row alone and the same row in a batch
 * get the same outputs to the bit. */
VNNI512 static inline __attribute__((always_inline)) __m512
vt_acc(const int TYPE, __m512 acc, __m512i p, const vt_w *w, int64_t b, float dx, float sx)
{
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                          _mm512_mul_ps(_mm512_loadu_ps(w->a + b * 16), _mm512_set1_ps(dx)), acc);
    if (TYPE == Q_Q4_K)
        acc = _mm512_fnmadd_ps(_mm512_loadu_ps(w->m + b * 16), _mm512_set1_ps(sx), acc);
    return acc;
}

/* y[0..15] (mask: the columns that exist) = acc, or beta y + acc. */
VNNI512 static inline __attribute__((always_inline)) void vt_store(float *yr, __m512 v, float beta,
                                                                   __mmask16 mask)
{
    if (beta != 0.0f)
        v = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, yr)), v);
    _mm512_mask_storeu_ps(yr, mask, v);
}

/* The R (a constant, 1..VT_ROWS) activation rows from r0 times the tile, into y's 16 columns
 * (mask: those that exist). TYPE is a constant too. */
VNNI512 static inline __attribute__((always_inline)) void
vt_kernel(const int TYPE, const int R, const vt_w *w, int64_t nb, const vt_x *x, int r0, float beta,
          float *y, int ld_y, __mmask16 mask)
{
    __m512 acc[VT_ROWS];
    const int rows = x->rows;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wq = w->q + b * 512;
        const int8_t *xq = x->q + ((size_t)b * rows + r0) * 32;
        __m512i p[VT_ROWS], p2[VT_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            if (TYPE == Q_Q8_0) {
                p[r] = _mm512_set1_epi32(x->c32[(size_t)b * rows + r0 + r]);
            } else if (TYPE == Q_Q6_K) {
                p[r] = _mm512_set1_epi32(x->c16[(size_t)2 * b * rows + r0 + r]);
                p2[r] = _mm512_set1_epi32(x->c16[(size_t)(2 * b + 1) * rows + r0 + r]);
            } else {
                p[r] = _mm512_setzero_si512();
            }
        }
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m512i wv = _mm512_loadu_si512(wq + 64 * g);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                int32_t xv;
                memcpy(&xv, xq + 32 * r + 4 * g, 4);
                if (TYPE == Q_Q6_K && g >= 4)
                    p2[r] = _mm512_dpbusd_epi32(p2[r], wv, _mm512_set1_epi32(xv));
                else
                    p[r] = _mm512_dpbusd_epi32(p[r], wv, _mm512_set1_epi32(xv));
            }
        }
        if (TYPE == Q_Q6_K) {
            const __m512i s0 = _mm512_loadu_si512(w->sc + b * 32);
            const __m512i s1 = _mm512_loadu_si512(w->sc + b * 32 + 16);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                p[r] =
                    _mm512_add_epi32(_mm512_mullo_epi32(p[r], s0), _mm512_mullo_epi32(p2[r], s1));
        }
        const float *dx = x->d + (size_t)b * rows + r0, *sx = x->s + (size_t)b * rows + r0;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r] = vt_acc(TYPE, acc[r], p[r], w, b, dx[r], sx[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) vt_store(y + (size_t)(r0 + r) * ld_y, acc[r], beta, mask);
}

#define VT_DISPATCH(name, TYPE)                                                                    \
    VNNI512 static void name(const vt_w *w, int64_t nb, const vt_x *x, int r0, int R, float beta,  \
                             float *y, int ld_y, __mmask16 mask)                                   \
    {                                                                                              \
        switch (R) {                                                                               \
        case 1: vt_kernel(TYPE, 1, w, nb, x, r0, beta, y, ld_y, mask); break;                      \
        case 2: vt_kernel(TYPE, 2, w, nb, x, r0, beta, y, ld_y, mask); break;                      \
        case 3: vt_kernel(TYPE, 3, w, nb, x, r0, beta, y, ld_y, mask); break;                      \
        case 4: vt_kernel(TYPE, 4, w, nb, x, r0, beta, y, ld_y, mask); break;                      \
        case 5: vt_kernel(TYPE, 5, w, nb, x, r0, beta, y, ld_y, mask); break;                      \
        case 6: vt_kernel(TYPE, 6, w, nb, x, r0, beta, y, ld_y, mask); break;                      \
        case 7: vt_kernel(TYPE, 7, w, nb, x, r0, beta, y, ld_y, mask); break;                      \
        default: vt_kernel(TYPE, 8, w, nb, x, r0, beta, y, ld_y, mask); break;                     \
        }                                                                                          \
    }
VT_DISPATCH(vt_rows_q8_0, Q_Q8_0)
VT_DISPATCH(vt_rows_q4_k, Q_Q4_K)
VT_DISPATCH(vt_rows_q6_k, Q_Q6_K)

/* ---- AVX-512 VNNI, one activation row ------------------------------------------------- */

/* Decode alone (1 row) streams the weights from memory once; repacking them (vt_pack_*) costs
 * more than it saves there. Here each of a tile's 16 weight rows is dotted with the row as it
 * lies, 64 bytes (two blocks of 32) per vpdpbusd, and a transposing reduction turns the 16
 * vectors (one per weight row) into the exact integer sums of the two blocks for the 16 rows,
 * lane = weight row: the very integers vt_kernel forms (Q6_K's already times its 16-element
 * scales, as vt_kernel has them before the float step). The float steps are vt_kernel's own
 * (vt_acc, vt_store), so a sequence decoding alone gets, to the bit, what it gets in a batch. */

/* v[i]: for weight row i, lanes 0-7 partial sums of block A, lanes 8-15 of block B. Out: the
 * 16 rows' whole sums of A and of B, lane i = row i. */
VNNI512 static inline __attribute__((always_inline)) void vt1_reduce(const __m512i v[16],
                                                                     __m512i *a, __m512i *b)
{
    __m512i t[8], u[4];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* per 128 bits: rows 2i, 2i+1, 2i, 2i+1 */
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* per 128 bits: rows 4i..4i+3; A, A, B, B */
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]),
                                _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    /* per 128 bits: A rows 0-3, B 0-3, A 4-7, B 4-7 (and 8-15 in w1) */
    const __m512i w0 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i w1 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_i32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    *a = _mm512_shuffle_i32x4(w0, w1, _MM_SHUFFLE(2, 0, 2, 0));
    *b = _mm512_shuffle_i32x4(w0, w1, _MM_SHUFFLE(3, 1, 3, 1));
}

/* The 16 rows of a tile (rows m.. repeat row m-1: computed, never stored); returns how far
 * the next tile lies, which the kernels fetch while they dot this one. */
static inline size_t vt1_rows(const char *w, size_t rb, int m, const char *row[16])
{
    for (int i = 0; i < 16; i++) row[i] = w + (size_t)(i < m ? i : m - 1) * rb;
    return VT_COLS * rb;
}

/* P[b][i]: block b of row i . the activation row, exactly (as vt_kernel's p for Q8_0). */
VNNI512 static void vt1_sums_q8_0(const char *w, size_t rb, int m, int64_t nb, const vt_x *x,
                                  const int16_t *x32, int32_t *P)
{
    (void)x32;
    const char *row[16];
    const size_t pf = vt1_rows(w, rb, m, row);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b += 2) {
        const bool two = b + 1 < nb;
        const __m512i xv =
            two ? _mm512_loadu_si512(x->q + b * 32)
                : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(x->q + b * 32)));
        __m512i v[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const char *p = row[i] + b * (int64_t)sizeof(blk_q8_0) + 2;
            _mm_prefetch(p + pf, _MM_HINT_T0);
            _mm_prefetch(p + pf + 2 * sizeof(blk_q8_0) - 3, _MM_HINT_T0);
            const __m256i lo = _mm256_loadu_si256((const __m256i *)p);
            const __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(p + sizeof(blk_q8_0)))
                                   : _mm256_setzero_si256();
            /* w + 128 unsigned; the block's -128 x sum of x is added below (vt's c32) */
            const __m512i q =
                _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), flip);
            v[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xv);
        }
        __m512i A, B;
        vt1_reduce(v, &A, &B);
        _mm512_storeu_si512(P + b * 16, _mm512_add_epi32(A, _mm512_set1_epi32(x->c32[b])));
        if (two)
            _mm512_storeu_si512(P + (b + 1) * 16,
                                _mm512_add_epi32(B, _mm512_set1_epi32(x->c32[b + 1])));
    }
}

/* Q4_K: each 32 bytes of q as [low nibbles | high nibbles], the two blocks they hold. */
VNNI512 static void vt1_sums_q4_k(const char *w, size_t rb, int m, int64_t nb, const vt_x *x,
                                  const int16_t *x32, int32_t *P)
{
    (void)x32;
    const char *row[16];
    const size_t pf = vt1_rows(w, rb, m, row);
    const __m512i m4 = _mm512_set1_epi8(0x0F), sh = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    for (int64_t sb = 0; sb < nb / 8; sb++)
        for (int jj = 0; jj < 4; jj++) {
            const __m512i xv = _mm512_loadu_si512(x->q + sb * QK_K + 64 * jj);
            __m512i v[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                const char *base = row[i] + sb * (int64_t)sizeof(blk_q4_k);
                _mm_prefetch(base + pf + 48 * jj, _MM_HINT_T0);
                const __m512i q = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256((const __m256i *)(base + 16 + 32 * jj)));
                v[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                           _mm512_and_si512(_mm512_srlv_epi64(q, sh), m4), xv);
            }
            __m512i A, B;
            vt1_reduce(v, &A, &B);
            _mm512_storeu_si512(P + (sb * 8 + 2 * jj) * 16, A);
            _mm512_storeu_si512(P + (sb * 8 + 2 * jj + 1) * 16, B);
        }
}

/* Q6_K: per half of a block, [chunk 0 | chunk 1] and [chunk 2 | chunk 3] (Q6K_ROWS_KERNEL) as
 * 6-bit values; maddubs pairs minus 32 x the pair sums of x (x32) are the pairs of (q - 32) x,
 * and one madd with the 16-element scales gives vt_kernel's scaled block sums. */
VNNI512 static void vt1_sums_q6_k(const char *w, size_t rb, int m, int64_t nb, const vt_x *x,
                                  const int16_t *x32, int32_t *P)
{
    const char *row[16];
    const size_t pf = vt1_rows(w, rb, m, row);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* chunks 0|1: (qh << 4) & 0x30, (qh << 2) & 0x30; chunks 2|3: qh & 0x30, (qh >> 2) & 0x30 */
    const __m512i sh01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i lane8 = _mm512_srli_epi16(
        _mm512_setr_epi32(0x00010000, 0x00030002, 0x00050004, 0x00070006, 0x00090008, 0x000b000a,
                          0x000d000c, 0x000f000e, 0x00110010, 0x00130012, 0x00150014, 0x00170016,
                          0x00190018, 0x001b001a, 0x001d001c, 0x001f001e),
        3); /* l / 8 */
    for (int64_t sb = 0; sb < nb / 8; sb++)
        for (int h = 0; h < 2; h++)
            for (int part = 0; part < 2; part++) {
                const int64_t e = sb * QK_K + 128 * h + 64 * part; /* the 64 elements */
                const __m512i xv = _mm512_loadu_si512(x->q + e);
                const __m512i z = _mm512_loadu_si512(x32 + e / 2);
                const __m512i idx =
                    _mm512_add_epi16(lane8, _mm512_set1_epi16((short)(8 * h + 4 * part)));
                __m512i v[16];
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++) {
                    const char *base = row[i] + sb * (int64_t)sizeof(blk_q6_k);
                    _mm_prefetch(base + pf + 64 * (2 * h + part), _MM_HINT_T0);
                    const __m512i ql = _mm512_loadu_si512(base + 64 * h);
                    const __m512i qh = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(base + 128 + 32 * h)));
                    const __m512i sc = _mm512_permutexvar_epi16(
                        idx, _mm512_zextsi256_si512(_mm256_cvtepi8_epi16(
                                 _mm_loadu_si128((const __m128i *)(base + 192)))));
                    const __m512i hb = part ? _mm512_and_si512(_mm512_srlv_epi16(qh, sh23), m30)
                                            : _mm512_and_si512(_mm512_sllv_epi16(qh, sh01), m30);
                    const __m512i lo = part ? _mm512_srli_epi16(ql, 4) : ql;
                    const __m512i q =
                        _mm512_ternarylogic_epi32(lo, m4, hb, 0xEA); /* lo & m4 | hb */
                    v[i] = _mm512_madd_epi16(_mm512_sub_epi16(_mm512_maddubs_epi16(q, xv), z), sc);
                }
                __m512i A, B;
                vt1_reduce(v, &A, &B);
                const int64_t b = sb * 8 + 4 * h + 2 * part;
                _mm512_storeu_si512(P + b * 16, A);
                _mm512_storeu_si512(P + (b + 1) * 16, B);
            }
}

/* 32 x the sums of each pair of bytes of the activation row (Q6_K's offset), k/2 of them. */
VNNI512 static void vt1_x32(const int8_t *xq, int64_t k, int16_t *x32)
{
    const __m512i c32 = _mm512_set1_epi8(32);
    for (int64_t e = 0; e < k; e += 64)
        _mm512_storeu_si512(x32 + e / 2, _mm512_maddubs_epi16(c32, _mm512_loadu_si512(xq + e)));
}

/* The float steps over P (vt_kernel's, R = 1), into y's 16 columns (mask). */
VNNI512 static inline __attribute__((always_inline)) void vt1_finish(const int TYPE, const vt_w *w,
                                                                     int64_t nb, const int32_t *P,
                                                                     const vt_x *x, float beta,
                                                                     float *y, __mmask16 mask)
{
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++)
        acc = vt_acc(TYPE, acc, _mm512_loadu_si512(P + b * 16), w, b, x->d[b], x->s[b]);
    vt_store(y, acc, beta, mask);
}

VNNI512 static void vt1_finish_q8_0(const vt_w *w, int64_t nb, const int32_t *P, const vt_x *x,
                                    float beta, float *y, __mmask16 mask)
{
    vt1_finish(Q_Q8_0, w, nb, P, x, beta, y, mask);
}
VNNI512 static void vt1_finish_q4_k(const vt_w *w, int64_t nb, const int32_t *P, const vt_x *x,
                                    float beta, float *y, __mmask16 mask)
{
    vt1_finish(Q_Q4_K, w, nb, P, x, beta, y, mask);
}
VNNI512 static void vt1_finish_q6_k(const vt_w *w, int64_t nb, const int32_t *P, const vt_x *x,
                                    float beta, float *y, __mmask16 mask)
{
    vt1_finish(Q_Q6_K, w, nb, P, x, beta, y, mask);
}

/* The rows of xq (row-major, as the kernels above take them) block-major, with the integer
 * sums Q8_0 and Q6_K start from. */
VNNI512 static void vt_layout(const xq8 *xq, int rows, int64_t k, const vt_x *t)
{
    const int64_t nb = k / 32;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(xq->q + (size_t)r * k + b * 32));
            _mm256_storeu_si256((__m256i *)(t->q + ((size_t)b * rows + r) * 32), v);
            t->d[(size_t)b * rows + r] = xq->d[(size_t)r * nb + b];
            t->s[(size_t)b * rows + r] = xq->s[(size_t)r * nb + b];
            /* byte sums of v ^ 0x80 per 8 bytes are the signed sums + 8 x 128 */
            const __m256i s8 = _mm256_sad_epu8(_mm256_xor_si256(v, flip), _mm256_setzero_si256());
            const int s0 = _mm256_extract_epi32(s8, 0) + _mm256_extract_epi32(s8, 2) - 2048;
            const int s1 = _mm256_extract_epi32(s8, 4) + _mm256_extract_epi32(s8, 6) - 2048;
            t->c32[(size_t)b * rows + r] = -128 * (s0 + s1);
            t->c16[(size_t)2 * b * rows + r] = -32 * s0;
            t->c16[(size_t)(2 * b + 1) * rows + r] = -32 * s1;
        }
}

/* ---- matmul ------------------------------------------------------------------------- */

/* A dequantized tile stays within ~256 KiB (the L2 of the cores it runs on). */
#define TILE_FLOATS (64 * 1024)

static pthread_key_t tile_key;
static pthread_once_t tile_once = PTHREAD_ONCE_INIT;

/* Two buffers per thread: TILE_BUF (dequantized tiles; the integer path's weight tiles) and
 * XQ_BUF (the activations q_matmul quantizes itself). */
enum { TILE_BUF, XQ_BUF };
typedef struct tile_buf {
    size_t floats[2];
    float *p[2];
} tile_buf;

static void tile_free(void *p)
{
    tile_buf *t = p;
    free(t->p[0]);
    free(t->p[1]);
    free(t);
}

static void tile_key_init(void)
{
    pthread_key_create(&tile_key, tile_free);
}

/* This thread's buffer `which` of at least n floats (kept for the thread's life). */
static float *thread_buf(int which, size_t n)
{
    pthread_once(&tile_once, tile_key_init);
    tile_buf *t = pthread_getspecific(tile_key);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t || pthread_setspecific(tile_key, t)) {
            free(t);
            return NULL;
        }
    }
    if (t->floats[which] < n) {
        float *p = realloc(t->p[which], n * sizeof(float));
        if (!p) return NULL;
        t->p[which] = p;
        t->floats[which] = n;
    }
    return t->p[which];
}

static float *tile_get(size_t n)
{
    return thread_buf(TILE_BUF, n);
}

static void matmul_fused(int type, const void *w, int n, int k, const float *x, int rows,
                         float beta, float *y, int ld_y)
{
    const size_t rb = q_row_bytes(type, k);
    const bool simd = q_simd_active();
    for (int i = 0; i < n; i++) {
        const void *wr = (const char *)w + (size_t)i * rb;
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * k;
            float d = simd ? dot_simd(type, wr, xr, k) : dot_portable(type, wr, xr, k);
            float *yr = y + (size_t)r * ld_y + i;
            *yr = beta == 0.0f ? d : beta * *yr + d;
        }
    }
}

/* Q8_0, Q4_K and Q6_K weights, up to Q_INT_MAX_ROWS rows: the activations quantized (xq8)
 * into this thread's tile buffer, then integer dots, in tiles of Q8_TILE weight rows and
 * groups of Q8_GROUP_ROWS rows. Returns false when there is no memory for them. */
typedef void rows_fn(const void *w, int n, int64_t k, const xq8 *x, int rows, float beta, float *y,
                     int ld_y);

/* Bytes at *off in a buffer, 64-aligned; returns the offset of the carved region. */
static size_t carve(size_t *off, size_t bytes)
{
    size_t at = (*off + 63) & ~(size_t)63;
    *off = at + bytes;
    return at;
}

/* Activation rows quantized for the integer path, in the layouts its kernels read. */
struct q_xq {
    int rows, k, isa;
    xq8 xq;       /* row-major (the AVX2 and portable kernels) */
    vt_x xt;      /* AVX-512 VNNI: block-major, with the integer sums */
    int16_t *x32; /* AVX-512 VNNI, 1 row: Q6_K's pair sums (vt1_x32) */
};

/* The regions of a q_xq for rows x k on isa, as offsets o[] from its 64-aligned start; returns
 * the bytes it needs (with the slack to align an unaligned buffer). */
static size_t xq_plan(int rows, int k, int isa, size_t o[9])
{
    const size_t nb = (size_t)k / 32, R = (size_t)rows;
    size_t off = sizeof(struct q_xq);
    memset(o, 0, 9 * sizeof *o);
    o[0] = carve(&off, R * nb * 4);
    o[1] = carve(&off, R * nb * 4);
    o[2] = carve(&off, R * (size_t)k);
    if (isa >= Q_ISA_AVX512) {
        o[3] = carve(&off, R * (size_t)k);
        o[4] = carve(&off, R * nb * 4);
        o[5] = carve(&off, R * nb * 4);
        o[6] = carve(&off, R * nb * 4);
        o[7] = carve(&off, 2 * R * nb * 4);
        o[8] = carve(&off, rows == 1 ? (size_t)k : 0);
    }
    return off + 64;
}

size_t q_xq_bytes(int rows, int k)
{
    size_t o[9];
    return xq_plan(rows, k, q_isa(), o);
}

const q_xq *q_xq_prepare(void *mem, size_t bytes, const float *x, int rows, int k)
{
    const int isa = q_isa();
    size_t o[9];
    if (rows < 1 || k % 32 || bytes < xq_plan(rows, k, isa, o)) return NULL;
    char *buf = (char *)mem + (64 - (uintptr_t)mem % 64) % 64;
    struct q_xq *a = (struct q_xq *)buf;
    const size_t nb = (size_t)k / 32;
    *a = (struct q_xq){.rows = rows, .k = k, .isa = isa};
    a->xq =
        (xq8){.d = (float *)(buf + o[0]), .s = (float *)(buf + o[1]), .q = (int8_t *)(buf + o[2])};
    for (int r = 0; r < rows; r++)
        (isa ? xq8_row_avx2 : xq8_row_portable)(x + (size_t)r * k, a->xq.q + (size_t)r * k,
                                                a->xq.d + (size_t)r * nb, a->xq.s + (size_t)r * nb,
                                                k);
    if (isa >= Q_ISA_AVX512) {
        a->xt = (vt_x){.q = (int8_t *)(buf + o[3]),
                       .d = (float *)(buf + o[4]),
                       .s = (float *)(buf + o[5]),
                       .c32 = (int32_t *)(buf + o[6]),
                       .c16 = (int32_t *)(buf + o[7]),
                       .rows = rows};
        vt_layout(&a->xq, rows, k, &a->xt);
        if (rows == 1) {
            a->x32 = (int16_t *)(buf + o[8]);
            vt1_x32(a->xt.q, k, a->x32);
        }
    }
    return a;
}

/* Q8_0, Q4_K and Q6_K weights times the activation rows a (quantized for this instruction
 * set), in tiles of weight rows and groups of activation rows, the weight tiles in this
 * thread's buffer. Returns false when there is no memory for them. */
static bool matmul_int(int type, const void *w, int n, int k, const struct q_xq *a, float beta,
                       float *y, int ld_y)
{
    const size_t nb = (size_t)k / 32;
    const int isa = a->isa, rows = a->rows;
    const bool vt = isa >= Q_ISA_AVX512;
    size_t off = 0, o_wq = 0, o_wa = 0, o_wm = 0, o_ws = 0, o_wr = 0;
    char *buf = NULL;
    if (vt) {
        o_wq = carve(&off, nb * 512);
        o_wa = carve(&off, nb * 64);
        o_wm = carve(&off, nb * 64);
        o_ws = carve(&off, nb * 128);
        o_wr = carve(&off, VT_COLS * q_row_bytes(type, k));
        buf = (char *)tile_get(off / 4 + 16 + 1);
        if (!buf) return false;
        buf += (64 - (uintptr_t)buf % 64) % 64;
    }
    const xq8 xq = a->xq;
    const size_t rb = q_row_bytes(type, k);
    if (vt) {
        const vt_x xt = a->xt;
        const vt_w wt = {.q = (uint8_t *)(buf + o_wq),
                         .a = (float *)(buf + o_wa),
                         .m = (float *)(buf + o_wm),
                         .sc = (int32_t *)(buf + o_ws)};
        if (rows == 1) { /* one row: the weights dotted as they lie (vt1_*) */
            const int16_t *x32 = a->x32;
            int32_t *P = (int32_t *)wt.q; /* nb x 16 sums, where a batch packs its tile */
            for (int i0 = 0; i0 < n; i0 += VT_COLS) {
                const int m = n - i0 < VT_COLS ? n - i0 : VT_COLS;
                /* in place: vt1_sums_* prefetch the next tile while dotting this one
                 * (copying it first, as a batch does, cost 2.3x at Q8_0: the copy's reads
                 * then wait for memory with nothing to overlap them) */
                const char *wi = (const char *)w + (size_t)i0 * rb;
                const __mmask16 mask = (__mmask16)((1u << m) - 1);
                if (type == Q_Q8_0) {
                    vt_scales_q8_0(wi, rb, m, (int64_t)nb, &wt);
                    vt1_sums_q8_0(wi, rb, m, (int64_t)nb, &xt, x32, P);
                    vt1_finish_q8_0(&wt, (int64_t)nb, P, &xt, beta, y + i0, mask);
                } else if (type == Q_Q4_K) {
                    vt_scales_q4_k(wi, rb, m, (int64_t)nb, &wt);
                    vt1_sums_q4_k(wi, rb, m, (int64_t)nb, &xt, x32, P);
                    vt1_finish_q4_k(&wt, (int64_t)nb, P, &xt, beta, y + i0, mask);
                } else {
                    vt_scales_q6_k(wi, rb, m, (int64_t)nb, &wt, false);
                    vt1_sums_q6_k(wi, rb, m, (int64_t)nb, &xt, x32, P);
                    vt1_finish_q6_k(&wt, (int64_t)nb, P, &xt, beta, y + i0, mask);
                }
            }
            return true;
        }
        for (int i0 = 0; i0 < n; i0 += VT_COLS) {
            const int m = n - i0 < VT_COLS ? n - i0 : VT_COLS;
            /* the tile's rows copied first, one after the other: read in place, 16 rows at
             * once, they came from memory at a sixth of the speed (the prefetchers follow a
             * few streams, not 16 rows a block at a time) */
            char *wi = buf + o_wr;
            memcpy(wi, (const char *)w + (size_t)i0 * rb, (size_t)m * rb);
            (type == Q_Q8_0   ? vt_pack_q8_0
             : type == Q_Q4_K ? vt_pack_q4_k
                              : vt_pack_q6_k)(wi, rb, m, (int64_t)nb, &wt);
            const __mmask16 mask = (__mmask16)((1u << m) - 1);
            for (int r0 = 0; r0 < rows; r0 += VT_ROWS) {
                const int g = rows - r0 < VT_ROWS ? rows - r0 : VT_ROWS;
                (type == Q_Q8_0 ? vt_rows_q8_0
                 : type == Q_Q4_K
                     ? vt_rows_q4_k
                     : vt_rows_q6_k)(&wt, (int64_t)nb, &xt, r0, g, beta, y + i0, ld_y, mask);
            }
        }
        return true;
    }
    rows_fn *const kern = type == Q_Q8_0   ? q8_rows_avx2
                          : type == Q_Q4_K ? q4k_rows_avx2
                                           : q6k_rows_avx2;
    for (int i0 = 0; i0 < n; i0 += Q8_TILE) {
        const int m = n - i0 < Q8_TILE ? n - i0 : Q8_TILE;
        for (int r0 = 0; r0 < rows; r0 += Q8_GROUP_ROWS) {
            const int g = rows - r0 < Q8_GROUP_ROWS ? rows - r0 : Q8_GROUP_ROWS;
            xq8 part = {.q = xq.q + (size_t)r0 * k,
                        .d = xq.d + (size_t)r0 * nb,
                        .s = xq.s + (size_t)r0 * nb};
            if (isa > Q_ISA_PORTABLE)
                kern((const char *)w + (size_t)i0 * rb, m, k, &part, g, beta,
                     y + (size_t)r0 * ld_y + i0, ld_y);
            else
                rows_portable(type, (const char *)w + (size_t)i0 * rb, m, k, &part, g, beta,
                              y + (size_t)r0 * ld_y + i0, ld_y);
        }
    }
    return true;
}

#define Q_INT_CHUNK_ROWS 256

bool q_int_path(int type, int rows)
{
    return (type == Q_Q8_0 || type == Q_Q4_K || type == Q_Q6_K) &&
           (rows <= Q_INT_MAX_ROWS || q_isa() >= Q_ISA_AVX512);
}

void q_matmul_xq(int type, const void *w, int n, int k, const q_xq *a, const float *x, int rows,
                 float beta, float *y, int ld_y)
{
    if (a && a->rows == rows && a->k == k && a->isa == q_isa() && q_int_path(type, rows) &&
        matmul_int(type, w, n, k, a, beta, y, ld_y))
        return;
    q_matmul(type, w, n, k, x, rows, beta, y, ld_y);
}

void q_matmul(int type, const void *w, int n, int k, const float *x, int rows, float beta, float *y,
              int ld_y)
{
    if (q_int_path(type, rows)) {
        /* in chunks of rows, so the quantized activations stay within a few MiB */
        int r0 = 0;
        for (; r0 < rows; r0 += Q_INT_CHUNK_ROWS) {
            const int g = rows - r0 < Q_INT_CHUNK_ROWS ? rows - r0 : Q_INT_CHUNK_ROWS;
            const size_t bytes = q_xq_bytes(g, k);
            void *mem = thread_buf(XQ_BUF, bytes / sizeof(float) + 1);
            const q_xq *a = mem ? q_xq_prepare(mem, bytes, x + (size_t)r0 * k, g, k) : NULL;
            if (!a || !matmul_int(type, w, n, k, a, beta, y + (size_t)r0 * ld_y, ld_y)) break;
        }
        if (r0 >= rows) return;
        x += (size_t)r0 * k; /* no memory for the rest: the float paths need less */
        y += (size_t)r0 * ld_y;
        rows -= r0;
    }
    if (rows <= FUSED_MAX_ROWS) {
        matmul_fused(type, w, n, k, x, rows, beta, y, ld_y);
        return;
    }
    int tile = TILE_FLOATS / k;
    tile = tile < 8 ? 8 : tile > 64 ? 64 : tile;
    float *buf = tile_get((size_t)tile * (size_t)k);
    if (!buf) { /* no memory for a tile: the fused path needs none */
        matmul_fused(type, w, n, k, x, rows, beta, y, ld_y);
        return;
    }
    /* A batch small enough for gemm_small multiplies each tile there, as float32 weights
     * are (cpu.c): OpenBLAS SGEMM packs its operands on every call, which for a tile of
     * 8-64 weight rows against a decode batch costs more than the product (F16 decoded 8
     * sequences at 0.33-0.5x its own 1-sequence rate, 0.16-0.33x llama.cpp, with SGEMM). */
    const bool small = rows <= gemm_small_max_rows(GEMM_SMALL_AUTO);
    const bool f16c = q_simd_active();
    const size_t rb = q_row_bytes(type, k);
    for (int i0 = 0; i0 < n; i0 += tile) {
        int m = n - i0 < tile ? n - i0 : tile;
        for (int i = 0; i < m; i++) {
            const void *wr = (const char *)w + (size_t)(i0 + i) * rb;
            if (type == Q_F16 && f16c)
                dequant_f16_simd(wr, buf + (size_t)i * k, k);
            else
                q_dequant_row(type, wr, buf + (size_t)i * k, k);
        }
        if (small)
            gemm_small(GEMM_SMALL_AUTO, rows, m, k, x, k, buf, k, beta, y + i0, ld_y);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, m, k, 1.0f, x, k, buf, k,
                        beta, y + i0, ld_y);
    }
}

/* ---- quantizers (ringlm-mkmodel) ---------------------------------------------------- */

static int nearest(float v)
{
    return (int)lrintf(v);
}

static void quantize_q8_0(const float *x, blk_q8_0 *b, int64_t k)
{
    for (int64_t i = 0; i < k / 32; i++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = q_f32_to_f16(d);
        for (int j = 0; j < 32; j++) b[i].qs[j] = (int8_t)nearest(x[j] * id);
    }
}

/* Each 32-element sub-block: x ≈ scale*q - min, q in 0..15, from its own range; the eight
 * scales and mins are then stored as 6-bit multiples of the block's d and dmin. */
static void quantize_q4_k(const float *x, blk_q4_k *b, int64_t k)
{
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float scale[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 8; j++) {
            float lo = x[32 * j], hi = lo;
            for (int l = 1; l < 32; l++) {
                lo = fminf(lo, x[32 * j + l]);
                hi = fmaxf(hi, x[32 * j + l]);
            }
            if (lo > 0.0f) lo = 0.0f;
            scale[j] = (hi - lo) / 15.0f;
            mins[j] = -lo;
            max_scale = fmaxf(max_scale, scale[j]);
            max_min = fmaxf(max_min, mins[j]);
        }
        memset(&b[i], 0, sizeof b[i]);
        b[i].d = q_f32_to_f16(max_scale / 63.0f);
        b[i].dmin = q_f32_to_f16(max_min / 63.0f);
        const float d = q_f16_to_f32(b[i].d), dmin = q_f16_to_f32(b[i].dmin);
        uint8_t ls[8], lm[8];
        for (int j = 0; j < 8; j++) {
            int a = d > 0 ? nearest(scale[j] / d) : 0, c = dmin > 0 ? nearest(mins[j] / dmin) : 0;
            ls[j] = (uint8_t)(a < 0 ? 0 : a > 63 ? 63 : a);
            lm[j] = (uint8_t)(c < 0 ? 0 : c > 63 ? 63 : c);
            if (j < 4) {
                b[i].scales[j] = ls[j];
                b[i].scales[j + 4] = lm[j];
            } else {
                b[i].scales[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
                b[i].scales[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
                b[i].scales[j] |= (uint8_t)((lm[j] >> 4) << 6);
            }
        }
        uint8_t L[QK_K];
        for (int j = 0; j < 8; j++) {
            const float dd = d * ls[j], dm = dmin * lm[j];
            for (int l = 0; l < 32; l++) {
                int q = dd > 0 ? nearest((x[32 * j + l] + dm) / dd) : 0;
                L[32 * j + l] = (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
            }
        }
        uint8_t *q = b[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

/* Each 16-element sub-block: x ≈ scale*q, q in -32..31; the sixteen scales are stored as
 * int8 multiples of the block's d. */
static void quantize_q6_k(const float *x, blk_q6_k *b, int64_t k)
{
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float scale[16], max_scale = 0.0f;
        for (int j = 0; j < 16; j++) {
            float amax = 0.0f;
            for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * j + l]));
            scale[j] = amax / 31.0f;
            max_scale = fmaxf(max_scale, scale[j]);
        }
        memset(&b[i], 0, sizeof b[i]);
        b[i].d = q_f32_to_f16(max_scale / 127.0f);
        const float d = q_f16_to_f32(b[i].d);
        uint8_t L[QK_K];
        for (int j = 0; j < 16; j++) {
            int s = d > 0 ? nearest(scale[j] / d) : 0;
            s = s > 127 ? 127 : s;
            b[i].scales[j] = (int8_t)s;
            const float sd = d * s;
            for (int l = 0; l < 16; l++) {
                int q = sd > 0 ? nearest(x[16 * j + l] / sd) : 0;
                L[16 * j + l] = (uint8_t)((q < -32 ? -32 : q > 31 ? 31 : q) + 32);
            }
        }
        uint8_t *ql = b[i].ql, *qh = b[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((L[j + l] & 0xF) | ((L[j + l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((L[j + l + 32] & 0xF) | ((L[j + l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
    }
}

size_t q_quantize_row(int type, const float *x, void *out, int64_t k)
{
    switch (type) {
    case Q_F32: memcpy(out, x, (size_t)k * 4); break;
    case Q_F16:
        for (int64_t i = 0; i < k; i++) ((uint16_t *)out)[i] = q_f32_to_f16(x[i]);
        break;
    case Q_BF16:
        for (int64_t i = 0; i < k; i++) ((uint16_t *)out)[i] = q_f32_to_bf16(x[i]);
        break;
    case Q_Q8_0: quantize_q8_0(x, out, k); break;
    case Q_Q4_K: quantize_q4_k(x, out, k); break;
    case Q_Q6_K: quantize_q6_k(x, out, k); break;
    default: return 0;
    }
    return q_row_bytes(type, k);
}
