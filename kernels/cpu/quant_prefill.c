/* SPDX-License-Identifier: MIT */
/*
 * kernels/cpu/quant_prefill.c — Q4_K, Q6_K, Q4_0 and Q4_1 weights times many activation rows
 * in integers, AVX2 (see quant_prefill.h for the contract).
 *
 * A panel of PN = 8 weight rows is unpacked once per product into this thread's buffer, block
 * of 32 by block: q[b][g][i][0..3] = bytes 4g..4g+3 of block b of weight row i (0..15), with
 * the block's scales per row. Then for each group of up to PM = 4 activation rows, per block:
 * for g < 8, one load of the panel's 32 bytes, per row one broadcast of its 4 bytes and one
 * maddubs (lane i: weight row i), the 16-bit sums added in registers. A panel (K = 2048:
 * 16 KiB of bytes, 4-6 KiB of scales) stays in L1 while every activation row passes over it.
 *
 * Q4_K (4-bit weights 0..15, unsigned as they are): the 16-bit sums run over the block
 * (8 x 2 x 15 x 127 < 2^15: no saturation); then madd to 32 bits, conversion, and
 * acc += (d sc) dx S - (dmin m) dx (sum q).
 * Q6_K (q - 32 in -32..31, signed): the activations + 128 (unsigned) times q - 32, the 16-bit
 * sums over 8 elements (8 products of at most 255 x 32: 32640 < 2^15), then one madd with the
 * 16-element scale (int8) to 32 bits, where the panel's -128 x sum of scale x (q - 32) takes
 * the +128 off again, and acc += d dx S. (|q - 32| times x with q - 32's sign ran the 16-bit
 * sums over 16 elements, but its sign per step cost more than the madds it saved: 1.05-1.10x
 * the float panels at M = 256 against 1.20-1.22x.)
 *
 * Measured against gemm_f32's float panels and the SGEMM path before them in
 * perf/gemm_bench --prefill --type Q4_K|Q6_K|Q4_0|Q4_1
 * (docs/results/2026-12-06-quantized-prefill.md, docs/results/2026-12-06-quant-tiles-decode.md).
 */
#include "kernels/cpu/quant_prefill.h"

#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/quant_internal.h"

#include <pthread.h>
#include <stdlib.h>

#define PN 8 /* weight rows per panel (the 8 lanes) */
#define PM 4 /* activation rows per tile */

static inline bool tiled_type(int type)
{
    return type == Q_Q4_K || type == Q_Q6_K || type == Q_Q4_0 || type == Q_Q4_1;
}

bool q_prefill_runs(int type, int rows)
{
#if QK_X86
    /* with AVX-512 VNNI, the unpacked 32-element types in its tiles (quant.h q_matmul_tiles;
     * the K types take Q8_K's tiles at every row count: q_int_path) */
    if (q_isa() >= Q_ISA_AVX512)
        return qk_vt_unpacked(type) && rows > Q_INT_MAX_ROWS &&
               gemm_f32_mode_get() == GEMM_F32_AUTO;
    return tiled_type(type) && rows > Q_INT_MAX_ROWS && q_isa() == Q_ISA_AVX2 &&
           gemm_f32_mode_get() == GEMM_F32_AUTO;
#else
    (void)type, (void)rows;
    return false;
#endif
}

#if QK_X86

/* ---- the per-thread panel buffer ------------------------------------------------------- */

typedef struct panel_mem {
    void *p;
    size_t bytes;
} panel_mem;

static pthread_key_t mem_key;
static pthread_once_t mem_once = PTHREAD_ONCE_INIT;

static void mem_free(void *v)
{
    panel_mem *m = v;
    free(m->p);
    free(m);
}

static void mem_key_init(void)
{
    if (pthread_key_create(&mem_key, mem_free)) mem_key = 0;
}

/* At least `bytes`, 64-byte aligned, this thread's, kept for its next call. */
static void *panel_get(size_t bytes)
{
    pthread_once(&mem_once, mem_key_init);
    panel_mem *m = pthread_getspecific(mem_key);
    if (!m) {
        m = calloc(1, sizeof *m);
        if (!m) return NULL;
        if (pthread_setspecific(mem_key, m)) {
            free(m);
            return NULL;
        }
    }
    if (m->bytes < bytes) {
        void *p;
        if (posix_memalign(&p, 64, bytes)) return NULL;
        free(m->p);
        m->p = p;
        m->bytes = bytes;
    }
    return m->p;
}

