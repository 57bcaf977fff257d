/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_internal.h — what the files of the weight-type kernels share (private to
 * kernels/cpu/quant*.c): the block layouts, the f16 conversions inline, the activation rows
 * quantized to 8 bits, and the prototypes of each type family's kernels.
 *
 * The files, by type family:
 *   quant.c          the type table, the instruction-set dispatch, q_dot, q_matmul
 *   quant_float.c    F32, F16, BF16: conversions, fused dots
 *   quant_q8_0.c     Q8_0: dequantize, fused dot, integer dots, quantizer
 *   quant_kquants.c  Q4_K, Q6_K: the same (AVX-512 VNNI: with Q8_K activations, qk_kt_*,
 *                    Q5_K's too)
 *   quant_legacy.c   Q4_0, Q4_1, Q5_0, Q5_1: quantizers, their blocks from levels
 *   quant_search.c   the K types, IQ4_NL, IQ4_XS, and every type under an importance
 *                    matrix: quantizers (llama.cpp's searches)
 *   quant_unpack.c   those nine: unpacked to bytes; dequantize, fused dot, integer dots
 *   quant_xq.c       the activation quantizer (q_xq) of the integer path
 *   quant_q8k.c      Q8_K activations and the K types' integer dots with them (AVX2, portable)
 *   quant_vnni.c     the AVX-512 VNNI tile kernels all three integer types share
 *   quant_k23.c      Q2_K, Q3_K, IQ4_XS with AVX-512 VNNI and Q8_K activations (qk_kt_*'s
 *                    arithmetic)
 *   quant_kpack.c    Q4_K, Q6_K packed once at load for a few rows (qk_p1_*: 16 rows side by
 *                    side, qk_kt1_*'s arithmetic)
 *
 * Every kernel has a portable C form; the x86 ones (AVX2 + FMA + F16C, AVX-512 VNNI) are
 * compiled only where QK_X86 is 1, with target attributes (the rest of the build stays
 * baseline), and run only when the CPU has them (q_isa, checked once at run time). A
 * function's arithmetic does not depend on the file it lives in: each keeps its own order of
 * floating-point steps, which the tests hold to the bit where quant.h promises bits.
 */
#ifndef RINGLM_KERNELS_CPU_QUANT_INTERNAL_H
#define RINGLM_KERNELS_CPU_QUANT_INTERNAL_H

#include "common/half.h"
#include "kernels/cpu/quant.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define QK_X86 1
#include <immintrin.h>
#else
#define QK_X86 0
#endif

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

typedef struct {
    uint16_t d;
    uint8_t qs[16];
} blk_q4_0;
typedef struct {
    uint16_t d, m;
    uint8_t qs[16];
} blk_q4_1;
typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
} blk_q5_0;
typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[16];
} blk_q5_1;
typedef blk_q4_0 blk_iq4_nl;
typedef struct {
    uint8_t scales[16]; /* low 4 bits: scale, high 4: min, per 16 elements */
    uint8_t qs[64];
    uint16_t d, dmin;
} blk_q2_k;
typedef struct {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12]; /* sixteen 6-bit scales, biased by 32 */
    uint16_t d;
} blk_q3_k;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} blk_q5_k;
typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[4];
    uint8_t qs[128];
} blk_iq4_xs;