/* ---- packing ----------------------------------------------------------------------------- */

/* The 8 x 8 dwords of r[] transposed: out[g] dword i = r[i] dword g. */
SIMD static inline __attribute__((always_inline)) void transpose8(const __m256i r[8],
                                                                  __m256i out[8])
{
    const __m256 r0 = _mm256_castsi256_ps(r[0]), r1 = _mm256_castsi256_ps(r[1]),
                 r2 = _mm256_castsi256_ps(r[2]), r3 = _mm256_castsi256_ps(r[3]),
                 r4 = _mm256_castsi256_ps(r[4]), r5 = _mm256_castsi256_ps(r[5]),
                 r6 = _mm256_castsi256_ps(r[6]), r7 = _mm256_castsi256_ps(r[7]);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    out[0] = _mm256_castps_si256(_mm256_permute2f128_ps(s0, s4, 0x20));
    out[1] = _mm256_castps_si256(_mm256_permute2f128_ps(s1, s5, 0x20));
    out[2] = _mm256_castps_si256(_mm256_permute2f128_ps(s2, s6, 0x20));
    out[3] = _mm256_castps_si256(_mm256_permute2f128_ps(s3, s7, 0x20));
    out[4] = _mm256_castps_si256(_mm256_permute2f128_ps(s0, s4, 0x31));
    out[5] = _mm256_castps_si256(_mm256_permute2f128_ps(s1, s5, 0x31));
    out[6] = _mm256_castps_si256(_mm256_permute2f128_ps(s2, s6, 0x31));
    out[7] = _mm256_castps_si256(_mm256_permute2f128_ps(s3, s7, 0x31));
}

/* The m (<= PN) Q4_K rows at w (rb bytes apart, nb32 blocks of 32) unpacked: q[nb32][8][32],
 * sc[nb32][8], mn[nb32][8]; lanes m.. repeat row m-1 (computed, never stored). */
SIMD static void pack_q4_k(const char *w, size_t rb, int m, int64_t nb32, uint8_t *q, float *sc,
                           float *mn)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const blk_q4_k *row[PN];
    for (int i = 0; i < PN; i++) row[i] = (const blk_q4_k *)(w + (size_t)(i < m ? i : m - 1) * rb);
    for (int64_t B = 0; B < nb32 / 8; B++) { /* super-blocks of 256 */
        for (int i = 0; i < PN; i++) {
            const blk_q4_k *b = row[i] + B;
            const float d = _cvtsh_ss(b->d), dmin = _cvtsh_ss(b->dmin);
            for (int j = 0; j < 8; j++) {
                uint8_t s, mm;
                scale_min_k4(j, b->scales, &s, &mm);
                sc[(B * 8 + j) * PN + i] = d * s;
                mn[(B * 8 + j) * PN + i] = dmin * mm;
            }
        }
        for (int c = 0; c < 4; c++) { /* 32 bytes of qs: blocks 2c (low nibbles), 2c+1 (high) */
            __m256i lo[PN], hi[PN];
            for (int i = 0; i < PN; i++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(row[i][B].qs + 32 * c));
                lo[i] = _mm256_and_si256(v, m4);
                hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
            __m256i t[8];
            transpose8(lo, t);
            uint8_t *ql = q + (size_t)(B * 8 + 2 * c) * 256;
            for (int g = 0; g < 8; g++) _mm256_store_si256((__m256i *)(ql + 32 * g), t[g]);
            transpose8(hi, t);
            for (int g = 0; g < 8; g++) _mm256_store_si256((__m256i *)(ql + 256 + 32 * g), t[g]);
        }
    }
}

/* ---- the tile: R (<= PM) activation rows x PN weight rows -------------------------------- */

/* Q4_K, Q4_1: unsigned weights (0..15) times signed activations; Q4_0 (q40): the activations
 * + 128 (1..255, unsigned) times q - 8 (-8..7): a 16-bit lane takes two products of at most
 * 255 x 8 a step, eight steps a block (32640: no overflow); then the block's correction
 * (-128 x its sum of q - 8) is added in integers, and there are no minimums. */
#define STEP(r)                                                                                    \
    if (R > r) {                                                                                   \
        int32_t xv;                                                                                \
        memcpy(&xv, x##r + 4 * g, 4);                                                              \
        const __m256i xb = _mm256_set1_epi32(xv);                                                  \
        s##r = _mm256_add_epi16(s##r, q40 ? _mm256_maddubs_epi16(xb, wv)                           \
                                          : _mm256_maddubs_epi16(wv, xb));                         \
    }
#define FINISH(r)                                                                                  \
    if (R > r) {                                                                                   \
        __m256i si = _mm256_madd_epi16(s##r, ones);                                                \
        if (q40) si = _mm256_add_epi32(si, _mm256_load_si256((const __m256i *)(mn + b * PN)));     \
        const __m256 f = _mm256_cvtepi32_ps(si);                                                   \
        c##r =                                                                                     \
            _mm256_fmadd_ps(f, _mm256_mul_ps(sv, _mm256_set1_ps(dx[(size_t)(r)*nb32 + b])), c##r); \
        if (!q40) c##r = _mm256_fnmadd_ps(mv, _mm256_set1_ps(xs[(size_t)(r)*nb32 + b]), c##r);     \
    }
#define STORE(r)                                                                                   \
    if (R > r) {                                                                                   \
        float t[PN], *yr = y + (size_t)(r)*ld_y;                                                   \
        _mm256_storeu_ps(t, c##r);                                                                 \
        if (m == PN && beta == 0.0f)                                                               \
            _mm256_storeu_ps(yr, c##r);                                                            \
        else                                                                                       \
            for (int i = 0; i < m; i++) yr[i] = beta == 0.0f ? t[i] : beta * yr[i] + t[i];         \
    }

/* sc, mn: per block the 8 rows' scales and minimums (Q4_0: scales and int32 corrections);
 * xq: the activation rows (Q4_0: + 128) */
SIMD static inline __attribute__((always_inline)) void
tile_q4_k(const int R, const bool q40, const uint8_t *q, const float *sc, const float *mn,
          int64_t nb32, const int8_t *xq, int64_t k, const float *dx, const float *xs, float beta,
          float *y, int ld_y, int m)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t b = 0; b < nb32; b++) {
        const int8_t *x0 = xq + b * 32, *x1 = x0 + k, *x2 = x1 + k, *x3 = x2 + k;
        (void)x1, (void)x2, (void)x3;
        __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
        const uint8_t *qb = q + (size_t)b * 256;
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m256i wv = _mm256_load_si256((const __m256i *)(qb + 32 * g));
            STEP(0)
            STEP(1)
            STEP(2)
            STEP(3)
        }
        const __m256 sv = _mm256_load_ps(sc + b * PN), mv = _mm256_load_ps(mn + b * PN);
        FINISH(0)
        FINISH(1)
        FINISH(2)
        FINISH(3)
    }
    STORE(0)
    STORE(1)
    STORE(2)
    STORE(3)
}

#define TILE(R, q40) tile_q4_k(R, q40, q, sc, mn, nb32, xq, k, dx, xs, beta, y, ld_y, m)
SIMD static void tile_rows(int R, bool q40, const uint8_t *q, const float *sc, const float *mn,
                           int64_t nb32, const int8_t *xq, int64_t k, const float *dx,
                           const float *xs, float beta, float *y, int ld_y, int m)
{
    switch (R * 2 + q40) {
    case 9: TILE(4, true); break;
    case 8: TILE(4, false); break;
    case 7: TILE(3, true); break;
    case 6: TILE(3, false); break;
    case 5: TILE(2, true); break;
    case 4: TILE(2, false); break;
    case 3: TILE(1, true); break;
    default: TILE(1, false); break;
    }
}
#undef TILE

/* ---- Q6_K: the same panels, 6-bit weights with their 16-element scales in integers ------- */

/* The m (<= PN) Q6_K rows at w unpacked: q[nb32][8][32] signed bytes q - 32 (-32..31), as
 * pack_q4_k lays them out; sc[nb32][2][16] the two 16-element scales of each block, each
 * twice (the two 16-bit lanes of a row); dw[nb32][8] each row's d; corr[nb32][8] each row's
 * -128 x sum over the block of scale x (q - 32), which takes the activations' +128 off again
 * (the tiles dot x + 128, unsigned). Lanes m.. repeat row m-1. */
SIMD static void pack_q6_k(const char *w, size_t rb, int m, int64_t nb32, uint8_t *q, int16_t *sc,
                           float *dw, int32_t *corr)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    const __m256i off = _mm256_set1_epi8(32), zero = _mm256_setzero_si256();
    const blk_q6_k *row[PN];
    for (int i = 0; i < PN; i++) row[i] = (const blk_q6_k *)(w + (size_t)(i < m ? i : m - 1) * rb);
    for (int64_t B = 0; B < nb32 / 8; B++) { /* super-blocks of 256 */
        for (int i = 0; i < PN; i++) {
            const blk_q6_k *b = row[i] + B;
            const float d = _cvtsh_ss(b->d);
            for (int j = 0; j < 8; j++) { /* block j = 4h + c takes scales 8h + 2c, +1 */
                const int s0 = 8 * (j / 4) + 2 * (j % 4);
                dw[(B * 8 + j) * PN + i] = d;
                for (int s = 0; s < 2; s++) {
                    int16_t *o = sc + ((B * 8 + j) * 2 + s) * 16 + 2 * i;
                    o[0] = o[1] = b->scales[s0 + s];
                }
            }
        }
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 4; c++) { /* the chunk of 32: block 4h + c of the super-block */
                const int64_t blk = B * 8 + 4 * h + c;
                __m256i v[PN], t[8];
                for (int i = 0; i < PN; i++) {
                    const blk_q6_k *b = row[i] + B;
                    const __m256i L =
                        _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (c & 1)));
                    const __m256i H = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
                    const __m256i lo = c < 2 ? _mm256_and_si256(L, m4)
                                             : _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
                    const __m256i hi = _mm256_and_si256(c == 0   ? H
                                                        : c == 1 ? _mm256_srli_epi16(H, 2)
                                                        : c == 2 ? _mm256_srli_epi16(H, 4)
                                                                 : _mm256_srli_epi16(H, 6),
                                                        m2);
                    const __m256i u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)); /* 0..63 */
                    int64_t sums[4]; /* of 8 bytes each: elements 0-15 in 0-1, 16-31 in 2-3 */
                    _mm256_storeu_si256((__m256i *)sums, _mm256_sad_epu8(u, zero));
                    const int s0 = (int)(sums[0] + sums[1]) - 16 * 32,
                              s1 = (int)(sums[2] + sums[3]) - 16 * 32;
                    corr[blk * PN + i] = -128 * (sc[(blk * 2) * 16 + 2 * i] * s0 +
                                                 sc[(blk * 2 + 1) * 16 + 2 * i] * s1);
                    v[i] = _mm256_sub_epi8(u, off);
                }
                transpose8(v, t);
                uint8_t *qb = q + (size_t)blk * 256;
                for (int g = 0; g < 8; g++) _mm256_store_si256((__m256i *)(qb + 32 * g), t[g]);
            }
    }
}