_Static_assert(sizeof(blk_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(blk_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(blk_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(blk_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(blk_q2_k) == 84, "Q2_K block is 84 bytes");
_Static_assert(sizeof(blk_q3_k) == 110, "Q3_K block is 110 bytes");
_Static_assert(sizeof(blk_q5_k) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(blk_iq4_xs) == 136, "IQ4_XS block is 136 bytes");
_Static_assert(sizeof(blk_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(blk_q4_k) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(blk_q6_k) == 210, "Q6_K block is 210 bytes");

/* ---- conversions (exact; the public q_* functions are these) --------------------------- */

static inline float qk_f16_to_f32(uint16_t h)
{
    return half_f16_to_f32(h);
}
static inline uint16_t qk_f32_to_f16(float f)
{
    return half_f32_to_f16(f);
}
static inline float qk_bf16_to_f32(uint16_t h)
{
    return half_bf16_to_f32(h);
}
static inline uint16_t qk_f32_to_bf16(float f)
{
    return half_f32_to_bf16(f);
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


/* Round to nearest (the quantizers). */
static inline int qk_nearest(float v)
{
    return (int)lrintf(v);
}

#define FUSED_MAX_ROWS Q_FUSED_MAX_ROWS
/* Q8_0's integer path runs up to Q_INT_MAX_ROWS rows: groups of up to Q8_GROUP_ROWS rows
 * (the accumulators in registers) over tiles of Q8_TILE weight rows (kept in L1/L2 while
 * every group passes over them). */
#define Q8_GROUP_ROWS  8
#define Q8_TILE        16

/* For Q8_0 weights the fused path quantizes each activation row the way llama.cpp does for
 * this type: per 32 elements, scale d = max|x| / 127 (kept as f16, as a Q8_0 block keeps it)
 * and q = x * 127 / max|x| rounded to nearest even. A block's product is then d_w * d_x *
 * sum q_w q_x: the integer sum is exact, so the three paths (portable, AVX2, AVX-512 VNNI)
 * differ only in the order they add the per-block floats. */
typedef struct xq8 {
    int8_t *q;  /* rows x k */
    float *d;   /* rows x k/32 */
    float *s;   /* rows x k/32: d * sum q, the block's sum as quantized (Q4_K's minimums) */
    float *s16; /* rows x k/16: d * sum q per 16 elements (the unpacked types' offsets) */
    /* q in the order the AVX2 kernels of the 32-element unpacked types read it (quant_xq.c
     * qk_xq8_pairs), where q_xq_prepare made it (AVX2, up to Q_INT_MAX_ROWS rows), else
     * NULL: in each whole unit of 8 blocks, blocks j and j + 4 side by side per 16 bytes. */
    int8_t *qp; /* rows x k */
    /* Q8_K, ggml's activations of the K types (quant_q8k.c), where q_xq_prepare made them
     * (k a multiple of 256, up to Q_INT_MAX_ROWS rows), else NULL: per 256
     * elements one float scale kd (negative where the largest |x| is), q = round(x / kd) in
     * kq, and the sums of q per 16 in ks. */
    int8_t *kq;  /* rows x k */
    float *kd;   /* rows x k/256 */
    int16_t *ks; /* rows x k/16 */
} xq8;

/* The AVX-512 VNNI tiles (quant_vnni.c; see there): VT_COLS weight rows repacked, up to
 * VT_ROWS activation rows in registers; up to VT1_ROWS activation rows (Q8_0; the K types
 * one) dot the weights as they lie instead (vt1_*). */
#define VT_COLS  16
#define VT_ROWS  8
#define VT1_ROWS 4

typedef struct vt_w { /* one repacked tile of VT_COLS weight rows, nb blocks of 32 */
    uint8_t *q;       /* [nb][8][16][4] unsigned weights */
    float *a;         /* [nb][16] block scales */
    float *m;         /* [nb][16] Q4_K's layout: dmin * m_j */
} vt_w;

typedef struct vt_x { /* the activation rows, block-major */
    int8_t *q;        /* [nb][rows][32] */
    float *d;         /* [nb][rows] scales */
    float *s;         /* [nb][rows] d x sum q (Q4_K's minimums) */
    int32_t *c32;     /* [nb][rows] -128 x sum q (Q8_0) */
    int rows;
} vt_x;

/* Q4_K, Q5_K and Q6_K with AVX-512 VNNI (quant_kquants.c): the activations as Q8_K (xq8.kq,
 * kd, ks), and for the tiles laid out block-major as vt_x lays out blocks of 32; up to KT1_ROWS
 * rows dot the weights as they lie instead (qk_kt1_*). */
#define KT1_ROWS 4
typedef struct kt_x {
    int8_t *q1;   /* up to KT1_ROWS rows: Q8_K's bytes, blocks 4i + 1 and 4i + 2 swapped
                   * (qk_kt1_q4_k, _q5_k), row-major */
    int8_t *q;    /* [nb][rows][32] Q8_K's bytes (more rows) */
    float *d;     /* [nb / 8][rows] Q8_K's scale of each 256 */
    int32_t *bs;  /* [nb / 8][rows][4] Q4_K: the sums of blocks 2t and 2t + 1, two int16 */
    int32_t *c16; /* [2 nb][rows] Q6_K: -32 x the sum per 16 elements */
    int rows;
} kt_x;

/* One repacked tile of VT_COLS Q4_K or Q6_K weight rows, nb blocks of 32 (nb / 8 of 256). */
typedef struct kt_w {
    uint8_t *q;  /* [nb][8][16][4] unsigned weights, as vt_w's */
    int32_t *sc; /* Q4_K, Q5_K [nb][16] the blocks' scales; Q6_K [nb][2][16] the 16 elements' */
    float *d;    /* [nb / 8][16] d */
    float *dmin; /* [nb / 8][16] Q4_K, Q5_K: dmin */
    int32_t *mn; /* [nb / 8][4][16] Q4_K, Q5_K: the minimums of blocks 2t and 2t + 1, in int16 */
} kt_w;

/* Activation rows quantized for the integer path, in the layouts its kernels read. */
struct q_xq {
    int rows, k, isa;
    xq8 xq;  /* row-major (the AVX2 and portable kernels) */
    vt_x xt; /* AVX-512 VNNI: block-major, with the integer sums */
    kt_x kt; /* AVX-512 VNNI, k a multiple of 256: Q8_K block-major (Q4_K, Q6_K) */
};

/* Bytes at *off in a buffer, 64-aligned; returns the offset of the carved region. */
static inline size_t qk_carve(size_t *off, size_t bytes)
{
    size_t at = (*off + 63) & ~(size_t)63;
    *off = at + bytes;
    return at;
}

/* ---- the kernels of each family (the portable ones always; x86 ones where QK_X86) ------- */

/* One row . x (k elements) in the row's own type, fused. */
float qk_dot_float_portable(int type, const void *row, const float *x, int64_t k);
float qk_dot_q8_0_portable(const void *row, const float *x, int64_t k);
float qk_dot_q4_k_portable(const void *row, const float *x, int64_t k);
float qk_dot_q6_k_portable(const void *row, const float *x, int64_t k);

/* Dequantizes a row of k elements. */
void qk_dequant_q8_0(const void *row, float *out, int64_t k);
/* The unpacked types (quant_unpack.c): Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K,
 * IQ4_XS. Each unit of up to 8 blocks of 32 elements (one 256-element block of the K types)
 * is unpacked into a qu_tile: element e = a[e/16] * q[e] + o[e/16]. */
extern const int8_t qk_iq4nl_values[16]; /* IQ4_NL's and IQ4_XS's grid (ggml's) */
typedef struct qu_tile {
    int8_t q[256];
    float a[16];
    float o[16];
} qu_tile;
bool qk_is_unpacked(int type);
void qk_dequant_unpacked(int type, const void *row, float *out, int64_t k);
float qk_dot_unpacked(int type, const void *row, const float *x, int64_t k);
/* y[r][i] = beta y[r][i] + w_i . x_r in integers (8-bit activations x), portable. */
void qk_rows_unpacked_portable(int type, const void *w, int n, int64_t k, const xq8 *x, int rows,
                               float beta, float *y, int ld_y);
/* The quantizers: Q4_0, Q4_1, Q5_0, Q5_1 (quant_legacy.c: ggml's reference ones); Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, and all eleven under an importance matrix
 * (quant_search.c: llama.cpp's searches, the same bytes). qw: the matrix's k weights for the
 * row x of k, or NULL. */
void qk_quantize_legacy(int type, const float *x, void *out, int64_t k);
void qk_quantize_searched(int type, const float *x, const float *qw, void *out, int64_t k);
/* One Q4_0, Q4_1, Q5_0 or Q5_1 block from its 32 levels (0..15 or 0..31), its step d and (the
 * _1 types) its minimum m. */
void qk_pack_legacy(int type, const uint8_t L[32], float d, float m, void *out);
void qk_dequant_q4_k(const void *row, float *out, int64_t k);
void qk_dequant_q6_k(const void *row, float *out, int64_t k);

/* The integer dot of one weight row (k elements) with one quantized activation row (xq: k
 * bytes, xd: its k/32 scales, xs: d x sum q per 32), portable. */
typedef float qk_xdot_fn(const void *w, int64_t k, const int8_t *xq, const float *xd,
                         const float *xs);
qk_xdot_fn qk_xdot_q8_0_portable, qk_xdot_q4_k_portable, qk_xdot_q6_k_portable;

/* One activation row quantized for the integer path (k a multiple of 32). */
void qk_xq8_row_portable(const float *x, int8_t *q, float *d, float *s, int64_t k);
/* One row of q (k bytes) in xq8.qp's order: for each whole unit of 256 bytes and j < 4,
 * bytes 0-15 of block j, of block j + 4, bytes 16-31 of block j, of block j + 4 (so that one
 * 256-bit vector holds 16 elements of each of two blocks, whose products then stay apart in
 * its two 128-bit halves); the bytes past the last whole unit as they are. */
void qk_xq8_pairs(const int8_t *q, int8_t *qp, int64_t k);
/* One activation row to Q8_K (k a multiple of 256; quant_q8k.c), and the K types' dots with
 * such rows: y[r][i] = beta y[r][i] + w_i . x_r, portable (the AVX2 ones below give the same
 * bits). Whether a type has them: qk_q8k_type. */
void qk_q8k_row_portable(const float *x, int8_t *q, float *d, int16_t *bs, int64_t k);
bool qk_q8k_type(int type);
void qk_rows_q8k_portable(int type, const void *w, int n, int64_t k, const xq8 *x, int rows,
                          float beta, float *y, int ld_y);
/* Whether the type has quant_k23.c's AVX-512 VNNI kernels (Q2_K, Q3_K, IQ4_XS). */
bool qk_kt_k23(int type);
/* quant_kpack.c: whether the type has the packed layout (Q4_K, Q6_K), its bytes for n rows of
 * k elements (0: none; k a multiple of 256), and the packing of the n rows at w into out
 * (64-aligned). */
bool qk_p1_type(int type);
size_t qk_p1_bytes(int type, int n, int64_t k);
bool qk_p1_pack(int type, const void *w, int n, int64_t k, void *out);

/* Quantizes one row of k floats into blocks of the type. */
void qk_quantize_q8_0(const float *x, void *out, int64_t k);

#if QK_X86

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

SIMD static inline __m256i dot_u8s8_avx2(__m256i a, __m256i b)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

/* Q4_K's and Q5_K's eight 6-bit scales (bytes 0-7) and mins (8-15), as k4_scales gives them,
 * from the 12 bytes at s12 (16 read: the block goes on past them). */
SIMD static inline __m128i k4_scales_v(const uint8_t *s12)
{
    const __m128i a = _mm_loadu_si128((const __m128i *)s12); /* a0 a1 a2 - */
    /* a0 & 3f, a2 & 0f, a1 & 3f, (a2 >> 4) & 0f */
    const __m128i lo = _mm_and_si128(
        _mm_srlv_epi32(_mm_shuffle_epi32(a, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
        _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    /* the top 2 bits of a0 and a1 as bits 4-5 of u1 and u3 */
    const __m128i hi =
        _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(a, _MM_SHUFFLE(1, 1, 0, 0)), 2),
                      _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* F(..., R) with the row count R a constant (1 to Q8_GROUP_ROWS; more rows as that many): the
 * kernels that hold R rows' accumulators in registers are expanded once per count. */
#define ROWS_BY_COUNT(rows, F, ...)                                                                \
    switch (rows) {                                                                                \
    case 1: F(__VA_ARGS__, 1); break;                                                              \
    case 2: F(__VA_ARGS__, 2); break;                                                              \
    case 3: F(__VA_ARGS__, 3); break;                                                              \
    case 4: F(__VA_ARGS__, 4); break;                                                              \
    case 5: F(__VA_ARGS__, 5); break;                                                              \
    case 6: F(__VA_ARGS__, 6); break;                                                              \
    case 7: F(__VA_ARGS__, 7); break;                                                              \
    default: F(__VA_ARGS__, 8); break;                                                             \
    }

/* The dispatch on the row count (each R a constant), for a block type T. */
#define ROWS_DISPATCH(name, attr, T)                                                               \
    attr void name(const void *wv, int n, int64_t k, const xq8 *x, int rows, float beta, float *y, \
                   int ld_y)                                                                       \
    {                                                                                              \
        const T *w = wv;                                                                           \
        ROWS_BY_COUNT(rows, name##_r, w, n, k, x, beta, y, ld_y)                                   \
    }

/* Every row count with AVX-512 VNNI: from 5 rows (Q4_K, Q6_K: 2) the repacked tiles win (1
 * thread, Q8_0 768x768: 190 against 41 GMAC/s for the 8-row kernels above at 32 rows); fewer
 * (decode of a few sequences) dot the weights as they lie (vt1_*, below), one weight row
 * after the other, with the same arithmetic. */
#define VNNI512                                                                                    \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))

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

/* y[0..15] (mask: the columns that exist) = acc, or beta y + acc. */
VNNI512 static inline __attribute__((always_inline)) void vt_store(float *yr, __m512 v, float beta,
                                                                   __mmask16 mask)
{
    if (beta != 0.0f)
        v = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, yr)), v);
    _mm512_mask_storeu_ps(yr, mask, v);
}

/* Q8_0's float sums in 4 chains: block b of a row goes to chain b % 4 (fma of its exact
 * integer sum by its scale times the activations', as vt_acc), and the chains end in one
 * tree, (0 + 2) + (1 + 3). A row dotted alone holds the chains in the lanes of one xmm
 * (vt_fold4: the sums of 8 blocks side by side, then two fmas); a tile holds one zmm per
 * chain, its lanes 16 weight rows (vt_tree4): both add the same numbers in the same order,
 * so a row alone gets the bits it gets in a batch, without turning its block sums from lanes
 * to weight rows. */
VNNI512 static inline __attribute__((always_inline)) __m512 vt_fold4(__m128 v)
{
    const __m128 v2 = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm512_castps128_ps512(_mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1)));
}
VNNI512 static inline __attribute__((always_inline)) __m512 vt_tree4(const __m512 c[4])
{
    return _mm512_add_ps(_mm512_add_ps(c[0], c[2]), _mm512_add_ps(c[1], c[3]));
}

/* The one-row kernels' sums of a tile (quant_kquants.c's kt1_s, quant_k23.c's k23_s): 4 lanes
 * for each of 16 weight rows, row i at slot kt1_slot(i) (rows i, i + 4, i + 8, i + 12 side by
 * side), so that kt1_sum16's 4 x 4 transposes in each 128 bits put the rows in order: lane i
 * of its result is the sum of row i's 4 lanes (exact). */
static inline int kt1_slot(int i)
{
    return 4 * (i % 4) + i / 4;
}

VNNI512 static inline __attribute__((always_inline)) __m512i kt1_sum16(const int32_t *v)
{
    const __m512i a0 = _mm512_loadu_si512(v), a1 = _mm512_loadu_si512(v + 16);
    const __m512i a2 = _mm512_loadu_si512(v + 32), a3 = _mm512_loadu_si512(v + 48);
    const __m512i p0 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
    const __m512i p1 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(p0, p1), _mm512_unpackhi_epi64(p0, p1));
}

/* Byte offsets of 16 rows rb bytes apart (the gathers' index). */
VNNI512 static inline __m512i vt_row_offsets(size_t rb)
{
    return _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)rb));
}

/* v[j]: 8 partial sums of block j. Out: lane j = the whole sum of block j. */
VNNI512 static inline __attribute__((always_inline)) __m256i vt1_reduce(const __m256i v[8])
{
    __m256i t[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* per 128 bits: blocks 2i, 2i+1, 2i, 2i+1 */
        t[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                                _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    /* per 128 bits: blocks 0-3 (4-7 in u1) */
    const __m256i u0 =
        _mm256_add_epi32(_mm256_unpacklo_epi64(t[0], t[1]), _mm256_unpackhi_epi64(t[0], t[1]));
    const __m256i u1 =
        _mm256_add_epi32(_mm256_unpacklo_epi64(t[2], t[3]), _mm256_unpackhi_epi64(t[2], t[3]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                            _mm256_permute2x128_si256(u0, u1, 0x31));
}

/* The tiles' products over the [8][16][4] bytes of a block of 32 at wq (vt_w's, kt_w's): for
 * g in g0..g1-1, p[r] += the 16 weight rows' g-th 4 bytes by bytes 4g..4g+3 of activation row
 * r (xq + 32 r), one vpdpbusd each; R a constant. */
VNNI512 static inline __attribute__((always_inline)) void
vt_dot_rows(const uint8_t *wq, const int8_t *xq, int g0, int g1, __m512i *p, const int R)
{
#pragma GCC unroll 8
    for (int g = g0; g < g1; g++) {
        const __m512i wv = _mm512_loadu_si512(wq + 64 * g);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            int32_t xv;
            memcpy(&xv, xq + 32 * r + 4 * g, 4);
            p[r] = _mm512_dpbusd_epi32(p[r], wv, _mm512_set1_epi32(xv));
        }
    }
}

/* F(..., R, ...) with R (1..VT1_ROWS) a constant. */
#define VT1_BY_ROWS(R, F, w, rb, m, nb, x, ...)                                                    \
    switch (R) {                                                                                   \
    case 1: F(w, rb, m, nb, x, 1, __VA_ARGS__); break;                                             \
    case 2: F(w, rb, m, nb, x, 2, __VA_ARGS__); break;                                             \
    case 3: F(w, rb, m, nb, x, 3, __VA_ARGS__); break;                                             \
    default: F(w, rb, m, nb, x, 4, __VA_ARGS__); break;                                            \
    }

SIMD float qk_dot_float_avx2(int type, const void *row, const float *x, int64_t k);
SIMD float qk_dot_q8_0_avx2(const void *row, const float *x, int64_t k);
SIMD float qk_dot_q4_k_avx2(const void *row, const float *x, int64_t k);
SIMD float qk_dot_q6_k_avx2(const void *row, const float *x, int64_t k);
SIMD void qk_dequant_f16_avx2(const uint16_t *h, float *out, int64_t k);
SIMD void qk_dequant_bf16_avx2(const uint16_t *h, float *out, int64_t k);
/* y[r][i] = beta y[r][i] + w_i . x_r for n rows of F16 or BF16 weights (k elements each,
 * contiguous) and rows <= 4 activation rows (k floats apart), converted in registers with
 * the arithmetic of gemm_small's AVX2 tiles: the same bits as converting the rows to floats
 * and calling gemm_small(GEMM_SMALL_AVX2, ...). */
SIMD void qk_rows_half_avx2(int type, const uint16_t *w, int n, int k, const float *x, int rows,
                            float beta, float *y, int ld_y);
/* The same for any number of activation rows with the arithmetic of gemm_small's AVX-512
 * tiles: the same bits as converting the rows to floats and calling
 * gemm_small(GEMM_SMALL_AVX512, ...). Needs AVX-512 F, VL and BW. */
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw"))) void
qk_rows_half_avx512(int type, const uint16_t *w, int n, int k, const float *x, int rows, float beta,
                    float *y, int ld_y);
/* AVX-512 BF16 (quant_float.c): rows of x (k floats apart) rounded to bf16 (nearest, ties to
 * even; subnormals flushed), ld_xb halves apart (a multiple of 32, >= k), zeros from k to ld_xb;
 * and n BF16 weight rows (k elements each, contiguous) dotted with such rows by vdpbf16ps:
 * y[r][i] = beta y[r][i] + w_i . xb_r, within gemm_bf16.h's bound of the exact product, one
 * order of sums for every output whatever the row count. */
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512bf16"))) void
qk_round_bf16_avx512(const float *x, int rows, int k, uint16_t *xb, int ld_xb);
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512bf16"))) void
qk_rows_bf16_dp_avx512(const uint16_t *w, int n, int k, const uint16_t *xb, int ld_xb, int rows,
                       float beta, float *y, int ld_y);
SIMD void qk_xq8_row_avx2(const float *x, int8_t *q, float *d, float *s, int64_t k);
SIMD void qk_q8k_row_avx2(const float *x, int8_t *q, float *d, int16_t *bs, int64_t k);
SIMD void qk_rows_q8k_avx2(int type, const void *w, int n, int64_t k, const xq8 *x, int rows,
                           float beta, float *y, int ld_y);

/* y[r][i] = beta y[r][i] + w_i . x_r for the n weight rows at w and the rows of x, in
 * integers, groups of up to Q8_GROUP_ROWS rows in registers. */
typedef void qk_rows_fn(const void *w, int n, int64_t k, const xq8 *x, int rows, float beta,
                        float *y, int ld_y);
SIMD qk_rows_fn qk_rows_q8_0_avx2, qk_rows_q4_k_avx2, qk_rows_q6_k_avx2;
/* The unpacked types (quant_unpack.c), AVX2. */
SIMD void qk_rows_unpacked_avx2(int type, const void *w, int n, int64_t k, const xq8 *x, int rows,
                                float beta, float *y, int ld_y);

/* AVX-512 VNNI. The m (<= 16) weight rows at w, rb bytes apart, all nb blocks of 32: their
 * scales (vt_scales_*), and their scales and repacked weights (vt_pack_*). */
VNNI512 void qk_vt_scales_q8_0(const char *w, size_t rb, int m, int64_t nb, const vt_w *t);
VNNI512 void qk_vt_pack_q8_0(const char *w, size_t rb, int m, int64_t nb, const vt_w *t);
/* The unpacked types whose scales and offsets go per 32 elements (all but Q2_K and Q3_K):
 * whether they take the tiles, and their pack (tmp: 16 x k bytes), into Q8_0's layout (the
 * signed grids, IQ4_NL and IQ4_XS: qk_vt_rows_q8_0) or Q4_K's (the others, unsigned with
 * their offsets as minimums: qk_vt_rows_q4_k). */
bool qk_vt_unpacked(int type);
/* Of those, the 32-element types: the tiles at every row count (qk_vt1_unpacked for one). */
bool qk_vt_decode(int type);
VNNI512 void qk_vt_pack_unpacked(int type, const char *w, size_t rb, int m, int64_t nb,
                                 const vt_w *t, int8_t *tmp);
/* The activation rows of a (up to VT1_MAX_ROWS) times the m rows at w of a qk_vt_decode
 * type, as they lie, into y's m columns, in the arithmetic qk_vt_rows_q8_0 (IQ4_NL) or
 * qk_vt_rows_q4_k32 (the others) have in a batch (vt_fold4). S: scratch of rows x nb int32,
 * 64 bytes and rows x nb x 32 bytes. */
#define VT1_MAX_ROWS 8
VNNI512 void qk_vt1_unpacked(int type, const char *w, size_t rb, int m, int64_t nb,
                             const struct q_xq *a, int32_t *S, float beta, float *y, int ld_y);
/* Q8_0: y[r][i] = beta y[r][i] + w_i . x_r for the n weight rows at w (rb bytes apart, nb
 * blocks) and the a->rows (1..VT1_ROWS) rows of a, read as they lie, in qk_vt_rows_q8_0's
 * arithmetic (vt_fold4). c32: (rows > 1) rows x nb int32 of scratch. */
VNNI512 void qk_vt1_rows_q8_0(const char *w, size_t rb, int n, int64_t nb, const struct q_xq *a,
                              int32_t *c32, float beta, float *y, int ld_y);
/* The R rows from r0 of a batch times a packed tile (quant_vnni.c): Q8_0, IQ4_NL and the
 * other 32-element types (_q4_k32) in vt_tree4's chains, the others in one chain (_signed:
 * IQ4_XS in Q8_0's layout). */
VNNI512 void qk_vt_rows_q8_0(const vt_w *w, int64_t nb, const vt_x *x, int r0, int R, float beta,
                             float *y, int ld_y, __mmask16 mask);
VNNI512 void qk_vt_rows_signed(const vt_w *w, int64_t nb, const vt_x *x, int r0, int R, float beta,
                               float *y, int ld_y, __mmask16 mask);
VNNI512 void qk_vt_rows_q4_k(const vt_w *w, int64_t nb, const vt_x *x, int r0, int R, float beta,
                             float *y, int ld_y, __mmask16 mask);
VNNI512 void qk_vt_rows_q4_k32(const vt_w *w, int64_t nb, const vt_x *x, int r0, int R, float beta,
                               float *y, int ld_y, __mmask16 mask);
/* Q4_K, Q5_K and Q6_K with AVX-512 VNNI (quant_kquants.c), Q8_K activations: for each weight
 * row, activation row and 256 elements, the exact integer sum I of the products times the
 * sub-block scales (Q6_K: of q - 32), and for Q4_K and Q5_K the exact sum M of the minimums
 * times the activations' sums per 32; then one float step, acc = fma(I, d dx, acc), and for
 * those two acc = fnmadd(M, dmin dx, acc). The tiles (qk_kt_rows_*, up to VT_ROWS rows of x
 * over a packed tile; Q5_K packs into Q4_K's) and a few rows against the weights as they lie
 * (qk_kt1_*) take those steps in the same order, so a row alone and in a batch get the same
 * bits. */
VNNI512 void qk_kt_pack_q4_k(const char *w, size_t rb, int m, int64_t nb, const kt_w *t);
VNNI512 void qk_kt_pack_q5_k(const char *w, size_t rb, int m, int64_t nb, const kt_w *t);
VNNI512 void qk_kt_pack_q6_k(const char *w, size_t rb, int m, int64_t nb, const kt_w *t);
VNNI512 void qk_kt_rows_q4_k(const kt_w *w, int64_t nb, const kt_x *x, int r0, int R, float beta,
                             float *y, int ld_y, __mmask16 mask);
VNNI512 void qk_kt_rows_q6_k(const kt_w *w, int64_t nb, const kt_x *x, int r0, int R, float beta,
                             float *y, int ld_y, __mmask16 mask);
/* The a->rows (1..KT1_ROWS) activation rows (Q8_K: xq8's kq, kd, ks; Q4_K kt_x's q1) times
 * the m (<= 16) weight rows at w (rb bytes apart) as they lie, into y's m columns (y = beta y
 * + w x; rows ld_y apart); scratch: qk_kt1_bytes(nb), 64-aligned. */
size_t qk_kt1_bytes(int64_t nb);
VNNI512 void qk_kt1_q4_k(const char *w, size_t rb, int m, int64_t nb, const struct q_xq *a,
                         void *scratch, float beta, float *y, int ld_y);
VNNI512 void qk_kt1_q5_k(const char *w, size_t rb, int m, int64_t nb, const struct q_xq *a,
                         void *scratch, float beta, float *y, int ld_y);
VNNI512 void qk_kt1_q6_k(const char *w, size_t rb, int m, int64_t nb, const struct q_xq *a,
                         void *scratch, float beta, float *y, int ld_y);
/* Q2_K, Q3_K and IQ4_XS (qk_kt_k23) in the same arithmetic (quant_k23.c; Q2_K's minimums per
 * 16 meet the sums of x per 16, xq8's ks): the a->rows (1..KT1_ROWS) rows of a times the n
 * weight rows at w as they lie (xp: qk_kt1_k23_scratch bytes, 64-aligned: the rows laid out
 * for it, and a tile's sums); the m rows at w packed into a tile (tmp: VT_COLS x k bytes; the tile's mn:
 * [nb / 8][8][16], Q2_K's minimums in int16 pairs); and the R rows from r0 of a (kt_x, and
 * xq8's ks) times such a tile. */
size_t qk_kt1_k23_scratch(int rows, int64_t k);
VNNI512 void qk_kt1_k23(int type, const char *w, size_t rb, int n, int64_t nb, const struct q_xq *a,
                        int8_t *xp, float beta, float *y, int ld_y);
VNNI512 void qk_kt_pack_k23(int type, const char *w, size_t rb, int m, int64_t nb, const kt_w *t,
                            int8_t *tmp);
VNNI512 void qk_kt_rows_k23(int type, const kt_w *w, int64_t nb, const struct q_xq *a, int r0,
                            int R, float beta, float *y, int ld_y, __mmask16 mask);
/* quant_kpack.c: y[r][i] = beta y[r][i] + w_{n0 + i} . x_r for i < n, r < rows (1..KT1_ROWS)
 * from the packing at wp (n0 a multiple of 16), in qk_kt1_*'s arithmetic. */
VNNI512 void qk_p1_rows(int type, const void *wp, int n0, int n, int64_t k, const xq8 *x, int rows,
                        float beta, float *y, int ld_y);
/* The Q8_K rows r0 .. r1 - 1 of xq (rows x k, k a multiple of 256) laid out for the tiles. */
VNNI512 void qk_kt_layout(const xq8 *xq, int rows, int r0, int r1, int64_t k, const kt_x *t);

/* The activation rows r0 .. r1 - 1 of rows block-major with their integer sums (vt_x). */
VNNI512 void qk_vt_layout(const xq8 *xq, int rows, int r0, int r1, int64_t k, const vt_x *t);

#endif /* QK_X86 */

/* Q3_K's sixteen 6-bit scales from their 12 bytes (ggml's unpacking), 0..63. */
static inline void q3k_scales(const uint8_t *s12, uint8_t out[16])
{
    uint32_t aux[4];
    memcpy(aux, s12, 12);
    const uint32_t km1 = 0x03030303, km2 = 0x0f0f0f0f, tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & km2) | (((tmp >> 4) & km1) << 4);
    aux[3] = ((aux[1] >> 4) & km2) | (((tmp >> 6) & km1) << 4);
    aux[0] = (aux[0] & km2) | (((tmp >> 0) & km1) << 4);
    aux[1] = (aux[1] & km2) | (((tmp >> 2) & km1) << 4);
    memcpy(out, aux, 16);
}

#endif