/* x + 128 (1..255, unsigned) times q - 32 (signed): two steps of 4 bytes put 4 products of at
 * most 255 x 32 in a 16-bit lane (32640: no saturation); then one madd with the 16-element
 * scale per two steps. */
#define STEP6(r)                                                                                   \
    if (R > r) {                                                                                   \
        int32_t x0v, x1v;                                                                          \
        memcpy(&x0v, x##r + 4 * g, 4);                                                             \
        memcpy(&x1v, x##r + 4 * g + 4, 4);                                                         \
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_set1_epi32(x0v), w0),       \
                                           _mm256_maddubs_epi16(_mm256_set1_epi32(x1v), w1));      \
        t##r = _mm256_add_epi32(t##r, _mm256_madd_epi16(p, scv));                                  \
    }
#define FINISH6(r)                                                                                 \
    if (R > r)                                                                                     \
        c##r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t##r),                                           \
                               _mm256_mul_ps(dv, _mm256_set1_ps(dx[(size_t)(r)*nb32 + b])), c##r);

SIMD static inline __attribute__((always_inline)) void
tile_q6_k(const int R, const uint8_t *q, const int16_t *sc, const float *dw, const int32_t *corr,
          int64_t nb32, const uint8_t *xu, int64_t k, const float *dx, float beta, float *y,
          int ld_y, int m)
{
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t b = 0; b < nb32; b++) {
        const uint8_t *x0 = xu + b * 32, *x1 = x0 + k, *x2 = x1 + k, *x3 = x2 + k;
        (void)x1, (void)x2, (void)x3;
        const uint8_t *qb = q + (size_t)b * 256;
        const __m256i cv = _mm256_load_si256((const __m256i *)(corr + b * PN));
        __m256i t0 = cv, t1 = cv, t2 = cv, t3 = cv;
#pragma GCC unroll 4
        for (int g = 0; g < 8; g += 2) {
            const __m256i w0 = _mm256_load_si256((const __m256i *)(qb + 32 * g));
            const __m256i w1 = _mm256_load_si256((const __m256i *)(qb + 32 * g + 32));
            const __m256i scv = _mm256_load_si256((const __m256i *)(sc + (b * 2 + g / 4) * 16));
            STEP6(0)
            STEP6(1)
            STEP6(2)
            STEP6(3)
        }
        const __m256 dv = _mm256_load_ps(dw + b * PN);
        FINISH6(0)
        FINISH6(1)
        FINISH6(2)
        FINISH6(3)
    }
    STORE(0)
    STORE(1)
    STORE(2)
    STORE(3)
}

/* out = x + 128 as unsigned bytes (n a multiple of 32) */
SIMD static void plus128(const int8_t *x, size_t n, uint8_t *out)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (size_t i = 0; i < n; i += 32)
        _mm256_storeu_si256((__m256i *)(out + i),
                            _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(x + i)), flip));
}

SIMD static void tile_rows6(int R, const uint8_t *q, const int16_t *sc, const float *dw,
                            const int32_t *corr, int64_t nb32, const uint8_t *xu, int64_t k,
                            const float *dx, float beta, float *y, int ld_y, int m)
{
    switch (R) {
    case 4: tile_q6_k(4, q, sc, dw, corr, nb32, xu, k, dx, beta, y, ld_y, m); break;
    case 3: tile_q6_k(3, q, sc, dw, corr, nb32, xu, k, dx, beta, y, ld_y, m); break;
    case 2: tile_q6_k(2, q, sc, dw, corr, nb32, xu, k, dx, beta, y, ld_y, m); break;
    default: tile_q6_k(1, q, sc, dw, corr, nb32, xu, k, dx, beta, y, ld_y, m); break;
    }
}

/* ---- Q4_0 and Q4_1: blocks of 32 with one scale -------------------------------------------- */

/* The m (<= PN) rows at w of Q4_0 or Q4_1 (blocks of 32: f16 d [, f16 m], 16 bytes of
 * nibbles, elements 0-15 low, 16-31 high) unpacked as pack_q4_k lays them out: q[nb32][8][32].
 * Q4_1: the nibbles 0..15 (unsigned, as Q4_K's), f1 = d, f2 = -m per block and row (the
 * Q4_K tile adds -f2 x the activations' sums). Q4_0: q - 8 (-8..7, signed, as Q6_K's against
 * the activations + 128), f1 = d, corr = -128 x the block's sum of q - 8. */
SIMD static void pack_q4_32(int type, const char *w, size_t rb, int m, int64_t nb32, uint8_t *q,
                            float *f1, float *f2, int32_t *corr)
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i eight = _mm256_set1_epi8(8), zero = _mm256_setzero_si256();
    const size_t bb = type == Q_Q4_0 ? sizeof(blk_q4_0) : sizeof(blk_q4_1);
    const char *row[PN];
    for (int i = 0; i < PN; i++) row[i] = w + (size_t)(i < m ? i : m - 1) * rb;
    for (int64_t b = 0; b < nb32; b++) {
        __m256i v[PN], t[8];
        for (int i = 0; i < PN; i++) {
            const char *blk = row[i] + (size_t)b * bb;
            uint16_t h[2];
            memcpy(h, blk, type == Q_Q4_0 ? 2 : 4);
            const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (type == Q_Q4_0 ? 2 : 4)));
            const __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4),
                                               _mm_and_si128(raw, m4)); /* 0..15 */
            f1[b * PN + i] = _cvtsh_ss(h[0]);
            if (type == Q_Q4_1) {
                f2[b * PN + i] = -_cvtsh_ss(h[1]);
                v[i] = u;
            } else {
                int64_t sums[4];
                _mm256_storeu_si256((__m256i *)sums, _mm256_sad_epu8(u, zero));
                corr[b * PN + i] = -128 * ((int)(sums[0] + sums[1] + sums[2] + sums[3]) - 32 * 8);
                v[i] = _mm256_sub_epi8(u, eight);
            }
        }
        transpose8(v, t);
        uint8_t *qb = q + (size_t)b * 256;
        for (int g = 0; g < 8; g++) _mm256_store_si256((__m256i *)(qb + 32 * g), t[g]);
    }
}

bool q_prefill_matmul(int type, const void *w, int n, int k, const q_xq *a, float beta, float *y,
                      int ld_y)
{
    if (a && a->isa >= Q_ISA_AVX512) return q_matmul_tiles(type, w, n, k, a, beta, y, ld_y);
    const bool k_type = type == Q_Q4_K || type == Q_Q6_K;
    if (!tiled_type(type) || !a || a->k != k || a->isa < Q_ISA_AVX2 || k % (k_type ? QK_K : 32))
        return false;
    const int64_t nb32 = k / 32;
    const int rows = a->rows;
    /* per block of 32: 256 bytes of weights, then Q4_K's and Q4_1's scales and minimums
     * (2 x 8 floats), Q4_0's d and corrections (8 floats, 8 int32), or Q6_K's 16-bit scales
     * (2 x 16), d (8 floats) and corrections (8 int32); Q6_K's and Q4_0's activations
     * follow, + 128 */
    const size_t extra = type == Q_Q6_K ? 64 + 2 * PN * sizeof(float) : 2 * PN * sizeof(float);
    const size_t panel = (size_t)nb32 * (256 + extra);
    const bool plus = type == Q_Q6_K || type == Q_Q4_0;
    uint8_t *q = panel_get(panel + (plus ? (size_t)rows * k : 0));
    if (!q) return false;
    float *sc = (float *)(q + (size_t)nb32 * 256), *mn = sc + (size_t)nb32 * PN;
    int32_t *corr40 = (int32_t *)mn; /* Q4_0: the corrections where Q4_K has its minimums */
    int16_t *sc6 = (int16_t *)(q + (size_t)nb32 * 256);
    float *dw6 = (float *)(sc6 + (size_t)nb32 * 32);
    int32_t *corr6 = (int32_t *)(dw6 + (size_t)nb32 * PN);
    uint8_t *xu = q + panel;
    if (plus) plus128(a->xq.q, (size_t)rows * k, xu);
    const size_t rb = q_row_bytes(type, k);
    for (int i0 = 0; i0 < n; i0 += PN) {
        const int m = n - i0 < PN ? n - i0 : PN;
        const char *wi = (const char *)w + (size_t)i0 * rb;
        if (type == Q_Q4_K)
            pack_q4_k(wi, rb, m, nb32, q, sc, mn);
        else if (type == Q_Q6_K)
            pack_q6_k(wi, rb, m, nb32, q, sc6, dw6, corr6);
        else
            pack_q4_32(type, wi, rb, m, nb32, q, sc, mn, corr40);
        for (int r0 = 0; r0 < rows; r0 += PM) {
            const int R = rows - r0 < PM ? rows - r0 : PM;
            const float *dx = a->xq.d + (size_t)r0 * nb32;
            float *yr = y + (size_t)r0 * ld_y + i0;
            if (type == Q_Q4_K || type == Q_Q4_1)
                tile_rows(R, false, q, sc, mn, nb32, a->xq.q + (size_t)r0 * k, k, dx,
                          a->xq.s + (size_t)r0 * nb32, beta, yr, ld_y, m);
            else if (type == Q_Q4_0) /* x + 128 times q - 8 (-8..7): see tile_q4_k */
                tile_rows(R, true, q, sc, mn, nb32, (const int8_t *)(xu + (size_t)r0 * k), k, dx,
                          NULL, beta, yr, ld_y, m);
            else
                tile_rows6(R, q, sc6, dw6, corr6, nb32, xu + (size_t)r0 * k, k, dx, beta, yr, ld_y,
                           m);
        }
    }
    return true;
}

#else /* not x86: the float paths take every prefill product */

bool q_prefill_matmul(int type, const void *w, int n, int k, const q_xq *a, float beta, float *y,
                      int ld_y)
{
    (void)type, (void)w, (void)n, (void)k, (void)a, (void)beta, (void)y, (void)ld_y;
    return false;
}

#endif
